/*
 * ferry: a ggml-like backend layer (tensors, buffer types, buffers, backends) and a
 * scheduler that copies each split's inputs to the backend running the split.
 *
 * This header is the whole public ABI. The Python binding's cdef is this file run
 * through the preprocessor with FERRY_CDEF defined, so it must stay plain C that
 * cffi can read: no inline functions, no function-like macros below the guard.
 *
 * Conventions are ggml's: ne[0] is the fastest dimension, nb[i] is the byte stride of
 * dimension i, nb[0] the element (or block) size.
 *
 * Errors: every function that can fail returns a ferry_status; on failure a message
 * is left for ferry_last_error() (per thread). No public function aborts on bad input.
 */
#ifndef FERRY_H
#define FERRY_H

#ifndef FERRY_CDEF
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Limits as enum constants, not macros, so the binding's cdef keeps their names. */
enum {
    FERRY_MAX_DIMS = 4,
    FERRY_MAX_SRC = 4,
    FERRY_MAX_OP_PARAMS = 8,
    FERRY_MAX_NAME = 64
};

/* ---------------------------------------------------------------- errors */

typedef enum {
    FERRY_OK = 0,
    FERRY_ERR_INVALID_ARG = 1,   /* a NULL pointer, a negative or zero size where one is needed */
    FERRY_ERR_OUT_OF_BOUNDS = 2, /* an offset or extent past the end of a tensor or buffer */
    FERRY_ERR_NOT_ALLOCATED = 3, /* a tensor with no memory behind it */
    FERRY_ERR_LAYOUT = 4,        /* shapes or strides that do not match what is asked */
    FERRY_ERR_UNKNOWN_TYPE = 5,
    FERRY_ERR_FREED = 6,         /* a buffer that was freed */
    FERRY_ERR_OUT_OF_MEMORY = 7,
    FERRY_ERR_UNSUPPORTED = 8,   /* the backend or buffer cannot do this */
    FERRY_ERR_BACKEND = 9,       /* the backend's own failure (a CUDA error, ...) */
    FERRY_STATUS_COUNT = 10
} ferry_status;

/* The message of the last failure on this thread ("" if none). */
const char * ferry_last_error(void);
ferry_status ferry_last_status(void);
void         ferry_clear_error(void);
const char * ferry_status_name(ferry_status status);

/* ---------------------------------------------------------------- types */

typedef enum {
    FERRY_TYPE_F32 = 0,
    FERRY_TYPE_F16 = 1,
    FERRY_TYPE_BF16 = 2,
    FERRY_TYPE_I32 = 3,
    FERRY_TYPE_Q8_0 = 4, /* 32 values in 34 bytes: an f16 scale and 32 int8 */
    FERRY_TYPE_Q4_0 = 5, /* 32 values in 18 bytes: an f16 scale and 16 bytes of nibbles */
    FERRY_TYPE_COUNT = 6
} ferry_type;

/* Unknown types give NULL / 0 and leave an error. */
const char * ferry_type_name(ferry_type type);
ferry_status ferry_type_from_name(const char * name, ferry_type * out);
size_t       ferry_type_size(ferry_type type);  /* bytes per block */
int64_t      ferry_blck_size(ferry_type type);  /* values per block */
/* Bytes taken by a row of ne values; ne must be a multiple of the block size. */
ferry_status ferry_row_size(ferry_type type, int64_t ne, size_t * out);

/* ---------------------------------------------------------------- tensors */

typedef struct ferry_context     ferry_context;
typedef struct ferry_buffer_type ferry_buffer_type;
typedef struct ferry_buffer      ferry_buffer;
typedef struct ferry_backend     ferry_backend;

typedef enum {
    FERRY_OP_NONE = 0,   /* a leaf: data of its own */
    FERRY_OP_VIEW = 1,   /* views share their source's memory */
    FERRY_OP_RESHAPE = 2,
    FERRY_OP_PERMUTE = 3,
    FERRY_OP_TRANSPOSE = 4,
    FERRY_OP_ADD = 5,
    FERRY_OP_MUL = 6,
    FERRY_OP_SCALE = 7,
    FERRY_OP_DUP = 8,
    FERRY_OP_CONCAT = 9,
    FERRY_OP_PAD = 10,
    FERRY_OP_MEAN = 11,
    FERRY_OP_ATTN_DECODE = 12,
    FERRY_OP_COUNT = 13
} ferry_op;

enum {
    FERRY_TENSOR_FLAG_INPUT = 1,
    FERRY_TENSOR_FLAG_OUTPUT = 2
};

/*
 * A tensor: type, shape, byte strides, and where its bytes live. The struct is
 * public so that readers (and the binding) see ne/nb directly; change it only
 * through the functions below.
 */
