// SPDX-License-Identifier: Apache-2.0
/*
 * The op table: a request line parsed, checked in PROTOCOL.md's order and
 * handed to its family's handler (cmd_objects, cmd_arenas, cmd_queues,
 * cmd_reports), the single entry for every op; hello, batch, and the
 * hand-parsed commit_at of the put's hot path.
 */
#include "command.h"

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "cmd_arenas.h"
#include "cmd_call.h"
#include "cmd_queues.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The pool of a hello that names none: the first this client may use
 * (pools[0], unless its group= leaves the client out), so that a client
 * outside that group still reaches the daemon's reports; pools[0] when it
 * may use none (the hello then fails with pools[0]'s EPERM). */
static struct pool *command_default_pool(const struct command_call *call)
{
    const struct pool_set *set = call->env->pools;
    const struct command_client *cl = call->client;
    unsigned i;

    for (i = 0; i < set->n; i++)
        if (pool_check_access(set->pools[i], cl->uid, cl->gid, cl->groups, cl->n_groups,
                              NULL) == 0)
            return set->pools[i];
    return set->pools[0];
}

/* hello: check the version, create the client's holder, describe the segment
 * and pass its descriptor. */
int cmd_hello(struct command_call *call)
{
    const char *name = NULL, *mode = "rw", *pool_name = NULL;
    const struct segment *seg;
    struct pool *pool;
    json_int_t version = 0, own_pid = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:I, s?s, s?s, s?s, s?I}", "version", &version, "name",
                             &name, "mode", &mode, "pool", &pool_name, "pid", &own_pid)) <
        0)
        return rc;
    if (version != SHMB_PROTOCOL_VERSION)
        return shmb_error_set(&call->err, -EPROTO,
                              "Unsupported protocol version %lld; this shmbrokerd speaks "
                              "version %d.",
                              (long long)version, SHMB_PROTOCOL_VERSION);
    if (call->client->said_hello)
        return shmb_error_set(&call->err, -EINVAL,
                              "This connection already said hello; say it once.");
    /* A client's word, shown beside the kernel's pid 0 for one in another
     * pid namespace; bounded as Linux bounds pids (PID_MAX_LIMIT). */
    if (json_object_get(call->req, "pid") != NULL && (own_pid < 1 || own_pid > 4194304))
        return shmb_error_set(&call->err, -EINVAL,
                              "\"pid\" is the client's own process id, 1 to 4194304, not "
                              "%lld.",
                              (long long)own_pid);
    if (strcmp(mode, "rw") != 0 && strcmp(mode, "ro") != 0)
        return shmb_error_set(
            &call->err, -EINVAL,
            "\"mode\" must be \"rw\" (read-write) or \"ro\" (read-only), "
            "not \"%.32s\".",
            mode);
    pool = command_default_pool(call);
    if (pool_name != NULL && (pool = pool_find(call->env->pools, pool_name)) == NULL) {
        char names[CONFIG_MAX_POOLS * (CONFIG_POOL_NAME_MAX + 2)];

        pool_names(call->env->pools, names, sizeof(names));
        return shmb_error_set(&call->err, -ENOENT,
                              "No pool '%.*s' in this shmbrokerd; its pools are: %s.",
                              CONFIG_POOL_NAME_MAX + 8, pool_name, names);
    }
    if ((rc = pool_check_access(pool, call->client->uid, call->client->gid,
                                call->client->groups, call->client->n_groups,
                                &call->err)) < 0)
        return rc;
    seg = &pool->seg;
    /* The library maps the whole file and checks its header page: refuse a
     * file a client truncated, and undo whatever a read-write client wrote in
     * the header page, before passing the descriptor. */
    if ((rc = segment_restore_header(seg, &call->err)) < 0)
        return rc;
    if ((rc = command_set(call, "version", json_integer(SHMB_PROTOCOL_VERSION))) < 0 ||
        (rc = command_set(call, "segment", json_string(seg->name))) < 0 ||
        (rc = command_set(call, "size", json_integer((json_int_t)seg->size))) < 0 ||
        /* Private values, never the header page: a read-write client can
         * write it, and every later hello would pass its numbers on. */
        (rc = command_set(call, "data_offset",
                          json_integer((json_int_t)seg->data_offset))) < 0 ||
        (rc = command_set(call, "data_size", json_integer((json_int_t)seg->data_size))) <
            0 ||
        /* The catalog of reads in place (PROTOCOL.md section 10). */
        (rc = command_set(call, "catalog_offset",
                          json_integer((json_int_t)seg->catalog_offset))) < 0 ||
        (rc = command_set(call, "catalog_slots",
                          json_integer((json_int_t)seg->catalog_slots))) < 0 ||
        (rc = command_set(call, "catalog_seed", json_integer((json_int_t)seg->catalog_seed))) <
            0 ||
        (rc = command_set(call, "layout", json_integer(SHMB_LAYOUT_VERSION))) < 0 ||
        (rc = command_set(
             call, "max_object_size",
             json_integer((json_int_t)store_max_object_size(pool->store)))) < 0 ||
        (rc = command_set(call, "alignment", json_integer(SHMB_ALIGN))) < 0 ||
        (rc = command_set(call, "mode", json_string(mode))) < 0 ||
        (rc = command_set(call, "pool", json_string(pool->cfg.name))) < 0 ||
        (rc = command_set(call, "backing",
                          json_string(pool_backing_name(pool->cfg.backing)))) < 0)
        return rc;
    /* Last, so that a failure above leaves the client as it was. */
    call->client->holder = store_holder_new(pool->store);
    if (call->client->holder == NULL)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory for a new client.");
    call->client->pool = pool;
    pool->clients++;
    call->client->said_hello = true;
    call->client->own_pid = (pid_t)own_pid;
    call->client->read_only = strcmp(mode, "ro") == 0;
    if (name != NULL) {
        /* Cut on a character boundary: half a character would make every
         * "clients" reply invalid UTF-8, which jansson refuses to write. */
        size_t len = shmb_utf8_cut(name, strlen(name), SHMB_NAME_MAX);

        memcpy(call->client->name, name, len);
        call->client->name[len] = '\0';
    }
    call->flags |= COMMAND_SEND_FD;
    return 0;
}

