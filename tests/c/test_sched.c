/* The scheduler end to end: splits, input copies under each policy, and the graph's numbers. */
#include "kv-fixture.h"

#include <math.h>

#define KB_BYTES ((size_t) 1024)

#define TRY(expr) do { ferry_status try_st_ = (expr); if (try_st_ != FERRY_OK) return try_st_; } while (0)

/* A scheduler over [split, cpu] running `out` (assigned to the split backend) on a window. */
typedef struct {
    kv_fixture f;
    ferry_sched * sched;
    ferry_graph * graph;
    ferry_tensor * window;
    ferry_tensor * out;
} sched_case;

static ferry_status sched_case_init(sched_case * c, const ferry_kv_params * p, int64_t n_kv, int64_t s0, int64_t s1,
                                    ferry_copy_policy policy, bool scale) {
    memset(c, 0, sizeof(*c));
    TRY(kv_fixture_init(&c->f, p));
    TRY(ferry_kv_cache_window(c->f.kv, c->f.ctx, 0, n_kv, s0, s1, &c->window, NULL));
    ferry_tensor * dup;
    TRY(ferry_dup(c->f.ctx, c->window, &dup));
    c->out = dup;
    if (scale) {
        TRY(ferry_scale(c->f.ctx, dup, 0.5f, &c->out));
    }
    TRY(ferry_tensor_set_output(c->out));
    TRY(ferry_graph_new(&c->graph));
    TRY(ferry_graph_build(c->graph, c->out));
    ferry_backend * backends[2] = {c->f.split, c->f.cpu};
    TRY(ferry_sched_new(backends, 2, &c->sched));
    TRY(ferry_sched_set_policy(c->sched, policy));
    TRY(ferry_sched_set_tensor_backend(c->sched, dup, c->f.split));
    return ferry_sched_alloc_graph(c->sched, c->graph);
}

static void sched_case_free(sched_case * c) {
    ferry_sched_free(c->sched);
    ferry_graph_free(c->graph);
    kv_fixture_free(&c->f);
}

/* The heart test through the scheduler: the K window as attention hands it on, read by
 * a node on the split backend; kv_check_window_copy's verdict, -1 if the setting failed. */
static int ordered_copy_case(ferry_copy_policy policy, ferry_type type, int64_t n_stream, int64_t used) {
    const ferry_kv_params p = {.type_k = type, .type_v = type, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 16 * n_stream, .n_stream = n_stream, .n_layer = 1};
    sched_case c;
    ferry_sched_input_info in;
    int result = -1;
    if (sched_case_init(&c, &p, used, 0, n_stream - 1, policy, false) != FERRY_OK || ferry_sched_n_inputs(c.sched) != 1 ||
        ferry_sched_input(c.sched, 0, &in) != FERRY_OK || in.src != c.window ||
        ferry_tensor_memset(in.copy, SENTINEL, 0, ferry_tensor_nbytes(in.copy)) != FERRY_OK ||
        ferry_sched_graph_compute(c.sched, c.graph) != FERRY_OK || ferry_sched_input(c.sched, 0, &in) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
    } else {
        result = kv_check_window_copy(&c.f, c.window, in.copy, in.stats.bytes_copied);
    }
    sched_case_free(&c);
    return result;
}

static void test_sched_ordered_multi_stream_ranges(void) {
    CHECK_EQ_U(ordered_copy_case(FERRY_COPY_RANGES, FERRY_TYPE_F16, 4, 5), 0);
    CHECK_EQ_U(ordered_copy_case(FERRY_COPY_RANGES, FERRY_TYPE_Q8_0, 2, 11), 0);
}

static void test_sched_ordered_multi_stream_flat_fails_first_assertion(void) {
    CHECK_EQ_U(ordered_copy_case(FERRY_COPY_FLAT, FERRY_TYPE_F16, 4, 5), 1);
}

