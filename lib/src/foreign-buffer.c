/*
 * Memory another library owns (a numpy array, a PyTorch tensor), as a ferry buffer, and
 * the question an exporter asks of a tensor: who can read its bytes, and where.
 */
#include "ferry-impl.h"

static void leave_alone(void * base) { (void) base; /* the owner frees it */ }

ferry_status ferry_host_buffer_from_ptr(void * base, size_t size, ferry_buffer ** out) {
    FERRY_CHECK_ARG(out, "host_buffer_from_ptr: NULL output");
    FERRY_CHECK_ARG(base, "host_buffer_from_ptr: NULL base");
    if (size > (size_t) INT64_MAX || (uintptr_t) base > UINTPTR_MAX - size) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "host_buffer_from_ptr: %zu bytes at %p run past the address space",
                          size, base);
    }
    return ferry_host_buffer_wrap(ferry_host_buffer_type(), base, size, leave_alone, out);
}

ferry_status ferry_tensor_memory(const ferry_tensor * t, ferry_memory_kind * kind, int * device, void ** data) {
    FERRY_CHECK_ARG(t && kind && device && data, "tensor_memory: NULL argument");
    FERRY_TRY(ferry_tensor_check_not_paged(t, "tensor_memory"));
    FERRY_TRY(ferry_tensor_check_allocated(t));
    const ferry_buffer * buf = ferry_tensor_buffer(t);
    const char * name = ferry_buffer_type_name(ferry_buffer_get_type(buf));
    if (ferry_buffer_is_synthetic(buf)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "tensor '%s' lies in a %s buffer of synthetic addresses: "
                          "there is no memory behind it to read", t->name, name);
    }
    if (!ferry_buffer_memory(buf, kind, device)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "tensor '%s' lies in a %s buffer, memory of a backend that "
                          "neither the host nor a CUDA device may read directly", t->name, name);
    }
    *data = ferry_tensor_data(t);
    return FERRY_OK;
}
