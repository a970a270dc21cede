/*
 * The device block pool (block-pool.c) from C: a shared block crosses once and a grown one its new
 * cells, counted alike by the pool and its buffers; every cell read through the device table is the
 * cache's; refusals change nothing; the step through the table gives the dense gather's bytes.
 */
#include "paged-fixture.h"

/* Sequences 0 and 1 share blocks 5 and 6, then own 7 and 8; sequence 2 owns 9. */
static ferry_paged_cache * shared_cache(bool v_trans) {
    ferry_paged_params p = params_of(FERRY_TYPE_F16, FERRY_TYPE_F16, v_trans);
    p.share_blocks = true;
    ferry_paged_cache * c = NULL;
    if (ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c) != FERRY_OK) return NULL;
    for (int32_t l = 0; l < N_LAYER; l++) {
        ferry_tensor * t[2];
        ferry_paged_cache_k(c, l, &t[0]);
        ferry_paged_cache_v(c, l, &t[1]);
        for (int i = 0; i < 2; i++) {
            uint8_t * b = t[i]->data;
            for (size_t j = 0; j < ferry_tensor_nbytes(t[i]); j++) b[j] = (uint8_t) (j * 7 + l * 3 + i);
        }
    }
    ferry_paged_cache_set_table(c, 0, (const int32_t[]) {5, 6, 7}, 3, 10);
    ferry_paged_cache_set_table(c, 1, (const int32_t[]) {5, 6, 8}, 3, 11);
    ferry_paged_cache_set_table(c, 2, (const int32_t[]) {9}, 1, 3);
    return c;
}

/* Every cell of sequences 0..n_seq - 1's first lens cells, K and V of every layer, read through the
 * pool's device table, equals the cache's. */
static bool reads_the_cache(const ferry_paged_cache * c, const ferry_block_pool * pool, int n_seq,
                            const int32_t * lens, bool v_trans) {
    ferry_tensor * table;
    ferry_block_pool_table(pool, &table);
    const int32_t * slots = table->data;
    const int64_t n_embd = HEAD_DIM * N_HEAD_KV, slot_cells = ferry_block_pool_n_slots(pool) * BS;
    for (int32_t l = 0; l < N_LAYER; l++) {
        for (int which = 0; which < 2; which++) {
            ferry_tensor *host, *dev;
            (which ? ferry_paged_cache_v : ferry_paged_cache_k)(c, l, &host);
            (which ? ferry_block_pool_v : ferry_block_pool_k)(pool, l, &dev);
            const bool trans = which && v_trans;
            for (int s = 0; s < n_seq; s++) {
                int32_t blocks[N_BLOCKS];
                int64_t nb, cells;
                ferry_paged_cache_table(c, s, blocks, N_BLOCKS, &nb, &cells);
                for (int cell = 0; cell < lens[s]; cell++) {
                    const int64_t h = (int64_t) blocks[cell / BS] * BS + cell % BS;
                    const int64_t d = (int64_t) slots[(int64_t) s * N_BLOCKS + cell / BS] * BS + cell % BS;
                    for (int64_t ch = 0; ch < (trans ? n_embd : 1); ch++) {
                        const size_t size = trans ? 2 : host->nb[1];
                        const char * hp = (const char *) host->data + (trans ? (size_t) (ch * N_BLOCKS * BS + h) * 2 : (size_t) h * size);
                        const char * dp = (const char *) dev->data + (trans ? (size_t) (ch * slot_cells + d) * 2 : (size_t) d * size);
                        if (memcmp(hp, dp, size) != 0) return false;
                    }
                }
            }
        }
    }
    return true;
}

