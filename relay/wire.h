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

#define WIRE_AM_ID 7           /* the one active message id relays use */
#define WIRE_VERSION 1
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
    WIRE_FETCH_REPLY = 4,/* id, code, size, addr, rkey, text */
    WIRE_FETCH_DONE = 5, /* id: I read it (or gave up); unpin it */
};

/* A message decoded from a peer, queued from progress to the loop. */
struct wire_msg {
    STAILQ_ENTRY(wire_msg) link;
    ucp_ep_h ep;       /* who sent it */
    size_t wire_len;   /* its length on the wire */
    uint8_t type;
    uint8_t version;
    uint64_t id;
    int32_t code;      /* FETCH_REPLY: 0 or a negative errno */
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

#endif
