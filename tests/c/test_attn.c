/*
 * Decode attention against a float64 reference computed here with plain loops, on the
 * K and V windows of a real KV cache. Every cell the op must not read holds NaN: the
 * gaps between streams, the cells of a stream at or past its length, the cells past
 * n_kv. One NaN read anywhere makes its output row NaN, so a finite, matching output
 * shows the op read exactly the cells it should, through K's and V's ne/nb.
 */
#include "check.h"

#include <math.h>
#include <stdint.h>

#define TRY(expr) do { ferry_status try_st_ = (expr); if (try_st_ != FERRY_OK) return try_st_; } while (0)

/* ---------------------------------------------------------------- values and their exact decodings */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t) (rng_state >> 32);
}

static double uniform(void) { return (double) rnd() / 4294967296.0 * 2.0 - 1.0; } /* [-1, 1) */

/* f16 bits to double, from the definition (independent of the library's converters). */
static double half_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* A random f16 of magnitude about 2^lo..2^hi, subnormals now and then. */
static uint16_t random_half(int lo, int hi) {
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
    bool q_permuted;                    /* q a permuted view instead of a contiguous tensor */
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

static int64_t n_embd(const attn_params * p) { return p->head_dim * p->n_head_kv; }
static int64_t n_win(const attn_params * p) { return p->s1 - p->s0 + 1; }
static int64_t clamp_len(const attn_params * p, int64_t si) {
    return p->lens[si] < 0 ? 0 : (p->lens[si] > p->n_kv ? p->n_kv : p->lens[si]);
}

/* Write element (channel c, cell, stream) of a cache tensor; blocked types go a block at a time. */
static char * cache_at(const ferry_tensor * t, bool trans, int64_t c, int64_t cell, int64_t s) {
    const size_t blk = ferry_type_size(t->type), per = (size_t) ferry_blck_size(t->type);
    if (trans) { /* [kv_size, n_embd, n_stream] */
        return (char *) t->data + (size_t) cell * t->nb[0] + (size_t) c * t->nb[1] + (size_t) s * t->nb[2];
    }
    return (char *) t->data + (size_t) c / per * blk + (size_t) cell * t->nb[1] + (size_t) s * t->nb[2];
}

/* Fill a whole cache tensor with NaN, then give the valid cells of the window values. */
static void fill_cache(attn_case * c, const ferry_tensor * t, bool trans, double * ref) {
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

static ferry_status case_init(attn_case * c, const attn_params * p) {
    memset(c, 0, sizeof(*c));
    c->p = *p;
    const int64_t ns = n_win(p), n_head = p->n_head_kv * p->group, d = p->head_dim;
    const ferry_kv_params kp = {.type_k = p->type_k, .type_v = p->type_v, .head_dim = d, .n_head_kv = p->n_head_kv,
                                .n_ctx = p->n_ctx, .n_stream = p->n_stream, .n_layer = 2, .v_trans = p->v_trans};
    TRY(ferry_cpu_backend_new(&c->cpu));
    TRY(ferry_kv_cache_new(&kp, ferry_cpu_buffer_type(), &c->kv));
    TRY(ferry_context_new(&c->ctx));
    const size_t n_ref = (size_t) (ns * p->n_kv * n_embd(p));
    c->q_ref = calloc((size_t) (ns * n_head * d), sizeof(double));
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
        const int64_t ne[4] = {d, n_head, 1, ns};
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
        for (int64_t h = 0; h < n_head; h++) {
            for (int64_t i = 0; i < d; i++) {
                const float f = (float) uniform();
                memcpy((char *) q_root->data + i * c->q->nb[0] + h * c->q->nb[1] + s * c->q->nb[3], &f, 4);
                c->q_ref[(s * n_head + h) * d + i] = f;
            }
        }
    }
    return FERRY_OK;
}

static void case_free(attn_case * c) {
    free(c->q_ref);
    free(c->k_ref);
    free(c->v_ref);
    ferry_buffer_free(c->buf);
    ferry_kv_cache_free(c->kv);
    ferry_context_free(c->ctx);
    ferry_backend_free(c->cpu);
}

/* out[s][h][i] in float64, from the decoded values. */
static double * reference(const attn_case * c) {
    const attn_params * p = &c->p;
    const int64_t ns = n_win(p), n_head = p->n_head_kv * p->group, d = p->head_dim, n_kv = p->n_kv;
    double * out = calloc((size_t) (ns * n_head * d), sizeof(double));
    double * sc = calloc((size_t) n_kv + 1, sizeof(double));
    for (int64_t s = 0; s < ns; s++) {
        const int64_t len = clamp_len(p, s);
        for (int64_t h = 0; h < n_head; h++) {
            const int64_t hk = h / p->group;
            const double * q = c->q_ref + (s * n_head + h) * d;
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
            double * o = out + (s * n_head + h) * d;
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
static ferry_status run_on(attn_case * c, ferry_backend * backend, float * got, size_t n) {
    ferry_graph * g;
    TRY(ferry_graph_new(&g));
    ferry_status st = ferry_graph_build(g, c->out);
    if (st == FERRY_OK) st = ferry_backend_graph_compute(backend, g);
    if (st == FERRY_OK) st = ferry_tensor_get(c->out, got, 0, n * sizeof(float));
    ferry_graph_free(g);
    return st;
}

/* Largest |got - want| over the output, relative to 1 + |want|; NaN if any output is not finite. */
static double max_error(const float * got, const double * want, size_t n) {
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

/*
 * One case on the CPU backend: 0 when the output matches the reference within 2e-6 and
 * a second run gives the same bytes; 1 on a mismatch or NaN, 2 when runs differ, -1 if
 * the setting failed.
 */
static int check_case(const attn_params * p) {
    attn_case c;
    int result = -1;
    float *a = NULL, *b = NULL;
    double * want = NULL;
    if (case_init(&c, p) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
        goto done;
    }
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    a = malloc(n * sizeof(float));
    b = malloc(n * sizeof(float));
    if (run_on(&c, c.cpu, a, n) != FERRY_OK || run_on(&c, c.cpu, b, n) != FERRY_OK) {
        fprintf(stderr, "run: %s\n", ferry_last_error());
        goto done;
    }
    want = reference(&c);
    const double err = max_error(a, want, n);
    if (getenv("ATTN_VERBOSE")) fprintf(stderr, "err %g\n", err);
    result = 0;
    if (!(err <= 2e-6)) {
        fprintf(stderr, "  %s K, %s V%s, group %lld: max relative error %g\n", ferry_type_name(p->type_k),
                ferry_type_name(p->type_v), p->v_trans ? " (transposed)" : "", (long long) p->group, err);
        result = 1;
    } else if (memcmp(a, b, n * sizeof(float)) != 0) {
        result = 2;
    }
done:
    free(a);
    free(b);
    free(want);
    case_free(&c);
    return result;
}

/* Four streams of 24 cells, a window of streams 1..3 (s0 > 0) of 13 cells: one stream
 * full, one empty, one in between. */
static attn_params base_params(ferry_type tk, ferry_type tv, bool v_trans, int64_t group) {
    return (attn_params) {.type_k = tk, .type_v = tv, .v_trans = v_trans, .head_dim = 64, .n_head_kv = 2,
                          .group = group, .n_ctx = 96, .n_stream = 4, .n_kv = 13, .s0 = 1, .s1 = 3,
                          .lens = {13, 0, 7}, .scale = 0.125f};
}

static void test_attn_f32(void) {
    for (int trans = 0; trans < 2; trans++) {
        for (int64_t group = 1; group <= 4; group += 3) {
            attn_params p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, trans, group);
            CHECK_EQ_U(check_case(&p), 0);
            p.q_permuted = true;
            CHECK_EQ_U(check_case(&p), 0);
        }
    }
}

static void test_attn_f16(void) {
    for (int trans = 0; trans < 2; trans++) {
        for (int64_t group = 1; group <= 4; group += 3) {
            const attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, trans, group);
            CHECK_EQ_U(check_case(&p), 0);
        }
    }
}

static void test_attn_q8_0(void) {
    for (int64_t group = 1; group <= 4; group += 3) {
        const attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false, group);
        CHECK_EQ_U(check_case(&p), 0);
    }
}

/* K and V of different types, as a cache may hold them. */
static void test_attn_mixed_types(void) {
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 4);
    CHECK_EQ_U(check_case(&p), 0);
    p = base_params(FERRY_TYPE_F16, FERRY_TYPE_Q8_0, false, 2);
    CHECK_EQ_U(check_case(&p), 0);
}

/* Eight streams, a unified cache, one stream, odd head_dim: the shapes around the usual ones. */
static void test_attn_shapes(void) {
    attn_params p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F16, true, 4);
    p.n_stream = 8, p.n_ctx = 8 * 20, p.n_kv = 20, p.s0 = 0, p.s1 = 7;
    memcpy(p.lens, (int32_t[8]) {20, 1, 0, 19, 7, 20, 3, 11}, sizeof(p.lens));
    CHECK_EQ_U(check_case(&p), 0);
    p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, false, 1);
    p.n_stream = 1, p.n_ctx = 50, p.n_kv = 33, p.s0 = 0, p.s1 = 0, p.lens[0] = 30;
    CHECK_EQ_U(check_case(&p), 0);
    p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, true, 3);
    p.head_dim = 13, p.n_head_kv = 3;
    CHECK_EQ_U(check_case(&p), 0);
}

