// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of arenas and reads: arena, commit_at (and its checks,
 * which the hand-parsed fast path of command.c shares), read. Called from
 * command.c only; they ask the client's pool's store.
 */
#ifndef SHMB_CMD_ARENAS_H
#define SHMB_CMD_ARENAS_H

#include "cmd_call.h"

/* commit_at's work once its fields are read, from a tree (cmd_commit_at) or
 * from the line by hand (command_fast_commit_at): the same checks either way. */
int command_commit_at(struct command_call *call, const char *key, size_t len,
                      json_int_t offset, json_int_t size, json_int_t readers);

/* read: an awaited read a read-only client did in place (it cannot count
 * it in the chunk's seal): one fewer awaited read of that generation. */
int cmd_read(struct command_call *call);

/* arena: give this connection an arena in its pool (daemon/arena.c), giving
 * back the one it holds; "size":0 only gives it back. */
int cmd_arena(struct command_call *call);

/* commit_at: commit the chunk laid out at offset in this connection's
 * arena; the reply names its payload as alloc's does. */
int cmd_commit_at(struct command_call *call);

#endif
