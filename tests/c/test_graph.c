/* Graphs and ops: building, shape inference and its errors, the CPU kernels on
 * strided views, and a small graph run end to end on the CPU backend. */
#include "check.h"

#include <stdint.h>


static ferry_tensor * mk(ferry_context * ctx, ferry_type type, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    const int64_t ne[4] = {n0, n1, n2, n3};
    ferry_tensor * t = NULL;
    ferry_tensor_new(ctx, type, 4, ne, &t);
    return t;
}

static int index_of_node(const ferry_graph * g, const ferry_tensor * t) {
    for (int i = 0; i < ferry_graph_n_nodes(g); i++) {
        if (ferry_graph_node(g, i) == t) {
            return i;
        }
    }
    return -1;
}

static void test_nodes_follow_their_sources_and_cycles_are_refused(void) {
    ferry_context * ctx;
    ferry_graph * g;
    CHECK_OK(ferry_context_new(&ctx));
    CHECK_OK(ferry_graph_new(&g));
    ferry_tensor *x = mk(ctx, FERRY_TYPE_F32, 4, 3, 1, 1), *y = mk(ctx, FERRY_TYPE_F32, 4, 1, 1, 1);
    ferry_tensor *a, *m, *t, *d;
    CHECK_OK(ferry_add(ctx, x, y, &a));
    CHECK_OK(ferry_mul(ctx, a, x, &m));
    CHECK_OK(ferry_tensor_transpose(ctx, m, &t));
    CHECK_OK(ferry_dup(ctx, t, &d));
    CHECK_OK(ferry_graph_build(g, d));
    CHECK_OK(ferry_graph_build(g, d)); /* again: nothing added */
    CHECK_OK(ferry_graph_build(g, a));
    CHECK_EQ_U(ferry_graph_n_leafs(g), 2);
    CHECK_EQ_U(ferry_graph_n_nodes(g), 4);
    CHECK(ferry_graph_leaf(g, 0) == x && ferry_graph_leaf(g, 1) == y);
    /* every node after its sources */
    for (int i = 0; i < ferry_graph_n_nodes(g); i++) {
        const ferry_tensor * n = ferry_graph_node(g, i);
        for (int j = 0; j < FERRY_MAX_SRC; j++) {
            if (n->src[j] && n->src[j]->op != FERRY_OP_NONE) {
                CHECK(index_of_node(g, n->src[j]) < i);
            }
        }
    }
    CHECK(ferry_graph_node(g, 3) == d && ferry_graph_node(g, 2) == t);
    CHECK(ferry_graph_node(g, 4) == NULL && ferry_graph_leaf(g, -1) == NULL);
    ferry_graph_clear(g);
    CHECK_EQ_U(ferry_graph_n_nodes(g), 0);
    CHECK_OK(ferry_graph_build(g, a));
    CHECK_EQ_U(ferry_graph_n_nodes(g), 1);

    /* a cycle (only by editing src by hand) is refused, and the graph stays usable */
    ferry_tensor *p, *q;
    CHECK_OK(ferry_scale(ctx, x, 1.0f, &p));
    CHECK_OK(ferry_scale(ctx, p, 1.0f, &q));
    p->src[0] = q;
    CHECK_FAILS(ferry_graph_build(g, q), FERRY_ERR_LAYOUT);
    CHECK_EQ_U(ferry_graph_n_nodes(g), 1);
    CHECK_OK(ferry_graph_build(g, m));
    CHECK_EQ_U(ferry_graph_n_nodes(g), 2);
    ferry_graph_free(g);
    ferry_context_free(ctx);
}

/* A chain far deeper than a C stack would allow with recursion. */
static void test_a_200000_node_chain_builds_without_recursion(void) {
    ferry_context * ctx;
    ferry_graph * g;
    CHECK_OK(ferry_context_new(&ctx));
    CHECK_OK(ferry_graph_new(&g));
    ferry_tensor * t = mk(ctx, FERRY_TYPE_F32, 1, 1, 1, 1);
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        CHECK_OK(ferry_scale(ctx, t, 1.0f, &t));
    }
    CHECK_OK(ferry_graph_build(g, t));
    CHECK_EQ_U(ferry_graph_n_nodes(g), n);
    CHECK(ferry_graph_node(g, n - 1) == t);
    ferry_graph_free(g);
    ferry_context_free(ctx);
}

