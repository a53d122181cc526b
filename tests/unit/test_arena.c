// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for arenas (daemon/arena.c and the store's arena objects): the
 * grant and its clamps, commit_at's checks, give-back, reclaim, revocation,
 * expiry, disconnect and adoption. Links arena.o, store.o, ring.o, index.o,
 * segment.o and proto; the data area is plain memory, written here as a
 * client would write its arena.
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
#include <time.h>

#include <cmocka.h>

#include "arena.h"
#include "../../daemon/catalog.h"
#include "../../proto/text.h"
#include "clock.h"
#include "reads.h"
#include "ring.h"
#include "store.h"

/* Where the data area would start in a segment: offsets count from there. */
#define DATA_OFFSET 4096u
#define DATA_SIZE 65536u /* an arena is at most 1/8 of it: 8192 bytes */
#define CLIENT 7

struct afix {
    struct store *s;
    unsigned char *data;
    uint64_t size;
    struct shmb_segment_header cursor;
};

static struct afix *afix_new(uint64_t size, uint64_t max)
{
    struct store_config cfg = {.max_object_size = max};
    struct shmb_error err = {0};
    struct afix *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->size = size;
    f->data = aligned_alloc(SHMB_ALIGN, size);
    assert_non_null(f->data);
    memset(f->data, 0xa5, size);
    f->s = store_new(f->data, DATA_OFFSET, size, &f->cursor, &cfg, &err);
    if (f->s == NULL)
        fail_msg("store_new: %d %s", err.code, err.message);
    return f;
}

static void afix_free(struct afix *f)
{
    store_free(f->s);
    free(f->data);
    free(f);
}

/* The segment byte at offset (from the start of the segment). */
static unsigned char *at(const struct afix *f, uint64_t offset)
{
    assert_true(offset >= DATA_OFFSET && offset - DATA_OFFSET < f->size);
    return f->data + (offset - DATA_OFFSET);
}

/* A copy of the chunk header at offset. */
static struct shmb_chunk_header header_at(const struct afix *f, uint64_t offset)
{
    struct shmb_chunk_header h;

    memcpy(&h, at(f, offset), sizeof(h));
    return h;
}

/* The arena's lock, as a client sees it in the seal of the arena header. */
static uint32_t lock_of(const struct afix *f, uint64_t arena_offset)
{
    return SHMB_ARENA_WORD_LOCK(header_at(f, arena_offset - 64).seal);
}

/* Set the lock as a client would, keeping the arena's generation. */
static void set_lock(struct afix *f, uint64_t arena_offset, uint32_t lock)
{
    uint64_t seal = SHMB_ARENA_WORD(header_at(f, arena_offset - 64).seal, lock);

    memcpy(at(f, arena_offset - 64) + offsetof(struct shmb_chunk_header, seal), &seal,
           sizeof(seal));
}

/* The arena's count of commits on their way, as a client sees it. */
static uint64_t inflight_of(const struct afix *f, uint64_t arena_offset)
{
    uint64_t n;

    memcpy(&n, at(f, arena_offset - 64) + SHMB_ARENA_INFLIGHT_AT, sizeof(n));
    return n;
}

/* Set that count as a client would (it adds one per chunk it copied). */
static void set_inflight(struct afix *f, uint64_t arena_offset, uint64_t n)
{
    memcpy(at(f, arena_offset - 64) + SHMB_ARENA_INFLIGHT_AT, &n, sizeof(n));
}

static unsigned char pattern_byte(uint64_t seed, uint64_t i)
{
    return (unsigned char)((seed * 131 + i * 7 + (i >> 8)) ^ (seed >> 3));
}

/* What a client does for a put: lay the payload of key at chunk offset
 * pos (it leaves the header to the daemon, scribbling it here to show
 * that the daemon does not trust it). Returns the chunk's bytes. */
static uint64_t lay(struct afix *f, uint64_t pos, const char *key, uint64_t size,
                    uint64_t seed)
{
    uint64_t hs = SHMB_CHUNK_HEADER_SIZE(strlen(key)), i;

    memset(at(f, pos), 0x5a, hs);
    for (i = 0; i < size; i++)
        at(f, pos + hs)[i] = pattern_byte(seed, i);
    return SHMB_CHUNK_SIZE(strlen(key), size);
}

static void check_bytes(struct afix *f, const struct store_extent *e, uint64_t seed)
{
    uint64_t i;

    for (i = 0; i < e->size; i++)
        if (at(f, e->offset)[i] != pattern_byte(seed, i))
            fail_msg("payload byte %llu of seed %llu differs", (unsigned long long)i,
                     (unsigned long long)seed);
}

static void expect_message_has(const struct shmb_error *err, const char *needle)
{
    if (strstr(err->message, needle) == NULL)
        fail_msg("message lacks \"%s\": %s", needle, err->message);
}

static struct store_stats stats_of(struct afix *f)
{
    struct store_stats st;

    store_stats(f->s, &st);
    return st;
}

static struct store_extent arena_ok(struct afix *f, struct store_holder *h, uint64_t size)
{
    struct shmb_error err = {0};
    struct store_extent e;
    uint64_t gen = 0;
    int rc = store_arena(f->s, h, CLIENT, size, &e, &gen, &err);

    if (rc != 0)
        fail_msg("store_arena(%llu) = %d: %s", (unsigned long long)size, rc, err.message);
    /* The lock's seal carries the grant's generation, never 0: a zeroed
     * word (a new chunk's header where the arena was) is not an IDLE lock. */
    if (size == 0) {
        assert_int_equal(gen, 0);
        return e;
    }
    assert_true(gen != 0 && (gen & 3) == 0);
    assert_int_equal(header_at(f, e.offset - 64).seal, SHMB_ARENA_WORD(gen, SHMB_ARENA_IDLE));
    return e;
}