static void test_a_shared_block_crosses_once_and_a_grown_one_its_new_cells(void) {
    for (int trans = 0; trans < 2; trans++) {
        ferry_paged_cache * c = shared_cache(trans);
        CHECK(c != NULL);
        ferry_backend * cpu;
        CHECK_OK(ferry_cpu_backend_new(&cpu));
        ferry_block_pool * pool;
        CHECK_OK(ferry_block_pool_new(c, cpu, 8, &pool));
        const uint64_t cell = 2 * (uint64_t) N_LAYER * HEAD_DIM * N_HEAD_KV * 2; /* K and V, f16 */
        CHECK_OK(ferry_block_pool_sync(pool, 0, 3, NULL));
        ferry_block_pool_stats s;
        CHECK_OK(ferry_block_pool_get_stats(pool, &s));
        CHECK_EQ_U(s.cell_bytes, 16 * cell); /* 5, 6 whole once, 2 + 3 + 3 cells */
        CHECK_EQ_U(s.blocks_sent, 5);
        CHECK_EQ_U(s.buffers.bytes[FERRY_XFER_SET] + s.buffers.bytes[FERRY_XFER_SET_2D], s.cell_bytes + s.table_bytes);
        CHECK(reads_the_cache(c, pool, 3, (const int32_t[]) {10, 11, 3}, trans));
        CHECK_OK(ferry_paged_cache_append(c, 2, 1));
        ferry_block_pool_reset_stats(pool);
        CHECK_OK(ferry_block_pool_sync(pool, 0, 3, NULL));
        CHECK_OK(ferry_block_pool_get_stats(pool, &s));
        CHECK_EQ_U(s.cell_bytes, cell);
        CHECK_EQ_U(s.blocks_grown, 1);
        CHECK_EQ_U(s.blocks_kept, 4);
        /* refused, nothing sent: more blocks than slots, a length past the cells */
        ferry_block_pool * small;
        CHECK_OK(ferry_block_pool_new(c, cpu, 4, &small));
        CHECK_FAILS(ferry_block_pool_sync(small, 0, 3, NULL), FERRY_ERR_OUT_OF_MEMORY);
        CHECK(strstr(ferry_last_error(), "read 5 blocks, but the pool has 4 slots") != NULL);
        CHECK_FAILS(ferry_block_pool_sync(small, 0, 1, (const int32_t[]) {11}), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_block_pool_new(c, cpu, 0, &small), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_OK(ferry_block_pool_get_stats(small, &s));
        CHECK_EQ_U(s.buffers.calls[FERRY_XFER_SET] + s.buffers.calls[FERRY_XFER_SET_2D] + s.syncs, 0);
        ferry_block_pool_free(small);
        ferry_block_pool_free(pool);
        ferry_backend_free(cpu);
        ferry_paged_cache_free(c);
    }
}

static void test_the_step_through_the_table_is_the_dense_gathers(void) {
    ferry_paged_cache * c = shared_cache(true);
    CHECK(c != NULL);
    ferry_backend *dev, *cpu;
    CHECK_OK(ferry_standin_backend_new(&dev));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_backend * const backends[2] = {dev, cpu};
    ferry_block_pool * pool;
    CHECK_OK(ferry_block_pool_new(c, dev, 8, &pool));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t qne[4] = {HEAD_DIM, 2 * N_HEAD_KV, 1, 3}, lne[1] = {3};
    ferry_tensor *q[N_LAYER], *kv_len, *outs[2][N_LAYER];
    for (int l = 0; l < N_LAYER; l++) CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, qne, &q[l]));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, lne, &kv_len));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 4096 * 8, &buf));
    size_t off = 0;
    for (int l = 0; l < N_LAYER; l++) {
        CHECK_OK(ferry_buffer_place_tensor(buf, q[l], off));
        float * v = q[l]->data;
        for (int64_t i = 0; i < HEAD_DIM * 2 * N_HEAD_KV * 3; i++) v[i] = (float) ((i * 37 % 101) - 50) / 64.0f;
        off += ferry_tensor_nbytes(q[l]);
    }
    CHECK_OK(ferry_buffer_place_tensor(buf, kv_len, off));
    memcpy(kv_len->data, (const int32_t[]) {10, 11, 3}, 12);
    char * dense[N_LAYER] = {0};
    for (int run = 0; run < 2; run++) {
        ferry_sched * sched;
        CHECK_OK(ferry_sched_new(backends, 2, &sched));
        CHECK_OK(ferry_sched_set_policy(sched, FERRY_COPY_RAGGED));
        ferry_graph * g;
        CHECK_OK(ferry_graph_new(&g));
        if (run == 0) { /* the dense gather: sequences 0..2, inclusive */
            CHECK_OK(ferry_paged_attention_step_on(c, ctx, N_LAYER, 12, 0, 2, q, kv_len, true, sched,
                                                   (ferry_backend * const[]) {dev, dev}, g, outs[0]));
        } else {
            CHECK_FAILS(ferry_block_pool_attention_step(pool, ctx, N_LAYER + 1, 0, 3, q, kv_len, sched, g, outs[1]),
                        FERRY_ERR_OUT_OF_BOUNDS);
            CHECK_OK(ferry_block_pool_attention_step(pool, ctx, N_LAYER, 0, 3, q, kv_len, sched, g, outs[1]));
            CHECK_OK(ferry_block_pool_sync(pool, 0, 3, (const int32_t *) kv_len->data));
        }
        CHECK_OK(ferry_sched_alloc_graph(sched, g));
        CHECK_OK(ferry_sched_graph_compute(sched, g));
        for (int l = 0; l < N_LAYER; l++) {
            const size_t n = ferry_tensor_nbytes(outs[run][l]);
            char * got = malloc(n);
            CHECK(got != NULL);
            CHECK_OK(ferry_tensor_get(outs[run][l], got, 0, n));
            if (run == 0) {
                dense[l] = got;
                continue;
            }
            const bool same = memcmp(dense[l], got, n) == 0;
            free(got);
            CHECK(same);
        }
        ferry_graph_free(g);
        ferry_sched_free(sched);
    }
    for (int l = 0; l < N_LAYER; l++) free(dense[l]);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_block_pool_free(pool);
    ferry_backend_free(cpu);
    ferry_backend_free(dev);
    ferry_paged_cache_free(c);
}

