// SPDX-License-Identifier: Apache-2.0
/*
 * status, plain (ctl_human.c): the view people read, once or every --watch
 * seconds.
 */
#ifndef SHMB_CLIENT_CTL_HUMAN_H
#define SHMB_CLIENT_CTL_HUMAN_H

#include "ctl.h"

/* status, plain: one view of the figures. A daemon of one pool gets the view
 * it always had; with --pool, that pool, named (its clients: the pool's);
 * otherwise every pool, each with its own bar, objects, clients and
 * blocker, after the daemon's line and its clients in all. */
int print_status(shmb_t *c, const struct ctl *ctl);

/* status --watch: redraw in place on a terminal; elsewhere (a pipe, a file)
 * append one view after another, without terminal codes. Until interrupted
 * or the daemon goes away (exit 69). */
int watch_status(shmb_t *c, const struct ctl *ctl);

/* The relay attached to the daemon (shmbroker-relay), after status: its
 * peers, one line each. Nothing when no relay answers. */
void print_relay(shmb_t *c);

#endif
