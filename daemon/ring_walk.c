// SPDX-License-Identifier: Apache-2.0
/*
 * The ring's chunks as the file holds them: each header copied once and
 * checked, the walk over them (ring_walk, the reads inside an arena) and
 * the adoption of a segment a daemon left, with its resynchronisation past
 * damage. The live ring's positions and slots are ring.c's; this room reads
 * the file and appends adopted slots through ring_inner.h.
 */
#include "ring.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ring_inner.h"
#include "segment.h"

/* Copy the chunk header at phys and its key into h and key (NUL-terminated),
 * and check the copy; 0 or -EBADMSG with the reason in err. The segment is
 * shared with read-write clients, which may change any byte of it at any
 * time: every field is read from the segment exactly once, here, and the
 * callers use only the copy. */
static int ring_read_header(const struct ring *r, uint64_t phys, uint64_t min_id,
                            struct shmb_chunk_header *h, char key[SHMB_KEY_MAX + 1],
                            struct shmb_error *err)
{
    if (phys % SHMB_ALIGN != 0 || phys > r->size - RING_FIXED_HEADER)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring: chunk header at data offset %llu is out of "
                              "bounds (ring of %llu bytes).",
                              (unsigned long long)phys, (unsigned long long)r->size);
    key[0] = '\0';
    /* Through the guard: a client may shrink the file under the walk. */
    if (segment_load(h, ring_header_at(r, phys), RING_FIXED_HEADER) < 0)
        return shmb_error_set(err, -EIO,
                              "Segment truncated under the walk: the chunk header at "
                              "data offset %llu could not be read (SIGBUS).",
                              (unsigned long long)phys);
    if (h->magic != SHMB_CHUNK_MAGIC)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring: bad chunk magic 0x%08x at data offset %llu.",
                              h->magic, (unsigned long long)phys);
    if (h->chunk_size == 0 || h->chunk_size % SHMB_ALIGN != 0 ||
        h->chunk_size > r->size - phys)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring: chunk at data offset %llu claims %llu bytes "
                              "(%llu left before the end, multiple of %u required).",
                              (unsigned long long)phys, (unsigned long long)h->chunk_size,
                              (unsigned long long)(r->size - phys), SHMB_ALIGN);
    if (h->state == SHMB_CHUNK_GAP)
        return phys + h->chunk_size == r->size
                   ? 0
                   : shmb_error_set(
                         err, -EBADMSG,
                         "Corrupt ring: gap at data offset %llu does not run to "
                         "the end of the ring.",
                         (unsigned long long)phys);
    if (h->state < SHMB_CHUNK_PENDING || h->state > SHMB_CHUNK_WRITTEN ||
        (h->state == SHMB_CHUNK_ARENA && h->key_len != 0) || h->key_len > SHMB_KEY_MAX || h->header_size != ring_header_size(h->key_len) ||
        h->chunk_size != ring_chunk_size(h->key_len, h->payload_size) ||
        h->payload_size == 0 || h->id < min_id)
        return shmb_error_set(
            err, -EBADMSG,
            "Corrupt ring: inconsistent chunk header at data offset "
            "%llu (state %u, key %u bytes, payload %llu bytes, id %llu).",
            (unsigned long long)phys, h->state, h->key_len,
            (unsigned long long)h->payload_size, (unsigned long long)h->id);
    /* The key lies inside the chunk: header_size <= chunk_size <= size - phys. */
    if (segment_load(key, (const char *)ring_header_at(r, phys) + RING_FIXED_HEADER,
                     h->key_len) < 0)
        return shmb_error_set(err, -EIO,
                              "Segment truncated under the walk: the key of the chunk at "
                              "data offset %llu could not be read (SIGBUS).",
                              (unsigned long long)phys);
    key[h->key_len] = '\0';
    return 0;
}

int ring_read_inner(const struct ring *r, uint64_t phys, uint64_t limit,
                    struct shmb_chunk_header *h, char key[SHMB_KEY_MAX + 1],
                    struct shmb_error *err)
{
    int rc;

    if (limit > r->size || phys >= limit)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt arena: chunk at data offset %llu lies outside the "
                              "arena (which ends at %llu).",
                              (unsigned long long)phys, (unsigned long long)limit);
    if ((rc = ring_read_header(r, phys, 0, h, key, err)) < 0)
        return rc;
    if (h->chunk_size > limit - phys)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt arena: chunk at data offset %llu claims %llu bytes, "
                              "%llu are left in its arena.",
                              (unsigned long long)phys, (unsigned long long)h->chunk_size,
                              (unsigned long long)(limit - phys));
    return 0;
}

