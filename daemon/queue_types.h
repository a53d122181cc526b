// SPDX-License-Identifier: Apache-2.0
/*
 * The queues' types that their callers and the queue's own rooms both use:
 * the bounds, a member and a seat, a waiter, a queue, the set, what status
 * shows. queue.h has the calls; this header is apart so that the rooms
 * beside queue.c (queue_overflow.c, queue_job.c) can have the types without
 * queue.c's calls.
 */
#ifndef SHMB_QUEUE_TYPES_H
#define SHMB_QUEUE_TYPES_H

#include <limits.h>
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

/* Queues a daemon holds at once, of all pools (config.h says why). */
#define QUEUE_MAX CONFIG_QUEUES_MAX
/* Roles (writer or reader seats, of any queues) one connection may hold. */
#define QUEUE_MAX_ROLES 256
/* The most bytes a queue's area may have: its memfd is made, reserved and
 * mapped in one go (off the loop, but a thread of libuv's pool is busy
 * for a fraction of a second already). Larger messages go as store
 * objects. */
#define QUEUE_SIZE_MAX (UINT64_C(1) << 30)
/* Descriptors left free for new clients (a socket and its poll's dup each)
 * and queue_open's passing: a queue is not created into the last of them. */
#define QUEUE_FD_SPARE 8
/* Counts read from an area are shown as JSON integers: at most this. */
#define QUEUE_COUNT_MAX ((uint64_t)INT64_MAX)
/* A queue's name: a pool name's rule (proto/names.h, shmb_q_name_check). */
#define QUEUE_NAME_MAX SHMB_QUEUE_NAME_LEN_MAX
/* The defaults of vLLM's MessageQueue: max_chunks and max_chunk_bytes. */
#define QUEUE_DEFAULT_SLOTS 10
#define QUEUE_DEFAULT_SLOT_SIZE (10 * 1024 * 1024)

/* Who holds (or held) a role, as status shows it. */
struct queue_member {
    uint64_t client; /* the connection's number in this daemon's life */
    pid_t pid;       /* 0: in another pid namespace (command_client) */
    pid_t own_pid;   /* what its hello said, 0 when nothing */
    uid_t uid;
    char name[SHMB_NAME_MAX + 1];
    /* Its pins in the queue's pool (NULL: not known), to tell whether a
     * reader that leaves had taken the message it stood at. */
    const struct store_holder *holder;
};

/* The daemon's own record of a seat: the area's seat state is written by the
 * daemon too, but any member can scribble it, so this one is believed. */
struct queue_seat {
    const void *owner;       /* the connection holding it; NULL when free or dead */
    uint32_t state;          /* enum shmb_seat_state */
    struct queue_member who; /* LIVE: the holder; DEAD: the one that died */
};

struct queue;
struct queue_job;

/* A request waiting for a queue's pages to be made or freed off the loop
 * (queue_create, queue_delete with a waiter): embedded in what waits. */
struct queue_waiter {
    TAILQ_ENTRY(queue_waiter) link;
    struct queue_job *job; /* what it waits for; NULL once answered or cancelled */
    /* The answer, on the loop: rc 0 or -errno (err says what), q the queue
     * made (creation; borrowed, valid during the call) or NULL. The waiter
     * has left the job; the callee may free it. */
    void (*done)(struct queue_waiter *w, int rc, const struct shmb_error *err,
                 const struct queue *q);
};

TAILQ_HEAD(queue_waiters, queue_waiter);

/* Hands job to another thread: queue_job_run(job) there, then
 * queue_job_finish(job) on the loop. Nonzero when it cannot (then the work
 * is done at once, on the loop). */
typedef int (*queue_offload_fn)(void *arg, struct queue_job *job);

struct queue {
    TAILQ_ENTRY(queue) link;
    char name[QUEUE_NAME_MAX + 1];
    struct pool *pool; /* the pool of the connection that created it */
    uint32_t seats;
    uint64_t slots, slot_size;
    size_t size;       /* bytes of the area */
    bool temporary;    /* deleted once its writer has come and everyone left */
    bool had_writer;
    bool shut_down;
    int fd;            /* the memfd, passed to members */
    void *base;        /* the daemon's mapping of it */
    struct shmb_q q;   /* attached to base */
    const void *writer; /* the connection holding the writer role, or NULL */
    uint64_t writer_epoch; /* writers that took it so far (the area's copy may be scribbled) */
    struct queue_member writer_who;
    struct queue_seat seat[SHMB_QUEUE_SEATS_MAX];
    struct queue_job *making; /* its pages are being made: in set->making, not
                                 set->list, and nothing but its name and
                                 geometry may be read */
    uint64_t idle_since_ms;   /* when nobody held it any more, or a
                                 queue_create last found it (clock_now_ms);
                                 0 while a member holds it */
    /* The daemon's record of its writers' overflow objects: the seqs of the
     * "q/<name>/<seq>" they allocated, ascending, in a ring of overflow_cap
     * (grown as needed, at most slots + 1: older ones have left the ring).
     * A seat that leaves forgoes its reads of these, so that it costs the
     * objects there are, not a scan of slots keys at the area's (writable)
     * head. */
    uint64_t *overflow;
    uint32_t overflow_first, overflow_n, overflow_cap;
};

TAILQ_HEAD(queue_list, queue);

/* Every queue of a daemon, in creation order. */
struct queue_set {
    struct queue_list list;
    struct queue_list making; /* being made off the loop: counted, not served */
    unsigned n;               /* both lists */
    char prefix[NAME_MAX + 1]; /* memfd names: "<prefix>.q.<queue>" */
    uint64_t max_size;         /* bytes of one queue's area: QUEUE_SIZE_MAX
                                  (the fuzzer lowers it) */
    uint64_t lease_ms;         /* --queue-lease: a queue nobody holds for this
                                  long is deleted (queue_expire); 0 = never */
    bool stopping;             /* queue_shutdown_all ran: queues made after
                                  it are shut down at once */
    queue_offload_fn offload;  /* NULL: a queue's pages are made and freed on
                                  the caller's thread (tests, the fuzzer) */
    void *offload_arg;
};

/* What status shows of a queue now. */
struct queue_status {
    const char *state;   /* "open", "writer_gone", "shutdown" */
    uint64_t messages;   /* the area's head */
    uint64_t depth;      /* published, not yet read by the slowest live seat */
    uint32_t live, dead, free;
    bool writer_waiting;
    uint32_t readers_waiting;
    int32_t blocker;     /* the slowest live seat while it holds the writer back
                            (depth >= slots, or the writer waits), else -1 */
    uint64_t behind[SHMB_QUEUE_SEATS_MAX]; /* per live seat: messages unread */
};

/* Which roles queue_close leaves. */
enum queue_role {
    QUEUE_ROLE_ANY,
    QUEUE_ROLE_WRITER,
    QUEUE_ROLE_READER,
};

#endif
