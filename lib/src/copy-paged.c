/*
 * Paged windows: a window over a paged cache (paged-kv.c) copied as each stream's used cells,
 * gathered from the blocks of its sequence's table into the dense copy attention reads.
 *
 * A stream's blocks are read in table order. Blocks that follow each other in the pool, table
 * order and window alike (block b then b + 1) are one run: one copy of their cells (K, V) or one
 * 2-D copy of their channel rows (a transposed V). The gather then goes by one of four methods:
 * a copy per block (the baseline serving systems use), a copy per run (with runs of equal length
 * at even strides on both sides as one 2-D copy, where the cost model says that is cheaper), or,
 * where the split's backend offers them for the pool's memory, every run in one call: batched
 * copies, or a kernel reading pinned host memory. Each costs what the backend's model says (a
 * call, a row, a byte; a piece of a batched call; the kernel's rate), and the cache's setting
 * either forces one or lets the model choose. Every method moves exactly the used cells.
 */
#include "copy-impl.h"

#include <stdlib.h>
#include <string.h>

static const char * const method_names[FERRY_GATHER_COUNT] = {"auto",    "per_block", "runs",
                                                                "batched", "kernel",    "merged"};

const char * ferry_gather_method_name(ferry_gather_method method) {
    if ((int) method < 0 || method >= FERRY_GATHER_COUNT) {
        ferry_fail(FERRY_ERR_INVALID_ARG, "unknown gather method %d", (int) method);
        return NULL;
    }
    return method_names[method];
}

ferry_status ferry_gather_method_from_name(const char * name, ferry_gather_method * out) {
    FERRY_CHECK_ARG(name && out, "gather_method_from_name: NULL argument");
    for (int i = 0; i < FERRY_GATHER_COUNT; i++) {
        if (strcmp(name, method_names[i]) == 0) {
            *out = (ferry_gather_method) i;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_INVALID_ARG, "unknown gather method '%s' (known: auto, per_block, runs, batched, "
                      "kernel, merged)", name);
}

/* ---------------------------------------------------------------- the pieces */

typedef struct {
    ferry_gather_copy * c;
    size_t n, cap;
} piece_list;

static ferry_status push(piece_list * l, const ferry_gather_copy * c, const ferry_tensor * t) {
    ferry_gather_copy * grown = ferry_grow(l->c, &l->cap, l->n + 1, sizeof(*l->c));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged copy of '%s': out of memory for %zu copies", t->name,
                          l->n + 1);
    }
    l->c = grown;
    l->c[l->n++] = *c;
    return FERRY_OK;
}

/* The window's cells per stream: dimension 0 of a transposed V, 1 otherwise. */
static int cell_dim(const ferry_tensor * t) { return t->paged->v_trans ? 0 : 1; }

/* Each stream's used cells: the lengths the window carries (read as a ragged window's), else its
 * sequence's cells; a length past the cells its sequence holds is refused (those cells hold nothing
 * yet, though its last block may have room for them). */
ferry_status ferry_paged_used_cells(const ferry_tensor * t, const char * what, int64_t * used) {
    const ferry_paged_source * src = t->paged;
    const ferry_paged_tables * tables = src->tables;
    const int64_t ns = t->ne[3], n_kv = t->ne[cell_dim(t)], bs = src->block_size;
    if (t->used_lengths && (t->used_cell_dim != cell_dim(t) || t->used_stream_dim != 3)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s of '%s': its used cells are on dimension %d and streams on "
                          "%d, but its cells are on %d and streams on 3", what, t->name, (int) t->used_cell_dim,
                          (int) t->used_stream_dim, cell_dim(t));
    }
    if (t->used_lengths) {
        FERRY_TRY(ferry_read_used_cells(t, what, used));
    }
    for (int64_t s = 0; s < ns; s++) {
        const int64_t seq = t->paged_first_seq + s, held = tables->n_blocks[seq], cells = tables->n_cells[seq];
        if (!t->used_lengths) {
            used[s] = cells < n_kv ? cells : n_kv;
        }
        if (used[s] > cells) {
            char lengths[FERRY_MAX_NAME + 32];
            ferry_lengths_label(t->used_lengths, lengths, sizeof(lengths));
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s of '%s': stream %lld's length %lld (of its %s) is "
                              "past the %lld cells sequence %lld holds: give a length of at most %lld, or append "
                              "the cells first", what, t->name, (long long) s, (long long) used[s],
                              lengths, (long long) cells, (long long) seq, (long long) cells);
        }
        if (used[s] > held * bs) { /* cells past the table's blocks: paged-kv.c never leaves a table so */
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s of '%s': sequence %lld's length %lld needs block "
                              "%lld of its table, which holds %lld blocks (%lld cells)", what, t->name, (long long) seq,
                              (long long) used[s], (long long) held, (long long) held, (long long) (held * bs));
        }
    }
    return FERRY_OK;
}

