// SPDX-License-Identifier: Apache-2.0
/*
 * The op table's types, which its callers (conn, waitq, server) and the
 * rooms of its handlers (cmd_call and the families) share: the daemon's
 * state as the handlers read it, a client's protocol state, a result and its
 * flags, the bounds of a request. Declares no function.
 */
#ifndef SHMB_COMMAND_TYPES_H
#define SHMB_COMMAND_TYPES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "../proto/line.h"
#include "../proto/protocol.h"
#include "clock.h"
#include "pool.h"
#include "queue.h"
#include "store.h"

/* Per-connection caps; hitting one is an EDQUOT reply naming it. */
struct command_limits {
    uint64_t max_pins;    /* pins one connection may hold */
    uint64_t max_pending; /* allocations one connection may leave uncommitted */
};

struct command_client;
struct command_result;
struct command_env;
TAILQ_HEAD(command_clients, command_client);

/* A request whose reply waits for a queue's pages to be made or freed off
 * the loop (COMMAND_WORK); its client's connection runs nothing more
 * meanwhile. */
struct command_work;

/* The reply to client's waiting request (COMMAND_WORK) has come: the
 * callee owns res's reply. Called on the loop, from the queue's work
 * finishing; it must not run the client's next requests from inside the
 * call (the queues are being updated), only queue them to run. */
typedef void (*command_work_done_fn)(struct command_env *env, struct command_client *client,
                                     struct command_result *res);

/* What the op table reads besides the store: the daemon's shared state.
 * Set up with command_env_init. */
struct command_env {
    struct pool_set *pools;             /* pools[0] is the default pool */
    uint64_t started_ms;                /* monotonic, for uptime */
    unsigned clients;                   /* connections open now */
    struct command_clients client_list; /* every open client, newest first: the
                                           one list of them (the server walks it
                                           too) */
    struct command_limits limits;
    uint64_t noreply_errors; /* errors of "noreply" requests: logged, not sent */
    size_t max_reply; /* a list reply's byte cap when below COMMAND_LIST_MAX_REPLY
                         (--max-queued-output, set by the connection); 0: none */
    struct queue_set queues; /* the broadcast queues of every pool */
    command_work_done_fn work_done; /* NULL: a queue's pages are made and freed
                                       within the request (tests, the fuzzer) */
    uint64_t next_client_id; /* the number the next connection gets, from 1 */
};

/* One client's protocol state, kept by its connection. */
struct command_client {
    TAILQ_ENTRY(command_client) link;   /* env->client_list, while listed */
    bool listed;
    struct pool *pool;                  /* chosen by hello, NULL before */
    struct store_holder *holder;        /* created by hello in pool's store */
    bool said_hello;
    bool read_only; /* hello said "mode":"ro" */
    char name[SHMB_NAME_MAX + 1];
    pid_t pid;     /* the peer's, as the kernel gives it: 0 when the client is
                      in a pid namespace the daemon cannot see into */
    pid_t own_pid; /* what its hello said ("pid"), in its own namespace; 0
                      when it said none */
    uid_t uid;
    gid_t gid;
    gid_t *groups; /* the peer's supplementary groups, for pools' group=;
                      owned by whoever fills them in (the connection) */
    size_t n_groups;
    uint64_t connected_unix; /* wall-clock seconds, for listing */
    uint64_t id;             /* its number in this daemon's life, from 1 */
    struct command_work *work; /* its request waiting for a queue's pages, or NULL */
    /* The noreply commit_at refused since the last reply this connection
     * was sent: how many, and the first one's key and error, told with the
     * next reply ("lost", PROTOCOL.md section 11). */
    struct command_lost {
        uint64_t count;
        int code;
        size_t key_len;
        char key[SHMB_KEY_MAX];
        char message[SHMB_ERROR_MSG_MAX];
    } lost;
};

enum command_flag {
    COMMAND_SEND_FD = 1,    /* attach a descriptor to this reply: fd, or the
                               segment's when fd is -1 */
    COMMAND_CLOSE = 2,      /* close the connection after this reply */
    COMMAND_SILENT = 4,     /* "noreply": nothing to send */
    COMMAND_WAIT = 8,       /* an alloc waits for space: retry wait_request later */
    COMMAND_WORK = 16,      /* the reply comes later, through env->work_done: run
                               nothing more of this client until then */
    COMMAND_WAIT_SOFT = 32, /* with COMMAND_WAIT: a wait the request did not ask
                               for (commits on their way, up to 100 ms); when the
                               client's input ends, retry it as final at once
                               rather than closing the connection */
};

struct command_result {
    struct line text;       /* the reply, written out, without its newline (the
                               common success replies skip jansson); empty when
                               there is nothing to send (COMMAND_SILENT,
                               COMMAND_WAIT) or memory ran out; the caller
                               frees text.buf with shmb_free */
    unsigned flags;         /* enum command_flag */
    int fd;                 /* COMMAND_SEND_FD: a queue's descriptor, borrowed
                               (valid until the next request of this client
                               runs); -1: the segment's */
    json_t *wait_request;   /* COMMAND_WAIT: the request to retry; the caller owns it */
    uint64_t wait_until_ms; /* COMMAND_WAIT: when the wait ends (clock_now_ms) */
};

/* Largest "wait_ms" an alloc may ask for: an hour. */
#define COMMAND_MAX_WAIT_MS 3600000
/* Operations one "batch" request may carry. */
#define COMMAND_MAX_BATCH 4096
/* An error message inside a batch reply is cut to this many bytes once
 * written as JSON, so that one op's reply, its "id" aside, stays under
 * COMMAND_BATCH_REPLY_MAX bytes and a batch reply under 4096 of them plus
 * the ids it echoes (about as long as in the request line, a number in at
 * most 24 bytes): about 2.2 MiB. */
#define COMMAND_BATCH_MESSAGE_MAX 448
#define COMMAND_BATCH_REPLY_MAX 512
/* A list reply stops adding entries once it passes this many bytes, or
 * env->max_reply when smaller (and says "truncated":true): 100,000 entries
 * of 255-byte keys would be ~170 MB. An entry is at most ~1.7 KB, so a reply
 * stays under the cap + 2 KiB. */
#define COMMAND_LIST_MAX_REPLY (4 * 1024 * 1024)
/* Objects one list request looks at, at most: a prefix that few keys have
 * would otherwise cost a walk over every object of the pool (a million
 * small objects: tens of milliseconds in which nobody else is served). A
 * list that stops there replies "next", where to go on ("from"). */
#define COMMAND_LIST_MAX_SCAN 65536

#endif
