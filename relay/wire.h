// SPDX-License-Identifier: Apache-2.0
/*
 * The bytes between relays: one UCP active message (id WIRE_AM_ID) per
 * message, a type byte first, integers little-endian. Decoding checks every
 * length against its bound and every key as the daemon checks a client's: a
 * peer's message is hostile input. Knows nothing about endpoints or the daemon.
 */
#ifndef SHMB_RELAY_WIRE_H
#define SHMB_RELAY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <ucp/api/ucp.h>

#include "../client/shmbroker.h"
#include "../proto/error.h"

#define WIRE_AM_ID 7           /* the relays' messages */
#define WIRE_DATA_AM_ID 8      /* an object's bytes, pushed by rendezvous (see below) */
#define WIRE_DATA_HEADER_LEN 8 /* its header: the fetch's id */
/* 2: objects are pushed where the transport has no RMA; queues' batches
 * (WIRE_QBATCH). 3: a queue's messages are acknowledged when their sender
 * asks (WIRE_ASK_ACK) or half the window waits, not after each publish. */
#define WIRE_VERSION 3
#define WIRE_NONCE_LEN 32
#define WIRE_MAC_LEN 32        /* HMAC-SHA256 */
#define WIRE_NAME_MAX 64
#define WIRE_RKEY_MAX 4096     /* a packed rkey: tens of bytes over TCP, some hundred with RDMA */
#define WIRE_TEXT_MAX 512      /* an error's message */
#define WIRE_MSG_MAX 8192      /* no message is longer: anything longer is an attack */

enum wire_type {
    WIRE_HELLO = 1,      /* version, nonce, name */
    WIRE_AUTH = 2,       /* mac */
    WIRE_FETCH = 3,      /* id, key: pin key and tell me where it is */
    WIRE_FETCH_REPLY = 4,/* id, code, size, addr, rkey, text; no rkey: the bytes follow
                          * as one WIRE_DATA_AM_ID message (the endpoint has no RMA) */
    WIRE_FETCH_DONE = 5, /* id: I read it (or gave up); unpin it */
    WIRE_QSUB = 6,       /* id, seat_from, seat_to, queue: take a reader seat for my host */
    WIRE_QSUB_REPLY = 7, /* id, code, missed, seat, text */
    WIRE_QMSG = 8,       /* id, total, offset, bytes: a piece of the stream's next message */
    WIRE_QACK = 9,       /* id, count: messages published here so far */
    WIRE_QEND = 10,      /* id, code, text: the stream ended (the writer left, shut down) */
    WIRE_QUNSUB = 11,    /* id, code, text: the subscriber's end failed; let go of its seats */
    WIRE_QBATCH = 12,    /* id, count, bytes, count x (len, bytes): the stream's next
                          * messages, each whole, in order */
};

#define WIRE_QUEUE_NAME_MAX 32 /* a queue's name, as the daemon's */
#define WIRE_QSEATS_MAX 64     /* a queue's seats, as the daemon's */
#define WIRE_CHUNK_MAX WIRE_RKEY_MAX /* a message's bytes per QMSG (into wire_msg.rkey) */
/* A batch: small messages that were waiting together, sent as one active
 * message (one send, one wake-up each side). Its items, each a 2-byte
 * length and the bytes, fill wire_msg.rkey as a QMSG's piece does. */
#define WIRE_BATCH_MAX 64      /* messages in one batch: half the relay's window */
#define WIRE_BATCH_BYTES WIRE_CHUNK_MAX /* their lengths and bytes, all told */
/* On the type byte of a QMSG's last piece or a QBATCH: acknowledge these
 * once published (wire_msg.ask_ack); on any other type it is refused. */
#define WIRE_ASK_ACK 0x80

