// SPDX-License-Identifier: Apache-2.0
/*
 * The catalog, the daemon's side: it writes the table of key hash -> chunk at
 * the end of a segment (layout in proto/layout.h, PROTOCOL.md section 10) so
 * that readers find committed objects without asking, and the heartbeat and
 * published counters in the header page. It writes only: what it probes is
 * a private mirror, never the shared table, which a read-write client may
 * have scribbled over. Knows nothing about objects, pins or sockets.
 */
#ifndef SHMB_CATALOG_H
#define SHMB_CATALOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "../proto/layout.h"

struct catalog;

/* Over the catalog area of a mapped segment: base = the mapping, entries at
 * base + offset, slots a power of two (0: an empty catalog that lists nothing
 * and counts everything unlisted), hdr = the header page (its catalog_*
 * words are written here: moves, unlisted, gen_next mirror). Writes the
 * empty table. The caller owns the result (catalog_free); NULL with err. */
struct catalog *catalog_new(void *base, uint64_t offset, uint64_t slots, uint32_t seed,
                            struct shmb_segment_header *hdr, struct shmb_error *err);
void catalog_free(struct catalog *c);

/* List key -> chunk for owner (the caller's, handed back by a later add
 * that displaces it). 0, or -ENOSPC when no entry is free within
 * SHMB_CATALOG_PROBES (then counted in catalog_unlisted until
 * catalog_remove(..., false)). With displaced not NULL, a full window is
 * not -ENOSPC: key takes the entry of the oldest listing in it (the
 * lowest generation), whose owner is stored in *displaced and is counted
 * in catalog_unlisted from now on, as if its add had failed: readers ask
 * the daemon for it. New objects are the ones read soonest; a full
 * catalog that kept its first objects would send every read of a newer
 * one to the daemon. *displaced is NULL when nothing was displaced. The
 * key must not be listed already. */
int catalog_add(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                uint32_t gen, uint64_t size, uint32_t flags, void *owner,
                void **displaced);

/* Unlist it (listed: what catalog_add returned was 0), with backward shift
 * under catalog_moves. */
void catalog_remove(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                    bool listed);

/* Change the flags of key's entry listing chunk in place (same generation,
 * so that a copy under way stays exact). Nothing when it is not listed. */
void catalog_set_flags(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                       uint32_t flags);

/* The next generation (never 0), mirrored to hdr->gen_next. */
uint32_t catalog_next_gen(struct catalog *c);

/* From now on hand out generations after floor (an adoption: what the old
 * header and the chunks it found used), skipping 0 when it wraps. */
void catalog_gen_after(struct catalog *c, uint32_t floor);

/* Heartbeat: heartbeat words and the counters (seq handled here;
 * counters->seq ignored). */
void catalog_beat(struct catalog *c, const struct shmb_published_counters *counters,
                  uint64_t unix_ms);

/* The segment is given up (proto/layout.h, retired): readers stop
 * answering from the mapping and ask the daemon. Before the daemon stops
 * serving it; catalog_new clears the word again. */
void catalog_retire(struct catalog *c);

/* While held (calls nest), catalog_moves stays odd: readers take no miss
 * for a proof, as while entries move. The pool holds the catalog of an
 * adopted segment while the store lists its objects again. */
void catalog_hold(struct catalog *c);
void catalog_release(struct catalog *c);

size_t catalog_listed(const struct catalog *c);
uint32_t catalog_unlisted(const struct catalog *c);

/* Times catalog_remove moved an entry back, for tests. */
uint64_t catalog_shifts(const struct catalog *c);

/* Listings a full window gave to a newer key (catalog_add's displaced). */
uint64_t catalog_displaced(const struct catalog *c);

#endif
