// SPDX-License-Identifier: Apache-2.0
/*
 * The store's insides, shared by its rooms (store.c, keys.c, reads.c,
 * reclaim.c, arenas.c, adopt.c) and by nobody else: an object, a pin, a
 * holder, the store itself, and store.c's steps that its rooms above it
 * (arenas.c, adopt.c) take. Everything outside the store sees store.h only.
 */
#ifndef SHMB_STORE_INNER_H
#define SHMB_STORE_INNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "arena.h"
#include "index.h"
#include "ring.h"
#include "store_types.h"

/* One holder's pins on one object. */
struct pin {
    struct object *obj;
    struct store_holder *holder;
    SLIST_ENTRY(pin) obj_link; /* the object's pin records */
    TAILQ_ENTRY(pin) h_link;   /* the holder's pin records */
    uint32_t count;
};

SLIST_HEAD(pin_slist, pin);
TAILQ_HEAD(pin_list, pin);
TAILQ_HEAD(object_list, object);
TAILQ_HEAD(holder_list, store_holder);

struct object {
    struct index_node node;        /* key index; node.key points at key[] */
    struct pin_slist pins;         /* one record per holder that pins it */
    struct store_holder *owner;    /* the writer, while pending */
    TAILQ_ENTRY(object) pend_link; /* owner's pending list */
    TAILQ_ENTRY(object) age_link;  /* the store's pending list, oldest first */
    uint64_t ring_id;
    uint64_t offset, size;
    uint64_t chunk_offset; /* its chunk header, from the segment's start */
    uint32_t gen;          /* its generation while published, else 0 */
    bool published;        /* sealed (and listed, when listed) */
    bool listed;           /* catalog_add took it */
    bool was_listed;       /* listed in this generation, maybe displaced since:
                              readers that found its entry may count in its seal */
    bool listed_awaited;   /* ... with SHMB_CATALOG_AWAITED */
    uint64_t created_ms; /* at alloc; at commit for committed objects */
    size_t watch_pos;    /* 1 + index in the store's watched heap, 0 when not in it */
    uint32_t pin_count;  /* all pins, of all holders */
    uint32_t awaited_reads;
    uint8_t state; /* enum store_state */
    uint8_t key_len;
    bool lease_told; /* lease_expired was called for it */
    /* Arenas: an arena's own chunk is an object too, without key (not in
     * the index) and with its record in rec; an object committed into an
     * arena has no ring chunk of its own (ring_id is the arena's) and arena
     * points to the arena's object. */
    struct object *arena;           /* the arena holding it, or NULL */
    struct arena *rec;              /* an arena's own chunk: its record; else NULL */
    TAILQ_ENTRY(object) arena_link; /* rec->objects of its arena */
    char key[];      /* key_len bytes, then a NUL */
};

/* Keys of a holder's allocations that expired, so that its commit can say
 * ETIMEDOUT rather than ENOENT. A few are enough: a client that lets many
 * expire learns from the first. */
#define STORE_EXPIRED_REMEMBERED 8

struct store_holder {
    TAILQ_ENTRY(store_holder) link; /* the store's holders */
    struct pin_list pins;
    struct object_list pending; /* newest first */
    uint64_t pin_total, pending_count, bytes_pinned;
    char *expired[STORE_EXPIRED_REMEMBERED]; /* NUL-terminated copies */
    unsigned expired_next;
    struct object *arena; /* the arena it holds (its object), or NULL */
    TAILQ_ENTRY(store_holder) arena_link; /* in the store's arena_holders while it holds one */
    /* The chunks it published that a fold refused since its last reply
     * (told with it, as the noreply commit_at refused). */
    struct store_refused refused;
};

struct store {
    struct ring ring;
    struct index index;
    struct store_config cfg; /* cfg.max_object_size is the one in force */
    struct holder_list holders;
    /* The holders that hold an arena now (TAILQ of arena_link): the folds
     * before each request walk these only. */
    TAILQ_HEAD(, store_holder) arena_holders;
    struct object_list age; /* pending objects, oldest first */
    uint64_t committed, pending, pinned, deleted_pinned;
    uint64_t allocs, commits, gets, evictions, enospc, expired_allocs, lease_expiries;
    uint64_t fast_reads;      /* awaited reads folded in from seals and read ops */
    uint32_t gen_next;        /* generations, when there is no catalog */
    uint64_t expire_after_ms; /* the last store_expire_pending's limit, for messages */
    uint64_t room_gen;        /* see store_room_generation */
    /* The head-of-line blocker is the blocking object with the lowest ring
     * id. Walking the ring for it costs O(objects), so the candidates are
     * kept in a min-heap by ring id: every object that blocks reclaim is in
     * it (pushed when it starts to block: alloc, first pin, touch), and
     * objects found not to block any more are dropped lazily from its top.
     * Room for every live object is reserved at alloc, so pushing never
     * fails. */
    struct object **watched;
    size_t watched_len, watched_cap;
    uint64_t live_objects;   /* struct objects alive (arenas' included) */
    uint64_t arenas_held;    /* arenas a holder holds */
    uint64_t folded;         /* published chunks folded into objects */
    uint64_t fold_refused;   /* published chunks a fold refused */
    uint64_t arena_bytes;    /* the bytes not yet committed into them */
    uint64_t blocker_checks; /* objects store_blocker looked at, for tests */
};

/* The state of an object made by commit_at until store_commit_object commits it. */
#define STORE_UNPUBLISHED ((enum store_state)0)

/* What a new object is made of. */
struct object_spec {
    const char *key;
    size_t key_len;
    uint64_t size; /* payload bytes */
    uint32_t awaited_reads;
    enum store_state state;         /* PENDING (alloc) or COMMITTED (adoption) */
    struct store_holder *owner;     /* the writer of a pending object */
    const struct ring_chunk *found; /* an adoption's chunk; NULL: allocate one */
    struct object *arena;           /* the arena holding found, or NULL */
};

/* store.c's steps for its rooms above (arenas.c, adopt.c). */
int store_place(struct store *s, struct object *obj, uint64_t size,
                struct ring_chunk *chunk, struct shmb_error *err);
int store_object_new(struct store *s, const struct object_spec *spec, struct object **out,
                     struct shmb_error *err);
int store_check_new(const struct store *s, const char *key, size_t key_len, uint64_t size,
                    uint32_t readers, struct shmb_error *err);
void store_commit_object(struct store *s, struct object *obj);

#endif
