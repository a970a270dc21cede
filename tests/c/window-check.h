/* Cache values a scaled copy can be checked against exactly, and that check: the tests
 * that compute 0.5 * dup(window) through a scheduler (test_faults, test_cuda_faults,
 * test_threads, tools/soak.c) read the result back and compare every element with the window's. */
#ifndef FERRY_WINDOW_CHECK_H
#define FERRY_WINDOW_CHECK_H

#include "ferry.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* xorshift32: the same draws on every machine, for the tests' and the soak's fixed seeds */
static inline uint32_t next_random(uint32_t * state) {
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

/* Float i of the buffer holds i mod 4096: exact, and exactly halved. */
static inline void fill_floats(ferry_buffer * buf) {
    float * v = ferry_buffer_base(buf);
    for (size_t i = 0; i < ferry_buffer_size(buf) / sizeof(float); i++) {
        v[i] = (float) (i % 4096);
    }
}

/* out (contiguous f32, window's shape) == scale * window, element by element, window on the host. */
static inline bool scaled_copy_of(const ferry_tensor * out, const ferry_tensor * window, float scale) {
    const size_t n = (size_t) ferry_tensor_nelements(out);
    float * got = malloc(n * sizeof(float));
    bool same = got && ferry_tensor_get(out, got, 0, n * sizeof(float)) == FERRY_OK;
    size_t k = 0;
    for (int64_t i3 = 0; same && i3 < window->ne[3]; i3++)
        for (int64_t i2 = 0; same && i2 < window->ne[2]; i2++)
            for (int64_t i1 = 0; same && i1 < window->ne[1]; i1++)
                for (int64_t i0 = 0; same && i0 < window->ne[0]; i0++, k++) {
                    const char * p = (const char *) window->data + i0 * window->nb[0] + i1 * window->nb[1] +
                                     i2 * window->nb[2] + i3 * window->nb[3];
                    same = got[k] == scale * *(const float *) p;
                }
    free(got);
    return same;
}

#endif
