/* ferry/sched.h: the scheduler. */
#ifndef FERRY_SCHED_H
#define FERRY_SCHED_H

#include "copy.h"
#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- the scheduler (sched.c, sched-prefetch.c) */

/*
 * The scheduler runs a graph over backends given in priority order. Each node gets a
 * backend: the one it is assigned to, else the first that supports its op and can use
 * the memory of all its sources, else the first that supports its op. Views compute
 * nothing and go with their source. Consecutive nodes on one backend form a split; a
 * source whose memory the split's backend cannot use is an input of the split and
 * gets a copy with the same layout (same ne and nb), placed on that backend by the
 * graph allocator together with the nodes' outputs. Compute runs the splits in order:
 * each input goes through ferry_copy_input under the scheduler's policy just before
 * the first of its split's nodes that reads it, once the nodes before have run (or,
 * prefetching, earlier on the backend's copy queue: ferry_sched_set_prefetch).
 * Sources are redirected to their copies only while the scheduler allocates and
 * computes; the graph is left as it was given.
 */
typedef struct ferry_sched ferry_sched;

typedef struct {
    ferry_backend * backend;
    int first_node;      /* index into the graph's nodes of the split's first node */
    int n_nodes;         /* nodes it computes (views excluded) */
    int first_input;     /* index of its first input in ferry_sched_input */
    int n_inputs;
    double compute_seconds; /* last run */
} ferry_sched_split_info;

typedef struct {
    int split;
    ferry_tensor * src;  /* what the graph reads */
    ferry_tensor * copy; /* its copy on the split's backend */
    ferry_copy_stats stats; /* last run */
} ferry_sched_input_info;

/* Totals of the last run, over all inputs and splits. */
typedef struct {
    uint64_t n_inputs;
    uint64_t bytes_read;  /* what the graph reads through the inputs (ferry_copy_stats.bytes_read, summed):
                           * the same under every policy, a window with lengths counting their cells */
    uint64_t bytes_span;
    uint64_t bytes_copied;
    uint64_t copy_calls;
    uint64_t impl_calls;
    double   copy_seconds;
    double   predicted_seconds; /* the copies' time by each backend's copy cost model */
    double   compute_seconds;
    /* Prefetching (ferry_sched_set_prefetch): inputs copied ahead on a copy queue; the most
     * of them, and their bytes, queued or held on a backend ahead of the part computing
     * (what prefetching holds beyond what the part at hand reads); and the host's time
     * in waits for them (on CUDA the device waits, and the host seldom does). */
    uint64_t prefetched;
    uint64_t ahead_inputs;
    uint64_t ahead_bytes;
    double   wait_seconds;
    /* Across runs (ferry_sched_set_prefetch_next): inputs the last run copied ahead for this one and
     * this one kept, copying only the cells each stream gained since (one with a stream whose length
     * fell below what it had, or what ferry_sched_truncate kept, is copied again, and not counted). */
    uint64_t kept_ahead;
    /* A remote tier (ferry_tensor_set_fetch): inputs whose window was fetched into host memory
     * before its copy, and the calling thread's time in waits for those fetches. */
    uint64_t fetched;
    double   fetch_wait_seconds;
} ferry_sched_stats;

FERRY_API ferry_status ferry_sched_new(ferry_backend * const * backends, int n_backends, ferry_sched ** out);
FERRY_API void         ferry_sched_free(ferry_sched * sched);
/* A change of policy drops the copies made ahead for the next run (ferry_sched_drop_ahead, which it
 * may fail as): the next run copies its first part by the policy asked, and counts it so. */
FERRY_API ferry_status ferry_sched_set_policy(ferry_sched * sched, ferry_copy_policy policy);
FERRY_API ferry_copy_policy ferry_sched_get_policy(const ferry_sched * sched);
/* keep_inputs: input copies and the leafs the scheduler places live to the end of the
 * graph, for whoever reads them after compute (off by default: each input copy is placed
 * just before the first node that reads it, in memory the nodes before may have freed,
 * and freed after its last use). Takes effect at the next alloc. */
FERRY_API ferry_status ferry_sched_set_keep_inputs(ferry_sched * sched, bool keep);
FERRY_API bool         ferry_sched_get_keep_inputs(const ferry_sched * sched);
/* Assign a node to a backend; takes effect at the next alloc. Assignments are kept by address
 * until cleared: clear them when the assigned tensors go (a new graph each decode step). */
FERRY_API ferry_status ferry_sched_set_tensor_backend(ferry_sched * sched, ferry_tensor * node, ferry_backend * backend);
FERRY_API void         ferry_sched_clear_assignments(ferry_sched * sched);
FERRY_API int          ferry_sched_n_assigned(const ferry_sched * sched);
/* Assign backends, find splits and inputs, allocate copies and outputs. */
FERRY_API ferry_status ferry_sched_alloc_graph(ferry_sched * sched, ferry_graph * graph);
/* Whether compute allocates graph before it runs: it is not the graph last allocated (or
 * that alloc failed), it has more or fewer nodes than then, or an option that takes effect
 * at the next alloc was set since. False for NULL. */
