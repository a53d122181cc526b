// SPDX-License-Identifier: Apache-2.0
/*
 * The store's key index and pins: lookups by key, a holder's pins on an
 * object (get, release), and the listing of keys by prefix in ring order.
 * Knows nothing of allocation, arenas or adoption.
 */
#ifndef SHMB_KEYS_H
#define SHMB_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store_types.h"

struct object;
struct pin;

/* Pin a committed object for h and count one read. -ENOENT when absent or
 * not committed. */
int store_get(struct store *s, struct store_holder *h, const char *key, size_t key_len,
              struct store_extent *out, struct shmb_error *err);

/* Drop one of h's pins on key (deleted objects included). -ENOENT when h
 * holds none. */
int store_release(struct store *s, struct store_holder *h, const char *key,
                  size_t key_len, struct shmb_error *err);

/* Whether h pins the object key. */
bool store_holder_pins(const struct store *s, const struct store_holder *h, const char *key,
                       size_t key_len);
/* How many pins h holds on the object key (a key pinned twice counts two). */
uint32_t store_holder_pin_count(const struct store *s, const struct store_holder *h,
                                const char *key, size_t key_len);

/* True when a committed object has that key. */
bool store_contains(const struct store *s, const char *key, size_t key_len);

/* Call fn for every object (pending, committed and deleted-but-pinned) whose
 * key starts with prefix, oldest first, until fn returns non-zero or limit
 * objects were reported. Returns the number reported. */
size_t store_list(const struct store *s, const char *prefix, size_t prefix_len,
                  size_t limit, store_list_fn fn, void *arg);
/* store_list from the oldest chunk whose id is at least from (0: the
 * oldest), looking at max_scan chunks and arena objects at most: when it
 * stops there before the end, *next (if not NULL) is the id of the chunk to
 * go on from, else 0. */
size_t store_list_from(const struct store *s, const char *prefix, size_t prefix_len,
                       size_t limit, uint64_t from, size_t max_scan, uint64_t *next,
                       store_list_fn fn, void *arg);

/* For the store's rooms: the committed or pending object under key, or
 * NULL; one pin of record p dropped. */
struct object *store_lookup(const struct store *s, const char *key, size_t key_len);
void store_unpin(struct store *s, struct pin *p);

#endif
