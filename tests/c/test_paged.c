/*
 * The paged KV cache (paged-kv.c) and the gather of its windows (copy-paged.c): block tables
 * kept from the free list and the caller's, refused with the sequence and block named; windows
 * gathered under every method from random tables (fixed seeds, 0 to 100% of blocks adjacent)
 * into a sentinel, each used cell from its own block and no other byte written, the bytes
 * exactly the cells read and the calls the method's; the plan and its costs; attention through
 * the scheduler byte for byte a cell-per-stream cache's holding the same sequences.
 */
#include "paged-fixture.h"

#include "ferry-impl.h" /* the one-call gathers, given their pieces directly */

#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif


/* Sequence seq's table is exactly want (n ids) holding cells cells. */
static bool table_is(const ferry_paged_cache * c, int64_t seq, const int32_t * want, int64_t n, int64_t cells) {
    int32_t got[N_BLOCKS];
    int64_t n_got, cells_got;
    return ferry_paged_cache_table(c, seq, got, N_BLOCKS, &n_got, &cells_got) == FERRY_OK && n_got == n &&
           cells_got == cells && (n == 0 || memcmp(got, want, (size_t) n * sizeof(*want)) == 0);
}

/* ---------------------------------------------------------------- tables */

static void test_tables_come_from_the_free_list_in_order(void) {
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.n_blocks = 8;
    p.n_seq = 3;
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 8);
    CHECK_OK(ferry_paged_cache_allocate(c, 0, 6)); /* a fresh cache hands out 0, 1, ... */
    CHECK(table_is(c, 0, (const int32_t[]) {0, 1}, 2, 6));
    CHECK_OK(ferry_paged_cache_append(c, 0, 2)); /* fills block 1 */
    CHECK(table_is(c, 0, (const int32_t[]) {0, 1}, 2, 8));
    CHECK_OK(ferry_paged_cache_append(c, 0, 1));
    CHECK(table_is(c, 0, (const int32_t[]) {0, 1, 2}, 3, 9));
    CHECK_OK(ferry_paged_cache_allocate(c, 1, 8));
    CHECK(table_is(c, 1, (const int32_t[]) {3, 4}, 2, 8));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 3);
    /* refusals change nothing, and say which sequence */
    CHECK_FAILS(ferry_paged_cache_allocate(c, 2, 13), FERRY_ERR_OUT_OF_MEMORY);
    CHECK(strstr(ferry_last_error(), "sequence 2 needs 4 more blocks") != NULL);
    CHECK_FAILS(ferry_paged_cache_append(c, 1, 13), FERRY_ERR_OUT_OF_MEMORY);
    CHECK(strstr(ferry_last_error(), "sequence 1") != NULL);
    CHECK(table_is(c, 1, (const int32_t[]) {3, 4}, 2, 8) && table_is(c, 2, NULL, 0, 0));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 3);
    CHECK_FAILS(ferry_paged_cache_allocate(c, 0, 1), FERRY_ERR_INVALID_ARG); /* not empty */
    CHECK_FAILS(ferry_paged_cache_allocate(c, 3, 1), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_allocate(c, -1, 1), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_allocate(c, 2, -1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_allocate(c, 2, 33), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_append(c, 2, -1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_free_seq(c, 3), FERRY_ERR_OUT_OF_BOUNDS);
    /* freed blocks come back in their table's order */
    CHECK_OK(ferry_paged_cache_free_seq(c, 0));
    CHECK(table_is(c, 0, NULL, 0, 0));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 6);
    CHECK_OK(ferry_paged_cache_allocate(c, 2, 12));
    CHECK(table_is(c, 2, (const int32_t[]) {0, 1, 2}, 3, 12));
    int32_t small[1];
    int64_t n, cells;
    CHECK_FAILS(ferry_paged_cache_table(c, 2, small, 1, &n, &cells), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(n, 3);
    CHECK_OK(ferry_paged_cache_table(c, 2, NULL, 0, &n, &cells)); /* the count alone */
    CHECK(n == 3 && cells == 12);
    CHECK_FAILS(ferry_paged_cache_table(c, 2, small, 1, NULL, &cells), FERRY_ERR_INVALID_ARG);
    CHECK(ferry_paged_cache_free_blocks(NULL) == -1);
    ferry_paged_cache_free(c);
}

static void test_bad_tables_refused_naming_the_sequence_and_block(void) {
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.n_blocks = 8;
    p.n_seq = 3;
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_paged_cache_set_table(c, 0, (const int32_t[]) {5, 1, 2}, 3, 10));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 5);
    /* each bad table refused naming the sequence and the block, nothing changed */
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {3, 8}, 2, 8), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "sequence 1's block 1 is id 8, not in 0..7") != NULL);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {-1}, 1, 4), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {3, 3}, 2, 8), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "sequence 1's block 1 is id 3, which its table already holds") != NULL);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {4, 2}, 2, 8), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "sequence 1's block 1 is id 2, which sequence 0's table holds") != NULL);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {4, 6}, 2, 9), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "sequence 1's 9 cells") != NULL);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, NULL, 2, 0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {4}, -1, 0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {4}, 9, 0), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 3, (const int32_t[]) {4}, 1, 0), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(table_is(c, 0, (const int32_t[]) {5, 1, 2}, 3, 10) && table_is(c, 1, NULL, 0, 0));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 5);
    /* a sequence's new table may keep its own blocks; the rest go back */
    CHECK_OK(ferry_paged_cache_set_table(c, 0, (const int32_t[]) {2, 6}, 2, 5));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 6);
    /* the blocks let go come back in their table's order, then the rest lowest first */
    CHECK_OK(ferry_paged_cache_allocate(c, 1, 4));
    CHECK(table_is(c, 1, (const int32_t[]) {5}, 1, 4));
    CHECK_OK(ferry_paged_cache_allocate(c, 2, 16));
    CHECK(table_is(c, 2, (const int32_t[]) {1, 0, 3, 4}, 4, 16));
    ferry_paged_cache_free(c);

    /* with share_blocks, two tables may hold a block; it is free when neither does */
    p.share_blocks = true;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_paged_cache_set_table(c, 0, (const int32_t[]) {0, 1}, 2, 8));
    CHECK_OK(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {0, 2}, 2, 6));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 5);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 2, (const int32_t[]) {0, 0}, 2, 6), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_paged_cache_free_seq(c, 0));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 6); /* block 0 still sequence 1's */
    CHECK_OK(ferry_paged_cache_free_seq(c, 1));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 8);
    ferry_paged_cache_free(c);
}

/* A table set with more blocks than its cells fill keeps them: append fills them before it takes
 * more, and every block is in a table or free, whatever the calls. */
static void test_a_table_keeps_the_blocks_it_was_given(void) {
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.n_blocks = 8;
    p.n_seq = 2;
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_paged_cache_set_table(c, 0, (const int32_t[]) {5, 6, 7}, 3, 1));
    CHECK_OK(ferry_paged_cache_append(c, 0, 4)); /* 5 cells: into block 6, block 7 still its own */
    CHECK(table_is(c, 0, (const int32_t[]) {5, 6, 7}, 3, 5));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 5);
    CHECK_OK(ferry_paged_cache_append(c, 0, 7)); /* 12: block 7 filled, none taken */
    CHECK(table_is(c, 0, (const int32_t[]) {5, 6, 7}, 3, 12));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 5);
    CHECK_OK(ferry_paged_cache_append(c, 0, 1)); /* 13: the next from the free list */
    CHECK(table_is(c, 0, (const int32_t[]) {5, 6, 7, 0}, 4, 13));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 4);
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {7}, 1, 1), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "id 7, which sequence 0's table holds") != NULL);
    /* blocks and no cells: an append fills them too */
    CHECK_OK(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {3, 2}, 2, 0));
    CHECK_OK(ferry_paged_cache_append(c, 1, 5));
    CHECK(table_is(c, 1, (const int32_t[]) {3, 2}, 2, 5));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 2);
    CHECK_OK(ferry_paged_cache_free_seq(c, 0));
    CHECK_OK(ferry_paged_cache_free_seq(c, 1));
    CHECK_EQ_U(ferry_paged_cache_free_blocks(c), 8);
    ferry_paged_cache_free(c);
}

static void test_bad_params_refused(void) {
    ferry_paged_cache * c = NULL;
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    CHECK_FAILS(ferry_paged_cache_new(NULL, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, NULL), FERRY_ERR_INVALID_ARG);
    p.block_size = 0;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_INVALID_ARG);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.n_blocks = (int64_t) INT32_MAX + 1;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_OUT_OF_BOUNDS);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.n_seq = FERRY_PAGED_MAX_SEQ + 1;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "n_seq 1048577") != NULL);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    p.block_size = INT64_MAX / 2;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_OUT_OF_BOUNDS);
    p = params_of(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, false);
    p.head_dim = 16; /* q8_0 rows of whole blocks of 32 */
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_LAYOUT);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_Q8_0, false);
    p.head_dim = 16;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_LAYOUT);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_Q8_0, true);
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "transposed V") != NULL);
    p = params_of((ferry_type) 99, FERRY_TYPE_F16, false);
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_UNKNOWN_TYPE);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    CHECK_FAILS(ferry_paged_cache_new(&p, NULL, NULL, &c), FERRY_ERR_INVALID_ARG);
    CHECK(c == NULL);
}

