/*
 * A paged cache's blocks kept on a device (ferry/block-pool.h): slots of every layer's K and V,
 * a device table from each sequence's blocks to slots, and what each slot holds, so that a sync
 * sends a block once, and then only the cells it grew by.
 */
#include "ferry-impl.h"
#include "kv-layers.h"
#include "sched-impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ferry_block_pool {
    const ferry_paged_cache * cache;
    ferry_paged_params params;
    ferry_backend * backend;
    int64_t n_slots;
    ferry_kv_layers layers;   /* the device K and V pools, one buffer */
    ferry_context * table_ctx;
    ferry_tensor * table;     /* i32 [max_blocks, n_seq] */
    ferry_buffer * table_buf;
    int64_t max_blocks;       /* the cache's n_blocks: the most a table holds */
    int32_t * table_sent;     /* what the device table holds, row by row */
    int32_t * ids;            /* scratch: one sequence's table */
    int32_t * slot_of;        /* per cache block: its slot, or -1 */
    int32_t * block_of;       /* per slot: its block, or -1 */
    int64_t * valid;          /* per slot: its block's cells sent, from cell 0 */
    uint64_t * last_read;     /* per slot: the stamp of the last sync that read it */
    uint8_t * resident;       /* per cache block: in the resident set */
    int64_t n_resident;
    int64_t * need;           /* per cache block: the cells this sync reads */
    uint64_t * mark;          /* per cache block: the stamp of the sync (or choice) that read it */
    int32_t * readers;        /* per cache block: the sequences reading it (choose_resident) */
    uint8_t * runs_on;        /* per cache block: its table neighbours read that follow it in the host pool */
    int32_t * order;          /* scratch: the distinct blocks read, in order of first read */
    uint64_t stamp;
    /* Prefetch (ferry_block_pool_set_prefetch): sends on the copy queue, an event after each sync's,
     * and the slots the last sync read kept from the next (their compute may still read them). */
    bool ahead;
    ferry_backend * queue;    /* where sends go: the backend, or its copy queue when ahead */
    ferry_event * sent;       /* recorded on the queue after an ahead sync's sends */
    bool waiting;             /* an ahead sync's sends not yet waited for */
    uint64_t last_sync;       /* the stamp of the last sync */
    ferry_block_pool_stats stats;
};

/* The device pools have the cache's pools' layout, n_slots blocks of cells each. */
static void slot_shape(const void * pool, int32_t layer, int64_t ne[FERRY_MAX_DIMS]) {
    (void) layer;
    const ferry_block_pool * p = pool;
    ne[0] = p->params.head_dim * p->params.n_head_kv;
    ne[1] = p->n_slots * p->params.block_size;
}

static const ferry_kv_layout slot_layout = {
    .what = "block_pool", .tensors = "block_pool", .one = " pool", .pair = "K and V pools", .n_dims = 2,
    .may_leave_unplaced = false, .k_shape = slot_shape,
};

void ferry_block_pool_free(ferry_block_pool * pool) {
    if (!pool) {
        return;
    }
    ferry_event_free(pool->sent); /* waits for the sends it stands for */
    ferry_kv_layers_free(&pool->layers);
    ferry_buffer_free(pool->table_buf);
    ferry_context_free(pool->table_ctx);
    free(pool->table_sent);
    free(pool->ids);
    free(pool->slot_of);
    free(pool->block_of);
    free(pool->valid);
    free(pool->last_read);
    free(pool->resident);
    free(pool->need);
    free(pool->mark);
    free(pool->readers);
    free(pool->runs_on);
    free(pool->order);
    free(pool);
}

static ferry_status check_cache(const ferry_paged_cache * cache, int64_t n_slots, ferry_paged_params * p) {
    FERRY_TRY(ferry_paged_cache_params(cache, p));
    if (n_slots <= 0 || n_slots > p->n_blocks) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_new: n_slots %lld is not in 1..%lld (the cache's "
                          "blocks)", (long long) n_slots, (long long) p->n_blocks);
    }
    if (n_slots > INT32_MAX / p->block_size) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_new: %lld slots of %lld cells are past a table's "
                          "int32 cells", (long long) n_slots, (long long) p->block_size);
    }
    for (int32_t l = 0; l < p->n_layer; l++) {
        const ferry_buffer * buf = ferry_paged_cache_layer_buffer(cache, l);
        if (!buf || !ferry_buffer_is_host(buf)) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "block_pool_new: the cache's layer %d is not in host memory: "
                              "a block pool sends blocks from host pools", l);
        }
    }
    return FERRY_OK;
}

