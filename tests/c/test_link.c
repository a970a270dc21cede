/*
 * The stand-in device's link and memory, and what every backend says of its memory.
 *
 * The link's checks here are what its model guarantees on any host, busy or not: a transfer
 * never completes sooner than latency + bytes / bandwidth (each run, strictly), and a link
 * faster than the host can copy is counted late. How close to the model a transfer comes is
 * the host's to give, not a verdict: tools/link-accuracy measures it and prints the figures.
 */
#include "check.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define MIB ((size_t) 1 << 20)
#define LATENCY_US 30.0
#define RUNS 3

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static ferry_status standin(double gbps, double latency_us, size_t memory, ferry_backend ** out) {
    const ferry_standin_params p = {.link_gbps = gbps, .latency_us = latency_us, .memory = memory};
    return ferry_standin_backend_new_params(&p, out);
}

/* A byte tensor of n bytes (f32 elements) in a buffer of its own on backend. */
static ferry_status byte_tensor(ferry_backend * backend, ferry_context * ctx, size_t n, ferry_tensor ** t,
                                ferry_buffer ** buf) {
    const int64_t ne = (int64_t) (n / 4);
    ferry_status st = ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, &ne, t);
    if (st == FERRY_OK) {
        st = ferry_backend_alloc_buffer(backend, n, buf);
    }
    return st == FERRY_OK ? ferry_buffer_place_tensor(*buf, *t, 0) : st;
}

typedef enum { XFER_SET, XFER_GET, XFER_SET_2D, XFER_GET_2D, XFER_QUEUE_SET, XFER_QUEUE_SET_2D, XFER_KINDS } xfer;
static const char * const xfer_names[XFER_KINDS] = {"set", "get", "set_2d", "get_2d", "queue set", "queue set_2d"};

/* 2-D transfers: rows of ROW bytes, every other row of the tensor, the host side packed. */
#define ROW 4096

/* One transfer of `bytes` of kind k between host and t, done when this returns, and the time
 * it took: on the host's clock, or for a queued one between the queue's events around it (the
 * worker's time, as a GPU's copy is timed by its stream's events, without the waiting
 * thread's own turn on a busy core). */
static ferry_status transfer(ferry_backend * device, ferry_tensor * t, char * host, size_t bytes, xfer k,
                             double * took) {
    const size_t rows = bytes / ROW;
    const double t0 = now();
    ferry_status st = FERRY_OK;
    switch (k) {
    case XFER_SET: st = ferry_tensor_set(t, host, 0, bytes); break;
    case XFER_GET: st = ferry_tensor_get(t, host, 0, bytes); break;
    case XFER_SET_2D: st = ferry_tensor_set_2d(t, host, 0, ROW, rows, 2 * ROW, ROW); break;
    case XFER_GET_2D: st = ferry_tensor_get_2d(t, host, 0, ROW, rows, 2 * ROW, ROW); break;
    default: {
        ferry_backend * queue = NULL;
        ferry_event *ev0 = NULL, *ev1 = NULL;
        float ms = 0;
        st = ferry_backend_get_copy_queue(device, &queue);
        st = st == FERRY_OK ? ferry_event_new(queue, FERRY_EVENT_TIMING, &ev0) : st;
        st = st == FERRY_OK ? ferry_event_new(queue, FERRY_EVENT_TIMING, &ev1) : st;
        st = st == FERRY_OK ? ferry_event_record(ev0, queue) : st;
        if (st == FERRY_OK) {
            st = k == XFER_QUEUE_SET ? ferry_backend_tensor_set_async(queue, t, host, 0, bytes)
                                     : ferry_backend_tensor_set_2d_async(queue, t, host, 0, ROW, rows, 2 * ROW, ROW);
        }
        st = st == FERRY_OK ? ferry_event_record(ev1, queue) : st;
        st = st == FERRY_OK ? ferry_event_synchronize(ev1) : st;
        st = st == FERRY_OK ? ferry_event_elapsed_ms(ev0, ev1, &ms) : st;
        ferry_event_free(ev0);
        ferry_event_free(ev1);
        *took = 1e-3 * ms * (1 + 1e-6); /* float milliseconds: no rounding below the model */
        return st;
    }
    }
    *took = now() - t0;
    return st;
}

/* Every kind of transfer of 4 MiB over a link of gbps, a few runs each: never sooner than
 * modelled, and each counted by the link. */
