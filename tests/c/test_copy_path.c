/* The scheduler's ordered copy path (copy-path.c), input by input. */
#include "kv-fixture.h"
#include "lost-device.h"

static size_t row_of(ferry_type type, int64_t n) {
    size_t r = 0;
    ferry_row_size(type, n, &r);
    return r;
}

/* docs/design.md's heart test on one window: the K window of streams s0..s1
 * in the shape attention hands on, through the copy path into a sentinel-filled split
 * buffer. Returns kv_check_window_copy's verdict (0: all holds), -1 if the setting failed. */
static int check_window_copy(ferry_copy_policy policy, ferry_type type, int64_t n_stream, int64_t s0, int64_t s1,
                             int64_t used, ferry_copy_stats * out_stats) {
    const ferry_kv_params p = {.type_k = type, .type_v = type, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 24 * n_stream, .n_stream = n_stream, .n_layer = 1};
    kv_fixture f;
    ferry_tensor *k, *copy;
    ferry_copy_stats stats;
    int result = -1;
    if (kv_fixture_init(&f, &p) != FERRY_OK || ferry_kv_cache_window(f.kv, f.ctx, 0, used, s0, s1, &k, NULL) != FERRY_OK ||
        kv_split_copy(&f, k, &copy) != FERRY_OK || ferry_copy_input(f.split, policy, k, copy, &stats) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
    } else {
        result = kv_check_window_copy(&f, k, copy, stats.bytes_copied);
        if (out_stats) {
            *out_stats = stats;
        }
    }
    kv_fixture_free(&f);
    return result;
}

static void test_ordered_multi_stream_ranges(void) {
    ferry_copy_stats s;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_F16, 4, 0, 3, 10, &s), 0);
    CHECK(s.path == FERRY_COPY_RANGES);
    CHECK_EQ_U(s.copy_calls, 1);
    CHECK_EQ_U(s.bytes_read, s.bytes_copied);
}

/* The same test under flat must fail, and on its first assertion. */
static void test_ordered_multi_stream_flat_fails_first_assertion(void) {
    ferry_copy_stats s;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_FLAT, FERRY_TYPE_F16, 4, 0, 3, 10, &s), 1);
    CHECK(s.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(s.bytes_copied, s.bytes_span);
    CHECK(s.bytes_copied > s.bytes_read);
}

static void test_ranges_copy_exactly_a_subset_of_streams(void) {
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_F16, 8, 3, 5, 7, NULL), 0);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_F32, 8, 6, 7, 24, NULL), 0);
}

static void test_ranges_copy_exactly_rows_of_q8_0_q4_0_and_f16(void) {
    ferry_copy_stats s;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_Q8_0, 4, 0, 3, 9, &s), 0);
    CHECK_EQ_U(s.bytes_copied, 4 * 9 * row_of(FERRY_TYPE_Q8_0, 64));
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_Q4_0, 2, 0, 1, 5, NULL), 0);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_F16, 2, 0, 1, 1, NULL), 0);
}

/* Unified cache and single sequence: one range, exactly the path, bytes and calls of flat. */
static void test_unified_and_single_sequence_same_as_flat(void) {
    ferry_copy_stats flat, ranges;
    /* unified: one stream holding every cell */
    CHECK_EQ_U(check_window_copy(FERRY_COPY_FLAT, FERRY_TYPE_Q8_0, 1, 0, 0, 17, &flat), 0);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_Q8_0, 1, 0, 0, 17, &ranges), 0);
    CHECK(ranges.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(ranges.bytes_copied, flat.bytes_copied);
    CHECK_EQ_U(ranges.copy_calls, flat.copy_calls);
    CHECK_EQ_U(ranges.impl_calls, flat.impl_calls);
    /* a single sequence of a multi-stream cache */
    CHECK_EQ_U(check_window_copy(FERRY_COPY_FLAT, FERRY_TYPE_F16, 4, 2, 2, 13, &flat), 0);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_RANGES, FERRY_TYPE_F16, 4, 2, 2, 13, &ranges), 0);
    CHECK(ranges.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(ranges.bytes_copied, flat.bytes_copied);
    CHECK_EQ_U(ranges.copy_calls, flat.copy_calls);
}

