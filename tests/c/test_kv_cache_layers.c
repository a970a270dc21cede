/* A KV cache whose layers differ: placed on a device or the host, of their own sizes, or laid
 * over buffers the caller owns. */
#include "check.h"

#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static const ferry_kv_params params = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16,
                                       .n_head_kv = 2, .n_ctx = 64, .n_stream = 2, .n_layer = 4, .v_trans = true};

/* Layers 1 and 3 on the stand-in, 0 and 2 on the host: one buffer per buffer type, each
 * layer's queries say where it is, and a device layer's window is a view of device memory. */
static void test_placed_layers_share_one_buffer_per_type(void) {
    ferry_backend * dev;
    CHECK_OK(ferry_standin_backend_new(&dev));
    ferry_buffer_type * d = ferry_backend_default_buffer_type(dev);
    ferry_buffer_type * bufts[4] = {NULL, d, NULL, d};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_layers(&params, ferry_cpu_buffer_type(), bufts, NULL, &kv));
    for (int32_t l = 0; l < 4; l++) {
        CHECK(ferry_kv_cache_layer_buffer_type(kv, l) == (l % 2 ? d : ferry_cpu_buffer_type()));
        CHECK(ferry_buffer_get_type(ferry_kv_cache_layer_buffer(kv, l)) == ferry_kv_cache_layer_buffer_type(kv, l));
        CHECK_EQ_U(ferry_kv_cache_layer_kv_size(kv, l), 32);
    }
    CHECK(ferry_kv_cache_layer_buffer(kv, 1) == ferry_kv_cache_layer_buffer(kv, 3));
    CHECK(ferry_kv_cache_layer_buffer(kv, 0) == ferry_kv_cache_layer_buffer(kv, 2));
    CHECK(ferry_kv_cache_buffer(kv) == ferry_kv_cache_layer_buffer(kv, 0));
    CHECK(ferry_kv_cache_layer_buffer_type(kv, 4) == NULL);
    /* both layers' K and V fit the one device buffer exactly */
    CHECK_EQ_U(ferry_buffer_size(ferry_kv_cache_layer_buffer(kv, 1)), 2 * 2 * 32 * 32 * 2 * 2);

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *v, *layer_k;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 3, 5, 0, 1, &k, &v));
    CHECK_OK(ferry_kv_cache_k(kv, 3, &layer_k));
    ferry_tensor * root = k;
    while (root->view_src) root = root->view_src;
    CHECK(root == layer_k);
    CHECK(layer_k->buffer == ferry_kv_cache_layer_buffer(kv, 3));
    uint16_t vals[32 * 32];
    for (int i = 0; i < 32 * 32; i++) vals[i] = (uint16_t) (i * 7 + 1);
    CHECK_OK(ferry_tensor_set(layer_k, vals, 0, sizeof(vals)));
    uint16_t got[32];
    CHECK_OK(ferry_tensor_get(layer_k, got, 32 * 2 * 3, sizeof(got))); /* cell 3 of stream 0 */
    CHECK(memcmp(got, vals + 32 * 3, sizeof(got)) == 0);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
    ferry_backend_free(dev);
}

/* A sliding layer of 8 cells: its tensors hold 8, its window reads at most 8, and a wider one
 * is refused naming the layer and its size. */
