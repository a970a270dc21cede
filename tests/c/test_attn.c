/*
 * Decode attention against a float64 reference computed here with plain loops, on the
 * K and V windows of a real KV cache. Every cell the op must not read holds NaN: the
 * gaps between streams, the cells of a stream at or past its length, the cells past
 * n_kv. One NaN read anywhere makes its output row NaN, so a finite, matching output
 * shows the op read exactly the cells it should, through K's and V's ne/nb.
 */
#include "attn-fixture.h"

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


static void test_f32_attention_matches_the_reference(void) {
    for (int trans = 0; trans < 2; trans++) {
        for (int64_t group = 1; group <= 4; group += 3) {
            attn_params p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, trans, group);
            CHECK_EQ_U(check_case(&p), 0);
            p.q_permuted = true;
            CHECK_EQ_U(check_case(&p), 0);
        }
    }
}

static void test_f16_attention_matches_the_reference(void) {
    for (int trans = 0; trans < 2; trans++) {
        for (int64_t group = 1; group <= 4; group += 3) {
            const attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, trans, group);
            CHECK_EQ_U(check_case(&p), 0);
        }
    }
}

static void test_q8_0_attention_matches_the_reference(void) {
    for (int64_t group = 1; group <= 4; group += 3) {
        const attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false, group);
        CHECK_EQ_U(check_case(&p), 0);
    }
}

/* K and V of different types, as a cache may hold them. */
static void test_mixed_k_and_v_types_match_the_reference(void) {
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 4);
    CHECK_EQ_U(check_case(&p), 0);
    p = base_params(FERRY_TYPE_F16, FERRY_TYPE_Q8_0, false, 2);
    CHECK_EQ_U(check_case(&p), 0);
}

