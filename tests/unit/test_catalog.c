// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the catalog's writer (daemon/catalog.c) over a segment laid
 * out in plain memory: listing, the probe bound, backward-shift deletion
 * under catalog_moves, sequence counts, generations and the heartbeat; and a
 * reader that follows PROTOCOL.md section 10 step by step finds every listed
 * key with its bytes. Links catalog.o, segment.o (guarded atomics) and proto.
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

#include "../../daemon/catalog.h"
#include "../../proto/catalog.h"
#include "layout.h"
#include "segment.h"

#define SEG_SIZE (256u * 1024u)

/* A segment in memory: header page, data area, catalog (segment_plan). */
struct cfix {
    unsigned char *base;
    struct shmb_segment_header *hdr;
    struct segment_plan plan;
    struct catalog *cat;
    uint64_t next_chunk; /* where the next chunk goes in the data area */
};

static struct cfix *cfix_new(uint64_t max_objects)
{
    struct shmb_error err = {0};
    struct cfix *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->base = aligned_alloc(SHMB_HEADER_PAGE, SEG_SIZE);
    assert_non_null(f->base);
    memset(f->base, 0x5a, SEG_SIZE); /* a reused table: catalog_new must empty it */
    f->hdr = (struct shmb_segment_header *)f->base;
    segment_plan(SEG_SIZE, SHMB_HEADER_PAGE, max_objects, &f->plan);
    f->cat = catalog_new(f->base, f->plan.catalog_offset, f->plan.catalog_slots, 0x1234567,
                         f->hdr, &err);
    if (f->cat == NULL)
        fail_msg("catalog_new: %s", err.message);
    f->next_chunk = SHMB_HEADER_PAGE;
    return f;
}

static void cfix_free(struct cfix *f)
{
    catalog_free(f->cat);
    free(f->base);
    free(f);
}

/* The catalog's hash gives the values computed apart from it (the algorithm
 * of PROTOCOL.md section 10), so that readers find the homes the daemon used. */
static void test_hash_values(void **state)
{
    (void)state;
    assert_int_equal(shmb_catalog_hash(0, "a", 1), UINT64_C(0x2ef7d1316eb86f71));
    assert_int_equal(shmb_catalog_hash(0x1234567, "key-1", 5), UINT64_C(0xc025d07e44c9b521));
    assert_int_equal(shmb_catalog_hash(0, "", 0), UINT64_C(0xfdbdf6ac4fc52e7f));
}

/* Lay a committed chunk for key with a payload of size bytes of fill, seal
 * gen; returns its offset. */
static uint64_t put_chunk(struct cfix *f, const char *key, uint64_t size, unsigned char fill,
                          uint32_t gen)
{
    size_t len = strlen(key);
    uint64_t at = f->next_chunk, chunk = SHMB_CHUNK_SIZE(len, size);
    struct shmb_chunk_header h = {.magic = SHMB_CHUNK_MAGIC,
                                  .state = SHMB_CHUNK_COMMITTED,
                                  .key_len = (uint16_t)len,
                                  .header_size = (uint32_t)SHMB_CHUNK_HEADER_SIZE(len),
                                  .chunk_size = chunk,
                                  .payload_size = size,
                                  .seal = SHMB_SEAL(gen, 0)};

    assert_true(at + chunk <= SHMB_HEADER_PAGE + f->plan.data_size);
    memcpy(f->base + at, &h, sizeof(h));
    memcpy(f->base + at + sizeof(h), key, len);
    memset(f->base + at + SHMB_CHUNK_HEADER_SIZE(len), fill, size);
    f->next_chunk += chunk;
    return at;
}

/* A reader of the mapping, step by step as PROTOCOL.md section 10 says
 * (single-threaded here, so a torn entry is a failure, not a retry). */