/* The refusals both caches get from their shared spine (kv-layers.c) name the cache they come from. */
static void test_spine_refusals_name_their_cache(void) {
    ferry_paged_cache * c = NULL;
    ferry_kv_cache * kv = NULL;
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_Q8_0, true);
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_LAYOUT);
    CHECK(strcmp(ferry_last_error(), "paged_cache: a transposed V (v_trans) cannot be q8_0 (type_v): cells would "
                 "split blocks") == 0);
    const ferry_kv_params kp = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_Q8_0, .head_dim = HEAD_DIM,
                                .n_head_kv = N_HEAD_KV, .n_ctx = 8, .n_stream = 2, .n_layer = N_LAYER, .v_trans = true};
    CHECK_FAILS(ferry_kv_cache_new(&kp, ferry_cpu_buffer_type(), &kv), FERRY_ERR_LAYOUT);
    CHECK(strcmp(ferry_last_error(), "kv_cache: a transposed V (v_trans) cannot be q8_0 (type_v): cells would "
                 "split blocks") == 0);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    CHECK_FAILS(ferry_paged_cache_new(&p, NULL, NULL, &c), FERRY_ERR_INVALID_ARG); /* the first such layer named */
    CHECK(strcmp(ferry_last_error(), "paged_cache_new: layer 0 has no buffer type (host_buft is NULL)") == 0);
    p.head_dim = 2000000000; /* each pool 8e18 bytes: two layers' pools overflow a size_t */
    p.n_head_kv = 1;
    p.n_blocks = 500000000;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strcmp(ferry_last_error(), "paged_cache: 2 layers of K and V pools overflow a buffer's size") == 0);
    p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, false);
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    ferry_tensor * t;
    CHECK_FAILS(ferry_paged_cache_k(c, N_LAYER, &t), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strcmp(ferry_last_error(), "paged_cache_k: layer 2 is not in 0..1") == 0);
    CHECK_OK(ferry_paged_cache_v(c, 1, &t));
    CHECK(strcmp(t->name, "paged_v_l1") == 0);
    ferry_paged_cache_free(c);
    CHECK(kv == NULL);
}

/* Every argument of the cache's functions refused where it is out of range or NULL. */
static void test_arguments_refused(void) {
    ferry_paged_cache * c = NULL;
    const ferry_paged_params good = params_of(FERRY_TYPE_F32, FERRY_TYPE_F32, false);
    ferry_paged_params p = good;
    p.type_v = (ferry_type) -1;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_UNKNOWN_TYPE);
    CHECK(strstr(ferry_last_error(), "type_v -1") != NULL);
    int64_t * fields[5] = {&p.head_dim, &p.n_head_kv, &p.n_blocks, &p.n_seq, &p.block_size}; /* each 0 in turn */
    for (int f = 0; f < 5; f++) {
        p = good;
        *fields[f] = 0;
        CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_INVALID_ARG);
    }
    p = good;
    p.n_layer = 0;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_INVALID_ARG);
    p = good;
    p.head_dim = INT64_MAX / 2 + 1;
    CHECK_FAILS(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_paged_cache_free(NULL);
    /* over the caller's buffers: NULLs, a missing K, a K pool that does not fit */
    uint8_t * mem = aligned_alloc(64, 1 << 16);
    CHECK(mem != NULL);
    ferry_buffer * host;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, 1 << 16, &host));
    p = good;
    p.n_layer = 1;
    p.n_blocks = 8;
    ferry_buffer * bufs[1] = {host}, * none[1] = {NULL};
    const size_t at[1] = {0}, past[1] = {1 << 16};
    CHECK_FAILS(ferry_paged_cache_new_over(&p, bufs, NULL, bufs, at, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, bufs, at, NULL, at, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, bufs, at, bufs, NULL, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, bufs, at, bufs, at, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(NULL, bufs, at, bufs, at, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, none, at, bufs, at, &c), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 0 has no K pool buffer") != NULL);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, bufs, past, bufs, at, &c), FERRY_ERR_OUT_OF_BOUNDS);
    /* the cache's getters and tables, each argument out of range */
    CHECK_OK(ferry_paged_cache_new_over(&p, bufs, at, bufs, at, &c));
    ferry_tensor * t;
    ferry_paged_params got;
    CHECK_FAILS(ferry_paged_cache_params(c, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_params(NULL, &got), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_k(c, -1, &t), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_v(c, 1, &t), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_v(c, 0, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(ferry_paged_cache_layer_buffer(NULL, 0) == NULL && ferry_paged_cache_layer_buffer_type(c, 1) == NULL);
    CHECK(ferry_paged_cache_layer_buffer(c, -1) == NULL && ferry_paged_cache_layer_buffer(c, 0) == host);
    CHECK_FAILS(ferry_paged_cache_allocate(NULL, 0, 1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_append(c, 5, 1), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_append(c, 0, 8 * BS + 1), FERRY_ERR_INVALID_ARG);
    CHECK_OK(ferry_paged_cache_append(c, 0, 5)); /* an empty sequence grows from nothing */
    CHECK(table_is(c, 0, (const int32_t[]) {0, 1}, 2, 5));
    CHECK_FAILS(ferry_paged_cache_set_table(c, 1, (const int32_t[]) {3}, 1, -1), FERRY_ERR_INVALID_ARG);
    int64_t n, cells;
    CHECK_FAILS(ferry_paged_cache_table(c, -1, NULL, 0, &n, &cells), FERRY_ERR_OUT_OF_BOUNDS);
    size_t off;
    CHECK_FAILS(ferry_paged_cache_cell_offset(c, false, N_SEQ, 0, &off), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_cell_offset(c, false, 0, -1, &off), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_paged_cache_cell_offset(c, true, 0, 4, &off)); /* V not transposed: a cell's row */
    CHECK_EQ_U(off, (size_t) (1 * BS + 0) * HEAD_DIM * N_HEAD_KV * 4);
    /* an empty window's plan: no copy, into room for some */
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 4, 1, 2, &k, NULL));
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_paged_plan plan;
    ferry_gather_copy copies[2];
    size_t n_copies;
    CHECK_OK(ferry_copy_paged_plan(k, cpu, &plan, copies, 2, &n_copies));
    CHECK(plan.bytes == 0 && plan.calls == 0 && n_copies == 0 && plan.method == FERRY_GATHER_RUNS);
    ferry_backend_free(cpu);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
    ferry_buffer_free(host);
    free(mem);
}

/* A new cache reads zeros, though its memory held other bytes (glibc fills every allocation with
 * 0xA5 here: M_PERTURB); one over the caller's pools keeps what they hold. */
static void test_new_cache_reads_zeros_one_over_arrays_keeps_them(void) {
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0x5A);
#endif
    const ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F32, true);
    ferry_backend * dev;
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    ferry_buffer_type * bufts[N_LAYER] = {NULL, ferry_backend_default_buffer_type(dev)};
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), bufts, &c));
    CHECK(ferry_paged_cache_layer_buffer_type(c, 0) == ferry_cpu_buffer_type());
    CHECK(ferry_paged_cache_layer_buffer_type(c, 1) == bufts[1]);
    CHECK(ferry_paged_cache_layer_buffer(c, 0) != ferry_paged_cache_layer_buffer(c, 1));
    CHECK(ferry_paged_cache_layer_buffer(c, 2) == NULL && ferry_paged_cache_layer_buffer_type(c, -1) == NULL);
    for (int32_t l = 0; l < N_LAYER; l++) {
        const ferry_buffer * buf = ferry_paged_cache_layer_buffer(c, l);
        const uint8_t * base = ferry_buffer_base(buf);
        bool zero = true;
        for (size_t i = 0; i < ferry_buffer_size(buf); i++) zero = zero && base[i] == 0;
        CHECK(zero);
    }
#ifdef __GLIBC__
    mallopt(M_PERTURB, 0);
