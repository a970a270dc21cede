/*
 * The ways to copy a transposed V window from pinned host memory to a CUDA device,
 * shared by cuda-bench (tools/cuda_window_bench.c, which times them at full scale)
 * and test_cuda_vtrans (which checks them small), so what is timed is what is checked.
 *
 * The window is one 2-D copy: `rows` rows of `row` bytes, `pitch` apart. Each way is
 * queued on the CUDA backend's stream (the multi-stream ways fork helper backends off
 * it with events and join them back), so a caller brackets it with timing events on
 * that backend; the plan ways go through ferry_copy_input, which waits for the backend
 * before and after, as the scheduler does. vt_check runs one way and compares every
 * byte of its destination with what that way promises.
 *
 * Include after defining _DEFAULT_SOURCE (the mmap flags of the huge-page source).
 */
#ifndef FERRY_VTRANS_PATHS_H
#define FERRY_VTRANS_PATHS_H

#include "ferry.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define VT_SENTINEL 0xA5
#define VT_MAX_AUX 3
#define VT_HUGE_PAGE ((size_t) 2 << 20)

typedef enum {
    VT_FLAT,           /* one set of the nbytes() span, gaps included */
    VT_PLAN,           /* ferry_copy_input, plan policy, same-layout copy: one 2-D copy */
    VT_2D,             /* that 2-D copy, queued directly */
    VT_CONTIG,         /* one set of the bytes read, gapless: the floor */
    VT_GATHER,         /* the 2-D set with the backend's gather option on */
    VT_PLAN_GATHER,    /* ferry_copy_input with the gather option on */
    VT_SPLIT,          /* the 2-D copy in row chunks over several streams */
    VT_HUGE_2D,        /* the 2-D copy from registered memory on 2 MiB pages */
    VT_HUGE_GATHER,    /* the gather kernel from it */
    VT_COMPACT_2D,     /* a 2-D copy into the compact layout (destination pitch = row) */
    VT_COMPACT_GATHER, /* the gather kernel into the compact layout */
    VT_PLAN_COMPACT,   /* ferry_copy_input into the compact layout (the library's staging) */
    VT_HYBRID,         /* copy engine and gather kernel at once, on two streams */
    VT_FOLD3D,         /* the 2-D copy with the backend's fold option: one 3-D copy at half the pitch */
} vt_kind;

typedef struct {
    const char * name;  /* the JSON and table label: stable */
    const char * group; /* the report's groups: a flat, b plan, c contiguous, d1..d6 candidates */
    vt_kind kind;
    int param;          /* gather: loads per thread (0: default); split: streams; hybrid: % of rows gathered */
} vt_way;

static const vt_way vt_ways[] = {
    {"flat", "a", VT_FLAT, 0},
    {"plan", "b", VT_PLAN, 0},
    {"copy2d", "b", VT_2D, 0},
    {"contiguous", "c", VT_CONTIG, 0},
    {"gather_l1", "d1", VT_GATHER, 1},
    {"gather_l2", "d1", VT_GATHER, 2},
    {"gather_l4", "d1", VT_GATHER, 4},
    {"gather_l8", "d1", VT_GATHER, 8},
    {"gather_l16", "d1", VT_GATHER, 16},
    {"plan_gather", "d1", VT_PLAN_GATHER, 0},
    {"split2", "d2", VT_SPLIT, 2},
    {"split3", "d2", VT_SPLIT, 3},
    {"split4", "d2", VT_SPLIT, 4},
    {"huge_2d", "d3", VT_HUGE_2D, 0},
    {"huge_gather", "d3", VT_HUGE_GATHER, 0},
    {"compact_2d", "d4", VT_COMPACT_2D, 0},
    {"compact_gather", "d4", VT_COMPACT_GATHER, 0},
    {"plan_compact", "d4", VT_PLAN_COMPACT, 0},
    {"hybrid25", "d5", VT_HYBRID, 25},
    {"hybrid50", "d5", VT_HYBRID, 50},
    {"hybrid75", "d5", VT_HYBRID, 75},
    {"fold3d", "d6", VT_FOLD3D, 0},
};
#define VT_N_WAYS ((int) (sizeof(vt_ways) / sizeof(vt_ways[0])))

