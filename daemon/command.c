// SPDX-License-Identifier: Apache-2.0
/*
 * The op table and its handlers: JSON request in, JSON reply out.
 */
#include "command.h"

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "host.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One request on its way through a handler. */
struct command_call {
    struct command_env *env;
    struct command_client *client;
    const struct shmb_op_info *op; /* its row of proto/ops.def, once known */
    json_t *req;   /* the request, without "op" and "id" */
    json_t *reply; /* {"ok":true} once a handler adds a field, else NULL */
    unsigned flags;
    bool noreply;           /* the request said "noreply": true */
    bool has_extent;        /* the success reply carries offset and size */
    struct store_extent extent;
    struct line text;       /* a batch's reply, written out, left open for "id" */
    int fd;                 /* COMMAND_SEND_FD: a queue's descriptor, -1: the segment's */
    json_t *id;             /* the request's "id" (borrowed), NULL when none */
    bool in_batch;          /* an op of a batch, which never waits */
    bool soft_wait;         /* it waits without having asked (command_wait_commits) */
    bool final_try;         /* a waiting alloc's last chance */
    uint64_t wait_until_ms; /* a waiting alloc's deadline, 0 before it waits */
    const char *key;        /* a commit_at's key once read (not NUL-terminated) */
    size_t key_len;
    struct shmb_error err;
};

typedef int (*command_handler)(struct command_call *call);

/* Unpack the request strictly against fmt; on mismatch, an EINVAL that quotes
 * jansson's reason and the op's usage. */
