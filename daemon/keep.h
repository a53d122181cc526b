// SPDX-License-Identifier: Apache-2.0
/*
 * The descriptor store's bookkeeping: which memfd pools systemd keeps across
 * a restart (notify.c speaks the protocol). Knows nothing of a reload or the
 * start's order.
 */
#ifndef SHMB_KEEP_H
#define SHMB_KEEP_H

#include "daemon.h"

/* Adopt for p the memfd systemd kept under its name, when it fits. */
void daemon_take_kept(struct daemon *d, struct pool *p);

/* A start refused: close what systemd passed. */
void daemon_close_kept(struct daemon *d);

/* A memfd pool made now: ask systemd to keep it across restarts. */
void daemon_keep_memfd(const struct daemon *d, const struct pool *p);

/* A memfd pool that goes for good: systemd must not keep it any longer. */
void daemon_unkeep_memfd(const struct daemon *d, const struct pool *p);

/* Descriptors systemd kept for pools no longer configured: let them go. */
void daemon_drop_kept(struct daemon *d);

#endif
