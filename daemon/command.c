/*
 * The op table and its handlers: JSON request in, JSON reply out.
 */
#include "command.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One request on its way through a handler. */
struct command_call {
    struct command_env *env;
    struct command_client *client;
    json_t *req;   /* the request, without "op" and "id" */
    json_t *reply; /* {"ok":true}; handlers add their fields */
    unsigned flags;
    struct shmb_error err;
};

typedef int (*command_handler)(struct command_call *call);

struct command_op {
    const char *name;
    command_handler handler;
    const char *usage; /* the request's shape, quoted in EINVAL messages */
};

uint64_t command_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Unpack the request strictly against fmt; on mismatch, an EINVAL that quotes
 * jansson's reason and the op's usage. */
static int command_unpack(struct command_call *call, const char *op, const char *usage,
                          const char *fmt, ...)
{
    json_error_t jerr;
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = json_vunpack_ex(call->req, &jerr, JSON_STRICT, fmt, ap);
    va_end(ap);
    if (rc != 0)
        return shmb_error_set(&call->err, -EINVAL, "Invalid '%s' request: %s. Expected %s.",
                              op, jerr.text, usage);
    return 0;
}

/* A JSON integer that must lie in [min, max]. */
static int command_check_range(struct command_call *call, const char *field,
                               json_int_t value, json_int_t min, json_int_t max)
{
    if (value < min || value > max)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"%s\" must be between %lld and %lld, not %lld.", field,
                              (long long)min, (long long)max, (long long)value);
    return 0;
}

/* Add a field to the reply; -ENOMEM. */
static int command_set(struct command_call *call, const char *field, json_t *value)
{
    if (value == NULL || json_object_set_new(call->reply, field, value) != 0)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    return 0;
}

static const char hello_usage[] = "{\"op\":\"hello\",\"version\":1,\"name\":STRING?}";
static const char alloc_usage[] =
    "{\"op\":\"alloc\",\"key\":STRING,\"size\":INTEGER,\"readers\":INTEGER?}";
static const char key_usage[] = "{\"op\":OP,\"key\":STRING}";
static const char touch_usage[] = "{\"op\":\"touch\",\"key\":STRING,\"readers\":INTEGER}";
static const char list_usage[] =
    "{\"op\":\"list\",\"prefix\":STRING?,\"limit\":INTEGER?}";
static const char stats_usage[] = "{\"op\":\"stats\"}";

/* hello: check the version, create the client's holder, describe the segment
 * and pass its descriptor. */
static int cmd_hello(struct command_call *call)
{
    const struct segment *seg = call->env->segment;
    const char *name = NULL;
    json_int_t version = 0;
    int rc;

    if ((rc = command_unpack(call, "hello", hello_usage, "{s:I, s?s}", "version", &version,
                             "name", &name)) < 0)
        return rc;
    if (version != SHMB_PROTOCOL_VERSION)
        return shmb_error_set(&call->err, -EPROTO,
                              "Unsupported protocol version %lld; this shmbrokerd speaks "
                              "version %d.", (long long)version, SHMB_PROTOCOL_VERSION);
    if (call->client->said_hello)
        return shmb_error_set(&call->err, -EINVAL,
                              "This connection already said hello; say it once.");
    call->client->holder = store_holder_new(call->env->store);
    if (call->client->holder == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory for a new client.");
    call->client->said_hello = true;
    if (name != NULL)
        snprintf(call->client->name, sizeof(call->client->name), "%s", name);
    call->flags |= COMMAND_SEND_FD;
    if ((rc = command_set(call, "version", json_integer(SHMB_PROTOCOL_VERSION))) < 0 ||
        (rc = command_set(call, "segment", json_string(seg->name))) < 0 ||
        (rc = command_set(call, "size", json_integer((json_int_t)seg->size))) < 0 ||
        (rc = command_set(call, "data_offset",
                          json_integer((json_int_t)seg->hdr->data_offset))) < 0 ||
        (rc = command_set(call, "data_size",
                          json_integer((json_int_t)seg->hdr->data_size))) < 0)
        return rc;
    {
        struct store_stats st;

        store_stats(call->env->store, &st);
        if ((rc = command_set(call, "max_object_size",
                              json_integer((json_int_t)st.max_object_size))) < 0)
            return rc;
    }
    return command_set(call, "alignment", json_integer(SHMB_ALIGN));
}

/* Reply fields offset and size. */
static int command_set_extent(struct command_call *call, const struct store_extent *ext)
{
    int rc;

    if ((rc = command_set(call, "offset", json_integer((json_int_t)ext->offset))) < 0)
        return rc;
    return command_set(call, "size", json_integer((json_int_t)ext->size));
}

static int cmd_alloc(struct command_call *call)
{
    struct store_extent ext;
    const char *key;
    size_t key_len;
    json_int_t size = 0, readers = 0;
    int rc;

    if ((rc = command_unpack(call, "alloc", alloc_usage, "{s:s%, s:I, s?I}", "key", &key,
                             &key_len, "size", &size, "readers", &readers)) < 0 ||
        (rc = command_check_range(call, "size", size, 1, INT64_MAX)) < 0 ||
        (rc = command_check_range(call, "readers", readers, 0, STORE_MAX_READERS)) < 0)
        return rc;
    rc = store_alloc(call->env->store, call->client->holder, key, key_len, (uint64_t)size,
                     (uint32_t)readers, &ext, &call->err);
    if (rc < 0)
        return rc;
    return command_set_extent(call, &ext);
}

/* The key of a request whose only field is "key". */
static int command_key(struct command_call *call, const char *op, const char **key,
                       size_t *key_len)
{
    return command_unpack(call, op, key_usage, "{s:s%}", "key", key, key_len);
}

static int cmd_commit(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "commit", &key, &len)) < 0)
        return rc;
    return store_commit(call->env->store, call->client->holder, key, len, &call->err);
}

