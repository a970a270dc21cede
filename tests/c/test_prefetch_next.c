/*
 * Prefetch across runs (ferry_sched_set_prefetch_next): in a decode loop that appends a cell to
 * each stream between runs, the first layer's windows copied ahead under the last run's last
 * layer, plus the cells appended since, must give every run the outputs of a serial scheduler,
 * in memory nothing else uses; a length that falls is copied again, unless a rollback announced
 * it (ferry_sched_truncate): then only the cells since; cells rewritten below a length are the
 * caller's to announce (ferry_sched_drop_ahead), and read stale when not.
 */
#include "step-fixture.h"

#define CELL_BYTES (HEAD_DIM * N_HEAD_KV * 2) /* an f16 cell of K, or of V */

/* New values in every layer's K and V for cells [lo[i], hi[i]) of each stream i, written
 * through the windows into the host cache. */
static void write_cells(step * s, const int32_t * lo, const int32_t * hi) {
    for (int l = 0; l < N_LAYER; l++) {
        for (int w = 0; w < 2; w++) {
            const ferry_tensor * t = s->win[l][w];
            char * base = (char *) t->data;
            const int cell = t->used_cell_dim, stream = t->used_stream_dim;
            for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
                for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
                    for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                            const int64_t at[4] = {i0, i1, i2, i3};
                            if (at[cell] < lo[at[stream]] || at[cell] >= hi[at[stream]]) {
                                continue;
                            }
                            const uint16_t v = random_f16();
                            memcpy(base + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3], &v, 2);
                        }
                    }
                }
            }
        }
    }
}

/* Each stream's length, to both of the step's length tensors. */
static ferry_status set_lengths(step * s, const int32_t * lens) {
    FERRY_TRY_T(ferry_tensor_set(s->len, lens, 0, N_STREAM * sizeof(int32_t)));
    return ferry_tensor_set(s->host_len, lens, 0, N_STREAM * sizeof(int32_t));
}

static const int32_t START[N_STREAM] = {N_KV, 17, 0, 33}; /* step_init's */

/*
 * A decode loop of 6 runs, each after the first appending a cell to every stream shorter than
 * the window: a scheduler prefetching across runs gives the serial one's outputs byte for byte at
 * every run, and its bytes: the same under ragged (the copy ahead took each stream's used cells,
 * the run the one appended), under the other policies one cell a stream more for the first
 * layer's K and V (the copy ahead took the whole window, the appended cell before it was written).
 */
static void decode_loop_reads_what_the_host_wrote(ferry_backend * device) {
    static step_outputs serial, ahead;
    for (int vt = 0; vt < 2; vt++) {
        for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
            for (int compact = 0; compact < 2; compact++) {
                for (int depth = 1; depth <= 2; depth++) {
                    step s;
                    CHECK_OK(step_init(&s, device, vt == 1));
                    ferry_sched *plain, *next;
                    CHECK_OK(step_sched_new(&s, (ferry_copy_policy) policy, compact, 0, false, &plain));
                    CHECK_OK(step_sched_new(&s, (ferry_copy_policy) policy, compact, depth, true, &next));
                    int32_t lens[N_STREAM];
                    memcpy(lens, START, sizeof(lens));
                    for (int r = 0; r < 6; r++) {
                        int32_t grown[N_STREAM];
                        uint64_t appended = 0;
                        for (int i = 0; i < N_STREAM; i++) {
                            grown[i] = lens[i] + (r > 0 && lens[i] < N_KV);
                            appended += (uint64_t) (grown[i] - lens[i]);
                        }
                        write_cells(&s, lens, grown);
                        memcpy(lens, grown, sizeof(lens));
                        CHECK_OK(set_lengths(&s, lens));
                        CHECK_OK(step_run(&s, plain, &serial));
                        CHECK_OK(step_run(&s, next, &ahead));
                        const bool same = memcmp(serial.out, ahead.out, sizeof(serial.out)) == 0;
                        if (!same) {
                            fprintf(stderr, "v_trans %d policy %d compact %d depth %d run %d: outputs differ\n", vt,
                                    policy, compact, depth, r);
                        }
                        CHECK(same);
                        CHECK_EQ_U(ahead.stats.bytes_read, serial.stats.bytes_read);
                        const uint64_t extra = r == 0 || policy == FERRY_COPY_RAGGED ? 0 : 2 * appended * CELL_BYTES;
                        CHECK_EQ_U(ahead.stats.bytes_copied, serial.stats.bytes_copied + extra);
                        CHECK_EQ_U(ahead.stats.prefetched, 2 * N_LAYER); /* both of the first layer's too */
                        CHECK_EQ_U(ahead.stats.kept_ahead, r == 0 ? 0 : 2); /* the first layer's K and V */
                    }
                    ferry_sched_free(plain);
                    ferry_sched_free(next);
                    step_free(&s);
                }
            }
        }
    }
}

