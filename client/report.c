// SPDX-License-Identifier: Apache-2.0
/*
 * The library's reports: stats (filled row by row of proto/stats.def),
 * list, clients, and the raw request for tools. The one place that knows
 * the shape of those replies (the queues' is report_queue.c's), so that the
 * ctl only formats.
 */
#include "report.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/alloc.h"
#include "internal.h"

/* Every row of proto/stats.def names a member of shmb_stats_t of the same
 * name (the blocker row: has_blocker), so a row added without its member
 * does not compile. */
#define CLIENT_STAT_MEMBER(name)                                                          \
    {offsetof(shmb_stats_t, name), sizeof(((shmb_stats_t *)0)->name)}
#define CLIENT_STAT_PLACE_SHMB_STATK_STRING(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_NUMBER(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_COUNTER(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_BLOCKER(name) CLIENT_STAT_MEMBER(has_blocker)

const struct shmb_stats_place shmb_stats_places[SHMB_STAT_COUNT] = {
#define SHMB_STAT(id, name, kind) [SHMB_STAT_##id] = CLIENT_STAT_PLACE_##kind(name),
#include "../proto/stats.def"
#undef SHMB_STAT
};

/* A number or counter row's member holds a uint64_t (pid: an int64_t), as
 * the reader and shmb_stats_number copy it. */
#define CLIENT_STAT_CHECK_SHMB_STATK_STRING(name)
#define CLIENT_STAT_CHECK_SHMB_STATK_BLOCKER(name)
#define CLIENT_STAT_CHECK_SHMB_STATK_NUMBER(name)                                         \
    _Static_assert(sizeof(((shmb_stats_t *)0)->name) == sizeof(uint64_t),                 \
                   "shmb_stats_t." #name " must be 64 bits");
#define CLIENT_STAT_CHECK_SHMB_STATK_COUNTER(name) CLIENT_STAT_CHECK_SHMB_STATK_NUMBER(name)
#define SHMB_STAT(id, name, kind) CLIENT_STAT_CHECK_##kind(name)
#include "../proto/stats.def"
#undef SHMB_STAT

/* The size of the first release's shmb_stats_t, which ended before
 * expired_allocs: what shmb_stats fills. */
#define CLIENT_STATS_V1_SIZE offsetof(shmb_stats_t, expired_allocs)

uint64_t shmb_stats_number(const shmb_stats_t *st, enum shmb_stat_id id)
{
    uint64_t v = 0;

    if ((shmb_stat_fields[id].kind == SHMB_STATK_NUMBER ||
         shmb_stat_fields[id].kind == SHMB_STATK_COUNTER) &&
        shmb_stats_places[id].size == sizeof(v))
        memcpy(&v, (const char *)st + shmb_stats_places[id].offset, sizeof(v));
    return v;
}

/* The blocker of a stats reply (an object, or null when nothing blocks). */
static void client_stats_blocker(const json_t *blocker, shmb_stats_t *out)
{
    if (!json_is_object(blocker))
        return;
    out->has_blocker = 1;
    client_copy_string(blocker, "key", out->blocker_key, sizeof(out->blocker_key));
    client_copy_string(blocker, "state", out->blocker_state, sizeof(out->blocker_state));
    out->blocker_pins = (uint64_t)json_integer_value(json_object_get(blocker, "pins"));
    out->blocker_readers = (uint64_t)json_integer_value(json_object_get(blocker, "readers"));
}

/* Fill out from a stats reply, or from one pool's object of its "pools",
 * row by row of proto/stats.def (the two have the same shape): the one place
 * that knows the reply's shape. Numbers and counters must be there; the
 * pool's name, backing and group (null: none) may not, from a daemon without
 * pools. */
static int client_stats_fill(shmb_t *c, const json_t *reply, shmb_stats_t *out)
{
    const json_t *counters = json_object_get(reply, "counters");
    int i, rc;

    memset(out, 0, sizeof(*out));
    for (i = 0; i < SHMB_STAT_COUNT; i++) {
        const char *name = shmb_stat_fields[i].name;
        char *member = (char *)out + shmb_stats_places[i].offset;
        uint64_t v;

        switch (shmb_stat_fields[i].kind) {
        case SHMB_STATK_STRING:
            client_copy_string(reply, name, member, shmb_stats_places[i].size);
            break;
        case SHMB_STATK_BLOCKER:
            client_stats_blocker(json_object_get(reply, name), out);
            break;
        case SHMB_STATK_NUMBER:
        case SHMB_STATK_COUNTER:
            rc = client_u64(c, shmb_stat_fields[i].kind == SHMB_STATK_COUNTER ? counters
                                                                               : reply,
                            name, &v);
            if (rc < 0)
                return rc;
            memcpy(member, &v, sizeof(v));
            break;
        }
    }
    client_copy_string(reply, "pool", out->pool, sizeof(out->pool));
    client_copy_string(reply, "backing", out->backing, sizeof(out->backing));
    client_copy_string(reply, "group", out->group, sizeof(out->group));
    return 0;
}

/* The "pools" of a stats reply: NULL from a daemon without pools, else an
 * array (anything else is -EPROTO in c->err, and *bad set). */
static const json_t *client_stats_pool_array(shmb_t *c, const json_t *reply, bool *bad)
{
    const json_t *pools = json_object_get(reply, "pools");

    *bad = pools != NULL && !json_is_array(pools);
    if (*bad)
        shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply has a \"pools\" that is not "
                                         "an array.");
    return json_is_array(pools) ? pools : NULL;
}