#endif
    ferry_tensor *k, *v;
    CHECK_OK(ferry_paged_cache_k(c, 1, &k));
    CHECK_OK(ferry_paged_cache_v(c, 1, &v));
    CHECK(k->ne[0] == HEAD_DIM * N_HEAD_KV && k->ne[1] == N_BLOCKS * BS && k->type == FERRY_TYPE_F16);
    CHECK(v->ne[0] == N_BLOCKS * BS && v->ne[1] == HEAD_DIM * N_HEAD_KV && v->type == FERRY_TYPE_F32);
    CHECK_FAILS(ferry_paged_cache_k(c, 2, &k), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_paged_params got;
    CHECK_OK(ferry_paged_cache_params(c, &got));
    CHECK(got.n_blocks == N_BLOCKS && got.v_trans);
    ferry_paged_cache_free(c);

    /* over the caller's memory: kept, not cleared */
    const size_t k_bytes = (size_t) (HEAD_DIM * N_HEAD_KV * N_BLOCKS * BS) * 2;
    const size_t v_bytes = (size_t) (HEAD_DIM * N_HEAD_KV * N_BLOCKS * BS) * 4;
    uint8_t * mem = malloc(k_bytes + v_bytes);
    CHECK(mem != NULL);
    for (size_t i = 0; i < k_bytes + v_bytes; i++) mem[i] = kv_pattern(i);
    ferry_buffer * host;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, k_bytes + v_bytes, &host));
    ferry_buffer * ks[N_LAYER] = {host, host}, * vs[N_LAYER] = {host, host};
    const size_t k_off[N_LAYER] = {0, 0}, v_off[N_LAYER] = {k_bytes, k_bytes};
    CHECK_OK(ferry_paged_cache_new_over(&p, ks, k_off, vs, v_off, &c));
    CHECK(mem[5] == kv_pattern(5) && mem[k_bytes + 7] == kv_pattern(k_bytes + 7));
    CHECK(ferry_paged_cache_free_blocks(c) == N_BLOCKS && table_is(c, 0, NULL, 0, 0));
    ferry_paged_cache_free(c);
    /* a pool that does not fit, and K and V in memories of two types */
    const size_t past[N_LAYER] = {k_bytes + 64, k_bytes + 64};
    CHECK_FAILS(ferry_paged_cache_new_over(&p, ks, k_off, vs, past, &c), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "layer 0") != NULL);
    ferry_buffer * other;
    CHECK_OK(ferry_backend_alloc_buffer(dev, v_bytes, &other));
    ferry_buffer * vs_other[N_LAYER] = {host, other};
    const size_t zero[N_LAYER] = {0, 0};
    CHECK_FAILS(ferry_paged_cache_new_over(&p, ks, k_off, vs_other, zero, &c), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1's K and V pools") != NULL);
    ferry_buffer * none[N_LAYER] = {host, NULL};
    CHECK_FAILS(ferry_paged_cache_new_over(&p, ks, k_off, none, v_off, &c), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_new_over(&p, NULL, k_off, vs, v_off, &c), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(other);
    ferry_buffer_free(host);
    free(mem);
    ferry_backend_free(dev);
}

/* ---------------------------------------------------------------- windows */

/* A paged window has the layout of a cell-per-stream window's compact copy. */
static void test_window_layout_is_the_compact_one(void) {
    for (int trans = 0; trans < 2; trans++) {
        const ferry_paged_params p = params_of(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, trans);
        const ferry_kv_params kp = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_F16, .head_dim = HEAD_DIM,
                                    .n_head_kv = N_HEAD_KV, .n_ctx = N_SEQ * 32, .n_stream = N_SEQ, .n_layer = 1,
                                    .v_trans = trans};
        ferry_paged_cache * c;
        ferry_kv_cache * kv;
        ferry_context * ctx;
        CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
        CHECK_OK(ferry_kv_cache_new(&kp, NULL, &kv));
        CHECK_OK(ferry_context_new(&ctx));
        ferry_tensor *pk, *pv, *ck, *cv, *compact;
        CHECK_OK(ferry_paged_cache_window(c, ctx, 1, N_KV, 1, 3, &pk, &pv));
        CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, N_KV, 1, 3, &ck, &cv));
        CHECK_OK(ferry_tensor_compact_layout(ctx, ck, &compact));
        CHECK(ferry_tensor_same_layout(pk, compact) && pk->paged && pk->paged_first_seq == 1);
        CHECK_OK(ferry_tensor_compact_layout(ctx, cv, &compact));
        CHECK(ferry_tensor_same_layout(pv, compact) && pv->paged);
        CHECK(strcmp(pk->name, "paged_window_k_l1") == 0 && strcmp(pv->name, "paged_window_v_l1") == 0);
        /* the scheduler's compact layout of a paged window is its own */
        CHECK_OK(ferry_tensor_compact_layout(ctx, pv, &compact));
        CHECK(ferry_tensor_same_layout(pv, compact) && !compact->paged);
        CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 1, 4, 4, NULL, &pv)); /* either output may be NULL */
        CHECK_FAILS(ferry_paged_cache_window(c, ctx, 2, N_KV, 0, 1, &pk, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_paged_cache_window(c, ctx, 0, 0, 0, 1, &pk, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_paged_cache_window(c, ctx, 0, N_BLOCKS * BS + 1, 0, 1, &pk, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_paged_cache_window(c, ctx, 0, N_KV, 2, 1, &pk, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_paged_cache_window(c, ctx, 0, N_KV, 0, N_SEQ, &pk, NULL), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_paged_cache_window(c, NULL, 0, N_KV, 0, 1, &pk, NULL), FERRY_ERR_INVALID_ARG);
        ferry_context_free(ctx);
        ferry_kv_cache_free(kv);
        ferry_paged_cache_free(c);
    }
}

/* Nothing reads a paged window where it lies: its strides are not where its cells are. */
static void test_windows_are_not_read_in_place(void) {
    const ferry_paged_params p = params_of(FERRY_TYPE_F32, FERRY_TYPE_F32, false);
    ferry_paged_cache * c;
    ferry_context * ctx;
    ferry_backend * cpu;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_context_new(&ctx));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_tensor *k, *v, *view, *copy;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 0, N_KV, 0, 1, &k, &v));
    char byte[4];
    CHECK_FAILS(ferry_tensor_get(k, byte, 0, 4), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "'paged_window_k_l0' is a paged window") != NULL);
    CHECK_FAILS(ferry_tensor_set(k, byte, 0, 4), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_memset(k, 0, 0, 4), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_permute(ctx, k, 0, 2, 1, 3, &view), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_transpose(ctx, k, &view), FERRY_ERR_INVALID_ARG);
    const int64_t ne[1] = {4};
    CHECK_FAILS(ferry_tensor_view(ctx, k, 1, ne, NULL, 0, &view), FERRY_ERR_INVALID_ARG);
    ferry_memory_kind kind;
    int device;
    void * data;
    CHECK_FAILS(ferry_tensor_memory(k, &kind, &device, &data), FERRY_ERR_INVALID_ARG);
    ferry_buffer * buf;
    CHECK_OK(paged_split_copy(cpu, ctx, k, &buf, &copy));
    CHECK_FAILS(ferry_tensor_copy(k, copy), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_copy(copy, k), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_tensor_copy_async(cpu, cpu, k, copy), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_backend_tensor_set_async(cpu, k, byte, 0, 4), FERRY_ERR_INVALID_ARG);
    /* a kernel over it directly: refused; the scheduler gathers it instead */
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD_KV, 1, 2}, ne_len[1] = {2};
    ferry_tensor *q, *len, *out;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len));
    CHECK_OK(ferry_attn_decode(ctx, q, k, v, len, 1.0f, false, &out));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, out));
    ferry_gallocr * ga;
    ferry_buffer_type * bt = ferry_cpu_buffer_type();
    CHECK_OK(ferry_gallocr_new_n(&bt, 1, &ga));
    CHECK_OK(ferry_gallocr_alloc_graph(ga, g));
    CHECK_FAILS(ferry_backend_graph_compute(cpu, g), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "graph_compute: 'paged_window_") != NULL);
    ferry_gallocr_free(ga);
    ferry_graph_free(g);
    ferry_buffer_free(buf);
    ferry_backend_free(cpu);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
}

/* ---------------------------------------------------------------- the gather, under the sentinel */

typedef struct {
    ferry_type tk, tv;
    bool v_trans;
} types_case;

static const double adjacencies[] = {0.0, 0.25, 0.5, 0.9, 1.0};

static const types_case type_cases[] = {
    {FERRY_TYPE_F16, FERRY_TYPE_F16, false},
    {FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false},
    {FERRY_TYPE_F16, FERRY_TYPE_F32, true},
    {FERRY_TYPE_F32, FERRY_TYPE_F16, true},
};

/* One window (K or V) of layer 1 over sequences 1..4 gathered into backend by method under
 * policy, with or without kv_len; the sentinel check, the bytes and the calls. */
static void gather_one(ferry_paged_cache * c, ferry_backend * backend, ferry_backend * cpu, bool v,
                       ferry_gather_method method, ferry_copy_policy policy, bool with_lengths, uint64_t seed) {
    int64_t cells[N_SEQ];
    int32_t lens[NS];
    draw_lengths(seed, cells, lens, NS);
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *vw, *len, *copy;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 1, N_KV, 1, NS, &k, &vw));
    ferry_tensor * w = v ? vw : k;
    ferry_paged_params p;
    CHECK_OK(ferry_paged_cache_params(c, &p));
    const int64_t ns = NS;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ns, &len));
    ferry_buffer * len_buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, sizeof(lens), &len_buf));
    CHECK_OK(ferry_buffer_place_tensor(len_buf, len, 0));
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    int64_t used[NS];
    for (int64_t s = 0; s < NS; s++) {
        int64_t n, held;
        CHECK_OK(ferry_paged_cache_table(c, 1 + s, NULL, 0, &n, &held));
        used[s] = with_lengths ? lens[s] : (held < N_KV ? held : N_KV);
    }
    if (with_lengths) {
        CHECK_OK(ferry_tensor_set_used_cells(w, len, v && p.v_trans ? 0 : 1, 3, N_KV));
    }
    ferry_buffer * buf;
    CHECK_OK(paged_split_copy(backend, ctx, w, &buf, &copy));
    ferry_buffer_reset_stats(buf);
    CHECK_OK(ferry_paged_cache_set_gather(c, method));
    ferry_paged_plan plan;
    size_t n_copies;
    CHECK_OK(ferry_copy_paged_plan(w, backend, &plan, NULL, 0, &n_copies));
    ferry_copy_stats stats;
    CHECK_OK(ferry_copy_input(backend, policy, w, copy, &stats));
    /* a merged gather's spans carry their gaps across too: counted as crossed, never written to the copy */
    const int fail = paged_check_copy(c, v, 1, 1, NS, N_KV, used, copy,
                                      stats.bytes_copied - (plan.crossed_bytes - plan.bytes));
    if (fail) {
        fprintf(stderr, "seed %llu, %s, method %s, policy %s, lengths %d: check %d\n", (unsigned long long) seed,
                v ? "V" : "K", ferry_gather_method_name(method), ferry_copy_policy_name(policy), with_lengths, fail);
    }
    CHECK_EQ_U(fail, 0);
    uint64_t blocks, runs;
    paged_count(c, 1, NS, used, &blocks, &runs);
    CHECK_EQ_U(plan.blocks, blocks);
    CHECK_EQ_U(plan.runs, runs);
    CHECK_EQ_U(plan.crossed_bytes, stats.bytes_copied);
    CHECK_EQ_U(stats.bytes_read, plan.bytes);
    CHECK(plan.method == FERRY_GATHER_MERGED ? plan.crossed_bytes >= plan.bytes : plan.crossed_bytes == plan.bytes);
    CHECK(stats.path == policy && stats.gather == plan.method);
    CHECK(method == FERRY_GATHER_AUTO || plan.method == method);
    CHECK_EQ_U(stats.copy_calls, plan.calls);
    if (plan.method == FERRY_GATHER_PER_BLOCK) {
        CHECK_EQ_U(plan.calls, blocks);
    } else if (plan.method == FERRY_GATHER_RUNS) {
        CHECK(plan.calls <= runs);
        CHECK_EQ_U(n_copies, plan.copies);
    } else if (plan.method == FERRY_GATHER_MERGED) {
        CHECK_EQ_U(plan.calls, stats.bytes_copied > 0 ? 1 : 0);
        CHECK(plan.copies == plan.spans && plan.spans <= runs);
    } else {
        CHECK_EQ_U(plan.calls, stats.bytes_copied > 0 ? 1 : 0);
        CHECK_EQ_U(plan.copies, runs);
    }
    ferry_buffer_free(buf);
    ferry_buffer_free(len_buf);
    ferry_context_free(ctx);
}

