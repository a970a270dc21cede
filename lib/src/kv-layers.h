/*
 * The spine of every KV cache (kv-layers.c): per layer a K and a V tensor, where their memory
 * lives (a buffer type's new buffer, or the caller's buffers), the buffers the cache owns, the
 * checks on what the caller gives, and messages that start with the cache's name. A cache
 * supplies only its layout (ferry_kv_layout): its name, the shape of a layer's K, and how its
 * messages call a layer's pair; its parameters, cells and windows stay its own.
 */
#ifndef FERRY_KV_LAYERS_H
#define FERRY_KV_LAYERS_H

#include "ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What every cache's parameters say of a layer's heads. */
typedef struct ferry_kv_heads {
    ferry_type type_k;
    ferry_type type_v;
    int64_t head_dim;
    int64_t n_head_kv;
    bool v_trans; /* V stored one row per channel: its shape is K's with dimensions 0 and 1 swapped */
} ferry_kv_heads;

/* The heads of a cache's parameters p (ferry_kv_params, ferry_paged_params: the same names). */
#define FERRY_KV_HEADS_OF(p)                                                                          \
    ((ferry_kv_heads) {.type_k = (p)->type_k, .type_v = (p)->type_v, .head_dim = (p)->head_dim,     \
                       .n_head_kv = (p)->n_head_kv, .v_trans = (p)->v_trans})

/* A kind of cache, as the spine sees it: one static description per kind. */
typedef struct ferry_kv_layout {
    const char * what;    /* the cache's name: messages start "kv_cache:" or "kv_cache_new:" */
    const char * tensors; /* a layer's tensors are named <tensors>_k_l<layer> and <tensors>_v_l<layer> */
    const char * one;     /* said after "K" or "V" in messages: "" or " pool" */
    const char * pair;    /* a layer's two tensors in messages: "K and V", "K and V pools" */
    int n_dims;           /* of a layer's K and V */
    bool may_leave_unplaced; /* a layer without a buffer type is left without memory (else refused) */
    /* Layer l's K shape: ne[0] = head_dim * n_head_kv channels, ne[1] its cells, then what the
     * layout adds (streams); `cache` is what ferry_kv_layers_make was given. */
    void (*k_shape)(const void * cache, int32_t layer, int64_t ne[FERRY_MAX_DIMS]);
} ferry_kv_layout;

/* A cache's layers; a cache holds one and frees it with ferry_kv_layers_free. */
typedef struct ferry_kv_layers {
    const ferry_kv_layout * layout;
    ferry_kv_heads heads;
    int32_t n_layer;
    ferry_context * ctx;       /* holds every K and V */
    ferry_tensor ** k;         /* per layer */
    ferry_tensor ** v;
    ferry_buffer_type ** buft; /* per layer: where its K and V live (NULL: nowhere) */
    ferry_buffer ** buf;       /* per layer: the buffer holding its K */
    ferry_buffer ** buffers;   /* owned: one per distinct buffer type */
    int n_buffers;
} ferry_kv_layers;

/* The checks every cache's parameters start with (a type is a type) and end with (a cell is whole
 * blocks of K and V values); messages start with what. */
ferry_status ferry_kv_check_types(const char * what, const ferry_kv_heads * heads);
ferry_status ferry_kv_check_rows(const char * what, const ferry_kv_heads * heads);

/* Every layer's K and V made by layout's shape (asked of cache), named, placed nowhere. On
 * failure what was made stays in layers for ferry_kv_layers_free. */
ferry_status ferry_kv_layers_make(ferry_kv_layers * layers, const ferry_kv_layout * layout,
                                  const ferry_kv_heads * heads, int32_t n_layer, const void * cache);

/* Each layer in layer_bufts[l] (NULL array or entry: host_buft): one new buffer, cleared, per
 * distinct buffer type, which the layers own. */
ferry_status ferry_kv_layers_place(ferry_kv_layers * layers, ferry_buffer_type * host_buft,
                                   ferry_buffer_type * const * layer_bufts);

/* Each layer's K and V in the caller's buffers at the given offsets, checked; the caller keeps them. */
ferry_status ferry_kv_layers_place_over(ferry_kv_layers * layers, ferry_buffer * const * k_bufs,
                                        const size_t * k_offsets, ferry_buffer * const * v_bufs,
                                        const size_t * v_offsets);

/* The owned buffers, the tensors and the arrays; layers itself is the caller's. */
void ferry_kv_layers_free(ferry_kv_layers * layers);

/* OUT_OF_BOUNDS, message starting with what, unless layer is in 0..n_layer - 1. */
ferry_status ferry_kv_layers_check(const ferry_kv_layers * layers, int32_t layer, const char * what);

/* Layer layer's K (v false) or V tensor into *out: the one accessor behind every cache's k and v.
 * INVALID_ARG for a NULL out, OUT_OF_BOUNDS for a layer out of range, each message starting with what. */
ferry_status ferry_kv_layers_tensor(const ferry_kv_layers * layers, int32_t layer, bool v, ferry_tensor ** out,
                                    const char * what);

/* A layer's buffer type and buffer; NULL for a layer out of range or placed nowhere. */
ferry_buffer_type * ferry_kv_layers_buffer_type(const ferry_kv_layers * layers, int32_t layer);
ferry_buffer * ferry_kv_layers_buffer(const ferry_kv_layers * layers, int32_t layer);

#ifdef __cplusplus
}
#endif

#endif
