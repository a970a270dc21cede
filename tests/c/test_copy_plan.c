/* The copy planner and its cost rule (copy-plan.c). */
#include "check.h"

#include <stdint.h>

#define MAX_COPIES 4096

static size_t row_of(ferry_type type, int64_t n) {
    size_t r = 0;
    ferry_row_size(type, n, &r);
    return r;
}

static ferry_tensor layout(ferry_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1, size_t nb2,
                           size_t nb3) {
    ferry_tensor t = {.type = type, .ne = {ne0, ne1, ne2, ne3}, .nb = {ferry_type_size(type), nb1, nb2, nb3}};
    return t;
}

static ferry_tensor contiguous(ferry_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    const size_t r = row_of(type, ne0);
    return layout(type, ne0, ne1, ne2, ne3, r, r * (size_t) ne1, r * (size_t) (ne1 * ne2));
}

/*
 * Does the plan move exactly the bytes t reads, each once, nothing else? Every
 * element's bytes are marked in one map, every planned byte counted in another.
 * Returns 0 when all holds, else 1 a planned byte outside the span, 2 a byte planned
 * twice, 3 a byte read but not planned, 4 a byte planned but not read, 5 more bytes
 * than the view's span.
 */
static bool last_view_rereads; /* did the last view checked read some byte twice? */

static int check_exact(const ferry_tensor * t, const ferry_copy_2d * c, size_t n) {
    last_view_rereads = false;
    const size_t unit = ferry_type_size(t->type);
    const int64_t blocks = t->ne[0] / ferry_blck_size(t->type);
    /* the true extent (nbytes() assumes blocks at nb[0] = their size) */
    size_t span = unit + (size_t) (blocks - 1) * t->nb[0];
    for (int d = 1; d < 4; d++) {
        span += (size_t) (t->ne[d] - 1) * t->nb[d];
    }
    uint8_t * want = calloc(span + 1, 1);
    uint8_t * got = calloc(span + 1, 1);
    int bad = 0;
    size_t total = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                for (int64_t i0 = 0; i0 < blocks; i0++) {
                    const size_t off = (size_t) i0 * t->nb[0] + (size_t) i1 * t->nb[1] + (size_t) i2 * t->nb[2] +
                                       (size_t) i3 * t->nb[3];
                    for (size_t b = 0; b < unit; b++) {
                        last_view_rereads |= want[off + b];
                        want[off + b] = 1;
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < n && !bad; i++) {
        for (size_t r = 0; r < c[i].count && !bad; r++) {
            for (size_t b = 0; b < c[i].size && !bad; b++) {
                const size_t off = c[i].offset + r * c[i].stride + b;
                if (off >= span) {
                    bad = 1;
                } else if (got[off]++) {
                    bad = 2;
                }
                total++;
            }
        }
    }
    for (size_t b = 0; b < span && !bad; b++) {
        if (want[b] && !got[b]) {
            bad = 3;
        } else if (got[b] && !want[b]) {
            bad = 4;
        }
    }
    if (!bad && total > span) {
        bad = 5;
    }
    free(want);
    free(got);
    return bad;
}

static void print_layout(const ferry_tensor * t) {
    fprintf(stderr, "  %s ne=[%lld %lld %lld %lld] nb=[%zu %zu %zu %zu]\n", ferry_type_name(t->type),
            (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3], t->nb[0], t->nb[1],
            t->nb[2], t->nb[3]);
}

/* Plan t into c and check it exactly; 0 when all holds (the count goes to *n). */
static int plan_checked(const ferry_tensor * t, ferry_copy_2d * c, size_t * n) {
    if (ferry_copy_plan(t, c, MAX_COPIES, n) != FERRY_OK) {
        fprintf(stderr, "  copy_plan: %s\n", ferry_last_error());
        print_layout(t);
        return -1;
    }
    const int bad = check_exact(t, c, *n);
    if (bad) {
        fprintf(stderr, "  plan of %zu copies fails check %d\n", *n, bad);
        print_layout(t);
    }
    return bad;
}

static bool same_copy(ferry_copy_2d a, ferry_copy_2d b) {
    return a.offset == b.offset && a.size == b.size && a.count == b.count && a.stride == b.stride;
}

/* The K window in the shape attention hands on: one copy, the ranges rule's ranges. */
static void test_k_window_is_the_ranges(void) {
    const ferry_type types[] = {FERRY_TYPE_F16, FERRY_TYPE_Q8_0, FERRY_TYPE_Q4_0};
    const int64_t streams[] = {1, 2, 4, 8};
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    for (size_t ti = 0; ti < 3; ti++) {
        for (size_t si = 0; si < 4; si++) {
            const int64_t ns = streams[si];
            const ferry_kv_params p = {.type_k = types[ti], .type_v = types[ti], .head_dim = 64, .n_head_kv = 2,
                                       .n_ctx = 24 * ns, .n_stream = ns, .n_layer = 1};
            ferry_kv_cache * kv;
            CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
            /* all streams from 0, and (when there are more than one) a later subset */
            const int64_t firsts[] = {0, ns > 1 ? 1 : 0}, lasts[] = {ns - 1, ns > 2 ? ns - 2 : ns - 1};
            for (int w = 0; w < 2; w++) {
                ferry_tensor * k;
                ferry_copy_2d r, c[MAX_COPIES];
                size_t n;
                CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, 10, firsts[w], lasts[w], &k, NULL));
                CHECK(ferry_copy_ranges_of(k, &r));
                CHECK_EQ_U(plan_checked(k, c, &n), 0);
                CHECK_EQ_U(n, 1);
                CHECK(same_copy(c[0], r));
            }
            ferry_kv_cache_free(kv);
        }
    }
    ferry_context_free(ctx);
}

