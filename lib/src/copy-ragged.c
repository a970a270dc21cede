/*
 * Ragged windows: a window that carries each stream's used length (ferry_tensor_set_used_cells)
 * copied as stream s's first used[s] cells and nothing after them, under the ragged policy.
 *
 * Attention reads min(kv_len[s], n_kv) cells of stream s; a window of n_kv cells per stream
 * moves the rest too (the padding of n_kv, and a short stream's unused cells). The ragged
 * route plans sub-views of the window with the copy planner: cells [from, from + n) of one
 * stream, or of every stream at once, so K, V and the transposed V (whose used cells are a
 * prefix of every channel row) all reduce the same way. Equal lengths are one plan over every
 * stream: one 2-D copy for a window. Unequal lengths weigh, by the backend's cost model, a
 * copy per stream against one copy of the shortest length over every stream plus each longer
 * stream's tail; both move exactly the used cells, and nothing else is written.
 */
#include "copy-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growable list of copies. */
typedef struct {
    ferry_copy_2d * c;
    size_t n, cap;
} copy_list;

/* Stream s's cells [from, from + n) of t (s < 0: of every stream), planned and appended to
 * out, offsets relative to t's data. */
static ferry_status plan_cells(const ferry_tensor * t, int64_t s, int64_t from, int64_t n, copy_list * out) {
    if (n <= 0) {
        return FERRY_OK;
    }
    ferry_tensor sub = *t;
    const int cell = t->used_cell_dim, stream = t->used_stream_dim;
    sub.ne[cell] = n;
    size_t base = (size_t) from * t->nb[cell];
    if (s >= 0) {
        sub.ne[stream] = 1;
        base += (size_t) s * t->nb[stream];
    }
    size_t k = 0;
    FERRY_TRY(ferry_copy_plan(&sub, NULL, 0, &k));
    if (k == 0) {
        return FERRY_OK;
    }
    ferry_copy_2d * grown = ferry_grow(out->c, &out->cap, out->n + k, sizeof(*out->c));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "ragged copy of '%s': out of memory for %zu copies", t->name,
                          out->n + k);
    }
    out->c = grown;
    FERRY_TRY(ferry_copy_plan(&sub, out->c + out->n, k, &k));
    for (size_t i = 0; i < k; i++) {
        out->c[out->n + i].offset += base;
    }
    out->n += k;
    return FERRY_OK;
}

void ferry_lengths_label(const ferry_tensor * lengths, char * out, size_t size) {
    snprintf(out, size, lengths->name[0] ? "lengths '%s'" : "unnamed lengths%s", lengths->name);
}

ferry_status ferry_read_used_cells(const ferry_tensor * t, const char * what, int64_t * used) {
    const ferry_tensor * len = t->used_lengths;
    const int64_t ns = t->ne[t->used_stream_dim], cells = t->ne[t->used_cell_dim];
    char lengths[FERRY_MAX_NAME + 32];
    ferry_lengths_label(len, lengths, sizeof(lengths));
    if (ferry_tensor_check_allocated(len) != FERRY_OK) {
        if (ferry_last_status() == FERRY_ERR_FREED) {
            return ferry_fail(FERRY_ERR_FREED, "%s of '%s': its %s lie in a buffer that was freed (closed): keep "
                              "their buffer open while the window is copied", what, t->name, lengths);
        }
        return ferry_fail(ferry_last_status(), "%s of '%s': its %s have no memory: allocate them in host memory and "
                          "write each stream's length", what, t->name, lengths);
    }
    const ferry_buffer * buf = ferry_tensor_buffer(len);
    if (!ferry_buffer_is_host(buf) || ferry_buffer_is_synthetic(buf)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s of '%s': its %s are in %s memory, which the host cannot read "
                          "as it copies: place them in host memory (a CPU buffer)", what, t->name, lengths,
                          ferry_buffer_type_name(ferry_buffer_get_type(buf)));
    }
    const char * data = ferry_tensor_data(len);
    for (int64_t s = 0; s < ns; s++) {
        int32_t v;
        memcpy(&v, data + (size_t) s * len->nb[0], sizeof(v));
        if (v < 0 || v > t->used_limit) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s of '%s': stream %lld's length %d (of its %s) is not "
                              "in 0..%lld", what, t->name, (long long) s, (int) v, lengths,
                              (long long) t->used_limit);
        }
        used[s] = v < cells ? v : cells;
    }
    return FERRY_OK;
}

/* The ragged copy's read of t's lengths. */
static ferry_status read_used(const ferry_tensor * t, int64_t * used) {
    return ferry_read_used_cells(t, "ragged copy", used);
}

bool ferry_used_lengths_readable(const ferry_tensor * t) {
    if (!t->used_lengths || ferry_tensor_check_allocated(t->used_lengths) != FERRY_OK) {
        ferry_clear_error();
        return false;
    }
    const ferry_buffer * buf = ferry_tensor_buffer(t->used_lengths);
    return ferry_buffer_is_host(buf) && !ferry_buffer_is_synthetic(buf);
}

