/*
 * The scheduler's copy path: how one split input reaches the backend that runs the
 * split. Everything the scheduler moves between backends goes through ferry_copy_input,
 * which takes a route (copy_by_route) and then measures what moved (measure_copy), or
 * through ferry_copy_input_async, which takes the same route on a copy queue and leaves
 * the copy queued.
 */
#include "copy-impl.h"

#include <stdlib.h>
#include <string.h>

static const char * const policy_names[FERRY_COPY_POLICY_COUNT] = {"flat", "ranges", "plan", "ragged"};

const char * ferry_copy_policy_name(ferry_copy_policy policy) {
    if ((int) policy < 0 || policy >= FERRY_COPY_POLICY_COUNT) {
        ferry_fail(FERRY_ERR_INVALID_ARG, "unknown copy policy %d", (int) policy);
        return NULL;
    }
    return policy_names[policy];
}

ferry_status ferry_copy_policy_from_name(const char * name, ferry_copy_policy * out) {
    FERRY_CHECK_ARG(name && out, "copy_policy_from_name: NULL argument");
    for (int i = 0; i < FERRY_COPY_POLICY_COUNT; i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (ferry_copy_policy) i;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_INVALID_ARG, "unknown copy policy '%s' (known: flat, ranges, plan, ragged)", name);
}

/* Are dimensions 0..n_dims-1 of t one dense range? Its size goes to *size. */
static bool dense_span(const ferry_tensor * t, int n_dims, size_t * size) {
    if (t->nb[0] != ferry_type_size(t->type)) {
        return false; /* dimension 0 is not the innermost: rows are scattered */
    }
    size_t extent;
    if (ferry_row_size(t->type, t->ne[0], &extent) != FERRY_OK) {
        return false;
    }
    /* The other dimensions, innermost first, must each step by the extent so far. */
    int order[FERRY_MAX_DIMS], n = 0;
    for (int d = 1; d < n_dims; d++) {
        if (t->ne[d] > 1) {
            int i = n++;
            while (i > 0 && t->nb[order[i - 1]] > t->nb[d]) {
                order[i] = order[i - 1];
                i--;
            }
            order[i] = d;
        }
    }
    for (int i = 0; i < n; i++) {
        if (t->nb[order[i]] != extent) {
            return false;
        }
        extent *= (size_t) t->ne[order[i]];
    }
    *size = extent;
    return true;
}

bool ferry_copy_ranges_of(const ferry_tensor * t, ferry_copy_2d * out) {
    if (!t || !out || !ferry_type_valid(t->type) || ferry_tensor_nelements(t) <= 0) {
        return false;
    }
    size_t size;
    if (!dense_span(t, 3, &size)) {
        return false;
    }
    const size_t count = (size_t) t->ne[3];
    if (count > 1 && t->nb[3] < size) {
        return false; /* ranges would overlap */
    }
    *out = (ferry_copy_2d) {.offset = 0, .size = size, .count = count, .stride = count > 1 ? t->nb[3] : size};
    return true;
}

/* The plan of t in `local` when it fits, else in a heap array the caller frees. */
#define LOCAL_COPIES 16
static ferry_status plan_of(const ferry_tensor * t, ferry_copy_2d * local, ferry_copy_2d ** copies, size_t * n) {
    *copies = local;
    ferry_status st = ferry_copy_plan(t, local, LOCAL_COPIES, n);
    if (st == FERRY_ERR_OUT_OF_BOUNDS && *n > LOCAL_COPIES) {
        *copies = ferry_malloc(*n * sizeof(**copies));
        if (!*copies) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy plan: out of memory for %zu copies", *n);
        }
        st = ferry_copy_plan(t, *copies, *n, n);
    }
    return st;
}

static void free_plan(ferry_copy_2d * local, ferry_copy_2d * copies) {
    if (copies != local) {
        free(copies);
    }
}

