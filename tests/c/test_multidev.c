/*
 * Several devices in one step: ferry_kv_attention_step_on with layers split over two
 * devices (two stand-ins; two CUDA devices of the fake runtime, FERRY_FAKE_CUDA_DEVICES=2)
 * gives the bytes of the same step on one device, under every copy policy, serial and
 * prefetched; each device's splits copy exactly its own layers' windows, a query that
 * lives on the other device, and an output read on the other device; refusals name the layer.
 * Every placement of the KV on one, two and three devices gives the all-host one-device bytes,
 * and its resident layers copy nothing (FERRY_FAKE_CUDA_DEVICES=3 for the CUDA matrix).
 * On a machine with one GPU the CUDA tests run two backends on it (the memory then shared).
 */
#include "check.h"
#include "value-fill.h"

#include <math.h>

enum { N_LAYER = 5, N_STREAM = 2, KV_SIZE = 32, HEAD_DIM = 64, N_HEAD_KV = 2, N_HEAD = 4, N_KV = 27 };
enum { OUT_N = HEAD_DIM * N_HEAD * N_STREAM }; /* floats of one layer's output */

typedef ferry_status (*make_backend)(int device, ferry_backend ** out);

static ferry_status make_standin(int device, ferry_backend ** out) {
    (void) device;
    return ferry_standin_backend_new(out);
}

/* CUDA device `device`, or device 0 on a machine with one: two backends on one GPU. */
static ferry_status make_cuda(int device, ferry_backend ** out) {
    int n = 1;
    ferry_cuda_device_count(&n);
    return ferry_cuda_backend_new(n > device ? device : 0, out);
}

typedef struct {
    ferry_backend * dev[2];
    ferry_backend * cpu;
    ferry_kv_cache * kv;
    ferry_buffer * buf; /* q and kv_len, on dev[0] */
    ferry_buffer * host_buf; /* kv_len again, in host memory: the ragged policy reads it there */
    ferry_context * ctx;
    ferry_tensor * q[N_LAYER];
    ferry_tensor * kv_len;
    ferry_tensor * kv_len_host;
    ferry_sched * sched;
} fixture;

static ferry_status fixture_init(fixture * f, make_backend make, ferry_buffer_type * cache_buft, ferry_type type,
                                 bool v_trans) {
    memset(f, 0, sizeof(*f));
    const ferry_kv_params p = {type, type, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM, N_LAYER, v_trans};
    ferry_status st = ferry_cpu_backend_new(&f->cpu);
    if (st == FERRY_OK) st = make(0, &f->dev[0]);
    if (st == FERRY_OK) st = make(1, &f->dev[1]);
    if (st == FERRY_OK) st = ferry_kv_cache_new(&p, cache_buft ? cache_buft : ferry_cpu_buffer_type(), &f->kv);
    if (st == FERRY_OK) st = fill_cache(f->kv, N_LAYER);
    if (st == FERRY_OK) st = ferry_context_new(&f->ctx);
    const size_t q_bytes = sizeof(float) * HEAD_DIM * N_HEAD * N_STREAM;
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->dev[0], N_LAYER * q_bytes + 256, &f->buf);
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD, 1, N_STREAM}, ne_len[1] = {N_STREAM};
    if (st == FERRY_OK) st = place_queries(f->ctx, f->buf, N_LAYER, ne_q, q_bytes, f->q);
    if (st == FERRY_OK) st = ferry_tensor_new(f->ctx, FERRY_TYPE_I32, 1, ne_len, &f->kv_len);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->buf, f->kv_len, N_LAYER * q_bytes);
    const int32_t lengths[N_STREAM] = {N_KV - 5, N_KV};
    if (st == FERRY_OK) st = ferry_tensor_set(f->kv_len, lengths, 0, sizeof(lengths));
    if (st == FERRY_OK) st = ferry_tensor_new(f->ctx, FERRY_TYPE_I32, 1, ne_len, &f->kv_len_host);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->cpu, sizeof(lengths), &f->host_buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->host_buf, f->kv_len_host, 0);
    if (st == FERRY_OK) st = ferry_tensor_set(f->kv_len_host, lengths, 0, sizeof(lengths));
    ferry_backend * backends[3] = {f->dev[0], f->dev[1], f->cpu};
    if (st == FERRY_OK) st = ferry_sched_new(backends, 3, &f->sched);
    return st;
}

