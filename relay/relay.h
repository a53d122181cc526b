// SPDX-License-Identifier: Apache-2.0
/*
 * shmbroker-relay: carries objects between hosts' brokers over UCX. What the
 * relay's rooms share: the relay itself (its loop, its UCP worker, its one
 * handle on the local daemon), its peers and the transfers under way.
 * main.c owns flags and the loop, peer.c the UCP worker and the endpoints,
 * auth.c the pre-shared key, wire.c the bytes between relays, fetch.c the
 * transfers, local.c the Unix socket clients and the ctl ask through, log.c
 * the clock and the log. Floors (docs/architecture.md): peer.c and local.c
 * carry bytes and call nothing above them; what arrives goes up through the
 * hooks main.c fills in (struct relay_hooks), as the daemon's store tells its
 * owner through store_config.lease_expired.
 */
#ifndef SHMB_RELAY_H
#define SHMB_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <jansson.h>
#include <ucp/api/ucp.h>
#include <uv.h>

#include "../client/shmbroker.h"
#include "../proto/error.h"
#include "log.h"
#include "wire.h"

#define RELAY_NAME_MAX 64        /* a peer's name: a host name fits */
#define RELAY_KEY_MIN 16         /* a pre-shared key shorter than this is guessable */
#define RELAY_KEY_MAX 4096       /* a key file longer than this is not a key */
#define RELAY_PEERS_MAX 64       /* peers named in flags and the peers file */
#define RELAY_INBOUND_MAX 256    /* connections accepted from other relays at once */
#define RELAY_UNPROVEN_PER_HOST 16 /* of those, from one address and not yet proved: a
                                    * relay needs one, more is someone filling the rest */
