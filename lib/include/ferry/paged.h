/* ferry/paged.h: a paged KV cache, as serving systems keep theirs, and its windows. */
#ifndef FERRY_PAGED_H
#define FERRY_PAGED_H

#include "copy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- a paged KV cache (paged-kv.c) */

/*
 * A paged KV cache, laid out as vLLM lays one out: per layer, a K pool and a V pool of n_blocks
 * blocks of block_size cells, [num_blocks, block_size, n_head_kv, head_dim] in C order, which is
 * ferry's [n_embd_gqa, n_blocks * block_size] (cell c of block b is pool cell b * block_size + c;
 * q8_0 rows whole). A transposed V (v_trans) is [n_blocks * block_size, n_embd_gqa]: one row per
 * channel holding every pool cell, so that adjacent blocks are adjacent within each row.
 *
 * Each of n_seq sequences has a block table: the ids of its blocks in the order of its cells,
 * and the cells it holds. ferry_paged_cache_allocate, _append and _free_seq keep tables from the
 * cache's free list of block ids (taken lowest first, so that a fresh cache's sequences get
 * adjacent blocks); ferry_paged_cache_set_table takes the caller's own table (a serving
 * system's). A block is in one table at a time unless share_blocks (a common prefix); a block
 * in a table is out of the free list until no table holds it.
 */
typedef struct {
    ferry_type type_k;
    ferry_type type_v;
    int64_t head_dim;
    int64_t n_head_kv;
    int64_t block_size;  /* cells per block */
    int64_t n_blocks;    /* blocks in each layer's K and V pools */
    int64_t n_seq;       /* sequences: one block table each; 1..FERRY_PAGED_MAX_SEQ */
    int32_t n_layer;
    bool    v_trans;     /* V stored transposed; needs an unblocked V type */
    bool    share_blocks; /* tables may hold the same block (refused otherwise, naming both sequences) */
} ferry_paged_params;

typedef struct ferry_paged_cache ferry_paged_cache;

/* The most sequences (tables) a cache keeps. */
enum { FERRY_PAGED_MAX_SEQ = 1 << 20 };

/*
 * A paged cache whose layer l lives in buffer type layer_bufts[l] (a device's memory, say), or
 * host_buft where layer_bufts or its entry is NULL; one buffer is allocated per distinct buffer
 * type, cleared to zeros. Every table starts empty and every block free.
 */
FERRY_API ferry_status ferry_paged_cache_new(const ferry_paged_params * params, ferry_buffer_type * host_buft,
                                             ferry_buffer_type * const * layer_bufts, ferry_paged_cache ** out);
/*
 * A paged cache over pools the caller owns (ferry_host_buffer_from_ptr, ferry_cuda_buffer_from_ptr,
 * or any ferry buffer): layer l's K pool at k_offsets[l] of k_bufs[l], its V pool at v_offsets[l]
 * of v_bufs[l] (a buffer of the same type), laid out as above. Their content is kept; the cache
 * frees none of them, and they must outlive it. Tables start empty: the caller's come by
 * ferry_paged_cache_set_table.
 */
FERRY_API ferry_status ferry_paged_cache_new_over(const ferry_paged_params * params, ferry_buffer * const * k_bufs,
                                                  const size_t * k_offsets, ferry_buffer * const * v_bufs,
                                                  const size_t * v_offsets, ferry_paged_cache ** out);
FERRY_API void         ferry_paged_cache_free(ferry_paged_cache * cache);
FERRY_API ferry_status ferry_paged_cache_params(const ferry_paged_cache * cache, ferry_paged_params * out);
/* A layer's K and V pools: [n_embd_gqa, n_blocks * block_size] (V transposed: the reverse). */
FERRY_API ferry_status ferry_paged_cache_k(const ferry_paged_cache * cache, int32_t layer, ferry_tensor ** out);
FERRY_API ferry_status ferry_paged_cache_v(const ferry_paged_cache * cache, int32_t layer, ferry_tensor ** out);
/* Per layer (NULL for a layer the cache does not have): the buffer type and buffer of its pools. */
FERRY_API ferry_buffer_type * ferry_paged_cache_layer_buffer_type(const ferry_paged_cache * cache, int32_t layer);
FERRY_API ferry_buffer * ferry_paged_cache_layer_buffer(const ferry_paged_cache * cache, int32_t layer);

/* ---------------------------------------------------------------- block tables */

