/*
 * cuda-bench: two full-scale KV windows copied from pinned host memory to the device.
 *
 * 1. The K window (q8_0, n_embd 1024, -c 32768, n_kv 2176), three ways per stream count:
 *   flat        one set of the nbytes() span, gaps included (the flat policy)
 *   ranges      one 2-D set of ns rows of n_kv cells at the cache's stream stride
 *   contiguous  one set of the same bytes as ranges, gapless (the floor)
 *
 * 2. The transposed V window: f16, unified -c 32768, n_embd 1024 (8 heads x
 *    128), n_kv 2176, so 1024 channel rows of 4,352 B at a 65,536 B pitch, in a KV cache
 *    made by ferry_kv_cache_new (v_trans) in CUDA_Host memory. Every way of
 *    tests/c/vtrans-paths.h (vt_ways): (a) flat; (b) plan = ferry_copy_input, plan
 *    policy, into a same-layout device copy (one 2-D copy; timed with the synchronizes
 *    it makes) and copy2d = that 2-D copy queued alone; (c) contiguous, the floor;
 *    candidates (d1) gather_l1..l16 = the backend's gather kernel (ferry/cuda.h) with 1..16
 *    loads in flight per thread, plan_gather = ferry_copy_input with it on; (d2)
 *    split2..4 = the 2-D copy in row chunks over 2..4 streams; (d3) huge_2d /
 *    huge_gather = from a copy of the rows in registered memory on 2 MiB pages (not run,
 *    with the reason, when the system gives none); (d4) compact_2d / compact_gather /
 *    plan_compact = into the compact layout (rows packed); (d5) hybrid25..75 = the copy
 *    engine and the gather kernel at once on two streams, 25..75% of rows gathered;
 *    (d6) fold3d = the backend's fold option: the same rows as one cudaMemcpy3DAsync at
 *    half the pitch (32 KiB) in slices of two, in case the 64 KiB pitch is what costs.
 *    Each way is checked for exact bytes before it is timed (vt_check: rows whole, gaps
 *    untouched, compact rows packed, the gather kernel run exactly where it is named);
 *    one that fails is reported and not timed. Then a pitch sweep (8, 16, 32, 64 KiB:
 *    caches of 4096..32768 cells) of plan, copy2d, gather_l4 (rule's min_pitch 0) and
 *    contiguous, to refit the GPU cost model's wide-pitch term.
 *
 * Each way is timed with CUDA events on the backend's stream, median of --runs (25),
 * all ways of a section interleaved in each run so they share the machine's state.
 * Before each start event the stream is held busy for --hold-us (200) on the device
 * (ferry_cuda_backend_hold), so a way's queued copies start back to back with the event
 * and the time is the device's; --hold-us 0 times the host's submission as well. Ways
 * that synchronize inside (plan, plan_*) are timed with their host work whichever.
 * About 0.1 to 1.2 ms a copy: both sections take seconds, mostly filling memory.
 * A tool, not a test: it prints the figures and whether the bars are met, and exits 0
 * when it could measure.
 *
 *   cuda-bench [--runs N] [--device D] [--hold-us US] [--json FILE]
 *
 * JSON (keys stable): tool, backend, type, n_embd, n_ctx, n_kv, runs, statistic, hold_us,
 * contiguous_gbps_at_8_streams, streams[] (K window: ns, kv_size, {flat,ranges,
 * contiguous}_{bytes,us,gbps}, ranges_over_contiguous, flat_over_ranges, byte_ratio,
 * flat_over_ranges_of_byte_ratio, bar_ranges_within_3pct, bar_ratio_095), bars_met
 * (K window), and v_trans: {type, n_ctx, n_embd, n_kv, rows, row_bytes, pitch_bytes,
 * span_bytes, read_bytes, huge_pages (how the huge pages were had, or why none),
 * ways: {<name>: {group, us, gbps_read, over_contiguous, within_10pct, check,
 * not_timed}} (us and ratios null when not timed; check "ok" or what failed;
 * not_timed null or why), best (the fastest way of groups b and d), best_us,
 * best_over_contiguous, bar_within_10pct (the bar: best_over_contiguous <= 1.10),
 * pitch_sweep[]: {pitch_bytes, kv_size, plan_us, copy2d_us, gather_us, contiguous_us,
 * plan_over_contiguous, copy2d_over_contiguous, gather_over_contiguous,
 * copy2d_extra_ns_per_row (the wide-pitch term: (copy2d - contiguous) / rows),
 * model_copy2d_us (what ferry_copy_cost_model_gpu predicts for the 2-D copy)}} or
 * v_trans: {error} when the section could not run.
 *
 * Exit: 0 measured, 1 a failure (a way moved wrong bytes included), 2 no CUDA device
 * (or CUDA not built).
 */