static int test_read(const struct cfix *f, const char *key, void *buf, size_t cap,
                     uint64_t *size_out, uint32_t *gen_out)
{
    const struct shmb_segment_header *hdr = f->hdr;
    const struct shmb_catalog_entry *table =
        (const struct shmb_catalog_entry *)(f->base + f->plan.catalog_offset);
    uint64_t slots = f->plan.catalog_slots, h, p, seal;
    size_t len = strlen(key);
    uint32_t m1, m2;

    if (slots == 0)
        return -EAGAIN;
    m1 = __atomic_load_n(&hdr->catalog_moves, __ATOMIC_ACQUIRE);
    if (m1 & 1)
        return -EAGAIN;
    h = shmb_catalog_hash(0x1234567, key, len);
    for (p = 0; p < SHMB_CATALOG_PROBES; p++) {
        const struct shmb_catalog_entry *e = &table[(h + p) & (slots - 1)];
        uint32_t s1 = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE), s2, tag, gen;
        uint64_t chunk, esize;
        struct shmb_chunk_header ch;

        assert_int_equal(s1 & 1, 0);
        chunk = __atomic_load_n(&e->chunk, __ATOMIC_RELAXED);
        if (chunk == 0)
            break;
        tag = __atomic_load_n(&e->hash, __ATOMIC_RELAXED);
        gen = __atomic_load_n(&e->gen, __ATOMIC_RELAXED);
        esize = __atomic_load_n(&e->size, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
        assert_int_equal(s1, s2);
        if (tag != (uint32_t)(h >> 32))
            continue;
        if (chunk < SHMB_HEADER_PAGE || chunk % SHMB_ALIGN != 0 || esize == 0 ||
            chunk + SHMB_CHUNK_HEADER_SIZE(len) + esize > SHMB_HEADER_PAGE + f->plan.data_size)
            continue;
        memcpy(&ch, f->base + chunk, sizeof(ch));
        seal = __atomic_load_n((const uint64_t *)(f->base + chunk +
                                                  offsetof(struct shmb_chunk_header, seal)),
                               __ATOMIC_ACQUIRE);
        if (SHMB_SEAL_GEN(seal) != gen || gen == 0 || ch.state != SHMB_CHUNK_COMMITTED ||
            ch.key_len != len || memcmp(f->base + chunk + sizeof(ch), key, len) != 0)
            continue;
        if (esize > cap)
            return -ENOBUFS;
        memcpy(buf, f->base + chunk + SHMB_CHUNK_HEADER_SIZE(len), esize);
        *size_out = esize;
        *gen_out = gen;
        return 0;
    }
    m2 = __atomic_load_n(&hdr->catalog_moves, __ATOMIC_ACQUIRE);
    if (m1 != m2 || __atomic_load_n(&hdr->catalog_unlisted, __ATOMIC_ACQUIRE) != 0)
        return -EAGAIN;
    return -ENOENT;
}

/* Find count keys "<prefix>N" whose home slot is the same as the first's. */
static void same_home_keys(const struct cfix *f, const char *prefix, char keys[][32],
                           size_t count)
{
    uint64_t mask = f->plan.catalog_slots - 1, home = 0;
    size_t n = 0;
    unsigned i;

    for (i = 0; n < count; i++) {
        char key[32];
        uint64_t h;

        snprintf(key, sizeof(key), "%s%u", prefix, i);
        h = shmb_catalog_hash(0x1234567, key, strlen(key));
        if (n == 0)
            home = h & mask;
        if ((h & mask) == home)
            memcpy(keys[n++], key, sizeof(key));
    }
}

/* Every key listed is found by a reader, with its bytes and generation; a
 * key never listed is an authoritative miss; the table starts empty even
 * over a buffer full of garbage. */
static void test_add_and_read(void **state)
{
    struct cfix *f = cfix_new(0);
    unsigned char buf[512];
    uint64_t size;
    uint32_t gen;
    unsigned i;

    (void)state;
    assert_int_equal(f->plan.catalog_slots, 128); /* 256 KiB / 2 KiB */
    for (i = 0; i < 60; i++) {
        char key[32];

        snprintf(key, sizeof(key), "key-%u", i);
        assert_int_equal(
            catalog_add(f->cat, key, strlen(key),
                        put_chunk(f, key, 100 + i, (unsigned char)i, 1000 + i), 1000 + i,
                        100 + i, 0, NULL, NULL),
            0);
    }
    assert_int_equal(catalog_listed(f->cat), 60);
    for (i = 0; i < 60; i++) {
        char key[32];

        snprintf(key, sizeof(key), "key-%u", i);
        assert_int_equal(test_read(f, key, buf, sizeof(buf), &size, &gen), 0);
        assert_int_equal(size, 100 + i);
        assert_int_equal(gen, 1000 + i);
        assert_int_equal(buf[0], (unsigned char)i);
        assert_int_equal(buf[size - 1], (unsigned char)i);
    }
    assert_int_equal(test_read(f, "absent", buf, sizeof(buf), &size, &gen), -ENOENT);
    assert_int_equal(test_read(f, "key-3", buf, 10, &size, &gen), -ENOBUFS);
    cfix_free(f);
}