bool ferry_copy_used_bytes(const ferry_tensor * t, uint64_t * bytes) {
    *bytes = 0;
    if (!ferry_used_lengths_readable(t)) {
        return false; /* lengths the host cannot read: the window's own bytes stand */
    }
    const int64_t ns = t->ne[t->used_stream_dim];
    int64_t * used = ferry_calloc((size_t) ns, sizeof(*used));
    copy_list list = {0};
    bool ok = used && read_used(t, used) == FERRY_OK;
    for (int64_t s = 0; ok && s < ns; s++) {
        ok = plan_cells(t, s, 0, used[s], &list) == FERRY_OK;
    }
    for (size_t i = 0; ok && i < list.n; i++) {
        *bytes += (uint64_t) list.c[i].size * list.c[i].count;
    }
    free(list.c);
    free(used);
    if (!ok) {
        ferry_clear_error();
        *bytes = 0;
    }
    return ok;
}

/* Each stream's cells from from[s] to its used length (nothing where it is shorter): one plan over
 * every stream where they all start and end alike, else a plan per stream. */
static ferry_status choose_since(const ferry_tensor * t, const int64_t * used, const int64_t * from, copy_list * out) {
    const int64_t ns = t->ne[t->used_stream_dim];
    bool alike = true;
    for (int64_t s = 1; s < ns; s++) {
        alike = alike && used[s] == used[0] && from[s] == from[0];
    }
    if (alike && ns > 0) {
        return plan_cells(t, -1, from[0], used[0] - from[0], out);
    }
    for (int64_t s = 0; s < ns; s++) {
        FERRY_TRY(plan_cells(t, s, from[s], used[s] - from[s], out));
    }
    return FERRY_OK;
}

/* The copies of t's used cells, the cheaper of the two exact routes by model (equal lengths:
 * the one plan over every stream); with from, only the cells from from[s] on (choose_since). */
static ferry_status choose(const ferry_tensor * t, const int64_t * from, const ferry_copy_cost_model * model,
                           copy_list * out) {
    const int64_t ns = t->ne[t->used_stream_dim];
    int64_t * used = ferry_malloc((size_t) (ns > 0 ? ns : 1) * sizeof(*used));
    if (!used) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "ragged copy of '%s': out of memory for %lld lengths", t->name,
                          (long long) ns);
    }
    copy_list per_stream = {0};
    ferry_status st = read_used(t, used);
    if (from) {
        st = st == FERRY_OK ? choose_since(t, used, from, out) : st;
        free(used);
        return st;
    }
    int64_t shortest = ns > 0 ? used[0] : 0;
    bool equal = true;
    for (int64_t s = 1; st == FERRY_OK && s < ns; s++) {
        equal = equal && used[s] == used[0];
        shortest = used[s] < shortest ? used[s] : shortest;
    }
    /* the shortest over every stream, then the tails */
    if (st == FERRY_OK) {
        st = plan_cells(t, -1, 0, shortest, out);
    }
    for (int64_t s = 0; st == FERRY_OK && !equal && s < ns; s++) {
        st = plan_cells(t, s, shortest, used[s] - shortest, out);
    }
    /* a copy per stream */
    for (int64_t s = 0; st == FERRY_OK && !equal && s < ns; s++) {
        st = plan_cells(t, s, 0, used[s], &per_stream);
    }
    /* a tie (to rounding) goes to the shortest and the tails: never more copies than streams */
    const double tails = st == FERRY_OK ? ferry_copy_plan_cost(model, out->c, out->n) : 0;
    if (st == FERRY_OK && !equal && ferry_copy_plan_cost(model, per_stream.c, per_stream.n) < tails * (1 - 1e-9)) {
        free(out->c);
        *out = per_stream;
        per_stream = (copy_list) {0};
    }
    free(per_stream.c);
    free(used);
    return st;
}

ferry_status ferry_copy_ragged_plan(const ferry_tensor * t, const ferry_copy_cost_model * model,
                                    ferry_copy_2d * copies, size_t max_copies, size_t * n_copies) {
    FERRY_CHECK_ARG(t && model && n_copies, "copy_ragged_plan: NULL argument");
    if (!t->used_lengths) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "copy_ragged_plan: '%s' carries no used lengths "
                          "(ferry_tensor_set_used_cells)", t->name);
    }
    if (!(model->gbps > 0)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "copy_ragged_plan: the cost model's gbps %g is not positive",
                          model->gbps);
    }
    *n_copies = 0;
    copy_list list = {0};
    ferry_status st = choose(t, NULL, model, &list);
    if (st == FERRY_OK) {
        *n_copies = list.n;
        if (copies && list.n > max_copies) {
            st = ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_ragged_plan: '%s' needs %zu copies, room for %zu", t->name,
                            list.n, max_copies);
        } else if (copies) {
            memcpy(copies, list.c, list.n * sizeof(*copies));
        }
    }
    free(list.c);
    return st;
}