static void link_takes_its_time(double gbps) {
    const size_t bytes = 4 * MIB;
    const double modelled = LATENCY_US * 1e-6 + (double) bytes / (gbps * 1e9);
    ferry_backend * device;
    CHECK_OK(standin(gbps, LATENCY_US, 0, &device));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    CHECK_OK(byte_tensor(device, ctx, 2 * bytes, &t, &buf)); /* room for the 2-D rows' gaps */
    char * host = malloc(bytes);
    CHECK(host);
    memset(host, 7, bytes);
    for (int k = 0; k < XFER_KINDS; k++) {
        double took = 0, best = INFINITY;
        CHECK_OK(transfer(device, t, host, bytes, (xfer) k, &took)); /* warm: pages touched, worker started */
        for (int i = 0; i < RUNS; i++) {
            CHECK_OK(transfer(device, t, host, bytes, (xfer) k, &took));
            if (took < modelled) {
                fprintf(stderr, "%s at %g GB/s took %.3f ms, less than the modelled %.3f ms\n", xfer_names[k], gbps,
                        1e3 * took, 1e3 * modelled);
                CHECK(took >= modelled);
            }
            best = took < best ? took : best;
        }
        printf("%-12s %5.2f GB/s: modelled %.3f ms, best of %d %.3f ms\n", xfer_names[k], gbps, 1e3 * modelled, RUNS,
               1e3 * best);
    }
    ferry_link_stats stats;
    CHECK_OK(ferry_standin_get_link(device, NULL, &stats));
    CHECK(stats.transfers >= (1 + RUNS) * XFER_KINDS);
    CHECK(stats.modelled_seconds >= (double) ((1 + RUNS) * XFER_KINDS) * modelled * 0.999);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

static void test_gen4_x16_link_holds_transfers_to_their_time(void) { SUB(link_takes_its_time(2.45)); }
static void test_gen3_x4_link_holds_transfers_to_their_time(void) { SUB(link_takes_its_time(0.33)); }

/* Queued copies take the link in turn, and the queue's events are reached when the link has
 * carried what came before them. */
static void test_queue_copies_take_the_link_in_turn(void) {
    const size_t bytes = 4 * MIB;
    /* far below the host's memcpy (2 to 6 GB/s on the loaded dev machine), so that only the
     * link's hold makes the copies this slow */
    const double gbps = 0.33, modelled = LATENCY_US * 1e-6 + (double) bytes / (gbps * 1e9);
    ferry_backend *device, *queue;
    CHECK_OK(standin(gbps, LATENCY_US, 0, &device));
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    CHECK_OK(byte_tensor(device, ctx, 2 * bytes, &t, &buf));
    char * host = malloc(2 * bytes);
    CHECK(host);
    memset(host, 3, 2 * bytes);
    ferry_event *start, *end;
    CHECK_OK(ferry_event_new(queue, FERRY_EVENT_TIMING, &start));
    CHECK_OK(ferry_event_new(queue, FERRY_EVENT_TIMING, &end));
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, host, 0, bytes)); /* warm */
    CHECK_OK(ferry_backend_synchronize(queue));
    const double t0 = now(); /* before the copies are queued: neither can start sooner */
    CHECK_OK(ferry_event_record(start, queue));
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, host, 0, bytes));
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, host + bytes, bytes, bytes));
    CHECK_OK(ferry_event_record(end, queue));
    CHECK_OK(ferry_event_synchronize(end));
    float ms = 0;
    CHECK_OK(ferry_event_elapsed_ms(start, end, &ms));
    printf("two queued copies: %.3f ms by the events, %.3f ms modelled\n", ms, 2e3 * modelled);
    CHECK(ms >= 1e3 * 2 * modelled * 0.999); /* float milliseconds */
    CHECK(now() - t0 >= 2 * modelled);       /* the host waited for the link, not only the memcpy */
    ferry_event_free(start);
    ferry_event_free(end);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

/* A link faster than the host copies is not reached, and says so: late transfers, and the
 * rate the host did reach below the link's. */
