/* The scheduler's state, shared by sched.c (splits, allocation, the run) and
 * sched-prefetch.c (copies queued ahead). */
#ifndef FERRY_SCHED_IMPL_H
#define FERRY_SCHED_IMPL_H

#include "alloc-impl.h"
#include "ferry-impl.h"
#include "graph-impl.h"


#define FERRY_SCHED_MAX_BACKENDS 16

#ifdef FERRY_FAULT_INJECTION
/* Test builds: the scheduler computes without waiting for its prefetched copies
 * (sched-prefetch.c), and leaves them queued at the end of a run: the test that asks waits
 * for the queues. */
void ferry_fault_sched_drop_waits(bool drop);
/* ---------------------------------------------------------------- a remote tier's fetches (sched-fetch.c) */

/* Does input k's window read a tensor with a fetch? */
bool ferry_sched_fetched(const ferry_sched * s, int k);
/* In the run: begin the fetches of parts fetch_next..last. */
ferry_status ferry_sched_fetch_begin(ferry_sched * s, int last);
/* In the run, at part p: wait for input k's fetch, if one was begun, before its copy. */
ferry_status ferry_sched_fetch_wait(ferry_sched * s, int p, int k);
/* A failed run: wait for every fetch begun (their statuses dropped; the run's error kept). */
void ferry_sched_fetch_abandon(ferry_sched * s);

#endif

typedef struct {
    ferry_tensor * node;
    int src;
    ferry_tensor * original;
    ferry_tensor * copy;
} redirect;

typedef struct {
    const ferry_tensor * tensor;
    int backend;
} assignment;

/* A run of a split's nodes and the inputs first read there, copied just before it runs:
 * a split's copies arrive one part at a time, in memory its earlier parts may have freed. */
typedef struct {
    int split;
    int first_node;          /* in the graph */
    int first_input, n_inputs;
    ferry_graph * graph;     /* its nodes */
    int last_prefetched;     /* its last input queued ahead (its compute waits for that one's event); -1 none */
} part;

/* A first-part input copied ahead for the next run (ferry_sched_set_prefetch_next). A run
 * returns once its copies ahead have landed, so the next run finds each done and times it as it
 * begins. */
typedef struct {
    bool carried;             /* goes ahead: a window with lengths, in the first part, on a queue */
    bool queued;              /* a copy is ahead, for the next run of this allocation */
    int64_t * cells;          /* per stream: its used cells when copied ahead (lowered by
                               * ferry_sched_truncate); then as many of scratch, where the run's
                               * copy of each stream's new cells begins; then its length (the
                               * lengths' value) when copied ahead, which a truncate may not pass */
    ferry_copy_stats stats;   /* the copy ahead's */
    double queued_at;         /* when it was queued (host clock) */
    double seconds;           /* the time on its queue of the copy this run used; 0: none */
    ferry_event * events[2];  /* before and after it on its queue */
} ahead_copy;

/* An input's fetch (ferry_tensor_set_fetch) in the run: begun and not yet waited for, its ticket. */
typedef struct {
    bool begun;
    uint64_t ticket;
} input_fetch;

struct ferry_sched {
    ferry_backend * backends[FERRY_SCHED_MAX_BACKENDS];
    int n_backends;
    ferry_copy_policy policy;
    bool compact; /* input copies hold only the bytes read */
    int prefetch; /* parts ahead whose inputs are queued on copy queues; 0: off */
    bool prefetch_next; /* the first part's windows are queued for the next run under the last part */
    ferry_gallocr * galloc;

    assignment * assignments;
    int n_assignments;
    size_t assignments_capacity;

