/*
 * CUDA kernels for the ops a split needs on the device: decode attention (dense and paged) and dup.
 * Sources are read strictly through their ne/nb, as the CPU kernels read them, and
 * every kernel is deterministic: each value is summed by one thread or one warp in a
 * fixed order, warps combine in a fixed order, nothing uses atomics.
 */
#include "cuda-common.h" /* ferry_cuda_fail */
#include "cuda-ops.h"
#include "graph-impl.h" /* ferry_attn_paged_check */

#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

/* ---------------------------------------------------------------- tensors as kernels see them */

struct tview {
    const char * data;
    int64_t ne[4];
    int64_t nb[4];
};

static tview view_of(const ferry_tensor * t) {
    tview v;
    v.data = (const char *) ferry_tensor_data(t);
    for (int i = 0; i < 4; i++) {
        v.ne[i] = t->ne[i];
        v.nb[i] = (int64_t) t->nb[i];
    }
    return v;
}

/* The largest power of two, up to 4, that divides t's address and every stride it steps
 * by (a dimension of one element steps by none): the widest load its elements allow. */
static int64_t alignment_of(const ferry_tensor * t) {
    uint64_t bits = (uint64_t) (uintptr_t) ferry_tensor_data(t);
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] > 1) {
            bits |= (uint64_t) t->nb[i];
        }
    }
    return bits % 4 == 0 ? 4 : bits % 2 == 0 ? 2 : 1;
}

/* The kernels load an element (a q8_0 block's scale) as one word of its size: a tensor
 * whose address or strides are not multiples of it would fault on the device, which
 * kills the context; it is refused instead. */
static ferry_status check_aligned(const ferry_tensor * t, const char * op) {
    const int64_t need = ferry_blck_size(t->type) > 1 ? 2 : (int64_t) ferry_type_size(t->type);
    if (need > 1 && alignment_of(t) % need != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT,
                          "%s: the CUDA kernel reads %s in %lld-byte words; '%s' has an address or stride that is "
                          "not a multiple of %lld",
                          op, ferry_type_name(t->type), (long long) need, t->name, (long long) need);
    }
    return FERRY_OK;
}

static ferry_status launch_status(const char * what) {
    const cudaError_t err = cudaGetLastError(); /* launch errors; also clears a non-sticky one */
    /* as every CUDA error: out of memory as such, a sticky one said to be */
    return err != cudaSuccess ? ferry_cuda_fail(err, what) : FERRY_OK;
}

static __device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Element i of a row whose elements (q8_0: blocks of 32) are stride bytes apart. */
template <int T> static __device__ __forceinline__ float load_elem(const char * row, int64_t i, int64_t stride) {
    if (T == FERRY_TYPE_F32) {
        return *(const float *) (row + i * stride);
    } else if (T == FERRY_TYPE_F16) {
        return half_bits_to_float(*(const uint16_t *) (row + i * stride));
    } else { /* q8_0: an f16 scale d and 32 int8, value d * q */
        const char * blk = row + (i / 32) * stride;
        return half_bits_to_float(*(const uint16_t *) blk) * (float) ((const int8_t *) (blk + 2))[i % 32];
    }
}

/* A butterfly: every lane adds the same pairs (a + b == b + a exactly), so all lanes
 * end with the same bits, run after run. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

/* ---------------------------------------------------------------- decode attention */

#define ATTN_WARPS 4
#define ATTN_MAX_HEAD_DIM 2048 /* shared memory: (ATTN_WARPS + 1) * head_dim floats */

/*
 * Where cell j of stream s, kv head hk lies in K and in V, for attn_body: a cell index along K's
 * nb[1] (V's cell stride) from the (stream, kv head)'s first value, `first`. A dense window holds
 * stream s's cell j at j, the kv head at nb[2] and the stream at nb[3]; a paged cache's pools
 * hold it in pool cell slot * block_size + j % block_size (slot: table[j / block_size, s]), the
 * kv head hk * head_dim values into the cell (a transposed V: rows hk * head_dim + i).
 */
