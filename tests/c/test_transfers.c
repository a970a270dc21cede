/* Transfers: plain and 2-D set/get through each backend and the generic fallback, memset,
 * copies between backends, their counters, and the transfers refused. */
#include "check.h"

#include <stdint.h>

/* A byte pattern with a long period, so a row from the wrong place is seen. */
static uint8_t pattern(size_t i) { return (uint8_t) ((i * 2654435761u) >> 13); }

/* An i32 tensor of n values in a buffer of its own on backend. */
static void i32_tensor_on(ferry_backend * backend, ferry_context * ctx, int64_t n, ferry_tensor ** t,
                          ferry_buffer ** buf) {
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &n, t));
    CHECK_OK(ferry_backend_alloc_buffer(backend, ferry_tensor_nbytes(*t), buf));
    CHECK_OK(ferry_buffer_place_tensor(*buf, *t, 0));
}

/* 2-D set then get on a backend: rows land at offset + i*stride_tensor; nothing else changes. */
static void round_trip_2d(ferry_backend * backend, bool expect_native_2d) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t = NULL;
    ferry_buffer * buf = NULL;
    i32_tensor_on(backend, ctx, 4096, &t, &buf); /* 16384 bytes */
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

/* The stand-in writes its memory past the host's cache for bulk transfers and by inline moves
 * for short rows (standin/device-copy.c): every way a set reaches it (blocking, the backend's
 * queue, the copy queue's worker) lands each row whatever its size and alignment, the bytes
 * around it untouched. Each case is mirrored by memmove into a host copy and compared whole. */
typedef enum { VIA_BLOCKING, VIA_BACKEND, VIA_COPY_QUEUE } set_via;

static void standin_rows_case(ferry_backend * dev, ferry_tensor * t, uint8_t * mirror, uint8_t * back,
                              const uint8_t * src, size_t offset, size_t size, size_t rows, size_t stride_t,
                              size_t stride_d, set_via via) {
    const size_t nbytes = ferry_tensor_nbytes(t);
    memset(mirror, 0xA5, nbytes);
    CHECK_OK(ferry_tensor_set(t, mirror, 0, nbytes));
    for (size_t r = 0; r < rows; r++) {
        memmove(mirror + offset + r * stride_t, src + r * stride_d, size);
    }
    ferry_backend * queue = dev;
    if (via == VIA_COPY_QUEUE) {
        CHECK_OK(ferry_backend_get_copy_queue(dev, &queue));
    }
    if (via == VIA_BLOCKING) {
        CHECK_OK(rows == 1 ? ferry_tensor_set(t, src, offset, size)
                           : ferry_tensor_set_2d(t, src, offset, size, rows, stride_t, stride_d));
    } else {
        CHECK_OK(rows == 1 ? ferry_backend_tensor_set_async(queue, t, src, offset, size)
                           : ferry_backend_tensor_set_2d_async(queue, t, src, offset, size, rows, stride_t, stride_d));
        CHECK_OK(ferry_backend_synchronize(queue));
    }
    CHECK_OK(ferry_tensor_get(t, back, 0, nbytes));
    size_t first_bad = nbytes;
    for (size_t b = 0; b < nbytes && first_bad == nbytes; b++) {
        first_bad = back[b] != mirror[b] ? b : nbytes;
    }
    if (first_bad != nbytes) {
        printf("via %d: rows of %zu bytes x %zu at offset %zu: byte %zu is %u, not %u\n", (int) via, size, rows,
               offset, first_bad, back[first_bad], mirror[first_bad]);
    }
    CHECK_EQ_U(first_bad, nbytes);
}

