// SPDX-License-Identifier: Apache-2.0
/*
 * The relays' messages, encoded and decoded with every bound checked (wire.h).
 * Knows nothing about endpoints, peers or the daemon.
 */
#include <errno.h>
#include <string.h>

#include "../proto/text.h"
#include "../proto/utf8.h"
#include "wire.h"

/* A reader over a peer's bytes: each take fails once the bytes run out. */
struct reader {
    const unsigned char *p;
    size_t left;
    bool short_read;
};

static uint64_t take_u(struct reader *rd, unsigned n)
{
    uint64_t v = 0;
    if (rd->left < n) {
        rd->short_read = true;
        rd->left = 0;
        return 0;
    }
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)rd->p[i] << (8 * i);
    rd->p += n;
    rd->left -= n;
    return v;
}

static bool take_bytes(struct reader *rd, void *out, size_t n)
{
    if (rd->left < n) {
        rd->short_read = true;
        rd->left = 0;
        return false;
    }
    memcpy(out, rd->p, n);
    rd->p += n;
    rd->left -= n;
    return true;
}

static unsigned char *put_u(unsigned char *o, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        o[i] = (unsigned char)(v >> (8 * i));
    return o + n;
}

static unsigned char *put_bytes(unsigned char *o, const void *b, size_t n)
{
    if (n)
        memcpy(o, b, n);
    return o + n;
}

/* A name is a host name's characters: nothing a log or a terminal would
 * take for something else. */
static bool name_ok(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
            return false;
    }
    return true;
}

bool wire_queue_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > WIRE_QUEUE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '-' || ch == '_'))
            return false;
    }
    return true;
}

/* An error text: UTF-8 without control bytes (it reaches a user's terminal),
 * and a code of 0 or -1..-4095. */
static int take_text(struct reader *rd, struct wire_msg *m, struct shmb_error *err)
{
    size_t n = (size_t)take_u(rd, 2);
    if (n > WIRE_TEXT_MAX)
        return shmb_error_set(err, -EPROTO, "an error text of %zu bytes (at most %d)", n,
                              WIRE_TEXT_MAX);
    if (take_bytes(rd, m->text, n) && shmb_utf8_invalid_at(m->text, n) != n)
        return shmb_error_set(err, -EPROTO, "an error text that is not UTF-8");
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)m->text[i] < 0x20 || m->text[i] == 0x7f)
            return shmb_error_set(err, -EPROTO,
                                  "an error text with a control byte (%#x at %zu)",
                                  (unsigned)(unsigned char)m->text[i], i);
    if (m->code > 0 || m->code < -4095)
        return shmb_error_set(err, -EPROTO, "a reply code of %ld (0 or -1..-4095)",
                              (long)m->code);
    return 0;
}

/* The queues' messages (forward.c). */
static int decode_queue(struct reader *rd, struct wire_msg *m, struct shmb_error *err)
{
    size_t n;
    m->id = take_u(rd, 8);
    switch (m->type) {
    case WIRE_QSUB:
        m->size = take_u(rd, 1);
        m->addr = take_u(rd, 1);
        n = (size_t)take_u(rd, 1);
        if (take_bytes(rd, m->key, n <= WIRE_QUEUE_NAME_MAX ? n : 0) &&
            !wire_queue_name_ok(m->key, n))
            return shmb_error_set(err, -EPROTO, "a queue name that is not 1 to %d of "
                                  "A-Z a-z 0-9 _ - (%zu bytes)", WIRE_QUEUE_NAME_MAX, n);
        if (m->size >= m->addr || m->addr > WIRE_QSEATS_MAX)
            return shmb_error_set(err, -EPROTO, "seats %llu to %llu (0 <= from < to <= %d)",
                                  (unsigned long long)m->size, (unsigned long long)m->addr,
                                  WIRE_QSEATS_MAX);
        return 0;
    case WIRE_QSUB_REPLY:
        m->code = (int32_t)(uint32_t)take_u(rd, 4);
        m->size = take_u(rd, 8);
        m->addr = take_u(rd, 1);
        return take_text(rd, m, err);
    case WIRE_QMSG:
        m->size = take_u(rd, 8);
        m->addr = take_u(rd, 8);
        m->rkey_len = (uint16_t)take_u(rd, 2);
        if (m->rkey_len > WIRE_CHUNK_MAX || m->addr > m->size ||
            m->rkey_len > m->size - m->addr || (m->rkey_len == 0 && m->size != 0))
            return shmb_error_set(err, -EPROTO, "a piece of %u bytes at %llu of a message of "
                                  "%llu (pieces of 1 to %d bytes within the message)",
                                  (unsigned)m->rkey_len, (unsigned long long)m->addr,
                                  (unsigned long long)m->size, WIRE_CHUNK_MAX);
        take_bytes(rd, m->rkey, m->rkey_len);
        return 0;
    case WIRE_QACK:
        m->size = take_u(rd, 8);
        return 0;
    case WIRE_QBATCH: {
        m->size = take_u(rd, 2);
        n = (size_t)take_u(rd, 2);
        if (m->size == 0 || m->size > WIRE_BATCH_MAX || n > WIRE_BATCH_BYTES)
            return shmb_error_set(err, -EPROTO, "a batch of %llu messages in %zu bytes (1 "
                                  "to %d messages, at most %d bytes)",
                                  (unsigned long long)m->size, n, WIRE_BATCH_MAX,
                                  WIRE_BATCH_BYTES);
        if (!take_bytes(rd, m->rkey, n))
            return 0; /* cut short: said by the caller */
        m->rkey_len = (uint16_t)n;
        /* Every length within the bytes, and the count of them exactly. */
        size_t off = 0, items = 0;
        while (off < n) {
            size_t len;
            if (n - off < 2)
                return shmb_error_set(err, -EPROTO, "a batch whose item %zu has half a "
                                      "length (at byte %zu of %zu)", items, off, n);
            len = (size_t)m->rkey[off] | (size_t)m->rkey[off + 1] << 8;
            if (len > n - off - 2)
                return shmb_error_set(err, -EPROTO, "a batch whose item %zu of %zu bytes "
                                      "overruns it (at byte %zu of %zu)", items, len, off,
                                      n);
            off += 2 + len;
            items++;
        }
        if (items != m->size)
            return shmb_error_set(err, -EPROTO, "a batch that says %llu messages and holds "
                                  "%zu", (unsigned long long)m->size, items);
        return 0;
    }
    default: /* WIRE_QEND, WIRE_QUNSUB */
        m->code = (int32_t)(uint32_t)take_u(rd, 4);
        return take_text(rd, m, err);
    }
}