static ferry_status make_table(ferry_block_pool * p) {
    const size_t seqs = (size_t) p->params.n_seq, blocks = (size_t) p->params.n_blocks;
    const size_t slots = (size_t) p->n_slots;
    p->max_blocks = p->params.n_blocks;
    p->table_sent = ferry_calloc(seqs * blocks, sizeof(*p->table_sent));
    p->ids = ferry_calloc(blocks, sizeof(*p->ids));
    p->slot_of = ferry_malloc(blocks * sizeof(*p->slot_of));
    p->block_of = ferry_malloc(slots * sizeof(*p->block_of));
    p->valid = ferry_calloc(slots, sizeof(*p->valid));
    p->last_read = ferry_calloc(slots, sizeof(*p->last_read));
    p->resident = ferry_calloc(blocks, sizeof(*p->resident));
    p->need = ferry_calloc(blocks, sizeof(*p->need));
    p->mark = ferry_calloc(blocks, sizeof(*p->mark));
    p->readers = ferry_calloc(blocks, sizeof(*p->readers));
    p->runs_on = ferry_calloc(blocks, sizeof(*p->runs_on));
    p->order = ferry_calloc(blocks, sizeof(*p->order));
    if (!p->table_sent || !p->ids || !p->slot_of || !p->block_of || !p->valid || !p->last_read || !p->resident ||
        !p->need || !p->mark || !p->readers || !p->runs_on || !p->order) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_new: out of memory for the lists of %lld blocks and "
                          "%lld slots", (long long) blocks, (long long) slots);
    }
    for (size_t b = 0; b < blocks; b++) {
        p->slot_of[b] = -1;
    }
    for (size_t s = 0; s < slots; s++) {
        p->block_of[s] = -1;
    }
    FERRY_TRY(ferry_context_new(&p->table_ctx));
    const int64_t ne[2] = {p->max_blocks, p->params.n_seq};
    FERRY_TRY(ferry_tensor_new(p->table_ctx, FERRY_TYPE_I32, 2, ne, &p->table));
    FERRY_TRY(ferry_tensor_set_name(p->table, "block_pool_table"));
    FERRY_TRY(ferry_backend_alloc_buffer(p->backend, ferry_tensor_nbytes(p->table), &p->table_buf));
    FERRY_TRY(ferry_buffer_clear(p->table_buf, 0)); /* table_sent's zeros */
    return ferry_buffer_place_tensor(p->table_buf, p->table, 0);
}

ferry_status ferry_block_pool_new(const ferry_paged_cache * cache, ferry_backend * backend, int64_t n_slots,
                                  ferry_block_pool ** out) {
    FERRY_CHECK_ARG(cache && backend && out, "block_pool_new: NULL argument");
    ferry_paged_params params;
    FERRY_TRY(check_cache(cache, n_slots, &params));
    ferry_block_pool * p = ferry_calloc(1, sizeof(*p));
    if (!p) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_new: out of memory");
    }
    p->cache = cache;
    p->params = params;
    p->backend = backend;
    p->queue = backend;
    p->n_slots = n_slots;
    const ferry_kv_heads heads = FERRY_KV_HEADS_OF(&params);
    ferry_status st = ferry_kv_layers_make(&p->layers, &slot_layout, &heads, params.n_layer, p);
    if (st == FERRY_OK) {
        st = ferry_kv_layers_place(&p->layers, ferry_backend_default_buffer_type(backend), NULL);
    }
    if (st == FERRY_OK) {
        st = make_table(p);
    }
    if (st != FERRY_OK) {
        ferry_block_pool_free(p);
        return st;
    }
    ferry_block_pool_reset_stats(p); /* the clears are not crossings */
    *out = p;
    return FERRY_OK;
}

int64_t ferry_block_pool_n_slots(const ferry_block_pool * pool) { return pool ? pool->n_slots : -1; }

ferry_status ferry_block_pool_k(const ferry_block_pool * pool, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(pool, "block_pool_k: NULL argument");
    return ferry_kv_layers_tensor(&pool->layers, layer, false, out, "block_pool_k");
}

ferry_status ferry_block_pool_v(const ferry_block_pool * pool, int32_t layer, ferry_tensor ** out) {
    FERRY_CHECK_ARG(pool, "block_pool_v: NULL argument");
    return ferry_kv_layers_tensor(&pool->layers, layer, true, out, "block_pool_v");
}

ferry_status ferry_block_pool_table(const ferry_block_pool * pool, ferry_tensor ** out) {
    FERRY_CHECK_ARG(pool && out, "block_pool_table: NULL argument");
    *out = pool->table;
    return FERRY_OK;
}

static ferry_status check_seqs(const ferry_block_pool * p, int64_t s0, int64_t s1, const char * what) {
    if (s0 < 0 || s1 <= s0 || s1 > p->params.n_seq) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: sequences %lld..%lld are not a range of 0..%lld (the "
                          "cache's)", what, (long long) s0, (long long) s1, (long long) p->params.n_seq);
    }
    return FERRY_OK;
}

