/* The CUDA kernels the backend runs (ops-cuda.cu): decode attention and dup. C++ only,
 * shared by the two CUDA sources of this folder. */
#ifndef FERRY_CUDA_OPS_H
#define FERRY_CUDA_OPS_H

#include "ferry-impl.h"

#include <cuda_runtime.h>

/* Does the CUDA backend run this node (views and leafs: nothing to run, so yes)? */
bool ferry_cuda_op_supported(const ferry_tensor * node);
/* Queue one node on stream; its tensors are in memory the device can read. CUDA errors
 * become FERRY_ERR_BACKEND with CUDA's message. */
ferry_status ferry_cuda_compute_node(ferry_tensor * node, cudaStream_t stream);

#endif