static void fixture_free(fixture * f) {
    ferry_sched_free(f->sched);
    ferry_buffer_free(f->buf);
    ferry_buffer_free(f->host_buf);
    ferry_context_free(f->ctx);
    ferry_kv_cache_free(f->kv);
    ferry_backend_free(f->dev[0]);
    ferry_backend_free(f->dev[1]);
    ferry_backend_free(f->cpu);
}

/* What one run gives: every layer's output, then the chained copy of layer 0's output, and
 * the bytes each layer's windows copied. */
typedef struct {
    float out[N_LAYER + 1][OUT_N];
    uint64_t window_bytes[N_LAYER];
} result;

/* The layer whose K or V a source is a view of, or -1. */
static int32_t layer_of(const fixture * f, const ferry_tensor * src) {
    const ferry_tensor * root = src->view_src ? src->view_src : src;
    for (int32_t l = 0; l < N_LAYER; l++) {
        ferry_tensor *k, *v;
        if (ferry_kv_cache_k(f->kv, l, &k) == FERRY_OK && ferry_kv_cache_v(f->kv, l, &v) == FERRY_OK &&
            (root == k || root == v)) {
            return l;
        }
    }
    return -1;
}

/*
 * The step with layer l on dev[on[l]], and a node on dev[1] that reads layer 0's output,
 * run under policy and prefetch: its outputs and what each layer's windows copied. It
 * checks where every input went: a layer's windows (K and V, once each) into a split on its
 * own device only, a query into the split of a layer on the device it does not live on, and
 * layer 0's output into dev[1]'s split when layer 0 is on dev[0].
 */
static void run_step(fixture * f, const int * on, ferry_copy_policy policy, int prefetch, bool v_trans,
                     result * r) {
    ferry_context * ctx;
    ferry_graph * graph;
    CHECK_OK(ferry_context_new(&ctx));
    CHECK_OK(ferry_graph_new(&graph));
    ferry_backend * backends[N_LAYER];
    for (int l = 0; l < N_LAYER; l++) backends[l] = f->dev[on[l]];
    /* two backends of one device read each other's memory: nothing but windows is copied */
    const bool apart = ferry_backend_default_buffer_type(f->dev[0]) != ferry_backend_default_buffer_type(f->dev[1]);
    ferry_tensor * outs[N_LAYER];
    ferry_tensor * chained;
    ferry_sched_clear_assignments(f->sched);
    CHECK_OK(ferry_sched_set_policy(f->sched, policy));
    CHECK_OK(ferry_sched_set_prefetch(f->sched, prefetch));
    ferry_tensor * kv_len = policy == FERRY_COPY_RAGGED ? f->kv_len_host : f->kv_len;
    CHECK_OK(ferry_kv_attention_step_on(f->kv, ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f->q, kv_len, v_trans, f->sched,
                                        backends, graph, outs));
    CHECK_OK(ferry_dup(ctx, outs[0], &chained));
    CHECK_OK(ferry_tensor_set_output(chained));
    CHECK_OK(ferry_sched_set_tensor_backend(f->sched, chained, f->dev[1]));
    CHECK_OK(ferry_graph_build(graph, chained));
    CHECK_OK(ferry_sched_alloc_graph(f->sched, graph));
    CHECK_OK(ferry_sched_graph_compute(f->sched, graph));
    for (int l = 0; l < N_LAYER; l++) {
        CHECK_OK(ferry_tensor_get(outs[l], r->out[l], 0, sizeof(r->out[l])));
        r->window_bytes[l] = 0;
    }
    CHECK_OK(ferry_tensor_get(chained, r->out[N_LAYER], 0, sizeof(r->out[N_LAYER])));

    int windows[N_LAYER] = {0}, q_copies[N_LAYER] = {0}, chain_copies = 0;
    for (int i = 0; i < ferry_sched_n_inputs(f->sched); i++) {
        ferry_sched_input_info in;
        ferry_sched_split_info sp;
        CHECK_OK(ferry_sched_input(f->sched, i, &in));
        CHECK_OK(ferry_sched_split(f->sched, in.split, &sp));
        const int32_t l = layer_of(f, in.src);
        if (l >= 0) {
            CHECK(sp.backend == backends[l]); /* a window goes to its own layer's device only */
            windows[l]++;
            r->window_bytes[l] += in.stats.bytes_copied;
        }
        for (int j = 0; j < N_LAYER; j++) {
            if (in.src == f->q[j]) {
                CHECK(apart && sp.backend == f->dev[1] && on[j] == 1); /* q lives on dev[0] */
                q_copies[j]++;
            }
        }
        if (in.src == outs[0]) {
            CHECK(apart && sp.backend == f->dev[1] && on[0] == 0);
            chain_copies++;
        }
    }
    for (int l = 0; l < N_LAYER; l++) {
        CHECK_EQ_U(windows[l], 2);
        CHECK_EQ_U(q_copies[l], apart && on[l] == 1 ? 1 : 0);
        CHECK(r->window_bytes[l] > 0);
    }
    CHECK_EQ_U(chain_copies, apart && on[0] == 0 ? 1 : 0);
    ferry_sched_stats stats;
    CHECK_OK(ferry_sched_get_stats(f->sched, &stats));
    CHECK(prefetch == 0 ? stats.prefetched == 0 : stats.prefetched > 0);
    ferry_sched_clear_assignments(f->sched);
    ferry_graph_free(graph);

    ferry_context_free(ctx);
}