static void test_link_beyond_the_host_is_reported(void) {
    const size_t bytes = 16 * MIB;
    const double gbps = 1e5; /* 100 TB/s: 16 MiB in 0.17 us */
    ferry_backend * device;
    CHECK_OK(standin(gbps, 0, 0, &device));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    CHECK_OK(byte_tensor(device, ctx, bytes, &t, &buf));
    char * host = calloc(1, bytes);
    CHECK(host);
    CHECK_OK(ferry_tensor_set(t, host, 0, bytes));
    CHECK_OK(ferry_tensor_get(t, host, 0, bytes));
    ferry_standin_params p;
    ferry_link_stats s;
    CHECK_OK(ferry_standin_get_link(device, &p, &s));
    CHECK(p.link_gbps == gbps && p.latency_us == 0 && p.memory == 0);
    CHECK_EQ_U(s.transfers, 2);
    CHECK_EQ_U(s.bytes, 2 * bytes);
    CHECK_EQ_U(s.late, 2);
    CHECK(s.late_seconds > 0 && s.copy_seconds > s.modelled_seconds);
    CHECK((double) s.bytes / s.copy_seconds < gbps * 1e9);
    CHECK_OK(ferry_standin_reset_link_stats(device));
    CHECK_OK(ferry_standin_get_link(device, NULL, &s));
    CHECK(s.transfers == 0 && s.late == 0 && s.copy_seconds == 0);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

/* Without a link the stand-in copies as it always has: nothing held, nothing counted. */
static void test_no_link_no_model(void) {
    ferry_backend * device;
    CHECK_OK(ferry_standin_backend_new(&device));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    CHECK_OK(byte_tensor(device, ctx, MIB, &t, &buf));
    char * host = calloc(1, MIB);
    CHECK(host);
    CHECK_OK(ferry_tensor_set(t, host, 0, MIB));
    ferry_standin_params p;
    ferry_link_stats s;
    CHECK_OK(ferry_standin_get_link(device, &p, &s));
    CHECK(p.link_gbps == 0 && p.latency_us == 0 && p.memory == 0);
    CHECK(s.transfers == 0 && s.bytes == 0);
    CHECK(!ferry_buffer_is_host(buf));
    CHECK(strcmp(ferry_backend_name(device), "CPU (stand-in device)") == 0);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

/* Asking more than is free fails, naming the device, the ask and what is free; freeing gives
 * the bytes back, and the same ask then succeeds. */
static void test_standin_memory_refuses_past_free_and_frees_back(void) {
    const size_t memory = 64 * MIB, ask = 40 * MIB;
    ferry_backend * device;
    CHECK_OK(standin(0, 0, memory, &device));
    size_t free_bytes = 0, total = 0;
    CHECK_OK(ferry_backend_get_memory(device, &free_bytes, &total));
    CHECK_EQ_U(total, memory);
    CHECK_EQ_U(free_bytes, memory);
    ferry_buffer *a, *b;
    CHECK_OK(ferry_backend_alloc_buffer(device, ask, &a));
    CHECK_OK(ferry_backend_get_memory(device, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, memory - ask);
    CHECK_FAILS(ferry_backend_alloc_buffer(device, ask, &b), FERRY_ERR_OUT_OF_MEMORY);
    char want[160];
    snprintf(want, sizeof(want), "CPU (stand-in device) is out of memory: %zu bytes asked, %zu of its %zu bytes free",
             ask, memory - ask, memory);
    if (!strstr(ferry_last_error(), want)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", ferry_last_error(), want);
        CHECK(false);
    }
    CHECK_OK(ferry_backend_get_memory(device, &free_bytes, &total)); /* the refusal took nothing */
    CHECK_EQ_U(free_bytes, memory - ask);
    ferry_backend * queue;
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue)); /* answers for its backend */
    CHECK_OK(ferry_backend_get_memory(queue, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, memory - ask);
    ferry_buffer_free(a);
    CHECK_OK(ferry_backend_get_memory(device, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, memory);
    CHECK_OK(ferry_backend_alloc_buffer(device, ask, &b));
    CHECK_OK(ferry_backend_alloc_buffer(device, memory - ask, &a)); /* exactly what is left */
    CHECK_OK(ferry_backend_get_memory(device, &free_bytes, &total));
    CHECK_EQ_U(free_bytes, 0);
    ferry_buffer * c;
    CHECK_FAILS(ferry_backend_alloc_buffer(device, 1, &c), FERRY_ERR_OUT_OF_MEMORY);
    ferry_buffer_free(a);
    ferry_backend_free(device);
    ferry_buffer_free(b); /* after its backend, as any buffer may be */
}

static bool sane_host(size_t free_bytes, size_t total) {
    return total > free_bytes && free_bytes > 0 && total >= 16 * MIB && total < ((size_t) 1 << 50);
}

/* What every backend says of its memory. */
static void test_every_backend_tells_its_free_and_total_memory(void) {
    size_t free_bytes = 0, total = 0;
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_backend_get_memory(cpu, &free_bytes, &total));
    printf("host: %zu of %zu bytes free\n", free_bytes, total);
    CHECK(sane_host(free_bytes, total));
    ferry_backend * device;
    CHECK_OK(ferry_standin_backend_new(&device)); /* no memory of its own: the host's */
    size_t f2 = 0, t2 = 0;
    CHECK_OK(ferry_backend_get_memory(device, &f2, &t2));
    CHECK(sane_host(f2, t2) && t2 == total);
    ferry_backend * dummy;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dummy)); /* synthetic: no limit */
    CHECK_OK(ferry_backend_get_memory(dummy, &free_bytes, &total));
    CHECK(free_bytes == SIZE_MAX && total == SIZE_MAX);
    ferry_backend_free(dummy);
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dummy)); /* real memory: the host's */
    CHECK_OK(ferry_backend_get_memory(dummy, &free_bytes, &total));
    CHECK(sane_host(free_bytes, total) && total == t2);
    CHECK_FAILS(ferry_backend_get_memory(NULL, &free_bytes, &total), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_get_memory(cpu, NULL, &total), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_standin_get_link(cpu, NULL, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_standin_reset_link_stats(dummy), FERRY_ERR_INVALID_ARG);
    ferry_backend_free(dummy);
    ferry_backend_free(device);
    ferry_backend_free(cpu);
}