/* Eight streams, a unified cache, one stream, odd head_dim: the shapes around the usual ones. */
static void test_unusual_shapes_match_the_reference(void) {
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
static void test_at_n_kv_equal_head_dim_v_trans_says_how_v_lies(void) {
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
/* A tensor of the given type and shape in ctx, contiguous; NULL if refused. */
static ferry_tensor * attn_operand(ferry_context * ctx, ferry_type type, int64_t n0, int64_t n1, int64_t n2,
                                   int64_t n3) {
    const int64_t ne[4] = {n0, n1, n2, n3};
    ferry_tensor * t = NULL;
    return ferry_tensor_new(ctx, type, 4, ne, &t) == FERRY_OK ? t : NULL;
}

/* The operand a refused attn_decode names: its message begins "attn_decode: <name> is". */
static bool names_operand(const char * name) {
    char want[64];
    snprintf(want, sizeof(want), "attn_decode: %s is ", name);
    return strncmp(ferry_last_error(), want, strlen(want)) == 0;
}

/* attn_decode refused with a layout error that names `name`, and no tensor made */
#define ATTN_REFUSED(ctx, call, name)                                 \
    do {                                                              \
        const size_t n_before_ = ferry_context_n_tensors(ctx);        \
        CHECK_FAILS(call, FERRY_ERR_LAYOUT);                          \
        CHECK(names_operand(name));                                   \
        CHECK_EQ_U(ferry_context_n_tensors(ctx), n_before_);          \
    } while (0)

/* Each layout error names the operand at fault: a q without heads, streams or head_dim is
 * q's; a head_dim that only q lacks is q's too, unless k's strides show an unpermuted window
 * (then k is the one to fix); a V that does not match K is V's; a q8_0 operand needs whole
 * blocks in its rows; kv_len is one length per stream. Nothing is made. */
static void test_each_layout_error_names_the_operand_at_fault(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * out = NULL;
    /* the good operands: K and V windows as KVCache.window gives them, [64, 13, 2, 3] permuted */
    ferry_tensor *kc = attn_operand(ctx, FERRY_TYPE_F16, 64, 2, 13, 3), *k, *v;
    CHECK(kc != NULL);
    CHECK_OK(ferry_tensor_permute(ctx, kc, 0, 2, 1, 3, &k));
    v = k;
    ferry_tensor *q = attn_operand(ctx, FERRY_TYPE_F32, 64, 4, 1, 3), *len = attn_operand(ctx, FERRY_TYPE_I32, 3, 1, 1, 1);
    CHECK_OK(ferry_attn_decode(ctx, q, k, v, len, 1.0f, false, &out));
    out = NULL;

    const int64_t bad_q[3][4] = {{0, 4, 1, 3}, {64, 0, 1, 3}, {64, 4, 1, 0}}; /* no head_dim, heads, streams */
    for (int i = 0; i < 3; i++) {
        ferry_tensor * t = attn_operand(ctx, FERRY_TYPE_F32, bad_q[i][0], bad_q[i][1], bad_q[i][2], bad_q[i][3]);
        ATTN_REFUSED(ctx, ferry_attn_decode(ctx, t, k, v, len, 1.0f, false, &out), "q");
    }
    /* q of head_dim 32 against K and V of 64: q is the odd one out, V transposed or not */
    ferry_tensor * q32 = attn_operand(ctx, FERRY_TYPE_F32, 32, 4, 1, 3);
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q32, k, v, len, 1.0f, false, &out), "q");
    CHECK(strstr(ferry_last_error(), "head_dim 64 of k and v") != NULL);
    ferry_tensor * vt = attn_operand(ctx, FERRY_TYPE_F16, 13, 64, 2, 3); /* [n_kv, head_dim, ...] */
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q32, k, vt, len, 1.0f, true, &out), "q");
    CHECK_OK(ferry_attn_decode(ctx, q, k, vt, len, 1.0f, true, &out)); /* the same V, with q's head_dim */
    out = NULL;
    /* ... but K with heads closer together than cells is a window not yet permuted: k's fault */
    ferry_tensor * k_unpermuted = attn_operand(ctx, FERRY_TYPE_F16, 64, 13, 2, 3);
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q32, k_unpermuted, v, len, 1.0f, false, &out), "k");
    /* a K without kv heads */
    ferry_tensor * k0 = attn_operand(ctx, FERRY_TYPE_F16, 64, 13, 0, 3);
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q, k0, v, len, 1.0f, false, &out), "k");
    CHECK(strstr(ferry_last_error(), "n_head_kv at least 1") != NULL);
    /* V that does not match K: its type, head_dim, kv heads, streams */
    ferry_tensor * bad_v[4] = {
        attn_operand(ctx, FERRY_TYPE_BF16, 64, 13, 2, 3), attn_operand(ctx, FERRY_TYPE_F16, 32, 13, 2, 3),
        attn_operand(ctx, FERRY_TYPE_F16, 64, 13, 1, 3), attn_operand(ctx, FERRY_TYPE_F16, 64, 13, 2, 2)};
    for (int i = 0; i < 4; i++) {
        ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q, k, bad_v[i], len, 1.0f, false, &out), "v");
        CHECK(strstr(ferry_last_error(), "matching k, [64, 13, 2, 3]") != NULL);
    }
    /* q8_0 K and V of rows of 16 values (a q8_0 [32, 16] transposed): not whole blocks */
    ferry_tensor *q16 = attn_operand(ctx, FERRY_TYPE_F32, 16, 4, 1, 3), *blocks = attn_operand(ctx, FERRY_TYPE_Q8_0, 32, 16, 2, 3);
    ferry_tensor *k8, *k16 = attn_operand(ctx, FERRY_TYPE_F16, 16, 32, 2, 3), *k16p;
    CHECK_OK(ferry_tensor_permute(ctx, blocks, 1, 0, 2, 3, &k8)); /* [16, 32, 2, 3] */
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q16, k8, k8, len, 1.0f, false, &out), "k");
    CHECK(strstr(ferry_last_error(), "whole blocks") != NULL);
    ferry_tensor * k16c = attn_operand(ctx, FERRY_TYPE_F16, 16, 2, 32, 3);
    CHECK_OK(ferry_tensor_permute(ctx, k16c, 0, 2, 1, 3, &k16p)); /* a permuted f16 window, [16, 32, 2, 3] */
    CHECK_OK(ferry_attn_decode(ctx, q16, k16p, k16, len, 1.0f, false, &out));
    out = NULL;
    ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q16, k16p, k8, len, 1.0f, false, &out), "v");
    CHECK(strstr(ferry_last_error(), "whole blocks") != NULL);
    /* kv_len: one i32 per stream, nothing more */
    ferry_tensor * bad_len[3] = {attn_operand(ctx, FERRY_TYPE_I32, 3, 2, 1, 1), attn_operand(ctx, FERRY_TYPE_I32, 3, 1, 2, 1),
                                 attn_operand(ctx, FERRY_TYPE_I32, 3, 1, 1, 2)};
    for (int i = 0; i < 3; i++) {
        ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q, k, v, bad_len[i], 1.0f, false, &out), "kv_len");
    }
    CHECK(out == NULL);
    ferry_context_free(ctx);
}