/* Sequence s's table into p->ids, its blocks read (*n_read) and its length read (*len). */
static ferry_status read_table(ferry_block_pool * p, int64_t s, const int32_t * lengths, int64_t s0, int64_t * len,
                               int64_t * n_read, const char * what) {
    int64_t n_blocks, n_cells;
    FERRY_TRY(ferry_paged_cache_table(p->cache, s, p->ids, p->max_blocks, &n_blocks, &n_cells));
    *len = lengths ? lengths[s - s0] : n_cells;
    if (*len < 0 || *len > n_cells) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "%s: sequence %lld's length %lld is not in 0..%lld (the cells "
                          "its table holds)", what, (long long) s, (long long) *len, (long long) n_cells);
    }
    *n_read = (*len + p->params.block_size - 1) / p->params.block_size;
    return FERRY_OK;
}

/* Mark the distinct blocks sequences s0..s1 - 1 read (p->order, *n_distinct, in order of first
 * read), with the most cells any of them reads (p->need) and how many read each (p->readers). */
static ferry_status mark_reads(ferry_block_pool * p, int64_t s0, int64_t s1, const int32_t * lengths,
                               int64_t * n_distinct, const char * what) {
    const int64_t bs = p->params.block_size;
    const uint64_t stamp = ++p->stamp;
    int64_t n = 0;
    for (int64_t s = s0; s < s1; s++) {
        int64_t len = 0, n_read = 0;
        FERRY_TRY(read_table(p, s, lengths, s0, &len, &n_read, what));
        for (int64_t j = 0; j < n_read; j++) {
            const int32_t b = p->ids[j];
            const int64_t cells = len - j * bs < bs ? len - j * bs : bs;
            if (p->mark[b] != stamp) {
                p->mark[b] = stamp;
                p->need[b] = cells;
                p->readers[b] = 0;
                p->runs_on[b] = (uint8_t) ((j > 0 && p->ids[j - 1] == b - 1) +
                                           (j + 1 < n_read && p->ids[j + 1] == b + 1));
                p->order[n++] = b;
            }
            p->readers[b]++;
            p->need[b] = cells > p->need[b] ? cells : p->need[b];
        }
    }
    *n_distinct = n;
    return FERRY_OK;
}

/* Under prefetch, slot s holds a block the last sync read: a compute may still read it. */
static bool kept_for_last(const ferry_block_pool * p, int64_t s) {
    return p->ahead && p->last_sync != 0 && p->last_read[s] == p->last_sync;
}

/* A slot for block b: a free one, else the least recently read of those whose block this sync does
 * not read and the resident set does not keep (mark_reads and the capacity check guarantee one). */
static int32_t take_slot(ferry_block_pool * p, int32_t b) {
    int32_t best = -1;
    for (int64_t s = 0; s < p->n_slots; s++) {
        const int32_t held = p->block_of[s];
        if (held < 0) {
            best = (int32_t) s;
            break;
        }
        if (p->mark[held] == p->stamp || p->resident[held] || kept_for_last(p, s)) {
            continue;
        }
        if (best < 0 || p->last_read[s] < p->last_read[best]) {
            best = (int32_t) s;
        }
    }
    if (p->block_of[best] >= 0) {
        p->slot_of[p->block_of[best]] = -1;
        p->stats.evictions++;
    }
    p->block_of[best] = b;
    p->slot_of[b] = best;
    p->valid[best] = 0;
    return best;
}

/* A run of cells to send: host pool cells from..from + n into slot cells to..to + n. */
typedef struct {
    int64_t from, to, n;
} cell_run;

/* The run's cells of every layer's K and V, one async set each (2-D for a transposed V). */
static ferry_status send_run(ferry_block_pool * p, const cell_run * r) {
    for (int32_t l = 0; l < p->params.n_layer; l++) {
        ferry_tensor * host[2], *dev[2] = {p->layers.k[l], p->layers.v[l]};
        FERRY_TRY(ferry_paged_cache_k(p->cache, l, &host[0]));
        FERRY_TRY(ferry_paged_cache_v(p->cache, l, &host[1]));
        for (int i = 0; i < 2; i++) {
            const char * src = host[i]->data;
            if (i == 1 && p->params.v_trans) {
                const size_t ts = host[i]->nb[0];
                FERRY_TRY(ferry_backend_tensor_set_2d_async(p->queue, dev[i], src + (size_t) r->from * ts,
                                                            (size_t) r->to * ts, (size_t) r->n * ts,
                                                            (size_t) dev[i]->ne[1], dev[i]->nb[1], host[i]->nb[1]));
                p->stats.cell_bytes += (uint64_t) r->n * ts * (uint64_t) dev[i]->ne[1];
            } else {
                const size_t row = host[i]->nb[1];
                FERRY_TRY(ferry_backend_tensor_set_async(p->queue, dev[i], src + (size_t) r->from * row,
                                                         (size_t) r->to * row, (size_t) r->n * row));
                p->stats.cell_bytes += (uint64_t) r->n * row;
            }
            p->stats.transfers++;
        }
    }
    return FERRY_OK;
}

