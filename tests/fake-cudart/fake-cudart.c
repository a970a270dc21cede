/*
 * A fake CUDA runtime for machines without a GPU: the runtime functions libferry calls,
 * over host memory, so CI runs the CUDA backend's host code (buffer types, 2-D and 3-D
 * copies, events, streams, pinned memory, errors as statuses) on every change.
 *
 * It is strict where a real device is forgiving or slow to tell:
 * - Queued work runs late: a stream's copies and memsets run only when something waits
 *   for them (a stream, event or device synchronize, a wait on an event, a blocking
 *   call), never at the call that queues them. Code that reads a result, or reuses a
 *   source, before it synchronized sees the stale bytes every time, not once in a while.
 *   Copies from pageable host memory take their bytes at the call and copies into it
 *   finish before the call returns, as CUDA documents for pageable memory.
 * - Device memory is mapped with no access for the host: a host read or write of it
 *   outside the runtime's own copies is a segfault, not a silent success.
 * - Every device range a copy or memset touches must lie inside one allocation.
 * - ferry's kernels run as host code that follows the device code index for index from
 *   the launch's grid and block (gather_rows_kernel; gather_pieces_kernel; dup_kernel, with ferry's own f16
 *   conversions; attn_decode_kernel, its warps, lanes and butterfly sums in the device's
 *   order, with the host's expf, so its floats agree to rounding, not to the bit; attn_paged_kernel
 *   the same through its table;
 *   hold_kernel, a sleep of its cycles at FAKE_CLOCK_KHZ); their launches queue like copies. A read of memory the
 *   device cannot map is an illegal address, a load at an address its word does not
 *   divide a misaligned one, both sticky as on a device. Any other launch fails with
 *   cudaErrorNoKernelImageForDevice, which ferry reports as a status.
 * - Any call can be made to fail (fake_cudart_inject, for tests/c/test_cuda_faults.c): the
 *   nth call of the API from now returns the error a device would give, and a sticky one
 *   (a launch failure, an illegal address) fails every later call, as a lost context does.
 * Timings from its events are wall-clock times of the late execution: meaningless.
 *
 * - The driver: FERRY_FAKE_CUDA_DRIVER_VERSION=V (default the runtime's) is what
 *   cudaDriverGetVersion answers, an older driver than the runtime for a test.
 * - Devices: FERRY_FAKE_CUDA_DEVICES=N (1 to 8, default 1) presents N devices, each with its
 *   own memory, streams and events. The current device is per thread (cudaSetDevice). A
 *   kernel that touches another device's memory faults (an illegal address); a plain copy
 *   that does fails with cudaErrorInvalidValue: between devices only cudaMemcpyPeerAsync
 *   copies. An event records only on a stream of its own device; any stream waits on it.
 *
 * C11, only the CUDA headers' types; a recursive lock makes it thread-safe.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <math.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define FAKE_MAX_ALLOC ((size_t) 1 << 40) /* more than any test asks for, less than a 4 PiB one */
/* The device's memory (cudaMemGetInfo): device allocations take from it, as asked */
#define FAKE_DEVICE_MEMORY FAKE_MAX_ALLOC
#define FAKE_MAX_PITCH 2147483647
/* The SM's peak clock (cudaDevAttrClockRate), in kHz: hold_kernel's cycles are 2 a nanosecond,
 * so a hold that passed nanoseconds for cycles would wait half the time asked. */
#define FAKE_CLOCK_KHZ 2000000

/* ---------------------------------------------------------------- state */

static pthread_mutex_t lock_ = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static _Thread_local cudaError_t last_error;
static cudaError_t sticky_error; /* a kernel's fault: every synchronize reports it from then on */

static cudaError_t fail(cudaError_t err) {
    last_error = err;
    return err;
}

#define FAKE_MAX_DEVICES 8

static _Thread_local int current_device;

/* How many devices it presents: FERRY_FAKE_CUDA_DEVICES, 1 when unset or out of range. Read at
 * every call, so that a test in a process of one-device tests can set it for its own run. */
static int n_devices(void) {
    const char * env = getenv("FERRY_FAKE_CUDA_DEVICES");
    const long v = env ? strtol(env, NULL, 10) : 1;
    return v >= 1 && v <= FAKE_MAX_DEVICES ? (int) v : 1;
}

/* ---------------------------------------------------------------- failure injection */

#define FAKE_EXPORT __attribute__((visibility("default"))) /* a test reaches it through libferry */

static long inject_at;           /* the call that fails, counted from the arm; 0: none */
static long inject_calls;        /* calls since the arm */
static cudaError_t inject_err;
static cudaError_t lost_context; /* an injected sticky error: every later call returns it */

static bool is_sticky(cudaError_t err) {
    return err == cudaErrorLaunchFailure || err == cudaErrorIllegalAddress || err == cudaErrorMisalignedAddress;
}

/* The nth counted call from now fails with err (n <= 0: none). Arming starts a fresh
 * context: a sticky error of the last run is gone, as in a new process. */
FAKE_EXPORT void fake_cudart_inject(long n, cudaError_t err) {
    pthread_mutex_lock(&lock_);
    inject_at = n > 0 ? n : 0;
    inject_calls = 0;
    inject_err = err;
    lost_context = cudaSuccess;
    sticky_error = cudaSuccess;
    pthread_mutex_unlock(&lock_);
}

/* Calls counted since the last arm. */
FAKE_EXPORT long fake_cudart_calls(void) {
    pthread_mutex_lock(&lock_);
    const long n = inject_calls;
    pthread_mutex_unlock(&lock_);
    return n;
}