static void gather_sweep(ferry_backend * backend, const ferry_gather_method * methods, int n_methods) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    for (size_t t = 0; t < sizeof(type_cases) / sizeof(type_cases[0]); t++) {
        const ferry_paged_params p = params_of(type_cases[t].tk, type_cases[t].tv, type_cases[t].v_trans);
        for (size_t a = 0; a < sizeof(adjacencies) / sizeof(adjacencies[0]); a++) {
            for (uint64_t seed = 1; seed <= 3; seed++) {
                ferry_paged_cache * c;
                CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
                paged_fill(c);
                int64_t cells[N_SEQ];
                int32_t lens[4];
                draw_lengths(seed, cells, lens, 4);
                paged_seed(seed * 100 + a);
                CHECK_OK(paged_random_tables(c, cells, N_SEQ, adjacencies[a], seed == 2));
                for (int m = 0; m < n_methods; m++) {
                    for (int v = 0; v < 2; v++) {
                        const int policy = (m + v + (int) seed) % FERRY_COPY_POLICY_COUNT;
                        SUB(gather_one(c, backend, cpu, v, methods[m], (ferry_copy_policy) policy, seed != 3, seed));
                    }
                }
                ferry_paged_cache_free(c);
            }
        }
    }
    ferry_backend_free(cpu);
}

static void test_gathers_move_the_used_cells_alone_on_the_standin(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    const ferry_gather_method methods[] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS, FERRY_GATHER_BATCHED,
                                           FERRY_GATHER_MERGED, FERRY_GATHER_AUTO};
    SUB(gather_sweep(standin, methods, 5));
    ferry_backend_free(standin);
}

/* A backend without a one-call gather: per block and per run; a copy queue's gather too. */
static void test_gathers_move_the_used_cells_alone_on_a_queue(void) {
    ferry_backend * dummy;
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dummy));
    const ferry_gather_method methods[] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS, FERRY_GATHER_AUTO};
    SUB(gather_sweep(dummy, methods, 3));
    ferry_backend_free(dummy);
    /* the stand-in's copy queue gathers in one call too, its rows when the worker gets there */
    ferry_backend *standin, *queue, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, true);
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    paged_fill(c);
    int64_t cells[N_SEQ];
    int32_t lens[4];
    draw_lengths(7, cells, lens, 4);
    CHECK_OK(paged_random_tables(c, cells, N_SEQ, 0.5, false));
    for (int v = 0; v < 4; v++) { /* K, V; batched, then merged (without a piece curve: the runs batched) */
        const ferry_gather_method method = v < 2 ? FERRY_GATHER_BATCHED : FERRY_GATHER_MERGED;
        ferry_context * ctx;
        CHECK_OK(ferry_context_new(&ctx));
        ferry_tensor *k, *vw, *copy;
        CHECK_OK(ferry_paged_cache_window(c, ctx, 0, N_KV, 1, 4, &k, &vw));
        ferry_buffer * buf;
        CHECK_OK(paged_split_copy(standin, ctx, v % 2 ? vw : k, &buf, &copy));
        CHECK_OK(ferry_paged_cache_set_gather(c, method));
        ferry_paged_plan plan;
        size_t n_copies;
        CHECK_OK(ferry_copy_paged_plan(v % 2 ? vw : k, queue, &plan, NULL, 0, &n_copies));
        ferry_copy_stats stats;
        CHECK_OK(ferry_copy_input_async(queue, FERRY_COPY_RAGGED, v % 2 ? vw : k, copy, &stats));
        CHECK_OK(ferry_backend_synchronize(queue));
        int64_t used[4];
        for (int s = 0; s < 4; s++) used[s] = cells[1 + s] < N_KV ? cells[1 + s] : N_KV;
        CHECK_EQ_U(stats.bytes_copied, plan.crossed_bytes);
        CHECK(plan.crossed_bytes == plan.bytes); /* no piece curve: a span is its run */
        CHECK_EQ_U(paged_check_copy(c, v % 2, 0, 1, 4, N_KV, used, copy, plan.bytes), 0);
        CHECK(stats.gather == method && stats.copy_calls == (stats.bytes_copied ? 1u : 0u));
        ferry_buffer_free(buf);
        ferry_context_free(ctx);
    }
    ferry_paged_cache_free(c);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/* A one-call gather (plain or merged) given a bad piece: past the window's end in one row or in
 * several, a size no offset can hold, rows overlapping themselves in the window or in the pool.
 * Refused with the status of the shared check, naming the gather and the piece's index, before any
 * piece moves: the window keeps its sentinel and nothing is counted or charged to the link. */
static void test_one_call_gathers_refuse_a_bad_piece_naming_it(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    enum { WINDOW = 256 };
    const int64_t ne = WINDOW / 4;
    ferry_tensor * t;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ne, &t));
    CHECK_OK(ferry_tensor_set_name(t, "window"));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(standin, WINDOW, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    unsigned char pool[1024], sentinel[WINDOW], got[WINDOW];
    for (size_t i = 0; i < sizeof(pool); i++) pool[i] = (unsigned char) (i * 7 + 1);
    memset(sentinel, 0xA5, sizeof(sentinel));
    /* a good piece first, then the bad one: the good one must not land either */
    const ferry_gather_copy good = {.src_offset = 0, .dst_offset = 0, .size = 16, .count = 2, .src_stride = 64,
                                    .dst_stride = 16};
    const struct {
        ferry_gather_copy piece;
        ferry_status status;
        const char * says;
    } bad[] = {
        {{.src_offset = 0, .dst_offset = 250, .size = 8, .count = 1}, FERRY_ERR_OUT_OF_BOUNDS,
         "pieces[1]: 8 bytes at offset 250 reach past the 256 bytes of 'window'"},
        {{.src_offset = 0, .dst_offset = 128, .size = 8, .count = 4, .src_stride = 8, .dst_stride = 64},
         FERRY_ERR_OUT_OF_BOUNDS, "pieces[1]: 4 rows of 8 bytes at offset 128, stride 64, reach past the 256 bytes"},
        {{.src_offset = 0, .dst_offset = 0, .size = (size_t) INT64_MAX + 1, .count = 1}, FERRY_ERR_INVALID_ARG,
         "pieces[1]: offset 0 or size"},
        {{.src_offset = 0, .dst_offset = 64, .size = 16, .count = 2, .src_stride = 16, .dst_stride = 8},
         FERRY_ERR_LAYOUT, "pieces[1]: strides (tensor 8, data 16) are smaller than the row of 16 bytes"},
        {{.src_offset = 0, .dst_offset = 64, .size = 16, .count = 2, .src_stride = 8, .dst_stride = 16},
         FERRY_ERR_LAYOUT, "pieces[1]: strides (tensor 16, data 8) are smaller than the row of 16 bytes"},
    };
    const ferry_gather_copy span = {.src_offset = 0, .dst_offset = 0, .size = 256, .count = 1};
    for (int merged = 0; merged < 2; merged++) {
        const char * gather = merged ? "tensor_gather_merged_async: " : "tensor_gather_async: ";
        for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
            CHECK_OK(ferry_tensor_set(t, sentinel, 0, WINDOW));
            ferry_backend_reset_stats(standin);
            CHECK_OK(ferry_standin_reset_link_stats(standin));
            const ferry_gather_copy pieces[2] = {good, bad[b].piece};
            if (merged) {
                CHECK_FAILS(ferry_backend_tensor_gather_merged_async(standin, t, (const char *) pool, &span, 1, pieces,
                                                                     2),
                            bad[b].status);
            } else {
                CHECK_FAILS(ferry_backend_tensor_gather_async(standin, t, (const char *) pool, pieces, 2,
                                                              FERRY_GATHER_BATCHED),
                            bad[b].status);
            }
            const char * msg = ferry_last_error();
            if (strncmp(msg, gather, strlen(gather)) != 0 || !strstr(msg, bad[b].says)) {
                fprintf(stderr, "bad piece %zu, %s: '%s'\n", b, merged ? "merged" : "plain", msg);
            }
            CHECK(strncmp(msg, gather, strlen(gather)) == 0 && strstr(msg, bad[b].says) != NULL);
            CHECK_OK(ferry_backend_synchronize(standin));
            CHECK_OK(ferry_tensor_get(t, got, 0, WINDOW));
            CHECK(memcmp(got, sentinel, WINDOW) == 0);
            ferry_stats stats;
            CHECK_OK(ferry_backend_get_stats(standin, &stats));
            CHECK_EQ_U(stats.calls[FERRY_XFER_SET_2D] + stats.bytes[FERRY_XFER_SET_2D], 0);
            ferry_link_stats link;
            CHECK_OK(ferry_standin_get_link(standin, NULL, &link));
            CHECK_EQ_U(link.transfers + link.bytes, 0);
        }
        /* the same call with the good piece alone goes through: the refusals above were the bad piece's */
        CHECK_OK(ferry_tensor_set(t, sentinel, 0, WINDOW));
        if (merged) {
            CHECK_OK(ferry_backend_tensor_gather_merged_async(standin, t, (const char *) pool, &span, 1, &good, 1));
        } else {
            CHECK_OK(
                ferry_backend_tensor_gather_async(standin, t, (const char *) pool, &good, 1, FERRY_GATHER_BATCHED));
        }
        CHECK_OK(ferry_backend_synchronize(standin));
        CHECK_OK(ferry_tensor_get(t, got, 0, WINDOW));
        CHECK(memcmp(got, pool, 16) == 0 && memcmp(got + 16, pool + 64, 16) == 0 &&
              memcmp(got + 32, sentinel + 32, WINDOW - 32) == 0);
    }
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(standin);
}