typedef struct ferry_tensor {
    ferry_type type;
    int64_t ne[FERRY_MAX_DIMS];
    size_t  nb[FERRY_MAX_DIMS];

    ferry_op op;
    int32_t  op_params[FERRY_MAX_OP_PARAMS];
    int32_t  flags;
    struct ferry_tensor * src[FERRY_MAX_SRC];

    /* Views: the tensor whose memory this one reads (never itself a view) and the
     * byte offset into it. data and buffer follow view_src once it is allocated. */
    struct ferry_tensor * view_src;
    size_t view_offs;

    void * data;
    ferry_buffer * buffer;
    uint64_t buffer_id; /* the buffer's serial, so a freed buffer is recognised */

    char name[FERRY_MAX_NAME];
} ferry_tensor;

/* A context owns tensor structs (not their data); freeing it frees them all. */
ferry_status ferry_context_new(ferry_context ** out);
void         ferry_context_free(ferry_context * ctx);
size_t       ferry_context_n_tensors(const ferry_context * ctx);

/* A new tensor with contiguous strides; ne[i] for i >= n_dims are 1. */
ferry_status ferry_tensor_new(ferry_context * ctx, ferry_type type, int n_dims,
                              const int64_t * ne, ferry_tensor ** out);
/* A tensor with the same type, ne and nb as t, unallocated (the scheduler's input copy). */
ferry_status ferry_tensor_dup_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out);
/* A view of src: n_dims shapes, explicit byte strides nb[1..n_dims-1] (nb[0] is the
 * type's), at a byte offset from src's first byte. It must stay inside src's own span. */
ferry_status ferry_tensor_view(ferry_context * ctx, ferry_tensor * src, int n_dims,
                               const int64_t * ne, const size_t * nb, size_t offset,
                               ferry_tensor ** out);
/* ggml's permute: dimension i of t becomes dimension axis[i] of the result. */
ferry_status ferry_tensor_permute(ferry_context * ctx, ferry_tensor * t,
                                  int axis0, int axis1, int axis2, int axis3, ferry_tensor ** out);
ferry_status ferry_tensor_transpose(ferry_context * ctx, ferry_tensor * t, ferry_tensor ** out);
/* t must be contiguous; the element count must not change. */
ferry_status ferry_tensor_reshape(ferry_context * ctx, ferry_tensor * t, int n_dims,
                                  const int64_t * ne, ferry_tensor ** out);
ferry_status ferry_tensor_set_name(ferry_tensor * t, const char * name);

int64_t ferry_tensor_nelements(const ferry_tensor * t);
int64_t ferry_tensor_nrows(const ferry_tensor * t);
/* ggml's rule: the span from the first byte to the last, whole blocks included. */
size_t  ferry_tensor_nbytes(const ferry_tensor * t);
bool    ferry_tensor_is_contiguous(const ferry_tensor * t);
bool    ferry_tensor_same_layout(const ferry_tensor * a, const ferry_tensor * b);
bool    ferry_tensor_is_view(const ferry_tensor * t);
/* OK if t has memory behind it in a live buffer (views: their source). */
ferry_status ferry_tensor_check_allocated(const ferry_tensor * t);

/* ---------------------------------------------------------------- transfers and their counts */

typedef enum {
    FERRY_XFER_SET = 0,
    FERRY_XFER_GET = 1,
    FERRY_XFER_SET_2D = 2,
    FERRY_XFER_GET_2D = 3,
    FERRY_XFER_COPY = 4,
    FERRY_XFER_MEMSET = 5,
    FERRY_XFER_COUNT = 6
} ferry_xfer;

/*
 * What a buffer or backend moved. calls and bytes count requests as made through the
 * public API (a 2-D set of n copies of s bytes is one call of n*s bytes); impl_calls
 * counts the operations that carried them out (the same 2-D set done by a backend
 * without a 2-D implementation is n plain sets).
 */
typedef struct {
    uint64_t calls[FERRY_XFER_COUNT];
    uint64_t bytes[FERRY_XFER_COUNT];
    uint64_t impl_calls[FERRY_XFER_COUNT];
} ferry_stats;

const char * ferry_xfer_name(ferry_xfer kind);

/* ---------------------------------------------------------------- buffer types and buffers */

typedef enum {
    FERRY_BUFFER_USAGE_ANY = 0,
    FERRY_BUFFER_USAGE_WEIGHTS = 1,
    FERRY_BUFFER_USAGE_COMPUTE = 2
} ferry_buffer_usage;

const char * ferry_buffer_type_name(const ferry_buffer_type * buft);
ferry_status ferry_buffer_type_alloc_buffer(ferry_buffer_type * buft, size_t size, ferry_buffer ** out);
size_t       ferry_buffer_type_alignment(const ferry_buffer_type * buft);
size_t       ferry_buffer_type_max_size(const ferry_buffer_type * buft);
bool         ferry_buffer_type_is_host(const ferry_buffer_type * buft);
/* Bytes a tensor takes in a buffer of this type (nbytes unless the type pads). */
size_t       ferry_buffer_type_alloc_size(const ferry_buffer_type * buft, const ferry_tensor * t);