/* A window of every cell of several streams is one dense range: one copy of one row. */
static void test_full_window_is_one_row(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const ferry_kv_params p = {.type_k = FERRY_TYPE_Q8_0, .type_v = FERRY_TYPE_F16, .head_dim = 32, .n_head_kv = 2,
                               .n_ctx = 64, .n_stream = 4, .n_layer = 1};
    ferry_kv_cache * kv;
    CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
    ferry_tensor *k, *v;
    ferry_copy_2d c[MAX_COPIES];
    size_t n;
    CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, 16, 1, 3, &k, &v));
    CHECK_EQ_U(plan_checked(k, c, &n), 0);
    CHECK_EQ_U(n, 1);
    CHECK_EQ_U(c[0].count, 1);
    CHECK_EQ_U(c[0].size, ferry_tensor_nbytes(k));
    CHECK_EQ_U(plan_checked(v, c, &n), 0);
    CHECK_EQ_U(n, 1);
    CHECK_EQ_U(c[0].count, 1);
    ferry_kv_cache_free(kv);
    ferry_context_free(ctx);
}

/* The transposed V window folds to one 2-D copy of n_embd * ns rows, unified or not. */
static void test_v_trans_window_is_one_copy(void) {
    const int64_t streams[] = {1, 2, 4};
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    for (size_t si = 0; si < 3; si++) {
        const int64_t n_stream = streams[si];
        const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 8, .n_head_kv = 4,
                                   .n_ctx = 40 * n_stream, .n_stream = n_stream, .n_layer = 1, .v_trans = true};
        ferry_kv_cache * kv;
        CHECK_OK(ferry_kv_cache_new(&p, NULL, &kv));
        for (int64_t s0 = 0; s0 < n_stream; s0++) {
            ferry_tensor * v;
            ferry_copy_2d c[MAX_COPIES];
            size_t n;
            const int64_t n_kv = 13, ns = n_stream - s0;
            CHECK_OK(ferry_kv_cache_window(kv, ctx, 0, n_kv, s0, n_stream - 1, NULL, &v));
            CHECK_EQ_U(plan_checked(v, c, &n), 0);
            CHECK_EQ_U(n, 1);
            CHECK_EQ_U(c[0].offset, 0);
            CHECK_EQ_U(c[0].size, (size_t) n_kv * 2);
            CHECK_EQ_U(c[0].count, (size_t) (8 * 4 * ns));
            CHECK_EQ_U(c[0].stride, 40 * 2);
        }
        ferry_kv_cache_free(kv);
    }
    ferry_context_free(ctx);
}

static void test_contiguous_is_one_copy(void) {
    const ferry_type types[] = {FERRY_TYPE_F32, FERRY_TYPE_F16, FERRY_TYPE_BF16,
                                FERRY_TYPE_I32, FERRY_TYPE_Q8_0, FERRY_TYPE_Q4_0};
    for (size_t ti = 0; ti < 6; ti++) {
        const ferry_tensor t = contiguous(types[ti], 64, 3, 5, 2);
        ferry_copy_2d c[MAX_COPIES];
        size_t n;
        CHECK_EQ_U(plan_checked(&t, c, &n), 0);
        CHECK_EQ_U(n, 1);
        CHECK(same_copy(c[0], (ferry_copy_2d) {0, ferry_tensor_nbytes(&t), 1, ferry_tensor_nbytes(&t)}));
    }
}

/* Dimensions of size 1 add nothing, whatever their stride says. */
static void test_size_one_dims_ignored(void) {
    ferry_tensor t = layout(FERRY_TYPE_F32, 8, 1, 6, 1, 12345, 64, 999999);
    ferry_copy_2d c[MAX_COPIES];
    size_t n;
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK_EQ_U(n, 1);
    CHECK(same_copy(c[0], (ferry_copy_2d) {0, 32, 6, 64}));
    t = layout(FERRY_TYPE_F32, 1, 1, 1, 1, 7, 7, 7);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 4, 1, 4}));
}