/* ferry_attn_reads_type is the list of K and V types attention takes: for every type, attn_decode
 * makes its node from a K and V window of that type iff the list has it, and refuses it naming k. */
static void test_attn_reads_exactly_the_types_it_lists(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * q = attn_operand(ctx, FERRY_TYPE_F32, 64, 4, 1, 3);
    ferry_tensor * len = attn_operand(ctx, FERRY_TYPE_I32, 3, 1, 1, 1);
    int listed = 0;
    for (int t = 0; t < FERRY_TYPE_COUNT; t++) {
        ferry_tensor *cells = attn_operand(ctx, (ferry_type) t, 64, 2, 13, 3), *k = NULL, *out = NULL;
        CHECK(cells != NULL);
        CHECK_OK(ferry_tensor_permute(ctx, cells, 0, 2, 1, 3, &k)); /* a K window, [64, 13, 2, 3] */
        const bool reads = ferry_attn_reads_type((ferry_type) t);
        listed += reads;
        if (reads) {
            CHECK_OK(ferry_attn_decode(ctx, q, k, k, len, 1.0f, false, &out));
        } else {
            ATTN_REFUSED(ctx, ferry_attn_decode(ctx, q, k, k, len, 1.0f, false, &out), "k");
            const char * want = strstr(ferry_last_error(), "must be "); /* names every type listed */
            CHECK(want != NULL);
            for (int u = 0; want && u < FERRY_TYPE_COUNT; u++) {
                if (ferry_attn_reads_type((ferry_type) u)) CHECK(strstr(want, ferry_type_name((ferry_type) u)) != NULL);
            }
        }
    }
    CHECK_EQ_U(listed, 3); /* f32, f16, q8_0 */
    CHECK(!ferry_attn_reads_type(FERRY_TYPE_COUNT));
    ferry_context_free(ctx);
}

static void test_shape_mismatches_are_layout_errors_making_nothing(void) {
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
    /* q of another type, of more tokens than the window's 13 cells, of another head_dim */
    const int64_t ne_q16[4] = {64, 4, 1, 3}, ne_q2[4] = {64, 4, 14, 3}, ne_qd[4] = {32, 4, 1, 3};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 4, ne_q16, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 4, ne_q2, &t));
    CHECK_FAILS(ferry_attn_decode(ctx, t, c.k, c.v, c.len, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "n_tok at most the window's 13 cells") != NULL);
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

static void test_standin_has_its_own_memory_and_only_cpu_ops(void) {
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

/* A case's outputs three ways: scheduled on the stand-in under FLAT and under RANGES (their stats in
 * st_flat and st_ranges when not NULL), and on the CPU backend where its windows lie; each array
 * malloc'd, n floats, for the caller to free. */
static void run_three_ways(attn_case * c, ferry_backend * standin, size_t n, float ** flat, float ** ranges,
                           float ** direct, ferry_sched_stats * st_flat, ferry_sched_stats * st_ranges) {
    *flat = malloc(n * sizeof(float));
    *ranges = malloc(n * sizeof(float));
    *direct = malloc(n * sizeof(float));
    CHECK_OK(run_sched(c, standin, FERRY_COPY_FLAT, *flat, n, st_flat));
    CHECK_OK(run_sched(c, standin, FERRY_COPY_RANGES, *ranges, n, st_ranges));
    CHECK_OK(run_on(c, c->cpu, *direct, n));
}

/*
 * Through the scheduler: the cache, q and kv_len in CPU memory, the attention node on
 * the stand-in device, so the windows arrive by the copy path. Under FLAT the NaN of the
 * gaps travel too, under RANGES they do not; the outputs are the same bytes either way,
 * and the same as the CPU backend's own.
 */
static void test_scheduled_standin_gives_cpu_bytes_flat_or_ranges(void) {
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, false, 4);
    p.n_ctx = 4 * 40, p.n_kv = 17, p.lens[0] = 17, p.lens[1] = 0, p.lens[2] = 9;
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    float *flat, *ranges, *direct;
    ferry_sched_stats st_flat, st_ranges;
    SUB(run_three_ways(&c, standin, n, &flat, &ranges, &direct, &st_flat, &st_ranges));
    double * want = reference(&c);
    const double err = max_error(direct, want, n);
    CHECK(st_ranges.bytes_copied < st_flat.bytes_copied); /* the gaps stayed behind */
    CHECK(err <= 2e-6);
    CHECK(memcmp(flat, ranges, n * sizeof(float)) == 0);
    CHECK(memcmp(flat, direct, n * sizeof(float)) == 0);
    free(want);
    free(flat);
    free(ranges);
    free(direct);
    ferry_backend_free(standin);
    case_free(&c);
}

