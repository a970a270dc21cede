/*
 * A remote tier's stage of the copy path (ferry_tensor_set_fetch): a layer whose local bytes are
 * wrong until fetched gives the local cache's outputs under every policy and prefetch depth, each
 * fetch waited for before its copy; with prefetch, fetches begin a part ahead of the copies they
 * feed; a refused fetch fails the run naming the window, and waits for every fetch begun; a fetched
 * window is not copied ahead for the next run. The transport is a fake: each layer's true bytes in
 * an array of its own, landed in the window's span when waited for.
 */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "step-fixture.h"

#define SENTINEL 0xA5 /* a fetched layer's local bytes before its fetch: 0xA5A5 is a finite f16 */
#define MAX_TICKETS 256

typedef struct {
    ferry_tensor * roots[N_LAYER][2];
    uint8_t * remote[N_LAYER][2]; /* each layer's true K and V */
    const ferry_tensor * windows[MAX_TICKETS];
    int n_tickets;
    char log[4 * MAX_TICKETS];    /* 'B' or 'W' then the layer's digit, per call */
    int n_log;
    int begins, waits;
    int fail_begin, fail_wait;    /* the call (1, 2, ...) that fails; 0: none */
    bool say_why;                 /* a failing call leaves a message of its own */
    bool land;                    /* a wait lands the bytes (false: a transport that loses them) */
} fake;

static int layer_of(const fake * f, const ferry_tensor * window) {
    for (int l = 0; l < N_LAYER; l++) {
        if (window->view_src == f->roots[l][0] || window->view_src == f->roots[l][1]) {
            return l;
        }
    }
    return -1;
}

static ferry_status refuse(const fake * f) {
    ferry_type t;
    if (f->say_why) {
        return ferry_type_from_name("peer 10.0.0.9:7001 is gone", &t); /* leaves a message naming it */
    }
    return FERRY_ERR_BACKEND;
}

static ferry_status fake_begin(void * ctx, const ferry_tensor * window, ferry_copy_policy policy, uint64_t * ticket) {
    fake * f = ctx;
    (void) policy;
    f->log[f->n_log++] = 'B';
    f->log[f->n_log++] = (char) ('0' + layer_of(f, window));
    if (++f->begins == f->fail_begin) {
        return refuse(f);
    }
    f->windows[f->n_tickets] = window;
    *ticket = (uint64_t) ++f->n_tickets;
    return FERRY_OK;
}

static ferry_status fake_wait(void * ctx, uint64_t ticket) {
    fake * f = ctx;
    const ferry_tensor * w = f->windows[ticket - 1];
    const int l = layer_of(f, w);
    f->log[f->n_log++] = 'W';
    f->log[f->n_log++] = (char) ('0' + l);
    if (++f->waits == f->fail_wait) {
        return refuse(f);
    }
    const int which = w->view_src == f->roots[l][1];
    if (f->land) { /* the window's span: what every policy's copy reads lies in it */
        memcpy((uint8_t *) w->view_src->data + w->view_offs, f->remote[l][which] + w->view_offs,
               ferry_tensor_nbytes(w));
    }
    return FERRY_OK;
}

static ferry_fetch fetch_of_fake(fake * f) { return (ferry_fetch) {fake_begin, fake_wait, f}; }

/* Keep each layer's true bytes in the fake, and set the fetch on the layers in fetched (a bit each). */
static ferry_status fake_init(fake * f, step * s, const ferry_fetch * fetch, unsigned fetched) {
    memset(f, 0, sizeof(*f));
    f->land = true;
    for (int l = 0; l < N_LAYER; l++) {
        FERRY_TRY_T(ferry_kv_cache_k(s->kv, l, &f->roots[l][0]));
        FERRY_TRY_T(ferry_kv_cache_v(s->kv, l, &f->roots[l][1]));
        for (int w = 0; w < 2; w++) {
            const size_t n = ferry_tensor_nbytes(f->roots[l][w]);
            f->remote[l][w] = malloc(n);
            if (!f->remote[l][w]) {
                return FERRY_ERR_OUT_OF_MEMORY;
            }
            FERRY_TRY_T(ferry_tensor_get(f->roots[l][w], f->remote[l][w], 0, n));
            if (fetched >> l & 1) {
                FERRY_TRY_T(ferry_tensor_set_fetch(f->roots[l][w], fetch));
            }
        }
    }
    return FERRY_OK;
}

