/* Regressions found by fuzzing the Python API (tests/python/test_fuzz_api.py): bad or
 * unusual input must fail with a status, never crash or compute the wrong thing. */
#include "check.h"

#include <stdint.h>

/* A dummy backend with synthetic addresses that claims host memory (the dry runs' KV cache):
 * its addresses must never be handed to memory that would read or write them. Copies out
 * of it into real memory give zeros, CPU kernels refuse it, and the copy path stays away. */
static void test_synthetic_host_never_dereferenced(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.is_host = true;
    ferry_backend *host, *cpu, *standin;
    CHECK_OK(ferry_dummy_backend_new(&p, &host));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_standin_backend_new(&standin));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {16, 4};
    ferry_tensor *s, *c, *d, *out;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &s));
    CHECK_OK(ferry_tensor_dup_layout(ctx, s, &c));
    CHECK_OK(ferry_tensor_dup_layout(ctx, s, &d));
    ferry_buffer *bs, *bc, *bd;
    CHECK_OK(ferry_backend_alloc_buffer(host, 256, &bs));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 256, &bc));
    CHECK_OK(ferry_backend_alloc_buffer(standin, 256, &bd));
    CHECK_OK(ferry_buffer_place_tensor(bs, s, 0));
    CHECK_OK(ferry_buffer_place_tensor(bc, c, 0));
    CHECK_OK(ferry_buffer_place_tensor(bd, d, 0));
    uint8_t back[256];

    /* flat copies out of synthetic memory: zeros, whichever side is host */
    CHECK_OK(ferry_buffer_clear(bc, 0xA5));
    CHECK_OK(ferry_tensor_copy(s, c));
    CHECK_OK(ferry_tensor_get(c, back, 0, 256));
    for (int i = 0; i < 256; i++) CHECK_EQ_U(back[i], 0);
    CHECK_OK(ferry_buffer_clear(bd, 0xA5));
    CHECK_OK(ferry_tensor_copy(s, d));
    CHECK_OK(ferry_tensor_get(d, back, 0, 256));
    for (int i = 0; i < 256; i++) CHECK_EQ_U(back[i], 0);
    /* and into it: counted, nothing written anywhere */
    CHECK_OK(ferry_tensor_copy(c, s));
    CHECK_OK(ferry_backend_tensor_copy_async(standin, host, d, s));

    /* the copy path under every policy, a strided view as the source */
    ferry_tensor *v, *vd;
    const int64_t ne_v[2] = {8, 4};
    const size_t nb_v[2] = {4, 64};
    CHECK_OK(ferry_tensor_view(ctx, s, 2, ne_v, nb_v, 0, &v));
    CHECK_OK(ferry_tensor_dup_layout(ctx, v, &vd));
    ferry_buffer * bvd;
    CHECK_OK(ferry_backend_alloc_buffer(standin, 256, &bvd));
    CHECK_OK(ferry_buffer_place_tensor(bvd, vd, 0));
    for (int pol = 0; pol < FERRY_COPY_POLICY_COUNT; pol++) {
        ferry_copy_stats st;
        CHECK_OK(ferry_buffer_clear(bvd, 0xA5));
        CHECK_OK(ferry_copy_input(standin, (ferry_copy_policy) pol, v, vd, &st));
        CHECK_OK(ferry_tensor_get(vd, back, 0, ferry_tensor_nbytes(vd)));
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < 32; i++) CHECK_EQ_U(back[r * 64 + i], 0);
    }
    ferry_tensor * sc;
    CHECK_OK(ferry_tensor_compact_layout(ctx, v, &sc));
    ferry_buffer * bsc;
    CHECK_OK(ferry_backend_alloc_buffer(standin, 256, &bsc));
    CHECK_OK(ferry_buffer_place_tensor(bsc, sc, 0));
    CHECK(ferry_tensor_is_compact_of(sc, v));
    CHECK_OK(ferry_copy_input(standin, FERRY_COPY_RANGES, v, sc, NULL));

    /* the CPU kernels have nothing to read there */
    CHECK_OK(ferry_dup(ctx, s, &out));
    ferry_buffer * bo;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 256, &bo));
    CHECK_OK(ferry_buffer_place_tensor(bo, out, 0));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, out));
    CHECK_FAILS(ferry_backend_graph_compute(cpu, g), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "synthetic") != NULL);

    ferry_graph_free(g);
    ferry_buffer_free(bo);
    ferry_buffer_free(bsc);
    ferry_buffer_free(bvd);
    ferry_buffer_free(bs);
    ferry_buffer_free(bc);
    ferry_buffer_free(bd);
    ferry_context_free(ctx);
    ferry_backend_free(host);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/* KV parameters whose products overflow are refused: head_dim * n_head_kv past INT64_MAX
 * (a signed overflow, which would give a cache with empty rows), and layers whose total
 * size passes SIZE_MAX though each layer fits. */
