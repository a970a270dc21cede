/*
 * The CUDA buffer types: device buffers (cudaMalloc), the pinned ranges ferry knows
 * (cudaHostRegister and cudaMallocHost) that the gather copy may read, and pinned host
 * buffers (cudaMallocHost). The public layer (buffer.c, backend.c, transfer.c) has
 * checked bounds and counts bytes, so nothing here does either.
 */
#include "cuda-common.h"

#include <cstdio>
#include <cstdlib>
#include <pthread.h>

#define FERRY_CUDA_ALIGNMENT 256 /* what cudaMalloc guarantees */

/* ---------------------------------------------------------------- device buffers */

/* Blocking transfers of the buffer interface run on the per-thread stream, so they do
 * not wait for (or hold up) the legacy default stream, then wait for themselves. */
static ferry_status sync_per_thread(const char * what) {
    CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), what);
    return FERRY_OK;
}

static void device_free(ferry_buffer * buf) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    if (!ctx->borrowed) {
        cudaSetDevice(ctx->device);
        cudaFree(ctx->base); /* an error here has no one to report to */
        cudaGetLastError();
    }
    free(ctx);
}

static void * device_base(const ferry_buffer * buf) { return ((device_buffer_ctx *) buf->context)->base; }

static ferry_status device_memset(ferry_buffer * buf, ferry_tensor * t, uint8_t value, size_t offset, size_t size) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "memset_tensor: cudaSetDevice");
    CUDA_TRY(cudaMemsetAsync(tensor_at(t, offset), value, size, cudaStreamPerThread), "memset_tensor: cudaMemsetAsync");
    return sync_per_thread("memset_tensor: cudaStreamSynchronize");
}

static ferry_status device_set(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "set_tensor: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(tensor_at(t, offset), data, size, cudaMemcpyDefault, cudaStreamPerThread),
             "set_tensor: cudaMemcpyAsync");
    return sync_per_thread("set_tensor: cudaStreamSynchronize");
}

static ferry_status device_get(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset, size_t size) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "get_tensor: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(data, tensor_at(t, offset), size, cudaMemcpyDefault, cudaStreamPerThread),
             "get_tensor: cudaMemcpyAsync");
    return sync_per_thread("get_tensor: cudaStreamSynchronize");
}

static ferry_status device_set_2d(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                  size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "set_tensor_2d: cudaSetDevice");
    CUDA_TRY(ferry_cuda_copy_2d(tensor_at(t, offset), stride_tensor, data, stride_data, size, n_copies,
                                cudaStreamPerThread),
             "set_tensor_2d: cudaMemcpy2DAsync");
    return sync_per_thread("set_tensor_2d: cudaStreamSynchronize");
}

static ferry_status device_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                  size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "get_tensor_2d: cudaSetDevice");
    CUDA_TRY(ferry_cuda_copy_2d(data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies,
                                cudaStreamPerThread),
             "get_tensor_2d: cudaMemcpy2DAsync");
    return sync_per_thread("get_tensor_2d: cudaStreamSynchronize");
}

bool ferry_cuda_is_device_buffer(const ferry_buffer * buf) {
    return buf && buf->iface.free_buffer == device_free;
}

/* Device to device, this device or a peer; other sources take the generic path. */
static ferry_status device_cpy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    if (!ferry_cuda_is_device_buffer(src_buf)) {
        return FERRY_ERR_UNSUPPORTED; /* no message: the caller falls back */
    }
    const int src_dev = ((device_buffer_ctx *) src_buf->context)->device;
    const int dst_dev = ((device_buffer_ctx *) buf->context)->device;
    const size_t n = ferry_tensor_nbytes(src);
    CUDA_TRY(cudaSetDevice(dst_dev), "cpy_tensor: cudaSetDevice");
    if (src_dev == dst_dev) {
        CUDA_TRY(cudaMemcpyAsync(ferry_tensor_data(dst), ferry_tensor_data(src), n, cudaMemcpyDeviceToDevice,
                                 cudaStreamPerThread),
                 "cpy_tensor: cudaMemcpyAsync");
    } else {
        CUDA_TRY(cudaMemcpyPeerAsync(ferry_tensor_data(dst), dst_dev, ferry_tensor_data(src), src_dev, n,
                                     cudaStreamPerThread),
                 "cpy_tensor: cudaMemcpyPeerAsync");
    }
    return sync_per_thread("cpy_tensor: cudaStreamSynchronize");
}

