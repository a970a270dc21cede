/* Core: types, tensor layout, buffers, backends, plain and 2-D transfers, counters, errors. */
#include "check.h"

#include <stdint.h>

static size_t row(ferry_type type, int64_t n) {
    size_t r = 0;
    ferry_row_size(type, n, &r);
    return r;
}

static void test_type_sizes(void) {
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

static void test_nbytes_contiguous(void) {
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
static void test_nbytes_k_window(void) {
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

static void test_views_permute_reshape(void) {
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

/* A byte pattern with a long period, so a row from the wrong place is seen. */
static uint8_t pattern(size_t i) { return (uint8_t) ((i * 2654435761u) >> 13); }

/* 2-D set then get on a backend: rows land at offset + i*stride_tensor; nothing else changes. */
static void round_trip_2d(ferry_backend * backend, bool expect_native_2d) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    const int64_t ne[1] = {4096};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &t)); /* 16384 bytes */
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(backend, ferry_tensor_nbytes(t), &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    const size_t nbytes = ferry_tensor_nbytes(t);
    uint8_t * sentinel = malloc(nbytes), * src = malloc(nbytes), * back = malloc(nbytes);
    memset(sentinel, 0xA5, nbytes);
    for (size_t i = 0; i < nbytes; i++) {
        src[i] = pattern(i);
    }
    CHECK_OK(ferry_tensor_set(t, sentinel, 0, nbytes));
    ferry_buffer_reset_stats(buf);
    ferry_backend_reset_stats(backend);

    const size_t offset = 100, size = 300, n = 7, stride_t = 1000, stride_d = 512;
    CHECK_OK(ferry_backend_tensor_set_2d_async(backend, t, src, offset, size, n, stride_t, stride_d));
    CHECK_OK(ferry_backend_synchronize(backend));
    CHECK_OK(ferry_tensor_get(t, back, 0, nbytes));
    for (size_t b = 0; b < nbytes; b++) {
        const bool in_row = b >= offset && (b - offset) % stride_t < size && (b - offset) / stride_t < n;
        const uint8_t want = in_row ? src[((b - offset) / stride_t) * stride_d + (b - offset) % stride_t] : 0xA5;
        CHECK_EQ_U(back[b], want);
    }
    ferry_stats bs, ks;
    CHECK_OK(ferry_buffer_get_stats(buf, &bs));
    CHECK_OK(ferry_backend_get_stats(backend, &ks));
    CHECK_EQ_U(bs.bytes[FERRY_XFER_SET_2D], size * n);
    CHECK_EQ_U(bs.calls[FERRY_XFER_SET_2D], 1);
    CHECK_EQ_U(ks.bytes[FERRY_XFER_SET_2D], size * n);
    CHECK_EQ_U(bs.impl_calls[FERRY_XFER_SET_2D], expect_native_2d ? 1 : n);
    CHECK_EQ_U(bs.calls[FERRY_XFER_SET], 0); /* the fallback's plain sets are not counted twice */
    CHECK_EQ_U(bs.bytes[FERRY_XFER_GET], nbytes);

    uint8_t * rows = calloc(n, stride_d);
    CHECK_OK(ferry_backend_tensor_get_2d_async(backend, t, rows, offset, size, n, stride_t, stride_d));
    CHECK_OK(ferry_backend_synchronize(backend));
    for (size_t i = 0; i < n; i++) {
        CHECK(memcmp(rows + i * stride_d, src + i * stride_d, size) == 0);
        for (size_t g = size; g < stride_d; g++) {
            CHECK_EQ_U(rows[i * stride_d + g], 0); /* get_2d leaves the data's gaps alone */
        }
    }
    CHECK_OK(ferry_backend_get_stats(backend, &ks));
    CHECK_EQ_U(ks.bytes[FERRY_XFER_GET_2D], size * n);
    CHECK_EQ_U(ks.impl_calls[FERRY_XFER_GET_2D], expect_native_2d ? 1 : n);

    /* n_copies <= 1 is one plain transfer */
    CHECK_OK(ferry_backend_tensor_set_2d_async(backend, t, src, 0, 64, 1, 0, 0));
    CHECK_OK(ferry_tensor_get(t, back, 0, 64));
    CHECK(memcmp(back, src, 64) == 0);

    free(rows);
    free(sentinel);
    free(src);
    free(back);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
}

static void test_round_trip_2d_cpu(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK(ferry_backend_has_2d(cpu));
    round_trip_2d(cpu, true);
    ferry_backend_free(cpu);
}

static void test_round_trip_2d_dummy_real(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true;
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(&p, &dummy));
    CHECK(!ferry_buffer_type_is_host(ferry_backend_default_buffer_type(dummy)));
    round_trip_2d(dummy, true);
    ferry_backend_free(dummy);
}

/* A backend without a 2-D implementation: the generic loop of plain sets, same result. */
static void test_round_trip_2d_fallback(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true;
    p.has_2d = false;
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(&p, &dummy));
    CHECK(!ferry_backend_has_2d(dummy));
    round_trip_2d(dummy, false);
    ferry_backend_free(dummy);
}

