// SPDX-License-Identifier: Apache-2.0
/*
 * UTF-8 well-formedness and cutting on a character boundary: the one
 * definition of what the project accepts as UTF-8. Knows nothing else, so
 * every other module may use it.
 */
#include "utf8.h"

size_t shmb_utf8_seq_len(const unsigned char *s, size_t avail)
{
    size_t n, k;
    unsigned cp;

    if (avail == 0)
        return 0;
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

size_t shmb_utf8_invalid_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        size_t k = shmb_utf8_seq_len(u + i, n - i);

        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

size_t shmb_utf8_cut(const char *s, size_t n, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;

    if (n <= max)
        return n;
    while (i < max) {
        size_t k = shmb_utf8_seq_len(u + i, n - i);

        if (k == 0)
            k = 1;
        if (i + k > max)
            break;
        i += k;
    }
    return i;
}
