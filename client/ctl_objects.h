// SPDX-License-Identifier: Apache-2.0
/*
 * The commands on objects (ctl_objects.c): ls, put, get, rm, fetch. The
 * _prepare steps run before connecting (0, or the exit status); the cmd_
 * ones return the exit status.
 */
#ifndef SHMB_CLIENT_CTL_OBJECTS_H
#define SHMB_CLIENT_CTL_OBJECTS_H

#include "ctl.h"

/* ls [PREFIX]: the objects, oldest first. */
int run_ls(shmb_t *c, struct ctl *ctl);

/* Keys are checked before connecting: a key the ctl refuses is a usage
 * error, not the daemon's refusal. put reads its input then too. */
int key_prepare(struct ctl *ctl);

/* put's: the key checked, then its input read (a file, or "-"). */
int put_prepare(struct ctl *ctl);

/* fetch's: the key (its second argument) checked. */
int fetch_prepare(struct ctl *ctl);

/* put KEY FILE|-, rm KEY, get KEY [FILE|-]. */
int run_put(shmb_t *c, struct ctl *ctl);
int run_rm(shmb_t *c, struct ctl *ctl);
int run_get(shmb_t *c, struct ctl *ctl);

/* KEY from another host, through shmbroker-relay (shmb_fetch). */
int run_fetch(shmb_t *c, struct ctl *ctl);

#endif