/* Any order of strides: permuting a layout changes neither the bytes nor the plan. */
static void test_permuting_a_layout_leaves_its_plan_alone(void) {
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    ferry_tensor * src;
    const int64_t ne_src[1] = {4096};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F16, 1, ne_src, &src));
    /* rows of 6 values, 4 per group at 16 values apart, 3 groups 80 apart, 2 blocks 300 apart */
    const int64_t ne[4] = {6, 4, 3, 2};
    const size_t nb[4] = {2, 32, 160, 600};
    ferry_tensor * v;
    CHECK_OK(ferry_tensor_view(ctx, src, 4, ne, nb, 10, &v));
    ferry_copy_2d base[MAX_COPIES], c[MAX_COPIES];
    size_t n_base, n;
    CHECK_EQ_U(plan_checked(v, base, &n_base), 0);
    CHECK_EQ_U(n_base, 6); /* 12 B rows: 4 at 32 B apart in one 2-D copy, 3 x 2 of those (160 > 4 x 32: no fold) */
    const int perms[][4] = {{1, 0, 2, 3}, {0, 2, 1, 3}, {3, 2, 1, 0}, {2, 3, 0, 1}, {1, 3, 0, 2}};
    for (size_t pi = 0; pi < sizeof(perms) / sizeof(perms[0]); pi++) {
        ferry_tensor * p;
        CHECK_OK(ferry_tensor_permute(ctx, v, perms[pi][0], perms[pi][1], perms[pi][2], perms[pi][3], &p));
        CHECK_EQ_U(plan_checked(p, c, &n), 0);
        CHECK_EQ_U(n, n_base);
        for (size_t i = 0; i < n; i++) {
            CHECK(same_copy(c[i], base[i]));
        }
    }
    /* a transposed contiguous matrix still reads one dense range */
    ferry_tensor *m, *tm;
    const int64_t ne_m[2] = {5, 7};
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne_m, &m));
    CHECK_OK(ferry_tensor_transpose(ctx, m, &tm));
    CHECK_EQ_U(plan_checked(tm, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 140, 1, 140}));
    ferry_context_free(ctx);
}

/* A stride-0 dimension reads the same bytes again: they are moved once. */
static void test_broadcast_read_once(void) {
    const ferry_tensor t = layout(FERRY_TYPE_F32, 4, 3, 5, 1, 0, 64, 0);
    ferry_copy_2d c[MAX_COPIES];
    size_t n;
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 16, 5, 64}));
}

/* Overlapping and interleaving rows: each byte still moves once. */
static void test_overlapping_rows_move_each_byte_once(void) {
    ferry_copy_2d c[MAX_COPIES];
    size_t n;
    /* a sliding window: rows of 16 B every 8 B are one range */
    ferry_tensor t = layout(FERRY_TYPE_F32, 4, 5, 1, 1, 8, 0, 0);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 48, 1, 48}));
    /* sliding windows of 8 B rows every 4 B, repeated 100 B apart: one 2-D copy */
    t = layout(FERRY_TYPE_F16, 4, 6, 3, 1, 4, 100, 0);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 28, 3, 100}));
    /* two progressions that overlap and realign: 3 rows every 12 B, 3 of those every 24 B */
    t = layout(FERRY_TYPE_F32, 1, 3, 3, 1, 12, 24, 0);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 4, 7, 12}));
    /* rows that interleave without realigning: 0 12 24 | 20 32 44, so 20..28 is one
     * interval and {0, 12}, {32, 44} are two evenly spaced pairs */
    t = layout(FERRY_TYPE_F32, 1, 3, 2, 1, 12, 20, 0);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK_EQ_U(n, 3);
    CHECK(same_copy(c[0], (ferry_copy_2d) {0, 4, 2, 12}));
    CHECK(same_copy(c[1], (ferry_copy_2d) {20, 8, 1, 8}));
    CHECK(same_copy(c[2], (ferry_copy_2d) {32, 4, 2, 12}));
    /* the same tangle repeated far apart: the outer dimension becomes the 2-D copies,
     * 4 progressions of 4 B rows and 1 of 8 B rows */
    t = layout(FERRY_TYPE_F32, 1, 3, 2, 50, 12, 20, 1000);
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK_EQ_U(n, 5);
    for (size_t i = 0; i < n; i++) {
        CHECK(c[i].count == 50 && c[i].stride == 1000);
    }
    /* blocks that overlap inside a row: q8_0 blocks every 17 B */
    t = layout(FERRY_TYPE_Q8_0, 96, 2, 1, 1, 200, 0, 0);
    t.nb[0] = 17;
    CHECK_EQ_U(plan_checked(&t, c, &n), 0);
    CHECK(n == 1 && same_copy(c[0], (ferry_copy_2d) {0, 68, 2, 200}));
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(uint64_t n) { /* xorshift64*, uniform enough for layouts */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull) >> 33) % n;
}

/*
 * Random views over random sources, every type: ne 1..5 per dimension (ne0 whole
 * blocks), strides from dense through gapped to overlapping and broadcast, then maybe
 * a permutation, at a random offset the source allows. Every plan must be exact.
 */
