/*
 * The layout of a shmbroker segment: the bytes every process that maps it may
 * read. Only offsets are stored, never pointers, so any process (and a daemon
 * that restarts) can map the file at any address.
 *
 *   [ segment header page | data area: chunk, chunk, gap, chunk ... ]
 *
 * Every chunk starts with a chunk header (fixed fields, then the key), padded
 * to SHMB_ALIGN; the payload follows, also padded to SHMB_ALIGN.
 */
#ifndef SHMB_PROTO_LAYOUT_H
#define SHMB_PROTO_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define SHMB_SEGMENT_MAGIC UINT64_C(0x31474553424d4853) /* "SHMBSEG1" */
#define SHMB_LAYOUT_VERSION 1
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
};

_Static_assert(sizeof(struct shmb_segment_header) == 88, "segment header size");
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
_Static_assert(sizeof(struct shmb_segment_header) <= SHMB_HEADER_PAGE,
               "the header fits its page");

#define SHMB_CHUNK_MAGIC UINT32_C(0x4b4e4843) /* "CHNK" */

/* What a chunk holds; a reader trusts a payload only in state COMMITTED. */
enum shmb_chunk_state {
    SHMB_CHUNK_GAP = 1,       /* unused tail of a lap; chunk_size = gap bytes */
    SHMB_CHUNK_PENDING = 2,   /* allocated, being written */
    SHMB_CHUNK_COMMITTED = 3, /* visible to readers */
    SHMB_CHUNK_FREE = 4,      /* released; bytes reclaimable */
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
    uint64_t reserved;     /* written 0, never read: room for a later field */
    /* char key[key_len] follows */
};

_Static_assert(sizeof(struct shmb_chunk_header) == 48, "chunk header size");
SHMB_LAYOUT_AT(struct shmb_chunk_header, magic, 0);
SHMB_LAYOUT_AT(struct shmb_chunk_header, state, 4);
SHMB_LAYOUT_AT(struct shmb_chunk_header, key_len, 6);
SHMB_LAYOUT_AT(struct shmb_chunk_header, header_size, 8);
SHMB_LAYOUT_AT(struct shmb_chunk_header, tag, 12);
SHMB_LAYOUT_AT(struct shmb_chunk_header, id, 16);
SHMB_LAYOUT_AT(struct shmb_chunk_header, chunk_size, 24);
SHMB_LAYOUT_AT(struct shmb_chunk_header, payload_size, 32);
SHMB_LAYOUT_AT(struct shmb_chunk_header, reserved, 40);
/* A header with the longest key fits in the smallest data area, and the
 * payload after a header is aligned. */
_Static_assert(sizeof(struct shmb_chunk_header) + SHMB_KEY_MAX < SHMB_HEADER_PAGE,
               "a chunk header fits a page");
_Static_assert((SHMB_ALIGN & (SHMB_ALIGN - 1)) == 0 && SHMB_HEADER_PAGE % SHMB_ALIGN == 0,
               "the alignment is a power of two that divides the header page");

#endif
