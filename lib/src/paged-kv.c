/*
 * A paged KV cache, as serving systems keep theirs (vLLM, SGLang, LMCache): per layer a K and a
 * V pool of fixed-size blocks, per sequence a table of block ids, and a free list of blocks. Its
 * windows are paged windows (tensor.c), gathered into dense copies by the copy path
 * (copy-paged.c), which reads the tables this file keeps as it copies.
 */
#include "copy-impl.h"
#include "kv-layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ferry_paged_cache {
    ferry_paged_params params;
    int64_t pool_cells;              /* n_blocks * block_size */
    ferry_kv_layers layers;          /* per layer: the pools, where they live, the owned buffers */
    ferry_paged_source * sources;    /* per layer: K at 2l, V at 2l + 1 */
    ferry_paged_tables tables;
    int64_t * capacity;              /* per sequence: room in its blocks array */
    int32_t * refs;                  /* per block: the tables holding it */
    int32_t * free_ids;              /* the free list, a stack: the next block taken is last */
    int64_t n_free;
    int64_t * free_at;               /* per block: its place in free_ids, -1 when taken */
    uint64_t * mark;                 /* per block: set_table's marks (this call's stamp) */
    uint64_t stamp;
};

static ferry_status check_params(const ferry_paged_params * p) {
    FERRY_CHECK_ARG(p, "paged_cache: NULL params");
    const ferry_kv_heads heads = FERRY_KV_HEADS_OF(p);
    FERRY_TRY(ferry_kv_check_types("paged_cache", &heads));
    if (p->head_dim <= 0 || p->n_head_kv <= 0 || p->block_size <= 0 || p->n_blocks <= 0 || p->n_seq <= 0 ||
        p->n_layer <= 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache: head_dim, n_head_kv, block_size, n_blocks, n_seq and "
                          "n_layer must be positive");
    }
    if (p->n_seq > FERRY_PAGED_MAX_SEQ) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache: n_seq %lld is past the %d sequences' tables a cache "
                          "keeps", (long long) p->n_seq, FERRY_PAGED_MAX_SEQ);
    }
    if (p->n_blocks > INT32_MAX) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache: n_blocks %lld is past the %d block ids a table "
                          "holds (int32)", (long long) p->n_blocks, INT32_MAX);
    }
    if (p->head_dim > INT64_MAX / p->n_head_kv || p->block_size > INT64_MAX / p->n_blocks) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache: head_dim x n_head_kv or block_size x n_blocks "
                          "overflows");
    }
    return ferry_kv_check_rows("paged_cache", &heads);
}

void ferry_paged_cache_free(ferry_paged_cache * cache) {
    if (!cache) {
        return;
    }
    ferry_kv_layers_free(&cache->layers);
    for (int64_t s = 0; cache->tables.blocks && s < cache->tables.n_seq; s++) {
        free(cache->tables.blocks[s]);
    }
    free(cache->sources);
    free(cache->tables.blocks);
    free(cache->tables.n_blocks);
    free(cache->tables.n_cells);
    free(cache->capacity);
    free(cache->refs);
    free(cache->free_ids);
    free(cache->free_at);
    free(cache->mark);
    free(cache);
}

/* c, the cache made, when st is OK; else c freed and st. */
static ferry_status kept(ferry_paged_cache * c, ferry_status st, ferry_paged_cache ** out) {
    if (st != FERRY_OK) {
        ferry_paged_cache_free(c);
        return st;
    }
    *out = c;
    return FERRY_OK;
}

/* A layer's pool: a row of n_embd values per cell, every cell of the pool's blocks. */
static void k_shape(const void * cache, int32_t layer, int64_t ne[FERRY_MAX_DIMS]) {
    (void) layer;
    const ferry_paged_cache * c = cache;
    ne[0] = c->params.head_dim * c->params.n_head_kv;
    ne[1] = c->pool_cells;
}

/* What the spine needs of this cache: its name, and a layer's pools, every cell of its blocks. */
static const ferry_kv_layout pool_layout = {
    .what = "paged_cache", .tensors = "paged", .one = " pool", .pair = "K and V pools", .n_dims = 2,
    .may_leave_unplaced = false, .k_shape = k_shape,
};