static void test_random_views_exact(void) {
    int planned = 0, rereads = 0, several = 0;
    for (int iter = 0; iter < 4000; iter++) {
        ferry_context * ctx;
        CHECK_OK(ferry_context_new(&ctx));
        const ferry_type type = (ferry_type) rnd(FERRY_TYPE_COUNT);
        const int64_t blck = ferry_blck_size(type);
        const size_t unit = ferry_type_size(type);
        int64_t ne[4];
        size_t nb[4];
        ne[0] = (int64_t) (1 + rnd(5)) * blck;
        nb[0] = unit;
        size_t extent = row_of(type, ne[0]);
        for (int d = 1; d < 4; d++) {
            ne[d] = (int64_t) (1 + rnd(5));
            switch (rnd(6)) {
            case 0: nb[d] = extent; break;                        /* dense */
            case 1: nb[d] = extent + unit * (1 + rnd(4)); break;  /* gapped */
            case 2: nb[d] = unit * (1 + rnd(8)); break;           /* small: overlap or interleave */
            case 3: nb[d] = nb[d - 1] * (1 + rnd(3)); break;      /* a multiple of the last */
            case 4: nb[d] = rnd(8) == 0 ? 0 : 1 + rnd(3 * extent); break; /* anything, broadcast */
            default: nb[d] = extent * (1 + rnd(3)); break;
            }
            extent += nb[d] * (size_t) (ne[d] - 1);
        }
        /* the source: a flat tensor a little longer than the view's span */
        ferry_tensor probe = {.type = type, .ne = {ne[0], ne[1], ne[2], ne[3]}, .nb = {nb[0], nb[1], nb[2], nb[3]}};
        const size_t span = ferry_tensor_nbytes(&probe), slack = rnd(3) * unit;
        const int64_t src_blocks = (int64_t) ((span + slack + unit - 1) / unit);
        const int64_t ne_src[1] = {src_blocks * blck};
        ferry_tensor *src, *v;
        CHECK_OK(ferry_tensor_new(ctx, type, 1, ne_src, &src));
        const size_t room = (size_t) src_blocks * unit - span;
        CHECK_OK(ferry_tensor_view(ctx, src, 4, ne, nb, room ? rnd(room + 1) : 0, &v));
        if (rnd(2)) {
            int axis[4] = {0, 1, 2, 3};
            for (int i = 3; i > 0; i--) {
                const int j = (int) rnd((uint64_t) i + 1), x = axis[i];
                axis[i] = axis[j];
                axis[j] = x;
            }
            if (blck > 1 && axis[0] != 0) { /* block types keep their blocks on dimension 0 */
                for (int i = 1; i < 4; i++) {
                    if (axis[i] == 0) {
                        axis[i] = axis[0];
                    }
                }
                axis[0] = 0;
            }
            ferry_tensor * p;
            CHECK_OK(ferry_tensor_permute(ctx, v, axis[0], axis[1], axis[2], axis[3], &p));
            v = p;
        }
        ferry_copy_2d c[MAX_COPIES];
        size_t n;
        const int bad = plan_checked(v, c, &n);
        if (bad) {
            fprintf(stderr, "  random view %d\n", iter);
        }
        CHECK_EQ_U(bad, 0);
        /* never more copies than the view has rows of one unit */
        CHECK(n <= (size_t) (ferry_tensor_nelements(v) / blck));
        planned++;
        rereads += last_view_rereads;
        several += n > 1;
        ferry_context_free(ctx);
    }
    printf("  %d random views planned exactly: %d read some byte twice, %d needed several copies\n", planned, rereads,
           several);
}

