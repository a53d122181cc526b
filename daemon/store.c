// SPDX-License-Identifier: Apache-2.0
/*
 * The object store's table and its public entry points: a store made and
 * freed, holders, pending allocations (alloc, commit, abort, expiry), delete,
 * the reads a client announces (touch, forgo, expect, done), the counters.
 * The steps live in rooms of their own: keys.c (the key index, pins, the
 * list), reads.c (awaited reads, seals, the catalog's entries), reclaim.c
 * (the watched heap, eviction, arenas given back), and above this file
 * arenas.c (an arena granted, commit_at) and adopt.c (a restart).
 *
 * Memory per object: struct object (136 bytes) + key + malloc overhead, one
 * ring slot (40 bytes, up to 80 while the slot array is half empty) and one
 * index bucket (8 to 16 bytes), one slot of the watched heap (8 to 16
 * bytes): about 210 to 270 bytes plus the key. A pin costs a 48-byte record
 * per (holder, object) pair, not per pin.
 */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "arena.h"
#include "catalog.h"
#include "clock.h"
#include "index.h"
#include "keys.h"
#include "reads.h"
#include "reclaim.h"
#include "ring.h"
#include "segment.h"
#include "store_inner.h"

const char *store_state_name(enum store_state state)
{
    switch (state) {
    case STORE_PENDING:
        return "pending";
    case STORE_COMMITTED:
        return "committed";
    case STORE_DELETED:
        return "deleted";
    }
    return "unknown";
}

uint64_t store_largest_object(uint64_t data_size)
{
    /* An empty ring starts at offset 0, so one chunk may take all of it. */
    uint64_t chunk = ring_chunk_size(SHMB_KEY_MAX, 0);

    return data_size > chunk ? (data_size - chunk) & ~(uint64_t)(SHMB_ALIGN - 1) : 0;
}

uint64_t store_default_max_object(uint64_t size, uint64_t data_size)
{
    uint64_t max = size / 2, largest = store_largest_object(data_size);

    if (max > STORE_DEFAULT_MAX_OBJECT)
        max = STORE_DEFAULT_MAX_OBJECT;
    if (largest > 0 && max > largest)
        max = largest;
    return max;
}

int store_check_max_object(uint64_t data_size, uint64_t max, struct shmb_error *err)
{
    uint64_t limit = store_largest_object(data_size);

    if (max == 0 || max > limit)
        return shmb_error_set(
            err, -EINVAL,
            "Max object size (%llu bytes) does not fit in the data area "
            "(%llu bytes, at most %llu bytes per object); choose a "
            "smaller --max-object-size or a larger --size.",
            (unsigned long long)max, (unsigned long long)data_size,
            (unsigned long long)limit);
    return 0;
}

struct store *store_new(void *data, uint64_t data_offset, uint64_t data_size,
                        struct shmb_segment_header *cursor,
                        const struct store_config *cfg, struct shmb_error *err)
{
    struct store *s = shmb_calloc(1, sizeof(*s));
    uint64_t max = cfg != NULL ? cfg->max_object_size : 0;
    int rc;

    if (s == NULL) {
        shmb_error_set(err, -ENOMEM, "Out of memory for the object store.");
        return NULL;
    }
    TAILQ_INIT(&s->holders);
    TAILQ_INIT(&s->arena_holders);
    TAILQ_INIT(&s->age);
    if ((rc = ring_init(&s->ring, data, data_offset, data_size, cursor, err)) < 0) {
        shmb_free(s);
        return NULL;
    }
    if (index_init(&s->index) < 0) {
        shmb_error_set(err, -ENOMEM, "Out of memory for the key index.");
        ring_fini(&s->ring);
        shmb_free(s);
        return NULL;
    }
    if (max == 0)
        max = store_default_max_object(data_size, data_size);
    if (store_check_max_object(data_size, max, err) < 0) {
        store_free(s);
        return NULL;
    }
    if (cfg != NULL)
        s->cfg = *cfg;
    s->cfg.max_object_size = max;
    s->gen_next = 1;
    return s;
}

