// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of the reports: stats (every pool, its queues) and clients.
 * Called from command.c's table only; they read, never change, what they
 * show.
 */
#ifndef SHMB_CMD_REPORTS_H
#define SHMB_CMD_REPORTS_H

#include "cmd_call.h"

/* stats: every pool in "pools", each looked at once (the host's memory
 * read once for all memfd pools); the connection's pool's fields again at
 * the top level, with every connection in "clients"; the queues as
 * queue_list shows them. */
int cmd_stats(struct command_call *call);

/* clients: every connection with its credentials and what it holds; the
 * name of one in a pool the asker may not use is null. */
int cmd_clients(struct command_call *call);

#endif