/* Blocking 2-D transfers through the buffer, and plain set/get counters. */
static void test_buffer_transfers_and_counters(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    const int64_t ne[2] = {256, 4};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 2, ne, &t)); /* 2048 bytes */
    ferry_buffer * buf;
    CHECK_OK(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), 4096, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 1024));
    CHECK(t->data == (char *) ferry_buffer_base(buf) + 1024);
    CHECK_OK(ferry_buffer_clear(buf, 0));
    uint8_t data[2048], back[2048];
    for (size_t i = 0; i < sizeof(data); i++) {
        data[i] = pattern(i);
    }
    CHECK_OK(ferry_tensor_set(t, data, 0, 1000));
    CHECK_OK(ferry_tensor_set(t, data + 1000, 1000, 1048));
    CHECK_OK(ferry_tensor_get(t, back, 0, 2048));
    CHECK(memcmp(data, back, 2048) == 0);
    CHECK_OK(ferry_tensor_memset(t, 7, 10, 5));
    CHECK_OK(ferry_tensor_get(t, back, 0, 2048));
    CHECK(back[9] == data[9] && back[10] == 7 && back[14] == 7 && back[15] == data[15]);
    CHECK_OK(ferry_tensor_set_2d(t, data, 0, 16, 4, 512, 16));
    CHECK_OK(ferry_tensor_get_2d(t, back, 0, 16, 4, 512, 16));
    CHECK(memcmp(data, back, 64) == 0);
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(buf, &s));
    CHECK_EQ_U(s.calls[FERRY_XFER_SET], 2);
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET], 2048);
    CHECK_EQ_U(s.calls[FERRY_XFER_GET], 2);
    CHECK_EQ_U(s.bytes[FERRY_XFER_GET], 4096);
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET_2D], 64);
    CHECK_EQ_U(s.bytes[FERRY_XFER_GET_2D], 64);
    CHECK_EQ_U(s.bytes[FERRY_XFER_MEMSET], 4096 + 5);
    ferry_buffer_reset_stats(buf);
    CHECK_OK(ferry_buffer_get_stats(buf, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET], 0);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
}

