/* The scheduler's ordered copy path (copy-path.c), input by input. */
#include "kv-fixture.h"
#include "lost-device.h"
#include "value-fill.h"
#include "window-check.h"

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

/* ---------------------------------------------------------------- ragged windows */

/* A host i32 tensor of n lengths, in a buffer of its own (freed by the caller). */
static ferry_status host_lengths(kv_fixture * f, const int32_t * lens, int64_t n, ferry_tensor ** out,
                                 ferry_buffer ** buf) {
    ferry_status st = ferry_tensor_new(f->ctx, FERRY_TYPE_I32, 1, &n, out);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->cpu, (size_t) n * sizeof(int32_t), buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(*buf, *out, 0);
    if (st == FERRY_OK) st = ferry_tensor_set(*out, lens, 0, (size_t) n * sizeof(int32_t));
    return st;
}

/* A copy of src on the split backend in src's compact layout, every byte a sentinel. */
static ferry_status compact_split_copy(kv_fixture * f, const ferry_tensor * src, ferry_tensor ** out) {
    ferry_status st = ferry_tensor_compact_layout(f->ctx, src, out);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->split, ferry_tensor_nbytes(*out), &f->split_buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->split_buf, *out, 0);
    if (st == FERRY_OK) st = ferry_tensor_memset(*out, SENTINEL, 0, ferry_tensor_nbytes(*out));
    if (st == FERRY_OK) ferry_buffer_reset_stats(f->split_buf);
    return st;
}

typedef struct {
    ferry_type type;
    bool v, v_trans; /* the V window (v), of a cache whose V is transposed (v_trans) */
    bool compact;
    int64_t n_stream, n_kv;
    const int32_t * lens; /* n_stream of them */
    int64_t limit;        /* the lengths' limit (0: n_kv) */
    const ferry_copy_cost_model * model; /* the split backend's (NULL: its own) */
} ragged_case;

/* The ragged heart test: the window of every stream of a host cache (24 cells a stream),
 * carrying lens as its used cells, copied by policy into a sentinel-filled split copy.
 * Returns kv_check_used_copy's verdict (0: all holds), -1 if the setting failed. */
static int check_ragged_copy(ferry_copy_policy policy, const ragged_case * c, ferry_copy_stats * out_stats) {
    const ferry_kv_params p = {.type_k = c->type, .type_v = c->type, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 24 * c->n_stream, .n_stream = c->n_stream, .n_layer = 1,
                               .v_trans = c->v_trans};
    kv_fixture f;
    ferry_tensor *k, *v, *len, *copy;
    ferry_buffer * len_buf = NULL;
    ferry_copy_stats stats;
    int result = -1;
    ferry_status st = kv_fixture_init(&f, &p);
    if (st == FERRY_OK) st = ferry_kv_cache_window(f.kv, f.ctx, 0, c->n_kv, 0, c->n_stream - 1, &k, &v);
    ferry_tensor * w = c->v ? v : k;
    if (st == FERRY_OK) st = host_lengths(&f, c->lens, c->n_stream, &len, &len_buf);
    if (st == FERRY_OK) st = ferry_tensor_set_used_cells(w, len, c->v && c->v_trans ? 0 : 1, 3, c->limit);
    if (st == FERRY_OK) st = c->compact ? compact_split_copy(&f, w, &copy) : kv_split_copy(&f, w, &copy);
    if (st == FERRY_OK) st = ferry_backend_set_copy_cost_model(f.split, c->model);
    if (st == FERRY_OK) st = ferry_copy_input(f.split, policy, w, copy, &stats);
    if (st != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
    } else {
        int64_t used[8];
        for (int64_t s = 0; s < c->n_stream; s++) {
            used[s] = c->lens[s] < c->n_kv ? c->lens[s] : c->n_kv;
        }
        result = kv_check_used_copy(&f, w, copy, used, stats.bytes_copied);
        if (out_stats) {
            *out_stats = stats;
        }
    }
    ferry_buffer_free(len_buf);
    kv_fixture_free(&f);
    return result;
}

