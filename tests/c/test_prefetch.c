/*
 * Prefetching (ferry_sched_set_prefetch): a decode step of several layers, each layer's
 * K and V windows copied ahead on the split backend's copy queue while earlier layers
 * compute, must give the bytes and the byte counts of the serial run, in memory nothing
 * running meanwhile reuses; and a compute that does not wait for its copies' events reads
 * stale bytes (test builds with the fault hooks: the queue held back, the waits dropped).
 */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FERRY_FAULT_INJECTION
void ferry_fault_copy_queue_pause(bool pause);
void ferry_fault_sched_drop_waits(bool drop);
#endif

#include "step-fixture.h"


/* A new scheduler [device, cpu] with these options; computes the step and reads it back.
 * keep: leave the scheduler to the caller (*kept), else free it. */
static ferry_status run_step(step * s, ferry_copy_policy policy, bool compact, int prefetch, step_outputs * r,
                             ferry_sched ** kept) {
    ferry_sched * sched;
    FERRY_TRY_T(step_sched_new(s, policy, compact, prefetch, false, &sched));
    const ferry_status st = step_run(s, sched, r);
    if (kept && st == FERRY_OK) {
        *kept = sched;
    } else {
        ferry_sched_free(sched);
    }
    return st;
}

/* The counts that say what moved: the same with and without prefetching. */
static void check_same_bytes(const ferry_sched_stats * a, const ferry_sched_stats * b) {
    CHECK_EQ_U(a->n_inputs, b->n_inputs);
    CHECK_EQ_U(a->bytes_read, b->bytes_read);
    CHECK_EQ_U(a->bytes_span, b->bytes_span);
    CHECK_EQ_U(a->bytes_copied, b->bytes_copied);
    CHECK_EQ_U(a->copy_calls, b->copy_calls);
    CHECK_EQ_U(a->impl_calls, b->impl_calls);
    CHECK(a->predicted_seconds == b->predicted_seconds); /* the queue costs by its parent's model */
}

/*
 * Every policy, compact staging off and on, K plain and V transposed, 1, 2 and more
 * parts ahead than there are: the outputs byte for byte and the byte counts of the serial
 * run; both windows of every layer prefetched; what is held ahead as the option says. The
 * outputs are flat's under every policy, and ragged copies each stream's used cells alone.
 */
static void same_bytes_as_serial(ferry_backend * device) {
    for (int vt = 0; vt < 2; vt++) {
        step s;
        CHECK_OK(step_init(&s, device, vt == 1));
        static step_outputs serial, ahead, flat;
        for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
            for (int compact = 0; compact < 2; compact++) {
                CHECK_OK(run_step(&s, (ferry_copy_policy) policy, compact, 0, &serial, NULL));
                if (policy == FERRY_COPY_FLAT && !compact) {
                    flat = serial;
                }
                CHECK(memcmp(serial.out, flat.out, sizeof(flat.out)) == 0);
                if (policy == FERRY_COPY_RAGGED) { /* lengths 40, 17, 0, 33 of cells of 256 bytes, K and V */
                    CHECK_EQ_U(serial.stats.bytes_copied, (uint64_t) N_LAYER * 2 * (40 + 17 + 0 + 33) * 256);
                    CHECK_EQ_U(serial.stats.bytes_read, serial.stats.bytes_copied);
                }
                CHECK_EQ_U(serial.stats.prefetched, 0);
                CHECK_EQ_U(serial.stats.ahead_inputs, 0);
                CHECK_EQ_U(serial.stats.ahead_bytes, 0);
                const int depths[] = {1, 2, 64};
                for (int d = 0; d < 3; d++) {
                    ferry_sched * sched = NULL;
                    CHECK_OK(run_step(&s, (ferry_copy_policy) policy, compact, depths[d], &ahead, &sched));
                    const bool same = memcmp(serial.out, ahead.out, sizeof(serial.out)) == 0;
                    if (!same) {
                        fprintf(stderr, "policy %d compact %d v_trans %d prefetch %d: outputs differ\n", policy,
                                compact, vt, depths[d]);
                    }
                    SUB(check_same_bytes(&serial.stats, &ahead.stats));
                    CHECK_EQ_U(ahead.stats.prefetched, 2 * N_LAYER - 1); /* the first K: the thread's */
                    const int held = depths[d] < N_LAYER - 1 ? depths[d] : N_LAYER - 1;
                    CHECK_EQ_U(ahead.stats.ahead_inputs, 2 * held);
                    ferry_sched_input_info k, v;
                    CHECK_OK(ferry_sched_input(sched, 0, &k));
                    CHECK_OK(ferry_sched_input(sched, 1, &v));
                    const uint64_t per_layer = ferry_tensor_nbytes(k.copy) + ferry_tensor_nbytes(v.copy);
                    CHECK_EQ_U(ahead.stats.ahead_bytes, (uint64_t) held * per_layer);
                    CHECK(ahead.stats.copy_seconds >= 0.0);
                    ferry_sched_free(sched);
                    CHECK(same);
                }
            }
        }
        step_free(&s);
    }
}