#define RELAY_AUTH_MS 5000       /* a connection that has not proved the key by then goes */
#define RELAY_RETRY_MS 1000      /* a peer that cannot be reached is tried again this often */
#define RELAY_DRAIN_MS 20        /* UCX's progress and its messages before the loop hears its
                                  * other handles (a peer's flood had them wait for its end) */
#define RELAY_DAEMON_RETRY_MS 200 /* a daemon that went is connected to again this often */
#define RELAY_SERVED_MAX 256     /* objects one peer may hold pinned here at once */
#define RELAY_LOCAL_MAX 256      /* local clients at once */
#define RELAY_LOCAL_LINE 4096    /* a local request is small; longer is a bug */
#define RELAY_TRANSFERS_MAX 1024 /* transfers under way at once */
#define RELAY_FETCH_TIMEOUT_MS 30000 /* a peer that answers no fetch in 30 s is stuck */
#define FETCH_WAITING_MAX 64 /* fetches one local client may wait for at once */
#define RELAY_ALLOW_MAX 64 /* --allow-from ranges: a longer list is a network, one prefix */

struct relay;
struct transfer;

/* One pin this relay holds for a peer (it read the object, or we send it its
 * bytes): released when the peer says it is done, or when the peer goes, and
 * in either case not before our send of its bytes has ended. */
struct served {
    LIST_ENTRY(served) link;
    struct relay *relay;
    uint64_t id;
    uint64_t addr, size; /* where the object lies in our mapping */
    char key[SHMB_KEY_MAX_LEN + 1];
    bool sending;        /* its bytes are on their way (UCX reads the pool) */
    bool done;           /* the peer said done while they were */
    bool ended;          /* the send ended; fetch_poll has not looked yet */
    uint64_t deadline_ms; /* the send must end by then, or the peer is closed */
    ucs_status_t push_status;
    unsigned char header[WIRE_DATA_HEADER_LEN]; /* of the send: UCX reads it until the end */
};

/* An object's bytes announced by a peer (WIRE_DATA_AM_ID), received during
 * progress and handed up after it: desc is UCX's, to receive into place or
 * release. */
struct wire_data {
    STAILQ_ENTRY(wire_data) link;
    ucp_ep_h ep;
    uint64_t id;
    size_t length;
    void *desc;            /* NULL when the message was refused (error says why) */
    char error[256];
};

enum peer_state {
    PEER_IDLE,       /* configured, no endpoint (waiting to retry) */
    PEER_CONNECTING, /* endpoint made, key not yet proved both ways */
    PEER_READY,      /* both sides proved the key */
    PEER_CLOSING,    /* to be closed at the next turn of the loop */
};

/* A relay on the other end: one we dial (configured, with a name) or one
 * that dialled us (inbound, named by its hello). */
struct peer {
    LIST_ENTRY(peer) link;
    struct relay *relay;
    bool configured;
    char name[RELAY_NAME_MAX + 1];   /* ours for it (configured) or its hello's */
    char address[96];                /* ADDR:PORT as given, or as seen */
    char host[64];                   /* dialled us: the address it came from */
    struct sockaddr_storage sa;      /* configured: where to dial */
    socklen_t sa_len;
    ucp_ep_h ep;
    enum peer_state state;
    uint64_t deadline_ms;            /* auth deadline (CONNECTING) or retry time (IDLE) */
    unsigned char my_nonce[WIRE_NONCE_LEN];
    unsigned char their_nonce[WIRE_NONCE_LEN];
    bool sent_hello, got_hello, sent_auth, got_auth;
    char hello_name[RELAY_NAME_MAX + 1];
    /* Counters for status. */
    uint64_t bytes_in, bytes_out, msgs_in, msgs_out;
    uint64_t fetches_served, transfers;
    char last_error[256];
    LIST_HEAD(, served) served;
    unsigned nserved;
};

/* An address range the listener admits (--allow-from ADDR[/PREFIX]): the
 * first prefix bits of addr, AF_INET (4 bytes) or AF_INET6 (16). */
struct allow_range {
    int family;
    unsigned char addr[16];
    unsigned prefix;
};

/* One local client of the relay's Unix socket. */
struct local_client {
    LIST_ENTRY(local_client) link;
    struct relay *relay;
    uv_pipe_t pipe;
    char buf[RELAY_LOCAL_LINE];
    size_t len;
    bool closing;
    unsigned waiting; /* fetches this client waits for */
    uid_t uid;        /* its credentials, from the socket */
    bool admitted;    /* the daemon admits its uid (relay_hooks.local_admit) */
};

/* What the transport rooms (peer.c, local.c) hand up to the rooms above
 * them: main.c fills these in before the loop runs. Each is called from the
 * loop, never from inside UCX's progress. */
struct relay_hooks {
    /* A message from a peer that proved the key, other than hello and auth. */
    void (*peer_message)(struct peer *p, const struct wire_msg *m);
    /* p proved the key both ways: it may carry work now. */
    void (*peer_ready)(struct peer *p);
    /* p's endpoint is about to close: whatever it held or waited for goes. */
    void (*peer_gone)(struct peer *p);
    /* Work that finished inside progress (relay.work_due) is to be looked at. */
    void (*work_due)(struct relay *r);
    /* The earliest deadline of the rooms above (UINT64_MAX: none), and the
     * expiry of those due. */
    uint64_t (*next_deadline)(const struct relay *r);
    void (*expire)(struct relay *r);
    /* A local request other than status: its op and the parsed line
     * (borrowed); the callee answers with local_reply or local_reply_error. */
    void (*local_request)(struct local_client *lc, const char *op, json_t *req);
    /* Whether a local client of uid may use the relay: 0, or -EPERM with
     * why in err. The relay's socket has the daemon socket's mode, but the
     * daemon may admit fewer (--allow-uid, --allow-gid, a pool's group). */
    int (*local_admit)(struct relay *r, uid_t uid, struct shmb_error *err);
    /* A ready peer's object bytes for fetch id: length of them waiting in
     * desc, which the callee owns (ucp_am_recv_data_nbx into place, or
     * ucp_am_data_release). */
    void (*peer_data)(struct peer *p, uint64_t id, size_t length, void *desc);
    /* lc is closing: whatever waits for it forgets it. */
    void (*local_gone)(struct local_client *lc);
    /* The status fields of the rooms above, added to the status reply. */
    void (*status)(const struct relay *r, json_t *reply);
};

struct relay {
    uv_loop_t *loop;
    struct relay_hooks hooks;
    /* Flags. */
    char name[RELAY_NAME_MAX + 1];
    const char *daemon_socket;
    char local_path[108];
    const char *listen_addr;
    unsigned char key[RELAY_KEY_MAX];
    size_t key_len;
    uint64_t max_object; /* largest object a peer may make us allocate */
    uint64_t fetch_timeout_ms; /* a peer's answer to a fetch must come by then */
    /* Who may connect to the listener besides the configured peers. */
    struct allow_range allow[RELAY_ALLOW_MAX];
    unsigned nallow;
    /* The configured peers' addresses, as resolved at start: fixed before
     * UCX starts, since UCX's own thread reads them (peer.c's accept). */
    struct allow_range peer_ips[RELAY_PEERS_MAX];
    unsigned npeer_ips;
    /* The local daemon. */
    shmb_t *c;
    ucp_mem_h pool_memh; /* the daemon's mapping, registered once */
    void *pool_base;
    size_t pool_size;
    void *pool_rkey;     /* its packed rkey, sent with each object served */
    size_t pool_rkey_len;
    /* UCX. */
    ucp_context_h ctx;
    ucp_worker_h worker;
    bool worker_mt;      /* it takes calls from any thread (queues' stream threads send) */
    ucp_listener_h listener;
    int efd;
    uv_poll_t efd_poll;
    uv_prepare_t drain;
    uv_timer_t timer;
    uv_signal_t sigterm, sigint;
    uv_pipe_t local;
    bool local_open;
    bool stopping;
    /* Messages received during progress, handled after it (wire.h). */
    STAILQ_HEAD(, wire_msg) inbox;
    STAILQ_HEAD(, wire_data) data_inbox;
    LIST_HEAD(, peer) peers;
    unsigned ninbound;
    uint64_t refused; /* connections refused: bad key, garbage, too many, not allowed */
    LIST_HEAD(, local_client) clients;
    unsigned nclients;
    LIST_HEAD(, transfer) transfers;
    LIST_HEAD(, served) orphans; /* pins of peers gone whose bytes are still being sent */
    unsigned ntransfers;
    bool work_due; /* work finished inside progress (a get): hooks.work_due */
    uint64_t next_id;
    bool drain_cut; /* peer.c's drain stopped for the loop to turn: its timer runs in 1 ms
                     * (libuv 1.44 runs one of 0 restarted in its callback again at once) */
    /* The daemon's connection, watched so that its end is seen at once
     * (fetch.c): transfers into the pool are cut before it is used again. */
    uv_poll_t *daemon_watch;
    bool daemon_cut;     /* it went; reconnect once nothing moves in the pool */
    bool cutting;        /* inside fetch_daemon_cut */
    uint64_t daemon_retry_ms; /* daemon_cut: no connect again before then (timer) */
    struct forward *fwd; /* forward.c's: the queues' streams */
};

/* auth.c: the pre-shared key. */
int auth_load_key(struct relay *r, const char *path, struct shmb_error *err);
int auth_nonce(unsigned char *out, size_t len);
/* The proof a side gives: HMAC-SHA256 over who it is (dialler or listener)
 * and both nonces. */
void auth_proof(const struct relay *r, bool dialler, const unsigned char *their_nonce,
                const unsigned char *my_nonce, unsigned char out[WIRE_MAC_LEN]);
bool auth_check(const struct relay *r, bool dialler, const unsigned char *their_nonce,
                const unsigned char *my_nonce, const unsigned char mac[WIRE_MAC_LEN]);

/* admit.c: who may connect. */
/* Admit ADDR[/PREFIX] too (--allow-from), checked as hostile text: 0, or
 * -EINVAL/-E2BIG with what is wrong in err. */
int admit_allow_from(struct relay *r, const char *text, struct shmb_error *err);
/* Fix the configured peers' addresses and start closing, at accept(), the
 * connections from addresses not admitted: before UCX starts. */
void admit_start(struct relay *r);

/* tcp_guard.c: UCX 1.13's TCP transport parsed on the way in (recv()), so
 * that its put requests land only in ranges the relay posted. */
#define TCP_GUARD_FDS 4096 /* descriptors guarded: the relay holds a few hundred */
enum tcp_stream_state {
    TCP_STREAM_UNTRACKED, /* not a TCP stream UCX accepted or dialled */
    TCP_STREAM_MAGIC,     /* accepted: the transport's magic number is due */
    TCP_STREAM_DIALLED,   /* dialled, nothing sent yet: the first send tells */
    TCP_STREAM_FRAMES,    /* the transport: messages, put requests and their bytes */
    TCP_STREAM_PASS,      /* not the transport (the sockaddr listener's own) */
    TCP_STREAM_REFUSED,   /* cut: every receive fails as a reset connection */
};
/* What this process sent on the stream: its own put requests, whose acks
 * may come back. */
struct tcp_stream_tx {
    unsigned have;                /* bytes of hdr held */
    unsigned char hdr[5 + 20];    /* the AM header, and a put request's body */
    uint64_t magic_left, skip;    /* bytes still to pass: the magic number, a body */
    uint32_t put_sn;              /* the last put request's number */
    bool awaiting;                /* its ack has not come */
};
struct tcp_stream {
    enum tcp_stream_state state;
    struct tcp_stream_tx tx;
    bool fed;                   /* bytes arrived before any was sent */
    unsigned addr_len;          /* its family's sockaddr: 16 (IPv4) or 28 (IPv6) */
    unsigned have;              /* bytes of hdr held */
    unsigned char hdr[5 + 64];  /* the AM header, and a put request's or CM packet's body */
    uint64_t skip;              /* bytes of a message still to pass unread */
    uint64_t put_addr, put_left; /* an admitted put's bytes still to come, and where */
};
void tcp_stream_init(struct tcp_stream *s, enum tcp_stream_state state);
/* n more bytes of s: 0, or -1 with why when they complete a message that is
 * refused (s is then TCP_STREAM_REFUSED). */
int tcp_stream_feed(struct tcp_stream *s, const unsigned char *p, size_t n, char *why,
                    size_t whylen);
/* n bytes this process sent on s (its put requests, for the acks). */
void tcp_stream_sent(struct tcp_stream *s, const unsigned char *p, size_t n);
/* UCX_TCP_RX_SEG_SIZE less the AM header: the longest message UCX can hold;
 * and that setting's value read from text (NULL: unset) as UCX reads it. */
size_t tcp_guard_am_max(void);
size_t tcp_guard_rx_seg(const char *v);
/* Peers may put into [ptr, ptr + len) until owner unposts it (which cuts a
 * put under way into it). */
void tcp_guard_post(const void *owner, const void *ptr, size_t len);
void tcp_guard_unpost(const void *owner);
/* Put requests let through so far. */
uint64_t tcp_guard_puts_allowed(void);
/* An accepted connection is to be parsed: 0, or -EMFILE when fd is past
 * TCP_GUARD_FDS (the caller closes it). */
int tcp_guard_accepted(int fd);
/* Cut the stream of the transport whose message this thread is handling:
 * its descriptor, or -1 when there is none (not TCP). */
int tcp_guard_cut_receiving(void);
/* Whether a WIREUP of type naming our endpoint dst fits what this process
 * sent from it over the transport (true when it came over another). */
bool tcp_guard_wireup_fits(unsigned type, uint64_t dst);

/* ucx_guard.c: UCX 1.13's handlers of emulated RMA replaced by ones that
 * drop every emulated write, read and read reply (the relay makes and
 * answers none), and its WIREUP handler wrapped in a check of what UCX
 * asserts on; another UCX version is left alone, and the relay says so. */
void ucx_guard_emulated_rma(void);
/* 0 when UCX 1.13 may read the worker address a sockaddr connection
 * request (from client, as UCX told it: host and port) carries; else
 * -EINVAL, logged and counted as a refusal. */
int ucx_guard_conn_request(ucp_conn_request_h req, const struct sockaddr_storage *client,
                           const char *host, const char *port);
/* Whether a connection from sa is admitted (a peer's address, or in a range). */
bool admit_address(const struct relay *r, const struct sockaddr_storage *sa);
/* The connections accept() closed since the last call (UCX's thread counts them). */
uint64_t admit_take_refused(void);

/* peer.c: the UCP worker, its loop integration, endpoints. */
int peer_setup(struct relay *r, struct shmb_error *err);
void peer_teardown(struct relay *r);
int peer_add_configured(struct relay *r, const char *name, const char *addr,
                        struct shmb_error *err);
struct peer *peer_find(struct relay *r, const char *name);

/* Send one message to p (copied; freed when UCX is done with it). */
int peer_send(struct peer *p, const void *msg, size_t len);
/* The same on an endpoint, from any thread when relay.worker_mt (the caller
 * keeps ep open meanwhile): 0, -ENOMEM, or -ECONNRESET with UCX's status
 * (the loop learns of the failure from the endpoint's error). Counts nothing. */
int peer_send_ep(ucp_ep_h ep, const void *msg, size_t len, ucs_status_t *status);
/* Something p did is not allowed: say why in the log and close it. */
void peer_fail(struct peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void peer_kick(struct relay *r);
void peer_close_failed(struct relay *r);
/* Whether p's endpoint reads by RMA in the transport (RDMA verbs, shared
 * memory): false where UCX would emulate it with messages (TCP). */
bool peer_has_rma(struct peer *p);

/* fetch.c: both ends of a fetch. */
int fetch_register_pool(struct relay *r, struct shmb_error *err);
void fetch_unregister_pool(struct relay *r);
void fetch_watch_daemon(struct relay *r);
void fetch_unwatch_daemon(struct relay *r);
int fetch_start(struct relay *r, struct local_client *lc, const char *peer, const char *key);
/* A local {"op":"fetch","peer":P,"key":K}: checked, then started. */
void fetch_local_request(struct local_client *lc, json_t *req);
void fetch_on_request(struct peer *p, const struct wire_msg *m);
void fetch_on_reply(struct peer *p, const struct wire_msg *m);
void fetch_on_done(struct peer *p, const struct wire_msg *m);
void fetch_poll(struct relay *r);
void fetch_peer_gone(struct peer *p);
void fetch_client_gone(struct relay *r, struct local_client *lc);
int fetch_admit(struct relay *r, uid_t uid, struct shmb_error *err);
void fetch_on_data(struct peer *p, uint64_t id, size_t length, void *desc);
/* When the next transfer is due (UINT64_MAX: none), and failing those due:
 * an unanswered request fails with ETIMEDOUT, a read that does not end closes
 * the peer's connection. */
uint64_t fetch_next_deadline(const struct relay *r);
void fetch_expire(struct relay *r);
/* Local clients waiting for transfers, all told (for status). */
unsigned fetch_waiters(const struct relay *r);

/* forward.c: queues with readers on other hosts. */
int forward_setup(struct relay *r, struct shmb_error *err);
void forward_teardown(struct relay *r);
void forward_on_message(struct peer *p, const struct wire_msg *m);
void forward_peer_gone(struct peer *p);
void forward_local_subscribe(struct local_client *lc, json_t *req);
void forward_local_state(struct local_client *lc, json_t *req);
void forward_client_gone(struct local_client *lc);
void forward_status(const struct relay *r, json_t *reply);

/* local.c: the relay's Unix socket. */
int local_listen(struct relay *r, struct shmb_error *err);
void local_close_all(struct relay *r);
/* Answer lc: a line of JSON (the string is borrowed). */
void local_reply(struct local_client *lc, const char *line);
/* Answer lc with reply (stolen; NULL when it could not be made), or with
 * ENOMEM when it cannot be written out. */
void local_reply_json(struct local_client *lc, json_t *reply);
void local_reply_error(struct local_client *lc, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
