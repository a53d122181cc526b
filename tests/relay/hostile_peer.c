// SPDX-License-Identifier: Apache-2.0
/*
 * A relay's peer that misbehaves, for tests/relay/run.sh: it dials a relay
 * over UCX and does one bad thing, then reports whether the relay closed the
 * connection (exit 0) or kept it (exit 1; 2 for a usage or UCX error).
 *   relay-hostile-peer ADDR:PORT KEYFILE MODE
 * MODE: wrongkey (proves another key), garbage (bytes before any hello),
 * early (a fetch before proving the key), huge (a 1 MiB message after proving
 * it), nonutf8 (a fetch whose key is not UTF-8), badlen (a fetch whose key
 * length runs past the message), stray (a reply to a request never made),
 * rmaput, rmaget and rmaread (RMA of the object fetched or beyond: see rma()),
 * unproven (RMA without proving the key: see unproven_rma()),
 * holdpush (fetches an object the relay sends it, holds the bytes unreceived
 * and sends garbage: the relay closes it with its send under way; it prints
 * "closed" and lives 5 s more, so that the relay's pin can be seen to go
 * while it lives), hangpush (the same without the garbage: it stays, polite
 * and silent, with the bytes unreceived, and prints whether the relay closed
 * it within 30 s),
 * qbatch-ok, qbatch-overrun, qbatch-count, qbatch-zero, qbatch-short (a
 * queue's batch, well formed or not: see qbatch()),
 * halfopen (300 connections that never prove the key, held 5 s after it
 * prints "ready"),
 * qaskbad (a fetch whose type asks for an acknowledgement),
 * qnagle (subscribes to queue "nagleq" and acknowledges only when told:
 * see qnagle()),
 * fetchflood (fetches of an absent key as fast as the relay reads them for
 * $FLOOD_SECONDS, 10 by default, reading none of the answers; prints "sent N"),
 * and ok (proves the key and behaves: the relay must keep it, exit 1).
 * tcpput, tcpconnreq, tcpputack and tcpwireup-HOW speak UCX 1.13's TCP
 * transport by hand instead, at ADDR:PORT the port of the relay's UCT TCP
 * interface (not its --listen port): see hostile_tcp.c; tcpcm-HOW speaks
 * its sockaddr connection by hand at the --listen port (tcp_cm()).
 * The serve-* modes listen at ADDR:PORT instead, for a relay that names this
 * peer with --peer, and answer its first fetch badly: serve-ctrltext (an
 * error whose text has terminal control bytes: the relay must close),
 * serve-huge (an object of 2^62 bytes: the relay must refuse it and keep
 * the connection, exit 1), serve-shortpush (an object of 64 KiB whose bytes
 * follow as 4 KiB: the relay must close), serve-eagerpush (its bytes sent
 * other than by rendezvous: the relay must close), serve-getrep (a fair
 * answer with a remote key of its own memory, as over RDMA: over TCP the
 * relay must close instead of reading it by emulated RMA, whose replies
 * this peer would forge to name the relay's request by an address,
 * 0x4141414141414140: see forge_get_rep), serve-qinpieces (grants the relay's first queue
 * subscription, then sends a batch inside a message in pieces: the relay
 * must close), serve-qflood (grants it, then sends 3 batches of 64 messages
 * without waiting for their acknowledgement: the relay must close),
 * serve-qaskreply (grants it with the acknowledgement flag on the grant:
 * the relay must close), serve-qask (grants it, then asks for
 * acknowledgements everywhere a queue's message may: see serve_qask(); the
 * relay must keep it, exit 1).
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../relay/relay.h"
#include "hostile_tcp.h"

static struct relay relay;
static ucp_worker_h worker;
static ucp_ep_h ep;
static int closed;
static unsigned char their_nonce[WIRE_NONCE_LEN], my_nonce[WIRE_NONCE_LEN];
static int got_hello, got_auth, got_fetch, got_reply;
static struct wire_msg reply;
static uint64_t fetch_id;
static int got_qsub;
static uint64_t qsub_id;
static ucp_conn_request_h conn_req;
static struct sockaddr_storage dial_sa;

/* UCX 1.13's handler table entry for an emulated read's request (its first
 * two fields), as the relay hooks it. */
