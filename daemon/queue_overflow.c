// SPDX-License-Identifier: Apache-2.0
/*
 * The queues' overflow objects, "q/<queue>/<seq>" in the queue's pool: the
 * daemon's record of those each writer allocated, their readers counted at
 * alloc, the reads that seats leaving forgo, and their deletion by key or,
 * for an earlier run's, by walking the pool. Never calls queue.c.
 */
#include "queue_overflow.h"

#include <string.h>

#include "../proto/alloc.h"
#include "../proto/names.h"
#include "store.h"

/* q's overflow key of message seq into key; its length, or 0 when it does
 * not fit. */
static size_t queue_key(const struct queue *q, uint64_t seq, char *key, size_t cap)
{
    return shmb_q_key(key, cap, q->name, seq);
}

/* Delete the objects "q/<name>/<seq>" of q's pool for seq in [lo, hi], by
 * key: never a walk of the pool. Pinned ones go when their last pin does. */
void queue_drop_keys(const struct queue *q, uint64_t lo, uint64_t hi)
{
    char key[SHMB_QUEUE_KEY_MAX], digits[20];
    uint64_t seq, v;
    size_t prefix, len, d;

    if (q->pool == NULL || q->pool->store == NULL)
        return;
    /* The prefix "q/<name>/" once and the digits by hand: slots + 1 keys
     * made with snprintf cost a 65,536-slot queue's create and delete about
     * 10 ms of the loop, most of it in the formatting. */
    if ((prefix = queue_key(q, 0, key, sizeof(key))) == 0)
        return;
    prefix--;
    for (seq = lo;; seq++) {
        for (v = seq, d = 0; d == 0 || v > 0; v /= 10)
            digits[d++] = (char)('0' + v % 10);
        for (len = prefix; d > 0;)
            key[len++] = digits[--d];
        if (store_contains(q->pool->store, key, len))
            store_delete(q->pool->store, key, len, NULL);
        if (seq == hi)
            break;
    }
}

/* A reader seat was just taken, starting at message next: the overflow
 * object of that message, if its writer has allocated it already, was
 * counted without this reader, who will read it: one more awaited read.
 * (Earlier messages it will not read; later ones are allocated with the
 * daemon's count, queue_overflow_readers.) */
void queue_expect_read(struct queue *q, uint64_t next)
{
    char key[SHMB_QUEUE_KEY_MAX];
    size_t len = queue_key(q, next, key, sizeof(key));

    if (len > 0 && q->pool != NULL && q->pool->store != NULL)
        store_expect_read(q->pool->store, key, len);
}

/* store_list callback: collect the keys (deleting while listing is not
 * allowed). */
struct orphans {
    char **keys;
    size_t n, cap;
};

static int queue_collect_orphan(const struct store_entry *e, void *arg)
{
    struct orphans *o = arg;
    char **grown;

    if (e->state != STORE_COMMITTED)
        return 0;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;

        if ((grown = shmb_realloc(o->keys, cap * sizeof(*grown))) == NULL)
            return 1;
        o->keys = grown;
        o->cap = cap;
    }
    if ((o->keys[o->n] = shmb_strndup(e->key, e->key_len)) == NULL)
        return 1;
    o->n++;
    return 0;
}

unsigned queue_drop_orphans(struct pool *pool)
{
    struct orphans o = {0};
    unsigned gone = 0;
    size_t i;

    if (pool->store == NULL)
        return 0;
    store_list(pool->store, SHMB_QUEUE_KEY_PREFIX, strlen(SHMB_QUEUE_KEY_PREFIX), SIZE_MAX, queue_collect_orphan, &o);
    for (i = 0; i < o.n; i++) {
        gone += store_delete(pool->store, o.keys[i], strlen(o.keys[i]), NULL) == 0;
        shmb_free(o.keys[i]);
    }
    shmb_free(o.keys);
    return gone;
}

/* The i-th oldest seq of q's overflow record. */
static uint64_t queue_overflow_at(const struct queue *q, uint32_t i)
{
    return q->overflow[(q->overflow_first + i) % q->overflow_cap];
}

/* Record that q's writer allocated the overflow object of message seq.
 * Ascending: a repeat (a waiting alloc's retry) is one entry, a seq below
 * the last starts again (only a writer that is not the library goes back,
 * and a record it confused costs only its own pool's reclaim). Those more
 * than slots before seq have left the ring, so the record holds slots + 1
 * at most; it grows as overflows come (none: no memory). Out of memory, the
 * oldest gives way. */
static void queue_overflow_record(struct queue *q, uint64_t seq)
{
    uint64_t limit = q->slots + 1, *grown;
    uint32_t cap, i;

    if (q->overflow_n > 0) {
        uint64_t last = queue_overflow_at(q, q->overflow_n - 1);

        if (seq == last)
            return;
        if (seq < last)
            q->overflow_n = 0;
    }
    /* Ascending, so the oldest is below seq: no sum to overflow. */
    while (q->overflow_n > 0 && seq - queue_overflow_at(q, 0) > q->slots) {
        q->overflow_first = (q->overflow_first + 1) % q->overflow_cap;
        q->overflow_n--;
    }
    if (q->overflow_n == q->overflow_cap && q->overflow_cap < limit) {
        cap = q->overflow_cap < 8 ? 8 : q->overflow_cap * 2;
        if (cap > limit)
            cap = (uint32_t)limit;
        if ((grown = shmb_malloc(cap * sizeof(*grown))) != NULL) {
            for (i = 0; i < q->overflow_n; i++)
                grown[i] = queue_overflow_at(q, i);
            shmb_free(q->overflow);
            q->overflow = grown;
            q->overflow_cap = cap;
            q->overflow_first = 0;
        }
    }
    if (q->overflow_cap == 0)
        return;
    if (q->overflow_n == q->overflow_cap) {
        q->overflow_first = (q->overflow_first + 1) % q->overflow_cap;
        q->overflow_n--;
    }
    q->overflow[(q->overflow_first + q->overflow_n) % q->overflow_cap] = seq;
    q->overflow_n++;
}

