/* ferry/graph.h: graphs, ops and the graph allocator. */
#ifndef FERRY_GRAPH_H
#define FERRY_GRAPH_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- graphs and ops (graph.c; the
 * constructors ops.c; CPU kernels cpu/ops-cpu.c, cpu/ops-attn.c) */

/*
 * Graphs and ops. An op constructor makes a new, unallocated, contiguous tensor in ctx
 * that records the op and its sources; nothing is computed until a backend runs a
 * graph. Shapes that do not fit the op fail with FERRY_ERR_LAYOUT. Float parameters
 * are stored in op_params by their bits.
 */
typedef struct ferry_graph ferry_graph;

FERRY_API const char * ferry_op_name(ferry_op op);

/* Flags: inputs are written before compute, outputs read after; the allocator keeps
 * both alive for the whole graph and never lets another tensor share their memory. */
FERRY_API ferry_status ferry_tensor_set_flags(ferry_tensor * t, int32_t flags);
FERRY_API ferry_status ferry_tensor_set_input(ferry_tensor * t);
FERRY_API ferry_status ferry_tensor_set_output(ferry_tensor * t);

/* a + b, a * b: b is repeated over a (each b->ne[i] divides a->ne[i]); same type. */
FERRY_API ferry_status ferry_add(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out);
FERRY_API ferry_status ferry_mul(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out);
FERRY_API ferry_status ferry_scale(ferry_context * ctx, ferry_tensor * a, float s, ferry_tensor ** out);
/* A contiguous copy of a (any strides), of a's type or converted to type. */
FERRY_API ferry_status ferry_dup(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out);
FERRY_API ferry_status ferry_dup_as(ferry_context * ctx, ferry_tensor * a, ferry_type type, ferry_tensor ** out);
/* a and b joined along dim: same type, same ne in every other dimension. */
FERRY_API ferry_status ferry_concat(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, int dim, ferry_tensor ** out);
/* Zeros appended at the end of each dimension. */
FERRY_API ferry_status ferry_pad(ferry_context * ctx, ferry_tensor * a, int p0, int p1, int p2, int p3, ferry_tensor ** out);
/* The mean over dimension 0: ne[0] becomes 1. */
FERRY_API ferry_status ferry_mean(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out);
/*
 * Decode attention, n_tok query tokens per stream, one sequence per stream.
 *   q      f32 [head_dim, n_head, n_tok, ns], n_tok >= 1 and at most n_kv: the step's new tokens
 *          (a draft to verify, a prefill chunk), whose cells were written to the cache before it
 *   k      [head_dim, n_kv, n_head_kv, ns]: the permuted K window of ferry_kv_cache_window
 *   v      [head_dim, n_kv, n_head_kv, ns], or with v_trans [n_kv, head_dim, n_head_kv, ns]
 *          (the transposed V window). v_trans says which; the shape must agree with it.
 *   kv_len i32 [ns]: cells of each stream that count; cells at or past it are masked out
 *          (never read). A length is clamped to 0..n_kv; 0 gives zero output rows. A k
 *          carrying its lengths (ferry_tensor_set_used_cells) refuses one outside 0..its limit
 *          instead (OUT_OF_BOUNDS, naming the stream), as every copy of it does. The length
 *          counts the new cells: token t reads cells [0, len - n_tok + t] (its own and those
 *          before: causal within the new tokens). A length of 1..n_tok-1 is refused
 *          (OUT_OF_BOUNDS, naming the stream); n_tok = 1 is one-token decode.
 * K and V are of a type ferry_attn_reads_type takes, f32, f16 or q8_0 (q8_0 V not transposed),
 * read only through their ne/nb.
 * Query head h reads kv head h / (n_head / n_head_kv); n_head must be a multiple of
 * n_head_kv. out: f32 [head_dim, n_head, n_tok, ns], contiguous, softmax(scale * q.k) . v.
 * Deterministic: the same bytes in give the same bytes out on a backend, run to run; on the CPU
 * token t's row is byte for byte a one-token step's at length len - n_tok + t + 1. The CUDA
 * backend takes n_tok = 1 only (its supports_op refuses more: the scheduler runs it elsewhere).
 */
