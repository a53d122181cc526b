/*
 * Text that crosses a trust boundary: UTF-8 checks, cutting on a character
 * boundary, escaping for terminals and logs, and the one check of a key that
 * the daemon, the library and the ctl share (so they refuse a bad key with
 * the same code and the same words). Knows nothing about JSON or sockets.
 */
#ifndef SHMB_PROTO_TEXT_H
#define SHMB_PROTO_TEXT_H

#include <stddef.h>

#include "error.h"

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one. */
size_t shmb_utf8_seq_len(const unsigned char *s, size_t avail);

/* The offset of the first byte of s[0..n) that is not part of well-formed
 * UTF-8, or n when all of it is. */
size_t shmb_utf8_invalid_at(const char *s, size_t n);

/* The longest prefix of s[0..n) of at most max bytes that does not end in
 * the middle of a UTF-8 character (a malformed byte counts as one). */
size_t shmb_utf8_cut(const char *s, size_t n, size_t max);

/* Copy s[0..n) into out (cap bytes, NUL-terminated, cap >= 1) for a human's
 * eyes: control bytes (C0, DEL and the C1 range, which terminals obey) and
 * bytes that are not UTF-8 become \xNN; the bidirectional formatting
 * characters and the line and paragraph separators (U+061C, U+200E, U+200F,
 * U+2028..U+202E, U+2066..U+2069), which reorder or break what a terminal
 * shows, become \uNNNN; a backslash becomes \\; other characters pass. Stops before an escape that would not fit whole. Returns
 * out, so it can be an argument of printf. */
char *shmb_escape(const char *s, size_t n, char *out, size_t cap);

/* Room shmb_escape needs for n bytes whatever they are, the NUL included. */
#define SHMB_ESCAPED_MAX(n) ((n) * 4 + 1) /* \uNNNN is 6 for 3 bytes: under 4 each */

/* A key is 1 to SHMB_KEY_MAX bytes of UTF-8 (no NUL: it is a C string in
 * the library). 0, or -EINVAL with the message every part of shmbroker
 * gives. */
int shmb_key_check(const char *key, size_t len, struct shmb_error *err);

#endif