static void test_standin_decode_loop_reads_what_the_host_wrote(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    SUB(decode_loop_reads_what_the_host_wrote(standin));
    ferry_backend_free(standin);
}

/*
 * A verify loop (speculative decoding): each step appends up to 3 cells to every stream, then keeps
 * some and rolls the rest back (ferry_sched_truncate to the kept length); the next step writes its
 * cells from there, over the rejected ones. Under every policy the outputs are a serial
 * scheduler's byte for byte at every step; under ragged the first layer's K and V each copy, at the
 * run, exactly the cells since each stream's kept length (its bytes beyond the copy ahead's, which
 * took the last run's used cells: that run's bytes_read).
 */
static void rollback_copies_only_the_cells_since_it(ferry_backend * device) {
    static step_outputs serial, ahead;
    for (int variant = 0; variant < 2 * FERRY_COPY_POLICY_COUNT; variant++) {
        const int policy = variant / 2, compact = variant % 2;
        step s;
        CHECK_OK(step_init(&s, device, policy % 2 == 1));
        ferry_sched *plain, *next;
        CHECK_OK(step_sched_new(&s, (ferry_copy_policy) policy, compact, 0, false, &plain));
        CHECK_OK(step_sched_new(&s, (ferry_copy_policy) policy, compact, 1, true, &next));
        int32_t kept[N_STREAM];
        memcpy(kept, START, sizeof(kept));
        uint64_t read_before[2] = {0, 0}; /* the first layer's K and V, the last run's bytes_read */
        for (int r = 0; r < 8; r++) {
            int32_t grown[N_STREAM];
            uint64_t since = 0;
            for (int i = 0; i < N_STREAM; i++) {
                grown[i] = kept[i] + 3 <= N_KV ? kept[i] + 3 : N_KV;
                since += (uint64_t) (grown[i] - kept[i]);
            }
            write_cells(&s, kept, grown);
            CHECK_OK(set_lengths(&s, grown));
            CHECK_OK(step_run(&s, plain, &serial));
            CHECK_OK(step_run(&s, next, &ahead));
            const bool same = memcmp(serial.out, ahead.out, sizeof(serial.out)) == 0;
            if (!same) {
                fprintf(stderr, "policy %d compact %d run %d: outputs differ\n", policy, compact, r);
            }
            CHECK(same);
            CHECK_EQ_U(ahead.stats.kept_ahead, r == 0 ? 0 : 2);
            for (int w = 0; w < 2 && policy == FERRY_COPY_RAGGED; w++) {
                ferry_sched_input_info in;
                CHECK_OK(ferry_sched_input(next, w, &in));
                CHECK(in.src == s.win[0][w]);
                CHECK_EQ_U(in.stats.bytes_copied - read_before[w], r == 0 ? in.stats.bytes_read : since * CELL_BYTES);
                read_before[w] = in.stats.bytes_read;
            }
            for (int i = 0; i < N_STREAM; i++) { /* accept 0..3 of the new cells; stream 0 full, cut back */
                const int32_t rejected = (int32_t) ((r + i) % 4);
                kept[i] = grown[i] - (rejected < grown[i] ? rejected : grown[i]);
                CHECK_OK(ferry_sched_truncate(next, i, kept[i]));
            }
        }
        ferry_sched_free(plain);
        ferry_sched_free(next);
        step_free(&s);
    }
}

static void test_a_rollback_copies_only_the_cells_since_it(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    SUB(rollback_copies_only_the_cells_since_it(standin));
    ferry_backend_free(standin);
}


/* A truncate refuses a length below 0 or above the stream's at the copy ahead, and a stream outside
 * the windows', naming both and changing nothing (the next run copies what it would have); with
 * nothing copied ahead it does nothing. */
