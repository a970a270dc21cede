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
    bool kept;   /* lives to the end: outputs, results nobody reads, inputs when kept */
    bool handed;   /* its memory went to a node that works in place */
} tensor_plan;

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
    /* the last walk, for placement queries */
    const ferry_tensor ** plan_tensors;
    tensor_plan * plan;
    int n_plan;
};

static ferry_buffer ** chunk_slot(const ferry_gallocr * g, int buft, int chunk) {
    return &g->buffers[buft * FERRY_GALLOC_MAX_CHUNKS + chunk];
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
    }
    if (!g || !g->bufts || !g->buffers || !g->n_chunks) {
        ferry_gallocr_free(g);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr_new: out of memory");
    }
    memcpy(g->bufts, bufts, (size_t) n_bufts * sizeof(*bufts));
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
    free(g->buffers);
    free(g->bufts);
    free(g->n_chunks);
    free(g->node_ids);
    free(g->leaf_ids);
    free(g->copies);
    free(g->plan_tensors);
    free(g->plan);
    free(g);
}

/* Memory someone else gave t: a live buffer that is not one of ours. */
bool ferry_gallocr_has_foreign_memory(const ferry_gallocr * g, const ferry_tensor * t) {
    if (!t->buffer || !ferry_buffer_id_is_live(t->buffer_id)) {
        return false;
    }
    for (int i = 0; i < g->n_bufts * FERRY_GALLOC_MAX_CHUNKS; i++) {
        if (g->buffers[i] == t->buffer) {
            return false;
        }
    }
    return true;
}

/* ---------------------------------------------------------------- the walk */

typedef struct {
    ferry_gallocr * g;
    ferry_graph * graph;
    tensor_plan * plan;
    const ferry_tensor ** tensors; /* by slot */
    ferry_blocks * blocks;         /* one per buffer type */
    const int * node_ids;          /* NULL: all 0 */
    const int * leaf_ids;
    const ferry_gallocr_copy * copies;
    int n_copies;
    bool through_views;            /* in place over a source through a view of it too */
} walk;

static size_t rounded_size(walk * w, const tensor_plan * p, const ferry_tensor * t) {
    return ferry_blocks_round(&w->blocks[p->buft], ferry_buffer_type_alloc_size(w->g->bufts[p->buft], t));
}

static ferry_status place(walk * w, const ferry_tensor * t) {
    tensor_plan * p = &w->plan[ferry_graph_slot(w->graph, t)];
    p->size = rounded_size(w, p, t);
    return ferry_blocks_alloc(&w->blocks[p->buft], p->size, t->name, &p->chunk, &p->offset);
}

static int slot_of(walk * w, const ferry_tensor * t) { return ferry_graph_slot(w->graph, ferry_tensor_root(t)); }

/* Does node n take the memory of its source s? n works element by element, so it may
 * write each element where it read it when s has n's layout (a view only from its
 * source's first byte). The memory must be one the allocator placed, not kept to the
 * end, on n's buffer type, and nothing may read it after n (n's is its last use,
 * through any view). What n does not need of it is freed. */
static ferry_status take_source(walk * w, const ferry_tensor * n, const ferry_tensor * s, bool * taken) {
    *taken = false;
    if (!ferry_tensor_same_layout(s, n) || (s->view_src && s->view_offs != 0)) {
        return FERRY_OK;
    }
    tensor_plan * ps = &w->plan[slot_of(w, s)];
    tensor_plan * pn = &w->plan[ferry_graph_slot(w->graph, n)];
    if (ps->chunk < 0 || ps->kept || ps->handed || ps->uses != 1 || ps->buft != pn->buft) {
        return FERRY_OK;
    }
    const size_t size = rounded_size(w, pn, n);
    if (size > ps->size) {
        return FERRY_OK;
    }
    pn->chunk = ps->chunk;
    pn->offset = ps->offset;
    pn->size = size;
    ps->handed = true;
    *taken = true;
    if (size < ps->size) {
        return ferry_blocks_free(&w->blocks[ps->buft], ps->chunk, ps->offset + size, ps->size - size);
    }
    return FERRY_OK;
}

/* Place node n: over the first source it may take (in place), else in free memory. */
static ferry_status place_node(walk * w, const ferry_tensor * n) {
    bool taken = false;
    for (int j = 0; ferry_op_can_inplace(n->op) && j < FERRY_MAX_SRC && !taken; j++) {
        if (n->src[j] && (w->through_views || !n->src[j]->view_src)) {
            FERRY_TRY(take_source(w, n, n->src[j], &taken));
        }
    }
    return taken ? FERRY_OK : place(w, n);
}

