/*
 * A paged window's gather on CUDA: a copy per block, per run, batched copies
 * (cudaMemcpyBatchAsync), the gather kernel reading pinned memory and merged spans (batched into a
 * staging area, the runs placed from it by the kernel: across gaps under a model with a piece
 * curve), each checked under the sentinel from random tables (fixed seeds, 0 to 100% of blocks
 * adjacent); the kernel refused
 * for a pool the device does not map; attention on CUDA byte for byte the cell-per-stream
 * cache's. Each test exits 77 (SKIP) without a device (against tests/fake-cudart, always one).
 */
#include "paged-fixture.h"

#include "ferry-impl.h" /* ferry_backend_tensor_gather_async: a gather's pieces as given */

#include <math.h>
#include <stdlib.h>

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

static const double adjacencies[] = {0.0, 0.5, 0.9, 1.0};

/* The GPU model with a piece curve whose knee is past the fixture's blocks, so that merged spans take
 * the gaps between runs in (the default model has none: a span is its run). */
static ferry_copy_cost_model curved_model(void) {
    ferry_copy_cost_model m = ferry_copy_cost_model_gpu();
    m.piece_floor_gbps = m.gbps / 50;
    m.piece_knee_bytes = 1 << 20;
    m.piece_steepness = 4;
    return m;
}

/* Spans that crossed gaps in some window gathered by gather_all (its gaps' bytes said as crossed). */
static uint64_t gaps_crossed;

/* Both windows of layer 1 over sequences 1..4 gathered by each method into the CUDA split, its copies
 * costed by model (NULL: the backend's own). */
static void gather_all(ferry_buffer_type * buft, ferry_type tk, ferry_type tv, bool v_trans, double adjacency,
                       uint64_t seed, const ferry_gather_method * methods, int n_methods,
                       const ferry_copy_cost_model * model) {
    ferry_backend *cuda, *cpu;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    if (model) {
        CHECK_OK(ferry_backend_set_copy_cost_model(cuda, model));
    }
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_paged_params p = params_of(tk, tv, v_trans);
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, buft, NULL, &c));
    paged_fill(c);
    int64_t cells[N_SEQ];
    int32_t lens[NS];
    draw_lengths(seed, cells, lens, NS);
    paged_seed(seed * 31 + (uint64_t) (adjacency * 10));
    CHECK_OK(paged_random_tables(c, cells, N_SEQ, adjacency, seed % 2 == 0));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * len;
    const int64_t ns = NS;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ns, &len));
    ferry_buffer * len_buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, sizeof(lens), &len_buf));
    CHECK_OK(ferry_buffer_place_tensor(len_buf, len, 0));
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    int64_t used[NS];
    for (int s = 0; s < NS; s++) used[s] = lens[s];
    for (int m = 0; m < n_methods; m++) {
        for (int v = 0; v < 2; v++) {
            ferry_tensor *k, *vw, *copy;
            CHECK_OK(ferry_paged_cache_window(c, ctx, 1, N_KV, 1, NS, &k, &vw));
            ferry_tensor * w = v ? vw : k;
            CHECK_OK(ferry_tensor_set_used_cells(w, len, v && v_trans ? 0 : 1, 3, N_KV));
            ferry_buffer * buf;
            CHECK_OK(paged_split_copy(cuda, ctx, w, &buf, &copy));
            ferry_buffer_reset_stats(buf);
            CHECK_OK(ferry_paged_cache_set_gather(c, methods[m]));
            ferry_paged_plan plan;
            size_t n;
            CHECK_OK(ferry_copy_paged_plan(w, cuda, &plan, NULL, 0, &n));
            ferry_copy_stats stats;
            CHECK_OK(ferry_copy_input(cuda, (ferry_copy_policy) ((m + v) % FERRY_COPY_POLICY_COUNT), w, copy, &stats));
            /* merged spans carry their gaps across too: counted as crossed, never written to the copy */
            const int fail = paged_check_copy(c, v, 1, 1, NS, N_KV, used, copy,
                                              stats.bytes_copied - (plan.crossed_bytes - plan.bytes));
            if (fail) {
                fprintf(stderr, "adjacency %g seed %llu %s method %s: check %d\n", adjacency, (unsigned long long) seed,
                        v ? "V" : "K", ferry_gather_method_name(methods[m]), fail);
            }
            CHECK_EQ_U(fail, 0);
            uint64_t blocks, runs;
            paged_count(c, 1, NS, used, &blocks, &runs);
            CHECK(stats.gather == plan.method && (methods[m] == FERRY_GATHER_AUTO || plan.method == methods[m]));
            CHECK(plan.blocks == blocks && plan.runs == runs && plan.bytes == stats.bytes_read);
            CHECK(plan.crossed_bytes == stats.bytes_copied &&
                  (plan.method == FERRY_GATHER_MERGED ? plan.crossed_bytes >= plan.bytes
                                                      : plan.crossed_bytes == plan.bytes));
            gaps_crossed += plan.crossed_bytes - plan.bytes;
            CHECK_EQ_U(stats.copy_calls, plan.calls);
            if (plan.method == FERRY_GATHER_PER_BLOCK) {
                CHECK_EQ_U(plan.calls, blocks);
            } else if (plan.method == FERRY_GATHER_RUNS) {
                CHECK(plan.calls <= runs);
            } else {
                CHECK_EQ_U(plan.calls, stats.bytes_copied > 0 ? 1u : 0u);
            }
            ferry_buffer_free(buf);
        }
    }
    ferry_buffer_free(len_buf);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
    ferry_backend_free(cpu);
    ferry_backend_free(cuda);
}

