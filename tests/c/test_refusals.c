/*
 * The error branches that the other tests do not reach: every public entry point given a
 * NULL where it needs an object refuses with a status and a message (or answers NULL, 0
 * or false where it returns no status), and the generic paths a backend without its own
 * async, 2-D or event entries takes give the bytes the direct ones give. A device whose
 * entries fail (replaced here through the internal interfaces) gives its error back through
 * every public transfer, and no counter counts what did not happen.
 */
#include "check.h"
#include "lost-device.h"

#include "copy-impl.h"  /* ferry_copy_input_since */
#include "ferry-impl.h" /* ferry_event_reached_seconds */
#include "graph-impl.h" /* ferry_graph_add_node */

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

static void test_null_objects_are_refused_with_a_message(void) {
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

/* expr fails with status st and its message holds says (the call and what to change) */
#define REFUSED_SAYING(expr, st, says)                                                                 \
    do {                                                                                              \
        CHECK_FAILS(expr, st);                                                                        \
        if (!strstr(ferry_last_error(), says)) {                                                      \
            fprintf(stderr, "%s:%d: '%s' does not say '%s'\n", __FILE__, __LINE__, ferry_last_error(), says); \
        }                                                                                             \
        CHECK(strstr(ferry_last_error(), says) != NULL);                                              \
    } while (0)

/* The NULLs no binding passes (the Python one always hands C its outputs): a NULL output or context
 * refused, naming the call, and nothing made; and the internal entries' own refusals. */
static void test_null_outputs_are_refused_naming_the_call(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {4, 4};
    const size_t nb[2] = {4, 16};
    ferry_tensor * t;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &t));
    const int64_t made = ferry_context_n_tensors(ctx);
    size_t strides[4];
    const ferry_status bad = FERRY_ERR_INVALID_ARG;
    /* tensors */
    REFUSED_SAYING(ferry_tensor_dup_layout(ctx, t, NULL), bad, "tensor_dup_layout: NULL argument");
    REFUSED_SAYING(ferry_tensor_dup_layout(NULL, t, &t), bad, "tensor_dup_layout: NULL argument");
    REFUSED_SAYING(ferry_view_strides(FERRY_TYPE_F32, 2, ne, nb, NULL), bad, "view_strides: NULL argument");
    REFUSED_SAYING(ferry_view_strides(FERRY_TYPE_F32, 2, ne, NULL, strides), bad, "view_strides: NULL argument");
    REFUSED_SAYING(ferry_tensor_view(ctx, t, 2, ne, nb, 0, NULL), bad, "view: NULL argument");
    REFUSED_SAYING(ferry_tensor_view(NULL, t, 2, ne, nb, 0, &t), bad, "view: NULL argument");
    REFUSED_SAYING(ferry_tensor_permute(ctx, t, 1, 0, 2, 3, NULL), bad, "permute: NULL argument");
    REFUSED_SAYING(ferry_tensor_permute(NULL, t, 1, 0, 2, 3, &t), bad, "permute: NULL argument");
    REFUSED_SAYING(ferry_tensor_transpose(ctx, t, NULL), bad, "transpose: NULL argument");
    REFUSED_SAYING(ferry_tensor_transpose(NULL, t, &t), bad, "transpose: NULL argument");
    REFUSED_SAYING(ferry_tensor_reshape(ctx, t, 2, ne, NULL), bad, "reshape: NULL argument");
    REFUSED_SAYING(ferry_tensor_reshape(NULL, t, 2, ne, &t), bad, "reshape: NULL argument");
    REFUSED_SAYING(ferry_tensor_compact_layout(ctx, t, NULL), bad, "compact_layout: NULL argument");
    REFUSED_SAYING(ferry_tensor_compact_layout(NULL, t, &t), bad, "compact_layout: NULL argument");
    /* ops */
    REFUSED_SAYING(ferry_scale(ctx, t, 2.0f, NULL), bad, "scale: NULL argument");
    REFUSED_SAYING(ferry_scale(NULL, t, 2.0f, &t), bad, "scale: NULL argument");
    REFUSED_SAYING(ferry_dup(ctx, t, NULL), bad, "dup: NULL argument");
    REFUSED_SAYING(ferry_dup(NULL, t, &t), bad, "dup: NULL argument");
    REFUSED_SAYING(ferry_dup_as(ctx, t, FERRY_TYPE_F16, NULL), bad, "dup: NULL argument");
    REFUSED_SAYING(ferry_dup_as(NULL, t, FERRY_TYPE_F16, &t), bad, "dup: NULL argument");
    REFUSED_SAYING(ferry_concat(ctx, t, t, 0, NULL), bad, "concat: NULL argument");
    REFUSED_SAYING(ferry_concat(NULL, t, t, 0, &t), bad, "concat: NULL argument");
    REFUSED_SAYING(ferry_pad(ctx, t, 1, 0, 0, 0, NULL), bad, "pad: NULL argument");
    REFUSED_SAYING(ferry_pad(NULL, t, 1, 0, 0, 0, &t), bad, "pad: NULL argument");
    REFUSED_SAYING(ferry_mean(ctx, t, NULL), bad, "mean: NULL argument");
    REFUSED_SAYING(ferry_mean(NULL, t, &t), bad, "mean: NULL argument");
    CHECK_EQ_U(ferry_context_n_tensors(ctx), made); /* nothing made */
    /* caches, pools, devices, interop */
    REFUSED_SAYING(ferry_paged_cache_k(NULL, 0, &t), bad, "paged_cache_k: NULL argument");
    REFUSED_SAYING(ferry_paged_cache_v(NULL, 0, &t), bad, "paged_cache_v: NULL argument");
    REFUSED_SAYING(ferry_block_pool_v(NULL, 0, &t), bad, "block_pool_v: NULL argument");
    REFUSED_SAYING(ferry_block_pool_drop_ahead(NULL), bad, "block_pool_drop_ahead: NULL pool");
    ferry_link_stats link;
    REFUSED_SAYING(ferry_standin_get_link(NULL, NULL, &link), bad, "NULL backend");
    void * capsule = NULL;
    REFUSED_SAYING(ferry_dlpack_new(2, false, NULL), bad, "dlpack_new: NULL output");
    char host[64];
    REFUSED_SAYING(ferry_host_buffer_from_ptr(host, sizeof(host), NULL), bad, "host_buffer_from_ptr: NULL output");
    ferry_memory_kind kind;
    int device;
    REFUSED_SAYING(ferry_tensor_memory(t, NULL, &device, &capsule), bad, "tensor_memory: NULL argument");
    REFUSED_SAYING(ferry_tensor_memory(t, &kind, &device, NULL), bad, "tensor_memory: NULL argument");
    /* internal entries */
    double reached;
    REFUSED_SAYING(ferry_event_reached_seconds(NULL, &reached), bad, "event_reached_seconds: NULL argument");
    REFUSED_SAYING(ferry_graph_add_node(NULL, t), bad, "graph_add_node: NULL graph or tensor");
    const int64_t from[4] = {0};
    REFUSED_SAYING(ferry_copy_input_since(NULL, NULL, t, from, NULL), bad, "copy_input_since: NULL argument");
    REFUSED_SAYING(ferry_copy_input_since(NULL, t, t, from, NULL), bad,
                   "copy_input_since: '' is a window without its streams' lengths");
    ferry_context_free(ctx);
}
#undef REFUSED_SAYING