void store_free(struct store *s)
{
    size_t i;

    if (s == NULL)
        return;
    while (!TAILQ_EMPTY(&s->holders)) {
        struct store_holder *h = TAILQ_FIRST(&s->holders);
        struct pin *p, *next;
        unsigned j;

        for (p = TAILQ_FIRST(&h->pins); p != NULL; p = next) {
            next = TAILQ_NEXT(p, h_link);
            shmb_free(p);
        }
        for (j = 0; j < STORE_EXPIRED_REMEMBERED; j++)
            shmb_free(h->expired[j]);
        TAILQ_REMOVE(&s->holders, h, link);
        shmb_free(h);
    }
    for (i = 0; i < ring_count(&s->ring); i++)
        object_free(ring_at(&s->ring, i, NULL));
    shmb_free(s->watched);
    ring_fini(&s->ring);
    index_fini(&s->index);
    shmb_free(s);
}

struct store_holder *store_holder_new(struct store *s)
{
    struct store_holder *h = shmb_calloc(1, sizeof(*h));

    if (h == NULL)
        return NULL;
    TAILQ_INIT(&h->pins);
    TAILQ_INIT(&h->pending);
    TAILQ_INSERT_HEAD(&s->holders, h, link);
    return h;
}

/* Forget that h's allocation of key expired; true when it had. */
static bool store_forget_expired(struct store_holder *h, const char *key, size_t key_len)
{
    unsigned i;

    for (i = 0; i < STORE_EXPIRED_REMEMBERED; i++) {
        if (h->expired[i] != NULL && strlen(h->expired[i]) == key_len &&
            memcmp(h->expired[i], key, key_len) == 0) {
            shmb_free(h->expired[i]);
            h->expired[i] = NULL;
            return true;
        }
    }
    return false;
}

/* Remember that h's allocation of key expired (the oldest memory goes). */
static void store_remember_expired(struct store_holder *h, const char *key,
                                   size_t key_len)
{
    unsigned slot = h->expired_next++ % STORE_EXPIRED_REMEMBERED;

    shmb_free(h->expired[slot]);
    h->expired[slot] = shmb_strndup(key, key_len);
}

/* A new chunk for obj in the ring, as vLLM's put: when there is no room, free
 * what may go, oldest first, then retry once. -ENOSPC names the blocker. */
int store_place(struct store *s, struct object *obj, uint64_t size,
                struct ring_chunk *chunk, struct shmb_error *err)
{
    int rc = ring_alloc(&s->ring, size, obj->key, obj->key_len, obj, chunk, err);

    if (rc == -ENOSPC) {
        ring_reclaim(&s->ring, ring_chunk_size(obj->key_len, size), store_may_evict, s);
        rc = ring_alloc(&s->ring, size, obj->key, obj->key_len, obj, chunk, err);
        if (rc == -ENOSPC && obj->rec != NULL)
            store_enospc(s, "(an arena)", 10, size, err);
        else if (rc == -ENOSPC)
            store_enospc(s, obj->key, obj->key_len, size, err);
    }
    return rc;
}

/* The one place objects are made: build one from spec, give it its chunk
 * (spec->found, or a new one from store_place) and link it everywhere it
 * belongs: the key index, the watched heap (a pending object blocks reclaim,
 * an adopted one may be awaited), the counters, and for a pending object its
 * writer's pending list and the store's by age. The caller has checked the
 * key. 0, -ENOMEM or store_place's code; nothing is left behind on failure. */
int store_object_new(struct store *s, const struct object_spec *spec,
                     struct object **out, struct shmb_error *err)
{
    struct ring_chunk chunk;
    struct object *obj = NULL;
    int rc;

