// SPDX-License-Identifier: Apache-2.0
/*
 * The arena and read ops' handlers: arena, commit_at, read.
 */
#include "cmd_arenas.h"

#include <errno.h>

/* read: an awaited read a read-only client did in place (it cannot count
 * it in the chunk's seal): one fewer awaited read of that generation. */
int cmd_read(struct command_call *call)
{
    const char *key = NULL;
    json_int_t gen = 0;
    size_t key_len = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s:I}", "key", &key, &key_len, "gen", &gen)) < 0 ||
        (rc = command_check_key(call, key_len)) < 0 ||
        (rc = command_check_range(call, "gen", gen, 1, UINT32_MAX)) < 0)
        return rc;
    if (store_read_done(call->client->pool->store, key, key_len, (uint32_t)gen) < 0)
        return shmb_error_set(&call->err, -ENOENT,
                              "No object '%.*s' of generation %lld: it was deleted, evicted "
                              "or replaced since the read.",
                              (int)key_len, key, (long long)gen);
    return 0;
}

/* arena: give this connection an arena in its pool (daemon/arena.c), giving
 * back the one it holds; "size":0 only gives it back. */
int cmd_arena(struct command_call *call)
{
    struct store_extent ext;
    json_int_t size = 0;
    uint64_t token = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:I}", "size", &size)) < 0 ||
        (rc = command_check_range(call, "size", size, 0, INT64_MAX)) < 0 ||
        (rc = command_wait_commits(
             call, store_arena(call->client->pool->store, call->client->holder,
                               call->client->id, (uint64_t)size, &ext, &token, &call->err))) <
            0)
        return rc;
    if (size == 0)
        return 0;
    if ((rc = command_set(call, "token", json_integer((json_int_t)token))) < 0)
        return rc;
    return command_set_extent(call, &ext);
}

/* commit_at's work once its fields are read, from a tree (cmd_commit_at) or
 * from the line by hand (command_fast_commit_at): the same checks either way. */
int command_commit_at(struct command_call *call, const char *key, size_t len,
                      json_int_t offset, json_int_t size, json_int_t readers)
{
    struct store_extent ext;
    int rc;

    call->key = key;
    call->key_len = len;
    if ((rc = command_check_key(call, len)) < 0 ||
        (rc = command_check_range(call, "offset", offset, 0, INT64_MAX)) < 0 ||
        (rc = command_check_range(call, "size", size, 1, INT64_MAX)) < 0 ||
        (rc = command_check_range(call, "readers", readers, 0, STORE_MAX_READERS)) < 0) {
        /* Refused before the arena was looked at (readers over the bound,
         * which the library does not check): it was counted on its way all
         * the same, and is not any more. */
        store_commit_seen(call->client->pool->store, call->client->holder);
        return rc;
    }
    if ((rc = store_commit_at(call->client->pool->store, call->client->holder, key, len,
                              (uint64_t)offset, (uint64_t)size, (uint32_t)readers, &ext,
                              &call->err)) < 0)
        return rc;
    return command_set_extent(call, &ext);
}

/* commit_at: commit the chunk laid out at offset in this connection's
 * arena; the reply names its payload as alloc's does. */
int cmd_commit_at(struct command_call *call)
{
    const char *key;
    size_t len;
    json_int_t offset = 0, size = 0, readers = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s:I, s:I, s?I}", "key", &key, &len, "offset",
                             &offset, "size", &size, "readers", &readers)) < 0) {
        store_commit_seen(call->client->pool->store, call->client->holder);
        return rc;
    }
    return command_commit_at(call, key, len, offset, size, readers);
}
