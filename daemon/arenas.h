// SPDX-License-Identifier: Apache-2.0
/*
 * The store's side of arenas (daemon/arena.c has the record and the lock):
 * an arena granted over the ring, and the objects a client commits into it
 * (commit_at). An arena is one ring chunk, owned by an object without key
 * (box) whose rec is the record; the objects committed into it hang off
 * rec->objects, oldest first.
 */
#ifndef SHMB_ARENAS_H
#define SHMB_ARENAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store_inner.h"

/* For the store's rooms only; each is described above its definition in
 * arenas.c. */
struct object *store_box_new(struct store *s);
void store_box_place(struct store *s, struct object *box, struct store_holder *h,
                     uint64_t client, uint64_t id, uint64_t payload_offset, uint64_t size,
                     uint64_t token);

#endif
