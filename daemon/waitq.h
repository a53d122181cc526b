// SPDX-License-Identifier: Apache-2.0
/*
 * Allocations waiting for space (an alloc with "wait_ms"), in arrival
 * order: retried once per loop iteration when the store says room may have
 * been made, and answered at their deadlines by one timer for the earliest.
 * Knows nothing about sockets or connections: a waiter is an entry that the
 * caller embeds, with a callback for its answer.
 */
#ifndef SHMB_WAITQ_H
#define SHMB_WAITQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <uv.h>

#include "command.h"

struct waitq_entry;

/* The answer to a waiting alloc (res has no COMMAND_WAIT): the entry has
 * left the queue and its request is freed; the callee owns res's reply. */
typedef void (*waitq_done_fn)(struct waitq_entry *entry, struct command_result *res);

/* One waiting alloc, embedded in whatever waits (a connection). */
struct waitq_entry {
    TAILQ_ENTRY(waitq_entry) link;
    struct command_client *client;
    json_t *request;   /* the alloc to retry; NULL when not waiting */
    uint64_t until_ms; /* its deadline, clock_now_ms time */
    waitq_done_fn done;
};

struct waitq {
    struct command_env *env;
    TAILQ_HEAD(, waitq_entry) entries; /* oldest first */
    uv_check_t room_check;             /* once per loop iteration */
    uv_timer_t timer;                  /* the earliest deadline */
    uint64_t room_gen;                 /* the store's room generation at the last try */
    bool started;
};

/* Set up an empty queue on loop. 0 or a libuv error. */
int waitq_init(struct waitq *q, uv_loop_t *loop, struct command_env *env);

/* Close the queue's handles; every entry must have been taken out. */
void waitq_close(struct waitq *q);

/* True when entry waits in a queue. */
static inline bool waitq_waiting(const struct waitq_entry *entry)
{
    return entry->request != NULL;
}

/* Queue entry (client, done set) with request (taken over) and its deadline. */
void waitq_add(struct waitq *q, struct waitq_entry *entry, json_t *request,
               uint64_t until_ms);

/* Take entry out without an answer (its connection closes); frees its request. */
void waitq_remove(struct waitq *q, struct waitq_entry *entry);

/* Answer entry now, as at its deadline (its last try), through its done
 * callback: its client's input ended, and the wait was not one it asked for. */
void waitq_expire(struct waitq *q, struct waitq_entry *entry);

#endif
