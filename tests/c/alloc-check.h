/*
 * The rule a graph allocator must keep, checked on where it put a graph's tensors:
 * no two tensors whose lifetimes intersect share a byte. Written once, for any
 * allocator: a caller describes each tensor of the graph (lt_tensor), in ferry's terms
 * or ggml's (tools/alloc_compare), and lt_check_overlaps derives the lifetimes from the
 * graph alone, not from how the allocator works:
 *
 *   - an input (a leaf, or flagged input) lives from before the first node (-1), or
 *     from the node it is written before (a scheduler's copy); a node from its own position;
 *   - a tensor lives until the last node that reads it, directly or through a view
 *     (a view node reads its source), or until a copy made of it;
 *   - it lives to the end (n_nodes) when it is an output, its memory is an output
 *     view's, nobody reads it or a view of it that nobody reads (a result), or it is an
 *     input and inputs are kept;
 *   - one exception: a node whose op works in place may start in the bytes of a source
 *     of its layout (read from that source's first byte) at the node where that source dies.
 *
 * Also here: ferry's side of that description, and the ferry build of random-graph.h's
 * recipes (test_alloc.c and tools/alloc_compare use both).
 */
#ifndef FERRY_ALLOC_CHECK_H
#define FERRY_ALLOC_CHECK_H

#include "ferry.h"
#include "graph-impl.h"
#include "random-graph.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { LT_MAX_SRC = 4 };

typedef struct {
    const char * name;
    int root;                   /* the tensor whose memory it is: itself, or a view's source */
    int node;                   /* its node index; -1 for a leaf */
    int written;                /* an input written before this node (a copy); -1 before the graph */
    int read_at;                /* also read just before this node, outside the graph (a copy's source); -1 */
    bool input, output;
    bool inplace_op;            /* its op may write over a source of its layout */
    int src[LT_MAX_SRC];        /* its sources, -1 none */
    bool src_same[LT_MAX_SRC];  /* source j has its layout and starts at its root's first byte */
    const void * memory;        /* which memory (a buffer); NULL: none to check */
    size_t offset, size;        /* bytes in it (roots only) */
    int start, end;             /* filled in by lt_check_overlaps */
} lt_tensor;

