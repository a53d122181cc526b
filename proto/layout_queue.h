// SPDX-License-Identifier: Apache-2.0
/*
 * The layout of a broadcast queue: the bytes its writer and its readers map
 * read-write. One writer, up to SHMB_QUEUE_SEATS_MAX reader seats, a ring of
 * slots; every reader reads every message in order. Offsets only, never
 * pointers. Knows nothing of the daemon or of sockets.
 *
 *   [ header page | seats[seats] | pad to a page | slots[slots] ]
 *
 * A word that more than one process writes, or that is read while another
 * writes it, is _Atomic; the geometry is written once at creation.
 */
#ifndef SHMB_PROTO_LAYOUT_QUEUE_H
#define SHMB_PROTO_LAYOUT_QUEUE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"

#define SHMB_QUEUE_MAGIC UINT64_C(0x31455551424d4853) /* "SHMBQUE1" */
#define SHMB_QUEUE_VERSION 1
/* A seat's state lives in one bit of a 64-bit mask in the library, and vLLM's
 * largest tensor-parallel groups on one host are 8 or 16 readers. */
#define SHMB_QUEUE_SEATS_MAX 64u
/* Two slots at least, so the writer can fill one while readers read another;
 * 65536 keeps slots * slot_stride far from any overflow for sane slot sizes. */
#define SHMB_QUEUE_SLOTS_MIN 2u
#define SHMB_QUEUE_SLOTS_MAX 65536u
/* A slot smaller than a cache line would share it with the next header. */
#define SHMB_QUEUE_SLOT_SIZE_MIN 64u
/* 1 GiB: larger messages go as store objects, referenced from a slot. */
#define SHMB_QUEUE_SLOT_SIZE_MAX (UINT64_C(1) << 30)
#define SHMB_QUEUE_NAME_MAX 64u /* with the NUL */
#define SHMB_QUEUE_SLOT_HEADER 64u
#define SHMB_QUEUE_SEAT_SIZE 64u

/* The queue's state (header.state), written by the daemon. */
enum shmb_queue_state {
    SHMB_QUEUE_OPEN = 0,
    SHMB_QUEUE_SHUTDOWN = 1,    /* every wait ends with -ECANCELED */
    SHMB_QUEUE_WRITER_GONE = 2, /* readers drain what was published, then -EPIPE */
};

/* A seat's state (seat.state), written by the daemon. */
enum shmb_seat_state {
    SHMB_SEAT_FREE = 0,
    SHMB_SEAT_LIVE = 1, /* the writer waits for this reader */
    SHMB_SEAT_DEAD = 2, /* its reader's connection closed; not waited for */
};

/* What a slot holds (slot.flags). */
#define SHMB_QUEUE_INLINE 1u /* the payload is the message, len bytes */
#define SHMB_QUEUE_OBJECT 2u /* the payload is a store key (len bytes), aux its size */

/* The first page. Each group of words written by one side has a cache line
 * of its own, so a reader polling head does not share a line with the words
 * readers write. */
struct shmb_queue_header {
    uint64_t magic;        /* SHMB_QUEUE_MAGIC */
    uint32_t version;      /* SHMB_QUEUE_VERSION */
    uint32_t seats;        /* 1..SHMB_QUEUE_SEATS_MAX */
    uint64_t slots;        /* SHMB_QUEUE_SLOTS_MIN..SHMB_QUEUE_SLOTS_MAX */
    uint64_t slot_size;    /* payload bytes per slot */
    uint64_t slot_stride;  /* SHMB_QUEUE_SLOT_HEADER + slot_size, rounded up to 64 */
    uint64_t slots_offset; /* page-aligned start of the slots */
    uint64_t total_size;   /* bytes of the whole area */
    char name[SHMB_QUEUE_NAME_MAX];
    uint8_t pad0[8];
    /* The writer's line: the sequence number of the next message it will
     * publish. Stored with release after the slot is filled. */
    _Atomic uint64_t head;
    uint8_t pad1[56];
    /* Readers sleep on head_word (the low 32 bits of head, bumped after
     * it); readers_waiting counts them, so the writer wakes only then. */
    _Atomic uint32_t head_word;
    _Atomic uint32_t readers_waiting;
    uint8_t pad2[56];
    /* The writer sleeps on free_word, which every reader bumps when it
     * finishes a message; writer_waiting (0/1) tells readers to wake it. */
    _Atomic uint32_t free_word;
    _Atomic uint32_t writer_waiting;
    /* Set by the writer before it sleeps: the next a reader's finishing
     * must reach for the reader to wake it (0: every finish wakes it), so
     * that a writer held back sleeps until half the ring is free, not one
     * slot. */
    _Atomic uint64_t wake_at;
    uint8_t pad3[48];
    /* The daemon's line. */
    _Atomic uint32_t state;       /* enum shmb_queue_state */
    _Atomic uint32_t writer_live; /* 1 while a writer has the queue open */
    /* Bumped by the daemon each time a writer takes the queue: a writer
     * whose epoch is not this one lost the role (its connection closed)
     * and may not publish beside the new one. */
    _Atomic uint64_t writer_epoch;
};

