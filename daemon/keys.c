// SPDX-License-Identifier: Apache-2.0
/*
 * The store's key index and pins: lookups by key, a holder's pins on an
 * object (get, release), and the listing of keys by prefix in ring order.
 * Knows nothing of allocation, arenas or adoption.
 */
#include "keys.h"

#include <errno.h>
#include <string.h>
#include <sys/queue.h>

#include "../proto/alloc.h"
#include "clock.h"
#include "index.h"
#include "reads.h"
#include "reclaim.h"
#include "ring.h"

/* A committed object in the index under key, or NULL. */
struct object *store_lookup(const struct store *s, const char *key, size_t key_len)
{
    struct index_node *n = index_find(&s->index, key, key_len);

    return n != NULL ? (struct object *)n : NULL;
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
void store_unpin(struct store *s, struct pin *p)
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

bool store_contains(const struct store *s, const char *key, size_t key_len)
{
    const struct object *obj = store_lookup(s, key, key_len);

    return obj != NULL && obj->state == STORE_COMMITTED;
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