/* Lifetimes of the n tensors of a graph of n_nodes nodes (see above). */
static void lt_lifetimes(lt_tensor * t, int n, int n_nodes, bool keep_inputs) {
    int * readers = calloc((size_t) n + 1, sizeof(*readers));
    for (int i = 0; i < n; i++) {
        t[i].start = t[i].input ? t[i].written : t[i].node;
        t[i].end = t[i].read_at > t[i].start ? t[i].read_at : t[i].start;
        for (int j = 0; j < LT_MAX_SRC && readers; j++) {
            if (t[i].src[j] >= 0) {
                readers[t[i].src[j]]++;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < LT_MAX_SRC; j++) {
            const int s = t[i].src[j];
            if (s >= 0 && t[i].node > t[t[s].root].end) {
                t[t[s].root].end = t[i].node;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const bool result = readers && readers[i] == 0;
        if (t[i].output || result || (keep_inputs && t[i].input && t[i].root == i)) {
            t[t[i].root].end = n_nodes;
        }
    }
    free(readers);
}

/* Does b start in a's bytes by working in place on it as a dies? */
static bool lt_in_place(const lt_tensor * t, int a, int b) {
    if (!t[b].inplace_op || t[b].start != t[a].end || t[b].offset != t[a].offset) {
        return false;
    }
    for (int j = 0; j < LT_MAX_SRC; j++) {
        if (t[b].src[j] >= 0 && t[t[b].src[j]].root == a && t[b].src_same[j]) {
            return true;
        }
    }
    return false;
}

/* The number of pairs of live tensors sharing bytes; the first few go to log (if not NULL). */
static int lt_check_overlaps(lt_tensor * t, int n, int n_nodes, bool keep_inputs, FILE * log) {
    lt_lifetimes(t, n, n_nodes, keep_inputs);
    int found = 0;
    for (int a = 0; a < n; a++) {
        for (int b = a + 1; b < n; b++) {
            const lt_tensor *x = &t[a], *y = &t[b];
            if (x->root != a || y->root != b || !x->memory || x->memory != y->memory || !x->size || !y->size) {
                continue;
            }
            const bool bytes = x->offset < y->offset + y->size && y->offset < x->offset + x->size;
            const bool time = x->start <= y->end && y->start <= x->end;
            if (bytes && time && !lt_in_place(t, a, b) && !lt_in_place(t, b, a)) {
                if (log && found < 5) {
                    fprintf(log, "'%s' [%zu, %zu) nodes %d..%d overlaps '%s' [%zu, %zu) nodes %d..%d\n", x->name,
                            x->offset, x->offset + x->size, x->start, x->end, y->name, y->offset, y->offset + y->size,
                            y->start, y->end);
                }
                found++;
            }
        }
    }
    return found;
}

/* ---------------------------------------------------------------- ferry's side */

/* ferry's tensors of graph, by slot, after alloc_graph. */
static lt_tensor * lt_from_ferry(ferry_graph * graph) {
    const int n = ferry_graph_n_slots(graph);
    lt_tensor * t = calloc((size_t) n + 1, sizeof(*t));
    if (!t) {
        return NULL;
    }
    const int n_leafs = ferry_graph_n_leafs(graph);
    for (int i = 0; i < n_leafs + ferry_graph_n_nodes(graph); i++) {
        const bool leaf = i < n_leafs;
        const ferry_tensor * x = leaf ? ferry_graph_leaf(graph, i) : ferry_graph_node(graph, i - n_leafs);
        lt_tensor * e = &t[ferry_graph_slot(graph, x)];
        const ferry_tensor * root = x->view_src ? x->view_src : x;
        e->name = x->name;
        e->root = ferry_graph_slot(graph, root);
        e->node = leaf ? -1 : i - n_leafs;
        e->written = -1;
        e->read_at = -1;
        e->input = leaf || (x->flags & FERRY_TENSOR_FLAG_INPUT);
        e->output = (x->flags & FERRY_TENSOR_FLAG_OUTPUT) != 0;
        e->inplace_op = ferry_op_can_inplace(x->op);
        for (int j = 0; j < LT_MAX_SRC; j++) {
            const ferry_tensor * s = j < FERRY_MAX_SRC ? x->src[j] : NULL;
            e->src[j] = s ? ferry_graph_slot(graph, s) : -1;
            e->src_same[j] = s && ferry_tensor_same_layout(s, x) && (!s->view_src || s->view_offs == 0);
        }
        if (!x->view_src && x->buffer) {
            e->memory = x->buffer;
            e->offset = (size_t) ((uintptr_t) x->data - (uintptr_t) ferry_buffer_base(x->buffer));
            e->size = ferry_tensor_nbytes(x);
        }
    }
    return t;
}

/* ---------------------------------------------------------------- ferry build of a recipe */

static const char * const rg_names[] = {"leaf", "add", "mul", "scale", "dup", "concat",
                                        "pad", "mean", "view", "permute", "transpose", "reshape"};

/* Build recipe g in ctx and graph (every tensor in recipe order); out[i]: tensor i.
 * FERRY_ERR_LAYOUT if ferry's result differs from the recipe's ne and nb. */
static ferry_status rg_build_ferry(const rg_graph * g, ferry_context * ctx, ferry_graph * graph, ferry_tensor ** out) {
    for (int i = 0; i < g->n; i++) {
        const rg_tensor * r = &g->t[i];
        ferry_tensor *a = r->a >= 0 ? out[r->a] : NULL, *b = r->b >= 0 ? out[r->b] : NULL, *t = NULL;
        switch (r->op) {
            case RG_LEAF: FERRY_TRY(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, r->ne, &t)); break;
            case RG_ADD: FERRY_TRY(ferry_add(ctx, a, b, &t)); break;
            case RG_MUL: FERRY_TRY(ferry_mul(ctx, a, b, &t)); break;
            case RG_SCALE: FERRY_TRY(ferry_scale(ctx, a, r->s, &t)); break;
            case RG_DUP: FERRY_TRY(ferry_dup(ctx, a, &t)); break;
            case RG_CONCAT: FERRY_TRY(ferry_concat(ctx, a, b, r->arg[0], &t)); break;
            case RG_PAD: FERRY_TRY(ferry_pad(ctx, a, r->arg[0], r->arg[1], r->arg[2], r->arg[3], &t)); break;
            case RG_MEAN: FERRY_TRY(ferry_mean(ctx, a, &t)); break;
            case RG_VIEW: FERRY_TRY(ferry_tensor_view(ctx, a, r->n_dims, r->ne, r->nb, r->offset, &t)); break;
            case RG_PERMUTE:
                FERRY_TRY(ferry_tensor_permute(ctx, a, r->arg[0], r->arg[1], r->arg[2], r->arg[3], &t));
                break;
            case RG_TRANSPOSE: FERRY_TRY(ferry_tensor_transpose(ctx, a, &t)); break;
            case RG_RESHAPE: FERRY_TRY(ferry_tensor_reshape(ctx, a, r->n_dims, r->ne, &t)); break;
        }
        char name[FERRY_MAX_NAME];
        snprintf(name, sizeof(name), "%s%d", rg_names[r->op], i);
        ferry_tensor_set_name(t, name);
        for (int d = 0; d < 4; d++) {
            if (t->ne[d] != r->ne[d] || t->nb[d] != r->nb[d]) {
                return ferry_fail(FERRY_ERR_LAYOUT, "random graph: '%s' has ne[%d] %lld nb[%d] %zu, the recipe %lld, %zu",
                                  name, d, (long long) t->ne[d], d, t->nb[d], (long long) r->ne[d], r->nb[d]);
            }
        }
        if (r->output) {
            ferry_tensor_set_output(t);
        }
        out[i] = t;
        FERRY_TRY(ferry_graph_build(graph, t));
    }
    return FERRY_OK;
}

#endif