/* The copy of `cells` cells from pool cell `from` to cell `to` of stream s's part of the window. */
static ferry_gather_copy piece_of(const ferry_tensor * t, int64_t s, int64_t from, int64_t to, int64_t cells) {
    const ferry_paged_source * src = t->paged;
    const size_t b = src->cell_bytes, n_kv = (size_t) t->ne[cell_dim(t)];
    if (src->v_trans) { /* a row per channel, in the pool and in the window */
        return (ferry_gather_copy) {.src_offset = (size_t) from * b,
                                    .dst_offset = ((size_t) s * (size_t) src->n_embd * n_kv + (size_t) to) * b,
                                    .size = (size_t) cells * b, .count = (size_t) src->n_embd,
                                    .src_stride = (size_t) src->pool_cells * b, .dst_stride = n_kv * b};
    }
    const size_t size = (size_t) cells * b;
    return (ferry_gather_copy) {.src_offset = (size_t) from * b, .dst_offset = ((size_t) s * n_kv + (size_t) to) * b,
                                .size = size, .count = 1, .src_stride = size, .dst_stride = size};
}

/* The gather's pieces: per block (per_block) or per run of adjacent blocks; the blocks and runs
 * read, and the bytes. */
typedef struct {
    piece_list pieces;
    uint64_t blocks, runs, bytes;
} gather;

static ferry_status pieces_of(const ferry_tensor * t, const int64_t * used, bool per_block, gather * out) {
    const ferry_paged_source * src = t->paged;
    const int64_t bs = src->block_size;
    for (int64_t s = 0; s < t->ne[3]; s++) {
        const int32_t * table = src->tables->blocks[t->paged_first_seq + s];
        int64_t run_from = 0, run_to = 0, run_cells = 0; /* the run being read, in cells */
        for (int64_t j = 0; j * bs < used[s]; j++) {
            const int64_t from = (int64_t) table[j] * bs, cells = used[s] - j * bs < bs ? used[s] - j * bs : bs;
            out->blocks++;
            const bool adjacent = run_cells > 0 && run_from + run_cells == from;
            out->runs += !adjacent;
            if (run_cells > 0 && (per_block || !adjacent)) {
                const ferry_gather_copy c = piece_of(t, s, run_from, run_to, run_cells);
                FERRY_TRY(push(&out->pieces, &c, t));
                run_cells = 0;
            }
            if (run_cells == 0) {
                run_from = from;
                run_to = j * bs;
            }
            run_cells += cells;
            out->bytes += (uint64_t) cells * src->cell_bytes * (uint64_t) (src->v_trans ? src->n_embd : 1);
        }
        if (run_cells > 0) {
            const ferry_gather_copy c = piece_of(t, s, run_from, run_to, run_cells);
            FERRY_TRY(push(&out->pieces, &c, t));
        }
    }
    return FERRY_OK;
}

/* What one copy costs by model: a plain or 2-D copy of its source rows. */
static double copy_cost(const ferry_copy_cost_model * m, const ferry_gather_copy * c) {
    const ferry_copy_2d d = {.offset = c->src_offset, .size = c->size, .count = c->count,
                             .stride = c->count > 1 ? c->src_stride : c->size};
    return ferry_copy_plan_cost(m, &d, 1);
}

