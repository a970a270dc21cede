/* Types and tensor layout: type names and sizes, row sizes, nbytes of contiguous tensors
 * and of windows, views, permutes and reshapes, the strides a layout gets. */
#include "check.h"

#include <stdint.h>

static size_t row(ferry_type type, int64_t n) {
    size_t r = 0;
    ferry_row_size(type, n, &r);
    return r;
}

static void test_type_sizes_and_rows_are_exact_unknowns_refused(void) {
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_F32), 4);
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_F16), 2);
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_BF16), 2);
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_I32), 4);
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_Q8_0), 34);
    CHECK_EQ_U(ferry_type_size(FERRY_TYPE_Q4_0), 18);
    CHECK_EQ_U(ferry_blck_size(FERRY_TYPE_Q8_0), 32);
    CHECK_EQ_U(ferry_blck_size(FERRY_TYPE_Q4_0), 32);
    CHECK_EQ_U(ferry_blck_size(FERRY_TYPE_F16), 1);
    CHECK_EQ_U(row(FERRY_TYPE_F32, 1024), 4096);
    CHECK_EQ_U(row(FERRY_TYPE_F16, 1024), 2048);
    CHECK_EQ_U(row(FERRY_TYPE_BF16, 1024), 2048);
    CHECK_EQ_U(row(FERRY_TYPE_I32, 3), 12);
    CHECK_EQ_U(row(FERRY_TYPE_Q8_0, 1024), 1088);
    CHECK_EQ_U(row(FERRY_TYPE_Q4_0, 1024), 576);
    size_t r;
    CHECK_FAILS(ferry_row_size(FERRY_TYPE_Q8_0, 33, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_row_size((ferry_type) 99, 32, &r), FERRY_ERR_UNKNOWN_TYPE);
    ferry_type t;
    CHECK_OK(ferry_type_from_name("q4_0", &t));
    CHECK(t == FERRY_TYPE_Q4_0);
    CHECK_FAILS(ferry_type_from_name("q5_k", &t), FERRY_ERR_UNKNOWN_TYPE);
    CHECK(ferry_type_name((ferry_type) 99) == NULL);
}

static void test_contiguous_nbytes_and_strides_are_whole_rows(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const ferry_type types[] = {FERRY_TYPE_F32, FERRY_TYPE_F16, FERRY_TYPE_BF16, FERRY_TYPE_I32, FERRY_TYPE_Q8_0,
                                FERRY_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        ferry_tensor * t;
        const int64_t ne[4] = {64, 3, 5, 2};
        CHECK_OK(ferry_tensor_new(ctx, types[i], 4, ne, &t));
        CHECK(ferry_tensor_is_contiguous(t));
        CHECK_EQ_U(ferry_tensor_nbytes(t), row(types[i], 64) * 30);
        CHECK_EQ_U(t->nb[1], row(types[i], 64));
        CHECK_EQ_U(t->nb[3], row(types[i], 64) * 15);
    }
    ferry_context_free(ctx);
}

