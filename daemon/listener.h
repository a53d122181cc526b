// SPDX-License-Identifier: Apache-2.0
/*
 * Whose is the socket listening at a path, as the kernel tells it
 * (sock_diag, /proc/net/unix, /proc/pid/fd): reads only, knows nothing of
 * the daemon's own listener or its connections.
 */
#ifndef SHMB_LISTENER_H
#define SHMB_LISTENER_H

#include <sys/types.h>

#include "../proto/error.h"

/* Whether process pid holds the socket listening at path (--reload's proof
 * that pid is the daemon these settings name: no other process holds a
 * listening socket, which systemd passes to the daemon alone). The
 * listener is the one the kernel's sock_diag shows bound to the file path
 * leads to here (its device and inode), pid's descriptors are read in
 * /proc/pid/fd. A kernel without sock_diag for Unix sockets: the listeners
 * named path in /proc/net/unix, and when several carry the name, the one
 * path leads to must be pid's own (a connection's SO_PEERCRED). 1 held, 0
 * not (err says why), negative errno when it cannot be told (err says why
 * and what to do). */
int server_listener_held_by(const char *path, pid_t pid, struct shmb_error *err);

#endif
