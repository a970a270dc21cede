/*
 * The CUDA backend's small general helpers: CUDA errors as statuses, the device count
 * and check, and the 2-D copy (cudaMemcpy2DAsync, or a row loop past the device's
 * largest pitch). The other CUDA sources reach them through cuda-common.h.
 */
#include "cuda-common.h"

#include <climits>

/* ---------------------------------------------------------------- errors */

/* Errors after which the process's CUDA context is lost: every later call returns them. */
static bool is_sticky(cudaError_t err) {
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

static const char sticky_note[] =
    "; the error is sticky: this process's CUDA context is lost, and no further work can run on the device"
    " (only a new process can use it again)";

ferry_status ferry_cuda_fail(cudaError_t err, const char * what) {
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    const ferry_status st = err == cudaErrorMemoryAllocation ? FERRY_ERR_OUT_OF_MEMORY : FERRY_ERR_BACKEND;
    return ferry_fail(st, "%s: %s (%s)%s", what, cudaGetErrorString(err), cudaGetErrorName(err),
                      is_sticky(err) ? sticky_note : "");
}

ferry_status ferry_cuda_check_context(const char * what) {
    const cudaError_t err = cudaPeekAtLastError();
    if (is_sticky(err)) {
        return ferry_fail(FERRY_ERR_BACKEND, "%s: refused: an earlier CUDA error, %s (%s)%s", what,
                          cudaGetErrorString(err), cudaGetErrorName(err), sticky_note);
    }
    return FERRY_OK;
}

/* The device count; no driver or no device is an error with CUDA's reason. */
cudaError_t ferry_cuda_count_devices(int * out) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    *out = n;
    return err;
}

ferry_status ferry_cuda_check_device(int device, const char * what) {
    int n;
    const cudaError_t err = ferry_cuda_count_devices(&n);
    if (err != cudaSuccess) {
        return ferry_fail(FERRY_ERR_BACKEND, "%s: no usable CUDA device: %s (%s)", what, cudaGetErrorString(err),
                          cudaGetErrorName(err));
    }
    if (n == 0) {
        return ferry_fail(FERRY_ERR_BACKEND, "%s: no CUDA device found", what);
    }
    if (device < 0 || device >= n || device >= FERRY_CUDA_MAX_DEVICES) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: no CUDA device %d (%d found)", what, device, n);
    }
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_device_count(int * out) {
    FERRY_CHECK_ARG(out, "cuda_device_count: NULL output");
    ferry_cuda_count_devices(out); /* no driver or no device: none usable, not the caller's failure */
    return FERRY_OK;
}

extern "C" bool ferry_cuda_available(void) {
    int n = 0;
    return ferry_cuda_count_devices(&n) == cudaSuccess && n > 0;
}

/* The largest pitch a 2-D copy takes on the current device (cudaDevAttrMaxPitch, about
 * 2 GiB), read once per device; INT_MAX where it cannot be read. */
static size_t max_pitch(void) {
    static size_t known[FERRY_CUDA_MAX_DEVICES]; /* 0: not read yet */
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= FERRY_CUDA_MAX_DEVICES) {
        cudaGetLastError();
        return INT_MAX;
    }
    size_t p = __atomic_load_n(&known[dev], __ATOMIC_RELAXED);
    if (p == 0) {
        p = cudaDeviceGetAttribute(&v, cudaDevAttrMaxPitch, dev) == cudaSuccess && v > 0 ? (size_t) v : INT_MAX;
        cudaGetLastError();
        __atomic_store_n(&known[dev], p, __ATOMIC_RELAXED);
    }
    return p;
}

/* One 2-D copy on the current device; pitches past its limit take a row loop instead
 * (the runtime's error for them is not documented, so they are not tried). */
cudaError_t ferry_cuda_copy_2d(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                               size_t height, cudaStream_t stream) {
    const size_t limit = max_pitch();
    cudaError_t err = cudaSuccess;
    if (dpitch <= limit && spitch <= limit) {
        err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, stream);
        if (err != cudaErrorInvalidPitchValue) {
            return err;
        }
        cudaGetLastError();
        err = cudaSuccess;
    }
    for (size_t i = 0; i < height && err == cudaSuccess; i++) {
        err = cudaMemcpyAsync((char *) dst + i * dpitch, (const char *) src + i * spitch, width, cudaMemcpyDefault,
                              stream);
    }
    return err;
}
