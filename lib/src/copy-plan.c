/*
 * Copy planning: the fewest 2-D copies that move exactly the bytes a view reads, and
 * the cost rule that says whether they beat one flat copy of the view's span.
 *
 * A view reads, for every index, `unit` bytes (an element, or a block for block types)
 * at sum(i_d * nb_d). We describe it as a row of `row` contiguous bytes repeated over
 * a lattice of dimensions (count, stride), and simplify that lattice without changing
 * the set of bytes it covers:
 *   - dimensions of count 1 or stride 0 (broadcast) add no bytes: dropped;
 *   - a dimension whose stride is at most the row extends the row (its copies touch
 *     or overlap, so their union is one longer row), in any order of strides;
 *   - two dimensions fold into one when the outer stride is a multiple m of the inner
 *     one and m <= inner count: together they are one even progression (the transposed
 *     V window folds this way to one 2-D copy).
 * If what is left nests (each stride at least the extent of everything inside it),
 * rows are disjoint: one 2-D copy takes the dimension with the most rows and the
 * others are enumerated. If it does not (views whose rows interleave or overlap), the
 * innermost dimensions that tangle are enumerated as byte intervals, sorted, merged,
 * grouped into evenly spaced runs, and the nesting outer dimensions repeat those runs.
 * Either way every byte the view reads is moved exactly once and no other byte is.
 * ferry_copy_plan_explain runs the same simplification and says what each step did.
 */
#include "copy-impl.h"
#include "ferry-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A lattice of at most 4 dimensions, plus one run dimension in the tangled case. */
#define PLAN_MAX_DIMS (FERRY_MAX_DIMS + 1)
/* Rows of tangled dimensions enumerated at most (16 MiB of start and end offsets); past it: UNSUPPORTED. */
#define PLAN_MAX_TANGLED_ROWS ((size_t) 1 << 20)

typedef struct {
    size_t n;            /* count, >= 2 once simplified */
    size_t s;            /* byte stride */
    ferry_dim_list dims; /* the view's dimensions it stands for (none for a run of intervals) */
} plan_dim;

typedef struct {
    ferry_copy_2d * out; /* NULL: only count */
    size_t max;
    size_t count;        /* copies the plan needs so far */
} plan_sink;

static void sort_dims(plan_dim * d, int nd) {
    for (int i = 1; i < nd; i++) {
        plan_dim x = d[i];
        int j = i;
        while (j > 0 && d[j - 1].s > x.s) {
            d[j] = d[j - 1];
            j--;
        }
        d[j] = x;
    }
}

static void remove_dim(plan_dim * d, int * nd, int i) {
    memmove(d + i, d + i + 1, (size_t) (*nd - i - 1) * sizeof(*d));
    (*nd)--;
}

static void append_dims(ferry_dim_list * to, const ferry_dim_list * from) {
    for (int i = 0; i < from->n && to->n < FERRY_MAX_DIMS; i++) {
        to->dim[to->n++] = from->dim[i];
    }
}

/* Simplify (row, dims) to fixpoint without changing the bytes covered; dims sorted by stride.
 * With ex, each step is recorded there: dimensions dropped as broadcast, merged into the
 * row, folded. No arithmetic here can overflow: every value stays within the view's
 * checked span. */
static void simplify(size_t * row, plan_dim * d, int * nd, ferry_copy_explanation * ex) {
    for (bool changed = true; changed;) {
        changed = false;
        int k = 0;
        for (int i = 0; i < *nd; i++) {
            if (d[i].n > 1 && d[i].s > 0) {
                d[k++] = d[i];
            } else if (d[i].n > 1 && ex) { /* stride 0: the same bytes again */
                append_dims(&ex->broadcast, &d[i].dims);
            }
        }
        *nd = k;
        sort_dims(d, *nd);
        if (*nd > 0 && d[0].s <= *row) {
            *row += (d[0].n - 1) * d[0].s;
            if (ex) {
                append_dims(&ex->row_dims, &d[0].dims);
            }
            remove_dim(d, nd, 0);
            changed = true;
            continue;
        }
        for (int i = 0; i < *nd && !changed; i++) {
            for (int j = i + 1; j < *nd && !changed; j++) {
                const size_t m = d[j].s / d[i].s;
                if (d[j].s % d[i].s == 0 && m <= d[i].n) {
                    if (ex && ex->n_folds < FERRY_MAX_DIMS) {
                        ex->folds[ex->n_folds++] = (ferry_copy_fold) {.inner = d[i].dims, .outer = d[j].dims};
                    }
                    d[i].n += (d[j].n - 1) * m;
                    append_dims(&d[i].dims, &d[j].dims);
                    remove_dim(d, nd, j);
                    changed = true;
                }
            }
        }
    }
}

