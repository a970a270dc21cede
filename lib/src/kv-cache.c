/* A KV cache laid out as llama.cpp lays it out, and the windows attention reads from it. */
#include "ferry-impl.h"

#include <stdio.h>
#include <stdlib.h>

struct ferry_kv_cache {
    ferry_kv_params params;
    int64_t kv_size;                  /* cells per stream of a full layer */
    int64_t * layer_kv;               /* cells per stream, per layer */
    ferry_buffer_type ** layer_buft;  /* per layer: where its K and V live (NULL: not allocated) */
    ferry_buffer ** layer_buf;        /* per layer: the buffer holding its K and V */
    ferry_context * ctx;
    ferry_tensor ** k;
    ferry_tensor ** v;
    ferry_buffer ** buffers;          /* owned: one per distinct buffer type */
    int n_buffers;
    ferry_buffer_type * host_buft;    /* the buffer type of layers placed nowhere else */
};

static ferry_status check_params(const ferry_kv_params * p) {
    FERRY_CHECK_ARG(p, "kv_cache: NULL params");
    if (!ferry_type_valid(p->type_k) || !ferry_type_valid(p->type_v)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "kv_cache: %s %d is not a type", ferry_type_valid(p->type_k) ?
                          "type_v" : "type_k", (int) (ferry_type_valid(p->type_k) ? p->type_v : p->type_k));
    }
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
    size_t r;
    if (ferry_row_size(p->type_k, p->head_dim, &r) != FERRY_OK) {
        return ferry_fail(FERRY_ERR_LAYOUT, "kv_cache: head_dim %lld is not whole %s blocks of %lld values (type_k)",
                          (long long) p->head_dim, ferry_type_name(p->type_k), (long long) ferry_blck_size(p->type_k));
    }
    if (p->v_trans && ferry_blck_size(p->type_v) != 1) {
        return ferry_fail(FERRY_ERR_LAYOUT, "kv_cache: a transposed V (v_trans) cannot be %s (type_v): cells would "
                          "split blocks", ferry_type_name(p->type_v));
    }
    if (!p->v_trans && ferry_row_size(p->type_v, p->head_dim, &r) != FERRY_OK) {
        return ferry_fail(FERRY_ERR_LAYOUT, "kv_cache: head_dim %lld is not whole %s blocks of %lld values (type_v)",
                          (long long) p->head_dim, ferry_type_name(p->type_v), (long long) ferry_blck_size(p->type_v));
    }
    return FERRY_OK;
}

void ferry_kv_cache_free(ferry_kv_cache * kv) {
    if (!kv) {
        return;
    }
    for (int i = 0; kv->buffers && i < kv->n_buffers; i++) {
        ferry_buffer_free(kv->buffers[i]);
    }
    ferry_context_free(kv->ctx);
    free(kv->buffers);
    free(kv->layer_kv);
    free(kv->layer_buft);
    free(kv->layer_buf);
    free(kv->k);
    free(kv->v);
    free(kv);
}

/* Place the K and V of every layer of buft back to back in one new buffer, each at the
 * buffer type's alignment: one buffer per buffer type, not one per layer. */
