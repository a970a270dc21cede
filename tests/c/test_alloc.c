/*
 * The graph allocator, one test per scenario. Each scenario runs twice on the dummy
 * backend, with synthetic addresses and with real memory (where it also computes the
 * graph), and each run checks the same invariants (verify below):
 *   - every leaf and node is allocated;
 *   - no two tensors that are live at the same time share a byte (alloc-check.h: a
 *     tensor lives from its node, or before the graph for an input, to its last
 *     reader's, through any view; outputs, unread results and kept inputs to the end),
 *     the one exception being a node that works in place on its source's last use;
 *   - each tensor lies inside its chunk, and inside the max size unless it is larger
 *     than the max size (then it starts its own chunk);
 *   - every offset is aligned, and the total allocated is within the scenario's bound.
 * The scenarios written when inputs lived to the end keep them (SCENARIO_KEEP): what
 * they test is chunks and best fit, not when inputs die.
 * random_graphs_no_overlap checks the same rule on fixed-seed random graphs, and that
 * they compute what they compute with every tensor in memory of its own.
 */
#include "alloc-check.h"
#include "alloc-impl.h"
#include "check.h"

#include <stdint.h>

#define KB ((size_t) 1024)
#define F32_PER_KB 256


typedef struct {
    bool real;
    ferry_backend * be;
    ferry_backend * be2; /* a second buffer type, for the scenarios that want one */
    ferry_context * ctx;
    ferry_graph * g;
    ferry_gallocr * ga;
    ferry_buffer * outside; /* memory the test gives a tensor itself */
} fx;

static ferry_status dummy(bool real, size_t align, size_t max, ferry_backend ** out) {
    ferry_dummy_params p = ferry_dummy_default_params();
    p.alignment = align;
    p.max_buffer_size = max;
    p.real_memory = real;
    return ferry_dummy_backend_new(&p, out);
}

static bool fx_init(fx * f, bool real, size_t align, size_t max) {
    *f = (fx) {.real = real};
    return dummy(real, align, max, &f->be) == FERRY_OK && ferry_context_new(&f->ctx) == FERRY_OK &&
           ferry_graph_new(&f->g) == FERRY_OK &&
           ferry_gallocr_new(ferry_backend_default_buffer_type(f->be), &f->ga) == FERRY_OK;
}

static void fx_free(fx * f) {
    ferry_gallocr_free(f->ga);
    ferry_buffer_free(f->outside);
    ferry_graph_free(f->g);
    ferry_context_free(f->ctx);
    ferry_backend_free(f->be2);
    ferry_backend_free(f->be);
}

/* An f32 vector of kb kilobytes, or n floats. */
static ferry_tensor * vec_n(fx * f, int64_t n, const char * name) {
    ferry_tensor * t = NULL;
    if (ferry_tensor_new(f->ctx, FERRY_TYPE_F32, 1, &n, &t) == FERRY_OK) {
        ferry_tensor_set_name(t, name);
    }
    return t;
}

static ferry_tensor * input_kb(fx * f, int64_t kb, const char * name) {
    ferry_tensor * t = vec_n(f, kb * F32_PER_KB, name);
    if (t) {
        ferry_tensor_set_input(t);
    }
    return t;
}

static ferry_tensor * named(ferry_tensor * t, const char * name) {
    if (t) {
        ferry_tensor_set_name(t, name);
    }
    return t;
}

static ferry_tensor * out(ferry_tensor * t) {
    if (t) {
        ferry_tensor_set_output(t);
    }
    return t;
}

static size_t offset_in(const ferry_tensor * t) {
    return (size_t) ((uintptr_t) t->data - (uintptr_t) ferry_buffer_base(t->buffer));
}

/* The invariants of the header; copies: the scheduler's, placed at their nodes (may be NULL). */
static void verify_copies(fx * f, size_t bound, const ferry_gallocr_copy * copies, int n_copies) {
    ferry_graph * g = f->g;
    const int n_nodes = ferry_graph_n_nodes(g), n_leafs = ferry_graph_n_leafs(g);
    for (int i = 0; i < n_leafs + n_nodes; i++) {
        const ferry_tensor * t = i < n_leafs ? ferry_graph_leaf(g, i) : ferry_graph_node(g, i - n_leafs);
        if (ferry_tensor_check_allocated(t) != FERRY_OK) {
            fprintf(stderr, "'%s' is not allocated: %s\n", t->name, ferry_last_error());
            CHECK(!"every tensor allocated");
        }
    }
    lt_tensor * lt = lt_from_ferry(g);
    CHECK(lt);
    for (int k = 0; k < n_copies; k++) {
        lt[ferry_graph_slot(g, copies[k].copy)].written = copies[k].node;
        const int src = copies[k].src ? ferry_graph_slot(g, ferry_tensor_root(copies[k].src)) : -1;
        if (src >= 0) {
            lt[src].read_at = copies[k].node;
        }
    }
    const int overlaps = lt_check_overlaps(lt, ferry_graph_n_slots(g), n_nodes, ferry_gallocr_get_keep_inputs(f->ga),
                                           stderr);
    free(lt);
    CHECK_EQ_U(overlaps, 0);
    for (int i = 0; i < n_leafs + n_nodes; i++) {
        const ferry_tensor * x = i < n_leafs ? ferry_graph_leaf(g, i) : ferry_graph_node(g, i - n_leafs);
        if (x->view_src || (f->outside && x->buffer == f->outside)) {
            continue;
        }
        const ferry_buffer_type * buft = ferry_buffer_get_type(x->buffer);
        const size_t off = offset_in(x), size = ferry_tensor_nbytes(x);
        const size_t max = ferry_buffer_type_max_size(buft), align = ferry_buffer_type_alignment(buft);
        if (off % align != 0 || off + size > ferry_buffer_size(x->buffer) ||
            (size <= max ? off + size > max : off != 0)) {
            fprintf(stderr, "'%s' at %zu (+%zu) in a %zu-byte chunk, max %zu, alignment %zu\n", x->name, off, size,
                    ferry_buffer_size(x->buffer), max, align);
            CHECK(!"inside its chunk, aligned");
        }
    }
    size_t total = ferry_gallocr_buffer_size(f->ga, 0) + ferry_gallocr_buffer_size(f->ga, 1);
    if (total > bound) {
        fprintf(stderr, "allocated %zu bytes, the bound is %zu\n", total, bound);
    }
    CHECK(total <= bound);
}

