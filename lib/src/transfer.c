/* Blocking transfers between host memory and tensors: checks, dispatch, counting. */
#include "ferry-impl.h"

#include <stdlib.h>

ferry_status ferry_check_transfer(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                  size_t n_copies, size_t stride_tensor, const char * what) {
    FERRY_CHECK_ARG(t, "%s: NULL tensor", what);
    FERRY_TRY(ferry_tensor_check_not_paged(t, what));
    FERRY_TRY(ferry_tensor_check_allocated(t));
    if (size > (size_t) INT64_MAX || offset > (size_t) INT64_MAX) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: offset %zu or size %zu is not a valid size", what, offset, size);
    }
    FERRY_CHECK_ARG(data || size == 0 || n_copies == 0, "%s: NULL data", what);
    const size_t nbytes = ferry_tensor_nbytes(t);
    size_t end;
    if (!ferry_extent_2d(offset, size, n_copies ? n_copies : 1, stride_tensor, &end) || end > nbytes) {
        if (n_copies > 1) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS,
                              "%s: %zu rows of %zu bytes at offset %zu, stride %zu, reach past the %zu bytes of '%s'",
                              what, n_copies, size, offset, stride_tensor, nbytes, t->name);
        }
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: %zu bytes at offset %zu reach past the %zu bytes of '%s'",
                          what, size, offset, nbytes, t->name);
    }
    return FERRY_OK;
}

ferry_status ferry_check_transfer_2d(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                     size_t n_copies, size_t stride_tensor, size_t stride_data, const char * what) {
    FERRY_TRY(ferry_check_transfer(t, data, offset, size, n_copies, stride_tensor, what));
    if (n_copies > 1 && (stride_tensor < size || stride_data < size)) { /* rows overlapping themselves */
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: strides (tensor %zu, data %zu) are smaller than the row of %zu bytes",
                          what, stride_tensor, stride_data, size);
    }
    return FERRY_OK;
}

ferry_status ferry_tensor_check_transfer(const ferry_tensor * t, size_t offset, size_t size, size_t n_copies,
                                         size_t stride_tensor, size_t stride_data, const char * what) {
    /* t stands for data: any pointer but NULL */
    return ferry_check_transfer_2d(t, t, offset, size, n_copies, stride_tensor, stride_data,
                                   what ? what : "tensor_check_transfer");
}

ferry_status ferry_buffer_transfer(ferry_buffer * buf, bool set, ferry_tensor * t, char * data, size_t offset,
                                    size_t size) {
    return set ? buf->iface.set_tensor(buf, t, data, offset, size) : buf->iface.get_tensor(buf, t, data, offset, size);
}

ferry_status ferry_transfer_1d(bool set, ferry_tensor * t, char * data, size_t offset, size_t size) {
    const char * what = set ? "tensor_set" : "tensor_get";
    FERRY_TRY(ferry_check_transfer(t, data, offset, size, 1, 0, what));
    if (size == 0) {
        return FERRY_OK;
    }
    ferry_buffer * buf = ferry_tensor_buffer(t);
    FERRY_TRY(ferry_buffer_transfer(buf, set, t, data, offset, size));
    ferry_stats_add(&buf->stats, set ? FERRY_XFER_SET : FERRY_XFER_GET, size, 1);
    return FERRY_OK;
}

ferry_status ferry_tensor_set(ferry_tensor * t, const void * data, size_t offset, size_t size) {
    return ferry_transfer_1d(true, t, (char *) data, offset, size); /* a set only reads data */
}

ferry_status ferry_tensor_get(const ferry_tensor * t, void * data, size_t offset, size_t size) {
    return ferry_transfer_1d(false, (ferry_tensor *) t, data, offset, size); /* a get only reads t */
}

ferry_status ferry_tensor_memset(ferry_tensor * t, uint8_t value, size_t offset, size_t size) {
    FERRY_TRY(ferry_check_transfer(t, &value, offset, size, 1, 0, "tensor_memset"));
    if (size == 0) {
        return FERRY_OK;
    }
    ferry_buffer * buf = ferry_tensor_buffer(t);
    FERRY_TRY(buf->iface.memset_tensor(buf, t, value, offset, size));
    ferry_stats_add(&buf->stats, FERRY_XFER_MEMSET, size, 1);
    return FERRY_OK;
}

/* n_copies rows between data and t (set writes t): the buffer's 2-D transfer, or a loop of
 * its plain one. */
