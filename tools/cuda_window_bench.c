/*
 * cuda-bench: the K window of SPEC.md (q8_0, n_embd 1024, -c 32768, n_kv 2176) copied
 * from pinned host memory to the device, three ways side by side per stream count:
 *   flat        one set of the nbytes() span, gaps included (the old path)
 *   ranges      one 2-D set of ns rows of n_kv cells at the cache's stream stride
 *   contiguous  one set of the same bytes as ranges, gapless (the floor)
 * Each is timed with CUDA events on the backend's stream, median of --runs (25), the
 * three interleaved so they share the machine's state. A tool, not a test: it prints
 * the figures and whether SPEC.md's bars are met, and exits 0 when it could measure.
 *
 *   cuda-bench [--runs N] [--device D] [--json FILE]
 *
 * Exit: 0 measured, 1 a failure, 2 no CUDA device (or CUDA not built).
 */
#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 32768
#define N_KV 2176
#define N_EMBD 1024
#define WARMUP 3

enum { FLAT, RANGES, CONTIG, N_WAYS };
static const char * const way_names[N_WAYS] = {"flat", "ranges", "contiguous"};

typedef struct {
    int ns;
    size_t bytes[N_WAYS];
    double us[N_WAYS]; /* medians */
} result;

static int fail(const char * what) {
    fprintf(stderr, "cuda-bench: %s: %s (%s)\n", what, ferry_last_error(), ferry_status_name(ferry_last_status()));
    return 1;
}