#define _DEFAULT_SOURCE /* mmap's huge-page flags (vtrans-paths.h) */
#include "ferry.h"
#include "vtrans-paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_CTX 32768
#define N_KV 2176
#define N_EMBD 1024
#define WARMUP 3

static double hold_us = 200.0; /* --hold-us */

/* Record the start event behind a hold of the stream (see the top of the file). */
static ferry_status record_start(ferry_event * t0, ferry_backend * cuda) {
    ferry_status st = hold_us > 0.0 ? ferry_cuda_backend_hold(cuda, hold_us) : FERRY_OK;
    return st == FERRY_OK ? ferry_event_record(t0, cuda) : st;
}

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
    TRY(record_start(b->t0, b->cuda));
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
    fprintf(f, "  \"hold_us\": %g,\n", hold_us);
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
    fprintf(f, "  ],\n  \"bars_met\": %s,\n", bars_met ? "true" : "false"); /* v_trans follows */
}

/* ---------------------------------------------------------------- the transposed V window */

#define VT_N_CTX 32768
#define VT_N_KV 2176
#define VT_HEAD_DIM 128
#define VT_N_HEAD 8
#define VT_BAR 1.10 /* the bar: within 10% of a contiguous copy of the same bytes */
#define VT_N_PITCHES 4

/* The pitch sweep's ways, by name in vt_ways. */
static const char * const sweep_names[] = {"plan", "copy2d", "gather_l4", "contiguous"};
enum { SW_PLAN, SW_2D, SW_GATHER, SW_CONTIG, SW_N };

typedef struct {
    int check;              /* vt_check's result; -1: not run */
    char not_timed[160];    /* why not ("" when timed) */
    double us;              /* median */
} vt_result;

typedef struct {
    char error[256];        /* "" when the section ran */
    int wrong_bytes;        /* some way failed its check (not a declined gather) */
    size_t row, pitch, rows, span, read;
    char huge_how[160];
    vt_result way[VT_N_WAYS];
    int n_sweep;
    struct {
        size_t pitch, kv_size;
        vt_result r[SW_N];
        double model_us;
    } sweep[VT_N_PITCHES];
} vt_report;

static int vt_error(vt_report * rep, const char * what) {
    snprintf(rep->error, sizeof(rep->error), "%s: %s", what, ferry_last_error());
    fprintf(stderr, "cuda-bench: v_trans: %s\n", rep->error);
    return 1;
}

/* A unified f16 cache of n_ctx cells with transposed V, filled; its V window of
 * VT_N_KV cells; device copies (same layout at 0, compact at compact_at) in dbuf. */
typedef struct {
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_tensor *window, *same, *compact;
} vt_cache;

static void vt_cache_free(vt_cache * c) {
    ferry_kv_cache_free(c->kv);
    ferry_context_free(c->ctx);
    memset(c, 0, sizeof(*c));
}