/* The top level of a stats reply says only which pool it is of: its backing
 * and group are in that pool's object of "pools". */
static void client_stats_pool_of(const json_t *pools, shmb_stats_t *out)
{
    size_t i;

    for (i = 0; pools != NULL && out->pool[0] != '\0' && i < json_array_size(pools); i++) {
        const json_t *p = json_array_get(pools, i);
        const char *name = json_string_value(json_object_get(p, "pool"));

        if (name != NULL && strcmp(name, out->pool) == 0) {
            if (out->backing[0] == '\0')
                client_copy_string(p, "backing", out->backing, sizeof(out->backing));
            if (out->group[0] == '\0')
                client_copy_string(p, "group", out->group, sizeof(out->group));
            return;
        }
    }
}

/* The request {"op":OP} of a report that takes no argument; NULL when out
 * of memory (client_call says so). */
static json_t *client_report_request(enum shmb_op_id op)
{
    return json_pack("{s:s}", "op", shmb_ops[op].name);
}

static int client_stats(shmb_t *c, shmb_stats_t *out, size_t size)
{
    shmb_stats_t all;
    json_t *reply = NULL;
    int rc;

    memset(out, 0, size);
    if (size < CLIENT_STATS_V1_SIZE)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_stats_sized: size %zu is smaller than the first "
                              "release's shmb_stats_t (%zu bytes); pass sizeof(*out).",
                              size, (size_t)CLIENT_STATS_V1_SIZE);
    rc = client_call(c, client_report_request(SHMB_OP_STATS), &reply);
    if (rc == 0 && (rc = client_stats_fill(c, reply, &all)) == 0) {
        bool bad;

        client_stats_pool_of(client_stats_pool_array(c, reply, &bad), &all);
        memcpy(out, &all, size < sizeof(all) ? size : sizeof(all));
    }
    json_decref(reply);
    return rc;
}

/* Every pool's figures (shmb_stats_pools): one shmb_stats_t per object of
 * the reply's "pools", read by the same rows as the top level; from a
 * daemon without pools, the top level alone. */
static int client_stats_pools(shmb_t *c, shmb_stats_t **out, size_t *count)
{
    const json_t *pools;
    json_t *reply = NULL;
    shmb_stats_t *all = NULL;
    size_t i, n;
    bool bad;
    int rc;

    *out = NULL;
    *count = 0;
    rc = client_call(c, client_report_request(SHMB_OP_STATS), &reply);
    if (rc < 0)
        goto fail;
    pools = client_stats_pool_array(c, reply, &bad);
    if (bad) {
        rc = c->err.code;
        goto fail;
    }
    n = pools != NULL ? json_array_size(pools) : 1;
    if (n == 0) {
        rc = shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply has no pool in \"pools\".");
        goto fail;
    }
    all = shmb_calloc(n, sizeof(*all));
    if (all == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for the stats of %zu pools.", n);
        goto fail;
    }
    for (i = 0; i < n; i++) {
        const json_t *pool = pools != NULL ? json_array_get(pools, i) : reply;

        if (!json_is_object(pool)) {
            rc = shmb_error_set(&c->err, -EPROTO,
                                "shmbrokerd's reply has a \"pools\" entry (%zu) that is not "
                                "an object.", i);
            goto fail;
        }
        if ((rc = client_stats_fill(c, pool, &all[i])) < 0)
            goto fail;
    }
    json_decref(reply);
    *out = all;
    *count = n;
    return 0;

