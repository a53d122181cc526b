// SPDX-License-Identifier: Apache-2.0
/*
 * The store's side of arenas (daemon/arena.c has the record and the lock):
 * an arena granted over the ring, and the objects a client commits into it
 * (commit_at). An arena is one ring chunk, owned by an object without key
 * (box) whose rec is the record; the objects committed into it hang off
 * rec->objects, oldest first.
 */
#include "arenas.h"
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "arena.h"
#include "clock.h"
#include "reclaim.h"
#include "ring.h"
#include "segment.h"

/* A new arena object, counted among the live ones (room in the watched
 * heap reserved); NULL when memory ran out. Not linked anywhere yet: on
 * failure it goes with store_forget. */
struct object *store_box_new(struct store *s)
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
void store_box_place(struct store *s, struct object *box, struct store_holder *h,
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

bool store_commits_due(const struct store *s)
{
    const struct object *oldest = ring_oldest(&s->ring, NULL);

    return oldest != NULL && oldest->rec != NULL && oldest->rec->holder != NULL &&
           arena_committing(oldest->rec);
}

int store_arena(struct store *s, struct store_holder *h, uint64_t client, uint64_t size,
                struct store_extent *out, uint64_t *token, struct shmb_error *err)
{
    struct ring_chunk chunk;
    struct object *box;
    uint64_t granted;
    int rc;

    if (h->arena != NULL) {
        store_fold_published(s, h, true);
        store_arena_give_back(s, h->arena, true);
    }
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
    TAILQ_INSERT_TAIL(&s->arena_holders, h, arena_link);
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

/* The chunk of key at a's cursor (size payload bytes, readers awaited)
 * becomes a committed object of box: its header written from private values
 * only (whatever the client left there is overwritten), the object made,
 * the cursor moved past it, then published. gen 0: a commit_at's chunk, a
 * new generation in its seal; else a chunk its client published under gen,
 * whose seal (with the reads counted in it meanwhile) is left as it is. */
static int store_arena_commit(struct store *s, struct object *box, const char *key,
                              size_t key_len, uint64_t size, uint32_t readers, uint32_t gen,
                              struct object **out, struct shmb_error *err)
{
    struct arena *a = box->rec;
    uint64_t chunk = SHMB_CHUNK_SIZE(key_len, size), offset = a->cursor;
    struct shmb_chunk_header hdr;
    struct ring_chunk found;
    struct object_spec spec;
    unsigned char *at;
    int rc;

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
    if (segment_store(at, &hdr, gen != 0 ? offsetof(struct shmb_chunk_header, seal)
                                          : sizeof(hdr)) < 0 ||
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
    if ((rc = store_object_new(s, &spec, out, err)) < 0) {
        /* A published chunk keeps its writer's generation in its seal:
         * readers of the mapping must not take it for an object. */
        if (gen != 0)
            (void)segment_atomic_store64(
                (uint64_t *)(void *)(at + offsetof(struct shmb_chunk_header, seal)), 0);
        return rc;
    }
    a->cursor += chunk;
    a->made++;
    s->arena_bytes -= chunk;
    a->last_use_ms = clock_now_ms();
    a->busy_since_ms = 0;
    /* The bytes committed, for an adoption to walk and no further. */
    ring_set_tag(&s->ring, a->ring_id, (uint32_t)((a->cursor - a->start) / SHMB_ALIGN));
    (*out)->gen = gen;
    store_commit_object(s, *out);
    return 0;
}

int store_commit_at(struct store *s, struct store_holder *h, const char *key, size_t key_len,
                    uint64_t offset, uint64_t size, uint32_t readers,
                    struct store_extent *out, struct shmb_error *err)
{
    struct object *box = h->arena, *obj;
    struct arena *a = box != NULL ? box->rec : NULL;
    uint64_t chunk;
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
    if ((rc = arena_check_commit(a, offset, chunk, err)) < 0 ||
        (rc = store_arena_commit(s, box, key, key_len, size, readers, 0, &obj, err)) < 0)
        return rc;
    out->offset = obj->offset;
    out->size = size;
    return 0;
}

/* A chunk h published that a fold refused (its key taken, a field out of
 * range, malformed): counted, and recorded for h's next reply (the first
 * one's key, code and message), as a refused noreply commit_at is. */
static void store_refuse_published(struct store *s, struct store_holder *h, const char *key,
                                   size_t key_len, const struct shmb_error *e)
{
    s->fold_refused++;
    if (h == NULL || h->refused.count++ > 0)
        return;
    h->refused.code = e->code;
    /* Only a key that passes the checks is told (a reply is UTF-8). */
    h->refused.key_len =
        key_len <= sizeof(h->refused.key) && shmb_key_check(key, key_len, NULL) == 0 ? key_len
                                                                                    : 0;
    memcpy(h->refused.key, key, h->refused.key_len);
    snprintf(h->refused.message, sizeof(h->refused.message), "%s", e->message);
}

/* Folds of a stop at a malformed chunk: no more, and the lock REVOKED, so
 * that the client's next put into the arena fails its swap and asks for a
 * new one (whose reply tells it of the refusal). The published end is
 * closed too: a client in the middle of a publish (its lock BUSY, which the
 * swap of the lock does not wait for) then fails its swap of the end and
 * lays the chunk out again, instead of counting on a chunk never folded. */
static void store_fold_stop(struct arena *a)
{
    uint64_t old = 0;

    a->fold_stopped = true;
    (void)segment_atomic_exchange64(a->seal, SHMB_ARENA_WORD(a->token, SHMB_ARENA_REVOKED),
                                    &old);
    (void)arena_published(a, true, &old);
}

/* Fold the chunk published at box's cursor (the published chunks end at
 * end): checked from a private copy of its header and key as commit_at's
 * fields are, then committed under its writer's generation; one refused
 * for its key, size or readers is stepped over as a free chunk. True to
 * go on with the next, false to stop (nothing published there: a
 * commit_at's chunk on its way; or folds stopped). */
static bool store_fold_one(struct store *s, struct object *box, uint64_t end)
{
    struct arena *a = box->rec;
    struct shmb_chunk_header h = {0};
    char key[SHMB_KEY_MAX + 1] = "";
    struct shmb_error e = {0};
    struct object *obj;
    int rc;

    rc = ring_read_inner(&s->ring, a->cursor - s->ring.data_offset, end - s->ring.data_offset,
                         &h, key, &e);
    /* Not published: a commit_at's chunk whose commit is on its way (its
     * header, the daemon's to write, holds whatever was there), when the
     * client counted one; the fold goes on once it is handled. Without one,
     * nothing will ever come to make it an object: malformed. */
    if ((rc < 0 || h.state != SHMB_CHUNK_WRITTEN) && arena_commits_sent(a))
        return false;
    if (rc == 0 && h.state != SHMB_CHUNK_WRITTEN)
        rc = shmb_error_set(&e, -EBADMSG,
                            "it is in state %u, not published (%u), and no commit_at is on "
                            "its way",
                            h.state, (unsigned)SHMB_CHUNK_WRITTEN);
    if (rc == 0 && (h.id != a->ring_id || SHMB_SEAL_GEN(h.seal) == 0))
        rc = shmb_error_set(&e, -EBADMSG,
                            "its id is %llu (the arena's %llu), its generation %u (not 0)",
                            (unsigned long long)h.id, (unsigned long long)a->ring_id,
                            SHMB_SEAL_GEN(h.seal));
    if (rc == 0 && a->made >= SHMB_ARENA_MAX_OBJECTS)
        rc = shmb_error_set(&e, -ESTALE, "the arena already holds %u objects, the most one may",
                            (unsigned)SHMB_ARENA_MAX_OBJECTS);
    if (rc < 0) {
        char why[SHMB_ERROR_MSG_MAX];

        snprintf(why, sizeof(why), "%s", e.message);
        shmb_error_set(&e, rc == -ESTALE ? -ESTALE : -EBADMSG,
                       "The chunk published at offset %llu of this connection's arena "
                       "(%llu..%llu) was not folded: %.600s. It and every chunk published "
                       "after it in that arena are dropped: put them again (in a new arena).",
                       (unsigned long long)a->cursor, (unsigned long long)a->start,
                       (unsigned long long)a->end, why);
        store_refuse_published(s, a->holder, key, h.key_len, &e);
        store_fold_stop(a);
        return false;
    }
    if ((rc = shmb_key_check(key, h.key_len, &e)) < 0 ||
        (rc = store_check_new(s, key, h.key_len, h.payload_size, h.tag, &e)) < 0) {
        store_refuse_published(s, a->holder, key, h.key_len, &e);
        store_arena_skip(s, a, a->cursor, h.chunk_size);
        return true;
    }
    if ((rc = store_arena_commit(s, box, key, h.key_len, h.payload_size, h.tag,
                                 SHMB_SEAL_GEN(h.seal), &obj, &e)) < 0) {
        store_refuse_published(s, a->holder, key, h.key_len, &e);
        store_fold_stop(a);
        return false;
    }
    s->folded++;
    return true;
}

void store_fold_published(struct store *s, struct store_holder *h, bool close)
{
    struct store_holder *next;
    uint64_t end = 0;

    if (h == NULL) {
        for (h = TAILQ_FIRST(&s->arena_holders); h != NULL; h = next) {
            next = TAILQ_NEXT(h, arena_link);
            store_fold_published(s, h, close);
        }
        return;
    }
    if (h->arena == NULL || arena_published(h->arena->rec, close, &end) < 0)
        return;
    while (h->arena->rec->cursor < end && store_fold_one(s, h->arena, end))
        ;
}

bool store_holder_refused(struct store_holder *h, struct store_refused *out)
{
    if (h == NULL || h->refused.count == 0)
        return false;
    *out = h->refused;
    h->refused.count = 0;
    return true;
}
