/* A kernel that keeps a stream busy for a while (ferry_cuda_backend_hold in ferry/cuda.h). */
#include "cuda-ops.h"

/* Waits cycles of its SM's clock. clock64() counts every cycle of the SM it runs on (its one
 * thread stays there), where %globaltimer ticks as coarsely as a microsecond or more on some
 * devices and under some virtual machines. The cycles are the wait at the device's peak clock
 * (ferry_cuda_hold): a clock running below its peak only waits longer, never less. */
static __global__ void hold_kernel(unsigned long long cycles) {
    const long long c0 = clock64();
    while ((unsigned long long) (clock64() - c0) < cycles) {
        __nanosleep(1000);
    }
}

cudaError_t ferry_cuda_hold(double microseconds, int clock_khz, cudaStream_t stream) {
    /* kHz: clock_khz / 1000 cycles a microsecond */
    hold_kernel<<<1, 1, 0, stream>>>((unsigned long long) (microseconds * clock_khz / 1000.0));
    return cudaGetLastError();
}
