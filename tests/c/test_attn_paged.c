/*
 * Paged attention (ferry_attn_paged) on the CPU: byte for byte ferry_attn_decode over the dense
 * window the paged cache's gather builds (ferry_paged_cache_window copied by ferry_copy_input),
 * over tables whose blocks streams share, random ragged lengths, n_tok 1..16, f32/f16/q8_0, V
 * transposed or not. Pool cells no stream reads hold NaN, and table entries no length reaches hold
 * junk (-1, a slot past the pools, a slot of NaN), so a read the op must not make shows. Then a
 * read entry that is not a slot: refused at compute, naming the stream and the entry, writing
 * nothing. With CUDA: the kernel within float tolerance of the CPU's (SKIP without a device).
 */
#include "paged-fixture.h"

#include <math.h>
#include <string.h>

/* One case's operands in a context and a CPU buffer. */
typedef struct {
    ferry_context * ctx;
    ferry_backend * cpu;
    ferry_paged_cache * cache;
    ferry_tensor * q, * kv_len, * table;
    ferry_buffer * buf;
    int32_t lens[N_SEQ];
    int64_t n_tok;
} paged_case;

/* Write a random, finite value of type t (one q8_0 block: 32 values) at p. */
static void random_value(ferry_type t, uint8_t * p) {
    const float x = (float) (paged_rnd() % 2001) / 1000.0f - 1.0f;
    if (t == FERRY_TYPE_F32) {
        memcpy(p, &x, sizeof x);
    } else if (t == FERRY_TYPE_F16) {
        const uint16_t h = (uint16_t) (0x3000 + paged_rnd() % 0x0c00) | (uint16_t) ((paged_rnd() & 1) << 15);
        memcpy(p, &h, sizeof h);
    } else { /* q8_0: an f16 scale about 2^-8, then 32 int8 */
        const uint16_t d = (uint16_t) (0x1c00 + paged_rnd() % 0x3ff);
        memcpy(p, &d, sizeof d);
        for (int i = 0; i < 32; i++) {
            p[2 + i] = (uint8_t) (int8_t) ((int) (paged_rnd() % 255) - 127);
        }
    }
}

/* Pool cell x's values (every channel's, through the pool's strides) made random and finite. */
static void fill_cell(ferry_tensor * pool, bool trans, int64_t x) {
    const int64_t n_embd = HEAD_DIM * N_HEAD_KV, per = ferry_blck_size(pool->type);
    for (int64_t i = 0; i < n_embd / per; i++) {
        uint8_t * p = (uint8_t *) pool->data + (trans ? (size_t) x * pool->nb[0] + (size_t) i * pool->nb[1]
                                                      : (size_t) x * pool->nb[1] + (size_t) i * pool->nb[0]);
        random_value(pool->type, p);
    }
}

/* A cache of NaN (all-ones bytes: NaN in f32, f16 and a q8_0 block's scale) whose sequences 0..3
 * hold lens[s] cells each in blocks drawn from the first 12 of the pool (shared: share_blocks), the
 * cells they hold random; q, kv_len; the table [6, 4] with junk past what each length reaches. */
