/*
 * The graph allocator: walk a graph in order as it will run, giving each tensor an
 * offset in a chunk of its buffer type while it is live (alloc-blocks.c keeps the
 * offsets), then make buffers of the sizes the walk needed and place the tensors.
 * The walk is deterministic, so alloc_graph simply walks again.
 */
#include "alloc-blocks.h"
#include "alloc-impl.h"
#include "graph-impl.h"

#include <stdlib.h>
#include <string.h>

/* What the walk decided for one tensor of the graph (indexed by graph slot). */
typedef struct {
    int buft;      /* the buffer type it was assigned */
    int chunk;     /* -1: the allocator does not place it (a view, or memory of its own) */
    size_t offset, size;
    int uses;      /* references by nodes still to run, directly or through views */
    int node;      /* a copy's: it is written just before this node; -1 before the graph */
    bool external; /* it has memory the allocator did not give it */
    bool kept;     /* lives to the end: outputs, results nobody reads, inputs when kept */
    bool handed;   /* its memory went to a node that works in place */
} tensor_plan;

/* A node as the walk reads it, found once per call: no lookups by pointer while walking. */
enum {
    SRC_INPLACE = 1, /* the node may work in place over this source (its op and layout allow it) */
    SRC_VIEW = 2,    /* the source is a view of the memory it names */
};
typedef struct {
    int slot;                        /* the node's */
    int src[FERRY_MAX_SRC];          /* each source's memory: its root's slot; -1 none */
    unsigned char how[FERRY_MAX_SRC]; /* SRC_* */
    bool view;                       /* the node is a view: it places nothing */
    bool inplace;                    /* some source has SRC_INPLACE */
} node_index;

/* A copy as the walk reads it, in the order the walk meets them (by node, then given). */
typedef struct {
    int node, k;   /* written before node; the caller's index */
    int copy, src; /* slots: the copy's, its source's memory (-1: nothing to keep) */
} staged_copy;

/* A growable array of the scratch below. */
typedef struct {
    void * items;
    size_t cap;
} scratch;

struct ferry_gallocr {
    bool keep_inputs; /* leafs and inputs live to the end instead of to their last use */
    int n_bufts;
    ferry_buffer_type ** bufts;
    ferry_buffer ** buffers; /* n_bufts x FERRY_GALLOC_MAX_CHUNKS */
    int * n_chunks;
    /* the last assignment given to reserve */
    int * node_ids;
    int * leaf_ids;
    int n_node_ids, n_leaf_ids;
    ferry_gallocr_copy * copies;
    int n_copies;
    /* the last walk kept, for placement queries: plan and plan_tensors by slot */
    scratch plan, plan_tensors;
    int n_plan;
    /* each call's working memory, kept between calls so that a steady state of reserves
     * makes no heap calls: the plan before the walks, each way's plan and blocks (one per
     * buffer type), the tensors by slot, the nodes, the leafs' slots, the copies */
    scratch base, walked[2], tensors, index, leaf_slot, staged;
    ferry_blocks * blocks[2];
};

static tensor_plan * plan_of(const scratch * s) { return s->items; }

static ferry_buffer ** chunk_slot(const ferry_gallocr * g, int buft, int chunk) {
    return &g->buffers[buft * FERRY_GALLOC_MAX_CHUNKS + chunk];
}

/* Room for n items of item_size in s. */
static ferry_status scratch_need(scratch * s, size_t n, size_t item_size) {
    void * grown = ferry_grow(s->items, &s->cap, n ? n : 1, item_size);
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
    }
    s->items = grown;
    return FERRY_OK;
}