/* Runs of one row, of equal size at even strides on both sides, as one 2-D copy where the model
 * says it is cheaper than a copy each: their price in *cost, and with out the pieces, so that a
 * gather that takes another method prices the runs without building their list. */
static ferry_status group_runs(const ferry_copy_cost_model * m, const ferry_tensor * t, const piece_list * in,
                               piece_list * out, double * cost) {
    *cost = 0;
    for (size_t i = 0; i < in->n;) {
        const ferry_gather_copy * a = &in->c[i];
        size_t j = i + 1;
        size_t src_stride = 0, dst_stride = 0;
        if (a->count == 1 && j < in->n && in->c[j].count == 1 && in->c[j].size == a->size &&
            in->c[j].src_offset >= a->src_offset + a->size && in->c[j].dst_offset >= a->dst_offset + a->size) {
            src_stride = in->c[j].src_offset - a->src_offset;
            dst_stride = in->c[j].dst_offset - a->dst_offset;
            for (j++; j < in->n && in->c[j].count == 1 && in->c[j].size == a->size &&
                      in->c[j].src_offset == in->c[j - 1].src_offset + src_stride &&
                      in->c[j].dst_offset == in->c[j - 1].dst_offset + dst_stride;
                 j++) {
            }
        }
        const ferry_gather_copy group = {.src_offset = a->src_offset, .dst_offset = a->dst_offset, .size = a->size,
                                         .count = j - i, .src_stride = src_stride, .dst_stride = dst_stride};
        const double one = copy_cost(m, a), grouped = j - i > 1 ? copy_cost(m, &group) : one;
        if (j - i > 1 && grouped < (double) (j - i) * one) {
            *cost += grouped;
            if (out) {
                FERRY_TRY(push(out, &group, t));
            }
        } else {
            for (size_t k = i; k < j; k++) {
                *cost += k == i ? one : copy_cost(m, &in->c[k]);
                if (out) {
                    FERRY_TRY(push(out, &in->c[k], t));
                }
            }
        }
        i = j;
    }
    return FERRY_OK;
}

/* What a piece of size bytes costs beyond its bytes at gbps by the model's piece curve: exactly 0
 * without one, so that a gather priced without a curve is priced as it always was. */
static double curve_extra(const ferry_copy_cost_model * m, size_t size) {
    if (!(m->piece_floor_gbps > 0 && m->piece_floor_gbps < m->gbps)) {
        return 0.0;
    }
    return ferry_copy_piece_seconds(m, size) - (double) size / (m->gbps * 1e9);
}

/* The predicted seconds of a method's pieces (merged: its spans, bytes theirs). A batched call costs a
 * call, piece_ns a row, its bytes at gbps and what the piece curve adds to each row. */
static double method_cost(const ferry_copy_cost_model * m, ferry_gather_method method, const piece_list * l,
                          uint64_t bytes) {
    double s = 0, extra = 0;
    uint64_t rows = 0, carried = 0;
    for (size_t i = 0; i < l->n; i++) {
        s += method == FERRY_GATHER_PER_BLOCK || method == FERRY_GATHER_RUNS ? copy_cost(m, &l->c[i]) : 0;
        rows += l->c[i].count;
        carried += (uint64_t) l->c[i].size * l->c[i].count;
        extra += (double) l->c[i].count * curve_extra(m, l->c[i].size);
    }
    if (method == FERRY_GATHER_BATCHED || method == FERRY_GATHER_MERGED) {
        /* merged: the spans' call, and the device's gather of the runs from them */
        s = (method == FERRY_GATHER_MERGED ? 2 : 1) * m->call_us * 1e-6 + (double) rows * m->piece_ns * 1e-9 +
            (double) (method == FERRY_GATHER_MERGED ? carried : bytes) / (m->gbps * 1e9) + extra;
    } else if (method == FERRY_GATHER_KERNEL) {
        s = 2 * m->call_us * 1e-6 + (double) bytes / ((m->kernel_gbps > 0 ? m->kernel_gbps : m->gbps) * 1e9);
    }
    return s;
}