/* The smallest chunk: a header without key and one aligned byte of payload.
 * A damaged span of n bytes cannot have held more than n / this chunks. */
#define RING_MIN_CHUNK (2 * (uint64_t)SHMB_ALIGN)
_Static_assert(sizeof(struct shmb_chunk_header) <= SHMB_ALIGN,
               "a chunk header without key takes one SHMB_ALIGN step");

/* Where a walk of the chunk headers is, and what it expects next. */
struct ring_walk_state {
    uint64_t pos, end;  /* the next header's position; the walk stops at end */
    uint64_t expect_id; /* ids seen so far end below this */
    uint64_t next_id;   /* adoption: ids are below the cursor's next id */
    bool seen;          /* a chunk (not a gap) was seen */
    bool consecutive;   /* adoption: each id is exactly expect_id (the first
                           one anything below next_id); else they increase */
};

/* Called by ring_walk_chunks for each sound chunk that is not a gap, with
 * the private copies of its header and key, before the walk steps over it;
 * non-zero stops the walk and is returned (err may say why). */
typedef int (*ring_visit_fn)(const struct shmb_chunk_header *h, const char *key,
                             const struct ring_walk_state *w, void *arg,
                             struct shmb_error *err);

/* Called by ring_walk_chunks on a header at w->pos that is damaged (rc
 * -EBADMSG) or that could not be read (-EIO), err saying which: 0 after
 * moving w->pos (and what it expects) on, to go on from there, or the
 * negative code that stops the walk. */
typedef int (*ring_damage_fn)(struct ring_walk_state *w, int rc, void *arg,
                              struct shmb_error *err);

/* Read and check the chunk header at w->pos: the checks of
 * ring_read_header, inside [pos, end), with an id in the sequence w expects.
 * 0, -EBADMSG (a damaged header) or -EIO (the file was shrunk under the
 * walk). */
static int ring_walk_read(const struct ring *r, const struct ring_walk_state *w,
                          struct shmb_chunk_header *h, char key[SHMB_KEY_MAX + 1],
                          struct shmb_error *err)
{
    uint64_t phys = w->pos % r->size;
    int rc;

    if ((rc = ring_read_header(r, phys, w->seen ? w->expect_id : 0, h, key, err)) < 0)
        return rc;
    if (h->state == SHMB_CHUNK_WRITTEN) /* only ever inside an arena */
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring: a chunk published in an arena (state %u) lies at "
                              "data offset %llu, outside any arena.",
                              h->state, (unsigned long long)phys);
    if (h->chunk_size > w->end - w->pos)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring: chunk at data offset %llu runs past the end "
                              "position.",
                              (unsigned long long)phys);
    if (w->consecutive && h->state != SHMB_CHUNK_GAP &&
        ((w->seen && h->id != w->expect_id) || h->id >= w->next_id))
        return shmb_error_set(
            err, -EBADMSG,
            "Corrupt ring: chunk at data offset %llu has id %llu, "
            "expected %llu.",
            (unsigned long long)phys, (unsigned long long)h->id,
            (unsigned long long)(w->seen ? w->expect_id : w->next_id - 1));
    return 0;
}

/* The one walk over the chunk headers, for ring_walk and ring_adopt: from
 * w->pos to w->end, each header copied and checked once (ring_walk_read),
 * visit called for every chunk, tail gaps stepped over, and damage (when
 * damaged is not NULL) given the chance to resume further on. Returns 0, or
 * what stopped it. */
static int ring_walk_chunks(const struct ring *r, struct ring_walk_state *w,
                            ring_visit_fn visit, ring_damage_fn damaged, void *arg,
                            struct shmb_error *err)
{
    int rc;

    while (w->pos < w->end) {
        struct shmb_chunk_header h; /* private copies: see ring_read_header */
        char key[SHMB_KEY_MAX + 1];

        if ((rc = ring_walk_read(r, w, &h, key, err)) < 0) {
            if (damaged == NULL || (rc = damaged(w, rc, arg, err)) < 0)
                return rc;
            continue;
        }
        if (h.state != SHMB_CHUNK_GAP) {
            if ((rc = visit(&h, key, w, arg, err)) != 0)
                return rc;
            w->seen = true;
            w->expect_id = h.id + 1;
        }
        w->pos += h.chunk_size;
    }
    return 0;
}

/* What ring_walk's visits need. */
struct ring_walk_call {
    const struct ring *r;
    ring_walk_fn fn;
    void *arg;
};