/* Bytes of one cell of a window of c: n_embd_gqa values (transposed V: the same, a value a channel). */
static uint64_t cell_bytes(const ragged_case * c) { return row_of(c->type, 64); }

/* The windows the ragged tests cover: K and V in f16 and q8_0, V transposed in f16 and f32,
 * each with its layout's copy and its compact copy. */
static ragged_case ragged_kind(int i, const int32_t * lens, int64_t n_stream, int64_t n_kv) {
    static const struct {
        ferry_type type;
        bool v, v_trans;
    } kinds[6] = {{FERRY_TYPE_F16, false, false}, {FERRY_TYPE_Q8_0, false, false}, {FERRY_TYPE_F16, true, false},
                  {FERRY_TYPE_Q8_0, true, false}, {FERRY_TYPE_F16, true, true},   {FERRY_TYPE_F32, true, true}};
    return (ragged_case) {.type = kinds[i / 2].type, .v = kinds[i / 2].v, .v_trans = kinds[i / 2].v_trans,
                          .compact = i % 2 == 1, .n_stream = n_stream, .n_kv = n_kv, .lens = lens,
                          .limit = n_kv + 5};
}
enum { RAGGED_KINDS = 12, RAGGED_SEEDS = 6, RAGGED_N_KV = 19 };

/* Per-stream lengths of seed `seed` for 4 streams: random in 0..n_kv, with a 0 and an n_kv in
 * seeds 0 and 1, every length equal (below n_kv) in seed 2, one past n_kv in seed 3 (a sliding
 * layer's window is shorter than the step's n_kv, the limit: attention clamps it), and two
 * streams at the shortest in seed 4 (then the shortest and the tails take fewer calls). */
static void ragged_lengths(int seed, int32_t * lens) {
    uint32_t state = 0x9e3779b9u + (uint32_t) seed * 7919u;
    for (int s = 0; s < 4; s++) {
        lens[s] = (int32_t) (next_random(&state) % (RAGGED_N_KV + 1));
    }
    if (seed == 0 || seed == 1) {
        lens[seed] = 0;
        lens[3 - seed] = RAGGED_N_KV;
    }
    if (seed == 2) {
        lens[0] = lens[1] = lens[2] = lens[3] = 7;
    }
    if (seed == 3) {
        lens[2] = RAGGED_N_KV + 5;
    }
    if (seed == 4) {
        lens[3] = lens[0];
    }
}

/* A split backend whose calls are dear takes the shortest over every stream and the tails; one
 * whose rows are dear takes a copy per stream (their rows are a stream's, not every stream's). */
static const ferry_copy_cost_model calls_dear = {.call_us = 100, .gbps = 10};
static const ferry_copy_cost_model rows_dear = {.call_us = 0.01, .row_ns = 1000, .gbps = 10};

/* Every kind of window, every seed, each route: each stream's used cells and nothing else
 * arrive; bytes copied are the used cells' bytes, and the bytes the copy path says the graph
 * reads; the copies are the route's (equal lengths: one 2-D copy). */
