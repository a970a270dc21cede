/*
 * The scheduler: backends for nodes, splits, split inputs and their copies, and the
 * run. The copy of each input is ferry_copy_input, or ferry_copy_input_async on a copy
 * queue when it is prefetched (copy-path.c; which, when and the waits: sched-prefetch.c);
 * nothing else here moves bytes between backends.
 */
#include "sched-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One more element's room in an array (ferry_grow) */
#define RESERVE_ONE(items, capacity, count)                                                      \
    do {                                                                                         \
        void * grown_ = ferry_grow((items), &(capacity), (size_t) (count) + 1, sizeof(*(items))); \
        if (!grown_) {                                                                           \
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");                  \
        }                                                                                        \
        (items) = grown_;                                                                        \
    } while (0)

static void set_redirects(ferry_sched * s, bool on) {
    for (int i = 0; i < s->n_redirects; i++) {
        const redirect * r = &s->redirects[i];
        r->node->src[r->src] = on ? r->copy : r->original;
    }
}

/* Forget the last allocation (its copies, splits, graphs); the allocator's buffers stay. */
static void reset(ferry_sched * s) {
    ferry_sched_prefetch_reset(s);
    free(s->spans);
    free(s->fetches);
    s->spans = NULL;
    s->fetches = NULL;
    s->n_spans = 0;
    for (int i = 0; i < s->n_parts; i++) {
        ferry_graph_free(s->parts[i].graph);
    }
    free(s->parts);
    free(s->splits);
    free(s->backend_of);
    ferry_graph_free(s->alloc_graph);
    ferry_context_free(s->ctx);
    s->parts = NULL;
    s->splits = NULL;
    s->backend_of = NULL;
    s->alloc_graph = NULL;
    s->ctx = NULL;
    s->n_splits = s->n_parts = s->n_inputs = s->n_redirects = 0;
    s->graph = NULL;
    s->graph_nodes = 0;
}

ferry_status ferry_sched_new(ferry_backend * const * backends, int n_backends, ferry_sched ** out) {
    FERRY_CHECK_ARG(backends && out, "sched_new: NULL argument");
    if (n_backends < 1 || n_backends > FERRY_SCHED_MAX_BACKENDS) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "sched_new: %d backends (1..%d)", n_backends, FERRY_SCHED_MAX_BACKENDS);
    }
    ferry_buffer_type * bufts[FERRY_SCHED_MAX_BACKENDS];
    for (int i = 0; i < n_backends; i++) {
        FERRY_CHECK_ARG(backends[i], "sched_new: backend %d is NULL", i);
        bufts[i] = ferry_backend_default_buffer_type(backends[i]);
    }
    ferry_sched * s = ferry_calloc(1, sizeof(*s));
    if (!s) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched_new: out of memory");
    }
    memcpy(s->backends, backends, (size_t) n_backends * sizeof(*backends));
    s->n_backends = n_backends;
    s->policy = FERRY_COPY_FLAT;
    const ferry_status st = ferry_gallocr_new_n(bufts, n_backends, &s->galloc);
    if (st != FERRY_OK) {
        free(s);
        return st;
    }
    *out = s;
    return FERRY_OK;
}

void ferry_sched_free(ferry_sched * s) {
    if (!s) {
        return;
    }
    reset(s);
    ferry_gallocr_free(s->galloc);
    free(s->inputs);
    free(s->redirects);
    free(s->assignments);
    free(s);
}

ferry_status ferry_sched_set_policy(ferry_sched * s, ferry_copy_policy policy) {
    FERRY_CHECK_ARG(s, "sched_set_policy: NULL scheduler");
    if (ferry_copy_policy_name(policy) == NULL) {
        return ferry_last_status();
    }
    if (policy == s->policy) {
        return FERRY_OK;
    }
    s->policy = policy;
    /* a copy ahead went by the old policy's route: the next run copies by the new one */
    return ferry_sched_prefetch_drop_ahead(s);
}

ferry_copy_policy ferry_sched_get_policy(const ferry_sched * s) { return s ? s->policy : FERRY_COPY_FLAT; }