/* Send block b's cells its slot lacks; adjacent pieces (next host cells into the next slot cells)
 * join the pending run, which goes when the next piece does not follow it. */
static ferry_status sync_block(ferry_block_pool * p, int32_t b, cell_run * run) {
    const int64_t bs = p->params.block_size;
    int32_t slot = p->slot_of[b];
    if (slot < 0) {
        slot = take_slot(p, b);
    }
    p->last_read[slot] = p->stamp;
    const int64_t from = p->valid[slot], to = p->need[b];
    if (to <= from) {
        p->stats.blocks_kept++;
        return FERRY_OK;
    }
    if (from == 0) {
        p->stats.blocks_sent++;
    } else {
        p->stats.blocks_grown++;
    }
    p->valid[slot] = to;
    const cell_run piece = {.from = (int64_t) b * bs + from, .to = (int64_t) slot * bs + from, .n = to - from};
    if (run->n > 0 && run->from + run->n == piece.from && run->to + run->n == piece.to) {
        run->n += piece.n;
        return FERRY_OK;
    }
    if (run->n > 0) {
        FERRY_TRY(send_run(p, run));
    }
    *run = piece;
    return FERRY_OK;
}

/* Sequence s's row of the device table: the slots of its blocks read; what differs from what
 * the device holds goes in one set. */
static ferry_status sync_row(ferry_block_pool * p, int64_t s, const int32_t * lengths, int64_t s0) {
    int64_t len = 0, n_read = 0;
    FERRY_TRY(read_table(p, s, lengths, s0, &len, &n_read, "block_pool_sync"));
    int32_t * sent = p->table_sent + s * p->max_blocks;
    int64_t first = -1, last = -1;
    for (int64_t j = 0; j < n_read; j++) {
        if (sent[j] != p->slot_of[p->ids[j]]) {
            first = first < 0 ? j : first;
            last = j;
        }
    }
    if (first < 0) {
        return FERRY_OK;
    }
    for (int64_t j = first; j <= last; j++) {
        sent[j] = p->slot_of[p->ids[j]];
    }
    const size_t size = (size_t) (last - first + 1) * sizeof(int32_t);
    FERRY_TRY(ferry_backend_tensor_set_async(p->queue, p->table, sent + first,
                                             (size_t) (s * p->max_blocks + first) * sizeof(int32_t), size));
    p->stats.table_bytes += size;
    p->stats.transfers++;
    return FERRY_OK;
}

/* Resident blocks the sync does not read: the slots they keep from it. */
static int64_t kept_for_others(const ferry_block_pool * p) {
    int64_t n = 0;
    for (int64_t b = 0; p->n_resident > 0 && b < p->params.n_blocks; b++) {
        n += p->resident[b] && p->mark[b] != p->stamp;
    }
    /* under prefetch, the last sync's other blocks too (a compute may still read them) */
    for (int64_t s = 0; p->ahead && s < p->n_slots; s++) {
        const int32_t held = p->block_of[s];
        n += held >= 0 && kept_for_last(p, s) && p->mark[held] != p->stamp && !p->resident[held];
    }
    return n;
}

static ferry_status check_fits(const ferry_block_pool * p, int64_t n_distinct, int64_t s0, int64_t s1,
                               const char * what) {
    const int64_t kept = kept_for_others(p);
    if (n_distinct > p->n_slots - kept) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "%s: sequences %lld..%lld read %lld blocks, but the pool has %lld "
                          "slots (%lld kept for resident blocks, or under prefetch the last sync's, they do not read): sync fewer sequences at a time, "
                          "or make the pool larger", what, (long long) s0, (long long) s1, (long long) n_distinct,
                          (long long) p->n_slots, (long long) kept);
    }
    return FERRY_OK;
}

ferry_status ferry_block_pool_sync(ferry_block_pool * pool, int64_t s0, int64_t s1, const int32_t * lengths) {
    FERRY_CHECK_ARG(pool, "block_pool_sync: NULL pool");
    FERRY_TRY(check_seqs(pool, s0, s1, "block_pool_sync"));
    int64_t n_distinct;
    FERRY_TRY(mark_reads(pool, s0, s1, lengths, &n_distinct, "block_pool_sync"));
    FERRY_TRY(check_fits(pool, n_distinct, s0, s1, "block_pool_sync"));
    const uint64_t bytes0 = pool->stats.cell_bytes + pool->stats.table_bytes;
    cell_run run = {0, 0, 0};
    for (int64_t i = 0; i < n_distinct; i++) {
        FERRY_TRY(sync_block(pool, pool->order[i], &run));
    }
    if (run.n > 0) {
        FERRY_TRY(send_run(pool, &run));
    }
    for (int64_t s = s0; s < s1; s++) {
        FERRY_TRY(sync_row(pool, s, lengths, s0));
    }
    pool->stats.syncs++;
    pool->last_sync = pool->stamp;
    if (pool->ahead) {
        FERRY_TRY(ferry_event_record(pool->sent, pool->queue));
        pool->waiting = true;
        pool->stats.syncs_ahead++;
        pool->stats.bytes_ahead += pool->stats.cell_bytes + pool->stats.table_bytes - bytes0;
    }
    return FERRY_OK;
}

