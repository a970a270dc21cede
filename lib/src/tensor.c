/* Tensor metadata: contexts, shapes and strides, views, nbytes. No memory is touched here. */
#include "ferry-impl.h"

#include <stdlib.h>
#include <string.h>

struct ferry_context {
    ferry_tensor ** tensors;
    size_t n_tensors;
    size_t capacity;
};

ferry_status ferry_context_new(ferry_context ** out) {
    FERRY_CHECK_ARG(out, "context_new: NULL output");
    return ferry_new_zeroed(sizeof(**out), "context_new", (void **) out);
}

void ferry_context_free(ferry_context * ctx) {
    if (!ctx) {
        return;
    }
    for (size_t i = 0; i < ctx->n_tensors; i++) {
        free(ctx->tensors[i]);
    }
    free(ctx->tensors);
    free(ctx);
}

size_t ferry_context_n_tensors(const ferry_context * ctx) { return ctx ? ctx->n_tensors : 0; }

ferry_status ferry_tensor_alloc_struct(ferry_context * ctx, ferry_type type, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && out, "tensor: NULL context or output");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "tensor: unknown type %d", (int) type);
    }
    ferry_tensor ** grown = ferry_grow(ctx->tensors, &ctx->capacity, ctx->n_tensors + 1, sizeof(*grown));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "tensor: out of memory");
    }
    ctx->tensors = grown;
    ferry_tensor * t = ferry_calloc(1, sizeof(*t));
    if (!t) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "tensor: out of memory");
    }
    t->type = type;
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        t->ne[i] = 1;
    }
    ctx->tensors[ctx->n_tensors++] = t;
    *out = t;
    return FERRY_OK;
}

/* nb[from..to-1], each the stride below times the count below it (nb[1]: one block times
 * the blocks of ne[0]); a stride past size_t is SIZE_MAX (no tensor whose span would step
 * it exists). The rule of contiguous strides, and of a view's dimensions past its n_dims. */
static void strides_on(ferry_type type, int from, int to, const int64_t * ne, size_t * nb) {
    for (int i = from; i < to; i++) {
        const size_t below = (size_t) (i == 1 ? ne[0] / ferry_blck_size(type) : ne[i - 1]);
        if (!ferry_mul_ok(i == 1 ? ferry_type_size(type) : nb[i - 1], below, &nb[i])) {
            nb[i] = SIZE_MAX;
        }
    }
}

static void contiguous_strides(ferry_type type, int n_dims, const int64_t * ne, size_t * nb) {
    nb[0] = ferry_type_size(type);
    strides_on(type, 1, n_dims, ne, nb);
}

ferry_status ferry_contiguous_strides(ferry_type type, int n_dims, const int64_t * ne, size_t * nb) {
    FERRY_CHECK_ARG(ne && nb, "contiguous_strides: NULL argument");
    if (n_dims < 1 || n_dims > FERRY_MAX_DIMS) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "contiguous_strides: n_dims %d is not in 1..%d", n_dims,
                          FERRY_MAX_DIMS);
    }
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 0) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "contiguous_strides: ne[%d] = %lld is negative", i,
                              (long long) ne[i]);
        }
    }
    size_t row;
    FERRY_TRY(ferry_row_size(type, ne[0], &row)); /* unknown types and partial blocks fail here */
    contiguous_strides(type, n_dims, ne, nb);
    return FERRY_OK;
}

void ferry_tensor_set_contiguous_strides(ferry_tensor * t) {
    contiguous_strides(t->type, FERRY_MAX_DIMS, t->ne, t->nb);
}

ferry_status ferry_check_element_count(const int64_t * ne, int n_dims, const char * what) {
    /* in the order ferry_tensor_nelements and _nrows multiply, so neither can overflow */
    int64_t n = 1, rows = 1;
    for (int i = 0; i < n_dims; i++) {
        if (__builtin_mul_overflow(n, ne[i], &n) || (i > 0 && __builtin_mul_overflow(rows, ne[i], &rows))) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the shape's element count overflows", what);
        }
    }
    return FERRY_OK;
}

/* Shapes must be non-negative, rows whole blocks, and the total byte size and element count
 * representable (block types hold more values than bytes). */