ferry_status ferry_sched_set_compact(ferry_sched * s, bool compact) {
    FERRY_CHECK_ARG(s, "sched_set_compact: NULL scheduler");
    s->compact = compact;
    s->graph = NULL; /* the copies change layout: allocate again at the next compute */
    return FERRY_OK;
}

bool ferry_sched_get_compact(const ferry_sched * s) { return s && s->compact; }

ferry_status ferry_sched_set_prefetch(ferry_sched * s, int n_parts) {
    FERRY_CHECK_ARG(s, "sched_set_prefetch: NULL scheduler");
    FERRY_CHECK_ARG(n_parts >= 0, "sched_set_prefetch: %d parts ahead (0 or more)", n_parts);
    FERRY_CHECK_ARG(n_parts > 0 || !s->prefetch_next,
                    "sched_set_prefetch: 0 with prefetch across runs on: turn that off first "
                    "(ferry_sched_set_prefetch_next)");
    s->prefetch = n_parts;
    s->graph = NULL; /* the copies' places change: allocate again at the next compute */
    return FERRY_OK;
}

int ferry_sched_get_prefetch(const ferry_sched * s) { return s ? s->prefetch : 0; }

ferry_status ferry_sched_set_prefetch_next(ferry_sched * s, bool on) {
    FERRY_CHECK_ARG(s, "sched_set_prefetch_next: NULL scheduler");
    FERRY_CHECK_ARG(!on || s->prefetch > 0,
                    "sched_set_prefetch_next: prefetch is 0, and only a prefetching run queues the next run's "
                    "copies: set a prefetch of 1 or more first (ferry_sched_set_prefetch)");
    if (on != s->prefetch_next) {
        s->prefetch_next = on;
        s->graph = NULL; /* the first part's copies keep their memory: allocate again at the next compute */
    }
    return FERRY_OK;
}

bool ferry_sched_get_prefetch_next(const ferry_sched * s) { return s && s->prefetch_next; }

ferry_status ferry_sched_truncate(ferry_sched * s, int64_t stream, int64_t length) {
    FERRY_CHECK_ARG(s, "sched_truncate: NULL scheduler");
    return ferry_sched_prefetch_truncate(s, stream, length);
}

ferry_status ferry_sched_drop_ahead(ferry_sched * s) {
    FERRY_CHECK_ARG(s, "sched_drop_ahead: NULL scheduler");
    return ferry_sched_prefetch_drop_ahead(s);
}

ferry_status ferry_sched_set_keep_inputs(ferry_sched * s, bool keep) {
    FERRY_CHECK_ARG(s, "sched_set_keep_inputs: NULL scheduler");
    FERRY_TRY(ferry_gallocr_set_keep_inputs(s->galloc, keep));
    s->graph = NULL; /* the copies' lifetimes change: allocate again at the next compute */
    return FERRY_OK;
}

bool ferry_sched_get_keep_inputs(const ferry_sched * s) { return s && ferry_gallocr_get_keep_inputs(s->galloc); }

static int backend_index(const ferry_sched * s, const ferry_backend * backend) {
    for (int i = 0; i < s->n_backends; i++) {
        if (s->backends[i] == backend) {
            return i;
        }
    }
    return -1;
}

bool ferry_sched_has_backend(const ferry_sched * s, const ferry_backend * backend) {
    return s && backend && backend_index(s, backend) >= 0;
}

ferry_status ferry_sched_set_tensor_backend(ferry_sched * s, ferry_tensor * node, ferry_backend * backend) {
    FERRY_CHECK_ARG(s && node && backend, "sched_set_tensor_backend: NULL argument");
    const int b = backend_index(s, backend);
    if (b < 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "sched_set_tensor_backend: backend %s is not one of the scheduler's",
                          ferry_backend_name(backend));
    }
    for (int i = 0; i < s->n_assignments; i++) {
        if (s->assignments[i].tensor == node) {
            s->assignments[i].backend = b;
            return FERRY_OK;
        }
    }
    RESERVE_ONE(s->assignments, s->assignments_capacity, s->n_assignments);
    s->assignments[s->n_assignments++] = (assignment) {node, b};
    return FERRY_OK;
}

