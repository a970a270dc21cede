/*
 * ferry's graph allocator against ggml's (ggml_gallocr) on the same random graphs.
 *
 * Each graph comes from one seed (tests/c/random-graph.h: f32 add, mul, scale, dup,
 * concat, pad, mean, view, permute, transpose, reshape; 10 to 60 nodes) and is built in
 * both libraries in the same order, then allocated by each with an alignment of 32 and
 * no max size: ferry on a dummy backend of synthetic addresses, ggml on its CPU buffer
 * type. For each graph it reports both buffer sizes (and ferry's with inputs kept), and
 * checks both placements with tests/c/alloc-check.h: no two tensors whose lifetimes
 * intersect share a byte. At the end: how many graphs, where ferry is the same, larger,
 * smaller, and ferry/ggml's median, p90, max and geometric mean.
 *
 * It also times each library's reserve of each graph (ferry_gallocr_reserve,
 * ggml_gallocr_reserve), on an allocator that has reserved that graph once already, as
 * a caller that reserves every step does: -r times each (default 9), the libraries
 * taking turns and which goes first alternating, so that a slow moment of the machine
 * falls on both; each graph's fastest time is summed per library, and the ratio given.
 * The first, untimed reserve is where each makes its buffer (ggml of real memory, ferry
 * of synthetic addresses here), so it is left out of both.
 *
 * Not built by meson, never by CI: it needs a ggml checkout and build, given by path.
 *
 *   git clone https://github.com/ggml-org/ggml /tmp/ggml-src   # or any checkout
 *   cmake -S /tmp/ggml-src -B /tmp/ggml-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
 *         -DBUILD_SHARED_LIBS=ON && cmake --build /tmp/ggml-build --target ggml-base
 *   meson setup build/test && ninja -C build/test                # libferry_internal.a
 *   tools/alloc_compare/build /tmp/ggml-src /tmp/ggml-build build/test   # -> build/alloc_compare
 *   build/alloc_compare [-n GRAPHS] [-s FIRST_SEED] [-r REPS] [-v] [-d SEED]
 *
 * -v prints one line per graph: seed, nodes, leafs, ferry, ggml, ferry with inputs kept
 * (bytes), ferry/ggml, overlaps in ferry's and in ggml's placement, and each library's
 * fastest reserve (ns). -d SEED prints where
 * each library put each tensor of that seed's graph, and its lifetime.
 * Exit status: 0, or 1 when either library placed two live tensors over each other.
 */
#include "alloc-check.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <math.h>
#include <time.h>

static bool dump; /* -d: print each placement */

static void dump_placements(const char * who, const lt_tensor * t, int n) {
    for (int i = 0; dump && i < n; i++) {
        if (t[i].root == i && t[i].memory) {
            printf("%s\t%s\tsteps %d..%d\t[%zu, %zu)\t<-", who, t[i].name, t[i].start, t[i].end, t[i].offset,
                   t[i].offset + t[i].size);
            for (int j = 0; j < LT_MAX_SRC; j++) {
                if (t[i].src[j] >= 0) {
                    printf(" %s%s", t[t[i].src[j]].name, t[i].src_same[j] ? "" : "*");
                }
            }
            printf("\n");
        }
    }
}

typedef struct {
    size_t ferry, ferry_keep, ggml;
    int ferry_overlaps, ggml_overlaps, n_nodes, n_leafs;
} result;

/* ---------------------------------------------------------------- ferry */

static size_t ferry_size(const rg_graph * rg, ferry_backend * be, bool keep, int * overlaps) {
    ferry_context * ctx = NULL;
    ferry_graph * graph = NULL;
    ferry_gallocr * ga = NULL;
    ferry_tensor * t[RG_MAX];
    size_t size = 0;
    if (ferry_context_new(&ctx) != FERRY_OK || ferry_graph_new(&graph) != FERRY_OK ||
        rg_build_ferry(rg, ctx, graph, t) != FERRY_OK ||
        ferry_gallocr_new(ferry_backend_default_buffer_type(be), &ga) != FERRY_OK ||
        ferry_gallocr_set_keep_inputs(ga, keep) != FERRY_OK || ferry_gallocr_alloc_graph(ga, graph) != FERRY_OK) {
        fprintf(stderr, "ferry: %s\n", ferry_last_error());
        exit(2);
    }
    size = ferry_gallocr_buffer_size(ga, 0);
    lt_tensor * lt = lt_from_ferry(graph);
    *overlaps = lt_check_overlaps(lt, ferry_graph_n_slots(graph), ferry_graph_n_nodes(graph), keep, stderr);
    if (!keep) {
        dump_placements("ferry", lt, ferry_graph_n_slots(graph));
    }
    free(lt);
    ferry_gallocr_free(ga);
    ferry_graph_free(graph);
    ferry_context_free(ctx);
    return size;
}

