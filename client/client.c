// SPDX-License-Identifier: Apache-2.0
/*
 * The client library's call machinery: the handle and its guards (fork,
 * threads), sending a request and matching its reply, the checks every
 * call makes before it sends. Connecting and mapping the segment are
 * connect.c's; the calls themselves live by subject in objects.c, many.c
 * and report.c; nothing here knows them.
 */
#include "internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/layout.h"
#include "../proto/sock.h"
#include "../proto/text.h"

/* A handle's forks field before it ever connected: no process owns it yet. */
#define CLIENT_NEVER_CONNECTED ULONG_MAX

/* How many fork()s made this process, counted in the child by a
 * pthread_atfork handler: a handle connected at another count was connected
 * by an ancestor, whose socket the child shares. A load per call, where
 * getpid() would be a system call. Queue handles compare it too. */
atomic_ulong client_forks;

/* A call this thread made that was refused without touching its handle
 * (used after fork(), or while another thread's call ran on it): the
 * handle's shmb_errcode, shmb_errname and shmb_errmsg report it in this
 * thread until this thread's next call on a handle. The handle's own error
 * may be another thread's, being written. */
static _Thread_local struct {
    const shmb_t *handle;
    int code;
    char message[400];
} client_refusal;

/* Refuse a call on c without touching c; returns code. */
static int client_refuse(const shmb_t *c, int code, const char *fmt, ...)
                         __attribute__((format(printf, 3, 4)));
static int client_refuse(const shmb_t *c, int code, const char *fmt, ...)
{
    va_list ap;

    client_refusal.handle = c;
    client_refusal.code = code;
    va_start(ap, fmt);
    vsnprintf(client_refusal.message, sizeof(client_refusal.message), fmt, ap);
    va_end(ap);
    return code;
}

/* The start of every call that uses the connection or the handle's buffers:
 * refuse it in a process that did not connect the handle (a child of
 * fork() shares the parent's socket, and the two would take each other's
 * replies), and while another call runs on the handle (another thread's: a
 * handle serves one call at a time). Nothing is sent and the handle is not
 * touched then. An atomic exchange and two loads: nothing next to a round
 * trip. */
int client_enter(shmb_t *c)
{
    unsigned long forks = atomic_load_explicit(&c->forks, memory_order_relaxed);

    if (forks != CLIENT_NEVER_CONNECTED &&
        forks != atomic_load_explicit(&client_forks, memory_order_relaxed))
        return client_refuse(
            c, -ECHILD,
            "This handle was connected by process %d and is used in process %d, made by "
            "fork() since: the connection belongs to the parent, and sharing it would "
            "mix the two processes' replies. Nothing was sent. In the child, shmb_close "
            "this handle (the parent's connection is left alone) and connect a new "
            "handle (shmb_new, shmb_connect).",
            atomic_load_explicit(&c->pid, memory_order_relaxed), (int)getpid());
    if (atomic_exchange_explicit(&c->busy, true, memory_order_acquire))
        return client_refuse(
            c, -EBUSY,
            "Another call is running on this handle (in another thread); nothing was "
            "sent. A handle serves one call at a time: use one handle per thread.");
    if (client_refusal.handle != NULL)
        client_refusal.handle = NULL;
    return 0;
}

/* The end of a call client_enter let in. */
void client_leave(shmb_t *c)
{
    atomic_store_explicit(&c->busy, false, memory_order_release);
}

/* The end of a call client_enter let in, passing its result on. */
int client_done(shmb_t *c, int rc)
{
    client_leave(c);
    return rc;
}

shmb_t *shmb_new(void)
{
    shmb_t *c = shmb_calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->sock = -1;
    c->seg_fd = -1;
    c->populate = 1;
    c->arena_want = SHMB_ARENA_DEFAULT;
    c->read_wait_us = SHMB_READ_WAIT_DEFAULT;
    atomic_init(&c->forks, CLIENT_NEVER_CONNECTED);
    atomic_init(&c->pid, 0);
    atomic_init(&c->busy, false);
    if (client_refusal.handle == c) /* a refusal of a handle freed since */
        client_refusal.handle = NULL;
    return c;
}

void shmb_set_populate(shmb_t *c, int populate)
{
    c->populate = populate;
}

void shmb_set_read_only(shmb_t *c, int read_only)
{
    c->read_only = read_only;
}

