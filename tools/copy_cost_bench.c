/*
 * CPU figures behind ferry_copy_cost_model_cpu (copy-plan.c): one memcpy of a span
 * against a loop of memcpy over rows of w bytes spaced `stride` apart inside that span
 * (what a host 2-D set does), both between two host buffers of the same layout.
 *
 *   copy_cost_bench [read_MiB [warm]]   (default 32 MiB: the bytes the rows cover)
 *
 * By default the caches are flushed before every timed run (a 256 MiB sweep), as for
 * a KV cache far larger than the caches that is copied once per graph run; `warm`
 * leaves them warm (a window copied again while still cached).
 *
 * Prints, per row width and spacing (stride / width), the flat time, the row loop's
 * time, flat/rows (above 1: the rows win), and what the cost model predicts.
 */
#include "ferry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static volatile uint8_t sink;
static uint8_t * evict_buf; /* NULL: warm runs */
static const size_t evict_bytes = (size_t) 256 << 20;

static void evict(void) {
    if (evict_buf) {
        memset(evict_buf, (int) sink + 1, evict_bytes);
        sink ^= evict_buf[evict_bytes / 3];
    }
}

/* Best time of one run over enough repeats to fill ~40 ms (at least 3). */
static double time_flat(uint8_t * dst, const uint8_t * src, size_t span) {
    double best = 1e30, spent = 0;
    for (int rep = 0; rep < 5 || (spent < 0.04 && rep < 1000); rep++) {
        evict();
        const double t0 = now();
        memcpy(dst, src, span);
        const double dt = now() - t0;
        sink ^= dst[span / 2];
        spent += dt;
        best = dt < best ? dt : best;
    }
    return best;
}

static double time_rows(uint8_t * dst, const uint8_t * src, size_t w, size_t n, size_t stride) {
    double best = 1e30, spent = 0;
    for (int rep = 0; rep < 5 || (spent < 0.04 && rep < 1000); rep++) {
        evict();
        const double t0 = now();
        for (size_t i = 0; i < n; i++) {
            memcpy(dst + i * stride, src + i * stride, w);
        }
        const double dt = now() - t0;
        sink ^= dst[(n / 2) * stride];
        spent += dt;
        best = dt < best ? dt : best;
    }
    return best;
}

int main(int argc, char ** argv) {
    const size_t read_bytes = (size_t) (argc > 1 ? atof(argv[1]) : 32.0) * 1024 * 1024;
    static const size_t widths[] = {16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536};
    static const double ratios[] = {1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0};
    const size_t n_w = sizeof(widths) / sizeof(widths[0]), n_r = sizeof(ratios) / sizeof(ratios[0]);
    const size_t max_span = (size_t) (read_bytes * ratios[n_r - 1]) + 65536 * 8;
    uint8_t * src = malloc(max_span);
    uint8_t * dst = malloc(max_span);
    if (!(argc > 2 && strcmp(argv[2], "warm") == 0)) {
        evict_buf = malloc(evict_bytes);
        if (!evict_buf) {
            fprintf(stderr, "out of memory for the eviction buffer\n");
            return 1;
        }
    }
    if (!src || !dst) {
        fprintf(stderr, "out of memory for %zu-byte buffers\n", max_span);
        return 1;
    }
    for (size_t i = 0; i < max_span; i++) { /* fault every page in before timing */
        src[i] = (uint8_t) (i * 131);
        dst[i] = 0;
    }
    const ferry_copy_cost_model m = ferry_copy_cost_model_cpu();
    printf("read %zu bytes per case, caches %s; times are the best of >= 5 runs\n", read_bytes,
           evict_buf ? "flushed before each run" : "warm");
    printf("%8s %6s %10s %10s %10s %8s %8s %6s\n", "width", "ratio", "rows", "flat_us", "rows_us", "flat/rows",
           "model", "agree");
    int agree = 0, cases = 0;
    for (size_t wi = 0; wi < n_w; wi++) {
        for (size_t ri = 0; ri < n_r; ri++) {
            const size_t w = widths[wi], n = read_bytes / w;
            size_t stride = (size_t) ((double) w * ratios[ri]);
            stride = stride < w ? w : stride;
            const size_t span = (n - 1) * stride + w;
            const double tf = time_flat(dst, src, span), tr = time_rows(dst, src, w, n, stride);
            const ferry_copy_2d c = {.offset = 0, .size = w, .count = n, .stride = stride};
            const double pf = ferry_copy_flat_cost(&m, span), pr = ferry_copy_plan_cost(&m, &c, 1);
            const int same = (pr < pf) == (tr < tf);
            agree += same;
            cases++;
            printf("%8zu %6.2f %10zu %10.1f %10.1f %8.2f %8.2f %6s\n", w, ratios[ri], n, tf * 1e6, tr * 1e6, tf / tr,
                   pf / pr, same ? "yes" : "NO");
        }
    }
    printf("model agrees with the measurement on which is faster in %d of %d cases\n", agree, cases);
    free(evict_buf);
    free(src);
    free(dst);
    return 0;
}