/* n_kv == head_dim: only the v_trans argument tells V's orientation, and both work. */
static void test_attn_n_kv_equals_head_dim(void) {
    for (int trans = 0; trans < 2; trans++) {
        attn_params p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, trans, 2);
        p.head_dim = 16, p.n_kv = 16, p.lens[0] = 16, p.lens[2] = 9;
        CHECK_EQ_U(check_case(&p), 0);
    }
}

/* Lengths outside 0..n_kv are clamped: -5 reads nothing, 1000 reads all n_kv cells. */
static void test_attn_lengths_clamped(void) {
    attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F32, false, 2);
    p.lens[0] = 1000, p.lens[1] = -5, p.lens[2] = 13;
    CHECK_EQ_U(check_case(&p), 0);
}

/* An empty stream gives zeros, and stays zeros whatever its cells hold. */
static void test_attn_empty_stream_zeros(void) {
    const attn_params p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, false, 2);
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    float * got = malloc(n * sizeof(float));
    CHECK_OK(run_on(&c, c.cpu, got, n));
    const size_t per_stream = (size_t) (p.head_dim * p.n_head_kv * p.group);
    bool zeros = true;
    for (size_t i = per_stream; i < 2 * per_stream; i++) {
        zeros = zeros && got[i] == 0.0f && !signbit(got[i]);
    }
    free(got);
    case_free(&c);
    CHECK(zeros);
}

