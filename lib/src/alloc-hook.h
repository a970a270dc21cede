/*
 * Every heap allocation of the library goes through these wrappers, so that a test build
 * (meson -Dfault_injection=true, which defines FERRY_FAULT_INJECTION) can make any one of
 * them fail on purpose: tests/c/test_faults.c fails the 1st, the 2nd, ... allocation of a
 * scenario in turn and checks that each failure is reported, leaks nothing and leaves the
 * objects usable. In a release build the wrappers are the C library's functions and the
 * hook does not exist.
 */
#ifndef FERRY_ALLOC_HOOK_H
#define FERRY_ALLOC_HOOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef FERRY_FAULT_INJECTION
/* True when the allocation being made is the one armed to fail (alloc-hook.c). */
bool ferry_fault_alloc_fails(void);
/* Make the nth allocation from now fail, once (n >= 1); n <= 0 disarms. Counting restarts. */
void ferry_fault_alloc_arm(long n);
/* Allocations made since the last arm, and whether the armed one failed. */
long ferry_fault_alloc_count(void);
bool ferry_fault_alloc_fired(void);
#define FERRY_ALLOC_FAILS() ferry_fault_alloc_fails()
#else
#define FERRY_ALLOC_FAILS() false
#endif

static inline void * ferry_malloc(size_t size) { return FERRY_ALLOC_FAILS() ? NULL : malloc(size); }
static inline void * ferry_calloc(size_t n, size_t size) { return FERRY_ALLOC_FAILS() ? NULL : calloc(n, size); }
/* Like realloc, a failure leaves p as it was. */
static inline void * ferry_realloc(void * p, size_t size) { return FERRY_ALLOC_FAILS() ? NULL : realloc(p, size); }
static inline void * ferry_aligned_alloc(size_t alignment, size_t size) {
    return FERRY_ALLOC_FAILS() ? NULL : aligned_alloc(alignment, size);
}

/* The one growable array: items (*cap of item_size bytes each) able to hold need of them.
 * items itself when it can, else a copy of twice the capacity (16 at least) and *cap
 * updated; NULL when out of memory or past size_t, items and *cap then as they were. */
static inline void * ferry_grow(void * items, size_t * cap, size_t need, size_t item_size) {
    if (need <= *cap) {
        return items;
    }
    size_t n = *cap ? *cap : 8;
    do {
        if (n > SIZE_MAX / 2 / item_size) {
            return NULL;
        }
        n *= 2;
    } while (n < need);
    void * grown = ferry_realloc(items, n * item_size);
    if (grown) {
        *cap = n;
    }
    return grown;
}

#ifdef __cplusplus
}
#endif

#endif /* FERRY_ALLOC_HOOK_H */