/* The first k such that dims k.. nest around the extent of row and dims ..k-1 (sorted
 * dims); 0 when the whole lattice nests, else dims 0..k-1 are the tangled ones. */
static int nesting_from(size_t row, const plan_dim * d, int nd) {
    for (int k = 0; k <= nd; k++) {
        size_t extent = row;
        for (int i = 0; i < k; i++) {
            extent += (d[i].n - 1) * d[i].s;
        }
        bool nests = true;
        for (int i = k; i < nd && nests; i++) {
            nests = d[i].s >= extent;
            extent += (d[i].n - 1) * d[i].s;
        }
        if (nests) {
            return k;
        }
    }
    return nd;
}

/* The dimension one 2-D copy of nested rows runs along: the one with the most rows, the
 * smallest stride among equals (d is sorted); -1 when there is none. */
static int dim_2d_of(const plan_dim * d, int nd) {
    int p = -1;
    for (int i = 0; i < nd; i++) {
        if (p < 0 || d[i].n > d[p].n) {
            p = i;
        }
    }
    return p;
}

/* How many 2-D copies nested rows take: one per index of every dimension but p. */
static ferry_status nested_copies(const plan_dim * d, int nd, int p, size_t * others) {
    *others = 1;
    for (int i = 0; i < nd; i++) {
        if (i != p && !ferry_mul_ok(*others, d[i].n, others)) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_plan: copy count overflows");
        }
    }
    return FERRY_OK;
}

/* Nested rows at base: one 2-D copy along dim_2d_of's dimension, one such copy per index
 * of the other dimensions. */
static ferry_status emit_nested(size_t base, size_t row, const plan_dim * d, int nd, plan_sink * sink) {
    const int p = dim_2d_of(d, nd);
    size_t others;
    FERRY_TRY(nested_copies(d, nd, p, &others));
    size_t total;
    if (!ferry_add_ok(sink->count, others, &total)) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_plan: copy count overflows");
    }
    if (!sink->out || total > sink->max) {
        sink->count = total; /* counting only, or no room: the caller gets the count */
        return FERRY_OK;
    }
    const ferry_copy_2d proto = {.size = row, .count = p >= 0 ? d[p].n : 1, .stride = p >= 0 ? d[p].s : row};
    size_t idx[PLAN_MAX_DIMS] = {0};
    for (size_t c = 0; c < others; c++) {
        size_t off = base;
        for (int i = 0; i < nd; i++) {
            off += idx[i] * d[i].s;
        }
        sink->out[sink->count] = proto;
        sink->out[sink->count].offset = off;
        sink->count++;
        for (int i = 0; i < nd; i++) { /* next index, innermost fastest, skipping the 2-D dimension */
            if (i == p) {
                continue;
            }
            if (++idx[i] < d[i].n) {
                break;
            }
            idx[i] = 0;
        }
    }
    return FERRY_OK;
}

static int cmp_size(const void * a, const void * b) {
    const size_t x = *(const size_t *) a, y = *(const size_t *) b;
    return (x > y) - (x < y);
}

/* Dims 0..k-1 tangle: enumerate their rows, merge them into disjoint intervals, group
 * evenly spaced equal intervals into runs, and repeat each run over the nesting dims k... */