struct ucx_am_handler_head {
    uint64_t features;
    ucs_status_t (*cb)(void *arg, void *data, size_t length, unsigned flags);
};
extern struct ucx_am_handler_head ucp_am_handler_UCP_AM_ID_GET_REQ __attribute__((weak));
static ucs_status_t (*ucx_get_req_cb)(void *arg, void *data, size_t length, unsigned flags);
static int forged;

/* The relay's emulated read of our memory: UCX answers it with replies that
 * carry the request id found at bytes 24 to 31 of the request (address,
 * length, endpoint id, request id). Make that id an address (its low bit
 * clear), as a peer of UCX 1.13 may: the relay's UCX would take it for its
 * request and write the bytes read there. */
static ucs_status_t forge_get_rep(void *arg, void *data, size_t length, unsigned flags)
{
    uint64_t forged_id = 0x4141414141414140ull;
    if (length >= 32) {
        memcpy((char *)data + 24, &forged_id, sizeof(forged_id));
        forged++;
    }
    return ucx_get_req_cb(arg, data, length, flags);
}

static void on_err(void *arg, ucp_ep_h e, ucs_status_t st)
{
    (void)arg;
    (void)e;
    (void)st;
    closed = 1;
}

/* qnagle: the queue messages that came, each "nagle-NN" somewhere in its
 * bytes, and whether they came in order (NN counting from 0). */
static int got_qsub_reply, qsub_code, q_acks;
static uint64_t q_acked;
static int q_wire, q_msgs, q_disorder;

static void q_item(const unsigned char *b, size_t n)
{
    char want[16];
    int len = snprintf(want, sizeof(want), "nagle-%02d", q_msgs);
    if (!memmem(b, n, want, (size_t)len))
        q_disorder++;
    q_msgs++;
}

static void q_took(const struct wire_msg *m)
{
    size_t off = 0, n;
    const unsigned char *b;
    q_wire++;
    if (m->type == WIRE_QMSG) {
        q_item(m->rkey, m->rkey_len); /* small: one piece each */
        return;
    }
    while (wire_qbatch_next(m, &off, &b, &n))
        q_item(b, n);
}

static ucs_status_t on_am(void *arg, const void *h, size_t hl, void *data, size_t len,
                          const ucp_am_recv_param_t *param)
{
    struct wire_msg *m = malloc(sizeof(*m));
    struct shmb_error err = {0};
    (void)arg, (void)h, (void)hl, (void)param;
    if (m && wire_decode(data, len, m, &err) == 0) {
        if (m->type == WIRE_HELLO) {
            memcpy(their_nonce, m->nonce, WIRE_NONCE_LEN);
            got_hello = 1;
        } else if (m->type == WIRE_AUTH) {
            got_auth = 1;
        } else if (m->type == WIRE_FETCH_REPLY) {
            reply = *m;
            got_reply = 1;
        } else if (m->type == WIRE_FETCH) {
            fetch_id = m->id;
            got_fetch = 1;
        } else if (m->type == WIRE_QSUB) {
            qsub_id = m->id;
            got_qsub = 1;
        } else if (m->type == WIRE_QSUB_REPLY) {
            qsub_code = m->code;
            got_qsub_reply = 1;
        } else if (m->type == WIRE_QBATCH || m->type == WIRE_QMSG) {
            q_took(m);
        } else if (m->type == WIRE_QACK) {
            q_acks++;
            q_acked = m->size;
        }
    }
    free(m);
    return UCS_OK;
}

static int got_data;

/* An object's bytes announced (holdpush): kept, never received. */
static ucs_status_t on_data(void *arg, const void *h, size_t hl, void *data, size_t len,
                            const ucp_am_recv_param_t *param)
{
    (void)arg, (void)h, (void)hl, (void)data, (void)len;
    got_data = 1;
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_INPROGRESS : UCS_OK;
}

static void send_raw(const void *buf, size_t len)
{
    ucp_request_param_t p = {0};
    ucs_status_ptr_t req;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    req = ucp_am_send_nbx(ep, WIRE_AM_ID, NULL, 0, buf, len, &p);
    if (UCS_PTR_IS_PTR(req)) {
        for (int i = 0; i < 20000 && ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
            ucp_worker_progress(worker);
            usleep(100);
        }
        ucp_request_free(req);
    }
}

/* An object's bytes as a serving relay pushes them, n of them, by
 * rendezvous or not. */
