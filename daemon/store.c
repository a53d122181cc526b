// SPDX-License-Identifier: Apache-2.0
/*
 * The object store: the key index, pins per holder, awaited reads, pending
 * allocations and oldest-first eviction over the ring.
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
#include "ring.h"
#include "segment.h"

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
/* Objects one look for the blocker takes out of the watched heap at most
 * (about a millisecond): see store_blocker. */
#define STORE_BLOCKER_LOOKS 2048

struct store_holder {
    TAILQ_ENTRY(store_holder) link; /* the store's holders */
    struct pin_list pins;
    struct object_list pending; /* newest first */
    uint64_t pin_total, pending_count, bytes_pinned;
    char *expired[STORE_EXPIRED_REMEMBERED]; /* NUL-terminated copies */
    unsigned expired_next;
    struct object *arena; /* the arena it holds (its object), or NULL */
};

struct store {
    struct ring ring;
    struct index index;
    struct store_config cfg; /* cfg.max_object_size is the one in force */
    struct holder_list holders;
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
    uint64_t arena_bytes;    /* the bytes not yet committed into them */
    uint64_t blocker_checks; /* objects store_blocker looked at, for tests */
};

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

/* Free an object's memory; its ring chunk and index entry are gone already. */
static void object_free(struct object *obj)
{
    if (obj != NULL && obj->rec != NULL) {
        struct object *in, *next;

        for (in = TAILQ_FIRST(&obj->rec->objects); in != NULL; in = next) {
            next = TAILQ_NEXT(in, arena_link);
            shmb_free(in);
        }
        shmb_free(obj->rec);
    }
    shmb_free(obj);
}

/* Put obj at slot i of the watched heap. */
static void store_watch_set(struct store *s, size_t i, struct object *obj)
{
    s->watched[i] = obj;
    obj->watch_pos = i + 1;
}

/* Move the object at slot i up the heap to its place. */
static void store_watch_up(struct store *s, size_t i)
{
    struct object *obj = s->watched[i];

    while (i > 0) {
        size_t parent = (i - 1) / 2;

        if (s->watched[parent]->ring_id <= obj->ring_id)
            break;
        store_watch_set(s, i, s->watched[parent]);
        i = parent;
    }
    store_watch_set(s, i, obj);
}

/* Move the object at slot i down the heap to its place. */
static void store_watch_down(struct store *s, size_t i)
{
    struct object *obj = s->watched[i];

    for (;;) {
        size_t child = 2 * i + 1;

        if (child >= s->watched_len)
            break;
        if (child + 1 < s->watched_len &&
            s->watched[child + 1]->ring_id < s->watched[child]->ring_id)
            child++;
        if (obj->ring_id <= s->watched[child]->ring_id)
            break;
        store_watch_set(s, i, s->watched[child]);
        i = child;
    }
    store_watch_set(s, i, obj);
}

/* Room in the watched heap for one more live object; -ENOMEM. Called before
 * an object is created, so that store_watch never needs memory. */
static int store_watch_reserve(struct store *s)
{
    struct object **grown;
    size_t cap;

    if (s->watched_cap > s->live_objects)
        return 0;
    cap = s->watched_cap < 64 ? 64 : s->watched_cap * 2;
    grown = shmb_realloc(s->watched, cap * sizeof(*grown));
    if (grown == NULL)
        return -ENOMEM;
    s->watched = grown;
    s->watched_cap = cap;
    return 0;
}

/* obj may have started to block reclaim: make sure it is watched. */
static void store_watch(struct store *s, struct object *obj)
{
    if (obj->watch_pos != 0)
        return;
    s->watched[s->watched_len++] = obj;
    store_watch_up(s, s->watched_len - 1);
}

/* Take obj out of the watched heap (it goes, or no longer blocks). */
static void store_unwatch(struct store *s, struct object *obj)
{
    size_t i = obj->watch_pos;
    struct object *last;

    if (i == 0)
        return;
    obj->watch_pos = 0;
    last = s->watched[--s->watched_len];
    if (i - 1 == s->watched_len)
        return;
    store_watch_set(s, i - 1, last);
    store_watch_up(s, i - 1);
    store_watch_down(s, last->watch_pos - 1);
}

/* An object goes for good: out of the heap, memory freed. */
static void store_forget(struct store *s, struct object *obj)
{
    store_unwatch(s, obj);
    s->live_objects--;
    object_free(obj);
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

/* A committed object in the index under key, or NULL. */
static struct object *store_lookup(const struct store *s, const char *key, size_t key_len)
{
    struct index_node *n = index_find(&s->index, key, key_len);

    return n != NULL ? (struct object *)n : NULL;
}

/* The seal of obj's chunk header, in the segment. */
static uint64_t *store_seal(const struct store *s, const struct object *obj)
{
    return (uint64_t *)(s->ring.data + (obj->chunk_offset - s->ring.data_offset) +
                        offsetof(struct shmb_chunk_header, seal));
}

/* A new generation: the catalog's, or the store's own without one. */
static uint32_t store_next_gen(struct store *s)
{
    uint32_t gen;

    if (s->cfg.catalog != NULL)
        return catalog_next_gen(s->cfg.catalog);
    gen = s->gen_next;
    if (++s->gen_next == 0)
        s->gen_next = 1;
    return gen;
}

/* Hand out generations after floor from now on. */
static void store_gen_after(struct store *s, uint32_t floor)
{
    if (s->cfg.catalog != NULL)
        catalog_gen_after(s->cfg.catalog, floor);
    else if (floor >= s->gen_next)
        s->gen_next = floor + 1 != 0 ? floor + 1 : 1;
}

static void store_chunk_field(struct store *s, const struct object *obj, size_t field,
                              const void *value, size_t len);
static void store_unmark_awaited(struct store *s, struct object *obj);

/* Take the reads counted in place in obj's seal: compare-and-swap
 * {gen, c} -> {gen, 0}, and c fewer awaited reads (never below 0: a count
 * can only lower them, as gets by others could); the chunk's tag then says
 * the awaited reads left, for a restart. Does not call the ring (it runs
 * inside the ring's reclaim): the tag is written straight into the header. */
static void store_fold(struct store *s, struct object *obj)
{
    uint64_t seal, *at;
    uint32_t take;
    int rc;

    if (!obj->published || obj->awaited_reads == 0)
        return;
    at = store_seal(s, obj);
    if (segment_atomic_load64(at, &seal) < 0)
        return;
    while (SHMB_SEAL_GEN(seal) == obj->gen && SHMB_SEAL_COUNT(seal) != 0) {
        if ((rc = segment_atomic_cas64(at, &seal, SHMB_SEAL(obj->gen, 0))) == -EAGAIN)
            continue; /* a reader counted meanwhile: seal holds what was found */
        if (rc < 0)
            return; /* the page is gone */
        take = SHMB_SEAL_COUNT(seal) < obj->awaited_reads ? SHMB_SEAL_COUNT(seal)
                                                           : obj->awaited_reads;
        obj->awaited_reads -= take;
        s->fast_reads += take;
        store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, tag), &obj->awaited_reads,
                          sizeof(obj->awaited_reads));
        if (take > 0 && obj->awaited_reads == 0) {
            s->room_gen++;
            store_unmark_awaited(s, obj);
        }
        return;
    }
}

