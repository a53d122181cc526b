// SPDX-License-Identifier: Apache-2.0
/*
 * The object store: keys, pins, awaited reads and eviction over the ring. It
 * is the state the daemon keeps per object, independent of sockets: a
 * connection is a "holder" here, an opaque handle the daemon maps to it.
 * Knows nothing about sockets or JSON; writes into the segment only through
 * the ring. Its types are in store_types.h and its calls by key (get,
 * release, contains, list) in keys.h, both included here: callers include
 * this header alone.
 */
#ifndef SHMB_STORE_H
#define SHMB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "../proto/layout.h"
#include "keys.h"
#include "store_types.h"

/* The largest payload one object can have in a data area of data_size
 * bytes: an empty ring, one chunk with the longest key (its header, the key
 * and the alignment of both). 0 when not even that fits. */
uint64_t store_largest_object(uint64_t data_size);

/* The max object size when none is given (--max-object-size): half of size
 * (what was asked for the segment, header page included), at most
 * STORE_DEFAULT_MAX_OBJECT, and at most store_largest_object(data_size) when
 * anything fits in the data area at all (data_size 0: not known yet). */
uint64_t store_default_max_object(uint64_t size, uint64_t data_size);

/* -EINVAL with a message naming --max-object-size when objects of max bytes
 * cannot fit in a data area of data_size bytes (see store_largest_object). */
int store_check_max_object(uint64_t data_size, uint64_t max, struct shmb_error *err);

/* Create a store over a data area (see ring_init). The caller owns the result
 * and frees it with store_free. */
struct store *store_new(void *data, uint64_t data_offset, uint64_t data_size,
                        struct shmb_segment_header *cursor,
                        const struct store_config *cfg, struct shmb_error *err);
void store_free(struct store *s);

/* Like store_new, but over the data area of an existing segment: walk its
 * chunk headers from the cursor and bring back every committed object with
 * its key, size, offset and awaited reads. Pins and pending allocations are
 * gone with their connections. Anything inconsistent is dropped, never
 * trusted; report says what. */
struct store *store_adopt(void *data, uint64_t data_offset, uint64_t data_size,
                          struct shmb_segment_header *cursor,
                          const struct store_config *cfg,
                          struct store_adopt_report *report, struct shmb_error *err);

/* A holder: one client's pins and pending allocations. The store owns it;
 * store_holder_free releases every pin and drops every pending allocation,
 * as when a client disconnects. */
struct store_holder *store_holder_new(struct store *s);
void store_holder_free(struct store *s, struct store_holder *h);

/* Reserve size bytes under key for h to write; the object is invisible to
 * others until store_commit. Reclaims committed objects, oldest first, that
 * are neither pinned nor awaited, then retries once. readers is the number of
 * reads the object awaits before it may be reclaimed.
 * -EINVAL, -EEXIST, -E2BIG, -ENOSPC (the message names the blocker), -ENOMEM. */
int store_alloc(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                uint64_t size, uint32_t readers, struct store_extent *out,
                struct shmb_error *err);

/* Drop pending allocations older than max_age_ms (oldest first); their
 * holders get -ETIMEDOUT when they commit them. Returns how many went. */
size_t store_expire_pending(struct store *s, uint64_t max_age_ms);

/* Make h's pending allocation of key visible. -ENOENT otherwise, -ETIMEDOUT
 * when store_expire_pending dropped it. */
int store_commit(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                 struct shmb_error *err);

/* Give h an arena of about size payload bytes (arena.h: arena_grant_size),
 * giving back the one it holds first; size 0 only gives it back. client
 * names h in messages. out: the arena's payload (offset 0, size 0 when
 * none); token: the token its lock word carries (SHMB_ARENA_WORD), which the
 * client's compare-and-swap expects (0 when none). -EINVAL, -ENOSPC (the message
 * names the blocker), -ENOMEM, -EIO. */
int store_arena(struct store *s, struct store_holder *h, uint64_t client, uint64_t size,
                struct store_extent *out, uint64_t *token, struct shmb_error *err);

/* A commit_at of h's is being handled, whatever comes of it: one fewer of
 * its commits on their way into its arena (if it holds one), so that a
 * commit refused before it reached the arena (a field out of range) does
 * not hold the arena for ever. store_commit_at does this itself; the
 * caller does it for a commit_at it refuses before. */
void store_commit_seen(struct store *s, struct store_holder *h);

/* Fold the chunks h's client published in its arena (SHMB_CHUNK_WRITTEN,
 * PROTOCOL.md section 11, "Publishing") into committed objects, each
 * checked as a commit_at is; h NULL: every held arena's. Called before any
 * request on the pool is handled, before expiries, and (close) when h
 * gives its arena back or goes: then nothing published after is folded.
 * A refused chunk is recorded for h's next reply (store_holder_refused); a
 * malformed one stops the folds of that arena and takes it back. */
void store_fold_published(struct store *s, struct store_holder *h, bool close);

/* Take the record of h's published chunks a fold refused since it was last
 * taken: true and *out filled when there was one. */
