/*
 * What the host sources of the CUDA backend share (cuda-device.cu, cuda-buffers.cu,
 * cuda-backend.cu). C++ only because nvcc compiles them; their surface is the C
 * functions of ferry.h. Every CUDA error becomes a status carrying CUDA's message:
 * nothing here aborts or exits.
 */
#ifndef FERRY_CUDA_COMMON_H
#define FERRY_CUDA_COMMON_H

#include "backend-impl.h"

#include <cuda_runtime.h>

/* The devices ferry addresses: the per-device buffer types and pitch limits are arrays of it. */
#define FERRY_CUDA_MAX_DEVICES 16

/* CUDA's error as a status with CUDA's message (cuda-device.cu); CUDA_TRY returns it. */
ferry_status ferry_cuda_fail(cudaError_t err, const char * what);

/* FERRY_ERR_BACKEND with a clear message after a sticky CUDA error (a launch failure, an
 * illegal address): the context is lost and the backend refuses work instead of trying it. */
ferry_status ferry_cuda_check_context(const char * what);

#define CUDA_TRY(call, what)                               \
    do {                                                   \
        const cudaError_t cuda_try_err_ = (call);          \
        if (cuda_try_err_ != cudaSuccess) {                \
            return ferry_cuda_fail(cuda_try_err_, (what)); \
        }                                                  \
    } while (0)

/* The device count and CUDA's error (cuda-device.cu): host_unregister syncs every device. */
cudaError_t ferry_cuda_count_devices(int * out);
/* FERRY_OK if device is usable, else why, after what (cuda-device.cu): every buffer type and the backend check. */
ferry_status ferry_cuda_check_device(int device, const char * what);
/* One 2-D copy on the current device (cuda-device.cu): the buffers' blocking copies and the backend's queued ones. */
cudaError_t ferry_cuda_copy_2d(void * dst, size_t dpitch, const void * src, size_t spitch,
                               size_t width, size_t height, cudaStream_t stream);

/* Where offset bytes into t's data lie: every transfer, in the buffers and the backend, starts there. */
static inline char * tensor_at(const ferry_tensor * t, size_t offset) { return (char *) ferry_tensor_data(t) + offset; }

/* The device buffer types' and buffers' contexts (cuda-buffers.cu): the backend reads their device. */
struct device_buft_ctx {
    int device;
    char name[16];
};

struct device_buffer_ctx {
    int device;
    void * base;
    bool borrowed; /* another library's memory (ferry_cuda_buffer_from_ptr): never cudaFree'd here */
};

/* One buffer type per device (cuda-buffers.cu), made by ferry_cuda_buffer_type: the backend's default. */
extern ferry_buffer_type ferry_cuda_device_bufts[FERRY_CUDA_MAX_DEVICES];
/* Is this a CUDA device buffer / buffer type (cuda-buffers.cu)? The backend's copies and buffer check ask. */
bool ferry_cuda_is_device_buffer(const ferry_buffer * buf);
bool ferry_cuda_is_device_buft(const ferry_buffer_type * buft);

/* Is [p, p + len) inside one pinned range the device maps (cuda-buffers.cu)? The gather rule asks. */
bool ferry_cuda_pinned_mapped(const void * p, size_t len);

#endif