/* Lay and commit key at pos; returns the chunk's bytes. */
static uint64_t put_at(struct afix *f, struct store_holder *h, uint64_t pos, const char *key,
                       uint64_t size, uint32_t readers, uint64_t seed)
{
    struct shmb_error err = {0};
    struct store_extent e;
    uint64_t chunk = lay(f, pos, key, size, seed);
    int rc = store_commit_at(f->s, h, key, strlen(key), pos, size, readers, &e, &err);

    if (rc != 0)
        fail_msg("commit_at '%s' at %llu = %d: %s", key, (unsigned long long)pos, rc,
                 err.message);
    assert_int_equal(e.offset, pos + SHMB_CHUNK_HEADER_SIZE(strlen(key)));
    assert_int_equal(e.size, size);
    return chunk;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* The grant: min(asked, max object, 1/8 of the data area) rounded down to
 * 64; below one chunk with the longest key (384 bytes) it is EINVAL with
 * the numbers. The arena's own header (64 bytes before the offset) is an
 * ARENA chunk with key "" and an IDLE lock; stats count it. */
static void test_grant_clamps(void **state)
{
    uint64_t gen = 0;
    struct afix *f = afix_new(DATA_SIZE, 0), *g = afix_new(DATA_SIZE, 1000);
    struct store_holder *h = store_holder_new(f->s), *hg = store_holder_new(g->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct shmb_chunk_header hdr;
    struct store_stats st;

    (void)state;
    e = arena_ok(f, h, 1 << 20);
    assert_int_equal(e.size, DATA_SIZE / 8);
    assert_int_equal(e.offset % SHMB_ALIGN, 0);
    hdr = header_at(f, e.offset - 64);
    assert_int_equal(hdr.magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(hdr.state, SHMB_CHUNK_ARENA);
    assert_int_equal(hdr.key_len, 0);
    assert_int_equal(hdr.chunk_size, 64 + DATA_SIZE / 8);
    assert_int_equal(lock_of(f, e.offset), SHMB_ARENA_IDLE);
    st = stats_of(f);
    assert_int_equal(st.arenas, 1);
    assert_int_equal(st.arena_bytes, DATA_SIZE / 8);
    assert_int_equal(st.used, 64 + DATA_SIZE / 8);

    e = arena_ok(f, h, 1000);
    assert_int_equal(e.size, 960);
    assert_int_equal(stats_of(f).arenas, 1); /* the first one was given back */
    assert_int_equal(stats_of(f).used, 64 + 960);

    assert_int_equal(store_arena(f->s, h, CLIENT, 100, &e, &gen, &err), -EINVAL);
    expect_message_has(&err, "at least 384 bytes");
    /* The max object size clamps too (1000 -> 960). */
    e = arena_ok(g, hg, 4096);
    assert_int_equal(e.size, 960);
    /* size 0 gives back. */
    e = arena_ok(g, hg, 0);
    assert_int_equal(e.size, 0);
    assert_int_equal(stats_of(g).arenas, 0);
    assert_int_equal(stats_of(g).used, 0);
    store_holder_free(f->s, h);
    store_holder_free(g->s, hg);
    afix_free(f);
    afix_free(g);
}

/* Chunks committed in order become ordinary objects: the daemon writes each
 * header from its own values (whatever the client left there), the arena's
 * tag counts the committed bytes, another holder gets the bytes exactly,
 * list shows them, and the bytes left shrink. */
static void test_commit_in_order(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a = arena_ok(f, w, 4096), got;
    struct shmb_chunk_header hdr, ah;
    uint64_t pos = a.offset;
    struct store_stats st;

    (void)state;
    pos += put_at(f, w, pos, "one", 100, 0, 1);
    pos += put_at(f, w, pos, "two", 1, 2, 2);
    pos += put_at(f, w, pos, "three", 500, 0, 3);
    hdr = header_at(f, a.offset + SHMB_CHUNK_SIZE(3, 100));
    ah = header_at(f, a.offset - 64);
    assert_int_equal(hdr.magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(hdr.state, SHMB_CHUNK_COMMITTED);
    assert_int_equal(hdr.key_len, 3);
    assert_int_equal(hdr.header_size, 64);
    assert_int_equal(hdr.tag, 2);
    assert_int_equal(hdr.id, ah.id);
    assert_int_equal(hdr.chunk_size, 128);
    assert_int_equal(hdr.payload_size, 1);
    assert_memory_equal(at(f, a.offset + SHMB_CHUNK_SIZE(3, 100)) + 48, "two", 3);
    assert_int_equal((uint64_t)ah.tag * 64, pos - a.offset);

    assert_int_equal(store_get(f->s, r, "three", 5, &got, &err), 0);
    assert_int_equal(got.size, 500);
    check_bytes(f, &got, 3);
    assert_int_equal(store_get(f->s, r, "one", 3, &got, &err), 0);
    check_bytes(f, &got, 1);
    st = stats_of(f);
    assert_int_equal(st.objects, 3);
    assert_int_equal(st.commits, 3);
    assert_int_equal(st.arena_bytes, 4096 - (pos - a.offset));
    assert_int_equal(store_release(f->s, r, "one", 3, &err), 0);
    assert_int_equal(store_release(f->s, r, "three", 5, &err), 0);
    /* An arena object is deleted as any other. */
    assert_int_equal(store_delete(f->s, "one", 3, &err), 0);
    assert_false(store_contains(f->s, "one", 3));
    assert_true(store_contains(f->s, "two", 3));
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    afix_free(f);
}

/* commit_at refuses, naming the numbers and changing nothing: an offset
 * that is not the cursor (a hole, or an overlap with a committed chunk), a
 * chunk that runs past the arena's end, a key that exists, an offset
 * outside the arena or no arena at all (ESTALE). */
static void test_commit_refusals(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *other = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a, e;
    uint64_t pos;
    char msg[200];

    (void)state;
    assert_int_equal(store_commit_at(f->s, w, "k", 1, DATA_OFFSET, 10, 0, &e, &err), -ESTALE);
    expect_message_has(&err, "holds no arena");
    a = arena_ok(f, w, 1024);
    pos = a.offset + put_at(f, w, a.offset, "first", 10, 0, 1);

    lay(f, pos + 64, "hole", 10, 2);
    assert_int_equal(store_commit_at(f->s, w, "hole", 4, pos + 64, 10, 0, &e, &err), -EINVAL);
    snprintf(msg, sizeof(msg),
             "commit_at offset %llu is not the arena's next free byte %llu (arena %llu..%llu)",
             (unsigned long long)(pos + 64), (unsigned long long)pos,
             (unsigned long long)a.offset, (unsigned long long)(a.offset + 1024));
    expect_message_has(&err, msg);
    assert_int_equal(store_commit_at(f->s, w, "over", 4, a.offset, 10, 0, &e, &err), -EINVAL);
    expect_message_has(&err, "lay chunks out in order");
    assert_false(store_contains(f->s, "hole", 4));
    assert_false(store_contains(f->s, "over", 4));

    /* 1024 - 128 bytes are left: a chunk of 64 + 896 + 64 is too long. */
    assert_int_equal(store_commit_at(f->s, w, "big", 3, pos, 897, 0, &e, &err), -EINVAL);
    expect_message_has(&err, "runs past the end of the arena");
    expect_message_has(&err, "896 bytes left");

    assert_int_equal(store_alloc(f->s, other, "taken", 5, 10, 0, NULL, &err), 0);
    lay(f, pos, "taken", 10, 3);
    assert_int_equal(store_commit_at(f->s, w, "far", 3, a.offset + 4096, 10, 0, &e, &err),
                     -ESTALE);
    expect_message_has(&err, "outside this connection's arena");
    /* Misplaced or too long: the cursor did not move. A chunk refused for
     * its key but laid at the cursor is stepped over (a free chunk), so that
     * the chunks a client sends on without waiting still line up. */
    assert_int_equal(store_commit_at(f->s, w, "taken", 5, pos + 64, 10, 0, &e, &err), -EEXIST);
    assert_int_equal(store_commit_at(f->s, w, "taken", 5, pos, 10, 0, &e, &err), -EEXIST);
    assert_int_equal(header_at(f, pos).state, SHMB_CHUNK_FREE);
    assert_int_equal(header_at(f, pos).chunk_size, 128);
    assert_int_equal(store_commit_at(f->s, w, "second", 6, pos, 100, 0, &e, &err), -EINVAL);
    expect_message_has(&err, "next free byte");
    pos += 128;
    pos += put_at(f, w, pos, "second", 100, 0, 4);
    assert_int_equal(stats_of(f).objects, 2);
    store_holder_free(f->s, w);
    store_holder_free(f->s, other);
    afix_free(f);
}

/* Giving back an arena that is the ring's newest chunk returns its unused
 * tail at once (and all of it when nothing was committed); one that is not
 * the newest keeps it until it is reclaimed. Its objects stay either way. */
static void test_give_back(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a, got;
    uint64_t chunk, used;

    (void)state;
    a = arena_ok(f, w, 4096);
    arena_ok(f, w, 0);
    assert_int_equal(stats_of(f).used, 0);

    a = arena_ok(f, w, 4096);
    chunk = put_at(f, w, a.offset, "kept", 200, 0, 1);
    arena_ok(f, w, 0);
    assert_int_equal(stats_of(f).used, 64 + chunk);
    assert_int_equal(header_at(f, a.offset - 64).chunk_size, 64 + chunk);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
    assert_int_equal(store_get(f->s, o, "kept", 4, &got, &err), 0);
    check_bytes(f, &got, 1);
    /* The space given back is allocated again right after the object. */
    assert_int_equal(store_alloc(f->s, o, "next", 4, 10, 0, &got, &err), 0);
    assert_int_equal(got.offset, a.offset + chunk + 64);

    /* Not the newest: an allocation after it keeps the arena whole. */
    a = arena_ok(f, w, 4096);
    put_at(f, w, a.offset, "in", 10, 0, 2);
    assert_int_equal(store_alloc(f->s, o, "after", 5, 10, 0, NULL, &err), 0);
    used = stats_of(f).used;
    arena_ok(f, w, 0);
    assert_int_equal(stats_of(f).used, used);
    assert_int_equal(stats_of(f).arenas, 0);
    assert_true(store_contains(f->s, "in", 2));
    store_holder_free(f->s, w);
    store_holder_free(f->s, o);
    afix_free(f);
}

/* Fill the ring with objects of 4 KiB until an alloc fails; returns the
 * failing code (err says why). */
static int fill(struct afix *f, struct store_holder *h, int *n)
{
    struct shmb_error err = {0};
    char key[32];
    int rc;

    for (;;) {
        snprintf(key, sizeof(key), "fill%d", (*n)++);
        rc = store_alloc(f->s, h, key, strlen(key), 4000, 0, NULL, &err);
        if (rc != 0)
            return rc;
        assert_int_equal(store_commit(f->s, h, key, strlen(key), &err), 0);
        if (*n > 1000)
            fail_msg("the ring never filled");
    }
}

/* An arena nobody holds is reclaimed as one chunk, only when each of its
 * objects may go: a pinned one blocks it, and ENOSPC and stats name that
 * object. Once it is released, all go (evicted, oldest first) at once. */
static void test_reclaim_blocked_by_pin(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a = arena_ok(f, w, 4096), got;
    struct store_stats st;
    uint64_t pos = a.offset;
    int n = 0;

    (void)state;
    pos += put_at(f, w, pos, "a1", 100, 0, 1);
    pos += put_at(f, w, pos, "a2-pinned", 100, 0, 2);
    pos += put_at(f, w, pos, "a3", 100, 0, 3);
    arena_ok(f, w, 0);
    assert_int_equal(store_get(f->s, r, "a2-pinned", 9, &got, &err), 0);
    assert_int_equal(fill(f, w, &n), -ENOSPC);
    store_alloc(f->s, w, "x", 1, 4000, 0, NULL, &err);
    expect_message_has(&err, "'a2-pinned'");
    st = stats_of(f);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "a2-pinned");
    assert_true(store_contains(f->s, "a1", 2));
    assert_true(store_contains(f->s, "a3", 2));

    assert_int_equal(store_release(f->s, r, "a2-pinned", 9, &err), 0);
    assert_int_equal(store_alloc(f->s, w, "x", 1, 4000, 0, NULL, &err), 0);
    assert_false(store_contains(f->s, "a1", 2));
    assert_false(store_contains(f->s, "a2-pinned", 9));
    assert_false(store_contains(f->s, "a3", 2));
    assert_true(stats_of(f).evictions >= 3);
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    afix_free(f);
}

/* A held arena that blocks reclaim is revoked when its lock is IDLE (the
 * lock becomes REVOKED, its holder's next commit_at gets ESTALE, its
 * objects go when they may); while the lock is BUSY it is left alone, and
 * ENOSPC and stats name "the arena of client 7". */
static void test_revoke_idle_busy(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a, e;
    struct store_stats st;
    uint64_t pos, lock_word, old_seal;
    int n = 0;

    (void)state;
    a = arena_ok(f, w, 4096);
    old_seal = header_at(f, a.offset - 64).seal;
    pos = a.offset + put_at(f, w, a.offset, "in-busy", 100, 0, 1);
    set_lock(f, a.offset, SHMB_ARENA_BUSY);
    assert_int_equal(fill(f, o, &n), -ENOSPC);
    assert_int_equal(store_alloc(f->s, o, "y", 1, 4000, 0, NULL, &err), -ENOSPC);
    expect_message_has(&err, "arena of client 7");
    st = stats_of(f);
    assert_string_equal(st.blocker_key, "(arena of client 7)");
    assert_int_equal(st.arenas, 1);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_BUSY);
    /* Nothing tells the daemon when the lock goes IDLE: waiting
     * allocations are told to look again soon. */
    assert_true(store_lease_wake_ms(f->s) != UINT64_MAX);
    /* The client still holds it and commits into it. */
    pos += put_at(f, w, pos, "in-busy2", 100, 0, 2);

    /* IDLE: revoked, but a pin on one of its objects keeps it (and names
     * the object). */
    set_lock(f, a.offset, SHMB_ARENA_IDLE);
    assert_int_equal(store_get(f->s, o, "in-busy2", 8, &e, &err), 0);
    assert_int_equal(store_alloc(f->s, o, "y", 1, 4000, 0, NULL, &err), -ENOSPC);
    expect_message_has(&err, "'in-busy2'");
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
    assert_int_equal(stats_of(f).arenas, 0);
    assert_int_equal(store_lease_wake_ms(f->s), UINT64_MAX);
    lay(f, pos, "late", 10, 3);
    assert_int_equal(store_commit_at(f->s, w, "late", 4, pos, 10, 0, &e, &err), -ESTALE);

    assert_int_equal(store_release(f->s, o, "in-busy2", 8, &err), 0);
    assert_int_equal(store_alloc(f->s, o, "y", 1, 4000, 0, NULL, &err), 0);
    /* The arena's bytes are reused: a client coming back to its old lock
     * finds a word that is not its IDLE seal, so its compare-and-swap
     * fails and it writes nothing there. */
    lock_word = header_at(f, a.offset - 64).seal;
    assert_true(lock_word != old_seal);
    assert_true(lock_word != SHMB_ARENA_WORD(old_seal, SHMB_ARENA_IDLE));
    assert_false(store_contains(f->s, "in-busy", 7));
    assert_false(store_contains(f->s, "in-busy2", 8));
    /* A new arena works. */
    a = arena_ok(f, w, 1024);
    put_at(f, w, a.offset, "late", 10, 0, 3);
    store_holder_free(f->s, w);
    store_holder_free(f->s, o);
    afix_free(f);
}

/* A held arena whose lock is IDLE while its client has commits on their
 * way (the count in its header, which a grant sets to 0) is not taken back,
 * for room or by the expiry: the commits would find it gone. Each commit_at
 * handled takes one off (never below 0); the last one moves the room
 * generation (waiting allocations look again), and then the arena goes as
 * any IDLE one. */
static void test_revoke_waits_for_commits(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a, e;
    uint64_t pos, gen;
    int n = 0;

    (void)state;
    set_inflight(f, DATA_OFFSET + 64, 5); /* scribbled before the grant */
    a = arena_ok(f, w, 4096);
    assert_int_equal(a.offset, DATA_OFFSET + 64);
    assert_int_equal(inflight_of(f, a.offset), 0);
    pos = a.offset + put_at(f, w, a.offset, "c1", 100, 0, 1);
    assert_int_equal(inflight_of(f, a.offset), 0); /* not below 0 */
    assert_false(store_commits_due(f->s));
    set_inflight(f, a.offset, 2); /* two chunks laid out, their commits sent */
    assert_int_equal(fill(f, o, &n), -ENOSPC);
    assert_true(store_commits_due(f->s));
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_IDLE);
    assert_int_equal(stats_of(f).arenas, 1);
    sleep_ms(20);
    store_expire_pending(f->s, 10);
    assert_int_equal(stats_of(f).arenas, 1);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_IDLE);
    pos += put_at(f, w, pos, "c2", 10, 0, 2);
    assert_int_equal(inflight_of(f, a.offset), 1);
    assert_true(store_commits_due(f->s));
    /* The last one is refused (its key exists): it counts all the same. */
    gen = store_room_generation(f->s);
    lay(f, pos, "c1", 10, 3);
    assert_int_equal(store_commit_at(f->s, w, "c1", 2, pos, 10, 0, &e, &err), -EEXIST);
    assert_int_equal(inflight_of(f, a.offset), 0);
    assert_false(store_commits_due(f->s));
    assert_true(store_room_generation(f->s) != gen);
    assert_true(store_contains(f->s, "c2", 2));
    assert_int_equal(store_alloc(f->s, o, "y", 1, 4000, 0, NULL, &err), 0);
    assert_int_equal(stats_of(f).arenas, 0);
    assert_false(store_contains(f->s, "c2", 2)); /* evicted with its arena */
    store_holder_free(f->s, w);
    store_holder_free(f->s, o);
    afix_free(f);
}