uint64_t ferry_tensor_bytes_read(const ferry_tensor * t) {
    if (!t || !ferry_type_valid(t->type) || ferry_tensor_nelements(t) <= 0) {
        return 0;
    }
    ferry_copy_2d local[LOCAL_COPIES], * copies;
    size_t n = 0;
    uint64_t bytes = 0;
    if (plan_of(t, local, &copies, &n) == FERRY_OK) {
        for (size_t i = 0; i < n; i++) {
            bytes += (uint64_t) copies[i].size * copies[i].count;
        }
    } else {
        /* Too tangled to plan: element bytes, counting a byte read twice twice. */
        size_t row = 0;
        ferry_row_size(t->type, t->ne[0], &row);
        bytes = (uint64_t) row * (uint64_t) ferry_tensor_nrows(t);
    }
    free_plan(local, copies);
    return bytes;
}

/* ---------------------------------------------------------------- moving rows */

/*
 * Move rows that neither side can reach by pointer (device to device) through host
 * memory, one copy at a time: get the copy's rows from src, packed, then set them in
 * dst, at their own offsets and stride (packed false: dst has src's layout) or one
 * after another from dst's first byte (packed true: dst is src's compact layout).
 */
static ferry_status copy_staged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst,
                                const ferry_copy_2d * copies, size_t n, bool packed, const char * what) {
    size_t largest = 0;
    for (size_t i = 0; i < n; i++) {
        largest = copies[i].size * copies[i].count > largest ? copies[i].size * copies[i].count : largest;
    }
    char * staging = ferry_calloc(largest ? largest : 1, 1); /* zeroed: a synthetic source writes nothing */
    if (!staging) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: cannot stage %zu bytes", what, largest);
    }
    ferry_status st = FERRY_OK;
    size_t packed_at = 0;
    for (size_t i = 0; i < n && st == FERRY_OK; i++) {
        const ferry_copy_2d * c = &copies[i];
        st = ferry_tensor_get_2d(src, staging, c->offset, c->size, c->count, c->stride, c->size);
        if (st == FERRY_OK && packed) {
            st = ferry_backend_tensor_set_async(backend, dst, staging, packed_at, c->size * c->count);
            packed_at += c->size * c->count;
        } else if (st == FERRY_OK) {
            st = ferry_backend_tensor_set_2d_async(backend, dst, staging, c->offset, c->size, c->count, c->stride,
                                                   c->size);
        }
        if (st == FERRY_OK) {
            st = ferry_backend_synchronize(backend); /* the staging rows are reused, then freed */
        }
    }
    free(staging);
    return st;
}

/* Move the plan's rows from src to dst (same layout, so the same offsets on both sides).
 * A host side is read or written in place; between two devices the rows are staged. */
static ferry_status copy_planned(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst,
                                 const ferry_copy_2d * copies, size_t n) {
    const char * src_data = ferry_tensor_data(src);
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    if (ferry_buffer_ptr_readable(src_buf, dst_buf)) {
        for (size_t i = 0; i < n; i++) {
            const ferry_copy_2d * c = &copies[i];
            FERRY_TRY(ferry_backend_tensor_set_2d_async(backend, dst, src_data + c->offset, c->offset, c->size,
                                                        c->count, c->stride, c->stride));
        }
        return FERRY_OK;
    }
    if (ferry_buffer_ptr_writable(dst_buf, src_buf)) {
        char * dst_data = ferry_tensor_data(dst);
        for (size_t i = 0; i < n; i++) {
            const ferry_copy_2d * c = &copies[i];
            FERRY_TRY(ferry_tensor_get_2d(src, dst_data + c->offset, c->offset, c->size, c->count, c->stride,
                                          c->stride));
        }
        return FERRY_OK;
    }
    return copy_staged(backend, src, dst, copies, n, false, "copy plan");
}

/* The flat copy: the whole span. Queued (on a copy queue), a source dst's backend reads by
 * pointer goes as one async set of the span, which counts as ferry_tensor_copy's set does;
 * otherwise it is ferry_tensor_copy, which is done when it returns. */
static ferry_status copy_flat(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, bool queued) {
    if (queued && ferry_buffer_ptr_readable(ferry_tensor_buffer(src), ferry_tensor_buffer(dst))) {
        return ferry_backend_tensor_set_async(backend, dst, ferry_tensor_data(src), 0, ferry_tensor_nbytes(src));
    }
    return ferry_tensor_copy(src, dst);
}

