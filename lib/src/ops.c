/* Op constructors: check the sources' shapes, infer the result's, record the op.
 * Results are new contiguous tensors; the views live in tensor.c. */
#include "ferry-impl.h"
#include "graph-impl.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

const char * ferry_op_name(ferry_op op) {
    static const char * const names[FERRY_OP_COUNT] = {
        "none", "view", "reshape", "permute", "transpose", "add", "mul",
        "scale", "dup", "concat", "pad", "mean", "attn_decode", "attn_paged",
    };
    if ((int) op < 0 || op >= FERRY_OP_COUNT) {
        ferry_fail(FERRY_ERR_INVALID_ARG, "unknown op %d", (int) op);
        return NULL;
    }
    return names[op];
}

/* Tensors are often unnamed; say which operand in that case. */
static const char * nm(const ferry_tensor * t, const char * fallback) { return t->name[0] ? t->name : fallback; }

bool ferry_op_is_view(ferry_op op) {
    return op == FERRY_OP_VIEW || op == FERRY_OP_RESHAPE || op == FERRY_OP_PERMUTE || op == FERRY_OP_TRANSPOSE;
}

bool ferry_op_can_inplace(ferry_op op) { return op == FERRY_OP_ADD || op == FERRY_OP_MUL || op == FERRY_OP_SCALE; }

/* A contiguous result of the given type and shape, recording op and sources. */
static ferry_status new_result(ferry_context * ctx, ferry_type type, const int64_t * ne, ferry_op op,
                               ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out) {
    size_t bytes = 0;
    FERRY_TRY(ferry_row_size(type, ne[0], &bytes));
    for (int i = 1; i < FERRY_MAX_DIMS; i++) {
        if (!ferry_mul_ok(bytes, (size_t) ne[i], &bytes) || bytes > (size_t) INT64_MAX) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the result's byte size overflows", ferry_op_name(op));
        }
    }
    FERRY_TRY(ferry_check_element_count(ne, FERRY_MAX_DIMS, ferry_op_name(op)));
    ferry_tensor * t;
    FERRY_TRY(ferry_tensor_alloc_struct(ctx, type, &t));
    memcpy(t->ne, ne, sizeof(t->ne));
    ferry_tensor_set_contiguous_strides(t);
    t->op = op;
    t->src[0] = a;
    t->src[1] = b;
    *out = t;
    return FERRY_OK;
}

static ferry_status binary(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_op op,
                           ferry_tensor ** out) {
    const char * what = ferry_op_name(op);
    FERRY_CHECK_ARG(ctx && a && b && out, "%s: NULL argument", what);
    if (a->type != b->type) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: '%s' is %s but '%s' is %s", what, nm(a, "a"),
                          ferry_type_name(a->type), nm(b, "b"), ferry_type_name(b->type));
    }
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (b->ne[i] == 0 ? a->ne[i] != 0 : a->ne[i] % b->ne[i] != 0) {
            return ferry_fail(FERRY_ERR_LAYOUT,
                              "%s: '%s' [%lld, %lld, %lld, %lld] cannot be repeated over '%s' [%lld, %lld, %lld, %lld]",
                              what, nm(b, "b"), (long long) b->ne[0], (long long) b->ne[1], (long long) b->ne[2],
                              (long long) b->ne[3], nm(a, "a"), (long long) a->ne[0], (long long) a->ne[1],
                              (long long) a->ne[2], (long long) a->ne[3]);
        }
    }
    return new_result(ctx, a->type, a->ne, op, a, b, out);
}

ferry_status ferry_add(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out) {
    return binary(ctx, a, b, FERRY_OP_ADD, out);
}

ferry_status ferry_mul(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, ferry_tensor ** out) {
    return binary(ctx, a, b, FERRY_OP_MUL, out);
}