static cudaError_t injected(void) {
    pthread_mutex_lock(&lock_);
    cudaError_t err = lost_context;
    if (err == cudaSuccess && ++inject_calls == inject_at) {
        err = inject_err;
        if (is_sticky(err)) {
            lost_context = err;
            sticky_error = err; /* synchronizes report it too */
        }
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

/* At the top of every call that can fail on a device (not the frees, not the queries). */
#define INJECT()                                       \
    do {                                               \
        const cudaError_t inject_err_ = injected();    \
        if (inject_err_ != cudaSuccess) {              \
            return fail(inject_err_);                  \
        }                                              \
    } while (0)

enum mem_kind { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED };

typedef struct {
    char * base;
    size_t size;    /* what was asked */
    size_t mapped;  /* device memory: the pages mapped */
    enum mem_kind kind;
    int device; /* device memory: whose */
} allocation;

static allocation * allocs;
static size_t n_allocs, cap_allocs;

typedef struct fake_event fake_event;
typedef struct fake_stream fake_stream;

enum op_kind { OP_COPY, OP_MEMSET, OP_EVENT, OP_WAIT, OP_GATHER, OP_PIECES, OP_HOLD, OP_DUP, OP_ATTN, OP_FAULT,
               OP_ATTN_PAGED };

/* dup_kernel's view of a tensor (lib/src/cuda/ops-cuda.cu: struct tview) */
typedef struct {
    const char * data;
    int64_t ne[4];
    int64_t nb[4];
} tview;

typedef struct {
    enum op_kind kind;
    char * dst;
    const char * src; /* OP_COPY: the source, or the staged copy of a pageable one */
    size_t dpitch, spitch, width, height;
    int value;
    char * staged; /* freed after the op ran */
    fake_event * event;
    uint64_t seq;         /* OP_EVENT: which record of the event */
    fake_stream * waited; /* OP_WAIT: run this stream ... */
    size_t waited_pos;    /* ... up to here */
    /* OP_GATHER: gather_rows_kernel's arguments (pitches and w in 16-byte units) and
     * launch; OP_PIECES: gather_pieces_kernel's descriptors (src) and their count (total), its
     * launch (grid, grid_y, block); OP_HOLD: the nanoseconds */
    uint64_t total, n_chunks, ns;
    unsigned grid, block, loads;
    /* OP_DUP: dup_kernel's arguments */
    tview dsrc, ddst;
    int mode;
    int64_t n0, n, unit, word;
    /* OP_ATTN: attn_decode_kernel<tk, tv>'s arguments */
    tview q, k, v, len;
    int64_t out_nb0, out_nb1, out_nb2, out_nb3, group;
    float scale;
    int v_trans, tk, tv;
    unsigned grid_y, grid_z;
    /* OP_ATTN_PAGED: attn_paged_kernel<tk, tv>'s arguments beyond OP_ATTN's (its table, the block size) */
    tview table;
    int64_t block_size;
} op;

struct fake_stream {
    op * ops;
    size_t n, cap, done; /* ops[done..n) are queued */
    size_t base;         /* ops[0]'s position since the stream began: positions never repeat */
    fake_stream * next; /* every stream, for a device synchronize */
    int device;         /* a created stream's device; -1: a default stream, of the current device */
};

struct fake_event {
    unsigned flags;
    int device;
    fake_stream * stream; /* of the last record; NULL: never recorded */
    size_t pos;           /* that record's position + 1 in its stream */
    uint64_t seq, done_seq;
    double ms; /* when the last record ran */
};

static fake_stream legacy_stream = {.device = -1};
static fake_stream * streams = &legacy_stream;
static _Thread_local fake_stream * per_thread_stream;

/* ---------------------------------------------------------------- memory */

static allocation * find_alloc(const void * p, size_t n, bool device) {
    const char * c = (const char *) p;
    for (size_t i = 0; i < n_allocs; i++) {
        allocation * a = &allocs[i];
        if ((a->kind == MEM_DEVICE) == device && c >= a->base && c < a->base + (a->size ? a->size : 1)) {
            return (size_t) (c - a->base) + n <= a->size ? a : NULL;
        }
    }
    return NULL;
}

static bool is_device(const void * p) {
    const char * c = (const char *) p;
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].kind == MEM_DEVICE && c >= allocs[i].base && c < allocs[i].base + allocs[i].mapped) {
            return true;
        }
    }
    return false;
}

static bool is_pinned(const void * p) {
    const char * c = (const char *) p;
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].kind != MEM_DEVICE && c >= allocs[i].base && c < allocs[i].base + allocs[i].size) {
            return true;
        }
    }
    return false;
}

/* The device whose memory p is, or -1 for memory of no device. */
static int device_of(const void * p) {
    const char * c = (const char *) p;
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].kind == MEM_DEVICE && c >= allocs[i].base && c < allocs[i].base + allocs[i].mapped) {
            return allocs[i].device;
        }
    }
    return -1;
}

/* The device a stream's work runs on. */
static int stream_device(const fake_stream * s) { return s->device >= 0 ? s->device : current_device; }

/* Is p memory of a device other than dev? */
static bool foreign(const void * p, int dev) {
    const int d = device_of(p);
    return d >= 0 && d != dev;
}

static bool add_alloc(char * base, size_t size, size_t mapped, enum mem_kind kind) {
    if (n_allocs == cap_allocs) {
        const size_t cap = cap_allocs ? 2 * cap_allocs : 64;
        allocation * grown = realloc(allocs, cap * sizeof(*allocs));
        if (!grown) {
            return false;
        }
        allocs = grown;
        cap_allocs = cap;
    }
    allocs[n_allocs++] = (allocation) {base, size, mapped, kind, current_device};
    return true;
}

static void remove_alloc(allocation * a) { *a = allocs[--n_allocs]; }

/* Allocations live now (device, pinned, registered): a test sees what an error path leaked. */
/* Device memory not taken by a live device allocation. Called with the lock held. */
static size_t device_free_locked(void) {
    size_t used = 0;
    for (size_t i = 0; i < n_allocs; i++) {
        used += allocs[i].kind == MEM_DEVICE ? allocs[i].size : 0;
    }
    return used < FAKE_DEVICE_MEMORY ? FAKE_DEVICE_MEMORY - used : 0;
}

FAKE_EXPORT long fake_cudart_live_allocations(void) {
    pthread_mutex_lock(&lock_);
    const long n = (long) n_allocs;
    pthread_mutex_unlock(&lock_);
    return n;
}

/* Device pages are open to the host only while an op that touches them runs, and only
 * those pages (mprotect walks every page it is given). */
