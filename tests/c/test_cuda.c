/*
 * The CUDA backend. Built only when CUDA is; every test that needs a device exits 77
 * without one, which meson reports as SKIP (CI has nvcc but no GPU).
 * without_a_device_cuda_gives_statuses_not_aborts runs everywhere: it checks what a machine
 * without a GPU must see.
 *
 * test_ordered_multi_stream_ranges against a CUDA split backend: test_cuda_sched.c.
 */
#include "check.h"

#include <math.h>
#include <stdint.h>

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

/* A byte that no other index shares for a long period. */
static uint8_t pattern(size_t i) { return (uint8_t) ((i * 2654435761u) >> 13) ^ (uint8_t) (i >> 8); }

#define SENTINEL 0xA5

typedef struct {
    ferry_context * ctx;
    ferry_backend * cuda;
    ferry_buffer * buf;
    ferry_tensor * t; /* I32 [n] in buf, so its bytes are the test's */
} fixture;

static ferry_status fixture_new(fixture * f, size_t nbytes) {
    memset(f, 0, sizeof(*f));
    ferry_status st = ferry_context_new(&f->ctx);
    if (st == FERRY_OK) st = ferry_cuda_backend_new(0, &f->cuda);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->cuda, nbytes, &f->buf);
    const int64_t ne[1] = {(int64_t) (nbytes / 4)};
    if (st == FERRY_OK) st = ferry_tensor_new(f->ctx, FERRY_TYPE_I32, 1, ne, &f->t);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->buf, f->t, 0);
    return st;
}

static void fixture_free(fixture * f) {
    ferry_buffer_free(f->buf);
    ferry_backend_free(f->cuda);
    ferry_context_free(f->ctx);
}