    if (store_watch_reserve(s) < 0 ||
        (obj = shmb_calloc(1, sizeof(*obj) + spec->key_len + 1)) == NULL)
        return shmb_error_set(err, -ENOMEM, "Out of memory for a new object.");
    memcpy(obj->key, spec->key, spec->key_len);
    obj->key_len = (uint8_t)spec->key_len;
    if (spec->found != NULL) {
        chunk = *spec->found;
    } else if ((rc = store_place(s, obj, spec->size, &chunk, err)) < 0) {
        object_free(obj);
        return rc;
    }
    obj->node.key = obj->key;
    obj->node.key_len = spec->key_len;
    obj->ring_id = chunk.id;
    obj->offset = chunk.payload_offset;
    obj->chunk_offset = chunk.payload_offset - SHMB_CHUNK_HEADER_SIZE(spec->key_len);
    obj->size = spec->size;
    obj->created_ms = clock_now_ms();
    obj->awaited_reads = spec->awaited_reads;
    obj->state = spec->state;
    index_insert(&s->index, &obj->node);
    s->live_objects++;
    store_watch(s, obj);
    if (spec->state == STORE_PENDING) {
        obj->owner = spec->owner;
        TAILQ_INSERT_HEAD(&spec->owner->pending, obj, pend_link);
        spec->owner->pending_count++;
        TAILQ_INSERT_TAIL(&s->age, obj, age_link);
        s->pending++;
    } else if (spec->state == STORE_COMMITTED) {
        s->committed++;
    }
    if (spec->arena != NULL) {
        obj->arena = spec->arena;
        TAILQ_INSERT_TAIL(&spec->arena->rec->objects, obj, arena_link);
    }
    *out = obj;
    return 0;
}

/* The checks of a new object, alloc's and commit_at's: key length, size,
 * readers, and no object with that key. 0, -EINVAL, -E2BIG or -EEXIST. */
int store_check_new(const struct store *s, const char *key, size_t key_len,
                    uint64_t size, uint32_t readers, struct shmb_error *err)
{
    int rc;

    if ((rc = shmb_key_len_check(key_len, err)) < 0)
        return rc;
    if (size == 0)
        return shmb_error_set(err, -EINVAL, "Size must be at least 1 byte.");
    if (size > s->cfg.max_object_size)
        return shmb_error_set(
            err, -E2BIG, "Object size (%llu bytes) exceeds max object size (%llu bytes)",
            (unsigned long long)size, (unsigned long long)s->cfg.max_object_size);
    if (readers > STORE_MAX_READERS)
        return shmb_error_set(err, -EINVAL, "readers=%u is more than the limit of %u.",
                              readers, STORE_MAX_READERS);
    if (store_lookup(s, key, key_len) != NULL)
        return shmb_error_set(err, -EEXIST,
                              "Key '%.*s' already exists in the storage. Choose another "
                              "key, or delete it first.",
                              (int)key_len, key);
    return 0;
}

int store_alloc(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                uint64_t size, uint32_t readers, struct store_extent *out,
                struct shmb_error *err)
{
    struct object_spec spec;
    struct object *obj;
    int rc;

    if ((rc = store_check_new(s, key, key_len, size, readers, err)) < 0)
        return rc;
    spec.key = key;
    spec.key_len = key_len;
    spec.size = size;
    spec.awaited_reads = readers;
    spec.state = STORE_PENDING;
    spec.owner = h;
    spec.found = NULL;
    spec.arena = NULL;
    if ((rc = store_object_new(s, &spec, &obj, err)) < 0)
        return rc;
    shmb_error_clear(err); /* a retry that succeeded leaves no stale message */
    store_forget_expired(h, key, key_len);
    ring_set_tag(&s->ring, obj->ring_id, readers);
    s->allocs++;
    if (out != NULL) {
        out->offset = obj->offset;
        out->size = size;
    }
    return 0;
}

/* The one way an object becomes committed, from an alloc (store_commit) or
 * inside an arena (store_commit_at): visible to every holder from here on,
 * counted, its chunk marked committed for a later adoption, then sealed and
 * listed for readers of the mapping (store_publish). */
void store_commit_object(struct store *s, struct object *obj)
{
    s->room_gen++; /* a pending blocker may now be reclaimable */
    obj->state = STORE_COMMITTED;
    obj->created_ms = clock_now_ms();
    store_save_state(s, obj, SHMB_CHUNK_COMMITTED);
    s->committed++;
    s->commits++;
    store_publish(s, obj);
    store_settle(s, obj);
}

/* h's pending allocation of key, or NULL with -ENOENT's (or -ETIMEDOUT's)
 * message in err. */