static void test_truncate_refuses_what_was_not_copied_ahead(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    ferry_sched * next;
    CHECK_OK(step_sched_new(&s, FERRY_COPY_RAGGED, false, 1, true, &next));
    CHECK_OK(ferry_sched_truncate(next, 1, 5)); /* not yet allocated: nothing ahead */
    static step_outputs r;
    CHECK_OK(step_run(&s, next, &r));
    const struct { int64_t stream, length; const char * says; } bad[] = {
        {1, -1, "stream 1's length -1"},      {1, 18, "stream 1's length 18 is above its length 17"},
        {N_STREAM, 0, "stream 4 (length 0)"}, {-1, 0, "stream -1 (length 0)"},
    };
    for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
        CHECK_EQ_U(ferry_sched_truncate(next, bad[b].stream, bad[b].length), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), bad[b].says) != NULL);
    }
    CHECK_EQ_U(ferry_sched_truncate(NULL, 0, 0), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_sched_truncate(next, 1, 17)); /* its length: nothing to copy again */
    CHECK_OK(step_run(&s, next, &r));
    ferry_sched_input_info in;
    CHECK_OK(ferry_sched_input(next, 0, &in));
    CHECK_EQ_U(in.stats.bytes_copied, in.stats.bytes_read); /* the copy ahead alone: nothing since */
    CHECK_OK(ferry_sched_drop_ahead(next));
    CHECK_OK(ferry_sched_truncate(next, 1, 40)); /* dropped: nothing ahead to refuse it by */
    ferry_sched_free(next);
    step_free(&s);
    ferry_backend_free(standin);
}

/* Two runs of a loop prefetching across runs, the second after `change` rewrote cells; r gets
 * the second run's outputs, and serial those of a scheduler without prefetching. */
typedef void (*change_fn)(step * s, ferry_sched * next);

static void second_run(change_fn change, bool v_trans, step_outputs * serial, step_outputs * r) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, v_trans));
    ferry_sched *plain, *next;
    CHECK_OK(step_sched_new(&s, FERRY_COPY_RAGGED, false, 0, false, &plain));
    CHECK_OK(step_sched_new(&s, FERRY_COPY_RAGGED, false, 1, true, &next));
    CHECK_OK(step_run(&s, next, r));
    change(&s, next);
    CHECK_OK(step_run(&s, next, r));
    CHECK_OK(step_run(&s, plain, serial));
    ferry_sched_free(plain);
    ferry_sched_free(next);
    step_free(&s);
    ferry_backend_free(standin);
}

/* Stream 1 cut back to 9 cells and given new ones: it is copied again from cell 0 (so neither
 * window counts as kept: the second run's kept_ahead stays 0, checked by the caller). */
static void cut_and_rewrite(step * s, ferry_sched * next) {
    (void) next;
    int32_t lens[N_STREAM], zero[N_STREAM] = {0};
    memcpy(lens, START, sizeof(lens));
    lens[1] = 9;
    int32_t hi[N_STREAM] = {0, 9, 0, 0};
    write_cells(s, zero, hi);
    if (set_lengths(s, lens) != FERRY_OK) {
        abort();
    }
}

/* Stream 3's cells rewritten at its length, announced. */
static void rewrite_announced(step * s, ferry_sched * next) {
    int32_t zero[N_STREAM] = {0}, hi[N_STREAM] = {0, 0, 0, 33};
    if (ferry_sched_drop_ahead(next) != FERRY_OK) {
        abort();
    }
    write_cells(s, zero, hi);
}

/* The same, not announced (the copy ahead landed before the run returned). */
static void rewrite_silently(step * s, ferry_sched * next) {
    (void) next;
    int32_t zero[N_STREAM] = {0}, hi[N_STREAM] = {0, 0, 0, 33};
    write_cells(s, zero, hi);
}

/* A length that falls: the stream copied again, the serial outputs; cells rewritten below a
 * length: the serial outputs when announced (drop_ahead), the first layer's stale ones when not
 * (what shows that its windows were copied under the last run, not this one). */
static void test_a_length_that_falls_or_a_drop_copies_again(void) {
    static step_outputs serial, r;
    for (int vt = 0; vt < 2; vt++) {
        SUB(second_run(cut_and_rewrite, vt == 1, &serial, &r));
        CHECK(memcmp(serial.out, r.out, sizeof(serial.out)) == 0);
        CHECK_EQ_U(r.stats.kept_ahead, 0);
        SUB(second_run(rewrite_announced, vt == 1, &serial, &r));
        CHECK(memcmp(serial.out, r.out, sizeof(serial.out)) == 0);
        CHECK_EQ_U(r.stats.kept_ahead, 0); /* dropped */
        SUB(second_run(rewrite_silently, vt == 1, &serial, &r));
        CHECK_EQ_U(r.stats.kept_ahead, 2);
        CHECK(memcmp(serial.out[0], r.out[0], sizeof(serial.out[0])) != 0);
        CHECK(memcmp(serial.out[1], r.out[1], sizeof(serial.out) - sizeof(serial.out[0])) == 0);
    }
}

