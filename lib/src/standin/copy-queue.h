/* The stand-in's copy queue (copy-queue.c): a worker thread as a backend's second, ordered
 * queue. */
#ifndef FERRY_COPY_QUEUE_H
#define FERRY_COPY_QUEUE_H

#include "link.h"

/* A copy queue for parent, whose memory the host writes: transfers into parent's memory
 * are done by a worker thread in the order queued, each over link (NULL: none) as the
 * parent's own transfers are; its events are waited on the host. The caller owns it (the
 * parent frees it with itself, before the link). */
ferry_status ferry_worker_copy_queue_new(ferry_backend * parent, ferry_link * link, ferry_backend ** out);

#ifdef FERRY_FAULT_INJECTION
/* Test builds: while paused, no worker thread starts its next job (tests/c/test_prefetch.c
 * holds copies back to show what a missing wait reads). */
void ferry_fault_copy_queue_pause(bool pause);
#endif

#endif