static void test_cuda_gathers_move_the_used_cells_by_every_method(void) {
    need_device();
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    const ferry_gather_method methods[] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS,   FERRY_GATHER_BATCHED,
                                           FERRY_GATHER_KERNEL,    FERRY_GATHER_MERGED, FERRY_GATHER_AUTO};
    const ferry_copy_cost_model curved = curved_model();
    for (size_t a = 0; a < sizeof(adjacencies) / sizeof(adjacencies[0]); a++) {
        for (uint64_t seed = 1; seed <= 2; seed++) {
            SUB(gather_all(pinned, FERRY_TYPE_F16, FERRY_TYPE_F16, false, adjacencies[a], seed, methods, 6, NULL));
            SUB(gather_all(pinned, FERRY_TYPE_Q8_0, FERRY_TYPE_F32, true, adjacencies[a], seed, methods, 6, NULL));
        }
    }
    CHECK_EQ_U(gaps_crossed, 0); /* without a piece curve a span is its run */
    for (size_t a = 0; a < sizeof(adjacencies) / sizeof(adjacencies[0]); a++) {
        SUB(gather_all(pinned, FERRY_TYPE_F16, FERRY_TYPE_F16, false, adjacencies[a], 5, methods, 6, &curved));
        SUB(gather_all(pinned, FERRY_TYPE_Q8_0, FERRY_TYPE_F32, true, adjacencies[a], 6, methods, 6, &curved));
    }
    CHECK(gaps_crossed > 0);
}

/* A method the device does not offer for a pool in pool_buft: the plan prices it at -1 (and `offered`
 * at a time), and a window forced to it is refused with `want` in the message. */
static void forced_method_refused(ferry_buffer_type * pool_buft, ferry_gather_method missing,
                                  ferry_gather_method offered, const char * want) {
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    const ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, pool_buft, NULL, &c));
    CHECK_OK(ferry_paged_cache_allocate(c, 0, 10));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *copy;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 0, N_KV, 0, 0, &k, NULL));
    ferry_paged_plan plan;
    size_t n;
    CHECK_OK(ferry_copy_paged_plan(k, cuda, &plan, NULL, 0, &n));
    CHECK(plan.method_seconds[missing] < 0 && plan.method_seconds[offered] >= 0);
    ferry_buffer * buf;
    CHECK_OK(paged_split_copy(cuda, ctx, k, &buf, &copy));
    CHECK_OK(ferry_paged_cache_set_gather(c, missing));
    ferry_copy_stats stats;
    CHECK_FAILS(ferry_copy_input(cuda, FERRY_COPY_RANGES, k, copy, &stats), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), want) != NULL);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
    ferry_backend_free(cuda);
}