/* layer_split's map: layer l on device l * 2 / N_LAYER (3 layers and 2). */
static const int split_map[N_LAYER] = {0, 0, 0, 1, 1};
static const int one_device[N_LAYER] = {0, 0, 0, 0, 0};
static const int every_other[N_LAYER] = {1, 0, 1, 0, 1};

/* Two devices give one device's bytes, for every policy, serial and prefetched; r gets the
 * two-device outputs of the last run. */
static void check_two_devices(make_backend make, ferry_buffer_type * cache_buft, ferry_type type, bool v_trans,
                              result * two) {
    fixture f;
    CHECK_OK(fixture_init(&f, make, cache_buft, type, v_trans));
    static result one;
    for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        for (int prefetch = 0; prefetch <= 2; prefetch += 2) {
            SUB(run_step(&f, one_device, (ferry_copy_policy) policy, prefetch, v_trans, &one));
            const int * maps[2] = {split_map, every_other};
            for (int m = 0; m < 2; m++) {
                SUB(run_step(&f, maps[m], (ferry_copy_policy) policy, prefetch, v_trans, two));
                if (memcmp(one.out, two->out, sizeof(one.out)) != 0) {
                    fprintf(stderr, "policy %s prefetch %d map %d: two devices' bytes differ from one's\n",
                            ferry_copy_policy_name((ferry_copy_policy) policy), prefetch, m);
                    CHECK(false);
                }
                CHECK(memcmp(one.window_bytes, two->window_bytes, sizeof(one.window_bytes)) == 0);
            }
            CHECK(memcmp(one.out[0], one.out[N_LAYER], sizeof(one.out[0])) == 0); /* the chained copy */
        }
    }
    fixture_free(&f);
}

static void test_two_standins_give_one_devices_bytes(void) {
    static result r;
    SUB(check_two_devices(make_standin, NULL, FERRY_TYPE_F16, false, &r));
    SUB(check_two_devices(make_standin, NULL, FERRY_TYPE_F16, true, &r));
    SUB(check_two_devices(make_standin, NULL, FERRY_TYPE_Q8_0, false, &r));
}

/* A backend the scheduler does not have, or none, is refused naming the layer, before anything
 * is assigned; one backend for every layer is the old call. */
