// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of the object ops: alloc, commit, abort, get, release,
 * touch, delete, contains, list. Each is cmd_NAME for op NAME of
 * proto/ops.def, called from command.c's table only; they ask the client's
 * pool's store, never a queue.
 */
#ifndef SHMB_CMD_OBJECTS_H
#define SHMB_CMD_OBJECTS_H

#include "cmd_call.h"

/* The ops on one key (their requests and replies: proto/PROTOCOL.md). */
int cmd_alloc(struct command_call *call);
int cmd_commit(struct command_call *call);
int cmd_abort(struct command_call *call);
int cmd_get(struct command_call *call);
int cmd_release(struct command_call *call);
int cmd_touch(struct command_call *call);
int cmd_delete(struct command_call *call);
int cmd_contains(struct command_call *call);

/* list: the reply is written out as text, left open for the request's "id"
 * (command_finish closes it, as a batch's). */
int cmd_list(struct command_call *call);

#endif