int wire_decode(const void *buf, size_t len, struct wire_msg *m, struct shmb_error *err)
{
    struct reader rd = {.p = buf, .left = len};
    size_t n;

    memset(m, 0, offsetof(struct wire_msg, rkey));
    m->wire_len = len;
    if (len > WIRE_MSG_MAX)
        return shmb_error_set(err, -EPROTO, "a message of %zu bytes (at most %d)", len,
                              WIRE_MSG_MAX);
    m->type = (uint8_t)take_u(&rd, 1);
    if (m->type & WIRE_ASK_ACK) {
        m->type &= (uint8_t)~WIRE_ASK_ACK;
        m->ask_ack = true;
        if (m->type != WIRE_QMSG && m->type != WIRE_QBATCH)
            return shmb_error_set(err, -EPROTO, "a message of type %u asking for an "
                                  "acknowledgement (only queue messages may)",
                                  (unsigned)m->type);
    }
    switch (m->type) {
    case WIRE_HELLO:
        m->version = (uint8_t)take_u(&rd, 1);
        take_bytes(&rd, m->nonce, WIRE_NONCE_LEN);
        n = (size_t)take_u(&rd, 1);
        if (n > WIRE_NAME_MAX)
            return shmb_error_set(err, -EPROTO, "a hello's name of %zu bytes (at most %d)",
                                  n, WIRE_NAME_MAX);
        if (take_bytes(&rd, m->name, n) && !name_ok(m->name, n))
            return shmb_error_set(err, -EPROTO,
                                  "a hello's name that is not A-Z a-z 0-9 - _ . (%zu bytes)",
                                  n);
        break;
    case WIRE_AUTH:
        take_bytes(&rd, m->mac, WIRE_MAC_LEN);
        break;
    case WIRE_FETCH:
        m->id = take_u(&rd, 8);
        n = (size_t)take_u(&rd, 2);
        if (n == 0 || n > SHMB_KEY_MAX_LEN)
            return shmb_error_set(err, -EPROTO, "a fetch's key of %zu bytes (1 to %d)", n,
                                  SHMB_KEY_MAX_LEN);
        if (take_bytes(&rd, m->key, n)) {
            struct shmb_error kerr = {0};
            if (memchr(m->key, 0, n) || shmb_key_check(m->key, n, &kerr) < 0)
                return shmb_error_set(err, -EPROTO, "a fetch's key that is not a key: %s",
                                      kerr.message[0] ? kerr.message : "a NUL byte");
        }
        break;
    case WIRE_FETCH_REPLY:
        m->id = take_u(&rd, 8);
        m->code = (int32_t)(uint32_t)take_u(&rd, 4);
        m->size = take_u(&rd, 8);
        m->addr = take_u(&rd, 8);
        m->rkey_len = (uint16_t)take_u(&rd, 2);
        if (m->rkey_len > WIRE_RKEY_MAX)
            return shmb_error_set(err, -EPROTO, "a remote key of %u bytes (at most %d)",
                                  (unsigned)m->rkey_len, WIRE_RKEY_MAX);
        take_bytes(&rd, m->rkey, m->rkey_len);
        if (take_text(&rd, m, err) < 0)
            return err->code;
        if (m->code == 0 && (m->size == 0 || m->addr + m->size < m->addr))
            return shmb_error_set(err, -EPROTO,
                                  "an object of %llu bytes at %#llx (none, or past 2^64)",
                                  (unsigned long long)m->size, (unsigned long long)m->addr);
        break;
    case WIRE_FETCH_DONE:
        m->id = take_u(&rd, 8);
        break;
    default:
        if (!wire_is_queue(m->type))
            return shmb_error_set(err, -EPROTO,
                                  "a message of unknown type %u (%zu bytes)",
                                  (unsigned)m->type, len);
        if (decode_queue(&rd, m, err) < 0)
            return err->code;
        break;
    }
    if (rd.short_read)
        return shmb_error_set(err, -EPROTO, "a message of type %u cut short (%zu bytes)",
                              (unsigned)m->type, len);
    if (rd.left)
        return shmb_error_set(err, -EPROTO, "%zu bytes after a message of type %u",
                              rd.left, (unsigned)m->type);
    return 0;
}