/* Frees the buffer; tensors placed in it become unallocated for every later call. */
void         ferry_buffer_free(ferry_buffer * buf);
void *       ferry_buffer_base(const ferry_buffer * buf);
size_t       ferry_buffer_size(const ferry_buffer * buf);
ferry_buffer_type * ferry_buffer_get_type(const ferry_buffer * buf);
bool         ferry_buffer_is_host(const ferry_buffer * buf);
ferry_status ferry_buffer_set_usage(ferry_buffer * buf, ferry_buffer_usage usage);
ferry_buffer_usage ferry_buffer_get_usage(const ferry_buffer * buf);
uint64_t     ferry_buffer_id(const ferry_buffer * buf);
bool         ferry_buffer_id_is_live(uint64_t id);
ferry_status ferry_buffer_clear(ferry_buffer * buf, uint8_t value);
/* Place t (not a view) at a byte offset in buf, aligned to the buffer type's alignment. */
ferry_status ferry_buffer_place_tensor(ferry_buffer * buf, ferry_tensor * t, size_t offset);
ferry_status ferry_buffer_get_stats(const ferry_buffer * buf, ferry_stats * out);
void         ferry_buffer_reset_stats(ferry_buffer * buf);

/* Blocking transfers between host memory and a tensor, offsets relative to the tensor. */
ferry_status ferry_tensor_set(ferry_tensor * t, const void * data, size_t offset, size_t size);
ferry_status ferry_tensor_get(const ferry_tensor * t, void * data, size_t offset, size_t size);
ferry_status ferry_tensor_memset(ferry_tensor * t, uint8_t value, size_t offset, size_t size);
/* n_copies rows of size bytes: row i goes to offset + i*stride_tensor in the tensor and
 * comes from data + i*stride_data (the reverse for get). */
ferry_status ferry_tensor_set_2d(ferry_tensor * t, const void * data, size_t offset, size_t size,
                                 size_t n_copies, size_t stride_tensor, size_t stride_data);
ferry_status ferry_tensor_get_2d(const ferry_tensor * t, void * data, size_t offset, size_t size,
                                 size_t n_copies, size_t stride_tensor, size_t stride_data);
/* The flat copy of nbytes() between tensors of the same layout. */
ferry_status ferry_tensor_copy(const ferry_tensor * src, ferry_tensor * dst);

/* ---------------------------------------------------------------- backends */

void         ferry_backend_free(ferry_backend * backend);
const char * ferry_backend_name(const ferry_backend * backend);
ferry_buffer_type * ferry_backend_default_buffer_type(ferry_backend * backend);
bool         ferry_backend_supports_buft(ferry_backend * backend, ferry_buffer_type * buft);
bool         ferry_backend_supports_op(ferry_backend * backend, const ferry_tensor * op);
/* Does the backend implement 2-D transfers itself (else they are loops of plain ones)? */
bool         ferry_backend_has_2d(const ferry_backend * backend);
ferry_status ferry_backend_alloc_buffer(ferry_backend * backend, size_t size, ferry_buffer ** out);

ferry_status ferry_backend_tensor_set_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                            size_t offset, size_t size);
ferry_status ferry_backend_tensor_get_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                            size_t offset, size_t size);
ferry_status ferry_backend_tensor_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                               size_t offset, size_t size, size_t n_copies,
                                               size_t stride_tensor, size_t stride_data);
ferry_status ferry_backend_tensor_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                               size_t offset, size_t size, size_t n_copies,
                                               size_t stride_tensor, size_t stride_data);
/* Copy src into dst (same layout) on dst's backend; falls back to a blocking copy. */
ferry_status ferry_backend_tensor_copy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                             const ferry_tensor * src, ferry_tensor * dst);
ferry_status ferry_backend_synchronize(ferry_backend * backend);
ferry_status ferry_backend_get_stats(const ferry_backend * backend, ferry_stats * out);
void         ferry_backend_reset_stats(ferry_backend * backend);

/* The CPU backend and its host buffer type (shared by every CPU backend). */
ferry_status ferry_cpu_backend_new(ferry_backend ** out);
ferry_buffer_type * ferry_cpu_buffer_type(void);

/*
 * The dummy backend, for allocator tests and dry runs. Its buffers are not host memory
 * as far as other backends know. By default they hand out synthetic addresses with no
 * memory behind them: transfers are checked and counted, not performed, and compute
 * does nothing. With real_memory they are backed by memory a test can read, and ops
 * run on the CPU implementations. has_2d off makes 2-D transfers take the generic loop.
 */
typedef struct {
    size_t alignment;       /* a power of two; 0 means 64 */
    size_t max_buffer_size; /* 0 means unbounded */
    bool   real_memory;
    bool   has_2d;
    /* Claim to be host memory (a KV cache at full model scale in a dry run). With
     * synthetic addresses never let a CPU op read it: there is nothing behind it. */
    bool   is_host;
} ferry_dummy_params;

ferry_dummy_params ferry_dummy_default_params(void);
ferry_status ferry_dummy_backend_new(const ferry_dummy_params * params, ferry_backend ** out);
/*
 * The stand-in device, for machines without a GPU: a CPU backend ("CPU (stand-in
 * device)") whose buffers are host memory that no other backend may use (is_host is
 * false), and which uses no memory but its own. A split on it receives its inputs by
 * copy, exactly as a GPU split would, and runs the CPU kernels.
 */
