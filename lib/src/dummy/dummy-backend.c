/*
 * The dummy backend: a device-like backend for allocator tests and dry runs. Its
 * buffers hand out synthetic addresses (transfers checked and counted, not done), or
 * with real_memory are host memory that other backends are told is not host.
 */
#include "dummy-impl.h"
#include "cpu/cpu-impl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    ferry_dummy_params params;
    ferry_buffer_type buft;
    bool cpu_ops; /* claim only what the CPU kernels do (the stand-in device) */
    char name[48];
} dummy_ctx;

/* Synthetic bases: far apart, never dereferenced, never NULL, and each buffer whole below
 * the top of the address space, so its tensors' data pointers never overflow. They go
 * upwards; when the next buffer would not fit they start again from the first: nothing
 * reads them, so a reused one only looks like an old buffer's. */
#define SYNTHETIC_FIRST ((uintptr_t) 1 << 40)
static _Atomic uintptr_t next_synthetic = SYNTHETIC_FIRST;

static uintptr_t synthetic_base(size_t size) {
    const uintptr_t gib = (uintptr_t) 1 << 30;
    const uintptr_t step = ((uintptr_t) size + gib) & ~(gib - 1); /* size <= INT64_MAX: no overflow */
    uintptr_t seen = atomic_load(&next_synthetic), base;
    do {
        base = seen <= UINTPTR_MAX - step - gib ? seen : SYNTHETIC_FIRST;
    } while (!atomic_compare_exchange_weak(&next_synthetic, &seen, base + step + gib));
    return base;
}

static const char * dummy_buft_name(const ferry_buffer_type * buft) {
    return ((const dummy_ctx *) buft->context)->name;
}

static size_t dummy_buft_alignment(const ferry_buffer_type * buft) {
    return ((const dummy_ctx *) buft->context)->params.alignment;
}

static size_t dummy_buft_max_size(const ferry_buffer_type * buft) {
    const size_t max = ((const dummy_ctx *) buft->context)->params.max_buffer_size;
    return max ? max : SIZE_MAX;
}

static bool dummy_buft_is_host(const ferry_buffer_type * buft) {
    return ((const dummy_ctx *) buft->context)->params.is_host;
}

/* Without real memory every buffer of the type is synthetic (the buffers below). */
static bool dummy_buft_is_synthetic(const ferry_buffer_type * buft) {
    return !((const dummy_ctx *) buft->context)->params.real_memory;
}

/* ---------------------------------------------------------------- synthetic buffers */

static void synthetic_free(ferry_buffer * buf) { (void) buf; }
static void * synthetic_get_base(const ferry_buffer * buf) { return buf->context; }

static ferry_status synthetic_memset(ferry_buffer * buf, ferry_tensor * t, uint8_t value, size_t offset, size_t size) {
    (void) buf, (void) t, (void) value, (void) offset, (void) size;
    return FERRY_OK;
}

static ferry_status synthetic_set(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size;
    return FERRY_OK;
}

static ferry_status synthetic_get(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                  size_t size) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size;
    return FERRY_OK;
}

static ferry_status synthetic_set_2d(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                     size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size, (void) n_copies, (void) stride_tensor,
        (void) stride_data;
    return FERRY_OK;
}

static ferry_status synthetic_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                     size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size, (void) n_copies, (void) stride_tensor,
        (void) stride_data;
    return FERRY_OK;
}

static ferry_status synthetic_clear(ferry_buffer * buf, uint8_t value) {
    (void) buf, (void) value;
    return FERRY_OK;
}

static const struct ferry_buffer_i synthetic_iface = {
    .free_buffer = synthetic_free,
    .get_base = synthetic_get_base,
    .memset_tensor = synthetic_memset,
    .set_tensor = synthetic_set,
    .get_tensor = synthetic_get,
    .set_tensor_2d = synthetic_set_2d,
    .get_tensor_2d = synthetic_get_2d,
    .clear = synthetic_clear,
};

