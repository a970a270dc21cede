/*
 * What ferry.h promises about threads: objects that share nothing may be used from
 * several threads at once. Each of four threads builds its own CPU backend, split
 * backend, KV cache, context and scheduler, and runs decode steps on windows drawn at
 * random (fixed seeds), under a policy and compact setting drawn at random each step;
 * every byte of every result is checked. The process-wide state they do share (buffer
 * ids, the CPU buffer type, the error message, which is per thread) is what ferry locks.
 * Under the sanitized build a race would also show as memory errors.
 */
#include "check.h"
#include "window-check.h"

#include <pthread.h>
#include <stdint.h>

enum { N_THREADS = 4, N_STEPS = 60 };

typedef struct {
    unsigned seed;
    int failures;
    char message[256];
    int steps;
} worker;

#define WTRY(expr)                                                                                           \
    do {                                                                                                     \
        if ((expr) != FERRY_OK) {                                                                            \
            snprintf(w->message, sizeof(w->message), "step %d: %s: %s", step, #expr, ferry_last_error());  \
            w->failures++;                                                                                   \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)

static void * run_worker(void * arg) {
    worker * w = arg;
    uint32_t rng = w->seed;
    int step = -1;
    ferry_backend *cpu = NULL, *split = NULL;
    ferry_kv_cache * kv = NULL;
    ferry_context * ctx = NULL;
    ferry_sched * sched = NULL;
    ferry_graph * graph = NULL;
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                               .n_ctx = 128, .n_stream = 4, .n_layer = 2};
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    WTRY(ferry_cpu_backend_new(&cpu));
    WTRY(ferry_dummy_backend_new(&dp, &split));
    WTRY(ferry_kv_cache_new(&p, ferry_cpu_buffer_type(), &kv));
    fill_floats(ferry_kv_cache_buffer(kv));
    ferry_backend * backends[2] = {split, cpu};
    WTRY(ferry_sched_new(backends, 2, &sched));
    for (step = 0; step < N_STEPS; step++) {
        /* a new context and graph each step, as a decode loop makes them */
        ferry_graph_free(graph);
        graph = NULL;
        ferry_context_free(ctx);
        ctx = NULL;
        ferry_sched_clear_assignments(sched);
        const int32_t layer = (int32_t) (next_random(&rng) % 2);
        const int64_t n_kv = 1 + next_random(&rng) % 32;
        const int64_t s0 = next_random(&rng) % 4;
        const int64_t s1 = s0 + next_random(&rng) % (4 - s0);
        WTRY(ferry_sched_set_policy(sched, (ferry_copy_policy) (next_random(&rng) % FERRY_COPY_POLICY_COUNT)));
        WTRY(ferry_sched_set_compact(sched, next_random(&rng) % 2));
        ferry_tensor *window, *dup, *out;
        WTRY(ferry_context_new(&ctx));
        WTRY(ferry_kv_cache_window(kv, ctx, layer, n_kv, s0, s1, &window, NULL));
        WTRY(ferry_dup(ctx, window, &dup));
        WTRY(ferry_scale(ctx, dup, 0.5f, &out));
        WTRY(ferry_tensor_set_output(out));
        WTRY(ferry_graph_new(&graph));
        WTRY(ferry_graph_build(graph, out));
        WTRY(ferry_sched_set_tensor_backend(sched, dup, split));
        WTRY(ferry_sched_graph_compute(sched, graph));
        if (!scaled_copy_of(out, window, 0.5f)) {
            snprintf(w->message, sizeof(w->message), "step %d: window (layer %d, %lld cells, streams %lld..%lld) wrong",
                     step, layer, (long long) n_kv, (long long) s0, (long long) s1);
            w->failures++;
            goto done;
        }
        /* the error message is this thread's: a refusal here is not seen by the others */
        ferry_clear_error();
        if (ferry_sched_split(sched, 99, NULL) == FERRY_OK || ferry_last_error()[0] == '\0') {
            snprintf(w->message, sizeof(w->message), "step %d: a refusal left no message on its thread", step);
            w->failures++;
            goto done;
        }
        ferry_clear_error();
        w->steps++;
    }
done:
    ferry_sched_free(sched);
    ferry_graph_free(graph);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
    ferry_backend_free(split);
    ferry_backend_free(cpu);
    return NULL;
}

static void test_schedulers_sharing_nothing_run_on_four_threads(void) {
    worker w[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker) {.seed = 0x9E3779B9u * (unsigned) (i + 1)};
        CHECK(pthread_create(&th[i], NULL, run_worker, &w[i]) == 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
    }
    for (int i = 0; i < N_THREADS; i++) {
        if (w[i].failures) {
            fprintf(stderr, "thread %d: %s\n", i, w[i].message);
        }
        CHECK_EQ_U(w[i].failures, 0);
        CHECK_EQ_U(w[i].steps, N_STEPS);
    }
}

static const check_test tests[] = {
    {"schedulers_sharing_nothing_run_on_four_threads", test_schedulers_sharing_nothing_run_on_four_threads},
};

CHECK_MAIN(tests)
