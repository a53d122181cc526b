// SPDX-License-Identifier: Apache-2.0
/*
 * The catalog, as readers see it: the key hash both sides compute, and the
 * validated copy-out read of a key from a mapped segment with no system
 * call (layout in proto/layout.h, PROTOCOL.md section 10). The daemon's side,
 * which writes the table, is daemon/catalog.c.
 *
 * Nothing in the mapping is trusted: a read-write client may have scribbled
 * over the table, the header page or a chunk. A read checks every offset
 * against the bounds it was given (from the hello reply, not the mapping),
 * and after the copy checks the chunk's generation, state and key bytes
 * again: at worst a read fails (and the caller asks the daemon), never does
 * it return bytes of another key or read outside the mapping.
 */
#ifndef SHMB_PROTO_CATALOG_H
#define SHMB_PROTO_CATALOG_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"

/* The key hash of the catalog: FNV-1a 64 over the key bytes, its offset
 * basis xor'ed with the segment's seed, then a final mix (h ^= h >> 32;
 * h *= 0xd6e8feb86659fd93; h ^= h >> 32). The home slot is
 * hash & (slots - 1); the entry keeps hash >> 32. The Python client
 * computes the same. */
uint64_t shmb_catalog_hash(uint32_t seed, const char *key, size_t key_len);

/* What a reader knows of one mapped segment, all from the hello reply and
 * the mapping's own size, none from the mapping's bytes. */
struct shmb_catalog_view {
    const unsigned char *base; /* the mapping */
    uint64_t map_size;         /* bytes mapped */
    uint64_t data_offset, data_size;
    uint64_t catalog_offset, catalog_slots; /* 0 slots: no catalog */
    uint32_t seed;
};

/* What one read found, besides the bytes. */
struct shmb_catalog_hit {
    uint64_t chunk; /* the chunk header's offset in the segment */
    uint64_t size;  /* payload bytes */
    uint32_t gen;   /* the generation the copy was checked against */
    uint32_t flags; /* the entry's flags (SHMB_CATALOG_AWAITED) */
};

/* Look key up and copy its payload into buf (cap bytes).
 *   0        the copy is exact: the bytes committed under key; hit filled
 *   -ENOENT  no object has key: the miss is authoritative (the table was
 *            not moving and lists every committed object)
 *   -ENOBUFS cap is smaller than the payload: hit->size says how much is
 *            needed, nothing was copied
 *   -EAGAIN  not known here: no catalog, the entry moved or changed under
 *            the read (retried a few times first), the probe ran out, or
 *            the catalog does not list everything; ask the daemon
 * No system call, no lock; safe against any bytes in the mapping. */
int shmb_catalog_read(const struct shmb_catalog_view *v, const char *key, size_t key_len,
                      void *buf, size_t cap, struct shmb_catalog_hit *hit);

/* shmb_catalog_read, adding to *retries (may be NULL) the copies it redid
 * because the chunk changed under them: what shmb_read_stats reports. */
int shmb_catalog_read_counted(const struct shmb_catalog_view *v, const char *key,
                              size_t key_len, void *buf, size_t cap,
                              struct shmb_catalog_hit *hit, unsigned *retries);

/* Count one awaited read of the chunk a hit found, in its seal (a read-write
 * mapping only): a compare-and-swap that adds 1 to the count while the
 * generation is still hit->gen. 0, or -ESTALE when the generation changed
 * (the object went; nothing counted), -EAGAIN when other processes kept
 * changing the seal through a thousand tries, -EINVAL for a hit outside
 * the view. A count at UINT32_MAX stays there (the daemon folds it in). */
int shmb_catalog_count_read(const struct shmb_catalog_view *v,
                            const struct shmb_catalog_hit *hit);

#endif