static struct object *store_find_pending(struct store *s, struct store_holder *h,
                                         const char *key, size_t key_len,
                                         const char *verb, struct shmb_error *err)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj != NULL && obj->state == STORE_PENDING && obj->owner == h)
        return obj;
    if (obj == NULL && store_forget_expired(h, key, key_len))
        shmb_error_set(err, -ETIMEDOUT,
                       "Cannot %s '%.*s': the allocation was dropped after %llu ms "
                       "without a commit (--alloc-timeout). Allocate it again and commit "
                       "sooner.",
                       verb, (int)key_len, key, (unsigned long long)s->expire_after_ms);
    else if (obj != NULL && obj->state == STORE_COMMITTED)
        shmb_error_set(err, -ENOENT,
                       "Cannot %s '%.*s': it is already committed. Only a pending "
                       "allocation made on this connection can be %s.",
                       verb, (int)key_len, key,
                       strcmp(verb, "commit") == 0 ? "committed" : "aborted");
    else
        shmb_error_set(err, -ENOENT,
                       "Cannot %s '%.*s': this connection holds no pending allocation "
                       "of it. Call alloc first.",
                       verb, (int)key_len, key);
    return NULL;
}

/* Take obj off its owner's pending list. */
static void store_unlink_pending(struct store *s, struct object *obj)
{
    struct store_holder *h = obj->owner;

    TAILQ_REMOVE(&h->pending, obj, pend_link);
    obj->owner = NULL;
    h->pending_count--;
    s->pending--;
    TAILQ_REMOVE(&s->age, obj, age_link);
}

int store_commit(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                 struct shmb_error *err)
{
    struct object *obj = store_find_pending(s, h, key, key_len, "commit", err);

    if (obj == NULL)
        return err != NULL ? err->code : -ENOENT;
    store_unlink_pending(s, obj);
    store_commit_object(s, obj);
    return 0;
}

/* Drop a pending object: key, chunk and memory. */
static void store_drop_pending(struct store *s, struct object *obj)
{
    store_unlink_pending(s, obj);
    index_remove(&s->index, &obj->node);
    store_drop(s, obj);
}

size_t store_expire_pending(struct store *s, uint64_t max_age_ms)
{
    uint64_t now = clock_now_ms();
    size_t n = 0;

    s->expire_after_ms = max_age_ms;
    while (!TAILQ_EMPTY(&s->age) &&
           now - TAILQ_FIRST(&s->age)->created_ms >= max_age_ms) {
        struct object *obj = TAILQ_FIRST(&s->age);

        store_remember_expired(obj->owner, obj->key, obj->key_len);
        store_drop_pending(s, obj);
        s->expired_allocs++;
        n++;
    }
    store_expire_arenas(s, now, max_age_ms);
    return n;
}

int store_abort(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                struct shmb_error *err)
{
    struct object *obj = store_find_pending(s, h, key, key_len, "abort", err);

    if (obj == NULL)
        return err != NULL ? err->code : -ENOENT;
    store_drop_pending(s, obj);
    return 0;
}

int store_touch(struct store *s, const char *key, size_t key_len, uint32_t readers,
                struct shmb_error *err)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj == NULL || obj->state != STORE_COMMITTED)
        return shmb_error_set(err, -ENOENT, "No object '%.*s' to touch.", (int)key_len,
                              key);
    store_fold(s, obj);
    if (readers > STORE_MAX_READERS - obj->awaited_reads)
        return shmb_error_set(err, -EINVAL,
                              "readers=%u would make %llu awaited reads, more than the "
                              "limit of %u.",
                              readers, (unsigned long long)obj->awaited_reads + readers,
                              STORE_MAX_READERS);
    obj->awaited_reads += readers;
    store_save_reads(s, obj);
    if (readers > 0)
        store_watch(s, obj); /* awaited reads may block reclaim */
    store_mark_awaited(s, obj);
    return 0;
}

int store_forgo_read(struct store *s, const char *key, size_t key_len)
{
    return store_forgo_reads(s, key, key_len, 1);
}

