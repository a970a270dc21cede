/* ferry/backend.h: transfers, buffer types, buffers, backends and events. */
#ifndef FERRY_BACKEND_H
#define FERRY_BACKEND_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- transfers and their counts (buffer.c) */

typedef enum {
    FERRY_XFER_SET = 0,
    FERRY_XFER_GET = 1,
    FERRY_XFER_SET_2D = 2,
    FERRY_XFER_GET_2D = 3,
    FERRY_XFER_COPY = 4,
    FERRY_XFER_MEMSET = 5,
    FERRY_XFER_COUNT = 6
} ferry_xfer;

/*
 * What a buffer or backend moved. calls and bytes count requests as made through the
 * public API (a 2-D set of n copies of s bytes is one call of n*s bytes); impl_calls
 * counts the operations that carried them out (the same 2-D set done by a backend
 * without a 2-D implementation is n plain sets).
 */
typedef struct {
    uint64_t calls[FERRY_XFER_COUNT];
    uint64_t bytes[FERRY_XFER_COUNT];
    uint64_t impl_calls[FERRY_XFER_COUNT];
} ferry_stats;

FERRY_API const char * ferry_xfer_name(ferry_xfer kind);

/* ---------------------------------------------------------------- buffer types and buffers (buffer.c;
 * the transfers transfer.c) */

typedef enum {
    FERRY_BUFFER_USAGE_ANY = 0,
    FERRY_BUFFER_USAGE_WEIGHTS = 1,
    FERRY_BUFFER_USAGE_COMPUTE = 2
} ferry_buffer_usage;

FERRY_API const char * ferry_buffer_type_name(const ferry_buffer_type * buft);
FERRY_API ferry_status ferry_buffer_type_alloc_buffer(ferry_buffer_type * buft, size_t size, ferry_buffer ** out);
FERRY_API size_t       ferry_buffer_type_alignment(const ferry_buffer_type * buft);
FERRY_API size_t       ferry_buffer_type_max_size(const ferry_buffer_type * buft);
FERRY_API bool         ferry_buffer_type_is_host(const ferry_buffer_type * buft);
/* Bytes a tensor takes in a buffer of this type (nbytes unless the type pads). */
FERRY_API size_t       ferry_buffer_type_alloc_size(const ferry_buffer_type * buft, const ferry_tensor * t);

/* Frees the buffer; tensors placed in it become unallocated for every later call. */
FERRY_API void         ferry_buffer_free(ferry_buffer * buf);
FERRY_API void *       ferry_buffer_base(const ferry_buffer * buf);
FERRY_API size_t       ferry_buffer_size(const ferry_buffer * buf);
FERRY_API ferry_buffer_type * ferry_buffer_get_type(const ferry_buffer * buf);
FERRY_API bool         ferry_buffer_is_host(const ferry_buffer * buf);
FERRY_API ferry_status ferry_buffer_set_usage(ferry_buffer * buf, ferry_buffer_usage usage);
FERRY_API ferry_buffer_usage ferry_buffer_get_usage(const ferry_buffer * buf);
FERRY_API uint64_t     ferry_buffer_id(const ferry_buffer * buf);
FERRY_API bool         ferry_buffer_id_is_live(uint64_t id);
FERRY_API ferry_status ferry_buffer_clear(ferry_buffer * buf, uint8_t value);
/* Place t (not a view) at a byte offset in buf, aligned to the buffer type's alignment. */
FERRY_API ferry_status ferry_buffer_place_tensor(ferry_buffer * buf, ferry_tensor * t, size_t offset);
FERRY_API ferry_status ferry_buffer_get_stats(const ferry_buffer * buf, ferry_stats * out);
FERRY_API void         ferry_buffer_reset_stats(ferry_buffer * buf);

/* Blocking transfers between host memory and a tensor, offsets relative to the tensor. */
FERRY_API ferry_status ferry_tensor_set(ferry_tensor * t, const void * data, size_t offset, size_t size);
FERRY_API ferry_status ferry_tensor_get(const ferry_tensor * t, void * data, size_t offset, size_t size);
FERRY_API ferry_status ferry_tensor_memset(ferry_tensor * t, uint8_t value, size_t offset, size_t size);
/* n_copies rows of size bytes: row i goes to offset + i*stride_tensor in the tensor and
 * comes from data + i*stride_data (the reverse for get). */