static void verify(fx * f, size_t bound) { verify_copies(f, bound, NULL, 0); }

/* Reserve, allocate, verify; with real memory also compute (one buffer type only). */
static void alloc_verify(fx * f, size_t bound) {
    CHECK_OK(ferry_gallocr_reserve(f->ga, f->g, NULL, NULL));
    CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g));
    SUB(verify(f, bound));
    if (f->real) {
        for (int c = 0; c < ferry_gallocr_n_chunks(f->ga, 0); c++) {
            CHECK_OK(ferry_buffer_clear(ferry_gallocr_chunk_buffer(f->ga, 0, c), 0));
        }
    }
    CHECK_OK(ferry_backend_graph_compute(f->be, f->g));
}

static void build(fx * f, ferry_tensor * t) {
    CHECK(t);
    CHECK_OK(ferry_graph_build(f->g, t));
}

static size_t chunk_size(fx * f, int buft, int c) { return ferry_buffer_size(ferry_gallocr_chunk_buffer(f->ga, buft, c)); }

static void run_scenario(void (*fn)(fx *), size_t align, size_t max, bool keep_inputs) {
    for (int real = 0; real < 2; real++) {
        fx f;
        const int before = check_failures;
        if (!fx_init(&f, real, align, max) || ferry_gallocr_set_keep_inputs(f.ga, keep_inputs) != FERRY_OK) {
            fprintf(stderr, "setup failed: %s\n", ferry_last_error());
            check_failures++;
        } else {
            fn(&f);
        }
        fx_free(&f);
        if (check_failures != before) {
            fprintf(stderr, "  (real_memory %s)\n", real ? "on" : "off");
            return;
        }
    }
}

#define SCENARIO(name, align, max) \
    static void test_##name(void) { run_scenario(sc_##name, align, max, false); }
#define SCENARIO_KEEP(name, align, max) \
    static void test_##name(void) { run_scenario(sc_##name, align, max, true); }

/* ---------------------------------------------------------------- scenarios */

/* 7 KB of tensors live together, chunks of 4 KB: two chunks. */
static void sc_tensors_past_a_chunks_max_open_a_second_chunk(fx * f) {
    ferry_tensor * x = input_kb(f, 1, "x"), *t;
    for (int i = 0; i < 6; i++) {
        CHECK_OK(ferry_scale(f->ctx, x, (float) i, &t));
        SUB(build(f, out(named(t, "out"))));
    }
    SUB(alloc_verify(f, 8 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 2);
    CHECK_EQ_U(chunk_size(f, 0, 0), 4 * KB);
    CHECK_EQ_U(chunk_size(f, 0, 1), 3 * KB);
}
SCENARIO_KEEP(tensors_past_a_chunks_max_open_a_second_chunk, 64, 4 * KB)

/* 3 KB used of 4: a 2 KB tensor goes to a new chunk, at its start. */
static void sc_a_tensor_too_large_for_the_rest_starts_a_chunk(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a, *b;
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &a));
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &b));
    SUB(build(f, out(named(a, "a"))));
    SUB(build(f, out(named(b, "b"))));
    SUB(alloc_verify(f, 5 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 2);
    CHECK(b->buffer == ferry_gallocr_chunk_buffer(f->ga, 0, 1));
    CHECK_EQ_U(offset_in(b), 0);
}
SCENARIO(a_tensor_too_large_for_the_rest_starts_a_chunk, 64, 4 * KB)

/* As above, then a 1 KB tensor fills the first chunk's last kilobyte. */
static void sc_a_small_tensor_fills_the_space_a_chunk_left(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a, *b, *c;
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &a));
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &b));
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &c));
    SUB(build(f, out(named(a, "a"))));
    SUB(build(f, out(named(b, "b"))));
    SUB(build(f, out(named(c, "c"))));
    SUB(alloc_verify(f, 6 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 2);
    CHECK(c->buffer == ferry_gallocr_chunk_buffer(f->ga, 0, 0));
    CHECK_EQ_U(offset_in(c), 3 * KB);
    CHECK_EQ_U(chunk_size(f, 0, 0), 4 * KB);
    CHECK_EQ_U(chunk_size(f, 0, 1), 2 * KB);
}
SCENARIO_KEEP(a_small_tensor_fills_the_space_a_chunk_left, 64, 4 * KB)

