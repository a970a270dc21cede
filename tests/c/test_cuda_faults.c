/*
 * Every CUDA call fails in turn, against the fake runtime (tests/fake-cudart, built with
 * -Dfake_cudart=true, whose fake_cudart_inject makes the nth call of the API fail). For
 * each of three errors a device gives, out of memory, an invalid value and a sticky
 * launch failure, a scenario of the CUDA backend (a device buffer's round trip; a
 * scheduler with a CUDA split over a pinned KV cache; a paged window gathered from a pinned
 * pool by the kernel, by batched copies and by merged spans across its gaps) runs with call 1, 2, 3, ...
 * failing until a run makes fewer calls. A call that fails must return the status of
 * the error (FERRY_ERR_OUT_OF_MEMORY or FERRY_ERR_BACKEND) with CUDA's name for it in the
 * message. After an error that is not sticky the same call retried succeeds, and the
 * bytes are checked at the end; after a sticky one the backend refuses further work with
 * a message that says so. Everything is freed either way: the fake counts its live
 * allocations, and the sanitized build's leak check sees the host memory an error path forgot.
 */
#include "paged-fixture.h"
#include "window-check.h"

#include <cuda_runtime_api.h>
#include <stdint.h>

void fake_cudart_inject(long n, cudaError_t err); /* tests/fake-cudart: exported by libferry's fake build */
long fake_cudart_calls(void);
long fake_cudart_live_allocations(void);

static cudaError_t injected_err;
static long armed;
static long reported;

static bool fired(void) { return armed > 0 && fake_cudart_calls() >= armed; }

/* the status and message an injected error must give */
static bool reported_as_cuda(ferry_status st) {
    const ferry_status want = injected_err == cudaErrorMemoryAllocation ? FERRY_ERR_OUT_OF_MEMORY : FERRY_ERR_BACKEND;
    return st == want && strstr(ferry_last_error(), cudaGetErrorName(injected_err)) != NULL;
}

static bool sticky(void) { return injected_err == cudaErrorLaunchFailure; }

/* A call under the fault: OK; or the fault, reported, then OK on retry (not sticky) or
 * refused with "sticky" on retry (sticky: the scenario ends there, lost = true). */