/* Deleting the first of three keys with the same home shifts the two after
 * it back one slot each (no tombstone), inside one odd/even step of
 * catalog_moves, and readers still find both; every entry's sequence count
 * is even after the writes. */
static void test_remove_shifts(void **state)
{
    struct cfix *f = cfix_new(0);
    const struct shmb_catalog_entry *table =
        (const struct shmb_catalog_entry *)(f->base + f->plan.catalog_offset);
    char keys[3][32];
    uint64_t chunks[3], home, size, i;
    unsigned char buf[64];
    uint32_t gen, moves;

    (void)state;
    same_home_keys(f, "k", keys, 3);
    for (i = 0; i < 3; i++) {
        chunks[i] = put_chunk(f, keys[i], 10, 'a' + (unsigned char)i, (uint32_t)i + 1);
        assert_int_equal(catalog_add(f->cat, keys[i], strlen(keys[i]), chunks[i],
                                     (uint32_t)i + 1, 10, 0, NULL, NULL),
                         0);
    }
    home = shmb_catalog_hash(0x1234567, keys[0], strlen(keys[0])) & (f->plan.catalog_slots - 1);
    assert_int_equal(table[home].chunk, chunks[0]);
    assert_int_equal(table[(home + 2) % f->plan.catalog_slots].chunk, chunks[2]);
    /* catalog_new moved it past what the header held (0x5a5a5a5a), even. */
    moves = f->hdr->catalog_moves;
    assert_int_equal(moves, 0x5a5a5a5a + 2);
    catalog_remove(f->cat, keys[0], strlen(keys[0]), chunks[0], true);
    assert_int_equal(f->hdr->catalog_moves, moves + 2); /* odd while moving, even after */
    assert_int_equal(catalog_shifts(f->cat), 2);
    assert_int_equal(table[home].chunk, chunks[1]);
    assert_int_equal(table[(home + 1) % f->plan.catalog_slots].chunk, chunks[2]);
    assert_int_equal(table[(home + 2) % f->plan.catalog_slots].chunk, 0);
    assert_int_equal(catalog_listed(f->cat), 2);
    for (i = 0; i < f->plan.catalog_slots; i++)
        assert_int_equal(table[i].seq % 2, 0);
    /* home was written twice: its add, then the shift into it. */
    assert_int_equal(table[home].seq, 4);
    assert_int_equal(test_read(f, keys[0], buf, sizeof(buf), &size, &gen), -ENOENT);
    assert_int_equal(test_read(f, keys[1], buf, sizeof(buf), &size, &gen), 0);
    assert_int_equal(buf[0], 'b');
    assert_int_equal(test_read(f, keys[2], buf, sizeof(buf), &size, &gen), 0);
    assert_int_equal(buf[0], 'c');
    cfix_free(f);
}

/* A key with no free entry within SHMB_CATALOG_PROBES of its home is not
 * listed: -ENOSPC, counted in catalog_unlisted (header too), which makes
 * every miss -EAGAIN until it goes. */
