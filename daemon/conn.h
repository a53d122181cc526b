// SPDX-License-Identifier: Apache-2.0
/*
 * Client connections: read, frame lines (bounded), hand each line to the
 * command layer, write replies (one write per readable batch), pass the
 * segment's descriptor with the hello reply (a queue's with the queue_open
 * reply), and release everything the client held when it goes. The set of
 * connections keeps what they share: the turns left over, the hello and
 * unread-output deadlines. Three rooms: this one (the set and each
 * connection's opening), conn_turn (a connection's turns) and conn_base
 * (what both stand on). Knows nothing about the listening socket (server.c
 * opens connections and hears back through a callback) or the store's
 * internals.
 */
#ifndef SHMB_CONN_H
#define SHMB_CONN_H

#include <sys/types.h>
#include <uv.h>

#include "command.h"
#include "conn_base.h"
#include "policy.h"

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

#endif
