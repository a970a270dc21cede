/*
 * Prefetching (ferry_sched_set_prefetch): which split inputs are copied ahead on their
 * backend's copy queue, when they are queued in a run, what each part's compute waits
 * for, and what is left to wait for and time after the run; and across runs
 * (ferry_sched_set_prefetch_next), the first part's windows queued for the next run and
 * the cells a run adds to them. The copies themselves are ferry_copy_input_async and
 * ferry_copy_input_since (copy-path.c).
 */
#include "copy-impl.h"
#include "sched-impl.h"

#include <stdlib.h>
#include <string.h>

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
    s->ahead_part = -1;
    if (s->prefetch == 0 || s->n_inputs == 0) {
        return FERRY_OK;
    }
    s->queue_of = ferry_calloc((size_t) s->n_inputs, sizeof(*s->queue_of));
    if (!s->queue_of) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    /* Across runs: the next run's first part is queued at the part whose depth reaches past the
     * last, once the first has computed (a graph of one part has no such part). */
    if (s->prefetch_next && s->n_parts > 1) {
        s->ahead_part = s->n_parts - s->prefetch > 1 ? s->n_parts - s->prefetch : 1;
        s->ahead = ferry_calloc((size_t) s->n_inputs, sizeof(*s->ahead));
        if (!s->ahead) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
        }
    }
    for (int p = 0; p < s->n_parts; p++) {
        part * pt = &s->parts[p];
        for (int k = pt->first_input; k < pt->first_input + pt->n_inputs; k++) {
            const ferry_tensor * src = s->inputs[k].src;
            const ferry_tensor * root = ferry_tensor_root(src);
            if (root->op != FERRY_OP_NONE || !ferry_gallocr_has_foreign_memory(s->galloc, root)) {
                continue;
            }
            const bool carry = s->ahead && p == 0 && src->used_lengths && !src->paged;
            if (p == 0 && !carry && (k - pt->first_input) % 2 == 0) {
                continue; /* the calling thread's share of the first part */
            }
            FERRY_TRY(ferry_backend_get_copy_queue(s->splits[pt->split].backend, &s->queue_of[k]));
            pt->last_prefetched = s->queue_of[k] ? k : pt->last_prefetched;
            if (carry && s->queue_of[k]) {
                s->ahead[k] = (ahead_copy) {.carried = true};
            }
        }
    }
    return FERRY_OK;
}

/* Is input k copied ahead for the next run? */
static bool carried(const ferry_sched * s, int k) { return s->ahead && s->ahead[k].carried; }

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
    uint64_t carried_inputs = 0, carried_bytes = 0; /* held through the run, for the next */
    for (int k = 0; k < s->n_inputs; k++) {
        if (s->queue_of[k]) {
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &s->events[2 * k]));
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &s->events[2 * k + 1]));
        }
        if (carried(s, k)) {
            ahead_copy * a = &s->ahead[k];
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &a->events[0]));
            FERRY_TRY(ferry_event_new(s->queue_of[k], FERRY_EVENT_TIMING, &a->events[1]));
            const ferry_tensor * src = s->inputs[k].src;
            a->cells = ferry_calloc(3 * (size_t) src->ne[src->used_stream_dim] + 1, sizeof(*a->cells));
            if (!a->cells) {
                return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
            }
            carried_inputs++;
            carried_bytes += ferry_tensor_nbytes(s->inputs[k].copy);
        }
    }
    for (int q = 0; q < s->n_parts; q++) {
        uint64_t inputs = q > 0 ? carried_inputs : 0, bytes = q > 0 ? carried_bytes : 0;
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
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        ferry_event_free(s->ahead[k].events[0]);
        ferry_event_free(s->ahead[k].events[1]);
        free(s->ahead[k].cells);
    }
    free(s->ahead);
    s->ahead = NULL;
    s->ahead_part = -1;
    free(s->events);
    free(s->queue_of);
    free(s->queued_at);
    s->events = NULL;
    s->queue_of = NULL;
    s->queued_at = NULL;
    s->ahead_inputs = s->ahead_bytes = 0;
}

/* A window copied ahead by the last run (landed before it returned): that copy timed and placed
 * on the trace (before this run's start), then only the cells added since, from each stream's
 * length then or the length a truncate kept (from 0 where it fell below that), behind it on its
 * queue; the input's figures are both. */
