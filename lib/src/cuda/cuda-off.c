/* The CUDA entry points of a build without CUDA: declared in ferry/cuda.h in every build so
 * the binding's cdef is one file; each says plainly that CUDA is not compiled in. */
#include "backend-impl.h"

#define NO_CUDA(what) ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: ferry was built without CUDA (meson -Dcuda=disabled " \
                                 "or no nvcc found)", what)

ferry_status ferry_cuda_device_count(int * out) {
    FERRY_CHECK_ARG(out, "cuda_device_count: NULL output");
    *out = 0;
    return FERRY_OK;
}

ferry_status ferry_cuda_backend_new(int device, ferry_backend ** out) {
    (void) device, (void) out;
    return NO_CUDA("cuda_backend_new");
}

ferry_status ferry_cuda_backend_device(const ferry_backend * backend, int * out) {
    (void) backend, (void) out;
    return NO_CUDA("cuda_backend_device");
}

ferry_status ferry_cuda_buffer_type(int device, ferry_buffer_type ** out) {
    (void) device, (void) out;
    return NO_CUDA("cuda_buffer_type");
}

ferry_status ferry_cuda_host_buffer_type(ferry_buffer_type ** out) {
    (void) out;
    return NO_CUDA("cuda_host_buffer_type");
}

ferry_status ferry_cuda_host_register(void * ptr, size_t size) {
    (void) ptr, (void) size;
    return NO_CUDA("cuda_host_register");
}

ferry_status ferry_cuda_host_unregister(void * ptr) {
    (void) ptr;
    return NO_CUDA("cuda_host_unregister");
}

/* The defaults are plain values, the same in every build. */
ferry_cuda_gather_params ferry_cuda_gather_default_params(void) {
    return (ferry_cuda_gather_params) {.on = false, .loads_per_thread = 4, .min_pitch = 64 << 10, .min_row = 256};
}

ferry_status ferry_cuda_backend_set_gather(ferry_backend * backend, const ferry_cuda_gather_params * params) {
    (void) backend, (void) params;
    return NO_CUDA("cuda_backend_set_gather");
}

ferry_status ferry_cuda_backend_get_gather(const ferry_backend * backend, ferry_cuda_gather_params * params,
                                           uint64_t * copies) {
    (void) backend, (void) params, (void) copies;
    return NO_CUDA("cuda_backend_get_gather");
}

ferry_status ferry_cuda_backend_set_fold(ferry_backend * backend, size_t fold_above) {
    (void) backend, (void) fold_above;
    return NO_CUDA("cuda_backend_set_fold");
}

ferry_status ferry_cuda_backend_get_fold(const ferry_backend * backend, size_t * fold_above, uint64_t * copies) {
    (void) backend, (void) fold_above, (void) copies;
    return NO_CUDA("cuda_backend_get_fold");
}

ferry_status ferry_cuda_backend_hold(ferry_backend * backend, double microseconds) {
    (void) backend, (void) microseconds;
    return NO_CUDA("cuda_backend_hold");
}

ferry_status ferry_cuda_buffer_from_ptr(int device, void * base, size_t size, ferry_buffer ** out) {
    (void) device, (void) base, (void) size, (void) out;
    return NO_CUDA("cuda_buffer_from_ptr");
}

bool ferry_cuda_available(void) { return false; }