static void test_standin_same_bytes_as_serial(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    SUB(same_bytes_as_serial(standin));
    ferry_backend_free(standin);
}

/* A copy queued ahead lives in memory of its own from the part it is queued at to its
 * own: no two copies whose times overlap share a byte, whatever the depth. */
static void test_copies_in_flight_never_share_memory(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    static step_outputs r;
    for (int depth = 1; depth <= N_LAYER; depth++) {
        ferry_sched * sched = NULL;
        CHECK_OK(run_step(&s, FERRY_COPY_RANGES, false, depth, &r, &sched));
        const int n = ferry_sched_n_inputs(sched);
        CHECK_EQ_U(n, 2 * N_LAYER);
        for (int a = 0; a < n; a++) {
            for (int b = a + 1; b < n; b++) {
                ferry_sched_input_info x, y;
                CHECK_OK(ferry_sched_input(sched, a, &x));
                CHECK_OK(ferry_sched_input(sched, b, &y));
                /* layer of an input: a / 2; queued at layer - depth, read at layer */
                const int la = a / 2, lb = b / 2;
                const int qa = la > depth ? la - depth : 0, qb = lb > depth ? lb - depth : 0;
                if (qb > la || qa > lb) {
                    continue; /* their times do not meet */
                }
                const uintptr_t xa = (uintptr_t) x.copy->data, ya = (uintptr_t) y.copy->data;
                const bool apart = xa + ferry_tensor_nbytes(x.copy) <= ya || ya + ferry_tensor_nbytes(y.copy) <= xa;
                if (!apart) {
                    fprintf(stderr, "depth %d: copies of inputs %d and %d overlap\n", depth, a, b);
                }
                CHECK(apart);
            }
        }
        ferry_sched_free(sched);
    }
    step_free(&s);
    ferry_backend_free(standin);
}

/* Spans of a kind, and whether each compute comes after the one before and after its part's copies. */
static int count_kind(const ferry_sched_span * sp, size_t n, ferry_span_kind kind) {
    int c = 0;
    for (size_t i = 0; i < n; i++) {
        c += sp[i].kind == kind;
    }
    return c;
}

static void check_timeline(const ferry_sched_span * sp, size_t n) {
    double last_compute_end = 0.0;
    int part = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(sp[i].start >= 0.0 && sp[i].end >= sp[i].start);
        CHECK((sp[i].input >= 0) == (sp[i].kind == FERRY_SPAN_COPY || sp[i].kind == FERRY_SPAN_QUEUED_COPY));
        if (sp[i].kind == FERRY_SPAN_COMPUTE) {
            CHECK_EQ_U(sp[i].part, part++); /* the parts in order, each once */
            CHECK(sp[i].start >= last_compute_end);
            last_compute_end = sp[i].end;
            for (size_t j = 0; j < n; j++) { /* a part computes once its inputs are in */
                if (sp[j].input >= 0 && sp[j].part == sp[i].part) {
                    CHECK(sp[j].end <= sp[i].start + 1e-6);
                }
            }
        }
    }
}