static void test_a_sliding_layer_holds_and_reads_only_its_cells(void) {
    const int64_t cells[4] = {0, 8, 0, 8};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_layers(&params, ferry_cpu_buffer_type(), NULL, cells, &kv));
    ferry_tensor * t;
    CHECK_OK(ferry_kv_cache_k(kv, 1, &t));
    CHECK_EQ_U(t->ne[1], 8);
    CHECK_OK(ferry_kv_cache_v(kv, 1, &t));
    CHECK_EQ_U(t->ne[0], 8);
    CHECK_EQ_U(ferry_kv_cache_layer_kv_size(kv, 0), 32);
    CHECK_EQ_U(ferry_kv_cache_layer_kv_size(kv, 3), 8);
    CHECK_EQ_U(ferry_kv_cache_kv_size(kv), 32);
    CHECK_EQ_U(ferry_buffer_size(ferry_kv_cache_buffer(kv)), 2 * 2 * (32 + 8) * 32 * 2 * 2);
    int64_t n;
    CHECK_OK(ferry_kv_cache_layer_n_kv(kv, 1, 20, &n));
    CHECK_EQ_U(n, 8);
    CHECK_OK(ferry_kv_cache_layer_n_kv(kv, 0, 20, &n));
    CHECK_EQ_U(n, 20);
    CHECK_OK(ferry_kv_cache_layer_n_kv(kv, 1, 3, &n));
    CHECK_EQ_U(n, 3);
    CHECK_FAILS(ferry_kv_cache_layer_n_kv(kv, 1, 0, &n), FERRY_ERR_OUT_OF_BOUNDS);

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *v;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 1, 8, 0, 1, &k, &v));
    CHECK_EQ_U(k->ne[1], 8);
    CHECK_EQ_U(v->nb[3], 8 * 32 * 2); /* a stream of the small layer is 8 cells apart */
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, 20, 0, 1, &k, &v));
    CHECK_FAILS(ferry_kv_cache_window(kv, ctx, 1, 9, 0, 1, &k, &v), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "layer 1 holds 8 cells") != NULL);
    const int64_t bad[4] = {0, 33, 0, 0};
    ferry_kv_cache * refused = NULL;
    CHECK_FAILS(ferry_kv_cache_new_layers(&params, NULL, NULL, bad, &refused), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1") != NULL);
    CHECK(refused == NULL);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
}

/* Check that every byte of each layer's K and V reads zero, then fill each with 0xA5. */
static void check_zero_then_dirty(ferry_kv_cache * kv) {
    for (int32_t l = 0; l < params.n_layer; l++) {
        ferry_tensor * pair[2];
        CHECK_OK(ferry_kv_cache_k(kv, l, &pair[0]));
        CHECK_OK(ferry_kv_cache_v(kv, l, &pair[1]));
        for (int i = 0; i < 2; i++) {
            uint8_t got[32 * 32 * 2 * 2];
            CHECK_EQ_U(ferry_tensor_nbytes(pair[i]), sizeof(got));
            CHECK_OK(ferry_tensor_get(pair[i], got, 0, sizeof(got)));
            size_t nonzero = 0;
            for (size_t b = 0; b < sizeof(got); b++) {
                nonzero += got[b] != 0;
            }
            CHECK_EQ_U(nonzero, 0);
            CHECK_OK(ferry_tensor_memset(pair[i], 0xA5, 0, sizeof(got)));
        }
    }
}

/* A new cache reads zeros, on the host and on a device, though its memory held other bytes: glibc
 * fills every allocation with 0xA5 here (M_PERTURB), and elsewhere each cache is likely to get the
 * memory the one before it filled back from the allocator. A cache over the caller's memory keeps
 * what that memory holds. */
static void test_new_cache_reads_zeros(void) {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0x5A); /* allocations (not calloc's) hold 0xA5 */
#endif
    ferry_backend * dev;
    CHECK_OK(ferry_standin_backend_new(&dev));
    ferry_buffer_type * d = ferry_backend_default_buffer_type(dev);
    ferry_buffer_type * bufts[4] = {NULL, d, NULL, d};
    for (int round = 0; round < 3; round++) {
        ferry_kv_cache * kv;
        CHECK_OK(ferry_kv_cache_new_layers(&params, ferry_cpu_buffer_type(), round % 2 ? bufts : NULL, NULL, &kv));
        const int failures = check_failures;
        check_zero_then_dirty(kv);
        ferry_kv_cache_free(kv);
        CHECK(check_failures == failures);
    }
    ferry_backend_free(dev);
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0);
#endif

    const size_t layer = 32 * 32 * 2 * 2;
    uint8_t * mem = aligned_alloc(64, 8 * layer);
    memset(mem, 0x5A, 8 * layer);
    ferry_buffer * buf;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, 8 * layer, &buf));
    ferry_buffer * bufs[4] = {buf, buf, buf, buf};
    size_t ko[4], vo[4];
    for (int l = 0; l < 4; l++) {
        ko[l] = (size_t) (2 * l) * layer;
        vo[l] = (size_t) (2 * l + 1) * layer;
    }
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_over(&params, NULL, bufs, ko, bufs, vo, &kv));
    bool kept = true;
    for (size_t b = 0; b < 8 * layer; b++) {
        kept = kept && mem[b] == 0x5A;
    }
    CHECK(kept);
    ferry_kv_cache_free(kv);
    ferry_buffer_free(buf);
    free(mem);
}

