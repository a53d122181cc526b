// SPDX-License-Identifier: Apache-2.0
/*
 * Both ends of a fetch. Serving: pin the object in the local daemon (a get),
 * tell the peer where it lies in the pool's mapping (registered with UCX once)
 * and its packed rkey, release the pin when the peer says it is done or goes.
 * Where the endpoint has no RMA (TCP), send the bytes instead, by rendezvous
 * from the pin, and release it only once that send has ended. Fetching:
 * allocate in the local pool, read the peer's bytes by RMA (or receive the
 * ones it sends) straight into that allocation, commit it under the same key
 * (or abort it). Fetches of one key from one peer share one transfer. Knows
 * peers only through peer.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include <jansson.h>

#include "../client/internal.h"
#include "../proto/text.h"
#include "relay.h"

#define FETCH_WAITERS_MAX 1024 /* clients waiting on one transfer */

struct waiter {
    LIST_ENTRY(waiter) link;
    struct local_client *lc;
};

enum transfer_state {
    T_ASKED,   /* the request went; no reply yet */
    T_PUSHED,  /* the allocation is made, the peer's bytes awaited */
    T_GETTING, /* the RMA read (or the receive of the bytes) under way */
};

struct transfer {
    LIST_ENTRY(transfer) link;
    struct relay *relay;
    struct peer *peer; /* NULL once it went (the read still has to end) */
    char peer_name[RELAY_NAME_MAX + 1];
    char key[SHMB_KEY_MAX_LEN + 1];
    uint64_t id;
    enum transfer_state state;
    uint64_t deadline_ms; /* an answer, then the read, must come by then */
    uint64_t size;
    void *ptr;
    ucp_rkey_h rkey;
    void *req;
    bool get_done;
    bool daemon_gone; /* the daemon went while it moved: never committed */
    ucs_status_t get_status;
    LIST_HEAD(, waiter) waiters;
    unsigned nwaiters;
};

