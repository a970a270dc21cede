/*
 * Every allocation fails in turn (built with -Dfault_injection=true; alloc-hook.h). Each
 * scenario is a sequence of library calls, each made through STEP: a call that fails
 * must fail because of the injected fault, with FERRY_ERR_OUT_OF_MEMORY and a message,
 * and the same call retried (the fault is spent) must then succeed. At the end the
 * scenario checks its bytes, and its objects are freed. sweep() runs a scenario with
 * allocation 1 failing, then 2, 3, ... until a run makes fewer allocations than the one
 * armed: every allocation point of the scenario has then failed once. Leaks show at exit
 * under ASan's leak check (tools/test runs this test in the sanitized build), and a
 * dangling pointer left by an error path shows when the retry or the checks touch it.
 */
#include "paged-fixture.h"
#include "alloc-hook.h"
#include "window-check.h"

#include <math.h>
#include <stdint.h>

#ifndef FERRY_FAULT_INJECTION
#error "test_faults needs the hook: meson -Dfault_injection=true"
#endif

/* A call under the fault: OK, or the fault's OUT_OF_MEMORY with a message and then OK on retry. */
#define STEP(expr)                                                                                      \
    do {                                                                                                \
        ferry_clear_error();                                                                            \
        ferry_status step_st_ = (expr);                                                                 \
        if (step_st_ != FERRY_OK) {                                                                     \
            if (step_st_ != FERRY_ERR_OUT_OF_MEMORY || !ferry_fault_alloc_fired() ||                     \
                ferry_last_error()[0] == '\0') {                                                        \
                fprintf(stderr, "%s:%d: %s gave '%s' (%s)%s\n", __FILE__, __LINE__, #expr,              \
                        ferry_status_name(step_st_), ferry_last_error(),                                \
                        ferry_fault_alloc_fired() ? "" : " with no allocation failed");                 \
                check_failures++;                                                                       \
                return;                                                                                 \
            }                                                                                           \
            step_failed++;                                                                              \
            step_st_ = (expr);                                                                          \
            if (step_st_ != FERRY_OK) {                                                                 \
                fprintf(stderr, "%s:%d: %s retried without the fault: %s (%s)\n", __FILE__, __LINE__, #expr, \
                        ferry_status_name(step_st_), ferry_last_error());                               \
                check_failures++;                                                                       \
                return;                                                                                 \
            }                                                                                           \
        }                                                                                               \
    } while (0)

static long step_failed; /* calls that returned the fault in this sweep */

/*
 * Run `run` on a zeroed state with allocation n failing, n = 1, 2, ...; `fini` frees the
 * state whatever run left. Prints how many points failed; a point whose failure every
 * call absorbed (a fallback took over) is counted apart. Returns the number of points.
 */
static long sweep(const char * name, void (*run)(void *), void (*fini)(void *), void * state, size_t size) {
    step_failed = 0;
    long absorbed = 0;
    for (long n = 1;; n++) {
        memset(state, 0, size);
        const long failed_before = step_failed;
        const int before = check_failures;
        ferry_fault_alloc_arm(n);
        run(state);
        const bool fired = ferry_fault_alloc_fired();
        const long made = ferry_fault_alloc_count();
        ferry_fault_alloc_arm(0);
        fini(state);
        if (check_failures != before) {
            fprintf(stderr, "%s: with allocation %ld of %ld failing\n", name, n, made);
            return -1;
        }
        if (!fired) {
            printf("%s: %ld allocation points failed in turn (%ld reported, %ld absorbed by a fallback)\n", name,
                   n - 1, step_failed, absorbed);
            return n - 1;
        }
        absorbed += step_failed == failed_before;
    }
}

/* Does copy hold every byte of src's span (src on the host)? */
static bool same_span(const ferry_tensor * src, const ferry_tensor * copy) {
    const size_t span = ferry_tensor_nbytes(src);
    uint8_t * got = malloc(span);
    const bool same = got && ferry_tensor_get(copy, got, 0, span) == FERRY_OK && memcmp(got, src->data, span) == 0;
    free(got);
    return same;
}

/* ------------------------------------------------ a KV cache and its windows, copied by each policy */

typedef struct {
    ferry_backend * split;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * buf;
} kv_state;

static void kv_run(void * p) {
    kv_state * s = p;
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                                    .n_ctx = 64, .n_stream = 4, .n_layer = 2, .v_trans = true};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(ferry_dummy_backend_new(&dp, &s->split));
    STEP(ferry_kv_cache_new(&params, ferry_cpu_buffer_type(), &s->kv));
    kv_fill(s->kv);
    STEP(ferry_context_new(&s->ctx));
    kv_fixture f = {.kv = s->kv}; /* for kv_check_window_copy, which reads only the cache */
    for (int policy = FERRY_COPY_FLAT; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        for (int32_t layer = 0; layer < params.n_layer; layer++) {
            ferry_tensor *k, *v, *copy;
            STEP(ferry_kv_cache_window(s->kv, s->ctx, layer, 5 + layer, 1, 3, &k, &v));
            CHECK(k && v);
            STEP(ferry_tensor_dup_layout(s->ctx, k, &copy));
            ferry_buffer_free(s->buf);
            s->buf = NULL;
            STEP(ferry_backend_alloc_buffer(s->split, ferry_tensor_nbytes(k), &s->buf));
            STEP(ferry_buffer_place_tensor(s->buf, copy, 0));
            STEP(ferry_tensor_memset(copy, SENTINEL, 0, ferry_tensor_nbytes(copy)));
            ferry_copy_stats stats;
            STEP(ferry_copy_input(s->split, (ferry_copy_policy) policy, k, copy, &stats));
            if (stats.path == FERRY_COPY_FLAT) { /* the span, gaps included */
                CHECK(same_span(k, copy));
            } else {
                CHECK_EQ_U(kv_check_window_copy(&f, k, copy, stats.bytes_copied), 0);
            }
        }
    }
}

static void kv_fini(void * p) {
    kv_state * s = p;
    ferry_buffer_free(s->buf);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_backend_free(s->split);
}

