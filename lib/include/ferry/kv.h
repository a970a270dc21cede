/* ferry/kv.h: a KV cache laid out as llama.cpp lays it out, and its windows. */
#ifndef FERRY_KV_H
#define FERRY_KV_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- KV cache windows (kv-cache.c) */

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

/* Lay out the cache and, when buft is given, allocate one buffer of it for all layers. A buffer
 * the cache allocates is cleared to zeros (ferry_buffer_clear), on a device too. */
FERRY_API ferry_status ferry_kv_cache_new(const ferry_kv_params * params, ferry_buffer_type * buft, ferry_kv_cache ** out);
/*
 * A cache whose layers differ in place and size. Layer l's K and V live in buffer type
 * layer_bufts[l] (a device backend's memory, say), or host_buft where layer_bufts or its
 * entry is NULL; one buffer is allocated per distinct buffer type, holding all of its
 * layers. Layer l holds layer_cells[l] cells per stream (a sliding-window layer holds its
 * window), or n_ctx / n_stream where layer_cells or its entry is 0. Placement and sizes are
 * fixed for the cache's life; layers of no buffer type (host_buft NULL) are laid out, not
 * allocated. ferry_kv_cache_new(p, buft, out) is this with both lists NULL.
 */
FERRY_API ferry_status ferry_kv_cache_new_layers(const ferry_kv_params * params, ferry_buffer_type * host_buft,
                                                 ferry_buffer_type * const * layer_bufts,
                                                 const int64_t * layer_cells, ferry_kv_cache ** out);
/*
 * A cache over buffers the caller owns (ferry_host_buffer_from_ptr, ferry_cuda_buffer_from_ptr,
 * or any ferry buffer): layer l's K at k_offsets[l] of k_bufs[l], its V at v_offsets[l] of
 * v_bufs[l] (a buffer of the same type), laid out as the cache lays them out (dense, cells as
 * layer_cells says; NULL: all n_ctx / n_stream). Their content is kept, not cleared. The cache
 * frees none of them: they must outlive it.
 */
FERRY_API ferry_status ferry_kv_cache_new_over(const ferry_kv_params * params, const int64_t * layer_cells,
                                               ferry_buffer * const * k_bufs, const size_t * k_offsets,
                                               ferry_buffer * const * v_bufs, const size_t * v_offsets,
                                               ferry_kv_cache ** out);
FERRY_API void         ferry_kv_cache_free(ferry_kv_cache * kv);
FERRY_API ferry_status ferry_kv_cache_params(const ferry_kv_cache * kv, ferry_kv_params * out);
FERRY_API int64_t      ferry_kv_cache_kv_size(const ferry_kv_cache * kv); /* cells per stream of a full layer */
/* The buffer the cache allocated of its host buffer type; NULL if none (not allocated, every
 * layer placed elsewhere, or a cache over the caller's buffers). */
FERRY_API ferry_buffer * ferry_kv_cache_buffer(const ferry_kv_cache * kv);
/* Per layer (0 or NULL for a layer the cache does not have): cells per stream, the buffer
 * type and the buffer its K and V are in. */
FERRY_API int64_t      ferry_kv_cache_layer_kv_size(const ferry_kv_cache * kv, int32_t layer);
FERRY_API ferry_buffer_type * ferry_kv_cache_layer_buffer_type(const ferry_kv_cache * kv, int32_t layer);
FERRY_API ferry_buffer * ferry_kv_cache_layer_buffer(const ferry_kv_cache * kv, int32_t layer);
/* The cells a layer's window reads when the sequence has n_kv: min(n_kv, the layer's cells):
 * a sliding-window layer's whole ring. */
FERRY_API ferry_status ferry_kv_cache_layer_n_kv(const ferry_kv_cache * kv, int32_t layer, int64_t n_kv, int64_t * out);
FERRY_API ferry_status ferry_kv_cache_k(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
FERRY_API ferry_status ferry_kv_cache_v(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
/*
 * The windows attention reads: the first n_kv cells of streams s0..s1 (refused beyond the
 * layer's own cells, naming the layer and its size), created in ctx
 * and permuted (0, 2, 1, 3) as attention hands them on, so rows are on dimension 1 and
 * streams on dimension 3. K: [head_dim, n_kv, n_head_kv, ns]; V likewise, or
 * [n_kv, head_dim, n_head_kv, ns] when transposed.
 */
FERRY_API ferry_status ferry_kv_cache_window(const ferry_kv_cache * kv, ferry_context * ctx, int32_t layer, int64_t n_kv,
                                   int64_t s0, int64_t s1, ferry_tensor ** k_out, ferry_tensor ** v_out);
/*
 * The view ferry_kv_cache_window takes of a full-size layer's K (v false) or V, before its permute:
 * ne and nb of 4 dimensions (cells on dimension 2, or 0 when V is transposed; streams on 3)
 * and the byte offset of stream s0 from the layer tensor's first byte. Fails as
 * ferry_kv_cache_window does for n_kv or streams the cache does not have.
 */
FERRY_API ferry_status ferry_kv_cache_window_layout(const ferry_kv_cache * kv, bool v, int64_t n_kv, int64_t s0,
                                                    int64_t s1, int64_t * ne, size_t * nb, size_t * offset);
/* The byte offset of a cell of a stream in each full-size layer's K (v false) or V: of its first value,
 * or, V transposed, of its value of channel 0 (channel c lies c * kv_size values on). cell
 * may be kv_size, the stream's end. */
FERRY_API ferry_status ferry_kv_cache_cell_offset(const ferry_kv_cache * kv, bool v, int64_t stream, int64_t cell,
                                                  size_t * out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_KV_H */