void ferry_sched_clear_assignments(ferry_sched * s) {
    if (s) {
        s->n_assignments = 0;
    }
}

int ferry_sched_n_assigned(const ferry_sched * s) { return s ? s->n_assignments : 0; }

static int pinned_backend(const ferry_sched * s, const ferry_tensor * t) {
    for (int i = 0; i < s->n_assignments; i++) {
        if (s->assignments[i].tensor == t) {
            return s->assignments[i].backend;
        }
    }
    return -1;
}

/* The first backend that can use a buffer type. */
static int backend_for_buft(const ferry_sched * s, ferry_buffer_type * buft) {
    for (int i = 0; i < s->n_backends; i++) {
        if (ferry_backend_supports_buft(s->backends[i], buft)) {
            return i;
        }
    }
    return -1;
}

/* Where a source's bytes will be: the buffer type of its memory, or of the backend that
 * computes it; NULL for a leaf with no memory yet (it goes where it is first used). */
static ferry_buffer_type * source_buft(const ferry_sched * s, const ferry_tensor * src) {
    const ferry_tensor * root = src->view_src ? src->view_src : src;
    const int slot = ferry_graph_slot(s->graph, root);
    if (root->op != FERRY_OP_NONE && slot >= 0 && s->backend_of[slot] >= 0) {
        return ferry_backend_default_buffer_type(s->backends[s->backend_of[slot]]);
    }
    if (root->buffer && ferry_buffer_id_is_live(root->buffer_id)) {
        return ferry_buffer_get_type(root->buffer);
    }
    return NULL;
}

static ferry_status assign_node(ferry_sched * s, ferry_tensor * node, int * out) {
    int b = pinned_backend(s, node);
    if (b >= 0) {
        *out = b;
        return FERRY_OK;
    }
    if (ferry_op_is_view(node->op)) {
        const ferry_tensor * root = node->view_src;
        const int slot = root ? ferry_graph_slot(s->graph, root) : -1;
        if (root && root->op != FERRY_OP_NONE && slot >= 0) {
            *out = s->backend_of[slot];
        } else if (root && root->buffer) {
            *out = backend_for_buft(s, ferry_buffer_get_type(root->buffer));
        } else {
            *out = -1; /* a view of a leaf with no memory: follows its consumer */
        }
        return FERRY_OK;
    }
    int first_supporting = -1;
    for (b = 0; b < s->n_backends; b++) {
        if (!ferry_backend_supports_op(s->backends[b], node)) {
            continue;
        }
        if (first_supporting < 0) {
            first_supporting = b;
        }
        bool uses_all = true;
        for (int j = 0; j < FERRY_MAX_SRC && node->src[j] && uses_all; j++) {
            ferry_buffer_type * buft = source_buft(s, node->src[j]);
            uses_all = buft == NULL || ferry_backend_supports_buft(s->backends[b], buft);
        }
        if (uses_all) {
            *out = b;
            return FERRY_OK;
        }
    }
    if (first_supporting < 0) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "sched: no backend supports %s of '%s'", ferry_op_name(node->op),
                          node->name);
    }
    *out = first_supporting;
    return FERRY_OK;
}

/* The copy split `split` already has of src, or NULL. */
static ferry_tensor * existing_copy(const ferry_sched * s, int split, const ferry_tensor * src) {
    for (int i = s->splits[split].first_input; i < s->n_inputs; i++) {
        if (s->inputs[i].src == src) {
            return s->inputs[i].copy;
        }
    }
    return NULL;
}

/* Must a node on backend read src through a copy? When src lives where backend cannot read it, or
 * is a paged window, whose cells are gathered into a dense copy wherever the split runs. */
static bool copied_in(const ferry_sched * s, ferry_backend * backend, const ferry_tensor * src) {
    ferry_buffer_type * buft = source_buft(s, src);
    return buft && (src->paged || !ferry_backend_supports_buft(backend, buft));
}

