// SPDX-License-Identifier: Apache-2.0
/*
 * The ring allocator: monotonic start/end positions over the data area, a
 * FIFO of live chunks, and the chunk headers written into the segment.
 * Reading those headers back (a walk, an adoption) is ring_walk.c's.
 */
#include "ring.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "../proto/alloc.h"
#include "ring_inner.h"
#include "segment.h"

#define RING_SLOTS_START 64

/* Round n up to SHMB_ALIGN; 0 on overflow. */
static uint64_t ring_align(uint64_t n)
{
    if (n > UINT64_MAX - (SHMB_ALIGN - 1))
        return 0;
    return (n + SHMB_ALIGN - 1) & ~(uint64_t)(SHMB_ALIGN - 1);
}

/* Bytes of a chunk header carrying label_len bytes of key. */
uint64_t ring_header_size(size_t label_len)
{
    return ring_align(RING_FIXED_HEADER + label_len);
}

uint64_t ring_chunk_size(size_t label_len, uint64_t payload_size)
{
    uint64_t payload = ring_align(payload_size);

    if (payload == 0 && payload_size != 0)
        return 0;
    if (payload > UINT64_MAX - ring_header_size(label_len))
        return 0;
    return ring_header_size(label_len) + payload;
}

/* Mirror the positions into the segment header for a later walk. */
static void ring_sync_cursor(struct ring *r)
{
    if (r->cursor == NULL)
        return;
    /* Guarded writes (segment_store): a client may have truncated the file. */
    segment_store(&r->cursor->ring_start, &r->start, sizeof(r->start));
    segment_store(&r->cursor->ring_end, &r->end, sizeof(r->end));
    segment_store(&r->cursor->ring_next_id, &r->next_id, sizeof(r->next_id));
}

int ring_init(struct ring *r, void *data, uint64_t data_offset, uint64_t size,
              struct shmb_segment_header *cursor, struct shmb_error *err)
{
    memset(r, 0, sizeof(*r));
    if (size == 0 || size % SHMB_ALIGN != 0 || data_offset % SHMB_ALIGN != 0 ||
        ((uintptr_t)data % SHMB_ALIGN) != 0)
        return shmb_error_set(err, -EINVAL,
                              "Ring of %llu bytes at offset %llu: size and offset must "
                              "be non-zero multiples of %u.",
                              (unsigned long long)size, (unsigned long long)data_offset,
                              SHMB_ALIGN);
    r->slots = shmb_calloc(RING_SLOTS_START, sizeof(*r->slots));
    if (r->slots == NULL)
        return shmb_error_set(err, -ENOMEM, "Out of memory for the ring's chunk list.");
    r->cap = RING_SLOTS_START;
    r->data = data;
    r->data_offset = data_offset;
    r->size = size;
    r->cursor = cursor;
    ring_sync_cursor(r);
    return 0;
}

void ring_fini(struct ring *r)
{
    shmb_free(r->slots);
    r->slots = NULL;
    r->cap = r->count = r->head = 0;
}

/* The slot at index i from the oldest. */
struct ring_slot *ring_slot(const struct ring *r, size_t i)
{
    return &r->slots[(r->head + i) & (r->cap - 1)];
}

/* Double the slot array, unwrapping it; -ENOMEM. */
int ring_grow(struct ring *r)
{
    struct ring_slot *slots;
    size_t i;

    if (r->cap > SIZE_MAX / 2 / sizeof(*slots))
        return -ENOMEM;
    slots = shmb_calloc(r->cap * 2, sizeof(*slots));
    if (slots == NULL)
        return -ENOMEM;
    for (i = 0; i < r->count; i++)
        slots[i] = *ring_slot(r, i);
    shmb_free(r->slots);
    r->slots = slots;
    r->cap *= 2;
    r->head = 0;
    return 0;
}

/* Where a chunk of need bytes would start, or UINT64_MAX when it does not fit.
 * A chunk that does not fit before the physical end starts the next lap. */
static uint64_t ring_place(const struct ring *r, uint64_t need)
{
    uint64_t pos = r->end;

    if (need == 0 || need > r->size)
        return UINT64_MAX;
    if (pos % r->size + need > r->size)
        pos = (pos / r->size + 1) * r->size;
    if (pos + need - r->start > r->size)
        return UINT64_MAX;
    return pos;
}