/* How much faster than the cheapest other method merged spans must be predicted for auto to take
 * them, where the cost model does not say (its merge_margin, a fit's own error): 10%, the tolerance the model's predictions are held to on the stand-in's named links (merged
 * ran 1.08 to 1.14x its prediction on the H100 profile, batched 1.02 to 1.04x; the H100's small pieces
 * were measured at 5 to 7 GB/s, the profile's floor their middle). A gain inside it is one the model
 * cannot tell from its own error, and merged crosses the gaps' bytes and needs a staging area for it. */
#define FERRY_MERGED_MARGIN 0.10

static int cmp_piece_start(const void * a, const void * b) {
    const size_t x = ((const ferry_gather_copy *) a)->src_offset, y = ((const ferry_gather_copy *) b)->src_offset;
    return (x > y) - (x < y);
}

/* The span of the pool from a's first byte through b's last (b starting at or past a's end), rows as a's. */
static ferry_gather_copy span_through(const ferry_gather_copy * a, const ferry_gather_copy * b, size_t pool_row,
                                      bool v_trans) {
    ferry_gather_copy s = *a;
    const size_t end = b->src_offset + b->size;
    s.size = end > a->src_offset + a->size ? end - a->src_offset : a->size;
    s.dst_stride = s.size;
    s.src_stride = v_trans ? pool_row : s.size;
    return s;
}

/*
 * The spans a merged gather carries, on a link whose pieces are priced by size (a piece curve: where
 * DMA engines' measurements show gaps are worth crossing). The runs' extents in the pool, in pool
 * order whatever the tables' order (the device gathers the runs from the spans, in any order), those
 * that touch or overlap as one (a block several streams read crosses once), then from each extent the
 * span through the later one that saves the most by the one merge rule (ferry_merge_reach, as
 * ferry_copy_pieces_merge: one piece of the span against a piece per extent, a piece's cost its
 * rows' bytes at their size's rate and piece_ns a row), else the extent alone; the next span starts after it. The gaps' cells cross the
 * link unread. Without a piece curve a span is its run, in table order: the batched gather. The spans
 * land one after another in a staging area (dst_offset), rows packed; *crossed sums their bytes.
 */
static ferry_status spans_of(const ferry_copy_cost_model * m, const ferry_tensor * t, const piece_list * runs,
                             piece_list * out, uint64_t * crossed) {
    const ferry_paged_source * src = t->paged;
    const size_t pool_row = (size_t) src->pool_cells * src->cell_bytes;
    const bool curve = m->piece_floor_gbps > 0 && m->piece_floor_gbps < m->gbps;
    *crossed = 0;
    piece_list extents = {0};
    for (size_t i = 0; i < runs->n; i++) {
        const ferry_gather_copy * r = &runs->c[i];
        const ferry_gather_copy e = {.src_offset = r->src_offset, .size = r->size, .count = r->count,
                                     .src_stride = src->v_trans ? pool_row : r->size, .dst_stride = r->size};
        ferry_status st = push(&extents, &e, t);
        if (st != FERRY_OK) {
            free(extents.c);
            return st;
        }
    }
    if (curve && extents.n > 1) { /* pool order, touching and overlapping extents as one */
        qsort(extents.c, extents.n, sizeof(*extents.c), cmp_piece_start);
        size_t k = 0;
        for (size_t i = 1; i < extents.n; i++) {
            if (extents.c[i].src_offset <= extents.c[k].src_offset + extents.c[k].size) {
                extents.c[k] = span_through(&extents.c[k], &extents.c[i], pool_row, src->v_trans);
            } else {
                extents.c[++k] = extents.c[i];
            }
        }
        extents.n = k + 1;
    }
    const ferry_merge_extents ext = {extents.n ? &extents.c[0].src_offset : NULL, extents.n ? &extents.c[0].size : NULL,
                                     sizeof(*extents.c)};
    size_t staged = 0;
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < extents.n && st == FERRY_OK;) {
        const size_t last = curve ? ferry_merge_reach(m, &ext, i, extents.n, extents.c[i].count) : i;
        ferry_gather_copy span = span_through(&extents.c[i], &extents.c[last], pool_row, src->v_trans);
        span.dst_offset = staged;
        st = push(out, &span, t);
        staged += span.size * span.count;
        *crossed += (uint64_t) span.size * span.count;
        i = last + 1;
    }
    free(extents.c);
    return st;
}