static void send_data(uint64_t id, size_t n, bool rndv)
{
    static char bytes[65536];
    unsigned char header[WIRE_DATA_HEADER_LEN];
    ucp_request_param_t p = {0};
    ucs_status_ptr_t req;
    wire_data_header(header, id);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY | (rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
    req = ucp_am_send_nbx(ep, WIRE_DATA_AM_ID, header, sizeof(header), bytes, n, &p);
    for (int i = 0; i < 20000 && UCS_PTR_IS_PTR(req) &&
                    ucp_request_check_status(req) == UCS_INPROGRESS && !closed; i++) {
        ucp_worker_progress(worker);
        usleep(100);
    }
}

static void on_conn(ucp_conn_request_h req, void *arg)
{
    (void)arg;
    conn_req = req;
}

/* Progress for up to ms milliseconds, or until cond holds. */
static void progress_for(int ms, int *cond)
{
    for (int i = 0; i < ms && !(cond && *cond) && !closed; i++) {
        while (ucp_worker_progress(worker))
            ;
        usleep(1000);
    }
}

/* qnagle: subscribe to A's queue "nagleq" (seat 0), acknowledging nothing
 * until told, and print "subscribed CODE". Then, per line from stdin:
 * "wait N" progresses until N queue messages came (10 s at most) and
 * prints "got W M" (W active messages, M queue messages); "hold" waits
 * 2 s and prints "held W M"; "ack N" acknowledges every message that came,
 * progresses until N came (10 s at most), prints "acked W M D" (D:
 * messages out of order or not the expected) and exits. */
static void qnagle(unsigned char *msg)
{
    char line[64];
    int n = wire_qsub(msg, 7, 0, 1, "nagleq"), want;
    send_raw(msg, (size_t)n);
    progress_for(10000, &got_qsub_reply);
    printf("%s %d\n", got_qsub_reply && qsub_code == 0 ? "subscribed" : "refused", qsub_code);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin)) {
        if (sscanf(line, "wait %d", &want) == 1) {
            for (int i = 0; i < 10000 && q_msgs < want && !closed; i++)
                progress_for(1, NULL);
            printf("got %d %d\n", q_wire, q_msgs);
        } else if (strncmp(line, "hold", 4) == 0) {
            progress_for(2000, NULL);
            printf("held %d %d\n", q_wire, q_msgs);
        } else if (sscanf(line, "ack %d", &want) == 1) {
            n = wire_qack(msg, 7, (uint64_t)q_msgs);
            send_raw(msg, (size_t)n);
            for (int i = 0; i < 10000 && q_msgs < want && !closed; i++)
                progress_for(1, NULL);
            printf("acked %d %d %d\n", q_wire, q_msgs, q_disorder);
            fflush(stdout);
            _exit(0);
        }
        fflush(stdout);
    }
    _exit(2);
}

/* serve-qask: asks for an acknowledgement on every piece of a message in 3
 * pieces, on a batch of 4 and on each of 20 messages, 25 in all (within
 * the window); then says how many acknowledgements came, and the last,
 * once it is 4 (or after 20 s). */
static void serve_qask(unsigned char *msg)
{
    static unsigned char big[2 * WIRE_CHUNK_MAX + 100];
    struct wire_batch b;
    for (size_t off = 0, n; off < sizeof(big); off += n) {
        n = sizeof(big) - off < WIRE_CHUNK_MAX ? sizeof(big) - off : WIRE_CHUNK_MAX;
        int len = wire_qmsg(msg, qsub_id, sizeof(big), off, big + off, n);
        wire_ask_ack(msg);
        send_raw(msg, (size_t)len);
    }
    wire_qbatch_begin(&b, msg, qsub_id);
    for (int i = 0; i < 4; i++)
        wire_qbatch_add(&b, "ask", 3);
    size_t len = wire_qbatch_end(&b);
    wire_ask_ack(msg);
    send_raw(msg, len);
    for (int i = 0; i < 20; i++) {
        len = (size_t)wire_qmsg(msg, qsub_id, 3, 0, "ask", 3);
        wire_ask_ack(msg);
        send_raw(msg, len);
    }
    /* The test's queue has 4 slots and a reader that reads none: 4 are
     * published there, and acknowledged. */
    for (int i = 0; i < 20000 && q_acked < 4 && !closed; i++)
        progress_for(1, NULL);
    printf("acks %d last %llu\n", q_acks, (unsigned long long)q_acked);
}

static ucp_context_h ctx;

/* An rkey of this program's own memory: UCX's emulated RMA over TCP checks
 * none, so it serves to aim at any address of the relay. */
