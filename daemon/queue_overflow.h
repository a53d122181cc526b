// SPDX-License-Identifier: Apache-2.0
/*
 * The queues' overflow objects: a message larger than its slot goes as a
 * store object "q/<queue>/<seq>" (proto/names.h) of the queue's pool. This
 * room keeps the daemon's record of those a writer allocated, counts their
 * readers, forgoes the reads of seats that leave, and deletes them by key
 * (when a queue is made or goes) or by walking a pool (those of an earlier
 * run). Knows the store's calls and a queue's fields, never queue.c's calls.
 */
#ifndef SHMB_QUEUE_OVERFLOW_H
#define SHMB_QUEUE_OVERFLOW_H

#include <stddef.h>
#include <stdint.h>

#include "queue_types.h"

/* An alloc of key by owner in pool: when key is "q/<queue>/<seq>" of a
 * queue of pool whose writer owner is, *readers becomes the daemon's count
 * of its live seats (the writer's own count may be stale: a seat taken
 * since). Other keys are left alone. */
void queue_overflow_readers(const struct queue_set *set, const struct pool *pool,
                            const void *owner, const char *key, size_t key_len,
                            uint32_t *readers);

/* key, allocated by owner in pool, is the overflow object of message seq
 * of a queue whose writer owner is ("q/<queue>/<seq>"): seq joins that
 * queue's record (a seq below the last one recorded starts it again), which
 * the seats that leave go through. Other keys are left alone. */
void queue_overflow_made(struct queue_set *set, const struct pool *pool, const void *owner,
                         const char *key, size_t key_len);

/* Delete every committed object of pool under "q/": overflow messages of
 * queues of an earlier run of the daemon (queues do not outlive it), which
 * would otherwise await reads that never come. Run when a pool adopts a
 * segment, at start and when SIGHUP adds the pool: it walks the pool. Returns how many went. */
unsigned queue_drop_orphans(struct pool *pool);

/* Delete the objects "q/<name>/<seq>" of q's pool for seq in [lo, hi], by
 * key (queue.c, when a queue is made). */
void queue_drop_keys(const struct queue *q, uint64_t lo, uint64_t hi);

/* A reader seat of q was just taken at message next: one more awaited read
 * of that message's overflow object, if its writer allocated it already. */
void queue_expect_read(struct queue *q, uint64_t next);

/* The reader seats of q in mask (bit s: seat s), all one connection's,
 * leave for good: the overflow objects of the messages they will never
 * read await their reads no more. */
void queue_forgo_reads(struct queue *q, uint64_t mask);

/* Delete the overflow objects of the messages still in q's ring (a queue
 * that goes). */
void queue_drop_objects(struct queue *q);

#endif
