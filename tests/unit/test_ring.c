// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the ring allocator (daemon/ring.c): a port of vLLM's
 * tests/distributed/test_shm_buffer.py, sized for our 48-byte chunk header and
 * 64-byte alignment, plus out-of-order frees, walking, corruption and a random
 * comparison against a reference model. Links only ring.o and proto.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ring.h"

/* Where the data area starts in a real segment; payload offsets count from
 * the start of the segment, so they are DATA_OFFSET + physical offset. */
#define DATA_OFFSET 4096u
/* A fresh data area holds this, not zeros, so nothing relies on zeroed memory. */
#define FILL 0xa5
/* The fixed part of a chunk header, before the key. */
#define CHUNK_FIXED 48u

_Static_assert(sizeof(struct shmb_chunk_header) == CHUNK_FIXED,
               "the chunk header's fixed part is 48 bytes");

/* A ring over a data area of exactly size bytes, so that ASan sees any read
 * past its end. */
struct fix {
    struct ring r;
    unsigned char *data;
    uint64_t size;
    bool with_cursor;
    struct shmb_segment_header cursor;
};

static uint64_t align64(uint64_t n)
{
    return (n + SHMB_ALIGN - 1) / SHMB_ALIGN * SHMB_ALIGN;
}

/* Our own computation of a chunk's header size: fixed part + key, padded. */
static uint64_t expect_header(size_t key_len)
{
    return align64(CHUNK_FIXED + key_len);
}

/* Build a ring of size bytes; the caller frees it with fix_free. */
static struct fix *fix_new(uint64_t size, bool with_cursor)
{
    struct shmb_error err = {0};
    struct fix *f = calloc(1, sizeof(*f));
    int rc;

    assert_non_null(f);
    f->size = size;
    f->data = aligned_alloc(SHMB_ALIGN, size);
    assert_non_null(f->data);
    memset(f->data, FILL, size);
    f->with_cursor = with_cursor;
    if (with_cursor) {
        f->cursor.magic = SHMB_SEGMENT_MAGIC;
        f->cursor.version = SHMB_LAYOUT_VERSION;
        f->cursor.data_offset = DATA_OFFSET;
        f->cursor.data_size = size;
    }
    rc = ring_init(&f->r, f->data, DATA_OFFSET, size, with_cursor ? &f->cursor : NULL,
                   &err);
    if (rc != 0)
        fail_msg("ring_init(%llu) = %d: %s", (unsigned long long)size, rc, err.message);
    return f;
}

static void fix_free(struct fix *f)
{
    ring_fini(&f->r);
    free(f->data);
    free(f);
}

static struct shmb_chunk_header *chunk_at(const struct fix *f, uint64_t phys)
{
    assert_true(phys % SHMB_ALIGN == 0);
    assert_true(phys + CHUNK_FIXED <= f->size);
    return (struct shmb_chunk_header *)(void *)(f->data + phys);
}

/* The payload bytes of a chunk, from its segment offset. */
static unsigned char *payload_of(const struct fix *f, const struct ring_chunk *c)
{
    return f->data + (c->payload_offset - DATA_OFFSET);
}

/* Invariants that hold after every operation. */
static void check_ring(const struct fix *f)
{
    const struct ring *r = &f->r;

    assert_true(r->start <= r->end);
    assert_true(r->end - r->start <= r->size);
    assert_true(r->start < r->size);
    assert_int_equal(ring_used(r), r->end - r->start);
    assert_int_equal(ring_used(r) + ring_free_bytes(r), r->size);
    if (ring_count(r) == 0)
        assert_null(ring_oldest(r, NULL));
    if (f->with_cursor) {
        assert_int_equal(f->cursor.ring_start, r->start);
        assert_int_equal(f->cursor.ring_end, r->end);
        assert_int_equal(f->cursor.ring_next_id, r->next_id);
        assert_int_equal(f->cursor.magic, SHMB_SEGMENT_MAGIC);
        assert_int_equal(f->cursor.data_size, f->size);
    }
}

