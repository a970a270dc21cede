/*
 * Internal interfaces: each buffer type, buffer and backend is a struct of function
 * pointers plus a context, as in ggml. Public functions (buffer.c, backend.c) check
 * arguments and dispatch here; optional entries left NULL take a generic path.
 */
#ifndef FERRY_IMPL_H
#define FERRY_IMPL_H

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

/* Byte extent of a 2-D transfer: offset + (n-1)*stride + size, false on overflow. */
bool ferry_extent_2d(size_t offset, size_t size, size_t n_copies, size_t stride, size_t * end);

/* ---------------------------------------------------------------- zeroed allocations (zalloc.c) */

/* size zeroed bytes, or NULL with FERRY_ERR_OUT_OF_MEMORY "<what>: out of memory" recorded. */
void * ferry_zalloc(size_t size, const char * what);
/* A constructor's zeroed object into *out; on failure OUT_OF_MEMORY, *out as it was. */
ferry_status ferry_new_zeroed(size_t size, const char * what, void ** out);

/* ---------------------------------------------------------------- the clock (event.c) */

/* The host's monotonic clock, in seconds: every time ferry measures. */
double ferry_now_seconds(void);
/* When a reached event was reached, on ferry_now_seconds's clock; UNSUPPORTED (no error left)
 * for events that only time against each other (a CUDA stream's). */
ferry_status ferry_event_reached_seconds(const ferry_event * event, double * out);

/* ---------------------------------------------------------------- types (types.c) */

bool  ferry_type_valid(ferry_type type);
float ferry_f16_to_f32(uint16_t h);
uint16_t ferry_f32_to_f16(float f);
float ferry_bf16_to_f32(uint16_t h);
uint16_t ferry_f32_to_bf16(float f);

/* ---------------------------------------------------------------- tensors (tensor.c) */

/* The tensor that owns the memory t reads (t itself unless t is a view). */
const ferry_tensor * ferry_tensor_root(const ferry_tensor * t);
/* Refresh a view's data and buffer from its source; returns the data pointer or NULL. */
void * ferry_tensor_data(const ferry_tensor * t);
ferry_buffer * ferry_tensor_buffer(const ferry_tensor * t);
/* OUT_OF_BOUNDS unless the products of ne[0..n_dims-1] and of ne[1..n_dims-1] (non-negative;
 * elements and rows) fit an int64_t, multiplied left to right. */
ferry_status ferry_check_element_count(const int64_t * ne, int n_dims, const char * what);
/* A paged window of pool (ferry_paged_cache_window): a view struct of the given ne and nb, which
 * need not lie within pool (its bytes are gathered, never read in place), annotated with its
 * source and first sequence. */
ferry_status ferry_tensor_paged_window(ferry_context * ctx, ferry_tensor * pool, const int64_t * ne, const size_t * nb,
                                       const ferry_paged_source * source, int64_t first_seq, ferry_tensor ** out);
/* INVALID_ARG, naming what and t, when t is a paged window: its layout is not where its bytes are. */
ferry_status ferry_tensor_check_not_paged(const ferry_tensor * t, const char * what);
/* A new tensor in ctx with everything zeroed but type; for op constructors. */
ferry_status ferry_tensor_alloc_struct(ferry_context * ctx, ferry_type type, ferry_tensor ** out);
void ferry_tensor_set_contiguous_strides(ferry_tensor * t);

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
void ferry_stats_add(ferry_stats * s, ferry_xfer kind, uint64_t bytes, uint64_t impl_calls);
/* The getters and resetters of buffers' and backends' stats: s NULL for a NULL owner. */
ferry_status ferry_stats_get(const ferry_stats * s, ferry_stats * out);
void ferry_stats_reset(ferry_stats * s);

/*
 * Synthetic buffers (a dummy backend without real_memory) hand out addresses with nothing
 * behind them; one that claims host memory (is_host) must still never be read or written
 * through them. A pointer into a buffer may be given to another buffer's transfer only when
 * the pair allows it: ptr_readable (the source of a set: host memory, synthetic only when
 * the destination is synthetic too, whose set reads nothing) and ptr_writable (the target
 * of a get: host memory, synthetic exactly when the source is, so that a synthetic get
 * writes nothing and a real one never writes to a synthetic address). Copies that cannot
 * go by pointer are staged, and what a synthetic source gives there is zeros.
 */
bool ferry_buffer_is_synthetic(const ferry_buffer * buf);
bool ferry_buffer_ptr_readable(const ferry_buffer * src, const ferry_buffer * dst);
bool ferry_buffer_ptr_writable(const ferry_buffer * dst, const ferry_buffer * src);
/* Whose memory buf is, as its type's get_memory says; false for synthetic memory and for
 * memory no other library may read directly. */
bool ferry_buffer_memory(const ferry_buffer * buf, ferry_memory_kind * kind, int * device);

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

/* The one 2-D copy of a view that reads no byte twice; false (no error left) if it has
 * no such plan. Compact staging packs exactly these views (copy-compact.c). */
bool ferry_single_copy_of(const ferry_tensor * t, ferry_copy_2d * out);

/* Does t carry lengths (ferry_tensor_set_used_cells) in memory the host can read now? (copy-ragged.c) */
bool ferry_used_lengths_readable(const ferry_tensor * t);

