// SPDX-License-Identifier: Apache-2.0
/*
 * Broadcast queues: each a memfd of its own (proto/layout_queue.h) that the
 * daemon makes, maps once and passes to its members, and the membership of
 * its writer role and reader seats, each held by one connection. The data
 * path is the members' (proto/queue.c); the daemon only stores and wakes.
 * Knows nothing about sockets or the protocol: a member is an opaque owner
 * pointer (a connection's client) with what status shows of it.
 */
#ifndef SHMB_QUEUE_H
#define SHMB_QUEUE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "../proto/error.h"
#include "../proto/names.h"
#include "../proto/protocol.h"
#include "../proto/queue.h"
#include "config.h"
#include "pool.h"
#include "queue_job.h"
#include "queue_overflow.h"
#include "queue_types.h"

/* How messages name a member's process: "pid 1234", or, for one in a pid
 * namespace the daemon cannot see into, "a process in another pid
 * namespace (pid 7 there, uid 1000)". Into buf, which it returns. */
const char *queue_member_pid(const struct queue_member *who, char *buf, size_t len);

/* An empty set whose memfds are named after prefix (the daemon's --name). */
void queue_set_init(struct queue_set *set, const char *prefix);

/* Delete every queue (the daemon's end): descriptors and mappings go;
 * store objects are left to the pools' own end. */
void queue_set_free(struct queue_set *set);

/* The queue called name in pool, or NULL. */
struct queue *queue_find(const struct queue_set *set, const struct pool *pool,
                         const char *name);

/* "a, b" (or "none"): the names of pool's queues, for messages. */
void queue_names(const struct queue_set *set, const struct pool *pool, char *out,
                 size_t len);

/* Create queue name in pool (geometry checked by the caller against the
 * protocol's ranges; shmb_q_size checks it again), or find it: the same
 * geometry already there is *created = false; another, or one shut down,
 * -EEXIST naming both. -EDQUOT past the pool's max_queues or
 * max_queue_bytes, -EMFILE past QUEUE_MAX or with too few descriptors
 * left, -EINVAL past QUEUE_SIZE_MAX, -ENOMEM when the host's memory has no
 * room for it. A queue created deletes its pool's objects "q/<name>/0" to
 * "q/<name>/<slots>" left by an earlier one. *out borrows the queue.
 * With a waiter and an offload, the pages are made off the loop: the
 * return is -EINPROGRESS (*created true for the request that makes it,
 * false for one that found it being made) and the answer comes through
 * waiter->done. Without a waiter, a queue being made is -EBUSY. */
int queue_create(struct queue_set *set, struct pool *pool, const char *name, uint32_t seats,
                 uint64_t slots, uint64_t slot_size, bool temporary,
                 struct queue_waiter *waiter, struct queue **out, bool *created,
                 struct shmb_error *err);

/* Delete every queue nobody has held for set->lease_ms at now_ms (logged),
 * and return how many went. */
unsigned queue_expire(struct queue_set *set, uint64_t now_ms);

/* Bytes of pool's queues (those being made too). */
uint64_t queue_bytes(const struct queue_set *set, const struct pool *pool);

/* 0 when need descriptors can still be opened; -EMFILE with the numbers
 * and a hint otherwise ("Cannot <what>: ..."). need is at most
 * QUEUE_FD_SPARE + 2 + QUEUE_MAX (the queues being made). */
int queue_check_fds(unsigned need, const char *what, struct shmb_error *err);

/* Roles owner holds in every queue of set. */
unsigned queue_roles_of(const struct queue_set *set, const void *owner);

/* owner takes the writer role, at epoch q->writer_epoch (a writer of an
 * earlier epoch may no longer publish): -EBUSY naming the writer there is,
 * -ECANCELED once shut down. A queue whose writer went is open again. */
int queue_open_writer(struct queue *q, const void *owner, const struct queue_member *who,
                      struct shmb_error *err);

/* owner takes reader seat (0..seats-1, or -1: the lowest free or dead one)
 * and starts at the next message published; *seat_out and *epoch say which
 * and its epoch after the take. -EINVAL (out of range), -EBUSY (taken, or
 * none free), -ECANCELED. */
int queue_open_reader(struct queue *q, int seat, const void *owner,
                      const struct queue_member *who, uint32_t *seat_out, uint64_t *epoch,
                      struct shmb_error *err);

/* owner leaves the roles role (and seat, for QUEUE_ROLE_READER; -1: all its
 * seats) it holds on q: seats become free, the writer's going ends the queue
 * for readers once drained. *closed counts them; -ENOENT saying what it
 * holds when none matched. q may be deleted (queue_settle) before this
 * returns: do not use it afterwards. */
int queue_close_roles(struct queue_set *set, struct queue *q, const void *owner,
                      enum queue_role role, int seat, unsigned *closed,
                      struct shmb_error *err);

/* owner's connection closed: its seats become dead (the writer stops waiting
 * for them), its writer roles gone; queues left to be deleted are. Returns
 * the roles dropped. */
unsigned queue_owner_gone(struct queue_set *set, const void *owner);

/* Shut q down: every member's wait ends with ECANCELED, opens fail. Then
 * deleted if nobody holds it. Do not use q afterwards. */
void queue_shutdown(struct queue_set *set, struct queue *q);

/* Shut every queue down (the daemon stops). */
void queue_shutdown_all(struct queue_set *set);

/* Delete q: -EBUSY naming its members while a writer or a live seat holds
 * it. The pool's objects of the messages still in its ring ("q/<name>/<seq>",
 * seq in [head - slots, head]) go with it, looked up by key. It leaves the
 * set at once; its memory is freed off the loop when there is an offload:
 * with a waiter, the return is then -EINPROGRESS and waiter->done says
 * when the memory is freed. */
int queue_delete(struct queue_set *set, struct queue *q, struct queue_waiter *waiter,
                 struct shmb_error *err);

/* Delete every queue of pool (a pool that goes, with no clients left). */
void queue_drop_pool(struct queue_set *set, const struct pool *pool);

/* Queues of pool (NULL: all), those being made too. */
unsigned queue_count(const struct queue_set *set, const struct pool *pool);

/* Put the immutable words of the area's header back (a member may have
 * scribbled them) before its descriptor is passed to a new member. */
void queue_restore_header(struct queue *q);

/* What status shows of q now. */
void queue_status(const struct queue *q, struct queue_status *out);

#endif
