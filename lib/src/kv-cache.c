/* A KV cache laid out as llama.cpp lays it out, and the windows attention reads from it. */
#include "ferry-impl.h"
#include "kv-layers.h"

#include <stdio.h>
#include <stdlib.h>

struct ferry_kv_cache {
    ferry_kv_params params;
    int64_t kv_size;                  /* cells per stream of a full layer */
    int64_t * layer_kv;               /* cells per stream, per layer */
    ferry_kv_layers layers;           /* every layer's K and V, where they live, the owned buffers */
    ferry_buffer_type * host_buft;    /* the buffer type of layers placed nowhere else */
};

static ferry_status check_params(const ferry_kv_params * p) {
    FERRY_CHECK_ARG(p, "kv_cache: NULL params");
    const ferry_kv_heads heads = FERRY_KV_HEADS_OF(p);
    FERRY_TRY(ferry_kv_check_types("kv_cache", &heads));
    if (p->head_dim <= 0 || p->n_head_kv <= 0 || p->n_ctx <= 0 || p->n_stream <= 0 || p->n_layer <= 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_cache: head_dim, n_head_kv, n_ctx, n_stream, n_layer must be positive");
    }
    if (p->head_dim > INT64_MAX / p->n_head_kv) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache: head_dim %lld x n_head_kv %lld overflows",
                          (long long) p->head_dim, (long long) p->n_head_kv);
    }
    if (p->n_ctx % p->n_stream != 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_cache: n_ctx %lld does not split into %lld equal streams",
                          (long long) p->n_ctx, (long long) p->n_stream);
    }
    return ferry_kv_check_rows("kv_cache", &heads);
}

void ferry_kv_cache_free(ferry_kv_cache * kv) {
    if (!kv) {
        return;
    }
    ferry_kv_layers_free(&kv->layers);
    free(kv->layer_kv);
    free(kv);
}

/* kv, the cache made, when st is OK; else kv freed and st. */
static ferry_status kept(ferry_kv_cache * kv, ferry_status st, ferry_kv_cache ** out) {
    if (st != FERRY_OK) {
        ferry_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return FERRY_OK;
}

/* A layer's K: a row of n_embd values per cell, its cells per stream, then the streams. */
static void k_shape(const void * cache, int32_t layer, int64_t ne[FERRY_MAX_DIMS]) {
    const ferry_kv_cache * kv = cache;
    ne[0] = kv->params.head_dim * kv->params.n_head_kv;
    ne[1] = kv->layer_kv[layer];
    ne[2] = kv->params.n_stream;
}

/* What the spine needs of this cache: its name, and a layer's K shaped by its cells per stream. */
static const ferry_kv_layout cell_layout = {
    .what = "kv_cache", .tensors = "cache", .one = "", .pair = "K and V", .n_dims = 3,
    .may_leave_unplaced = true, /* host_buft NULL: a layout only, for its sizes */
    .k_shape = k_shape,
};

/* The cache's layout: per-layer sizes checked, every layer's K and V made, nothing placed. */
static ferry_status lay_out(const ferry_kv_params * params, const int64_t * layer_cells, ferry_kv_cache ** out) {
    FERRY_TRY(check_params(params));
    const int64_t full = params->n_ctx / params->n_stream;
    for (int32_t l = 0; layer_cells && l < params->n_layer; l++) {
        if (layer_cells[l] < 0 || layer_cells[l] > full) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_cache: layer %d's %lld cells per stream are not in 0..%lld "
                              "(0: all n_ctx / n_stream)", l, (long long) layer_cells[l], (long long) full);
        }
    }
    ferry_kv_cache * kv = ferry_calloc(1, sizeof(*kv));
    if (!kv) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "kv_cache_new: out of memory");
    }
    kv->params = *params;
    kv->kv_size = full;
    kv->layer_kv = ferry_calloc((size_t) params->n_layer, sizeof(*kv->layer_kv));
    if (!kv->layer_kv) {
        return kept(kv, ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "kv_cache_new: out of memory"), out);
    }
    for (int32_t l = 0; l < params->n_layer; l++) {
        kv->layer_kv[l] = layer_cells && layer_cells[l] ? layer_cells[l] : full;
    }
    const ferry_kv_heads heads = FERRY_KV_HEADS_OF(params);
    return kept(kv, ferry_kv_layers_make(&kv->layers, &cell_layout, &heads, params->n_layer, kv), out);
}

ferry_status ferry_kv_cache_new_layers(const ferry_kv_params * params, ferry_buffer_type * host_buft,
                                      ferry_buffer_type * const * layer_bufts, const int64_t * layer_cells,
                                      ferry_kv_cache ** out) {
    FERRY_CHECK_ARG(out, "kv_cache_new: NULL output");
    ferry_kv_cache * kv;
    FERRY_TRY(lay_out(params, layer_cells, &kv));
    kv->host_buft = host_buft;
    return kept(kv, ferry_kv_layers_place(&kv->layers, host_buft, layer_bufts), out);
}

