/*
 * Values of every type (quant.c) and memory other libraries own (foreign-buffer.c):
 * q8_0 and q4_0 bytes against blocks worked out by hand from the formats' definition,
 * refusals that write nothing, buffers over the caller's memory that never free it, and
 * what ferry_tensor_memory says of each kind of memory.
 */
#include "check.h"

#include <math.h>
#include <stdint.h>

static uint16_t u16_at(const uint8_t * p) { return (uint16_t) (p[0] | (p[1] << 8)); }

/* One q8_0 block worked by hand: amax 127 gives d = 1 (f16 0x3c00) and q = round(x). */
static void test_q8_0_block_is_the_bytes_worked_by_hand(void) {
    float x[32];
    for (int j = 0; j < 32; j++) {
        x[j] = (float) (j - 16) * 0.5f; /* -8 .. 7.5: halves round away from zero */
    }
    x[31] = 127.0f;
    uint8_t out[34];
    memset(out, 0xee, sizeof(out));
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q8_0, x, 32, out, sizeof(out)));
    CHECK_EQ_U(u16_at(out), 0x3c00);
    const int8_t * q = (const int8_t *) (out + 2);
    CHECK_EQ_U((uint8_t) q[0], (uint8_t) -8);
    CHECK_EQ_U((uint8_t) q[1], (uint8_t) -8); /* -7.5 -> -8 */
    CHECK_EQ_U((uint8_t) q[15], (uint8_t) -1); /* -0.5 -> -1 */
    CHECK_EQ_U(q[16], 0);
    CHECK_EQ_U(q[17], 1); /* 0.5 -> 1 */
    CHECK_EQ_U(q[31], 127);
    float back[32];
    CHECK_OK(ferry_dequantize(FERRY_TYPE_Q8_0, out, sizeof(out), 32, back));
    CHECK(back[1] == -8.0f && back[17] == 1.0f && back[31] == 127.0f);
    /* all zeros: d = 0, every q 0 */
    float zeros[32] = {0};
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q8_0, zeros, 32, out, sizeof(out)));
    for (int j = 0; j < 34; j++) {
        CHECK_EQ_U(out[j], 0);
    }
}

/* One q4_0 block by hand: the value of largest magnitude is -8, so d = 1, q = min(15, trunc(x + 8.5));
 * value j in the low nibble of byte j, value j + 16 in its high nibble. */
static void test_q4_0_block_is_the_bytes_worked_by_hand(void) {
    float x[32] = {0};
    x[0] = -8.0f;  /* q 0 */
    x[1] = 7.0f;   /* q 15 */
    x[2] = 7.9f;   /* 16.4 -> 16, kept to 15 */
    x[3] = -0.6f;  /* 7.9 -> 7 */
    x[16] = 3.0f;  /* q 11, high nibble of byte 0 */
    x[17] = -3.0f; /* q 5, high nibble of byte 1 */
    uint8_t out[18];
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q4_0, x, 32, out, sizeof(out)));
    CHECK_EQ_U(u16_at(out), 0x3c00); /* d = -8 / -8 = 1 */
    CHECK_EQ_U(out[2 + 0], 0x00 | (11 << 4));
    CHECK_EQ_U(out[2 + 1], 15 | (5 << 4));
    CHECK_EQ_U(out[2 + 2], 15 | (8 << 4));
    CHECK_EQ_U(out[2 + 3], 7 | (8 << 4));
    /* the sign of the largest magnitude is kept: +8 gives d = -1, and +8 maps to q 0 */
    float y[32] = {0};
    y[0] = 8.0f;
    y[1] = -7.0f;
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q4_0, y, 32, out, sizeof(out)));
    CHECK_EQ_U(u16_at(out), 0xbc00);
    CHECK_EQ_U(out[2] & 0x0f, 0);
    CHECK_EQ_U(out[3] & 0x0f, 15);
    float back[32];
    CHECK_OK(ferry_dequantize(FERRY_TYPE_Q4_0, out, sizeof(out), 32, back));
    CHECK(back[0] == 8.0f && back[1] == -7.0f && back[2] == -0.0f);
}

