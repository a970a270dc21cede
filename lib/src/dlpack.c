/*
 * DLPack managed tensors whose deleter is plain C: a consumer calls it when it lets go of
 * the memory, from any thread and in any state of the interpreter (numpy frees its array,
 * and calls the deleter, while an exception may be unwinding), so it must run no Python.
 * It marks the tensor deleted; the binding polls ferry_dlpack_deleted and releases what
 * the export held from a safe place of its own.
 */
#include "ferry-impl.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
    union { /* first: the consumer's pointer is the box's */
        ferry_dl_managed_tensor legacy;
        ferry_dl_managed_tensor_versioned versioned;
    } managed;
    atomic_bool deleted;
    int64_t dims[2 * FERRY_MAX_DIMS]; /* shape, then strides */
} dlpack_box;

static void mark_deleted(void * self) {
    if (self) {
        atomic_store(&((dlpack_box *) self)->deleted, true);
    }
}

static void legacy_deleter(ferry_dl_managed_tensor * self) { mark_deleted(self); }
static void versioned_deleter(ferry_dl_managed_tensor_versioned * self) { mark_deleted(self); }

ferry_status ferry_dlpack_new(int32_t ndim, bool versioned, void ** out) {
    FERRY_CHECK_ARG(out, "dlpack_new: NULL output");
    FERRY_CHECK_ARG(ndim >= 0 && ndim <= FERRY_MAX_DIMS, "dlpack_new: %d dimensions (0 to %d)", (int) ndim,
                    FERRY_MAX_DIMS);
    dlpack_box * box = ferry_calloc(1, sizeof(*box));
    if (!box) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "dlpack_new: out of memory");
    }
    atomic_init(&box->deleted, false);
    ferry_dl_tensor * dl;
    if (versioned) {
        box->managed.versioned.version = (ferry_dl_version) {1, 0};
        box->managed.versioned.manager_ctx = box;
        box->managed.versioned.deleter = versioned_deleter;
        dl = &box->managed.versioned.dl_tensor;
    } else {
        box->managed.legacy.manager_ctx = box;
        box->managed.legacy.deleter = legacy_deleter;
        dl = &box->managed.legacy.dl_tensor;
    }
    dl->ndim = ndim;
    dl->shape = box->dims;
    dl->strides = box->dims + FERRY_MAX_DIMS;
    *out = box;
    return FERRY_OK;
}

bool ferry_dlpack_deleted(const void * managed) {
    return managed && atomic_load(&((const dlpack_box *) managed)->deleted);
}

void ferry_dlpack_free(void * managed) { free(managed); }

static ferry_capsule_is_valid_fn capsule_is_valid;
static ferry_capsule_pointer_fn capsule_pointer;

ferry_status ferry_dlpack_set_capsule_api(ferry_capsule_is_valid_fn is_valid, ferry_capsule_pointer_fn pointer) {
    FERRY_CHECK_ARG(is_valid && pointer, "dlpack_set_capsule_api: NULL function");
    capsule_is_valid = is_valid;
    capsule_pointer = pointer;
    return FERRY_OK;
}

/* Only ferry's boxes get this destructor, so the pointer is a box, whichever its name. A
 * consumer renames what it takes ("used_dltensor", "used_dltensor_versioned"). */
void ferry_dlpack_capsule_destructor(void * capsule) {
    static const char * const names[2] = {"dltensor", "dltensor_versioned"};
    for (int i = 0; i < 2 && capsule && capsule_is_valid; i++) {
        if (capsule_is_valid(capsule, names[i])) {
            mark_deleted(capsule_pointer(capsule, names[i]));
        }
    }
}