FERRY_API ferry_status ferry_tensor_set_2d(ferry_tensor * t, const void * data, size_t offset, size_t size,
                                 size_t n_copies, size_t stride_tensor, size_t stride_data);
FERRY_API ferry_status ferry_tensor_get_2d(const ferry_tensor * t, void * data, size_t offset, size_t size,
                                 size_t n_copies, size_t stride_tensor, size_t stride_data);
/* The checks every transfer of n_copies rows of size bytes makes before it moves a byte:
 * t allocated, offset and size valid sizes, the rows inside t, and for n_copies > 1
 * strides no smaller than the row on either side. Messages begin with what (NULL:
 * "tensor_check_transfer"). A caller that must size its own memory first checks here. */
FERRY_API ferry_status ferry_tensor_check_transfer(const ferry_tensor * t, size_t offset, size_t size, size_t n_copies,
                                         size_t stride_tensor, size_t stride_data, const char * what);
/* The bytes of data a transfer of n_copies rows of size bytes at stride_data reads or writes:
 * (n_copies - 1) * stride_data + size, 0 when size or n_copies is 0 (nothing moves). False
 * when that overflows a size_t. */
FERRY_API bool ferry_rows_extent(size_t size, size_t n_copies, size_t stride_data, size_t * out);
/* The flat copy of nbytes() between tensors of the same layout. */
FERRY_API ferry_status ferry_tensor_copy(const ferry_tensor * src, ferry_tensor * dst);

/* ---------------------------------------------------------------- backends (backend.c; the CPU, dummy
 * and stand-in backends in cpu/, dummy/ and standin/) */

FERRY_API void         ferry_backend_free(ferry_backend * backend);
FERRY_API const char * ferry_backend_name(const ferry_backend * backend);
FERRY_API ferry_buffer_type * ferry_backend_default_buffer_type(ferry_backend * backend);
FERRY_API bool         ferry_backend_supports_buft(ferry_backend * backend, ferry_buffer_type * buft);
FERRY_API bool         ferry_backend_supports_op(ferry_backend * backend, const ferry_tensor * op);
/* Does the backend implement 2-D transfers itself (else they are loops of plain ones)? */
FERRY_API bool         ferry_backend_has_2d(const ferry_backend * backend);
FERRY_API ferry_status ferry_backend_alloc_buffer(ferry_backend * backend, size_t size, ferry_buffer ** out);

FERRY_API ferry_status ferry_backend_tensor_set_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                            size_t offset, size_t size);
FERRY_API ferry_status ferry_backend_tensor_get_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                            size_t offset, size_t size);
FERRY_API ferry_status ferry_backend_tensor_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                               size_t offset, size_t size, size_t n_copies,
                                               size_t stride_tensor, size_t stride_data);
FERRY_API ferry_status ferry_backend_tensor_get_2d_async(ferry_backend * backend, const ferry_tensor * t, void * data,
                                               size_t offset, size_t size, size_t n_copies,
                                               size_t stride_tensor, size_t stride_data);
/* Copy src into dst (same layout) on dst's backend; falls back to a blocking copy. */
FERRY_API ferry_status ferry_backend_tensor_copy_async(ferry_backend * backend_src, ferry_backend * backend_dst,
                                             const ferry_tensor * src, ferry_tensor * dst);
FERRY_API ferry_status ferry_backend_synchronize(ferry_backend * backend);
/*
 * The backend's copy queue: a second, ordered queue beside the one that computes, for
 * copies into the backend's memory (a CUDA backend's second stream; the stand-in device's
 * worker thread). It is a backend of its own for transfers and events (standin/copy-queue.c):
 * what is queued on it runs in order, overlapping the backend's compute, and the backend
 * waits for an event recorded on it with ferry_event_wait. *out is NULL, with FERRY_OK,
 * for a backend without one. Made at the first ask and owned by the backend.
 */