/* Splits and inputs: the window is the one input of the split backend's split. */
static void test_the_window_is_the_split_backends_one_input(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 4, .n_layer = 1};
    sched_case c;
    CHECK_OK(sched_case_init(&c, &p, 6, 1, 3, FERRY_COPY_RANGES, true));
    CHECK_EQ_U(ferry_sched_n_splits(c.sched), 1); /* dup and scale both on the split backend */
    ferry_sched_split_info sp;
    CHECK_OK(ferry_sched_split(c.sched, 0, &sp));
    CHECK(sp.backend == c.f.split && sp.n_nodes == 2 && sp.n_inputs == 1);
    CHECK(ferry_sched_get_tensor_backend(c.sched, c.out) == c.f.split);
    ferry_sched_input_info in;
    CHECK_OK(ferry_sched_input(c.sched, 0, &in));
    CHECK(ferry_tensor_same_layout(in.copy, c.window)); /* the copy has the source's layout */
    CHECK(in.copy->buffer != NULL);
    CHECK(!ferry_buffer_is_host(in.copy->buffer));
    CHECK(ferry_sched_buffer_size(c.sched, c.f.split) >= ferry_tensor_nbytes(c.window));
    CHECK_FAILS(ferry_sched_split(c.sched, 1, &sp), FERRY_ERR_OUT_OF_BOUNDS);
    /* the graph is left as given: the node still reads the window, not the copy */
    ferry_tensor * dup = c.out->src[0];
    CHECK(dup->src[0] == c.window);
    CHECK_OK(ferry_sched_graph_compute(c.sched, c.graph));
    CHECK(dup->src[0] == c.window);
    sched_case_free(&c);
}

/* Outputs of a graph whose input copy is read by CPU kernels: exact values, the same under every policy. */
static void test_sched_same_numbers_under_every_policy(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 4, .n_layer = 1};
    float * results[FERRY_COPY_POLICY_COUNT] = {0};
    size_t n = 0;
    for (int policy = FERRY_COPY_FLAT; policy <= FERRY_COPY_PLAN; policy++) {
        sched_case c;
        CHECK_OK(sched_case_init(&c, &p, 7, 1, 3, (ferry_copy_policy) policy, true));
        /* cache values that mean something: value = cell index + channel/100 + stream*1000 */
        ferry_tensor * cache;
        CHECK_OK(ferry_kv_cache_k(c.f.kv, 0, &cache));
        float * v = cache->data;
        for (int64_t s = 0; s < cache->ne[2]; s++)
            for (int64_t cell = 0; cell < cache->ne[1]; cell++)
                for (int64_t ch = 0; ch < cache->ne[0]; ch++)
                    v[(s * cache->ne[1] + cell) * cache->ne[0] + ch] = (float) (1000 * s + cell) + (float) ch / 100.0f;
        CHECK_OK(ferry_sched_graph_compute(c.sched, c.graph));
        n = (size_t) ferry_tensor_nelements(c.out);
        results[policy] = malloc(n * sizeof(float));
        CHECK_OK(ferry_tensor_get(c.out, results[policy], 0, n * sizeof(float)));
        /* out = 0.5 * contiguous(window): [head_dim, n_kv, n_head_kv, ns] */
        for (int64_t s = 0; s < 3; s++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t cell = 0; cell < 7; cell++)
                    for (int64_t d = 0; d < 8; d++) {
                        const float want = 0.5f * ((float) (1000 * (s + 1) + cell) + (float) (h * 8 + d) / 100.0f);
                        const float got = results[policy][((s * 2 + h) * 7 + cell) * 8 + d];
                        CHECK(fabsf(got - want) == 0.0f);
                    }
        sched_case_free(&c);
    }
    CHECK(memcmp(results[FERRY_COPY_FLAT], results[FERRY_COPY_RANGES], n * sizeof(float)) == 0);
    CHECK(memcmp(results[FERRY_COPY_FLAT], results[FERRY_COPY_PLAN], n * sizeof(float)) == 0);
    for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        free(results[policy]);
    }
}