static int command_unpack(struct command_call *call, const char *fmt, ...)
{
    json_error_t jerr;
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = json_vunpack_ex(call->req, &jerr, JSON_STRICT, fmt, ap);
    va_end(ap);
    if (rc != 0)
        return shmb_error_set(&call->err, -EINVAL,
                              "Invalid '%s' request: %s. Expected %s.", call->op->name,
                              jerr.text, call->op->usage);
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

/* The reply object {"ok":true,...}, created when a handler first adds to
 * it (the common replies never need it); NULL when memory ran out. */
static json_t *command_reply_object(struct command_call *call)
{
    if (call->reply == NULL)
        call->reply = json_pack("{s:b}", "ok", 1);
    return call->reply;
}

/* Add a field to the reply; -ENOMEM. */
static int command_set(struct command_call *call, const char *field, json_t *value)
{
    if (command_reply_object(call) == NULL) {
        json_decref(value);
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    }
    if (value == NULL || json_object_set_new(call->reply, field, value) != 0)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    return 0;
}

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
static int cmd_hello(struct command_call *call)
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

/* EDQUOT when this client already holds as many of something as it may. */
static int command_check_cap(struct command_call *call, uint64_t held, uint64_t cap,
                             const char *cap_name, const char *what)
{
    if (cap != 0 && held >= cap)
        return shmb_error_set(
            &call->err, -EDQUOT,
            "%s (%llu) reached: this connection holds %llu %s. %s first, "
            "or raise --%s.",
            cap_name, (unsigned long long)cap, (unsigned long long)held, what,
            strcmp(cap_name, "max-pins") == 0 ? "Release some" : "Commit or abort some",
            cap_name);
    return 0;
}

/* Reply fields offset and size. */
static int command_set_extent(struct command_call *call, const struct store_extent *ext)
{
    /* Kept aside: the reply is written straight out when nothing else is in
     * it (command_reply_text). */
    call->has_extent = true;
    call->extent = *ext;
    return 0;
}

/* How long an alloc or arena request that did not ask to wait waits
 * anyway when its room is held only by an arena whose client's commits are
 * on their way (store_commits_due): they are handled within microseconds,
 * unless that client stopped between its copy and its send. */
#define COMMAND_COMMIT_WAIT_MS 100

/* An alloc or arena request refused with rc: -EINPROGRESS (wait, and be
 * retried, until COMMAND_COMMIT_WAIT_MS) when rc is -ENOSPC and the room is
 * held by commits on their way, else rc. So that such a request does not
 * fail in the moment between a client's copy into its arena and the
 * daemon's handling of its commit_at. */
static int command_wait_commits(struct command_call *call, int rc)
{
    if (rc != -ENOSPC || call->in_batch || call->final_try ||
        !store_commits_due(call->client->pool->store))
        return rc;
    if (call->wait_until_ms == 0)
        call->wait_until_ms = clock_now_ms() + COMMAND_COMMIT_WAIT_MS;
    store_retract_enospc(call->client->pool->store);
    call->soft_wait = true;
    return -EINPROGRESS;
}

static int cmd_alloc(struct command_call *call)
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

/* Keys are 1 to SHMB_KEY_MAX bytes, whatever the op. */
static int command_check_key(struct command_call *call, size_t key_len)
{
    return shmb_key_len_check(key_len, &call->err);
}

/* The key of a request whose only field is "key". */
static int command_key(struct command_call *call, const char **key,
                       size_t *key_len)
{
    int rc = command_unpack(call, "{s:s%}", "key", key, key_len);

    return rc < 0 ? rc : command_check_key(call, *key_len);
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

static int cmd_commit(struct command_call *call)
{
    return command_key_op(call, store_commit);
}

static int cmd_abort(struct command_call *call)
{
    return command_key_op(call, store_abort);
}

static int cmd_get(struct command_call *call)
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

static int cmd_release(struct command_call *call)
{
    return command_key_op(call, store_release);
}

static int cmd_touch(struct command_call *call)
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

static int cmd_delete(struct command_call *call)
{
    return command_key_op(call, command_store_delete);
}

static int cmd_contains(struct command_call *call)
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
static int cmd_list(struct command_call *call)
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

/* Whether the asking connection may use pool: the reports show the names
 * of what a pool holds (its keys, queues, clients' names) only to the peers
 * its group= admits, and their figures to everyone. */
static bool command_may_see(const struct command_call *call, const struct pool *pool)
{
    const struct command_client *cl = call->client;

    return pool == NULL || pool_check_access(pool, cl->uid, cl->gid, cl->groups,
                                             cl->n_groups, NULL) == 0;
}

/* A name for a report: null when hidden (command_may_see). A new
 * reference, NULL when memory ran out. */
static json_t *command_name(const char *name, bool hide)
{
    return hide ? json_null() : json_string(name);
}

/* What a pool's part of a stats reply is made of, gathered once. */
struct command_stats {
    const struct command_env *env;
    const struct pool *pool;
    struct store_stats st;
    uint64_t shm_free;
    uint64_t clients; /* connections counted in this object */
    bool hide;        /* the blocker's key is not the asker's to see */
};

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
    case SHMB_STAT_DATA_SIZE: n = st->data_size; break;
    case SHMB_STAT_USED: n = st->used; break;
    case SHMB_STAT_FREE: n = st->free; break;
    case SHMB_STAT_OBJECTS: n = st->objects; break;
    case SHMB_STAT_PENDING: n = st->pending; break;
    case SHMB_STAT_PINNED: n = st->pinned; break;
    case SHMB_STAT_CLIENTS: n = cs->clients; break;
    case SHMB_STAT_MAX_OBJECT_SIZE: n = st->max_object_size; break;
    case SHMB_STAT_UPTIME_S: n = (clock_now_ms() - cs->env->started_ms) / 1000; break;
    case SHMB_STAT_PID: n = (uint64_t)getpid(); break;
    case SHMB_STAT_SHM_DIR_FREE: n = cs->shm_free; break;
    case SHMB_STAT_ALLOCS: n = st->allocs; break;
    case SHMB_STAT_COMMITS: n = st->commits; break;
    case SHMB_STAT_GETS: n = st->gets; break;
    case SHMB_STAT_EVICTIONS: n = st->evictions; break;
    case SHMB_STAT_ENOSPC: n = st->enospc; break;
    case SHMB_STAT_EXPIRED_ALLOCS: n = st->expired_allocs; break;
    case SHMB_STAT_LEASE_EXPIRIES: n = st->lease_expiries; break;
    case SHMB_STAT_NOREPLY_ERRORS: n = cs->env->noreply_errors; break;
    case SHMB_STAT_FAST_READS: n = st->fast_reads; break;
    case SHMB_STAT_COUNT: break;
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

static json_t *command_queues_json(const struct command_call *call, bool seats);

/* stats: every pool in "pools", each looked at once (the host's memory
 * read once for all memfd pools); the connection's pool's fields again at
 * the top level, with every connection in "clients"; the queues as
 * queue_list shows them. */
static int cmd_stats(struct command_call *call)
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
static int cmd_clients(struct command_call *call)
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

/* The queue called name in this client's pool: -ENOENT listing the pool's
 * queues when there is none. */
static int command_queue(struct command_call *call, const char *name, size_t len,
                         struct queue **out)
{
    char names[QUEUE_MAX * (QUEUE_NAME_MAX + 2) + 8];
    int rc;

    if ((rc = shmb_q_name_check(name, len, &call->err)) < 0)
        return rc;
    *out = queue_find(&call->env->queues, call->client->pool, name);
    if (*out != NULL)
        return 0;
    queue_names(&call->env->queues, call->client->pool, names, sizeof(names));
    return shmb_error_set(&call->err, -ENOENT,
                          "No queue '%s' in pool '%s'; its queues are: %s. Create it "
                          "first (queue_create).",
                          name, call->client->pool->cfg.name, names);
}

/* A member as queue.c keeps it: this client. */
static void command_member(const struct command_client *cl, struct queue_member *who)
{
    memset(who, 0, sizeof(*who));
    who->client = cl->id;
    who->pid = cl->pid;
    who->own_pid = cl->own_pid;
    who->uid = cl->uid;
    who->holder = cl->holder;
    snprintf(who->name, sizeof(who->name), "%s", cl->name);
}

/* A request waiting for a queue's pages (COMMAND_WORK). */
struct command_work {
    struct queue_waiter waiter; /* first: the waiter's answer finds the work */
    struct command_env *env;
    struct command_client *client;
    json_t *id;   /* the request's "id", owned; NULL when none */
    int op;       /* SHMB_OP_QUEUE_CREATE or SHMB_OP_QUEUE_DELETE */
    bool created; /* queue_create: this request made the queue */
};

static int command_queue_reply(struct command_call *call, const struct queue *q,
                               bool created);
static void command_finish(struct command_call *call, int rc, json_t *id,
                           struct command_result *out);

/* The answer to a waiting queue request: its reply, handed to the
 * connection through env->work_done. */
static void command_work_answer(struct queue_waiter *waiter, int rc,
                                const struct shmb_error *err, const struct queue *q)
{
    struct command_work *w = (struct command_work *)waiter;
    struct command_result res;
    struct command_call call;

    memset(&call, 0, sizeof(call));
    call.fd = -1;
    call.env = w->env;
    call.client = w->client;
    call.op = &shmb_ops[w->op];
    if (rc < 0)
        call.err = *err;
    else if (w->op == SHMB_OP_QUEUE_CREATE)
        rc = command_queue_reply(&call, q, w->created);
    command_finish(&call, rc, w->id, &res);
    w->client->work = NULL;
    json_decref(w->id);
    shmb_free(w);
    call.env->work_done(call.env, call.client, &res);
}

/* A waiter for call's queue request when the connection can wait (the
 * env has work_done), else NULL (also when memory runs out: the request is
 * then served within the call). */
static struct command_work *command_work_new(struct command_call *call, int op)
{
    struct command_work *w;

    if (call->env->work_done == NULL || (w = shmb_calloc(1, sizeof(*w))) == NULL)
        return NULL;
    w->waiter.done = command_work_answer;
    w->env = call->env;
    w->client = call->client;
    w->op = op;
    return w;
}

/* rc from a queue call given w: -EINPROGRESS parks the request (w waits,
 * the client's connection with it); otherwise w is not needed. */
static int command_work_park(struct command_call *call, struct command_work *w, int rc)
{
    if (rc != -EINPROGRESS) {
        shmb_free(w);
        return rc;
    }
    w->id = json_incref(call->id);
    call->client->work = w;
    call->flags |= COMMAND_WORK;
    return 0;
}

/* The reply to a queue_create: the queue as it is. */
static int command_queue_reply(struct command_call *call, const struct queue *q,
                               bool created)
{
    int rc;

    if ((rc = command_set(call, "name", json_string(q->name))) < 0 ||
        (rc = command_set(call, "pool", json_string(q->pool->cfg.name))) < 0 ||
        (rc = command_set(call, "seats", json_integer(q->seats))) < 0 ||
        (rc = command_set(call, "slots", json_integer((json_int_t)q->slots))) < 0 ||
        (rc = command_set(call, "slot_size", json_integer((json_int_t)q->slot_size))) < 0 ||
        (rc = command_set(call, "size", json_integer((json_int_t)q->size))) < 0 ||
        (rc = command_set(call, "temporary", json_boolean(q->temporary))) < 0)
        return rc;
    return command_set(call, "created", json_boolean(created));
}

/* queue_create: make the queue in this client's pool, or find the same; a
 * new queue's pages are made off the loop while the request waits. */
static int cmd_queue_create(struct command_call *call)
{
    const char *name;
    size_t len;
    json_int_t seats = 0, slots = QUEUE_DEFAULT_SLOTS, slot_size = QUEUE_DEFAULT_SLOT_SIZE;
    int temporary = 0, rc;
    bool created;
    struct command_work *w;
    struct queue *q;

    if ((rc = command_unpack(call, "{s:s%, s:I, s?I, s?I, s?b}", "name", &name, &len,
                             "seats", &seats, "slots", &slots, "slot_size", &slot_size,
                             "temporary", &temporary)) < 0 ||
        (rc = shmb_q_name_check(name, len, &call->err)) < 0 ||
        (rc = command_check_range(call, "seats", seats, 1, SHMB_QUEUE_SEATS_MAX)) < 0 ||
        (rc = command_check_range(call, "slots", slots, SHMB_QUEUE_SLOTS_MIN,
                                  SHMB_QUEUE_SLOTS_MAX)) < 0 ||
        (rc = command_check_range(call, "slot_size", slot_size, SHMB_QUEUE_SLOT_SIZE_MIN,
                                  (json_int_t)SHMB_QUEUE_SLOT_SIZE_MAX)) < 0)
        return rc;
    w = command_work_new(call, SHMB_OP_QUEUE_CREATE);
    rc = queue_create(&call->env->queues, call->client->pool, name, (uint32_t)seats,
                      (uint64_t)slots, (uint64_t)slot_size, temporary != 0,
                      w != NULL ? &w->waiter : NULL, &q, &created, &call->err);
    if (w != NULL)
        w->created = created;
    if (rc == -EINPROGRESS || rc < 0)
        return command_work_park(call, w, rc);
    shmb_free(w);
    return command_queue_reply(call, q, created);
}

/* queue_open: take the writer role or a reader seat, and pass the queue's
 * descriptor with the reply. */
static int cmd_queue_open(struct command_call *call)
{
    const char *name, *role;
    size_t len;
    json_int_t seat = -1;
    char what[QUEUE_NAME_MAX + 16];
    struct queue_member who;
    struct queue *q;
    uint32_t taken = 0;
    uint64_t epoch = 0;
    unsigned roles;
    bool writer;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s:s, s?I}", "name", &name, &len, "role", &role,
                             "seat", &seat)) < 0)
        return rc;
    if (strcmp(role, "writer") != 0 && strcmp(role, "reader") != 0)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"role\" must be \"writer\" or \"reader\", not \"%.32s\".", role);
    writer = role[0] == 'w';
    if (writer && json_object_get(call->req, "seat") != NULL)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"seat\" is for readers; the writer has none. Leave it out.");
    if (json_object_get(call->req, "seat") != NULL &&
        (rc = command_check_range(call, "seat", seat, 0, SHMB_QUEUE_SEATS_MAX - 1)) < 0)
        return rc;
    if ((rc = command_queue(call, name, len, &q)) < 0)
        return rc;
    if ((roles = queue_roles_of(&call->env->queues, call->client)) >= QUEUE_MAX_ROLES)
        return shmb_error_set(&call->err, -EMFILE,
                              "This connection holds %u queue roles, the most one may "
                              "(%d). Close some (queue_close), or open more connections.",
                              roles, QUEUE_MAX_ROLES);
    /* The reply passes a duplicate of the queue's descriptor, and a new
     * client still needs one: refuse here, holding no role, rather than
     * fail to pass it. */
    snprintf(what, sizeof(what), "open queue '%s'", q->name);
    if ((rc = queue_check_fds(2, what, &call->err)) < 0)
        return rc;
    command_member(call->client, &who);
    /* A member may have scribbled the header: the new one attaches to a
     * sound one. */
    queue_restore_header(q);
    rc = writer ? queue_open_writer(q, call->client, &who, &call->err)
                : queue_open_reader(q, (int)seat, call->client, &who, &taken, &epoch,
                                    &call->err);
    if (rc < 0)
        return rc;
    if (writer)
        epoch = q->writer_epoch;
    if ((rc = command_set(call, "name", json_string(q->name))) < 0 ||
        (rc = command_set(call, "pool", json_string(q->pool->cfg.name))) < 0 ||
        (rc = command_set(call, "role", json_string(role))) < 0 ||
        (rc = command_set(call, "seat", json_integer(writer ? -1 : (json_int_t)taken))) < 0 ||
        (rc = command_set(call, "epoch", json_integer((json_int_t)epoch))) < 0 ||
        (rc = command_set(call, "seats", json_integer(q->seats))) < 0 ||
        (rc = command_set(call, "slots", json_integer((json_int_t)q->slots))) < 0 ||
        (rc = command_set(call, "slot_size", json_integer((json_int_t)q->slot_size))) < 0 ||
        (rc = command_set(call, "size", json_integer((json_int_t)q->size))) < 0) {
        /* No reply, no role: the client would not know it holds one. */
        unsigned closed;

        queue_close_roles(&call->env->queues, q, call->client,
                          writer ? QUEUE_ROLE_WRITER : QUEUE_ROLE_READER,
                          writer ? -1 : (int)taken, &closed, NULL);
        return rc;
    }
    call->flags |= COMMAND_SEND_FD;
    call->fd = q->fd;
    return 0;
}

