/*
 * The CUDA kernels the scheduler needs (attention and dup), against the CPU kernels and
 * the float64 reference. Built only with CUDA; every test exits 77 (SKIP) without a
 * device. The op runs through the scheduler with the cache in CPU memory, so its
 * windows reach the device by the copy path, NaN gaps and all under FLAT.
 */
#include "attn-fixture.h"

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

/* Within the tolerance of the reference, close to the CPU, the same bytes twice, and
 * the same bytes under FLAT and RANGES. 0 if all holds, else which did not (1..4). */
static int cuda_case(ferry_backend * cuda, const attn_params * p) {
    attn_case c;
    int result = -1;
    float *cpu = NULL, *a = NULL, *b = NULL, *flat = NULL;
    double * want = NULL;
    if (case_init(&c, p) != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
        goto done;
    }
    const size_t n = (size_t) ferry_tensor_nelements(c.out);
    cpu = malloc(n * sizeof(float));
    a = malloc(n * sizeof(float));
    b = malloc(n * sizeof(float));
    flat = malloc(n * sizeof(float));
    if (run_on(&c, c.cpu, cpu, n) != FERRY_OK || run_sched(&c, cuda, FERRY_COPY_RANGES, a, n, NULL) != FERRY_OK ||
        run_sched(&c, cuda, FERRY_COPY_RANGES, b, n, NULL) != FERRY_OK ||
        run_sched(&c, cuda, FERRY_COPY_FLAT, flat, n, NULL) != FERRY_OK) {
        fprintf(stderr, "run: %s\n", ferry_last_error());
        goto done;
    }
    want = reference(&c);
    const double err = max_error(a, want, n);
    double vs_cpu = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double) a[i] - cpu[i]) / (1.0 + fabs((double) cpu[i]));
        vs_cpu = e > vs_cpu ? e : vs_cpu;
    }
    fprintf(stderr, "  %s K, %s V%s, group %lld: error %g vs float64, %g vs CPU\n", ferry_type_name(p->type_k),
            ferry_type_name(p->type_v), p->v_trans ? " (transposed)" : "", (long long) p->group, err, vs_cpu);
    result = !(err <= 2e-6) ? 1 : !(vs_cpu <= 2e-6) ? 2 : memcmp(a, b, n * sizeof(float)) != 0 ? 3
           : memcmp(a, flat, n * sizeof(float)) != 0 ? 4 : 0;
done:
    free(cpu);
    free(a);
    free(b);
    free(flat);
    free(want);
    case_free(&c);
    return result;
}

static void test_cuda_attn_matches_cpu(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    const ferry_type types[3] = {FERRY_TYPE_F32, FERRY_TYPE_F16, FERRY_TYPE_Q8_0};
    for (int t = 0; t < 3; t++) {
        for (int trans = 0; trans < 2; trans++) {
            if (trans && types[t] == FERRY_TYPE_Q8_0) {
                continue;
            }
            for (int64_t group = 1; group <= 4; group += 3) {
                const attn_params p = base_params(types[t], types[t], trans, group);
                CHECK_EQ_U(cuda_case(cuda, &p), 0);
            }
        }
    }
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 4); /* mixed, longer, 8 streams */
    p.head_dim = 128, p.n_stream = 8, p.n_ctx = 8 * 300, p.n_kv = 290, p.s0 = 0, p.s1 = 7;
    memcpy(p.lens, (int32_t[8]) {290, 0, 1, 17, 289, 150, -3, 1000}, sizeof(p.lens));
    CHECK_EQ_U(cuda_case(cuda, &p), 0);
    p = base_params(FERRY_TYPE_F32, FERRY_TYPE_F32, false, 3); /* odd head_dim, q a permuted view */
    p.head_dim = 13, p.n_head_kv = 3, p.q_permuted = true;
    CHECK_EQ_U(cuda_case(cuda, &p), 0);
    ferry_backend_free(cuda);
}

/* Several query tokens per stream (token t over the stream's first len - n_tok + t + 1 cells):
 * every type, V transposed or not, ragged lengths (an empty stream, one of exactly n_tok cells,
 * one past the window), n_tok 1 to 16, against the reference and the CPU, and run to run the
 * same bytes under FLAT and RANGES. */