/* A backend with none of the async, 2-D or event entries: the generic paths, byte for byte. */
static void test_generic_paths_give_the_direct_ones_bytes(void) {
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

/* Every transfer into or out of a device that fails returns the device's error: blocking
 * or async, 1-D or 2-D, the device's own 2-D or the generic loop of rows, a staged copy.
 * Neither the buffer's nor the backend's counters count any of them. */
static void test_device_errors_reach_the_caller(void) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend * dev;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {64};
    ferry_tensor *t, *other;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &other));
    ferry_buffer *buf, *buf2;
    CHECK_OK(ferry_backend_alloc_buffer(dev, 256, &buf));
    CHECK_OK(ferry_backend_alloc_buffer(dev, 256, &buf2));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    CHECK_OK(ferry_buffer_place_tensor(buf2, other, 0));
    const struct ferry_buffer_i working = buf->iface;
    buf->iface.set_tensor = lost_set;
    buf->iface.get_tensor = lost_get;
    buf->iface.memset_tensor = lost_memset;
    buf->iface.set_tensor_2d = lost_set_2d;
    buf->iface.get_tensor_2d = lost_get_2d;
    buf->iface.clear = lost_clear;
    ferry_buffer_reset_stats(buf);
    ferry_backend_reset_stats(dev);
    float data[64] = {0};
    LOST(ferry_tensor_set(t, data, 0, sizeof(data)));
    LOST(ferry_tensor_get(t, data, 0, sizeof(data)));
    LOST(ferry_tensor_memset(t, 0, 0, sizeof(data)));
    LOST(ferry_buffer_clear(buf, 0));
    LOST(ferry_tensor_set_2d(t, data, 0, 16, 4, 64, 16));
    LOST(ferry_tensor_get_2d(t, data, 0, 16, 4, 64, 16));
    LOST(ferry_backend_tensor_set_async(dev, t, data, 0, sizeof(data))); /* no async entry: the blocking set */
    LOST(ferry_tensor_copy(t, other));                                      /* neither side host: staged */
    dev->iface.set_tensor_2d_async = lost_set_2d_async;
    dev->iface.get_tensor_2d_async = lost_get_2d_async;
    LOST(ferry_backend_tensor_set_2d_async(dev, t, data, 0, 16, 4, 64, 16));
    LOST(ferry_backend_tensor_get_2d_async(dev, t, data, 0, 16, 4, 64, 16));
    /* without 2-D entries, the generic loop of rows stops at the first failed row */
    buf->iface.set_tensor_2d = NULL;
    buf->iface.get_tensor_2d = NULL;
    dev->iface.set_tensor_2d_async = NULL;
    dev->iface.get_tensor_2d_async = NULL;
    LOST(ferry_tensor_set_2d(t, data, 0, 16, 4, 64, 16));
    LOST(ferry_backend_tensor_get_2d_async(dev, t, data, 0, 16, 4, 64, 16));
    ferry_stats bs, ks, os;
    CHECK_OK(ferry_buffer_get_stats(buf, &bs));
    CHECK_OK(ferry_backend_get_stats(dev, &ks));
    CHECK_OK(ferry_buffer_get_stats(buf2, &os));
    CHECK(nothing_counted(&bs) && nothing_counted(&ks));
    CHECK_EQ_U(os.calls[FERRY_XFER_SET], 0); /* the staged copy never reached its destination */
    /* a device that fails when waited on: an async copy's generic path waits for both sides
     * first, the device as source or as destination */
    buf->iface = working;
    dev->iface.synchronize = lost_synchronize;
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_tensor * host;
    ferry_buffer * host_buf;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &host));
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 256, &host_buf));
    CHECK_OK(ferry_buffer_place_tensor(host_buf, host, 0));
    LOST(ferry_backend_synchronize(dev));
    LOST(ferry_backend_tensor_copy_async(dev, cpu, t, host));
    LOST(ferry_backend_tensor_copy_async(cpu, dev, host, other));
    CHECK_OK(ferry_buffer_get_stats(buf2, &os));
    CHECK_OK(ferry_buffer_get_stats(host_buf, &bs));
    CHECK(nothing_counted(&os) && nothing_counted(&bs));
    ferry_buffer_free(host_buf);
    ferry_backend_free(cpu);
    ferry_buffer_free(buf);
    ferry_buffer_free(buf2);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
}