FERRY_API bool         ferry_sched_needs_alloc(const ferry_sched * sched, const ferry_graph * graph);
/* Allocate if ferry_sched_needs_alloc says so, then copy inputs and compute. Every input's lengths
 * are checked as ferry_copy_input checks them before the first copy, and every attention's kv_len
 * against its query tokens (where the caller wrote it in host memory): a refused run moves no byte
 * and keeps the previous run's stats. */
FERRY_API ferry_status ferry_sched_graph_compute(ferry_sched * sched, ferry_graph * graph);
/* The backend a tensor of the last allocated graph was given (NULL if none). */
FERRY_API ferry_backend * ferry_sched_get_tensor_backend(const ferry_sched * sched, const ferry_tensor * t);
FERRY_API int          ferry_sched_n_splits(const ferry_sched * sched);
FERRY_API ferry_status ferry_sched_split(const ferry_sched * sched, int i, ferry_sched_split_info * out);
FERRY_API int          ferry_sched_n_inputs(const ferry_sched * sched);
FERRY_API ferry_status ferry_sched_input(const ferry_sched * sched, int i, ferry_sched_input_info * out);
FERRY_API ferry_status ferry_sched_get_stats(const ferry_sched * sched, ferry_sched_stats * out);

/*
 * The timeline of the last run (ferry_sched_trace): what the calling thread did (a blocking
 * copy, a wait for prefetched copies, a part's compute) and what each copy queue did (a
 * prefetched copy), with its part and input, in seconds from the run's start on the host's
 * clock. A queued copy's times come from its events: on the host's clock where its queue knows
 * when it reached them (the stand-in's worker thread), else (a CUDA stream) by their elapsed
 * time from the run's first queued copy on that queue, placed when it was queued (the stream
 * is idle as a run begins). A copy made for this run under the last one
 * (ferry_sched_set_prefetch_next) is its part's queued copy too, and starts, usually ends, before
 * the run's start: negative times.
 */
typedef enum {
    FERRY_SPAN_COPY = 0,        /* an input copied by the calling thread, at its part */
    FERRY_SPAN_QUEUED_COPY = 1, /* an input copied ahead on its backend's copy queue */
    FERRY_SPAN_WAIT = 2,        /* the calling thread waiting for a part's queued copies */
    FERRY_SPAN_COMPUTE = 3,     /* a part's compute, synchronized */
    FERRY_SPAN_FETCH_WAIT = 4,  /* the calling thread waiting for an input's fetch (ferry_fetch) */
} ferry_span_kind;

typedef struct {
    ferry_span_kind kind;
    int part;      /* the part it belongs to */
    int input;     /* the input copied (a copy), else -1 */
    double start;  /* seconds from the run's start */
    double end;
} ferry_sched_span;

/* The last run's spans (up to max of them into spans; NULL counts them): *n gets how many there are. */
FERRY_API ferry_status ferry_sched_trace(const ferry_sched * sched, ferry_sched_span * spans, size_t max, size_t * n);
/* Compact staging: input copies take ferry_tensor_compact_layout (only the bytes read)
 * instead of the source's layout; takes effect at the next alloc. Off by default. */
FERRY_API ferry_status ferry_sched_set_compact(ferry_sched * sched, bool compact);
FERRY_API bool         ferry_sched_get_compact(const ferry_sched * sched);
/*
 * Prefetch: copy inputs ahead of compute on their backend's copy queue
 * (ferry_backend_get_copy_queue), up to n_parts parts ahead of the part computing. A part
 * is a split, or the piece of one from a node that first reads an input: one layer's
 * attention in a decode step. The inputs prefetched are those whose source is ready
 * before the graph runs (memory of its own that no node writes: a KV window); they are
 * queued in part order (ferry_copy_input_async) as the part n_parts before theirs begins,
 * in memory the allocator keeps theirs from then on, and each part's compute waits on the
 * events of its own inputs only. Others, and backends without a copy queue, are copied
 * just before their part runs. 0 (the default) is off: every figure and byte as without it. Takes effect at
 * the next alloc.
 */
FERRY_API ferry_status ferry_sched_set_prefetch(ferry_sched * sched, int n_parts);
FERRY_API int          ferry_sched_get_prefetch(const ferry_sched * sched);
/*
 * Prefetch across runs, for a decode loop that runs one graph step after step: while a run's
 * last parts compute, the first part's prefetched windows are copied for the next run, so that
 * the first layer's copy does not wait alone at the next run's start, nor the last layer's
 * compute run with nothing under it. Only windows carrying their streams' lengths
 * (ferry_tensor_set_used_cells, lengths in host memory) go ahead, and not paged ones; their copies
 * keep their memory for the whole run and after. The run returns once those copies have landed,
 * so that nothing reads the caller's memory between runs. The next run of the same graph copies,
 * behind them on the same queue, each stream's cells from its length at the copy ahead (the last
 * run's) to its length now: the cells a step appended. A stream whose length fell is copied again
 * from cell 0, unless a rollback announced it (ferry_sched_truncate). The caller's side: a cell below a stream's length in one run is not rewritten before
 * the next, as in a cache that only appends; when it is (a stream given a new sequence, or cut
 * back and written again), call ferry_sched_drop_ahead first. A graph of one part has nothing to
 * copy them under. Acts with a prefetch of 1 or more: on while prefetch is 0 is refused, as is
 * prefetch 0 while it is on. Takes effect at the next alloc; off by default.
 */