/* From pageable memory the device does not map: no kernel, refused when forced; the rest gather. */
static void test_cuda_kernel_refused_for_a_pageable_pool(void) {
    need_device();
    const ferry_gather_method methods[] = {FERRY_GATHER_RUNS, FERRY_GATHER_BATCHED, FERRY_GATHER_MERGED,
                                           FERRY_GATHER_AUTO};
    const ferry_copy_cost_model curved = curved_model();
    SUB(gather_all(ferry_cpu_buffer_type(), FERRY_TYPE_F16, FERRY_TYPE_F16, true, 0.5, 3, methods, 4, &curved));
    SUB(forced_method_refused(ferry_cpu_buffer_type(), FERRY_GATHER_KERNEL, FERRY_GATHER_BATCHED,
                              "does not offer the kernel gather"));
}

#ifdef FERRY_FAKE_CUDART
/* Batched copies need the driver's CUDA as well as the runtime's: under a 12.4 driver (the fake
 * runtime's FERRY_FAKE_CUDA_DRIVER_VERSION, read at ferry's one question) none is offered, nor merged
 * spans (batched there), a forced batched or merged gather is refused, and the other methods gather
 * as before. */
static void test_cuda_batched_not_offered_under_an_older_driver(void) {
    CHECK(setenv("FERRY_FAKE_CUDA_DRIVER_VERSION", "12040", 1) == 0);
    need_device();
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    const ferry_gather_method methods[] = {FERRY_GATHER_RUNS, FERRY_GATHER_KERNEL, FERRY_GATHER_AUTO};
    const ferry_copy_cost_model curved = curved_model();
    SUB(gather_all(pinned, FERRY_TYPE_F16, FERRY_TYPE_F16, false, 0.5, 3, methods, 3, &curved));
    SUB(forced_method_refused(pinned, FERRY_GATHER_BATCHED, FERRY_GATHER_KERNEL, "does not offer the batched"));
    SUB(forced_method_refused(pinned, FERRY_GATHER_MERGED, FERRY_GATHER_KERNEL, "does not offer the merged"));
}
#endif

/* A gather whose pieces include one of no rows: it reads nothing (its (count - 1) rows do not
 * wrap to a span the device maps no part of), and the others land, by the kernel and batched. */
static void test_cuda_gather_takes_a_piece_of_no_rows(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    ferry_buffer * pool;
    CHECK_OK(ferry_buffer_type_alloc_buffer(pinned, 4096, &pool));
    unsigned char * src = ferry_buffer_base(pool);
    for (int i = 0; i < 4096; i++) src[i] = (unsigned char) (i * 7 + 1);
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne = 64; /* 256 bytes */
    ferry_tensor * t;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ne, &t));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 256, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    const ferry_gather_copy pieces[] = {
        {.src_offset = 0, .dst_offset = 0, .size = 16, .count = 0, .src_stride = 256, .dst_stride = 16},
        {.src_offset = 1024, .dst_offset = 0, .size = 16, .count = 4, .src_stride = 256, .dst_stride = 16},
    };
    const ferry_gather_method methods[] = {FERRY_GATHER_KERNEL, FERRY_GATHER_BATCHED};
    for (int m = 0; m < 2; m++) {
        if (!(ferry_backend_gather_methods(cuda, src, 4096) & (1u << methods[m]))) {
            continue; /* batched copies need CUDA 12.8 */
        }
        CHECK_OK(ferry_tensor_memset(t, SENTINEL, 0, 256));
        CHECK_OK(ferry_backend_tensor_gather_async(cuda, t, (const char *) src, pieces, 2, methods[m]));
        CHECK_OK(ferry_backend_synchronize(cuda));
        unsigned char got[256];
        CHECK_OK(ferry_tensor_get(t, got, 0, 256));
        for (int r = 0; r < 4; r++) CHECK(memcmp(got + r * 16, src + 1024 + r * 256, 16) == 0);
        for (int i = 64; i < 256; i++) CHECK_EQ_U(got[i], SENTINEL);
    }
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_buffer_free(pool);
    ferry_backend_free(cuda);
}

/* Attention on CUDA over gathered windows, by each method, prefetched or not: the cell-per-stream
 * cache's outputs, byte for byte, and exactly the cells read copied. */