/* The one-call gathers' own refusals, each naming what to change, nothing written: no backend or
 * tensor, no source, pieces or spans where some are counted, a backend with no one-call gather (the
 * CPU), and a method the stand-in (or its copy queue) does not gather by in one call (the kernel). */
static void test_one_call_gathers_refuse_bad_arguments_naming_them(void) {
    ferry_backend *standin, *queue, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    enum { WINDOW = 64 };
    const int64_t ne = WINDOW / 4;
    ferry_tensor *t, *on_cpu;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ne, &t));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &ne, &on_cpu));
    ferry_buffer *buf, *cpu_buf;
    CHECK_OK(ferry_backend_alloc_buffer(standin, WINDOW, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, WINDOW, &cpu_buf));
    CHECK_OK(ferry_buffer_place_tensor(cpu_buf, on_cpu, 0));
    unsigned char pool[WINDOW], sentinel[WINDOW], got[WINDOW];
    for (size_t i = 0; i < sizeof(pool); i++) pool[i] = (unsigned char) (i + 1);
    memset(sentinel, 0xA5, sizeof(sentinel));
    CHECK_OK(ferry_tensor_set(t, sentinel, 0, WINDOW));
    CHECK_OK(ferry_tensor_set(on_cpu, sentinel, 0, WINDOW));
    const char * src = (const char *) pool;
    const ferry_gather_copy piece = {.size = 16, .count = 1}, span = {.size = 16, .count = 1};
    const ferry_gather_method batched = FERRY_GATHER_BATCHED;
#define REFUSED(call, status, says)                                                                  \
    do {                                                                                             \
        CHECK_FAILS(call, status);                                                                   \
        if (!strstr(ferry_last_error(), says)) {                                                     \
            fprintf(stderr, "'%s' does not say '%s'\n", ferry_last_error(), says);                    \
        }                                                                                            \
        CHECK(strstr(ferry_last_error(), says) != NULL);                                             \
    } while (0)
    REFUSED(ferry_backend_tensor_gather_async(NULL, t, src, &piece, 1, batched), FERRY_ERR_INVALID_ARG,
            "tensor_gather_async: NULL backend");
    REFUSED(ferry_backend_tensor_gather_async(standin, NULL, src, &piece, 1, batched), FERRY_ERR_INVALID_ARG,
            "tensor_gather_async: NULL tensor");
    REFUSED(ferry_backend_tensor_gather_async(standin, t, NULL, &piece, 1, batched), FERRY_ERR_INVALID_ARG,
            "tensor_gather_async: NULL source or pieces");
    REFUSED(ferry_backend_tensor_gather_async(standin, t, src, NULL, 1, batched), FERRY_ERR_INVALID_ARG,
            "tensor_gather_async: NULL source or pieces");
    REFUSED(ferry_backend_tensor_gather_async(cpu, on_cpu, src, &piece, 1, batched), FERRY_ERR_UNSUPPORTED,
            "tensor_gather_async: CPU gathers in no single call");
    REFUSED(ferry_backend_tensor_gather_async(standin, t, src, &piece, 1, FERRY_GATHER_KERNEL), FERRY_ERR_UNSUPPORTED,
            "tensor_gather_async: CPU (stand-in device) gathers by batched copies alone");
    REFUSED(ferry_backend_tensor_gather_async(queue, t, src, &piece, 1, FERRY_GATHER_KERNEL), FERRY_ERR_UNSUPPORTED,
            "gathers by batched copies alone");
    REFUSED(ferry_backend_tensor_gather_merged_async(NULL, t, src, &span, 1, &piece, 1), FERRY_ERR_INVALID_ARG,
            "tensor_gather_merged_async: NULL backend");
    REFUSED(ferry_backend_tensor_gather_merged_async(standin, t, NULL, &span, 1, &piece, 1), FERRY_ERR_INVALID_ARG,
            "tensor_gather_merged_async: NULL source, spans or pieces");
    REFUSED(ferry_backend_tensor_gather_merged_async(standin, t, src, NULL, 1, &piece, 1), FERRY_ERR_INVALID_ARG,
            "tensor_gather_merged_async: NULL source, spans or pieces");
    REFUSED(ferry_backend_tensor_gather_merged_async(standin, t, src, &span, 1, NULL, 1), FERRY_ERR_INVALID_ARG,
            "tensor_gather_merged_async: NULL source, spans or pieces");
    REFUSED(ferry_backend_tensor_gather_merged_async(cpu, on_cpu, src, &span, 1, &piece, 1), FERRY_ERR_UNSUPPORTED,
            "tensor_gather_merged_async: CPU does not gather merged spans");
#undef REFUSED
    /* none counted: NULL lists are no refusal where they hold nothing, and nothing moves */
    CHECK_OK(ferry_backend_tensor_gather_async(standin, t, src, NULL, 0, batched));
    CHECK_OK(ferry_backend_tensor_gather_merged_async(standin, t, src, NULL, 0, NULL, 0));
    CHECK_OK(ferry_backend_synchronize(queue));
    CHECK_OK(ferry_backend_synchronize(standin));
    ferry_stats stats;
    CHECK_OK(ferry_backend_get_stats(standin, &stats));
    CHECK_EQ_U(stats.calls[FERRY_XFER_SET_2D] + stats.bytes[FERRY_XFER_SET_2D], 0);
    CHECK_OK(ferry_tensor_get(t, got, 0, WINDOW));
    CHECK(memcmp(got, sentinel, WINDOW) == 0);
    CHECK_OK(ferry_tensor_get(on_cpu, got, 0, WINDOW));
    CHECK(memcmp(got, sentinel, WINDOW) == 0);
    ferry_buffer_free(cpu_buf);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/* Pools in another device's memory: gathered by get into host memory, or staged into a device. */
static void test_device_pools_are_gathered_through_the_host(void) {
    ferry_backend *dev, *split, *cpu;
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    CHECK_OK(ferry_standin_backend_new(&split));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, true);
    ferry_buffer_type * on_dev = ferry_backend_default_buffer_type(dev);
    ferry_buffer_type * bufts[N_LAYER] = {on_dev, on_dev};
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, NULL, bufts, &c));
    paged_fill(c);
    int64_t cells[N_SEQ];
    int32_t lens[4];
    draw_lengths(11, cells, lens, 4);
    CHECK_OK(paged_random_tables(c, cells, N_SEQ, 0.5, false));
    ferry_backend * into[2] = {cpu, split};
    for (int b = 0; b < 2; b++) {
        for (int v = 0; v < 2; v++) {
            ferry_context * ctx;
            CHECK_OK(ferry_context_new(&ctx));
            ferry_tensor *k, *vw, *copy;
            CHECK_OK(ferry_paged_cache_window(c, ctx, 1, N_KV, 1, 4, &k, &vw));
            ferry_buffer * buf;
            CHECK_OK(paged_split_copy(into[b], ctx, v ? vw : k, &buf, &copy));
            ferry_paged_plan plan;
            size_t n;
            CHECK_OK(ferry_copy_paged_plan(v ? vw : k, into[b], &plan, NULL, 0, &n));
            CHECK(plan.method_seconds[FERRY_GATHER_BATCHED] < 0); /* no one-call gather from a device's memory */
            ferry_copy_stats stats;
            CHECK_OK(ferry_copy_input(into[b], FERRY_COPY_FLAT, v ? vw : k, copy, &stats));
            int64_t used[4];
            for (int s = 0; s < 4; s++) used[s] = cells[1 + s] < N_KV ? cells[1 + s] : N_KV;
            CHECK_EQ_U(paged_check_copy(c, v, 1, 1, 4, N_KV, used, copy, stats.bytes_copied), 0);
            CHECK(stats.gather == FERRY_GATHER_RUNS);
            /* forced to one call, refused */
            CHECK_OK(ferry_paged_cache_set_gather(c, FERRY_GATHER_BATCHED));
            CHECK_FAILS(ferry_copy_input(into[b], FERRY_COPY_FLAT, v ? vw : k, copy, &stats), FERRY_ERR_UNSUPPORTED);
            CHECK(strstr(ferry_last_error(), "does not offer the batched gather") != NULL);
            CHECK_OK(ferry_paged_cache_set_gather(c, FERRY_GATHER_AUTO));
            ferry_buffer_free(buf);
            ferry_context_free(ctx);
        }
    }
    ferry_paged_cache_free(c);
    ferry_backend_free(cpu);
    ferry_backend_free(split);
    ferry_backend_free(dev);
}

