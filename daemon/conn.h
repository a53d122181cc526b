// SPDX-License-Identifier: Apache-2.0
/*
 * Client connections: read, frame lines (bounded), hand each line to the
 * command layer, write replies (one write per readable batch), pass the
 * segment's descriptor with the hello reply (a queue's with the queue_open
 * reply), and release everything the client held when it goes. The set of connections keeps what they share:
 * the turns left over, the hello and unread-output deadlines. Knows nothing
 * about the listening socket (server.c opens connections and hears back
 * through a callback) or the store's internals.
 */
#ifndef SHMB_CONN_H
#define SHMB_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <uv.h>

#include "../proto/line.h"
#include "command.h"
#include "policy.h"
#include "waitq.h"

/* Where a connection is in its life; what it runs depends on nothing else. */
enum conn_state {
    CONN_READING,    /* runs each request as its line comes */
    CONN_WAITING,    /* an alloc waits for space (wait): buffers input, runs nothing */
    CONN_WORKING,    /* a queue request waits for its pages, made or freed off the
                        loop (COMMAND_WORK): buffers input, runs nothing */
    CONN_HELLO_HELD, /* the hello reply (hello) waits to travel with its descriptor */
    CONN_DEFERRED,   /* its turn ran out with requests left: continues next iteration */
    CONN_FINISHING,  /* flushing its last replies before closing: runs nothing */
    CONN_CLOSED,     /* closed: freed in libuv's close callback */
};

struct conn_set;

struct conn {
    uv_pipe_t pipe; /* first: libuv callbacks cast back to conn */
    struct conn_set *set;
    enum conn_state state;
    struct command_client client; /* in set->env->client_list while open */
    TAILQ_ENTRY(conn) deferred_link; /* set->deferred, in CONN_DEFERRED */
    char *in; /* bytes read, not yet framed */
    size_t in_len, in_cap;
    struct line out;   /* replies of this batch, not yet written */
    struct line hello; /* CONN_HELLO_HELD: output held until the hello reply can
                          carry the descriptor */
    int pass_fd;       /* the queue descriptor the held reply carries (a
                          duplicate this connection owns); -1: the segment's */
    uint64_t connected_ms; /* for --hello-timeout */
    bool paused;     /* reading stopped: the input buffer is full while it waits */
    bool eof;        /* the client sent all it will send: run what is buffered,
                        then close */
    bool reset;      /* the client is gone (a read or write error): what
                        it sent still runs, its replies are dropped */
    bool wait_soft;  /* CONN_WAITING for a wait the request did not ask for
                        (COMMAND_WAIT_SOFT) */
    struct conn_watch *watch; /* a poll of the socket for room for the hello
                                 reply, or for the client's going while
                                 reading is paused; NULL when unused */
    size_t unread_mark;      /* unread output when last seen over the limit */
    uint64_t unread_mark_ms; /* when it was seen so, 0 when not over it */
    struct waitq_entry wait; /* CONN_WAITING: the alloc in set->waitq */
};

/* What the connections share; the server embeds one. */
struct conn_set {
    uv_loop_t *loop;
    struct command_env *env;     /* env->client_list lists the open connections */
    const struct policy *policy; /* read on every use: SIGHUP may change it */
    struct waitq waitq;          /* allocs waiting for space */
    unsigned count;              /* connections not freed yet, closing ones too:
                                    each holds a descriptor */
    void (*on_freed)(void *arg); /* a connection's descriptor was closed */
    void *on_freed_arg;
    TAILQ_HEAD(, conn) deferred; /* turns left over, oldest first */
    uv_timer_t hello_timer;      /* closes connections that do not say hello */
    uv_timer_t unread_timer;     /* closes connections that leave replies unread */
    uv_idle_t resume_idle;       /* continues deferred turns */
    bool started;
};

/* Set up an empty set on loop; on_freed is told each time a connection's
 * descriptor is closed. 0 or a libuv error (nothing to close then). */
int conn_set_init(struct conn_set *set, uv_loop_t *loop, struct command_env *env,
                  const struct policy *policy, void (*on_freed)(void *arg), void *arg);

/* Close every connection (releasing what its client held) and the set's
 * handles. */
void conn_set_close(struct conn_set *set);

/* Open connections of uid, closing ones left out. */
unsigned conn_set_count_uid(const struct conn_set *set, uid_t uid);

/* --hello-timeout changed (SIGHUP): apply it to the connections already
 * open, closing those past it now. */
void conn_set_hello_rearm(struct conn_set *set);

/* Serve an accepted socket fd of a peer with these credentials: the set
 * owns the connection, and it the descriptor. On failure (a libuv error) the
 * descriptor is closed. */
int conn_open(struct conn_set *set, int fd, pid_t pid, uid_t uid, gid_t gid);

/* Close the connection: release the client's pins and pending allocations at
 * once, free the memory in libuv's close callback. */
void conn_close(struct conn *conn);

/* How long a connection may leave more than --max-queued-output of replies
 * unread without reading any of them before it is disconnected: a client
 * that reads, however slowly, is never cut off for one large reply; one that
 * stopped reading does not keep it in the daemon's memory for ever. */
#define CONN_UNREAD_GRACE_MS 5000
/* How often such connections are looked at. */
#define CONN_UNREAD_TICK_MS 500

#endif