/* Check what ring_alloc returned and the header it wrote. */
static void check_chunk(const struct fix *f, const struct ring_chunk *c, const char *key,
                        size_t key_len, uint64_t payload)
{
    const struct shmb_chunk_header *h;

    assert_int_equal(c->chunk_size, expect_header(key_len) + align64(payload));
    assert_int_equal(c->chunk_size, ring_chunk_size(key_len, payload));
    assert_int_equal(c->phys % SHMB_ALIGN, 0);
    assert_true(c->phys + c->chunk_size <= f->size);
    assert_int_equal(c->payload_offset, DATA_OFFSET + c->phys + expect_header(key_len));
    assert_int_equal(c->payload_offset % SHMB_ALIGN, 0);
    assert_int_equal(c->payload_size, payload);
    h = chunk_at(f, c->phys);
    assert_int_equal(h->magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(h->state, SHMB_CHUNK_PENDING);
    assert_int_equal(h->key_len, key_len);
    assert_int_equal(h->header_size, expect_header(key_len));
    assert_int_equal(h->id, c->id);
    assert_int_equal(h->chunk_size, c->chunk_size);
    assert_int_equal(h->payload_size, payload);
    assert_memory_equal((const char *)(h + 1), key, key_len);
}

/* Allocate and check; fails the test when ring_alloc fails. */
static struct ring_chunk alloc_key(struct fix *f, uint64_t payload, const char *key,
                                   size_t key_len, void *owner)
{
    struct shmb_error err = {0};
    struct ring_chunk c;
    uint64_t id = f->r.next_id;
    int rc;

    memset(&c, 0, sizeof(c));
    rc = ring_alloc(&f->r, payload, key, key_len, owner, &c, &err);
    if (rc != 0)
        fail_msg("ring_alloc(%llu, key_len %zu) = %d: %s", (unsigned long long)payload,
                 key_len, rc, err.message);
    assert_int_equal(c.id, id);
    assert_int_equal(f->r.next_id, id + 1);
    check_chunk(f, &c, key, key_len, payload);
    check_ring(f);
    return c;
}

static struct ring_chunk alloc_ok(struct fix *f, uint64_t payload, const char *key,
                                  void *owner)
{
    return alloc_key(f, payload, key, strlen(key), owner);
}

/* Expect ring_alloc to fail with code and to change nothing. */
static void alloc_fails(struct fix *f, uint64_t payload, const char *key, size_t key_len,
                        int code)
{
    struct shmb_error err = {0};
    struct ring_chunk c;
    uint64_t start = f->r.start, end = f->r.end, next_id = f->r.next_id;
    size_t count = ring_count(&f->r);
    int rc = ring_alloc(&f->r, payload, key, key_len, NULL, &c, &err);

    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_true(err.message[0] != '\0');
    assert_int_equal(f->r.start, start);
    assert_int_equal(f->r.end, end);
    assert_int_equal(f->r.next_id, next_id);
    assert_int_equal(ring_count(&f->r), count);
    check_ring(f);
}

static bool allow_all(void *owner, uint64_t id, void *arg)
{
    (void)owner;
    (void)id;
    (void)arg;
    return true;
}

/* A may_free callback that records what it was asked and allows a budget. */
struct asked {
    unsigned allow;         /* how many more it may allow */
    uint64_t only_id;       /* when != UINT64_MAX, allow this id only */
    size_t n;
    uint64_t ids[64];
    void *owners[64];
    bool answers[64];
};

static void asked_reset(struct asked *a, unsigned allow)
{
    memset(a, 0, sizeof(*a));
    a->allow = allow;
    a->only_id = UINT64_MAX;
}

static bool may_free_budget(void *owner, uint64_t id, void *arg)
{
    struct asked *a = arg;
    bool yes = a->allow > 0 && (a->only_id == UINT64_MAX || a->only_id == id);

    if (yes)
        a->allow--;
    if (a->n > 1000)
        fail_msg("ring_reclaim keeps asking (%zu times): it does not stop at a refusal",
                 a->n);
    if (a->n < 64) {
        a->ids[a->n] = id;
        a->owners[a->n] = owner;
        a->answers[a->n] = yes;
    }
    a->n++;
    return yes;
}

static void *tag(uint64_t n)
{
    return (void *)(uintptr_t)(n + 1);
}

/* ring_chunk_size is header (48 + key, padded to 64) plus padded payload, and
 * 0 when the sum overflows. */
static void test_chunk_size(void **state)
{
    (void)state;
    assert_int_equal(ring_chunk_size(0, 2), 128);
    assert_int_equal(ring_chunk_size(0, 64), 128);
    assert_int_equal(ring_chunk_size(0, 65), 192);
    assert_int_equal(ring_chunk_size(16, 1), 128);
    assert_int_equal(ring_chunk_size(17, 1), 192);
    assert_int_equal(ring_chunk_size(255, 4096), 320 + 4096);
    assert_int_equal(ring_chunk_size(0, UINT64_MAX), 0);
    assert_int_equal(ring_chunk_size(0, UINT64_MAX - 100), 0);
    assert_int_equal(ring_chunk_size(10, UINT64_MAX - 63), 0);
}

/* vLLM test_buffer_access: bytes written at the payload offset read back
 * unchanged, and the chunk header in the data area (magic, PENDING, id, key)
 * sits before the payload and is not touched by writing it. */
static void test_buffer_access(void **state)
{
    static const char msg[] = "Hello, World!Hello, World!Hello, World!Hello, World!"
                              "Hello, World!Hello, World!Hello, World!";
    struct fix *f = fix_new(4096, false);
    struct ring_chunk a, b;
    unsigned char *p;
    const struct shmb_chunk_header *h;

    (void)state;
    assert_int_equal(sizeof(msg) - 1, 91);
    a = alloc_ok(f, 100, "hello", tag(0));
    assert_int_equal(a.id, 0);
    assert_int_equal(a.phys, 0);
    assert_int_equal(a.payload_offset, DATA_OFFSET + 64);
    p = payload_of(f, &a);
    memcpy(p, msg, 91);
    b = alloc_ok(f, 100, "world", tag(1));
    assert_int_equal(b.id, 1);
    assert_int_equal(b.phys, a.chunk_size);
    memset(payload_of(f, &b), 0, 100);

    assert_memory_equal(payload_of(f, &a), msg, 91);
    h = chunk_at(f, a.phys);
    assert_int_equal(h->magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(h->state, SHMB_CHUNK_PENDING);
    assert_int_equal(h->id, a.id);
    assert_int_equal(h->key_len, 5);
    assert_memory_equal((const char *)(h + 1), "hello", 5);
    check_chunk(f, &b, "world", 5, 100);
    fix_free(f);
}

/* vLLM test_memory_error_on_full_buffer: two chunks fill a small ring and
 * one more byte does not fit: -ENOSPC, with nothing changed. */
static void test_error_on_full_buffer(void **state)
{
    struct fix *f = fix_new(448, true);

    (void)state;
    alloc_ok(f, 100, "", tag(0)); /* 64 + 128 */
    alloc_ok(f, 80, "", tag(1));  /* 64 + 128: 384 of 448 used */
    assert_int_equal(ring_used(&f->r), 384);
    assert_false(ring_fits(&f->r, ring_chunk_size(0, 1)));
    assert_true(ring_fits(&f->r, 64));
    alloc_fails(f, 1, "", 0, -ENOSPC);
    fix_free(f);
}

/* vLLM test_allocation_and_free: allocate, then reclaim everything, five
 * times; each reclaim frees exactly the chunk just allocated (id i) and gives
 * its bytes back, and the empty ring starts over at offset 0. */
static void test_allocation_and_free(void **state)
{
    struct fix *f = fix_new(448, true);
    struct asked a;
    uint64_t i, got;

    (void)state;
    for (i = 0; i < 5; i++) {
        struct ring_chunk c = alloc_ok(f, 80, "", tag(i));

        assert_int_equal(c.id, i);
        assert_int_equal(c.phys, 0);
        memcpy(payload_of(f, &c), "Repeated test data", 18);
        asked_reset(&a, 100);
        got = ring_reclaim(&f->r, 0, may_free_budget, &a);
        assert_int_equal(a.n, 1);
        assert_int_equal(a.ids[0], i);
        assert_ptr_equal(a.owners[0], tag(i));
        assert_int_equal(got, c.chunk_size);
        assert_int_equal(ring_used(&f->r), 0);
        assert_int_equal(ring_count(&f->r), 0);
        check_ring(f);
    }
    fix_free(f);
}

/* vLLM test_clear_buffer: freeing every chunk leaves nothing used, resets
 * start and end to 0 so the next chunk lands at offset 0, and ids keep
 * counting (an id is never reused). */
static void test_clear(void **state)
{
    struct fix *f = fix_new(4096, true);
    struct ring_chunk c[3], n;
    int i;

    (void)state;
    for (i = 0; i < 3; i++)
        c[i] = alloc_ok(f, 100, "k", tag((uint64_t)i));
    for (i = 0; i < 3; i++) {
        assert_int_equal(ring_free(&f->r, c[i].id), 0);
        check_ring(f);
    }
    assert_int_equal(ring_used(&f->r), 0);
    assert_int_equal(ring_free_bytes(&f->r), 4096);
    assert_int_equal(ring_count(&f->r), 0);
    assert_null(ring_oldest(&f->r, NULL));
    assert_int_equal(f->r.start, 0);
    assert_int_equal(f->r.end, 0);
    n = alloc_ok(f, 100, "k", tag(3));
    assert_int_equal(n.phys, 0);
    assert_int_equal(n.id, 3);
    fix_free(f);
}

/* A chunk of exactly the data size fits an empty ring (vLLM's fixed ring has
 * no reserved byte here: positions are monotonic), nothing else fits beside
 * it, and one 64-byte step more can never fit (-E2BIG). */
static void test_exact_fit(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk c;

    (void)state;
    assert_true(ring_fits(&f->r, 1024));
    assert_false(ring_fits(&f->r, 1088));
    c = alloc_ok(f, 1024 - 64, "sixteen-byte-key", tag(0));
    assert_int_equal(c.phys, 0);
    assert_int_equal(c.chunk_size, 1024);
    assert_int_equal(ring_free_bytes(&f->r), 0);
    assert_false(ring_fits(&f->r, 64));
    alloc_fails(f, 1, "", 0, -ENOSPC);
    alloc_fails(f, 1024 - 64 + 1, "", 0, -E2BIG);
    assert_int_equal(ring_free(&f->r, c.id), 0);
    check_ring(f);
    c = alloc_ok(f, 1024 - 64, "", tag(1));
    assert_int_equal(c.phys, 0);
    assert_int_equal(ring_free(&f->r, c.id), 0);
    /* A key that grows the header by a step makes the same payload too big. */
    alloc_fails(f, 1024 - 64, "seventeen-bytekey", 17, -E2BIG);
    fix_free(f);
}

/* A chunk that does not fit before the physical end starts the next lap at
 * offset 0 once the start has moved far enough, and a GAP header covering the
 * skipped tail is written at the old end; the gap counts as used until the
 * start passes it. */
static void test_tail_gap_skipped(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c;
    const struct shmb_chunk_header *g;

    (void)state;
    a = alloc_ok(f, 320, "a", tag(0)); /* 384 bytes at 0 */
    b = alloc_ok(f, 320, "b", tag(1)); /* 384 bytes at 384; 256 left at the tail */
    assert_int_equal(b.phys, 384);
    assert_int_equal(ring_free(&f->r, a.id), 0);
    check_ring(f);
    assert_int_equal(f->r.start, 384);

    c = alloc_ok(f, 320, "c", tag(2));
    assert_int_equal(c.phys, 0);
    assert_int_equal(f->r.end, 1024 + 384);
    g = chunk_at(f, 768);
    assert_int_equal(g->magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(g->state, SHMB_CHUNK_GAP);
    assert_int_equal(g->chunk_size, 256);
    assert_int_equal(ring_used(&f->r), 1024);
    assert_int_equal(ring_free_bytes(&f->r), 0);

    /* Freeing b moves the start over b and the gap to c, one lap on: both
     * positions come back by one lap. */
    assert_int_equal(ring_free(&f->r, b.id), 0);
    check_ring(f);
    assert_int_equal(f->r.start, 0);
    assert_int_equal(f->r.end, 384);
    assert_int_equal(ring_used(&f->r), 384);
    assert_ptr_equal(ring_oldest(&f->r, NULL), tag(2));
    fix_free(f);
}

/* Once the chunk before a skipped tail gap is freed, the gap is behind the
 * start (vLLM's fixed free_buf moves the start to the next allocation): the
 * whole rest of the lap is free again, and a chunk filling it fits. */
static void test_gap_behind_start_is_free(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c, d;

    (void)state;
    a = alloc_ok(f, 320, "a", tag(0));
    b = alloc_ok(f, 320, "b", tag(1));
    assert_int_equal(ring_free(&f->r, a.id), 0);
    c = alloc_ok(f, 320, "c", tag(2)); /* at 0; gap 768..1024 */
    assert_int_equal(c.phys, 0);
    assert_int_equal(ring_free(&f->r, b.id), 0);
    /* Live: c at 0..384. Free: 384..1024, 640 contiguous bytes. */
    assert_int_equal(ring_used(&f->r), 384);
    assert_true(ring_fits(&f->r, 640));
    d = alloc_ok(f, 576, "", tag(3));
    assert_int_equal(d.phys, 384);
    assert_int_equal(ring_free_bytes(&f->r), 0);
    fix_free(f);
}

/* While the start has not moved past the room the next lap needs, a chunk
 * that does not fit before the physical end is refused (-ENOSPC) even though
 * the tail has free bytes, and no gap header is written; a chunk that fits
 * the tail exactly still goes there. */
static void test_tail_gap_needs_room(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk t;

    (void)state;
    alloc_ok(f, 320, "a", tag(0));
    alloc_ok(f, 320, "b", tag(1));
    assert_false(ring_fits(&f->r, 384));
    assert_true(ring_fits(&f->r, 256));
    alloc_fails(f, 320, "c", 1, -ENOSPC);
    assert_int_not_equal(chunk_at(f, 768)->magic, SHMB_CHUNK_MAGIC);
    t = alloc_ok(f, 192, "t", tag(2)); /* 64 + 192 = 256: exactly the tail */
    assert_int_equal(t.phys, 768);
    assert_int_equal(ring_free_bytes(&f->r), 0);
    fix_free(f);
}

/* ---- test_allocation_cycles ------------------------------------------- */

#define CYCLE_MAX_IDS 4096

/* The allocation bitmap of vLLM's test_allocation_cycles: one bool per byte
 * of the data area, and each chunk's extent by id. */
struct cycles {
    struct fix *f;
    bool *bitmap;
    uint64_t phys[CYCLE_MAX_IDS], size[CYCLE_MAX_IDS];
    bool live[CYCLE_MAX_IDS];
    unsigned enospc, gaps;
};

static uint64_t count_allocated(const struct cycles *cy, uint64_t phys, uint64_t size)
{
    uint64_t i, n = 0;

    for (i = phys; i < phys + size; i++)
        n += cy->bitmap[i];
    return n;
}

static void mark_allocated(struct cycles *cy, const struct ring_chunk *c)
{
    assert_true(c->id < CYCLE_MAX_IDS);
    assert_false(cy->live[c->id]);
    assert_true(c->phys + c->chunk_size <= cy->f->size);
    if (count_allocated(cy, c->phys, c->chunk_size) != 0)
        fail_msg("chunk %llu at %llu (+%llu) overlaps a live chunk",
                 (unsigned long long)c->id, (unsigned long long)c->phys,
                 (unsigned long long)c->chunk_size);
    memset(cy->bitmap + c->phys, 1, c->chunk_size);
    cy->phys[c->id] = c->phys;
    cy->size[c->id] = c->chunk_size;
    cy->live[c->id] = true;
}

static void mark_freed(struct cycles *cy, uint64_t id)
{
    assert_true(id < CYCLE_MAX_IDS);
    if (!cy->live[id])
        fail_msg("chunk %llu freed but not live", (unsigned long long)id);
    assert_int_equal(count_allocated(cy, cy->phys[id], cy->size[id]), cy->size[id]);
    memset(cy->bitmap + cy->phys[id], 0, cy->size[id]);
    cy->live[id] = false;
}

/* Reclaim with a callback that allows n chunks, oldest first; mark them. */
static uint64_t cycles_reclaim(struct cycles *cy, unsigned n)
{
    struct asked a;
    uint64_t used = ring_used(&cy->f->r), got;
    size_t i, allowed = 0;
    uint64_t prev = 0;

    asked_reset(&a, n);
    got = ring_reclaim(&cy->f->r, 0, may_free_budget, &a);
    assert_true(a.n <= 64);
    for (i = 0; i < a.n; i++) {
        if (i > 0)
            assert_true(a.ids[i] > prev); /* oldest first */
        prev = a.ids[i];
        assert_ptr_equal(a.owners[i], tag(a.ids[i]));
        if (a.answers[i]) {
            mark_freed(cy, a.ids[i]);
            allowed++;
        } else {
            assert_int_equal(i, a.n - 1); /* a refusal stops the reclaim */
        }
    }
    assert_int_equal(got, used - ring_used(&cy->f->r));
    check_ring(cy->f);
    return allowed;
}

/* Allocate; on -ENOSPC free the two oldest chunks and retry, as vLLM's
 * ring_allocate does, until it fits. */
static struct ring_chunk cycles_alloc(struct cycles *cy, uint64_t payload, size_t key_len)
{
    static const char key[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    struct shmb_error err = {0};
    struct ring_chunk c;
    uint64_t old_end_phys;
    size_t live;
    int rc, tries = 0;

    assert_true(key_len < sizeof(key));
    for (;;) {
        old_end_phys = cy->f->r.end % cy->f->size;
        rc = ring_alloc(&cy->f->r, payload, key, key_len, tag(cy->f->r.next_id), &c, &err);
        if (rc != -ENOSPC)
            break;
        cy->enospc++;
        live = ring_count(&cy->f->r);
        assert_true(live > 0); /* an empty ring has room */
        assert_int_equal(cycles_reclaim(cy, 2), live >= 2 ? 2 : live);
        assert_true(++tries < 1000);
    }
    if (rc != 0)
        fail_msg("ring_alloc(%llu) = %d: %s", (unsigned long long)payload, rc, err.message);
    check_chunk(cy->f, &c, key, key_len, payload);
    check_ring(cy->f);
    if (c.phys == 0 && old_end_phys != 0 && ring_count(&cy->f->r) > 1) {
        /* It skipped the tail: a GAP header covers it. */
        const struct shmb_chunk_header *g = chunk_at(cy->f, old_end_phys);

        assert_int_equal(g->magic, SHMB_CHUNK_MAGIC);
        assert_int_equal(g->state, SHMB_CHUNK_GAP);
        assert_int_equal(g->chunk_size, cy->f->size - old_end_phys);
        cy->gaps++;
    }
    mark_allocated(cy, &c);
    assert_true(ring_used(&cy->f->r) >= count_allocated(cy, 0, cy->f->size));
    return c;
}

static struct cycles *cycles_new(uint64_t size)
{
    struct cycles *cy = calloc(1, sizeof(*cy));

    assert_non_null(cy);
    cy->f = fix_new(size, true);
    cy->bitmap = calloc(size, 1);
    assert_non_null(cy->bitmap);
    return cy;
}

static void cycles_free(struct cycles *cy)
{
    fix_free(cy->f);
    free(cy->bitmap);
    free(cy);
}

/* Free everything left, then a chunk of the whole data area must land at 0. */
static void cycles_finish(struct cycles *cy)
{
    struct ring_chunk c;
    size_t left = ring_count(&cy->f->r);

    assert_int_equal(cycles_reclaim(cy, 100000), left);
    assert_int_equal(ring_used(&cy->f->r), 0);
    assert_int_equal(count_allocated(cy, 0, cy->f->size), 0);
    c = cycles_alloc(cy, cy->f->size - 64, 0);
    assert_int_equal(c.phys, 0);
    assert_int_equal(c.chunk_size, cy->f->size);
    assert_int_equal(count_allocated(cy, 0, cy->f->size), cy->f->size);
}

/* vLLM test_allocation_cycles (the regression test of the fix to
 * SingleWriterShmRingBuffer's free logic), scaled to our chunks: a ring of
 * exactly ten minimal chunks (128 bytes: 2-byte payload), 33 allocations,
 * each -ENOSPC answered by freeing the two oldest. No two live chunks may
 * ever overlap, every freed chunk must have been wholly allocated, and once
 * everything is freed a chunk of the whole data area lands at offset 0. */
static void test_allocation_cycles(void **state)
{
    struct cycles *cy = cycles_new(1280);
    int i;

    (void)state;
    assert_int_equal(ring_chunk_size(0, 2), 128);
    for (i = 0; i < 33; i++) {
        struct ring_chunk c = cycles_alloc(cy, 2, 0);

        assert_int_equal(c.id, (uint64_t)i);
        /* Chunks tile the ring: the i-th lands at (i * 128) mod 1280. */
        assert_int_equal(c.phys, (uint64_t)i * 128 % 1280);
    }
    /* 10 fit; each later pair of allocations needed one reclaim of two. */
    assert_int_equal(cy->enospc, 12);
    assert_int_equal(count_allocated(cy, 0, 1280), ring_used(&cy->f->r));
    cycles_finish(cy);
    cycles_free(cy);
}

/* test_allocation_cycles with a ring that is not a multiple of the chunk
 * size and mixed chunk sizes and key lengths, so that tail gaps are skipped
 * again and again: still no overlap, every gap has its header, and the ring
 * empties back to offset 0. */
static void test_allocation_cycles_gaps(void **state)
{
    static const uint64_t payloads[] = {2, 64, 100, 200, 300, 500, 1};
    struct cycles *cy = cycles_new(1216);
    uint32_t x = 12345;
    int i;

    (void)state;
    for (i = 0; i < 600; i++) {
        x = x * 1103515245u + 12345u;
        cycles_alloc(cy, payloads[(x >> 16) % 7], (x >> 8) % 30);
    }
    assert_true(cy->gaps >= 10);
    assert_true(cy->enospc >= 100);
    cycles_finish(cy);
    cycles_free(cy);
}

/* ---- out-of-order frees, reclaim ---------------------------------------- */

/* ring_free of a chunk behind the oldest only marks it: the start stays; a
 * second free of it is -EALREADY. Freeing the oldest then moves the start
 * over every contiguous freed chunk and stops at the first live one, which
 * ring_oldest reports. Reclaimed ids are -ENOENT. */
static void test_free_out_of_order(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk c[4], o;
    int i;

    (void)state;
    for (i = 0; i < 4; i++)
        c[i] = alloc_ok(f, 100, "x", tag((uint64_t)i)); /* 192 bytes each */

    assert_int_equal(ring_free(&f->r, c[1].id), 0);
    check_ring(f);
    assert_int_equal(f->r.start, 0);
    assert_int_equal(ring_used(&f->r), 768);
    assert_int_equal(ring_count(&f->r), 4);
    assert_ptr_equal(ring_at(&f->r, 0, &o), tag(0));
    assert_int_equal(o.id, c[0].id);
    assert_null(ring_at(&f->r, 1, NULL));
    assert_ptr_equal(ring_at(&f->r, 3, &o), tag(3));
    assert_int_equal(o.phys, c[3].phys);

    assert_int_equal(ring_free(&f->r, c[2].id), 0);
    assert_int_equal(ring_free(&f->r, c[2].id), -EALREADY);
    assert_int_equal(ring_free(&f->r, c[1].id), -EALREADY);
    check_ring(f);
    assert_int_equal(f->r.start, 0);
    memset(&o, 0, sizeof(o));
    assert_ptr_equal(ring_oldest(&f->r, &o), tag(0));
    assert_int_equal(o.id, c[0].id);
    assert_int_equal(o.phys, 0);

    assert_int_equal(ring_free(&f->r, c[0].id), 0);
    check_ring(f);
    assert_int_equal(f->r.start, c[3].phys);
    assert_int_equal(ring_used(&f->r), 192);
    assert_int_equal(ring_count(&f->r), 1);
    memset(&o, 0, sizeof(o));
    assert_ptr_equal(ring_oldest(&f->r, &o), tag(3));
    assert_int_equal(o.id, c[3].id);
    assert_int_equal(o.phys, c[3].phys);
    assert_int_equal(o.chunk_size, c[3].chunk_size);
    assert_int_equal(o.payload_offset, c[3].payload_offset);

    assert_int_equal(ring_free(&f->r, c[0].id), -ENOENT);
    assert_int_equal(ring_free(&f->r, c[1].id), -ENOENT);
    assert_int_equal(ring_free(&f->r, 12345), -ENOENT);
    assert_int_equal(ring_free(&f->r, c[3].id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 0);
    assert_null(ring_oldest(&f->r, NULL));
    assert_int_equal(ring_free(&f->r, c[3].id), -ENOENT);
    fix_free(f);
}

/* ring_reclaim asks about the oldest chunk first, skips asking about chunks
 * already freed, and stops at the first chunk its callback refuses
 * (head-of-line blocking): a refused oldest chunk keeps everything behind it,
 * even freed chunks. It returns the bytes given back. */
static void test_reclaim_head_of_line(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk c[3];
    struct asked a;
    int i;

    (void)state;
    for (i = 0; i < 3; i++)
        c[i] = alloc_ok(f, 100, "y", tag((uint64_t)i));
    assert_int_equal(ring_free(&f->r, c[1].id), 0);

    asked_reset(&a, 0);
    assert_int_equal(ring_reclaim(&f->r, 0, may_free_budget, &a), 0);
    assert_int_equal(a.n, 1);
    assert_int_equal(a.ids[0], c[0].id);
    assert_ptr_equal(a.owners[0], tag(0));
    assert_int_equal(ring_used(&f->r), 576);
    assert_ptr_equal(ring_oldest(&f->r, NULL), tag(0));
    check_ring(f);

    asked_reset(&a, 10);
    a.only_id = c[0].id;
    assert_int_equal(ring_reclaim(&f->r, 0, may_free_budget, &a), 384);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.ids[0], c[0].id);
    assert_true(a.answers[0]);
    assert_int_equal(a.ids[1], c[2].id);
    assert_false(a.answers[1]);
    assert_int_equal(ring_used(&f->r), 192);
    assert_ptr_equal(ring_oldest(&f->r, NULL), tag(2));
    check_ring(f);

    assert_int_equal(ring_reclaim(&f->r, 0, allow_all, NULL), 192);
    assert_int_equal(ring_used(&f->r), 0);
    assert_int_equal(ring_count(&f->r), 0);
    check_ring(f);
    fix_free(f);
}

/* With want > 0, ring_reclaim stops as soon as an allocation of want bytes
 * fits, instead of emptying the ring. */
static void test_reclaim_stops_when_want_fits(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct asked a;
    int i;

    (void)state;
    for (i = 0; i < 4; i++)
        alloc_ok(f, 192, "", tag((uint64_t)i)); /* 256 bytes each: full */
    assert_false(ring_fits(&f->r, 256));
    asked_reset(&a, 100);
    assert_int_equal(ring_reclaim(&f->r, 256, may_free_budget, &a), 256);
    assert_int_equal(a.n, 1);
    assert_int_equal(ring_count(&f->r), 3);
    assert_true(ring_fits(&f->r, 256));
    assert_false(ring_fits(&f->r, 512));
    asked_reset(&a, 100);
    assert_int_equal(ring_reclaim(&f->r, 512, may_free_budget, &a), 256);
    assert_int_equal(a.n, 1);
    assert_int_equal(a.ids[0], 1);
    assert_true(ring_fits(&f->r, 512));
    check_ring(f);
    fix_free(f);
}

/* ---- ring_walk ---------------------------------------------------------- */

struct walked {
    size_t n, gaps;
    uint64_t ids[64];
    char keys[64][256];
    size_t key_lens[64];
    uint64_t payload_offsets[64];
    uint16_t states[64];
    uint64_t gap_phys, gap_size;
    size_t stop_at; /* return 7 on this chunk (1-based), 0 = never */
    const unsigned char *data;
};

static int walk_record(const struct shmb_chunk_header *hdr, const char *key,
                       uint64_t payload_offset, void *arg)
{
    struct walked *w = arg;

    assert_int_equal(hdr->magic, SHMB_CHUNK_MAGIC);
    if (hdr->state == SHMB_CHUNK_GAP) {
        w->gaps++;
        w->gap_phys = (uint64_t)((const unsigned char *)hdr - w->data);
        w->gap_size = hdr->chunk_size;
        return 0;
    }
    assert_true(w->n < 64);
    assert_true(hdr->key_len <= SHMB_KEY_MAX);
    w->ids[w->n] = hdr->id;
    memcpy(w->keys[w->n], key, hdr->key_len);
    w->key_lens[w->n] = hdr->key_len;
    w->payload_offsets[w->n] = payload_offset;
    w->states[w->n] = hdr->state;
    w->n++;
    return w->stop_at != 0 && w->n == w->stop_at ? 7 : 0;
}

/* ring_walk visits every chunk from start to end in allocation order and
 * hands over its header, its key bytes and its payload offset; a state set
 * with ring_set_state shows; a non-zero return from the callback stops the
 * walk and is returned. */
static void test_walk_in_order(void **state)
{
    static char long_key[101];
    struct fix *f = fix_new(2048, false);
    struct shmb_error err = {0};
    struct ring_chunk c[4];
    struct walked w;
    const char *keys[4];
    size_t lens[4];
    int i;

    (void)state;
    memset(long_key, 'L', 100);
    keys[0] = "alpha";
    keys[1] = "";
    keys[2] = long_key;
    keys[3] = "z\0y";
    lens[0] = 5;
    lens[1] = 0;
    lens[2] = 100;
    lens[3] = 3;
    c[0] = alloc_key(f, 10, keys[0], lens[0], tag(0));
    c[1] = alloc_key(f, 1, keys[1], lens[1], tag(1));
    c[2] = alloc_key(f, 500, keys[2], lens[2], tag(2));
    c[3] = alloc_key(f, 64, keys[3], lens[3], tag(3));
    assert_int_equal(ring_set_state(&f->r, c[1].id, SHMB_CHUNK_COMMITTED), 0);
    assert_int_equal(chunk_at(f, c[1].phys)->state, SHMB_CHUNK_COMMITTED);

    memset(&w, 0, sizeof(w));
    w.data = f->data;
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), 0);
    assert_int_equal(w.n, 4);
    assert_int_equal(w.gaps, 0);
    for (i = 0; i < 4; i++) {
        assert_int_equal(w.ids[i], c[i].id);
        assert_int_equal(w.key_lens[i], lens[i]);
        assert_memory_equal(w.keys[i], keys[i], lens[i]);
        assert_int_equal(w.payload_offsets[i], c[i].payload_offset);
        assert_int_equal(w.states[i],
                         i == 1 ? SHMB_CHUNK_COMMITTED : SHMB_CHUNK_PENDING);
    }

    memset(&w, 0, sizeof(w));
    w.data = f->data;
    w.stop_at = 2;
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), 7);
    assert_int_equal(w.n, 2);
    fix_free(f);
}

