/*
 * The CPU kernel of decode attention (ferry_attn_decode in ops.c builds the node), and of paged
 * attention (ferry_attn_paged), the same kernel reading K and V through a block table (kv_cells).
 *
 * Work goes by (stream, kv head): each K or V row of that pair is converted to f32 once
 * and used by every query head of the group, of every query token of the step (token t
 * of n_tok reads the stream's cells [0, len - n_tok + t]: causal within the new tokens). Only cells below the stream's length are
 * read, and only through K's and V's ne/nb, so whatever lies in the gaps of a window or
 * past a stream's length (NaN in the tests) cannot reach the output.
 *
 * Arithmetic is f32 in a fixed order, so the same bytes in give the same bytes out:
 * dot products over head_dim (scores) and over cells (transposed V) sum 8 lanes
 * i, i+8, ... each in order and then add the lanes in one fixed tree; the softmax
 * subtracts the row's maximum and sums its exponentials cell by cell; the output of
 * untransposed V adds p_j * v_j cell by cell. Each query token's arithmetic is that of
 * a one-token step at its own length, in the same order: the same bytes. f32 is enough: the tests hold it to
 * a float64 reference within 2e-6, relative to 1 + |value|.
 */
#include "cpu-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* V rows a query's sums take in one pass (the kernel below spells out four) */
#define V_BLOCK 4

/* f16 bits to f32, inline because it runs once per K/V element: the exponent field
 * moves up by 13 bits and a multiply by 2^112 rebiases it (subnormals come out right
 * too); all-ones exponents (inf, NaN) get the f32 all-ones exponent. */
static inline float half_to_float(uint16_t h) {
    const uint32_t em = h & 0x7fffu;
    uint32_t bits = em << 13;
    float f;
    memcpy(&f, &bits, sizeof(f));
    f *= 0x1p112f;
    memcpy(&bits, &f, sizeof(bits));
    bits |= (0u - (uint32_t) (em >= 0x7c00u)) & 0x7f800000u; /* a mask, not a branch: the loops vectorize */
    bits |= (uint32_t) (h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* n values of a K/V row (or of a transposed V channel) as f32. stride is the byte step
 * from one element (one q8_0 block) to the next: nb[0] for rows, nb[0] of a transposed V
 * along its cells. The type switch is outside the loops. */
static void load_row(ferry_type type, const char * p, size_t stride, int64_t n, float * dst) {
    switch (type) {
        case FERRY_TYPE_F32:
            if (stride == sizeof(float)) {
                memcpy(dst, p, (size_t) n * sizeof(float));
            } else {
                for (int64_t i = 0; i < n; i++) {
                    memcpy(&dst[i], p + (size_t) i * stride, sizeof(float));
                }
            }
            break;
        case FERRY_TYPE_F16:
            if (stride == sizeof(uint16_t)) { /* the usual row: contiguous, so it vectorizes */
                const uint16_t * h = (const uint16_t *) (const void *) p;
                for (int64_t i = 0; i < n; i++) {
                    dst[i] = half_to_float(h[i]);
                }
                break;
            }
            for (int64_t i = 0; i < n; i++) {
                uint16_t h;
                memcpy(&h, p + (size_t) i * stride, sizeof(h));
                dst[i] = half_to_float(h);
            }
            break;
        case FERRY_TYPE_Q8_0: /* blocks of an f16 scale d and 32 int8: value = d * q */
            for (int64_t b = 0; b < n / 32; b++) {
                const char * blk = p + (size_t) b * stride;
                uint16_t h;
                memcpy(&h, blk, sizeof(h));
                const float d = half_to_float(h);
                const int8_t * qs = (const int8_t *) (blk + 2);
                for (int i = 0; i < 32; i++) {
                    dst[b * 32 + i] = d * (float) qs[i];
                }
            }
            break;
        default:
            break; /* refused by ferry_cpu_attn_supported */
    }
}

/* e^(x - m) for a score x against its row's maximum m, exactly 1 where x is m (as expf(0) is): a
 * maximum that overflowed to inf gives its cells the whole weight, the limit of a growing scale,
 * where inf - inf would make every output NaN. */
static inline float exp_below(float x, float m) { return x == m ? 1.0f : expf(x - m); }

/* Eight lanes, each summed in order, then a fixed tree: vectorizes, and never varies. */
static inline float dot(const float * a, const float * b, int64_t n) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int l = 0; l < 8; l++) {
            lane[l] += a[i + l] * b[i + l];
        }
    }
    float tail = 0.0f;
    for (; i < n; i++) {
        tail += a[i] * b[i];
    }
    return (((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]))) + tail;
}

