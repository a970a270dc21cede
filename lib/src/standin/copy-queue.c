/*
 * A copy queue carried out by a worker thread: the second queue of a backend whose memory
 * the host can write (the stand-in device), so that its input copies overlap its compute on
 * a machine without a GPU as a CUDA copy stream's do on one. It is a backend of its own:
 * transfers into the parent's memory are queued and done in order by the worker; events
 * recorded on it are reached in that order and waited for on the host. It computes nothing.
 */
#include "copy-queue.h"
#include "device-copy.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct queue_event queue_event;

typedef enum { JOB_COPY, JOB_GATHER, JOB_EVENT } job_kind;

/* One queued step: rows of a copy (height 1 for a plain one), a gather's pieces (its own copy of
 * them, freed when done), or an event reached. */
typedef struct {
    job_kind kind;
    char * dst;
    const char * src;
    size_t width, height, dpitch, spitch;
    link_dir dir;
    ferry_gather_copy * pieces;
    size_t n_pieces;
    size_t n_spans; /* a merged gather: pieces[0..n_spans) cross the link, the rest are placed */
    queue_event * event;
    uint64_t seq; /* which record of the event */
} job;

typedef struct {
    ferry_backend * parent;
    ferry_link * link; /* the parent's: queued copies take it in turn with the parent's own */
    char name[64];
    pthread_t worker;
    pthread_mutex_t lock;
    pthread_cond_t work; /* a job was queued, or the queue is closing */
    pthread_cond_t done; /* a job finished */
    job * jobs;          /* a ring: jobs[head .. head + count) */
    size_t head, count, capacity;
    _Atomic uint64_t queued; /* jobs ever queued (under the lock; the idle worker polls it) */
    _Atomic uint64_t finished; /* and finished (by the worker): synchronize waits for equality */
    atomic_bool closing;
} queue_ctx;

/*
 * An idle worker polls for this long, yielding its core to anyone who wants it, before it
 * sleeps. A worker woken from sleep tends to be woken on the core of the thread that
 * queued the copy, and the two then share that core while the other idles: measured here,
 * the copies ran only between a step's computes, never under them. A step queues its next
 * layer's copies within milliseconds of the last, so the worker stays on its own core.
 */
#define IDLE_POLL_SECONDS 0.05
/* A thread waiting for an event polls for up to this long before it sleeps. */
#define WAIT_POLL_SECONDS 1.0

struct queue_event {
    queue_ctx * queue;
    uint64_t recorded;          /* records made */
    _Atomic uint64_t reached;   /* the last one the worker reached (a waiter polls it) */
    double seconds;             /* when the worker reached it */
};

#ifdef FERRY_FAULT_INJECTION
static atomic_bool paused;
void ferry_fault_copy_queue_pause(bool pause) { atomic_store(&paused, pause); }
#define QUEUE_PAUSED() atomic_load(&paused)
#else
#define QUEUE_PAUSED() false
#endif

/* A copy is done when the link would have carried it: an event behind it is reached no
 * sooner, so copies overlap compute as a link's would. */
static void run_job(ferry_link * link, const job * j) {
    if (j->kind == JOB_EVENT) {
        return; /* its effect is the bookkeeping under the lock */
    }
    if (j->kind == JOB_GATHER) { /* as the stand-in's own gather: one transfer, a row cost a row */
        const size_t charged = j->n_spans > 0 ? j->n_spans : j->n_pieces;
        size_t bytes = 0;
        for (size_t i = 0; i < charged; i++) {
            bytes += j->pieces[i].size * j->pieces[i].count;
        }
        const link_slot slot = ferry_link_begin_gather(link, j->dir, j->pieces, charged, j->n_spans > 0);
        ferry_standin_gather_rows(j->dst, j->src, j->pieces + j->n_spans, j->n_pieces - j->n_spans);
        ferry_link_end(link, &slot, bytes);
        return;
    }
    const link_slot slot = ferry_link_begin(link, j->dir, j->width * j->height, j->height);
    ferry_standin_copy_rows(j->dst, j->dpitch, j->src, j->spitch, j->width, j->height, &slot);
    ferry_link_end(link, &slot, j->width * j->height);
}