/* A K window of a cache in device memory (a dummy with real memory, not host), copied
 * under a policy into another dummy. */
static void device_source_case(ferry_copy_policy policy, int64_t n_ctx, int64_t used, ferry_copy_stats * out) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend *dev, *split;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    CHECK_OK(ferry_dummy_backend_new(&dp, &split));
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = n_ctx, .n_stream = 4, .n_layer = 1};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new(&p, ferry_backend_default_buffer_type(dev), &kv));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *copy;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, used, 0, 3, &k, NULL));
    ferry_copy_2d r;
    CHECK(ferry_copy_ranges_of(k, &r) && r.count == 4); /* the layout qualifies */
    CHECK_OK(ferry_tensor_dup_layout(ctx, k, &copy));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(split, ferry_tensor_nbytes(k), &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, copy, 0));
    const size_t span = ferry_tensor_nbytes(k);
    unsigned char * pattern = malloc(span), * want = malloc(r.size * r.count), * got = malloc(r.size * r.count);
    for (size_t i = 0; i < span; i++) {
        pattern[i] = (unsigned char) (i * 7 + 3);
    }
    CHECK_OK(ferry_tensor_set(k, pattern, 0, span));
    CHECK_OK(ferry_copy_input(split, policy, k, copy, out));
    CHECK_EQ_U(out->bytes_span, span);
    /* the ranges landed where the graph reads them */
    CHECK_OK(ferry_tensor_get_2d(k, want, r.offset, r.size, r.count, r.stride, r.size));
    CHECK_OK(ferry_tensor_get_2d(copy, got, r.offset, r.size, r.count, r.stride, r.size));
    CHECK(memcmp(want, got, r.size * r.count) == 0);
    free(pattern);
    free(want);
    free(got);
    ferry_buffer_free(buf);
    ferry_kv_cache_free(kv);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
    ferry_backend_free(split);
}

/* ranges from another device's memory (a layer resident on one device, read by another):
 * the ranges staged through the host, not the span with its gaps. */
static void test_device_source_copies_its_ranges(void) {
    ferry_copy_stats s;
    SUB(device_source_case(FERRY_COPY_RANGES, 64, 5, &s));
    CHECK(s.path == FERRY_COPY_RANGES);
    CHECK_EQ_U(s.bytes_copied, 4 * 5 * 128);
    CHECK_EQ_U(s.bytes_read, s.bytes_copied);
    CHECK(s.bytes_copied < s.bytes_span);
}

/* Layouts outside the rule: overlapping ranges, scattered slices, a transposed V. */
static void test_rule_refuses_overlap_and_scattered_slices(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *store, *v;
    const int64_t ne_store[1] = {4096};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne_store, &store));
    ferry_copy_2d r;
    /* dense slices of 256 bytes, 4 of them 128 bytes apart: overlap */
    const int64_t ne[4] = {16, 4, 1, 4};
    const size_t overlap[4] = {4, 64, 256, 128};
    CHECK_OK(ferry_tensor_view(ctx, store, 4, ne, overlap, 0, &v));
    CHECK(!ferry_copy_ranges_of(v, &r));
    /* rows of 64 bytes at a 100-byte pitch: the slice has gaps of its own */
    const size_t scattered[4] = {4, 100, 400, 1000};
    CHECK_OK(ferry_tensor_view(ctx, store, 4, ne, scattered, 0, &v));
    CHECK(!ferry_copy_ranges_of(v, &r));
    /* dimension 0 not innermost */
    ferry_tensor * tr;
    const size_t dense[4] = {4, 64, 256, 1024};
    CHECK_OK(ferry_tensor_view(ctx, store, 4, ne, dense, 0, &v));
    CHECK(ferry_copy_ranges_of(v, &r) && r.size == 256 && r.count == 4 && r.stride == 1024);
    CHECK_OK(ferry_tensor_transpose(ctx, v, &tr));
    CHECK(!ferry_copy_ranges_of(tr, &r));
    /* ranges exactly touching: the rule applies (a contiguous tensor, one range per slice) */
    const size_t touching[4] = {4, 64, 256, 256};
    CHECK_OK(ferry_tensor_view(ctx, store, 4, ne, touching, 0, &v));
    CHECK(ferry_copy_ranges_of(v, &r) && r.count == 4 && r.stride == 256);
    ferry_context_free(ctx);

    /* ... and through the copy path they go flat, the bytes of the whole span */
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 2, .n_layer = 1, .v_trans = true};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *vw, *copy;
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 6, 0, 1, NULL, &vw));
    CHECK(!ferry_copy_ranges_of(vw, &r));
    CHECK_OK(kv_split_copy(&f, vw, &copy));
    ferry_copy_stats s;
    CHECK_OK(ferry_copy_input(f.split, FERRY_COPY_RANGES, vw, copy, &s));
    CHECK(s.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(s.bytes_copied, ferry_tensor_nbytes(vw));
    CHECK_EQ_U(s.bytes_read, 2 * 6 * 32 * 2);
    kv_fixture_free(&f);
}