static void test_kv_cache_windows_fail_cleanly_at_each_allocation(void) {
    kv_state s;
    CHECK(sweep("kv cache and windows", kv_run, kv_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ ragged windows: each stream's used cells */

typedef struct {
    ferry_backend * split;
    ferry_backend * cpu;
    ferry_backend * dev;
    ferry_kv_cache * kv;
    ferry_kv_cache * dev_kv;
    ferry_context * ctx;
    ferry_buffer * buf;
    ferry_buffer * len_buf;
} ragged_state;

/* K and the transposed V of a host cache, each copied by both routes (calls dear: the shortest
 * and the tails; rows dear: a copy per stream) into its layout and its compact layout; then a
 * V window in another device's memory, staged through the host. The lengths, the route's
 * lists and the staging are allocations too. */
static void ragged_run(void * p) {
    ragged_state * s = p;
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                                    .n_ctx = 64, .n_stream = 4, .n_layer = 1, .v_trans = true};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(ferry_dummy_backend_new(&dp, &s->split));
    STEP(ferry_dummy_backend_new(&dp, &s->dev));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_kv_cache_new(&params, ferry_cpu_buffer_type(), &s->kv));
    kv_fill(s->kv);
    STEP(ferry_kv_cache_new(&params, ferry_backend_default_buffer_type(s->dev), &s->dev_kv));
    kv_fill(s->dev_kv);
    STEP(ferry_context_new(&s->ctx));
    const int64_t n_stream = 4;
    const int32_t lens[4] = {5, 0, 12, 5};
    const int64_t used[4] = {5, 0, 12, 5};
    ferry_tensor * len;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, &n_stream, &len));
    STEP(ferry_backend_alloc_buffer(s->cpu, sizeof(lens), &s->len_buf));
    STEP(ferry_buffer_place_tensor(s->len_buf, len, 0));
    STEP(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    const ferry_copy_cost_model models[2] = {{.call_us = 100, .gbps = 10}, {.call_us = 0.01, .row_ns = 1000, .gbps = 10}};
    for (int source = 0; source < 2; source++) {
        kv_fixture f = {.kv = source ? s->dev_kv : s->kv}; /* for kv_check_used_copy, which reads only the cache */
        for (int route = 0; route < 2; route++) {
            for (int which = source; which < 2; which++) {
                for (int compact = 0; compact < 2; compact++) {
                    ferry_tensor *k, *v, *copy;
                    STEP(ferry_kv_cache_window(f.kv, s->ctx, 0, 12, 0, 3, &k, &v));
                    ferry_tensor * w = which ? v : k;
                    STEP(ferry_tensor_set_used_cells(w, len, which ? 0 : 1, 3, 0));
                    STEP(compact ? ferry_tensor_compact_layout(s->ctx, w, &copy) : ferry_tensor_dup_layout(s->ctx, w, &copy));
                    ferry_buffer_free(s->buf);
                    s->buf = NULL;
                    STEP(ferry_backend_alloc_buffer(s->split, ferry_tensor_nbytes(copy), &s->buf));
                    STEP(ferry_buffer_place_tensor(s->buf, copy, 0));
                    STEP(ferry_tensor_memset(copy, SENTINEL, 0, ferry_tensor_nbytes(copy)));
                    STEP(ferry_backend_set_copy_cost_model(s->split, &models[route]));
                    ferry_copy_stats stats;
                    STEP(ferry_copy_input(s->split, FERRY_COPY_RAGGED, w, copy, &stats));
                    CHECK(stats.path == FERRY_COPY_RAGGED);
                    CHECK_EQ_U(kv_check_used_copy(&f, w, copy, used, stats.bytes_copied), 0);
                }
            }
        }
    }
}

static void ragged_fini(void * p) {
    ragged_state * s = p;
    ferry_buffer_free(s->buf);
    ferry_buffer_free(s->len_buf);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_kv_cache_free(s->dev_kv);
    ferry_backend_free(s->cpu);
    ferry_backend_free(s->dev);
    ferry_backend_free(s->split);
}

