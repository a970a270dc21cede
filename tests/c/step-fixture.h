/* The decode step the prefetch tests run: a KV cache in CPU memory, per layer a query and
 * attention over its windows on a device, every output pinned there (test_prefetch.c,
 * test_prefetch_next.c, test_fetch.c), and a scheduler that runs it (step_sched_new, step_run). The windows carry the streams' lengths from host memory (host_len),
 * attention reads them from the device (len): a test that changes one writes both. */
#ifndef FERRY_STEP_FIXTURE_H
#define FERRY_STEP_FIXTURE_H

#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYER 4
#define N_STREAM 4
#define HEAD_DIM 64
#define N_HEAD_KV 2
#define N_HEAD 4
#define N_CTX (N_STREAM * 48)
#define N_KV 40

#define FERRY_TRY_T(expr) do { ferry_status try_st_ = (expr); if (try_st_ != FERRY_OK) return try_st_; } while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t) (rng >> 32);
}

/* A finite f16 in about [-2, 2]. */
static uint16_t random_f16(void) {
    const uint16_t sign = (uint16_t) ((next_u32() & 1) << 15);
    const uint16_t exp = (uint16_t) (11 + next_u32() % 5); /* 2^-4 .. 2^0 */
    return sign | (uint16_t) (exp << 10) | (uint16_t) (next_u32() & 0x3ff);
}

/* A step: the cache in CPU memory, per layer a query and attention over its windows on
 * `device`, every output pinned there. */
typedef struct {
    ferry_backend * cpu;
    ferry_backend * device;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * buf; /* on device: the queries and kv_len */
    ferry_buffer * host_buf; /* the lengths again, in host memory: the windows' used cells */
    ferry_tensor * out[N_LAYER];
    ferry_tensor * win[N_LAYER][2]; /* each layer's K and V windows */
    ferry_tensor * len;      /* the lengths attention reads, on device */
    ferry_tensor * host_len; /* the same, in host memory: the windows' used cells */
    ferry_graph * graph;
    bool v_trans;
} step;

/* One buffer on backend holding the n tensors of ts and one more, each at a 256-byte boundary. */
static ferry_status place_on(ferry_backend * backend, ferry_tensor ** ts, int n, ferry_tensor * more,
                             ferry_buffer ** out) {
    size_t size = 0;
    for (int i = 0; i <= n; i++) {
        size += (ferry_tensor_nbytes(i < n ? ts[i] : more) + 255) & ~(size_t) 255;
    }
    FERRY_TRY_T(ferry_backend_alloc_buffer(backend, size, out));
    size_t at = 0;
    for (int i = 0; i <= n; i++) {
        ferry_tensor * t = i < n ? ts[i] : more;
        FERRY_TRY_T(ferry_buffer_place_tensor(*out, t, at));
        at += (ferry_tensor_nbytes(t) + 255) & ~(size_t) 255;
    }
    return FERRY_OK;
}

