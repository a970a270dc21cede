/*
 * The CUDA backend: its own stream that runs the kernels of ops-cuda.cu, its async
 * copies with the gather and folded copy options, events, its copy queue (a second
 * stream, as a backend of its own), and the ferry_cuda_backend_* functions of ferry.h. The public layer (buffer.c, backend.c, transfer.c) has checked
 * bounds and counts bytes, so nothing here does either.
 */
#include "cuda-common.h"
#include "cuda-ops.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

/* ---------------------------------------------------------------- the backend */

struct backend_ctx {
    int device;
    cudaStream_t stream;
    cudaEvent_t copy_event; /* orders a copy between two backends' streams */
    backend_ctx * parent;   /* a copy queue's backend, whose copy options it follows; NULL for a backend */
    char name[48];
    ferry_cuda_gather_params gather; /* the gather copy option (ferry/cuda.h) */
    uint64_t gather_copies;          /* 2-D sets the kernel carried out */
    size_t fold_above;               /* the folded copy option (ferry/cuda.h): 0 off */
    uint64_t fold_copies;            /* 2-D copies issued as folded 3-D ones */
    void * pieces_dev;               /* a paged gather kernel's descriptors, in this device's memory */
    size_t pieces_cap;               /* their bytes */
    void * staging_dev;              /* a merged gather's spans, landed on this device */
    size_t staging_cap;              /* their bytes */
    int clock_khz;                   /* the device's peak SM clock, asked at the first hold; 0 before */
};

static backend_ctx * ctx_of(ferry_backend * backend) { return (backend_ctx *) backend->context; }

/* Whose gather and fold options a transfer follows: a copy queue's are its backend's. */
static backend_ctx * options_of(backend_ctx * ctx) { return ctx->parent ? ctx->parent : ctx; }

static const char * backend_name(const ferry_backend * backend) { return ((backend_ctx *) backend->context)->name; }

static void backend_free(ferry_backend * backend) {
    backend_ctx * ctx = ctx_of(backend);
    cudaSetDevice(ctx->device);
    cudaStreamSynchronize(ctx->stream); /* nothing may still read memory the caller frees next */
    cudaFree(ctx->pieces_dev);
    cudaFree(ctx->staging_dev);
    cudaEventDestroy(ctx->copy_event);
    cudaStreamDestroy(ctx->stream);
    cudaGetLastError();
    free(ctx);
}

static ferry_buffer_type * backend_default_buft(ferry_backend * backend) {
    return &ferry_cuda_device_bufts[ctx_of(backend)->device];
}

/* Only its own device memory: kernels never read pinned host memory across the bus, so
 * a split on CUDA receives every host input by copy, as the scheduler measures it. */
static bool backend_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return ferry_cuda_is_device_buft(buft) && ((device_buft_ctx *) buft->context)->device == ctx_of(backend)->device;
}

/* Copies into the device are costed by the GPU model (copy-plan.c), fitted to the H200 anchors. */
static ferry_copy_cost_model backend_copy_cost_model(const ferry_backend * backend) {
    (void) backend;
    return ferry_copy_cost_model_gpu();
}

/* Transfers on the backend's stream (cudaMemcpyDefault): the source may be any memory. */
static ferry_status backend_set_async(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                      size_t size) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("tensor_set_async"));
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_set_async: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(tensor_at(t, offset), data, size, cudaMemcpyDefault, ctx->stream),
             "tensor_set_async: cudaMemcpyAsync");
    return FERRY_OK;
}

static ferry_status backend_get_async(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                      size_t size) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("tensor_get_async"));
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_get_async: cudaSetDevice");
    CUDA_TRY(cudaMemcpyAsync(data, tensor_at(t, offset), size, cudaMemcpyDefault, ctx->stream),
             "tensor_get_async: cudaMemcpyAsync");
    return FERRY_OK;
}