static void test_kv_params_overflow(void) {
    ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = (int64_t) 1 << 40,
                         .n_head_kv = (int64_t) 1 << 40, .n_ctx = 1, .n_stream = 1, .n_layer = 1};
    ferry_kv_cache * kv = NULL;
    CHECK_FAILS(ferry_kv_cache_new(&p, NULL, &kv), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "n_head_kv") != NULL);
    p.head_dim = (int64_t) 1 << 32;
    p.n_head_kv = (int64_t) 1 << 31; /* n_embd 2^63: one more than INT64_MAX */
    CHECK_FAILS(ferry_kv_cache_new(&p, NULL, &kv), FERRY_ERR_OUT_OF_BOUNDS);
    /* each layer fits, all of them do not */
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dummy));
    p.head_dim = 1 << 20;
    p.n_head_kv = 1 << 19;
    p.n_ctx = (int64_t) 1 << 20; /* K and V of 2^61 bytes each */
    p.n_layer = 4;
    CHECK_FAILS(ferry_kv_cache_new(&p, ferry_backend_default_buffer_type(dummy), &kv), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "layers") != NULL);
    p.n_layer = 1;
    CHECK_OK(ferry_kv_cache_new(&p, ferry_backend_default_buffer_type(dummy), &kv));
    CHECK_EQ_U(ferry_buffer_size(ferry_kv_cache_buffer(kv)), (size_t) 1 << 62);
    ferry_kv_cache_free(kv);
    ferry_backend_free(dummy);
}

/* Block types hold more values than bytes: a q4_0 shape within INT64_MAX bytes can have
 * 2^63 values, which ferry_tensor_nelements cannot count (a signed overflow to a negative
 * count), so every way to make such a shape is refused. */
