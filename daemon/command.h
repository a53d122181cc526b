/*
 * The protocol step of the daemon: one request line in, one reply out. Parses
 * and validates the JSON, dispatches through the op table, calls the store.
 * Knows nothing about sockets or libuv: conn.c frames the lines and writes
 * the replies, so this layer can be driven by a fuzzer or a unit test.
 */
#ifndef SHMB_COMMAND_H
#define SHMB_COMMAND_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../proto/protocol.h"
#include "segment.h"
#include "store.h"

/* What the op table reads besides the store: the daemon's shared state. */
struct command_env {
    struct store *store;
    const struct segment *segment;
    const char *shm_dir;
    uint64_t started_ms;  /* monotonic, for uptime */
    unsigned clients;     /* connections open now, kept by the server */
};

/* One client's protocol state, kept by its connection. */
struct command_client {
    struct store_holder *holder; /* created by hello, NULL before */
    bool said_hello;
    char name[SHMB_NAME_MAX + 1];
    pid_t pid;
    uid_t uid;
    gid_t gid;
};

enum command_flag {
    COMMAND_SEND_FD = 1, /* attach the segment's descriptor to this reply */
    COMMAND_CLOSE = 2,   /* close the connection after this reply */
};

struct command_result {
    json_t *reply;  /* the caller owns it; NULL when there is nothing to send */
    unsigned flags; /* enum command_flag */
};

/* Execute one request line (without its '\n'). Never fails: a bad request
 * gets an error reply. out->reply is NULL only when memory ran out. */
void command_execute(struct command_env *env, struct command_client *client,
                     const char *line, size_t len, struct command_result *out);

/* The reply to a request line longer than SHMB_MAX_LINE; the connection
 * closes after it. */
void command_oversized(size_t limit, struct command_result *out);

/* Drop everything client holds in the store (pins, pending allocs). */
void command_client_close(struct command_env *env, struct command_client *client);

/* Monotonic milliseconds, the clock uptime and ages are measured with. */
uint64_t command_now_ms(void);

#endif