/* A 6 KB tensor with a 4 KB max size: a chunk of its own, exactly its size; the
 * dummy backend accepts it (the backend's decision). */
static void sc_a_tensor_past_the_max_size_gets_its_own_chunk(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *big, *small;
    CHECK_OK(ferry_pad(f->ctx, x, 5 * F32_PER_KB, 0, 0, 0, &big));
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &small));
    SUB(build(f, out(named(big, "big"))));
    SUB(build(f, out(named(small, "small"))));
    SUB(alloc_verify(f, 8 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 2);
    CHECK(big->buffer == ferry_gallocr_chunk_buffer(f->ga, 0, 1));
    CHECK_EQ_U(chunk_size(f, 0, 1), 6 * KB);
    CHECK(small->buffer == x->buffer);
}
SCENARIO(a_tensor_past_the_max_size_gets_its_own_chunk, 64, 4 * KB)

/* 1 KB chunks: 16 live tensors fit, the 17th fails with a message, and the
 * allocator still serves the graph that fits. */
static void sc_past_the_last_chunk_allocation_fails_cleanly(fx * f) {
    ferry_tensor * x = input_kb(f, 1, "x"), *t;
    for (int i = 0; i < FERRY_GALLOC_MAX_CHUNKS - 1; i++) {
        CHECK_OK(ferry_scale(f->ctx, x, (float) i, &t));
        SUB(build(f, out(named(t, "out"))));
    }
    SUB(alloc_verify(f, FERRY_GALLOC_MAX_CHUNKS * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), FERRY_GALLOC_MAX_CHUNKS);

    ferry_graph * bigger;
    CHECK_OK(ferry_graph_new(&bigger));
    for (int i = 0; i < ferry_graph_n_nodes(f->g); i++) {
        ferry_graph_build(bigger, ferry_graph_node(f->g, i));
    }
    CHECK_OK(ferry_scale(f->ctx, x, 99.0f, &t));
    ferry_graph_build(bigger, out(named(t, "one too many")));
    ferry_clear_error();
    const ferry_status st = ferry_gallocr_alloc_graph(f->ga, bigger);
    ferry_graph_free(bigger);
    CHECK(st == FERRY_ERR_OUT_OF_MEMORY);
    CHECK(strstr(ferry_last_error(), "one too many") && strstr(ferry_last_error(), "16"));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), FERRY_GALLOC_MAX_CHUNKS);
    SUB(alloc_verify(f, FERRY_GALLOC_MAX_CHUNKS * KB));
}
SCENARIO_KEEP(past_the_last_chunk_allocation_fails_cleanly, 64, 1 * KB)

/* Views take their source's memory and keep it alive until their own readers ran. */
static void sc_views_keep_their_sources_memory_for_their_readers(fx * f) {
    const int64_t ne[2] = {F32_PER_KB, 4};
    ferry_tensor *x, *a, *v, *r, *p, *t1, *t2, *t3;
    CHECK_OK(ferry_tensor_new(f->ctx, FERRY_TYPE_F32, 2, ne, &x));
    CHECK_OK(ferry_tensor_set_input(named(x, "x")));
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &a));
    const int64_t ne_v[2] = {F32_PER_KB, 2};
    CHECK_OK(ferry_tensor_view(f->ctx, named(a, "a"), 2, ne_v, a->nb, KB, &v));
    const int64_t ne_r[1] = {4 * F32_PER_KB};
    CHECK_OK(ferry_tensor_reshape(f->ctx, a, 1, ne_r, &r));
    CHECK_OK(ferry_tensor_transpose(f->ctx, a, &p));
    CHECK_OK(ferry_scale(f->ctx, v, 3.0f, &t1));
    CHECK_OK(ferry_dup(f->ctx, p, &t2));
    CHECK_OK(ferry_mean(f->ctx, r, &t3));
    SUB(build(f, named(t1, "t1")));
    SUB(build(f, named(t2, "t2")));
    SUB(build(f, named(t3, "t3")));
    /* x 4K, a 4K, t1 2K, t2 4K, t3 64 bytes: nothing for the views */
    SUB(alloc_verify(f, 14 * KB + 64));
    CHECK(v->data == (char *) a->data + KB);
    CHECK(r->data == a->data && p->data == a->data);
    CHECK(v->buffer == a->buffer);
    CHECK_FAILS(ferry_gallocr_tensor_placement(f->ga, v, NULL, NULL, NULL, NULL), FERRY_ERR_NOT_ALLOCATED);
}
SCENARIO(views_keep_their_sources_memory_for_their_readers, 64, 0)

/* A chain of scales runs in one block; a freed block is reused; outputs are not. */
static void sc_freed_blocks_are_reused_and_outputs_never_are(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *s = x, *a, *m, *b;
    for (int i = 0; i < 8; i++) {
        CHECK_OK(ferry_scale(f->ctx, s, 2.0f, &s));
        named(s, "s");
    }
    SUB(build(f, s));
    SUB(alloc_verify(f, 2 * KB));
    for (int i = 1; i < ferry_graph_n_nodes(f->g); i++) {
        CHECK(ferry_graph_node(f->g, i)->data == ferry_graph_node(f->g, 0)->data);
    }

    ferry_graph_clear(f->g);
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &a));
    CHECK_OK(ferry_mean(f->ctx, named(a, "a"), &m));
    CHECK_OK(ferry_pad(f->ctx, x, F32_PER_KB, 0, 0, 0, &b));
    SUB(build(f, named(m, "m")));
    SUB(build(f, named(b, "b")));
    SUB(alloc_verify(f, 3 * KB + 64));
    CHECK(b->data == a->data); /* a was freed after m read it */

    ferry_tensor *o, *after;
    ferry_graph_clear(f->g);
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &o));
    CHECK_OK(ferry_scale(f->ctx, out(named(o, "o")), 2.0f, &after));
    SUB(build(f, named(after, "after")));
    SUB(alloc_verify(f, 3 * KB + 64)); /* x, o, after; the buffer keeps its 3 KB + 64 */
    CHECK(after->data != o->data); /* never in place on an output */
}
SCENARIO(freed_blocks_are_reused_and_outputs_never_are, 64, 0)

