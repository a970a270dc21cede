/* The KV cache and its windows: the params it gives back, a window's layout, cell offsets. */
#include "check.h"

/* ferry_kv_cache_params gives back the params the cache was made with. */
static void test_kv_cache_params(void) {
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

static const check_test tests[] = {
    {"kv_cache_params", test_kv_cache_params},
};

CHECK_MAIN(tests)