void shmb_set_pool(shmb_t *c, const char *pool)
{
    size_t len = pool != NULL ? strlen(pool) : 0;

    c->pool_too_long = len >= sizeof(c->pool);
    snprintf(c->pool, sizeof(c->pool), "%s", c->pool_too_long || pool == NULL ? "" : pool);
}

void shmb_set_alloc_wait(shmb_t *c, unsigned wait_ms)
{
    c->alloc_wait_ms = wait_ms;
}

int shmb_errcode(const shmb_t *c)
{
    return client_refusal.handle == c ? client_refusal.code : c->err.code;
}

const char *shmb_errname(const shmb_t *c)
{
    return shmb_error_any_name(shmb_errcode(c));
}

const char *shmb_errmsg(const shmb_t *c)
{
    return client_refusal.handle == c ? client_refusal.message : c->err.message;
}

const char *shmb_strerror(int code)
{
    return shmb_error_any_name(code);
}

const shmb_info_t *shmb_info(const shmb_t *c)
{
    return c->map != NULL ? &c->info : NULL;
}

/* Forget the connection (and the mapping too, unless keep_map). */
void client_disconnect(shmb_t *c, bool keep_map)
{
    if (c->sock >= 0) {
        client_unconfirmed_lost(c);
        close(c->sock);
    }
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    c->sock = c->seg_fd = -1;
    c->rlen = 0;
    if (keep_map)
        return;
    if (c->map != NULL)
        munmap(c->map, c->map_size);
    c->map = NULL;
    c->map_size = 0;
}

void shmb_close(shmb_t *c)
{
    if (c == NULL)
        return;
    if (client_refusal.handle == c)
        client_refusal.handle = NULL;
    client_disconnect(c, false);
    shmb_free(c->rbuf);
    shmb_free(c->w.buf);
    shmb_free(c);
}

void client_replied(shmb_t *c)
{
    c->noreply_sent = false;
    c->unconfirmed.count = 0;
}

void client_unconfirmed_lost(shmb_t *c)
{
    uint64_t n = c->unconfirmed.count;

    if (n == 0)
        return;
    c->unconfirmed.count = 0;
    if (c->lost.count == 0) {
        c->lost.code = -ECONNRESET;
        memcpy(c->lost.key, c->unconfirmed.key, sizeof(c->lost.key));
        snprintf(c->lost.message, sizeof(c->lost.message),
                 "the connection ended before shmbrokerd answered a later request");
    }
    c->lost.count += n;
}

/* " (the first of 'KEY'), ..." for client_lost's message when puts sent
 * without waiting were unconfirmed, else "". */
static const char *client_unconfirmed_text(const shmb_t *c, char *buf, size_t len)
{
    char key[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];

    if (c->unconfirmed.count == 0)
        return "";
    snprintf(
        buf, len,
        " %llu put(s) sent without waiting (the first of '%s') since the last "
        "answered call may not have been made: the next shmb_put or shmb_put_nowait "
        "after shmb_reconnect reports them (-ECANCELED).",
        (unsigned long long)c->unconfirmed.count,
        shmb_escape(c->unconfirmed.key, strlen(c->unconfirmed.key), key, sizeof(key)));
    return buf;
}

/* The connection broke: say so, and close the socket (the mapping stays
 * until shmb_close, so pointers already handed out remain readable). */
int client_lost(shmb_t *c, const char *what, int saved)
{
    char buf[SHMB_ESCAPED_MAX(SHMB_KEY_MAX) + 256];
    const char *unconfirmed = client_unconfirmed_text(c, buf, sizeof(buf));

    client_unconfirmed_lost(c);
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
    c->rlen = 0;
    return shmb_error_set(
        &c->err, -ECONNRESET,
        "Connection to shmbrokerd lost (%s: %s); every pin and pending "
        "allocation of this handle was released. Call shmb_reconnect to "
        "go on: committed objects and the mapping stay.%s",
        what, saved ? strerror(saved) : "closed by the daemon", unconfirmed);
}

/* Receive until the buffer holds one whole line; returns its length (without
 * the '\n'), which the caller consumes with client_consume. */