static void test_probe_bound_unlisted(void **state)
{
    struct cfix *f = cfix_new(0);
    char keys[SHMB_CATALOG_PROBES + 1][32];
    unsigned char buf[64];
    uint64_t size, chunk = 0;
    uint32_t gen;
    unsigned i;

    (void)state;
    same_home_keys(f, "p", keys, SHMB_CATALOG_PROBES + 1);
    for (i = 0; i < SHMB_CATALOG_PROBES; i++)
        assert_int_equal(catalog_add(f->cat, keys[i], strlen(keys[i]),
                                     put_chunk(f, keys[i], 8, 'x', i + 1), i + 1, 8, 0,
                                     NULL, NULL),
                         0);
    chunk = put_chunk(f, keys[i], 8, 'y', 99);
    assert_int_equal(
        catalog_add(f->cat, keys[i], strlen(keys[i]), chunk, 99, 8, 0, NULL, NULL),
        -ENOSPC);
    assert_int_equal(catalog_unlisted(f->cat), 1);
    assert_int_equal(f->hdr->catalog_unlisted, 1);
    assert_int_equal(test_read(f, "absent", buf, sizeof(buf), &size, &gen), -EAGAIN);
    catalog_remove(f->cat, keys[i], strlen(keys[i]), chunk, false);
    assert_int_equal(catalog_unlisted(f->cat), 0);
    assert_int_equal(f->hdr->catalog_unlisted, 0);
    assert_int_equal(test_read(f, "absent", buf, sizeof(buf), &size, &gen), -ENOENT);
    cfix_free(f);
}

/* A key whose window is full, added with somewhere to hand back what it
 * displaces, takes the entry of the oldest listing there (the lowest
 * generation): it is read in place, the displaced key is counted unlisted
 * (its reads, and every miss, go to the daemon: -EAGAIN) and its owner is
 * handed back; the others stay. Unlisting it (catalog_remove(..., false))
 * brings the count back, and the new key is removed as any other. */
static void test_full_window_displaces_oldest(void **state)
{
    struct cfix *f = cfix_new(0);
    char keys[SHMB_CATALOG_PROBES + 1][32];
    uint64_t chunks[SHMB_CATALOG_PROBES + 1], size;
    unsigned char buf[64];
    void *displaced = NULL;
    uint32_t gen;
    unsigned i;

    (void)state;
    same_home_keys(f, "d", keys, SHMB_CATALOG_PROBES + 1);
    /* The oldest is not the first in the window: generations 40, 2..32. */
    for (i = 0; i < SHMB_CATALOG_PROBES; i++) {
        chunks[i] = put_chunk(f, keys[i], 8, 'x', i == 0 ? 40 : i + 1);
        assert_int_equal(catalog_add(f->cat, keys[i], strlen(keys[i]), chunks[i],
                                     i == 0 ? 40 : i + 1, 8, 0, keys[i], &displaced),
                         0);
        assert_null(displaced);
    }
    chunks[i] = put_chunk(f, keys[i], 8, 'y', 99);
    assert_int_equal(catalog_add(f->cat, keys[i], strlen(keys[i]), chunks[i], 99, 8, 0,
                                 keys[i], &displaced),
                     0);
    assert_ptr_equal(displaced, keys[1]);
    assert_int_equal(catalog_displaced(f->cat), 1);
    assert_int_equal(catalog_unlisted(f->cat), 1);
    assert_int_equal(f->hdr->catalog_unlisted, 1);
    assert_int_equal(catalog_listed(f->cat), SHMB_CATALOG_PROBES);
    assert_int_equal(test_read(f, keys[i], buf, sizeof(buf), &size, &gen), 0);
    assert_int_equal(buf[0], 'y');
    assert_int_equal(gen, 99);
    assert_int_equal(test_read(f, keys[1], buf, sizeof(buf), &size, &gen), -EAGAIN);
    assert_int_equal(test_read(f, keys[0], buf, sizeof(buf), &size, &gen), 0);
    assert_int_equal(test_read(f, keys[2], buf, sizeof(buf), &size, &gen), 0);
    catalog_remove(f->cat, keys[1], strlen(keys[1]), chunks[1], false);
    assert_int_equal(catalog_unlisted(f->cat), 0);
    catalog_remove(f->cat, keys[i], strlen(keys[i]), chunks[i], true);
    assert_int_equal(catalog_listed(f->cat), SHMB_CATALOG_PROBES - 1);
    assert_int_equal(test_read(f, keys[i], buf, sizeof(buf), &size, &gen), -ENOENT);
    assert_int_equal(test_read(f, keys[2], buf, sizeof(buf), &size, &gen), 0);
    cfix_free(f);
}

