/* A decode step's windows, attention nodes, assignments and graph, made in one call. */
#include "ferry-impl.h"
#include "sched-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The windows of one layer of a step's cache: a cell-per-stream cache's (sliding layers get their
 * own cells) or a paged cache's. */
typedef struct {
    const ferry_kv_cache * kv;
    const ferry_paged_cache * paged;
} step_cache;

static ferry_status layer_windows(const step_cache * c, ferry_context * ctx, int32_t layer, int64_t n_kv, int64_t s0,
                                  int64_t s1, ferry_tensor ** k, ferry_tensor ** v) {
    if (c->paged) {
        return ferry_paged_cache_window(c->paged, ctx, layer, n_kv, s0, s1, k, v);
    }
    /* A sliding-window layer's window is the cells it holds once the sequence outgrows them;
     * attention clamps each stream's kv_len to the window, so it reads min(kv_len, cells). */
    int64_t layer_n_kv;
    FERRY_TRY(ferry_kv_cache_layer_n_kv(c->kv, layer, n_kv, &layer_n_kv));
    return ferry_kv_cache_window(c->kv, ctx, layer, layer_n_kv, s0, s1, k, v);
}

/* One layer's windows and attention node, named and marked output. */
static ferry_status make_layer(const step_cache * c, ferry_context * ctx, int32_t layer, int64_t n_kv, int64_t s0,
                               int64_t s1, ferry_tensor * q, ferry_tensor * kv_len, bool v_trans, ferry_tensor ** out) {
    if (!q) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_attention_step: layer %d's q is NULL", layer);
    }
    const int64_t head_dim = q->ne[0];
    if (head_dim <= 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_attention_step: layer %d's q has head_dim %lld", layer,
                          (long long) head_dim);
    }
    ferry_tensor *k, *v;
    FERRY_TRY(layer_windows(c, ctx, layer, n_kv, s0, s1, &k, &v));
    /* The scale Python's attn_decode passes: 1/sqrt in double, rounded to f32. */
    const float scale = (float) (1.0 / sqrt((double) head_dim));
    FERRY_TRY(ferry_attn_decode(ctx, q, k, v, kv_len, scale, v_trans, out));
    /* The windows carry kv_len, for the ragged policy (and a paged window's gather) to copy each
     * stream's cells that attention reads; lengths up to the step's n_kv are the step's (a sliding
     * layer holds fewer cells). */
    FERRY_TRY(ferry_tensor_set_used_cells(k, kv_len, 1, 3, n_kv));
    FERRY_TRY(ferry_tensor_set_used_cells(v, kv_len, v_trans ? 0 : 1, 3, n_kv));
    char name[FERRY_MAX_NAME];
    snprintf(name, sizeof(name), "attn%d", layer);
    FERRY_TRY(ferry_tensor_set_name(*out, name));
    return ferry_tensor_set_output(*out);
}

/* The cache's layers, a full layer's cells per stream (paged: a pool's) and whether V is transposed. */
static ferry_status cache_shape(const step_cache * c, int32_t * n_layer, int64_t * cells, bool * v_trans) {
    if (c->paged) {
        ferry_paged_params p;
        FERRY_TRY(ferry_paged_cache_params(c->paged, &p));
        *n_layer = p.n_layer;
        *cells = p.n_blocks * p.block_size;
        *v_trans = p.v_trans;
        return FERRY_OK;
    }
    ferry_kv_params p;
    FERRY_TRY(ferry_kv_cache_params(c->kv, &p));
    *n_layer = p.n_layer;
    *cells = ferry_kv_cache_kv_size(c->kv);
    *v_trans = p.v_trans;
    return FERRY_OK;
}

/* n_layer in 1..the cache's layers (checked before anything is sized by it); n_kv in 1..a full
 * layer's cells (a sliding layer's clamp must not hide an n_kv no layer can hold); v_trans as the
 * cache lays V out (a window's shape cannot tell: n_kv == head_dim fits both). */
static ferry_status check_step(const step_cache * c, int32_t n_layer, int64_t n_kv, bool v_trans) {
    int32_t layers;
    int64_t cells;
    bool trans;
    FERRY_TRY(cache_shape(c, &layers, &cells, &trans));
    if (n_layer <= 0 || n_layer > layers) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_attention_step: %d layers, but the cache has 1..%d", n_layer,
                          layers);
    }
    if (n_kv <= 0 || n_kv > cells) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_attention_step: n_kv %lld is not in 1..%lld (%s)",
                          (long long) n_kv, (long long) cells,
                          c->paged ? "a pool's cells" : "a full layer's cells per stream");
    }
    if (v_trans != trans) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_attention_step: v_trans is %s, but the cache's V is %stransposed "
                          "(its params' v_trans is %s): pass the cache's", v_trans ? "true" : "false",
                          trans ? "" : "not ", trans ? "true" : "false");
    }
    return FERRY_OK;
}