static void test_ragged_windows_sentinel(void) {
    for (int seed = 0; seed < RAGGED_SEEDS; seed++) {
        int32_t lens[4];
        ragged_lengths(seed, lens);
        int64_t used = 0, shortest = RAGGED_N_KV, nonzero = 0, longer = 0;
        for (int s = 0; s < 4; s++) {
            const int64_t u = lens[s] < RAGGED_N_KV ? lens[s] : RAGGED_N_KV;
            used += u;
            nonzero += u > 0;
            shortest = u < shortest ? u : shortest;
        }
        for (int s = 0; s < 4; s++) longer += (lens[s] < RAGGED_N_KV ? lens[s] : RAGGED_N_KV) > shortest;
        for (int route = 0; route < 2; route++) {
            for (int i = 0; i < RAGGED_KINDS; i++) {
                ragged_case c = ragged_kind(i, lens, 4, RAGGED_N_KV);
                c.model = route == 0 ? &calls_dear : &rows_dear;
                ferry_copy_stats s;
                const int verdict = check_ragged_copy(FERRY_COPY_RAGGED, &c, &s);
                if (verdict != 0) {
                    fprintf(stderr, "seed %d, %s, kind %d (%s, %s%s%s): verdict %d\n", seed,
                            route == 0 ? "calls dear" : "rows dear", i, ferry_type_name(c.type), c.v ? "V" : "K",
                            c.v_trans ? " transposed" : "", c.compact ? ", compact" : "", verdict);
                }
                CHECK_EQ_U(verdict, 0);
                CHECK(s.path == FERRY_COPY_RAGGED);
                CHECK_EQ_U(s.bytes_copied, (uint64_t) used * cell_bytes(&c));
                CHECK_EQ_U(s.bytes_read, s.bytes_copied);
                const int64_t calls = longer == 0 ? shortest > 0 : route == 0 ? (shortest > 0) + longer : nonzero;
                CHECK_EQ_U(s.copy_calls, calls);
            }
        }
        if (seed == 2) {
            CHECK_EQ_U(longer, 0); /* equal lengths, checked above to be one copy */
        }
    }
}

/* The same test under ranges fails, on its first assertion: ranges copies n_kv cells of every
 * stream (the transposed V, which its rule does not cover, the whole span), more than the used
 * cells, wherever a length falls short of n_kv. Under flat too. */
static void test_ragged_sentinel_fails_under_ranges(void) {
    for (int seed = 0; seed < RAGGED_SEEDS; seed++) {
        int32_t lens[4];
        ragged_lengths(seed, lens);
        for (int i = 0; i < RAGGED_KINDS; i++) {
            const ragged_case c = ragged_kind(i, lens, 4, RAGGED_N_KV);
            ferry_copy_stats s;
            CHECK_EQ_U(check_ragged_copy(FERRY_COPY_RANGES, &c, &s), 1);
            CHECK(s.path == (c.compact ? FERRY_COPY_PLAN : c.v_trans ? FERRY_COPY_FLAT : FERRY_COPY_RANGES));
            CHECK_EQ_U(check_ragged_copy(FERRY_COPY_FLAT, &c, &s), 1);
        }
    }
    /* with every stream at n_kv the used cells are the window: ranges passes */
    const int32_t full[4] = {RAGGED_N_KV, RAGGED_N_KV, RAGGED_N_KV, RAGGED_N_KV};
    const ragged_case c = ragged_kind(0, full, 4, RAGGED_N_KV);
    CHECK_EQ_U(check_ragged_copy(FERRY_COPY_RANGES, &c, NULL), 0);
    CHECK_EQ_U(check_ragged_copy(FERRY_COPY_RAGGED, &c, NULL), 0);
}

/* Unequal lengths: the cost model weighs a copy per stream against the shortest over every
 * stream plus the tails. Calls dear: the shortest and the tails (3 copies for 4 streams, two at
 * the shortest); rows dear: a plain copy per stream, which pays no row. Both exact. */
