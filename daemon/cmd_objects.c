// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of the object ops: alloc, commit, abort, get, release,
 * touch, delete, contains, list. Each is cmd_NAME for op NAME of
 * proto/ops.def, called from command.c's table only; they ask the client's
 * pool's store, never a queue.
 */
#include "cmd_call.h"

#include "../proto/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int cmd_alloc(struct command_call *call)
{
    struct store_extent ext;
    const char *key;
    size_t key_len;
    json_int_t size = 0, readers = 0, wait_ms = 0;
    uint32_t count;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s:I, s?I, s?I}", "key",
                             &key, &key_len, "size", &size, "readers", &readers,
                             "wait_ms", &wait_ms)) < 0 ||
        (rc = command_check_range(call, "size", size, 1, INT64_MAX)) < 0 ||
        (rc = command_check_range(call, "readers", readers, 0, STORE_MAX_READERS)) < 0 ||
        (rc = command_check_range(call, "wait_ms", wait_ms, 0, COMMAND_MAX_WAIT_MS)) < 0)
        return rc;
    {
        struct store_holder_stats hs;

        store_holder_stats(call->client->holder, &hs);
        if ((rc = command_check_cap(call, hs.pending, call->env->limits.max_pending,
                                    "max-pending", "uncommitted allocations")) < 0)
            return rc;
    }
    /* A queue writer's overflow object awaits the seats live now, by the
     * daemon's count: its own may miss a seat taken since it looked. */
    count = (uint32_t)readers;
    queue_overflow_readers(&call->env->queues, call->client->pool, call->client, key, key_len,
                           &count);
    rc = store_alloc(call->client->pool->store, call->client->holder, key, key_len, (uint64_t)size,
                     count, &ext, &call->err);
    if (wait_ms == 0)
        rc = command_wait_commits(call, rc);
    if (rc == -ENOSPC && wait_ms > 0) {
        char why[SHMB_ERROR_MSG_MAX];

        if (!call->final_try) {
            /* Wait: the connection retries this request when room may have
             * been made, in arrival order, until the deadline. */
            if (call->wait_until_ms == 0)
                call->wait_until_ms = clock_now_ms() + (uint64_t)wait_ms;
            store_retract_enospc(call->client->pool->store);
            return -EINPROGRESS;
        }
        snprintf(why, sizeof(why), "%s", call->err.message);
        return shmb_error_set(&call->err, -ETIMEDOUT, "Waited %lld ms for space. %s",
                              (long long)wait_ms, why);
    }
    if (rc < 0)
        return rc;
    /* Made: the seats that leave forgo their reads of it. */
    queue_overflow_made(&call->env->queues, call->client->pool, call->client, key, key_len);
    return command_set_extent(call, &ext);
}

/* A store operation on one key of this client's. */
typedef int (*command_key_fn)(struct store *s, struct store_holder *h, const char *key,
                              size_t key_len, struct shmb_error *err);

/* The handlers whose request is just a key and whose reply has no field:
 * commit, abort, release, delete. */
static int command_key_op(struct command_call *call, command_key_fn fn)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, &key, &len)) < 0)
        return rc;
    return fn(call->client->pool->store, call->client->holder, key, len, &call->err);
}

/* store_delete in command_key_fn's shape: any client may delete. */
static int command_store_delete(struct store *s, struct store_holder *h, const char *key,
                                size_t key_len, struct shmb_error *err)
{
    (void)h;
    return store_delete(s, key, key_len, err);
}

int cmd_commit(struct command_call *call)
{
    return command_key_op(call, store_commit);
}

int cmd_abort(struct command_call *call)
{
    return command_key_op(call, store_abort);
}

int cmd_get(struct command_call *call)
{
    struct store_extent ext;
    const char *key;
    size_t len;
    struct store_holder_stats hs;
    int rc;

    store_holder_stats(call->client->holder, &hs);
    if ((rc = command_key(call, &key, &len)) < 0 ||
        (rc = command_check_cap(call, hs.pins, call->env->limits.max_pins, "max-pins",
                                "pins")) < 0 ||
        (rc = store_get(call->client->pool->store, call->client->holder, key, len, &ext,
                        &call->err)) < 0)
        return rc;
    return command_set_extent(call, &ext);
}

int cmd_release(struct command_call *call)
{
    return command_key_op(call, store_release);
}

