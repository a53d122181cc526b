// SPDX-License-Identifier: Apache-2.0
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
#include "conn.h"
#include "listener.h"
#include "policy.h"

struct server {
    uv_loop_t *loop;
    uv_poll_t watcher; /* readable listening socket */
    int listen_fd;     /* -1 when closed */
    int reserve_fd;    /* spent to refuse one client at EMFILE */
    bool watching;     /* watcher started */
    bool paused;       /* out of descriptors: not accepting */
    bool owns_path;    /* unlink the socket path at close */
    char path[108];
    const struct policy *limits;
    struct conn_set conns; /* the open connections, and what they share */
    uv_timer_t emfile_timer; /* refuses queued clients while out of descriptors */
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

/* What systemd keeps for the daemon in its file-descriptor store and
 * passes back at the next start, beside the socket: descriptors whose
 * $LISTEN_FDNAMES name starts with SERVER_KEPT_PREFIX. */
#define SERVER_KEPT_MAX 16
#define SERVER_KEPT_PREFIX "pool-"
struct server_kept {
    int fd[SERVER_KEPT_MAX];
    char name[SERVER_KEPT_MAX][64]; /* as stored: "pool-NAME" */
    unsigned n;
};

/* The listening socket systemd passed (socket activation: $LISTEN_PID is
 * us and $LISTEN_FDS counts it, and kept descriptors named in
 * $LISTEN_FDNAMES). Returns 1 with *fd set, 0 when no socket was passed
 * (the variables are unset either way), or -EINVAL when more than one
 * descriptor is not a kept one, or that one is not a listening Unix stream
 * socket. Kept descriptors go to kept (close-on-exec), or are closed when
 * kept is NULL or full. */
int server_activated_fd(int *fd, struct server_kept *kept, struct shmb_error *err);

/* A start that failed under socket activation: answer each client already
 * waiting on fd (up to SERVER_REFUSE_WAITING_MAX) with one error line
 * carrying code and message, and close it. Without this, systemd would see
 * the socket still readable once the daemon exits and start it again for
 * the same clients, failing in a loop until its start limit stops the socket. */
#define SERVER_REFUSE_WAITING_MAX 4096
void server_refuse_waiting(int fd, int code, const char *message);

/* Serve a listening socket systemd passed. The path is never unlinked: it
 * belongs to systemd. */
int server_adopt(struct server *srv, uv_loop_t *loop, int fd, struct command_env *env,
                 const struct policy *limits, struct shmb_error *err);

/* Stop accepting, close every connection and the listener, unlink the path. */
void server_close(struct server *srv);

/* --hello-timeout changed (SIGHUP): apply it to the connections already
 * open, closing those past it now. */
void server_hello_rearm(struct server *srv);

#endif
