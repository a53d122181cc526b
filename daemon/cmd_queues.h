// SPDX-License-Identifier: Apache-2.0
/*
 * The handlers of the broadcast queues' ops: queue_create, queue_open,
 * queue_close, queue_shutdown, queue_delete, queue_list; a request waiting
 * for a queue's pages (COMMAND_WORK); the queues as the reports show them.
 * Called from command.c and the reports; they ask daemon/queue.c, never the
 * store.
 */
#ifndef SHMB_CMD_QUEUES_H
#define SHMB_CMD_QUEUES_H

#include "cmd_call.h"

/* A request waiting for a queue's pages (COMMAND_WORK). */
struct command_work {
    struct queue_waiter waiter; /* first: the waiter's answer finds the work */
    struct command_env *env;
    struct command_client *client;
    json_t *id;   /* the request's "id", owned; NULL when none */
    int op;       /* SHMB_OP_QUEUE_CREATE or SHMB_OP_QUEUE_DELETE */
    bool created; /* queue_create: this request made the queue */
};

/* Every queue of every pool, in creation order, as call's peer may see
 * them (with their seats when seats); a new reference, NULL when memory
 * ran out. */
json_t *command_queues_json(const struct command_call *call, bool seats);

/* queue_create: make the queue in this client's pool, or find the same; a
 * new queue's pages are made off the loop while the request waits. */
int cmd_queue_create(struct command_call *call);

/* queue_open: take the writer role or a reader seat, and pass the queue's
 * descriptor with the reply. */
int cmd_queue_open(struct command_call *call);

/* queue_close: leave roles this connection holds on a queue. */
int cmd_queue_close(struct command_call *call);

/* queue_shutdown: end every member's wait with ECANCELED; idempotent. */
int cmd_queue_shutdown(struct command_call *call);

/* queue_delete: a queue nobody holds goes now; the reply waits until its
 * memory is freed (off the loop). */
int cmd_queue_delete(struct command_call *call);

/* queue_list: every queue of every pool; with "seats":true, each seat. */
int cmd_queue_list(struct command_call *call);

#endif
