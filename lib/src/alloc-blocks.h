/* The allocator's memory model (alloc-blocks.c): offsets in up to
 * FERRY_GALLOC_MAX_CHUNKS chunks of one buffer type, with no memory behind them.
 * alloc.c measures a graph with it, then makes buffers of the sizes it reports. */
#ifndef FERRY_ALLOC_BLOCKS_H
#define FERRY_ALLOC_BLOCKS_H

#include "ferry-impl.h"

typedef struct {
    size_t offset, size;
} ferry_block;

typedef struct {
    ferry_block * free; /* sorted by offset, never adjacent; the last may run to cap */
    int n_free;
    size_t cap_free;
    size_t cap;  /* the most this chunk may hold: the max size, or one oversized tensor */
    size_t high; /* what it needs: the highest end of anything placed in it */
} ferry_chunk;

typedef struct {
    size_t alignment, max_size;
    bool last_of_equal; /* of free blocks that fit equally well, take the last (else the first) */
    ferry_chunk chunks[FERRY_GALLOC_MAX_CHUNKS];
    int n_chunks;
    bool out_of_chunks; /* an alloc failed for want of a chunk (not of heap memory) */
    bool tied; /* an alloc had equally good free blocks to choose from: last_of_equal mattered */
} ferry_blocks;

void ferry_blocks_init(ferry_blocks * b, size_t alignment, size_t max_size);
/* Empty b for another walk, keeping the chunks' free lists' memory (no heap calls). */
void ferry_blocks_reset(ferry_blocks * b, size_t alignment, size_t max_size, bool last_of_equal);
void ferry_blocks_release(ferry_blocks * b);
/* size rounded up to the alignment (a zero size takes one alignment unit). */
size_t ferry_blocks_round(const ferry_blocks * b, size_t size);
/* Place size bytes (already rounded) for the tensor named what (an error message names it).
 * FERRY_ERR_OUT_OF_MEMORY when it needs a chunk past FERRY_GALLOC_MAX_CHUNKS. */
ferry_status ferry_blocks_alloc(ferry_blocks * b, size_t size, const char * what, int * chunk, size_t * offset);
ferry_status ferry_blocks_free(ferry_blocks * b, int chunk, size_t offset, size_t size);

#endif