/* The plan policy: the planned rows when the cost model says they pay (always, with always),
 * else flat. *read gets the bytes the plan covers (the bytes read), 0 when src has no plan. */
static ferry_status copy_by_plan(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, bool queued,
                                 bool always, ferry_copy_policy * path, uint64_t * read, double * predicted) {
    ferry_copy_2d local[LOCAL_COPIES], * copies;
    size_t n = 0;
    ferry_status st = plan_of(src, local, &copies, &n);
    if (st == FERRY_ERR_UNSUPPORTED) {
        ferry_clear_error(); /* too tangled to plan: flat is the answer, not an error */
        st = FERRY_OK;
        n = 0;
    }
    *read = 0;
    for (size_t i = 0; st == FERRY_OK && i < n; i++) {
        *read += (uint64_t) copies[i].size * copies[i].count;
    }
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(backend);
    if (st == FERRY_OK && n > 0 && (always || ferry_copy_plan_pays(&model, src, copies, n))) {
        *predicted = ferry_copy_plan_cost(&model, copies, n);
        st = copy_planned(backend, src, dst, copies, n);
        *path = always ? FERRY_COPY_RAGGED : FERRY_COPY_PLAN;
    } else if (st == FERRY_OK) {
        *predicted = ferry_copy_flat_cost(&model, ferry_tensor_nbytes(src));
        st = copy_flat(backend, src, dst, queued);
    }
    free_plan(local, copies);
    return st;
}

/* Gather the rows src reads into dst, packed: the compact copy. */
static ferry_status copy_compact(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst) {
    ferry_copy_2d c;
    ferry_single_copy_of(src, &c);
    if (ferry_buffer_ptr_readable(ferry_tensor_buffer(src), ferry_tensor_buffer(dst))) {
        return ferry_backend_tensor_set_2d_async(backend, dst, (const char *) ferry_tensor_data(src) + c.offset, 0,
                                                 c.size, c.count, c.size, c.stride);
    }
    return copy_staged(backend, src, dst, &c, 1, true, "compact copy");
}

/* ---------------------------------------------------------------- one input copy */

/*
 * The route: how src reaches dst, and the copy itself. A paged window is gathered whatever the
 * policy (its cells lie in blocks, where no copy of its layout finds them; *gather says how). The
 * ragged policy copies a window's used cells when it carries lengths, and otherwise the plan's
 * rows whether or not they pay; a compact dst is gathered; the plan policy takes the plan when it
 * pays; the ranges policy copies its ranges wherever the rule applies; everything else is the
 * flat copy. from (ferry_copy_input_since, under ragged): only each stream's cells from from[s] on.
 * *path gets the route taken (a paged window's: the policy), *read the bytes read when the route
 * knows them (*known true; else false), *predicted the copies' time by the backend's cost model.
 * queued: backend is a copy queue, and the flat copy goes there too.
 */
static ferry_status copy_by_route(ferry_backend * backend, ferry_copy_policy policy, bool compact, bool queued,
                                  const ferry_tensor * src, ferry_tensor * dst, const int64_t * from,
                                  ferry_copy_policy * path, uint64_t * read, bool * known, ferry_gather_method * gather,
                                  double * predicted) {
    *path = FERRY_COPY_FLAT;
    *read = 0;
    *known = false;
    *gather = FERRY_GATHER_AUTO;
    *predicted = 0;
    ferry_copy_2d r;
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(backend);
    if (src->paged) {
        *path = policy;
        *known = true;
        return ferry_copy_paged(backend, src, dst, read, gather, predicted);
    }
    if (policy == FERRY_COPY_RAGGED && src->used_lengths) {
        *path = FERRY_COPY_RAGGED;
        *known = true;
        return ferry_copy_ragged(backend, src, dst, compact, from, read, predicted);
    }
    if (compact) {
        *path = FERRY_COPY_PLAN;
        ferry_single_copy_of(src, &r);
        *predicted = ferry_copy_plan_cost(&model, &r, 1);
        return copy_compact(backend, src, dst);
    }
    if (policy == FERRY_COPY_PLAN || policy == FERRY_COPY_RAGGED) {
        const ferry_status st = copy_by_plan(backend, src, dst, queued, policy == FERRY_COPY_RAGGED, path, read,
                                             predicted);
        *known = *read > 0;
        return st;
    }
    if (policy == FERRY_COPY_RANGES && ferry_copy_ranges_of(src, &r) && r.count > 1) {
        /* Same layout on both sides: each range lands at its own offset, gaps untouched. From
         * host memory dst's backend reads, one 2-D set; from another device's memory, the
         * same ranges by the planned copy's route (read into dst, or staged through host). */
        *path = FERRY_COPY_RANGES;
        *read = (uint64_t) r.size * r.count;
        *known = true;
        *predicted = ferry_copy_plan_cost(&model, &r, 1);
        if (!ferry_buffer_ptr_readable(ferry_tensor_buffer(src), ferry_tensor_buffer(dst))) {
            return copy_planned(backend, src, dst, &r, 1);
        }
        return ferry_backend_tensor_set_2d_async(backend, dst, (const char *) ferry_tensor_data(src) + r.offset,
                                                 r.offset, r.size, r.count, r.stride, r.stride);
    }
    *predicted = ferry_copy_flat_cost(&model, ferry_tensor_nbytes(src));
    return copy_flat(backend, src, dst, queued);
}