/* ring_walk of an empty ring calls nothing; after a wrap it visits the
 * chunks of both laps in order (a gap, if reported at all, is reported as a
 * GAP at the old end). */
static void test_walk_after_wrap(void **state)
{
    struct fix *f = fix_new(1024, false);
    struct shmb_error err = {0};
    struct ring_chunk a, b, c;
    struct walked w;

    (void)state;
    memset(&w, 0, sizeof(w));
    w.data = f->data;
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), 0);
    assert_int_equal(w.n + w.gaps, 0);

    a = alloc_ok(f, 320, "a", tag(0));
    b = alloc_ok(f, 320, "b", tag(1));
    assert_int_equal(ring_free(&f->r, a.id), 0);
    c = alloc_ok(f, 320, "c", tag(2));
    assert_int_equal(c.phys, 0);
    memset(&w, 0, sizeof(w));
    w.data = f->data;
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), 0);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.ids[0], b.id);
    assert_memory_equal(w.keys[0], "b", 1);
    assert_int_equal(w.ids[1], c.id);
    assert_memory_equal(w.keys[1], "c", 1);
    if (w.gaps != 0) {
        assert_int_equal(w.gaps, 1);
        assert_int_equal(w.gap_phys, 768);
        assert_int_equal(w.gap_size, 256);
    }
    fix_free(f);
}