/* Results whose shape or byte size would pass int64_t are refused by name, before any
 * tensor is made: two halves that each fit can concatenate or pad past it. And a row of a
 * block type that a transpose cut short (q8_0 rows of 15 values) cannot become a result. */
static void test_result_sizes_refused(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * r = NULL;
    /* q4_0: 2^62 values a row is 2^57 blocks, about 2^61 bytes; two rows' values pass 2^63 */
    const int64_t half = (int64_t) 1 << 62;
    ferry_tensor * big = mk(ctx, FERRY_TYPE_Q4_0, half, 1, 1, 1);
    CHECK(big != NULL);
    const size_t before = ferry_context_n_tensors(ctx);
    CHECK_FAILS(ferry_concat(ctx, big, big, 0, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "concat: ne[0] overflows") != NULL);
    ferry_tensor * top = mk(ctx, FERRY_TYPE_Q4_0, INT64_MAX - 31, 1, 1, 1); /* the last whole block */
    CHECK(top != NULL);
    CHECK_FAILS(ferry_pad(ctx, top, 32, 0, 0, 0, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "pad: ne[0] overflows") != NULL);
    /* f32: 2^60 values are 2^62 bytes; two of them 2^63 (past int64_t), four 2^64 (past size_t) */
    ferry_tensor * f = mk(ctx, FERRY_TYPE_F32, (int64_t) 1 << 60, 1, 1, 1);
    CHECK(f != NULL);
    CHECK_FAILS(ferry_concat(ctx, f, f, 1, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "concat: the result's byte size overflows") != NULL);
    ferry_tensor * f2 = mk(ctx, FERRY_TYPE_F32, (int64_t) 1 << 60, 2, 1, 1);
    CHECK(f2 == NULL); /* 2^63 bytes: no such tensor either */
    ferry_tensor * g = mk(ctx, FERRY_TYPE_F32, (int64_t) 1 << 59, 1, 1, 1);
    CHECK(g != NULL);
    CHECK_FAILS(ferry_pad(ctx, g, 0, 7, 0, 0, &r), FERRY_ERR_OUT_OF_BOUNDS); /* 8 rows of 2^61 bytes */
    CHECK(strstr(ferry_last_error(), "pad: the result's byte size overflows") != NULL);
    CHECK_EQ_U(ferry_context_n_tensors(ctx), before + 3); /* top, f and g: no result was made */
    CHECK(r == NULL);

    /* a q8_0 tensor transposed so that its rows are 15 values, part of a block */
    ferry_tensor *q = mk(ctx, FERRY_TYPE_Q8_0, 32, 15, 1, 1), *qt;
    CHECK_OK(ferry_tensor_transpose(ctx, q, &qt)); /* [15, 32] */
    CHECK_FAILS(ferry_concat(ctx, qt, qt, 0, &r), FERRY_ERR_LAYOUT); /* rows of 30 values */
    CHECK(strstr(ferry_last_error(), "not whole blocks") != NULL);
    CHECK_FAILS(ferry_concat(ctx, qt, qt, 1, &r), FERRY_ERR_LAYOUT); /* rows of 15 values */
    CHECK_FAILS(ferry_scale(ctx, qt, 2.0f, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_pad(ctx, qt, 0, 1, 0, 0, &r), FERRY_ERR_LAYOUT);
    CHECK(r == NULL);
    ferry_context_free(ctx);
}

static void test_ops_shape_their_results_or_refuse_the_operands(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *a = mk(ctx, FERRY_TYPE_F32, 4, 3, 2, 1), *b = mk(ctx, FERRY_TYPE_F32, 4, 1, 2, 1);
    ferry_tensor *h = mk(ctx, FERRY_TYPE_F16, 4, 3, 2, 1), *r;
    CHECK_OK(ferry_add(ctx, a, b, &r));
    CHECK(r->ne[0] == 4 && r->ne[1] == 3 && r->ne[2] == 2 && ferry_tensor_is_contiguous(r));
    CHECK(r->op == FERRY_OP_ADD && r->src[0] == a && r->src[1] == b);
    CHECK_FAILS(ferry_add(ctx, b, a, &r), FERRY_ERR_LAYOUT); /* a does not repeat over b */
    CHECK_FAILS(ferry_mul(ctx, a, mk(ctx, FERRY_TYPE_F32, 3, 1, 1, 1), &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_add(ctx, a, h, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_add(ctx, a, NULL, &r), FERRY_ERR_INVALID_ARG);

    CHECK_OK(ferry_scale(ctx, a, 0.5f, &r));
    float s;
    memcpy(&s, &r->op_params[0], sizeof(s));
    CHECK(s == 0.5f);

    CHECK_OK(ferry_concat(ctx, a, b, 1, &r));
    CHECK(r->ne[1] == 4 && r->ne[0] == 4 && r->ne[2] == 2 && r->op_params[0] == 1);
    CHECK_FAILS(ferry_concat(ctx, a, b, 0, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_concat(ctx, a, b, 4, &r), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_concat(ctx, a, h, 1, &r), FERRY_ERR_LAYOUT);

    CHECK_OK(ferry_pad(ctx, a, 1, 2, 0, 3, &r));
    CHECK(r->ne[0] == 5 && r->ne[1] == 5 && r->ne[2] == 2 && r->ne[3] == 4);
    CHECK_FAILS(ferry_pad(ctx, a, -1, 0, 0, 0, &r), FERRY_ERR_LAYOUT);

    CHECK_OK(ferry_mean(ctx, a, &r));
    CHECK(r->ne[0] == 1 && r->ne[1] == 3 && r->ne[2] == 2);
    CHECK_FAILS(ferry_mean(ctx, mk(ctx, FERRY_TYPE_Q8_0, 32, 1, 1, 1), &r), FERRY_ERR_LAYOUT);

    ferry_tensor * t;
    CHECK_OK(ferry_tensor_transpose(ctx, a, &t));
    CHECK_OK(ferry_dup(ctx, t, &r));
    CHECK(r->ne[0] == 3 && r->ne[1] == 4 && ferry_tensor_is_contiguous(r) && r->type == FERRY_TYPE_F32);
    CHECK_OK(ferry_dup_as(ctx, t, FERRY_TYPE_F16, &r));
    CHECK(r->type == FERRY_TYPE_F16 && r->nb[1] == 6);
    CHECK_FAILS(ferry_dup_as(ctx, a, FERRY_TYPE_Q8_0, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_dup_as(ctx, a, (ferry_type) 42, &r), FERRY_ERR_UNKNOWN_TYPE);

    CHECK(strcmp(ferry_op_name(FERRY_OP_CONCAT), "concat") == 0);
    CHECK(ferry_op_name((ferry_op) 99) == NULL);
    CHECK_FAILS(ferry_tensor_set_flags(a, 8), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_tensor_set_flags(a, FERRY_TENSOR_FLAG_INPUT | FERRY_TENSOR_FLAG_OUTPUT));
    ferry_context_free(ctx);
}

/* ---------------------------------------------------------------- running graphs */

typedef struct {
    ferry_backend * be;
    ferry_context * ctx;
    ferry_graph * g;
    ferry_gallocr * ga;
} rig;

static bool rig_init(rig * r, ferry_backend * be) {
    *r = (rig) {.be = be};
    return be && ferry_context_new(&r->ctx) == FERRY_OK && ferry_graph_new(&r->g) == FERRY_OK &&
           ferry_gallocr_new(ferry_backend_default_buffer_type(be), &r->ga) == FERRY_OK;
}

static void rig_free(rig * r) {
    ferry_gallocr_free(r->ga);
    ferry_graph_free(r->g);
    ferry_context_free(r->ctx);
    ferry_backend_free(r->be);
}

static void fill(float * v, size_t n, float start, float step) {
    for (size_t i = 0; i < n; i++) {
        v[i] = start + step * (float) i;
    }
}

/* Element (i0, i1) of a 2-D f32 result read back into host memory. */
static void read_all(const ferry_tensor * t, float * out) {
    CHECK_OK(ferry_tensor_get(t, out, 0, ferry_tensor_nbytes(t)));
}

/*
 * x [4,3], y [4,1]; a = x + y; m = a * x; s = m / 4; t = s^T (a strided view);
 * d = dup(t) [3,4]; c = concat(d, t, 1) [3,8] (reads t through its strides);
 * p = pad(c, 1) [4,8]; mn = mean(p) [1,8]. Values are small multiples of 1/4, so
 * every result is exact in f32 and compared exactly.
 */
static void small_graph(rig * r, float * got_d, float * got_p, float * got_mn) {
    ferry_tensor *x = mk(r->ctx, FERRY_TYPE_F32, 4, 3, 1, 1), *y = mk(r->ctx, FERRY_TYPE_F32, 4, 1, 1, 1);
    ferry_tensor *a, *m, *s, *t, *d, *c, *p, *mn;
    CHECK_OK(ferry_tensor_set_input(x));
    CHECK_OK(ferry_tensor_set_input(y));
    CHECK_OK(ferry_add(r->ctx, x, y, &a));
    CHECK_OK(ferry_mul(r->ctx, a, x, &m));
    CHECK_OK(ferry_scale(r->ctx, m, 0.25f, &s));
    CHECK_OK(ferry_tensor_transpose(r->ctx, s, &t));
    CHECK_OK(ferry_dup(r->ctx, t, &d));
    CHECK_OK(ferry_concat(r->ctx, d, t, 1, &c));
    CHECK_OK(ferry_pad(r->ctx, c, 1, 0, 0, 0, &p));
    CHECK_OK(ferry_mean(r->ctx, p, &mn));
    CHECK_OK(ferry_tensor_set_output(d));
    CHECK_OK(ferry_tensor_set_output(p));
    CHECK_OK(ferry_tensor_set_output(mn));
    CHECK_OK(ferry_graph_build(r->g, mn));
    CHECK_OK(ferry_graph_build(r->g, d));
    CHECK_FAILS(ferry_backend_graph_compute(r->be, r->g), FERRY_ERR_NOT_ALLOCATED);
    CHECK_OK(ferry_gallocr_alloc_graph(r->ga, r->g));
    float xv[12], yv[4];
    fill(xv, 12, -1.5f, 0.25f);
    fill(yv, 4, 0.5f, -0.5f);
    CHECK_OK(ferry_tensor_set(x, xv, 0, sizeof(xv)));
    CHECK_OK(ferry_tensor_set(y, yv, 0, sizeof(yv)));
    CHECK_OK(ferry_backend_graph_compute(r->be, r->g));
    SUB(read_all(d, got_d));
    SUB(read_all(p, got_p));
    SUB(read_all(mn, got_mn));
}

static void expected_small_graph(float * d, float * p, float * mn) {
    float xv[12], yv[4], sv[3][4];
    fill(xv, 12, -1.5f, 0.25f);
    fill(yv, 4, 0.5f, -0.5f);
    for (int i1 = 0; i1 < 3; i1++) {
        for (int i0 = 0; i0 < 4; i0++) {
            const float xx = xv[i1 * 4 + i0];
            sv[i1][i0] = (xx + yv[i0]) * xx * 0.25f;
        }
    }
    /* d[j][i] = s[i][j]: ne [3,4], rows of 3; c = rows of d then rows of t (same values) */
    for (int j = 0; j < 4; j++) {
        for (int i = 0; i < 3; i++) {
            d[j * 3 + i] = sv[i][j];
        }
    }
    for (int row = 0; row < 8; row++) {
        float sum = 0.0f;
        for (int i0 = 0; i0 < 4; i0++) {
            const float v = i0 < 3 ? d[(row % 4) * 3 + i0] : 0.0f;
            p[row * 4 + i0] = v;
            sum += v;
        }
        mn[row] = sum / 4.0f;
    }
}

static void check_small_graph(ferry_backend * be) {
    rig r;
    CHECK(rig_init(&r, be));
    float d[12], p[32], mn[8], want_d[12], want_p[32], want_mn[8];
    const int before = check_failures;
    small_graph(&r, d, p, mn);
    rig_free(&r);
    CHECK(check_failures == before);
    expected_small_graph(want_d, want_p, want_mn);
    for (int i = 0; i < 12; i++) {
        CHECK(d[i] == want_d[i]);
    }
    for (int i = 0; i < 32; i++) {
        CHECK(p[i] == want_p[i]);
    }
    for (int i = 0; i < 8; i++) {
        CHECK(mn[i] == want_mn[i]);
    }
}

static void test_small_graph_computes_its_numbers_on_the_cpu(void) {
    ferry_backend * be = NULL;
    CHECK_OK(ferry_cpu_backend_new(&be));
    check_small_graph(be);
}

/* The dummy backend with real memory runs the same kernels, so the same numbers. */
static void test_real_memory_dummy_computes_the_cpus_numbers(void) {
    ferry_dummy_params params = ferry_dummy_default_params();
    params.real_memory = true;
    params.alignment = 256;
    ferry_backend * be = NULL;
    CHECK_OK(ferry_dummy_backend_new(&params, &be));
    check_small_graph(be);
}

/* Kernels on 4-D strided views: a permuted tensor, a view that skips rows, with
 * broadcasting, and dup to f16 and back. Compared with plain index arithmetic. */
static void test_kernels_on_strided_views_match_index_arithmetic(void) {
    rig r;
    ferry_backend * be = NULL;
    CHECK_OK(ferry_cpu_backend_new(&be));
    CHECK(rig_init(&r, be));
    ferry_tensor *x = mk(r.ctx, FERRY_TYPE_F32, 3, 4, 2, 5), *b = mk(r.ctx, FERRY_TYPE_F32, 1, 2, 2, 1);
    ferry_tensor *pm, *dp, *v, *sum, *h, *back, *pd;
    ferry_tensor_set_input(x);
    ferry_tensor_set_input(b);
    CHECK_OK(ferry_tensor_permute(r.ctx, x, 2, 0, 3, 1, &pm)); /* ne [4,5,3,2] */
    CHECK_OK(ferry_dup(r.ctx, pm, &dp));
    /* every other row of x's first dimension-1 slice: ne [3,2,2,5], nb[1] doubled */
    const int64_t ne_v[4] = {3, 2, 2, 5};
    const size_t nb_v[4] = {x->nb[0], 2 * x->nb[1], x->nb[2], x->nb[3]};
    CHECK_OK(ferry_tensor_view(r.ctx, x, 4, ne_v, nb_v, x->nb[1], &v));
    CHECK_OK(ferry_add(r.ctx, v, b, &sum));
    CHECK_OK(ferry_dup_as(r.ctx, pm, FERRY_TYPE_F16, &h));
    CHECK_OK(ferry_dup_as(r.ctx, h, FERRY_TYPE_F32, &back));
    CHECK_OK(ferry_pad(r.ctx, v, 1, 0, 1, 0, &pd));
    ferry_tensor * outs[4] = {dp, sum, back, pd};
    for (int i = 0; i < 4; i++) {
        ferry_tensor_set_output(outs[i]);
        CHECK_OK(ferry_graph_build(r.g, outs[i]));
    }
    CHECK_OK(ferry_gallocr_alloc_graph(r.ga, r.g));
    float xv[120], bv[4];
    fill(xv, 120, -7.0f, 0.125f);
    fill(bv, 4, 100.0f, 10.0f);
    CHECK_OK(ferry_tensor_set(x, xv, 0, sizeof(xv)));
    CHECK_OK(ferry_tensor_set(b, bv, 0, sizeof(bv)));
    CHECK_OK(ferry_backend_graph_compute(r.be, r.g));
    float got_dp[120], got_back[120], got_sum[60], got_pd[4 * 2 * 3 * 5];
    SUB(read_all(dp, got_dp));
    SUB(read_all(back, got_back));
    SUB(read_all(sum, got_sum));
    SUB(read_all(pd, got_pd));
    rig_free(&r);
#define X(i0, i1, i2, i3) xv[(i0) + 3 * ((i1) + 4 * ((i2) + 2 * (i3)))]
    /* x dim i goes to result dim axis[i] = (2, 0, 3, 1): result (j0..j3) = x(j2, j0, j3, j1) */
    for (int j3 = 0; j3 < 2; j3++)
        for (int j2 = 0; j2 < 3; j2++)
            for (int j1 = 0; j1 < 5; j1++)
                for (int j0 = 0; j0 < 4; j0++) {
                    const int k = j0 + 4 * (j1 + 5 * (j2 + 3 * j3));
                    CHECK(got_dp[k] == X(j2, j0, j3, j1));
                    CHECK(got_back[k] == X(j2, j0, j3, j1)); /* multiples of 1/8 below 8: exact in f16 */
                }
    for (int i3 = 0; i3 < 5; i3++)
        for (int i2 = 0; i2 < 2; i2++)
            for (int i1 = 0; i1 < 2; i1++)
                for (int i0 = 0; i0 < 3; i0++) {
                    const float xv_ = X(i0, 1 + 2 * i1, i2, i3);
                    CHECK(got_sum[i0 + 3 * (i1 + 2 * (i2 + 2 * i3))] == xv_ + bv[i1 + 2 * i2]);
                }
    for (int i3 = 0; i3 < 5; i3++)
        for (int i2 = 0; i2 < 3; i2++)
            for (int i1 = 0; i1 < 2; i1++)
                for (int i0 = 0; i0 < 4; i0++) {
                    const float want = i0 < 3 && i2 < 2 ? X(i0, 1 + 2 * i1, i2, i3) : 0.0f;
                    CHECK(got_pd[i0 + 4 * (i1 + 2 * (i2 + 3 * i3))] == want);
                }
#undef X
}

/* What compute refuses, with a message, without running anything. */
/* What a backend refuses to compute, naming why: a node with no memory yet; an op the CPU
 * kernels lack, on a dummy with real memory (which claims every op and computes with those
 * kernels); any graph on a stand-in's copy queue, which copies and computes nothing. Nothing
 * is written. */
static void test_backends_refuse_what_they_cannot_compute(void) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend * dummy = NULL;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dummy));
    rig r;
    CHECK(rig_init(&r, dummy));
    ferry_tensor *x = mk(r.ctx, FERRY_TYPE_Q8_0, 32, 2, 1, 1), *y;
    CHECK_OK(ferry_dup_as(r.ctx, x, FERRY_TYPE_F32, &y)); /* dequantizing: no CPU kernel */
    CHECK_OK(ferry_tensor_set_name(y, "dequantized"));
    CHECK_OK(ferry_graph_build(r.g, y));
    /* the leaf placed, the node not: refused before anything runs */
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(dummy, 4096, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, x, 0));
    CHECK_FAILS(ferry_backend_graph_compute(dummy, r.g), FERRY_ERR_NOT_ALLOCATED);
    CHECK(strstr(ferry_last_error(), "'dequantized' is not allocated") != NULL);
    CHECK_OK(ferry_buffer_place_tensor(buf, y, 1024));
    CHECK_OK(ferry_tensor_memset(y, 0xA5, 0, ferry_tensor_nbytes(y)));
    CHECK(ferry_backend_supports_op(dummy, y));
    CHECK_FAILS(ferry_backend_graph_compute(dummy, r.g), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "the CPU kernels do not do dup of f32 ('dequantized')") != NULL);
    uint8_t back[256];
    CHECK_OK(ferry_tensor_get(y, back, 0, sizeof(back)));
    for (size_t i = 0; i < sizeof(back); i++) {
        CHECK_EQ_U(back[i], 0xA5);
    }
    /* a copy queue runs copies, never graphs */
    ferry_backend *standin, *queue;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
    ferry_graph * empty;
    CHECK_OK(ferry_graph_new(&empty));
    CHECK_FAILS(ferry_backend_graph_compute(queue, empty), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "cannot compute graphs") != NULL);
    ferry_graph_free(empty);
    ferry_backend_free(standin);
    ferry_buffer_free(buf);
    rig_free(&r);
}

