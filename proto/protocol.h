// SPDX-License-Identifier: Apache-2.0
/*
 * The wire protocol shared by shmbrokerd, the client library and
 * shmbrokerctl: constants, framing, and the JSON helpers both ends use.
 * proto/PROTOCOL.md is the reference; this file must agree with it.
 */
#ifndef SHMB_PROTO_PROTOCOL_H
#define SHMB_PROTO_PROTOCOL_H

#include <jansson.h>
#include <stddef.h>

#include "error.h"
#include "line.h"

#define SHMB_PROTOCOL_VERSION 1
/* A request is small; anything longer is a bug or an attack. */
#define SHMB_MAX_LINE (64 * 1024)
/* Ops in one batch: a batch is answered on one line, so it stays bounded. */
#define SHMB_MAX_BATCH 4096
/* Replies can be long (list); a client stops reading past this. */
#define SHMB_MAX_REPLY (64 * 1024 * 1024)
#define SHMB_DEFAULT_SOCKET "/run/shmbroker/shmbroker.sock"
/* A user who cannot write /run/shmbroker gets a private directory: this
 * one under $XDG_RUNTIME_DIR, else SHMB_USER_SOCKET_TMP with its uid. */
#define SHMB_USER_SOCKET_DIR "shmbroker"
#define SHMB_USER_SOCKET_TMP "/tmp/shmbroker-"
#define SHMB_USER_SOCKET_NAME "shmbroker.sock"
#define SHMB_SOCKET_ENV "SHMBROKER_SOCKET"
/* shmbrokerd's --name and --shm-dir by default: where its segment is, for
 * the ctl to read when the daemon does not answer. */
#define SHMB_DEFAULT_NAME "shmbroker"
#define SHMB_DEFAULT_SHM_DIR "/dev/shm"
/* shmbrokerd's --max-pending by default; the library's put_many allocates at
 * most this many objects per line before committing them, so that a
 * put_many alone never holds more than a connection may by default. */
#define SHMB_DEFAULT_MAX_PENDING 1024
/* shmbroker-relay's socket: the daemon's path with this appended. */
#define SHMB_RELAY_SOCKET_SUFFIX ".relay"
#define SHMB_LIST_DEFAULT_LIMIT 1000
#define SHMB_LIST_MAX_LIMIT 100000
#define SHMB_NAME_MAX 64 /* a client's label in hello */

/* What an op may do; the flags of proto/ops.def's rows. */
enum shmb_op_flag {
    SHMB_OPF_WRITES = 1,  /* changes the segment: refused to read-only clients */
    SHMB_OPF_NOREPLY = 2, /* may carry "noreply": true, outside a batch */
    SHMB_OPF_BATCH = 4,   /* may be one of a batch's ops */
};

/* The ops, SHMB_OP_HELLO ... SHMB_OP_BATCH, in proto/ops.def's order. */
enum shmb_op_id {
#define SHMB_OP(id, name, flags, usage) SHMB_OP_##id,
#include "ops.def"
#undef SHMB_OP
    SHMB_OP_COUNT
};

/* One row of proto/ops.def. */
struct shmb_op_info {
    const char *name;  /* as on the wire: "alloc" */
    unsigned flags;    /* enum shmb_op_flag */
    const char *usage; /* the request's shape, for EINVAL messages */
};

/* The ops, indexed by enum shmb_op_id. */
extern const struct shmb_op_info shmb_ops[SHMB_OP_COUNT];

/* The id of the op called name (case-sensitive), or -1. */
int shmb_op_find(const char *name);

/* Write into buf the names of the ops that have every flag in flags (0: all
 * of them), in the table's order, separated by ", " and by last_sep before
 * the last one: "commit, abort, release, touch and delete". Returns buf. */
const char *shmb_op_names(char *buf, size_t len, unsigned flags, const char *last_sep);

/* How a field of the stats reply is written (proto/stats.def). */
enum shmb_stat_kind {
    SHMB_STATK_STRING,
    SHMB_STATK_NUMBER,
    SHMB_STATK_BLOCKER,
    SHMB_STATK_COUNTER,
};

/* The stats reply's fields, SHMB_STAT_SEGMENT ..., in proto/stats.def's order. */
enum shmb_stat_id {
#define SHMB_STAT(id, name, kind) SHMB_STAT_##id,
#include "stats.def"
#undef SHMB_STAT
    SHMB_STAT_COUNT
};

/* One row of proto/stats.def. */
struct shmb_stat_info {
    const char *name;
    enum shmb_stat_kind kind;
};

/* The stats reply's fields, indexed by enum shmb_stat_id. */
extern const struct shmb_stat_info shmb_stat_fields[SHMB_STAT_COUNT];

/* The socket path a client uses: explicit, else $SHMBROKER_SOCKET, else
 * (not root) the user's own socket when one is there (shmb_user_socket_path),
 * else the system's default. The returned string is borrowed (a buffer of
 * the calling thread's, overwritten by its next call). */
const char *shmb_socket_path(const char *explicit_path);

/* The socket of a daemon run by a user without root: into buf,
 * $XDG_RUNTIME_DIR/shmbroker/shmbroker.sock when XDG_RUNTIME_DIR is an
 * absolute path, else /tmp/shmbroker-EUID/shmbroker.sock. 0, or
 * -ENAMETOOLONG when it does not fit in len (or a socket address). */
int shmb_user_socket_path(char *buf, size_t len);

/* Make the user's socket directory dir (mode 0700) when it is missing, then
 * check that it is a directory of this user's (not a link) that no one else
 * may write: in /tmp anyone could have made it first, and a socket there
 * would then be theirs to swap. 0, or a negative errno with err set. */
int shmb_user_socket_dir_prepare(const char *dir, struct shmb_error *err);

/* 0 when dir is a directory (not a link) of this user's that no one else
 * may write, else a negative errno with err set (err may be NULL). */
int shmb_user_socket_dir_check(const char *dir, struct shmb_error *err);

/* Append value (any JSON value) serialised compactly to l; the _line form
 * ends it with '\n'. 0 or -ENOMEM. */
int shmb_json_append(struct line *l, const json_t *value);
int shmb_json_append_line(struct line *l, const json_t *value);

/* Build {"ok":false,"error":NAME,"message":MSG} (and "id" when id is not
 * NULL). The caller owns the result; NULL on allocation failure. */
json_t *shmb_error_reply(const json_t *id, int code, const char *message);

/* Decode a reply line. On {"ok":true,...} returns 0 and *reply (owned by the
 * caller); on {"ok":false,...} returns the negative code and copies the
 * daemon's message into err; -EPROTO when the line is not a reply. */
int shmb_parse_reply(const char *line, size_t len, json_t **reply,
                     struct shmb_error *err);

/* As shmb_parse_reply, and *id gets the reply's "id" (a new reference owned
 * by the caller; NULL when the reply has none or the line is not an object),
 * whether the reply says ok or not: a client checks it before trusting the
 * rest. */
int shmb_parse_reply_id(const char *line, size_t len, json_t **reply, json_t **id,
                        struct shmb_error *err);

#endif