static void test_a_foreign_backend_is_refused_naming_the_layer(void) {
    fixture f;
    CHECK_OK(fixture_init(&f, make_standin, NULL, FERRY_TYPE_F16, false));
    ferry_backend * stranger;
    CHECK_OK(ferry_standin_backend_new(&stranger));
    ferry_graph * graph;
    CHECK_OK(ferry_graph_new(&graph));
    ferry_tensor * outs[N_LAYER];
    ferry_backend * backends[N_LAYER] = {f.dev[0], f.dev[0], f.dev[1], stranger, f.dev[1]};
    CHECK_FAILS(ferry_kv_attention_step_on(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false, f.sched,
                                           backends, graph, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 3") != NULL);
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), 0);
    CHECK_EQ_U(ferry_graph_n_nodes(graph), 0);
    backends[3] = NULL;
    CHECK_FAILS(ferry_kv_attention_step_on(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false, f.sched,
                                           backends, graph, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 3") != NULL);
    CHECK_FAILS(ferry_kv_attention_step_on(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false, f.sched,
                                           NULL, graph, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_attention_step_on(f.kv, f.ctx, N_LAYER + 1, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false,
                                           f.sched, backends, graph, outs),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false, f.sched,
                                        stranger, graph, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), 0);
    CHECK_OK(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, false, f.sched,
                                     f.dev[1], graph, outs));
    for (int l = 0; l < N_LAYER; l++) {
        CHECK(ferry_sched_get_tensor_backend(f.sched, outs[l]) == NULL); /* not allocated yet */
    }
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), N_LAYER);
    CHECK_OK(ferry_sched_alloc_graph(f.sched, graph));
    for (int l = 0; l < N_LAYER; l++) {
        CHECK(ferry_sched_get_tensor_backend(f.sched, outs[l]) == f.dev[1]);
    }
    ferry_sched_clear_assignments(f.sched);

    ferry_graph_free(graph);
    ferry_backend_free(stranger);
    fixture_free(&f);
}

/* ---------------------------------------------------------------- the placement matrix
 *
 * Every placement of the layers' KV (host, or the memory of the device that runs the layer)
 * on one, two and three devices (layer_split's map), under every policy, serial and
 * prefetched, f16 and q8_0, V plain and transposed (f16): the outputs of the all-host
 * one-device run, byte for byte; a resident layer copies nothing, a host layer exactly what
 * the all-host one-device run copies for it.
 */
enum { M_LAYER = 6, M_STREAM = 2, M_KV_SIZE = 16, M_HEAD_DIM = 32, M_HEAD_KV = 1, M_HEAD = 2, M_N_KV = 13 };
enum { M_OUT_N = M_HEAD_DIM * M_HEAD * M_STREAM };

typedef struct {
    float out[M_LAYER][M_OUT_N];
    uint64_t copied[M_LAYER]; /* bytes each layer's windows copied */
} m_result;

/* Bit l set: layer l resident. All host, all device, the first 2, every other, and a map drawn
 * from a fixed seed (m_random_map). */
enum { M_N_MAPS = 5 };
static uint32_t m_maps[M_N_MAPS] = {0x00, 0x3f, 0x03, 0x15, 0};

static uint32_t m_random_map(void) {
    uint32_t x = 22, map = 0;
    for (int l = 0; l < M_LAYER; l++) {
        x = x * 1103515245u + 12345u;
        map |= (x >> 16 & 1u) << l;
    }
    return map;
}

typedef struct {
    ferry_backend * dev[3];
    ferry_backend * cpu;
    ferry_buffer_type * host_buft;
    ferry_type type;
    bool v_trans;
} m_case;

/* The step with layer l on dev[l * n_dev / M_LAYER], the resident layers of map in that device's
 * memory, the rest in host_buft, under policy and prefetch. Checks that every layer runs on its
 * device and that a window goes to its own layer's device only, a resident layer's to none. */
