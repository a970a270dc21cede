/*
 * Compact staging: the layout of a copy that holds only the bytes a view reads. A view
 * whose plan is one 2-D copy reading no byte twice (the K window, the transposed V
 * window) packs into its own dimensions, in its stride order, with the gaps closed.
 */
#include "copy-impl.h"

bool ferry_single_copy_of(const ferry_tensor * t, ferry_copy_2d * out) {
    size_t n = 0, row = 0;
    if (ferry_copy_plan(t, out, 1, &n) != FERRY_OK || n != 1 || ferry_row_size(t->type, t->ne[0], &row) != FERRY_OK) {
        ferry_clear_error(); /* no plan of one copy: not an error, just no compaction */
        return false;
    }
    return (uint64_t) out->size * out->count == (uint64_t) row * (uint64_t) ferry_tensor_nrows(t);
}

/* Strides with t's dimensions in t's stride order and no gaps (dimension 0 in blocks). */
static void compact_strides(const ferry_tensor * t, size_t nb[FERRY_MAX_DIMS]) {
    int order[FERRY_MAX_DIMS] = {0, 1, 2, 3};
    for (int i = 1; i < FERRY_MAX_DIMS; i++) { /* insertion sort by stride, ties by index */
        for (int j = i; j > 0 && t->nb[order[j - 1]] > t->nb[order[j]]; j--) {
            const int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    }
    size_t extent = ferry_type_size(t->type);
    for (int i = 0; i < FERRY_MAX_DIMS; i++) {
        const int d = order[i];
        nb[d] = extent;
        extent *= (size_t) (d == 0 ? t->ne[0] / ferry_blck_size(t->type) : t->ne[d]);
    }
}

ferry_status ferry_tensor_compact_layout(ferry_context * ctx, const ferry_tensor * t, ferry_tensor ** out) {
    FERRY_CHECK_ARG(ctx && t && out, "compact_layout: NULL argument");
    FERRY_TRY(ferry_tensor_dup_layout(ctx, t, out));
    ferry_copy_2d c;
    if (ferry_tensor_nelements(t) > 0 && ferry_single_copy_of(t, &c)) {
        compact_strides(t, (*out)->nb);
    }
    return FERRY_OK;
}

bool ferry_tensor_is_compact_of(const ferry_tensor * dst, const ferry_tensor * src) {
    if (!dst || !src || dst->type != src->type || ferry_tensor_same_layout(dst, src)) {
        return false;
    }
    size_t nb[FERRY_MAX_DIMS];
    compact_strides(src, nb);
    ferry_copy_2d c;
    for (int d = 0; d < FERRY_MAX_DIMS; d++) {
        if (dst->ne[d] != src->ne[d] || dst->nb[d] != nb[d]) {
            return false;
        }
    }
    return ferry_single_copy_of(src, &c);
}
