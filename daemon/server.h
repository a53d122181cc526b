/*
 * The listening socket: the probe that never displaces a live daemon, bind,
 * accept, and the list of open connections. Knows nothing about JSON; each
 * accepted socket becomes a conn.
 */
#ifndef SHMB_SERVER_H
#define SHMB_SERVER_H

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

#include "../proto/error.h"
#include "command.h"

struct conn;

struct server {
    uv_loop_t *loop;
    uv_pipe_t listener;
    bool listening;
    bool owns_path;          /* unlink the socket path at close */
    char path[108];
    struct command_env *env;
    struct conn *conns;      /* open connections, newest first */
    unsigned nconns;
};

/* Make sure no live daemon listens on path: -EADDRINUSE with "another
 * shmbrokerd is listening on PATH" when one does, a stale socket file is
 * removed (with a log line), anything that is not a socket is left alone and
 * refused. Run before the segment is created. */
int server_probe(const char *path, struct shmb_error *err);

/* Create the socket's parent directory when missing, bind path with mode,
 * and start accepting on loop. */
int server_listen(struct server *srv, uv_loop_t *loop, const char *path, mode_t mode,
                  struct command_env *env, struct shmb_error *err);

/* Stop accepting, close every connection and the listener, unlink the path. */
void server_close(struct server *srv);

/* Called by a connection when it has closed: forget it. */
void server_forget(struct server *srv, struct conn *conn);

#endif