/* ---------------------------------------------------------------- the plan and its costs */

/* Sequence 0 of 8 full blocks: [0, 2, 4, 6, 8, 9, 10, 11]: four runs of one block at an even
 * stride, then one run of four. */
/*
 * Merged spans on a link whose small pieces are slow (1 KiB pieces at 0.05 GB/s, 5 GB/s past 16 KiB):
 * 16 blocks of 1 KiB with gaps of one and two blocks in turn (no even stride: no 2-D copy takes them)
 * are one span of 38 KiB, gaps and all, and auto takes it, more than twice as fast as a piece per
 * block batched by its prediction; the link charges the prediction exactly (the spans' call and the
 * device's gather after it), blocking or queued, and counts the gaps' bytes as crossed; the window
 * gets the used cells alone. Contiguous blocks, and two blocks far apart (one 2-D copy), go as before.
 * (The fixture's blocks are too small for the H100 profile's knee: test_paged.py holds it there.)
 */
static void test_merged_spans_cross_gaps_where_small_pieces_are_slow(void) {
    ferry_standin_params sp = ferry_standin_default_params();
    sp.link_gbps = 5;
    sp.latency_us = 2;
    sp.piece_floor_gbps = 0.05;
    sp.piece_knee_bytes = 16384;
    sp.piece_steepness = 8;
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_standin_backend_new_params(&sp, &standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    const ferry_paged_params p = params_of(FERRY_TYPE_F32, FERRY_TYPE_F32, false);
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    paged_fill(c);
    int32_t gapped[16];
    for (int i = 0; i < 16; i++) gapped[i] = i / 2 * 5 + i % 2 * 2; /* 0, 2, 5, 7, 10, ...: gaps of 1, 2, 1, ... */
    const int32_t contiguous[8] = {40, 41, 42, 43, 44, 45, 46, 47}, far[2] = {38, 63};
    CHECK_OK(ferry_paged_cache_set_table(c, 0, gapped, 16, 16 * BS));
    CHECK_OK(ferry_paged_cache_set_table(c, 1, contiguous, 8, 8 * BS));
    CHECK_OK(ferry_paged_cache_set_table(c, 2, far, 2, 2 * BS));
    const size_t block = HEAD_DIM * N_HEAD_KV * 4 * BS;
    for (int v = 0; v < 2; v++) {
        ferry_context * ctx;
        CHECK_OK(ferry_context_new(&ctx));
        ferry_tensor *k, *vw, *copy;
        CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 16 * BS, 0, 0, &k, &vw));
        ferry_tensor * w = v ? vw : k;
        ferry_paged_plan plan;
        ferry_gather_copy spans[16];
        size_t n;
        CHECK_OK(ferry_copy_paged_plan(w, standin, &plan, spans, 16, &n));
        CHECK(plan.method == FERRY_GATHER_MERGED && plan.spans == 1 && n == 1 && plan.copies == 1);
        CHECK(plan.blocks == 16 && plan.runs == 16 && plan.bytes == 16 * block && plan.crossed_bytes == 38 * block);
        CHECK(spans[0].src_offset == 0 && spans[0].size == 38 * block && spans[0].count == 1);
        CHECK(plan.method_seconds[FERRY_GATHER_MERGED] < plan.method_seconds[FERRY_GATHER_BATCHED]);
        if (!v) { /* one merge rule: the remote tier's (ferry_copy_pieces_merge) makes the same span of the blocks */
            const ferry_copy_cost_model model = ferry_backend_copy_cost_model(standin);
            ferry_copy_piece blocks[16];
            for (int i = 0; i < 16; i++) {
                blocks[i] = (ferry_copy_piece) {(size_t) gapped[i] * block, (size_t) gapped[i] * block, block};
            }
            size_t left = 16;
            uint64_t gaps = 0;
            CHECK_OK(ferry_copy_pieces_merge(&model, blocks, &left, &gaps));
            CHECK(left == 1 && blocks[0].src_offset == spans[0].src_offset && blocks[0].size == spans[0].size);
            CHECK(gaps == plan.crossed_bytes - plan.bytes);
        }
        ferry_buffer * buf;
        CHECK_OK(paged_split_copy(standin, ctx, w, &buf, &copy));
        CHECK_OK(ferry_standin_reset_link_stats(standin));
        ferry_copy_stats stats;
        CHECK_OK(ferry_copy_input(standin, FERRY_COPY_RAGGED, w, copy, &stats));
        ferry_link_stats link;
        CHECK_OK(ferry_standin_get_link(standin, NULL, &link));
        CHECK(fabs(link.modelled_seconds - plan.seconds) < 1e-12 * (1 + plan.seconds));
        CHECK(link.transfers == 1 && link.bytes == 38 * block);
        CHECK(stats.gather == FERRY_GATHER_MERGED && stats.bytes_copied == 38 * block &&
              stats.bytes_read == 16 * block);
        const int64_t used[1] = {16 * BS};
        CHECK_EQ_U(paged_check_copy(c, v, 0, 0, 1, 16 * BS, used, copy, plan.bytes), 0);
        /* on the copy queue: the same spans over the same link, the same cells */
        ferry_backend * queue;
        CHECK_OK(ferry_backend_get_copy_queue(standin, &queue));
        CHECK_OK(ferry_tensor_memset(copy, SENTINEL, 0, ferry_tensor_nbytes(copy)));
        CHECK_OK(ferry_standin_reset_link_stats(standin));
        CHECK_OK(ferry_copy_input_async(queue, FERRY_COPY_RAGGED, w, copy, &stats));
        CHECK_OK(ferry_backend_synchronize(queue));
        CHECK_OK(ferry_standin_get_link(standin, NULL, &link));
        CHECK(fabs(link.modelled_seconds - plan.seconds) < 1e-12 * (1 + plan.seconds));
        CHECK(link.transfers == 1 && link.bytes == 38 * block && stats.bytes_copied == 38 * block);
        CHECK_EQ_U(paged_check_copy(c, v, 0, 0, 1, 16 * BS, used, copy, plan.bytes), 0);
        ferry_buffer_free(buf);
        /* one run: merged is batched and a device gather after it (a call more): today's choice stays */
        const double gather_call = sp.latency_us * 1e-6;
        CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 8 * BS, 1, 1, &k, &vw));
        CHECK_OK(ferry_copy_paged_plan(v ? vw : k, standin, &plan, NULL, 0, &n));
        CHECK(plan.method != FERRY_GATHER_MERGED && plan.crossed_bytes == plan.bytes && plan.spans == 0);
        CHECK(fabs(plan.method_seconds[FERRY_GATHER_MERGED] - plan.method_seconds[FERRY_GATHER_BATCHED] -
                   gather_call) < 1e-12);
        /* 24 blocks apart: one span of 26 KiB, past the knee, beats two pieces of 1 KiB at the floor, but
         * two equal runs are one 2-D copy, whose rows move at the peak: the runs take it */
        CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 2 * BS, 2, 2, &k, &vw));
        CHECK_OK(ferry_copy_paged_plan(v ? vw : k, standin, &plan, NULL, 0, &n));
        CHECK(plan.method == FERRY_GATHER_RUNS && plan.calls == 1);
        CHECK(plan.method_seconds[FERRY_GATHER_MERGED] < plan.method_seconds[FERRY_GATHER_BATCHED]);
        ferry_context_free(ctx);
    }
    ferry_paged_cache_free(c);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