ferry_status ferry_gallocr_new_n(ferry_buffer_type ** bufts, int n_bufts, ferry_gallocr ** out) {
    FERRY_CHECK_ARG(bufts && out && n_bufts > 0, "gallocr_new: no buffer types");
    for (int i = 0; i < n_bufts; i++) {
        FERRY_CHECK_ARG(bufts[i], "gallocr_new: buffer type %d is NULL", i);
    }
    ferry_gallocr * g = ferry_calloc(1, sizeof(*g));
    if (g) {
        g->n_bufts = n_bufts;
        g->bufts = ferry_calloc((size_t) n_bufts, sizeof(*g->bufts));
        g->buffers = ferry_calloc((size_t) n_bufts * FERRY_GALLOC_MAX_CHUNKS, sizeof(*g->buffers));
        g->n_chunks = ferry_calloc((size_t) n_bufts, sizeof(*g->n_chunks));
        g->blocks[0] = ferry_calloc((size_t) n_bufts, sizeof(*g->blocks[0]));
        g->blocks[1] = ferry_calloc((size_t) n_bufts, sizeof(*g->blocks[1]));
    }
    if (!g || !g->bufts || !g->buffers || !g->n_chunks || !g->blocks[0] || !g->blocks[1]) {
        ferry_gallocr_free(g);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr_new: out of memory");
    }
    memcpy(g->bufts, bufts, (size_t) n_bufts * sizeof(*bufts));
    for (int b = 0; b < n_bufts; b++) {
        ferry_blocks_init(&g->blocks[0][b], 0, 0);
        ferry_blocks_init(&g->blocks[1][b], 0, 0);
    }
    *out = g;
    return FERRY_OK;
}

ferry_status ferry_gallocr_new(ferry_buffer_type * buft, ferry_gallocr ** out) {
    return ferry_gallocr_new_n(&buft, 1, out);
}

void ferry_gallocr_free(ferry_gallocr * g) {
    if (!g) {
        return;
    }
    for (int i = 0; g->buffers && i < g->n_bufts * FERRY_GALLOC_MAX_CHUNKS; i++) {
        ferry_buffer_free(g->buffers[i]);
    }
    for (int w = 0; w < 2; w++) {
        for (int b = 0; g->blocks[w] && b < g->n_bufts; b++) {
            ferry_blocks_release(&g->blocks[w][b]);
        }
        free(g->blocks[w]);
        free(g->walked[w].items);
    }
    free(g->buffers);
    free(g->bufts);
    free(g->n_chunks);
    free(g->node_ids);
    free(g->leaf_ids);
    free(g->copies);
    free(g->plan.items);
    free(g->plan_tensors.items);
    free(g->base.items);
    free(g->tensors.items);
    free(g->index.items);
    free(g->leaf_slot.items);
    free(g->staged.items);
    free(g);
}

/* Memory someone else gave t: a live buffer that is not one of ours. Ours is asked
 * first: it needs no lock, and a tensor the allocator placed before is the usual case. */
bool ferry_gallocr_has_foreign_memory(const ferry_gallocr * g, const ferry_tensor * t) {
    if (!t->buffer) {
        return false;
    }
    for (int b = 0; b < g->n_bufts; b++) {
        for (int c = 0; c < g->n_chunks[b]; c++) {
            if (*chunk_slot(g, b, c) == t->buffer) {
                return false;
            }
        }
    }
    return ferry_buffer_id_is_live(t->buffer_id);
}

/* ---------------------------------------------------------------- the walk */

/* One call's graph, read once (prepare) into g's scratch; then walked one or two ways. */
typedef struct {
    ferry_gallocr * g;
    ferry_graph * graph;
    int n_slots, n_nodes, n_leafs;
    const int * node_ids; /* NULL: all 0 */
    const int * leaf_ids;
    const ferry_gallocr_copy * copies;
    int n_copies;
} call;

/* One way of walking the call's graph. */
typedef struct {
    const call * c;
    tensor_plan * plan;
    ferry_blocks * blocks; /* one per buffer type */
    bool through_views;    /* in place over a source through a view of it too */
    bool diverged;         /* it worked in place through a view: the other way would not have */
} walk;

static const ferry_tensor ** tensors_of(const call * c) { return c->g->tensors.items; }
static const node_index * index_of(const call * c) { return c->g->index.items; }

static ferry_status place(walk * w, int s) {
    tensor_plan * p = &w->plan[s];
    return ferry_blocks_alloc(&w->blocks[p->buft], p->size, tensors_of(w->c)[s]->name, &p->chunk, &p->offset);
}