/* The permuted K window: nbytes is the span ((ns-1)*kv_size + n_kv) cells. */
static void test_k_window_nbytes_is_its_span_of_cells(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t head_dim = 128, n_head_kv = 8, n_embd = head_dim * n_head_kv, n_kv = 2176;
    const int64_t n_ctx = 32768;
    const ferry_type types[] = {FERRY_TYPE_F16, FERRY_TYPE_Q8_0, FERRY_TYPE_F32, FERRY_TYPE_Q4_0};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (int64_t ns = 1; ns <= 8; ns *= 2) {
            const int64_t kv_size = n_ctx / ns;
            const ferry_type type = types[ti];
            ferry_tensor * cache;
            const int64_t ne_cache[3] = {n_embd, kv_size, ns};
            CHECK_OK(ferry_tensor_new(ctx, type, 3, ne_cache, &cache));
            const int64_t ne[4] = {head_dim, n_head_kv, n_kv, ns};
            const size_t nb[4] = {ferry_type_size(type), row(type, head_dim), row(type, n_embd), row(type, n_embd) * (size_t) kv_size};
            ferry_tensor *k, *kp;
            CHECK_OK(ferry_tensor_view(ctx, cache, 4, ne, nb, 0, &k));
            CHECK_OK(ferry_tensor_permute(ctx, k, 0, 2, 1, 3, &kp));
            CHECK_EQ_U(kp->ne[1], n_kv);
            CHECK_EQ_U(kp->ne[2], n_head_kv);
            CHECK_EQ_U(kp->ne[3], ns);
            CHECK_EQ_U(kp->nb[1], row(type, n_embd));
            const size_t cells = (size_t) ((ns - 1) * kv_size + n_kv);
            CHECK_EQ_U(ferry_tensor_nbytes(kp), cells * row(type, n_embd));
            CHECK(ns == 1 || !ferry_tensor_is_contiguous(kp));
        }
    }
    /* Transposed V (flash attention off): a gap after every channel row. */
    const int64_t kv_size = n_ctx;
    ferry_tensor * vcache;
    const int64_t ne_v[3] = {kv_size, n_embd, 1};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 3, ne_v, &vcache));
    const int64_t ne[4] = {n_kv, n_head_kv, head_dim, 1};
    const size_t nb[4] = {2, row(FERRY_TYPE_F16, kv_size * head_dim), row(FERRY_TYPE_F16, kv_size),
                          row(FERRY_TYPE_F16, kv_size * n_embd)};
    ferry_tensor * v;
    CHECK_OK(ferry_tensor_view(ctx, vcache, 4, ne, nb, 0, &v));
    const size_t span = ferry_tensor_nbytes(v), read = (size_t) (n_kv * n_embd) * 2;
    CHECK_EQ_U(span, ((size_t) (n_embd - 1) * kv_size + n_kv) * 2);
    CHECK(span / read == 15);
    ferry_context_free(ctx);
}