/* What a paged window of each layer's K and V pool gathers from. */
static void keep_sources(ferry_paged_cache * c) {
    const ferry_paged_params * p = &c->params;
    for (int32_t l = 0; l < p->n_layer; l++) {
        for (int which = 0; which < 2; which++) {
            const bool trans = which == 1 && p->v_trans;
            ferry_tensor * pool = which ? c->layers.v[l] : c->layers.k[l];
            c->sources[2 * l + which] = (ferry_paged_source) {
                .pool = pool, .v_trans = trans, .block_size = p->block_size, .pool_cells = c->pool_cells,
                .n_embd = p->head_dim * p->n_head_kv, .cell_bytes = trans ? ferry_type_size(p->type_v) : pool->nb[1],
                .tables = &c->tables};
        }
    }
}

/* The pools, nothing placed; the tables come when the pools have memory (keep_tables). */
static ferry_status lay_out(const ferry_paged_params * params, ferry_paged_cache ** out) {
    FERRY_TRY(check_params(params));
    ferry_paged_cache * c = ferry_calloc(1, sizeof(*c));
    if (!c) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged_cache_new: out of memory");
    }
    c->params = *params;
    c->pool_cells = params->n_blocks * params->block_size;
    c->tables.n_seq = params->n_seq;
    c->sources = ferry_calloc(2 * (size_t) params->n_layer, sizeof(*c->sources));
    if (!c->sources) {
        return kept(c, ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged_cache_new: out of memory"), out);
    }
    const ferry_kv_heads heads = FERRY_KV_HEADS_OF(params);
    const ferry_status st = ferry_kv_layers_make(&c->layers, &pool_layout, &heads, params->n_layer, c);
    if (st == FERRY_OK) {
        keep_sources(c);
    }
    return kept(c, st, out);
}

/* Every table empty, every block on the free list, block 0 on top: a fresh cache hands out 0, 1, ... */
static ferry_status keep_tables(ferry_paged_cache * c) {
    const size_t seqs = (size_t) c->params.n_seq, blocks = (size_t) c->params.n_blocks;
    c->tables.blocks = ferry_calloc(seqs, sizeof(*c->tables.blocks));
    c->tables.n_blocks = ferry_calloc(seqs, sizeof(*c->tables.n_blocks));
    c->tables.n_cells = ferry_calloc(seqs, sizeof(*c->tables.n_cells));
    c->capacity = ferry_calloc(seqs, sizeof(*c->capacity));
    c->refs = ferry_calloc(blocks, sizeof(*c->refs));
    c->free_ids = ferry_calloc(blocks, sizeof(*c->free_ids));
    c->free_at = ferry_calloc(blocks, sizeof(*c->free_at));
    c->mark = ferry_calloc(blocks, sizeof(*c->mark));
    if (!c->tables.blocks || !c->tables.n_blocks || !c->tables.n_cells || !c->capacity || !c->refs || !c->free_ids ||
        !c->free_at || !c->mark) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged_cache_new: out of memory for the tables of %lld sequences "
                          "and the lists of %lld blocks", (long long) c->params.n_seq,
                          (long long) c->params.n_blocks);
    }
    c->n_free = c->params.n_blocks;
    for (int64_t b = 0; b < c->params.n_blocks; b++) {
        c->free_ids[c->params.n_blocks - 1 - b] = (int32_t) b;
        c->free_at[b] = c->params.n_blocks - 1 - b;
    }
    return FERRY_OK;
}

ferry_status ferry_paged_cache_new(const ferry_paged_params * params, ferry_buffer_type * host_buft,
                                   ferry_buffer_type * const * layer_bufts, ferry_paged_cache ** out) {
    FERRY_CHECK_ARG(out, "paged_cache_new: NULL output");
    ferry_paged_cache * c;
    FERRY_TRY(lay_out(params, &c));
    ferry_status st = ferry_kv_layers_place(&c->layers, host_buft, layer_bufts);
    return kept(c, st == FERRY_OK ? keep_tables(c) : st, out);
}

