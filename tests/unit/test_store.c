// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the object store (daemon/store.c): vLLM's
 * tests/distributed/test_shm_storage.py scenarios through the store API, pins
 * and holders, and a long random run checked against a reference model.
 * Links store.o, ring.o, index.o and proto; the data area is plain memory.
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

#include "../../daemon/catalog.h"
#include "../../proto/catalog.h"
#include "alloc.h"
#include "clock.h"
#include "ring.h"
#include "segment.h"
#include "store.h"

/* Where the data area would start in a segment: extents count from there. */
#define DATA_OFFSET 4096u
#define FILL 0xa5

struct sfix {
    struct store *s;
    unsigned char *data;
    uint64_t size;
    struct shmb_segment_header cursor;
};

/* A store over size bytes of fresh memory; max 0 means the default. */
static struct sfix *sfix_new(uint64_t size, uint64_t max)
{
    struct store_config cfg = {.max_object_size = max};
    struct shmb_error err = {0};
    struct sfix *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->size = size;
    f->data = aligned_alloc(SHMB_ALIGN, size);
    assert_non_null(f->data);
    memset(f->data, FILL, size);
    f->s = store_new(f->data, DATA_OFFSET, size, &f->cursor, &cfg, &err);
    if (f->s == NULL)
        fail_msg("store_new(%llu, max %llu): %d %s", (unsigned long long)size,
                 (unsigned long long)max, err.code, err.message);
    return f;
}

static void sfix_free(struct sfix *f)
{
    store_free(f->s);
    free(f->data);
    free(f);
}

static unsigned char *payload(const struct sfix *f, const struct store_extent *e)
{
    assert_true(e->offset >= DATA_OFFSET);
    assert_true(e->offset - DATA_OFFSET + e->size <= f->size);
    return f->data + (e->offset - DATA_OFFSET);
}

/* The bytes an object with this seed holds: cheap, and different per seed. */
static unsigned char pattern_byte(uint64_t seed, uint64_t i)
{
    return (unsigned char)((seed * 131 + i * 7 + (i >> 8)) ^ (seed >> 3));
}

static void write_pattern(unsigned char *p, uint64_t size, uint64_t seed)
{
    uint64_t i;

    for (i = 0; i < size; i++)
        p[i] = pattern_byte(seed, i);
}

static void check_pattern(const unsigned char *p, uint64_t size, uint64_t seed)
{
    uint64_t i;

    for (i = 0; i < size; i++)
        if (p[i] != pattern_byte(seed, i))
            fail_msg("payload byte %llu of object seed %llu is %u, expected %u",
                     (unsigned long long)i, (unsigned long long)seed, p[i],
                     pattern_byte(seed, i));
}

/* alloc + write the pattern + commit; returns 0 or alloc's error. */
static int put(struct sfix *f, struct store_holder *h, const char *key, uint64_t size,
               uint32_t readers, uint64_t seed, struct store_extent *out,
               struct shmb_error *err)
{
    struct store_extent e;
    int rc = store_alloc(f->s, h, key, strlen(key), size, readers, &e, err);

    if (rc != 0)
        return rc;
    assert_int_equal(e.size, size);
    assert_int_equal(e.offset % SHMB_ALIGN, 0);
    write_pattern(payload(f, &e), size, seed);
    rc = store_commit(f->s, h, key, strlen(key), err);
    if (rc != 0)
        fail_msg("commit '%s' = %d: %s", key, rc, err->message);
    if (out != NULL)
        *out = e;
    return 0;
}

static void put_ok(struct sfix *f, struct store_holder *h, const char *key,
                   uint64_t size, uint32_t readers, uint64_t seed, struct store_extent *out)
{
    struct shmb_error err = {0};
    int rc = put(f, h, key, size, readers, seed, out, &err);

    if (rc != 0)
        fail_msg("put '%s' (%llu bytes) = %d: %s", key, (unsigned long long)size, rc,
                 err.message);
}

/* get, check extent and pattern, and release unless keep. */
static void read_ok(struct sfix *f, struct store_holder *h, const char *key, uint64_t size,
                    uint64_t seed, bool keep)
{
    struct shmb_error err = {0};
    struct store_extent e;
    int rc = store_get(f->s, h, key, strlen(key), &e, &err);

    if (rc != 0)
        fail_msg("get '%s' = %d: %s", key, rc, err.message);
    assert_int_equal(e.size, size);
    check_pattern(payload(f, &e), size, seed);
    if (!keep)
        assert_int_equal(store_release(f->s, h, key, strlen(key), &err), 0);
}

static struct store_stats stats_of(const struct sfix *f)
{
    struct store_stats st;

    store_stats(f->s, &st);
    assert_int_equal(st.data_size, f->size);
    assert_int_equal(st.used + st.free, st.data_size);
    return st;
}

/* True when text holds value as a whole decimal number (not part of another). */
static bool has_number(const char *text, unsigned long long value)
{
    const char *p = text;

    while (*p != '\0') {
        if (*p >= '0' && *p <= '9') {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);

            if (v == value && (p == text || p[-1] != '.') && *end != '.')
                return true;
            p = end;
        } else {
            p++;
        }
    }
    return false;
}

static void expect_message_has(const struct shmb_error *err, const char *what)
{
    if (strstr(err->message, what) == NULL)
        fail_msg("message does not name '%s': '%s'", what, err->message);
}

/* vLLM test_minimal_put_get_cycle: a put (alloc, write, commit) is found by
 * key, get returns the same extent with the same bytes, and release drops
 * the pin. */
static void test_minimal_put_get_cycle(void **state)
{
    struct sfix *f = sfix_new(1024 * 100, 1024 * 10);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent w, r;
    struct store_stats st;

    (void)state;
    assert_non_null(h);
    assert_false(store_contains(f->s, "test_key", 8));
    assert_int_equal(store_alloc(f->s, h, "test_key", 8, 30, 0, &w, &err), 0);
    assert_true(w.offset >= DATA_OFFSET + 64);
    memcpy(payload(f, &w), "field1=0123456789field2=012345", 30);
    assert_false(store_contains(f->s, "test_key", 8));
    assert_int_equal(store_commit(f->s, h, "test_key", 8, &err), 0);
    assert_true(store_contains(f->s, "test_key", 8));

    assert_int_equal(store_get(f->s, h, "test_key", 8, &r, &err), 0);
    assert_int_equal(r.offset, w.offset);
    assert_int_equal(r.size, 30);
    assert_memory_equal(payload(f, &r), "field1=0123456789field2=012345", 30);
    st = stats_of(f);
    assert_int_equal(st.pinned, 1);
    assert_int_equal(store_release(f->s, h, "test_key", 8, &err), 0);
    st = stats_of(f);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.objects, 1);
    assert_true(store_contains(f->s, "test_key", 8));
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* vLLM test_put_same_key_twice: a second alloc of a committed key is -EEXIST
 * with a message naming the key, and the first object is unchanged; a key
 * that is still pending is taken too. */
static void test_put_same_key_twice(void **state)
{
    struct sfix *f = sfix_new(1024 * 100, 1024 * 10);
    struct store_holder *h = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;

    (void)state;
    put_ok(f, h, "duplicate_key", 11, 0, 1, NULL);
    read_ok(f, h, "duplicate_key", 11, 1, false);
    assert_int_equal(store_alloc(f->s, h, "duplicate_key", 13, 12, 0, &e, &err), -EEXIST);
    assert_int_equal(err.code, -EEXIST);
    expect_message_has(&err, "duplicate_key");
    assert_int_equal(store_alloc(f->s, h2, "duplicate_key", 13, 12, 0, &e, &err), -EEXIST);
    read_ok(f, h2, "duplicate_key", 11, 1, false);

    assert_int_equal(store_alloc(f->s, h, "pending_key", 11, 12, 0, &e, &err), 0);
    shmb_error_clear(&err);
    assert_int_equal(store_alloc(f->s, h2, "pending_key", 11, 12, 0, &e, &err), -EEXIST);
    expect_message_has(&err, "pending_key");
    assert_int_equal(store_alloc(f->s, h, "pending_key", 11, 12, 0, &e, &err), -EEXIST);
    assert_int_equal(stats_of(f).pending, 1);
    assert_int_equal(stats_of(f).allocs, 2);
    store_holder_free(f->s, h);
    store_holder_free(f->s, h2);
    sfix_free(f);
}

/* vLLM test_large_object_rejection: an object over the max object size is
 * -E2BIG with exactly vLLM's message, nothing is allocated, and an object of
 * exactly the max size is accepted; the default max is half the data area. */
static void test_large_object_rejection(void **state)
{
    struct sfix *f = sfix_new(1024 * 100, 1024 * 10);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;

    (void)state;
    assert_int_equal(stats_of(f).max_object_size, 10240);
    assert_int_equal(store_alloc(f->s, h, "large_key", 9, 10240 + 100, 0, &e, &err), -E2BIG);
    assert_int_equal(err.code, -E2BIG);
    assert_string_equal(err.message,
                        "Object size (10340 bytes) exceeds max object size (10240 bytes)");
    st = stats_of(f);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.pending, 0);
    assert_int_equal(store_alloc(f->s, h, "large_key", 9, 10241, 0, &e, &err), -E2BIG);
    assert_int_equal(store_alloc(f->s, h, "large_key", 9, 10240, 0, &e, &err), 0);
    assert_int_equal(e.size, 10240);
    store_holder_free(f->s, h);
    sfix_free(f);

    f = sfix_new(8192, 0);
    assert_int_equal(stats_of(f).max_object_size, 4096);
    h = store_holder_new(f->s);
    assert_int_equal(store_alloc(f->s, h, "k", 1, 4097, 0, &e, &err), -E2BIG);
    assert_string_equal(err.message,
                        "Object size (4097 bytes) exceeds max object size (4096 bytes)");
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* Bad arguments are -EINVAL or -ENOENT and change nothing. */
static void test_invalid_arguments(void **state)
{
    static char long_key[300];
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;

    (void)state;
    memset(long_key, 'x', sizeof(long_key));
    assert_int_equal(store_alloc(f->s, h, long_key, 256, 10, 0, &e, &err), -EINVAL);
    assert_int_equal(store_alloc(f->s, h, "k", 1, 0, 0, &e, &err), -EINVAL);
    assert_int_equal(store_alloc(f->s, h, "k", 1, 10, STORE_MAX_READERS + 1, &e, &err),
                     -EINVAL);
    assert_int_equal(store_alloc(f->s, h, "k", 0, 10, 0, &e, &err), -EINVAL);
    assert_int_equal(stats_of(f).used, 0);
    assert_int_equal(store_alloc(f->s, h, long_key, 255, 10, STORE_MAX_READERS, &e, &err), 0);
    assert_int_equal(store_commit(f->s, h, long_key, 255, &err), 0);
    assert_int_equal(store_touch(f->s, long_key, 255, STORE_MAX_READERS + 1, &err), -EINVAL);
    assert_int_equal(store_touch(f->s, "nope", 4, 1, &err), -ENOENT);
    assert_int_equal(store_delete(f->s, "nope", 4, &err), -ENOENT);
    assert_int_equal(store_release(f->s, h, "nope", 4, &err), -ENOENT);
    assert_int_equal(store_get(f->s, h, "nope", 4, &e, &err), -ENOENT);
    assert_int_equal(store_commit(f->s, h, "nope", 4, &err), -ENOENT);
    assert_int_equal(store_abort(f->s, h, "nope", 4, &err), -ENOENT);
    assert_int_equal(stats_of(f).objects, 1);
    assert_int_equal(stats_of(f).pending, 0);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* Fill a store with item_N objects of size bytes awaiting readers reads,
 * starting at index first, until -ENOSPC; returns how many went in. */
static int fill_items(struct sfix *f, struct store_holder *h, int first, uint64_t size,
                      uint32_t readers, struct shmb_error *err)
{
    char key[32];
    int i, rc;

    for (i = first;; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        rc = put(f, h, key, size, readers, (uint64_t)i, NULL, err);
        if (rc == -ENOSPC)
            return i - first;
        if (rc != 0)
            fail_msg("put %s = %d: %s", key, rc, err->message);
        assert_true(i - first < 100000);
    }
}

/* vLLM test_buffer_overflow_and_cleanup: objects awaiting one read each fill
 * the ring (exactly as many as fit) and then refuse new ones; once each has
 * been read, new puts reclaim them oldest first and only as many as they
 * need (unlike vLLM's free_unused, which empties the cache), the same number
 * fit again,
 * every surviving object still reads back its own bytes, and the evicted
 * keys are gone. */
static void test_buffer_overflow_and_cleanup(void **state)
{
    struct sfix *f = sfix_new(1024 * 100, 1024 * 10);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    uint64_t chunk = ring_chunk_size(strlen("item_100"), 600);
    char key[32];
    int n, n2, i;

    (void)state;
    n = fill_items(f, w, 0, 600, 1, &err);
    assert_int_equal(n, (int)(f->size / chunk));
    assert_int_equal(err.code, -ENOSPC);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        read_ok(f, r, key, 600, (uint64_t)i, false);
    }
    /* A put reclaims only what it needs: the oldest object, not every object
     * that could go. */
    snprintf(key, sizeof(key), "item_%d", n);
    put_ok(f, w, key, 600, 1, (uint64_t)n, NULL);
    assert_int_equal(stats_of(f).evictions, 1);
    assert_false(store_contains(f->s, "item_0", 6));
    assert_true(store_contains(f->s, "item_1", 6));
    n2 = 1 + fill_items(f, w, n + 1, 600, 1, &err);
    assert_int_equal(n2, n);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        assert_false(store_contains(f->s, key, strlen(key)));
    }
    for (i = n; i < n + n2; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        read_ok(f, r, key, 600, (uint64_t)i, false);
    }
    assert_int_equal(stats_of(f).evictions, (uint64_t)n);
    assert_int_equal(stats_of(f).objects, (uint64_t)n2);
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    sfix_free(f);
}