static void test_copy_input_and_windows_refuse_bad_input(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 2, .n_layer = 1};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *k2, *copy, *unplaced;
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 6, 0, 1, &k, NULL));
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 7, 0, 1, &k2, NULL));
    CHECK_OK(kv_split_copy(&f, k, &copy));
    CHECK_OK(ferry_tensor_dup_layout(f.ctx, k, &unplaced));
    CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RANGES, k2, copy, NULL), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RANGES, k, unplaced, NULL), FERRY_ERR_NOT_ALLOCATED);
    CHECK_FAILS(ferry_copy_input(f.split, (ferry_copy_policy) 7, k, copy, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_cache_window(f.kv, f.ctx, 0, 33, 0, 1, &k, NULL), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_window(f.kv, f.ctx, 0, 3, 1, 2, &k, NULL), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_window(f.kv, f.ctx, 1, 3, 0, 1, &k, NULL), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_kv_cache * bad;
    ferry_kv_params q = p;
    q.type_v = FERRY_TYPE_Q8_0;
    q.v_trans = true;
    CHECK_FAILS(ferry_kv_cache_new(&q, NULL, &bad), FERRY_ERR_LAYOUT);
    q = p;
    q.n_ctx = 63;
    CHECK_FAILS(ferry_kv_cache_new(&q, NULL, &bad), FERRY_ERR_INVALID_ARG);
    kv_fixture_free(&f);
}

/* plan: a K window with wide gaps goes as one 2-D copy of its ranges, like ranges. */
static void test_plan_copies_a_k_windows_ranges_in_one_2d_copy(void) {
    ferry_copy_stats s;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_PLAN, FERRY_TYPE_Q8_0, 4, 0, 3, 4, &s), 0); /* span 4.75x the reads */
    CHECK(s.path == FERRY_COPY_PLAN);
    CHECK_EQ_U(s.copy_calls, 1);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_PLAN, FERRY_TYPE_F16, 8, 2, 6, 5, &s), 0);
    CHECK(s.path == FERRY_COPY_PLAN);
}

/* plan declines when its cost rule says the gaps are too small to pay on this backend:
 * 680-byte ranges whose span is only 2.05x the bytes read go flat on a CPU. */
static void test_plan_declines_when_it_does_not_pay(void) {
    ferry_copy_stats s;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_PLAN, FERRY_TYPE_Q8_0, 4, 0, 3, 10, &s), 1);
    CHECK(s.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(s.bytes_copied, s.bytes_span);
}

/* plan on a unified window: one contiguous range, so exactly what flat does. */
static void test_plan_unified_same_as_flat(void) {
    ferry_copy_stats flat, plan;
    CHECK_EQ_U(check_window_copy(FERRY_COPY_FLAT, FERRY_TYPE_F16, 1, 0, 0, 17, &flat), 0);
    CHECK_EQ_U(check_window_copy(FERRY_COPY_PLAN, FERRY_TYPE_F16, 1, 0, 0, 17, &plan), 0);
    CHECK(plan.path == FERRY_COPY_FLAT);
    CHECK_EQ_U(plan.bytes_copied, flat.bytes_copied);
    CHECK_EQ_U(plan.copy_calls, flat.copy_calls);
}

