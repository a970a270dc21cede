/*
 * ferry_kv_attention_step against the same step built a layer at a time with
 * ferry_kv_cache_window and ferry_attn_decode: the same nodes, names, flags and assignments,
 * byte-identical outputs through the scheduler; and every refusal, each leaving no assignment
 * and an untouched graph behind.
 */
#include "check.h"
#include "value-fill.h"

#include <math.h>

#define FERRY_TRY_TEST(expr) \
    do { ferry_status st_ = (expr); if (st_ != FERRY_OK) return st_; } while (0)

enum { N_LAYER = 3, N_STREAM = 2, KV_SIZE = 32, HEAD_DIM = 8, N_HEAD_KV = 2, N_HEAD = 4, N_KV = 24 };

typedef struct {
    ferry_backend * cpu;
    ferry_backend * split;
    ferry_kv_cache * kv;
    ferry_buffer * buf; /* q and kv_len, on the split backend */
    ferry_context * ctx;
    ferry_tensor * q[N_LAYER];
    ferry_tensor * kv_len;
    ferry_sched * sched;
} fixture;

static ferry_status fixture_init(fixture * f, bool v_trans) {
    memset(f, 0, sizeof(*f));
    const ferry_kv_params p = {FERRY_TYPE_F32, FERRY_TYPE_F32, HEAD_DIM, N_HEAD_KV, N_STREAM * KV_SIZE, N_STREAM,
                               N_LAYER, v_trans};
    ferry_status st = ferry_cpu_backend_new(&f->cpu);
    if (st == FERRY_OK) st = ferry_standin_backend_new(&f->split);
    if (st == FERRY_OK) st = ferry_kv_cache_new(&p, ferry_cpu_buffer_type(), &f->kv);
    if (st == FERRY_OK) st = fill_cache(f->kv, N_LAYER);
    if (st == FERRY_OK) st = ferry_context_new(&f->ctx);
    const size_t q_bytes = sizeof(float) * HEAD_DIM * N_HEAD * N_STREAM;
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->split, N_LAYER * q_bytes + 64, &f->buf);
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD, 1, N_STREAM}, ne_len[1] = {N_STREAM};
    if (st == FERRY_OK) st = place_queries(f->ctx, f->buf, N_LAYER, ne_q, q_bytes, f->q);
    if (st == FERRY_OK) st = ferry_tensor_new(f->ctx, FERRY_TYPE_I32, 1, ne_len, &f->kv_len);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->buf, f->kv_len, N_LAYER * q_bytes);
    const int32_t lengths[N_STREAM] = {N_KV - 3, N_KV};
    if (st == FERRY_OK) st = ferry_tensor_set(f->kv_len, lengths, 0, sizeof(lengths));
    ferry_backend * backends[2] = {f->split, f->cpu};
    if (st == FERRY_OK) st = ferry_sched_new(backends, 2, &f->sched);
    if (st == FERRY_OK) st = ferry_sched_set_policy(f->sched, FERRY_COPY_RANGES);
    return st;
}

static void fixture_free(fixture * f) {
    ferry_sched_free(f->sched);
    ferry_buffer_free(f->buf);
    ferry_context_free(f->ctx);
    ferry_kv_cache_free(f->kv);
    ferry_backend_free(f->split);
    ferry_backend_free(f->cpu);
}

/* The step as Python's attention_step builds it from KVCache.window and attn_decode, layer by layer. */
static ferry_status per_layer(fixture * f, ferry_context * ctx, bool v_trans, ferry_graph * graph,
                              ferry_tensor ** outs) {
    for (int32_t l = 0; l < N_LAYER; l++) {
        ferry_tensor *k, *v;
        FERRY_TRY_TEST(ferry_kv_cache_window(f->kv, ctx, l, N_KV, 0, N_STREAM - 1, &k, &v));
        const float scale = (float) (1.0 / sqrt((double) HEAD_DIM));
        FERRY_TRY_TEST(ferry_attn_decode(ctx, f->q[l], k, v, f->kv_len, scale, v_trans, &outs[l]));
        char name[FERRY_MAX_NAME];
        snprintf(name, sizeof(name), "attn%d", l);
        FERRY_TRY_TEST(ferry_tensor_set_name(outs[l], name));
        FERRY_TRY_TEST(ferry_tensor_set_output(outs[l]));
        FERRY_TRY_TEST(ferry_sched_set_tensor_backend(f->sched, outs[l], f->split));
    }
    for (int32_t l = 0; l < N_LAYER; l++) {
        FERRY_TRY_TEST(ferry_graph_build(graph, outs[l]));
    }
    return FERRY_OK;
}