/* expr fails with a message, whatever the status */
#define REFUSED(expr)                                                                               \
    do {                                                                                            \
        ferry_clear_error();                                                                        \
        if ((expr) == FERRY_OK || ferry_last_error()[0] == '\0') {                                  \
            fprintf(stderr, "%s:%d: %s was not refused with a message\n", __FILE__, __LINE__, #expr); \
            check_failures++;                                                                       \
        }                                                                                           \
    } while (0)

/* Every entry point given a NULL object or output, or a value out of its range, refuses with a
 * message and sends nothing; the answers without a status say -1, false or nothing. */
static void test_every_entry_point_refuses_nulls_and_out_of_range_values(void) {
    ferry_paged_cache * c = shared_cache(false);
    CHECK(c != NULL);
    ferry_backend * dev;
    CHECK_OK(ferry_standin_backend_new(&dev));
    ferry_block_pool * pool = NULL;
    REFUSED(ferry_block_pool_new(NULL, dev, 8, &pool));
    REFUSED(ferry_block_pool_new(c, NULL, 8, &pool));
    REFUSED(ferry_block_pool_new(c, dev, 8, NULL));
    REFUSED(ferry_block_pool_new(c, dev, -1, &pool));
    REFUSED(ferry_block_pool_new(c, dev, INT64_MAX, &pool));
    CHECK(pool == NULL);
    CHECK_OK(ferry_block_pool_new(c, dev, 8, &pool));
    ferry_tensor * t = NULL;
    ferry_block_pool_stats stats;
    int32_t blocks[8] = {0};
    int64_t n = 0, ends[4] = {0};
    const int32_t too_long[3] = {10, 11, 99}, negative[3] = {-1, 0, 0};
    CHECK(ferry_block_pool_n_slots(NULL) == -1 && ferry_block_pool_n_slots(pool) == 8);
    CHECK(!ferry_block_pool_prefetch(NULL) && !ferry_block_pool_prefetch(pool));
    REFUSED(ferry_block_pool_k(NULL, 0, &t));
    REFUSED(ferry_block_pool_k(pool, 0, NULL));
    REFUSED(ferry_block_pool_k(pool, N_LAYER, &t));
    REFUSED(ferry_block_pool_v(pool, -1, &t));
    REFUSED(ferry_block_pool_table(NULL, &t));
    REFUSED(ferry_block_pool_table(pool, NULL));
    REFUSED(ferry_block_pool_sync(NULL, 0, 3, NULL));
    REFUSED(ferry_block_pool_sync(pool, 2, 1, NULL));
    REFUSED(ferry_block_pool_sync(pool, 0, N_SEQ + 1, NULL));
    REFUSED(ferry_block_pool_sync(pool, 0, 3, too_long));
    REFUSED(ferry_block_pool_sync(pool, 0, 3, negative));
    REFUSED(ferry_block_pool_drop_ahead(NULL));
    REFUSED(ferry_block_pool_truncate(NULL, 0, 0));
    REFUSED(ferry_block_pool_truncate(pool, -1, 0));
    REFUSED(ferry_block_pool_truncate(pool, INT64_MAX, 0));
    REFUSED(ferry_block_pool_truncate(pool, 0, -1));
    REFUSED(ferry_block_pool_set_resident(NULL, blocks, 1));
    REFUSED(ferry_block_pool_set_resident(pool, NULL, 1));
    REFUSED(ferry_block_pool_set_resident(pool, blocks, -1));
    REFUSED(ferry_block_pool_set_resident(pool, blocks, 9));
    REFUSED(ferry_block_pool_choose_resident(NULL, 0, 3, NULL, 2, blocks, 8, &n));
    REFUSED(ferry_block_pool_choose_resident(pool, 0, 3, NULL, 2, NULL, 8, &n));
    REFUSED(ferry_block_pool_choose_resident(pool, 0, 3, NULL, 2, blocks, 8, NULL));
    REFUSED(ferry_block_pool_choose_resident(pool, 0, 3, NULL, -1, blocks, 8, &n));
    REFUSED(ferry_block_pool_choose_resident(pool, 3, 0, NULL, 2, blocks, 8, &n));
    REFUSED(ferry_block_pool_plan(NULL, 0, 3, NULL, ends, 4, &n));
    REFUSED(ferry_block_pool_plan(pool, 0, 3, NULL, NULL, 4, &n));
    REFUSED(ferry_block_pool_plan(pool, 0, 3, NULL, ends, 4, NULL));
    REFUSED(ferry_block_pool_plan(pool, -1, 3, NULL, ends, 4, &n));
    REFUSED(ferry_block_pool_plan(pool, 0, 3, too_long, ends, 4, &n));
    REFUSED(ferry_block_pool_set_prefetch(NULL, true));
    REFUSED(ferry_block_pool_wait(NULL));
    REFUSED(ferry_block_pool_get_stats(NULL, &stats));
    REFUSED(ferry_block_pool_get_stats(pool, NULL));
    REFUSED(ferry_block_pool_attention_step(NULL, NULL, N_LAYER, 0, 3, NULL, NULL, NULL, NULL, NULL));
    REFUSED(ferry_block_pool_attention_step(pool, NULL, N_LAYER, 0, 3, NULL, NULL, NULL, NULL, NULL));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    REFUSED(ferry_block_pool_attention_step(pool, ctx, N_LAYER + 1, 0, 3, NULL, NULL, NULL, NULL, NULL));
    REFUSED(ferry_block_pool_attention_step(pool, ctx, N_LAYER, 0, N_SEQ + 1, NULL, NULL, NULL, NULL, NULL));
    ferry_context_free(ctx);
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_block_pool * on_cpu;
    CHECK_OK(ferry_block_pool_new(c, cpu, 8, &on_cpu));
    CHECK_FAILS(ferry_block_pool_set_prefetch(on_cpu, true), FERRY_ERR_UNSUPPORTED); /* no events to wait on */
    CHECK_OK(ferry_block_pool_wait(on_cpu)); /* nothing in flight */
    ferry_block_pool_free(on_cpu);
    ferry_backend_free(cpu);
    ferry_block_pool_reset_stats(NULL);
    ferry_block_pool_free(NULL);
    CHECK_OK(ferry_block_pool_get_stats(pool, &stats));
    CHECK_EQ_U(stats.buffers.calls[FERRY_XFER_SET] + stats.buffers.calls[FERRY_XFER_SET_2D] + stats.syncs, 0);
    ferry_block_pool_free(pool);
    ferry_backend_free(dev);
    ferry_paged_cache_free(c);
}

static const check_test tests[] = {
    {"a_shared_block_crosses_once", test_a_shared_block_crosses_once_and_a_grown_one_its_new_cells},
    {"the_step_through_the_table_is_the_dense_gathers", test_the_step_through_the_table_is_the_dense_gathers},
    {"every_entry_point_refuses_bad_arguments", test_every_entry_point_refuses_nulls_and_out_of_range_values},
};

CHECK_MAIN(tests)