static ferry_status vt_cache_open(vt_cache * c, int64_t n_ctx, ferry_buffer_type * pinned) {
    memset(c, 0, sizeof(*c));
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = VT_HEAD_DIM,
                               .n_head_kv = VT_N_HEAD, .n_ctx = n_ctx, .n_stream = 1, .n_layer = 1, .v_trans = true};
    ferry_status st = ferry_kv_cache_new(&p, pinned, &c->kv);
    if (st == FERRY_OK) {
        ferry_buffer * buf = ferry_kv_cache_buffer(c->kv);
        uint8_t * base = ferry_buffer_base(buf);
        const size_t n = ferry_buffer_size(buf);
        for (size_t i = 0; i < n; i++) {
            base[i] = (uint8_t) ((i * 2654435761u) >> 11) ^ (uint8_t) (i >> 16);
        }
        st = ferry_context_new(&c->ctx);
    }
    if (st == FERRY_OK) st = ferry_kv_cache_window(c->kv, c->ctx, 0, VT_N_KV, 0, 0, NULL, &c->window);
    if (st == FERRY_OK) st = ferry_tensor_dup_layout(c->ctx, c->window, &c->same);
    if (st == FERRY_OK) st = ferry_tensor_compact_layout(c->ctx, c->window, &c->compact);
    return st;
}