/* vLLM test_blocking_unread_object: with every object read except the
 * oldest, a new put is -ENOSPC whose message names the unread object and its
 * pin count, and stats name it as the blocker; once it is read, the put
 * succeeds, it is evicted, and many more puts go in. */
static void test_blocking_unread_object(void **state)
{
    struct sfix *f = sfix_new(1024 * 100, 1024 * 10);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_stats st;
    char key[32];
    int n, i, more;

    (void)state;
    n = fill_items(f, w, 0, 600, 1, &err);
    for (i = 1; i < n; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        read_ok(f, r, key, 600, (uint64_t)i, false);
    }
    snprintf(key, sizeof(key), "item_%d", n);
    shmb_error_clear(&err);
    assert_int_equal(put(f, w, key, 600, 1, (uint64_t)n, NULL, &err), -ENOSPC);
    assert_int_equal(err.code, -ENOSPC);
    expect_message_has(&err, "item_0");
    if (!has_number(err.message, 0))
        fail_msg("message does not give the pin count 0: '%s'", err.message);
    st = stats_of(f);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "item_0");
    assert_int_equal(st.blocker_pins, 0);
    assert_int_equal(st.blocker_readers, 1);
    assert_int_equal(st.blocker_state, STORE_COMMITTED);
    assert_int_equal(st.enospc, 2); /* the fill's last put, and this one */
    assert_true(store_contains(f->s, "item_0", 6));

    read_ok(f, r, "item_0", 600, 0, false);
    put_ok(f, w, key, 600, 1, (uint64_t)n, NULL);
    assert_false(store_contains(f->s, "item_0", 6));
    more = fill_items(f, w, n + 1, 600, 1, &err);
    assert_true(more >= 10);
    st = stats_of(f);
    assert_true(st.has_blocker);
    snprintf(key, sizeof(key), "item_%d", n);
    assert_string_equal(st.blocker_key, key);
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    sfix_free(f);
}

/* A pinned oldest object blocks reclaim; the -ENOSPC message gives its pin
 * count (3 gets by one holder) and stats agree; after three releases it is
 * evicted by the next put. */
static void test_blocker_pin_count(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_stats st;
    int i, n;

    (void)state;
    put_ok(f, w, "pinned", 1000, 0, 99, NULL);
    for (i = 0; i < 3; i++)
        read_ok(f, r, "pinned", 1000, 99, true);
    n = fill_items(f, w, 0, 1000, 0, &err);
    assert_true(n >= 5);
    expect_message_has(&err, "'pinned'");
    if (!has_number(err.message, 3))
        fail_msg("message does not give the pin count 3: '%s'", err.message);
    st = stats_of(f);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "pinned");
    assert_int_equal(st.blocker_pins, 3);
    assert_int_equal(st.blocker_readers, 0);
    for (i = 0; i < 3; i++)
        assert_int_equal(store_release(f->s, r, "pinned", 6, &err), 0);
    assert_int_equal(store_release(f->s, r, "pinned", 6, &err), -ENOENT);
    put_ok(f, w, "after", 1000, 0, 7, NULL);
    assert_false(store_contains(f->s, "pinned", 6));
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    sfix_free(f);
}

/* Only the holder that allocated a key may commit or abort it: another
 * holder gets -ENOENT and the allocation stays pending; a committed object
 * can be neither committed nor aborted again; an abort gives the bytes back
 * and frees the key. */
static void test_commit_abort_other_holder(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h1 = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;

    (void)state;
    /* An abort gives the bytes back (the chunk is the only one) and frees
     * the key. */
    assert_int_equal(store_alloc(f->s, h1, "a", 1, 100, 0, &e, &err), 0);
    assert_int_equal(stats_of(f).used, ring_chunk_size(1, 100));
    assert_int_equal(store_abort(f->s, h2, "a", 1, &err), -ENOENT);
    assert_int_equal(store_abort(f->s, h1, "a", 1, &err), 0);
    assert_int_equal(stats_of(f).used, 0);
    assert_int_equal(stats_of(f).pending, 0);
    assert_int_equal(store_abort(f->s, h1, "a", 1, &err), -ENOENT);
    assert_int_equal(store_alloc(f->s, h2, "a", 1, 100, 0, &e, &err), 0);

    assert_int_equal(store_alloc(f->s, h1, "k", 1, 100, 0, &e, &err), 0);
    assert_int_equal(store_commit(f->s, h2, "k", 1, &err), -ENOENT);
    assert_int_equal(err.code, -ENOENT);
    assert_int_equal(store_abort(f->s, h2, "k", 1, &err), -ENOENT);
    assert_int_equal(stats_of(f).pending, 2);
    assert_false(store_contains(f->s, "k", 1));
    assert_int_equal(store_commit(f->s, h1, "k", 1, &err), 0);
    assert_true(store_contains(f->s, "k", 1));
    assert_int_equal(store_commit(f->s, h1, "k", 1, &err), -ENOENT);
    assert_int_equal(store_abort(f->s, h1, "k", 1, &err), -ENOENT);
    assert_true(store_contains(f->s, "k", 1));
    assert_int_equal(stats_of(f).pending, 1);
    assert_int_equal(stats_of(f).commits, 1);
    store_holder_free(f->s, h1);
    store_holder_free(f->s, h2);
    sfix_free(f);
}

/* A pending object is invisible: get (by anyone, its writer included),
 * delete and touch are -ENOENT, contains is false; after commit get works. */
static void test_get_pending(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h1 = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e, g;

    (void)state;
    assert_int_equal(store_alloc(f->s, h1, "p", 1, 100, 0, &e, &err), 0);
    write_pattern(payload(f, &e), 100, 5);
    assert_int_equal(store_get(f->s, h1, "p", 1, &g, &err), -ENOENT);
    assert_int_equal(err.code, -ENOENT);
    assert_int_equal(store_get(f->s, h2, "p", 1, &g, &err), -ENOENT);
    assert_int_equal(store_delete(f->s, "p", 1, &err), -ENOENT);
    assert_int_equal(store_touch(f->s, "p", 1, 1, &err), -ENOENT);
    assert_false(store_contains(f->s, "p", 1));
    assert_int_equal(stats_of(f).pinned, 0);
    assert_int_equal(stats_of(f).gets, 0);
    assert_int_equal(store_commit(f->s, h1, "p", 1, &err), 0);
    read_ok(f, h2, "p", 100, 5, false);
    assert_int_equal(stats_of(f).gets, 1);
    store_holder_free(f->s, h1);
    store_holder_free(f->s, h2);
    sfix_free(f);
}

/* Deleting a pinned object removes its key at once (contains is false, the
 * key can be allocated again) but its bytes stay, untouched, until the last
 * pin goes; then stats.used drops by its chunk. */
static void test_delete_while_pinned(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h1 = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent old, e2;
    struct store_stats st;
    uint64_t chunk = ring_chunk_size(1, 1000);

    (void)state;
    put_ok(f, h2, "A", 1000, 0, 11, &old);
    read_ok(f, h1, "A", 1000, 11, true);
    read_ok(f, h2, "A", 1000, 11, true);
    assert_int_equal(stats_of(f).used, chunk);
    assert_int_equal(store_delete(f->s, "A", 1, &err), 0);
    assert_false(store_contains(f->s, "A", 1));
    assert_int_equal(store_delete(f->s, "A", 1, &err), -ENOENT);
    assert_int_equal(store_get(f->s, h1, "A", 1, &e2, &err), -ENOENT);
    st = stats_of(f);
    assert_int_equal(st.used, chunk);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.deleted_pinned, 1);
    assert_int_equal(st.pinned, 1);

    /* A new object under the same key, in other bytes. */
    assert_int_equal(store_alloc(f->s, h2, "A", 1, 1000, 0, &e2, &err), 0);
    assert_int_not_equal(e2.offset, old.offset);
    write_pattern(payload(f, &e2), 1000, 12);
    check_pattern(payload(f, &old), 1000, 11);
    assert_int_equal(stats_of(f).used, 2 * chunk);

    assert_int_equal(store_release(f->s, h1, "A", 1, &err), 0);
    assert_int_equal(stats_of(f).used, 2 * chunk);
    assert_int_equal(stats_of(f).deleted_pinned, 1);
    check_pattern(payload(f, &old), 1000, 11);
    assert_int_equal(store_release(f->s, h2, "A", 1, &err), 0);
    st = stats_of(f);
    assert_int_equal(st.used, chunk);
    assert_int_equal(st.deleted_pinned, 0);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(store_release(f->s, h2, "A", 1, &err), -ENOENT);

    assert_int_equal(store_commit(f->s, h2, "A", 1, &err), 0);
    assert_true(store_contains(f->s, "A", 1));
    read_ok(f, h1, "A", 1000, 12, false);
    store_holder_free(f->s, h1);
    store_holder_free(f->s, h2);
    sfix_free(f);
}

/* Pins are counted per holder: a holder that got a key twice releases it
 * twice, a third release is -ENOENT, and a holder that holds no pin cannot
 * release another holder's. Holder stats count pins, pending allocations and
 * the bytes of the distinct objects pinned. */
static void test_pins_per_holder(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h1 = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_holder_stats hs;
    struct store_extent e;

    (void)state;
    put_ok(f, h2, "k", 100, 0, 1, NULL);
    put_ok(f, h2, "j", 300, 0, 2, NULL);
    assert_int_equal(store_alloc(f->s, h2, "p", 1, 10, 0, &e, &err), 0);
    read_ok(f, h1, "k", 100, 1, true);
    read_ok(f, h1, "k", 100, 1, true);
    read_ok(f, h1, "j", 300, 2, true);
    store_holder_stats(h1, &hs);
    assert_int_equal(hs.pins, 3);
    assert_int_equal(hs.pending, 0);
    assert_int_equal(hs.bytes_pinned, 400);
    store_holder_stats(h2, &hs);
    assert_int_equal(hs.pins, 0);
    assert_int_equal(hs.pending, 1);
    assert_int_equal(hs.bytes_pinned, 0);
    assert_int_equal(stats_of(f).pinned, 2);

    assert_int_equal(store_release(f->s, h2, "k", 1, &err), -ENOENT);
    assert_int_equal(err.code, -ENOENT);
    assert_int_equal(store_release(f->s, h1, "k", 1, &err), 0);
    store_holder_stats(h1, &hs);
    assert_int_equal(hs.pins, 2);
    assert_int_equal(hs.bytes_pinned, 400);
    assert_int_equal(stats_of(f).pinned, 2);
    assert_int_equal(store_release(f->s, h1, "k", 1, &err), 0);
    assert_int_equal(store_release(f->s, h1, "k", 1, &err), -ENOENT);
    store_holder_stats(h1, &hs);
    assert_int_equal(hs.pins, 1);
    assert_int_equal(hs.bytes_pinned, 300);
    assert_int_equal(stats_of(f).pinned, 1);
    store_holder_free(f->s, h1);
    store_holder_free(f->s, h2);
    sfix_free(f);
}

/* store_holder_free, as on a disconnect, releases all the holder's pins
 * (a pinned oldest object stops blocking, a deleted pinned object's bytes
 * come back) and drops its pending allocations (the key is free again). */
static void test_holder_free(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h1 = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;
    int n;

    (void)state;
    put_ok(f, h2, "old", 500, 0, 1, NULL);
    read_ok(f, h1, "old", 500, 1, true);
    read_ok(f, h1, "old", 500, 1, true);
    put_ok(f, h2, "del", 500, 0, 2, NULL);
    read_ok(f, h1, "del", 500, 2, true);
    assert_int_equal(store_delete(f->s, "del", 3, &err), 0);
    assert_int_equal(store_alloc(f->s, h1, "p", 1, 500, 0, &e, &err), 0);
    n = fill_items(f, h2, 0, 500, 0, &err);
    assert_true(n >= 3);
    expect_message_has(&err, "'old'");
    st = stats_of(f);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "old");
    assert_int_equal(st.blocker_pins, 2);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.deleted_pinned, 1);
    assert_int_equal(st.pinned, 2);

    store_holder_free(f->s, h1);
    st = stats_of(f);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.deleted_pinned, 0);
    assert_int_equal(st.pinned, 0);
    put_ok(f, h2, "next", 500, 0, 3, NULL);
    assert_false(store_contains(f->s, "old", 3));
    assert_int_equal(store_alloc(f->s, h2, "p", 1, 500, 0, &e, &err), 0);
    store_holder_free(f->s, h2);
    assert_int_equal(stats_of(f).pending, 0);
    sfix_free(f);
}

/* touch adds awaited reads to a committed object: with readers 0 plus a
 * touch of 2, the object blocks reclaim until it has been read twice. */
static void test_touch(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *w = store_holder_new(f->s), *r = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_stats st;
    int n;

    (void)state;
    put_ok(f, w, "t", 1000, 0, 4, NULL);
    assert_int_equal(store_touch(f->s, "t", 1, 2, &err), 0);
    n = fill_items(f, w, 0, 1000, 0, &err);
    assert_true(n >= 5);
    expect_message_has(&err, "'t'");
    st = stats_of(f);
    assert_string_equal(st.blocker_key, "t");
    assert_int_equal(st.blocker_readers, 2);
    read_ok(f, r, "t", 1000, 4, false);
    assert_int_equal(put(f, w, "x", 1000, 0, 5, NULL, &err), -ENOSPC);
    assert_int_equal(stats_of(f).blocker_readers, 1);
    read_ok(f, r, "t", 1000, 4, false);
    put_ok(f, w, "x", 1000, 0, 5, NULL);
    assert_false(store_contains(f->s, "t", 1));
    assert_int_equal(store_touch(f->s, "t", 1, 1, &err), -ENOENT);
    store_holder_free(f->s, w);
    store_holder_free(f->s, r);
    sfix_free(f);
}

struct listed {
    size_t n, stop_after;
    char keys[16][32];
    struct store_entry e[16];
};