/* The gather rule's defaults (ferry/cuda.h), from the H200 anchors: one 2-D copy runs at
 * the contiguous rate up to a 32 KiB pitch and 1.5x off it at 64 KiB. Rows under
 * 256 B are the copy engine's other weak spot, but they leave a warp's loads short,
 * so the rule leaves them to the copy engine. */
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
    if (!ferry_cuda_is_device_buffer(buf) || ((device_buffer_ctx *) buf->context)->device != ctx->device) {
        return false; /* the kernel writes this device's memory only */
    }
    /* The public layer checked the tensor side, not the source: the span read is (n-1) pitches and a row. */
    size_t span;
    return ferry_mul_ok(n_copies - 1, stride_data, &span) && ferry_add_ok(span, size, &span) &&
           ferry_cuda_pinned_mapped(data, span);
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
    backend_ctx * opt = options_of(ctx);
    if (!opt->fold_above || height < 2 || (dpitch < opt->fold_above && spitch < opt->fold_above)) {
        return false;
    }
    const size_t kd = fold_factor(dpitch, width, opt->fold_above), ks = fold_factor(spitch, width, opt->fold_above);
    if (!kd || !ks) {
        return false;
    }
    cudaMemcpy3DParms p = {};
    p.srcPtr = make_cudaPitchedPtr((void *) src, spitch / ks, width, ks);
    p.dstPtr = make_cudaPitchedPtr(dst, dpitch / kd, width, kd);
    p.extent = make_cudaExtent(width, 1, height);
    p.kind = cudaMemcpyDefault;
    *err = cudaMemcpy3DAsync(&p, ctx->stream);
    opt->fold_copies += *err == cudaSuccess;
    return true;
}

/* One cudaMemcpy2DAsync moves every row: the copy engine walks the pitches itself,
 * which is what lets a range copy reach the contiguous rate on the H200. With
 * the gather option on and its rule met, a kernel reads the rows instead. */
static ferry_status backend_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                         size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("tensor_set_2d_async"));
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_set_2d_async: cudaSetDevice");
    char * dst = tensor_at(t, offset);
    if (gather_applies(options_of(ctx), t, dst, data, size, n_copies, stride_tensor, stride_data)) {
        CUDA_TRY(ferry_cuda_gather_rows(dst, stride_tensor, data, stride_data, size, n_copies,
                                        options_of(ctx)->gather.loads_per_thread, ctx->stream),
                 "tensor_set_2d_async: gather kernel launch");
        options_of(ctx)->gather_copies++;
        return FERRY_OK;
    }
    cudaError_t err;
    if (copy_folded(ctx, dst, stride_tensor, data, stride_data, size, n_copies, &err)) {
        CUDA_TRY(err, "tensor_set_2d_async: cudaMemcpy3DAsync (folded)");
        return FERRY_OK;
    }
    CUDA_TRY(ferry_cuda_copy_2d(dst, stride_tensor, data, stride_data, size, n_copies, ctx->stream),
             "tensor_set_2d_async: cudaMemcpy2DAsync");
    return FERRY_OK;
}

static ferry_status backend_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                         size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("tensor_get_2d_async"));
    CUDA_TRY(cudaSetDevice(ctx->device), "tensor_get_2d_async: cudaSetDevice");
    cudaError_t err;
    if (copy_folded(ctx, data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies, &err)) {
        CUDA_TRY(err, "tensor_get_2d_async: cudaMemcpy3DAsync (folded)");
        return FERRY_OK;
    }
    CUDA_TRY(ferry_cuda_copy_2d(data, stride_data, tensor_at(t, offset), stride_tensor, size, n_copies, ctx->stream),
             "tensor_get_2d_async: cudaMemcpy2DAsync");
    return FERRY_OK;
}

/* ---------------------------------------------------------------- a paged window's gather in one call */

#if CUDART_VERSION >= 12080
/* The driver's CUDA version, asked once a process; 0 when it cannot say. A runtime linked in
 * from 12.8 still calls into the driver, and an older driver has no batched copies. No guarded
 * static (built with -fno-threadsafe-statics): threads asking at once store the same answer. */
