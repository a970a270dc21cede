/*
 * ferry: a ggml-like backend layer (tensors, buffer types, buffers, backends) and a
 * scheduler that copies each split's inputs to the backend running the split.
 *
 * This header is the whole public ABI: it includes one header per concern, each in
 * lib/include/ferry/ (docs/architecture.md says which sources implement each).
 *
 * The Python binding's cdef is this file run through the preprocessor with FERRY_CDEF
 * defined, so every header must stay plain C that cffi can read: system includes only
 * under #ifndef FERRY_CDEF, no inline functions, no function-like macros.
 *
 * Conventions are ggml's: ne[0] is the fastest dimension, nb[i] is the byte stride of
 * dimension i, nb[0] the element (or block) size.
 *
 * Errors: every function that can fail returns a ferry_status; on failure a message
 * is left for ferry_last_error() (per thread). No public function aborts on bad input.
 * A failed allocation (host memory, or CUDA's) returns FERRY_ERR_OUT_OF_MEMORY, frees
 * what the call had made, and leaves the objects as usable as before the call.
 *
 * Threads: objects that share nothing may be used from several threads at once: one
 * thread's backends, buffers, contexts, tensors, graphs, KV cache and scheduler, another
 * thread's own. The state the library keeps for the whole process (buffer ids, the CPU
 * buffer type, the CUDA buffer types and pinned ranges) is locked, and the error message
 * is per thread. One object must not be used from two threads at the same time, reads
 * included (a transfer counts its bytes into the buffer's statistics): not a backend, a
 * buffer or a tensor in it, a context, a graph, a KV cache or a scheduler. A tensor or
 * buffer that two schedulers read (one KV cache shared by two threads) needs the
 * caller's lock. The Python binding releases the GIL around every call into the library.
 * A backend's copy queue is one object with its backend: the stand-in's runs a worker
 * thread of its own, which touches only the memory queued copies name, and a caller must
 * not write the source or read the destination of a queued copy before an event recorded
 * after it was reached (the scheduler waits on them).
 */
#ifndef FERRY_H
#define FERRY_H

#include "ferry/common.h"
#include "ferry/tensor.h"
#include "ferry/backend.h"
#include "ferry/graph.h"
#include "ferry/kv.h"
#include "ferry/copy.h"
#include "ferry/paged.h"
#include "ferry/block-pool.h"
#include "ferry/sched.h"
#include "ferry/step.h"
#include "ferry/cuda.h"
#include "ferry/interop.h"

#endif /* FERRY_H */
