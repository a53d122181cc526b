// SPDX-License-Identifier: Apache-2.0
/*
 * A connection's turns: what the set (conn.c) starts and hands on: reading,
 * a waiting alloc's answer, a queue request's, the flush and the finish.
 */
#ifndef SHMB_CONN_TURN_H
#define SHMB_CONN_TURN_H

#include "conn_base.h"

/* Write this batch's replies: directly when the socket takes them, else queue
 * the rest (the write request takes the buffer). */
int conn_flush(struct conn *conn);

/* Flush what this batch produced, then close gracefully: the last reply
 * (an EMSGSIZE, say) reaches the client before the socket closes. */
void conn_finish(struct conn *conn);

/* libuv's read callback of a connection's socket: the bytes framed into
 * lines and run, or the input's end. */
void conn_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

/* The waiting alloc got its answer (res has no COMMAND_WAIT; the queue has
 * let it go): deliver it and go on with the requests that queued up behind
 * it. */
void conn_wait_done(struct waitq_entry *entry, struct command_result *res);

/* The reply to a queue request that waited for its pages (COMMAND_WORK):
 * queue it, and run the requests behind it on the next loop iteration, not
 * from inside the queues' update that answered it. */
void conn_on_work_done(struct command_env *env, struct command_client *client,
                       struct command_result *res);

#endif