static ferry_status check_shape(ferry_type type, int n_dims, const int64_t * ne, const char * what) {
    FERRY_CHECK_ARG(ne, "%s: NULL shape", what);
    if (n_dims < 1 || n_dims > FERRY_MAX_DIMS) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: n_dims %d is not in 1..%d", what, n_dims, FERRY_MAX_DIMS);
    }
    size_t total = 0;
    FERRY_TRY(ferry_row_size(type, ne[0] < 0 ? 0 : ne[0], &total));
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 0) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: ne[%d] = %lld is negative", what, i, (long long) ne[i]);
        }
        if (i > 0 && !ferry_mul_ok(total, (size_t) ne[i], &total)) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the shape's byte size overflows", what);
        }
    }
    if (total > (size_t) INT64_MAX) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: the shape's byte size overflows", what);
    }
    return ferry_check_element_count(ne, n_dims, what);
}

ferry_status ferry_tensor_new(ferry_context * ctx, ferry_type type, int n_dims, const int64_t * ne,
                              ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && out, "tensor_new: NULL context or output");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "tensor_new: unknown type %d", (int) type);
    }
    FERRY_TRY(check_shape(type, n_dims, ne, "tensor_new"));
    ferry_tensor * t;
    FERRY_TRY(ferry_tensor_alloc_struct(ctx, type, &t));
    for (int i = 0; i < n_dims; i++) {
        t->ne[i] = ne[i];
    }
    ferry_tensor_set_contiguous_strides(t);
    *out = t;
    return FERRY_OK;
}

ferry_status ferry_tensor_dup_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && t && out, "tensor_dup_layout: NULL argument");
    ferry_tensor * d;
    FERRY_TRY(ferry_tensor_alloc_struct(ctx, t->type, &d));
    memcpy(d->ne, t->ne, sizeof(d->ne));
    memcpy(d->nb, t->nb, sizeof(d->nb));
    *out = d;
    return FERRY_OK;
}

const ferry_tensor * ferry_tensor_root(const ferry_tensor * t) { return t->view_src ? t->view_src : t; }

void * ferry_tensor_data(const ferry_tensor * t) {
    if (!t->view_src) {
        return t->data;
    }
    ferry_tensor * v = (ferry_tensor *) t; /* views cache their source's placement */
    const ferry_tensor * root = t->view_src;
    v->buffer = root->buffer;
    v->buffer_id = root->buffer_id;
    v->data = root->data ? (char *) root->data + t->view_offs : NULL;
    return v->data;
}

ferry_buffer * ferry_tensor_buffer(const ferry_tensor * t) { return ferry_tensor_root(t)->buffer; }

ferry_status ferry_tensor_check_not_paged(const ferry_tensor * t, const char * what) {
    if (t && t->paged) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "%s: '%s' is a paged window, whose cells lie in the blocks of "
                          "its sequences' tables, not at its strides: copy it (the scheduler or ferry_copy_input "
                          "gathers it) and use the copy", what, t->name);
    }
    return FERRY_OK;
}

/* A new view struct of src sharing its memory; the caller fills ne/nb. */
static ferry_status new_view(ferry_context * ctx, ferry_tensor * src, ferry_op op, size_t offset,
                             ferry_tensor ** out) {
    static const char * const what[] = {[FERRY_OP_VIEW] = "tensor_view", [FERRY_OP_PERMUTE] = "tensor_permute",
                                        [FERRY_OP_RESHAPE] = "tensor_reshape"};
    FERRY_TRY(ferry_tensor_check_not_paged(src, what[op]));
    ferry_tensor * v;
    FERRY_TRY(ferry_tensor_alloc_struct(ctx, src->type, &v));
    v->op = op;
    v->src[0] = src;
    v->view_src = (ferry_tensor *) ferry_tensor_root(src);
    v->view_offs = (src->view_src ? src->view_offs : 0) + offset;
    ferry_tensor_data(v);
    *out = v;
    return FERRY_OK;
}