static void case_new(paged_case * c, ferry_type tk, ferry_type tv, bool v_trans, int64_t n_tok, uint64_t seed) {
    memset(c, 0, sizeof *c);
    enum { NS = 4, MAX_BLOCKS = N_KV / BS, DRAWN = 12 };
    ferry_paged_params p = params_of(tk, tv, v_trans);
    p.share_blocks = true;
    CHECK_OK(ferry_paged_cache_new(&p, ferry_cpu_buffer_type(), NULL, &c->cache));
    CHECK_OK(ferry_context_new(&c->ctx));
    CHECK_OK(ferry_cpu_backend_new(&c->cpu));
    ferry_buffer * pools = ferry_paged_cache_layer_buffer(c->cache, 0);
    memset(ferry_buffer_base(pools), 0xff, ferry_buffer_size(pools));
    ferry_tensor *k, *v;
    CHECK_OK(ferry_paged_cache_k(c->cache, 0, &k));
    CHECK_OK(ferry_paged_cache_v(c->cache, 0, &v));
    paged_seed(seed);
    c->n_tok = n_tok;
    int32_t junk[NS][MAX_BLOCKS];
    for (int64_t s = 0; s < NS; s++) {
        const int64_t len = s == 0 ? N_KV : s == NS - 1 ? 0 : n_tok + (int64_t) (paged_rnd() % (N_KV - n_tok + 1));
        c->lens[s] = (int32_t) len;
        int32_t ids[MAX_BLOCKS];
        for (int64_t j = 0; j < MAX_BLOCKS; j++) { /* distinct within a table, shared across tables */
            bool again;
            do {
                ids[j] = (int32_t) (paged_rnd() % DRAWN);
                again = false;
                for (int64_t i = 0; i < j; i++) again = again || ids[i] == ids[j];
            } while (again);
        }
        const int64_t used = (len + BS - 1) / BS;
        CHECK_OK(ferry_paged_cache_set_table(c->cache, s, ids, used, len));
        for (int64_t x = 0; x < len; x++) {
            fill_cell(k, false, (int64_t) ids[x / BS] * BS + x % BS);
            fill_cell(v, v_trans, (int64_t) ids[x / BS] * BS + x % BS);
        }
        const int32_t junks[4] = {-1, N_BLOCKS, INT32_MAX, DRAWN}; /* DRAWN: a slot of NaN */
        for (int64_t j = 0; j < MAX_BLOCKS; j++) {
            junk[s][j] = j < used ? ids[j] : junks[paged_rnd() % 4];
        }
    }
    const int64_t ne_q[4] = {HEAD_DIM, 2 * N_HEAD_KV, n_tok, NS}, ne_len[1] = {NS}, ne_t[2] = {MAX_BLOCKS, NS};
    CHECK_OK(ferry_tensor_new(c->ctx, FERRY_TYPE_F32, 4, ne_q, &c->q));
    CHECK_OK(ferry_tensor_new(c->ctx, FERRY_TYPE_I32, 1, ne_len, &c->kv_len));
    CHECK_OK(ferry_tensor_new(c->ctx, FERRY_TYPE_I32, 2, ne_t, &c->table));
    const size_t q_bytes = (ferry_tensor_nbytes(c->q) + 255) / 256 * 256;
    CHECK_OK(ferry_backend_alloc_buffer(c->cpu, q_bytes + 512, &c->buf));
    CHECK_OK(ferry_buffer_place_tensor(c->buf, c->q, 0));
    CHECK_OK(ferry_buffer_place_tensor(c->buf, c->kv_len, q_bytes));
    CHECK_OK(ferry_buffer_place_tensor(c->buf, c->table, q_bytes + 256));
    const size_t nq = (size_t) (ferry_tensor_nelements(c->q));
    float * qv = malloc(nq * sizeof(float));
    for (size_t i = 0; qv && i < nq; i++) {
        qv[i] = (float) (paged_rnd() % 2001) / 1000.0f - 1.0f;
    }
    CHECK_OK(ferry_tensor_set(c->q, qv, 0, nq * sizeof(float)));
    free(qv);
    CHECK_OK(ferry_tensor_set(c->kv_len, c->lens, 0, sizeof(int32_t) * NS));
    CHECK_OK(ferry_tensor_set(c->table, junk, 0, sizeof junk));
}

static void case_free(paged_case * c) {
    ferry_buffer_free(c->buf);
    ferry_backend_free(c->cpu);
    ferry_context_free(c->ctx);
    ferry_paged_cache_free(c->cache);
}

/* out computed on the CPU: *got its bytes (malloc'd; as they were, 0x5a, when compute refused: st
 * says why). */
static void compute(paged_case * c, ferry_tensor * out, ferry_status * st, float ** got_out) {
    ferry_graph * g;
    ferry_gallocr * ga;
    ferry_buffer_type * bt = ferry_cpu_buffer_type();
    CHECK_OK(ferry_tensor_set_output(out));
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, out));
    CHECK_OK(ferry_gallocr_new_n(&bt, 1, &ga));
    CHECK_OK(ferry_gallocr_alloc_graph(ga, g));
    const size_t n = ferry_tensor_nbytes(out);
    float * got = malloc(n);
    *got_out = got;
    memset(got, 0x5a, n);
    CHECK_OK(ferry_tensor_set(out, got, 0, n));
    *st = ferry_backend_graph_compute(c->cpu, g);
    CHECK_OK(ferry_tensor_get(out, got, 0, n));
    ferry_gallocr_free(ga);
    ferry_graph_free(g);
}

