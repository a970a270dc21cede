/* Backends: public dispatch, and the generic paths for what a backend leaves out. */
#include "ferry-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ferry_status ferry_backend_init(struct ferry_backend_i iface, void * context, ferry_backend ** out) {
    ferry_backend * backend = ferry_zalloc(sizeof(*backend), "backend");
    if (!backend) {
        return FERRY_ERR_OUT_OF_MEMORY;
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

/* One row at offset, set writing t: the backend's async transfer, else the buffer's blocking one. */
static ferry_status row_async(ferry_backend * backend, bool set, ferry_tensor * t, char * data, size_t offset,
                              size_t size) {
    if (set && backend->iface.set_tensor_async) {
        return backend->iface.set_tensor_async(backend, t, data, offset, size);
    }
    if (!set && backend->iface.get_tensor_async) {
        return backend->iface.get_tensor_async(backend, t, data, offset, size);
    }
    return ferry_buffer_transfer(ferry_tensor_buffer(t), set, t, data, offset, size);
}

/* An async transfer: the backend's own, or the blocking one (counted as the buffer's). */
static ferry_status transfer_async(ferry_backend * backend, bool set, ferry_tensor * t, char * data, size_t offset,
                                   size_t size) {
    const char * what = set ? "tensor_set_async" : "tensor_get_async";
    const ferry_xfer kind = set ? FERRY_XFER_SET : FERRY_XFER_GET;
    FERRY_TRY(check_backend_tensor(backend, t, what));
    if (set ? !backend->iface.set_tensor_async : !backend->iface.get_tensor_async) {
        FERRY_TRY(ferry_transfer_1d(set, t, data, offset, size));
    } else {
        FERRY_TRY(ferry_check_transfer(t, data, offset, size, 1, 0, what));
        if (size == 0) {
            return FERRY_OK;
        }
        FERRY_TRY(row_async(backend, set, t, data, offset, size));
        ferry_stats_add(&ferry_tensor_buffer(t)->stats, kind, size, 1);
    }
    if (size) {
        ferry_stats_add(&backend->stats, kind, size, 1);
    }
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_set_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                            size_t offset, size_t size) {
    return transfer_async(backend, true, t, (char *) data, offset, size); /* a set only reads data */
}

ferry_status ferry_backend_tensor_get_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                            size_t offset, size_t size) {
    return transfer_async(backend, false, (ferry_tensor *) t, data, offset, size); /* a get only reads t */
}

/* 2-D transfers: the backend's own, or a loop of row_async (n_copies <= 1: one). */
static ferry_status transfer_2d_async(ferry_backend * backend, bool set, ferry_tensor * t, char * data,
                                      size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                      size_t stride_data) {
    const char * what = set ? "tensor_set_2d_async" : "tensor_get_2d_async";
    FERRY_TRY(check_backend_tensor(backend, t, what));
    FERRY_TRY(ferry_check_transfer_2d(t, data, offset, size, n_copies, stride_tensor, stride_data, what));
    if (size == 0 || n_copies == 0) {
        return FERRY_OK;
    }
    uint64_t impl_calls = 1;
    if (n_copies > 1 && set && backend->iface.set_tensor_2d_async) {
        FERRY_TRY(backend->iface.set_tensor_2d_async(backend, t, data, offset, size, n_copies, stride_tensor,
                                                     stride_data));
    } else if (n_copies > 1 && !set && backend->iface.get_tensor_2d_async) {
        FERRY_TRY(backend->iface.get_tensor_2d_async(backend, t, data, offset, size, n_copies, stride_tensor,
                                                     stride_data));
    } else {
        for (size_t i = 0; i < n_copies; i++) {
            FERRY_TRY(row_async(backend, set, t, data + i * stride_data, offset + i * stride_tensor, size));
        }
        impl_calls = n_copies;
    }
    const ferry_xfer kind = set ? FERRY_XFER_SET_2D : FERRY_XFER_GET_2D;
    ferry_stats_add(&ferry_tensor_buffer(t)->stats, kind, (uint64_t) size * n_copies, impl_calls);
    ferry_stats_add(&backend->stats, kind, (uint64_t) size * n_copies, impl_calls);
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                               size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                               size_t stride_data) {
    return transfer_2d_async(backend, true, t, (char *) data, offset, size, n_copies, stride_tensor, stride_data);
}

ferry_status ferry_backend_tensor_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                               size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                               size_t stride_data) {
    return transfer_2d_async(backend, false, (ferry_tensor *) t, data, offset, size, n_copies, stride_tensor,
                             stride_data);
}

ferry_status ferry_backend_tensor_copy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                             const ferry_tensor * src, ferry_tensor * dst) {
    FERRY_CHECK_ARG(backend_src && backend_dst, "tensor_copy_async: NULL backend");
    FERRY_CHECK_ARG(src && dst, "tensor_copy_async: NULL tensor");
    if (!ferry_tensor_same_layout(src, dst)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_copy_async: '%s' and '%s' differ in type, shape or strides",
                          src->name, dst->name);
    }
    FERRY_TRY(ferry_tensor_check_not_paged(src, "tensor_copy_async"));
    FERRY_TRY(ferry_tensor_check_not_paged(dst, "tensor_copy_async"));
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
        backend->copy_queue->queue_of = backend; /* its copies are costed as the backend's */
    }
    *out = backend->copy_queue;
    return FERRY_OK;
}