FERRY_API ferry_status ferry_backend_get_copy_queue(ferry_backend * backend, ferry_backend ** out);
FERRY_API ferry_status ferry_backend_get_stats(const ferry_backend * backend, ferry_stats * out);
FERRY_API void         ferry_backend_reset_stats(ferry_backend * backend);
/*
 * The memory the backend allocates from, in bytes: what is free now and the total. CUDA
 * asks its device (cudaMemGetInfo); the CPU, and the dummy backend with real memory, the
 * host (MemAvailable and the physical pages; a container's own limit is not looked at); the
 * stand-in device its memory model, or the host's without one; a dummy backend without
 * real memory has none behind its addresses and says SIZE_MAX for both (no limit). A copy
 * queue answers for its backend. FERRY_ERR_UNSUPPORTED for a backend that cannot say.
 */
FERRY_API ferry_status ferry_backend_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes);

/* The CPU backend and its host buffer type (shared by every CPU backend). */
FERRY_API ferry_status ferry_cpu_backend_new(ferry_backend ** out);
FERRY_API ferry_buffer_type * ferry_cpu_buffer_type(void);

/*
 * The dummy backend, for allocator tests and dry runs. Its buffers are not host memory
 * as far as other backends know. By default they hand out synthetic addresses with no
 * memory behind them: transfers are checked and counted, not performed, and compute
 * does nothing. With real_memory they are backed by memory a test can read, and ops
 * run on the CPU implementations. has_2d off makes 2-D transfers take the generic loop.
 */
typedef struct {
    size_t alignment;       /* a power of two; 0 means 64 */
    size_t max_buffer_size; /* 0 means unbounded */
    bool   real_memory;
    bool   has_2d;
    /* Claim to be host memory (a KV cache at full model scale in a dry run). With
     * synthetic addresses never let a CPU op read it: there is nothing behind it. */
    bool   is_host;
} ferry_dummy_params;

FERRY_API ferry_dummy_params ferry_dummy_default_params(void);
FERRY_API ferry_status ferry_dummy_backend_new(const ferry_dummy_params * params, ferry_backend ** out);
/*
 * The stand-in device, for machines without a GPU: a CPU backend ("CPU (stand-in
 * device)") whose buffers are host memory that no other backend may use (is_host is
 * false), and which uses no memory but its own. A split on it receives its inputs by
 * copy, exactly as a GPU split would, and runs the CPU kernels. Its copy queue is a
 * worker thread, so copies queued there overlap its compute as a GPU's copy stream does.
 */
FERRY_API ferry_status ferry_standin_backend_new(ferry_backend ** out);

/*
 * A stand-in device with a link and a memory size. Every transfer between host memory and
 * its memory (blocking or on its copy queue, 1-D or 2-D, set or get) is done, then held
 * until latency + rows * row_ns + bytes / bandwidth after the link was free for it (rows:
 * those of a 2-D transfer of more than one row; a plain transfer has none; with a piece curve,
 * each piece's bytes at the rate its size reaches), so it completes
 * no sooner than a link of that speed would let it; each direction is one link, taken by one
 * transfer at a time, as a copy engine is. The backend's own async sets (and gathers) are a
 * stream's: they return once their bytes have moved and their place on the link is taken, and
 * synchronize, or a compute on the backend, waits for the link to carry them. Allocations past
 * memory fail with FERRY_ERR_OUT_OF_MEMORY naming the device, the bytes asked and the bytes free; freeing a
 * buffer returns its bytes. A compute slowdown F stands in for a device that computes more
 * slowly than this host: each graph compute completes no sooner than F times the host's own
 * time for it. All zeros (ferry_standin_default_params) is ferry_standin_backend_new: copies at
 * memcpy's speed, memory unlimited, compute at the host's speed.
 */
typedef struct {
    double link_gbps;  /* GB/s, 1e9 bytes a second, each way; 0: unlimited. Else 1e-3 to 1e6 */
    double latency_us; /* added to every transfer; 0 to 1e6 */
    size_t memory;     /* bytes the device has, counted as asked by each buffer; 0: unlimited */
    double compute_slowdown; /* compute takes at least this times the host's time; 0 or 1: as the host. 1 to 1e6 */
    double row_ns;     /* added for each row of a 2-D transfer of more than one row; 0 to 1e6 */
    /* Pieces priced by size, as DMA engines move them (ferry_copy_piece_seconds's curve): a plain
     * transfer and each row of a gather's pieces run at piece_floor_gbps when small, rising to
     * link_gbps past piece_knee_bytes, as sharply as piece_steepness says. 0: every piece at link_gbps.
     * Else 1e-3 up to link_gbps (which must be set), with a knee of 1 B to 1 GiB and a steepness in (0, 256]. */
    double piece_floor_gbps;
    double piece_knee_bytes;
    double piece_steepness;
} ferry_standin_params;

