/*
 * paged-copy-bench: a paged KV window gathered from pinned host memory to the device, by each
 * of ferry's gather methods, against one contiguous copy of the same bytes (the peak).
 *
 * The cache: a ferry paged cache (ferry/paged.h) in CUDA_Host memory, f16, head_dim 8, one KV
 * head, so a cell is 16 B and a block of 16 cells 256 B; one sequence whose table reads
 * --mib MiB (16) in runs of adjacent blocks, for each run length of 256 B, 1 KiB, 4 KiB,
 * 16 KiB, 64 KiB, 256 KiB and 2 MiB. The pool holds twice the bytes read; each run sits in a
 * slot of its own length drawn at random (fixed seed), and the table takes the runs in
 * descending pool order, so no two runs merge and no two make one 2-D copy: a copy per run
 * is exactly that. The window (ferry_paged_cache_window) goes through ferry_copy_input_async,
 * the cache's gather forced (ferry_paged_cache_set_gather) to each way:
 *   per_block   one cudaMemcpyAsync per 256 B block (vLLM's swap_blocks, the baseline)
 *   runs        one cudaMemcpyAsync per run (the merged plan)
 *   batched     every run in one cudaMemcpyBatchAsync (not run, with the reason, where the
 *               runtime or the driver lacks it: before CUDA 12.8)
 *   kernel      ferry's gather kernel reading the runs from pinned, mapped host memory
 *   contiguous  one ferry_backend_tensor_set_async of the same bytes from the pool (the peak)
 * Each way is first done once with the destination under a sentinel and checked byte for byte
 * against the blocks its table names (and the bytes ferry counts); a way that moves wrong bytes
 * is reported, not timed, and fails the tool. Then each is timed with CUDA events on the
 * backend's stream, median of --runs (25), every way of a run length interleaved in each run.
 * Before each start event the stream is held busy for --hold-us (200) on the device
 * (ferry_cuda_backend_hold), so a way whose submission is shorter than the hold is timed on
 * the device alone; the per-block and per-run ways submit longer than that, and their time
 * then includes the host's calls, as it does in a serving step. submit_us is the host's time
 * in ferry_copy_input_async; predicted_us what the CUDA backend's copy cost model says
 * (ferry_copy_paged_plan), and auto the method ferry would take by it.
 * Against the fake CUDA runtime (tests/fake-cudart) every way runs, the kernel as host code,
 * and the times mean nothing. A tool, not a test: it prints the figures, and exits 0 when it
 * could measure.
 *
 *   paged-copy-bench [--runs N] [--device D] [--hold-us US] [--mib M] [--json FILE]
 *
 * JSON (keys stable): tool, backend, type, cell_bytes, block_cells, block_bytes, total_bytes,
 * pool_bytes, runs, statistic, hold_us, ways (the names, in order), batched_available,
 * wrong_bytes, way_errors (some way failed with an error, the device still usable: the others
 * measured), error (what stopped the run, or null; the run lengths measured before it are kept),
 * cases[]: {run_bytes, n_runs, blocks, auto_method, fastest (the fastest timed
 * way but contiguous, or null), fastest_over_contiguous, ways: {<name>: {us, gbps,
 * over_contiguous, submit_us, calls, copies, predicted_us, check, not_run}}} (us, gbps,
 * over_contiguous and submit_us null when not timed; calls and copies what the check's copy
 * made; check "ok", "not run", "wrong bytes: ..." or "error: ..."; not_run null or why).
 *
 * Exit: 0 measured, 1 a failure (a way that moved wrong bytes or failed included), 2 no CUDA
 * device (or CUDA not built). A method the backend does not offer (UNSUPPORTED) is not a failure.
 */
#include "ferry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HEAD_DIM 8
#define BLOCK_CELLS 16
#define CELL_BYTES (HEAD_DIM * 2) /* f16, one KV head */
#define BLOCK_BYTES (BLOCK_CELLS * CELL_BYTES)
#define WARMUP 3
#define SENTINEL 0xA5
#define N_LENGTHS 7

static const size_t run_lengths[N_LENGTHS] = {256, 1024, 4096, 16384, 65536, 262144, 2097152};