static void device_access(const void * p, size_t span, bool open) {
    if (span == 0 || !is_device(p)) {
        return;
    }
    const uintptr_t page = 4096, first = (uintptr_t) p / page * page;
    const uintptr_t end = ((uintptr_t) p + span + page - 1) / page * page;
    mprotect((void *) first, end - first, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

/* ---------------------------------------------------------------- streams and their late work */

static fake_stream * stream_of(cudaStream_t s) {
    if (s == NULL || s == cudaStreamLegacy) {
        return &legacy_stream;
    }
    if (s == cudaStreamPerThread) {
        if (!per_thread_stream) {
            per_thread_stream = calloc(1, sizeof(fake_stream));
            if (!per_thread_stream) {
                return NULL;
            }
            per_thread_stream->device = -1;
            per_thread_stream->next = streams;
            streams = per_thread_stream;
        }
        return per_thread_stream;
    }
    return (fake_stream *) s;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void run_to(fake_stream * s, size_t pos);

/* ferry's CPU conversions (types.c, round to nearest even like __float2half_rn) */
float ferry_f16_to_f32(uint16_t h);
uint16_t ferry_f32_to_f16(float f);

/* The bytes a view's n0 units (elements or quantized blocks) along dimension 0 and its
 * other dimensions span from its data. */
static size_t view_span(const tview * v, int64_t n0, int64_t unit) {
    int64_t last = (n0 > 0 ? n0 - 1 : 0) * v->nb[0];
    for (int i = 1; i < 4; i++) {
        last += (v->ne[i] > 0 ? v->ne[i] - 1 : 0) * v->nb[i];
    }
    return (size_t) (last + unit);
}

static bool device_reads(const void * p, size_t span) {
    return find_alloc(p, span, true) || (is_pinned(p) && is_pinned((const char *) p + span - 1));
}

/* dup_kernel (ops-cuda.cu) as the device runs it: thread t of block b takes elements
 * b * block + t, then a grid's worth further on; modes 0 same type (in words of `word`
 * bytes), 1 f32 -> f16, 2 f16 -> f32. */
static void run_dup(const op * o) {
    const int64_t su = o->mode == 2 ? 2 : o->mode == 1 ? 4 : o->unit;
    const size_t sspan = view_span(&o->dsrc, o->n0, su), dspan = view_span(&o->ddst, o->n0, o->unit);
    if (o->n > 0 && (!device_reads(o->dsrc.data, sspan) || !find_alloc(o->ddst.data, dspan, true))) {
        sticky_error = cudaErrorIllegalAddress;
        return;
    }
    const int64_t word = o->mode == 0 ? o->word : o->mode == 1 ? 4 : 2; /* the widest load or store */
    device_access(o->dsrc.data, sspan, true);
    device_access(o->ddst.data, dspan, true);
    const int64_t stride = (int64_t) o->grid * o->block;
    for (int64_t start = 0; start < stride && !sticky_error; start++) {
        for (int64_t idx = start; idx < o->n; idx += stride) {
            const int64_t i0 = idx % o->n0, r = idx / o->n0;
            const int64_t i1 = r % o->ddst.ne[1], i2 = (r / o->ddst.ne[1]) % o->ddst.ne[2];
            const int64_t i3 = r / o->ddst.ne[1] / o->ddst.ne[2];
            const tview *a = &o->dsrc, *d = &o->ddst;
            const char * sp = a->data + i0 * a->nb[0] + i1 * a->nb[1] + i2 * a->nb[2] + i3 * a->nb[3];
            char * dp = (char *) d->data + i0 * d->nb[0] + i1 * d->nb[1] + i2 * d->nb[2] + i3 * d->nb[3];
            if (((uintptr_t) sp | (uintptr_t) dp) % (uintptr_t) (o->mode == 0 ? word : 2) != 0 ||
                (o->mode == 1 && (uintptr_t) sp % 4) || (o->mode == 2 && (uintptr_t) dp % 4)) {
                sticky_error = cudaErrorMisalignedAddress;
                break;
            }
            if (o->mode == 1) {
                float f;
                memcpy(&f, sp, 4);
                const uint16_t h = ferry_f32_to_f16(f);
                memcpy(dp, &h, 2);
            } else if (o->mode == 2) {
                uint16_t h;
                memcpy(&h, sp, 2);
                const float f = ferry_f16_to_f32(h);
                memcpy(dp, &f, 4);
            } else {
                memcpy(dp, sp, (size_t) o->unit);
            }
        }
    }
    device_access(o->dsrc.data, sspan, false);
    device_access(o->ddst.data, dspan, false);
}

/* The whole allocation (device or pinned) holding p, opened to the host or closed; false
 * if p is in none the device can read. */
static bool open_alloc_of(const void * p, bool open) {
    const char * c = (const char *) p;
    for (size_t i = 0; i < n_allocs; i++) {
        if (c >= allocs[i].base && c < allocs[i].base + (allocs[i].size ? allocs[i].size : 1)) {
            if (allocs[i].kind == MEM_DEVICE) {
                device_access(allocs[i].base, allocs[i].size, open);
            }
            return true;
        }
    }
    return false;
}

/* load_elem<T> of ops-cuda.cu: element i of a row whose elements (q8_0: blocks) are
 * stride bytes apart; ferry's type numbers (ferry/tensor.h): 0 f32, 1 f16, 4 q8_0. */
static float load_elem(int type, const char * row, int64_t i, int64_t stride) {
    uint16_t h;
    if (type == 0) {
        float f;
        memcpy(&f, row + i * stride, 4);
        return f;
    }
    if (type == 1) {
        memcpy(&h, row + i * stride, 2);
        return ferry_f16_to_f32(h);
    }
    const char * blk = row + (i / 32) * stride;
    memcpy(&h, blk, 2);
    return ferry_f16_to_f32(h) * (float) ((const int8_t *) (blk + 2))[i % 32];
}

#define FAKE_ATTN_MAX_D 2048 /* ATTN_MAX_HEAD_DIM of ops-cuda.cu */

/* attn_body's Cells of ops-cuda.cu: where cell j of stream s, kv head hk lies, a cell index along
 * K's nb[1] (V's cell stride) from the (stream, kv head)'s first value. Dense (OP_ATTN): j, the kv
 * head at nb[2], the stream at nb[3]. Paged (OP_ATTN_PAGED): pool cell slot * block_size +
 * j % block_size (slot: table[j / block_size, s]), the kv head hk * head_dim values into the cell. */
static bool attn_paged_op(const op * o) { return o->kind == OP_ATTN_PAGED; }

static int64_t attn_n_kv(const op * o) { return attn_paged_op(o) ? o->table.ne[0] * o->block_size : o->k.ne[1]; }

static const char * attn_first(const op * o, const tview * x, int type, int64_t chan_stride, int64_t s, int64_t hk) {
    if (attn_paged_op(o)) {
        return x->data + hk * o->q.ne[0] / (type == 4 ? 32 : 1) * chan_stride;
    }
    return x->data + hk * x->nb[2] + s * x->nb[3];
}

/* -1 where the table leads out of the pools: the device would fault */
static int64_t attn_cell(const op * o, int64_t s, int64_t j) {
    if (!attn_paged_op(o)) {
        return j;
    }
    const int64_t bs = o->block_size;
    int32_t slot;
    memcpy(&slot, o->table.data + (j / bs) * o->table.nb[0] + s * o->table.nb[1], 4);
    return slot < 0 || ((int64_t) slot + 1) * bs > o->k.ne[1] ? -1 : (int64_t) slot * bs + j % bs;
}

/* attn_decode_kernel and attn_paged_kernel<tk, tv> (ops-cuda.cu's attn_body) as the device runs
 * them: block (h, s, t), token t of n_tok over the stream's first len - n_tok + t + 1 cells (NaN
 * rows for a stream shorter than n_tok, not 0), cell j where attn_cell says; warp w of block / 32
 * takes cells w, w + warps, ... in order with an online softmax, lane l adds head elements l,
 * l + 32, ... and a butterfly sums the lanes; then the warps combine in warp order. */
/* ops-cuda.cu's exp_below: e^(x - m), exactly 1 where x is m (an overflowed maximum's cells) */
static float exp_below(float x, float m) { return x == m ? 1.0f : expf(x - m); }

static void run_attn(const op * o) {
    const tview *q = &o->q, *k = &o->k, *v = &o->v;
    const void * reads[6] = {q->data, k->data, v->data, o->len.data, o->dst, o->table.data};
    const int n_reads = attn_paged_op(o) ? 6 : 5;
    bool ok = true;
    for (int i = 0; i < n_reads; i++) {
        ok = ok && open_alloc_of(reads[i], true);
    }
    const int64_t d = q->ne[0], n_kv = attn_n_kv(o), n_tok = q->ne[2], warps = o->block / 32;
    if (!ok || d > FAKE_ATTN_MAX_D || warps < 1 || warps > 32) {
        sticky_error = cudaErrorIllegalAddress;
    }
    /* a transposed V: cells along nb[0], channels along nb[1] */
    const int64_t v_cell = o->v_trans ? v->nb[0] : v->nb[1], v_chan = o->v_trans ? v->nb[1] : v->nb[0];
    static float acc[32][FAKE_ATTN_MAX_D], qs[FAKE_ATTN_MAX_D];
    for (uint64_t t = 0; t < o->grid_z && !sticky_error; t++) {
        for (uint64_t s = 0; s < o->grid_y && !sticky_error; s++) {
            for (uint64_t h = 0; h < o->grid && !sticky_error; h++) {
                const int64_t hk = (int64_t) h / o->group;
                for (int64_t i = 0; i < d; i++) {
                    qs[i] = load_elem(0, q->data + h * q->nb[1] + t * q->nb[2] + s * q->nb[3], i, q->nb[0]);
                }
                int32_t len32;
                memcpy(&len32, o->len.data + s * o->len.nb[0], 4);
                const int64_t clamped = len32 < 0 ? 0 : (len32 > n_kv ? n_kv : len32);
                const bool too_short = clamped > 0 && clamped < n_tok;
                const int64_t n = clamped > 0 && !too_short ? clamped - n_tok + (int64_t) t + 1 : 0;
                const char * kbase = attn_first(o, k, o->tk, k->nb[0], (int64_t) s, hk);
                const char * vbase = attn_first(o, v, o->tv, v_chan, (int64_t) s, hk);
                float wm[32], wl[32];
                for (int64_t w = 0; w < warps; w++) {
                    float m = -INFINITY, l = 0.0f;
                    memset(acc[w], 0, (size_t) d * sizeof(float));
                    for (int64_t j = w; j < n; j += warps) {
                        const int64_t cell = attn_cell(o, (int64_t) s, j);
                        if (cell < 0) {
                            sticky_error = cudaErrorIllegalAddress;
                            break;
                        }
                        const char * krow = kbase + cell * k->nb[1];
                        float part[32];
                        for (int lane = 0; lane < 32; lane++) {
                            part[lane] = 0.0f;
                            for (int64_t i = lane; i < d; i += 32) {
                                part[lane] += qs[i] * load_elem(o->tk, krow, i, k->nb[0]);
                            }
                        }
                        for (int off = 16; off > 0; off >>= 1) { /* __shfl_xor_sync: every lane adds its partner */
                            float next[32];
                            for (int lane = 0; lane < 32; lane++) {
                                next[lane] = part[lane] + part[lane ^ off];
                            }
                            memcpy(part, next, sizeof(part));
                        }
                        const float sc = o->scale * part[0];
                        const float m_new = fmaxf(m, sc);
                        const float c = exp_below(m, m_new), p = exp_below(sc, m_new);
                        l = l * c + p;
                        const char * vrow = vbase + cell * v_cell;
                        for (int64_t i = 0; i < d; i++) {
                            acc[w][i] = acc[w][i] * c + p * load_elem(o->tv, vrow, i, v_chan);
                        }
                        m = m_new;
                    }
                    wm[w] = m;
                    wl[w] = l;
                }
                float big = -INFINITY, sum = 0.0f;
                for (int64_t w = 0; w < warps; w++) {
                    big = wl[w] > 0.0f ? fmaxf(big, wm[w]) : big;
                }
                for (int64_t w = 0; w < warps; w++) {
                    sum += wl[w] > 0.0f ? wl[w] * exp_below(wm[w], big) : 0.0f;
                }
                for (int64_t i = 0; i < d && !sticky_error; i++) {
                    float out = 0.0f;
                    for (int64_t w = 0; w < warps; w++) {
                        out += wl[w] > 0.0f ? acc[w][i] * exp_below(wm[w], big) : 0.0f;
                    }
                    out = too_short ? NAN : n > 0 ? out / sum : 0.0f;
                    memcpy(o->dst + i * o->out_nb0 + h * o->out_nb1 + t * o->out_nb2 + s * o->out_nb3, &out, 4);
                }
            }
        }
    }
    for (int i = 0; i < n_reads; i++) {
        open_alloc_of(reads[i], false);
    }
}

/* gather_rows_kernel<L> (lib/src/cuda/copy-gather.cu) as the device runs it: block b takes
 * chunks b, b + grid, ...; thread t of a chunk moves 16-byte elements first + j * block,
 * j < L; element e is row e / w, column e % w. */
static void run_gather(const op * o) {
    const uint64_t w = o->width;
    const uint64_t rows = w ? (o->total + w - 1) / w : 0;
    const size_t dspan = rows ? ((rows - 1) * o->dpitch + w) * 16 : 0;
    const size_t sspan = rows ? ((rows - 1) * o->spitch + w) * 16 : 0;
    if (rows && (!find_alloc(o->dst, dspan, true) || !device_reads(o->src, sspan))) {
        sticky_error = cudaErrorIllegalAddress; /* memory the device cannot reach */
        return;
    }
    device_access(o->dst, dspan, true);
    device_access(o->src, sspan, true);
    for (uint64_t b = 0; b < o->grid; b++) {
        for (uint64_t chunk = b; chunk < o->n_chunks; chunk += o->grid) {
            for (uint64_t t = 0; t < o->block; t++) {
                const uint64_t first = chunk * o->block * o->loads + t;
                for (uint64_t j = 0; j < o->loads; j++) {
                    const uint64_t e = first + j * o->block;
                    if (e < o->total) {
                        const uint64_t r = e / w, c = e - r * w;
                        memcpy(o->dst + (r * o->dpitch + c) * 16, o->src + (r * o->spitch + c) * 16, 16);
                    }
                }
            }
        }
    }
    device_access(o->dst, dspan, false);
    device_access(o->src, sspan, false);
}

/* ferry_cuda_piece (lib/src/cuda/cuda-ops.h): one piece of gather_pieces_kernel. */
typedef struct {
    uint64_t src, dst, size, count, src_stride, dst_stride;
} fake_piece;

/* gather_pieces_kernel (lib/src/cuda/copy-gather.cu) as the device runs it: block (x, y) takes
 * pieces x, x + grid, ...; of each, thread t moves words y * block + t, then a grid_y * block
 * further on; a piece's word is 16 bytes where its addresses, size and strides allow, else 4,
 * else 1. Every piece's rows must be memory the device reads (source) and its own (destination). */
static void run_pieces(const op * o) {
    const size_t bytes = o->total * sizeof(fake_piece);
    if (o->total && !find_alloc(o->src, bytes, true)) {
        sticky_error = cudaErrorIllegalAddress;
        return;
    }
    fake_piece * p = malloc(bytes ? bytes : 1);
    if (!p) {
        sticky_error = cudaErrorLaunchFailure;
        return;
    }
    device_access(o->src, bytes, true);
    memcpy(p, o->src, bytes);
    device_access(o->src, bytes, false);
    for (uint64_t i = 0; i < o->total && !sticky_error; i++) {
        const size_t span_s = p[i].count ? (p[i].count - 1) * p[i].src_stride + p[i].size : 0;
        const size_t span_d = p[i].count ? (p[i].count - 1) * p[i].dst_stride + p[i].size : 0;
        if (span_s && (!device_reads((const void *) (uintptr_t) p[i].src, span_s) ||
                       !find_alloc((const void *) (uintptr_t) p[i].dst, span_d, true))) {
            sticky_error = cudaErrorIllegalAddress;
        }
    }
    for (uint64_t x = 0; x < o->grid && !sticky_error; x++) {
        for (uint64_t i = x; i < o->total; i += o->grid) {
            const fake_piece g = p[i];
            const uint64_t all = g.src | g.dst | g.size | g.src_stride | g.dst_stride;
            const uint64_t unit = all % 16 == 0 ? 16 : all % 4 == 0 ? 4 : 1, w = g.size / unit, total = w * g.count;
            const size_t span_d = g.count ? (g.count - 1) * g.dst_stride + g.size : 0;
            const size_t span_s = g.count ? (g.count - 1) * g.src_stride + g.size : 0;
            device_access((void *) (uintptr_t) g.dst, span_d, true);
            device_access((void *) (uintptr_t) g.src, span_s, true);
            for (uint64_t y = 0; y < o->grid_y; y++) {
                for (uint64_t t = 0; t < o->block; t++) {
                    for (uint64_t e = y * o->block + t; e < total; e += o->grid_y * o->block) {
                        const uint64_t r = e / w, c = e - r * w;
                        memcpy((char *) (uintptr_t) (g.dst + r * g.dst_stride) + c * unit,
                               (const char *) (uintptr_t) (g.src + r * g.src_stride) + c * unit, unit);
                    }
                }
            }
            device_access((void *) (uintptr_t) g.dst, span_d, false);
            device_access((void *) (uintptr_t) g.src, span_s, false);
        }
    }
    free(p);
}

static void run_op(op * o) {
    switch (o->kind) {
    case OP_COPY: {
        const size_t dspan = (o->height - 1) * o->dpitch + o->width, sspan = (o->height - 1) * o->spitch + o->width;
        device_access(o->dst, dspan, true);
        device_access(o->src, sspan, true);
        for (size_t r = 0; r < o->height; r++) {
            memmove(o->dst + r * o->dpitch, o->src + r * o->spitch, o->width);
        }
        device_access(o->dst, dspan, false);
        device_access(o->src, sspan, false);
        break;
    }
    case OP_MEMSET:
        device_access(o->dst, o->width, true);
        memset(o->dst, o->value, o->width);
        device_access(o->dst, o->width, false);
        break;
    case OP_EVENT:
        if (o->seq > o->event->done_seq) {
            o->event->done_seq = o->seq;
            o->event->ms = now_ms();
        }
        break;
    case OP_WAIT:
        run_to(o->waited, o->waited_pos);
        break;
    case OP_GATHER:
        run_gather(o);
        break;
    case OP_PIECES:
        run_pieces(o);
        break;
    case OP_DUP:
        run_dup(o);
        break;
    case OP_ATTN:
    case OP_ATTN_PAGED:
        run_attn(o); /* the dense window or the paged pools: attn_cell tells them apart */
        break;
    case OP_FAULT:
        sticky_error = cudaErrorIllegalAddress; /* a kernel read another device's memory */
        break;
    case OP_HOLD: {
        const struct timespec ts = {(time_t) (o->ns / 1000000000u), (long) (o->ns % 1000000000u)};
        nanosleep(&ts, NULL);
        break;
    }
    }
    free(o->staged);
    o->staged = NULL;
}

/* Run s's queued work up to position pos (exclusive). */
static void run_to(fake_stream * s, size_t pos) {
    while (s->base + s->done < pos && s->done < s->n) {
        run_op(&s->ops[s->done++]);
    }
    if (s->done == s->n) { /* all ran: the array starts over, positions go on */
        s->base += s->n;
        s->done = s->n = 0;
    }
}

static size_t end_of(const fake_stream * s) { return s->base + s->n; }

static void run_all(void) {
    for (fake_stream * s = streams; s; s = s->next) {
        run_to(s, end_of(s));
    }
}

static cudaError_t push(fake_stream * s, op o, size_t * pos) {
    if (s->n == s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 16;
        op * grown = realloc(s->ops, cap * sizeof(op));
        if (!grown) {
            free(o.staged);
            return fail(cudaErrorMemoryAllocation);
        }
        s->ops = grown;
        s->cap = cap;
    }
    s->ops[s->n++] = o;
    if (pos) {
        *pos = end_of(s);
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------- copies */

/* Queue height rows of width bytes; pageable sources are staged now, pageable
 * destinations (and host-to-host copies) are finished before returning. */
static cudaError_t queue_copy(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                              size_t height, cudaStream_t stream, bool peer) {
    fake_stream * s = stream_of(stream);
    if (!s) {
        return fail(cudaErrorMemoryAllocation);
    }
    if (width == 0 || height == 0) {
        return cudaSuccess;
    }
    if (!dst || !src) {
        return fail(cudaErrorInvalidValue);
    }
    if (dpitch < width || spitch < width || dpitch > FAKE_MAX_PITCH || spitch > FAKE_MAX_PITCH) {
        return fail(height > 1 ? cudaErrorInvalidPitchValue : cudaErrorInvalidValue);
    }
    const size_t dspan = (height - 1) * dpitch + width, sspan = (height - 1) * spitch + width;
    const bool dev_dst = is_device(dst), dev_src = is_device(src);
    if ((dev_dst && !find_alloc(dst, dspan, true)) || (dev_src && !find_alloc(src, sspan, true))) {
        return fail(cudaErrorInvalidValue); /* a device range past its allocation */
    }
    if (!peer && (foreign(dst, stream_device(s)) || foreign(src, stream_device(s)))) {
        return fail(cudaErrorInvalidValue); /* another device's memory: a peer copy's */
    }
    op o = {.kind = OP_COPY, .dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width,
            .height = height};
    if (!dev_src && !is_pinned(src)) {
        o.staged = malloc(sspan);
        if (!o.staged) {
            return fail(cudaErrorMemoryAllocation);
        }
        memcpy(o.staged, src, sspan);
        o.src = o.staged;
    }
    size_t pos;
    const cudaError_t err = push(s, o, &pos);
    if (err == cudaSuccess && ((!dev_dst && !is_pinned(dst)) || (!dev_dst && !dev_src))) {
        run_to(s, pos);
    }
    return err;
}

cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    INJECT();
    (void) kind;
    pthread_mutex_lock(&lock_);
    const cudaError_t err = queue_copy(dst, count, src, count, count, 1, stream, false);
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaMemcpy2DAsync(void * dst, size_t dpitch, const void * src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t stream) {
    INJECT();
    (void) kind;
    pthread_mutex_lock(&lock_);
    const cudaError_t err = queue_copy(dst, dpitch, src, spitch, width, height, stream, false);
    pthread_mutex_unlock(&lock_);
    return err;
}

/* Linear memory only: row y of slice z of a pitched pointer is at ptr + (z * ysize + y) * pitch. */
cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms * p, cudaStream_t stream) {
    INJECT();
    if (!p || p->srcArray || p->dstArray) {
        return fail(cudaErrorInvalidValue); /* ferry never copies CUDA arrays */
    }
    const struct cudaExtent e = p->extent;
    const struct cudaPitchedPtr sp = p->srcPtr, dp = p->dstPtr;
    if (sp.pitch < p->srcPos.x + e.width || dp.pitch < p->dstPos.x + e.width) {
        return fail(cudaErrorInvalidPitchValue);
    }
    if (e.depth > 1 && (sp.ysize < p->srcPos.y + e.height || dp.ysize < p->dstPos.y + e.height)) {
        return fail(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&lock_);
    cudaError_t err = cudaSuccess;
    for (size_t z = 0; z < e.depth && err == cudaSuccess; z++) {
        const size_t so = ((p->srcPos.z + z) * sp.ysize + p->srcPos.y) * sp.pitch + p->srcPos.x;
        const size_t d_o = ((p->dstPos.z + z) * dp.ysize + p->dstPos.y) * dp.pitch + p->dstPos.x;
        err = queue_copy((char *) dp.ptr + d_o, dp.pitch, (const char *) sp.ptr + so, sp.pitch, e.width, e.height,
                         stream, false);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

/* Each copy queued as cudaMemcpyAsync queues one, in the batch's order (CUDA promises none within
 * a batch; the copies of a paged gather never overlap). The attributes are checked as CUDA checks
 * them: one or more, the first from copy 0, in order, each with a source access order. */
cudaError_t cudaMemcpyBatchAsync(void * const * dsts, const void * const * srcs, const size_t * sizes, size_t count,
                                 struct cudaMemcpyAttributes * attrs, size_t * attrs_idxs, size_t num_attrs,
                                 cudaStream_t stream) {
    INJECT();
    if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attrs_idxs || num_attrs == 0 || num_attrs > count ||
        attrs_idxs[0] != 0 || stream == NULL || stream == cudaStreamLegacy) {
        return fail(cudaErrorInvalidValue);
    }
    for (size_t i = 0; i < num_attrs; i++) {
        if (attrs[i].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid || attrs_idxs[i] >= count ||
            (i > 0 && attrs_idxs[i] <= attrs_idxs[i - 1])) {
            return fail(cudaErrorInvalidValue);
        }
    }
    pthread_mutex_lock(&lock_);
    cudaError_t err = cudaSuccess;
    for (size_t i = 0; i < count && err == cudaSuccess; i++) {
        err = queue_copy(dsts[i], sizes[i], srcs[i], sizes[i], sizes[i], 1, stream, false);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaMemcpyPeerAsync(void * dst, int dst_device, const void * src, int src_device, size_t count,
                                cudaStream_t stream) {
    INJECT();
    if (dst_device < 0 || dst_device >= n_devices() || src_device < 0 || src_device >= n_devices()) {
        return fail(cudaErrorInvalidDevice);
    }
    pthread_mutex_lock(&lock_);
    cudaError_t err = cudaSuccess;
    if (count > 0 && (device_of(dst) != dst_device || device_of(src) != src_device)) {
        err = fail(cudaErrorInvalidValue); /* each pointer is memory of the device named with it */
    } else {
        err = queue_copy(dst, count, src, count, count, 1, stream, true);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaMemsetAsync(void * dst, int value, size_t count, cudaStream_t stream) {
    INJECT();
    pthread_mutex_lock(&lock_);
    cudaError_t err = cudaSuccess;
    fake_stream * s = stream_of(stream);
    if (!s) {
        err = fail(cudaErrorMemoryAllocation);
    } else if (count > 0 && (!find_alloc(dst, count, true) || foreign(dst, stream_device(s)))) {
        err = fail(cudaErrorInvalidValue); /* this device's memory only, inside one allocation */
    } else if (count > 0) {
        err = push(s, (op) {.kind = OP_MEMSET, .dst = dst, .value = value, .width = count}, NULL);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

/* ---------------------------------------------------------------- allocation */

cudaError_t cudaMalloc(void ** out, size_t size) {
    INJECT();
    if (!out) {
        return fail(cudaErrorInvalidValue);
    }
    *out = NULL;
    if (size == 0) {
        return cudaSuccess;
    }
    pthread_mutex_lock(&lock_);
    const size_t free_bytes = device_free_locked();
    pthread_mutex_unlock(&lock_);
    if (size > free_bytes) {
        return fail(cudaErrorMemoryAllocation);
    }
    const size_t page = 4096, mapped = (size + page - 1) / page * page;
    void * p = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        return fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_lock(&lock_);
    const bool ok = add_alloc(p, size, mapped, MEM_DEVICE);
    pthread_mutex_unlock(&lock_);
    if (!ok) {
        munmap(p, mapped);
        return fail(cudaErrorMemoryAllocation);
    }
    *out = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void ** out, size_t size) {
    INJECT();
    if (!out) {
        return fail(cudaErrorInvalidValue);
    }
    *out = NULL;
    void * p = NULL;
    if (size > FAKE_MAX_ALLOC || posix_memalign(&p, 4096, size ? size : 1) != 0) {
        return fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_lock(&lock_);
    const bool ok = add_alloc(p, size, 0, MEM_PINNED);
    pthread_mutex_unlock(&lock_);
    if (!ok) {
        free(p);
        return fail(cudaErrorMemoryAllocation);
    }
    *out = p;
    return cudaSuccess;
}

/* Freeing waits for the device, as cudaFree does. */
static cudaError_t free_alloc(void * p, enum mem_kind kind) {
    if (!p) {
        return cudaSuccess;
    }
    pthread_mutex_lock(&lock_);
    run_all();
    allocation * a = NULL;
    for (size_t i = 0; i < n_allocs && !a; i++) {
        a = allocs[i].base == p && allocs[i].kind == kind ? &allocs[i] : NULL;
    }
    cudaError_t err = cudaSuccess;
    if (!a) {
        err = fail(cudaErrorInvalidValue);
    } else if (kind == MEM_DEVICE) {
        munmap(a->base, a->mapped);
        remove_alloc(a);
    } else {
        free(a->base);
        remove_alloc(a);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaFree(void * p) { return free_alloc(p, MEM_DEVICE); }
cudaError_t cudaFreeHost(void * p) { return free_alloc(p, MEM_PINNED); }

cudaError_t cudaHostRegister(void * p, size_t size, unsigned int flags) {
    INJECT();
    (void) flags;
    if (!p || size == 0) {
        return fail(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&lock_);
    cudaError_t err = cudaSuccess;
    if (is_pinned(p) || is_pinned((char *) p + size - 1)) {
        err = fail(cudaErrorHostMemoryAlreadyRegistered);
    } else if (!add_alloc(p, size, 0, MEM_REGISTERED)) {
        err = fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaHostUnregister(void * p) {
    pthread_mutex_lock(&lock_);
    allocation * a = NULL;
    for (size_t i = 0; i < n_allocs && !a; i++) {
        a = allocs[i].base == p && allocs[i].kind == MEM_REGISTERED ? &allocs[i] : NULL;
    }
    cudaError_t err = cudaSuccess;
    if (a) {
        remove_alloc(a);
    } else {
        err = fail(cudaErrorHostMemoryNotRegistered);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

/* With unified addressing the device reads pinned memory at its host address. */
cudaError_t cudaHostGetDevicePointer(void ** dev, void * host, unsigned int flags) {
    if (!dev || flags != 0) {
        return fail(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&lock_);
    const bool pinned = is_pinned(host);
    pthread_mutex_unlock(&lock_);
    if (!pinned) {
        return fail(cudaErrorInvalidValue);
    }
    *dev = host;
    return cudaSuccess;
}

/* What an address is: device memory of a device (inside an allocation's bytes, not its page
 * padding), pinned host memory, or anything else (unregistered, as CUDA 11+ says). */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes * attr, const void * p) {
    if (!attr) {
        return fail(cudaErrorInvalidValue);
    }
    memset(attr, 0, sizeof(*attr));
    pthread_mutex_lock(&lock_);
    if (find_alloc(p, 1, true)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = device_of(p);
        attr->devicePointer = (void *) p;
    } else if (is_pinned(p)) {
        attr->type = cudaMemoryTypeHost;
        attr->hostPointer = (void *) p;
        attr->devicePointer = (void *) p;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2; /* what the runtime leaves there */
    }
    pthread_mutex_unlock(&lock_);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- devices */

cudaError_t cudaMemGetInfo(size_t * free_bytes, size_t * total_bytes) {
    INJECT();
    if (!free_bytes || !total_bytes) {
        return fail(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&lock_);
    *free_bytes = device_free_locked();
    pthread_mutex_unlock(&lock_);
    *total_bytes = FAKE_DEVICE_MEMORY;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int * n) {
    if (!n) {
        return fail(cudaErrorInvalidValue);
    }
    *n = n_devices();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    INJECT();
    if (device < 0 || device >= n_devices()) {
        return fail(cudaErrorInvalidDevice);
    }
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int * device) {
    if (!device) {
        return fail(cudaErrorInvalidValue);
    }
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int * value, enum cudaDeviceAttr attr, int device) {
    const bool known = device >= 0 && device < n_devices();
    if (!value || !known) {
        return fail(!known ? cudaErrorInvalidDevice : cudaErrorInvalidValue);
    }
    *value = attr == cudaDevAttrMaxPitch ? FAKE_MAX_PITCH : attr == cudaDevAttrClockRate ? FAKE_CLOCK_KHZ : 0;
    return cudaSuccess;
}

/* The driver's CUDA version: the runtime's (CUDART_VERSION) unless FERRY_FAKE_CUDA_DRIVER_VERSION
 * names another (12040: a 12.4 driver), so that a test sees a driver older than the runtime
 * built in. Never fails, and is not counted for fake_cudart_inject: ferry asks it once a process. */
cudaError_t cudaDriverGetVersion(int * version) {
    if (!version) {
        return fail(cudaErrorInvalidValue);
    }
    const char * env = getenv("FERRY_FAKE_CUDA_DRIVER_VERSION");
    *version = env && *env ? atoi(env) : CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    INJECT();
    pthread_mutex_lock(&lock_);
    run_all();
    pthread_mutex_unlock(&lock_);
    return sticky_error ? fail(sticky_error) : cudaSuccess;
}

/* ---------------------------------------------------------------- streams and events */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t * out, unsigned int flags) {
    INJECT();
    (void) flags;
    if (!out) {
        return fail(cudaErrorInvalidValue);
    }
    fake_stream * s = calloc(1, sizeof(*s));
    if (!s) {
        return fail(cudaErrorMemoryAllocation);
    }
    s->device = current_device;
    pthread_mutex_lock(&lock_);
    s->next = streams;
    streams = s;
    pthread_mutex_unlock(&lock_);
    *out = (cudaStream_t) s;
    return cudaSuccess;
}

/* Its work runs to the end; the stream itself stays (an event or a wait may name it)
 * and is freed at exit. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    pthread_mutex_lock(&lock_);
    fake_stream * s = stream_of(stream);
    run_to(s, end_of(s));
    pthread_mutex_unlock(&lock_);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    INJECT();
    pthread_mutex_lock(&lock_);
    fake_stream * s = stream_of(stream);
    if (s) {
        run_to(s, end_of(s));
    }
    pthread_mutex_unlock(&lock_);
    return !s ? fail(cudaErrorMemoryAllocation) : sticky_error ? fail(sticky_error) : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t * out, unsigned int flags) {
    INJECT();
    if (!out) {
        return fail(cudaErrorInvalidValue);
    }
    fake_event * e = calloc(1, sizeof(*e));
    if (!e) {
        return fail(cudaErrorMemoryAllocation);
    }
    e->flags = flags;
    e->device = current_device;
    *out = (cudaEvent_t) e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    pthread_mutex_lock(&lock_);
    fake_event * e = (fake_event *) event;
    if (e && e->stream) {
        run_to(e->stream, e->pos); /* its record op points at it */
    }
    free(e);
    pthread_mutex_unlock(&lock_);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    INJECT();
    pthread_mutex_lock(&lock_);
    fake_event * e = (fake_event *) event;
    fake_stream * s = stream_of(stream);
    cudaError_t err = !e ? fail(cudaErrorInvalidResourceHandle) : !s ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
    if (err == cudaSuccess && stream_device(s) != e->device) {
        err = fail(cudaErrorInvalidResourceHandle); /* an event records on its own device's streams */
    }
    if (err == cudaSuccess) {
        size_t pos;
        err = push(s, (op) {.kind = OP_EVENT, .event = e, .seq = e->seq + 1}, &pos);
        if (err == cudaSuccess) {
            e->seq++;
            e->stream = s;
            e->pos = pos;
        }
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    INJECT();
    (void) flags;
    pthread_mutex_lock(&lock_);
    fake_event * e = (fake_event *) event;
    fake_stream * s = stream_of(stream);
    cudaError_t err = !e ? fail(cudaErrorInvalidResourceHandle) : !s ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
    if (err == cudaSuccess && e->stream && e->done_seq < e->seq) { /* never recorded or done: nothing to wait for */
        err = push(s, (op) {.kind = OP_WAIT, .waited = e->stream, .waited_pos = e->pos}, NULL);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    INJECT();
    pthread_mutex_lock(&lock_);
    fake_event * e = (fake_event *) event;
    if (e && e->stream && e->done_seq < e->seq) {
        run_to(e->stream, e->pos);
    }
    pthread_mutex_unlock(&lock_);
    return !e ? fail(cudaErrorInvalidResourceHandle) : sticky_error ? fail(sticky_error) : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float * ms, cudaEvent_t start, cudaEvent_t end) {
    const fake_event *a = (const fake_event *) start, *b = (const fake_event *) end;
    if (!ms || !a || !b) {
        return fail(cudaErrorInvalidValue);
    }
    if ((a->flags | b->flags) & cudaEventDisableTiming) {
        return fail(cudaErrorInvalidResourceHandle);
    }
    pthread_mutex_lock(&lock_);
    const bool done = a->seq > 0 && b->seq > 0 && a->done_seq == a->seq && b->done_seq == b->seq;
    const double d = b->ms - a->ms;
    pthread_mutex_unlock(&lock_);
    if (!done) {
        return fail(cudaErrorNotReady);
    }
    *ms = (float) d;
    return cudaSuccess;
}

/* ---------------------------------------------------------------- errors */

/* A lost context's error stays: only a new process (here, the next arm) clears it. */
cudaError_t cudaGetLastError(void) {
    const cudaError_t err = lost_context ? lost_context : last_error;
    last_error = cudaSuccess;
    return err;
}

cudaError_t cudaPeekAtLastError(void) { return lost_context ? lost_context : last_error; }

#define FAKE_ERRORS(X)                                                                                       \
    X(cudaSuccess, "no error")                                                                               \
    X(cudaErrorInvalidValue, "invalid argument")                                                             \
    X(cudaErrorMemoryAllocation, "out of memory")                                                            \
    X(cudaErrorInvalidPitchValue, "invalid pitch argument")                                                  \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                                                      \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                                             \
    X(cudaErrorNotReady, "device not ready")                                                                 \
    X(cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped")   \
    X(cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region")         \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")                                   \
    X(cudaErrorMisalignedAddress, "misaligned address")                                                      \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                                                  \
    X(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device (fake CUDA " \
                                       "runtime: kernels do not run)")

const char * cudaGetErrorString(cudaError_t err) {
#define FAKE_STRING(code, text) \
    case code: return text;
    switch (err) {
        FAKE_ERRORS(FAKE_STRING)
    default: return "unknown error (fake CUDA runtime)";
    }
}

const char * cudaGetErrorName(cudaError_t err) {
#define FAKE_NAME(code, text) \
    case code: return #code;
    switch (err) {
        FAKE_ERRORS(FAKE_NAME)
    default: return "cudaErrorUnknown";
    }
}

/* ---------------------------------------------------------------- what nvcc's launch stubs call */

static _Thread_local struct {
    dim3 grid, block;
    size_t shared;
    void * stream;
} launch_config;

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, void * stream) {
    launch_config.grid = grid;
    launch_config.block = block;
    launch_config.shared = shared;
    launch_config.stream = stream;
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 * grid, dim3 * block, size_t * shared, void * stream) {
    *grid = launch_config.grid;
    *block = launch_config.block;
    *shared = launch_config.shared;
    *(void **) stream = launch_config.stream;
    return cudaSuccess;
}

/* The kernels nvcc registered: host stub -> device (mangled) name. */
typedef struct {
    const void * host_fun;
    const char * name;
} kernel_name;
static kernel_name kernels[64];
static size_t n_kernels;

static const char * name_of(const void * host_fun) {
    for (size_t i = 0; i < n_kernels; i++) {
        if (kernels[i].host_fun == host_fun) {
            return kernels[i].name;
        }
    }
    return "";
}

cudaError_t __cudaGetKernel(cudaKernel_t * kernel, const void * fun) {
    *kernel = (cudaKernel_t) fun;
    return cudaSuccess;
}

/* The n-th (0, 1) integer template argument of a mangled name (ILi4E, ILi0ELi4EE); 0 if none. */
static unsigned template_int_at(const char * name, int nth) {
    const char * a = strstr(name, "ILi");
    for (int i = 0; a && i < nth; i++) {
        a = strstr(a + 3, "Li");
        a = a ? a - 1 : NULL; /* so that a + 3 is past "Li" as past "ILi" */
    }
    return a ? (unsigned) strtoul(a + 3, NULL, 10) : 0;
}

static unsigned template_int(const char * name) { return template_int_at(name, 0); }

/* A kernel's launch: queued as itself, or, when it touches another device's memory, as the
 * fault it makes when it runs. */
static cudaError_t push_kernel(fake_stream * s, op o, const void * const * ptrs, int n) {
    for (int i = 0; i < n; i++) {
        if (foreign(ptrs[i], stream_device(s))) {
            return push(s, (op) {.kind = OP_FAULT}, NULL);
        }
    }
    return push(s, o, NULL);
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void ** args, size_t shared,
                               cudaStream_t stream) {
    INJECT();
    (void) shared;
    pthread_mutex_lock(&lock_);
    const char * name = name_of((const void *) kernel);
    fake_stream * s = stream_of(stream);
    cudaError_t err = cudaSuccess;
    if (!s) {
        err = fail(cudaErrorMemoryAllocation);
    } else if (strstr(name, "gather_rows_kernel") && template_int(name) > 0) {
        op o = {.kind = OP_GATHER, .dst = *(char **) args[0], .dpitch = *(uint64_t *) args[1],
                .src = *(const char **) args[2], .spitch = *(uint64_t *) args[3], .width = *(uint64_t *) args[4],
                .total = *(uint64_t *) args[5], .n_chunks = *(uint64_t *) args[6], .grid = grid.x,
                .block = block.x, .loads = template_int(name)};
        err = push_kernel(s, o, (const void *[]) {o.dst, o.src}, 2);
    } else if (strstr(name, "gather_pieces_kernel")) {
        op o = {.kind = OP_PIECES, .src = *(const char **) args[0], .total = *(uint64_t *) args[1], .grid = grid.x,
                .grid_y = grid.y, .block = block.x};
        err = push_kernel(s, o, (const void *[]) {o.src}, 1);
    } else if (strstr(name, "dup_kernel")) {
        op o = {.kind = OP_DUP, .dsrc = *(tview *) args[0], .ddst = *(tview *) args[1], .mode = *(int *) args[2],
                .n0 = *(int64_t *) args[3], .n = *(int64_t *) args[4], .unit = *(int64_t *) args[5],
                .word = *(int64_t *) args[6], .grid = grid.x, .block = block.x};
        err = push_kernel(s, o, (const void *[]) {o.dsrc.data, o.ddst.data}, 2);
    } else if (strstr(name, "attn_decode_kernel")) {
        op o = {.kind = OP_ATTN, .q = *(tview *) args[0], .k = *(tview *) args[1], .v = *(tview *) args[2],
                .len = *(tview *) args[3], .dst = *(char **) args[4], .out_nb0 = *(int64_t *) args[5],
                .out_nb1 = *(int64_t *) args[6], .out_nb2 = *(int64_t *) args[7], .out_nb3 = *(int64_t *) args[8],
                .scale = *(float *) args[9], .v_trans = *(int *) args[10], .group = *(int64_t *) args[11],
                .tk = (int) template_int_at(name, 0), .tv = (int) template_int_at(name, 1), .grid = grid.x,
                .grid_y = grid.y, .grid_z = grid.z, .block = block.x};
        err = push_kernel(s, o, (const void *[]) {o.q.data, o.k.data, o.v.data, o.len.data, o.dst}, 5);
    } else if (strstr(name, "attn_paged_kernel")) {
        op o = {.kind = OP_ATTN_PAGED, .q = *(tview *) args[0], .k = *(tview *) args[1], .v = *(tview *) args[2],
                .len = *(tview *) args[3], .table = *(tview *) args[4], .dst = *(char **) args[5],
                .out_nb0 = *(int64_t *) args[6], .out_nb1 = *(int64_t *) args[7], .out_nb2 = *(int64_t *) args[8],
                .out_nb3 = *(int64_t *) args[9], .scale = *(float *) args[10], .v_trans = *(int *) args[11],
                .group = *(int64_t *) args[12], .block_size = *(int64_t *) args[13],
                .tk = (int) template_int_at(name, 0), .tv = (int) template_int_at(name, 1), .grid = grid.x,
                .grid_y = grid.y, .grid_z = grid.z, .block = block.x};
        err = push_kernel(s, o, (const void *[]) {o.q.data, o.k.data, o.v.data, o.len.data, o.table.data, o.dst}, 6);
    } else if (strstr(name, "hold_kernel")) { /* its cycles at the fake's clock */
        const unsigned long long cycles = *(unsigned long long *) args[0];
        err = push(s, (op) {.kind = OP_HOLD, .ns = cycles / (FAKE_CLOCK_KHZ / 1000000)}, NULL);
    } else {
        err = fail(cudaErrorNoKernelImageForDevice);
    }
    pthread_mutex_unlock(&lock_);
    return err;
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void ** args, size_t shared,
                                    cudaStream_t stream) {
    return __cudaLaunchKernel(kernel, grid, block, args, shared, stream);
}

static void * fat_binary_handle;

void ** __cudaRegisterFatBinary(void * fat_cubin) {
    (void) fat_cubin;
    return &fat_binary_handle;
}

void __cudaRegisterFatBinaryEnd(void ** handle) { (void) handle; }
char __cudaInitModule(void ** handle) {
    (void) handle;
    return 0;
}
void __cudaUnregisterFatBinary(void ** handle) { (void) handle; }

void __cudaRegisterFunction(void ** handle, const char * host_fun, char * device_fun, const char * device_name,
                            int thread_limit, uint3 * tid, uint3 * bid, dim3 * block, dim3 * grid, int * wsize) {
    (void) handle, (void) device_fun, (void) thread_limit, (void) tid, (void) bid, (void) block, (void) grid;
    (void) wsize;
    if (n_kernels < sizeof(kernels) / sizeof(kernels[0])) { /* the name lives in the binary */
        kernels[n_kernels++] = (kernel_name) {host_fun, device_name};
    }
}

/* The streams and their queues, at exit (LeakSanitizer counts what is left). */
__attribute__((destructor)) static void free_streams(void) {
    for (fake_stream * s = streams; s;) {
        fake_stream * next = s->next;
        for (size_t i = s->done; i < s->n; i++) {
            free(s->ops[i].staged);
        }
        free(s->ops);
        if (s != &legacy_stream) {
            free(s);
        }
        s = next;
    }
    free(allocs);
}
