// SPDX-License-Identifier: Apache-2.0
/*
 * The catalog's writer: a table of open addressing with linear probing at
 * the end of the segment, each entry written under its own sequence count,
 * deletion by backward shift under the header's catalog_moves, and the
 * heartbeat and counters in the header page. Every write goes through the
 * segment's guarded atomics: a client may truncate the file under the daemon.
 */
#include "catalog.h"

#include "../proto/catalog.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../proto/alloc.h"
#include "segment.h"

/* What the daemon wrote into one entry, kept privately: the table itself is
 * never read back. */
struct catalog_slot {
    uint64_t hash; /* the key's whole hash (the entry keeps its high half) */
    uint64_t chunk;
    uint64_t size;
    uint32_t gen, flags;
    uint32_t seq; /* the entry's sequence count as last written */
    void *owner;  /* catalog_add's owner: what a displacement hands back */
};

struct catalog {
    struct shmb_catalog_entry *table; /* in the segment */
    struct shmb_segment_header *hdr;
    struct shmb_published_counters *counters; /* in the header page */
    struct catalog_slot *mirror;
    uint64_t slots, mask;
    uint32_t seed;
    uint32_t moves, unlisted, gen_next, counters_seq;
    unsigned held; /* catalog_hold calls not yet released */
    size_t listed;
    uint64_t beats, shifts, displaced;
};

struct catalog *catalog_new(void *base, uint64_t offset, uint64_t slots, uint32_t seed,
                            struct shmb_segment_header *hdr, struct shmb_error *err)
{
    static const unsigned char zeros[4096];
    struct catalog *c;
    uint64_t bytes, done;

    if (slots != 0 && ((slots & (slots - 1)) != 0 || slots > (UINT64_C(1) << 40))) {
        shmb_error_set(err, -EINVAL, "Catalog of %llu slots: the slots must be a power of two.",
                       (unsigned long long)slots);
        return NULL;
    }
    if ((c = shmb_calloc(1, sizeof(*c))) == NULL ||
        (slots != 0 && (c->mirror = shmb_calloc((size_t)slots, sizeof(*c->mirror))) == NULL)) {
        shmb_free(c);
        shmb_error_set(err, -ENOMEM, "Out of memory for a catalog of %llu slots.",
                       (unsigned long long)slots);
        return NULL;
    }
    c->table = (struct shmb_catalog_entry *)((unsigned char *)base + offset);
    c->hdr = hdr;
    c->counters = (struct shmb_published_counters *)((unsigned char *)hdr + SHMB_COUNTERS_AT);
    c->slots = slots;
    c->mask = slots != 0 ? slots - 1 : 0;
    c->seed = seed;
    c->gen_next = 1;
    /* An adopted segment's table holds the last daemon's entries: empty it
     * (readers that raced the old entries fail their checks and ask), with
     * catalog_moves odd meanwhile and then past any value a reader may have
     * seen before (a reader that started its probe under the last daemon
     * must not take a miss in the emptied table for a proof). The header's
     * word is a client's to scribble: any value will do, as long as ours
     * differs from it. */
    if (segment_load(&c->moves, &hdr->catalog_moves, sizeof(c->moves)) < 0)
        c->moves = 0;
    c->moves += (c->moves & 1) != 0 ? 2 : 1;
    segment_atomic_store32(&hdr->catalog_moves, c->moves);
    bytes = slots * sizeof(struct shmb_catalog_entry);
    for (done = 0; done < bytes; done += sizeof(zeros))
        segment_store((unsigned char *)c->table + done, zeros,
                      bytes - done < sizeof(zeros) ? (size_t)(bytes - done) : sizeof(zeros));
    c->held = 1;
    catalog_release(c);
    segment_atomic_store32(&hdr->catalog_unlisted, 0);
    segment_atomic_store32(&hdr->gen_next, c->gen_next);
    /* Served again (an adopted file the last daemon gave up, or one whose
     * word a client scribbled): readers of this daemon's hello trust the
     * mapping. */
    segment_atomic_store32(&hdr->retired, 0);
    return c;
}

void catalog_retire(struct catalog *c)
{
    /* Release: everything this daemon wrote before is visible with it. */
    segment_atomic_store32(&c->hdr->retired, SHMB_SEGMENT_RETIRED);
}

void catalog_free(struct catalog *c)
{
    if (c == NULL)
        return;
    shmb_free(c->mirror);
    shmb_free(c);
}

/* Write entry i from its mirror under the entry's sequence count: odd while
 * the fields change, even again after (release order both times), so that a
 * reader that saw the same even count around its loads has one entry. */
