// SPDX-License-Identifier: Apache-2.0
/*
 * The queue ops' handlers and the queue requests that wait for pages.
 */
#include "cmd_queues.h"

#include "../proto/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

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

static int command_queue_reply(struct command_call *call, const struct queue *q,
                               bool created);

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
int cmd_queue_create(struct command_call *call)
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
int cmd_queue_open(struct command_call *call)
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
int cmd_queue_close(struct command_call *call)
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
int cmd_queue_shutdown(struct command_call *call)
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
int cmd_queue_delete(struct command_call *call)
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
json_t *command_queues_json(const struct command_call *call, bool seats)
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
int cmd_queue_list(struct command_call *call)
{
    int seats = 0;

    if (command_unpack(call, "{s?b}", "seats", &seats) < 0)
        return call->err.code;
    return command_set(call, "queues", command_queues_json(call, seats != 0));
}