/* a and b (1 KB each, side by side) are freed after ab = concat(a, b); d (2 KB)
 * then fits in their merged block. Without merging it would not: 7 KB, or with a
 * 5 KB max size a second chunk. */
static void sc_merge(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a, *b, *ab, *d, *o;
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &a));
    CHECK_OK(ferry_scale(f->ctx, x, 3.0f, &b));
    CHECK_OK(ferry_concat(f->ctx, named(a, "a"), named(b, "b"), 0, &ab));
    CHECK_OK(ferry_scale(f->ctx, named(ab, "ab"), 4.0f, &d));
    CHECK_OK(ferry_add(f->ctx, named(d, "d"), ab, &o));
    SUB(build(f, named(o, "o")));
    SUB(alloc_verify(f, 5 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 1);
    CHECK(d->data == a->data);
}
static void sc_freed_neighbours_merge_under_a_small_max_size(fx * f) { sc_merge(f); }
static void sc_freed_neighbours_merge_without_a_max_size(fx * f) { sc_merge(f); }
SCENARIO_KEEP(freed_neighbours_merge_under_a_small_max_size, 64, 5 * KB)
SCENARIO_KEEP(freed_neighbours_merge_without_a_max_size, 64, 0)

/* Chunk of 8 KB, 7 KB needed so far, with a free 3 KB hole at 1 KB and 1 KB of tail
 * left. A 1 KB tensor fits the tail exactly, but the hole costs nothing. */
static void sc_a_free_hole_is_taken_before_the_chunks_tail(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a, *b, *z, *w;
    CHECK_OK(ferry_pad(f->ctx, x, 2 * F32_PER_KB, 0, 0, 0, &a));
    CHECK_OK(ferry_pad(f->ctx, x, 2 * F32_PER_KB, 0, 0, 0, &b));
    CHECK_OK(ferry_add(f->ctx, named(b, "b"), named(a, "a"), &z)); /* in place on b, frees a */
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &w));
    SUB(build(f, a)); /* a first, so the hole it leaves is not next to the tail */
    SUB(build(f, out(named(z, "z"))));
    SUB(build(f, out(named(w, "w"))));
    SUB(alloc_verify(f, 7 * KB));
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 0), 1);
    CHECK_EQ_U(offset_in(w), KB);
}
SCENARIO_KEEP(a_free_hole_is_taken_before_the_chunks_tail, 64, 8 * KB)

/* Two buffer types (alignments 64 and 256, the second capped at 4 KB), nodes split
 * between them, and one leaf the test placed itself, which the allocator leaves. */
static void sc_nodes_go_to_their_reserved_buffer_types(fx * f) {
    CHECK_OK(dummy(f->real, 256, 4 * KB, &f->be2));
    ferry_buffer_type * bufts[2] = {ferry_backend_default_buffer_type(f->be),
                                    ferry_backend_default_buffer_type(f->be2)};
    ferry_gallocr_free(f->ga);
    f->ga = NULL;
    CHECK_OK(ferry_gallocr_new_n(bufts, 2, &f->ga));

    ferry_tensor *x = input_kb(f, 1, "x"), *w = vec_n(f, 100, "w"), *h, *h2, *k, *o, *o2;
    CHECK_OK(ferry_buffer_type_alloc_buffer(bufts[1], KB, &f->outside));
    CHECK_OK(ferry_buffer_place_tensor(f->outside, w, 256));
    void * w_data = w->data;
    CHECK_OK(ferry_mul(f->ctx, x, x, &h));    /* buft 0 */
    CHECK_OK(ferry_pad(f->ctx, named(h, "h"), 4, 0, 0, 0, &h2)); /* 0 */
    ferry_tensor * hv;
    const int64_t n100 = 100;
    CHECK_OK(ferry_tensor_view(f->ctx, h2, 1, &n100, NULL, 0, &hv)); /* 0 (a view) */
    CHECK_OK(ferry_add(f->ctx, named(hv, "hv"), w, &k));             /* 1 */
    CHECK_OK(ferry_scale(f->ctx, named(k, "k"), 2.0f, &o));          /* 1, in place */
    CHECK_OK(ferry_scale(f->ctx, named(h2, "h2"), 3.0f, &o2));       /* 0 */
    SUB(build(f, out(named(o, "o"))));
    SUB(build(f, out(named(o2, "o2"))));
    const int n_nodes = ferry_graph_n_nodes(f->g), n_leafs = ferry_graph_n_leafs(f->g);
    CHECK_EQ_U(n_leafs, 2);
    int node_ids[8] = {0}, leaf_ids[2] = {0, 1};
    CHECK(n_nodes <= 8);
    for (int i = 0; i < n_nodes; i++) {
        const ferry_tensor * t = ferry_graph_node(f->g, i);
        node_ids[i] = t == k || t == o ? 1 : 0;
    }
    int bad_ids[8] = {0, 0, 0, 7};
    CHECK_FAILS(ferry_gallocr_reserve(f->ga, f->g, bad_ids, leaf_ids), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_gallocr_reserve(f->ga, f->g, node_ids, leaf_ids));
    CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g));
    /* buft 0: x 1K, h 1K, h2 1K + 64 (16 bytes padded), o2 1K + 64; buft 1: k, o in one 512-byte block */
    SUB(verify(f, 4 * KB + 128 + 512));
    CHECK(w->data == w_data && w->buffer == f->outside);
    CHECK(ferry_buffer_get_type(k->buffer) == bufts[1] && ferry_buffer_get_type(o->buffer) == bufts[1]);
    CHECK(ferry_buffer_get_type(h->buffer) == bufts[0] && ferry_buffer_get_type(o2->buffer) == bufts[0]);
    CHECK(o->data == k->data);
    CHECK_EQ_U(ferry_gallocr_buffer_size(f->ga, 1), 512);
    /* another graph of other counts needs its own reserve */
    ferry_graph * other;
    CHECK_OK(ferry_graph_new(&other));
    ferry_graph_build(other, x);
    const ferry_status st = ferry_gallocr_alloc_graph(f->ga, other);
    ferry_graph_free(other);
    CHECK(st == FERRY_ERR_INVALID_ARG);
}
SCENARIO(nodes_go_to_their_reserved_buffer_types, 64, 0)