static int driver_version() {
    static int version = -1; /* not asked yet */
    int v = __atomic_load_n(&version, __ATOMIC_RELAXED);
    if (v < 0) {
        if (cudaDriverGetVersion(&v) != cudaSuccess || v < 0) {
            v = 0;
        }
        __atomic_store_n(&version, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

/* Batched copies where the runtime and the driver have them (cudaMemcpyBatchAsync: CUDA 12.8 on),
 * and with them merged spans (the spans batched into a staging area, the runs placed from it by the
 * gather kernel, which reads device memory alone there); the kernel for a source inside one pinned
 * range the device maps. */
static unsigned backend_gather_methods(const ferry_backend * backend, const void * src, size_t span) {
    (void) backend;
    unsigned bits = ferry_cuda_pinned_mapped(src, span) ? 1u << FERRY_GATHER_KERNEL : 0;
#if CUDART_VERSION >= 12080
    if (driver_version() >= 12080) {
        bits |= 1u << FERRY_GATHER_BATCHED | 1u << FERRY_GATHER_MERGED;
    }
#endif
    return bits;
}

/* Every row of every piece as one copy of a batch, read in stream order. */
static ferry_status gather_batched(backend_ctx * ctx, char * dst, const char * src, const ferry_gather_copy * pieces,
                                   size_t n) {
#if CUDART_VERSION >= 12080
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        rows += pieces[i].count;
    }
    auto ** dsts = (void **) ferry_malloc(rows * sizeof(void *));
    auto ** srcs = (const void **) ferry_malloc(rows * sizeof(void *));
    auto * sizes = (size_t *) ferry_malloc(rows * sizeof(size_t));
    if (!dsts || !srcs || !sizes) {
        free(dsts);
        free(srcs);
        free(sizes);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "tensor_gather_async: out of memory for a batch of %zu copies",
                          rows);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t r = 0; r < pieces[i].count; r++, k++) {
            dsts[k] = dst + pieces[i].dst_offset + r * pieces[i].dst_stride;
            srcs[k] = src + pieces[i].src_offset + r * pieces[i].src_stride;
            sizes[k] = pieces[i].size;
        }
    }
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t err = cudaMemcpyBatchAsync(dsts, srcs, sizes, rows, &attr, &first, 1, ctx->stream);
#else
    size_t failed = 0;
    const cudaError_t err =
        cudaMemcpyBatchAsync(dsts, (void **) srcs, sizes, rows, &attr, &first, 1, &failed, ctx->stream);
#endif
    free(dsts);
    free(srcs);
    free(sizes);
    CUDA_TRY(err, "tensor_gather_async: cudaMemcpyBatchAsync");
    return FERRY_OK;
#else
    (void) ctx, (void) dst, (void) src, (void) pieces, (void) n;
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "tensor_gather_async: this CUDA runtime (before 12.8) has no batched "
                      "copies");
#endif
}

/* The pieces' descriptors uploaded to the device (its scratch grown as needed: the stream's
 * earlier kernels are done with the old one once cudaFree returns), then one launch. */
static ferry_status gather_kernel(backend_ctx * ctx, char * dst, const char * src, const ferry_gather_copy * pieces,
                                  size_t n) {
    const size_t bytes = n * sizeof(ferry_cuda_piece);
    auto * host = (ferry_cuda_piece *) ferry_malloc(bytes);
    if (!host) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "tensor_gather_async: out of memory for %zu pieces", n);
    }
    uint64_t units = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * c = &pieces[i];
        host[i] = {(uint64_t) (uintptr_t) (src + c->src_offset), (uint64_t) (uintptr_t) (dst + c->dst_offset),
                   c->size, c->count, c->src_stride, c->dst_stride};
        const uint64_t words = c->size * c->count; /* the most a piece may take: 1-byte words */
        units = words > units ? words : units;
    }
    cudaError_t err = cudaSuccess;
    if (bytes > ctx->pieces_cap) {
        cudaFree(ctx->pieces_dev);
        ctx->pieces_dev = nullptr;
        ctx->pieces_cap = 0;
        err = cudaMalloc(&ctx->pieces_dev, bytes);
        ctx->pieces_cap = err == cudaSuccess ? bytes : 0;
    }
    if (err == cudaSuccess) { /* from pageable memory: taken before the call returns */
        err = cudaMemcpyAsync(ctx->pieces_dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream);
    }
    free(host);
    CUDA_TRY(err, "tensor_gather_async: the gather kernel's pieces");
    CUDA_TRY(ferry_cuda_gather_pieces((const ferry_cuda_piece *) ctx->pieces_dev, n, units, ctx->stream),
             "tensor_gather_async: gather kernel launch");
    return FERRY_OK;
}