static ferry_status device_clear(ferry_buffer * buf, uint8_t value) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "clear: cudaSetDevice");
    CUDA_TRY(cudaMemsetAsync(ctx->base, value, buf->size, cudaStreamPerThread), "clear: cudaMemsetAsync");
    return sync_per_thread("clear: cudaStreamSynchronize");
}

static struct ferry_buffer_i device_buffer_iface() {
    struct ferry_buffer_i i = {};
    i.free_buffer = device_free;
    i.get_base = device_base;
    i.memset_tensor = device_memset;
    i.set_tensor = device_set;
    i.get_tensor = device_get;
    i.set_tensor_2d = device_set_2d;
    i.get_tensor_2d = device_get_2d;
    i.cpy_tensor = device_cpy;
    i.clear = device_clear;
    return i;
}

static const char * device_buft_name(const ferry_buffer_type * buft) {
    return ((const device_buft_ctx *) buft->context)->name;
}

static ferry_status device_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    const int device = ((device_buft_ctx *) buft->context)->device;
    char what[64];
    snprintf(what, sizeof(what), "CUDA%d: cudaMalloc of %zu bytes", device, size);
    CUDA_TRY(cudaSetDevice(device), "alloc_buffer: cudaSetDevice");
    void * base = nullptr;
    CUDA_TRY(cudaMalloc(&base, size ? size : 1), what); /* never a NULL base */
    auto * ctx = (device_buffer_ctx *) ferry_calloc(1, sizeof(device_buffer_ctx));
    if (!ctx) {
        cudaFree(base);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "alloc_buffer: out of memory");
    }
    ctx->device = device;
    ctx->base = base;
    const ferry_status st = ferry_buffer_init(buft, device_buffer_iface(), ctx, size, out);
    if (st != FERRY_OK) {
        cudaFree(base);
        free(ctx);
    }
    return st;
}

/* Is p memory of device, as CUDA sees it (device or managed memory)? */
static bool on_device(const void * p, int device) {
    cudaPointerAttributes attr = {};
    const bool ok = cudaPointerGetAttributes(&attr, p) == cudaSuccess &&
                    (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == device;
    cudaGetLastError();
    return ok;
}

extern "C" ferry_status ferry_cuda_buffer_from_ptr(int device, void * base, size_t size, ferry_buffer ** out) {
    FERRY_CHECK_ARG(out, "cuda_buffer_from_ptr: NULL output");
    FERRY_CHECK_ARG(base, "cuda_buffer_from_ptr: NULL base");
    ferry_buffer_type * buft = nullptr;
    FERRY_TRY(ferry_cuda_buffer_type(device, &buft)); /* checks the device */
    if (size > (size_t) INT64_MAX || (uintptr_t) base > UINTPTR_MAX - size) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_buffer_from_ptr: %zu bytes at %p run past the address space",
                          size, base);
    }
    /* CUDA tells where an address lies, not how far its allocation reaches: both ends are asked */
    if (!on_device(base, device) || (size > 1 && !on_device((const char *) base + size - 1, device))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_buffer_from_ptr: %zu bytes at %p are not memory of CUDA%d",
                          size, base, device);
    }
    auto * ctx = (device_buffer_ctx *) ferry_calloc(1, sizeof(device_buffer_ctx));
    if (!ctx) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "cuda_buffer_from_ptr: out of memory");
    }
    ctx->device = device;
    ctx->base = base;
    ctx->borrowed = true;
    const ferry_status st = ferry_buffer_init(buft, device_buffer_iface(), ctx, size, out);
    if (st != FERRY_OK) {
        free(ctx);
    }
    return st;
}

static size_t device_buft_alignment(const ferry_buffer_type *) { return FERRY_CUDA_ALIGNMENT; }
static bool device_buft_is_host(const ferry_buffer_type *) { return false; }

/* Memory of the type's device, which another library (DLPack, __cuda_array_interface__) reads there. */
static bool device_buft_get_memory(const ferry_buffer_type * buft, ferry_memory_kind * kind, int * device) {
    *kind = FERRY_MEMORY_CUDA;
    *device = ((const device_buft_ctx *) buft->context)->device;
    return true;
}

