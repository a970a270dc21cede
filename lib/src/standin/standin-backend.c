/*
 * The stand-in device: what a GPU split looks like on a machine without one. It is
 * the dummy backend with real memory (dummy/), not host memory to anyone and
 * using only its own buffers, so every input of a split on it arrives by the
 * scheduler's copy path as it would on a GPU; it computes with the CPU kernels and
 * claims no op they cannot do. Its copy queue is a worker thread (copy-queue.c): what
 * a CUDA copy stream is to a GPU's compute, on the host's other core.
 *
 * What makes it a device of a given size on a given link is here, around the dummy: its
 * own buffer type allocates the dummy's buffers against a memory budget and wraps their
 * transfers in the link (link.c), and the backend forwards the rest to the dummy. The
 * context is shared by the backend and its live buffers, and goes with the last of them:
 * a buffer may be freed after its backend, as any host buffer may.
 */
#include "copy-queue.h"
#include "device-copy.h"
#include "cpu/cpu-impl.h"
#include "dummy/dummy-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ferry_backend * inner;           /* the dummy backend with the CPU kernels */
    ferry_buffer_type * inner_buft;  /* its buffer type, which allocates the memory */
    ferry_buffer_type buft;          /* the stand-in's: the dummy's buffers with the link around them */
    struct ferry_buffer_i host;      /* the dummy buffers' own entries, which the stand-in's wrap */
    bool have_host;
    char name[48];
    size_t alignment;
    ferry_standin_params params;
    pthread_mutex_t lock;            /* used, refs and the compute counters */
    size_t used;                     /* bytes the live buffers asked */
    uint64_t computes;               /* graph computes, and the host's own time for them */
    double compute_host_seconds;
    long refs;                       /* the backend and each live buffer */
    double queued_until;             /* when the link ends the transfers queued on the backend (under lock) */
    ferry_link link;
} standin_ctx;

static void unref(standin_ctx * s, size_t returned) {
    pthread_mutex_lock(&s->lock);
    s->used -= returned;
    const bool last = --s->refs == 0;
    pthread_mutex_unlock(&s->lock);
    if (last) {
        ferry_link_destroy(&s->link);
        pthread_mutex_destroy(&s->lock);
        free(s);
    }
}

/* ---------------------------------------------------------------- buffers: the dummy's, over the link */

static standin_ctx * buf_ctx(const ferry_buffer * buf) { return buf->buft->context; }

static void standin_buffer_free(ferry_buffer * buf) {
    standin_ctx * s = buf_ctx(buf);
    s->host.free_buffer(buf);
    unref(s, buf->size);
}

/* The end of a transfer into the device: held until the link has carried it, or (queued on the
 * backend's own stream, below) counted and left for synchronize to wait for. */
static void link_done(standin_ctx * s, const link_slot * slot, size_t bytes, bool queued);

/* A set of rows into t's memory over the link, as the link writes them (device-copy.c): one
 * transfer, one latency, as one cudaMemcpy2D, and a row cost a row beyond the first. */
static void link_set(standin_ctx * s, ferry_tensor * t, const void * data, size_t offset, size_t size, size_t rows,
                     size_t stride_tensor, size_t stride_data, bool queued) {
    const link_slot slot = ferry_link_begin(&s->link, LINK_TO_DEVICE, size * rows, rows);
    ferry_standin_copy_rows((char *) ferry_tensor_data(t) + offset, stride_tensor, data, stride_data, size, rows,
                            NULL);
    link_done(s, &slot, size * rows, queued);
}

static ferry_status standin_set(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset, size_t size) {
    link_set(buf_ctx(buf), t, data, offset, size, 1, 0, 0, false);
    return FERRY_OK;
}

static ferry_status standin_get(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset, size_t size) {
    standin_ctx * s = buf_ctx(buf);
    const link_slot slot = ferry_link_begin(&s->link, LINK_FROM_DEVICE, size, 1);
    const ferry_status st = s->host.get_tensor(buf, t, data, offset, size);
    ferry_link_end(&s->link, &slot, size);
    return st;
}

