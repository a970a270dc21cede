/* How the stand-in's link writes its memory (device-copy.c). */
#ifndef FERRY_DEVICE_COPY_H
#define FERRY_DEVICE_COPY_H

#include "backend-impl.h"
#include "link.h"

/* rows rows of size bytes, row r from src + r * src_stride to dst + r * dst_stride, visible to
 * every thread that synchronizes with the caller after it returns. pace (NULL: none): a bulk
 * transfer is written piece by piece at the pace of its slot on the link (ferry_link_pace). */
void ferry_standin_copy_rows(char * dst, size_t dst_stride, const char * src, size_t src_stride, size_t size,
                             size_t rows, const link_slot * pace);
/* A gather's rows: piece i's rows from src to dst at its offsets, as ferry_standin_copy_rows. */
void ferry_standin_gather_rows(char * dst, const char * src, const ferry_gather_copy * pieces, size_t n);

#endif