static ferry_status emit_tangled(size_t row, const plan_dim * d, int nd, int k, plan_sink * sink) {
    size_t n_rows = 1;
    for (int i = 0; i < k; i++) {
        if (!ferry_mul_ok(n_rows, d[i].n, &n_rows) || n_rows > PLAN_MAX_TANGLED_ROWS) {
            return ferry_fail(FERRY_ERR_UNSUPPORTED,
                              "copy_plan: rows overlap or interleave across more than %zu rows; copy the span instead",
                              PLAN_MAX_TANGLED_ROWS);
        }
    }
    size_t * start = ferry_malloc(2 * n_rows * sizeof(size_t));
    if (!start) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "copy_plan: no memory for %zu row offsets", n_rows);
    }
    size_t * end = start + n_rows;
    size_t idx[PLAN_MAX_DIMS] = {0};
    for (size_t r = 0; r < n_rows; r++) {
        start[r] = 0;
        for (int i = 0; i < k; i++) {
            start[r] += idx[i] * d[i].s;
        }
        for (int i = 0; i < k; i++) {
            if (++idx[i] < d[i].n) {
                break;
            }
            idx[i] = 0;
        }
    }
    qsort(start, n_rows, sizeof(size_t), cmp_size);
    size_t m = 0; /* merged intervals [start[i], end[i]) */
    for (size_t r = 0; r < n_rows; r++) {
        if (m > 0 && start[r] <= end[m - 1]) {
            const size_t e = start[r] + row;
            end[m - 1] = e > end[m - 1] ? e : end[m - 1];
        } else {
            start[m] = start[r];
            end[m] = start[r] + row;
            m++;
        }
    }
    ferry_status st = FERRY_OK;
    for (size_t i = 0; i < m && st == FERRY_OK;) {
        const size_t w = end[i] - start[i];
        size_t c = 1, stride = w, j = i + 1;
        if (j < m && end[j] - start[j] == w) {
            stride = start[j] - start[i];
            for (c = 2, j++; j < m && end[j] - start[j] == w && start[j] - start[j - 1] == stride; j++) {
                c++;
            }
        }
        plan_dim dd[PLAN_MAX_DIMS];
        int n2 = 0;
        dd[n2++] = (plan_dim) {.n = c, .s = stride, .dims = {0}};
        for (int o = k; o < nd; o++) {
            dd[n2++] = d[o];
        }
        size_t r2 = w;
        simplify(&r2, dd, &n2, NULL); /* a run may fold with an outer dimension */
        st = emit_nested(start[i], r2, dd, n2, sink);
        i = j;
    }
    free(start);
    return st;
}

/*
 * The lattice of a layout before simplification: one dimension per dimension of the
 * view (dimension 0 counted in blocks) and a row of one element or block. *empty is set
 * for a view with a dimension of 0 (the lattice is then not filled). name is the
 * tensor's, for messages (NULL: a bare layout).
 */
static ferry_status plan_lattice(ferry_type type, const int64_t * ne, const size_t * nb, const char * what,
                                 const char * name, plan_dim * d, size_t * row, bool * empty) {
    *empty = false;
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "%s: unknown type %d", what, (int) type);
    }
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (ne[i] < 0) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: ne[%d] = %lld is negative", what, i, (long long) ne[i]);
        }
        if (ne[i] == 0) {
            *empty = true; /* reads nothing: no copies */
            return FERRY_OK;
        }
    }
    const int64_t blck = ferry_blck_size(type);
    if (ne[0] % blck != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: ne[0] = %lld is not whole %s blocks of %lld", what,
                          (long long) ne[0], ferry_type_name(type), (long long) blck);
    }
    size_t span = *row = ferry_type_size(type);
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        d[i] = (plan_dim) {.n = (size_t) (i == 0 ? ne[0] / blck : ne[i]), .s = nb[i], .dims = {.n = 1, .dim = {i}}};
        size_t step;
        if (!ferry_mul_ok(d[i].n - 1, d[i].s, &step) || !ferry_add_ok(span, step, &span)) {
            return name ? ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the strides of '%s' overflow", what, name)
                        : ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the strides overflow", what);
        }
    }
    return FERRY_OK;
}