/* f32, f16 and bf16 go through the conversions every other part of ferry uses. */
static void test_float_types_use_the_shared_conversions(void) {
    const float x[4] = {1.0f, -2.5f, 65504.0f, 1.0f / 3.0f};
    uint8_t out[16];
    float back[4];
    CHECK_OK(ferry_quantize(FERRY_TYPE_F16, x, 4, out, 8));
    CHECK_EQ_U(u16_at(out), 0x3c00);
    CHECK_EQ_U(u16_at(out + 4), 0x7bff);
    CHECK_OK(ferry_dequantize(FERRY_TYPE_F16, out, 8, 4, back));
    CHECK(back[1] == -2.5f && back[2] == 65504.0f);
    CHECK_OK(ferry_quantize(FERRY_TYPE_BF16, x, 4, out, 8));
    CHECK_EQ_U(u16_at(out), 0x3f80);
    CHECK_EQ_U(u16_at(out + 6), 0x3eab); /* 0x3eaaaaab rounds up */
    CHECK_OK(ferry_quantize(FERRY_TYPE_F32, x, 4, out, 16));
    CHECK_OK(ferry_dequantize(FERRY_TYPE_F32, out, 16, 4, back));
    CHECK(memcmp(back, x, sizeof(x)) == 0);
}

/* Values f16 holds exactly (subnormals, its largest, a short fraction) come back unchanged. */
static void test_values_f16_holds_exactly_come_back_unchanged(void) {
    const float values[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        extern float ferry_f16_to_f32(uint16_t);
        extern uint16_t ferry_f32_to_f16(float);
        CHECK(ferry_f16_to_f32(ferry_f32_to_f16(values[i])) == values[i]);
    }
}

/* What f16 cannot hold, and the halfway cases, as IEEE rounding has them: infinities stay
 * infinite, nan stays nan, a value past f16's largest becomes inf, ties round to the even
 * neighbour (normal and subnormal alike), and bf16 keeps a nan that truncation would make
 * inf. Read back through dequantize: the values a caller sees. */
static void test_infinities_nans_and_ties_round_as_ieee_says(void) {
    const float x[10] = {
        INFINITY, -INFINITY, NAN, 70000.0f,          /* inf, -inf, nan, past 65504 */
        65520.0f,                                    /* halfway past 65504: the even side is inf */
        1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,        /* ties between f16 neighbours 2^-10 apart */
        0x1p-25f, 3 * 0x1p-25f,                      /* ties below the smallest subnormal steps */
        0x1p-26f,                                    /* under half the smallest subnormal: zero */
    };
    uint8_t out[20];
    CHECK_OK(ferry_quantize(FERRY_TYPE_F16, x, 10, out, sizeof(out)));
    const uint16_t want[10] = {0x7c00, 0xfc00, 0x7e00, 0x7c00, 0x7c00, 0x3c00, 0x3c02, 0x0000, 0x0002, 0x0000};
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_U(u16_at(out + 2 * i), want[i]);
    }
    float back[10];
    CHECK_OK(ferry_dequantize(FERRY_TYPE_F16, out, sizeof(out), 10, back));
    CHECK(isinf(back[0]) && back[0] > 0 && isinf(back[1]) && back[1] < 0 && isnan(back[2]));
    CHECK(back[6] == 1.0f + 4 * 0x1p-11f && back[8] == 0x1p-23f);

    /* bf16: a signalling nan (quiet bit clear, low bits set) must not truncate to inf */
    uint32_t snan_bits = 0x7f800001u;
    float snan;
    memcpy(&snan, &snan_bits, sizeof(snan));
    const float y[3] = {snan, INFINITY, 1.0f + 0x1p-8f}; /* the last a tie: even is 1.0 */
    CHECK_OK(ferry_quantize(FERRY_TYPE_BF16, y, 3, out, 6));
    CHECK_EQ_U(u16_at(out), 0x7fc0);
    CHECK_EQ_U(u16_at(out + 2), 0x7f80);
    CHECK_EQ_U(u16_at(out + 4), 0x3f80);
    CHECK_OK(ferry_dequantize(FERRY_TYPE_BF16, out, 6, 3, back));
    CHECK(isnan(back[0]) && isinf(back[1]) && back[2] == 1.0f);
}

