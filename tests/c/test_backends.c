/* Backends, buffer types and buffers: the dummy backend's synthetic memory, alignment and
 * sizes; a buffer's usage and where a tensor may be placed in it. */
#include "check.h"

#include <stdint.h>

/* Synthetic addresses: aligned bases, max size enforced, transfers counted not done. */
static void test_synthetic_buffers_align_cap_and_count_not_copy(void) {
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

/* A buffer keeps the usage it is given and refuses one it does not know; a tensor placed
 * past the buffer's end is refused however far past, with no wrap of offset + size, and
 * the tensor stays unplaced. */
static void test_bad_usage_and_placement_past_the_end_refused(void) {
    ferry_buffer * buf;
    CHECK_OK(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), 4096, &buf));
    CHECK_EQ_U(ferry_buffer_get_usage(buf), FERRY_BUFFER_USAGE_ANY);
    CHECK_OK(ferry_buffer_set_usage(buf, FERRY_BUFFER_USAGE_WEIGHTS));
    CHECK_FAILS(ferry_buffer_set_usage(buf, (ferry_buffer_usage) 3), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "unknown usage 3") != NULL);
    CHECK_EQ_U(ferry_buffer_get_usage(buf), FERRY_BUFFER_USAGE_WEIGHTS);
    CHECK_EQ_U(ferry_buffer_get_usage(NULL), FERRY_BUFFER_USAGE_ANY);

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    const int64_t ne[1] = {256};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t)); /* 1 KiB */
    const size_t align = ferry_buffer_type_alignment(ferry_cpu_buffer_type());
    const size_t far = SIZE_MAX - (SIZE_MAX % align); /* the highest aligned offset: + 1 KiB wraps */
    CHECK(far % align == 0 && align < 1024);
    CHECK_FAILS(ferry_buffer_place_tensor(buf, t, far), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "needs 1024 bytes") != NULL);
    CHECK_FAILS(ferry_buffer_place_tensor(buf, t, 4096 - 1024 + align), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(t->buffer == NULL && t->data == NULL);
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 4096 - 1024));
    ferry_context_free(ctx);
    ferry_buffer_free(buf);
}

static const check_test tests[] = {
    {"synthetic_buffers_align_cap_and_count_not_copy", test_synthetic_buffers_align_cap_and_count_not_copy},
    {"bad_usage_and_placement_past_the_end_refused", test_bad_usage_and_placement_past_the_end_refused},
};

CHECK_MAIN(tests)
