/*
 * One client connection: read, frame lines (bounded), hand each line to the
 * command layer, write replies (one write per readable batch), pass the
 * segment's descriptor with the hello reply, and release everything the
 * client held when it goes. Knows nothing about the store's internals.
 */
#ifndef SHMB_CONN_H
#define SHMB_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "command.h"

/* A client that stops reading its replies is cut off past this much queued
 * output, so that it cannot grow the daemon's memory without bound. */
#define CONN_MAX_QUEUED_OUTPUT (1024 * 1024)

struct server;

struct conn {
    uv_pipe_t pipe;             /* first: libuv callbacks cast back to conn */
    struct server *server;
    struct conn *prev, *next;   /* the server's list */
    struct command_client client;
    char *in;                   /* bytes read, not yet framed */
    size_t in_len, in_cap;
    char *out;                  /* replies of this batch, not yet written */
    size_t out_len, out_cap;
    uint64_t connected_ms;
    bool closing;
};

/* Accept one pending connection from the listener. The server owns it. */
int conn_accept(struct server *srv, uv_stream_t *listener);

/* Close the connection: release the client's pins and pending allocations at
 * once, free the memory in libuv's close callback. */
void conn_close(struct conn *conn);

#endif
