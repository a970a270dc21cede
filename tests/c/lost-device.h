/*
 * A device that has failed, for tests of the errors a caller gets back: entries for a
 * buffer's or a backend's interface (backend-impl.h) that each return FERRY_ERR_BACKEND with
 * "device: lost", as CUDA's would after a device error. A test puts them in place of a
 * dummy's own entries, on one buffer or backend, and checks with LOST that the error
 * reaches the caller and with nothing_counted that no counter counted the failed transfer.
 */
#ifndef FERRY_LOST_DEVICE_H
#define FERRY_LOST_DEVICE_H

#include "check.h"
#include "backend-impl.h"

static inline ferry_status lost(void) { return ferry_fail(FERRY_ERR_BACKEND, "device: lost"); }

static inline ferry_status lost_set(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                    size_t size) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size;
    return lost();
}
static inline ferry_status lost_get(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                    size_t size) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size;
    return lost();
}
static inline ferry_status lost_memset(ferry_buffer * buf, ferry_tensor * t, uint8_t value, size_t offset,
                                       size_t size) {
    (void) buf, (void) t, (void) value, (void) offset, (void) size;
    return lost();
}
static inline ferry_status lost_clear(ferry_buffer * buf, uint8_t value) {
    (void) buf, (void) value;
    return lost();
}
static inline ferry_status lost_set_2d(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                       size_t size, size_t n, size_t stride_t, size_t stride_d) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size, (void) n, (void) stride_t, (void) stride_d;
    return lost();
}
static inline ferry_status lost_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                       size_t size, size_t n, size_t stride_t, size_t stride_d) {
    (void) buf, (void) t, (void) data, (void) offset, (void) size, (void) n, (void) stride_t, (void) stride_d;
    return lost();
}
static inline ferry_status lost_set_2d_async(ferry_backend * be, ferry_tensor * t, const void * data, size_t offset,
                                             size_t size, size_t n, size_t stride_t, size_t stride_d) {
    (void) be, (void) t, (void) data, (void) offset, (void) size, (void) n, (void) stride_t, (void) stride_d;
    return lost();
}
static inline ferry_status lost_get_2d_async(ferry_backend * be, const ferry_tensor * t, void * data, size_t offset,
                                             size_t size, size_t n, size_t stride_t, size_t stride_d) {
    (void) be, (void) t, (void) data, (void) offset, (void) size, (void) n, (void) stride_t, (void) stride_d;
    return lost();
}
static inline ferry_status lost_synchronize(ferry_backend * be) {
    (void) be;
    return lost();
}

/* expr returns the lost device's error, its message unchanged */
#define LOST(expr)                                                                         \
    do {                                                                                   \
        CHECK_FAILS(expr, FERRY_ERR_BACKEND);                                              \
        CHECK(strcmp(ferry_last_error(), "device: lost") == 0);                            \
    } while (0)

/* No transfer of any kind counted. */
static inline bool nothing_counted(const ferry_stats * s) {
    for (int k = 0; k < FERRY_XFER_COUNT; k++) {
        if (s->calls[k] || s->bytes[k] || s->impl_calls[k]) {
            return false;
        }
    }
    return true;
}

#endif