/* Does node i take the memory of its source j? The node works element by element, so
 * it may write each element where it read it when the source has its layout (a view
 * only from its source's first byte): prepare found those (SRC_INPLACE). The memory
 * must be one the allocator placed, not kept to the end, on the node's buffer type,
 * and nothing may read it after the node (this is its last use, through any view).
 * What the node does not need of it is freed. */
static ferry_status take_source(walk * w, const node_index * x, int j, bool * taken) {
    *taken = false;
    tensor_plan * ps = &w->plan[x->src[j]];
    tensor_plan * pn = &w->plan[x->slot];
    if (ps->chunk < 0 || ps->kept || ps->handed || ps->uses != 1 || ps->buft != pn->buft || pn->size > ps->size) {
        return FERRY_OK;
    }
    pn->chunk = ps->chunk;
    pn->offset = ps->offset;
    ps->handed = true;
    *taken = true;
    w->diverged = w->diverged || (x->how[j] & SRC_VIEW);
    if (pn->size < ps->size) {
        return ferry_blocks_free(&w->blocks[ps->buft], ps->chunk, ps->offset + pn->size, ps->size - pn->size);
    }
    return FERRY_OK;
}

/* Place node x: over the first source it may take (in place), else in free memory. */
static ferry_status place_node(walk * w, const node_index * x) {
    bool taken = false;
    for (int j = 0; x->inplace && j < FERRY_MAX_SRC && !taken; j++) {
        if ((x->how[j] & SRC_INPLACE) && (w->through_views || !(x->how[j] & SRC_VIEW))) {
            FERRY_TRY(take_source(w, x, j, &taken));
        }
    }
    return taken ? FERRY_OK : place(w, x->slot);
}

/* The copies' slots and nodes, and their sources' reads at those nodes, in the order
 * the walk meets them. */
static ferry_status prepare_copies(const call * c, tensor_plan * base) {
    ferry_gallocr * g = c->g;
    FERRY_TRY(scratch_need(&g->staged, (size_t) c->n_copies, sizeof(staged_copy)));
    staged_copy * staged = g->staged.items;
    for (int k = 0; k < c->n_copies; k++) {
        const ferry_gallocr_copy * cp = &c->copies[k];
        const int s = cp->copy ? ferry_graph_slot(c->graph, cp->copy) : -1;
        if (s < 0 || cp->copy->op != FERRY_OP_NONE || cp->copy->view_src) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: copy %d ('%s') is not a leaf of the graph", k,
                              cp->copy ? cp->copy->name : "NULL");
        }
        if (cp->node < 0 || cp->node >= c->n_nodes) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: copy %d ('%s') is written before node %d of %d", k,
                              cp->copy->name, cp->node, c->n_nodes);
        }
        base[s].node = cp->node;
        base[s].kept = base[s].kept || cp->kept;
        const int src = cp->src ? ferry_graph_slot(c->graph, ferry_tensor_root(cp->src)) : -1;
        if (src >= 0) {
            base[src].uses++; /* read at the copy's node */
        }
        staged[k] = (staged_copy) {.node = cp->node, .k = k, .copy = s, .src = src};
    }
    /* by node, then in the caller's order; usually already so */
    for (int k = 1; k < c->n_copies; k++) {
        const staged_copy x = staged[k];
        int at = k;
        for (; at > 0 && staged[at - 1].node > x.node; at--) {
            staged[at] = staged[at - 1];
        }
        staged[at] = x;
    }
    return FERRY_OK;
}

/* Read the graph once: each tensor's slot, buffer type, size, external memory and use
 * count (the base plan every walk starts from), each node's sources' slots. */
