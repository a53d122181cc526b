// SPDX-License-Identifier: Apache-2.0
/*
 * The reader's side of the catalog (proto/catalog.c) over a layout-2
 * segment built by hand in memory, no daemon: header, chunks with their
 * seals, catalog entries written as the daemon would. Hits, proven and
 * unproven misses, everything that must turn a read into -EAGAIN, hostile
 * entries (another key's chunk, offsets outside the data area or past the
 * mapping, which ends at a PROT_NONE page), the hash's known values and the
 * count of an awaited read.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../proto/catalog.h"
#include "../../proto/layout.h"

/* The synthetic segment: one header page, a data area, a catalog page. */
#define SEG_DATA (64u * 1024u)
#define SEG_SLOTS 64u
#define SEG_CATALOG_BYTES 4096u
#define SEG_SIZE (SHMB_HEADER_PAGE + SEG_DATA + SEG_CATALOG_BYTES)
#define SEG_CATALOG (SHMB_HEADER_PAGE + SEG_DATA)
#define SEG_SEED 0x12345678u

struct seg {
    unsigned char *map;  /* SEG_SIZE bytes, then a PROT_NONE page */
    size_t mapped;       /* with the guard page */
    struct shmb_catalog_view v;
    uint64_t next_chunk; /* where the next chunk goes */
};

static struct shmb_segment_header *seg_hdr(struct seg *s)
{
    return (struct shmb_segment_header *)(void *)s->map;
}

static struct shmb_catalog_entry *seg_entry(struct seg *s, uint64_t slot)
{
    return (struct shmb_catalog_entry *)(void *)(s->map + SEG_CATALOG) + (slot & (SEG_SLOTS - 1));
}

static struct shmb_chunk_header *seg_chunk(struct seg *s, uint64_t chunk)
{
    return (struct shmb_chunk_header *)(void *)(s->map + chunk);
}