static int list_record(const struct store_entry *e, void *arg)
{
    struct listed *l = arg;

    assert_true(l->n < 16);
    assert_true(e->key_len < 32);
    memcpy(l->keys[l->n], e->key, e->key_len);
    l->keys[l->n][e->key_len] = '\0';
    l->e[l->n] = *e;
    l->n++;
    return l->stop_after != 0 && l->n >= l->stop_after;
}

static size_t list_of(const struct sfix *f, const char *prefix, size_t limit,
                      struct listed *l, size_t stop_after)
{
    memset(l, 0, sizeof(*l));
    l->stop_after = stop_after;
    return store_list(f->s, prefix, prefix ? strlen(prefix) : 0, limit, list_record, l);
}

/* store_list reports pending, committed and deleted-but-pinned objects,
 * oldest first, filtered by key prefix, at most limit of them, with their
 * extent, pins, awaited reads and state; a non-zero return of the callback
 * stops it. */
static void test_list(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e0, e1, e3;
    struct listed l;

    (void)state;
    put_ok(f, h, "a/0", 10, 0, 0, &e0);
    read_ok(f, h, "a/0", 10, 0, true);
    assert_int_equal(store_delete(f->s, "a/0", 3, &err), 0);
    put_ok(f, h, "a/1", 20, 2, 1, &e1);
    put_ok(f, h, "b/1", 30, 0, 2, NULL);
    put_ok(f, h, "a/2", 40, 0, 3, NULL);
    assert_int_equal(store_alloc(f->s, h, "a/3", 3, 50, 0, &e3, &err), 0);
    put_ok(f, h, "gone", 10, 0, 4, NULL);
    assert_int_equal(store_delete(f->s, "gone", 4, &err), 0);

    assert_int_equal(list_of(f, "a/", SIZE_MAX, &l, 0), 4);
    assert_int_equal(l.n, 4);
    assert_string_equal(l.keys[0], "a/0");
    assert_int_equal(l.e[0].state, STORE_DELETED);
    assert_int_equal(l.e[0].pins, 1);
    assert_int_equal(l.e[0].offset, e0.offset);
    assert_string_equal(l.keys[1], "a/1");
    assert_int_equal(l.e[1].state, STORE_COMMITTED);
    assert_int_equal(l.e[1].awaited_reads, 2);
    assert_int_equal(l.e[1].pins, 0);
    assert_int_equal(l.e[1].offset, e1.offset);
    assert_int_equal(l.e[1].size, 20);
    assert_string_equal(l.keys[2], "a/2");
    assert_string_equal(l.keys[3], "a/3");
    assert_int_equal(l.e[3].state, STORE_PENDING);
    assert_int_equal(l.e[3].offset, e3.offset);
    assert_int_equal(l.e[3].size, 50);

    assert_int_equal(list_of(f, "a/", 2, &l, 0), 2);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.keys[1], "a/1");
    assert_int_equal(list_of(f, "b", SIZE_MAX, &l, 0), 1);
    assert_string_equal(l.keys[0], "b/1");
    assert_int_equal(list_of(f, NULL, SIZE_MAX, &l, 0), 5);
    assert_string_equal(l.keys[2], "b/1");
    assert_int_equal(list_of(f, "zzz", SIZE_MAX, &l, 0), 0);
    assert_int_equal(list_of(f, "a/0/longer", SIZE_MAX, &l, 0), 0);
    list_of(f, NULL, SIZE_MAX, &l, 1);
    assert_int_equal(l.n, 1);
    assert_string_equal(store_state_name(STORE_PENDING), "pending");
    assert_string_equal(store_state_name(STORE_COMMITTED), "committed");
    assert_string_equal(store_state_name(STORE_DELETED), "deleted");
    store_holder_free(f->s, h);
    sfix_free(f);
}

struct walk_states {
    size_t n;
    char keys[8][16];
    uint16_t states[8];
};

static int walk_states_record(const struct shmb_chunk_header *hdr, const char *key,
                              uint64_t payload_offset, void *arg)
{
    struct walk_states *w = arg;

    (void)payload_offset;
    if (hdr->state == SHMB_CHUNK_GAP)
        return 0;
    assert_true(w->n < 8);
    assert_true(hdr->key_len < 16);
    memcpy(w->keys[w->n], key, hdr->key_len);
    w->keys[w->n][hdr->key_len] = '\0';
    w->states[w->n] = hdr->state;
    w->n++;
    return 0;
}

/* The chunk headers in the data area say what a restarted daemon may trust:
 * COMMITTED only for committed objects, PENDING while being written, and a
 * deleted (still pinned) object is no longer COMMITTED. */
static void test_chunk_states_in_segment(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct walk_states w;

    (void)state;
    put_ok(f, h, "del", 10, 0, 0, NULL);
    read_ok(f, h, "del", 10, 0, true);
    assert_int_equal(store_delete(f->s, "del", 3, &err), 0);
    put_ok(f, h, "com", 10, 0, 1, NULL);
    assert_int_equal(store_alloc(f->s, h, "pen", 3, 10, 0, &e, &err), 0);
    memset(&w, 0, sizeof(w));
    assert_int_equal(ring_walk(store_ring(f->s), walk_states_record, &w, &err), 0);
    assert_int_equal(w.n, 3);
    assert_string_equal(w.keys[0], "del");
    assert_int_not_equal(w.states[0], SHMB_CHUNK_COMMITTED);
    assert_int_not_equal(w.states[0], SHMB_CHUNK_PENDING);
    assert_string_equal(w.keys[1], "com");
    assert_int_equal(w.states[1], SHMB_CHUNK_COMMITTED);
    assert_string_equal(w.keys[2], "pen");
    assert_int_equal(w.states[2], SHMB_CHUNK_PENDING);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* stats: used + free == data size, and the object, pending, pinned and
 * deleted-pinned counts and the allocs/commits/gets/evictions/enospc
 * counters follow a scripted sequence exactly. */
static void test_stats(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;
    int n;

    (void)state;
    st = stats_of(f);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.free, 8192);
    assert_int_equal(st.objects + st.pending + st.pinned + st.allocs + st.enospc, 0);
    assert_false(st.has_blocker);

    assert_int_equal(store_alloc(f->s, h, "a", 1, 100, 0, &e, &err), 0);
    write_pattern(payload(f, &e), 100, 0);
    st = stats_of(f);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.allocs, 1);
    assert_int_equal(st.used, ring_chunk_size(1, 100));
    assert_true(st.has_blocker); /* a pending object cannot be reclaimed */
    assert_string_equal(st.blocker_key, "a");
    assert_int_equal(st.blocker_state, STORE_PENDING);
    assert_int_equal(store_commit(f->s, h, "a", 1, &err), 0);
    st = stats_of(f);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.commits, 1);
    assert_false(st.has_blocker);
    read_ok(f, h, "a", 100, 0, true);
    put_ok(f, h, "b", 1000, 1, 1, NULL);
    st = stats_of(f);
    assert_int_equal(st.gets, 1);
    assert_int_equal(st.pinned, 1);
    assert_int_equal(st.objects, 2);
    assert_int_equal(store_delete(f->s, "a", 1, &err), 0);
    st = stats_of(f);
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.deleted_pinned, 1);
    assert_int_equal(st.pinned, 1);
    assert_int_equal(store_release(f->s, h, "a", 1, &err), 0);
    st = stats_of(f);
    assert_int_equal(st.deleted_pinned, 0);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.used, ring_chunk_size(1, 1000));

    n = fill_items(f, h, 0, 1000, 1, &err);
    st = stats_of(f);
    assert_int_equal(st.enospc, 1);
    assert_int_equal(st.allocs, 2 + (uint64_t)n);
    assert_int_equal(st.commits, 2 + (uint64_t)n);
    assert_int_equal(st.objects, 1 + (uint64_t)n);
    assert_int_equal(st.evictions, 0);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "b");
    assert_int_equal(st.blocker_readers, 1);
    assert_int_equal(st.blocker_state, STORE_COMMITTED);
    read_ok(f, h, "b", 1000, 1, false);
    put_ok(f, h, "c", 1000, 0, 2, NULL);
    st = stats_of(f);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.gets, 2);
    assert_int_equal(st.enospc, 1);
    assert_int_equal(st.allocs, 3 + (uint64_t)n);
    assert_int_equal(st.objects, 1 + (uint64_t)n);
    assert_false(store_contains(f->s, "b", 1));
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* The default max object size, for a --size as the daemon's flags take it:
 * half of it, at most 128 MiB, at most what one object can use in the data
 * area (a small segment's header page and longest key take a good part).
 * The figures are those shmbrokerd reported in hello and stats before the
 * rule lived in one place. */
static void test_default_max_object(void **state)
{
    static const struct {
        uint64_t size, max;
    } cases[] = {
        {8192, 3776},           {8193, 4096},
        {10000, 5000},          {12288, 6144},
        {12289, 6144},          {16384, 8192},
        {20000, 10000},         {65536, 32768},
        {100000, 50000},        {1000000, 500000},
        {1048577, 524288},      {33554432, 16777216},
        {268435456, 134217728}, {268439551, 134217728},
        {300000000, 134217728}, {1073741824, 134217728},
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t data = segment_data_size(segment_round_size(cases[i].size), SHMB_HEADER_PAGE, 0);
        uint64_t max = store_default_max_object(cases[i].size, data);

        if (max != cases[i].max)
            fail_msg("--size %llu: default max object %llu, expected %llu",
                     (unsigned long long)cases[i].size, (unsigned long long)max,
                     (unsigned long long)cases[i].max);
        assert_int_equal(store_check_max_object(data, max, NULL), 0);
    }
    /* Without a data area to measure, only half and the cap apply. */
    assert_int_equal(store_default_max_object(4096, 0), 2048);
    assert_int_equal(store_default_max_object(UINT64_MAX, 0), 128ULL << 20);
}

/* store_new refuses a data area the ring cannot use and a max object size
 * that cannot fit, with -EINVAL and a message. */
static void test_store_new_invalid(void **state)
{
    struct store_config cfg = {.max_object_size = 0};
    struct shmb_error err = {0};
    unsigned char *data = aligned_alloc(SHMB_ALIGN, 8192);

    (void)state;
    assert_non_null(data);
    assert_null(store_new(data, DATA_OFFSET, 100, NULL, &cfg, &err));
    assert_int_equal(err.code, -EINVAL);
    shmb_error_clear(&err);
    cfg.max_object_size = 8192;
    assert_null(store_new(data, DATA_OFFSET, 8192, NULL, &cfg, &err));
    assert_int_equal(err.code, -EINVAL);
    assert_true(err.message[0] != '\0');
    free(data);
}

/* One scripted session with the Nth allocation failing. */
static int chaos_session(unsigned long n)
{
    struct shmb_error err = {0};
    struct store_config cfg = {.max_object_size = 0};
    unsigned char *data = aligned_alloc(SHMB_ALIGN, 8192);
    struct store *s;
    struct store_holder *h1 = NULL, *h2 = NULL;
    struct store_extent e;
    char key[16];
    int i, rc, failures = 0;

    assert_non_null(data);
    shmb_alloc_fail_at(n);
    s = store_new(data, DATA_OFFSET, 8192, NULL, &cfg, &err);
    if (s == NULL) {
        assert_int_equal(err.code, -ENOMEM);
        shmb_alloc_fail_at(0);
        free(data);
        return 1;
    }
    h1 = store_holder_new(s);
    h2 = store_holder_new(s);
    for (i = 0; i < 80; i++) {
        struct store_holder *h = i % 3 ? h1 : h2;

        snprintf(key, sizeof(key), "c%d", i);
        if (h == NULL) {
            failures++;
            continue;
        }
        rc = store_alloc(s, h, key, strlen(key), 100 + (uint64_t)i * 10, 0, &e, &err);
        if (rc == -ENOMEM || rc == -ENOSPC) {
            failures += rc == -ENOMEM;
            continue;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(store_commit(s, h, key, strlen(key), &err), 0);
        rc = store_get(s, h, key, strlen(key), &e, &err);
        assert_true(rc == 0 || rc == -ENOMEM);
        failures += rc == -ENOMEM;
        if (i % 2 == 0 && rc == 0)
            assert_int_equal(store_release(s, h, key, strlen(key), &err), 0);
        if (i % 5 == 0)
            assert_int_equal(store_delete(s, key, strlen(key), &err), 0);
    }
    shmb_alloc_fail_at(0);
    if (h1 != NULL)
        store_holder_free(s, h1);
    if (h2 != NULL)
        store_holder_free(s, h2);
    store_free(s);
    free(data);
    return failures;
}

/* Failing any one allocation the store makes (through proto/alloc) turns
 * into -ENOMEM or a NULL result, never a crash, a leak (under ASan) or a
 * broken store: the session goes on and ends cleanly. */
static void test_alloc_failures(void **state)
{
    unsigned long n;
    int hit = 0;

    (void)state;
    for (n = 1; n <= 400; n++)
        hit += chaos_session(n) > 0;
    assert_true(hit > 0);
}

/* ---- the randomized model test ------------------------------------------ */

#define M_HOLDERS 4
#define M_KEYS 160
#define M_MAX_LIVE 2048
#define M_DATA (64 * 1024)
#define M_MAX_OBJ (16 * 1024)
#define M_STEPS 100000

struct mobj {
    char key[16];
    size_t key_len;
    enum store_state state;
    int owner; /* holder index, while pending */
    uint64_t offset, size, chunk_phys, chunk_size;
    uint32_t pins[M_HOLDERS];
    uint32_t awaited;
    uint64_t seed;
};

struct model {
    struct sfix *f;
    struct store_holder *h[M_HOLDERS];
    struct mobj live[M_MAX_LIVE]; /* oldest first */
    size_t n;
    unsigned char *bitmap; /* one byte per data-area byte: 1 = in a live chunk */
    uint64_t serial;
    uint64_t allocs, commits, gets, evictions, enospc;
    int step;
};

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    rnd_state ^= rnd_state >> 12;
    rnd_state ^= rnd_state << 25;
    rnd_state ^= rnd_state >> 27;
    return rnd_state * UINT64_C(2685821657736338717);
}

static uint64_t rnd_below(uint64_t n)
{
    return rnd() % n;
}

static uint32_t total_pins(const struct mobj *o)
{
    uint32_t t = 0;
    int i;

    for (i = 0; i < M_HOLDERS; i++)
        t += o->pins[i];
    return t;
}

static bool evictable(const struct mobj *o)
{
    return o->state == STORE_COMMITTED && total_pins(o) == 0 && o->awaited == 0;
}

/* Mark or clear the chunk of o in the bitmap, checking that it was all free
 * (mark) or all taken (clear). */
static void model_mark(struct model *m, const struct mobj *o, bool set)
{
    uint64_t i;

    for (i = o->chunk_phys; i < o->chunk_phys + o->chunk_size; i++) {
        if (m->bitmap[i] == set)
            fail_msg("step %d: '%s' at data offset %llu %s byte %llu", m->step, o->key,
                     (unsigned long long)o->chunk_phys,
                     set ? "overlaps a live chunk at" : "was not marked at",
                     (unsigned long long)i);
        m->bitmap[i] = set;
    }
}

static void model_remove(struct model *m, size_t i)
{
    model_mark(m, &m->live[i], false);
    memmove(&m->live[i], &m->live[i + 1], (m->n - i - 1) * sizeof(m->live[0]));
    m->n--;
}

/* The live object that is committed (or pending when pending) under key. */
static struct mobj *model_active(struct model *m, const char *key, enum store_state st)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (m->live[i].state == st && strcmp(m->live[i].key, key) == 0)
            return &m->live[i];
    return NULL;
}

