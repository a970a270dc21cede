/*
 * Values of every type as floats: conversion to and from f32, and the two block formats
 * by ggml's round-to-nearest reference, so that bytes written here are the bytes ggml
 * would write for the same floats.
 *
 * q8_0, 32 values a block: the f16 scale d = amax / 127 (amax the largest magnitude),
 * then 32 int8 q = round(x * (1 / d)), rounding half away from zero.
 * q4_0, 32 values a block: m is the value of largest magnitude, sign kept; the f16 scale
 * d = m / -8, then q = min(15, trunc(x * (1 / d) + 8.5)) in 0..15; byte j holds value j in
 * its low nibble and value j + 16 in its high one. A value is (q - 8) * d.
 * Both compute with the f32 scale and store its f16 rounding, as ggml does.
 */
#include "ferry-impl.h"

#include <math.h>
#include <string.h>

enum { QK = 32 };

/* A 16-bit float of type (f16, or bf16) at p, from and to f32. */
static void put_half(ferry_type type, uint8_t * p, float f) {
    const uint16_t h = type == FERRY_TYPE_BF16 ? ferry_f32_to_bf16(f) : ferry_f32_to_f16(f);
    memcpy(p, &h, sizeof(h)); /* little-endian hosts only, as the rest of ferry */
}

static float get_half(ferry_type type, const uint8_t * p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return type == FERRY_TYPE_BF16 ? ferry_bf16_to_f32(h) : ferry_f16_to_f32(h);
}

static void quantize_q8_0_block(const float * x, uint8_t * out) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        amax = fmaxf(amax, fabsf(x[j]));
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(FERRY_TYPE_F16, out, d);
    int8_t * q = (int8_t *) (out + 2);
    for (int j = 0; j < QK; j++) {
        q[j] = (int8_t) roundf(x[j] * id);
    }
}

static void quantize_q4_0_block(const float * x, uint8_t * out) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (fabsf(x[j]) > amax) { /* the first of equal magnitudes wins */
            amax = fabsf(x[j]);
            m = x[j];
        }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(FERRY_TYPE_F16, out, d);
    uint8_t * q = out + 2;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (int) (x[j] * id + 8.5f), hi = (int) (x[j + QK / 2] * id + 8.5f);
        lo = lo < 15 ? lo : 15;
        hi = hi < 15 ? hi : 15;
        q[j] = (uint8_t) (lo | (hi << 4));
    }
}

static void dequantize_q8_0_block(const uint8_t * blk, float * x) {
    const float d = get_half(FERRY_TYPE_F16, blk);
    const int8_t * q = (const int8_t *) (blk + 2);
    for (int j = 0; j < QK; j++) {
        x[j] = (float) q[j] * d;
    }
}

static void dequantize_q4_0_block(const uint8_t * blk, float * x) {
    const float d = get_half(FERRY_TYPE_F16, blk);
    for (int j = 0; j < QK / 2; j++) {
        x[j] = (float) ((blk[2 + j] & 0x0f) - 8) * d;
        x[j + QK / 2] = (float) ((blk[2 + j] >> 4) - 8) * d;
    }
}

/* Values to a type's bytes (to_bytes) or back, block by block (f16 and bf16: blocks of one
 * value); f32 is a copy of need bytes. */
static void convert(bool to_bytes, ferry_type type, float * values, uint8_t * bytes, int64_t n, size_t need) {
    if (type == FERRY_TYPE_F32) {
        memmove(to_bytes ? (void *) bytes : (void *) values, to_bytes ? (void *) values : (void *) bytes, need);
        return;
    }
    const int64_t blck = ferry_blck_size(type);
    for (int64_t b = 0; b < n / blck; b++) {
        float * x = values + b * blck;
        uint8_t * blk = bytes + (size_t) b * ferry_type_size(type);
        if (type == FERRY_TYPE_Q8_0) {
            to_bytes ? quantize_q8_0_block(x, blk) : dequantize_q8_0_block(blk, x);
        } else if (type == FERRY_TYPE_Q4_0) {
            to_bytes ? quantize_q4_0_block(x, blk) : dequantize_q4_0_block(blk, x);
        } else if (to_bytes) {
            put_half(type, blk, *x);
        } else {
            *x = get_half(type, blk);
        }
    }
}

/* The checks both directions share: a known type, n a whole number of blocks, the bytes there. */
static ferry_status check_values(const char * what, ferry_type type, const void * values, const void * bytes,
                                 int64_t n, size_t size, size_t * need) {
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "%s: unknown type %d", what, (int) type);
    }
    if (type == FERRY_TYPE_I32) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "%s: i32 holds integers, not float values", what);
    }
    if (n < 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: negative value count %lld", what, (long long) n);
    }
    FERRY_CHECK_ARG(n == 0 || (values && bytes), "%s: NULL values or bytes", what);
    if (n % ferry_blck_size(type) != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "%s: %lld values is not a whole number of %s blocks of %lld", what,
                          (long long) n, ferry_type_name(type), (long long) ferry_blck_size(type));
    }
    FERRY_TRY(ferry_row_size(type, n, need)); /* whole blocks: fails only on overflow */
    if (*need > size) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: %lld %s values take %zu bytes, the memory given holds %zu",
                          what, (long long) n, ferry_type_name(type), *need, size);
    }
    return FERRY_OK;
}

ferry_status ferry_quantize(ferry_type type, const float * src, int64_t n, void * dst, size_t dst_size) {
    size_t need;
    FERRY_TRY(check_values("quantize", type, src, dst, n, dst_size, &need));
    const bool blocks = type == FERRY_TYPE_Q8_0 || type == FERRY_TYPE_Q4_0;
    for (int64_t i = 0; blocks && i < n; i++) {
        if (!isfinite(src[i])) { /* a block's scale would be inf or nan, its integers undefined */
            return ferry_fail(FERRY_ERR_INVALID_ARG, "quantize: value %lld is %g; %s holds finite values only",
                              (long long) i, (double) src[i], ferry_type_name(type));
        }
    }
    convert(true, type, (float *) src, dst, n, need); /* reads src only */
    return FERRY_OK;
}

ferry_status ferry_dequantize(ferry_type type, const void * src, size_t src_size, int64_t n, float * dst) {
    size_t need;
    FERRY_TRY(check_values("dequantize", type, dst, src, n, src_size, &need));
    convert(false, type, dst, (uint8_t *) src, n, need); /* reads src only */
    return FERRY_OK;
}