static int seg_setup(void **state)
{
    struct seg *s = calloc(1, sizeof(*s));
    long page = sysconf(_SC_PAGESIZE);
    struct shmb_segment_header *h;

    assert_non_null(s);
    s->mapped = SEG_SIZE + (size_t)page;
    s->map = mmap(NULL, s->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(s->map != MAP_FAILED);
    assert_int_equal(SEG_SIZE % (size_t)page, 0);
    assert_int_equal(mprotect(s->map + SEG_SIZE, (size_t)page, PROT_NONE), 0);
    h = seg_hdr(s);
    h->magic = SHMB_SEGMENT_MAGIC;
    h->version = SHMB_LAYOUT_VERSION;
    h->header_size = SHMB_HEADER_PAGE;
    h->total_size = SEG_SIZE;
    h->data_offset = SHMB_HEADER_PAGE;
    h->data_size = SEG_DATA;
    h->catalog_offset = SEG_CATALOG;
    h->catalog_slots = SEG_SLOTS;
    h->catalog_seed = SEG_SEED;
    h->gen_next = 1;
    s->v.base = s->map;
    s->v.map_size = SEG_SIZE;
    s->v.data_offset = SHMB_HEADER_PAGE;
    s->v.data_size = SEG_DATA;
    s->v.catalog_offset = SEG_CATALOG;
    s->v.catalog_slots = SEG_SLOTS;
    s->v.seed = SEG_SEED;
    s->next_chunk = SHMB_HEADER_PAGE;
    *state = s;
    return 0;
}

static int seg_teardown(void **state)
{
    struct seg *s = *state;

    munmap(s->map, s->mapped);
    free(s);
    return 0;
}

/* The byte i of key's payload: differs per key and per position. */
static unsigned char pat(const char *key, size_t i)
{
    return (unsigned char)(key[0] * 31u + strlen(key) * 7u + i * 13u + (i >> 8));
}

/* Lay out a committed chunk of key with size payload bytes (the pattern),
 * sealed with gen, at the next free place; returns its offset. */
static uint64_t seg_put(struct seg *s, const char *key, uint64_t size, uint32_t gen)
{
    size_t len = strlen(key), i;
    uint64_t at = s->next_chunk, hsize = SHMB_CHUNK_HEADER_SIZE(len);
    struct shmb_chunk_header *ch = seg_chunk(s, at);

    assert_true(at + SHMB_CHUNK_SIZE(len, size) <= SHMB_HEADER_PAGE + SEG_DATA);
    ch->magic = SHMB_CHUNK_MAGIC;
    ch->state = SHMB_CHUNK_COMMITTED;
    ch->key_len = (uint16_t)len;
    ch->header_size = (uint32_t)hsize;
    ch->id = at;
    ch->chunk_size = SHMB_CHUNK_SIZE(len, size);
    ch->payload_size = size;
    ch->seal = SHMB_SEAL(gen, 0);
    memcpy(ch + 1, key, len);
    for (i = 0; i < size; i++)
        s->map[at + hsize + i] = pat(key, i);
    s->next_chunk = at + ch->chunk_size;
    return at;
}

static uint64_t key_hash(const char *key)
{
    return shmb_catalog_hash(SEG_SEED, key, strlen(key));
}

/* Write the entry at slot as the daemon does (seq left even). */
static void seg_entry_write(struct seg *s, uint64_t slot, uint32_t tag, uint64_t chunk,
                            uint32_t gen, uint64_t size, uint32_t flags)
{
    struct shmb_catalog_entry *e = seg_entry(s, slot);

    e->seq += 2;
    e->hash = tag;
    e->chunk = chunk;
    e->gen = gen;
    e->flags = flags;
    e->size = size;
}

/* List key -> chunk at the first empty slot from its home; returns the slot. */
static uint64_t seg_list(struct seg *s, const char *key, uint64_t chunk, uint32_t gen,
                         uint64_t size, uint32_t flags)
{
    uint64_t h = key_hash(key), p;

    for (p = 0; p < SHMB_CATALOG_PROBES; p++)
        if (seg_entry(s, h + p)->chunk == 0)
            break;
    assert_true(p < SHMB_CATALOG_PROBES);
    seg_entry_write(s, h + p, (uint32_t)(h >> 32), chunk, gen, size, flags);
    return (h + p) & (SEG_SLOTS - 1);
}

/* Put and list key (size bytes, generation gen); returns the chunk. */
static uint64_t seg_add(struct seg *s, const char *key, uint64_t size, uint32_t gen)
{
    uint64_t chunk = seg_put(s, key, size, gen);

    seg_list(s, key, chunk, gen, size, 0);
    return chunk;
}

static int rd(struct seg *s, const char *key, void *buf, size_t cap, struct shmb_catalog_hit *hit)
{
    return shmb_catalog_read(&s->v, key, strlen(key), buf, cap, hit);
}

static void assert_pattern(const char *key, const unsigned char *buf, size_t size)
{
    size_t i;

    for (i = 0; i < size; i++)
        if (buf[i] != pat(key, i))
            fail_msg("byte %zu of '%s' is %u, not %u", i, key, buf[i], pat(key, i));
}

/* The hash's known values, computed independently (a Python one-liner of
 * the contract's formula): the Python client is held to the same. */
static void test_hash_vectors(void **state)
{
    unsigned char all[255];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(all); i++)
        all[i] = (unsigned char)(i + 1);
    assert_true(shmb_catalog_hash(0, "", 0) == UINT64_C(0xfdbdf6ac4fc52e7f));
    assert_true(shmb_catalog_hash(0, "a", 1) == UINT64_C(0x2ef7d1316eb86f71));
    assert_true(shmb_catalog_hash(0, "hello", 5) == UINT64_C(0x5c04f5d5dc8eb1e2));
    assert_true(shmb_catalog_hash(0x12345678u, "hello", 5) == UINT64_C(0x611807ba437ab1ad));
    assert_true(shmb_catalog_hash(0xdeadbeefu, "key-0001", 8) == UINT64_C(0xef24b8e6bc1c7045));
    assert_true(shmb_catalog_hash(1, (const char *)all, sizeof(all)) ==
                UINT64_C(0xd861666d7a5e9d24));
}

/* A listed key is copied exactly, with its chunk, size, generation and
 * flags; a key of another size beside it too. */