/* Over the caller's memory: the layer tensors are where the caller said, and the cache frees
 * none of the caller's buffers. */
static void test_cache_over_caller_memory_frees_none_of_it(void) {
    const size_t layer = 32 * 32 * 2 * 2; /* bytes of one layer's K (or V) */
    uint8_t * mem = aligned_alloc(64, 8 * layer);
    ferry_buffer * buf;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, 8 * layer, &buf));
    ferry_buffer * bufs[4] = {buf, buf, buf, buf};
    size_t ko[4], vo[4];
    for (int l = 0; l < 4; l++) {
        ko[l] = (size_t) (2 * l) * layer;
        vo[l] = (size_t) (2 * l + 1) * layer;
    }
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_over(&params, NULL, bufs, ko, bufs, vo, &kv));
    ferry_tensor * t;
    CHECK_OK(ferry_kv_cache_v(kv, 2, &t));
    CHECK(t->data == mem + 5 * layer);
    CHECK(ferry_kv_cache_buffer(kv) == NULL);
    CHECK(ferry_kv_cache_layer_buffer(kv, 2) == buf);
    ferry_kv_cache_free(kv);

    ko[3] = 7 * layer + 64; /* runs past the buffer's end */
    kv = NULL;
    CHECK_FAILS(ferry_kv_cache_new_over(&params, NULL, bufs, ko, bufs, vo, &kv), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "layer 3") != NULL);
    CHECK(kv == NULL);
    bufs[2] = NULL;
    CHECK_FAILS(ferry_kv_cache_new_over(&params, NULL, bufs, ko, bufs, vo, &kv), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(buf); /* the caller's buffer outlived the caches */
    free(mem);
}

/* A decode step made in one call (ferry_kv_attention_step) on the stand-in over a cache whose
 * layers are placed by map (bit l: layer l on the device), every layer filled alike; its
 * outputs into out, its stats into stats. kv_len lives on the device, or under the ragged
 * policy, which reads it as it copies, in host memory (then copied to the device too). */
enum { STEP_HEADS = 4, STEP_KV = 21 };