static ferry_status copy_since_ahead(ferry_sched * s, int p, int k) {
    ahead_copy * a = &s->ahead[k];
    ferry_sched_input_info * in = &s->inputs[k];
    float ms = 0;
    FERRY_TRY(ferry_event_elapsed_ms(a->events[0], a->events[1], &ms));
    double t0, t1;
    if (ferry_event_reached_seconds(a->events[0], &t0) != FERRY_OK ||
        ferry_event_reached_seconds(a->events[1], &t1) != FERRY_OK) {
        t0 = a->queued_at; /* a device stream: from when it was queued, as the last part began */
        t1 = t0 + 1e-3 * ms;
    }
    ferry_sched_add_span(s, FERRY_SPAN_QUEUED_COPY, p, k, t0, t1);
    a->seconds = 1e-3 * ms;
    const int64_t ns = in->src->ne[in->src->used_stream_dim];
    int64_t * from = a->cells + ns; /* each stream's length now, then where its cells to copy begin */
    FERRY_TRY(ferry_read_used_cells(in->src, "the copy after a copy ahead", from));
    bool kept = true;
    for (int64_t i = 0; i < ns; i++) {
        kept = kept && from[i] >= a->cells[i];
        from[i] = from[i] >= a->cells[i] ? a->cells[i] : 0;
    }
    FERRY_TRY(ferry_copy_input_since(s->queue_of[k], in->src, in->copy, from, &in->stats));
    in->stats.path = a->stats.path;
    in->stats.gather = a->stats.gather;
    in->stats.bytes_copied += a->stats.bytes_copied;
    in->stats.copy_calls += a->stats.copy_calls;
    in->stats.impl_calls += a->stats.impl_calls;
    in->stats.predicted_seconds += a->stats.predicted_seconds;
    a->queued = false;
    s->stats.kept_ahead += kept;
    return FERRY_OK;
}

/* Queue the prefetched inputs of parts up to `last` not yet queued (*next onwards), each
 * between two events on its copy queue (a window copied ahead by the last run: its new cells). */
ferry_status ferry_sched_prefetch_queue(ferry_sched * s, int last, int * next) {
    for (; *next <= last && *next < s->n_parts; (*next)++) {
        const part * pt = &s->parts[*next];
        for (int k = pt->first_input; k < pt->first_input + pt->n_inputs; k++) {
            ferry_backend * queue = s->queue_of[k];
            if (!queue) {
                continue;
            }
            ferry_sched_input_info * in = &s->inputs[k];
            FERRY_TRY(ferry_sched_fetch_wait(s, *next, k));
            s->queued_at[k] = ferry_now_seconds();
            FERRY_TRY(ferry_event_record(s->events[2 * k], queue));
            if (carried(s, k) && s->ahead[k].queued) {
                FERRY_TRY(copy_since_ahead(s, *next, k));
            } else {
                FERRY_TRY(ferry_copy_input_async(queue, s->policy, in->src, in->copy, &in->stats));
            }
            FERRY_TRY(ferry_event_record(s->events[2 * k + 1], queue));
            ferry_sched_add_input_stats(&s->stats, &in->stats);
            ferry_sched_note_staging(s, s->splits[pt->split].backend, &in->stats);
            s->stats.prefetched++;
        }
    }
    return FERRY_OK;
}

/* Queue the first part's windows for the next run, with each stream's length now. Where the
 * host cannot read the lengths now, that window is not copied ahead: the next run copies it. */
ferry_status ferry_sched_prefetch_queue_ahead(ferry_sched * s) {
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        ahead_copy * a = &s->ahead[k];
        if (!a->carried) {
            continue;
        }
        a->queued = false;
        const ferry_sched_input_info * in = &s->inputs[k];
        if (ferry_sched_fetched(s, k)) {
            continue; /* its bytes arrive with the run that reads them */
        }
        if (ferry_read_used_cells(in->src, "copy ahead", a->cells) != FERRY_OK) {
            ferry_clear_error();
            continue;
        }
        const ferry_tensor * len = in->src->used_lengths; /* read and checked just now */
        const int64_t ns = in->src->ne[in->src->used_stream_dim];
        for (int64_t i = 0; i < ns; i++) {
            int32_t v;
            memcpy(&v, (const char *) ferry_tensor_data(len) + (size_t) i * len->nb[0], sizeof(v));
            a->cells[2 * ns + i] = v;
        }
        a->queued_at = ferry_now_seconds();
        FERRY_TRY(ferry_event_record(a->events[0], s->queue_of[k]));
        FERRY_TRY(ferry_copy_input_async(s->queue_of[k], s->policy, in->src, in->copy, &a->stats));
        FERRY_TRY(ferry_event_record(a->events[1], s->queue_of[k]));
        a->queued = true;
    }
    return FERRY_OK;
}