/* Every refusal leaves a message and the output as it was. */
static void test_quantize_refusals_write_nothing(void) {
    float x[64] = {0};
    uint8_t out[68];
    memset(out, 0xee, sizeof(out));
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_Q8_0, x, 33, out, sizeof(out)), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_Q8_0, x, 64, out, 67), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "68 bytes") != NULL);
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_I32, x, 4, out, sizeof(out)), FERRY_ERR_UNSUPPORTED);
    CHECK_FAILS(ferry_quantize((ferry_type) 99, x, 4, out, sizeof(out)), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_F32, x, -1, out, sizeof(out)), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_F32, NULL, 4, out, sizeof(out)), FERRY_ERR_INVALID_ARG);
    x[40] = NAN;
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_Q4_0, x, 64, out, sizeof(out)), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "value 40") != NULL);
    x[40] = INFINITY;
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_Q8_0, x, 64, out, sizeof(out)), FERRY_ERR_INVALID_ARG);
    for (size_t i = 0; i < sizeof(out); i++) {
        CHECK_EQ_U(out[i], 0xee);
    }
    float back[64];
    CHECK_FAILS(ferry_dequantize(FERRY_TYPE_Q4_0, out, 35, 64, back), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q8_0, x, 0, NULL, 0)); /* nothing to do */
    /* a count whose bytes pass size_t: refused before anything is read or written */
    memset(out, 0xee, sizeof(out));
    CHECK_FAILS(ferry_quantize(FERRY_TYPE_F32, x, INT64_MAX, out, sizeof(out)), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK(strstr(ferry_last_error(), "overflow") != NULL);
    CHECK_FAILS(ferry_dequantize(FERRY_TYPE_F32, out, sizeof(out), INT64_MAX, back), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_EQ_U(out[0], 0xee);
}

/* Blocks from chosen scales and integers: the bytes quantize writes for the same block, and
 * values that read back as q * scale; refusals write nothing. */
static void test_packed_blocks_read_back_as_q_times_scale(void) {
    int8_t q[64];
    float x[64], scales[2] = {1.0f, 0.25f}, back[64];
    for (int j = 0; j < 64; j++) {
        q[j] = (int8_t) (j % 15 - 8); /* -8..6: both types hold them; value j and j + 16 differ */
        x[j] = (float) q[j];
    }
    q[31] = 127; /* amax 127 in the first block: quantize's d is 1 there */
    x[31] = 127.0f;
    uint8_t packed[68], quantized[68];
    CHECK_OK(ferry_pack_blocks(FERRY_TYPE_Q8_0, scales, 1, q, 32, packed, 34));
    CHECK_OK(ferry_quantize(FERRY_TYPE_Q8_0, x, 32, quantized, 34));
    CHECK(memcmp(packed, quantized, 34) == 0);
    q[31] = 7;
    CHECK_OK(ferry_pack_blocks(FERRY_TYPE_Q4_0, scales, 2, q, 64, packed, 36));
    CHECK_OK(ferry_dequantize(FERRY_TYPE_Q4_0, packed, 36, 64, back));
    for (int j = 0; j < 64; j++) {
        CHECK(back[j] == (float) q[j] * scales[j / 32]);
    }
    memset(packed, 0xee, sizeof(packed));
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_F16, scales, 1, q, 32, packed, 64), FERRY_ERR_UNSUPPORTED);
    CHECK_FAILS(ferry_pack_blocks((ferry_type) 99, scales, 1, q, 32, packed, 64), FERRY_ERR_UNKNOWN_TYPE);
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_Q8_0, scales, 1, q, 33, packed, 68), FERRY_ERR_LAYOUT);
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_Q8_0, scales, 2, q, 64, packed, 67), FERRY_ERR_OUT_OF_BOUNDS);
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_Q8_0, NULL, 1, q, 32, packed, 68), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_Q8_0, scales, 1, q, 64, packed, 68), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "1 scales for 2 blocks") != NULL);
    q[40] = 8;
    CHECK_FAILS(ferry_pack_blocks(FERRY_TYPE_Q4_0, scales, 2, q, 64, packed, 36), FERRY_ERR_INVALID_ARG);
    CHECK(strstr(ferry_last_error(), "value 40") != NULL);
    for (size_t i = 0; i < sizeof(packed); i++) {
        CHECK_EQ_U(packed[i], 0xee);
    }
}