/* An async copy a backend declines (UNSUPPORTED) takes the generic path: the bytes arrive and
 * count once, as a copy. One it fails is that failure, counted nowhere. One it does counts
 * on the backend and on the destination's buffer. */
static ferry_status declined_copy(ferry_backend * from, ferry_backend * to, const ferry_tensor * src, ferry_tensor * dst) {
    (void) from, (void) to, (void) src, (void) dst;
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "device: no direct copy");
}
static ferry_status failed_copy(ferry_backend * from, ferry_backend * to, const ferry_tensor * src, ferry_tensor * dst) {
    (void) from, (void) to, (void) src, (void) dst;
    return lost();
}
static ferry_status direct_copy(ferry_backend * from, ferry_backend * to, const ferry_tensor * src, ferry_tensor * dst) {
    (void) from, (void) to;
    memcpy(dst->data, src->data, ferry_tensor_nbytes(src)); /* both in this process's memory */
    return FERRY_OK;
}

static void test_async_copy_entries_land_or_count_nothing(void) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend *cpu, *dev;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {64};
    ferry_tensor *src, *dst;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &src));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &dst));
    ferry_buffer *bs, *bd;
    CHECK_OK(ferry_backend_alloc_buffer(cpu, 256, &bs));
    CHECK_OK(ferry_backend_alloc_buffer(dev, 256, &bd));
    CHECK_OK(ferry_buffer_place_tensor(bs, src, 0));
    CHECK_OK(ferry_buffer_place_tensor(bd, dst, 0));
    float in[64], out[64];
    for (int i = 0; i < 64; i++) {
        in[i] = (float) i;
    }
    CHECK_OK(ferry_tensor_set(src, in, 0, sizeof(in)));
    ferry_stats ks, ds;
    ferry_status (*const entries[3])(ferry_backend *, ferry_backend *, const ferry_tensor *, ferry_tensor *) = {
        declined_copy, failed_copy, direct_copy};
    for (int e = 0; e < 3; e++) {
        dev->iface.cpy_tensor_async = entries[e];
        CHECK_OK(ferry_tensor_memset(dst, 0, 0, sizeof(out)));
        ferry_backend_reset_stats(dev);
        ferry_buffer_reset_stats(bd);
        const ferry_status st = ferry_backend_tensor_copy_async(cpu, dev, src, dst);
        CHECK_OK(ferry_backend_get_stats(dev, &ks));
        CHECK_OK(ferry_buffer_get_stats(bd, &ds));
        CHECK_OK(ferry_tensor_get(dst, out, 0, sizeof(out)));
        if (entries[e] == failed_copy) {
            CHECK(st == FERRY_ERR_BACKEND && strcmp(ferry_last_error(), "device: lost") == 0);
            CHECK(nothing_counted(&ks) && nothing_counted(&ds) && out[63] == 0.0f);
            continue;
        }
        CHECK_OK(st);
        CHECK(memcmp(in, out, sizeof(in)) == 0);
        CHECK_EQ_U(ks.calls[FERRY_XFER_COPY], 1);
        CHECK_EQ_U(ks.bytes[FERRY_XFER_COPY], sizeof(in));
        /* the generic path's copy is the buffer's set; the backend's own is the buffer's copy */
        CHECK_EQ_U(ds.bytes[entries[e] == direct_copy ? FERRY_XFER_COPY : FERRY_XFER_SET], sizeof(in));
    }
    ferry_buffer_free(bs);
    ferry_buffer_free(bd);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
    ferry_backend_free(cpu);
}

