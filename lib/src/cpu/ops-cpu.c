/* CPU kernels. Every source is read strictly through its ne/nb, so views of any
 * strides work; results are written through theirs too. Arithmetic is done in f32
 * for the float types (f32, f16, bf16); copies of other types move element bytes. */
#include "cpu-impl.h"

#include <string.h>

static bool is_float(ferry_type t) { return t == FERRY_TYPE_F32 || t == FERRY_TYPE_F16 || t == FERRY_TYPE_BF16; }

static float load(ferry_type type, const char * p) {
    uint16_t h;
    float f;
    switch (type) {
        case FERRY_TYPE_F16:
            memcpy(&h, p, sizeof(h));
            return ferry_f16_to_f32(h);
        case FERRY_TYPE_BF16:
            memcpy(&h, p, sizeof(h));
            return ferry_bf16_to_f32(h);
        default:
            memcpy(&f, p, sizeof(f));
            return f;
    }
}

static void store(ferry_type type, char * p, float v) {
    uint16_t h;
    switch (type) {
        case FERRY_TYPE_F16:
            h = ferry_f32_to_f16(v);
            memcpy(p, &h, sizeof(h));
            break;
        case FERRY_TYPE_BF16:
            h = ferry_f32_to_bf16(v);
            memcpy(p, &h, sizeof(h));
            break;
        default:
            memcpy(p, &v, sizeof(v));
            break;
    }
}

/* t->data is fresh: compute_node refreshes the node's and its sources' pointers first. */
static char * at(const ferry_tensor * t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (char *) t->data + (size_t) i0 * t->nb[0] + (size_t) i1 * t->nb[1] + (size_t) i2 * t->nb[2] +
           (size_t) i3 * t->nb[3];
}

#define FOR_EACH(t)                                     \
    for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)         \
        for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)     \
            for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++) \
                for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)

/* dst = a op b, b repeated over a. With dst in a's memory (in place) each element is
 * read before it is written, so the result is the same. */
static void binary(ferry_tensor * dst, bool mul) {
    const ferry_tensor * a = dst->src[0];
    const ferry_tensor * b = dst->src[1];
    FOR_EACH(dst) {
        const float x = load(a->type, at(a, i0, i1, i2, i3));
        const float y = load(b->type, at(b, i0 % b->ne[0], i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]));
        store(dst->type, at(dst, i0, i1, i2, i3), mul ? x * y : x + y);
    }
}

static void scale(ferry_tensor * dst) {
    const ferry_tensor * a = dst->src[0];
    float s;
    memcpy(&s, &dst->op_params[0], sizeof(s));
    FOR_EACH(dst) {
        store(dst->type, at(dst, i0, i1, i2, i3), load(a->type, at(a, i0, i1, i2, i3)) * s);
    }
}

static void dup(ferry_tensor * dst) {
    const ferry_tensor * a = dst->src[0];
    if (a->type == dst->type) {
        /* Same type: move whole elements, or whole blocks of a quantized row (dim 0 in blocks). */
        const size_t size = ferry_type_size(a->type);
        const int64_t n0 = dst->ne[0] / ferry_blck_size(dst->type);
        for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < dst->ne[1]; i1++)
                    for (int64_t i0 = 0; i0 < n0; i0++) {
                        memcpy(at(dst, i0, i1, i2, i3), at(a, i0, i1, i2, i3), size);
                    }
        return;
    }
    FOR_EACH(dst) {
        store(dst->type, at(dst, i0, i1, i2, i3), load(a->type, at(a, i0, i1, i2, i3)));
    }
}

static void concat(ferry_tensor * dst) {
    const ferry_tensor * a = dst->src[0];
    const ferry_tensor * b = dst->src[1];
    const int dim = dst->op_params[0];
    const size_t size = ferry_type_size(dst->type);
    FOR_EACH(dst) {
        int64_t i[FERRY_MAX_DIMS] = {i0, i1, i2, i3};
        const ferry_tensor * s = a;
        if (i[dim] >= a->ne[dim]) {
            i[dim] -= a->ne[dim];
            s = b;
        }
        memcpy(at(dst, i0, i1, i2, i3), at(s, i[0], i[1], i[2], i[3]), size);
    }
}