static void test_standin_params_out_of_range_are_refused(void) {
    ferry_backend * device = NULL;
    const double bad_gbps[] = {-1, 1e-4, 2e6, NAN, INFINITY};
    for (size_t i = 0; i < sizeof(bad_gbps) / sizeof(bad_gbps[0]); i++) {
        CHECK_FAILS(standin(bad_gbps[i], 0, 0, &device), FERRY_ERR_INVALID_ARG);
    }
    const double bad_latency[] = {-1, 2e6, NAN};
    for (size_t i = 0; i < sizeof(bad_latency) / sizeof(bad_latency[0]); i++) {
        CHECK_FAILS(standin(1, bad_latency[i], 0, &device), FERRY_ERR_INVALID_ARG);
    }
    const double bad_row[] = {-1, 2e6, NAN, INFINITY};
    for (size_t i = 0; i < sizeof(bad_row) / sizeof(bad_row[0]); i++) {
        const ferry_standin_params sp = {.row_ns = bad_row[i]};
        CHECK_FAILS(ferry_standin_backend_new_params(&sp, &device), FERRY_ERR_INVALID_ARG);
        CHECK(strstr(ferry_last_error(), "row_ns") != NULL);
    }
    const double bad_slowdown[] = {-1, 0.5, 0.999, 2e6, NAN, INFINITY};
    for (size_t i = 0; i < sizeof(bad_slowdown) / sizeof(bad_slowdown[0]); i++) {
        const ferry_standin_params sp = {.compute_slowdown = bad_slowdown[i]};
        CHECK_FAILS(ferry_standin_backend_new_params(&sp, &device), FERRY_ERR_INVALID_ARG);
    }
    CHECK_FAILS(ferry_standin_backend_new_params(NULL, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(device == NULL);
    CHECK_OK(ferry_standin_backend_new_params(NULL, &device)); /* NULL params: the defaults */
    ferry_standin_params p;
    CHECK_OK(ferry_standin_get_link(device, &p, NULL));
    CHECK(p.link_gbps == 0 && p.latency_us == 0 && p.memory == 0 && p.compute_slowdown == 0 && p.row_ns == 0);
    ferry_backend_free(device);
}

/*
 * A link that charges per row: a 2-D transfer of n rows costs latency + n * row_ns + bytes /
 * bandwidth, a plain one (or a 2-D one of one row) latency + bytes / bandwidth, blocking or on the
 * copy queue; the link's own counters say so exactly, and no transfer ends sooner. The stand-in's
 * copy cost model is its link's, its copy queue's too, unless one is set for it.
 */
static void test_link_charges_per_row(void) {
    const double gbps = 4, latency_us = 20, row_ns = 2000;
    const ferry_standin_params p = {.link_gbps = gbps, .latency_us = latency_us, .row_ns = row_ns};
    ferry_backend * device;
    CHECK_OK(ferry_standin_backend_new_params(&p, &device));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    const size_t rows = 256, bytes = rows * ROW;
    CHECK_OK(byte_tensor(device, ctx, 2 * bytes, &t, &buf));
    char * host = calloc(1, bytes);
    CHECK(host);
    const double plain = latency_us * 1e-6 + (double) bytes / (gbps * 1e9);
    const double rowed = plain + (double) rows * row_ns * 1e-9;
    const xfer kinds[6] = {XFER_SET, XFER_SET_2D, XFER_GET_2D, XFER_QUEUE_SET, XFER_QUEUE_SET_2D, XFER_GET};
    for (int i = 0; i < 6; i++) {
        const bool two_d = kinds[i] == XFER_SET_2D || kinds[i] == XFER_GET_2D || kinds[i] == XFER_QUEUE_SET_2D;
        CHECK_OK(ferry_standin_reset_link_stats(device));
        double took = 0;
        CHECK_OK(transfer(device, t, host, bytes, kinds[i], &took));
        ferry_link_stats s;
        CHECK_OK(ferry_standin_get_link(device, NULL, &s));
        CHECK_EQ_U(s.transfers, 1);
        CHECK_EQ_U(s.rows, two_d ? rows : 0);
        const double want = two_d ? rowed : plain;
        if (fabs(s.modelled_seconds - want) > 1e-9 * want || took < want) {
            fprintf(stderr, "%s: modelled %.6f ms, took %.6f ms, want %.6f ms\n", xfer_names[kinds[i]],
                    1e3 * s.modelled_seconds, 1e3 * took, 1e3 * want);
            CHECK(false);
        }
    }
    CHECK_OK(ferry_standin_reset_link_stats(device));
    CHECK_OK(ferry_tensor_set_2d(t, host, 0, ROW, 1, 2 * ROW, ROW)); /* one row: no row charged */
    ferry_link_stats one;
    CHECK_OK(ferry_standin_get_link(device, NULL, &one));
    CHECK_EQ_U(one.rows, 0);

    ferry_backend * queue;
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue));
    ferry_copy_cost_model m = ferry_backend_copy_cost_model(device), q = ferry_backend_copy_cost_model(queue);
    CHECK(m.call_us == latency_us && m.row_ns == row_ns && m.gbps == gbps && m.line_bytes == 0 &&
          m.small_row_bytes == 0 && m.wide_pitch_bytes == 0);
    CHECK(memcmp(&m, &q, sizeof(m)) == 0);
    /* the model prices the link's charges: a 2-D copy of the rows, and a flat copy of as many bytes */
    const ferry_copy_2d c = {.offset = 0, .size = ROW, .count = rows, .stride = 2 * ROW};
    CHECK(fabs(ferry_copy_plan_cost(&m, &c, 1) - rowed) < 1e-12);
    CHECK(fabs(ferry_copy_flat_cost(&m, bytes) - plain) < 1e-12);
    const ferry_copy_cost_model set = {.call_us = 3, .row_ns = 7, .gbps = 50};
    CHECK_OK(ferry_backend_set_copy_cost_model(device, &set));
    m = ferry_backend_copy_cost_model(device);
    q = ferry_backend_copy_cost_model(queue);
    CHECK(m.call_us == 3 && m.row_ns == 7 && m.gbps == 50 && memcmp(&m, &q, sizeof(m)) == 0);
    ferry_copy_cost_model bad = set;
    bad.gbps = 0;
    CHECK_FAILS(ferry_backend_set_copy_cost_model(device, &bad), FERRY_ERR_INVALID_ARG);
    bad = set;
    bad.row_ns = NAN;
    CHECK_FAILS(ferry_backend_set_copy_cost_model(device, &bad), FERRY_ERR_INVALID_ARG);
    bad = set;
    bad.small_row_bytes = 256;
    bad.small_row_efficiency = 1.5;
    CHECK_FAILS(ferry_backend_set_copy_cost_model(device, &bad), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_set_copy_cost_model(NULL, &set), FERRY_ERR_INVALID_ARG);
    CHECK(ferry_backend_copy_cost_model(device).gbps == 50); /* the refusals changed nothing */
    CHECK_OK(ferry_backend_set_copy_cost_model(device, NULL)); /* its own again */
    CHECK(ferry_backend_copy_cost_model(queue).row_ns == row_ns);
    /* unmodelled: the CPU's */
    ferry_backend * plain_dev;
    CHECK_OK(ferry_standin_backend_new(&plain_dev));
    const ferry_copy_cost_model cpu = ferry_copy_cost_model_cpu(), got = ferry_backend_copy_cost_model(plain_dev);
    CHECK(memcmp(&cpu, &got, sizeof(cpu)) == 0);
    ferry_backend_free(plain_dev);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

/* a + b on a device, n bytes each, in buffers of the device, and its graph. */
typedef struct {
    ferry_context * ctx;
    ferry_tensor *a, *b, *sum;
    ferry_buffer *ba, *bb, *bs;
    ferry_graph * graph;
} add_graph;

static void add_graph_new(ferry_backend * device, size_t n, add_graph * g) {
    CHECK_OK(ferry_context_new(&g->ctx));
    CHECK_OK(byte_tensor(device, g->ctx, n, &g->a, &g->ba));
    CHECK_OK(byte_tensor(device, g->ctx, n, &g->b, &g->bb));
    CHECK_OK(ferry_add(g->ctx, g->a, g->b, &g->sum));
    CHECK_OK(ferry_backend_alloc_buffer(device, n, &g->bs));
    CHECK_OK(ferry_buffer_place_tensor(g->bs, g->sum, 0));
    CHECK_OK(ferry_graph_new(&g->graph));
    CHECK_OK(ferry_graph_build(g->graph, g->sum));
}

static void add_graph_free(add_graph * g) {
    ferry_graph_free(g->graph);
    ferry_buffer_free(g->bs);
    ferry_buffer_free(g->bb);
    ferry_buffer_free(g->ba);
    ferry_context_free(g->ctx);
}

/* Computes of a + b (16 MiB each) on a stand-in with a compute slowdown: the wall time of the
 * computes, timed here, and the stand-in's own count of the host's time for them. */
static void timed_adds(double slowdown, int runs, double * wall, ferry_link_stats * stats) {
    const ferry_standin_params p = {.compute_slowdown = slowdown};
    ferry_backend * device = NULL;
    CHECK_OK(ferry_standin_backend_new_params(&p, &device));
    add_graph g = {0};
    add_graph_new(device, 16 * MIB, &g);
    CHECK_OK(ferry_standin_reset_link_stats(device));
    const double t0 = now();
    for (int i = 0; i < runs; i++) {
        CHECK_OK(ferry_backend_graph_compute(device, g.graph));
    }
    CHECK_OK(ferry_backend_synchronize(device));
    *wall = now() - t0;
    CHECK_OK(ferry_standin_get_link(device, NULL, stats));
    add_graph_free(&g);
    ferry_backend_free(device);
}

/* A compute slowdown F holds each compute to at least F times the host's own time for it: the
 * wall time of the computes is at least F times the host time the stand-in counted for them, a
 * bound that holds however busy the host is. Unslowed, the count is the compute itself. */
/*
 * A named link prices pieces by size: the H100 PCIe 5 profile's curve gives the published rates
 * (5 to 7 GB/s for 4 to 24 KiB, 40 to 52 from 28 KiB up) and rises with size; the link charges a
 * plain transfer as one piece at its size's rate, blocking, queued or a get, and a 2-D transfer's
 * rows at the peak (rows are the engine's pitch, not pieces), as its copy cost model prices them.
 * Slowed to a peak of 5 GB/s, every price is ten times the named link's.
 */
static void test_a_named_link_charges_pieces_by_size(void) {
    ferry_standin_params named, slowed;
    CHECK_OK(ferry_standin_link_profile("h100-pcie5", 0, &named));
    CHECK(named.link_gbps == 50 && named.piece_floor_gbps > 0 && named.memory == 0);
    ferry_backend * device;
    CHECK_OK(ferry_standin_backend_new_params(&named, &device));
    const ferry_copy_cost_model m = ferry_backend_copy_cost_model(device);
    ferry_backend_free(device);
    CHECK(m.piece_floor_gbps == named.piece_floor_gbps && m.piece_knee_bytes == named.piece_knee_bytes &&
          m.piece_steepness == named.piece_steepness);
    const size_t small[] = {4096, 8192, 16384, 24576}, large[] = {28672, 32768, 65536, 1 << 20, 64 << 20};
    for (size_t i = 0; i < 4; i++) {
        const double rate = (double) small[i] / ferry_copy_piece_seconds(&m, small[i]) / 1e9;
        CHECK(rate >= 5 && rate <= 7);
    }
    for (size_t i = 0; i < 5; i++) {
        const double rate = (double) large[i] / ferry_copy_piece_seconds(&m, large[i]) / 1e9;
        CHECK(rate >= 40 && rate <= 52);
    }
    double last = 0;
    for (size_t size = 64; size <= (64u << 20); size += size / 8) {
        const double rate = (double) size / ferry_copy_piece_seconds(&m, size);
        CHECK(rate >= last * (1 - 1e-12)); /* it rises with the size, to the peak */
        last = rate;
    }
    CHECK(fabs(last / 50e9 - 1) < 1e-6);
    const ferry_copy_cost_model flat = {.gbps = 50};
    CHECK(ferry_copy_piece_seconds(&flat, 4096) == 4096 / 50e9); /* no curve: every piece at the peak */
    CHECK(ferry_copy_piece_seconds(NULL, 4096) == 0);

    CHECK_OK(ferry_standin_link_profile("h100-pcie5", 5, &slowed));
    CHECK(fabs(slowed.link_gbps - 5) < 1e-12 && fabs(slowed.latency_us - 10 * named.latency_us) < 1e-12 &&
          fabs(slowed.piece_floor_gbps - named.piece_floor_gbps / 10) < 1e-12);
    CHECK_OK(ferry_standin_backend_new_params(&slowed, &device));
    const ferry_copy_cost_model ms = ferry_backend_copy_cost_model(device);
    CHECK(fabs(ferry_copy_flat_cost(&ms, 8192) / ferry_copy_flat_cost(&m, 8192) - 10) < 1e-9);
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t;
    ferry_buffer * buf;
    const size_t most = 1 << 20;
    CHECK_OK(byte_tensor(device, ctx, 2 * most, &t, &buf));
    char * host = calloc(1, most);
    CHECK(host);
    const size_t sizes[] = {4096, 24576, 28672, most};
    const xfer kinds[3] = {XFER_SET, XFER_QUEUE_SET, XFER_GET};
    for (size_t i = 0; i < 4; i++) {
        for (int k = 0; k < 3; k++) {
            CHECK_OK(ferry_standin_reset_link_stats(device));
            double took = 0;
            CHECK_OK(transfer(device, t, host, sizes[i], kinds[k], &took));
            ferry_link_stats st;
            CHECK_OK(ferry_standin_get_link(device, NULL, &st));
            const double want = ferry_copy_flat_cost(&ms, sizes[i]);
            CHECK(fabs(want - (slowed.latency_us * 1e-6 + ferry_copy_piece_seconds(&ms, sizes[i]))) < 1e-15);
            if (fabs(st.modelled_seconds - want) > 1e-9 * want || took < want) {
                fprintf(stderr, "%s of %zu B: modelled %.6f ms, took %.6f ms, want %.6f ms\n", xfer_names[kinds[k]],
                        sizes[i], 1e3 * st.modelled_seconds, 1e3 * took, 1e3 * want);
                CHECK(false);
            }
        }
    }
    /* 256 rows of 4 KiB as one 2-D transfer: the bytes at the peak, not 256 small pieces */
    CHECK_OK(ferry_standin_reset_link_stats(device));
    CHECK_OK(ferry_tensor_set_2d(t, host, 0, 4096, 256, 8192, 4096));
    ferry_link_stats st;
    CHECK_OK(ferry_standin_get_link(device, NULL, &st));
    const double rows_want = slowed.latency_us * 1e-6 + 256 * 4096 / 5e9;
    CHECK(fabs(st.modelled_seconds - rows_want) < 1e-9 * rows_want);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

/* Named links and piece curves out of range are refused, naming what to change. */
static void test_named_links_and_curves_out_of_range_are_refused(void) {
    ferry_standin_params p;
    CHECK_FAILS(ferry_standin_link_profile("h100", 0, &p), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "h100-pcie5, pcie4, gh200-c2c") != NULL);
    const double bad_peak[] = {-1, 1e-4, 2e6, NAN};
    for (size_t i = 0; i < sizeof(bad_peak) / sizeof(bad_peak[0]); i++) {
        CHECK_FAILS(ferry_standin_link_profile("pcie4", bad_peak[i], &p), FERRY_ERR_INVALID_ARG);
        CHECK(strstr(ferry_last_error(), "peak_gbps") != NULL);
    }
    CHECK_FAILS(ferry_standin_link_profile(NULL, 0, &p), FERRY_ERR_INVALID_ARG);
    int n = 0;
    for (const char * name; (name = ferry_standin_link_profile_name(n)) != NULL; n++) {
        CHECK_OK(ferry_standin_link_profile(name, 0, &p));
        ferry_backend * device;
        CHECK_OK(ferry_standin_backend_new_params(&p, &device));
        ferry_backend_free(device);
    }
    CHECK(n == 3 && ferry_standin_link_profile_name(-1) == NULL);
    ferry_backend * device = NULL;
    const ferry_standin_params bad[] = {
        {.piece_floor_gbps = 1, .piece_knee_bytes = 4096, .piece_steepness = 4}, /* no link to rise to */
        {.link_gbps = 8, .piece_floor_gbps = 9, .piece_knee_bytes = 4096, .piece_steepness = 4},
        {.link_gbps = 8, .piece_floor_gbps = 1e-4, .piece_knee_bytes = 4096, .piece_steepness = 4},
        {.link_gbps = 8, .piece_floor_gbps = 1, .piece_knee_bytes = 0, .piece_steepness = 4},
        {.link_gbps = 8, .piece_floor_gbps = 1, .piece_knee_bytes = 4096, .piece_steepness = 0},
        {.link_gbps = 8, .piece_floor_gbps = 1, .piece_knee_bytes = 4096, .piece_steepness = 300},
        {.link_gbps = 8, .piece_floor_gbps = NAN, .piece_knee_bytes = 4096, .piece_steepness = 4},
        {.link_gbps = 8, .piece_floor_gbps = 1, .piece_knee_bytes = NAN, .piece_steepness = 4},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_FAILS(ferry_standin_backend_new_params(&bad[i], &device), FERRY_ERR_INVALID_ARG);
        CHECK(strstr(ferry_last_error(), "piece_") != NULL);
    }
    CHECK(device == NULL);
    /* the cost model's curve is checked as the stand-in's is */
    ferry_copy_cost_model m = {.gbps = 8, .small_row_efficiency = 1, .piece_floor_gbps = 9, .piece_knee_bytes = 1,
                               .piece_steepness = 1};
    CHECK_FAILS(ferry_copy_cost_model_check(&m, "here"), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "piece curve") != NULL);
    m.piece_floor_gbps = 1;
    CHECK_OK(ferry_copy_cost_model_check(&m, "here"));
    m.piece_knee_bytes = -1;
    CHECK_FAILS(ferry_copy_cost_model_check(&m, "here"), FERRY_ERR_INVALID_ARG);
}