static void test_ragged_windows_fail_cleanly_at_each_allocation(void) {
    ragged_state s;
    CHECK(sweep("ragged windows", ragged_run, ragged_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ a paged cache: tables, windows gathered, a step */

typedef struct {
    ferry_backend * split;
    ferry_backend * cpu;
    ferry_backend * dev;
    ferry_paged_cache * c;
    ferry_paged_cache * dev_c;
    ferry_context * ctx;
    ferry_buffer * buf;
    ferry_buffer * in_buf;
    ferry_graph * graph;
    ferry_sched * sched;
} paged_state;

/* The step as a caller retries it after a failure (as step_fresh). */
static ferry_status paged_step_fresh(paged_state * s, ferry_tensor * const * q, ferry_tensor * len,
                                     ferry_tensor ** outs) {
    ferry_sched_clear_assignments(s->sched);
    ferry_graph_clear(s->graph);
    ferry_backend * on[2] = {s->split, s->split};
    return ferry_paged_attention_step_on(s->c, s->ctx, 2, 12, 1, 2, q, len, true, s->sched, on, s->graph, outs);
}

/* Tables from the free list and the caller's (each table grown past its first room); both windows
 * of a host pool gathered into the stand-in per block, per run and batched, and on its copy queue;
 * a device pool's staged; the plan; a step through the scheduler. */
static void paged_run(void * p) {
    paged_state * s = p;
    ferry_paged_params params = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                                 .block_size = 2, .n_blocks = 40, .n_seq = 3, .n_layer = 2, .v_trans = true};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(ferry_standin_backend_new(&s->split));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_dummy_backend_new(&dp, &s->dev));
    STEP(ferry_paged_cache_new(&params, ferry_cpu_buffer_type(), NULL, &s->c));
    STEP(ferry_paged_cache_allocate(s->c, 1, 3));
    STEP(ferry_paged_cache_append(s->c, 1, 9));
    STEP(ferry_paged_cache_set_table(s->c, 2, (const int32_t[]) {30, 31, 20, 22, 24, 26, 28, 33, 34, 35, 36, 37,
                                                                 38, 39, 19, 18, 17}, 17, 33));
    STEP(ferry_paged_cache_free_seq(s->c, 1));
    STEP(ferry_paged_cache_allocate(s->c, 1, 12));
    fill_floats(ferry_paged_cache_layer_buffer(s->c, 0)); /* finite values: the step's outputs are checked */
    STEP(ferry_context_new(&s->ctx));
    const int64_t ns = 2;
    ferry_tensor * len;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, &ns, &len));
    STEP(ferry_backend_alloc_buffer(s->cpu, 4096, &s->in_buf));
    STEP(ferry_buffer_place_tensor(s->in_buf, len, 0));
    const int32_t lens[2] = {11, 12};
    const int64_t used[2] = {11, 12};
    STEP(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    ferry_backend * queue;
    STEP(ferry_backend_get_copy_queue(s->split, &queue));
    const ferry_gather_method methods[3] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS, FERRY_GATHER_BATCHED};
    for (int m = 0; m < 3; m++) {
        for (int v = 0; v < 2; v++) {
            ferry_tensor *k, *vw, *copy;
            STEP(ferry_paged_cache_window(s->c, s->ctx, 1, 12, 1, 2, &k, &vw));
            ferry_tensor * w = v ? vw : k;
            STEP(ferry_tensor_set_used_cells(w, len, v ? 0 : 1, 3, 12));
            ferry_buffer_free(s->buf);
            s->buf = NULL;
            STEP(paged_split_copy(s->split, s->ctx, w, &s->buf, &copy));
            STEP(ferry_paged_cache_set_gather(s->c, methods[m]));
            ferry_paged_plan plan;
            ferry_gather_copy copies[64];
            size_t n;
            STEP(ferry_copy_paged_plan(w, s->split, &plan, copies, 64, &n));
            ferry_copy_stats stats;
            STEP(m == 2 ? ferry_copy_input_async(queue, FERRY_COPY_FLAT, w, copy, &stats)
                        : ferry_copy_input(s->split, FERRY_COPY_RAGGED, w, copy, &stats));
            STEP(ferry_backend_synchronize(queue));
            CHECK(stats.gather == methods[m]);
            CHECK_EQ_U(paged_check_copy(s->c, v, 1, 1, 2, 12, used, copy, stats.bytes_copied), 0);
        }
    }
    /* pools in a device's memory, staged through the host */
    ferry_buffer_type * dev_buft = ferry_backend_default_buffer_type(s->dev);
    ferry_buffer_type * on_dev[2] = {dev_buft, dev_buft};
    params.v_trans = false;
    STEP(ferry_paged_cache_new(&params, NULL, on_dev, &s->dev_c));
    paged_fill(s->dev_c);
    STEP(ferry_paged_cache_set_table(s->dev_c, 0, (const int32_t[]) {3, 4, 8, 1}, 4, 7));
    ferry_tensor *k, *copy;
    STEP(ferry_paged_cache_window(s->dev_c, s->ctx, 0, 8, 0, 0, &k, NULL));
    ferry_buffer_free(s->buf);
    s->buf = NULL;
    STEP(paged_split_copy(s->split, s->ctx, k, &s->buf, &copy));
    ferry_copy_stats stats;
    STEP(ferry_copy_input(s->split, FERRY_COPY_PLAN, k, copy, &stats));
    CHECK_EQ_U(paged_check_copy(s->dev_c, false, 0, 0, 1, 8, (const int64_t[]) {7}, copy, stats.bytes_copied), 0);
    /* a step over both layers, gathered by auto */
    STEP(ferry_paged_cache_set_gather(s->c, FERRY_GATHER_AUTO));
    const int64_t ne_q[4] = {8, 4, 1, 2};
    ferry_tensor * q[2];
    for (int l = 0; l < 2; l++) {
        STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]));
        STEP(ferry_buffer_place_tensor(s->in_buf, q[l], 1024 + (size_t) l * 1024));
        STEP(ferry_tensor_memset(q[l], 0, 0, ferry_tensor_nbytes(q[l])));
    }
    ferry_backend * backends[2] = {s->split, s->cpu};
    STEP(ferry_sched_new(backends, 2, &s->sched));
    STEP(ferry_graph_new(&s->graph));
    ferry_tensor * outs[2] = {NULL, NULL};
    STEP(paged_step_fresh(s, q, len, outs));
    STEP(ferry_sched_graph_compute(s->sched, s->graph));
    float row[8 * 4 * 2];
    CHECK_OK(ferry_tensor_get(outs[1], row, 0, sizeof(row)));
    for (size_t i = 0; i < sizeof(row) / sizeof(row[0]); i++) {
        CHECK(isfinite(row[i]));
    }
}

static void paged_fini(void * p) {
    paged_state * s = p;
    ferry_sched_free(s->sched);
    ferry_graph_free(s->graph);
    ferry_buffer_free(s->buf);
    ferry_buffer_free(s->in_buf);
    ferry_context_free(s->ctx);
    ferry_paged_cache_free(s->c);
    ferry_paged_cache_free(s->dev_c);
    ferry_backend_free(s->dev);
    ferry_backend_free(s->cpu);
    ferry_backend_free(s->split);
}