fail:
    shmb_free(all);
    json_decref(reply);
    return rc;
}

/* Send req (the library keeps no reference) and give its reply as one line
 * of compact JSON in *reply (malloc'ed, caller frees), without the "id" the
 * library added when req had none (own_id false). */
static int client_call_text(shmb_t *c, json_t *req, bool own_id, char **reply)
{
    json_t *rep = NULL;
    int rc = client_call(c, req, &rep);

    if (rep != NULL) {
        if (!own_id)
            json_object_del(rep, "id");
        *reply = json_dumps(rep, JSON_COMPACT);
        json_decref(rep);
        if (*reply == NULL)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for the reply.");
    }
    return rc;
}

static int client_request(shmb_t *c, const char *request, char **reply)
{
    json_error_t jerr;
    json_t *req;

    *reply = NULL;
    shmb_error_clear(&c->err);
    req = json_loads(request, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL)
        return shmb_error_set(&c->err, -EINVAL, "Request is not valid JSON: %s.",
                              jerr.text);
    if (!json_is_object(req) || json_is_true(json_object_get(req, "noreply"))) {
        json_decref(req);
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_request sends one JSON object and waits for its reply: "
                              "not an array or a scalar, and not \"noreply\": true.");
    }
    /* The caller's "id" is matched as it is; without one, the library's is
     * used and taken out of the reply again. */
    return client_call_text(c, req, json_object_get(req, "id") != NULL, reply);
}

static int client_stats_json(shmb_t *c, char **json)
{
    *json = NULL;
    return client_call_text(c, client_report_request(SHMB_OP_STATS), false, json);
}

/* A string field of a report's item, or NULL (-EPROTO in c->err). */
static const char *client_string(shmb_t *c, const json_t *obj, const char *field)
{
    const char *s = json_string_value(json_object_get(obj, field));

    if (s == NULL)
        shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply lacks a string \"%s\".", field);
    return s;
}

/* A report as one block the caller frees with shmb_free: head_size bytes,
 * then one element of elem_size per item of the reply's array field, then
 * the text of each item's string field text (NUL-terminated). *items gets
 * the array, *elems and *texts where those parts start. */
static void *client_report_block(shmb_t *c, const json_t *reply, const char *array,
                                 const char *text, size_t head_size, size_t elem_size,
                                 json_t **items, char **elems, char **texts)
{
    size_t i, room = 0, n;
    char *block;

    *items = json_object_get(reply, array);
    if (!json_is_array(*items)) {
        shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply lacks an array \"%s\".", array);
        return NULL;
    }
    n = json_array_size(*items);
    for (i = 0; i < n; i++) {
        const json_t *item = json_array_get(*items, i);
        const char *s;

        /* A name that a pool's group= hides from this peer is null: "". */
        if (json_is_null(json_object_get(item, text)) && strcmp(text, "name") == 0) {
            room++;
            continue;
        }
        if ((s = client_string(c, item, text)) == NULL)
            return NULL;
        room += strlen(s) + 1;
    }
    block = shmb_malloc(head_size + n * elem_size + room);
    if (block == NULL) {
        shmb_error_set(&c->err, -ENOMEM, "Out of memory for a reply of %zu entries.", n);
        return NULL;
    }
    *elems = block + head_size;
    *texts = *elems + n * elem_size;
    return block;
}

/* Copy an item's string field (checked by client_report_block; null is "")
 * to *texts, moving it on; returns the copy. */
static const char *client_report_text(const json_t *item, const char *field, char **texts)
{
    const char *s = json_string_value(json_object_get(item, field));
    char *copy = *texts;

    if (s == NULL)
        s = "";
    size_t len = strlen(s) + 1;

    memcpy(copy, s, len);
    *texts += len;
    return copy;
}