static void test_ragged_route_by_cost(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 4, .n_layer = 1};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *len;
    ferry_buffer * len_buf;
    const int32_t lens[4] = {5, 9, 5, 9};
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 12, 0, 3, &k, NULL));
    CHECK_OK(host_lengths(&f, lens, 4, &len, &len_buf));
    CHECK_OK(ferry_tensor_set_used_cells(k, len, 1, 3, 0));
    const size_t cell = 128, stream = 24 * cell;
    ferry_copy_cost_model calls = {.call_us = 10, .gbps = 10}, rows = {.call_us = 0.01, .row_ns = 1000, .gbps = 10};
    ferry_copy_2d c[8];
    size_t n;
    CHECK_OK(ferry_copy_ragged_plan(k, &calls, c, 8, &n));
    CHECK_EQ_U(n, 3);
    CHECK(c[0].offset == 0 && c[0].size == 5 * cell && c[0].count == 4 && c[0].stride == stream);
    CHECK(c[1].offset == stream + 5 * cell && c[1].size == 4 * cell && c[1].count == 1);
    CHECK(c[2].offset == 3 * stream + 5 * cell && c[2].size == 4 * cell && c[2].count == 1);
    CHECK_OK(ferry_copy_ragged_plan(k, &rows, c, 8, &n));
    CHECK_EQ_U(n, 4);
    for (size_t i = 0; i < 4; i++) {
        CHECK(c[i].offset == i * stream && c[i].size == (size_t) lens[i] * cell && c[i].count == 1);
    }
    /* counting, and too little room */
    CHECK_OK(ferry_copy_ragged_plan(k, &rows, NULL, 0, &n));
    CHECK_EQ_U(n, 4);
    CHECK_FAILS(ferry_copy_ragged_plan(k, &rows, c, 2, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(n, 4);
    ferry_buffer_free(len_buf);
    kv_fixture_free(&f);
}

/* Refused: a bad annotation when it is set; bad lengths when they are read, with nothing written. */
static void test_ragged_refusals(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_F16, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 4, .n_layer = 1, .v_trans = true};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *v, *len, *copy, *f32, *three, *unplaced;
    ferry_buffer * len_buf;
    int32_t lens[4] = {3, 12, 0, 7};
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 12, 0, 3, &k, &v));
    CHECK_OK(host_lengths(&f, lens, 4, &len, &len_buf));
    const int64_t four = 4, n3 = 3;
    CHECK_OK(ferry_tensor_new(f.ctx, FERRY_TYPE_F32, 1, &four, &f32));
    CHECK_OK(ferry_tensor_new(f.ctx, FERRY_TYPE_I32, 1, &n3, &three));
    CHECK_OK(ferry_tensor_new(f.ctx, FERRY_TYPE_I32, 1, &four, &unplaced));
    CHECK_FAILS(ferry_tensor_set_used_cells(k, f32, 1, 3, 0), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_tensor_set_used_cells(k, three, 1, 3, 0), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "i32 [4]") != NULL);
    CHECK_FAILS(ferry_tensor_set_used_cells(k, len, 3, 3, 0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_set_used_cells(k, len, 1, 4, 0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_set_used_cells(k, len, 1, 3, 11), FERRY_ERR_INVALID_ARG); /* below its 12 cells */
    CHECK_FAILS(ferry_tensor_set_used_cells(k, len, 0, 3, 0), FERRY_ERR_LAYOUT);       /* q8_0 blocks */
    CHECK(k->used_lengths == NULL);
    CHECK_FAILS(ferry_tensor_set_used_cells(NULL, len, 1, 3, 0), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_tensor_set_used_cells(v, len, 0, 3, 16));
    CHECK_OK(kv_split_copy(&f, v, &copy));
    /* at copy time: past the limit, negative, in no host memory, in none at all */
    const int32_t bad[2][4] = {{3, 17, 0, 7}, {3, -1, 0, 7}};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ferry_tensor_set(len, bad[i], 0, sizeof(bad[i])));
        CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RAGGED, v, copy, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), "stream 1's length") != NULL);
    }
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    ferry_tensor * on_device;
    CHECK_OK(ferry_tensor_dup_layout(f.ctx, len, &on_device));
    ferry_buffer * dev_buf;
    CHECK_OK(ferry_backend_alloc_buffer(f.split, 64, &dev_buf));
    CHECK_OK(ferry_buffer_place_tensor(dev_buf, on_device, 0));
    CHECK_OK(ferry_tensor_set_used_cells(v, on_device, 0, 3, 16));
    CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RAGGED, v, copy, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "host memory") != NULL);
    CHECK_OK(ferry_tensor_set_used_cells(v, unplaced, 0, 3, 16));
    CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RAGGED, v, copy, NULL), FERRY_ERR_NOT_ALLOCATED);
    /* cells on dimension 0 of an f16 K (a hand-made annotation): its copies do not pack into the
     * compact layout, whose rows are whole streams; refused, nothing written */
    ferry_kv_params fp = p;
    fp.type_k = FERRY_TYPE_F16;
    ferry_kv_cache * f16_kv;
    CHECK_OK(ferry_kv_cache_new(&fp, ferry_cpu_buffer_type(), &f16_kv));
    ferry_tensor *kf, *kf_copy;
    CHECK_OK(ferry_kv_cache_window(f16_kv, f.ctx, 0, 12, 0, 3, &kf, NULL));
    const int32_t halves[4] = {3, 32, 0, 17};
    CHECK_OK(ferry_tensor_set(len, halves, 0, sizeof(halves)));
    CHECK_OK(ferry_tensor_set_used_cells(kf, len, 0, 3, 0));
    CHECK_OK(ferry_tensor_compact_layout(f.ctx, kf, &kf_copy));
    ferry_buffer * kf_split;
    CHECK_OK(ferry_backend_alloc_buffer(f.split, ferry_tensor_nbytes(kf_copy), &kf_split));
    CHECK_OK(ferry_buffer_place_tensor(kf_split, kf_copy, 0));
    CHECK_OK(ferry_tensor_memset(kf_copy, SENTINEL, 0, ferry_tensor_nbytes(kf_copy)));
    CHECK_FAILS(ferry_copy_input(f.split, FERRY_COPY_RAGGED, kf, kf_copy, NULL), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "does not pack into its compact copy") != NULL);
    uint8_t * untouched = malloc(ferry_tensor_nbytes(kf_copy));
    CHECK(untouched && ferry_tensor_get(kf_copy, untouched, 0, ferry_tensor_nbytes(kf_copy)) == FERRY_OK);
    for (size_t i = 0; i < ferry_tensor_nbytes(kf_copy); i++) CHECK(untouched[i] == SENTINEL);
    free(untouched);
    ferry_buffer_free(kf_split);
    ferry_kv_cache_free(f16_kv);
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));

    ferry_copy_2d c[4];
    size_t n;
    ferry_copy_cost_model m = ferry_copy_cost_model_cpu();
    CHECK_FAILS(ferry_copy_ragged_plan(k, &m, c, 4, &n), FERRY_ERR_INVALID_ARG); /* no lengths */
    CHECK_OK(ferry_tensor_set_used_cells(v, len, 0, 3, 16));
    m.gbps = 0;
    CHECK_FAILS(ferry_copy_ragged_plan(v, &m, c, 4, &n), FERRY_ERR_INVALID_ARG);
    /* nothing was written by the refused copies; the lengths cleared, ragged copies the plan's rows */
    const int64_t none[4] = {0, 0, 0, 0};
    CHECK_EQ_U(kv_check_used_copy(&f, v, copy, none, 0), 0);
    CHECK_OK(ferry_tensor_set_used_cells(v, NULL, 0, 0, 0));
    CHECK(v->used_lengths == NULL);
    ferry_copy_stats s;
    CHECK_OK(ferry_copy_input(f.split, FERRY_COPY_RAGGED, v, copy, &s));
    CHECK(s.path == FERRY_COPY_RAGGED);
    CHECK_EQ_U(s.bytes_copied, 4 * 12 * 64 * 2);
    ferry_buffer_free(dev_buf);
    ferry_buffer_free(len_buf);
    kv_fixture_free(&f);
}