/* The fetched layers' local bytes wrong again, and the log cleared. */
static ferry_status fake_spoil(fake * f, unsigned fetched) {
    f->n_log = f->begins = f->waits = f->n_tickets = 0;
    for (int l = 0; l < N_LAYER; l++) {
        for (int w = 0; w < 2 && (fetched >> l & 1); w++) {
            FERRY_TRY_T(ferry_tensor_memset(f->roots[l][w], SENTINEL, 0, ferry_tensor_nbytes(f->roots[l][w])));
        }
    }
    return FERRY_OK;
}

static void fake_free(fake * f) {
    for (int l = 0; l < N_LAYER; l++) {
        free(f->remote[l][0]);
        free(f->remote[l][1]);
    }
}

static ferry_status run_once(step * s, ferry_copy_policy policy, int prefetch, step_outputs * r) {
    ferry_sched * sched;
    FERRY_TRY_T(step_sched_new(s, policy, false, prefetch, false, &sched));
    const ferry_status st = step_run(s, sched, r);
    ferry_sched_free(sched);
    return st;
}

static int count_spans(ferry_sched * sched, ferry_span_kind kind) {
    ferry_sched_span spans[64];
    size_t n = 0;
    if (ferry_sched_trace(sched, spans, 64, &n) != FERRY_OK) {
        return -1;
    }
    int c = 0;
    for (size_t i = 0; i < n; i++) {
        c += spans[i].kind == kind;
    }
    return c;
}

/* Every policy, prefetch 0, 1 and past the last part, every layer or two of them fetched: the
 * local cache's outputs and bytes, a fetch begun and waited for per fetched window; a transport
 * that loses the bytes gives other outputs (what the sentinel is there to show). */
static void fetched_windows_give_the_local_outputs(ferry_backend * standin) {
    step s;
    CHECK_OK(step_init(&s, standin, false));
    static step_outputs local, got;
    fake f;
    const ferry_fetch fetch = fetch_of_fake(&f);
    const unsigned sets[2] = {0xF, 0xA}; /* every layer; layers 1 and 3 */
    for (int set = 0; set < 2; set++) {
        const int n_fetched = set == 0 ? N_LAYER : 2;
        for (int policy = 0; policy < FERRY_COPY_POLICY_COUNT; policy++) {
            CHECK_OK(fake_init(&f, &s, NULL, 0));
            CHECK_OK(run_once(&s, (ferry_copy_policy) policy, 0, &local));
            for (int l = 0; l < N_LAYER; l++) {
                for (int w = 0; w < 2 && (sets[set] >> l & 1); w++) {
                    CHECK_OK(ferry_tensor_set_fetch(f.roots[l][w], &fetch));
                }
            }
            const int depths[3] = {0, 1, 8};
            for (int d = 0; d < 3; d++) {
                CHECK_OK(fake_spoil(&f, sets[set]));
                ferry_sched * sched;
                CHECK_OK(step_sched_new(&s, (ferry_copy_policy) policy, false, depths[d], false, &sched));
                CHECK_OK(step_run(&s, sched, &got));
                if (memcmp(local.out, got.out, sizeof(local.out)) != 0) {
                    fprintf(stderr, "policy %d prefetch %d layers %#x: outputs differ\n", policy, depths[d], sets[set]);
                }
                CHECK(memcmp(local.out, got.out, sizeof(local.out)) == 0);
                CHECK_EQ_U(got.stats.bytes_copied, local.stats.bytes_copied);
                CHECK_EQ_U(got.stats.fetched, 2 * n_fetched);
                CHECK_EQ_U(f.begins, 2 * n_fetched);
                CHECK_EQ_U(f.waits, 2 * n_fetched);
                CHECK(count_spans(sched, FERRY_SPAN_FETCH_WAIT) == 2 * n_fetched);
                CHECK(got.stats.fetch_wait_seconds >= 0.0);
                CHECK_EQ_U(local.stats.fetched, 0);
                ferry_sched_free(sched);
            }
            f.land = false;
            CHECK_OK(fake_spoil(&f, sets[set]));
            CHECK_OK(run_once(&s, (ferry_copy_policy) policy, 1, &got));
            CHECK(memcmp(local.out, got.out, sizeof(local.out)) != 0);
            CHECK_OK(fake_spoil(&f, 0)); /* the true bytes back for the next policy's local run */
            for (int l = 0; l < N_LAYER; l++) {
                for (int w = 0; w < 2; w++) {
                    CHECK_OK(ferry_tensor_set(f.roots[l][w], f.remote[l][w], 0, ferry_tensor_nbytes(f.roots[l][w])));
                    CHECK_OK(ferry_tensor_set_fetch(f.roots[l][w], NULL));
                }
            }
            fake_free(&f);
        }
    }
    step_free(&s);
}