static void test_plan_refuses_bad_input_and_counts_copies_needed(void) {
    ferry_tensor t = contiguous(FERRY_TYPE_F32, 4, 3, 1, 1);
    ferry_copy_2d c[4];
    size_t n = 99;
    CHECK_FAILS(ferry_copy_plan(NULL, c, 4, &n), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan(&t, c, 4, NULL), FERRY_ERR_INVALID_ARG);
    /* counting only */
    t = layout(FERRY_TYPE_F32, 4, 3, 5, 1, 100, 1000, 0);
    CHECK_OK(ferry_copy_plan(&t, NULL, 0, &n));
    CHECK_EQ_U(n, 3);
    CHECK_FAILS(ferry_copy_plan(&t, c, 2, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(n, 3); /* still says how many are needed */
    CHECK_OK(ferry_copy_plan(&t, c, 3, &n));
    ferry_tensor bad = t;
    bad.type = FERRY_TYPE_COUNT;
    CHECK_FAILS(ferry_copy_plan(&bad, c, 4, &n), FERRY_ERR_UNKNOWN_TYPE);
    bad = t;
    bad.ne[2] = -1;
    CHECK_FAILS(ferry_copy_plan(&bad, c, 4, &n), FERRY_ERR_INVALID_ARG);
    bad = contiguous(FERRY_TYPE_Q8_0, 64, 2, 1, 1);
    bad.ne[0] = 40;
    CHECK_FAILS(ferry_copy_plan(&bad, c, 4, &n), FERRY_ERR_LAYOUT);
    bad = t;
    bad.nb[2] = SIZE_MAX / 2;
    CHECK_FAILS(ferry_copy_plan(&bad, c, 4, &n), FERRY_ERR_OUT_OF_BOUNDS);
    /* a tangle too large to enumerate is refused, not attempted */
    bad = layout(FERRY_TYPE_F32, 1, 2000, 2000, 1, 12, 20, 0);
    CHECK_FAILS(ferry_copy_plan(&bad, NULL, 0, &n), FERRY_ERR_UNSUPPORTED);
    /* an empty view needs nothing */
    bad = t;
    bad.ne[1] = 0;
    CHECK_OK(ferry_copy_plan(&bad, c, 4, &n));
    CHECK_EQ_U(n, 0);
}

/* A KV layer at full scale, laid out only (no memory): -c 32768, 1024 channels. */
static int plan_window(ferry_context * ctx, ferry_type type, int64_t n_stream, bool v_trans, int64_t ns,
                       ferry_tensor ** t, ferry_copy_2d * c, size_t * n) {
    const ferry_kv_params p = {.type_k = type, .type_v = type, .head_dim = 128, .n_head_kv = 8, .n_ctx = 32768,
                               .n_stream = n_stream, .n_layer = 1, .v_trans = v_trans};
    ferry_kv_cache * kv;
    ferry_tensor *k, *v;
    if (ferry_kv_cache_new(&p, NULL, &kv) != FERRY_OK ||
        ferry_kv_cache_window(kv, ctx, 0, 2176, 0, ns - 1, &k, &v) != FERRY_OK) {
        return -1;
    }
    *t = v_trans ? v : k;
    const ferry_status st = ferry_copy_plan(*t, c, MAX_COPIES, n);
    ferry_kv_cache_free(kv);
    return st == FERRY_OK ? 0 : -1;
}

static bool within(double got, double want, double rel) { return got > want * (1 - rel) && got < want * (1 + rel); }

/* The GPU model reproduces docs/design.md's measured anchors, and says the plan pays for them. */
static void test_gpu_model_matches_anchors(void) {
    const ferry_copy_cost_model m = ferry_copy_cost_model_gpu();
    ferry_context * ctx;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t streams[] = {2, 4, 8};
    const double flat_us[] = {372, 535, 620}, plan_us[] = {91, 177, 352};
    for (int i = 0; i < 3; i++) {
        ferry_tensor * k;
        ferry_copy_2d c[MAX_COPIES];
        size_t n;
        CHECK_EQ_U(plan_window(ctx, FERRY_TYPE_Q8_0, streams[i], false, streams[i], &k, c, &n), 0);
        CHECK_EQ_U(n, 1);
        CHECK_EQ_U(c[0].size, 2176 * 1088);
        const double pf = ferry_copy_flat_cost(&m, ferry_tensor_nbytes(k)) * 1e6;
        const double pp = ferry_copy_plan_cost(&m, c, n) * 1e6;
        if (!within(pf, flat_us[i], 0.03) || !within(pp, plan_us[i], 0.03)) {
            fprintf(stderr, "  %lld streams: model flat %.0f us plan %.0f us, measured %.0f / %.0f\n",
                    (long long) streams[i], pf, pp, flat_us[i], plan_us[i]);
        }
        CHECK(within(pf, flat_us[i], 0.03) && within(pp, plan_us[i], 0.03));
        CHECK(ferry_copy_plan_pays(&m, k, c, n));
    }
    /* transposed V f16, unified: 1024 rows of 4352 B at a 64 KiB pitch, flat 1212 us, 2-D 128 us */
    ferry_tensor * v;
    ferry_copy_2d c[MAX_COPIES];
    size_t n;
    CHECK_EQ_U(plan_window(ctx, FERRY_TYPE_F16, 1, true, 1, &v, c, &n), 0);
    CHECK(n == 1 && c[0].count == 1024 && c[0].size == 4352 && c[0].stride == 65536);
    CHECK(within(ferry_copy_flat_cost(&m, ferry_tensor_nbytes(v)) * 1e6, 1212, 0.03));
    CHECK(within(ferry_copy_plan_cost(&m, c, n) * 1e6, 128, 0.03));
    CHECK(ferry_copy_plan_pays(&m, v, c, n));
    /* a unified K window is its span: a tie, and a tie stays flat */
    ferry_tensor * k;
    CHECK_EQ_U(plan_window(ctx, FERRY_TYPE_Q8_0, 1, false, 1, &k, c, &n), 0);
    CHECK(n == 1 && c[0].size == ferry_tensor_nbytes(k));
    const ferry_copy_cost_model cpu = ferry_copy_cost_model_cpu();
    CHECK(!ferry_copy_plan_pays(&m, k, c, n));
    CHECK(!ferry_copy_plan_pays(&cpu, k, c, n));
    ferry_context_free(ctx);
}

/* The thresholds each model documents, on single 2-D copies of 1 MiB read. */
static void test_plans_pay_past_each_models_documented_threshold(void) {
    const ferry_copy_cost_model cpu = ferry_copy_cost_model_cpu(), gpu = ferry_copy_cost_model_gpu();
    const struct {
        const ferry_copy_cost_model * m;
        size_t width;
        double below, above; /* span / read ratios on either side of the break-even */
    } cases[] = {
        {&cpu, 16, 25, 33},   {&cpu, 64, 6.5, 8},   {&cpu, 256, 2.8, 3.3}, {&cpu, 1024, 1.9, 2.1},
        {&cpu, 4096, 1.7, 1.8}, {&cpu, 65536, 1.0, 1.1}, {&gpu, 64, 1.3, 1.45}, {&gpu, 16, 5.0, 5.9},
        {&gpu, 4096, 1.0, 1.05},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const size_t w = cases[i].width, rows = ((size_t) 1 << 20) / w;
        for (int side = 0; side < 2; side++) {
            const size_t stride = (size_t) ((double) w * (side ? cases[i].above : cases[i].below));
            const ferry_tensor t = layout(FERRY_TYPE_I32, (int64_t) w / 4, (int64_t) rows, 1, 1, stride, 0, 0);
            const ferry_copy_2d c = {0, w, rows, stride};
            const bool pays = ferry_copy_plan_pays(cases[i].m, &t, &c, 1);
            if (pays != (side == 1)) {
                fprintf(stderr, "  %s model, %zu B rows at %zu B: pays %d\n", cases[i].m == &cpu ? "cpu" : "gpu", w,
                        stride, pays);
            }
            CHECK(pays == (side == 1));
        }
    }
    /* more copies than they save: 1000 single rows saving 100 B each do not pay on the GPU */
    ferry_copy_2d many[1000];
    for (size_t i = 0; i < 1000; i++) {
        many[i] = (ferry_copy_2d) {i * 4196, 4096, 1, 4096};
    }
    const ferry_tensor t = layout(FERRY_TYPE_I32, 1024, 1000, 1, 1, 4196, 0, 0);
    CHECK(!ferry_copy_plan_pays(&gpu, &t, many, 1000));
    CHECK(!ferry_copy_plan_pays(NULL, &t, many, 1000));
    CHECK(!ferry_copy_plan_pays(&gpu, &t, NULL, 0));
}


/* ---------------------------------------------------------------- the explanation */

static bool dims_are(const ferry_dim_list * l, int n, const int * want) {
    if (l->n != n) {
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (l->dim[i] != want[i]) {
            return false;
        }
    }
    return true;
}

static ferry_status explain_of(const ferry_tensor * t, ferry_copy_explanation * ex) {
    return ferry_copy_plan_explain(t->type, 4, t->ne, t->nb, ex);
}

/* The transposed V window: each element's row is one value, dimension 0 merges into it,
 * and the heads fold into the head dimension: one 2-D copy. */
static void test_explain_v_trans_folds(void) {
    const int64_t n_kv = 13, kv_size = 40, head_dim = 8;
    const size_t pitch = (size_t) kv_size * 4;
    const ferry_tensor v = layout(FERRY_TYPE_F32, n_kv, head_dim, 4, 1, pitch, pitch * head_dim, pitch * head_dim * 4);
    ferry_copy_explanation ex;
    CHECK_OK(explain_of(&v, &ex));
    CHECK(!ex.empty);
    CHECK_EQ_U(ex.row, n_kv * 4);
    CHECK(dims_are(&ex.row_dims, 1, (const int[]) {0}));
    CHECK_EQ_U(ex.broadcast.n, 0);
    CHECK_EQ_U(ex.n_folds, 1);
    CHECK(dims_are(&ex.folds[0].inner, 1, (const int[]) {1}));
    CHECK(dims_are(&ex.folds[0].outer, 1, (const int[]) {2}));
    CHECK_EQ_U(ex.n_dims, 1);
    CHECK_EQ_U(ex.dims[0].count, head_dim * 4);
    CHECK_EQ_U(ex.dims[0].stride, pitch);
    CHECK(dims_are(&ex.dims[0].dims, 2, (const int[]) {1, 2}));
    CHECK(ex.nested);
    CHECK_EQ_U(ex.dim_2d, 0);
    CHECK_EQ_U(ex.n_copies, 1);
}

/* Each step once: merged dims, a broadcast dim, nested dims that take several copies
 * along the one with the most rows, rows that tangle, and an empty layout. */
static void test_explain_names_each_step_of_a_plan(void) {
    ferry_copy_explanation ex;
    /* dims 0 and 1 merge into a 64 B row, dim 2 is broadcast, dim 3 repeats the row */
    const ferry_tensor a = layout(FERRY_TYPE_F32, 4, 4, 5, 2, 16, 0, 100);
    CHECK_OK(explain_of(&a, &ex));
    CHECK_EQ_U(ex.row, 64);
    CHECK(dims_are(&ex.row_dims, 2, (const int[]) {0, 1}));
    CHECK(dims_are(&ex.broadcast, 1, (const int[]) {2}));
    CHECK_EQ_U(ex.n_folds, 0);
    CHECK_EQ_U(ex.n_dims, 1);
    CHECK(ex.nested);
    CHECK_EQ_U(ex.n_copies, 1);
    /* 3 rows at 100 B inside 5 at 1000 B: the 2-D copy runs along the 5, 3 copies of it */
    const ferry_tensor b = layout(FERRY_TYPE_F32, 1, 3, 5, 1, 100, 1000, 4);
    CHECK_OK(explain_of(&b, &ex));
    CHECK_EQ_U(ex.row, 4);
    CHECK_EQ_U(ex.row_dims.n, 0);
    CHECK_EQ_U(ex.n_dims, 2);
    CHECK(ex.nested);
    CHECK_EQ_U(ex.dim_2d, 1);
    CHECK(dims_are(&ex.dims[1].dims, 1, (const int[]) {2}));
    CHECK_EQ_U(ex.n_copies, 3);
    /* strides 12 and 20 under 4 B rows: they interleave over 1100 x 1100 rows */
    const ferry_tensor c = layout(FERRY_TYPE_F32, 1, 1100, 1100, 1, 12, 20, 4);
    CHECK_OK(explain_of(&c, &ex));
    CHECK(!ex.nested);
    CHECK_EQ_U(ex.dim_2d, (unsigned long long) -1);
    CHECK_EQ_U(ex.n_copies, 0);
    CHECK_EQ_U(ex.n_dims, 2);
    /* a dimension of 0: empty */
    const int64_t ne[2] = {4, 0};
    const size_t nb[2] = {4, 16};
    CHECK_OK(ferry_copy_plan_explain(FERRY_TYPE_F32, 2, ne, nb, &ex));
    CHECK(ex.empty && ex.nested);
    CHECK_EQ_U(ex.row, 0);
    CHECK_EQ_U(ex.n_copies, 0);
}

/* On random layouts the explanation's row and copy count are the plan's own. */
static void test_explain_agrees_with_plan(void) {
    int nested = 0;
    for (int iter = 0; iter < 4000; iter++) {
        const ferry_type type = (ferry_type) rnd(FERRY_TYPE_COUNT);
        const int64_t blck = ferry_blck_size(type);
        const size_t unit = ferry_type_size(type);
        ferry_tensor t = {.type = type, .ne = {(int64_t) (1 + rnd(5)) * blck}, .nb = {unit}};
        size_t extent = row_of(type, t.ne[0]);
        for (int d = 1; d < 4; d++) {
            t.ne[d] = (int64_t) (1 + rnd(5));
            t.nb[d] = rnd(3) == 0 ? unit * rnd(6) : extent * (1 + rnd(3));
            extent += t.nb[d] * (size_t) (t.ne[d] - 1);
        }
        ferry_copy_explanation ex;
        ferry_copy_2d c[MAX_COPIES];
        size_t n;
        CHECK_OK(explain_of(&t, &ex));
        if (ferry_copy_plan(&t, c, MAX_COPIES, &n) != FERRY_OK) {
            CHECK(!ex.nested); /* only tangled rows can be too many to plan */
            continue;
        }
        if (ex.nested) {
            nested++;
            CHECK_EQ_U(ex.n_copies, n);
            for (size_t i = 0; i < n; i++) {
                CHECK_EQ_U(c[i].size, ex.row);
                CHECK_EQ_U(c[i].count, ex.n_dims ? ex.dims[ex.dim_2d].count : 1);
            }
        }
    }
    printf("  %d nested random layouts explained as planned\n", nested);
    CHECK(nested > 1000);
}

static void test_explain_refuses_bad_input_with_its_status(void) {
    ferry_copy_explanation ex;
    const int64_t ne[4] = {4, 3, 1, 1}, neg[2] = {4, -1}, q[1] = {31};
    const size_t nb[4] = {4, 16, 48, 48}, huge[2] = {4, SIZE_MAX / 2};
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 2, ne, nb, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 2, NULL, nb, &ex), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 0, ne, nb, &ex), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 5, ne, nb, &ex), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan_explain((ferry_type) 99, 2, ne, nb, &ex), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 2, neg, nb, &ex), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_Q4_0, 1, q, nb, &ex), FERRY_ERR_LAYOUT);
    const int64_t big[2] = {4, 3};
    CHECK_FAILS(ferry_copy_plan_explain(FERRY_TYPE_F32, 2, big, huge, &ex), FERRY_ERR_OUT_OF_BOUNDS);
}

