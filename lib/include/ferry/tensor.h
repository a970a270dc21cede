/* ferry/tensor.h: types and tensors. */
#ifndef FERRY_TENSOR_H
#define FERRY_TENSOR_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- types (types.c) */

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
FERRY_API const char * ferry_type_name(ferry_type type);
FERRY_API ferry_status ferry_type_from_name(const char * name, ferry_type * out);
FERRY_API size_t       ferry_type_size(ferry_type type);  /* bytes per block */
FERRY_API int64_t      ferry_blck_size(ferry_type type);  /* values per block */
/* Bytes taken by a row of ne values; ne must be a multiple of the block size. */
FERRY_API ferry_status ferry_row_size(ferry_type type, int64_t ne, size_t * out);

/* ---------------------------------------------------------------- tensors (tensor.c) */

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
    FERRY_OP_ATTN_PAGED = 13,
    FERRY_OP_COUNT = 14
} ferry_op;

enum {
    FERRY_TENSOR_FLAG_INPUT = 1,
    FERRY_TENSOR_FLAG_OUTPUT = 2
};

/* What a paged window gathers from (ferry/paged.h): opaque, the library's own. */
typedef struct ferry_paged_source ferry_paged_source;
/* A transport that brings a host tensor's bytes from elsewhere (ferry/sched.h: ferry_fetch). */
struct ferry_fetch;

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

    /* Used cells (ferry_tensor_set_used_cells): per index of dimension used_stream_dim, only
     * the first lengths[s] indices of dimension used_cell_dim are read. NULL: all of them. */
    const struct ferry_tensor * used_lengths;
    int32_t used_cell_dim;
    int32_t used_stream_dim;
    int64_t used_limit;

    /* A paged window (ferry_paged_cache_window): its stream s is gathered from a paged cache's
     * pool through the block table of sequence paged_first_seq + s. NULL: an ordinary tensor. */
    const ferry_paged_source * paged;
    int64_t paged_first_seq;

    /* A tensor whose memory is a local copy of bytes held elsewhere (ferry_tensor_set_fetch):
     * the scheduler has them fetched before it copies a window of it. NULL: its bytes are here. */
    const struct ferry_fetch * fetch;
} ferry_tensor;

/* A context owns tensor structs (not their data); freeing it frees them all. */
FERRY_API ferry_status ferry_context_new(ferry_context ** out);
FERRY_API void         ferry_context_free(ferry_context * ctx);
FERRY_API size_t       ferry_context_n_tensors(const ferry_context * ctx);

/* A new tensor with contiguous strides; ne[i] for i >= n_dims are 1. */
FERRY_API ferry_status ferry_tensor_new(ferry_context * ctx, ferry_type type, int n_dims,
                              const int64_t * ne, ferry_tensor ** out);
/* A tensor with the same type, ne and nb as t, unallocated (the scheduler's input copy). */
FERRY_API ferry_status ferry_tensor_dup_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out);
/* A view of src: n_dims shapes and byte strides (nb may be NULL for one dimension), at a
 * byte offset from src's first byte. nb[0] must be the type's size (one element or block:
 * FERRY_ERR_LAYOUT otherwise); dimensions past n_dims hold one value, strided as
 * ferry_view_strides gives. The view must stay inside src's own span. */
FERRY_API ferry_status ferry_tensor_view(ferry_context * ctx, ferry_tensor * src, int n_dims,
                               const int64_t * ne, const size_t * nb, size_t offset,
                               ferry_tensor ** out);
/* The four strides a view of n_dims of ne and nb has: nb as given (nb[0] unchecked), then
 * for each one-value dimension past them the stride below times the count below (nb[1]: a
 * row of ne[0]), SIZE_MAX past size_t. Fails as ferry_tensor_view does for a bad shape. */
FERRY_API ferry_status ferry_view_strides(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb,
                                          size_t * out);
/* ggml's permute: dimension i of t becomes dimension axis[i] of the result. */
FERRY_API ferry_status ferry_tensor_permute(ferry_context * ctx, ferry_tensor * t,
                                  int axis0, int axis1, int axis2, int axis3, ferry_tensor ** out);
FERRY_API ferry_status ferry_tensor_transpose(ferry_context * ctx, ferry_tensor * t, ferry_tensor ** out);
/* t must be contiguous; the element count must not change. */
FERRY_API ferry_status ferry_tensor_reshape(ferry_context * ctx, ferry_tensor * t, int n_dims,
                                  const int64_t * ne, ferry_tensor ** out);
FERRY_API ferry_status ferry_tensor_set_name(ferry_tensor * t, const char * name);

FERRY_API int64_t ferry_tensor_nelements(const ferry_tensor * t);
FERRY_API int64_t ferry_tensor_nrows(const ferry_tensor * t);
/* ggml's rule: the span from the first byte to the last, whole blocks included. */
FERRY_API size_t  ferry_tensor_nbytes(const ferry_tensor * t);
/* The same rule for a layout given by n_dims of ne and nb (the rest count 1): 0 when a
 * dimension is 0; FERRY_ERR_OUT_OF_BOUNDS when the span does not fit a size_t. */
FERRY_API ferry_status ferry_layout_nbytes(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb, size_t * out);
/* ggml's contiguous strides for n_dims of ne: nb[0] the type size, nb[1] a row of ne[0]
 * (whole blocks), each next nb the one before times the count below it. A stride past
 * size_t is given as SIZE_MAX: no tensor whose span steps it can be made. */
FERRY_API ferry_status ferry_contiguous_strides(ferry_type type, int n_dims, const int64_t * ne, size_t * nb);
FERRY_API bool    ferry_tensor_is_contiguous(const ferry_tensor * t);
FERRY_API bool    ferry_tensor_same_layout(const ferry_tensor * a, const ferry_tensor * b);
FERRY_API bool    ferry_tensor_is_view(const ferry_tensor * t);
/*
 * Used cells: t (a window over a multi-stream KV cache) reads, of stream s (index s of
 * dimension stream_dim), only the cells 0..used[s]-1 of dimension cell_dim, where used[s] is
 * min(lengths[s], t->ne[cell_dim]): attention's own clamp of kv_len. lengths is an i32 tensor
 * of one value per stream (ne[0] = t->ne[stream_dim], every other ne 1), the kv_len the caller
 * writes before each step. Lengths above limit are refused when read (limit 0: t->ne[cell_dim];
 * a sliding-window layer's window has fewer cells than the step's n_kv, its limit). The ragged
 * copy policy reads lengths when it copies t, or queues its copy, so lengths must then be in
 * host memory; every policy (and attention reading t where it lies) refuses a length outside
 * 0..limit it can read, before a byte moves (ferry_copy_input). t keeps a pointer to
 * lengths, which must outlive t's copies. lengths NULL clears. Refused (INVALID_ARG, LAYOUT):
 * dimensions outside 0..3 or equal, lengths not i32 or not one per stream, a limit below
 * t->ne[cell_dim], cells on dimension 0 of a block type (a length would split blocks).
 */
FERRY_API ferry_status ferry_tensor_set_used_cells(ferry_tensor * t, const ferry_tensor * lengths, int cell_dim,
                                                   int stream_dim, int64_t limit);
/* OK if t has memory behind it in a live buffer (views: their source); buffer.c checks,
 * as the keeper of the live buffers. */
FERRY_API ferry_status ferry_tensor_check_allocated(const ferry_tensor * t);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_TENSOR_H */