/*
 * What the stand-in's link carried since it was made or reset, both directions, queued
 * transfers included; only with a link modelled (a bandwidth or a latency). copy_seconds
 * is the time the host's copies themselves took (bytes / copy_seconds: the rate the host
 * reached). A transfer whose copy alone ended after its modelled end is late: the host
 * could not copy as fast as the link, which is then not reached; late_seconds sums by how
 * much. A host that is busy or preempted shows late transfers too.
 */
typedef struct {
    uint64_t transfers;
    uint64_t bytes;
    double   modelled_seconds; /* latency + rows * row cost + bytes / bandwidth, summed */
    uint64_t rows;             /* rows charged: those of 2-D transfers of more than one row, and a gather's every row */
    double   copy_seconds;
    uint64_t late;
    double   late_seconds;
    uint64_t computes;             /* graph computes on the device, modelled link or not */
    double   compute_host_seconds; /* the host's own time for them; a slowdown F holds each to F times its own */
} ferry_link_stats;

FERRY_API ferry_standin_params ferry_standin_default_params(void);
/*
 * A named link from published measurements (docs/design.md, "Named links"): "h100-pcie5",
 * "pcie4", "gh200-c2c". *out gets the default params with the link's bandwidth, latency, row cost
 * and piece curve. With peak_gbps > 0 the link is slowed (or sped) to that peak: every rate times
 * peak_gbps / its peak and every fixed cost divided by it, so every transfer takes the same multiple
 * of its time on the named link and the ratios between copies hold on a host slower than the link.
 * INVALID_ARG for an unknown name (naming the known ones) or a peak outside 1e-3 to 1e6.
 */
FERRY_API ferry_status ferry_standin_link_profile(const char * name, double peak_gbps, ferry_standin_params * out);
/* The i-th named link's name, from 0; NULL past the last. */
FERRY_API const char * ferry_standin_link_profile_name(int i);
/* INVALID_ARG for a bandwidth, latency, row cost or compute slowdown out of range (or not a number). */
FERRY_API ferry_status ferry_standin_backend_new_params(const ferry_standin_params * params, ferry_backend ** out);
/* The stand-in's parameters and its link's counters (either output may be NULL);
 * INVALID_ARG for a backend that is not a stand-in device. */
FERRY_API ferry_status ferry_standin_get_link(const ferry_backend * backend, ferry_standin_params * params,
                                              ferry_link_stats * stats);
FERRY_API ferry_status ferry_standin_reset_link_stats(ferry_backend * backend);

/* ---------------------------------------------------------------- events (event.c)
 * Order work between backends without a full synchronize. An event belongs to the
 * backend that made it; a backend that cannot make events gives FERRY_ERR_UNSUPPORTED. */

typedef struct ferry_event ferry_event;

enum {
    FERRY_EVENT_TIMING = 1 /* the event can be timed (ferry_event_elapsed_ms); else it is lighter */
};

FERRY_API ferry_status ferry_event_new(ferry_backend * backend, uint32_t flags, ferry_event ** out);
FERRY_API void         ferry_event_free(ferry_event * event);
/* Mark the point in backend's queued work that the event stands for. */
FERRY_API ferry_status ferry_event_record(ferry_event * event, ferry_backend * backend);
/* Make backend's later work wait for the event, on the device where it can, else on the host. */
FERRY_API ferry_status ferry_event_wait(ferry_backend * backend, ferry_event * event);
/* Block until the work before the event is done. */
FERRY_API ferry_status ferry_event_synchronize(ferry_event * event);
/* Milliseconds between two recorded timing events of the same backend kind. */
FERRY_API ferry_status ferry_event_elapsed_ms(const ferry_event * start, const ferry_event * end, float * out);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_BACKEND_H */