/* Bytes, calls and operations of some kinds of transfer of a buffer, together. */
static void sum_kinds(const ferry_stats * s, const ferry_xfer * kinds, size_t n, uint64_t * bytes, uint64_t * calls,
                      uint64_t * impl) {
    *bytes = *calls = *impl = 0;
    for (size_t i = 0; i < n; i++) {
        *bytes += s->bytes[kinds[i]];
        *calls += s->calls[kinds[i]];
        *impl += s->impl_calls[kinds[i]];
    }
}

/* The counters a copy changes, taken before it starts. by_get: the copy reads src into
 * dst's host memory, which dst's buffer never sees, so src's reads are what landed. */
typedef struct {
    ferry_stats dst;
    ferry_stats src;
    bool by_get;
    double t0;
} copy_snapshot;

/*
 * The measurement: what moved between the snapshot and now, from the buffers' own
 * counters (dst's writes, or src's reads for a copy by get), and the bytes the graph
 * reads through src (read, when the route knew them; else from src's plan).
 */
static void measure_copy(const copy_snapshot * before, const ferry_tensor * src, const ferry_tensor * dst,
                         ferry_copy_policy path, uint64_t read, bool known, double predicted,
                         ferry_copy_stats * stats) {
    static const ferry_xfer writes[] = {FERRY_XFER_SET, FERRY_XFER_SET_2D, FERRY_XFER_COPY};
    static const ferry_xfer reads[] = {FERRY_XFER_GET, FERRY_XFER_GET_2D};
    const double t1 = ferry_now_seconds();
    const ferry_stats * s0 = before->by_get ? &before->src : &before->dst;
    const ferry_stats * s1 = before->by_get ? &ferry_tensor_buffer(src)->stats : &ferry_tensor_buffer(dst)->stats;
    const ferry_xfer * kinds = before->by_get ? reads : writes;
    const size_t n = before->by_get ? sizeof(reads) / sizeof(reads[0]) : sizeof(writes) / sizeof(writes[0]);
    uint64_t b0, c0, i0, b1, c1, i1;
    sum_kinds(s0, kinds, n, &b0, &c0, &i0);
    sum_kinds(s1, kinds, n, &b1, &c1, &i1);
    uint64_t used;
    if (ferry_copy_used_bytes(src, &used)) {
        read = used; /* a window that carries its streams' lengths: attention reads those cells alone */
        known = true;
    }
    *stats = (ferry_copy_stats) {
        .path = path,
        .bytes_read = known ? read : ferry_tensor_bytes_read(src),
        .bytes_span = ferry_tensor_nbytes(src),
        .bytes_copied = b1 - b0,
        .copy_calls = c1 - c0,
        .impl_calls = i1 - i0,
        .copy_seconds = t1 - before->t0,
        .predicted_seconds = predicted,
    };
}