/* With two buffer types and everything on the first, the second gets nothing. */
static void sc_buffer_type_receives_nothing(fx * f) {
    CHECK_OK(dummy(f->real, 64, 0, &f->be2));
    ferry_buffer_type * bufts[2] = {ferry_backend_default_buffer_type(f->be),
                                    ferry_backend_default_buffer_type(f->be2)};
    ferry_gallocr_free(f->ga);
    f->ga = NULL;
    CHECK_OK(ferry_gallocr_new_n(bufts, 2, &f->ga));
    ferry_tensor *x = input_kb(f, 1, "x"), *a;
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &a));
    SUB(build(f, named(a, "a")));
    SUB(alloc_verify(f, 2 * KB));
    CHECK_EQ_U(ferry_gallocr_buffer_size(f->ga, 1), 0);
    CHECK_EQ_U(ferry_gallocr_n_chunks(f->ga, 1), 0);
    CHECK(ferry_gallocr_chunk_buffer(f->ga, 1, 0) == NULL);
}
SCENARIO(buffer_type_receives_nothing, 64, 0)

/* A second, larger graph grows the buffer; the first then fits in it as it is. */
static void sc_a_larger_graph_grows_the_buffer_for_both(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a;
    CHECK_OK(ferry_scale(f->ctx, x, 2.0f, &a));
    SUB(build(f, named(a, "a")));
    SUB(alloc_verify(f, 2 * KB));
    CHECK_EQ_U(ferry_gallocr_buffer_size(f->ga, 0), 2 * KB);

    ferry_graph * first = f->g;
    CHECK_OK(ferry_graph_new(&f->g));
    ferry_tensor *x2 = input_kb(f, 1, "x2"), *big, *o;
    CHECK_OK(ferry_pad(f->ctx, x2, 3 * F32_PER_KB, 0, 0, 0, &big));
    CHECK_OK(ferry_scale(f->ctx, named(big, "big"), 2.0f, &o));
    SUB(build(f, named(o, "o")));
    CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g)); /* no reserve: alloc_graph grows */
    SUB(verify(f, 5 * KB));
    CHECK_EQ_U(ferry_gallocr_buffer_size(f->ga, 0), 5 * KB);
    CHECK(ferry_tensor_check_allocated(a) == FERRY_ERR_FREED); /* the old buffer went */

    ferry_buffer * kept = ferry_gallocr_chunk_buffer(f->ga, 0, 0);
    ferry_graph_free(f->g);
    f->g = first;
    CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g));
    SUB(verify(f, 5 * KB));
    CHECK(ferry_gallocr_chunk_buffer(f->ga, 0, 0) == kept && a->buffer == kept);
}
SCENARIO_KEEP(a_larger_graph_grows_the_buffer_for_both, 64, 0)

/* x's last reader is y: z takes x's bytes. Kept, x is never shared. */
static void sc_input_reused_after_last_use(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *y, *z;
    CHECK_OK(ferry_dup(f->ctx, x, &y));
    CHECK_OK(ferry_dup(f->ctx, named(y, "y"), &z));
    SUB(build(f, out(named(z, "z"))));
    SUB(alloc_verify(f, 2 * KB));
    CHECK(z->data == x->data);
    CHECK_EQ_U(ferry_gallocr_buffer_size(f->ga, 0), 2 * KB);

    CHECK(!ferry_gallocr_get_keep_inputs(f->ga));
    CHECK_OK(ferry_gallocr_set_keep_inputs(f->ga, true));
    CHECK(ferry_gallocr_get_keep_inputs(f->ga));
    SUB(alloc_verify(f, 3 * KB));
    CHECK(z->data != x->data && y->data != x->data);
    CHECK_EQ_U(offset_in(z), 2 * KB);
    CHECK_FAILS(ferry_gallocr_set_keep_inputs(NULL, true), FERRY_ERR_INVALID_ARG);
    CHECK(!ferry_gallocr_get_keep_inputs(NULL));
}
SCENARIO(input_reused_after_last_use, 64, 0)