/* queue_close: leave roles this connection holds on a queue. */
static int cmd_queue_close(struct command_call *call)
{
    const char *name, *role = NULL;
    size_t len;
    json_int_t seat = -1;
    enum queue_role which = QUEUE_ROLE_ANY;
    bool has_seat;
    struct queue *q;
    unsigned closed = 0;
    int rc;

    if ((rc = command_unpack(call, "{s:s%, s?s, s?I}", "name", &name, &len, "role", &role,
                             "seat", &seat)) < 0)
        return rc;
    has_seat = json_object_get(call->req, "seat") != NULL;
    if (role != NULL && strcmp(role, "writer") != 0 && strcmp(role, "reader") != 0)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"role\" must be \"writer\" or \"reader\", not \"%.32s\".", role);
    if (role != NULL)
        which = role[0] == 'w' ? QUEUE_ROLE_WRITER : QUEUE_ROLE_READER;
    if (has_seat && which == QUEUE_ROLE_WRITER)
        return shmb_error_set(&call->err, -EINVAL,
                              "\"seat\" is for readers; the writer has none. Leave it out.");
    if (has_seat) {
        which = QUEUE_ROLE_READER;
        if ((rc = command_check_range(call, "seat", seat, 0, SHMB_QUEUE_SEATS_MAX - 1)) < 0)
            return rc;
    }
    if ((rc = command_queue(call, name, len, &q)) < 0 ||
        (rc = queue_close_roles(&call->env->queues, q, call->client, which, (int)seat,
                                &closed, &call->err)) < 0)
        return rc;
    return command_set(call, "closed", json_integer(closed));
}

