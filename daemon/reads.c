// SPDX-License-Identifier: Apache-2.0
/*
 * The store's awaited reads and their accounting in the segment: generations,
 * the seal each committed object is published under and its catalog entry
 * (publish, unlist, unpublish), the reads counted in place folded in, the
 * awaited flag, the chunk header's tag and state, the read lease. Knows
 * nothing of pins, eviction or holders; writes into the segment only
 * through the ring and the segment's guarded stores.
 */
#include "reads.h"

#include <errno.h>
#include <string.h>

#include "catalog.h"
#include "ring.h"
#include "segment.h"

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
void store_gen_after(struct store *s, uint32_t floor)
{
    if (s->cfg.catalog != NULL)
        catalog_gen_after(s->cfg.catalog, floor);
    else if (floor >= s->gen_next)
        s->gen_next = floor + 1 != 0 ? floor + 1 : 1;
}

/* count reads counted in place, taken into obj: that many fewer awaited
 * reads (never below 0), counted as fast reads, and the chunk's tag says
 * the awaited reads left, for a restart. Returns how many were taken. */
static uint32_t store_take_counted(struct store *s, struct object *obj, uint32_t count)
{
    uint32_t take = count < obj->awaited_reads ? count : obj->awaited_reads;

    obj->awaited_reads -= take;
    s->fast_reads += take;
    store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, tag), &obj->awaited_reads,
                      sizeof(obj->awaited_reads));
    return take;
}

/* Take the reads counted in place in obj's seal: compare-and-swap
 * {gen, c} -> {gen, 0}, and c fewer awaited reads (never below 0: a count
 * can only lower them, as gets by others could); the chunk's tag then says
 * the awaited reads left, for a restart. Does not call the ring (it runs
 * inside the ring's reclaim): the tag is written straight into the header. */
void store_fold(struct store *s, struct object *obj)
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
        take = store_take_counted(s, obj, SHMB_SEAL_COUNT(seal));
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
 * all come here; so does a chunk its client published, folded with its
 * generation already set (obj->gen): its seal, and the reads counted in it
 * by those who read the chunk before the fold, stay as they are. */
void store_publish(struct store *s, struct object *obj)
{
    uint32_t flags = obj->awaited_reads > 0 ? SHMB_CATALOG_AWAITED : 0;
    void *displaced = NULL;

    if (obj->gen == 0) {
        obj->gen = store_next_gen(s);
        segment_atomic_store64(store_seal(s, obj), SHMB_SEAL(obj->gen, 0));
    }
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

    if (!obj->published)
        return;
    if (s->cfg.catalog != NULL)
        catalog_remove(s->cfg.catalog, obj->key, obj->key_len, obj->chunk_offset, obj->listed);
    if (segment_atomic_exchange64(store_seal(s, obj), 0, &old) == 0 && fold &&
        SHMB_SEAL_GEN(old) == obj->gen)
        store_take_counted(s, obj, SHMB_SEAL_COUNT(old));
    obj->published = obj->listed = obj->was_listed = false;
    obj->gen = 0;
}

/* obj stops being readable in place, before its bytes may be reused
 * (delete, eviction, lease eviction); the reads counted in place are its. */
void store_unpublish(struct store *s, struct object *obj)
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
void store_mark_awaited(struct store *s, struct object *obj)
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
void store_unmark_awaited(struct store *s, struct object *obj)
{
    if (!obj->published || !obj->listed_awaited || obj->awaited_reads != 0)
        return;
    if (obj->listed)
        catalog_set_flags(s->cfg.catalog, obj->key, obj->key_len, obj->chunk_offset, 0);
    obj->listed_awaited = false;
}

/* Write one field of obj's chunk header: its own chunk's in the ring, or
 * its chunk inside an arena (the ring knows only the arena's). */
void store_chunk_field(struct store *s, const struct object *obj, size_t field,
                       const void *value, size_t len)
{
    segment_store(s->ring.data + (obj->chunk_offset - s->ring.data_offset) + field, value,
                  len);
}

/* Record obj's awaited reads in its chunk header, for a later adoption. */
void store_save_reads(struct store *s, const struct object *obj)
{
    if (obj->arena == NULL) {
        ring_set_tag(&s->ring, obj->ring_id, obj->awaited_reads);
        return;
    }
    store_chunk_field(s, obj, offsetof(struct shmb_chunk_header, tag), &obj->awaited_reads,
                      sizeof(obj->awaited_reads));
}

/* Record obj's state in its chunk header. */
void store_save_state(struct store *s, const struct object *obj,
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
bool store_awaited(const struct store *s, struct object *obj, uint64_t now)
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