/* --alloc-timeout (store_expire_pending's limit): an arena unused that long
 * is given back (lock REVOKED, ESTALE for its holder, objects kept); one
 * whose lock is BUSY is left alone for as long as it is BUSY, looked at
 * again once per --alloc-timeout, and given back once it was not seen
 * BUSY for that long. */
static void test_expiry(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *v = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a, b, e;
    uint64_t pos;

    (void)state;
    a = arena_ok(f, w, 2048);
    pos = a.offset + put_at(f, w, a.offset, "old", 10, 0, 1);
    b = arena_ok(f, v, 2048);
    set_lock(f, b.offset, SHMB_ARENA_BUSY);
    assert_true(store_oldest_pending_ms(f->s) != UINT64_MAX);
    store_expire_pending(f->s, 10000);
    assert_int_equal(stats_of(f).arenas, 2);
    sleep_ms(20);
    store_expire_pending(f->s, 10);
    assert_int_equal(stats_of(f).arenas, 1);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
    assert_true(store_contains(f->s, "old", 3));
    lay(f, pos, "new", 10, 2);
    assert_int_equal(store_commit_at(f->s, w, "new", 3, pos, 10, 0, &e, &err), -ESTALE);
    assert_int_equal(lock_of(f, b.offset), SHMB_ARENA_BUSY);
    /* BUSY: its client is copying into it. However long that takes, the
     * arena stays its own (taking it back would let others' objects be
     * written over by the copy); it goes once the client is not writing. */
    sleep_ms(20);
    store_expire_pending(f->s, 10);
    sleep_ms(20);
    store_expire_pending(f->s, 10);
    assert_int_equal(stats_of(f).arenas, 1);
    assert_int_equal(lock_of(f, b.offset), SHMB_ARENA_BUSY);
    /* Each look that finds it BUSY counts as a use: the next look is due
     * --alloc-timeout later, not at once (the daemon's timer would fire on
     * every turn of its loop, for ever). */
    assert_true(store_oldest_pending_ms(f->s) + 10 > clock_now_ms());
    set_lock(f, b.offset, SHMB_ARENA_IDLE);
    sleep_ms(20);
    store_expire_pending(f->s, 10);
    assert_int_equal(stats_of(f).arenas, 0);
    assert_int_equal(lock_of(f, b.offset), SHMB_ARENA_REVOKED);
    assert_int_equal(store_oldest_pending_ms(f->s), UINT64_MAX);
    store_holder_free(f->s, w);
    store_holder_free(f->s, v);
    afix_free(f);
}