enum corruption {
    BAD_MAGIC,
    SIZE_PAST_END,
    SIZE_OVERFLOW,
    SIZE_UNALIGNED,
    SIZE_ZERO,
    BAD_STATE,
    ZERO_STATE,
    HEADER_SIZE_TOO_BIG,
    KEY_PAST_HEADER,
    PAYLOAD_TOO_BIG,
    ID_NOT_INCREASING,
};

/* Build three chunks of 192 bytes filling a 576-byte data area (the last one
 * ends exactly at the end of the allocation, so ASan sees any read past it),
 * corrupt the last one's header and check that ring_walk reports -EBADMSG
 * naming its offset, after visiting at most the two good chunks. */
static void walk_corrupt(enum corruption what)
{
    struct fix *f = fix_new(576, false);
    struct shmb_error err = {0};
    struct shmb_chunk_header *h;
    struct walked w;
    int rc;

    alloc_ok(f, 100, "k0", tag(0));
    alloc_ok(f, 100, "k1", tag(1));
    alloc_ok(f, 100, "k2", tag(2));
    assert_int_equal(ring_free_bytes(&f->r), 0);
    h = chunk_at(f, 384);
    switch (what) {
    case BAD_MAGIC:
        h->magic = 0x12345678;
        break;
    case SIZE_PAST_END:
        h->chunk_size = 576 * 4;
        break;
    case SIZE_OVERFLOW:
        h->chunk_size = UINT64_MAX - 63;
        break;
    case SIZE_UNALIGNED:
        h->chunk_size = 100;
        break;
    case SIZE_ZERO:
        h->chunk_size = 0;
        break;
    case BAD_STATE:
        h->state = 99;
        break;
    case ZERO_STATE:
        h->state = 0;
        break;
    case HEADER_SIZE_TOO_BIG:
        h->header_size = 1024;
        break;
    case KEY_PAST_HEADER:
        h->key_len = 255;
        break;
    case PAYLOAD_TOO_BIG:
        h->payload_size = 1000;
        break;
    case ID_NOT_INCREASING:
        h->id = 0;
        break;
    }
    memset(&w, 0, sizeof(w));
    w.data = f->data;
    rc = ring_walk(&f->r, walk_record, &w, &err);
    assert_int_equal(rc, -EBADMSG);
    assert_int_equal(err.code, -EBADMSG);
    assert_true(w.n <= 2);
    /* The offset, in the data area (384) or in the segment (4096 + 384). */
    if (strstr(err.message, "384") == NULL && strstr(err.message, "4480") == NULL)
        fail_msg("message does not name the offset 384 (or 4480): '%s'", err.message);
    fix_free(f);
}

/* Each test below proves that ring_walk rejects one kind of corrupt chunk
 * header with -EBADMSG naming its offset, without reading outside the data
 * area (run under ASan). */
static void test_walk_bad_magic(void **state)
{
    (void)state;
    walk_corrupt(BAD_MAGIC);
}

static void test_walk_size_past_end(void **state)
{
    (void)state;
    walk_corrupt(SIZE_PAST_END);
}

static void test_walk_size_overflow(void **state)
{
    (void)state;
    walk_corrupt(SIZE_OVERFLOW);
}

static void test_walk_size_unaligned(void **state)
{
    (void)state;
    walk_corrupt(SIZE_UNALIGNED);
}

static void test_walk_size_zero(void **state)
{
    (void)state;
    walk_corrupt(SIZE_ZERO);
}

static void test_walk_bad_state(void **state)
{
    (void)state;
    walk_corrupt(BAD_STATE);
    walk_corrupt(ZERO_STATE);
}

static void test_walk_header_size_too_big(void **state)
{
    (void)state;
    walk_corrupt(HEADER_SIZE_TOO_BIG);
}

static void test_walk_key_past_header(void **state)
{
    (void)state;
    walk_corrupt(KEY_PAST_HEADER);
}

static void test_walk_payload_too_big(void **state)
{
    (void)state;
    walk_corrupt(PAYLOAD_TOO_BIG);
}

static void test_walk_id_not_increasing(void **state)
{
    (void)state;
    walk_corrupt(ID_NOT_INCREASING);
}

/* A chunk header whose size is plausible but wrong sends the walk into the
 * payload of the previous chunk, which is not a header: -EBADMSG, not a walk
 * through garbage. */
static void test_walk_size_shrunk(void **state)
{
    struct fix *f = fix_new(576, false);
    struct shmb_error err = {0};
    struct walked w;

    (void)state;
    alloc_ok(f, 100, "k0", tag(0));
    alloc_ok(f, 100, "k1", tag(1));
    alloc_ok(f, 100, "k2", tag(2));
    chunk_at(f, 192)->chunk_size = 64;
    memset(&w, 0, sizeof(w));
    w.data = f->data;
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), -EBADMSG);
    assert_int_equal(err.code, -EBADMSG);
    assert_true(err.message[0] != '\0');
    assert_true(w.n <= 2);
    fix_free(f);
}

/* ---- cursor, invalid input ---------------------------------------------- */

/* With a segment header passed as cursor, ring_start, ring_end and
 * ring_next_id follow the ring through allocation, wrap, out-of-order free
 * and reset, and the rest of the header is left alone. */
static void test_cursor_mirror(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c;

    (void)state;
    assert_int_equal(f->cursor.ring_end, 0);
    a = alloc_ok(f, 320, "a", tag(0));
    assert_int_equal(f->cursor.ring_end, 384);
    assert_int_equal(f->cursor.ring_next_id, 1);
    b = alloc_ok(f, 320, "b", tag(1));
    assert_int_equal(f->cursor.ring_end, 768);
    assert_int_equal(f->cursor.ring_next_id, 2);
    assert_int_equal(ring_free(&f->r, a.id), 0);
    check_ring(f);
    assert_int_equal(f->cursor.ring_start, 384);
    c = alloc_ok(f, 320, "c", tag(2));
    assert_int_equal(f->cursor.ring_end, 1408);
    assert_int_equal(f->cursor.ring_next_id, 3);
    assert_int_equal(ring_free(&f->r, b.id), 0);
    check_ring(f);
    assert_int_equal(f->cursor.ring_start, 0);
    assert_int_equal(f->cursor.ring_end, 384);
    assert_int_equal(ring_reclaim(&f->r, 0, allow_all, NULL), 384);
    check_ring(f);
    assert_int_equal(f->cursor.ring_start, 0);
    assert_int_equal(f->cursor.ring_end, 0);
    assert_int_equal(f->cursor.ring_next_id, 3);
    assert_int_equal(f->cursor.version, SHMB_LAYOUT_VERSION);
    assert_int_equal(f->cursor.data_offset, DATA_OFFSET);
    (void)c;
    fix_free(f);
}

/* Bad arguments are refused with the right code and change nothing: a zero
 * payload and a key longer than 255 bytes are -EINVAL, a chunk bigger than
 * the ring is -E2BIG (also when its size overflows), and ring_init refuses a
 * zero size, a size that is not a multiple of 64 and a misaligned area. */
static void test_invalid_inputs(void **state)
{
    static char key[300];
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring r2;
    struct ring_chunk c;

    (void)state;
    memset(key, 'k', sizeof(key));
    alloc_fails(f, 0, "k", 1, -EINVAL);
    alloc_fails(f, 10, key, 256, -EINVAL);
    alloc_fails(f, 10, key, 300, -EINVAL);
    alloc_fails(f, 1024, "", 0, -E2BIG);
    alloc_fails(f, UINT64_MAX, "", 0, -E2BIG);
    alloc_fails(f, UINT64_MAX - 10, key, 255, -E2BIG);
    assert_int_not_equal(chunk_at(f, 0)->magic, SHMB_CHUNK_MAGIC);
    c = alloc_key(f, 10, key, 255, tag(0));
    assert_int_equal(c.chunk_size, 320 + 64);
    assert_int_equal(c.id, 0);

    memset(&r2, 0, sizeof(r2));
    assert_int_equal(ring_init(&r2, f->data, DATA_OFFSET, 0, NULL, &err), -EINVAL);
    assert_int_equal(err.code, -EINVAL);
    shmb_error_clear(&err);
    memset(&r2, 0, sizeof(r2));
    assert_int_equal(ring_init(&r2, f->data, DATA_OFFSET, 100, NULL, &err), -EINVAL);
    assert_int_equal(err.code, -EINVAL);
    memset(&r2, 0, sizeof(r2));
    assert_int_equal(ring_init(&r2, f->data + 8, DATA_OFFSET, 512, NULL, &err), -EINVAL);
    fix_free(f);
}

/* ---- random comparison with a reference model --------------------------- */

/* The ring's rules written out plainly: monotonic positions, skip the tail
 * when a chunk does not fit before the physical end, refuse when the new end
 * would lap the start, free in any order, reclaim oldest first, move the
 * start to the oldest remaining chunk, give freed chunks at the newest end
 * back at once, reset when empty, bring both back by a lap once the start
 * passes the physical end. */
