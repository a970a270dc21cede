/*
 * The setting of the paged cache's tests (test_paged.c, test_cuda_paged.c): block tables drawn
 * at random with a given share of adjacent blocks (fixed seeds), pools filled with a pattern of
 * their offsets, and the sentinel check of a gathered window: each used cell from its own
 * block, nothing else written.
 */
#ifndef FERRY_PAGED_FIXTURE_H
#define FERRY_PAGED_FIXTURE_H

#include "kv-fixture.h"

#include <stdint.h>

/* The geometry of the tests' caches: blocks of 4 cells, windows of 24 cells over sequences 1..4. */
enum { BS = 4, N_BLOCKS = 64, N_SEQ = 5, HEAD_DIM = 32, N_HEAD_KV = 2, N_KV = 24, N_LAYER = 2 };

static inline ferry_paged_params params_of(ferry_type tk, ferry_type tv, bool v_trans) {
    return (ferry_paged_params) {.type_k = tk, .type_v = tv, .head_dim = HEAD_DIM, .n_head_kv = N_HEAD_KV,
                                 .block_size = BS, .n_blocks = N_BLOCKS, .n_seq = N_SEQ, .n_layer = N_LAYER,
                                 .v_trans = v_trans};
}

static uint64_t paged_rng = 1;

static inline void paged_seed(uint64_t seed) { paged_rng = seed * 0x9e3779b97f4a7c15ull + 1; }

static inline uint32_t paged_rnd(void) {
    paged_rng ^= paged_rng << 13;
    paged_rng ^= paged_rng >> 7;
    paged_rng ^= paged_rng << 17;
    return (uint32_t) (paged_rng >> 32);
}

/*
 * Tables for sequences 0..n_seq-1 of cells[s] cells each (a block more when spare), drawn
 * without repeats from the pool: a block follows its predecessor (its id + 1) with probability
 * adjacency (0: never, where another block is free; 1: always, where that block is free).
 */
static inline ferry_status paged_random_tables(ferry_paged_cache * c, const int64_t * cells, int64_t n_seq,
                                               double adjacency, bool spare) {
    ferry_paged_params p;
    ferry_status st = ferry_paged_cache_params(c, &p);
    bool * taken = calloc((size_t) p.n_blocks, 1);
    int32_t * table = calloc((size_t) p.n_blocks, sizeof(int32_t));
    if (!taken || !table) {
        st = FERRY_ERR_OUT_OF_MEMORY;
    }
    for (int64_t s = 0; st == FERRY_OK && s < n_seq; s++) {
        const int64_t m = (cells[s] + p.block_size - 1) / p.block_size + (spare ? 1 : 0);
        int64_t prev = -1;
        for (int64_t j = 0; j < m; j++) {
            const bool next_free = prev >= 0 && prev + 1 < p.n_blocks && !taken[prev + 1];
            int64_t b;
            if (next_free && (adjacency >= 1.0 || paged_rnd() % 1000u < (uint32_t) (adjacency * 1000.0))) {
                b = prev + 1;
            } else {
                int tries = 0;
                do { /* a free block, not the adjacent one while another is free */
                    b = (int64_t) (paged_rnd() % (uint32_t) p.n_blocks);
                } while ((taken[b] || (b == prev + 1 && tries < 64)) && ++tries < 100000);
            }
            taken[b] = true;
            table[j] = (int32_t) b;
            prev = b;
        }
        st = ferry_paged_cache_set_table(c, s, table, m, cells[s]);
    }
    free(taken);
    free(table);
    return st;
}

/* Fill every byte of each layer's buffer with the pattern of its offset. */
static inline void paged_fill(ferry_paged_cache * c) {
    ferry_paged_params p;
    ferry_paged_cache_params(c, &p);
    for (int32_t l = 0; l < p.n_layer; l++) {
        ferry_buffer * buf = ferry_paged_cache_layer_buffer(c, l);
        uint8_t * base = ferry_buffer_base(buf);
        for (size_t i = 0; i < ferry_buffer_size(buf); i++) {
            base[i] = kv_pattern(i);
        }
    }
}

