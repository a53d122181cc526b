// SPDX-License-Identifier: Apache-2.0
/*
 * One request on its way through the handlers: the call, its fields read and
 * checked, its reply built and turned into a result (a wait, nothing for a
 * noreply, the text). What command.c and the handlers' rooms share, and
 * nobody else includes; it declares the handlers and calls none.
 */
#ifndef SHMB_CMD_CALL_H
#define SHMB_CMD_CALL_H

#include "command_types.h"

/* One request on its way through a handler. */
struct command_call {
    struct command_env *env;
    struct command_client *client;
    const struct shmb_op_info *op; /* its row of proto/ops.def, once known */
    json_t *req;   /* the request, without "op" and "id" */
    json_t *reply; /* {"ok":true} once a handler adds a field, else NULL */
    unsigned flags;
    bool noreply;           /* the request said "noreply": true */
    bool has_extent;        /* the success reply carries offset and size */
    struct store_extent extent;
    struct line text;       /* a batch's reply, written out, left open for "id" */
    int fd;                 /* COMMAND_SEND_FD: a queue's descriptor, -1: the segment's */
    json_t *id;             /* the request's "id" (borrowed), NULL when none */
    bool in_batch;          /* an op of a batch, which never waits */
    bool soft_wait;         /* it waits without having asked (command_wait_commits) */
    bool final_try;         /* a waiting alloc's last chance */
    uint64_t wait_until_ms; /* a waiting alloc's deadline, 0 before it waits */
    const char *key;        /* a commit_at's key once read (not NUL-terminated) */
    size_t key_len;
    struct shmb_error err;
};

typedef int (*command_handler)(struct command_call *call);

/* The handlers, one per row of proto/ops.def: cmd_NAME for op NAME, each in
 * the room of its family (cmd_objects, cmd_arenas, cmd_queues, cmd_reports;
 * hello and batch in command.c), called from command.c's table only. */
#define SHMB_OP(id, name, flags, usage) int cmd_##name(struct command_call *call);
#include "../proto/ops.def"
#undef SHMB_OP

/* Unpack the request strictly against fmt; on mismatch, an EINVAL that quotes
 * jansson's reason and the op's usage. */
int command_unpack(struct command_call *call, const char *fmt, ...);

/* A JSON integer that must lie in [min, max]. */
int command_check_range(struct command_call *call, const char *field,
                        json_int_t value, json_int_t min, json_int_t max);

/* The reply object {"ok":true,...}, created when a handler first adds to
 * it (the common replies never need it); NULL when memory ran out. */
json_t *command_reply_object(struct command_call *call);

/* Add a field to the reply; -ENOMEM. */
int command_set(struct command_call *call, const char *field, json_t *value);

/* EDQUOT when this client already holds as many of something as it may. */
int command_check_cap(struct command_call *call, uint64_t held, uint64_t cap,
                      const char *cap_name, const char *what);

/* Reply fields offset and size. */
int command_set_extent(struct command_call *call, const struct store_extent *ext);

/* An alloc or arena request refused with rc: -EINPROGRESS (wait, and be
 * retried, until COMMAND_COMMIT_WAIT_MS) when rc is -ENOSPC and the room is
 * held by commits on their way, else rc. So that such a request does not
 * fail in the moment between a client's copy into its arena and the
 * daemon's handling of its commit_at. */
int command_wait_commits(struct command_call *call, int rc);

/* Keys are 1 to SHMB_KEY_MAX bytes, whatever the op. */
int command_check_key(struct command_call *call, size_t key_len);

/* The key of a request whose only field is "key". */
int command_key(struct command_call *call, const char **key, size_t *key_len);

/* Whether the asking connection may use pool: the reports show the names
 * of what a pool holds (its keys, queues, clients' names) only to the peers
 * its group= admits, and their figures to everyone. */
bool command_may_see(const struct command_call *call, const struct pool *pool);

/* A name for a report: null when hidden (command_may_see). A new
 * reference, NULL when memory ran out. */
json_t *command_name(const char *name, bool hide);

/* A member as queue.c keeps it: this client. */
void command_member(const struct command_client *cl, struct queue_member *who);

/* Write the reply of a finished call into l: the common replies by hand
 * (command_reply_text), any other, or a common one the hand could not finish
 * for want of memory, through jansson. -ENOMEM. */
int command_write_reply(struct command_call *call, int rc, json_t *id,
                        struct line *l);

/* Cut a batch op's error message so that, written as JSON (a control byte
 * takes six bytes, a quote or backslash two), it takes at most
 * COMMAND_BATCH_MESSAGE_MAX bytes; a cut message ends in "...". */
void command_cut_message(char *msg);

/* Turn a finished call into out, in exactly one of four forms: a wait (an
 * alloc that waits for space), nothing (noreply), the handler's written-out
 * text closed with the "id" (batch, list), or the reply as text when it is
 * a common one (command_reply_text), else as JSON. Frees what the call
 * built. */
void command_finish(struct command_call *call, int rc, json_t *id,
                    struct command_result *out);

#endif
