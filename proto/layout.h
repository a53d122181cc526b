// SPDX-License-Identifier: Apache-2.0
/*
 * The layout of a shmbroker segment: the bytes every process that maps it may
 * read. Only offsets are stored, never pointers, so any process (and a daemon
 * that restarts) can map the file at any address.
 *
 *   [ header page | data area: chunk, chunk, gap, chunk ... | catalog ]
 *
 * Every chunk starts with a chunk header (fixed fields, then the key), padded
 * to SHMB_ALIGN; the payload follows, also padded to SHMB_ALIGN.
 *
 * Layout version 2 publishes what readers need to read without asking the
 * daemon: the catalog (a table of key hash -> chunk at the end of the file),
 * a generation in every chunk header, and in the header page a heartbeat and
 * the occupancy counters. Only the daemon writes them; it never reads them
 * back (a read-write client can scribble over anything), and readers check
 * everything they use (see proto/catalog.h).
 */
#ifndef SHMB_PROTO_LAYOUT_H
#define SHMB_PROTO_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define SHMB_SEGMENT_MAGIC UINT64_C(0x31474553424d4853) /* "SHMBSEG1" */
#define SHMB_LAYOUT_VERSION 2
/* One page: the header never shares a page with payload, and the data area
 * starts page-aligned, so payload alignment holds in every mapping. */
#define SHMB_HEADER_PAGE 4096u
/* Payload alignment: a cache line, so two objects never share one. */
#define SHMB_ALIGN 64u
#define SHMB_KEY_MAX 255u

/* Where a field of a shared struct must stay: every process that maps the
 * segment reads it there, so one that moves is a new SHMB_LAYOUT_VERSION. */