/* Transposed V on a unified cache: a gap after every channel row. plan moves the bytes
 * read, in one 2-D copy, and leaves every gap byte alone; ranges cannot and goes flat. */
static void test_plan_moves_a_transposed_vs_bytes_read_only(void) {
    const int64_t head_dim = 16, n_head_kv = 2, n_kv = 128, kv_size = 4096;
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = head_dim,
                               .n_head_kv = n_head_kv, .n_ctx = kv_size, .n_stream = 1, .n_layer = 1, .v_trans = true};
    for (int policy = FERRY_COPY_FLAT; policy <= FERRY_COPY_PLAN; policy++) {
        kv_fixture f;
        CHECK_OK(kv_fixture_init(&f, &p));
        ferry_tensor *v, *copy, *cache;
        CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, n_kv, 0, 0, NULL, &v));
        CHECK_OK(ferry_kv_cache_v(f.kv, 0, &cache));
        CHECK_OK(kv_split_copy(&f, v, &copy));
        ferry_copy_stats s;
        CHECK_OK(ferry_copy_input(f.split, (ferry_copy_policy) policy, v, copy, &s));
        const size_t row = (size_t) n_kv * 2, pitch = (size_t) kv_size * 2, channels = (size_t) (head_dim * n_head_kv);
        CHECK_EQ_U(s.bytes_read, channels * row);
        if (policy == FERRY_COPY_PLAN) {
            CHECK(s.path == FERRY_COPY_PLAN);
            CHECK_EQ_U(s.bytes_copied, s.bytes_read);
            CHECK_EQ_U(s.copy_calls, 1);
            CHECK(s.bytes_span / s.bytes_read > 15); /* what flat moves instead */
        } else {
            CHECK(s.path == FERRY_COPY_FLAT);
            CHECK_EQ_U(s.bytes_copied, s.bytes_span);
        }
        uint8_t * got = malloc(s.bytes_span);
        CHECK_OK(ferry_tensor_get(copy, got, 0, s.bytes_span));
        const size_t base = (size_t) ((char *) v->data - (char *) ferry_buffer_base(ferry_kv_cache_buffer(f.kv)));
        for (size_t c = 0; c < channels; c++) {
            for (size_t b = 0; b < pitch && c * pitch + b < s.bytes_span; b++) {
                const uint8_t want = b < row ? kv_pattern(base + c * pitch + b)
                                             : (policy == FERRY_COPY_PLAN ? SENTINEL : kv_pattern(base + c * pitch + b));
                if (got[c * pitch + b] != want) {
                    fprintf(stderr, "channel %zu byte %zu: %u, want %u\n", c, b, got[c * pitch + b], want);
                    CHECK(false);
                }
            }
        }
        free(got);
        kv_fixture_free(&f);
    }
}

/* plan with a device-side source: the rows are staged through the host, still only the bytes read. */
static void test_plan_stages_a_device_sources_bytes_read_only(void) {
    ferry_copy_stats s;
    SUB(device_source_case(FERRY_COPY_PLAN, 4096, 40, &s));
    CHECK(s.path == FERRY_COPY_PLAN);
    CHECK_EQ_U(s.bytes_copied, 4 * 40 * 128);
}

/* A device whose second wait fails: the copy path waits before a copy and after it. */
static int waits_before_loss;
static ferry_status lost_after_waits(ferry_backend * be) {
    (void) be;
    return waits_before_loss-- > 0 ? FERRY_OK : lost();
}

/* An input copy on a device that fails gives back the device's error, whichever part of
 * the copy it fails in: the wait before the copy (then nothing was written), the rows set
 * from host memory (ranges, plan), the wait after, or the rows read from another device's
 * memory into host memory. */