ferry_status ferry_block_pool_set_prefetch(ferry_block_pool * pool, bool ahead) {
    FERRY_CHECK_ARG(pool, "block_pool_set_prefetch: NULL pool");
    if (ahead == pool->ahead) {
        return FERRY_OK;
    }
    if (!ahead) {
        FERRY_TRY(ferry_block_pool_wait(pool)); /* what is in flight lands before sends go the other way */
        FERRY_TRY(ferry_backend_synchronize(pool->queue));
        pool->queue = pool->backend;
        pool->ahead = false;
        return FERRY_OK;
    }
    ferry_backend * queue;
    FERRY_TRY(ferry_backend_get_copy_queue(pool->backend, &queue));
    queue = queue ? queue : pool->backend;
    if (!pool->sent || queue != pool->queue) {
        ferry_event * ev;
        FERRY_TRY(ferry_event_new(queue, 0, &ev));
        ferry_event_free(pool->sent);
        pool->sent = ev;
    }
    FERRY_TRY(ferry_backend_synchronize(pool->backend)); /* earlier sends land before the queue's */
    pool->queue = queue;
    pool->ahead = true;
    return FERRY_OK;
}

bool ferry_block_pool_prefetch(const ferry_block_pool * pool) { return pool && pool->ahead; }

ferry_status ferry_block_pool_wait(ferry_block_pool * pool) {
    FERRY_CHECK_ARG(pool, "block_pool_wait: NULL pool");
    if (!pool->waiting) {
        return FERRY_OK;
    }
    FERRY_TRY(ferry_event_wait(pool->backend, pool->sent));
    pool->waiting = false;
    return FERRY_OK;
}

ferry_status ferry_block_pool_drop_ahead(ferry_block_pool * pool) {
    FERRY_CHECK_ARG(pool, "block_pool_drop_ahead: NULL pool");
    memset(pool->valid, 0, (size_t) pool->n_slots * sizeof(*pool->valid));
    return FERRY_OK;
}

ferry_status ferry_block_pool_truncate(ferry_block_pool * pool, int64_t seq, int64_t length) {
    FERRY_CHECK_ARG(pool, "block_pool_truncate: NULL pool");
    if (seq < 0 || seq >= pool->params.n_seq) { /* not check_seqs(seq, seq + 1): seq + 1 may overflow */
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_truncate: sequence %lld is not one of the cache's "
                          "0..%lld", (long long) seq, (long long) (pool->params.n_seq - 1));
    }
    if (length < 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_truncate: sequence %lld's length %lld is negative",
                          (long long) seq, (long long) length);
    }
    int64_t n_blocks, n_cells;
    FERRY_TRY(ferry_paged_cache_table(pool->cache, seq, pool->ids, pool->max_blocks, &n_blocks, &n_cells));
    const int64_t bs = pool->params.block_size;
    for (int64_t j = 0; j < n_blocks; j++) {
        const int32_t slot = pool->slot_of[pool->ids[j]];
        const int64_t keep = length - j * bs < 0 ? 0 : length - j * bs;
        if (slot >= 0 && pool->valid[slot] > keep) {
            pool->valid[slot] = keep;
        }
    }
    return FERRY_OK;
}

ferry_status ferry_block_pool_set_resident(ferry_block_pool * pool, const int32_t * blocks, int64_t n_blocks) {
    FERRY_CHECK_ARG(pool && (blocks || n_blocks == 0), "block_pool_set_resident: NULL argument");
    if (n_blocks < 0 || n_blocks > pool->n_slots) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_set_resident: %lld blocks is not in 0..%lld (the "
                          "pool's slots)", (long long) n_blocks, (long long) pool->n_slots);
    }
    const uint64_t stamp = ++pool->stamp;
    for (int64_t i = 0; i < n_blocks; i++) {
        if (blocks[i] < 0 || blocks[i] >= pool->params.n_blocks) {
            return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_set_resident: block %d (entry %lld) is not in "
                              "0..%lld (the cache's blocks)", blocks[i], (long long) i,
                              (long long) pool->params.n_blocks - 1);
        }
        if (pool->mark[blocks[i]] == stamp) {
            return ferry_fail(FERRY_ERR_INVALID_ARG, "block_pool_set_resident: block %d is in the set twice",
                              blocks[i]);
        }
        pool->mark[blocks[i]] = stamp;
    }
    memset(pool->resident, 0, (size_t) pool->params.n_blocks);
    for (int64_t i = 0; i < n_blocks; i++) {
        pool->resident[blocks[i]] = 1;
    }
    pool->n_resident = n_blocks;
    return FERRY_OK;
}