struct dense_cells {
    int64_t n_kv; /* K's ne[1]: the cells a stream has */
    template <int T>
    __device__ const char * first(const tview & x, int64_t /* chan_stride */, int64_t s, int64_t hk,
                                  int64_t /* d */) const {
        return x.data + hk * x.nb[2] + s * x.nb[3];
    }
    __device__ int64_t cell(int64_t /* s */, int64_t j) const { return j; }
};

struct paged_cells {
    tview table;
    int64_t block_size, n_kv; /* n_kv: the cells the table reaches */
    template <int T>
    __device__ const char * first(const tview & x, int64_t chan_stride, int64_t /* s */, int64_t hk,
                                  int64_t d) const {
        return x.data + hk * d / (T == FERRY_TYPE_Q8_0 ? 32 : 1) * chan_stride;
    }
    __device__ int64_t cell(int64_t s, int64_t j) const {
        const int32_t slot = *(const int32_t *) (table.data + (j / block_size) * table.nb[0] + s * table.nb[1]);
        return (int64_t) slot * block_size + j % block_size;
    }
};

/*
 * One block per (query head, stream, query token), cells where Cells says. Token t of n_tok reads
 * the stream's first len - n_tok + t + 1 cells (causal within the step's new tokens): the work of a
 * one-token step at that length, in the same order, so its bytes are that step's. Warp w takes
 * cells w, w + ATTN_WARPS, ... below that count, in order, keeping a running max m, sum l and
 * output acc (online softmax); lanes split head_dim. The warps' partial results are then
 * combined in warp order. Cells past the token's count are never read. A stream shorter
 * than n_tok (but not 0) has no such count: the host refuses it before a run (the scheduler's
 * check, ferry_attn_paged_check); a device cannot refuse, so its rows are NaN rather than a
 * plausible answer.
 */
/* e^(x - m) against a running or combined maximum m, exactly 1 where x is m (as expf(0) is): a
 * maximum that overflowed to inf gives its cells the whole weight, the limit of a growing scale,
 * where inf - inf would make the row NaN (the CPU kernel's exp_below). */
static __device__ __forceinline__ float exp_below(float x, float m) { return x == m ? 1.0f : expf(x - m); }

