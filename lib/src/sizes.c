/* Byte extents of row transfers, with every addition and product checked for overflow. */
#include "ferry-impl.h"

bool ferry_extent_2d(size_t offset, size_t size, size_t n_copies, size_t stride, size_t * end) {
    size_t last_row = 0;
    if (n_copies > 1 && !ferry_mul_ok(n_copies - 1, stride, &last_row)) {
        return false;
    }
    size_t start = 0;
    return ferry_add_ok(offset, last_row, &start) && ferry_add_ok(start, size, end);
}

bool ferry_rows_extent(size_t size, size_t n_copies, size_t stride_data, size_t * out) {
    if (!out) {
        return false;
    }
    if (size == 0 || n_copies == 0) {
        *out = 0;
        return true;
    }
    return ferry_extent_2d(0, size, n_copies, stride_data, out);
}