/* Host memory on 2 MiB pages, registered with CUDA; base is NULL when there is none. */
typedef struct {
    void * map;
    size_t map_len;
    uint8_t * base;
    size_t len;
    char how[160]; /* how the pages were had, or why there are none */
} vt_huge;

typedef struct {
    ferry_backend * cuda;            /* every way's first stream; its events time them */
    ferry_backend * aux[VT_MAX_AUX]; /* helper backends: more streams (NULL: not made) */
    ferry_event * fork;              /* on cuda */
    ferry_event * join[VT_MAX_AUX];  /* on aux[i] */
    ferry_tensor * window;           /* the V window, in pinned memory */
    ferry_tensor * same;             /* its device copy, same layout */
    ferry_tensor * compact;          /* its device copy, compact layout (NULL: no compact ways) */
    const uint8_t * src;             /* the first byte read (host) */
    const uint8_t * huge;            /* the same rows at the same pitch in huge-page memory (NULL: none) */
    size_t offset, row, pitch, rows; /* the window's one 2-D copy; offset within the window's data */
    size_t min_pitch;                /* the gather rule's min_pitch for the gather ways */
    ferry_copy_stats stats;          /* of the last plan way */
} vt_bench;

/* The window's copy: it must be one 2-D copy (the transposed V window is). */
static inline ferry_status vt_bench_init(vt_bench * b, ferry_backend * cuda, ferry_tensor * window, ferry_tensor * same,
                                         ferry_tensor * compact) {
    memset(b, 0, sizeof(*b));
    ferry_copy_2d c;
    size_t n = 0;
    ferry_status st = ferry_copy_plan(window, &c, 1, &n);
    if (st != FERRY_OK) {
        return st;
    }
    if (n != 1 || c.count < 2) {
        fprintf(stderr, "vtrans: the window's plan is %zu copies of %zu rows, not one 2-D copy\n", n, c.count);
        return FERRY_ERR_LAYOUT;
    }
    b->cuda = cuda;
    b->window = window;
    b->same = same;
    b->compact = compact;
    b->offset = c.offset;
    b->row = c.size;
    b->pitch = c.stride;
    b->rows = c.count;
    b->src = (const uint8_t *) window->data + c.offset;
    b->min_pitch = ferry_cuda_gather_default_params().min_pitch;
    return ferry_event_new(cuda, 0, &b->fork);
}

/* n helper backends on cuda's device, each with its join event. */
static inline ferry_status vt_bench_add_aux(vt_bench * b, int device, int n) {
    for (int i = 0; i < n && i < VT_MAX_AUX; i++) {
        if (!b->aux[i]) {
            ferry_status st = ferry_cuda_backend_new(device, &b->aux[i]);
            if (st == FERRY_OK) {
                st = ferry_event_new(b->aux[i], 0, &b->join[i]);
            }
            if (st != FERRY_OK) {
                return st;
            }
        }
    }
    return FERRY_OK;
}

static inline void vt_bench_free(vt_bench * b) {
    for (int i = 0; i < VT_MAX_AUX; i++) {
        ferry_event_free(b->join[i]);
        ferry_backend_free(b->aux[i]);
    }
    ferry_event_free(b->fork);
    memset(b, 0, sizeof(*b));
}

static inline ferry_status vt_set_gather(const vt_bench * b, ferry_backend * be, bool on, int loads) {
    ferry_cuda_gather_params p = ferry_cuda_gather_default_params();
    p.on = on;
    p.loads_per_thread = loads ? loads : p.loads_per_thread;
    p.min_pitch = b->min_pitch;
    return ferry_cuda_backend_set_gather(be, &p);
}

