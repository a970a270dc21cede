/* ferry/copy.h: copy planning, its cost model, compact staging and the copy path. */
#ifndef FERRY_COPY_H
#define FERRY_COPY_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- copy policies and the ranges rule (copy-path.c) */

/* How the scheduler copies a split input from another backend. */
typedef enum {
    FERRY_COPY_FLAT = 0,   /* the whole nbytes() span, gaps included */
    FERRY_COPY_RANGES = 1, /* a source whose last dimension is evenly spaced dense ranges: those ranges, no gaps */
    FERRY_COPY_PLAN = 2,   /* any view reduced to the fewest 2-D copies (copy-plan.c) */
    FERRY_COPY_RAGGED = 3, /* a window's used cells per stream, exactly (copy-ragged.c); else plan's copies */
    FERRY_COPY_POLICY_COUNT = 4
} ferry_copy_policy;

FERRY_API const char * ferry_copy_policy_name(ferry_copy_policy policy);
FERRY_API ferry_status ferry_copy_policy_from_name(const char * name, ferry_copy_policy * out);

/* count rows of size bytes, row i at offset + i*stride (bytes, relative to a tensor's data). */
typedef struct {
    size_t offset;
    size_t size;
    size_t count;
    size_t stride;
} ferry_copy_2d;

/*
 * The ranges rule, on layout alone: dimensions 0..2 of t are one dense range (every
 * byte of their span read once, dimension 0 innermost) and dimension 3 repeats it at
 * a stride no smaller than the range. False (no error) when the rule does not apply.
 */
FERRY_API bool ferry_copy_ranges_of(const ferry_tensor * t, ferry_copy_2d * out);
/* Bytes the graph reads through t: the distinct bytes its elements cover (blocks whole),
 * from its copy plan, by its layout alone (ferry_copy_stats.bytes_read counts a window's lengths
 * where it carries them); views too tangled to plan count their element bytes. */
FERRY_API uint64_t ferry_tensor_bytes_read(const ferry_tensor * t);

/* ---------------------------------------------------------------- the copy planner (copy-plan.c) */

/*
 * The copy planner: the fewest 2-D copies that move exactly the bytes t
 * reads, each byte once and no other byte, in any layout (block types, permuted or
 * overlapping strides, size-1 and stride-0 dimensions). Offsets are relative to t's
 * own data (add t->view_offs for offsets in the view's source). With copies NULL it
 * only counts: *n_copies gets the number needed. With copies too small for them it
 * fails with FERRY_ERR_OUT_OF_BOUNDS and *n_copies still gets the number needed. A
 * view whose rows overlap or interleave across more than 2^20 rows gives
 * FERRY_ERR_UNSUPPORTED (copy the span instead). An empty view needs no copies.
 */
FERRY_API ferry_status ferry_copy_plan(const ferry_tensor * t, ferry_copy_2d * copies, size_t max_copies, size_t * n_copies);

/* Some of a view's dimensions, by index. */
typedef struct {
    int n;
    int dim[FERRY_MAX_DIMS];
} ferry_dim_list;

/* A fold: the outer dimensions' rows continue the inner ones' even progression. */
typedef struct {
    ferry_dim_list inner;
    ferry_dim_list outer;
} ferry_copy_fold;

/* A dimension the planner keeps: count rows at a byte stride, standing for dims. */
typedef struct {
    size_t count;
    size_t stride;
    ferry_dim_list dims;
} ferry_copy_dim;

/*
 * How the planner reduces a layout, step by step, as ferry_copy_plan does it: the row
 * starts as one element (block) of the type; dimensions of count > 1 and stride 0 add no
 * bytes (broadcast, in dimension order); a dimension whose stride is within the row
 * merges into it (row_dims, in the order merged); two dimensions whose strides make one
 * even progression fold into one (folds, in order). What is left (dims, by stride) either
 * nests, and is then n_copies 2-D copies along dims[dim_2d] (one copy of the row when no
 * dims are left), or tangles (nested false, dim_2d -1, n_copies 0: the planner
 * enumerates those rows as byte intervals). An empty layout (a dimension of 0) is empty,
 * row 0, nested, n_copies 0.
 */
