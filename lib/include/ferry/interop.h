/* ferry/interop.h: values of every type as f32, buffers over memory other libraries own, and
 * DLPack, for exchanging tensors with numpy, PyTorch and CuPy. */
#ifndef FERRY_INTEROP_H
#define FERRY_INTEROP_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- values (quant.c) */

/*
 * Values of every type as f32. ferry_quantize writes n values of src (n a whole number of
 * blocks) as type into dst, which holds dst_size bytes: f32 as they are, f16 and bf16
 * rounded to nearest even, q8_0 and q4_0 as ggml's round-to-nearest reference writes
 * them, byte for byte (quant.c says how); those two take finite values only.
 * ferry_dequantize reads n values of type from src (src_size bytes) into dst. i32 holds
 * integers, not values: FERRY_ERR_UNSUPPORTED. Nothing is written on failure.
 */
FERRY_API ferry_status ferry_quantize(ferry_type type, const float * src, int64_t n, void * dst, size_t dst_size);
FERRY_API ferry_status ferry_dequantize(ferry_type type, const void * src, size_t src_size, int64_t n, float * dst);

/* ---------------------------------------------------------------- foreign memory (foreign-buffer.c;
 * cuda/cuda-buffers.cu, cuda/cuda-off.c when CUDA is not compiled in) */

/* Who reads a tensor's bytes directly, for exporting them to other libraries. */
typedef enum {
    FERRY_MEMORY_HOST = 0, /* the CPU, at data (pinned host memory included) */
    FERRY_MEMORY_CUDA = 1  /* a CUDA device, at the device address data */
} ferry_memory_kind;

/*
 * Where t's first byte is, and who can read it there (device: the CUDA device, else -1).
 * Fails as a transfer does for an unallocated tensor or a freed buffer, and with
 * FERRY_ERR_UNSUPPORTED, saying why, for memory that no one reads directly: synthetic
 * addresses, the stand-in device's and a dummy backend's device memory.
 */
FERRY_API ferry_status ferry_tensor_memory(const ferry_tensor * t, ferry_memory_kind * kind, int * device, void ** data);

/*
 * Buffers over memory another library owns (a numpy array, a PyTorch or CuPy tensor):
 * freeing the buffer leaves the memory alone, and the memory must outlive the buffer.
 * Host memory gets a buffer of the CPU buffer type (is_host). Device memory of a CUDA
 * device gets a buffer of ferry_cuda_buffer_type(device), so that device's backend
 * computes on it; FERRY_ERR_INVALID_ARG when CUDA says the range is not memory of that
 * device, FERRY_ERR_UNSUPPORTED without CUDA.
 */
FERRY_API ferry_status ferry_host_buffer_from_ptr(void * base, size_t size, ferry_buffer ** out);
FERRY_API ferry_status ferry_cuda_buffer_from_ptr(int device, void * base, size_t size, ferry_buffer ** out);

/* ---------------------------------------------------------------- DLPack (dlpack.c) */

/*
 * DLPack, for bindings that export tensors. The structs are DLPack's, declared
 * here in ferry's words: the unversioned managed tensor of the "dltensor" capsule (v0.8) and
 * the versioned one of "dltensor_versioned" (v1.0, which can say the memory is writable).
 * ferry_dlpack_new makes either, with room for ndim shapes and strides (shape and strides
 * point there); the binding fills the rest. Its deleter runs no code of the binding's: it
 * only marks the tensor deleted, so a consumer may call it anywhere (any thread, an
 * exception pending), and the binding lets go of what the export held once
 * ferry_dlpack_deleted says so, then calls ferry_dlpack_free. ferry_dlpack_capsule_destructor
 * is the capsule's destructor: a capsule that still has its first name was never consumed,
 * so it calls the deleter itself. It asks the name through the two Python C API functions
 * given to ferry_dlpack_set_capsule_api (PyCapsule_IsValid, PyCapsule_GetPointer).
 */
typedef struct {
    int32_t device_type; /* 1 host (kDLCPU), 2 CUDA (kDLCUDA), 3 pinned host (kDLCUDAHost) */
    int32_t device_id;
} ferry_dl_device;

typedef struct {
    uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat */
    uint8_t bits;
    uint16_t lanes;
} ferry_dl_dtype;

typedef struct {
    void * data;
    ferry_dl_device device;
    int32_t ndim;
    ferry_dl_dtype dtype;
    int64_t * shape;
    int64_t * strides; /* in elements; NULL: C order */
    uint64_t byte_offset;
} ferry_dl_tensor;

typedef struct ferry_dl_managed_tensor {
    ferry_dl_tensor dl_tensor;
    void * manager_ctx;
    void (*deleter)(struct ferry_dl_managed_tensor * self);
} ferry_dl_managed_tensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} ferry_dl_version;

enum { FERRY_DL_FLAG_READ_ONLY = 1, FERRY_DL_FLAG_IS_COPIED = 2 };

typedef struct ferry_dl_managed_tensor_versioned {
    ferry_dl_version version;
    void * manager_ctx;
    void (*deleter)(struct ferry_dl_managed_tensor_versioned * self);
    uint64_t flags;
    ferry_dl_tensor dl_tensor;
} ferry_dl_managed_tensor_versioned;

typedef int    (*ferry_capsule_is_valid_fn)(void * capsule, const char * name);
typedef void * (*ferry_capsule_pointer_fn)(void * capsule, const char * name);

/* *out: a ferry_dl_managed_tensor, or with versioned a ferry_dl_managed_tensor_versioned (1.0). */
FERRY_API ferry_status ferry_dlpack_new(int32_t ndim, bool versioned, void ** out);
FERRY_API bool         ferry_dlpack_deleted(const void * managed);
FERRY_API void         ferry_dlpack_free(void * managed);
FERRY_API ferry_status ferry_dlpack_set_capsule_api(ferry_capsule_is_valid_fn is_valid, ferry_capsule_pointer_fn pointer);
FERRY_API void         ferry_dlpack_capsule_destructor(void * capsule);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_INTEROP_H */