/* A window in another device's memory (a layer resident on one device, read by another): its
 * used cells staged through the host into a device, or read into host memory by get. */
static void test_ragged_device_source(void) {
    const int32_t lens[4] = {0, 19, 6, 11};
    const int64_t used[4] = {0, 19, 6, 11};
    for (int vt = 0; vt < 2; vt++) {
        for (int to_host = 0; to_host < 2; to_host++) {
            ferry_dummy_params dp = ferry_dummy_default_params();
            dp.real_memory = true;
            ferry_backend *dev, *split;
            CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
            if (to_host) {
                CHECK_OK(ferry_cpu_backend_new(&split));
            } else {
                CHECK_OK(ferry_dummy_backend_new(&dp, &split));
            }
            const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 32,
                                       .n_head_kv = 2, .n_ctx = 96, .n_stream = 4, .n_layer = 1, .v_trans = vt};
            kv_fixture f;
            CHECK_OK(kv_fixture_init_on(&f, &p, split, ferry_backend_default_buffer_type(dev)));
            ferry_tensor *v, *len, *copy;
            ferry_buffer * len_buf;
            CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 19, 0, 3, NULL, &v));
            CHECK_OK(host_lengths(&f, lens, 4, &len, &len_buf));
            CHECK_OK(ferry_tensor_set_used_cells(v, len, vt ? 0 : 1, 3, 0));
            CHECK_OK(kv_split_copy(&f, v, &copy));
            ferry_stats before;
            CHECK_OK(ferry_buffer_get_stats(ferry_kv_cache_buffer(f.kv), &before));
            ferry_copy_stats s;
            CHECK_OK(ferry_copy_input(split, FERRY_COPY_RAGGED, v, copy, &s));
            CHECK_EQ_U(kv_check_used_copy(&f, v, copy, used, s.bytes_copied), 0);
            CHECK_EQ_U(s.bytes_copied, 36 * 128);
            ferry_stats after;
            CHECK_OK(ferry_buffer_get_stats(ferry_kv_cache_buffer(f.kv), &after));
            CHECK_EQ_U(after.bytes[FERRY_XFER_GET] + after.bytes[FERRY_XFER_GET_2D] - before.bytes[FERRY_XFER_GET] -
                           before.bytes[FERRY_XFER_GET_2D],
                       36 * 128); /* read from the device: the used cells alone */
            ferry_buffer_free(len_buf);
            kv_fixture_free(&f);
            ferry_backend_free(dev);
        }
    }
}