/* The queue a request whose only field is "name" names. */
static int command_queue_arg(struct command_call *call, struct queue **q)
{
    const char *name;
    size_t len;
    int rc = command_unpack(call, "{s:s%}", "name", &name, &len);

    return rc < 0 ? rc : command_queue(call, name, len, q);
}

/* queue_shutdown: end every member's wait with ECANCELED; idempotent. */
static int cmd_queue_shutdown(struct command_call *call)
{
    struct queue *q;
    int rc;

    if ((rc = command_queue_arg(call, &q)) < 0)
        return rc;
    queue_shutdown(&call->env->queues, q);
    return 0;
}

/* queue_delete: a queue nobody holds goes now; the reply waits until its
 * memory is freed (off the loop). */
static int cmd_queue_delete(struct command_call *call)
{
    struct command_work *w;
    struct queue *q;
    int rc;

    if ((rc = command_queue_arg(call, &q)) < 0)
        return rc;
    w = command_work_new(call, SHMB_OP_QUEUE_DELETE);
    rc = queue_delete(&call->env->queues, q, w != NULL ? &w->waiter : NULL, &call->err);
    return command_work_park(call, w, rc);
}

/* {"client","pid","name"} of a member; the name null when hidden. */
static json_t *command_member_json(const struct queue_member *who, bool hide)
{
    return json_pack("{s:I, s:I, s:o}", "client", (json_int_t)who->client, "pid",
                     (json_int_t)who->pid, "name", command_name(who->name, hide));
}