static void test_element_count_overflow(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *a, *r;
    const int64_t ne[2] = {(int64_t) 1 << 32, (int64_t) 1 << 31}; /* 2^63 values in 18 * 2^58 bytes */
    CHECK_FAILS(ferry_tensor_new(ctx, FERRY_TYPE_Q4_0, 2, ne, &t), FERRY_ERR_OUT_OF_BOUNDS);
    const int64_t half[2] = {(int64_t) 1 << 32, (int64_t) 1 << 30};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_Q4_0, 2, half, &a));
    CHECK(ferry_tensor_nelements(a) == (int64_t) 1 << 62);
    CHECK_FAILS(ferry_tensor_reshape(ctx, a, 2, ne, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_tensor_view(ctx, a, 2, ne, NULL, 0, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_pad(ctx, a, 0, 1 << 30, 0, 0, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_concat(ctx, a, a, 1, &r), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_pad(ctx, a, 0, 1, 0, 0, &r));
    CHECK(ferry_tensor_nelements(r) > 0);
    ferry_context_free(ctx);
}

/* A copy between two views of one host buffer that overlap (same layout, a few bytes apart):
 * memcpy with overlapping ranges is undefined (AddressSanitizer reports memcpy-param-overlap);
 * the result must be what the source held before the copy. */
static void test_overlapping_host_copy(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *t, *a, *b;
    const int64_t ne[1] = {1040}, ne_v[1] = {1024};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    CHECK_OK(ferry_tensor_view(ctx, t, 1, ne_v, NULL, 0, &a));
    CHECK_OK(ferry_tensor_view(ctx, t, 1, ne_v, NULL, 16, &b));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, ferry_tensor_nbytes(t), &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    static float v[1040], back[1040];
    for (int i = 0; i < 1040; i++) v[i] = (float) i;
    CHECK_OK(ferry_tensor_set(t, v, 0, sizeof(v)));
    CHECK_OK(ferry_tensor_copy(a, b)); /* forward: t[4 + i] = old t[i] */
    CHECK_OK(ferry_tensor_get(t, back, 0, sizeof(back)));
    for (int i = 0; i < 1024; i++) CHECK(back[4 + i] == (float) i);
    CHECK_OK(ferry_tensor_set(t, v, 0, sizeof(v)));
    CHECK_OK(ferry_tensor_copy(b, a)); /* backward: t[i] = old t[4 + i] */
    CHECK_OK(ferry_tensor_get(t, back, 0, sizeof(back)));
    for (int i = 0; i < 1024; i++) CHECK(back[i] == (float) (4 + i));
    /* the same through a 2-D set from the tensor's own memory */
    CHECK_OK(ferry_tensor_set(t, v, 0, sizeof(v)));
    CHECK_OK(ferry_tensor_set_2d(t, (const char *) t->data, 16, 2048, 2, 2048, 2048));
    CHECK_OK(ferry_tensor_get(t, back, 0, sizeof(back)));
    for (int i = 0; i < 512; i++) CHECK(back[4 + i] == (float) i);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(cpu);
}

/* Synthetic addresses are handed out upwards and never reused. A few buffers of 2^62 bytes
 * reach the top of the address space, and a buffer past it would give a tensor placed in it
 * a data pointer that overflows (undefined; UBSan stops there). Every buffer must lie whole
 * below the top. */
static void test_synthetic_addresses_never_wrap(void) {
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dummy));
    ferry_buffer_type * buft = ferry_backend_default_buffer_type(dummy);
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const size_t size = (size_t) 1 << 62;
    ferry_buffer * bufs[8];
    for (int i = 0; i < 8; i++) {
        CHECK_OK(ferry_buffer_type_alloc_buffer(buft, size, &bufs[i]));
        const uintptr_t base = (uintptr_t) ferry_buffer_base(bufs[i]);
        CHECK(base != 0 && base % 64 == 0);
        CHECK(base <= UINTPTR_MAX - size); /* the whole buffer lies below the top */
        ferry_tensor * t;
        const int64_t ne[1] = {16};
        CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
        CHECK_OK(ferry_buffer_place_tensor(bufs[i], t, size - 64));
        CHECK((uintptr_t) t->data == base + size - 64);
    }
    for (int i = 0; i < 8; i++) ferry_buffer_free(bufs[i]);
    ferry_context_free(ctx);
    ferry_backend_free(dummy);
}

/* Shapes at the edge of int64: nbytes of a block-type row of 2^62 values divides before it
 * multiplies (ne[0] times the type size first would wrap: 2^58 bytes instead of 34 * 2^57),
 * and an empty shape whose other dimensions multiply past INT64_MAX is refused, as its
 * nrows (and nelements, multiplied left to right) would overflow. */
static void test_huge_shapes_metadata(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    const int64_t row[1] = {(int64_t) 1 << 62};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_Q8_0, 1, row, &t));
    CHECK_EQ_U(ferry_tensor_nbytes(t), (size_t) 34 << 57);
    CHECK_EQ_U(t->nb[1], (size_t) 34 << 57);
    const int64_t empty_rows[3] = {0, (int64_t) 1 << 31, (int64_t) 1 << 32};
    CHECK_FAILS(ferry_tensor_new(ctx, FERRY_TYPE_F32, 3, empty_rows, &t), FERRY_ERR_OUT_OF_BOUNDS);
    const int64_t empty_last[3] = {(int64_t) 1 << 32, (int64_t) 1 << 32, 0};
    CHECK_FAILS(ferry_tensor_new(ctx, FERRY_TYPE_F32, 3, empty_last, &t), FERRY_ERR_OUT_OF_BOUNDS);
    const int64_t empty_ok[3] = {0, (int64_t) 1 << 31, (int64_t) 1 << 31};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 3, empty_ok, &t));
    CHECK(ferry_tensor_nrows(t) == (int64_t) 1 << 62 && ferry_tensor_nelements(t) == 0);
    ferry_tensor * p;
    CHECK_FAILS(ferry_pad(ctx, t, 0, INT32_MAX, 1 << 30, 0, &p), FERRY_ERR_OUT_OF_BOUNDS); /* rows past INT64_MAX */
    ferry_context_free(ctx);
}