static void test_paged_cache_fails_cleanly_at_each_allocation(void) {
    paged_state s;
    CHECK(sweep("paged cache", paged_run, paged_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ a device block pool: sync, plan, a step through its table */

typedef struct {
    ferry_backend * split;
    ferry_backend * cpu;
    ferry_paged_cache * c;
    ferry_block_pool * pool;
    ferry_context * ctx;
    ferry_buffer * in_buf;
    ferry_graph * graph;
    ferry_sched * sched;
} pool_state;

/* A pool of a shared-prefix cache: synced whole, then a smaller plan's resident set and groups, then
 * a step through the device table, its sync made under prefetch, scheduled on the stand-in. */
static void pool_run(void * p) {
    pool_state * s = p;
    const ferry_paged_params params = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8,
                                       .n_head_kv = 2, .block_size = 2, .n_blocks = 16, .n_seq = 2, .n_layer = 2,
                                       .v_trans = true, .share_blocks = true};
    STEP(ferry_standin_backend_new(&s->split));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_paged_cache_new(&params, ferry_cpu_buffer_type(), NULL, &s->c));
    STEP(ferry_paged_cache_set_table(s->c, 0, (const int32_t[]) {0, 1, 2}, 3, 6));
    STEP(ferry_paged_cache_set_table(s->c, 1, (const int32_t[]) {0, 1, 3}, 3, 5));
    fill_floats(ferry_paged_cache_layer_buffer(s->c, 0));
    STEP(ferry_block_pool_new(s->c, s->split, 3, &s->pool));
    int64_t ends[2], n_groups;
    STEP(ferry_block_pool_plan(s->pool, 0, 2, NULL, ends, 2, &n_groups));
    CHECK_EQ_U(n_groups, 2);
    STEP(ferry_block_pool_sync(s->pool, 0, 1, NULL));
    STEP(ferry_block_pool_set_resident(s->pool, NULL, 0));
    STEP(ferry_context_new(&s->ctx));
    const int64_t ns = 2, ne_q[4] = {8, 4, 1, 2};
    ferry_tensor *len, *q[2];
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, &ns, &len));
    STEP(ferry_backend_alloc_buffer(s->cpu, 4096, &s->in_buf));
    STEP(ferry_buffer_place_tensor(s->in_buf, len, 0));
    STEP(ferry_tensor_set(len, (const int32_t[]) {6, 5}, 0, 8));
    for (int l = 0; l < 2; l++) {
        STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]));
        STEP(ferry_buffer_place_tensor(s->in_buf, q[l], 1024 + (size_t) l * 1024));
        STEP(ferry_tensor_memset(q[l], 0, 0, ferry_tensor_nbytes(q[l])));
    }
    ferry_block_pool_free(s->pool);
    s->pool = NULL;
    STEP(ferry_block_pool_new(s->c, s->split, 4, &s->pool));
    ferry_backend * backends[2] = {s->split, s->cpu};
    STEP(ferry_sched_new(backends, 2, &s->sched));
    STEP(ferry_graph_new(&s->graph));
    ferry_tensor * outs[2];
    STEP(ferry_block_pool_attention_step(s->pool, s->ctx, 2, 0, 2, q, len, s->sched, s->graph, outs));
    STEP(ferry_block_pool_set_prefetch(s->pool, true)); /* the sends on the copy queue, an event after */
    STEP(ferry_block_pool_sync(s->pool, 0, 2, (const int32_t[]) {6, 5}));
    STEP(ferry_block_pool_wait(s->pool));
    STEP(ferry_sched_graph_compute(s->sched, s->graph));
    float row[8 * 4 * 2];
    CHECK_OK(ferry_tensor_get(outs[1], row, 0, sizeof(row)));
    for (size_t i = 0; i < sizeof(row) / sizeof(row[0]); i++) {
        CHECK(isfinite(row[i]));
    }
}

static void pool_fini(void * p) {
    pool_state * s = p;
    ferry_sched_free(s->sched);
    ferry_graph_free(s->graph);
    ferry_buffer_free(s->in_buf);
    ferry_context_free(s->ctx);
    ferry_block_pool_free(s->pool);
    ferry_paged_cache_free(s->c);
    ferry_backend_free(s->cpu);
    ferry_backend_free(s->split);
}

static void test_block_pool_fails_cleanly_at_each_allocation(void) {
    pool_state s;
    CHECK(sweep("block pool", pool_run, pool_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ a KV cache of placed layers of different sizes */

typedef struct {
    ferry_backend * dev;
    ferry_kv_cache * kv;
    ferry_kv_cache * over;
    ferry_context * ctx;
    ferry_buffer * own[2];
} kv_layers_state;

static void kv_layers_run(void * p) {
    kv_layers_state * s = p;
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                                    .n_ctx = 64, .n_stream = 2, .n_layer = 3, .v_trans = true};
    STEP(ferry_standin_backend_new(&s->dev));
    ferry_buffer_type * dev = ferry_backend_default_buffer_type(s->dev);
    ferry_buffer_type * bufts[3] = {NULL, dev, dev};
    const int64_t cells[3] = {0, 8, 0};
    STEP(ferry_kv_cache_new_layers(&params, ferry_cpu_buffer_type(), bufts, cells, &s->kv));
    CHECK(ferry_kv_cache_layer_buffer(s->kv, 1) == ferry_kv_cache_layer_buffer(s->kv, 2));
    STEP(ferry_context_new(&s->ctx));
    ferry_tensor *k, *v;
    STEP(ferry_kv_cache_window(s->kv, s->ctx, 1, 8, 0, 1, &k, &v));
    ferry_tensor *k1, *v1;
    STEP(ferry_kv_cache_k(s->kv, 1, &k1));
    STEP(ferry_kv_cache_v(s->kv, 1, &v1));
    for (int i = 0; i < 2; i++) {
        STEP(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), 8192, &s->own[i]));
    }
    ferry_buffer * kb[3] = {s->own[0], s->own[0], s->own[1]}, * vb[3] = {s->own[1], s->own[1], s->own[0]};
    const size_t ko[3] = {0, 4096, 4096}, vo[3] = {0, 2048, 0};
    const int64_t small[3] = {8, 8, 8};
    STEP(ferry_kv_cache_new_over(&params, small, kb, ko, vb, vo, &s->over));
}

static void kv_layers_fini(void * p) {
    kv_layers_state * s = p;
    ferry_kv_cache_free(s->over);
    ferry_buffer_free(s->own[0]);
    ferry_buffer_free(s->own[1]);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_backend_free(s->dev);
}

