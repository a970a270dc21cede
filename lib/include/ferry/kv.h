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

/* Lay out the cache and, when buft is given, allocate one buffer of it for all layers. */
FERRY_API ferry_status ferry_kv_cache_new(const ferry_kv_params * params, ferry_buffer_type * buft, ferry_kv_cache ** out);
FERRY_API void         ferry_kv_cache_free(ferry_kv_cache * kv);
FERRY_API ferry_status ferry_kv_cache_params(const ferry_kv_cache * kv, ferry_kv_params * out);
FERRY_API int64_t      ferry_kv_cache_kv_size(const ferry_kv_cache * kv); /* cells per stream */
FERRY_API ferry_buffer * ferry_kv_cache_buffer(const ferry_kv_cache * kv);  /* NULL if not allocated */
FERRY_API ferry_status ferry_kv_cache_k(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
FERRY_API ferry_status ferry_kv_cache_v(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out);
/*
 * The windows attention reads: the first n_kv cells of streams s0..s1, created in ctx
 * and permuted (0, 2, 1, 3) as attention hands them on, so rows are on dimension 1 and
 * streams on dimension 3. K: [head_dim, n_kv, n_head_kv, ns]; V likewise, or
 * [n_kv, head_dim, n_head_kv, ns] when transposed.
 */
FERRY_API ferry_status ferry_kv_cache_window(const ferry_kv_cache * kv, ferry_context * ctx, int32_t layer, int64_t n_kv,
                                   int64_t s0, int64_t s1, ferry_tensor ** k_out, ferry_tensor ** v_out);
/*
 * The view ferry_kv_cache_window takes of a layer's K (v false) or V, before its permute:
 * ne and nb of 4 dimensions (cells on dimension 2, or 0 when V is transposed; streams on 3)
 * and the byte offset of stream s0 from the layer tensor's first byte. Fails as
 * ferry_kv_cache_window does for n_kv or streams the cache does not have.
 */
FERRY_API ferry_status ferry_kv_cache_window_layout(const ferry_kv_cache * kv, bool v, int64_t n_kv, int64_t s0,
                                                    int64_t s1, int64_t * ne, size_t * nb, size_t * offset);
/* The byte offset of a cell of a stream in each layer's K (v false) or V: of its first value,
 * or, V transposed, of its value of channel 0 (channel c lies c * kv_size values on). cell
 * may be kv_size, the stream's end. */
FERRY_API ferry_status ferry_kv_cache_cell_offset(const ferry_kv_cache * kv, bool v, int64_t stream, int64_t cell,
                                                  size_t * out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_KV_H */
