// SPDX-License-Identifier: Apache-2.0
/*
 * Error codes and messages shared by every part of shmbroker.
 */
#include "error.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "utf8.h"

const struct shmb_error_code shmb_error_codes[] = {
#define SHMB_ERR(name, where) {name, #name, where},
#include "errors.def"
#undef SHMB_ERR
};
const size_t shmb_error_ncodes = sizeof(shmb_error_codes) / sizeof(shmb_error_codes[0]);

/* Make the message valid UTF-8, so that it can always travel as a JSON
 * string: a message may quote bytes a client sent (jansson's "near '...'")
 * or be cut in the middle of a character. Bad bytes become '?'. */
static void error_fix_utf8(char *s)
{
    size_t len = strlen(s), i = 0;

    while (i < len) {
        size_t n = shmb_utf8_seq_len((const unsigned char *)s + i, len - i);

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
    for (i = 0; i < shmb_error_ncodes; i++)
        if (-shmb_error_codes[i].code == code)
            return shmb_error_codes[i].name;
    return "EIO";
}

const char *shmb_error_any_name(int code)
{
    static _Thread_local char number[24];
    const char *name;
    size_t i;

    if (code > 0)
        code = -code;
    if (code == 0)
        return "OK";
    for (i = 0; i < shmb_error_ncodes; i++)
        if (-shmb_error_codes[i].code == code)
            return shmb_error_codes[i].name;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
    if (code > INT_MIN && (name = strerrorname_np(-code)) != NULL)
        return name;
#else
    (void)name;
#endif
    snprintf(number, sizeof(number), "E%lld", -(long long)code);
    return number;
}

int shmb_error_from_name(const char *name)
{
    size_t i;

    if (name == NULL)
        return -EIO;
    for (i = 0; i < shmb_error_ncodes; i++)
        if (strcmp(shmb_error_codes[i].name, name) == 0)
            return -shmb_error_codes[i].code;
    return -EIO;
}
