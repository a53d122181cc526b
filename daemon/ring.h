// SPDX-License-Identifier: Apache-2.0
/*
 * The ring allocator: positions in the data area, and nothing else. A C port
 * of vLLM's SingleWriterShmRingBuffer allocation and free logic (after its
 * fix), with out-of-order frees and a header at the start of every chunk so
 * the ring can be walked from the segment alone. Keys are opaque label bytes
 * here; the ring never interprets them.
 *
 * Positions are monotonic: start <= end, end - start <= size, and a chunk at
 * position p lives at physical offset p % size. A chunk never straddles the
 * physical end: when it does not fit before it, the tail gap is skipped and
 * the chunk starts the next lap. Chunks are reclaimed strictly oldest-first.
 */
#ifndef SHMB_RING_H
#define SHMB_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "../proto/layout.h"

/* One live chunk, in allocation order. 40 bytes. It holds everything the
 * ring needs to know about the chunk, so the header in the segment (which a
 * read-write client can change) is never read back. */
struct ring_slot {
    uint64_t phys;         /* offset of the chunk header in the data area */
    uint64_t size;         /* chunk bytes: header + padded payload */
    void *owner;           /* the caller's object, returned by ring_reclaim's callback */
    bool freed;            /* freed by its owner, waiting for the chunks before it */
    bool committed;        /* was committed: its id was seen, and is never handed out again */
    bool held;             /* found pending by an adoption: a client of the daemon that
                              died may still be copying into it, so its bytes stay
                              until reclaim reaches it at the head */
    uint32_t header_size;  /* the chunk header's bytes: the payload follows */
    uint64_t payload_size; /* bytes the owner asked for */
};

/* What a committed chunk freed at the newest end keeps of its bytes: a chunk
 * header without key and one aligned unit of payload, the smallest chunk a
 * walk of the segment accepts. It holds the chunk's id until reclaim takes
 * it in its turn. */
#define RING_REMNANT (2 * (uint64_t)SHMB_ALIGN)

struct ring {
    unsigned char *data;     /* first byte of the data area */
    uint64_t data_offset;    /* offset of the data area in the segment */
    uint64_t size;           /* bytes in the data area */
    uint64_t start, end;     /* monotonic positions; see above */
    uint64_t next_id;        /* id of the next chunk */
    uint64_t first_id;       /* id of slots[head] */
    struct ring_slot *slots; /* circular array of live chunks, oldest at head */
    size_t cap, head, count;
    struct shmb_segment_header *cursor; /* mirror of start/end/next_id, or NULL */
};

/* What ring_alloc hands out. Offsets are from the start of the segment. */
struct ring_chunk {
    uint64_t id;
    uint64_t phys; /* chunk header, in the data area */
    uint64_t chunk_size;
    uint64_t payload_offset; /* in the segment; a multiple of SHMB_ALIGN */
    uint64_t payload_size;
};

/* Asked by ring_reclaim whether the oldest chunk, not yet freed by its owner,
 * may go now. Returning true frees it; the callback must not call the ring. */
typedef bool (*ring_may_free_fn)(void *owner, uint64_t id, void *arg);

/* Called by ring_walk for every chunk header between start and end. hdr and
 * key are private copies, checked, that the walk made of the segment's bytes
 * (key is NUL-terminated after key_len bytes). */
typedef int (*ring_walk_fn)(const struct shmb_chunk_header *hdr, const char *key,
                            uint64_t payload_offset, void *arg);

/* Set up a ring over data (size bytes, data_offset into the segment). size
 * must be a non-zero multiple of SHMB_ALIGN and data SHMB_ALIGN-aligned.
 * cursor, when not NULL, receives start/end/next_id after every change. */
int ring_init(struct ring *r, void *data, uint64_t data_offset, uint64_t size,
              struct shmb_segment_header *cursor, struct shmb_error *err);

/* Free the ring's own memory; the data area is not touched. */
void ring_fini(struct ring *r);

/* Bytes a chunk with this label and payload needs; 0 on overflow. */
uint64_t ring_chunk_size(size_t label_len, uint64_t payload_size);

/* Allocate a chunk for payload_size bytes labelled with label (the key) and
 * write its header in state PENDING. -ENOSPC when it does not fit now,
 * -E2BIG when it can never fit, -EINVAL for a zero size or a label longer
 * than SHMB_KEY_MAX, -ENOMEM. */
int ring_alloc(struct ring *r, uint64_t payload_size, const char *label, size_t label_len,
               void *owner, struct ring_chunk *out, struct shmb_error *err);

/* True when an allocation of chunk_size bytes would succeed now. */
bool ring_fits(const struct ring *r, uint64_t chunk_size);

/* Record a chunk's state in its header (PENDING or COMMITTED). */
int ring_set_state(struct ring *r, uint64_t id, enum shmb_chunk_state state);

/* Record the owner's 32-bit tag in a chunk's header, for a later adoption. */
int ring_set_tag(struct ring *r, uint64_t id, uint32_t tag);