/* The queue of pool whose writer owner is and whose overflow key is
 * key[0..key_len) ("q/<queue>/<seq>"), or NULL; *prefix: the bytes before
 * seq. */
static struct queue *queue_of_overflow(const struct queue_set *set, const struct pool *pool,
                                       const void *owner, const char *key, size_t key_len,
                                       size_t *prefix)
{
    struct queue *q;
    const char *slash;

    if (key_len < 4 || memcmp(key, SHMB_QUEUE_KEY_PREFIX, 2) != 0 ||
        (slash = memchr(key + 2, '/', key_len - 2)) == NULL)
        return NULL;
    TAILQ_FOREACH(q, &set->list, link)
        if (q->pool == pool && q->writer == owner &&
            strlen(q->name) == (size_t)(slash - key - 2) &&
            memcmp(q->name, key + 2, (size_t)(slash - key - 2)) == 0) {
            *prefix = (size_t)(slash - key) + 1;
            return q;
        }
    return NULL;
}

void queue_overflow_readers(const struct queue_set *set, const struct pool *pool,
                            const void *owner, const char *key, size_t key_len,
                            uint32_t *readers)
{
    const struct queue *q;
    uint32_t s, live = 0;
    size_t prefix;

    if ((q = queue_of_overflow(set, pool, owner, key, key_len, &prefix)) == NULL)
        return;
    for (s = 0; s < q->seats; s++)
        live += q->seat[s].state == SHMB_SEAT_LIVE;
    *readers = live;
}

void queue_overflow_made(struct queue_set *set, const struct pool *pool, const void *owner,
                         const char *key, size_t key_len)
{
    struct queue *q;
    uint64_t seq;
    size_t prefix;

    if ((q = queue_of_overflow(set, pool, owner, key, key_len, &prefix)) != NULL &&
        shmb_q_key_seq(key, key_len, prefix, &seq))
        queue_overflow_record(q, seq);
}

/* The reader seats of q in mask (bit s: seat s), all one connection's,
 * leave for good (dead, or closed): the overflow objects of the messages
 * they will now never read await their reads no more, so that a dead
 * reader does not hold them against reclaim until the writer passes them.
 * The message a seat stood at counts as read when the connection pins that
 * object (the library advances the seat before it releases the pin, so a
 * reader that took the object and died still pins it): of the seats there,
 * as many as it holds pins. The objects are those of the daemon's record
 * (queue_overflow_record) from the lowest next on, whatever the area's head
 * says (a member may have scribbled it, or a seat's next), all the seats in
 * one pass: a lookup or two per object, not per seat and object (64 seats
 * of a 65,536-slot queue would hold the loop for seconds). */
void queue_forgo_reads(struct queue *q, uint64_t mask)
{
    uint64_t next[SHMB_QUEUE_SEATS_MAX], seq, v;
    const struct store_holder *holder = NULL;
    struct store *store = q->pool != NULL ? q->pool->store : NULL;
    char key[SHMB_QUEUE_KEY_MAX];
    uint32_t lo = 0, hi = q->overflow_n, mid, n = 0, below = 0, at, taken, s, k;
    size_t len;

    if (store == NULL)
        return;
    /* Their nexts, ascending (64 at most: insertion). */
    for (s = 0; s < q->seats && s < SHMB_QUEUE_SEATS_MAX; s++) {
        if (!(mask & (UINT64_C(1) << s)))
            continue;
        holder = q->seat[s].who.holder;
        v = atomic_load(&q->q.seat[s].next);
        for (k = n++; k > 0 && next[k - 1] > v; k--)
            next[k] = next[k - 1];
        next[k] = v;
    }
    if (n == 0)
        return;
    /* The first recorded seq at or after the lowest next. */
    while (lo < hi) {
        mid = lo + (hi - lo) / 2;
        if (queue_overflow_at(q, mid) < next[0])
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < q->overflow_n; lo++) {
        seq = queue_overflow_at(q, lo);
        /* below: the seats that had not come to seq; at: those there. */
        while (below < n && next[below] < seq)
            below++;
        for (at = 0; below + at < n && next[below + at] == seq; at++)
            ;
        if ((len = queue_key(q, seq, key, sizeof(key))) == 0)
            continue;
        /* A pin is a read taken (a get counts it), whatever the area's
         * head says: a member may have scribbled it below next. */
        taken = 0;
        if (at > 0) {
            taken = holder == NULL ? at : store_holder_pin_count(store, holder, key, len);
            if (taken > at)
                taken = at;
        }
        if (below + at - taken > 0)
            store_forgo_reads(store, key, len, below + at - taken);
    }
}

/* Delete the overflow objects left in q's pool: those of the messages
 * still in its ring, "q/<name>/<seq>" for seq in [head - slots, head]. The
 * head is the area's, which a member may have scribbled, but it only picks
 * keys under the queue's own prefix, and the lookups are slots + 1 at most. */
void queue_drop_objects(struct queue *q)
{
    uint64_t head = atomic_load(&q->q.hdr->head);

    queue_drop_keys(q, head > q->slots ? head - q->slots : 0, head);
}