static void transfer_finish(struct transfer *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tell_done(struct transfer *t);

/* Whether UCX may still write into the pool's mapping for a transfer, or read
 * from it for a send of a pin. */
static bool pool_busy(const struct relay *r)
{
    const struct transfer *t;
    const struct served *s;
    const struct peer *p;
    LIST_FOREACH(t, &r->transfers, link)
        if (t->state == T_GETTING && !t->get_done)
            return true;
    LIST_FOREACH(s, &r->orphans, link)
        if (s->sending)
            return true;
    LIST_FOREACH(p, &r->peers, link)
        LIST_FOREACH(s, &p->served, link)
            if (s->sending)
                return true;
    return false;
}

/* The daemon went: every allocation this relay made in it may be handed to
 * another object by a daemon restarted on the same segment, and every pin
 * is gone. Fail each transfer that has an allocation, and end each receive,
 * read or send under way in the pool by closing its peer's connection (UCX
 * cannot cancel a receive of an active message's bytes) before the pool is
 * used again. A push that comes later for a failed transfer is let go. */
static void fetch_daemon_cut(struct relay *r, bool close_now)
{
    struct transfer *t, *next;
    struct served *s;
    struct peer *p;

    if (r->cutting)
        return;
    r->cutting = true;
    r->daemon_cut = true;
    fetch_unwatch_daemon(r);
    for (t = LIST_FIRST(&r->transfers); t; t = next) {
        next = LIST_NEXT(t, link);
        if (t->state == T_PUSHED) {
            tell_done(t);
            transfer_finish(t, -ECONNRESET,
                            "The local daemon went while '%s' was on its way from peer %s; "
                            "nothing was kept. Fetch it again.", t->key, t->peer_name);
        } else if (t->state == T_GETTING) {
            t->daemon_gone = true;
            if (!t->get_done && t->peer)
                peer_fail(t->peer, "the local daemon went while '%s' (%llu bytes) was "
                          "being received into its pool; the receive is cut", t->key,
                          (unsigned long long)t->size);
        }
    }
    LIST_FOREACH(p, &r->peers, link)
        LIST_FOREACH(s, &p->served, link)
            if (s->sending)
                peer_fail(p, "the local daemon went while '%s' (%llu bytes) was sent from "
                          "its pool; the send is cut", s->key, (unsigned long long)s->size);
    if (close_now)
        peer_close_failed(r);
    r->cutting = false;
    r->work_due = true;
    peer_kick(r);
}

/* The daemon went (restarted, or its connection broke): cut what moves in
 * the pool, then, once nothing does, connect again so that the next request
 * is served. The pool's mapping may be a new one. */
static void fetch_daemon_lost(struct relay *r)
{
    struct shmb_error err = {0};
    /* Not again before the retry's time: each try cuts, which asks the
     * loop for work, which tried again at once (a CPU, and no status
     * answered, while the daemon was away). */
    if (r->cutting || (r->daemon_cut && relay_now_ms() < r->daemon_retry_ms))
        return;
    if (!r->daemon_cut)
        relay_log("lost the local daemon (%s); connecting again once no transfer uses "
                  "its pool", shmb_errmsg(r->c));
    fetch_daemon_cut(r, false);
    if (pool_busy(r))
        return;
    fetch_unregister_pool(r);
    if (shmb_reconnect(r->c) == 0) {
        r->daemon_cut = false;
        fetch_register_pool(r, &err);
        fetch_watch_daemon(r);
    } else {
        r->daemon_retry_ms = relay_now_ms() + RELAY_DAEMON_RETRY_MS;
        peer_kick(r);
    }
}

static void on_daemon_close(uv_handle_t *h)
{
    free(h);
}

static void on_daemon_event(uv_poll_t *h, int status, int events)
{
    struct relay *r = h->data;
    char c;
    ssize_t n;

    (void)events;
    /* Between calls the daemon sends nothing: readable is its end. */
    n = r->c->sock < 0 ? 0 : recv(r->c->sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (status == 0 && n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    relay_log("the local daemon's connection %s; cutting the transfers into its pool",
              n == 0 ? "closed" : n > 0 ? "sent bytes unasked" : "failed");
    fetch_daemon_cut(r, true);
    fetch_daemon_lost(r);
}

/* Watch the daemon's connection for its end, so that a daemon that dies is
 * seen at once, not at the next call to it. */
void fetch_watch_daemon(struct relay *r)
{
    uv_poll_t *h;
    int flags;
    if (r->daemon_watch || !r->loop || r->c->sock < 0)
        return;
    h = calloc(1, sizeof(*h));
    if (!h) {
        relay_log("out of memory for watching the local daemon's connection");
        return;
    }
    /* uv_poll_init makes the descriptor non-blocking; the library's calls
     * on it expect it as it was. */
    flags = fcntl(r->c->sock, F_GETFL);
    if (flags < 0 || uv_poll_init(r->loop, h, r->c->sock) < 0) {
        relay_log("cannot watch the local daemon's connection: a daemon that dies is "
                  "seen at the relay's next call to it");
        free(h);
        return;
    }
    h->data = r;
    r->daemon_watch = h;
    if (fcntl(r->c->sock, F_SETFL, flags) < 0) {
        relay_log("cannot make the daemon's connection blocking again: %s; a daemon that "
                  "dies is seen at the relay's next call to it", strerror(errno));
        fetch_unwatch_daemon(r);
        return;
    }
    uv_poll_start(h, UV_READABLE | UV_DISCONNECT, on_daemon_event);
}

void fetch_unwatch_daemon(struct relay *r)
{
    if (!r->daemon_watch)
        return;
    uv_poll_stop(r->daemon_watch);
    uv_close((uv_handle_t *)r->daemon_watch, on_daemon_close);
    r->daemon_watch = NULL;
}

int fetch_register_pool(struct relay *r, struct shmb_error *err)
{
    ucp_mem_map_params_t mp = {0};
    ucs_status_t st;
    shmb_t *c = r->c;

    if (r->pool_memh && r->pool_base == c->map && r->pool_size == c->map_size)
        return 0;
    fetch_unregister_pool(r);
    if (!c->map)
        return shmb_error_set(err, -ENOTCONN, "Not connected to the local daemon.");
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = c->map;
    mp.length = c->map_size;
    /* Peers read the pool; none may write it (RDMA enforces this in the
     * hardware; TCP's emulation is held to it by peer.c). */
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
              UCP_MEM_MAP_PROT_REMOTE_READ;
    st = ucp_mem_map(r->ctx, &mp, &r->pool_memh);
    if (st != UCS_OK) {
        r->pool_memh = NULL;
        return shmb_error_set(err, -EIO, "UCX cannot register the pool's %zu bytes: %s.",
                              c->map_size, ucs_status_string(st));
    }
    st = ucp_rkey_pack(r->ctx, r->pool_memh, &r->pool_rkey, &r->pool_rkey_len);
    if (st != UCS_OK || r->pool_rkey_len > WIRE_RKEY_MAX) {
        fetch_unregister_pool(r);
        return shmb_error_set(err, -EIO, "UCX cannot pack the pool's remote key: %s.",
                              st != UCS_OK ? ucs_status_string(st) : "too long");
    }
    r->pool_base = c->map;
    r->pool_size = c->map_size;
    return 0;
}

void fetch_unregister_pool(struct relay *r)
{
    if (r->pool_rkey)
        ucp_rkey_buffer_release(r->pool_rkey);
    r->pool_rkey = NULL;
    r->pool_rkey_len = 0;
    if (r->pool_memh)
        ucp_mem_unmap(r->ctx, r->pool_memh);
    r->pool_memh = NULL;
    r->pool_base = NULL;
    r->pool_size = 0;
}

/* A local client of uid may use the relay when the daemon admits it: root
 * and the relay's own user, as the daemon admits them, or a uid with a
 * connection of its own to the daemon in the relay's pool (the daemon let
 * it past --allow-uid, --allow-gid and the pool's group). The relay's socket
 * alone cannot say so: it has the daemon socket's mode, which may admit
 * more than the daemon does. */
int fetch_admit(struct relay *r, uid_t uid, struct shmb_error *err)
{
    shmb_clients_t *list = NULL;
    const char *mine = NULL;
    bool found = false;
    int rc;

    if (uid == 0 || uid == geteuid())
        return 0;
    if (r->daemon_cut)
        fetch_daemon_lost(r);
    rc = shmb_clients(r->c, &list);
    if (rc == -ECONNRESET) {
        fetch_daemon_lost(r);
        rc = shmb_clients(r->c, &list);
    }
    if (rc < 0)
        return shmb_error_set(err, -EPERM,
                              "The relay cannot ask the daemon whether uid %u may use it "
                              "(%s); try again.", (unsigned)uid, shmb_errmsg(r->c));
    for (size_t i = 0; i < list->count; i++)
        if (list->clients[i].self)
            mine = list->pools[i];
    for (size_t i = 0; mine && i < list->count && !found; i++)
        found = !list->clients[i].self && list->clients[i].uid == (int64_t)uid &&
                strcmp(list->pools[i], mine) == 0;
    shmb_clients_free(list);
    if (!found)
        return shmb_error_set(err, -EPERM,
                              "uid %u has no connection to the daemon at %s in the relay's "
                              "pool, so the relay does not serve it: connect to the daemon "
                              "first (the daemon's --allow-uid, --allow-gid and the pool's "
                              "group say who may).", (unsigned)uid, r->daemon_socket);
    return 0;
}

/* ---- serving ------------------------------------------------------------ */

static void reply_error(struct peer *p, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(struct peer *p, uint64_t id, int code, const char *fmt, ...)
{
    unsigned char out[WIRE_MSG_MAX];
    char text[WIRE_TEXT_MAX + 1];
    va_list ap;
    int n;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    n = wire_fetch_reply(out, id, code, 0, 0, NULL, 0, text);
    if (n > 0)
        peer_send(p, out, (size_t)n);
}

static void on_push_done(void *request, ucs_status_t status, void *user_data)
{
    struct served *s = user_data;
    s->push_status = status;
    s->sending = false;
    s->ended = true;
    s->relay->work_due = true;
    ucp_request_free(request);
}

/* Send the pinned object's bytes to p as one rendezvous message: UCX reads
 * them from the pin, whose served record lives until the send has ended. */
static void push(struct peer *p, struct served *s, const void *ptr)
{
    struct relay *r = p->relay;
    ucp_request_param_t param = {0};
    ucs_status_ptr_t req;

    wire_data_header(s->header, s->id);
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMH;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_RNDV;
    param.cb.send = on_push_done;
    param.user_data = s;
    param.memh = r->pool_memh;
    s->sending = true;
    /* A fetcher that never takes the bytes would hold the pin for as long
     * as it lives: it gets the time a fetcher gives a read (fetch_expire). */
    s->deadline_ms = relay_now_ms() + r->fetch_timeout_ms + s->size / 10000;
    peer_kick(r); /* its deadline */
    req = ucp_am_send_nbx(p->ep, WIRE_DATA_AM_ID, s->header, sizeof(s->header), ptr,
                          (size_t)s->size, &param);
    if (UCS_PTR_IS_PTR(req))
        return;
    s->sending = false;
    s->push_status = UCS_PTR_STATUS(req);
    s->ended = true;
    r->work_due = true;
}

void fetch_on_request(struct peer *p, const struct wire_msg *m)
{
    struct relay *r = p->relay;
    struct shmb_error err = {0};
    unsigned char out[WIRE_MSG_MAX];
    struct served *s;
    const void *ptr = NULL;
    size_t size = 0;
    int rc, n;

    LIST_FOREACH(s, &p->served, link)
        if (s->id == m->id) {
            peer_fail(p, "asked twice under request id %llu", (unsigned long long)m->id);
            return;
        }
    if (p->nserved >= RELAY_SERVED_MAX) {
        reply_error(p, m->id, -EBUSY,
                    "Relay %s holds %u objects pinned for you already (at most %d); "
                    "finish those first.", r->name, p->nserved, RELAY_SERVED_MAX);
        return;
    }
    if (r->daemon_cut)
        fetch_daemon_lost(r);
    rc = shmb_get(r->c, m->key, &ptr, &size);
    if (rc == -ECONNRESET) {
        fetch_daemon_lost(r);
        rc = shmb_get(r->c, m->key, &ptr, &size);
    }
    if (rc < 0) {
        reply_error(p, m->id, rc, "%s (on relay %s)", shmb_errmsg(r->c), r->name);
        return;
    }
    if ((rc = fetch_register_pool(r, &err)) < 0 || (const char *)ptr < (char *)r->pool_base ||
        size > r->pool_size ||
        (size_t)((const char *)ptr - (char *)r->pool_base) > r->pool_size - size) {
        shmb_release(r->c, m->key);
        reply_error(p, m->id, -EIO, "Relay %s cannot serve '%s': %s", r->name, m->key,
                    rc < 0 ? err.message : "the object lies outside the registered pool");
        return;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        shmb_release(r->c, m->key);
        reply_error(p, m->id, -ENOMEM, "Relay %s is out of memory.", r->name);
        return;
    }
    s->id = m->id;
    memcpy(s->key, m->key, sizeof(s->key));
    s->addr = (uint64_t)(uintptr_t)ptr;
    s->size = size;
    LIST_INSERT_HEAD(&p->served, s, link);
    p->nserved++;
    p->fetches_served++;
    s->relay = r;
    if (peer_has_rma(p)) {
        n = wire_fetch_reply(out, m->id, 0, size, (uint64_t)(uintptr_t)ptr, r->pool_rkey,
                             r->pool_rkey_len, NULL);
        if (n > 0)
            peer_send(p, out, (size_t)n);
        return;
    }
    /* No RMA in the transport: UCX would emulate the peer's read with
     * requests answered inside our progress, and one answered on a failed
     * endpoint stops the process. The reply without a key says the bytes
     * follow; they go from the pin by rendezvous (the peer receives them
     * into its allocation), and a peer that goes fails our own send. */
    n = wire_fetch_reply(out, m->id, 0, size, (uint64_t)(uintptr_t)ptr, NULL, 0, NULL);
    if (n > 0 && peer_send(p, out, (size_t)n) == 0)
        push(p, s, ptr);
}

/* Let go of a pin (the record is already off its list). */
static void served_free(struct relay *r, struct served *s)
{
    if (shmb_release(r->c, s->key) == -ECONNRESET)
        fetch_daemon_lost(r); /* the daemon dropped the pin with the connection */
    free(s);
}

/* p is done with s: the pin goes now, or once our send of its bytes has
 * ended (UCX reads them until then). */
static void served_release(struct relay *r, struct peer *p, struct served *s)
{
    if (s->sending) {
        s->done = true;
        return;
    }
    LIST_REMOVE(s, link);
    p->nserved--;
    served_free(r, s);
}

/* Sends of pinned bytes that ended: a failed one closes its peer's
 * connection; a pin whose peer is done, or gone (an orphan), goes. */
static void served_poll(struct relay *r)
{
    struct served *s, *next;
    struct peer *p;
    for (s = LIST_FIRST(&r->orphans); s; s = next) {
        next = LIST_NEXT(s, link);
        if (!s->sending) {
            LIST_REMOVE(s, link);
            served_free(r, s);
        }
    }
    LIST_FOREACH(p, &r->peers, link)
        for (s = LIST_FIRST(&p->served); s; s = next) {
            next = LIST_NEXT(s, link);
            if (!s->ended)
                continue;
            s->ended = false;
            if (s->push_status != UCS_OK)
                peer_fail(p, "the send of '%s' (%llu bytes) failed: %s", s->key,
                          (unsigned long long)s->size, ucs_status_string(s->push_status));
            else
                p->bytes_out += s->size;
            if (s->done)
                served_release(r, p, s);
        }
}

void fetch_on_done(struct peer *p, const struct wire_msg *m)
{
    struct served *s;
    LIST_FOREACH(s, &p->served, link)
        if (s->id == m->id) {
            served_release(p->relay, p, s);
            return;
        }
    /* A done for nothing pinned: a reply that was an error, or a peer
     * confused; either way nothing is held. */
}

/* ---- fetching ----------------------------------------------------------- */

/* The end of a transfer: every waiting client gets the same answer. */
static void transfer_finish(struct transfer *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void transfer_finish(struct transfer *t, int code, const char *fmt, ...)
{
    struct relay *r = t->relay;
    struct waiter *w;
    char msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    while ((w = LIST_FIRST(&t->waiters))) {
        LIST_REMOVE(w, link);
        if (code == 0) {
            json_t *reply = json_pack("{s:b, s:s, s:s, s:I}", "ok", 1, "peer", t->peer_name,
                                      "key", t->key, "size", (json_int_t)t->size);
            char *line = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
            if (line)
                local_reply(w->lc, line);
            free(line);
            json_decref(reply);
        } else {
            local_reply_error(w->lc, code, "%s", msg);
        }
        w->lc->waiting--;
        free(w);
    }
    if (t->rkey)
        ucp_rkey_destroy(t->rkey);
    tcp_guard_unpost(t);
    LIST_REMOVE(t, link);
    r->ntransfers--;
    free(t);
}

static void tell_done(struct transfer *t)
{
    unsigned char out[WIRE_MSG_MAX];
    int n = wire_fetch_done(out, t->id);
    if (t->peer && n > 0)
        peer_send(t->peer, out, (size_t)n);
}

static int add_waiter(struct transfer *t, struct local_client *lc)
{
    struct waiter *w;
    if (t->nwaiters >= FETCH_WAITERS_MAX)
        return -EBUSY;
    w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->lc = lc;
    lc->waiting++;
    t->nwaiters++;
    LIST_INSERT_HEAD(&t->waiters, w, link);
    return 0;
}

int fetch_start(struct relay *r, struct local_client *lc, const char *peer_name,
                const char *key)
{
    unsigned char out[WIRE_MSG_MAX];
    struct transfer *t;
    struct peer *p = peer_find(r, peer_name);
    int n, rc;

    if (!p) {
        char names[512] = "";
        size_t used = 0;
        LIST_FOREACH(p, &r->peers, link)
            if (p->configured && used < sizeof(names))
                used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
                                         used ? ", " : "", p->name);
        local_reply_error(lc, -ENOENT,
                          "This relay has no peer named '%s' (it has: %s). Name peers with "
                          "--peer NAME=ADDR:PORT or in the --peers-file.",
                          peer_name, names[0] ? names : "none");
        return -ENOENT;
    }
    LIST_FOREACH(t, &r->transfers, link)
        if (t->peer == p && strcmp(t->key, key) == 0) {
            if ((rc = add_waiter(t, lc)) < 0)
                local_reply_error(lc, rc, "%u clients wait for '%s' already (at most %d).",
                                  t->nwaiters, key, FETCH_WAITERS_MAX);
            return rc;
        }
    if (p->state != PEER_READY) {
        local_reply_error(lc, -ENOTCONN,
                          "Peer %s (%s) is not connected%s%s; the relay dials it again "
                          "every %d ms.",
                          p->name, p->address, p->last_error[0] ? ": " : "", p->last_error,
                          RELAY_RETRY_MS);
        return -ENOTCONN;
    }
    if (r->ntransfers >= RELAY_TRANSFERS_MAX) {
        local_reply_error(lc, -EBUSY, "%u transfers are under way (at most %d); try again.",
                          r->ntransfers, RELAY_TRANSFERS_MAX);
        return -EBUSY;
    }
    t = calloc(1, sizeof(*t));
    if (!t) {
        local_reply_error(lc, -ENOMEM, "The relay is out of memory.");
        return -ENOMEM;
    }
    t->relay = r;
    t->peer = p;
    t->id = ++r->next_id;
    t->deadline_ms = relay_now_ms() + r->fetch_timeout_ms;
    snprintf(t->peer_name, sizeof(t->peer_name), "%s", p->name);
    snprintf(t->key, sizeof(t->key), "%s", key);
    LIST_INIT(&t->waiters);
    LIST_INSERT_HEAD(&r->transfers, t, link);
    r->ntransfers++;
    if (add_waiter(t, lc) < 0) {
        transfer_finish(t, -ENOMEM, "The relay is out of memory.");
        local_reply_error(lc, -ENOMEM, "The relay is out of memory.");
        return -ENOMEM;
    }
    n = wire_fetch(out, t->id, key);
    if (n < 0 || peer_send(p, out, (size_t)n) < 0) {
        transfer_finish(t, -ECONNRESET, "Cannot ask peer %s for '%s': %s.", p->name, key,
                        p->last_error);
        return -ECONNRESET;
    }
    p->transfers++;
    peer_kick(r); /* its deadline */
    return 0;
}

static void on_recv_done(void *request, ucs_status_t status, size_t length,
                         void *user_data)
{
    struct transfer *t = user_data;
    (void)length;
    t->get_status = status;
    t->get_done = true;
    t->req = NULL;
    t->relay->work_due = true;
    ucp_request_free(request);
}

void fetch_on_data(struct peer *p, uint64_t id, size_t length, void *desc)
{
    struct relay *r = p->relay;
    ucp_request_param_t param = {0};
    ucs_status_ptr_t req;
    struct transfer *t;

    LIST_FOREACH(t, &r->transfers, link)
        if (t->peer == p && t->id == id)
            break;
    if (!t || t->state != T_PUSHED || length != t->size) {
        ucp_am_data_release(r->worker, desc);
        /* Bytes of a fetch that timed out (its late answer was told done)
         * are let go; any others are a peer confused or hostile. */
        if (t && t->state == T_PUSHED) {
            peer_fail(p, "sent %zu bytes for '%s', which is %llu bytes", length, t->key,
                      (unsigned long long)t->size);
        } else if (t || id == 0 || id > r->next_id) {
            peer_fail(p, "sent an object's bytes for request id %llu, which %s",
                      (unsigned long long)id, t ? "awaits no bytes" : "was never made");
        }
        return;
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMH;
    param.cb.recv_am = on_recv_done;
    param.user_data = t;
    param.memh = r->pool_memh;
    t->state = T_GETTING;
    tcp_guard_post(t, t->ptr, length); /* over TCP the bytes come as put requests */
    req = ucp_am_recv_data_nbx(r->worker, desc, t->ptr, length, &param);
    if (UCS_PTR_IS_PTR(req)) {
        t->req = req;
        return;
    }
    t->get_status = UCS_PTR_STATUS(req);
    t->get_done = true;
    r->work_due = true;
}

static void on_get_done(void *request, ucs_status_t status, void *user_data)
{
    struct transfer *t = user_data;
    t->get_status = status;
    t->get_done = true;
    t->req = NULL;
    t->relay->work_due = true;
    ucp_request_free(request);
}

void fetch_on_reply(struct peer *p, const struct wire_msg *m)
{
    struct relay *r = p->relay;
    ucp_request_param_t param = {0};
    ucs_status_ptr_t req;
    ucs_status_t st;
    struct transfer *t;
    int rc;

    LIST_FOREACH(t, &r->transfers, link)
        if (t->peer == p && t->id == m->id && t->state == T_ASKED)
            break;
    if (!t) {
        /* A late answer to a request that timed out: the peer pinned the
         * object for nothing, so it is told to let go. An answer to a
         * request never made is a peer confused or hostile. */
        if (m->id != 0 && m->id <= r->next_id) {
            if (m->code == 0) {
                unsigned char out[WIRE_MSG_MAX];
                int n = wire_fetch_done(out, m->id);
                if (n > 0)
                    peer_send(p, out, (size_t)n);
            }
            return;
        }
        peer_fail(p, "answered request id %llu, which was never made",
                  (unsigned long long)m->id);
        return;
    }
    if (m->code < 0) {
        transfer_finish(t, m->code, "%s", m->text[0] ? m->text : "refused by the peer");
        return;
    }
    t->size = m->size;
    /* The read gets its own time: at least 10 MB/s on top of the timeout. */
    t->deadline_ms = relay_now_ms() + r->fetch_timeout_ms + m->size / 10000;
    if (m->size > r->max_object) {
        tell_done(t);
        transfer_finish(t, -E2BIG,
                        "'%s' on peer %s is %llu bytes; this relay takes objects of at "
                        "most %llu bytes (--max-object).",
                        t->key, p->name, (unsigned long long)m->size,
                        (unsigned long long)r->max_object);
        return;
    }
    if (m->rkey_len != 0 && !peer_has_rma(p)) {
        /* A read by emulated RMA would ask UCX to take the peer's replies,
         * which name requests by ids a peer may forge into addresses: over
         * such a link relays send objects themselves. */
        tell_done(t);
        transfer_finish(t, -EPROTO,
                        "Peer %s answered the fetch of '%s' with a remote key over a link "
                        "without RMA (TCP), where relays send the object's bytes themselves; "
                        "is it a relay of another version?", p->name, t->key);
        peer_fail(p, "answered a fetch with a remote key over a link without RMA");
        return;
    }
    if (r->daemon_cut)
        fetch_daemon_lost(r);
    if (r->daemon_cut) {
        tell_done(t);
        transfer_finish(t, -ECONNRESET,
                        "The local daemon went; the relay connects to it again once the "
                        "transfers into its pool have ended. Fetch '%s' again.", t->key);
        return;
    }
    rc = shmb_alloc(r->c, t->key, (size_t)m->size, 0, &t->ptr);
    if (rc == -ECONNRESET) {
        fetch_daemon_lost(r);
        rc = shmb_alloc(r->c, t->key, (size_t)m->size, 0, &t->ptr);
    }
    if (rc < 0) {
        tell_done(t);
        transfer_finish(t, rc, "%s", shmb_errmsg(r->c));
        return;
    }
    struct shmb_error err = {0};
    if (fetch_register_pool(r, &err) < 0) {
        shmb_abort(r->c, t->key);
        tell_done(t);
        transfer_finish(t, err.code, "%s", err.message);
        return;
    }
    if (m->rkey_len == 0) {
        t->state = T_PUSHED; /* the bytes follow (fetch_on_data) */
        return;
    }
    st = ucp_ep_rkey_unpack(p->ep, m->rkey, &t->rkey);
    if (st != UCS_OK) {
        t->rkey = NULL;
        shmb_abort(r->c, t->key);
        tell_done(t);
        transfer_finish(t, -EPROTO, "Peer %s sent a remote key UCX cannot read: %s.",
                        p->name, ucs_status_string(st));
        peer_fail(p, "sent a remote key UCX cannot read");
        return;
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMH;
    param.cb.send = on_get_done;
    param.user_data = t;
    param.memh = r->pool_memh;
    t->state = T_GETTING;
    req = ucp_get_nbx(p->ep, t->ptr, (size_t)m->size, m->addr, t->rkey, &param);
    if (UCS_PTR_IS_ERR(req)) {
        t->get_status = UCS_PTR_STATUS(req);
        t->get_done = true;
    } else if (req == NULL) {
        t->get_status = UCS_OK;
        t->get_done = true;
    } else {
        t->req = req;
    }
    if (t->get_done)
        r->work_due = true;
}

/* Transfers whose read ended: commit or abort, tell the peer, answer. */
void fetch_poll(struct relay *r)
{
    struct transfer *t, *next;
    bool lost = false;
    served_poll(r);
    for (t = LIST_FIRST(&r->transfers); t; t = next) {
        next = LIST_NEXT(t, link);
        if (t->state != T_GETTING || !t->get_done)
            continue;
        if (t->peer)
            t->peer->bytes_in += t->get_status == UCS_OK ? t->size : 0;
        tell_done(t);
        if (t->daemon_gone) {
            /* Its allocation went with the daemon: nothing to abort. */
            transfer_finish(t, -ECONNRESET,
                            "The local daemon went while '%s' was being received from peer "
                            "%s; nothing was kept. Fetch it again.", t->key, t->peer_name);
            continue;
        }
        if (t->get_status != UCS_OK || !t->peer) {
            char why[300];
            snprintf(why, sizeof(why), "%s",
                     t->get_status != UCS_OK ? ucs_status_string(t->get_status)
                                             : "the peer went");
            shmb_abort(r->c, t->key);
            transfer_finish(t, -ECONNRESET,
                            "The transfer of '%s' from peer %s was cut (%s); nothing was "
                            "kept. Fetch it again.",
                            t->key, t->peer_name, why);
            continue;
        }
        int rc = shmb_commit(r->c, t->key);
        if (rc < 0)
            transfer_finish(t, rc, "%s", shmb_errmsg(r->c));
        if (rc == -ECONNRESET)
            lost = true; /* after the loop: it may end other transfers */
        else if (rc == 0)
            transfer_finish(t, 0, "ok");
    }
    if (lost || (r->daemon_cut && !r->cutting && !pool_busy(r)))
        fetch_daemon_lost(r);
}

void fetch_peer_gone(struct peer *p)
{
    struct relay *r = p->relay;
    struct transfer *t, *next;
    while (!LIST_EMPTY(&p->served)) {
        struct served *s = LIST_FIRST(&p->served);
        LIST_REMOVE(s, link);
        p->nserved--;
        if (s->sending) /* UCX reads its bytes until the send ends */
            LIST_INSERT_HEAD(&r->orphans, s, link);
        else
            served_free(r, s);
    }
    for (t = LIST_FIRST(&r->transfers); t; t = next) {
        next = LIST_NEXT(t, link);
        if (t->peer != p)
            continue;
        if (t->state == T_ASKED) {
            transfer_finish(t, -ECONNRESET,
                            "Peer %s went before it answered for '%s': %s. Fetch it again.",
                            p->name, t->key, p->last_error);
            continue;
        }
        if (t->state == T_PUSHED) {
            shmb_abort(r->c, t->key);
            transfer_finish(t, -ECONNRESET,
                            "Peer %s went before it sent '%s': %s. Fetch it again.",
                            p->name, t->key, p->last_error);
            continue;
        }
        /* The read still writes into the allocation until UCX ends it (the
         * endpoint's close does): it is aborted then, in fetch_poll. */
        t->peer = NULL;
    }
}

uint64_t fetch_next_deadline(const struct relay *r)
{
    const struct transfer *t;
    const struct served *s;
    const struct peer *p;
    /* (A busy pool: fetch_poll tries once it is free, not the timer.) */
    uint64_t next = r->daemon_cut && !pool_busy(r) ? r->daemon_retry_ms : UINT64_MAX;
    LIST_FOREACH(t, &r->transfers, link)
        if (t->peer && t->deadline_ms < next)
            next = t->deadline_ms;
    LIST_FOREACH(p, &r->peers, link)
        if (p->state != PEER_CLOSING)
            LIST_FOREACH(s, &p->served, link)
                if (s->sending && s->deadline_ms < next)
                    next = s->deadline_ms;
    return next;
}

void fetch_expire(struct relay *r)
{
    struct transfer *t, *next;
    struct served *s;
    struct peer *p;
    uint64_t now = relay_now_ms();

    if (r->daemon_cut && r->daemon_retry_ms <= now)
        r->work_due = true; /* fetch_poll connects again */
    /* Our sends of pinned bytes that a peer has not taken in time: closing
     * it ends them (with an error), and the pins go in served_poll. */
    LIST_FOREACH(p, &r->peers, link)
        LIST_FOREACH(s, &p->served, link)
            if (s->sending && s->deadline_ms <= now && p->state != PEER_CLOSING) {
                peer_fail(p, "took no delivery of '%s' (%llu bytes) in time "
                          "(--fetch-timeout %llu ms plus 1 s per 10 MB)",
                          s->key, (unsigned long long)s->size,
                          (unsigned long long)r->fetch_timeout_ms);
                break;
            }
    for (t = LIST_FIRST(&r->transfers); t; t = next) {
        next = LIST_NEXT(t, link);
        if (!t->peer || t->deadline_ms > now)
            continue;
        if (t->state == T_ASKED) {
            transfer_finish(t, -ETIMEDOUT,
                            "Peer %s did not answer for '%s' within %llu ms (--fetch-timeout); "
                            "is its relay or its daemon stuck?",
                            t->peer_name, t->key, (unsigned long long)r->fetch_timeout_ms);
        } else {
            /* The read writes into the allocation until UCX ends it: the
             * connection's close does, and fetch_poll aborts it then. */
            peer_fail(t->peer, "the read of '%s' (%llu bytes) did not end in time "
                      "(--fetch-timeout %llu ms plus 1 s per 10 MB)",
                      t->key, (unsigned long long)t->size,
                      (unsigned long long)r->fetch_timeout_ms);
        }
    }
}

/* A local {"op":"fetch","peer":P,"key":K}: the key is checked as the daemon
 * checks a client's, and one connection waits for a bounded number. */
void fetch_local_request(struct local_client *lc, json_t *req)
{
    json_error_t jerr;
    const char *op = NULL, *peer = NULL, *key = NULL;
    struct shmb_error err = {0};

    if (json_unpack_ex(req, &jerr, JSON_STRICT, "{s:s, s:s, s:s}", "op", &op, "peer", &peer,
                       "key", &key) < 0) {
        local_reply_error(lc, -EINVAL, "fetch takes \"peer\" and \"key\": %s.", jerr.text);
        return;
    }
    if (shmb_key_check(key, strlen(key), &err) < 0) {
        local_reply_error(lc, err.code, "%s", err.message);
        return;
    }
    if (lc->waiting >= FETCH_WAITING_MAX) {
        local_reply_error(lc, -EBUSY,
                          "This connection waits for %u fetches already (at most %d).",
                          lc->waiting, FETCH_WAITING_MAX);
        return;
    }
    fetch_start(lc->relay, lc, peer, key);
}

unsigned fetch_waiters(const struct relay *r)
{
    const struct transfer *t;
    unsigned n = 0;
    LIST_FOREACH(t, &r->transfers, link)
        n += t->nwaiters;
    return n;
}

void fetch_client_gone(struct relay *r, struct local_client *lc)
{
    struct transfer *t;
    struct waiter *w, *next;
    LIST_FOREACH(t, &r->transfers, link)
        for (w = LIST_FIRST(&t->waiters); w; w = next) {
            next = LIST_NEXT(w, link);
            if (w->lc == lc) {
                LIST_REMOVE(w, link);
                t->nwaiters--;
                lc->waiting--;
                free(w);
            }
        }
}
