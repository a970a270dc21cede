/* Backends: public dispatch, and the generic paths for what a backend leaves out. */
#include "ferry-impl.h"

#include <stdlib.h>
#include <string.h>

ferry_status ferry_backend_init(struct ferry_backend_i iface, void * context, ferry_backend ** out) {
    ferry_backend * backend = ferry_calloc(1, sizeof(*backend));
    if (!backend) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "backend: out of memory");
    }
    backend->iface = iface;
    backend->context = context;
    *out = backend;
    return FERRY_OK;
}

void ferry_backend_free(ferry_backend * backend) {
    if (!backend) {
        return;
    }
    ferry_backend_free(backend->copy_queue); /* it finishes what it has queued first */
    if (backend->iface.free) {
        backend->iface.free(backend);
    }
    free(backend);
}

const char * ferry_backend_name(const ferry_backend * backend) {
    return backend ? backend->iface.get_name(backend) : NULL;
}

ferry_buffer_type * ferry_backend_default_buffer_type(ferry_backend * backend) {
    return backend ? backend->iface.get_default_buffer_type(backend) : NULL;
}

bool ferry_backend_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return backend && buft && backend->iface.supports_buft(backend, buft);
}

bool ferry_backend_supports_op(ferry_backend * backend, const ferry_tensor * op) {
    return backend && op && backend->iface.supports_op && backend->iface.supports_op(backend, op);
}

bool ferry_backend_has_2d(const ferry_backend * backend) {
    return backend && backend->iface.set_tensor_2d_async && backend->iface.get_tensor_2d_async;
}

ferry_status ferry_backend_alloc_buffer(ferry_backend * backend, size_t size, ferry_buffer ** out) {
    FERRY_CHECK_ARG(backend, "backend_alloc_buffer: NULL backend");
    return ferry_buffer_type_alloc_buffer(ferry_backend_default_buffer_type(backend), size, out);
}

/* A tensor a backend writes or reads must live in memory that backend can use. */
static ferry_status check_backend_tensor(ferry_backend * backend, const ferry_tensor * t, const char * what) {
    FERRY_CHECK_ARG(backend, "%s: NULL backend", what);
    FERRY_CHECK_ARG(t, "%s: NULL tensor", what);
    FERRY_TRY(ferry_tensor_check_allocated(t));
    ferry_buffer * buf = ferry_tensor_buffer(t);
    if (!ferry_backend_supports_buft(backend, buf->buft)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: backend %s cannot use buffer type %s of '%s'", what,
                          ferry_backend_name(backend), ferry_buffer_type_name(buf->buft), t->name);
    }
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_set_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                            size_t offset, size_t size) {
    FERRY_TRY(check_backend_tensor(backend, t, "tensor_set_async"));
    if (!backend->iface.set_tensor_async) {
        FERRY_TRY(ferry_tensor_set(t, data, offset, size));
    } else {
        FERRY_TRY(ferry_check_transfer(t, data, offset, size, 1, 0, "tensor_set_async"));
        if (size == 0) {
            return FERRY_OK;
        }
        FERRY_TRY(backend->iface.set_tensor_async(backend, t, data, offset, size));
        ferry_stats_add(&ferry_tensor_buffer(t)->stats, FERRY_XFER_SET, size, 1);
    }
    if (size) {
        ferry_stats_add(&backend->stats, FERRY_XFER_SET, size, 1);
    }
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_get_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                            size_t offset, size_t size) {
    FERRY_TRY(check_backend_tensor(backend, t, "tensor_get_async"));
    if (!backend->iface.get_tensor_async) {
        FERRY_TRY(ferry_tensor_get(t, data, offset, size));
    } else {
        FERRY_TRY(ferry_check_transfer(t, data, offset, size, 1, 0, "tensor_get_async"));
        if (size == 0) {
            return FERRY_OK;
        }
        FERRY_TRY(backend->iface.get_tensor_async(backend, t, data, offset, size));
        ferry_stats_add(&ferry_tensor_buffer(t)->stats, FERRY_XFER_GET, size, 1);
    }
    if (size) {
        ferry_stats_add(&backend->stats, FERRY_XFER_GET, size, 1);
    }
    return FERRY_OK;
}