/* p = a + b while a is read later: p takes b, its second source; e = p * a then takes p. */
static void sc_a_node_works_in_place_over_its_second_source(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *a, *b, *p, *e;
    CHECK_OK(ferry_dup(f->ctx, x, &a));
    CHECK_OK(ferry_dup(f->ctx, x, &b));
    CHECK_OK(ferry_add(f->ctx, named(a, "a"), named(b, "b"), &p));
    CHECK_OK(ferry_mul(f->ctx, named(p, "p"), a, &e));
    SUB(build(f, out(named(e, "e"))));
    SUB(alloc_verify(f, 3 * KB)); /* x (later a hole), a, b = p = e */
    CHECK(p->data == b->data && e->data == b->data);
    CHECK(a->data != b->data);
}
SCENARIO(a_node_works_in_place_over_its_second_source, 64, 0)

/* In place over an input: mul(x0, x1) with x0 read later works in place over
 * x1, an input; the add after it over the product. */
static void sc_a_node_works_in_place_over_a_spent_input(fx * f) {
    ferry_tensor *x0 = input_kb(f, 1, "x0"), *x1 = input_kb(f, 1, "x1"), *m, *o;
    CHECK_OK(ferry_mul(f->ctx, x0, x1, &m));
    CHECK_OK(ferry_add(f->ctx, named(m, "m"), x0, &o));
    SUB(build(f, out(named(o, "o"))));
    SUB(alloc_verify(f, 2 * KB));
    CHECK(m->data == x1->data && o->data == x1->data);
}
SCENARIO(a_node_works_in_place_over_a_spent_input, 64, 0)

/* Through a view from its source's first byte (a reshape), not through one further in. */
static void sc_in_place_only_through_a_view_at_its_sources_start(fx * f) {
    const int64_t ne[2] = {F32_PER_KB, 2}, flat = 2 * F32_PER_KB, half = F32_PER_KB;
    ferry_tensor *x, *a, *r, *s, *b, *v, *t;
    CHECK_OK(ferry_tensor_new(f->ctx, FERRY_TYPE_F32, 2, ne, &x));
    CHECK_OK(ferry_tensor_set_input(named(x, "x")));
    CHECK_OK(ferry_dup(f->ctx, x, &a));
    CHECK_OK(ferry_tensor_reshape(f->ctx, named(a, "a"), 1, &flat, &r));
    CHECK_OK(ferry_scale(f->ctx, named(r, "r"), 2.0f, &s));
    CHECK_OK(ferry_dup(f->ctx, x, &b));
    CHECK_OK(ferry_tensor_view(f->ctx, named(b, "b"), 1, &half, NULL, KB, &v));
    CHECK_OK(ferry_scale(f->ctx, named(v, "v"), 2.0f, &t));
    SUB(build(f, out(named(s, "s"))));
    SUB(build(f, out(named(t, "t"))));
    SUB(alloc_verify(f, 7 * KB));
    CHECK(s->data == a->data);
    CHECK(t->data != v->data && t->data != b->data);
}
SCENARIO(in_place_only_through_a_view_at_its_sources_start, 64, 0)

/* The scheduler's copies: c, written just before node 2, takes memory freed before it
 * (y's); the copy d of s is made at node 3, so s lives until then and u, its last
 * reader in the graph, may not work in place over it. */
static void sc_copies_placed_at_their_node(fx * f) {
    ferry_tensor *x = input_kb(f, 1, "x"), *c = vec_n(f, F32_PER_KB, "c"), *d = vec_n(f, F32_PER_KB, "d");
    ferry_tensor *y, *s, *u, *o, *o2;
    CHECK_OK(ferry_dup(f->ctx, x, &y));                  /* 0 */
    CHECK_OK(ferry_scale(f->ctx, named(y, "y"), 2.0f, &s)); /* 1: in place over y */
    CHECK_OK(ferry_scale(f->ctx, named(s, "s"), 3.0f, &u)); /* 2 */
    CHECK_OK(ferry_add(f->ctx, named(u, "u"), c, &o));      /* 2 */
    CHECK_OK(ferry_add(f->ctx, named(o, "o"), d, &o2));     /* 3 */
    SUB(build(f, out(named(o2, "o2"))));
    CHECK(ferry_graph_node(f->g, 2) == u && ferry_graph_node(f->g, 3) == o);
    /* c before node 2 (u), d (from s) before node 4 (o2) */
    const ferry_gallocr_copy copies[2] = {{.copy = c, .src = NULL, .node = 2}, {.copy = d, .src = s, .node = 4}};
    CHECK_OK(ferry_gallocr_reserve_copies(f->ga, f->g, NULL, NULL, copies, 2));
    CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g));
    SUB(verify_copies(f, 5 * KB, copies, 2));
    CHECK(c->data == x->data); /* x died at node 0 */
    CHECK(u->data != s->data); /* s is copied at node 4 */
    if (f->real) {
        CHECK_OK(ferry_backend_graph_compute(f->be, f->g));
    }
    /* bad copies: a node, a position out of range, a copy read before it is written */
    ferry_gallocr_copy bad = {.copy = u, .node = 1};
    CHECK_FAILS(ferry_gallocr_reserve_copies(f->ga, f->g, NULL, NULL, &bad, 1), FERRY_ERR_INVALID_ARG);
    bad = (ferry_gallocr_copy) {.copy = c, .node = 9};
    CHECK_FAILS(ferry_gallocr_reserve_copies(f->ga, f->g, NULL, NULL, &bad, 1), FERRY_ERR_INVALID_ARG);
    bad.node = 4;
    CHECK_FAILS(ferry_gallocr_reserve_copies(f->ga, f->g, NULL, NULL, &bad, 1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_gallocr_reserve_copies(f->ga, f->g, NULL, NULL, NULL, 1), FERRY_ERR_INVALID_ARG);
}
SCENARIO(copies_placed_at_their_node, 64, 0)

