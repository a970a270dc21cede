/* The stand-in device's link (link.c): transfers held to latency + rows * row cost + each piece's bytes
 * at the rate of its size (bytes / bandwidth without a piece curve). */
#ifndef FERRY_LINK_H
#define FERRY_LINK_H

#include "backend-impl.h"

#include <pthread.h>

typedef enum { LINK_TO_DEVICE = 0, LINK_FROM_DEVICE = 1 } link_dir;

/* One link each way; free_at is when its last transfer ends (the next one starts no
 * earlier). Shared by the backend's thread and its copy queue's worker: locked. */
typedef struct {
    double bytes_per_second; /* 0: unlimited */
    double latency;          /* seconds a transfer */
    double row_seconds;      /* seconds a row of a 2-D transfer of more than one row */
    bool modelled;           /* a bandwidth, a latency or a row cost: otherwise transfers are left alone */
    /* the piece curve (ferry_piece_seconds_per_byte): a plain transfer and a gather's every row run
     * at floor_gbps when small, rising to the bandwidth past knee_bytes; floor_gbps 0: none */
    double floor_gbps, knee_bytes, steepness;
    pthread_mutex_t lock;
    double free_at[2];
    ferry_link_stats stats;
} ferry_link;

/* A transfer's place on the link: its modelled end, when its copy began, and when its bytes
 * start moving and how long each takes (0: a link without bandwidth). */
typedef struct {
    double copy_start, end;
    double bytes_from, seconds_per_byte;
} link_slot;

void ferry_link_init(ferry_link * link, double gbps, double latency_us, double row_ns);
void ferry_link_destroy(ferry_link * link);
/* Take the link for bytes in rows (1 for a plain transfer) before copying them; ferry_link_end
 * after the copy counts it and waits for the modelled end. Without a model both do nothing. */
link_slot ferry_link_begin(ferry_link * link, link_dir dir, size_t bytes, size_t rows);
/* Piece sizes priced by a curve from floor_gbps up to the link's bandwidth (after ferry_link_init). */
void ferry_link_set_piece_curve(ferry_link * link, double floor_gbps, double knee_bytes, double steepness);
/* A gather's pieces in one transfer: every row of every piece a row cost and a piece by its size,
 * one piece too; with then_gather, a second call's latency: the device's gather from the pieces
 * (merged spans). */
link_slot ferry_link_begin_gather(ferry_link * link, link_dir dir, const ferry_gather_copy * pieces, size_t n,
                                  bool then_gather);
void ferry_link_end(ferry_link * link, const link_slot * slot, size_t bytes);
/* ferry_link_end without the wait: a queued transfer, whose end a later synchronize waits for. */
void ferry_link_count(ferry_link * link, const link_slot * slot, size_t bytes);
/* Hold the calling thread until the link would have carried the slot's first `done` bytes: a
 * bulk copy written at the link's pace, as a copy engine writes, not in a burst and a wait. */
void ferry_link_pace(const link_slot * slot, size_t done);
/* Hold the calling thread until time t (ferry_now_seconds), as a transfer's hold does. */
void ferry_link_wait_until(double t);
ferry_link_stats ferry_link_get_stats(ferry_link * link);
void ferry_link_reset_stats(ferry_link * link);

#endif
