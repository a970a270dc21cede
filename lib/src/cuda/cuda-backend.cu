/*
 * The CUDA backend: device buffers (cudaMalloc), pinned host buffers (cudaMallocHost),
 * a backend with its own stream that runs the kernels of ops-cuda.cu, and events. C++ only because nvcc compiles it; the
 * surface is the C functions of ferry.h. Every CUDA error becomes a status carrying
 * CUDA's message: nothing here aborts or exits. The public layer (buffer.c, backend.c,
 * transfer.c) has checked bounds and counts bytes, so nothing here does either.
 */
#include "cuda-ops.h"

#include <cuda_runtime.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>

#define FERRY_CUDA_MAX_DEVICES 16
#define FERRY_CUDA_ALIGNMENT 256 /* what cudaMalloc guarantees */

/* ---------------------------------------------------------------- errors */

static ferry_status cuda_fail(cudaError_t err, const char * what) {
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    const ferry_status st = err == cudaErrorMemoryAllocation ? FERRY_ERR_OUT_OF_MEMORY : FERRY_ERR_BACKEND;
    return ferry_fail(st, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

#define CUDA_TRY(call, what)                             \
    do {                                                 \
        const cudaError_t cuda_try_err_ = (call);        \
        if (cuda_try_err_ != cudaSuccess) {              \
            return cuda_fail(cuda_try_err_, (what));     \
        }                                                \
    } while (0)

/* The device count; no driver or no device is an error with CUDA's reason. */
static cudaError_t device_count(int * out) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        cudaGetLastError();
        n = 0;
    }
    *out = n;
    return err;
}

static ferry_status check_device(int device, const char * what) {
    int n;
    const cudaError_t err = device_count(&n);
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
    device_count(out); /* no driver or no device: none usable, not the caller's failure */
    return FERRY_OK;
}

/* build-info.c: ferry_cuda_available() */
extern "C" bool ferry_cuda_device_count_ok(void) {
    int n = 0;
    return device_count(&n) == cudaSuccess && n > 0;
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
static cudaError_t copy_2d(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width, size_t height,
                           cudaStream_t stream) {
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

static char * tensor_at(const ferry_tensor * t, size_t offset) { return (char *) ferry_tensor_data(t) + offset; }

/* ---------------------------------------------------------------- device buffers */

struct device_buft_ctx {
    int device;
    char name[16];
};

struct device_buffer_ctx {
    int device;
    void * base;
};

/* Blocking transfers of the buffer interface run on the per-thread stream, so they do
 * not wait for (or hold up) the legacy default stream, then wait for themselves. */
static ferry_status sync_per_thread(const char * what) {
    CUDA_TRY(cudaStreamSynchronize(cudaStreamPerThread), what);
    return FERRY_OK;
}

static void device_free(ferry_buffer * buf) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    cudaSetDevice(ctx->device);
    cudaFree(ctx->base); /* an error here has no one to report to */
    cudaGetLastError();
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
    CUDA_TRY(copy_2d(tensor_at(t, offset), stride_tensor, data, stride_data, size, n_copies, cudaStreamPerThread),
             "set_tensor_2d: cudaMemcpy2DAsync");
    return sync_per_thread("set_tensor_2d: cudaStreamSynchronize");
}

static ferry_status device_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                  size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    auto * ctx = (device_buffer_ctx *) buf->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "get_tensor_2d: cudaSetDevice");
    CUDA_TRY(copy_2d(data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies, cudaStreamPerThread),
             "get_tensor_2d: cudaMemcpy2DAsync");
    return sync_per_thread("get_tensor_2d: cudaStreamSynchronize");
}

static bool is_device_buffer(const ferry_buffer * buf) { return buf && buf->iface.free_buffer == device_free; }

/* Device to device, this device or a peer; other sources take the generic path. */
static ferry_status device_cpy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    if (!is_device_buffer(src_buf)) {
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
    auto * ctx = (device_buffer_ctx *) calloc(1, sizeof(device_buffer_ctx));
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

static size_t device_buft_alignment(const ferry_buffer_type *) { return FERRY_CUDA_ALIGNMENT; }
static bool device_buft_is_host(const ferry_buffer_type *) { return false; }

static device_buft_ctx device_buft_ctxs[FERRY_CUDA_MAX_DEVICES];
static ferry_buffer_type device_bufts[FERRY_CUDA_MAX_DEVICES];
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
        device_bufts[d].iface = i;
        device_bufts[d].context = &device_buft_ctxs[d];
    }
}

