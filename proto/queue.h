// SPDX-License-Identifier: Apache-2.0
/*
 * A broadcast queue's data path over its mapped area (proto/layout_queue.h):
 * the writer fills a slot in place and publishes it, every live reader seat
 * reads it in place and marks it done; both sides wait with a short spin and
 * then a futex on a word of the area. Also the plain stores and wakes the
 * daemon applies (a seat taken or dropped, the writer gone, shutdown). Knows
 * nothing of sockets, the daemon's loop or the store.
 *
 * Any member can write any byte of the area: everything read from it is
 * checked against the private copies taken at attach, so a scribbled area
 * gives errors (-EIO) or wrong messages, never an access outside it.
 */
#ifndef SHMB_PROTO_QUEUE_H
#define SHMB_PROTO_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "layout_queue.h"

/* One process's view of a queue. The geometry is the private copy taken at
 * attach; the area is borrowed (the caller maps and unmaps it). */
struct shmb_q {
    unsigned char *base;
    size_t size;
    uint32_t seats;
    uint64_t slots;
    uint64_t slot_size;
    uint64_t slot_stride;
    uint64_t slots_offset;
    struct shmb_queue_header *hdr;
    struct shmb_queue_seat *seat;
    /* The writer's side. */
    bool writing;        /* the head is known (first reserve done) */
    bool reserved;       /* a slot is reserved, not yet published */
    uint64_t head;       /* the next message this writer publishes */
    uint32_t write_spin; /* adaptive spin budget, in nanoseconds */
    uint32_t blocker;    /* the seat the last wait for a slot found unread */
    uint64_t writer_epoch; /* the writer role's epoch, as queue_open answered */
    /* 0: each wait spins an adaptive 1 to 50 us before it sleeps; else it
     * spins this long (a member that wants a spinning reader's latency
     * while messages flow, and no CPU once they stop). */
    uint32_t spin_ns;
    /* The readers' side, per seat this process reads. */
    uint64_t known;                           /* seats whose epoch was taken */
    uint64_t held;                            /* seats holding a dequeued message */
    uint64_t held_seq[SHMB_QUEUE_SEATS_MAX];  /* the message each holds */
    uint64_t epoch[SHMB_QUEUE_SEATS_MAX];     /* the seat's epoch when first read */
    uint32_t read_spin;                       /* adaptive spin budget, in nanoseconds */
    /* The last message dequeued: its flags and aux (SHMB_QUEUE_OBJECT). */
    uint32_t msg_flags;
    uint64_t msg_aux;
};

/* What status shows of a queue. */
struct shmb_q_stats {
    uint64_t head;     /* messages published */
    uint64_t depth;    /* published, not yet read by the slowest live seat */
    uint32_t live;     /* seats LIVE, DEAD and FREE */
    uint32_t dead;
    uint32_t free;
    int32_t blocker;   /* the slowest live seat when depth > 0, else -1 */
    uint32_t state;    /* enum shmb_queue_state (as read; may be out of range) */
    uint32_t readers_waiting;
    uint32_t writer_waiting;
};

/* Bytes of an area for this geometry, or 0 when it is out of range or
 * overflows. */
size_t shmb_q_size(uint32_t seats, uint64_t slots, uint64_t slot_size);

/* Lay out a new queue in base[0..size): every seat FREE, head 0, state
 * OPEN. The daemon's creation; nobody else maps the area yet. */
int shmb_q_format(void *base, size_t size, const char *name, uint32_t seats, uint64_t slots,
                  uint64_t slot_size, struct shmb_error *err);

/* Check the header of base[0..size) and fill q with private copies of its
 * geometry. q borrows base. */
int shmb_q_attach(struct shmb_q *q, void *base, size_t size, struct shmb_error *err);

/* The longest a wait may spin before it sleeps on the futex: 100 ms. */
#define SHMB_Q_SPIN_MAX_NS 100000000u

/* Timeouts in milliseconds: -1 (any negative) waits for ever, 0 not at all.
 * Every wait ends with -ETIMEDOUT, or -ECANCELED after shutdown; a writer's
 * with -EPIPE once it is gone. */

/* Writer: wait until the next slot is free and return its payload area in
 * *buf (inside the area; valid until shmb_q_publish). len <= slot_size. */
int shmb_q_reserve(struct shmb_q *q, size_t len, void **buf, int timeout_ms,
                   struct shmb_error *err);

/* Writer: publish the reserved slot's first len bytes as the next message. */
int shmb_q_publish(struct shmb_q *q, size_t len, struct shmb_error *err);

/* Writer: publish a message whose slot holds a store object's key (len
 * bytes, already written by shmb_q_reserve's caller) of size bytes. */
int shmb_q_publish_object(struct shmb_q *q, size_t len, uint64_t size,
                          struct shmb_error *err);

/* Writer: reserve, copy len bytes of data, publish. */
int shmb_q_enqueue(struct shmb_q *q, const void *data, size_t len, int timeout_ms,
                   struct shmb_error *err);

/* Reader at seat: the next message, in place: *data points into the area and
 * stays valid until shmb_q_done(q, seat) or the next dequeue on the seat
 * (which marks the held one done first). -EPIPE: the writer is gone and
 * every message it published has been read; -ENOTCONN: the seat was
 * dropped or taken again; -EIO: the area is corrupt. q->msg_flags and
 * q->msg_aux describe the message. */
int shmb_q_dequeue(struct shmb_q *q, uint32_t seat, const void **data, size_t *len,
                   int timeout_ms, struct shmb_error *err);

/* Reader: finished with the message held at seat (no-op if none); the
 * writer may reuse its slot. */
void shmb_q_done(struct shmb_q *q, uint32_t seat);

/* The daemon's operations: plain stores to the area and futex wakes, never a
 * wait. A seat taken starts at the next message published. */
void shmb_q_seat_take(struct shmb_q *q, uint32_t seat);
void shmb_q_seat_drop(struct shmb_q *q, uint32_t seat, bool dead);
void shmb_q_writer_gone(struct shmb_q *q);
/* A writer opens the queue with a new epoch (the daemon's count of writers,
 * from 1): WRITER_GONE becomes OPEN again (SHUTDOWN stays), writer_live 1.
 * A writer whose q->writer_epoch is another gets -ENOTCONN. */
void shmb_q_writer_take(struct shmb_q *q, uint64_t epoch);
void shmb_q_shutdown(struct shmb_q *q);

/* Depth, seats and the slowest live seat, as the area says now. */
void shmb_q_stats(const struct shmb_q *q, struct shmb_q_stats *out);

#endif