ferry_status ferry_copy_plan(const ferry_tensor * t, ferry_copy_2d * copies, size_t max_copies, size_t * n_copies) {
    FERRY_CHECK_ARG(t && n_copies, "copy_plan: NULL argument");
    *n_copies = 0;
    plan_dim d[PLAN_MAX_DIMS];
    int nd = FERRY_MAX_DIMS;
    size_t row;
    bool empty;
    FERRY_TRY(plan_lattice(t->type, t->ne, t->nb, "copy_plan", t->name, d, &row, &empty));
    if (empty) {
        return FERRY_OK;
    }
    simplify(&row, d, &nd, NULL);
    const int k = nesting_from(row, d, nd);
    plan_sink sink = {.out = copies, .max = copies ? max_copies : 0, .count = 0};
    FERRY_TRY(k == 0 ? emit_nested(0, row, d, nd, &sink) : emit_tangled(row, d, nd, k, &sink));
    *n_copies = sink.count;
    if (copies && sink.count > max_copies) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_plan: '%s' needs %zu copies, room for %zu", t->name,
                          sink.count, max_copies);
    }
    return FERRY_OK;
}

ferry_status ferry_copy_plan_explain(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb,
                                     ferry_copy_explanation * out) {
    FERRY_CHECK_ARG(ne && nb && out, "copy_plan_explain: NULL argument");
    if (n_dims < 1 || n_dims > FERRY_MAX_DIMS) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "copy_plan_explain: n_dims %d is not in 1..%d", n_dims,
                          FERRY_MAX_DIMS);
    }
    int64_t ne4[FERRY_MAX_DIMS] = {1, 1, 1, 1};
    size_t nb4[FERRY_MAX_DIMS] = {0};
    for (int i = 0; i < n_dims; i++) {
        ne4[i] = ne[i];
        nb4[i] = nb[i];
    }
    ferry_copy_explanation ex = {.nested = true, .dim_2d = -1};
    plan_dim d[PLAN_MAX_DIMS];
    int nd = FERRY_MAX_DIMS;
    FERRY_TRY(plan_lattice(type, ne4, nb4, "copy_plan_explain", NULL, d, &ex.row, &ex.empty));
    if (ex.empty) {
        ex.row = 0;
        *out = ex;
        return FERRY_OK;
    }
    simplify(&ex.row, d, &nd, &ex);
    ex.n_dims = nd;
    for (int i = 0; i < nd; i++) {
        ex.dims[i] = (ferry_copy_dim) {.count = d[i].n, .stride = d[i].s, .dims = d[i].dims};
    }
    ex.nested = nesting_from(ex.row, d, nd) == 0;
    if (ex.nested) {
        ex.dim_2d = dim_2d_of(d, nd);
        FERRY_TRY(nested_copies(d, nd, ex.dim_2d, &ex.n_copies));
    }
    *out = ex;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- the cost rule */

/*
 * CPU figures (tools/copy_cost_bench, tools/results/2026-11-30-copy-cost-cpu.md): a
 * 2-core AMD EPYC under KVM, caches flushed before each run, 32 MiB read as rows of
 * 16 B..64 KiB spaced 1.25..8 times their width, against one memcpy of the span.
 * The flat copy runs at 11.8 GB/s. Gapped rows pay about 30 ns each, and rows under
 * 8 KiB move at 0.6 of the flat rate (the prefetcher restarts at every gap); rows
 * sharing cache lines cost whole lines. On fresh runs of the grid this model picks a
 * copy on average 4.9% slower than the faster one with caches flushed, 5.7% with the
 * rows warm (always the plan: 10.8% and 16.6%; always flat: 56% and 228%). So the
 * plan pays on the CPU when the span is more than this many times the bytes read:
 *     row   16 B  32 B  64 B  128 B  256 B  1 KiB  4 KiB  >= 8 KiB
 *     span  29x   14x   7.2x  4.4x   3.1x   2.0x   1.75x  1.05x (-> 1x)
 * call_us is an assumption (a blocking call and its checks; not separable here). A gather's
 * piece costs what a gapped row does; the host has no gather kernel (kernel_gbps unused).
 */
