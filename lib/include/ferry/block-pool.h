/* ferry/block-pool.h: a paged cache's blocks kept on a device, and the table attention reads them by. */
#ifndef FERRY_BLOCK_POOL_H
#define FERRY_BLOCK_POOL_H

#include "paged.h"
#include "sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- a device block pool (block-pool.c) */

/*
 * A device pool of a paged cache's blocks: per layer a K and a V pool of n_slots slots of
 * block_size cells in the backend's default buffer type, laid out as the cache's pools are
 * (K [n_embd_k, n_slots * block_size], cell c of slot b at cell b * block_size + c; V the same
 * or, transposed, [n_slots * block_size, n_embd_v]), the cache's types; and a device table, i32
 * [max_blocks, n_seq] (max_blocks: the cache's n_blocks), row s holding the slot of each block
 * of sequence s's table that the last sync made readable. A slot holds one block for every layer.
 *
 * ferry_block_pool_sync sends to the device only what must cross: a block that several of the
 * synced sequences read crosses once; a block already in a slot whose cells are unchanged does
 * not cross again; a block whose cells grew sends its new cells only (the pool keeps each slot's
 * valid cells). The caller's contract is the cell-per-stream cache's under prefetch across steps
 * (ferry_sched_drop_ahead, ferry_sched_truncate): a cell a sync read is not rewritten before the
 * next unless the caller says so, with ferry_block_pool_drop_ahead (every slot sent again) or
 * ferry_block_pool_truncate (a sequence's cells from a length on); a block given back to the
 * cache's free list and taken again holds new cells, so say it. Cells and table rows go by the
 * backend's async sets (2-D for a transposed V): a compute on the backend, or
 * ferry_backend_synchronize, waits for them, and they are counted, byte for byte, in the pool's
 * buffers' transfer counters (ferry_block_pool_get_stats).
 *
 * When the blocks read do not all fit, slots of blocks not read by this sync are taken again,
 * least recently read first, except the resident set's (ferry_block_pool_set_resident), which
 * stay until the set changes.
 */
typedef struct ferry_block_pool ferry_block_pool;

/* What a pool sent and kept since it was made or its stats reset. */
typedef struct {
    uint64_t syncs;
    uint64_t cell_bytes;    /* K and V cells sent, every layer */
    uint64_t table_bytes;   /* device table entries sent */
    uint64_t transfers;     /* async sets made (cells and table) */
    uint64_t blocks_sent;   /* blocks sent from cell 0 (not in a slot, or dropped) */
    uint64_t blocks_grown;  /* blocks in a slot that sent their new cells only */
    uint64_t blocks_kept;   /* blocks read that did not cross */
    uint64_t evictions;     /* slots taken from a block not read by the sync */
    uint64_t syncs_ahead;   /* syncs made under prefetch (ferry_block_pool_set_prefetch) */
    uint64_t bytes_ahead;   /* their cell and table bytes, sent on the copy queue ahead of the compute */
    ferry_stats buffers;    /* the pool's buffers' transfer counters: every byte that crossed */
} ferry_block_pool_stats;

/*
 * A pool of n_slots slots (1..the cache's n_blocks) on backend for every layer of cache, whose
 * pools must be in host memory. Refused: NULL arguments, n_slots out of range, a layer of the
 * cache not in host memory, types the backend's buffer type cannot hold, memory the backend
 * does not have (OUT_OF_MEMORY, naming the bytes). The pool reads the cache's tables and pools
 * at each sync: the cache must outlive it.
 */
FERRY_API ferry_status ferry_block_pool_new(const ferry_paged_cache * cache, ferry_backend * backend, int64_t n_slots,
                                            ferry_block_pool ** out);
FERRY_API void         ferry_block_pool_free(ferry_block_pool * pool);
FERRY_API int64_t      ferry_block_pool_n_slots(const ferry_block_pool * pool);
/* Layer layer's device K and V pools, and the device table: the pool's tensors (not to be freed). */
FERRY_API ferry_status ferry_block_pool_k(const ferry_block_pool * pool, int32_t layer, ferry_tensor ** out);
FERRY_API ferry_status ferry_block_pool_v(const ferry_block_pool * pool, int32_t layer, ferry_tensor ** out);
FERRY_API ferry_status ferry_block_pool_table(const ferry_block_pool * pool, ferry_tensor ** out);

/*
 * Sequences s0..s1 - 1's first lengths[s - s0] cells (lengths NULL: the cells each table holds)
 * made readable through the device table, as described above. Refused, with nothing sent or
 * changed: sequences the cache does not have, a length negative or past its sequence's cells,
 * more distinct blocks read than the slots not held by the resident set's other blocks
 * (OUT_OF_MEMORY, naming both counts: sync fewer sequences at a time).
 */
FERRY_API ferry_status ferry_block_pool_sync(ferry_block_pool * pool, int64_t s0, int64_t s1,
                                             const int32_t * lengths);
/* Every slot's cells are sent again at the next sync (what ferry_sched_drop_ahead is to a window). */
FERRY_API ferry_status ferry_block_pool_drop_ahead(ferry_block_pool * pool);
/*
 * Sequence seq's cells at and above length may be rewritten (a rollback): the blocks of its
 * table keep only their cells below it, and the next sync sends the rest again as it grows.
 * Refused: a sequence the cache does not have, a negative length.
 */