static ferry_status vt_cache_place(vt_cache * c, ferry_buffer * dbuf, size_t compact_at) {
    ferry_status st = ferry_buffer_place_tensor(dbuf, c->same, 0);
    return st == FERRY_OK ? ferry_buffer_place_tensor(dbuf, c->compact, compact_at) : st;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Check each way (unless it cannot run), then time those that passed, interleaved,
 * median of runs. A failed check is recorded; rep->wrong_bytes when it was not a
 * declined gather. */
static int vt_measure(vt_bench * b, const vt_way * const * ways, vt_result * res, int n, int runs, ferry_event * t0,
                      ferry_event * t1, vt_report * rep) {
    for (int w = 0; w < n; w++) {
        const char * why = vt_way_unavailable(b, ways[w]);
        res[w].check = -1;
        res[w].us = 0.0;
        res[w].not_timed[0] = '\0';
        if (why) {
            snprintf(res[w].not_timed, sizeof(res[w].not_timed), "%s", why);
            continue;
        }
        res[w].check = vt_check(b, ways[w]);
        if (res[w].check != VT_OK) {
            snprintf(res[w].not_timed, sizeof(res[w].not_timed), "check failed: %s%s%.100s",
                     vt_check_name(res[w].check), res[w].check == VT_ERR_API ? ": " : "",
                     res[w].check == VT_ERR_API ? ferry_last_error() : "");
            fprintf(stderr, "cuda-bench: v_trans %s: %s\n", ways[w]->name, res[w].not_timed);
            rep->wrong_bytes |= res[w].check != VT_GATHER_DECLINED;
            if (res[w].check == VT_ERR_API && vt_sync(b) != FERRY_OK) {
                return vt_error(rep, "after a failed way the device is unusable");
            }
        }
    }
    double * samples = malloc(sizeof(double) * (size_t) runs * (size_t) n);
    if (!samples) {
        snprintf(rep->error, sizeof(rep->error), "out of memory");
        return 1;
    }
    for (int it = 0; it < WARMUP + runs; it++) {
        for (int w = 0; w < n; w++) {
            if (res[w].not_timed[0]) {
                continue;
            }
            float ms;
            if (record_start(t0, b->cuda) != FERRY_OK || vt_enqueue(b, ways[w]) != FERRY_OK ||
                ferry_event_record(t1, b->cuda) != FERRY_OK || ferry_event_synchronize(t1) != FERRY_OK ||
                ferry_event_elapsed_ms(t0, t1, &ms) != FERRY_OK) {
                free(samples);
                return vt_error(rep, ways[w]->name);
            }
            if (it >= WARMUP) {
                samples[(size_t) w * runs + (it - WARMUP)] = ms * 1000.0;
            }
        }
    }
    for (int w = 0; w < n; w++) {
        if (!res[w].not_timed[0]) {
            double * sw = samples + (size_t) w * runs;
            qsort(sw, (size_t) runs, sizeof(double), cmp_double);
            res[w].us = runs % 2 ? sw[runs / 2] : 0.5 * (sw[runs / 2 - 1] + sw[runs / 2]);
        }
    }
    free(samples);
    return 0;
}

static const vt_way * way_named(const char * name) {
    for (int i = 0; i < VT_N_WAYS; i++) {
        if (!strcmp(vt_ways[i].name, name)) {
            return &vt_ways[i];
        }
    }
    return NULL;
}

static int vt_section(ferry_backend * cuda, int device, ferry_event * t0, ferry_event * t1, int runs, vt_report * rep) {
    memset(rep, 0, sizeof(*rep));
    ferry_buffer_type * pinned;
    ferry_buffer * dbuf = NULL;
    vt_cache c;
    vt_bench b;
    vt_huge h;
    memset(&b, 0, sizeof(b));
    memset(&h, 0, sizeof(h));
    int rc = 0;
    if (ferry_cuda_host_buffer_type(&pinned) != FERRY_OK || vt_cache_open(&c, VT_N_CTX, pinned) != FERRY_OK) {
        vt_cache_free(&c);
        return vt_error(rep, "the -c 32768 cache");
    }
    /* One device buffer for every cache: the widest pitch's span, then the packed rows. */
    const size_t compact_at = round_up(ferry_tensor_nbytes(c.window), 256);
    if (ferry_backend_alloc_buffer(cuda, compact_at + ferry_tensor_nbytes(c.compact), &dbuf) != FERRY_OK ||
        vt_cache_place(&c, dbuf, compact_at) != FERRY_OK || vt_bench_init(&b, cuda, c.window, c.same, c.compact) != FERRY_OK ||
        vt_bench_add_aux(&b, device, VT_MAX_AUX) != FERRY_OK) {
        rc = vt_error(rep, "setting up");
        goto done;
    }
    rep->row = b.row;
    rep->pitch = b.pitch;
    rep->rows = b.rows;
    rep->span = ferry_tensor_nbytes(c.window);
    rep->read = b.row * b.rows;
    if (vt_huge_alloc(&h, b.src, (b.rows - 1) * b.pitch + b.row) == 0) {
        b.huge = h.base;
    }
    snprintf(rep->huge_how, sizeof(rep->huge_how), "%s", h.how);

    const vt_way * all[VT_N_WAYS];
    for (int i = 0; i < VT_N_WAYS; i++) {
        all[i] = &vt_ways[i];
    }
    if ((rc = vt_measure(&b, all, rep->way, VT_N_WAYS, runs, t0, t1, rep)) != 0) {
        goto done;
    }
    vt_huge_free(&h);
    b.huge = NULL;

    /* The pitch sweep: caches of pitch / 2 cells, the same rows; the gather at every pitch. */
    const vt_way * sw[SW_N];
    for (int i = 0; i < SW_N; i++) {
        sw[i] = way_named(sweep_names[i]);
    }
    for (int p = 0; p < VT_N_PITCHES && rc == 0; p++) {
        const size_t pitch = (size_t) 8192 << p, kv_size = pitch / 2;
        vt_cache_free(&c);
        vt_bench_free(&b);
        if (vt_cache_open(&c, (int64_t) kv_size, pinned) != FERRY_OK || vt_cache_place(&c, dbuf, compact_at) != FERRY_OK ||
            vt_bench_init(&b, cuda, c.window, c.same, c.compact) != FERRY_OK) {
            rc = vt_error(rep, "a pitch sweep cache");
            break;
        }
        b.min_pitch = 0;
        rep->sweep[p].pitch = b.pitch;
        rep->sweep[p].kv_size = kv_size;
        const ferry_copy_cost_model model = ferry_copy_cost_model_gpu();
        const ferry_copy_2d one = {.offset = b.offset, .size = b.row, .count = b.rows, .stride = b.pitch};
        rep->sweep[p].model_us = ferry_copy_plan_cost(&model, &one, 1) * 1e6;
        rc = vt_measure(&b, sw, rep->sweep[p].r, SW_N, runs, t0, t1, rep);
        rep->n_sweep = p + 1;
    }
done:
    vt_huge_free(&h);
    vt_bench_free(&b);
    vt_cache_free(&c);
    ferry_buffer_free(dbuf);
    return rc;
}

static int vt_timed(const vt_result * r) { return r->check == VT_OK && !r->not_timed[0]; }

/* The fastest way of groups b and d (a flat copy or the floor itself is no answer). */
static int vt_best(const vt_report * rep) {
    int best = -1;
    for (int i = 0; i < VT_N_WAYS; i++) {
        const char g = vt_ways[i].group[0];
        if ((g == 'b' || g == 'd') && vt_timed(&rep->way[i]) && (best < 0 || rep->way[i].us < rep->way[best].us)) {
            best = i;
        }
    }
    return best;
}

static const vt_result * vt_contig(const vt_report * rep) {
    for (int i = 0; i < VT_N_WAYS; i++) {
        if (vt_ways[i].kind == VT_CONTIG) {
            return vt_timed(&rep->way[i]) ? &rep->way[i] : NULL;
        }
    }
    return NULL;
}

static void vt_print_text(const vt_report * rep, const char * backend, int runs) {
    printf("\ntransposed V f16, unified -c %d, n_embd %d, n_kv %d: %zu rows of %zu B at a %zu B pitch, pinned host -> "
           "%s, median of %d runs (CUDA events, stream held %g us before each)\n", VT_N_CTX, VT_HEAD_DIM * VT_N_HEAD,
           VT_N_KV, rep->rows, rep->row, rep->pitch, backend, runs, hold_us);
    if (rep->error[0] && rep->rows == 0) {
        printf("v_trans: not measured: %s\n", rep->error);
        return;
    }
    const vt_result * contig = vt_contig(rep);
    printf("%-16s %-4s %10s %10s %9s  %s\n", "way", "grp", "us", "GB/s read", "x contig", "<=1.10");
    for (int i = 0; i < VT_N_WAYS; i++) {
        const vt_result * r = &rep->way[i];
        if (!vt_timed(r)) {
            printf("%-16s %-4s   (not timed: %s)\n", vt_ways[i].name, vt_ways[i].group, r->not_timed);
            continue;
        }
        const double x = contig ? r->us / contig->us : 0.0;
        printf("%-16s %-4s %10.1f %10.2f %9.3f  %s\n", vt_ways[i].name, vt_ways[i].group, r->us,
               rep->read / (r->us * 1e3), x, contig && x <= VT_BAR ? "yes" : "no");
    }
    const int best = vt_best(rep);
    if (best >= 0 && contig) {
        const double x = rep->way[best].us / contig->us;
        printf("v_trans: fastest of plan and candidates: %s, %.1f us, %.3fx the contiguous copy: within 10%% "
               "(the transposed-V bar): %s\n", vt_ways[best].name, rep->way[best].us, x, x <= VT_BAR ? "yes" : "no");
    }
    printf("v_trans: huge pages: %s\n", rep->huge_how);
    printf("\npitch sweep (same rows, cache of pitch/2 cells; gather with min_pitch 0)\n");
    printf("%8s %9s %10s %10s %9s %9s %9s %9s %12s %10s\n", "pitch", "plan us", "copy2d us", "gather us", "contig us",
           "plan/c", "2d/c", "gather/c", "2d ns/row+", "model 2d");
    for (int p = 0; p < rep->n_sweep; p++) {
        const vt_result * r = rep->sweep[p].r;
        if (!vt_timed(&r[SW_CONTIG])) {
            printf("%8zu   (contiguous not timed: %s)\n", rep->sweep[p].pitch, r[SW_CONTIG].not_timed);
            continue;
        }
        const double c = r[SW_CONTIG].us;
        printf("%8zu", rep->sweep[p].pitch);
        for (int w = 0; w < SW_N; w++) {
            vt_timed(&r[w]) ? printf(" %*.1f", w == 0 || w == 3 ? 9 : 10, r[w].us) : printf(" %*s", w == 0 || w == 3 ? 9 : 10, "-");
        }
        for (int w = 0; w < SW_CONTIG; w++) {
            vt_timed(&r[w]) ? printf(" %9.3f", r[w].us / c) : printf(" %9s", "-");
        }
        vt_timed(&r[SW_2D]) ? printf(" %12.1f", (r[SW_2D].us - c) * 1e3 / (double) rep->rows) : printf(" %12s", "-");
        printf(" %10.1f\n", rep->sweep[p].model_us);
    }
    if (rep->error[0]) {
        printf("v_trans: stopped early: %s\n", rep->error);
    }
}

/* A JSON string of s (quotes and backslashes escaped, control characters dropped). */
static void json_str(FILE * f, const char * s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            fputc('\\', f);
        }
        if ((unsigned char) *s >= 0x20) {
            fputc(*s, f);
        }
    }
    fputc('"', f);
}