/* attn_decode over the window the gather builds (copied to the CPU by ferry_copy_input). */
static void dense_gathered(paged_case * c, bool v_trans, float ** got) {
    ferry_tensor *kw, *vw, *kd, *vd, *out;
    ferry_buffer *kb, *vb;
    ferry_copy_stats stats;
    CHECK_OK(ferry_paged_cache_window(c->cache, c->ctx, 0, N_KV, 0, 3, &kw, &vw));
    CHECK_OK(paged_split_copy(c->cpu, c->ctx, kw, &kb, &kd));
    CHECK_OK(paged_split_copy(c->cpu, c->ctx, vw, &vb, &vd));
    CHECK_OK(ferry_copy_input(c->cpu, FERRY_COPY_FLAT, kw, kd, &stats));
    CHECK_OK(ferry_copy_input(c->cpu, FERRY_COPY_FLAT, vw, vd, &stats));
    CHECK_OK(ferry_attn_decode(c->ctx, c->q, kd, vd, c->kv_len, 0.125f, v_trans, &out));
    ferry_status st;
    compute(c, out, &st, got);
    ferry_buffer_free(kb);
    ferry_buffer_free(vb);
    CHECK_OK(st);
}

static void paged(paged_case * c, bool v_trans, ferry_status * st, float ** got) {
    ferry_tensor *k, *v, *out;
    CHECK_OK(ferry_paged_cache_k(c->cache, 0, &k));
    CHECK_OK(ferry_paged_cache_v(c->cache, 0, &v));
    CHECK_OK(ferry_attn_paged(c->ctx, c->q, k, v, c->table, c->kv_len, BS, 0.125f, v_trans, &out));
    CHECK(ferry_tensor_nbytes(out) == (size_t) (HEAD_DIM * 2 * N_HEAD_KV * c->n_tok * 4) * sizeof(float));
    CHECK(strcmp(ferry_op_name(out->op), "attn_paged") == 0);
    compute(c, out, st, got);
}

static void test_paged_gives_the_dense_gathers_bytes(void) {
    static const struct { ferry_type tk, tv; bool v_trans; } types[] = {
        {FERRY_TYPE_F32, FERRY_TYPE_F32, false}, {FERRY_TYPE_F16, FERRY_TYPE_F16, true},
        {FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false}, {FERRY_TYPE_F16, FERRY_TYPE_Q8_0, false},
        {FERRY_TYPE_Q8_0, FERRY_TYPE_F32, true},
    };
    static const int64_t n_toks[] = {1, 2, 5, 16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        for (size_t t = 0; t < sizeof n_toks / sizeof n_toks[0]; t++) {
            for (uint64_t seed = 1; seed <= 3; seed++) {
                paged_case c;
                case_new(&c, types[i].tk, types[i].tv, types[i].v_trans, n_toks[t], seed * 31 + i * 7 + t);
                float *want = NULL, *got = NULL;
                dense_gathered(&c, types[i].v_trans, &want);
                ferry_status st = FERRY_ERR_INVALID_ARG;
                paged(&c, types[i].v_trans, &st, &got);
                CHECK(st == FERRY_OK && want && got);
                if (!want || !got) return;
                const size_t n = (size_t) (HEAD_DIM * 2 * N_HEAD_KV * n_toks[t] * 4);
                bool finite = true;
                for (size_t j = 0; j < n; j++) finite = finite && isfinite(want[j]);
                CHECK(finite);
                CHECK(memcmp(got, want, n * sizeof(float)) == 0);
                free(want);
                free(got);
                case_free(&c);
            }
        }
    }
}