static void test_kv_cache_layers_fail_cleanly_at_each_allocation(void) {
    kv_layers_state s;
    CHECK(sweep("kv cache of placed layers", kv_layers_run, kv_layers_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ a decode step made in one call (step-graph.c) */

typedef struct {
    ferry_backend * cpu;
    ferry_backend * split;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * buf;
    ferry_graph * graph;
    ferry_sched * sched;
    ferry_tensor * q[2];
    ferry_tensor * kv_len;
} step_state;

/* The step as a caller retries it after a failure: its documented state cleared first
 * (assignments made before running out of memory, part of the step in the graph). */
static ferry_status step_fresh(step_state * s, ferry_tensor ** outs) {
    ferry_sched_clear_assignments(s->sched);
    ferry_graph_clear(s->graph);
    return ferry_kv_attention_step(s->kv, s->ctx, 2, 5, 1, 3, s->q, s->kv_len, true, s->sched, s->split, s->graph,
                                   outs);
}

static void step_run(void * p) {
    step_state * s = p;
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                                    .n_ctx = 64, .n_stream = 4, .n_layer = 2, .v_trans = true};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(ferry_dummy_backend_new(&dp, &s->split));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_kv_cache_new(&params, ferry_cpu_buffer_type(), &s->kv));
    fill_floats(ferry_kv_cache_buffer(s->kv));
    STEP(ferry_context_new(&s->ctx));
    const int64_t ne_q[4] = {8, 4, 1, 3}, ne_len[1] = {3};
    STEP(ferry_backend_alloc_buffer(s->split, 4096, &s->buf));
    for (int l = 0; l < 2; l++) {
        STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 4, ne_q, &s->q[l]));
        STEP(ferry_buffer_place_tensor(s->buf, s->q[l], (size_t) l * 1024));
        STEP(ferry_tensor_memset(s->q[l], 0, 0, ferry_tensor_nbytes(s->q[l])));
    }
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, ne_len, &s->kv_len));
    STEP(ferry_buffer_place_tensor(s->buf, s->kv_len, 2048));
    const int32_t lengths[3] = {5, 3, 4};
    STEP(ferry_tensor_set(s->kv_len, lengths, 0, sizeof(lengths)));
    ferry_backend * backends[2] = {s->split, s->cpu};
    STEP(ferry_sched_new(backends, 2, &s->sched));
    STEP(ferry_graph_new(&s->graph));
    ferry_tensor * outs[2] = {NULL, NULL};
    STEP(step_fresh(s, outs));
    CHECK(outs[0] && outs[1]);
    CHECK_EQ_U(ferry_sched_n_assigned(s->sched), 2);
    CHECK_EQ_U(ferry_graph_n_nodes(s->graph), 2 + 2 * 4); /* per layer: attention, two windows of two views */
    STEP(ferry_sched_graph_compute(s->sched, s->graph));
    float row[8 * 4 * 3];
    CHECK_OK(ferry_tensor_get(outs[1], row, 0, sizeof(row)));
    for (size_t i = 0; i < sizeof(row) / sizeof(row[0]); i++) {
        CHECK(isfinite(row[i]));
    }
}

static void step_fini(void * p) {
    step_state * s = p;
    ferry_sched_free(s->sched);
    ferry_graph_free(s->graph);
    ferry_buffer_free(s->buf);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_backend_free(s->split);
    ferry_backend_free(s->cpu);
}