static bool is_device_buft(const ferry_buffer_type * buft) {
    return buft && buft->iface.alloc_buffer == device_buft_alloc;
}

extern "C" ferry_status ferry_cuda_buffer_type(int device, ferry_buffer_type ** out) {
    FERRY_CHECK_ARG(out, "cuda_buffer_type: NULL output");
    FERRY_TRY(check_device(device, "cuda_buffer_type"));
    pthread_once(&device_bufts_once, init_device_bufts);
    *out = &device_bufts[device];
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
    bool ok = true;
    if (pinned_n == pinned_cap) {
        const size_t cap = pinned_cap ? 2 * pinned_cap : 16;
        auto * grown = (pinned_range *) realloc(pinned_ranges, cap * sizeof(pinned_range));
        ok = grown != nullptr;
        if (ok) {
            pinned_ranges = grown;
            pinned_cap = cap;
        }
    }
    if (ok) {
        pinned_ranges[pinned_n++] = {(const char *) base, size, mapped};
    }
    pthread_mutex_unlock(&pinned_lock);
    return ok;
}

/* Was a range registered at base? */
static bool pinned_has(const void * base) {
    pthread_mutex_lock(&pinned_lock);
    bool found = false;
    for (size_t i = 0; i < pinned_n && !found; i++) {
        found = pinned_ranges[i].base == base;
    }
    pthread_mutex_unlock(&pinned_lock);
    return found;
}

static bool pinned_remove(const void * base) {
    pthread_mutex_lock(&pinned_lock);
    bool found = false;
    for (size_t i = 0; i < pinned_n && !found; i++) {
        if (pinned_ranges[i].base == base) {
            pinned_ranges[i] = pinned_ranges[--pinned_n];
            found = true;
        }
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
static bool pinned_mapped(const void * p, size_t len) {
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
    FERRY_TRY(check_device(0, "cuda_host_register (pinned memory needs a CUDA device)"));
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
    CUDA_TRY(device_count(&n), "cuda_host_unregister: cudaGetDeviceCount");
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
    {host_buft_name, host_buft_alloc, host_buft_alignment, nullptr, nullptr, host_buft_is_host},
    nullptr,
};

extern "C" ferry_status ferry_cuda_host_buffer_type(ferry_buffer_type ** out) {
    FERRY_CHECK_ARG(out, "cuda_host_buffer_type: NULL output");
    FERRY_TRY(check_device(0, "cuda_host_buffer_type (pinned memory needs a CUDA device)"));
    *out = &host_buft;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- the backend */

struct backend_ctx {
    int device;
    cudaStream_t stream;
    cudaEvent_t copy_event; /* orders a copy between two backends' streams */
    char name[16];
    ferry_cuda_gather_params gather; /* the gather copy option (ferry.h) */
    uint64_t gather_copies;          /* 2-D sets the kernel carried out */
    size_t fold_above;               /* the folded copy option (ferry.h): 0 off */
    uint64_t fold_copies;            /* 2-D copies issued as folded 3-D ones */
};

static backend_ctx * ctx_of(ferry_backend * backend) { return (backend_ctx *) backend->context; }

static const char * backend_name(const ferry_backend * backend) { return ((backend_ctx *) backend->context)->name; }

static void backend_free(ferry_backend * backend) {
    backend_ctx * ctx = ctx_of(backend);
    cudaSetDevice(ctx->device);
    cudaStreamSynchronize(ctx->stream); /* nothing may still read memory the caller frees next */
    cudaEventDestroy(ctx->copy_event);
    cudaStreamDestroy(ctx->stream);
    cudaGetLastError();
    free(ctx);
}

static ferry_buffer_type * backend_default_buft(ferry_backend * backend) { return &device_bufts[ctx_of(backend)->device]; }

/* Only its own device memory: kernels never read pinned host memory across the bus, so
 * a split on CUDA receives every host input by copy, as the scheduler measures it. */
static bool backend_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return is_device_buft(buft) && ((device_buft_ctx *) buft->context)->device == ctx_of(backend)->device;
}

/* Copies into the device are costed by SPEC.md's H200 anchors (copy-plan.c). */
static ferry_copy_cost_model backend_copy_cost_model(const ferry_backend * backend) {
    (void) backend;
    return ferry_copy_cost_model_gpu();
}

/* Transfers on the backend's stream (cudaMemcpyDefault): the source may be any memory. */
static ferry_status backend_set_async(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                      size_t size) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_set_async: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(tensor_at(t, offset), data, size, cudaMemcpyDefault, ctx->stream),
             "tensor_set_async: cudaMemcpyAsync");
    return FERRY_OK;
}

