/* The graph allocator's interface to the scheduler (alloc.c, sched.c). */
#ifndef FERRY_ALLOC_IMPL_H
#define FERRY_ALLOC_IMPL_H

#include "ferry-impl.h"

/* A leaf of the graph that is written during the run, not before it: the scheduler's
 * copy of a split input, made from src just before the node at index `node` runs (its split's first). */
typedef struct {
    const ferry_tensor * copy; /* a leaf of the graph */
    const ferry_tensor * src;  /* what it is copied from: kept alive until then (NULL: nothing to keep) */
    int node;                  /* the node it is written before, 0..n_nodes-1 */
    bool kept;                 /* its memory is its own to the run's end and after (written for the next run) */
} ferry_gallocr_copy;

/* ferry_gallocr_reserve, with copies: each copy's memory is placed as its node begins
 * (it may be memory freed by the nodes before), and its src lives until that node
 * has run. alloc_graph reuses them with the ids; a plain reserve forgets them. */
ferry_status ferry_gallocr_reserve_copies(ferry_gallocr * galloc, ferry_graph * graph, const int * node_buft_ids,
                                          const int * leaf_buft_ids, const ferry_gallocr_copy * copies,
                                          int n_copies);

/* Place the tensors of the graph the last reserve measured, as alloc_graph would after
 * measuring it again: for a caller that reserves and allocates one graph back to back,
 * with nothing changed in between (the scheduler). */
ferry_status ferry_gallocr_place_reserved(ferry_gallocr * galloc);

/* Does t have memory of its own that the allocator did not place (a KV cache's, a user's)?
 * The scheduler prefetches copies only of such sources: nothing in the graph writes them. */
bool ferry_gallocr_has_foreign_memory(const ferry_gallocr * galloc, const ferry_tensor * t);

#endif