static void test_kv_attention_step_fails_cleanly_at_each_allocation(void) {
    step_state s;
    CHECK(sweep("kv attention step", step_run, step_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ the scheduler: alloc and compute, two windows */

typedef struct {
    ferry_backend * cpu;
    ferry_backend * split;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_graph * graph;
    ferry_sched * sched;
    ferry_buffer * lengths; /* the windows' used cells, where a scenario sets them */
} sched_state;

static ferry_copy_policy sched_policy;
static bool sched_compact;

/* The scheduler's scenarios' objects: a one-layer cache of floats, the split (a dummy with
 * real memory, or the stand-in with its copy queue), the CPU, and a scheduler over both
 * under sched_policy. */
static void sched_open(sched_state * s, bool standin) {
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                                    .n_ctx = 96, .n_stream = 4, .n_layer = 1};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(standin ? ferry_standin_backend_new(&s->split) : ferry_dummy_backend_new(&dp, &s->split));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_kv_cache_new(&params, ferry_cpu_buffer_type(), &s->kv));
    fill_floats(ferry_kv_cache_buffer(s->kv));
    STEP(ferry_context_new(&s->ctx));
    ferry_backend * backends[2] = {s->split, s->cpu};
    STEP(ferry_sched_new(backends, 2, &s->sched));
    STEP(ferry_sched_set_policy(s->sched, sched_policy));
}

static void sched_run(void * p) {
    sched_state * s = p;
    SUB(sched_open(s, false));
    STEP(ferry_sched_set_compact(s->sched, sched_compact));
    /* two decode steps: a new graph each, the second window longer (the allocator grows) */
    const int64_t n_kv[2] = {5, 11};
    for (int step = 0; step < 2; step++) {
        ferry_tensor *window, *dup, *out;
        STEP(ferry_kv_cache_window(s->kv, s->ctx, 0, n_kv[step], step, 3, &window, NULL));
        STEP(ferry_dup(s->ctx, window, &dup));
        STEP(ferry_scale(s->ctx, dup, 0.5f, &out));
        STEP(ferry_tensor_set_output(out));
        ferry_graph_free(s->graph);
        s->graph = NULL;
        STEP(ferry_graph_new(&s->graph));
        STEP(ferry_graph_build(s->graph, out));
        ferry_sched_clear_assignments(s->sched);
        STEP(ferry_sched_set_tensor_backend(s->sched, dup, s->split));
        STEP(ferry_sched_alloc_graph(s->sched, s->graph));
        STEP(ferry_sched_graph_compute(s->sched, s->graph));
        CHECK_EQ_U(ferry_sched_n_inputs(s->sched), 1);
        CHECK(scaled_copy_of(out, window, 0.5f));
    }
}

static void sched_fini(void * p) {
    sched_state * s = p;
    ferry_sched_free(s->sched);
    ferry_buffer_free(s->lengths);
    ferry_graph_free(s->graph);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_backend_free(s->cpu);
    ferry_backend_free(s->split);
}

static void test_sched_policies_fail_cleanly_at_each_allocation(void) {
    for (int policy = FERRY_COPY_FLAT; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        for (int compact = 0; compact <= 1; compact++) {
            char name[80];
            snprintf(name, sizeof(name), "scheduler, %s%s", ferry_copy_policy_name((ferry_copy_policy) policy),
                     compact ? ", compact" : "");
            sched_policy = (ferry_copy_policy) policy;
            sched_compact = compact;
            sched_state s;
            CHECK(sweep(name, sched_run, sched_fini, &s, sizeof(s)) > 0);
        }
    }
}

/* K and V windows each read by its own node on the split (a copy scaled by 0.5, an output):
 * two parts, in a new s->graph, the scheduler's assignments made anew. */
static void two_parts(sched_state * s, ferry_tensor * k, ferry_tensor * v, ferry_tensor ** out_k,
                      ferry_tensor ** out_v) {
    ferry_tensor *dup_k, *dup_v;
    STEP(ferry_dup(s->ctx, k, &dup_k));
    STEP(ferry_scale(s->ctx, dup_k, 0.5f, out_k));
    STEP(ferry_dup(s->ctx, v, &dup_v));
    STEP(ferry_scale(s->ctx, dup_v, 0.5f, out_v));
    STEP(ferry_tensor_set_output(*out_k));
    STEP(ferry_tensor_set_output(*out_v));
    ferry_graph_free(s->graph);
    s->graph = NULL;
    STEP(ferry_graph_new(&s->graph));
    STEP(ferry_graph_build(s->graph, *out_k));
    STEP(ferry_graph_build(s->graph, *out_v));
    ferry_sched_clear_assignments(s->sched);
    STEP(ferry_sched_set_tensor_backend(s->sched, dup_k, s->split));
    STEP(ferry_sched_set_tensor_backend(s->sched, dup_v, s->split));
}

/* The same with prefetching on the stand-in's copy queue: a K and a V window read by
 * separate nodes (two parts), so that V's copy goes ahead on the queue and K's is the
 * calling thread's; the queue, its worker and its events are allocations too. */
static void sched_prefetch_run(void * p) {
    sched_state * s = p;
    SUB(sched_open(s, true));
    STEP(ferry_sched_set_prefetch(s->sched, 2));
    const int64_t n_kv[2] = {5, 11};
    for (int step = 0; step < 2; step++) {
        ferry_tensor *k, *v, *out_k, *out_v;
        STEP(ferry_kv_cache_window(s->kv, s->ctx, 0, n_kv[step], step, 3, &k, &v));
        SUB(two_parts(s, k, v, &out_k, &out_v));
        STEP(ferry_sched_alloc_graph(s->sched, s->graph));
        STEP(ferry_sched_graph_compute(s->sched, s->graph));
        CHECK_EQ_U(ferry_sched_n_inputs(s->sched), 2);
        ferry_sched_stats st;
        STEP(ferry_sched_get_stats(s->sched, &st));
        CHECK_EQ_U(st.prefetched, 1);
        CHECK(scaled_copy_of(out_k, k, 0.5f));
        CHECK(scaled_copy_of(out_v, v, 0.5f));
    }
}

/* Across runs (ferry_sched_set_prefetch_next): K and V windows carrying their lengths, read
 * by separate nodes, the graph run three times: the first part's windows go ahead under the
 * second, and each later run copies the cells since (none: the lengths stay). */
static void sched_prefetch_next_run(void * p) {
    sched_state * s = p;
    SUB(sched_open(s, true));
    STEP(ferry_sched_set_prefetch(s->sched, 1));
    STEP(ferry_sched_set_prefetch_next(s->sched, true));
    const int64_t n_kv = 7, len_ne[1] = {4};
    ferry_tensor *len, *k, *v, *out_k, *out_v;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, len_ne, &len));
    STEP(ferry_backend_alloc_buffer(s->cpu, ferry_tensor_nbytes(len), &s->lengths));
    STEP(ferry_buffer_place_tensor(s->lengths, len, 0));
    const int32_t lens[4] = {7, 7, 7, 7};
    STEP(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    STEP(ferry_kv_cache_window(s->kv, s->ctx, 0, n_kv, 0, 3, &k, &v));
    STEP(ferry_tensor_set_used_cells(k, len, 1, 3, 0));
    STEP(ferry_tensor_set_used_cells(v, len, 1, 3, 0));
    SUB(two_parts(s, k, v, &out_k, &out_v));
    for (int run = 0; run < 3; run++) {
        STEP(ferry_sched_graph_compute(s->sched, s->graph));
        ferry_sched_stats st;
        STEP(ferry_sched_get_stats(s->sched, &st));
        CHECK_EQ_U(st.prefetched, 2);
        CHECK(scaled_copy_of(out_k, k, 0.5f));
        CHECK(scaled_copy_of(out_v, v, 0.5f));
    }
    STEP(ferry_sched_drop_ahead(s->sched));
}

static void test_sched_prefetch_fails_cleanly_at_each_allocation(void) {
    for (int policy = FERRY_COPY_FLAT; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        char name[80];
        snprintf(name, sizeof(name), "scheduler prefetching, %s", ferry_copy_policy_name((ferry_copy_policy) policy));
        sched_policy = (ferry_copy_policy) policy;
        sched_state s;
        CHECK(sweep(name, sched_prefetch_run, sched_fini, &s, sizeof(s)) > 0);
        snprintf(name, sizeof(name), "scheduler prefetching across runs, %s",
                 ferry_copy_policy_name((ferry_copy_policy) policy));
        CHECK(sweep(name, sched_prefetch_next_run, sched_fini, &s, sizeof(s)) > 0);
    }
}

/* ------------------------------------------------ the stand-in with a link and a memory size */

#define LINKED_MEMORY ((size_t) 1 << 20)

typedef struct {
    ferry_backend * device;
    ferry_context * ctx;
    ferry_buffer * buf;
    ferry_event * event;
} linked_state;

/* Its making, an allocation against its memory, transfers over the link blocking and on the
 * copy queue: a failed allocation takes nothing from the memory, so what is free at the end
 * is the memory less the one buffer. */
