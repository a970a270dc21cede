/*
 * The transposed V window on CUDA: the backend's gather copy against the default 2-D
 * copy, its rule, and every way cuda-bench times (vtrans-paths.h), each checked for
 * exact bytes: rows whole at their own offsets, gaps untouched, compact copies packed.
 * The window here is small (128 channel rows of 512 B at the full-scale 64 KiB pitch) so
 * the checks are quick. Each test exits 77 (SKIP) without a device, but
 * gather_params_without_a_device_give_statuses, which checks what must hold on any machine.
 */
#define _DEFAULT_SOURCE
#include "kv-fixture.h"
#include "vtrans-paths.h"

#include <stdlib.h>

static void need_device(void) {
    if (!ferry_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        fflush(stdout);
        exit(77);
    }
}

typedef struct {
    ferry_backend * cuda; /* owned by the bench's fixture until freed here */
    ferry_kv_cache * kv;
    ferry_context * ctx;
    ferry_buffer * dbuf;
    ferry_tensor *window, *same, *compact;
    vt_bench b;
} vt_fix;

static void fix_free(vt_fix * f) {
    vt_bench_free(&f->b);
    ferry_buffer_free(f->dbuf);
    ferry_kv_cache_free(f->kv);
    ferry_context_free(f->ctx);
    ferry_backend_free(f->cuda);
    memset(f, 0, sizeof(*f));
}

/* A unified f16 cache of n_ctx cells, 128 channels, transposed V in pinned memory filled
 * with the pattern; the window of its first n_kv cells; its device copies, same layout
 * and compact, side by side in one device buffer. */
static ferry_status fix_init(vt_fix * f, int64_t n_ctx, int64_t n_kv, int n_aux) {
    memset(f, 0, sizeof(*f));
    const ferry_kv_params p = {.type_k = FERRY_TYPE_F16, .type_v = FERRY_TYPE_F16, .head_dim = 64, .n_head_kv = 2,
                               .n_ctx = n_ctx, .n_stream = 1, .n_layer = 1, .v_trans = true};
    ferry_buffer_type * pinned;
    ferry_status st = ferry_cuda_backend_new(0, &f->cuda);
    if (st == FERRY_OK) st = ferry_cuda_host_buffer_type(&pinned);
    if (st == FERRY_OK) st = ferry_kv_cache_new(&p, pinned, &f->kv);
    if (st == FERRY_OK) kv_fill(f->kv);
    if (st == FERRY_OK) st = ferry_context_new(&f->ctx);
    if (st == FERRY_OK) st = ferry_kv_cache_window(f->kv, f->ctx, 0, n_kv, 0, 0, NULL, &f->window);
    if (st == FERRY_OK) st = ferry_tensor_dup_layout(f->ctx, f->window, &f->same);
    if (st == FERRY_OK) st = ferry_tensor_compact_layout(f->ctx, f->window, &f->compact);
    const size_t span = ferry_tensor_nbytes(f->window), at = (span + 255) / 256 * 256;
    if (st == FERRY_OK) st = ferry_backend_alloc_buffer(f->cuda, at + ferry_tensor_nbytes(f->window), &f->dbuf);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->dbuf, f->same, 0);
    if (st == FERRY_OK) st = ferry_buffer_place_tensor(f->dbuf, f->compact, at);
    if (st == FERRY_OK) st = vt_bench_init(&f->b, f->cuda, f->window, f->same, f->compact);
    if (st == FERRY_OK && n_aux > 0) st = vt_bench_add_aux(&f->b, 0, n_aux);
    if (st != FERRY_OK) {
        fprintf(stderr, "setting: %s\n", ferry_last_error());
    }
    return st;
}

static const vt_way * way_named(const char * name) {
    for (int i = 0; i < VT_N_WAYS; i++) {
        if (strcmp(vt_ways[i].name, name) == 0) {
            return &vt_ways[i];
        }
    }
    return NULL;
}