int store_forgo_reads(struct store *s, const char *key, size_t key_len, uint32_t n)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj != NULL)
        store_fold(s, obj);
    if (obj == NULL || obj->awaited_reads == 0)
        return -ENOENT;
    obj->awaited_reads -= n < obj->awaited_reads ? n : obj->awaited_reads;
    if (obj->awaited_reads == 0)
        s->room_gen++;
    store_save_reads(s, obj);
    store_unmark_awaited(s, obj);
    return 0;
}

int store_expect_read(struct store *s, const char *key, size_t key_len)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj != NULL)
        store_fold(s, obj);
    if (obj == NULL || obj->awaited_reads >= STORE_MAX_READERS)
        return -ENOENT;
    obj->awaited_reads++;
    store_save_reads(s, obj);
    store_watch(s, obj); /* awaited reads may block reclaim */
    store_mark_awaited(s, obj);
    return 0;
}

int store_read_done(struct store *s, const char *key, size_t key_len, uint32_t gen)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj == NULL || obj->state != STORE_COMMITTED || gen == 0 || obj->gen != gen)
        return -ENOENT;
    store_fold(s, obj);
    if (obj->awaited_reads == 0)
        return 0;
    if (--obj->awaited_reads == 0)
        s->room_gen++;
    s->fast_reads++;
    store_save_reads(s, obj);
    store_unmark_awaited(s, obj);
    store_settle(s, obj);
    return 0;
}

int store_delete(struct store *s, const char *key, size_t key_len, struct shmb_error *err)
{
    struct object *obj = store_lookup(s, key, key_len);

    if (obj == NULL)
        return shmb_error_set(err, -ENOENT, "No object '%.*s' to delete.", (int)key_len,
                              key);
    if (obj->state == STORE_PENDING)
        return shmb_error_set(err, -ENOENT,
                              "Cannot delete '%.*s': it is allocated but not committed; "
                              "its writer can abort it.",
                              (int)key_len, key);
    store_unpublish(s, obj);
    index_remove(&s->index, &obj->node);
    s->committed--;
    if (obj->pin_count == 0) {
        store_drop(s, obj);
        return 0;
    }
    obj->state = STORE_DELETED;
    s->deleted_pinned++;
    /* Mark the chunk free in the segment: a restarted daemon must not bring a
     * deleted object back, even though readers still hold its bytes. */
    store_save_state(s, obj, SHMB_CHUNK_FREE);
    return 0;
}

void store_holder_free(struct store *s, struct store_holder *h)
{
    if (h == NULL)
        return;
    while (!TAILQ_EMPTY(&h->pins)) {
        struct pin *p = TAILQ_FIRST(&h->pins);

        while (p->count > 1)
            store_unpin(s, p);
        store_unpin(s, p);
    }
    while (!TAILQ_EMPTY(&h->pending))
        store_drop_pending(s, TAILQ_FIRST(&h->pending));
    if (h->arena != NULL)
        store_arena_give_back(s, h->arena, true);
    for (unsigned i = 0; i < STORE_EXPIRED_REMEMBERED; i++)
        shmb_free(h->expired[i]);
    TAILQ_REMOVE(&s->holders, h, link);
    shmb_free(h);
}

void store_holder_stats(const struct store_holder *h, struct store_holder_stats *out)
{
    out->pins = h->pin_total;
    out->pending = h->pending_count;
    out->bytes_pinned = h->bytes_pinned;
}

void store_counts(const struct store *s, struct store_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->data_size = s->ring.size;
    out->used = ring_used(&s->ring);
    out->free = ring_free_bytes(&s->ring);
    out->objects = s->committed;
    out->pending = s->pending;
    out->pinned = s->pinned;
    out->deleted_pinned = s->deleted_pinned;
    out->max_object_size = s->cfg.max_object_size;
    out->allocs = s->allocs;
    out->commits = s->commits;
    out->gets = s->gets;
    out->evictions = s->evictions;
    out->enospc = s->enospc;
    out->expired_allocs = s->expired_allocs;
    out->lease_expiries = s->lease_expiries;
    out->fast_reads = s->fast_reads;
    out->arenas = s->arenas_held;
    out->arena_bytes = s->arena_bytes;
}