/* A buffer over the caller's memory: tensors read and write it in place, and freeing the
 * buffer leaves it allocated (ASan reports a free of it, or a use after it). */
static void test_host_memory_buffer_works_in_place_never_frees(void) {
    float * mem = malloc(64 * sizeof(float));
    CHECK(mem);
    for (int i = 0; i < 64; i++) {
        mem[i] = (float) i;
    }
    ferry_buffer * buf = NULL;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, 64 * sizeof(float), &buf));
    CHECK(ferry_buffer_is_host(buf));
    CHECK(ferry_buffer_base(buf) == mem);
    CHECK(ferry_buffer_get_type(buf) == ferry_cpu_buffer_type());
    ferry_context * ctx = NULL;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {8, 8};
    ferry_tensor * t = NULL;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &t));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    float v = 0;
    CHECK_OK(ferry_tensor_get(t, &v, 9 * sizeof(float), sizeof(float)));
    CHECK(v == 9.0f);
    v = -1.0f;
    CHECK_OK(ferry_tensor_set(t, &v, 3 * sizeof(float), sizeof(float)));
    CHECK(mem[3] == -1.0f);
    ferry_memory_kind kind;
    int device = 7;
    void * data = NULL;
    CHECK_OK(ferry_tensor_memory(t, &kind, &device, &data));
    CHECK(kind == FERRY_MEMORY_HOST && device == -1 && data == mem);

    /* the CPU backend computes on it */
    ferry_backend * cpu = NULL;
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    CHECK(ferry_backend_supports_buft(cpu, ferry_buffer_get_type(buf)));
    ferry_buffer_free(buf);
    CHECK(mem[63] == 63.0f); /* still the caller's */
    CHECK_FAILS(ferry_tensor_get(t, &v, 0, sizeof(v)), FERRY_ERR_FREED);
    ferry_backend_free(cpu);
    ferry_context_free(ctx);
    free(mem);

    CHECK_FAILS(ferry_host_buffer_from_ptr(NULL, 16, &buf), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_host_buffer_from_ptr((void *) (UINTPTR_MAX - 8), 16, &buf), FERRY_ERR_INVALID_ARG);
}

/* The scheduler copies an input that lies in the caller's memory to the split that needs
 * it (the stand-in device), as it would a KV cache of its own. */
