/*
 * The listening socket: the probe that never displaces a live daemon, bind,
 * accept with its own loop (credentials, allow lists, client caps, and a
 * reserved descriptor for EMFILE), and the list of open connections. Knows
 * nothing about JSON; each admitted socket becomes a conn.
 */
#ifndef SHMB_SERVER_H
#define SHMB_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

#include "../proto/error.h"
#include "command.h"
#include "policy.h"

struct conn;

struct server {
    uv_loop_t *loop;
    uv_poll_t watcher; /* readable listening socket */
    int listen_fd;     /* -1 when closed */
    int reserve_fd;    /* spent to refuse one client at EMFILE */
    bool watching;     /* watcher started */
    bool paused;       /* out of descriptors: not accepting */
    bool owns_path;    /* unlink the socket path at close */
    char path[108];
    struct command_env *env;
    const struct policy *limits;
    struct conn *conns; /* open connections, newest first */
    unsigned nconns;
    /* Allocs waiting for space, in arrival order; retried when the store
     * says room may have been made (checked once per loop iteration), and
     * answered at their deadlines by one timer for the earliest. */
    struct conn *wait_head, *wait_tail;
    uv_check_t room_check;
    uv_timer_t wait_timer;
    uv_timer_t emfile_timer; /* refuses queued clients while out of descriptors */
    uv_timer_t hello_timer;  /* closes connections that do not say hello in time */
    uv_timer_t unread_timer; /* closes connections that leave replies unread */
    /* Connections with requests left over from their turn (conn_process runs
     * one connection for a bounded time, then lets the others go first):
     * continued on the next loop iteration. */
    uv_idle_t resume_idle;
    unsigned ndeferred;
    uint64_t room_gen;
};

/* Make sure no live daemon listens on path, changing nothing: -EADDRINUSE
 * with "another shmbrokerd is listening on PATH" when one does, 1 when a
 * stale socket file is there (for server_remove_stale), 0 when nothing is;
 * anything that is not a socket is refused. Run before the segment is
 * created. */
int server_probe(const char *path, struct shmb_error *err);

/* Remove the stale socket file server_probe found, with a log line; run only
 * once nothing else can refuse the start. */
int server_remove_stale(const char *path, struct shmb_error *err);

/* Create the socket's parent directory when missing and bind path with
 * mode: *fd is the socket, not listening yet (a connect is refused until
 * server_listen).
 * Done before the segment is touched, so that a socket that cannot be made
 * refuses the start while nothing has changed. */
int server_bind(const char *path, mode_t mode, int *fd, struct shmb_error *err);

/* Undo server_bind when the start fails later: close fd, unlink path. */
void server_unbind(int fd, const char *path);

/* Listen on fd, the socket server_bind made at path, and accept on loop;
 * server_close closes it and unlinks path. On failure fd is closed and path
 * unlinked too. */
int server_listen(struct server *srv, uv_loop_t *loop, int fd, const char *path,
                  struct command_env *env, const struct policy *limits,
                  struct shmb_error *err);

/* The listening socket systemd passed (socket activation: $LISTEN_PID is
 * us and $LISTEN_FDS is 1). Returns 1 with *fd set, 0 when none was passed
 * (the variables are unset either way), or -EINVAL when the descriptor is not
 * a listening Unix stream socket. */
int server_activated_fd(int *fd, struct shmb_error *err);

/* Serve a listening socket systemd passed. The path is never unlinked: it
 * belongs to systemd. */
int server_adopt(struct server *srv, uv_loop_t *loop, int fd, struct command_env *env,
                 const struct policy *limits, struct shmb_error *err);

/* Stop accepting, close every connection and the listener, unlink the path. */
void server_close(struct server *srv);

/* Park conn (its wait_request set) at the end of the waiters; take it out. */
void server_wait_add(struct server *srv, struct conn *conn);
void server_wait_remove(struct server *srv, struct conn *conn);

/* Called by a connection when it has closed: forget it, and resume accepting
 * if descriptors had run out. */
void server_forget(struct server *srv, struct conn *conn);

/* A connection opened: make sure the hello timer will look at it. */
void server_hello_watch(struct server *srv);

/* conn has more output unread than --max-queued-output: look at it again
 * until it reads (conn_unread_check). */
void server_unread_watch(struct server *srv);

/* --hello-timeout changed (SIGHUP): apply it to the connections already
 * open, closing those past it now. */
void server_hello_rearm(struct server *srv);

/* conn used its turn with complete requests left: continue it on the next
 * loop iteration, after the other clients' events. server_undefer takes it
 * off (it continues, or closes). */
void server_defer(struct server *srv, struct conn *conn);
void server_undefer(struct server *srv, struct conn *conn);

#endif
