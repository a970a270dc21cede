/* Zeroed allocations that record out of memory, for constructors at every layer. */
#include "ferry-impl.h"

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