static void * worker_main(void * arg) {
    queue_ctx * q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        if (q->count == 0 && !q->closing) {
            const uint64_t seen = atomic_load(&q->finished);
            pthread_mutex_unlock(&q->lock);
            const double until = ferry_now_seconds() + IDLE_POLL_SECONDS;
            while (atomic_load(&q->queued) == seen && !atomic_load(&q->closing) && ferry_now_seconds() < until) {
                sched_yield();
            }
            pthread_mutex_lock(&q->lock);
        }
        while (q->count == 0 && !q->closing) {
            pthread_cond_wait(&q->work, &q->lock);
        }
        if (q->count == 0) {
            break; /* closing, and nothing left to do */
        }
        if (QUEUE_PAUSED()) { /* a test holds the queue: look again shortly */
            pthread_mutex_unlock(&q->lock);
            nanosleep(&(struct timespec) {.tv_nsec = 1000000}, NULL);
            pthread_mutex_lock(&q->lock);
            continue;
        }
        const job j = q->jobs[q->head];
        pthread_mutex_unlock(&q->lock);
        run_job(q->link, &j); /* the copy runs unlocked: queuing more goes on meanwhile */
        free(j.pieces);
        pthread_mutex_lock(&q->lock);
        if (j.kind == JOB_EVENT) {
            j.event->seconds = ferry_now_seconds();
            atomic_store(&j.event->reached, j.seq);
        }
        q->head = (q->head + 1) % q->capacity;
        q->count--;
        q->finished++;
        pthread_cond_broadcast(&q->done);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

/* Queue a job (under the lock), growing the ring when full. */
static ferry_status push_locked(queue_ctx * q, const job * j) {
    if (q->count == q->capacity) {
        const size_t cap = q->capacity ? 2 * q->capacity : 64;
        job * grown = ferry_malloc(cap * sizeof(*grown));
        if (!grown) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy queue: out of memory for %zu jobs", cap);
        }
        for (size_t i = 0; i < q->count; i++) {
            grown[i] = q->jobs[(q->head + i) % q->capacity];
        }
        free(q->jobs);
        q->jobs = grown;
        q->head = 0;
        q->capacity = cap;
    }
    q->jobs[(q->head + q->count) % q->capacity] = *j;
    q->count++;
    q->queued++;
    pthread_cond_signal(&q->work);
    return FERRY_OK;
}

static ferry_status push(queue_ctx * q, const job * j) {
    pthread_mutex_lock(&q->lock);
    const ferry_status st = push_locked(q, j);
    pthread_mutex_unlock(&q->lock);
    return st;
}

static queue_ctx * ctx_of(const ferry_backend * backend) { return backend->context; }

static const char * queue_name(const ferry_backend * backend) { return ctx_of(backend)->name; }

static ferry_buffer_type * queue_default_buft(ferry_backend * backend) {
    return ferry_backend_default_buffer_type(ctx_of(backend)->parent);
}

static bool queue_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return ferry_backend_supports_buft(ctx_of(backend)->parent, buft);
}

/* Wait until *value reaches target: poll first, then sleep on the queue's done. Polling,
 * for the reason the idle worker polls: a waiter woken from sleep is put on the worker's
 * core and waits there for the worker to finish. Called with the lock held. */
static void wait_until(queue_ctx * q, _Atomic uint64_t * value, uint64_t target) {
    if (atomic_load(value) < target) {
        pthread_mutex_unlock(&q->lock);
        const double until = ferry_now_seconds() + WAIT_POLL_SECONDS;
        while (atomic_load(value) < target && ferry_now_seconds() < until) {
            sched_yield();
        }
        pthread_mutex_lock(&q->lock);
    }
    while (atomic_load(value) < target) {
        pthread_cond_wait(&q->done, &q->lock);
    }
}

static ferry_status queue_synchronize(ferry_backend * backend) {
    queue_ctx * q = ctx_of(backend);
    pthread_mutex_lock(&q->lock);
    wait_until(q, &q->finished, atomic_load(&q->queued));
    pthread_mutex_unlock(&q->lock);
    return FERRY_OK;
}

/* The rows land in the parent's memory, which the public layer checked; data must stay as it
 * is until the queue reaches the copy, as with any async copy. */
static ferry_status queue_set_2d(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                 size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    const job j = {.kind = JOB_COPY, .dst = (char *) ferry_tensor_data(t) + offset, .src = data, .width = size,
                   .height = n_copies, .dpitch = stride_tensor, .spitch = stride_data, .dir = LINK_TO_DEVICE};
    return push(ctx_of(backend), &j);
}

