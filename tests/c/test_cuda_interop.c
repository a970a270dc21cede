/*
 * Device memory another library owns, as a ferry buffer (ferry_cuda_buffer_from_ptr).
 * Built with CUDA only; exits 77 (SKIP) without a device. The memory here comes from a
 * ferry buffer of its own, standing in for PyTorch's or CuPy's: the borrowed buffer must
 * read and write it in place and never free it.
 */
#include "check.h"

#include <stdint.h>

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

static void test_borrowed_device_memory_is_used_in_place(void) {
    need_device();
    ferry_backend * cuda = NULL;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    ferry_buffer * owner = NULL;
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 256, &owner));
    ferry_buffer * borrowed = NULL;
    CHECK_OK(ferry_cuda_buffer_from_ptr(0, ferry_buffer_base(owner), 256, &borrowed));
    CHECK(!ferry_buffer_is_host(borrowed));
    CHECK(ferry_buffer_get_type(borrowed) == ferry_buffer_get_type(owner));
    CHECK(ferry_backend_supports_buft(cuda, ferry_buffer_get_type(borrowed)));

    ferry_context * ctx = NULL;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {64};
    ferry_tensor *a = NULL, *b = NULL;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &a));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &b));
    CHECK_OK(ferry_buffer_place_tensor(borrowed, a, 0));
    CHECK_OK(ferry_buffer_place_tensor(owner, b, 0));
    int32_t in[64], out[64];
    for (int i = 0; i < 64; i++) {
        in[i] = i * 3 + 1;
    }
    CHECK_OK(ferry_tensor_set(a, in, 0, sizeof(in)));
    CHECK_OK(ferry_tensor_get(b, out, 0, sizeof(out))); /* the same memory, through its owner */
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    ferry_memory_kind kind;
    int device = -5;
    void * data = NULL;
    CHECK_OK(ferry_tensor_memory(a, &kind, &device, &data));
    CHECK(kind == FERRY_MEMORY_CUDA && device == 0 && data == ferry_buffer_base(owner));

    ferry_buffer_free(borrowed); /* must not free the owner's memory */
    memset(out, 0, sizeof(out));
    CHECK_OK(ferry_tensor_get(b, out, 0, sizeof(out)));
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    ferry_buffer_free(owner);
    ferry_context_free(ctx);
    ferry_backend_free(cuda);
}

static void test_memory_not_of_the_device_is_refused(void) {
    need_device();
    ferry_buffer * buf = NULL;
    static char host[256];
    CHECK_FAILS(ferry_cuda_buffer_from_ptr(0, host, sizeof(host), &buf), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "not memory of CUDA0") != NULL);
    CHECK_FAILS(ferry_cuda_buffer_from_ptr(0, NULL, 16, &buf), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_buffer_from_ptr(99, host, 16, &buf), FERRY_ERR_INVALID_ARG);

    /* a range that runs past the end of its allocation */
    ferry_backend * cuda = NULL;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    ferry_buffer * owner = NULL;
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 256, &owner));
    CHECK_FAILS(ferry_cuda_buffer_from_ptr(0, ferry_buffer_base(owner), 1 << 30, &buf), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(owner);
    ferry_backend_free(cuda);
}

static const check_test tests[] = {
    {"borrowed_device_memory_is_used_in_place", test_borrowed_device_memory_is_used_in_place},
    {"memory_not_of_the_device_is_refused", test_memory_not_of_the_device_is_refused},
};

CHECK_MAIN(tests)