ferry_copy_cost_model ferry_copy_cost_model_cpu(void) {
    return (ferry_copy_cost_model) {
        .call_us = 0.2, .row_ns = 30.0, .gbps = 11.8, .line_bytes = 64, .small_row_bytes = 8192,
        .small_row_efficiency = 0.6, .wide_pitch_bytes = 0, .wide_pitch_row_ns = 0.0, .piece_ns = 30.0,
        .kernel_gbps = 0.0,
    };
}

/*
 * GPU figures, host to device over PCIe gen 5 from pinned memory, from the H200 anchors
 * of docs/design.md ("Measured anchors"): 54.9 GB/s contiguous; rows under 256 B at 73% of it (measured at 64 B;
 * assumed for 64..255 B, and rows under 64 B charged a whole 64 B), 256 B and wider at
 * 99.7% (taken as 100%). call_us: a blocking copy measured less its bytes at 54.9 GB/s
 * is 4..7 us over the K-window anchors (flat 372 us for 20.2 MB, 2-D 91/177/352 us),
 * and one extra call per stream costs 2-6%: 4 us. The transposed V at 64 KiB pitch
 * (1024 rows of 4352 B: 128 us where the same bytes contiguous take 85 us) gives
 * 42 ns per row at that pitch; at 32 KiB or less rows run at the floor. The model
 * reproduces those anchors within 3%. Rows of 256 B or more cost nothing beyond their
 * bytes, so there the plan pays when it moves fewer bytes than the span, each copy
 * beyond the first saving at least a call's worth (4 us: about 220 KB); narrower rows
 * need a span above 1.37x the bytes read (64 B rows), 1.37 x 64 / width below 64 B.
 * A paged gather's figures are assumptions until tools/gpu-check measures them: piece_ns from
 * vLLM's batched DMA on an H100 (about 6 GB/s for 8 KiB descriptors against 50 from 28 KiB up:
 * some 1.2 us a descriptor), kernel_gbps from the gather kernel of the transposed V anchor
 * (99 us where the same bytes contiguous take 85: 54.9 / 1.15).
 */
ferry_copy_cost_model ferry_copy_cost_model_gpu(void) {
    return (ferry_copy_cost_model) {
        .call_us = 4.0, .row_ns = 0.0, .gbps = 54.9, .line_bytes = 64, .small_row_bytes = 256,
        .small_row_efficiency = 0.73, .wide_pitch_bytes = 65536, .wide_pitch_row_ns = 42.0, .piece_ns = 1200.0,
        .kernel_gbps = 47.7,
    };
}

double ferry_copy_piece_seconds(const ferry_copy_cost_model * m, size_t size) {
    if (!m || !(m->gbps > 0)) {
        return 0.0;
    }
    const double bps = m->gbps * 1e9, at_peak = (double) size / bps; /* as ever without a curve, bit for bit */
    if (!(m->piece_floor_gbps > 0) || m->piece_floor_gbps >= m->gbps || !(m->piece_knee_bytes > 0)) {
        return at_peak;
    }
    /* the share of the floor's extra cost a piece of this size still pays: 1 when small, 0 when large */
    const double small = 1.0 / (1.0 + pow((double) size / m->piece_knee_bytes, m->piece_steepness));
    return at_peak + (double) size * (1.0 / (m->piece_floor_gbps * 1e9) - 1.0 / bps) * small;
}