/* The first layer's copies keep their memory for the whole run: no other copy, and no output,
 * shares a byte with them, whatever the depth. */
static void test_copies_ahead_keep_their_memory(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    static step_outputs r;
    for (int depth = 1; depth <= N_LAYER; depth++) {
        ferry_sched * sched;
        CHECK_OK(step_sched_new(&s, FERRY_COPY_FLAT, false, depth, true, &sched));
        CHECK_OK(step_run(&s, sched, &r));
        const int n = ferry_sched_n_inputs(sched);
        CHECK_EQ_U(n, 2 * N_LAYER);
        for (int a = 0; a < 2; a++) { /* layer 0's K and V */
            ferry_sched_input_info x;
            CHECK_OK(ferry_sched_input(sched, a, &x));
            const uintptr_t x0 = (uintptr_t) x.copy->data, x1 = x0 + ferry_tensor_nbytes(x.copy);
            for (int b = 0; b < n + N_LAYER; b++) {
                const ferry_tensor * t;
                if (b < n) {
                    ferry_sched_input_info y;
                    CHECK_OK(ferry_sched_input(sched, b, &y));
                    t = y.copy;
                } else {
                    t = s.out[b - n];
                }
                const uintptr_t y0 = (uintptr_t) t->data, y1 = y0 + ferry_tensor_nbytes(t);
                const bool apart = b == a || x1 <= y0 || y1 <= x0;
                if (!apart) {
                    fprintf(stderr, "depth %d: input %d's copy shares memory with %s\n", depth, a, t->name);
                }
                CHECK(apart);
            }
        }
        ferry_sched_free(sched);
    }
    step_free(&s);
    ferry_backend_free(standin);
}

/* A run after one that copied ahead: two copies of the first layer's K and V each on the trace,
 * the one ahead ended before the run began, the cells since within it. The link takes 10 ms a
 * transfer, so that a copy ahead the last run had not waited for would still be on it. */