/* The one-call methods backend offers for the pool, as bits; none unless the pool is host memory
 * the destination reads by pointer (dst NULL: any of the backend's). */
static unsigned one_call_methods(ferry_backend * backend, const ferry_tensor * pool, const ferry_buffer * dst) {
    const ferry_buffer * buf = ferry_tensor_buffer(pool);
    if (!ferry_buffer_is_host(buf) || ferry_buffer_is_synthetic(buf) || (dst && !ferry_buffer_ptr_readable(buf, dst))) {
        return 0;
    }
    const unsigned bits = (1u << FERRY_GATHER_BATCHED) | (1u << FERRY_GATHER_KERNEL) | (1u << FERRY_GATHER_MERGED);
    return ferry_backend_gather_methods(backend, ferry_tensor_data(pool), ferry_tensor_nbytes(pool)) & bits;
}

/*
 * The gather of t into backend (dst: the destination buffer, NULL when only planning): its
 * pieces by the method the cache says (AUTO: the cheapest offered), in *chosen, and the plan.
 * The per-block pieces, never auto's choice, are made only for a plan (every_method) or when
 * the cache asks for them: a copy has no use for their price.
 */
static ferry_status plan_gather(const ferry_tensor * t, ferry_backend * backend, const ferry_buffer * dst,
                                bool every_method, ferry_paged_plan * plan, piece_list * chosen,
                                piece_list * spans) {
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(backend);
    const int64_t ns = t->ne[3];
    int64_t * used = ferry_malloc((size_t) (ns > 0 ? ns : 1) * sizeof(*used));
    if (!used) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged copy of '%s': out of memory for %lld lengths", t->name,
                          (long long) ns);
    }
    gather per_block = {0}, runs = {0};
    piece_list grouped = {0};
    const bool want_per_block = every_method || t->paged->tables->gather == FERRY_GATHER_PER_BLOCK;
    ferry_status st = ferry_paged_used_cells(t, "paged copy", used);
    if (st == FERRY_OK && want_per_block) {
        st = pieces_of(t, used, true, &per_block);
    }
    if (st == FERRY_OK) {
        st = pieces_of(t, used, false, &runs);
    }
    double runs_cost = 0; /* the runs' list is built below only if a copy takes them */
    if (st == FERRY_OK) {
        st = group_runs(&model, t, &runs.pieces, every_method ? &grouped : NULL, &runs_cost);
    }
    free(used);
    const unsigned offered = (want_per_block ? 1u << FERRY_GATHER_PER_BLOCK : 0) | (1u << FERRY_GATHER_RUNS) |
                             (st == FERRY_OK ? one_call_methods(backend, t->paged->pool, dst) : 0);
    uint64_t crossed = 0; /* the merged spans' bytes, gaps included */
    if (st == FERRY_OK && (offered & (1u << FERRY_GATHER_MERGED))) {
        st = spans_of(&model, t, &runs.pieces, spans, &crossed);
    }
    const piece_list * lists[FERRY_GATHER_COUNT] = {NULL, &per_block.pieces, &grouped, &runs.pieces, &runs.pieces,
                                                    spans};
    ferry_gather_method best = FERRY_GATHER_RUNS;
    *plan = (ferry_paged_plan) {.blocks = runs.blocks, .runs = runs.runs, .bytes = runs.bytes};
    const double error = model.merge_margin > 0 ? model.merge_margin : FERRY_MERGED_MARGIN; /* the model's own */
    for (int m = FERRY_GATHER_PER_BLOCK; st == FERRY_OK && m < FERRY_GATHER_COUNT; m++) {
        const double cost = m == FERRY_GATHER_RUNS ? runs_cost
                                                   : method_cost(&model, (ferry_gather_method) m, lists[m], runs.bytes);
        plan->method_seconds[m] = offered & (1u << m) ? cost : -1;
        /* merged (the last) must beat the best of the others by more than the model's error */
        const double margin = m == FERRY_GATHER_MERGED ? 1.0 + error : 1.0;
        if (m != FERRY_GATHER_PER_BLOCK && plan->method_seconds[m] >= 0 &&
            plan->method_seconds[m] * margin < plan->method_seconds[best]) {
            best = (ferry_gather_method) m; /* a tie stays with the runs */
        }
    }
    const ferry_gather_method method = t->paged->tables->gather == FERRY_GATHER_AUTO ? best : t->paged->tables->gather;
    if (st == FERRY_OK && !(offered & (1u << method))) {
        st = ferry_fail(FERRY_ERR_UNSUPPORTED, "paged copy of '%s': %s does not offer the %s gather for its pool in "
                        "%s memory (set the cache's gather to auto, runs or per_block)", t->name,
                        ferry_backend_name(backend), method_names[method],
                        ferry_buffer_type_name(ferry_buffer_get_type(ferry_tensor_buffer(t->paged->pool))));
    }
    if (st == FERRY_OK && method == FERRY_GATHER_RUNS && !every_method) {
        st = group_runs(&model, t, &runs.pieces, &grouped, &runs_cost);
    }
    if (st == FERRY_OK) {
        plan->method = method;
        plan->method_seconds[FERRY_GATHER_AUTO] = plan->method_seconds[best];
        plan->seconds = plan->method_seconds[method];
        const bool one_call = method == FERRY_GATHER_BATCHED || method == FERRY_GATHER_KERNEL ||
                              method == FERRY_GATHER_MERGED;
        plan->crossed_bytes = method == FERRY_GATHER_MERGED ? crossed : runs.bytes;
        plan->spans = method == FERRY_GATHER_MERGED ? spans->n : 0;
        /* a merged gather places the runs from its spans: the runs are its pieces, the spans its copies */
        *chosen = method == FERRY_GATHER_MERGED ? runs.pieces : *lists[method];
        plan->copies = lists[method]->n;
        plan->calls = one_call ? (runs.bytes > 0 ? 1 : 0) : chosen->n;
        /* the list handed out is not freed below */
        if (method == FERRY_GATHER_MERGED) {
            runs.pieces = (piece_list) {0};
        } else if (lists[method] == &per_block.pieces) {
            per_block.pieces = (piece_list) {0};
        } else if (lists[method] == &grouped) {
            grouped = (piece_list) {0};
        } else {
            runs.pieces = (piece_list) {0};
        }
    }
    free(per_block.pieces.c);
    free(runs.pieces.c);
    free(grouped.c);
    return st;
}