ferry_status ferry_backend_synchronize(ferry_backend * backend) {
    FERRY_CHECK_ARG(backend, "synchronize: NULL backend");
    return backend->iface.synchronize ? backend->iface.synchronize(backend) : FERRY_OK;
}

ferry_status ferry_backend_get_stats(const ferry_backend * backend, ferry_stats * out) {
    return ferry_stats_get(backend ? &backend->stats : NULL, out);
}

void ferry_backend_reset_stats(ferry_backend * backend) { ferry_stats_reset(backend ? &backend->stats : NULL); }

ferry_status ferry_backend_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    FERRY_CHECK_ARG(backend && free_bytes && total_bytes, "backend_get_memory: NULL argument");
    if (!backend->iface.get_memory) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "backend_get_memory: %s cannot say what memory it has",
                          ferry_backend_name(backend));
    }
    return backend->iface.get_memory(backend, free_bytes, total_bytes);
}

unsigned ferry_backend_gather_methods(const ferry_backend * backend, const void * src, size_t span) {
    return backend && backend->iface.gather_methods ? backend->iface.gather_methods(backend, src, span) : 0;
}

/* Every piece of a gather checked against t and src before any moves; *bytes: the bytes they place.
 * A bad piece is refused naming its index (the message is made only then, off the copy path's way). */
static ferry_status check_gather_pieces(const ferry_tensor * t, const char * src, const ferry_gather_copy * pieces,
                                        size_t n, const char * what, uint64_t * bytes) {
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * c = &pieces[i];
        if (ferry_check_transfer_2d(t, src, c->dst_offset, c->size, c->count, c->dst_stride, c->src_stride, what) !=
            FERRY_OK) {
            char named[96]; /* the array element, as the caller indexes it */
            snprintf(named, sizeof(named), "%s: pieces[%zu]", what, i);
            return ferry_check_transfer_2d(t, src, c->dst_offset, c->size, c->count, c->dst_stride, c->src_stride,
                                           named);
        }
        *bytes += (uint64_t) c->size * c->count;
    }
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_gather_async(ferry_backend * backend, ferry_tensor * t, const char * src,
                                               const ferry_gather_copy * pieces, size_t n,
                                               ferry_gather_method method) {
    const char * what = "tensor_gather_async";
    FERRY_TRY(check_backend_tensor(backend, t, what));
    FERRY_CHECK_ARG(src && (pieces || n == 0), "%s: NULL source or pieces", what);
    if (!backend->iface.set_tensor_gather_async) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s gathers in no single call", what,
                          ferry_backend_name(backend));
    }
    uint64_t bytes = 0;
    FERRY_TRY(check_gather_pieces(t, src, pieces, n, what, &bytes));
    if (bytes == 0) {
        return FERRY_OK;
    }
    FERRY_TRY(backend->iface.set_tensor_gather_async(backend, t, src, pieces, n, method));
    ferry_stats_add(&ferry_tensor_buffer(t)->stats, FERRY_XFER_SET_2D, bytes, 1);
    ferry_stats_add(&backend->stats, FERRY_XFER_SET_2D, bytes, 1);
    return FERRY_OK;
}

ferry_status ferry_backend_tensor_gather_merged_async(ferry_backend * backend, ferry_tensor * t, const char * src,
                                                      const ferry_gather_copy * spans, size_t n_spans,
                                                      const ferry_gather_copy * pieces, size_t n) {
    const char * what = "tensor_gather_merged_async";
    FERRY_TRY(check_backend_tensor(backend, t, what));
    FERRY_CHECK_ARG(src && (spans || n_spans == 0) && (pieces || n == 0), "%s: NULL source, spans or pieces", what);
    if (!backend->iface.set_tensor_gather_merged_async) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: %s does not gather merged spans", what,
                          ferry_backend_name(backend));
    }
    uint64_t placed = 0, crossed = 0; /* the pieces are placed on the device; the spans are what crosses */
    FERRY_TRY(check_gather_pieces(t, src, pieces, n, what, &placed));
    for (size_t i = 0; i < n_spans; i++) {
        crossed += (uint64_t) spans[i].size * spans[i].count;
    }
    if (crossed == 0) {
        return FERRY_OK;
    }
    FERRY_TRY(backend->iface.set_tensor_gather_merged_async(backend, t, src, spans, n_spans, pieces, n));
    ferry_stats_add(&ferry_tensor_buffer(t)->stats, FERRY_XFER_SET_2D, crossed, 1);
    ferry_stats_add(&backend->stats, FERRY_XFER_SET_2D, crossed, 1);
    return FERRY_OK;
}