/* Decode a list reply: one block, every field of every object checked. */
static int client_list_decode(shmb_t *c, const json_t *reply, shmb_list_t **out)
{
    shmb_list_t *list;
    json_t *items, *truncated = json_object_get(reply, "truncated");
    char *elems, *texts;
    size_t i;
    int rc;

    if (!json_is_boolean(truncated))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks a boolean \"truncated\".");
    list = client_report_block(c, reply, "objects", "key", sizeof(*list),
                               sizeof(*list->objects), &items, &elems, &texts);
    if (list == NULL)
        return c->err.code;
    list->count = json_array_size(items);
    list->truncated = json_is_true(truncated);
    list->objects = (shmb_object_info_t *)elems;
    for (i = 0; i < list->count; i++) {
        const json_t *item = json_array_get(items, i);
        shmb_object_info_t *o = &list->objects[i];
        const char *state = client_string(c, item, "state");

        if (state == NULL || (rc = client_u64(c, item, "offset", &o->offset)) < 0 ||
            (rc = client_u64(c, item, "size", &o->size)) < 0 ||
            (rc = client_u64(c, item, "pins", &o->pins)) < 0 ||
            (rc = client_u64(c, item, "readers", &o->readers)) < 0 ||
            (rc = client_u64(c, item, "age_ms", &o->age_ms)) < 0) {
            shmb_free(list);
            return c->err.code;
        }
        snprintf(o->state, sizeof(o->state), "%s", state);
        o->key = client_report_text(item, "key", &texts);
    }
    *out = list;
    return 0;
}

/* One list request from chunk id from (0: the oldest) for at most limit
 * objects (0: the daemon's default). */