static ferry_status check_window(const ferry_tensor * t, ferry_backend * backend, const char * what) {
    FERRY_CHECK_ARG(t && backend, "%s: NULL argument", what);
    if (!t->paged) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: '%s' is not a paged window (ferry_paged_cache_window)", what,
                          t->name);
    }
    return ferry_tensor_check_allocated(t);
}

ferry_status ferry_copy_paged_plan(const ferry_tensor * window, ferry_backend * backend, ferry_paged_plan * plan,
                                   ferry_gather_copy * copies, size_t max_copies, size_t * n_copies) {
    FERRY_TRY(check_window(window, backend, "copy_paged_plan"));
    FERRY_CHECK_ARG(plan && n_copies, "copy_paged_plan: NULL output");
    piece_list chosen = {0}, spans = {0};
    ferry_status st = plan_gather(window, backend, NULL, true, plan, &chosen, &spans);
    const piece_list * out = st == FERRY_OK && plan->method == FERRY_GATHER_MERGED ? &spans : &chosen;
    *n_copies = out->n;
    if (st == FERRY_OK && copies && out->n > max_copies) {
        st = ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_paged_plan: '%s' needs %zu copies, room for %zu", window->name,
                        out->n, max_copies);
    } else if (st == FERRY_OK && copies && out->n > 0) {
        memcpy(copies, out->c, out->n * sizeof(*copies));
    }
    free(chosen.c);
    free(spans.c);
    return st;
}

/* ---------------------------------------------------------------- moving the pieces */

/* How the pieces reach dst: by pointer from host memory dst's backend reads, by get into dst's
 * host memory, else staged. Decided once a copy, not once a piece. */
