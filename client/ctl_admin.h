// SPDX-License-Identifier: Apache-2.0
/*
 * The commands about the daemon (ctl_admin.c): clients, check.
 */
#ifndef SHMB_CLIENT_CTL_ADMIN_H
#define SHMB_CLIENT_CTL_ADMIN_H

#include "ctl.h"

/* clients: every connection; with a POOL column when the daemon has more
 * than one pool (a daemon of one pool gets the table it always had). */
int run_clients(shmb_t *c, struct ctl *ctl);

/* check: run shmbrokerd --check with the daemon flags given, the
 * shmbrokerd installed beside this shmbrokerctl first (the pair from one
 * build or package), else $SHMBROKERD, else PATH's. Returns only when none
 * could be run: 127 when none was found, 126 when one could not be run. */
int run_check(int argc, char **argv);

#endif
