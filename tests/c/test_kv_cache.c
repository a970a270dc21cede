/* The KV cache and its windows: the params it gives back, a window's layout, cell offsets,
 * and what a cache refuses. */
#include "check.h"

/* ferry_kv_cache_params gives back the params the cache was made with. */
static void test_kv_cache_params_gives_back_what_it_was_made_of(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_F16, .head_dim = 64, .n_head_kv = 2,
                               .n_ctx = 96, .n_stream = 3, .n_layer = 2, .v_trans = true};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
    ferry_kv_params got;
    memset(&got, 0xff, sizeof(got));
    CHECK_OK(ferry_kv_cache_params(kv, &got));
    CHECK(got.type_k == p.type_k && got.type_v == p.type_v);
    CHECK(got.head_dim == p.head_dim && got.n_head_kv == p.n_head_kv);
    CHECK(got.n_ctx == p.n_ctx && got.n_stream == p.n_stream && got.n_layer == p.n_layer);
    CHECK(got.v_trans == p.v_trans);
    CHECK_FAILS(ferry_kv_cache_params(kv, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_cache_params(NULL, &got), FERRY_ERR_INVALID_ARG);
    /* the layout a window views each layer with, and where cells lie: as the windows have them */
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor *k, *v;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 1, 5, 1, 2, &k, &v));
    int64_t ne[4];
    size_t nb[4], offset;
    CHECK_OK(ferry_kv_cache_window_layout(kv, false, 5, 1, 2, ne, nb, &offset));
    CHECK(ne[0] == 64 && ne[1] == 2 && ne[2] == 5 && ne[3] == 2 && offset == k->view_offs);
    CHECK(nb[0] == 34 && nb[1] == 68 && nb[2] == 136 && nb[3] == 136 * 32);
    CHECK(k->nb[0] == nb[0] && k->nb[1] == nb[2] && k->nb[2] == nb[1] && k->nb[3] == nb[3]);
    CHECK_OK(ferry_kv_cache_window_layout(kv, true, 5, 1, 2, ne, nb, &offset));
    CHECK(ne[0] == 5 && ne[1] == 2 && ne[2] == 64 && ne[3] == 2 && offset == v->view_offs);
    CHECK(nb[0] == 2 && nb[1] == 2 * 32 * 64 && nb[2] == 2 * 32 && nb[3] == 2 * 32 * 128);
    CHECK(v->nb[0] == nb[0] && v->nb[1] == nb[2] && v->nb[2] == nb[1] && v->nb[3] == nb[3]);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, true, 33, 0, 0, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, true, 1, 2, 3, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_kv_cache_cell_offset(kv, false, 2, 3, &offset));
    CHECK_EQ_U(offset, (2 * 32 + 3) * 136);
    CHECK_OK(ferry_kv_cache_cell_offset(kv, true, 2, 32, &offset)); /* a stream's end */
    CHECK_EQ_U(offset, (2 * 32 * 128 + 32) * 2);
    CHECK_FAILS(ferry_kv_cache_cell_offset(kv, true, 3, 0, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_cell_offset(kv, false, 0, 33, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_context_free(ctx);
    ferry_kv_cache_free(kv);
}

/* Params a cache cannot be made of are refused, each naming what to change, and *out is
 * left as it was: an unknown V type, V rows of part of a block (q8_0 of head_dim 48, not
 * transposed), a layer of negative cells. */
static void test_kv_cache_params_refused(void) {
    const ferry_kv_params good = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 48, .n_head_kv = 2,
                                  .n_ctx = 64, .n_stream = 2, .n_layer = 2};
    ferry_kv_cache * kv = NULL;
    ferry_kv_params p = good;
    p.type_v = (ferry_type) 42;
    CHECK_FAILS(ferry_kv_cache_new(&p, NULL, &kv), FERRY_ERR_UNKNOWN_TYPE);
    p = good;
    p.type_v = FERRY_TYPE_Q8_0;
    CHECK_FAILS(ferry_kv_cache_new(&p, NULL, &kv), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "head_dim 48 is not whole q8_0 blocks") != NULL);
    p.head_dim = 64; /* whole blocks: the same V is a cache */
    CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
    ferry_kv_cache_free(kv);
    kv = NULL;
    const int64_t cells[2] = {0, -1};
    CHECK_FAILS(ferry_kv_cache_new_layers(&good, NULL, NULL, cells, &kv), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1's -1 cells") != NULL);
    CHECK_FAILS(ferry_kv_cache_new(&good, NULL, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(kv == NULL);
}

/* A cache over the caller's buffers is refused, naming the layer, where a layer has no V
 * buffer or keeps K and V in memories of two types; the caller's buffers stay the caller's. */
static void test_kv_cache_over_refused(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                               .n_ctx = 32, .n_stream = 2, .n_layer = 2};
    const size_t layer = 16 * 2 * 16 * 2 * 2; /* bytes of one layer's K (or V) */
    ferry_backend * dummy;
    ferry_dummy_params dp = ferry_dummy_default_params();
    dp.real_memory = true;
    CHECK_OK(ferry_dummy_backend_new(&dp, &dummy));
    ferry_buffer *host, *dev;
    CHECK_OK(ferry_buffer_type_alloc_buffer(ferry_cpu_buffer_type(), 4 * layer, &host));
    CHECK_OK(ferry_backend_alloc_buffer(dummy, 4 * layer, &dev));
    const size_t ko[2] = {0, 2 * layer}, vo[2] = {layer, 3 * layer};
    ferry_buffer *k_bufs[2] = {host, host}, *v_bufs[2] = {host, NULL};
    ferry_kv_cache * kv = NULL;
    CHECK_FAILS(ferry_kv_cache_new_over(&p, NULL, k_bufs, ko, v_bufs, vo, &kv), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1 has no V buffer") != NULL);
    v_bufs[1] = dev;
    CHECK_FAILS(ferry_kv_cache_new_over(&p, NULL, k_bufs, ko, v_bufs, vo, &kv), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "layer 1's K and V are in buffers of different types") != NULL);
    CHECK_FAILS(ferry_kv_cache_new_over(&p, NULL, k_bufs, NULL, v_bufs, vo, &kv), FERRY_ERR_INVALID_ARG);
    CHECK(kv == NULL);
    v_bufs[1] = host;
    CHECK_OK(ferry_kv_cache_new_over(&p, NULL, k_bufs, ko, v_bufs, vo, &kv));
    ferry_kv_cache_free(kv);
    CHECK(ferry_buffer_id_is_live(ferry_buffer_id(host)) && ferry_buffer_id_is_live(ferry_buffer_id(dev)));
    ferry_buffer_free(host);
    ferry_buffer_free(dev);
    ferry_backend_free(dummy);
}

/* A layer the cache does not have: accessors that return a status refuse it with the range
 * (OUT_OF_BOUNDS), the others answer 0 or NULL; cells and streams outside the cache are
 * refused as well. */
static void test_kv_cache_outside_refused(void) {
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 16, .n_head_kv = 2,
                               .n_ctx = 32, .n_stream = 2, .n_layer = 2};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new(&p, ferry_cpu_buffer_type(), &kv));
    ferry_tensor * t = NULL;
    int64_t n = 0;
    const int32_t outside[2] = {-1, 2};
    for (int i = 0; i < 2; i++) {
        CHECK_FAILS(ferry_kv_cache_k(kv, outside[i], &t), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), "is not in 0..1") != NULL);
        CHECK_FAILS(ferry_kv_cache_v(kv, outside[i], &t), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_FAILS(ferry_kv_cache_layer_n_kv(kv, outside[i], 4, &n), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK_EQ_U(ferry_kv_cache_layer_kv_size(kv, outside[i]), 0);
        CHECK(ferry_kv_cache_layer_buffer_type(kv, outside[i]) == NULL);
        CHECK(ferry_kv_cache_layer_buffer(kv, outside[i]) == NULL);
    }
    CHECK(t == NULL && n == 0);
    CHECK_EQ_U(ferry_kv_cache_layer_kv_size(kv, 1), 16);
    CHECK(ferry_kv_cache_layer_buffer(kv, 1) == ferry_kv_cache_buffer(kv));
    CHECK_FAILS(ferry_kv_cache_k(kv, 0, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_cache_layer_n_kv(kv, 0, 4, NULL), FERRY_ERR_INVALID_ARG);
    /* cells and streams: a stream past the last or before the first, a cell past the end */
    size_t offset = 7;
    const int64_t at[4][2] = {{-1, 0}, {2, 0}, {0, -1}, {0, 17}};
    for (int i = 0; i < 4; i++) {
        CHECK_FAILS(ferry_kv_cache_cell_offset(kv, false, at[i][0], at[i][1], &offset), FERRY_ERR_OUT_OF_BOUNDS);
    }
    CHECK_EQ_U(offset, 7);
    CHECK_FAILS(ferry_kv_cache_cell_offset(kv, false, 0, 0, NULL), FERRY_ERR_INVALID_ARG);
    int64_t ne[4];
    size_t nb[4];
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, false, 4, 0, 1, ne, NULL, &offset), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, false, 0, 0, 1, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_kv_cache_window_layout(kv, false, 4, 1, 0, ne, nb, &offset), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(offset, 7);
    ferry_kv_cache_free(kv);
}

static const check_test tests[] = {
    {"kv_cache_params_gives_back_what_it_was_made_of", test_kv_cache_params_gives_back_what_it_was_made_of},
    {"kv_cache_params_refused", test_kv_cache_params_refused},
    {"kv_cache_over_refused", test_kv_cache_over_refused},
    {"kv_cache_outside_refused", test_kv_cache_outside_refused},
};

CHECK_MAIN(tests)