/* ---------------------------------------------------------------- several query tokens per stream */

/* n_tok tokens per stream, token t over the stream's first len - n_tok + t + 1 cells: every type,
 * V transposed or not, ragged lengths (the empty stream stays zeros), against the reference. */
static void test_several_tokens_match_the_reference(void) {
    const ferry_type types[3][2] = {{FERRY_TYPE_F32, FERRY_TYPE_F32}, {FERRY_TYPE_F16, FERRY_TYPE_F16},
                                    {FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0}};
    for (int ty = 0; ty < 3; ty++) {
        for (int trans = 0; trans < 2; trans++) {
            if (trans && types[ty][1] == FERRY_TYPE_Q8_0) continue;
            for (int64_t n_tok = 1; n_tok <= 7; n_tok += 3) {
                attn_params p = base_params(types[ty][0], types[ty][1], trans, 2);
                p.n_tok = n_tok;
                CHECK_EQ_U(check_case(&p), 0);
            }
        }
    }
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 4); /* mixed, n_tok = n_kv */
    p.n_tok = 13, p.lens[1] = 13, p.lens[2] = 1000;
    CHECK_EQ_U(check_case(&p), 0);
}

/* A stream shorter than the step's tokens is refused at compute, naming it, writing no output. */
static void test_a_length_below_n_tok_is_refused_naming_the_stream(void) {
    attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, false, 2);
    p.n_tok = 8; /* lengths 13, 0 (taking no part) and 7 */
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    float * got = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) got[i] = 42.0f;
    CHECK_OK(ferry_tensor_set(c.out, got, 0, n * sizeof(float)));
    CHECK_FAILS(run_on(&c, c.cpu, got, n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "stream 2's length 7") != NULL);
    CHECK(strstr(ferry_last_error(), "8 query tokens") != NULL);
    CHECK_OK(ferry_tensor_get(c.out, got, 0, n * sizeof(float)));
    size_t n_kept = 0;
    for (size_t i = 0; i < n; i++) n_kept += got[i] == 42.0f;
    CHECK_EQ_U(n_kept, n); /* nothing written */
    free(got);
    case_free(&c);
}

/* Bytes moved into the memory of the scheduler's input copies, every kind of transfer. */
static uint64_t bytes_into_inputs(const ferry_sched * s) {
    uint64_t bytes = 0;
    for (int i = 0; i < ferry_sched_n_inputs(s); i++) {
        ferry_sched_input_info in;
        ferry_stats st;
        if (ferry_sched_input(s, i, &in) == FERRY_OK && ferry_buffer_get_stats(in.copy->buffer, &st) == FERRY_OK) {
            for (int k = 0; k < FERRY_XFER_COUNT; k++) bytes += st.bytes[k];
        }
    }
    return bytes;
}

/* In a scheduled run a stream shorter than the step's tokens is refused before the first byte
 * moves: the device's counters and the scheduler's stats stay the previous run's, and the next
 * run with good lengths goes on. */