/* The handlers, one per row of proto/ops.def: cmd_NAME for op NAME. */
static const command_handler command_handlers[SHMB_OP_COUNT] = {
#define SHMB_OP(id, name, flags, usage) [SHMB_OP_##id] = cmd_##name,
#include "../proto/ops.def"
#undef SHMB_OP
};

/* The row of proto/ops.def for the op called name, or NULL. */
static const struct shmb_op_info *command_find(const char *name)
{
    int id = shmb_op_find(name);

    return id < 0 ? NULL : &shmb_ops[id];
}

/* Run one parsed request (an object whose "id" was already taken out). The
 * common checks, in PROTOCOL.md's order, then the op's handler. */
static int command_dispatch(struct command_call *call, json_t *req, bool in_batch)
{
    json_t *name = json_object_get(req, "op"), *noreply = json_object_get(req, "noreply");
    const struct shmb_op_info *op =
        json_is_string(name) ? command_find(json_string_value(name)) : NULL;
    int id = op != NULL ? (int)(op - shmb_ops) : -1;
    char names[320];

    call->req = req;
    call->op = op;
    call->in_batch = in_batch;
    /* "noreply" is honoured before anything can fail, so that a client that
     * pipelines noreply requests never gets a line it does not expect. */
    if (!in_batch && json_is_true(noreply) && op != NULL && (op->flags & SHMB_OPF_NOREPLY))
        call->noreply = true;
    if (!json_is_string(name))
        return shmb_error_set(&call->err, -EINVAL,
                              "Request has no \"op\" string; for example "
                              "{\"op\":\"stats\"}.");
    if (!call->client->said_hello && id != SHMB_OP_HELLO)
        return shmb_error_set(&call->err, -EPROTO,
                              "Say hello first: {\"op\":\"hello\",\"version\":%d}.",
                              SHMB_PROTOCOL_VERSION);
    if (op == NULL)
        return shmb_error_set(&call->err, -ENOSYS, "Unknown op '%.64s'. Known ops: %s.",
                              json_string_value(name),
                              shmb_op_names(names, sizeof(names), 0, ", "));
    if (call->client->read_only && (op->flags & SHMB_OPF_WRITES))
        return shmb_error_set(
            &call->err, -EPERM,
            "This connection is read-only (hello said \"mode\":\"ro\"); "
            "'%s' needs a read-write connection.",
            op->name);
    if (in_batch && !(op->flags & SHMB_OPF_BATCH))
        return shmb_error_set(&call->err, -EINVAL, "'%s' cannot be part of a batch%s",
                              op->name,
                              id == SHMB_OP_HELLO || id == SHMB_OP_BATCH
                                  ? "."
                                  : ": send it on a line of its own (its reply is "
                                    "bounded per request, not per batch).");
    if (noreply != NULL) {
        if (!json_is_boolean(noreply) || !(op->flags & SHMB_OPF_NOREPLY) || in_batch)
            return shmb_error_set(&call->err, -EINVAL,
                                  "\"noreply\" is a boolean for %s outside a batch, not "
                                  "for '%s'.",
                                  shmb_op_names(names, sizeof(names), SHMB_OPF_NOREPLY,
                                                " and "),
                                  op->name);
        call->noreply = json_is_true(noreply);
        json_object_del(req, "noreply");
    }
    if (in_batch && json_object_get(req, "wait_ms") != NULL)
        return shmb_error_set(
            &call->err, -EINVAL,
            "\"wait_ms\" cannot be used inside a batch: a batch never waits.");
    json_object_del(req, "op");
    return command_handlers[id](call);
}

