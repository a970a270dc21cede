/*
 * Offsets for the graph allocator, per buffer type: chunks of free blocks.
 *
 * Where a request goes, in order of preference:
 *   1. the smallest free block that holds it within what its chunk already needs
 *      (reuse costs nothing), the first or the last of equal ones (last_of_equal);
 *   2. else the block that makes its chunk grow least (in practice a chunk's tail);
 *   3. else a new chunk, of the max size, or exactly the request when that is larger.
 * Freed blocks merge with free neighbours, so two freed tensors side by side can hold
 * one tensor of their combined size.
 */
#include "alloc-blocks.h"

#include <stdlib.h>
#include <string.h>

void ferry_blocks_init(ferry_blocks * b, size_t alignment, size_t max_size) {
    memset(b, 0, sizeof(*b));
    b->alignment = alignment ? alignment : 1;
    b->max_size = max_size ? max_size : SIZE_MAX;
}

void ferry_blocks_reset(ferry_blocks * b, size_t alignment, size_t max_size, bool last_of_equal) {
    for (int c = 0; c < FERRY_GALLOC_MAX_CHUNKS; c++) {
        ferry_chunk * ch = &b->chunks[c];
        ch->n_free = 0;
        ch->cap = ch->high = 0;
    }
    b->alignment = alignment ? alignment : 1;
    b->max_size = max_size ? max_size : SIZE_MAX;
    b->last_of_equal = last_of_equal;
    b->n_chunks = 0;
    b->out_of_chunks = b->tied = false;
}

void ferry_blocks_release(ferry_blocks * b) {
    for (int c = 0; c < FERRY_GALLOC_MAX_CHUNKS; c++) {
        free(b->chunks[c].free);
        b->chunks[c].free = NULL;
        b->chunks[c].cap_free = 0;
        b->chunks[c].n_free = 0;
    }
    b->n_chunks = 0;
}

size_t ferry_blocks_round(const ferry_blocks * b, size_t size) {
    const size_t a = b->alignment;
    if (size == 0) {
        return a;
    }
    return size > SIZE_MAX - (a - 1) ? SIZE_MAX - (SIZE_MAX % a) : (size + a - 1) / a * a;
}

static ferry_status insert_block(ferry_chunk * c, int at, ferry_block blk) {
    ferry_block * grown = ferry_grow(c->free, &c->cap_free, (size_t) c->n_free + 1, sizeof(*grown));
    if (!grown) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "allocator: out of memory");
    }
    c->free = grown;
    memmove(&c->free[at + 1], &c->free[at], (size_t) (c->n_free - at) * sizeof(*c->free));
    c->free[at] = blk;
    c->n_free++;
    return FERRY_OK;
}

static void remove_block(ferry_chunk * c, int at) {
    memmove(&c->free[at], &c->free[at + 1], (size_t) (c->n_free - at - 1) * sizeof(*c->free));
    c->n_free--;
}

/* Take size bytes from the front of free block i of chunk c. */
static void take(ferry_chunk * c, int i, size_t size, size_t * offset) {
    ferry_block * blk = &c->free[i];
    *offset = blk->offset;
    blk->offset += size;
    blk->size -= size;
    if (blk->size == 0) {
        remove_block(c, i);
    }
    if (*offset + size > c->high) {
        c->high = *offset + size;
    }
}

ferry_status ferry_blocks_alloc(ferry_blocks * b, size_t size, const char * what, int * chunk, size_t * offset) {
    /* 1: best fit within what chunks already need */
    int best_c = -1, best_i = -1;
    size_t best = 0;
    bool tie = false; /* another block fits as well as the best so far */
    for (int c = 0; c < b->n_chunks; c++) {
        const ferry_chunk * ch = &b->chunks[c];
        for (int i = 0; i < ch->n_free; i++) {
            const ferry_block * blk = &ch->free[i];
            if (blk->size < size || blk->offset + size > ch->high) {
                continue;
            }
            if (best_c >= 0 && blk->size == best) {
                tie = true;
            }
            if (best_c < 0 || blk->size < best || (b->last_of_equal && blk->size == best)) {
                tie = tie && best_c >= 0 && blk->size == best;
                best_c = c, best_i = i, best = blk->size;
            }
        }
    }
    b->tied = b->tied || tie;
    /* 2: the least growth */
    if (best_c < 0) {
        size_t best_growth = SIZE_MAX;
        int grow_c = -1, grow_i = -1;
        for (int c = 0; c < b->n_chunks; c++) {
            const ferry_chunk * ch = &b->chunks[c];
            for (int i = 0; i < ch->n_free; i++) {
                const ferry_block * blk = &ch->free[i];
                if (blk->size >= size && blk->offset + size - ch->high < best_growth) {
                    best_growth = blk->offset + size - ch->high;
                    grow_c = c, grow_i = i;
                }
            }
        }
        best_c = grow_c, best_i = grow_i;
    }
    /* 3: a new chunk */
    if (best_c < 0) {
        if (b->n_chunks == FERRY_GALLOC_MAX_CHUNKS) {
            b->out_of_chunks = true;
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY,
                              "allocator: tensor '%s' (%zu bytes) needs a chunk beyond the %d that a buffer type may have"
                              " (max size %zu)",
                              what, size, FERRY_GALLOC_MAX_CHUNKS, b->max_size);
        }
        ferry_chunk * ch = &b->chunks[b->n_chunks];
        ch->n_free = 0; /* its free list's memory may be a past walk's: kept */
        ch->high = 0;
        ch->cap = size > b->max_size ? size : b->max_size;
        FERRY_TRY(insert_block(ch, 0, (ferry_block) {0, ch->cap}));
        best_c = b->n_chunks++;
        best_i = 0;
    }
    take(&b->chunks[best_c], best_i, size, offset);
    *chunk = best_c;
    return FERRY_OK;
}

ferry_status ferry_blocks_free(ferry_blocks * b, int chunk, size_t offset, size_t size) {
    ferry_chunk * ch = &b->chunks[chunk];
    int at = 0;
    while (at < ch->n_free && ch->free[at].offset < offset) {
        at++;
    }
    const bool join_prev = at > 0 && ch->free[at - 1].offset + ch->free[at - 1].size == offset;
    const bool join_next = at < ch->n_free && offset + size == ch->free[at].offset;
    if (join_prev && join_next) {
        ch->free[at - 1].size += size + ch->free[at].size;
        remove_block(ch, at);
    } else if (join_prev) {
        ch->free[at - 1].size += size;
    } else if (join_next) {
        ch->free[at].offset = offset;
        ch->free[at].size += size;
    } else {
        FERRY_TRY(insert_block(ch, at, (ferry_block) {offset, size}));
    }
    return FERRY_OK;
}