static void test_trace_shows_the_copy_ahead_before_the_run(void) {
    ferry_backend * standin;
    const ferry_standin_params slow = {.latency_us = 10000};
    CHECK_OK(ferry_standin_backend_new_params(&slow, &standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    static step_outputs r;
    static ferry_sched_span sp[64];
    ferry_sched * sched;
    CHECK_OK(step_sched_new(&s, FERRY_COPY_RAGGED, false, 1, true, &sched));
    for (int run_i = 0; run_i < 3; run_i++) {
        CHECK_OK(step_run(&s, sched, &r));
        size_t n;
        CHECK_OK(ferry_sched_trace(sched, sp, 64, &n));
        int before = 0, within = 0;
        for (size_t i = 0; i < n; i++) {
            if (sp[i].kind == FERRY_SPAN_QUEUED_COPY && sp[i].part == 0) {
                before += sp[i].end < 0.0;
                within += sp[i].start >= 0.0;
            }
        }
        CHECK_EQ_U(before, run_i == 0 ? 0 : 2);
        CHECK_EQ_U(within, 2);
    }
    ferry_sched_free(sched);
    step_free(&s);
    ferry_backend_free(standin);
}

/* A graph of one part has no later part to copy the next run's under: nothing goes ahead, and
 * its outputs are the serial ones. */
static void test_one_part_copies_nothing_ahead(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    ferry_graph * one;
    CHECK_OK(ferry_graph_new(&one));
    CHECK_OK(ferry_graph_build(one, s.out[0]));
    ferry_graph * full = s.graph;
    s.graph = one;
    static step_outputs serial, r;
    ferry_sched *plain, *next;
    CHECK_OK(step_sched_new(&s, FERRY_COPY_FLAT, false, 0, false, &plain));
    CHECK_OK(step_sched_new(&s, FERRY_COPY_FLAT, false, 1, true, &next));
    for (int run_i = 0; run_i < 2; run_i++) {
        CHECK_OK(ferry_sched_graph_compute(plain, one));
        CHECK_OK(ferry_tensor_get(s.out[0], serial.out[0], 0, sizeof(serial.out[0])));
        CHECK_OK(ferry_sched_graph_compute(next, one));
        CHECK_OK(ferry_tensor_get(s.out[0], r.out[0], 0, sizeof(r.out[0])));
        CHECK(memcmp(serial.out[0], r.out[0], sizeof(r.out[0])) == 0);
        CHECK_OK(ferry_sched_get_stats(next, &r.stats));
        CHECK_EQ_U(r.stats.ahead_bytes, 0);
        CHECK_EQ_U(r.stats.prefetched, 1); /* V; K is the thread's, as without */
    }
    ferry_sched_free(plain);
    ferry_sched_free(next);
    s.graph = full;
    ferry_graph_free(one);
    step_free(&s);
    ferry_backend_free(standin);
}

/* On without a prefetch, or prefetch 0 while on, is refused and changes nothing; NULLs are
 * refused; a drop with nothing ahead does nothing. */
static void test_prefetch_next_refuses_what_would_do_nothing(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    ferry_sched * sched;
    CHECK_OK(ferry_sched_new(&standin, 1, &sched));
    CHECK_EQ_U(ferry_sched_set_prefetch_next(sched, true), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "ferry_sched_set_prefetch") != NULL);
    CHECK(!ferry_sched_get_prefetch_next(sched));
    CHECK_OK(ferry_sched_set_prefetch(sched, 2));
    CHECK_OK(ferry_sched_set_prefetch_next(sched, true));
    CHECK(ferry_sched_get_prefetch_next(sched));
    CHECK_EQ_U(ferry_sched_set_prefetch(sched, 0), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "ferry_sched_set_prefetch_next") != NULL);
    CHECK_EQ_U(ferry_sched_get_prefetch(sched), 2);
    CHECK_OK(ferry_sched_drop_ahead(sched));
    CHECK_OK(ferry_sched_set_prefetch_next(sched, false));
    CHECK_OK(ferry_sched_set_prefetch(sched, 0));
    CHECK_EQ_U(ferry_sched_set_prefetch_next(NULL, false), FERRY_ERR_INVALID_ARG);
    CHECK_EQ_U(ferry_sched_drop_ahead(NULL), FERRY_ERR_INVALID_ARG);
    CHECK(!ferry_sched_get_prefetch_next(NULL));
    ferry_sched_free(sched);
    ferry_backend_free(standin);
}

#ifdef FERRY_HAVE_CUDA_TESTS
/* The same loop on CUDA: the copy ahead on the second stream, the compute stream waiting on the
 * event after the cells since. */
static void test_cuda_decode_loop_reads_what_the_host_wrote(void) {
    ferry_backend * cuda = cuda_or_skip();
    SUB(decode_loop_reads_what_the_host_wrote(cuda));
    ferry_backend_free(cuda);
}

/* The rollback loop on CUDA: a truncate lowers where the run's copy of the new cells begins,
 * behind the copy ahead on the second stream. */
static void test_cuda_a_rollback_copies_only_the_cells_since_it(void) {
    ferry_backend * cuda = cuda_or_skip();
    SUB(rollback_copies_only_the_cells_since_it(cuda));
    ferry_backend_free(cuda);
}
#endif

static const check_test tests[] = {
    {"standin_decode_loop_reads_what_the_host_wrote", test_standin_decode_loop_reads_what_the_host_wrote},
    {"a_length_that_falls_or_a_drop_copies_again", test_a_length_that_falls_or_a_drop_copies_again},
    {"a_rollback_copies_only_the_cells_since_it", test_a_rollback_copies_only_the_cells_since_it},
    {"truncate_refuses_what_was_not_copied_ahead", test_truncate_refuses_what_was_not_copied_ahead},
    {"copies_ahead_keep_their_memory", test_copies_ahead_keep_their_memory},
    {"trace_shows_the_copy_ahead_before_the_run", test_trace_shows_the_copy_ahead_before_the_run},
    {"one_part_copies_nothing_ahead", test_one_part_copies_nothing_ahead},
    {"prefetch_next_refuses_what_would_do_nothing", test_prefetch_next_refuses_what_would_do_nothing},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"cuda_decode_loop_reads_what_the_host_wrote", test_cuda_decode_loop_reads_what_the_host_wrote},
    {"cuda_a_rollback_copies_only_the_cells_since_it", test_cuda_a_rollback_copies_only_the_cells_since_it},
#endif
};

CHECK_MAIN(tests)
