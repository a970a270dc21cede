/*
 * The stand-in device: what a GPU split looks like on a machine without one. It is
 * the dummy backend with real memory (dummy/), not host memory to anyone and
 * using only its own buffers, so every input of a split on it arrives by the
 * scheduler's copy path as it would on a GPU; it computes with the CPU kernels and
 * claims no op they cannot do. Its copy queue is a worker thread (copy-queue.c): what
 * a CUDA copy stream is to a GPU's compute, on the host's other core.
 */
#include "copy-queue.h"
#include "dummy/dummy-impl.h"

ferry_status ferry_standin_backend_new(ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "standin_backend_new: NULL output");
    ferry_dummy_params p = ferry_dummy_default_params();
    p.real_memory = true; /* real bytes, for the CPU kernels */
    p.has_2d = true;      /* 2-D sets in one call, as cudaMemcpy2DAsync is */
    p.is_host = false;    /* no other backend may read it: inputs are copied in */
    FERRY_TRY(ferry_dummy_backend_new_cpu_ops(&p, "CPU (stand-in device)", out));
    (*out)->iface.copy_queue_new = ferry_worker_copy_queue_new;
    return FERRY_OK;
}