typedef struct {
    bool   empty;
    size_t row;                /* bytes */
    ferry_dim_list row_dims;
    ferry_dim_list broadcast;
    int    n_folds;
    ferry_copy_fold folds[FERRY_MAX_DIMS];
    int    n_dims;
    ferry_copy_dim dims[FERRY_MAX_DIMS];
    bool   nested;
    int    dim_2d;
    size_t n_copies;
} ferry_copy_explanation;

/* The explanation of the layout (n_dims of ne and nb; the rest count 1) that a view of
 * this type would have. Bad input fails as ferry_copy_plan fails; no view is made. */
FERRY_API ferry_status ferry_copy_plan_explain(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb,
                                     ferry_copy_explanation * out);

/* ---------------------------------------------------------------- the cost model (copy-plan.c) */

/*
 * What a copy costs, as a model. Each call (a 2-D copy, or the flat copy) costs call_us.
 * Each row of a 2-D copy costs row_ns, plus its bytes rounded up to whole line_bytes
 * (0: exact), but no more than its stride, at gbps (1e9 B/s) times
 * small_row_efficiency for rows narrower than small_row_bytes. Rows at least
 * wide_pitch_bytes apart cost wide_pitch_row_ns more each (0: no such cost). The flat
 * copy is one call and nbytes at gbps. piece_ns and kernel_gbps cost a paged window's
 * batched copies and gather kernel (below). The figures and how they were found are in
 * copy-plan.c and tools/results.
 */
typedef struct {
    double call_us;
    double row_ns;
    double gbps;
    size_t line_bytes;
    size_t small_row_bytes;
    double small_row_efficiency;
    size_t wide_pitch_bytes;
    double wide_pitch_row_ns;
    /* A paged window's gather (copy-paged.c): each row of a batched copy (one call carrying
     * many pieces) costs piece_ns beyond its bytes; the gather kernel reads pinned host memory
     * at kernel_gbps (0: at gbps), after two calls (its pieces' upload and its launch). */
    double piece_ns;
    double kernel_gbps;
    /* A piece's rate by its size, as DMA engines move them (ferry_copy_piece_seconds): a plain
     * copy, a batched copy's every row and a merged span run at piece_floor_gbps when small, rising
     * to gbps past piece_knee_bytes, the steeper the rise the larger piece_steepness. Rows of a
     * 2-D copy are not pieces (the engine walks the pitch). piece_floor_gbps 0: every piece at gbps. */
    double piece_floor_gbps;
    double piece_knee_bytes;
    double piece_steepness;
    /* How much faster than the cheapest other method a paged window's merged spans must be predicted
     * for the auto gather to take them, as a share (0.05: 5%): the model's own error, as a fit of the
     * link measures it (CopyCostModel.from_link: its piece curve's largest relative residual). 0:
     * ferry's 10%, the tolerance the stand-in's named links are held to. */
    double merge_margin;
} ferry_copy_cost_model;

FERRY_API ferry_copy_cost_model ferry_copy_cost_model_cpu(void); /* measured on a 2-core AMD EPYC (KVM) */
FERRY_API ferry_copy_cost_model ferry_copy_cost_model_gpu(void); /* host to device, H200 over PCIe 5 (docs/design.md) */
/* Estimated seconds of n planned copies, and of one flat copy of span bytes. */
FERRY_API double ferry_copy_plan_cost(const ferry_copy_cost_model * m, const ferry_copy_2d * copies, size_t n);
FERRY_API double ferry_copy_flat_cost(const ferry_copy_cost_model * m, size_t span);
/* Seconds the bytes of one piece of size bytes take by the model's size curve: size times
 * 1/gbps + (1/piece_floor_gbps - 1/gbps) / (1 + (size / piece_knee_bytes)^piece_steepness),
 * its rate rising from piece_floor_gbps to gbps; size / gbps without a floor. 0 for bad input. */
FERRY_API double ferry_copy_piece_seconds(const ferry_copy_cost_model * m, size_t size);
/* Is the plan (of t) cheaper than the flat copy of nbytes(t)? False on a tie or bad input. */
FERRY_API bool   ferry_copy_plan_pays(const ferry_copy_cost_model * m, const ferry_tensor * t, const ferry_copy_2d * copies,
                            size_t n);
/* The model copies into a backend are costed by: the one set for it (ferry_backend_set_copy_cost_model),
 * else its own (a CUDA backend: the GPU's; a stand-in with a modelled link: the link's), else the
 * CPU's. A copy queue's is its backend's. */