/* The copies' nodes, and their sources' reads at those nodes. */
static ferry_status prepare_copies(walk * w) {
    const int n_nodes = ferry_graph_n_nodes(w->graph);
    for (int k = 0; k < w->n_copies; k++) {
        const ferry_gallocr_copy * c = &w->copies[k];
        const int s = c->copy ? ferry_graph_slot(w->graph, c->copy) : -1;
        if (s < 0 || c->copy->op != FERRY_OP_NONE || c->copy->view_src) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: copy %d ('%s') is not a leaf of the graph", k,
                              c->copy ? c->copy->name : "NULL");
        }
        if (c->node < 0 || c->node >= n_nodes) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: copy %d ('%s') is written before node %d of %d", k,
                              c->copy->name, c->node, n_nodes);
        }
        w->plan[s].node = c->node;
        const int src = c->src ? slot_of(w, c->src) : -1;
        if (src >= 0) {
            w->plan[src].uses++; /* read at the copy's node */
        }
    }
    return FERRY_OK;
}

/* Fill in buffer types, external memory, assignments and use counts before the walk. */
static ferry_status prepare(walk * w) {
    ferry_graph * graph = w->graph;
    const int *node_ids = w->node_ids, *leaf_ids = w->leaf_ids;
    const int n_leafs = ferry_graph_n_leafs(graph), n_nodes = ferry_graph_n_nodes(graph);
    for (int i = 0; i < n_leafs + n_nodes; i++) {
        const bool is_leaf = i < n_leafs;
        const ferry_tensor * t = is_leaf ? ferry_graph_leaf(graph, i) : ferry_graph_node(graph, i - n_leafs);
        const int id = is_leaf ? (leaf_ids ? leaf_ids[i] : 0) : (node_ids ? node_ids[i - n_leafs] : 0);
        if (id < 0 || id >= w->g->n_bufts) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "gallocr: %s %d ('%s') has buffer type %d of %d",
                              is_leaf ? "leaf" : "node", is_leaf ? i : i - n_leafs, t->name, id, w->g->n_bufts);
        }
        const bool input = is_leaf || (t->flags & FERRY_TENSOR_FLAG_INPUT);
        const int s = ferry_graph_slot(graph, t);
        w->tensors[s] = t;
        tensor_plan * p = &w->plan[s];
        p->buft = id;
        p->chunk = -1;
        p->node = -1;
        p->external = !t->view_src && ferry_gallocr_has_foreign_memory(w->g, t);
        p->kept = (t->flags & FERRY_TENSOR_FLAG_OUTPUT) || (input && w->g->keep_inputs);
    }
    /* readers[slot]: the nodes that name a tensor as a source (not through views) */
    int * readers = ferry_calloc((size_t) ferry_graph_n_slots(graph) + 1, sizeof(*readers));
    if (!readers) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
    }
    for (int i = 0; i < n_nodes; i++) {
        const ferry_tensor * n = ferry_graph_node(graph, i);
        for (int j = 0; j < FERRY_MAX_SRC; j++) {
            if (!n->src[j]) {
                continue;
            }
            const int s = slot_of(w, n->src[j]), direct = ferry_graph_slot(graph, n->src[j]);
            if (s < 0) {
                free(readers);
                return ferry_fail(FERRY_ERR_LAYOUT, "gallocr: '%s' reads '%s', which is not in the graph", n->name,
                                  ferry_tensor_root(n->src[j])->name);
            }
            w->plan[s].uses++;
            if (direct >= 0) {
                readers[direct]++;
            }
        }
    }
    /* A view that is an output, or that nobody reads (a result), keeps its source's memory. */
    for (int i = 0; i < n_nodes; i++) {
        const ferry_tensor * n = ferry_graph_node(graph, i);
        if (n->view_src && ((n->flags & FERRY_TENSOR_FLAG_OUTPUT) || readers[ferry_graph_slot(graph, n)] == 0)) {
            w->plan[slot_of(w, n)].kept = true;
        }
    }
    free(readers);
    return prepare_copies(w);
}

