// SPDX-License-Identifier: Apache-2.0
/*
 * status from the segment's header page (ctl_segment.c), when the daemon
 * does not answer or --from-segment asks.
 */
#ifndef SHMB_CLIENT_CTL_SEGMENT_H
#define SHMB_CLIENT_CTL_SEGMENT_H

#include "ctl.h"

/* Why status reads the segment: asked to (--from-segment), or the daemon
 * did not answer. */
enum ctl_segment_why { CTL_SEG_ASKED, CTL_SEG_NO_ANSWER };

/* status from the segment's header page: who wrote it and how long ago it
 * last beat, then the counters it published with that beat. The exit
 * status: 0 when asked to (--from-segment), 3 when the daemon did not
 * answer, 2 for a file that is not a segment of this layout, 66 when there
 * is none to read. */
int print_segment_status(const struct ctl *ctl, enum ctl_segment_why why);

/* Whether the daemon's segment is there for status to read. A segment
 * named (--name, --shm-dir), the one whose header names the daemon
 * listening at the socket, or the default one when the socket is the
 * default one too: a daemon on a socket of its own has a segment of its
 * own, and another daemon's figures would mislead. */
bool segment_exists(const struct ctl *ctl);

#endif
