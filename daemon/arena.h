// SPDX-License-Identifier: Apache-2.0
/*
 * Arenas: ranges of the ring that one client lays its chunks out in itself
 * and commits with commit_at, a put in one round trip. This file owns an
 * arena's record (who holds it, where it is, how far it is filled), the size
 * a grant may have, the checks of a commit_at's placement, and the lock in
 * the arena's own chunk header (the count of its seal) that the daemon takes
 * before it takes an arena back. It knows nothing about keys, objects or
 * sockets: the store makes the objects and gives the space back to the ring.
 */
#ifndef SHMB_ARENA_H
#define SHMB_ARENA_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "../proto/error.h"
#include "../proto/layout.h"

struct object;
TAILQ_HEAD(arena_objects, object);

struct arena {
    void *holder;          /* the store holder that may commit into it; NULL once
                              given back (by it, a revoke, an expiry, its exit) */
    uint64_t client;       /* the holder's client number, for messages */
    uint64_t ring_id;      /* the arena's chunk in the ring */
    uint64_t chunk;        /* its header, from the start of the segment */
    uint64_t start, end;   /* its payload [start, end), from the start of the segment */
    uint64_t cursor;       /* where the next chunk must start */
    uint32_t made;         /* objects committed into it (SHMB_ARENA_MAX_OBJECTS) */
    uint64_t *seal;        /* the mapped seal of its header: the lock */
    uint64_t *inflight;    /* the mapped count of its client's commit_at on their
                              way (SHMB_ARENA_INFLIGHT_AT) */
    uint64_t *published;   /* the mapped end of the chunks its client published
                              (SHMB_ARENA_PUBLISHED_AT) */
    bool fold_stopped;     /* a published chunk was malformed: no more folds */
    uint64_t token;        /* the grant's token in that seal (SHMB_ARENA_WORD) */
    uint64_t last_use_ms;  /* grant or last commit_at (clock_now_ms) */
    uint64_t busy_since_ms; /* first seen BUSY by a would-be revoke; 0 when not */
    uint64_t busy_seen_ms;  /* last seen BUSY (or its page gone) by a would-be revoke
                               (counts as a use) */
    bool revoked;          /* taken back while held (the holder learns ESTALE) */
    bool busy_at_close;    /* its lock was BUSY when it was closed: a client may be
                              copying into it still, so it keeps every byte
                              until the ring comes round to it */
    struct arena_objects objects; /* committed into it, oldest first (the store's) */
};

/* The smallest arena: one chunk with the longest key and SHMB_ALIGN bytes. */
#define ARENA_MIN_SIZE SHMB_CHUNK_SIZE(SHMB_KEY_MAX, SHMB_ALIGN)

/* The payload bytes an "arena" request of asked bytes gets: min(asked,
 * max_object, data_size / 8) rounded down to SHMB_ALIGN. -EINVAL with the
 * numbers when that is below ARENA_MIN_SIZE. */
int arena_grant_size(uint64_t asked, uint64_t max_object, uint64_t data_size,
                     uint64_t *out, struct shmb_error *err);

/* Set up a record for an arena granted to holder: its chunk (header at
 * chunk, payload [start, end)), the mapped seal of its header and the
 * token the seal carries (the client expects it; arena_token). */
void arena_init(struct arena *a, void *holder, uint64_t client, uint64_t ring_id,
                uint64_t chunk, uint64_t start, uint64_t end, uint64_t *seal,
                uint64_t token, uint64_t now_ms);

/* A new token: 62 random bits (the two low ones clear), never 0. */
uint64_t arena_token(void);

/* Hand the lock to the client: the count of commits on their way becomes
 * 0 and the seal SHMB_ARENA_WORD(token, IDLE). 0, or -EIO when the page is
 * gone. */
int arena_open(struct arena *a);

/* The end of the chunks a's client published and the daemon has not folded
 * yet: *end in (a->cursor, a->end], or a->cursor when there are none (also
 * when the word holds anything outside the arena, or folds stopped).
 * close: the word becomes SHMB_ARENA_PUBLISH_CLOSED in the same atomic
 * step, so that nothing is published after (arena_close's callers). 0, or
 * -EIO when the page is gone. */
int arena_published(const struct arena *a, bool close, uint64_t *end);

/* Whether a's client counted commit_at on their way that the daemon has not
 * seen yet (SHMB_ARENA_INFLIGHT_AT; true when the page is gone): the chunk
 * at the cursor may be one, its header the daemon's to write. */
bool arena_commits_sent(const struct arena *a);

/* A commit_at into a is being handled (whatever its outcome): one fewer on
 * its way. True when none is left on its way now. */
bool arena_commit_seen(struct arena *a);

/* True when a's client has commits on their way (or the count cannot be
 * read): a is not taken back before they are handled. */
bool arena_committing(const struct arena *a);

/* -ESTALE when a commit_at of chunk_size bytes at offset cannot go into a:
 * there is none (a NULL), or offset lies outside it; -EINVAL when offset is
 * not the cursor or the chunk runs past the end. The message names the
 * numbers. */
int arena_check_commit(const struct arena *a, uint64_t offset, uint64_t chunk_size,
                       struct shmb_error *err);

/* Take the arena back from its client: the lock goes IDLE -> REVOKED; one
 * BUSY (the client is writing), or IDLE with commits on their way (the
 * client has written, its commit_at is not handled yet) or with published
 * chunks not folded yet (arena_published), is left alone
 * unless it has been so for busy_limit_ms (0: never), and then set REVOKED
 * anyway. 0 when the lock is now REVOKED, -EBUSY when the client is still
 * writing or committing, -EIO when the page is gone. A lock that is
 * neither (a client scribbled) counts as BUSY. */
int arena_revoke(struct arena *a, uint64_t now_ms, uint64_t busy_limit_ms);

/* Set the lock REVOKED whatever it is: the holder gave the arena back or is
 * gone. True when it was BUSY: a client may be copying into it still (one
 * the daemon disconnected, or that died mid-copy), so its unused bytes must
 * not be handed out again before the ring comes round to it. */
bool arena_close(struct arena *a);

/* When a held arena is due to be looked at by the expiry (--alloc-timeout
 * after its last use: a grant, a commit_at, or a would-be revoke that found
 * it BUSY), in clock_now_ms time. Always after the last look, so that an
 * arena held BUSY for ever is looked at once per --alloc-timeout, not on
 * every turn of the loop. */
uint64_t arena_due_ms(const struct arena *a, uint64_t timeout_ms);

#endif