static void test_views_keep_their_source_and_never_leave_it(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *v, *vv, *p, *tr, *r, *d;
    const int64_t ne[4] = {8, 4, 3, 2};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne, &t));
    CHECK_OK(ferry_tensor_permute(ctx, t, 2, 0, 1, 3, &p));
    CHECK(p->ne[2] == 8 && p->ne[0] == 4 && p->ne[1] == 3 && p->ne[3] == 2);
    CHECK(p->nb[2] == 4 && p->nb[0] == 32 && p->nb[1] == 128);
    CHECK(p->view_src == t && ferry_tensor_is_view(p));
    CHECK_OK(ferry_tensor_transpose(ctx, t, &tr));
    CHECK(tr->ne[0] == 4 && tr->ne[1] == 8 && tr->nb[0] == 32 && tr->nb[1] == 4);
    CHECK(!ferry_tensor_is_contiguous(tr));
    const int64_t ne_r[2] = {16, 12};
    CHECK_OK(ferry_tensor_reshape(ctx, t, 2, ne_r, &r));
    CHECK(ferry_tensor_is_contiguous(r) && r->nb[1] == 64);
    CHECK_FAILS(ferry_tensor_reshape(ctx, tr, 2, ne_r, &r), FERRY_ERR_LAYOUT);
    const int64_t ne_bad[2] = {16, 13};
    CHECK_FAILS(ferry_tensor_reshape(ctx, t, 2, ne_bad, &r), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_tensor_permute(ctx, t, 0, 0, 1, 2, &p), FERRY_ERR_INVALID_ARG);

    /* a view of a view keeps one source and adds its offsets */
    const int64_t ne_v[2] = {8, 2}, ne_v4[2] = {8, 4};
    const size_t nb_v[2] = {4, 32};
    CHECK_OK(ferry_tensor_view(ctx, t, 2, ne_v4, nb_v, 64, &v));
    CHECK_OK(ferry_tensor_view(ctx, v, 2, ne_v, nb_v, 32, &vv));
    CHECK(vv->view_src == t && vv->view_offs == 96);
    /* views that leave their source */
    CHECK_FAILS(ferry_tensor_view(ctx, t, 2, ne_v, nb_v, 768 - 63, &v), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_tensor_view(ctx, vv, 2, ne_v, nb_v, 768 - 96 - 63, &v), FERRY_ERR_OUT_OF_BOUNDS);
    /* inside the root but past the view it is taken from: still leaves its source */
    const int64_t ne_one[1] = {8};
    CHECK_FAILS(ferry_tensor_view(ctx, vv, 1, ne_one, NULL, 64, &v), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_tensor_view(ctx, vv, 1, ne_one, NULL, 32, &v));
    CHECK(v->view_offs == 128);
    const size_t nb_huge[2] = {4, SIZE_MAX / 2};
    CHECK_FAILS(ferry_tensor_view(ctx, t, 2, ne_v, nb_huge, 0, &v), FERRY_ERR_OUT_OF_BOUNDS);
    const int64_t ne_neg[2] = {8, -1};
    CHECK_FAILS(ferry_tensor_view(ctx, t, 2, ne_neg, nb_v, 0, &v), FERRY_ERR_INVALID_ARG);
    /* nb[0] is the element size, or the view is refused with a message that says so */
    const size_t nb_gap[2] = {8, 32};
    CHECK_FAILS(ferry_tensor_view(ctx, t, 2, ne_v, nb_gap, 0, &v), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "nb[0] is 8 but a f32 element is 4 bytes") != NULL);
    /* the strides a view gets past its n_dims: the next one on, then one value each */
    size_t nb4[4];
    CHECK_OK(ferry_view_strides(FERRY_TYPE_F32, 2, ne_v, nb_v, nb4));
    CHECK(nb4[0] == 4 && nb4[1] == 32 && nb4[2] == 64 && nb4[3] == 64);
    CHECK_OK(ferry_tensor_view(ctx, t, 2, ne_v, nb_v, 0, &v));
    CHECK(memcmp(v->nb, nb4, sizeof(nb4)) == 0);
    const int64_t ne_q[1] = {64};
    CHECK_OK(ferry_view_strides(FERRY_TYPE_Q8_0, 1, ne_q, nb_gap, nb4)); /* nb[0] as given; nb[1] two blocks */
    CHECK(nb4[0] == 8 && nb4[1] == 68 && nb4[2] == 68 && nb4[3] == 68);
    CHECK_FAILS(ferry_view_strides(FERRY_TYPE_F32, 2, ne_neg, nb_v, nb4), FERRY_ERR_INVALID_ARG);
    const size_t nb_far[2] = {4, SIZE_MAX / 2 + 1};
    CHECK_OK(ferry_view_strides(FERRY_TYPE_F32, 2, ne_v, nb_far, nb4));
    CHECK(nb4[2] == SIZE_MAX && nb4[3] == SIZE_MAX); /* past size_t: never stepped */
    CHECK_FAILS(ferry_tensor_new(ctx, (ferry_type) 42, 2, ne_v, &v), FERRY_ERR_UNKNOWN_TYPE);

    CHECK_OK(ferry_tensor_dup_layout(ctx, p, &d));
    CHECK(ferry_tensor_same_layout(d, p) && d->view_src == NULL && d->data == NULL);
    CHECK(!ferry_tensor_same_layout(d, t));
    ferry_context_free(ctx);
}


/* ferry_contiguous_strides gives the strides ferry_tensor_new gives, and a stride past
 * size_t as SIZE_MAX. */