/* ferry_sched_trace: a serial run is the thread's copies and computes, every input copied
 * once; a prefetched one moves every input but the first layer's K to the queue and waits
 * for them, the later parts' copies queued after the first part's own (on a held link, so that
 * a copy queued too early would still hold it); the counts come with NULL, too little room is refused, and a new alloc clears them. */
static void test_trace_is_each_runs_copies_waits_and_computes(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    static step_outputs r;
    static ferry_sched_span sp[256];
    for (int depth = 0; depth <= 2; depth++) {
        ferry_sched * sched = NULL;
        CHECK_OK(run_step(&s, FERRY_COPY_RANGES, false, depth, &r, &sched));
        const int inputs = ferry_sched_n_inputs(sched);
        size_t n = 0;
        CHECK_OK(ferry_sched_trace(sched, NULL, 0, &n));
        CHECK(n > 0 && n <= 256);
        size_t got = 0;
        CHECK_EQ_U(ferry_sched_trace(sched, sp, n - 1, &got), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_OK(ferry_sched_trace(sched, sp, 256, &got));
        CHECK_EQ_U(got, n);
        CHECK_EQ_U(count_kind(sp, n, FERRY_SPAN_COMPUTE), N_LAYER); /* a part per layer: each output pinned */
        CHECK_EQ_U(count_kind(sp, n, FERRY_SPAN_COPY) + count_kind(sp, n, FERRY_SPAN_QUEUED_COPY), inputs);
        if (depth == 0) {
            CHECK_EQ_U(count_kind(sp, n, FERRY_SPAN_QUEUED_COPY), 0);
            CHECK_EQ_U(count_kind(sp, n, FERRY_SPAN_WAIT), 0);
        } else {
            CHECK_EQ_U(count_kind(sp, n, FERRY_SPAN_QUEUED_COPY), 2 * N_LAYER - 1);
            CHECK(count_kind(sp, n, FERRY_SPAN_WAIT) >= 1);
            /* the parts ahead are queued after the first part's own copies: none takes the link first */
            for (size_t i = 0; i < n; i++) {
                for (size_t j = 0; j < n; j++) {
                    if (sp[i].kind == FERRY_SPAN_COPY && sp[j].kind == FERRY_SPAN_QUEUED_COPY && sp[j].part > 0) {
                        CHECK(sp[j].start >= sp[i].end - 1e-6);
                    }
                }
            }
        }
        SUB(check_timeline(sp, n));
        CHECK_EQ_U(ferry_sched_trace(sched, sp, 256, NULL), FERRY_ERR_INVALID_ARG);
        CHECK_EQ_U(ferry_sched_trace(NULL, sp, 256, &got), FERRY_ERR_INVALID_ARG);
        CHECK_OK(ferry_sched_alloc_graph(sched, s.graph));
        CHECK_OK(ferry_sched_trace(sched, NULL, 0, &n));
        CHECK_EQ_U(n, 0);
        ferry_sched_free(sched);
    }
    step_free(&s);
    ferry_backend_free(standin);
}

/* A backend without a copy queue copies as it always did, prefetch or not. */
static void test_no_queue_copies_as_before(void) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true;
    ferry_backend * device, * queue = (ferry_backend *) 1;
    CHECK_OK(ferry_dummy_backend_new(&p, &device));
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue));
    CHECK(queue == NULL);
    step s;
    CHECK_OK(step_init(&s, device, false));
    static step_outputs serial, ahead;
    CHECK_OK(run_step(&s, FERRY_COPY_RANGES, false, 0, &serial, NULL));
    CHECK_OK(run_step(&s, FERRY_COPY_RANGES, false, 3, &ahead, NULL));
    SUB(check_same_bytes(&serial.stats, &ahead.stats));
    CHECK_EQ_U(ahead.stats.prefetched, 0);
    CHECK_EQ_U(ahead.stats.ahead_bytes, 0);
    CHECK(memcmp(serial.out, ahead.out, sizeof(serial.out)) == 0);
    step_free(&s);
    ferry_backend_free(device);
}

