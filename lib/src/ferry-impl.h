/*
 * The generic layer's internals below the copy path, for the files directly in lib/src: sizes,
 * allocation, the clock, types, tensors, buffers' counters and transfers. A backend includes
 * backend-impl.h instead; the copy path's internals are copy-impl.h's.
 */
#ifndef FERRY_IMPL_H
#define FERRY_IMPL_H

#include "backend-impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- sizes (sizes.c) */

/* Byte extent of a 2-D transfer: offset + (n-1)*stride + size, false on overflow. */
bool ferry_extent_2d(size_t offset, size_t size, size_t n_copies, size_t stride, size_t * end);

/* ---------------------------------------------------------------- zeroed allocations (zalloc.c) */

/* size zeroed bytes, or NULL with FERRY_ERR_OUT_OF_MEMORY "<what>: out of memory" recorded. */
void * ferry_zalloc(size_t size, const char * what);
/* A constructor's zeroed object into *out; on failure OUT_OF_MEMORY, *out as it was. */
ferry_status ferry_new_zeroed(size_t size, const char * what, void ** out);

/* ---------------------------------------------------------------- the clock (event.c) */

/* When a reached event was reached, on ferry_now_seconds's clock; UNSUPPORTED (no error left)
 * for events that only time against each other (a CUDA stream's). */
ferry_status ferry_event_reached_seconds(const ferry_event * event, double * out);

/* ---------------------------------------------------------------- types (types.c) */

bool ferry_type_valid(ferry_type type);

/* ---------------------------------------------------------------- tensors (tensor.c) */

/* The tensor that owns the memory t reads (t itself unless t is a view). */
const ferry_tensor * ferry_tensor_root(const ferry_tensor * t);
/* OUT_OF_BOUNDS unless the products of ne[0..n_dims-1] and of ne[1..n_dims-1] (non-negative;
 * elements and rows) fit an int64_t, multiplied left to right. */
ferry_status ferry_check_element_count(const int64_t * ne, int n_dims, const char * what);
/* A paged window of pool (ferry_paged_cache_window): a view struct of the given ne and nb, which
 * need not lie within pool (its bytes are gathered, never read in place), annotated with its
 * source and first sequence. */
ferry_status ferry_tensor_paged_window(ferry_context * ctx, ferry_tensor * pool, const int64_t * ne, const size_t * nb,
                                       const ferry_paged_source * source, int64_t first_seq, ferry_tensor ** out);
/* INVALID_ARG, naming what and t, when t is a paged window: its layout is not where its bytes are. */
ferry_status ferry_tensor_check_not_paged(const ferry_tensor * t, const char * what);
/* A new tensor in ctx with everything zeroed but type; for op constructors. */
ferry_status ferry_tensor_alloc_struct(ferry_context * ctx, ferry_type type, ferry_tensor ** out);
void ferry_tensor_set_contiguous_strides(ferry_tensor * t);

/* ---------------------------------------------------------------- buffers (buffer.c) */

void ferry_stats_add(ferry_stats * s, ferry_xfer kind, uint64_t bytes, uint64_t impl_calls);
/* The getters and resetters of buffers' and backends' stats: s NULL for a NULL owner. */
ferry_status ferry_stats_get(const ferry_stats * s, ferry_stats * out);
void ferry_stats_reset(ferry_stats * s);

/* A pointer into a buffer may be given to another buffer's transfer only when the pair allows
 * it: ptr_readable (the source of a set: host memory, synthetic only when the destination is
 * synthetic too, whose set reads nothing) and ptr_writable (the target of a get: host memory,
 * synthetic exactly when the source is, so that a synthetic get writes nothing and a real one
 * never writes to a synthetic address). Copies that cannot go by pointer are staged, and what a
 * synthetic source gives there is zeros. */
bool ferry_buffer_ptr_readable(const ferry_buffer * src, const ferry_buffer * dst);
bool ferry_buffer_ptr_writable(const ferry_buffer * dst, const ferry_buffer * src);
/* Whose memory buf is, as its type's get_memory says; false for synthetic memory and for
 * memory no other library may read directly. */
bool ferry_buffer_memory(const ferry_buffer * buf, ferry_memory_kind * kind, int * device);

/* ---------------------------------------------------------------- transfers (transfer.c, backend.c) */

/* The gather in one call (backend.c): each piece checked to lie in t, dispatched, counted as one
 * 2-D set of all its bytes. */
ferry_status ferry_backend_tensor_gather_async(ferry_backend * backend, ferry_tensor * t, const char * src,
                                               const ferry_gather_copy * pieces, size_t n,
                                               ferry_gather_method method);
/* A merged gather in one call (backend.c): the spans of src (offsets into a staging area of the
 * device, one after another) cross the link, and the pieces (the runs read, as a batched gather's)
 * land in t from them; counted as one 2-D set of the spans' bytes, the gaps' included. */
ferry_status ferry_backend_tensor_gather_merged_async(ferry_backend * backend, ferry_tensor * t, const char * src,
                                                      const ferry_gather_copy * spans, size_t n_spans,
                                                      const ferry_gather_copy * pieces, size_t n);

/* Checks shared by buffer.c and backend.c: t allocated, the extent inside t (transfer.c). */
ferry_status ferry_check_transfer(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                  size_t n_copies, size_t stride_tensor, const char * what);
/* The same, and for n_copies > 1 strides no smaller than the row on either side. */
ferry_status ferry_check_transfer_2d(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                     size_t n_copies, size_t stride_tensor, size_t stride_data, const char * what);
/* The buffer's own blocking transfer of size bytes at offset, unchecked: set writes t from
 * data, else reads t into data. */
ferry_status ferry_buffer_transfer(ferry_buffer * buf, bool set, ferry_tensor * t, char * data, size_t offset,
                                   size_t size);
/* ferry_tensor_set (set) or ferry_tensor_get. */
ferry_status ferry_transfer_1d(bool set, ferry_tensor * t, char * data, size_t offset, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_IMPL_H */