static void test_hit(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[5000];
    uint64_t a = seg_add(s, "alpha", 100, 7), b = seg_put(s, "bravo", 4096, 8);

    seg_list(s, "bravo", b, 8, 4096, SHMB_CATALOG_AWAITED);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_pattern("alpha", buf, 100);
    assert_int_equal(buf[100], 0); /* nothing past the payload */
    assert_int_equal(hit.chunk, a);
    assert_int_equal(hit.size, 100);
    assert_int_equal(hit.gen, 7);
    assert_int_equal(hit.flags, 0);
    assert_int_equal(rd(s, "bravo", buf, 4096, &hit), 0);
    assert_pattern("bravo", buf, 4096);
    assert_int_equal(hit.chunk, b);
    assert_int_equal(hit.flags, SHMB_CATALOG_AWAITED);
}

/* A key that is not listed, with a quiet table listing everything: a
 * proven miss. */
static void test_miss(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[64];

    seg_add(s, "alpha", 100, 7);
    memset(buf, 0xaa, sizeof(buf));
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -ENOENT);
    assert_int_equal(hit.size, 0);
    assert_int_equal(buf[0], 0xaa);
}

/* While the daemon moves entries (catalog_moves odd) nothing is proven:
 * a miss, and even a hit, go to the daemon. */
static void test_moves_odd(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];

    seg_add(s, "alpha", 100, 7);
    seg_hdr(s)->catalog_moves = 3;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    seg_hdr(s)->catalog_moves = 4;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -ENOENT);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
}

/* Objects the catalog could not list: a miss proves nothing, a hit is
 * still a hit. */
static void test_unlisted(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];

    seg_add(s, "alpha", 100, 7);
    seg_hdr(s)->catalog_unlisted = 1;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_pattern("alpha", buf, 100);
    seg_hdr(s)->catalog_unlisted = 0;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -ENOENT);
    /* A daemon restarted on the segment with another table (seed, place or
     * size): a miss in the view's table proves nothing, hits still check. */
    seg_hdr(s)->catalog_seed ^= 1;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    seg_hdr(s)->catalog_seed ^= 1;
    seg_hdr(s)->catalog_slots *= 2;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -EAGAIN);
    seg_hdr(s)->catalog_slots /= 2;
    assert_int_equal(rd(s, "nothing", buf, sizeof(buf), &hit), -ENOENT);
}

/* An entry being written (odd seq) is waited for a few looks, then the
 * read leaves it to the daemon. */
static void test_entry_odd(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t slot;

    seg_put(s, "alpha", 100, 7);
    slot = seg_list(s, "alpha", SHMB_HEADER_PAGE, 7, 100, 0);
    seg_entry(s, slot)->seq++;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    seg_entry(s, slot)->seq++;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
}

/* The chunk's seal no longer has the entry's generation (the object went,
 * its bytes may be reused), or is not committed: not a hit, and the miss
 * is not proven either. */