static void pad(ferry_tensor * dst) {
    const ferry_tensor * a = dst->src[0];
    const size_t size = ferry_type_size(dst->type);
    FOR_EACH(dst) {
        char * d = at(dst, i0, i1, i2, i3);
        if (i0 < a->ne[0] && i1 < a->ne[1] && i2 < a->ne[2] && i3 < a->ne[3]) {
            memcpy(d, at(a, i0, i1, i2, i3), size);
        } else {
            memset(d, 0, size); /* all-zero bytes are 0 in every element type */
        }
    }
}

static void mean(ferry_tensor * dst) {
    const ferry_tensor * a = dst->src[0];
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < dst->ne[1]; i1++) {
                float sum = 0.0f;
                for (int64_t i0 = 0; i0 < a->ne[0]; i0++) {
                    sum += load(a->type, at(a, i0, i1, i2, i3));
                }
                store(dst->type, at(dst, 0, i1, i2, i3), sum / (float) a->ne[0]);
            }
        }
    }
}

bool ferry_cpu_op_supported(const ferry_tensor * node) {
    const ferry_tensor * a = node->src[0];
    const ferry_tensor * b = node->src[1];
    const bool plain = ferry_blck_size(node->type) == 1;
    switch (node->op) {
        case FERRY_OP_NONE:
        case FERRY_OP_VIEW:
        case FERRY_OP_RESHAPE:
        case FERRY_OP_PERMUTE:
        case FERRY_OP_TRANSPOSE:
            return true;
        case FERRY_OP_ADD:
        case FERRY_OP_MUL:
            return is_float(node->type) && a && b && is_float(a->type) && is_float(b->type);
        case FERRY_OP_SCALE:
        case FERRY_OP_MEAN:
            return is_float(node->type) && a && is_float(a->type);
        case FERRY_OP_DUP:
            /* quantized rows only as whole blocks along dimension 0 */
            return a && (a->type == node->type
                             ? plain || (a->nb[0] == ferry_type_size(a->type) && node->nb[0] == ferry_type_size(a->type))
                             : is_float(a->type) && is_float(node->type));
        case FERRY_OP_CONCAT:
            return plain && a && b && a->type == node->type && b->type == node->type;
        case FERRY_OP_PAD:
            return plain && a && a->type == node->type;
        case FERRY_OP_ATTN_DECODE:
        case FERRY_OP_ATTN_PAGED:
            return ferry_cpu_attn_supported(node);
        default:
            return false;
    }
}

ferry_status ferry_cpu_compute_node(ferry_tensor * node) {
    FERRY_CHECK_ARG(node, "compute: NULL node");
    if (!ferry_cpu_op_supported(node)) {
        return ferry_fail(FERRY_ERR_UNSUPPORTED, "compute: the CPU kernels do not do %s of %s ('%s')",
                          ferry_op_name(node->op) ? ferry_op_name(node->op) : "?",
                          ferry_type_name(node->type), node->name);
    }
    for (int i = -1; i < FERRY_MAX_SRC; i++) {
        const ferry_tensor * t = i < 0 ? node : node->src[i];
        if (t && ferry_buffer_is_synthetic(ferry_tensor_buffer(t))) {
            return ferry_fail(FERRY_ERR_UNSUPPORTED,
                              "compute: '%s' lies in synthetic memory (a dummy backend without real memory): "
                              "the CPU kernels have nothing to read or write there", t->name);
        }
    }
    ferry_tensor_data(node);
    for (int i = 0; i < FERRY_MAX_SRC; i++) {
        if (node->src[i]) {
            ferry_tensor_data(node->src[i]); /* views refresh their pointer */
        }
    }
    switch (node->op) {
        case FERRY_OP_ADD: binary(node, false); break;
        case FERRY_OP_MUL: binary(node, true); break;
        case FERRY_OP_SCALE: scale(node); break;
        case FERRY_OP_DUP: dup(node); break;
        case FERRY_OP_CONCAT: concat(node); break;
        case FERRY_OP_PAD: pad(node); break;
        case FERRY_OP_MEAN: mean(node); break;
        case FERRY_OP_ATTN_DECODE:
        case FERRY_OP_ATTN_PAGED: return ferry_cpu_attn_decode(node);
        default: break; /* leafs and views: nothing to compute */
    }
    return FERRY_OK;
}

ferry_status ferry_cpu_compute_graph(ferry_graph * graph) {
    FERRY_CHECK_ARG(graph, "compute: NULL graph");
    for (int i = 0; i < ferry_graph_n_nodes(graph); i++) {
        FERRY_TRY(ferry_cpu_compute_node(ferry_graph_node(graph, i)));
    }
    return FERRY_OK;
}