/* Blocks and runs (blocks adjacent in the pool, table order) of sequences s0.. read for used. */
static inline void paged_count(const ferry_paged_cache * c, int64_t s0, int64_t ns, const int64_t * used,
                               uint64_t * blocks, uint64_t * runs) {
    ferry_paged_params p;
    ferry_paged_cache_params(c, &p);
    int32_t * table = calloc((size_t) p.n_blocks, sizeof(int32_t));
    *blocks = *runs = 0;
    for (int64_t s = 0; table && s < ns; s++) {
        int64_t n, cells;
        ferry_paged_cache_table(c, s0 + s, table, p.n_blocks, &n, &cells);
        for (int64_t j = 0; j * p.block_size < used[s]; j++) {
            (*blocks)++;
            *runs += j == 0 || table[j] != table[j - 1] + 1;
        }
    }
    free(table);
}

/*
 * The sentinel check of a gathered paged window: got (the bytes of its dense copy, span of them,
 * SENTINEL before the copy) holds, for stream s < ns and cell c < used[s], the bytes of cell c of
 * sequence s0 + s, read through its table from the pool (V transposed: of every channel), and
 * SENTINEL in every other byte; bytes_copied is the used cells' bytes. 0 when all holds, else
 * the first that failed: 1 the bytes, 2 a cell not from its own block, 3 a sentinel lost.
 */
static inline int paged_check_bytes(const ferry_paged_cache * c, bool v, int32_t layer, int64_t s0, int64_t ns,
                                    int64_t n_kv, const int64_t * used, const uint8_t * got, size_t span,
                                    uint64_t bytes_copied) {
    ferry_paged_params p;
    ferry_paged_cache_params(c, &p);
    ferry_tensor * pool;
    (v ? ferry_paged_cache_v : ferry_paged_cache_k)(c, layer, &pool);
    const bool trans = v && p.v_trans;
    const size_t cell = trans ? ferry_type_size(pool->type) : pool->nb[1];
    const int64_t rows = trans ? p.head_dim * p.n_head_kv : 1, pool_cells = p.n_blocks * p.block_size;
    bool * covered = calloc(span, 1);
    int32_t * table = calloc((size_t) p.n_blocks, sizeof(int32_t));
    int fail = !covered || !table ? 2 : 0;
    uint64_t want = 0;
    for (int64_t s = 0; !fail && s < ns; s++) {
        int64_t n, cells;
        ferry_paged_cache_table(c, s0 + s, table, p.n_blocks, &n, &cells);
        for (int64_t x = 0; !fail && x < used[s]; x++) {
            const int64_t at = (int64_t) table[x / p.block_size] * p.block_size + x % p.block_size;
            for (int64_t r = 0; r < rows; r++) {
                const size_t dst = ((size_t) ((s * rows + r) * n_kv) + (size_t) x) * cell;
                const size_t src = ((size_t) (r * pool_cells + at)) * cell;
                fail = memcmp(got + dst, (const uint8_t *) pool->data + src, cell) != 0 ? 2 : fail;
                memset(covered + dst, 1, cell);
                want += cell;
            }
        }
    }
    for (size_t i = 0; !fail && i < span; i++) {
        fail = !covered[i] && got[i] != SENTINEL ? 3 : 0;
    }
    fail = !fail && want != bytes_copied ? 1 : fail;
    free(covered);
    free(table);
    return fail;
}

/* paged_check_bytes of the copy's bytes, read now (2 if they cannot be). */
static inline int paged_check_copy(const ferry_paged_cache * c, bool v, int32_t layer, int64_t s0, int64_t ns,
                                   int64_t n_kv, const int64_t * used, const ferry_tensor * copy,
                                   uint64_t bytes_copied) {
    const size_t span = ferry_tensor_nbytes(copy);
    uint8_t * got = malloc(span);
    const int fail = !got || ferry_tensor_get(copy, got, 0, span) != FERRY_OK
                         ? 2
                         : paged_check_bytes(c, v, layer, s0, ns, n_kv, used, got, span, bytes_copied);
    free(got);
    return fail;
}

