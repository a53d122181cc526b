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

#endif