static bool kv_type_ok(ferry_type t) { return t == FERRY_TYPE_F32 || t == FERRY_TYPE_F16 || t == FERRY_TYPE_Q8_0; }

bool ferry_cpu_attn_supported(const ferry_tensor * node) {
    const ferry_tensor * q = node->src[0];
    const ferry_tensor * k = node->src[1];
    const ferry_tensor * v = node->src[2];
    const ferry_tensor * len = node->src[3];
    const bool table_ok = node->op != FERRY_OP_ATTN_PAGED || (node->src[4] && node->src[4]->type == FERRY_TYPE_I32);
    return node->type == FERRY_TYPE_F32 && q && k && v && len && q->type == FERRY_TYPE_F32 && kv_type_ok(k->type) &&
           kv_type_ok(v->type) && !(node->op_params[1] && v->type == FERRY_TYPE_Q8_0) && len->type == FERRY_TYPE_I32 &&
           table_ok;
}

static const char * at(const ferry_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (const char *) t->data + (size_t) i0 * t->nb[0] + (size_t) i1 * t->nb[1] + (size_t) i2 * t->nb[2] +
           (size_t) i3 * t->nb[3];
}

/* The length of stream s as the kernel reads it: clamped to 0..n_kv. */
static int64_t stream_length(const ferry_tensor * kv_len, int64_t s, int64_t n_kv) {
    int32_t len32;
    memcpy(&len32, at(kv_len, s, 0, 0, 0), sizeof(len32));
    return len32 < 0 ? 0 : (len32 > n_kv ? n_kv : len32);
}

/*
 * Where the kernel finds cell j of a stream's K and V: in a dense window at its strides
 * (attn_decode), or through the stream's block table in a paged cache's pools (attn_paged). The
 * arithmetic is the same code for both; only these addresses differ, so the paged op's output
 * is the dense one's, byte for byte, over the window the paged cache's gather would build.
 */
typedef struct {
    const ferry_tensor * k, * v;
    const ferry_tensor * table; /* NULL: a dense window */
    int64_t block_size;
    int64_t d;       /* head_dim */
    int64_t n_kv;    /* the cells a stream may have: the window's, or the table's blocks' */
    int64_t n_head_kv;
    bool v_trans;
} kv_cells;

static kv_cells kv_cells_of(const ferry_tensor * dst) {
    const ferry_tensor * k = dst->src[1];
    kv_cells c = {.k = k, .v = dst->src[2], .d = dst->src[0]->ne[0], .v_trans = dst->op_params[1] != 0};
    if (dst->op == FERRY_OP_ATTN_PAGED) {
        c.table = dst->src[4];
        c.block_size = dst->op_params[2];
        c.n_kv = c.table->ne[0] * c.block_size;
        c.n_head_kv = k->ne[0] / c.d;
    } else {
        c.n_kv = k->ne[1];
        c.n_head_kv = k->ne[2];
    }
    return c;
}

/* Stream s's i-th block's slot (paged only). */
static int32_t slot_of(const kv_cells * c, int64_t i, int64_t s) {
    int32_t slot;
    memcpy(&slot, at(c->table, i, s, 0, 0), sizeof(slot));
    return slot;
}

/* The pool cell holding cell j of stream s: its block's slot's. */
static int64_t pool_cell(const kv_cells * c, int64_t j, int64_t s) {
    return (int64_t) slot_of(c, j / c->block_size, s) * c->block_size + j % c->block_size;
}

/* The byte offset of kv head hk's first value within a pool cell: hk * head_dim values on. */
static size_t head_offset(const ferry_tensor * pool, const kv_cells * c, int64_t hk, size_t nb_value) {
    return (size_t) (hk * c->d / ferry_blck_size(pool->type)) * nb_value;
}