/* Seconds for one copy: a plain copy (one piece) when it is one row, else count gapped rows. */
static double copy_cost(const ferry_copy_cost_model * m, const ferry_copy_2d * c) {
    const double bps = m->gbps * 1e9;
    if (c->count <= 1) {
        return m->call_us * 1e-6 + ferry_copy_piece_seconds(m, c->size);
    }
    double charged = (double) c->size;
    if (m->line_bytes > 0) {
        charged = (double) ((c->size + m->line_bytes - 1) / m->line_bytes) * (double) m->line_bytes;
    }
    charged = charged > (double) c->stride ? (double) c->stride : charged; /* the next row shares the line */
    const double eff = c->size < m->small_row_bytes ? m->small_row_efficiency : 1.0;
    double per_row = m->row_ns * 1e-9 + charged / (bps * eff);
    if (m->wide_pitch_bytes > 0 && c->stride >= m->wide_pitch_bytes) {
        per_row += m->wide_pitch_row_ns * 1e-9;
    }
    return m->call_us * 1e-6 + (double) c->count * per_row;
}

double ferry_copy_plan_cost(const ferry_copy_cost_model * m, const ferry_copy_2d * copies, size_t n) {
    if (!m || m->gbps <= 0 || (!copies && n > 0)) {
        return 0.0;
    }
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        s += copy_cost(m, &copies[i]);
    }
    return s;
}

double ferry_copy_flat_cost(const ferry_copy_cost_model * m, size_t span) {
    if (!m || m->gbps <= 0 || span == 0) {
        return 0.0;
    }
    return m->call_us * 1e-6 + ferry_copy_piece_seconds(m, span);
}

bool ferry_copy_plan_pays(const ferry_copy_cost_model * m, const ferry_tensor * t, const ferry_copy_2d * copies,
                          size_t n) {
    if (!m || m->gbps <= 0 || !t || !copies || n == 0) {
        return false;
    }
    return ferry_copy_plan_cost(m, copies, n) < ferry_copy_flat_cost(m, ferry_tensor_nbytes(t));
}

ferry_copy_cost_model ferry_backend_copy_cost_model(const ferry_backend * backend) {
    if (backend && backend->has_cost_model) {
        return backend->cost_model;
    }
    if (backend && backend->queue_of) {
        return ferry_backend_copy_cost_model(backend->queue_of);
    }
    if (backend && backend->iface.copy_cost_model) {
        return backend->iface.copy_cost_model(backend);
    }
    return ferry_copy_cost_model_cpu();
}

ferry_status ferry_copy_cost_model_check(const ferry_copy_cost_model * m, const char * what) {
    FERRY_CHECK_ARG(m, "%s: NULL cost model", what);
    const double figures[11] = {m->call_us,           m->row_ns,   m->gbps,        m->small_row_efficiency,
                                m->wide_pitch_row_ns, m->piece_ns, m->kernel_gbps, m->piece_floor_gbps,
                                m->piece_knee_bytes,  m->piece_steepness, m->merge_margin};
    static const char * const names[11] = {"call_us",           "row_ns",           "gbps",
                                           "small_row_efficiency", "wide_pitch_row_ns", "piece_ns",
                                           "kernel_gbps",       "piece_floor_gbps", "piece_knee_bytes",
                                           "piece_steepness",   "merge_margin"};
    for (int i = 0; i < 11; i++) {
        if (!(figures[i] >= 0 && figures[i] <= 1e12)) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: the cost model's %s %g is not a number from 0 to 1e12", what,
                              names[i], figures[i]);
        }
    }
    if (!(m->gbps > 0)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: the cost model's gbps %g is not positive", what, m->gbps);
    }
    if (m->piece_floor_gbps > 0 && !(m->piece_floor_gbps <= m->gbps && m->piece_knee_bytes > 0 &&
                                     m->piece_steepness > 0 && m->piece_steepness <= 256)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: the cost model's piece curve (floor %g GB/s, knee %g B, "
                          "steepness %g) needs a floor at most gbps %g, a positive knee and a steepness in (0, 256]",
                          what, m->piece_floor_gbps, m->piece_knee_bytes, m->piece_steepness, m->gbps);
    }
    if (m->small_row_bytes > 0 && !(m->small_row_efficiency > 0 && m->small_row_efficiency <= 1)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: the cost model's small_row_efficiency %g is not in (0, 1] while "
                          "small_row_bytes is %zu", what, m->small_row_efficiency, m->small_row_bytes);
    }
    return FERRY_OK;
}