/* A dense copy of window on backend, every byte SENTINEL; buf gets the buffer (the caller frees it). */
static inline ferry_status paged_split_copy(ferry_backend * backend, ferry_context * ctx, const ferry_tensor * window,
                                            ferry_buffer ** buf, ferry_tensor ** out) {
    ferry_status st = ferry_tensor_dup_layout(ctx, window, out);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(backend, ferry_tensor_nbytes(window), buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(*buf, *out, 0);
    if (st == FERRY_OK) st = ferry_tensor_memset(*out, SENTINEL, 0, ferry_tensor_nbytes(window));
    return st;
}

/* ---------------------------------------------------------------- lengths, and a cell-per-stream twin */

/* Cells per sequence and lengths (kv_len) of the window's streams, drawn for a seed: edge values
 * first (an empty stream, a full one, a partial block), then at random. */
static inline void draw_lengths(uint64_t seed, int64_t * cells, int32_t * lens, int64_t ns) {
    paged_seed(seed);
    for (int64_t s = 0; s < N_SEQ; s++) {
        cells[s] = (int64_t) (paged_rnd() % (N_KV + 1));
    }
    cells[1] = N_KV;
    for (int64_t s = 0; s < ns; s++) {
        const int64_t have = cells[1 + s];
        lens[s] = (int32_t) (have == 0 ? 0 : paged_rnd() % (uint32_t) (have + 1));
    }
    lens[0] = N_KV;       /* sequence 1: full */
    lens[ns - 1] = 0;     /* the last: empty */
    if (cells[2] > BS) {
        lens[1] = (int32_t) (cells[2] % BS == 0 ? cells[2] - 1 : cells[2]); /* a partly used last block */
    }
}

/* Random values of a cell (n_embd values of type, whole blocks), written at a K or V offset. */
static inline void random_cell(ferry_type type, int64_t n_embd, uint8_t * out) {
    float v[HEAD_DIM * N_HEAD_KV];
    for (int64_t i = 0; i < n_embd; i++) v[i] = (float) ((double) paged_rnd() / 4294967296.0 * 2.0 - 1.0);
    size_t row;
    ferry_row_size(type, n_embd, &row);
    ferry_quantize(type, v, n_embd, out, row);
}

typedef struct {
    ferry_kv_cache * kv;
    ferry_paged_cache * paged;
    int64_t cells[N_SEQ];
    int32_t lens[N_SEQ];
} twin;

/*
 * A cell-per-stream cache of N_SEQ streams and a paged cache with random tables, both in buft,
 * holding the same values in each sequence's cells; every other byte 0xff (NaN in every type: a cell read that
 * attention should not read shows in the output).
 */
static inline ferry_status twin_init(twin * t, ferry_buffer_type * buft, ferry_type tk, ferry_type tv, bool v_trans,
                              double adjacency, uint64_t seed) {
    memset(t, 0, sizeof(*t));
    const ferry_kv_params kp = {.type_k = tk, .type_v = tv, .head_dim = HEAD_DIM, .n_head_kv = N_HEAD_KV,
                                .n_ctx = N_SEQ * N_KV, .n_stream = N_SEQ, .n_layer = N_LAYER, .v_trans = v_trans};
    const ferry_paged_params pp = params_of(tk, tv, v_trans);
    ferry_status st = ferry_kv_cache_new(&kp, buft, &t->kv);
    if (st == FERRY_OK) st = ferry_paged_cache_new(&pp, buft, NULL, &t->paged);
    if (st != FERRY_OK) return st;
    ferry_buffer * bufs[2] = {ferry_kv_cache_buffer(t->kv), ferry_paged_cache_layer_buffer(t->paged, 0)};
    for (int b = 0; b < 2; b++) memset(ferry_buffer_base(bufs[b]), 0xff, ferry_buffer_size(bufs[b]));
    draw_lengths(seed, t->cells, t->lens, N_SEQ - 1);
    paged_seed(seed + 1000);
    st = paged_random_tables(t->paged, t->cells, N_SEQ, adjacency, seed % 2 == 0);
    const int64_t n_embd = HEAD_DIM * N_HEAD_KV;
    for (int32_t l = 0; st == FERRY_OK && l < N_LAYER; l++) {
        ferry_tensor *kc, *vc, *kp_, *vp;
        ferry_kv_cache_k(t->kv, l, &kc);
        ferry_kv_cache_v(t->kv, l, &vc);
        ferry_paged_cache_k(t->paged, l, &kp_);
        ferry_paged_cache_v(t->paged, l, &vp);
        for (int64_t s = 0; s < N_SEQ; s++) {
            for (int64_t x = 0; x < t->cells[s]; x++) {
                uint8_t cell[HEAD_DIM * N_HEAD_KV * 4];
                size_t a, b, row;
                ferry_row_size(tk, n_embd, &row);
                random_cell(tk, n_embd, cell);
                ferry_kv_cache_cell_offset(t->kv, false, s, x, &a);
                ferry_paged_cache_cell_offset(t->paged, false, s, x, &b);
                memcpy((char *) kc->data + a, cell, row);
                memcpy((char *) kp_->data + b, cell, row);
                ferry_row_size(tv, n_embd, &row);
                random_cell(tv, n_embd, cell);
                ferry_kv_cache_cell_offset(t->kv, true, s, x, &a);
                ferry_paged_cache_cell_offset(t->paged, true, s, x, &b);
                if (!v_trans) {
                    memcpy((char *) vc->data + a, cell, row);
                    memcpy((char *) vp->data + b, cell, row);
                    continue;
                }
                const size_t e = ferry_type_size(tv);
                for (int64_t ch = 0; ch < n_embd; ch++) { /* channel rows: kv_size cells, or the pool's */
                    memcpy((char *) vc->data + a + (size_t) (ch * N_KV) * e, cell + (size_t) ch * e, e);
                    memcpy((char *) vp->data + b + (size_t) (ch * N_BLOCKS * BS) * e, cell + (size_t) ch * e, e);
                }
            }
        }
    }
    return st;
}

static inline void twin_free(twin * t) {
    ferry_kv_cache_free(t->kv);
    ferry_paged_cache_free(t->paged);
}

enum { N_HEAD = 4, NS = N_SEQ - 1, OUT_FLOATS = HEAD_DIM * N_HEAD * NS };

/* What the last run_step's scheduler held on its split (ferry_sched_buffer_size) and the most bytes a
 * window's merged gather copied there (its spans, the staging area's; 0 with no merged gather). */
static struct {
    size_t held, staged;
} run_step_memory;

/* Set: run_step's scheduler lists the CPU first and the split after it (the caller's order to choose;
 * the split's lookups in the scheduler then pass over the CPU). */
static bool run_step_cpu_first;

/* The step over sequences 1..NS of either cache (paged or not) on split under policy: its outputs,
 * and the bytes its windows copied (the sum over the window inputs; a merged gather's cells read). */
static inline ferry_status run_step(twin * t, bool paged, bool v_trans, ferry_backend * split, ferry_backend * cpu,
                             ferry_copy_policy policy, bool compact, int prefetch, float * out,
                             uint64_t * window_bytes) {
    ferry_context * ctx;
    ferry_buffer * buf = NULL;
    ferry_sched * sched = NULL;
    ferry_graph * g = NULL;
    ferry_status st = ferry_context_new(&ctx);
    if (st != FERRY_OK) return st;
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD, 1, NS}, ne_len[1] = {NS};
    const size_t q_bytes = sizeof(float) * OUT_FLOATS;
    ferry_tensor * q[N_LAYER], * len, * outs[N_LAYER];
    st = ferry_backend_alloc_buffer(cpu, N_LAYER * q_bytes + 64, &buf);
    for (int32_t l = 0; st == FERRY_OK && l < N_LAYER; l++) {
        st = ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]);
        if (st == FERRY_OK) st = ferry_buffer_place_tensor(buf, q[l], (size_t) l * q_bytes);
        float v[OUT_FLOATS];
        for (int i = 0; i < OUT_FLOATS; i++) v[i] = (float) ((i * 37 + l * 11) % 101) / 50.0f - 1.0f;
        if (st == FERRY_OK) st = ferry_tensor_set(q[l], v, 0, sizeof(v));
    }
    if (st == FERRY_OK) st = ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(buf, len, N_LAYER * q_bytes);
    if (st == FERRY_OK) st = ferry_tensor_set(len, t->lens, 0, NS * sizeof(int32_t));
    ferry_backend * backends[2] = {run_step_cpu_first ? cpu : split, run_step_cpu_first ? split : cpu};
    if (st == FERRY_OK) st = ferry_sched_new(backends, split == cpu ? 1 : 2, &sched);
    if (st == FERRY_OK) st = ferry_sched_set_policy(sched, policy);
    if (st == FERRY_OK) st = ferry_sched_set_compact(sched, compact);
    if (st == FERRY_OK) st = ferry_sched_set_prefetch(sched, prefetch);
    if (st == FERRY_OK) st = ferry_graph_new(&g);
    ferry_backend * per_layer[N_LAYER] = {split, split};
    if (st == FERRY_OK) {
        st = paged ? ferry_paged_attention_step_on(t->paged, ctx, N_LAYER, N_KV, 1, NS, q, len, v_trans, sched,
                                                   per_layer, g, outs)
                   : ferry_kv_attention_step_on(t->kv, ctx, N_LAYER, N_KV, 1, NS, q, len, v_trans, sched, per_layer, g,
                                                outs);
    }
    if (st == FERRY_OK) st = ferry_sched_graph_compute(sched, g);
    for (int32_t l = 0; st == FERRY_OK && l < N_LAYER; l++) {
        st = ferry_tensor_get(outs[l], out + (size_t) l * OUT_FLOATS, 0, OUT_FLOATS * sizeof(float));
    }
    *window_bytes = 0;
    run_step_memory.held = ferry_sched_buffer_size(sched, split);
    run_step_memory.staged = 0;
    for (int i = 0; st == FERRY_OK && i < ferry_sched_n_inputs(sched); i++) {
        ferry_sched_input_info in;
        st = ferry_sched_input(sched, i, &in);
        if (st == FERRY_OK && (in.src->paged || in.src->used_lengths)) {
            /* merged spans carry their gaps across too (at least the cells): the cells read are the count */
            const bool merged = in.src->paged && in.stats.gather == FERRY_GATHER_MERGED;
            if (merged && in.stats.bytes_copied < in.stats.bytes_read) {
                st = FERRY_ERR_INVALID_ARG;
            }
            *window_bytes += merged ? in.stats.bytes_read : in.stats.bytes_copied;
            if (merged && in.stats.bytes_copied > run_step_memory.staged) {
                run_step_memory.staged = in.stats.bytes_copied;
            }
        }
    }
    ferry_sched_free(sched);
    ferry_graph_free(g);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    return st;
}

/* Exactly the bytes attention reads: every window's used cells. */
static inline uint64_t read_bytes(const twin * t, ferry_type tk, ferry_type tv) {
    size_t k, v;
    ferry_row_size(tk, HEAD_DIM * N_HEAD_KV, &k);
    ferry_row_size(tv, HEAD_DIM * N_HEAD_KV, &v);
    uint64_t cells = 0;
    for (int s = 0; s < NS; s++) cells += (uint64_t) t->lens[s];
    return cells * (k + v) * N_LAYER;
}

#endif
