/* ferry/common.h: limits, errors, and what was built. */
#ifndef FERRY_COMMON_H
#define FERRY_COMMON_H

#ifndef FERRY_CDEF
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#endif

/* The library's public functions: the only symbols libferry exports (it is built with
 * hidden visibility, so everything else in lib/src stays internal). */
#if defined(FERRY_CDEF) || !defined(__GNUC__)
#define FERRY_API
#else
#define FERRY_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Limits as enum constants, not macros, so the binding's cdef keeps their names. */
enum {
    FERRY_MAX_DIMS = 4,
    FERRY_MAX_SRC = 5,  /* paged attention reads five: q, two pools, the table, kv_len */
    FERRY_MAX_OP_PARAMS = 8,
    FERRY_MAX_NAME = 64
};

/* ---------------------------------------------------------------- errors (error.c) */

typedef enum {
    FERRY_OK = 0,
    FERRY_ERR_INVALID_ARG = 1,   /* a NULL pointer, a negative or zero size where one is needed */
    FERRY_ERR_OUT_OF_BOUNDS = 2, /* an offset or extent past the end of a tensor or buffer */
    FERRY_ERR_NOT_ALLOCATED = 3, /* a tensor with no memory behind it */
    FERRY_ERR_LAYOUT = 4,        /* shapes or strides that do not match what is asked */
    FERRY_ERR_UNKNOWN_TYPE = 5,
    FERRY_ERR_FREED = 6,         /* a buffer that was freed */
    FERRY_ERR_OUT_OF_MEMORY = 7,
    FERRY_ERR_UNSUPPORTED = 8,   /* the backend or buffer cannot do this */
    FERRY_ERR_BACKEND = 9,       /* the backend's own failure (a CUDA error, ...) */
    FERRY_STATUS_COUNT = 10
} ferry_status;

/* The message of the last failure on this thread ("" if none). */
FERRY_API const char * ferry_last_error(void);
FERRY_API ferry_status ferry_last_status(void);
FERRY_API void         ferry_clear_error(void);
FERRY_API const char * ferry_status_name(ferry_status status);

/* ---------------------------------------------------------------- build (build-info.c) */

/* Was CUDA compiled in, and is a device usable now? */
FERRY_API bool         ferry_built_with_cuda(void);
FERRY_API bool         ferry_cuda_available(void);
/* True only in a test build linked against tests/fake-cudart (meson -Dfake_cudart=true):
 * its "device" is host memory and its timings mean nothing. */
FERRY_API bool         ferry_built_with_fake_cudart(void);
FERRY_API const char * ferry_version(void);
/* sizeof(ferry_tensor) as compiled, so the binding can check its cdef agrees. */
FERRY_API size_t       ferry_sizeof_tensor(void);
FERRY_API size_t       ferry_sizeof_stats(void);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_COMMON_H */