/* ---------------------------------------------------------------- random graphs */

enum { N_RANDOM_GRAPHS = 300 };

/* Graph seed in ctx/graph; every tensor in memory of its own (no reuse) when alone. */
static ferry_status random_graph(fx * f, uint64_t seed, ferry_context * ctx, ferry_graph * graph, ferry_tensor ** t,
                                 ferry_buffer ** alone, rg_graph * rg) {
    rg_generate(rg, seed);
    FERRY_TRY(rg_build_ferry(rg, ctx, graph, t));
    for (int i = 0; alone && i < rg->n; i++) {
        alone[i] = NULL;
        if (!t[i]->view_src) {
            FERRY_TRY(ferry_backend_alloc_buffer(f->be, ferry_tensor_nbytes(t[i]), &alone[i]));
            FERRY_TRY(ferry_buffer_place_tensor(alone[i], t[i], 0));
        }
    }
    return FERRY_OK;
}

/* The leafs' values, the same for both runs. */
static ferry_status fill_leafs(const rg_graph * rg, ferry_tensor ** t, uint64_t seed) {
    for (int i = 0; i < rg->n; i++) {
        if (rg->t[i].op != RG_LEAF) {
            continue;
        }
        const size_t n = (size_t) ferry_tensor_nelements(t[i]);
        float * v = malloc(n * sizeof(float));
        if (!v) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "test: out of memory");
        }
        for (size_t k = 0; k < n; k++) {
            v[k] = (float) ((seed + 31 * (uint64_t) i + k) % 17) / 8.0f - 1.0f;
        }
        const ferry_status st = ferry_tensor_set(t[i], v, 0, n * sizeof(float));
        free(v);
        FERRY_TRY(st);
    }
    return FERRY_OK;
}

/* Fixed seeds, inputs freed and kept: no two live tensors share a byte; with real memory,
 * every output and unread result is what it is with no memory shared at all. */
static void sc_random_graphs_no_overlap(fx * f) {
    static rg_graph rg;
    for (int keep = 0; keep < 2; keep++) {
        CHECK_OK(ferry_gallocr_set_keep_inputs(f->ga, keep));
        for (uint64_t seed = 1; seed <= N_RANDOM_GRAPHS; seed++) {
            ferry_graph_clear(f->g);
            ferry_tensor * t[RG_MAX];
            const ferry_status built = random_graph(f, seed, f->ctx, f->g, t, NULL, &rg);
            if (built != FERRY_OK) {
                fprintf(stderr, "seed %llu: %s\n", (unsigned long long) seed, ferry_last_error());
            }
            CHECK_OK(built);
            CHECK_OK(ferry_gallocr_alloc_graph(f->ga, f->g));
            lt_tensor * lt = lt_from_ferry(f->g);
            CHECK(lt);
            const int overlaps = lt_check_overlaps(lt, ferry_graph_n_slots(f->g), ferry_graph_n_nodes(f->g), keep, stderr);
            free(lt);
            if (overlaps) {
                fprintf(stderr, "seed %llu, keep_inputs %d: %d overlaps\n", (unsigned long long) seed, keep, overlaps);
            }
            CHECK_EQ_U(overlaps, 0);
            if (!f->real || seed % 3 != 0) {
                continue;
            }
            /* the same graph, each tensor alone: the results must agree byte for byte */
            ferry_context * ctx2;
            ferry_graph * g2;
            ferry_tensor * t2[RG_MAX];
            ferry_buffer * alone[RG_MAX] = {0};
            CHECK_OK(ferry_context_new(&ctx2));
            CHECK_OK(ferry_graph_new(&g2));
            rg_graph rg2;
            ferry_status st = random_graph(f, seed, ctx2, g2, t2, alone, &rg2);
            if (st == FERRY_OK) st = fill_leafs(&rg, t, seed);
            if (st == FERRY_OK) st = fill_leafs(&rg2, t2, seed);
            if (st == FERRY_OK) st = ferry_backend_graph_compute(f->be, f->g);
            if (st == FERRY_OK) st = ferry_backend_graph_compute(f->be, g2);
            bool same = true;
            for (int i = 0; st == FERRY_OK && i < rg.n && same; i++) {
                const bool kept = rg.t[i].output || (keep && rg.t[i].op == RG_LEAF);
                if (!kept || t[i]->view_src) {
                    continue;
                }
                const size_t n = ferry_tensor_nbytes(t[i]);
                char *x = malloc(n), *y = malloc(n);
                same = x && y && ferry_tensor_get(t[i], x, 0, n) == FERRY_OK &&
                       ferry_tensor_get(t2[i], y, 0, n) == FERRY_OK && memcmp(x, y, n) == 0;
                if (!same) {
                    fprintf(stderr, "seed %llu, keep_inputs %d: '%s' differs\n", (unsigned long long) seed, keep,
                            t[i]->name);
                }
                free(x);
                free(y);
            }
            for (int i = 0; i < rg2.n; i++) {
                ferry_buffer_free(alone[i]);
            }
            ferry_graph_free(g2);
            ferry_context_free(ctx2);
            CHECK_OK(st);
            CHECK(same);
        }
    }
}
SCENARIO(random_graphs_no_overlap, 32, 0)

