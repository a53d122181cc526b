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

/* How messages name a member's process: "pid 1234", or, for one in a pid
 * namespace the daemon cannot see into, "a process in another pid
 * namespace (pid 7 there, uid 1000)". Into buf, which it returns. */
const char *queue_member_pid(const struct queue_member *who, char *buf, size_t len);

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

/* Stop waiting (its request's connection closed): w is not answered. The
 * work goes on; a queue being made is made. */
void queue_waiter_cancel(struct queue_waiter *w);

/* The part of job that runs off the loop, in another thread: it touches
 * only the job's own queue, which the loop does not read meanwhile. */
void queue_job_run(struct queue_job *job);

/* The part of job that runs on the loop once queue_job_run returned: the
 * queue made joins the set (or, failed, goes), waiters are answered, and
 * the job is freed. */
void queue_job_finish(struct queue_job *job);

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

/* Put the immutable words of the area's header back (a member may have
 * scribbled them) before its descriptor is passed to a new member. */
void queue_restore_header(struct queue *q);

/* What status shows of q now. */
void queue_status(const struct queue *q, struct queue_status *out);

#endif
