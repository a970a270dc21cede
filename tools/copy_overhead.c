/*
 * The copy path's own host time: what a paged window's copy costs beyond its link.
 *
 *     build/<dir>/copy_overhead [npl] [adjacency] [latency_us] [gbps]    (defaults 2 0.5 2 8)
 *
 * A paged cache of 2,056 cells a sequence in 16-cell blocks (f16, 2 KV heads of 64, V
 * transposed), each sequence's table with the share `adjacency` of its blocks right after
 * their predecessor, copied into a stand-in device whose link charges latency_us a call,
 * 5 ns a row and gbps. For each gather method the stand-in offers, and for the K and V
 * windows: the calls, the link's modelled time, and the fastest of 200 copies'
 * ferry_copy_input time beyond it, per copy and per call: the host's planning, checks and
 * bookkeeping, or a host that cannot keep to the link (the link's late count says which).
 * Then the plan's own time (ferry_copy_paged_plan, every method priced). The figures of
 * tools/results/2026-12-03-paged.md's "what changed" came from this loop.
 */
#include <ferry/backend.h>
#include <ferry/copy.h>
#include <ferry/paged.h>
#include <ferry/tensor.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CELLS 2056
#define BLOCK 16
#define ROUNDS 200

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static int fail(const char * what) {
    fprintf(stderr, "copy_overhead: %s: %s\n", what, ferry_last_error());
    return 1;
}

/* Each sequence's blocks from its own half of the pool, a block after its predecessor with
 * probability adjacency, else one further on (a fixed seed). */
static ferry_status set_tables(ferry_paged_cache * cache, int npl, int per, double adjacency) {
    int32_t * table = malloc(sizeof(*table) * (size_t) per);
    if (!table) {
        return FERRY_ERR_OUT_OF_MEMORY;
    }
    srand(1);
    ferry_status st = FERRY_OK;
    for (int s = 0; s < npl && st == FERRY_OK; s++) {
        for (int b = 0; b < per; b++) {
            const bool next = (double) rand() / RAND_MAX < adjacency;
            table[b] = b == 0 ? s * 2 * per : table[b - 1] + (next ? 1 : 2);
        }
        st = ferry_paged_cache_set_table(cache, s, table, per, CELLS);
    }
    free(table);
    return st;
}

int main(int argc, char ** argv) {
    const int npl = argc > 1 ? atoi(argv[1]) : 2;
    const double adjacency = argc > 2 ? atof(argv[2]) : 0.5;
    ferry_standin_params p = ferry_standin_default_params();
    p.latency_us = argc > 3 ? atof(argv[3]) : 2;
    p.link_gbps = argc > 4 ? atof(argv[4]) : 8;
    p.row_ns = 5;
    if (npl < 1 || npl > 64 || adjacency < 0 || adjacency > 1) {
        fprintf(stderr, "copy_overhead: npl 1 to 64 and adjacency 0 to 1, please\n");
        return 2;
    }
    ferry_backend * dev;
    if (ferry_standin_backend_new_params(&p, &dev) != FERRY_OK) {
        return fail("stand-in");
    }
    const int per = (CELLS + BLOCK - 1) / BLOCK;
    const ferry_paged_params pp = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 64,
                                   .n_head_kv = 2, .block_size = BLOCK, .n_blocks = 2 * per * npl,
                                   .n_seq = npl, .n_layer = 1, .v_trans = true};
    ferry_paged_cache * cache;
    ferry_context * ctx;
    ferry_tensor * win[2];
    ferry_tensor * dst[2];
    ferry_buffer * dst_buf[2] = {NULL, NULL};
    if (ferry_paged_cache_new(&pp, ferry_cpu_buffer_type(), NULL, &cache) != FERRY_OK ||
        set_tables(cache, npl, per, adjacency) != FERRY_OK || ferry_context_new(&ctx) != FERRY_OK ||
        ferry_paged_cache_window(cache, ctx, 0, CELLS, 0, npl - 1, &win[0], &win[1]) != FERRY_OK) {
        return fail("paged cache");
    }
    for (int i = 0; i < 2; i++) {
        if (ferry_tensor_compact_layout(ctx, win[i], &dst[i]) != FERRY_OK ||
            ferry_backend_alloc_buffer(dev, ferry_tensor_nbytes(dst[i]), &dst_buf[i]) != FERRY_OK ||
            ferry_buffer_place_tensor(dst_buf[i], dst[i], 0) != FERRY_OK) {
            return fail("destination");
        }
    }
    printf("npl %d, adjacency %.2f, link %.1f us + 5 ns a row + %.1f GB/s; fastest of %d copies\n", npl, adjacency,
           p.latency_us, p.link_gbps, ROUNDS);
    printf("%-10s %-2s %6s %12s %14s %12s %10s\n", "gather", "", "calls", "link (us)", "beyond (us)", "a call (us)",
           "late");
    static const ferry_gather_method methods[] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS, FERRY_GATHER_BATCHED};
    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
        if (ferry_paged_cache_set_gather(cache, methods[m]) != FERRY_OK) {
            return fail("gather");
        }
        for (int i = 0; i < 2; i++) {
            double best = 1e9, modelled = 0;
            uint64_t calls = 0, late = 0;
            for (int r = 0; r < ROUNDS; r++) {
                ferry_copy_stats st;
                ferry_link_stats ls;
                ferry_standin_reset_link_stats(dev);
                const double t0 = now();
                if (ferry_copy_input(dev, FERRY_COPY_RAGGED, win[i], dst[i], &st) != FERRY_OK) {
                    return fail("copy");
                }
                const double took = now() - t0;
                ferry_standin_get_link(dev, NULL, &ls);
                late += ls.late;
                if (took - ls.modelled_seconds < best) {
                    best = took - ls.modelled_seconds;
                    modelled = ls.modelled_seconds;
                    calls = st.copy_calls;
                }
            }
            printf("%-10s %-2s %6llu %12.1f %14.2f %12.3f %10llu\n", ferry_gather_method_name(methods[m]),
                   i ? "V" : "K", (unsigned long long) calls, 1e6 * modelled, 1e6 * best,
                   calls ? 1e6 * best / (double) calls : 0.0, (unsigned long long) late);
        }
    }
    for (int i = 0; i < 2; i++) {
        ferry_paged_plan plan;
        size_t n;
        const double t0 = now();
        for (int r = 0; r < ROUNDS; r++) {
            if (ferry_copy_paged_plan(win[i], dev, &plan, NULL, 0, &n) != FERRY_OK) {
                return fail("plan");
            }
        }
        printf("plan of %s: %.2f us (%llu blocks, %llu runs, every method priced)\n", i ? "V" : "K",
               1e6 * (now() - t0) / ROUNDS, (unsigned long long) plan.blocks, (unsigned long long) plan.runs);
    }
    ferry_buffer_free(dst_buf[0]);
    ferry_buffer_free(dst_buf[1]);
    ferry_context_free(ctx);
    ferry_paged_cache_free(cache);
    ferry_backend_free(dev);
    return 0;
}