static int cmd_abort(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "abort", &key, &len)) < 0)
        return rc;
    return store_abort(call->env->store, call->client->holder, key, len, &call->err);
}

static int cmd_get(struct command_call *call)
{
    struct store_extent ext;
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "get", &key, &len)) < 0 ||
        (rc = store_get(call->env->store, call->client->holder, key, len, &ext,
                        &call->err)) < 0)
        return rc;
    return command_set_extent(call, &ext);
}

static int cmd_release(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "release", &key, &len)) < 0)
        return rc;
    return store_release(call->env->store, call->client->holder, key, len, &call->err);
}

static int cmd_touch(struct command_call *call)
{
    const char *key;
    size_t len;
    json_int_t readers = 0;
    int rc;

    if ((rc = command_unpack(call, "touch", touch_usage, "{s:s%, s:I}", "key", &key, &len,
                             "readers", &readers)) < 0 ||
        (rc = command_check_range(call, "readers", readers, 0, STORE_MAX_READERS)) < 0)
        return rc;
    return store_touch(call->env->store, key, len, (uint32_t)readers, &call->err);
}

static int cmd_delete(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "delete", &key, &len)) < 0)
        return rc;
    return store_delete(call->env->store, key, len, &call->err);
}

static int cmd_contains(struct command_call *call)
{
    const char *key;
    size_t len;
    int rc;

    if ((rc = command_key(call, "contains", &key, &len)) < 0)
        return rc;
    return command_set(call, "exists",
                       json_boolean(store_contains(call->env->store, key, len)));
}

/* list's callback: one JSON object per entry. */
static int command_list_entry(const struct store_entry *e, void *arg)
{
    json_t *objects = arg;
    json_t *item = json_pack("{s:s%, s:I, s:I, s:I, s:I, s:s, s:I}", "key", e->key,
                             e->key_len, "offset", (json_int_t)e->offset, "size",
                             (json_int_t)e->size, "pins", (json_int_t)e->pins, "readers",
                             (json_int_t)e->awaited_reads, "state",
                             store_state_name(e->state), "age_ms", (json_int_t)e->age_ms);

    return item == NULL || json_array_append_new(objects, item) != 0 ? -ENOMEM : 0;
}

static int cmd_list(struct command_call *call)
{
    const char *prefix = "";
    size_t prefix_len = 0, n;
    json_int_t limit = SHMB_LIST_DEFAULT_LIMIT;
    json_t *objects;
    int rc;

    if ((rc = command_unpack(call, "list", list_usage, "{s?s%, s?I}", "prefix", &prefix,
                             &prefix_len, "limit", &limit)) < 0 ||
        (rc = command_check_range(call, "limit", limit, 1, SHMB_LIST_MAX_LIMIT)) < 0)
        return rc;
    objects = json_array();
    if (objects == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    /* Ask for one more than the limit to tell the client whether it saw all. */
    n = store_list(call->env->store, prefix, prefix_len, (size_t)limit + 1,
                   command_list_entry, objects);
    if (json_array_size(objects) != n) {
        json_decref(objects);
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    }
    if (n > (size_t)limit)
        json_array_remove(objects, n - 1);
    if ((rc = command_set(call, "objects", objects)) < 0)
        return rc;
    return command_set(call, "truncated", json_boolean(n > (size_t)limit));
}

static int cmd_stats(struct command_call *call)
{
    struct command_env *env = call->env;
    struct store_stats st;
    uint64_t shm_free = 0;
    json_t *blocker = json_null(), *stats;

    if (command_unpack(call, "stats", stats_usage, "{}") < 0)
        return call->err.code;
    store_stats(env->store, &st);
    segment_check_space(env->shm_dir, 0, &shm_free, NULL);
    if (st.has_blocker)
        blocker = json_pack("{s:s, s:I, s:I, s:s}", "key", st.blocker_key, "pins",
                            (json_int_t)st.blocker_pins, "readers",
                            (json_int_t)st.blocker_readers, "state",
                            store_state_name(st.blocker_state));
    stats = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:I,"
        " s:o, s:{s:I, s:I, s:I, s:I, s:I}}",
        "segment", env->segment->name, "size", (json_int_t)env->segment->size,
        "data_size", (json_int_t)st.data_size, "used", (json_int_t)st.used, "free",
        (json_int_t)st.free, "objects", (json_int_t)st.objects, "pending",
        (json_int_t)st.pending, "pinned", (json_int_t)st.pinned, "clients",
        (json_int_t)env->clients, "max_object_size", (json_int_t)st.max_object_size,
        "uptime_s", (json_int_t)((command_now_ms() - env->started_ms) / 1000), "pid",
        (json_int_t)getpid(), "version", SHMB_VERSION, "shm_dir", env->shm_dir,
        "shm_dir_free", (json_int_t)shm_free, "blocker", blocker, "counters", "allocs",
        (json_int_t)st.allocs, "commits", (json_int_t)st.commits, "gets",
        (json_int_t)st.gets, "evictions", (json_int_t)st.evictions, "enospc",
        (json_int_t)st.enospc);
    if (stats == NULL || json_object_update(call->reply, stats) != 0) {
        json_decref(stats);
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    }
    json_decref(stats);
    return 0;
}