/* A catalog of 0 slots lists nothing and counts everything unlisted. */
static void test_zero_slots(void **state)
{
    struct shmb_error err = {0};
    unsigned char page[SHMB_HEADER_PAGE] = {0};
    struct catalog *c = catalog_new(page, SHMB_HEADER_PAGE, 0, 1,
                                    (struct shmb_segment_header *)page, &err);

    (void)state;
    assert_non_null(c);
    assert_int_equal(catalog_add(c, "a", 1, 4096, 1, 1, 0, NULL, NULL), -ENOSPC);
    assert_int_equal(catalog_unlisted(c), 1);
    catalog_remove(c, "a", 1, 4096, false);
    assert_int_equal(catalog_unlisted(c), 0);
    assert_null(catalog_new(page, SHMB_HEADER_PAGE, 3, 1, (struct shmb_segment_header *)page,
                            &err));
    assert_int_equal(err.code, -EINVAL);
    catalog_free(c);
}

/* Generations count up from 1, are mirrored to the header's gen_next,
 * never are 0 (they wrap past it), and catalog_gen_after skips what an
 * adoption found used. */
static void test_generations(void **state)
{
    struct cfix *f = cfix_new(0);

    (void)state;
    assert_int_equal(catalog_next_gen(f->cat), 1);
    assert_int_equal(catalog_next_gen(f->cat), 2);
    assert_int_equal(f->hdr->gen_next, 3);
    catalog_gen_after(f->cat, 1); /* below: nothing changes */
    assert_int_equal(catalog_next_gen(f->cat), 3);
    catalog_gen_after(f->cat, 500);
    assert_int_equal(f->hdr->gen_next, 501);
    assert_int_equal(catalog_next_gen(f->cat), 501);
    catalog_gen_after(f->cat, UINT32_MAX - 1);
    assert_int_equal(catalog_next_gen(f->cat), UINT32_MAX);
    assert_int_equal(catalog_next_gen(f->cat), 1);
    cfix_free(f);
}

/* Each beat writes the time, counts itself, and publishes the counters
 * under an even sequence count; a stopped daemon's pid is 0. */
static void test_heartbeat(void **state)
{
    struct cfix *f = cfix_new(0);
    struct shmb_published_counters in = {.seq = 77, .clients = 3, .objects = 5,
                                         .fast_reads = 9, .pid = 4242};
    const struct shmb_published_counters *out =
        (const struct shmb_published_counters *)(f->base + SHMB_COUNTERS_AT);

    (void)state;
    catalog_beat(f->cat, &in, 123456);
    assert_int_equal(f->hdr->heartbeat_unix_ms, 123456);
    assert_int_equal(f->hdr->heartbeat_count, 1);
    assert_int_equal(f->hdr->heartbeat_period_ms, SEGMENT_HEARTBEAT_MS);
    assert_int_equal(out->seq, 2);
    assert_int_equal(out->clients, 3);
    assert_int_equal(out->objects, 5);
    assert_int_equal(out->fast_reads, 9);
    assert_int_equal(out->pid, 4242);
    in.pid = 0;
    catalog_beat(f->cat, &in, 124456);
    assert_int_equal(f->hdr->heartbeat_count, 2);
    assert_int_equal(out->seq, 4);
    assert_int_equal(out->pid, 0);
    cfix_free(f);
}

/* Random adds and removes against a list of what should be listed: after
 * each step every listed key is found with its bytes, every removed one is
 * an authoritative miss, and the moves count is even. */