ferry_status ferry_tensor_paged_window(ferry_context * ctx, ferry_tensor * pool, const int64_t * ne, const size_t * nb,
                                       const ferry_paged_source * source, int64_t first_seq, ferry_tensor ** out) {
    FERRY_TRY(ferry_check_element_count(ne, FERRY_MAX_DIMS, "paged window"));
    ferry_tensor * v;
    FERRY_TRY(new_view(ctx, pool, FERRY_OP_VIEW, 0, &v));
    memcpy(v->ne, ne, sizeof(v->ne));
    memcpy(v->nb, nb, sizeof(v->nb));
    v->paged = source;
    v->paged_first_seq = first_seq;
    *out = v;
    return FERRY_OK;
}

/* 0 for NULL, like the other getters: no tensor has no elements */
int64_t ferry_tensor_nelements(const ferry_tensor * t) { return t ? t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] : 0; }
int64_t ferry_tensor_nrows(const ferry_tensor * t) { return t ? t->ne[1] * t->ne[2] * t->ne[3] : 0; }

/* ggml's nbytes of a 4-D layout of a known type: the span from the first byte to the last,
 * whole blocks included; 0 with a dimension of 0 or less. False if it overflows. */
static bool layout_span(ferry_type type, const int64_t * ne, const size_t * nb, size_t * out) {
    *out = 0;
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (ne[i] <= 0) {
            return true;
        }
    }
    const size_t blck = (size_t) ferry_blck_size(type);
    const size_t ne0 = (size_t) ne[0];
    size_t span, part, step;
    if (blck == 1) {
        span = ferry_type_size(type);
        if (!ferry_mul_ok(ne0 - 1, nb[0], &step) || !ferry_add_ok(span, step, &span)) {
            return false;
        }
    } else {
        /* ne[0] * nb[0] / blck, in two parts so that the product cannot wrap */
        if (!ferry_mul_ok(ne0 / blck, nb[0], &span) || !ferry_mul_ok(ne0 % blck, nb[0], &part) ||
            !ferry_add_ok(span, part / blck, &span)) {
            return false;
        }
    }
    for (int i = 1; i < FERRY_MAX_DIMS; i++) {
        if (!ferry_mul_ok((size_t) (ne[i] - 1), nb[i], &step) || !ferry_add_ok(span, step, &span)) {
            return false;
        }
    }
    *out = span;
    return true;
}

size_t ferry_tensor_nbytes(const ferry_tensor * t) {
    size_t nbytes;
    if (!t) {
        return 0;
    }
    return layout_span(t->type, t->ne, t->nb, &nbytes) ? nbytes : SIZE_MAX; /* no tensor ferry makes overflows */
}

ferry_status ferry_layout_nbytes(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb, size_t * out) {
    FERRY_CHECK_ARG(ne && nb && out, "layout_nbytes: NULL argument");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "layout_nbytes: unknown type %d", (int) type);
    }
    if (n_dims < 1 || n_dims > FERRY_MAX_DIMS) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "layout_nbytes: n_dims %d is not in 1..%d", n_dims, FERRY_MAX_DIMS);
    }
    int64_t ne4[FERRY_MAX_DIMS] = {1, 1, 1, 1};
    size_t nb4[FERRY_MAX_DIMS] = {0};
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 0) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "layout_nbytes: ne[%d] = %lld is negative", i, (long long) ne[i]);
        }
        ne4[i] = ne[i];
        nb4[i] = nb[i];
    }
    if (!layout_span(type, ne4, nb4, out)) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "layout_nbytes: the span overflows");
    }
    return FERRY_OK;
}

bool ferry_tensor_is_contiguous(const ferry_tensor * t) {
    if (!t) {
        return false;
    }
    size_t expect = ferry_type_size(t->type);
    if (t->nb[0] != expect) {
        return false;
    }
    expect = expect * (size_t) (t->ne[0] / ferry_blck_size(t->type));
    for (int i = 1; i < FERRY_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) {
            return false;
        }
        expect *= (size_t) t->ne[i];
    }
    return true;
}

bool ferry_tensor_same_layout(const ferry_tensor * a, const ferry_tensor * b) {
    if (!a || !b || a->type != b->type) {
        return false;
    }
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) {
            return false;
        }
    }
    return true;
}

bool ferry_tensor_is_view(const ferry_tensor * t) { return t && t->view_src != NULL; }

/* A view's ne and nb past its n_dims: one-value dimensions, strided on. */
static void fill_view_dims(ferry_type type, int n_dims, int64_t * ne, size_t * nb) {
    for (int i = n_dims; i < FERRY_MAX_DIMS; i++) {
        ne[i] = 1;
    }
    strides_on(type, n_dims, FERRY_MAX_DIMS, ne, nb);
}