/* What a machine without a GPU must see: no abort, statuses with CUDA's reason. */
static void test_without_a_device_cuda_gives_statuses_not_aborts(void) {
    CHECK(ferry_built_with_cuda());
    int n = -1;
    CHECK_OK(ferry_cuda_device_count(&n));
    CHECK(n >= 0);
    CHECK(ferry_cuda_available() == (n > 0));
    ferry_backend * b = NULL;
    if (n == 0) {
        CHECK_FAILS(ferry_cuda_backend_new(0, &b), FERRY_ERR_BACKEND);
        CHECK(strstr(ferry_last_error(), "CUDA") != NULL);
        ferry_buffer_type * buft = NULL;
        CHECK_FAILS(ferry_cuda_buffer_type(0, &buft), FERRY_ERR_BACKEND);
        CHECK_FAILS(ferry_cuda_host_buffer_type(&buft), FERRY_ERR_BACKEND);
    } else {
        CHECK_FAILS(ferry_cuda_backend_new(n + 100, &b), FERRY_ERR_INVALID_ARG);
        CHECK_FAILS(ferry_cuda_backend_new(-1, &b), FERRY_ERR_INVALID_ARG);
    }
    CHECK(b == NULL);
    CHECK_FAILS(ferry_cuda_backend_new(0, NULL), FERRY_ERR_INVALID_ARG);
    /* The CPU backend has no events; the CUDA device query does not disturb it. */
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_event * ev;
    CHECK_FAILS(ferry_event_new(cpu, 0, &ev), FERRY_ERR_UNSUPPORTED);
    int dev;
    CHECK_FAILS(ferry_cuda_backend_device(cpu, &dev), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_hold(cpu, 10.0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_hold(NULL, 10.0), FERRY_ERR_INVALID_ARG);
    ferry_backend_free(cpu);
}

/* Rows into device memory with one 2-D copy on the stream, and back; every byte
 * outside the rows keeps the sentinel, on the device and on the host. */
static void test_round_trip_2d(void) {
    need_device();
    const size_t row = 1088, pitch = 5 * 1088 + 64, n_rows = 7, offset = 256 + 34;
    const size_t nbytes = (offset + pitch * n_rows + 4096 + 3) & ~(size_t) 3; /* whole I32 elements */
    fixture f;
    CHECK_OK(fixture_new(&f, nbytes));
    CHECK(!ferry_buffer_is_host(f.buf));
    CHECK(ferry_backend_has_2d(f.cuda));
    uint8_t * src = malloc(row * n_rows * 3);
    uint8_t * back = malloc(nbytes);
    CHECK(src && back);
    const size_t src_pitch = row * 3; /* the host side is strided too */
    for (size_t i = 0; i < row * n_rows * 3; i++) src[i] = pattern(i);

    CHECK_OK(ferry_tensor_memset(f.t, SENTINEL, 0, nbytes));
    ferry_backend_reset_stats(f.cuda);
    CHECK_OK(ferry_backend_tensor_set_2d_async(f.cuda, f.t, src, offset, row, n_rows, pitch, src_pitch));
    CHECK_OK(ferry_backend_synchronize(f.cuda));
    ferry_stats s;
    CHECK_OK(ferry_backend_get_stats(f.cuda, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET_2D], row * n_rows);
    CHECK_EQ_U(s.impl_calls[FERRY_XFER_SET_2D], 1);

    CHECK_OK(ferry_tensor_get(f.t, back, 0, nbytes));
    for (size_t i = 0; i < nbytes; i++) {
        const bool in_row = i >= offset && (i - offset) % pitch < row && (i - offset) / pitch < n_rows;
        const uint8_t want = in_row ? src[((i - offset) / pitch) * src_pitch + (i - offset) % pitch] : SENTINEL;
        if (back[i] != want) {
            fprintf(stderr, "byte %zu: %u, want %u (%s)\n", i, back[i], want, in_row ? "row" : "gap");
            CHECK(back[i] == want);
        }
    }

    /* Back through the stream into a strided host array whose gaps hold a sentinel. */
    uint8_t * dst = malloc(row * n_rows * 3);
    CHECK(dst);
    memset(dst, SENTINEL ^ 0xFF, row * n_rows * 3);
    CHECK_OK(ferry_backend_tensor_get_2d_async(f.cuda, f.t, dst, offset, row, n_rows, pitch, src_pitch));
    CHECK_OK(ferry_backend_synchronize(f.cuda));
    for (size_t i = 0; i < row * n_rows * 3; i++) {
        const bool in_row = i % src_pitch < row;
        CHECK(dst[i] == (in_row ? src[i] : (uint8_t) (SENTINEL ^ 0xFF)));
    }

    /* The blocking buffer path does the same. */
    CHECK_OK(ferry_tensor_memset(f.t, SENTINEL, 0, nbytes));
    CHECK_OK(ferry_tensor_set_2d(f.t, src, offset, row, n_rows, pitch, src_pitch));
    memset(dst, 0, row * n_rows * 3);
    CHECK_OK(ferry_tensor_get_2d(f.t, dst, offset, row, n_rows, pitch, src_pitch));
    for (size_t r = 0; r < n_rows; r++) CHECK(memcmp(dst + r * src_pitch, src + r * src_pitch, row) == 0);
    CHECK_OK(ferry_tensor_get(f.t, back, offset + row, pitch - row));
    for (size_t i = 0; i < pitch - row; i++) CHECK(back[i] == SENTINEL);

    /* Out of bounds is refused before CUDA sees it. */
    CHECK_FAILS(ferry_backend_tensor_set_2d_async(f.cuda, f.t, src, offset, row, n_rows + 100, pitch, src_pitch),
                FERRY_ERR_OUT_OF_BOUNDS);
    free(src);
    free(back);
    free(dst);
    fixture_free(&f);
}

static void test_device_memset_writes_its_range_and_counts_it(void) {
    need_device();
    const size_t nbytes = 1 << 20;
    fixture f;
    CHECK_OK(fixture_new(&f, nbytes));
    CHECK_OK(ferry_buffer_clear(f.buf, 0x11));
    CHECK_OK(ferry_tensor_memset(f.t, 0x7E, 1000, 5000));
    uint8_t * back = malloc(nbytes);
    CHECK(back);
    CHECK_OK(ferry_tensor_get(f.t, back, 0, nbytes));
    for (size_t i = 0; i < nbytes; i++) CHECK(back[i] == ((i >= 1000 && i < 6000) ? 0x7E : 0x11));
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(f.buf, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_MEMSET], nbytes + 5000);
    free(back);
    fixture_free(&f);
}