bool ring_fits(const struct ring *r, uint64_t chunk_size)
{
    return ring_place(r, chunk_size) != UINT64_MAX;
}

/* The header of the chunk at physical offset phys, in the segment. The ring
 * writes headers there; it reads one only in ring_read_header, once, into a
 * private copy (read-write clients can change the segment at any time). */
struct shmb_chunk_header *ring_header_at(const struct ring *r, uint64_t phys)
{
    return (struct shmb_chunk_header *)(r->data + phys);
}

/* Write one header field of the chunk at phys through the guard. */
void ring_store_field(struct ring *r, uint64_t phys, size_t field, const void *value,
                             size_t len)
{
    segment_store(r->data + phys + field, value, len);
}

int ring_alloc(struct ring *r, uint64_t payload_size, const char *label, size_t label_len,
               void *owner, struct ring_chunk *out, struct shmb_error *err)
{
    struct shmb_chunk_header hdr;
    struct ring_slot *slot;
    uint64_t need, pos, phys, gap_at;
    int rc;

    if (payload_size == 0)
        return shmb_error_set(err, -EINVAL, "Size must be at least 1 byte.");
    if (label_len > SHMB_KEY_MAX)
        return shmb_error_set(err, -EINVAL, "Key of %zu bytes is longer than %u bytes.",
                              label_len, SHMB_KEY_MAX);
    /* Headers are built in private memory and copied in through the guard:
     * a client with the read-write descriptor may have truncated the file or
     * punched a hole in it, and then the copy fails instead of killing us. */
    if ((rc = segment_guard_check(r->data, err)) < 0)
        return rc;
    need = ring_chunk_size(label_len, payload_size);
    if (need == 0 || need > r->size)
        return shmb_error_set(err, -E2BIG,
                              "Object size (%llu bytes) plus its header does not fit in "
                              "the ring (%llu bytes).",
                              (unsigned long long)payload_size,
                              (unsigned long long)r->size);
    pos = ring_place(r, need);
    if (pos == UINT64_MAX)
        return shmb_error_set(err, -ENOSPC,
                              "Not enough space in the ring: %llu bytes requested, %llu "
                              "bytes free.",
                              (unsigned long long)need,
                              (unsigned long long)ring_free_bytes(r));
    if (r->count == r->cap && ring_grow(r) < 0)
        return shmb_error_set(err, -ENOMEM, "Out of memory for the ring's chunk list.");

    /* Mark the skipped tail so that a walk of the segment can step over it. */
    gap_at = r->end % r->size;
    if (pos != r->end && gap_at != 0) {
        memset(&hdr, 0, RING_FIXED_HEADER);
        hdr.magic = SHMB_CHUNK_MAGIC;
        hdr.state = SHMB_CHUNK_GAP;
        hdr.header_size = RING_FIXED_HEADER;
        hdr.chunk_size = r->size - gap_at;
        if (segment_store(ring_header_at(r, gap_at), &hdr, RING_FIXED_HEADER) < 0)
            return segment_guard_check(r->data, err);
    }

    phys = pos % r->size;
    memset(&hdr, 0, RING_FIXED_HEADER);
    hdr.magic = SHMB_CHUNK_MAGIC;
    hdr.state = SHMB_CHUNK_PENDING;
    hdr.key_len = (uint16_t)label_len;
    hdr.header_size = (uint32_t)ring_header_size(label_len);
    hdr.id = r->next_id;
    hdr.chunk_size = need;
    hdr.payload_size = payload_size;
    if (segment_store(ring_header_at(r, phys), &hdr, RING_FIXED_HEADER) < 0 ||
        (label_len > 0 && segment_store((char *)ring_header_at(r, phys) + RING_FIXED_HEADER,
                                        label, label_len) < 0))
        return segment_guard_check(r->data, err);

    if (r->count == 0)
        r->first_id = r->next_id;
    slot = ring_slot(r, r->count);
    slot->phys = phys;
    slot->size = need;
    slot->owner = owner;
    slot->freed = false;
    slot->committed = false;
    slot->held = false;
    slot->header_size = (uint32_t)ring_header_size(label_len);
    slot->payload_size = payload_size;
    r->count++;
    r->end = pos + need;

    if (out != NULL) {
        out->id = r->next_id;
        out->phys = phys;
        out->chunk_size = need;
        /* From private values: a client may already have changed the header. */
        out->payload_offset = r->data_offset + phys + slot->header_size;
        out->payload_size = payload_size;
    }
    r->next_id++;
    ring_sync_cursor(r);
    return 0;
}