static void catalog_write(struct catalog *c, uint64_t i)
{
    struct catalog_slot *m = &c->mirror[i];
    struct shmb_catalog_entry *e = &c->table[i];

    segment_atomic_store32(&e->seq, ++m->seq);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    segment_atomic_store32(&e->hash, (uint32_t)(m->hash >> 32));
    segment_atomic_store64(&e->chunk, m->chunk);
    segment_atomic_store32(&e->gen, m->gen);
    segment_atomic_store32(&e->flags, m->flags);
    segment_atomic_store64(&e->size, m->size);
    segment_atomic_store32(&e->seq, ++m->seq);
}

/* Publish the count of objects not listed. */
static void catalog_set_unlisted(struct catalog *c, uint32_t unlisted)
{
    c->unlisted = unlisted;
    segment_atomic_store32(&c->hdr->catalog_unlisted, unlisted);
}

/* Fill entry i (its mirror and the table) with key's listing. */
static void catalog_fill(struct catalog *c, uint64_t i, uint64_t h, uint64_t chunk,
                         uint32_t gen, uint64_t size, uint32_t flags, void *owner)
{
    c->mirror[i].hash = h;
    c->mirror[i].chunk = chunk;
    c->mirror[i].size = size;
    c->mirror[i].gen = gen;
    c->mirror[i].flags = flags;
    c->mirror[i].owner = owner;
    catalog_write(c, i);
}

int catalog_add(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                uint32_t gen, uint64_t size, uint32_t flags, void *owner,
                void **displaced)
{
    uint64_t h, p, probes, i, oldest = 0;
    uint32_t age, oldest_age = 0;

    if (displaced != NULL)
        *displaced = NULL;
    if (chunk == 0)
        return -EINVAL;
    if (c->slots != 0) {
        h = shmb_catalog_hash(c->seed, key, key_len);
        probes = c->slots < SHMB_CATALOG_PROBES ? c->slots : SHMB_CATALOG_PROBES;
        for (p = 0; p < probes; p++) {
            i = (h + p) & c->mask;
            if (c->mirror[i].chunk != 0) {
                /* Generations count up (wrapping) and gen was just handed
                 * out: the oldest listing is the furthest behind it. */
                age = gen - c->mirror[i].gen;
                if (p == 0 || age > oldest_age) {
                    oldest = i;
                    oldest_age = age;
                }
                continue;
            }
            catalog_fill(c, i, h, chunk, gen, size, flags, owner);
            c->listed++;
            return 0;
        }
        if (displaced != NULL) {
            /* The displaced object is counted unlisted BEFORE its entry
             * changes (the entry's write releases it): a reader that finds
             * the entry gone also finds that a miss proves nothing. The
             * entry stays taken, so no probe breaks and nothing moves. */
            *displaced = c->mirror[oldest].owner;
            catalog_set_unlisted(c, c->unlisted + 1);
            catalog_fill(c, oldest, h, chunk, gen, size, flags, owner);
            c->displaced++;
            return 0;
        }
    }
    /* While one committed object is not listed, a miss proves nothing. */
    catalog_set_unlisted(c, c->unlisted + 1);
    return -ENOSPC;
}

void catalog_hold(struct catalog *c)
{
    if (c->held++ == 0 && (c->moves & 1) == 0)
        segment_atomic_store32(&c->hdr->catalog_moves, ++c->moves);
}

void catalog_release(struct catalog *c)
{
    if (c->held > 0 && --c->held == 0 && (c->moves & 1) != 0)
        segment_atomic_store32(&c->hdr->catalog_moves, ++c->moves);
}

/* Move catalog_moves on by one: odd while entries move, even after (two
 * while held: it stays odd). */
