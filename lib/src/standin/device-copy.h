/* How the stand-in's link writes its memory (device-copy.c). */
#ifndef FERRY_DEVICE_COPY_H
#define FERRY_DEVICE_COPY_H

#include "ferry-impl.h"

/* rows rows of size bytes, row r from src + r * src_stride to dst + r * dst_stride, visible to
 * every thread that synchronizes with the caller after it returns. */
void ferry_standin_copy_rows(char * dst, size_t dst_stride, const char * src, size_t src_stride, size_t size,
                             size_t rows);
/* A gather's rows: piece i's rows from src to dst at its offsets, as ferry_standin_copy_rows. */
void ferry_standin_gather_rows(char * dst, const char * src, const ferry_gather_copy * pieces, size_t n);

#endif