/* Does node, on split's backend, read a source the split has no copy of yet? */
static bool needs_new_input(const ferry_sched * s, int split, const ferry_tensor * node) {
    for (int j = 0; j < FERRY_MAX_SRC && node->src[j]; j++) {
        if (copied_in(s, s->splits[split].backend, node->src[j]) && !existing_copy(s, split, node->src[j])) {
            return true;
        }
    }
    return false;
}

typedef struct {
    char s[FERRY_MAX_NAME];
} name_buf;

/* "<src name, at most 50 bytes>#<backend name>", cut to FERRY_MAX_NAME - 1 bytes: what
 * snprintf("%.50s#%s") makes, without its cost (an alloc names a copy per input). */
static name_buf copy_name(const char * src, const char * backend) {
    name_buf out;
    size_t n = strnlen(src, 50);
    memcpy(out.s, src, n);
    out.s[n++] = '#';
    const size_t room = sizeof(out.s) - 1 - n, b = strnlen(backend, room);
    memcpy(out.s + n, backend, b);
    out.s[n + b] = '\0';
    return out;
}

/* The copy of src for split `split`, made once however many of its nodes read src. */
static ferry_status input_copy(ferry_sched * s, int split, ferry_tensor * src, ferry_tensor ** out) {
    if ((*out = existing_copy(s, split, src)) != NULL) {
        return FERRY_OK;
    }
    RESERVE_ONE(s->inputs, s->inputs_capacity, s->n_inputs);
    ferry_tensor * copy;
    FERRY_TRY(s->compact ? ferry_tensor_compact_layout(s->ctx, src, &copy) : ferry_tensor_dup_layout(s->ctx, src, &copy));
    ferry_tensor_set_name(copy, copy_name(src->name, ferry_backend_name(s->splits[split].backend)).s);
    ferry_tensor_set_input(copy);
    s->inputs[s->n_inputs++] = (ferry_sched_input_info) {.split = split, .src = src, .copy = copy};
    s->splits[split].n_inputs++;
    s->parts[s->n_parts - 1].n_inputs++;
    *out = copy;
    return FERRY_OK;
}

/* A new part of the last split, from node i. */
static ferry_status new_part(ferry_sched * s, int i) {
    s->parts[s->n_parts] =
        (part) {.split = s->n_splits - 1, .first_node = i, .first_input = s->n_inputs, .last_prefetched = -1};
    FERRY_TRY(ferry_graph_new(&s->parts[s->n_parts].graph));
    s->n_parts++;
    return FERRY_OK;
}

/* Splits: runs of computing nodes on one backend; each source it cannot use becomes an
 * input. A split's nodes run in parts, a new one where a node first reads an input. */
static ferry_status build_splits(ferry_sched * s) {
    const int n = ferry_graph_n_nodes(s->graph);
    s->splits = ferry_calloc((size_t) n + 1, sizeof(*s->splits));
    s->parts = ferry_calloc((size_t) n + 1, sizeof(*s->parts));
    if (!s->splits || !s->parts) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int i = 0; i < n; i++) {
        ferry_tensor * node = ferry_graph_node(s->graph, i);
        if (ferry_op_is_view(node->op)) {
            continue;
        }
        const int b = s->backend_of[ferry_graph_slot(s->graph, node)];
        if (s->n_splits == 0 || s->splits[s->n_splits - 1].backend != s->backends[b]) {
            ferry_sched_split_info * sp = &s->splits[s->n_splits];
            *sp = (ferry_sched_split_info) {.backend = s->backends[b], .first_node = i, .first_input = s->n_inputs};
            s->n_splits++;
            FERRY_TRY(new_part(s, i));
        } else if (needs_new_input(s, s->n_splits - 1, node)) {
            FERRY_TRY(new_part(s, i));
        }
        const int split = s->n_splits - 1;
        ferry_backend * backend = s->backends[b];
        FERRY_TRY(ferry_graph_add_node(s->parts[s->n_parts - 1].graph, node));
        s->splits[split].n_nodes++;
        for (int j = 0; j < FERRY_MAX_SRC && node->src[j]; j++) {
            if (!copied_in(s, backend, node->src[j])) {
                continue;
            }
            ferry_tensor * copy;
            FERRY_TRY(input_copy(s, split, node->src[j], &copy));
            RESERVE_ONE(s->redirects, s->redirects_capacity, s->n_redirects);
            s->redirects[s->n_redirects++] = (redirect) {node, j, node->src[j], copy};
        }
    }
    return FERRY_OK;
}