/* A holder that goes (disconnect) gives its arena back: its committed
 * objects stay for others, the uncommitted rest is free at once. */
static void test_disconnect_keeps_committed(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent a = arena_ok(f, w, 4096), got;
    uint64_t pos = a.offset, chunk;

    (void)state;
    chunk = put_at(f, w, pos, "mine", 300, 1, 9);
    lay(f, pos + chunk, "uncommitted", 300, 10);
    store_holder_free(f->s, w);
    assert_int_equal(stats_of(f).arenas, 0);
    assert_int_equal(stats_of(f).used, 64 + chunk);
    assert_int_equal(store_get(f->s, r, "mine", 4, &got, &err), 0);
    check_bytes(f, &got, 9);
    assert_false(store_contains(f->s, "uncommitted", 11));
    store_holder_free(f->s, r);
    afix_free(f);
}

/* store_list's callback for awaited_of. */
static int awaited_entry(const struct store_entry *e, void *arg)
{
    *(int64_t *)arg = e->awaited_reads;
    return 1;
}

/* The awaited reads of the object key, as list reports them; -1 when none. */
static int64_t awaited_of(struct afix *f, const char *key)
{
    int64_t n = -1;

    store_list(f->s, key, strlen(key), 1, awaited_entry, &n);
    return n;
}

/* What a crash leaves: the store's memory goes, the data area and the
 * cursor stay; a new store adopts them. */
static void crash_and_adopt(struct afix *f, struct store_adopt_report *report)
{
    struct shmb_error err = {0};

    store_free(f->s);
    f->s = store_adopt(f->data, DATA_OFFSET, f->size, &f->cursor, NULL, report, &err);
    if (f->s == NULL)
        fail_msg("store_adopt: %d %s", err.code, err.message);
}

/* Adoption walks an arena's committed bytes and brings its objects back
 * (bytes, awaited reads) in an arena nobody holds; a deleted one stays
 * gone. A corrupt chunk inside stops the walk there: the objects before it
 * come back, the rest is dropped and reported. */
static void test_adopt(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *r;
    struct store_adopt_report report;
    struct shmb_error err = {0};
    struct store_extent a = arena_ok(f, w, 4096), got;
    uint64_t pos = a.offset, second;
    struct store_stats st;

    (void)state;
    pos += put_at(f, w, pos, "k1", 100, 0, 1);
    second = pos;
    pos += put_at(f, w, pos, "k2", 200, 2, 2);
    pos += put_at(f, w, pos, "gone", 10, 0, 3);
    pos += put_at(f, w, pos, "k3", 300, 0, 4);
    assert_int_equal(store_delete(f->s, "gone", 4, &err), 0);
    lay(f, pos, "never", 50, 5); /* laid out, not committed */
    /* One of k2's two awaited reads done: one is left after the restart. */
    r = store_holder_new(f->s);
    assert_int_equal(store_get(f->s, r, "k2", 2, &got, &err), 0);
    store_holder_free(f->s, r);

    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_IDLE);
    crash_and_adopt(f, &report);
    /* Its client, still connected to the daemon that died, must not take
     * the lock again: REVOKED before anything is handed out. */
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
    assert_false(report.corrupt);
    assert_int_equal(report.restored, 3);
    assert_int_equal(report.restored_bytes, 600);
    assert_int_equal(report.dropped_free, 1);
    assert_int_equal(awaited_of(f, "k2"), 1);
    r = store_holder_new(f->s);
    assert_int_equal(store_get(f->s, r, "k2", 2, &got, &err), 0);
    check_bytes(f, &got, 2);
    assert_int_equal(store_get(f->s, r, "k3", 2, &got, &err), 0);
    check_bytes(f, &got, 4);
    assert_false(store_contains(f->s, "never", 5));
    assert_false(store_contains(f->s, "gone", 4));
    st = stats_of(f);
    assert_int_equal(st.arenas, 0);
    /* The newest chunk, the arena, kept only its committed bytes. */
    assert_int_equal(st.used, pos - a.offset + 64);
    store_holder_free(f->s, r);

    /* The second chunk's magic spoiled: only k1 comes back. */
    memset(at(f, second), 0, 4);
    crash_and_adopt(f, &report);
    assert_true(report.corrupt);
    assert_int_equal(report.restored, 1);
    assert_int_equal(report.arena_dropped_bytes, pos - second);
    if (strstr(report.message, "Dropped the rest of that arena") == NULL)
        fail_msg("report: %s", report.message);
    assert_true(store_contains(f->s, "k1", 2));
    assert_false(store_contains(f->s, "k2", 2));
    assert_false(store_contains(f->s, "k3", 2));
    /* The walk's end is recorded: a second adoption is clean. */
    crash_and_adopt(f, &report);
    assert_false(report.corrupt);
    assert_int_equal(report.restored, 1);
    afix_free(f);
}

/* What a client does to publish a put (PROTOCOL.md section 11,
 * "Publishing"): payload, header (state WRITTEN, the arena's id, readers,
 * generation gen) and key at pos, then the arena's published end moved
 * past the chunk. Returns the chunk's bytes. */
static uint64_t publish_at(struct afix *f, uint64_t arena, uint64_t pos, const char *key,
                           uint64_t size, uint32_t readers, uint32_t gen, uint64_t seed)
{
    struct shmb_chunk_header h = header_at(f, arena - 64);
    uint64_t chunk = lay(f, pos, key, size, seed), end = pos + chunk;
    struct shmb_chunk_header c = {
        .magic = SHMB_CHUNK_MAGIC,
        .state = SHMB_CHUNK_WRITTEN,
        .key_len = (uint16_t)strlen(key),
        .header_size = (uint32_t)SHMB_CHUNK_HEADER_SIZE(strlen(key)),
        .tag = readers,
        .id = h.id,
        .chunk_size = chunk,
        .payload_size = size,
        .seal = SHMB_SEAL(gen, 0),
    };

    memcpy(at(f, pos), &c, sizeof(c));
    memcpy(at(f, pos) + sizeof(c), key, strlen(key));
    memcpy(at(f, arena - 64) + SHMB_ARENA_PUBLISHED_AT, &end, sizeof(end));
    return chunk;
}