/* Rows r0..r1-1 of src into the same-layout copy, on backend be. */
static inline ferry_status vt_set_rows(const vt_bench * b, ferry_backend * be, const uint8_t * src, size_t r0, size_t r1) {
    return ferry_backend_tensor_set_2d_async(be, b->same, src + r0 * b->pitch, b->offset + r0 * b->pitch, b->row,
                                             r1 - r0, b->pitch, b->pitch);
}

/* Why way w cannot run on b (NULL: it can). */
static inline const char * vt_way_unavailable(const vt_bench * b, const vt_way * w) {
    switch (w->kind) {
    case VT_HUGE_2D:
    case VT_HUGE_GATHER:
        return b->huge ? NULL : "no huge-page memory";
    case VT_COMPACT_2D:
    case VT_COMPACT_GATHER:
    case VT_PLAN_COMPACT:
        return b->compact ? NULL : "no compact copy";
    case VT_SPLIT:
        return w->param - 1 <= VT_MAX_AUX && b->aux[w->param - 2] ? NULL : "not enough helper streams";
    case VT_HYBRID:
        return b->aux[0] ? NULL : "no helper stream";
    default:
        return NULL;
    }
}

/* How many 2-D sets way w hands to the gather kernel (what vt_check expects). */
static inline uint64_t vt_way_gathers(const vt_bench * b, const vt_way * w) {
    switch (w->kind) {
    case VT_GATHER:
    case VT_PLAN_GATHER:
    case VT_HUGE_GATHER:
    case VT_COMPACT_GATHER:
        return 1;
    case VT_HYBRID: /* one gathered row is a plain set, not a 2-D one */
        return b->rows * (size_t) w->param / 100 >= 2 ? 1 : 0;
    default:
        return 0;
    }
}

/* Queue way w (see vt_kind). The gather option is set for each way and left off. */
static inline ferry_status vt_enqueue(vt_bench * b, const vt_way * w) {
    ferry_backend * cuda = b->cuda;
    ferry_status st = vt_set_gather(b, cuda, false, 0);
    const size_t bytes = b->row * b->rows;
    switch (w->kind) {
    case VT_FLAT:
        return st ? st : ferry_backend_tensor_set_async(cuda, b->same, b->window->data, 0,
                                                        ferry_tensor_nbytes(b->window));
    case VT_PLAN:
        return st ? st : ferry_copy_input(cuda, FERRY_COPY_PLAN, b->window, b->same, &b->stats);
    case VT_PLAN_COMPACT:
        return st ? st : ferry_copy_input(cuda, FERRY_COPY_PLAN, b->window, b->compact, &b->stats);
    case VT_2D:
        return st ? st : vt_set_rows(b, cuda, b->src, 0, b->rows);
    case VT_HUGE_2D:
        return st ? st : vt_set_rows(b, cuda, b->huge, 0, b->rows);
    case VT_CONTIG:
        return st ? st : ferry_backend_tensor_set_async(cuda, b->same, b->src, b->offset, bytes);
    case VT_COMPACT_2D:
        return st ? st : ferry_backend_tensor_set_2d_async(cuda, b->compact, b->src, 0, b->row, b->rows, b->row, b->pitch);
    case VT_GATHER:
    case VT_HUGE_GATHER:
    case VT_PLAN_GATHER:
    case VT_COMPACT_GATHER:
        if (st == FERRY_OK) st = vt_set_gather(b, cuda, true, w->param);
        if (st == FERRY_OK) {
            if (w->kind == VT_PLAN_GATHER) {
                st = ferry_copy_input(cuda, FERRY_COPY_PLAN, b->window, b->same, &b->stats);
            } else if (w->kind == VT_COMPACT_GATHER) {
                st = ferry_backend_tensor_set_2d_async(cuda, b->compact, b->src, 0, b->row, b->rows, b->row, b->pitch);
            } else {
                st = vt_set_rows(b, cuda, w->kind == VT_HUGE_GATHER ? b->huge : b->src, 0, b->rows);
            }
        }
        return st ? st : vt_set_gather(b, cuda, false, 0);
    case VT_FOLD3D: /* pitches of 64 KiB and more fold to 32 KiB */
        if (st == FERRY_OK) st = ferry_cuda_backend_set_fold(cuda, (size_t) 64 << 10);
        if (st == FERRY_OK) st = vt_set_rows(b, cuda, b->src, 0, b->rows);
        return st ? st : ferry_cuda_backend_set_fold(cuda, 0);
    case VT_SPLIT:
    case VT_HYBRID: {
        /* Stream 0 is cuda; the others wait for what cuda queued before, and cuda waits for them. */
        const int n = w->kind == VT_SPLIT ? w->param : 2;
        if (st == FERRY_OK) st = ferry_event_record(b->fork, cuda);
        for (int i = 1; i < n && st == FERRY_OK; i++) {
            ferry_backend * aux = b->aux[i - 1];
            size_t r0 = b->rows * (size_t) i / (size_t) n, r1 = b->rows * (size_t) (i + 1) / (size_t) n;
            const bool gather = w->kind == VT_HYBRID;
            if (gather) {
                r0 = b->rows - b->rows * (size_t) w->param / 100;
                r1 = b->rows;
            }
            st = vt_set_gather(b, aux, gather, 0);
            if (st == FERRY_OK) st = ferry_event_wait(aux, b->fork);
            if (st == FERRY_OK && r1 > r0) st = vt_set_rows(b, aux, b->src, r0, r1);
            if (st == FERRY_OK) st = vt_set_gather(b, aux, false, 0);
            if (st == FERRY_OK) st = ferry_event_record(b->join[i - 1], aux);
        }
        const size_t r1 = w->kind == VT_HYBRID ? b->rows - b->rows * (size_t) w->param / 100 : b->rows / (size_t) n;
        if (st == FERRY_OK && r1 > 0) st = vt_set_rows(b, cuda, b->src, 0, r1);
        for (int i = 1; i < n && st == FERRY_OK; i++) {
            st = ferry_event_wait(cuda, b->join[i - 1]);
        }
        return st;
    }
    }
    return FERRY_ERR_INVALID_ARG;
}