static void test_fetched_windows_give_the_local_outputs(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    SUB(fetched_windows_give_the_local_outputs(standin));
    ferry_backend_free(standin);
}

#ifdef FERRY_HAVE_CUDA_TESTS
/* The same with a CUDA split backend: remote -> host -> device. */
static void test_cuda_fetched_windows_give_the_local_outputs(void) {
    ferry_backend * cuda = cuda_or_skip();
    SUB(fetched_windows_give_the_local_outputs(cuda));
    ferry_backend_free(cuda);
}
#endif

/* Where in the log the first call of kind ('B', 'W') on layer l is; -1 none. */
static int first_call(const fake * f, char kind, int l) {
    for (int i = 0; i < f->n_log; i += 2) {
        if (f->log[i] == kind && f->log[i + 1] == '0' + l) {
            return i / 2;
        }
    }
    return -1;
}

/* Without prefetch a layer's fetch is begun only once the layer before was waited for; with it,
 * the fetch of layer l + 1 is begun before layer l's windows are waited for (one part ahead of
 * the copies queued), and still each window is waited for before its copy (the outputs above). */
static void test_fetches_run_a_part_ahead_of_the_copies_with_prefetch(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    fake f;
    const ferry_fetch fetch = fetch_of_fake(&f);
    CHECK_OK(fake_init(&f, &s, &fetch, 0xF));
    static step_outputs r;
    for (int prefetch = 0; prefetch < 3; prefetch++) {
        CHECK_OK(fake_spoil(&f, 0xF));
        CHECK_OK(run_once(&s, FERRY_COPY_RAGGED, prefetch, &r));
        for (int l = 1; l + 1 < N_LAYER; l++) {
            const int begun_next = first_call(&f, 'B', l + 1), waited = first_call(&f, 'W', l);
            CHECK(begun_next >= 0 && waited >= 0);
            if (prefetch == 0) {
                CHECK(begun_next > waited);
            } else {
                CHECK(begun_next < waited);
            }
            CHECK(first_call(&f, 'B', l) < waited);
        }
    }
    fake_free(&f);
    step_free(&s);
    ferry_backend_free(standin);
}

/* A begin or a wait refused, at each call in turn, with and without a message of the transport's
 * own: the run fails with the transport's status, naming the window and the transport's words;
 * every fetch begun was waited for before it returned; the next run gives the right outputs. */
static void test_refused_fetch_fails_the_run_naming_the_window(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    fake f;
    const ferry_fetch fetch = fetch_of_fake(&f);
    static step_outputs local, got;
    CHECK_OK(run_once(&s, FERRY_COPY_RANGES, 0, &local));
    CHECK_OK(fake_init(&f, &s, &fetch, 0xF));
    for (int prefetch = 0; prefetch < 2; prefetch++) {
        for (int at_wait = 0; at_wait < 2; at_wait++) {
            for (int call = 1; call <= 2 * N_LAYER; call += 3) {
                for (int say = 0; say < 2; say++) {
                    CHECK_OK(fake_spoil(&f, 0xF));
                    f.fail_begin = at_wait ? 0 : call;
                    f.fail_wait = at_wait ? call : 0;
                    f.say_why = say == 1;
                    ferry_clear_error();
                    const ferry_status st = run_once(&s, FERRY_COPY_RANGES, prefetch, &got);
                    CHECK(st == (say ? FERRY_ERR_UNKNOWN_TYPE : FERRY_ERR_BACKEND));
                    const char * msg = ferry_last_error();
                    if (!strstr(msg, "the fetch of '") || !strstr(msg, at_wait ? "waited for" : "begun") ||
                        (say && !strstr(msg, "peer 10.0.0.9:7001 is gone"))) {
                        fprintf(stderr, "unexpected message: %s\n", msg);
                        CHECK(false);
                    }
                    CHECK_EQ_U(f.waits, f.n_tickets); /* each begun: waited for */
                    f.fail_begin = f.fail_wait = 0;
                    CHECK_OK(fake_spoil(&f, 0xF));
                    CHECK_OK(run_once(&s, FERRY_COPY_RANGES, prefetch, &got));
                    CHECK(memcmp(local.out, got.out, sizeof(local.out)) == 0);
                }
            }
        }
    }
    fake_free(&f);
    step_free(&s);
    ferry_backend_free(standin);
}