ferry_status ferry_scale(ferry_context * ctx, ferry_tensor * a, float s, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && out, "scale: NULL argument");
    FERRY_TRY(new_result(ctx, a->type, a->ne, FERRY_OP_SCALE, a, NULL, out));
    memcpy(&(*out)->op_params[0], &s, sizeof(s));
    return FERRY_OK;
}

ferry_status ferry_dup_as(ferry_context * ctx, ferry_tensor * a, ferry_type type, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && out, "dup: NULL argument");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "dup: unknown type %d", (int) type);
    }
    if (a->ne[0] % ferry_blck_size(type) != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "dup: rows of %lld values are not whole %s blocks",
                          (long long) a->ne[0], ferry_type_name(type));
    }
    return new_result(ctx, type, a->ne, FERRY_OP_DUP, a, NULL, out);
}

ferry_status ferry_dup(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && out, "dup: NULL argument");
    return ferry_dup_as(ctx, a, a->type, out);
}

ferry_status ferry_concat(ferry_context * ctx, ferry_tensor * a, ferry_tensor * b, int dim, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && b && out, "concat: NULL argument");
    FERRY_CHECK_ARG(dim >= 0 && dim < FERRY_MAX_DIMS, "concat: dim %d is not in 0..3", dim);
    if (a->type != b->type) {
        return ferry_fail(FERRY_ERR_LAYOUT, "concat: '%s' is %s but '%s' is %s", nm(a, "a"),
                          ferry_type_name(a->type), nm(b, "b"), ferry_type_name(b->type));
    }
    int64_t ne[FERRY_MAX_DIMS];
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (i != dim && a->ne[i] != b->ne[i]) {
            return ferry_fail(FERRY_ERR_LAYOUT, "concat along %d: ne[%d] differs ('%s' %lld, '%s' %lld)", dim, i,
                              nm(a, "a"), (long long) a->ne[i], nm(b, "b"), (long long) b->ne[i]);
        }
        if (i == dim && a->ne[i] > INT64_MAX - b->ne[i]) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "concat: ne[%d] overflows", i);
        }
        ne[i] = i == dim ? a->ne[i] + b->ne[i] : a->ne[i];
    }
    if (dim == 0 && ne[0] % ferry_blck_size(a->type) != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "concat: rows are not whole blocks");
    }
    FERRY_TRY(new_result(ctx, a->type, ne, FERRY_OP_CONCAT, a, b, out));
    (*out)->op_params[0] = dim;
    return FERRY_OK;
}

ferry_status ferry_pad(ferry_context * ctx, ferry_tensor * a, int p0, int p1, int p2, int p3, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && out, "pad: NULL argument");
    const int p[FERRY_MAX_DIMS] = {p0, p1, p2, p3};
    int64_t ne[FERRY_MAX_DIMS];
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (p[i] < 0) {
            return ferry_fail(FERRY_ERR_LAYOUT, "pad: p%d = %d is negative", i, p[i]);
        }
        if (a->ne[i] > INT64_MAX - p[i]) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "pad: ne[%d] overflows", i);
        }
        ne[i] = a->ne[i] + p[i];
    }
    if (ne[0] % ferry_blck_size(a->type) != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "pad: rows are not whole blocks");
    }
    FERRY_TRY(new_result(ctx, a->type, ne, FERRY_OP_PAD, a, NULL, out));
    memcpy((*out)->op_params, p, sizeof(p));
    return FERRY_OK;
}

ferry_status ferry_mean(ferry_context * ctx, ferry_tensor * a, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && a && out, "mean: NULL argument");
    if (ferry_blck_size(a->type) != 1) {
        return ferry_fail(FERRY_ERR_LAYOUT, "mean: rows of %s blocks cannot become one value",
                          ferry_type_name(a->type));
    }
    if (a->ne[0] == 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "mean: '%s' has empty rows", nm(a, "a"));
    }
    const int64_t ne[FERRY_MAX_DIMS] = {1, a->ne[1], a->ne[2], a->ne[3]};
    return new_result(ctx, a->type, ne, FERRY_OP_MEAN, a, NULL, out);
}