static void test_a_slowdown_of_f_holds_computes_to_f_times_host(void) {
    ferry_standin_params p;
    ferry_backend * device = NULL;
    const ferry_standin_params sp = {.compute_slowdown = 3};
    CHECK_OK(ferry_standin_backend_new_params(&sp, &device));
    CHECK_OK(ferry_standin_get_link(device, &p, NULL));
    CHECK(p.compute_slowdown == 3);
    ferry_backend_free(device);
    double wall1, wall3;
    ferry_link_stats one, three;
    timed_adds(1, 3, &wall1, &one);
    timed_adds(3, 3, &wall3, &three);
    printf("3 adds of 4 Mi f32: slowdown 1 %.3f ms (host %.3f ms), slowdown 3 %.3f ms (host %.3f ms)\n",
           1e3 * wall1, 1e3 * one.compute_host_seconds, 1e3 * wall3, 1e3 * three.compute_host_seconds);
    CHECK_EQ_U(one.computes, 3);
    CHECK_EQ_U(three.computes, 3);
    CHECK(one.compute_host_seconds > 0 && one.compute_host_seconds <= wall1);
    CHECK(three.compute_host_seconds > 0 && wall3 >= 3 * three.compute_host_seconds);
    CHECK(one.transfers == 0 && three.transfers == 0); /* no modelled link: computes counted alone */
}