/* Unified cache through the scheduler: ranges takes flat's path, bytes and calls. */
static void test_sched_unified_same_as_flat(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_Q8_0, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 1, .n_layer = 1};
    ferry_sched_stats st[2];
    for (int policy = FERRY_COPY_FLAT; policy <= FERRY_COPY_RANGES; policy++) {
        sched_case c;
        CHECK_OK(sched_case_init(&c, &p, 40, 0, 0, (ferry_copy_policy) policy, false));
        CHECK_OK(ferry_sched_graph_compute(c.sched, c.graph));
        CHECK_OK(ferry_sched_get_stats(c.sched, &st[policy]));
        sched_case_free(&c);
    }
    CHECK_EQ_U(st[0].bytes_copied, st[1].bytes_copied);
    CHECK_EQ_U(st[0].copy_calls, st[1].copy_calls);
    CHECK_EQ_U(st[0].impl_calls, st[1].impl_calls);
    CHECK_EQ_U(st[1].bytes_copied, st[1].bytes_read);
}

/* A graph with nothing to copy: every node on the CPU next to its data; assignments move nodes and clear. */
static void test_sched_no_inputs_when_backend_can_use_source(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 1,
                               .n_ctx = 32, .n_stream = 2, .n_layer = 1};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *out;
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 4, 0, 1, &k, NULL));
    CHECK_OK(ferry_dup(f.ctx, k, &out));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, out));
    ferry_backend * backends[2] = {f.cpu, f.split};
    ferry_sched * s;
    CHECK_OK(ferry_sched_new(backends, 2, &s));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    CHECK_EQ_U(ferry_sched_n_inputs(s), 0);
    CHECK(ferry_sched_get_tensor_backend(s, out) == f.cpu);
    /* an assignment moves it, and the window becomes an input; cleared, it comes back */
    CHECK_OK(ferry_sched_set_tensor_backend(s, out, f.split));
    CHECK_OK(ferry_sched_set_tensor_backend(s, out, f.split)); /* assigned twice: one assignment */
    CHECK_EQ_U(ferry_sched_n_assigned(s), 1);
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK(ferry_sched_get_tensor_backend(s, out) == f.split && ferry_sched_n_inputs(s) == 1);
    ferry_sched_clear_assignments(s);
    CHECK_EQ_U(ferry_sched_n_assigned(s), 0);
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK(ferry_sched_get_tensor_backend(s, out) == f.cpu && ferry_sched_n_inputs(s) == 0);
    /* compute allocates again after an option that takes effect at the next alloc, or a new node */
    CHECK(!ferry_sched_needs_alloc(s, g) && !ferry_sched_needs_alloc(NULL, g) && !ferry_sched_needs_alloc(s, NULL));
    CHECK_OK(ferry_sched_set_compact(s, true));
    CHECK(ferry_sched_needs_alloc(s, g));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    CHECK(!ferry_sched_needs_alloc(s, g));
    ferry_tensor * twice;
    CHECK_OK(ferry_dup(f.ctx, out, &twice));
    CHECK_OK(ferry_graph_build(g, twice));
    CHECK(ferry_sched_needs_alloc(s, g));
    ferry_backend * stranger;
    CHECK_OK(ferry_cpu_backend_new(&stranger));
    CHECK_FAILS(ferry_sched_set_tensor_backend(s, out, stranger), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_sched_set_policy(s, (ferry_copy_policy) 9), FERRY_ERR_INVALID_ARG);
    ferry_backend_free(stranger);
    ferry_sched_free(s);
    ferry_graph_free(g);
    kv_fixture_free(&f);
}