template <int TK, int TV, class Cells>
static __device__ __forceinline__ void attn_body(const tview & q, const tview & k, const tview & v, const tview & len,
                                                 char * out, int64_t out_nb0, int64_t out_nb1, int64_t out_nb2,
                                                 int64_t out_nb3, float scale, int v_trans, int64_t group,
                                                 const Cells & cells) {
    extern __shared__ float sh[];
    const int64_t d = q.ne[0], n_kv = cells.n_kv, n_tok = q.ne[2];
    const int64_t h = blockIdx.x, s = blockIdx.y, t = blockIdx.z, hk = h / group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float * qs = sh;
    float * acc = qs + d; /* [ATTN_WARPS][d] */
    float * wm = acc + ATTN_WARPS * d;
    float * wl = wm + ATTN_WARPS;

    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        qs[i] = *(const float *) (q.data + i * q.nb[0] + h * q.nb[1] + t * q.nb[2] + s * q.nb[3]);
    }
    for (int64_t i = lane; i < d; i += 32) {
        acc[warp * d + i] = 0.0f;
    }
    const int32_t len32 = *(const int32_t *) (len.data + s * len.nb[0]);
    const int64_t clamped = len32 < 0 ? 0 : (len32 > n_kv ? n_kv : len32);
    const bool too_short = clamped > 0 && clamped < n_tok;
    const int64_t n = clamped > 0 && !too_short ? clamped - n_tok + t + 1 : 0;
    __syncthreads();

    /* a transposed V steps cells along nb[0], channels along nb[1] */
    const int64_t v_cell = v_trans ? v.nb[0] : v.nb[1];
    const int64_t v_chan = v_trans ? v.nb[1] : v.nb[0];
    const char * kbase = cells.template first<TK>(k, k.nb[0], s, hk, d);
    const char * vbase = cells.template first<TV>(v, v_chan, s, hk, d);
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = warp; j < n; j += ATTN_WARPS) {
        const int64_t cell = cells.cell(s, j);
        const char * krow = kbase + cell * k.nb[1];
        float part = 0.0f;
        for (int64_t i = lane; i < d; i += 32) {
            part += qs[i] * load_elem<TK>(krow, i, k.nb[0]);
        }
        const float sc = scale * warp_sum(part);
        const float m_new = fmaxf(m, sc);
        const float c = exp_below(m, m_new); /* 0 on the first cell: m is -inf */
        const float p = exp_below(sc, m_new);
        l = l * c + p;
        const char * vrow = vbase + cell * v_cell;
        for (int64_t i = lane; i < d; i += 32) {
            acc[warp * d + i] = acc[warp * d + i] * c + p * load_elem<TV>(vrow, i, v_chan);
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l; /* 0 for a warp that had no cell */
    }
    __syncthreads();

    float big = -INFINITY, sum = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++) {
        big = wl[w] > 0.0f ? fmaxf(big, wm[w]) : big;
    }
    for (int w = 0; w < ATTN_WARPS; w++) {
        sum += wl[w] > 0.0f ? wl[w] * exp_below(wm[w], big) : 0.0f;
    }
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            o += wl[w] > 0.0f ? acc[w * d + i] * exp_below(wm[w], big) : 0.0f;
        }
        *(float *) (out + i * out_nb0 + h * out_nb1 + t * out_nb2 + s * out_nb3) =
            too_short ? NAN : n > 0 ? o / sum : 0.0f;
    }
}

/* attn_body over a dense window (the fake runtime reads these arguments by position) */
template <int TK, int TV>
static __global__ void attn_decode_kernel(tview q, tview k, tview v, tview len, char * out, int64_t out_nb0,
                                          int64_t out_nb1, int64_t out_nb2, int64_t out_nb3, float scale,
                                          int v_trans, int64_t group) {
    attn_body<TK, TV>(q, k, v, len, out, out_nb0, out_nb1, out_nb2, out_nb3, scale, v_trans, group,
                      dense_cells{k.ne[1]});
}

static bool attn_kv_type(ferry_type t) { return t == FERRY_TYPE_F32 || t == FERRY_TYPE_F16 || t == FERRY_TYPE_Q8_0; }

/* Query tokens are the grid's third dimension: at most 65535 of them, as streams. */
static bool attn_supported(const ferry_tensor * node) {
    const ferry_tensor * q = node->src[0];
    const ferry_tensor * k = node->src[1];
    const ferry_tensor * v = node->src[2];
    const ferry_tensor * len = node->src[3];
    return node->type == FERRY_TYPE_F32 && q && k && v && len && q->type == FERRY_TYPE_F32 && attn_kv_type(k->type) &&
           attn_kv_type(v->type) && !(node->op_params[1] && v->type == FERRY_TYPE_Q8_0) &&
           len->type == FERRY_TYPE_I32 && q->ne[0] <= ATTN_MAX_HEAD_DIM && q->ne[1] <= INT32_MAX &&
           q->ne[2] <= 65535 && q->ne[3] <= 65535;
}

/* f with a kv type as a compile-time constant (std::integral_constant): f32, f16 or q8_0. */
template <class F> static void with_kv_type(ferry_type t, F && f) {
    switch (t) {
        case FERRY_TYPE_F32: f(std::integral_constant<int, FERRY_TYPE_F32>{}); break;
        case FERRY_TYPE_F16: f(std::integral_constant<int, FERRY_TYPE_F16>{}); break;
        default: f(std::integral_constant<int, FERRY_TYPE_Q8_0>{}); break;
    }
}