static void m_run(const m_case * c, int n_dev, uint32_t map, ferry_copy_policy policy, int prefetch, m_result * r) {
    const ferry_kv_params p = {c->type, c->type, M_HEAD_DIM, M_HEAD_KV, M_STREAM * M_KV_SIZE, M_STREAM, M_LAYER,
                               c->v_trans};
    ferry_backend * on[M_LAYER];
    ferry_buffer_type * bufts[M_LAYER];
    for (int l = 0; l < M_LAYER; l++) {
        on[l] = c->dev[l * n_dev / M_LAYER];
        bufts[l] = map >> l & 1 ? ferry_backend_default_buffer_type(on[l]) : NULL;
    }
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_layers(&p, c->host_buft, bufts, NULL, &kv));
    ferry_tensor *k[M_LAYER], *v[M_LAYER];
    for (int32_t l = 0; l < M_LAYER; l++) {
        CHECK_OK(ferry_kv_cache_k(kv, l, &k[l]));
        CHECK_OK(ferry_kv_cache_v(kv, l, &v[l]));
    }
    CHECK_OK(fill_cache(kv, M_LAYER));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const size_t q_bytes = sizeof(float) * M_OUT_N;
    ferry_buffer *buf, *len_buf = NULL;
    CHECK_OK(ferry_backend_alloc_buffer(c->dev[0], M_LAYER * q_bytes + 256, &buf));
    const int64_t ne_q[4] = {M_HEAD_DIM, M_HEAD, 1, M_STREAM}, ne_len[1] = {M_STREAM};
    ferry_tensor *q[M_LAYER], *kv_len;
    CHECK_OK(place_queries(ctx, buf, M_LAYER, ne_q, q_bytes, q));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &kv_len));
    if (policy == FERRY_COPY_RAGGED) { /* read on the host as the windows are copied */
        CHECK_OK(ferry_backend_alloc_buffer(c->cpu, M_STREAM * sizeof(int32_t), &len_buf));
    }
    CHECK_OK(ferry_buffer_place_tensor(len_buf ? len_buf : buf, kv_len, len_buf ? 0 : M_LAYER * q_bytes));
    const int32_t lengths[M_STREAM] = {M_N_KV, 6};
    CHECK_OK(ferry_tensor_set(kv_len, lengths, 0, sizeof(lengths)));
    ferry_backend * backends[4] = {c->dev[0], c->dev[1], c->dev[2], NULL};
    backends[n_dev] = c->cpu;
    ferry_sched * sched;
    CHECK_OK(ferry_sched_new(backends, n_dev + 1, &sched));
    CHECK_OK(ferry_sched_set_policy(sched, policy));
    CHECK_OK(ferry_sched_set_prefetch(sched, prefetch));
    ferry_graph * graph;
    CHECK_OK(ferry_graph_new(&graph));
    ferry_tensor * outs[M_LAYER];
    CHECK_OK(ferry_kv_attention_step_on(kv, ctx, M_LAYER, M_N_KV, 0, M_STREAM - 1, q, kv_len, c->v_trans, sched, on,
                                        graph, outs));
    CHECK_OK(ferry_sched_alloc_graph(sched, graph));
    CHECK_OK(ferry_sched_graph_compute(sched, graph));
    int windows[M_LAYER] = {0};
    for (int l = 0; l < M_LAYER; l++) {
        CHECK(ferry_sched_get_tensor_backend(sched, outs[l]) == on[l]);
        CHECK_OK(ferry_tensor_get(outs[l], r->out[l], 0, sizeof(r->out[l])));
        r->copied[l] = 0;
    }
    for (int i = 0; i < ferry_sched_n_inputs(sched); i++) {
        ferry_sched_input_info in;
        ferry_sched_split_info sp;
        CHECK_OK(ferry_sched_input(sched, i, &in));
        CHECK_OK(ferry_sched_split(sched, in.split, &sp));
        const ferry_tensor * root = in.src->view_src ? in.src->view_src : in.src;
        for (int l = 0; l < M_LAYER; l++) {
            if (root == k[l] || root == v[l]) {
                CHECK(sp.backend == on[l]);
                windows[l]++;
                r->copied[l] += in.stats.bytes_copied;
            }
        }
    }
    for (int l = 0; l < M_LAYER; l++) {
        CHECK_EQ_U(windows[l], map >> l & 1 ? 0 : 2);
    }
    ferry_sched_free(sched);
    ferry_graph_free(graph);
    ferry_buffer_free(buf);
    ferry_buffer_free(len_buf);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
}