static ferry_status step_on(uint32_t map, bool v_trans, ferry_copy_policy policy, int prefetch, uint8_t * out,
                            size_t out_size, ferry_sched_stats * stats) {
    ferry_kv_params p = params;
    p.v_trans = v_trans;
    ferry_backend *dev = NULL, *cpu = NULL;
    ferry_kv_cache * kv = NULL;
    ferry_context * ctx = NULL;
    ferry_buffer * qbuf = NULL;
    ferry_buffer * len_buf = NULL;
    ferry_graph * graph = NULL;
    ferry_sched * sched = NULL;
    ferry_status st = ferry_standin_backend_new(&dev);
    if (st == FERRY_OK) st = ferry_cpu_backend_new(&cpu);
    ferry_buffer_type * bufts[4] = {NULL, NULL, NULL, NULL};
    for (int l = 0; st == FERRY_OK && l < 4; l++) {
        bufts[l] = map >> l & 1 ? ferry_backend_default_buffer_type(dev) : NULL;
    }
    if (st == FERRY_OK) st = ferry_kv_cache_new_layers(&p, ferry_cpu_buffer_type(), bufts, NULL, &kv);
    uint16_t vals[32 * 32 * 2 + 4];
    for (int i = 0; i < 32 * 32 * 2 + 4; i++) vals[i] = (uint16_t) (0x3000 + (i * 37) % 0x0c00); /* f16 in 0.125..1 */
    for (int32_t l = 0; st == FERRY_OK && l < 4; l++) {
        ferry_tensor *k, *v;
        st = ferry_kv_cache_k(kv, l, &k);
        if (st == FERRY_OK) st = ferry_kv_cache_v(kv, l, &v);
        if (st == FERRY_OK) st = ferry_tensor_set(k, vals, 0, sizeof(vals) - 8);
        if (st == FERRY_OK) st = ferry_tensor_set(v, vals + l, 0, sizeof(vals) - 8);
    }
    if (st == FERRY_OK) st = ferry_context_new(&ctx);
    ferry_tensor * q[4] = {NULL, NULL, NULL, NULL};
    ferry_tensor * len = NULL;
    const int64_t ne_q[4] = {16, STEP_HEADS, 1, 2}, ne_len[1] = {2};
    const size_t q_bytes = 16 * STEP_HEADS * 2 * sizeof(float);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(dev, 4 * q_bytes + 64, &qbuf);
    float qv[16 * STEP_HEADS * 2];
    for (int i = 0; i < 16 * STEP_HEADS * 2; i++) qv[i] = (float) ((i * 13) % 17) / 17.0f - 0.5f;
    for (int l = 0; st == FERRY_OK && l < 4; l++) {
        st = ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]);
        if (st == FERRY_OK) st = ferry_buffer_place_tensor(qbuf, q[l], (size_t) l * q_bytes);
        if (st == FERRY_OK) st = ferry_tensor_set(q[l], qv, 0, q_bytes);
    }
    const int32_t lens[2] = {STEP_KV, 5};
    if (st == FERRY_OK) st = ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len);
    if (st == FERRY_OK && policy == FERRY_COPY_RAGGED) st = ferry_backend_alloc_buffer(cpu, sizeof(lens), &len_buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(len_buf ? len_buf : qbuf, len, len_buf ? 0 : 4 * q_bytes);
    if (st == FERRY_OK) st = ferry_tensor_set(len, lens, 0, sizeof(lens));
    ferry_backend * backends[2] = {dev, cpu};
    if (st == FERRY_OK) st = ferry_sched_new(backends, 2, &sched);
    if (st == FERRY_OK) st = ferry_sched_set_policy(sched, policy);
    if (st == FERRY_OK) st = ferry_sched_set_prefetch(sched, prefetch);
    if (st == FERRY_OK) st = ferry_graph_new(&graph);
    ferry_tensor * outs[4];
    if (st == FERRY_OK) st = ferry_kv_attention_step(kv, ctx, 4, STEP_KV, 0, 1, q, len, v_trans, sched, dev, graph, outs);
    if (st == FERRY_OK) st = ferry_sched_graph_compute(sched, graph);
    for (int l = 0; st == FERRY_OK && l < 4; l++) {
        st = ferry_tensor_get(outs[l], out + (size_t) l * (out_size / 4), 0, out_size / 4);
    }
    if (st == FERRY_OK) st = ferry_sched_get_stats(sched, stats);
    ferry_sched_free(sched);
    ferry_graph_free(graph);
    ferry_buffer_free(qbuf);
    ferry_buffer_free(len_buf);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
    ferry_backend_free(cpu);
    ferry_backend_free(dev);
    return st;
}

/* Every placement gives the all-host outputs byte for byte under every policy, serial and
 * prefetched, V plain and transposed; device layers copy nothing, host layers what the
 * all-host run copies for them. */