/*
 * Through the scheduler and attention: a one-call step of a full layer and a sliding one (8
 * cells) on the stand-in, kv_len in host memory, each window's copy on the device filled with
 * NaN before the run. Under ragged the cells past a stream's length keep the NaN, and
 * attention, which reads min(kv_len, its window) cells, gives flat's and ranges' outputs byte
 * for byte; its windows copied exactly min(length, the layer's cells) per stream, K and V.
 */
enum { RA_HEADS = 4, RA_N_KV = 21, RA_LAYERS = 2 };

/* One run over lens (kv_len): its status (*st), and the bytes the device's backend moved in it (*moved). */
static void ragged_attention_run(ferry_type type, bool v_trans, ferry_copy_policy policy, const int32_t * lens,
                                 float * out, uint64_t * window_bytes, uint64_t * moved, ferry_status * st) {
    const ferry_kv_params p = {type, type, 32, 2, 2 * 24, 2, RA_LAYERS, v_trans};
    const int64_t cells[RA_LAYERS] = {0, 8};
    ferry_backend *dev, *cpu;
    CHECK_OK(ferry_standin_backend_new(&dev));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new_layers(&p, ferry_cpu_buffer_type(), NULL, cells, &kv));
    CHECK_OK(fill_cache(kv, RA_LAYERS));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne_q[4] = {32, RA_HEADS, 1, 2}, ne_len[1] = {2};
    const size_t q_bytes = 32 * RA_HEADS * 2 * sizeof(float);
    ferry_buffer *qbuf, *len_buf;
    CHECK_OK(ferry_backend_alloc_buffer(dev, RA_LAYERS * q_bytes, &qbuf));
    ferry_tensor *q[RA_LAYERS], *len;
    CHECK_OK(place_queries(ctx, qbuf, RA_LAYERS, ne_q, q_bytes, q));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 8, &len_buf));
    CHECK_OK(ferry_buffer_place_tensor(len_buf, len, 0));
    CHECK_OK(ferry_tensor_set(len, lens, 0, 2 * sizeof(*lens)));
    ferry_backend * backends[2] = {dev, cpu};
    ferry_sched * sched;
    CHECK_OK(ferry_sched_new(backends, 2, &sched));
    CHECK_OK(ferry_sched_set_policy(sched, policy));
    ferry_graph * graph;
    CHECK_OK(ferry_graph_new(&graph));
    ferry_tensor * outs[RA_LAYERS];
    CHECK_OK(ferry_kv_attention_step(kv, ctx, RA_LAYERS, RA_N_KV, 0, 1, q, len, v_trans, sched, dev, graph, outs));
    CHECK_OK(ferry_sched_alloc_graph(sched, graph));
    *window_bytes = 0;
    for (int i = 0; i < ferry_sched_n_inputs(sched); i++) {
        ferry_sched_input_info in;
        CHECK_OK(ferry_sched_input(sched, i, &in));
        if (in.src->used_lengths) { /* a window: NaN everywhere until its cells arrive */
            CHECK_OK(ferry_tensor_memset(in.copy, 0xff, 0, ferry_tensor_nbytes(in.copy)));
        }
    }
    ferry_stats before, after;
    CHECK_OK(ferry_backend_get_stats(dev, &before));
    *st = ferry_sched_graph_compute(sched, graph);
    CHECK_OK(ferry_backend_get_stats(dev, &after));
    *moved = 0;
    for (int x = 0; x < FERRY_XFER_COUNT; x++) {
        *moved += after.bytes[x] - before.bytes[x];
    }
    for (int i = 0; i < ferry_sched_n_inputs(sched); i++) {
        ferry_sched_input_info in;
        CHECK_OK(ferry_sched_input(sched, i, &in));
        *window_bytes += in.src->used_lengths ? in.stats.bytes_copied : 0;
    }
    for (int l = 0; *st == FERRY_OK && l < RA_LAYERS; l++) {
        CHECK_OK(ferry_tensor_get(outs[l], out + (size_t) l * 32 * RA_HEADS * 2, 0, q_bytes));
    }
    ferry_sched_free(sched);
    ferry_graph_free(graph);
    ferry_buffer_free(qbuf);
    ferry_buffer_free(len_buf);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
    ferry_backend_free(cpu);
    ferry_backend_free(dev);
}