/* ---------------------------------------------------------------- ggml */

static int index_of(struct ggml_tensor * const * t, int n, const struct ggml_tensor * x) {
    for (int i = 0; i < n; i++) {
        if (t[i] == x) {
            return i;
        }
    }
    return -1;
}

static bool ggml_same_layout(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    if (a->type != b->type) {
        return false;
    }
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) {
            return false;
        }
    }
    return true;
}

static struct ggml_tensor * ggml_build(struct ggml_context * ctx, const rg_tensor * r, struct ggml_tensor * a,
                                       struct ggml_tensor * b) {
    switch (r->op) {
        case RG_LEAF: return ggml_new_tensor(ctx, GGML_TYPE_F32, 4, r->ne);
        case RG_ADD: return ggml_add(ctx, a, b);
        case RG_MUL: return ggml_mul(ctx, a, b);
        case RG_SCALE: return ggml_scale(ctx, a, r->s);
        case RG_DUP: return ggml_dup(ctx, a);
        case RG_CONCAT: return ggml_concat(ctx, a, b, r->arg[0]);
        case RG_PAD: return ggml_pad(ctx, a, r->arg[0], r->arg[1], r->arg[2], r->arg[3]);
        case RG_MEAN: return ggml_mean(ctx, a);
        case RG_VIEW:
            return r->n_dims == 1 ? ggml_view_1d(ctx, a, r->ne[0], r->offset)
                                  : ggml_view_2d(ctx, a, r->ne[0], r->ne[1], r->nb[1], r->offset);
        case RG_PERMUTE: return ggml_permute(ctx, a, r->arg[0], r->arg[1], r->arg[2], r->arg[3]);
        case RG_TRANSPOSE: return ggml_transpose(ctx, a);
        case RG_RESHAPE: return ggml_reshape_4d(ctx, a, r->ne[0], r->ne[1], r->ne[2], r->ne[3]);
    }
    return NULL;
}

/* The recipe's graph in ggml, in ctx (which the caller frees); t: its tensors by recipe index. */
static struct ggml_cgraph * ggml_build_graph(const rg_graph * rg, struct ggml_context ** ctx_out,
                                             struct ggml_tensor ** t) {
    struct ggml_init_params params = {
        .mem_size = ggml_tensor_overhead() * (RG_MAX + 8) + ggml_graph_overhead(),
        .mem_buffer = NULL,
        .no_alloc = true,
    };
    struct ggml_context * ctx = ggml_init(params);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    for (int i = 0; i < rg->n; i++) {
        const rg_tensor * r = &rg->t[i];
        t[i] = ggml_build(ctx, r, r->a >= 0 ? t[r->a] : NULL, r->b >= 0 ? t[r->b] : NULL);
        ggml_format_name(t[i], "%s%d", rg_names[r->op], i);
        for (int d = 0; d < 4; d++) {
            if (t[i]->ne[d] != r->ne[d] || t[i]->nb[d] != r->nb[d]) {
                fprintf(stderr, "ggml: '%s' ne[%d] %lld nb[%d] %zu, the recipe %lld, %zu\n", t[i]->name, d,
                        (long long) t[i]->ne[d], d, t[i]->nb[d], (long long) r->ne[d], r->nb[d]);
                exit(2);
            }
        }
        if (r->output) {
            ggml_set_output(t[i]);
        }
        ggml_build_forward_expand(gf, t[i]);
    }
    *ctx_out = ctx;
    return gf;
}

/* ggml's buffer for the graph; node_order[i]: the recipe index of ggml's node i (to
 * compare with ferry's order). */
