/* Buffers backed by plain host memory, and their buffer type (the CPU backend's, and that of
 * host memory another library owns); the dummy's real memory and pinned host memory use the
 * buffers with types of their own. Transfers use memmove: the caller's memory may be this buffer's own (a copy between two
 * views of one tensor that overlap), where memcpy would be undefined. */
#include "ferry-impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    void * base;
    void (*release)(void * base); /* NULL: free() */
} host_buffer_ctx;

static char * at(const ferry_tensor * t, size_t offset) { return (char *) ferry_tensor_data(t) + offset; }

static void host_free(ferry_buffer * buf) {
    host_buffer_ctx * ctx = buf->context;
    if (ctx->release) {
        ctx->release(ctx->base);
    } else {
        free(ctx->base);
    }
    free(ctx);
}

static void * host_base(const ferry_buffer * buf) { return ((host_buffer_ctx *) buf->context)->base; }

static ferry_status host_memset(ferry_buffer * buf, ferry_tensor * t, uint8_t value, size_t offset, size_t size) {
    (void) buf;
    memset(at(t, offset), value, size);
    return FERRY_OK;
}

static ferry_status host_set(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size) {
    (void) buf;
    memmove(at(t, offset), data, size);
    return FERRY_OK;
}

static ferry_status host_get(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset, size_t size) {
    (void) buf;
    memmove(data, at(t, offset), size);
    return FERRY_OK;
}

static ferry_status host_set_2d(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size,
                                size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) buf;
    char * dst = at(t, offset);
    const char * src = data;
    for (size_t i = 0; i < n_copies; i++) {
        memmove(dst + i * stride_tensor, src + i * stride_data, size);
    }
    return FERRY_OK;
}

static ferry_status host_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset, size_t size,
                                size_t n_copies, size_t stride_tensor, size_t stride_data) {
    (void) buf;
    const char * src = at(t, offset);
    char * dst = data;
    for (size_t i = 0; i < n_copies; i++) {
        memmove(dst + i * stride_data, src + i * stride_tensor, size);
    }
    return FERRY_OK;
}

static ferry_status host_cpy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    (void) buf;
    if (!ferry_buffer_ptr_readable(ferry_tensor_buffer(src), buf)) {
        return FERRY_ERR_UNSUPPORTED; /* no message: the caller falls back */
    }
    memmove(ferry_tensor_data(dst), ferry_tensor_data(src), ferry_tensor_nbytes(src));
    return FERRY_OK;
}

static ferry_status host_clear(ferry_buffer * buf, uint8_t value) {
    memset(host_base(buf), value, buf->size);
    return FERRY_OK;
}

static const struct ferry_buffer_i host_buffer_iface = {
    .free_buffer = host_free,
    .get_base = host_base,
    .memset_tensor = host_memset,
    .set_tensor = host_set,
    .get_tensor = host_get,
    .set_tensor_2d = host_set_2d,
    .get_tensor_2d = host_get_2d,
    .cpy_tensor = host_cpy,
    .clear = host_clear,
};

ferry_status ferry_host_buffer_new(ferry_buffer_type * buft, size_t size, size_t alignment, ferry_buffer ** out) {
    /* aligned_alloc wants a size that is a multiple of the alignment, and never zero */
    size_t rounded = size ? size : 1;
    if (!ferry_add_ok(rounded, alignment - 1, &rounded)) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "host buffer: %zu bytes overflow", size);
    }
    rounded -= rounded % alignment;
    host_buffer_ctx * ctx = ferry_calloc(1, sizeof(*ctx));
    void * base = ctx ? ferry_aligned_alloc(alignment, rounded) : NULL;
    if (!base) {
        free(ctx);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "host buffer: cannot allocate %zu bytes", size);
    }
    ctx->base = base;
    ferry_status st = ferry_buffer_init(buft, host_buffer_iface, ctx, size, out);
    if (st != FERRY_OK) {
        free(base);
        free(ctx);
    }
    return st;
}

ferry_status ferry_host_buffer_wrap(ferry_buffer_type * buft, void * base, size_t size, void (*release)(void * base),
                                    ferry_buffer ** out) {
    host_buffer_ctx * ctx = ferry_calloc(1, sizeof(*ctx));
    if (!ctx) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "host buffer: out of memory");
    }
    ctx->base = base;
    ctx->release = release;
    const ferry_status st = ferry_buffer_init(buft, host_buffer_iface, ctx, size, out);
    if (st != FERRY_OK) {
        free(ctx); /* base stays the caller's */
    }
    return st;
}

/* ---------------------------------------------------------------- the host buffer type */

#define HOST_ALIGNMENT 64

static const char * host_buft_name(const ferry_buffer_type * buft) {
    (void) buft;
    return "CPU";
}

static ferry_status host_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    return ferry_host_buffer_new(buft, size, HOST_ALIGNMENT, out);
}

static size_t host_buft_alignment(const ferry_buffer_type * buft) {
    (void) buft;
    return HOST_ALIGNMENT;
}

static bool host_buft_is_host(const ferry_buffer_type * buft) {
    (void) buft;
    return true;
}

static ferry_buffer_type host_buffer_type = {
    .iface = {
        .get_name = host_buft_name,
        .alloc_buffer = host_buft_alloc,
        .get_alignment = host_buft_alignment,
        .is_host = host_buft_is_host,
    },
};

ferry_buffer_type * ferry_host_buffer_type(void) { return &host_buffer_type; }