/* ---------------------------------------------------------------- decode attention */

/* The one list of the types K and V may have: attn_decode's checks, its messages and the binding
 * ask it. */
bool ferry_attn_reads_type(ferry_type type) {
    return type == FERRY_TYPE_F32 || type == FERRY_TYPE_F16 || type == FERRY_TYPE_Q8_0;
}

/* The names of the types attention reads, as a message gives them: "f32, f16 or q8_0". */
static const char * attn_type_names(char * out, size_t size) {
    int n_listed = 0, n = 0;
    for (int t = 0; t < FERRY_TYPE_COUNT; t++) n_listed += ferry_attn_reads_type((ferry_type) t);
    out[0] = '\0';
    for (int t = 0, i = 0; t < FERRY_TYPE_COUNT && n >= 0 && (size_t) n < size; t++) {
        if (ferry_attn_reads_type((ferry_type) t)) {
            const char * sep = i == 0 ? "" : i == n_listed - 1 ? " or " : ", ";
            n += snprintf(out + n, size - (size_t) n, "%s%s", sep, ferry_type_name((ferry_type) t));
            i++;
        }
    }
    return out;
}

/* What a KV window operand looks like: KVCache.window's view, permuted (0, 2, 1, 3). */
#define ATTN_WINDOW "a KV window permuted (0, 2, 1, 3): ne = [head_dim, n_kv, n_head_kv, ns]"

/* Every layout error of attn_decode names the operand at fault, what it got (type, ne and nb)
 * and what it should be. */
static ferry_status attn_shape_error(const char * what, const ferry_tensor * t, const char * want, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static ferry_status operand_error_v(ferry_op op, const char * what, const ferry_tensor * t, const char * want,
                                    va_list ap) {
    char expected[256];
    vsnprintf(expected, sizeof expected, want, ap);
    return ferry_fail(FERRY_ERR_LAYOUT, "%s: %s is %s ne [%lld, %lld, %lld, %lld] nb [%zu, %zu, %zu, %zu]; %s must be %s",
                      ferry_op_name(op), what, ferry_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1],
                      (long long) t->ne[2], (long long) t->ne[3], t->nb[0], t->nb[1], t->nb[2], t->nb[3], what,
                      expected);
}

static ferry_status attn_shape_error(const char * what, const ferry_tensor * t, const char * want, ...) {
    va_list ap;
    va_start(ap, want);
    const ferry_status st = operand_error_v(FERRY_OP_ATTN_DECODE, what, t, want, ap);
    va_end(ap);
    return st;
}

/* Whether k looks like a window not yet permuted, [head_dim, n_head_kv, n_kv, ns]: heads closer
 * together than cells, where a permuted window has cells a whole row of heads apart. */
static bool attn_unpermuted(const ferry_tensor * k) { return k->ne[1] > 1 && k->ne[2] > 1 && k->nb[1] < k->nb[2]; }