/* Best first: more readers, then a higher cost to send again each step, then more cells read, then
 * the lower id. */
typedef struct {
    int32_t readers;
    double seconds;
    int64_t cells;
    int32_t block;
} ranked_block;

static int rank_order(const void * a, const void * b) {
    const ranked_block *x = a, *y = b;
    if (x->readers != y->readers) {
        return x->readers > y->readers ? -1 : 1;
    }
    if (x->seconds != y->seconds) {
        return x->seconds > y->seconds ? -1 : 1;
    }
    if (x->cells != y->cells) {
        return x->cells > y->cells ? -1 : 1;
    }
    return x->block < y->block ? -1 : x->block > y->block;
}

/*
 * What streaming block b costs each step, by the backend's copy cost model (the stand-in's link and
 * piece curve, a CUDA device's measured one): per layer its K and V as a sync sends them. A block
 * whose table neighbours do not follow it in the host pool goes alone, a call and a piece priced by
 * its size (a small piece below the curve's knee costs more per byte); one at the end of a run of
 * host-adjacent blocks adds its bytes to the run's piece at the link's peak; one in the middle of a
 * run too, less a call (kept resident, it would split the run in two).
 */
static double resend_seconds(const ferry_block_pool * p, const ferry_copy_cost_model * m, int32_t b) {
    if (!(m->gbps > 0)) {
        return 0.0;
    }
    const double call = m->call_us * 1e-6, bps = m->gbps * 1e9;
    const int64_t cells = p->need[b];
    const bool trans = p->params.v_trans;
    double s = 0.0;
    for (int32_t l = 0; l < p->params.n_layer; l++) {
        const ferry_tensor *k = p->layers.k[l], *v = p->layers.v[l];
        const size_t k_bytes = (size_t) cells * k->nb[1];
        /* a transposed V crosses as one 2-D set: a row of cells per embedding value */
        const ferry_copy_2d v_rows = {.offset = 0, .size = (size_t) cells * (trans ? v->nb[0] : v->nb[1]),
                                      .count = trans ? (size_t) v->ne[1] : 1, .stride = trans ? v->nb[1] : 0};
        const size_t v_bytes = v_rows.size * v_rows.count;
        if (p->runs_on[b] == 0) {
            s += call + ferry_copy_piece_seconds(m, k_bytes) + ferry_copy_plan_cost(m, &v_rows, 1);
        } else {
            s += (double) (k_bytes + v_bytes) / bps - (p->runs_on[b] == 2 ? 2.0 * call : 0.0);
        }
    }
    return s;
}

ferry_status ferry_block_pool_choose_resident(const ferry_block_pool * pool, int64_t s0, int64_t s1,
                                              const int32_t * lengths, int64_t n_resident, int32_t * out,
                                              int64_t max_out, int64_t * n_out) {
    FERRY_CHECK_ARG(pool && n_out && (out || max_out == 0), "block_pool_choose_resident: NULL argument");
    FERRY_TRY(check_seqs(pool, s0, s1, "block_pool_choose_resident"));
    if (n_resident < 0 || n_resident > pool->n_slots) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_choose_resident: n_resident %lld is not in 0..%lld "
                          "(the pool's slots)", (long long) n_resident, (long long) pool->n_slots);
    }
    if (max_out < 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_choose_resident: max_out %lld is negative",
                          (long long) max_out);
    }
    /* The marks and scratch lists are the pool's working memory, not its state. */
    ferry_block_pool * p = (ferry_block_pool *) pool;
    int64_t n_distinct;
    FERRY_TRY(mark_reads(p, s0, s1, lengths, &n_distinct, "block_pool_choose_resident"));
    ranked_block * ranked = ferry_malloc((size_t) (n_distinct ? n_distinct : 1) * sizeof(*ranked));
    if (!ranked) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_choose_resident: out of memory");
    }
    const ferry_copy_cost_model model = ferry_backend_copy_cost_model(p->backend);
    for (int64_t i = 0; i < n_distinct; i++) {
        const int32_t b = p->order[i];
        ranked[i] = (ranked_block) {.readers = p->readers[b], .seconds = resend_seconds(p, &model, b),
                                    .cells = p->need[b], .block = b};
    }
    qsort(ranked, (size_t) n_distinct, sizeof(*ranked), rank_order);
    const int64_t n = n_resident < n_distinct ? n_resident : n_distinct;
    for (int64_t i = 0; i < n && i < max_out; i++) {
        out[i] = ranked[i].block;
    }
    free(ranked);
    *n_out = n;
    return FERRY_OK;
}