static void test_contiguous_strides_match_tensor_new(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const ferry_type types[] = {FERRY_TYPE_F32, FERRY_TYPE_F16, FERRY_TYPE_Q8_0, FERRY_TYPE_Q4_0};
    const int64_t shapes[][4] = {{64, 3, 5, 2}, {32, 1, 7, 1}, {96, 0, 2, 3}, {64, 4, 1, 9}};
    for (size_t ti = 0; ti < 4; ti++) {
        for (size_t si = 0; si < 4; si++) {
            for (int n_dims = 1; n_dims <= 4; n_dims++) {
                ferry_tensor * t;
                size_t nb[4] = {0};
                CHECK_OK(ferry_tensor_new(ctx, types[ti], n_dims, shapes[si], &t));
                CHECK_OK(ferry_contiguous_strides(types[ti], n_dims, shapes[si], nb));
                for (int d = 0; d < n_dims; d++) {
                    CHECK_EQ_U(nb[d], t->nb[d]);
                }
            }
        }
    }
    size_t nb[4];
    const int64_t f32[3] = {4, 3, 2};
    CHECK_OK(ferry_contiguous_strides(FERRY_TYPE_F32, 3, f32, nb));
    CHECK(nb[0] == 4 && nb[1] == 16 && nb[2] == 48);
    const int64_t q8[2] = {64, 3};
    CHECK_OK(ferry_contiguous_strides(FERRY_TYPE_Q8_0, 2, q8, nb));
    CHECK(nb[0] == 34 && nb[1] == 68);
    /* 2^62 values of 4 B: the row fits, the plane past it does not; after a 0 the stride is 0 */
    const int64_t huge[4] = {(int64_t) 1 << 60, 8, 0, 5};
    CHECK_OK(ferry_contiguous_strides(FERRY_TYPE_F32, 4, huge, nb));
    CHECK_EQ_U(nb[1], (size_t) 1 << 62);
    CHECK_EQ_U(nb[2], SIZE_MAX);
    CHECK_EQ_U(nb[3], 0);
    const int64_t neg[2] = {4, -1}, part[1] = {33};
    CHECK_FAILS(ferry_contiguous_strides(FERRY_TYPE_F32, 2, neg, nb), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_contiguous_strides(FERRY_TYPE_Q8_0, 1, part, nb), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_contiguous_strides((ferry_type) 99, 1, f32, nb), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_contiguous_strides(FERRY_TYPE_F32, 5, f32, nb), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_contiguous_strides(FERRY_TYPE_F32, 1, NULL, nb), FERRY_ERR_INVALID_ARG);
    ferry_context_free(ctx);
}

/* ferry_layout_nbytes is ferry_tensor_nbytes for a bare layout, with overflow refused. */
static void test_layout_nbytes_is_tensor_nbytes_or_refused(void) {
    /* the K window of 4 streams: 8 rows of 64 f16 values, 3 heads, streams 40 rows apart */
    const int64_t ne[4] = {64, 8, 3, 4};
    const size_t nb[4] = {2, 384, 128, 40 * 384};
    const ferry_tensor t = {.type = FERRY_TYPE_F16, .ne = {64, 8, 3, 4}, .nb = {2, 384, 128, 40 * 384}};
    size_t n;
    CHECK_OK(ferry_layout_nbytes(FERRY_TYPE_F16, 4, ne, nb, &n));
    CHECK_EQ_U(n, ferry_tensor_nbytes(&t));
    CHECK_EQ_U(n, 2 + 63 * 2 + 7 * 384 + 2 * 128 + 3 * 40 * 384);
    CHECK_OK(ferry_layout_nbytes(FERRY_TYPE_F16, 2, ne, nb, &n)); /* dims 2 and 3 count 1 */
    CHECK_EQ_U(n, 2 + 63 * 2 + 7 * 384);
    const int64_t q[2] = {64, 3};
    const size_t qnb[2] = {34, 100};
    CHECK_OK(ferry_layout_nbytes(FERRY_TYPE_Q8_0, 2, q, qnb, &n));
    CHECK_EQ_U(n, 2 * 34 + 2 * 100);
    const int64_t empty[2] = {4, 0};
    CHECK_OK(ferry_layout_nbytes(FERRY_TYPE_F32, 2, empty, nb, &n));
    CHECK_EQ_U(n, 0);
    const int64_t two[2] = {4, 3}, neg[2] = {4, -3};
    const size_t wide[2] = {4, SIZE_MAX / 2};
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_F32, 2, two, wide, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_F32, 2, neg, nb, &n), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_layout_nbytes((ferry_type) 99, 2, two, nb, &n), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_F32, 0, two, nb, &n), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_F32, 2, two, nb, NULL), FERRY_ERR_INVALID_ARG);
}