ferry_status ferry_view_strides(ferry_type type, int n_dims, const int64_t * ne, const size_t * nb, size_t * out) {
    FERRY_CHECK_ARG(ne && nb && out, "view_strides: NULL argument");
    if (!ferry_type_valid(type)) {
        return ferry_fail(FERRY_ERR_UNKNOWN_TYPE, "view_strides: unknown type %d", (int) type);
    }
    FERRY_TRY(check_shape(type, n_dims, ne, "view"));
    int64_t ne4[FERRY_MAX_DIMS];
    for (int i = 0; i < n_dims; i++) {
        ne4[i] = ne[i];
        out[i] = nb[i];
    }
    fill_view_dims(type, n_dims, ne4, out);
    return FERRY_OK;
}

ferry_status ferry_tensor_view(ferry_context * ctx, ferry_tensor * src, int n_dims, const int64_t * ne,
                               const size_t * nb, size_t offset, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && src && out, "view: NULL argument");
    FERRY_TRY(check_shape(src->type, n_dims, ne, "view"));
    FERRY_CHECK_ARG(nb || n_dims == 1, "view: NULL strides for %d dimensions", n_dims);
    const size_t unit = ferry_type_size(src->type);
    if (nb && nb[0] != unit) {
        const bool blocks = ferry_blck_size(src->type) > 1;
        return ferry_fail(FERRY_ERR_LAYOUT, "view: nb[0] is %zu but a %s %s is %zu bytes%s", nb[0],
                          ferry_type_name(src->type), blocks ? "block" : "element", unit,
                          blocks ? " (block types keep dimension 0 innermost)" : "");
    }
    ferry_tensor tmp = {.type = src->type};
    tmp.nb[0] = unit;
    for (int i = 0; i < n_dims; i++) {
        tmp.ne[i] = ne[i];
        tmp.nb[i] = i ? nb[i] : unit;
    }
    fill_view_dims(src->type, n_dims, tmp.ne, tmp.nb);
    /* The span must fit inside the memory src reads from, without overflow. */
    size_t span = ferry_type_size(src->type);
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        size_t step;
        if (tmp.ne[i] > 0 && (!ferry_mul_ok((size_t) (tmp.ne[i] - 1), tmp.nb[i], &step) ||
                              !ferry_add_ok(span, step, &span))) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "view: strides overflow");
        }
    }
    /* The view must stay inside the span of its own source, not just of the root. */
    const size_t src_bytes = ferry_tensor_nbytes(src);
    const size_t view_bytes = ferry_tensor_nbytes(&tmp);
    size_t end;
    if (!ferry_add_ok(offset, view_bytes, &end) || end > src_bytes) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "view: offset %zu + %zu bytes reaches past the %zu bytes of its source '%s'",
                          offset, view_bytes, src_bytes, src->name);
    }
    ferry_tensor * v;
    FERRY_TRY(new_view(ctx, src, FERRY_OP_VIEW, offset, &v));
    memcpy(v->ne, tmp.ne, sizeof(v->ne));
    memcpy(v->nb, tmp.nb, sizeof(v->nb));
    *out = v;
    return FERRY_OK;
}

ferry_status ferry_tensor_permute(ferry_context * ctx, ferry_tensor * t, int axis0, int axis1, int axis2,
                                  int axis3, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && t && out, "permute: NULL argument");
    const int axis[FERRY_MAX_DIMS] = {axis0, axis1, axis2, axis3};
    int seen = 0;
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        if (axis[i] < 0 || axis[i] >= FERRY_MAX_DIMS || (seen & (1 << axis[i]))) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "permute: (%d, %d, %d, %d) is not a permutation of 0..3",
                              axis0, axis1, axis2, axis3);
        }
        seen |= 1 << axis[i];
    }
    ferry_tensor * v;
    FERRY_TRY(new_view(ctx, t, FERRY_OP_PERMUTE, 0, &v));
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        v->ne[axis[i]] = t->ne[i];
        v->nb[axis[i]] = t->nb[i];
        v->op_params[i] = axis[i];
    }
    *out = v;
    return FERRY_OK;
}

