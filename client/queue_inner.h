// SPDX-License-Identifier: Apache-2.0
/*
 * What the library's queue rooms share and nobody else includes: a queue
 * handle's insides, the wait of the data path (queue_wait.c) and the
 * overflow objects (queue_overflow.c). The public calls are queue.c's.
 */
#ifndef SHMB_CLIENT_QUEUE_INNER_H
#define SHMB_CLIENT_QUEUE_INNER_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/names.h"
#include "../proto/queue.h"

/* A queue's name and its overflow keys: proto/names.h's rules (a key
 * always fits a slot: names.c asserts it). */
#define QUEUE_NAME_MAX SHMB_QUEUE_NAME_LEN_MAX
#define QUEUE_KEY_MAX SHMB_QUEUE_KEY_MAX
/* A wait longer than this is cut into slices of it, and the connection is
 * looked at between them: a daemon killed without a clean stop wakes
 * nobody, so this is how long a member takes to notice. One poll() a
 * second: nothing of an idle member's CPU. */
#define QUEUE_SLICE_MS 1000

/* One role on one queue: the writer or a reader seat, its mapping, and the
 * overflow objects in flight. */
struct shmb_queue {
    shmb_t *c;
    unsigned long forks; /* client_forks when opened: the process it belongs to */
    int seat; /* SHMB_QUEUE_WRITER or the reader's seat */
    char name[QUEUE_NAME_MAX + 1];
    void *map;
    size_t map_size;
    struct shmb_q q;
    /* The writer: the length reserved, and the object reserved and not
     * yet published. */
    size_t res_len;
    bool obj_reserved;
    char obj_key[QUEUE_KEY_MAX];
    /* The writer: the messages published as objects and not yet deleted,
     * oldest first (a ring of objs_cap). */
    uint64_t *objs;
    size_t objs_cap, objs_first, objs_count;
    /* A reader: the object it pinned and has not released yet: the
     * message it holds, or one whose release found the connection busy
     * (another thread's call) and is sent by the next call that gets in. */
    bool pinned;
    char pin_key[QUEUE_KEY_MAX];
};

/* One wait of the data path: a reserve (msg == NULL) or a dequeue. */
struct queue_wait {
    size_t len;       /* reserve: the slot bytes wanted */
    void **buf;       /* reserve: the slot's payload */
    const void **msg; /* dequeue: the message in place */
    size_t *msg_len;
};

/* ---- queue_wait.c: waits that watch the daemon ---------------------------- */

/* The monotonic clock in nanoseconds. */
int64_t queue_now_ns(void);

/* 0 while q's connection is open, else -ECONNRESET: the daemon went away. */
int queue_watch(shmb_queue_t *q);

/* Reserve or dequeue as w says, waiting up to timeout_ms (-1: for ever) in
 * slices of QUEUE_SLICE_MS with a look at the connection between them. */
int queue_wait(shmb_queue_t *q, const struct queue_wait *w, int timeout_ms);

/* ---- queue_overflow.c: messages longer than a slot, as objects ------------ */

/* Remember that message seq went as an object. 0 or -ENOMEM. */
int queue_objs_push(shmb_queue_t *q, uint64_t seq);

/* A writer that follows another takes over the objects of the messages
 * still in the ring. */
void queue_adopt_objects(shmb_queue_t *q);

/* Delete (without waiting) the objects of the messages every live seat has
 * read. Inside a call client_enter let in. */
void queue_collect(shmb_queue_t *q);

/* Drop the object reserved and not published. Inside a call client_enter
 * let in. */
int queue_drop_reserved(shmb_queue_t *q);

/* Reserve message q->q.head's slot for an object of len bytes. */
int queue_reserve_object(shmb_queue_t *q, size_t len, void **buf, int timeout_ms);

/* Reader, inside a call client_enter let in: send the release of the pin
 * the handle still owes. */
void queue_release_pin(shmb_queue_t *q);

/* The message just dequeued is an object whose key the slot holds (len
 * bytes at slot): pin it and point *data and *len at its bytes. */
int queue_get_object(shmb_queue_t *q, const void *slot, size_t len, const void **data,
                     size_t *size);

#endif