/* Same bytes in, same bytes out, over many runs of a larger case. */
static void test_attn_deterministic(void) {
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 4);
    p.n_ctx = 4 * 300, p.n_kv = 257, p.lens[0] = 257, p.lens[1] = 100, p.lens[2] = 3;
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    float * first = malloc(n * sizeof(float));
    float * again = malloc(n * sizeof(float));
    bool same = run_on(&c, c.cpu, first, n) == FERRY_OK;
    for (int i = 0; i < 5 && same; i++) {
        same = run_on(&c, c.cpu, again, n) == FERRY_OK && memcmp(first, again, n * sizeof(float)) == 0;
    }
    free(first);
    free(again);
    case_free(&c);
    CHECK(same);
}

/* Shapes and types that do not fit: LAYOUT with a message, nothing made. */
static void test_attn_shape_errors(void) {
    attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, false, 2);
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    ferry_context * ctx = c.ctx;
    ferry_tensor *out = NULL, *t;
    const size_t before = ferry_context_n_tensors(ctx);
    /* V's orientation must match the argument (here n_kv 13 != head_dim 64) */
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, c.v, c.len, 1.0f, true, &out), FERRY_ERR_LAYOUT);
    CHECK_EQ_U(ferry_context_n_tensors(ctx), before); /* nothing made */
    CHECK(strstr(ferry_last_error(), "v_trans") != NULL);
    /* q of another type, with ne[2] != 1, of another head_dim */
    const int64_t ne_q16[4] = {64, 4, 1, 3}, ne_q2[4] = {64, 4, 2, 3}, ne_qd[4] = {32, 4, 1, 3};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 4, ne_q16, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q2, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_qd, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    /* query heads that do not group over the kv heads: 3 over 2 */
    const int64_t ne_q3[4] = {64, 3, 1, 3};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q3, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "group") != NULL);
    /* a window of other streams: ns differs */
    ferry_tensor *k2, *v2;
    CHECK_OK(ferry_kv_cache_window(c.kv, ctx, 1, 13, 0, 3, &k2, &v2));
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, k2, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, v2, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    /* K and V of different n_kv */
    CHECK_OK(ferry_kv_cache_window(c.kv, ctx, 1, 12, 1, 3, &k2, &v2));
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, v2, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    /* K of a type the op does not read; kv_len of the wrong type or length */
    const int64_t ne_k[4] = {64, 13, 2, 3}, ne_len[1] = {3}, ne_len4[1] = {4};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_BF16, 4, ne_k, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, t, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne_len, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, c.v, t, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_I32, 1, ne_len4, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, c.v, t, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    /* a transposed q8_0 V: cells would split blocks */
    ferry_tensor * vq;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_Q8_0, 4, ne_k, &t));
    CHECK_OK(ferry_tensor_permute(ctx, t, 1, 0, 2, 3, &vq)); /* [13, 64, 2, 3] */
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, vq, c.len, 1.0f, true, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "split blocks") != NULL);
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, c.k, c.v, c.len, 1.0f, false, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_attn_decode(ctx, c.q, NULL, c.v, c.len, 1.0f, false, &out), FERRY_ERR_INVALID_ARG);
    CHECK(out == NULL);
    case_free(&c);
}