static inline uint64_t vt_gather_count(const vt_bench * b) {
    uint64_t total = 0, n = 0;
    if (ferry_cuda_backend_get_gather(b->cuda, NULL, &n) == FERRY_OK) {
        total += n;
    }
    for (int i = 0; i < VT_MAX_AUX; i++) {
        if (b->aux[i] && ferry_cuda_backend_get_gather(b->aux[i], NULL, &n) == FERRY_OK) {
            total += n;
        }
    }
    return total;
}

static inline ferry_status vt_sync(const vt_bench * b) {
    ferry_status st = ferry_backend_synchronize(b->cuda);
    for (int i = 0; i < VT_MAX_AUX && st == FERRY_OK; i++) {
        if (b->aux[i]) {
            st = ferry_backend_synchronize(b->aux[i]);
        }
    }
    return st;
}

/* Results of vt_check. */
enum {
    VT_OK = 0,
    VT_ERR_API = 1,        /* a call failed: the message is in ferry_last_error() */
    VT_ERR_ROWS = 2,       /* a row did not arrive whole from its own source offset */
    VT_ERR_GAP = 3,        /* a byte the way must not write lost its sentinel */
    VT_ERR_STATS = 4,      /* the copy path's stats are not one call of the bytes read */
    VT_GATHER_DECLINED = 5, /* the gather (or fold) rule did not take its way, or took another */
};

static inline const char * vt_check_name(int code) {
    static const char * const names[] = {"ok", "a call failed", "rows did not arrive whole",
                                         "bytes outside the rows were written", "copy stats wrong",
                                         "the gather kernel ran where it should not, or not where it should"};
    return code >= 0 && code <= VT_GATHER_DECLINED ? names[code] : "?";
}

/*
 * Run way w once and compare every byte of its destination with what it promises:
 * same-layout ways, each row whole at its own offset and every other byte of the span
 * still the sentinel; flat, the whole span; contiguous, the bytes read packed at the
 * first row's offset and nothing else; compact ways, the rows packed. Plan ways must
 * report one call of the bytes read, and the gather kernel must run exactly where the
 * way uses it.
 */