/* One use of the tensor in slot s is over: free its memory after its last. */
static ferry_status release(walk * w, int s) {
    tensor_plan * p = &w->plan[s];
    if (--p->uses == 0 && p->chunk >= 0 && !p->kept && !p->handed) {
        return ferry_blocks_free(&w->blocks[p->buft], p->chunk, p->offset, p->size);
    }
    return FERRY_OK;
}

/* By node, then in the caller's order (the pointers are into one array). */
static int by_step(const void * a, const void * b) {
    const ferry_gallocr_copy *x = *(const ferry_gallocr_copy * const *) a, *y = *(const ferry_gallocr_copy * const *) b;
    return x->node != y->node ? (x->node > y->node) - (x->node < y->node) : (x > y) - (x < y);
}

/* The walk over nodes; staged: the copies by node. */
static ferry_status walk_nodes(walk * w, const ferry_gallocr_copy * const * staged, int n_staged) {
    ferry_graph * graph = w->graph;
    int next = 0;
    for (int i = 0; i < ferry_graph_n_nodes(graph); i++) {
        /* A copy written just before node i: memory freed by the nodes before i is free to it. */
        const int first = next;
        for (; next < n_staged && staged[next]->node == i; next++) {
            const tensor_plan * p = &w->plan[ferry_graph_slot(graph, staged[next]->copy)];
            if (!p->external && p->chunk < 0) {
                FERRY_TRY(place(w, staged[next]->copy));
            }
        }
        const ferry_tensor * n = ferry_graph_node(graph, i);
        const tensor_plan * pn = &w->plan[ferry_graph_slot(graph, n)];
        for (int j = 0; j < FERRY_MAX_SRC && !n->view_src; j++) {
            const ferry_tensor * s = n->src[j];
            if (s && w->plan[slot_of(w, s)].node > i) {
                return ferry_fail(FERRY_ERR_INVALID_ARG,
                                  "gallocr: node %d ('%s') reads '%s', written only before node %d", i, n->name,
                                  ferry_tensor_root(s)->name, w->plan[slot_of(w, s)].node);
            }
        }
        if (!n->view_src && !pn->external && pn->chunk < 0) {
            FERRY_TRY(place_node(w, n));
        }
        /* Its sources' memory, and the copies' sources', is free once their last reader ran. */
        for (int j = 0; j < FERRY_MAX_SRC; j++) {
            if (n->src[j]) {
                FERRY_TRY(release(w, slot_of(w, n->src[j])));
            }
        }
        for (int k = first; k < next; k++) {
            if (staged[k]->src && slot_of(w, staged[k]->src) >= 0) {
                FERRY_TRY(release(w, slot_of(w, staged[k]->src)));
            }
        }
    }
    return FERRY_OK;
}

static ferry_status run_walk(walk * w) {
    ferry_graph * graph = w->graph;
    FERRY_TRY(prepare(w));
    const ferry_gallocr_copy ** staged = ferry_calloc((size_t) w->n_copies + 1, sizeof(*staged));
    if (!staged) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
    }
    for (int k = 0; k < w->n_copies; k++) {
        staged[k] = &w->copies[k];
    }
    qsort(staged, (size_t) w->n_copies, sizeof(*staged), by_step);
    ferry_status st = FERRY_OK;
    /* Leafs and inputs first: their data is written before anything runs (copies: at their node). */
    for (int i = 0; i < ferry_graph_n_leafs(graph) && st == FERRY_OK; i++) {
        const ferry_tensor * t = ferry_graph_leaf(graph, i);
        const tensor_plan * p = &w->plan[ferry_graph_slot(graph, t)];
        if (!t->view_src && !p->external && p->node < 0) {
            st = place(w, t);
        }
    }
    for (int i = 0; i < ferry_graph_n_nodes(graph) && st == FERRY_OK; i++) {
        const ferry_tensor * n = ferry_graph_node(graph, i);
        const tensor_plan * p = &w->plan[ferry_graph_slot(graph, n)];
        if (!n->view_src && !p->external && (n->flags & FERRY_TENSOR_FLAG_INPUT)) {
            st = place(w, n);
        }
    }
    if (st == FERRY_OK) {
        st = walk_nodes(w, staged, w->n_copies);
    }
    free(staged);
    return st;
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

/* Free what a walk holds (its plan, unless measure kept it). */
static void walk_release(ferry_gallocr * g, walk * w) {
    for (int b = 0; w->blocks && b < g->n_bufts; b++) {
        ferry_blocks_release(&w->blocks[b]);
    }
    free(w->blocks);
    free(w->plan);
    free(w->tensors);
}