/* The node of the allocator's graph that part p begins with. */
static int part_first_node(const ferry_sched * s, int p, int n_nodes) {
    const ferry_tensor * first = ferry_graph_node(s->graph, s->parts[p].first_node);
    int node = s->parts[p].first_node;
    if (ferry_graph_node(s->alloc_graph, node) != first) { /* the same order, but do not rely on it */
        for (node = 0; node < n_nodes && ferry_graph_node(s->alloc_graph, node) != first; node++) {
        }
    }
    return node;
}

/* Place copies and outputs: the graph with sources redirected, each tensor on its backend's buffer type. */
static ferry_status allocate(ferry_sched * s) {
    FERRY_TRY(ferry_graph_new(&s->alloc_graph));
    const int n = ferry_graph_n_nodes(s->graph);
    for (int i = 0; i < n; i++) {
        FERRY_TRY(ferry_graph_build(s->alloc_graph, ferry_graph_node(s->graph, i)));
    }
    const int n_nodes = ferry_graph_n_nodes(s->alloc_graph), n_leafs = ferry_graph_n_leafs(s->alloc_graph);
    int * node_ids = ferry_calloc((size_t) n_nodes + 1, sizeof(int));
    int * leaf_ids = ferry_calloc((size_t) n_leafs + 1, sizeof(int));
    if (!node_ids || !leaf_ids) {
        free(node_ids);
        free(leaf_ids);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int i = 0; i < n_nodes; i++) {
        const int slot = ferry_graph_slot(s->graph, ferry_graph_node(s->alloc_graph, i));
        node_ids[i] = slot >= 0 && s->backend_of[slot] >= 0 ? s->backend_of[slot] : 0;
    }
    /* Leafs: a copy goes on its split's backend; a leaf without memory on its first consumer's
     * (the first whose backend is not 0). One pass over the inputs and one over the nodes'
     * sources, leafs found by slot. */
    const int n_slots = ferry_graph_n_slots(s->alloc_graph);
    int * leaf_of = ferry_malloc(((size_t) n_slots + 1) * sizeof(int)); /* slot -> leaf index, -1 for a node */
    if (!leaf_of) {
        free(node_ids);
        free(leaf_ids);
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int i = 0; i < n_slots; i++) {
        leaf_of[i] = -1;
    }
    for (int i = 0; i < n_leafs; i++) {
        leaf_of[ferry_graph_slot(s->alloc_graph, ferry_graph_leaf(s->alloc_graph, i))] = i;
    }
    for (int k = 0; k < s->n_inputs; k++) {
        const int slot = ferry_graph_slot(s->alloc_graph, s->inputs[k].copy);
        if (slot >= 0 && leaf_of[slot] >= 0) {
            leaf_ids[leaf_of[slot]] = backend_index(s, s->splits[s->inputs[k].split].backend);
        }
    }
    for (int k = 0; k < n_nodes; k++) {
        const ferry_tensor * node = ferry_graph_node(s->alloc_graph, k);
        for (int j = 0; j < FERRY_MAX_SRC && node->src[j]; j++) {
            const ferry_tensor * read[2] = {node->src[j], node->src[j]->view_src};
            for (int r = 0; r < 2; r++) {
                const int slot = read[r] ? ferry_graph_slot(s->alloc_graph, read[r]) : -1;
                const int i = slot >= 0 ? leaf_of[slot] : -1;
                if (i >= 0 && !read[r]->buffer && leaf_ids[i] == 0) {
                    leaf_ids[i] = node_ids[k];
                }
            }
        }
    }
    free(leaf_of);
    /* Each copy is written as its part begins, from its source, which lives until then; a
     * prefetched one as the part `prefetch` before begins, and its memory is its own from then;
     * one copied ahead for the next run, for the whole run and after. */
    ferry_gallocr_copy * copies = ferry_calloc((size_t) s->n_inputs + 1, sizeof(*copies));
    ferry_status st = copies ? FERRY_OK : ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    for (int p = 0; p < s->n_parts && st == FERRY_OK; p++) {
        for (int k = s->parts[p].first_input; k < s->parts[p].first_input + s->parts[p].n_inputs; k++) {
            const int issued = s->queue_of && s->queue_of[k] ? (p > s->prefetch ? p - s->prefetch : 0) : p;
            copies[k] = (ferry_gallocr_copy) {.copy = s->inputs[k].copy,
                                              .src = s->inputs[k].src,
                                              .node = part_first_node(s, issued, n_nodes),
                                              .kept = s->ahead && s->ahead[k].carried};
        }
    }
    if (st == FERRY_OK) {
        st = ferry_gallocr_reserve_copies(s->galloc, s->alloc_graph, node_ids, leaf_ids, copies, s->n_inputs);
    }
    if (st == FERRY_OK) {
        st = ferry_gallocr_place_reserved(s->galloc); /* just measured: no second walk */
    }
    free(copies);
    free(node_ids);
    free(leaf_ids);
    return st;
}