/* q's seat_list: one entry per seat, with its holder (named unless hide)
 * and how far behind it is; a new reference, NULL when memory ran out. */
static json_t *command_seats_json(const struct queue *q, const struct queue_status *st,
                                  bool hide)
{
    static const char *const seat_state[] = {"free", "live", "dead"};
    json_t *seats = json_array();
    uint32_t s;

    if (seats == NULL)
        return NULL;
    for (s = 0; s < q->seats; s++) {
        const struct queue_seat *seat = &q->seat[s];
        bool who = seat->state != SHMB_SEAT_FREE;

        if (json_array_append_new(
                seats,
                json_pack("{s:I, s:s, s:o, s:o, s:o, s:I}", "seat", (json_int_t)s, "state",
                          seat_state[seat->state <= 2 ? seat->state : 0], "client",
                          who ? json_integer((json_int_t)seat->who.client) : json_null(),
                          "pid", who ? json_integer((json_int_t)seat->who.pid) : json_null(),
                          "name", who ? command_name(seat->who.name, hide) : json_null(),
                          "behind", (json_int_t)st->behind[s])) != 0) {
            json_decref(seats);
            return NULL;
        }
    }
    return seats;
}

/* One queue as queue_list and stats show it: its summary, whose size does
 * not grow with its seats, and with seats its seat_list. hide: the names
 * (the queue's, its members') are null, the figures stay. A new reference,
 * NULL when memory ran out. */