/* K's row of cell j, kv head hk, stream s. */
static const char * k_row(const kv_cells * c, int64_t j, int64_t hk, int64_t s) {
    if (!c->table) {
        return at(c->k, 0, j, hk, s);
    }
    return (const char *) c->k->data + (size_t) pool_cell(c, j, s) * c->k->nb[1] + head_offset(c->k, c, hk, c->k->nb[0]);
}

/* V's row of cell j (V not transposed). */
static const char * v_row(const kv_cells * c, int64_t j, int64_t hk, int64_t s) {
    if (!c->table) {
        return at(c->v, 0, j, hk, s);
    }
    return (const char *) c->v->data + (size_t) pool_cell(c, j, s) * c->v->nb[1] + head_offset(c->v, c, hk, c->v->nb[0]);
}

/* Channel i of kv head hk over a transposed V's first len cells, as f32 into dst: one row in a
 * window, a piece per block in a pool (each block's cells are adjacent in the channel's row). */
static void load_v_channel(const kv_cells * c, int64_t i, int64_t hk, int64_t s, int64_t len, float * dst) {
    const ferry_tensor * v = c->v;
    if (!c->table) {
        load_row(v->type, at(v, 0, i, hk, s), v->nb[0], len, dst);
        return;
    }
    const char * channel = (const char *) v->data + (size_t) (hk * c->d + i) * v->nb[1];
    for (int64_t j = 0; j < len; j += c->block_size) {
        const int64_t n = len - j < c->block_size ? len - j : c->block_size;
        load_row(v->type, channel + (size_t) pool_cell(c, j, s) * v->nb[0], v->nb[0], n, dst + j);
    }
}