static ferry_status queue_set(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                              size_t size) {
    return queue_set_2d(backend, t, data, offset, size, 1, size, size);
}

static ferry_status queue_get_2d(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                                 size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    const job j = {.kind = JOB_COPY, .dst = data, .src = (const char *) ferry_tensor_data(t) + offset, .width = size,
                   .height = n_copies, .dpitch = stride_data, .spitch = stride_tensor, .dir = LINK_FROM_DEVICE};
    return push(ctx_of(backend), &j);
}

static ferry_status queue_get(ferry_backend * backend, const ferry_tensor * t, void * data, size_t offset,
                              size_t size) {
    return queue_get_2d(backend, t, data, offset, size, 1, size, size);
}

/* The parent's gather methods, queued: the pieces are copied now, the rows when the worker gets there. */
static unsigned queue_gather_methods(const ferry_backend * backend, const void * src, size_t span) {
    return ferry_backend_gather_methods(ctx_of(backend)->parent, src, span);
}

static ferry_status queue_gather(ferry_backend * backend, ferry_tensor * t, const char * src,
                                 const ferry_gather_copy * pieces, size_t n, ferry_gather_method method) {
    if (method != FERRY_GATHER_BATCHED) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "tensor_gather_async: %s gathers by batched copies alone",
                          ctx_of(backend)->name);
    }
    ferry_gather_copy * own = ferry_malloc(n * sizeof(*own));
    if (!own) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy queue: out of memory for a gather of %zu pieces", n);
    }
    memcpy(own, pieces, n * sizeof(*own));
    const job j = {.kind = JOB_GATHER, .dst = ferry_tensor_data(t), .src = src, .dir = LINK_TO_DEVICE,
                   .pieces = own, .n_pieces = n};
    const ferry_status st = push(ctx_of(backend), &j);
    if (st != FERRY_OK) {
        free(own);
    }
    return st;
}

/* A merged gather, queued as the parent's: the spans and the runs copied now, one list. */
static ferry_status queue_gather_merged(ferry_backend * backend, ferry_tensor * t, const char * src,
                                        const ferry_gather_copy * spans, size_t n_spans,
                                        const ferry_gather_copy * pieces, size_t n) {
    ferry_gather_copy * own = ferry_malloc((n_spans + n) * sizeof(*own));
    if (!own) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy queue: out of memory for a gather of %zu spans",
                          n_spans + n);
    }
    memcpy(own, spans, n_spans * sizeof(*own));
    memcpy(own + n_spans, pieces, n * sizeof(*own));
    const job j = {.kind = JOB_GATHER, .dst = ferry_tensor_data(t), .src = src, .dir = LINK_TO_DEVICE,
                   .pieces = own, .n_pieces = n_spans + n, .n_spans = n_spans};
    const ferry_status st = push(ctx_of(backend), &j);
    if (st != FERRY_OK) {
        free(own);
    }
    return st;
}

static ferry_copy_cost_model queue_cost_model(const ferry_backend * backend) {
    return ferry_backend_copy_cost_model(ctx_of(backend)->parent);
}

/* The queue holds no memory: the parent's is what it copies into. */
static ferry_status queue_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    return ferry_backend_get_memory(ctx_of(backend)->parent, free_bytes, total_bytes);
}

/* ---------------------------------------------------------------- events */

static queue_event * ev_of(const ferry_event * ev) { return ev->context; }

static ferry_status event_synchronize(ferry_event * ev) {
    queue_event * e = ev_of(ev);
    queue_ctx * q = e->queue;
    pthread_mutex_lock(&q->lock);
    wait_until(q, &e->reached, e->recorded);
    pthread_mutex_unlock(&q->lock);
    return FERRY_OK;
}

static void event_free(ferry_event * ev) {
    event_synchronize(ev); /* the worker may still be about to reach it */
    free(ev->context);
}

static ferry_status event_record(ferry_event * ev, ferry_backend * backend) {
    queue_event * e = ev_of(ev);
    if (backend != ev->backend) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "event_record: an event of %s can only be recorded there, not on %s",
                          e->queue->name, ferry_backend_name(backend));
    }
    queue_ctx * q = e->queue;
    pthread_mutex_lock(&q->lock);
    const job j = {.kind = JOB_EVENT, .event = e, .seq = e->recorded + 1};
    const ferry_status st = push_locked(q, &j);
    if (st == FERRY_OK) {
        e->recorded++;
    }
    pthread_mutex_unlock(&q->lock);
    return st;
}

