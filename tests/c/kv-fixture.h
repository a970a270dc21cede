/* The setting of the ordered copy tests: a host KV cache filled with a long-period
 * pattern, a split backend whose copy of a window starts as a sentinel, and the check
 * of docs/design.md's heart test. Any split backend: dummy or CUDA. */
#ifndef FERRY_KV_FIXTURE_H
#define FERRY_KV_FIXTURE_H

#include "check.h"

#include <stdint.h>

#define SENTINEL 0xA5

static inline uint8_t kv_pattern(size_t i) { return (uint8_t) ((i * 2654435761u) >> 11) ^ (uint8_t) (i >> 16); }

typedef struct {
    ferry_backend * cpu;
    ferry_backend * split;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * split_buf;
} kv_fixture;

/* Fill every byte of the cache's (host) buffer with the pattern of its offset. */
static inline void kv_fill(ferry_kv_cache * kv) {
    ferry_buffer * buf = ferry_kv_cache_buffer(kv);
    uint8_t * base = ferry_buffer_base(buf);
    for (size_t i = 0; i < ferry_buffer_size(buf); i++) {
        base[i] = kv_pattern(i);
    }
}

/* The cache in cache_buft (NULL: the CPU's), split the given backend (the fixture owns it). */
static inline ferry_status kv_fixture_init_on(kv_fixture * f, const ferry_kv_params * p, ferry_backend * split,
                                              ferry_buffer_type * cache_buft) {
    memset(f, 0, sizeof(*f));
    f->split = split;
    ferry_status st = ferry_cpu_backend_new(&f->cpu);
    if (st == FERRY_OK) st = ferry_kv_cache_new(p, cache_buft ? cache_buft : ferry_cpu_buffer_type(), &f->kv);
    if (st == FERRY_OK) kv_fill(f->kv);
    if (st == FERRY_OK) st = ferry_context_new(&f->ctx);
    return st;
}

/* The split backend: a dummy with real memory, not host to anyone. */
static inline ferry_status kv_fixture_init(kv_fixture * f, const ferry_kv_params * p) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend * split = NULL;
    const ferry_status st = ferry_dummy_backend_new(&dp, &split);
    if (st != FERRY_OK) {
        memset(f, 0, sizeof(*f));
        return st;
    }
    return kv_fixture_init_on(f, p, split, NULL);
}

/* A same-layout copy of src on the split backend, every byte of its span a sentinel. */
static inline ferry_status kv_split_copy(kv_fixture * f, const ferry_tensor * src, ferry_tensor ** out) {
    ferry_status st = ferry_tensor_dup_layout(f->ctx, src, out);
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->split, ferry_tensor_nbytes(src), &f->split_buf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->split_buf, *out, 0);
    if (st == FERRY_OK) st = ferry_tensor_memset(*out, SENTINEL, 0, ferry_tensor_nbytes(src));
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

/*
 * The heart test's three assertions on a copied window, read back through the public API.
 * window: the K window of streams s0.. (used cells each) in the cache; copy: its copy
 * after the copy path ran; bytes_moved: what the copy path says it moved. Returns 0
 * when all hold, else the first that failed: 1 bytes moved != bytes read, 2 a stream's
 * range did not arrive whole from its own source offset, 3 a gap lost its sentinel.
 */