/* Compute graph on the scheduler and read every output into out (N_LAYER rows of n floats). */
static ferry_status run(fixture * f, ferry_graph * graph, ferry_tensor ** outs, float * out, size_t n) {
    FERRY_TRY_TEST(ferry_sched_alloc_graph(f->sched, graph));
    FERRY_TRY_TEST(ferry_sched_graph_compute(f->sched, graph));
    for (int l = 0; l < N_LAYER; l++) {
        FERRY_TRY_TEST(ferry_tensor_get(outs[l], out + (size_t) l * n, 0, n * sizeof(float)));
    }
    return FERRY_OK;
}

static void check_same_step(bool v_trans) {
    fixture f;
    CHECK_OK(fixture_init(&f, v_trans));
    ferry_context *ctx_a, *ctx_b;
    ferry_graph *ga, *gb;
    CHECK_OK(ferry_context_new(&ctx_a));
    CHECK_OK(ferry_context_new(&ctx_b));
    CHECK_OK(ferry_graph_new(&ga));
    CHECK_OK(ferry_graph_new(&gb));
    ferry_tensor *a[N_LAYER], *b[N_LAYER];
    CHECK_OK(ferry_kv_attention_step(f.kv, ctx_a, N_LAYER, N_KV, 0, N_STREAM - 1, f.q, f.kv_len, v_trans, f.sched,
                                     f.split, ga, a));
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), N_LAYER);
    for (int l = 0; l < N_LAYER; l++) {
        char name[FERRY_MAX_NAME];
        snprintf(name, sizeof(name), "attn%d", l);
        CHECK(strcmp(a[l]->name, name) == 0);
        CHECK(a[l]->flags & FERRY_TENSOR_FLAG_OUTPUT);
        CHECK(a[l]->src[3] == f.kv_len && a[l]->src[0] == f.q[l]);
    }
    const size_t n = HEAD_DIM * N_HEAD * N_STREAM;
    float want[N_LAYER * HEAD_DIM * N_HEAD * N_STREAM], got[N_LAYER * HEAD_DIM * N_HEAD * N_STREAM];
    CHECK_OK(run(&f, ga, a, got, n));
    for (int l = 0; l < N_LAYER; l++) {
        CHECK(ferry_sched_get_tensor_backend(f.sched, a[l]) == f.split);
    }
    ferry_sched_clear_assignments(f.sched);
    CHECK_OK(per_layer(&f, ctx_b, v_trans, gb, b));
    CHECK_EQ_U(ferry_graph_n_nodes(ga), ferry_graph_n_nodes(gb));
    CHECK_EQ_U(ferry_graph_n_leafs(ga), ferry_graph_n_leafs(gb));
    CHECK_OK(run(&f, gb, b, want, n));
    CHECK(memcmp(got, want, sizeof(got)) == 0);
    bool finite = true;
    for (size_t i = 0; i < N_LAYER * n; i++) finite = finite && isfinite(got[i]) && got[i] != 0.0f;
    CHECK(finite); /* a real result, not the zeros of an empty run */
    ferry_graph_free(ga);
    ferry_graph_free(gb);
    ferry_sched_free(f.sched);
    f.sched = NULL;
    ferry_context_free(ctx_a);
    ferry_context_free(ctx_b);
    fixture_free(&f);
}

static void test_step_same_as_per_layer(void) { SUB(check_same_step(false)); }
static void test_step_same_as_per_layer_v_trans(void) { SUB(check_same_step(true)); }

