// SPDX-License-Identifier: Apache-2.0
/*
 * The store's eviction and reclaim: the watched heap of objects that may
 * block reclaim, the head-of-line blocker, the ring's eviction callback, the
 * ENOSPC message that names who is in the way, and arenas given back,
 * trimmed, taken back and expired. Objects are freed here and nowhere else.
 * Knows nothing of keys as names (only the index's node) or of sockets.
 */
#include "reclaim.h"

#include <errno.h>
#include <string.h>
#include <sys/queue.h>

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "arena.h"
#include "clock.h"
#include "index.h"
#include "reads.h"
#include "ring.h"

/* Objects one look for the blocker takes out of the watched heap at most
 * (about a millisecond): see store_blocker. */
#define STORE_BLOCKER_LOOKS 2048
/* How often waiting allocations look again while a held arena is in their
 * way: a client's write into its arena takes microseconds. */
#define STORE_ARENA_RECHECK_MS 10

/* Free an object's memory; its ring chunk and index entry are gone already. */
void object_free(struct object *obj)
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
int store_watch_reserve(struct store *s)
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
void store_watch(struct store *s, struct object *obj)
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
void store_forget(struct store *s, struct object *obj)
{
    store_unwatch(s, obj);
    s->live_objects--;
    object_free(obj);
}

/* Give an object's chunk back to the ring and free it. */
void store_drop(struct store *s, struct object *obj)
{
    s->room_gen++;
    if (obj->arena != NULL) {
        store_arena_left(s, obj);
        return;
    }
    ring_free(&s->ring, obj->ring_id);
    store_forget(s, obj);
}

/* Ring callback: may the oldest chunk go to make room? Committed objects that
 * nobody pins and nobody still awaits are evicted here. */
bool store_may_evict(void *owner, uint64_t id, void *arg)
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
bool object_blocks(const struct store *s, struct object *obj, uint64_t now)
{
    if (obj->rec != NULL) /* an arena blocks while a client holds it */
        return obj->rec->holder != NULL;
    return obj->state != STORE_COMMITTED || obj->pin_count != 0 ||
           store_awaited(s, obj, now);
}

/* The head-of-line blocker: the oldest object that stops reclaim, or NULL.
 * Amortised O(1): each object leaves the top of the heap once per time it
 * started to block. */
struct object *store_blocker(struct store *s, uint64_t now)
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
void store_settle(struct store *s, struct object *obj)
{
    if (obj->watch_pos != 0 && !object_blocks(s, obj, clock_now_ms()))
        store_unwatch(s, obj);
}

/* The ENOSPC message: what was asked, what is free, and who is in the way. */
int store_enospc(struct store *s, const char *key, size_t key_len, uint64_t size,
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

/* The holder of box lets go of it (given back, revoked, expired, gone). */
static void store_arena_detach(struct store *s, struct object *box)
{
    struct arena *a = box->rec;
    struct store_holder *h = a->holder;

    if (h == NULL)
        return;
    h->arena = NULL;
    TAILQ_REMOVE(&s->arena_holders, h, arena_link);
    a->holder = NULL;
    s->arenas_held--;
    s->arena_bytes -= a->end - a->cursor;
    s->room_gen++; /* an arena that blocked reclaim may go now */
}

/* An arena in which its client laid out chunks (committed, refused, or
 * deleted since) keeps its chunk id when it is freed: the client handed out
 * (offset, chunk id) pairs of those chunks, which readers may still hold, and
 * an arena given back at the newest end would otherwise give its id to the
 * next chunk, often the client's next arena at the same place, so that such
 * a pair would name another object (one refused for its key, then the next
 * put's). */
static void store_arena_keep_id(struct store *s, struct object *box)
{
    struct arena *a = box->rec;

    if (a->cursor != a->start || a->fold_stopped || a->made != 0)
        ring_keep_id(&s->ring, box->ring_id);
}

/* The unused tail of an arena nobody holds goes back to the ring at once
 * when the arena is the newest chunk (else it waits inside the arena for
 * its reclaim). An arena without objects is freed as an abort when its
 * client knows it is gone (told); one taken back behind its client's back
 * keeps its header, the lock that tells the client, until it is reclaimed. */
void store_arena_trim(struct store *s, struct object *box, bool told)
{
    struct arena *a = box->rec;
    uint64_t keep = a->cursor - a->chunk;

    if (a->busy_at_close)
        return; /* a client may be copying into its tail still */
    if (TAILQ_EMPTY(&a->objects)) {
        if (told) {
            store_arena_keep_id(s, box);
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
void store_arena_give_back(struct store *s, struct object *box, bool told)
{
    box->rec->busy_at_close = arena_close(box->rec);
    box->rec->revoked = !told;
    store_arena_detach(s, box);
    store_arena_trim(s, box, told);
}

/* obj, inside an arena, goes (deleted, or its last pin on a deleted one):
 * an arena left without objects that nobody holds goes too. */
void store_arena_left(struct store *s, struct object *obj)
{
    struct object *box = obj->arena;
    struct arena *a = box->rec;

    TAILQ_REMOVE(&a->objects, obj, arena_link);
    /* A restarted daemon must not bring it back. */
    store_save_state(s, obj, SHMB_CHUNK_FREE);
    store_forget(s, obj);
    if (a->holder == NULL && !a->revoked && !a->busy_at_close && TAILQ_EMPTY(&a->objects)) {
        store_arena_keep_id(s, box);
        ring_free(&s->ring, box->ring_id);
        store_forget(s, box);
    }
}

/* store_may_evict for an arena, the oldest chunk: a held one is taken back
 * when its client is not writing into it (or has been for longer than
 * --alloc-timeout); then it goes when every object in it may go, and they
 * are all evicted, oldest first. No ring call here (ring_reclaim's rule). */
bool store_may_evict_arena(struct store *s, struct object *box, uint64_t now)
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

/* When waiting allocations should look again because a held arena is the
 * oldest chunk: it goes once its client is not writing into it, and nothing
 * tells the daemon when. UINT64_MAX when no arena is in the way. */
uint64_t store_arena_wake_ms(const struct store *s)
{
    const struct object *oldest = ring_oldest(&s->ring, NULL);

    if (oldest != NULL && oldest->rec != NULL && oldest->rec->holder != NULL)
        return clock_now_ms() + STORE_ARENA_RECHECK_MS;
    return UINT64_MAX;
}

/* Give back the held arenas unused for max_age_ms (--alloc-timeout), or
 * busy for that long since first seen busy. */
void store_expire_arenas(struct store *s, uint64_t now, uint64_t max_age_ms)
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