/* An input copy from device memory into host memory goes by a get into the host side, which
 * the destination buffer never sees (a split on the CPU reading a node computed on the
 * device): copy_input counts those bytes and calls from the source's reads. */
static void test_copy_input_counts_gets_into_host(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true;
    ferry_backend *dev, *cpu;
    CHECK_OK(ferry_dummy_backend_new(&p, &dev));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {16, 512};
    ferry_tensor *root, *src, *dst;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &root));
    const int64_t ne_v[2] = {4, 8};
    const size_t nb_v[2] = {4, 4096}; /* 16 of every 4096 bytes: the plan (it pays) reads 128 */
    CHECK_OK(ferry_tensor_view(ctx, root, 2, ne_v, nb_v, 0, &src));
    CHECK_OK(ferry_tensor_dup_layout(ctx, src, &dst));
    ferry_buffer *bs, *bd;
    CHECK_OK(ferry_backend_alloc_buffer(dev, 32768, &bs));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 32768, &bd));
    CHECK_OK(ferry_buffer_place_tensor(bs, root, 0));
    CHECK_OK(ferry_buffer_place_tensor(bd, dst, 0));
    CHECK_OK(ferry_buffer_clear(bs, 7));
    ferry_copy_stats st;
    CHECK_OK(ferry_copy_input(cpu, FERRY_COPY_FLAT, src, dst, &st));
    CHECK_EQ_U(st.bytes_copied, ferry_tensor_nbytes(src));
    CHECK_EQ_U(st.copy_calls, 1);
    CHECK_OK(ferry_copy_input(cpu, FERRY_COPY_PLAN, src, dst, &st));
    CHECK(st.path == FERRY_COPY_PLAN);
    CHECK_EQ_U(st.bytes_copied, 128);
    CHECK_EQ_U(st.bytes_copied, st.bytes_read);
    CHECK_EQ_U(st.copy_calls, 1);
    CHECK_EQ_U(st.impl_calls, 1);
    /* host to device stays as it was: the set lands in the destination buffer */
    ferry_tensor * back;
    CHECK_OK(ferry_tensor_dup_layout(ctx, src, &back));
    ferry_buffer * bb;
    CHECK_OK(ferry_backend_alloc_buffer(dev, 32768, &bb));
    CHECK_OK(ferry_buffer_place_tensor(bb, back, 0));
    CHECK_OK(ferry_copy_input(dev, FERRY_COPY_FLAT, dst, back, &st));
    CHECK_EQ_U(st.bytes_copied, ferry_tensor_nbytes(src));
    CHECK_EQ_U(st.copy_calls, 1);
    ferry_buffer_free(bb);
    ferry_buffer_free(bs);
    ferry_buffer_free(bd);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
    ferry_backend_free(cpu);
}

static const check_test tests[] = {
    {"synthetic_host_never_dereferenced", test_synthetic_host_never_dereferenced},
    {"kv_params_overflow", test_kv_params_overflow},
    {"element_count_overflow", test_element_count_overflow},
    {"overlapping_host_copy", test_overlapping_host_copy},
    {"synthetic_addresses_never_wrap", test_synthetic_addresses_never_wrap},
    {"huge_shapes_metadata", test_huge_shapes_metadata},
    {"copy_input_counts_gets_into_host", test_copy_input_counts_gets_into_host},
};

CHECK_MAIN(tests)