/* Fewer layers than the cache has: the first n_layer, and a stream range. */
static void test_a_step_takes_the_first_layers_and_its_streams(void) {
    fixture f;
    CHECK_OK(fixture_init(&f, false));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    ferry_tensor * outs[N_LAYER] = {NULL};
    /* one stream: q and kv_len of one stream */
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD, 1, 1}, ne_len[1] = {1};
    ferry_tensor *q1[2], *len1;
    for (int l = 0; l < 2; l++) CHECK_OK(ferry_tensor_view(f.ctx, f.q[l], 4, ne_q, f.q[l]->nb, 0, &q1[l]));
    CHECK_OK(ferry_tensor_view(f.ctx, f.kv_len, 1, ne_len, f.kv_len->nb, 0, &len1));
    CHECK_OK(ferry_kv_attention_step(f.kv, f.ctx, 2, N_KV, 1, 1, q1, len1, false, f.sched, f.split, g, outs));
    CHECK(outs[0] && outs[1] && outs[2] == NULL);
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), 2);
    CHECK_EQ_U(outs[1]->ne[3], 1);
    CHECK_EQ_U(outs[1]->src[1]->ne[1], N_KV);
    ferry_graph_free(g);
    fixture_free(&f);
}

/* Each refusal: its status and a message, no assignment, the graph untouched, outs not written. */
static void test_each_step_refusal_writes_and_assigns_nothing(void) {
    fixture f;
    CHECK_OK(fixture_init(&f, false));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    ferry_tensor * outs[N_LAYER + 1];
    ferry_tensor * sentinel = f.kv_len;
    for (int i = 0; i <= N_LAYER; i++) outs[i] = sentinel;
    ferry_backend * other;
    CHECK_OK(ferry_cpu_backend_new(&other));
    ferry_tensor * q_null[N_LAYER] = {f.q[0], NULL, f.q[2]};
    ferry_tensor * q_bad[N_LAYER] = {f.q[0], f.q[1], f.kv_len}; /* i32 [ns]: not a query */
    ferry_tensor * q_empty;
    const int64_t ne0[4] = {0, N_HEAD, 1, N_STREAM};
    CHECK_OK(ferry_tensor_new(f.ctx, FERRY_TYPE_F32, 4, ne0, &q_empty));
    ferry_tensor * q_zero[N_LAYER] = {f.q[0], q_empty, f.q[2]};
    const int last = N_STREAM - 1;
#define REFUSED(call, status)                        \
    do {                                             \
        CHECK_FAILS(call, status);                   \
        CHECK_EQ_U(ferry_sched_n_assigned(f.sched), 0);  \
        CHECK_EQ_U(ferry_graph_n_nodes(g), 0);       \
        CHECK_EQ_U(ferry_graph_n_leafs(g), 0);       \
        for (int i = 0; i <= N_LAYER; i++) CHECK(outs[i] == sentinel); \
    } while (0)
    REFUSED(ferry_kv_attention_step(NULL, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, NULL, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, NULL, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, NULL, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, NULL, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, NULL, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, NULL, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, NULL), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, 0, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER + 1, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, -1, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, 0, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, KV_SIZE + 1, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, -1, last, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 1, 0, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, N_STREAM, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, q_null, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1") != NULL);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, q_zero, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, q_bad, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_LAYOUT);
    /* kv_len must be i32 [ns]: a query is not */
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.q[0], false, f.sched, f.split, g, outs), FERRY_ERR_LAYOUT);
    /* the cache's V is not transposed: a v_trans that says it is, is refused whatever the shapes */
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, true, f.sched, f.split, g, outs), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "v_trans") != NULL);
    /* streams 0..0 against queries of two streams */
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, 0, f.q, f.kv_len, false, f.sched, f.split, g, outs), FERRY_ERR_LAYOUT);
    REFUSED(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, other, g, outs), FERRY_ERR_INVALID_ARG);
#undef REFUSED
    /* and after all of them, the step still builds */
    CHECK_OK(ferry_kv_attention_step(f.kv, f.ctx, N_LAYER, N_KV, 0, last, f.q, f.kv_len, false, f.sched, f.split, g, outs));
    CHECK_EQ_U(ferry_sched_n_assigned(f.sched), N_LAYER);
    CHECK(outs[N_LAYER] == sentinel && outs[0] != sentinel);
    ferry_backend_free(other);
    ferry_graph_free(g);
    fixture_free(&f);
}

static const check_test tests[] = {
    {"step_same_as_per_layer", test_step_same_as_per_layer},
    {"step_same_as_per_layer_v_trans", test_step_same_as_per_layer_v_trans},
    {"a_step_takes_the_first_layers_and_its_streams", test_a_step_takes_the_first_layers_and_its_streams},
    {"each_step_refusal_writes_and_assigns_nothing", test_each_step_refusal_writes_and_assigns_nothing},
};

CHECK_MAIN(tests)