static void test_random_model(void **state)
{
    enum { KEYS = 200 };
    struct cfix *f = cfix_new(100);
    static uint64_t chunk_of[KEYS];
    static bool live[KEYS], listed[KEYS];
    unsigned char buf[64];
    uint64_t size;
    uint32_t gen;
    unsigned step, i, seed = 7;

    (void)state;
    assert_int_equal(f->plan.catalog_slots, 256); /* pow2ceil(100 * 4 / 3) = 256 */
    /* Chunks are laid once per key and reused: the bytes are the key's. */
    for (i = 0; i < KEYS; i++) {
        char key[32];

        snprintf(key, sizeof(key), "m%u", i);
        chunk_of[i] = put_chunk(f, key, 16, (unsigned char)i, i + 1);
    }
    for (step = 0; step < 3000; step++) {
        char key[32];

        seed = seed * 1103515245u + 12345u;
        i = (seed >> 8) % KEYS;
        snprintf(key, sizeof(key), "m%u", i);
        if (!live[i]) {
            int rc = catalog_add(f->cat, key, strlen(key), chunk_of[i], i + 1, 16, 0,
                                 NULL, NULL);

            assert_true(rc == 0 || rc == -ENOSPC);
            live[i] = true;
            listed[i] = rc == 0;
        } else {
            catalog_remove(f->cat, key, strlen(key), chunk_of[i], listed[i]);
            live[i] = listed[i] = false;
        }
        assert_int_equal(f->hdr->catalog_moves % 2, 0);
        if (step % 50 != 0)
            continue;
        for (i = 0; i < KEYS; i++) {
            int rc;

            snprintf(key, sizeof(key), "m%u", i);
            rc = test_read(f, key, buf, sizeof(buf), &size, &gen);
            if (listed[i]) {
                assert_int_equal(rc, 0);
                assert_int_equal(buf[0], (unsigned char)i);
            } else {
                assert_int_equal(rc, catalog_unlisted(f->cat) ? -EAGAIN : -ENOENT);
            }
        }
    }
    cfix_free(f);
}

/* A table with every entry taken and no object unlisted, as a full catalog
 * is once the objects it displaced have gone (evicted oldest first, and the
 * displaced are the oldest): a removal there shifts entries back all the
 * way round the table, and every key still listed must be found after it.
 * A shift that stopped short left an empty entry between a key's home and
 * its entry: a reader stopped there and, catalog_unlisted being 0, took the
 * miss for proof, -ENOENT for an object that exists. */
static void test_remove_from_full_table(void **state)
{
    enum { KEYS = 300 };
    struct cfix *f = cfix_new(40);
    static uint64_t chunk_of[KEYS];
    static bool live[KEYS], listed[KEYS];
    static char owners[KEYS];
    unsigned char buf[64];
    uint64_t size;
    uint32_t gen, next_gen = 0;
    unsigned round, i, n, seed = 5;

    (void)state;
    assert_int_equal(f->plan.catalog_slots, 64);
    for (i = 0; i < KEYS; i++) {
        char key[32];

        snprintf(key, sizeof(key), "f%u", i);
        chunk_of[i] = put_chunk(f, key, 16, (unsigned char)i, 0);
    }
    for (round = 0; round < 100; round++) {
        char key[32];

        /* Twice as many new objects as entries: the table fills, and the
         * newest displace the oldest. */
        for (n = 0; n < 128; n++) {
            void *displaced = NULL;

            do {
                seed = seed * 1103515245u + 12345u;
                i = (seed >> 8) % KEYS;
            } while (live[i]);
            snprintf(key, sizeof(key), "f%u", i);
            __atomic_store_n((uint64_t *)(f->base + chunk_of[i] +
                                          offsetof(struct shmb_chunk_header, seal)),
                             SHMB_SEAL(++next_gen, 0), __ATOMIC_RELEASE);
            assert_int_equal(catalog_add(f->cat, key, strlen(key), chunk_of[i], next_gen,
                                         16, 0, &owners[i], &displaced),
                             0);
            live[i] = listed[i] = true;
            if (displaced != NULL)
                listed[(char *)displaced - owners] = false;
        }
        /* The displaced go (and with them the proof of a miss comes back). */
        for (i = 0; i < KEYS; i++) {
            snprintf(key, sizeof(key), "f%u", i);
            if (live[i] && !listed[i]) {
                catalog_remove(f->cat, key, strlen(key), chunk_of[i], false);
                live[i] = false;
            }
        }
        assert_int_equal(catalog_listed(f->cat), 64);
        assert_int_equal(catalog_unlisted(f->cat), 0);
        /* One listed object goes. */
        do {
            seed = seed * 1103515245u + 12345u;
            i = (seed >> 8) % KEYS;
        } while (!live[i]);
        snprintf(key, sizeof(key), "f%u", i);
        catalog_remove(f->cat, key, strlen(key), chunk_of[i], true);
        live[i] = listed[i] = false;
        for (i = 0; i < KEYS; i++) {
            int rc;

            snprintf(key, sizeof(key), "f%u", i);
            rc = test_read(f, key, buf, sizeof(buf), &size, &gen);
            if (live[i] && rc != 0)
                fail_msg("round %u: listed key %s reads %d", round, key, rc);
            if (live[i])
                assert_int_equal(buf[0], (unsigned char)i);
            else
                assert_int_equal(rc, -ENOENT);
        }
    }
    cfix_free(f);
}