static void test_every_placement_gives_the_all_host_step(void) {
    const uint32_t maps[] = {0x0, 0xf, 0x3, 0x5, 0xa, 0x9};
    enum { OUT = 4 * 16 * STEP_HEADS * 2 * sizeof(float) };
    static uint8_t want[OUT], got[OUT];
    for (int vt = 0; vt < 2; vt++) {
        for (int policy = FERRY_COPY_FLAT; policy < FERRY_COPY_POLICY_COUNT; policy++) {
            ferry_sched_stats host;
            CHECK_OK(step_on(0, vt, (ferry_copy_policy) policy, 0, want, OUT, &host));
            const uint64_t len_bytes = policy == FERRY_COPY_RAGGED ? 2 * sizeof(int32_t) : 0; /* kv_len's copy */
            host.bytes_copied -= len_bytes;
            CHECK(host.bytes_copied > 0 && host.bytes_copied % 4 == 0);
            for (size_t m = 0; m < sizeof(maps) / sizeof(maps[0]); m++) {
                for (int prefetch = 0; prefetch < 2; prefetch++) {
                    ferry_sched_stats st;
                    memset(got, 0, OUT);
                    CHECK_OK(step_on(maps[m], vt, (ferry_copy_policy) policy, prefetch, got, OUT, &st));
                    CHECK(memcmp(got, want, OUT) == 0);
                    const uint64_t n_host = 4 - (uint64_t) __builtin_popcount(maps[m]);
                    CHECK_EQ_U(st.bytes_copied - len_bytes, host.bytes_copied / 4 * n_host);
                }
            }
        }
    }
}

/* Full and sliding layers (8 cells) in one ferry_kv_attention_step: a sliding layer's window is
 * its 8 cells, attention reads min(kv_len, 8) of them, and every layer's output is, byte for
 * byte, that of its own window and lengths made by hand; a sliding layer's windows copy its 8
 * cells per stream under ranges, and an n_kv past a full layer is refused even when every
 * layer slides. */
