/* The spine every KV cache stands on (kv-layers.h): its layers' tensors, memory and buffers. */
#include "kv-layers.h"
#include "ferry-impl.h"

#include <stdio.h>
#include <stdlib.h>

ferry_status ferry_kv_check_types(const char * what, const ferry_kv_heads * h) {
    if (!ferry_type_valid(h->type_k) || !ferry_type_valid(h->type_v)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "%s: %s %d is not a type", what,
                          ferry_type_valid(h->type_k) ? "type_v" : "type_k",
                          (int) (ferry_type_valid(h->type_k) ? h->type_v : h->type_k));
    }
    return FERRY_OK;
}

ferry_status ferry_kv_check_rows(const char * what, const ferry_kv_heads * h) {
    size_t r;
    if (ferry_row_size(h->type_k, h->head_dim, &r) != FERRY_OK) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: head_dim %lld is not whole %s blocks of %lld values (type_k)", what,
                          (long long) h->head_dim, ferry_type_name(h->type_k), (long long) ferry_blck_size(h->type_k));
    }
    if (h->v_trans && ferry_blck_size(h->type_v) != 1) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: a transposed V (v_trans) cannot be %s (type_v): cells would split "
                          "blocks", what, ferry_type_name(h->type_v));
    }
    if (!h->v_trans && ferry_row_size(h->type_v, h->head_dim, &r) != FERRY_OK) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: head_dim %lld is not whole %s blocks of %lld values (type_v)", what,
                          (long long) h->head_dim, ferry_type_name(h->type_v), (long long) ferry_blck_size(h->type_v));
    }
    return FERRY_OK;
}

void ferry_kv_layers_free(ferry_kv_layers * layers) {
    for (int i = 0; layers->buffers && i < layers->n_buffers; i++) {
        ferry_buffer_free(layers->buffers[i]);
    }
    ferry_context_free(layers->ctx);
    free(layers->k);
    free(layers->v);
    free(layers->buft);
    free(layers->buf);
    free(layers->buffers);
}

/* Layer l's K and V, shaped by the layout and named after it. */
static ferry_status make_layer(ferry_kv_layers * layers, int32_t l, const void * cache) {
    const ferry_kv_layout * layout = layers->layout;
    int64_t ne_k[FERRY_MAX_DIMS] = {0}, ne_v[FERRY_MAX_DIMS];
    layout->k_shape(cache, l, ne_k);
    for (int d = 0; d < FERRY_MAX_DIMS; d++) {
        ne_v[d] = ne_k[d];
    }
    if (layers->heads.v_trans) { /* one row of cells per channel */
        ne_v[0] = ne_k[1];
        ne_v[1] = ne_k[0];
    }
    FERRY_TRY(ferry_tensor_new(layers->ctx, layers->heads.type_k, layout->n_dims, ne_k, &layers->k[l]));
    FERRY_TRY(ferry_tensor_new(layers->ctx, layers->heads.type_v, layout->n_dims, ne_v, &layers->v[l]));
    char name[FERRY_MAX_NAME];
    snprintf(name, sizeof(name), "%s_k_l%d", layout->tensors, l);
    ferry_tensor_set_name(layers->k[l], name);
    snprintf(name, sizeof(name), "%s_v_l%d", layout->tensors, l);
    ferry_tensor_set_name(layers->v[l], name);
    return FERRY_OK;
}

ferry_status ferry_kv_layers_make(ferry_kv_layers * layers, const ferry_kv_layout * layout,
                                  const ferry_kv_heads * heads, int32_t n_layer, const void * cache) {
    const size_t n = (size_t) n_layer;
    layers->layout = layout;
    layers->heads = *heads;
    layers->n_layer = n_layer;
    layers->k = ferry_calloc(n, sizeof(*layers->k));
    layers->v = ferry_calloc(n, sizeof(*layers->v));
    layers->buft = ferry_calloc(n, sizeof(*layers->buft));
    layers->buf = ferry_calloc(n, sizeof(*layers->buf));
    layers->buffers = ferry_calloc(n, sizeof(*layers->buffers));
    if (!layers->k || !layers->v || !layers->buft || !layers->buf || !layers->buffers) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s_new: out of memory", layout->what);
    }
    FERRY_TRY(ferry_context_new(&layers->ctx));
    for (int32_t l = 0; l < n_layer; l++) {
        FERRY_TRY(make_layer(layers, l, cache));
    }
    return FERRY_OK;
}

/* Place the K and V of every layer of buft back to back in one new buffer, each at the
 * buffer type's alignment: one buffer per buffer type, not one per layer. */