static device_buft_ctx device_buft_ctxs[FERRY_CUDA_MAX_DEVICES];
ferry_buffer_type ferry_cuda_device_bufts[FERRY_CUDA_MAX_DEVICES];
static pthread_once_t device_bufts_once = PTHREAD_ONCE_INIT;

static void init_device_bufts(void) {
    for (int d = 0; d < FERRY_CUDA_MAX_DEVICES; d++) {
        device_buft_ctxs[d].device = d;
        snprintf(device_buft_ctxs[d].name, sizeof(device_buft_ctxs[d].name), "CUDA%d", d);
        ferry_buffer_type_i i = {};
        i.get_name = device_buft_name;
        i.alloc_buffer = device_buft_alloc;
        i.get_alignment = device_buft_alignment;
        i.is_host = device_buft_is_host;
        i.get_memory = device_buft_get_memory;
        ferry_cuda_device_bufts[d].iface = i;
        ferry_cuda_device_bufts[d].context = &device_buft_ctxs[d];
    }
}

bool ferry_cuda_is_device_buft(const ferry_buffer_type * buft) {
    return buft && buft->iface.alloc_buffer == device_buft_alloc;
}

extern "C" ferry_status ferry_cuda_buffer_type(int device, ferry_buffer_type ** out) {
    FERRY_CHECK_ARG(out, "cuda_buffer_type: NULL output");
    FERRY_TRY(ferry_cuda_check_device(device, "cuda_buffer_type"));
    pthread_once(&device_bufts_once, init_device_bufts);
    *out = &ferry_cuda_device_bufts[device];
    return FERRY_OK;
}

/* ---------------------------------------------------------------- pinned ranges
 *
 * The pinned host memory ferry knows: CUDA_Host buffers and registered memory, each
 * with its extent. The gather copy reads host memory through the device's mapping, so
 * every byte of its rows must be mapped: cudaPointerGetAttributes says whether one
 * address is pinned but not how far its allocation reaches, and rows that ran from one
 * allocation into unpinned memory would fault the context. So the rule asks this list.
 */

struct pinned_range {
    const char * base;
    size_t size;
    bool mapped; /* the device reads it at its host address (UVA), so the kernel can */
};

static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static pinned_range * pinned_ranges;
static size_t pinned_n, pinned_cap;

/* Remember [base, base + size); false when out of memory (the range is then never gathered). */
static bool pinned_add(const void * base, size_t size) {
    void * dev = nullptr;
    const bool mapped = cudaHostGetDevicePointer(&dev, (void *) base, 0) == cudaSuccess && dev == base;
    cudaGetLastError();
    pthread_mutex_lock(&pinned_lock);
    auto * grown = (pinned_range *) ferry_grow(pinned_ranges, &pinned_cap, pinned_n + 1, sizeof(pinned_range));
    const bool ok = grown != nullptr;
    if (ok) {
        pinned_ranges = grown;
        pinned_ranges[pinned_n++] = {(const char *) base, size, mapped};
    }
    pthread_mutex_unlock(&pinned_lock);
    return ok;
}

/* The range registered at base, or pinned_n if none; the caller holds pinned_lock. */
static size_t pinned_find(const void * base) {
    size_t i = 0;
    while (i < pinned_n && pinned_ranges[i].base != base) {
        i++;
    }
    return i;
}

/* Was a range registered at base? */
static bool pinned_has(const void * base) {
    pthread_mutex_lock(&pinned_lock);
    const bool found = pinned_find(base) < pinned_n;
    pthread_mutex_unlock(&pinned_lock);
    return found;
}

static bool pinned_remove(const void * base) {
    pthread_mutex_lock(&pinned_lock);
    const size_t i = pinned_find(base);
    const bool found = i < pinned_n;
    if (found) {
        pinned_ranges[i] = pinned_ranges[--pinned_n];
    }
    if (pinned_n == 0) { /* nothing left: give the array back, so no leak is reported */
        free(pinned_ranges);
        pinned_ranges = nullptr;
        pinned_cap = 0;
    }
    pthread_mutex_unlock(&pinned_lock);
    return found;
}

