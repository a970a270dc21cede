/* Graphs: the tensors an output depends on, in topological order, and their dispatch
 * to a backend. A graph references tensors; it never owns or changes them. */
#include "ferry-impl.h"
#include "graph-impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* An open-addressing set of tensor pointers, each with its slot. */
typedef struct {
    const ferry_tensor * key;
    int slot;
} graph_entry;

struct ferry_graph {
    ferry_tensor ** nodes;
    int n_nodes;
    size_t cap_nodes;
    ferry_tensor ** leafs;
    int n_leafs;
    size_t cap_leafs;
    graph_entry * table; /* capacity a power of two, at most half full */
    size_t table_cap, n_entries;
    int n_slots;
};

#define SLOT_VISITING (-1) /* on the build stack: its sources are being added */

static size_t hash_ptr(const void * p) {
    uintptr_t x = (uintptr_t) p;
    x ^= x >> 33;
    x *= (uintptr_t) 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t) x;
}

static graph_entry * table_find(const ferry_graph * g, const ferry_tensor * t) {
    if (!g->table_cap) {
        return NULL;
    }
    size_t i = hash_ptr(t) & (g->table_cap - 1);
    while (g->table[i].key) {
        if (g->table[i].key == t) {
            return &g->table[i];
        }
        i = (i + 1) & (g->table_cap - 1);
    }
    return NULL;
}

static void table_put(graph_entry * table, size_t cap, const ferry_tensor * t, int slot) {
    size_t i = hash_ptr(t) & (cap - 1);
    while (table[i].key) {
        i = (i + 1) & (cap - 1);
    }
    table[i] = (graph_entry) {t, slot};
}

/* Move the entries to a table of cap; drop_visiting cleans up after a failed build. */
static ferry_status table_rehash(ferry_graph * g, size_t cap, bool drop_visiting) {
    graph_entry * grown = ferry_calloc(cap, sizeof(*grown));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "graph: out of memory");
    }
    g->n_entries = 0;
    for (size_t i = 0; i < g->table_cap; i++) {
        if (g->table[i].key && !(drop_visiting && g->table[i].slot == SLOT_VISITING)) {
            table_put(grown, cap, g->table[i].key, g->table[i].slot);
            g->n_entries++;
        }
    }
    free(g->table);
    g->table = grown;
    g->table_cap = cap;
    return FERRY_OK;
}

/* A new entry for t, still visiting. */
static ferry_status table_add(ferry_graph * g, const ferry_tensor * t) {
    if (2 * (g->n_entries + 1) > g->table_cap) {
        FERRY_TRY(table_rehash(g, g->table_cap ? 2 * g->table_cap : 64, false));
    }
    table_put(g->table, g->table_cap, t, SLOT_VISITING);
    g->n_entries++;
    return FERRY_OK;
}

static ferry_status push(ferry_tensor *** list, int * n, size_t * cap, ferry_tensor * t) {
    ferry_tensor ** grown = ferry_grow(*list, cap, (size_t) *n + 1, sizeof(*grown));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "graph: out of memory");
    }
    *list = grown;
    (*list)[(*n)++] = t;
    return FERRY_OK;
}

ferry_status ferry_graph_new(ferry_graph ** out) {
    FERRY_CHECK_ARG(out, "graph_new: NULL output");
    return ferry_new_zeroed(sizeof(**out), "graph_new", (void **) out);
}

void ferry_graph_free(ferry_graph * graph) {
    if (!graph) {
        return;
    }
    free(graph->nodes);
    free(graph->leafs);
    free(graph->table);
    free(graph);
}

void ferry_graph_clear(ferry_graph * graph) {
    if (!graph) {
        return;
    }
    graph->n_nodes = graph->n_leafs = graph->n_slots = 0;
    graph->n_entries = 0;
    if (graph->table) {
        memset(graph->table, 0, graph->table_cap * sizeof(*graph->table));
    }
}

/* Append t after everything it depends on. Depth first with an explicit stack, so a
 * long chain cannot overflow the C stack. A tensor enters the table when pushed,
 * marked visiting until appended, so meeting a visiting tensor again is a cycle. */
ferry_status ferry_graph_build(ferry_graph * graph, ferry_tensor * t) {
    FERRY_CHECK_ARG(graph && t, "graph_build: NULL graph or tensor");
    if (table_find(graph, t)) {
        return FERRY_OK;
    }
    struct frame {
        ferry_tensor * t;
        int next_src; /* the source to visit next */
    } * stack = NULL;
    size_t depth = 0, cap = 0;
    ferry_status st = FERRY_OK;
    ferry_tensor * push_t = t;
    while (push_t || depth > 0) {
        if (push_t) {
            struct frame * grown = ferry_grow(stack, &cap, depth + 1, sizeof(*grown));
            if (!grown) {
                st = ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "graph_build: out of memory");
                break;
            }
            stack = grown;
            if ((st = table_add(graph, push_t)) != FERRY_OK) {
                break;
            }
            stack[depth++] = (struct frame) {push_t, 0};
            push_t = NULL;
            continue;
        }
        ferry_tensor * cur = stack[depth - 1].t;
        if (stack[depth - 1].next_src < FERRY_MAX_SRC) {
            ferry_tensor * s = cur->src[stack[depth - 1].next_src++];
            const graph_entry * e = s ? table_find(graph, s) : NULL;
            if (e && e->slot == SLOT_VISITING) {
                st = ferry_fail(FERRY_ERR_LAYOUT, "graph_build: '%s' depends on itself", s->name);
                break;
            }
            push_t = e ? NULL : s;
            continue;
        }
        depth--;
        st = cur->op == FERRY_OP_NONE ? push(&graph->leafs, &graph->n_leafs, &graph->cap_leafs, cur)
                                       : push(&graph->nodes, &graph->n_nodes, &graph->cap_nodes, cur);
        if (st != FERRY_OK) {
            break;
        }
        table_find(graph, cur)->slot = graph->n_slots++;
    }
    free(stack);
    if (st != FERRY_OK && table_rehash(graph, graph->table_cap, true) != FERRY_OK) {
        ferry_graph_clear(graph); /* cannot drop the half-visited entries: start empty */
    }
    return st;
}