/* A message decoded from a peer, queued from progress to the loop. */
struct wire_msg {
    STAILQ_ENTRY(wire_msg) link;
    ucp_ep_h ep;       /* who sent it */
    size_t wire_len;   /* its length on the wire */
    uint8_t type;
    uint8_t version;
    bool ask_ack;      /* QMSG, QBATCH: their sender asks for an acknowledgement */
    uint64_t id;
    int32_t code;      /* FETCH_REPLY, QSUB_REPLY, QEND: 0 or a negative errno */
    /* FETCH_REPLY: size, addr; QSUB: seat_from, seat_to; QSUB_REPLY: missed,
     * seat; QMSG: total, offset (its bytes in rkey, rkey_len of them);
     * QACK: count; QBATCH: size is the count, the items in rkey (rkey_len
     * bytes, checked to hold exactly that many: wire_qbatch_next). */
    uint64_t size, addr;
    uint16_t rkey_len;
    unsigned char nonce[WIRE_NONCE_LEN];
    unsigned char mac[WIRE_MAC_LEN];
    char name[WIRE_NAME_MAX + 1];
    char key[SHMB_KEY_MAX_LEN + 1];
    char text[WIRE_TEXT_MAX + 1];
    unsigned char rkey[WIRE_RKEY_MAX];
};

/* Decode len bytes into m: 0, or -EPROTO with what is wrong in err. */
int wire_decode(const void *buf, size_t len, struct wire_msg *m, struct shmb_error *err);

/* Encoders: the message into out (WIRE_MSG_MAX bytes); its length, or
 * -EINVAL when a field is over its bound. */
int wire_hello(unsigned char *out, const unsigned char *nonce, const char *name);
int wire_auth(unsigned char *out, const unsigned char *mac);
int wire_fetch(unsigned char *out, uint64_t id, const char *key);
int wire_fetch_reply(unsigned char *out, uint64_t id, int32_t code, uint64_t size,
                     uint64_t addr, const void *rkey, size_t rkey_len, const char *text);
int wire_fetch_done(unsigned char *out, uint64_t id);
/* The header of an object's bytes (WIRE_DATA_AM_ID): its fetch's id. */
void wire_data_header(unsigned char out[WIRE_DATA_HEADER_LEN], uint64_t id);
int wire_data_decode(const void *header, size_t len, uint64_t *id, struct shmb_error *err);
int wire_qsub(unsigned char *out, uint64_t id, unsigned seat_from, unsigned seat_to,
              const char *queue);
int wire_qsub_reply(unsigned char *out, uint64_t id, int32_t code, uint64_t missed,
                    unsigned seat, const char *text);
int wire_qmsg(unsigned char *out, uint64_t id, uint64_t total, uint64_t offset,
              const void *bytes, size_t n);
int wire_qack(unsigned char *out, uint64_t id, uint64_t count);
int wire_qend(unsigned char *out, uint64_t id, int32_t code, const char *text);
int wire_qunsub(unsigned char *out, uint64_t id, int32_t code, const char *text);
/* A batch being encoded into out (WIRE_MSG_MAX bytes): begin, add while
 * wire_qbatch_add says 0 (-ENOSPC: full, send it and begin another), end
 * gives its length. */
struct wire_batch {
    unsigned char *out;
    size_t len;
    unsigned count;
};
void wire_qbatch_begin(struct wire_batch *b, unsigned char *out, uint64_t id);
int wire_qbatch_add(struct wire_batch *b, const void *bytes, size_t n);
size_t wire_qbatch_end(struct wire_batch *b);
/* Ask for an acknowledgement with the encoded QMSG or QBATCH msg. */
void wire_ask_ack(unsigned char *msg);
/* The next item of a decoded batch from *off (0 first): its bytes and
 * length; false past the last. */
bool wire_qbatch_next(const struct wire_msg *m, size_t *off, const unsigned char **bytes,
                      size_t *n);
/* A queue's name as the daemon takes it: 1 to 32 of A-Z a-z 0-9 _ -. */
bool wire_queue_name_ok(const char *s, size_t n);
/* Whether a message of type is one of the queues' (forward.c's). */
bool wire_is_queue(unsigned type);

#endif