/* The backend's own async sets are a stream's: each returns with its bytes moved and its place
 * on the link taken, before the link has carried it (a hold of HOLD_S each, far longer than the
 * call); synchronize returns only once the link has carried them all, back to back, and a
 * compute on the backend starts only after the copies queued before it. Blocking sets still
 * hold until their own end. */
#define HOLD_S 0.25
static void test_async_sets_queue_on_the_link_as_on_a_stream(void) {
    ferry_backend * device = NULL;
    CHECK_OK(standin(0, HOLD_S * 1e6, 0, &device));
    add_graph g = {0};
    add_graph_new(device, 4096, &g);
    float ones[1024], twos[1024], out[1024];
    for (int i = 0; i < 1024; i++) {
        ones[i] = 1.0f;
        twos[i] = 2.0f;
    }
    const double t0 = now();
    CHECK_OK(ferry_backend_tensor_set_async(device, g.a, ones, 0, sizeof(ones)));
    CHECK_OK(ferry_backend_tensor_set_2d_async(device, g.b, twos, 0, 2048, 2, 2048, 2048));
    const double queued = now() - t0;
    ferry_link_stats st;
    CHECK_OK(ferry_standin_get_link(device, NULL, &st));
    CHECK_EQ_U(st.transfers, 2); /* both on the link */
    CHECK(queued < HOLD_S);      /* and neither waited for it */
    CHECK_OK(ferry_backend_graph_compute(device, g.graph));
    const double computed = now() - t0;
    CHECK_OK(ferry_backend_synchronize(device));
    const double synced = now() - t0;
    printf("two queued sets of a %.0f ms hold: queued in %.3f ms, computed at %.1f ms, synchronized at %.1f ms\n",
           1e3 * HOLD_S, 1e3 * queued, 1e3 * computed, 1e3 * synced);
    CHECK(computed >= 2 * HOLD_S); /* the compute waited for both */
    CHECK(synced >= 2 * HOLD_S);
    CHECK_OK(ferry_tensor_get(g.sum, out, 0, sizeof(out)));
    CHECK(out[0] == 3.0f && out[1023] == 3.0f);
    const double t1 = now();
    CHECK_OK(ferry_tensor_set(g.a, ones, 0, sizeof(ones))); /* blocking: its own hold */
    CHECK(now() - t1 >= HOLD_S);
    add_graph_free(&g);
    ferry_backend_free(device);
}

