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