FERRY_API ferry_status ferry_block_pool_truncate(ferry_block_pool * pool, int64_t seq, int64_t length);

/*
 * The blocks kept in slots from now on (n_blocks cache block ids, each once; 0 of them clears
 * the set): a sync never takes their slots for another block. They are sent at the next sync
 * that reads them. Refused, with the set unchanged: an id outside the cache's blocks or twice,
 * more blocks than slots.
 */
FERRY_API ferry_status ferry_block_pool_set_resident(ferry_block_pool * pool, const int32_t * blocks,
                                                     int64_t n_blocks);
/*
 * The resident set a pool of n_resident slots should keep for sequences s0..s1 - 1 read to
 * lengths (NULL: their cells), best first: blocks read by more sequences first, then by what a
 * block costs to send again each step it is streamed, by the backend's copy cost model
 * (ferry_backend_copy_cost_model: the stand-in's link and piece curve): per layer its K and V pieces,
 * a block alone in the host pool a call and pieces priced by their size, one whose table neighbour
 * follows it in the host pool its bytes at the link's peak (it joins their piece), less a call when
 * both neighbours do (kept, it would split their run); then more cells read, then lower ids. *n_out
 * is min(n_resident, the distinct blocks read); up to max_out ids into out. Refused as sync is.
 */
FERRY_API ferry_status ferry_block_pool_choose_resident(const ferry_block_pool * pool, int64_t s0, int64_t s1,
                                                        const int32_t * lengths, int64_t n_resident, int32_t * out,
                                                        int64_t max_out, int64_t * n_out);

/*
 * A pool that holds fewer slots than the blocks sequences s0..s1 - 1 read to lengths (NULL: their
 * cells): decode reads every block every step in the same order, where least recently read goes
 * thrashes. So: keep a resident set (ferry_block_pool_choose_resident of the slots left when the
 * streaming slots are set aside: the most blocks one sequence reads alone, or, where the pool
 * cannot keep every shared block besides, the most it reads) and stream the rest through the
 * streaming slots, the sequences in groups whose streamed blocks fit them. Sets the resident set
 * and writes the groups' ends (each group s..end - 1 after the last's end; the last ends at s1)
 * into group_ends, up to max_groups of them; *n_groups is their count. All blocks fitting: every
 * block resident, one group. Sync and compute one group at a time. Refused: as sync is, a
 * sequence whose blocks do not fit the streaming slots (OUT_OF_MEMORY: make the pool larger).
 */
FERRY_API ferry_status ferry_block_pool_plan(ferry_block_pool * pool, int64_t s0, int64_t s1, const int32_t * lengths,
                                             int64_t * group_ends, int64_t max_groups, int64_t * n_groups);

/*
 * Prefetch: a sync's sends go on the backend's copy queue (the backend itself where it has none),
 * an event recorded after them, so that the next group's blocks (or the next step's first group's)
 * cross while the current group computes; ferry_block_pool_wait before the compute that reads
 * them. A sync under prefetch keeps the slots the sync before it read (their compute may still
 * run), and ferry_block_pool_plan halves the streaming slots so that two groups' streamed blocks
 * fit together. The compute of the sync before the last must be done when a sync is made
 * (ferry_sched_compute returns when it is). The bytes and the outputs are those of serial syncs;
 * the stats count the syncs made ahead and their bytes. Turning it off waits for what is in
 * flight. Refused: a backend whose queue cannot make events (UNSUPPORTED).
 */
FERRY_API ferry_status ferry_block_pool_set_prefetch(ferry_block_pool * pool, bool ahead);
FERRY_API bool         ferry_block_pool_prefetch(const ferry_block_pool * pool);
/* The backend's later work waits for the last sync's sends (on the device where it can, else here);
 * a pool not prefetching, or with nothing in flight, returns at once. */
FERRY_API ferry_status ferry_block_pool_wait(ferry_block_pool * pool);

FERRY_API ferry_status ferry_block_pool_get_stats(const ferry_block_pool * pool, ferry_block_pool_stats * out);
FERRY_API void         ferry_block_pool_reset_stats(ferry_block_pool * pool);

/*
 * A decode step's attention over the pool: per layer l of 0..n_layer - 1 a paged attention node
 * (ferry_attn_paged) of q[l] over layer l's device pools through the device table's rows
 * s0..s1 - 1 and kv_len (i32 [s1 - s0]), scale 1/sqrt(head_dim), named "attn<l>", marked output,
 * assigned to the pool's backend (which must be the scheduler's) and built into graph in layer
 * order; outs[l] its output, written only on success. Nothing crosses for K and V when the graph
 * computes: sync the same sequences and lengths before each compute (the table's rows are read
 * then, the kv_len copied as any input is). Refused as ferry_kv_attention_step is (NULL arguments,
 * n_layer out of range, shapes attention cannot read, a backend not the scheduler's), and for
 * sequences the cache does not have; what was made before a refusal stays in ctx.
 */
FERRY_API ferry_status ferry_block_pool_attention_step(const ferry_block_pool * pool, ferry_context * ctx,
                                                       int32_t n_layer, int64_t s0, int64_t s1,
                                                       ferry_tensor * const * q, ferry_tensor * kv_len,
                                                       ferry_sched * sched, ferry_graph * graph,
                                                       ferry_tensor ** outs);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_BLOCK_POOL_H */