#define CSTEP(expr)                                                                                            \
    do {                                                                                                       \
        ferry_clear_error();                                                                                   \
        ferry_status cstep_st_ = (expr);                                                                       \
        if (cstep_st_ != FERRY_OK) {                                                                           \
            if (!fired() || !reported_as_cuda(cstep_st_)) {                                                    \
                fprintf(stderr, "%s:%d: %s gave '%s' (%s)%s\n", __FILE__, __LINE__, #expr,                     \
                        ferry_status_name(cstep_st_), ferry_last_error(), fired() ? "" : " with no call failed"); \
                check_failures++;                                                                              \
                return;                                                                                        \
            }                                                                                                  \
            reported++;                                                                                        \
            cstep_st_ = (expr);                                                                                \
            if (sticky()) {                                                                                    \
                if (cstep_st_ != FERRY_ERR_BACKEND || !strstr(ferry_last_error(), "sticky")) {                  \
                    fprintf(stderr, "%s:%d: %s after a sticky error: '%s' (%s)\n", __FILE__, __LINE__, #expr,  \
                            ferry_status_name(cstep_st_), ferry_last_error());                                 \
                    check_failures++;                                                                          \
                }                                                                                              \
                s->lost = true;                                                                                \
                return;                                                                                        \
            }                                                                                                  \
            if (cstep_st_ != FERRY_OK) {                                                                       \
                fprintf(stderr, "%s:%d: %s retried: '%s' (%s)\n", __FILE__, __LINE__, #expr,                   \
                        ferry_status_name(cstep_st_), ferry_last_error());                                     \
                check_failures++;                                                                              \
                return;                                                                                        \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

typedef struct {
    ferry_backend * cuda;
    ferry_backend * cpu;
    ferry_buffer * dev_buf;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_graph * graph;
    ferry_sched * sched;
    ferry_paged_cache * paged;
    ferry_buffer * paged_buf;
    bool lost;
} state;

static void run(state * s) {
    CSTEP(ferry_cuda_backend_new(0, &s->cuda));
    CSTEP(ferry_cpu_backend_new(&s->cpu));
    CSTEP(ferry_context_new(&s->ctx));
    /* a device buffer's round trip */
    const int64_t n = 1024;
    ferry_tensor * t;
    CSTEP(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 1, &n, &t));
    CSTEP(ferry_backend_alloc_buffer(s->cuda, ferry_tensor_nbytes(t), &s->dev_buf));
    CSTEP(ferry_buffer_place_tensor(s->dev_buf, t, 0));
    float in[1024], out[1024];
    for (int i = 0; i < 1024; i++) {
        in[i] = (float) i;
    }
    CSTEP(ferry_backend_tensor_set_async(s->cuda, t, in, 0, sizeof(in)));
    CSTEP(ferry_backend_synchronize(s->cuda));
    CSTEP(ferry_tensor_get(t, out, 0, sizeof(out)));
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    /* the scheduler: a window of a pinned cache copied to the CUDA split, scaled there */
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 4, .n_layer = 1};
    ferry_buffer_type * pinned;
    CSTEP(ferry_cuda_host_buffer_type(&pinned));
    CSTEP(ferry_kv_cache_new(&p, pinned, &s->kv));
    fill_floats(ferry_kv_cache_buffer(s->kv));
    ferry_tensor *window, *dup, *scaled;
    CSTEP(ferry_kv_cache_window(s->kv, s->ctx, 0, 7, 1, 3, &window, NULL));
    CSTEP(ferry_dup(s->ctx, window, &dup));
    CSTEP(ferry_scale(s->ctx, dup, 0.5f, &scaled));
    CSTEP(ferry_tensor_set_output(scaled));
    CSTEP(ferry_graph_new(&s->graph));
    CSTEP(ferry_graph_build(s->graph, scaled));
    ferry_backend * backends[2] = {s->cuda, s->cpu};
    CSTEP(ferry_sched_new(backends, 2, &s->sched));
    CSTEP(ferry_sched_set_policy(s->sched, FERRY_COPY_RANGES));
    CSTEP(ferry_sched_set_tensor_backend(s->sched, dup, s->cuda));
    CSTEP(ferry_sched_graph_compute(s->sched, s->graph));
    CHECK(scaled_copy_of(scaled, window, 0.5f));
    /* a paged window of a pinned pool, gathered by the kernel, then by batched copies, then by merged
     * spans (its small pieces slow by the model: the gaps cross, into a staging area) */
    const ferry_paged_params pp = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 8, .n_head_kv = 2,
                                   .block_size = 4, .n_blocks = 16, .n_seq = 2, .n_layer = 1};
    CSTEP(ferry_paged_cache_new(&pp, pinned, NULL, &s->paged));
    paged_fill(s->paged);
    CSTEP(ferry_paged_cache_set_table(s->paged, 0, (const int32_t[]) {3, 4, 9}, 3, 10));
    CSTEP(ferry_paged_cache_set_table(s->paged, 1, (const int32_t[]) {0, 7}, 2, 5));
    ferry_tensor *pk, *copy;
    CSTEP(ferry_paged_cache_window(s->paged, s->ctx, 0, 12, 0, 1, &pk, NULL));
    CSTEP(ferry_tensor_dup_layout(s->ctx, pk, &copy));
    CSTEP(ferry_backend_alloc_buffer(s->cuda, ferry_tensor_nbytes(pk), &s->paged_buf));
    CSTEP(ferry_buffer_place_tensor(s->paged_buf, copy, 0));
    const ferry_gather_method methods[3] = {FERRY_GATHER_KERNEL, FERRY_GATHER_BATCHED, FERRY_GATHER_MERGED};
    ferry_copy_cost_model curved = ferry_copy_cost_model_gpu();
    curved.piece_floor_gbps = curved.gbps / 50;
    curved.piece_knee_bytes = 1 << 20;
    curved.piece_steepness = 4;
    for (int m = 0; m < 3; m++) {
        if (methods[m] == FERRY_GATHER_MERGED) {
            CSTEP(ferry_backend_set_copy_cost_model(s->cuda, &curved));
        }
        CSTEP(ferry_tensor_memset(copy, SENTINEL, 0, ferry_tensor_nbytes(copy)));
        CSTEP(ferry_paged_cache_set_gather(s->paged, methods[m]));
        ferry_copy_stats stats;
        CSTEP(ferry_copy_input(s->cuda, FERRY_COPY_RANGES, pk, copy, &stats));
        CHECK(stats.gather == methods[m]);
        uint8_t got[2 * 12 * 8 * 2 * 4];
        CHECK_EQ_U(sizeof(got), ferry_tensor_nbytes(copy));
        CSTEP(ferry_tensor_get(copy, got, 0, sizeof(got)));
        CHECK_EQ_U(paged_check_bytes(s->paged, false, 0, 0, 2, 12, (const int64_t[]) {10, 5}, got, sizeof(got),
                                     stats.bytes_read), 0);
        CHECK(methods[m] == FERRY_GATHER_MERGED ? stats.bytes_copied > stats.bytes_read
                                                : stats.bytes_copied == stats.bytes_read);
    }
}

