// SPDX-License-Identifier: Apache-2.0
/*
 * What the library's files share and its users never see: the handle's
 * insides and the call machinery of client.c, which objects.c, many.c and
 * report.c build on. Not installed; every name here is local to the
 * libraries (the .so's version script, the .a's symbol filter).
 */
#ifndef SHMB_CLIENT_INTERNAL_H
#define SHMB_CLIENT_INTERNAL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "../proto/catalog.h"
#include "../proto/error.h"
#include "../proto/line.h"
#include "../proto/protocol.h"
#include "shmbroker.h"

/* The arena a handle holds (arena.c): [offset, offset + size) of the
 * segment, granted on this connection; puts lay their chunks out from
 * cursor on. Forgotten with the connection: an arena does not survive a
 * reconnect (the daemon takes it back when the connection goes). */
struct client_arena {
    uint64_t offset, size; /* size 0: none held */
    uint64_t cursor;       /* the next chunk's offset, as the daemon expects it */
    uint64_t chunks;       /* chunks laid out in it (SHMB_ARENA_MAX_OBJECTS) */
    uint64_t token;        /* the grant's token in the arena's lock word */
    bool unsure;  /* commits went without waiting since the last reply: one that
                     failed left the daemon's cursor behind ours */
    bool off;     /* this connection's daemon gives none (ENOSYS, EPERM, EINVAL) */
    unsigned skip; /* puts left that go without an arena after ENOSPC */
};

/* A handle: one connection to shmbrokerd and its mapping of the segment. */
struct shmb {
    int sock;           /* -1 when not connected */
    int seg_fd;         /* the descriptor hello passed, until it is mapped */
    unsigned char *map; /* the segment mapping, NULL before */
    size_t map_size;
    dev_t map_dev; /* the mapped file, to recognise it after a restart */
    ino_t map_ino;
    int populate;
    int read_only;
    unsigned alloc_wait_ms;
    char path[108]; /* where shmb_connect found the daemon */
    char name[SHMB_NAME_MAX + 1];
    char pool[sizeof(((shmb_info_t *)0)->pool)]; /* shmb_set_pool's, "" for the default */
    bool pool_too_long; /* shmb_set_pool was given more than fits: connect refuses */
    /* The pool shmb_connect said hello to, which shmb_reconnect says hello
     * to again whatever shmb_set_pool is told since. */
    char dial_pool[sizeof(((shmb_info_t *)0)->pool)];
    shmb_info_t info;
    struct shmb_error err;
    char *rbuf; /* bytes received, not yet a whole reply */
    size_t rlen, rcap;
    struct line w; /* the request lines being sent, reused */
    uint64_t last_id;  /* the "id" of the last request sent; never reused */
    /* The catalog of the mapped segment, from the hello reply (read.c):
     * 0 slots when the daemon publishes none (an older daemon, a segment
     * too small); then every shmb_read asks the daemon. */
    struct shmb_catalog_view catalog;
    shmb_read_stats_t read_stats;
    unsigned read_wait_us; /* shmb_set_read_wait's */
    /* When shmb_read last looked at the connection (CLOCK_MONOTONIC_COARSE
     * milliseconds; read.c): a daemon that died without marking its
     * segment retired shows as the connection's end closed. */
    uint64_t looked_ms;
    struct client_arena arena;
    size_t arena_want; /* shmb_set_arena's; 0: arenas off */
    bool noreply_sent; /* requests without a reply went out since the last reply */
    /* Puts sent without waiting since the last reply: how many, the first
     * one's key and the last one's (a shmb_read of it looks for its commit
     * in the catalog before asking the daemon, read.c). A reply proves them
     * handled (a refused one is then told by "lost"); a connection that
     * ends first makes them lost, as far as anyone can tell
     * (client_unconfirmed_lost). */
    struct {
        uint64_t count;
        char key[SHMB_KEY_MAX + 1];
        char last[SHMB_KEY_MAX + 1];
    } unconfirmed;
    /* Puts sent without waiting that the daemon refused, as a reply told
     * ("lost"), or that were unconfirmed when the connection ended (code
     * -ECONNRESET): how many, the first one's key, error and message. The
     * next put reports them (client_arena_put). */
    struct {
        uint64_t count;
        int code;
        char key[SHMB_KEY_MAX + 1];
        char message[SHMB_ERROR_MSG_MAX];
    } lost;
    /* Misuse guards, checked on entry to every call (client_enter): the
     * process's fork count when this handle connected (the connection is
     * that process's), the pid that connected, and whether a call runs. */
    atomic_ulong forks;
    atomic_int pid;
    atomic_bool busy;
};