static void linked_run(void * p) {
    linked_state * s = p;
    const ferry_standin_params params = {.link_gbps = 50, .latency_us = 1, .memory = LINKED_MEMORY};
    STEP(ferry_standin_backend_new_params(&params, &s->device));
    STEP(ferry_context_new(&s->ctx));
    const int64_t ne = 4096;
    ferry_tensor * t;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 1, &ne, &t));
    STEP(ferry_backend_alloc_buffer(s->device, ferry_tensor_nbytes(t), &s->buf));
    STEP(ferry_buffer_place_tensor(s->buf, t, 0));
    float host[4096], back[4096];
    for (int i = 0; i < 4096; i++) {
        host[i] = (float) i;
    }
    STEP(ferry_tensor_set_2d(t, host, 0, 1024, 8, 2048, 1024));
    ferry_backend * queue;
    STEP(ferry_backend_get_copy_queue(s->device, &queue));
    STEP(ferry_event_new(queue, 0, &s->event));
    STEP(ferry_backend_tensor_set_async(queue, t, host, 0, sizeof(host)));
    STEP(ferry_event_record(s->event, queue));
    STEP(ferry_event_synchronize(s->event));
    STEP(ferry_tensor_get(t, back, 0, sizeof(back)));
    CHECK(memcmp(host, back, sizeof(host)) == 0);
    size_t free_bytes, total;
    STEP(ferry_backend_get_memory(queue, &free_bytes, &total));
    CHECK_EQ_U(total, LINKED_MEMORY);
    CHECK_EQ_U(free_bytes, LINKED_MEMORY - sizeof(host));
    ferry_link_stats st;
    STEP(ferry_standin_get_link(s->device, NULL, &st));
    CHECK(st.transfers >= 3);
}

static void linked_fini(void * p) {
    linked_state * s = p;
    ferry_event_free(s->event);
    ferry_buffer_free(s->buf);
    ferry_context_free(s->ctx);
    ferry_backend_free(s->device);
}

static void test_linked_standin_fails_cleanly_at_each_allocation(void) {
    linked_state s;
    CHECK(sweep("stand-in with a link and a memory size", linked_run, linked_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ plans that need the heap */

typedef struct {
    ferry_backend * split;
    ferry_context * ctx;
    ferry_buffer * src_buf;
    ferry_buffer * dst_buf;
} plan_state;

static void plan_run(void * p) {
    plan_state * s = p;
    /* rows that interleave (0 12 24 | 20 32 44): the planner sorts them in a heap array */
    ferry_tensor tangled = {.type = FERRY_TYPE_F32, .ne = {1, 3, 2, 1}, .nb = {4, 12, 20, 20}};
    ferry_copy_2d c[8];
    size_t n = 0;
    STEP(ferry_copy_plan(&tangled, c, 8, &n));
    CHECK_EQ_U(n, 3);
    /* a view of more copies than the copy path keeps on its stack: 100 rows of 256 bytes,
     * spaced by a 4-D layout whose strides do not nest, far apart, so that the plan pays */
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    STEP(ferry_dummy_backend_new(&dp, &s->split));
    STEP(ferry_context_new(&s->ctx));
    const int64_t n_src = 760 * 1024;
    ferry_tensor *src, *view, *copy;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 1, &n_src, &src));
    STEP(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), ferry_tensor_nbytes(src), &s->src_buf));
    STEP(ferry_buffer_place_tensor(s->src_buf, src, 0));
    float * v = src->data;
    for (int64_t i = 0; i < n_src; i++) {
        v[i] = (float) i;
    }
    const int64_t ne[4] = {64, 5, 5, 4};
    const size_t nb[4] = {4, 1100, 5600, 1000000};
    STEP(ferry_tensor_view(s->ctx, src, 4, ne, nb, 4, &view));
    STEP(ferry_tensor_dup_layout(s->ctx, view, &copy));
    STEP(ferry_backend_alloc_buffer(s->split, ferry_tensor_nbytes(view), &s->dst_buf));
    STEP(ferry_buffer_place_tensor(s->dst_buf, copy, 0));
    ferry_copy_stats stats;
    STEP(ferry_copy_input(s->split, FERRY_COPY_PLAN, view, copy, &stats));
    CHECK(stats.path == FERRY_COPY_PLAN);
    CHECK_EQ_U(stats.bytes_copied, 64 * 5 * 5 * 4 * sizeof(float));
    float * got = malloc(ferry_tensor_nbytes(copy));
    CHECK(got);
    const ferry_status st = ferry_tensor_get(copy, got, 0, ferry_tensor_nbytes(copy));
    bool same = st == FERRY_OK;
    for (int64_t i3 = 0; same && i3 < ne[3]; i3++)
        for (int64_t i2 = 0; i2 < ne[2]; i2++)
            for (int64_t i1 = 0; i1 < ne[1]; i1++)
                for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                    const size_t at = (size_t) i0 * nb[0] + (size_t) i1 * nb[1] + (size_t) i2 * nb[2] + (size_t) i3 * nb[3];
                    same = same && got[at / 4] == v[1 + at / 4];
                }
    free(got);
    CHECK(same);
}

static void plan_fini(void * p) {
    plan_state * s = p;
    ferry_buffer_free(s->dst_buf);
    ferry_buffer_free(s->src_buf);
    ferry_context_free(s->ctx);
    ferry_backend_free(s->split);
}

