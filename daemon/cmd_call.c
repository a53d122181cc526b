// SPDX-License-Identifier: Apache-2.0
/*
 * One request on its way: its fields read and checked, its reply built and
 * turned into a result; the lost commit_at told with the next reply.
 */
#include "cmd_call.h"

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Unpack the request strictly against fmt; on mismatch, an EINVAL that quotes
 * jansson's reason and the op's usage. */
int command_unpack(struct command_call *call, const char *fmt, ...)
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
int command_check_range(struct command_call *call, const char *field,
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
json_t *command_reply_object(struct command_call *call)
{
    if (call->reply == NULL)
        call->reply = json_pack("{s:b}", "ok", 1);
    return call->reply;
}

/* Add a field to the reply; -ENOMEM. */
int command_set(struct command_call *call, const char *field, json_t *value)
{
    if (command_reply_object(call) == NULL) {
        json_decref(value);
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    }
    if (value == NULL || json_object_set_new(call->reply, field, value) != 0)
        return shmb_error_set(&call->err, -ENOMEM, "Out of memory building the reply.");
    return 0;
}

/* EDQUOT when this client already holds as many of something as it may. */
int command_check_cap(struct command_call *call, uint64_t held, uint64_t cap,
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
int command_set_extent(struct command_call *call, const struct store_extent *ext)
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
int command_wait_commits(struct command_call *call, int rc)
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

/* Keys are 1 to SHMB_KEY_MAX bytes, whatever the op. */
int command_check_key(struct command_call *call, size_t key_len)
{
    return shmb_key_len_check(key_len, &call->err);
}

/* The key of a request whose only field is "key". */
int command_key(struct command_call *call, const char **key, size_t *key_len)
{
    int rc = command_unpack(call, "{s:s%}", "key", key, key_len);

    return rc < 0 ? rc : command_check_key(call, *key_len);
}

/* Whether the asking connection may use pool: the reports show the names
 * of what a pool holds (its keys, queues, clients' names) only to the peers
 * its group= admits, and their figures to everyone. */
bool command_may_see(const struct command_call *call, const struct pool *pool)
{
    const struct command_client *cl = call->client;

    return pool == NULL || pool_check_access(pool, cl->uid, cl->gid, cl->groups,
                                             cl->n_groups, NULL) == 0;
}

/* A name for a report: null when hidden (command_may_see). A new
 * reference, NULL when memory ran out. */
json_t *command_name(const char *name, bool hide)
{
    return hide ? json_null() : json_string(name);
}

/* A member as queue.c keeps it: this client. */
void command_member(const struct command_client *cl, struct queue_member *who)
{
    memset(who, 0, sizeof(*who));
    who->client = cl->id;
    who->pid = cl->pid;
    who->own_pid = cl->own_pid;
    who->uid = cl->uid;
    who->holder = cl->holder;
    snprintf(who->name, sizeof(who->name), "%s", cl->name);
}

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
int command_write_reply(struct command_call *call, int rc, json_t *id,
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
void command_cut_message(char *msg)
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

/* The chunks the connection published that a fold refused (the store
 * records them) join its refused noreply commit_at, told the same way:
 * counted among noreply errors and logged. */
static void command_take_refused(struct command_call *call)
{
    struct command_lost *lost = &call->client->lost;
    struct store_refused r;
    static uint64_t last_ms;
    uint64_t now;

    if (call->client->pool == NULL || !store_holder_refused(call->client->holder, &r))
        return;
    call->env->noreply_errors += r.count;
    if (lost->count == 0) {
        lost->code = r.code;
        lost->key_len = r.key_len;
        memcpy(lost->key, r.key, r.key_len);
        snprintf(lost->message, sizeof(lost->message), "%s", r.message);
    }
    lost->count += r.count;
    now = clock_now_ms();
    if (now - last_ms >= 1000 || last_ms == 0) {
        last_ms = now;
        log_warn("client %llu: %llu published chunk(s) refused (%s: %s); %llu noreply "
                 "errors so far",
                 (unsigned long long)call->client->id, (unsigned long long)r.count,
                 shmb_error_name(r.code), r.message,
                 (unsigned long long)call->env->noreply_errors);
    }
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
void command_finish(struct command_call *call, int rc, json_t *id,
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
    if (out->text.len > 0) {
        command_take_refused(call);
        command_tell_lost(call->client, &out->text);
    }
    if (rc < 0)
        out->flags &= ~(unsigned)COMMAND_SEND_FD;
    json_decref(call->reply);
    call->reply = NULL;
    shmb_free(call->text.buf);
    memset(&call->text, 0, sizeof(call->text));
}