/* batch: run each op of "ops" in order and answer with their replies, on
 * one line. Sub-ops do not wait and always reply. */
int cmd_batch(struct command_call *call)
{
    json_t *ops = NULL, *sub;
    size_t i;
    int rc;

    if ((rc = command_unpack(call, "{s:o}", "ops", &ops)) < 0)
        return rc;
    if (!json_is_array(ops) || json_array_size(ops) > COMMAND_MAX_BATCH)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"ops\" must be an array of at most %d requests.",
                              COMMAND_MAX_BATCH);
    /* The replies are written out one by one; command_finish closes the
     * object after the batch's own "id". */
    if (line_lit(&call->text, "{\"ok\":true,\"replies\":[") < 0)
        goto nomem;
    json_array_foreach(ops, i, sub)
    {
        struct command_call subcall;
        json_t *id;
        int written;

        memset(&subcall, 0, sizeof(subcall));
        subcall.fd = -1;
        subcall.env = call->env;
        subcall.client = call->client;
        if (!json_is_object(sub)) {
            rc = shmb_error_set(&subcall.err, -EINVAL,
                                "Each op of a batch is a JSON object.");
            id = NULL;
        } else {
            id = json_incref(json_object_get(sub, "id"));
            json_object_del(sub, "id");
            rc = command_dispatch(&subcall, sub, true);
        }
        if (rc < 0)
            command_cut_message(subcall.err.message);
        written = i > 0 && line_lit(&call->text, ",") < 0
                      ? -ENOMEM
                      : command_write_reply(&subcall, rc, id, &call->text);
        json_decref(subcall.reply);
        json_decref(id);
        if (written < 0)
            goto nomem;
    }
    if (line_lit(&call->text, "]") < 0)
        goto nomem;
    return 0;

nomem:
    shmb_free(call->text.buf);
    memset(&call->text, 0, sizeof(call->text));
    return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
}

json_t *command_result_json(const struct command_result *res)
{
    if (res->text.len > 0)
        return json_loadb(res->text.buf, res->text.len, JSON_REJECT_DUPLICATES, NULL);
    return NULL;
}

/* A commit_at line as the libraries write it (client/arena.c, the Python
 * package's _commit_at), read by hand. */
struct command_fast_line {
    const char *key;
    size_t key_len;
    json_int_t id, offset, size, readers;
    bool noreply;
};

/* Step *p past the literal lit when the text at *p (before end) starts with
 * it. */
static bool command_fast_lit(const char **p, const char *end, const char *lit)
{
    size_t n = strlen(lit);

    if ((size_t)(end - *p) < n || memcmp(*p, lit, n) != 0)
        return false;
    *p += n;
    return true;
}

