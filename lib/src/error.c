/* Thread-local error state: the message behind every failed status. */
#include "ferry-impl.h"

#include <stdio.h>

static _Thread_local char last_message[512];
static _Thread_local ferry_status last_status = FERRY_OK;

static const char * const status_names[FERRY_STATUS_COUNT] = {
    "ok", "invalid argument", "out of bounds", "not allocated", "layout mismatch",
    "unknown type", "freed buffer", "out of memory", "unsupported", "backend error",
};

ferry_status ferry_fail(ferry_status status, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_message, sizeof(last_message), fmt, args);
    va_end(args);
    last_status = status;
    return status;
}

const char * ferry_last_error(void) { return last_message; }
ferry_status ferry_last_status(void) { return last_status; }

void ferry_clear_error(void) {
    last_message[0] = '\0';
    last_status = FERRY_OK;
}

const char * ferry_status_name(ferry_status status) {
    if ((int) status < 0 || status >= FERRY_STATUS_COUNT) {
        return "unknown status";
    }
    return status_names[status];
}

bool ferry_extent_2d(size_t offset, size_t size, size_t n_copies, size_t stride, size_t * end) {
    size_t last_row = 0;
    if (n_copies > 1 && !ferry_mul_ok(n_copies - 1, stride, &last_row)) {
        return false;
    }
    size_t start = 0;
    return ferry_add_ok(offset, last_row, &start) && ferry_add_ok(start, size, end);
}

bool ferry_rows_extent(size_t size, size_t n_copies, size_t stride_data, size_t * out) {
    if (!out) {
        return false;
    }
    if (size == 0 || n_copies == 0) {
        *out = 0;
        return true;
    }
    return ferry_extent_2d(0, size, n_copies, stride_data, out);
}

void * ferry_zalloc(size_t size, const char * what) {
    void * p = ferry_calloc(1, size);
    if (!p) {
        ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    return p;
}

ferry_status ferry_new_zeroed(size_t size, const char * what, void ** out) {
    void * p = ferry_zalloc(size, what);
    *out = p ? p : *out;
    return p ? FERRY_OK : FERRY_ERR_OUT_OF_MEMORY;
}
