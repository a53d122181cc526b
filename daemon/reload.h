// SPDX-License-Identifier: Apache-2.0
/*
 * The pool reload: SIGHUP's settings applied to the running pools, and
 * --reload, which asks a running daemon for one. Knows nothing of the start
 * or the stop.
 */
#ifndef SHMB_RELOAD_H
#define SHMB_RELOAD_H

#include <sys/types.h>

#include "daemon.h"

/* Apply next's pools to d's: add, keep, remove (logged either way). */
void daemon_reload_pools(struct daemon *d, const struct config *next);

/* --reload PID: ask the running shmbrokerd PID to apply cfg. */
int daemon_send_reload(const struct config *cfg, pid_t pid);

#endif