static void test_sched_copies_inputs_from_the_callers_memory(void) {
    float mem[32];
    for (int i = 0; i < 32; i++) {
        mem[i] = (float) i;
    }
    ferry_buffer * buf = NULL;
    CHECK_OK(ferry_host_buffer_from_ptr(mem, sizeof(mem), &buf));
    ferry_context * ctx = NULL;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[2] = {8, 4};
    ferry_tensor *a = NULL, *b = NULL;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 2, ne, &a));
    CHECK_OK(ferry_buffer_place_tensor(buf, a, 0));
    CHECK_OK(ferry_scale(ctx, a, 2.0f, &b));
    CHECK_OK(ferry_tensor_set_output(b));
    ferry_backend *dev = NULL, *cpu = NULL;
    CHECK_OK(ferry_standin_backend_new(&dev));
    CHECK_OK(ferry_cpu_backend_new(&cpu));
    ferry_backend * backends[2] = {dev, cpu};
    ferry_sched * sched = NULL;
    CHECK_OK(ferry_sched_new(backends, 2, &sched));
    ferry_graph * g = NULL;
    CHECK_OK(ferry_graph_new(&g));
    CHECK_OK(ferry_graph_build(g, b));
    CHECK_OK(ferry_sched_set_tensor_backend(sched, b, dev));
    CHECK_OK(ferry_sched_graph_compute(sched, g));
    CHECK_EQ_U(ferry_sched_n_inputs(sched), 1);
    float out[32];
    CHECK_OK(ferry_tensor_get(b, out, 0, sizeof(out)));
    for (int i = 0; i < 32; i++) {
        CHECK(out[i] == 2.0f * (float) i);
    }
    ferry_memory_kind kind;
    int device;
    void * data;
    CHECK_FAILS(ferry_tensor_memory(b, &kind, &device, &data), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "neither the host nor a CUDA device") != NULL);
    ferry_graph_free(g);
    ferry_sched_free(sched);
    ferry_backend_free(dev);
    ferry_backend_free(cpu);
    ferry_buffer_free(buf);
    ferry_context_free(ctx);
}

/* What ferry_tensor_memory refuses, and why. */
static void test_tensor_memory_refuses_naming_why(void) {
    ferry_context * ctx = NULL;
    CHECK_OK(ferry_context_new(&ctx));
    const int64_t ne[1] = {16};
    ferry_tensor * t = NULL;
    CHECK_OK(ferry_tensor_new(ctx, FERRY_TYPE_F32, 1, ne, &t));
    ferry_memory_kind kind;
    int device;
    void * data;
    CHECK_FAILS(ferry_tensor_memory(t, &kind, &device, &data), FERRY_ERR_NOT_ALLOCATED);
    CHECK_FAILS(ferry_tensor_memory(t, NULL, &device, &data), FERRY_ERR_INVALID_ARG);

    ferry_dummy_params p = ferry_dummy_default_params();
    p.is_host = true; /* claims host memory, but the addresses are synthetic */
    ferry_backend * dummy = NULL;
    CHECK_OK(ferry_dummy_backend_new(&p, &dummy));
    ferry_buffer * buf = NULL;
    CHECK_OK(ferry_backend_alloc_buffer(dummy, 64, &buf));
    CHECK_OK(ferry_buffer_place_tensor(buf, t, 0));
    CHECK_FAILS(ferry_tensor_memory(t, &kind, &device, &data), FERRY_ERR_UNSUPPORTED);
    CHECK(strstr(ferry_last_error(), "synthetic") != NULL);
    ferry_buffer_free(buf);
    CHECK_FAILS(ferry_tensor_memory(t, &kind, &device, &data), FERRY_ERR_FREED);
    ferry_backend_free(dummy);
    ferry_context_free(ctx);
}

/* A stand-in for a Python capsule: its name and pointer, asked through the two functions. */
typedef struct {
    const char * name;
    void * pointer;
} fake_capsule;

static int fake_is_valid(void * capsule, const char * name) {
    const fake_capsule * c = capsule;
    return strcmp(c->name, name) == 0;
}

static void * fake_pointer(void * capsule, const char * name) {
    const fake_capsule * c = capsule;
    return strcmp(c->name, name) == 0 ? c->pointer : NULL;
}