FERRY_API ferry_status ferry_attn_decode(ferry_context * ctx, ferry_tensor * q, ferry_tensor * k, ferry_tensor * v,
                               ferry_tensor * kv_len, float scale, bool v_trans, ferry_tensor ** out);
/* Whether ferry_attn_decode reads K and V of this type (f32, f16, q8_0): the one list of them. */
FERRY_API bool ferry_attn_reads_type(ferry_type type);
/*
 * Paged attention: ferry_attn_decode's attention (q, kv_len, scale, types, GQA, n_tok causal,
 * output [head_dim, n_head, n_tok, ns]), reading K and V where a paged cache keeps them, through
 * a block table, so that no dense window is built.
 *   k_pool [n_embd_gqa, n_slots * block_size], n_embd_gqa = head_dim * n_head_kv: a pool in the
 *          layout of ferry_paged_cache_k (ferry/paged.h); cell c of slot b is pool cell
 *          b * block_size + c
 *   v_pool the same (any type attention reads), or with v_trans [n_slots * block_size, n_embd_gqa]
 *          (one row per channel, as ferry_paged_cache_v lays a transposed V out; not q8_0)
 *   table  i32 [max_blocks, ns]: stream s's i-th block's slot, holding its cells
 *          i * block_size .. (i + 1) * block_size - 1. Entries past what a stream's length reaches
 *          are never read (-1 is fine there); an entry that is read and is outside 0..n_slots - 1
 *          is refused at compute (OUT_OF_BOUNDS, naming the stream and the entry), before any
 *          output is written.
 *   kv_len i32 [ns]: as ferry_attn_decode's, n_kv being max_blocks * block_size.
 * On the CPU the output is byte for byte ferry_attn_decode's over the dense window a paged
 * cache's gather builds from the same pools and table.
 */
FERRY_API ferry_status ferry_attn_paged(ferry_context * ctx, ferry_tensor * q, ferry_tensor * k_pool,
                                        ferry_tensor * v_pool, ferry_tensor * table, ferry_tensor * kv_len,
                                        int64_t block_size, float scale, bool v_trans, ferry_tensor ** out);

/* A graph references tensors, it does not own them. build adds t and everything it
 * depends on, in topological order: leafs (op NONE) and nodes (the rest, views too).
 * Building again adds more outputs; tensors already there are not added twice. */
FERRY_API ferry_status ferry_graph_new(ferry_graph ** out);
FERRY_API void         ferry_graph_free(ferry_graph * graph);
FERRY_API ferry_status ferry_graph_build(ferry_graph * graph, ferry_tensor * t);
FERRY_API void         ferry_graph_clear(ferry_graph * graph);
FERRY_API int          ferry_graph_n_nodes(const ferry_graph * graph);
FERRY_API int          ferry_graph_n_leafs(const ferry_graph * graph);
/* NULL when i is out of range. */
FERRY_API ferry_tensor * ferry_graph_node(const ferry_graph * graph, int i);
FERRY_API ferry_tensor * ferry_graph_leaf(const ferry_graph * graph, int i);

/* Compute the nodes in order on backend. Every leaf and node must be allocated in
 * memory the backend can use, and every node an op it supports. */
FERRY_API ferry_status ferry_backend_graph_compute(ferry_backend * backend, ferry_graph * graph);


/* ---------------------------------------------------------------- graph allocator (alloc.c, alloc-blocks.c) */