static size_t ggml_size(const rg_graph * rg, int * overlaps, int * node_order, int * n_nodes) {
    struct ggml_context * ctx;
    struct ggml_tensor * t[RG_MAX];
    struct ggml_cgraph * gf = ggml_build_graph(rg, &ctx, t);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_alloc_graph(galloc, gf)) {
        fprintf(stderr, "ggml: ggml_gallocr_alloc_graph failed\n");
        exit(2);
    }
    const size_t size = ggml_gallocr_get_buffer_size(galloc, 0);
    *n_nodes = ggml_graph_n_nodes(gf);
    lt_tensor * lt = calloc((size_t) rg->n, sizeof(*lt));
    for (int i = 0; i < rg->n; i++) {
        lt[i].node = -1;
    }
    for (int k = 0; k < *n_nodes; k++) {
        node_order[k] = index_of(t, rg->n, ggml_graph_node(gf, k));
        lt[node_order[k]].node = k;
    }
    for (int i = 0; i < rg->n; i++) {
        const struct ggml_tensor * x = t[i];
        lt_tensor * e = &lt[i];
        e->name = x->name;
        e->root = x->view_src ? index_of(t, rg->n, x->view_src) : i;
        e->written = e->read_at = -1;
        e->input = x->op == GGML_OP_NONE || (x->flags & GGML_TENSOR_FLAG_INPUT);
        e->output = (x->flags & GGML_TENSOR_FLAG_OUTPUT) != 0;
        e->inplace_op = x->op == GGML_OP_ADD || x->op == GGML_OP_MUL || x->op == GGML_OP_SCALE;
        for (int j = 0; j < LT_MAX_SRC; j++) {
            const struct ggml_tensor * s = j < GGML_MAX_SRC ? x->src[j] : NULL;
            e->src[j] = s ? index_of(t, rg->n, s) : -1;
            e->src_same[j] = s && ggml_same_layout(s, x) && (!s->view_src || s->view_offs == 0);
        }
        if (!x->view_src && x->buffer) {
            e->memory = x->buffer;
            e->offset = (size_t) ((uintptr_t) x->data - (uintptr_t) ggml_backend_buffer_get_base(x->buffer));
            e->size = ggml_nbytes(x);
        }
    }
    *overlaps = lt_check_overlaps(lt, rg->n, *n_nodes, false, stderr);
    dump_placements("ggml", lt, rg->n);
    free(lt);
    ggml_gallocr_free(galloc);
    ggml_free(ctx);
    return size;
}

/* ---------------------------------------------------------------- reserve time */

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}

/* The fastest of reps reserves of the graph by each library, each on an allocator of
 * its own that has reserved it once already (the steady state of a caller that
 * reserves every step; the first call's buffers are not timed). The libraries take
 * turns, and which goes first alternates, so a slow moment of the machine falls on
 * both. */
static void reserve_times(const rg_graph * rg, ferry_backend * be, int reps, double * ferry_ns, double * ggml_ns) {
    ferry_context * fctx = NULL;
    ferry_graph * fgraph = NULL;
    ferry_gallocr * fa = NULL;
    ferry_tensor * ft[RG_MAX];
    if (ferry_context_new(&fctx) != FERRY_OK || ferry_graph_new(&fgraph) != FERRY_OK ||
        rg_build_ferry(rg, fctx, fgraph, ft) != FERRY_OK ||
        ferry_gallocr_new(ferry_backend_default_buffer_type(be), &fa) != FERRY_OK ||
        ferry_gallocr_reserve(fa, fgraph, NULL, NULL) != FERRY_OK) {
        fprintf(stderr, "ferry: %s\n", ferry_last_error());
        exit(2);
    }
    struct ggml_context * gctx;
    struct ggml_tensor * gt[RG_MAX];
    struct ggml_cgraph * gf = ggml_build_graph(rg, &gctx, gt);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    if (!ggml_gallocr_reserve(ga, gf)) {
        fprintf(stderr, "ggml: ggml_gallocr_reserve failed\n");
        exit(2);
    }
    *ferry_ns = *ggml_ns = INFINITY;
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            const bool ferry_turn = (k == 0) == (r % 2 == 0);
            const double t0 = now_ns();
            const bool ok = ferry_turn ? ferry_gallocr_reserve(fa, fgraph, NULL, NULL) == FERRY_OK
                                       : ggml_gallocr_reserve(ga, gf);
            const double dt = now_ns() - t0;
            if (!ok) {
                fprintf(stderr, "%s: reserve failed: %s\n", ferry_turn ? "ferry" : "ggml",
                        ferry_turn ? ferry_last_error() : "");
                exit(2);
            }
            double * best = ferry_turn ? ferry_ns : ggml_ns;
            *best = dt < *best ? dt : *best;
        }
    }
    ggml_gallocr_free(ga);
    ggml_free(gctx);
    ferry_gallocr_free(fa);
    ferry_graph_free(fgraph);
    ferry_context_free(fctx);
}