ferry_status ferry_kv_cache_new(const ferry_kv_params * params, ferry_buffer_type * buft, ferry_kv_cache ** out) {
    return ferry_kv_cache_new_layers(params, buft, NULL, NULL, out);
}

ferry_status ferry_kv_cache_new_over(const ferry_kv_params * params, const int64_t * layer_cells,
                                    ferry_buffer * const * k_bufs, const size_t * k_offsets,
                                    ferry_buffer * const * v_bufs, const size_t * v_offsets, ferry_kv_cache ** out) {
    FERRY_CHECK_ARG(out && k_bufs && k_offsets && v_bufs && v_offsets, "kv_cache_new_over: NULL argument");
    ferry_kv_cache * kv;
    FERRY_TRY(lay_out(params, layer_cells, &kv));
    return kept(kv, ferry_kv_layers_place_over(&kv->layers, k_bufs, k_offsets, v_bufs, v_offsets), out);
}

ferry_status ferry_kv_cache_params(const ferry_kv_cache * kv, ferry_kv_params * out) {
    FERRY_CHECK_ARG(kv && out, "kv_cache_params: NULL argument");
    *out = kv->params;
    return FERRY_OK;
}

int64_t ferry_kv_cache_kv_size(const ferry_kv_cache * kv) { return kv ? kv->kv_size : 0; }

ferry_buffer * ferry_kv_cache_buffer(const ferry_kv_cache * kv) {
    for (int i = 0; kv && i < kv->layers.n_buffers; i++) {
        if (ferry_buffer_get_type(kv->layers.buffers[i]) == kv->host_buft) {
            return kv->layers.buffers[i];
        }
    }
    return NULL;
}

static ferry_status check_layer(const ferry_kv_cache * kv, int32_t layer, const void * out) {
    FERRY_CHECK_ARG(kv && out, "kv_cache: NULL argument");
    return ferry_kv_layers_check(&kv->layers, layer, "kv_cache");
}

ferry_status ferry_kv_cache_k(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(kv, "kv_cache: NULL argument");
    return ferry_kv_layers_tensor(&kv->layers, layer, false, out, "kv_cache");
}

ferry_status ferry_kv_cache_v(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(kv, "kv_cache: NULL argument");
    return ferry_kv_layers_tensor(&kv->layers, layer, true, out, "kv_cache");
}

/* layer -1: a full-size layer. */
static ferry_status check_window(const ferry_kv_cache * kv, int32_t layer, int64_t n_kv, int64_t s0, int64_t s1) {
    const int64_t cells = layer < 0 ? kv->kv_size : kv->layer_kv[layer];
    if (n_kv <= 0 || n_kv > cells) {
        if (layer >= 0 && cells < kv->kv_size) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_window: n_kv %lld is not in 1..%lld: layer %d holds "
                              "%lld cells per stream", (long long) n_kv, (long long) cells, layer, (long long) cells);
        }
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_window: n_kv %lld is not in 1..%lld", (long long) n_kv,
                          (long long) cells);
    }
    if (s0 < 0 || s1 < s0 || s1 >= kv->params.n_stream) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_window: streams %lld..%lld are not within 0..%lld",
                          (long long) s0, (long long) s1, (long long) kv->params.n_stream - 1);
    }
    return FERRY_OK;
}

/* Bytes of one cell (K, or a V not transposed: a row of n_embd_gqa values) or, for a
 * transposed V, of one value: the step from a cell to the next along a stream. */
static size_t cell_step(const ferry_kv_cache * kv, bool v) {
    const ferry_kv_params * p = &kv->params;
    const ferry_type type = v ? p->type_v : p->type_k;
    size_t row = ferry_type_size(type); /* whole blocks: check_params saw to it */
    if (!(v && p->v_trans)) {
        ferry_row_size(type, p->head_dim * p->n_head_kv, &row);
    }
    return row;
}

/* The view a window takes of a layer's K (v false) or V, before its permute: cells of one
 * stream on dimension 2 (transposed V: 0), streams on 3; offset from the tensor's first byte. */
static void window_layout(const ferry_kv_cache * kv, int64_t kv_size, bool v, int64_t n_kv, int64_t s0, int64_t s1,
                          int64_t * ne, size_t * nb, size_t * offset) {
    const ferry_kv_params * p = &kv->params;
    const ferry_type type = v ? p->type_v : p->type_k;
    const bool trans = v && p->v_trans;
    const size_t cell = cell_step(kv, v);
    const size_t stream = cell * (size_t) kv_size * (size_t) (trans ? p->head_dim * p->n_head_kv : 1);
    const int64_t ns = s1 - s0 + 1;
    nb[0] = ferry_type_size(type);
    nb[3] = stream;
    ne[1] = p->n_head_kv;
    ne[3] = ns;
    if (trans) { /* one row of kv_size cells per channel */
        ne[0] = n_kv;
        ne[2] = p->head_dim;
        nb[1] = cell * (size_t) (kv_size * p->head_dim);
        nb[2] = cell * (size_t) kv_size;
    } else {
        ne[0] = p->head_dim;
        ne[2] = n_kv;
        ferry_row_size(type, p->head_dim, &nb[1]);
        nb[2] = cell;
    }
    *offset = stream * (size_t) s0;
}