FERRY_API ferry_copy_cost_model ferry_backend_copy_cost_model(const ferry_backend * backend);
/* Cost copies into backend, and into its copy queue, by model (figures measured on its link,
 * say) in place of its own; NULL gives it back its own. Refused (INVALID_ARG): a figure negative,
 * not a number or past 1e12, a gbps not positive, a small_row_efficiency outside (0, 1]. */
FERRY_API ferry_status ferry_backend_set_copy_cost_model(ferry_backend * backend, const ferry_copy_cost_model * model);
/* The same checks of a model alone; messages begin with what. */
FERRY_API ferry_status ferry_copy_cost_model_check(const ferry_copy_cost_model * model, const char * what);

/* ---------------------------------------------------------------- ragged windows (copy-ragged.c) */

/*
 * The copies of a window's used cells (ferry_tensor_set_used_cells), as the ragged policy
 * makes them: stream s's cells 0..used[s]-1 and no other byte, offsets relative to t's data.
 * Equal lengths are one plan over every stream (one 2-D copy for a KV window); unequal ones
 * the cheaper, by model, of a copy per stream and one copy of the shortest length over every
 * stream plus each longer stream's tail. The lengths are read now, from host memory. With
 * copies NULL it only counts; too small a copies fails with FERRY_ERR_OUT_OF_BOUNDS, *n_copies
 * the number needed. Refused: t without used lengths, lengths not in host memory (INVALID_ARG)
 * or outside 0..its limit (OUT_OF_BOUNDS), a model without a positive gbps.
 */
FERRY_API ferry_status ferry_copy_ragged_plan(const ferry_tensor * t, const ferry_copy_cost_model * model,
                                              ferry_copy_2d * copies, size_t max_copies, size_t * n_copies);

/* ---------------------------------------------------------------- paged windows (copy-paged.c) */

/*
 * A paged window (ferry_paged_cache_window, ferry/paged.h) has the dense layout of a window
 * over a cell-per-stream cache's compact copy, [head_dim, n_kv, n_head_kv, ns] (V transposed:
 * [n_kv, head_dim, n_head_kv, ns]), but no bytes of its own: stream s's cells lie in the blocks
 * of its sequence's table in the layer's pool. Every copy policy copies it the one way that
 * moves exactly what attention reads: each stream's used cells (its lengths, as a ragged
 * window's, else its sequence's cells), gathered block by block into the dense copy. How is
 * the gather method:
 */
typedef enum {
    FERRY_GATHER_AUTO = 0,      /* a cache's setting: the cheapest the split backend offers, by its cost model
                                 * (merged only when 10% cheaper than the rest: see ferry_copy_paged_plan) */
    FERRY_GATHER_PER_BLOCK = 1, /* one copy per block read (vLLM's swap_blocks): the baseline */
    FERRY_GATHER_RUNS = 2,      /* one copy per run of adjacent blocks; equal runs at even strides as one 2-D copy */
    FERRY_GATHER_BATCHED = 3,   /* every run in one call (cudaMemcpyBatchAsync; the stand-in's gather) */
    FERRY_GATHER_KERNEL = 4,    /* a kernel reading the runs from pinned host memory (CUDA) */
    FERRY_GATHER_MERGED = 5,    /* spans of the pool, unused blocks between runs and all, in one batched call
                                 * into a staging area on the device, the runs then placed from there (the
                                 * stand-in's; CUDA's with batched copies, by its gather kernel); the gaps'
                                 * bytes cross the link but are never read */
    FERRY_GATHER_COUNT = 6
} ferry_gather_method;

FERRY_API const char * ferry_gather_method_name(ferry_gather_method method);
FERRY_API ferry_status ferry_gather_method_from_name(const char * name, ferry_gather_method * out);

/* count rows of size bytes from src_offset of the pool (rows src_stride apart) to dst_offset
 * of the dense window (rows dst_stride apart); count 1: one plain copy. */
typedef struct {
    size_t src_offset;
    size_t dst_offset;
    size_t size;
    size_t count;
    size_t src_stride;
    size_t dst_stride;
} ferry_gather_copy;

