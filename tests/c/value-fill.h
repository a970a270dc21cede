/* Tensors filled with a fixed pattern of values in [-1, 1], in the tensor's own type: the
 * fixtures of the step tests (test_step.c, test_multidev.c) fill their caches with it, so
 * that their outputs can be compared from one test program to the next. */
#ifndef FERRY_VALUE_FILL_H
#define FERRY_VALUE_FILL_H

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

#endif