static ferry_status attn_check_q_k(const ferry_tensor * q, const ferry_tensor * k, const ferry_tensor * v,
                                   bool v_trans) {
    const int64_t d = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2], ns = q->ne[3];
    if (q->type != FERRY_TYPE_F32 || d <= 0 || n_head <= 0 || n_tok <= 0 || ns <= 0) {
        return attn_shape_error("q", q, "f32 [head_dim, n_head, n_tok, ns], n_tok query tokens per stream, none of "
                                "them 0");
    }
    if (!ferry_attn_reads_type(k->type)) {
        char types[64];
        return attn_shape_error("k", k, "%s, " ATTN_WINDOW, attn_type_names(types, sizeof types));
    }
    if (k->ne[0] != d) {
        const int64_t v_d = v_trans ? v->ne[1] : v->ne[0];
        if (v_d == k->ne[0] && !attn_unpermuted(k)) { /* k and v agree: the query is the odd one out */
            return attn_shape_error("q", q, "f32 [head_dim, n_head, %lld, ns] with the head_dim %lld of k and v",
                                    (long long) n_tok, (long long) k->ne[0]);
        }
        return attn_shape_error("k", k, ATTN_WINDOW ", with q's head_dim %lld", (long long) d);
    }
    if (k->ne[3] != ns) {
        return attn_shape_error("k", k, ATTN_WINDOW ", with q's ns %lld", (long long) ns);
    }
    if (k->ne[2] <= 0) {
        return attn_shape_error("k", k, ATTN_WINDOW ", n_head_kv at least 1");
    }
    if (n_tok > k->ne[1] && !attn_unpermuted(k)) { /* each token reads its own cell, written before the step */
        return attn_shape_error("q", q, "f32 [head_dim, n_head, n_tok, ns] with n_tok at most the window's %lld "
                                "cells (k's n_kv): each query token reads its own cell",
                                (long long) k->ne[1]);
    }
    if (k->type == FERRY_TYPE_Q8_0 && d % ferry_blck_size(k->type) != 0) {
        return attn_shape_error("k", k, "q8_0 rows of whole blocks (head_dim a multiple of 32)");
    }
    if (n_head % k->ne[2] != 0) {
        if (attn_unpermuted(k)) {
            return attn_shape_error("k", k, ATTN_WINDOW "; its ne[2], %lld, does not divide q's %lld query heads, "
                                    "and its strides say it is not permuted", (long long) k->ne[2],
                                    (long long) n_head);
        }
        return ferry_fail(FERRY_ERR_LAYOUT,
                          "attn_decode: q's %lld query heads do not group over %lld kv heads (k's ne[2]); q's n_head "
                          "(ne[1]) must be a multiple of k's n_head_kv", (long long) n_head, (long long) k->ne[2]);
    }
    return FERRY_OK;
}

/*
 * Several query tokens per stream are q's ne[2], not another op: their causal mask follows from
 * kv_len and n_tok (token t reads cells [0, len - n_tok + t]), so no mask operand is needed, one
 * token is the op as it was, and every caller (steps, the scheduler) takes them unchanged.
 * op_params: [0] scale (bits), [1] v_trans. V's orientation is an argument, not read off
 * the shape: [head_dim, n_kv] and [n_kv, head_dim] cannot be told apart when n_kv == head_dim.
 */
ferry_status ferry_attn_decode(ferry_context * ctx, ferry_tensor * q, ferry_tensor * k, ferry_tensor * v,
                               ferry_tensor * kv_len, float scale, bool v_trans, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && q && k && v && kv_len && out, "attn_decode: NULL argument");
    FERRY_TRY(attn_check_q_k(q, k, v, v_trans));
    const int64_t d = q->ne[0], n_head = q->ne[1], ns = q->ne[3], n_kv = k->ne[1], n_head_kv = k->ne[2];
    const int64_t v_d = v_trans ? v->ne[1] : v->ne[0], v_kv = v_trans ? v->ne[0] : v->ne[1];
    if (!ferry_attn_reads_type(v->type) || v_d != d || v_kv != n_kv || v->ne[2] != n_head_kv || v->ne[3] != ns) {
        char types[64];
        return attn_shape_error("v", v,
                                v_trans ? "%sf32 or f16 [n_kv, head_dim, n_head_kv, ns] (v_trans) matching k, "
                                          "[%lld, %lld, %lld, %lld]"
                                        : "%s " ATTN_WINDOW " matching k, [%lld, %lld, %lld, %lld]",
                                v_trans ? "" : attn_type_names(types, sizeof types),
                                (long long) (v_trans ? n_kv : d), (long long) (v_trans ? d : n_kv),
                                (long long) n_head_kv, (long long) ns);
    }
    if (v->type == FERRY_TYPE_Q8_0 && (v_trans || d % ferry_blck_size(v->type) != 0)) {
        return attn_shape_error("v", v, v_trans ? "an unblocked type when transposed (cells would split blocks)"
                                                : "q8_0 rows of whole blocks (head_dim a multiple of 32)");
    }
    if (kv_len->type != FERRY_TYPE_I32 || kv_len->ne[0] != ns || kv_len->ne[1] != 1 || kv_len->ne[2] != 1 ||
        kv_len->ne[3] != 1) {
        return attn_shape_error("kv_len", kv_len, "i32 [ns] with q's ns %lld: the cells each stream reads",
                                (long long) ns);
    }
    const int64_t ne[FERRY_MAX_DIMS] = {d, n_head, q->ne[2], ns};
    FERRY_TRY(new_result(ctx, FERRY_TYPE_F32, ne, FERRY_OP_ATTN_DECODE, q, k, out));
    (*out)->src[2] = v;
    (*out)->src[3] = kv_len;
    memcpy(&(*out)->op_params[0], &scale, sizeof(scale));
    (*out)->op_params[1] = v_trans ? 1 : 0;
    return FERRY_OK;
}