ferry_status ferry_check_used_lengths(const ferry_tensor * t, bool must_read, const char * what) {
    if (!t->paged && !(t->used_lengths && (must_read || ferry_used_lengths_readable(t)))) {
        return FERRY_OK;
    }
    const int64_t ns = t->paged ? t->ne[3] : t->ne[t->used_stream_dim];
    int64_t * used = ferry_malloc((size_t) (ns > 0 ? ns : 1) * sizeof(*used));
    if (!used) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s of '%s': out of memory for %lld lengths", what, t->name,
                          (long long) ns);
    }
    const ferry_status st = t->paged ? ferry_paged_used_cells(t, what, used) : ferry_read_used_cells(t, what, used);
    free(used);
    return st;
}

/* One input copy: the checks, the counters before it, the route and what moved. queued:
 * leave it on backend (a copy queue) instead of waiting for the backend before and after.
 * from: only each stream's cells from from[s] on (ferry_copy_input_since). */
static ferry_status copy_input(const char * what, ferry_backend * backend, ferry_copy_policy policy,
                               const ferry_tensor * src, ferry_tensor * dst, const int64_t * from,
                               ferry_copy_stats * stats, bool queued) {
    FERRY_CHECK_ARG(backend && src && dst, "%s: NULL argument", what);
    if ((int) policy < 0 || policy >= FERRY_COPY_POLICY_COUNT) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: unknown copy policy %d", what, (int) policy);
    }
    const bool compact = ferry_tensor_is_compact_of(dst, src);
    if (!compact && !ferry_tensor_same_layout(src, dst)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: the copy of '%s' has neither its layout nor its compact layout", what,
                          src->name);
    }
    FERRY_TRY(ferry_tensor_check_allocated(src));
    FERRY_TRY(ferry_tensor_check_allocated(dst));
    FERRY_TRY(ferry_check_used_lengths(src, policy == FERRY_COPY_RAGGED, what));
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    /* flat and planned copies read src into dst's host memory when src cannot be read by pointer */
    const copy_snapshot before = {
        .dst = dst_buf->stats,
        .src = src_buf->stats,
        .by_get =
            !compact && !ferry_buffer_ptr_readable(src_buf, dst_buf) && ferry_buffer_ptr_writable(dst_buf, src_buf),
        .t0 = ferry_now_seconds(),
    };
    ferry_copy_policy path;
    uint64_t read;
    bool known;
    double predicted;
    ferry_gather_method gather;
    if (!queued) {
        FERRY_TRY(ferry_backend_synchronize(backend));
    }
    FERRY_TRY(copy_by_route(backend, policy, compact, queued, src, dst, from, &path, &read, &known, &gather,
                            &predicted));
    if (!queued) {
        FERRY_TRY(ferry_backend_synchronize(backend));
    }
    if (stats) {
        measure_copy(&before, src, dst, path, read, known, predicted, stats); /* queued: the counters moved as it was queued */
        stats->gather = gather;
        if (queued) {
            stats->copy_seconds = 0; /* the queue's events time it */
        }
    }
    return FERRY_OK;
}

ferry_status ferry_copy_input(ferry_backend * split_backend, ferry_copy_policy policy, const ferry_tensor * src,
                              ferry_tensor * dst, ferry_copy_stats * stats) {
    return copy_input("copy_input", split_backend, policy, src, dst, NULL, stats, false);
}

ferry_status ferry_copy_input_async(ferry_backend * queue, ferry_copy_policy policy, const ferry_tensor * src,
                                    ferry_tensor * dst, ferry_copy_stats * stats) {
    return copy_input("copy_input_async", queue, policy, src, dst, NULL, stats, true);
}

ferry_status ferry_copy_input_since(ferry_backend * queue, const ferry_tensor * src, ferry_tensor * dst,
                                    const int64_t * from, ferry_copy_stats * stats) {
    FERRY_CHECK_ARG(src && from, "copy_input_since: NULL argument");
    if (!src->used_lengths || src->paged) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "copy_input_since: '%s' is %s", src->name,
                          src->paged ? "a paged window" : "a window without its streams' lengths");
    }
    return copy_input("copy_input_since", queue, FERRY_COPY_RAGGED, src, dst, from, stats, true);
}
