/*
 * Decode attention cases for the C tests (test_attn.c, test_cuda_attn.c): a KV cache in
 * CPU memory whose every cell the op must not read holds NaN (gaps between streams,
 * cells at or past a stream's length, cells past n_kv), q and kv_len in a CPU buffer,
 * and a float64 reference computed with plain loops from the exact decoded values.
 */
#ifndef FERRY_ATTN_FIXTURE_H
#define FERRY_ATTN_FIXTURE_H

#include "check.h"

#include <math.h>
#include <stdint.h>

#define TRY(expr) do { ferry_status try_st_ = (expr); if (try_st_ != FERRY_OK) return try_st_; } while (0)

/* ---------------------------------------------------------------- values and their exact decodings */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t) (rng_state >> 32);
}

static inline double uniform(void) { return (double) rnd() / 4294967296.0 * 2.0 - 1.0; } /* [-1, 1) */

/* f16 bits to double, from the definition (independent of the library's converters). */
static inline double half_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* A random f16 of magnitude about 2^lo..2^hi, subnormals now and then. */
static inline uint16_t random_half(int lo, int hi) {
    const uint16_t sign = (uint16_t) ((rnd() & 1) << 15), mant = (uint16_t) (rnd() & 0x3ff);
    if (rnd() % 16 == 0) {
        return sign | mant; /* subnormal */
    }
    const int e = lo + 15 + (int) (rnd() % (uint32_t) (hi - lo + 1));
    return sign | (uint16_t) (e << 10) | mant;
}

#define F16_NAN 0x7e00

/* ---------------------------------------------------------------- a case */

typedef struct {
    ferry_type type_k, type_v;
    bool v_trans;
    int64_t head_dim, n_head_kv, group; /* n_head = n_head_kv * group */
    int64_t n_ctx, n_stream;            /* the cache */
    int64_t n_kv, s0, s1;               /* the window */
    int32_t lens[8];                    /* per window stream (may lie outside 0..n_kv: clamped) */
    bool q_permuted;                    /* q a permuted view instead of a contiguous tensor (one token) */
    int64_t n_tok;                      /* query tokens per stream; 0 is 1 */
    float scale;
} attn_params;

typedef struct {
    attn_params p;
    ferry_backend * cpu;
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * buf; /* q, kv_len, out */
    ferry_tensor *q, *k, *v, *len, *out;
    double *q_ref, *k_ref, *v_ref; /* decoded values of the valid cells: [ns][n_kv][n_embd] */
} attn_case;

static inline int64_t n_embd(const attn_params * p) { return p->head_dim * p->n_head_kv; }
static inline int64_t n_win(const attn_params * p) { return p->s1 - p->s0 + 1; }
static inline int64_t n_tok_of(const attn_params * p) { return p->n_tok > 0 ? p->n_tok : 1; }
static inline int64_t clamp_len(const attn_params * p, int64_t si) {
    return p->lens[si] < 0 ? 0 : (p->lens[si] > p->n_kv ? p->n_kv : p->lens[si]);
}

/* Write element (channel c, cell, stream) of a cache tensor; blocked types go a block at a time. */
static inline char * cache_at(const ferry_tensor * t, bool trans, int64_t c, int64_t cell, int64_t s) {
    const size_t blk = ferry_type_size(t->type), per = (size_t) ferry_blck_size(t->type);
    if (trans) { /* [kv_size, n_embd, n_stream] */
        return (char *) t->data + (size_t) cell * t->nb[0] + (size_t) c * t->nb[1] + (size_t) s * t->nb[2];
    }
    return (char *) t->data + (size_t) c / per * blk + (size_t) cell * t->nb[1] + (size_t) s * t->nb[2];
}

/* Fill a whole cache tensor with NaN, then give the valid cells of the window values. */
static inline void fill_cache(attn_case * c, const ferry_tensor * t, bool trans, double * ref) {
    const attn_params * p = &c->p;
    const int64_t ne_c = trans ? t->ne[1] : t->ne[0], ne_cell = trans ? t->ne[0] : t->ne[1];
    for (int64_t s = 0; s < t->ne[2]; s++) {
        for (int64_t cell = 0; cell < ne_cell; cell++) {
            for (int64_t ch = 0; ch < ne_c; ch += ferry_blck_size(t->type)) {
                char * dst = cache_at(t, trans, ch, cell, s);
                const uint32_t f32_nan = 0x7fc00000u;
                const uint16_t h = F16_NAN;
                switch (t->type) {
                    case FERRY_TYPE_F32: memcpy(dst, &f32_nan, 4); break;
                    case FERRY_TYPE_F16: memcpy(dst, &h, 2); break;
                    default: memcpy(dst, &h, 2); memset(dst + 2, 1, 32); break; /* q8_0: d = NaN */
                }
            }
        }
    }
    for (int64_t si = 0; si < n_win(p); si++) {
        const int64_t s = p->s0 + si;
        for (int64_t cell = 0; cell < clamp_len(p, si); cell++) {
            double * r = ref + (si * p->n_kv + cell) * n_embd(p);
            for (int64_t ch = 0; ch < ne_c; ch += ferry_blck_size(t->type)) {
                char * dst = cache_at(t, trans, ch, cell, s);
                if (t->type == FERRY_TYPE_F32) {
                    const float f = (float) uniform();
                    memcpy(dst, &f, 4);
                    r[ch] = f;
                } else if (t->type == FERRY_TYPE_F16) {
                    const uint16_t h = random_half(-6, 0);
                    memcpy(dst, &h, 2);
                    r[ch] = half_value(h);
                } else {
                    const uint16_t d = random_half(-9, -7);
                    memcpy(dst, &d, 2);
                    for (int i = 0; i < 32; i++) {
                        const int8_t qv = (int8_t) ((int) (rnd() % 255) - 127);
                        memcpy(dst + 2 + i, &qv, 1);
                        r[ch + i] = half_value(d) * qv;
                    }
                }
            }
        }
    }
}