/* A paged window's gather as the copy path makes it into a backend. */
typedef struct {
    ferry_gather_method method; /* the method taken (never AUTO) */
    uint64_t blocks;            /* blocks read, a partly used last block included */
    uint64_t runs;              /* runs of blocks adjacent in the pool, in table order */
    uint64_t copies;            /* the method's copies: per block, per run (equal runs at even strides
                                 * as one 2-D copy), the pieces its one call carries, or merged's spans */
    uint64_t calls;             /* transfer calls, as the buffers count them (batched, kernel: 1) */
    uint64_t bytes;             /* bytes moved: exactly the cells read */
    uint64_t crossed_bytes;     /* bytes that cross the link: bytes, plus the gaps' a merged gather carries */
    uint64_t spans;             /* a merged gather's spans of the pool (0 for the other methods) */
    double   seconds;           /* predicted by the backend's cost model */
    double   method_seconds[FERRY_GATHER_COUNT]; /* each method's prediction; -1 where the backend does
                                                  * not offer it; [AUTO]: the one auto takes */
} ferry_paged_plan;

/*
 * The gather of a paged window into backend (the split's), as ferry_copy_input would make it
 * now: the lengths and tables read now, the method the window's cache is set to (AUTO: the
 * cheapest of runs, batched, kernel and merged that the backend offers for the pool's memory, by its
 * cost model, a tie to runs; merged only when predicted more than 10% faster than the cheapest of
 * the others, a gain inside the model's own error left to them), the copies in copies (offsets from the pool tensor's first byte
 * and the dense window's; merged: its spans, dst_offset into the staging area they land in one after
 * another) when copies is not NULL. With copies too small it fails with
 * FERRY_ERR_OUT_OF_BOUNDS and *n_copies gets the number needed. Refused: a window that is not
 * paged; its lengths, as the ragged policy refuses them (not in host memory, outside 0..the
 * limit); a sequence whose table is shorter than its length (OUT_OF_BOUNDS, naming the sequence
 * and the block it lacks); a forced method the backend does not offer for the pool's memory
 * (UNSUPPORTED).
 */
FERRY_API ferry_status ferry_copy_paged_plan(const ferry_tensor * window, ferry_backend * backend,
                                             ferry_paged_plan * plan, ferry_gather_copy * copies, size_t max_copies,
                                             size_t * n_copies);

/* ---------------------------------------------------------------- a plan's pieces (copy-plan.c) */

/*
 * A plan as the pieces of one batch transfer (a transfer engine's list of reads, each a
 * contiguous range): size bytes from src_offset of the source to dst_offset of the destination.
 */
typedef struct {
    size_t src_offset;
    size_t dst_offset;
    size_t size;
} ferry_copy_piece;

/*
 * The pieces of n 2-D copies (a plan, the ranges rule, a ragged plan) into a destination of
 * the source's layout: a piece per row, to the offset it is read from, in the copies' order.
 * With pieces NULL it only counts; too small a pieces fails with FERRY_ERR_OUT_OF_BOUNDS and
 * *n_pieces gets the number needed. Refused (OUT_OF_BOUNDS): a row whose end overflows.
 */
FERRY_API ferry_status ferry_copy_pieces(const ferry_copy_2d * copies, size_t n, ferry_copy_piece * pieces,
                                         size_t max_pieces, size_t * n_pieces);
/* The same of a paged window's gather copies (ferry_copy_paged_plan): from the pool to the dense window. */
FERRY_API ferry_status ferry_gather_pieces(const ferry_gather_copy * copies, size_t n, ferry_copy_piece * pieces,
                                           size_t max_pieces, size_t * n_pieces);
/*
 * Merges pieces in place, by the one rule a paged gather's merged spans follow too: pieces that
 * touch as one; then, among pieces whose gap to the one before is the same in the source and the
 * destination, a piece through the later one (at most 64 on) that saves the most against a piece
 * each, a piece priced piece_ns and its bytes at its size's rate (ferry_copy_piece_seconds: the
 * model's piece curve, or gbps): the gap's bytes then travel with them. Without a curve a gap
 * merges where its bytes cost less than the piece they save. *n_pieces: in, the pieces; out,
 * those left. *gap_bytes (may be NULL): the gap bytes the merged pieces carry beyond the plan's.
 * Refused: a model ferry_copy_cost_model_check refuses.
 */