static ferry_status backend_get_async(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                      size_t size) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_get_async: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(data, tensor_at(t, offset), size, cudaMemcpyDefault, ctx->stream),
             "tensor_get_async: cudaMemcpyAsync");
    return FERRY_OK;
}

/* The gather rule's defaults (ferry.h), from SPEC.md's anchors: one 2-D copy runs at
 * the contiguous rate up to a 32 KiB pitch and 1.5x off it at 64 KiB. Rows under
 * 256 B are the copy engine's other weak spot, but they leave a warp's loads short:
 * not taken until measured. */
extern "C" ferry_cuda_gather_params ferry_cuda_gather_default_params(void) {
    ferry_cuda_gather_params p = {};
    p.on = false;
    p.loads_per_thread = 4;
    p.min_pitch = (size_t) 64 << 10;
    p.min_row = 256;
    return p;
}

static bool aligned16(size_t x) { return x % 16 == 0; }

static bool gather_applies(const backend_ctx * ctx, const ferry_tensor * t, const void * dst, const void * data,
                           size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    const ferry_cuda_gather_params * g = &ctx->gather;
    if (!g->on || n_copies < 2 || size < g->min_row || stride_data < g->min_pitch) {
        return false;
    }
    if (!aligned16((size_t) (uintptr_t) dst) || !aligned16((size_t) (uintptr_t) data) || !aligned16(size) ||
        !aligned16(stride_tensor) || !aligned16(stride_data)) {
        return false;
    }
    const ferry_buffer * buf = ferry_tensor_buffer(t);
    if (!is_device_buffer(buf) || ((device_buffer_ctx *) buf->context)->device != ctx->device) {
        return false; /* the kernel writes this device's memory only */
    }
    /* The public layer checked the tensor side, not the source: the span read is (n-1) pitches and a row. */
    size_t span;
    return ferry_mul_ok(n_copies - 1, stride_data, &span) && ferry_add_ok(span, size, &span) && pinned_mapped(data, span);
}

/* The k that folds a pitch under `above` (1: already under; 0: none): pitch % k == 0 and
 * row <= pitch / k < above, so slices of k pitches of pitch / k hold the same rows. */
static size_t fold_factor(size_t pitch, size_t row, size_t above) {
    if (pitch < above) {
        return 1;
    }
    for (size_t k = 2; pitch / k >= row; k++) {
        if (pitch % k == 0 && pitch / k < above) {
            return k;
        }
    }
    return 0;
}

/* The rows of a 2-D copy as one 3-D copy: height 1 in slices of k folded pitches, depth
 * the rows. Returns false (nothing queued) when the option is off or cannot fold. */
static bool copy_folded(backend_ctx * ctx, void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                        size_t height, cudaError_t * err) {
    if (!ctx->fold_above || height < 2 || (dpitch < ctx->fold_above && spitch < ctx->fold_above)) {
        return false;
    }
    const size_t kd = fold_factor(dpitch, width, ctx->fold_above), ks = fold_factor(spitch, width, ctx->fold_above);
    if (!kd || !ks) {
        return false;
    }
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr((void *) src, spitch / ks, width, ks);
    p.dstPtr = make_cudaPitchedPtr(dst, dpitch / kd, width, kd);
    p.extent = make_cudaExtent(width, 1, height);
    p.kind = cudaMemcpyDefault;
    *err = cudaMemcpy3DAsync(&p, ctx->stream);
    ctx->fold_copies += *err == cudaSuccess;
    return true;
}

/* One cudaMemcpy2DAsync moves every row: the copy engine walks the pitches itself,
 * which is what lets a range copy reach the contiguous rate (SPEC.md's anchors). With
 * the gather option on and its rule met, a kernel reads the rows instead. */