static ferry_status prepare(const call * c) {
    ferry_gallocr * g = c->g;
    ferry_graph * graph = c->graph;
    const int n_leafs = c->n_leafs, n_nodes = c->n_nodes;
    FERRY_TRY(scratch_need(&g->base, (size_t) c->n_slots, sizeof(tensor_plan)));
    FERRY_TRY(scratch_need(&g->walked[0], (size_t) c->n_slots, sizeof(tensor_plan)));
    FERRY_TRY(scratch_need(&g->walked[1], (size_t) c->n_slots, sizeof(tensor_plan)));
    FERRY_TRY(scratch_need(&g->tensors, (size_t) c->n_slots, sizeof(const ferry_tensor *)));
    FERRY_TRY(scratch_need(&g->index, (size_t) n_nodes, sizeof(node_index)));
    FERRY_TRY(scratch_need(&g->leaf_slot, (size_t) n_leafs, sizeof(int)));
    tensor_plan * base = g->base.items;
    const ferry_tensor ** tensors = g->tensors.items;
    node_index * index = g->index.items;
    int * leaf_slot = g->leaf_slot.items;
    memset(base, 0, (size_t) c->n_slots * sizeof(*base));
    for (int b = 0; b < g->n_bufts; b++) {
        const size_t alignment = ferry_buffer_type_alignment(g->bufts[b]), max = ferry_buffer_type_max_size(g->bufts[b]);
        ferry_blocks_reset(&g->blocks[0][b], alignment, max, false);
        ferry_blocks_reset(&g->blocks[1][b], alignment, max, true);
    }
    for (int i = 0; i < n_leafs + n_nodes; i++) {
        const bool is_leaf = i < n_leafs;
        const ferry_tensor * t = is_leaf ? ferry_graph_leaf(graph, i) : ferry_graph_node(graph, i - n_leafs);
        const int id = is_leaf ? (c->leaf_ids ? c->leaf_ids[i] : 0) : (c->node_ids ? c->node_ids[i - n_leafs] : 0);
        if (id < 0 || id >= g->n_bufts) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: %s %d ('%s') has buffer type %d of %d",
                              is_leaf ? "leaf" : "node", is_leaf ? i : i - n_leafs, t->name, id, g->n_bufts);
        }
        const bool input = is_leaf || (t->flags & FERRY_TENSOR_FLAG_INPUT);
        const int s = ferry_graph_slot(graph, t);
        tensors[s] = t;
        if (is_leaf) {
            leaf_slot[i] = s;
        } else {
            index[i - n_leafs].slot = s;
        }
        tensor_plan * p = &base[s];
        p->buft = id;
        p->chunk = -1;
        p->node = -1;
        p->external = !t->view_src && ferry_gallocr_has_foreign_memory(g, t);
        p->kept = (t->flags & FERRY_TENSOR_FLAG_OUTPUT) || (input && g->keep_inputs);
        if (!t->view_src && !p->external) {
            p->size = ferry_blocks_round(&g->blocks[0][id], ferry_buffer_type_alloc_size(g->bufts[id], t));
        }
    }
    /* Each node's sources; handed marks, for now, a view that some node names as a source. */
    for (int i = 0; i < n_nodes; i++) {
        const ferry_tensor * n = ferry_graph_node(graph, i);
        node_index * x = &index[i];
        x->view = n->view_src != NULL;
        x->inplace = false;
        const bool can_inplace = ferry_op_can_inplace(n->op);
        for (int j = 0; j < FERRY_MAX_SRC; j++) {
            const ferry_tensor * src = n->src[j];
            x->src[j] = -1;
            x->how[j] = 0;
            if (!src) {
                continue;
            }
            const int direct = ferry_graph_slot(graph, src);
            const int s = src->view_src ? ferry_graph_slot(graph, src->view_src) : direct;
            if (s < 0) {
                return ferry_fail(FERRY_ERR_LAYOUT, "gallocr: '%s' reads '%s', which is not in the graph", n->name,
                                  ferry_tensor_root(src)->name);
            }
            base[s].uses++;
            if (direct >= 0 && src->view_src) {
                base[direct].handed = true;
            }
            x->src[j] = s;
            x->how[j] = (unsigned char) (src->view_src ? SRC_VIEW : 0);
            if (can_inplace && ferry_tensor_same_layout(src, n) && (!src->view_src || src->view_offs == 0)) {
                x->how[j] |= SRC_INPLACE;
                x->inplace = true;
            }
        }
    }
    /* A view that is an output, or that nobody reads (a result), keeps its source's memory. */
    for (int i = 0; i < n_nodes; i++) {
        const node_index * x = &index[i];
        if (x->view) {
            const ferry_tensor * n = tensors[x->slot];
            const int s = ferry_graph_slot(graph, n->view_src);
            if (s >= 0 && ((n->flags & FERRY_TENSOR_FLAG_OUTPUT) || !base[x->slot].handed)) {
                base[s].kept = true;
            }
        }
    }
    for (int s = 0; s < c->n_slots; s++) {
        base[s].handed = false;
    }
    return prepare_copies(c, base);
}