int cmd_touch(struct command_call *call)
{
    const char *key;
    size_t len;
    json_int_t readers = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s:I}", "key", &key, &len,
                             "readers", &readers)) < 0 ||
        (rc = command_check_key(call, len)) < 0 ||
        (rc = command_check_range(call, "readers", readers, 0, STORE_MAX_READERS)) < 0)
        return rc;
    return store_touch(call->client->pool->store, key, len, (uint32_t)readers, &call->err);
}

int cmd_delete(struct command_call *call)
{
    return command_key_op(call, command_store_delete);
}

int cmd_contains(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, &key, &len)) < 0)
        return rc;
    return command_set(call, "exists",
                       json_boolean(store_contains(call->client->pool->store, key, len)));
}

/* What list's callback writes into. */
struct command_list {
    struct line *text; /* the reply, written out */
    size_t listed;     /* entries written */
    size_t limit;      /* entries the request asked for at most */
    size_t max_bytes;  /* the reply stops growing past this */
    bool more;         /* an entry matched that the reply leaves out */
    int rc;            /* -ENOMEM */
};

/* list's callback: one entry, written straight into the reply text (a
 * jansson object per entry would cost several times the reply's size).
 * Stops at the limit and at COMMAND_LIST_MAX_REPLY bytes. */
static int command_list_entry(const struct store_entry *e, void *arg)
{
    struct command_list *cl = arg;
    struct line *l = cl->text;

    if (cl->listed == cl->limit || l->len >= cl->max_bytes) {
        cl->more = true;
        return 1;
    }
    if ((cl->listed > 0 && line_lit(l, ",") < 0) || line_lit(l, "{\"key\":") < 0 ||
        line_str(l, e->key, e->key_len) < 0 || line_lit(l, ",\"offset\":") < 0 ||
        line_u64(l, e->offset) < 0 || line_lit(l, ",\"size\":") < 0 ||
        line_u64(l, e->size) < 0 || line_lit(l, ",\"pins\":") < 0 ||
        line_u64(l, e->pins) < 0 || line_lit(l, ",\"readers\":") < 0 ||
        line_u64(l, e->awaited_reads) < 0 || line_lit(l, ",\"state\":\"") < 0 ||
        line_lit(l, store_state_name(e->state)) < 0 || line_lit(l, "\",\"age_ms\":") < 0 ||
        line_u64(l, e->age_ms) < 0 || line_lit(l, "}") < 0) {
        cl->rc = -ENOMEM;
        return 1;
    }
    cl->listed++;
    return 0;
}

/* list: the reply is written out as text, left open for the request's "id"
 * (command_finish closes it, as a batch's). */
int cmd_list(struct command_call *call)
{
    const char *prefix = "";
    size_t prefix_len = 0;
    json_int_t limit = SHMB_LIST_DEFAULT_LIMIT, from = 0;
    struct command_list cl;
    uint64_t next = 0;
    int rc;

    if ((rc = command_unpack(call, "{s?s%, s?I, s?I}", "prefix", &prefix, &prefix_len,
                             "limit", &limit, "from", &from)) < 0 ||
        (rc = command_check_range(call, "limit", limit, 1, SHMB_LIST_MAX_LIMIT)) < 0 ||
        (rc = command_check_range(call, "from", from, 0, INT64_MAX)) < 0)
        return rc;
    memset(&cl, 0, sizeof(cl));
    cl.text = &call->text;
    cl.limit = (size_t)limit;
    cl.max_bytes = call->env->max_reply != 0 && call->env->max_reply < COMMAND_LIST_MAX_REPLY
                       ? call->env->max_reply
                       : COMMAND_LIST_MAX_REPLY;
    /* Ask for one more than the limit to tell the client whether it saw all. */
    if (line_lit(&call->text, "{\"ok\":true,\"objects\":[") < 0)
        cl.rc = -ENOMEM;
    else
        store_list_from(call->client->pool->store, prefix, prefix_len, (size_t)limit + 1,
                        (uint64_t)from, COMMAND_LIST_MAX_SCAN, &next, command_list_entry,
                        &cl);
    /* Stopped after COMMAND_LIST_MAX_SCAN objects: more may match. */
    if (next != 0 && !cl.more)
        cl.more = true;
    else
        next = 0; /* the reply is full anyway: a longer prefix, not a next */
    if (cl.rc < 0 || line_lit(&call->text, "],\"truncated\":") < 0 ||
        line_lit(&call->text, cl.more ? "true" : "false") < 0 ||
        (next != 0 && (line_lit(&call->text, ",\"next\":") < 0 ||
                       line_u64(&call->text, next) < 0))) {
        shmb_free(call->text.buf);
        memset(&call->text, 0, sizeof(call->text));
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    }
    return 0;
}