static ferry_status backend_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                         size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_set_2d_async: cudaSetDevice");
    char * dst = tensor_at(t, offset);
    if (gather_applies(ctx, t, dst, data, size, n_copies, stride_tensor, stride_data)) {
        CUDA_TRY(ferry_cuda_gather_rows(dst, stride_tensor, data, stride_data, size, n_copies, ctx->gather.loads_per_thread,
                                        ctx->stream),
                 "tensor_set_2d_async: gather kernel launch");
        ctx->gather_copies++;
        return FERRY_OK;
    }
    cudaError_t err;
    if (copy_folded(ctx, dst, stride_tensor, data, stride_data, size, n_copies, &err)) {
        CUDA_TRY(err, "tensor_set_2d_async: cudaMemcpy3DAsync (folded)");
        return FERRY_OK;
    }
    CUDA_TRY(copy_2d(dst, stride_tensor, data, stride_data, size, n_copies, ctx->stream),
             "tensor_set_2d_async: cudaMemcpy2DAsync");
    return FERRY_OK;
}

static ferry_status backend_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                         size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_get_2d_async: cudaSetDevice");
    cudaError_t err;
    if (copy_folded(ctx, data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies, &err)) {
        CUDA_TRY(err, "tensor_get_2d_async: cudaMemcpy3DAsync (folded)");
        return FERRY_OK;
    }
    CUDA_TRY(copy_2d(data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies, ctx->stream),
             "tensor_get_2d_async: cudaMemcpy2DAsync");
    return FERRY_OK;
}

static bool is_cuda_backend(const ferry_backend * backend) {
    return backend && backend->iface.get_name == backend_name;
}

/* Device to device on dst's stream, after what src's stream queued before it. */
static ferry_status backend_cpy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                      const ferry_tensor * src, ferry_tensor * dst) {
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    if (!is_cuda_backend(backend_src) || !is_device_buffer(src_buf) || !is_device_buffer(dst_buf)) {
        return FERRY_ERR_UNSUPPORTED; /* the caller takes the blocking path */
    }
    backend_ctx * sctx = ctx_of(backend_src);
    backend_ctx * dctx = ctx_of(backend_dst);
    const int src_dev = ((device_buffer_ctx *) src_buf->context)->device;
    const int dst_dev = ((device_buffer_ctx *) dst_buf->context)->device;
    if (backend_src != backend_dst) {
        CUDA_TRY(cudaSetDevice(sctx->device), "tensor_copy_async: cudaSetDevice");
        CUDA_TRY(cudaEventRecord(sctx->copy_event, sctx->stream), "tensor_copy_async: cudaEventRecord");
        CUDA_TRY(cudaSetDevice(dctx->device), "tensor_copy_async: cudaSetDevice");
        CUDA_TRY(cudaStreamWaitEvent(dctx->stream, sctx->copy_event, 0), "tensor_copy_async: cudaStreamWaitEvent");
    }
    CUDA_TRY(cudaSetDevice(dctx->device), "tensor_copy_async: cudaSetDevice");
    const size_t n = ferry_tensor_nbytes(src);
    if (src_dev == dst_dev) {
        CUDA_TRY(cudaMemcpyAsync(ferry_tensor_data(dst), ferry_tensor_data(src), n, cudaMemcpyDeviceToDevice,
                                 dctx->stream),
                 "tensor_copy_async: cudaMemcpyAsync");
    } else {
        CUDA_TRY(cudaMemcpyPeerAsync(ferry_tensor_data(dst), dst_dev, ferry_tensor_data(src), src_dev, n, dctx->stream),
                 "tensor_copy_async: cudaMemcpyPeerAsync");
    }
    return FERRY_OK;
}

/* The nodes in order on the backend's stream; the kernels are in ops-cuda.cu. */
static bool backend_supports_op(ferry_backend *, const ferry_tensor * op) { return ferry_cuda_op_supported(op); }

static ferry_status backend_graph_compute(ferry_backend * backend, ferry_graph * graph) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "graph_compute: cudaSetDevice");
    for (int i = 0; i < ferry_graph_n_nodes(graph); i++) {
        FERRY_TRY(ferry_cuda_compute_node(ferry_graph_node(graph, i), ctx->stream));
    }
    return FERRY_OK;
}