ferry_status ferry_paged_cache_new_over(const ferry_paged_params * params, ferry_buffer * const * k_bufs,
                                        const size_t * k_offsets, ferry_buffer * const * v_bufs,
                                        const size_t * v_offsets, ferry_paged_cache ** out) {
    FERRY_CHECK_ARG(out && k_bufs && k_offsets && v_bufs && v_offsets, "paged_cache_new_over: NULL argument");
    ferry_paged_cache * c;
    FERRY_TRY(lay_out(params, &c));
    ferry_status st = ferry_kv_layers_place_over(&c->layers, k_bufs, k_offsets, v_bufs, v_offsets);
    return kept(c, st == FERRY_OK ? keep_tables(c) : st, out);
}

ferry_status ferry_paged_cache_params(const ferry_paged_cache * cache, ferry_paged_params * out) {
    FERRY_CHECK_ARG(cache && out, "paged_cache_params: NULL argument");
    *out = cache->params;
    return FERRY_OK;
}

static ferry_status check_layer(const ferry_paged_cache * c, int32_t layer, const void * out, const char * what) {
    FERRY_CHECK_ARG(c && out, "%s: NULL argument", what);
    return ferry_kv_layers_check(&c->layers, layer, what);
}

ferry_status ferry_paged_cache_k(const ferry_paged_cache * cache, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(cache, "paged_cache_k: NULL argument");
    return ferry_kv_layers_tensor(&cache->layers, layer, false, out, "paged_cache_k");
}

ferry_status ferry_paged_cache_v(const ferry_paged_cache * cache, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(cache, "paged_cache_v: NULL argument");
    return ferry_kv_layers_tensor(&cache->layers, layer, true, out, "paged_cache_v");
}

ferry_buffer_type * ferry_paged_cache_layer_buffer_type(const ferry_paged_cache * cache, int32_t layer) {
    return cache ? ferry_kv_layers_buffer_type(&cache->layers, layer) : NULL;
}

ferry_buffer * ferry_paged_cache_layer_buffer(const ferry_paged_cache * cache, int32_t layer) {
    return cache ? ferry_kv_layers_buffer(&cache->layers, layer) : NULL;
}

/* ---------------------------------------------------------------- block tables */

static ferry_status check_seq(const ferry_paged_cache * c, int64_t seq, const char * what) {
    FERRY_CHECK_ARG(c, "%s: NULL cache", what);
    if (seq < 0 || seq >= c->params.n_seq) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: sequence %lld is not in 0..%lld", what, (long long) seq,
                          (long long) c->params.n_seq - 1);
    }
    return FERRY_OK;
}

/* Room for n blocks in seq's table; on failure it is as it was. */
static ferry_status reserve(ferry_paged_cache * c, int64_t seq, int64_t n, const char * what) {
    if (n <= c->capacity[seq]) {
        return FERRY_OK;
    }
    size_t cap = (size_t) c->capacity[seq];
    int32_t * grown = ferry_grow(c->tables.blocks[seq], &cap, (size_t) n, sizeof(int32_t));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: out of memory for sequence %lld's table of %lld blocks",
                          what, (long long) seq, (long long) n);
    }
    c->tables.blocks[seq] = grown;
    c->capacity[seq] = (int64_t) cap;
    return FERRY_OK;
}

/* A block onto the free list, on top / off it, from wherever it is: the rest keep their order, so
 * that the blocks taken next are still the lowest (or the last let go). */
static void release(ferry_paged_cache * c, int32_t b) {
    if (--c->refs[b] == 0) {
        c->free_at[b] = c->n_free;
        c->free_ids[c->n_free++] = b;
    }
}

static void hold(ferry_paged_cache * c, int32_t b) {
    if (c->refs[b]++ == 0) {
        const int64_t at = c->free_at[b];
        memmove(c->free_ids + at, c->free_ids + at + 1, (size_t) (c->n_free - 1 - at) * sizeof(*c->free_ids));
        c->n_free--;
        for (int64_t i = at; i < c->n_free; i++) {
            c->free_at[c->free_ids[i]] = i;
        }
        c->free_at[b] = -1;
    }
}

