/*
 * docs/design.md's heart test against a CUDA split backend: the KV cache in
 * pinned host memory, the window's copy in device memory starting as a sentinel. Each
 * test exits 77 (SKIP) without a device.
 */
#include "kv-fixture.h"

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

static ferry_status cuda_fixture(kv_fixture * f, const ferry_kv_params * p) {
    ferry_backend * cuda;
    ferry_buffer_type * pinned;
    ferry_status st = ferry_cuda_backend_new(0, &cuda);
    if (st != FERRY_OK) {
        return st;
    }
    st = ferry_cuda_host_buffer_type(&pinned);
    if (st != FERRY_OK) {
        ferry_backend_free(cuda);
        return st;
    }
    return kv_fixture_init_on(f, p, cuda, pinned);
}

/* The copy path alone (ferry_copy_input), as the scheduler calls it. */
static int copy_path_case(ferry_copy_policy policy, ferry_type type, int64_t n_stream, int64_t used) {
    const ferry_kv_params p = {.type_k = type, .type_v = type, .head_dim = 128, .n_head_kv = 8,
                               .n_ctx = 64 * n_stream, .n_stream = n_stream, .n_layer = 1};
    kv_fixture f;
    ferry_tensor *k, *copy;
    ferry_copy_stats stats;
    int result = -1;
    if (cuda_fixture(&f, &p) != FERRY_OK || ferry_kv_cache_window(f.kv, f.ctx, 0, used, 0, n_stream - 1, &k, NULL) != FERRY_OK ||
        kv_split_copy(&f, k, &copy) != FERRY_OK || ferry_copy_input(f.split, policy, k, copy, &stats) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
    } else {
        result = kv_check_window_copy(&f, k, copy, stats.bytes_copied);
        if (result == 0 && policy == FERRY_COPY_RANGES && stats.path != FERRY_COPY_RANGES) {
            result = 4;
        }
    }
    kv_fixture_free(&f);
    return result;
}

static void test_cuda_ordered_multi_stream_ranges(void) {
    need_device();
    CHECK_EQ_U(copy_path_case(FERRY_COPY_RANGES, FERRY_TYPE_Q8_0, 4, 37), 0);
    CHECK_EQ_U(copy_path_case(FERRY_COPY_RANGES, FERRY_TYPE_F16, 8, 64), 0);
    CHECK_EQ_U(copy_path_case(FERRY_COPY_RANGES, FERRY_TYPE_F16, 2, 1), 0);
}

static void test_cuda_ordered_multi_stream_flat_fails_first_assertion(void) {
    need_device();
    CHECK_EQ_U(copy_path_case(FERRY_COPY_FLAT, FERRY_TYPE_Q8_0, 4, 37), 1);
}

/* Through the whole scheduler: a dup of the window assigned to the CUDA backend. */
static int sched_case(ferry_copy_policy policy, int64_t n_stream, int64_t used) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_Q8_0, .head_dim = 128, .n_head_kv = 8,
                               .n_ctx = 64 * n_stream, .n_stream = n_stream, .n_layer = 1};
    kv_fixture f;
    ferry_tensor *k, *dup;
    ferry_graph * g = NULL;
    ferry_sched * s = NULL;
    ferry_sched_input_info in;
    int result = -1;
    if (cuda_fixture(&f, &p) != FERRY_OK || ferry_kv_cache_window(f.kv, f.ctx, 0, used, 0, n_stream - 1, &k, NULL) != FERRY_OK ||
        ferry_dup(f.ctx, k, &dup) != FERRY_OK || ferry_tensor_set_output(dup) != FERRY_OK || ferry_graph_new(&g) != FERRY_OK ||
        ferry_graph_build(g, dup) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
        goto done;
    }
    ferry_backend * backends[2] = {f.split, f.cpu};
    if (ferry_sched_new(backends, 2, &s) != FERRY_OK || ferry_sched_set_policy(s, policy) != FERRY_OK ||
        ferry_sched_set_tensor_backend(s, dup, f.split) != FERRY_OK || ferry_sched_alloc_graph(s, g) != FERRY_OK ||
        ferry_sched_n_inputs(s) != 1 || ferry_sched_input(s, 0, &in) != FERRY_OK ||
        ferry_tensor_memset(in.copy, SENTINEL, 0, ferry_tensor_nbytes(in.copy)) != FERRY_OK ||
        ferry_sched_graph_compute(s, g) != FERRY_OK || ferry_sched_input(s, 0, &in) != FERRY_OK) {
        fprintf(stderr, "scheduler: %s (inputs %d)\n", ferry_last_error(), s ? ferry_sched_n_inputs(s) : -1);
        goto done;
    }
    result = kv_check_window_copy(&f, k, in.copy, in.stats.bytes_copied);
done:
    ferry_sched_free(s);
    ferry_graph_free(g);
    kv_fixture_free(&f);
    return result;
}

static void test_cuda_sched_ordered_multi_stream_ranges(void) {
    need_device();
    CHECK_EQ_U(sched_case(FERRY_COPY_RANGES, 4, 37), 0);
    CHECK_EQ_U(sched_case(FERRY_COPY_FLAT, 4, 37), 1);
}

static const check_test tests[] = {
    {"cuda_ordered_multi_stream_ranges", test_cuda_ordered_multi_stream_ranges},
    {"cuda_ordered_multi_stream_flat_fails_first_assertion", test_cuda_ordered_multi_stream_flat_fails_first_assertion},
    {"cuda_sched_ordered_multi_stream_ranges", test_cuda_sched_ordered_multi_stream_ranges},
};

CHECK_MAIN(tests)
