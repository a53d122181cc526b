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
#include <string.h>
#include <sys/queue.h>

#include "../proto/alloc.h"
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