static uint64_t published_of(const struct afix *f, uint64_t arena)
{
    uint64_t end;

    memcpy(&end, at(f, arena - 64) + SHMB_ARENA_PUBLISHED_AT, sizeof(end));
    return end;
}

/* Chunks a client published are folded into committed objects: the grant
 * sets the published end to the arena's start; a fold makes each chunk an
 * object under its writer's generation, with the reads counted in its seal
 * before the fold kept (one fewer awaited); a commit_at after them goes on
 * at the next byte. A chunk refused for its key (taken; not UTF-8) is
 * stepped over as a free chunk and told once with its key and code; the
 * chunks after it are folded. */
static void test_fold_published(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s), *r;
    struct store_extent a = arena_ok(f, w, 8192), got;
    struct shmb_error err = {0};
    struct store_refused told;
    uint64_t pos = a.offset, p1, bad, seal;

    (void)state;
    assert_int_equal(published_of(f, a.offset), a.offset);
    assert_int_equal(store_alloc(f->s, o, "taken", 5, 10, 0, &got, &err), 0);
    assert_int_equal(store_commit(f->s, o, "taken", 5, &err), 0);
    p1 = pos;
    pos += publish_at(f, a.offset, pos, "p1", 100, 2, 77, 1);
    /* A reader counted one read in p1's seal before the fold. */
    seal = SHMB_SEAL(77, 1);
    memcpy(at(f, p1) + offsetof(struct shmb_chunk_header, seal), &seal, sizeof(seal));
    pos += publish_at(f, a.offset, pos, "taken", 50, 0, 78, 2);
    bad = pos;
    pos += publish_at(f, a.offset, pos, "\xff\xfe", 50, 0, 79, 3);
    pos += publish_at(f, a.offset, pos, "p2", 200, 0, 80, 4);
    assert_false(store_contains(f->s, "p1", 2));
    store_fold_published(f->s, NULL, false);
    assert_true(store_contains(f->s, "p1", 2));
    assert_true(store_contains(f->s, "p2", 2));
    assert_int_equal(header_at(f, p1).state, SHMB_CHUNK_COMMITTED);
    assert_int_equal(SHMB_SEAL_GEN(header_at(f, p1).seal), 77);
    store_fold(f->s, store_lookup(f->s, "p1", 2)); /* the count taken in */
    assert_int_equal(awaited_of(f, "p1"), 1);
    assert_int_equal(header_at(f, bad).state, SHMB_CHUNK_FREE);
    assert_int_equal(header_at(f, bad).seal, 0);
    assert_true(store_holder_refused(w, &told));
    assert_int_equal(told.count, 2);
    assert_int_equal(told.code, -EEXIST);
    assert_int_equal(told.key_len, 5);
    assert_memory_equal(told.key, "taken", 5);
    assert_false(store_holder_refused(w, &told));
    r = store_holder_new(f->s);
    assert_int_equal(store_get(f->s, r, "p2", 2, &got, &err), 0);
    check_bytes(f, &got, 4);
    /* Folded again: nothing new. A commit_at goes on at the next byte. */
    store_fold_published(f->s, w, false);
    pos += put_at(f, w, pos, "c1", 30, 0, 5);
    assert_true(store_contains(f->s, "c1", 2));
    store_holder_free(f->s, r);
    store_holder_free(f->s, o);
    store_holder_free(f->s, w);
    afix_free(f);
}

/* A published end outside the arena, or behind the cursor, publishes
 * nothing; a chunk published with another id, generation 0 or a size past
 * the published end stops the arena's folds (told once, EBADMSG) and takes
 * it back (the lock REVOKED: the client's next put asks for a new arena);
 * the chunks folded before stay. */
static void test_fold_hostile(void **state)
{
    static const struct {
        const char *what;
        size_t field;
        uint64_t value;
    } spoil[] = {
        {"id", offsetof(struct shmb_chunk_header, id), 999},
        {"generation 0", offsetof(struct shmb_chunk_header, seal), 0},
        {"size", offsetof(struct shmb_chunk_header, payload_size), 1u << 20},
    };
    unsigned i;

    (void)state;
    for (i = 0; i < sizeof(spoil) / sizeof(spoil[0]); i++) {
        struct afix *f = afix_new(DATA_SIZE, 0);
        struct store_holder *w = store_holder_new(f->s);
        struct store_extent a = arena_ok(f, w, 8192);
        struct store_refused told;
        uint64_t pos = a.offset, second, word;

        pos += publish_at(f, a.offset, pos, "good", 100, 0, 5, 1);
        /* Past the arena's end: nothing. */
        word = a.offset + a.size + 64;
        memcpy(at(f, a.offset - 64) + SHMB_ARENA_PUBLISHED_AT, &word, sizeof(word));
        store_fold_published(f->s, NULL, false);
        assert_false(store_contains(f->s, "good", 4));
        word = pos;
        memcpy(at(f, a.offset - 64) + SHMB_ARENA_PUBLISHED_AT, &word, sizeof(word));
        store_fold_published(f->s, NULL, false);
        assert_true(store_contains(f->s, "good", 4));
        second = pos;
        pos += publish_at(f, a.offset, pos, "next", 100, 0, 6, 2);
        pos += publish_at(f, a.offset, pos, "after", 100, 0, 7, 3);
        memcpy(at(f, second) + spoil[i].field, &spoil[i].value, sizeof(uint64_t));
        store_fold_published(f->s, NULL, false);
        if (store_contains(f->s, "next", 4) || store_contains(f->s, "after", 5))
            fail_msg("%s: a chunk after a malformed one was folded", spoil[i].what);
        assert_true(store_holder_refused(w, &told));
        assert_int_equal(told.count, 1);
        assert_int_equal(told.code, -EBADMSG);
        if (strstr(told.message, "was not folded") == NULL)
            fail_msg("%s: %s", spoil[i].what, told.message);
        assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
        /* No more folds, no more refusals told. */
        store_fold_published(f->s, NULL, false);
        assert_false(store_holder_refused(w, &told));
        /* Given back: the chunk folded before stays. */
        store_holder_free(f->s, w);
        assert_true(store_contains(f->s, "good", 4));
        afix_free(f);
    }
}

/* The arena is not taken back (revoke) while published chunks wait for a
 * fold; a fold lets it go. When the client gives it back (close), the
 * published end becomes the closed mark in the same step, so that a client
 * still writing learns its chunk was not published; what was published
 * before is folded. Adoption folds what was published when the daemon
 * died. */
static void test_fold_close_and_adopt(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 8192), b;
    struct store_adopt_report report;
    uint64_t pos = a.offset;

    (void)state;
    pos += publish_at(f, a.offset, pos, "x1", 100, 0, 9, 1);
    sleep_ms(20);
    store_expire_pending(f->s, 10); /* unused for --alloc-timeout, but not folded */
    assert_int_equal(stats_of(f).arenas, 1);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_IDLE);
    pos += publish_at(f, a.offset, pos, "x2", 100, 0, 10, 2);
    b = arena_ok(f, w, 4096); /* gives a back: folded and closed */
    assert_true(store_contains(f->s, "x1", 2));
    assert_true(store_contains(f->s, "x2", 2));
    assert_int_equal(published_of(f, a.offset), SHMB_ARENA_PUBLISH_CLOSED);
    pos = b.offset;
    pos += publish_at(f, b.offset, pos, "y1", 100, 1, 11, 3);
    crash_and_adopt(f, &report);
    assert_false(report.corrupt);
    assert_true(store_contains(f->s, "y1", 2));
    assert_int_equal(awaited_of(f, "y1"), 1);
    assert_int_equal(header_at(f, b.offset).state, SHMB_CHUNK_COMMITTED);
    afix_free(f);
}

/* Put a chunk header with the given fields (the rest those of a sound
 * published chunk of key at pos) and publish up to end. */