/* Chunk id was seen by readers though it is not committed itself (an arena
 * whose client handed out objects in it): when it is freed it keeps its id,
 * as a committed chunk does (ring_free). -ENOENT when id is not live. */
int ring_keep_id(struct ring *r, uint64_t id);

/* Give back the unused tail of chunk id (an arena given back): it keeps its
 * first chunk_size bytes (a multiple of SHMB_ALIGN, more than its header),
 * and the ring's end retreats by the rest, so the space is free at once, as
 * for an abort. Only the newest chunk can shrink: -EBUSY for any other (its
 * tail then stays inside it until it is reclaimed), -ENOENT when id is not
 * live, -EINVAL for a size it cannot take. */
int ring_shrink(struct ring *r, uint64_t id, uint64_t chunk_size);

/* The owner frees chunk id (any order). Its bytes come back once every older
 * chunk is free too: start advances over the freed chunks at the head. The
 * newest chunk's come back at once: the end retreats over it, and over the
 * freed chunks before it, down to the newest live chunk; the next chunk then
 * takes the id of the first one given back. Only a chunk never committed
 * gives its id back: a committed one (its id seen by readers, who may hold
 * it) keeps a freed chunk of RING_REMNANT bytes in its place, so that no
 * later chunk has its id, and the end stops there.
 * -ENOENT when id is not live, -EALREADY when it was already freed. */
int ring_free(struct ring *r, uint64_t id);

/* Reclaim from the oldest chunk on: chunks already freed go, chunks not yet
 * freed go when may_free says so; stop at the first one that may not
 * (head-of-line), or as soon as an allocation of want bytes fits (want = 0:
 * reclaim all that can go). Returns the bytes given back. */
uint64_t ring_reclaim(struct ring *r, uint64_t want, ring_may_free_fn may_free,
                      void *arg);

/* The oldest chunk that is not freed: its owner (NULL when there is none)
 * and, when out is not NULL, its extent. */
void *ring_oldest(const struct ring *r, struct ring_chunk *out);

/* Live chunks, oldest first: index 0 .. ring_count() - 1. ring_at returns
 * the owner, or NULL for a chunk freed but not yet reclaimed. */
size_t ring_count(const struct ring *r);
void *ring_at(const struct ring *r, size_t index, struct ring_chunk *out);

/* Bytes between start and end (chunks, freed chunks awaiting reclaim, and
 * skipped tail gaps), and size minus that. used + free == size. */
uint64_t ring_used(const struct ring *r);
uint64_t ring_free_bytes(const struct ring *r);

/* The walk over the chunks in the file, and adoption (ring_walk.c). */

/* Asked by ring_adopt for each chunk found in the segment: return the owner
 * that keeps it, or NULL to free it. hdr and key are private copies that
 * ring_adopt made and checked (key NUL-terminated after key_len bytes): the
 * segment itself may change under the daemon at any time, so the callback
 * must use only them. */
typedef void *(*ring_adopt_fn)(const struct shmb_chunk_header *hdr, const char *key,
                               uint64_t payload_offset, void *arg);

/* Rebuild the ring of an existing segment from its chunk headers, between
 * the cursor's start and end (read from r->cursor before ring_init reset it,
 * and passed here). Nothing in the segment is trusted: each header and key
 * is copied once into private memory (through the segment guard, so that a
 * file shrunk under the walk ends it there), the copy is checked and only
 * the copy is used. After a header that is corrupt or out of sequence the
 * walk resynchronises: it looks further on, in SHMB_ALIGN steps before end,
 * for a sound chunk whose id follows the last adopted one, rewrites the
 * bytes skipped as freed chunks carrying the lost ids (or a tail gap), and
 * goes on; with no such chunk it drops the rest. The ring's end is the end
 * of the last chunk adopted (a tail gap after it is not kept). Returns 0, or
 * -EBADMSG when something was skipped or dropped (err says what and where);
 * the ring is consistent and usable either way. */
int ring_adopt(struct ring *r, uint64_t start, uint64_t end, uint64_t next_id,
               ring_adopt_fn fn, void *arg, struct shmb_error *err);

/* Read and check one chunk header laid out inside another chunk (an arena's
 * payload holds them): at data-area offset phys, ending at or before limit.
 * The checks of a ring chunk (magic, state, sizes, key), into private
 * copies h and key (NUL-terminated); 0, -EBADMSG saying what is wrong, or
 * -EIO when the file was shrunk under the read. The caller checks the state
 * and the id. */
int ring_read_inner(const struct ring *r, uint64_t phys, uint64_t limit,
                    struct shmb_chunk_header *h, char key[SHMB_KEY_MAX + 1],
                    struct shmb_error *err);

/* Walk the chunk headers in the data area from start to end, validating each
 * one (magic, state, sizes, bounds, increasing ids). -EBADMSG with a message
 * naming the offset on the first corrupt header; a non-zero return of fn
 * stops the walk and is returned. */
int ring_walk(const struct ring *r, ring_walk_fn fn, void *arg, struct shmb_error *err);

#endif