/* ring_walk's visit: tell the caller. */
static int ring_walk_visit(const struct shmb_chunk_header *h, const char *key,
                           const struct ring_walk_state *w, void *arg,
                           struct shmb_error *err)
{
    struct ring_walk_call *c = arg;

    (void)err;
    if (c->fn == NULL)
        return 0;
    return c->fn(h, key, c->r->data_offset + w->pos % c->r->size + h->header_size,
                 c->arg);
}

int ring_walk(const struct ring *r, ring_walk_fn fn, void *arg, struct shmb_error *err)
{
    struct ring_walk_state w = {.pos = r->start, .end = r->end};
    struct ring_walk_call c = {.r = r, .fn = fn, .arg = arg};

    return ring_walk_chunks(r, &w, ring_walk_visit, NULL, &c, err);
}

/* Append an adopted slot. */
static int ring_adopt_slot(struct ring *r, uint64_t phys, uint64_t size, void *owner,
                           uint32_t header_size, uint64_t payload_size, bool committed)
{
    struct ring_slot *slot;

    if (r->count == r->cap && ring_grow(r) < 0)
        return -ENOMEM;
    slot = ring_slot(r, r->count);
    slot->phys = phys;
    slot->size = size;
    slot->owner = owner;
    slot->freed = owner == NULL;
    slot->committed = committed;
    slot->held = false;
    slot->header_size = header_size;
    slot->payload_size = payload_size;
    r->count++;
    return 0;
}

/* How the skipped bytes [bad, found) are rewritten for lost ids (freed
 * chunks, so that ids stay consecutive and the next walk is clean): in the
 * lap of bad, *n_a chunks (or a tail gap when 0); in the next lap, when the
 * span runs into it, *n_b chunks. Every chunk holds RING_MIN_CHUNK bytes or
 * more, and never straddles the end of the data area. false when lost ids
 * cannot be laid out so (then the candidate at found is not believed). */
static bool ring_span_layout(const struct ring *r, uint64_t bad, uint64_t found, uint64_t lost,
                             uint64_t *n_a, uint64_t *n_b)
{
    uint64_t phys = bad % r->size, len_a, len_b;

    if (phys + (found - bad) <= r->size && found % r->size != 0) {
        /* One piece inside the lap: one chunk per lost id at least. */
        *n_a = lost;
        *n_b = 0;
        return lost >= 1 && lost <= (found - bad) / RING_MIN_CHUNK;
    }
    len_a = r->size - phys;
    len_b = found - bad - len_a; /* the part in the next lap, from 0 */
    *n_b = len_b == 0 ? 0 : lost < len_b / RING_MIN_CHUNK ? lost : len_b / RING_MIN_CHUNK;
    *n_a = lost - *n_b;
    return (len_b == 0 || *n_b >= 1) && *n_a <= len_a / RING_MIN_CHUNK;
}

/* Write n freed chunks over len bytes at phys, ids from id on (all but the
 * last RING_MIN_CHUNK bytes, the last the rest), or a tail gap when n is 0,
 * and give each chunk a freed slot. -ENOMEM. */
static int ring_span_write(struct ring *r, uint64_t phys, uint64_t len, uint64_t n,
                           uint64_t id)
{
    struct shmb_chunk_header hdr;
    uint64_t i;

    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = SHMB_CHUNK_MAGIC;
    if (n == 0) {
        hdr.state = SHMB_CHUNK_GAP;
        hdr.header_size = RING_FIXED_HEADER;
        hdr.chunk_size = len;
        segment_store(ring_header_at(r, phys), &hdr, RING_FIXED_HEADER);
        return 0;
    }
    for (i = 0; i < n; i++) {
        uint64_t size = i + 1 < n ? RING_MIN_CHUNK : len - RING_MIN_CHUNK * (n - 1);

        hdr.state = SHMB_CHUNK_FREE;
        hdr.header_size = (uint32_t)ring_header_size(0);
        hdr.id = id + i;
        hdr.chunk_size = size;
        hdr.payload_size = size - ring_header_size(0);
        segment_store(ring_header_at(r, phys), &hdr, RING_FIXED_HEADER);
        /* A lost id may have been a committed object's: never handed out again. */
        if (ring_adopt_slot(r, phys, size, NULL, hdr.header_size, hdr.payload_size,
                            true) < 0)
            return -ENOMEM;
        phys += size;
    }
    return 0;
}