ferry_status ferry_sched_alloc_graph(ferry_sched * s, ferry_graph * graph) {
    FERRY_CHECK_ARG(s && graph, "sched_alloc_graph: NULL argument");
    reset(s);
    s->graph = graph;
    s->graph_nodes = ferry_graph_n_nodes(graph);
    const int n_slots = ferry_graph_n_slots(graph);
    s->backend_of = ferry_malloc(((size_t) n_slots + 1) * sizeof(int));
    ferry_status st = FERRY_OK;
    if (!s->backend_of || ferry_context_new(&s->ctx) != FERRY_OK) {
        st = ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    for (int i = 0; st == FERRY_OK && i < n_slots; i++) {
        s->backend_of[i] = -1;
    }
    for (int i = 0; st == FERRY_OK && i < s->graph_nodes; i++) {
        ferry_tensor * node = ferry_graph_node(graph, i);
        st = assign_node(s, node, &s->backend_of[ferry_graph_slot(graph, node)]);
    }
    if (st == FERRY_OK) {
        st = build_splits(s);
    }
    if (st == FERRY_OK) {
        st = ferry_sched_prefetch_choose(s);
    }
    if (st == FERRY_OK) {
        set_redirects(s, true);
        st = allocate(s);
        set_redirects(s, false);
    }
    if (st == FERRY_OK) {
        st = ferry_sched_prefetch_prepare(s);
    }
    if (st == FERRY_OK) { /* the timeline's room: each part's compute and wait, each input's copy, copy ahead
                           * and fetch's wait; and each input's fetch */
        s->spans = ferry_calloc(2 * (size_t) s->n_parts + 3 * (size_t) s->n_inputs + 1, sizeof(*s->spans));
        s->fetches = ferry_calloc((size_t) s->n_inputs + 1, sizeof(*s->fetches));
        st = s->spans && s->fetches ? FERRY_OK : ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "sched: out of memory");
    }
    if (st != FERRY_OK) {
        reset(s);
    }
    return st;
}

bool ferry_sched_needs_alloc(const ferry_sched * s, const ferry_graph * graph) {
    return s && graph && (s->graph != graph || s->graph_nodes != ferry_graph_n_nodes(graph));
}

/* Does the host hold t's values now, before the run: written by the caller (a leaf, or a view of
 * one), in memory it reads by pointer? A node's value exists only once the run made it. */
static bool known_before_run(const ferry_tensor * t) {
    const ferry_tensor * root = t->view_src ? t->view_src : t;
    if (root->op != FERRY_OP_NONE) {
        return false;
    }
    if (ferry_tensor_check_allocated(t) != FERRY_OK) {
        ferry_clear_error();
        return false;
    }
    const ferry_buffer * buf = ferry_tensor_buffer(t);
    return ferry_buffer_is_host(buf) && !ferry_buffer_is_synthetic(buf);
}

