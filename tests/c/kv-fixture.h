/* A host KV cache with a long-period pattern and a split backend whose buffer holds a
 * sentinel: the setting of the ordered copy tests. */
#ifndef FERRY_KV_FIXTURE_H
#define FERRY_KV_FIXTURE_H

#include "check.h"

#include <stdint.h>

#define SENTINEL 0xA5

static inline uint8_t kv_pattern(size_t i) { return (uint8_t) ((i * 2654435761u) >> 11) ^ (uint8_t) (i >> 16); }

typedef struct {
    ferry_backend * cpu;
    ferry_backend * split; /* dummy, real memory: not host to anyone */
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * split_buf;
} kv_fixture;

/* Fill every byte of the cache's buffer with the pattern of its offset. */
static inline ferry_status kv_fill(ferry_kv_cache * kv) {
    ferry_buffer * buf = ferry_kv_cache_buffer(kv);
    uint8_t * base = ferry_buffer_base(buf);
    for (size_t i = 0; i < ferry_buffer_size(buf); i++) {
        base[i] = kv_pattern(i);
    }
    return FERRY_OK;
}

static inline ferry_status kv_fixture_init(kv_fixture * f, const ferry_kv_params * p) {
    memset(f, 0, sizeof(*f));
    ferry_status st = ferry_cpu_backend_new(&f->cpu);
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    if (st == FERRY_OK) st = ferry_dummy_backend_new(&dp, &f->split);
    if (st == FERRY_OK) st = ferry_kv_cache_new(p, ferry_backend_default_buffer_type(f->cpu), &f->kv);
    if (st == FERRY_OK) st = kv_fill(f->kv);
    if (st == FERRY_OK) st = ferry_context_new(&f->ctx);
    return st;
}

/* A same-layout copy of src on the split backend, every byte of its span a sentinel. */
static inline ferry_status kv_split_copy(kv_fixture * f, const ferry_tensor * src, ferry_tensor ** out) {
    ferry_status st = ferry_tensor_dup_layout(f->ctx, src, out);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->split, ferry_tensor_nbytes(src), &f->split_buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->split_buf, *out, 0);
    if (st == FERRY_OK) st = ferry_buffer_clear(f->split_buf, SENTINEL);
    if (st == FERRY_OK) ferry_buffer_reset_stats(f->split_buf);
    return st;
}

static inline void kv_fixture_free(kv_fixture * f) {
    ferry_buffer_free(f->split_buf);
    ferry_kv_cache_free(f->kv);
    ferry_context_free(f->ctx);
    ferry_backend_free(f->split);
    ferry_backend_free(f->cpu);
}

#endif
