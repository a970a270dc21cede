/*
 * Random f32 graphs of the ops ferry shares with ggml (add, mul, scale, dup, concat,
 * pad, mean, view, permute, transpose, reshape), as a recipe that either library can
 * build in the same order: test_alloc.c builds them in ferry, tools/alloc_compare in
 * ferry and ggml. The recipe computes every result's ne and nb as both libraries do,
 * and only asks for what both accept (reshape and view of contiguous tensors, scale of
 * rows that are contiguous, as ggml asserts).
 *
 * A graph is the recipe's tensors in order: leafs (some in the middle), then each step
 * one node over earlier tensors, mostly recent ones. Building every tensor in recipe
 * order gives both libraries the same node and leaf order.
 */
#ifndef FERRY_RANDOM_GRAPH_H
#define FERRY_RANDOM_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { RG_MAX = 128 };

typedef enum {
    RG_LEAF,
    RG_ADD,
    RG_MUL,
    RG_SCALE,
    RG_DUP,
    RG_CONCAT,
    RG_PAD,
    RG_MEAN,
    RG_VIEW,
    RG_PERMUTE,
    RG_TRANSPOSE,
    RG_RESHAPE,
} rg_op;

typedef struct {
    rg_op op;
    int a, b;       /* operands: indices of earlier tensors, -1 none */
    int64_t ne[4];  /* the result, as both libraries compute it */
    size_t nb[4];
    int arg[4];     /* pad: amounts; concat: dim in arg[0]; permute: axes */
    int n_dims;     /* view, reshape: dimensions given */
    size_t offset;  /* view: bytes from a's first */
    float s;        /* scale */
    bool output;
} rg_tensor;

typedef struct {
    rg_tensor t[RG_MAX];
    int n, n_nodes;
    uint64_t rng;
} rg_graph;