static ferry_status standin_set_2d(ferry_buffer * buf, ferry_tensor * t, const void * data, size_t offset,
                                   size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    link_set(buf_ctx(buf), t, data, offset, size, n_copies, stride_tensor, stride_data, false);
    return FERRY_OK;
}

static ferry_status standin_get_2d(ferry_buffer * buf, const ferry_tensor * t, void * data, size_t offset,
                                   size_t size, size_t n_copies, size_t stride_tensor, size_t stride_data) {
    standin_ctx * s = buf_ctx(buf);
    const link_slot slot = ferry_link_begin(&s->link, LINK_FROM_DEVICE, size * n_copies, n_copies);
    const ferry_status st = s->host.get_tensor_2d(buf, t, data, offset, size, n_copies, stride_tensor, stride_data);
    ferry_link_end(&s->link, &slot, size * n_copies);
    return st;
}

/* ---------------------------------------------------------------- the backend's own queue: a stream */

/*
 * The backend's async transfers behave as a CUDA stream's: the bytes move at once (the source
 * may be reused on return), the transfer takes its place on the link, and the call returns
 * without waiting for the link to carry it; synchronize, and a compute on the backend, wait for
 * the link's end of everything queued. The host's own work between two calls (the copy path's,
 * about 0.2 us a call on the dev VM) then overlaps the link, as a host enqueueing copies
 * overlaps a copy engine, instead of adding to every call.
 */
static void link_done(standin_ctx * s, const link_slot * slot, size_t bytes, bool queued) {
    if (!queued) {
        ferry_link_end(&s->link, slot, bytes);
        return;
    }
    ferry_link_count(&s->link, slot, bytes);
    pthread_mutex_lock(&s->lock);
    s->queued_until = slot->end > s->queued_until ? slot->end : s->queued_until;
    pthread_mutex_unlock(&s->lock);
}

static void wait_queued(standin_ctx * s) {
    pthread_mutex_lock(&s->lock);
    const double until = s->queued_until;
    pthread_mutex_unlock(&s->lock);
    ferry_link_wait_until(until);
}

static ferry_status standin_set_async(ferry_backend * backend, ferry_tensor * t, const void * data, size_t offset,
                                      size_t size) {
    link_set(backend->context, t, data, offset, size, 1, 0, 0, true);
    return FERRY_OK;
}

static ferry_status standin_set_2d_async(ferry_backend * backend, ferry_tensor * t, const void * data,
                                         size_t offset, size_t size, size_t n_copies, size_t stride_tensor,
                                         size_t stride_data) {
    link_set(backend->context, t, data, offset, size, n_copies, stride_tensor, stride_data, true);
    return FERRY_OK;
}

static ferry_status standin_synchronize(ferry_backend * backend) {
    wait_queued(backend->context);
    return FERRY_OK;
}

static const char * standin_buft_name(const ferry_buffer_type * buft) {
    return ((const standin_ctx *) buft->context)->name;
}

static size_t standin_buft_alignment(const ferry_buffer_type * buft) {
    return ((const standin_ctx *) buft->context)->alignment;
}

static bool standin_buft_is_host(const ferry_buffer_type * buft) {
    (void) buft;
    return false; /* inputs are copied in, over the link */
}

/* The bytes are taken from the budget first, so that two threads' asks never both fit in
 * what is left for one, and given back if the allocation fails. */