/* No device to wait on: ferry_event_wait waits on the host. */
static ferry_status event_wait(ferry_backend * backend, ferry_event * ev) {
    (void) backend, (void) ev;
    return FERRY_ERR_UNSUPPORTED;
}

static ferry_status event_elapsed_ms(const ferry_event * start, const ferry_event * end, float * out) {
    const queue_event *a = ev_of(start), *b = ev_of(end);
    if (a->queue != b->queue) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "event_elapsed_ms: events of two queues");
    }
    pthread_mutex_lock(&a->queue->lock);
    const bool reached = a->recorded && a->reached == a->recorded && b->recorded && b->reached == b->recorded;
    const double ms = 1e3 * (b->seconds - a->seconds);
    pthread_mutex_unlock(&a->queue->lock);
    if (!reached) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "event_elapsed_ms: an event was not recorded, or not reached yet");
    }
    *out = (float) ms;
    return FERRY_OK;
}

static ferry_status event_reached_seconds(const ferry_event * ev, double * out) {
    const queue_event * e = ev_of(ev);
    pthread_mutex_lock(&e->queue->lock);
    const bool reached = e->recorded && e->reached == e->recorded;
    *out = e->seconds;
    pthread_mutex_unlock(&e->queue->lock);
    return reached ? FERRY_OK : ferry_fail(FERRY_ERR_INVALID_ARG, "event_reached_seconds: not reached yet");
}

static ferry_status queue_event_new(ferry_backend * backend, uint32_t flags, ferry_event ** out) {
    (void) flags; /* every event of the queue is timed: a clock read */
    queue_event * e = ferry_calloc(1, sizeof(*e));
    ferry_event * ev = ferry_calloc(1, sizeof(*ev));
    if (!e || !ev) {
        free(e);
        free(ev);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "event_new: out of memory");
    }
    e->queue = ctx_of(backend);
    ev->iface = (struct ferry_event_i) {.free = event_free, .record = event_record, .wait = event_wait,
                                        .synchronize = event_synchronize, .elapsed_ms = event_elapsed_ms,
                                        .reached_seconds = event_reached_seconds};
    ev->backend = backend;
    ev->context = e;
    *out = ev;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- life */

static void queue_free(ferry_backend * backend) {
    queue_ctx * q = ctx_of(backend);
    pthread_mutex_lock(&q->lock);
    q->closing = true; /* the worker finishes what is queued, then leaves */
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->worker, NULL);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->done);
    pthread_mutex_destroy(&q->lock);
    free(q->jobs);
    free(q);
}

ferry_status ferry_worker_copy_queue_new(ferry_backend * parent, ferry_link * link, ferry_backend ** out) {
    queue_ctx * q = ferry_calloc(1, sizeof(*q));
    if (!q) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy queue: out of memory");
    }
    q->parent = parent;
    q->link = link;
    snprintf(q->name, sizeof(q->name), "%s copy queue", ferry_backend_name(parent));
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, NULL);
    const struct ferry_backend_i iface = {
        .get_name = queue_name,
        .free = queue_free,
        .get_default_buffer_type = queue_default_buft,
        .supports_buft = queue_supports_buft,
        .set_tensor_async = queue_set,
        .get_tensor_async = queue_get,
        .set_tensor_2d_async = queue_set_2d,
        .get_tensor_2d_async = queue_get_2d,
        .synchronize = queue_synchronize,
        .event_new = queue_event_new,
        .copy_cost_model = queue_cost_model,
        .get_memory = queue_get_memory,
        .gather_methods = queue_gather_methods,
        .set_tensor_gather_async = queue_gather,
        .set_tensor_gather_merged_async = queue_gather_merged,
    };
    ferry_status st = ferry_backend_init(iface, q, out);
    if (st == FERRY_OK && pthread_create(&q->worker, NULL, worker_main, q) != 0) {
        free(*out);
        *out = NULL;
        st = ferry_fail(FERRY_ERR_BACKEND, "copy queue: cannot start its worker thread");
    }
    if (st != FERRY_OK) {
        pthread_cond_destroy(&q->work);
        pthread_cond_destroy(&q->done);
        pthread_mutex_destroy(&q->lock);
        free(q);
    }
    return st;
}