/* One walk of graph; the second way (alt) differs in two choices, see measure. */
static ferry_status walk_graph(walk * w, bool alt) {
    ferry_gallocr * g = w->g;
    const int n = ferry_graph_n_slots(w->graph);
    w->through_views = !alt;
    w->plan = ferry_calloc((size_t) n + 1, sizeof(*w->plan));
    w->tensors = ferry_calloc((size_t) n + 1, sizeof(*w->tensors));
    w->blocks = ferry_calloc((size_t) g->n_bufts, sizeof(*w->blocks));
    if (!w->plan || !w->tensors || !w->blocks) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "gallocr: out of memory");
    }
    for (int b = 0; b < g->n_bufts; b++) {
        ferry_blocks_init(&w->blocks[b], ferry_buffer_type_alignment(g->bufts[b]),
                          ferry_buffer_type_max_size(g->bufts[b]));
        w->blocks[b].last_of_equal = alt;
    }
    return run_walk(w);
}

/* Did the walk fail only for want of a chunk? That way's plan does not fit where the
 * other's may; any other failure (the heap) is the caller's to hear of. */
static bool walk_out_of_chunks(const ferry_gallocr * g, const walk * w) {
    for (int b = 0; w->blocks && b < g->n_bufts; b++) {
        if (w->blocks[b].out_of_chunks) {
            return true;
        }
    }
    return false;
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
 * graph is walked two ways, and the one that needs less memory (the first on a tie) is
 * kept: first of equal blocks and in place through views too; last of equal blocks and
 * in place over direct sources only (what ggml does). Both are deterministic, so
 * reserve and alloc_graph agree. A way that runs out of chunks leaves the other; a
 * failed heap allocation in either is reported, never absorbed.
 */
static ferry_status measure(ferry_gallocr * g, ferry_graph * graph, const int * node_ids, const int * leaf_ids,
                            const ferry_gallocr_copy * copies, int n_copies) {
    const walk base = {.g = g, .graph = graph, .node_ids = node_ids, .leaf_ids = leaf_ids, .copies = copies,
                       .n_copies = n_copies};
    walk first = base, second = base;
    const ferry_status st_second = walk_graph(&second, true);
    ferry_status st = st_second == FERRY_OK || walk_out_of_chunks(g, &second) ? walk_graph(&first, false) : st_second;
    if (st != FERRY_OK && (st_second != FERRY_OK || !walk_out_of_chunks(g, &first))) {
        walk_release(g, &first);
        walk_release(g, &second);
        return st;
    }
    if (st != FERRY_OK || st_second != FERRY_OK) {
        ferry_clear_error(); /* one way ran out of chunks: the other's plan stands */
    }
    walk * kept = st == FERRY_OK && (st_second != FERRY_OK || walk_need(g, &first) <= walk_need(g, &second))
                      ? &first : &second;
    st = ensure_buffers(g, kept->blocks);
    if (st == FERRY_OK) {
        free(g->plan);
        free(g->plan_tensors);
        g->plan = kept->plan;
        g->plan_tensors = kept->tensors;
        g->n_plan = ferry_graph_n_slots(graph);
        kept->plan = NULL;
        kept->tensors = NULL;
    }
    walk_release(g, &first);
    walk_release(g, &second);
    return st;
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
    for (int s = 0; s < g->n_plan; s++) {
        const tensor_plan * p = &g->plan[s];
        if (p->chunk >= 0) {
            FERRY_TRY(ferry_buffer_place_tensor(*chunk_slot(g, p->buft, p->chunk), (ferry_tensor *) g->plan_tensors[s],
                                                p->offset));
        }
    }
    for (int s = 0; s < g->n_plan; s++) {
        if (g->plan_tensors[s]->view_src) {
            ferry_tensor_data(g->plan_tensors[s]); /* views follow their source */
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
    for (int s = 0; s < g->n_plan; s++) {
        if (g->plan_tensors[s] == t && g->plan[s].chunk >= 0) {
            if (buft_id) *buft_id = g->plan[s].buft;
            if (chunk) *chunk = g->plan[s].chunk;
            if (offset) *offset = g->plan[s].offset;
            if (size) *size = g->plan[s].size;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_NOT_ALLOCATED, "gallocr_tensor_placement: the last graph did not place '%s'", t->name);
}