static void json_us(FILE * f, const char * key, const vt_result * r) {
    vt_timed(r) ? fprintf(f, "\"%s\": %.2f", key, r->us) : fprintf(f, "\"%s\": null", key);
}

static void json_ratio(FILE * f, const char * key, const vt_result * r, const vt_result * c) {
    vt_timed(r) && c ? fprintf(f, "\"%s\": %.4f", key, r->us / c->us) : fprintf(f, "\"%s\": null", key);
}

static void vt_print_json(FILE * f, const vt_report * rep) {
    if (rep->error[0] && rep->rows == 0) {
        fprintf(f, "  \"v_trans\": {\"error\": ");
        json_str(f, rep->error);
        fprintf(f, "}\n}\n");
        return;
    }
    const vt_result * contig = vt_contig(rep);
    fprintf(f, "  \"v_trans\": {\n    \"type\": \"f16\", \"n_ctx\": %d, \"n_embd\": %d, \"n_kv\": %d, \"rows\": %zu, "
            "\"row_bytes\": %zu, \"pitch_bytes\": %zu, \"span_bytes\": %zu, \"read_bytes\": %zu,\n    \"huge_pages\": ",
            VT_N_CTX, VT_HEAD_DIM * VT_N_HEAD, VT_N_KV, rep->rows, rep->row, rep->pitch, rep->span, rep->read);
    json_str(f, rep->huge_how);
    if (rep->error[0]) {
        fprintf(f, ",\n    \"error\": ");
        json_str(f, rep->error);
    }
    fprintf(f, ",\n    \"ways\": {\n");
    for (int i = 0; i < VT_N_WAYS; i++) {
        const vt_result * r = &rep->way[i];
        fprintf(f, "      \"%s\": {\"group\": \"%s\", ", vt_ways[i].name, vt_ways[i].group);
        json_us(f, "us", r);
        vt_timed(r) ? fprintf(f, ", \"gbps_read\": %.2f", rep->read / (r->us * 1e3)) : fprintf(f, ", \"gbps_read\": null");
        fprintf(f, ", ");
        json_ratio(f, "over_contiguous", r, contig);
        vt_timed(r) && contig ? fprintf(f, ", \"within_10pct\": %s", r->us / contig->us <= VT_BAR ? "true" : "false")
                              : fprintf(f, ", \"within_10pct\": null");
        fprintf(f, ", \"check\": ");
        json_str(f, r->check < 0 ? "not run" : vt_check_name(r->check));
        fprintf(f, ", \"not_timed\": ");
        r->not_timed[0] ? json_str(f, r->not_timed) : (void) fprintf(f, "null");
        fprintf(f, "}%s\n", i + 1 < VT_N_WAYS ? "," : "");
    }
    const int best = vt_best(rep);
    fprintf(f, "    },\n    \"best\": ");
    if (best >= 0 && contig) {
        const double x = rep->way[best].us / contig->us;
        fprintf(f, "\"%s\", \"best_us\": %.2f, \"best_over_contiguous\": %.4f, \"bar_within_10pct\": %s", vt_ways[best].name,
                rep->way[best].us, x, x <= VT_BAR ? "true" : "false");
    } else {
        fprintf(f, "null, \"best_us\": null, \"best_over_contiguous\": null, \"bar_within_10pct\": false");
    }
    fprintf(f, ",\n    \"pitch_sweep\": [\n");
    for (int p = 0; p < rep->n_sweep; p++) {
        const vt_result * r = rep->sweep[p].r;
        const vt_result * c = vt_timed(&r[SW_CONTIG]) ? &r[SW_CONTIG] : NULL;
        fprintf(f, "      {\"pitch_bytes\": %zu, \"kv_size\": %zu, ", rep->sweep[p].pitch, rep->sweep[p].kv_size);
        json_us(f, "plan_us", &r[SW_PLAN]);
        fprintf(f, ", ");
        json_us(f, "copy2d_us", &r[SW_2D]);
        fprintf(f, ", ");
        json_us(f, "gather_us", &r[SW_GATHER]);
        fprintf(f, ", ");
        json_us(f, "contiguous_us", &r[SW_CONTIG]);
        fprintf(f, ", ");
        json_ratio(f, "plan_over_contiguous", &r[SW_PLAN], c);
        fprintf(f, ", ");
        json_ratio(f, "copy2d_over_contiguous", &r[SW_2D], c);
        fprintf(f, ", ");
        json_ratio(f, "gather_over_contiguous", &r[SW_GATHER], c);
        vt_timed(&r[SW_2D]) && c ? fprintf(f, ", \"copy2d_extra_ns_per_row\": %.2f", (r[SW_2D].us - c->us) * 1e3 / (double) rep->rows)
                                 : fprintf(f, ", \"copy2d_extra_ns_per_row\": null");
        fprintf(f, ", \"model_copy2d_us\": %.2f}%s\n", rep->sweep[p].model_us, p + 1 < rep->n_sweep ? "," : "");
    }
    fprintf(f, "    ]\n  }\n}\n");
}