static ucp_rkey_h own_rkey(void)
{
    static char buf[64];
    ucp_mem_map_params_t mp = {0};
    ucp_mem_h mh;
    void *packed;
    size_t packed_len;
    ucp_rkey_h rk;

    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = buf;
    mp.length = sizeof(buf);
    if (ucp_mem_map(ctx, &mp, &mh) != UCS_OK ||
        ucp_rkey_pack(ctx, mh, &packed, &packed_len) != UCS_OK ||
        ucp_ep_rkey_unpack(ep, packed, &rk) != UCS_OK)
        _exit(2);
    return rk;
}

/* Fetch the object "rma-target" as a relay would, then with its rkey (or,
 * where the relay sends the bytes itself and gives none, one of our own)
 * write "OWNED!!!" over its first bytes (put), or read 8 bytes at 0x1000, far
 * outside the pool (get), or its own first 8 bytes (read, printed in hex:
 * over TCP no peer may read by RMA, even what it fetched); each is given
 * 1 s, then the fetch is done and the program exits (0: the relay closed the
 * connection, 1: it kept it). */
static void rma(const char *what)
{
    static char bytes[8] = "OWNED!!!";
    bool put = strcmp(what, "rmaput") == 0;
    unsigned char msg[WIRE_MSG_MAX];
    ucp_request_param_t pp = {0};
    ucs_status_ptr_t req;
    ucp_rkey_h rk;
    int n = wire_fetch(msg, 1, "rma-target");

    send_raw(msg, (size_t)n);
    progress_for(5000, &got_reply);
    if (got_reply && reply.code == 0 && reply.rkey_len == 0)
        rk = own_rkey();
    else if (!got_reply || reply.code != 0 ||
             ucp_ep_rkey_unpack(ep, reply.rkey, &rk) != UCS_OK) {
        fprintf(stderr, "relay-hostile-peer: no object rma-target to aim at\n");
        _exit(2);
    }
    if (!put)
        memset(bytes, 0, sizeof(bytes));
    req = put ? ucp_put_nbx(ep, bytes, sizeof(bytes), reply.addr, rk, &pp)
              : ucp_get_nbx(ep, bytes, sizeof(bytes),
                            strcmp(what, "rmaread") == 0 ? reply.addr : 0x1000, rk, &pp);
    for (int i = 0; i < 500 && UCS_PTR_IS_PTR(req) &&
                    ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(worker);
        usleep(1000);
    }
    req = ucp_ep_flush_nbx(ep, &pp);
    for (int i = 0; i < 500 && UCS_PTR_IS_PTR(req) &&
                    ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(worker);
        usleep(1000);
    }
    n = wire_fetch_done(msg, 1);
    send_raw(msg, (size_t)n);
    progress_for(200, NULL);
    if (!put) {
        printf("read ");
        for (unsigned i = 0; i < sizeof(bytes); i++)
            printf("%02x", (unsigned char)bytes[i]);
        printf("\n");
    }
    printf("%s\n", closed ? "closed" : "kept");
    fflush(stdout);
    _exit(closed ? 0 : 1);
}

/* Without proving the key: read 8 bytes at $HOSTILE_ADDR by RMA (printing
 * them, hex) and write "OWNED!!!" there, with a remote key of this
 * program's own memory (UCX's emulated RMA over TCP reads none). Each is
 * given 1 s; then the program exits (0: closed, 1: kept). */
static void unproven_rma(void)
{
    static char buf[8] = "OWNED!!!";
    unsigned char got[8] = {0};
    ucp_request_param_t pp = {0};
    ucp_rkey_h rk = own_rkey();
    const char *a = getenv("HOSTILE_ADDR");
    uint64_t addr = a ? strtoull(a, NULL, 0) : 0;

    for (int put = 0; put < 2; put++) {
        ucs_status_ptr_t req = put ? ucp_put_nbx(ep, buf, 8, addr, rk, &pp)
                                   : ucp_get_nbx(ep, got, sizeof(got), addr, rk, &pp);
        for (int i = 0; i < 1000 && UCS_PTR_IS_PTR(req) &&
                        ucp_request_check_status(req) == UCS_INPROGRESS; i++) {
            ucp_worker_progress(worker);
            usleep(1000);
        }
    }
    printf("read ");
    for (unsigned i = 0; i < sizeof(got); i++)
        printf("%02x", got[i]);
    printf("\n%s\n", closed ? "closed" : "kept");
    fflush(stdout);
    _exit(closed ? 0 : 1);
}