/* 2-D transfers: the backend's own, or a loop of plain async transfers (n_copies <= 1: one). */
ferry_status ferry_backend_tensor_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                               size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                               size_t stride_data) {
    FERRY_TRY(check_backend_tensor(backend, t, "tensor_set_2d_async"));
    FERRY_TRY(ferry_check_transfer(t, data, offset, size, n_copies, stride_tensor, "tensor_set_2d_async"));
    if (n_copies > 1 && (stride_tensor < size || stride_data < size)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_set_2d_async: strides (tensor %zu, data %zu) are smaller than "
                          "the row of %zu bytes", stride_tensor, stride_data, size);
    }
    if (size == 0 || n_copies == 0) {
        return FERRY_OK;
    }
    ferry_buffer * buf = ferry_tensor_buffer(t);
    uint64_t impl_calls = 1;
    if (backend->iface.set_tensor_2d_async && n_copies > 1) {
        FERRY_TRY(backend->iface.set_tensor_2d_async(backend, t, data, offset, size, n_copies, stride_tensor,
                                                     stride_data));
    } else {
        for (size_t i = 0; i < n_copies; i++) {
            const void * row = (const char *) data + i * stride_data;
            const size_t at = offset + i * stride_tensor;
            if (backend->iface.set_tensor_async) {
                FERRY_TRY(backend->iface.set_tensor_async(backend, t, row, at, size));
            } else {
                FERRY_TRY(buf->iface.set_tensor(buf, t, row, at, size));
            }
        }
        impl_calls = n_copies;
    }
    ferry_stats_add(&buf->stats, FERRY_XFER_SET_2D, (uint64_t) size * n_copies, impl_calls);
    ferry_stats_add(&backend->stats, FERRY_XFER_SET_2D, (uint64_t) size * n_copies, impl_calls);
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                               size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                               size_t stride_data) {
    FERRY_TRY(check_backend_tensor(backend, t, "tensor_get_2d_async"));
    FERRY_TRY(ferry_check_transfer(t, data, offset, size, n_copies, stride_tensor, "tensor_get_2d_async"));
    if (n_copies > 1 && (stride_tensor < size || stride_data < size)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_get_2d_async: strides (tensor %zu, data %zu) are smaller than "
                          "the row of %zu bytes", stride_tensor, stride_data, size);
    }
    if (size == 0 || n_copies == 0) {
        return FERRY_OK;
    }
    ferry_buffer * buf = ferry_tensor_buffer(t);
    uint64_t impl_calls = 1;
    if (backend->iface.get_tensor_2d_async && n_copies > 1) {
        FERRY_TRY(backend->iface.get_tensor_2d_async(backend, t, data, offset, size, n_copies, stride_tensor,
                                                     stride_data));
    } else {
        for (size_t i = 0; i < n_copies; i++) {
            void * row = (char *) data + i * stride_data;
            const size_t at = offset + i * stride_tensor;
            if (backend->iface.get_tensor_async) {
                FERRY_TRY(backend->iface.get_tensor_async(backend, t, row, at, size));
            } else {
                FERRY_TRY(buf->iface.get_tensor(buf, t, row, at, size));
            }
        }
        impl_calls = n_copies;
    }
    ferry_stats_add(&buf->stats, FERRY_XFER_GET_2D, (uint64_t) size * n_copies, impl_calls);
    ferry_stats_add(&backend->stats, FERRY_XFER_GET_2D, (uint64_t) size * n_copies, impl_calls);
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_copy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                             const ferry_tensor * src, ferry_tensor * dst) {
    FERRY_CHECK_ARG(backend_src && backend_dst, "tensor_copy_async: NULL backend");
    FERRY_CHECK_ARG(src && dst, "tensor_copy_async: NULL tensor");
    if (!ferry_tensor_same_layout(src, dst)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_copy_async: '%s' and '%s' differ in type, shape or strides",
                          src->name, dst->name);
    }
    FERRY_TRY(ferry_tensor_check_allocated(src));
    FERRY_TRY(ferry_tensor_check_allocated(dst));
    const size_t nbytes = ferry_tensor_nbytes(src);
    if (backend_dst->iface.cpy_tensor_async) {
        const ferry_status st = backend_dst->iface.cpy_tensor_async(backend_src, backend_dst, src, dst);
        if (st == FERRY_OK) {
            ferry_stats_add(&backend_dst->stats, FERRY_XFER_COPY, nbytes, 1);
            ferry_stats_add(&ferry_tensor_buffer(dst)->stats, FERRY_XFER_COPY, nbytes, 1);
            return FERRY_OK;
        }
        if (st != FERRY_ERR_UNSUPPORTED) {
            return st;
        }
    }
    /* The generic path: wait for both sides, then the blocking copy. */
    FERRY_TRY(ferry_backend_synchronize(backend_src));
    FERRY_TRY(ferry_backend_synchronize(backend_dst));
    FERRY_TRY(ferry_tensor_copy(src, dst));
    ferry_stats_add(&backend_dst->stats, FERRY_XFER_COPY, nbytes, 1);
    return FERRY_OK;
}

ferry_status ferry_backend_get_copy_queue(ferry_backend * backend, ferry_backend ** out) {
    FERRY_CHECK_ARG(backend && out, "backend_get_copy_queue: NULL argument");
    if (!backend->copy_queue && backend->iface.copy_queue_new) {
        FERRY_TRY(backend->iface.copy_queue_new(backend, &backend->copy_queue));
    }
    *out = backend->copy_queue;
    return FERRY_OK;
}

ferry_status ferry_backend_synchronize(ferry_backend * backend) {
    FERRY_CHECK_ARG(backend, "synchronize: NULL backend");
    return backend->iface.synchronize ? backend->iface.synchronize(backend) : FERRY_OK;
}

ferry_status ferry_backend_get_stats(const ferry_backend * backend, ferry_stats * out) {
    FERRY_CHECK_ARG(backend && out, "get_stats: NULL argument");
    *out = backend->stats;
    return FERRY_OK;
}

void ferry_backend_reset_stats(ferry_backend * backend) {
    if (backend) {
        memset(&backend->stats, 0, sizeof(backend->stats));
    }
}

ferry_status ferry_backend_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    FERRY_CHECK_ARG(backend && free_bytes && total_bytes, "backend_get_memory: NULL argument");
    if (!backend->iface.get_memory) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "backend_get_memory: %s cannot say what memory it has",
                          ferry_backend_name(backend));
    }
    return backend->iface.get_memory(backend, free_bytes, total_bytes);
}