static void test_ragged_attention_same_as_flat_and_ranges(void) {
    enum { N = RA_LAYERS * 32 * RA_HEADS * 2 };
    const struct {
        ferry_type type;
        bool v_trans;
    } kinds[3] = {{FERRY_TYPE_F16, false}, {FERRY_TYPE_F16, true}, {FERRY_TYPE_Q8_0, false}};
    for (int i = 0; i < 3; i++) {
        static float want[N], got[N];
        uint64_t flat_bytes, bytes, moved;
        const int32_t lens[2] = {17, 5};
        ferry_status st;
        SUB(ragged_attention_run(kinds[i].type, kinds[i].v_trans, FERRY_COPY_FLAT, lens, want, &flat_bytes, &moved,
                                 &st));
        CHECK_OK(st);
        for (size_t j = 0; j < N; j++) CHECK(want[j] == want[j]); /* flat wrote every cell: no NaN read */
        const ferry_copy_policy others[2] = {FERRY_COPY_RANGES, FERRY_COPY_RAGGED};
        for (int o = 0; o < 2; o++) {
            SUB(ragged_attention_run(kinds[i].type, kinds[i].v_trans, others[o], lens, got, &bytes, &moved, &st));
            CHECK_OK(st);
            if (memcmp(got, want, sizeof(want)) != 0) {
                fprintf(stderr, "%s%s under %s: outputs differ from flat's\n", ferry_type_name(kinds[i].type),
                        kinds[i].v_trans ? " (V transposed)" : "", ferry_copy_policy_name(others[o]));
                CHECK(false);
            }
        }
        /* the full layer min(17, 21) + min(5, 21) cells, the sliding one min(17, 8) + min(5, 8); K and V */
        CHECK_EQ_U(bytes, ((17 + 5) + (8 + 5)) * 2 * row_of(kinds[i].type, 64));
        CHECK(bytes < flat_bytes);
    }
}