/* Random adds (each with a new generation, displacing when its window is
 * full) and removes against a model: after each step the catalog counts
 * unlisted exactly the live objects it does not list, every listed key is
 * found with its bytes and generation, every displaced one is an unsure
 * miss (the reader asks the daemon), a displacement hands back a listed
 * object's owner, and emptied, the table proves misses again. */
static void test_random_displacement(void **state)
{
    enum { KEYS = 300 };
    struct cfix *f = cfix_new(40);
    static uint64_t chunk_of[KEYS];
    static uint32_t gen_of[KEYS];
    static bool live[KEYS], listed[KEYS];
    static char owners[KEYS];
    unsigned char buf[64];
    uint64_t size;
    uint32_t gen, next_gen = 0, displacements = 0;
    unsigned step, i, seed = 11, n_listed, n_unlisted;

    (void)state;
    assert_int_equal(f->plan.catalog_slots, 64); /* pow2ceil(40 * 4 / 3) */
    for (i = 0; i < KEYS; i++) {
        char key[32];

        snprintf(key, sizeof(key), "r%u", i);
        chunk_of[i] = put_chunk(f, key, 16, (unsigned char)i, 0);
    }
    for (step = 0; step < 6000; step++) {
        char key[32];

        seed = seed * 1103515245u + 12345u;
        i = (seed >> 8) % KEYS;
        snprintf(key, sizeof(key), "r%u", i);
        if (!live[i] && (seed >> 20) % 4 != 0) {
            void *displaced = NULL;
            uint64_t *seal = (uint64_t *)(f->base + chunk_of[i] +
                                          offsetof(struct shmb_chunk_header, seal));

            gen_of[i] = ++next_gen;
            __atomic_store_n(seal, SHMB_SEAL(gen_of[i], 0), __ATOMIC_RELEASE);
            assert_int_equal(catalog_add(f->cat, key, strlen(key), chunk_of[i], gen_of[i],
                                         16, 0, &owners[i], &displaced),
                             0);
            live[i] = listed[i] = true;
            if (displaced != NULL) {
                size_t j = (size_t)((char *)displaced - owners);

                assert_true(j < KEYS && j != i && live[j] && listed[j]);
                listed[j] = false;
                displacements++;
            }
        } else if (live[i]) {
            catalog_remove(f->cat, key, strlen(key), chunk_of[i], listed[i]);
            live[i] = listed[i] = false;
        }
        assert_int_equal(f->hdr->catalog_moves % 2, 0);
        n_listed = n_unlisted = 0;
        for (i = 0; i < KEYS; i++) {
            n_listed += listed[i];
            n_unlisted += live[i] && !listed[i];
        }
        assert_int_equal(catalog_listed(f->cat), n_listed);
        assert_int_equal(catalog_unlisted(f->cat), n_unlisted);
        assert_int_equal(f->hdr->catalog_unlisted, n_unlisted);
        if (step % 25 != 0)
            continue;
        for (i = 0; i < KEYS; i++) {
            int rc;

            snprintf(key, sizeof(key), "r%u", i);
            rc = test_read(f, key, buf, sizeof(buf), &size, &gen);
            if (listed[i]) {
                assert_int_equal(rc, 0);
                assert_int_equal(buf[0], (unsigned char)i);
                assert_int_equal(gen, gen_of[i]);
            } else {
                assert_int_equal(rc, n_unlisted != 0 ? -EAGAIN : -ENOENT);
            }
        }
    }
    /* The table filled and displaced many times over. */
    assert_true(displacements > 500);
    for (i = 0; i < KEYS; i++) {
        char key[32];

        snprintf(key, sizeof(key), "r%u", i);
        if (live[i])
            catalog_remove(f->cat, key, strlen(key), chunk_of[i], listed[i]);
    }
    assert_int_equal(catalog_listed(f->cat), 0);
    assert_int_equal(catalog_unlisted(f->cat), 0);
    assert_int_equal(test_read(f, "r0", buf, sizeof(buf), &size, &gen), -ENOENT);
    cfix_free(f);
}