static void test_seal_changed(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t a = seg_add(s, "alpha", 100, 7);

    memset(buf, 0xaa, sizeof(buf));
    seg_chunk(s, a)->seal = SHMB_SEAL(0, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    seg_chunk(s, a)->seal = SHMB_SEAL(8, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(buf[0], 0xaa);
    /* Awaited reads counted in the seal change nothing. */
    seg_chunk(s, a)->seal = SHMB_SEAL(7, 5);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    seg_chunk(s, a)->state = SHMB_CHUNK_FREE;
    memset(buf, 0xaa, sizeof(buf));
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(buf[0], 0xaa);
}

/* A hostile entry listing key "alpha" (its tag, the right generation and
 * size) at the chunk of "bravo", whose key has the same length, or at one
 * whose key is longer: the bytes of bravo are never returned. */
static void test_other_keys_chunk(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t b = seg_put(s, "bravo", 100, 9), c = seg_put(s, "charlie", 100, 9);
    uint64_t home = key_hash("alpha");

    memset(buf, 0xaa, sizeof(buf));
    seg_entry_write(s, home, (uint32_t)(home >> 32), b, 9, 100, 0);
    assert_int_not_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    seg_entry_write(s, home, (uint32_t)(home >> 32), c, 9, 100, 0);
    assert_int_not_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_int_equal(buf[0], 0xaa);
    assert_int_equal(buf[99], 0xaa);
    /* A key of the same bytes but one byte shorter: "alph" in the chunk. */
    c = seg_put(s, "alph", 100, 9);
    seg_entry_write(s, home, (uint32_t)(home >> 32), c, 9, 100, 0);
    assert_int_not_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_int_equal(buf[0], 0xaa);
    /* The entry's size larger than the chunk's payload: it would copy the
     * next chunk's bytes. */
    c = seg_put(s, "alpha", 64, 9);
    seg_entry_write(s, home, (uint32_t)(home >> 32), c, 9, 128, 0);
    assert_int_not_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_int_equal(buf[0], 0xaa);
    /* The same chunk with the right size: the read works. */
    seg_entry_write(s, home, (uint32_t)(home >> 32), c, 9, 64, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_pattern("alpha", buf, 64);
}

/* Entries pointing outside the data area (the header page, the catalog,
 * past the mapping, misaligned, overflowing sizes): no crash (the page
 * after the mapping is PROT_NONE) and no hit. */
static void test_out_of_bounds(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[256];
    uint64_t home = key_hash("alpha"), last;
    const struct {
        uint64_t chunk, size;
    } bad[] = {
        {0x40, 64},                             /* in the header page */
        {SEG_CATALOG, 64},                      /* the catalog itself */
        {SEG_SIZE, 64},                         /* the guard page */
        {SEG_SIZE + 4096, 64},                  /* beyond it */
        {UINT64_MAX - 63, 64},                  /* wraps around */
        {SHMB_HEADER_PAGE + 8, 64},             /* misaligned */
        {SHMB_HEADER_PAGE, UINT64_MAX - 100},   /* size overflows */
        {SHMB_HEADER_PAGE, SEG_DATA},           /* payload runs past the data area */
        {SHMB_HEADER_PAGE + SEG_DATA - 64, 64}, /* header fits, payload does not */
        {SHMB_HEADER_PAGE, 0},                  /* empty */
    };
    size_t i;

    seg_put(s, "alpha", 64, 9);
    /* A chunk of key alpha in the data area's last bytes, so that only the
     * payload bound stops the read there. */
    s->next_chunk = SHMB_HEADER_PAGE + SEG_DATA - SHMB_CHUNK_SIZE(5, 64);
    last = seg_put(s, "alpha", 64, 9);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(buf, 0xaa, sizeof(buf));
        seg_entry_write(s, home, (uint32_t)(home >> 32), bad[i].chunk, 9, bad[i].size, 0);
        if (rd(s, "alpha", buf, sizeof(buf), &hit) == 0)
            fail_msg("entry %zu (chunk %llu, size %llu) made a hit", i,
                     (unsigned long long)bad[i].chunk, (unsigned long long)bad[i].size);
        assert_int_equal(buf[0], 0xaa);
    }
    /* The last chunk's own header claims 128 bytes too: only the data
     * area's end stops the copy. */
    seg_chunk(s, last)->payload_size = 128;
    seg_entry_write(s, home, (uint32_t)(home >> 32), last, 9, 128, 0);
    memset(buf, 0xaa, sizeof(buf));
    assert_int_not_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_int_equal(buf[0], 0xaa);
    seg_chunk(s, last)->payload_size = 64;
    seg_entry_write(s, home, (uint32_t)(home >> 32), last, 9, 64, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_pattern("alpha", buf, 64);
}

/* A view that does not hang together (no catalog, slots not a power of
 * two, a table past the mapping): -EAGAIN, nothing read. */
static void test_bad_view(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_view good = s->v;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];

    seg_add(s, "alpha", 100, 7);
    s->v.catalog_slots = 0;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v.catalog_slots = 48;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v = good;
    s->v.catalog_slots = 256; /* 8 KiB from the catalog: past the mapping */
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v = good;
    s->v.catalog_offset = SEG_CATALOG + 8;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v = good;
    s->v.data_size = SEG_DATA + 64; /* the data area would overlap the catalog */
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v = good;
    s->v.base = NULL;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    s->v = good;
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
}

/* A buffer too small: -ENOBUFS with the size needed, nothing copied. */
static void test_nobufs(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[100];

    seg_add(s, "alpha", 100, 7);
    memset(buf, 0xaa, sizeof(buf));
    assert_int_equal(rd(s, "alpha", buf, 99, &hit), -ENOBUFS);
    assert_int_equal(hit.size, 100);
    assert_int_equal(buf[0], 0xaa);
    assert_int_equal(rd(s, "alpha", NULL, 0, &hit), -ENOBUFS);
    assert_int_equal(hit.size, 100);
    assert_int_equal(rd(s, "alpha", buf, 100, &hit), 0);
}

/* The probe looks SHMB_CATALOG_PROBES entries from the home and no
 * further: a key at the last of them is found, one past it is not (and
 * a full probe proves no miss). */
static void test_probe_bound(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t h = key_hash("alpha"), a = seg_put(s, "alpha", 100, 7), p;

    /* Occupied entries of other tags from the home on. */
    for (p = 0; p < SHMB_CATALOG_PROBES - 1; p++)
        seg_entry_write(s, h + p, (uint32_t)(h >> 32) ^ 1u, a, 7, 100, 0);
    seg_entry_write(s, h + SHMB_CATALOG_PROBES - 1, (uint32_t)(h >> 32), a, 7, 100, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    seg_entry_write(s, h + SHMB_CATALOG_PROBES - 1, (uint32_t)(h >> 32) ^ 1u, a, 7, 100, 0);
    seg_entry_write(s, h + SHMB_CATALOG_PROBES, (uint32_t)(h >> 32), a, 7, 100, 0);
    memset(buf, 0xaa, sizeof(buf));
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    assert_int_equal(buf[0], 0xaa);
}

/* A table every slot of which is taken: the probe stops after its bound
 * and wraps around the table's end. */
static void test_probe_wraps(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t h = key_hash("alpha"), a = seg_put(s, "alpha", 100, 7), p;

    for (p = 0; p < SEG_SLOTS; p++)
        seg_entry_write(s, p, 0, a, 7, 100, 0);
    s->v.catalog_slots = 16; /* fewer slots than the probe's length */
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), -EAGAIN);
    seg_entry_write(s, (h + 15) & 15, (uint32_t)(h >> 32), a, 7, 100, 0);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
}

/* An awaited read counts itself in the seal while the generation holds,
 * keeps the generation, and counts nothing once it changed; a count at
 * its maximum stays there. */
static void test_count_read(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[128];
    uint64_t a = seg_put(s, "alpha", 100, 7);

    seg_list(s, "alpha", a, 7, 100, SHMB_CATALOG_AWAITED);
    assert_int_equal(rd(s, "alpha", buf, sizeof(buf), &hit), 0);
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), 0);
    assert_true(seg_chunk(s, a)->seal == SHMB_SEAL(7, 1));
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), 0);
    assert_true(seg_chunk(s, a)->seal == SHMB_SEAL(7, 2));
    seg_chunk(s, a)->seal = SHMB_SEAL(8, 2);
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), -ESTALE);
    assert_true(seg_chunk(s, a)->seal == SHMB_SEAL(8, 2));
    seg_chunk(s, a)->seal = 0;
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), -ESTALE);
    assert_true(seg_chunk(s, a)->seal == 0);
    seg_chunk(s, a)->seal = SHMB_SEAL(7, UINT32_MAX);
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), 0);
    assert_true(seg_chunk(s, a)->seal == SHMB_SEAL(7, UINT32_MAX));
    /* A hit outside the view counts nothing. */
    hit.chunk = SEG_SIZE;
    assert_int_equal(shmb_catalog_count_read(&s->v, &hit), -EINVAL);
}

/* Several keys sharing a home: each found past the others, a miss after
 * them proven. */
static void test_collisions(void **state)
{
    struct seg *s = *state;
    struct shmb_catalog_hit hit;
    unsigned char buf[256];
    char key[16];
    int i, n = 0;

    /* 40 keys in 64 slots: homes collide. */
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        seg_add(s, key, 64 + (uint64_t)i, (uint32_t)i + 1);
    }
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(rd(s, key, buf, sizeof(buf), &hit), 0);
        assert_int_equal(hit.size, 64 + i);
        assert_pattern(key, buf, hit.size);
        n++;
    }
    assert_int_equal(n, 40);
    assert_int_equal(rd(s, "k40", buf, sizeof(buf), &hit), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_vectors),
        cmocka_unit_test_setup_teardown(test_hit, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_miss, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_moves_odd, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_unlisted, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_entry_odd, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_seal_changed, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_other_keys_chunk, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_out_of_bounds, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_bad_view, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_nobufs, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_probe_bound, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_probe_wraps, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_count_read, seg_setup, seg_teardown),
        cmocka_unit_test_setup_teardown(test_collisions, seg_setup, seg_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