static ferry_status transfer_2d(bool set, ferry_tensor * t, char * data, size_t offset, size_t size, size_t n_copies,
                                size_t stride_tensor, size_t stride_data) {
    FERRY_TRY(ferry_check_transfer_2d(t, data, offset, size, n_copies, stride_tensor, stride_data,
                                      set ? "tensor_set_2d" : "tensor_get_2d"));
    if (size == 0 || n_copies == 0) {
        return FERRY_OK;
    }
    ferry_buffer * buf = ferry_tensor_buffer(t);
    uint64_t impl_calls = 1;
    if (n_copies > 1 && set && buf->iface.set_tensor_2d) {
        FERRY_TRY(buf->iface.set_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data));
    } else if (n_copies > 1 && !set && buf->iface.get_tensor_2d) {
        FERRY_TRY(buf->iface.get_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data));
    } else {
        for (size_t i = 0; i < n_copies; i++) {
            FERRY_TRY(ferry_buffer_transfer(buf, set, t, data + i * stride_data, offset + i * stride_tensor, size));
        }
        impl_calls = n_copies;
    }
    ferry_stats_add(&buf->stats, set ? FERRY_XFER_SET_2D : FERRY_XFER_GET_2D, (uint64_t) size * n_copies, impl_calls);
    return FERRY_OK;
}

ferry_status ferry_tensor_set_2d(ferry_tensor * t, const void * data, size_t offset, size_t size, size_t n_copies,
                                 size_t stride_tensor, size_t stride_data) {
    return transfer_2d(true, t, (char *) data, offset, size, n_copies, stride_tensor, stride_data);
}

ferry_status ferry_tensor_get_2d(const ferry_tensor * t, void * data, size_t offset, size_t size, size_t n_copies,
                                 size_t stride_tensor, size_t stride_data) {
    return transfer_2d(false, (ferry_tensor *) t, data, offset, size, n_copies, stride_tensor, stride_data);
}

ferry_status ferry_tensor_copy(const ferry_tensor * src, ferry_tensor * dst) {
    FERRY_CHECK_ARG(src && dst, "tensor_copy: NULL tensor");
    if (!ferry_tensor_same_layout(src, dst)) {
        return ferry_fail(FERRY_ERR_LAYOUT,
                          "tensor_copy: '%s' (%s [%lld, %lld, %lld, %lld]) and '%s' (%s [%lld, %lld, %lld, %lld]) "
                          "differ in type, shape or strides",
                          src->name, ferry_type_name(src->type), (long long) src->ne[0], (long long) src->ne[1],
                          (long long) src->ne[2], (long long) src->ne[3], dst->name, ferry_type_name(dst->type),
                          (long long) dst->ne[0], (long long) dst->ne[1], (long long) dst->ne[2],
                          (long long) dst->ne[3]);
    }
    FERRY_TRY(ferry_tensor_check_not_paged(src, "tensor_copy"));
    FERRY_TRY(ferry_tensor_check_not_paged(dst, "tensor_copy"));
    FERRY_TRY(ferry_tensor_check_allocated(src));
    FERRY_TRY(ferry_tensor_check_allocated(dst));
    if (src == dst) {
        return FERRY_OK;
    }
    const size_t nbytes = ferry_tensor_nbytes(src);
    ferry_buffer * src_buf = ferry_tensor_buffer(src);
    ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    if (ferry_buffer_ptr_readable(src_buf, dst_buf)) {
        return ferry_tensor_set(dst, ferry_tensor_data(src), 0, nbytes);
    }
    if (ferry_buffer_ptr_writable(dst_buf, src_buf)) {
        return ferry_tensor_get(src, ferry_tensor_data(dst), 0, nbytes);
    }
    if (dst_buf->iface.cpy_tensor) {
        const ferry_status st = dst_buf->iface.cpy_tensor(dst_buf, src, dst);
        if (st == FERRY_OK) {
            ferry_stats_add(&dst_buf->stats, FERRY_XFER_COPY, nbytes, 1);
            return FERRY_OK;
        }
        if (st != FERRY_ERR_UNSUPPORTED) {
            return st;
        }
    }
    /* Neither side's memory can go by pointer and the buffers cannot copy: stage through the
     * host (zeroed: a synthetic source writes nothing into it). */
    void * staging = ferry_calloc(nbytes ? nbytes : 1, 1);
    if (!staging) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "tensor_copy: cannot stage %zu bytes", nbytes);
    }
    ferry_status st = ferry_tensor_get(src, staging, 0, nbytes);
    if (st == FERRY_OK) {
        st = ferry_tensor_set(dst, staging, 0, nbytes);
    }
    free(staging);
    return st;
}
