// SPDX-License-Identifier: Apache-2.0
/*
 * UTF-8: which bytes are well-formed, and where a cut may fall. Knows
 * nothing else; error.c uses it to keep every message valid UTF-8, text.c to
 * escape and to check keys.
 */
#ifndef SHMB_PROTO_UTF8_H
#define SHMB_PROTO_UTF8_H

#include <stddef.h>

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one. */
size_t shmb_utf8_seq_len(const unsigned char *s, size_t avail);

/* The offset of the first byte of s[0..n) that is not part of well-formed
 * UTF-8, or n when all of it is. */
size_t shmb_utf8_invalid_at(const char *s, size_t n);

/* The longest prefix of s[0..n) of at most max bytes that does not end in
 * the middle of a UTF-8 character (a malformed byte counts as one). */
size_t shmb_utf8_cut(const char *s, size_t n, size_t max);

#endif