/* A bulk copy on the copy queue is written at the link's pace, as a copy engine writes: its last
 * piece lands no sooner than half the link's time (40 ms of 80) after the copy was queued; written
 * in a burst, it would land a few ms after. A lower bound, which a busy host only makes easier to
 * meet: the worker's pieces wait for the link's clock, never the other way round. */
static void test_queued_bulk_copies_land_at_the_links_pace(void) {
    const size_t bytes = 8 * MIB;
    ferry_backend *device = NULL, *queue = NULL;
    CHECK_OK(standin(bytes / 0.08 * 1e-9, 0, 0, &device)); /* 80 ms for the copy */
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue));
    ferry_context * ctx = NULL;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * t = NULL;
    ferry_buffer * buf = NULL;
    CHECK_OK(byte_tensor(device, ctx, bytes, &t, &buf));
    char * host = malloc(bytes);
    CHECK(host != NULL);
    memset(host, 7, bytes);
    volatile const char * dst = (const char *) t->data;
    memset(t->data, 0, bytes);
    const double t0 = now();
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, host, 0, bytes));
    while (dst[bytes - 1] != 7) { /* the queue's worker writes it; a copy that never lands is the test's timeout */
    }
    const double landed = now() - t0;
    CHECK_OK(ferry_backend_synchronize(queue));
    const double took = now() - t0;
    printf("8 MiB over an 80 ms link: last byte landed at %.1f ms; done at %.1f ms\n", 1e3 * landed, 1e3 * took);
    CHECK(landed >= 0.04);
    CHECK(dst[0] == 7 && took >= 0.08);
    free(host);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(device);
}