enum { PER_BLOCK, RUNS, BATCHED, KERNEL, CONTIG, N_WAYS };
static const char * const way_names[N_WAYS] = {"per_block", "runs", "batched", "kernel", "contiguous"};
static const ferry_gather_method way_methods[N_WAYS] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS,
                                                        FERRY_GATHER_BATCHED, FERRY_GATHER_KERNEL, FERRY_GATHER_AUTO};

static double hold_us = 200.0; /* --hold-us */

typedef struct {
    char check[160];   /* "ok", "not run" or what failed */
    char not_run[256]; /* why not timed ("" when timed) */
    uint64_t calls, copies;
    double us, submit_us; /* medians */
    double predicted_us;
} way_result;

typedef struct {
    size_t run_bytes, n_runs, blocks;
    const char * auto_method;
    way_result way[N_WAYS];
} case_result;

typedef struct {
    ferry_backend * cuda;
    ferry_paged_cache * cache;
    ferry_tensor *window, *dst, *pool;
    ferry_event *t0, *t1;
    size_t total;        /* bytes read */
    uint8_t *expect, *back; /* host: the gathered bytes as the table says, and the device's */
} bench;

static char failure[320]; /* what stopped the run, for the JSON ("" when nothing did) */

static int fail(const char * what) {
    snprintf(failure, sizeof(failure), "%s: %s", what, ferry_last_error());
    fprintf(stderr, "paged-copy-bench: %s: %s (%s)\n", what, ferry_last_error(), ferry_status_name(ferry_last_status()));
    return 1;
}