static void test_tensor_copy(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_backend *cpu, *dummy;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&p, &dummy));
    ferry_tensor *a, *b, *c, *wrong;
    const int64_t ne[2] = {64, 8};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &a));
    CHECK_OK(ferry_tensor_dup_layout(ctx, a, &b));
    CHECK_OK(ferry_tensor_dup_layout(ctx, a, &c));
    const int64_t ne_w[2] = {64, 9};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne_w, &wrong));
    ferry_buffer *ba, *bb, *bc, *bw;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 2048, &ba));
    CHECK_OK(ferry_backend_alloc_buffer(dummy, 2048, &bb));
    CHECK_OK(ferry_backend_alloc_buffer(dummy, 2048, &bc));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 4096, &bw));
    CHECK_OK(ferry_buffer_place_tensor(ba, a, 0));
    CHECK_OK(ferry_buffer_place_tensor(bb, b, 0));
    CHECK_OK(ferry_buffer_place_tensor(bc, c, 0));
    CHECK_OK(ferry_buffer_place_tensor(bw, wrong, 0));
    uint8_t data[2048], back[2048];
    for (size_t i = 0; i < sizeof(data); i++) {
        data[i] = pattern(i + 5);
    }
    CHECK_OK(ferry_tensor_set(a, data, 0, 2048));
    CHECK_OK(ferry_tensor_copy(a, b));       /* host source: a set into the dummy */
    CHECK_OK(ferry_tensor_copy(b, c));       /* neither host: staged */
    CHECK_OK(ferry_tensor_memset(a, 0, 0, 2048));
    CHECK_OK(ferry_tensor_copy(c, a));       /* host destination: a get */
    CHECK_OK(ferry_tensor_get(a, back, 0, 2048));
    CHECK(memcmp(data, back, 2048) == 0);
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(bb, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET], 2048);
    CHECK_EQ_U(s.bytes[FERRY_XFER_GET], 2048);
    CHECK_FAILS(ferry_tensor_copy(a, wrong), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_backend_tensor_copy_async(dummy, cpu, c, a));
    ferry_buffer_free(ba);
    ferry_buffer_free(bb);
    ferry_buffer_free(bc);
    ferry_buffer_free(bw);
    ferry_backend_free(cpu);
    ferry_backend_free(dummy);
    ferry_context_free(ctx);
}

/* Synthetic addresses: aligned bases, max size enforced, transfers counted not done. */
static void test_dummy_synthetic(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.alignment = 4096;
    p.max_buffer_size = 1 << 20;
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(&p, &dummy));
    ferry_buffer_type * buft = ferry_backend_default_buffer_type(dummy);
    CHECK_EQ_U(ferry_buffer_type_alignment(buft), 4096);
    CHECK_EQ_U(ferry_buffer_type_max_size(buft), 1 << 20);
    ferry_buffer *a, *b, *big;
    CHECK_OK(ferry_buffer_type_alloc_buffer(buft, 1000, &a));
    CHECK_OK(ferry_buffer_type_alloc_buffer(buft, 1 << 20, &b));
    CHECK((uintptr_t) ferry_buffer_base(a) % 4096 == 0);
    CHECK((uintptr_t) ferry_buffer_base(b) % 4096 == 0);
    CHECK(ferry_buffer_base(a) != ferry_buffer_base(b));
    CHECK_FAILS(ferry_buffer_type_alloc_buffer(buft, (1 << 20) + 1, &big), FERRY_ERR_OUT_OF_MEMORY);

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    const int64_t ne[1] = {100};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    CHECK_FAILS(ferry_buffer_place_tensor(b, t, 100), FERRY_ERR_INVALID_ARG); /* misaligned */
    CHECK_OK(ferry_buffer_place_tensor(b, t, 4096));
    CHECK(t->data == (char *) ferry_buffer_base(b) + 4096);
    uint8_t data[400] = {0};
    CHECK_OK(ferry_tensor_set(t, data, 0, 400));
    CHECK_OK(ferry_backend_tensor_set_2d_async(dummy, t, data, 0, 40, 10, 40, 40));
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(b, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET], 400);
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET_2D], 400);
    CHECK_FAILS(ferry_tensor_set(t, data, 1, 400), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_dummy_backend_new(&(ferry_dummy_params) {.alignment = 3}, &dummy), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(a);
    ferry_buffer_free(b);
    ferry_backend_free(dummy);
    ferry_context_free(ctx);
}

