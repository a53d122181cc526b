// SPDX-License-Identifier: Apache-2.0
/*
 * status --prometheus (ctl_prom.c): the exposition of the daemon's, the
 * pools' and the queues' figures.
 */
#ifndef SHMB_CLIENT_CTL_PROM_H
#define SHMB_CLIENT_CTL_PROM_H

#include "ctl.h"

/* shmbroker_up: whether the daemon answered this scrape. With 0 it is the
 * whole exposition: the last file's figures must not live on in a
 * textfile collector as if they were current. */
void prom_up(FILE *out, int up);

/* status --prometheus: the exposition is made whole before any of it is
 * written, so that a scrape that fails half way leaves no half file. */
int print_prometheus(shmb_t *c, const struct ctl *ctl);

#endif