/* The op table: every request's name and handler, in PROTOCOL.md's order. */
static const struct command_op command_ops[] = {
    {"hello", cmd_hello, hello_usage},
    {"alloc", cmd_alloc, alloc_usage},
    {"commit", cmd_commit, key_usage},
    {"abort", cmd_abort, key_usage},
    {"get", cmd_get, key_usage},
    {"release", cmd_release, key_usage},
    {"touch", cmd_touch, touch_usage},
    {"delete", cmd_delete, key_usage},
    {"contains", cmd_contains, key_usage},
    {"list", cmd_list, list_usage},
    {"stats", cmd_stats, stats_usage},
};

/* The entry for op, or NULL. */
static const struct command_op *command_find(const char *op)
{
    size_t i;

    for (i = 0; i < sizeof(command_ops) / sizeof(command_ops[0]); i++)
        if (strcmp(command_ops[i].name, op) == 0)
            return &command_ops[i];
    return NULL;
}

/* Parse the line, check "op" and hello, and run the handler. */
static int command_run(struct command_call *call, const char *line, size_t len,
                       json_t **id)
{
    const struct command_op *op;
    const char *name;
    json_error_t jerr;
    json_t *value;

    call->req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (call->req == NULL)
        return shmb_error_set(&call->err, -EPROTO,
                              "Request is not valid JSON (%s at column %d). Send one JSON "
                              "object per line.", jerr.text, jerr.column);
    if (!json_is_object(call->req))
        return shmb_error_set(&call->err, -EPROTO,
                              "Request is not a JSON object. Send one object per line, "
                              "for example {\"op\":\"stats\"}.");
    *id = json_incref(json_object_get(call->req, "id"));
    json_object_del(call->req, "id");
    value = json_object_get(call->req, "op");
    if (!json_is_string(value))
        return shmb_error_set(&call->err, -EINVAL,
                              "Request has no \"op\" string; for example "
                              "{\"op\":\"stats\"}.");
    name = json_string_value(value);
    op = command_find(name);
    if (op == NULL)
        return shmb_error_set(&call->err, -ENOSYS,
                              "Unknown op '%.64s'. Known ops: hello, alloc, commit, abort, "
                              "get, release, touch, delete, contains, list, stats.", name);
    if (!call->client->said_hello && op->handler != cmd_hello)
        return shmb_error_set(&call->err, -EPROTO,
                              "Say hello first: {\"op\":\"hello\",\"version\":%d}.",
                              SHMB_PROTOCOL_VERSION);
    json_object_del(call->req, "op");
    call->reply = json_pack("{s:b}", "ok", 1);
    if (call->reply == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    return op->handler(call);
}

void command_execute(struct command_env *env, struct command_client *client,
                     const char *line, size_t len, struct command_result *out)
{
    struct command_call call;
    json_t *id = NULL;
    int rc;

    memset(&call, 0, sizeof(call));
    call.env = env;
    call.client = client;
    rc = command_run(&call, line, len, &id);
    out->flags = call.flags;
    if (rc < 0) {
        json_decref(call.reply);
        out->flags &= ~(unsigned)COMMAND_SEND_FD;
        out->reply = shmb_error_reply(id, rc, call.err.message);
    } else {
        out->reply = call.reply;
        if (id != NULL && json_object_set(out->reply, "id", id) != 0) {
            json_decref(out->reply);
            out->reply = NULL;
        }
    }
    json_decref(id);
    json_decref(call.req);
}

void command_oversized(size_t limit, struct command_result *out)
{
    char msg[160];

    snprintf(msg, sizeof(msg),
             "Request line longer than %zu bytes; requests are small JSON objects. "
             "Closing the connection.", limit);
    out->reply = shmb_error_reply(NULL, -EMSGSIZE, msg);
    out->flags = COMMAND_CLOSE;
}

void command_client_close(struct command_env *env, struct command_client *client)
{
    store_holder_free(env->store, client->holder);
    client->holder = NULL;
    client->said_hello = false;
}
