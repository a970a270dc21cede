/*
 * The remote tier's stage of the scheduler's copy path (ferry_tensor_set_fetch): an input whose
 * window reads a tensor with a fetch has the transport bring that window's bytes into host memory
 * before its copy. Begun as its part begins, or with prefetch n as the part n + 1 before begins,
 * and waited for just before the copy is made or queued (sched.c, sched-prefetch.c).
 */
#include "sched-impl.h"

#include <stdio.h>
#include <string.h>

ferry_status ferry_tensor_set_fetch(ferry_tensor * t, const ferry_fetch * fetch) {
    FERRY_CHECK_ARG(t, "tensor_set_fetch: NULL tensor");
    if (t->view_src) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "tensor_set_fetch: '%s' is a view of '%s': set the fetch on the "
                          "tensor that owns the memory", t->name, t->view_src->name);
    }
    if (fetch && (!fetch->begin || !fetch->wait)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "tensor_set_fetch: '%s': the fetch has no %s function: give both "
                          "begin and wait", t->name, fetch->begin ? "wait" : "begin");
    }
    if (fetch && (ferry_tensor_check_allocated(t) != FERRY_OK || !ferry_buffer_is_host(t->buffer))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "tensor_set_fetch: '%s' is not in host memory: a fetch lands its "
                          "bytes where a host copy reads them", t->name);
    }
    t->fetch = fetch;
    return FERRY_OK;
}

static const ferry_fetch * fetch_of(const ferry_sched * s, int k) { return ferry_tensor_root(s->inputs[k].src)->fetch; }

bool ferry_sched_fetched(const ferry_sched * s, int k) { return fetch_of(s, k) != NULL; }

/* The transport's refusal, named by the run: its message (if it left one) kept. */
static ferry_status refused(const ferry_sched * s, int k, const char * what, ferry_status st) {
    char said[384]; /* the transport's own message: the error was cleared before its call */
    snprintf(said, sizeof(said), "%s", ferry_last_error());
    return ferry_fail(st, "sched_graph_compute: the fetch of '%s' (input %d) failed as it was %s%s%s", s->inputs[k].src->name,
                      k, what, said[0] ? ": " : "", said);
}

ferry_status ferry_sched_fetch_begin(ferry_sched * s, int last) {
    for (; s->fetch_next <= last && s->fetch_next < s->n_parts; s->fetch_next++) {
        const part * pt = &s->parts[s->fetch_next];
        for (int k = pt->first_input; k < pt->first_input + pt->n_inputs; k++) {
            const ferry_fetch * f = fetch_of(s, k);
            if (!f) {
                continue;
            }
            ferry_clear_error();
            const ferry_status st = f->begin(f->ctx, s->inputs[k].src, s->policy, &s->fetches[k].ticket);
            if (st != FERRY_OK) {
                return refused(s, k, "begun", st);
            }
            s->fetches[k].begun = true;
        }
    }
    return FERRY_OK;
}

ferry_status ferry_sched_fetch_wait(ferry_sched * s, int p, int k) {
    if (!s->fetches[k].begun) {
        return FERRY_OK;
    }
    const ferry_fetch * f = fetch_of(s, k);
    s->fetches[k].begun = false;
    const double t0 = ferry_now_seconds();
    ferry_clear_error();
    const ferry_status st = f->wait(f->ctx, s->fetches[k].ticket);
    const double t1 = ferry_now_seconds();
    s->stats.fetch_wait_seconds += t1 - t0;
    ferry_sched_add_span(s, FERRY_SPAN_FETCH_WAIT, p, k, t0, t1);
    if (st != FERRY_OK) {
        return refused(s, k, "waited for", st);
    }
    s->stats.fetched++;
    return FERRY_OK;
}

void ferry_sched_fetch_abandon(ferry_sched * s) {
    for (int k = 0; k < s->n_inputs; k++) {
        if (s->fetches[k].begun) { /* the run failed already: what this wait says would hide why */
            const ferry_fetch * f = fetch_of(s, k);
            char said[512];
            const ferry_status why = ferry_last_status();
            snprintf(said, sizeof(said), "%s", ferry_last_error());
            f->wait(f->ctx, s->fetches[k].ticket);
            ferry_fail(why, "%s", said);
            s->fetches[k].begun = false;
        }
    }
}