int client_read_line(shmb_t *c, size_t *line_len)
{
    for (;;) {
        char *nl = c->rlen ? memchr(c->rbuf, '\n', c->rlen) : NULL;
        ssize_t n;

        if (nl != NULL) {
            *line_len = (size_t)(nl - c->rbuf);
            return 0;
        }
        if (c->rlen >= SHMB_MAX_REPLY)
            return shmb_error_set(&c->err, -EMSGSIZE,
                                  "Reply from shmbrokerd longer than %d bytes.",
                                  SHMB_MAX_REPLY);
        if (c->rcap - c->rlen < 4096) {
            size_t cap = c->rcap ? c->rcap * 2 : 16384;
            char *grown = shmb_realloc(c->rbuf, cap);

            if (grown == NULL)
                return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a reply.");
            c->rbuf = grown;
            c->rcap = cap;
        }
        /* The segment's descriptor comes with the hello reply; any other
         * descriptor is closed there. */
        n = shmb_sock_recv_fd(c->sock, c->rbuf + c->rlen, c->rcap - c->rlen, &c->seg_fd);
        if (n <= 0)
            return client_lost(c, "receive", n < 0 ? (int)-n : 0);
        c->rlen += (size_t)n;
    }
}

/* Drop the first line (and its '\n') from the receive buffer. */
void client_consume(shmb_t *c, size_t line_len)
{
    memmove(c->rbuf, c->rbuf + line_len + 1, c->rlen - line_len - 1);
    c->rlen -= line_len + 1;
}