/*
 * A length outside 0..the limit (the step's n_kv, 21; the sliding layer's 8 cells below it) gets one
 * answer from every policy: ferry_copy_input refuses it, and a scheduler's run before its first copy,
 * naming the stream, the length and the bound, with no byte moved. (flat, ranges and plan copied the
 * window and attention clamped the length; ragged refused it.)
 */
static void test_lengths_outside_the_limit_refused_by_every_policy(void) {
    const int32_t bad[4] = {-3, RA_N_KV + 1, INT32_MAX, INT32_MIN};
    char want[64];
    for (int b = 0; b < 4; b++) {
        for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
            static float out[RA_LAYERS * 32 * RA_HEADS * 2];
            const int32_t lens[2] = {5, bad[b]};
            uint64_t bytes, moved;
            ferry_status st;
            ferry_clear_error();
            SUB(ragged_attention_run(FERRY_TYPE_F16, false, (ferry_copy_policy) policy, lens, out, &bytes, &moved, &st));
            CHECK(st == FERRY_ERR_OUT_OF_BOUNDS);
            snprintf(want, sizeof want, "stream 1's length %d (of its unnamed lengths) is not in 0..%d", (int) bad[b], RA_N_KV);
            CHECK(strstr(ferry_last_error(), want) != NULL);
            CHECK_EQ_U(moved, 0);
        }
    }
    /* the copy path alone: a window carrying lengths, under every policy, nothing written */
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 4, .n_layer = 1};
    kv_fixture f;
    CHECK_OK(kv_fixture_init(&f, &p));
    ferry_tensor *k, *len, *copy;
    ferry_buffer * len_buf;
    const int32_t lens[4] = {3, 12, -1, 7};
    CHECK_OK(ferry_kv_cache_window(f.kv, f.ctx, 0, 12, 0, 3, &k, NULL));
    CHECK_OK(host_lengths(&f, lens, 4, &len, &len_buf));
    CHECK_OK(ferry_tensor_set_used_cells(k, len, 1, 3, 0));
    CHECK_OK(kv_split_copy(&f, k, &copy));
    for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        CHECK_FAILS(ferry_copy_input(f.split, (ferry_copy_policy) policy, k, copy, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), "stream 2's length -1") != NULL);
        CHECK_FAILS(ferry_copy_input_async(f.split, (ferry_copy_policy) policy, k, copy, NULL),
                    FERRY_ERR_OUT_OF_BOUNDS);
    }
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(f.split_buf, &s));
    for (int x = 0; x < FERRY_XFER_COUNT; x++) CHECK_EQ_U(s.bytes[x], 0);
    const int64_t none[4] = {0, 0, 0, 0};
    CHECK_EQ_U(kv_check_used_copy(&f, k, copy, none, 0), 0);
    ferry_buffer_free(len_buf);
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
    {"ragged_windows_sentinel", test_ragged_windows_sentinel},
    {"ragged_sentinel_fails_under_ranges", test_ragged_sentinel_fails_under_ranges},
    {"ragged_route_by_cost", test_ragged_route_by_cost},
    {"ragged_refusals", test_ragged_refusals},
    {"ragged_device_source", test_ragged_device_source},
    {"ragged_attention_same_as_flat_and_ranges", test_ragged_attention_same_as_flat_and_ranges},
    {"lengths_outside_the_limit_refused_by_every_policy", test_lengths_outside_the_limit_refused_by_every_policy},
};

CHECK_MAIN(tests)