bool store_holder_refused(struct store_holder *h, struct store_refused *out);

/* Commit the chunk h laid out at offset (its header's place) in its arena:
 * key, a payload of size bytes, readers awaited reads. The daemon writes
 * the header; the object is then committed as by store_commit. out: the
 * payload. -ESTALE (no arena, or offset outside it), -EINVAL (not at the
 * arena's next free byte, past its end, bad key or readers), -E2BIG,
 * -EEXIST, -ENOMEM, -EIO. */
int store_commit_at(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                    uint64_t offset, uint64_t size, uint32_t readers,
                    struct store_extent *out, struct shmb_error *err);

/* Drop h's pending allocation of key. -ENOENT otherwise. */
int store_abort(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                struct shmb_error *err);

/* One awaited read of an object, pending or committed, will never come
 * (its reader left for good): one fewer awaited. -ENOENT when there is no
 * such object or it awaits none. */
int store_forgo_read(struct store *s, const char *key, size_t key_len);
/* n of them at once (as many as it awaits, at most): one lookup. */
int store_forgo_reads(struct store *s, const char *key, size_t key_len, uint32_t n);

/* One more awaited read of key, pending or committed (a reader that joined
 * after its writer counted them). -ENOENT when there is no such object or
 * it is at STORE_MAX_READERS. */
int store_expect_read(struct store *s, const char *key, size_t key_len);

/* An awaited read done in place by a read-only client ("read" op): one
 * fewer awaited read of the committed object key whose generation is gen
 * (counted in fast_reads). 0, also when it awaits none; -ENOENT when no
 * committed object has that key and generation (it went, or was replaced). */
int store_read_done(struct store *s, const char *key, size_t key_len, uint32_t gen);

/* Add readers awaited reads to a committed object. -ENOENT, -EINVAL. */
int store_touch(struct store *s, const char *key, size_t key_len, uint32_t readers,
                struct shmb_error *err);

/* Remove key at once; the bytes go when the last pin goes. -ENOENT when no
 * committed object has that key. */
int store_delete(struct store *s, const char *key, size_t key_len,
                 struct shmb_error *err);

/* How often a head-of-line blocker that awaits reads done in place is
 * looked at again while allocations wait: those reads count in its seal and
 * send nothing. */
#define STORE_FAST_READ_RECHECK_MS 10

/* When a read lease will let the head-of-line blocker go (the monotonic
 * millisecond of store_now), or, when it is listed as awaiting reads done in
 * place, STORE_FAST_READ_RECHECK_MS from now if sooner; UINT64_MAX when
 * neither: waiting allocations are retried then. */
uint64_t store_lease_wake_ms(struct store *s);

/* An allocation that found no room is going to wait for it rather than
 * fail: do not count it among the ENOSPC refusals (yet). */
void store_retract_enospc(struct store *s);

/* True when the ring's oldest chunk is a held arena whose client has
 * commit_at requests on their way (arena_committing): it is not taken back
 * before they are handled, which takes microseconds unless that client
 * stopped between its copy and its send, so an allocation refused for room
 * may wait a little for it (the last of them bumps the room generation). */
bool store_commits_due(const struct store *s);

/* The largest payload alloc accepts. */
uint64_t store_max_object_size(const struct store *s);

/* Change the read lease (SIGHUP); 0 turns it off. */
void store_set_read_lease(struct store *s, uint64_t read_lease_ms);

/* Occupancy and counters, all but the blocker: O(1), for callers that
 * come often (systemd's STATUS= line every second). */
void store_counts(const struct store *s, struct store_stats *out);

/* store_counts and the head-of-line blocker: the oldest object reclaim
 * cannot pass. Amortised O(1), however many objects the store holds (see
 * store_blocker_checks). */
void store_stats(struct store *s, struct store_stats *out);

/* How many objects the blocker searches of store_stats and
 * store_lease_wake_ms looked at so far: the measure of their cost, for
 * tests. */
uint64_t store_blocker_checks(const struct store *s);

/* Bumped whenever something may have made room: a pin or an awaited read
 * went, an object was deleted, an allocation dropped. */
uint64_t store_room_generation(const struct store *s);

/* Per-holder figures, for listing clients. */
struct store_holder_stats {
    uint64_t pins;         /* pins held, a key pinned twice counts twice */
    uint64_t pending;      /* allocations not yet committed */
    uint64_t bytes_pinned; /* payload bytes of the distinct objects pinned */
};
void store_holder_stats(const struct store_holder *h, struct store_holder_stats *out);

/* The ring underneath, for inspection and tests; the store keeps ownership. */
const struct ring *store_ring(const struct store *s);

/* Name of a state as the protocol spells it ("pending", ...). */
const char *store_state_name(enum store_state state);

/* When the oldest pending allocation was made, in the monotonic milliseconds
 * store_expire_pending counts in; UINT64_MAX when nothing is pending. */
uint64_t store_oldest_pending_ms(const struct store *s);

#endif