#define MODEL_MAX 128

struct mslot {
    uint64_t id, pos, size;
    bool freed, reclaimable;
};

struct model {
    uint64_t size, start, end, next_id;
    struct mslot s[MODEL_MAX];
    size_t n;
    size_t asked; /* may_free calls during one ring_reclaim */
};

static void model_settle(struct model *m)
{
    size_t k = 0, i;

    while (k < m->n && m->s[k].freed)
        k++;
    memmove(m->s, m->s + k, (m->n - k) * sizeof(m->s[0]));
    m->n -= k;
    if (m->n == 0) {
        m->start = m->end = 0;
        return;
    }
    m->start = m->s[0].pos;
    if (m->start >= m->size) {
        m->start -= m->size;
        m->end -= m->size;
        for (i = 0; i < m->n; i++)
            m->s[i].pos -= m->size;
    }
}

/* Freed chunks at the newest end go at once: the end retreats to the newest
 * live chunk (over a skipped tail gap too), and its successor's id is
 * reused, so ids stay consecutive. */
static void model_retract(struct model *m)
{
    while (m->n > 0 && m->s[m->n - 1].freed)
        m->n--;
    if (m->n == 0) {
        m->start = m->end = 0;
        return;
    }
    m->end = m->s[m->n - 1].pos + m->s[m->n - 1].size;
    m->next_id = m->s[m->n - 1].id + 1;
}

/* Returns 0 and the chunk's position, or the error ring_alloc must give. */
static int model_alloc(struct model *m, uint64_t need, uint64_t *pos_out)
{
    uint64_t phys_end = m->end % m->size, pos;

    if (need > m->size)
        return -E2BIG;
    pos = phys_end + need > m->size ? (m->end / m->size + 1) * m->size : m->end;
    if (pos + need - m->start > m->size)
        return -ENOSPC;
    assert_true(m->n < MODEL_MAX);
    m->s[m->n].id = m->next_id++;
    m->s[m->n].pos = pos;
    m->s[m->n].size = need;
    m->s[m->n].freed = false;
    m->s[m->n].reclaimable = false;
    m->n++;
    m->end = pos + need;
    *pos_out = pos;
    return 0;
}

static struct mslot *model_find(struct model *m, uint64_t id)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (m->s[i].id == id)
            return &m->s[i];
    return NULL;
}

static bool may_free_model(void *owner, uint64_t id, void *arg)
{
    struct model *m = arg;
    struct mslot *s = model_find(m, id);

    if (++m->asked > MODEL_MAX)
        fail_msg("ring_reclaim asked %zu times: it does not stop at a refusal", m->asked);
    assert_non_null(s);
    assert_ptr_equal(owner, tag(id));
    assert_false(s->freed);
    return s->reclaimable;
}

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    /* xorshift64*: fast, and the same sequence for the same seed everywhere. */
    rnd_state ^= rnd_state >> 12;
    rnd_state ^= rnd_state << 25;
    rnd_state ^= rnd_state >> 27;
    return rnd_state * UINT64_C(2685821657736338717);
}

/* Start the generator from seed; every seed gives its own sequence. */
static void rnd_seed(uint64_t seed)
{
    uint64_t z = seed + UINT64_C(0x9e3779b97f4a7c15);

    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    rnd_state = (z ^ (z >> 31)) | 1;
}

static uint64_t test_seed(void)
{
    const char *s = getenv("SHMB_TEST_SEED");
    uint64_t seed = 20240611;

    if (s != NULL && *s != '\0')
        seed = strtoull(s, NULL, 0);
    printf("seed=%llu (set SHMB_TEST_SEED to change)\n", (unsigned long long)seed);
    return seed;
}

/* Compare the ring with the model after every operation. */
static void model_compare(const struct fix *f, const struct model *m)
{
    struct ring_chunk o;
    size_t i, first_live = m->n;

    check_ring(f);
    assert_int_equal(f->r.start, m->start);
    assert_int_equal(f->r.end, m->end);
    assert_int_equal(f->r.next_id, m->next_id);
    assert_int_equal(ring_count(&f->r), m->n);
    for (i = 0; i < m->n; i++) {
        void *owner = ring_at(&f->r, i, &o);

        if (m->s[i].freed) {
            assert_null(owner);
        } else {
            if (first_live == m->n)
                first_live = i;
            assert_ptr_equal(owner, tag(m->s[i].id));
            assert_int_equal(o.id, m->s[i].id);
            assert_int_equal(o.phys, m->s[i].pos % m->size);
            assert_int_equal(o.chunk_size, m->s[i].size);
        }
    }
    if (first_live == m->n) {
        assert_null(ring_oldest(&f->r, NULL));
    } else {
        assert_ptr_equal(ring_oldest(&f->r, &o), tag(m->s[first_live].id));
        assert_int_equal(o.id, m->s[first_live].id);
    }
}

/* Random allocations (sizes and key lengths), out-of-order frees and
 * reclaims with a random policy give exactly the positions, errors, start,
 * end and ids of the model above, the headers are intact, no two chunks in
 * the ring overlap, and a periodic ring_walk sees the model's chunks. */
static void test_reference_model(void **state)
{
    static char key[64];
    struct fix *f = fix_new(4096, true);
    struct model *m = calloc(1, sizeof(*m));
    bool *bitmap = calloc(4096, 1);
    struct shmb_error err = {0};
    int step;

    (void)state;
    assert_non_null(m);
    assert_non_null(bitmap);
    memset(key, 'q', sizeof(key));
    rnd_seed(test_seed());
    m->size = 4096;
    for (step = 0; step < 200000; step++) {
        uint64_t r = rnd() % 100;

        if (r < 55) {
            uint64_t payload = 1 + rnd() % (rnd() % 4 == 0 ? 4200 : 700);
            size_t key_len = (size_t)(rnd() % 40);
            uint64_t need = ring_chunk_size(key_len, payload), pos = 0;
            uint64_t old_end = m->end;
            struct ring_chunk c;
            int want = model_alloc(m, need, &pos);
            int rc = ring_alloc(&f->r, payload, key, key_len, tag(m->next_id - (want == 0)),
                                &c, &err);

            if (rc != want)
                fail_msg("step %d: ring_alloc(%llu, key %zu) = %d, model says %d", step,
                         (unsigned long long)payload, key_len, rc, want);
            if (rc == 0) {
                assert_int_equal(c.phys, pos % m->size);
                assert_int_equal(c.id, m->next_id - 1);
                check_chunk(f, &c, key, key_len, payload);
                m->s[m->n - 1].reclaimable = rnd() % 2 == 0;
                if (pos != old_end) {
                    const struct shmb_chunk_header *g = chunk_at(f, old_end % m->size);

                    assert_int_equal(g->magic, SHMB_CHUNK_MAGIC);
                    assert_int_equal(g->state, SHMB_CHUNK_GAP);
                    assert_int_equal(g->chunk_size, m->size - old_end % m->size);
                }
                for (uint64_t b = c.phys; b < c.phys + c.chunk_size; b++) {
                    if (bitmap[b])
                        fail_msg("step %d: chunk %llu overlaps a live chunk at %llu", step,
                                 (unsigned long long)c.id, (unsigned long long)b);
                    bitmap[b] = true;
                }
            }
        } else if (r < 90 && m->n > 0) {
            struct mslot *s = &m->s[rnd() % m->n];
            uint64_t id = s->id;
            int want = s->freed ? -EALREADY : 0;
            size_t before = m->n, i;
            struct mslot gone[MODEL_MAX];

            memcpy(gone, m->s, m->n * sizeof(m->s[0]));
            s->freed = true;
            model_settle(m);
            model_retract(m);
            assert_int_equal(ring_free(&f->r, id), want);
            /* Clear the bitmap of the chunks the model gave back, at either end. */
            for (i = 0; i < before; i++)
                if (model_find(m, gone[i].id) == NULL)
                    memset(bitmap + gone[i].pos % m->size, 0, gone[i].size);
        } else if (r < 97) {
            uint64_t used = m->end - m->start, got;
            size_t before = m->n, k = 0;
            struct mslot gone[MODEL_MAX];

            memcpy(gone, m->s, m->n * sizeof(m->s[0]));
            m->asked = 0;
            got = ring_reclaim(&f->r, 0, may_free_model, m);
            while (k < m->n && (m->s[k].freed || m->s[k].reclaimable))
                m->s[k++].freed = true;
            model_settle(m);
            for (k = 0; k < before - m->n; k++)
                memset(bitmap + gone[k].pos % m->size, 0, gone[k].size);
            assert_int_equal(got, used - (m->end - m->start));
        } else {
            assert_int_equal(ring_free(&f->r, m->next_id + 5), -ENOENT);
        }
        model_compare(f, m);
        if (step % 97 == 0) {
            struct walked w;
            size_t i;

            memset(&w, 0, sizeof(w));
            w.data = f->data;
            if (m->n <= 64) {
                assert_int_equal(ring_walk(&f->r, walk_record, &w, &err), 0);
                assert_int_equal(w.n, m->n);
                for (i = 0; i < m->n; i++)
                    assert_int_equal(w.ids[i], m->s[i].id);
            }
        }
    }
    free(bitmap);
    free(m);
    fix_free(f);
}

/* ---- adoption, retraction ------------------------------------------------ */

/* What ring_adopt offered: ids, payload offsets and states, in order. */
struct offered {
    size_t n;
    uint64_t ids[16];
    uint64_t offsets[16];
    uint16_t states[16];
    uint64_t refuse_mask; /* ids (< 64) whose chunk is not kept */
};

/* ring_adopt callback: record the chunk; keep it (owner tag(id)) unless its
 * id is in refuse_mask. */
static void *adopt_record(const struct shmb_chunk_header *hdr, const char *key,
                          uint64_t payload_offset, void *arg)
{
    struct offered *o = arg;

    (void)key;
    assert_true(o->n < 16);
    o->ids[o->n] = hdr->id;
    o->offsets[o->n] = payload_offset;
    o->states[o->n] = hdr->state;
    o->n++;
    if (hdr->id < 64 && (o->refuse_mask & (UINT64_C(1) << hdr->id)))
        return NULL;
    return tag(hdr->id);
}

/* A second ring over f's data area, as a restarted daemon builds it: the
 * cursor is read from the header first (ring_init resets it), then the ring
 * is rebuilt from the chunk headers. Returns ring_adopt's result. */
static int readopt(struct fix *f, struct ring *r2, struct offered *o, struct shmb_error *err)
{
    uint64_t start = f->cursor.ring_start, end = f->cursor.ring_end;
    uint64_t next_id = f->cursor.ring_next_id;
    struct shmb_error init_err = {0};

    assert_true(f->with_cursor);
    memset(r2, 0, sizeof(*r2));
    assert_int_equal(ring_init(r2, f->data, DATA_OFFSET, f->size, &f->cursor, &init_err), 0);
    return ring_adopt(r2, start, end, next_id, adopt_record, o, err);
}

/* ring_adopt rebuilds, from the chunk headers and the saved cursor alone, a
 * ring that wrapped around past a skipped tail gap after its oldest chunks
 * were freed: the same start, end, next id, live chunks (ids, positions,
 * owners, states) and free bytes, the cursor mirrored; and the rebuilt ring
 * then behaves exactly like the original through frees and allocations. */