static void test_compute_refuses_unsupported_ops_and_memory(void) {
    rig r;
    ferry_backend * cpu = NULL;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK(rig_init(&r, cpu));
    ferry_tensor *i = mk(r.ctx, FERRY_TYPE_I32, 4, 1, 1, 1), *q = mk(r.ctx, FERRY_TYPE_Q8_0, 32, 2, 1, 1), *s, *c;
    CHECK_OK(ferry_add(r.ctx, i, i, &s));
    CHECK_OK(ferry_graph_build(r.g, s));
    CHECK_OK(ferry_gallocr_alloc_graph(r.ga, r.g));
    CHECK(!ferry_backend_supports_op(cpu, s));
    CHECK_FAILS(ferry_backend_graph_compute(cpu, r.g), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "add"));
    ferry_graph_clear(r.g);
    CHECK_OK(ferry_concat(r.ctx, q, q, 1, &c));
    CHECK(!ferry_backend_supports_op(cpu, c));
    CHECK_FAILS(ferry_backend_graph_compute(NULL, r.g), FERRY_ERR_INVALID_ARG);

    /* memory of a backend the CPU cannot use */
    ferry_backend * dummy = NULL;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dummy));
    ferry_gallocr * ga2 = NULL;
    ferry_tensor * t;
    CHECK_OK(ferry_gallocr_new(ferry_backend_default_buffer_type(dummy), &ga2));
    CHECK_OK(ferry_scale(r.ctx, mk(r.ctx, FERRY_TYPE_F32, 8, 1, 1, 1), 2.0f, &t));
    CHECK_OK(ferry_graph_build(r.g, t));
    CHECK_OK(ferry_gallocr_alloc_graph(ga2, r.g));
    const ferry_status st = ferry_backend_graph_compute(cpu, r.g);
    const ferry_status st_dummy = ferry_backend_graph_compute(dummy, r.g); /* a dry run: nothing done */
    CHECK(ferry_backend_supports_op(dummy, c));
    ferry_gallocr_free(ga2);
    const ferry_status st_freed = ferry_backend_graph_compute(dummy, r.g);
    ferry_backend_free(dummy);
    rig_free(&r);
    CHECK(st == FERRY_ERR_UNSUPPORTED);
    CHECK(st_dummy == FERRY_OK);
    CHECK(st_freed == FERRY_ERR_FREED);
}

static const check_test tests[] = {
    {"nodes_follow_their_sources_and_cycles_are_refused", test_nodes_follow_their_sources_and_cycles_are_refused},
    {"a_200000_node_chain_builds_without_recursion", test_a_200000_node_chain_builds_without_recursion},
    {"ops_shape_their_results_or_refuse_the_operands", test_ops_shape_their_results_or_refuse_the_operands},
    {"result_sizes_refused", test_result_sizes_refused},
    {"small_graph_computes_its_numbers_on_the_cpu", test_small_graph_computes_its_numbers_on_the_cpu},
    {"real_memory_dummy_computes_the_cpus_numbers", test_real_memory_dummy_computes_the_cpus_numbers},
    {"kernels_on_strided_views_match_index_arithmetic", test_kernels_on_strided_views_match_index_arithmetic},
    {"compute_refuses_unsupported_ops_and_memory", test_compute_refuses_unsupported_ops_and_memory},
    {"backends_refuse_what_they_cannot_compute", test_backends_refuse_what_they_cannot_compute},
};

CHECK_MAIN(tests)
