/* A kernel that keeps a stream busy for a while (ferry_cuda_backend_hold in ferry/cuda.h). */
#include "cuda-ops.h"

/* The device's nanosecond clock: the same on every SM, unlike clock64(). */
static __device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Waits ns on the global clock. The SM's cycle count bounds the wait too (4 cycles a
 * nanosecond: longer than ns up to 4 GHz), so a clock that a virtual machine froze
 * cannot hang the stream. */
static __global__ void hold_kernel(unsigned long long ns) {
    const unsigned long long t0 = global_ns();
    const long long c0 = clock64();
    while (global_ns() - t0 < ns && (unsigned long long) (clock64() - c0) < 4 * ns) {
        __nanosleep(1000);
    }
}

cudaError_t ferry_cuda_hold(double microseconds, cudaStream_t stream) {
    hold_kernel<<<1, 1, 0, stream>>>((unsigned long long) (microseconds * 1000.0));
    return cudaGetLastError();
}