/* The slot of live chunk id, or NULL. */
static struct ring_slot *ring_find(const struct ring *r, uint64_t id)
{
    if (r->count == 0 || id < r->first_id || id - r->first_id >= r->count)
        return NULL;
    return ring_slot(r, (size_t)(id - r->first_id));
}

int ring_set_state(struct ring *r, uint64_t id, enum shmb_chunk_state state)
{
    struct ring_slot *slot = ring_find(r, id);

    if (slot == NULL || slot->freed)
        return -ENOENT;
    if (state == SHMB_CHUNK_COMMITTED)
        slot->committed = true;
    ring_store_field(r, slot->phys, offsetof(struct shmb_chunk_header, state),
                     &(uint16_t){(uint16_t)state}, sizeof(uint16_t));
    return 0;
}

int ring_set_tag(struct ring *r, uint64_t id, uint32_t tag)
{
    struct ring_slot *slot = ring_find(r, id);

    if (slot == NULL || slot->freed)
        return -ENOENT;
    ring_store_field(r, slot->phys, offsetof(struct shmb_chunk_header, tag), &tag,
                     sizeof(tag));
    return 0;
}

int ring_keep_id(struct ring *r, uint64_t id)
{
    struct ring_slot *slot = ring_find(r, id);

    if (slot == NULL || slot->freed)
        return -ENOENT;
    slot->committed = true;
    return 0;
}

/* Drop the oldest slot and move start to the next chunk, past any skipped
 * tail gap in between (as vLLM's fixed free_buf does). Empties reset to
 * zero; a start past the lap is renormalised. */
static void ring_pop(struct ring *r)
{
    r->head = (r->head + 1) & (r->cap - 1);
    r->count--;
    r->first_id++;
    if (r->count == 0) {
        r->start = r->end = 0;
        return;
    }
    r->start += (ring_slot(r, 0)->phys + r->size - r->start % r->size) % r->size;
    if (r->start >= r->size) {
        r->start -= r->size;
        r->end -= r->size;
    }
}

/* Reclaim freed chunks at the head. */
uint64_t ring_pop_freed(struct ring *r)
{
    uint64_t before = ring_used(r);

    while (r->count > 0 && ring_slot(r, 0)->freed)
        ring_pop(r);
    ring_sync_cursor(r);
    return before - ring_used(r);
}

/* Cut the committed, freed chunk at the newest end down to RING_REMNANT
 * bytes, in the ring and in its header (a freed chunk without key), so that
 * it keeps its id while its other bytes come back. */
static void ring_keep_remnant(struct ring *r, struct ring_slot *tail)
{
    uint64_t size = RING_REMNANT, payload = RING_REMNANT - SHMB_ALIGN;
    uint32_t header_size = SHMB_ALIGN;

    if (tail->size <= RING_REMNANT)
        return;
    r->end -= tail->size - RING_REMNANT;
    tail->size = size;
    tail->header_size = header_size;
    tail->payload_size = payload;
    ring_store_field(r, tail->phys, offsetof(struct shmb_chunk_header, key_len),
                     &(uint16_t){0}, sizeof(uint16_t));
    ring_store_field(r, tail->phys, offsetof(struct shmb_chunk_header, header_size),
                     &header_size, sizeof(header_size));
    ring_store_field(r, tail->phys, offsetof(struct shmb_chunk_header, chunk_size), &size,
                     sizeof(size));
    ring_store_field(r, tail->phys, offsetof(struct shmb_chunk_header, payload_size),
                     &payload, sizeof(payload));
}

/* Give back freed chunks at the tail: end retreats to the end of the newest
 * live chunk, so an abort (or an expired allocation) returns its bytes at
 * once instead of waiting for every older chunk. A committed chunk stops the
 * retreat, cut down to a remnant that keeps its id: the next chunk would
 * take the id of the one given back, and a reader holding the id of an
 * object that went must not find another object under it. */