/* The matrix of one case against its all-host one-device run; want gets that run's outputs. */
static void check_matrix(make_backend make, ferry_buffer_type * host_buft, ferry_type type, bool v_trans,
                         m_result * want) {
    m_maps[M_N_MAPS - 1] = m_random_map();
    m_case c = {.host_buft = host_buft ? host_buft : ferry_cpu_buffer_type(), .type = type, .v_trans = v_trans};
    for (int d = 0; d < 3; d++) CHECK_OK(make(d, &c.dev[d]));
    CHECK_OK(ferry_cpu_backend_new(&c.cpu));
    static m_result ref[FERRY_COPY_POLICY_COUNT][2], got;
    for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        for (int prefetch = 0; prefetch < 2; prefetch++) {
            SUB(m_run(&c, 1, 0, (ferry_copy_policy) policy, prefetch, &ref[policy][prefetch]));
            CHECK(memcmp(ref[policy][prefetch].out, ref[0][0].out, sizeof(ref[0][0].out)) == 0);
        }
    }
    for (int l = 0; l < M_LAYER; l++) CHECK(ref[FERRY_COPY_RANGES][0].copied[l] > 0);
    for (int n_dev = 1; n_dev <= 3; n_dev++) {
        for (int m = 0; m < M_N_MAPS; m++) {
            for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
                for (int prefetch = 0; prefetch < 2; prefetch++) {
                    SUB(m_run(&c, n_dev, m_maps[m], (ferry_copy_policy) policy, prefetch, &got));
                    if (memcmp(got.out, ref[0][0].out, sizeof(got.out)) != 0) {
                        fprintf(stderr, "%d devices, map 0x%x, policy %s, prefetch %d: bytes differ\n", n_dev,
                                (unsigned) m_maps[m], ferry_copy_policy_name((ferry_copy_policy) policy), prefetch);
                        CHECK(false);
                    }
                    for (int l = 0; l < M_LAYER; l++) {
                        CHECK_EQ_U(got.copied[l], m_maps[m] >> l & 1 ? 0 : ref[policy][prefetch].copied[l]);
                    }
                }
            }
        }
    }
    memcpy(want, &ref[0][0], sizeof(*want));
    for (int d = 0; d < 3; d++) ferry_backend_free(c.dev[d]);
    ferry_backend_free(c.cpu);
}

static void test_standin_placements_give_the_all_host_run(void) {
    const uint32_t random = m_random_map();
    CHECK(random != 0 && random != 0x3f); /* neither all host nor all device */
    static m_result want;
    SUB(check_matrix(make_standin, NULL, FERRY_TYPE_F16, false, &want));
    SUB(check_matrix(make_standin, NULL, FERRY_TYPE_F16, true, &want));
    SUB(check_matrix(make_standin, NULL, FERRY_TYPE_Q8_0, false, &want));
}