/* obj becomes committed for readers of the mapping: a new generation in its
 * seal (count 0), THEN its catalog entry, so that a reader that finds the
 * entry finds the seal that goes with it. Commit, adoption (and commit_at)
 * all come here. */
static void store_publish(struct store *s, struct object *obj)
{
    uint32_t flags = obj->awaited_reads > 0 ? SHMB_CATALOG_AWAITED : 0;
    void *displaced = NULL;

    obj->gen = store_next_gen(s);
    segment_atomic_store64(store_seal(s, obj), SHMB_SEAL(obj->gen, 0));
    obj->published = true;
    /* A full catalog lists the new object in place of the oldest listing
     * near its key: that object's readers ask the daemon from now on. */
    obj->listed = s->cfg.catalog != NULL &&
                  catalog_add(s->cfg.catalog, obj->key, obj->key_len, obj->chunk_offset,
                              obj->gen, obj->size, flags, obj, &displaced) == 0;
    obj->was_listed = obj->listed;
    obj->listed_awaited = flags != 0;
    if (displaced != NULL)
        ((struct object *)displaced)->listed = false;
}

/* obj stops being readable in place: its catalog entry goes FIRST, THEN its
 * seal swaps to 0, so that a reader holding the entry sees a changed
 * generation; the reads counted in the seal meanwhile are folded in when
 * fold is set, and left behind otherwise. */
static void store_unlist(struct store *s, struct object *obj, bool fold)
{
    uint64_t old = 0;
    uint32_t take;

    if (!obj->published)
        return;
    if (s->cfg.catalog != NULL)
        catalog_remove(s->cfg.catalog, obj->key, obj->key_len, obj->chunk_offset, obj->listed);
    if (segment_atomic_exchange64(store_seal(s, obj), 0, &old) == 0 && fold &&
        SHMB_SEAL_GEN(old) == obj->gen) {
        take = SHMB_SEAL_COUNT(old) < obj->awaited_reads ? SHMB_SEAL_COUNT(old)
                                                          : obj->awaited_reads;
        obj->awaited_reads -= take;
        s->fast_reads += take;
        store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, tag), &obj->awaited_reads,
                          sizeof(obj->awaited_reads));
    }
    obj->published = obj->listed = obj->was_listed = false;
    obj->gen = 0;
}

/* obj stops being readable in place, before its bytes may be reused
 * (delete, eviction, lease eviction); the reads counted in place are its. */
static void store_unpublish(struct store *s, struct object *obj)
{
    store_unlist(s, obj, true);
}

/* obj awaits reads again (touch, expect) though it was listed as awaiting
 * none: list it again with SHMB_CATALOG_AWAITED, so that readers in place
 * count themselves. A new generation: a reader that copied under the old
 * entry did not count, and its count would be refused. A count left in the
 * old seal was made by a reader that was not asked to count (it loaded the
 * entry before its flag went): it is dropped, not taken off the reads the
 * object awaits now. The catalog is held meanwhile: a reader that probes
 * between the old entry and the new one finds no entry (or, for an object
 * the catalog has no room for, catalog_unlisted one lower), and must not
 * take that for a proof that the key has no object. */
static void store_mark_awaited(struct store *s, struct object *obj)
{
    if (!obj->published || obj->listed_awaited || obj->awaited_reads == 0)
        return;
    if (s->cfg.catalog != NULL)
        catalog_hold(s->cfg.catalog);
    store_unlist(s, obj, false);
    store_publish(s, obj);
    if (s->cfg.catalog != NULL)
        catalog_release(s->cfg.catalog);
}

/* obj awaits no more reads: list it without SHMB_CATALOG_AWAITED, so that
 * readers in place stop counting (as a get leaves nothing behind) and
 * read-only ones stop sending read requests. The generation stays, so that
 * a copy under way is still exact; a reader that loaded the entry just
 * before may still count in the seal, and store_mark_awaited's new
 * generation leaves that count behind when reads are awaited again. */
static void store_unmark_awaited(struct store *s, struct object *obj)
{
    if (!obj->published || !obj->listed_awaited || obj->awaited_reads != 0)
        return;
    if (obj->listed)
        catalog_set_flags(s->cfg.catalog, obj->key, obj->key_len, obj->chunk_offset, 0);
    obj->listed_awaited = false;
}

static void store_arena_left(struct store *s, struct object *obj);
static void store_arena_give_back(struct store *s, struct object *box, bool told);
static void store_expire_arenas(struct store *s, uint64_t now, uint64_t max_age_ms);
static uint64_t store_arena_wake_ms(const struct store *s);
/* How often waiting allocations look again while a held arena is in their
 * way: a client's write into its arena takes microseconds. */
#define STORE_ARENA_RECHECK_MS 10
static bool store_may_evict_arena(struct store *s, struct object *box, uint64_t now);

/* Give an object's chunk back to the ring and free it. */
static void store_drop(struct store *s, struct object *obj)
{
    s->room_gen++;
    if (obj->arena != NULL) {
        store_arena_left(s, obj);
        return;
    }
    ring_free(&s->ring, obj->ring_id);
    store_forget(s, obj);
}

/* Write one field of obj's chunk header: its own chunk's in the ring, or
 * its chunk inside an arena (the ring knows only the arena's). */
static void store_chunk_field(struct store *s, const struct object *obj, size_t field,
                              const void *value, size_t len)
{
    segment_store(s->ring.data + (obj->chunk_offset - s->ring.data_offset) + field, value,
                  len);
}

/* Record obj's awaited reads in its chunk header, for a later adoption. */
static void store_save_reads(struct store *s, const struct object *obj)
{
    if (obj->arena == NULL) {
        ring_set_tag(&s->ring, obj->ring_id, obj->awaited_reads);
        return;
    }
    store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, tag), &obj->awaited_reads,
                      sizeof(obj->awaited_reads));
}