/* A queue's batch (WIRE_QBATCH) of stream 7: "ok" is well formed (the relay
 * keeps the peer); "overrun" has one item, whose length runs past the batch,
 * "count" 65 items (the bound is 64), "zero" none, "short" says 3 items and
 * holds 2: each must close the connection. */
static void qbatch(unsigned char *msg, const char *how)
{
    struct wire_batch b;
    size_t n;
    wire_qbatch_begin(&b, msg, 7);
    if (strcmp(how, "count") == 0) {
        for (int i = 0; i < WIRE_BATCH_MAX; i++)
            wire_qbatch_add(&b, "x", 1);
        n = wire_qbatch_end(&b);
        msg[n++] = 1, msg[n++] = 0, msg[n++] = 'y'; /* item 65 */
        msg[9] = WIRE_BATCH_MAX + 1;
        msg[11] = (unsigned char)(n - 13);
    } else if (strcmp(how, "zero") == 0) {
        n = wire_qbatch_end(&b);
    } else if (strcmp(how, "overrun") == 0) {
        wire_qbatch_add(&b, "abcd", 4);
        n = wire_qbatch_end(&b);
        msg[13] = 200; /* its one item: 200 bytes of the 4 there are */
    } else {
        wire_qbatch_add(&b, "abcd", 4);
        wire_qbatch_add(&b, "efgh", 4);
        n = wire_qbatch_end(&b);
        if (strcmp(how, "short") == 0)
            msg[9] = 3;
    }
    send_raw(msg, n);
}

/* fetchflood: fetches of an absent key as fast as the relay
 * reads them, for $FLOOD_SECONDS (default 10), reading none of its answers:
 * UCX sends each at once while the socket takes it, progressing only when a
 * send waits. Prints "sent N". */