ferry_status ferry_backend_set_copy_cost_model(ferry_backend * backend, const ferry_copy_cost_model * model) {
    FERRY_CHECK_ARG(backend, "backend_set_copy_cost_model: NULL backend");
    if (model) {
        FERRY_TRY(ferry_copy_cost_model_check(model, "backend_set_copy_cost_model"));
        backend->cost_model = *model;
    }
    backend->has_cost_model = model != NULL;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- a plan's pieces */

/* Appends count rows of size bytes (src and dst each stepping by its stride) to the pieces. */
static ferry_status add_rows(size_t src, size_t dst, size_t size, size_t count, size_t src_stride, size_t dst_stride,
                             ferry_copy_piece * pieces, size_t max, size_t * n) {
    for (size_t i = 0; i < count && size > 0; i++) {
        size_t s = 0, d = 0, s_end = 0, d_end = 0;
        if (!ferry_mul_ok(i, src_stride, &s) || !ferry_add_ok(s, src, &s) || !ferry_mul_ok(i, dst_stride, &d) ||
            !ferry_add_ok(d, dst, &d) || !ferry_add_ok(s, size, &s_end) || !ferry_add_ok(d, size, &d_end)) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_pieces: row %zu of %zu bytes at %zu overflows", i, size,
                              src);
        }
        if (pieces && *n < max) {
            pieces[*n] = (ferry_copy_piece) {.src_offset = s, .dst_offset = d, .size = size};
        }
        (*n)++;
    }
    return FERRY_OK;
}

static ferry_status pieces_room(const char * what, size_t needed, ferry_copy_piece * pieces, size_t max) {
    if (pieces && needed > max) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: %zu pieces needed, room for %zu", what, needed, max);
    }
    return FERRY_OK;
}

ferry_status ferry_copy_pieces(const ferry_copy_2d * copies, size_t n, ferry_copy_piece * pieces, size_t max_pieces,
                               size_t * n_pieces) {
    FERRY_CHECK_ARG(n_pieces && (copies || n == 0), "copy_pieces: NULL argument");
    *n_pieces = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_copy_2d * c = &copies[i];
        FERRY_TRY(add_rows(c->offset, c->offset, c->size, c->count, c->stride, c->stride, pieces, max_pieces, &count));
    }
    *n_pieces = count;
    return pieces_room("copy_pieces", count, pieces, max_pieces);
}

ferry_status ferry_gather_pieces(const ferry_gather_copy * copies, size_t n, ferry_copy_piece * pieces,
                                 size_t max_pieces, size_t * n_pieces) {
    FERRY_CHECK_ARG(n_pieces && (copies || n == 0), "gather_pieces: NULL argument");
    *n_pieces = 0;
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const ferry_gather_copy * c = &copies[i];
        FERRY_TRY(add_rows(c->src_offset, c->dst_offset, c->size, c->count, c->src_stride, c->dst_stride, pieces,
                           max_pieces, &count));
    }
    *n_pieces = count;
    return pieces_room("gather_pieces", count, pieces, max_pieces);
}

ferry_status ferry_copy_pieces_place(void * dst, size_t dst_bytes, const void * src, size_t src_bytes,
                                     const ferry_copy_piece * pieces, size_t n) {
    FERRY_CHECK_ARG(n == 0 || (dst && src && pieces), "copy_pieces_place: NULL argument");
    for (size_t i = 0; i < n; i++) { /* all checked first: a refused placement writes nothing */
        const ferry_copy_piece * p = &pieces[i];
        size_t s_end = 0, d_end = 0;
        if (!ferry_add_ok(p->src_offset, p->size, &s_end) || !ferry_add_ok(p->dst_offset, p->size, &d_end) ||
            s_end > src_bytes || d_end > dst_bytes) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS,
                              "copy_pieces_place: piece %zu (%zu bytes from %zu to %zu) ends past the source's %zu "
                              "or the destination's %zu bytes",
                              i, p->size, p->src_offset, p->dst_offset, src_bytes, dst_bytes);
        }
    }
    for (size_t i = 0; i < n; i++) {
        memcpy((char *) dst + pieces[i].dst_offset, (const char *) src + pieces[i].src_offset, pieces[i].size);
    }
    return FERRY_OK;
}