/* The bytes past src that n pieces' rows reach (a piece of no rows reaches none: (count - 1) would wrap). */
static size_t pieces_reach(const ferry_gather_copy * pieces, size_t n, bool source) {
    size_t reach = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * c = &pieces[i];
        if (c->count == 0) {
            continue;
        }
        const size_t end = (source ? c->src_offset + (c->count - 1) * c->src_stride
                                   : c->dst_offset + (c->count - 1) * c->dst_stride) + c->size;
        reach = end > reach ? end : reach;
    }
    return reach;
}

/* The gather by method into t from src (span bytes of it read) offered, t this device's memory: else
 * UNSUPPORTED, after what. */
static ferry_status check_gather(ferry_backend * backend, ferry_tensor * t, const char * src, size_t span,
                                 ferry_gather_method method, const char * what) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context(what));
    const ferry_buffer * buf = ferry_tensor_buffer(t);
    if (!(backend_gather_methods(backend, src, span) & (1u << method)) || !ferry_cuda_is_device_buffer(buf) ||
        ((device_buffer_ctx *) buf->context)->device != ctx->device) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s does not gather by %s into '%s' from %p (batched copies "
                          "and merged spans need CUDA 12.8, its runtime and its driver; the kernel, pinned memory "
                          "it maps; each, its own device memory)", what, ctx->name,
                          method == FERRY_GATHER_KERNEL   ? "kernel"
                          : method == FERRY_GATHER_MERGED ? "merged spans"
                                                          : "batched copies",
                          t->name, (const void *) src);
    }
    const cudaError_t err = cudaSetDevice(ctx->device);
    return err == cudaSuccess ? FERRY_OK : ferry_cuda_fail(err, what);
}

static ferry_status backend_gather(ferry_backend * backend, ferry_tensor * t, const char * src,
                                   const ferry_gather_copy * pieces, size_t n, ferry_gather_method method) {
    FERRY_TRY(check_gather(backend, t, src, pieces_reach(pieces, n, true), method, "tensor_gather_async"));
    backend_ctx * ctx = ctx_of(backend);
    char * dst = (char *) ferry_tensor_data(t);
    return method == FERRY_GATHER_KERNEL ? gather_kernel(ctx, dst, src, pieces, n)
                                         : gather_batched(ctx, dst, src, pieces, n);
}

/* The span of spans[0..n) that holds piece c's every row, or NULL: its rows within the span's, at the
 * span's row stride. A merged plan's spans hold its runs (copy-paged.c, spans_of). */
static const ferry_gather_copy * span_holding(const ferry_gather_copy * spans, size_t n, const ferry_gather_copy * c,
                                              size_t * hint) {
    for (size_t k = 0; k < n; k++) {
        const ferry_gather_copy * s = &spans[(*hint + k) % n]; /* the runs mostly follow the spans */
        if (c->src_offset >= s->src_offset && c->src_offset + c->size <= s->src_offset + s->size &&
            c->count <= s->count && (c->count <= 1 || c->src_stride == s->src_stride)) {
            *hint = (*hint + k) % n;
            return s;
        }
    }
    return NULL;
}

/* Merged spans: the spans (gaps and all) batched from src into the staging area on this device, each
 * at its dst_offset, rows dst_stride apart, then the gather kernel places each piece (a run) from the
 * staged span that holds it, device memory to device memory, on the same stream. The staging area is
 * grown as the pieces' scratch is (the stream's earlier kernels are done with it once cudaFree returns). */