ferry_status ferry_standin_backend_new(ferry_backend ** out);

/* ---------------------------------------------------------------- graphs and ops (graph.c, ops.c, ops-cpu.c) */

/* (graph section) */

/*
 * Graphs and ops. An op constructor makes a new, unallocated, contiguous tensor in ctx
 * that records the op and its sources; nothing is computed until a backend runs a
 * graph. Shapes that do not fit the op fail with FERRY_ERR_LAYOUT. Float parameters
 * are stored in op_params by their bits.
 */
typedef struct ferry_graph ferry_graph;

const char * ferry_op_name(ferry_op op);

/* Flags: inputs are written before compute, outputs read after; the allocator keeps
 * both alive for the whole graph and never lets another tensor share their memory. */
ferry_status ferry_tensor_set_flags(ferry_tensor * t, int32_t flags);
ferry_status ferry_tensor_set_input(ferry_tensor * t);
ferry_status ferry_tensor_set_output(ferry_tensor * t);

/* a + b, a * b: b is repeated over a (each b->ne[i] divides a->ne[i]); same type. */
ferry_status ferry_add(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out);
ferry_status ferry_mul(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out);
ferry_status ferry_scale(ferry_context * ctx, ferry_tensor * a, float s, ferry_tensor ** out);
/* A contiguous copy of a (any strides), of a's type or converted to type. */
ferry_status ferry_dup(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out);
ferry_status ferry_dup_as(ferry_context * ctx, ferry_tensor * a, ferry_type type, ferry_tensor ** out);
/* a and b joined along dim: same type, same ne in every other dimension. */
ferry_status ferry_concat(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, int dim, ferry_tensor ** out);
/* Zeros appended at the end of each dimension. */
ferry_status ferry_pad(ferry_context * ctx, ferry_tensor * a, int p0, int p1, int p2, int p3, ferry_tensor ** out);
/* The mean over dimension 0: ne[0] becomes 1. */
ferry_status ferry_mean(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out);
/*
 * Decode attention, one query token per stream, one sequence per stream.
 *   q      f32 [head_dim, n_head, 1, ns]
 *   k      [head_dim, n_kv, n_head_kv, ns]: the permuted K window of ferry_kv_cache_window
 *   v      [head_dim, n_kv, n_head_kv, ns], or with v_trans [n_kv, head_dim, n_head_kv, ns]
 *          (the transposed V window). v_trans says which; the shape must agree with it.
 *   kv_len i32 [ns]: cells of each stream that count; cells at or past it are masked out
 *          (never read). A length is clamped to 0..n_kv; 0 gives a zero output row.
 * K and V are f32, f16 or q8_0 (q8_0 V not transposed), read only through their ne/nb.
 * Query head h reads kv head h / (n_head / n_head_kv); n_head must be a multiple of
 * n_head_kv. out: f32 [head_dim, n_head, 1, ns], contiguous, softmax(scale * q.k) . v.
 * Deterministic: the same bytes in give the same bytes out on a backend, run to run.
 */
ferry_status ferry_attn_decode(ferry_context * ctx, ferry_tensor * q, ferry_tensor * k, ferry_tensor * v,
                               ferry_tensor * kv_len, float scale, bool v_trans, ferry_tensor ** out);

/* A graph references tensors, it does not own them. build adds t and everything it
 * depends on, in topological order: leafs (op NONE) and nodes (the rest, views too).
 * Building again adds more outputs; tensors already there are not added twice. */
ferry_status ferry_graph_new(ferry_graph ** out);
void         ferry_graph_free(ferry_graph * graph);
ferry_status ferry_graph_build(ferry_graph * graph, ferry_tensor * t);
void         ferry_graph_clear(ferry_graph * graph);
int          ferry_graph_n_nodes(const ferry_graph * graph);
int          ferry_graph_n_leafs(const ferry_graph * graph);
/* NULL when i is out of range. */
ferry_tensor * ferry_graph_node(const ferry_graph * graph, int i);
ferry_tensor * ferry_graph_leaf(const ferry_graph * graph, int i);

/* Compute the nodes in order on backend. Every leaf and node must be allocated in
 * memory the backend can use, and every node an op it supports. */
ferry_status ferry_backend_graph_compute(ferry_backend * backend, ferry_graph * graph);


/* ---------------------------------------------------------------- graph allocator (alloc.c) */

/* (allocator section) */

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

ferry_status ferry_gallocr_new(ferry_buffer_type * buft, ferry_gallocr ** out);
ferry_status ferry_gallocr_new_n(ferry_buffer_type ** bufts, int n_bufts, ferry_gallocr ** out);
/* Frees the allocator's buffers too: tensors it placed become unallocated. */
void         ferry_gallocr_free(ferry_gallocr * galloc);
/* node_buft_ids[i] / leaf_buft_ids[i]: the index of the buffer type for node / leaf i
 * (NULL: all 0). With several buffer types, alloc_graph reuses the last assignment,
 * so reserve first with it (a graph of other counts is refused). */