typedef enum { PIECE_BY_POINTER, PIECE_BY_GET, PIECE_STAGED } piece_route;

/* One piece from the pool into dst by its route (staged: through `staging`). */
static ferry_status move_piece(ferry_backend * backend, const ferry_tensor * pool, ferry_tensor * dst,
                               const ferry_gather_copy * c, piece_route route, char * staging) {
    if (route == PIECE_BY_POINTER) {
        const char * from = (const char *) ferry_tensor_data(pool) + c->src_offset;
        return c->count > 1 ? ferry_backend_tensor_set_2d_async(backend, dst, from, c->dst_offset, c->size, c->count,
                                                                c->dst_stride, c->src_stride)
                            : ferry_backend_tensor_set_async(backend, dst, from, c->dst_offset, c->size);
    }
    if (route == PIECE_BY_GET) {
        char * to = (char *) ferry_tensor_data(dst) + c->dst_offset;
        return c->count > 1 ? ferry_tensor_get_2d(pool, to, c->src_offset, c->size, c->count, c->src_stride,
                                                  c->dst_stride)
                            : ferry_tensor_get(pool, to, c->src_offset, c->size);
    }
    FERRY_TRY(ferry_tensor_get_2d(pool, staging, c->src_offset, c->size, c->count, c->src_stride, c->size));
    FERRY_TRY(c->count > 1 ? ferry_backend_tensor_set_2d_async(backend, dst, staging, c->dst_offset, c->size,
                                                               c->count, c->dst_stride, c->size)
                           : ferry_backend_tensor_set_async(backend, dst, staging, c->dst_offset, c->size));
    return ferry_backend_synchronize(backend); /* the staging rows are reused, then freed */
}

ferry_status ferry_copy_paged(ferry_backend * backend, const ferry_tensor * src, ferry_tensor * dst, uint64_t * read,
                              ferry_gather_method * method, double * predicted) {
    *read = 0;
    *predicted = 0;
    const ferry_tensor * pool = src->paged->pool;
    ferry_paged_plan plan;
    piece_list l = {0}, spans = {0};
    ferry_status st = plan_gather(src, backend, ferry_tensor_buffer(dst), false, &plan, &l, &spans);
    if (st == FERRY_OK && plan.method == FERRY_GATHER_MERGED) {
        st = ferry_backend_tensor_gather_merged_async(backend, dst, ferry_tensor_data(pool), spans.c, spans.n, l.c,
                                                      l.n);
    } else if (st == FERRY_OK && (plan.method == FERRY_GATHER_BATCHED || plan.method == FERRY_GATHER_KERNEL)) {
        st = ferry_backend_tensor_gather_async(backend, dst, ferry_tensor_data(pool), l.c, l.n, plan.method);
    } else if (st == FERRY_OK) {
        size_t largest = 0;
        for (size_t i = 0; i < l.n; i++) {
            largest = l.c[i].size * l.c[i].count > largest ? l.c[i].size * l.c[i].count : largest;
        }
        const ferry_buffer * src_buf = ferry_tensor_buffer(pool);
        const ferry_buffer * dst_buf = ferry_tensor_buffer(dst);
        const piece_route route = ferry_buffer_ptr_readable(src_buf, dst_buf)   ? PIECE_BY_POINTER
                                  : ferry_buffer_ptr_writable(dst_buf, src_buf) ? PIECE_BY_GET
                                                                                : PIECE_STAGED;
        char * staging = NULL;
        /* zeroed: a synthetic pool writes none */
        if (route == PIECE_STAGED && largest > 0 && !(staging = ferry_calloc(largest, 1))) {
            st = ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "paged copy of '%s': cannot stage %zu bytes", src->name, largest);
        }
        for (size_t i = 0; st == FERRY_OK && i < l.n; i++) {
            st = move_piece(backend, pool, dst, &l.c[i], route, staging);
        }
        free(staging);
    }
    if (st == FERRY_OK) {
        *read = plan.bytes;
        *method = plan.method;
        *predicted = plan.seconds;
    }
    free(l.c);
    free(spans.c);
    return st;
}