static ferry_status backend_synchronize(ferry_backend * backend) {
    backend_ctx * ctx = ctx_of(backend);
    CUDA_TRY(cudaSetDevice(ctx->device), "synchronize: cudaSetDevice");
    CUDA_TRY(cudaStreamSynchronize(ctx->stream), "synchronize: cudaStreamSynchronize");
    return FERRY_OK;
}

/* ---------------------------------------------------------------- events */

struct event_ctx {
    int device;
    cudaEvent_t event;
};

static event_ctx * ev_of(const ferry_event * ev) { return (event_ctx *) ev->context; }

static void event_free(ferry_event * ev) {
    event_ctx * ctx = ev_of(ev);
    cudaSetDevice(ctx->device);
    cudaEventDestroy(ctx->event);
    cudaGetLastError();
    free(ctx);
}

static ferry_status event_record(ferry_event * ev, ferry_backend * backend) {
    if (!is_cuda_backend(backend) || ctx_of(backend)->device != ev_of(ev)->device) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "event_record: a CUDA%d event can only be recorded on a CUDA%d "
                          "backend, not on %s", ev_of(ev)->device, ev_of(ev)->device, ferry_backend_name(backend));
    }
    CUDA_TRY(cudaSetDevice(ev_of(ev)->device), "event_record: cudaSetDevice");
    CUDA_TRY(cudaEventRecord(ev_of(ev)->event, ctx_of(backend)->stream), "event_record: cudaEventRecord");
    return FERRY_OK;
}

/* A CUDA stream can wait on any device's event; other backends wait on the host. */
static ferry_status event_wait(ferry_backend * backend, ferry_event * ev) {
    if (!is_cuda_backend(backend)) {
        return FERRY_ERR_UNSUPPORTED;
    }
    CUDA_TRY(cudaSetDevice(ctx_of(backend)->device), "event_wait: cudaSetDevice");
    CUDA_TRY(cudaStreamWaitEvent(ctx_of(backend)->stream, ev_of(ev)->event, 0), "event_wait: cudaStreamWaitEvent");
    return FERRY_OK;
}

static ferry_status event_synchronize(ferry_event * ev) {
    CUDA_TRY(cudaEventSynchronize(ev_of(ev)->event), "event_synchronize: cudaEventSynchronize");
    return FERRY_OK;
}

static ferry_status event_elapsed_ms(const ferry_event * start, const ferry_event * end, float * out) {
    CUDA_TRY(cudaEventElapsedTime(out, ev_of(start)->event, ev_of(end)->event), "event_elapsed_ms: cudaEventElapsedTime");
    return FERRY_OK;
}

static ferry_status backend_event_new(ferry_backend * backend, uint32_t flags, ferry_event ** out) {
    const int device = ctx_of(backend)->device;
    CUDA_TRY(cudaSetDevice(device), "event_new: cudaSetDevice");
    cudaEvent_t event;
    CUDA_TRY(cudaEventCreateWithFlags(&event, (flags & FERRY_EVENT_TIMING) ? cudaEventDefault : cudaEventDisableTiming),
             "event_new: cudaEventCreateWithFlags");
    auto * ctx = (event_ctx *) calloc(1, sizeof(event_ctx));
    auto * ev = (ferry_event *) calloc(1, sizeof(ferry_event));
    if (!ctx || !ev) {
        free(ctx);
        free(ev);
        cudaEventDestroy(event);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "event_new: out of memory");
    }
    ctx->device = device;
    ctx->event = event;
    ev->iface.free = event_free;
    ev->iface.record = event_record;
    ev->iface.wait = event_wait;
    ev->iface.synchronize = event_synchronize;
    ev->iface.elapsed_ms = event_elapsed_ms;
    ev->backend = backend;
    ev->context = ctx;
    *out = ev;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_new(int device, ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "cuda_backend_new: NULL output");
    FERRY_TRY(check_device(device, "cuda_backend_new"));
    ferry_buffer_type * buft;
    FERRY_TRY(ferry_cuda_buffer_type(device, &buft)); /* makes the buffer types */
    CUDA_TRY(cudaSetDevice(device), "cuda_backend_new: cudaSetDevice");
    auto * ctx = (backend_ctx *) calloc(1, sizeof(backend_ctx));
    if (!ctx) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "cuda_backend_new: out of memory");
    }
    ctx->device = device;
    snprintf(ctx->name, sizeof(ctx->name), "CUDA%d", device);
    const char * gather_env = getenv("FERRY_CUDA_GATHER");
    ctx->gather = ferry_cuda_gather_default_params();
    ctx->gather.on = gather_env && gather_env[0] && strcmp(gather_env, "0") != 0;
    const char * fold_env = getenv("FERRY_CUDA_FOLD");
    ctx->fold_above = fold_env ? (size_t) strtoull(fold_env, NULL, 10) : 0;
    /* Non-blocking: the backend's stream does not wait for the legacy default stream. */
    cudaError_t err = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) {
        err = cudaEventCreateWithFlags(&ctx->copy_event, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            cudaStreamDestroy(ctx->stream);
        }
    }
    if (err != cudaSuccess) {
        free(ctx);
        return cuda_fail(err, "cuda_backend_new: stream or event");
    }
    ferry_backend_i i = {};
    i.get_name = backend_name;
    i.free = backend_free;
    i.get_default_buffer_type = backend_default_buft;
    i.supports_buft = backend_supports_buft;
    i.set_tensor_async = backend_set_async;
    i.get_tensor_async = backend_get_async;
    i.set_tensor_2d_async = backend_set_2d_async;
    i.get_tensor_2d_async = backend_get_2d_async;
    i.cpy_tensor_async = backend_cpy_async;
    i.synchronize = backend_synchronize;
    i.supports_op = backend_supports_op;
    i.graph_compute = backend_graph_compute;
    i.event_new = backend_event_new;
    i.copy_cost_model = backend_copy_cost_model;
    const ferry_status st = ferry_backend_init(i, ctx, out);
    if (st != FERRY_OK) {
        cudaEventDestroy(ctx->copy_event);
        cudaStreamDestroy(ctx->stream);
        free(ctx);
    }
    return st;
}

