/*
 * Error codes and messages shared by every part of shmbroker.
 */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The codes the wire protocol names, in the order PROTOCOL.md lists them. */
static const struct {
    int code;
    const char *name;
} error_names[] = {
    {EPROTO, "EPROTO"},
    {EINVAL, "EINVAL"},
    {ENOSYS, "ENOSYS"},
    {EEXIST, "EEXIST"},
    {ENOENT, "ENOENT"},
    {E2BIG, "E2BIG"},
    {ENOSPC, "ENOSPC"},
    {EPERM, "EPERM"},
    {EMSGSIZE, "EMSGSIZE"},
    {ETIMEDOUT, "ETIMEDOUT"},
    {EBUSY, "EBUSY"},
    {ENOMEM, "ENOMEM"},
    {EIO, "EIO"},
    {ECONNREFUSED, "ECONNREFUSED"},
    {ECONNRESET, "ECONNRESET"},
    {EPIPE, "EPIPE"},
    {EBADMSG, "EBADMSG"},
    {EAGAIN, "EAGAIN"},
    {EMFILE, "EMFILE"},
    {ENOTCONN, "ENOTCONN"},
    {EDQUOT, "EDQUOT"},
};

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs,
 * no surrogates, nothing past U+10FFFF), or 0 when it is not one. */
static size_t error_utf8_len(const unsigned char *s, size_t avail)
{
    size_t n, k;
    unsigned cp;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        n = 2, cp = s[0] & 0x1F;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        n = 3, cp = s[0] & 0x0F;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        n = 4, cp = s[0] & 0x07;
    else
        return 0;
    if (avail < n)
        return 0;
    for (k = 1; k < n; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

/* Make the message valid UTF-8, so that it can always travel as a JSON
 * string: a message may quote bytes a client sent (jansson's "near '...'")
 * or be cut in the middle of a character. Bad bytes become '?'. */
static void error_fix_utf8(char *s)
{
    size_t len = strlen(s), i = 0;

    while (i < len) {
        size_t n = error_utf8_len((const unsigned char *)s + i, len - i);

        if (n == 0) {
            s[i] = '?';
            n = 1;
        }
        i += n;
    }
}

int shmb_error_set(struct shmb_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL)
        return code;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    error_fix_utf8(err->message);
    return code;
}

void shmb_error_clear(struct shmb_error *err)
{
    if (err == NULL)
        return;
    err->code = 0;
    err->message[0] = '\0';
}

const char *shmb_error_name(int code)
{
    size_t i;

    if (code > 0)
        code = -code;
    for (i = 0; i < sizeof(error_names) / sizeof(error_names[0]); i++)
        if (-error_names[i].code == code)
            return error_names[i].name;
    return "EIO";
}

int shmb_error_from_name(const char *name)
{
    size_t i;

    if (name == NULL)
        return -EIO;
    for (i = 0; i < sizeof(error_names) / sizeof(error_names[0]); i++)
        if (strcmp(error_names[i].name, name) == 0)
            return -error_names[i].code;
    return -EIO;
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