static inline int vt_check(vt_bench * b, const vt_way * w) {
    const size_t span = ferry_tensor_nbytes(b->window), bytes = b->row * b->rows;
    const bool compact = w->kind == VT_COMPACT_2D || w->kind == VT_COMPACT_GATHER || w->kind == VT_PLAN_COMPACT;
    if (ferry_tensor_memset(b->same, VT_SENTINEL, 0, span) != FERRY_OK ||
        (b->compact && ferry_tensor_memset(b->compact, VT_SENTINEL, 0, bytes) != FERRY_OK)) {
        return VT_ERR_API;
    }
    const uint64_t g0 = vt_gather_count(b);
    uint64_t f0 = 0, f1 = 0;
    ferry_cuda_backend_get_fold(b->cuda, NULL, &f0);
    if (vt_enqueue(b, w) != FERRY_OK || vt_sync(b) != FERRY_OK) {
        return VT_ERR_API;
    }
    if (vt_gather_count(b) - g0 != vt_way_gathers(b, w)) {
        return VT_GATHER_DECLINED;
    }
    ferry_cuda_backend_get_fold(b->cuda, NULL, &f1);
    if (f1 - f0 != (w->kind == VT_FOLD3D ? 1u : 0u)) {
        return VT_GATHER_DECLINED; /* the fold rule did not take fold3d, or took another way */
    }
    if (w->kind == VT_PLAN || w->kind == VT_PLAN_GATHER || w->kind == VT_PLAN_COMPACT) {
        const ferry_copy_stats * s = &b->stats;
        if (s->path != FERRY_COPY_PLAN || s->copy_calls != 1 || s->impl_calls != 1 || s->bytes_copied != bytes ||
            s->bytes_read != bytes) {
            return VT_ERR_STATS;
        }
    }
    const size_t n = compact ? bytes : span;
    uint8_t * got = malloc(n ? n : 1);
    if (!got) {
        return VT_ERR_API;
    }
    int result = VT_OK;
    if (ferry_tensor_get(compact ? b->compact : b->same, got, 0, n) != FERRY_OK) {
        result = VT_ERR_API;
    } else if (compact) {
        for (size_t r = 0; r < b->rows && result == VT_OK; r++) {
            if (memcmp(got + r * b->row, b->src + r * b->pitch, b->row) != 0) {
                result = VT_ERR_ROWS;
            }
        }
    } else if (w->kind == VT_FLAT) {
        result = memcmp(got, b->window->data, span) == 0 ? VT_OK : VT_ERR_ROWS;
    } else if (w->kind == VT_CONTIG) {
        result = memcmp(got + b->offset, b->src, bytes) == 0 ? VT_OK : VT_ERR_ROWS;
        for (size_t i = 0; i < span && result == VT_OK; i++) {
            if ((i < b->offset || i >= b->offset + bytes) && got[i] != VT_SENTINEL) {
                result = VT_ERR_GAP;
            }
        }
    } else {
        size_t next = 0; /* the first byte not yet checked */
        for (size_t r = 0; r < b->rows && result == VT_OK; r++) {
            const size_t at = b->offset + r * b->pitch;
            for (size_t i = next; i < at && result == VT_OK; i++) {
                result = got[i] == VT_SENTINEL ? VT_OK : VT_ERR_GAP;
            }
            if (result == VT_OK && memcmp(got + at, b->src + r * b->pitch, b->row) != 0) {
                result = VT_ERR_ROWS;
            }
            next = at + b->row;
        }
        for (size_t i = next; i < span && result == VT_OK; i++) {
            result = got[i] == VT_SENTINEL ? VT_OK : VT_ERR_GAP;
        }
    }
    free(got);
    return result;
}