static inline ferry_status case_init(attn_case * c, const attn_params * p) {
    memset(c, 0, sizeof(*c));
    c->p = *p;
    const int64_t ns = n_win(p), n_head = p->n_head_kv * p->group, d = p->head_dim, nt = n_tok_of(p);
    const ferry_kv_params kp = {.type_k = p->type_k, .type_v = p->type_v, .head_dim = d, .n_head_kv = p->n_head_kv,
                                .n_ctx = p->n_ctx, .n_stream = p->n_stream, .n_layer = 2, .v_trans = p->v_trans};
    TRY(ferry_cpu_backend_new(&c->cpu));
    TRY(ferry_kv_cache_new(&kp, ferry_cpu_buffer_type(), &c->kv));
    TRY(ferry_context_new(&c->ctx));
    const size_t n_ref = (size_t) (ns * p->n_kv * n_embd(p));
    c->q_ref = calloc((size_t) (ns * nt * n_head * d), sizeof(double));
    c->k_ref = calloc(n_ref, sizeof(double));
    c->v_ref = calloc(n_ref, sizeof(double));
    if (!c->q_ref || !c->k_ref || !c->v_ref) {
        return FERRY_ERR_OUT_OF_MEMORY;
    }
    /* layer 1, so the window does not start at the buffer's first byte */
    ferry_tensor *kc, *vc;
    TRY(ferry_kv_cache_k(c->kv, 1, &kc));
    TRY(ferry_kv_cache_v(c->kv, 1, &vc));
    fill_cache(c, kc, false, c->k_ref);
    fill_cache(c, vc, p->v_trans, c->v_ref);
    TRY(ferry_kv_cache_window(c->kv, c->ctx, 1, p->n_kv, p->s0, p->s1, &c->k, &c->v));

    if (p->q_permuted) { /* [d, ns, n_head, 1] permuted to [d, n_head, 1, ns] */
        const int64_t ne[3] = {d, ns, n_head};
        ferry_tensor * qs;
        TRY(ferry_tensor_new(c->ctx, FERRY_TYPE_F32, 3, ne, &qs));
        TRY(ferry_tensor_permute(c->ctx, qs, 0, 3, 1, 2, &c->q));
    } else {
        const int64_t ne[4] = {d, n_head, nt, ns};
        TRY(ferry_tensor_new(c->ctx, FERRY_TYPE_F32, 4, ne, &c->q));
    }
    const int64_t ne_len[1] = {ns};
    TRY(ferry_tensor_new(c->ctx, FERRY_TYPE_I32, 1, ne_len, &c->len));
    TRY(ferry_attn_decode(c->ctx, c->q, c->k, c->v, c->len, p->scale, p->v_trans, &c->out));
    ferry_tensor_set_name(c->out, "attn");
    ferry_tensor * q_root = c->q->view_src ? c->q->view_src : c->q;
    TRY(ferry_backend_alloc_buffer(c->cpu, 4096 + ferry_tensor_nbytes(q_root) + ferry_tensor_nbytes(c->out), &c->buf));
    TRY(ferry_buffer_place_tensor(c->buf, c->len, 0));
    TRY(ferry_buffer_place_tensor(c->buf, q_root, 1024));
    TRY(ferry_buffer_place_tensor(c->buf, c->out, 2048 + ferry_tensor_nbytes(q_root) / 64 * 64));
    TRY(ferry_tensor_set(c->len, p->lens, 0, (size_t) ns * sizeof(int32_t)));
    /* q's strides index its root's memory (the permute has no offset) */
    for (int64_t s = 0; s < ns; s++) {
        for (int64_t t = 0; t < nt; t++) {
            for (int64_t h = 0; h < n_head; h++) {
                for (int64_t i = 0; i < d; i++) {
                    const float f = (float) uniform();
                    memcpy((char *) q_root->data + i * c->q->nb[0] + h * c->q->nb[1] + t * c->q->nb[2] +
                               s * c->q->nb[3], &f, 4);
                    c->q_ref[((s * nt + t) * n_head + h) * d + i] = f;
                }
            }
        }
    }
    return FERRY_OK;
}

static inline void case_free(attn_case * c) {
    free(c->q_ref);
    free(c->k_ref);
    free(c->v_ref);
    ferry_buffer_free(c->buf);
    ferry_kv_cache_free(c->kv);
    ferry_context_free(c->ctx);
    ferry_backend_free(c->cpu);
}