/* The same for a buffer's own copy entry, between two buffers neither side can reach by
 * pointer: declined, the copy is staged through the host (a get and a set); failed, it is
 * that failure; done, it counts as the destination buffer's copy. */
static ferry_status declined_buffer_copy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    (void) buf, (void) src, (void) dst;
    return ferry_fail(FERRY_ERR_UNSUPPORTED, "device: no direct copy");
}
static ferry_status failed_buffer_copy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    (void) buf, (void) src, (void) dst;
    return lost();
}
static ferry_status direct_buffer_copy(ferry_buffer * buf, const ferry_tensor * src, ferry_tensor * dst) {
    (void) buf;
    memcpy(dst->data, src->data, ferry_tensor_nbytes(src));
    return FERRY_OK;
}

static void test_buffer_copy_entries_land_or_count_nothing(void) {
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    ferry_backend * dev;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dev));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {64};
    ferry_tensor *src, *dst;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &src));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &dst));
    ferry_buffer *bs, *bd;
    CHECK_OK(ferry_backend_alloc_buffer(dev, 256, &bs));
    CHECK_OK(ferry_backend_alloc_buffer(dev, 256, &bd));
    CHECK_OK(ferry_buffer_place_tensor(bs, src, 0));
    CHECK_OK(ferry_buffer_place_tensor(bd, dst, 0));
    float in[64], out[64];
    for (int i = 0; i < 64; i++) {
        in[i] = (float) i;
    }
    CHECK_OK(ferry_tensor_set(src, in, 0, sizeof(in)));
    ferry_status (*const entries[3])(ferry_buffer *, const ferry_tensor *, ferry_tensor *) = {
        declined_buffer_copy, failed_buffer_copy, direct_buffer_copy};
    for (int e = 0; e < 3; e++) {
        bd->iface.cpy_tensor = entries[e];
        CHECK_OK(ferry_tensor_memset(dst, 0, 0, sizeof(out)));
        ferry_buffer_reset_stats(bs);
        ferry_buffer_reset_stats(bd);
        const ferry_status st = ferry_tensor_copy(src, dst);
        ferry_stats ss, ds;
        CHECK_OK(ferry_buffer_get_stats(bs, &ss));
        CHECK_OK(ferry_buffer_get_stats(bd, &ds));
        CHECK_OK(ferry_tensor_get(dst, out, 0, sizeof(out)));
        if (entries[e] == failed_buffer_copy) {
            CHECK(st == FERRY_ERR_BACKEND && strcmp(ferry_last_error(), "device: lost") == 0);
            CHECK(nothing_counted(&ss) && nothing_counted(&ds) && out[63] == 0.0f);
            continue;
        }
        CHECK_OK(st);
        CHECK(memcmp(in, out, sizeof(in)) == 0);
        const bool staged = entries[e] == declined_buffer_copy;
        CHECK_EQ_U(ss.bytes[FERRY_XFER_GET], staged ? sizeof(in) : 0);
        CHECK_EQ_U(ds.bytes[FERRY_XFER_SET], staged ? sizeof(in) : 0);
        CHECK_EQ_U(ds.bytes[FERRY_XFER_COPY], staged ? 0 : sizeof(in));
    }
    ferry_buffer_free(bs);
    ferry_buffer_free(bd);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
}