    /* The last allocated graph. */
    ferry_graph * graph;
    int graph_nodes;         /* its node count then, to notice a graph that grew */
    int * backend_of;        /* by slot of graph: backend index, -1 none */
    ferry_context * ctx;     /* the input copies */
    ferry_sched_split_info * splits;
    int n_splits;
    part * parts;
    int n_parts;
    ferry_sched_input_info * inputs;
    int n_inputs;
    size_t inputs_capacity;
    redirect * redirects;
    int n_redirects;
    size_t redirects_capacity;
    ferry_graph * alloc_graph; /* the graph with sources redirected, as the allocator sees it */
    /* Prefetching, by input: the copy queue that carries it (NULL: copied at its part), and
     * the events recorded on that queue before and after its copy. */
    ferry_backend ** queue_of;
    ferry_event ** events; /* [2k] before, [2k + 1] after input k's copy */
    uint64_t ahead_inputs, ahead_bytes;
    double * queued_at; /* by input: when its prefetched copy was queued in the run (host clock) */
    ahead_copy * ahead; /* by input, with prefetch_next */
    int ahead_part;     /* the part at which the next run's copies are queued; -1 never */
    ferry_sched_stats stats;
    input_fetch * fetches; /* by input, made at alloc */
    int fetch_next;        /* the first part whose fetches are not begun in the run */
    /* By backend: the largest merged gather's spans a run copied into it (bytes), which land in a
     * staging area on the device before the runs are placed (the CUDA backend's; on the stand-in,
     * the area a device would hold): memory held, as its buffer is (ferry_sched_buffer_size). */
    size_t staging[FERRY_SCHED_MAX_BACKENDS];
    /* The last run's timeline (ferry_sched_trace): room for every part's compute and wait and
     * every input's copy, made at alloc. */
    ferry_sched_span * spans;
    size_t n_spans;
    double run_start;
};

/* Add a span of the run (times on the host's clock; the trace keeps them from the run's start). */
static inline void ferry_sched_add_span(ferry_sched * s, ferry_span_kind kind, int part, int input, double t0,
                                        double t1) {
    if (s->spans) {
        s->spans[s->n_spans++] = (ferry_sched_span) {kind, part, input, t0 - s->run_start, t1 - s->run_start};
    }
}

/* One input's copy into the run's totals. */
static inline void ferry_sched_add_input_stats(ferry_sched_stats * total, const ferry_copy_stats * in) {
    total->bytes_read += in->bytes_read;
    total->bytes_span += in->bytes_span;
    total->bytes_copied += in->bytes_copied;
    total->copy_calls += in->copy_calls;
    total->impl_calls += in->impl_calls;
    total->copy_seconds += in->copy_seconds;
    total->predicted_seconds += in->predicted_seconds;
}

/* An input's copy into backend (a split's, or its copy queue's parent): a merged gather's spans, its
 * bytes copied, held in the staging area when larger than any before (sched.c). */
void ferry_sched_note_staging(ferry_sched * s, const ferry_backend * backend, const ferry_copy_stats * in);

/* ---------------------------------------------------------------- prefetching (sched-prefetch.c) */

/* At alloc, after the splits: which inputs go ahead on a copy queue (queue_of, last_prefetched). */
ferry_status ferry_sched_prefetch_choose(ferry_sched * s);

/* Is backend one of the scheduler's? (sched.c) */
bool ferry_sched_has_backend(const ferry_sched * s, const ferry_backend * backend);
/* At alloc, after the allocation: their events, and what they hold ahead. */
ferry_status ferry_sched_prefetch_prepare(ferry_sched * s);
/* Forget them (events freed once reached). */
void ferry_sched_prefetch_reset(ferry_sched * s);
/* In the run: queue the prefetched inputs of parts *next..last. */
ferry_status ferry_sched_prefetch_queue(ferry_sched * s, int last, int * next);
/* Wait for the copies queued ahead for the next run, and forget them. */
ferry_status ferry_sched_prefetch_drop_ahead(ferry_sched * s);
/* Between runs: stream's cells below length are unchanged in every window copied ahead. */
ferry_status ferry_sched_prefetch_truncate(ferry_sched * s, int64_t stream, int64_t length);
/* In the run: part p's compute waits for its prefetched inputs. */
ferry_status ferry_sched_prefetch_wait(ferry_sched * s, int p);
/* In the run, at ahead_part: queue the first part's windows for the next run. */
ferry_status ferry_sched_prefetch_queue_ahead(ferry_sched * s);
/* After the run: this run's copies done (ok false, a failed run: every queue, and nothing left
 * ahead), and each prefetched copy's time from its events. */
ferry_status ferry_sched_prefetch_finish(ferry_sched * s, int queued_parts, bool ok);

/* ---------------------------------------------------------------- a remote tier's fetches (sched-fetch.c) */

/* Does input k's window read a tensor with a fetch? */
bool ferry_sched_fetched(const ferry_sched * s, int k);
/* In the run: begin the fetches of parts fetch_next..last. */
ferry_status ferry_sched_fetch_begin(ferry_sched * s, int last);
/* In the run, at part p: wait for input k's fetch, if one was begun, before its copy. */
ferry_status ferry_sched_fetch_wait(ferry_sched * s, int p, int k);
/* A failed run: wait for every fetch begun (their statuses dropped; the run's error kept). */
void ferry_sched_fetch_abandon(ferry_sched * s);

#endif