/* The stand-in's queue on its own: one per backend, rows land in order, events are reached
 * and timed, and what it cannot do is refused. */
static void test_standin_copy_queue_lands_rows_in_order(void) {
    ferry_backend *standin, *queue, *again, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
    CHECK(queue != NULL);
    CHECK_OK(ferry_backend_get_copy_queue(standin, &again));
    CHECK(again == queue);
    CHECK(strstr(ferry_backend_name(queue), "copy queue") != NULL);
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {4096};
    ferry_tensor * t;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &t));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(standin, ferry_tensor_nbytes(t), &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    static int32_t src[4096 * 2], got[4096];
    for (int i = 0; i < 4096 * 2; i++) {
        src[i] = i;
    }
    ferry_event *a, *b;
    CHECK_OK(ferry_event_new(queue, FERRY_EVENT_TIMING, &a));
    CHECK_OK(ferry_event_new(queue, FERRY_EVENT_TIMING, &b));
    CHECK_OK(ferry_event_record(a, queue));
    /* rows of 64 ints from every other 64 of src, then the last row again from elsewhere */
    CHECK_OK(ferry_backend_tensor_set_2d_async(queue, t, src, 0, 256, 64, 256, 512));
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, src + 100, 63 * 256, 256));
    CHECK_OK(ferry_event_record(b, queue));
    CHECK_OK(ferry_event_wait(standin, b));
    CHECK_OK(ferry_tensor_get(t, got, 0, sizeof(got)));
    bool right = true;
    for (int r = 0; r < 64; r++) {
        for (int i = 0; i < 64; i++) {
            right = right && got[r * 64 + i] == (r == 63 ? 100 + i : r * 128 + i);
        }
    }
    CHECK(right);
    float ms = -1;
    CHECK_OK(ferry_event_elapsed_ms(a, b, &ms));
    CHECK(ms >= 0);
    CHECK_FAILS(ferry_event_record(a, standin), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_graph_compute(queue, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_get_copy_queue(NULL, &again), FERRY_ERR_INVALID_ARG);
    /* a get queued behind the sets sees them */
    CHECK_OK(ferry_backend_tensor_set_async(queue, t, src + 1000, 0, 16));
    int32_t four[4] = {0};
    CHECK_OK(ferry_backend_tensor_get_async(queue, t, four, 0, 16));
    CHECK_OK(ferry_backend_synchronize(queue));
    CHECK(four[0] == 1000 && four[3] == 1003);
    ferry_event_free(a);
    ferry_event_free(b);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(cpu);
    ferry_backend_free(standin); /* frees its queue */
}

/* A copy queue refuses what a backend refuses, before queuing anything: a transfer past its
 * tensor or of an unplaced tensor; a zero-byte one queues nothing and counts nothing. Its
 * events time only against events of the same queue, once both were recorded and reached. */
