/*
 * The copy path's internals (copy-path.c, copy-compact.c, copy-ragged.c, copy-paged.c), for the
 * files that copy a window (the scheduler's prefetch) and the paged cache that keeps the tables a
 * paged window is gathered by. No backend includes it: a backend is handed its copies through
 * its interface (backend-impl.h).
 */
#ifndef FERRY_COPY_IMPL_H
#define FERRY_COPY_IMPL_H

#include "ferry-impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- windows and their lengths */

/* The one 2-D copy of a view that reads no byte twice; false (no error left) if it has
 * no such plan. Compact staging packs exactly these views (copy-compact.c). */
bool ferry_single_copy_of(const ferry_tensor * t, ferry_copy_2d * out);

/* Does t carry lengths (ferry_tensor_set_used_cells) in memory the host can read now? (copy-ragged.c) */
bool ferry_used_lengths_readable(const ferry_tensor * t);

/* The bytes of t's used cells (ferry_tensor_set_used_cells), what attention reads of it: true and
 * *bytes when t carries lengths the host can read, else false (a length out of range too). */
bool ferry_copy_used_bytes(const ferry_tensor * t, uint64_t * bytes);

/* The ragged route (copy-ragged.c): src's used cells into dst (src's layout, or its compact
 * layout when compact), by ferry_copy_ragged_plan's copies and the backend's cost model; *read
 * gets the bytes moved, which are the bytes read, *predicted the copies' time by that model.
 * from (NULL: from cell 0): per stream, the cells dst already holds; only those after them. */
ferry_status ferry_copy_ragged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, bool compact,
                               const int64_t * from, uint64_t * read, double * predicted);

/* ferry_copy_input_async of only each stream's cells from from[s] to its used length (src carries
 * lengths; not a paged window): what a run adds to a window copied ahead (sched-prefetch.c). */
ferry_status ferry_copy_input_since(ferry_backend * queue, const ferry_tensor * src, ferry_tensor * dst,
                                    const int64_t * from, ferry_copy_stats * stats);

/* ---------------------------------------------------------------- merging across gaps (copy-plan.c) */

/* Pieces a merged span may take in, looking ahead from its first: a span pays only once it is past
 * the size curve's knee, so a piece is weighed with those after it, not alone. */
#define FERRY_MERGE_LOOKAHEAD 64

/* The piece-priced cost of rows pieces of size bytes in one batched transfer: piece_ns a piece and
 * its bytes at its size's rate (ferry_copy_piece_seconds). The one price merging goes by. */
double ferry_batched_piece_seconds(const ferry_copy_cost_model * m, size_t size, size_t rows);

/* Extents in an array of any struct with a size_t source offset and size: the first item's two
 * fields, and the bytes from one item to the next (no copy of the array is made). */
typedef struct {
    const size_t * offset;
    const size_t * size;
    size_t stride;
} ferry_merge_extents;

/* The one merge rule (ferry_copy_pieces_merge; a paged gather's merged spans): of the extents
 * i..n-1, in source order, each starting past the end of the one before and rows rows of each, the
 * last j (at most FERRY_MERGE_LOOKAHEAD on) for which one piece from extent i's start through
 * extent j's end saves the most against a piece each, by ferry_batched_piece_seconds; i when none
 * saves. */
size_t ferry_merge_reach(const ferry_copy_cost_model * m, const ferry_merge_extents * ext, size_t i, size_t n,
                         size_t rows);

/* ---------------------------------------------------------------- paged windows */

/* A paged cache's block tables (paged-kv.c keeps them, copy-paged.c reads them as a window is
 * copied): per sequence its block ids, how many, and the cells it holds; the gather method. */
typedef struct {
    int64_t n_seq;
    int32_t ** blocks;
    int64_t * n_blocks;
    int64_t * n_cells;
    ferry_gather_method gather;
} ferry_paged_tables;

/* What a paged window gathers from: one per layer's K or V pool (paged-kv.c). */
struct ferry_paged_source {
    const ferry_tensor * pool;
    bool    v_trans;     /* one row per channel holding every pool cell */
    int64_t block_size;
    int64_t pool_cells;  /* n_blocks * block_size */
    int64_t n_embd;      /* channels: rows of a transposed V */
    size_t  cell_bytes;  /* a cell's bytes; a transposed V: one value's */
    const ferry_paged_tables * tables;
};

/* Each stream's used cells of a window carrying lengths (ferry_tensor_set_used_cells), read now as
 * the ragged policy reads them (copy-ragged.c): min(length, the window's cells); refused (with
 * `what` and the window named) for lengths not in host memory or outside 0..the limit. */
ferry_status ferry_read_used_cells(const ferry_tensor * t, const char * what, int64_t * used);

/* How messages name a window's lengths: "lengths 'NAME'", or "unnamed lengths". */
void ferry_lengths_label(const ferry_tensor * lengths, char * out, size_t size);

/* Each stream's used cells of a paged window (copy-paged.c): its lengths read as
 * ferry_read_used_cells reads them, else its sequence's cells up to the window's; refused (with
 * `what` and the window named) for a length past the cells its sequence holds. */
ferry_status ferry_paged_used_cells(const ferry_tensor * t, const char * what, int64_t * used);

/* The paged route (copy-paged.c): src's used cells gathered into dst (its layout) by the method
 * its cache says, *read the bytes moved (the bytes read), *method the method taken, *predicted
 * its time by the backend's cost model. */
ferry_status ferry_copy_paged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, uint64_t * read,
                              ferry_gather_method * method, double * predicted);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_COPY_IMPL_H */