static json_t *command_queue_json(const struct queue *q, bool seats, bool hide)
{
    struct queue_status st;
    json_t *obj, *blocker = NULL;

    queue_status(q, &st);
    obj = json_pack("{s:o, s:s, s:I, s:I, s:I, s:I, s:b, s:s, s:I, s:I, s:I, s:I, s:I, "
                    "s:o, s:b, s:I}",
                    "name", command_name(q->name, hide), "pool", q->pool->cfg.name, "seats",
                    (json_int_t)q->seats, "slots", (json_int_t)q->slots, "slot_size",
                    (json_int_t)q->slot_size, "size", (json_int_t)q->size, "temporary",
                    q->temporary, "state", st.state, "messages", (json_int_t)st.messages,
                    "depth", (json_int_t)st.depth, "seats_live", (json_int_t)st.live,
                    "seats_dead", (json_int_t)st.dead, "seats_free", (json_int_t)st.free,
                    "writer",
                    q->writer != NULL ? command_member_json(&q->writer_who, hide)
                                      : json_null(),
                    "writer_waiting", st.writer_waiting, "readers_waiting",
                    (json_int_t)st.readers_waiting);
    if (obj == NULL)
        return NULL;
    if (st.blocker >= 0) {
        const struct queue_seat *b = &q->seat[st.blocker];

        blocker = json_pack("{s:I, s:I, s:I, s:o, s:I}", "seat", (json_int_t)st.blocker,
                            "client", (json_int_t)b->who.client, "pid", (json_int_t)b->who.pid,
                            "name", command_name(b->who.name, hide), "behind",
                            (json_int_t)st.behind[st.blocker]);
        if (blocker == NULL)
            goto fail;
    }
    if (json_object_set_new(obj, "blocker", blocker != NULL ? blocker : json_null()) != 0 ||
        (seats && json_object_set_new(obj, "seat_list", command_seats_json(q, &st, hide)) != 0))
        goto fail;
    return obj;

fail:
    json_decref(obj);
    return NULL;
}

/* Every queue of every pool, in creation order, as call's peer may see
 * them (with their seats when seats); a new reference, NULL when memory
 * ran out. */
static json_t *command_queues_json(const struct command_call *call, bool seats)
{
    const struct queue *q;
    json_t *list = json_array();

    if (list == NULL)
        return NULL;
    TAILQ_FOREACH(q, &call->env->queues.list, link)
        if (json_array_append_new(list, command_queue_json(q, seats,
                                                           !command_may_see(call, q->pool))) !=
            0) {
            json_decref(list);
            return NULL;
        }
    return list;
}

/* queue_list: every queue of every pool; with "seats":true, each seat. */
static int cmd_queue_list(struct command_call *call)
{
    int seats = 0;

    if (command_unpack(call, "{s?b}", "seats", &seats) < 0)
        return call->err.code;
    return command_set(call, "queues", command_queues_json(call, seats != 0));
}

/* read: an awaited read a read-only client did in place (it cannot count
 * it in the chunk's seal): one fewer awaited read of that generation. */
