// SPDX-License-Identifier: Apache-2.0
/*
 * Hand-written JSON lines for the hot path: building the few request and
 * reply shapes that carry most of the traffic (alloc, get, commit, release,
 * their batches) without a jansson object per field, and recognising the
 * common success replies. Anything that does not fit these shapes goes
 * through jansson as before; this is a shortcut, not a second parser.
 */
#ifndef SHMB_PROTO_LINE_H
#define SHMB_PROTO_LINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable output buffer (the caller owns buf; shmb_realloc'ed). */
struct line {
    char *buf;
    size_t len, cap;
};

/* Make room for n more bytes; 0 or -ENOMEM. */
int line_reserve(struct line *l, size_t n);

/* Append raw bytes, a JSON string (quoted and escaped), or a decimal
 * number. Each returns 0 or -ENOMEM. */
int line_raw(struct line *l, const char *s, size_t n);
int line_lit(struct line *l, const char *s);
int line_str(struct line *l, const char *s, size_t n);
int line_u64(struct line *l, uint64_t v);

/* A success reply as the fast path understands it. */
struct line_reply {
    bool has_offset, has_size, has_exists, has_id;
    uint64_t offset, size, id; /* id: the request's "id", when an unsigned integer */
    bool exists;
};

/* Recognise one success reply object at *p (before end):
 * {"ok":true[,"name":value]...} where a value is an unsigned integer, true,
 * false, null or a string without escapes. Fills out and moves *p past the
 * object; -1 (nothing consumed) for anything else, an error reply included,
 * and a second "id". */
int line_scan_reply(const char **p, const char *end, struct line_reply *out);

/* Recognise {"ok":true,"replies":[R,...]} or {"ok":true,"replies":[R,...],"id":N}
 * with exactly n success replies R; whole gets the batch's own id (has_id
 * false without one). -1 for anything else (a failed op inside included). */
int line_scan_batch(const char *p, const char *end, struct line_reply *out, size_t n,
                    struct line_reply *whole);

#endif
