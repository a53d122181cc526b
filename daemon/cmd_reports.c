// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of the reports: stats (every pool, its queues) and clients.
 * Called from command.c's table only; they read, never change, what they
 * show.
 */
#include "cmd_call.h"
#include "cmd_queues.h"
#include "host.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

/* What a pool's part of a stats reply is made of, gathered once. */
struct command_stats {
    const struct command_env *env;
    const struct pool *pool;
    struct store_stats st;
    uint64_t shm_free;
    uint64_t clients; /* connections counted in this object */
    bool hide;        /* the blocker's key is not the asker's to see */
};

/* The fields of the stats reply that are numbers gathered in struct
 * command_stats (the store's and the pool's), by their offset in it plus one
 * (0: a field command_stat makes otherwise). */
#define COMMAND_STAT_AT(id, member)                                                        \
    [SHMB_STAT_##id] = offsetof(struct command_stats, member) + 1
static const size_t command_stat_at[SHMB_STAT_COUNT] = {
    COMMAND_STAT_AT(DATA_SIZE, st.data_size), COMMAND_STAT_AT(USED, st.used),
    COMMAND_STAT_AT(FREE, st.free), COMMAND_STAT_AT(OBJECTS, st.objects),
    COMMAND_STAT_AT(PENDING, st.pending), COMMAND_STAT_AT(PINNED, st.pinned),
    COMMAND_STAT_AT(CLIENTS, clients), COMMAND_STAT_AT(MAX_OBJECT_SIZE, st.max_object_size),
    COMMAND_STAT_AT(SHM_DIR_FREE, shm_free), COMMAND_STAT_AT(ALLOCS, st.allocs),
    COMMAND_STAT_AT(COMMITS, st.commits), COMMAND_STAT_AT(GETS, st.gets),
    COMMAND_STAT_AT(EVICTIONS, st.evictions), COMMAND_STAT_AT(ENOSPC, st.enospc),
    COMMAND_STAT_AT(EXPIRED_ALLOCS, st.expired_allocs),
    COMMAND_STAT_AT(LEASE_EXPIRIES, st.lease_expiries), COMMAND_STAT_AT(FAST_READS, st.fast_reads),
};
#undef COMMAND_STAT_AT

/* The value of one field of the stats reply (a row of proto/stats.def): a
 * new reference, NULL when memory ran out. */
static json_t *command_stat(const struct command_stats *cs, enum shmb_stat_id id)
{
    const struct store_stats *st = &cs->st;
    uint64_t n = 0;

    switch (id) {
    case SHMB_STAT_SEGMENT: return json_string(cs->pool->seg.name);
    case SHMB_STAT_VERSION: return json_string(SHMB_VERSION);
    case SHMB_STAT_SHM_DIR: return json_string(cs->pool->cfg.dir);
    case SHMB_STAT_BLOCKER:
        if (!st->has_blocker)
            return json_null();
        return json_pack("{s:o, s:I, s:I, s:s}", "key", command_name(st->blocker_key, cs->hide),
                         "pins",
                         (json_int_t)st->blocker_pins, "readers",
                         (json_int_t)st->blocker_readers, "state",
                         store_state_name(st->blocker_state));
    case SHMB_STAT_SIZE: n = cs->pool->seg.size; break;
    case SHMB_STAT_UPTIME_S: n = (clock_now_ms() - cs->env->started_ms) / 1000; break;
    case SHMB_STAT_PID: n = (uint64_t)getpid(); break;
    case SHMB_STAT_NOREPLY_ERRORS: n = cs->env->noreply_errors; break;
    default: /* gathered in cs: command_stat_at */
        if (command_stat_at[id] != 0)
            memcpy(&n, (const char *)cs + command_stat_at[id] - 1, sizeof(n));
        break;
    }
    return json_integer((json_int_t)n);
}

/* Fill obj with every field of proto/stats.def for pool, in its order, the
 * counters in an object of their own after the others; then the pool's
 * name, backing and group. clients: the connections that said hello to it;
 * mem_room: the memory the daemon may still use (a memfd pool's free
 * space); hide: the blocker's key is shown as null. -ENOMEM. */
static int command_pool_stats(const struct command_env *env, const struct pool *pool,
                              uint64_t mem_room, bool hide, json_t *obj)
{
    struct command_stats cs = {
        .env = env, .pool = pool, .clients = pool->clients, .hide = hide};
    json_t *counters = json_object();
    int i;

    if (counters == NULL)
        return -ENOMEM;
    store_stats(pool->store, &cs.st);
    if (pool->cfg.backing == POOL_BACKING_MEMFD)
        cs.shm_free = mem_room;
    else
        segment_check_space(pool->cfg.dir, 0, &cs.shm_free, NULL);
    for (i = 0; i < SHMB_STAT_COUNT; i++) {
        json_t *value = command_stat(&cs, (enum shmb_stat_id)i);

        if (value == NULL ||
            json_object_set_new(shmb_stat_fields[i].kind == SHMB_STATK_COUNTER ? counters : obj,
                                shmb_stat_fields[i].name, value) != 0) {
            json_decref(counters);
            return -ENOMEM;
        }
    }
    if (json_object_set_new(obj, "counters", counters) != 0 ||
        json_object_set_new(obj, "pool", json_string(pool->cfg.name)) != 0 ||
        json_object_set_new(obj, "backing",
                            json_string(pool_backing_name(pool->cfg.backing))) != 0 ||
        json_object_set_new(obj, "group",
                            pool->cfg.has_group ? json_string(pool->cfg.group) : json_null()) != 0)
        return -ENOMEM;
    return 0;
}

/* stats: every pool in "pools", each looked at once (the host's memory
 * read once for all memfd pools); the connection's pool's fields again at
 * the top level, with every connection in "clients"; the queues as
 * queue_list shows them. */
int cmd_stats(struct command_call *call)
{
    const struct pool_set *set = call->env->pools;
    json_t *reply, *pools, *mine = NULL;
    struct host_memory mem;
    uint64_t mem_room = 0;
    int seats = 0;
    unsigned i;

    if (command_unpack(call, "{s?b}", "seats", &seats) < 0)
        return call->err.code;
    for (i = 0; i < set->n; i++)
        if (set->pools[i]->cfg.backing == POOL_BACKING_MEMFD) {
            if (host_memory(&mem, NULL) == 0)
                mem_room = host_memory_room(&mem);
            break;
        }
    if ((reply = command_reply_object(call)) == NULL || (pools = json_array()) == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    for (i = 0; i < set->n; i++) {
        json_t *obj = json_object();

        if (obj == NULL || json_array_append_new(pools, obj) != 0 ||
            command_pool_stats(call->env, set->pools[i], mem_room,
                               !command_may_see(call, set->pools[i]), obj) < 0)
            goto nomem;
        if (set->pools[i] == call->client->pool)
            mine = obj;
    }
    /* In stats.def's order after "ok", then "pool" (jansson keeps the order
     * keys were added in). */
    if (mine == NULL) { /* a pool with a client is never removed */
        json_decref(pools);
        return shmb_error_set(&call->err, -EIO, "This connection's pool is gone.");
    }
    if (json_object_update(reply, mine) != 0 ||
        json_object_set_new(reply, "clients", json_integer((json_int_t)call->env->clients)) != 0)
        goto nomem;
    json_object_del(reply, "backing");
    json_object_del(reply, "group");
    if (command_set(call, "pools", pools) < 0)
        return call->err.code;
    return command_set(call, "queues", command_queues_json(call, seats != 0));

nomem:
    json_decref(pools);
    return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
}

/* clients: every connection with its credentials and what it holds; the
 * name of one in a pool the asker may not use is null. */
int cmd_clients(struct command_call *call)
{
    struct command_client *cl;
    json_t *list;

    if (command_unpack(call, "{}") < 0)
        return call->err.code;
    list = json_array();
    if (list == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    TAILQ_FOREACH(cl, &call->env->client_list, link) {
        struct store_holder_stats hs = {0};
        json_t *item;

        if (cl->holder != NULL)
            store_holder_stats(cl->holder, &hs);
        item = json_pack("{s:I, s:o, s:I, s:I, s:o, s:s, s:I, s:I, s:I, s:I, s:b, s:s}",
                         "pid", (json_int_t)cl->pid, "own_pid",
                         cl->own_pid > 0 ? json_integer(cl->own_pid) : json_null(), "uid",
                         (json_int_t)cl->uid, "gid",
                         (json_int_t)cl->gid, "name",
                         command_name(cl->name, !command_may_see(call, cl->pool)), "mode",
                         cl->read_only ? "ro" : "rw", "pins", (json_int_t)hs.pins,
                         "pending", (json_int_t)hs.pending, "bytes_pinned",
                         (json_int_t)hs.bytes_pinned, "connected_unix",
                         (json_int_t)cl->connected_unix, "self", cl == call->client, "pool",
                         cl->pool != NULL ? cl->pool->cfg.name : "");
        if (item == NULL || json_array_append_new(list, item) != 0) {
            json_decref(list);
            return shmb_error_set(&call->err, -ENOMEM,
                                  "Out of memory building the reply.");
        }
    }
    return command_set(call, "clients", list);
}
