/* The CUDA kernels the backend (cuda-backend.cu) runs (ops-cuda.cu: decode attention and dup;
 * copy-gather.cu: the gather copy and a paged window's gather; hold.cu: a stream held busy). C++ only, shared by the CUDA
 * sources of this folder; the host sources' own shared helpers are in cuda-common.h. */
#ifndef FERRY_CUDA_OPS_H
#define FERRY_CUDA_OPS_H

#include "backend-impl.h"

#include <cuda_runtime.h>

/* Does the CUDA backend run this node (views and leafs: nothing to run, so yes)? */
bool ferry_cuda_op_supported(const ferry_tensor * node);
/* Queue one node on stream; its tensors are in memory the device can read. CUDA errors
 * become FERRY_ERR_BACKEND with CUDA's message. */
ferry_status ferry_cuda_compute_node(ferry_tensor * node, cudaStream_t stream);

/* The gather copy (copy-gather.cu): height rows of width bytes from src (pinned host
 * memory as the device maps it, or device memory) at spitch to dst at dpitch, by a
 * kernel on stream. src, dst, width and both pitches must be multiples of 16; loads is
 * the 16-byte loads each thread keeps in flight, one of 1, 2, 4, 8, 16. */
bool ferry_cuda_gather_loads_ok(int loads);
cudaError_t ferry_cuda_gather_rows(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                                   size_t height, int loads, cudaStream_t stream);

/* A paged window's gather in one launch (copy-gather.cu): piece i moves count rows of size bytes
 * from src (pinned host memory as the device maps it, or device memory; rows src_stride apart) to
 * dst (device memory; rows dst_stride apart). Addresses absolute. */
struct ferry_cuda_piece {
    uint64_t src, dst, size, count, src_stride, dst_stride;
};
/* n pieces, their descriptors in device memory; units: the most 16-, 4- or 1-byte words a piece
 * moves (it sizes the grid). */
cudaError_t ferry_cuda_gather_pieces(const ferry_cuda_piece * pieces, uint64_t n, uint64_t units,
                                     cudaStream_t stream);

/* Queue on stream a one-thread kernel that waits microseconds on its SM's cycle counter,
 * clock_khz its device's peak clock (cudaDevAttrClockRate) (hold.cu). */
cudaError_t ferry_cuda_hold(double microseconds, int clock_khz, cudaStream_t stream);

#endif