ferry_status ferry_tensor_transpose(ferry_context * ctx, ferry_tensor * t, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && t && out, "transpose: NULL argument");
    FERRY_TRY(ferry_tensor_permute(ctx, t, 1, 0, 2, 3, out));
    (*out)->op = FERRY_OP_TRANSPOSE;
    return FERRY_OK;
}

ferry_status ferry_tensor_reshape(ferry_context * ctx, ferry_tensor * t, int n_dims, const int64_t * ne,
                                  ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && t && out, "reshape: NULL argument");
    FERRY_TRY(check_shape(t->type, n_dims, ne, "reshape"));
    if (!ferry_tensor_is_contiguous(t)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "reshape: tensor '%s' is not contiguous", t->name);
    }
    int64_t n = 1;
    for (int i = 0; i < n_dims; i++) {
        n *= ne[i];
    }
    if (n != ferry_tensor_nelements(t)) {
        return ferry_fail(FERRY_ERR_LAYOUT, "reshape: %lld elements cannot become %lld",
                          (long long) ferry_tensor_nelements(t), (long long) n);
    }
    ferry_tensor * v;
    FERRY_TRY(new_view(ctx, t, FERRY_OP_RESHAPE, 0, &v));
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        v->ne[i] = i < n_dims ? ne[i] : 1;
    }
    ferry_tensor_set_contiguous_strides(v);
    *out = v;
    return FERRY_OK;
}

ferry_status ferry_tensor_set_name(ferry_tensor * t, const char * name) {
    FERRY_CHECK_ARG(t && name, "set_name: NULL argument");
    strncpy(t->name, name, FERRY_MAX_NAME - 1);
    t->name[FERRY_MAX_NAME - 1] = '\0';
    return FERRY_OK;
}

ferry_status ferry_tensor_set_used_cells(ferry_tensor * t, const ferry_tensor * lengths, int cell_dim, int stream_dim,
                                         int64_t limit) {
    FERRY_CHECK_ARG(t, "tensor_set_used_cells: NULL tensor");
    if (!lengths) {
        t->used_lengths = NULL;
        t->used_cell_dim = t->used_stream_dim = 0;
        t->used_limit = 0;
        return FERRY_OK;
    }
    if (cell_dim < 0 || cell_dim >= FERRY_MAX_DIMS || stream_dim < 0 || stream_dim >= FERRY_MAX_DIMS ||
        cell_dim == stream_dim) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "tensor_set_used_cells: cell_dim %d and stream_dim %d of '%s' must "
                          "be two different dimensions in 0..3", cell_dim, stream_dim, t->name);
    }
    if (lengths->type != FERRY_TYPE_I32 || lengths->ne[0] != t->ne[stream_dim] || lengths->ne[1] != 1 ||
        lengths->ne[2] != 1 || lengths->ne[3] != 1) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_set_used_cells: lengths '%s' is %s [%lld, %lld, %lld, %lld]; "
                          "it must be i32 [%lld], one length per stream of '%s' (its ne[%d]: stream_dim)", lengths->name,
                          ferry_type_name(lengths->type), (long long) lengths->ne[0], (long long) lengths->ne[1],
                          (long long) lengths->ne[2], (long long) lengths->ne[3], (long long) t->ne[stream_dim],
                          t->name, stream_dim);
    }
    if (limit != 0 && limit < t->ne[cell_dim]) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "tensor_set_used_cells: limit %lld is below the %lld cells of '%s' "
                          "(its ne[%d]: cell_dim); 0 takes them", (long long) limit, (long long) t->ne[cell_dim], t->name,
                          cell_dim);
    }
    if (cell_dim == 0 && ferry_blck_size(t->type) != 1) {
        return ferry_fail(FERRY_ERR_LAYOUT, "tensor_set_used_cells: cells on dimension 0 (cell_dim) of '%s', a %s tensor, "
                          "would split its blocks of %lld values", t->name, ferry_type_name(t->type),
                          (long long) ferry_blck_size(t->type));
    }
    t->used_lengths = lengths;
    t->used_cell_dim = cell_dim;
    t->used_stream_dim = stream_dim;
    t->used_limit = limit ? limit : t->ne[cell_dim];
    return FERRY_OK;
}