static int cmd_read(struct command_call *call)
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
static int cmd_arena(struct command_call *call)
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
static int command_commit_at(struct command_call *call, const char *key, size_t len,
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
static int cmd_commit_at(struct command_call *call)
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

static int cmd_batch(struct command_call *call);

/* The handlers, one per row of proto/ops.def: cmd_NAME for op NAME. */
static const command_handler command_handlers[SHMB_OP_COUNT] = {
#define SHMB_OP(id, name, flags, usage) [SHMB_OP_##id] = cmd_##name,
#include "../proto/ops.def"
#undef SHMB_OP
};

/* Log an error nobody will read in a reply, at most once a second. */
static void log_noreply(const struct command_call *call, int rc)
{
    struct queue_member who;
    char pid[96];
    static uint64_t last_ms;
    uint64_t now = clock_now_ms();

    if (now - last_ms < 1000 && last_ms != 0)
        return;
    last_ms = now;
    command_member(call->client, &who);
    log_warn("client %s: a noreply request failed (%s: %s); %llu such errors so far",
             queue_member_pid(&who, pid, sizeof(pid)), shmb_error_name(rc), call->err.message,
             (unsigned long long)call->env->noreply_errors);
}

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

/* The reply of a finished call: call->reply, or an error reply; "id" added. */
static json_t *command_reply(struct command_call *call, int rc, json_t *id)
{
    json_t *reply;

    if (rc < 0)
        return shmb_error_reply(id, rc, call->err.message);
    if (command_reply_object(call) == NULL)
        return NULL;
    reply = call->reply;
    call->reply = NULL;
    if ((call->has_extent &&
         (json_object_set_new(reply, "offset", json_integer((json_int_t)call->extent.offset)) !=
              0 ||
          json_object_set_new(reply, "size", json_integer((json_int_t)call->extent.size)) !=
              0)) ||
        (id != NULL && json_object_set(reply, "id", id) != 0)) {
        json_decref(reply);
        return NULL;
    }
    return reply;
}

/* An "id" the fast path writes by hand: a non-negative integer, which is what
 * the client library sends (jansson writes any other id). */
static bool command_plain_id(const json_t *id)
{
    return json_is_integer(id) && json_integer_value(id) >= 0;
}

/* The common success replies, written straight into l without jansson:
 * {"ok":true} and {"ok":true,"offset":N,"size":M}, each with an integer
 * "id" when the request had one. 1 when written, 0 when the reply has other
 * fields or another kind of "id" (jansson writes those), -ENOMEM. */
static int command_reply_text(const struct command_call *call, int rc, const json_t *id,
                              struct line *l)
{
    if (rc < 0 || call->reply != NULL || (id != NULL && !command_plain_id(id)))
        return 0;
    if (line_lit(l, "{\"ok\":true") < 0 ||
        (call->has_extent &&
         (line_lit(l, ",\"offset\":") < 0 || line_u64(l, call->extent.offset) < 0 ||
          line_lit(l, ",\"size\":") < 0 || line_u64(l, call->extent.size) < 0)) ||
        (id != NULL && (line_lit(l, ",\"id\":") < 0 ||
                        line_u64(l, (uint64_t)json_integer_value(id)) < 0)) ||
        line_lit(l, "}") < 0)
        return -ENOMEM;
    return 1;
}

/* Write the reply of a finished call into l: the common replies by hand
 * (command_reply_text), any other, or a common one the hand could not finish
 * for want of memory, through jansson. -ENOMEM. */
static int command_write_reply(struct command_call *call, int rc, json_t *id,
                               struct line *l)
{
    size_t start = l->len;
    int written = command_reply_text(call, rc, id, l);
    json_t *reply;

    if (written > 0)
        return 0;
    l->len = start;
    reply = command_reply(call, rc, id);
    written = reply != NULL ? shmb_json_append(l, reply) : -ENOMEM;
    json_decref(reply);
    return written;
}

/* Cut a batch op's error message so that, written as JSON (a control byte
 * takes six bytes, a quote or backslash two), it takes at most
 * COMMAND_BATCH_MESSAGE_MAX bytes; a cut message ends in "...". */
static void command_cut_message(char *msg)
{
    size_t n = strlen(msg), i, cost = 0, keep = 0;

    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)msg[i];

        cost += c < 0x20 ? 6 : c == '"' || c == '\\' ? 2 : 1;
        if (cost <= COMMAND_BATCH_MESSAGE_MAX - 3)
            keep = i + 1;
    }
    if (cost <= COMMAND_BATCH_MESSAGE_MAX)
        return;
    keep = shmb_utf8_cut(msg, n, keep);
    memcpy(msg + keep, "...", 4);
}

/* batch: run each op of "ops" in order and answer with their replies, on
 * one line. Sub-ops do not wait and always reply. */
static int cmd_batch(struct command_call *call)
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

/* An alloc that waits for space: out keeps the request (its "op" and "id"
 * put back) for command_retry. Without memory for it, the wait is dropped and
 * out has no reply: the connection closes as when any reply fails. */
static void command_park(struct command_call *call, json_t *id, struct command_result *out)
{
    json_t *req = json_deep_copy(call->req);

    if (req == NULL || json_object_set_new(req, "op", json_string(call->op->name)) != 0 ||
        (id != NULL && json_object_set(req, "id", id) != 0)) {
        json_decref(req);
        return;
    }
    out->flags |= COMMAND_WAIT | (call->soft_wait ? COMMAND_WAIT_SOFT : 0u);
    out->wait_request = req;
    out->wait_until_ms = call->wait_until_ms;
}

/* A noreply commit_at was refused: remember it (the first one's key and
 * error, and how many) for the connection's next reply, so that a writer
 * that put without waiting learns which put was lost. */