/* Every input's lengths, before the run moves a byte of any (ferry_check_used_lengths): a length
 * refused at the second window's copy would leave the first's moved. A copy held ahead is
 * completed by the ragged route, which reads the lengths whatever the policy. So too each
 * attention's lengths against its query tokens (ferry_attn_check_lengths), and a paged one's table
 * entries (ferry_attn_paged_check), where the host holds them now: its kernel would refuse them
 * only after the copies (the CUDA one cannot at all). */
static ferry_status check_lengths(const ferry_sched * s) {
    for (int k = 0; k < s->n_inputs; k++) {
        const bool must_read = s->policy == FERRY_COPY_RAGGED || (s->ahead && s->ahead[k].queued);
        FERRY_TRY(ferry_check_used_lengths(s->inputs[k].src, must_read, "sched_graph_compute: the copy"));
    }
    for (int i = 0; i < s->graph_nodes; i++) {
        const ferry_tensor * node = ferry_graph_node(s->graph, i);
        const bool attn = node->op == FERRY_OP_ATTN_DECODE || node->op == FERRY_OP_ATTN_PAGED;
        if (!attn || !known_before_run(node->src[3])) {
            continue;
        }
        if (node->op == FERRY_OP_ATTN_PAGED && known_before_run(node->src[4])) { /* its table's entries too */
            FERRY_TRY(ferry_attn_paged_check(node, ferry_tensor_data(node->src[3]), ferry_tensor_data(node->src[4])));
        } else {
            FERRY_TRY(ferry_attn_check_lengths(node, "sched_graph_compute: attention"));
        }
    }
    return FERRY_OK;
}

ferry_status ferry_sched_graph_compute(ferry_sched * s, ferry_graph * graph) {
    FERRY_CHECK_ARG(s && graph, "sched_graph_compute: NULL argument");
    if (ferry_sched_needs_alloc(s, graph)) {
        FERRY_TRY(ferry_sched_alloc_graph(s, graph));
    }
    FERRY_TRY(check_lengths(s));
    memset(&s->stats, 0, sizeof(s->stats));
    s->n_spans = 0;
    s->run_start = ferry_now_seconds();
    s->stats.n_inputs = (uint64_t) s->n_inputs;
    s->stats.ahead_inputs = s->ahead_inputs;
    s->stats.ahead_bytes = s->ahead_bytes;
    ferry_status st = FERRY_OK;
    set_redirects(s, true);
    for (int i = 0; i < s->n_splits; i++) {
        s->splits[i].compute_seconds = 0;
    }
    /* Part by part: its inputs are copied once the parts before have run (and freed memory);
     * prefetched ones were queued `prefetch` parts before, and its compute waits for them. The
     * parts ahead are queued after this part's own copies: queued first, they would take the
     * link (one per direction, as a copy engine is) before a copy this part needs now. */
    int queued = 0;
    s->fetch_next = 0;
    for (int p = 0; p < s->n_parts && st == FERRY_OK; p++) {
        ferry_sched_split_info * sp = &s->splits[s->parts[p].split];
        /* A remote tier's fetches, a part ahead of the copies they feed (those of part p + prefetch
         * are queued at this part): each travels under the compute of the part before. */
        st = ferry_sched_fetch_begin(s, s->prefetch ? p + s->prefetch + 1 : p);
        if (st == FERRY_OK && s->queue_of) {
            st = ferry_sched_prefetch_queue(s, p, &queued); /* the first part's share of its own */
        }
        for (int k = s->parts[p].first_input; k < s->parts[p].first_input + s->parts[p].n_inputs && st == FERRY_OK;
             k++) {
            ferry_sched_input_info * in = &s->inputs[k];
            if (s->queue_of && s->queue_of[k]) {
                continue;
            }
            st = ferry_sched_fetch_wait(s, p, k);
            const double t0 = ferry_now_seconds();
            st = st == FERRY_OK ? ferry_copy_input(sp->backend, s->policy, in->src, in->copy, &in->stats) : st;
            if (st == FERRY_OK) {
                ferry_sched_add_input_stats(&s->stats, &in->stats);
                ferry_sched_note_staging(s, sp->backend, &in->stats);
                ferry_sched_add_span(s, FERRY_SPAN_COPY, p, k, t0, ferry_now_seconds());
            }
        }
        if (st == FERRY_OK && s->queue_of) {
            st = ferry_sched_prefetch_queue(s, p + s->prefetch, &queued);
        }
        if (st == FERRY_OK && p == s->ahead_part) {
            st = ferry_sched_prefetch_queue_ahead(s); /* the next run's first part, under the parts left */
        }
        if (st == FERRY_OK) {
            st = ferry_sched_prefetch_wait(s, p);
        }
        if (st == FERRY_OK) {
            const double t0 = ferry_now_seconds();
            st = ferry_backend_graph_compute(sp->backend, s->parts[p].graph);
            if (st == FERRY_OK) {
                st = ferry_backend_synchronize(sp->backend);
            }
            const double t1 = ferry_now_seconds();
            sp->compute_seconds += t1 - t0;
            s->stats.compute_seconds += t1 - t0;
            ferry_sched_add_span(s, FERRY_SPAN_COMPUTE, p, -1, t0, t1);
        }
    }
    if (st != FERRY_OK) {
        ferry_sched_fetch_abandon(s);
    }
    if (s->queue_of) {
        const ferry_status fin = ferry_sched_prefetch_finish(s, queued, st == FERRY_OK);
        st = st == FERRY_OK ? fin : st;
    }
    set_redirects(s, false);
    return st;
}