void store_stats(struct store *s, struct store_stats *out)
{
    struct object *obj;

    store_counts(s, out);
    obj = store_blocker(s, clock_now_ms());
    if (obj != NULL && obj->rec != NULL) {
        /* A held arena: no key to name, its holder instead. */
        out->has_blocker = true;
        snprintf(out->blocker_key, sizeof(out->blocker_key), "(arena of client %llu)",
                 (unsigned long long)obj->rec->client);
        out->blocker_state = STORE_PENDING;
    } else if (obj != NULL) {
        out->has_blocker = true;
        memcpy(out->blocker_key, obj->key, obj->key_len);
        out->blocker_key[obj->key_len] = '\0';
        out->blocker_pins = obj->pin_count;
        out->blocker_readers = obj->awaited_reads;
        out->blocker_state = (enum store_state)obj->state;
    }
    /* Read after the search, which may notice a lease running out or fold
     * reads counted in place. */
    out->lease_expiries = s->lease_expiries;
    out->fast_reads = s->fast_reads;
}

uint64_t store_blocker_checks(const struct store *s)
{
    return s->blocker_checks;
}

uint64_t store_max_object_size(const struct store *s)
{
    return s->cfg.max_object_size;
}

void store_set_read_lease(struct store *s, uint64_t read_lease_ms)
{
    size_t i;

    if (s->cfg.read_lease_ms == read_lease_ms)
        return;
    s->cfg.read_lease_ms = read_lease_ms;
    /* A longer lease (or none) can make an awaited object block again:
     * watch every live object once more. */
    for (i = 0; i < ring_count(&s->ring); i++) {
        struct object *obj = ring_at(&s->ring, i, NULL), *in;

        if (obj != NULL)
            store_watch(s, obj);
        if (obj != NULL && obj->rec != NULL)
            TAILQ_FOREACH(in, &obj->rec->objects, arena_link)
                store_watch(s, in);
    }
}

uint64_t store_lease_wake_ms(struct store *s)
{
    uint64_t now = clock_now_ms(), wake = UINT64_MAX;
    struct object *obj;

    if (s->arenas_held > 0 && store_arena_wake_ms(s) != UINT64_MAX)
        return store_arena_wake_ms(s);
    /* Only a committed, unpinned blocker waits for its awaited reads: its
     * lease lets it go, and reads done in place tell the daemon nothing
     * (they count in its seal), so while it is listed as awaited it is
     * looked at again every STORE_FAST_READ_RECHECK_MS. */
    if (s->cfg.read_lease_ms == 0 && s->cfg.catalog == NULL)
        return UINT64_MAX;
    obj = store_blocker(s, now);
    /* store_blocker stopped at its bound before it found the blocker: look
     * on at the next turn of the loop, STORE_BLOCKER_LOOKS at a time. */
    if (obj != NULL && !object_blocks(s, obj, now))
        return now + 1;
    if (obj == NULL || obj->rec != NULL || obj->state != STORE_COMMITTED ||
        obj->pin_count != 0)
        return UINT64_MAX;
    if (s->cfg.read_lease_ms != 0)
        wake = obj->created_ms + s->cfg.read_lease_ms;
    if (obj->was_listed && obj->listed_awaited && obj->awaited_reads > 0 &&
        now + STORE_FAST_READ_RECHECK_MS < wake)
        wake = now + STORE_FAST_READ_RECHECK_MS;
    return wake;
}

void store_retract_enospc(struct store *s)
{
    if (s->enospc > 0)
        s->enospc--;
}

uint64_t store_room_generation(const struct store *s)
{
    return s->room_gen;
}

const struct ring *store_ring(const struct store *s)
{
    return &s->ring;
}

uint64_t store_oldest_pending_ms(const struct store *s)
{
    uint64_t oldest = !TAILQ_EMPTY(&s->age) ? TAILQ_FIRST(&s->age)->created_ms : UINT64_MAX;
    const struct store_holder *h;

    /* Held arenas expire on the same timer (store_expire_pending). */
    if (s->arenas_held > 0)
        TAILQ_FOREACH(h, &s->holders, link)
            if (h->arena != NULL && arena_due_ms(h->arena->rec, 0) < oldest)
                oldest = arena_due_ms(h->arena->rec, 0);
    return oldest;
}