/* After a damaged header at w->pos: the position of the next sound chunk
 * (not a gap) before w->end, found in SHMB_ALIGN steps, whose id follows the
 * last adopted one (w->expect_id; ids skipped only as many as the skipped
 * bytes could have held). A candidate with no lost id must start a lap (the
 * damaged header was the tail gap's). UINT64_MAX when there is none, or
 * when the file was shrunk under the scan (-EIO in *rc). */
static uint64_t ring_adopt_resync(const struct ring *r, const struct ring_walk_state *w,
                                  uint64_t *id, int *rc)
{
    struct ring_walk_state probe = {
        .end = w->end, .next_id = w->next_id, .consecutive = true};
    uint64_t bad = w->pos, n_a, n_b;

    *rc = 0;
    for (probe.pos = bad + SHMB_ALIGN; probe.pos < w->end; probe.pos += SHMB_ALIGN) {
        struct shmb_chunk_header h;
        char key[SHMB_KEY_MAX + 1];
        int got = ring_walk_read(r, &probe, &h, key, NULL);

        if (got == -EIO) {
            *rc = -EIO;
            return UINT64_MAX;
        }
        if (got < 0 || h.state == SHMB_CHUNK_GAP)
            continue;
        if (w->seen &&
            (h.id < w->expect_id ||
             h.id - w->expect_id > (probe.pos - bad) / RING_MIN_CHUNK ||
             !ring_span_layout(r, bad, probe.pos, h.id - w->expect_id, &n_a, &n_b)))
            continue;
        *id = h.id;
        return probe.pos;
    }
    return UINT64_MAX;
}

/* Where ring_adopt is, for its visits and its damage handler. */
struct ring_adoption {
    struct ring *r;
    ring_adopt_fn fn;
    void *arg;
    uint64_t last_end;               /* the end of the last chunk adopted */
    uint64_t skipped, spans;         /* damaged bytes stepped over, and where */
    char damage[SHMB_ERROR_MSG_MAX]; /* the first damage found, or "" */
};

/* ring_adopt's visit: offer the chunk to the caller and give it a slot, freed
 * when the caller does not keep it. -ENOMEM. */
static int ring_adopt_visit(const struct shmb_chunk_header *h, const char *key,
                            const struct ring_walk_state *w, void *arg,
                            struct shmb_error *err)
{
    struct ring_adoption *a = arg;
    struct ring *r = a->r;
    uint64_t phys = w->pos % r->size;
    void *owner;

    if (r->count == r->cap && ring_grow(r) < 0)
        return shmb_error_set(err, -ENOMEM, "Out of memory adopting the ring.");
    if (!w->seen)
        r->first_id = h->id;
    owner = a->fn(h, key, r->data_offset + phys + h->header_size, a->arg);
    /* A committed chunk's id was seen before the restart, and a freed one's
     * may have been (a deleted object's header says free). */
    (void)ring_adopt_slot(r, phys, h->chunk_size, owner, h->header_size, h->payload_size,
                          h->state == SHMB_CHUNK_COMMITTED ||
                              h->state == SHMB_CHUNK_FREE); /* room made above */
    /* A pending allocation is dropped, but the client that got it from the
     * daemon that died may be stopped mid-copy and write on when it runs
     * again: its bytes are not handed out before reclaim reaches it at the
     * head, as for an arena found BUSY. At the newest end they would go to
     * the next allocation at once, and the late copy would land in an
     * object committed there since. */
    ring_slot(r, r->count - 1)->held = owner == NULL && h->state == SHMB_CHUNK_PENDING;
    if (owner == NULL) {
        ring_store_field(r, phys, offsetof(struct shmb_chunk_header, state),
                         &(uint16_t){SHMB_CHUNK_FREE}, sizeof(uint16_t));
        /* Its bytes will be reused: a reader that copied it under a
         * generation from before the restart must not find that generation
         * again (the store seals only what it keeps). */
        (void)segment_atomic_store64((uint64_t *)(r->data + phys +
                                                  offsetof(struct shmb_chunk_header, seal)),
                                     0);
    }
    a->last_end = w->pos + h->chunk_size;
    return 0;
}

/* ring_adopt's damage handler. Resynchronise: a damaged header (a writer's
 * overrun into the next chunk, say) loses that chunk only. The skipped bytes
 * become freed chunks, reclaimed in their turn. A header that could not be
 * read at all (-EIO) ends the walk. */
static int ring_adopt_damaged(struct ring_walk_state *w, int rc, void *arg,
                              struct shmb_error *err)
{
    struct ring_adoption *a = arg;
    struct ring *r = a->r;
    uint64_t phys = w->pos % r->size, found, found_id = 0;