/*
 * The one check of the lengths a window carries, made before a byte of it moves (copy-path.c): each
 * in 0..its limit, and a paged window's within the cells its sequence holds; refused naming the
 * window, the stream, the length and the bound, prefixed by `what`. Lengths the host cannot read are
 * refused only where they must be read (must_read: the ragged policy; a paged window always), and
 * otherwise left to the copy, which never reads them. A tensor carrying no lengths passes.
 */
ferry_status ferry_check_used_lengths(const ferry_tensor * t, bool must_read, const char * what);

/* The bytes of t's used cells (ferry_tensor_set_used_cells), what attention reads of it: true and
 * *bytes when t carries lengths the host can read, else false (a length out of range too). */
bool ferry_copy_used_bytes(const ferry_tensor * t, uint64_t * bytes);

/* The ragged route (copy-ragged.c): src's used cells into dst (src's layout, or its compact
 * layout when compact), by ferry_copy_ragged_plan's copies and the backend's cost model; *read
 * gets the bytes moved, which are the bytes read, *predicted the copies' time by that model.
 * from (NULL: from cell 0): per stream, the cells dst already holds; only those after them. */
ferry_status ferry_copy_ragged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, bool compact,
                               const int64_t * from, uint64_t * read, double * predicted);

/* ferry_copy_input_async of only each stream's cells from from[s] to its used length (src carries
 * lengths; not a paged window): what a run adds to a window copied ahead (sched-prefetch.c). */
ferry_status ferry_copy_input_since(ferry_backend * queue, const ferry_tensor * src, ferry_tensor * dst,
                                    const int64_t * from, ferry_copy_stats * stats);

/* ---------------------------------------------------------------- paged windows */

/* A paged cache's block tables (paged-kv.c keeps them, copy-paged.c reads them as a window is
 * copied): per sequence its block ids, how many, and the cells it holds; the gather method. */
typedef struct {
    int64_t n_seq;
    int32_t ** blocks;
    int64_t * n_blocks;
    int64_t * n_cells;
    ferry_gather_method gather;
} ferry_paged_tables;

/* What a paged window gathers from: one per layer's K or V pool (paged-kv.c). */
struct ferry_paged_source {
    const ferry_tensor * pool;
    bool    v_trans;     /* one row per channel holding every pool cell */
    int64_t block_size;
    int64_t pool_cells;  /* n_blocks * block_size */
    int64_t n_embd;      /* channels: rows of a transposed V */
    size_t  cell_bytes;  /* a cell's bytes; a transposed V: one value's */
    const ferry_paged_tables * tables;
};

/* Each stream's used cells of a window carrying lengths (ferry_tensor_set_used_cells), read now as
 * the ragged policy reads them (copy-ragged.c): min(length, the window's cells); refused (with
 * `what` and the window named) for lengths not in host memory or outside 0..the limit. */
ferry_status ferry_read_used_cells(const ferry_tensor * t, const char * what, int64_t * used);

/* How messages name a window's lengths: "lengths 'NAME'", or "unnamed lengths". */
void ferry_lengths_label(const ferry_tensor * lengths, char * out, size_t size);

/* Each stream's used cells of a paged window (copy-paged.c): its lengths read as
 * ferry_read_used_cells reads them, else its sequence's cells up to the window's; refused (with
 * `what` and the window named) for a length past the cells its sequence holds. */
ferry_status ferry_paged_used_cells(const ferry_tensor * t, const char * what, int64_t * used);

/* The paged route (copy-paged.c): src's used cells gathered into dst (its layout) by the method
 * its cache says, *read the bytes moved (the bytes read), *method the method taken, *predicted
 * its time by the backend's cost model. */
ferry_status ferry_copy_paged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, uint64_t * read,
                              ferry_gather_method * method, double * predicted);

/* The gather methods backend offers in one call for src (backend.c): 0 without the entry. */
unsigned ferry_backend_gather_methods(const ferry_backend * backend, const void * src, size_t span);
/* The gather in one call (backend.c): each piece checked to lie in t, dispatched, counted as one
 * 2-D set of all its bytes. */
ferry_status ferry_backend_tensor_gather_async(ferry_backend * backend, ferry_tensor * t, const char * src,
                                               const ferry_gather_copy * pieces, size_t n,
                                               ferry_gather_method method);

/* Checks shared by buffer.c and backend.c: t allocated, the extent inside t (transfer.c). */
ferry_status ferry_check_transfer(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                  size_t n_copies, size_t stride_tensor, const char * what);
/* The same, and for n_copies > 1 strides no smaller than the row on either side. */
ferry_status ferry_check_transfer_2d(const ferry_tensor * t, const void * data, size_t offset, size_t size,
                                     size_t n_copies, size_t stride_tensor, size_t stride_data, const char * what);
/* The buffer's own blocking transfer of size bytes at offset, unchecked: set writes t from
 * data, else reads t into data. */
ferry_status ferry_buffer_transfer(ferry_buffer * buf, bool set, ferry_tensor * t, char * data, size_t offset,
                                   size_t size);
/* ferry_tensor_set (set) or ferry_tensor_get. */
ferry_status ferry_transfer_1d(bool set, ferry_tensor * t, char * data, size_t offset, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_IMPL_H */
