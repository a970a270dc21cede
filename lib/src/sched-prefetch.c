/*
 * Prefetching (ferry_sched_set_prefetch): which split inputs are copied ahead on their
 * backend's copy queue, when they are queued in a run, what each part's compute waits
 * for, and what is left to wait for and time after the run. The copies themselves are
 * ferry_copy_input_async (copy-path.c).
 */
#include "sched-impl.h"

#include <stdlib.h>

#ifdef FERRY_FAULT_INJECTION
/* Test builds: compute without waiting for prefetched copies, to show what that reads. */
static bool drop_waits;
void ferry_fault_sched_drop_waits(bool drop) { drop_waits = drop; }
#define DROP_WAITS() drop_waits
#else
#define DROP_WAITS() false
#endif

/*
 * Prefetching: which inputs are copied ahead on a copy queue. Those whose source is ready
 * before the graph runs (memory of its own that no node writes: a KV window) and whose
 * split's backend has a copy queue; the others are copied at their part, as without it.
 * The first part's copies have no compute to hide under and the calling thread would only
 * wait for them: it copies every other one itself (the first, the third, ...) while the
 * queue copies the rest, so that the step's first wait is about half as long.
 */
ferry_status ferry_sched_prefetch_choose(ferry_sched * s) {
    if (s->prefetch == 0 || s->n_inputs == 0) {
        return FERRY_OK;
    }
    s->queue_of = ferry_calloc((size_t) s->n_inputs, sizeof(*s->queue_of));
    if (!s->queue_of) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int p = 0; p < s->n_parts; p++) {
        part * pt = &s->parts[p];
        for (int k = pt->first_input; k < pt->first_input + pt->n_inputs; k++) {
            const ferry_tensor * root = ferry_tensor_root(s->inputs[k].src);
            if (root->op != FERRY_OP_NONE || !ferry_gallocr_has_foreign_memory(s->galloc, root)) {
                continue;
            }
            if (p == 0 && (k - pt->first_input) % 2 == 0) {
                continue; /* the calling thread's share of the first part */
            }
            FERRY_TRY(ferry_backend_get_copy_queue(s->splits[pt->split].backend, &s->queue_of[k]));
            pt->last_prefetched = s->queue_of[k] ? k : pt->last_prefetched;
        }
    }
    return FERRY_OK;
}

/* After the allocation: the prefetched copies' events, and what they hold ahead of the part
 * computing at most (the copies of the `prefetch` parts after it). */
ferry_status ferry_sched_prefetch_prepare(ferry_sched * s) {
    if (!s->queue_of) {
        return FERRY_OK;
    }
    s->events = ferry_calloc((size_t) 2 * s->n_inputs, sizeof(*s->events));
    s->queued_at = ferry_calloc((size_t) s->n_inputs, sizeof(*s->queued_at));
    if (!s->events || !s->queued_at) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int k = 0; k < s->n_inputs; k++) {
        if (s->queue_of[k]) {
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &s->events[2 * k]));
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &s->events[2 * k + 1]));
        }
    }
    for (int q = 0; q < s->n_parts; q++) {
        uint64_t inputs = 0, bytes = 0;
        for (int p = q + 1; p < s->n_parts && p - q <= s->prefetch; p++) {
            for (int k = s->parts[p].first_input; k < s->parts[p].first_input + s->parts[p].n_inputs; k++) {
                if (s->queue_of[k]) {
                    inputs++;
                    bytes += ferry_tensor_nbytes(s->inputs[k].copy);
                }
            }
        }
        s->ahead_inputs = inputs > s->ahead_inputs ? inputs : s->ahead_inputs;
        s->ahead_bytes = bytes > s->ahead_bytes ? bytes : s->ahead_bytes;
    }
    return FERRY_OK;
}

void ferry_sched_prefetch_reset(ferry_sched * s) {
    for (int k = 0; s->events && k < 2 * s->n_inputs; k++) {
        ferry_event_free(s->events[k]); /* waits, on the queue's side, until it was reached */
    }
    free(s->events);
    free(s->queue_of);
    free(s->queued_at);
    s->events = NULL;
    s->queue_of = NULL;
    s->queued_at = NULL;
    s->ahead_inputs = s->ahead_bytes = 0;
}

/* Queue the prefetched inputs of parts up to `last` not yet queued (*next onwards), each
 * between two events on its copy queue. */