static void test_cuda_attention_same_as_cell_cache(void) {
    need_device();
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    ferry_backend *cuda, *cpu;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_gather_method methods[] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS,   FERRY_GATHER_BATCHED,
                                           FERRY_GATHER_KERNEL,    FERRY_GATHER_MERGED, FERRY_GATHER_AUTO};
    const bool trans[2] = {false, true};
    const ferry_copy_cost_model curved = curved_model(); /* merged across gaps */
    CHECK_OK(ferry_backend_set_copy_cost_model(cuda, &curved));
    for (int t = 0; t < 2; t++) {
        twin tw;
        CHECK_OK(twin_init(&tw, pinned, FERRY_TYPE_F16, trans[t] ? FERRY_TYPE_F32 : FERRY_TYPE_Q8_0, trans[t], 0.5,
                           40 + (uint64_t) t));
        static float want[N_LAYER * OUT_FLOATS], got[N_LAYER * OUT_FLOATS];
        uint64_t bytes;
        CHECK_OK(run_step(&tw, false, trans[t], cuda, cpu, FERRY_COPY_RAGGED, false, 0, want, &bytes));
        bool finite = true;
        for (int i = 0; i < N_LAYER * OUT_FLOATS; i++) finite = finite && isfinite(want[i]);
        CHECK(finite);
        for (int m = 0; m < 6; m++) {
            for (int prefetch = 0; prefetch < 2; prefetch++) {
                CHECK_OK(ferry_paged_cache_set_gather(tw.paged, methods[m]));
                memset(got, 0, sizeof(got));
                CHECK_OK(run_step(&tw, true, trans[t], cuda, cpu, FERRY_COPY_PLAN, m % 2 == 0, prefetch, got, &bytes));
                CHECK(memcmp(got, want, sizeof(got)) == 0);
                CHECK_EQ_U(bytes, read_bytes(&tw, FERRY_TYPE_F16, trans[t] ? FERRY_TYPE_F32 : FERRY_TYPE_Q8_0));
            }
        }
        twin_free(&tw);
    }
    ferry_backend_free(cpu);
    ferry_backend_free(cuda);
}

/* A merged gather's spans land in the backend's staging area before the runs are placed: the
 * scheduler's memory on the CUDA split holds it beside its buffer (the largest window's spans), where
 * the same step gathered batched holds the buffer alone. */
static void test_cuda_merged_staging_is_memory_the_scheduler_holds(void) {
    need_device();
    ferry_buffer_type * pinned;
    CHECK_OK(ferry_cuda_host_buffer_type(&pinned));
    ferry_backend *cuda, *cpu;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_copy_cost_model curved = curved_model(); /* merged across gaps */
    CHECK_OK(ferry_backend_set_copy_cost_model(cuda, &curved));
    twin tw;
    CHECK_OK(twin_init(&tw, pinned, FERRY_TYPE_F16, FERRY_TYPE_F16, false, 0.0, 41));
    static float out[N_LAYER * OUT_FLOATS];
    uint64_t bytes;
    CHECK_OK(ferry_paged_cache_set_gather(tw.paged, FERRY_GATHER_BATCHED));
    CHECK_OK(run_step(&tw, true, false, cuda, cpu, FERRY_COPY_RAGGED, false, 0, out, &bytes));
    const size_t batched = run_step_memory.held;
    CHECK_EQ_U(run_step_memory.staged, 0);
    CHECK_OK(ferry_paged_cache_set_gather(tw.paged, FERRY_GATHER_MERGED));
    CHECK_OK(run_step(&tw, true, false, cuda, cpu, FERRY_COPY_RAGGED, false, 0, out, &bytes));
    CHECK(run_step_memory.staged >= bytes / (2 * N_LAYER)); /* the largest window's spans: at least its cells */
    CHECK_EQ_U(run_step_memory.held, batched + run_step_memory.staged);
    twin_free(&tw);
    ferry_backend_free(cpu);
    ferry_backend_free(cuda);
}

static const check_test tests[] = {
    {"cuda_gathers_move_the_used_cells_by_every_method", test_cuda_gathers_move_the_used_cells_by_every_method},
    {"cuda_kernel_refused_for_a_pageable_pool", test_cuda_kernel_refused_for_a_pageable_pool},
    {"cuda_attention_same_as_cell_cache", test_cuda_attention_same_as_cell_cache},
    {"cuda_gather_takes_a_piece_of_no_rows", test_cuda_gather_takes_a_piece_of_no_rows},
    {"cuda_merged_staging_is_memory_the_scheduler_holds", test_cuda_merged_staging_is_memory_the_scheduler_holds},
#ifdef FERRY_FAKE_CUDART
    {"cuda_batched_not_offered_under_an_older_driver", test_cuda_batched_not_offered_under_an_older_driver},
#endif
};

CHECK_MAIN(tests)