/* f(tk, tv) with K's and V's types as constants: a kernel's launch for each pair attention reads. */
template <class F> static void with_kv_types(ferry_type tk, ferry_type tv, F && f) {
    with_kv_type(tk, [&](auto k) { with_kv_type(tv, [&](auto v) { f(k, v); }); });
}

static ferry_status attn_decode(ferry_tensor * dst, cudaStream_t stream) {
    FERRY_TRY(check_aligned(dst, "attn_decode"));
    for (int i = 0; i < 4; i++) {
        FERRY_TRY(check_aligned(dst->src[i], "attn_decode"));
    }
    const tview q = view_of(dst->src[0]), k = view_of(dst->src[1]), v = view_of(dst->src[2]),
                len = view_of(dst->src[3]);
    float scale;
    memcpy(&scale, &dst->op_params[0], sizeof(scale));
    const int v_trans = dst->op_params[1] != 0;
    const int64_t group = q.ne[1] / k.ne[2];
    const dim3 grid((unsigned) q.ne[1], (unsigned) q.ne[3], (unsigned) q.ne[2]);
    const size_t shmem = (size_t) ((ATTN_WARPS + 1) * q.ne[0] + 2 * ATTN_WARPS) * sizeof(float);
    char * out = (char *) ferry_tensor_data(dst);
    with_kv_types(dst->src[1]->type, dst->src[2]->type, [&](auto tk, auto tv) {
        attn_decode_kernel<decltype(tk)::value, decltype(tv)::value><<<grid, dim3(32 * ATTN_WARPS), shmem, stream>>>(
            q, k, v, len, out, dst->nb[0], dst->nb[1], dst->nb[2], dst->nb[3], scale, v_trans, group);
    });
    return launch_status("attn_decode: kernel launch");
}

/* ---------------------------------------------------------------- dup */

enum { DUP_SAME = 0, DUP_F32_TO_F16 = 1, DUP_F16_TO_F32 = 2 };

/*
 * One thread per destination element (per block of a quantized row), grid-stride.
 * Same type: the element's bytes move whole, in words of `word` bytes (4, 2 or 1: what
 * the unit and both tensors' alignment allow); f32 <-> f16 converts with round to
 * nearest even.
 */
static __global__ void dup_kernel(tview src, tview dst, int mode, int64_t n0, int64_t n, int64_t unit, int64_t word) {
    for (int64_t idx = blockIdx.x * (int64_t) blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t) gridDim.x * blockDim.x) {
        const int64_t i0 = idx % n0, r = idx / n0;
        const int64_t i1 = r % dst.ne[1], i2 = (r / dst.ne[1]) % dst.ne[2], i3 = r / dst.ne[1] / dst.ne[2];
        const char * s = src.data + i0 * src.nb[0] + i1 * src.nb[1] + i2 * src.nb[2] + i3 * src.nb[3];
        char * o = (char *) dst.data + i0 * dst.nb[0] + i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3];
        if (mode == DUP_F32_TO_F16) {
            *(uint16_t *) o = __half_as_ushort(__float2half_rn(*(const float *) s));
        } else if (mode == DUP_F16_TO_F32) {
            *(float *) o = half_bits_to_float(*(const uint16_t *) s);
        } else if (word == 4) {
            for (int64_t b = 0; b < unit; b += 4) *(uint32_t *) (o + b) = *(const uint32_t *) (s + b);
        } else if (word == 2) { /* f16, bf16, q8_0 and q4_0 blocks (34 and 18 bytes) */
            for (int64_t b = 0; b < unit; b += 2) *(uint16_t *) (o + b) = *(const uint16_t *) (s + b);
        } else {
            for (int64_t b = 0; b < unit; b++) o[b] = s[b];
        }
    }
}