/* ---------------------------------------------------------------- the stand-in device */

static void test_standin_backend(void) {
    ferry_backend *standin, *cpu;
    CHECK_OK(ferry_standin_backend_new(&standin));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK(strcmp(ferry_backend_name(standin), "CPU (stand-in device)") == 0);
    ferry_buffer_type * buft = ferry_backend_default_buffer_type(standin);
    CHECK(!ferry_buffer_type_is_host(buft));
    CHECK(ferry_backend_supports_buft(standin, buft));
    CHECK(!ferry_backend_supports_buft(standin, ferry_cpu_buffer_type())); /* its own memory only */
    CHECK(!ferry_backend_supports_buft(cpu, buft));                        /* and no one else uses it */
    CHECK(ferry_backend_has_2d(standin));
    /* real memory behind it */
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(standin, 256, &buf));
    CHECK_OK(ferry_buffer_clear(buf, 7));
    CHECK(((uint8_t *) ferry_buffer_base(buf))[255] == 7);
    /* it claims the CPU kernels' ops, no more: a q4_0 conversion is not one of them */
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {32, 2};
    ferry_tensor *a, *dup, *conv;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &a));
    CHECK_OK(ferry_dup(ctx, a, &dup));
    CHECK_OK(ferry_dup_as(ctx, a, FERRY_TYPE_Q4_0, &conv));
    CHECK(ferry_backend_supports_op(standin, dup));
    CHECK(!ferry_backend_supports_op(standin, conv));
    CHECK_FAILS(ferry_standin_backend_new(NULL), FERRY_ERR_INVALID_ARG);
    ferry_context_free(ctx);
    ferry_buffer_free(buf);
    ferry_backend_free(cpu);
    ferry_backend_free(standin);
}

/*
 * Through the scheduler: the cache, q and kv_len in CPU memory, the attention node on
 * the stand-in device, so the windows arrive by the copy path. Under FLAT the NaN of the
 * gaps travel too, under RANGES they do not; the outputs are the same bytes either way,
 * and the same as the CPU backend's own.
 */