/* A JSON number that is a plain decimal integer of at most 18 digits, no
 * sign, no leading zero (any other jansson reads as well, and the parse by
 * hand leaves those to it). A 19th digit is looked at, never added: 19
 * digits may not fit in an int64, and a signed overflow is undefined. */
static bool command_fast_uint(const char **p, const char *end, json_int_t *v)
{
    const char *q = *p;
    json_int_t x = 0;

    while (q < end && *q >= '0' && *q <= '9' && q - *p < 18)
        x = x * 10 + (*q++ - '0');
    if (q == *p || (q < end && *q >= '0' && *q <= '9') || (**p == '0' && q - *p > 1))
        return false;
    *p = q;
    *v = x;
    return true;
}

/* Whether line is exactly
 * {"op":"commit_at","id":N,"key":"K","offset":N,"size":N,"readers":N}
 * (with ,"noreply":true before the brace or not), the key printable ASCII
 * without a quote or a backslash: the line every put through an arena
 * sends. Such a line means to jansson exactly what is read here; any other
 * (escapes, other bytes, spaces, another order, more fields, numbers of
 * another form) takes the general path, which gives what it always gave. */
static bool command_fast_parse(const char *line, size_t len, struct command_fast_line *f)
{
    const char *p = line, *end = line + len;

    if (!command_fast_lit(&p, end, "{\"op\":\"commit_at\",\"id\":") ||
        !command_fast_uint(&p, end, &f->id) || !command_fast_lit(&p, end, ",\"key\":\""))
        return false;
    f->key = p;
    while (p < end && *p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\')
        p++;
    f->key_len = (size_t)(p - f->key);
    f->noreply = false;
    if (f->key_len == 0 || !command_fast_lit(&p, end, "\",\"offset\":") ||
        !command_fast_uint(&p, end, &f->offset) ||
        !command_fast_lit(&p, end, ",\"size\":") ||
        !command_fast_uint(&p, end, &f->size) ||
        !command_fast_lit(&p, end, ",\"readers\":") ||
        !command_fast_uint(&p, end, &f->readers))
        return false;
    if (command_fast_lit(&p, end, ",\"noreply\":true"))
        f->noreply = true;
    return command_fast_lit(&p, end, "}") && p == end;
}

/* Serve line by hand when it is a commit_at of the usual form from a
 * client that may send it (said hello, read-write): the put's hottest
 * request, which through jansson spent most of the daemon's instructions
 * building and freeing a tree. false: the caller takes the general path,
 * which says what is wrong, if anything. */
static bool command_fast_execute(struct command_env *env, struct command_client *client,
                                 const char *line, size_t len, struct command_result *out)
{
    struct command_fast_line f;
    struct command_call call;
    json_t *id;
    int rc;

    if (!client->said_hello || client->read_only || client->pool == NULL ||
        !command_fast_parse(line, len, &f) || (id = json_integer(f.id)) == NULL)
        return false;
    memset(&call, 0, sizeof(call));
    call.fd = -1;
    call.env = env;
    call.client = client;
    call.op = &shmb_ops[SHMB_OP_COMMIT_AT];
    call.id = id;
    call.noreply = f.noreply;
    rc = command_commit_at(&call, f.key, f.key_len, f.offset, f.size, f.readers);
    command_finish(&call, rc, id, out);
    json_decref(id);
    return true;
}

void command_execute(struct command_env *env, struct command_client *client,
                     const char *line, size_t len, struct command_result *out)
{
    struct command_call call;
    json_error_t jerr;
    json_t *req, *id = NULL;
    int rc;

    /* Whatever it asks, it sees every chunk published before it. */
    if (client->pool != NULL)
        store_fold_published(client->pool->store, NULL, false);
    if (command_fast_execute(env, client, line, len, out))
        return;
    memset(&call, 0, sizeof(call));
    call.fd = -1;
    call.env = env;
    call.client = client;
    req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL)
        rc = shmb_error_set(&call.err, -EPROTO,
                            "Request is not valid JSON (%s at column %d). Send one JSON "
                            "object per line.",
                            jerr.text, jerr.column);
    else if (!json_is_object(req))
        rc = shmb_error_set(&call.err, -EPROTO,
                            "Request is not a JSON object. Send one object per line, for "
                            "example {\"op\":\"stats\"}.");
    else {
        id = json_incref(json_object_get(req, "id"));
        json_object_del(req, "id");
        call.id = id;
        rc = command_dispatch(&call, req, false);
    }
    command_finish(&call, rc, id, out);
    json_decref(id);
    json_decref(req);
}