/* segment_plan: the default slots, --max-objects, the 1/8 bound, none in
 * a segment too small, page-aligned at the end of the file. */
static void test_plan(void **state)
{
    struct segment_plan p;

    (void)state;
    segment_plan(256u << 20, SHMB_HEADER_PAGE, 0, &p);
    assert_int_equal(p.catalog_slots, 131072);
    assert_int_equal(p.catalog_offset, (256u << 20) - 131072 * 32);
    assert_int_equal(p.data_size, (256u << 20) - 131072 * 32 - SHMB_HEADER_PAGE);
    segment_plan(256u << 20, SHMB_HEADER_PAGE, 1000, &p);
    assert_int_equal(p.catalog_slots, 2048);
    segment_plan(1u << 20, SHMB_HEADER_PAGE, 1000000, &p); /* capped at 1/8 */
    assert_int_equal(p.catalog_slots, 4096);
    assert_true(p.catalog_bytes <= (1u << 20) / 8);
    segment_plan(8192, SHMB_HEADER_PAGE, 0, &p);
    assert_int_equal(p.catalog_slots, 0);
    assert_int_equal(p.data_size, 4096);
    assert_int_equal(p.catalog_offset, 8192);
    segment_plan(4u << 20, 2u << 20, 0, &p); /* a huge page is more than 1/8 */
    assert_int_equal(p.catalog_slots, 0);
    segment_plan(64u << 20, 2u << 20, 0, &p);
    assert_int_equal(p.catalog_bytes, 2u << 20);
    assert_int_equal(p.catalog_offset % (2u << 20), 0);
}

/* Proves that while the catalog is held (an adoption listing its objects
 * again) catalog_moves stays odd, removals included, so that no reader takes
 * a miss for a proof, and that the release makes it even again. */
static void test_hold_keeps_misses_unsure(void **state)
{
    struct cfix *f = cfix_new(0);
    char buf[64];
    uint64_t size, chunk;
    uint32_t gen;

    (void)state;
    catalog_hold(f->cat);
    assert_int_equal(f->hdr->catalog_moves & 1, 1);
    assert_int_equal(test_read(f, "nope", buf, sizeof(buf), &size, &gen), -EAGAIN);
    chunk = put_chunk(f, "a", 10, 'a', 1);
    assert_int_equal(catalog_add(f->cat, "a", 1, chunk, 1, 10, 0, NULL, NULL), 0);
    catalog_remove(f->cat, "a", 1, chunk, true);
    assert_int_equal(f->hdr->catalog_moves & 1, 1);
    catalog_hold(f->cat); /* nested */
    catalog_release(f->cat);
    assert_int_equal(f->hdr->catalog_moves & 1, 1);
    catalog_release(f->cat);
    assert_int_equal(f->hdr->catalog_moves & 1, 0);
    assert_int_equal(test_read(f, "nope", buf, sizeof(buf), &size, &gen), -ENOENT);
    cfix_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_values),
        cmocka_unit_test(test_add_and_read),
        cmocka_unit_test(test_remove_shifts),
        cmocka_unit_test(test_hold_keeps_misses_unsure),
        cmocka_unit_test(test_probe_bound_unlisted),
        cmocka_unit_test(test_zero_slots),
        cmocka_unit_test(test_full_window_displaces_oldest),
        cmocka_unit_test(test_generations),
        cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_random_model),
        cmocka_unit_test(test_remove_from_full_table),
        cmocka_unit_test(test_random_displacement),
        cmocka_unit_test(test_plan),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