/* ---------------------------------------------------------------- moving the rows */

/* Where a source byte offset lands in dst: the same offset (same layout), or in a compact dst
 * its rank among the bytes read: rows of `row` bytes `pitch` apart packed one after another. */
typedef struct {
    bool compact;
    size_t row, pitch;
} dst_map;

static bool map_copy(const dst_map * m, const ferry_copy_2d * c, size_t * offset, size_t * stride) {
    if (!m->compact) {
        *offset = c->offset;
        *stride = c->stride;
        return true;
    }
    *offset = c->offset / m->pitch * m->row + c->offset % m->pitch;
    *stride = c->count > 1 ? c->stride / m->pitch * m->row : c->size;
    return c->offset % m->pitch + c->size <= m->row && (c->count <= 1 || c->stride % m->pitch == 0);
}

/* One copy of rows from src into dst at (offset, stride) of dst: by pointer from host memory
 * dst's backend reads, by get into dst's host memory (allow_get), else staged through `staging`. */
static ferry_status move_copy(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst,
                              const ferry_copy_2d * c, size_t offset, size_t stride, bool allow_get, char * staging) {
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    const size_t src_stride = c->count > 1 ? c->stride : c->size;
    if (ferry_buffer_ptr_readable(src_buf, dst_buf)) {
        const char * from = (const char *) ferry_tensor_data(src) + c->offset;
        return c->count > 1 ? ferry_backend_tensor_set_2d_async(backend, dst, from, offset, c->size, c->count, stride,
                                                                src_stride)
                            : ferry_backend_tensor_set_async(backend, dst, from, offset, c->size);
    }
    if (allow_get && ferry_buffer_ptr_writable(dst_buf, src_buf)) {
        char * to = (char *) ferry_tensor_data(dst) + offset;
        return c->count > 1 ? ferry_tensor_get_2d(src, to, c->offset, c->size, c->count, src_stride, stride)
                            : ferry_tensor_get(src, to, c->offset, c->size);
    }
    FERRY_TRY(ferry_tensor_get_2d(src, staging, c->offset, c->size, c->count, src_stride, c->size));
    FERRY_TRY(c->count > 1 ? ferry_backend_tensor_set_2d_async(backend, dst, staging, offset, c->size, c->count,
                                                               stride, c->size)
                           : ferry_backend_tensor_set_async(backend, dst, staging, offset, c->size));
    return ferry_backend_synchronize(backend); /* the staging rows are reused, then freed */
}

ferry_status ferry_copy_ragged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, bool compact,
                               const int64_t * from, uint64_t * read, double * predicted) {
    *read = 0;
    *predicted = 0;
    dst_map map = {.compact = compact};
    ferry_copy_2d whole;
    if (compact && !ferry_single_copy_of(src, &whole)) { /* is_compact_of saw to it: not reached */
        return ferry_fail(FERRY_ERR_LAYOUT, "ragged copy of '%s': no compact layout to pack by", src->name);
    }
    if (compact) {
        map.row = whole.size;
        map.pitch = whole.count > 1 ? whole.stride : whole.size;
        map.compact = whole.count > 1; /* one dense range (every stream's cells): packed, it is src's layout */
    }
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(backend);
    copy_list list = {0};
    ferry_status st = choose(src, from, &model, &list);
    if (st == FERRY_OK) {
        *predicted = ferry_copy_plan_cost(&model, list.c, list.n);
    }
    size_t largest = 0;
    for (size_t i = 0; st == FERRY_OK && i < list.n; i++) {
        size_t offset, stride;
        if (!map_copy(&map, &list.c[i], &offset, &stride)) {
            st = ferry_fail(FERRY_ERR_LAYOUT, "ragged copy of '%s': a copy of its used cells does not pack into its "
                            "compact copy", src->name);
        }
        const size_t bytes = list.c[i].size * list.c[i].count;
        largest = bytes > largest ? bytes : largest;
        *read += bytes;
    }
    /* rows neither side reaches by pointer are staged through host memory, zeroed for a synthetic source */
    char * staging = NULL;
    const ferry_buffer * src_buf = ferry_tensor_buffer(src);
    const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
    const bool by_pointer = ferry_buffer_ptr_readable(src_buf, dst_buf) ||
                            (!compact && ferry_buffer_ptr_writable(dst_buf, src_buf));
    if (st == FERRY_OK && !by_pointer && list.n > 0 && !(staging = ferry_calloc(largest, 1))) {
        st = ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "ragged copy of '%s': cannot stage %zu bytes", src->name, largest);
    }
    for (size_t i = 0; st == FERRY_OK && i < list.n; i++) {
        size_t offset, stride;
        map_copy(&map, &list.c[i], &offset, &stride);
        st = move_copy(backend, src, dst, &list.c[i], offset, stride, !compact, staging);
    }
    free(staging);
    free(list.c);
    return st;
}