static void test_plan_predicts_what_the_link_charges(void) {
    const ferry_paged_params p = params_of(FERRY_TYPE_F32, FERRY_TYPE_F32, false);
    ferry_paged_cache * c;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_paged_cache_set_table(c, 0, (const int32_t[]) {0, 2, 4, 6, 8, 9, 10, 11}, 8, 8 * BS));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *v;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 8 * BS, 0, 0, &k, &v));
    const size_t cell = HEAD_DIM * N_HEAD_KV * 4, block = cell * BS;
    /* a stand-in whose rows cost less than calls: the equal runs at even strides are one 2-D copy */
    ferry_standin_params sp = ferry_standin_default_params();
    sp.link_gbps = 8;
    sp.latency_us = 2;
    sp.row_ns = 100;
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new_params(&sp, &standin));
    CHECK_OK(ferry_paged_cache_set_gather(c, FERRY_GATHER_RUNS));
    ferry_paged_plan plan;
    ferry_gather_copy copies[8];
    size_t n;
    CHECK_OK(ferry_copy_paged_plan(k, standin, &plan, copies, 8, &n));
    CHECK(plan.blocks == 8 && plan.runs == 5 && plan.bytes == 8 * block && plan.method == FERRY_GATHER_RUNS);
    CHECK_EQ_U(n, 2);
    CHECK_EQ_U(plan.calls, 2);
    CHECK(copies[0].src_offset == 0 && copies[0].dst_offset == 0 && copies[0].size == block && copies[0].count == 4 &&
          copies[0].src_stride == 2 * block && copies[0].dst_stride == block);
    CHECK(copies[1].src_offset == 8 * block && copies[1].dst_offset == 4 * block && copies[1].size == 4 * block &&
          copies[1].count == 1);
    const double bytes_s = (double) (8 * block) / 8e9;
    const double runs_s = 2 * 2e-6 + 4 * 100e-9 + bytes_s, per_block_s = 8 * 2e-6 + bytes_s;
    const double batched_s = 2e-6 + 5 * 100e-9 + bytes_s;
    CHECK(fabs(plan.seconds - runs_s) < 1e-12);
    CHECK(fabs(plan.method_seconds[FERRY_GATHER_PER_BLOCK] - per_block_s) < 1e-12);
    CHECK(fabs(plan.method_seconds[FERRY_GATHER_BATCHED] - batched_s) < 1e-12);
    CHECK(plan.method_seconds[FERRY_GATHER_KERNEL] < 0);
    CHECK(fabs(plan.method_seconds[FERRY_GATHER_AUTO] - batched_s) < 1e-12); /* the cheapest offered */
    CHECK_FAILS(ferry_copy_paged_plan(k, standin, &plan, copies, 1, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(n, 2);
    /* what the link charges for each method is the plan's prediction, exactly */
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_buffer * buf;
    ferry_tensor * copy;
    CHECK_OK(paged_split_copy(standin, ctx, k, &buf, &copy));
    const ferry_gather_method methods[3] = {FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS, FERRY_GATHER_BATCHED};
    for (int m = 0; m < 3; m++) {
        CHECK_OK(ferry_paged_cache_set_gather(c, methods[m]));
        CHECK_OK(ferry_copy_paged_plan(k, standin, &plan, NULL, 0, &n));
        CHECK_OK(ferry_standin_reset_link_stats(standin));
        ferry_copy_stats stats;
        CHECK_OK(ferry_copy_input(standin, FERRY_COPY_PLAN, k, copy, &stats));
        ferry_link_stats link;
        CHECK_OK(ferry_standin_get_link(standin, NULL, &link));
        CHECK(fabs(link.modelled_seconds - plan.seconds) < 1e-12 * (1 + plan.seconds) + 1e-15);
        CHECK_EQ_U(link.transfers, plan.calls);
        CHECK(stats.copy_seconds >= plan.seconds); /* held to the model's lower bound */
    }
    /* rows dearer than calls: no 2-D copy, and auto takes the runs over one call of dear pieces */
    sp.row_ns = 1e5;
    ferry_backend * rows_dear;
    CHECK_OK(ferry_standin_backend_new_params(&sp, &rows_dear));
    CHECK_OK(ferry_paged_cache_set_gather(c, FERRY_GATHER_AUTO));
    CHECK_OK(ferry_copy_paged_plan(k, rows_dear, &plan, copies, 8, &n));
    CHECK(plan.method == FERRY_GATHER_RUNS && n == 5 && plan.calls == 5 && copies[0].count == 1);
    CHECK(fabs(plan.method_seconds[FERRY_GATHER_AUTO] - plan.seconds) < 1e-15);
    /* the V window, not transposed, plans as K does */
    CHECK_OK(ferry_copy_paged_plan(v, rows_dear, &plan, NULL, 0, &n));
    CHECK(plan.runs == 5 && plan.bytes == 8 * block);
    ferry_buffer_free(buf);
    ferry_backend_free(rows_dear);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
}

static void test_short_tables_refused_before_a_byte_moves(void) {
    const ferry_paged_params p = params_of(FERRY_TYPE_F32, FERRY_TYPE_F32, true);
    ferry_paged_cache * c;
    ferry_context * ctx;
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c));
    CHECK_OK(ferry_context_new(&ctx));
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_paged_cache_set_table(c, 2, (const int32_t[]) {7, 3}, 2, 7));
    ferry_tensor *k, *v, *len, *copy, *plain;
    CHECK_OK(ferry_paged_cache_window(c, ctx, 0, 12, 2, 3, &k, &v));
    const int64_t two = 2;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, &two, &len));
    ferry_buffer *len_buf, *buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 8, &len_buf));
    CHECK_OK(ferry_buffer_place_tensor(len_buf, len, 0));
    CHECK_OK(paged_split_copy(standin, ctx, v, &buf, &copy));
    /* a length past the 7 cells the table holds, by every policy: named by stream, length, sequence and
     * cells; 8 is within its two blocks, where cell 7 holds nothing yet (it was gathered in silence) */
    int32_t lens[2] = {8, 0};
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    CHECK_OK(ferry_tensor_set_used_cells(v, len, 0, 3, 12));
    ferry_copy_stats stats;
    for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
        for (lens[0] = 8; lens[0] <= 9; lens[0]++) {
            CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
            CHECK_FAILS(ferry_copy_input(standin, (ferry_copy_policy) policy, v, copy, &stats), FERRY_ERR_OUT_OF_BOUNDS);
            char want[96];
            snprintf(want, sizeof want, "stream 0's length %d (of its unnamed lengths) is past the 7 cells sequence 2 holds",
                     (int) lens[0]);
            CHECK(strstr(ferry_last_error(), want) != NULL);
        }
    }
    /* nothing was written */
    uint8_t * got = malloc(ferry_tensor_nbytes(copy));
    CHECK(got != NULL);
    CHECK_OK(ferry_tensor_get(copy, got, 0, ferry_tensor_nbytes(copy)));
    bool untouched = true;
    for (size_t i = 0; i < ferry_tensor_nbytes(copy); i++) untouched = untouched && got[i] == SENTINEL;
    free(got);
    CHECK(untouched);
    /* lengths past the window's limit, as a ragged window's */
    lens[0] = 13;
    CHECK_OK(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    CHECK_FAILS(ferry_copy_input(standin, FERRY_COPY_RAGGED, v, copy, &stats), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "'paged_window_v_l0': stream 0's length 13") != NULL);
    /* used cells on dimensions that are not the window's cells and streams */
    CHECK_OK(ferry_tensor_set_used_cells(v, len, 1, 3, 0));
    CHECK_FAILS(ferry_copy_input(standin, FERRY_COPY_RAGGED, v, copy, &stats), FERRY_ERR_LAYOUT);
    /* the kernel where none is offered */
    CHECK_OK(ferry_tensor_set_used_cells(v, NULL, 0, 0, 0));
    CHECK_OK(ferry_paged_cache_set_gather(c, FERRY_GATHER_KERNEL));
    CHECK_FAILS(ferry_copy_input(standin, FERRY_COPY_PLAN, v, copy, &stats), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "does not offer the kernel gather") != NULL);
    CHECK_FAILS(ferry_paged_cache_set_gather(c, FERRY_GATHER_COUNT), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_cache_set_gather(NULL, FERRY_GATHER_RUNS), FERRY_ERR_INVALID_ARG);
    CHECK(ferry_paged_cache_get_gather(c) == FERRY_GATHER_KERNEL);
    CHECK(ferry_paged_cache_get_gather(NULL) == FERRY_GATHER_AUTO);
    /* the plan of what is not a paged window; NULLs */
    ferry_paged_plan plan;
    size_t n;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, &two, &plain));
    CHECK_FAILS(ferry_copy_paged_plan(plain, standin, &plan, NULL, 0, &n), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "is not a paged window") != NULL);
    CHECK_FAILS(ferry_copy_paged_plan(v, NULL, &plan, NULL, 0, &n), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_paged_plan(v, standin, NULL, NULL, 0, &n), FERRY_ERR_INVALID_ARG);
    /* the methods' names */
    for (int m = 0; m < FERRY_GATHER_COUNT; m++) {
        ferry_gather_method back;
        CHECK_OK(ferry_gather_method_from_name(ferry_gather_method_name((ferry_gather_method) m), &back));
        CHECK((int) back == m);
    }
    ferry_gather_method back;
    CHECK_FAILS(ferry_gather_method_from_name("fast", &back), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_gather_method_from_name(NULL, &back), FERRY_ERR_INVALID_ARG);
    CHECK(ferry_gather_method_name(FERRY_GATHER_COUNT) == NULL);
    /* cell offsets through the table */
    size_t at;
    CHECK_OK(ferry_paged_cache_cell_offset(c, false, 2, 5, &at));
    CHECK_EQ_U(at, (size_t) (3 * BS + 1) * HEAD_DIM * N_HEAD_KV * 4);
    CHECK_OK(ferry_paged_cache_cell_offset(c, true, 2, 2, &at));
    CHECK_EQ_U(at, (size_t) (7 * BS + 2) * 4);
    CHECK_FAILS(ferry_paged_cache_cell_offset(c, true, 2, 8, &at), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_cache_cell_offset(c, true, 2, 0, NULL), FERRY_ERR_INVALID_ARG);
    ferry_buffer_free(buf);
    ferry_buffer_free(len_buf);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
    ferry_context_free(ctx);
    ferry_paged_cache_free(c);
}

/* ---------------------------------------------------------------- attention through the scheduler */