ferry_status ferry_sched_prefetch_queue(ferry_sched * s, int last, int * next) {
    for (; *next <= last && *next < s->n_parts; (*next)++) {
        const part * pt = &s->parts[*next];
        for (int k = pt->first_input; k < pt->first_input + pt->n_inputs; k++) {
            ferry_backend * queue = s->queue_of[k];
            if (!queue) {
                continue;
            }
            ferry_sched_input_info * in = &s->inputs[k];
            s->queued_at[k] = ferry_now_seconds();
            FERRY_TRY(ferry_event_record(s->events[2 * k], queue));
            FERRY_TRY(ferry_copy_input_async(queue, s->policy, in->src, in->copy, &in->stats));
            FERRY_TRY(ferry_event_record(s->events[2 * k + 1], queue));
            ferry_sched_add_input_stats(&s->stats, &in->stats);
            s->stats.prefetched++;
        }
    }
    return FERRY_OK;
}

/* After a run with prefetching: every queue done (nothing may still write a copy), and each
 * prefetched copy's time on its queue, from its events. */
ferry_status ferry_sched_prefetch_finish(ferry_sched * s, int queued_parts) {
    if (DROP_WAITS()) {
        return FERRY_OK; /* the test that dropped them waits for its queues itself */
    }
    ferry_status st = FERRY_OK;
    const ferry_backend * done = NULL; /* inputs come queue by queue: each waited for once */
    for (int k = 0; k < s->n_inputs; k++) {
        if (s->queue_of[k] && s->queue_of[k] != done) {
            const ferry_status q = ferry_backend_synchronize(s->queue_of[k]);
            st = st == FERRY_OK ? q : st;
            done = s->queue_of[k];
        }
    }
    /* Each queued copy's span: from its events' host times where the queue knows them (a host
     * thread's queue), else timed from the run's first queued copy on its queue, placed when it
     * was queued (a device stream is idle as a run begins). */
    int first[FERRY_SCHED_MAX_BACKENDS + 1];
    const ferry_backend * queues[FERRY_SCHED_MAX_BACKENDS + 1];
    int n_queues = 0;
    for (int p = 0; p < queued_parts && st == FERRY_OK; p++) {
        for (int k = s->parts[p].first_input; k < s->parts[p].first_input + s->parts[p].n_inputs; k++) {
            float ms = 0, from = 0, to = 0;
            if (!s->queue_of[k] || (st = ferry_event_elapsed_ms(s->events[2 * k], s->events[2 * k + 1], &ms)) != FERRY_OK) {
                continue;
            }
            s->inputs[k].stats.copy_seconds = 1e-3 * ms;
            s->stats.copy_seconds += 1e-3 * ms;
            double t0, t1;
            if (ferry_event_reached_seconds(s->events[2 * k], &t0) == FERRY_OK &&
                ferry_event_reached_seconds(s->events[2 * k + 1], &t1) == FERRY_OK) {
                ferry_sched_add_span(s, FERRY_SPAN_QUEUED_COPY, p, k, t0, t1);
                continue;
            }
            int q = 0;
            while (q < n_queues && queues[q] != s->queue_of[k]) {
                q++;
            }
            if (q == n_queues && n_queues <= FERRY_SCHED_MAX_BACKENDS) {
                queues[n_queues] = s->queue_of[k];
                first[n_queues++] = k;
            }
            const int k0 = first[q];
            if ((st = ferry_event_elapsed_ms(s->events[2 * k0], s->events[2 * k], &from)) == FERRY_OK &&
                (st = ferry_event_elapsed_ms(s->events[2 * k0], s->events[2 * k + 1], &to)) == FERRY_OK) {
                ferry_sched_add_span(s, FERRY_SPAN_QUEUED_COPY, p, k, s->queued_at[k0] + 1e-3 * from,
                                     s->queued_at[k0] + 1e-3 * to);
            }
        }
    }
    return st;
}

ferry_status ferry_sched_prefetch_wait(ferry_sched * s, int p) {
    const int last = s->parts[p].last_prefetched;
    if (last < 0 || DROP_WAITS()) {
        return FERRY_OK;
    }
    const double t0 = ferry_now_seconds();
    ferry_backend * backend = s->splits[s->parts[p].split].backend;
    const ferry_status st = ferry_event_wait(backend, s->events[2 * last + 1]); /* the queue is in order: all */
    const double t1 = ferry_now_seconds();
    s->stats.wait_seconds += t1 - t0;
    ferry_sched_add_span(s, FERRY_SPAN_WAIT, p, -1, t0, t1);
    return st;
}
