/*
 * The soak run (a tool, not a test): decode steps through one scheduler, each on a window
 * drawn at random (layer, cells, streams) under a policy and compact setting drawn at
 * random, with a new context and graph every step as a decode loop makes them, every byte
 * of every result checked. The resident memory is read from /proc/self/statm as it goes:
 * after the first 1,000 steps, where it settles, and at the end. Fixed seed.
 *   build/<dir>/soak [STEPS (default 100000)]
 * Prints a markdown table; tools/soak writes it to tools/results.
 */
#include "ferry.h"
#include "../tests/c/window-check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long rss_kib(void) {
    FILE * f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) {
        resident = -1;
    }
    if (f) {
        fclose(f);
    }
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

#define TRY(expr)                                                                          \
    do {                                                                                   \
        if ((expr) != FERRY_OK) {                                                          \
            fprintf(stderr, "soak: step %ld: %s: %s\n", step, #expr, ferry_last_error());  \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(int argc, char ** argv) {
    const long steps = argc > 1 ? atol(argv[1]) : 100000;
    long step = -1;
    uint32_t rng = 0x5EED5EEDu;
    ferry_backend *cpu, *split;
    ferry_kv_cache * kv;
    ferry_sched * sched;
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F32, .type_v = FERRY_TYPE_F32, .head_dim = 64, .n_head_kv = 4,
                               .n_ctx = 1024, .n_stream = 4, .n_layer = 4};
    TRY(ferry_cpu_backend_new(&cpu));
    TRY(ferry_standin_backend_new(&split)); /* with its copy queue's worker thread */
    TRY(ferry_kv_cache_new(&p, ferry_cpu_buffer_type(), &kv));
    fill_floats(ferry_kv_cache_buffer(kv));
    ferry_backend * backends[2] = {split, cpu};
    TRY(ferry_sched_new(backends, 2, &sched));
    const long start_kib = rss_kib();
    long settled_kib = 0, peak_kib = 0;
    printf("| steps | resident KiB |\n|---:|---:|\n| 0 | %ld |\n", start_kib);
    const clock_t t0 = clock();
    for (step = 0; step < steps; step++) {
        ferry_context * ctx;
        ferry_graph * graph;
        ferry_tensor *k, *v, *dup_k, *dup_v, *out_k, *out_v;
        const int32_t layer = (int32_t) (next_random(&rng) % (uint32_t) p.n_layer);
        const int64_t n_kv = 1 + next_random(&rng) % 256;
        const int64_t s0 = next_random(&rng) % 4;
        const int64_t s1 = s0 + next_random(&rng) % (uint32_t) (4 - s0);
        TRY(ferry_sched_set_policy(sched, (ferry_copy_policy) (next_random(&rng) % FERRY_COPY_POLICY_COUNT)));
        TRY(ferry_sched_set_compact(sched, next_random(&rng) % 2));
        TRY(ferry_sched_set_prefetch(sched, (int) (next_random(&rng) % 3)));
        TRY(ferry_context_new(&ctx));
        /* K and V read by separate nodes: two parts, V's copy queued ahead when prefetching */
        TRY(ferry_kv_cache_window(kv, ctx, layer, n_kv, s0, s1, &k, &v));
        TRY(ferry_dup(ctx, k, &dup_k));
        TRY(ferry_scale(ctx, dup_k, 0.5f, &out_k));
        TRY(ferry_dup(ctx, v, &dup_v));
        TRY(ferry_scale(ctx, dup_v, 0.5f, &out_v));
        TRY(ferry_tensor_set_output(out_k));
        TRY(ferry_tensor_set_output(out_v));
        TRY(ferry_graph_new(&graph));
        TRY(ferry_graph_build(graph, out_k));
        TRY(ferry_graph_build(graph, out_v));
        ferry_sched_clear_assignments(sched);
        TRY(ferry_sched_set_tensor_backend(sched, dup_k, split));
        TRY(ferry_sched_set_tensor_backend(sched, dup_v, split));
        TRY(ferry_sched_graph_compute(sched, graph));
        if (!scaled_copy_of(out_k, k, 0.5f) || !scaled_copy_of(out_v, v, 0.5f)) {
            fprintf(stderr, "soak: step %ld: wrong bytes\n", step);
            return 1;
        }
        ferry_graph_free(graph);
        ferry_context_free(ctx);
        const long done = step + 1;
        if (done == 1000 || done % 10000 == 0 || done == steps) {
            const long kib = rss_kib();
            peak_kib = kib > peak_kib ? kib : peak_kib;
            if (done == 1000) {
                settled_kib = kib;
            }
            printf("| %ld | %ld |\n", done, kib);
            fflush(stdout);
        }
    }
    const long end_kib = rss_kib();
    const double seconds = (double) (clock() - t0) / CLOCKS_PER_SEC;
    const double growth = settled_kib > 0 ? 100.0 * (double) (end_kib - settled_kib) / (double) settled_kib : 0.0;
    printf("\n%ld steps in %.1f s of CPU time; resident memory after 1,000 steps %ld KiB, after %ld steps %ld KiB"
           " (%+.2f%%), peak of the samples %ld KiB; every result checked.\n",
           steps, seconds, settled_kib, steps, end_kib, growth, peak_kib);
    ferry_sched_free(sched);
    ferry_kv_cache_free(kv);
    ferry_backend_free(split);
    ferry_backend_free(cpu);
    return growth <= 5.0 ? 0 : 2;
}