static void same_as_cell_cache(ferry_type tk, ferry_type tv, bool v_trans, ferry_backend * split, ferry_backend * cpu,
                               int prefetch) {
    const ferry_gather_method methods[] = {FERRY_GATHER_AUTO, FERRY_GATHER_PER_BLOCK, FERRY_GATHER_RUNS,
                                           FERRY_GATHER_BATCHED};
    for (size_t a = 0; a < sizeof(adjacencies) / sizeof(adjacencies[0]); a++) {
        twin t;
        CHECK_OK(twin_init(&t, ferry_cpu_buffer_type(), tk, tv, v_trans, adjacencies[a], 20 + a));
        static float want[N_LAYER * OUT_FLOATS], got[N_LAYER * OUT_FLOATS];
        uint64_t bytes;
        CHECK_OK(run_step(&t, false, v_trans, split, cpu, FERRY_COPY_RAGGED, false, 0, want, &bytes));
        bool finite = true;
        for (int i = 0; i < N_LAYER * OUT_FLOATS; i++) finite = finite && isfinite(want[i]);
        CHECK(finite); /* the cell cache read none of its NaN */
        for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++) {
            const bool offered = methods[m] != FERRY_GATHER_BATCHED || split != cpu;
            for (int policy = 0; offered && policy < FERRY_COPY_POLICY_COUNT; policy++) {
                CHECK_OK(ferry_paged_cache_set_gather(t.paged, methods[m]));
                memset(got, 0, sizeof(got));
                CHECK_OK(run_step(&t, true, v_trans, split, cpu, (ferry_copy_policy) policy, policy % 2 == 1, prefetch,
                                  got, &bytes));
                if (memcmp(got, want, sizeof(got)) != 0) {
                    fprintf(stderr, "adjacency %g, method %s, policy %d: outputs differ\n", adjacencies[a],
                            ferry_gather_method_name(methods[m]), policy);
                }
                CHECK(memcmp(got, want, sizeof(got)) == 0);
                CHECK_EQ_U(bytes, read_bytes(&t, tk, tv));
            }
        }
        twin_free(&t);
    }
}

static void test_attention_same_as_cell_cache(void) {
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    SUB(same_as_cell_cache(FERRY_TYPE_F16, FERRY_TYPE_F16, false, standin, cpu, 0));
    SUB(same_as_cell_cache(FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false, standin, cpu, 0));
    SUB(same_as_cell_cache(FERRY_TYPE_F32, FERRY_TYPE_F16, true, standin, cpu, 0));
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/* Attention on the CPU, where the pools lie: the windows are gathered all the same. */
static void test_attention_on_the_cpu_reads_gathered_windows_too(void) {
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    SUB(same_as_cell_cache(FERRY_TYPE_F16, FERRY_TYPE_F32, true, cpu, cpu, 0));
    SUB(same_as_cell_cache(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, false, cpu, cpu, 0));
    ferry_backend_free(cpu);
}

/* Prefetched on the stand-in's copy queue: the same outputs and bytes. */
static void test_attention_prefetched_as_serial(void) {
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    SUB(same_as_cell_cache(FERRY_TYPE_F16, FERRY_TYPE_F16, true, standin, cpu, 1));
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/* A merged gather's spans land in the stand-in's staging before the runs are placed: the scheduler's
 * memory on the split holds it beside its buffer (the largest window's spans), where the same step
 * gathered batched holds the buffer alone; serial or prefetched, the split first in the scheduler or
 * after the CPU, with the outputs and the cells read of the batched step. */
static void test_merged_staging_is_memory_the_scheduler_holds(void) {
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    twin tw;
    CHECK_OK(twin_init(&tw, ferry_cpu_buffer_type(), FERRY_TYPE_F16, FERRY_TYPE_F16, false, 0.5, 43));
    static float want[N_LAYER * OUT_FLOATS], got[N_LAYER * OUT_FLOATS];
    for (int run = 0; run < 4; run++) {
        const int prefetch = run % 2;
        run_step_cpu_first = run >= 2;
        uint64_t batched_bytes, merged_bytes;
        CHECK_OK(ferry_paged_cache_set_gather(tw.paged, FERRY_GATHER_BATCHED));
        CHECK_OK(run_step(&tw, true, false, standin, cpu, FERRY_COPY_RAGGED, false, prefetch, want, &batched_bytes));
        const size_t batched = run_step_memory.held;
        CHECK(batched > 0 && run_step_memory.staged == 0);
        CHECK_OK(ferry_paged_cache_set_gather(tw.paged, FERRY_GATHER_MERGED));
        memset(got, 0, sizeof(got));
        CHECK_OK(run_step(&tw, true, false, standin, cpu, FERRY_COPY_RAGGED, false, prefetch, got, &merged_bytes));
        run_step_cpu_first = false;
        if (run_step_memory.held != batched + run_step_memory.staged) {
            fprintf(stderr, "prefetch %d, cpu first %d: held %zu, batched %zu, staged %zu\n", prefetch, run >= 2,
                    run_step_memory.held, batched, run_step_memory.staged);
        }
        /* the largest window's spans: its cells at least */
        CHECK(run_step_memory.staged >= merged_bytes / (2 * N_LAYER));
        CHECK_EQ_U(run_step_memory.held, batched + run_step_memory.staged);
        CHECK(memcmp(got, want, sizeof(got)) == 0);
        CHECK_EQ_U(merged_bytes, batched_bytes);
        CHECK_EQ_U(merged_bytes, read_bytes(&tw, FERRY_TYPE_F16, FERRY_TYPE_F16));
    }
    twin_free(&tw);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

static void test_paged_step_refusals_assign_nothing(void) {
    twin t;
    CHECK_OK(twin_init(&t, ferry_cpu_buffer_type(), FERRY_TYPE_F32, FERRY_TYPE_F32, false, 0.5, 3));
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_sched * sched;
    CHECK_OK(ferry_sched_new(&cpu, 1, &sched));
    ferry_graph * g;
    CHECK_OK(ferry_graph_new(&g));
    const int64_t ne_q[4] = {HEAD_DIM, N_HEAD, 1, NS}, ne_len[1] = {NS};
    ferry_tensor *q[N_LAYER], *len, *outs[N_LAYER];
    for (int l = 0; l < N_LAYER; l++) CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q, &q[l]));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len, &len));
    ferry_backend * b[N_LAYER] = {cpu, cpu};
    CHECK_FAILS(ferry_paged_attention_step_on(NULL, ctx, N_LAYER, N_KV, 1, NS, q, len, false, sched, b, g, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_attention_step_on(t.paged, ctx, N_LAYER, N_BLOCKS * BS + 1, 1, NS, q, len, false, sched, b,
                                              g, outs), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "a pool's cells") != NULL);
    CHECK_FAILS(ferry_paged_attention_step_on(t.paged, ctx, N_LAYER + 1, N_KV, 1, NS, q, len, false, sched, b, g, outs),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_paged_attention_step_on(t.paged, ctx, N_LAYER, N_KV, 1, NS, q, len, true, sched, b, g, outs),
                FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_paged_attention_step_on(t.paged, ctx, N_LAYER, N_KV, 1, N_SEQ, q, len, false, sched, b, g, outs),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(ferry_sched_n_assigned(sched), 0);
    CHECK_EQ_U(ferry_graph_n_nodes(g), 0);
    ferry_graph_free(g);
    ferry_sched_free(sched);
    ferry_context_free(ctx);
    ferry_backend_free(cpu);
    twin_free(&t);
}

static const check_test tests[] = {
    {"tables_come_from_the_free_list_in_order", test_tables_come_from_the_free_list_in_order},
    {"bad_tables_refused_naming_the_sequence_and_block", test_bad_tables_refused_naming_the_sequence_and_block},
    {"a_table_keeps_the_blocks_it_was_given", test_a_table_keeps_the_blocks_it_was_given},
    {"bad_params_refused", test_bad_params_refused},
    {"arguments_refused", test_arguments_refused},
    {"spine_refusals_name_their_cache", test_spine_refusals_name_their_cache},
    {"new_cache_reads_zeros_one_over_arrays_keeps_them", test_new_cache_reads_zeros_one_over_arrays_keeps_them},
    {"window_layout_is_the_compact_one", test_window_layout_is_the_compact_one},
    {"windows_are_not_read_in_place", test_windows_are_not_read_in_place},
    {"gathers_move_the_used_cells_alone_on_the_standin", test_gathers_move_the_used_cells_alone_on_the_standin},
    {"gathers_move_the_used_cells_alone_on_a_queue", test_gathers_move_the_used_cells_alone_on_a_queue},
    {"one_call_gathers_refuse_a_bad_piece_naming_it", test_one_call_gathers_refuse_a_bad_piece_naming_it},
    {"one_call_gathers_refuse_bad_arguments_naming_them", test_one_call_gathers_refuse_bad_arguments_naming_them},
    {"device_pools_are_gathered_through_the_host", test_device_pools_are_gathered_through_the_host},
    {"plan_predicts_what_the_link_charges", test_plan_predicts_what_the_link_charges},
    {"merged_spans_cross_gaps_where_small_pieces_are_slow", test_merged_spans_cross_gaps_where_small_pieces_are_slow},
    {"short_tables_refused_before_a_byte_moves", test_short_tables_refused_before_a_byte_moves},
    {"attention_same_as_cell_cache", test_attention_same_as_cell_cache},
    {"attention_on_the_cpu_reads_gathered_windows_too", test_attention_on_the_cpu_reads_gathered_windows_too},
    {"attention_prefetched_as_serial", test_attention_prefetched_as_serial},
    {"merged_staging_is_memory_the_scheduler_holds", test_merged_staging_is_memory_the_scheduler_holds},
    {"paged_step_refusals_assign_nothing", test_paged_step_refusals_assign_nothing},
};

CHECK_MAIN(tests)
