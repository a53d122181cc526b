// SPDX-License-Identifier: Apache-2.0
/*
 * The store's awaited reads and their accounting in the segment: generations,
 * the seal each committed object is published under and its catalog entry
 * (publish, unlist, unpublish), the reads counted in place folded in, the
 * awaited flag, the chunk header's tag and state, the read lease. Knows
 * nothing of pins, eviction or holders; writes into the segment only
 * through the ring and the segment's guarded stores.
 */
#ifndef SHMB_READS_H
#define SHMB_READS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store_inner.h"

/* For the store's rooms only; each is described above its definition in
 * reads.c. */
void store_gen_after(struct store *s, uint32_t floor);
void store_fold(struct store *s, struct object *obj);
void store_publish(struct store *s, struct object *obj);
void store_unpublish(struct store *s, struct object *obj);
void store_mark_awaited(struct store *s, struct object *obj);
void store_unmark_awaited(struct store *s, struct object *obj);
void store_chunk_field(struct store *s, const struct object *obj, size_t field,
                       const void *value, size_t len);
void store_save_reads(struct store *s, const struct object *obj);
void store_save_state(struct store *s, const struct object *obj,
                      enum shmb_chunk_state state);
bool store_awaited(const struct store *s, struct object *obj, uint64_t now);

#endif
