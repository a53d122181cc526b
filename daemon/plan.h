// SPDX-License-Identifier: Apache-2.0
/*
 * The pools of the settings: checked and planned before anything changes,
 * opened with the start's progress, closed at the stop. Knows nothing of
 * signals or the loop.
 */
#ifndef SHMB_PLAN_H
#define SHMB_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "../proto/error.h"
#include "daemon.h"

/* The checks of the settings alone (sizes[] gets each pool's size). */
int daemon_check_settings(const struct config *cfg, uint64_t *sizes,
                          struct shmb_error *err);

/* Make the pools and check that the new ones fit: every check before any change. */
int daemon_plan_pools(struct daemon *d, struct shmb_error *err);

/* Free the pools of a start that did not get as far as pool_open. */
void daemon_free_pools(struct daemon *d);

/* Open one pool (the start's and SIGHUP's way, so adoption is the same). */
int daemon_open_pool(struct daemon *d, struct pool *p, struct shmb_error *err);

/* Open the pools planned; on failure close those opened. */
int daemon_open_pools(struct daemon *d, struct shmb_error *err);

/* Close every pool (keeping file segments when keep). */
void daemon_close_pools(struct daemon *d, bool keep);

/* The start's progress file beside the socket: made before the pools are
 * reserved, removed once the start serves or is refused. */
void daemon_progress_begin(struct daemon *d);
void daemon_progress_end(struct daemon *d);

#endif
