/*
 * The stand-in device's link: a transfer does its copy at once, then is held until the
 * link would have carried it, latency + bytes / bandwidth after the link was free for it
 * (with a piece curve, each piece's bytes at the rate of its size, as DMA engines move small
 * pieces slowly: a plain transfer is one piece, a gather's every row one),
 * plus a cost per row for a 2-D transfer of more than one row (a plain transfer, or a 2-D
 * one of one row, pays none: as ferry_copy_cost_model costs a copy).
 * Each direction is one link, taken in turn, as a GPU's copy engine is: a copy queued on
 * the worker thread and a blocking one on the backend's thread share it. A host that
 * copies slower than the link cannot be held to it: such transfers are counted late
 * (ferry_link_stats), so that a tool can say the link was not reached.
 */
#include "link.h"

#include <sched.h>
#include <string.h>
#include <time.h>

/* A hold polls the clock, yielding its core to anyone who wants it, as the copy queue's idle
 * worker does: a thread woken from a sleep on a busy core starts up to a scheduler tick late
 * (4 ms measured on the 2-core dev machine), longer than the link takes for a few MiB. Only
 * a long hold sleeps, and wakes well before its end. The last microseconds of a hold only
 * read the clock: a yield is a system call, 0.8 us on the dev VM, and a hold that ends up to a
 * yield late made a paged window's 1,032 copies of 2.5 us each take 20% more than the link. */
#define SLEEP_ABOVE_SECONDS 6e-3
#define WAKE_BEFORE_SECONDS 5e-3
#define SPIN_BELOW_SECONDS 20e-6

void ferry_link_wait_until(double t) {
    for (;;) {
        const double left = t - ferry_now_seconds();
        if (left <= 0) {
            return;
        }
        if (left > SLEEP_ABOVE_SECONDS) {
            const double wake = t - WAKE_BEFORE_SECONDS;
            struct timespec ts = {.tv_sec = (time_t) wake};
            ts.tv_nsec = (long) ((wake - (double) ts.tv_sec) * 1e9);
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        } else if (left > SPIN_BELOW_SECONDS) {
            sched_yield();
        }
    }
}

void ferry_link_init(ferry_link * link, double gbps, double latency_us, double row_ns) {
    memset(link, 0, sizeof(*link));
    link->bytes_per_second = gbps * 1e9;
    link->latency = latency_us * 1e-6;
    link->row_seconds = row_ns * 1e-9;
    link->modelled = gbps > 0 || latency_us > 0 || row_ns > 0;
    pthread_mutex_init(&link->lock, NULL);
}

void ferry_link_destroy(ferry_link * link) { pthread_mutex_destroy(&link->lock); }

void ferry_link_set_piece_curve(ferry_link * link, double floor_gbps, double knee_bytes, double steepness) {
    link->floor_gbps = floor_gbps;
    link->knee_bytes = knee_bytes;
    link->steepness = steepness;
}

/* Seconds a piece of size bytes takes beyond its bytes at the bandwidth: what the curve adds. */
static double piece_extra(const ferry_link * link, size_t size) {
    if (!(link->floor_gbps > 0) || !(link->bytes_per_second > 0)) {
        return 0.0;
    }
    const ferry_copy_cost_model curve = {.gbps = link->bytes_per_second * 1e-9, .piece_floor_gbps = link->floor_gbps,
                                         .piece_knee_bytes = link->knee_bytes, .piece_steepness = link->steepness};
    return ferry_copy_piece_seconds(&curve, size) - (double) size / link->bytes_per_second;
}

/* Take the link for bytes in `charged` rows, each at the row cost, and `extra` seconds of small pieces. */
static link_slot begin(ferry_link * link, link_dir dir, size_t bytes, size_t charged, double extra) {
    link_slot slot = {0};
    if (!link || !link->modelled) {
        return slot;
    }
    const double now = ferry_now_seconds();
    const double carry = link->latency + (double) charged * link->row_seconds + extra +
                         (link->bytes_per_second > 0 ? (double) bytes / link->bytes_per_second : 0);
    pthread_mutex_lock(&link->lock);
    const double start = link->free_at[dir] > now ? link->free_at[dir] : now;
    slot.end = start + carry;
    slot.bytes_from = start + link->latency;
    slot.seconds_per_byte = link->bytes_per_second > 0 ? 1.0 / link->bytes_per_second : 0;
    link->free_at[dir] = slot.end;
    link->stats.modelled_seconds += carry;
    link->stats.rows += charged;
    pthread_mutex_unlock(&link->lock);
    slot.copy_start = ferry_now_seconds();
    return slot;
}

link_slot ferry_link_begin(ferry_link * link, link_dir dir, size_t bytes, size_t rows) {
    /* a plain transfer is one piece; the rows of a 2-D one are the engine's pitch, not pieces */
    return begin(link, dir, bytes, rows > 1 ? rows : 0, rows > 1 || !link ? 0.0 : piece_extra(link, bytes));
}

link_slot ferry_link_begin_gather(ferry_link * link, link_dir dir, const ferry_gather_copy * pieces, size_t n,
                                  bool then_gather) {
    size_t bytes = 0, rows = 0;
    double extra = then_gather && link ? link->latency : 0;
    for (size_t i = 0; i < n; i++) {
        bytes += pieces[i].size * pieces[i].count;
        rows += pieces[i].count;
        if (link) {
            extra += (double) pieces[i].count * piece_extra(link, pieces[i].size);
        }
    }
    return begin(link, dir, bytes, rows, extra);
}

void ferry_link_count(ferry_link * link, const link_slot * slot, size_t bytes) {
    if (!link || !link->modelled) {
        return;
    }
    const double copied = ferry_now_seconds();
    pthread_mutex_lock(&link->lock);
    link->stats.transfers++;
    link->stats.bytes += bytes;
    link->stats.copy_seconds += copied - slot->copy_start;
    if (copied > slot->end) {
        link->stats.late++;
        link->stats.late_seconds += copied - slot->end;
    }
    pthread_mutex_unlock(&link->lock);
}

void ferry_link_pace(const link_slot * slot, size_t done) {
    if (slot->seconds_per_byte > 0) {
        ferry_link_wait_until(slot->bytes_from + (double) done * slot->seconds_per_byte);
    }
}

void ferry_link_end(ferry_link * link, const link_slot * slot, size_t bytes) {
    ferry_link_count(link, slot, bytes);
    if (link && link->modelled) {
        ferry_link_wait_until(slot->end);
    }
}

ferry_link_stats ferry_link_get_stats(ferry_link * link) {
    pthread_mutex_lock(&link->lock);
    const ferry_link_stats s = link->stats;
    pthread_mutex_unlock(&link->lock);
    return s;
}

void ferry_link_reset_stats(ferry_link * link) {
    pthread_mutex_lock(&link->lock);
    memset(&link->stats, 0, sizeof(link->stats));
    pthread_mutex_unlock(&link->lock);
}