static ferry_status backend_gather_merged(ferry_backend * backend, ferry_tensor * t, const char * src,
                                          const ferry_gather_copy * spans, size_t n_spans,
                                          const ferry_gather_copy * pieces, size_t n) {
    const char * what = "tensor_gather_merged_async";
    FERRY_TRY(check_gather(backend, t, src, pieces_reach(spans, n_spans, true), FERRY_GATHER_MERGED, what));
    backend_ctx * ctx = ctx_of(backend);
    auto * placed = (ferry_gather_copy *) ferry_malloc((n ? n : 1) * sizeof(ferry_gather_copy));
    if (!placed) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu pieces", what, n);
    }
    size_t hint = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * s = pieces[i].count ? span_holding(spans, n_spans, &pieces[i], &hint) : spans;
        if (!s) {
            free(placed);
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: piece %zu (%zu bytes at %zu of the pool) lies in none of "
                              "the %zu spans: give the spans and runs of one merged plan", what, i, pieces[i].size,
                              pieces[i].src_offset, n_spans);
        }
        placed[i] = pieces[i];
        placed[i].src_offset = s->dst_offset + (pieces[i].src_offset - s->src_offset);
        placed[i].src_stride = s->dst_stride;
    }
    const size_t staged = pieces_reach(spans, n_spans, false);
    cudaError_t err = cudaSuccess;
    if (staged > ctx->staging_cap) {
        cudaFree(ctx->staging_dev);
        ctx->staging_dev = nullptr;
        ctx->staging_cap = 0;
        err = cudaMalloc(&ctx->staging_dev, staged);
        ctx->staging_cap = err == cudaSuccess ? staged : 0;
    }
    if (err != cudaSuccess) {
        free(placed);
        return ferry_cuda_fail(err, "tensor_gather_merged_async: the spans' staging area");
    }
    char * staging = (char *) ctx->staging_dev;
    ferry_status st = gather_batched(ctx, staging, src, spans, n_spans);
    if (st == FERRY_OK) {
        st = gather_kernel(ctx, (char *) ferry_tensor_data(t), staging, placed, n);
    }
    free(placed);
    return st;
}

static bool is_cuda_backend(const ferry_backend * backend) {
    return backend && backend->iface.get_name == backend_name;
}

/* Device to device on dst's stream, after what src's stream queued before it. */
static ferry_status backend_cpy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                      const ferry_tensor * src, ferry_tensor * dst) {
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    if (!is_cuda_backend(backend_src) || !ferry_cuda_is_device_buffer(src_buf) ||
        !ferry_cuda_is_device_buffer(dst_buf)) {
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
    FERRY_TRY(ferry_cuda_check_context("graph_compute"));
    CUDA_TRY(cudaSetDevice(ctx->device), "graph_compute: cudaSetDevice");
    for (int i = 0; i < ferry_graph_n_nodes(graph); i++) {
        FERRY_TRY(ferry_cuda_compute_node(ferry_graph_node(graph, i), ctx->stream));
    }
    return FERRY_OK;
}

static ferry_status backend_synchronize(ferry_backend * backend) {
    backend_ctx * ctx = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("synchronize"));
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
    auto * ctx = (event_ctx *) ferry_calloc(1, sizeof(event_ctx));
    auto * ev = (ferry_event *) ferry_calloc(1, sizeof(ferry_event));
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

/* A context with its own non-blocking stream (it does not wait for the legacy default
 * stream) and copy event, or NULL with the status in *st. */
static backend_ctx * new_ctx(int device, const char * what, ferry_status * st) {
    auto * ctx = (backend_ctx *) ferry_calloc(1, sizeof(backend_ctx));
    if (!ctx) {
        *st = ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        return NULL;
    }
    ctx->device = device;
    cudaError_t err = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (err == cudaSuccess) {
        err = cudaEventCreateWithFlags(&ctx->copy_event, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            cudaStreamDestroy(ctx->stream);
        }
    }
    if (err != cudaSuccess) {
        free(ctx);
        char msg[64];
        snprintf(msg, sizeof(msg), "%s: stream or event", what);
        *st = ferry_cuda_fail(err, msg);
        return NULL;
    }
    *st = FERRY_OK;
    return ctx;
}

/* The device's free and total memory: what cudaMemGetInfo says, other processes' use included. */
static ferry_status backend_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    FERRY_TRY(ferry_cuda_check_context("backend_get_memory"));
    CUDA_TRY(cudaSetDevice(ctx_of(backend)->device), "backend_get_memory: cudaSetDevice");
    CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes), "backend_get_memory: cudaMemGetInfo");
    return FERRY_OK;
}