/* True when holder hi pins a deleted object under key. */
static bool pins_deleted(struct model *m, int hi, const char *key)
{
    size_t i;

    for (i = 0; i < m->n; i++)
        if (m->live[i].state == STORE_DELETED && m->live[i].pins[hi] > 0 &&
            strcmp(m->live[i].key, key) == 0)
            return true;
    return false;
}

static void random_key(char *key, size_t len)
{
    snprintf(key, len, "k%03u", (unsigned)rnd_below(M_KEYS));
}

static uint64_t random_size(void)
{
    uint64_t u = rnd_below(100);

    if (u < 60)
        return 1 + rnd_below(256);
    if (u < 87)
        return 257 + rnd_below(2048);
    return 2305 + rnd_below(M_MAX_OBJ - 2305 + 1);
}

/* After an alloc: which committed objects vanished? They must be evictable,
 * older than the first object reclaim cannot pass, and oldest first. */
static void model_check_evictions(struct model *m)
{
    size_t i = 0, blocker = m->n;
    bool evicting = true;

    for (i = 0; i < m->n; i++)
        if (!evictable(&m->live[i])) {
            blocker = i;
            break;
        }
    i = 0;
    while (i < m->n) {
        struct mobj *o = &m->live[i];
        bool gone = o->state == STORE_COMMITTED &&
                    !store_contains(m->f->s, o->key, o->key_len);

        if (gone) {
            if (!evictable(o) || i > blocker || !evicting)
                fail_msg("step %d: '%s' vanished but was not next to evict (pins %u, "
                         "awaited %u, index %zu, blocker index %zu)", m->step, o->key,
                         total_pins(o), o->awaited, i, blocker);
            m->evictions++;
            blocker--;
            model_remove(m, i);
            continue;
        }
        if (evictable(o))
            evicting = false; /* an evictable object stayed: nothing after it may go */
        i++;
    }
}

static void op_alloc(struct model *m)
{
    struct shmb_error err = {0};
    struct store_extent e;
    char key[16];
    int hi = (int)rnd_below(M_HOLDERS), rc, want;
    uint64_t size = random_size(), u = rnd_below(100);
    uint32_t readers = u < 80 ? 0 : u < 95 ? 1 : 2;

    random_key(key, sizeof(key));
    if (rnd_below(100) < 2) {
        /* Invalid sizes, on a key that is never used otherwise. */
        size = rnd_below(2) ? 0 : M_MAX_OBJ + 1 + rnd_below(1000);
        rc = store_alloc(m->f->s, m->h[hi], "bad", 3, size, 0, &e, &err);
        assert_int_equal(rc, size == 0 ? -EINVAL : -E2BIG);
        return;
    }
    want = model_active(m, key, STORE_PENDING) || model_active(m, key, STORE_COMMITTED)
               ? -EEXIST
               : 0;
    rc = store_alloc(m->f->s, m->h[hi], key, strlen(key), size, readers, &e, &err);
    if (want == -EEXIST) {
        if (rc != -EEXIST)
            fail_msg("step %d: alloc of taken key '%s' = %d", m->step, key, rc);
        return;
    }
    if (rc != 0 && rc != -ENOSPC)
        fail_msg("step %d: alloc '%s' (%llu) = %d: %s", m->step, key,
                 (unsigned long long)size, rc, err.message);
    model_check_evictions(m);
    if (rc == -ENOSPC) {
        struct store_stats st;
        const struct mobj *b;

        m->enospc++;
        assert_true(m->n > 0);
        b = &m->live[0]; /* everything evictable before it is gone */
        assert_false(evictable(b));
        store_stats(m->f->s, &st);
        assert_true(st.has_blocker);
        if (strcmp(st.blocker_key, b->key) != 0)
            fail_msg("step %d: blocker '%s', model says '%s'", m->step, st.blocker_key,
                     b->key);
        assert_int_equal(st.blocker_state, b->state);
        assert_int_equal(st.blocker_pins, total_pins(b));
        assert_int_equal(st.blocker_readers, b->awaited);
        expect_message_has(&err, b->key);
        return;
    }
    {
        struct mobj *o;

        assert_true(m->n < M_MAX_LIVE);
        o = &m->live[m->n++];
        memset(o, 0, sizeof(*o));
        snprintf(o->key, sizeof(o->key), "%s", key);
        o->key_len = strlen(key);
        o->state = STORE_PENDING;
        o->owner = hi;
        o->offset = e.offset;
        o->size = size;
        assert_int_equal(e.size, size);
        assert_int_equal(e.offset % SHMB_ALIGN, 0);
        o->chunk_size = ring_chunk_size(o->key_len, size);
        assert_true(e.offset - DATA_OFFSET >= o->chunk_size - ((size + 63) & ~(uint64_t)63));
        o->chunk_phys = e.offset - DATA_OFFSET - (o->chunk_size - ((size + 63) & ~(uint64_t)63));
        assert_true(o->chunk_phys + o->chunk_size <= M_DATA);
        o->awaited = readers;
        o->seed = ++m->serial;
        model_mark(m, o, true);
        write_pattern(payload(m->f, &e), size, o->seed);
        m->allocs++;
    }
}

/* A random live object in state st, or NULL. */
static struct mobj *pick(struct model *m, enum store_state st)
{
    size_t i, k = 0, want;

    for (i = 0; i < m->n; i++)
        k += m->live[i].state == st;
    if (k == 0)
        return NULL;
    want = (size_t)rnd_below(k);
    for (i = 0; i < m->n; i++)
        if (m->live[i].state == st && want-- == 0)
            return &m->live[i];
    return NULL;
}

static void op_commit(struct model *m, bool abort_it)
{
    struct shmb_error err = {0};
    struct mobj *o = pick(m, STORE_PENDING);
    int other;

    if (o == NULL)
        return;
    other = (o->owner + 1 + (int)rnd_below(M_HOLDERS - 1)) % M_HOLDERS;
    if (rnd_below(10) == 0) {
        assert_int_equal(abort_it ? store_abort(m->f->s, m->h[other], o->key, o->key_len, &err)
                                  : store_commit(m->f->s, m->h[other], o->key, o->key_len, &err),
                         -ENOENT);
        return;
    }
    if (abort_it) {
        assert_int_equal(store_abort(m->f->s, m->h[o->owner], o->key, o->key_len, &err), 0);
        model_remove(m, (size_t)(o - m->live));
        return;
    }
    {
        struct store_extent e = {o->offset, o->size};

        check_pattern(payload(m->f, &e), o->size, o->seed);
    }
    assert_int_equal(store_commit(m->f->s, m->h[o->owner], o->key, o->key_len, &err), 0);
    o->state = STORE_COMMITTED;
    m->commits++;
}

static void op_get(struct model *m)
{
    struct shmb_error err = {0};
    struct store_extent e;
    char key[16];
    int hi = (int)rnd_below(M_HOLDERS), rc;
    struct mobj *o = NULL;
    uint64_t u = rnd_below(100);

    if (u < 40) {
        /* Readers mostly read what is awaited, oldest first, as in vLLM. */
        size_t i;

        for (i = 0; i < m->n && o == NULL; i++)
            if (m->live[i].state == STORE_COMMITTED && m->live[i].awaited > 0 &&
                rnd_below(2) == 0)
                o = &m->live[i];
    }
    if (o == NULL && u < 75)
        o = pick(m, STORE_COMMITTED);
    if (o != NULL)
        snprintf(key, sizeof(key), "%s", o->key);
    else
        random_key(key, sizeof(key));
    /* A holder never pins two objects under one key: release is by key. */
    if (pins_deleted(m, hi, key))
        return;
    o = model_active(m, key, STORE_COMMITTED);
    rc = store_get(m->f->s, m->h[hi], key, strlen(key), &e, &err);
    if (o == NULL) {
        if (rc != -ENOENT)
            fail_msg("step %d: get of absent or pending '%s' = %d", m->step, key, rc);
        return;
    }
    if (rc != 0)
        fail_msg("step %d: get '%s' = %d: %s", m->step, key, rc, err.message);
    assert_int_equal(e.offset, o->offset);
    assert_int_equal(e.size, o->size);
    check_pattern(payload(m->f, &e), e.size, o->seed);
    o->pins[hi]++;
    if (o->awaited > 0)
        o->awaited--;
    m->gets++;
}

static void op_release(struct model *m)
{
    struct shmb_error err = {0};
    int hi = (int)rnd_below(M_HOLDERS);
    size_t i, k = 0, want;
    struct mobj *o = NULL;
    char key[16];

    for (i = 0; i < m->n; i++)
        k += m->live[i].pins[hi] > 0;
    if (k == 0) {
        random_key(key, sizeof(key));
        assert_int_equal(store_release(m->f->s, m->h[hi], key, strlen(key), &err), -ENOENT);
        return;
    }
    want = (size_t)rnd_below(k);
    for (i = 0; i < m->n; i++)
        if (m->live[i].pins[hi] > 0 && want-- == 0) {
            o = &m->live[i];
            break;
        }
    assert_non_null(o);
    assert_int_equal(store_release(m->f->s, m->h[hi], o->key, o->key_len, &err), 0);
    o->pins[hi]--;
    if (o->state == STORE_DELETED && total_pins(o) == 0)
        model_remove(m, (size_t)(o - m->live));
}

static void op_delete(struct model *m)
{
    struct shmb_error err = {0};
    char key[16];
    struct mobj *o;
    int rc;

    if (rnd_below(3) != 0 && (o = pick(m, STORE_COMMITTED)) != NULL)
        snprintf(key, sizeof(key), "%s", o->key);
    else
        random_key(key, sizeof(key));
    o = model_active(m, key, STORE_COMMITTED);
    rc = store_delete(m->f->s, key, strlen(key), &err);
    if (o == NULL) {
        assert_int_equal(rc, -ENOENT);
        return;
    }
    assert_int_equal(rc, 0);
    if (total_pins(o) == 0)
        model_remove(m, (size_t)(o - m->live));
    else
        o->state = STORE_DELETED;
}

static void op_touch(struct model *m)
{
    struct shmb_error err = {0};
    struct mobj *o = pick(m, STORE_COMMITTED);
    uint32_t readers = 1 + (uint32_t)rnd_below(3);

    if (o == NULL) {
        assert_int_equal(store_touch(m->f->s, "absent", 6, 1, &err), -ENOENT);
        return;
    }
    assert_int_equal(store_touch(m->f->s, o->key, o->key_len, readers, &err), 0);
    o->awaited += readers;
}

static void op_holder_free(struct model *m)
{
    int hi = (int)rnd_below(M_HOLDERS);
    size_t i = 0;

    store_holder_free(m->f->s, m->h[hi]);
    m->h[hi] = store_holder_new(m->f->s);
    assert_non_null(m->h[hi]);
    while (i < m->n) {
        struct mobj *o = &m->live[i];

        o->pins[hi] = 0;
        if ((o->state == STORE_PENDING && o->owner == hi) ||
            (o->state == STORE_DELETED && total_pins(o) == 0)) {
            model_remove(m, i);
            continue;
        }
        i++;
    }
}

struct list_cmp {
    struct model *m;
    size_t i;
};

static int list_compare(const struct store_entry *e, void *arg)
{
    struct list_cmp *c = arg;
    const struct mobj *o;

    if (c->i >= c->m->n)
        fail_msg("step %d: store_list reports more than the model's %zu objects",
                 c->m->step, c->m->n);
    o = &c->m->live[c->i++];
    if (e->key_len != o->key_len || memcmp(e->key, o->key, o->key_len) != 0)
        fail_msg("step %d: store_list entry %zu is '%.*s', model says '%s'", c->m->step,
                 c->i - 1, (int)e->key_len, e->key, o->key);
    assert_int_equal(e->state, o->state);
    assert_int_equal(e->offset, o->offset);
    assert_int_equal(e->size, o->size);
    assert_int_equal(e->pins, total_pins(o));
    assert_int_equal(e->awaited_reads, o->awaited);
    return 0;
}