#ifdef FERRY_HAVE_CUDA_TESTS
/* A CUDA device; the fake runtime presents two when asked (a GPU machine has what it has). */
static void need_device(void) {
    setenv("FERRY_FAKE_CUDA_DEVICES", "2", 0);
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

/* CUDA0 and CUDA1 with the cache in pinned host memory: one device's bytes, and the
 * stand-ins' to rounding. */
static void check_cuda_two_devices(ferry_type type, bool v_trans) {
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    static result cuda, standin;
    SUB(check_two_devices(make_cuda, pinned, type, v_trans, &cuda));
    SUB(check_two_devices(make_standin, NULL, type, v_trans, &standin));
    double worst = 0;
    for (int l = 0; l <= N_LAYER; l++) {
        for (int i = 0; i < OUT_N; i++) {
            const double e = fabs((double) cuda.out[l][i] - standin.out[l][i]) / (1.0 + fabs((double) standin.out[l][i]));
            worst = e > worst ? e : worst;
        }
    }
    if (!(worst < 1e-5)) {
        fprintf(stderr, "CUDA against the stand-ins: relative error %g\n", worst);
        CHECK(false);
    }
}

static void test_two_cuda_devices_give_one_devices_f16_bytes(void) {
    need_device();
    SUB(check_cuda_two_devices(FERRY_TYPE_F16, false));
    SUB(check_cuda_two_devices(FERRY_TYPE_F16, true));
}

static void test_two_cuda_devices_give_one_devices_q8_0_bytes(void) {
    need_device();
    SUB(check_cuda_two_devices(FERRY_TYPE_Q8_0, false));
}

/* Three CUDA devices of the fake runtime (a GPU machine's own, or its one GPU three times), the
 * host layers pinned: the matrix of each case, and the stand-ins' outputs to rounding. */
static void check_cuda_matrix(ferry_type type, bool v_trans) {
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    static m_result cuda, standin;
    SUB(check_matrix(make_cuda, pinned, type, v_trans, &cuda));
    SUB(check_matrix(make_standin, NULL, type, v_trans, &standin));
    double worst = 0;
    for (int l = 0; l < M_LAYER; l++) {
        for (int i = 0; i < M_OUT_N; i++) {
            const double e = fabs((double) cuda.out[l][i] - standin.out[l][i]) / (1.0 + fabs((double) standin.out[l][i]));
            worst = e > worst ? e : worst;
        }
    }
    if (!(worst < 1e-5)) {
        fprintf(stderr, "CUDA against the stand-ins: relative error %g\n", worst);
        CHECK(false);
    }
}

static void test_cuda_placements_give_the_all_host_run(void) {
    setenv("FERRY_FAKE_CUDA_DEVICES", "3", 0);
    need_device();
    int n = 0;
    CHECK_OK(ferry_cuda_device_count(&n));
    printf("%d CUDA device%s: three backends on %s\n", n, n == 1 ? "" : "s", n >= 3 ? "three devices" : "fewer");
    SUB(check_cuda_matrix(FERRY_TYPE_F16, false));
    SUB(check_cuda_matrix(FERRY_TYPE_F16, true));
    SUB(check_cuda_matrix(FERRY_TYPE_Q8_0, false));
}

/* Each device's memory is its own: CUDA1's backend takes only its own buffers. */
static void test_each_cuda_device_takes_only_its_own_buffers(void) {
    need_device();
    int n = 0;
    CHECK_OK(ferry_cuda_device_count(&n));
    if (n < 2) {
        printf("one device: nothing of a second's memory to check\n");
        return;
    }
    ferry_backend *a, *b;
    CHECK_OK(ferry_cuda_backend_new(0, &a));
    CHECK_OK(ferry_cuda_backend_new(1, &b));
    int d = -1;
    CHECK_OK(ferry_cuda_backend_device(b, &d));
    CHECK_EQ_U(d, 1);
    CHECK(ferry_backend_default_buffer_type(a) != ferry_backend_default_buffer_type(b));
    CHECK(!ferry_backend_supports_buft(b, ferry_backend_default_buffer_type(a)));
    CHECK(!ferry_backend_supports_buft(a, ferry_backend_default_buffer_type(b)));
    ferry_backend_free(a);
    ferry_backend_free(b);
    ferry_backend * c;
    CHECK_FAILS(ferry_cuda_backend_new(n, &c), FERRY_ERR_INVALID_ARG);
}
#endif

static const check_test tests[] = {
    {"two_standins_give_one_devices_bytes", test_two_standins_give_one_devices_bytes},
    {"a_foreign_backend_is_refused_naming_the_layer", test_a_foreign_backend_is_refused_naming_the_layer},
    {"standin_placements_give_the_all_host_run", test_standin_placements_give_the_all_host_run},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"two_cuda_devices_give_one_devices_f16_bytes", test_two_cuda_devices_give_one_devices_f16_bytes},
    {"two_cuda_devices_give_one_devices_q8_0_bytes", test_two_cuda_devices_give_one_devices_q8_0_bytes},
    {"each_cuda_device_takes_only_its_own_buffers", test_each_cuda_device_takes_only_its_own_buffers},
    {"cuda_placements_give_the_all_host_run", test_cuda_placements_give_the_all_host_run},
#endif
};

CHECK_MAIN(tests)