ferry_status ferry_block_pool_get_stats(const ferry_block_pool * pool, ferry_block_pool_stats * out) {
    FERRY_CHECK_ARG(pool && out, "block_pool_get_stats: NULL argument");
    *out = pool->stats;
    memset(&out->buffers, 0, sizeof(out->buffers));
    ferry_buffer * const bufs[2] = {pool->layers.buffers[0], pool->table_buf};
    for (int i = 0; i < 2; i++) {
        ferry_stats s;
        FERRY_TRY(ferry_buffer_get_stats(bufs[i], &s));
        for (int k = 0; k < FERRY_XFER_COUNT; k++) {
            out->buffers.calls[k] += s.calls[k];
            out->buffers.bytes[k] += s.bytes[k];
            out->buffers.impl_calls[k] += s.impl_calls[k];
        }
    }
    return FERRY_OK;
}

void ferry_block_pool_reset_stats(ferry_block_pool * pool) {
    if (!pool) {
        return;
    }
    memset(&pool->stats, 0, sizeof(pool->stats));
    ferry_buffer_reset_stats(pool->layers.buffers[0]);
    ferry_buffer_reset_stats(pool->table_buf);
}

/* The slots a group of sequences may stream through: the most blocks of one sequence that no other
 * synced sequence reads (its own), or, when the pool cannot also keep every shared block, the most
 * blocks one sequence reads. Marks as mark_reads leaves them. */
static int64_t streaming_slots(ferry_block_pool * p, int64_t s0, int64_t s1, const int32_t * lengths,
                               int64_t n_distinct) {
    int64_t own = 0, all = 0, shared = 0;
    for (int64_t i = 0; i < n_distinct; i++) {
        shared += p->readers[p->order[i]] > 1;
    }
    for (int64_t s = s0; s < s1; s++) {
        int64_t len = 0, n_read = 0, mine = 0;
        if (read_table(p, s, lengths, s0, &len, &n_read, "block_pool_plan") != FERRY_OK) {
            continue; /* mark_reads read it already */
        }
        for (int64_t j = 0; j < n_read; j++) {
            mine += p->readers[p->ids[j]] == 1;
        }
        own = mine > own ? mine : own;
        all = n_read > all ? n_read : all;
    }
    const int64_t halves = p->ahead ? 2 : 1; /* under prefetch two groups' streamed blocks are held */
    return p->n_slots - halves * own >= shared ? own : all;
}

/* Distinct blocks sequences g0..s - 1 and s read that the resident set does not keep, with the
 * resident ones they do not read: what check_fits weighs, kept up to date as s joins the group. */
static ferry_status join_group(ferry_block_pool * p, int64_t s, const int32_t * lengths, int64_t s0,
                               int64_t * streamed) {
    int64_t len = 0, n_read = 0;
    FERRY_TRY(read_table(p, s, lengths, s0, &len, &n_read, "block_pool_plan"));
    for (int64_t j = 0; j < n_read; j++) {
        const int32_t b = p->ids[j];
        if (p->mark[b] != p->stamp) {
            p->mark[b] = p->stamp;
            *streamed += !p->resident[b];
        }
    }
    return FERRY_OK;
}

ferry_status ferry_block_pool_plan(ferry_block_pool * pool, int64_t s0, int64_t s1, const int32_t * lengths,
                                   int64_t * group_ends, int64_t max_groups, int64_t * n_groups) {
    FERRY_CHECK_ARG(pool && n_groups && (group_ends || max_groups == 0), "block_pool_plan: NULL argument");
    FERRY_TRY(check_seqs(pool, s0, s1, "block_pool_plan"));
    if (max_groups < 0) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_plan: max_groups %lld is negative",
                          (long long) max_groups);
    }
    int64_t n_distinct;
    FERRY_TRY(mark_reads(pool, s0, s1, lengths, &n_distinct, "block_pool_plan"));
    /* under prefetch two groups' streamed blocks are held at once: twice the streaming slots */
    const int64_t halves = pool->ahead ? 2 : 1;
    const int64_t stream =
        n_distinct <= pool->n_slots ? 0 : halves * streaming_slots(pool, s0, s1, lengths, n_distinct);
    if (stream > pool->n_slots) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_plan: a sequence of %lld..%lld reads %lld blocks, "
                          "but the pool has %lld slots%s: make the pool larger", (long long) s0, (long long) s1,
                          (long long) (stream / halves), (long long) pool->n_slots,
                          pool->ahead ? " (under prefetch twice the blocks are held: or turn prefetch off)" : "");
    }
    int32_t * chosen = ferry_malloc((size_t) pool->n_slots * sizeof(*chosen));
    if (!chosen) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_plan: out of memory");
    }
    int64_t n_chosen;
    ferry_status st = ferry_block_pool_choose_resident(pool, s0, s1, lengths, pool->n_slots - stream, chosen,
                                                       pool->n_slots, &n_chosen);
    if (st == FERRY_OK) {
        st = ferry_block_pool_set_resident(pool, chosen, n_chosen);
    }
    free(chosen);
    FERRY_TRY(st);
    /* Greedy groups: a sequence joins the group while its streamed blocks fit the slots the
     * resident blocks leave (a group whose resident blocks are all read leaves stream slots). */
    const int64_t free_slots = (pool->n_slots - pool->n_resident) / halves;
    int64_t groups = 0, streamed = 0;
    ++pool->stamp;
    for (int64_t s = s0; s < s1; s++) {
        int64_t with = streamed;
        const uint64_t before = pool->stamp;
        FERRY_TRY(join_group(pool, s, lengths, s0, &with));
        if (with > free_slots && s > s0) {
            /* s starts a new group: the last one ends before it */
            if (groups < max_groups) {
                group_ends[groups] = s;
            }
            groups++;
            pool->stamp = before + 1;
            streamed = 0;
            FERRY_TRY(join_group(pool, s, lengths, s0, &streamed));
        } else {
            streamed = with;
        }
        if (streamed > free_slots) {
            return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_plan: sequence %lld streams %lld blocks, but "
                              "the resident set leaves %lld slots%s: make the pool larger", (long long) s,
                              (long long) streamed, (long long) free_slots,
                              pool->ahead ? " (a group's half of them, under prefetch: or turn prefetch off)" : "");
        }
    }
    if (groups < max_groups) {
        group_ends[groups] = s1;
    }
    *n_groups = groups + 1;
    return FERRY_OK;
}