static ferry_status dummy_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    const dummy_ctx * ctx = buft->context;
    ferry_status st;
    if (ctx->params.real_memory) {
        st = ferry_host_buffer_new(buft, size, ctx->params.alignment, out);
    } else {
        st = ferry_buffer_init(buft, synthetic_iface, (void *) synthetic_base(size), size, out);
    }
    if (st == FERRY_OK && !ctx->params.has_2d) {
        (*out)->iface.set_tensor_2d = NULL;
        (*out)->iface.get_tensor_2d = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------- the backend */

static const char * dummy_name(const ferry_backend * backend) { return ((const dummy_ctx *) backend->context)->name; }

static void dummy_free(ferry_backend * backend) { free(backend->context); }

static ferry_buffer_type * dummy_default_buft(ferry_backend * backend) {
    return &((dummy_ctx *) backend->context)->buft;
}

static bool dummy_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return buft == &((dummy_ctx *) backend->context)->buft;
}

/* Dry runs claim every op; only real memory computes, on the CPU kernels. */
static bool dummy_supports_op(ferry_backend * backend, const ferry_tensor * op) {
    const dummy_ctx * ctx = backend->context;
    return !ctx->cpu_ops || ferry_cpu_op_supported(op);
}

static ferry_status dummy_graph_compute(ferry_backend * backend, ferry_graph * graph) {
    const dummy_ctx * ctx = backend->context;
    return ctx->params.real_memory ? ferry_cpu_compute_graph(graph) : FERRY_OK;
}

/* Real memory is the host's. Synthetic addresses have nothing behind them: no limit but
 * each buffer's max size, so SIZE_MAX for both. */
static ferry_status dummy_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    const dummy_ctx * ctx = backend->context;
    if (ctx->params.real_memory) {
        return ferry_host_memory(free_bytes, total_bytes);
    }
    *free_bytes = SIZE_MAX;
    *total_bytes = SIZE_MAX;
    return FERRY_OK;
}

ferry_dummy_params ferry_dummy_default_params(void) {
    return (ferry_dummy_params) {.alignment = 64, .max_buffer_size = 0, .real_memory = false, .has_2d = true};
}

static ferry_status dummy_new(const ferry_dummy_params * params, const char * name, bool cpu_ops,
                              ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "dummy_backend_new: NULL output");
    ferry_dummy_params p = params ? *params : ferry_dummy_default_params();
    if (p.alignment == 0) {
        p.alignment = 64;
    }
    if ((p.alignment & (p.alignment - 1)) != 0 || p.alignment > ((size_t) 1 << 30)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "dummy_backend_new: alignment %zu is not a power of two up to 1 GiB",
                          p.alignment);
    }
    dummy_ctx * ctx = ferry_calloc(1, sizeof(*ctx));
    if (!ctx) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "dummy_backend_new: out of memory");
    }
    ctx->params = p;
    ctx->cpu_ops = cpu_ops;
    if (name) {
        snprintf(ctx->name, sizeof(ctx->name), "%s", name);
    } else {
        snprintf(ctx->name, sizeof(ctx->name), "Dummy%s%s", p.is_host ? "Host" : "", p.real_memory ? "" : "(synthetic)");
    }
    ctx->buft.iface = (struct ferry_buffer_type_i) {
        .get_name = dummy_buft_name,
        .alloc_buffer = dummy_buft_alloc,
        .get_alignment = dummy_buft_alignment,
        .get_max_size = dummy_buft_max_size,
        .is_host = dummy_buft_is_host,
        .is_synthetic = dummy_buft_is_synthetic,
    };
    ctx->buft.context = ctx;
    struct ferry_backend_i iface = {
        .get_name = dummy_name,
        .free = dummy_free,
        .get_default_buffer_type = dummy_default_buft,
        .supports_buft = dummy_supports_buft,
        .supports_op = dummy_supports_op,
        .graph_compute = dummy_graph_compute,
        .get_memory = dummy_get_memory,
    };
    if (p.has_2d) {
        iface.set_tensor_2d_async = ferry_cpu_set_tensor_2d; /* host memory, or nothing to move */
        iface.get_tensor_2d_async = ferry_cpu_get_tensor_2d;
    }
    const ferry_status st = ferry_backend_init(iface, ctx, out);
    if (st != FERRY_OK) {
        free(ctx);
    }
    return st;
}

ferry_status ferry_dummy_backend_new(const ferry_dummy_params * params, ferry_backend ** out) {
    return dummy_new(params, NULL, false, out);
}

ferry_status ferry_dummy_backend_new_cpu_ops(const ferry_dummy_params * params, const char * name,
                                             ferry_backend ** out) {
    return dummy_new(params, name, true, out);
}