/* One use of the tensor in slot s is over: free its memory after its last. */
static ferry_status release(walk * w, int s) {
    tensor_plan * p = &w->plan[s];
    if (--p->uses == 0 && p->chunk >= 0 && !p->kept && !p->handed) {
        return ferry_blocks_free(&w->blocks[p->buft], p->chunk, p->offset, p->size);
    }
    return FERRY_OK;
}

/* The walk over nodes, with the copies where they are written. */
static ferry_status walk_nodes(walk * w) {
    const call * c = w->c;
    const node_index * index = index_of(c);
    const staged_copy * staged = c->g->staged.items;
    int next = 0;
    for (int i = 0; i < c->n_nodes; i++) {
        /* A copy written just before node i: memory freed by the nodes before i is free to it. */
        const int first = next;
        for (; next < c->n_copies && staged[next].node == i; next++) {
            const tensor_plan * p = &w->plan[staged[next].copy];
            if (!p->external && p->chunk < 0) {
                FERRY_TRY(place(w, staged[next].copy));
            }
        }
        const node_index * x = &index[i];
        const tensor_plan * pn = &w->plan[x->slot];
        for (int j = 0; j < FERRY_MAX_SRC && !x->view && c->n_copies > 0; j++) {
            if (x->src[j] >= 0 && w->plan[x->src[j]].node > i) {
                return ferry_fail(FERRY_ERR_INVALID_ARG,
                                  "gallocr: node %d ('%s') reads '%s', written only before node %d", i,
                                  tensors_of(c)[x->slot]->name, tensors_of(c)[x->src[j]]->name,
                                  w->plan[x->src[j]].node);
            }
        }
        if (!x->view && !pn->external && pn->chunk < 0) {
            FERRY_TRY(place_node(w, x));
        }
        /* Its sources' memory, and the copies' sources', is free once their last reader ran. */
        for (int j = 0; j < FERRY_MAX_SRC; j++) {
            if (x->src[j] >= 0) {
                FERRY_TRY(release(w, x->src[j]));
            }
        }
        for (int k = first; k < next; k++) {
            if (staged[k].src >= 0) {
                FERRY_TRY(release(w, staged[k].src));
            }
        }
    }
    return FERRY_OK;
}

/* Walk the call's graph one way: alt takes the last of equal blocks and works in place
 * over direct sources only; else the first of equal blocks, in place through views too. */
static ferry_status walk_graph(walk * w, const call * c, int way) {
    ferry_gallocr * g = c->g;
    const bool alt = way == 1;
    *w = (walk) {.c = c, .plan = plan_of(&g->walked[way]), .blocks = g->blocks[way], .through_views = !alt};
    memcpy(w->plan, g->base.items, (size_t) c->n_slots * sizeof(*w->plan));
    const ferry_tensor ** tensors = tensors_of(c);
    const int * leaf_slot = c->g->leaf_slot.items;
    const node_index * index = index_of(c);
    /* Leafs and inputs first: their data is written before anything runs (copies: at their node). */
    for (int i = 0; i < c->n_leafs; i++) {
        const int s = leaf_slot[i];
        const tensor_plan * p = &w->plan[s];
        if (!tensors[s]->view_src && !p->external && p->node < 0) {
            FERRY_TRY(place(w, s));
        }
    }
    for (int i = 0; i < c->n_nodes; i++) {
        const node_index * x = &index[i];
        const tensor_plan * p = &w->plan[x->slot];
        if (!x->view && !p->external && (tensors[x->slot]->flags & FERRY_TENSOR_FLAG_INPUT)) {
            FERRY_TRY(place(w, x->slot));
        }
    }
    return walk_nodes(w);
}