static void publish_header(struct afix *f, uint64_t arena, uint64_t pos,
                           const struct shmb_chunk_header *c, const char *key, size_t key_len,
                           uint64_t end)
{
    memcpy(at(f, pos), c, sizeof(*c));
    memcpy(at(f, pos) + sizeof(*c), key, key_len);
    memcpy(at(f, arena - 64) + SHMB_ARENA_PUBLISHED_AT, &end, sizeof(end));
}

/* A client that puts through commit_at and publishes in the same arena
 * (one connection doing both kinds of put): the chunk of its commit_at,
 * whose header is the daemon's to write, lies at the cursor when a fold
 * comes before that commit_at is handled (it is counted on its way). The
 * fold waits for it instead of taking the arena back: the commit_at lands,
 * then the published chunk behind it is folded; nothing is refused. */
static void test_fold_behind_commit_at(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 8192), e;
    struct shmb_error err = {0};
    struct store_refused told;
    uint64_t pos = a.offset, c1 = pos, chunk;

    (void)state;
    chunk = lay(f, pos, "c1", 100, 1); /* copied, its header scribbled */
    set_inflight(f, a.offset, 1);      /* its commit_at sent */
    pos += chunk;
    pos += publish_at(f, a.offset, pos, "p1", 100, 0, 21, 2);
    store_fold_published(f->s, NULL, false); /* another client's request */
    assert_false(store_holder_refused(w, &told));
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_IDLE);
    assert_false(store_contains(f->s, "p1", 2));
    store_fold_published(f->s, NULL, false); /* the writer's commit_at's own fold */
    assert_int_equal(store_commit_at(f->s, w, "c1", 2, c1, 100, 0, &e, &err), 0);
    store_fold_published(f->s, NULL, false); /* the next request */
    assert_true(store_contains(f->s, "c1", 2));
    assert_true(store_contains(f->s, "p1", 2));
    assert_false(store_holder_refused(w, &told));
    assert_int_equal(inflight_of(f, a.offset), 0);
    store_holder_free(f->s, w);
    afix_free(f);
}

/* A published end past a chunk that is sound but not published (a
 * committed or free chunk's header the client wrote, a gap) with no
 * commit_at on its way stops the folds (told once, EBADMSG) and takes the
 * arena back: it does not hold the arena, and the ring behind it, for as
 * long as the client lives. */
static void test_fold_not_published(void **state)
{
    static const uint16_t states[] = {SHMB_CHUNK_COMMITTED, SHMB_CHUNK_FREE,
                                      SHMB_CHUNK_PENDING, SHMB_CHUNK_GAP};
    unsigned i;

    (void)state;
    for (i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        struct afix *f = afix_new(DATA_SIZE, 0);
        struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
        struct store_extent a = arena_ok(f, w, 8192);
        struct shmb_error err = {0};
        struct store_refused told;
        uint64_t pos = a.offset, chunk = SHMB_CHUNK_SIZE(2, 100);
        struct shmb_chunk_header c = {
            .magic = SHMB_CHUNK_MAGIC,
            .state = states[i],
            .key_len = 2,
            .header_size = (uint32_t)SHMB_CHUNK_HEADER_SIZE(2),
            .id = header_at(f, a.offset - 64).id,
            .chunk_size = chunk,
            .payload_size = 100,
            .seal = SHMB_SEAL(5, 0),
        };
        char key[32];
        int n;

        pos += publish_at(f, a.offset, pos, "good", 100, 0, 4, 1);
        store_fold_published(f->s, NULL, false);
        if (states[i] == SHMB_CHUNK_GAP) /* a gap runs to the end of what it is in */
            c.chunk_size = a.offset + a.size - pos;
        publish_header(f, a.offset, pos, &c, "zz", 2, pos + c.chunk_size);
        store_fold_published(f->s, NULL, false);
        if (!store_holder_refused(w, &told))
            fail_msg("state %u: nothing told, the arena is held unfolded", states[i]);
        assert_int_equal(told.count, 1);
        assert_int_equal(told.code, -EBADMSG);
        if (strstr(told.message, "was not folded") == NULL)
            fail_msg("state %u: %s", states[i], told.message);
        assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
        assert_false(store_contains(f->s, "zz", 2));
        store_fold_published(f->s, NULL, false);
        assert_false(store_holder_refused(w, &told));
        /* The ring comes round: the arena goes, its folded object with it. */
        for (n = 0; n < 100 && store_contains(f->s, "good", 4); n++) {
            snprintf(key, sizeof(key), "fill%d", n);
            if (store_alloc(f->s, o, key, strlen(key), 4000, 0, NULL, &err) != 0)
                fail_msg("state %u: alloc %d: %s", states[i], n, err.message);
            assert_int_equal(store_commit(f->s, o, key, strlen(key), &err), 0);
        }
        assert_false(store_contains(f->s, "good", 4));
        assert_int_equal(stats_of(f).arenas, 0);
        store_holder_free(f->s, o);
        store_holder_free(f->s, w);
        afix_free(f);
    }
}

/* Every field of a published header scribbled, one at a time: a key of 0,
 * 255 and 300 bytes, a header size that lies, chunk sizes 0, huge, not
 * aligned and overflowing, payload sizes 0 and huge, readers past the
 * limit, another arena's id, generation 0, NUL and non-UTF-8 keys. Each is
 * refused and told once (its key told only when it is one), the daemon
 * keeps its accounts (free space, arena bytes), the good chunk before
 * stays, and a well-formed refusal (a field out of range, not a malformed
 * header) lets the chunk after be folded. */
static void test_fold_scribbled_fields(void **state)
{
    static const struct {
        const char *what;
        size_t field, width;
        uint64_t value;
        bool goes_on; /* stepped over: the chunk after is folded */
        int code;
    } spoil[] = {
        {"key_len 0", offsetof(struct shmb_chunk_header, key_len), 2, 0, true, -EINVAL},
        {"key_len 255", offsetof(struct shmb_chunk_header, key_len), 2, 255, false, -EBADMSG},
        {"key_len 300", offsetof(struct shmb_chunk_header, key_len), 2, 300, false, -EBADMSG},
        {"header_size", offsetof(struct shmb_chunk_header, header_size), 4, 128, false,
         -EBADMSG},
        {"chunk_size 0", offsetof(struct shmb_chunk_header, chunk_size), 8, 0, false,
         -EBADMSG},
        {"chunk_size huge", offsetof(struct shmb_chunk_header, chunk_size), 8, UINT64_MAX - 63,
         false, -EBADMSG},
        {"chunk_size unaligned", offsetof(struct shmb_chunk_header, chunk_size), 8, 200,
         false, -EBADMSG},
        {"payload 0", offsetof(struct shmb_chunk_header, payload_size), 8, 0, false, -EBADMSG},
        {"payload huge", offsetof(struct shmb_chunk_header, payload_size), 8, UINT64_MAX - 10,
         false, -EBADMSG},
        {"tag", offsetof(struct shmb_chunk_header, tag), 4, 1000001, true, -EINVAL},
        {"tag max", offsetof(struct shmb_chunk_header, tag), 4, UINT32_MAX, true, -EINVAL},
        {"id", offsetof(struct shmb_chunk_header, id), 8, 1, false, -EBADMSG},
        {"generation 0", offsetof(struct shmb_chunk_header, seal), 8, SHMB_SEAL(0, 3), false,
         -EBADMSG},
        {"magic", offsetof(struct shmb_chunk_header, magic), 4, 0, false, -EBADMSG},
        {"state 7", offsetof(struct shmb_chunk_header, state), 2, 7, false, -EBADMSG},
        {"state arena", offsetof(struct shmb_chunk_header, state), 2, SHMB_CHUNK_ARENA, false,
         -EBADMSG},
        {"key NUL", sizeof(struct shmb_chunk_header) + 1, 1, 0, true, -EINVAL},
        {"key not UTF-8", sizeof(struct shmb_chunk_header), 1, 0xff, true, -EINVAL},
    };
    unsigned i;

    (void)state;
    for (i = 0; i < sizeof(spoil) / sizeof(spoil[0]); i++) {
        struct afix *f = afix_new(DATA_SIZE, 0);
        struct store_holder *w = store_holder_new(f->s);
        struct store_extent a = arena_ok(f, w, 8192);
        struct store_refused told;
        struct store_stats before;
        uint64_t pos = a.offset, bad;

        pos += publish_at(f, a.offset, pos, "good", 100, 0, 5, 1);
        store_fold_published(f->s, NULL, false);
        before = stats_of(f);
        bad = pos;
        pos += publish_at(f, a.offset, pos, "bad", 100, 0, 6, 2);
        pos += publish_at(f, a.offset, pos, "after", 100, 0, 7, 3);
        memcpy(at(f, bad) + spoil[i].field, &spoil[i].value, spoil[i].width);
        store_fold_published(f->s, NULL, false);
        if (!store_holder_refused(w, &told))
            fail_msg("%s: not told", spoil[i].what);
        if (told.count != 1 || told.code != spoil[i].code)
            fail_msg("%s: told %llu, code %d: %s", spoil[i].what,
                     (unsigned long long)told.count, told.code, told.message);
        if (told.key_len != 0 && shmb_key_check(told.key, told.key_len, NULL) != 0)
            fail_msg("%s: a key told that is not one", spoil[i].what);
        if (store_contains(f->s, "after", 5) != spoil[i].goes_on)
            fail_msg("%s: the chunk after %s", spoil[i].what,
                     spoil[i].goes_on ? "was not folded" : "was folded");
        assert_true(store_contains(f->s, "good", 4));
        assert_false(store_contains(f->s, "bad", 3));
        assert_int_equal(stats_of(f).used, before.used);
        store_fold_published(f->s, NULL, false);
        assert_false(store_holder_refused(w, &told));
        store_holder_free(f->s, w);
        assert_true(store_contains(f->s, "good", 4));
        afix_free(f);
    }
}