/* The same-layout copy's whole span, after way w ran from a sentinel. */
static uint8_t * span_after(vt_fix * f, const vt_way * w) {
    const size_t span = ferry_tensor_nbytes(f->window);
    uint8_t * out = malloc(span);
    if (out && (ferry_tensor_memset(f->same, VT_SENTINEL, 0, span) != FERRY_OK || vt_enqueue(&f->b, w) != FERRY_OK ||
                vt_sync(&f->b) != FERRY_OK || ferry_tensor_get(f->same, out, 0, span) != FERRY_OK)) {
        fprintf(stderr, "%s: %s\n", w->name, ferry_last_error());
        free(out);
        out = NULL;
    }
    return out;
}

/* What holds without a device: defaults, and statuses instead of aborts. */
static void test_gather_params_without_a_device_give_statuses(void) {
    const ferry_cuda_gather_params d = ferry_cuda_gather_default_params();
    CHECK(!d.on);
    CHECK_EQ_U(d.loads_per_thread, 4);
    CHECK_EQ_U(d.min_pitch, 65536);
    CHECK_EQ_U(d.min_row, 256);
    ferry_backend * cpu;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK_FAILS(ferry_cuda_backend_set_gather(cpu, &d), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_get_gather(cpu, NULL, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_set_gather(NULL, &d), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_set_gather(cpu, NULL), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_set_fold(cpu, 65536), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_cuda_backend_get_fold(cpu, NULL, NULL), FERRY_ERR_INVALID_ARG);
    ferry_backend_free(cpu);
    CHECK_FAILS(ferry_cuda_host_register(NULL, 64), FERRY_ERR_INVALID_ARG);
    char local[64];
    CHECK_FAILS(ferry_cuda_host_unregister(local), FERRY_ERR_INVALID_ARG); /* never registered */
    if (!ferry_cuda_available()) {
        CHECK_FAILS(ferry_cuda_host_register(local, sizeof(local)), FERRY_ERR_BACKEND);
    }
}

/* The gather kernel's bytes are the default 2-D copy's, byte for byte, gaps included:
 * for every loads-per-thread, n_kv cells of f16 at the full-scale 64 KiB pitch. */
static int gather_vs_2d(int64_t n_kv) {
    vt_fix f;
    if (fix_init(&f, 32768, n_kv, 0) != FERRY_OK) {
        fprintf(stderr, "gather_vs_2d: %s\n", ferry_last_error());
        return VT_ERR_API;
    }
    const vt_way * plain = way_named("copy2d");
    uint8_t * want = span_after(&f, plain);
    int bad = want ? vt_check(&f.b, plain) : VT_ERR_API;
    for (int i = 0; i < VT_N_WAYS && !bad; i++) {
        const vt_way * w = &vt_ways[i];
        if (w->kind != VT_GATHER && w->kind != VT_PLAN_GATHER) {
            continue;
        }
        bad = vt_check(&f.b, w);
        uint8_t * got = bad ? NULL : span_after(&f, w);
        if (!bad && (!got || memcmp(got, want, ferry_tensor_nbytes(f.window)) != 0)) {
            fprintf(stderr, "%s, n_kv %lld: not the 2-D copy's bytes\n", w->name, (long long) n_kv);
            bad = VT_ERR_ROWS;
        }
        free(got);
    }
    free(want);
    fix_free(&f);
    return bad;
}

static void test_gather_matches_2d(void) {
    need_device();
    /* 128 rows of 512 B: 4,096 16-byte elements, whole blocks of the kernel's chunks */
    CHECK_EQ_U(gather_vs_2d(256), VT_OK);
    /* 128 rows of 400 B: 3,200 elements, so every chunk size leaves a partial last chunk */
    CHECK_EQ_U(gather_vs_2d(200), VT_OK);
}

/* Every way cuda-bench times, checked as it checks them (huge pages when there are any). */
static void test_bench_ways_exact(void) {
    need_device();
    vt_fix f;
    CHECK_OK(fix_init(&f, 32768, 256, VT_MAX_AUX));
    vt_huge h;
    const size_t span = ferry_tensor_nbytes(f.window) - f.b.offset;
    if (vt_huge_alloc(&h, f.b.src, span) == 0) {
        f.b.huge = h.base;
    }
    printf("huge pages: %s\n", h.how);
    int bad = VT_OK;
    for (int i = 0; i < VT_N_WAYS && !bad; i++) {
        const vt_way * w = &vt_ways[i];
        const char * why = vt_way_unavailable(&f.b, w);
        if (why) {
            printf("%s: not run: %s\n", w->name, why);
            continue;
        }
        bad = vt_check(&f.b, w);
        printf("%s: %s\n", w->name, vt_check_name(bad));
        if (bad == VT_GATHER_DECLINED && w->kind == VT_HUGE_GATHER) {
            bad = VT_OK; /* registered memory the device maps elsewhere than its host address: rightly declined */
        }
        if (bad == VT_ERR_API) {
            fprintf(stderr, "%s: %s\n", w->name, ferry_last_error());
        }
    }
    vt_huge_free(&h);
    fix_free(&f);
    CHECK_EQ_U(bad, VT_OK);
}

/* Gathered rows, then the number of kernel copies they took (checked against want_gathers). */
static int gather_case(vt_fix * f, const uint8_t * src, size_t min_pitch, uint64_t want_gathers) {
    vt_bench * b = &f->b;
    const size_t span = ferry_tensor_nbytes(f->window);
    ferry_cuda_gather_params p = ferry_cuda_gather_default_params();
    p.on = true;
    p.min_pitch = min_pitch;
    uint64_t g0, g1;
    uint8_t * got = malloc(span);
    int bad = got ? VT_OK : VT_ERR_API;
    if (!bad && (ferry_cuda_backend_set_gather(b->cuda, &p) != FERRY_OK ||
                 ferry_cuda_backend_get_gather(b->cuda, NULL, &g0) != FERRY_OK ||
                 ferry_tensor_memset(b->same, VT_SENTINEL, 0, span) != FERRY_OK ||
                 vt_set_rows(b, b->cuda, src, 0, b->rows) != FERRY_OK || vt_sync(b) != FERRY_OK ||
                 ferry_cuda_backend_get_gather(b->cuda, NULL, &g1) != FERRY_OK ||
                 ferry_tensor_get(b->same, got, 0, span) != FERRY_OK)) {
        fprintf(stderr, "gather case: %s\n", ferry_last_error());
        bad = VT_ERR_API;
    }
    if (!bad && g1 - g0 != want_gathers) {
        fprintf(stderr, "gather case: %llu kernel copies, expected %llu\n", (unsigned long long) (g1 - g0),
                (unsigned long long) want_gathers);
        bad = VT_GATHER_DECLINED;
    }
    size_t next = 0;
    for (size_t r = 0; r < b->rows && !bad; r++) {
        const size_t at = b->offset + r * b->pitch;
        for (size_t i = next; i < at && !bad; i++) {
            bad = got[i] == VT_SENTINEL ? VT_OK : VT_ERR_GAP;
        }
        if (!bad && memcmp(got + at, b->src + r * b->pitch, b->row) != 0) {
            bad = VT_ERR_ROWS;
        }
        next = at + b->row;
    }
    for (size_t i = next; i < span && !bad; i++) {
        bad = got[i] == VT_SENTINEL ? VT_OK : VT_ERR_GAP;
    }
    free(got);
    p.on = false;
    ferry_cuda_backend_set_gather(b->cuda, &p);
    return bad;
}

/* Where the rule says no, the option on changes nothing: the 2-D copy runs, bytes right. */
static void test_gather_rule_declines(void) {
    need_device();
    vt_fix f;
    int bad = VT_OK;
    /* pageable memory with the same bytes: not a pinned range ferry knows */
    CHECK_OK(fix_init(&f, 32768, 256, 0));
    const size_t span = ferry_tensor_nbytes(f.window);
    uint8_t * pageable = malloc(span);
    CHECK(pageable);
    memcpy(pageable, f.b.src, span - f.b.offset);
    bad = gather_case(&f, pageable, 65536, 0);
    if (!bad) bad = gather_case(&f, f.b.src, 65536, 1);   /* the same from pinned memory: taken */
    if (!bad) bad = gather_case(&f, f.b.src, 131072, 0);  /* a min_pitch above the pitch */
    free(pageable);
    fix_free(&f);
    CHECK_EQ_U(bad, VT_OK);
    /* a 16 KiB pitch: declined by default, taken with min_pitch 0 */
    CHECK_OK(fix_init(&f, 8192, 256, 0));
    CHECK_EQ_U(f.b.pitch, 16384);
    bad = gather_case(&f, f.b.src, 65536, 0);
    if (!bad) bad = gather_case(&f, f.b.src, 0, 1);
    fix_free(&f);
    CHECK_EQ_U(bad, VT_OK);
    /* rows of 510 B (not whole 16 B) and of 128 B (under min_row): declined */
    CHECK_OK(fix_init(&f, 32768, 255, 0));
    bad = gather_case(&f, f.b.src, 0, 0);
    fix_free(&f);
    CHECK_EQ_U(bad, VT_OK);
    CHECK_OK(fix_init(&f, 32768, 64, 0));
    bad = gather_case(&f, f.b.src, 0, 0);
    fix_free(&f);
    CHECK_EQ_U(bad, VT_OK);
}

/* Memory the caller owns, registered: gathered from; unregistered: refused a second time. */
static void test_host_register_round_trip(void) {
    need_device();
    vt_fix f;
    CHECK_OK(fix_init(&f, 32768, 256, 0));
    const size_t span = ferry_tensor_nbytes(f.window);
    void * mine = NULL;
    CHECK(posix_memalign(&mine, 4096, span) == 0);
    memcpy(mine, f.b.src, span - f.b.offset);
    int bad = VT_OK;
    ferry_status st = ferry_cuda_host_register(mine, span);
    if (st == FERRY_OK) {
        bad = gather_case(&f, mine, 65536, 1);
        st = ferry_cuda_host_unregister(mine);
    }
    const ferry_status again = ferry_cuda_host_unregister(mine);
    free(mine);
    fix_free(&f);
    CHECK_OK(st);
    CHECK_EQ_U(bad, VT_OK);
    CHECK_EQ_U(again, FERRY_ERR_INVALID_ARG);
}

/* FERRY_CUDA_GATHER=1 turns the option on for backends made afterwards; the default is off. */
static void test_gather_env_turns_the_gather_on_for_new_backends(void) {
    need_device();
    ferry_backend *off, *on, *zero;
    ferry_cuda_gather_params p;
    unsetenv("FERRY_CUDA_GATHER");
    CHECK_OK(ferry_cuda_backend_new(0, &off));
    setenv("FERRY_CUDA_GATHER", "1", 1);
    CHECK_OK(ferry_cuda_backend_new(0, &on));
    setenv("FERRY_CUDA_GATHER", "0", 1);
    CHECK_OK(ferry_cuda_backend_new(0, &zero));
    unsetenv("FERRY_CUDA_GATHER");
    bool flags[3];
    CHECK_OK(ferry_cuda_backend_get_gather(off, &p, NULL));
    flags[0] = p.on;
    CHECK_OK(ferry_cuda_backend_get_gather(on, &p, NULL));
    flags[1] = p.on;
    CHECK_OK(ferry_cuda_backend_get_gather(zero, &p, NULL));
    flags[2] = p.on;
    p.loads_per_thread = 3;
    const ferry_status bad_loads = ferry_cuda_backend_set_gather(on, &p);
    ferry_backend_free(off);
    ferry_backend_free(on);
    ferry_backend_free(zero);
    CHECK(!flags[0] && flags[1] && !flags[2]);
    CHECK_EQ_U(bad_loads, FERRY_ERR_INVALID_ARG);
}

static const check_test tests[] = {
    {"gather_params_without_a_device_give_statuses", test_gather_params_without_a_device_give_statuses},
    {"gather_matches_2d", test_gather_matches_2d},
    {"bench_ways_exact", test_bench_ways_exact},
    {"gather_rule_declines", test_gather_rule_declines},
    {"host_register_round_trip", test_host_register_round_trip},
    {"gather_env_turns_the_gather_on_for_new_backends", test_gather_env_turns_the_gather_on_for_new_backends},
};

CHECK_MAIN(tests)
