// SPDX-License-Identifier: Apache-2.0
/*
 * The UCP side of the relay: the context and worker, their progress driven by
 * libuv through the worker's event descriptor (an idle relay sleeps in the
 * kernel), the listener, the endpoints to and from other relays, and each
 * connection's hello and proof of the key. What a ready peer asks for is
 * fetch.c's; the daemon is not known here.
 */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

/* A listener's connection request, handled after progress: not inside UCX's callback. */
struct pending_conn {
    STAILQ_ENTRY(pending_conn) link;
    ucp_conn_request_h req;
};
static STAILQ_HEAD(, pending_conn) pending_conns = STAILQ_HEAD_INITIALIZER(pending_conns);
static unsigned npending_conns;

static void peer_send_hello(struct peer *p);
static void peer_close_now(struct peer *p);
static void on_timer(uv_timer_t *h);

/* Split ADDR:PORT ([ADDR]:PORT for IPv6) and resolve it into sa. */
static int parse_hostport(const char *s, struct sockaddr_storage *sa, socklen_t *len,
                          struct shmb_error *err)
{
    char host[256];
    const char *colon, *port, *h = s;
    size_t hl;
    struct addrinfo hints = {0}, *res = NULL;
    int rc;

    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return shmb_error_set(err, -EINVAL, "'%s' is not [ADDR]:PORT.", s);
        h = s + 1;
        hl = (size_t)(end - h);
        port = end + 2;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return shmb_error_set(err, -EINVAL, "'%s' is not ADDR:PORT (no port).", s);
        hl = (size_t)(colon - s);
        port = colon + 1;
    }
    if (hl == 0 || hl >= sizeof(host) || !*port)
        return shmb_error_set(err, -EINVAL, "'%s' is not ADDR:PORT.", s);
    memcpy(host, h, hl);
    host[hl] = 0;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0)
        return shmb_error_set(err, -EINVAL, "Cannot resolve '%s': %s.", s, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

struct peer *peer_find(struct relay *r, const char *name)
{
    struct peer *p;
    LIST_FOREACH(p, &r->peers, link)
        if (p->configured && strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

static struct peer *peer_by_ep(struct relay *r, ucp_ep_h ep)
{
    struct peer *p;
    LIST_FOREACH(p, &r->peers, link)
        if (p->ep == ep)
            return p;
    return NULL;
}

/* Arm the timer when a connection waits for its proof, a peer for its retry or a
 * drain stopped short; an idle relay with every peer ready has no timer running. */
void peer_kick(struct relay *r)
{
    struct peer *p;
    uint64_t now = relay_now_ms(), next = r->drain_cut ? now + 1 : UINT64_MAX;
    LIST_FOREACH(p, &r->peers, link)
        if ((p->state == PEER_CONNECTING || (p->state == PEER_IDLE && p->configured)) &&
            p->deadline_ms < next)
            next = p->deadline_ms;
    if (r->hooks.next_deadline(r) < next)
        next = r->hooks.next_deadline(r);
    if (next == UINT64_MAX) {
        uv_timer_stop(&r->timer);
        return;
    }
    uv_timer_start(&r->timer, on_timer, next > now ? next - now : 0, 0);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct peer *p = arg;
    (void)ep;
    if (p->state == PEER_CLOSING)
        return;
    snprintf(p->last_error, sizeof(p->last_error), "connection lost: %s",
             ucs_status_string(status));
    p->state = PEER_CLOSING;
}

/* Dial a configured peer. */
static void peer_dial(struct peer *p)
{
    struct relay *r = p->relay;
    ucp_ep_params_t ep_params = {0};
    ucs_status_t st;

    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                           UCP_EP_PARAM_FIELD_ERR_HANDLER |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = (const struct sockaddr *)&p->sa;
    ep_params.sockaddr.addrlen = p->sa_len;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = on_ep_error;
    ep_params.err_handler.arg = p;
    st = ucp_ep_create(r->worker, &ep_params, &p->ep);
    if (st != UCS_OK) {
        p->ep = NULL;
        snprintf(p->last_error, sizeof(p->last_error), "cannot dial %s: %s", p->address,
                 ucs_status_string(st));
        p->deadline_ms = relay_now_ms() + RELAY_RETRY_MS;
        return;
    }
    p->state = PEER_CONNECTING;
    p->deadline_ms = relay_now_ms() + RELAY_AUTH_MS;
    peer_send_hello(p);
}

int peer_add_configured(struct relay *r, const char *name, const char *addr,
                        struct shmb_error *err)
{
    struct peer *p;
    unsigned n = 0;
    size_t nl = strlen(name);
    int rc;

    LIST_FOREACH(p, &r->peers, link)
        n++;
    if (n >= RELAY_PEERS_MAX)
        return shmb_error_set(err, -E2BIG, "More than %d peers; a relay serves at most %d.",
                              RELAY_PEERS_MAX, RELAY_PEERS_MAX);
    if (nl == 0 || nl > RELAY_NAME_MAX || strspn(name, "abcdefghijklmnopqrstuvwxyz"
                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                       "0123456789-_.") != nl)
        return shmb_error_set(err, -EINVAL,
                              "A peer's name is 1 to %d of A-Z a-z 0-9 - _ ., not '%.80s'.",
                              RELAY_NAME_MAX, name);
    if (peer_find(r, name))
        return shmb_error_set(err, -EEXIST, "The peer '%s' is named twice.", name);
    if (strlen(addr) >= sizeof(p->address))
        return shmb_error_set(err, -EINVAL, "The address of peer '%s' is too long.", name);
    p = calloc(1, sizeof(*p));
    if (!p)
        return shmb_error_set(err, -ENOMEM, "Out of memory for a peer.");
    rc = parse_hostport(addr, &p->sa, &p->sa_len, err);
    if (rc < 0) {
        free(p);
        return rc;
    }
    p->relay = r;
    p->configured = true;
    strcpy(p->name, name);
    strcpy(p->address, addr);
    LIST_INIT(&p->served);
    p->state = PEER_IDLE;
    p->deadline_ms = 0; /* dial at once */
    LIST_INSERT_HEAD(&r->peers, p, link);
    return 0;
}

static void on_send_done(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    free(user_data);
    ucp_request_free(request);
}

int peer_send_ep(ucp_ep_h ep, const void *msg, size_t len, ucs_status_t *status)
{
    ucp_request_param_t param = {0};
    ucs_status_ptr_t req;
    void *buf = malloc(len);

    if (!buf)
        return -ENOMEM;
    memcpy(buf, msg, len);
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    param.cb.send = on_send_done;
    param.user_data = buf;
    req = ucp_am_send_nbx(ep, WIRE_AM_ID, NULL, 0, buf, len, &param);
    if (UCS_PTR_IS_ERR(req)) {
        free(buf);
        *status = UCS_PTR_STATUS(req);
        return -ECONNRESET;
    }
    if (req == NULL)
        free(buf);
    return 0;
}

int peer_send(struct peer *p, const void *msg, size_t len)
{
    ucs_status_t st = UCS_OK;
    int rc;

    if (!p->ep || p->state == PEER_CLOSING)
        return -ENOTCONN;
    rc = peer_send_ep(p->ep, msg, len, &st);
    if (rc == -ECONNRESET)
        peer_fail(p, "cannot send: %s", ucs_status_string(st));
    if (rc < 0)
        return rc;
    p->msgs_out++;
    p->bytes_out += len;
    return 0;
}

void peer_fail(struct peer *p, const char *fmt, ...)
{
    va_list ap;
    if (p->state == PEER_CLOSING)
        return;
    va_start(ap, fmt);
    vsnprintf(p->last_error, sizeof(p->last_error), fmt, ap);
    va_end(ap);
    relay_log("peer %s (%s): %s; closing the connection", p->name[0] ? p->name : "?",
              p->address, p->last_error);
    if (p->state != PEER_READY && !p->configured)
        p->relay->refused++;
    p->state = PEER_CLOSING;
}

static void peer_send_hello(struct peer *p)
{
    unsigned char msg[WIRE_MSG_MAX];
    int n;
    if (auth_nonce(p->my_nonce, sizeof(p->my_nonce)) < 0) {
        peer_fail(p, "no random bytes for a nonce");
        return;
    }
    n = wire_hello(msg, p->my_nonce, p->relay->name);
    if (n > 0 && peer_send(p, msg, (size_t)n) == 0)
        p->sent_hello = true;
}

/* Accept a connection the listener took: an endpoint and our hello. */
static void peer_accept(struct relay *r, ucp_conn_request_h req)
{
    ucp_conn_request_attr_t attr = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    ucp_ep_params_t ep_params = {0};
    struct peer *p;
    ucs_status_t st;
    char host[64] = "?", port[16] = "?";

    if (ucp_conn_request_query(req, &attr) != UCS_OK) {
        relay_log("refused a connection whose address UCX does not tell");
        r->refused++;
        ucp_listener_reject(r->listener, req);
        return;
    }
    getnameinfo((struct sockaddr *)&attr.client_address, sizeof(attr.client_address), host,
                sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
    /* Before any endpoint: UCX handles its own messages on an endpoint before
     * the key is proved (docs/multi-host.md, "Trust"), so a host that is no
     * peer's gets none, nor one whose worker address UCX would misread. */
    if (!admit_address(r, &attr.client_address)) {
        relay_log("refused a connection from %s:%s: %s is not a configured peer's address "
                  "nor in an --allow-from range (add --allow-from %s if it is a relay)",
                  host, port, host, host);
        r->refused++;
        ucp_listener_reject(r->listener, req);
        return;
    }
    if (ucx_guard_conn_request(req, &attr.client_address, host, port) < 0) {
        ucp_listener_reject(r->listener, req);
        return;
    }
    if (r->ninbound >= RELAY_INBOUND_MAX || r->stopping) {
        relay_log("refused a connection from %s:%s: %u connections from peers already "
                  "(at most %d)", host, port, r->ninbound, RELAY_INBOUND_MAX);
        r->refused++;
        ucp_listener_reject(r->listener, req);
        return;
    }
    /* One address may not hold every seat with connections that never prove
     * the key, so that the other relays still get in. */
    unsigned unproven = 0;
    LIST_FOREACH(p, &r->peers, link)
        unproven += !p->configured && p->state == PEER_CONNECTING && strcmp(p->host, host) == 0;
    if (unproven >= RELAY_UNPROVEN_PER_HOST) {
        relay_log("refused a connection from %s:%s: %u connections from %s have not proved "
                  "the key yet (at most %d from one address)", host, port, unproven, host,
                  RELAY_UNPROVEN_PER_HOST);
        r->refused++;
        ucp_listener_reject(r->listener, req);
        return;
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        ucp_listener_reject(r->listener, req);
        return;
    }
    p->relay = r;
    LIST_INIT(&p->served);
    snprintf(p->address, sizeof(p->address), "%s:%s", host, port);
    snprintf(p->host, sizeof(p->host), "%s", host);
    ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                           UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.conn_request = req;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = on_ep_error;
    ep_params.err_handler.arg = p;
    st = ucp_ep_create(r->worker, &ep_params, &p->ep);
    if (st != UCS_OK) {
        relay_log("cannot accept a connection from %s: %s", p->address,
                  ucs_status_string(st));
        free(p);
        return;
    }
    r->ninbound++;
    p->state = PEER_CONNECTING;
    p->deadline_ms = relay_now_ms() + RELAY_AUTH_MS;
    LIST_INSERT_HEAD(&r->peers, p, link);
    peer_send_hello(p);
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    struct relay *r = arg;
    struct pending_conn *pc;
    if (npending_conns >= RELAY_INBOUND_MAX || !(pc = malloc(sizeof(*pc)))) {
        r->refused++;
        ucp_listener_reject(r->listener, req);
        return;
    }
    pc->req = req;
    STAILQ_INSERT_TAIL(&pending_conns, pc, link);
    npending_conns++;
}

/* A message from a peer, during progress: decode it now (its bytes do not
 * outlive this call), handle it after. */
static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    struct relay *r = arg;
    struct wire_msg *m;
    struct shmb_error err = {0};
    (void)header;

    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        return UCS_OK; /* cannot tell who sent it; nothing to answer */
    m = malloc(sizeof(*m));
    if (!m)
        return UCS_OK;
    if (header_length != 0)
        shmb_error_set(&err, -EPROTO, "a message with a header of %zu bytes", header_length);
    else if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > WIRE_MSG_MAX)
        shmb_error_set(&err, -EPROTO, "a message of %zu bytes (at most %d)", length,
                       WIRE_MSG_MAX);
    else
        wire_decode(data, length, m, &err);
    if (err.code) {
        memset(m, 0, offsetof(struct wire_msg, rkey));
        snprintf(m->text, sizeof(m->text), "%.500s", err.message);
        m->wire_len = length;
    }
    m->ep = param->reply_ep;
    STAILQ_INSERT_TAIL(&r->inbox, m, link);
    return UCS_OK;
}

/* An object's bytes announced by a peer (WIRE_DATA_AM_ID), during progress:
 * only by rendezvous (the receiver places them, no copy here), then handed
 * up after progress with UCX's descriptor kept (UCS_INPROGRESS). Anything
 * else is refused, its connection closed after progress. */
static ucs_status_t on_data_am(void *arg, const void *header, size_t header_length,
                               void *data, size_t length, const ucp_am_recv_param_t *param)
{
    struct relay *r = arg;
    struct wire_data *d;
    struct shmb_error err = {0};

    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        return UCS_OK; /* cannot tell who sent it; UCX answers the sender */
    d = calloc(1, sizeof(*d));
    if (!d)
        return UCS_OK;
    d->ep = param->reply_ep;
    d->length = length;
    if (wire_data_decode(header, header_length, &d->id, &err) < 0)
        snprintf(d->error, sizeof(d->error), "sent %.200s", err.message);
    else if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
        snprintf(d->error, sizeof(d->error), "sent an object's %zu bytes other than by "
                 "rendezvous", length);
    else
        d->desc = data;
    STAILQ_INSERT_TAIL(&r->data_inbox, d, link);
    return d->desc ? UCS_INPROGRESS : UCS_OK;
}

/* The bytes of an object for a ready peer go up; else they are let go. */
static void peer_on_data(struct relay *r, struct wire_data *d)
{
    struct peer *p = peer_by_ep(r, d->ep);

    if (p && p->state != PEER_CLOSING) {
        p->msgs_in++;
        if (d->error[0])
            peer_fail(p, "%s", d->error);
        else if (p->state != PEER_READY)
            peer_fail(p, "sent an object's bytes before proving the key");
        else {
            r->hooks.peer_data(p, d->id, d->length, d->desc);
            return;
        }
    }
    if (d->desc)
        ucp_am_data_release(r->worker, d->desc);
}

static void peer_on_msg(struct relay *r, struct wire_msg *m)
{
    struct peer *p = peer_by_ep(r, m->ep);
    unsigned char out[WIRE_MSG_MAX], mac[WIRE_MAC_LEN];
    int n;

    if (!p || p->state == PEER_CLOSING)
        return;
    p->msgs_in++;
    p->bytes_in += m->wire_len;
    switch (m->type) {
    case 0:
        peer_fail(p, "sent %s", m->text);
        return;
    case WIRE_HELLO:
        if (p->got_hello) {
            peer_fail(p, "sent a second hello");
            return;
        }
        if (m->version != WIRE_VERSION) {
            peer_fail(p, "speaks version %u of the relays' protocol; this relay speaks %d",
                      (unsigned)m->version, WIRE_VERSION);
            return;
        }
        p->got_hello = true;
        memcpy(p->their_nonce, m->nonce, WIRE_NONCE_LEN);
        snprintf(p->hello_name, sizeof(p->hello_name), "%s", m->name);
        if (!p->configured)
            snprintf(p->name, sizeof(p->name), "%s", m->name);
        auth_proof(r, p->configured, p->their_nonce, p->my_nonce, mac);
        n = wire_auth(out, mac);
        if (peer_send(p, out, (size_t)n) == 0)
            p->sent_auth = true;
        break;
    case WIRE_AUTH:
        if (!p->got_hello || p->got_auth || !p->sent_hello) {
            peer_fail(p, "sent a proof out of turn");
            return;
        }
        if (!auth_check(r, !p->configured, p->their_nonce, p->my_nonce, m->mac)) {
            peer_fail(p, "did not prove the pre-shared key (refused: check that both "
                         "relays' --key-file hold the same key)");
            return;
        }
        p->got_auth = true;
        break;
    default:
        if (p->state != PEER_READY) {
            peer_fail(p, "sent a message of type %u before proving the key",
                      (unsigned)m->type);
            return;
        }
        r->hooks.peer_message(p, m);
        return;
    }
    if (p->state == PEER_CONNECTING && p->got_auth && p->sent_auth) {
        p->state = PEER_READY;
        p->last_error[0] = 0;
        relay_log("peer %s (%s) connected", p->name, p->address);
        r->hooks.peer_ready(p);
        peer_kick(r);
    }
}

/* Close p's endpoint now: its pins and transfers go with it. A configured
 * peer is dialled again later; one that dialled us is forgotten. */
static void peer_close_now(struct peer *p)
{
    struct relay *r = p->relay;
    r->hooks.peer_gone(p);
    if (p->ep) {
        ucp_request_param_t param = {0};
        ucs_status_ptr_t req;
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
        req = ucp_ep_close_nbx(p->ep, &param);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
        p->ep = NULL;
    }
    p->sent_hello = p->got_hello = p->sent_auth = p->got_auth = false;
    if (p->configured && !r->stopping) {
        p->state = PEER_IDLE;
        p->deadline_ms = relay_now_ms() + RELAY_RETRY_MS;
        return;
    }
    LIST_REMOVE(p, link);
    if (!p->configured)
        r->ninbound--;
    free(p);
}

/* Close now every connection that failed (outside UCX's progress): what
 * UCX was writing for them ends before this returns. */
void peer_close_failed(struct relay *r)
{
    struct peer *p, *next;
    for (p = LIST_FIRST(&r->peers); p; p = next) {
        next = LIST_NEXT(p, link);
        if (p->state == PEER_CLOSING)
            peer_close_now(p);
    }
}

/* One progress of UCX, then what it brought, until nothing comes (or for
 * RELAY_DRAIN_MS), then arm the worker to sleep on its descriptor. */
static void peer_drain(struct relay *r)
{
    for (uint64_t start = relay_now_ms();;) {
        bool did = ucp_worker_progress(r->worker) != 0;
        r->refused += admit_take_refused();
        while (!STAILQ_EMPTY(&r->inbox)) {
            struct wire_msg *m = STAILQ_FIRST(&r->inbox);
            STAILQ_REMOVE_HEAD(&r->inbox, link);
            peer_on_msg(r, m);
            free(m);
            did = true;
        }
        while (!STAILQ_EMPTY(&r->data_inbox)) {
            struct wire_data *d = STAILQ_FIRST(&r->data_inbox);
            STAILQ_REMOVE_HEAD(&r->data_inbox, link);
            peer_on_data(r, d);
            free(d);
            did = true;
        }
        while (!STAILQ_EMPTY(&pending_conns)) {
            struct pending_conn *pc = STAILQ_FIRST(&pending_conns);
            STAILQ_REMOVE_HEAD(&pending_conns, link);
            npending_conns--;
            peer_accept(r, pc->req);
            free(pc);
            did = true;
        }
        if (r->work_due) {
            r->work_due = false;
            r->hooks.work_due(r);
            did = true;
        }
        struct peer *p, *next;
        for (p = LIST_FIRST(&r->peers); p; p = next) {
            next = LIST_NEXT(p, link);
            if (p->state == PEER_CLOSING) {
                peer_close_now(p);
                did = true;
            } else if (p->configured && p->state == PEER_IDLE && !r->stopping &&
                       p->deadline_ms <= relay_now_ms()) {
                peer_dial(p);
                did = true;
            }
        }
        r->drain_cut = did && relay_now_ms() - start >= RELAY_DRAIN_MS; /* the timer at 1 */
        if (did) {
            peer_kick(r);
            if (r->drain_cut)
                return;
            continue;
        }
        ucs_status_t st = ucp_worker_arm(r->worker);
        if (st == UCS_ERR_BUSY)
            continue;
        break;
    }
}

static void on_drain(uv_prepare_t *h)
{
    peer_drain(h->data);
}

static void on_efd(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    peer_drain(h->data);
}

/* Connections that have not proved the key in time go; peers due a retry
 * are dialled (by the drain that follows every loop turn). */
static void on_timer(uv_timer_t *h)
{
    struct relay *r = h->data;
    struct peer *p;
    uint64_t now = relay_now_ms();
    LIST_FOREACH(p, &r->peers, link)
        if (p->state == PEER_CONNECTING && p->deadline_ms <= now)
            peer_fail(p, "did not prove the pre-shared key within %d ms", RELAY_AUTH_MS);
    r->hooks.expire(r);
    peer_drain(r);
    peer_kick(r);
}

bool peer_has_rma(struct peer *p)
{
    char *text = NULL;
    size_t len = 0;
    bool rma = false;
    FILE *f;

    /* UCX 1.13 has no query for an endpoint's transports; its description
     * names the lanes, and a lane that does RMA in the transport is marked
     * "rma#N" (TCP has only "rma_bw#N", for its rendezvous writes). */
    if (!p->ep || !(f = open_memstream(&text, &len)))
        return false;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    for (const char *t = text; t && (t = strstr(t, "rma#")); t++)
        if (t > text && (t[-1] == ' ' || t[-1] == '\t'))
            rma = true;
    free(text);
    return rma;
}

int peer_setup(struct relay *r, struct shmb_error *err)
{
    ucp_params_t params = {0};
    ucp_worker_params_t wparams = {0};
    ucp_worker_attr_t wattr = {0};
    ucp_am_handler_param_t am = {0};
    ucp_config_t *config = NULL;
    ucs_status_t st;
    int rc;

    STAILQ_INIT(&r->inbox);
    STAILQ_INIT(&r->data_inbox);
    admit_start(r);
    /* A relay restarted after a crash listens again at once, as a daemon would:
     * its old connections' ports linger in TIME_WAIT. Operators' own wins. */
    setenv("UCX_CM_REUSEADDR", "y", 0);
    /* The worker takes calls from the queues' stream threads too: a mutex, where
     * UCX's default spin lock spun 40 % of the relay's CPU away on a loaded
     * 2-core host while the lock's holder waited for a CPU. The operator's
     * own UCX_USE_MT_MUTEX wins. */
    setenv("UCX_USE_MT_MUTEX", "y", 0);
    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK)
        return shmb_error_set(err, -EINVAL, "UCX's settings (UCX_* variables): %s.",
                              ucs_status_string(st));
    /* Ids on the wire, never addresses: the guards below drop the rest. */
    st = ucp_config_modify(config, "PROTO_INDIRECT_ID", "on");
    if (st != UCS_OK) {
        ucp_config_release(config);
        return shmb_error_set(err, -EINVAL, "UCX does not take PROTO_INDIRECT_ID=on: %s. "
                              "The relay needs UCX 1.13.", ucs_status_string(st));
    }
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &r->ctx);
    ucp_config_release(config);
    if (st != UCS_OK)
        return shmb_error_set(err, -EIO, "UCX did not start: %s. Check UCX_TLS and "
                              "UCX_NET_DEVICES.", ucs_status_string(st));
    ucx_guard_emulated_rma();
    /* Multi-thread, so that a queue's stream thread sends what it read
     * itself (forward.c): a wake-up of the loop less per message. A UCX
     * built without it gives a single-thread worker; the threads then hand
     * their messages to the loop. */
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_MULTI;
    st = ucp_worker_create(r->ctx, &wparams, &r->worker);
    if (st != UCS_OK)
        return shmb_error_set(err, -EIO, "UCX made no worker: %s.", ucs_status_string(st));
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    r->worker_mt = ucp_worker_query(r->worker, &wattr) == UCS_OK &&
                   wattr.thread_mode == UCS_THREAD_MODE_MULTI;
    if (!r->worker_mt)
        relay_log("UCX gave a single-thread worker: queues' streams send through the loop");
    st = ucp_worker_get_efd(r->worker, &r->efd);
    if (st != UCS_OK)
        return shmb_error_set(err, -EIO, "UCX's worker has no event descriptor: %s.",
                              ucs_status_string(st));
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = WIRE_AM_ID;
    am.cb = on_am;
    am.arg = r;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(r->worker, &am);
    if (st == UCS_OK) {
        am.id = WIRE_DATA_AM_ID;
        am.cb = on_data_am;
        am.flags = 0;
        st = ucp_worker_set_am_recv_handler(r->worker, &am);
    }
    if (st != UCS_OK)
        return shmb_error_set(err, -EIO, "UCX took no message handler: %s.",
                              ucs_status_string(st));
    if (r->listen_addr) {
        ucp_listener_params_t lp = {0};
        struct sockaddr_storage sa;
        socklen_t sa_len;
        if ((rc = parse_hostport(r->listen_addr, &sa, &sa_len, err)) < 0)
            return rc;
        lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                        UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        lp.sockaddr.addr = (const struct sockaddr *)&sa;
        lp.sockaddr.addrlen = sa_len;
        lp.conn_handler.cb = on_conn_request;
        lp.conn_handler.arg = r;
        st = ucp_listener_create(r->worker, &lp, &r->listener);
        if (st != UCS_OK)
            return shmb_error_set(err, -EADDRINUSE,
                                  "Cannot listen on %s: %s. Is another relay there, or "
                                  "is the address not this host's?",
                                  r->listen_addr, ucs_status_string(st));
        if (LIST_EMPTY(&r->peers) && r->nallow == 0)
            relay_log("listening on %s with no --peer and no --allow-from: every connection "
                      "is refused; name the relays that dial this one with --allow-from "
                      "ADDR[/PREFIX]", r->listen_addr);
    }
    uv_poll_init(r->loop, &r->efd_poll, r->efd);
    r->efd_poll.data = r;
    uv_poll_start(&r->efd_poll, UV_READABLE, on_efd);
    uv_prepare_init(r->loop, &r->drain);
    r->drain.data = r;
    uv_prepare_start(&r->drain, on_drain);
    uv_timer_init(r->loop, &r->timer);
    r->timer.data = r;
    return 0;
}