/* out[s][t][h][i] in float64, from the decoded values: token t of nt reads the stream's first
 * len - nt + t + 1 cells (none for an empty stream). */
static inline double * reference(const attn_case * c) {
    const attn_params * p = &c->p;
    const int64_t ns = n_win(p), n_head = p->n_head_kv * p->group, d = p->head_dim, n_kv = p->n_kv, nt = n_tok_of(p);
    double * out = calloc((size_t) (ns * nt * n_head * d), sizeof(double));
    double * sc = calloc((size_t) n_kv + 1, sizeof(double));
    for (int64_t st = 0; st < ns * nt; st++) {
        const int64_t s = st / nt, t = st % nt;
        const int64_t len = clamp_len(p, s) == 0 ? 0 : clamp_len(p, s) - nt + t + 1;
        for (int64_t h = 0; h < n_head; h++) {
            const int64_t hk = h / p->group;
            const double * q = c->q_ref + (st * n_head + h) * d;
            double m = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j < len; j++) {
                const double * k = c->k_ref + (s * n_kv + j) * n_embd(p) + hk * d;
                double dot = 0.0;
                for (int64_t i = 0; i < d; i++) dot += q[i] * k[i];
                sc[j] = p->scale * dot;
                m = sc[j] > m ? sc[j] : m;
            }
            for (int64_t j = 0; j < len; j++) {
                sc[j] = exp(sc[j] - m);
                sum += sc[j];
            }
            double * o = out + (st * n_head + h) * d;
            for (int64_t j = 0; j < len; j++) {
                const double * v = c->v_ref + (s * n_kv + j) * n_embd(p) + hk * d;
                for (int64_t i = 0; i < d; i++) o[i] += sc[j] / sum * v[i];
            }
        }
    }
    free(sc);
    return out;
}

/* Run on a backend and fetch the output (n floats). */
static inline ferry_status run_on(attn_case * c, ferry_backend * backend, float * got, size_t n) {
    ferry_graph * g;
    TRY(ferry_graph_new(&g));
    ferry_status st = ferry_graph_build(g, c->out);
    if (st == FERRY_OK) st = ferry_backend_graph_compute(backend, g);
    if (st == FERRY_OK) st = ferry_tensor_get(c->out, got, 0, n * sizeof(float));
    ferry_graph_free(g);
    return st;
}

/* Largest |got - want| over the output, relative to 1 + |want|; NaN if any output is not finite. */
static inline double max_error(const float * got, const double * want, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            return NAN;
        }
        const double e = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* Four streams of 24 cells, a window of streams 1..3 (s0 > 0) of 13 cells: one stream
 * full, one empty, one in between. */
static inline attn_params base_params(ferry_type tk, ferry_type tv, bool v_trans, int64_t group) {
    return (attn_params) {.type_k = tk, .type_v = tv, .v_trans = v_trans, .head_dim = 64, .n_head_kv = 2,
                          .group = group, .n_ctx = 96, .n_stream = 4, .n_kv = 13, .s0 = 1, .s1 = 3,
                          .lens = {13, 0, 7}, .scale = 0.125f};
}


/*
 * The op through the scheduler: backends [device, cpu], a fresh attention node (its
 * result placed by the scheduler) assigned to device, so q, kv_len and both windows are
 * inputs copied under policy. got: n floats of the output.
 */
static inline ferry_status run_sched(attn_case * c, ferry_backend * device, ferry_copy_policy policy, float * got, size_t n,
                              ferry_sched_stats * stats) {
    ferry_tensor * out;
    TRY(ferry_attn_decode(c->ctx, c->q, c->k, c->v, c->len, c->p.scale, c->p.v_trans, &out));
    TRY(ferry_tensor_set_output(out));
    ferry_graph * g = NULL;
    ferry_sched * s = NULL;
    ferry_backend * backends[2] = {device, c->cpu};
    ferry_status st = ferry_graph_new(&g);
    if (st == FERRY_OK) st = ferry_graph_build(g, out);
    if (st == FERRY_OK) st = ferry_sched_new(backends, 2, &s);
    if (st == FERRY_OK) st = ferry_sched_set_policy(s, policy);
    if (st == FERRY_OK) st = ferry_sched_set_tensor_backend(s, out, device);
    if (st == FERRY_OK) st = ferry_sched_graph_compute(s, g);
    if (st == FERRY_OK && (ferry_sched_get_tensor_backend(s, out) != device || ferry_sched_n_splits(s) != 1 ||
                           ferry_sched_n_inputs(s) != 4)) {
        fprintf(stderr, "run_sched: expected one split on %s with 4 inputs\n", ferry_backend_name(device));
        st = FERRY_ERR_LAYOUT;
    }
    if (st == FERRY_OK && stats) st = ferry_sched_get_stats(s, stats);
    if (st == FERRY_OK) st = ferry_tensor_get(out, got, 0, n * sizeof(float));
    ferry_sched_free(s);
    ferry_graph_free(g);
    return st;
}

#endif
