/* Element types: names, block sizes, row sizes, and scalar conversions. */
#include "ferry-impl.h"

#include <string.h>

typedef struct {
    const char * name;
    size_t type_size; /* bytes per block */
    int64_t blck_size; /* values per block */
} type_traits;

static const type_traits traits[FERRY_TYPE_COUNT] = {
    [FERRY_TYPE_F32] = {"f32", 4, 1},
    [FERRY_TYPE_F16] = {"f16", 2, 1},
    [FERRY_TYPE_BF16] = {"bf16", 2, 1},
    [FERRY_TYPE_I32] = {"i32", 4, 1},
    [FERRY_TYPE_Q8_0] = {"q8_0", 34, 32},
    [FERRY_TYPE_Q4_0] = {"q4_0", 18, 32},
};

bool ferry_type_valid(ferry_type type) { return (int) type >= 0 && type < FERRY_TYPE_COUNT; }

const char * ferry_type_name(ferry_type type) {
    if (!ferry_type_valid(type)) {
        ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "unknown type %d", (int) type);
        return NULL;
    }
    return traits[type].name;
}

ferry_status ferry_type_from_name(const char * name, ferry_type * out) {
    FERRY_CHECK_ARG(name && out, "type_from_name: NULL argument");
    for (int i = 0; i < FERRY_TYPE_COUNT; i++) {
        if (strcmp(traits[i].name, name) == 0) {
            *out = (ferry_type) i;
            return FERRY_OK;
        }
    }
    return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "unknown type name '%s' (known: f32, f16, bf16, i32, q8_0, q4_0)", name);
}

size_t ferry_type_size(ferry_type type) {
    if (!ferry_type_valid(type)) {
        ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "unknown type %d", (int) type);
        return 0;
    }
    return traits[type].type_size;
}

int64_t ferry_blck_size(ferry_type type) {
    if (!ferry_type_valid(type)) {
        ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "unknown type %d", (int) type);
        return 0;
    }
    return traits[type].blck_size;
}

ferry_status ferry_row_size(ferry_type type, int64_t ne, size_t * out) {
    FERRY_CHECK_ARG(out, "row_size: NULL output");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "unknown type %d", (int) type);
    }
    if (ne < 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "row_size: negative element count %lld", (long long) ne);
    }
    const type_traits * tr = &traits[type];
    if (ne % tr->blck_size != 0) {
        return ferry_fail(FERRY_ERR_LAYOUT, "row_size: %lld values is not a whole number of %s blocks of %lld",
                          (long long) ne, tr->name, (long long) tr->blck_size);
    }
    if (!ferry_mul_ok((size_t) (ne / tr->blck_size), tr->type_size, out)) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "row_size: %lld values overflow", (long long) ne);
    }
    return FERRY_OK;
}

/* A float's bits, and the float of some bits. */
static uint32_t bits_of(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    return x;
}

static float float_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

float ferry_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t) (h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while ((mant & 0x400) == 0) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    return float_of(bits);
}

uint16_t ferry_f32_to_f16(float f) {
    uint32_t x = bits_of(f);
    const uint16_t sign = (uint16_t) ((x >> 16) & 0x8000);
    const uint32_t exp = (x >> 23) & 0xff;
    uint32_t mant = x & 0x7fffff;
    if (exp == 0xff) { /* inf or nan */
        return (uint16_t) (sign | 0x7c00 | (mant ? 0x200 : 0));
    }
    int32_t e = (int32_t) exp - 127 + 15;
    if (e >= 0x1f) {
        return (uint16_t) (sign | 0x7c00);
    }
    if (e <= 0) { /* subnormal or zero in f16 */
        if (e < -10) {
            return sign;
        }
        mant |= 0x800000;
        const uint32_t shift = (uint32_t) (14 - e);
        uint32_t half = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1);
        const uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) {
            half++;
        }
        return (uint16_t) (sign | half);
    }
    uint32_t half = ((uint32_t) e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) {
        half++; /* may carry into the exponent, which is the right rounding */
    }
    return (uint16_t) (sign | half);
}

float ferry_bf16_to_f32(uint16_t h) {
    return float_of((uint32_t) h << 16);
}

uint16_t ferry_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    if ((x & 0x7fffffff) > 0x7f800000) {
        return (uint16_t) ((x >> 16) | 0x40); /* keep nan a nan */
    }
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t) (x >> 16);
}