static void fetch_flood(unsigned char *msg)
{
    const char *fs = getenv("FLOOD_SECONDS");
    time_t end = time(NULL) + (fs ? atoi(fs) : 10);
    uint64_t sent = 0;
    while (time(NULL) < end && !closed) {
        int n = wire_fetch(msg, 1000 + sent, "flood-absent-key");
        send_raw(msg, (size_t)n);
        sent++;
    }
    printf("sent %llu\n", (unsigned long long)sent);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    ucp_params_t params = {0};
    ucp_worker_params_t wp = {0};
    ucp_am_handler_param_t am = {0};
    ucp_ep_params_t epp = {0};
    struct shmb_error err = {0};
    struct addrinfo hints = {0}, *res = NULL;
    unsigned char msg[WIRE_MSG_MAX], mac[WIRE_MAC_LEN];
    char host[256], *colon;
    const char *mode;
    int n;

    if (argc != 4) {
        fprintf(stderr, "usage: relay-hostile-peer ADDR:PORT KEYFILE MODE\n");
        return 2;
    }
    mode = argv[3];
    snprintf(host, sizeof(host), "%s", argv[1]);
    colon = strrchr(host, ':');
    if (!colon)
        return 2;
    *colon = 0;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
        return 2;
    if (strcmp(mode, "tcpput") == 0 || strcmp(mode, "tcpconnreq") == 0 ||
        strcmp(mode, "tcpputack") == 0) {
        int rc = tcp_put(res, strcmp(mode, "tcpconnreq") == 0, strcmp(mode, "tcpputack") == 0);
        freeaddrinfo(res);
        return rc;
    }
    if (strncmp(mode, "tcpwireup-", 10) == 0 || strncmp(mode, "tcpcm-", 6) == 0) {
        int rc = mode[3] == 'w' ? tcp_wireup(res, mode + 10) : tcp_cm(res, mode + 6);
        freeaddrinfo(res);
        return rc;
    }
    if (auth_load_key(&relay, argv[2], &err) < 0) {
        fprintf(stderr, "%s\n", err.message);
        return 2;
    }
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    if (ucp_init(&params, NULL, &ctx) != UCS_OK)
        return 2;
    if (strcmp(mode, "serve-getrep") == 0) {
        if (!&ucp_am_handler_UCP_AM_ID_GET_REQ || !ucp_am_handler_UCP_AM_ID_GET_REQ.cb) {
            fprintf(stderr, "relay-hostile-peer: this UCX has no GET_REQ handler table\n");
            return 2;
        }
        ucx_get_req_cb = ucp_am_handler_UCP_AM_ID_GET_REQ.cb;
        ucp_am_handler_UCP_AM_ID_GET_REQ.cb = forge_get_rep;
    }
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK)
        return 2;
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = WIRE_AM_ID;
    am.cb = on_am;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucp_worker_set_am_recv_handler(worker, &am);
    if (strncmp(mode, "serve-", 6) == 0) {
        ucp_listener_params_t lp = {0};
        ucp_listener_h listener;
        lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                        UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
        lp.sockaddr.addr = res->ai_addr;
        lp.sockaddr.addrlen = res->ai_addrlen;
        lp.conn_handler.cb = on_conn;
        if (ucp_listener_create(worker, &lp, &listener) != UCS_OK)
            return 2;
        printf("listening\n");
        fflush(stdout);
        for (int i = 0; i < 60000 && !conn_req; i++) {
            while (ucp_worker_progress(worker))
                ;
            usleep(1000);
        }
        if (!conn_req)
            return 2;
        epp.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        epp.conn_request = conn_req;
    } else {
        epp.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        epp.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        /* A copy: the halfopen mode dials again after res is freed. */
        memcpy(&dial_sa, res->ai_addr, res->ai_addrlen);
        epp.sockaddr.addr = (struct sockaddr *)&dial_sa;
        epp.sockaddr.addrlen = res->ai_addrlen;
    }
    epp.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    epp.err_handler.cb = on_err;
    if (ucp_ep_create(worker, &epp, &ep) != UCS_OK)
        return 2;
    freeaddrinfo(res);
    if (strncmp(mode, "serve-", 6) == 0) {
        /* The relay dialled us: prove the key as the listener, wait for its
         * first fetch, answer it badly. */
        auth_nonce(my_nonce, sizeof(my_nonce));
        n = wire_hello(msg, my_nonce, "hostile");
        send_raw(msg, (size_t)n);
        progress_for(10000, &got_hello);
        auth_proof(&relay, false, their_nonce, my_nonce, mac);
        n = wire_auth(msg, mac);
        send_raw(msg, (size_t)n);
        if (strncmp(mode, "serve-q", 7) == 0) {
            struct wire_batch b;
            progress_for(30000, &got_qsub);
            if (!got_qsub)
                return 2;
            n = wire_qsub_reply(msg, qsub_id, 0, 0, 0, NULL);
            if (strcmp(mode, "serve-qaskreply") == 0)
                wire_ask_ack(msg); /* only a queue's messages may ask */
            send_raw(msg, (size_t)n);
            if (strcmp(mode, "serve-qask") == 0) {
                serve_qask(msg);
            } else if (strcmp(mode, "serve-qinpieces") == 0) {
                /* The first piece of a message, then a batch before its
                 * second piece. */
                send_raw(msg, (size_t)wire_qmsg(msg, qsub_id, 8, 0, "abcd", 4));
                wire_qbatch_begin(&b, msg, qsub_id);
                wire_qbatch_add(&b, "efgh", 4);
                wire_qbatch_add(&b, "ijkl", 4);
                send_raw(msg, wire_qbatch_end(&b));
            } else {
                /* serve-qflood: 3 batches of 64 without waiting for an
                 * acknowledgement, past the window of 128. */
                for (int k = 0; k < 3 && !closed; k++) {
                    wire_qbatch_begin(&b, msg, qsub_id);
                    for (int i = 0; i < WIRE_BATCH_MAX; i++)
                        wire_qbatch_add(&b, "flood", 5);
                    send_raw(msg, wire_qbatch_end(&b));
                    progress_for(300, NULL);
                }
            }
            progress_for(5000, NULL);
            printf("%s\n", closed ? "closed" : "kept");
            fflush(stdout);
            _exit(closed ? 0 : 1);
        }
        progress_for(30000, &got_fetch);
        if (!got_fetch)
            return 2;
        if (strcmp(mode, "serve-ctrltext") == 0) {
            /* The encoder replaces control bytes: put them back after it. */
            n = wire_fetch_reply(msg, fetch_id, -ENOENT, 0, 0, NULL, 0,
                                 "No object #[2J#]0;owned% here.");
            for (int i = 0; i < n; i++)
                if (msg[i] == '#')
                    msg[i] = 0x1b;
                else if (msg[i] == '%')
                    msg[i] = 0x07;
        } else if (strcmp(mode, "serve-getrep") == 0) {
            static char object[4096];
            ucp_mem_map_params_t mp = {0};
            ucp_mem_h mh;
            void *packed;
            size_t packed_len;
            memset(object, 'H', sizeof(object));
            mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
            mp.address = object;
            mp.length = sizeof(object);
            if (ucp_mem_map(ctx, &mp, &mh) != UCS_OK ||
                ucp_rkey_pack(ctx, mh, &packed, &packed_len) != UCS_OK)
                return 2;
            n = wire_fetch_reply(msg, fetch_id, 0, sizeof(object), (uint64_t)(uintptr_t)object,
                                 packed, packed_len, NULL);
        } else if (strcmp(mode, "serve-huge") == 0) {
            n = wire_fetch_reply(msg, fetch_id, 0, (uint64_t)1 << 62, 4096, "rkey", 4, NULL);
        } else {
            n = wire_fetch_reply(msg, fetch_id, 0, 65536, 4096, NULL, 0, NULL);
        }
        send_raw(msg, (size_t)n);
        if (strcmp(mode, "serve-shortpush") == 0)
            send_data(fetch_id, 4096, true);
        else if (strcmp(mode, "serve-eagerpush") == 0)
            send_data(fetch_id, 65536, false);
        progress_for(5000, NULL);
        if (strcmp(mode, "serve-getrep") == 0)
            printf("forged %d\n", forged);
        printf("%s\n", closed ? "closed" : "kept");
        fflush(stdout);
        _exit(closed ? 0 : 1);
    }

    if (strcmp(mode, "halfopen") == 0) {
        /* 300 connections from this address, each with a hello and never a
         * proof, held 5 s after "ready" (the relay's auth deadline). */
        static ucp_ep_h eps[300];
        for (int i = 0; i < 300; i++) {
            if (i > 0 && ucp_ep_create(worker, &epp, &eps[i]) != UCS_OK)
                break;
            if (i == 0)
                eps[0] = ep;
            ep = eps[i];
            auth_nonce(my_nonce, sizeof(my_nonce));
            n = wire_hello(msg, my_nonce, "halfopen");
            send_raw(msg, (size_t)n);
        }
        for (int ms = 0; ms < 6000; ms++) {
            while (ucp_worker_progress(worker))
                ;
            usleep(1000);
            if (ms == 1000) {
                printf("ready\n");
                fflush(stdout);
            }
        }
        _exit(0);
    }
    if (strcmp(mode, "garbage") == 0) {
        for (int i = 0; i < 64; i++)
            msg[i] = (unsigned char)(0xA5 ^ i);
        send_raw(msg, 64);
    } else {
        /* Say hello, prove the key (or another one), as a relay would. */
        auth_nonce(my_nonce, sizeof(my_nonce));
        n = wire_hello(msg, my_nonce, "hostile");
        send_raw(msg, (size_t)n);
        /* RELAY_HOSTILE_HELLO_MS: how long to wait for the relay's hello
         * (10 s; more where the relay is being flooded on purpose). */
        const char *hello_ms = getenv("RELAY_HOSTILE_HELLO_MS");
        progress_for(hello_ms ? atoi(hello_ms) : 10000, &got_hello);
        if (!got_hello) {
            fprintf(stderr, "relay-hostile-peer: no hello from the relay\n");
            return closed ? 0 : 2;
        }
        if (strcmp(mode, "unproven") == 0) {
            unproven_rma();
        }
        if (strcmp(mode, "early") == 0) {
            n = wire_fetch(msg, 1, "some-key");
            send_raw(msg, (size_t)n);
        } else {
            if (strcmp(mode, "wrongkey") == 0)
                relay.key[0] ^= 1;
            auth_proof(&relay, true, their_nonce, my_nonce, mac);
            n = wire_auth(msg, mac);
            send_raw(msg, (size_t)n);
            progress_for(3000, &got_auth);
            if (strcmp(mode, "huge") == 0) {
                size_t big = 1 << 20;
                unsigned char *b = calloc(1, big);
                b[0] = WIRE_FETCH;
                send_raw(b, big);
                free(b);
            } else if (strcmp(mode, "nonutf8") == 0) {
                unsigned char *o = msg;
                *o++ = WIRE_FETCH;
                memset(o, 0, 8), o[0] = 9, o += 8;
                *o++ = 4, *o++ = 0;
                *o++ = 0xff, *o++ = 0xfe, *o++ = 'k', *o++ = 0xc0;
                send_raw(msg, (size_t)(o - msg));
            } else if (strcmp(mode, "badlen") == 0) {
                unsigned char *o = msg;
                *o++ = WIRE_FETCH;
                memset(o, 0, 8), o += 8;
                *o++ = 0xff, *o++ = 0xff; /* 65535 bytes of key, 3 given */
                *o++ = 'a', *o++ = 'b', *o++ = 'c';
                send_raw(msg, (size_t)(o - msg));
            } else if (strcmp(mode, "stray") == 0) {
                n = wire_fetch_reply(msg, 424242, 0, UINT64_MAX / 2, 4096, "rk", 2, NULL);
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "qname") == 0) {
                /* A subscription to a queue whose name has a newline. */
                n = wire_qsub(msg, 7, 1, 2, "abcdef");
                msg[n - 3] = '\n';
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "qseats") == 0) {
                n = wire_qsub(msg, 7, 1, 2, "q");
                msg[9] = 5; /* seats 5 to 2 */
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "qpiece") == 0) {
                /* A piece of 4 bytes at offset 2^64-2 of a message of 8. */
                n = wire_qmsg(msg, 7, 8, 0, "abcd", 4);
                memset(msg + 17, 0xff, 8);
                msg[17] = 0xfe;
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "qstray") == 0) {
                n = wire_qsub_reply(msg, 99, 0, 0, 1, NULL);
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "holdpush") == 0) {
                ucp_am_handler_param_t dam = {0};
                dam.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
                dam.id = WIRE_DATA_AM_ID;
                dam.cb = on_data;
                ucp_worker_set_am_recv_handler(worker, &dam);
                n = wire_fetch(msg, 1, "rma-target");
                send_raw(msg, (size_t)n);
                progress_for(5000, &got_data);
                if (!got_data) {
                    fprintf(stderr, "relay-hostile-peer: no bytes announced\n");
                    _exit(2);
                }
                msg[0] = 200; /* a type no relay knows */
                send_raw(msg, 1);
                progress_for(3000, &closed);
                printf("%s\n", closed ? "closed" : "kept");
                fflush(stdout);
                sleep(5);
                _exit(closed ? 0 : 1);
            } else if (strcmp(mode, "hangpush") == 0) {
                /* Fetch, leave the bytes unreceived and stay: the relay's
                 * send never ends unless it gives up on this peer. */
                ucp_am_handler_param_t dam = {0};
                dam.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
                dam.id = WIRE_DATA_AM_ID;
                dam.cb = on_data;
                ucp_worker_set_am_recv_handler(worker, &dam);
                n = wire_fetch(msg, 1, "rma-target");
                send_raw(msg, (size_t)n);
                progress_for(5000, &got_data);
                if (!got_data) {
                    fprintf(stderr, "relay-hostile-peer: no bytes announced\n");
                    _exit(2);
                }
                printf("announced\n");
                fflush(stdout);
                progress_for(30000, &closed);
                printf("%s\n", closed ? "closed" : "kept");
                fflush(stdout);
                sleep(5);
                _exit(closed ? 0 : 1);
            } else if (strcmp(mode, "rmaput") == 0 || strcmp(mode, "rmaget") == 0 ||
                       strcmp(mode, "rmaread") == 0) {
                rma(mode);
            } else if (strncmp(mode, "qbatch-", 7) == 0) {
                qbatch(msg, mode + 7);
            } else if (strcmp(mode, "qaskbad") == 0) {
                /* A fetch that asks for an acknowledgement: only a queue's
                 * messages may. */
                n = wire_fetch(msg, 1, "some-key");
                wire_ask_ack(msg);
                send_raw(msg, (size_t)n);
            } else if (strcmp(mode, "qnagle") == 0) {
                qnagle(msg);
            } else if (strcmp(mode, "fetchflood") == 0) {
                fetch_flood(msg);
            } else if (strcmp(mode, "qnoqueue") == 0) {
                /* A fair request for a queue that does not exist: answered. */
                n = wire_qsub(msg, 7, 0, 1, "no-such-queue");
                send_raw(msg, (size_t)n);
            }
        }
    }
    progress_for(5000, NULL);
    printf("%s\n", closed ? "closed" : "kept");
    fflush(stdout);
    /* The endpoint may be half-closed by the relay: leave without tearing
     * UCX down (what it holds is not this test's subject). */
    _exit(closed ? 0 : 1);
}