static ferry_status standin_buft_alloc(ferry_buffer_type * buft, size_t size, ferry_buffer ** out) {
    standin_ctx * s = buft->context;
    pthread_mutex_lock(&s->lock);
    const size_t memory = s->params.memory, free_bytes = memory - s->used;
    const bool fits = memory == 0 || size <= free_bytes;
    if (fits) {
        s->used += size;
        s->refs++;
    }
    pthread_mutex_unlock(&s->lock);
    if (!fits) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY,
                          "alloc_buffer: %s is out of memory: %zu bytes asked, %zu of its %zu bytes free", s->name,
                          size, free_bytes, memory);
    }
    const ferry_status st = s->inner_buft->iface.alloc_buffer(s->inner_buft, size, out);
    if (st != FERRY_OK) {
        unref(s, size);
        return st;
    }
    ferry_buffer * buf = *out;
    pthread_mutex_lock(&s->lock);
    if (!s->have_host) {
        s->host = buf->iface; /* every buffer of the dummy's type has the same entries */
        s->have_host = true;
    }
    pthread_mutex_unlock(&s->lock);
    buf->buft = buft;
    buf->iface.free_buffer = standin_buffer_free;
    buf->iface.set_tensor = standin_set;
    buf->iface.get_tensor = standin_get;
    buf->iface.set_tensor_2d = standin_set_2d;
    buf->iface.get_tensor_2d = standin_get_2d;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- the backend: the dummy's */

static standin_ctx * ctx_of(const ferry_backend * backend) { return backend->context; }

static const char * standin_name(const ferry_backend * backend) { return ctx_of(backend)->name; }

static void standin_free(ferry_backend * backend) {
    standin_ctx * s = ctx_of(backend);
    ferry_backend_free(s->inner);
    s->inner = NULL;
    s->inner_buft = NULL;
    unref(s, 0);
}

static ferry_buffer_type * standin_default_buft(ferry_backend * backend) { return &ctx_of(backend)->buft; }

static bool standin_supports_buft(ferry_backend * backend, ferry_buffer_type * buft) {
    return buft == &ctx_of(backend)->buft;
}

static bool standin_supports_op(ferry_backend * backend, const ferry_tensor * op) {
    return ferry_backend_supports_op(ctx_of(backend)->inner, op);
}

/* With a slowdown F the compute is held, as a transfer is, until F times its own time after it
 * began: a slower device's compute, of which copies queued meanwhile see the whole length. */
static ferry_status standin_graph_compute(ferry_backend * backend, ferry_graph * graph) {
    standin_ctx * s = ctx_of(backend);
    wait_queued(s); /* a compute follows the copies queued before it */
    const double slowdown = s->params.compute_slowdown;
    const double t0 = ferry_now_seconds();
    const ferry_status st = s->inner->iface.graph_compute(s->inner, graph);
    const double own = ferry_now_seconds() - t0;
    pthread_mutex_lock(&s->lock);
    s->computes++;
    s->compute_host_seconds += own;
    pthread_mutex_unlock(&s->lock);
    if (st == FERRY_OK && slowdown > 1) {
        ferry_link_wait_until(t0 + slowdown * own);
    }
    return st;
}

/* With a modelled link, copies into it cost what the link charges (the copy path weighs its routes
 * by it): a call's latency, a row's cost beyond a single row (a gather's every piece), bytes at its
 * bandwidth (unlimited: the CPU's). Without one, the CPU's model: memcpy carries the copies. */
static ferry_copy_cost_model standin_copy_cost_model(const ferry_backend * backend) {
    const standin_ctx * s = ctx_of(backend);
    ferry_copy_cost_model m = ferry_copy_cost_model_cpu();
    if (!s->link.modelled) {
        return m;
    }
    const double gbps = s->params.link_gbps > 0 ? s->params.link_gbps : m.gbps;
    return (ferry_copy_cost_model) {.call_us = s->params.latency_us, .row_ns = s->params.row_ns, .gbps = gbps,
                                    .small_row_efficiency = 1.0, .piece_ns = s->params.row_ns,
                                    .piece_floor_gbps = s->params.piece_floor_gbps,
                                    .piece_knee_bytes = s->params.piece_knee_bytes,
                                    .piece_steepness = s->params.piece_steepness};
}

/* A paged window's gather in one call, as a batched copy: one transfer over the link, a row cost
 * for each row of each piece (the model's piece_ns is the link's row cost); or merged spans. */