ferry_status ferry_gallocr_reserve(ferry_gallocr * galloc, ferry_graph * graph,
                                   const int * node_buft_ids, const int * leaf_buft_ids);
ferry_status ferry_gallocr_alloc_graph(ferry_gallocr * galloc, ferry_graph * graph);

/* keep_inputs: leafs and inputs live to the end of the graph and are never shared, for
 * whoever reads them after compute (off by default: they are freed after their last
 * use). The allocator's takes effect at its next reserve or alloc_graph; the
 * scheduler's, for its input copies and the leafs it places, at its next alloc. (The
 * scheduler places each input copy just before the first node that reads it, in memory
 * the nodes before may have freed.) */
ferry_status ferry_gallocr_set_keep_inputs(ferry_gallocr * galloc, bool keep);
bool         ferry_gallocr_get_keep_inputs(const ferry_gallocr * galloc);
struct ferry_sched; /* the scheduler's (ferry_sched, below) */
ferry_status ferry_sched_set_keep_inputs(struct ferry_sched * sched, bool keep);
bool         ferry_sched_get_keep_inputs(const struct ferry_sched * sched);

/* What it holds: bytes over all chunks of a buffer type, chunks, a chunk's buffer. */
size_t       ferry_gallocr_buffer_size(const ferry_gallocr * galloc, int buft_id);
int          ferry_gallocr_n_chunks(const ferry_gallocr * galloc, int buft_id);
ferry_buffer * ferry_gallocr_chunk_buffer(const ferry_gallocr * galloc, int buft_id, int chunk);
/* Where the last measured graph put t (NOT_ALLOCATED for views and tensors it left alone);
 * size is what t took, the alloc size rounded up to the alignment. */
ferry_status ferry_gallocr_tensor_placement(const ferry_gallocr * galloc, const ferry_tensor * t,
                                            int * buft_id, int * chunk, size_t * offset, size_t * size);


/* ---------------------------------------------------------------- KV cache windows (kv-cache.c) */

/* (kv cache section) */

/*
 * A KV cache laid out as llama.cpp lays it out. Per layer, K is [n_embd_gqa, kv_size,
 * n_stream] and V the same, or [kv_size, n_embd_gqa, n_stream] when v_trans (flash
 * attention off). A unified cache is one stream of n_ctx cells; otherwise each of
 * n_stream streams holds n_ctx / n_stream cells.
 */
typedef struct {
    ferry_type type_k;
    ferry_type type_v;
    int64_t head_dim;
    int64_t n_head_kv;
    int64_t n_ctx;    /* cells in all streams together */
    int64_t n_stream; /* 1: unified */
    int32_t n_layer;
    bool    v_trans;  /* V stored transposed; needs an unblocked V type */
} ferry_kv_params;

typedef struct ferry_kv_cache ferry_kv_cache;