/* An arena of more published chunks than one may hold
 * (SHMB_ARENA_MAX_OBJECTS): those up to the limit are folded, the next is
 * refused (ESTALE, told once) and the arena taken back; the objects stay. */
static void test_fold_max_objects(void **state)
{
    struct afix *f = afix_new(16u << 20, 4u << 20);
    struct store_holder *w = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 2u << 20);
    struct store_refused told;
    uint64_t pos = a.offset;
    char key[32];
    unsigned i;

    (void)state;
    assert_true(a.size >= (SHMB_ARENA_MAX_OBJECTS + 2) * SHMB_CHUNK_SIZE(5, 8));
    for (i = 0; i <= SHMB_ARENA_MAX_OBJECTS; i++) {
        snprintf(key, sizeof(key), "m%u", i);
        pos += publish_at(f, a.offset, pos, key, 8, 0, i + 1, i);
    }
    store_fold_published(f->s, NULL, false);
    assert_int_equal(stats_of(f).objects, SHMB_ARENA_MAX_OBJECTS);
    snprintf(key, sizeof(key), "m%u", SHMB_ARENA_MAX_OBJECTS - 1);
    assert_true(store_contains(f->s, key, strlen(key)));
    snprintf(key, sizeof(key), "m%u", SHMB_ARENA_MAX_OBJECTS);
    assert_false(store_contains(f->s, key, strlen(key)));
    assert_true(store_holder_refused(w, &told));
    assert_int_equal(told.count, 1);
    assert_int_equal(told.code, -ESTALE);
    assert_int_equal(lock_of(f, a.offset), SHMB_ARENA_REVOKED);
    store_fold_published(f->s, NULL, false);
    assert_false(store_holder_refused(w, &told));
    store_holder_free(f->s, w);
    assert_int_equal(stats_of(f).objects, SHMB_ARENA_MAX_OBJECTS);
    afix_free(f);
}

/* Count one read in the seal of the chunk at pos, as a reader of the
 * mapping does (generation checked). */
static void count_read(struct afix *f, uint64_t pos)
{
    uint64_t seal;

    memcpy(&seal, at(f, pos) + offsetof(struct shmb_chunk_header, seal), sizeof(seal));
    seal = SHMB_SEAL(SHMB_SEAL_GEN(seal), SHMB_SEAL_COUNT(seal) + 1);
    memcpy(at(f, pos) + offsetof(struct shmb_chunk_header, seal), &seal, sizeof(seal));
}

/* Reads counted in a published chunk's seal before its fold, and after,
 * are each taken once: an object whose awaited reads were all made lets
 * the ring come round (its arena goes), one awaiting a read holds it until
 * that read is counted; no read is lost or counted twice. */
static void test_fold_reads_then_evict(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 8192);
    struct shmb_error err = {0};
    uint64_t pos = a.offset, p1, p2, p3;
    char key[32];
    int n, rc = 0;

    (void)state;
    p1 = pos;
    pos += publish_at(f, a.offset, pos, "p1", 100, 1, 31, 1);
    p2 = pos;
    pos += publish_at(f, a.offset, pos, "p2", 100, 2, 32, 2);
    p3 = pos;
    pos += publish_at(f, a.offset, pos, "p3", 100, 1, 33, 3);
    count_read(f, p1);
    count_read(f, p2);
    store_fold_published(f->s, NULL, false);
    count_read(f, p2); /* after the fold */
    store_holder_free(f->s, w); /* given back: nobody holds it */
    for (n = 0; n < 100 && rc == 0; n++) {
        snprintf(key, sizeof(key), "fill%d", n);
        if ((rc = store_alloc(f->s, o, key, strlen(key), 4000, 0, NULL, &err)) == 0)
            assert_int_equal(store_commit(f->s, o, key, strlen(key), &err), 0);
    }
    assert_int_equal(rc, -ENOSPC);
    assert_true(store_contains(f->s, "p3", 2)); /* awaits its read */
    assert_int_equal(awaited_of(f, "p3"), 1);
    count_read(f, p3);
    snprintf(key, sizeof(key), "last");
    assert_int_equal(store_alloc(f->s, o, key, strlen(key), 4000, 0, NULL, &err), 0);
    assert_int_equal(store_commit(f->s, o, key, strlen(key), &err), 0);
    assert_false(store_contains(f->s, "p1", 2));
    assert_false(store_contains(f->s, "p3", 2));
    assert_int_equal(stats_of(f).fast_reads, 4);
    store_holder_free(f->s, o);
    afix_free(f);
}

/* A client in the middle of a publish (its lock BUSY, its chunk written)
 * when its arena's folds stop, or when the daemon died and its successor
 * adopts the arena: its swap of the published end, which comes next, must
 * fail, so that it learns its chunk was not published and lays it out
 * again (in a new arena) rather than count on a chunk nobody will fold.
 * The daemon leaves the closed mark in the published end in the same step
 * as it reads it. */
static void test_fold_closed_under_writer(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 8192);
    struct store_adopt_report report;
    uint64_t pos = a.offset, bad;

    (void)state;
    pos += publish_at(f, a.offset, pos, "ok", 100, 0, 3, 1);
    bad = pos;
    pos += publish_at(f, a.offset, pos, "bad", 100, 0, 4, 2);
    memset(at(f, bad), 0, 8); /* malformed */
    set_lock(f, a.offset, SHMB_ARENA_BUSY); /* the next one on its way */
    store_fold_published(f->s, NULL, false);
    assert_true(store_contains(f->s, "ok", 2));
    assert_int_equal(published_of(f, a.offset), SHMB_ARENA_PUBLISH_CLOSED);
    store_holder_free(f->s, w);
    afix_free(f);

    f = afix_new(DATA_SIZE, 0);
    w = store_holder_new(f->s);
    a = arena_ok(f, w, 8192);
    pos = a.offset;
    pos += publish_at(f, a.offset, pos, "kept", 100, 0, 3, 1);
    set_lock(f, a.offset, SHMB_ARENA_BUSY);
    crash_and_adopt(f, &report);
    assert_false(report.corrupt);
    assert_true(store_contains(f->s, "kept", 4));
    assert_int_equal(published_of(f, a.offset), SHMB_ARENA_PUBLISH_CLOSED);
    /* A second crash walks what the first adoption kept, no more. */
    crash_and_adopt(f, &report);
    assert_true(store_contains(f->s, "kept", 4));
    assert_int_equal(report.restored, 1);
    afix_free(f);
    (void)pos;
}