/* Device to device: the blocking buffer copy and the backend's copy on its stream. */
static void test_device_copies_land_blocking_and_on_the_stream(void) {
    need_device();
    const size_t nbytes = 3 << 20;
    fixture a, b;
    CHECK_OK(fixture_new(&a, nbytes));
    CHECK_OK(fixture_new(&b, nbytes));
    uint8_t * src = malloc(nbytes);
    uint8_t * back = malloc(nbytes);
    CHECK(src && back);
    for (size_t i = 0; i < nbytes; i++) src[i] = pattern(i);
    CHECK_OK(ferry_tensor_set(a.t, src, 0, nbytes));

    ferry_buffer_reset_stats(b.buf);
    CHECK_OK(ferry_tensor_copy(a.t, b.t));
    ferry_stats s;
    CHECK_OK(ferry_buffer_get_stats(b.buf, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_COPY], nbytes);
    CHECK_EQ_U(s.bytes[FERRY_XFER_SET], 0); /* not staged through the host */
    CHECK_OK(ferry_tensor_get(b.t, back, 0, nbytes));
    CHECK(memcmp(src, back, nbytes) == 0);

    /* a's backend wrote last; b's stream waits for it before copying back. */
    for (size_t i = 0; i < nbytes; i++) src[i] = pattern(i + 12345);
    CHECK_OK(ferry_backend_tensor_set_async(a.cuda, a.t, src, 0, nbytes));
    CHECK_OK(ferry_backend_tensor_copy_async(a.cuda, b.cuda, a.t, b.t));
    CHECK_OK(ferry_backend_synchronize(b.cuda));
    CHECK_OK(ferry_backend_get_stats(b.cuda, &s));
    CHECK_EQ_U(s.bytes[FERRY_XFER_COPY], nbytes);
    CHECK_OK(ferry_tensor_get(b.t, back, 0, nbytes));
    CHECK(memcmp(src, back, nbytes) == 0);
    free(src);
    free(back);
    fixture_free(&a);
    fixture_free(&b);
}

/* Pinned host memory is host memory: the CPU backend writes it, CUDA reads it. */
static void test_pinned_memory_is_host_memory_cuda_reads(void) {
    need_device();
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    CHECK(ferry_buffer_type_is_host(pinned));
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK(ferry_backend_supports_buft(cpu, pinned));
    fixture f;
    const size_t nbytes = 1 << 16;
    CHECK_OK(fixture_new(&f, nbytes));
    CHECK(!ferry_backend_supports_buft(f.cuda, pinned)); /* kernels take device memory only */
    CHECK(!ferry_backend_supports_buft(f.cuda, ferry_cpu_buffer_type()));

    ferry_buffer * hbuf;
    CHECK_OK(ferry_buffer_type_alloc_buffer(pinned, nbytes, &hbuf));
    CHECK(ferry_buffer_is_host(hbuf));
    ferry_tensor * h;
    const int64_t ne[1] = {(int64_t) (nbytes / 4)};
    CHECK_OK(ferry_tensor_new(f.ctx, FERRY_TYPE_I32, 1, ne, &h));
    CHECK_OK(ferry_buffer_place_tensor(hbuf, h, 0));
    uint8_t * src = malloc(nbytes);
    uint8_t * back = malloc(nbytes);
    CHECK(src && back);
    for (size_t i = 0; i < nbytes; i++) src[i] = pattern(i);
    /* The CPU backend's 2-D set into pinned memory is the host buffer's row loop. */
    CHECK_OK(ferry_backend_tensor_set_2d_async(cpu, h, src, 0, nbytes / 4, 4, nbytes / 4, nbytes / 4));
    CHECK(memcmp(ferry_buffer_base(hbuf), src, nbytes) == 0);
    /* Host to device: the plain set from pinned memory, then the stream's set from it. */
    CHECK_OK(ferry_tensor_copy(h, f.t));
    CHECK_OK(ferry_tensor_get(f.t, back, 0, nbytes));
    CHECK(memcmp(src, back, nbytes) == 0);
    CHECK_OK(ferry_tensor_memset(f.t, 0, 0, nbytes));
    CHECK_OK(ferry_backend_tensor_set_async(f.cuda, f.t, ferry_buffer_base(hbuf), 0, nbytes));
    CHECK_OK(ferry_backend_synchronize(f.cuda));
    CHECK_OK(ferry_tensor_get(f.t, back, 0, nbytes));
    CHECK(memcmp(src, back, nbytes) == 0);
    /* Pinned tensors are the CPU's to write; the CUDA backend refuses them. */
    CHECK_OK(ferry_backend_tensor_get_async(f.cuda, f.t, back, 0, nbytes));
    CHECK_OK(ferry_backend_synchronize(f.cuda));
    CHECK_FAILS(ferry_backend_tensor_set_async(f.cuda, h, back, 0, nbytes), FERRY_ERR_UNSUPPORTED);
    CHECK(memcmp(back, src, nbytes) == 0);
    free(src);
    free(back);
    ferry_buffer_free(hbuf);
    ferry_backend_free(cpu);
    fixture_free(&f);
}