static bool dup_supported(const ferry_tensor * node) {
    const ferry_tensor * a = node->src[0];
    if (!a) {
        return false;
    }
    if (a->type == node->type) { /* quantized rows only as whole blocks along dimension 0, as on the CPU */
        const size_t size = ferry_type_size(a->type);
        return ferry_blck_size(a->type) == 1 || (a->nb[0] == size && node->nb[0] == size);
    }
    return (a->type == FERRY_TYPE_F32 && node->type == FERRY_TYPE_F16) ||
           (a->type == FERRY_TYPE_F16 && node->type == FERRY_TYPE_F32);
}

static ferry_status dup(ferry_tensor * dst, cudaStream_t stream) {
    const ferry_tensor * a = dst->src[0];
    const int mode = a->type == dst->type ? DUP_SAME : (a->type == FERRY_TYPE_F32 ? DUP_F32_TO_F16 : DUP_F16_TO_F32);
    const int64_t n0 = dst->ne[0] / ferry_blck_size(dst->type);
    const int64_t n = n0 * dst->ne[1] * dst->ne[2] * dst->ne[3];
    if (n == 0) {
        return FERRY_OK;
    }
    const int64_t unit = (int64_t) ferry_type_size(dst->type);
    int64_t word = 1;
    if (mode == DUP_SAME) {
        const int64_t align = alignment_of(a) < alignment_of(dst) ? alignment_of(a) : alignment_of(dst);
        word = unit % 4 == 0 && align == 4 ? 4 : unit % 2 == 0 && align % 2 == 0 ? 2 : 1;
    } else {
        FERRY_TRY(check_aligned(a, "dup"));
        FERRY_TRY(check_aligned(dst, "dup"));
    }
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    dup_kernel<<<(unsigned) (blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(
        view_of(a), view_of(dst), mode, n0, n, unit, word);
    return launch_status("dup: kernel launch");
}

/* ---------------------------------------------------------------- paged attention */

/* attn_body through a block table into the pools (the fake runtime reads these arguments by
 * position). The host checked every entry a length reaches (ferry_attn_paged_check) before the
 * launch, and that no length is below n_tok. */
template <int TK, int TV>
static __global__ void attn_paged_kernel(tview q, tview k, tview v, tview len, tview table, char * out,
                                         int64_t out_nb0, int64_t out_nb1, int64_t out_nb2, int64_t out_nb3,
                                         float scale, int v_trans, int64_t group, int64_t block_size) {
    attn_body<TK, TV>(q, k, v, len, out, out_nb0, out_nb1, out_nb2, out_nb3, scale, v_trans, group,
                      paged_cells{table, block_size, table.ne[0] * block_size});
}

/* Several query tokens too (grid z); streams and tokens up to a grid dimension's 65535. */
static bool attn_paged_supported(const ferry_tensor * node) {
    const ferry_tensor * q = node->src[0];
    const ferry_tensor * k = node->src[1];
    const ferry_tensor * v = node->src[2];
    const ferry_tensor * len = node->src[3];
    const ferry_tensor * table = node->src[4];
    return node->type == FERRY_TYPE_F32 && q && k && v && len && table && q->type == FERRY_TYPE_F32 &&
           attn_kv_type(k->type) && attn_kv_type(v->type) && !(node->op_params[1] && v->type == FERRY_TYPE_Q8_0) &&
           len->type == FERRY_TYPE_I32 && table->type == FERRY_TYPE_I32 && q->ne[0] <= ATTN_MAX_HEAD_DIM &&
           q->ne[1] <= INT32_MAX && q->ne[2] <= 65535 && q->ne[3] <= 65535;
}

/* The bytes of t from its first to its last element, read to the host (t lies where the device
 * reads it) after what the stream queued before. */
static ferry_status read_to_host(const ferry_tensor * t, cudaStream_t stream, void ** out) {
    size_t span = ferry_type_size(t->type);
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        span += (size_t) (t->ne[i] - 1) * t->nb[i];
    }
    *out = ferry_malloc(span);
    if (!*out) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "attn_paged: out of memory for %zu bytes of '%s'", span, t->name);
    }
    cudaError_t err = cudaMemcpyAsync(*out, ferry_tensor_data(t), span, cudaMemcpyDefault, stream);
    if (err == cudaSuccess) {
        err = cudaStreamSynchronize(stream);
    }
    if (err != cudaSuccess) {
        free(*out);
        *out = NULL;
        return ferry_cuda_fail(err, "attn_paged: reading kv_len and the table");
    }
    return FERRY_OK;
}