static void test_bad_transfers(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *unalloc, *view;
    const int64_t ne[1] = {256};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &unalloc));
    const int64_t ne_v[1] = {16};
    CHECK_OK(ferry_tensor_view(ctx, t, 1, ne_v, NULL, 64, &view));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 1024, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    uint8_t data[2048] = {0};
    CHECK_FAILS(ferry_tensor_set(unalloc, data, 0, 4), FERRY_ERR_NOT_ALLOCATED);
    CHECK_FAILS(ferry_tensor_set(t, data, 1000, 25), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_tensor_get(t, data, SIZE_MAX - 2, 8), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_set(t, NULL, 0, 4), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_set(view, data, 0, 65), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_backend_tensor_set_2d_async(cpu, t, data, 0, 100, 11, 100, 100), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_backend_tensor_set_2d_async(cpu, t, data, 0, 100, SIZE_MAX / 4, 100, 100),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_backend_tensor_set_2d_async(cpu, t, data, 0, 100, 2, 50, 100), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_tensor_get_2d(t, data, 0, 100, 2, 100, 50), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_set(view, data, 0, 64));

    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dummy));
    CHECK_FAILS(ferry_backend_tensor_set_async(dummy, t, data, 0, 4), FERRY_ERR_UNSUPPORTED);

    /* a freed buffer: its tensors and their views are refused */
    ferry_buffer_free(buf);
    CHECK_FAILS(ferry_tensor_set(t, data, 0, 4), FERRY_ERR_FREED);
    CHECK_FAILS(ferry_tensor_get(view, data, 0, 4), FERRY_ERR_FREED);
    CHECK_FAILS(ferry_tensor_check_allocated(view), FERRY_ERR_FREED);
    ferry_backend_free(dummy);
    ferry_backend_free(cpu);
    ferry_context_free(ctx);
}

static void test_f16_conversions(void) {
    const float values[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        extern float ferry_f16_to_f32(uint16_t);
        extern uint16_t ferry_f32_to_f16(float);
        CHECK(ferry_f16_to_f32(ferry_f32_to_f16(values[i])) == values[i]);
    }
}


/* ferry_contiguous_strides gives the strides ferry_tensor_new gives, and a stride past
 * size_t as SIZE_MAX. */
static void test_contiguous_strides(void) {
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
static void test_layout_nbytes(void) {
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

/* ferry_tensor_check_transfer refuses what the transfers refuse, with the same status,
 * and its message names the caller's operation. */
static void test_check_transfer(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *unalloc;
    const int64_t ne[1] = {256};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &unalloc));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 1024, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    static uint8_t data[1 << 16];
    const size_t offsets[] = {0, 24, 1000, 1024, SIZE_MAX - 2};
    const size_t sizes[] = {0, 4, 25, 100, 1024};
    const size_t counts[] = {0, 1, 2, 11};
    const size_t strides[] = {0, 50, 100};
    int refused = 0;
    for (size_t a = 0; a < 5; a++) {
        for (size_t b = 0; b < 5; b++) {
            for (size_t c = 0; c < 4; c++) {
                for (size_t d = 0; d < 3; d++) {
                    for (size_t e = 0; e < 3; e++) {
                        const size_t off = offsets[a], size = sizes[b], n = counts[c];
                        const size_t st = strides[d], sd = strides[e] + size;
                        const ferry_status want = ferry_tensor_get_2d(t, data, off, size, n, st, sd);
                        const ferry_status got = ferry_tensor_check_transfer(t, off, size, n, st, sd, "probe");
                        CHECK_EQ_U(got, want);
                        refused += got != FERRY_OK;
                    }
                }
            }
        }
    }
    CHECK(refused > 100);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 0, 100, 2, 50, 100, "probe"), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 0, 100, 2, 100, 50, "probe"), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 1000, 25, 1, 0, 0, "probe"), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strncmp(ferry_last_error(), "probe: 25 bytes at offset 1000", 30) == 0);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 0, 100, 11, 100, 100, NULL), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strncmp(ferry_last_error(), "tensor_check_transfer: 11 rows", 30) == 0);
    CHECK_FAILS(ferry_tensor_check_transfer(t, SIZE_MAX - 2, 8, 1, 0, 0, "probe"), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_check_transfer(unalloc, 0, 4, 1, 0, 0, "probe"), FERRY_ERR_NOT_ALLOCATED);
    CHECK_FAILS(ferry_tensor_check_transfer(NULL, 0, 4, 1, 0, 0, "probe"), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(buf);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 0, 4, 1, 0, 0, "probe"), FERRY_ERR_FREED);
    ferry_backend_free(cpu);
    ferry_context_free(ctx);
    /* the data side of a 2-D transfer: nothing when nothing moves, else first row to last */
    size_t extent = 1;
    CHECK(ferry_rows_extent(0, 5, 100, &extent) && extent == 0);
    CHECK(ferry_rows_extent(4, 0, 100, &extent) && extent == 0);
    CHECK(ferry_rows_extent(4, 3, 100, &extent) && extent == 204);
    CHECK(!ferry_rows_extent(4, 3, SIZE_MAX / 2, &extent) && !ferry_rows_extent(4, 3, 100, NULL));
}