/* A plan's pieces: a piece per row at its own offsets (a gather's: pool to window); merged where the
 * gap is the same on both sides and cheaper than a piece; refusals leave the pieces as they were. */
static void test_pieces_of_a_plan_and_their_merge(void) {
    const ferry_copy_2d copies[2] = {{.offset = 10, .size = 4, .count = 3, .stride = 100},
                                     {.offset = 400, .size = 8, .count = 1, .stride = 8}};
    ferry_copy_piece p[8];
    size_t n = 0;
    CHECK_OK(ferry_copy_pieces(copies, 2, NULL, 0, &n));
    CHECK_EQ_U(n, 4);
    CHECK_FAILS(ferry_copy_pieces(copies, 2, p, 3, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(n, 4);
    CHECK_OK(ferry_copy_pieces(copies, 2, p, 8, &n));
    CHECK(p[1].src_offset == 110 && p[1].dst_offset == 110 && p[1].size == 4 && p[3].src_offset == 400);
    const ferry_gather_copy g = {.src_offset = 500, .dst_offset = 0, .size = 8, .count = 2, .src_stride = 64,
                                 .dst_stride = 8};
    CHECK_OK(ferry_gather_pieces(&g, 1, p, 8, &n));
    CHECK(n == 2 && p[1].src_offset == 564 && p[1].dst_offset == 8);
    const ferry_copy_2d wrap = {.offset = SIZE_MAX - 8, .size = 4, .count = 2, .stride = 8};
    CHECK_FAILS(ferry_copy_pieces(&wrap, 1, NULL, 0, &n), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_copy_pieces(NULL, 1, NULL, 0, &n), FERRY_ERR_INVALID_ARG);
    /* a piece costs 1 us, a byte 1 ns: gaps under 1000 bytes merge, the others do not */
    ferry_copy_cost_model m = {.call_us = 0, .row_ns = 0, .gbps = 1.0, .small_row_efficiency = 1.0,
                               .piece_ns = 1000.0};
    ferry_copy_piece q[4] = {{0, 0, 10}, {10, 10, 10}, {500, 500, 10}, {5000, 7000, 10}};
    uint64_t gaps = 0;
    n = 4;
    CHECK_OK(ferry_copy_pieces_merge(&m, q, &n, &gaps));
    CHECK(n == 2 && q[0].size == 510 && gaps == 480 && q[1].dst_offset == 7000);
    m.gbps = 0;
    n = 2;
    CHECK_FAILS(ferry_copy_pieces_merge(&m, q, &n, NULL), FERRY_ERR_INVALID_ARG);
    CHECK(n == 2 && q[0].size == 510);
}

/* Pieces placed from a staging area in one call: each where it goes; a piece past either end (or
 * whose end overflows) refuses the whole placement before a byte moves. */
static void test_pieces_placed_from_staging(void) {
    unsigned char staging[16], dst[12];
    for (int i = 0; i < 16; i++) {
        staging[i] = (unsigned char) (i + 1);
    }
    memset(dst, 0, sizeof dst);
    const ferry_copy_piece p[2] = {{.src_offset = 0, .dst_offset = 8, .size = 4},
                                   {.src_offset = 12, .dst_offset = 0, .size = 4}};
    CHECK_OK(ferry_copy_pieces_place(dst, sizeof dst, staging, sizeof staging, p, 2));
    CHECK(dst[0] == 13 && dst[3] == 16 && dst[4] == 0 && dst[8] == 1 && dst[11] == 4);
    CHECK_OK(ferry_copy_pieces_place(NULL, 0, NULL, 0, NULL, 0));
    memset(dst, 0, sizeof dst);
    const ferry_copy_piece past_src[2] = {p[0], {.src_offset = 14, .dst_offset = 0, .size = 4}};
    CHECK_FAILS(ferry_copy_pieces_place(dst, sizeof dst, staging, sizeof staging, past_src, 2),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "piece 1") != NULL && dst[8] == 0);  /* piece 0 not placed either */
    const ferry_copy_piece past_dst = {.src_offset = 0, .dst_offset = 10, .size = 4};
    CHECK_FAILS(ferry_copy_pieces_place(dst, sizeof dst, staging, sizeof staging, &past_dst, 1),
                FERRY_ERR_OUT_OF_BOUNDS);
    const ferry_copy_piece wrap_src = {.src_offset = SIZE_MAX - 1, .dst_offset = 0, .size = 4};
    const ferry_copy_piece wrap_dst = {.src_offset = 0, .dst_offset = SIZE_MAX - 1, .size = 4};
    CHECK_FAILS(ferry_copy_pieces_place(dst, sizeof dst, staging, sizeof staging, &wrap_src, 1),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_copy_pieces_place(dst, sizeof dst, staging, sizeof staging, &wrap_dst, 1),
                FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_copy_pieces_place(NULL, 12, staging, 16, p, 1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_pieces_place(dst, 12, NULL, 16, p, 1), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_copy_pieces_place(dst, 12, staging, 16, NULL, 1), FERRY_ERR_INVALID_ARG);
    CHECK(dst[0] == 0 && dst[11] == 0);
}

static const check_test tests[] = {
    {"k_window_is_the_ranges", test_k_window_is_the_ranges},
    {"pieces_placed_from_staging", test_pieces_placed_from_staging},
    {"full_window_is_one_row", test_full_window_is_one_row},
    {"v_trans_window_is_one_copy", test_v_trans_window_is_one_copy},
    {"contiguous_is_one_copy", test_contiguous_is_one_copy},
    {"size_one_dims_ignored", test_size_one_dims_ignored},
    {"permuting_a_layout_leaves_its_plan_alone", test_permuting_a_layout_leaves_its_plan_alone},
    {"broadcast_read_once", test_broadcast_read_once},
    {"overlapping_rows_move_each_byte_once", test_overlapping_rows_move_each_byte_once},
    {"random_views_exact", test_random_views_exact},
    {"plan_refuses_bad_input_and_counts_copies_needed", test_plan_refuses_bad_input_and_counts_copies_needed},
    {"gpu_model_matches_anchors", test_gpu_model_matches_anchors},
    {"plans_pay_past_each_models_documented_threshold", test_plans_pay_past_each_models_documented_threshold},
    {"explain_v_trans_folds", test_explain_v_trans_folds},
    {"explain_names_each_step_of_a_plan", test_explain_names_each_step_of_a_plan},
    {"explain_agrees_with_plan", test_explain_agrees_with_plan},
    {"explain_refuses_bad_input_with_its_status", test_explain_refuses_bad_input_with_its_status},
    {"pieces_of_a_plan_and_their_merge", test_pieces_of_a_plan_and_their_merge},
};

CHECK_MAIN(tests)