static void test_adopt_rebuilds_wrapped_ring(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk a, b, c, d, x1, x2, o1, o2;
    struct offered o;
    struct ring r2;
    size_t i;

    (void)state;
    memset(&o, 0, sizeof(o));
    a = alloc_ok(f, 250, "a", tag(0));  /* 320 bytes at 0 */
    b = alloc_ok(f, 250, "b", tag(1));  /* 320 bytes at 320 */
    c = alloc_ok(f, 250, "c", tag(2));  /* 320 bytes at 640 */
    assert_int_equal(ring_free(&f->r, a.id), 0);
    assert_int_equal(ring_set_state(&f->r, b.id, SHMB_CHUNK_COMMITTED), 0);
    /* 64 bytes before the end: d skips them (a gap) and starts at 0. */
    d = alloc_ok(f, 100, "d", tag(3));
    assert_int_equal(d.phys, 0);
    assert_int_equal(ring_free(&f->r, b.id), 0);
    assert_int_equal(f->r.start, 640);
    assert_int_equal(f->r.end, 1024 + 192);
    check_ring(f);

    assert_int_equal(readopt(f, &r2, &o, &err), 0);
    assert_int_equal(o.n, 2);
    assert_int_equal(o.ids[0], c.id);
    assert_int_equal(o.offsets[0], c.payload_offset);
    assert_int_equal(o.states[0], SHMB_CHUNK_PENDING);
    assert_int_equal(o.ids[1], d.id);
    assert_int_equal(o.offsets[1], d.payload_offset);
    assert_int_equal(r2.start, f->r.start);
    assert_int_equal(r2.end, f->r.end);
    assert_int_equal(r2.next_id, f->r.next_id);
    assert_int_equal(ring_count(&r2), 2);
    assert_int_equal(ring_used(&r2), ring_used(&f->r));
    assert_ptr_equal(ring_at(&r2, 0, &o1), tag(c.id));
    assert_int_equal(o1.phys, c.phys);
    assert_int_equal(o1.chunk_size, c.chunk_size);
    assert_ptr_equal(ring_at(&r2, 1, &o1), tag(d.id));
    assert_int_equal(o1.phys, d.phys);
    assert_int_equal(f->cursor.ring_start, r2.start);
    assert_int_equal(f->cursor.ring_end, r2.end);
    assert_int_equal(f->cursor.ring_next_id, r2.next_id);

    /* Both rings, fed the same operations, answer the same. */
    assert_int_equal(ring_alloc(&f->r, 400, "x", 1, tag(9), &x1, &err), -ENOSPC);
    assert_int_equal(ring_alloc(&r2, 400, "x", 1, tag(9), &x2, &err), -ENOSPC);
    assert_int_equal(ring_free(&f->r, c.id), 0);
    assert_int_equal(ring_free(&r2, c.id), 0);
    assert_int_equal(r2.start, f->r.start);
    assert_int_equal(r2.end, f->r.end);
    for (i = 0; i < 3; i++) {
        memset(&x1, 0, sizeof(x1));
        memset(&x2, 0, sizeof(x2));
        assert_int_equal(ring_alloc(&f->r, 100, "y", 1, tag(10 + i), &x1, &err), 0);
        assert_int_equal(ring_alloc(&r2, 100, "y", 1, tag(10 + i), &x2, &err), 0);
        assert_int_equal(x2.id, x1.id);
        assert_int_equal(x2.phys, x1.phys);
        assert_int_equal(x2.payload_offset, x1.payload_offset);
    }
    assert_int_equal(ring_used(&r2), ring_used(&f->r));
    assert_ptr_equal(ring_oldest(&r2, &o2), ring_oldest(&f->r, &o1));
    assert_int_equal(o2.id, o1.id);
    ring_fini(&r2);
    fix_free(f);
}

/* A chunk whose owner-callback answer is NULL is freed on adoption: at the
 * head the start moves past it, at the tail the end retracts (and its id is
 * reused), and its header is marked free. */
static void test_adopt_refused_chunks(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk c[3], x;
    struct offered o;
    struct ring r2;
    int i;

    (void)state;
    memset(&o, 0, sizeof(o));
    for (i = 0; i < 3; i++)
        c[i] = alloc_ok(f, 100, "k", tag((uint64_t)i));
    o.refuse_mask = (UINT64_C(1) << 0) | (UINT64_C(1) << 2);
    assert_int_equal(readopt(f, &r2, &o, &err), 0);
    assert_int_equal(o.n, 3);
    /* The refused newest chunk was pending: held whole (see
     * test_adopt_holds_pending_tail), after the live one. */
    assert_int_equal(ring_count(&r2), 2);
    assert_int_equal(r2.start, c[1].phys);
    assert_int_equal(r2.end, c[2].phys + c[2].chunk_size);
    assert_int_equal(r2.next_id, c[2].id + 1);
    assert_int_equal(chunk_at(f, c[0].phys)->state, SHMB_CHUNK_FREE);
    assert_int_equal(chunk_at(f, c[2].phys)->state, SHMB_CHUNK_FREE);
    assert_int_equal(ring_alloc(&r2, 100, "z", 1, tag(5), &x, &err), 0);
    assert_int_equal(x.id, c[2].id + 1);
    assert_int_equal(x.phys, c[2].phys + c[2].chunk_size);
    ring_fini(&r2);
    fix_free(f);
}

/* With no sound chunk after a corrupt header, the walk stops there:
 * ring_adopt returns -EBADMSG with a message naming the bad magic, where it
 * is and how much was dropped; the chunks before it are kept and those from
 * it on are never offered; ids go on from the last sound chunk and the ring
 * is usable. A cursor that makes no sense adopts nothing, with its own
 * message. */
static void test_adopt_stops_at_corrupt(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk c[4], x;
    struct offered o;
    struct ring r2;
    int i;

    (void)state;
    memset(&o, 0, sizeof(o));
    for (i = 0; i < 4; i++)
        c[i] = alloc_ok(f, 100, "k", tag((uint64_t)i)); /* 192 bytes each */
    chunk_at(f, c[2].phys)->magic = 0x12345678;
    chunk_at(f, c[3].phys)->magic = 0x12345678;
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    assert_int_equal(err.code, -EBADMSG);
    if (strstr(err.message, "bad chunk magic 0x12345678 at data offset 384") == NULL ||
        strstr(err.message, "Dropped the 384 bytes") == NULL)
        fail_msg("unexpected message: %s", err.message);
    assert_int_equal(o.n, 2);
    assert_int_equal(ring_count(&r2), 2);
    assert_int_equal(ring_used(&r2), 384);
    assert_int_equal(r2.next_id, c[2].id);
    assert_int_equal(f->cursor.ring_end, 384);
    assert_int_equal(ring_alloc(&r2, 100, "z", 1, tag(7), &x, &err), 0);
    assert_int_equal(x.id, c[2].id);
    assert_int_equal(x.phys, 384);
    ring_fini(&r2);

    /* A cursor whose end lies more than a ring past its start. */
    f->cursor.ring_start = 0;
    f->cursor.ring_end = 4096;
    memset(&o, 0, sizeof(o));
    shmb_error_clear(&err);
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    if (strstr(err.message, "Corrupt ring cursor") == NULL)
        fail_msg("unexpected message: %s", err.message);
    assert_int_equal(o.n, 0);
    assert_int_equal(ring_count(&r2), 0);
    assert_int_equal(ring_used(&r2), 0);
    assert_int_equal(ring_alloc(&r2, 100, "z", 1, tag(7), &x, &err), 0);
    assert_int_equal(x.phys, 0);
    ring_fini(&r2);
    fix_free(f);
}

/* ring_walk and ring_adopt walk the chunks the same way: over a wrapped
 * ring with a tail gap and chunks in every state, the walk visits exactly
 * the chunks adoption offers (ids, payload offsets, states, in order); and
 * on a damaged header both stop at it with the same reason, adoption going
 * on to say what it dropped. */
static void test_walk_and_adopt_agree(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error werr = {0}, aerr = {0};
    struct ring_chunk a, b, c, d, e;
    struct walked w;
    struct offered o;
    struct ring r2;
    size_t i;

    (void)state;
    a = alloc_ok(f, 250, "a", tag(0));   /* 320 bytes at 0 */
    b = alloc_ok(f, 250, "bb", tag(1));  /* 320 bytes at 320 */
    c = alloc_ok(f, 200, "ccc", tag(2)); /* 256 bytes at 640 */
    assert_int_equal(ring_free(&f->r, a.id), 0);
    assert_int_equal(ring_set_state(&f->r, b.id, SHMB_CHUNK_COMMITTED), 0);
    d = alloc_ok(f, 100, "d", tag(3)); /* skips 128 bytes: a gap, then 0 */
    assert_int_equal(d.phys, 0);
    e = alloc_ok(f, 10, "e", tag(4));
    assert_int_equal(ring_set_state(&f->r, e.id, SHMB_CHUNK_COMMITTED), 0);
    (void)c;

    memset(&w, 0, sizeof(w));
    w.data = f->data;
    memset(&o, 0, sizeof(o));
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &werr), 0);
    assert_int_equal(readopt(f, &r2, &o, &aerr), 0);
    assert_int_equal(w.n, 4);
    assert_int_equal(o.n, w.n);
    for (i = 0; i < w.n; i++) {
        assert_int_equal(o.ids[i], w.ids[i]);
        assert_int_equal(o.offsets[i], w.payload_offsets[i]);
        assert_int_equal(o.states[i], w.states[i]);
    }
    ring_fini(&r2);

    /* The same damage, seen by both: the header of the chunk after the gap. */
    chunk_at(f, d.phys)->payload_size += SHMB_ALIGN;
    memset(&w, 0, sizeof(w));
    w.data = f->data;
    memset(&o, 0, sizeof(o));
    assert_int_equal(ring_walk(&f->r, walk_record, &w, &werr), -EBADMSG);
    assert_int_equal(readopt(f, &r2, &o, &aerr), -EBADMSG);
    if (strncmp(aerr.message, werr.message, strlen(werr.message)) != 0 ||
        strstr(werr.message, "inconsistent chunk header at data offset 0") == NULL)
        fail_msg("walk: %s\nadopt: %s", werr.message, aerr.message);
    assert_int_equal(w.n, 2);
    for (i = 0; i < w.n; i++)
        assert_int_equal(o.ids[i], w.ids[i]);
    ring_fini(&r2);
    fix_free(f);
}

/* Free every live chunk of r (owners tag(id)) in the order given by
 * from_tail, checking the ring after each; it ends empty. */
static void free_all(struct ring *r, bool from_tail)
{
    size_t n = ring_count(r), i;
    uint64_t first = r->first_id;

    for (i = 0; i < n; i++) {
        uint64_t id = from_tail ? first + n - 1 - i : first + i;
        struct ring_chunk c;

        if (ring_at(r, (size_t)(id - r->first_id), &c) != NULL)
            assert_int_equal(ring_free(r, id), 0);
        assert_true(r->start <= r->end && r->end - r->start <= r->size);
    }
    assert_int_equal(ring_count(r), 0);
    assert_int_equal(ring_used(r), 0);
}

/* A writer that overruns its payload by one byte spoils the magic of the
 * next chunk's header: adoption skips that chunk only, resynchronising on
 * the next sound header, and keeps every chunk after it. The skipped bytes
 * are rewritten as a freed chunk (ids stay consecutive), reclaimed in their
 * turn; the ring ends where it ended, a second adoption finds the same
 * without complaint, and the ring empties whichever end it is freed from. Before resynchronisation every
 * chunk after the damaged one was dropped. */