/* seq grows to n_cells: into the blocks its table holds first (set_table may give it more than its
 * cells fill; they stay its own), then new ones from the top of the free list. */
static ferry_status grow_to(ferry_paged_cache * c, int64_t seq, int64_t n_cells, const char * what) {
    const int64_t bs = c->params.block_size, have = c->tables.n_blocks[seq];
    const int64_t fill = n_cells / bs + (n_cells % bs != 0);
    const int64_t need = fill > have ? fill - have : 0;
    if (need > c->n_free) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: sequence %lld needs %lld more blocks for %lld cells, and %lld "
                          "of the pool's %lld are free", what, (long long) seq, (long long) need,
                          (long long) n_cells, (long long) c->n_free, (long long) c->params.n_blocks);
    }
    FERRY_TRY(reserve(c, seq, have + need, what));
    for (int64_t i = 0; i < need; i++) {
        const int32_t b = c->free_ids[c->n_free - 1];
        hold(c, b);
        c->tables.blocks[seq][have + i] = b;
    }
    c->tables.n_blocks[seq] = have + need;
    c->tables.n_cells[seq] = n_cells;
    return FERRY_OK;
}

ferry_status ferry_paged_cache_allocate(ferry_paged_cache * cache, int64_t seq, int64_t n_cells) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_allocate"));
    if (cache->tables.n_blocks[seq] > 0 || cache->tables.n_cells[seq] > 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_allocate: sequence %lld already holds %lld cells in "
                          "%lld blocks: append to it, or free it first", (long long) seq,
                          (long long) cache->tables.n_cells[seq], (long long) cache->tables.n_blocks[seq]);
    }
    if (n_cells < 0 || n_cells > cache->pool_cells) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_allocate: %lld cells for sequence %lld are not in "
                          "0..%lld (the pool's)", (long long) n_cells, (long long) seq, (long long) cache->pool_cells);
    }
    return grow_to(cache, seq, n_cells, "paged_cache_allocate");
}

ferry_status ferry_paged_cache_append(ferry_paged_cache * cache, int64_t seq, int64_t n_cells) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_append"));
    const int64_t have = cache->tables.n_cells[seq];
    if (n_cells < 0 || n_cells > cache->pool_cells - have) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_append: %lld more cells for sequence %lld, which holds "
                          "%lld, are not in 0..%lld (the pool's)", (long long) n_cells, (long long) seq,
                          (long long) have, (long long) (cache->pool_cells - have));
    }
    return grow_to(cache, seq, have + n_cells, "paged_cache_append");
}

ferry_status ferry_paged_cache_free_seq(ferry_paged_cache * cache, int64_t seq) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_free_seq"));
    /* last block first, so that the next blocks taken are this table's in its order */
    for (int64_t i = cache->tables.n_blocks[seq] - 1; i >= 0; i--) {
        release(cache, cache->tables.blocks[seq][i]);
    }
    cache->tables.n_blocks[seq] = 0;
    cache->tables.n_cells[seq] = 0;
    return FERRY_OK;
}

/* Another sequence than seq whose table holds block b (for a message); -1 if none. */
static int64_t holder_of(const ferry_paged_cache * c, int32_t b, int64_t seq) {
    for (int64_t s = 0; s < c->params.n_seq; s++) {
        for (int64_t i = 0; s != seq && i < c->tables.n_blocks[s]; i++) {
            if (c->tables.blocks[s][i] == b) {
                return s;
            }
        }
    }
    return -1;
}