static void test_a_read_entry_not_a_slot_is_refused(void) {
    paged_case c;
    case_new(&c, FERRY_TYPE_F16, FERRY_TYPE_F16, false, 1, 5);
    int32_t row[N_KV / BS];
    CHECK_OK(ferry_tensor_get(c.table, row, 0, sizeof row)); /* stream 0: 24 cells, every entry read */
    const int32_t bad[3] = {-1, N_BLOCKS, INT32_MAX};
    for (int b = 0; b < 3; b++) {
        CHECK_OK(ferry_tensor_set(c.table, &bad[b], 3 * sizeof(int32_t), sizeof(int32_t)));
        ferry_status st = FERRY_OK;
        float * got = NULL;
        paged(&c, false, &st, &got);
        CHECK(st == FERRY_ERR_OUT_OF_BOUNDS && got);
        if (!got) return;
        char want[160];
        snprintf(want, sizeof want, "attn_paged: stream 0's table entry 3 (its cells 12..15, below its length 24) is "
                 "slot %d, outside the pools' slots 0..%d", (int) bad[b], N_BLOCKS - 1);
        CHECK(strstr(ferry_last_error(), want) != NULL);
        uint8_t untouched[4];
        memset(untouched, 0x5a, 4);
        bool same = true;
        for (size_t j = 0; j < (size_t) (HEAD_DIM * 2 * N_HEAD_KV * 4); j++) {
            same = same && memcmp(&got[j], untouched, 4) == 0;
        }
        CHECK(same);
        free(got);
    }
    case_free(&c);
}

static void test_shapes_that_do_not_fit_name_the_operand(void) {
    paged_case c;
    case_new(&c, FERRY_TYPE_F16, FERRY_TYPE_F16, false, 1, 6);
    ferry_tensor *k, *v, *out, *bad;
    CHECK_OK(ferry_paged_cache_k(c.cache, 0, &k));
    CHECK_OK(ferry_paged_cache_v(c.cache, 0, &v));
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, c.table, c.kv_len, 0, 1.0f, false, &out), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "attn_paged: block_size 0 is not in 1..") != NULL);
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, c.table, c.kv_len, 3, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "attn_paged: k_pool is f16") != NULL); /* 256 cells, not blocks of 3 */
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, c.table, c.kv_len, BS, 1.0f, true, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "attn_paged: v_pool is f16") != NULL);
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, c.kv_len, c.kv_len, BS, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "attn_paged: table is i32 ne [4, 1, 1, 1]") != NULL);
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, c.table, c.table, BS, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "attn_paged: kv_len is i32") != NULL);
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, c.q, v, c.table, c.kv_len, BS, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "attn_paged: k_pool is f32") != NULL);
    const int64_t ne[4] = {HEAD_DIM, 3, 1, 4};
    CHECK_OK(ferry_tensor_new(c.ctx, FERRY_TYPE_F32, 4, ne, &bad));
    CHECK_FAILS(ferry_attn_paged(c.ctx, bad, k, v, c.table, c.kv_len, BS, 1.0f, false, &out), FERRY_ERR_LAYOUT);
    CHECK(strstr(ferry_last_error(), "q's 3 query heads do not group over the 2 kv heads") != NULL);
    CHECK_FAILS(ferry_attn_paged(c.ctx, c.q, k, v, NULL, c.kv_len, BS, 1.0f, false, &out), FERRY_ERR_INVALID_ARG);
    case_free(&c);
}

#ifdef FERRY_HAVE_CUDA_TESTS
/* t's bytes in a new tensor of its layout in a buffer of backend's. */
static void on_device(paged_case * c, ferry_backend * backend, const ferry_tensor * t, ferry_buffer ** buf,
                      ferry_tensor ** out) {
    const size_t n = ferry_tensor_nbytes(t);
    void * bytes = malloc(n);
    CHECK(bytes != NULL);
    CHECK_OK(ferry_tensor_dup_layout(c->ctx, t, out));
    CHECK_OK(ferry_backend_alloc_buffer(backend, n, buf));
    CHECK_OK(ferry_buffer_place_tensor(*buf, *out, 0));
    CHECK_OK(ferry_tensor_get(t, bytes, 0, n));
    CHECK_OK(ferry_tensor_set(*out, bytes, 0, n));
    free(bytes);
}

/* The CUDA kernel over the same pools and tables (junk past the lengths, NaN where no stream reads):
 * within 2e-6 of the CPU's output relative to 1 + |value|, finite; a read entry that is not a slot
 * refused before the launch, naming it. Exits 77 (SKIP) without a device. */