static void test_heap_plans_fail_cleanly_at_each_allocation(void) {
    plan_state s;
    CHECK(sweep("plans on the heap", plan_run, plan_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ the graph allocator: reserve and allocate in chunks */

typedef struct {
    ferry_backend * be;
    ferry_backend * be2;
    ferry_context * ctx;
    ferry_graph * graph;
    ferry_gallocr * ga;
} galloc_state;

static void galloc_run(void * p) {
    galloc_state * s = p;
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    dp.max_buffer_size = 4096; /* four 1 KB tensors a chunk */
    STEP(ferry_dummy_backend_new(&dp, &s->be));
    STEP(ferry_dummy_backend_new(&dp, &s->be2));
    STEP(ferry_context_new(&s->ctx));
    STEP(ferry_graph_new(&s->graph));
    const int64_t n = 256;
    ferry_tensor * x;
    STEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 1, &n, &x));
    STEP(ferry_tensor_set_input(x));
    ferry_tensor * outs[6];
    for (int i = 0; i < 6; i++) {
        STEP(ferry_scale(s->ctx, x, (float) (i + 1), &outs[i]));
        STEP(ferry_tensor_set_output(outs[i]));
        STEP(ferry_graph_build(s->graph, outs[i]));
    }
    ferry_buffer_type * bufts[2] = {ferry_backend_default_buffer_type(s->be), ferry_backend_default_buffer_type(s->be2)};
    STEP(ferry_gallocr_new_n(bufts, 2, &s->ga));
    STEP(ferry_gallocr_reserve(s->ga, s->graph, NULL, NULL));
    STEP(ferry_gallocr_alloc_graph(s->ga, s->graph));
    CHECK(ferry_gallocr_n_chunks(s->ga, 0) >= 2);
    float in[256];
    for (int i = 0; i < 256; i++) {
        in[i] = (float) i;
    }
    STEP(ferry_tensor_set(x, in, 0, sizeof(in)));
    STEP(ferry_backend_graph_compute(s->be, s->graph));
    for (int k = 0; k < 6; k++) {
        float got[256];
        STEP(ferry_tensor_get(outs[k], got, 0, sizeof(got)));
        for (int i = 0; i < 256; i++) {
            CHECK(got[i] == (float) (k + 1) * in[i]);
        }
    }
}

static void galloc_fini(void * p) {
    galloc_state * s = p;
    ferry_gallocr_free(s->ga);
    ferry_graph_free(s->graph);
    ferry_context_free(s->ctx);
    ferry_backend_free(s->be2);
    ferry_backend_free(s->be);
}

static void test_gallocr_chunks_fail_cleanly_at_each_allocation(void) {
    galloc_state s;
    CHECK(sweep("graph allocator in chunks", galloc_run, galloc_fini, &s, sizeof(s)) > 0);
}

/* ------------------------------------------------ the CUDA backend (against the fake runtime in tests) */

#ifdef FERRY_WITH_CUDA
static void cuda_run(void * p) {
    sched_state * s = p;
    int devices = 0;
    if (ferry_cuda_device_count(&devices) != FERRY_OK || devices == 0) {
        return; /* no device: the sweep ends at once */
    }
    const ferry_kv_params params = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                                    .n_ctx = 64, .n_stream = 4, .n_layer = 1};
    ferry_buffer_type * pinned;
    STEP(ferry_cuda_host_buffer_type(&pinned));
    STEP(ferry_cuda_backend_new(0, &s->split));
    STEP(ferry_cpu_backend_new(&s->cpu));
    STEP(ferry_kv_cache_new(&params, pinned, &s->kv));
    fill_floats(ferry_kv_cache_buffer(s->kv));
    STEP(ferry_context_new(&s->ctx));
    ferry_backend * backends[2] = {s->split, s->cpu};
    STEP(ferry_sched_new(backends, 2, &s->sched));
    STEP(ferry_sched_set_policy(s->sched, FERRY_COPY_RANGES));
    ferry_tensor *window, *dup, *out;
    STEP(ferry_kv_cache_window(s->kv, s->ctx, 0, 7, 0, 3, &window, NULL));
    STEP(ferry_dup(s->ctx, window, &dup));
    STEP(ferry_scale(s->ctx, dup, 0.5f, &out));
    STEP(ferry_tensor_set_output(out));
    STEP(ferry_graph_new(&s->graph));
    STEP(ferry_graph_build(s->graph, out));
    STEP(ferry_sched_set_tensor_backend(s->sched, dup, s->split));
    STEP(ferry_sched_graph_compute(s->sched, s->graph));
    CHECK(scaled_copy_of(out, window, 0.5f));
}

#ifdef FERRY_FAKE_CUDART
long fake_cudart_live_allocations(void); /* tests/fake-cudart: exported by libferry's fake build */
static long cuda_live_before;

/* The fake runtime counts device and pinned allocations: none may outlive the scenario. */
static void cuda_fini(void * p) {
    sched_fini(p);
    if (fake_cudart_live_allocations() != cuda_live_before) {
        fprintf(stderr, "%ld device or pinned allocations left behind\n", fake_cudart_live_allocations() - cuda_live_before);
        check_failures++;
    }
}
#else
#define cuda_fini sched_fini
#endif

static void test_cuda_backend_fails_cleanly_at_each_allocation(void) {
    sched_state s;
#ifdef FERRY_FAKE_CUDART
    cuda_live_before = fake_cudart_live_allocations();
#endif
    const long points = sweep("CUDA backend", cuda_run, cuda_fini, &s, sizeof(s));
    CHECK(points > 0 || (points == 0 && !ferry_cuda_available())); /* none only without a device */
}
#endif

static const check_test tests[] = {
    {"kv_cache_windows_fail_cleanly_at_each_allocation", test_kv_cache_windows_fail_cleanly_at_each_allocation},
    {"ragged_windows_fail_cleanly_at_each_allocation", test_ragged_windows_fail_cleanly_at_each_allocation},
    {"paged_cache_fails_cleanly_at_each_allocation", test_paged_cache_fails_cleanly_at_each_allocation},
    {"block_pool_fails_cleanly_at_each_allocation", test_block_pool_fails_cleanly_at_each_allocation},
    {"kv_cache_layers_fail_cleanly_at_each_allocation", test_kv_cache_layers_fail_cleanly_at_each_allocation},
    {"kv_attention_step_fails_cleanly_at_each_allocation", test_kv_attention_step_fails_cleanly_at_each_allocation},
    {"sched_policies_fail_cleanly_at_each_allocation", test_sched_policies_fail_cleanly_at_each_allocation},
    {"sched_prefetch_fails_cleanly_at_each_allocation", test_sched_prefetch_fails_cleanly_at_each_allocation},
    {"linked_standin_fails_cleanly_at_each_allocation", test_linked_standin_fails_cleanly_at_each_allocation},
    {"heap_plans_fail_cleanly_at_each_allocation", test_heap_plans_fail_cleanly_at_each_allocation},
    {"gallocr_chunks_fail_cleanly_at_each_allocation", test_gallocr_chunks_fail_cleanly_at_each_allocation},
#ifdef FERRY_WITH_CUDA
    {"cuda_backend_fails_cleanly_at_each_allocation", test_cuda_backend_fails_cleanly_at_each_allocation},
#endif
};

CHECK_MAIN(tests)