static inline int kv_check_window_copy(const kv_fixture * f, const ferry_tensor * window, const ferry_tensor * copy,
                                       uint64_t bytes_moved) {
    const size_t ns = (size_t) window->ne[3];
    const size_t stride = ns > 1 ? window->nb[3] : 0;
    size_t row = 0;
    ferry_row_size(window->type, window->ne[0] * window->ne[2], &row); /* head_dim * n_head_kv */
    const size_t range = (size_t) window->ne[1] * row;
    const size_t span = ferry_tensor_nbytes(copy);
    const size_t src_base = (size_t) ((char *) window->data - (char *) ferry_buffer_base(ferry_kv_cache_buffer(f->kv)));
    uint8_t * got = malloc(span);
    if (!got || ferry_tensor_get(copy, got, 0, span) != FERRY_OK) {
        fprintf(stderr, "  reading the copy back: %s\n", ferry_last_error());
        free(got);
        return -1;
    }
    int failed = 0;
    if (bytes_moved != ns * range) {
        fprintf(stderr, "  moved %llu bytes where the graph reads %zu\n", (unsigned long long) bytes_moved, ns * range);
        failed = 1;
    }
    for (size_t s = 0; s < ns && !failed; s++) {
        for (size_t b = 0; b < range; b++) {
            if (got[s * stride + b] != kv_pattern(src_base + s * stride + b)) {
                fprintf(stderr, "  stream %zu byte %zu did not arrive from its own source offset\n", s, b);
                failed = 2;
                break;
            }
        }
    }
    for (size_t s = 0; s + 1 < ns && !failed; s++) {
        for (size_t b = range; b < stride; b++) {
            if (got[s * stride + b] != SENTINEL) {
                fprintf(stderr, "  gap byte %zu after stream %zu was overwritten\n", b, s);
                failed = 3;
                break;
            }
        }
    }
    free(got);
    return failed;
}

/*
 * The heart test of a ragged window: window (in the cache, carrying used cells) copied into copy
 * (its layout, or its compact layout). used[s]: the cells of stream s the copy must hold. Returns
 * 0 when all holds, else the first that failed: 1 bytes moved != the used cells' bytes, 2 a
 * used cell did not arrive whole from its own source offset, 3 any other byte of the copy lost
 * its sentinel; -1 if the copy could not be read.
 */
static inline int kv_check_used_copy(const kv_fixture * f, const ferry_tensor * window, const ferry_tensor * copy,
                                     const int64_t * used, uint64_t bytes_moved) {
    const size_t span = ferry_tensor_nbytes(copy);
    const size_t src_base = (size_t) ((char *) window->data - (char *) ferry_buffer_base(ferry_kv_cache_buffer(f->kv)));
    const size_t block = ferry_type_size(window->type);
    const int64_t n0 = window->ne[0] / ferry_blck_size(window->type);
    const int cell = window->used_cell_dim, stream = window->used_stream_dim;
    uint8_t * got = malloc(span + 1);
    uint8_t * mark = calloc(span + 1, 1);
    if (!got || !mark || ferry_tensor_get(copy, got, 0, span) != FERRY_OK) {
        fprintf(stderr, "  reading the copy back: %s\n", ferry_last_error());
        free(got);
        free(mark);
        return -1;
    }
    uint64_t expected = 0;
    int wrong_source = 0, wrong_gap = 0;
    int64_t idx[4];
    for (idx[3] = 0; idx[3] < window->ne[3]; idx[3]++)
        for (idx[2] = 0; idx[2] < window->ne[2]; idx[2]++)
            for (idx[1] = 0; idx[1] < window->ne[1]; idx[1]++)
                for (idx[0] = 0; idx[0] < n0; idx[0]++) {
                    if (idx[cell] >= used[idx[stream]]) {
                        continue;
                    }
                    size_t so = 0, dof = 0;
                    for (int d = 0; d < 4; d++) {
                        so += (size_t) idx[d] * window->nb[d];
                        dof += (size_t) idx[d] * copy->nb[d];
                    }
                    for (size_t b = 0; b < block; b++) {
                        if (!mark[dof + b] && got[dof + b] != kv_pattern(src_base + so + b) && !wrong_source) {
                            fprintf(stderr, "  stream %lld cell %lld byte %zu did not arrive from its own source offset\n",
                                    (long long) idx[stream], (long long) idx[cell], b);
                            wrong_source = 1;
                        }
                        expected += !mark[dof + b];
                        mark[dof + b] = 1;
                    }
                }
    for (size_t i = 0; i < span && !wrong_gap; i++) {
        if (!mark[i] && got[i] != SENTINEL) {
            fprintf(stderr, "  byte %zu of the copy, in no stream's used cells, was overwritten\n", i);
            wrong_gap = 1;
        }
    }
    free(got);
    free(mark);
    if (bytes_moved != expected) {
        fprintf(stderr, "  moved %llu bytes where the used cells are %llu\n", (unsigned long long) bytes_moved,
                (unsigned long long) expected);
        return 1;
    }
    return wrong_source ? 2 : wrong_gap ? 3 : 0;
}

#endif