/* The transfers, synchronize and events every CUDA backend has, a copy queue included. */
static ferry_backend_i transfer_iface(void) {
    ferry_backend_i i = {};
    i.get_name = backend_name;
    i.free = backend_free;
    i.get_default_buffer_type = backend_default_buft;
    i.supports_buft = backend_supports_buft;
    i.set_tensor_async = backend_set_async;
    i.get_tensor_async = backend_get_async;
    i.set_tensor_2d_async = backend_set_2d_async;
    i.get_tensor_2d_async = backend_get_2d_async;
    i.synchronize = backend_synchronize;
    i.event_new = backend_event_new;
    i.copy_cost_model = backend_copy_cost_model;
    i.get_memory = backend_get_memory;
    i.gather_methods = backend_gather_methods;
    i.set_tensor_gather_async = backend_gather;
    i.set_tensor_gather_merged_async = backend_gather_merged;
    return i;
}

/* The copy queue: a second stream on the same device that computes nothing; the backend's
 * stream waits for its events on the device (cudaStreamWaitEvent). */
static ferry_status backend_copy_queue_new(ferry_backend * backend, ferry_backend ** out) {
    backend_ctx * parent = ctx_of(backend);
    FERRY_TRY(ferry_cuda_check_context("copy_queue_new"));
    CUDA_TRY(cudaSetDevice(parent->device), "copy_queue_new: cudaSetDevice");
    ferry_status st;
    backend_ctx * ctx = new_ctx(parent->device, "copy_queue_new", &st);
    if (!ctx) {
        return st;
    }
    ctx->parent = parent;
    snprintf(ctx->name, sizeof(ctx->name), "%.24s copy queue", parent->name);
    st = ferry_backend_init(transfer_iface(), ctx, out);
    if (st != FERRY_OK) {
        cudaEventDestroy(ctx->copy_event);
        cudaStreamDestroy(ctx->stream);
        free(ctx);
    }
    return st;
}

extern "C" ferry_status ferry_cuda_backend_new(int device, ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "cuda_backend_new: NULL output");
    FERRY_TRY(ferry_cuda_check_device(device, "cuda_backend_new"));
    FERRY_TRY(ferry_cuda_check_context("cuda_backend_new"));
    ferry_buffer_type * buft;
    FERRY_TRY(ferry_cuda_buffer_type(device, &buft)); /* makes the buffer types */
    CUDA_TRY(cudaSetDevice(device), "cuda_backend_new: cudaSetDevice");
    ferry_status st;
    backend_ctx * ctx = new_ctx(device, "cuda_backend_new", &st);
    if (!ctx) {
        return st;
    }
    snprintf(ctx->name, sizeof(ctx->name), "CUDA%d", device);
    const char * gather_env = getenv("FERRY_CUDA_GATHER");
    ctx->gather = ferry_cuda_gather_default_params();
    ctx->gather.on = gather_env && gather_env[0] && strcmp(gather_env, "0") != 0;
    const char * fold_env = getenv("FERRY_CUDA_FOLD");
    ctx->fold_above = fold_env ? (size_t) strtoull(fold_env, NULL, 10) : 0;
    ferry_backend_i i = transfer_iface();
    i.cpy_tensor_async = backend_cpy_async;
    i.supports_op = backend_supports_op;
    i.graph_compute = backend_graph_compute;
    i.copy_queue_new = backend_copy_queue_new;
    st = ferry_backend_init(i, ctx, out);
    if (st != FERRY_OK) {
        cudaEventDestroy(ctx->copy_event);
        cudaStreamDestroy(ctx->stream);
        free(ctx);
    }
    return st;
}