/* Compact staging: the split holds the bytes read, not the span, and the numbers do not change. */
static void test_compact_staging_holds_the_bytes_read_only(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                               .n_ctx = 256, .n_stream = 4, .n_layer = 1};
    float * out[2] = {0};
    size_t held[2] = {0}, n = 0;
    uint64_t read = 0, span = 0;
    for (int compact = 0; compact <= 1; compact++) {
        sched_case c;
        CHECK_OK(sched_case_init(&c, &p, 7, 0, 3, FERRY_COPY_RANGES, true));
        /* a scheduler compact from its first allocation: the allocator's buffers never shrink */
        ferry_tensor * dup = c.out->src[0];
        ferry_sched_free(c.sched);
        ferry_backend * backends[2] = {c.f.split, c.f.cpu};
        CHECK_OK(ferry_sched_new(backends, 2, &c.sched));
        CHECK_OK(ferry_sched_set_policy(c.sched, FERRY_COPY_RANGES));
        CHECK_OK(ferry_sched_set_tensor_backend(c.sched, dup, c.f.split));
        CHECK_OK(ferry_sched_set_compact(c.sched, compact));
        CHECK(ferry_sched_get_compact(c.sched) == (bool) compact);
        CHECK_OK(ferry_sched_graph_compute(c.sched, c.graph));
        ferry_sched_input_info in;
        CHECK_OK(ferry_sched_input(c.sched, 0, &in));
        read = in.stats.bytes_read;
        span = in.stats.bytes_span;
        CHECK_EQ_U(in.stats.bytes_copied, read);
        CHECK_EQ_U(ferry_tensor_nbytes(in.copy), compact ? read : span);
        CHECK(compact ? ferry_tensor_is_compact_of(in.copy, c.window) : ferry_tensor_same_layout(in.copy, c.window));
        held[compact] = ferry_sched_buffer_size(c.sched, c.f.split);
        n = (size_t) ferry_tensor_nelements(c.out);
        out[compact] = malloc(n * sizeof(float));
        CHECK_OK(ferry_tensor_get(c.out, out[compact], 0, n * sizeof(float)));
        sched_case_free(&c);
    }
    CHECK(memcmp(out[0], out[1], n * sizeof(float)) == 0);
    /* the split's memory drops by exactly the gaps, up to the allocator's alignment */
    CHECK(held[0] - held[1] + 64 >= span - read && held[0] - held[1] <= span - read + 64);
    free(out[0]);
    free(out[1]);
}

/* A view whose plan is several copies keeps its own layout under compact staging. */
static void test_compact_keeps_the_layout_of_a_many_copy_view(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *store, *v, *c;
    const int64_t ne_store[1] = {1024};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne_store, &store));
    const int64_t ne[3] = {4, 3, 2};
    const size_t nested[3] = {4, 100, 1000}; /* 3 rows at pitch 100, twice at 1000: two copies */
    CHECK_OK(ferry_tensor_view(ctx, store, 3, ne, nested, 0, &v));
    CHECK_OK(ferry_tensor_compact_layout(ctx, v, &c));
    CHECK(ferry_tensor_same_layout(c, v) && !ferry_tensor_is_compact_of(c, v));
    const size_t folded[3] = {4, 100, 300}; /* one progression: one copy of 6 rows */
    CHECK_OK(ferry_tensor_view(ctx, store, 3, ne, folded, 0, &v));
    CHECK_OK(ferry_tensor_compact_layout(ctx, v, &c));
    CHECK(ferry_tensor_is_compact_of(c, v));
    CHECK(c->nb[0] == 4 && c->nb[1] == 16 && c->nb[2] == 48 && ferry_tensor_nbytes(c) == 96);
    ferry_context_free(ctx);
}

/*
 * A result on the CPU that a split on the stand-in device reads by copy: it must live
 * until the copy is made, though its last reader in the allocated graph (where the split
 * reads the copy) is a CPU node before that, which could otherwise work in place over it.
 * And each layer's window copy is made just before the node that reads it, in the memory
 * of the layer before: the split's memory does not grow with the layers.
 */
