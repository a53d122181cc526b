// SPDX-License-Identifier: Apache-2.0
/*
 * The store's eviction and reclaim: the watched heap of objects that may
 * block reclaim, the head-of-line blocker, the ring's eviction callback, the
 * ENOSPC message that names who is in the way, and arenas given back,
 * trimmed, taken back and expired. Objects are freed here and nowhere else.
 * Knows nothing of keys as names (only the index's node) or of sockets.
 */
#ifndef SHMB_RECLAIM_H
#define SHMB_RECLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store_inner.h"

/* For the store's rooms only; each is described above its definition in
 * reclaim.c. */
void object_free(struct object *obj);
int store_watch_reserve(struct store *s);
void store_watch(struct store *s, struct object *obj);
void store_forget(struct store *s, struct object *obj);
void store_drop(struct store *s, struct object *obj);
bool store_may_evict(void *owner, uint64_t id, void *arg);
bool object_blocks(const struct store *s, struct object *obj, uint64_t now);
struct object *store_blocker(struct store *s, uint64_t now);
void store_settle(struct store *s, struct object *obj);
int store_enospc(struct store *s, const char *key, size_t key_len, uint64_t size,
                 struct shmb_error *err);
void store_arena_trim(struct store *s, struct object *box, bool told);
void store_arena_give_back(struct store *s, struct object *box, bool told);
void store_arena_left(struct store *s, struct object *obj);
bool store_may_evict_arena(struct store *s, struct object *box, uint64_t now);
uint64_t store_arena_wake_ms(const struct store *s);
void store_expire_arenas(struct store *s, uint64_t now, uint64_t max_age_ms);

#endif