/* Two streams ordered by an event, not a synchronize: b's copy of x sees a's writes. */
static void test_an_event_orders_two_streams_without_a_sync(void) {
    need_device();
    const size_t nbytes = 64 << 20; /* long enough that an unordered copy would see stale bytes */
    fixture a, b;
    CHECK_OK(fixture_new(&a, nbytes));
    CHECK_OK(fixture_new(&b, nbytes));
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    ferry_buffer * hbuf;
    CHECK_OK(ferry_buffer_type_alloc_buffer(pinned, nbytes, &hbuf));
    uint8_t * host = ferry_buffer_base(hbuf);
    for (size_t i = 0; i < nbytes; i++) host[i] = pattern(i);
    CHECK_OK(ferry_buffer_clear(a.buf, 0));
    CHECK_OK(ferry_buffer_clear(b.buf, 0));

    ferry_event *done, *t0, *t1;
    CHECK_OK(ferry_event_new(a.cuda, 0, &done));
    CHECK_OK(ferry_event_new(a.cuda, FERRY_EVENT_TIMING, &t0));
    CHECK_OK(ferry_event_new(a.cuda, FERRY_EVENT_TIMING, &t1));
    CHECK_OK(ferry_event_record(t0, a.cuda));
    CHECK_OK(ferry_backend_tensor_set_async(a.cuda, a.t, host, 0, nbytes));
    CHECK_OK(ferry_event_record(t1, a.cuda));
    CHECK_OK(ferry_event_record(done, a.cuda));
    CHECK_OK(ferry_event_wait(b.cuda, done));
    /* The same-backend copy path: b's stream copies a's tensor into b's. */
    CHECK_OK(ferry_backend_tensor_copy_async(b.cuda, b.cuda, a.t, b.t));
    CHECK_OK(ferry_backend_synchronize(b.cuda));
    uint8_t * back = malloc(nbytes);
    CHECK(back);
    CHECK_OK(ferry_tensor_get(b.t, back, 0, nbytes));
    CHECK(memcmp(back, host, nbytes) == 0);

    CHECK_OK(ferry_event_synchronize(t1));
    float ms = -1;
    CHECK_OK(ferry_event_elapsed_ms(t0, t1, &ms));
    CHECK(ms > 0);
    printf("64 MiB pinned host to device: %.3f ms, %.1f GB/s\n", ms, nbytes / (ms * 1e6));
    /* A light event cannot be timed; the error is CUDA's, as a status. */
    CHECK_FAILS(ferry_event_elapsed_ms(t0, done, &ms), FERRY_ERR_BACKEND);
    /* The CPU backend waits on the host; it cannot record a CUDA event. */
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_event_wait(cpu, done));
    CHECK_FAILS(ferry_event_record(done, cpu), FERRY_ERR_INVALID_ARG);
    ferry_backend_free(cpu);
    ferry_event_free(done);
    ferry_event_free(t0);
    ferry_event_free(t1);
    free(back);
    ferry_buffer_free(hbuf);
    fixture_free(&a);
    fixture_free(&b);
}

/* The hold keeps the stream busy on the device for at least the time asked (a lower
 * bound: the device cannot wait less), and work queued behind it runs after it. */