static void test_sched_copy_source_lives_until_copied(void) {
    ferry_backend *cpu, *standin;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_standin_backend_new(&standin));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t n = 64;
    ferry_tensor *x, *a, *c, *d;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, &n, &x));
    CHECK_OK(ferry_scale(ctx, x, 2.0f, &a)); /* CPU */
    CHECK_OK(ferry_scale(ctx, a, 3.0f, &c)); /* CPU: a's last reader in the allocated graph */
    CHECK_OK(ferry_scale(ctx, a, 5.0f, &d)); /* stand-in: reads a copy of a */
    ferry_tensor_set_output(c);
    ferry_tensor_set_output(d);
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, c));
    CHECK_OK(ferry_graph_build(g, d));
    ferry_backend * backends[2] = {cpu, standin};
    ferry_sched * s;
    CHECK_OK(ferry_sched_new(backends, 2, &s));
    CHECK_OK(ferry_sched_set_tensor_backend(s, d, standin));
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK_EQ_U(ferry_sched_n_splits(s), 2);
    CHECK_EQ_U(ferry_sched_n_inputs(s), 1);
    float in[64], got[64];
    for (int i = 0; i < n; i++) {
        in[i] = (float) i;
    }
    CHECK_OK(ferry_tensor_set(x, in, 0, sizeof(in)));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    CHECK_OK(ferry_tensor_get(d, got, 0, sizeof(got)));
    for (int i = 0; i < n; i++) {
        CHECK(got[i] == 10.0f * in[i]);
    }
    CHECK_OK(ferry_tensor_get(c, got, 0, sizeof(got)));
    for (int i = 0; i < n; i++) {
        CHECK(got[i] == 6.0f * in[i]);
    }
    ferry_sched_free(s);
    ferry_graph_free(g);

    /* layers: out_l = dup(h_l) on the stand-in, h_l computed on the CPU; 4 KB each */
    const int64_t ne = 1024;
    ferry_tensor * outs[8];
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, &ne, &x));
    for (int l = 0; l < 8; l++) {
        ferry_tensor * h;
        CHECK_OK(ferry_scale(ctx, x, (float) l, &h));
        CHECK_OK(ferry_tensor_set_output(h));
        CHECK_OK(ferry_dup(ctx, h, &outs[l]));
        CHECK_OK(ferry_graph_build(g, h));
    }
    for (int l = 0; l < 8; l++) {
        CHECK_OK(ferry_tensor_set_output(outs[l]));
        CHECK_OK(ferry_graph_build(g, outs[l]));
    }
    CHECK_OK(ferry_sched_new(backends, 2, &s));
    for (int l = 0; l < 8; l++) {
        CHECK_OK(ferry_sched_set_tensor_backend(s, outs[l], standin));
    }
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK_EQ_U(ferry_sched_n_splits(s), 2);
    CHECK_EQ_U(ferry_sched_n_inputs(s), 8);
    /* the 8 outputs, and one copy at a time; kept, all 8 copies */
    CHECK_EQ_U(ferry_sched_buffer_size(s, standin), 9 * 4 * KB_BYTES);
    CHECK(!ferry_sched_get_keep_inputs(s));
    CHECK_OK(ferry_sched_set_keep_inputs(s, true));
    CHECK(ferry_sched_get_keep_inputs(s));
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK_EQ_U(ferry_sched_buffer_size(s, standin), 16 * 4 * KB_BYTES);
    CHECK_FAILS(ferry_sched_set_keep_inputs(NULL, true), FERRY_ERR_INVALID_ARG);
    float ones[1024], got_l[1024];
    for (int i = 0; i < ne; i++) {
        ones[i] = 1.0f;
    }
    CHECK_OK(ferry_tensor_set(x, ones, 0, sizeof(ones)));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    for (int l = 0; l < 8; l++) {
        CHECK_OK(ferry_tensor_get(outs[l], got_l, 0, sizeof(got_l)));
        CHECK(got_l[0] == (float) l && got_l[1023] == (float) l);
    }
    ferry_sched_free(s);
    ferry_graph_free(g);
    ferry_context_free(ctx);
    ferry_backend_free(standin);
    ferry_backend_free(cpu);
}

/* What a scheduler refuses, naming why: no backends, or more than it holds (16); a graph
 * with a node no backend supports (it says which); a split or input it does not have, a
 * negative prefetch. Asked about what it does not hold, it answers NULL or 0. A view of a
 * computed node is where the node is. */
