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

#endif