/* A backend without the optional entries: no ops supported, and its memory not known. */
static void test_missing_optional_entries_mean_no_ops_no_memory(void) {
    ferry_backend * dev;
    CHECK_OK(ferry_dummy_backend_new(NULL, &dev));
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {8};
    ferry_tensor *a, *b;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &a));
    CHECK_OK(ferry_scale(ctx, a, 2.0f, &b));
    CHECK(ferry_backend_supports_op(dev, b));
    dev->iface.supports_op = NULL;
    CHECK(!ferry_backend_supports_op(dev, b));
    size_t free_bytes = 1, total = 1;
    CHECK_OK(ferry_backend_get_memory(dev, &free_bytes, &total));
    dev->iface.get_memory = NULL;
    free_bytes = total = 7;
    CHECK_FAILS(ferry_backend_get_memory(dev, &free_bytes, &total), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "cannot say what memory it has") != NULL);
    CHECK(free_bytes == 7 && total == 7);
    CHECK_FAILS(ferry_backend_get_memory(dev, &free_bytes, NULL), FERRY_ERR_INVALID_ARG);
    ferry_context_free(ctx);
    ferry_backend_free(dev);
}

/* A plan's pieces and the paged attention op: a NULL, an overflowing row, a tensor of the wrong
 * type or shape, each refused with a message naming it. */