/* ---------------------------------------------------------------- paged attention */

/* What a pool operand looks like: ferry_paged_cache_k's tensor. */
#define ATTN_POOL "[head_dim * n_head_kv, n_slots * block_size, 1, 1], a paged cache's pool (ferry_paged_cache_k)"

static ferry_status paged_shape_error(const char * what, const ferry_tensor * t, const char * want, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static ferry_status paged_shape_error(const char * what, const ferry_tensor * t, const char * want, ...) {
    va_list ap;
    va_start(ap, want);
    const ferry_status st = operand_error_v(FERRY_OP_ATTN_PAGED, what, t, want, ap);
    va_end(ap);
    return st;
}

/* The pools' checks: K's rows are head_dim * n_head_kv values of q's head_dim, its cells whole blocks;
 * V the same cells and channels, either way round. */
static ferry_status paged_check_pools(const ferry_tensor * q, const ferry_tensor * k, const ferry_tensor * v,
                                      int64_t block_size, bool v_trans) {
    const int64_t d = q->ne[0], n_head = q->ne[1];
    char types[64];
    if (!ferry_attn_reads_type(k->type) || k->ne[0] <= 0 || k->ne[0] % d != 0 || k->ne[1] <= 0 ||
        k->ne[1] % block_size != 0 || k->ne[2] != 1 || k->ne[3] != 1) {
        return paged_shape_error("k_pool", k, "%s " ATTN_POOL ", with q's head_dim %lld and block_size %lld",
                                 attn_type_names(types, sizeof types), (long long) d, (long long) block_size);
    }
    const int64_t n_head_kv = k->ne[0] / d;
    if (n_head % n_head_kv != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT,
                          "attn_paged: q's %lld query heads do not group over the %lld kv heads of k_pool's rows "
                          "(%lld values of head_dim %lld); q's n_head (ne[1]) must be a multiple of n_head_kv",
                          (long long) n_head, (long long) n_head_kv, (long long) k->ne[0], (long long) d);
    }
    if (k->type == FERRY_TYPE_Q8_0 && d % ferry_blck_size(k->type) != 0) {
        return paged_shape_error("k_pool", k, "q8_0 heads of whole blocks (head_dim a multiple of 32)");
    }
    const int64_t v_chan = v_trans ? v->ne[1] : v->ne[0], v_cells = v_trans ? v->ne[0] : v->ne[1];
    if (!ferry_attn_reads_type(v->type) || v_chan != k->ne[0] || v_cells != k->ne[1] || v->ne[2] != 1 ||
        v->ne[3] != 1) {
        return paged_shape_error("v_pool", v,
                                 v_trans ? "f32 or f16 [n_slots * block_size, head_dim * n_head_kv, 1, 1] (v_trans: "
                                           "one row per channel) matching k_pool, [%lld, %lld, 1, 1]"
                                         : "of a type attention reads, " ATTN_POOL " matching k_pool, "
                                           "[%lld, %lld, 1, 1]",
                                 (long long) (v_trans ? k->ne[1] : k->ne[0]),
                                 (long long) (v_trans ? k->ne[0] : k->ne[1]));
    }
    if (v->type == FERRY_TYPE_Q8_0 && (v_trans || d % ferry_blck_size(v->type) != 0)) {
        return paged_shape_error("v_pool", v, v_trans ? "an unblocked type when transposed (cells would split blocks)"
                                                      : "q8_0 heads of whole blocks (head_dim a multiple of 32)");
    }
    return FERRY_OK;
}