static uint64_t rg_next(rg_graph * g) { /* splitmix64 */
    uint64_t z = (g->rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int64_t rg_below(rg_graph * g, int64_t n) { return n > 0 ? (int64_t) (rg_next(g) % (uint64_t) n) : 0; }

static int64_t rg_nelements(const rg_tensor * t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

static void rg_contiguous_strides(rg_tensor * t) {
    t->nb[0] = sizeof(float);
    for (int i = 1; i < 4; i++) {
        t->nb[i] = t->nb[i - 1] * (size_t) t->ne[i - 1];
    }
}

/* Contiguous to both libraries (ggml's test and ferry's agree once nb[0] is a float's). */
static bool rg_is_contiguous(const rg_tensor * t) {
    size_t expect = sizeof(float);
    if (t->nb[0] != expect) {
        return false;
    }
    for (int i = 0; i < 4; i++) {
        if (i > 0 && t->ne[i] != 1 && t->nb[i] != expect) {
            return false;
        }
        expect *= (size_t) t->ne[i];
    }
    return true;
}

/* ggml_scale asserts rows of contiguous elements, planes and blocks of contiguous rows. */
static bool rg_scale_ok(const rg_tensor * t) {
    return t->nb[0] == sizeof(float) && t->nb[2] == t->nb[1] * (size_t) t->ne[1] &&
           t->nb[3] == t->nb[2] * (size_t) t->ne[2];
}

static void rg_random_shape(rg_graph * g, int64_t ne[4]) {
    static const int64_t ne0[] = {4, 8, 16, 32, 64, 128, 256};
    ne[0] = ne0[rg_below(g, 7)];
    ne[1] = 1 + rg_below(g, 16);
    ne[2] = 1 + rg_below(g, 4);
    ne[3] = 1 + rg_below(g, 2);
}

/* An operand: mostly one of the last six tensors. */
static int rg_pick(rg_graph * g) {
    if (g->n > 6 && rg_below(g, 10) < 7) {
        return g->n - 1 - (int) rg_below(g, 6);
    }
    return (int) rg_below(g, g->n);
}

static rg_tensor * rg_push(rg_graph * g, rg_op op, int a, int b) {
    rg_tensor * t = &g->t[g->n++];
    memset(t, 0, sizeof(*t));
    t->op = op;
    t->a = a;
    t->b = b;
    if (op != RG_LEAF) {
        g->n_nodes++;
    }
    return t;
}

static void rg_leaf(rg_graph * g, const int64_t base[4]) {
    rg_tensor * t = rg_push(g, RG_LEAF, -1, -1);
    const int64_t kind = rg_below(g, 10);
    memcpy(t->ne, base, sizeof(t->ne));
    if (kind >= 6 && kind < 8) { /* repeats over the base shape */
        for (int i = 0; i < 4; i++) {
            t->ne[i] = rg_below(g, 2) ? 1 : base[i];
        }
    } else if (kind >= 8) {
        rg_random_shape(g, t->ne);
    }
    rg_contiguous_strides(t);
}

/* A random earlier tensor that b-repeats over a (add, mul): each ne divides a's. */
static int rg_repeat_partner(rg_graph * g, int a) {
    int found[RG_MAX], n = 0;
    for (int i = 0; i < g->n; i++) {
        bool ok = true;
        for (int d = 0; d < 4 && ok; d++) {
            ok = g->t[a].ne[d] % g->t[i].ne[d] == 0;
        }
        if (ok) {
            found[n++] = i;
        }
    }
    return found[rg_below(g, n)]; /* a itself is always one */
}

/* A random earlier tensor of a's ne but in dim (concat). */
static int rg_concat_partner(rg_graph * g, int a, int dim) {
    int found[RG_MAX], n = 0;
    for (int i = 0; i < g->n; i++) {
        bool ok = true;
        for (int d = 0; d < 4 && ok; d++) {
            ok = d == dim || g->t[a].ne[d] == g->t[i].ne[d];
        }
        if (ok) {
            found[n++] = i;
        }
    }
    return found[rg_below(g, n)];
}

static void rg_node(rg_graph * g) {
    /* weights: add mul scale dup concat pad mean view permute transpose reshape */
    static const int weight[] = {18, 14, 12, 6, 8, 8, 4, 8, 6, 4, 8};
    int64_t r = rg_below(g, 96);
    int op = 0;
    while (r >= weight[op]) {
        r -= weight[op++];
    }
    const int a = rg_pick(g);
    const rg_tensor * ta = &g->t[a];
    rg_op kind = (rg_op) (RG_ADD + op);
    if ((kind == RG_SCALE && !rg_scale_ok(ta)) ||
        ((kind == RG_VIEW || kind == RG_RESHAPE) && !rg_is_contiguous(ta))) {
        kind = RG_DUP;
    }
    rg_tensor * t;
    switch (kind) {
        case RG_ADD:
        case RG_MUL:
            t = rg_push(g, kind, a, rg_repeat_partner(g, a));
            memcpy(t->ne, ta->ne, sizeof(t->ne));
            rg_contiguous_strides(t);
            break;
        case RG_SCALE:
        case RG_DUP:
            t = rg_push(g, kind, a, -1);
            t->s = 0.5f + (float) rg_below(g, 4);
            memcpy(t->ne, ta->ne, sizeof(t->ne));
            rg_contiguous_strides(t);
            break;
        case RG_CONCAT: {
            const int dim = (int) rg_below(g, 4);
            t = rg_push(g, kind, a, rg_concat_partner(g, a, dim));
            t->arg[0] = dim;
            memcpy(t->ne, ta->ne, sizeof(t->ne));
            t->ne[dim] += g->t[t->b].ne[dim];
            rg_contiguous_strides(t);
            break;
        }
        case RG_PAD:
            t = rg_push(g, kind, a, -1);
            for (int d = 0; d < 4; d++) {
                t->arg[d] = (int) rg_below(g, 3);
                t->ne[d] = ta->ne[d] + t->arg[d];
            }
            rg_contiguous_strides(t);
            break;
        case RG_MEAN:
            t = rg_push(g, kind, a, -1);
            memcpy(t->ne, ta->ne, sizeof(t->ne));
            t->ne[0] = 1;
            rg_contiguous_strides(t);
            break;
        case RG_VIEW: {
            t = rg_push(g, kind, a, -1);
            const int64_t n = rg_nelements(ta), row = ta->ne[0], rows = n / row;
            if (rows > 1 && rg_below(g, 2)) { /* some columns of some rows */
                const int64_t cols = 1 + rg_below(g, row), nrows = 1 + rg_below(g, rows);
                const int64_t col0 = rg_below(g, row - cols + 1), row0 = rg_below(g, rows - nrows + 1);
                t->n_dims = 2;
                t->ne[0] = cols;
                t->ne[1] = nrows;
                t->ne[2] = t->ne[3] = 1;
                t->nb[0] = sizeof(float);
                t->nb[1] = (size_t) row * sizeof(float);
                t->nb[2] = t->nb[3] = t->nb[1] * (size_t) nrows;
                t->offset = (size_t) (row0 * row + col0) * sizeof(float);
            } else { /* a run of elements */
                const int64_t count = 1 + rg_below(g, n);
                t->n_dims = 1;
                t->ne[0] = count;
                t->ne[1] = t->ne[2] = t->ne[3] = 1;
                rg_contiguous_strides(t);
                t->offset = (size_t) rg_below(g, n - count + 1) * sizeof(float);
            }
            break;
        }
        case RG_PERMUTE:
        case RG_TRANSPOSE: {
            t = rg_push(g, kind, a, -1);
            int axis[4] = {1, 0, 2, 3};
            if (kind == RG_PERMUTE) {
                for (int i = 0; i < 4; i++) {
                    axis[i] = i;
                }
                for (int i = 3; i > 0; i--) { /* a shuffle */
                    const int j = (int) rg_below(g, i + 1), x = axis[i];
                    axis[i] = axis[j];
                    axis[j] = x;
                }
            }
            for (int i = 0; i < 4; i++) {
                t->arg[i] = axis[i];
                t->ne[axis[i]] = ta->ne[i];
                t->nb[axis[i]] = ta->nb[i];
            }
            break;
        }
        case RG_RESHAPE: {
            t = rg_push(g, kind, a, -1);
            const int64_t n = rg_nelements(ta);
            t->ne[1] = t->ne[2] = t->ne[3] = 1;
            switch (rg_below(g, 3)) {
                case 0: /* flat */
                    t->n_dims = 1;
                    t->ne[0] = n;
                    break;
                case 1: /* rows of ne[0] */
                    t->n_dims = 2;
                    t->ne[0] = ta->ne[0];
                    t->ne[1] = n / ta->ne[0];
                    break;
                default: /* rows halved where they can be */
                    t->n_dims = 3;
                    t->ne[0] = ta->ne[0] % 2 == 0 ? ta->ne[0] / 2 : ta->ne[0];
                    t->ne[1] = ta->ne[0] / t->ne[0];
                    t->ne[2] = n / ta->ne[0];
                    break;
            }
            rg_contiguous_strides(t);
            break;
        }
        default:
            return;
    }
    t->output = rg_below(g, 20) == 0 && kind != RG_VIEW && kind != RG_PERMUTE && kind != RG_TRANSPOSE &&
                kind != RG_RESHAPE;
}

/* A graph of 10 to 60 nodes from seed. */
static void rg_generate(rg_graph * g, uint64_t seed) {
    memset(g, 0, sizeof(*g));
    g->rng = seed;
    const int n_nodes = 10 + (int) rg_below(g, 51);
    int64_t base[4];
    rg_random_shape(g, base);
    const int first_leafs = 1 + (int) rg_below(g, 4);
    for (int i = 0; i < first_leafs; i++) {
        rg_leaf(g, base);
    }
    while (g->n_nodes < n_nodes) {
        if (rg_below(g, 10) == 0) {
            rg_leaf(g, base);
        }
        rg_node(g);
    }
    g->t[g->n - 1].output = true; /* the last is a compute node or a view: either way, the result */
}

#endif