void wire_ask_ack(unsigned char *msg)
{
    msg[0] |= WIRE_ASK_ACK;
}

bool wire_is_queue(unsigned type)
{
    switch (type) {
    case WIRE_QSUB:
    case WIRE_QSUB_REPLY:
    case WIRE_QMSG:
    case WIRE_QACK:
    case WIRE_QEND:
    case WIRE_QUNSUB:
    case WIRE_QBATCH:
        return true;
    default:
        return false;
    }
}

int wire_hello(unsigned char *out, const unsigned char *nonce, const char *name)
{
    size_t n = strlen(name);
    unsigned char *o = out;
    if (n > WIRE_NAME_MAX)
        return -EINVAL;
    o = put_u(o, WIRE_HELLO, 1);
    o = put_u(o, WIRE_VERSION, 1);
    o = put_bytes(o, nonce, WIRE_NONCE_LEN);
    o = put_u(o, n, 1);
    o = put_bytes(o, name, n);
    return (int)(o - out);
}

int wire_auth(unsigned char *out, const unsigned char *mac)
{
    unsigned char *o = put_u(out, WIRE_AUTH, 1);
    o = put_bytes(o, mac, WIRE_MAC_LEN);
    return (int)(o - out);
}

int wire_fetch(unsigned char *out, uint64_t id, const char *key)
{
    size_t n = strlen(key);
    unsigned char *o = out;
    if (n == 0 || n > SHMB_KEY_MAX_LEN)
        return -EINVAL;
    o = put_u(o, WIRE_FETCH, 1);
    o = put_u(o, id, 8);
    o = put_u(o, n, 2);
    o = put_bytes(o, key, n);
    return (int)(o - out);
}

int wire_fetch_reply(unsigned char *out, uint64_t id, int32_t code, uint64_t size,
                     uint64_t addr, const void *rkey, size_t rkey_len, const char *text)
{
    size_t n = text ? strlen(text) : 0;
    unsigned char *o = out;
    if (rkey_len > WIRE_RKEY_MAX)
        return -EINVAL;
    if (n > WIRE_TEXT_MAX)
        n = shmb_utf8_cut(text, n, WIRE_TEXT_MAX);
    o = put_u(o, WIRE_FETCH_REPLY, 1);
    o = put_u(o, id, 8);
    o = put_u(o, (uint32_t)code, 4);
    o = put_u(o, size, 8);
    o = put_u(o, addr, 8);
    o = put_u(o, rkey_len, 2);
    o = put_bytes(o, rkey, rkey_len);
    o = put_u(o, n, 2);
    o = put_bytes(o, text, n);
    /* The other side refuses control bytes (they reach a terminal): a key
     * with a newline in a message must not cost the connection. */
    for (unsigned char *c = o - n; c < o; c++)
        if (*c < 0x20 || *c == 0x7f)
            *c = '?';
    return (int)(o - out);
}

int wire_fetch_done(unsigned char *out, uint64_t id)
{
    unsigned char *o = put_u(out, WIRE_FETCH_DONE, 1);
    o = put_u(o, id, 8);
    return (int)(o - out);
}

void wire_data_header(unsigned char out[WIRE_DATA_HEADER_LEN], uint64_t id)
{
    put_u(out, id, 8);
}

int wire_data_decode(const void *header, size_t len, uint64_t *id, struct shmb_error *err)
{
    struct reader rd = {.p = header, .left = len};
    if (len != WIRE_DATA_HEADER_LEN)
        return shmb_error_set(err, -EPROTO, "an object's bytes with a header of %zu bytes "
                              "(%d)", len, WIRE_DATA_HEADER_LEN);
    *id = take_u(&rd, 8);
    return 0;
}