static void test_cuda_several_tokens_match_cpu(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    const ferry_type types[3] = {FERRY_TYPE_F32, FERRY_TYPE_F16, FERRY_TYPE_Q8_0};
    const int64_t n_toks[3] = {2, 7, 13};
    for (int t = 0; t < 3; t++) {
        for (int trans = 0; trans < 2; trans++) {
            if (trans && types[t] == FERRY_TYPE_Q8_0) {
                continue;
            }
            for (int i = 0; i < 3; i++) {
                attn_params p = base_params(types[t], types[t], trans, 1 + 3 * (i % 2));
                p.n_tok = n_toks[i], p.lens[2] = (int32_t) n_toks[i];
                CHECK_EQ_U(cuda_case(cuda, &p), 0);
            }
        }
    }
    attn_params p = base_params(FERRY_TYPE_Q8_0, FERRY_TYPE_F16, true, 2); /* mixed, 16 tokens, 8 streams */
    p.head_dim = 128, p.n_stream = 8, p.n_ctx = 8 * 300, p.n_kv = 290, p.s0 = 0, p.s1 = 7, p.n_tok = 16;
    memcpy(p.lens, (int32_t[8]) {290, 0, 16, 17, 289, 150, -3, 1000}, sizeof(p.lens));
    CHECK_EQ_U(cuda_case(cuda, &p), 0);
    ferry_backend_free(cuda);
}

/* dup on the device, against dup on the CPU, bit for bit: a q8_0 window (blocks moved
 * whole through its strides), a strided f32 window to f16 and an f16 one to f32. */
static void test_cuda_dup_matches_cpu(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    const ferry_type from[3] = {FERRY_TYPE_Q8_0, FERRY_TYPE_F32, FERRY_TYPE_F16};
    const ferry_type to[3] = {FERRY_TYPE_Q8_0, FERRY_TYPE_F16, FERRY_TYPE_F32};
    for (int i = 0; i < 3; i++) {
        attn_params p = base_params(from[i], from[i], false, 1);
        p.lens[0] = p.lens[1] = p.lens[2] = 13; /* no NaN in the window: dup reads every cell */
        attn_case c;
        CHECK_OK(case_init(&c, &p));
        ferry_tensor * d;
        CHECK_OK(ferry_dup_as(c.ctx, c.k, to[i], &d));
        CHECK(ferry_backend_supports_op(cuda, d));
        CHECK_OK(ferry_tensor_set_output(d));
        const size_t bytes = ferry_tensor_nbytes(d);
        uint8_t * on_cpu = malloc(bytes);
        uint8_t * on_cuda = malloc(bytes);
        for (int dev = 0; dev < 2; dev++) {
            ferry_graph * g;
            ferry_sched * s;
            ferry_backend * backends[2] = {dev ? cuda : c.cpu, c.cpu};
            CHECK_OK(ferry_graph_new(&g));
            CHECK_OK(ferry_graph_build(g, d));
            CHECK_OK(ferry_sched_new(backends, dev ? 2 : 1, &s));
            CHECK_OK(ferry_sched_set_tensor_backend(s, d, backends[0]));
            CHECK_OK(ferry_sched_graph_compute(s, g));
            CHECK_OK(ferry_tensor_get(d, dev ? on_cuda : on_cpu, 0, bytes));
            ferry_sched_free(s);
            ferry_graph_free(g);
        }
        CHECK(memcmp(on_cpu, on_cuda, bytes) == 0);
        free(on_cpu);
        free(on_cuda);
        case_free(&c);
    }
    ferry_backend_free(cuda);
}

/* A view whose address is not a multiple of its element size (f32 at a 6-byte offset):
 * dup of the same type moves it in narrower words, byte for byte; a conversion is refused
 * with FERRY_ERR_LAYOUT instead of a fault that would kill the context, and the backend
 * goes on working. */