/* Layouts whose span passes size_t are refused, not wrapped: a view at an offset near
 * SIZE_MAX, rows of elements or of blocks too far apart; a view of more than one dimension
 * needs its strides, and an unknown type has none. */
static void test_spans_past_size_t_are_refused_not_wrapped(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *v = NULL;
    const int64_t ne[2] = {8, 4};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &t));
    const int64_t ne_v[1] = {4};
    CHECK_FAILS(ferry_tensor_view(ctx, t, 1, ne_v, NULL, SIZE_MAX - 7, &v), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "reaches past the 128 bytes") != NULL);
    CHECK_FAILS(ferry_tensor_view(ctx, t, 2, ne, NULL, 0, &v), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "NULL strides for 2 dimensions") != NULL);
    CHECK(v == NULL);
    size_t n = 0, nb4[4];
    const size_t nb_f32[1] = {(size_t) 1 << 62}, nb_q8[1] = {(size_t) 1 << 10};
    const int64_t many[1] = {(int64_t) 1 << 62};
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_F32, 1, many, nb_f32, &n), FERRY_ERR_OUT_OF_BOUNDS); /* elements apart */
    CHECK_FAILS(ferry_layout_nbytes(FERRY_TYPE_Q8_0, 1, many, nb_q8, &n), FERRY_ERR_OUT_OF_BOUNDS); /* blocks apart */
    CHECK_EQ_U(n, 0);
    const size_t nb_close[1] = {34};
    CHECK_OK(ferry_layout_nbytes(FERRY_TYPE_Q8_0, 1, many, nb_close, &n)); /* the same blocks packed: 2^57 of them */
    CHECK_EQ_U(n, ((size_t) 1 << 57) * 34);
    CHECK_FAILS(ferry_view_strides((ferry_type) 42, 1, ne_v, nb_close, nb4), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_view_strides(FERRY_TYPE_F32, 1, ne_v, NULL, nb4), FERRY_ERR_INVALID_ARG);
    /* a tensor whose type ferry does not know cannot be copied into a new one */
    const ferry_tensor unknown = {.type = (ferry_type) 42, .ne = {1, 1, 1, 1}, .nb = {4, 4, 4, 4}};
    CHECK_FAILS(ferry_tensor_dup_layout(ctx, &unknown, &v), FERRY_ERR_UNKNOWN_TYPE);
    CHECK(v == NULL);
    ferry_context_free(ctx);
}

static const check_test tests[] = {
    {"type_sizes_and_rows_are_exact_unknowns_refused", test_type_sizes_and_rows_are_exact_unknowns_refused},
    {"contiguous_nbytes_and_strides_are_whole_rows", test_contiguous_nbytes_and_strides_are_whole_rows},
    {"k_window_nbytes_is_its_span_of_cells", test_k_window_nbytes_is_its_span_of_cells},
    {"views_keep_their_source_and_never_leave_it", test_views_keep_their_source_and_never_leave_it},
    {"contiguous_strides_match_tensor_new", test_contiguous_strides_match_tensor_new},
    {"layout_nbytes_is_tensor_nbytes_or_refused", test_layout_nbytes_is_tensor_nbytes_or_refused},
    {"spans_past_size_t_are_refused_not_wrapped", test_spans_past_size_t_are_refused_not_wrapped},
};

CHECK_MAIN(tests)