/* Is [p, p + len) inside one pinned range the device reads at its host address? */
bool ferry_cuda_pinned_mapped(const void * p, size_t len) {
    const uintptr_t lo = (uintptr_t) p;
    pthread_mutex_lock(&pinned_lock);
    bool inside = false;
    for (size_t i = 0; i < pinned_n && !inside; i++) {
        const pinned_range * r = &pinned_ranges[i];
        const uintptr_t base = (uintptr_t) r->base;
        inside = r->mapped && lo >= base && lo - base <= r->size && len <= r->size - (lo - base);
    }
    pthread_mutex_unlock(&pinned_lock);
    return inside;
}

extern "C" ferry_status ferry_cuda_host_register(void * ptr, size_t size) {
    FERRY_CHECK_ARG(ptr && size > 0, "cuda_host_register: NULL pointer or empty range");
    FERRY_TRY(ferry_cuda_check_device(0, "cuda_host_register (pinned memory needs a CUDA device)"));
    char what[80];
    snprintf(what, sizeof(what), "cuda_host_register: cudaHostRegister of %zu bytes", size);
    CUDA_TRY(cudaHostRegister(ptr, size, cudaHostRegisterPortable | cudaHostRegisterMapped), what);
    if (!pinned_add(ptr, size)) {
        cudaHostUnregister(ptr);
        cudaGetLastError();
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "cuda_host_register: out of memory");
    }
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_host_unregister(void * ptr) {
    FERRY_CHECK_ARG(ptr, "cuda_host_unregister: NULL pointer");
    if (!pinned_has(ptr)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_host_unregister: %p was not registered", ptr);
    }
    /* Registered memory is mapped on every device: any of them may still be reading it. */
    int current = 0, n = 0;
    CUDA_TRY(cudaGetDevice(&current), "cuda_host_unregister: cudaGetDevice");
    CUDA_TRY(ferry_cuda_count_devices(&n), "cuda_host_unregister: cudaGetDeviceCount");
    for (int d = 0; d < n; d++) {
        CUDA_TRY(cudaSetDevice(d), "cuda_host_unregister: cudaSetDevice");
        CUDA_TRY(cudaDeviceSynchronize(), "cuda_host_unregister: cudaDeviceSynchronize");
    }
    CUDA_TRY(cudaSetDevice(current), "cuda_host_unregister: cudaSetDevice");
    if (!pinned_remove(ptr)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_host_unregister: %p was not registered", ptr);
    }
    CUDA_TRY(cudaHostUnregister(ptr), "cuda_host_unregister: cudaHostUnregister");
    return FERRY_OK;
}

/* ---------------------------------------------------------------- pinned host buffers */

static const char * host_buft_name(const ferry_buffer_type *) { return "CUDA_Host"; }

static void host_release(void * base) {
    pinned_remove(base);
    cudaFreeHost(base);
    cudaGetLastError();
}

/* Pinned memory is plain host memory to the CPU: the host buffer does its transfers. */
static ferry_status host_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    char what[64];
    snprintf(what, sizeof(what), "CUDA_Host: cudaMallocHost of %zu bytes", size);
    void * base = nullptr;
    CUDA_TRY(cudaMallocHost(&base, size ? size : 1), what);
    pinned_add(base, size); /* out of memory here only means its copies are never gathered */
    const ferry_status st = ferry_host_buffer_wrap(buft, base, size, host_release, out);
    if (st != FERRY_OK) {
        host_release(base);
    }
    return st;
}

static size_t host_buft_alignment(const ferry_buffer_type *) { return FERRY_CUDA_ALIGNMENT; }
static bool host_buft_is_host(const ferry_buffer_type *) { return true; }

static ferry_buffer_type host_buft = {
    {host_buft_name, host_buft_alloc, host_buft_alignment, nullptr, nullptr, host_buft_is_host, nullptr, nullptr},
    nullptr,
};

extern "C" ferry_status ferry_cuda_host_buffer_type(ferry_buffer_type ** out) {
    FERRY_CHECK_ARG(out, "cuda_host_buffer_type: NULL output");
    FERRY_TRY(ferry_cuda_check_device(0, "cuda_host_buffer_type (pinned memory needs a CUDA device)"));
    *out = &host_buft;
    return FERRY_OK;
}
