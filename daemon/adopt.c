// SPDX-License-Identifier: Apache-2.0
/*
 * The store's adoption: a restarted daemon walks the ring it finds in the
 * segment and brings back its committed objects (and the arenas nobody
 * holds any more), each chunk copied and checked before it is believed.
 * Entered by store_adopt (store.h) only.
 */
#include "store_inner.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>

#include "../proto/text.h"
#include "arenas.h"
#include "keys.h"
#include "reads.h"
#include "reclaim.h"
#include "ring.h"
#include "segment.h"
#include "store.h"

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

/* The bytes of the arena at payload_offset (size bytes, its tag counting
 * walk of them) to walk: what its tag says the daemon committed, or up to
 * the end of the chunks its client published, when that lies further
 * inside it (published and not folded yet when the daemon died). The end
 * is closed in the same step as it is read (SHMB_ARENA_PUBLISH_CLOSED), as
 * when a daemon gives an arena back: its client, in the middle of a
 * publish when the daemon died, fails its swap and lays the chunk out
 * again, instead of counting on a chunk nobody folds. */
static uint64_t store_adopt_extent(struct store *s, uint64_t payload_offset, uint64_t size,
                                   uint64_t walk)
{
    uint64_t *word = (uint64_t *)(s->ring.data + (payload_offset - SHMB_CHUNK_HEADER_SIZE(0) -
                                                  s->ring.data_offset) +
                                  SHMB_ARENA_PUBLISHED_AT);
    uint64_t end = 0;

    if (segment_atomic_exchange64(word, SHMB_ARENA_PUBLISH_CLOSED, &end) == 0 &&
        end > payload_offset + walk &&
        end <= payload_offset + size)
        return end - payload_offset;
    return walk;
}

/* store_adopt_chunk for an arena: walk its payload for the bytes its tag
 * says were committed (or its client published), each chunk copied and
 * checked (ring_read_inner, its id the arena's), and bring back the
 * committed and published ones as objects of an arena nobody holds; stop at
 * the first bad one and drop the rest. An arena left without objects is
 * freed. */
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
        /* Nothing walked; the published end closed all the same. */
        walk = store_adopt_extent(s, payload_offset, 0, 0);
    } else {
        walk = store_adopt_extent(s, payload_offset, hdr->payload_size, walk);
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
        if (rc == 0 && h.state == SHMB_CHUNK_WRITTEN && SHMB_SEAL_GEN(h.seal) == 0)
            rc = shmb_error_set(&e, -EBADMSG,
                                "Corrupt arena: the chunk published at offset %llu has "
                                "generation 0.",
                                (unsigned long long)pos);
        if (rc == 0 && h.state != SHMB_CHUNK_COMMITTED && h.state != SHMB_CHUNK_FREE &&
            h.state != SHMB_CHUNK_WRITTEN)
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
            if (h.state == SHMB_CHUNK_WRITTEN) /* folded here, its header says so */
                store_save_state(s, obj, SHMB_CHUNK_COMMITTED);
            report->restored++;
            report->restored_bytes += h.payload_size;
        }
        pos += h.chunk_size;
    }
    box->rec->cursor = pos;
    if (rc < 0) {
        report->corrupt = true;
        report->arena_dropped_bytes += end - pos;
        if (report->message[0] == '\0')
            snprintf(report->message, sizeof(report->message),
                     "%.900s Dropped the rest of that arena (%llu bytes).", e.message,
                     (unsigned long long)(end - pos));
    }
    if (rc < 0 || pos != payload_offset + (uint64_t)hdr->tag * SHMB_ALIGN) {
        uint32_t tag = (uint32_t)((pos - payload_offset) / SHMB_ALIGN);

        /* What is left (or was published since) is what the next adoption
         * walks. */
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