/* ---------------------------------------------------------------- buffers */

/* A chunk of need bytes. Past the max size it is a single oversized tensor's; the
 * buffer type's own allocator decides whether it can have that much. */
static ferry_status alloc_chunk(ferry_buffer_type * buft, size_t need, ferry_buffer ** out) {
    if (need > ferry_buffer_type_max_size(buft) && need <= (size_t) INT64_MAX) {
        FERRY_TRY(buft->iface.alloc_buffer(buft, need, out));
    } else {
        FERRY_TRY(ferry_buffer_type_alloc_buffer(buft, need, out));
    }
    return ferry_buffer_set_usage(*out, FERRY_BUFFER_USAGE_COMPUTE);
}

/* Grow (never shrink) each chunk's buffer to what the walk needed. */
static ferry_status ensure_buffers(ferry_gallocr * g, const ferry_blocks * blocks) {
    for (int b = 0; b < g->n_bufts; b++) {
        for (int c = 0; c < blocks[b].n_chunks; c++) {
            ferry_buffer ** slot = chunk_slot(g, b, c);
            const size_t need = blocks[b].chunks[c].high;
            if (*slot && ferry_buffer_size(*slot) >= need) {
                continue;
            }
            ferry_buffer_free(*slot);
            *slot = NULL;
            FERRY_TRY(alloc_chunk(g->bufts[b], need, slot));
        }
        if (blocks[b].n_chunks > g->n_chunks[b]) {
            g->n_chunks[b] = blocks[b].n_chunks;
        }
    }
    return FERRY_OK;
}

/* Did the walk fail only for want of a chunk? That way's plan does not fit where the
 * other's may; any other failure (the heap) is the caller's to hear of. */
static bool walk_out_of_chunks(const ferry_gallocr * g, const walk * w) {
    for (int b = 0; b < g->n_bufts; b++) {
        if (w->blocks[b].out_of_chunks) {
            return true;
        }
    }
    return false;
}

/* Could the other way end elsewhere? Only where this one chose between equal blocks or
 * worked in place through a view: at every other step both ways choose alike. */
static bool walk_diverged(const ferry_gallocr * g, const walk * w) {
    for (int b = 0; b < g->n_bufts; b++) {
        if (w->blocks[b].tied) {
            return true;
        }
    }
    return w->diverged;
}

static size_t walk_need(const ferry_gallocr * g, const walk * w) {
    size_t need = 0;
    for (int b = 0; b < g->n_bufts; b++) {
        for (int c = 0; c < w->blocks[b].n_chunks; c++) {
            need += w->blocks[b].chunks[c].high;
        }
    }
    return need;
}

/*
 * Walk graph, grow the buffers, and keep the walk for placement queries. Greedy
 * placement can be unlucky: where two free blocks fit a tensor equally well, or two
 * sources could be worked over in place, the choice decides what fits later. So the
 * graph may be walked two ways, and the one that needs less memory (the first on a
 * tie) is kept: first of equal blocks and in place through views too; last of equal
 * blocks and in place over direct sources only (what ggml does). The second way is
 * walked only where the first met such a choice; elsewhere it would repeat the first
 * step for step. Both are deterministic, so reserve and alloc_graph agree. A way that
 * runs out of chunks leaves the other; a failed heap allocation in either is
 * reported, never absorbed. The graph is read once for both (prepare), into memory the
 * allocator keeps between calls.
 */