static ferry_status allocate(ferry_kv_cache * kv, ferry_buffer_type * buft) {
    const size_t align = ferry_buffer_type_alignment(buft) ? ferry_buffer_type_alignment(buft) : 1;
    size_t total = 0;
    for (int32_t l = 0; l < kv->params.n_layer; l++) {
        ferry_tensor * pair[2] = {kv->k[l], kv->v[l]};
        for (int i = 0; i < 2 && kv->layer_buft[l] == buft; i++) {
            const size_t size = ferry_buffer_type_alloc_size(buft, pair[i]);
            size_t rounded;
            if (!ferry_add_ok(size, align - 1, &rounded) || !ferry_add_ok(total, rounded / align * align, &total)) {
                return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache: %d layers of K and V overflow a buffer's size",
                                  kv->params.n_layer);
            }
        }
    }
    ferry_buffer * buf;
    FERRY_TRY(ferry_buffer_type_alloc_buffer(buft, total, &buf));
    kv->buffers[kv->n_buffers++] = buf;
    /* A new cache reads zeros, not what its memory held before (llama.cpp clears its KV buffers
     * too); the buffer's own clear, so device memory is cleared where it lies. */
    FERRY_TRY(ferry_buffer_clear(buf, 0));
    size_t offset = 0;
    for (int32_t l = 0; l < kv->params.n_layer; l++) {
        ferry_tensor * pair[2] = {kv->k[l], kv->v[l]};
        for (int i = 0; i < 2 && kv->layer_buft[l] == buft; i++) {
            FERRY_TRY(ferry_buffer_place_tensor(buf, pair[i], offset));
            offset += (ferry_buffer_type_alloc_size(buft, pair[i]) + align - 1) / align * align;
            kv->layer_buf[l] = buf;
        }
    }
    return FERRY_OK;
}

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
    const size_t n = (size_t) params->n_layer;
    kv->params = *params;
    kv->kv_size = full;
    kv->k = ferry_calloc(n, sizeof(*kv->k));
    kv->v = ferry_calloc(n, sizeof(*kv->v));
    kv->layer_kv = ferry_calloc(n, sizeof(*kv->layer_kv));
    kv->layer_buft = ferry_calloc(n, sizeof(*kv->layer_buft));
    kv->layer_buf = ferry_calloc(n, sizeof(*kv->layer_buf));
    kv->buffers = ferry_calloc(n, sizeof(*kv->buffers));
    ferry_status st = kv->k && kv->v && kv->layer_kv && kv->layer_buft && kv->layer_buf && kv->buffers
                          ? ferry_context_new(&kv->ctx)
                          : ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "kv_cache_new: out of memory");
    const int64_t n_embd = params->head_dim * params->n_head_kv;
    for (int32_t l = 0; st == FERRY_OK && l < params->n_layer; l++) {
        const int64_t cells = layer_cells && layer_cells[l] ? layer_cells[l] : full;
        kv->layer_kv[l] = cells;
        const int64_t ne_k[3] = {n_embd, cells, params->n_stream};
        const int64_t ne_vt[3] = {cells, n_embd, params->n_stream};
        st = ferry_tensor_new(kv->ctx, params->type_k, 3, ne_k, &kv->k[l]);
        if (st == FERRY_OK) {
            st = ferry_tensor_new(kv->ctx, params->type_v, 3, params->v_trans ? ne_vt : ne_k, &kv->v[l]);
        }
        if (st == FERRY_OK) {
            char name[FERRY_MAX_NAME];
            snprintf(name, sizeof(name), "cache_k_l%d", l);
            ferry_tensor_set_name(kv->k[l], name);
            snprintf(name, sizeof(name), "cache_v_l%d", l);
            ferry_tensor_set_name(kv->v[l], name);
        }
    }
    if (st != FERRY_OK) {
        ferry_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return FERRY_OK;
}