void command_retry(struct command_env *env, struct command_client *client,
                   json_t *wait_request, uint64_t wait_until_ms, bool final,
                   struct command_result *out)
{
    struct command_call call;
    json_t *req = json_deep_copy(wait_request), *id = NULL;
    int rc;

    memset(&call, 0, sizeof(call));
    call.fd = -1;
    call.env = env;
    call.client = client;
    call.final_try = final;
    call.wait_until_ms = wait_until_ms;
    if (client->pool != NULL)
        store_fold_published(client->pool->store, NULL, false);
    if (req == NULL) {
        rc = shmb_error_set(&call.err, -ENOMEM, "Out of memory retrying an alloc.");
    } else {
        id = json_incref(json_object_get(req, "id"));
        json_object_del(req, "id");
        rc = command_dispatch(&call, req, false);
    }
    command_finish(&call, rc, id, out);
    json_decref(id);
    json_decref(req);
}

uint64_t command_room_generation(const struct command_env *env)
{
    uint64_t sum = 0;
    unsigned i;

    for (i = 0; i < env->pools->n; i++)
        sum += store_room_generation(env->pools->pools[i]->store);
    return sum;
}

uint64_t command_room_wake_ms(const struct command_env *env)
{
    uint64_t soonest = UINT64_MAX;
    unsigned i;

    for (i = 0; i < env->pools->n; i++) {
        uint64_t t = store_lease_wake_ms(env->pools->pools[i]->store);

        if (t < soonest)
            soonest = t;
    }
    return soonest;
}

void command_oversized(size_t limit, struct command_result *out)
{
    char msg[160];
    json_t *reply;

    snprintf(msg, sizeof(msg),
             "Request line longer than %zu bytes; requests are small JSON objects. "
             "Closing the connection.",
             limit);
    reply = shmb_error_reply(NULL, -EMSGSIZE, msg);

    memset(out, 0, sizeof(*out));
    out->flags = COMMAND_CLOSE;
    if (reply == NULL || shmb_json_append(&out->text, reply) < 0) {
        shmb_free(out->text.buf);
        memset(&out->text, 0, sizeof(out->text));
    }
    json_decref(reply);
}

void command_env_init(struct command_env *env)
{
    memset(env, 0, sizeof(*env));
    TAILQ_INIT(&env->client_list);
    queue_set_init(&env->queues, CONFIG_DEFAULT_NAME);
    env->next_client_id = 1;
}

void command_client_open(struct command_env *env, struct command_client *client)
{
    memset(&client->lost, 0, sizeof(client->lost));
    client->connected_unix = (uint64_t)time(NULL);
    client->id = env->next_client_id++;
    TAILQ_INSERT_HEAD(&env->client_list, client, link);
    client->listed = true;
    env->clients++;
}

void command_client_close(struct command_env *env, struct command_client *client)
{
    /* Its seats die and its writer roles go at once: the writer stops
     * waiting for a reader that is gone, readers see the end. */
    queue_owner_gone(&env->queues, client);
    if (client->work != NULL) {
        /* Nobody to answer: the queue is made or freed all the same. */
        queue_waiter_cancel(&client->work->waiter);
        json_decref(client->work->id);
        shmb_free(client->work);
        client->work = NULL;
    }
    if (client->pool != NULL) {
        /* What it published before it went is kept. */
        store_fold_published(client->pool->store, client->holder, true);
        store_holder_free(client->pool->store, client->holder);
        client->pool->clients--;
        client->pool = NULL;
    }
    client->holder = NULL;
    client->said_hello = false;
    if (!client->listed)
        return; /* not registered, or closed already */
    TAILQ_REMOVE(&env->client_list, client, link);
    client->listed = false;
    env->clients--;
}