void peer_teardown(struct relay *r)
{
    struct peer *p;
    r->stopping = true;
    LIST_FOREACH(p, &r->peers, link)
        if (p->state != PEER_CLOSING) {
            snprintf(p->last_error, sizeof(p->last_error), "relay stopping");
            p->state = PEER_CLOSING;
        }
    while (!STAILQ_EMPTY(&pending_conns)) {
        struct pending_conn *pc = STAILQ_FIRST(&pending_conns);
        STAILQ_REMOVE_HEAD(&pending_conns, link);
        npending_conns--;
        ucp_listener_reject(r->listener, pc->req);
        free(pc);
    }
    if (r->listener) {
        ucp_listener_destroy(r->listener);
        r->listener = NULL;
    }
    while (!LIST_EMPTY(&r->peers))
        peer_close_now(LIST_FIRST(&r->peers));
    /* Let the closes and the last sends finish (bounded: a dead peer does not
     * hold the exit). */
    for (int i = 0; i < 1000 && ucp_worker_progress(r->worker); i++)
        ;
    while (!STAILQ_EMPTY(&r->inbox)) {
        struct wire_msg *m = STAILQ_FIRST(&r->inbox);
        STAILQ_REMOVE_HEAD(&r->inbox, link);
        free(m);
    }
    while (!STAILQ_EMPTY(&r->data_inbox)) {
        struct wire_data *d = STAILQ_FIRST(&r->data_inbox);
        STAILQ_REMOVE_HEAD(&r->data_inbox, link);
        if (d->desc)
            ucp_am_data_release(r->worker, d->desc);
        free(d);
    }
}