FERRY_API ferry_status ferry_sched_set_prefetch_next(ferry_sched * sched, bool on);
FERRY_API bool         ferry_sched_get_prefetch_next(const ferry_sched * sched);
/* Forget the copies made ahead for the next run: it copies its first part whole. What a caller
 * does before rewriting cells the last run read. */
FERRY_API ferry_status ferry_sched_drop_ahead(ferry_sched * sched);
/*
 * Rollback without copying again (speculative verification): stream's cells below length are
 * unchanged since the last run, and those at or above it may be rewritten (the rejected tokens'
 * cells, written again by the next step's). stream indexes the lengths the windows carry
 * (ferry_tensor_set_used_cells); every window copied ahead takes it. The next run copies the
 * stream's cells from min(length, its cells at the copy ahead) to its length then, as from a length
 * the last run had: a length then below that is copied again from cell 0. Truncates add up (the
 * lowest stands) until the next run. Cells rewritten below length still take
 * ferry_sched_drop_ahead. With nothing copied ahead (prefetch_next off, the first run, after a drop)
 * it does nothing. Refused, with nothing changed: length negative or above the stream's length
 * when copied ahead, a stream outside a window copied ahead's streams.
 */
FERRY_API ferry_status ferry_sched_truncate(ferry_sched * sched, int64_t stream, int64_t length);
/*
 * A remote tier: a host tensor whose memory is a local copy of bytes held elsewhere (another
 * machine's memory, read through a transfer engine), brought in by the caller's transport. Set on
 * the tensor that owns the memory (ferry_tensor_set_fetch), it makes each scheduler input whose
 * window reads that tensor go remote -> host -> the input's backend: begin() asks the transport for
 * the bytes a copy of the window reads under the scheduler's policy (a cell-per-stream window's
 * span, ranges, plan or used cells; a paged window's blocks), to land at their own offsets in the
 * tensor's memory; wait() returns once they have; then the copy path copies the window as ever.
 *
 * When: without prefetch, an input's fetch is begun and waited for as its part begins, before its
 * copy. With a prefetch of n parts, a part's fetches are begun as the part n + 1 before it begins,
 * and each is waited for just before its copy is made or queued (n parts ahead): a pull travels
 * under the compute of the part before the one its copy is queued at. The transport may take them
 * in order, one at a time, or all at once. A fetched window is not copied ahead for the next run
 * (prefetch_next): its bytes arrive with the run that reads them, and its copy is made in the run.
 *
 * A status other than FERRY_OK from begin or wait fails the run as a copy would (what it names is
 * the transport's, left in ferry_last_error or kept by the caller): that part's copies and compute
 * are not made, and every fetch begun is waited for before the run returns, so that no transport
 * writes into the caller's memory after it. The scheduler never writes the tensor; the transport
 * must not write the bytes of a window it was not asked for while a run reads them.
 */
typedef struct ferry_fetch {
    /* Begin bringing into window's memory the bytes a copy of window under policy reads (window: a
     * view of the tensor the fetch is set on, or a paged window over it); *ticket goes to wait. */
    ferry_status (*begin)(void * ctx, const ferry_tensor * window, ferry_copy_policy policy, uint64_t * ticket);
    /* Return once the fetch begun with ticket has landed (or failed: not FERRY_OK). */
    ferry_status (*wait)(void * ctx, uint64_t ticket);
    void * ctx;
} ferry_fetch;

/* Fetch t's windows through fetch before the scheduler copies them (NULL: t's bytes are here). t
 * keeps the pointer: fetch must outlive every run that reads t. Refused (INVALID_ARG): t a view
 * (set it on the tensor that owns the memory), a fetch without begin or wait, t not allocated in
 * host memory (a fetch lands where a host copy reads). Takes effect at the next run. */
FERRY_API ferry_status ferry_tensor_set_fetch(ferry_tensor * t, const ferry_fetch * fetch);

/* Bytes of compute memory (copies and outputs) the scheduler holds on a backend, and the staging
 * area its merged gathers' spans land in there (the largest gather's spans: the CUDA backend holds
 * one; the stand-in counts the one a device would). The allocator's buffers grow and never shrink,
 * nor does the staging area: compare options on fresh schedulers. */
FERRY_API size_t       ferry_sched_buffer_size(const ferry_sched * sched, const ferry_backend * backend);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_SCHED_H */
