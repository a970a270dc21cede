/*
 * The error branches that the other tests do not reach: every public entry point given a
 * NULL where it needs an object refuses with a status and a message (or answers NULL, 0
 * or false where it returns no status), and the generic paths a backend without its own
 * async, 2-D or event entries takes give the bytes the direct ones give.
 */
#include "check.h"

#include <stdint.h>

/* expr fails (any status but OK) and leaves a message */
#define REFUSED(expr)                                                                              \
    do {                                                                                           \
        ferry_clear_error();                                                                       \
        const ferry_status refused_st_ = (expr);                                                   \
        if (refused_st_ == FERRY_OK || ferry_last_error()[0] == '\0') {                            \
            fprintf(stderr, "%s:%d: %s was not refused with a message\n", __FILE__, __LINE__, #expr); \
            check_failures++;                                                                      \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void test_null_objects(void) {
    ferry_buffer * buf = NULL;
    ferry_tensor * t = NULL;
    ferry_context * ctx = NULL;
    ferry_graph * g = NULL;
    ferry_stats stats;
    char bytes[16] = {0};
    const int64_t ne[2] = {4, 4};
    size_t nb[4] = {0};
    size_t size = 0;
    /* buffers, buffer types, backends */
    CHECK(ferry_buffer_type_name(NULL) == NULL);
    REFUSED(ferry_buffer_type_alloc_buffer(NULL, 16, &buf));
    REFUSED(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), 16, NULL));
    CHECK_EQ_U(ferry_buffer_type_alignment(NULL), 0);
    CHECK(!ferry_buffer_type_is_host(NULL));
    CHECK_EQ_U(ferry_buffer_type_alloc_size(NULL, NULL), 0);
    ferry_buffer_free(NULL);
    CHECK(ferry_buffer_base(NULL) == NULL);
    CHECK_EQ_U(ferry_buffer_size(NULL), 0);
    CHECK(ferry_buffer_get_type(NULL) == NULL);
    CHECK(!ferry_buffer_is_host(NULL));
    REFUSED(ferry_buffer_set_usage(NULL, FERRY_BUFFER_USAGE_ANY));
    CHECK_EQ_U(ferry_buffer_id(NULL), 0);
    CHECK(!ferry_buffer_id_is_live(0));
    REFUSED(ferry_buffer_clear(NULL, 0));
    REFUSED(ferry_buffer_place_tensor(NULL, NULL, 0));
    REFUSED(ferry_buffer_get_stats(NULL, &stats));
    ferry_buffer_reset_stats(NULL);
    ferry_backend_free(NULL);
    CHECK(ferry_backend_name(NULL) == NULL);
    CHECK(ferry_backend_default_buffer_type(NULL) == NULL);
    CHECK(!ferry_backend_supports_buft(NULL, NULL));
    CHECK(!ferry_backend_supports_op(NULL, NULL));
    CHECK(!ferry_backend_has_2d(NULL));
    REFUSED(ferry_backend_alloc_buffer(NULL, 16, &buf));
    REFUSED(ferry_backend_tensor_set_async(NULL, NULL, bytes, 0, 4));
    REFUSED(ferry_backend_tensor_get_async(NULL, NULL, bytes, 0, 4));
    REFUSED(ferry_backend_tensor_set_2d_async(NULL, NULL, bytes, 0, 4, 2, 4, 4));
    REFUSED(ferry_backend_tensor_get_2d_async(NULL, NULL, bytes, 0, 4, 2, 4, 4));
    REFUSED(ferry_backend_tensor_copy_async(NULL, NULL, NULL, NULL));
    REFUSED(ferry_backend_synchronize(NULL));
    REFUSED(ferry_backend_get_stats(NULL, &stats));
    ferry_backend_reset_stats(NULL);
    REFUSED(ferry_cpu_backend_new(NULL));
    REFUSED(ferry_dummy_backend_new(NULL, NULL));
    REFUSED(ferry_standin_backend_new(NULL));
    /* events */
    ferry_event * ev = NULL;
    float ms = 0;
    REFUSED(ferry_event_new(NULL, 0, &ev));
    ferry_event_free(NULL);
    REFUSED(ferry_event_record(NULL, NULL));
    REFUSED(ferry_event_wait(NULL, NULL));
    REFUSED(ferry_event_synchronize(NULL));
    REFUSED(ferry_event_elapsed_ms(NULL, NULL, &ms));
    /* types */
    ferry_type type;
    (void) ferry_type_name((ferry_type) 999); /* no crash */
    REFUSED(ferry_type_from_name(NULL, &type));
    REFUSED(ferry_type_from_name("no such type", &type));
    REFUSED(ferry_type_from_name("f32", NULL));
    CHECK_EQ_U(ferry_type_size((ferry_type) 999), 0);
    CHECK_EQ_U(ferry_blck_size((ferry_type) 999), 0);
    REFUSED(ferry_row_size((ferry_type) 999, 4, &size));
    REFUSED(ferry_row_size(FERRY_TYPE_F32, 4, NULL));
    REFUSED(ferry_row_size(FERRY_TYPE_Q8_0, 5, &size));
    (void) ferry_op_name((ferry_op) 999); /* no crash */
    (void) ferry_xfer_name((ferry_xfer) 999); /* no crash */
    CHECK(strcmp(ferry_status_name((ferry_status) 999), "unknown status") == 0);
    /* tensors and contexts */
    REFUSED(ferry_context_new(NULL));
    ferry_context_free(NULL);
    CHECK_EQ_U(ferry_context_n_tensors(NULL), 0);
    REFUSED(ferry_tensor_new(NULL, FERRY_TYPE_F32, 2, ne, &t));
    CHECK_OK(ferry_context_new(&ctx));
    REFUSED(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, NULL, &t));
    REFUSED(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, NULL));
    REFUSED(ferry_tensor_new(ctx, FERRY_TYPE_F32, 0, ne, &t));
    REFUSED(ferry_tensor_new(ctx, (ferry_type) 999, 2, ne, &t));
    REFUSED(ferry_tensor_dup_layout(ctx, NULL, &t));
    REFUSED(ferry_tensor_view(ctx, NULL, 2, ne, nb, 0, &t));
    REFUSED(ferry_tensor_permute(ctx, NULL, 0, 1, 2, 3, &t));
    REFUSED(ferry_tensor_transpose(ctx, NULL, &t));
    REFUSED(ferry_tensor_reshape(ctx, NULL, 2, ne, &t));
    REFUSED(ferry_tensor_set_name(NULL, "x"));
    CHECK_EQ_U(ferry_tensor_nelements(NULL), 0);
    CHECK_EQ_U(ferry_tensor_nrows(NULL), 0);
    CHECK_EQ_U(ferry_tensor_nbytes(NULL), 0);
    REFUSED(ferry_layout_nbytes(FERRY_TYPE_F32, 2, NULL, nb, &size));
    REFUSED(ferry_contiguous_strides(FERRY_TYPE_F32, 2, NULL, nb));
    REFUSED(ferry_contiguous_strides((ferry_type) 999, 2, ne, nb));
    CHECK(!ferry_tensor_is_contiguous(NULL));
    CHECK(!ferry_tensor_same_layout(NULL, NULL));
    CHECK(!ferry_tensor_is_view(NULL));
    REFUSED(ferry_tensor_check_allocated(NULL));
    REFUSED(ferry_tensor_set_flags(NULL, 0));
    REFUSED(ferry_tensor_set_input(NULL));
    REFUSED(ferry_tensor_set_output(NULL));
    REFUSED(ferry_tensor_set(NULL, bytes, 0, 4));
    REFUSED(ferry_tensor_get(NULL, bytes, 0, 4));
    REFUSED(ferry_tensor_memset(NULL, 0, 0, 4));
    REFUSED(ferry_tensor_set_2d(NULL, bytes, 0, 4, 2, 4, 4));
    REFUSED(ferry_tensor_get_2d(NULL, bytes, 0, 4, 2, 4, 4));
    REFUSED(ferry_tensor_copy(NULL, NULL));
    REFUSED(ferry_tensor_check_transfer(NULL, 0, 4, 1, 4, 4, "x"));
    /* ops */
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &t));
    ferry_tensor * o = NULL;
    REFUSED(ferry_add(NULL, t, t, &o));
    REFUSED(ferry_add(ctx, t, NULL, &o));
    REFUSED(ferry_mul(ctx, NULL, t, &o));
    REFUSED(ferry_scale(ctx, NULL, 1.0f, &o));
    REFUSED(ferry_dup(ctx, NULL, &o));
    REFUSED(ferry_dup_as(ctx, t, (ferry_type) 999, &o));
    REFUSED(ferry_concat(ctx, t, NULL, 0, &o));
    REFUSED(ferry_concat(ctx, t, t, 7, &o));
    REFUSED(ferry_pad(ctx, NULL, 1, 0, 0, 0, &o));
    REFUSED(ferry_pad(ctx, t, -1, 0, 0, 0, &o));
    REFUSED(ferry_mean(ctx, NULL, &o));
    REFUSED(ferry_attn_decode(ctx, NULL, t, t, NULL, 1.0f, false, &o));
    /* graphs and the allocator */
    REFUSED(ferry_graph_new(NULL));
    ferry_graph_free(NULL);
    ferry_graph_clear(NULL);
    REFUSED(ferry_graph_build(NULL, t));
    CHECK_OK(ferry_graph_new(&g));
    REFUSED(ferry_graph_build(g, NULL));
    CHECK_EQ_U(ferry_graph_n_nodes(NULL), 0);
    CHECK_EQ_U(ferry_graph_n_leafs(NULL), 0);
    CHECK(ferry_graph_node(NULL, 0) == NULL && ferry_graph_leaf(NULL, 0) == NULL);
    CHECK(ferry_graph_node(g, -1) == NULL && ferry_graph_leaf(g, 99) == NULL);
    REFUSED(ferry_backend_graph_compute(NULL, g));
    ferry_gallocr * ga = NULL;
    REFUSED(ferry_gallocr_new(NULL, &ga));
    REFUSED(ferry_gallocr_new_n(NULL, 1, &ga));
    ferry_buffer_type * cpu_buft = ferry_cpu_buffer_type();
    REFUSED(ferry_gallocr_new_n(&cpu_buft, 0, &ga));
    REFUSED(ferry_gallocr_new(cpu_buft, NULL));
    ferry_gallocr_free(NULL);
    REFUSED(ferry_gallocr_reserve(NULL, g, NULL, NULL));
    REFUSED(ferry_gallocr_alloc_graph(NULL, g));
    REFUSED(ferry_gallocr_set_keep_inputs(NULL, true));
    CHECK(!ferry_gallocr_get_keep_inputs(NULL));
    CHECK_EQ_U(ferry_gallocr_buffer_size(NULL, 0), 0);
    CHECK_EQ_U(ferry_gallocr_n_chunks(NULL, 0), 0);
    CHECK(ferry_gallocr_chunk_buffer(NULL, 0, 0) == NULL);
    REFUSED(ferry_gallocr_tensor_placement(NULL, t, NULL, NULL, NULL, NULL));
    /* KV cache */
    ferry_kv_cache * kv = NULL;
    ferry_kv_params params;
    REFUSED(ferry_kv_cache_new(NULL, NULL, &kv));
    ferry_kv_cache_free(NULL);
    REFUSED(ferry_kv_cache_params(NULL, &params));
    CHECK_EQ_U(ferry_kv_cache_kv_size(NULL), 0);
    CHECK(ferry_kv_cache_buffer(NULL) == NULL);
    REFUSED(ferry_kv_cache_k(NULL, 0, &t));
    REFUSED(ferry_kv_cache_v(NULL, 0, &t));
    REFUSED(ferry_kv_cache_window(NULL, ctx, 0, 1, 0, 0, &t, NULL));
    /* scheduler */
    ferry_sched * s = NULL;
    ferry_sched_split_info si;
    ferry_sched_input_info ii;
    ferry_sched_stats ss;
    REFUSED(ferry_sched_new(NULL, 1, &s));
    ferry_backend * nobody = NULL;
    REFUSED(ferry_sched_new(&nobody, 1, &s));
    ferry_sched_free(NULL);
    REFUSED(ferry_sched_set_policy(NULL, FERRY_COPY_FLAT));
    (void) ferry_sched_get_policy(NULL); /* no crash */
    REFUSED(ferry_sched_set_keep_inputs(NULL, true));
    CHECK(!ferry_sched_get_keep_inputs(NULL));
    REFUSED(ferry_sched_set_tensor_backend(NULL, t, NULL));
    ferry_sched_clear_assignments(NULL);
    CHECK_EQ_U(ferry_sched_n_assigned(NULL), 0);
    REFUSED(ferry_sched_alloc_graph(NULL, g));
    REFUSED(ferry_sched_graph_compute(NULL, g));
    CHECK(ferry_sched_get_tensor_backend(NULL, t) == NULL);
    CHECK_EQ_U(ferry_sched_n_splits(NULL), 0);
    REFUSED(ferry_sched_split(NULL, 0, &si));
    CHECK_EQ_U(ferry_sched_n_inputs(NULL), 0);
    REFUSED(ferry_sched_input(NULL, 0, &ii));
    REFUSED(ferry_sched_get_stats(NULL, &ss));
    REFUSED(ferry_sched_set_compact(NULL, true));
    CHECK(!ferry_sched_get_compact(NULL));
    CHECK_EQ_U(ferry_sched_buffer_size(NULL, NULL), 0);
    ferry_graph_free(g);
    ferry_context_free(ctx);
}