static void test_unaligned_dup_copies_or_refuses_without_a_fault(void) {
    need_device();
    ferry_backend * cuda;
    ferry_context * ctx;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t n_src = 64, ne[2] = {16, 1};
    const size_t nb[2] = {4, 64}; /* nb[0] is the type size; the view reads nb[1..n_dims-1] */
    ferry_tensor *src, *view, *same, *conv, *aligned, *conv_ok;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, &n_src, &src));
    CHECK_OK(ferry_tensor_view(ctx, src, 2, ne, nb, 6, &view));
    CHECK_OK(ferry_tensor_view(ctx, src, 2, ne, nb, 8, &aligned));
    CHECK_OK(ferry_dup(ctx, view, &same));
    CHECK_OK(ferry_dup_as(ctx, view, FERRY_TYPE_F16, &conv));
    CHECK_OK(ferry_dup_as(ctx, aligned, FERRY_TYPE_F16, &conv_ok));
    ferry_buffer * buf;
    CHECK_OK(ferry_backend_alloc_buffer(cuda, 1024, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, src, 0));
    CHECK_OK(ferry_buffer_place_tensor(buf, same, 256));
    CHECK_OK(ferry_buffer_place_tensor(buf, conv, 512));
    CHECK_OK(ferry_buffer_place_tensor(buf, conv_ok, 768));
    uint8_t bytes[256], back[64];
    for (int i = 0; i < 256; i++) bytes[i] = (uint8_t) (i * 37 + 11);
    CHECK_OK(ferry_tensor_set(src, bytes, 0, sizeof(bytes)));
    ferry_graph *g_same, *g_conv, *g_ok;
    CHECK_OK(ferry_graph_new(&g_same));
    CHECK_OK(ferry_graph_build(g_same, same));
    CHECK_OK(ferry_graph_new(&g_conv));
    CHECK_OK(ferry_graph_build(g_conv, conv));
    CHECK_OK(ferry_graph_new(&g_ok));
    CHECK_OK(ferry_graph_build(g_ok, conv_ok));
    CHECK_OK(ferry_backend_graph_compute(cuda, g_same));
    CHECK_OK(ferry_backend_synchronize(cuda));
    CHECK_OK(ferry_tensor_get(same, back, 0, sizeof(back)));
    CHECK(memcmp(back, bytes + 6, sizeof(back)) == 0);
    CHECK_FAILS(ferry_backend_graph_compute(cuda, g_conv), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "not a multiple of 4") != NULL);
    CHECK_OK(ferry_backend_graph_compute(cuda, g_ok));
    CHECK_OK(ferry_backend_synchronize(cuda));
    ferry_graph_free(g_same);
    ferry_graph_free(g_conv);
    ferry_graph_free(g_ok);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
    ferry_backend_free(cuda);
}

/* What the CUDA backend claims: attention and dup, not the ops it has no kernel for. */
static void test_cuda_claims_only_the_ops_it_has_kernels_for(void) {
    need_device();
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    const attn_params p = base_params(FERRY_TYPE_F16, FERRY_TYPE_F16, true, 2);
    attn_case c;
    CHECK_OK(case_init(&c, &p));
    CHECK(ferry_backend_supports_op(cuda, c.out));
    ferry_tensor *sum, *conv;
    CHECK_OK(ferry_add(c.ctx, c.q, c.q, &sum));
    CHECK(!ferry_backend_supports_op(cuda, sum));
    CHECK_OK(ferry_dup_as(c.ctx, c.q, FERRY_TYPE_BF16, &conv));
    CHECK(!ferry_backend_supports_op(cuda, conv));
    case_free(&c);
    attn_params several = p; /* several query tokens per stream: the same kernel */
    several.n_tok = 3;
    CHECK_OK(case_init(&c, &several));
    CHECK(ferry_backend_supports_op(cuda, c.out));
    case_free(&c);
    ferry_backend_free(cuda);
}

static const check_test tests[] = {
    {"cuda_attn_matches_cpu", test_cuda_attn_matches_cpu},
    {"cuda_several_tokens_match_cpu", test_cuda_several_tokens_match_cpu},
    {"cuda_dup_matches_cpu", test_cuda_dup_matches_cpu},
    {"cuda_claims_only_the_ops_it_has_kernels_for", test_cuda_claims_only_the_ops_it_has_kernels_for},
    {"unaligned_dup_copies_or_refuses_without_a_fault", test_unaligned_dup_copies_or_refuses_without_a_fault},
};

CHECK_MAIN(tests)