#ifdef FERRY_HAVE_CUDA_TESTS
/* CUDA's answer is cudaMemGetInfo's; the fake runtime's device has 1 TiB, and its device
 * allocations take from it exactly what they ask. */
static void test_cuda_memory_falls_by_what_allocations_take(void) {
    ferry_backend * cuda = NULL;
    if (!ferry_cuda_available() || ferry_cuda_backend_new(0, &cuda) != FERRY_OK) {
        fprintf(stderr, "no CUDA device: skipped\n");
        exit(77);
    }
    size_t free_bytes = 0, total = 0, after = 0;
    CHECK_OK(ferry_backend_get_memory(cuda, &free_bytes, &total));
    printf("CUDA0: %zu of %zu bytes free\n", free_bytes, total);
    CHECK(total >= free_bytes && free_bytes > 64 * MIB);
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 64 * MIB, &buf));
    CHECK_OK(ferry_backend_get_memory(cuda, &after, &total));
#ifdef FERRY_FAKE_CUDART
    CHECK_EQ_U(total, (size_t) 1 << 40);
    CHECK_EQ_U(free_bytes - after, 64 * MIB);
#else
    /* meson runs the CUDA tests one at a time (tests/c/meson.build): no other test's context or
     * buffer comes or goes meanwhile; another process on the device still could */
    CHECK(after < free_bytes);
#endif
    ferry_backend * queue;
    CHECK_OK(ferry_backend_get_copy_queue(cuda, &queue));
    CHECK_OK(ferry_backend_get_memory(queue, &after, &total));
    ferry_buffer_free(buf);
    ferry_backend_free(cuda);
}
#endif

static const check_test tests[] = {
    {"gen4_x16_link_holds_transfers_to_their_time", test_gen4_x16_link_holds_transfers_to_their_time},
    {"gen3_x4_link_holds_transfers_to_their_time", test_gen3_x4_link_holds_transfers_to_their_time},
    {"queue_copies_take_the_link_in_turn", test_queue_copies_take_the_link_in_turn},
    {"link_beyond_the_host_is_reported", test_link_beyond_the_host_is_reported},
    {"no_link_no_model", test_no_link_no_model},
    {"standin_memory_refuses_past_free_and_frees_back", test_standin_memory_refuses_past_free_and_frees_back},
    {"every_backend_tells_its_free_and_total_memory", test_every_backend_tells_its_free_and_total_memory},
    {"queued_bulk_copies_land_at_the_links_pace", test_queued_bulk_copies_land_at_the_links_pace},
    {"standin_params_out_of_range_are_refused", test_standin_params_out_of_range_are_refused},
    {"link_charges_per_row", test_link_charges_per_row},
    {"a_named_link_charges_pieces_by_size", test_a_named_link_charges_pieces_by_size},
    {"named_links_and_curves_out_of_range_are_refused", test_named_links_and_curves_out_of_range_are_refused},
    {"a_slowdown_of_f_holds_computes_to_f_times_host", test_a_slowdown_of_f_holds_computes_to_f_times_host},
    {"async_sets_queue_on_the_link_as_on_a_stream", test_async_sets_queue_on_the_link_as_on_a_stream},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"cuda_memory_falls_by_what_allocations_take", test_cuda_memory_falls_by_what_allocations_take},
#endif
};

CHECK_MAIN(tests)