/* A backend with none of the async, 2-D or event entries: the generic paths, byte for byte. */
static void test_generic_paths(void) {
    ferry_backend *cpu, *dummy;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    dp.has_2d = false;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dummy));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {8, 4};
    ferry_tensor *a, *b;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &a));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &b));
    ferry_buffer *ba, *bb;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, ferry_tensor_nbytes(a), &ba));
    CHECK_OK(ferry_backend_alloc_buffer(dummy, ferry_tensor_nbytes(b), &bb));
    CHECK_OK(ferry_buffer_place_tensor(ba, a, 0));
    CHECK_OK(ferry_buffer_place_tensor(bb, b, 0));
    float in[32], out[32];
    for (int i = 0; i < 32; i++) {
        in[i] = (float) i;
    }
    for (int k = 0; k < 2; k++) {
        ferry_backend * be = k ? dummy : cpu;
        ferry_tensor * t = k ? b : a;
        memset(out, 0, sizeof(out));
        CHECK_OK(ferry_backend_tensor_set_async(be, t, in, 0, sizeof(in)));
        CHECK_OK(ferry_backend_tensor_set_async(be, t, in, 0, 0));
        CHECK_OK(ferry_backend_tensor_get_async(be, t, out, 0, sizeof(out)));
        CHECK_OK(ferry_backend_tensor_get_async(be, t, out, 0, 0));
        CHECK_OK(ferry_backend_synchronize(be));
        CHECK(memcmp(in, out, sizeof(in)) == 0);
        /* rows of 8 bytes every 32, in both directions */
        memset(out, 0, sizeof(out));
        CHECK_OK(ferry_backend_tensor_set_2d_async(be, t, in, 0, 8, 4, 32, 32));
        CHECK_OK(ferry_backend_tensor_get_2d_async(be, t, out, 0, 8, 4, 32, 32));
        CHECK_OK(ferry_backend_tensor_set_2d_async(be, t, in, 0, 0, 4, 32, 32));
        CHECK_OK(ferry_backend_tensor_get_2d_async(be, t, out, 0, 8, 0, 32, 32));
        CHECK_OK(ferry_backend_synchronize(be));
        for (int r = 0; r < 4; r++) {
            CHECK(memcmp(&in[r * 8], &out[r * 8], 8) == 0);
        }
        REFUSED(ferry_backend_tensor_set_2d_async(be, t, in, 0, 8, 4, 4, 32));
        REFUSED(ferry_backend_tensor_get_2d_async(be, t, out, 0, 8, 4, 32, 4));
        ferry_event * ev = NULL;
        REFUSED(ferry_event_new(be, 0, &ev));
        REFUSED(ferry_event_new(be, 0x80, &ev));
        ferry_stats st;
        CHECK_OK(ferry_backend_get_stats(be, &st));
        ferry_backend_reset_stats(be);
    }
    /* host to the dummy and back, then a copy whose layouts differ */
    CHECK_OK(ferry_tensor_set(a, in, 0, sizeof(in)));
    CHECK_OK(ferry_backend_tensor_copy_async(cpu, dummy, a, b));
    CHECK_OK(ferry_backend_synchronize(dummy));
    memset(out, 0, sizeof(out));
    CHECK_OK(ferry_tensor_get(b, out, 0, sizeof(out)));
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    ferry_tensor * tr;
    CHECK_OK(ferry_tensor_transpose(ctx, a, &tr));
    REFUSED(ferry_backend_tensor_copy_async(cpu, dummy, tr, b));
    ferry_buffer_free(bb);
    ferry_buffer_free(ba);
    ferry_context_free(ctx);
    ferry_backend_free(dummy);
    ferry_backend_free(cpu);
}

static const check_test tests[] = {
    {"null_objects", test_null_objects},
    {"generic_paths", test_generic_paths},
};

CHECK_MAIN(tests)