/* Everything the store reports matches the model. */
static void model_check(struct model *m)
{
    struct store_stats st;
    struct list_cmp c = {m, 0};
    uint64_t committed = 0, pending = 0, pinned = 0, deleted = 0;
    uint64_t hpins[M_HOLDERS] = {0}, hpending[M_HOLDERS] = {0}, hbytes[M_HOLDERS] = {0};
    size_t i;
    int k;

    for (i = 0; i < m->n; i++) {
        const struct mobj *o = &m->live[i];

        committed += o->state == STORE_COMMITTED;
        pending += o->state == STORE_PENDING;
        pinned += total_pins(o) > 0;
        deleted += o->state == STORE_DELETED;
        if (o->state == STORE_PENDING)
            hpending[o->owner]++;
        for (k = 0; k < M_HOLDERS; k++) {
            hpins[k] += o->pins[k];
            if (o->pins[k] > 0)
                hbytes[k] += o->size;
        }
    }
    store_stats(m->f->s, &st);
    assert_int_equal(st.used + st.free, M_DATA);
    assert_int_equal(st.data_size, M_DATA);
    assert_int_equal(st.objects, committed);
    assert_int_equal(st.pending, pending);
    assert_int_equal(st.pinned, pinned);
    assert_int_equal(st.deleted_pinned, deleted);
    assert_int_equal(st.allocs, m->allocs);
    assert_int_equal(st.commits, m->commits);
    assert_int_equal(st.gets, m->gets);
    assert_int_equal(st.evictions, m->evictions);
    assert_int_equal(st.enospc, m->enospc);
    if (m->n == 0)
        assert_int_equal(st.used, 0);
    /* The blocker stats report is the model's first object reclaim cannot
     * pass, as a walk from the oldest would find it. */
    for (i = 0; i < m->n && evictable(&m->live[i]); i++)
        ;
    assert_int_equal(st.has_blocker, i < m->n);
    if (i < m->n) {
        assert_string_equal(st.blocker_key, m->live[i].key);
        assert_int_equal(st.blocker_state, m->live[i].state);
        assert_int_equal(st.blocker_pins, total_pins(&m->live[i]));
        assert_int_equal(st.blocker_readers, m->live[i].awaited);
    }
    assert_int_equal(store_list(m->f->s, NULL, 0, SIZE_MAX, list_compare, &c), m->n);
    assert_int_equal(c.i, m->n);
    for (k = 0; k < M_HOLDERS; k++) {
        struct store_holder_stats hs;

        store_holder_stats(m->h[k], &hs);
        assert_int_equal(hs.pins, hpins[k]);
        assert_int_equal(hs.pending, hpending[k]);
        assert_int_equal(hs.bytes_pinned, hbytes[k]);
    }
}

/* stats does not walk the objects to find the blocker: with 1,000,000
 * committed objects that nothing blocks, the first stats looks at each of
 * them once, and every later stats, pin, release, touch and read of the
 * oldest object costs a few looks, not a walk; the blocker is still right. */
static void test_stats_cost(void **state)
{
    enum { N = 1000000, ROUNDS = 1000 };
    /* Chunks of a 1-byte payload and a key of up to 8 bytes. */
    uint64_t chunk = ring_chunk_size(8, 1);
    struct sfix *f = sfix_new(((uint64_t)N + 16) * chunk, 64);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;
    uint64_t before;
    char key[16];
    int i;

    (void)state;
    assert_non_null(h);
    for (i = 0; i < N; i++) {
        int len = snprintf(key, sizeof(key), "k%d", i);

        assert_int_equal(store_alloc(f->s, h, key, (size_t)len, 1, 0, &e, &err), 0);
        assert_int_equal(store_commit(f->s, h, key, (size_t)len, &err), 0);
    }
    store_stats(f->s, &st);
    assert_int_equal(st.objects, N);
    assert_false(st.has_blocker);
    assert_true(store_blocker_checks(f->s) <= (uint64_t)N);

    before = store_blocker_checks(f->s);
    for (i = 0; i < ROUNDS; i++) {
        /* A pin on an old object makes it the blocker; its release lets it
         * go again. Neither makes the next stats walk the ring. */
        int len = snprintf(key, sizeof(key), "k%d", i * 997);

        store_stats(f->s, &st);
        assert_false(st.has_blocker);
        assert_int_equal(store_get(f->s, h, key, (size_t)len, &e, &err), 0);
        store_stats(f->s, &st);
        assert_true(st.has_blocker);
        assert_string_equal(st.blocker_key, key);
        assert_int_equal(st.blocker_pins, 1);
        assert_int_equal(store_release(f->s, h, key, (size_t)len, &err), 0);
        assert_int_equal(store_touch(f->s, key, (size_t)len, 1, &err), 0);
        store_stats(f->s, &st);
        assert_true(st.has_blocker);
        assert_string_equal(st.blocker_key, key);
        assert_int_equal(st.blocker_readers, 1);
        assert_int_equal(store_get(f->s, h, key, (size_t)len, &e, &err), 0);
        assert_int_equal(store_release(f->s, h, key, (size_t)len, &err), 0);
    }
    store_stats(f->s, &st);
    assert_false(st.has_blocker);
    /* Each round looks at a handful of objects; a walk would be a million. */
    assert_true(store_blocker_checks(f->s) - before <= (uint64_t)ROUNDS * 8);
    sfix_free(f);
}

/* No one stats pays for a backlog. Objects that stop blocking when the
 * daemon learns it (committed without awaited reads, a get and release) go
 * out of the watched heap then: 100,000 puts leave the next stats a few
 * looks, not 100,000. Those whose reads it learns of only when it looks
 * (reads in place, a lease, reads forgone) are taken out at most 2048 per
 * look (STORE_BLOCKER_LOOKS): after 300,000 such objects one stats held the
 * loop 70 ms. Successive stats go on from there and end with no blocker. */
static void test_blocker_backlog_bounded(void **state)
{
    enum { N = 100000, LOOKS = 2048 };
    uint64_t chunk = ring_chunk_size(8, 1);
    struct sfix *f = sfix_new(((uint64_t)N + 16) * chunk, 64);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;
    uint64_t before;
    char key[16];
    int i, rounds;

    (void)state;
    assert_non_null(h);
    for (i = 0; i < N; i++) {
        int len = snprintf(key, sizeof(key), "k%d", i);

        assert_int_equal(store_alloc(f->s, h, key, (size_t)len, 1, i % 2, &e, &err), 0);
        assert_int_equal(store_commit(f->s, h, key, (size_t)len, &err), 0);
    }
    /* The odd ones await a read: the get and release of half of them is
     * learnt at once. */
    for (i = 1; i < N / 2; i += 2) {
        int len = snprintf(key, sizeof(key), "k%d", i);

        assert_int_equal(store_get(f->s, h, key, (size_t)len, &e, &err), 0);
        assert_int_equal(store_release(f->s, h, key, (size_t)len, &err), 0);
    }
    before = store_blocker_checks(f->s);
    store_stats(f->s, &st);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "k50001");
    assert_true(store_blocker_checks(f->s) - before <= 8);
    /* The other half's reads are forgone, which the daemon learns of only
     * when it looks. */
    for (i = N / 2 + 1; i < N; i += 2) {
        int len = snprintf(key, sizeof(key), "k%d", i);

        assert_int_equal(store_forgo_reads(f->s, key, (size_t)len, 1), 0);
    }
    for (rounds = 0; rounds < N; rounds++) {
        before = store_blocker_checks(f->s);
        store_stats(f->s, &st);
        assert_true(store_blocker_checks(f->s) - before <= LOOKS);
        if (!st.has_blocker)
            break;
    }
    assert_false(st.has_blocker);
    assert_true(rounds >= 1);
    sfix_free(f);
}

/* Every live object's bytes are still its own, and contains agrees with the
 * model for every key. */