static void sliding_step(ferry_status (*make)(ferry_backend ** out)) {
    enum { HEADS = 4, N_KV = 21 };
    const int64_t cells[4] = {0, 8, 0, 8};
    const int32_t lens[2] = {N_KV, 5};
    for (int vt = 0; vt < 2; vt++) {
        ferry_kv_params p = params;
        p.v_trans = vt;
        ferry_backend *dev, *cpu;
        CHECK_OK(make(&dev));
        CHECK_OK(ferry_cpu_backend_new(&cpu));
        ferry_kv_cache * kv;
        CHECK_OK(ferry_kv_cache_new_layers(&p, ferry_cpu_buffer_type(), NULL, cells, &kv));
        /* a layer's K or V reads 32 * 32 * 2 values from vals + its offset (up to 7 * 3 + 1) */
        uint16_t vals[32 * 32 * 2 + 32];
        for (int i = 0; i < 32 * 32 * 2 + 32; i++) vals[i] = (uint16_t) (0x3000 + (i * 37) % 0x0c00);
        ferry_context * ctx;
        CHECK_OK(ferry_context_new(&ctx));
        const int64_t ne_q[4] = {16, HEADS, 1, 2}, ne_len[1] = {2};
        float qv[16 * HEADS * 2];
        for (int i = 0; i < 16 * HEADS * 2; i++) qv[i] = (float) ((i * 13) % 17) / 17.0f - 0.5f;
        ferry_tensor *q[4], *len, *layer_len[4];
        for (int32_t l = 0; l < 4; l++) {
            ferry_tensor *k, *v;
            CHECK_OK(ferry_kv_cache_k(kv, l, &k));
            CHECK_OK(ferry_kv_cache_v(kv, l, &v));
            CHECK_OK(ferry_tensor_set(k, vals + l, 0, ferry_tensor_nbytes(k)));
            CHECK_OK(ferry_tensor_set(v, vals + 7 * l + 1, 0, ferry_tensor_nbytes(v)));
            CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]));
            CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &layer_len[l]));
        }
        CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len));
        ferry_buffer * qbuf;
        CHECK_OK(ferry_backend_alloc_buffer(dev, 4 * sizeof(qv) + 5 * 256, &qbuf));
        CHECK_OK(ferry_buffer_place_tensor(qbuf, len, 4 * sizeof(qv) + 4 * 256));
        for (int32_t l = 0; l < 4; l++) {
            CHECK_OK(ferry_buffer_place_tensor(qbuf, q[l], (size_t) l * sizeof(qv)));
            CHECK_OK(ferry_buffer_place_tensor(qbuf, layer_len[l], 4 * sizeof(qv) + (size_t) l * 256)); /* CUDA aligns to 256 */
            CHECK_OK(ferry_tensor_set(q[l], qv, 0, sizeof(qv)));
            const int32_t own[2] = {lens[0] < cells[l] || !cells[l] ? lens[0] : (int32_t) cells[l],
                                    lens[1] < cells[l] || !cells[l] ? lens[1] : (int32_t) cells[l]};
            CHECK_OK(ferry_tensor_set(layer_len[l], own, 0, sizeof(own)));
        }
        CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
        ferry_backend * backends[2] = {dev, cpu};
        ferry_sched * sched;
        CHECK_OK(ferry_sched_new(backends, 2, &sched));
        CHECK_OK(ferry_sched_set_policy(sched, FERRY_COPY_RANGES));

        /* by hand: each layer's window of its own cells, read with its own lengths */
        static float want[4][16 * HEADS * 2], got[4][16 * HEADS * 2];
        ferry_context * hand;
        CHECK_OK(ferry_context_new(&hand));
        ferry_graph * graph;
        CHECK_OK(ferry_graph_new(&graph));
        ferry_tensor * outs[4];
        for (int32_t l = 0; l < 4; l++) {
            ferry_tensor *k, *v;
            CHECK_OK(ferry_kv_cache_window(kv, hand, l, cells[l] ? cells[l] : N_KV, 0, 1, &k, &v));
            CHECK_OK(ferry_attn_decode(hand, q[l], k, v, layer_len[l], 0.25f, vt, &outs[l]));
            CHECK_OK(ferry_tensor_set_output(outs[l]));
            CHECK_OK(ferry_sched_set_tensor_backend(sched, outs[l], dev));
            CHECK_OK(ferry_graph_build(graph, outs[l]));
        }
        CHECK_OK(ferry_sched_alloc_graph(sched, graph));
        CHECK_OK(ferry_sched_graph_compute(sched, graph));
        for (int l = 0; l < 4; l++) CHECK_OK(ferry_tensor_get(outs[l], want[l], 0, sizeof(want[l])));
        ferry_sched_clear_assignments(sched);
        ferry_graph_free(graph);

        /* in one call, one n_kv and one kv_len for every layer */
        CHECK_OK(ferry_graph_new(&graph));
        CHECK_OK(ferry_kv_attention_step(kv, ctx, 4, N_KV, 0, 1, q, len, vt, sched, dev, graph, outs));
        CHECK_OK(ferry_sched_alloc_graph(sched, graph));
        CHECK_OK(ferry_sched_graph_compute(sched, graph));
        for (int l = 0; l < 4; l++) CHECK_OK(ferry_tensor_get(outs[l], got[l], 0, sizeof(got[l])));
        CHECK(memcmp(got, want, sizeof(got)) == 0);
        for (int l = 0; l < 4; l++) CHECK_EQ_U(outs[l]->src[1]->ne[1], cells[l] ? cells[l] : N_KV);
        uint64_t copied[4] = {0};
        for (int i = 0; i < ferry_sched_n_inputs(sched); i++) {
            ferry_sched_input_info in;
            CHECK_OK(ferry_sched_input(sched, i, &in));
            for (int32_t l = 0; l < 4; l++) {
                ferry_tensor *k, *v;
                CHECK_OK(ferry_kv_cache_k(kv, l, &k));
                CHECK_OK(ferry_kv_cache_v(kv, l, &v));
                const ferry_tensor * root = in.src->view_src ? in.src->view_src : in.src;
                if (root == k || root == v) copied[l] += in.stats.bytes_copied;
            }
        }
        /* 8 cells of 32 f16 values per stream, 2 streams, K and V */
        CHECK_EQ_U(copied[1], 8 * 32 * 2 * 2 * 2);
        CHECK_EQ_U(copied[3], 8 * 32 * 2 * 2 * 2);
        ferry_sched_clear_assignments(sched);
        ferry_graph_free(graph);

        CHECK_OK(ferry_graph_new(&graph));
        CHECK_FAILS(ferry_kv_attention_step(kv, ctx, 4, 33, 0, 1, q, len, vt, sched, dev, graph, outs),
                    FERRY_ERR_OUT_OF_BOUNDS);
        /* a v_trans other than the cache's, even with n_kv == head_dim, where V's shape fits both */
        CHECK_FAILS(ferry_kv_attention_step(kv, ctx, 4, 16, 0, 1, q, len, !vt, sched, dev, graph, outs),
                    FERRY_ERR_INVALID_ARG);
        CHECK(strstr(ferry_last_error(), vt ? "v_trans is false, but the cache's V is transposed"
                                            : "v_trans is true, but the cache's V is not transposed") != NULL);
        CHECK_EQ_U(ferry_sched_n_assigned(sched), 0);
        CHECK_EQ_U(ferry_graph_n_nodes(graph), 0);
        ferry_kv_cache * sliding;
        const int64_t all_sliding[4] = {8, 8, 8, 8};
        CHECK_OK(ferry_kv_cache_new_layers(&p, NULL, NULL, all_sliding, &sliding));
        CHECK_OK(ferry_kv_attention_step(sliding, ctx, 4, 32, 0, 1, q, len, vt, sched, dev, graph, outs));
        ferry_sched_clear_assignments(sched);
        CHECK_FAILS(ferry_kv_attention_step(sliding, ctx, 4, 33, 0, 1, q, len, vt, sched, dev, graph, outs),
                    FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), "n_kv 33 is not in 1..32") != NULL);
        ferry_kv_cache_free(sliding);
        ferry_graph_free(graph);

        ferry_sched_free(sched);
        ferry_context_free(hand);
        ferry_buffer_free(qbuf);
        ferry_context_free(ctx);
        ferry_kv_cache_free(kv);
        ferry_backend_free(cpu);
        ferry_backend_free(dev);
    }
}

