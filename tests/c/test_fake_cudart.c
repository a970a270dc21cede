/*
 * The fake CUDA runtime's own strictness (tests/fake-cudart), which the CUDA tests run
 * against without a GPU rely on: work on a stream runs only when waited for, device
 * memory is closed to the host, device ranges stay inside their allocation, pageable
 * copies follow CUDA's staging rules, kernels fail as a status. Built only with
 * -Dfake_cudart=true, linked to the fake directly (libferry keeps its symbols hidden).
 */
#define _DEFAULT_SOURCE
#include "check.h"

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 4096

/* A pinned destination holds the old bytes until the stream is waited for. */
static void test_work_runs_when_waited_for(void) {
    void *dev, *pinned;
    char host[N];
    memset(host, 7, N);
    CHECK(cudaMalloc(&dev, N) == cudaSuccess);
    CHECK(cudaMallocHost(&pinned, N) == cudaSuccess);
    memset(pinned, 0, N);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev, host, N, cudaMemcpyDefault, s) == cudaSuccess);
    memset(host, 9, N); /* a pageable source was taken at the call: this does not travel */
    CHECK(cudaMemcpyAsync(pinned, dev, N, cudaMemcpyDefault, s) == cudaSuccess);
    CHECK(((char *) pinned)[0] == 0 && ((char *) pinned)[N - 1] == 0);
    cudaEvent_t e;
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(e, s) == cudaSuccess);
    cudaStream_t other;
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(other, e, 0) == cudaSuccess);
    CHECK(((char *) pinned)[0] == 0); /* a wait queued on another stream waits too */
    CHECK(cudaStreamSynchronize(other) == cudaSuccess);
    CHECK(((char *) pinned)[0] == 7 && ((char *) pinned)[N - 1] == 7);
    /* a pageable destination is written before the call returns */
    char back[N];
    CHECK(cudaMemcpyAsync(back, dev, N, cudaMemcpyDefault, s) == cudaSuccess);
    CHECK(back[0] == 7 && back[N - 1] == 7);
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e, e) == cudaErrorInvalidResourceHandle); /* not a timing event */
    cudaGetLastError();
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
    cudaFreeHost(pinned);
    cudaFree(dev);
}

/* The host touching device memory is a segfault, in a child so the test goes on. */
static void test_device_memory_closed_to_host(void) {
    void * dev;
    CHECK(cudaMalloc(&dev, N) == cudaSuccess);
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the signal into an exit */
        volatile char c = ((volatile char *) dev)[0];
        (void) c;
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
    cudaFree(dev);
}

/* Device ranges must lie in one allocation; pitches below the width are refused. */
static void test_bad_ranges_refused(void) {
    void * dev;
    char host[2 * N];
    CHECK(cudaMalloc(&dev, N) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dev, host, N + 1, cudaMemcpyDefault, 0) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess); /* read once, then cleared */
    CHECK(cudaMemcpy2DAsync(dev, 64, host, 64, 128, 2, cudaMemcpyDefault, 0) == cudaErrorInvalidPitchValue);
    CHECK(cudaMemcpy2DAsync(dev, 1024, host, 1024, 64, 5, cudaMemcpyDefault, 0) == cudaErrorInvalidValue);
    CHECK(cudaMemsetAsync((char *) dev + N - 8, 0, 16, 0) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy2DAsync(dev, 1024, host, 1024, 64, 4, cudaMemcpyDefault, 0) == cudaSuccess);
    void * none = NULL;
    CHECK(cudaMalloc(&none, (size_t) 1 << 52) == cudaErrorMemoryAllocation && none == NULL);
    cudaGetLastError();
    CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    cudaFree(dev);
}

/* A 3-D copy of linear memory: row y of slice z at ptr + (z * ysize + y) * pitch. */
static void test_a_3d_copy_lays_each_slices_rows_at_their_pitch(void) {
    char src[8 * 16], dst[8 * 16];
    for (int i = 0; i < (int) sizeof(src); i++) src[i] = (char) i;
    memset(dst, -1, sizeof(dst));
    struct cudaMemcpy3DParms p = {0};
    p.srcPtr = (struct cudaPitchedPtr) {src, 16, 16, 2}; /* slices of 2 rows of 16 B */
    p.dstPtr = (struct cudaPitchedPtr) {dst, 8, 8, 2};
    p.extent = (struct cudaExtent) {4, 2, 4}; /* 4 B of 2 rows in 4 slices */
    p.kind = cudaMemcpyDefault;
    CHECK(cudaMemcpy3DAsync(&p, 0) == cudaSuccess);
    for (int z = 0; z < 4; z++) {
        for (int y = 0; y < 2; y++) {
            CHECK(memcmp(dst + (z * 2 + y) * 8, src + (z * 2 + y) * 16, 4) == 0);
            CHECK(dst[(z * 2 + y) * 8 + 4] == -1); /* the rest of the row untouched */
        }
    }
    p.dstPtr.ysize = 1; /* slices too short for 2 rows */
    CHECK(cudaMemcpy3DAsync(&p, 0) == cudaErrorInvalidValue);
    cudaGetLastError();
}

/* nvcc's launch stubs reach the fake, which runs nothing and says so. */
static void test_kernels_fail_as_status(void) {
    cudaKernel_t k = NULL;
    extern cudaError_t __cudaGetKernel(cudaKernel_t *, const void *);
    extern cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
    static const char fake_fn = 0;
    CHECK(__cudaGetKernel(&k, &fake_fn) == cudaSuccess);
    const dim3 one = {1, 1, 1};
    CHECK(__cudaLaunchKernel(k, one, one, NULL, 0, 0) == cudaErrorNoKernelImageForDevice);
    CHECK(cudaGetLastError() == cudaErrorNoKernelImageForDevice);
    CHECK(strstr(cudaGetErrorString(cudaErrorNoKernelImageForDevice), "fake") != NULL);
}

static const check_test tests[] = {
    {"work_runs_when_waited_for", test_work_runs_when_waited_for},
    {"device_memory_closed_to_host", test_device_memory_closed_to_host},
    {"bad_ranges_refused", test_bad_ranges_refused},
    {"a_3d_copy_lays_each_slices_rows_at_their_pitch", test_a_3d_copy_lays_each_slices_rows_at_their_pitch},
    {"kernels_fail_as_status", test_kernels_fail_as_status},
};

CHECK_MAIN(tests)