/* The caller's table checked against the cache: ids in range, none twice, none held elsewhere. */
static ferry_status check_table(ferry_paged_cache * c, int64_t seq, const int32_t * blocks, int64_t n) {
    const char * what = "paged_cache_set_table";
    const uint64_t old = ++c->stamp, now = ++c->stamp;
    for (int64_t i = 0; i < c->tables.n_blocks[seq]; i++) {
        c->mark[c->tables.blocks[seq][i]] = old;
    }
    for (int64_t i = 0; i < n; i++) {
        const int32_t b = blocks[i];
        if (b < 0 || b >= c->params.n_blocks) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: sequence %lld's block %lld is id %d, not in 0..%lld (the "
                              "pool's blocks)", what, (long long) seq, (long long) i, (int) b,
                              (long long) c->params.n_blocks - 1);
        }
        if (c->mark[b] == now) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: sequence %lld's block %lld is id %d, which its table "
                              "already holds: a block holds one run of cells", what, (long long) seq, (long long) i,
                              (int) b);
        }
        const int32_t others = c->refs[b] - (c->mark[b] == old ? 1 : 0);
        if (others > 0 && !c->params.share_blocks) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: sequence %lld's block %lld is id %d, which sequence %lld's "
                              "table holds; blocks are shared only in a cache made with share_blocks", what,
                              (long long) seq, (long long) i, (int) b, (long long) holder_of(c, b, seq));
        }
        c->mark[b] = now;
    }
    return FERRY_OK;
}

ferry_status ferry_paged_cache_set_table(ferry_paged_cache * cache, int64_t seq, const int32_t * blocks,
                                         int64_t n_blocks, int64_t n_cells) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_set_table"));
    FERRY_CHECK_ARG(blocks || n_blocks == 0, "paged_cache_set_table: NULL blocks for sequence %lld", (long long) seq);
    if (n_blocks < 0 || n_blocks > cache->params.n_blocks) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_set_table: sequence %lld's table of %lld blocks is not "
                          "in 0..%lld (the pool's)", (long long) seq, (long long) n_blocks,
                          (long long) cache->params.n_blocks);
    }
    if (n_cells < 0 || n_cells > n_blocks * cache->params.block_size) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_set_table: sequence %lld's %lld cells are not in 0..%lld "
                          "(its %lld blocks of %lld)", (long long) seq, (long long) n_cells,
                          (long long) (n_blocks * cache->params.block_size), (long long) n_blocks,
                          (long long) cache->params.block_size);
    }
    FERRY_TRY(check_table(cache, seq, blocks, n_blocks));
    FERRY_TRY(reserve(cache, seq, n_blocks, "paged_cache_set_table"));
    /* the new blocks held before the old are let go: a block in both stays off the free list */
    for (int64_t i = 0; i < n_blocks; i++) {
        hold(cache, blocks[i]);
    }
    for (int64_t i = cache->tables.n_blocks[seq] - 1; i >= 0; i--) {
        release(cache, cache->tables.blocks[seq][i]);
    }
    if (n_blocks > 0) {
        memcpy(cache->tables.blocks[seq], blocks, (size_t) n_blocks * sizeof(*blocks));
    }
    cache->tables.n_blocks[seq] = n_blocks;
    cache->tables.n_cells[seq] = n_cells;
    return FERRY_OK;
}

ferry_status ferry_paged_cache_table(const ferry_paged_cache * cache, int64_t seq, int32_t * blocks,
                                     int64_t max_blocks, int64_t * n_blocks, int64_t * n_cells) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_table"));
    FERRY_CHECK_ARG(n_blocks && n_cells, "paged_cache_table: NULL output");
    const int64_t n = cache->tables.n_blocks[seq];
    *n_blocks = n;
    *n_cells = cache->tables.n_cells[seq];
    if (blocks && n > max_blocks) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache_table: sequence %lld's table holds %lld blocks, room "
                          "for %lld", (long long) seq, (long long) n, (long long) max_blocks);
    }
    if (blocks && n > 0) {
        memcpy(blocks, cache->tables.blocks[seq], (size_t) n * sizeof(*blocks));
    }
    return FERRY_OK;
}

int64_t ferry_paged_cache_free_blocks(const ferry_paged_cache * cache) { return cache ? cache->n_free : -1; }