static void test_a_scheduled_length_below_n_tok_moves_no_byte(void) {
    attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, false, 2);
    p.n_tok = 5; /* lengths 13, 0 and 7 */
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    ferry_tensor * out;
    CHECK_OK(ferry_attn_decode(c.ctx, c.q, c.k, c.v, c.len, p.scale, p.v_trans, &out));
    CHECK_OK(ferry_tensor_set_output(out));
    ferry_tensor_set_name(out, "attn");
    ferry_graph * g;
    ferry_sched * s;
    ferry_backend * backends[2] = {standin, c.cpu};
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, out));
    CHECK_OK(ferry_sched_new(backends, 2, &s));
    CHECK_OK(ferry_sched_set_tensor_backend(s, out, standin));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    ferry_sched_stats before, after;
    CHECK_OK(ferry_sched_get_stats(s, &before));
    const uint64_t moved = bytes_into_inputs(s);
    CHECK(before.bytes_copied > 0 && moved >= before.bytes_copied);
    const int32_t short_lens[3] = {13, 0, 3};
    CHECK_OK(ferry_tensor_set(c.len, short_lens, 0, sizeof(short_lens)));
    CHECK_FAILS(ferry_sched_graph_compute(s, g), FERRY_ERR_OUT_OF_BOUNDS);
    char why[512];
    snprintf(why, sizeof(why), "%s", ferry_last_error());
    CHECK_OK(ferry_sched_get_stats(s, &after));
    CHECK_EQ_U(bytes_into_inputs(s), moved);
    CHECK(memcmp(&before, &after, sizeof(before)) == 0);
    CHECK(strstr(why, "sched_graph_compute: attention of 'attn'") != NULL);
    CHECK(strstr(why, "stream 2's length 3") != NULL);
    CHECK(strstr(why, "below q's 5 query tokens") != NULL);
    CHECK_OK(ferry_tensor_set(c.len, p.lens, 0, 3 * sizeof(int32_t)));
    CHECK_OK(ferry_sched_graph_compute(s, g));
    ferry_sched_free(s);
    ferry_graph_free(g);
    ferry_backend_free(standin);
    case_free(&c);
}

/* Through the scheduler on the stand-in device, several tokens per stream: flat, ranges and the
 * CPU backend's own run give the same bytes, within 2e-6 of the reference. */
static void test_several_tokens_scheduled_give_cpu_bytes(void) {
    attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F32, true, 3);
    p.n_tok = 6, p.lens[0] = 6, p.lens[2] = 11;
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    float *flat, *ranges, *direct;
    SUB(run_three_ways(&c, standin, n, &flat, &ranges, &direct, NULL, NULL));
    double * want = reference(&c);
    CHECK(max_error(direct, want, n) <= 2e-6);
    CHECK(memcmp(flat, direct, n * sizeof(float)) == 0);
    CHECK(memcmp(ranges, direct, n * sizeof(float)) == 0);
    free(want);
    free(flat);
    free(ranges);
    free(direct);
    ferry_backend_free(standin);
    case_free(&c);
}

static const check_test tests[] = {
    {"f32_attention_matches_the_reference", test_f32_attention_matches_the_reference},
    {"f16_attention_matches_the_reference", test_f16_attention_matches_the_reference},
    {"q8_0_attention_matches_the_reference", test_q8_0_attention_matches_the_reference},
    {"mixed_k_and_v_types_match_the_reference", test_mixed_k_and_v_types_match_the_reference},
    {"unusual_shapes_match_the_reference", test_unusual_shapes_match_the_reference},
    {"at_n_kv_equal_head_dim_v_trans_says_how_v_lies", test_at_n_kv_equal_head_dim_v_trans_says_how_v_lies},
    {"attn_lengths_clamped", test_attn_lengths_clamped},
    {"attn_empty_stream_zeros", test_attn_empty_stream_zeros},
    {"attn_deterministic", test_attn_deterministic},
    {"shape_mismatches_are_layout_errors_making_nothing", test_shape_mismatches_are_layout_errors_making_nothing},
    {"each_layout_error_names_the_operand_at_fault", test_each_layout_error_names_the_operand_at_fault},
    {"attn_reads_exactly_the_types_it_lists", test_attn_reads_exactly_the_types_it_lists},
    {"standin_has_its_own_memory_and_only_cpu_ops", test_standin_has_its_own_memory_and_only_cpu_ops},
    {"scheduled_standin_gives_cpu_bytes_flat_or_ranges", test_scheduled_standin_gives_cpu_bytes_flat_or_ranges},
    {"several_tokens_match_the_reference", test_several_tokens_match_the_reference},
    {"a_length_below_n_tok_is_refused_naming_the_stream", test_a_length_below_n_tok_is_refused_naming_the_stream},
    {"a_scheduled_length_below_n_tok_moves_no_byte", test_a_scheduled_length_below_n_tok_moves_no_byte},
    {"several_tokens_scheduled_give_cpu_bytes", test_several_tokens_scheduled_give_cpu_bytes},
};

CHECK_MAIN(tests)