static void catalog_step_moves(struct catalog *c)
{
    if (c->held > 0) {
        c->moves += 2;
        segment_atomic_store32(&c->hdr->catalog_moves, c->moves);
        return;
    }
    segment_atomic_store32(&c->hdr->catalog_moves, ++c->moves);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

void catalog_remove(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                    bool listed)
{
    uint64_t h, p, probes, i = 0, hole, k, home;
    bool found = false;
    uint32_t seq;

    if (!listed) {
        if (c->unlisted > 0)
            catalog_set_unlisted(c, c->unlisted - 1);
        return;
    }
    if (c->slots == 0)
        return;
    h = shmb_catalog_hash(c->seed, key, key_len);
    probes = c->slots < SHMB_CATALOG_PROBES ? c->slots : SHMB_CATALOG_PROBES;
    for (p = 0; p < probes && !found; p++) {
        i = (h + p) & c->mask;
        found = c->mirror[i].chunk == chunk && c->mirror[i].hash == h;
    }
    if (!found)
        return;
    /* Backward shift: every entry after the hole that may sit there (its
     * home is not after the hole) moves back into it, so that probes stay
     * unbroken without tombstones. A reader that misses while this runs
     * sees catalog_moves odd or changed and asks the daemon. The walk ends
     * at an empty entry or, in a table with none (a full catalog, whose new
     * objects displace old ones), when it comes round to the hole: not at
     * the removed entry's place, which a move may have filled, with entries
     * between it and the hole still to move back. */
    catalog_step_moves(c);
    hole = i;
    for (k = (i + 1) & c->mask; k != hole && c->mirror[k].chunk != 0;
         k = (k + 1) & c->mask) {
        home = c->mirror[k].hash & c->mask;
        if (((k - home) & c->mask) < ((k - hole) & c->mask))
            continue;
        seq = c->mirror[hole].seq;
        c->mirror[hole] = c->mirror[k];
        c->mirror[hole].seq = seq;
        catalog_write(c, hole);
        c->shifts++;
        hole = k;
    }
    seq = c->mirror[hole].seq;
    memset(&c->mirror[hole], 0, sizeof(c->mirror[hole]));
    c->mirror[hole].seq = seq;
    catalog_write(c, hole);
    catalog_step_moves(c);
    c->listed--;
}

void catalog_set_flags(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                       uint32_t flags)
{
    uint64_t h, p, probes, i;

    if (c->slots == 0)
        return;
    h = shmb_catalog_hash(c->seed, key, key_len);
    probes = c->slots < SHMB_CATALOG_PROBES ? c->slots : SHMB_CATALOG_PROBES;
    for (p = 0; p < probes; p++) {
        i = (h + p) & c->mask;
        if (c->mirror[i].chunk == 0)
            return;
        if (c->mirror[i].chunk == chunk && c->mirror[i].hash == h) {
            if (c->mirror[i].flags != flags) {
                c->mirror[i].flags = flags;
                catalog_write(c, i);
            }
            return;
        }
    }
}

uint32_t catalog_next_gen(struct catalog *c)
{
    uint32_t gen = c->gen_next;

    if (++c->gen_next == 0)
        c->gen_next = 1;
    segment_atomic_store32(&c->hdr->gen_next, c->gen_next);
    return gen;
}

void catalog_gen_after(struct catalog *c, uint32_t floor)
{
    if (floor < c->gen_next)
        return;
    c->gen_next = floor + 1 != 0 ? floor + 1 : 1;
    segment_atomic_store32(&c->hdr->gen_next, c->gen_next);
}

void catalog_beat(struct catalog *c, const struct shmb_published_counters *counters,
                  uint64_t unix_ms)
{
    struct shmb_published_counters *out = c->counters;

    segment_atomic_store64(&c->hdr->heartbeat_unix_ms, unix_ms);
    segment_atomic_store64(&c->hdr->heartbeat_count, ++c->beats);
    segment_atomic_store32(&c->hdr->heartbeat_period_ms, SEGMENT_HEARTBEAT_MS);
    segment_atomic_store32(&out->seq, ++c->counters_seq);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    segment_atomic_store32(&out->clients, counters->clients);
    segment_atomic_store64(&out->data_size, counters->data_size);
    segment_atomic_store64(&out->used, counters->used);
    segment_atomic_store64(&out->free, counters->free);
    segment_atomic_store64(&out->objects, counters->objects);
    segment_atomic_store64(&out->pending, counters->pending);
    segment_atomic_store64(&out->pinned, counters->pinned);
    segment_atomic_store64(&out->arenas, counters->arenas);
    segment_atomic_store64(&out->arena_bytes, counters->arena_bytes);
    segment_atomic_store64(&out->allocs, counters->allocs);
    segment_atomic_store64(&out->commits, counters->commits);
    segment_atomic_store64(&out->gets, counters->gets);
    segment_atomic_store64(&out->evictions, counters->evictions);
    segment_atomic_store64(&out->enospc, counters->enospc);
    segment_atomic_store64(&out->expired_allocs, counters->expired_allocs);
    segment_atomic_store64(&out->lease_expiries, counters->lease_expiries);
    segment_atomic_store64(&out->fast_reads, counters->fast_reads);
    segment_atomic_store64((uint64_t *)&out->pid, (uint64_t)counters->pid);
    segment_atomic_store32(&out->seq, ++c->counters_seq);
}

size_t catalog_listed(const struct catalog *c)
{
    return c->listed;
}

uint32_t catalog_unlisted(const struct catalog *c)
{
    return c->unlisted;
}

uint64_t catalog_shifts(const struct catalog *c)
{
    return c->shifts;
}

uint64_t catalog_displaced(const struct catalog *c)
{
    return c->displaced;
}