/* One reader seat, a cache line each. */
struct shmb_queue_seat {
    _Atomic uint64_t next;    /* the message this reader reads next; stored with
                                 release when it has finished with the previous */
    _Atomic uint32_t state;   /* enum shmb_seat_state */
    _Atomic uint32_t waiting; /* 1 while this reader sleeps on head_word */
    _Atomic uint64_t epoch;   /* bumped each time the seat is taken */
    uint8_t pad[40];
};

/* The header of every slot; the payload follows it. */
struct shmb_queue_slot {
    uint64_t seq;  /* the message's sequence number */
    uint32_t flags; /* SHMB_QUEUE_INLINE or SHMB_QUEUE_OBJECT */
    uint32_t len;   /* payload bytes */
    uint64_t aux;   /* SHMB_QUEUE_OBJECT: the object's size */
    uint64_t aux2;  /* written 0: room for a later field */
    uint8_t pad[32];
};

/* Every process maps the same words: they must be lock-free (an address-free
 * futex word, not a lock in a private table) and of their plain size. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the queue's atomics are lock-free");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && sizeof(_Atomic uint32_t) == 4,
               "atomics have their plain size");

_Static_assert(sizeof(struct shmb_queue_header) == 336, "queue header size");
SHMB_LAYOUT_AT(struct shmb_queue_header, magic, 0);
SHMB_LAYOUT_AT(struct shmb_queue_header, version, 8);
SHMB_LAYOUT_AT(struct shmb_queue_header, seats, 12);
SHMB_LAYOUT_AT(struct shmb_queue_header, slots, 16);
SHMB_LAYOUT_AT(struct shmb_queue_header, slot_size, 24);
SHMB_LAYOUT_AT(struct shmb_queue_header, slot_stride, 32);
SHMB_LAYOUT_AT(struct shmb_queue_header, slots_offset, 40);
SHMB_LAYOUT_AT(struct shmb_queue_header, total_size, 48);
SHMB_LAYOUT_AT(struct shmb_queue_header, name, 56);
SHMB_LAYOUT_AT(struct shmb_queue_header, head, 128);
SHMB_LAYOUT_AT(struct shmb_queue_header, head_word, 192);
SHMB_LAYOUT_AT(struct shmb_queue_header, readers_waiting, 196);
SHMB_LAYOUT_AT(struct shmb_queue_header, free_word, 256);
SHMB_LAYOUT_AT(struct shmb_queue_header, writer_waiting, 260);
SHMB_LAYOUT_AT(struct shmb_queue_header, wake_at, 264);
SHMB_LAYOUT_AT(struct shmb_queue_header, state, 320);
SHMB_LAYOUT_AT(struct shmb_queue_header, writer_live, 324);
SHMB_LAYOUT_AT(struct shmb_queue_header, writer_epoch, 328);
_Static_assert(sizeof(struct shmb_queue_header) <= SHMB_HEADER_PAGE,
               "the queue header fits its page");

_Static_assert(sizeof(struct shmb_queue_seat) == SHMB_QUEUE_SEAT_SIZE, "seat size");
SHMB_LAYOUT_AT(struct shmb_queue_seat, next, 0);
SHMB_LAYOUT_AT(struct shmb_queue_seat, state, 8);
SHMB_LAYOUT_AT(struct shmb_queue_seat, waiting, 12);
SHMB_LAYOUT_AT(struct shmb_queue_seat, epoch, 16);

_Static_assert(sizeof(struct shmb_queue_slot) == SHMB_QUEUE_SLOT_HEADER, "slot header size");
SHMB_LAYOUT_AT(struct shmb_queue_slot, seq, 0);
SHMB_LAYOUT_AT(struct shmb_queue_slot, flags, 8);
SHMB_LAYOUT_AT(struct shmb_queue_slot, len, 12);
SHMB_LAYOUT_AT(struct shmb_queue_slot, aux, 16);
SHMB_LAYOUT_AT(struct shmb_queue_slot, aux2, 24);
/* The seats start on the second page; the slots, page-aligned after them. */
_Static_assert(SHMB_QUEUE_SEATS_MAX * SHMB_QUEUE_SEAT_SIZE <= SHMB_HEADER_PAGE,
               "the largest seat table fits a page");
/* slot.len is 32 bits. */
_Static_assert(SHMB_QUEUE_SLOT_SIZE_MAX <= UINT32_MAX, "a slot's length fits slot.len");

#endif