static void test_device_error_during_a_copy(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_Q8_0, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 4, .n_layer = 1};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *copy;
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 4, 0, 3, &k, NULL)); /* the plan pays here */
    CHECK_OK(kv_split_copy(&f, k, &copy));
    const struct ferry_backend_i working = f.split->iface;
    f.split->iface.synchronize = lost_synchronize;
    LOST(ferry_copy_input(f.split, FERRY_COPY_RANGES, k, copy, NULL));
    const size_t span = ferry_tensor_nbytes(copy);
    unsigned char * bytes = malloc(span);
    CHECK(bytes && ferry_tensor_get(copy, bytes, 0, span) == FERRY_OK);
    size_t untouched = 0;
    for (size_t i = 0; i < span; i++) {
        untouched += bytes[i] == SENTINEL;
    }
    free(bytes);
    CHECK_EQ_U(untouched, span); /* not one row arrived */
    f.split->iface = working;
    f.split->iface.set_tensor_2d_async = lost_set_2d_async;
    LOST(ferry_copy_input(f.split, FERRY_COPY_RANGES, k, copy, NULL));
    LOST(ferry_copy_input(f.split, FERRY_COPY_PLAN, k, copy, NULL));
    f.split->iface = working;
    waits_before_loss = 1;
    f.split->iface.synchronize = lost_after_waits;
    LOST(ferry_copy_input(f.split, FERRY_COPY_RANGES, k, copy, NULL));
    f.split->iface = working;
    ferry_copy_stats st;
    CHECK_OK(ferry_copy_input(f.split, FERRY_COPY_RANGES, k, copy, &st)); /* working again: the rows arrive */
    CHECK_EQ_U(kv_check_window_copy(&f, k, copy, st.bytes_copied), 0);

    /* the other way: the window in the device's memory, read into host memory by get */
    ferry_tensor * host_copy;
    ferry_buffer * host_buf;
    CHECK_OK(ferry_tensor_dup_layout(f.ctx, copy, &host_copy));
    CHECK_OK(ferry_backend_alloc_buffer(f.cpu, ferry_tensor_nbytes(copy), &host_buf));
    CHECK_OK(ferry_buffer_place_tensor(host_buf, host_copy, 0));
    ferry_buffer * dev_buf = f.split_buf;
    dev_buf->iface.get_tensor_2d = lost_get_2d;
    LOST(ferry_copy_input(f.cpu, FERRY_COPY_RANGES, copy, host_copy, NULL));
    ferry_buffer_free(host_buf);
    kv_fixture_free(&f);
}

static const check_test tests[] = {
    {"ordered_multi_stream_ranges", test_ordered_multi_stream_ranges},
    {"ordered_multi_stream_flat_fails_first_assertion", test_ordered_multi_stream_flat_fails_first_assertion},
    {"ranges_copy_exactly_a_subset_of_streams", test_ranges_copy_exactly_a_subset_of_streams},
    {"ranges_copy_exactly_rows_of_q8_0_q4_0_and_f16", test_ranges_copy_exactly_rows_of_q8_0_q4_0_and_f16},
    {"unified_and_single_sequence_same_as_flat", test_unified_and_single_sequence_same_as_flat},
    {"device_source_copies_its_ranges", test_device_source_copies_its_ranges},
    {"rule_refuses_overlap_and_scattered_slices", test_rule_refuses_overlap_and_scattered_slices},
    {"copy_input_and_windows_refuse_bad_input", test_copy_input_and_windows_refuse_bad_input},
    {"device_error_during_a_copy", test_device_error_during_a_copy},
    {"plan_copies_a_k_windows_ranges_in_one_2d_copy", test_plan_copies_a_k_windows_ranges_in_one_2d_copy},
    {"plan_declines_when_it_does_not_pay", test_plan_declines_when_it_does_not_pay},
    {"plan_unified_same_as_flat", test_plan_unified_same_as_flat},
    {"plan_moves_a_transposed_vs_bytes_read_only", test_plan_moves_a_transposed_vs_bytes_read_only},
    {"plan_stages_a_device_sources_bytes_read_only", test_plan_stages_a_device_sources_bytes_read_only},
};

CHECK_MAIN(tests)