/* Append t as a node without walking its sources: the scheduler's per-split graphs
 * hold only the nodes a backend computes, their sources living elsewhere. */
ferry_status ferry_graph_add_node(ferry_graph * graph, ferry_tensor * t) {
    FERRY_CHECK_ARG(graph && t, "graph_add_node: NULL graph or tensor");
    if (table_find(graph, t)) {
        return FERRY_OK;
    }
    FERRY_TRY(table_add(graph, t));
    FERRY_TRY(push(&graph->nodes, &graph->n_nodes, &graph->cap_nodes, t));
    table_find(graph, t)->slot = graph->n_slots++;
    return FERRY_OK;
}

int ferry_graph_n_nodes(const ferry_graph * graph) { return graph ? graph->n_nodes : 0; }
int ferry_graph_n_leafs(const ferry_graph * graph) { return graph ? graph->n_leafs : 0; }

ferry_tensor * ferry_graph_node(const ferry_graph * graph, int i) {
    return graph && i >= 0 && i < graph->n_nodes ? graph->nodes[i] : NULL;
}

ferry_tensor * ferry_graph_leaf(const ferry_graph * graph, int i) {
    return graph && i >= 0 && i < graph->n_leafs ? graph->leafs[i] : NULL;
}

int ferry_graph_n_slots(const ferry_graph * graph) { return graph ? graph->n_slots : 0; }

int ferry_graph_slot(const ferry_graph * graph, const ferry_tensor * t) {
    const graph_entry * e = graph && t ? table_find(graph, t) : NULL;
    return e ? e->slot : -1;
}

/* ---------------------------------------------------------------- flags */

ferry_status ferry_tensor_set_flags(ferry_tensor * t, int32_t flags) {
    FERRY_CHECK_ARG(t, "set_flags: NULL tensor");
    FERRY_CHECK_ARG((flags & ~(FERRY_TENSOR_FLAG_INPUT | FERRY_TENSOR_FLAG_OUTPUT)) == 0,
                    "set_flags: unknown flags 0x%x", (unsigned) flags);
    t->flags = flags;
    return FERRY_OK;
}

ferry_status ferry_tensor_set_input(ferry_tensor * t) {
    FERRY_CHECK_ARG(t, "set_input: NULL tensor");
    t->flags |= FERRY_TENSOR_FLAG_INPUT;
    return FERRY_OK;
}

ferry_status ferry_tensor_set_output(ferry_tensor * t) {
    FERRY_CHECK_ARG(t, "set_output: NULL tensor");
    t->flags |= FERRY_TENSOR_FLAG_OUTPUT;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- compute */

static ferry_status check_compute_tensor(ferry_backend * backend, const ferry_tensor * t) {
    FERRY_TRY(ferry_tensor_check_not_paged(t, "graph_compute"));
    FERRY_TRY(ferry_tensor_check_allocated(t));
    ferry_buffer * buf = ferry_tensor_buffer(t);
    if (!ferry_backend_supports_buft(backend, buf->buft)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "graph_compute: backend %s cannot use buffer type %s of '%s'",
                          ferry_backend_name(backend), ferry_buffer_type_name(buf->buft), t->name);
    }
    return FERRY_OK;
}

ferry_status ferry_backend_graph_compute(ferry_backend * backend, ferry_graph * graph) {
    FERRY_CHECK_ARG(backend && graph, "graph_compute: NULL backend or graph");
    for (int i = 0; i < graph->n_leafs; i++) {
        FERRY_TRY(check_compute_tensor(backend, graph->leafs[i]));
    }
    for (int i = 0; i < graph->n_nodes; i++) {
        const ferry_tensor * node = graph->nodes[i];
        FERRY_TRY(check_compute_tensor(backend, node));
        for (int j = 0; j < FERRY_MAX_SRC && node->src[j]; j++) { /* a kernel would read it at its strides */
            FERRY_TRY(ferry_tensor_check_not_paged(node->src[j], "graph_compute"));
        }
        if (!ferry_op_is_view(node->op) && !ferry_backend_supports_op(backend, node)) {
            return ferry_fail(FERRY_ERR_UNSUPPORTED, "graph_compute: backend %s does not support %s of '%s'",
                              ferry_backend_name(backend), ferry_op_name(node->op), node->name);
        }
    }
    if (!backend->iface.graph_compute) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "graph_compute: backend %s cannot compute graphs",
                          ferry_backend_name(backend));
    }
    return backend->iface.graph_compute(backend, graph);
}
