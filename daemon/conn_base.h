// SPDX-License-Identifier: Apache-2.0
/*
 * What every part of a connection stands on: struct conn and the set's,
 * the states, the log's names for a connection, the watch of its socket,
 * the bound on output left unread, the input buffer, the close. What the
 * rooms of a connection (conn, conn_turn) share; the server sees it through
 * conn.h.
 */
#ifndef SHMB_CONN_BASE_H
#define SHMB_CONN_BASE_H

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

/* A poll on the socket for what libuv's own handle does not watch: room to
 * send the hello reply with its descriptor once sendmsg said EAGAIN, and the
 * client's going while reading is paused. libuv's handle already polls the
 * socket, and one descriptor may have one poll handle only, so this one
 * polls a dup() of it (epoll registers descriptors, not sockets). Allocated
 * apart from the connection: its close callback may come after the
 * connection's. */
struct conn_watch {
    uv_poll_t poll;
    int fd;            /* the dup */
    struct conn *conn; /* NULL once the connection is gone */
};

/* How long a connection may leave more than --max-queued-output of replies
 * unread without reading any of them before it is disconnected: a client
 * that reads, however slowly, is never cut off for one large reply; one that
 * stopped reading does not keep it in the daemon's memory for ever. */
#define CONN_UNREAD_GRACE_MS 5000
/* How often such connections are looked at. */
#define CONN_UNREAD_TICK_MS 500

/* Close the connection: release the client's pins and pending allocations at
 * once, free the memory in libuv's close callback. */
void conn_close(struct conn *conn);

/* How the log names a connection's process: "pid 1234", or for a client in
 * a pid namespace the daemon cannot see into (the kernel's pid is 0), "in
 * another pid namespace (pid 7 there)" with what its hello said. The
 * string is static: one per log line. */
const char *conn_pid(const struct conn *conn);

/* The client's hello name, for log lines. */
const char *conn_name(const struct conn *conn);

/* Stop waiting for room in the socket and free the poll. */
void conn_watch_free(struct conn *conn);

/* Move conn to state, leaving the queue its old state had it in (a
 * deferred turn, a waiting alloc, whose request is dropped). */
void conn_set_state(struct conn *conn, enum conn_state state);

/* Until it finishes or closes, a connection runs requests only while
 * reading; in the other states what comes is buffered. */
bool conn_ended(const struct conn *conn);

/* Bytes of replies the client has not read yet: queued in libuv, and built
 * in this batch. */
size_t conn_unread(const struct conn *conn);

/* Log that conn is over --max-queued-output, with its figures. */
void conn_log_unread(const struct conn *conn);

/* Start (or switch) conn's watch of its socket for events. 0 or a libuv
 * error. */
int conn_watch(struct conn *conn, int events, uv_poll_cb cb);

/* Append one reply to this batch's output, with its newline. -ENOMEM. */
int conn_queue(struct conn *conn, struct command_result *res);

/* Give libuv room at the end of the input buffer, growing it up to one line. */
void conn_on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf);

/* A write or send failure that means the peer is gone. */
bool conn_peer_gone(int rc);

/* Writing failed because the client is gone: its replies are dropped from
 * now on, but what it sent before it went is still read and run. */
void conn_lose_peer(struct conn *conn);

/* The connection a client belongs to: every client in env->client_list is a
 * connection's. */
struct conn *conn_of(struct command_client *client);

/* A connection has more output unread than --max-queued-output: look at it
 * again until it reads (conn_unread_check). */
void conn_set_unread_watch(struct conn_set *set);

#endif