/* Record obj's state in its chunk header. */
static void store_save_state(struct store *s, const struct object *obj,
                             enum shmb_chunk_state state)
{
    if (obj->arena == NULL) {
        ring_set_state(&s->ring, obj->ring_id, state);
        return;
    }
    store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, state),
                      &(uint16_t){(uint16_t)state}, sizeof(uint16_t));
}

/* True when obj's awaited reads still hold it: there are some, and its read
 * lease (if any) has not run out. Tells the lease callback once. */
static bool store_awaited(const struct store *s, struct object *obj, uint64_t now)
{
    store_fold((struct store *)s, obj);
    if (obj->awaited_reads == 0)
        return false;
    if (s->cfg.read_lease_ms == 0 || obj->state != STORE_COMMITTED ||
        now - obj->created_ms < s->cfg.read_lease_ms)
        return true;
    if (!obj->lease_told) {
        obj->lease_told = true;
        ((struct store *)s)->lease_expiries++;
        if (s->cfg.lease_expired != NULL)
            s->cfg.lease_expired(obj->key, obj->key_len, obj->awaited_reads,
                                 s->cfg.lease_arg);
    }
    return false;
}

/* Ring callback: may the oldest chunk go to make room? Committed objects that
 * nobody pins and nobody still awaits are evicted here. */
static bool store_may_evict(void *owner, uint64_t id, void *arg)
{
    struct store *s = arg;
    struct object *obj = owner;

    (void)id;
    if (obj != NULL && obj->rec != NULL)
        return store_may_evict_arena(s, obj, clock_now_ms());
    if (obj == NULL || obj->state != STORE_COMMITTED || obj->pin_count != 0 ||
        store_awaited(s, obj, clock_now_ms()))
        return false;
    store_unpublish(s, obj);
    index_remove(&s->index, &obj->node);
    s->committed--;
    s->evictions++;
    store_forget(s, obj);
    return true;
}

/* True when obj stops reclaim: the ring cannot pass it. */
static bool object_blocks(const struct store *s, struct object *obj, uint64_t now)
{
    if (obj->rec != NULL) /* an arena blocks while a client holds it */
        return obj->rec->holder != NULL;
    return obj->state != STORE_COMMITTED || obj->pin_count != 0 ||
           store_awaited(s, obj, now);
}

/* The head-of-line blocker: the oldest object that stops reclaim, or NULL.
 * Amortised O(1): each object leaves the top of the heap once per time it
 * started to block. */
static struct object *store_blocker(struct store *s, uint64_t now)
{
    unsigned looks = 0;

    while (s->watched_len > 0) {
        struct object *top = s->watched[0];

        s->blocker_checks++;
        /* Bounded: objects whose reads were done in place, or whose lease
         * ran out, are only seen to stop blocking here, and a million of
         * them held one stats for a quarter of a second. Past the bound the
         * oldest not yet looked at stands for the blocker; the next call
         * goes on from there. */
        if (object_blocks(s, top, now) || ++looks >= STORE_BLOCKER_LOOKS)
            return top;
        store_unwatch(s, top);
    }
    return NULL;
}

/* obj may have just stopped blocking reclaim (committed, its last pin
 * released, its awaited reads done): out of the watched heap at once, at
 * O(log n), so that store_blocker does not find a backlog of them. */
static void store_settle(struct store *s, struct object *obj)
{
    if (obj->watch_pos != 0 && !object_blocks(s, obj, clock_now_ms()))
        store_unwatch(s, obj);
}

/* The ENOSPC message: what was asked, what is free, and who is in the way. */
static int store_enospc(struct store *s, const char *key, size_t key_len, uint64_t size,
                        struct shmb_error *err)
{
    /* Keys are quoted cut to 64 bytes (on a character boundary): a batch
     * of refused allocs repeats this message once per op. */
    enum { QUOTE_MAX = 64 };
    struct object *blocker = ring_oldest(&s->ring, NULL);
    unsigned long long free_bytes = ring_free_bytes(&s->ring);
    const char *size_setting = s->cfg.size_setting != NULL ? s->cfg.size_setting : "--size";
    int kq = (int)shmb_utf8_cut(key, key_len, QUOTE_MAX), bq;
    const char *kmore = (size_t)kq < key_len ? "..." : "", *bmore;