/* The context of a CUDA backend; INVALID_ARG for NULL or another backend, after what. */
static ferry_status cuda_ctx_of(const ferry_backend * backend, const char * what, backend_ctx ** out) {
    FERRY_CHECK_ARG(backend, "%s: NULL backend", what);
    if (!is_cuda_backend(backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: %s is not a CUDA backend", what, ferry_backend_name(backend));
    }
    *out = (backend_ctx *) backend->context;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_device(const ferry_backend * backend, int * out) {
    backend_ctx * ctx = nullptr;
    FERRY_TRY(cuda_ctx_of(backend, "cuda_backend_device", &ctx));
    FERRY_CHECK_ARG(out, "cuda_backend_device: NULL output");
    *out = ctx->device;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_set_gather(ferry_backend * backend, const ferry_cuda_gather_params * params) {
    backend_ctx * ctx = nullptr;
    FERRY_TRY(cuda_ctx_of(backend, "cuda_backend_set_gather", &ctx));
    FERRY_CHECK_ARG(params, "cuda_backend_set_gather: NULL params");
    if (!ferry_cuda_gather_loads_ok(params->loads_per_thread)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_set_gather: %d loads per thread (1, 2, 4, 8 or 16)",
                          params->loads_per_thread);
    }
    ctx->gather = *params;
    return FERRY_OK;
}

/* A copy option's setting and the copies made under it (get_gather, get_fold); either
 * output may be NULL. */
template <typename T>
static ferry_status get_option(const ferry_backend * backend, const char * what, T backend_ctx::*option,
                               uint64_t backend_ctx::*copies, T * option_out, uint64_t * copies_out) {
    backend_ctx * ctx = nullptr;
    FERRY_TRY(cuda_ctx_of(backend, what, &ctx));
    if (option_out) {
        *option_out = ctx->*option;
    }
    if (copies_out) {
        *copies_out = ctx->*copies;
    }
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_get_gather(const ferry_backend * backend, ferry_cuda_gather_params * params,
                                                      uint64_t * copies) {
    return get_option(backend, "cuda_backend_get_gather", &backend_ctx::gather, &backend_ctx::gather_copies, params,
                      copies);
}

extern "C" ferry_status ferry_cuda_backend_set_fold(ferry_backend * backend, size_t fold_above) {
    backend_ctx * ctx = nullptr;
    FERRY_TRY(cuda_ctx_of(backend, "cuda_backend_set_fold", &ctx));
    ctx->fold_above = fold_above;
    return FERRY_OK;
}

extern "C" ferry_status ferry_cuda_backend_get_fold(const ferry_backend * backend, size_t * fold_above,
                                                    uint64_t * copies) {
    return get_option(backend, "cuda_backend_get_fold", &backend_ctx::fold_above, &backend_ctx::fold_copies, fold_above,
                      copies);
}

extern "C" ferry_status ferry_cuda_backend_hold(ferry_backend * backend, double microseconds) {
    backend_ctx * ctx = nullptr;
    FERRY_TRY(cuda_ctx_of(backend, "cuda_backend_hold", &ctx));
    if (!(microseconds >= 0.0 && microseconds <= 1e6)) { /* NaN fails too */
        return ferry_fail(FERRY_ERR_INVALID_ARG, "cuda_backend_hold: %g us is not in 0..1e6", microseconds);
    }
    CUDA_TRY(cudaSetDevice(ctx->device), "cuda_backend_hold: cudaSetDevice");
    if (ctx->clock_khz <= 0) { /* once: the hold counts the SM's cycles at this rate */
        CUDA_TRY(cudaDeviceGetAttribute(&ctx->clock_khz, cudaDevAttrClockRate, ctx->device),
                 "cuda_backend_hold: cudaDeviceGetAttribute (clock rate)");
        if (ctx->clock_khz <= 0) {
            ctx->clock_khz = 0;
            return ferry_fail(FERRY_ERR_BACKEND, "cuda_backend_hold: %s gives no clock rate to count a hold by",
                              ctx->name);
        }
    }
    CUDA_TRY(ferry_cuda_hold(microseconds, ctx->clock_khz, ctx->stream), "cuda_backend_hold: kernel launch");
    return FERRY_OK;
}
