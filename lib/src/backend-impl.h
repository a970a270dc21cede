/*
 * What a backend builds on, and all it may call of the generic layer: each buffer type, buffer
 * and backend is a struct of function pointers plus a context, as in ggml. Public functions
 * (buffer.c, backend.c) check arguments and dispatch here; optional entries left NULL take a
 * generic path. The generic layer's own internals are ferry-impl.h's and copy-impl.h's, which no
 * backend includes (tests/python/test_c_layout.py).
 */
#ifndef FERRY_BACKEND_IMPL_H
#define FERRY_BACKEND_IMPL_H

#include "ferry.h"
#include "alloc-hook.h" /* ferry_malloc and kin: every allocation, for the fault-injection hook */

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors (error.c) */

/* Record a failure for ferry_last_error() and return its status. */
ferry_status ferry_fail(ferry_status status, const char * fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define FERRY_CHECK_ARG(cond, ...) \
    do { if (!(cond)) return ferry_fail(FERRY_ERR_INVALID_ARG, __VA_ARGS__); } while (0)
#define FERRY_TRY(expr) \
    do { ferry_status ferry_try_st_ = (expr); if (ferry_try_st_ != FERRY_OK) return ferry_try_st_; } while (0)

/* ---------------------------------------------------------------- sizes (sizes.c) */

/* Overflow-checked arithmetic on sizes: false on overflow. */
static inline bool ferry_add_ok(size_t a, size_t b, size_t * out) { return !__builtin_add_overflow(a, b, out); }
static inline bool ferry_mul_ok(size_t a, size_t b, size_t * out) { return !__builtin_mul_overflow(a, b, out); }

/* ---------------------------------------------------------------- the clock (event.c) */

/* The host's monotonic clock, in seconds: every time ferry measures. */
double ferry_now_seconds(void);

/* ---------------------------------------------------------------- types (types.c) */

float ferry_f16_to_f32(uint16_t h);
uint16_t ferry_f32_to_f16(float f);
float ferry_bf16_to_f32(uint16_t h);
uint16_t ferry_f32_to_bf16(float f);

/* ---------------------------------------------------------------- tensors (tensor.c) */

/* Refresh a view's data and buffer from its source; returns the data pointer or NULL. */
void * ferry_tensor_data(const ferry_tensor * t);
ferry_buffer * ferry_tensor_buffer(const ferry_tensor * t);

/* ---------------------------------------------------------------- buffer types and buffers */

struct ferry_buffer_type_i {
    const char * (*get_name)(const ferry_buffer_type * buft);
    ferry_status (*alloc_buffer)(ferry_buffer_type * buft, size_t size, ferry_buffer ** out);
    size_t (*get_alignment)(const ferry_buffer_type * buft);
    size_t (*get_max_size)(const ferry_buffer_type * buft);                            /* optional: SIZE_MAX */
    size_t (*get_alloc_size)(const ferry_buffer_type * buft, const ferry_tensor * t); /* optional: nbytes */
    bool   (*is_host)(const ferry_buffer_type * buft);
    /* optional: false. Buffers of this type hand out addresses with nothing behind them
     * (ferry_buffer_is_synthetic). */
    bool   (*is_synthetic)(const ferry_buffer_type * buft);
    /* optional: host memory where is_host, else none. Whose memory the buffers are, for
     * another library to read at their addresses (ferry_tensor_memory): false for none. */
    bool   (*get_memory)(const ferry_buffer_type * buft, ferry_memory_kind * kind, int * device);
};

struct ferry_buffer_type {
    struct ferry_buffer_type_i iface;
    void * context;
};

/*
 * Offsets in the buffer interface are relative to the tensor's data pointer, which
 * the public layer has already checked to lie, with the whole extent, inside the buffer.
 */
struct ferry_buffer_i {
    void   (*free_buffer)(ferry_buffer * buf);
    void * (*get_base)(const ferry_buffer * buf);
    ferry_status (*memset_tensor)(ferry_buffer * buf, ferry_tensor * t, uint8_t value, size_t offset, size_t size);
    ferry_status (*set_tensor)(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size);
    ferry_status (*get_tensor)(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset, size_t size);
    /* optional: a loop of set_tensor / get_tensor */
    ferry_status (*set_tensor_2d)(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                  size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    ferry_status (*get_tensor_2d)(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                  size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data);
    /* optional: copy src (any buffer) into dst (this buffer); UNSUPPORTED if it cannot */
    ferry_status (*cpy_tensor)(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst);
    ferry_status (*clear)(ferry_buffer * buf, uint8_t value);
};

struct ferry_buffer {
    struct ferry_buffer_i iface;
    ferry_buffer_type * buft;
    void * context;
    size_t size;
    ferry_buffer_usage usage;
    uint64_t id;
    ferry_stats stats;
};

/* Build a buffer around an interface and context; registers it as live. */
ferry_status ferry_buffer_init(ferry_buffer_type * buft, struct ferry_buffer_i iface, void * context,
                               size_t size, ferry_buffer ** out);

/* Synthetic buffers (a dummy backend without real_memory) hand out addresses with nothing
 * behind them; one that claims host memory (is_host) must still never be read or written
 * through them. */
bool ferry_buffer_is_synthetic(const ferry_buffer * buf);
/* The plain host buffer type (host-buffer.c), named "CPU": the CPU backend's own, and that
 * of host memory another library owns. */
ferry_buffer_type * ferry_host_buffer_type(void);
/* Plain host memory buffers (the host buffer type, the dummy's real memory). */
ferry_status ferry_host_buffer_new(ferry_buffer_type * buft, size_t size, size_t alignment, ferry_buffer ** out);
/* A host buffer around memory allocated elsewhere (pinned memory); release frees base. */
ferry_status ferry_host_buffer_wrap(ferry_buffer_type * buft, void * base, size_t size, void (*release)(void * base),
                                    ferry_buffer ** out);

/* ---------------------------------------------------------------- backends */

typedef struct ferry_graph ferry_graph;

struct ferry_backend_i {
    const char * (*get_name)(const ferry_backend * backend);
    void (*free)(ferry_backend * backend);
    ferry_buffer_type * (*get_default_buffer_type)(ferry_backend * backend);
    bool (*supports_buft)(ferry_backend * backend, ferry_buffer_type * buft);
    bool (*supports_op)(ferry_backend * backend, const ferry_tensor * op); /* optional: false */

    /* optional: transfers queued on the backend, done by its next synchronize; without
     * them a transfer is the buffer's own, done before the call returns */
    ferry_status (*set_tensor_async)(ferry_backend * backend, ferry_tensor * t, const void * data,
                                     size_t offset, size_t size);
    ferry_status (*get_tensor_async)(ferry_backend * backend, const ferry_tensor * t, void * data,
                                     size_t offset, size_t size);
    /* optional: a loop of the plain async transfers */
    ferry_status (*set_tensor_2d_async)(ferry_backend * backend, ferry_tensor * t, const void * data,
                                        size_t offset, size_t size, size_t n_copies,
                                        size_t stride_tensor, size_t stride_data);
    ferry_status (*get_tensor_2d_async)(ferry_backend * backend, const ferry_tensor * t, void * data,
                                        size_t offset, size_t size, size_t n_copies,
                                        size_t stride_tensor, size_t stride_data);
    /* optional: UNSUPPORTED makes the caller fall back to a blocking copy */
    ferry_status (*cpy_tensor_async)(ferry_backend * backend_src, ferry_backend * backend_dst,
                                     const ferry_tensor * src, ferry_tensor * dst);
    ferry_status (*synchronize)(ferry_backend * backend); /* optional: nothing to wait for */
    /* optional: compute the nodes of a graph, in order (graph.c defines the graph) */
    ferry_status (*graph_compute)(ferry_backend * backend, ferry_graph * graph);
    /* optional: events (event.c); without it ferry_event_new is UNSUPPORTED */
    ferry_status (*event_new)(ferry_backend * backend, uint32_t flags, ferry_event ** out);
    /* optional: what copies into this backend cost, for the plan policy; else the CPU's */
    ferry_copy_cost_model (*copy_cost_model)(const ferry_backend * backend);
    /* optional: make the backend's copy queue (ferry_backend_get_copy_queue), a backend of its
     * own whose transfers into this backend's memory run in order beside this one's compute,
     * and whose events this backend can wait on */
    ferry_status (*copy_queue_new)(ferry_backend * backend, ferry_backend ** out);
    /* optional: UNSUPPORTED. The memory the backend allocates from (ferry_backend_get_memory). */
    ferry_status (*get_memory)(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes);
    /* optional: none. The gather methods it offers in one call (a bit 1 << method each, of
     * FERRY_GATHER_BATCHED and FERRY_GATHER_KERNEL) for a source of span bytes of host memory at src */
    unsigned (*gather_methods)(const ferry_backend * backend, const void * src, size_t span);
    /* optional, with gather_methods: a paged window's gather in one call by method, n pieces of
     * host memory from src into t (offsets from src and from t's data), queued as a set is */
    ferry_status (*set_tensor_gather_async)(ferry_backend * backend, ferry_tensor * t, const char * src,
                                            const ferry_gather_copy * pieces, size_t n, ferry_gather_method method);
    /* optional, with FERRY_GATHER_MERGED among gather_methods: the spans cross the link in one
     * call, and the pieces (runs within them) are placed in t (ferry_backend_tensor_gather_merged_async). */
    ferry_status (*set_tensor_gather_merged_async)(ferry_backend * backend, ferry_tensor * t, const char * src,
                                                   const ferry_gather_copy * spans, size_t n_spans,
                                                   const ferry_gather_copy * pieces, size_t n);
};

struct ferry_backend {
    struct ferry_backend_i iface;
    void * context;
    ferry_stats stats;
    ferry_backend * copy_queue; /* made at the first ask, freed with the backend */
    ferry_backend * queue_of;   /* a copy queue's backend, whose cost model it follows; else NULL */
    bool has_cost_model;        /* cost_model set by ferry_backend_set_copy_cost_model */
    ferry_copy_cost_model cost_model;
};

ferry_status ferry_backend_init(struct ferry_backend_i iface, void * context, ferry_backend ** out);

/* Events: made by a backend's event_new, which fills the interface and context. */
struct ferry_event_i {
    void (*free)(ferry_event * event);
    ferry_status (*record)(ferry_event * event, ferry_backend * backend);
    /* UNSUPPORTED: backend cannot wait on the device; the caller waits on the host */
    ferry_status (*wait)(ferry_backend * backend, ferry_event * event);
    ferry_status (*synchronize)(ferry_event * event);
    ferry_status (*elapsed_ms)(const ferry_event * start, const ferry_event * end, float * out); /* optional */
    /* optional: when the event was reached, on the host's clock (ferry_now_seconds); a queue run
     * by a host thread knows it, a device stream does not */
    ferry_status (*reached_seconds)(const ferry_event * event, double * out);
};

struct ferry_event {
    struct ferry_event_i iface;
    ferry_backend * backend;
    void * context;
};

/* The gather methods backend offers in one call for src (backend.c): 0 without the entry. */
unsigned ferry_backend_gather_methods(const ferry_backend * backend, const void * src, size_t span);

/* ---------------------------------------------------------------- a window's lengths (copy-path.c) */

/*
 * The one check of the lengths a window carries, made before a byte of it moves (copy-path.c), and
 * by a kernel before it reads them: each in 0..its limit, and a paged window's within the cells its
 * sequence holds; refused naming the window, the stream, the length and the bound, prefixed by
 * `what`. Lengths the host cannot read are refused only where they must be read (must_read: the
 * ragged policy; a paged window always), and otherwise left to the copy, which never reads them. A
 * tensor carrying no lengths passes.
 */
ferry_status ferry_check_used_lengths(const ferry_tensor * t, bool must_read, const char * what);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_BACKEND_IMPL_H */