    s->enospc++;
    if (blocker != NULL && blocker->rec != NULL) {
        struct object *in;

        if (blocker->rec->holder != NULL)
            return shmb_error_set(
                err, -ENOSPC,
                "No space for '%.*s%s' (%llu bytes): %llu of %llu bytes free; the "
                "oldest chunk is the arena of client %llu, which blocks reclaim while "
                "that client writes into it or has commits on their way to it (a "
                "client stopped mid-put holds it until it goes on or disconnects). "
                "Start shmbrokerd with a larger %s.",
                kq, key, kmore, (unsigned long long)size, free_bytes,
                (unsigned long long)s->ring.size,
                (unsigned long long)blocker->rec->client, size_setting);
        /* Name the arena's first object that may not go. */
        TAILQ_FOREACH(in, &blocker->rec->objects, arena_link)
            if (object_blocks(s, in, clock_now_ms()))
                break;
        blocker = in;
    }
    if (blocker == NULL)
        return shmb_error_set(
            err, -ENOSPC,
            "No space for '%.*s%s' (%llu bytes): %llu of %llu bytes free. "
            "Start shmbrokerd with a larger %s.",
            kq, key, kmore, (unsigned long long)size, free_bytes,
            (unsigned long long)s->ring.size, size_setting);
    bq = (int)shmb_utf8_cut(blocker->key, blocker->key_len, QUOTE_MAX);
    bmore = (size_t)bq < blocker->key_len ? "..." : "";
    if (blocker->state == STORE_PENDING)
        return shmb_error_set(
            err, -ENOSPC,
            "No space for '%.*s%s' (%llu bytes): %llu of %llu bytes free; "
            "the oldest object '%.*s%s' (pins=%u) is still being written "
            "and blocks reclaim. Commit or abort it, or start shmbrokerd "
            "with a larger %s.",
            kq, key, kmore, (unsigned long long)size, free_bytes,
            (unsigned long long)s->ring.size, bq, blocker->key, bmore,
            blocker->pin_count, size_setting);
    return shmb_error_set(
        err, -ENOSPC,
        "No space for '%.*s%s' (%llu bytes): %llu of %llu bytes free; the "
        "oldest object '%.*s%s' blocks reclaim (pins=%u, awaited reads=%u)%s. "
        "Release it or read it, or start shmbrokerd with a larger %s.",
        kq, key, kmore, (unsigned long long)size, free_bytes,
        (unsigned long long)s->ring.size, bq, blocker->key, bmore,
        blocker->pin_count, blocker->awaited_reads,
        blocker->state == STORE_DELETED ? " (deleted, still pinned)" : "", size_setting);
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

/* A new chunk for obj in the ring, as vLLM's put: when there is no room, free
 * what may go, oldest first, then retry once. -ENOSPC names the blocker. */
static int store_place(struct store *s, struct object *obj, uint64_t size,
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
static int store_object_new(struct store *s, const struct object_spec *spec,
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
static int store_check_new(const struct store *s, const char *key, size_t key_len,
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
static void store_commit_object(struct store *s, struct object *obj)
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

/* h's pin record on obj, or NULL. */
static struct pin *store_pin_of(const struct object *obj, const struct store_holder *h)
{
    struct pin *p;

    for (p = SLIST_FIRST(&obj->pins); p != NULL && p->holder != h;
         p = SLIST_NEXT(p, obj_link))
        ;
    return p;
}

int store_get(struct store *s, struct store_holder *h, const char *key, size_t key_len,
              struct store_extent *out, struct shmb_error *err)
{
    struct object *obj = store_lookup(s, key, key_len);
    struct pin *p;

    if (obj == NULL || obj->state != STORE_COMMITTED)
        return shmb_error_set(err, -ENOENT, "No object '%.*s'%s.", (int)key_len, key,
                              obj != NULL ? " yet: it is allocated but not committed"
                                          : "; check the key, or wait for its writer to "
                                            "commit it");
    store_fold(s, obj);
    p = store_pin_of(obj, h);
    if (p == NULL) {
        p = shmb_calloc(1, sizeof(*p));
        if (p == NULL)
            return shmb_error_set(err, -ENOMEM, "Out of memory for a pin.");
        p->obj = obj;
        p->holder = h;
        SLIST_INSERT_HEAD(&obj->pins, p, obj_link);
        TAILQ_INSERT_HEAD(&h->pins, p, h_link);
        h->bytes_pinned += obj->size;
    }
    p->count++;
    h->pin_total++;
    if (obj->pin_count++ == 0) {
        s->pinned++;
        store_watch(s, obj); /* a pinned object blocks reclaim */
    }
    if (obj->awaited_reads > 0) {
        if (obj->awaited_reads == 1)
            s->room_gen++;
        obj->awaited_reads--;
        store_save_reads(s, obj);
        store_unmark_awaited(s, obj);
    }
    s->gets++;
    if (out != NULL) {
        out->offset = obj->offset;
        out->size = obj->size;
    }
    return 0;
}

/* Drop one pin of record p; frees a deleted object with its last pin. */
static void store_unpin(struct store *s, struct pin *p)
{
    struct object *obj = p->obj;
    struct store_holder *h = p->holder;

    p->count--;
    h->pin_total--;
    if (p->count == 0) {
        SLIST_REMOVE(&obj->pins, p, pin, obj_link);
        TAILQ_REMOVE(&h->pins, p, h_link);
        h->bytes_pinned -= obj->size;
        shmb_free(p);
    }
    if (--obj->pin_count == 0) {
        s->pinned--;
        s->room_gen++;
        if (obj->state == STORE_DELETED) {
            s->deleted_pinned--;
            store_drop(s, obj);
        } else {
            store_settle(s, obj);
        }
    }
}

int store_release(struct store *s, struct store_holder *h, const char *key,
                  size_t key_len, struct shmb_error *err)
{
    struct object *obj = store_lookup(s, key, key_len);
    struct pin *p = NULL;

    if (obj != NULL)
        p = store_pin_of(obj, h);
    /* A pin on a deleted object is found through the holder: the key is no
     * longer in the index. */
    if (p == NULL)
        for (p = TAILQ_FIRST(&h->pins); p != NULL; p = TAILQ_NEXT(p, h_link))
            if (p->obj->state == STORE_DELETED && p->obj->key_len == key_len &&
                memcmp(p->obj->key, key, key_len) == 0)
                break;
    if (p == NULL)
        return shmb_error_set(err, -ENOENT,
                              "Cannot release '%.*s': this connection holds no pin on it "
                              "(every get is released once).",
                              (int)key_len, key);
    store_unpin(s, p);
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

bool store_holder_pins(const struct store *s, const struct store_holder *h, const char *key,
                       size_t key_len)
{
    struct object *obj = store_lookup(s, key, key_len);

    return obj != NULL && h != NULL && store_pin_of(obj, h) != NULL;
}

uint32_t store_holder_pin_count(const struct store *s, const struct store_holder *h,
                                const char *key, size_t key_len)
{
    struct object *obj = store_lookup(s, key, key_len);
    const struct pin *p;

    return obj != NULL && h != NULL && (p = store_pin_of(obj, h)) != NULL ? p->count : 0;
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

bool store_contains(const struct store *s, const char *key, size_t key_len)
{
    const struct object *obj = store_lookup(s, key, key_len);

    return obj != NULL && obj->state == STORE_COMMITTED;
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

/* store_list's step: report obj when its key has the prefix. 1 when fn
 * said stop, 0 otherwise; *reported counts. */
static int store_list_one(struct store *s, struct object *obj, const char *prefix,
                          size_t prefix_len, uint64_t now, store_list_fn fn, void *arg,
                          size_t *reported)
{
    struct store_entry e;

    if (obj->key_len < prefix_len ||
        (prefix_len > 0 && memcmp(obj->key, prefix, prefix_len) != 0))
        return 0;
    /* The awaited reads as they are: with those counted in place. */
    store_fold(s, obj);
    e.key = obj->key;
    e.key_len = obj->key_len;
    e.offset = obj->offset;
    e.size = obj->size;
    e.pins = obj->pin_count;
    e.awaited_reads = obj->awaited_reads;
    e.state = (enum store_state)obj->state;
    e.age_ms = now - obj->created_ms;
    e.chunk_offset = obj->chunk_offset;
    e.gen = obj->gen;
    (*reported)++;
    return fn(&e, arg) != 0;
}

size_t store_list(const struct store *s, const char *prefix, size_t prefix_len,
                  size_t limit, store_list_fn fn, void *arg)
{
    return store_list_from(s, prefix, prefix_len, limit, 0, SIZE_MAX, NULL, fn, arg);
}

/* The index of the oldest live chunk whose id is at least from: chunk ids
 * grow from the oldest chunk to the newest, so a binary search. */
static size_t store_list_start(const struct store *s, uint64_t from)
{
    size_t lo = 0, hi = ring_count(&s->ring);

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        struct ring_chunk c;

        ring_at(&s->ring, mid, &c);
        if (c.id < from)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t store_list_from(const struct store *s, const char *prefix, size_t prefix_len,
                       size_t limit, uint64_t from, size_t max_scan, uint64_t *next,
                       store_list_fn fn, void *arg)
{
    uint64_t now = clock_now_ms();
    size_t i, reported = 0, scanned = 0;

    if (next != NULL)
        *next = 0;
    for (i = from > 0 ? store_list_start(s, from) : 0;
         i < ring_count(&s->ring) && reported < limit; i++) {
        struct ring_chunk c;
        struct object *obj, *in;

        if (scanned >= max_scan) {
            /* Looked at enough for one request: say where to go on. */
            ring_at(&s->ring, i, &c);
            if (next != NULL)
                *next = c.id;
            break;
        }
        scanned++;
        obj = ring_at(&s->ring, i, NULL);
        if (obj == NULL)
            continue;
        if (obj->rec == NULL) {
            if (store_list_one((struct store *)s, obj, prefix, prefix_len, now, fn, arg,
                               &reported))
                break;
            continue;
        }
        /* An arena: its objects, in the order they were committed. */
        for (in = TAILQ_FIRST(&obj->rec->objects); in != NULL && reported < limit;
             in = TAILQ_NEXT(in, arena_link)) {
            scanned++;
            if (store_list_one((struct store *)s, in, prefix, prefix_len, now, fn, arg,
                               &reported))
                return reported;
        }
    }
    return reported;
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

/* Arenas (daemon/arena.c has the record and the lock). An arena is one ring
 * chunk, owned by an object without key (box) whose rec is the record; the
 * objects committed into it hang off rec->objects, oldest first. */

/* A new arena object, counted among the live ones (room in the watched
 * heap reserved); NULL when memory ran out. Not linked anywhere yet: on
 * failure it goes with store_forget. */
static struct object *store_box_new(struct store *s)
{
    struct object *box = NULL;

    if (store_watch_reserve(s) < 0 || (box = shmb_calloc(1, sizeof(*box) + 1)) == NULL)
        return NULL;
    if ((box->rec = shmb_calloc(1, sizeof(*box->rec))) == NULL) {
        shmb_free(box);
        return NULL;
    }
    TAILQ_INIT(&box->rec->objects);
    box->state = STORE_COMMITTED;
    box->created_ms = clock_now_ms();
    s->live_objects++;
    return box;
}

/* Set up box's record over its chunk (id, payload of size bytes at
 * payload_offset), held by h (NULL: nobody). */
static void store_box_place(struct store *s, struct object *box, struct store_holder *h,
                            uint64_t client, uint64_t id, uint64_t payload_offset,
                            uint64_t size, uint64_t token)
{
    uint64_t chunk = payload_offset - SHMB_CHUNK_HEADER_SIZE(0);
    uint64_t *seal = (uint64_t *)(s->ring.data + (chunk - s->ring.data_offset) +
                                  offsetof(struct shmb_chunk_header, seal));

    box->ring_id = id;
    box->offset = payload_offset;
    box->chunk_offset = chunk;
    box->size = size;
    arena_init(box->rec, h, client, id, chunk, payload_offset, payload_offset + size, seal,
               token, clock_now_ms());
}

/* The holder of box lets go of it (given back, revoked, expired, gone). */
static void store_arena_detach(struct store *s, struct object *box)
{
    struct arena *a = box->rec;
    struct store_holder *h = a->holder;

    if (h == NULL)
        return;
    h->arena = NULL;
    a->holder = NULL;
    s->arenas_held--;
    s->arena_bytes -= a->end - a->cursor;
    s->room_gen++; /* an arena that blocked reclaim may go now */
}

/* The unused tail of an arena nobody holds goes back to the ring at once
 * when the arena is the newest chunk (else it waits inside the arena for
 * its reclaim). An arena without objects is freed as an abort when its
 * client knows it is gone (told); one taken back behind its client's back
 * keeps its header, the lock that tells the client, until it is reclaimed. */
static void store_arena_trim(struct store *s, struct object *box, bool told)
{
    struct arena *a = box->rec;
    uint64_t keep = a->cursor - a->chunk;

    if (a->busy_at_close)
        return; /* a client may be copying into its tail still */
    if (TAILQ_EMPTY(&a->objects)) {
        if (told) {
            ring_free(&s->ring, box->ring_id);
            store_forget(s, box);
            return;
        }
        if (keep < SHMB_CHUNK_HEADER_SIZE(0) + SHMB_ALIGN)
            keep = SHMB_CHUNK_HEADER_SIZE(0) + SHMB_ALIGN;
    }
    if (a->chunk + keep < a->end && ring_shrink(&s->ring, box->ring_id, keep) == 0) {
        a->end = a->chunk + keep;
        box->size = keep - SHMB_CHUNK_HEADER_SIZE(0);
    }
}

/* Give box back: its lock REVOKED, its holder let go, its tail trimmed. */
static void store_arena_give_back(struct store *s, struct object *box, bool told)
{
    box->rec->busy_at_close = arena_close(box->rec);
    box->rec->revoked = !told;
    store_arena_detach(s, box);
    store_arena_trim(s, box, told);
}

/* obj, inside an arena, goes (deleted, or its last pin on a deleted one):
 * an arena left without objects that nobody holds goes too. */
static void store_arena_left(struct store *s, struct object *obj)
{
    struct object *box = obj->arena;
    struct arena *a = box->rec;

    TAILQ_REMOVE(&a->objects, obj, arena_link);
    /* A restarted daemon must not bring it back. */
    store_save_state(s, obj, SHMB_CHUNK_FREE);
    store_forget(s, obj);
    if (a->holder == NULL && !a->revoked && !a->busy_at_close && TAILQ_EMPTY(&a->objects)) {
        ring_free(&s->ring, box->ring_id);
        store_forget(s, box);
    }
}

/* store_may_evict for an arena, the oldest chunk: a held one is taken back
 * when its client is not writing into it (or has been for longer than
 * --alloc-timeout); then it goes when every object in it may go, and they
 * are all evicted, oldest first. No ring call here (ring_reclaim's rule). */
static bool store_may_evict_arena(struct store *s, struct object *box, uint64_t now)
{
    struct arena *a = box->rec;
    struct object *in;

    if (a->holder != NULL) {
        /* Never while its client writes into it, however long: a client
         * that stalls mid-copy holds its arena as a pin holds an object. */
        if (arena_revoke(a, now, 0) < 0)
            return false;
        a->revoked = true;
        store_arena_detach(s, box);
    }
    TAILQ_FOREACH(in, &a->objects, arena_link)
        if (object_blocks(s, in, now))
            return false;
    while ((in = TAILQ_FIRST(&a->objects)) != NULL) {
        TAILQ_REMOVE(&a->objects, in, arena_link);
        store_unpublish(s, in);
        index_remove(&s->index, &in->node);
        s->committed--;
        s->evictions++;
        store_forget(s, in);
    }
    store_forget(s, box);
    return true;
}

bool store_commits_due(const struct store *s)
{
    const struct object *oldest = ring_oldest(&s->ring, NULL);

    return oldest != NULL && oldest->rec != NULL && oldest->rec->holder != NULL &&
           arena_committing(oldest->rec);
}

/* When waiting allocations should look again because a held arena is the
 * oldest chunk: it goes once its client is not writing into it, and nothing
 * tells the daemon when. UINT64_MAX when no arena is in the way. */
static uint64_t store_arena_wake_ms(const struct store *s)
{
    const struct object *oldest = ring_oldest(&s->ring, NULL);

    if (oldest != NULL && oldest->rec != NULL && oldest->rec->holder != NULL)
        return clock_now_ms() + STORE_ARENA_RECHECK_MS;
    return UINT64_MAX;
}

/* Give back the held arenas unused for max_age_ms (--alloc-timeout), or
 * busy for that long since first seen busy. */
static void store_expire_arenas(struct store *s, uint64_t now, uint64_t max_age_ms)
{
    struct store_holder *h;

    if (s->arenas_held == 0 || max_age_ms == 0)
        return;
    TAILQ_FOREACH(h, &s->holders, link) {
        struct object *box = h->arena;

        if (box == NULL || now < arena_due_ms(box->rec, max_age_ms))
            continue;
        if (arena_revoke(box->rec, now, 0) == 0)
            store_arena_give_back(s, box, false);
    }
}

int store_arena(struct store *s, struct store_holder *h, uint64_t client, uint64_t size,
                struct store_extent *out, uint64_t *token, struct shmb_error *err)
{
    struct ring_chunk chunk;
    struct object *box;
    uint64_t granted;
    int rc;

    if (h->arena != NULL)
        store_arena_give_back(s, h->arena, true);
    out->offset = out->size = 0;
    *token = 0;
    if (size == 0)
        return 0;
    if ((rc = arena_grant_size(size, s->cfg.max_object_size, s->ring.size, &granted, err)) <
        0)
        return rc;
    if ((box = store_box_new(s)) == NULL)
        return shmb_error_set(err, -ENOMEM, "Out of memory for an arena.");
    if ((rc = store_place(s, box, granted, &chunk, err)) < 0) {
        store_forget(s, box);
        return rc;
    }
    shmb_error_clear(err); /* a retry that succeeded leaves no stale message */
    ring_set_state(&s->ring, chunk.id, SHMB_CHUNK_ARENA);
    store_box_place(s, box, h, client, chunk.id, chunk.payload_offset, granted,
                    arena_token());
    if ((rc = arena_open(box->rec)) < 0) {
        ring_free(&s->ring, chunk.id);
        store_forget(s, box);
        if (segment_guard_check(s->ring.data, err) < 0)
            return err->code;
        return shmb_error_set(err, -EIO,
                              "The page of the arena's header is gone from the segment "
                              "file (a client shrank it or punched a hole in it); restart "
                              "the daemon once that client is fixed.");
    }
    store_watch(s, box); /* a held arena blocks reclaim */
    h->arena = box;
    s->arenas_held++;
    s->arena_bytes += granted;
    out->offset = chunk.payload_offset;
    out->size = granted;
    *token = box->rec->token;
    return 0;
}

/* The chunk of chunk bytes at offset, at a's cursor, becomes a free chunk
 * (an adoption steps over it) and the cursor moves past it. */
static void store_arena_skip(struct store *s, struct arena *a, uint64_t offset, uint64_t chunk)
{
    struct shmb_chunk_header hdr;

    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = SHMB_CHUNK_MAGIC;
    hdr.state = SHMB_CHUNK_FREE;
    hdr.header_size = (uint32_t)SHMB_CHUNK_HEADER_SIZE(0);
    hdr.id = a->ring_id;
    hdr.chunk_size = chunk;
    hdr.payload_size = chunk - SHMB_CHUNK_HEADER_SIZE(0);
    if (segment_store(s->ring.data + (offset - s->ring.data_offset), &hdr, sizeof(hdr)) < 0)
        return;
    a->cursor += chunk;
    s->arena_bytes -= chunk;
    ring_set_tag(&s->ring, a->ring_id, (uint32_t)((a->cursor - a->start) / SHMB_ALIGN));
}

void store_commit_seen(struct store *s, struct store_holder *h)
{
    struct object *box = h->arena;

    /* One fewer on its way, whatever comes of it; the last one lets the
     * arena go, so waiting allocations look again if it is in their way. */
    if (box != NULL && arena_commit_seen(box->rec) && ring_oldest(&s->ring, NULL) == box)
        s->room_gen++;
}

int store_commit_at(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                    uint64_t offset, uint64_t size, uint32_t readers,
                    struct store_extent *out, struct shmb_error *err)
{
    struct object *box = h->arena, *obj;
    struct arena *a = box != NULL ? box->rec : NULL;
    struct shmb_chunk_header hdr;
    struct ring_chunk found;
    struct object_spec spec;
    uint64_t chunk;
    unsigned char *at;
    int rc;

    chunk = SHMB_CHUNK_SIZE(key_len, size);
    store_commit_seen(s, h);
    /* As alloc: a segment a client shrank or holed takes no new object (the
     * guard's message names the cause and the fix). */
    if ((rc = segment_guard_check(s->ring.data, err)) < 0)
        return rc;
    if ((rc = store_check_new(s, key, key_len, size, readers, err)) < 0) {
        struct shmb_error ignored = {0};

        /* Refused (a key that exists, say) but laid out where the next chunk
         * goes: the arena moves past it, a free chunk, so that the client's
         * next chunks (sent on without waiting: commit_at noreply) still
         * start at the arena's next free byte. */
        if (arena_check_commit(a, offset, chunk, &ignored) == 0)
            store_arena_skip(s, a, offset, chunk);
        return rc;
    }
    if ((rc = arena_check_commit(a, offset, chunk, err)) < 0)
        return rc;
    /* The header from private values only: whatever the client wrote there
     * is overwritten. */
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = SHMB_CHUNK_MAGIC;
    hdr.state = SHMB_CHUNK_COMMITTED;
    hdr.key_len = (uint16_t)key_len;
    hdr.header_size = (uint32_t)SHMB_CHUNK_HEADER_SIZE(key_len);
    hdr.tag = readers;
    hdr.id = a->ring_id;
    hdr.chunk_size = chunk;
    hdr.payload_size = size;
    at = s->ring.data + (offset - s->ring.data_offset);
    if (segment_store(at, &hdr, sizeof(hdr)) < 0 ||
        segment_store(at + sizeof(hdr), key, key_len) < 0) {
        if ((rc = segment_guard_check(s->ring.data, err)) < 0)
            return rc;
        return shmb_error_set(err, -EIO, "The segment could not be written at %llu.",
                              (unsigned long long)offset);
    }
    memset(&found, 0, sizeof(found));
    found.id = a->ring_id;
    found.payload_offset = offset + hdr.header_size;
    found.payload_size = size;
    memset(&spec, 0, sizeof(spec));
    spec.key = key;
    spec.key_len = key_len;
    spec.size = size;
    spec.awaited_reads = readers;
    spec.state = STORE_UNPUBLISHED;
    spec.found = &found;
    spec.arena = box;
    if ((rc = store_object_new(s, &spec, &obj, err)) < 0)
        return rc;
    a->cursor += chunk;
    a->made++;
    s->arena_bytes -= chunk;
    a->last_use_ms = clock_now_ms();
    a->busy_since_ms = 0;
    /* The bytes committed, for an adoption to walk and no further. */
    ring_set_tag(&s->ring, a->ring_id, (uint32_t)((a->cursor - a->start) / SHMB_ALIGN));
    store_commit_object(s, obj);
    out->offset = obj->offset;
    out->size = size;
    return 0;
}

/* What store_adopt's ring walk needs. */
struct store_adoption {
    struct store *s;
    struct store_adopt_report *report;
    uint32_t max_gen; /* the largest generation found in a chunk's seal */
};

/* The awaited reads of a chunk found by an adoption: its tag (what the
 * daemon last recorded) less the reads counted in place in its seal since
 * (a sealed chunk's count is only ever reads the daemon has not taken yet).
 * A count above the tag leaves none awaited, as gets by others would. */
static uint32_t store_adopt_awaited(const struct shmb_chunk_header *hdr)
{
    uint32_t count = SHMB_SEAL_GEN(hdr->seal) != 0 ? SHMB_SEAL_COUNT(hdr->seal) : 0;

    return hdr->tag > count ? hdr->tag - count : 0;
}

/* store_adopt_chunk for an arena: walk its payload for the bytes its tag
 * says were committed, each chunk copied and checked (ring_read_inner, its
 * id the arena's), and bring back the committed ones as objects of an arena
 * nobody holds; stop at the first bad one and drop the rest. An arena left
 * without objects is freed. */
static void *store_adopt_arena(struct store_adoption *ad, const struct shmb_chunk_header *hdr,
                               uint64_t payload_offset)
{
    struct store *s = ad->s;
    struct store_adopt_report *report = ad->report;
    struct object *box = store_box_new(s);
    uint64_t walk = (uint64_t)hdr->tag * SHMB_ALIGN, pos = payload_offset, end;
    struct shmb_error e = {0};
    int rc = 0;

    if (box == NULL) {
        report->dropped_invalid++;
        return NULL;
    }
    /* Its client, connected to the daemon that died, may take the lock
     * again before it learns: the lock REVOKED under the grant's token
     * before anything is handed out; one found BUSY (a copy under way when
     * the daemon died) keeps its bytes until the ring comes round to it. */
    store_box_place(s, box, NULL, 0, hdr->id, payload_offset, hdr->payload_size,
                    hdr->seal & ~UINT64_C(3));
    box->rec->busy_at_close = arena_close(box->rec);
    if (walk > hdr->payload_size) {
        rc = shmb_error_set(&e, -EBADMSG,
                            "Corrupt arena at offset %llu: its tag says %llu bytes were "
                            "committed, it holds %llu.",
                            (unsigned long long)box->chunk_offset, (unsigned long long)walk,
                            (unsigned long long)hdr->payload_size);
        walk = 0;
    }
    end = payload_offset + walk;
    while (rc == 0 && pos < end) {
        struct shmb_chunk_header h; /* private copies, checked */
        char key[SHMB_KEY_MAX + 1];
        struct ring_chunk found = {.id = hdr->id, .payload_size = 0};
        struct object_spec spec = {.key = key, .state = STORE_COMMITTED, .arena = box};
        struct object *obj;

        rc = ring_read_inner(&s->ring, pos - s->ring.data_offset, end - s->ring.data_offset,
                             &h, key, &e);
        if (rc == 0 && h.id != hdr->id)
            rc = shmb_error_set(&e, -EBADMSG,
                                "Corrupt arena: the chunk at offset %llu has id %llu, its "
                                "arena's is %llu.",
                                (unsigned long long)pos, (unsigned long long)h.id,
                                (unsigned long long)hdr->id);
        if (rc == 0 && h.state != SHMB_CHUNK_COMMITTED && h.state != SHMB_CHUNK_FREE)
            rc = shmb_error_set(&e, -EBADMSG,
                                "Corrupt arena: the chunk at offset %llu is in state %u.",
                                (unsigned long long)pos, h.state);
        if (rc < 0)
            break;
        if (SHMB_SEAL_GEN(h.seal) > ad->max_gen)
            ad->max_gen = SHMB_SEAL_GEN(h.seal);
        found.payload_offset = pos + h.header_size;
        found.payload_size = h.payload_size;
        spec.key_len = h.key_len;
        spec.size = h.payload_size;
        spec.awaited_reads = store_adopt_awaited(&h);
        spec.found = &found;
        if (h.state == SHMB_CHUNK_FREE) {
            report->dropped_free++;
        } else if (shmb_key_check(key, h.key_len, NULL) < 0 ||
                   store_lookup(s, key, h.key_len) != NULL || h.tag > STORE_MAX_READERS ||
                   store_object_new(s, &spec, &obj, NULL) < 0) {
            report->dropped_invalid++;
        } else {
            report->restored++;
            report->restored_bytes += h.payload_size;
        }
        pos += h.chunk_size;
    }
    box->rec->cursor = pos;
    if (rc < 0) {
        uint32_t tag = (uint32_t)((pos - payload_offset) / SHMB_ALIGN);

        report->corrupt = true;
        report->arena_dropped_bytes += payload_offset + (uint64_t)hdr->tag * SHMB_ALIGN - pos;
        if (report->message[0] == '\0')
            snprintf(report->message, sizeof(report->message),
                     "%.900s Dropped the rest of that arena (%llu bytes).", e.message,
                     (unsigned long long)(payload_offset + (uint64_t)hdr->tag * SHMB_ALIGN -
                                          pos));
        /* What is left is what the next adoption walks. */
        store_chunk_field(s, box, offsetof(struct shmb_chunk_header, tag), &tag,
                          sizeof(tag));
    }
    if (TAILQ_EMPTY(&box->rec->objects)) {
        store_forget(s, box);
        return NULL;
    }
    return box;
}

/* After an adoption: the newest chunk, when it is an arena, keeps only the
 * bytes committed into it. */
static void store_adopt_trim(struct store *s)
{
    size_t n = ring_count(&s->ring);
    struct object *box = n > 0 ? ring_at(&s->ring, n - 1, NULL) : NULL;

    if (box != NULL && box->rec != NULL)
        store_arena_trim(s, box, true);
}

/* Ring callback of store_adopt: bring back a committed chunk as an object.
 * hdr and key are private copies that ring_adopt made and checked; nothing
 * here reads the segment, which a read-write client may change meanwhile.
 * A key that is not one a client could have put (empty, NUL inside, not
 * UTF-8) is dropped as invalid: such an object could never be named, and
 * list and stats could not reply with it. */
static void *store_adopt_chunk(const struct shmb_chunk_header *hdr, const char *key,
                               uint64_t payload_offset, void *arg)
{
    struct store_adoption *a = arg;
    struct store *s = a->s;
    struct ring_chunk found = {.id = hdr->id,
                               .payload_offset = payload_offset,
                               .payload_size = hdr->payload_size};
    struct object_spec spec = {.key = key,
                               .key_len = hdr->key_len,
                               .size = hdr->payload_size,
                               .awaited_reads = store_adopt_awaited(hdr),
                               .state = STORE_COMMITTED,
                               .found = &found};
    struct object *obj;
    size_t key_len = hdr->key_len;

    if (SHMB_SEAL_GEN(hdr->seal) > a->max_gen)
        a->max_gen = SHMB_SEAL_GEN(hdr->seal);
    if (hdr->state == SHMB_CHUNK_ARENA)
        return store_adopt_arena(a, hdr, payload_offset);
    if (hdr->state == SHMB_CHUNK_PENDING) {
        a->report->dropped_pending++;
        return NULL;
    }
    if (hdr->state != SHMB_CHUNK_COMMITTED) {
        a->report->dropped_free++;
        return NULL;
    }
    if (key_len > SHMB_KEY_MAX || shmb_key_check(key, key_len, NULL) < 0 ||
        store_lookup(s, key, key_len) != NULL || hdr->tag > STORE_MAX_READERS ||
        store_object_new(s, &spec, &obj, NULL) < 0) {
        a->report->dropped_invalid++;
        return NULL;
    }
    a->report->restored++;
    a->report->restored_bytes += hdr->payload_size;
    return obj;
}

struct store *store_adopt(void *data, uint64_t data_offset, uint64_t data_size,
                          struct shmb_segment_header *cursor,
                          const struct store_config *cfg,
                          struct store_adopt_report *report, struct shmb_error *err)
{
    /* The cursor is read from the segment once, here, through the guard (a
     * client may have shrunk the file); ring_adopt checks it. */
    uint64_t start = 0, end = 0, next = 0;
    struct store_adoption a;
    struct shmb_error walk = {0};
    struct store *s;

    memset(report, 0, sizeof(*report));
    if (segment_load(&start, &cursor->ring_start, sizeof(start)) < 0 ||
        segment_load(&end, &cursor->ring_end, sizeof(end)) < 0 ||
        segment_load(&next, &cursor->ring_next_id, sizeof(next)) < 0) {
        report->corrupt = true;
        snprintf(report->message, sizeof(report->message),
                 "The ring cursor could not be read (the file was truncated under "
                 "the daemon): nothing adopted.");
        start = end = next = 0;
    }
    s = store_new(data, data_offset, data_size, cursor, cfg, err);
    if (s == NULL)
        return NULL;
    a.s = s;
    a.report = report;
    a.max_gen = 0;
    if (ring_adopt(&s->ring, start, end, next, store_adopt_chunk, &a, &walk) < 0) {
        report->corrupt = true;
        if (report->message[0] != '\0') { /* an arena's, kept after the ring's */
            char arena_msg[sizeof(report->message)];

            memcpy(arena_msg, report->message, sizeof(arena_msg));
            snprintf(report->message, sizeof(report->message), "%.600s %.400s",
                     walk.message, arena_msg);
        } else {
            snprintf(report->message, sizeof(report->message), "%s", walk.message);
        }
        if (walk.code == -ENOMEM) {
            shmb_error_set(err, -ENOMEM, "%s", walk.message);
            store_free(s);
            return NULL;
        }
    }
    /* Generations never used before (readers may still hold old ones), then
     * every restored object sealed and listed anew, oldest first: the new
     * seal's count is 0, so its tag takes in the reads its old seal counted
     * (store_adopt_awaited), or a second restart would count them again. */
    store_gen_after(s, cfg != NULL ? cfg->gen_floor : 0);
    store_gen_after(s, a.max_gen);
    for (size_t i = 0; i < ring_count(&s->ring); i++) {
        struct object *obj = ring_at(&s->ring, i, NULL), *in;

        if (obj != NULL && obj->rec == NULL && obj->state == STORE_COMMITTED) {
            store_save_reads(s, obj);
            store_publish(s, obj);
        }
        if (obj != NULL && obj->rec != NULL)
            TAILQ_FOREACH(in, &obj->rec->objects, arena_link) {
                store_save_reads(s, in);
                store_publish(s, in);
            }
    }
    store_adopt_trim(s);
    return s;
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