ferry_status ferry_kv_cache_window_layout(const ferry_kv_cache * kv, bool v, int64_t n_kv, int64_t s0, int64_t s1,
                                          int64_t * ne, size_t * nb, size_t * offset) {
    FERRY_CHECK_ARG(kv && ne && nb && offset, "kv_cache_window_layout: NULL argument");
    FERRY_TRY(check_window(kv, -1, n_kv, s0, s1));
    window_layout(kv, kv->kv_size, v, n_kv, s0, s1, ne, nb, offset);
    return FERRY_OK;
}

ferry_status ferry_kv_cache_cell_offset(const ferry_kv_cache * kv, bool v, int64_t stream, int64_t cell,
                                        size_t * out) {
    FERRY_CHECK_ARG(kv && out, "kv_cache_cell_offset: NULL argument");
    if (stream < 0 || stream >= kv->params.n_stream || cell < 0 || cell > kv->kv_size) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_cell_offset: cell %lld of stream %lld is not within "
                          "0..%lld of 0..%lld", (long long) cell, (long long) stream, (long long) kv->kv_size,
                          (long long) kv->params.n_stream - 1);
    }
    int64_t ne[FERRY_MAX_DIMS];
    size_t nb[FERRY_MAX_DIMS], first;
    window_layout(kv, kv->kv_size, v, 1, stream, stream, ne, nb, &first);
    *out = first + cell_step(kv, v) * (size_t) cell;
    return FERRY_OK;
}

/* A layer's K (v false) or V window, permuted (0, 2, 1, 3) and named. */
static ferry_status window(const ferry_kv_cache * kv, ferry_context * ctx, bool v, int32_t layer, int64_t n_kv,
                           int64_t s0, int64_t s1, ferry_tensor ** out) {
    int64_t ne[FERRY_MAX_DIMS];
    size_t nb[FERRY_MAX_DIMS], offset;
    window_layout(kv, kv->layer_kv[layer], v, n_kv, s0, s1, ne, nb, &offset);
    ferry_tensor * view;
    FERRY_TRY(ferry_tensor_view(ctx, v ? kv->layers.v[layer] : kv->layers.k[layer], FERRY_MAX_DIMS, ne, nb, offset, &view));
    FERRY_TRY(ferry_tensor_permute(ctx, view, 0, 2, 1, 3, out));
    char name[FERRY_MAX_NAME];
    snprintf(name, sizeof(name), "window_%s_l%d", v ? "v" : "k", layer);
    return ferry_tensor_set_name(*out, name);
}

ferry_status ferry_kv_cache_window(const ferry_kv_cache * kv, ferry_context * ctx, int32_t layer, int64_t n_kv,
                                   int64_t s0, int64_t s1, ferry_tensor ** k_out, ferry_tensor ** v_out) {
    FERRY_TRY(check_layer(kv, layer, ctx));
    FERRY_TRY(check_window(kv, layer, n_kv, s0, s1));
    if (k_out) {
        FERRY_TRY(window(kv, ctx, false, layer, n_kv, s0, s1, k_out));
    }
    if (v_out) {
        FERRY_TRY(window(kv, ctx, true, layer, n_kv, s0, s1, v_out));
    }
    return FERRY_OK;
}

int64_t ferry_kv_cache_layer_kv_size(const ferry_kv_cache * kv, int32_t layer) {
    return kv && layer >= 0 && layer < kv->params.n_layer ? kv->layer_kv[layer] : 0;
}

ferry_buffer_type * ferry_kv_cache_layer_buffer_type(const ferry_kv_cache * kv, int32_t layer) {
    return kv ? ferry_kv_layers_buffer_type(&kv->layers, layer) : NULL;
}

ferry_buffer * ferry_kv_cache_layer_buffer(const ferry_kv_cache * kv, int32_t layer) {
    return kv ? ferry_kv_layers_buffer(&kv->layers, layer) : NULL;
}

ferry_status ferry_kv_cache_layer_n_kv(const ferry_kv_cache * kv, int32_t layer, int64_t n_kv, int64_t * out) {
    FERRY_TRY(check_layer(kv, layer, out));
    if (n_kv <= 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_layer_n_kv: n_kv %lld is not positive", (long long) n_kv);
    }
    *out = n_kv < kv->layer_kv[layer] ? n_kv : kv->layer_kv[layer];
    return FERRY_OK;
}
