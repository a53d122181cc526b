// SPDX-License-Identifier: Apache-2.0
/*
 * status (ctl_status.c): connecting with a timeout, --json, and the hand-off
 * to the plain view, --prometheus and the segment's view.
 */
#ifndef SHMB_CLIENT_CTL_STATUS_H
#define SHMB_CLIENT_CTL_STATUS_H

#include "ctl.h"

/* status, as the options asked: --watch, --json, --prometheus, or the plain
 * view followed by the relay's peers. The exit status. */
int run_status(shmb_t *c, struct ctl *ctl);

/* Connect for status, waiting at most the timeout for an answer; when the
 * daemon does not answer (or refuses connections: it is gone) and its
 * segment is there, the plain view prints the figures of the segment
 * instead (--json and --prometheus are for programs: they get the error).
 * 0 with *out connected, or the exit status. */
int status_connect(const struct ctl *ctl, shmb_t **out);

#endif
