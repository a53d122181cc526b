/*
 * One client connection: read, frame lines (bounded), hand each line to the
 * command layer, write replies (one write per readable batch), pass the
 * segment's descriptor with the hello reply, and release everything the
 * client held when it goes. Knows nothing about the store's internals.
 */
#ifndef SHMB_CONN_H
#define SHMB_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "../proto/line.h"
#include "command.h"

struct server;

struct conn {
    uv_pipe_t pipe; /* first: libuv callbacks cast back to conn */
    struct server *server;
    struct conn *prev, *next; /* the server's list */
    struct command_client client;
    char *in; /* bytes read, not yet framed */
    size_t in_len, in_cap;
    struct line out; /* replies of this batch, not yet written */
    uint64_t connected_ms;
    bool closing;
    bool paused;     /* reading stopped while an alloc waits */
    bool deferred;   /* its turn ended with requests left (server_defer) */
    bool eof;        /* the client sent all it will send: run what is buffered,
                        then close */
    bool reset;      /* the client is gone (a read or write error): what
                        it sent still runs, its replies are dropped */
    bool finishing;  /* conn_finish: flushing before the close; run nothing */
    struct line hello; /* output held until the hello reply can carry the fd */
    struct conn_writable *writable; /* waits for room in the socket for it, or NULL */
    size_t unread_mark;    /* unread output when last seen over the limit */
    uint64_t unread_mark_ms; /* when it was seen so, 0 when not over it */
    json_t *wait_request; /* an alloc waiting for space, or NULL */
    uint64_t wait_until_ms;
    struct conn *wait_prev, *wait_next; /* the server's waiters, oldest first */
};

/* Serve an accepted socket fd of a peer with these credentials. On success
 * the server owns the connection (and it the descriptor); on failure the
 * descriptor is still the caller's. */
int conn_open(struct server *srv, int fd, pid_t pid, uid_t uid, gid_t gid);

/* The waiting alloc of conn got its answer (res has no COMMAND_WAIT):
 * deliver it and go on with the requests that queued up behind it. */
void conn_wait_done(struct conn *conn, struct command_result *res);

/* Close the connection: release the client's pins and pending allocations at
 * once, free the memory in libuv's close callback. */
void conn_close(struct conn *conn);

/* Run the requests left over from conn's last turn (server_defer). */
void conn_continue(struct conn *conn);

/* How long a connection may leave more than --max-queued-output of replies
 * unread without reading any of them before it is disconnected: a client
 * that reads, however slowly, is never cut off for one large reply; one that
 * stopped reading does not keep it in the daemon's memory for ever. */
#define CONN_UNREAD_GRACE_MS 5000
/* How often such connections are looked at. */
#define CONN_UNREAD_TICK_MS 500

/* Called while conn may have too much output unread (server_unread_watch):
 * disconnect it when it has not read any of it for CONN_UNREAD_GRACE_MS.
 * True when it is still over the limit and needs looking at again. */
bool conn_unread_check(struct conn *conn, uint64_t now_ms);

/* conn did not say hello within timeout_ms (--hello-timeout): tell it with
 * an ETIMEDOUT line, then close it. */
void conn_hello_timeout(struct conn *conn, uint64_t timeout_ms);

#endif