static void fini(state * s) {
    ferry_buffer_free(s->paged_buf);
    ferry_paged_cache_free(s->paged);
    ferry_sched_free(s->sched);
    ferry_graph_free(s->graph);
    ferry_buffer_free(s->dev_buf);
    ferry_kv_cache_free(s->kv);
    ferry_context_free(s->ctx);
    ferry_backend_free(s->cpu);
    ferry_backend_free(s->cuda);
}

static void sweep(cudaError_t err) {
    injected_err = err;
    reported = 0;
    long lost = 0;
    const long live = fake_cudart_live_allocations();
    for (long n = 1;; n++) {
        state s = {0};
        const int before = check_failures;
        armed = n;
        fake_cudart_inject(n, err);
        run(&s);
        const bool did_fire = fired();
        const long calls = fake_cudart_calls();
        if (s.lost && s.cuda) { /* work on the backend after a sticky error: refused, with a message */
            CHECK_FAILS(ferry_backend_synchronize(s.cuda), FERRY_ERR_BACKEND);
            CHECK(strstr(ferry_last_error(), "sticky") != NULL);
        }
        lost += s.lost;
        armed = 0;
        fake_cudart_inject(0, cudaSuccess);
        fini(&s);
        CHECK_EQ_U(fake_cudart_live_allocations(), live); /* no device or pinned memory left behind */
        if (check_failures != before) {
            fprintf(stderr, "%s: with call %ld of %ld failing\n", cudaGetErrorName(err), n, calls);
            return;
        }
        if (!did_fire) {
            printf("%s: %ld CUDA calls failed in turn (%ld reported, %ld of them leaving the context lost)\n",
                   cudaGetErrorName(err), n - 1, reported, lost);
            CHECK(n > 1);
            return;
        }
    }
}

static void test_out_of_memory_at_each_call_reported_and_retried(void) { sweep(cudaErrorMemoryAllocation); }
static void test_invalid_value_at_each_call_reported_and_retried(void) { sweep(cudaErrorInvalidValue); }
static void test_sticky_failure_at_each_call_refuses_more_work(void) { sweep(cudaErrorLaunchFailure); }

static const check_test tests[] = {
    {"out_of_memory_at_each_call_reported_and_retried", test_out_of_memory_at_each_call_reported_and_retried},
    {"invalid_value_at_each_call_reported_and_retried", test_invalid_value_at_each_call_reported_and_retried},
    {"sticky_failure_at_each_call_refuses_more_work", test_sticky_failure_at_each_call_refuses_more_work},
};

CHECK_MAIN(tests)