/* Layer l's node: attention of q over the layer's device pools through the table's rows. */
static ferry_status pool_layer(const ferry_block_pool * p, ferry_context * ctx, int32_t l, ferry_tensor * table,
                               ferry_tensor * q, ferry_tensor * kv_len, ferry_tensor ** out) {
    if (!q) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "block_pool_attention_step: layer %d's q is NULL", l);
    }
    if (q->ne[0] <= 0) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "block_pool_attention_step: layer %d's q has head_dim %lld", l,
                          (long long) q->ne[0]);
    }
    /* The scale Python's attn_decode passes: 1/sqrt in double, rounded to f32. */
    const float scale = (float) (1.0 / sqrt((double) q->ne[0]));
    FERRY_TRY(ferry_attn_paged(ctx, q, p->layers.k[l], p->layers.v[l], table, kv_len, p->params.block_size, scale,
                               p->params.v_trans, out));
    char name[FERRY_MAX_NAME];
    snprintf(name, sizeof(name), "attn%d", l);
    FERRY_TRY(ferry_tensor_set_name(*out, name));
    return ferry_tensor_set_output(*out);
}

ferry_status ferry_block_pool_attention_step(const ferry_block_pool * pool, ferry_context * ctx, int32_t n_layer,
                                             int64_t s0, int64_t s1, ferry_tensor * const * q, ferry_tensor * kv_len,
                                             ferry_sched * sched, ferry_graph * graph, ferry_tensor ** outs) {
    FERRY_CHECK_ARG(pool && ctx && q && kv_len && sched && graph && outs,
                    "block_pool_attention_step: NULL argument");
    FERRY_TRY(check_seqs(pool, s0, s1, "block_pool_attention_step"));
    if (n_layer <= 0 || n_layer > pool->params.n_layer) {
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "block_pool_attention_step: %d layers, but the cache has 1..%d",
                          n_layer, pool->params.n_layer);
    }
    if (!ferry_sched_has_backend(sched, pool->backend)) {
        return ferry_fail(FERRY_ERR_INVALID_ARG, "block_pool_attention_step: the pool's backend %s is not one of "
                          "the scheduler's", ferry_backend_name(pool->backend));
    }
    ferry_tensor * rows;
    const int64_t ne[2] = {pool->max_blocks, s1 - s0};
    const size_t nb[2] = {pool->table->nb[0], pool->table->nb[1]};
    FERRY_TRY(ferry_tensor_view(ctx, pool->table, 2, ne, nb, (size_t) s0 * pool->table->nb[1], &rows));
    ferry_tensor ** made = ferry_malloc((size_t) n_layer * sizeof(*made));
    if (!made) {
        return ferry_fail(FERRY_ERR_OUT_OF_MEMORY, "block_pool_attention_step: out of memory");
    }
    ferry_status st = FERRY_OK;
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = pool_layer(pool, ctx, l, rows, q[l], kv_len, &made[l]);
    }
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = ferry_sched_set_tensor_backend(sched, made[l], pool->backend);
    }
    for (int32_t l = 0; st == FERRY_OK && l < n_layer; l++) {
        st = ferry_graph_build(graph, made[l]);
    }
    if (st == FERRY_OK) {
        memcpy(outs, made, (size_t) n_layer * sizeof(*made));
    }
    free(made);
    return st;
}
