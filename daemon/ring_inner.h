// SPDX-License-Identifier: Apache-2.0
/*
 * What the ring's two rooms share and nobody else includes: the header's
 * fixed size and the ids' bound, and the calls of ring.c that ring_walk.c
 * (the file's chunks read, adopted) needs: a slot by index, the slots grown,
 * a header's place and size, a field written, the freed chunks popped.
 */
#ifndef SHMB_RING_INNER_H
#define SHMB_RING_INNER_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/layout.h"

struct ring;
struct ring_slot;

#define RING_FIXED_HEADER sizeof(struct shmb_chunk_header)
/* No daemon allocates 2^62 chunks (146 years at a billion a second): a
 * larger next id in an adopted cursor is damage, and ids past it could wrap
 * to 0, which the slot lookup by id cannot follow. */
#define RING_ID_MAX (UINT64_C(1) << 62)

/* Bytes of a chunk header carrying label_len bytes of key. */
uint64_t ring_header_size(size_t label_len);

/* The slot at index i from the oldest. */
struct ring_slot *ring_slot(const struct ring *r, size_t i);

/* Double the slot array, unwrapping it; -ENOMEM. */
int ring_grow(struct ring *r);

/* The header of the chunk at physical offset phys, in the segment (written
 * there; read only into a private copy, by ring_walk.c). */
struct shmb_chunk_header *ring_header_at(const struct ring *r, uint64_t phys);

/* Write one header field of the chunk at phys through the guard. */
void ring_store_field(struct ring *r, uint64_t phys, size_t field, const void *value,
                      size_t len);

/* Reclaim freed chunks at the head; the bytes given back. */
uint64_t ring_pop_freed(struct ring *r);

/* The end retreats over the freed chunks at the tail (ring_free). */
void ring_pop_tail_freed(struct ring *r);

#endif