/* Lay out the cache and, when buft is given, allocate one buffer of it for all layers. */
ferry_status ferry_kv_cache_new(const ferry_kv_params * params, ferry_buffer_type * buft, ferry_kv_cache ** out);
void         ferry_kv_cache_free(ferry_kv_cache * kv);
ferry_status ferry_kv_cache_params(const ferry_kv_cache * kv, ferry_kv_params * out);
int64_t      ferry_kv_cache_kv_size(const ferry_kv_cache * kv); /* cells per stream */
ferry_buffer * ferry_kv_cache_buffer(const ferry_kv_cache * kv);  /* NULL if not allocated */
ferry_status ferry_kv_cache_k(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
ferry_status ferry_kv_cache_v(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
/*
 * The windows attention reads: the first n_kv cells of streams s0..s1, created in ctx
 * and permuted (0, 2, 1, 3) as attention hands them on, so rows are on dimension 1 and
 * streams on dimension 3. K: [head_dim, n_kv, n_head_kv, ns]; V likewise, or
 * [n_kv, head_dim, n_head_kv, ns] when transposed.
 */
ferry_status ferry_kv_cache_window(const ferry_kv_cache * kv, ferry_context * ctx, int32_t layer, int64_t n_kv,
                                   int64_t s0, int64_t s1, ferry_tensor ** k_out, ferry_tensor ** v_out);


/* ---------------------------------------------------------------- copy planning and the scheduler (copy-plan.c, sched.c) */

/* (scheduler section) */

/* How the scheduler copies a split input from another backend. */
typedef enum {
    FERRY_COPY_FLAT = 0,   /* the whole nbytes() span, gaps included */
    FERRY_COPY_RANGES = 1, /* a host source whose last dimension is evenly spaced dense ranges: one 2-D set */
    FERRY_COPY_PLAN = 2,   /* any view reduced to the fewest 2-D copies (copy-plan.c) */
    FERRY_COPY_POLICY_COUNT = 3
} ferry_copy_policy;

const char * ferry_copy_policy_name(ferry_copy_policy policy);
ferry_status ferry_copy_policy_from_name(const char * name, ferry_copy_policy * out);

/* count rows of size bytes, row i at offset + i*stride (bytes, relative to a tensor's data). */
typedef struct {
    size_t offset;
    size_t size;
    size_t count;
    size_t stride;
} ferry_copy_2d;

/*
 * The seed's rule, on layout alone: dimensions 0..2 of t are one dense range (every
 * byte of their span read once, dimension 0 innermost) and dimension 3 repeats it at
 * a stride no smaller than the range. False (no error) when the rule does not apply.
 */
bool ferry_copy_ranges_of(const ferry_tensor * t, ferry_copy_2d * out);
/* Bytes the graph reads through t: the distinct bytes its elements cover (blocks whole),
 * from its copy plan; views too tangled to plan count their element bytes. */
uint64_t ferry_tensor_bytes_read(const ferry_tensor * t);

/*
 * The copy planner (copy-plan.c): the fewest 2-D copies that move exactly the bytes t
 * reads, each byte once and no other byte, in any layout (block types, permuted or
 * overlapping strides, size-1 and stride-0 dimensions). Offsets are relative to t's
 * own data (add t->view_offs for offsets in the view's source). With copies NULL it
 * only counts: *n_copies gets the number needed. With copies too small for them it
 * fails with FERRY_ERR_OUT_OF_BOUNDS and *n_copies still gets the number needed. A
 * view whose rows overlap or interleave across more than 2^20 rows gives
 * FERRY_ERR_UNSUPPORTED (copy the span instead). An empty view needs no copies.
 */
ferry_status ferry_copy_plan(const ferry_tensor * t, ferry_copy_2d * copies, size_t max_copies, size_t * n_copies);

/*
 * What a copy costs, as a model. Each call (a 2-D copy, or the flat copy) costs call_us.
 * Each row of a 2-D copy costs row_ns, plus its bytes rounded up to whole line_bytes
 * (0: exact), but no more than its stride, at gbps (1e9 B/s) times
 * small_row_efficiency for rows narrower than small_row_bytes. Rows at least
 * wide_pitch_bytes apart cost wide_pitch_row_ns more each (0: no such cost). The flat
 * copy is one call and nbytes at gbps. The figures and how they were found are in
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
} ferry_copy_cost_model;

ferry_copy_cost_model ferry_copy_cost_model_cpu(void); /* measured on a 2-core AMD EPYC (KVM) */
ferry_copy_cost_model ferry_copy_cost_model_gpu(void); /* host to device, from docs/design.md's H200 anchors */
/* Estimated seconds of n planned copies, and of one flat copy of span bytes. */
double ferry_copy_plan_cost(const ferry_copy_cost_model * m, const ferry_copy_2d * copies, size_t n);
double ferry_copy_flat_cost(const ferry_copy_cost_model * m, size_t span);
/* Is the plan (of t) cheaper than the flat copy of nbytes(t)? False on a tie or bad input. */
bool   ferry_copy_plan_pays(const ferry_copy_cost_model * m, const ferry_tensor * t, const ferry_copy_2d * copies,
                            size_t n);
/* The model a backend gives for copies into it (a GPU's from docs/design.md's anchors), else the CPU's. */
ferry_copy_cost_model ferry_backend_copy_cost_model(const ferry_backend * backend);

/*
 * Compact staging: the layout of a copy of t that holds only the bytes t reads, its
 * dimensions in t's stride order with the gaps closed, so the k-th byte read is at
 * offset k. Given when t's plan is one 2-D copy that reads no byte twice (the K window,
 * the transposed V window); otherwise *out has t's own layout (as dup_layout).
 */
ferry_status ferry_tensor_compact_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out);
/* Is dst the compact layout of src (and not simply the same layout)? */
bool         ferry_tensor_is_compact_of(const ferry_tensor * dst, const ferry_tensor * src);

/* What one input copy did. */
typedef struct {
    ferry_copy_policy path;  /* what was taken: FLAT when the policy's rule did not apply */
    uint64_t bytes_read;     /* what the graph reads through the input */
    uint64_t bytes_span;     /* nbytes(): what a flat copy moves */
    uint64_t bytes_copied;   /* what arrived in the destination buffer */
    uint64_t copy_calls;     /* transfer requests made */
    uint64_t impl_calls;     /* operations that carried them out */
    double   copy_seconds;   /* wall time of the copy, synchronize included */
} ferry_copy_stats;

/*
 * The ordered copy of one split input: wait for the split backend, copy src into dst
 * (same layout) by policy, wait again. Gap bytes of dst are left untouched. A dst in
 * src's compact layout receives the bytes read, gathered, whatever the policy (path PLAN).
 */
ferry_status ferry_copy_input(ferry_backend * split_backend, ferry_copy_policy policy, const ferry_tensor * src,
                              ferry_tensor * dst, ferry_copy_stats * stats);

/*
 * The scheduler runs a graph over backends given in priority order. Each node gets a
 * backend: the one it is pinned to, else the first that supports its op and can use
 * the memory of all its sources, else the first that supports its op. Views compute
 * nothing and go with their source. Consecutive nodes on one backend form a split; a
 * source whose memory the split's backend cannot use is an input of the split and
 * gets a copy with the same layout (same ne and nb), placed on that backend by the
 * graph allocator together with the nodes' outputs. Compute runs the splits in order:
 * each input goes through ferry_copy_input under the scheduler's policy just before
 * the first of its split's nodes that reads it, once the nodes before have run.
 * Sources are redirected to their copies only while the scheduler allocates and
 * computes; the graph is left as it was given.
 */
typedef struct ferry_sched ferry_sched;

typedef struct {
    ferry_backend * backend;
    int first_node;      /* index into the graph's nodes of the split's first node */
    int n_nodes;         /* nodes it computes (views excluded) */
    int first_input;     /* index of its first input in ferry_sched_input */
    int n_inputs;
    double compute_seconds; /* last run */
} ferry_sched_split_info;

typedef struct {
    int split;
    ferry_tensor * src;  /* what the graph reads */
    ferry_tensor * copy; /* its copy on the split's backend */
    ferry_copy_stats stats; /* last run */
} ferry_sched_input_info;

/* Totals of the last run, over all inputs and splits. */
typedef struct {
    uint64_t n_inputs;
    uint64_t bytes_read;
    uint64_t bytes_span;
    uint64_t bytes_copied;
    uint64_t copy_calls;
    uint64_t impl_calls;
    double   copy_seconds;
    double   compute_seconds;
} ferry_sched_stats;

ferry_status ferry_sched_new(ferry_backend * const * backends, int n_backends, ferry_sched ** out);
void         ferry_sched_free(ferry_sched * sched);
ferry_status ferry_sched_set_policy(ferry_sched * sched, ferry_copy_policy policy);
ferry_copy_policy ferry_sched_get_policy(const ferry_sched * sched);
/* Pin a node to a backend; takes effect at the next alloc. Pins are kept by address
 * until cleared: clear them when the pinned tensors go (a new graph each decode step). */
ferry_status ferry_sched_set_tensor_backend(ferry_sched * sched, ferry_tensor * node, ferry_backend * backend);
void         ferry_sched_clear_pins(ferry_sched * sched);
int          ferry_sched_n_pins(const ferry_sched * sched);
/* Assign backends, find splits and inputs, allocate copies and outputs. */
ferry_status ferry_sched_alloc_graph(ferry_sched * sched, ferry_graph * graph);
/* Allocate if this is not the graph last allocated, then copy inputs and compute. */
ferry_status ferry_sched_graph_compute(ferry_sched * sched, ferry_graph * graph);
/* The backend a tensor of the last allocated graph was given (NULL if none). */
ferry_backend * ferry_sched_get_tensor_backend(const ferry_sched * sched, const ferry_tensor * t);
int          ferry_sched_n_splits(const ferry_sched * sched);
ferry_status ferry_sched_split(const ferry_sched * sched, int i, ferry_sched_split_info * out);
int          ferry_sched_n_inputs(const ferry_sched * sched);
ferry_status ferry_sched_input(const ferry_sched * sched, int i, ferry_sched_input_info * out);
ferry_status ferry_sched_get_stats(const ferry_sched * sched, ferry_sched_stats * out);
/* Compact staging: input copies take ferry_tensor_compact_layout (only the bytes read)
 * instead of the source's layout; takes effect at the next alloc. Off by default. */
ferry_status ferry_sched_set_compact(ferry_sched * sched, bool compact);
bool         ferry_sched_get_compact(const ferry_sched * sched);
/* Bytes of compute memory (copies and outputs) the scheduler holds on a backend. The
 * allocator's buffers grow and never shrink: compare options on fresh schedulers. */
size_t       ferry_sched_buffer_size(const ferry_sched * sched, const ferry_backend * backend);


/* ---------------------------------------------------------------- CUDA backend (cuda/) */

/* (cuda section) */
/*
 * Declared in every build: without CUDA compiled in, the ferry_cuda_* functions fail
 * with FERRY_ERR_UNSUPPORTED (ferry_cuda_device_count gives 0), so the cdef is one file.
 */

/* Devices ferry can use: 0, with FERRY_OK, when there is no device or no driver. */
ferry_status ferry_cuda_device_count(int * out);
/* A backend with its own stream on a device. Fails (FERRY_ERR_BACKEND) with CUDA's
 * message when there is no usable device. */
ferry_status ferry_cuda_backend_new(int device, ferry_backend ** out);
/* The device a CUDA backend runs on; FERRY_ERR_INVALID_ARG for other backends. */
ferry_status ferry_cuda_backend_device(const ferry_backend * backend, int * out);
/* Device memory (cudaMalloc) of a device: one buffer type per device, never freed. */
ferry_status ferry_cuda_buffer_type(int device, ferry_buffer_type ** out);
/* Pinned host memory (cudaMallocHost): host memory, so the CPU backend uses it too. */
ferry_status ferry_cuda_host_buffer_type(ferry_buffer_type ** out);
/* Host memory the caller owns, pinned and mapped for every device (cudaHostRegister)
 * until unregistered; it must stay allocated until then. Copies from it run at the
 * pinned rate, and the gather copy may read it. */
ferry_status ferry_cuda_host_register(void * ptr, size_t size);
/* Unregistering first lets every device finish its queued work, which may still read
 * the memory (a copy or gather kernel in flight). */
ferry_status ferry_cuda_host_unregister(void * ptr);
/*
 * The gather copy, an option of each CUDA backend, OFF by default until a GPU run shows
 * it beats the 2-D copy (tools/cuda_window_bench.c measures both); FERRY_CUDA_GATHER=1
 * in the environment turns it on, with the default rule, for backends made afterwards.
 * With it on, a 2-D set from host memory (ferry_backend_tensor_set_2d_async, so the
 * scheduler's copy path) is a kernel that reads the rows through the device's mapping
 * of the host memory, instead of one cudaMemcpy2DAsync, when all of these hold: the
 * source rows lie in one pinned range ferry knows (a CUDA_Host buffer or memory given
 * to ferry_cuda_host_register), their pitch is at least min_pitch, rows are at least
 * min_row bytes, and both addresses, the row and both pitches are multiples of 16 B.
 * Otherwise, and always with it off, the copy is one cudaMemcpy2DAsync.
 */
typedef struct {
    bool   on;               /* default false */
    int    loads_per_thread; /* 16-byte loads each thread keeps in flight: 1, 2, 4, 8 or 16; default 4 */
    size_t min_pitch;        /* default 64 KiB: docs/design.md puts one 2-D copy at the floor up to 32 KiB */
    size_t min_row;          /* default 256 B */
} ferry_cuda_gather_params;

ferry_cuda_gather_params ferry_cuda_gather_default_params(void);
ferry_status ferry_cuda_backend_set_gather(ferry_backend * backend, const ferry_cuda_gather_params * params);
/* The backend's gather option, and how many 2-D sets the kernel has carried out on it
 * (either output may be NULL). */
ferry_status ferry_cuda_backend_get_gather(const ferry_backend * backend, ferry_cuda_gather_params * params,
                                           uint64_t * copies);

/*
 * The folded copy, another option of each CUDA backend, OFF by default until a GPU run
 * shows it helps (tools/cuda_window_bench.c: way fold3d). docs/design.md puts one 2-D copy at
 * the contiguous rate up to a 32 KiB pitch and 1.5x off it at 64 KiB, as if the copy
 * engine's pitch had a limit. With fold_above > 0, a 2-D set or get whose pitch on either
 * side is at least fold_above goes as one cudaMemcpy3DAsync of the same rows: that side's
 * pitch divided by the smallest k with pitch % k == 0, row <= pitch / k < fold_above, and
 * slices of k such pitches. Where no such k exists, the plain 2-D copy. The environment's
 * FERRY_CUDA_FOLD=<bytes> sets fold_above for backends made afterwards.
 */
ferry_status ferry_cuda_backend_set_fold(ferry_backend * backend, size_t fold_above);
/* The backend's fold_above, and how many copies it has folded (either output may be NULL). */
ferry_status ferry_cuda_backend_get_fold(const ferry_backend * backend, size_t * fold_above, uint64_t * copies);

/*
 * A timing aid: queue on the backend's stream a kernel that waits `microseconds` (0 to
 * 1e6) on the device. Work queued behind it while it waits starts back to back, so events
 * recorded around that work time the device alone, not the host's submission of it
 * (tools/cuda_window_bench.c holds the stream before each timed copy).
 */
ferry_status ferry_cuda_backend_hold(ferry_backend * backend, double microseconds);

/* ---------------------------------------------------------------- events (event.c)
 * Order work between backends without a full synchronize. An event belongs to the
 * backend that made it; a backend that cannot make events gives FERRY_ERR_UNSUPPORTED. */

typedef struct ferry_event ferry_event;

enum {
    FERRY_EVENT_TIMING = 1 /* the event can be timed (ferry_event_elapsed_ms); else it is lighter */
};

ferry_status ferry_event_new(ferry_backend * backend, uint32_t flags, ferry_event ** out);
void         ferry_event_free(ferry_event * event);
/* Mark the point in backend's queued work that the event stands for. */
ferry_status ferry_event_record(ferry_event * event, ferry_backend * backend);
/* Make backend's later work wait for the event, on the device where it can, else on the host. */
ferry_status ferry_event_wait(ferry_backend * backend, ferry_event * event);
/* Block until the work before the event is done. */
ferry_status ferry_event_synchronize(ferry_event * event);
/* Milliseconds between two recorded timing events of the same backend kind. */
ferry_status ferry_event_elapsed_ms(const ferry_event * start, const ferry_event * end, float * out);


/* ---------------------------------------------------------------- build */

/* Was CUDA compiled in, and is a device usable now? */
bool         ferry_built_with_cuda(void);
bool         ferry_cuda_available(void);
/* True only in a test build linked against tests/fake-cudart (meson -Dfake_cudart=true):
 * its "device" is host memory and its timings mean nothing. */
bool         ferry_built_with_fake_cudart(void);
const char * ferry_version(void);
/* sizeof(ferry_tensor) as compiled, so the binding can check its cdef agrees. */
size_t       ferry_sizeof_tensor(void);
size_t       ferry_sizeof_stats(void);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