#define TRY(expr)                 \
    do {                          \
        if ((expr) != FERRY_OK) { \
            return fail(#expr);   \
        }                         \
    } while (0)

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double median(double * s, int n) {
    qsort(s, (size_t) n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e6 + (double) ts.tv_nsec * 1e-3;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t) (rng >> 32);
}

/* The table of run length run_bytes: n_runs runs in slots drawn from twice as many, taken in
 * descending pool order; expect gets the bytes the window must hold. */
static int set_table(bench * b, size_t run_bytes, int32_t * table, size_t * n_runs_out) {
    const size_t run_blocks = run_bytes / BLOCK_BYTES, n_runs = b->total / run_bytes, n_slots = 2 * n_runs;
    unsigned char * taken = calloc(n_slots, 1);
    if (!taken) {
        fprintf(stderr, "paged-copy-bench: out of memory\n");
        return 1;
    }
    for (size_t k = 0; k < n_runs; k++) { /* n_runs distinct slots of n_slots */
        size_t s;
        do {
            s = (size_t) rnd() % n_slots;
        } while (taken[s]);
        taken[s] = 1;
    }
    const uint8_t * pool = b->pool->data;
    size_t j = 0;
    for (size_t s = n_slots; s-- > 0;) {
        if (!taken[s]) {
            continue;
        }
        for (size_t i = 0; i < run_blocks; i++, j++) {
            table[j] = (int32_t) (s * run_blocks + i);
            memcpy(b->expect + j * BLOCK_BYTES, pool + (size_t) table[j] * BLOCK_BYTES, BLOCK_BYTES);
        }
    }
    free(taken);
    *n_runs_out = n_runs;
    const int64_t blocks = (int64_t) (b->total / BLOCK_BYTES);
    TRY(ferry_paged_cache_set_table(b->cache, 0, table, blocks, blocks * BLOCK_CELLS));
    return 0;
}

/* Queue way w (the cache's gather set for it); its stats when not contiguous. */
static ferry_status enqueue(bench * b, int w, ferry_copy_stats * stats) {
    if (w == CONTIG) {
        return ferry_backend_tensor_set_async(b->cuda, b->dst, b->pool->data, 0, b->total);
    }
    const ferry_status st = ferry_paged_cache_set_gather(b->cache, way_methods[w]);
    return st == FERRY_OK ? ferry_copy_input_async(b->cuda, FERRY_COPY_RANGES, b->window, b->dst, stats) : st;
}

/* Way w once under the sentinel, its bytes checked. 0: checked or not offered (r says which);
 * 1: an error or wrong bytes (r->check says which). */
static int check_way(bench * b, size_t run_bytes, int w, way_result * r) {
    snprintf(r->check, sizeof(r->check), "not run");
    r->not_run[0] = '\0';
    ferry_copy_stats stats = {0};
    ferry_status st = ferry_tensor_memset(b->dst, SENTINEL, 0, b->total);
    if (st == FERRY_OK) st = ferry_backend_synchronize(b->cuda);
    if (st == FERRY_OK) st = enqueue(b, w, &stats);
    if (st == FERRY_ERR_UNSUPPORTED && w != CONTIG) { /* a method this runtime or memory does not offer */
        snprintf(r->not_run, sizeof(r->not_run), "%s", ferry_last_error());
        return 0;
    }
    if (st == FERRY_OK) st = ferry_backend_synchronize(b->cuda);
    if (st == FERRY_OK) st = ferry_tensor_get(b->dst, b->back, 0, b->total);
    if (st != FERRY_OK) {
        snprintf(r->check, sizeof(r->check), "error: %.140s", ferry_last_error());
        snprintf(r->not_run, sizeof(r->not_run), "%s", r->check);
        fprintf(stderr, "paged-copy-bench: %s, runs of %zu B: %s\n", way_names[w], run_bytes, r->check);
        return 1;
    }
    const uint8_t * want = w == CONTIG ? (const uint8_t *) b->pool->data : b->expect;
    r->calls = w == CONTIG ? 1 : stats.copy_calls;
    if (memcmp(b->back, want, b->total) != 0) {
        size_t i = 0;
        while (b->back[i] == want[i]) i++;
        snprintf(r->check, sizeof(r->check), "wrong bytes: first at byte %zu (block %zu)", i, i / BLOCK_BYTES);
    } else if (w != CONTIG && stats.bytes_copied != b->total) {
        snprintf(r->check, sizeof(r->check), "counted %llu bytes copied, moved %zu",
                 (unsigned long long) stats.bytes_copied, b->total);
    } else if (w != CONTIG && stats.gather != way_methods[w]) {
        snprintf(r->check, sizeof(r->check), "gathered by %s, not %s", ferry_gather_method_name(stats.gather),
                 way_names[w]);
    } else {
        snprintf(r->check, sizeof(r->check), "ok");
        return 0;
    }
    snprintf(r->not_run, sizeof(r->not_run), "check failed: %s", r->check);
    fprintf(stderr, "paged-copy-bench: %s, runs of %zu B: %s\n", way_names[w], run_bytes, r->check);
    return 1;
}

/* One run length: the table, the model's plan per method, every way checked, then timed. */
static int measure_case(bench * b, size_t run_bytes, int runs, int32_t * table, double * samples, double * submits,
                        case_result * c, int * wrong, int * way_errors) {
    memset(c, 0, sizeof(*c));
    c->run_bytes = run_bytes;
    c->blocks = b->total / BLOCK_BYTES;
    if (set_table(b, run_bytes, table, &c->n_runs)) {
        return 1;
    }
    TRY(ferry_paged_cache_set_gather(b->cache, FERRY_GATHER_AUTO));
    ferry_paged_plan plan;
    size_t n_copies;
    TRY(ferry_copy_paged_plan(b->window, b->cuda, &plan, NULL, 0, &n_copies));
    c->auto_method = ferry_gather_method_name(plan.method);
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(b->cuda);
    for (int w = 0; w < N_WAYS; w++) {
        way_result * r = &c->way[w];
        r->predicted_us = w == CONTIG ? ferry_copy_flat_cost(&model, b->total) * 1e6
                                      : plan.method_seconds[way_methods[w]] * 1e6; /* < 0: not offered */
        if (w != CONTIG && plan.method_seconds[way_methods[w]] >= 0) {
            TRY(ferry_paged_cache_set_gather(b->cache, way_methods[w]));
            ferry_paged_plan forced;
            TRY(ferry_copy_paged_plan(b->window, b->cuda, &forced, NULL, 0, &n_copies));
            r->copies = forced.copies;
        } else if (w == CONTIG) {
            r->copies = 1;
        }
        if (check_way(b, run_bytes, w, r) && strncmp(r->check, "error", 5) != 0) {
            *wrong = 1;
        } else if (strncmp(r->check, "error", 5) == 0) {
            /* the way failed (a driver older than the runtime, say): the others go on if the device does */
            *way_errors = 1;
            TRY(ferry_backend_synchronize(b->cuda));
        }
    }
    for (int it = 0; it < WARMUP + runs; it++) {
        for (int w = 0; w < N_WAYS; w++) {
            if (c->way[w].not_run[0]) {
                continue;
            }
            ferry_copy_stats stats;
            float ms;
            if (hold_us > 0.0) TRY(ferry_cuda_backend_hold(b->cuda, hold_us));
            TRY(ferry_event_record(b->t0, b->cuda));
            const double t = now_us();
            TRY(enqueue(b, w, &stats));
            const double submit = now_us() - t;
            TRY(ferry_event_record(b->t1, b->cuda));
            TRY(ferry_event_synchronize(b->t1));
            TRY(ferry_event_elapsed_ms(b->t0, b->t1, &ms));
            if (it >= WARMUP) {
                samples[(size_t) w * runs + (it - WARMUP)] = ms * 1000.0;
                submits[(size_t) w * runs + (it - WARMUP)] = submit;
            }
        }
    }
    for (int w = 0; w < N_WAYS; w++) {
        if (!c->way[w].not_run[0]) {
            c->way[w].us = median(samples + (size_t) w * runs, runs);
            c->way[w].submit_us = median(submits + (size_t) w * runs, runs);
        }
    }
    return 0;
}

static int timed(const way_result * r) { return !r->not_run[0]; }

/* The fastest timed way but contiguous; -1 when none. */
static int fastest(const case_result * c) {
    int best = -1;
    for (int w = 0; w < CONTIG; w++) {
        if (timed(&c->way[w]) && (best < 0 || c->way[w].us < c->way[best].us)) {
            best = w;
        }
    }
    return best;
}

static void print_text(const case_result * cs, int n, const bench * b, int runs) {
    printf("paged KV window, f16 cells of %d B, blocks of %d cells (%d B), %zu B read per case from a %zu B pool, "
           "pinned host -> %s, median of %d runs (CUDA events, stream held %g us before each)\n", CELL_BYTES,
           BLOCK_CELLS, BLOCK_BYTES, b->total, 2 * b->total, ferry_backend_name(b->cuda), runs, hold_us);
    printf("%9s %8s %-10s %9s %11s %9s %9s %11s %11s\n", "run B", "runs", "way", "calls", "us", "GB/s", "x contig",
           "submit us", "model us");
    for (int i = 0; i < n; i++) {
        const case_result * c = &cs[i];
        const way_result * contig = timed(&c->way[CONTIG]) ? &c->way[CONTIG] : NULL;
        for (int w = 0; w < N_WAYS; w++) {
            const way_result * r = &c->way[w];
            printf("%9zu %8zu %-10s ", c->run_bytes, c->n_runs, way_names[w]);
            if (!timed(r)) {
                printf("(not run: %s)\n", r->not_run);
                continue;
            }
            printf("%9llu %11.1f %9.2f ", (unsigned long long) r->calls, r->us, (double) b->total / (r->us * 1e3));
            contig ? printf("%9.3f", r->us / contig->us) : printf("%9s", "-");
            printf(" %11.1f ", r->submit_us);
            r->predicted_us >= 0 ? printf("%11.1f\n", r->predicted_us) : printf("%11s\n", "-");
        }
        const int best = fastest(c);
        if (best >= 0 && contig) {
            printf("run %zu B: fastest gather %s at %.3fx the contiguous copy; the model would take %s\n",
                   c->run_bytes, way_names[best], c->way[best].us / contig->us, c->auto_method);
        }
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

static void json_num(FILE * f, const char * key, int have, double x, const char * spec) {
    fprintf(f, "\"%s\": ", key);
    have ? fprintf(f, spec, x) : fprintf(f, "null");
}

static void print_json(FILE * f, const case_result * cs, int n, const bench * b, int runs, int batched, int wrong,
                       int way_errors) {
    fprintf(f, "{\n  \"tool\": \"paged-copy-bench\",\n  \"backend\": ");
    json_str(f, ferry_backend_name(b->cuda));
    fprintf(f, ",\n  \"type\": \"f16\",\n  \"cell_bytes\": %d,\n  \"block_cells\": %d,\n  \"block_bytes\": %d,\n",
            CELL_BYTES, BLOCK_CELLS, BLOCK_BYTES);
    fprintf(f, "  \"total_bytes\": %zu,\n  \"pool_bytes\": %zu,\n  \"runs\": %d,\n  \"statistic\": \"median\",\n",
            b->total, 2 * b->total, runs);
    fprintf(f, "  \"hold_us\": %g,\n  \"ways\": [", hold_us);
    for (int w = 0; w < N_WAYS; w++) {
        fprintf(f, "%s\"%s\"", w ? ", " : "", way_names[w]);
    }
    fprintf(f, "],\n  \"batched_available\": %s,\n  \"wrong_bytes\": %s,\n  \"way_errors\": %s,\n  \"error\": ",
            batched ? "true" : "false", wrong ? "true" : "false", way_errors ? "true" : "false");
    failure[0] ? json_str(f, failure) : (void) fprintf(f, "null");
    fprintf(f, ",\n  \"cases\": [\n");
    for (int i = 0; i < n; i++) {
        const case_result * c = &cs[i];
        const way_result * contig = timed(&c->way[CONTIG]) ? &c->way[CONTIG] : NULL;
        const int best = fastest(c);
        fprintf(f, "    {\"run_bytes\": %zu, \"n_runs\": %zu, \"blocks\": %zu, \"auto_method\": \"%s\", \"fastest\": ",
                c->run_bytes, c->n_runs, c->blocks, c->auto_method);
        best >= 0 ? fprintf(f, "\"%s\", ", way_names[best]) : fprintf(f, "null, ");
        json_num(f, "fastest_over_contiguous", best >= 0 && contig, best >= 0 && contig ? c->way[best].us / contig->us : 0,
                 "%.4f");
        fprintf(f, ",\n     \"ways\": {\n");
        for (int w = 0; w < N_WAYS; w++) {
            const way_result * r = &c->way[w];
            const int t = timed(r);
            fprintf(f, "       \"%s\": {", way_names[w]);
            json_num(f, "us", t, r->us, "%.2f");
            fprintf(f, ", ");
            json_num(f, "gbps", t, t ? (double) b->total / (r->us * 1e3) : 0, "%.3f");
            fprintf(f, ", ");
            json_num(f, "over_contiguous", t && contig, t && contig ? r->us / contig->us : 0, "%.4f");
            fprintf(f, ", ");
            json_num(f, "submit_us", t, r->submit_us, "%.2f");
            fprintf(f, ", \"calls\": %llu, \"copies\": %llu, ", (unsigned long long) r->calls,
                    (unsigned long long) r->copies);
            json_num(f, "predicted_us", r->predicted_us >= 0, r->predicted_us, "%.2f");
            fprintf(f, ", \"check\": ");
            json_str(f, r->check);
            fprintf(f, ", \"not_run\": ");
            r->not_run[0] ? json_str(f, r->not_run) : (void) fprintf(f, "null");
            fprintf(f, "}%s\n", w + 1 < N_WAYS ? "," : "");
        }
        fprintf(f, "     }}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

int main(int argc, char ** argv) {
    int runs = 25, device = 0, mib = 16;
    const char * json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--hold-us") && i + 1 < argc) {
            hold_us = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
            mib = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--runs N] [--device D] [--hold-us US] [--mib M] [--json FILE]\n", argv[0]);
            return 1;
        }
    }
    if (runs < 1 || runs > 10000) {
        fprintf(stderr, "paged-copy-bench: --runs must be 1..10000\n");
        return 1;
    }
    if (!(hold_us >= 0.0 && hold_us <= 1e5)) {
        fprintf(stderr, "paged-copy-bench: --hold-us must be 0..100000\n");
        return 1;
    }
    if (mib < 2 || mib > 1024 || mib % 2) {
        fprintf(stderr, "paged-copy-bench: --mib must be even, 2..1024 (whole runs of 2 MiB)\n");
        return 1;
    }
    if (!ferry_cuda_available()) {
        ferry_backend * probe = NULL;
        ferry_cuda_backend_new(device, &probe); /* for CUDA's reason */
        fprintf(stderr, "paged-copy-bench: no CUDA device: %s\n", ferry_last_error());
        return 2;
    }

    bench b = {.total = (size_t) mib << 20};
    const int64_t blocks = (int64_t) (b.total / BLOCK_BYTES);
    TRY(ferry_cuda_backend_new(device, &b.cuda));
    ferry_buffer_type * pinned;
    TRY(ferry_cuda_host_buffer_type(&pinned));
    const ferry_paged_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = HEAD_DIM,
                                  .n_head_kv = 1, .block_size = BLOCK_CELLS, .n_blocks = 2 * blocks, .n_seq = 1,
                                  .n_layer = 1};
    TRY(ferry_paged_cache_new(&p, pinned, NULL, &b.cache));
    ferry_buffer * hbuf = ferry_paged_cache_layer_buffer(b.cache, 0);
    uint8_t * base = ferry_buffer_base(hbuf);
    for (size_t i = 0, n = ferry_buffer_size(hbuf); i < n; i++) {
        base[i] = (uint8_t) ((i * 2654435761u) >> 11) ^ (uint8_t) (i >> 16);
    }
    TRY(ferry_paged_cache_k(b.cache, 0, &b.pool));
    ferry_context * ctx;
    TRY(ferry_context_new(&ctx));
    TRY(ferry_paged_cache_window(b.cache, ctx, 0, blocks * BLOCK_CELLS, 0, 0, &b.window, NULL));
    TRY(ferry_tensor_dup_layout(ctx, b.window, &b.dst));
    ferry_buffer * dbuf;
    TRY(ferry_backend_alloc_buffer(b.cuda, ferry_tensor_nbytes(b.dst), &dbuf));
    TRY(ferry_buffer_place_tensor(dbuf, b.dst, 0));
    TRY(ferry_event_new(b.cuda, FERRY_EVENT_TIMING, &b.t0));
    TRY(ferry_event_new(b.cuda, FERRY_EVENT_TIMING, &b.t1));
    if (ferry_tensor_nbytes(b.dst) != b.total) {
        fprintf(stderr, "paged-copy-bench: the window holds %zu bytes, not %zu\n", ferry_tensor_nbytes(b.dst), b.total);
        return 1;
    }

    b.expect = malloc(b.total);
    b.back = malloc(b.total);
    int32_t * table = malloc((size_t) blocks * sizeof(int32_t));
    double * samples = malloc(sizeof(double) * (size_t) runs * N_WAYS);
    double * submits = malloc(sizeof(double) * (size_t) runs * N_WAYS);
    static case_result cs[N_LENGTHS];
    if (!b.expect || !b.back || !table || !samples || !submits) {
        fprintf(stderr, "paged-copy-bench: out of memory\n");
        return 1;
    }
    int wrong = 0, way_errors = 0, rc = 0, n = 0; /* n: the run lengths measured */
    while (n < N_LENGTHS && rc == 0) {
        rc = measure_case(&b, run_lengths[n], runs, table, samples, submits, &cs[n], &wrong, &way_errors);
        n += rc == 0;
    }
    int batched = 0;
    for (int i = 0; i < n; i++) {
        batched |= cs[i].way[BATCHED].predicted_us >= 0; /* the backend offers it */
    }
    print_text(cs, n, &b, runs);
    if (wrong) {
        printf("paged-copy-bench: some way moved the wrong bytes (marked above as not run: check failed)\n");
    }
    if (way_errors) {
        printf("paged-copy-bench: some way failed (marked above as not run: error)\n");
    }
    if (rc) {
        printf("paged-copy-bench: stopped at runs of %zu B: %s\n", run_lengths[n], failure);
    }
    if (json_path) {
        FILE * f = fopen(json_path, "w");
        if (!f) {
            perror(json_path);
            return 1;
        }
        print_json(f, cs, n, &b, runs, batched, wrong, way_errors);
        fclose(f);
    }
    free(b.expect);
    free(b.back);
    free(table);
    free(samples);
    free(submits);
    ferry_event_free(b.t0);
    ferry_event_free(b.t1);
    ferry_buffer_free(dbuf);
    ferry_context_free(ctx);
    ferry_paged_cache_free(b.cache);
    ferry_backend_free(b.cuda);
    return rc || wrong || way_errors ? 1 : 0;
}