static unsigned standin_gather_methods(const ferry_backend * backend, const void * src, size_t span) {
    (void) backend, (void) src, (void) span;
    return (1u << FERRY_GATHER_BATCHED) | (1u << FERRY_GATHER_MERGED);
}

/* Merged spans: the link carries the spans, gaps and all, as one transfer; the runs within them are
 * then placed in t. A device would land the spans in a staging area and gather the runs from there
 * on the device, a second call (charged as one more latency); the stand-in's memory is the host's, so
 * it places the runs from the same source bytes, and the same bytes land. The gaps' bytes are charged
 * and counted, never read. */
static ferry_status standin_gather_merged(ferry_backend * backend, ferry_tensor * t, const char * src,
                                          const ferry_gather_copy * spans, size_t n_spans,
                                          const ferry_gather_copy * pieces, size_t n) {
    standin_ctx * s = ctx_of(backend);
    size_t bytes = 0;
    for (size_t i = 0; i < n_spans; i++) {
        bytes += spans[i].size * spans[i].count;
    }
    const link_slot slot = ferry_link_begin_gather(&s->link, LINK_TO_DEVICE, spans, n_spans, true);
    ferry_standin_gather_rows((char *) ferry_tensor_data(t), src, pieces, n);
    link_done(s, &slot, bytes, true);
    return FERRY_OK;
}

static ferry_status standin_gather(ferry_backend * backend, ferry_tensor * t, const char * src,
                                   const ferry_gather_copy * pieces, size_t n, ferry_gather_method method) {
    if (method != FERRY_GATHER_BATCHED) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "tensor_gather_async: %s gathers by batched copies alone",
                          ctx_of(backend)->name);
    }
    standin_ctx * s = ctx_of(backend);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += pieces[i].size * pieces[i].count;
    }
    const link_slot slot = ferry_link_begin_gather(&s->link, LINK_TO_DEVICE, pieces, n, false);
    ferry_standin_gather_rows((char *) ferry_tensor_data(t), src, pieces, n);
    link_done(s, &slot, bytes, true);
    return FERRY_OK;
}

static ferry_status standin_copy_queue_new(ferry_backend * backend, ferry_backend ** out) {
    standin_ctx * s = ctx_of(backend);
    return ferry_worker_copy_queue_new(backend, s->link.modelled ? &s->link : NULL, out);
}

/* Its model's memory, or without one the host's, where its buffers are. */
static ferry_status standin_get_memory(ferry_backend * backend, size_t * free_bytes, size_t * total_bytes) {
    standin_ctx * s = ctx_of(backend);
    if (s->params.memory == 0) {
        return ferry_host_memory(free_bytes, total_bytes);
    }
    pthread_mutex_lock(&s->lock);
    *free_bytes = s->params.memory - s->used;
    *total_bytes = s->params.memory;
    pthread_mutex_unlock(&s->lock);
    return FERRY_OK;
}

ferry_standin_params ferry_standin_default_params(void) {
    return (ferry_standin_params) {.link_gbps = 0, .latency_us = 0, .memory = 0, .compute_slowdown = 0, .row_ns = 0,
                                   .piece_floor_gbps = 0, .piece_knee_bytes = 0, .piece_steepness = 0};
}

/*
 * Named links, from published measurements (docs/design.md, "Named links", gives each source and
 * which figures are estimates). Pieces of 4 to 24 KiB crossed an H100's PCIe 5 link at 5 to 7 GB/s
 * and pieces of 28 KiB and more at 40 to 52 (vLLM issues #42212 and #48434): a floor of 6 GB/s,
 * a peak of 50, and a step between 24 and 28 KiB (a knee of 25.5 KiB, steepness 40, gives 6.5 GB/s
 * at 24 KiB and 42.7 at 28). The call latency is ferry's H200 PCIe 5 anchor's (copy-plan.c); the
 * PCIe 4 card's and the GH200's small-piece figures are estimates, scaled from the H100's.
 */
typedef struct {
    const char * name;
    double gbps, latency_us, floor_gbps, knee_bytes, steepness;
} link_profile;