/*
 * The table is an operand, not op_params: it changes every step (a sequence grows into a new
 * block) while the graph stays, and a backend reads it where it lies, like kv_len. Its slots are
 * checked when computed, for the entries each stream's length reaches, as kv_len's values are.
 * src: [0] q, [1] k_pool, [2] v_pool, [3] kv_len (where attn_decode has it), [4] table.
 * op_params: [0] scale (bits), [1] v_trans, [2] block_size.
 */
ferry_status ferry_attn_paged(ferry_context * ctx, ferry_tensor * q, ferry_tensor * k_pool, ferry_tensor * v_pool,
                              ferry_tensor * table, ferry_tensor * kv_len, int64_t block_size, float scale,
                              bool v_trans, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && q && k_pool && v_pool && table && kv_len && out, "attn_paged: NULL argument");
    const int64_t d = q->ne[0], n_head = q->ne[1], n_tok = q->ne[2], ns = q->ne[3];
    if (q->type != FERRY_TYPE_F32 || d <= 0 || n_head <= 0 || n_tok <= 0 || ns <= 0) {
        return paged_shape_error("q", q, "f32 [head_dim, n_head, n_tok, ns], n_tok query tokens per stream, none of "
                                 "them 0");
    }
    FERRY_CHECK_ARG(block_size > 0 && block_size <= INT32_MAX, "attn_paged: block_size %lld is not in 1..%d",
                    (long long) block_size, INT32_MAX);
    FERRY_TRY(paged_check_pools(q, k_pool, v_pool, block_size, v_trans));
    if (table->type != FERRY_TYPE_I32 || table->ne[0] <= 0 || table->ne[1] != ns || table->ne[2] != 1 ||
        table->ne[3] != 1) {
        return paged_shape_error("table", table, "i32 [max_blocks, ns] with q's ns %lld: each stream's slots, "
                                 "block by block", (long long) ns);
    }
    if (table->ne[0] > INT64_MAX / block_size) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "attn_paged: table's %lld blocks of %lld cells overflow",
                          (long long) table->ne[0], (long long) block_size);
    }
    const int64_t n_kv = table->ne[0] * block_size;
    if (n_tok > n_kv) { /* each token reads its own cell, written before the step */
        return paged_shape_error("q", q, "f32 [head_dim, n_head, n_tok, ns] with n_tok at most the %lld cells the "
                                 "table's %lld blocks reach: each query token reads its own cell",
                                 (long long) n_kv, (long long) table->ne[0]);
    }
    if (kv_len->type != FERRY_TYPE_I32 || kv_len->ne[0] != ns || kv_len->ne[1] != 1 || kv_len->ne[2] != 1 ||
        kv_len->ne[3] != 1) {
        return paged_shape_error("kv_len", kv_len, "i32 [ns] with q's ns %lld: the cells each stream reads",
                                 (long long) ns);
    }
    const int64_t ne[FERRY_MAX_DIMS] = {d, n_head, n_tok, ns};
    FERRY_TRY(new_result(ctx, FERRY_TYPE_F32, ne, FERRY_OP_ATTN_PAGED, q, k_pool, out));
    (*out)->src[2] = v_pool;
    (*out)->src[3] = kv_len;
    (*out)->src[4] = table;
    memcpy(&(*out)->op_params[0], &scale, sizeof(scale));
    (*out)->op_params[1] = v_trans ? 1 : 0;
    (*out)->op_params[2] = (int32_t) block_size;
    return FERRY_OK;
}
