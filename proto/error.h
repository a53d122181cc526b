// SPDX-License-Identifier: Apache-2.0
/*
 * Error codes and their human messages, shared by the daemon, the client
 * library and the ctl tool. Functions in this project return 0 or a negative
 * errno; the message that tells a user what to do travels beside the code in a
 * caller-owned struct shmb_error. Knows nothing about JSON or sockets.
 */
#ifndef SHMB_PROTO_ERROR_H
#define SHMB_PROTO_ERROR_H

#include <stddef.h>

/* A message is one or two sentences with numbers; room for two keys of
 * SHMB_KEY_MAX bytes besides, so that no figure is ever cut off. */
#define SHMB_ERROR_MSG_MAX 1024

struct shmb_error {
    int code;                         /* negative errno, 0 when unset */
    char message[SHMB_ERROR_MSG_MAX]; /* NUL-terminated, "" when unset */
};

/* Who reports a code (proto/errors.def): the daemon, in replies, or only
 * the client library, on its own side. */
enum shmb_error_where { SHMB_ERR_WIRE, SHMB_ERR_LIBRARY };

/* One row of proto/errors.def: the positive errno, its protocol name. */
struct shmb_error_code {
    int code;
    const char *name;
    enum shmb_error_where where;
};

/* Every code the protocol names, in proto/errors.def's order. */
extern const struct shmb_error_code shmb_error_codes[];
extern const size_t shmb_error_ncodes;

/* Record code and a printf-style message in err (may be NULL); returns code. */
int shmb_error_set(struct shmb_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reset err to "no error". */
void shmb_error_clear(struct shmb_error *err);

/* The protocol name of a negative errno ("ENOSPC"), or "EIO" for codes the
 * protocol does not name. The returned string is static. */
const char *shmb_error_name(int code);

/* The name of any code, for a person reading the library's or the ctl's
 * errors: "OK" for 0, the protocol's name for the codes it names, else the
 * C library's name ("EACCES"), else "E" and the number ("E4000"). Not for
 * the wire, whose names are shmb_error_name's. The string is static, or for
 * a number the C library does not name, the calling thread's until its next
 * call. */
const char *shmb_error_any_name(int code);

/* The negative errno for a protocol name, or -EIO when the name is unknown. */
int shmb_error_from_name(const char *name);

#endif