static void test_cuda_paged_within_tolerance_of_the_cpu(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
    ferry_backend * cuda;
    CHECK_OK(ferry_cuda_backend_new(0, &cuda));
    static const struct { ferry_type tk, tv; bool v_trans; int64_t n_tok; } cases[] = {
        {FERRY_TYPE_F32, FERRY_TYPE_F16, true, 1}, {FERRY_TYPE_Q8_0, FERRY_TYPE_Q8_0, false, 5},
        {FERRY_TYPE_F16, FERRY_TYPE_F32, false, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        paged_case c;
        case_new(&c, cases[i].tk, cases[i].tv, cases[i].v_trans, cases[i].n_tok, 40 + i);
        float *want = NULL, *got = NULL;
        ferry_status st = FERRY_ERR_INVALID_ARG;
        paged(&c, cases[i].v_trans, &st, &want);
        CHECK(st == FERRY_OK && want);
        ferry_tensor *k, *v, *dev[5], *out;
        ferry_buffer * bufs[5];
        CHECK_OK(ferry_paged_cache_k(c.cache, 0, &k));
        CHECK_OK(ferry_paged_cache_v(c.cache, 0, &v));
        const ferry_tensor * host[5] = {c.q, k, v, c.table, c.kv_len};
        for (int j = 0; j < 5; j++) {
            on_device(&c, cuda, host[j], &bufs[j], &dev[j]);
        }
        CHECK_OK(ferry_attn_paged(c.ctx, dev[0], dev[1], dev[2], dev[3], dev[4], BS, 0.125f, cases[i].v_trans, &out));
        ferry_graph * g;
        ferry_gallocr * ga;
        ferry_buffer_type * bt = ferry_backend_default_buffer_type(cuda);
        CHECK_OK(ferry_tensor_set_output(out));
        CHECK_OK(ferry_graph_new(&g));
        CHECK_OK(ferry_graph_build(g, out));
        CHECK_OK(ferry_gallocr_new_n(&bt, 1, &ga));
        CHECK_OK(ferry_gallocr_alloc_graph(ga, g));
        CHECK_OK(ferry_backend_graph_compute(cuda, g));
        CHECK_OK(ferry_backend_synchronize(cuda));
        const size_t n = (size_t) ferry_tensor_nelements(out);
        got = malloc(n * sizeof(float));
        CHECK_OK(ferry_tensor_get(out, got, 0, n * sizeof(float)));
        double err = 0.0;
        for (size_t j = 0; j < n; j++) {
            const double e = fabs((double) got[j] - want[j]) / (1.0 + fabs((double) want[j]));
            err = isfinite(got[j]) && e <= err ? err : isfinite(got[j]) ? e : INFINITY;
        }
        fprintf(stderr, "  %s K, %s V%s, %lld tokens: %g vs CPU\n", ferry_type_name(cases[i].tk),
                ferry_type_name(cases[i].tv), cases[i].v_trans ? " (transposed)" : "", (long long) cases[i].n_tok, err);
        CHECK(err <= 2e-6);
        const int32_t bad = -1; /* stream 0 reads all its entries */
        CHECK_OK(ferry_tensor_set(dev[3], &bad, 2 * sizeof(int32_t), sizeof bad));
        CHECK_FAILS(ferry_backend_graph_compute(cuda, g), FERRY_ERR_OUT_OF_BOUNDS);
        CHECK(strstr(ferry_last_error(), "stream 0's table entry 2 (its cells 8..11") != NULL);
        ferry_gallocr_free(ga);
        ferry_graph_free(g);
        for (int j = 0; j < 5; j++) {
            ferry_buffer_free(bufs[j]);
        }
        free(want);
        free(got);
        case_free(&c);
    }
    ferry_backend_free(cuda);
}
#endif

static const check_test tests[] = {
    {"paged_gives_the_dense_gathers_bytes", test_paged_gives_the_dense_gathers_bytes},
    {"a_read_entry_not_a_slot_is_refused", test_a_read_entry_not_a_slot_is_refused},
    {"shapes_that_do_not_fit_name_the_operand", test_shapes_that_do_not_fit_name_the_operand},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"cuda_paged_within_tolerance_of_the_cpu", test_cuda_paged_within_tolerance_of_the_cpu},
#endif
};

CHECK_MAIN(tests)