static ferry_status measure(ferry_gallocr * g, ferry_graph * graph, const int * node_ids, const int * leaf_ids,
                            const ferry_gallocr_copy * copies, int n_copies) {
    const call c = {.g = g, .graph = graph, .n_slots = ferry_graph_n_slots(graph),
                    .n_nodes = ferry_graph_n_nodes(graph), .n_leafs = ferry_graph_n_leafs(graph),
                    .node_ids = node_ids, .leaf_ids = leaf_ids, .copies = copies, .n_copies = n_copies};
    FERRY_TRY(prepare(&c));
    walk first, second;
    const ferry_status st_first = walk_graph(&first, &c, 0);
    const bool first_short = st_first != FERRY_OK && walk_out_of_chunks(g, &first);
    if (st_first != FERRY_OK && !first_short) {
        return st_first;
    }
    walk * kept = &first;
    if (walk_diverged(g, &first)) {
        const ferry_status st_second = walk_graph(&second, &c, 1);
        if (st_second != FERRY_OK && !walk_out_of_chunks(g, &second)) {
            return st_second;
        }
        if (st_second != FERRY_OK && first_short) {
            return st_second; /* neither way fits in the chunks */
        }
        if (st_second != FERRY_OK || first_short) {
            ferry_clear_error(); /* one way ran out of chunks: the other's plan stands */
        }
        if (first_short || (st_second == FERRY_OK && walk_need(g, &second) < walk_need(g, &first))) {
            kept = &second;
        }
    } else if (first_short) {
        return st_first; /* the other way would run out alike */
    }
    FERRY_TRY(ensure_buffers(g, kept->blocks));
    /* the kept plan becomes the allocator's; its old memory serves the next walk */
    scratch * walked = &g->walked[kept == &first ? 0 : 1];
    const scratch old_plan = g->plan, old_tensors = g->plan_tensors;
    g->plan = *walked;
    *walked = old_plan;
    g->plan_tensors = g->tensors;
    g->tensors = old_tensors;
    g->n_plan = c.n_slots;
    return FERRY_OK;
}

static ferry_status keep_ids(int ** dst, int * n_dst, const int * ids, int n) {
    int * copy = NULL;
    if (ids && n > 0) {
        copy = ferry_malloc((size_t) n * sizeof(*copy));
        if (!copy) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
        }
        memcpy(copy, ids, (size_t) n * sizeof(*copy));
    }
    free(*dst);
    *dst = copy;
    *n_dst = n;
    return FERRY_OK;
}

ferry_status ferry_gallocr_reserve_copies(ferry_gallocr * g, ferry_graph * graph, const int * node_buft_ids,
                                          const int * leaf_buft_ids, const ferry_gallocr_copy * copies,
                                          int n_copies) {
    FERRY_CHECK_ARG(g && graph, "gallocr_reserve: NULL allocator or graph");
    FERRY_CHECK_ARG(n_copies >= 0 && (copies || n_copies == 0), "gallocr_reserve: %d copies at NULL", n_copies);
    FERRY_TRY(measure(g, graph, node_buft_ids, leaf_buft_ids, copies, n_copies));
    ferry_gallocr_copy * kept = NULL;
    if (n_copies > 0) {
        kept = ferry_malloc((size_t) n_copies * sizeof(*kept));
        if (!kept) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
        }
        memcpy(kept, copies, (size_t) n_copies * sizeof(*kept));
    }
    free(g->copies);
    g->copies = kept;
    g->n_copies = n_copies;
    FERRY_TRY(keep_ids(&g->node_ids, &g->n_node_ids, node_buft_ids, ferry_graph_n_nodes(graph)));
    return keep_ids(&g->leaf_ids, &g->n_leaf_ids, leaf_buft_ids, ferry_graph_n_leafs(graph));
}

ferry_status ferry_gallocr_reserve(ferry_gallocr * g, ferry_graph * graph, const int * node_buft_ids,
                                   const int * leaf_buft_ids) {
    return ferry_gallocr_reserve_copies(g, graph, node_buft_ids, leaf_buft_ids, NULL, 0);
}

ferry_status ferry_gallocr_set_keep_inputs(ferry_gallocr * g, bool keep) {
    FERRY_CHECK_ARG(g, "gallocr_set_keep_inputs: NULL allocator");
    g->keep_inputs = keep;
    return FERRY_OK;
}