    if (rc != -EBADMSG)
        return rc;
    if (a->damage[0] == '\0')
        snprintf(a->damage, sizeof(a->damage), "%s", err != NULL ? err->message : "");
    found = ring_adopt_resync(r, w, &found_id, &rc);
    if (found == UINT64_MAX) {
        if (rc == 0)
            return -EBADMSG;
        return shmb_error_set(err, rc,
                              "Segment truncated under the walk: a chunk header after "
                              "data offset %llu could not be read (SIGBUS).",
                              (unsigned long long)phys);
    }
    a->spans++;
    a->skipped += found - w->pos;
    if (!w->seen) {
        r->start = found; /* nothing adopted yet: the span is free */
    } else {
        /* The skipped bytes become freed chunks, one per lost id, written
         * into the segment so that the next walk is clean (their headers
         * were damaged anyway). */
        uint64_t n_a, n_b, len_a;

        (void)ring_span_layout(r, w->pos, found, found_id - w->expect_id, &n_a, &n_b);
        len_a = n_b == 0 && phys + (found - w->pos) <= r->size && found % r->size != 0
                    ? found - w->pos
                    : r->size - phys;
        if (ring_span_write(r, phys, len_a, n_a, w->expect_id) < 0 ||
            (found - w->pos > len_a &&
             ring_span_write(r, 0, found - w->pos - len_a, n_b, w->expect_id + n_a) < 0))
            return shmb_error_set(err, -ENOMEM, "Out of memory adopting the ring.");
        w->expect_id = found_id;
        if (n_a + n_b > 0)
            a->last_end = found;
    }
    w->pos = found;
    return 0;
}

int ring_adopt(struct ring *r, uint64_t start, uint64_t end, uint64_t next_id,
               ring_adopt_fn fn, void *arg, struct shmb_error *err)
{
    struct ring_walk_state w = {
        .pos = start, .end = end, .next_id = next_id, .consecutive = true};
    struct ring_adoption a = {.r = r, .fn = fn, .arg = arg, .last_end = start};
    int rc;

    if (start > end || end - start > r->size || start >= r->size ||
        (start == end && start != 0) || next_id > RING_ID_MAX)
        return shmb_error_set(err, -EBADMSG,
                              "Corrupt ring cursor (start %llu, end %llu, next id %llu, "
                              "ring of %llu bytes): nothing adopted.",
                              (unsigned long long)start, (unsigned long long)end,
                              (unsigned long long)next_id, (unsigned long long)r->size);
    r->start = r->end = start;
    rc = ring_walk_chunks(r, &w, ring_adopt_visit, ring_adopt_damaged, &a, err);
    /* The end is the end of the last chunk adopted, never past a tail gap
     * after it: when the walk stops at the first chunk of a new lap, the gap
     * before that chunk is not part of the ring, and ring_pop_tail_freed
     * relies on the newest chunk ending exactly at the end. */
    r->end = a.last_end;
    if (r->start >= r->size) {
        r->start -= r->size;
        r->end -= r->size;
    }
    if (r->count == 0)
        r->start = r->end = 0;
    r->next_id = next_id;
    if (r->count > 0 && next_id != r->first_id + r->count) {
        /* Chunks after the last sound one were dropped: ids go on from it. */
        r->next_id = r->first_id + r->count;
    }
    ring_pop_freed(r);
    ring_pop_tail_freed(r);
    if (rc < 0 || a.spans > 0) {
        char first_msg[SHMB_ERROR_MSG_MAX], dropped[64] = "";

        snprintf(first_msg, sizeof(first_msg), "%s",
                 a.damage[0] != '\0' ? a.damage
                 : err != NULL       ? err->message
                                     : "");
        if (rc < 0 && rc != -ENOMEM)
            snprintf(dropped, sizeof(dropped), " Dropped the %llu bytes after it.",
                     (unsigned long long)(end - w.pos));
        if (a.spans > 0)
            shmb_error_set(err, rc == -ENOMEM ? rc : -EBADMSG,
                           "%s Skipped %llu damaged bytes in %llu place(s) and adopted "
                           "the chunks after them.%s",
                           first_msg, (unsigned long long)a.skipped,
                           (unsigned long long)a.spans, dropped);
        else
            shmb_error_set(err, rc == -ENOMEM ? rc : -EBADMSG, "%s%s", first_msg, dropped);
        return rc == -ENOMEM ? rc : -EBADMSG;
    }
    return 0;
}