static ferry_status step_init(step * s, ferry_backend * device, bool v_trans) {
    memset(s, 0, sizeof(*s));
    s->device = device;
    s->v_trans = v_trans;
    const ferry_kv_params kp = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = HEAD_DIM,
                                .n_head_kv = N_HEAD_KV, .n_ctx = N_CTX, .n_stream = N_STREAM, .n_layer = N_LAYER,
                                .v_trans = v_trans};
    FERRY_TRY_T(ferry_cpu_backend_new(&s->cpu));
    FERRY_TRY_T(ferry_kv_cache_new(&kp, ferry_cpu_buffer_type(), &s->kv));
    FERRY_TRY_T(ferry_context_new(&s->ctx));
    const int64_t q_ne[4] = {HEAD_DIM, N_HEAD, 1, N_STREAM}, len_ne[1] = {N_STREAM};
    ferry_tensor *q[N_LAYER], *len;
    for (int l = 0; l < N_LAYER; l++) {
        FERRY_TRY_T(ferry_tensor_new(s->ctx, FERRY_TYPE_F32, 4, q_ne, &q[l]));
    }
    FERRY_TRY_T(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, len_ne, &len));
    FERRY_TRY_T(place_on(device, q, N_LAYER, len, &s->buf));
    float qv[HEAD_DIM * N_HEAD * N_STREAM];
    for (int l = 0; l < N_LAYER; l++) {
        for (size_t i = 0; i < sizeof(qv) / sizeof(qv[0]); i++) {
            qv[i] = (float) (next_u32() % 2001) / 1000.0f - 1.0f;
        }
        FERRY_TRY_T(ferry_tensor_set(q[l], qv, 0, sizeof(qv)));
    }
    const int32_t lens[N_STREAM] = {N_KV, 17, 0, 33};
    FERRY_TRY_T(ferry_tensor_set(len, lens, 0, sizeof(lens)));
    s->len = len;
    /* windows made by hand carry the lengths the ragged policy reads on the host */
    ferry_tensor * host_len;
    FERRY_TRY_T(ferry_tensor_new(s->ctx, FERRY_TYPE_I32, 1, len_ne, &host_len));
    FERRY_TRY_T(ferry_backend_alloc_buffer(s->cpu, sizeof(lens), &s->host_buf));
    FERRY_TRY_T(ferry_buffer_place_tensor(s->host_buf, host_len, 0));
    FERRY_TRY_T(ferry_tensor_set(host_len, lens, 0, sizeof(lens)));
    s->host_len = host_len;
    for (int l = 0; l < N_LAYER; l++) {
        ferry_tensor *kc, *vc, *k, *v;
        FERRY_TRY_T(ferry_kv_cache_k(s->kv, l, &kc));
        FERRY_TRY_T(ferry_kv_cache_v(s->kv, l, &vc));
        for (ferry_tensor * t = kc; t; t = t == kc ? vc : NULL) {
            const size_t n = ferry_tensor_nbytes(t) / 2;
            uint16_t * h = malloc(n * sizeof(*h));
            if (!h) {
                return FERRY_ERR_OUT_OF_MEMORY;
            }
            for (size_t i = 0; i < n; i++) {
                h[i] = random_f16();
            }
            const ferry_status st = ferry_tensor_set(t, h, 0, n * sizeof(*h));
            free(h);
            FERRY_TRY_T(st);
        }
        FERRY_TRY_T(ferry_kv_cache_window(s->kv, s->ctx, l, N_KV, 0, N_STREAM - 1, &k, &v));
        FERRY_TRY_T(ferry_tensor_set_used_cells(k, host_len, 1, 3, 0));
        FERRY_TRY_T(ferry_tensor_set_used_cells(v, host_len, v_trans ? 0 : 1, 3, 0));
        s->win[l][0] = k;
        s->win[l][1] = v;
        FERRY_TRY_T(ferry_attn_decode(s->ctx, q[l], k, v, len, 0.125f, v_trans, &s->out[l]));
        FERRY_TRY_T(ferry_tensor_set_output(s->out[l]));
    }
    FERRY_TRY_T(ferry_graph_new(&s->graph));
    for (int l = 0; l < N_LAYER; l++) {
        FERRY_TRY_T(ferry_graph_build(s->graph, s->out[l]));
    }
    return FERRY_OK;
}

static void step_free(step * s) {
    ferry_graph_free(s->graph);
    ferry_buffer_free(s->buf);
    ferry_buffer_free(s->host_buf);
    ferry_context_free(s->ctx);
    ferry_kv_cache_free(s->kv);
    ferry_backend_free(s->cpu);
}


/* The floats of one layer's attention output: every query head of every stream. */
#define OUT_FLOATS (HEAD_DIM * N_HEAD * N_STREAM)

/* What a run of the step gives: each layer's output, and the scheduler's stats. */
typedef struct {
    float out[N_LAYER][OUT_FLOATS];
    ferry_sched_stats stats;
} step_outputs;

/* A scheduler [device, cpu] for s's graph, every output on the device: prefetch parts ahead, across
 * runs when next. */
static ferry_status step_sched_new(step * s, ferry_copy_policy policy, bool compact, int prefetch, bool next,
                                   ferry_sched ** out) {
    ferry_backend * backends[2] = {s->device, s->cpu};
    FERRY_TRY_T(ferry_sched_new(backends, 2, out));
    ferry_status st = ferry_sched_set_policy(*out, policy);
    if (st == FERRY_OK) st = ferry_sched_set_compact(*out, compact);
    if (st == FERRY_OK) st = ferry_sched_set_prefetch(*out, prefetch);
    if (st == FERRY_OK) st = ferry_sched_set_prefetch_next(*out, next);
    for (int l = 0; l < N_LAYER && st == FERRY_OK; l++) {
        st = ferry_sched_set_tensor_backend(*out, s->out[l], s->device);
    }
    if (st != FERRY_OK) {
        ferry_sched_free(*out);
    }
    return st;
}

/* Computes the step on sched and reads back its outputs and stats. */
static ferry_status step_run(step * s, ferry_sched * sched, step_outputs * r) {
    FERRY_TRY_T(ferry_sched_graph_compute(sched, s->graph));
    FERRY_TRY_T(ferry_sched_get_stats(sched, &r->stats));
    for (int l = 0; l < N_LAYER; l++) {
        FERRY_TRY_T(ferry_tensor_get(s->out[l], r->out[l], 0, sizeof(r->out[l])));
    }
    return FERRY_OK;
}


#ifdef FERRY_HAVE_CUDA_TESTS
/* Device 0, or the test skipped (exit 77) where there is none. */
static ferry_backend * cuda_or_skip(void) {
    ferry_backend * cuda = NULL;
    if (!ferry_cuda_available() || ferry_cuda_backend_new(0, &cuda) != FERRY_OK) {
        fprintf(stderr, "no CUDA device: skipped\n");
        exit(77);
    }
    return cuda;
}
#endif

#endif