/*
 * The graph allocator places a graph's tensors in buffers of one or several buffer
 * types, as ggml's gallocr does. reserve measures a graph and makes the buffers big
 * enough; alloc_graph measures again (cheap, and identical for the same graph), grows
 * the buffers if the graph needs more, and places every tensor.
 *
 * - Tensors that already have memory (placed by someone else) are left alone; views
 *   take their source's memory.
 * - Inputs (leafs and tensors flagged input) are placed before anything runs: write
 *   their data after alloc_graph, before each compute. Like every other tensor, an
 *   input is freed once its last consumer (through any view) has run, and its memory
 *   may then hold later results; keep_inputs (below) keeps them to the end instead.
 * - Outputs, and results nobody reads (a node, or a view and so its source), live to
 *   the end of the graph.
 * - add, mul and scale take the memory of the first source they may (in place): one the
 *   allocator placed, not an output or kept input, of the same layout and buffer type
 *   (a view of it only from its first byte), whose last use this is.
 * - Free blocks are reused best fit and merged with free neighbours; space within what
 *   a chunk already needs is preferred over growing one. The graph is walked two ways
 *   (the first or the last of equally good blocks; in place through views or not) and
 *   the way that needs less memory is kept.
 * - Each buffer type's memory is a list of chunks (buffers) of at most its max size,
 *   FERRY_GALLOC_MAX_CHUNKS at most (FERRY_ERR_OUT_OF_MEMORY past that). A tensor
 *   larger than the max size gets a chunk of its own, allocated through the buffer
 *   type's allocator directly: whether that succeeds is the backend's decision.
 */
enum { FERRY_GALLOC_MAX_CHUNKS = 16 };

typedef struct ferry_gallocr ferry_gallocr;

FERRY_API ferry_status ferry_gallocr_new(ferry_buffer_type * buft, ferry_gallocr ** out);
FERRY_API ferry_status ferry_gallocr_new_n(ferry_buffer_type ** bufts, int n_bufts, ferry_gallocr ** out);
/* Frees the allocator's buffers too: tensors it placed become unallocated. */
FERRY_API void         ferry_gallocr_free(ferry_gallocr * galloc);
/* node_buft_ids[i] / leaf_buft_ids[i]: the index of the buffer type for node / leaf i
 * (NULL: all 0). With several buffer types, alloc_graph reuses the last assignment,
 * so reserve first with it (a graph of other counts is refused). */
FERRY_API ferry_status ferry_gallocr_reserve(ferry_gallocr * galloc, ferry_graph * graph,
                                   const int * node_buft_ids, const int * leaf_buft_ids);
FERRY_API ferry_status ferry_gallocr_alloc_graph(ferry_gallocr * galloc, ferry_graph * graph);

/* keep_inputs: leafs and inputs live to the end of the graph and are never shared, for
 * whoever reads them after compute (off by default: they are freed after their last
 * use). It takes effect at the next reserve or alloc_graph. The scheduler has its own
 * (ferry_sched_set_keep_inputs, sched.h). */
FERRY_API ferry_status ferry_gallocr_set_keep_inputs(ferry_gallocr * galloc, bool keep);
FERRY_API bool         ferry_gallocr_get_keep_inputs(const ferry_gallocr * galloc);

/* What it holds: bytes over all chunks of a buffer type, chunks, a chunk's buffer. */
FERRY_API size_t       ferry_gallocr_buffer_size(const ferry_gallocr * galloc, int buft_id);
FERRY_API int          ferry_gallocr_n_chunks(const ferry_gallocr * galloc, int buft_id);
FERRY_API ferry_buffer * ferry_gallocr_chunk_buffer(const ferry_gallocr * galloc, int buft_id, int chunk);
/* Where the last measured graph put t (NOT_ALLOCATED for views and tensors it left alone);
 * size is what t took, the alloc size rounded up to the alignment. */
FERRY_API ferry_status ferry_gallocr_tensor_placement(const ferry_gallocr * galloc, const ferry_tensor * t,
                                            int * buft_id, int * chunk, size_t * offset, size_t * size);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_GRAPH_H */