ferry_status ferry_cpu_attn_decode(ferry_tensor * dst) {
    const ferry_tensor * q = dst->src[0];
    const ferry_tensor * kv_len = dst->src[3];
    const kv_cells cells = kv_cells_of(dst);
    const kv_cells * c = &cells;
    const char * what = dst->op == FERRY_OP_ATTN_PAGED ? "attn_paged" : "attn_decode";
    float scale;
    memcpy(&scale, &dst->op_params[0], sizeof(scale));
    const bool v_trans = c->v_trans;
    const int64_t d = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2], ns = q->ne[3];
    const int64_t n_kv = c->n_kv, n_head_kv = c->n_head_kv, group = n_head / n_head_kv;
    /* the queries of one (stream, kv head): every token's query heads of the group, token-major */
    const int64_t n_q = n_tok * group;
    const ferry_tensor * k = c->k;
    const ferry_tensor * v = c->v;
    if (c->table) { /* every entry a length reaches a slot, and every length a cell per token */
        FERRY_TRY(ferry_attn_paged_check(dst, kv_len->data, c->table->data));
    } else {
        /* A window carrying its lengths bounds them by its limit: one outside it is refused, not clamped
         * (a scheduler's run refused it before its copies; this is a window read where it lies). */
        FERRY_TRY(ferry_check_used_lengths(k, false, "attn_decode"));
        /* A stream needs a cell per query token: checked for every stream before any output is written
         * (a scheduler's run refused it before its copies). */
        FERRY_TRY(ferry_attn_check_lengths(dst, "attn_decode"));
    }

    /* scratch: the queries, their sums, V_BLOCK K/V rows, scores then probabilities, a V channel, 1/sums */
    const size_t n_floats = (size_t) (n_q * d) * 2 + (size_t) (V_BLOCK * d) + (size_t) (n_q * n_kv) +
                            (size_t) (n_kv > d ? n_kv : d) + (size_t) n_q;
    float * scratch = ferry_malloc(n_floats * sizeof(float));
    if (!scratch) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu floats of scratch", what, n_floats);
    }
    float * qf = scratch;
    float * acc = qf + n_q * d;
    float * row = acc + n_q * d;
    float * p = row + V_BLOCK * d;
    float * chan = p + n_q * n_kv;
    float * inv_sum = chan + (n_kv > d ? n_kv : d);

    for (int64_t s = 0; s < ns; s++) {
        const int64_t len = stream_length(kv_len, s, n_kv);
        /* token t reads len_t = first + t + 1 cells, and cell j is read by tokens j - first and after */
        const int64_t first = len - n_tok;
        for (int64_t hk = 0; hk < n_head_kv; hk++) {
            for (int64_t t = 0; t < n_tok; t++) {
                for (int64_t g = 0; g < group; g++) {
                    load_row(FERRY_TYPE_F32, at(q, 0, hk * group + g, t, s), q->nb[0], d, qf + (t * group + g) * d);
                }
            }
            memset(acc, 0, (size_t) (n_q * d) * sizeof(float));
            if (len > 0) {
                /* scores: one K row at a time, for every query that reads its cell. Each query's
                 * arithmetic is that of one token over its own length: the same bytes out. */
                for (int64_t j = 0; j < len; j++) {
                    load_row(k->type, k_row(c, j, hk, s), k->nb[0], d, row);
                    for (int64_t qi = (j > first ? j - first : 0) * group; qi < n_q; qi++) {
                        p[qi * len + j] = scale * dot(qf + qi * d, row, d);
                    }
                }
                /* softmax with the maximum subtracted; 1/sum applied at the end */
                for (int64_t qi = 0; qi < n_q; qi++) {
                    const int64_t len_q = first + qi / group + 1;
                    float * pq = p + qi * len;
                    float m = pq[0];
                    for (int64_t j = 1; j < len_q; j++) {
                        m = pq[j] > m ? pq[j] : m;
                    }
                    float sum = 0.0f;
                    for (int64_t j = 0; j < len_q; j++) {
                        pq[j] = exp_below(pq[j], m);
                        sum += pq[j];
                    }
                    inv_sum[qi] = 1.0f / sum;
                }
                if (!v_trans) {
                    /* The cells every query reads (0..first), V_BLOCK at a time: each query still adds
                     * them cell by cell in order (the same bytes), reading and writing its sums once
                     * per block rather than once per cell. */
                    int64_t j = 0;
                    for (; j + V_BLOCK <= first + 1; j += V_BLOCK) {
                        for (int b = 0; b < V_BLOCK; b++) {
                            load_row(v->type, v_row(c, j + b, hk, s), v->nb[0], d, row + b * d);
                        }
                        for (int64_t qi = 0; qi < n_q; qi++) {
                            const float * pq = p + qi * len + j;
                            const float p0 = pq[0], p1 = pq[1], p2 = pq[2], p3 = pq[3];
                            const float * r0 = row;
                            const float * r1 = row + d;
                            const float * r2 = row + 2 * d;
                            const float * r3 = row + 3 * d;
                            float * aq = acc + qi * d;
                            for (int64_t i = 0; i < d; i++) {
                                aq[i] = (((aq[i] + p0 * r0[i]) + p1 * r1[i]) + p2 * r2[i]) + p3 * r3[i];
                            }
                        }
                    }
                    for (; j < len; j++) {
                        load_row(v->type, v_row(c, j, hk, s), v->nb[0], d, row);
                        for (int64_t qi = (j > first ? j - first : 0) * group; qi < n_q; qi++) {
                            const float pj = p[qi * len + j];
                            float * aq = acc + qi * d;
                            for (int64_t i = 0; i < d; i++) {
                                aq[i] += pj * row[i];
                            }
                        }
                    }
                } else {
                    /* transposed: a channel's cells lie along dimension 0, so read it as a row of len */
                    for (int64_t i = 0; i < d; i++) {
                        load_v_channel(c, i, hk, s, len, chan);
                        for (int64_t qi = 0; qi < n_q; qi++) {
                            acc[qi * d + i] = dot(p + qi * len, chan, first + qi / group + 1);
                        }
                    }
                }
                for (int64_t qi = 0; qi < n_q; qi++) {
                    for (int64_t i = 0; i < d; i++) {
                        acc[qi * d + i] *= inv_sum[qi];
                    }
                }
            }
            for (int64_t t = 0; t < n_tok; t++) {
                for (int64_t g = 0; g < group; g++) {
                    char * out = (char *) at(dst, 0, hk * group + g, t, s);
                    const float * aq = acc + (t * group + g) * d;
                    for (int64_t i = 0; i < d; i++) {
                        memcpy(out + (size_t) i * dst->nb[0], &aq[i], sizeof(float));
                    }
                }
            }
        }
    }
    free(scratch);
    return FERRY_OK;
}