bool ferry_gallocr_get_keep_inputs(const ferry_gallocr * g) { return g && g->keep_inputs; }

ferry_status ferry_gallocr_alloc_graph(ferry_gallocr * g, ferry_graph * graph) {
    FERRY_CHECK_ARG(g && graph, "gallocr_alloc_graph: NULL allocator or graph");
    const int n_nodes = ferry_graph_n_nodes(graph), n_leafs = ferry_graph_n_leafs(graph);
    const bool kept = (g->node_ids || g->leaf_ids || g->copies) && g->n_node_ids == n_nodes && g->n_leaf_ids == n_leafs;
    if (g->n_bufts > 1 && (g->node_ids || g->leaf_ids) && !kept) {
        return ferry_fail(FERRY_ERR_INVALID_ARG,
                          "gallocr_alloc_graph: this graph (%d nodes, %d leafs) is not the one reserved with"
                          " several buffer types (%d nodes, %d leafs); reserve it first",
                          n_nodes, n_leafs, g->n_node_ids, g->n_leaf_ids);
    }
    FERRY_TRY(measure(g, graph, kept ? g->node_ids : NULL, kept ? g->leaf_ids : NULL, kept ? g->copies : NULL,
                      kept ? g->n_copies : 0));
    return ferry_gallocr_place_reserved(g);
}

ferry_status ferry_gallocr_place_reserved(ferry_gallocr * g) {
    FERRY_CHECK_ARG(g, "gallocr_place_reserved: NULL allocator");
    const tensor_plan * plan = plan_of(&g->plan);
    const ferry_tensor ** tensors = g->plan_tensors.items;
    for (int s = 0; s < g->n_plan; s++) {
        const tensor_plan * p = &plan[s];
        if (p->chunk >= 0) {
            FERRY_TRY(ferry_buffer_place_tensor(*chunk_slot(g, p->buft, p->chunk), (ferry_tensor *) tensors[s],
                                                p->offset));
        }
    }
    for (int s = 0; s < g->n_plan; s++) {
        if (tensors[s]->view_src) {
            ferry_tensor_data(tensors[s]); /* views follow their source */
        }
    }
    return FERRY_OK;
}

/* ---------------------------------------------------------------- queries */

size_t ferry_gallocr_buffer_size(const ferry_gallocr * g, int buft_id) {
    size_t total = 0;
    for (int c = 0; g && buft_id >= 0 && buft_id < g->n_bufts && c < g->n_chunks[buft_id]; c++) {
        total += ferry_buffer_size(*chunk_slot(g, buft_id, c));
    }
    return total;
}

int ferry_gallocr_n_chunks(const ferry_gallocr * g, int buft_id) {
    return g && buft_id >= 0 && buft_id < g->n_bufts ? g->n_chunks[buft_id] : 0;
}

ferry_buffer * ferry_gallocr_chunk_buffer(const ferry_gallocr * g, int buft_id, int chunk) {
    if (!g || buft_id < 0 || buft_id >= g->n_bufts || chunk < 0 || chunk >= g->n_chunks[buft_id]) {
        return NULL;
    }
    return *chunk_slot(g, buft_id, chunk);
}

ferry_status ferry_gallocr_tensor_placement(const ferry_gallocr * g, const ferry_tensor * t, int * buft_id,
                                            int * chunk, size_t * offset, size_t * size) {
    FERRY_CHECK_ARG(g && t, "gallocr_tensor_placement: NULL allocator or tensor");
    const tensor_plan * plan = plan_of(&g->plan);
    const ferry_tensor ** tensors = g->plan_tensors.items;
    for (int s = 0; s < g->n_plan; s++) {
        if (tensors[s] == t && plan[s].chunk >= 0) {
            if (buft_id) *buft_id = plan[s].buft;
            if (chunk) *chunk = plan[s].chunk;
            if (offset) *offset = plan[s].offset;
            if (size) *size = plan[s].size;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_NOT_ALLOCATED, "gallocr_tensor_placement: the last graph did not place '%s'", t->name);
}