/* Across runs (prefetch_next), a fetched first layer is not copied ahead: each run fetches and
 * copies it, and gives the right outputs though its local bytes were spoilt between runs. */
static void test_fetched_window_is_not_copied_ahead(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    fake f;
    const ferry_fetch fetch = fetch_of_fake(&f);
    static step_outputs local, got;
    CHECK_OK(run_once(&s, FERRY_COPY_RAGGED, 0, &local));
    CHECK_OK(fake_init(&f, &s, &fetch, 0x1));
    ferry_sched * sched;
    CHECK_OK(step_sched_new(&s, FERRY_COPY_RAGGED, false, 1, true, &sched));
    for (int i = 0; i < 3; i++) {
        CHECK_OK(fake_spoil(&f, 0x1));
        CHECK_OK(step_run(&s, sched, &got));
        CHECK(memcmp(local.out, got.out, sizeof(local.out)) == 0);
        CHECK_EQ_U(got.stats.kept_ahead, 0);
        CHECK_EQ_U(got.stats.fetched, 2);
    }
    ferry_sched_free(sched);
    fake_free(&f);
    step_free(&s);
    ferry_backend_free(standin);
}

/* set_fetch refuses a view, a fetch lacking a function, a tensor not in host memory, naming it. */
static void test_set_fetch_refusals(void) {
    ferry_backend * standin;
    CHECK_OK(ferry_standin_backend_new(&standin));
    step s;
    CHECK_OK(step_init(&s, standin, false));
    fake f;
    const ferry_fetch fetch = fetch_of_fake(&f), no_wait = {fake_begin, NULL, &f}, no_begin = {NULL, fake_wait, &f};
    CHECK_OK(fake_init(&f, &s, NULL, 0));
    CHECK_FAILS(ferry_tensor_set_fetch(NULL, &fetch), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_tensor_set_fetch(s.win[0][0], &fetch), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "owns the memory") != NULL);
    CHECK_FAILS(ferry_tensor_set_fetch(f.roots[0][0], &no_wait), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "no wait function") != NULL);
    CHECK_FAILS(ferry_tensor_set_fetch(f.roots[0][0], &no_begin), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "no begin function") != NULL);
    ferry_tensor * loose;
    const int64_t ne[1] = {16};
    CHECK_OK(ferry_tensor_new(s.ctx, FERRY_TYPE_F32, 1, ne, &loose));
    CHECK_FAILS(ferry_tensor_set_fetch(loose, &fetch), FERRY_ERR_INVALID_ARG); /* no memory */
    CHECK(strstr(ferry_last_error(), "not in host memory") != NULL);
    ferry_tensor * on_device;
    ferry_buffer * dbuf;
    CHECK_OK(ferry_tensor_new(s.ctx, FERRY_TYPE_F32, 1, ne, &on_device));
    CHECK_OK(ferry_backend_alloc_buffer(standin, 256, &dbuf));
    CHECK_OK(ferry_buffer_place_tensor(dbuf, on_device, 0));
    CHECK_FAILS(ferry_tensor_set_fetch(on_device, &fetch), FERRY_ERR_INVALID_ARG);
    CHECK(f.roots[0][0]->fetch == NULL); /* nothing set by a refusal */
    CHECK_OK(ferry_tensor_set_fetch(f.roots[0][0], &fetch));
    CHECK(f.roots[0][0]->fetch == &fetch);
    CHECK_OK(ferry_tensor_set_fetch(f.roots[0][0], NULL));
    CHECK(f.roots[0][0]->fetch == NULL);
    ferry_buffer_free(dbuf);
    fake_free(&f);
    step_free(&s);
    ferry_backend_free(standin);
}

static const check_test tests[] = {
    {"fetched_windows_give_the_local_outputs", test_fetched_windows_give_the_local_outputs},
    {"fetches_run_a_part_ahead_of_the_copies_with_prefetch", test_fetches_run_a_part_ahead_of_the_copies_with_prefetch},
    {"refused_fetch_fails_the_run_naming_the_window", test_refused_fetch_fails_the_run_naming_the_window},
    {"fetched_window_is_not_copied_ahead", test_fetched_window_is_not_copied_ahead},
    {"set_fetch_refusals", test_set_fetch_refusals},
#ifdef FERRY_HAVE_CUDA_TESTS
    {"cuda_fetched_windows_give_the_local_outputs", test_cuda_fetched_windows_give_the_local_outputs},
#endif
};

CHECK_MAIN(tests)