static const link_profile link_profiles[] = {
    {"h100-pcie5", 50.0, 4.0, 6.0, 26112.0, 40.0},
    {"pcie4", 24.5, 5.0, 3.0, 26112.0, 40.0},
    {"gh200-c2c", 360.0, 2.0, 43.0, 26112.0, 40.0},
};
#define N_LINK_PROFILES ((int) (sizeof(link_profiles) / sizeof(link_profiles[0])))

const char * ferry_standin_link_profile_name(int i) {
    return i >= 0 && i < N_LINK_PROFILES ? link_profiles[i].name : NULL;
}

ferry_status ferry_standin_link_profile(const char * name, double peak_gbps, ferry_standin_params * out) {
    FERRY_CHECK_ARG(name && out, "standin_link_profile: NULL argument");
    if (!(peak_gbps == 0 || (peak_gbps >= 1e-3 && peak_gbps <= 1e6))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_link_profile: peak_gbps %g is not 0 (the link's own) or "
                          "between 1e-3 and 1e6 GB/s", peak_gbps);
    }
    for (int i = 0; i < N_LINK_PROFILES; i++) {
        const link_profile * l = &link_profiles[i];
        if (strcmp(name, l->name) != 0) {
            continue;
        }
        const double scale = peak_gbps > 0 ? peak_gbps / l->gbps : 1.0; /* rates times it, fixed costs over it */
        *out = ferry_standin_default_params();
        out->link_gbps = l->gbps * scale;
        out->latency_us = l->latency_us / scale;
        out->piece_floor_gbps = l->floor_gbps * scale;
        out->piece_knee_bytes = l->knee_bytes;
        out->piece_steepness = l->steepness;
        return FERRY_OK;
    }
    return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_link_profile: unknown link '%s' (known: h100-pcie5, pcie4, "
                      "gh200-c2c)", name);
}