/* The start of every call that uses the connection or the handle's buffers:
 * refuse it in a process that did not connect the handle (a child of
 * fork() shares the parent's socket, and the two would take each other's
 * replies), and while another call runs on the handle (another thread's: a
 * handle serves one call at a time). Nothing is sent and the handle is not
 * touched then. An atomic exchange and two loads: nothing next to a round
 * trip. */
int client_enter(shmb_t *c);

/* How many fork()s made this process (counted in the child by a
 * pthread_atfork handler that shmb_connect installs): a handle made at
 * another count belongs to an ancestor. */
extern atomic_ulong client_forks;

/* The end of a call client_enter let in. */
void client_leave(shmb_t *c);

/* Receive until the buffer holds one whole line; returns its length (without
 * the '\n'), which the caller consumes with client_consume. */
int client_read_line(shmb_t *c, size_t *line_len);

/* The reply line of len bytes at the head of the buffer told of puts sent
 * without waiting that the daemon refused ("lost"): add them to c->lost.
 * reply, the line decoded (NULL when it was an error), loses the field. */
void client_note_lost(shmb_t *c, size_t len, json_t *reply);

/* The connection ends (lost, reset, or left for a new one): puts sent
 * without waiting that no reply has proved handled join c->lost, so that
 * the next put reports them. */
void client_unconfirmed_lost(shmb_t *c);

/* A reply was read: every request sent before it was handled. */
void client_replied(shmb_t *c);

/* Drop the first line (and its '\n') from the receive buffer. */
void client_consume(shmb_t *c, size_t line_len);

/* Send the bytes of c->w. */
int client_send(shmb_t *c);

/* The "id" of the next request: a per-handle counter, never 0 and never
 * reused, even across reconnects, so that a late reply cannot match. */
uint64_t client_next_id(shmb_t *c);

/* An id as text for a message: id_json when not NULL, else the integer id;
 * "none" when has is false. */
const char *client_id_text(const json_t *id_json, uint64_t id, bool has, char *buf,
                           size_t len);

/* The reply at the head of the buffer (len bytes) does not answer the
 * request just sent: its "id" is another's, or it has none (the daemon
 * answers a line it cannot parse without one, even one that said noreply).
 * Taking it would hand one call's reply to another, say another object's
 * offset to an alloc. So the connection is reset, as a disconnect does. */
int client_out_of_step(shmb_t *c, const char *want, const char *got, size_t len);

/* Decode the reply line (len bytes) at the head of the buffer after checking
 * that it answers the request (want or id, as client_id_matches). first: the
 * connection's first request (hello), which a refusal at connect time answers
 * without an id (nothing else was sent, so nothing can be confused). 0 with
 * *reply owned by the caller (when reply is not NULL), the reply's error, or
 * -ECONNRESET when the reply is out of step. */
int client_decode(shmb_t *c, size_t len, const json_t *want, uint64_t id, bool first,
                  json_t **reply);

/* Send request (the library keeps no reference; NULL, a request that could
 * not be built, is refused with -EINVAL) and wait for its reply: 0 with
 * *reply owned by the caller (when reply is not NULL), or the error. The
 * request gets the next id unless it has its own; the reply must carry it. */
int client_call(shmb_t *c, json_t *request, json_t **reply);

/* client_call, and first as in client_decode: connect.c's hello. */
int client_call_ex(shmb_t *c, json_t *request, bool first, json_t **reply);

/* Forget the connection (and the mapping too, unless keep_map): a new one
 * (connect.c) or the handle's end. */
void client_disconnect(shmb_t *c, bool keep_map);

