// SPDX-License-Identifier: Apache-2.0
/*
 * Escaping for human-facing output, the key check and byte counts for people.
 */
#include "text.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "layout.h"

/* Characters that reorder or break a line on a terminal without being
 * control bytes: the bidirectional marks, embeddings, overrides and isolates
 * (a key could show a row backwards), and the line and paragraph separators. */
static bool text_is_format_char(const unsigned char *u, size_t k)
{
    unsigned cp;

    if (k == 2)
        return ((unsigned)(u[0] & 0x1F) << 6 | (u[1] & 0x3F)) == 0x061C;
    if (k != 3)
        return false;
    cp = (unsigned)(u[0] & 0x0F) << 12 | (unsigned)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return cp == 0x200E || cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

char *shmb_escape(const char *s, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;

    while (i < n) {
        size_t k = shmb_utf8_seq_len(u + i, n - i);
        /* C1 controls are U+0080..U+009F: 0xC2 0x80..0x9F in UTF-8. */
        int control = k == 0 || (k == 1 && (u[i] < 0x20 || u[i] == 0x7f)) ||
                      (k == 2 && u[i] == 0xC2 && u[i + 1] < 0xA0);

        if (k == 0)
            k = 1;
        if (!control && text_is_format_char(u + i, k)) {
            char esc[8];
            unsigned cp = k == 2 ? ((unsigned)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F))
                                 : ((unsigned)(u[i] & 0x0F) << 12 |
                                    (unsigned)(u[i + 1] & 0x3F) << 6 | (u[i + 2] & 0x3F));

            if (o + 6 >= cap)
                break;
            esc[0] = '\\';
            esc[1] = 'u';
            esc[2] = hex[cp >> 12];
            esc[3] = hex[(cp >> 8) & 15];
            esc[4] = hex[(cp >> 4) & 15];
            esc[5] = hex[cp & 15];
            memcpy(out + o, esc, 6);
            o += 6;
        } else if (control) {
            size_t j;

            if (o + 4 * k >= cap)
                break;
            for (j = 0; j < k; j++) {
                out[o++] = '\\';
                out[o++] = 'x';
                out[o++] = hex[u[i + j] >> 4];
                out[o++] = hex[u[i + j] & 15];
            }
        } else if (k == 1 && u[i] == '\\') {
            if (o + 2 >= cap)
                break;
            out[o++] = '\\';
            out[o++] = '\\';
        } else {
            if (o + k >= cap)
                break;
            memcpy(out + o, u + i, k);
            o += k;
        }
        i += k;
    }
    out[o] = '\0';
    return out;
}

int shmb_key_len_check(size_t len, struct shmb_error *err)
{
    if (len == 0 || len > SHMB_KEY_MAX)
        return shmb_error_set(err, -EINVAL, "Key of %zu bytes: keys are 1 to %u bytes long.",
                              len, SHMB_KEY_MAX);
    return 0;
}

int shmb_key_check(const char *key, size_t len, struct shmb_error *err)
{
    size_t bad;
    int rc;

    if ((rc = shmb_key_len_check(key == NULL ? 0 : len, err)) < 0)
        return rc;
    if (memchr(key, '\0', len) != NULL)
        return shmb_error_set(err, -EINVAL,
                              "Key contains a NUL byte at offset %zu; keys are UTF-8 text "
                              "of 1 to %u bytes without NUL.",
                              (size_t)((const char *)memchr(key, '\0', len) - key),
                              SHMB_KEY_MAX);
    bad = shmb_utf8_invalid_at(key, len);
    if (bad < len)
        return shmb_error_set(err, -EINVAL,
                              "Key is not valid UTF-8 (byte 0x%02x at offset %zu); keys are "
                              "UTF-8 text of 1 to %u bytes.",
                              (unsigned char)key[bad], bad, SHMB_KEY_MAX);
    return 0;
}

const char *shmb_format_bytes(unsigned long long bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int unit = 0;

    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0)
        snprintf(buf, len, "%llu B", bytes);
    else if (value == (double)(unsigned long long)value)
        snprintf(buf, len, "%llu %s", (unsigned long long)value, units[unit]);
    else
        snprintf(buf, len, "%.1f %s", value, units[unit]);
    return buf;
}

unsigned long long shmb_mib_rounded(unsigned long long bytes)
{
    return (bytes + (1ULL << 19)) >> 20;
}