/*
 * Sequence seq, which must hold no cells, gets n_cells cells in ceil(n_cells / block_size)
 * blocks from the free list. Refused, changing nothing: a sequence out of range or not empty,
 * n_cells negative, fewer free blocks than needed (OUT_OF_MEMORY, naming the sequence, the
 * blocks it needs and the blocks free).
 */
FERRY_API ferry_status ferry_paged_cache_allocate(ferry_paged_cache * cache, int64_t seq, int64_t n_cells);
/* Sequence seq grows by n_cells cells: into the blocks its table holds first (a table set with
 * more blocks than its cells fill keeps them), then taking blocks from the free list as its last
 * one fills; refused as allocate is, changing nothing. */
FERRY_API ferry_status ferry_paged_cache_append(ferry_paged_cache * cache, int64_t seq, int64_t n_cells);
/* Sequence seq's blocks go back to the free list (a shared block when its last table lets it go);
 * it holds no cells after. */
FERRY_API ferry_status ferry_paged_cache_free_seq(ferry_paged_cache * cache, int64_t seq);
/*
 * Sequence seq's table becomes the caller's: n_blocks block ids holding n_cells cells (in
 * 0..n_blocks * block_size); blocks past its cells stay its own, for append to fill. Its old
 * blocks are let go first. Refused, changing nothing, with a message naming the sequence and the
 * block: an id outside 0..the pool's blocks - 1, an id twice in the table, a block another
 * sequence's table holds (unless share_blocks), n_cells past the table's cells.
 */
FERRY_API ferry_status ferry_paged_cache_set_table(ferry_paged_cache * cache, int64_t seq, const int32_t * blocks,
                                                   int64_t n_blocks, int64_t n_cells);
/* Sequence seq's table: *n_blocks ids (up to max_blocks of them into blocks, which may be NULL
 * to ask the count) and the cells it holds. */
FERRY_API ferry_status ferry_paged_cache_table(const ferry_paged_cache * cache, int64_t seq, int32_t * blocks,
                                               int64_t max_blocks, int64_t * n_blocks, int64_t * n_cells);
/* Blocks on the free list; -1 for NULL. */
FERRY_API int64_t      ferry_paged_cache_free_blocks(const ferry_paged_cache * cache);
/* Where cell `cell` of sequence seq lies (through its table) in each layer's K (v false) or V
 * pool: the byte offset of its first value, or, V transposed, of its value of channel 0 (channel
 * ch lies ch * n_blocks * block_size values on). Refused past the cells its table holds. */
FERRY_API ferry_status ferry_paged_cache_cell_offset(const ferry_paged_cache * cache, bool v, int64_t seq,
                                                     int64_t cell, size_t * out);

/* ---------------------------------------------------------------- windows */

/*
 * How the cache's windows are gathered (copy.h: ferry_gather_method): AUTO (the default) lets
 * the cost model choose per copy; any other forces that method, and a copy into a backend that
 * does not offer it is refused.
 */
FERRY_API ferry_status ferry_paged_cache_set_gather(ferry_paged_cache * cache, ferry_gather_method method);
FERRY_API ferry_gather_method ferry_paged_cache_get_gather(const ferry_paged_cache * cache);

/*
 * The K and V windows of layer `layer` over sequences s0..s1, one stream each, n_kv cells a
 * stream, made in ctx: tensors with the dense layout of a cell-per-stream window's compact copy
 * (copy.h, "paged windows"), K [head_dim, n_kv, n_head_kv, ns], V the same or, transposed,
 * [n_kv, head_dim, n_head_kv, ns], whose cells are gathered from the pools when the scheduler
 * copies them to the split's backend (any split, the CPU too: a paged window is always copied)
 * or ferry_copy_input does. The window reads the tables, and its lengths, when copied: stream s
 * gets the first min(length, n_kv) cells of sequence s0 + s, its length the used cells the
 * window carries (ferry_tensor_set_used_cells, kv_len) or else the cells its table holds. A
 * paged window has no bytes of its own: a transfer, a view, an export or a kernel that would
 * read it directly is refused. Refused here: a layer or sequences the cache does not have, n_kv
 * not in 1..a pool's cells. Either output may be NULL.
 */
FERRY_API ferry_status ferry_paged_cache_window(const ferry_paged_cache * cache, ferry_context * ctx, int32_t layer,
                                                int64_t n_kv, int64_t s0, int64_t s1, ferry_tensor ** k_out,
                                                ferry_tensor ** v_out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_PAGED_H */