ferry_backend * ferry_sched_get_tensor_backend(const ferry_sched * s, const ferry_tensor * t) {
    if (!s || !t || !s->graph) {
        return NULL;
    }
    const int slot = ferry_graph_slot(s->graph, t);
    return slot >= 0 && s->backend_of[slot] >= 0 ? s->backends[s->backend_of[slot]] : NULL;
}

ferry_status ferry_sched_trace(const ferry_sched * s, ferry_sched_span * spans, size_t max, size_t * n) {
    FERRY_CHECK_ARG(s && n, "sched_trace: NULL argument");
    *n = s->n_spans;
    if (spans && s->n_spans > max) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_trace: %zu spans, room for %zu", s->n_spans, max);
    }
    if (spans && s->n_spans) {
        memcpy(spans, s->spans, s->n_spans * sizeof(*spans));
    }
    return FERRY_OK;
}

int ferry_sched_n_splits(const ferry_sched * s) { return s ? s->n_splits : 0; }
int ferry_sched_n_inputs(const ferry_sched * s) { return s ? s->n_inputs : 0; }

ferry_status ferry_sched_split(const ferry_sched * s, int i, ferry_sched_split_info * out) {
    FERRY_CHECK_ARG(s && out, "sched_split: NULL argument");
    if (i < 0 || i >= s->n_splits) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_split: split %d of %d", i, s->n_splits);
    }
    *out = s->splits[i];
    return FERRY_OK;
}

ferry_status ferry_sched_input(const ferry_sched * s, int i, ferry_sched_input_info * out) {
    FERRY_CHECK_ARG(s && out, "sched_input: NULL argument");
    if (i < 0 || i >= s->n_inputs) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "sched_input: input %d of %d", i, s->n_inputs);
    }
    *out = s->inputs[i];
    return FERRY_OK;
}

ferry_status ferry_sched_get_stats(const ferry_sched * s, ferry_sched_stats * out) {
    FERRY_CHECK_ARG(s && out, "sched_get_stats: NULL argument");
    *out = s->stats;
    return FERRY_OK;
}

size_t ferry_sched_buffer_size(const ferry_sched * s, const ferry_backend * backend) {
    const int b = s && backend ? backend_index(s, backend) : -1;
    return b >= 0 ? ferry_gallocr_buffer_size(s->galloc, b) + s->staging[b] : 0;
}

void ferry_sched_note_staging(ferry_sched * s, const ferry_backend * backend, const ferry_copy_stats * in) {
    if (in->gather != FERRY_GATHER_MERGED) { /* the copy path's usual case: nothing staged, no lookup */
        return;
    }
    const int b = backend_index(s, backend); /* a split's: one of the scheduler's */
    const size_t staged = (size_t) in->bytes_copied;
    s->staging[b] = staged > s->staging[b] ? staged : s->staging[b];
}