static void test_sliding_layers_step_matches_one_made_by_hand(void) { SUB(sliding_step(ferry_standin_backend_new)); }

#ifdef FERRY_HAVE_CUDA_TESTS
static ferry_status cuda0(ferry_backend ** out) { return ferry_cuda_backend_new(0, out); }

/* CUDA's attention clamps kv_len to the window as the CPU's does. */
static void test_sliding_layers_step_on_cuda_clamps_as_the_cpu(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
    SUB(sliding_step(cuda0));
}
#endif

static const check_test tests[] = {
    {"every_placement_gives_the_all_host_step", test_every_placement_gives_the_all_host_step},
    {"placed_layers_share_one_buffer_per_type", test_placed_layers_share_one_buffer_per_type},
    {"a_sliding_layer_holds_and_reads_only_its_cells", test_a_sliding_layer_holds_and_reads_only_its_cells},
    {"sliding_layers_step_matches_one_made_by_hand", test_sliding_layers_step_matches_one_made_by_hand},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"sliding_layers_step_on_cuda_clamps_as_the_cpu", test_sliding_layers_step_on_cuda_clamps_as_the_cpu},
#endif
    {"cache_over_caller_memory_frees_none_of_it", test_cache_over_caller_memory_frees_none_of_it},
    {"new_cache_reads_zeros", test_new_cache_reads_zeros},
};

CHECK_MAIN(tests)