static ferry_status allocate(ferry_kv_layers * layers, ferry_buffer_type * buft) {
    const size_t align = ferry_buffer_type_alignment(buft) ? ferry_buffer_type_alignment(buft) : 1;
    size_t total = 0;
    for (int32_t l = 0; l < layers->n_layer; l++) {
        ferry_tensor * pair[2] = {layers->k[l], layers->v[l]};
        for (int i = 0; i < 2 && layers->buft[l] == buft; i++) {
            size_t rounded;
            if (!ferry_add_ok(ferry_buffer_type_alloc_size(buft, pair[i]), align - 1, &rounded) ||
                !ferry_add_ok(total, rounded / align * align, &total)) {
                return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: %d layers of %s overflow a buffer's size",
                                  layers->layout->what, layers->n_layer, layers->layout->pair);
            }
        }
    }
    ferry_buffer * buf;
    FERRY_TRY(ferry_buffer_type_alloc_buffer(buft, total, &buf));
    layers->buffers[layers->n_buffers++] = buf;
    /* A new cache reads zeros, not what its memory held before (llama.cpp clears its KV buffers
     * too); the buffer's own clear, so device memory is cleared where it lies. */
    FERRY_TRY(ferry_buffer_clear(buf, 0));
    size_t offset = 0;
    for (int32_t l = 0; l < layers->n_layer; l++) {
        ferry_tensor * pair[2] = {layers->k[l], layers->v[l]};
        for (int i = 0; i < 2 && layers->buft[l] == buft; i++) {
            FERRY_TRY(ferry_buffer_place_tensor(buf, pair[i], offset));
            offset += (ferry_buffer_type_alloc_size(buft, pair[i]) + align - 1) / align * align;
            layers->buf[l] = buf;
        }
    }
    return FERRY_OK;
}

ferry_status ferry_kv_layers_place(ferry_kv_layers * layers, ferry_buffer_type * host_buft,
                                   ferry_buffer_type * const * layer_bufts) {
    for (int32_t l = 0; l < layers->n_layer; l++) {
        layers->buft[l] = layer_bufts && layer_bufts[l] ? layer_bufts[l] : host_buft;
        if (!layers->buft[l] && !layers->layout->may_leave_unplaced) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s_new: layer %d has no buffer type (host_buft is NULL)",
                              layers->layout->what, l);
        }
    }
    for (int32_t l = 0; l < layers->n_layer; l++) {
        bool seen = layers->buft[l] == NULL;
        for (int32_t e = 0; !seen && e < l; e++) {
            seen = layers->buft[e] == layers->buft[l];
        }
        if (!seen) {
            FERRY_TRY(allocate(layers, layers->buft[l]));
        }
    }
    return FERRY_OK;
}

ferry_status ferry_kv_layers_place_over(ferry_kv_layers * layers, ferry_buffer * const * k_bufs,
                                        const size_t * k_offsets, ferry_buffer * const * v_bufs,
                                        const size_t * v_offsets) {
    const ferry_kv_layout * layout = layers->layout;
    for (int32_t l = 0; l < layers->n_layer; l++) {
        if (!k_bufs[l] || !v_bufs[l]) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s_new_over: layer %d has no %s%s buffer", layout->what, l,
                              k_bufs[l] ? "V" : "K", layout->one);
        }
        if (ferry_buffer_get_type(k_bufs[l]) != ferry_buffer_get_type(v_bufs[l])) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s_new_over: layer %d's %s are in buffers of different types; "
                              "a layer lives in one memory", layout->what, l, layout->pair);
        }
        if (ferry_buffer_place_tensor(k_bufs[l], layers->k[l], k_offsets[l]) != FERRY_OK ||
            ferry_buffer_place_tensor(v_bufs[l], layers->v[l], v_offsets[l]) != FERRY_OK) {
            char why[256];
            snprintf(why, sizeof(why), "%s", ferry_last_error());
            return ferry_fail(ferry_last_status(), "%s_new_over: layer %d: %s", layout->what, l, why);
        }
        layers->buft[l] = ferry_buffer_get_type(k_bufs[l]);
        layers->buf[l] = k_bufs[l];
    }
    return FERRY_OK;
}

ferry_status ferry_kv_layers_check(const ferry_kv_layers * layers, int32_t layer, const char * what) {
    if (layer < 0 || layer >= layers->n_layer) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: layer %d is not in 0..%d", what, layer, layers->n_layer - 1);
    }
    return FERRY_OK;
}

ferry_status ferry_kv_layers_tensor(const ferry_kv_layers * layers, int32_t layer, bool v, ferry_tensor ** out,
                                    const char * what) {
    FERRY_CHECK_ARG(out, "%s: NULL argument", what);
    FERRY_TRY(ferry_kv_layers_check(layers, layer, what));
    *out = v ? layers->v[layer] : layers->k[layer];
    return FERRY_OK;
}

ferry_buffer_type * ferry_kv_layers_buffer_type(const ferry_kv_layers * layers, int32_t layer) {
    return layer >= 0 && layer < layers->n_layer ? layers->buft[layer] : NULL;
}

ferry_buffer * ferry_kv_layers_buffer(const ferry_kv_layers * layers, int32_t layer) {
    return layer >= 0 && layer < layers->n_layer ? layers->buf[layer] : NULL;
}
