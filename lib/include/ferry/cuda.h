/* ferry/cuda.h: the CUDA backend, declared in every build. */
#ifndef FERRY_CUDA_H
#define FERRY_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- CUDA backend (cuda/: cuda-device.cu,
 * cuda-backend.cu, cuda-buffers.cu; cuda-off.c when CUDA is not compiled in) */

/*
 * Declared in every build: without CUDA compiled in, the ferry_cuda_* functions fail
 * with FERRY_ERR_UNSUPPORTED (ferry_cuda_device_count gives 0), so the cdef is one file.
 */

/* Devices ferry can use: 0, with FERRY_OK, when there is no device or no driver. */
FERRY_API ferry_status ferry_cuda_device_count(int * out);
/* A backend with its own stream on a device. Fails (FERRY_ERR_BACKEND) with CUDA's
 * message when there is no usable device. */
FERRY_API ferry_status ferry_cuda_backend_new(int device, ferry_backend ** out);
/* The device a CUDA backend runs on; FERRY_ERR_INVALID_ARG for other backends. */
FERRY_API ferry_status ferry_cuda_backend_device(const ferry_backend * backend, int * out);
/* Device memory (cudaMalloc) of a device: one buffer type per device, never freed. */
FERRY_API ferry_status ferry_cuda_buffer_type(int device, ferry_buffer_type ** out);
/* Pinned host memory (cudaMallocHost): host memory, so the CPU backend uses it too. */
FERRY_API ferry_status ferry_cuda_host_buffer_type(ferry_buffer_type ** out);
/* Host memory the caller owns, pinned and mapped for every device (cudaHostRegister)
 * until unregistered; it must stay allocated until then. Copies from it run at the
 * pinned rate, and the gather copy may read it. */
FERRY_API ferry_status ferry_cuda_host_register(void * ptr, size_t size);
/* Unregistering first lets every device finish its queued work, which may still read
 * the memory (a copy or gather kernel in flight). */
FERRY_API ferry_status ferry_cuda_host_unregister(void * ptr);
/*
 * The gather copy, an option of each CUDA backend, off by default: the 2-D copy is the
 * default, and tools/cuda_window_bench.c times the two against each other. FERRY_CUDA_GATHER=1
 * in the environment turns it on, with the default rule, for backends made afterwards.
 * With it on, a 2-D set from host memory (ferry_backend_tensor_set_2d_async, so the
 * scheduler's copy path) is a kernel that reads the rows through the device's mapping
 * of the host memory, instead of one cudaMemcpy2DAsync, when all of these hold: the
 * source rows lie in one pinned range ferry knows (a CUDA_Host buffer or memory given
 * to ferry_cuda_host_register), their pitch is at least min_pitch, rows are at least
 * min_row bytes, and both addresses, the row and both pitches are multiples of 16 B.
 * Otherwise, and always with it off, the copy is one cudaMemcpy2DAsync.
 */
typedef struct {
    bool   on;               /* default false */
    int    loads_per_thread; /* 16-byte loads each thread keeps in flight: 1, 2, 4, 8 or 16; default 4 */
    size_t min_pitch;        /* default 64 KiB: on the H200 one 2-D copy runs at the floor up to 32 KiB */
    size_t min_row;          /* default 256 B */
} ferry_cuda_gather_params;

FERRY_API ferry_cuda_gather_params ferry_cuda_gather_default_params(void);
FERRY_API ferry_status ferry_cuda_backend_set_gather(ferry_backend * backend, const ferry_cuda_gather_params * params);
/* The backend's gather option, and how many 2-D sets the kernel has carried out on it
 * (either output may be NULL). */
FERRY_API ferry_status ferry_cuda_backend_get_gather(const ferry_backend * backend, ferry_cuda_gather_params * params,
                                           uint64_t * copies);

/*
 * The folded copy, another option of each CUDA backend, off by default like the gather
 * copy (tools/cuda_window_bench.c times it as way fold3d). On the H200 one 2-D copy runs
 * at the contiguous rate up to a 32 KiB pitch and 1.5x off it at 64 KiB, as if the copy
 * engine's pitch had a limit. With fold_above > 0, a 2-D set or get whose pitch on either
 * side is at least fold_above goes as one cudaMemcpy3DAsync of the same rows: that side's
 * pitch divided by the smallest k with pitch % k == 0, row <= pitch / k < fold_above, and
 * slices of k such pitches. Where no such k exists, the plain 2-D copy. The environment's
 * FERRY_CUDA_FOLD=<bytes> sets fold_above for backends made afterwards.
 */
FERRY_API ferry_status ferry_cuda_backend_set_fold(ferry_backend * backend, size_t fold_above);
/* The backend's fold_above, and how many copies it has folded (either output may be NULL). */
FERRY_API ferry_status ferry_cuda_backend_get_fold(const ferry_backend * backend, size_t * fold_above, uint64_t * copies);

/*
 * A timing aid: queue on the backend's stream a kernel that waits `microseconds` (0 to
 * 1e6) on the device. Work queued behind it while it waits starts back to back, so events
 * recorded around that work time the device alone, not the host's submission of it
 * (tools/cuda_window_bench.c holds the stream before each timed copy).
 */
FERRY_API ferry_status ferry_cuda_backend_hold(ferry_backend * backend, double microseconds);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_CUDA_H */