/* The deleter only marks; the capsule's end calls it only for a capsule no one consumed. */
static void test_unconsumed_dlpack_capsules_call_the_deleter(void) {
    void * p = NULL;
    CHECK_OK(ferry_dlpack_new(3, false, &p));
    ferry_dl_managed_tensor * m = p;
    CHECK(m->dl_tensor.ndim == 3 && m->dl_tensor.shape && m->dl_tensor.strides && m->deleter);
    m->dl_tensor.shape[2] = 5;
    m->dl_tensor.strides[3] = 7; /* room for 4 of each */
    CHECK(!ferry_dlpack_deleted(m));
    CHECK_OK(ferry_dlpack_set_capsule_api(fake_is_valid, fake_pointer));

    fake_capsule consumed = {"used_dltensor", m};
    ferry_dlpack_capsule_destructor(&consumed); /* its consumer deletes it, not the capsule */
    CHECK(!ferry_dlpack_deleted(m));
    m->deleter(m);
    CHECK(ferry_dlpack_deleted(m));
    m->deleter(m); /* a second call changes nothing */
    CHECK(ferry_dlpack_deleted(m));
    ferry_dlpack_free(m);

    CHECK_OK(ferry_dlpack_new(0, false, &p));
    fake_capsule dropped = {"dltensor", p};
    ferry_dlpack_capsule_destructor(&dropped);
    CHECK(ferry_dlpack_deleted(p));
    ferry_dlpack_free(p);

    /* the versioned form: version 1.0, writable unless flagged, the same rules */
    CHECK_OK(ferry_dlpack_new(2, true, &p));
    ferry_dl_managed_tensor_versioned * v = p;
    CHECK(v->version.major == 1 && v->version.minor == 0 && v->flags == 0 && v->dl_tensor.ndim == 2);
    CHECK(v->dl_tensor.shape && v->dl_tensor.strides == v->dl_tensor.shape + FERRY_MAX_DIMS);
    fake_capsule used = {"used_dltensor_versioned", p};
    ferry_dlpack_capsule_destructor(&used);
    CHECK(!ferry_dlpack_deleted(p));
    fake_capsule dropped_v = {"dltensor_versioned", p};
    ferry_dlpack_capsule_destructor(&dropped_v);
    CHECK(ferry_dlpack_deleted(p));
    ferry_dlpack_free(p);

    CHECK_FAILS(ferry_dlpack_new(5, false, &p), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_dlpack_new(-1, true, &p), FERRY_ERR_INVALID_ARG);
    CHECK_FAILS(ferry_dlpack_set_capsule_api(NULL, fake_pointer), FERRY_ERR_INVALID_ARG);
    ferry_dlpack_capsule_destructor(NULL);
    ferry_dlpack_free(NULL);
    CHECK(!ferry_dlpack_deleted(NULL));
}

static const check_test tests[] = {
    {"unconsumed_dlpack_capsules_call_the_deleter", test_unconsumed_dlpack_capsules_call_the_deleter},
    {"q8_0_block_is_the_bytes_worked_by_hand", test_q8_0_block_is_the_bytes_worked_by_hand},
    {"q4_0_block_is_the_bytes_worked_by_hand", test_q4_0_block_is_the_bytes_worked_by_hand},
    {"float_types_use_the_shared_conversions", test_float_types_use_the_shared_conversions},
    {"values_f16_holds_exactly_come_back_unchanged", test_values_f16_holds_exactly_come_back_unchanged},
    {"infinities_nans_and_ties_round_as_ieee_says", test_infinities_nans_and_ties_round_as_ieee_says},
    {"quantize_refusals_write_nothing", test_quantize_refusals_write_nothing},
    {"packed_blocks_read_back_as_q_times_scale", test_packed_blocks_read_back_as_q_times_scale},
    {"host_memory_buffer_works_in_place_never_frees", test_host_memory_buffer_works_in_place_never_frees},
    {"sched_copies_inputs_from_the_callers_memory", test_sched_copies_inputs_from_the_callers_memory},
    {"tensor_memory_refuses_naming_why", test_tensor_memory_refuses_naming_why},
};

CHECK_MAIN(tests)