#define SHMB_LAYOUT_AT(type, field, offset)                                              \
    _Static_assert(offsetof(type, field) == (offset), #type "." #field " moved")

/* The first bytes of the segment. Written once at creation, except the ring
 * cursor, which the daemon updates as it allocates and frees. */
struct shmb_segment_header {
    uint64_t magic;        /* SHMB_SEGMENT_MAGIC */
    uint32_t version;      /* SHMB_LAYOUT_VERSION */
    uint32_t header_size;  /* SHMB_HEADER_PAGE */
    uint64_t total_size;   /* bytes in the file */
    uint64_t data_offset;  /* where the data area starts */
    uint64_t data_size;    /* bytes in the data area, a multiple of SHMB_ALIGN */
    int64_t owner_pid;     /* the daemon that created or adopted the segment */
    uint64_t owner_start;  /* its start time (clock ticks after boot), so that
                              a recycled pid is not taken for it */
    uint64_t created_unix; /* seconds since the epoch */
    /* Ring cursor: monotonic positions into the data area and the next chunk
     * id, kept here so that a restarted daemon can walk the ring. */
    uint64_t ring_start;
    uint64_t ring_end;
    uint64_t ring_next_id;
    /* The catalog (layout version 2): catalog_slots entries of struct
     * shmb_catalog_entry at catalog_offset (page-aligned, after the data
     * area); 0 slots when the segment is too small to hold one. */
    uint64_t catalog_offset;
    uint64_t catalog_slots;   /* a power of two, or 0 */
    uint32_t catalog_seed;    /* the seed of shmb_catalog_hash, per segment */
    /* A sequence count, odd while the daemon moves entries (deleting one
     * shifts the entries after it back): a reader that missed a key may
     * trust the miss only when this was even and unchanged around it. */
    uint32_t catalog_moves;
    /* Committed objects the catalog does not list (no free entry within
     * SHMB_CATALOG_PROBES of their home): while not 0 a miss proves
     * nothing and readers ask the daemon. */
    uint32_t catalog_unlisted;
    uint32_t gen_next;        /* the next chunk generation (never 0) */
    /* The heartbeat: the daemon writes it every heartbeat_period_ms, so
     * that a reader of the mapping can tell a daemon that stopped
     * (shmbrokerctl status, when the daemon does not answer). */
    uint64_t heartbeat_unix_ms; /* CLOCK_REALTIME, milliseconds */
    uint64_t heartbeat_count;   /* beats since the daemon started */
    uint32_t heartbeat_period_ms;
    /* Not 0 once the daemon has given the segment up: it stopped serving
     * it (a stop, a pool removed by SIGHUP), or a new daemon is about to
     * remove the file a dead one left (--fresh, --remove-segment). Set
     * with a release store before the daemon lets go of the segment; 0
     * again only when a daemon adopts the file and serves it. A reader
     * that finds it set answers nothing from the mapping and asks the
     * daemon over its connection, which says whether it still serves (a
     * word a client scribbled only costs round trips). */
    uint32_t retired;
};

/* What a daemon writes into retired; any value but 0 means retired. */
#define SHMB_SEGMENT_RETIRED UINT32_C(0x44524954) /* "TIRD" */

_Static_assert(sizeof(struct shmb_segment_header) == 144, "segment header size");
SHMB_LAYOUT_AT(struct shmb_segment_header, magic, 0);
SHMB_LAYOUT_AT(struct shmb_segment_header, version, 8);
SHMB_LAYOUT_AT(struct shmb_segment_header, header_size, 12);
SHMB_LAYOUT_AT(struct shmb_segment_header, total_size, 16);
SHMB_LAYOUT_AT(struct shmb_segment_header, data_offset, 24);
SHMB_LAYOUT_AT(struct shmb_segment_header, data_size, 32);
SHMB_LAYOUT_AT(struct shmb_segment_header, owner_pid, 40);
SHMB_LAYOUT_AT(struct shmb_segment_header, owner_start, 48);
SHMB_LAYOUT_AT(struct shmb_segment_header, created_unix, 56);
SHMB_LAYOUT_AT(struct shmb_segment_header, ring_start, 64);
SHMB_LAYOUT_AT(struct shmb_segment_header, ring_end, 72);
SHMB_LAYOUT_AT(struct shmb_segment_header, ring_next_id, 80);
SHMB_LAYOUT_AT(struct shmb_segment_header, catalog_offset, 88);
SHMB_LAYOUT_AT(struct shmb_segment_header, catalog_slots, 96);
SHMB_LAYOUT_AT(struct shmb_segment_header, catalog_seed, 104);
SHMB_LAYOUT_AT(struct shmb_segment_header, catalog_moves, 108);
SHMB_LAYOUT_AT(struct shmb_segment_header, catalog_unlisted, 112);
SHMB_LAYOUT_AT(struct shmb_segment_header, gen_next, 116);
SHMB_LAYOUT_AT(struct shmb_segment_header, heartbeat_unix_ms, 120);
SHMB_LAYOUT_AT(struct shmb_segment_header, heartbeat_count, 128);
SHMB_LAYOUT_AT(struct shmb_segment_header, heartbeat_period_ms, 136);
SHMB_LAYOUT_AT(struct shmb_segment_header, retired, 140);

/* The occupancy counters the daemon publishes with each heartbeat, at
 * SHMB_COUNTERS_AT in the header page, under a sequence count (odd while
 * the daemon writes them): what shmbrokerctl status shows, read from the
 * mapping, when the daemon does not answer. Figures of the segment's pool. */
#define SHMB_COUNTERS_AT 256u
struct shmb_published_counters {
    uint32_t seq;          /* even when stable */
    uint32_t clients;      /* connections of this pool */
    uint64_t data_size, used, free;
    uint64_t objects, pending, pinned;
    uint64_t arenas, arena_bytes; /* arenas held, and their unused bytes */
    uint64_t allocs, commits, gets, evictions, enospc;
    uint64_t expired_allocs, lease_expiries;
    uint64_t fast_reads; /* awaited reads reported through the catalog path */
    int64_t pid;         /* the daemon that writes them */
};
_Static_assert(sizeof(struct shmb_published_counters) == 144, "published counters size");
SHMB_LAYOUT_AT(struct shmb_published_counters, seq, 0);
SHMB_LAYOUT_AT(struct shmb_published_counters, clients, 4);
SHMB_LAYOUT_AT(struct shmb_published_counters, data_size, 8);
SHMB_LAYOUT_AT(struct shmb_published_counters, used, 16);
SHMB_LAYOUT_AT(struct shmb_published_counters, free, 24);
SHMB_LAYOUT_AT(struct shmb_published_counters, objects, 32);
SHMB_LAYOUT_AT(struct shmb_published_counters, pending, 40);
SHMB_LAYOUT_AT(struct shmb_published_counters, pinned, 48);
SHMB_LAYOUT_AT(struct shmb_published_counters, arenas, 56);
SHMB_LAYOUT_AT(struct shmb_published_counters, arena_bytes, 64);
SHMB_LAYOUT_AT(struct shmb_published_counters, allocs, 72);
SHMB_LAYOUT_AT(struct shmb_published_counters, commits, 80);
SHMB_LAYOUT_AT(struct shmb_published_counters, gets, 88);
SHMB_LAYOUT_AT(struct shmb_published_counters, evictions, 96);
SHMB_LAYOUT_AT(struct shmb_published_counters, enospc, 104);
SHMB_LAYOUT_AT(struct shmb_published_counters, expired_allocs, 112);
SHMB_LAYOUT_AT(struct shmb_published_counters, lease_expiries, 120);
SHMB_LAYOUT_AT(struct shmb_published_counters, fast_reads, 128);
SHMB_LAYOUT_AT(struct shmb_published_counters, pid, 136);
_Static_assert(SHMB_COUNTERS_AT >= sizeof(struct shmb_segment_header) &&
                   SHMB_COUNTERS_AT + sizeof(struct shmb_published_counters) + 8 <=
                       SHMB_HEADER_PAGE,
               "the counters fit in the header page after the header");
_Static_assert(sizeof(struct shmb_segment_header) <= SHMB_HEADER_PAGE,
               "the header fits its page");

#define SHMB_CHUNK_MAGIC UINT32_C(0x4b4e4843) /* "CHNK" */

/* What a chunk holds; a reader trusts a payload only in state COMMITTED. */
enum shmb_chunk_state {
    SHMB_CHUNK_GAP = 1,       /* unused tail of a lap; chunk_size = gap bytes */
    SHMB_CHUNK_PENDING = 2,   /* allocated, being written */
    SHMB_CHUNK_COMMITTED = 3, /* visible to readers */
    SHMB_CHUNK_FREE = 4,      /* released; bytes reclaimable */
    /* A client's arena (layout version 2): a run of chunks the client lays
     * out itself, each committed by commit_at. Its payload holds them, one
     * after the other from its start; its tag counts the bytes committed, in
     * SHMB_ALIGN units, so that an adoption walks those and no further. */
    SHMB_CHUNK_ARENA = 5,
    /* A chunk its client laid out in its arena and published itself (proto/
     * PROTOCOL.md, section 11, "Publishing"): header, key and payload
     * written, the seal's generation the client's. Readers who were handed
     * its place may read it as a committed chunk; the daemon folds it into
     * a committed object (state COMMITTED, same generation) before it
     * serves any request on the pool. Found only inside an arena. */
    SHMB_CHUNK_WRITTEN = 6,
};

/* The fixed part of every chunk header; the key's bytes follow it. */
struct shmb_chunk_header {
    uint32_t magic;        /* SHMB_CHUNK_MAGIC */
    uint16_t state;        /* enum shmb_chunk_state */
    uint16_t key_len;      /* 0..SHMB_KEY_MAX */
    uint32_t header_size;  /* fixed part + key, padded to SHMB_ALIGN */
    uint32_t tag;          /* the owner's (the store keeps awaited reads) */
    uint64_t id;           /* monotonic chunk id */
    uint64_t chunk_size;   /* header + padded payload */
    uint64_t payload_size; /* bytes the owner asked for */
    /* The seal (layout version 2), one 64-bit word read and changed only
     * atomically: low 32 bits the chunk's generation, high 32 bits a count.
     * The generation is not 0 only while the chunk is committed and listed:
     * the daemon sets it when it publishes the chunk and sets it to 0 before
     * the chunk's bytes may be reused, so a reader that copied the payload
     * and finds the same generation after the copy has an exact copy.
     * The count: reads done in place that the object awaited (readers add 1
     * with a compare-and-swap that keeps the generation; the daemon takes
     * them back the same way). In an arena's own header the seal is the
     * arena's lock word instead (SHMB_ARENA_WORD). */
    uint64_t seal;
    /* char key[key_len] follows */
};

#define SHMB_SEAL(gen, count) (((uint64_t)(count) << 32) | (uint32_t)(gen))
#define SHMB_SEAL_GEN(seal) ((uint32_t)(seal))
#define SHMB_SEAL_COUNT(seal) ((uint32_t)((seal) >> 32))

/* An arena's lock word, its header's seal: a token the daemon drew at
 * random for the grant (62 bits, the two low bits clear) with the lock in
 * the two low bits. A word where the arena was, once its bytes are reused,
 * is that token only by a 1 in 2^62 chance. */
#define SHMB_ARENA_WORD(token, lock) (((uint64_t)(token) & ~UINT64_C(3)) | (uint64_t)(lock))
#define SHMB_ARENA_WORD_LOCK(word) ((uint32_t)((word) & 3u))

/* An arena's lock, the low bits of its header's seal. A client takes it
 * (IDLE -> BUSY) before it writes into its arena and gives it back (BUSY ->
 * IDLE) before it sends commit_at; the daemon takes an arena back (IDLE ->
 * REVOKED) only while no one writes into it, so bytes are never written
 * into space the daemon has given to someone else. */
enum shmb_arena_lock {
    SHMB_ARENA_IDLE = 0,
    SHMB_ARENA_BUSY = 1,
    SHMB_ARENA_REVOKED = 2,
};

/* In an arena's own header, where a key would start (an arena's key is
 * empty), a 64-bit count: the commit_at requests its client has laid out
 * and sent, or is about to send, that the daemon has not handled yet. The
 * client adds 1 (before it sets the lock IDLE again) for each chunk it
 * commits; the daemon takes 1 off as it handles each commit_at into the
 * arena, and takes the arena back only while the count is 0 (after its
 * compare-and-swap to REVOKED it reads the count again, and undoes the
 * swap when it is not 0): a commit on its way, sent without waiting or
 * not, never finds its arena gone. */
#define SHMB_ARENA_INFLIGHT_AT 48
_Static_assert(SHMB_ARENA_INFLIGHT_AT >= sizeof(struct shmb_chunk_header) &&
                   SHMB_ARENA_INFLIGHT_AT + 8 <= SHMB_ALIGN,
               "the count lies in the arena's header, after its fields");

/* In an arena's own header, after the count: a 64-bit word, the segment
 * offset where the chunks its client published (SHMB_CHUNK_WRITTEN) end.
 * The grant sets it to the payload's start; the client moves it past each
 * chunk it publishes, with a compare-and-swap from the end it last set,
 * while it holds the lock BUSY; the daemon folds the chunks up to it and,
 * when it closes the arena, swaps it to SHMB_ARENA_PUBLISH_CLOSED, so that
 * a client whose swap then fails knows its chunk was not published. */
#define SHMB_ARENA_PUBLISHED_AT 56
#define SHMB_ARENA_PUBLISH_CLOSED UINT64_MAX
_Static_assert(SHMB_ARENA_PUBLISHED_AT >= SHMB_ARENA_INFLIGHT_AT + 8 &&
                   SHMB_ARENA_PUBLISHED_AT + 8 <= SHMB_ALIGN,
               "the published end lies in the arena's header, after the count");

/* Objects one arena holds at most: the daemon refuses a commit_at past them
 * (ESTALE: ask for a new arena). The arena's chunk goes as one, with every
 * object in it, when reclaim reaches it: a 128 MiB arena of 128-byte chunks
 * held a million objects, and the one alloc that reclaimed them stalled
 * every client half a second. At this bound that is a few milliseconds,
 * what reclaiming 1 MiB of small chunks costs. */
#define SHMB_ARENA_MAX_OBJECTS 8192

_Static_assert(sizeof(struct shmb_chunk_header) == 48, "chunk header size");
SHMB_LAYOUT_AT(struct shmb_chunk_header, magic, 0);
SHMB_LAYOUT_AT(struct shmb_chunk_header, state, 4);
SHMB_LAYOUT_AT(struct shmb_chunk_header, key_len, 6);
SHMB_LAYOUT_AT(struct shmb_chunk_header, header_size, 8);
SHMB_LAYOUT_AT(struct shmb_chunk_header, tag, 12);
SHMB_LAYOUT_AT(struct shmb_chunk_header, id, 16);
SHMB_LAYOUT_AT(struct shmb_chunk_header, chunk_size, 24);
SHMB_LAYOUT_AT(struct shmb_chunk_header, payload_size, 32);
SHMB_LAYOUT_AT(struct shmb_chunk_header, seal, 40);
/* A header with the longest key fits in the smallest data area, and the
 * payload after a header is aligned. */
_Static_assert(sizeof(struct shmb_chunk_header) + SHMB_KEY_MAX < SHMB_HEADER_PAGE,
               "a chunk header fits a page");
_Static_assert((SHMB_ALIGN & (SHMB_ALIGN - 1)) == 0 && SHMB_HEADER_PAGE % SHMB_ALIGN == 0,
               "the alignment is a power of two that divides the header page");

/* The bytes of a chunk header for a key of key_len bytes, and of a chunk for
 * a payload of size bytes: what a client laying chunks out in its arena
 * computes. */
#define SHMB_ALIGN_UP(n) (((uint64_t)(n) + SHMB_ALIGN - 1) & ~(uint64_t)(SHMB_ALIGN - 1))
#define SHMB_CHUNK_HEADER_SIZE(key_len) SHMB_ALIGN_UP(sizeof(struct shmb_chunk_header) + (key_len))
#define SHMB_CHUNK_SIZE(key_len, size) (SHMB_CHUNK_HEADER_SIZE(key_len) + SHMB_ALIGN_UP(size))

/* One entry of the catalog: where the committed object of one key lives.
 * Open addressing with linear probing: a key's home is
 * shmb_catalog_hash(seed, key) & (slots - 1); an entry is never more than
 * SHMB_CATALOG_PROBES - 1 slots past its home; an empty entry (chunk 0)
 * ends a probe. Written by the daemon under seq (odd while it writes,
 * release order); readers load seq (acquire), the fields, fence, seq again. */
struct shmb_catalog_entry {
    uint32_t seq;
    uint32_t hash;   /* high 32 bits of the key's hash */
    uint64_t chunk;  /* the chunk header's offset in the segment; 0: empty */
    uint32_t gen;    /* the chunk's generation when it was listed */
    uint32_t flags;  /* SHMB_CATALOG_AWAITED */
    uint64_t size;   /* payload bytes */
};
_Static_assert(sizeof(struct shmb_catalog_entry) == 32, "catalog entry size");
SHMB_LAYOUT_AT(struct shmb_catalog_entry, seq, 0);
SHMB_LAYOUT_AT(struct shmb_catalog_entry, hash, 4);
SHMB_LAYOUT_AT(struct shmb_catalog_entry, chunk, 8);
SHMB_LAYOUT_AT(struct shmb_catalog_entry, gen, 16);
SHMB_LAYOUT_AT(struct shmb_catalog_entry, flags, 20);
SHMB_LAYOUT_AT(struct shmb_catalog_entry, size, 24);

/* The object awaits reads (readers > 0 at commit): a read in place counts
 * itself (the seal's count, or a "read" request from a read-only client). */
#define SHMB_CATALOG_AWAITED 1u
/* The longest probe: an entry that would be further from its home is not
 * listed (the header's catalog_unlisted counts it). */
#define SHMB_CATALOG_PROBES 32u

#endif