/* ferry_kv_cache_params gives back the params the cache was made with. */
static void test_kv_cache_params(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_F16, .head_dim = 64, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 3, .n_layer = 2, .v_trans = true};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
    ferry_kv_params got;
    memset(&got, 0xff, sizeof(got));
    CHECK_OK(ferry_kv_cache_params(kv, &got));
    CHECK(got.type_k == p.type_k && got.type_v == p.type_v);
    CHECK(got.head_dim == p.head_dim && got.n_head_kv == p.n_head_kv);
    CHECK(got.n_ctx == p.n_ctx && got.n_stream == p.n_stream && got.n_layer == p.n_layer);
    CHECK(got.v_trans == p.v_trans);
    CHECK_FAILS(ferry_kv_cache_params(kv, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_cache_params(NULL, &got), FERRY_ERR_INVALID_ARG);
    /* the layout a window views each layer with, and where cells lie: as the windows have them */
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *v;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 1, 5, 1, 2, &k, &v));
    int64_t ne[4];
    size_t nb[4], offset;
    CHECK_OK(ferry_kv_cache_window_layout(kv, false, 5, 1, 2, ne, nb, &offset));
    CHECK(ne[0] == 64 && ne[1] == 2 && ne[2] == 5 && ne[3] == 2 && offset == k->view_offs);
    CHECK(nb[0] == 34 && nb[1] == 68 && nb[2] == 136 && nb[3] == 136 * 32);
    CHECK(k->nb[0] == nb[0] && k->nb[1] == nb[2] && k->nb[2] == nb[1] && k->nb[3] == nb[3]);
    CHECK_OK(ferry_kv_cache_window_layout(kv, true, 5, 1, 2, ne, nb, &offset));
    CHECK(ne[0] == 5 && ne[1] == 2 && ne[2] == 64 && ne[3] == 2 && offset == v->view_offs);
    CHECK(nb[0] == 2 && nb[1] == 2 * 32 * 64 && nb[2] == 2 * 32 && nb[3] == 2 * 32 * 128);
    CHECK(v->nb[0] == nb[0] && v->nb[1] == nb[2] && v->nb[2] == nb[1] && v->nb[3] == nb[3]);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, true, 33, 0, 0, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, true, 1, 2, 3, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_kv_cache_cell_offset(kv, false, 2, 3, &offset));
    CHECK_EQ_U(offset, (2 * 32 + 3) * 136);
    CHECK_OK(ferry_kv_cache_cell_offset(kv, true, 2, 32, &offset)); /* a stream's end */
    CHECK_EQ_U(offset, (2 * 32 * 128 + 32) * 2);
    CHECK_FAILS(ferry_kv_cache_cell_offset(kv, true, 3, 0, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_cell_offset(kv, false, 0, 33, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
}

static const check_test tests[] = {
    {"type_sizes", test_type_sizes},
    {"nbytes_contiguous", test_nbytes_contiguous},
    {"nbytes_k_window", test_nbytes_k_window},
    {"views_permute_reshape", test_views_permute_reshape},
    {"round_trip_2d_cpu", test_round_trip_2d_cpu},
    {"round_trip_2d_dummy_real", test_round_trip_2d_dummy_real},
    {"round_trip_2d_fallback", test_round_trip_2d_fallback},
    {"buffer_transfers_and_counters", test_buffer_transfers_and_counters},
    {"tensor_copy", test_tensor_copy},
    {"dummy_synthetic", test_dummy_synthetic},
    {"bad_transfers", test_bad_transfers},
    {"f16_conversions", test_f16_conversions},
    {"contiguous_strides", test_contiguous_strides},
    {"layout_nbytes", test_layout_nbytes},
    {"check_transfer", test_check_transfer},
    {"kv_cache_params", test_kv_cache_params},
};

CHECK_MAIN(tests)
