// SPDX-License-Identifier: Apache-2.0
/*
 * Text that crosses a trust boundary: escaping for terminals and logs (over
 * the UTF-8 rules of utf8.h, which it includes), and the one check of a key that
 * the daemon, the library and the ctl share (so they refuse a bad key with
 * the same code and the same words); and byte counts written for people.
 * Knows nothing about JSON or sockets.
 */
#ifndef SHMB_PROTO_TEXT_H
#define SHMB_PROTO_TEXT_H

#include <stddef.h>

#include "error.h"
#include "utf8.h"

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

/* The length rule alone, with the same words: for the daemon, whose keys
 * arrive as JSON strings, UTF-8 by construction. 0 or -EINVAL. */
int shmb_key_len_check(size_t len, struct shmb_error *err);

/* Format a byte count for humans ("256 MiB", "1.5 GiB", "512 B") into buf. */
const char *shmb_format_bytes(unsigned long long bytes, char *buf, size_t len);

/* Byte count in MiB rounded to the nearest integer, as vLLM's messages do. */
unsigned long long shmb_mib_rounded(unsigned long long bytes);

#endif
