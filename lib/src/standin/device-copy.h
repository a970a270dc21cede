/* How the stand-in's link writes its memory (device-copy.c). */
#ifndef FERRY_DEVICE_COPY_H
#define FERRY_DEVICE_COPY_H

#include <stdbool.h>
#include <stddef.h>

/* rows rows of size bytes, row r from src + r * src_stride to dst + r * dst_stride, visible to
 * every thread that synchronizes with the caller after it returns. */
void ferry_standin_copy_rows(char * dst, size_t dst_stride, const char * src, size_t src_stride, size_t size,
                             size_t rows);

#endif