/* Reclaim reaching an arena with published chunks not folded yet leaves
 * it alone (an allocation that needs its room is told the room is held by
 * commits on their way, so that it waits and is tried again), and the next
 * fold lets it go: the allocation then succeeds, the folded objects go
 * with the arena. */
static void test_reclaim_waits_for_fold(void **state)
{
    struct afix *f = afix_new(DATA_SIZE, 0);
    struct store_holder *w = store_holder_new(f->s), *o = store_holder_new(f->s);
    struct store_extent a = arena_ok(f, w, 8192);
    struct shmb_error err = {0};
    int n = 0;

    (void)state;
    publish_at(f, a.offset, a.offset, "unfolded", 100, 0, 8, 1);
    assert_int_equal(fill(f, o, &n), -ENOSPC);
    assert_true(store_commits_due(f->s));
    assert_int_equal(stats_of(f).arenas, 1);
    store_fold_published(f->s, NULL, false);
    assert_true(store_contains(f->s, "unfolded", 8));
    assert_false(store_commits_due(f->s));
    assert_int_equal(store_alloc(f->s, o, "room", 4, 4000, 0, NULL, &err), 0);
    assert_false(store_contains(f->s, "unfolded", 8));
    assert_int_equal(stats_of(f).arenas, 0);
    store_holder_free(f->s, o);
    store_holder_free(f->s, w);
    afix_free(f);
}

/* The catalog's slots in test_catalog_listing, after a data area of
 * DATA_SIZE bytes in a buffer laid out as a segment. */
#define CAT_SLOTS 64u

/* The catalog entry listing the chunk at offset, or NULL. */
static const struct shmb_catalog_entry *listed_at(const unsigned char *seg, uint64_t offset)
{
    const struct shmb_catalog_entry *t =
        (const struct shmb_catalog_entry *)(seg + SHMB_HEADER_PAGE + DATA_SIZE);
    unsigned i;

    for (i = 0; i < CAT_SLOTS; i++)
        if (t[i].chunk == offset)
            return &t[i];
    return NULL;
}

/* commit_at publishes as commit does: the chunk sealed with a generation,
 * THEN listed in the catalog (AWAITED when it awaits reads); an eviction of
 * the arena unlists each object and swaps its seal to 0; an adoption lists
 * the arena's objects again under new generations. */
static void test_catalog_listing(void **state)
{
    struct store_config cfg = {0};
    struct shmb_error err = {0};
    struct store_adopt_report report;
    size_t bytes = SHMB_HEADER_PAGE + DATA_SIZE + SHMB_HEADER_PAGE;
    struct afix f = {.size = DATA_SIZE};
    unsigned char *seg = aligned_alloc(SHMB_HEADER_PAGE, bytes);
    struct catalog *cat;
    struct store_holder *w, *o;
    const struct shmb_catalog_entry *e1, *e2;
    struct store_extent a;
    uint64_t pos, second;
    uint32_t gen1;

    (void)state;
    assert_non_null(seg);
    memset(seg, 0, bytes);
    f.data = seg + SHMB_HEADER_PAGE; /* segment offsets are buffer offsets */
    cat = catalog_new(seg, SHMB_HEADER_PAGE + DATA_SIZE, CAT_SLOTS, 7,
                      (struct shmb_segment_header *)seg, &err);
    assert_non_null(cat);
    cfg.catalog = cat;
    f.s = store_new(f.data, DATA_OFFSET, DATA_SIZE, &f.cursor, &cfg, &err);
    assert_non_null(f.s);
    w = store_holder_new(f.s);
    o = store_holder_new(f.s);

    a = arena_ok(&f, w, 4096);
    pos = a.offset + put_at(&f, w, a.offset, "c1", 100, 0, 1);
    second = pos;
    pos += put_at(&f, w, pos, "c2", 100, 3, 2);
    e1 = listed_at(seg, a.offset);
    e2 = listed_at(seg, second);
    assert_non_null(e1);
    assert_non_null(e2);
    gen1 = e1->gen;
    assert_true(gen1 != 0);
    assert_int_equal(SHMB_SEAL_GEN(header_at(&f, a.offset).seal), gen1);
    assert_int_equal(SHMB_SEAL_COUNT(header_at(&f, a.offset).seal), 0);
    assert_int_equal(e1->size, 100);
    assert_int_equal(e1->flags & SHMB_CATALOG_AWAITED, 0);
    assert_int_equal(e2->flags & SHMB_CATALOG_AWAITED, SHMB_CATALOG_AWAITED);
    assert_int_equal(catalog_listed(cat), 2);
    /* The arena's own header is never listed: its seal is the lock word,
     * a random token with the lock IDLE. */
    assert_true((header_at(&f, a.offset - 64).seal & ~UINT64_C(3)) != 0);
    assert_int_equal(SHMB_ARENA_WORD_LOCK(header_at(&f, a.offset - 64).seal), SHMB_ARENA_IDLE);

    /* Adopted: listed again, under generations after those seen. */
    store_free(f.s);
    catalog_free(cat);
    cat = catalog_new(seg, SHMB_HEADER_PAGE + DATA_SIZE, CAT_SLOTS, 7,
                      (struct shmb_segment_header *)seg, &err);
    assert_non_null(cat);
    cfg.catalog = cat;
    f.s = store_adopt(f.data, DATA_OFFSET, DATA_SIZE, &f.cursor, &cfg, &report, &err);
    assert_non_null(f.s);
    assert_int_equal(report.restored, 2);
    assert_int_equal(catalog_listed(cat), 2);
    assert_non_null(e1 = listed_at(seg, a.offset));
    assert_true(e1->gen > gen1);
    assert_int_equal(SHMB_SEAL_GEN(header_at(&f, a.offset).seal), e1->gen);

    /* Evicted (the reads c2 awaits forgone first): unlisted, seals 0. */
    w = store_holder_new(f.s);
    o = store_holder_new(f.s);
    for (int i = 0; i < 3; i++)
        assert_int_equal(store_forgo_read(f.s, "c2", 2), 0);
    for (int i = 0; i < 5; i++) {
        char key[16];

        snprintf(key, sizeof(key), "big%d", i);
        assert_int_equal(store_alloc(f.s, o, key, strlen(key), 16000, 0, NULL, &err), 0);
        assert_int_equal(store_commit(f.s, o, key, strlen(key), &err), 0);
    }
    assert_false(store_contains(f.s, "c1", 2));
    assert_false(store_contains(f.s, "c2", 2));
    assert_int_equal(listed_at(seg, a.offset) == NULL ||
                         listed_at(seg, a.offset)->gen != e1->gen,
                     true);
    assert_int_equal(catalog_listed(cat), (size_t)stats_of(&f).objects);
    store_holder_free(f.s, w);
    store_holder_free(f.s, o);
    store_free(f.s);
    catalog_free(cat);
    free(seg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grant_clamps),
        cmocka_unit_test(test_commit_in_order),
        cmocka_unit_test(test_commit_refusals),
        cmocka_unit_test(test_give_back),
        cmocka_unit_test(test_reclaim_blocked_by_pin),
        cmocka_unit_test(test_revoke_idle_busy),
        cmocka_unit_test(test_revoke_waits_for_commits),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_disconnect_keeps_committed),
        cmocka_unit_test(test_adopt),
        cmocka_unit_test(test_catalog_listing),
        cmocka_unit_test(test_fold_published),
        cmocka_unit_test(test_fold_hostile),
        cmocka_unit_test(test_fold_close_and_adopt),
        cmocka_unit_test(test_fold_behind_commit_at),
        cmocka_unit_test(test_fold_not_published),
        cmocka_unit_test(test_fold_scribbled_fields),
        cmocka_unit_test(test_fold_max_objects),
        cmocka_unit_test(test_fold_reads_then_evict),
        cmocka_unit_test(test_fold_closed_under_writer),
        cmocka_unit_test(test_reclaim_waits_for_fold),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