/* A key that passed client_check_key, with its length: what the calls
 * below the public entries take (client_alloc, client_key_op,
 * client_begin_key, ...), so that a key is checked once on its way, at the
 * entry, and measured once. client_key_trusted makes one without the check
 * for a key checked already (client_check_keys) or made by the library by
 * rules that keep it valid (a queue's overflow keys). */
struct client_key {
    const char *s;
    size_t len;
};

/* Check a key before anything goes on the wire: the same check, code and
 * words as the daemon's (proto/text.c), for every call that takes a key.
 * The checked key in *out (not NULL). */
int client_check_key(shmb_t *c, const char *key, struct client_key *out);

/* A key that needs no check (see struct client_key): key measured. */
static inline struct client_key client_key_trusted(const char *key)
{
    return (struct client_key){key, strlen(key)};
}

/* Check the n keys of a _many call; the message names the first bad one's
 * index. */
int client_check_keys(shmb_t *c, size_t n, const char *const *keys);

/* Refuse an object size the protocol cannot carry (its integers are signed
 * 64-bit: 2^63 bytes or more would reach the daemon as a JSON error), with
 * E2BIG and the daemon's words, before anything is sent. */
int client_check_size(shmb_t *c, size_t size);

/* Copy a string field of a reply into a fixed buffer, "" when absent or
 * not a string. */
void client_copy_string(const json_t *obj, const char *field, char *dst, size_t len);

/* Read an unsigned integer field of a reply. */
int client_u64(shmb_t *c, const json_t *obj, const char *field, uint64_t *out);

/* The fields of a success reply decoded by jansson (the slow path). */
void client_reply_fields(const json_t *reply, struct line_reply *r);

/* The connection broke (what: where, saved: the errno or 0 for a close by
 * the daemon): close the socket, keep the mapping, and say so with
 * -ECONNRESET. */
int client_lost(shmb_t *c, const char *what, int saved);

/* Read the reply to the request whose id is id (sent already, maybe with
 * others after it: their replies stay in the buffer) into r, as
 * client_exchange does. */
int client_receive(shmb_t *c, uint64_t id, struct line_reply *r);

/* Send the lines in c->w (the last one a request whose id is id) and read
 * its reply into r: the common success shapes are recognised by hand,
 * anything else (errors) goes through jansson. 0 or the reply's error, its
 * message in c->err; -ECONNRESET when the reply answers another request. */
int client_exchange(shmb_t *c, uint64_t id, struct line_reply *r);

/* Start a request {"op":"OP"[,"id":ID],"key":KEY in c->w; id 0 for a
 * batch's element, which needs none. The caller checked the key. */
int client_begin_key(shmb_t *c, enum shmb_op_id op, uint64_t id,
                     const struct client_key *key);

/* A pointer to [offset, offset + size) after checking it lies in the data
 * area of the mapping: a confused daemon must not make us scribble. */
int client_extent(shmb_t *c, const struct line_reply *r, size_t want, void **ptr,
                  size_t *size);

/* A request whose only field is the key; its reply's fields in r (may be
 * NULL). */
int client_key_op(shmb_t *c, enum shmb_op_id op, const struct client_key *key,
                  struct line_reply *r);

/* The alloc request for key, appended to c->w (without a newline); id 0 in a
 * batch. */
int client_alloc_op(shmb_t *c, uint64_t id, const struct client_key *key, size_t size,
                    unsigned readers, unsigned wait_ms);

/* The end of a call client_enter let in, passing its result on. */
int client_done(shmb_t *c, int rc);

/* shmb_alloc and shmb_get inside a call client_enter let in (objects.c),
 * for the calls built on them (frames.c), with the key checked. */
int client_alloc(shmb_t *c, const struct client_key *key, size_t size, unsigned readers,
                 void **ptr);
int client_get(shmb_t *c, const struct client_key *key, const void **ptr, size_t *size);

/* A put in two round trips: alloc, memcpy, commit (objects.c); what
 * shmb_put falls back to without an arena. */
int client_put_copy(shmb_t *c, const struct client_key *key, const void *data,
                    size_t size, unsigned readers);

/* shmb_release_nowait inside a call client_enter let in (many.c). */
int client_release_nowait(shmb_t *c, const char *key);


#endif
