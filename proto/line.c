// SPDX-License-Identifier: Apache-2.0
/*
 * The hot path's JSON lines: a builder and a recogniser of success replies.
 */
#include "line.h"

#include <errno.h>
#include <string.h>

#include "alloc.h"

int line_reserve(struct line *l, size_t n)
{
    size_t cap = l->cap ? l->cap : 1024;
    char *grown;

    if (l->len + n <= l->cap)
        return 0;
    while (cap < l->len + n)
        cap *= 2;
    grown = shmb_realloc(l->buf, cap);
    if (grown == NULL)
        return -ENOMEM;
    l->buf = grown;
    l->cap = cap;
    return 0;
}

int line_raw(struct line *l, const char *s, size_t n)
{
    if (line_reserve(l, n) < 0)
        return -ENOMEM;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    return 0;
}

int line_lit(struct line *l, const char *s)
{
    return line_raw(l, s, strlen(s));
}

int line_str(struct line *l, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i;

    /* At worst every byte becomes \u00XX. */
    if (line_reserve(l, n * 6 + 2) < 0)
        return -ENOMEM;
    l->buf[l->len++] = '"';
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];

        if (ch == '"' || ch == '\\') {
            l->buf[l->len++] = '\\';
            l->buf[l->len++] = (char)ch;
        } else if (ch < 0x20) {
            memcpy(l->buf + l->len, "\\u00", 4);
            l->buf[l->len + 4] = hex[ch >> 4];
            l->buf[l->len + 5] = hex[ch & 15];
            l->len += 6;
        } else {
            l->buf[l->len++] = (char)ch; /* UTF-8 passes through; the peer checks it */
        }
    }
    l->buf[l->len++] = '"';
    return 0;
}

int line_u64(struct line *l, uint64_t v)
{
    char tmp[24];
    size_t n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    if (line_reserve(l, n) < 0)
        return -ENOMEM;
    while (n > 0)
        l->buf[l->len++] = tmp[--n];
    return 0;
}

/* Match the literal s at *p; advance on success. */
static bool scan_lit(const char **p, const char *end, const char *s)
{
    size_t n = strlen(s);

    if ((size_t)(end - *p) < n || memcmp(*p, s, n) != 0)
        return false;
    *p += n;
    return true;
}

/* An unsigned decimal integer that fits in 63 bits. */
static bool scan_u64(const char **p, const char *end, uint64_t *out)
{
    const char *q = *p;
    uint64_t v = 0;

    if (q == end || *q < '0' || *q > '9')
        return false;
    while (q < end && *q >= '0' && *q <= '9') {
        if (v > (UINT64_MAX / 2 - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*q++ - '0');
    }
    *out = v;
    *p = q;
    return true;
}

/* A string without escapes; its contents in [*s, *s + *n). */
static bool scan_plain_string(const char **p, const char *end, const char **s, size_t *n)
{
    const char *q = *p;

    if (q == end || *q != '"')
        return false;
    q++;
    *s = q;
    while (q < end && *q != '"') {
        if (*q == '\\' || (unsigned char)*q < 0x20)
            return false;
        q++;
    }
    if (q == end)
        return false;
    *n = (size_t)(q - *s);
    *p = q + 1;
    return true;
}

int line_scan_reply(const char **p, const char *end, struct line_reply *out)
{
    const char *q = *p;
    int seen_id = 0;

    memset(out, 0, sizeof(*out));
    if (!scan_lit(&q, end, "{\"ok\":true"))
        return -1;
    while (q < end && *q == ',') {
        const char *name, *sval;
        size_t nlen, slen;
        uint64_t v;

        q++;
        if (!scan_plain_string(&q, end, &name, &nlen) || !scan_lit(&q, end, ":"))
            return -1;
        /* jansson refuses a duplicate "id", and so must we: the id says
         * which request a reply answers. */
        if (nlen == 2 && memcmp(name, "id", 2) == 0 && seen_id++)
            return -1;
        if (q < end && *q >= '0' && *q <= '9') {
            if (!scan_u64(&q, end, &v))
                return -1;
            if (nlen == 6 && memcmp(name, "offset", 6) == 0) {
                out->offset = v;
                out->has_offset = true;
            } else if (nlen == 4 && memcmp(name, "size", 4) == 0) {
                out->size = v;
                out->has_size = true;
            } else if (nlen == 2 && memcmp(name, "id", 2) == 0) {
                out->id = v;
                out->has_id = true;
            }
        } else if (scan_lit(&q, end, "true") || scan_lit(&q, end, "false")) {
            if (nlen == 6 && memcmp(name, "exists", 6) == 0) {
                out->exists = q[-2] == 'u'; /* "true" ends in "ue", "false" in "se" */
                out->has_exists = true;
            }
        } else if (!scan_lit(&q, end, "null") && !scan_plain_string(&q, end, &sval, &slen)) {
            return -1;
        }
    }
    if (!scan_lit(&q, end, "}"))
        return -1;
    *p = q;
    return 0;
}

int line_scan_batch(const char *p, const char *end, struct line_reply *out, size_t n,
                    struct line_reply *whole)
{
    size_t i;

    memset(whole, 0, sizeof(*whole));
    if (!scan_lit(&p, end, "{\"ok\":true,\"replies\":["))
        return -1;
    for (i = 0; i < n; i++) {
        if ((i > 0 && !scan_lit(&p, end, ",")) || line_scan_reply(&p, end, &out[i]) < 0)
            return -1;
    }
    if (!scan_lit(&p, end, "]"))
        return -1;
    /* The daemon appends the batch's own "id" after the replies. */
    if (scan_lit(&p, end, ",\"id\":")) {
        if (!scan_u64(&p, end, &whole->id))
            return -1;
        whole->has_id = true;
    }
    if (!scan_lit(&p, end, "}"))
        return -1;
    return p == end ? 0 : -1;
}