void ring_pop_tail_freed(struct ring *r)
{
    while (r->count > 0 && ring_slot(r, r->count - 1)->freed) {
        struct ring_slot *tail = ring_slot(r, r->count - 1);
        uint64_t tail_start = r->end - tail->size;

        if (tail->held)
            break;
        if (tail->committed) {
            ring_keep_remnant(r, tail);
            break;
        }
        r->count--;
        if (r->count == 0) {
            r->start = r->end = 0;
            break;
        }
        tail = ring_slot(r, r->count - 1);
        /* The previous chunk ends where this one starts, unless this one
         * skipped a tail gap and starts a lap (then the gap goes too). */
        if ((tail->phys + tail->size) % r->size == tail_start % r->size)
            r->end = tail_start;
        else
            r->end = tail_start - r->size + tail->phys + tail->size;
        /* Ids stay consecutive, as slot lookup needs: the next chunk
         * takes the id of the one given back. */
        r->next_id = r->first_id + r->count;
    }
    ring_sync_cursor(r);
}

int ring_shrink(struct ring *r, uint64_t id, uint64_t chunk_size)
{
    struct ring_slot *slot = ring_find(r, id);
    uint64_t payload;

    if (slot == NULL || slot->freed)
        return -ENOENT;
    if (chunk_size % SHMB_ALIGN != 0 || chunk_size <= slot->header_size ||
        chunk_size > slot->size)
        return -EINVAL;
    if (id != r->first_id + r->count - 1)
        return -EBUSY;
    r->end -= slot->size - chunk_size;
    slot->size = chunk_size;
    slot->payload_size = payload = chunk_size - slot->header_size;
    /* The header says the same, so that a walk of the segment steps to the
     * end of the chunk as it is now. */
    ring_store_field(r, slot->phys, offsetof(struct shmb_chunk_header, chunk_size),
                     &chunk_size, sizeof(chunk_size));
    ring_store_field(r, slot->phys, offsetof(struct shmb_chunk_header, payload_size),
                     &payload, sizeof(payload));
    ring_sync_cursor(r);
    return 0;
}

/* A chunk's bytes may be reused: so marked for the ring, and in its header
 * for a daemon that adopts the segment. */
static void ring_mark_freed(struct ring *r, struct ring_slot *slot)
{
    slot->freed = true;
    slot->owner = NULL;
    ring_store_field(r, slot->phys, offsetof(struct shmb_chunk_header, state),
                     &(uint16_t){SHMB_CHUNK_FREE}, sizeof(uint16_t));
}

int ring_free(struct ring *r, uint64_t id)
{
    struct ring_slot *slot = ring_find(r, id);

    if (slot == NULL)
        return -ENOENT;
    if (slot->freed)
        return -EALREADY;
    ring_mark_freed(r, slot);
    ring_pop_freed(r);
    ring_pop_tail_freed(r);
    return 0;
}

uint64_t ring_reclaim(struct ring *r, uint64_t want, ring_may_free_fn may_free, void *arg)
{
    uint64_t before = ring_used(r);

    while (r->count > 0) {
        struct ring_slot *slot = ring_slot(r, 0);

        if (want != 0 && ring_fits(r, want))
            break;
        if (!slot->freed) {
            if (may_free == NULL || !may_free(slot->owner, r->first_id, arg))
                break;
            ring_mark_freed(r, slot);
        }
        ring_pop(r);
    }
    ring_pop_freed(r);
    return before - ring_used(r);
}

/* Fill out from slot i. */
static void ring_describe(const struct ring *r, size_t i, struct ring_chunk *out)
{
    const struct ring_slot *slot = ring_slot(r, i);

    /* From the slot, never from the header in the segment. */
    out->id = r->first_id + i;
    out->phys = slot->phys;
    out->chunk_size = slot->size;
    out->payload_offset = r->data_offset + slot->phys + slot->header_size;
    out->payload_size = slot->payload_size;
}

void *ring_oldest(const struct ring *r, struct ring_chunk *out)
{
    size_t i;

    for (i = 0; i < r->count; i++) {
        if (!ring_slot(r, i)->freed) {
            if (out != NULL)
                ring_describe(r, i, out);
            return ring_slot(r, i)->owner;
        }
    }
    return NULL;
}

size_t ring_count(const struct ring *r)
{
    return r->count;
}

void *ring_at(const struct ring *r, size_t index, struct ring_chunk *out)
{
    if (index >= r->count)
        return NULL;
    if (out != NULL)
        ring_describe(r, index, out);
    return ring_slot(r, index)->owner;
}

uint64_t ring_used(const struct ring *r)
{
    return r->end - r->start;
}

uint64_t ring_free_bytes(const struct ring *r)
{
    return r->size - ring_used(r);
}