static void model_check_all(struct model *m)
{
    char key[16];
    size_t i;
    unsigned k;

    for (i = 0; i < m->n; i++) {
        const struct mobj *o = &m->live[i];
        struct store_extent e = {o->offset, o->size};

        check_pattern(payload(m->f, &e), o->size, o->seed);
    }
    for (k = 0; k < M_KEYS; k++) {
        snprintf(key, sizeof(key), "k%03u", k);
        assert_int_equal(store_contains(m->f->s, key, strlen(key)),
                         model_active(m, key, STORE_COMMITTED) != NULL);
    }
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

/* 100,000 random operations (alloc of sizes up to the max and beyond,
 * commit, abort, get, release, delete, touch, holder free: frees in any
 * order) checked after every step against a reference model: chunks never
 * overlap (byte bitmap), every get reads back the object's own bytes,
 * evictions are oldest-first and stop at the first blocker, -ENOSPC names
 * that blocker, store_list, stats and holder stats match, used + free is
 * the data size. At the end everything is released and deleted: used is 0
 * and the next allocation lands at the start of the data area. */
static void test_random_model(void **state)
{
    struct model *m = calloc(1, sizeof(*m));
    struct shmb_error err = {0};
    struct store_extent e;
    struct store_stats st;
    size_t i;
    int k;

    (void)state;
    assert_non_null(m);
    rnd_seed(test_seed());
    m->f = sfix_new(M_DATA, M_MAX_OBJ);
    m->bitmap = calloc(M_DATA, 1);
    assert_non_null(m->bitmap);
    for (k = 0; k < M_HOLDERS; k++)
        m->h[k] = store_holder_new(m->f->s);
    for (m->step = 0; m->step < M_STEPS; m->step++) {
        uint64_t r = rnd_below(1000);

        if (r < 300)
            op_alloc(m);
        else if (r < 500)
            op_commit(m, false);
        else if (r < 530)
            op_commit(m, true);
        else if (r < 710)
            op_get(m);
        else if (r < 920)
            op_release(m);
        else if (r < 960)
            op_delete(m);
        else if (r < 985)
            op_touch(m);
        else
            op_holder_free(m);
        model_check(m);
        if (m->step % 1000 == 0)
            model_check_all(m);
    }
    printf("random model: %llu allocs, %llu evictions, %llu enospc, %zu live at the end\n",
           (unsigned long long)m->allocs, (unsigned long long)m->evictions,
           (unsigned long long)m->enospc, m->n);
    assert_true(m->evictions > 1000);
    assert_true(m->enospc > 100);
    model_check_all(m);

    /* Release every pin, abort every pending allocation, delete the rest. */
    for (k = 0; k < M_HOLDERS; k++) {
        for (i = 0; i < m->n; i++)
            while (m->live[i].pins[k] > 0) {
                assert_int_equal(store_release(m->f->s, m->h[k], m->live[i].key,
                                               m->live[i].key_len, &err), 0);
                m->live[i].pins[k]--;
            }
    }
    for (i = 0; i < m->n; i++) {
        const struct mobj *o = &m->live[i];

        if (o->state == STORE_PENDING)
            assert_int_equal(store_abort(m->f->s, m->h[o->owner], o->key, o->key_len, &err), 0);
        else if (o->state == STORE_COMMITTED)
            assert_int_equal(store_delete(m->f->s, o->key, o->key_len, &err), 0);
    }
    store_stats(m->f->s, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.objects + st.pending + st.pinned + st.deleted_pinned, 0);
    assert_int_equal(ring_count(store_ring(m->f->s)), 0);
    assert_int_equal(store_alloc(m->f->s, m->h[0], "final", 5, 100, 0, &e, &err), 0);
    assert_int_equal(e.offset, DATA_OFFSET + 64);
    for (k = 0; k < M_HOLDERS; k++)
        store_holder_free(m->f->s, m->h[k]);
    sfix_free(m->f);
    free(m->bitmap);
    free(m);
}

/* ---- adoption, expiry, read leases, room generation --------------------- */

/* A store over size bytes of fresh memory with the given configuration. */
static struct sfix *sfix_new_cfg(uint64_t size, const struct store_config *cfg)
{
    struct shmb_error err = {0};
    struct sfix *f = calloc(1, sizeof(*f));

    assert_non_null(f);
    f->size = size;
    f->data = aligned_alloc(SHMB_ALIGN, size);
    assert_non_null(f->data);
    memset(f->data, FILL, size);
    f->s = store_new(f->data, DATA_OFFSET, size, &f->cursor, cfg, &err);
    if (f->s == NULL)
        fail_msg("store_new(%llu): %d %s", (unsigned long long)size, err.code, err.message);
    return f;
}

/* What a crash leaves: the store's memory goes, the data area and the
 * cursor in the header stay as they were; then a new store adopts them. */
static void crash_and_adopt(struct sfix *f, const struct store_config *cfg,
                            struct store_adopt_report *report)
{
    struct shmb_error err = {0};

    store_free(f->s);
    f->s = store_adopt(f->data, DATA_OFFSET, f->size, &f->cursor, cfg, report, &err);
    if (f->s == NULL)
        fail_msg("store_adopt: %d %s", err.code, err.message);
}

/* store_adopt brings back every committed object with its key, size,
 * offset, bytes and awaited reads (kept in the chunk header's tag), and
 * nothing else: pending allocations, deleted objects (also one deleted while
 * pinned) and pins are gone, and the report counts each kind. The adopted
 * store works on: a restored object with awaited reads still blocks
 * reclaim until it is read, and deleting everything leaves used == 0. */
static void test_adopt_restores(void **state)
{
    struct sfix *f = sfix_new(16384, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct store_adopt_report report;
    struct shmb_error err = {0};
    struct store_extent e1, e2, e3, got;
    struct store_stats st;
    struct listed l;
    char key[16];
    int i, rc = 0;

    (void)state;
    put_ok(f, h, "keep1", 1000, 0, 1, &e1);
    put_ok(f, h, "await", 500, 3, 2, &e2);
    read_ok(f, h, "await", 500, 2, false);
    put_ok(f, h, "gone", 200, 0, 4, NULL);
    put_ok(f, h, "pinned-del", 300, 0, 3, NULL);
    read_ok(f, h, "pinned-del", 300, 3, true);
    assert_int_equal(store_delete(f->s, "pinned-del", 10, &err), 0);
    assert_int_equal(store_delete(f->s, "gone", 4, &err), 0);
    assert_int_equal(store_alloc(f->s, h, "pend", 4, 400, 0, NULL, &err), 0);
    put_ok(f, h, "keep2", 3000, 0, 5, &e3);
    read_ok(f, h, "keep1", 1000, 1, true);

    crash_and_adopt(f, NULL, &report);
    assert_int_equal(report.restored, 3);
    assert_int_equal(report.restored_bytes, 4500);
    assert_int_equal(report.dropped_pending, 1);
    assert_int_equal(report.dropped_free, 2);
    assert_int_equal(report.dropped_invalid, 0);
    assert_false(report.corrupt);

    st = stats_of(f);
    assert_int_equal(st.objects, 3);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pinned, 0);
    assert_false(store_contains(f->s, "pinned-del", 10));
    assert_false(store_contains(f->s, "gone", 4));
    assert_false(store_contains(f->s, "pend", 4));
    assert_int_equal(list_of(f, NULL, SIZE_MAX, &l, 0), 3);
    assert_string_equal(l.keys[0], "keep1");
    assert_int_equal(l.e[0].offset, e1.offset);
    assert_int_equal(l.e[0].size, 1000);
    assert_int_equal(l.e[0].pins, 0);
    assert_string_equal(l.keys[1], "await");
    assert_int_equal(l.e[1].offset, e2.offset);
    assert_int_equal(l.e[1].awaited_reads, 2);
    assert_string_equal(l.keys[2], "keep2");
    assert_int_equal(l.e[2].offset, e3.offset);
    assert_int_equal(l.e[2].state, STORE_COMMITTED);

    h = store_holder_new(f->s);
    assert_non_null(h);
    assert_int_equal(store_get(f->s, h, "keep2", 5, &got, &err), 0);
    assert_int_equal(got.offset, e3.offset);
    assert_int_equal(store_release(f->s, h, "keep2", 5, &err), 0);
    read_ok(f, h, "keep1", 1000, 1, false);
    read_ok(f, h, "keep2", 3000, 5, false);
    put_ok(f, h, "pend", 400, 0, 6, NULL);

    /* "await" still waits for two reads: it stops reclaim (keep1 goes). */
    for (i = 0; i < 8 && rc == 0; i++) {
        snprintf(key, sizeof(key), "fill-%d", i);
        rc = put(f, h, key, 4000, 0, (uint64_t)(10 + i), NULL, &err);
    }
    assert_int_equal(rc, -ENOSPC);
    expect_message_has(&err, "'await' blocks reclaim (pins=0, awaited reads=2)");
    assert_false(store_contains(f->s, "keep1", 5));
    read_ok(f, h, "await", 500, 2, false);
    read_ok(f, h, "await", 500, 2, false);
    put_ok(f, h, key, 4000, 0, 99, NULL);
    assert_false(store_contains(f->s, "await", 5));

    list_of(f, NULL, SIZE_MAX, &l, 0);
    assert_true(l.n >= 3);
    for (i = 0; i < (int)l.n; i++)
        assert_int_equal(store_delete(f->s, l.keys[i], strlen(l.keys[i]), &err), 0);
    st = stats_of(f);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.objects, 0);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* An object adoption brings back is made and linked as one that was
 * allocated and committed: the same list entry (extent, pins, awaited reads,
 * state), the same counts, and it is the head-of-line blocker of stats at
 * once (it is watched) while its reads are awaited; read, it goes. */
static void test_adopted_like_allocated(void **state)
{
    struct sfix *f = sfix_new(16384, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct store_adopt_report report;
    struct store_stats before, after;
    struct listed l1, l2;
    size_t i;

    (void)state;
    put_ok(f, h, "first", 1000, 2, 1, NULL);
    put_ok(f, h, "second", 700, 0, 2, NULL);
    store_holder_free(f->s, h);
    before = stats_of(f);
    assert_true(before.has_blocker);
    assert_string_equal(before.blocker_key, "first");
    assert_int_equal(list_of(f, NULL, SIZE_MAX, &l1, 0), 2);

    crash_and_adopt(f, NULL, &report);
    assert_int_equal(report.restored, 2);
    after = stats_of(f);
    assert_int_equal(after.objects, before.objects);
    assert_int_equal(after.pending, 0);
    assert_int_equal(after.pinned, 0);
    assert_int_equal(after.used, before.used);
    assert_true(after.has_blocker);
    assert_string_equal(after.blocker_key, "first");
    assert_int_equal(after.blocker_readers, 2);
    assert_int_equal(after.blocker_state, STORE_COMMITTED);
    assert_int_equal(list_of(f, NULL, SIZE_MAX, &l2, 0), 2);
    for (i = 0; i < 2; i++) {
        assert_string_equal(l2.keys[i], l1.keys[i]);
        assert_int_equal(l2.e[i].offset, l1.e[i].offset);
        assert_int_equal(l2.e[i].size, l1.e[i].size);
        assert_int_equal(l2.e[i].pins, l1.e[i].pins);
        assert_int_equal(l2.e[i].awaited_reads, l1.e[i].awaited_reads);
        assert_int_equal(l2.e[i].state, l1.e[i].state);
    }

    h = store_holder_new(f->s);
    read_ok(f, h, "first", 1000, 1, false);
    read_ok(f, h, "first", 1000, 1, false);
    after = stats_of(f);
    assert_false(after.has_blocker);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* A chunk header whose magic was overwritten loses that object only: the
 * walk resynchronises on the next sound header, so the objects before and
 * after it come back; the report says corrupt with a message naming the bad
 * magic and the bytes skipped, and the store is consistent and usable (the
 * lost key can be put again, the skipped bytes are reclaimed). Before the
 * walk resynchronised, "c" was dropped too. */
static void test_adopt_corrupt(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct store_adopt_report report;
    struct store_extent eb;
    struct store_stats st;

    (void)state;
    put_ok(f, h, "a", 100, 0, 1, NULL);
    put_ok(f, h, "b", 200, 0, 2, &eb);
    put_ok(f, h, "c", 300, 0, 3, NULL);
    /* "b" has a one-byte key: its header is the 64 bytes before it. */
    memset(f->data + (eb.offset - DATA_OFFSET - 64), 0x5a, 4);

    crash_and_adopt(f, NULL, &report);
    assert_true(report.corrupt);
    if (strstr(report.message, "bad chunk magic") == NULL)
        fail_msg("the report does not name the bad magic: '%s'", report.message);
    if (strstr(report.message, "Skipped 320 damaged bytes") == NULL)
        fail_msg("the report does not say what was skipped: '%s'", report.message);
    assert_int_equal(report.restored, 2);
    assert_true(store_contains(f->s, "a", 1));
    assert_false(store_contains(f->s, "b", 1));
    assert_true(store_contains(f->s, "c", 1));
    st = stats_of(f);
    assert_int_equal(st.objects, 2);
    assert_int_equal(st.used, (64 + 128) + (64 + 256) + (64 + 320));

    h = store_holder_new(f->s);
    read_ok(f, h, "a", 100, 1, false);
    read_ok(f, h, "c", 300, 3, false);
    put_ok(f, h, "b", 200, 0, 12, NULL);
    read_ok(f, h, "b", 200, 12, false);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* Issue 10, item 6. A committed chunk whose key holds a NUL byte, or bytes
 * that are not UTF-8, is dropped on adoption like any other invalid chunk
 * and counted in the report's dropped_invalid; the other objects come back,
 * and list and stats work. Before the fix a key with a NUL was adopted as
 * is (an object no client can name). */
static void test_adopt_drops_bad_keys(void **state)
{
    struct sfix *f = sfix_new(16384, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct store_adopt_report report;
    struct store_extent en, eu;
    struct store_stats st;
    struct listed l;

    (void)state;
    put_ok(f, h, "ok1", 100, 0, 1, NULL);
    put_ok(f, h, "nul", 100, 0, 2, &en);
    put_ok(f, h, "utf", 100, 0, 3, &eu);
    put_ok(f, h, "ok2", 100, 0, 4, NULL);
    /* Three-byte keys: the header is the 64 bytes before the payload, the
     * key its bytes 48..50. */
    f->data[en.offset - DATA_OFFSET - 64 + 48 + 1] = '\0';
    f->data[eu.offset - DATA_OFFSET - 64 + 48 + 1] = (unsigned char)0xff;

    crash_and_adopt(f, NULL, &report);
    assert_int_equal(report.restored, 2);
    assert_int_equal(report.dropped_invalid, 2);
    assert_true(store_contains(f->s, "ok1", 3));
    assert_true(store_contains(f->s, "ok2", 3));
    assert_false(store_contains(f->s, "n\0l", 3));
    assert_false(store_contains(f->s, "u\xfft", 3));
    assert_int_equal(list_of(f, NULL, SIZE_MAX, &l, 0), 2);
    assert_string_equal(l.keys[0], "ok1");
    assert_string_equal(l.keys[1], "ok2");
    st = stats_of(f);
    assert_int_equal(st.objects, 2);
    assert_int_equal(st.used + st.free, 16384);
    sfix_free(f);
}

/* Sleep for ms milliseconds. */
static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* store_expire_pending drops the allocations older than the limit (not the
 * young one), frees their bytes and counts them; the owner's commit then
 * gets -ETIMEDOUT naming --alloc-timeout (once; then -ENOENT), and the key
 * can be allocated and committed again. */
static void test_expire_pending(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct shmb_error err = {0};
    struct store_stats st;
    uint64_t gen;

    (void)state;
    assert_int_equal(store_alloc(f->s, h, "old", 3, 1000, 0, NULL, &err), 0);
    assert_int_equal(store_expire_pending(f->s, 60), 0);
    sleep_ms(80);
    assert_int_equal(store_alloc(f->s, h, "young", 5, 1000, 0, NULL, &err), 0);
    gen = store_room_generation(f->s);
    assert_int_equal(store_expire_pending(f->s, 60), 1);
    assert_true(store_room_generation(f->s) != gen);
    st = stats_of(f);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.expired_allocs, 1);
    /* The expired chunk was the oldest: its bytes are free at once. */
    assert_int_equal(st.used, 64 + 1024);

    assert_int_equal(store_commit(f->s, h, "old", 3, &err), -ETIMEDOUT);
    assert_int_equal(err.code, -ETIMEDOUT);
    expect_message_has(&err, "--alloc-timeout");
    expect_message_has(&err, "60 ms");
    assert_int_equal(store_commit(f->s, h, "old", 3, &err), -ENOENT);
    assert_false(store_contains(f->s, "old", 3));
    assert_int_equal(store_commit(f->s, h, "young", 5, &err), 0);
    assert_int_equal(store_alloc(f->s, h, "old", 3, 1000, 0, NULL, &err), 0);
    assert_int_equal(store_commit(f->s, h, "old", 3, &err), 0);
    assert_int_equal(store_expire_pending(f->s, 1), 0);
    st = stats_of(f);
    assert_int_equal(st.objects, 2);
    assert_int_equal(st.expired_allocs, 1);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* What the lease callback was told. */
struct leases {
    unsigned calls;
    char key[32];
    uint32_t reads_left;
};

static void lease_record(const char *key, size_t key_len, uint32_t reads_left, void *arg)
{
    struct leases *l = arg;

    l->calls++;
    assert_true(key_len < sizeof(l->key));
    memcpy(l->key, key, key_len);
    l->key[key_len] = '\0';
    l->reads_left = reads_left;
}

/* With read_lease_ms 50, an object awaiting reads blocks reclaim until 50 ms
 * after its commit; then it is evicted when its space is needed, and the
 * lease callback is told exactly once for it (key and reads left) however
 * often stats and allocs look at it; an object whose reads all came is
 * never reported. With the lease turned off (store_set_read_lease 0) awaited
 * reads hold again. */
static void test_read_lease(void **state)
{
    struct leases told;
    struct store_config cfg = {.read_lease_ms = 50, .lease_expired = lease_record,
                               .lease_arg = &told};
    struct sfix *f;
    struct store_holder *h;
    struct shmb_error err = {0};
    struct store_stats st;
    int i;

    (void)state;
    memset(&told, 0, sizeof(told));
    f = sfix_new_cfg(8192, &cfg);
    h = store_holder_new(f->s);
    put_ok(f, h, "held", 3000, 2, 1, NULL);
    put_ok(f, h, "read", 1000, 1, 2, NULL);
    read_ok(f, h, "read", 1000, 2, false);
    put_ok(f, h, "other", 3000, 0, 3, NULL);
    assert_int_equal(put(f, h, "next", 3000, 0, 4, NULL, &err), -ENOSPC);
    expect_message_has(&err, "'held' blocks reclaim (pins=0, awaited reads=2)");
    assert_int_equal(told.calls, 0);

    sleep_ms(70);
    for (i = 0; i < 3; i++)
        st = stats_of(f);
    assert_int_equal(told.calls, 1);
    assert_int_equal(st.lease_expiries, 1);
    assert_string_equal(told.key, "held");
    assert_int_equal(told.reads_left, 2);
    put_ok(f, h, "next", 3000, 0, 4, NULL);
    assert_false(store_contains(f->s, "held", 4));
    put_ok(f, h, "more", 3000, 0, 5, NULL);
    st = stats_of(f);
    assert_int_equal(told.calls, 1);
    assert_int_equal(st.lease_expiries, 1);
    assert_true(st.evictions >= 2);

    /* Lease off: an awaited object holds its place again, however old. */
    store_set_read_lease(f->s, 0);
    assert_int_equal(store_touch(f->s, "next", 4, 1, &err), 0);
    sleep_ms(70);
    assert_int_equal(put(f, h, "last", 3000, 0, 6, NULL, &err), -ENOSPC);
    expect_message_has(&err, "'next' blocks reclaim (pins=0, awaited reads=1)");
    assert_int_equal(told.calls, 1);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* store_room_generation changes whenever room may have been made: a
 * release of the last pin, a delete, an abort, the last awaited read, a
 * holder going away with pins and pending allocations. */
static void test_room_generation(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s), *h2 = store_holder_new(f->s);
    struct shmb_error err = {0};
    uint64_t g;

    (void)state;
    put_ok(f, h, "a", 100, 1, 1, NULL);
    put_ok(f, h, "b", 100, 0, 2, NULL);

    g = store_room_generation(f->s);
    read_ok(f, h, "a", 100, 1, true); /* the last awaited read */
    assert_true(store_room_generation(f->s) != g);

    g = store_room_generation(f->s);
    assert_int_equal(store_release(f->s, h, "a", 1, &err), 0);
    assert_true(store_room_generation(f->s) != g);

    g = store_room_generation(f->s);
    assert_int_equal(store_delete(f->s, "b", 1, &err), 0);
    assert_true(store_room_generation(f->s) != g);

    assert_int_equal(store_alloc(f->s, h, "p", 1, 100, 0, NULL, &err), 0);
    g = store_room_generation(f->s);
    assert_int_equal(store_abort(f->s, h, "p", 1, &err), 0);
    assert_true(store_room_generation(f->s) != g);

    read_ok(f, h2, "a", 100, 1, true);
    assert_int_equal(store_alloc(f->s, h2, "q", 1, 100, 0, NULL, &err), 0);
    g = store_room_generation(f->s);
    store_holder_free(f->s, h2);
    assert_true(store_room_generation(f->s) != g);
    assert_int_equal(stats_of(f).pinned, 0);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* Proves that store_counts gives the same figures as store_stats, without
 * the blocker (it does not walk the ring), even when an object blocks. */
static void test_counts_match_stats(void **state)
{
    struct sfix *f = sfix_new(8192, 0);
    struct store_holder *h = store_holder_new(f->s);
    struct store_stats st, ct;

    (void)state;
    put_ok(f, h, "a", 100, 1, 1, NULL); /* awaits a read: blocks reclaim */
    put_ok(f, h, "b", 200, 0, 2, NULL);
    store_stats(f->s, &st);
    store_counts(f->s, &ct);
    assert_true(st.has_blocker);
    assert_false(ct.has_blocker);
    assert_int_equal(ct.used, st.used);
    assert_int_equal(ct.free, st.free);
    assert_int_equal(ct.data_size, st.data_size);
    assert_int_equal(ct.objects, 2);
    assert_int_equal(ct.objects, st.objects);
    assert_int_equal(ct.allocs, st.allocs);
    assert_int_equal(ct.commits, st.commits);
    assert_true(ct.used > 0);
    store_holder_free(f->s, h);
    sfix_free(f);
}

/* A store with a catalog over one buffer laid out as a segment: header
 * page, data area of data_size bytes, a catalog of 64 slots after it. */
struct cat_fix {
    struct sfix f;
    unsigned char *seg;
    struct catalog *cat;
    struct store_config cfg;
};

#define CAT_SLOTS 64u

static struct catalog *cat_fix_catalog(struct cat_fix *c)
{
    struct shmb_error err = {0};
    struct catalog *cat = catalog_new(c->seg, SHMB_HEADER_PAGE + c->f.size, CAT_SLOTS, 99,
                                      (struct shmb_segment_header *)c->seg, &err);

    if (cat == NULL)
        fail_msg("catalog_new: %s", err.message);
    return cat;
}

static struct cat_fix *cat_fix_new(uint64_t data_size)
{
    struct shmb_error err = {0};
    struct cat_fix *c = calloc(1, sizeof(*c));
    size_t bytes = (SHMB_HEADER_PAGE + data_size + CAT_SLOTS * 32 + SHMB_HEADER_PAGE - 1) /
                   SHMB_HEADER_PAGE * SHMB_HEADER_PAGE;

    assert_non_null(c);
    c->seg = aligned_alloc(SHMB_HEADER_PAGE, bytes);
    assert_non_null(c->seg);
    memset(c->seg, 0, bytes);
    c->f.data = c->seg + SHMB_HEADER_PAGE;
    c->f.size = data_size;
    c->cat = cat_fix_catalog(c);
    c->cfg.catalog = c->cat;
    c->f.s = store_new(c->f.data, DATA_OFFSET, data_size, &c->f.cursor, &c->cfg, &err);
    if (c->f.s == NULL)
        fail_msg("store_new: %s", err.message);
    return c;
}

static void cat_fix_free(struct cat_fix *c)
{
    store_free(c->f.s);
    catalog_free(c->cat);
    free(c->seg);
    free(c);
}

/* The seal of the chunk whose payload is at offset (key of key_len bytes). */
static uint64_t *seal_of(struct cat_fix *c, uint64_t offset, size_t key_len)
{
    return (uint64_t *)(c->seg + offset - SHMB_CHUNK_HEADER_SIZE(key_len) +
                        offsetof(struct shmb_chunk_header, seal));
}

/* The catalog entry listing chunk, or NULL. */
static const struct shmb_catalog_entry *entry_of(struct cat_fix *c, uint64_t chunk)
{
    const struct shmb_catalog_entry *t =
        (const struct shmb_catalog_entry *)(c->seg + SHMB_HEADER_PAGE + c->f.size);
    unsigned i;

    for (i = 0; i < CAT_SLOTS; i++)
        if (t[i].chunk == chunk)
            return &t[i];
    return NULL;
}

/* store_list callback: the entry of the key in arg->key. */
struct found_entry {
    const char *key;
    struct store_entry e;
    bool found;
};

static int find_entry(const struct store_entry *e, void *arg)
{
    struct found_entry *fe = arg;

    if (e->key_len == strlen(fe->key) && memcmp(e->key, fe->key, e->key_len) == 0) {
        fe->e = *e;
        fe->found = true;
    }
    return 0;
}

static struct store_entry entry_listed(struct cat_fix *c, const char *key)
{
    struct found_entry fe = {.key = key};

    store_list(c->f.s, "", 0, SIZE_MAX, find_entry, &fe);
    assert_true(fe.found);
    return fe.e;
}

/* Proves that a commit seals the chunk with a new generation (count 0) and
 * lists it in the catalog (AWAITED when it awaits reads), that list shows
 * the chunk offset and generation, and that a delete unlists it and swaps
 * the seal to 0 at once, even while the object is still pinned. */
static void test_seal_and_listing(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct shmb_error err = {0};
    struct store_extent a, b;
    const struct shmb_catalog_entry *ea, *eb;

    (void)state;
    put_ok(&c->f, h, "a", 100, 0, 1, &a);
    put_ok(&c->f, h, "bb", 200, 2, 2, &b);
    assert_int_equal(*seal_of(c, a.offset, 1), SHMB_SEAL(1, 0));
    assert_int_equal(*seal_of(c, b.offset, 2), SHMB_SEAL(2, 0));
    ea = entry_of(c, a.offset - 64);
    eb = entry_of(c, b.offset - 64);
    assert_non_null(ea);
    assert_non_null(eb);
    assert_int_equal(ea->gen, 1);
    assert_int_equal(ea->size, 100);
    assert_int_equal(ea->flags, 0);
    assert_int_equal(eb->flags, SHMB_CATALOG_AWAITED);
    assert_int_equal(entry_listed(c, "bb").chunk_offset, b.offset - 64);
    assert_int_equal(entry_listed(c, "bb").gen, 2);
    assert_int_equal(catalog_listed(c->cat), 2);
    /* Pending objects are neither sealed nor listed. */
    assert_int_equal(store_alloc(c->f.s, h, "p", 1, 10, 0, NULL, &err), 0);
    assert_int_equal(catalog_listed(c->cat), 2);
    read_ok(&c->f, h, "a", 100, 1, true); /* pinned */
    assert_int_equal(store_delete(c->f.s, "a", 1, &err), 0);
    assert_int_equal(*seal_of(c, a.offset, 1), 0);
    assert_null(entry_of(c, a.offset - 64));
    assert_int_equal(catalog_listed(c->cat), 1);
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* Proves that reads counted in place in the seal are folded into the
 * awaited reads (never below 0) by list, stats and reclaim, and counted in
 * fast_reads; that the read op's store_read_done takes one awaited read of
 * the right generation only; and that an evicted object is unlisted and
 * unsealed. */
static void test_fold_counts(void **state)
{
    struct cat_fix *c = cat_fix_new(8192);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_extent a, b;
    struct store_stats st;
    uint32_t gen_b;

    (void)state;
    put_ok(&c->f, h, "a", 3000, 3, 1, &a);
    *seal_of(c, a.offset, 1) = SHMB_SEAL(1, 1); /* a reader counted one read */
    assert_int_equal(entry_listed(c, "a").awaited_reads, 2);
    assert_int_equal(*seal_of(c, a.offset, 1), SHMB_SEAL(1, 0));
    *seal_of(c, a.offset, 1) = SHMB_SEAL(1, 7); /* more than it awaits */
    st = stats_of(&c->f);
    assert_false(st.has_blocker);
    assert_int_equal(st.fast_reads, 3);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 0);
    /* A count under another generation is not this object's. */
    put_ok(&c->f, h, "b", 3000, 2, 2, &b);
    gen_b = entry_listed(c, "b").gen;
    *seal_of(c, b.offset, 1) = SHMB_SEAL(gen_b + 1, 5);
    assert_int_equal(entry_listed(c, "b").awaited_reads, 2);
    *seal_of(c, b.offset, 1) = SHMB_SEAL(gen_b, 0);
    assert_int_equal(store_read_done(c->f.s, "b", 1, gen_b + 1), -ENOENT);
    assert_int_equal(store_read_done(c->f.s, "zz", 2, gen_b), -ENOENT);
    assert_int_equal(store_read_done(c->f.s, "b", 1, gen_b), 0);
    assert_int_equal(entry_listed(c, "b").awaited_reads, 1);
    assert_int_equal(stats_of(&c->f).fast_reads, 4);
    /* Reclaim folds too: b's last read counted in place lets "a" and "b"
     * go for a large object. */
    *seal_of(c, b.offset, 1) = SHMB_SEAL(gen_b, 1);
    put_ok(&c->f, h, "big", 4000, 0, 3, NULL);
    assert_int_equal(stats_of(&c->f).evictions, 2);
    assert_int_equal(stats_of(&c->f).fast_reads, 5);
    assert_int_equal(catalog_listed(c->cat), 1);
    assert_null(entry_of(c, b.offset - 64)); /* only "big" is listed */
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* Proves that a head-of-line blocker listed as awaiting reads done in
 * place (which tell the daemon nothing) makes waiting allocations look
 * again within STORE_FAST_READ_RECHECK_MS, and that nothing is armed once
 * it awaits none, or when the blocker is pinned (a release will say). */
static void test_recheck_awaited_blocker(void **state)
{
    struct cat_fix *c = cat_fix_new(8192);
    struct store_holder *h = store_holder_new(c->f.s);
    struct shmb_error err = {0};
    struct store_extent a;
    uint64_t before = clock_now_ms(), wake;

    (void)state;
    assert_int_equal(store_lease_wake_ms(c->f.s), UINT64_MAX); /* nothing blocks */
    put_ok(&c->f, h, "a", 100, 2, 1, &a);
    wake = store_lease_wake_ms(c->f.s);
    assert_true(wake >= before + STORE_FAST_READ_RECHECK_MS);
    assert_true(wake <= clock_now_ms() + STORE_FAST_READ_RECHECK_MS);
    assert_int_equal(store_get(c->f.s, h, "a", 1, NULL, &err), 0); /* pinned, 1 awaited */
    assert_int_equal(store_lease_wake_ms(c->f.s), UINT64_MAX);
    assert_int_equal(store_release(c->f.s, h, "a", 1, &err), 0);
    assert_true(store_lease_wake_ms(c->f.s) != UINT64_MAX);
    *seal_of(c, a.offset, 1) = SHMB_SEAL(entry_listed(c, "a").gen, 1); /* read in place */
    assert_int_equal(store_lease_wake_ms(c->f.s), UINT64_MAX);
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* Proves that a blocker awaiting reads whose catalog entry a newer object
 * took (a full catalog lists the newest) is still looked at again within
 * STORE_FAST_READ_RECHECK_MS: readers that found its entry before may
 * count their reads in its seal, which tells the daemon nothing. */
static void test_recheck_displaced_blocker(void **state)
{
    struct cat_fix *c = cat_fix_new(65536);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_extent a, e;
    uint64_t wake;
    char key[16];
    int i;

    (void)state;
    put_ok(&c->f, h, "a", 100, 2, 1, &a);
    for (i = 0; i < 300 && entry_of(c, a.offset - SHMB_CHUNK_HEADER_SIZE(1)) != NULL;
         i++) {
        snprintf(key, sizeof(key), "n%d", i);
        put_ok(&c->f, h, key, 8, 0, (uint64_t)i, &e);
    }
    assert_null(entry_of(c, a.offset - SHMB_CHUNK_HEADER_SIZE(1))); /* displaced */
    assert_true(catalog_displaced(c->cat) > 0);
    wake = store_lease_wake_ms(c->f.s);
    assert_true(wake <= clock_now_ms() + STORE_FAST_READ_RECHECK_MS);
    /* A read counted in place before the entry went: folded at the look. */
    *seal_of(c, a.offset, 1) = SHMB_SEAL(SHMB_SEAL_GEN(*seal_of(c, a.offset, 1)), 2);
    assert_int_equal(store_lease_wake_ms(c->f.s), UINT64_MAX);
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* The catalog entry of key: its generation and flags as readers see them. */
static const struct shmb_catalog_entry *entry_of_key(struct cat_fix *c, const char *key)
{
    const struct shmb_catalog_entry *e = entry_of(c, entry_listed(c, key).chunk_offset);

    assert_non_null(e);
    return e;
}

/* Proves that an object stops being listed as AWAITED once its awaited
 * reads reach 0 (readers in place stop counting, as a get leaves nothing
 * behind), and that a read counted in place while none were awaited (a
 * reader that loaded the entry just before) is not folded off a later
 * touch(readers=1): list shows 1 awaited read, a fill does not evict the
 * object, and only its read in place lets it go. */
static void test_touch_after_reads_done(void **state)
{
    struct cat_fix *c = cat_fix_new(8192);
    struct store_holder *h = store_holder_new(c->f.s);
    struct shmb_error err = {0};
    struct store_extent a;
    uint32_t gen;

    (void)state;
    put_ok(&c->f, h, "a", 3000, 1, 1, &a);
    put_ok(&c->f, h, "b", 3000, 0, 2, NULL); /* a big put needs "a"'s bytes */
    gen = entry_listed(c, "a").gen;
    assert_int_equal(entry_of_key(c, "a")->flags, SHMB_CATALOG_AWAITED);
    *seal_of(c, a.offset, 1) = SHMB_SEAL(gen, 1); /* its read, in place */
    assert_int_equal(entry_listed(c, "a").awaited_reads, 0);
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    /* A reader that saw the entry before the flag went counts anyway. */
    gen = entry_of_key(c, "a")->gen;
    *seal_of(c, a.offset, 1) = SHMB_SEAL(gen, 1);
    assert_int_equal(store_touch(c->f.s, "a", 1, 1, &err), 0);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 1);
    assert_int_equal(entry_of_key(c, "a")->flags, SHMB_CATALOG_AWAITED);
    assert_int_equal(put(&c->f, h, "big", 4000, 0, 3, NULL, &err), -ENOSPC);
    assert_true(store_contains(c->f.s, "a", 1));
    assert_int_equal(entry_listed(c, "a").awaited_reads, 1);
    /* Its read in place, under the generation listed now. */
    gen = entry_of_key(c, "a")->gen;
    *seal_of(c, a.offset, 1) = SHMB_SEAL(gen, 1);
    put_ok(&c->f, h, "big", 4000, 0, 3, NULL);
    assert_false(store_contains(c->f.s, "a", 1));
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* Proves that every way awaited reads reach 0 (a get, a read request, a
 * queue reader leaving) clears the entry's AWAITED flag, and that a queue
 * reader joining (expect) after a stale count in place awaits its read. */
static void test_awaited_flag_follows_reads(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_extent a;
    uint32_t gen;

    (void)state;
    put_ok(&c->f, h, "a", 100, 1, 1, &a);
    read_ok(&c->f, h, "a", 100, 1, false); /* a get: 0 awaited */
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    gen = entry_of_key(c, "a")->gen;
    *seal_of(c, a.offset, 1) = SHMB_SEAL(gen, 1); /* a late count in place */
    assert_int_equal(store_expect_read(c->f.s, "a", 1), 0);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 1);
    assert_int_equal(entry_of_key(c, "a")->flags, SHMB_CATALOG_AWAITED);
    assert_int_equal(store_forgo_read(c->f.s, "a", 1), 0);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 0);
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    assert_int_equal(store_expect_read(c->f.s, "a", 1), 0);
    gen = entry_of_key(c, "a")->gen;
    assert_int_equal(entry_of_key(c, "a")->flags, SHMB_CATALOG_AWAITED);
    assert_int_equal(store_read_done(c->f.s, "a", 1, gen), 0);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 0);
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    /* The flag's change keeps the generation: a copy under way stays exact. */
    assert_int_equal(entry_of_key(c, "a")->gen, gen);
    assert_int_equal(SHMB_SEAL_GEN(*seal_of(c, a.offset, 1)), gen);
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* A reader in place that probes for key while the daemon lists an entry
 * (catalog_add, wrapped by the link): what shmb_catalog_read answers at
 * that moment, before the entry is written. */
static struct {
    struct cat_fix *c;
    const char *key;
    int rc;
    bool seen;
} reader_at_add;

int __real_catalog_add(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                       uint32_t gen, uint64_t size, uint32_t flags, void *owner,
                       void **displaced);
int __wrap_catalog_add(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                       uint32_t gen, uint64_t size, uint32_t flags, void *owner,
                       void **displaced);

int __wrap_catalog_add(struct catalog *c, const char *key, size_t key_len, uint64_t chunk,
                       uint32_t gen, uint64_t size, uint32_t flags, void *owner,
                       void **displaced)
{
    if (reader_at_add.c != NULL && key_len == strlen(reader_at_add.key) &&
        memcmp(key, reader_at_add.key, key_len) == 0) {
        struct cat_fix *f = reader_at_add.c;
        struct shmb_catalog_view v = {
            .base = f->seg,
            .map_size = SHMB_HEADER_PAGE + f->f.size + CAT_SLOTS * 32,
            .data_offset = SHMB_HEADER_PAGE,
            .data_size = f->f.size,
            .catalog_offset = SHMB_HEADER_PAGE + f->f.size,
            .catalog_slots = CAT_SLOTS,
            .seed = 99,
        };
        struct shmb_catalog_hit hit;
        char buf[4096];

        reader_at_add.rc = shmb_catalog_read(&v, key, key_len, buf, sizeof(buf), &hit);
        reader_at_add.seen = true;
    }
    return __real_catalog_add(c, key, key_len, chunk, gen, size, flags, owner, displaced);
}

/* Proves that an object listed anew because it awaits reads again (a touch
 * with readers, a queue reader joining, after its awaited reads reached 0)
 * is never missing for a reader in place meanwhile: between taking the old
 * entry out and writing the new one, a probe that finds no entry does not
 * take that for a proof that the key has no object (it asks the daemon).
 * A touch(readers=1) after each get (vLLM's get_cached) relists every time,
 * and readers racing it got "No object" for a key that was there. */
static void test_relist_is_no_miss(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct shmb_segment_header *hdr = (struct shmb_segment_header *)c->seg;
    struct shmb_error err = {0};
    uint32_t gen;

    (void)state;
    /* The header page describes the table, as a segment's does. */
    hdr->catalog_seed = 99;
    hdr->catalog_slots = CAT_SLOTS;
    hdr->catalog_offset = SHMB_HEADER_PAGE + c->f.size;
    put_ok(&c->f, h, "a", 100, 1, 1, NULL);
    read_ok(&c->f, h, "a", 100, 1, false); /* its awaited read: the flag goes */
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    gen = entry_of_key(c, "a")->gen;
    reader_at_add.c = c;
    reader_at_add.key = "a";
    reader_at_add.seen = false;
    assert_int_equal(store_touch(c->f.s, "a", 1, 1, &err), 0);
    reader_at_add.c = NULL;
    assert_true(reader_at_add.seen); /* it was listed anew */
    assert_int_not_equal(entry_of_key(c, "a")->gen, gen);
    if (reader_at_add.rc == -ENOENT)
        fail_msg("a reader in place took the relisting of 'a' for a miss");
    assert_int_equal(reader_at_add.rc, -EAGAIN); /* it asks the daemon */
    /* Once listed again, the catalog proves misses again. */
    assert_int_equal(hdr->catalog_moves % 2, 0);
    /* The same when a queue reader joins (expect). */
    read_ok(&c->f, h, "a", 100, 1, false);
    assert_int_equal(entry_of_key(c, "a")->flags, 0);
    reader_at_add.c = c;
    reader_at_add.seen = false;
    assert_int_equal(store_expect_read(c->f.s, "a", 1), 0);
    reader_at_add.c = NULL;
    assert_true(reader_at_add.seen);
    assert_int_equal(reader_at_add.rc, -EAGAIN);
    assert_int_equal(hdr->catalog_moves % 2, 0);
    store_holder_free(c->f.s, h);
    cat_fix_free(c);
}

/* Proves that an adopted store gives every restored object a new
 * generation after both the old header's gen_next and every generation
 * found in a seal, seals it with that generation and lists it again in a
 * fresh catalog. */
static void test_adopt_generations(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_adopt_report report;
    struct store_extent a, b;
    struct shmb_error err = {0};
    struct store_entry ea, eb;

    (void)state;
    put_ok(&c->f, h, "a", 100, 0, 1, &a);
    put_ok(&c->f, h, "b", 100, 1, 2, &b);
    *seal_of(c, b.offset, 1) = SHMB_SEAL(40, 0); /* as if a later generation */
    store_free(c->f.s);
    catalog_free(c->cat);
    c->cat = cat_fix_catalog(c);
    c->cfg.catalog = c->cat;
    c->cfg.gen_floor = 30;
    c->f.s = store_adopt(c->f.data, DATA_OFFSET, c->f.size, &c->f.cursor, &c->cfg, &report,
                         &err);
    assert_non_null(c->f.s);
    assert_int_equal(report.restored, 2);
    ea = entry_listed(c, "a");
    eb = entry_listed(c, "b");
    assert_int_equal(ea.gen, 41);
    assert_int_equal(eb.gen, 42);
    assert_int_equal(*seal_of(c, a.offset, 1), SHMB_SEAL(41, 0));
    assert_int_equal(*seal_of(c, b.offset, 1), SHMB_SEAL(42, 0));
    assert_int_equal(entry_of(c, b.offset - 64)->gen, 42);
    assert_int_equal(entry_of(c, b.offset - 64)->flags, SHMB_CATALOG_AWAITED);
    assert_int_equal(catalog_listed(c->cat), 2);
    assert_int_equal(((struct shmb_segment_header *)c->seg)->gen_next, 43);
    cat_fix_free(c);
}

/* Re-open c's store over the same bytes, as a restarted daemon does. */
static void readopt(struct cat_fix *c)
{
    struct store_adopt_report report;
    struct shmb_error err = {0};

    store_free(c->f.s);
    catalog_free(c->cat);
    c->cat = cat_fix_catalog(c);
    c->cfg.catalog = c->cat;
    c->f.s = store_adopt(c->f.data, DATA_OFFSET, c->f.size, &c->f.cursor, &c->cfg, &report,
                         &err);
    assert_non_null(c->f.s);
}

/* Proves that reads counted in place survive a restart: whether the count
 * is still in the seal (the daemon never looked) or was folded already,
 * the adopted object awaits only the reads left, and a second restart
 * does not bring the counted ones back. */
static void test_adopt_keeps_counted_reads(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_extent a, b;
    uint32_t gen_a;

    (void)state;
    put_ok(&c->f, h, "a", 100, 3, 1, &a);
    put_ok(&c->f, h, "b", 100, 2, 2, &b);
    gen_a = entry_listed(c, "a").gen;
    /* b: one read counted and folded (list looks at awaited reads). */
    *seal_of(c, b.offset, 1) = SHMB_SEAL(entry_listed(c, "b").gen, 1);
    assert_int_equal(entry_listed(c, "b").awaited_reads, 1);
    /* a: two reads counted, never seen by the daemon before it died. */
    *seal_of(c, a.offset, 1) = SHMB_SEAL(gen_a, 2);
    store_holder_free(c->f.s, h);
    readopt(c);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 1);
    assert_int_equal(entry_listed(c, "b").awaited_reads, 1);
    readopt(c);
    assert_int_equal(entry_listed(c, "a").awaited_reads, 1);
    assert_int_equal(entry_listed(c, "b").awaited_reads, 1);
    cat_fix_free(c);
}

/* Proves that a chunk an adoption drops (here: a tag no client could have
 * set) loses its generation: its bytes are reused, and a reader that copied
 * it under the old generation must not find that generation again. */
static void test_adopt_unseals_dropped(void **state)
{
    struct cat_fix *c = cat_fix_new(16384);
    struct store_holder *h = store_holder_new(c->f.s);
    struct store_extent a;
    uint32_t bad = STORE_MAX_READERS + 1;

    (void)state;
    put_ok(&c->f, h, "a", 100, 0, 1, &a);
    assert_true(SHMB_SEAL_GEN(*seal_of(c, a.offset, 1)) != 0);
    memcpy(c->seg + a.offset - 64 + offsetof(struct shmb_chunk_header, tag), &bad, sizeof(bad));
    store_holder_free(c->f.s, h);
    readopt(c);
    assert_false(store_contains(c->f.s, "a", 1));
    assert_int_equal(*seal_of(c, a.offset, 1), 0);
    cat_fix_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_match_stats),
        cmocka_unit_test(test_seal_and_listing),
        cmocka_unit_test(test_fold_counts),
        cmocka_unit_test(test_adopt_generations),
        cmocka_unit_test(test_adopt_keeps_counted_reads),
        cmocka_unit_test(test_adopt_unseals_dropped),
        cmocka_unit_test(test_recheck_awaited_blocker),
        cmocka_unit_test(test_recheck_displaced_blocker),
        cmocka_unit_test(test_touch_after_reads_done),
        cmocka_unit_test(test_awaited_flag_follows_reads),
        cmocka_unit_test(test_relist_is_no_miss),
        cmocka_unit_test(test_minimal_put_get_cycle),
        cmocka_unit_test(test_put_same_key_twice),
        cmocka_unit_test(test_large_object_rejection),
        cmocka_unit_test(test_invalid_arguments),
        cmocka_unit_test(test_buffer_overflow_and_cleanup),
        cmocka_unit_test(test_blocking_unread_object),
        cmocka_unit_test(test_blocker_pin_count),
        cmocka_unit_test(test_commit_abort_other_holder),
        cmocka_unit_test(test_get_pending),
        cmocka_unit_test(test_delete_while_pinned),
        cmocka_unit_test(test_pins_per_holder),
        cmocka_unit_test(test_holder_free),
        cmocka_unit_test(test_touch),
        cmocka_unit_test(test_list),
        cmocka_unit_test(test_chunk_states_in_segment),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_store_new_invalid),
        cmocka_unit_test(test_default_max_object),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_random_model),
        cmocka_unit_test(test_adopt_restores),
        cmocka_unit_test(test_adopted_like_allocated),
        cmocka_unit_test(test_adopt_corrupt),
        cmocka_unit_test(test_adopt_drops_bad_keys),
        cmocka_unit_test(test_expire_pending),
        cmocka_unit_test(test_read_lease),
        cmocka_unit_test(test_stats_cost),
        cmocka_unit_test(test_blocker_backlog_bounded),
        cmocka_unit_test(test_room_generation),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