static void test_attn_sched_standin_flat_and_ranges(void) {
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, false, 4);
    p.n_ctx = 4 * 40, p.n_kv = 17, p.lens[0] = 17, p.lens[1] = 0, p.lens[2] = 9;
    float * results[FERRY_COPY_POLICY_COUNT] = {0};
    uint64_t copied[FERRY_COPY_POLICY_COUNT] = {0};
    size_t n = 0;
    float * direct = NULL;
    for (int policy = FERRY_COPY_FLAT; policy <= FERRY_COPY_RANGES; policy++) {
        rng_state = 12345; /* the same case both times */
        attn_case c;
        CHECK_OK(case_init(&c, &p));
        n = (size_t) ferry_tensor_nelements(c.out);
        ferry_backend * standin;
        CHECK_OK(ferry_standin_backend_new(&standin));
        /* the CPU-placed output would stay there: give the scheduler a fresh one to place */
        ferry_tensor * out;
        CHECK_OK(ferry_attn_decode(c.ctx, c.q, c.k, c.v, c.len, p.scale, p.v_trans, &out));
        CHECK_OK(ferry_tensor_set_output(out));
        ferry_graph * g;
        CHECK_OK(ferry_graph_new(&g));
        CHECK_OK(ferry_graph_build(g, out));
        ferry_backend * backends[2] = {standin, c.cpu};
        ferry_sched * s;
        CHECK_OK(ferry_sched_new(backends, 2, &s));
        CHECK_OK(ferry_sched_set_policy(s, (ferry_copy_policy) policy));
        CHECK_OK(ferry_sched_set_tensor_backend(s, out, standin));
        CHECK_OK(ferry_sched_graph_compute(s, g));
        CHECK(ferry_sched_get_tensor_backend(s, out) == standin);
        CHECK_EQ_U(ferry_sched_n_splits(s), 1);
        CHECK_EQ_U(ferry_sched_n_inputs(s), 4); /* q, K window, V window, kv_len: all copied in */
        ferry_sched_stats st;
        CHECK_OK(ferry_sched_get_stats(s, &st));
        copied[policy] = st.bytes_copied;
        results[policy] = malloc(n * sizeof(float));
        CHECK_OK(ferry_tensor_get(out, results[policy], 0, n * sizeof(float)));
        if (!direct) {
            direct = malloc(n * sizeof(float));
            CHECK_OK(run_on(&c, c.cpu, direct, n));
            double * want = reference(&c);
            const double err = max_error(direct, want, n);
            free(want);
            CHECK(err <= 2e-6);
        }
        ferry_sched_free(s);
        ferry_graph_free(g);
        ferry_backend_free(standin);
        case_free(&c);
    }
    CHECK(copied[FERRY_COPY_RANGES] < copied[FERRY_COPY_FLAT]); /* the gaps stayed behind */
    CHECK(memcmp(results[FERRY_COPY_FLAT], results[FERRY_COPY_RANGES], n * sizeof(float)) == 0);
    CHECK(memcmp(results[FERRY_COPY_FLAT], direct, n * sizeof(float)) == 0);
    free(results[FERRY_COPY_FLAT]);
    free(results[FERRY_COPY_RANGES]);
    free(direct);
}

static const check_test tests[] = {
    {"attn_f32", test_attn_f32},
    {"attn_f16", test_attn_f16},
    {"attn_q8_0", test_attn_q8_0},
    {"attn_mixed_types", test_attn_mixed_types},
    {"attn_shapes", test_attn_shapes},
    {"attn_n_kv_equals_head_dim", test_attn_n_kv_equals_head_dim},
    {"attn_lengths_clamped", test_attn_lengths_clamped},
    {"attn_empty_stream_zeros", test_attn_empty_stream_zeros},
    {"attn_deterministic", test_attn_deterministic},
    {"attn_shape_errors", test_attn_shape_errors},
    {"standin_backend", test_standin_backend},
    {"attn_sched_standin_flat_and_ranges", test_attn_sched_standin_flat_and_ranges},
};

CHECK_MAIN(tests)