static void test_adopt_resyncs_after_overrun(void **state)
{
    int pass;

    (void)state;
    for (pass = 0; pass < 2; pass++) {
        struct fix *f = fix_new(2048, true);
        struct shmb_error err = {0};
        struct ring_chunk c[8], x;
        struct offered o;
        struct ring r2, r3;
        int i;

        memset(&o, 0, sizeof(o));
        for (i = 0; i < 8; i++) /* 128 bytes each: 64 of header, 64 of payload */
            c[i] = alloc_ok(f, 64, "k", tag((uint64_t)i));
        for (i = 0; i < 8; i++)
            assert_int_equal(ring_set_state(&f->r, c[i].id, SHMB_CHUNK_COMMITTED), 0);
        /* A (c[2]) writes 65 bytes: the 65th is B's (c[3]) first magic byte. */
        memset(payload_of(f, &c[2]), 'a', 65);
        assert_int_not_equal(chunk_at(f, c[3].phys)->magic, SHMB_CHUNK_MAGIC);

        assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
        if (strstr(err.message, "bad chunk magic") == NULL ||
            strstr(err.message, "Skipped 128 damaged bytes in 1 place(s)") == NULL)
            fail_msg("unexpected message: %s", err.message);
        assert_int_equal(o.n, 7);
        for (i = 0; i < 7; i++)
            assert_int_equal(o.ids[i], c[i < 3 ? i : i + 1].id);
        assert_int_equal(ring_count(&r2), 8);
        assert_null(ring_at(&r2, 3, &x)); /* B: freed */
        assert_ptr_equal(ring_at(&r2, 4, &x), tag(c[4].id));
        assert_int_equal(x.phys, c[4].phys);
        assert_int_equal(r2.start, f->r.start);
        assert_int_equal(r2.end, f->r.end);
        assert_int_equal(r2.next_id, f->r.next_id);

        /* B's bytes were rewritten as a freed chunk with B's id: a second
         * restart finds the same, cleanly. */
        assert_int_equal(chunk_at(f, c[3].phys)->magic, SHMB_CHUNK_MAGIC);
        assert_int_equal(chunk_at(f, c[3].phys)->state, SHMB_CHUNK_FREE);
        assert_int_equal(chunk_at(f, c[3].phys)->id, c[3].id);
        assert_int_equal(chunk_at(f, c[3].phys)->chunk_size, 128);
        memset(&o, 0, sizeof(o));
        shmb_error_clear(&err);
        assert_int_equal(readopt(f, &r3, &o, &err), 0);
        assert_int_equal(o.n, 8);
        assert_int_equal(o.states[3], SHMB_CHUNK_FREE);
        assert_int_equal(r3.end, r2.end);
        ring_fini(&r3);

        free_all(&r2, pass == 1);
        /* Nothing left behind: a new chunk fills from the start. */
        assert_int_equal(ring_alloc(&r2, 1900, "z", 1, tag(9), &x, &err), 0);
        ring_fini(&r2);
        fix_free(f);
    }
}

/* An overrun over two headers loses both chunks: the bytes skipped become
 * two freed chunks with the lost ids, the chunks after are kept. A damaged
 * first chunk moves the start to the next sound one. A damaged tail gap
 * header loses nothing: the walk finds the next lap's first chunk. */
static void test_adopt_resyncs_over_several(void **state)
{
    struct fix *f = fix_new(2048, true);
    struct shmb_segment_header saved;
    struct shmb_error err = {0};
    struct ring_chunk c[6], x;
    struct offered o;
    struct ring r2;
    int i;

    (void)state;
    memset(&o, 0, sizeof(o));
    for (i = 0; i < 6; i++)
        c[i] = alloc_ok(f, 64, "k", tag((uint64_t)i));
    saved = f->cursor;
    chunk_at(f, c[2].phys)->magic = 0;
    chunk_at(f, c[3].phys)->magic = 0;
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    assert_int_equal(o.n, 4);
    assert_int_equal(o.ids[2], c[4].id);
    assert_int_equal(ring_count(&r2), 6);
    assert_int_equal(r2.end, f->r.end);
    assert_int_equal(r2.next_id, f->r.next_id);
    free_all(&r2, true);
    ring_fini(&r2);

    /* The first chunk damaged: the start moves to the next one. */
    f->cursor = saved; /* the freeing above emptied the mirrored cursor */
    chunk_at(f, c[2].phys)->magic = SHMB_CHUNK_MAGIC;
    chunk_at(f, c[3].phys)->magic = SHMB_CHUNK_MAGIC;
    chunk_at(f, c[0].phys)->magic = 0;
    memset(&o, 0, sizeof(o));
    shmb_error_clear(&err);
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    assert_int_equal(o.n, 5);
    assert_int_equal(o.ids[0], c[1].id);
    assert_int_equal(r2.start, c[1].phys);
    assert_int_equal(r2.end, f->r.end);
    assert_int_equal(r2.first_id, c[1].id);
    free_all(&r2, false);
    ring_fini(&r2);
    fix_free(f);

    /* A tail gap whose header is damaged. */
    f = fix_new(1024, true);
    memset(&o, 0, sizeof(o));
    c[0] = alloc_ok(f, 250, "a", tag(0)); /* 320 at 0 */
    c[1] = alloc_ok(f, 250, "b", tag(1)); /* 320 at 320 */
    c[2] = alloc_ok(f, 250, "c", tag(2)); /* 320 at 640; 64 left */
    assert_int_equal(ring_free(&f->r, c[0].id), 0);
    c[3] = alloc_ok(f, 100, "d", tag(3)); /* at 0, after a gap at 960 */
    assert_int_equal(c[3].phys, 0);
    chunk_at(f, 960)->magic = 0;
    shmb_error_clear(&err);
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    assert_int_equal(o.n, 3);
    assert_int_equal(ring_count(&r2), 3);
    assert_int_equal(r2.start, f->r.start);
    assert_int_equal(r2.end, f->r.end);
    free_all(&r2, true);
    assert_int_equal(ring_alloc(&r2, 900, "z", 1, tag(9), &x, &err), 0);
    ring_fini(&r2);
    fix_free(f);
}

/* A cursor whose next id no daemon could reach (a client wrote it, and the
 * chunk ids to match) adopts nothing: ids from there would wrap to 0 and
 * the ring could no longer find its chunks by id (a chunk allocated after
 * the wrap could not be committed or freed). Found by the adoption fuzzer:
 * before the fix such a ring was adopted, and the next restart dropped it
 * all as corrupt. */
static void test_adopt_refuses_huge_ids(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk c[2], x;
    struct offered o;
    struct ring r2;

    (void)state;
    memset(&o, 0, sizeof(o));
    c[0] = alloc_ok(f, 100, "k", tag(0));
    c[1] = alloc_ok(f, 100, "k", tag(1));
    chunk_at(f, c[0].phys)->id = UINT64_MAX - 2;
    chunk_at(f, c[1].phys)->id = UINT64_MAX - 1;
    f->cursor.ring_next_id = UINT64_MAX;
    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    if (strstr(err.message, "Corrupt ring cursor") == NULL ||
        strstr(err.message, "next id 18446744073709551615") == NULL)
        fail_msg("unexpected message: %s", err.message);
    assert_int_equal(o.n, 0);
    assert_int_equal(ring_count(&r2), 0);
    assert_int_equal(ring_alloc(&r2, 100, "z", 1, tag(7), &x, &err), 0);
    assert_int_equal(x.id, 0);
    assert_int_equal(ring_set_state(&r2, x.id, SHMB_CHUNK_COMMITTED), 0);
    assert_int_equal(ring_free(&r2, x.id), 0);
    ring_fini(&r2);
    fix_free(f);
}

/* Issue 10, item 1. When the walk stops at the first chunk of a new lap
 * (here a damaged header; a chunk still being written when the daemon died
 * does the same), the ring's end is the end of the last chunk adopted, not
 * the lap boundary after the skipped tail gap. Then freeing the newest
 * adopted chunk retracts the end to the chunk before it, and the next
 * allocation lands after that chunk, never over it. Before the fix the end
 * stayed at the lap boundary, the retraction moved it back to the start, and
 * the next allocation overwrote the live chunk z. */
static void test_adopt_end_after_stopped_lap(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk x0, z, a, b, c;
    struct offered o;
    struct ring r2;

    (void)state;
    memset(&o, 0, sizeof(o));
    x0 = alloc_ok(f, 400, "x", tag(0)); /* 512 bytes at 0 */
    z = alloc_ok(f, 100, "z", tag(1));  /* 192 bytes at 512 */
    a = alloc_ok(f, 100, "a", tag(2));  /* 192 bytes at 704 */
    assert_int_equal(ring_free(&f->r, x0.id), 0);
    b = alloc_ok(f, 250, "b", tag(3)); /* skips 128 bytes at 896, starts a lap */
    assert_int_equal(b.phys, 0);
    assert_int_equal(f->r.end, 1024 + 320);
    chunk_at(f, b.phys)->magic = 0x0badf00d;

    assert_int_equal(readopt(f, &r2, &o, &err), -EBADMSG);
    assert_int_equal(ring_count(&r2), 2);
    assert_int_equal(r2.start, z.phys);
    assert_int_equal(r2.end, a.phys + a.chunk_size);
    assert_int_equal(ring_used(&r2), z.chunk_size + a.chunk_size);
    assert_int_equal(f->cursor.ring_end, a.phys + a.chunk_size);

    /* The newest adopted object goes: its bytes come back, z's stay. */
    assert_int_equal(ring_free(&r2, a.id), 0);
    assert_int_equal(r2.end, z.phys + z.chunk_size);
    assert_int_equal(ring_used(&r2), z.chunk_size);
    assert_int_equal(ring_alloc(&r2, 100, "c", 1, tag(9), &c, &err), 0);
    assert_true(c.phys >= z.phys + z.chunk_size || c.phys + c.chunk_size <= z.phys);
    assert_int_equal(c.phys, a.phys);
    assert_int_equal(chunk_at(f, z.phys)->magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(ring_used(&r2) + ring_free_bytes(&r2), 1024);
    ring_fini(&r2);
    fix_free(f);
}

/* What adopt_scribble saw. */
struct scribble {
    struct fix *f;
    size_t n;
    size_t changed; /* calls whose hdr or key changed when the segment did */
};

/* ring_adopt callback of a hostile client's race: as soon as the chunk is
 * offered, rewrite its header and key in the segment (chunk size, key length,
 * header size, id, state, key bytes), then check that what the callback was
 * given did not change with it. */
static void *adopt_scribble(const struct shmb_chunk_header *hdr, const char *key,
                            uint64_t payload_offset, void *arg)
{
    struct scribble *s = arg;
    struct shmb_chunk_header seen = *hdr;
    struct shmb_chunk_header *live;
    char first = key[0];

    live = chunk_at(s->f, payload_offset - DATA_OFFSET - seen.header_size);
    live->chunk_size = UINT64_C(1) << 40;
    live->key_len = 200;
    live->header_size = 4096;
    live->id = 12345;
    live->payload_size = 7;
    live->state = SHMB_CHUNK_GAP;
    memset((char *)live + CHUNK_FIXED, 'Z', 1);
    if (memcmp(hdr, &seen, sizeof(seen)) != 0 || key[0] != first)
        s->changed++;
    s->n++;
    return tag(seen.id);
}

/* Issue 10, item 3. ring_adopt copies each chunk header and key once into
 * private memory, checks the copy and uses only the copy: a client that
 * rewrites the header in the segment right after the check (while the
 * callback runs) changes neither what the callback was given nor the
 * rebuilt ring (sizes, positions, payload offsets, used bytes). Before the
 * fix the callback got a pointer into the segment and ring_adopt read
 * chunk_size again after the check: the ring took a 1 TiB chunk. */
static void test_adopt_uses_private_copies(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct shmb_error err = {0};
    struct ring_chunk c[3], o1;
    struct scribble s = {f, 0, 0};
    uint64_t start, end, next_id;
    struct ring r2;
    int i;

    (void)state;
    for (i = 0; i < 3; i++)
        c[i] = alloc_ok(f, 100, "k", tag((uint64_t)i));
    start = f->cursor.ring_start;
    end = f->cursor.ring_end;
    next_id = f->cursor.ring_next_id;
    assert_int_equal(ring_init(&r2, f->data, DATA_OFFSET, f->size, &f->cursor, &err), 0);
    assert_int_equal(ring_adopt(&r2, start, end, next_id, adopt_scribble, &s, &err), 0);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.changed, 0);
    assert_int_equal(ring_count(&r2), 3);
    assert_int_equal(r2.end, c[2].phys + c[2].chunk_size);
    assert_int_equal(ring_used(&r2), 3 * c[0].chunk_size);
    for (i = 0; i < 3; i++) {
        assert_ptr_equal(ring_at(&r2, (size_t)i, &o1), tag(c[i].id));
        assert_int_equal(o1.phys, c[i].phys);
        assert_int_equal(o1.chunk_size, c[i].chunk_size);
        assert_int_equal(o1.payload_offset, c[i].payload_offset);
        assert_int_equal(o1.payload_size, 100);
    }
    assert_int_equal(ring_free(&r2, c[2].id), 0);
    assert_int_equal(r2.end, c[1].phys + c[1].chunk_size);
    ring_fini(&r2);
    fix_free(f);
}