/* Total kB of AnonHugePages in the mappings inside [lo, hi), from /proc/self/smaps. */
static inline long vt_anon_huge_kb(uintptr_t lo, uintptr_t hi) {
    FILE * f = fopen("/proc/self/smaps", "r");
    if (!f) {
        return -1;
    }
    char line[512];
    bool inside = false;
    long kb = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned long a, z, v;
        if (sscanf(line, "%lx-%lx ", &a, &z) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && z <= hi;
        } else if (inside && sscanf(line, "AnonHugePages: %lu kB", &v) == 1) {
            kb += (long) v;
        }
    }
    fclose(f);
    return kb;
}

/*
 * len bytes of host memory on 2 MiB pages, filled from src and registered with CUDA:
 * hugetlbfs pages (MAP_HUGETLB) when the system has them reserved, else transparent
 * huge pages asked for with madvise. 0 when some huge pages were had (h->how says how
 * many); else -1, nothing held, and h->how says why.
 */
static inline int vt_huge_alloc(vt_huge * h, const void * src, size_t len) {
    memset(h, 0, sizeof(*h));
    const size_t len2 = (len + VT_HUGE_PAGE - 1) / VT_HUGE_PAGE * VT_HUGE_PAGE;
    void * p = MAP_FAILED;
    bool transparent = false;
#ifdef MAP_HUGETLB
    p = mmap(NULL, len2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
        h->map = p;
        h->map_len = len2;
        h->base = p;
        snprintf(h->how, sizeof(h->how), "MAP_HUGETLB: %zu KiB on hugetlbfs pages", len2 >> 10);
    }
#endif
    if (p == MAP_FAILED) {
#ifdef MADV_HUGEPAGE
        p = mmap(NULL, len2 + VT_HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            snprintf(h->how, sizeof(h->how), "mmap of %zu bytes failed", len2 + VT_HUGE_PAGE);
            return -1;
        }
        h->map = p;
        h->map_len = len2 + VT_HUGE_PAGE;
        h->base = (uint8_t *) (((uintptr_t) p + VT_HUGE_PAGE - 1) / VT_HUGE_PAGE * VT_HUGE_PAGE);
        transparent = true;
        /* Asked before the first touch, so the faults themselves hand out huge pages. */
        if (madvise(h->base, len2, MADV_HUGEPAGE) != 0) {
            snprintf(h->how, sizeof(h->how), "no hugetlbfs pages reserved, and madvise(MADV_HUGEPAGE) failed");
            munmap(h->map, h->map_len);
            memset(h, 0, sizeof(*h));
            return -1;
        }
#else
        snprintf(h->how, sizeof(h->how), "no huge pages on this system");
        return -1;
#endif
    }
    h->len = len2;
    memcpy(h->base, src, len);
    memset(h->base + len, 0, len2 - len);
    if (transparent) { /* the kernel may have given some, all or none: count them */
        const long kb = vt_anon_huge_kb((uintptr_t) h->base, (uintptr_t) h->base + len2);
        if (kb <= 0) {
            FILE * f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
            char thp[64] = "unknown";
            if (f) {
                if (!fgets(thp, sizeof(thp), f)) {
                    strcpy(thp, "unreadable");
                }
                thp[strcspn(thp, "\n")] = '\0';
                fclose(f);
            }
            snprintf(h->how, sizeof(h->how), "no hugetlbfs pages reserved and no transparent huge pages given (THP: %s)",
                     thp);
            munmap(h->map, h->map_len);
            memset(h, 0, sizeof(*h));
            return -1;
        }
        snprintf(h->how, sizeof(h->how), "madvise(MADV_HUGEPAGE): %ld of %zu KiB on huge pages", kb, len2 >> 10);
    }
    if (ferry_cuda_host_register(h->base, len2) != FERRY_OK) {
        snprintf(h->how, sizeof(h->how), "cudaHostRegister failed: %.120s", ferry_last_error());
        munmap(h->map, h->map_len);
        memset(h, 0, sizeof(*h));
        return -1;
    }
    return 0;
}

static inline void vt_huge_free(vt_huge * h) {
    if (h->base) {
        ferry_cuda_host_unregister(h->base);
        munmap(h->map, h->map_len);
    }
    memset(h, 0, sizeof(*h));
}

#endif