/* kv_len and the table are read to the host and checked first (a sync on the stream), so that
 * no entry leads the kernel out of the pools and a refusal writes nothing, as on the CPU. */
static ferry_status attn_paged(ferry_tensor * dst, cudaStream_t stream) {
    FERRY_TRY(check_aligned(dst, "attn_paged"));
    for (int i = 0; i < 5; i++) {
        FERRY_TRY(check_aligned(dst->src[i], "attn_paged"));
    }
    void *lens = NULL, *table = NULL;
    ferry_status st = read_to_host(dst->src[3], stream, &lens);
    if (st == FERRY_OK) st = read_to_host(dst->src[4], stream, &table);
    if (st == FERRY_OK) st = ferry_attn_paged_check(dst, lens, table);
    free(lens);
    free(table);
    FERRY_TRY(st);
    const ferry_tensor * q = dst->src[0];
    float scale;
    memcpy(&scale, &dst->op_params[0], sizeof(scale));
    const int v_trans = dst->op_params[1] != 0;
    const int64_t block_size = dst->op_params[2];
    const int64_t group = q->ne[1] / (dst->src[1]->ne[0] / q->ne[0]);
    const dim3 grid((unsigned) q->ne[1], (unsigned) q->ne[3], (unsigned) q->ne[2]);
    const size_t shmem = (size_t) ((ATTN_WARPS + 1) * q->ne[0] + 2 * ATTN_WARPS) * sizeof(float);
    with_kv_types(dst->src[1]->type, dst->src[2]->type, [&](auto tk, auto tv) {
        attn_paged_kernel<decltype(tk)::value, decltype(tv)::value><<<grid, dim3(32 * ATTN_WARPS), shmem, stream>>>(
            view_of(dst->src[0]), view_of(dst->src[1]), view_of(dst->src[2]), view_of(dst->src[3]),
            view_of(dst->src[4]), (char *) ferry_tensor_data(dst), (int64_t) dst->nb[0], (int64_t) dst->nb[1],
            (int64_t) dst->nb[2], (int64_t) dst->nb[3], scale, v_trans, group, block_size);
    });
    return launch_status("attn_paged: kernel launch");
}

/* ---------------------------------------------------------------- dispatch */

static bool computes_nothing(ferry_op op) {
    return op == FERRY_OP_NONE || op == FERRY_OP_VIEW || op == FERRY_OP_RESHAPE || op == FERRY_OP_PERMUTE ||
           op == FERRY_OP_TRANSPOSE;
}

bool ferry_cuda_op_supported(const ferry_tensor * node) {
    if (computes_nothing(node->op)) {
        return true;
    }
    switch (node->op) {
        case FERRY_OP_ATTN_DECODE: return attn_supported(node);
        case FERRY_OP_DUP: return dup_supported(node);
        case FERRY_OP_ATTN_PAGED: return attn_paged_supported(node);
        default: return false;
    }
}

ferry_status ferry_cuda_compute_node(ferry_tensor * node, cudaStream_t stream) {
    if (computes_nothing(node->op)) {
        return FERRY_OK;
    }
    if (!ferry_cuda_op_supported(node)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "compute: the CUDA kernels do not do %s of %s ('%s')",
                          ferry_op_name(node->op) ? ferry_op_name(node->op) : "?", ferry_type_name(node->type),
                          node->name);
    }
    switch (node->op) {
        case FERRY_OP_ATTN_DECODE: return attn_decode(node, stream);
        case FERRY_OP_DUP: return dup(node, stream);
        case FERRY_OP_ATTN_PAGED: return attn_paged(node, stream);
        default: return FERRY_OK;
    }
}