extern "C" ferry_status ferry_cuda_backend_device(const ferry_backend * backend, int * out) {
    FERRY_CHECK_ARG(backend && out, "cuda_backend_device: NULL argument");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_device: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    *out = ((backend_ctx *) backend->context)->device;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_set_gather(ferry_backend * backend, const ferry_cuda_gather_params * params) {
    FERRY_CHECK_ARG(backend && params, "cuda_backend_set_gather: NULL argument");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_set_gather: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    if (!ferry_cuda_gather_loads_ok(params->loads_per_thread)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_set_gather: %d loads per thread (1, 2, 4, 8 or 16)",
                          params->loads_per_thread);
    }
    ctx_of(backend)->gather = *params;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_set_fold(ferry_backend * backend, size_t fold_above) {
    FERRY_CHECK_ARG(backend, "cuda_backend_set_fold: NULL backend");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_set_fold: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    ctx_of(backend)->fold_above = fold_above;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_get_fold(const ferry_backend * backend, size_t * fold_above,
                                                    uint64_t * copies) {
    FERRY_CHECK_ARG(backend, "cuda_backend_get_fold: NULL backend");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_get_fold: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    const backend_ctx * ctx = (const backend_ctx *) backend->context;
    if (fold_above) {
        *fold_above = ctx->fold_above;
    }
    if (copies) {
        *copies = ctx->fold_copies;
    }
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_get_gather(const ferry_backend * backend, ferry_cuda_gather_params * params,
                                                      uint64_t * copies) {
    FERRY_CHECK_ARG(backend, "cuda_backend_get_gather: NULL backend");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_get_gather: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    const backend_ctx * ctx = (const backend_ctx *) backend->context;
    if (params) {
        *params = ctx->gather;
    }
    if (copies) {
        *copies = ctx->gather_copies;
    }
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_hold(ferry_backend * backend, double microseconds) {
    FERRY_CHECK_ARG(backend, "cuda_backend_hold: NULL backend");
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_hold: %s is not a CUDA backend",
                          ferry_backend_name(backend));
    }
    if (!(microseconds >= 0.0 && microseconds <= 1e6)) { /* NaN fails too */
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_hold: %g us is not in 0..1e6", microseconds);
    }
    const backend_ctx * ctx = (const backend_ctx *) backend->context;
    CUDA_TRY(cudaSetDevice(ctx->device), "cuda_backend_hold: cudaSetDevice");
    CUDA_TRY(ferry_cuda_hold(microseconds, ctx->stream), "cuda_backend_hold: kernel launch");
    return FERRY_OK;
}