static void test_copy_queues_refuse_as_backends_queuing_nothing(void) {
    ferry_backend *one, *two, *q1, *q2;
    CHECK_OK(ferry_standin_backend_new(&one));
    CHECK_OK(ferry_standin_backend_new(&two));
    CHECK_OK(ferry_backend_get_copy_queue(one, &q1));
    CHECK_OK(ferry_backend_get_copy_queue(two, &q2));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {64};
    ferry_tensor *t, *unplaced;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &t));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &unplaced));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(one, 256, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    int32_t data[65] = {0};
    CHECK_FAILS(ferry_backend_tensor_set_async(q1, t, data, 4, 256), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_backend_tensor_set_async(q1, unplaced, data, 0, 4), FERRY_ERR_NOT_ALLOCATED);
    CHECK_OK(ferry_backend_tensor_set_async(q1, t, data, 0, 0));
    ferry_stats st;
    CHECK_OK(ferry_backend_get_stats(q1, &st));
    CHECK_EQ_U(st.calls[FERRY_XFER_SET], 0);
    CHECK_OK(ferry_buffer_get_stats(buf, &st));
    CHECK_EQ_U(st.calls[FERRY_XFER_SET], 0);

    ferry_event *a, *b, *other;
    CHECK_OK(ferry_event_new(q1, FERRY_EVENT_TIMING, &a));
    CHECK_OK(ferry_event_new(q1, FERRY_EVENT_TIMING, &b));
    CHECK_OK(ferry_event_new(q2, FERRY_EVENT_TIMING, &other));
    float ms = -1;
    CHECK_OK(ferry_event_record(a, q1));
    CHECK_FAILS(ferry_event_elapsed_ms(a, b, &ms), FERRY_ERR_INVALID_ARG); /* b never recorded */
    CHECK(strstr(ferry_last_error(), "not recorded") != NULL);
    CHECK_OK(ferry_event_record(b, q1));
    CHECK_OK(ferry_event_record(other, q2));
    CHECK_OK(ferry_event_synchronize(b));
    CHECK_OK(ferry_event_synchronize(other));
    CHECK_FAILS(ferry_event_elapsed_ms(a, other, &ms), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "events of two queues") != NULL);
    CHECK_FAILS(ferry_event_elapsed_ms(a, b, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(ms == -1);
    CHECK_OK(ferry_event_elapsed_ms(a, b, &ms));
    CHECK(ms >= 0);
    ferry_event_free(a);
    ferry_event_free(b);
    ferry_event_free(other);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(one);
    ferry_backend_free(two);
}

static void test_prefetch_takes_a_depth_and_refuses_a_negative_one(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_sched * sched;
    CHECK_OK(ferry_sched_new(&cpu, 1, &sched));
    CHECK(ferry_sched_get_prefetch(sched) == 0);
    CHECK_FAILS(ferry_sched_set_prefetch(sched, -1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_sched_set_prefetch(NULL, 1), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_sched_set_prefetch(sched, 2));
    CHECK(ferry_sched_get_prefetch(sched) == 2);
    CHECK(ferry_sched_get_prefetch(NULL) == 0);
    ferry_sched_free(sched);
    ferry_backend_free(cpu);
}

#ifdef FERRY_FAULT_INJECTION
/*
 * What the events guard: with the copies held back on the queue and the waits dropped,
 * attention reads copies that have not arrived, and the outputs differ from the serial
 * run's; the same scheduler, waiting again, gives them exactly.
 */
static void dropped_wait_reads_stale(ferry_backend * device, bool hold_queue) {
    step s;
    CHECK_OK(step_init(&s, device, false));
    static step_outputs serial, dropped, waited;
    CHECK_OK(run_step(&s, FERRY_COPY_RANGES, false, 0, &serial, NULL));
    ferry_fault_sched_drop_waits(true);
    ferry_fault_copy_queue_pause(hold_queue);
    ferry_sched * sched = NULL;
    const ferry_status st = run_step(&s, FERRY_COPY_RANGES, false, 2, &dropped, &sched);
    ferry_fault_copy_queue_pause(false);
    ferry_fault_sched_drop_waits(false);
    ferry_backend * queue = NULL;
    CHECK_OK(ferry_backend_get_copy_queue(device, &queue));
    CHECK_OK(ferry_backend_synchronize(queue)); /* what was dropped is waited for here */
    CHECK_OK(st);
    CHECK(memcmp(serial.out, dropped.out, sizeof(serial.out)) != 0);
    CHECK_OK(ferry_sched_graph_compute(sched, s.graph));
    for (int l = 0; l < N_LAYER; l++) {
        CHECK_OK(ferry_tensor_get(s.out[l], waited.out[l], 0, sizeof(waited.out[l])));
    }
    CHECK(memcmp(serial.out, waited.out, sizeof(serial.out)) == 0);
    ferry_sched_free(sched);
    step_free(&s);
}

static void test_standin_dropped_wait_reads_stale(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    SUB(dropped_wait_reads_stale(standin, true));
    ferry_backend_free(standin);
}

/* A queue keeps its copies in order however many wait: with the worker held, hundreds of
 * copies queue up (the ring grows twice, the first time from a head past its start, so that
 * the jobs it moves wrap), and once let go each element holds the last value queued for it.
 * The first 64 copies write 32 elements twice each, so their order shows in the result. */
static int32_t element_of(int k) { return k < 64 ? k % 32 : 32 + k % 68; }

static void test_copy_queue_keeps_order_when_held(void) {
    ferry_backend *standin, *queue;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {100};
    ferry_tensor * t;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne, &t));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(standin, 400, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    static int32_t values[300];
    int32_t want[100];
    for (int k = 0; k < 300; k++) {
        values[k] = k;
        want[element_of(k)] = k; /* in queue order: the last write wins */
    }
    for (int k = 0; k < 40; k++) { /* the ring's head moves on to 40 */
        CHECK_OK(ferry_backend_tensor_set_async(queue, t, &values[k], 0, 4));
    }
    CHECK_OK(ferry_backend_synchronize(queue));
    ferry_fault_copy_queue_pause(true);
    for (int k = 0; k < 300; k++) {
        const ferry_status st = ferry_backend_tensor_set_async(queue, t, &values[k], (size_t) element_of(k) * 4, 4);
        if (st != FERRY_OK) {
            ferry_fault_copy_queue_pause(false);
            CHECK_OK(st);
        }
    }
    ferry_fault_copy_queue_pause(false);
    CHECK_OK(ferry_backend_synchronize(queue));
    int32_t got[100];
    CHECK_OK(ferry_tensor_get(t, got, 0, sizeof(got)));
    for (int j = 0; j < 100; j++) {
        CHECK_EQ_U(got[j], want[j]);
    }
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(standin);
}

#endif

#ifdef FERRY_HAVE_CUDA_TESTS
/* The same on CUDA: the copy queue is a second stream, the compute stream waits on its events. */
static void test_cuda_same_bytes_as_serial(void) {
    ferry_backend * cuda = cuda_or_skip();
    SUB(same_bytes_as_serial(cuda));
    ferry_backend_free(cuda);
}

#ifdef FERRY_FAULT_INJECTION
/* Against the fake runtime, queued copies run only when something waits for them: without
 * the compute stream's wait on their events, attention reads stale bytes every time. */
static void test_cuda_dropped_wait_reads_stale(void) {
    ferry_backend * cuda = cuda_or_skip();
    SUB(dropped_wait_reads_stale(cuda, false));
    ferry_backend_free(cuda);
}
#endif
#endif

static const check_test tests[] = {
    {"standin_same_bytes_as_serial", test_standin_same_bytes_as_serial},
    {"copies_in_flight_never_share_memory", test_copies_in_flight_never_share_memory},
    {"no_queue_copies_as_before", test_no_queue_copies_as_before},
    {"trace_is_each_runs_copies_waits_and_computes", test_trace_is_each_runs_copies_waits_and_computes},
    {"standin_copy_queue_lands_rows_in_order", test_standin_copy_queue_lands_rows_in_order},
    {"prefetch_takes_a_depth_and_refuses_a_negative_one", test_prefetch_takes_a_depth_and_refuses_a_negative_one},
    {"copy_queues_refuse_as_backends_queuing_nothing", test_copy_queues_refuse_as_backends_queuing_nothing},
#ifdef FERRY_FAULT_INJECTION
    {"standin_dropped_wait_reads_stale", test_standin_dropped_wait_reads_stale},
    {"copy_queue_keeps_order_when_held", test_copy_queue_keeps_order_when_held},
#endif
#ifdef FERRY_HAVE_CUDA_TESTS
    {"cuda_same_bytes_as_serial", test_cuda_same_bytes_as_serial},
#ifdef FERRY_FAULT_INJECTION
    {"cuda_dropped_wait_reads_stale", test_cuda_dropped_wait_reads_stale},
#endif
#endif
};

CHECK_MAIN(tests)