double ferry_batched_piece_seconds(const ferry_copy_cost_model * m, size_t size, size_t rows) {
    return (double) rows * (m->piece_ns * 1e-9 + ferry_copy_piece_seconds(m, size));
}

/* The k-th of the extents' fields: each at its own offset inside items stride bytes apart. */
static size_t field_of(const size_t * first, size_t stride, size_t k) {
    return *(const size_t *) (const void *) ((const char *) first + k * stride);
}

size_t ferry_merge_reach(const ferry_copy_cost_model * m, const ferry_merge_extents * ext, size_t i, size_t n,
                         size_t rows) {
    const size_t start = field_of(ext->offset, ext->stride, i);
    double apart = ferry_batched_piece_seconds(m, field_of(ext->size, ext->stride, i), rows), saved = 0;
    size_t last = i;
    for (size_t j = i + 1; j < n && j <= i + FERRY_MERGE_LOOKAHEAD; j++) {
        const size_t size = field_of(ext->size, ext->stride, j), end = field_of(ext->offset, ext->stride, j) + size;
        apart += ferry_batched_piece_seconds(m, size, rows);
        const double saving = apart - ferry_batched_piece_seconds(m, end - start, rows);
        if (saving > saved) {
            saved = saving;
            last = j;
        }
    }
    return last;
}

/* Does b follow a with the same gap (none included) in the source and the destination? */
static bool same_gap_after(const ferry_copy_piece * a, const ferry_copy_piece * b) {
    return b->src_offset >= a->src_offset + a->size && b->dst_offset >= a->dst_offset + a->size &&
           b->src_offset - (a->src_offset + a->size) == b->dst_offset - (a->dst_offset + a->size);
}

ferry_status ferry_copy_pieces_merge(const ferry_copy_cost_model * model, ferry_copy_piece * pieces, size_t * n_pieces,
                                     uint64_t * gap_bytes) {
    FERRY_CHECK_ARG(n_pieces && (pieces || *n_pieces == 0), "copy_pieces_merge: NULL argument");
    FERRY_TRY(ferry_copy_cost_model_check(model, "copy_pieces_merge"));
    size_t kept = 0, end = 0;
    for (size_t i = 0; i < *n_pieces; i++) { /* touching pieces always as one, as a merged gather's extents */
        const ferry_copy_piece p = pieces[i];
        if (!ferry_add_ok(p.src_offset, p.size, &end) || !ferry_add_ok(p.dst_offset, p.size, &end)) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "copy_pieces_merge: piece %zu's end overflows", i);
        }
        ferry_copy_piece * last = kept ? &pieces[kept - 1] : NULL;
        if (last && p.src_offset == last->src_offset + last->size && p.dst_offset == last->dst_offset + last->size) {
            last->size += p.size;
        } else {
            pieces[kept++] = p;
        }
    }
    /* then across gaps by the one rule (ferry_merge_reach), within each run of pieces whose gaps are
     * the same in source and destination (a gap's bytes land where the destination has them) */
    uint64_t gaps = 0;
    size_t out = 0;
    for (size_t i = 0; i < kept;) {
        size_t chain = i + 1;
        while (chain < kept && same_gap_after(&pieces[chain - 1], &pieces[chain])) {
            chain++;
        }
        const ferry_merge_extents ext = {&pieces[0].src_offset, &pieces[0].size, sizeof(*pieces)};
        const size_t last = ferry_merge_reach(model, &ext, i, chain, 1);
        ferry_copy_piece span = pieces[i];
        span.size = pieces[last].src_offset + pieces[last].size - span.src_offset;
        for (size_t j = i; j <= last; j++) {
            gaps -= pieces[j].size;
        }
        gaps += span.size;
        pieces[out++] = span;
        i = last + 1;
    }
    *n_pieces = out;
    if (gap_bytes) {
        *gap_bytes = gaps;
    }
    return FERRY_OK;
}