static void command_note_lost(struct command_call *call, int rc)
{
    struct command_lost *lost = &call->client->lost;
    json_t *key = call->key == NULL ? json_object_get(call->req, "key") : NULL;

    if (lost->count++ > 0)
        return;
    lost->code = rc;
    lost->key_len = 0;
    if (call->key != NULL && call->key_len <= sizeof(lost->key)) {
        lost->key_len = call->key_len;
        memcpy(lost->key, call->key, lost->key_len);
    } else if (json_is_string(key) && json_string_length(key) <= sizeof(lost->key)) {
        lost->key_len = json_string_length(key);
        memcpy(lost->key, json_string_value(key), lost->key_len);
    }
    snprintf(lost->message, sizeof(lost->message), "%s", call->err.message);
}

/* Add the refused noreply commit_at of the connection (command_note_lost)
 * to the reply in text, as its last field "lost", and forget them. Without
 * memory for it, the reply goes without, and they are told with the next. */
static void command_tell_lost(struct command_client *client, struct line *text)
{
    struct command_lost *lost = &client->lost;
    json_t *obj;
    size_t len = text->len;

    if (lost->count == 0 || len == 0 || text->buf[len - 1] != '}')
        return;
    obj = json_pack("{s:I, s:s%, s:s, s:s}", "count", (json_int_t)lost->count, "key",
                    lost->key, lost->key_len, "error", shmb_error_name(lost->code), "message",
                    lost->message);
    if (obj == NULL) /* a message cut inside a character is not UTF-8 */
        obj = json_pack("{s:I, s:s%, s:s, s:s}", "count", (json_int_t)lost->count, "key",
                        lost->key, lost->key_len, "error", shmb_error_name(lost->code),
                        "message", "");
    text->len--; /* the reply's closing brace */
    if (obj == NULL || line_lit(text, ",\"lost\":") < 0 || shmb_json_append(text, obj) < 0 ||
        line_lit(text, "}") < 0) {
        text->len = len;
        text->buf[len - 1] = '}';
    } else {
        lost->count = 0;
    }
    json_decref(obj);
}

/* A noreply request: nothing is sent; a failure is counted and logged, and
 * a refused commit_at is told with the next reply. */
static void command_silence(struct command_call *call, int rc, struct command_result *out)
{
    if (rc < 0) {
        call->env->noreply_errors++;
        log_noreply(call, rc);
        if (call->op != NULL && call->op == &shmb_ops[SHMB_OP_COMMIT_AT])
            command_note_lost(call, rc);
    }
    out->flags |= COMMAND_SILENT;
}

/* Close a reply the handler wrote out (batch, list): the request's "id",
 * then the object's brace. -ENOMEM. */
static int command_close_text(struct line *text, const json_t *id)
{
    if (id != NULL && (line_lit(text, ",\"id\":") < 0 ||
                       (command_plain_id(id) ? line_u64(text, (uint64_t)json_integer_value(id))
                                             : shmb_json_append(text, id)) < 0))
        return -ENOMEM;
    return line_lit(text, "}");
}

/* Turn a finished call into out, in exactly one of four forms: a wait (an
 * alloc that waits for space), nothing (noreply), the handler's written-out
 * text closed with the "id" (batch, list), or the reply as text when it is
 * a common one (command_reply_text), else as JSON. Frees what the call
 * built. */
static void command_finish(struct command_call *call, int rc, json_t *id,
                           struct command_result *out)
{
    memset(out, 0, sizeof(*out));
    out->flags = call->flags;
    out->fd = call->fd;
    if (call->flags & COMMAND_WORK)
        out->flags = COMMAND_WORK; /* answered later: command_work_answer */
    else if (rc == -EINPROGRESS)
        command_park(call, id, out);
    else if (call->noreply)
        command_silence(call, rc, out);
    else if (rc == 0 && call->text.buf != NULL) {
        out->text = call->text;
        memset(&call->text, 0, sizeof(call->text));
        if (command_close_text(&out->text, id) < 0) {
            shmb_free(out->text.buf);
            memset(&out->text, 0, sizeof(out->text));
        }
    } else if (command_write_reply(call, rc, id, &out->text) < 0) {
        shmb_free(out->text.buf);
        memset(&out->text, 0, sizeof(out->text));
    }
    if (out->text.len > 0)
        command_tell_lost(call->client, &out->text);
    if (rc < 0)
        out->flags &= ~(unsigned)COMMAND_SEND_FD;
    json_decref(call->reply);
    call->reply = NULL;
    shmb_free(call->text.buf);
    memset(&call->text, 0, sizeof(call->text));
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