ferry_status ferry_kv_cache_new_layers(const ferry_kv_params * params, ferry_buffer_type * host_buft,
                                      ferry_buffer_type * const * layer_bufts, const int64_t * layer_cells,
                                      ferry_kv_cache ** out) {
    FERRY_CHECK_ARG(out, "kv_cache_new: NULL output");
    ferry_kv_cache * kv;
    FERRY_TRY(lay_out(params, layer_cells, &kv));
    kv->host_buft = host_buft;
    for (int32_t l = 0; l < params->n_layer; l++) {
        kv->layer_buft[l] = layer_bufts && layer_bufts[l] ? layer_bufts[l] : host_buft;
    }
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < params->n_layer; l++) {
        bool seen = kv->layer_buft[l] == NULL;
        for (int32_t e = 0; !seen && e < l; e++) {
            seen = kv->layer_buft[e] == kv->layer_buft[l];
        }
        if (!seen) {
            st = allocate(kv, kv->layer_buft[l]);
        }
    }
    if (st != FERRY_OK) {
        ferry_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return FERRY_OK;
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
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < params->n_layer; l++) {
        if (!k_bufs[l] || !v_bufs[l]) {
            st = ferry_fail(FERRY_ERR_INVALID_ARG, "kv_cache_new_over: layer %d has no %s buffer", l,
                            k_bufs[l] ? "V" : "K");
        } else if (ferry_buffer_get_type(k_bufs[l]) != ferry_buffer_get_type(v_bufs[l])) {
            st = ferry_fail(FERRY_ERR_INVALID_ARG, "kv_cache_new_over: layer %d's K and V are in buffers of "
                            "different types; a layer lives in one memory", l);
        }
        if (st == FERRY_OK && (ferry_buffer_place_tensor(k_bufs[l], kv->k[l], k_offsets[l]) != FERRY_OK ||
                               ferry_buffer_place_tensor(v_bufs[l], kv->v[l], v_offsets[l]) != FERRY_OK)) {
            char why[256];
            snprintf(why, sizeof(why), "%s", ferry_last_error());
            st = ferry_fail(ferry_last_status(), "kv_cache_new_over: layer %d: %s", l, why);
        }
        if (st == FERRY_OK) {
            kv->layer_buft[l] = ferry_buffer_get_type(k_bufs[l]);
            kv->layer_buf[l] = k_bufs[l];
        }
    }
    if (st != FERRY_OK) {
        ferry_kv_cache_free(kv);
        return st;
    }
    *out = kv;
    return FERRY_OK;
}

ferry_status ferry_kv_cache_params(const ferry_kv_cache * kv, ferry_kv_params * out) {
    FERRY_CHECK_ARG(kv && out, "kv_cache_params: NULL argument");
    *out = kv->params;
    return FERRY_OK;
}

int64_t ferry_kv_cache_kv_size(const ferry_kv_cache * kv) { return kv ? kv->kv_size : 0; }

ferry_buffer * ferry_kv_cache_buffer(const ferry_kv_cache * kv) {
    for (int i = 0; kv && i < kv->n_buffers; i++) {
        if (ferry_buffer_get_type(kv->buffers[i]) == kv->host_buft) {
            return kv->buffers[i];
        }
    }
    return NULL;
}

static ferry_status check_layer(const ferry_kv_cache * kv, int32_t layer, const void * out) {
    FERRY_CHECK_ARG(kv && out, "kv_cache: NULL argument");
    if (layer < 0 || layer >= kv->params.n_layer) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache: layer %d is not in 0..%d", layer, kv->params.n_layer - 1);
    }
    return FERRY_OK;
}

ferry_status ferry_kv_cache_k(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out) {
    FERRY_TRY(check_layer(kv, layer, out));
    *out = kv->k[layer];
    return FERRY_OK;
}

ferry_status ferry_kv_cache_v(const ferry_kv_cache * kv, int32_t layer, ferry_tensor ** out) {
    FERRY_TRY(check_layer(kv, layer, out));
    *out = kv->v[layer];
    return FERRY_OK;
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
    FERRY_TRY(ferry_tensor_view(ctx, v ? kv->v[layer] : kv->k[layer], FERRY_MAX_DIMS, ne, nb, offset, &view));
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
    return kv && layer >= 0 && layer < kv->params.n_layer ? kv->layer_buft[layer] : NULL;
}

ferry_buffer * ferry_kv_cache_layer_buffer(const ferry_kv_cache * kv, int32_t layer) {
    return kv && layer >= 0 && layer < kv->params.n_layer ? kv->layer_buf[layer] : NULL;
}

ferry_status ferry_kv_cache_layer_n_kv(const ferry_kv_cache * kv, int32_t layer, int64_t n_kv, int64_t * out) {
    FERRY_TRY(check_layer(kv, layer, out));
    if (n_kv <= 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_cache_layer_n_kv: n_kv %lld is not positive", (long long) n_kv);
    }
    *out = n_kv < kv->layer_kv[layer] ? n_kv : kv->layer_kv[layer];
    return FERRY_OK;
}