static void test_pieces_and_paged_attention_refuse_bad_arguments(void) {
    ferry_copy_piece pieces[4];
    size_t n = 0;
    const ferry_copy_2d row = {.offset = 0, .size = 8, .count = 2, .stride = 16};
    const ferry_copy_2d huge = {.offset = SIZE_MAX - 4, .size = 8, .count = 2, .stride = 16};
    const ferry_gather_copy gather = {.src_offset = 0, .dst_offset = 0, .size = 8, .count = 2, .src_stride = 16,
                                      .dst_stride = 8};
    REFUSED(ferry_copy_pieces(&row, 1, pieces, 4, NULL));
    REFUSED(ferry_copy_pieces(NULL, 1, pieces, 4, &n));
    REFUSED(ferry_copy_pieces(&row, 1, pieces, 1, &n));
    REFUSED(ferry_copy_pieces(&huge, 1, pieces, 4, &n));
    REFUSED(ferry_gather_pieces(NULL, 1, pieces, 4, &n));
    REFUSED(ferry_gather_pieces(&gather, 1, pieces, 4, NULL));
    REFUSED(ferry_gather_pieces(&gather, 1, pieces, 1, &n));
    const ferry_copy_cost_model model = ferry_copy_cost_model_gpu();
    n = 1;
    REFUSED(ferry_copy_pieces_merge(&model, NULL, &n, NULL));
    REFUSED(ferry_copy_pieces_merge(&model, pieces, NULL, NULL));
    REFUSED(ferry_copy_pieces_merge(NULL, pieces, &n, NULL));
    pieces[0] = (ferry_copy_piece) {.src_offset = SIZE_MAX - 2, .dst_offset = 0, .size = 8};
    REFUSED(ferry_copy_pieces_merge(&model, pieces, &n, NULL));

    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *q, *pool, *table, *len, *bad, *out = NULL;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, (const int64_t[]) {8, 2, 1, 1}, &q));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 2, (const int64_t[]) {8, 16}, &pool));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 2, (const int64_t[]) {2, 1}, &table));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, (const int64_t[]) {1}, &len));
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, (const int64_t[]) {3, 5}, &bad));
    CHECK_OK(ferry_attn_paged(ctx, q, pool, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(NULL, q, pool, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, len, 4, 1.0f, false, NULL));
    REFUSED(ferry_attn_paged(ctx, bad, pool, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, bad, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, bad, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, bad, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, bad, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, len, 0, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, len, 3, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, len, INT64_MAX, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, len, 4, 1.0f, true, &out));
    REFUSED(ferry_attn_paged(ctx, pool, pool, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, pool, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, pool, table, table, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, table, pool, table, len, 4, 1.0f, false, &out));
    REFUSED(ferry_attn_paged(ctx, q, pool, table, table, len, 4, 1.0f, false, &out));
    /* the cost model's answers without a model, or of one with no rate: none (0, or false) */
    ferry_copy_cost_model still = model;
    still.gbps = 0;
    CHECK(ferry_copy_piece_seconds(NULL, 8) == 0 && ferry_copy_piece_seconds(&still, 8) == 0);
    CHECK(ferry_copy_plan_cost(NULL, &row, 1) == 0 && ferry_copy_plan_cost(&model, NULL, 1) == 0);
    CHECK(ferry_copy_flat_cost(NULL, 8) == 0 && ferry_copy_flat_cost(&model, 0) == 0);
    CHECK(!ferry_copy_plan_pays(NULL, q, &row, 1) && !ferry_copy_plan_pays(&model, NULL, &row, 1));
    ferry_context_free(ctx);
}

static const check_test tests[] = {
    {"null_objects_are_refused_with_a_message", test_null_objects_are_refused_with_a_message},
    {"pieces_and_paged_attention_refuse_bad_arguments", test_pieces_and_paged_attention_refuse_bad_arguments},
    {"null_outputs_are_refused_naming_the_call", test_null_outputs_are_refused_naming_the_call},
    {"generic_paths_give_the_direct_ones_bytes", test_generic_paths_give_the_direct_ones_bytes},
    {"device_errors_reach_the_caller", test_device_errors_reach_the_caller},
    {"async_copy_entries_land_or_count_nothing", test_async_copy_entries_land_or_count_nothing},
    {"buffer_copy_entries_land_or_count_nothing", test_buffer_copy_entries_land_or_count_nothing},
    {"missing_optional_entries_mean_no_ops_no_memory", test_missing_optional_entries_mean_no_ops_no_memory},
};

CHECK_MAIN(tests)
