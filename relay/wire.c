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
        n = (size_t)take_u(&rd, 2);
        if (n > WIRE_TEXT_MAX)
            return shmb_error_set(err, -EPROTO, "an error text of %zu bytes (at most %d)", n,
                                  WIRE_TEXT_MAX);
        if (take_bytes(&rd, m->text, n) && shmb_utf8_invalid_at(m->text, n) != n)
            return shmb_error_set(err, -EPROTO, "an error text that is not UTF-8");
        /* It reaches a user's terminal: no control bytes. */
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)m->text[i] < 0x20 || m->text[i] == 0x7f)
                return shmb_error_set(err, -EPROTO,
                                      "an error text with a control byte (%#x at %zu)",
                                      (unsigned)(unsigned char)m->text[i], i);
        if (m->code > 0 || m->code < -4095)
            return shmb_error_set(err, -EPROTO, "a reply code of %ld (0 or -1..-4095)",
                                  (long)m->code);
        if (m->code == 0 && m->rkey_len == 0)
            return shmb_error_set(err, -EPROTO, "an object without a remote key");
        if (m->code == 0 && (m->size == 0 || m->addr + m->size < m->addr))
            return shmb_error_set(err, -EPROTO,
                                  "an object of %llu bytes at %#llx (none, or past 2^64)",
                                  (unsigned long long)m->size, (unsigned long long)m->addr);
        break;
    case WIRE_FETCH_DONE:
        m->id = take_u(&rd, 8);
        break;
    default:
        return shmb_error_set(err, -EPROTO, "a message of unknown type %u (%zu bytes)",
                              (unsigned)m->type, len);
    }
    if (rd.short_read)
        return shmb_error_set(err, -EPROTO, "a message of type %u cut short (%zu bytes)",
                              (unsigned)m->type, len);
    if (rd.left)
        return shmb_error_set(err, -EPROTO, "%zu bytes after a message of type %u",
                              rd.left, (unsigned)m->type);
    return 0;
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