ferry_status ferry_paged_cache_cell_offset(const ferry_paged_cache * cache, bool v, int64_t seq, int64_t cell,
                                           size_t * out) {
    FERRY_TRY(check_seq(cache, seq, "paged_cache_cell_offset"));
    FERRY_CHECK_ARG(out, "paged_cache_cell_offset: NULL output");
    if (cell < 0 || cell >= cache->tables.n_cells[seq]) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache_cell_offset: cell %lld of sequence %lld is not in "
                          "0..%lld (the cells its table holds)", (long long) cell, (long long) seq,
                          (long long) cache->tables.n_cells[seq] - 1);
    }
    const ferry_paged_source * src = &cache->sources[v ? 1 : 0];
    const int64_t bs = cache->params.block_size;
    const int64_t pool_cell = (int64_t) cache->tables.blocks[seq][cell / bs] * bs + cell % bs;
    *out = (size_t) pool_cell * src->cell_bytes;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- windows */

ferry_status ferry_paged_cache_set_gather(ferry_paged_cache * cache, ferry_gather_method method) {
    FERRY_CHECK_ARG(cache, "paged_cache_set_gather: NULL cache");
    if ((int) method < 0 || method >= FERRY_GATHER_COUNT) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "paged_cache_set_gather: unknown gather method %d", (int) method);
    }
    cache->tables.gather = method;
    return FERRY_OK;
}

ferry_gather_method ferry_paged_cache_get_gather(const ferry_paged_cache * cache) {
    return cache ? cache->tables.gather : FERRY_GATHER_AUTO;
}

/* A layer's K (v false) or V window: the dense layout of a cell-per-stream window's compact copy. */
static ferry_status window(const ferry_paged_cache * c, ferry_context * ctx, bool v, int32_t layer, int64_t n_kv,
                           int64_t s0, int64_t s1, ferry_tensor ** out) {
    const ferry_paged_params * p = &c->params;
    const ferry_paged_source * src = &c->sources[2 * layer + (v ? 1 : 0)];
    const ferry_type type = v ? p->type_v : p->type_k;
    const size_t elem = ferry_type_size(type), cells = (size_t) n_kv;
    int64_t ne[FERRY_MAX_DIMS];
    size_t nb[FERRY_MAX_DIMS];
    ne[2] = p->n_head_kv;
    ne[3] = s1 - s0 + 1;
    nb[0] = elem;
    if (src->v_trans) { /* per stream, a row of n_kv cells per channel */
        ne[0] = n_kv;
        ne[1] = p->head_dim;
        nb[1] = elem * cells;
        nb[2] = nb[1] * (size_t) p->head_dim;
    } else {            /* per stream, n_kv cells of every head */
        ne[0] = p->head_dim;
        ne[1] = n_kv;
        nb[1] = src->cell_bytes;
        ferry_row_size(type, p->head_dim, &nb[2]);
    }
    nb[3] = src->cell_bytes * cells * (size_t) (src->v_trans ? src->n_embd : 1);
    FERRY_TRY(ferry_tensor_paged_window(ctx, v ? c->layers.v[layer] : c->layers.k[layer], ne, nb, src, s0, out));
    char name[FERRY_MAX_NAME];
    snprintf(name, sizeof(name), "paged_window_%s_l%d", v ? "v" : "k", layer);
    return ferry_tensor_set_name(*out, name);
}

ferry_status ferry_paged_cache_window(const ferry_paged_cache * cache, ferry_context * ctx, int32_t layer,
                                      int64_t n_kv, int64_t s0, int64_t s1, ferry_tensor ** k_out,
                                      ferry_tensor ** v_out) {
    FERRY_TRY(check_layer(cache, layer, ctx, "paged_cache_window"));
    if (n_kv <= 0 || n_kv > cache->pool_cells) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache_window: n_kv %lld is not in 1..%lld (a pool's cells)",
                          (long long) n_kv, (long long) cache->pool_cells);
    }
    if (s0 < 0 || s1 < s0 || s1 >= cache->params.n_seq) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "paged_cache_window: sequences %lld..%lld are not within 0..%lld",
                          (long long) s0, (long long) s1, (long long) cache->params.n_seq - 1);
    }
    if (k_out) {
        FERRY_TRY(window(cache, ctx, false, layer, n_kv, s0, s1, k_out));
    }
    if (v_out) {
        FERRY_TRY(window(cache, ctx, true, layer, n_kv, s0, s1, v_out));
    }
    return FERRY_OK;
}