static void test_standin_rows_land_whatever_their_size(void) {
    ferry_backend * dev;
    CHECK_OK(ferry_standin_backend_new(&dev));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t = NULL;
    ferry_buffer * buf = NULL;
    i32_tensor_on(dev, ctx, (10 << 20) / 4, &t, &buf); /* 10 MiB */
    const size_t nbytes = ferry_tensor_nbytes(t);
    uint8_t * src = malloc(nbytes), * mirror = malloc(nbytes), * back = malloc(nbytes);
    for (size_t i = 0; i < nbytes; i++) {
        src[i] = pattern(i);
    }
    static const size_t short_sizes[] = {1, 15, 16, 17, 31, 32, 33, 127, 128, 129};
    for (int via = VIA_BLOCKING; via <= VIA_COPY_QUEUE; via++) {
        /* bulk: one plain transfer past 4 MiB, its head and tail unaligned */
        standin_rows_case(dev, t, mirror, back, src + 5, 3, (4 << 20) + 37, 1, 0, 0, (set_via) via);
        /* bulk: rows of 16 KiB and a few bytes, 260 of them (over 4 MiB), odd strides both sides */
        standin_rows_case(dev, t, mirror, back, src + 1, 7, (16 << 10) + 5, 260, (16 << 10) + 77, (16 << 10) + 9,
                          (set_via) via);
        for (size_t i = 0; i < sizeof(short_sizes) / sizeof(short_sizes[0]); i++) {
            standin_rows_case(dev, t, mirror, back, src + 3, 11, short_sizes[i], 9, 4099, short_sizes[i] + 13,
                              (set_via) via);
        }
    }
    free(src);
    free(mirror);
    free(back);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
}

/* Blocking 2-D transfers through the buffer, and plain set/get counters. */
static void test_buffer_2d_transfers_land_and_are_counted(void) {
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

static void test_copies_land_between_backends_same_layout_only(void) {
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

static void test_bad_transfers_are_refused_with_their_status(void) {
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
    /* nothing to do: a zero-byte memset succeeds and counts nothing */
    ferry_stats before, after;
    CHECK_OK(ferry_buffer_get_stats(buf, &before));
    CHECK_OK(ferry_tensor_memset(t, 7, 1024, 0));
    CHECK_OK(ferry_buffer_get_stats(buf, &after));
    CHECK_EQ_U(after.calls[FERRY_XFER_MEMSET], before.calls[FERRY_XFER_MEMSET]);
    /* an async copy of a tensor not yet placed */
    CHECK_FAILS(ferry_backend_tensor_copy_async(cpu, cpu, unalloc, t), FERRY_ERR_NOT_ALLOCATED);
    CHECK_FAILS(ferry_backend_tensor_set_async(cpu, unalloc, data, 0, 4), FERRY_ERR_NOT_ALLOCATED);

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

/* ferry_tensor_check_transfer refuses what the transfers refuse, with the same status,
 * and its message names the caller's operation. */
static void test_check_transfer_refuses_as_the_transfers_do(void) {
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
    /* rows whose extent passes size_t are out of bounds, not wrapped round to a small end:
     * the last row's start, the offset added to it, the row's size added to that */
    const size_t half = (size_t) 1 << 63;
    CHECK_FAILS(ferry_tensor_check_transfer(t, 0, 8, 3, half, 8, "probe"), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 4, 8, 2, half + (half - 2), 8, "probe"), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_tensor_check_transfer(t, 4, 8, 2, half + (half - 8), 8, "probe"), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "2 rows of 8 bytes at offset 4") != NULL);
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

static const check_test tests[] = {
    {"round_trip_2d_cpu", test_round_trip_2d_cpu},
    {"round_trip_2d_dummy_real", test_round_trip_2d_dummy_real},
    {"round_trip_2d_fallback", test_round_trip_2d_fallback},
    {"buffer_2d_transfers_land_and_are_counted", test_buffer_2d_transfers_land_and_are_counted},
    {"standin_rows_land_whatever_their_size", test_standin_rows_land_whatever_their_size},
    {"copies_land_between_backends_same_layout_only", test_copies_land_between_backends_same_layout_only},
    {"bad_transfers_are_refused_with_their_status", test_bad_transfers_are_refused_with_their_status},
    {"check_transfer_refuses_as_the_transfers_do", test_check_transfer_refuses_as_the_transfers_do},
};

CHECK_MAIN(tests)