#define TRY(expr)                  \
    do {                           \
        if ((expr) != FERRY_OK) {  \
            return fail(#expr);    \
        }                          \
    } while (0)

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

typedef struct {
    ferry_backend * cuda;
    ferry_tensor * dev;  /* the device copy of the cache, same layout */
    const uint8_t * host; /* the pinned cache */
    ferry_event *t0, *t1;
    size_t row, kv_size, ns;
} bench;

static int run_one(bench * b, int way, double * us) {
    const size_t stride = b->kv_size * b->row;
    const size_t used = N_KV * b->row;
    TRY(ferry_event_record(b->t0, b->cuda));
    switch (way) {
    case FLAT:
        TRY(ferry_backend_tensor_set_async(b->cuda, b->dev, b->host, 0, (b->ns - 1) * stride + used));
        break;
    case RANGES:
        TRY(ferry_backend_tensor_set_2d_async(b->cuda, b->dev, b->host, 0, used, b->ns, stride, stride));
        break;
    default:
        TRY(ferry_backend_tensor_set_async(b->cuda, b->dev, b->host, 0, b->ns * used));
        break;
    }
    TRY(ferry_event_record(b->t1, b->cuda));
    TRY(ferry_event_synchronize(b->t1));
    float ms;
    TRY(ferry_event_elapsed_ms(b->t0, b->t1, &ms));
    *us = ms * 1000.0;
    return 0;
}

/* The ranges copy must move exactly the rows: check them on the device against the host. */
static int verify_ranges(bench * b) {
    const size_t stride = b->kv_size * b->row, used = N_KV * b->row;
    TRY(ferry_tensor_memset(b->dev, 0xA5, 0, ferry_tensor_nbytes(b->dev)));
    ferry_backend_reset_stats(b->cuda);
    TRY(ferry_backend_tensor_set_2d_async(b->cuda, b->dev, b->host, 0, used, b->ns, stride, stride));
    TRY(ferry_backend_synchronize(b->cuda));
    ferry_stats s;
    TRY(ferry_backend_get_stats(b->cuda, &s));
    uint8_t * back = malloc(stride);
    if (!back) {
        fprintf(stderr, "cuda-bench: out of memory\n");
        return 1;
    }
    int bad = s.bytes[FERRY_XFER_SET_2D] != b->ns * used;
    for (size_t s_i = 0; s_i < b->ns && !bad; s_i++) {
        if (ferry_tensor_get(b->dev, back, s_i * stride, stride) != FERRY_OK) {
            free(back);
            return fail("verify: tensor_get");
        }
        bad = memcmp(back, b->host + s_i * stride, used) != 0;
        for (size_t i = used; i < stride && !bad; i++) {
            bad = back[i] != 0xA5; /* the gap keeps its sentinel */
        }
    }
    free(back);
    if (bad) {
        fprintf(stderr, "cuda-bench: the ranges copy for %zu streams moved the wrong bytes\n", b->ns);
        return 1;
    }
    return 0;
}

static void print_json(FILE * f, const result * r, int n, int runs, const char * backend, double bw_contig,
                       int bars_met) {
    fprintf(f, "{\n  \"tool\": \"cuda-bench\",\n  \"backend\": \"%s\",\n  \"type\": \"q8_0\",\n", backend);
    fprintf(f, "  \"n_embd\": %d,\n  \"n_ctx\": %d,\n  \"n_kv\": %d,\n  \"runs\": %d,\n  \"statistic\": \"median\",\n",
            N_EMBD, N_CTX, N_KV, runs);
    fprintf(f, "  \"contiguous_gbps_at_8_streams\": %.2f,\n  \"streams\": [\n", bw_contig);
    for (int i = 0; i < n; i++) {
        const double byte_ratio = (double) r[i].bytes[FLAT] / (double) r[i].bytes[RANGES];
        const double time_ratio = r[i].us[FLAT] / r[i].us[RANGES];
        const double vs_contig = r[i].us[RANGES] / r[i].us[CONTIG];
        fprintf(f, "    {\"ns\": %d, \"kv_size\": %d", r[i].ns, N_CTX / r[i].ns);
        for (int w = 0; w < N_WAYS; w++) {
            fprintf(f, ", \"%s_bytes\": %zu, \"%s_us\": %.2f, \"%s_gbps\": %.2f", way_names[w], r[i].bytes[w],
                    way_names[w], r[i].us[w], way_names[w], r[i].bytes[w] / (r[i].us[w] * 1e3));
        }
        fprintf(f, ", \"ranges_over_contiguous\": %.4f, \"flat_over_ranges\": %.4f, \"byte_ratio\": %.4f",
                vs_contig, time_ratio, byte_ratio);
        fprintf(f, ", \"flat_over_ranges_of_byte_ratio\": %.4f", time_ratio / byte_ratio);
        fprintf(f, ", \"bar_ranges_within_3pct\": %s, \"bar_ratio_095\": %s}%s\n", vs_contig <= 1.03 ? "true" : "false",
                (r[i].ns == 1 || time_ratio / byte_ratio >= 0.95) ? "true" : "false", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ],\n  \"bars_met\": %s\n}\n", bars_met ? "true" : "false");
}

int main(int argc, char ** argv) {
    int runs = 25, device = 0;
    const char * json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--runs N] [--device D] [--json FILE]\n", argv[0]);
            return 1;
        }
    }
    if (runs < 1 || runs > 10000) {
        fprintf(stderr, "cuda-bench: --runs must be 1..10000\n");
        return 1;
    }
    if (!ferry_cuda_available()) {
        ferry_backend * probe = NULL;
        ferry_cuda_backend_new(device, &probe); /* for CUDA's reason */
        fprintf(stderr, "cuda-bench: no CUDA device: %s\n", ferry_last_error());
        return 2;
    }

    bench b = {0};
    ferry_context * ctx;
    TRY(ferry_context_new(&ctx));
    TRY(ferry_cuda_backend_new(device, &b.cuda));
    TRY(ferry_row_size(FERRY_TYPE_Q8_0, N_EMBD, &b.row));
    const size_t cache_bytes = (size_t) N_CTX * b.row; /* kv_size * ns is N_CTX for every ns */

    ferry_buffer_type * pinned;
    ferry_buffer *hbuf, *dbuf;
    TRY(ferry_cuda_host_buffer_type(&pinned));
    TRY(ferry_buffer_type_alloc_buffer(pinned, cache_bytes, &hbuf));
    TRY(ferry_backend_alloc_buffer(b.cuda, cache_bytes, &dbuf));
    uint8_t * host = ferry_buffer_base(hbuf);
    for (size_t i = 0; i < cache_bytes; i++) {
        host[i] = (uint8_t) ((i * 2654435761u) >> 11);
    }
    b.host = host;
    TRY(ferry_event_new(b.cuda, FERRY_EVENT_TIMING, &b.t0));
    TRY(ferry_event_new(b.cuda, FERRY_EVENT_TIMING, &b.t1));

    result res[4];
    double * samples = malloc(sizeof(double) * (size_t) runs * N_WAYS);
    if (!samples) {
        fprintf(stderr, "cuda-bench: out of memory\n");
        return 1;
    }
    int n_res = 0;
    for (int ns = 1; ns <= 8; ns *= 2) {
        b.ns = (size_t) ns;
        b.kv_size = N_CTX / (size_t) ns;
        /* The device cache as the graph sees it: [n_embd, kv_size, ns], q8_0. */
        const int64_t ne[3] = {N_EMBD, (int64_t) b.kv_size, ns};
        TRY(ferry_tensor_new(ctx, FERRY_TYPE_Q8_0, 3, ne, &b.dev));
        TRY(ferry_buffer_place_tensor(dbuf, b.dev, 0));
        if (verify_ranges(&b)) {
            return 1;
        }
        result * r = &res[n_res++];
        r->ns = ns;
        r->bytes[FLAT] = ((size_t) (ns - 1) * b.kv_size + N_KV) * b.row;
        r->bytes[RANGES] = r->bytes[CONTIG] = (size_t) ns * N_KV * b.row;
        for (int it = 0; it < WARMUP + runs; it++) {
            for (int w = 0; w < N_WAYS; w++) {
                double us;
                if (run_one(&b, w, &us)) {
                    return 1;
                }
                if (it >= WARMUP) {
                    samples[(size_t) w * runs + (it - WARMUP)] = us;
                }
            }
        }
        for (int w = 0; w < N_WAYS; w++) {
            qsort(samples + (size_t) w * runs, (size_t) runs, sizeof(double), cmp_double);
            const double * s = samples + (size_t) w * runs;
            r->us[w] = runs % 2 ? s[runs / 2] : 0.5 * (s[runs / 2 - 1] + s[runs / 2]);
        }
    }

    printf("K window q8_0, n_embd %d, -c %d, n_kv %d, pinned host -> %s, median of %d runs (CUDA events)\n", N_EMBD,
           N_CTX, N_KV, ferry_backend_name(b.cuda), runs);
    printf("%3s %10s %10s %10s   %7s %7s %7s   %9s   %9s %9s %8s\n", "ns", "flat us", "ranges us", "contig us", "flat",
           "ranges", "contig", "rng/cont", "flat/rng", "bytes", "of byte");
    printf("%3s %10s %10s %10s   %7s %7s %7s   %9s   %9s %9s %8s\n", "", "", "", "", "GB/s", "GB/s", "GB/s", "<=1.03",
           "time", "ratio", ">=0.95");
    int bars_met = 1;
    for (int i = 0; i < n_res; i++) {
        const result * r = &res[i];
        const double byte_ratio = (double) r->bytes[FLAT] / (double) r->bytes[RANGES];
        const double time_ratio = r->us[FLAT] / r->us[RANGES];
        const double vs_contig = r->us[RANGES] / r->us[CONTIG];
        const int ok_contig = vs_contig <= 1.03;
        const int ok_ratio = r->ns == 1 || time_ratio / byte_ratio >= 0.95;
        bars_met &= ok_contig && ok_ratio;
        printf("%3d %10.1f %10.1f %10.1f   %7.2f %7.2f %7.2f   %8.4f%s   %9.3f %9.3f %7.3f%s\n", r->ns, r->us[FLAT],
               r->us[RANGES], r->us[CONTIG], r->bytes[FLAT] / (r->us[FLAT] * 1e3),
               r->bytes[RANGES] / (r->us[RANGES] * 1e3), r->bytes[CONTIG] / (r->us[CONTIG] * 1e3), vs_contig,
               ok_contig ? " " : "!", time_ratio, byte_ratio, time_ratio / byte_ratio, ok_ratio ? " " : "!");
    }
    printf("bars (ranges within 3%% of contiguous; flat/ranges >= 0.95 of the byte ratio): %s\n",
           bars_met ? "met" : "NOT met (marked !)");
    const double bw8 = res[n_res - 1].bytes[CONTIG] / (res[n_res - 1].us[CONTIG] * 1e3);
    if (json_path) {
        FILE * f = fopen(json_path, "w");
        if (!f) {
            perror(json_path);
            return 1;
        }
        print_json(f, res, n_res, runs, ferry_backend_name(b.cuda), bw8, bars_met);
        fclose(f);
    }
    free(samples);
    ferry_event_free(b.t0);
    ferry_event_free(b.t1);
    ferry_buffer_free(dbuf);
    ferry_buffer_free(hbuf);
    ferry_backend_free(b.cuda);
    ferry_context_free(ctx);
    return 0;
}