/* Freeing the newest chunk gives its bytes back at once: the end retracts,
 * used drops, and the next allocation reuses its place and its id. Freeing
 * a chunk in the middle gives nothing back until the chunks around it go;
 * then a tail retraction takes the freed middle chunk with it. */
static void test_free_newest_retracts(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c, d;

    (void)state;
    a = alloc_ok(f, 100, "a", tag(0));
    b = alloc_ok(f, 100, "b", tag(1));
    c = alloc_ok(f, 100, "c", tag(2));
    assert_int_equal(ring_used(&f->r), 576);
    assert_int_equal(ring_free(&f->r, c.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 384);
    assert_int_equal(f->r.end, 384);
    assert_int_equal(ring_count(&f->r), 2);
    d = alloc_ok(f, 100, "d", tag(3));
    assert_int_equal(d.phys, c.phys);
    assert_int_equal(d.id, c.id);

    assert_int_equal(ring_free(&f->r, b.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 576);
    assert_int_equal(ring_count(&f->r), 3);
    assert_int_equal(ring_free(&f->r, d.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 192);
    assert_int_equal(f->r.end, 192);
    assert_int_equal(ring_count(&f->r), 1);
    assert_ptr_equal(ring_oldest(&f->r, NULL), tag(0));
    assert_int_equal(ring_free(&f->r, a.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 0);
    fix_free(f);
}

/* A committed chunk freed at the newest end gives its bytes back, all but a
 * remnant of RING_REMNANT bytes (a freed chunk without key, walkable) that
 * keeps its id: the next allocation gets a new id, so that no reader holding
 * the old one finds another object under it. A chunk never committed (an
 * abort) still gives its id back with its bytes. Reclaim from the head takes
 * the remnant in its turn, and an adoption walks over it. */
static void test_free_newest_committed_keeps_id(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c, d, e;
    const struct shmb_chunk_header *h;
    struct shmb_error err;

    (void)state;
    a = alloc_ok(f, 100, "a", tag(0));
    b = alloc_ok(f, 100, "b", tag(1));
    assert_int_equal(ring_set_state(&f->r, b.id, SHMB_CHUNK_COMMITTED), 0);
    assert_int_equal(ring_used(&f->r), 384);
    assert_int_equal(ring_free(&f->r, b.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 192 + RING_REMNANT);
    assert_int_equal(ring_count(&f->r), 2);
    h = chunk_at(f, b.phys);
    assert_int_equal(h->state, SHMB_CHUNK_FREE);
    assert_int_equal(h->id, b.id);
    assert_int_equal(h->key_len, 0);
    assert_int_equal(h->header_size, SHMB_ALIGN);
    assert_int_equal(h->chunk_size, RING_REMNANT);
    assert_int_equal(h->payload_size, RING_REMNANT - SHMB_ALIGN);
    c = alloc_ok(f, 100, "c", tag(2));
    assert_int_equal(c.id, b.id + 1);
    assert_int_equal(c.phys, b.phys + RING_REMNANT);
    assert_int_equal(ring_walk(&f->r, NULL, NULL, &err), 0);

    /* Never committed: its id and its bytes come back at once. */
    d = alloc_ok(f, 100, "d", tag(3));
    assert_int_equal(ring_free(&f->r, d.id), 0);
    e = alloc_ok(f, 100, "e", tag(4));
    assert_int_equal(e.id, d.id);
    assert_int_equal(e.phys, d.phys);

    /* The remnant goes with reclaim from the head, as any freed chunk. */
    assert_int_equal(ring_free(&f->r, a.id), 0);
    check_ring(f);
    assert_int_equal(ring_count(&f->r), 2);
    assert_ptr_equal(ring_oldest(&f->r, NULL), tag(2));
    assert_int_equal(f->r.first_id, c.id);
    fix_free(f);
}

/* A chunk never committed itself whose id readers saw (an arena whose client
 * handed out objects in it: ring_keep_id) keeps its id when it is freed at
 * the newest end, as a committed chunk does: the next allocation, at its
 * place, gets a new id. An unmarked one still gives its id back. */
static void test_keep_id_of_uncommitted(void **state)
{
    struct fix *f = fix_new(1024, true);
    struct ring_chunk a, b, c;

    (void)state;
    a = alloc_ok(f, 100, "a", tag(0));
    b = alloc_ok(f, 100, "b", tag(1));
    assert_int_equal(ring_keep_id(&f->r, b.id), 0);
    assert_int_equal(ring_free(&f->r, b.id), 0);
    check_ring(f);
    assert_int_equal(ring_used(&f->r), 192 + RING_REMNANT);
    c = alloc_ok(f, 100, "c", tag(2));
    assert_int_not_equal(c.id, b.id);
    assert_int_equal(c.phys, b.phys + RING_REMNANT);
    assert_int_equal(ring_keep_id(&f->r, b.id), -ENOENT); /* freed */
    assert_int_equal(ring_keep_id(&f->r, c.id + 5), -ENOENT);
    assert_int_equal(ring_free(&f->r, c.id), 0);
    assert_int_equal(ring_free(&f->r, a.id), 0);
    check_ring(f);
    fix_free(f);
}

/* A daemon killed while a client copies into a pending allocation: the
 * adoption drops the chunk, but the client (stopped, or just slow) writes on
 * when it runs again. The chunk's bytes must not go to the next allocation
 * at once (the late copy then lands in an object committed there since:
 * readers got bytes that were no payload put under the key); they stay
 * until reclaim reaches the chunk at the head. A committed chunk dropped by
 * the adoption (a key it cannot take) is given back as before. */
static void test_adopt_holds_pending_tail(void **state)
{
    struct fix *f = fix_new(4096, true);
    struct shmb_error err = {0};
    struct ring_chunk a, b, x;
    struct offered o;
    struct ring r2;

    (void)state;
    memset(&o, 0, sizeof(o));
    a = alloc_ok(f, 100, "a", tag(0));
    assert_int_equal(ring_set_state(&f->r, a.id, SHMB_CHUNK_COMMITTED), 0);
    b = alloc_ok(f, 1000, "b", tag(1)); /* pending: a client copies into it */
    o.refuse_mask = UINT64_C(1) << b.id; /* the store drops pending chunks */
    assert_int_equal(readopt(f, &r2, &o, &err), 0);
    assert_int_equal(ring_count(&r2), 2);
    assert_int_equal(r2.end, b.phys + b.chunk_size);
    assert_int_equal(ring_alloc(&r2, 1000, "c", 1, tag(2), &x, &err), 0);
    /* No byte of the new chunk inside the dropped one. */
    assert_true(x.phys >= b.phys + b.chunk_size || x.phys + x.chunk_size <= b.phys);
    /* Reclaim reaches it in its turn: freed at the head, it goes. */
    assert_int_equal(ring_free(&r2, a.id), 0);
    assert_int_equal(ring_count(&r2), 1);
    assert_ptr_equal(ring_oldest(&r2, NULL), tag(2));
    ring_fini(&r2);
    fix_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_size),
        cmocka_unit_test(test_keep_id_of_uncommitted),
        cmocka_unit_test(test_buffer_access),
        cmocka_unit_test(test_error_on_full_buffer),
        cmocka_unit_test(test_allocation_and_free),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_exact_fit),
        cmocka_unit_test(test_tail_gap_skipped),
        cmocka_unit_test(test_gap_behind_start_is_free),
        cmocka_unit_test(test_tail_gap_needs_room),
        cmocka_unit_test(test_allocation_cycles),
        cmocka_unit_test(test_allocation_cycles_gaps),
        cmocka_unit_test(test_free_out_of_order),
        cmocka_unit_test(test_reclaim_head_of_line),
        cmocka_unit_test(test_reclaim_stops_when_want_fits),
        cmocka_unit_test(test_walk_in_order),
        cmocka_unit_test(test_walk_after_wrap),
        cmocka_unit_test(test_walk_bad_magic),
        cmocka_unit_test(test_walk_size_past_end),
        cmocka_unit_test(test_walk_size_overflow),
        cmocka_unit_test(test_walk_size_unaligned),
        cmocka_unit_test(test_walk_size_zero),
        cmocka_unit_test(test_walk_bad_state),
        cmocka_unit_test(test_walk_header_size_too_big),
        cmocka_unit_test(test_walk_key_past_header),
        cmocka_unit_test(test_walk_payload_too_big),
        cmocka_unit_test(test_walk_id_not_increasing),
        cmocka_unit_test(test_walk_size_shrunk),
        cmocka_unit_test(test_cursor_mirror),
        cmocka_unit_test(test_invalid_inputs),
        cmocka_unit_test(test_reference_model),
        cmocka_unit_test(test_adopt_rebuilds_wrapped_ring),
        cmocka_unit_test(test_walk_and_adopt_agree),
        cmocka_unit_test(test_adopt_refused_chunks),
        cmocka_unit_test(test_adopt_stops_at_corrupt),
        cmocka_unit_test(test_adopt_resyncs_after_overrun),
        cmocka_unit_test(test_adopt_resyncs_over_several),
        cmocka_unit_test(test_adopt_refuses_huge_ids),
        cmocka_unit_test(test_adopt_end_after_stopped_lap),
        cmocka_unit_test(test_adopt_uses_private_copies),
        cmocka_unit_test(test_free_newest_retracts),
        cmocka_unit_test(test_free_newest_committed_keeps_id),
        cmocka_unit_test(test_adopt_holds_pending_tail),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