ferry_status ferry_standin_backend_new_params(const ferry_standin_params * params, ferry_backend ** out) {
    FERRY_CHECK_ARG(out, "standin_backend_new: NULL output");
    const ferry_standin_params p = params ? *params : ferry_standin_default_params();
    /* 1 MB/s is 4 s for 4 MiB: slower is a mistake, not a link */
    if (!(p.link_gbps == 0 || (p.link_gbps >= 1e-3 && p.link_gbps <= 1e6))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: link_gbps %g is not 0 (unlimited) or "
                          "between 1e-3 and 1e6 GB/s", p.link_gbps);
    }
    if (!(p.latency_us >= 0 && p.latency_us <= 1e6)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: latency_us %g is not between 0 and 1e6",
                          p.latency_us);
    }
    if (!(p.row_ns >= 0 && p.row_ns <= 1e6)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: row_ns %g is not between 0 and 1e6", p.row_ns);
    }
    if (!(p.piece_floor_gbps == 0 || (p.piece_floor_gbps >= 1e-3 && p.link_gbps > 0 &&
                                      p.piece_floor_gbps <= p.link_gbps))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: piece_floor_gbps %g is not 0 (no piece "
                          "curve) or between 1e-3 and link_gbps %g (which must be set for a curve)",
                          p.piece_floor_gbps, p.link_gbps);
    }
    if (p.piece_floor_gbps > 0 && !(p.piece_knee_bytes >= 1 && p.piece_knee_bytes <= 1073741824.0 &&
                                    p.piece_steepness > 0 && p.piece_steepness <= 256)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: a piece curve needs piece_knee_bytes from 1 "
                          "to 1 GiB and piece_steepness in (0, 256], not %g and %g", p.piece_knee_bytes,
                          p.piece_steepness);
    }
    if (!(p.compute_slowdown == 0 || (p.compute_slowdown >= 1 && p.compute_slowdown <= 1e6))) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "standin_backend_new: compute_slowdown %g is not 0 (the host's "
                          "speed) or between 1 and 1e6", p.compute_slowdown);
    }
    standin_ctx * s = ferry_calloc(1, sizeof(*s));
    if (!s) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "standin_backend_new: out of memory");
    }
    snprintf(s->name, sizeof(s->name), "CPU (stand-in device)");
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true; /* real bytes, for the CPU kernels */
    dp.has_2d = true;      /* 2-D sets in one call, as cudaMemcpy2DAsync is */
    dp.is_host = false;    /* no other backend may read it: inputs are copied in */
    ferry_status st = ferry_dummy_backend_new_cpu_ops(&dp, s->name, &s->inner);
    if (st != FERRY_OK) {
        free(s);
        return st;
    }
    s->inner_buft = ferry_backend_default_buffer_type(s->inner);
    s->alignment = ferry_buffer_type_alignment(s->inner_buft);
    s->params = p;
    s->refs = 1;
    s->buft.iface = (struct ferry_buffer_type_i) {
        .get_name = standin_buft_name,
        .alloc_buffer = standin_buft_alloc,
        .get_alignment = standin_buft_alignment,
        .is_host = standin_buft_is_host,
    };
    s->buft.context = s;
    struct ferry_backend_i iface = {
        .get_name = standin_name,
        .free = standin_free,
        .get_default_buffer_type = standin_default_buft,
        .supports_buft = standin_supports_buft,
        .supports_op = standin_supports_op,
        .graph_compute = standin_graph_compute,
        .set_tensor_async = standin_set_async, /* queued on the link, as on a stream */
        .set_tensor_2d_async = standin_set_2d_async,
        .get_tensor_2d_async = ferry_cpu_get_tensor_2d, /* gets are the buffer's own: done, and held, on return */
        .synchronize = standin_synchronize,
        .copy_queue_new = standin_copy_queue_new,
        .copy_cost_model = standin_copy_cost_model,
        .get_memory = standin_get_memory,
        .gather_methods = standin_gather_methods,
        .set_tensor_gather_async = standin_gather,
        .set_tensor_gather_merged_async = standin_gather_merged,
    };
    st = ferry_backend_init(iface, s, out);
    if (st != FERRY_OK) {
        ferry_backend_free(s->inner);
        free(s);
        return st;
    }
    pthread_mutex_init(&s->lock, NULL);
    ferry_link_init(&s->link, p.link_gbps, p.latency_us, p.row_ns);
    ferry_link_set_piece_curve(&s->link, p.piece_floor_gbps, p.piece_knee_bytes, p.piece_steepness);
    return FERRY_OK;
}

ferry_status ferry_standin_backend_new(ferry_backend ** out) { return ferry_standin_backend_new_params(NULL, out); }

static ferry_status standin_of(const ferry_backend * backend, const char * what, standin_ctx ** out) {
    FERRY_CHECK_ARG(backend, "%s: NULL backend", what);
    if (backend->iface.get_name != standin_name) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: %s is not a stand-in device", what, ferry_backend_name(backend));
    }
    *out = backend->context;
    return FERRY_OK;
}

ferry_status ferry_standin_get_link(const ferry_backend * backend, ferry_standin_params * params,
                                    ferry_link_stats * stats) {
    standin_ctx * s = NULL;
    FERRY_TRY(standin_of(backend, "standin_get_link", &s));
    if (params) {
        *params = s->params;
    }
    if (stats) {
        *stats = ferry_link_get_stats(&s->link);
        pthread_mutex_lock(&s->lock);
        stats->computes = s->computes;
        stats->compute_host_seconds = s->compute_host_seconds;
        pthread_mutex_unlock(&s->lock);
    }
    return FERRY_OK;
}

ferry_status ferry_standin_reset_link_stats(ferry_backend * backend) {
    standin_ctx * s = NULL;
    FERRY_TRY(standin_of(backend, "standin_reset_link_stats", &s));
    ferry_link_reset_stats(&s->link);
    pthread_mutex_lock(&s->lock);
    s->computes = 0;
    s->compute_host_seconds = 0;
    pthread_mutex_unlock(&s->lock);
    return FERRY_OK;
}