static void test_sched_refuses_what_it_cannot_do_naming_why(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_backend * many[17];
    for (int i = 0; i < 17; i++) {
        many[i] = cpu;
    }
    ferry_sched * s = NULL;
    CHECK_FAILS(ferry_sched_new(many, 0, &s), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_sched_new(many, 17, &s), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "17 backends (1..16)") != NULL);
    CHECK(s == NULL);
    CHECK_OK(ferry_sched_new(many, 1, &s));
    CHECK_FAILS(ferry_sched_set_prefetch(s, -1), FERRY_ERR_INVALID_ARG);
    CHECK_EQ_U(ferry_sched_get_prefetch(s), 0);

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {32, 2};
    ferry_tensor *x, *y, *stranger;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_Q8_0, 2, ne, &x));
    CHECK_OK(ferry_dup_as(ctx, x, FERRY_TYPE_F32, &y)); /* dequantizing: the CPU has no kernel */
    CHECK_OK(ferry_tensor_set_name(y, "dequantized"));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, y));
    CHECK_FAILS(ferry_sched_alloc_graph(s, g), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "no backend supports dup of 'dequantized'") != NULL);
    CHECK_EQ_U(ferry_sched_n_splits(s), 0);

    /* f32 instead: a dup, its transpose (a view of a computed node) and a scale of that */
    ferry_tensor *f, *d, *t, *out;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &f));
    CHECK_OK(ferry_dup(ctx, f, &d));
    CHECK_OK(ferry_tensor_transpose(ctx, d, &t));
    CHECK_OK(ferry_scale(ctx, t, 2.0f, &out));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &stranger));
    ferry_graph_clear(g);
    CHECK_OK(ferry_graph_build(g, out));
    CHECK_OK(ferry_sched_alloc_graph(s, g));
    CHECK(ferry_sched_get_tensor_backend(s, t) == cpu);
    CHECK(ferry_sched_get_tensor_backend(s, stranger) == NULL);
    ferry_sched_split_info sp;
    ferry_sched_input_info in;
    CHECK_FAILS(ferry_sched_split(s, -1, &sp), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_sched_input(s, -1, &in), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_sched_input(s, 0, &in), FERRY_ERR_OUT_OF_BOUNDS); /* no inputs: all on the CPU */
    CHECK_FAILS(ferry_sched_set_tensor_backend(s, NULL, cpu), FERRY_ERR_INVALID_ARG);
    ferry_backend * other;
    CHECK_OK(ferry_cpu_backend_new(&other));
    CHECK(ferry_sched_buffer_size(s, cpu) > 0);
    CHECK_EQ_U(ferry_sched_buffer_size(s, other), 0);
    ferry_backend_free(other);
    ferry_sched_free(s);
    ferry_graph_free(g);
    ferry_context_free(ctx);
    ferry_backend_free(cpu);
}

static const check_test tests[] = {
    {"sched_ordered_multi_stream_ranges", test_sched_ordered_multi_stream_ranges},
    {"sched_ordered_multi_stream_flat_fails_first_assertion", test_sched_ordered_multi_stream_flat_fails_first_assertion},
    {"the_window_is_the_split_backends_one_input", test_the_window_is_the_split_backends_one_input},
    {"sched_same_numbers_under_every_policy", test_sched_same_numbers_under_every_policy},
    {"sched_unified_same_as_flat", test_sched_unified_same_as_flat},
    {"sched_no_inputs_when_backend_can_use_source", test_sched_no_inputs_when_backend_can_use_source},
    {"compact_staging_holds_the_bytes_read_only", test_compact_staging_holds_the_bytes_read_only},
    {"compact_keeps_the_layout_of_a_many_copy_view", test_compact_keeps_the_layout_of_a_many_copy_view},
    {"sched_copy_source_lives_until_copied", test_sched_copy_source_lives_until_copied},
    {"sched_refuses_what_it_cannot_do_naming_why", test_sched_refuses_what_it_cannot_do_naming_why},
};

CHECK_MAIN(tests)
