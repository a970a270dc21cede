/* Tensors filled with a fixed pattern of values in [-1, 1], in the tensor's own type: the
 * fixtures of the step tests (test_step.c, test_multidev.c) fill their caches with it, so
 * that their outputs can be compared from one test program to the next. */
#ifndef FERRY_VALUE_FILL_H
#define FERRY_VALUE_FILL_H

#include <stdint.h>
#include <stdlib.h>

#include "ferry.h"

static inline float pattern_value(unsigned i) { return (float) ((i * 2654435761u) % 2001u) / 1000.0f - 1.0f; }

/* Fill t with the pattern's values from seed on, converted to t's type. */
static inline ferry_status fill_values(ferry_tensor * t, unsigned seed) {
    const size_t n = (size_t) ferry_tensor_nelements(t), nbytes = ferry_tensor_nbytes(t);
    float * v = malloc(n * sizeof(float));
    void * bytes = malloc(nbytes);
    ferry_status st = v && bytes ? FERRY_OK : FERRY_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; st == FERRY_OK && i < n; i++) v[i] = pattern_value(seed + (unsigned) i);
    if (st == FERRY_OK) st = ferry_quantize(t->type, v, (int64_t) n, bytes, nbytes);
    if (st == FERRY_OK) st = ferry_tensor_set(t, bytes, 0, nbytes);
    free(v);
    free(bytes);
    return st;
}

/* Fill every layer's K and V: layer l's K with the pattern from seed 1000 l, its V from
 * 1000 l + 500000. */
static inline ferry_status fill_cache(ferry_kv_cache * kv, int32_t n_layer) {
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        ferry_tensor *k, *v;
        st = ferry_kv_cache_k(kv, l, &k);
        if (st == FERRY_OK) st = ferry_kv_cache_v(kv, l, &v);
        if (st == FERRY_OK) st = fill_values(k, 1000u * (unsigned) l);
        if (st == FERRY_OK) st = fill_values(v, 1000u * (unsigned) l + 500000u);
    }
    return st;
}

/* One f32 query of shape ne_q per layer, placed back to back in buf (q_bytes each) and filled
 * with the pattern from seed 7 + 100 l. */
static inline ferry_status place_queries(ferry_context * ctx, ferry_buffer * buf, int32_t n_layer,
                                         const int64_t ne_q[4], size_t q_bytes, ferry_tensor ** q) {
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]);
        if (st == FERRY_OK) st = ferry_buffer_place_tensor(buf, q[l], (size_t) l * q_bytes);
        if (st == FERRY_OK) st = fill_values(q[l], 7u + 100u * (unsigned) l);
    }
    return st;
}

#endif