static void test_a_hold_delays_the_work_queued_behind_it(void) {
    need_device();
    fixture f;
    CHECK_OK(fixture_new(&f, 1 << 20));
    CHECK_FAILS(ferry_cuda_backend_hold(f.cuda, -1.0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_hold(f.cuda, 2e6), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_hold(f.cuda, NAN), FERRY_ERR_INVALID_ARG);
    ferry_event *t0, *t1;
    CHECK_OK(ferry_event_new(f.cuda, FERRY_EVENT_TIMING, &t0));
    CHECK_OK(ferry_event_new(f.cuda, FERRY_EVENT_TIMING, &t1));
    uint8_t * host = malloc(1 << 20);
    CHECK(host);
    for (size_t i = 0; i < (1 << 20); i++) host[i] = pattern(i);
    CHECK_OK(ferry_buffer_clear(f.buf, 0));
    CHECK_OK(ferry_event_record(t0, f.cuda));
    CHECK_OK(ferry_cuda_backend_hold(f.cuda, 2000.0));
    CHECK_OK(ferry_backend_tensor_set_async(f.cuda, f.t, host, 0, 1 << 20));
    CHECK_OK(ferry_event_record(t1, f.cuda));
    CHECK_OK(ferry_event_synchronize(t1));
    float ms = 0;
    CHECK_OK(ferry_event_elapsed_ms(t0, t1, &ms));
    printf("hold of 2000 us, then 1 MiB: %.3f ms between the events\n", ms);
    /* The SM's cycles at its peak clock: never less than asked (the fake runtime sleeps the
     * cycles at its own 2 GHz, so nanoseconds passed as cycles would wait 1 ms) */
    CHECK(ms >= 1.9f);
    uint8_t * back = malloc(1 << 20);
    CHECK(back);
    CHECK_OK(ferry_tensor_get(f.t, back, 0, 1 << 20));
    CHECK(memcmp(back, host, 1 << 20) == 0);
    free(back);
    free(host);
    ferry_event_free(t0);
    ferry_event_free(t1);
    fixture_free(&f);
}

/* A CUDA failure is a status with CUDA's message, and the process goes on working. */
static void test_a_cuda_failure_is_a_status_and_work_goes_on(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    ferry_buffer * buf = NULL;
    CHECK_FAILS(ferry_backend_alloc_buffer(cuda, (size_t) 1 << 52, &buf), FERRY_ERR_OUT_OF_MEMORY);
    CHECK(strstr(ferry_last_error(), "cudaMalloc") != NULL);
    CHECK(strstr(ferry_last_error(), "out of memory") != NULL);
    CHECK(buf == NULL);
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    ferry_clear_error();
    const ferry_status st = ferry_buffer_type_alloc_buffer(pinned, (size_t) 1 << 52, &buf);
    CHECK(st == FERRY_ERR_OUT_OF_MEMORY || st == FERRY_ERR_BACKEND);
    CHECK(strstr(ferry_last_error(), "cudaMallocHost") != NULL);
    /* Still usable afterwards. */
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 1 << 20, &buf));
    CHECK_OK(ferry_buffer_clear(buf, 1));
    CHECK_OK(ferry_backend_synchronize(cuda));
    ferry_buffer_free(buf);
    ferry_backend_free(cuda);
}

static const check_test tests[] = {
    {"without_a_device_cuda_gives_statuses_not_aborts", test_without_a_device_cuda_gives_statuses_not_aborts},
    {"round_trip_2d", test_round_trip_2d},
    {"device_memset_writes_its_range_and_counts_it", test_device_memset_writes_its_range_and_counts_it},
    {"device_copies_land_blocking_and_on_the_stream", test_device_copies_land_blocking_and_on_the_stream},
    {"pinned_memory_is_host_memory_cuda_reads", test_pinned_memory_is_host_memory_cuda_reads},
    {"an_event_orders_two_streams_without_a_sync", test_an_event_orders_two_streams_without_a_sync},
    {"a_cuda_failure_is_a_status_and_work_goes_on", test_a_cuda_failure_is_a_status_and_work_goes_on},
    {"a_hold_delays_the_work_queued_behind_it", test_a_hold_delays_the_work_queued_behind_it},
};

CHECK_MAIN(tests)