FERRY_API ferry_status ferry_copy_pieces_merge(const ferry_copy_cost_model * model, ferry_copy_piece * pieces,
                                               size_t * n_pieces, uint64_t * gap_bytes);

/*
 * Places pieces in host memory: each piece's size bytes from src + src_offset to dst + dst_offset
 * (a batch transfer's pieces, from the staging area they landed in to their destination), all in
 * one call. Every piece is checked before any byte moves: refused (OUT_OF_BOUNDS), nothing
 * written, for a piece that ends past src_bytes or dst_bytes; src, dst and pieces may be NULL
 * only when n is 0. src and dst must not overlap.
 */
FERRY_API ferry_status ferry_copy_pieces_place(void * dst, size_t dst_bytes, const void * src, size_t src_bytes,
                                               const ferry_copy_piece * pieces, size_t n);

/* ---------------------------------------------------------------- compact staging (copy-compact.c) */

/*
 * Compact staging: the layout of a copy of t that holds only the bytes t reads, its
 * dimensions in t's stride order with the gaps closed, so the k-th byte read is at
 * offset k. Given when t's plan is one 2-D copy that reads no byte twice (the K window,
 * the transposed V window); otherwise *out has t's own layout (as dup_layout).
 */
FERRY_API ferry_status ferry_tensor_compact_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out);
/* Is dst the compact layout of src (and not simply the same layout)? */
FERRY_API bool         ferry_tensor_is_compact_of(const ferry_tensor * dst, const ferry_tensor * src);

/* ---------------------------------------------------------------- the copy path (copy-path.c) */

/* What one input copy did. */
typedef struct {
    ferry_copy_policy path;  /* what was taken: FLAT when the policy's rule did not apply */
    uint64_t bytes_read;     /* what the graph reads through the input, the same under every policy: a window
                              * carrying lengths in host memory, the cells they cover in each stream; any
                              * other input, the distinct bytes of its elements (ferry_tensor_bytes_read) */
    uint64_t bytes_span;     /* nbytes(): what a flat copy moves */
    uint64_t bytes_copied;   /* what arrived in the destination buffer */
    uint64_t copy_calls;     /* transfer requests made */
    uint64_t impl_calls;     /* operations that carried them out */
    double   copy_seconds;   /* wall time of the copy, synchronize included; a prefetched
                              * input's: the time its copy queue spent on it (its events) */
    double   predicted_seconds; /* what the backend's copy cost model says the copies made take */
    ferry_gather_method gather; /* a paged window's gather method (path: the policy asked for, which
                                 * every policy gathers it by); AUTO for any other input */
} ferry_copy_stats;

/*
 * The ordered copy of one split input: wait for the split backend, copy src into dst
 * (same layout) by policy, wait again. Gap bytes of dst are left untouched. A dst in
 * src's compact layout receives the bytes read, gathered, whatever the policy (path PLAN);
 * under ragged, a src carrying used cells (ferry_tensor_set_used_cells) sends only those, to
 * their own offsets in either layout (path RAGGED; the lengths read now, from host memory).
 * A paged window (ferry/paged.h) is gathered under every policy (ferry_copy_paged_plan).
 * Under every policy, before a byte moves, a src whose lengths the host can read (the ragged
 * policy and a paged window: must read) is refused (OUT_OF_BOUNDS, naming the stream, the length
 * and the bound) for a length outside 0..its limit, or a paged window's past its sequence's cells.
 */
FERRY_API ferry_status ferry_copy_input(ferry_backend * split_backend, ferry_copy_policy policy, const ferry_tensor * src,
                              ferry_tensor * dst, ferry_copy_stats * stats);
/*
 * The same copy queued, not waited for: on `queue` (a backend's copy queue, or any backend)
 * by the same route, the transfers left queued where they can be (a source the backend
 * reads by pointer; the flat copy then is one async set of the span), done at once where
 * they cannot (a copy staged through host memory waits for the queue). src must keep its
 * bytes, and dst be read by no one, until an event recorded after it is reached. stats
 * count what was queued, as ferry_copy_input counts what was done; copy_seconds is 0.
 */
FERRY_API ferry_status ferry_copy_input_async(ferry_backend * queue, ferry_copy_policy policy, const ferry_tensor * src,
                                    ferry_tensor * dst, ferry_copy_stats * stats);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_COPY_H */