static ferry_status attention_step(const step_cache * c, ferry_context * ctx, int32_t n_layer, int64_t n_kv,
                                   int64_t s0, int64_t s1, ferry_tensor * const * q, ferry_tensor * kv_len,
                                   bool v_trans, ferry_sched * sched, ferry_backend * const * backends,
                                   ferry_graph * graph, ferry_tensor ** outs) {
    FERRY_CHECK_ARG(ctx && q && kv_len && sched && backends && graph && outs, "kv_attention_step: NULL argument");
    FERRY_TRY(check_step(c, n_layer, n_kv, v_trans));
    /* Every layer's backend is checked before anything is made or assigned. */
    for (int32_t l = 0; l < n_layer; l++) {
        if (!backends[l]) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "kv_attention_step: layer %d's backend is NULL", l);
        }
        if (!ferry_sched_has_backend(sched, backends[l])) {
            return ferry_fail(FERRY_ERR_INVALID_ARG,
                              "kv_attention_step: layer %d's backend %s is not one of the scheduler's", l,
                              ferry_backend_name(backends[l]));
        }
    }
    /* The outputs go to outs only on success: a caller never sees a half-made step. */
    ferry_tensor ** made = ferry_malloc((size_t) n_layer * sizeof(*made));
    if (!made) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "kv_attention_step: out of memory");
    }
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = make_layer(c, ctx, l, n_kv, s0, s1, q[l], kv_len, v_trans, &made[l]);
    }
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = ferry_sched_set_tensor_backend(sched, made[l], backends[l]);
    }
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = ferry_graph_build(graph, made[l]);
    }
    if (st == FERRY_OK) {
        memcpy(outs, made, (size_t) n_layer * sizeof(*made));
    }
    free(made);
    return st;
}

ferry_status ferry_kv_attention_step_on(const ferry_kv_cache * kv, ferry_context * ctx, int32_t n_layer,
                                        int64_t n_kv, int64_t s0, int64_t s1, ferry_tensor * const * q,
                                        ferry_tensor * kv_len, bool v_trans, ferry_sched * sched,
                                        ferry_backend * const * backends, ferry_graph * graph, ferry_tensor ** outs) {
    FERRY_CHECK_ARG(kv, "kv_attention_step: NULL argument");
    const step_cache c = {.kv = kv};
    return attention_step(&c, ctx, n_layer, n_kv, s0, s1, q, kv_len, v_trans, sched, backends, graph, outs);
}

ferry_status ferry_paged_attention_step_on(const ferry_paged_cache * cache, ferry_context * ctx, int32_t n_layer,
                                           int64_t n_kv, int64_t s0, int64_t s1, ferry_tensor * const * q,
                                           ferry_tensor * kv_len, bool v_trans, ferry_sched * sched,
                                           ferry_backend * const * backends, ferry_graph * graph,
                                           ferry_tensor ** outs) {
    FERRY_CHECK_ARG(cache, "kv_attention_step: NULL argument");
    const step_cache c = {.paged = cache};
    return attention_step(&c, ctx, n_layer, n_kv, s0, s1, q, kv_len, v_trans, sched, backends, graph, outs);
}

ferry_status ferry_kv_attention_step(const ferry_kv_cache * kv, ferry_context * ctx, int32_t n_layer, int64_t n_kv,
                                     int64_t s0, int64_t s1, ferry_tensor * const * q, ferry_tensor * kv_len,
                                     bool v_trans, ferry_sched * sched, ferry_backend * backend, ferry_graph * graph,
                                     ferry_tensor ** outs) {
    FERRY_CHECK_ARG(kv && ctx && q && kv_len && sched && backend && graph && outs,
                    "kv_attention_step: NULL argument");
    const step_cache c = {.kv = kv};
    int32_t layers;
    int64_t cells;
    bool trans;
    FERRY_TRY(cache_shape(&c, &layers, &cells, &trans));
    if (n_layer <= 0 || n_layer > layers) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "kv_attention_step: %d layers, but the cache has 1..%d", n_layer,
                          layers);
    }
    /* The same backend for every layer. */
    ferry_backend ** backends = ferry_malloc((size_t) n_layer * sizeof(*backends));
    if (!backends) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "kv_attention_step: out of memory");
    }
    for (int32_t l = 0; l < n_layer; l++) {
        backends[l] = backend;
    }
    const ferry_status st = attention_step(&c, ctx, n_layer, n_kv, s0, s1, q, kv_len, v_trans, sched, backends, graph,
                                           outs);
    free(backends);
    return st;
}