/* Graphs where the two ways differ and the second needs less: the first chose between
 * equally good blocks (seeds 261, 288) or worked in place through a view (25, 192).
 * The sizes are the smaller way's (each at most ggml-alloc's, tools/alloc_compare).
 * Walked again, in the memory the first call left, the plan is the same. */
static void sc_random_graphs_take_the_smaller_way_every_time(fx * f) {
    static rg_graph rg;
    static const struct {
        uint64_t seed;
        size_t size;
    } cases[] = {{261, 374176}, {288, 8064}, {25, 25440}, {192, 9248}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        ferry_gallocr * ga;
        ferry_tensor * t[RG_MAX];
        ferry_graph_clear(f->g);
        CHECK_OK(random_graph(f, cases[k].seed, f->ctx, f->g, t, NULL, &rg));
        CHECK_OK(ferry_gallocr_new(ferry_backend_default_buffer_type(f->be), &ga));
        CHECK_OK(ferry_gallocr_alloc_graph(ga, f->g));
        if (ferry_gallocr_buffer_size(ga, 0) != cases[k].size) {
            fprintf(stderr, "seed %llu: %zu bytes\n", (unsigned long long) cases[k].seed,
                    ferry_gallocr_buffer_size(ga, 0));
        }
        CHECK_EQ_U(ferry_gallocr_buffer_size(ga, 0), cases[k].size);
        size_t offset[RG_MAX];
        for (int i = 0; i < rg.n; i++) {
            offset[i] = SIZE_MAX;
            ferry_gallocr_tensor_placement(ga, t[i], NULL, NULL, &offset[i], NULL);
        }
        ferry_clear_error();
        CHECK_OK(ferry_gallocr_reserve(ga, f->g, NULL, NULL));
        CHECK_OK(ferry_gallocr_alloc_graph(ga, f->g));
        for (int i = 0; i < rg.n; i++) {
            size_t again = SIZE_MAX;
            ferry_gallocr_tensor_placement(ga, t[i], NULL, NULL, &again, NULL);
            CHECK_EQ_U(again, offset[i]);
        }
        ferry_clear_error();
        CHECK_EQ_U(ferry_gallocr_buffer_size(ga, 0), cases[k].size);
        ferry_gallocr_free(ga);
    }
}
SCENARIO(random_graphs_take_the_smaller_way_every_time, 32, 0)

static const check_test tests[] = {
    {"tensors_past_a_chunks_max_open_a_second_chunk", test_tensors_past_a_chunks_max_open_a_second_chunk},
    {"a_tensor_too_large_for_the_rest_starts_a_chunk", test_a_tensor_too_large_for_the_rest_starts_a_chunk},
    {"a_tensor_past_the_max_size_gets_its_own_chunk", test_a_tensor_past_the_max_size_gets_its_own_chunk},
    {"past_the_last_chunk_allocation_fails_cleanly", test_past_the_last_chunk_allocation_fails_cleanly},
    {"a_small_tensor_fills_the_space_a_chunk_left", test_a_small_tensor_fills_the_space_a_chunk_left},
    {"views_keep_their_sources_memory_for_their_readers", test_views_keep_their_sources_memory_for_their_readers},
    {"freed_blocks_are_reused_and_outputs_never_are", test_freed_blocks_are_reused_and_outputs_never_are},
    {"freed_neighbours_merge_under_a_small_max_size", test_freed_neighbours_merge_under_a_small_max_size},
    {"freed_neighbours_merge_without_a_max_size", test_freed_neighbours_merge_without_a_max_size},
    {"a_free_hole_is_taken_before_the_chunks_tail", test_a_free_hole_is_taken_before_the_chunks_tail},
    {"nodes_go_to_their_reserved_buffer_types", test_nodes_go_to_their_reserved_buffer_types},
    {"buffer_type_receives_nothing", test_buffer_type_receives_nothing},
    {"a_larger_graph_grows_the_buffer_for_both", test_a_larger_graph_grows_the_buffer_for_both},
    {"input_reused_after_last_use", test_input_reused_after_last_use},
    {"a_node_works_in_place_over_its_second_source", test_a_node_works_in_place_over_its_second_source},
    {"a_node_works_in_place_over_a_spent_input", test_a_node_works_in_place_over_a_spent_input},
    {"in_place_only_through_a_view_at_its_sources_start", test_in_place_only_through_a_view_at_its_sources_start},
    {"copies_placed_at_their_node", test_copies_placed_at_their_node},
    {"random_graphs_no_overlap", test_random_graphs_no_overlap},
    {"random_graphs_take_the_smaller_way_every_time", test_random_graphs_take_the_smaller_way_every_time},
};

CHECK_MAIN(tests)