static int client_list_once(shmb_t *c, const char *prefix, size_t limit, uint64_t from,
                            json_t **reply)
{
    json_t *req;

    req = json_pack("{s:s, s:s*}", "op", shmb_ops[SHMB_OP_LIST].name, "prefix",
                    prefix != NULL && prefix[0] != '\0' ? prefix : NULL);
    if (req != NULL &&
        ((limit != 0 &&
          json_object_set_new(req, "limit",
                              json_integer(limit < INT64_MAX ? (json_int_t)limit
                                                             : (json_int_t)INT64_MAX)) != 0) ||
         (from != 0 && json_object_set_new(req, "from", json_integer((json_int_t)from)) != 0))) {
        json_decref(req);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    return client_call(c, req, reply);
}

/* list: the daemon looks at a bounded number of objects per request and
 * says where to go on ("next"); ask again from there until limit objects
 * are listed or the pool has been looked through. */
static int client_list(shmb_t *c, const char *prefix, size_t limit, shmb_list_t **out)
{
    json_t *all = NULL, *reply = NULL;
    size_t want = limit != 0 ? limit : SHMB_LIST_DEFAULT_LIMIT;
    uint64_t from = 0;
    int rc;

    *out = NULL;
    for (;;) {
        json_t *items, *next;
        json_int_t go_on;
        size_t have = all != NULL ? json_array_size(json_object_get(all, "objects")) : 0;

        if ((rc = client_list_once(c, prefix, all != NULL ? want - have : limit, from,
                                   &reply)) < 0)
            break;
        items = json_object_get(reply, "objects");
        next = json_object_get(reply, "next");
        go_on = json_is_integer(next) ? json_integer_value(next) : 0;
        if (all == NULL) {
            all = reply;
        } else {
            if (!json_is_array(items) ||
                json_array_extend(json_object_get(all, "objects"), items) != 0 ||
                json_object_set(all, "truncated", json_object_get(reply, "truncated")) != 0) {
                rc = shmb_error_set(&c->err, -EPROTO,
                                    "shmbrokerd's list reply lacks an array \"objects\".");
                break;
            }
            json_decref(reply);
        }
        reply = NULL;
        if (go_on <= 0 || json_array_size(json_object_get(all, "objects")) >= want)
            break;
        from = (uint64_t)go_on;
    }
    json_decref(reply);
    if (rc == 0)
        rc = client_list_decode(c, all, out);
    json_decref(all);
    return rc;
}

void shmb_list_free(shmb_list_t *list)
{
    shmb_free(list);
}

/* The pools of a clients reply's entries, in a block of their own (the
 * list's block is laid out for shmb_client_info_t, whose size is fixed). */
static int client_clients_pools(shmb_t *c, const json_t *items, shmb_clients_t *list)
{
    enum { POOL_LEN = 33 };
    size_t i, n = list->count;
    const char **ptrs;
    int64_t *own;
    char *names;

    ptrs = shmb_calloc(1, (n ? n : 1) * (sizeof(*ptrs) + POOL_LEN));
    if (ptrs == NULL)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory reading the clients.");
    names = (char *)(ptrs + (n ? n : 1));
    for (i = 0; i < n; i++) {
        ptrs[i] = names + i * POOL_LEN;
        client_copy_string(json_array_get(items, i), "pool", names + i * POOL_LEN, POOL_LEN);
    }
    list->pools = ptrs;
    own = shmb_calloc(n ? n : 1, sizeof(*own));
    if (own == NULL)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory reading the clients.");
    for (i = 0; i < n; i++) {
        const json_t *v = json_object_get(json_array_get(items, i), "own_pid");

        own[i] = json_is_integer(v) && json_integer_value(v) > 0 ? json_integer_value(v) : 0;
    }
    list->own_pids = own;
    return 0;
}

/* Decode a clients reply: one block, every field of every client checked. */
static int client_clients_decode(shmb_t *c, const json_t *reply, shmb_clients_t **out)
{
    shmb_clients_t *list;
    json_t *items;
    char *elems, *texts;
    size_t i;
    int rc;

    list = client_report_block(c, reply, "clients", "name", sizeof(*list),
                               sizeof(*list->clients), &items, &elems, &texts);
    if (list == NULL)
        return c->err.code;
    list->count = json_array_size(items);
    list->clients = (shmb_client_info_t *)elems;
    list->pools = NULL;
    list->own_pids = NULL;
    for (i = 0; i < list->count; i++) {
        const json_t *item = json_array_get(items, i), *self = json_object_get(item, "self");
        shmb_client_info_t *o = &list->clients[i];
        const char *mode = client_string(c, item, "mode");
        uint64_t pid = 0, uid = 0, gid = 0;

        if (mode == NULL || (rc = client_u64(c, item, "pid", &pid)) < 0 ||
            (rc = client_u64(c, item, "uid", &uid)) < 0 ||
            (rc = client_u64(c, item, "gid", &gid)) < 0 ||
            (rc = client_u64(c, item, "pins", &o->pins)) < 0 ||
            (rc = client_u64(c, item, "pending", &o->pending)) < 0 ||
            (rc = client_u64(c, item, "bytes_pinned", &o->bytes_pinned)) < 0 ||
            (rc = client_u64(c, item, "connected_unix", &o->connected_unix)) < 0 ||
            (!json_is_boolean(self) &&
             shmb_error_set(&c->err, -EPROTO,
                            "shmbrokerd's reply lacks a boolean \"self\".") < 0)) {
            shmb_free(list);
            return c->err.code;
        }
        o->pid = (int64_t)pid;
        o->uid = (int64_t)uid;
        o->gid = (int64_t)gid;
        o->self = json_is_true(self);
        snprintf(o->mode, sizeof(o->mode), "%s", mode);
        o->name = client_report_text(item, "name", &texts);
    }
    if (client_clients_pools(c, items, list) < 0) {
        shmb_clients_free(list);
        return c->err.code;
    }
    *out = list;
    return 0;
}

static int client_clients(shmb_t *c, shmb_clients_t **out)
{
    json_t *reply = NULL;
    int rc;

    *out = NULL;
    if ((rc = client_call(c, client_report_request(SHMB_OP_CLIENTS), &reply)) == 0)
        rc = client_clients_decode(c, reply, out);
    json_decref(reply);
    return rc;
}

void shmb_clients_free(shmb_clients_t *clients)
{
    if (clients != NULL) {
        shmb_free((void *)clients->pools);
        shmb_free((void *)clients->own_pids);
    }
    shmb_free(clients);
}

int shmb_stats_sized(shmb_t *c, shmb_stats_t *out, size_t size)
{
    int rc = client_enter(c);

    if (rc < 0) {
        memset(out, 0, size);
        return rc;
    }
    return client_done(c, client_stats(c, out, size));
}

#undef shmb_stats
int shmb_stats(shmb_t *c, shmb_stats_t *out)
{
    return shmb_stats_sized(c, out, CLIENT_STATS_V1_SIZE);
}

int shmb_stats_pools(shmb_t *c, shmb_stats_t **pools, size_t *count)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *pools = NULL;
        *count = 0;
        return rc;
    }
    return client_done(c, client_stats_pools(c, pools, count));
}

void shmb_stats_pools_free(shmb_stats_t *pools)
{
    shmb_free(pools);
}

int shmb_stats_json(shmb_t *c, char **json)
{
    int rc = client_enter(c);

    *json = NULL;
    return rc < 0 ? rc : client_done(c, client_stats_json(c, json));
}

int shmb_list(shmb_t *c, const char *prefix, size_t limit, shmb_list_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_list(c, prefix, limit, out));
}

int shmb_clients(shmb_t *c, shmb_clients_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_clients(c, out));
}

int shmb_request(shmb_t *c, const char *request, char **reply)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *reply = NULL;
        return rc;
    }
    rc = client_request(c, request, reply);
    client_leave(c);
    return rc;
}