int main(int argc, char ** argv) {
    int runs = 25, device = 0;
    const char * json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--hold-us") && i + 1 < argc) {
            hold_us = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--runs N] [--device D] [--hold-us US] [--json FILE]\n", argv[0]);
            return 1;
        }
    }
    if (runs < 1 || runs > 10000) {
        fprintf(stderr, "cuda-bench: --runs must be 1..10000\n");
        return 1;
    }
    if (!(hold_us >= 0.0 && hold_us <= 1e5)) {
        fprintf(stderr, "cuda-bench: --hold-us must be 0..100000\n");
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
                double us = 0;
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

    printf("K window q8_0, n_embd %d, -c %d, n_kv %d, pinned host -> %s, median of %d runs (CUDA events, stream held "
           "%g us before each)\n", N_EMBD, N_CTX, N_KV, ferry_backend_name(b.cuda), runs, hold_us);
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
    fflush(stdout);
    static vt_report vrep; /* large: not on the stack */
    const int vt_rc = vt_section(b.cuda, device, b.t0, b.t1, runs, &vrep);
    vt_print_text(&vrep, ferry_backend_name(b.cuda), runs);
    if (json_path) {
        FILE * f = fopen(json_path, "w");
        if (!f) {
            perror(json_path);
            return 1;
        }
        print_json(f, res, n_res, runs, ferry_backend_name(b.cuda), bw8, bars_met);
        vt_print_json(f, &vrep);
        fclose(f);
    }
    free(samples);
    ferry_event_free(b.t0);
    ferry_event_free(b.t1);
    ferry_buffer_free(dbuf);
    ferry_buffer_free(hbuf);
    ferry_backend_free(b.cuda);
    ferry_context_free(ctx);
    return vt_rc || vrep.wrong_bytes ? 1 : 0;
}