/* Send the bytes of c->w. */
int client_send(shmb_t *c)
{
    size_t off = 0;

    while (off < c->w.len) {
        ssize_t n = send(c->sock, c->w.buf + off, c->w.len - off, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return client_lost(c, "send", errno);
        off += (size_t)n;
    }
    return 0;
}

/* The "id" of the next request: a per-handle counter, never 0 and never
 * reused, even across reconnects, so that a late reply cannot match. */
uint64_t client_next_id(shmb_t *c)
{
    return ++c->last_id;
}

/* An id as text for a message: id_json when not NULL, else the integer id;
 * "none" when has is false. */
const char *client_id_text(const json_t *id_json, uint64_t id, bool has, char *buf,
                           size_t len)
{
    char *dumped;

    if (!has)
        return "none";
    if (id_json == NULL) {
        snprintf(buf, len, "%llu", (unsigned long long)id);
        return buf;
    }
    dumped = json_dumps(id_json, JSON_COMPACT | JSON_ENCODE_ANY);
    shmb_escape(dumped != NULL ? dumped : "?", dumped != NULL ? strlen(dumped) : 1, buf,
                len);
    free(dumped);
    return buf;
}

/* The reply at the head of the buffer (len bytes) does not answer the
 * request just sent: its "id" is another's, or it has none (the daemon
 * answers a line it cannot parse without one, even one that said noreply).
 * Taking it would hand one call's reply to another, say another object's
 * offset to an alloc. So the connection is reset, as a disconnect does. */
int client_out_of_step(shmb_t *c, const char *want, const char *got, size_t len)
{
    char seen[256];
    bool noreply = c->noreply_sent;

    shmb_escape(c->rbuf, len < 160 ? len : 160, seen, sizeof(seen));
    client_unconfirmed_lost(c);
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
    c->rlen = 0;
    c->noreply_sent = false;
    return shmb_error_set(&c->err, -ECONNRESET,
                          "Reply out of step with its request: expected id %s, got id %s "
                          "(%s%s)%s. The connection was reset so that no call takes "
                          "another's reply: every pin and pending allocation of this "
                          "handle was released. Call shmb_reconnect to go on.",
                          want, got, seen, len > 160 ? "..." : "",
                          noreply ? "; requests sent without waiting for their reply "
                                    "(shmb_release_nowait, shmb_release_many, "
                                    "shmb_put_nowait, shmb_read's count on a read-only "
                                    "handle) were outstanding"
                                  : "");
}

void client_note_lost(shmb_t *c, size_t len, json_t *reply)
{
    json_t *line = NULL, *lost;
    const char *key = NULL, *code = NULL, *message = NULL;
    json_int_t count = 0;

    /* Rare, so looked for in the text first; an error reply's object is
     * gone by now, so the line is read again. */
    if (memmem(c->rbuf, len, "\"lost\":{", 8) == NULL)
        return;
    if (reply == NULL)
        reply = line = json_loadb(c->rbuf, len, 0, NULL);
    lost = json_object_get(reply, "lost");
    if (json_unpack(lost, "{s:I, s:s, s:s, s:s}", "count", &count, "key", &key, "error",
                    &code, "message", &message) == 0 &&
        count > 0) {
        if (c->lost.count == 0) {
            c->lost.code = shmb_error_from_name(code);
            snprintf(c->lost.key, sizeof(c->lost.key), "%s", key);
            snprintf(c->lost.message, sizeof(c->lost.message), "%s", message);
        }
        c->lost.count += (uint64_t)count;
    }
    json_object_del(reply, "lost");
    json_decref(line);
}

/* Whether got (a reply's "id", may be NULL) answers the request whose id is
 * want (a caller's own id, in shmb_request) or, when want is NULL, id. */
static bool client_id_matches(const json_t *got, const json_t *want, uint64_t id)
{
    if (got == NULL)
        return false;
    if (want != NULL)
        return json_equal(got, want);
    return json_is_integer(got) && json_integer_value(got) >= 0 &&
           (uint64_t)json_integer_value(got) == id;
}

/* Decode the reply line (len bytes) at the head of the buffer after checking
 * that it answers the request (want or id, as client_id_matches). first: the
 * connection's first request (hello), which a refusal at connect time answers
 * without an id (nothing else was sent, so nothing can be confused). 0 with
 * *reply owned by the caller (when reply is not NULL), the reply's error, or
 * -ECONNRESET when the reply is out of step. */
int client_decode(shmb_t *c, size_t len, const json_t *want, uint64_t id, bool first,
                  json_t **reply)
{
    json_t *value = NULL, *got = NULL;
    int rc = shmb_parse_reply_id(c->rbuf, len, &value, &got, &c->err);

    if (!client_id_matches(got, want, id) && !(first && got == NULL && rc < 0)) {
        char wbuf[96], gbuf[96];

        rc = client_out_of_step(c, client_id_text(want, id, true, wbuf, sizeof(wbuf)),
                                client_id_text(got, 0, got != NULL, gbuf, sizeof(gbuf)),
                                len);
        json_decref(value);
        json_decref(got);
        return rc;
    }
    json_decref(got);
    client_note_lost(c, len, value);
    client_consume(c, len);
    client_replied(c);
    if (reply != NULL)
        *reply = value;
    else
        json_decref(value);
    return rc;
}

/* Send request (the library keeps no reference) and wait for its reply:
 * 0 with *reply owned by the caller (when reply is not NULL), or the error.
 * The request gets the next id unless it has its own; the reply must carry
 * it. first as in client_decode. */
int client_call_ex(shmb_t *c, json_t *request, bool first, json_t **reply)
{
    json_t *want = NULL;
    uint64_t id = 0;
    size_t len = 0;
    int rc;

    shmb_error_clear(&c->err);
    if (reply != NULL)
        *reply = NULL;
    c->w.len = 0;
    if (request == NULL)
        return shmb_error_set(&c->err, -EINVAL,
                              "Cannot build the request: its text (a client name given to "
                              "shmb_connect, a key) must be valid UTF-8.");
    if (c->sock < 0) {
        json_decref(request);
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    }
    want = json_incref(json_object_get(request, "id"));
    if (want == NULL && (id = client_next_id(c),
                         json_object_set_new(request, "id", json_integer((json_int_t)id)) != 0))
        rc = -ENOMEM;
    else
        rc = shmb_json_append_line(&c->w, request);
    json_decref(request);
    if (rc < 0) {
        json_decref(want);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    if ((rc = client_send(c)) == 0 && (rc = client_read_line(c, &len)) == 0)
        rc = client_decode(c, len, want, id, first, reply);
    json_decref(want);
    return rc;
}

int client_call(shmb_t *c, json_t *request, json_t **reply)
{
    return client_call_ex(c, request, false, reply);
}

/* The public header states the key length for itself (it includes nothing
 * of proto/); it must be the protocol's. */
_Static_assert(SHMB_KEY_MAX_LEN == SHMB_KEY_MAX,
               "shmbroker.h's SHMB_KEY_MAX_LEN differs from proto/layout.h's SHMB_KEY_MAX");

/* Each op's flags as constants, so that what the library assumes of an op
 * is checked against proto/ops.def when it compiles. */
enum client_op_flags {
#define SHMB_OP(id, name, flags, usage) CLIENT_OPF_##id = (flags),
#include "../proto/ops.def"
#undef SHMB_OP
};
_Static_assert(CLIENT_OPF_RELEASE & SHMB_OPF_NOREPLY,
               "shmb_release_nowait and shmb_release_many send release with noreply");
_Static_assert((CLIENT_OPF_ALLOC & CLIENT_OPF_COMMIT & CLIENT_OPF_ABORT & CLIENT_OPF_GET &
                SHMB_OPF_BATCH) != 0,
               "shmb_put_many and shmb_get_many batch alloc, commit, abort and get");

/* Check a key before anything goes on the wire: the same check, code and
 * words as the daemon's (proto/text.c), for every call that takes a key.
 * The checked key, and its length, in *out. */
int client_check_key(shmb_t *c, const char *key, struct client_key *out)
{
    size_t len = 0;

    out->s = key;
    /* The common key is short ASCII, which is UTF-8 as it is: one pass
     * finds that and its length, and only the length rule is left. Anything
     * else gets the whole check. */
    if (key != NULL) {
        while (key[len] != '\0' && (unsigned char)key[len] < 0x80)
            len++;
        out->len = len;
        if (key[len] == '\0')
            return shmb_key_len_check(len, &c->err);
        len += strlen(key + len);
    }
    out->len = len;
    return shmb_key_check(key, len, &c->err);
}

/* Check the n keys of a _many call; the message names the first bad one's
 * index. */
int client_check_keys(shmb_t *c, size_t n, const char *const *keys)
{
    size_t i;

    for (i = 0; i < n; i++) {
        struct client_key k;

        if (client_check_key(c, keys[i], &k) < 0) {
            char why[SHMB_ERROR_MSG_MAX];

            snprintf(why, sizeof(why), "%s", c->err.message);
            return shmb_error_set(&c->err, -EINVAL,
                                  "keys[%zu] of %zu: %s Nothing was sent.", i, n, why);
        }
    }
    return 0;
}

/* Refuse an object size the protocol cannot carry (its integers are signed
 * 64-bit: 2^63 bytes or more would reach the daemon as a JSON error), with
 * E2BIG and the daemon's words, before anything is sent. */
int client_check_size(shmb_t *c, size_t size)
{
    if ((uint64_t)size <= (uint64_t)INT64_MAX)
        return 0;
    return shmb_error_set(&c->err, -E2BIG,
                          "Object size (%llu bytes) exceeds max object size (%llu bytes).",
                          (unsigned long long)size,
                          (unsigned long long)(c->info.max_object_size != 0
                                                   ? c->info.max_object_size
                                                   : (uint64_t)INT64_MAX));
}

/* Copy a string field of a reply into a fixed buffer, "" when absent or
 * not a string. */
void client_copy_string(const json_t *obj, const char *field, char *dst, size_t len)
{
    const char *s = json_string_value(json_object_get(obj, field));

    snprintf(dst, len, "%s", s != NULL ? s : "");
}

/* Read an unsigned integer field of a reply. */
int client_u64(shmb_t *c, const json_t *obj, const char *field, uint64_t *out)
{
    json_t *v = json_object_get(obj, field);

    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks a non-negative integer \"%s\".",
                              field);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}
/* The fields of a success reply decoded by jansson (the slow path). */
void client_reply_fields(const json_t *reply, struct line_reply *r)
{
    json_t *v;

    memset(r, 0, sizeof(*r));
    if (json_is_integer(v = json_object_get(reply, "offset")) && json_integer_value(v) >= 0) {
        r->offset = (uint64_t)json_integer_value(v);
        r->has_offset = true;
    }
    if (json_is_integer(v = json_object_get(reply, "size")) && json_integer_value(v) >= 0) {
        r->size = (uint64_t)json_integer_value(v);
        r->has_size = true;
    }
    if (json_is_boolean(v = json_object_get(reply, "exists"))) {
        r->exists = json_is_true(v);
        r->has_exists = true;
    }
}

/* Read the reply to the request whose id is id (sent already, maybe with
 * others after it: their replies stay in the buffer) into r: the common
 * success shapes are recognised by hand, anything else (errors) goes through
 * jansson. 0 or the reply's error, its message in c->err; -ECONNRESET when
 * the reply answers another request. */
int client_receive(shmb_t *c, uint64_t id, struct line_reply *r)
{
    json_t *reply = NULL;
    const char *p;
    size_t len = 0;
    int rc;

    if ((rc = client_read_line(c, &len)) < 0)
        return rc;
    p = c->rbuf;
    if (line_scan_reply(&p, c->rbuf + len, r) == 0 && p == c->rbuf + len) {
        char wbuf[24], gbuf[24];

        if (!r->has_id || r->id != id)
            return client_out_of_step(c, client_id_text(NULL, id, true, wbuf, sizeof(wbuf)),
                                      client_id_text(NULL, r->id, r->has_id, gbuf,
                                                     sizeof(gbuf)),
                                      len);
        client_consume(c, len);
        client_replied(c);
        return 0;
    }
    rc = client_decode(c, len, NULL, id, false, &reply);
    if (rc == 0)
        client_reply_fields(reply, r);
    json_decref(reply);
    return rc;
}

/* Send the lines in c->w (the last one a request whose id is id) and read
 * its reply into r, as client_receive. */
int client_exchange(shmb_t *c, uint64_t id, struct line_reply *r)
{
    int rc = client_send(c);

    return rc < 0 ? rc : client_receive(c, id, r);
}

/* Start a request {"op":"OP"[,"id":ID],"key":KEY in c->w; id 0 for a
 * batch's element, which needs none. The caller checked the key. */
int client_begin_key(shmb_t *c, enum shmb_op_id op, uint64_t id,
                     const struct client_key *key)
{
    if (c->sock < 0)
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    if (line_lit(&c->w, "{\"op\":\"") < 0 || line_lit(&c->w, shmb_ops[op].name) < 0 ||
        (id != 0 && (line_lit(&c->w, "\",\"id\":") < 0 || line_u64(&c->w, id) < 0 ||
                     line_lit(&c->w, ",\"key\":") < 0)) ||
        (id == 0 && line_lit(&c->w, "\",\"key\":") < 0) ||
        line_str(&c->w, key->s, key->len) < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

/* A pointer to [offset, offset + size) after checking it lies in the data
 * area of the mapping: a confused daemon must not make us scribble. */
int client_extent(shmb_t *c, const struct line_reply *r, size_t want, void **ptr,
                  size_t *size)
{
    if (!r->has_offset || !r->has_size)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks \"offset\" or \"size\".");
    if (r->offset < c->info.data_offset || r->offset > c->map_size ||
        r->size > c->map_size - r->offset || (want != 0 && r->size != want))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd returned extent [%llu, +%llu) outside the data "
                              "area [%llu, %zu).",
                              (unsigned long long)r->offset, (unsigned long long)r->size,
                              (unsigned long long)c->info.data_offset, c->map_size);
    *ptr = c->map + r->offset;
    if (size != NULL)
        *size = (size_t)r->size;
    return 0;
}

/* A request whose only field is the (checked) key; its reply's fields in r
 * (may be NULL). */
int client_key_op(shmb_t *c, enum shmb_op_id op, const struct client_key *key,
                  struct line_reply *r)
{
    struct line_reply ignored;
    uint64_t id;
    int rc;

    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_begin_key(c, op, id = client_next_id(c), key)) < 0)
        return rc;
    if (line_lit(&c->w, "}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return client_exchange(c, id, r != NULL ? r : &ignored);
}

/* The alloc request for key, appended to c->w (without a newline); id 0 in a
 * batch. */
int client_alloc_op(shmb_t *c, uint64_t id, const struct client_key *key, size_t size,
                    unsigned readers, unsigned wait_ms)
{
    int rc;

    if ((rc = client_begin_key(c, SHMB_OP_ALLOC, id, key)) < 0)
        return rc;
    if (line_lit(&c->w, ",\"size\":") < 0 || line_u64(&c->w, size) < 0 ||
        line_lit(&c->w, ",\"readers\":") < 0 || line_u64(&c->w, readers) < 0 ||
        (wait_ms != 0 &&
         (line_lit(&c->w, ",\"wait_ms\":") < 0 || line_u64(&c->w, wait_ms) < 0)) ||
        line_lit(&c->w, "}") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}