/* A truncate lowers each copy ahead's cells for the stream to length (its cells at or above are
 * what the rejected tokens wrote): the next run copies the stream from there, as from a length the
 * last run had. Refused whole before anything is lowered. */
ferry_status ferry_sched_prefetch_truncate(ferry_sched * s, int64_t stream, int64_t length) {
    if (length < 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_truncate: stream %lld's length %lld is negative: give "
                          "the cells it keeps (0 or more)", (long long) stream, (long long) length);
    }
    if (stream < 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_truncate: stream %lld (length %lld) is negative: give "
                          "an index into the windows' lengths", (long long) stream, (long long) length);
    }
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        const ferry_tensor * src = s->inputs[k].src;
        const int64_t ns = src->ne[src->used_stream_dim];
        const ahead_copy * a = &s->ahead[k];
        if (a->carried && stream >= ns) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_truncate: stream %lld (length %lld) is not one of "
                              "the %lld streams of '%s', copied ahead: give 0..%lld", (long long) stream,
                              (long long) length, (long long) ns, src->name, (long long) ns - 1);
        }
        if (a->queued && length > a->cells[2 * ns + stream]) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_truncate: stream %lld's length %lld is above its "
                              "length %lld when '%s' was copied ahead: a truncate keeps cells the last run read, "
                              "give 0..%lld", (long long) stream, (long long) length,
                              (long long) a->cells[2 * ns + stream], src->name,
                              (long long) a->cells[2 * ns + stream]);
        }
    }
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        ahead_copy * a = &s->ahead[k];
        if (a->queued && length < a->cells[stream]) {
            a->cells[stream] = length;
        }
    }
    return FERRY_OK;
}

ferry_status ferry_sched_prefetch_drop_ahead(ferry_sched * s) {
    ferry_status st = FERRY_OK;
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        ahead_copy * a = &s->ahead[k];
        if (a->queued) {
            const ferry_status w = ferry_event_synchronize(a->events[1]);
            st = st == FERRY_OK ? w : st;
        }
        a->queued = false;
        a->seconds = 0;
    }
    return st;
}

/* After a run with prefetching: every queue done (nothing may still write a copy), and each
 * prefetched copy's time on its queue, from its events. */
ferry_status ferry_sched_prefetch_finish(ferry_sched * s, int queued_parts, bool ok) {
    if (DROP_WAITS()) {
        return FERRY_OK; /* the test that dropped them waits for its queues itself */
    }
    ferry_status st = FERRY_OK;
    if (!ok) { /* a run that failed: every queue done, nothing left ahead */
        const ferry_backend * done = NULL; /* inputs come queue by queue: each waited for once */
        for (int k = 0; k < s->n_inputs; k++) {
            if (s->queue_of[k] && s->queue_of[k] != done) {
                const ferry_status q = ferry_backend_synchronize(s->queue_of[k]);
                st = st == FERRY_OK ? q : st;
                done = s->queue_of[k];
            }
        }
        const ferry_status d = ferry_sched_prefetch_drop_ahead(s);
        return st == FERRY_OK ? d : st;
    }
    /* This run's copies done, and those queued for the next run: nothing reads the caller's memory
     * between runs, so that it may write cells, or free the cache, once the run returns. */
    for (int p = 0; p < queued_parts; p++) {
        for (int k = s->parts[p].first_input; k < s->parts[p].first_input + s->parts[p].n_inputs; k++) {
            const ferry_status q = s->queue_of[k] ? ferry_event_synchronize(s->events[2 * k + 1]) : FERRY_OK;
            st = st == FERRY_OK ? q : st;
        }
    }
    for (int k = 0; s->ahead && k < s->n_inputs; k++) {
        const ferry_status q = s->ahead[k].queued ? ferry_event_synchronize(s->ahead[k].events[1]) : FERRY_OK;
        st = st == FERRY_OK ? q : st;
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
            const double ahead = carried(s, k) ? s->ahead[k].seconds : 0; /* the copy ahead it used */
            s->inputs[k].stats.copy_seconds = 1e-3 * ms + ahead;
            s->stats.copy_seconds += 1e-3 * ms + ahead;
            if (carried(s, k)) {
                s->ahead[k].seconds = 0;
            }
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