/* ---------------------------------------------------------------- the run */

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    int n_graphs = 2000;
    uint64_t first = 1;
    int reps = 9;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            n_graphs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            first = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-v")) {
            verbose = true;
        } else if (!strcmp(argv[i], "-d") && i + 1 < argc) {
            dump = verbose = true;
            first = strtoull(argv[++i], NULL, 10);
            n_graphs = 1;
        } else {
            fprintf(stderr, "usage: %s [-n GRAPHS] [-s FIRST_SEED] [-r REPS] [-v] [-d SEED]\n", argv[0]);
            return 2;
        }
    }
    if (n_graphs < 1 || reps < 1) {
        fprintf(stderr, "alloc_compare: -n and -r must be at least 1\n");
        return 2;
    }
    ggml_log_set(quiet, NULL);
    ferry_dummy_params p = ferry_dummy_default_params();
    p.alignment = 32;
    p.max_buffer_size = 0;
    p.real_memory = false;
    ferry_backend * be;
    if (ferry_dummy_backend_new(&p, &be) != FERRY_OK) {
        fprintf(stderr, "ferry: %s\n", ferry_last_error());
        return 2;
    }
    double * ratio = malloc((size_t) n_graphs * sizeof(*ratio));
    static rg_graph rg;
    int same = 0, larger = 0, smaller = 0, ferry_overlaps = 0, ggml_overlaps = 0, order_differs = 0;
    double log_sum = 0, log_sum_keep = 0, ferry_time = 0, ggml_time = 0;
    if (verbose) {
        printf("seed\tnodes\tleafs\tferry\tggml\tferry_keep\tratio\tferry_overlaps\tggml_overlaps\tferry_ns\tggml_ns\n");
    }
    for (int g = 0; g < n_graphs; g++) {
        const uint64_t seed = first + (uint64_t) g;
        rg_generate(&rg, seed);
        result r = {0};
        int order[RG_MAX];
        r.ferry = ferry_size(&rg, be, false, &r.ferry_overlaps);
        int keep_overlaps;
        r.ferry_keep = ferry_size(&rg, be, true, &keep_overlaps);
        r.ferry_overlaps += keep_overlaps;
        r.ggml = ggml_size(&rg, &r.ggml_overlaps, order, &r.n_nodes);
        r.n_leafs = rg.n - rg.n_nodes;
        double ferry_ns, ggml_ns;
        reserve_times(&rg, be, reps, &ferry_ns, &ggml_ns);
        ferry_time += ferry_ns;
        ggml_time += ggml_ns;
        /* ferry's node order is the recipe's order less the leafs */
        for (int i = 0, k = 0; i < rg.n; i++) {
            if (rg.t[i].op != RG_LEAF && (k >= r.n_nodes || order[k++] != i)) {
                order_differs++;
                break;
            }
        }
        ratio[g] = (double) r.ferry / (double) r.ggml;
        log_sum += log(ratio[g]);
        log_sum_keep += log((double) r.ferry_keep / (double) r.ggml);
        same += r.ferry == r.ggml;
        larger += r.ferry > r.ggml;
        smaller += r.ferry < r.ggml;
        ferry_overlaps += r.ferry_overlaps;
        ggml_overlaps += r.ggml_overlaps;
        if (verbose) {
            printf("%llu\t%d\t%d\t%zu\t%zu\t%zu\t%.4f\t%d\t%d\t%.0f\t%.0f\n", (unsigned long long) seed, r.n_nodes,
                   r.n_leafs, r.ferry, r.ggml, r.ferry_keep, ratio[g], r.ferry_overlaps, r.ggml_overlaps, ferry_ns,
                   ggml_ns);
        }
    }
    qsort(ratio, (size_t) n_graphs, sizeof(*ratio), cmp_double);
    const int p90 = (int) ceil(0.9 * n_graphs) - 1;
    printf("graphs %d (seeds %llu..%llu), alignment 32\n", n_graphs, (unsigned long long) first,
           (unsigned long long) (first + (uint64_t) n_graphs - 1));
    printf("ferry vs ggml: same %d, larger %d, smaller %d\n", same, larger, smaller);
    printf("ferry/ggml: min %.4f, median %.4f, p90 %.4f, max %.4f, geometric mean %.4f\n", ratio[0],
           n_graphs % 2 ? ratio[n_graphs / 2] : 0.5 * (ratio[n_graphs / 2 - 1] + ratio[n_graphs / 2]), ratio[p90],
           ratio[n_graphs - 1], exp(log_sum / n_graphs));
    printf("ferry with inputs kept / ggml: geometric mean %.4f\n", exp(log_sum_keep / n_graphs));
    printf("overlapping live tensors: ferry %d, ggml %d\n", ferry_overlaps, ggml_overlaps);
    printf("graphs whose node order differs between the libraries: %d\n", order_differs);
    printf("reserve time (each graph's fastest of %d, summed): ferry %.3f ms, ggml %.3f ms, ferry/ggml %.3f\n", reps,
           ferry_time / 1e6, ggml_time / 1e6, ferry_time / ggml_time);
    free(ratio);
    ferry_backend_free(be);
    return ferry_overlaps || ggml_overlaps ? 1 : 0;
}