/* An error text, cut to its bound on a character and without control
 * bytes, which the other side refuses. */
static unsigned char *put_text(unsigned char *o, const char *text)
{
    size_t n = text ? strlen(text) : 0;
    if (n > WIRE_TEXT_MAX)
        n = shmb_utf8_cut(text, n, WIRE_TEXT_MAX);
    o = put_u(o, n, 2);
    o = put_bytes(o, text, n);
    for (unsigned char *c = o - n; c < o; c++)
        if (*c < 0x20 || *c == 0x7f)
            *c = '?';
    return o;
}

int wire_qsub(unsigned char *out, uint64_t id, unsigned seat_from, unsigned seat_to,
              const char *queue)
{
    size_t n = strlen(queue);
    unsigned char *o = out;
    if (!wire_queue_name_ok(queue, n) || seat_from >= seat_to || seat_to > WIRE_QSEATS_MAX)
        return -EINVAL;
    o = put_u(o, WIRE_QSUB, 1);
    o = put_u(o, id, 8);
    o = put_u(o, seat_from, 1);
    o = put_u(o, seat_to, 1);
    o = put_u(o, n, 1);
    o = put_bytes(o, queue, n);
    return (int)(o - out);
}

int wire_qsub_reply(unsigned char *out, uint64_t id, int32_t code, uint64_t missed,
                    unsigned seat, const char *text)
{
    unsigned char *o = put_u(out, WIRE_QSUB_REPLY, 1);
    o = put_u(o, id, 8);
    o = put_u(o, (uint32_t)code, 4);
    o = put_u(o, missed, 8);
    o = put_u(o, seat, 1);
    o = put_text(o, text);
    return (int)(o - out);
}

int wire_qmsg(unsigned char *out, uint64_t id, uint64_t total, uint64_t offset,
              const void *bytes, size_t n)
{
    unsigned char *o = out;
    if (n > WIRE_CHUNK_MAX)
        return -EINVAL;
    o = put_u(o, WIRE_QMSG, 1);
    o = put_u(o, id, 8);
    o = put_u(o, total, 8);
    o = put_u(o, offset, 8);
    o = put_u(o, n, 2);
    o = put_bytes(o, bytes, n);
    return (int)(o - out);
}

int wire_qack(unsigned char *out, uint64_t id, uint64_t count)
{
    unsigned char *o = put_u(out, WIRE_QACK, 1);
    o = put_u(o, id, 8);
    o = put_u(o, count, 8);
    return (int)(o - out);
}

static int encode_end(unsigned char *out, uint8_t type, uint64_t id, int32_t code,
                      const char *text)
{
    unsigned char *o = put_u(out, type, 1);
    o = put_u(o, id, 8);
    o = put_u(o, (uint32_t)code, 4);
    o = put_text(o, text);
    return (int)(o - out);
}

int wire_qend(unsigned char *out, uint64_t id, int32_t code, const char *text)
{
    return encode_end(out, WIRE_QEND, id, code, text);
}

int wire_qunsub(unsigned char *out, uint64_t id, int32_t code, const char *text)
{
    return encode_end(out, WIRE_QUNSUB, id, code, text);
}

/* The batch's header: type, id, then the count and the items' bytes, filled
 * in by wire_qbatch_end. */
#define QBATCH_HEAD (1 + 8 + 2 + 2)

void wire_qbatch_begin(struct wire_batch *b, unsigned char *out, uint64_t id)
{
    unsigned char *o = put_u(out, WIRE_QBATCH, 1);
    put_u(o, id, 8);
    b->out = out;
    b->len = QBATCH_HEAD;
    b->count = 0;
}

int wire_qbatch_add(struct wire_batch *b, const void *bytes, size_t n)
{
    if (b->count >= WIRE_BATCH_MAX || n > WIRE_BATCH_BYTES - 2 ||
        b->len - QBATCH_HEAD + 2 + n > WIRE_BATCH_BYTES)
        return -ENOSPC;
    put_bytes(put_u(b->out + b->len, n, 2), bytes, n);
    b->len += 2 + n;
    b->count++;
    return 0;
}

size_t wire_qbatch_end(struct wire_batch *b)
{
    put_u(put_u(b->out + 9, b->count, 2), b->len - QBATCH_HEAD, 2);
    return b->len;
}

bool wire_qbatch_next(const struct wire_msg *m, size_t *off, const unsigned char **bytes,
                      size_t *n)
{
    if (*off + 2 > m->rkey_len)
        return false;
    *n = (size_t)m->rkey[*off] | (size_t)m->rkey[*off + 1] << 8;
    *bytes = m->rkey + *off + 2;
    *off += 2 + *n; /* within rkey_len: wire_decode checked every length */
    return true;
}
