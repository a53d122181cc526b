// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of reads without a round trip and puts in one, through
 * the library against the real daemon: shmb_read from the catalog (exact
 * bytes, proven misses, awaited reads counted on read-write and read-only
 * handles) and shmb_put through an arena (visible at once, one request per
 * put, the nowait ordering, an arena taken back, arenas off). The requests
 * a handle sends are counted by wrapping send() (the link's --wrap=send).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* Every send() of this process: the library writes each batch of requests
 * with one (a put through the arena is one write, refill included). */
static unsigned long sends;
ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
    sends++;
    return __real_send(fd, buf, len, flags);
}

/* Every mincore() of this process: before it writes into its arena the
 * library looks whether the pages are there (a client may have truncated
 * the segment), once per put. */
static unsigned long looks;
int __real_mincore(void *addr, size_t len, unsigned char *vec);
int __wrap_mincore(void *addr, size_t len, unsigned char *vec);
int __wrap_mincore(void *addr, size_t len, unsigned char *vec)
{
    looks++;
    return __real_mincore(addr, len, vec);
}

static void stats(shmb_t *c, shmb_stats_t *st)
{
    ok(c, shmb_stats(c, st));
}

/* shmb_read of key into a fresh buffer: size and h_fill's pattern checked. */
static void read_check_at(shmb_t *c, const char *key, size_t size, uint32_t seed,
                          const char *file, int line)
{
    unsigned char *buf = malloc(size + 64);
    size_t got = 0, bad;

    assert_non_null(buf);
    memset(buf, 0xee, size + 64);
    h_check_ok(c, shmb_read(c, key, buf, size + 64, &got), "shmb_read", file, line);
    if (got != size)
        h_fail_at(file, line, "shmb_read of %s: %zu bytes, expected %zu", key, got, size);
    if ((bad = h_check(buf, size, seed)) != size)
        h_fail_at(file, line, "shmb_read of %s: byte %zu differs", key, bad);
    if (buf[size] != 0xee)
        h_fail_at(file, line, "shmb_read of %s wrote past the payload", key);
    free(buf);
}
#define read_check(c, key, size, seed) read_check_at((c), (key), (size), (seed), __FILE__, __LINE__)

/* No read of c went to the daemon, and fast ones did. */
static void assert_all_fast(shmb_t *c, uint64_t fast)
{
    shmb_read_stats_t rs;

    shmb_read_stats(c, &rs);
    if (rs.fallback != 0 || rs.fast != fast)
        h_fail("shmb_read_stats: %llu fast, %llu fallback; expected %llu fast, 0 fallback",
               (unsigned long long)rs.fast, (unsigned long long)rs.fallback,
               (unsigned long long)fast);
}

/* Put n objects PREFIX0..PREFIX(n-1) with w (sizes size + i * step, h_fill
 * seeds seed + i), check that each put was one send(), then read each back
 * with r. */
static void put_series(shmb_t *w, shmb_t *r, const char *prefix, int n, size_t size,
                       size_t step, uint32_t seed)
{
    unsigned long at = sends;
    char key[32];
    int i;

    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%d", prefix, i);
        ok(w, h_put_pattern(w, key, size + (size_t)i * step, seed + (uint32_t)i, 0));
    }
    if (sends - at != (unsigned long)n)
        h_fail("%d puts made %lu sends, not %d", n, sends - at, n);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%d", prefix, i);
        read_check(r, key, size + (size_t)i * step, seed + (uint32_t)i);
    }
}

/* Put objects of size bytes with filler (arenas off) until key is evicted
 * (seen from c); returns how many were put, the test fails if key stays. */
static int fill_until_gone(shmb_t *c, shmb_t *filler, const char *key, size_t size)
{
    char name[32];
    int i;

    shmb_set_arena(filler, 0);
    for (i = 0; i < 256 && shmb_contains(c, key) == 1; i++) {
        snprintf(name, sizeof(name), "fill-%d", i);
        ok(filler, h_put_pattern(filler, name, size, (uint32_t)i, 0));
    }
    assert_int_equal(shmb_contains(c, key), 0);
    return i;
}

/* A read of a committed key is the exact bytes, answered from the mapping
 * (no fallback), for small, odd and larger sizes, on the writer's handle,
 * another read-write one and a read-only one. */
static void test_read_hit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0),
           *ro = h_lib_connect(d, "ro", 1);
    static const size_t sizes[] = {1, 63, 64, 65, 4096, 100000};
    char key[32];
    size_t i;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(key, sizeof(key), "hit-%zu", sizes[i]);
        ok(w, h_put_pattern(w, key, sizes[i], (uint32_t)i + 1, 0));
    }
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        snprintf(key, sizeof(key), "hit-%zu", sizes[i]);
        read_check(w, key, sizes[i], (uint32_t)i + 1);
        read_check(r, key, sizes[i], (uint32_t)i + 1);
        read_check(ro, key, sizes[i], (uint32_t)i + 1);
    }
    assert_all_fast(w, 6);
    assert_all_fast(r, 6);
    assert_all_fast(ro, 6);
    shmb_close(w);
    shmb_close(r);
    shmb_close(ro);
    h_pass(f);
}

/* Misses: a key never put, a deleted key and an evicted key are -ENOENT
 * with a message naming the key, proven from the mapping. A buffer too
 * small is -ENOBUFS with the size needed. */
static void test_read_miss(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "c", 0), *filler = h_lib_connect(d, "filler", 0);
    unsigned char buf[256];
    size_t got = 99;
    char key[32];
    int i;

    fails(c, shmb_read(c, "never", buf, sizeof(buf), &got), -ENOENT, "'never'");
    assert_int_equal(got, 0);
    ok(c, h_put_pattern(c, "gone", 100, 5, 0));
    read_check(c, "gone", 100, 5);
    ok(c, shmb_delete(c, "gone"));
    fails(c, shmb_read(c, "gone", buf, sizeof(buf), &got), -ENOENT, "'gone'");
    ok(c, h_put_pattern(c, "small", 200, 6, 0));
    fails(c, shmb_read(c, "small", buf, 199, &got), -ENOBUFS, "buffer of 199 bytes");
    assert_int_equal(got, 200);
    fails(c, shmb_read(c, "small", NULL, 0, &got), -ENOBUFS, "object is 200 bytes");
    assert_int_equal(got, 200);
    /* Eviction: objects of another handle until "old" goes. */
    ok(c, h_put_pattern(c, "old", 100, 7, 0));
    i = fill_until_gone(c, filler, "old", 64 * 1024);
    fails(c, shmb_read(c, "old", buf, sizeof(buf), &got), -ENOENT, "'old'");
    fails(c, shmb_read(c, "small", buf, sizeof(buf), &got), -ENOENT, "'small'");
    /* The newest filler is still there, and read from the mapping. */
    snprintf(key, sizeof(key), "fill-%d", i - 1);
    read_check(c, key, 64 * 1024, (uint32_t)(i - 1));
    assert_all_fast(c, 8);
    shmb_close(c);
    shmb_close(filler);
    h_pass(f);
}

/* An object that awaits a read is the blocker of reclaim (stats) and is
 * not evicted; shmb_read on a handle counts that read (in the seal on a
 * read-write handle, by a read request on a read-only one), after which it
 * is no blocker and other puts evict it as any other. */
static void awaited_case(struct h_fix *f, int read_only)
{
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", read_only);
    unsigned char buf[1024];
    shmb_stats_t st;
    size_t got;

    shmb_set_arena(w, 0);
    ok(w, h_put_pattern(w, "awaited", 1000, 3, 1));
    stats(w, &st);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "awaited");
    assert_int_equal(st.blocker_readers, 1);
    ok(r, shmb_read(r, "awaited", buf, sizeof(buf), &got));
    assert_int_equal(got, 1000);
    assert_int_equal(h_check(buf, 1000, 3), 1000);
    assert_all_fast(r, 1);
    /* A round trip on the reader's connection: its read request, if any,
     * was handled before. */
    assert_int_equal(shmb_contains(r, "awaited"), 1);
    stats(w, &st);
    assert_false(st.has_blocker);
    fill_until_gone(w, w, "awaited", 64 * 1024);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

static void test_awaited_rw(void **state)
{
    awaited_case(*state, 0);
}

static void test_awaited_ro(void **state)
{
    awaited_case(*state, 1);
}

/* The reads key still awaits, as list shows them. */
static uint64_t awaited_of(shmb_t *c, const char *key)
{
    shmb_list_t *list = NULL;
    uint64_t readers = UINT64_MAX;
    size_t i;

    ok(c, shmb_list(c, key, 16, &list));
    for (i = 0; i < list->count; i++)
        if (strcmp(list->objects[i].key, key) == 0)
            readers = list->objects[i].readers;
    shmb_list_free(list);
    if (readers == UINT64_MAX)
        h_fail("list does not show '%s'", key);
    return readers;
}

/* A read in place of an object that awaits no more reads leaves nothing
 * behind, as a get would: a later touch(readers=1) (vLLM's get_cached)
 * awaits one new read. list shows it, puts that need its bytes are refused
 * rather than evict it, and once it is read in place it goes as any other. */
static void test_touch_after_read(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0),
           *filler = h_lib_connect(d, "filler", 0);
    char name[32];
    int i, rc = 0;

    shmb_set_arena(w, 0);
    shmb_set_arena(filler, 0);
    ok(w, h_put_pattern(w, "k", 1000, 3, 1));
    read_check(r, "k", 1000, 3); /* the read it awaited */
    assert_int_equal(awaited_of(w, "k"), 0);
    read_check(r, "k", 1000, 3); /* awaited by no one */
    ok(w, shmb_touch(w, "k", 1));
    assert_int_equal(awaited_of(w, "k"), 1);
    for (i = 0; i < 64 && rc == 0; i++) {
        snprintf(name, sizeof(name), "full-%d", i);
        rc = h_put_pattern(filler, name, 64 * 1024, (uint32_t)i, 0);
    }
    if (rc != -ENOSPC)
        h_fail("%d puts of 64 KiB into 1 MiB ended with %d, not -ENOSPC", i, rc);
    assert_int_equal(shmb_contains(w, "k"), 1);
    assert_int_equal(awaited_of(w, "k"), 1);
    read_check(r, "k", 1000, 3);
    assert_all_fast(r, 3);
    fill_until_gone(w, filler, "k", 64 * 1024);
    shmb_close(w);
    shmb_close(r);
    shmb_close(filler);
    h_pass(f);
}

/* A read-only reader sends one read request for the read an object
 * awaited; once it awaits none, its reads in place send nothing. */
static void test_ro_reads_done(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1);
    unsigned long at;

    ok(w, h_put_pattern(w, "k", 1000, 3, 1));
    at = sends;
    read_check(ro, "k", 1000, 3);
    assert_int_equal(sends - at, 1);             /* its read request */
    assert_int_equal(shmb_contains(ro, "k"), 1); /* answered after the read request */
    assert_int_equal(awaited_of(w, "k"), 0);
    at = sends;
    read_check(ro, "k", 1000, 3);
    read_check(ro, "k", 1000, 3);
    read_check(ro, "k", 1000, 3);
    if (sends - at != 0)
        h_fail("3 reads of an object that awaits no reads made %lu sends, not 0",
               sends - at);
    assert_all_fast(ro, 4);
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* A put through the arena is visible to another handle as soon as it
 * returns (its read answered from the mapping), is one request (one
 * send()) and one look at its pages (one mincore()) once the arena is
 * held, allocates nothing, and commits one object each. */
static void test_put_one_round_trip(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    shmb_stats_t before, after;

    unsigned long at;

    ok(w, h_put_pattern(w, "first", 64, 1, 0)); /* takes the arena */
    read_check(r, "first", 64, 1);
    stats(w, &before);
    at = looks;
    put_series(w, r, "k", 100, 64, 1, 0);
    /* One look at the arena's pages per put (its lock word and payload in
     * one mincore), no more. */
    if (looks - at != 100)
        h_fail("100 puts looked at their pages with %lu mincore calls, not 100",
               looks - at);
    assert_all_fast(r, 101);
    stats(w, &after);
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(after.commits, before.commits + 100);
    assert_int_equal(after.objects, before.objects + 100);
    /* A put refused for its key (EEXIST) is stepped over by daemon and
     * library alike: the next puts go on in the same arena, in one round
     * trip each, waited for or not. */
    assert_int_equal(h_put_pattern(w, "first", 64, 9, 0), -EEXIST);
    ok(w, h_put_pattern(w, "after-dup", 64, 2, 0));
    assert_int_equal(shmb_put_nowait(w, "first", "x", 1, 0), 0);
    ok(w, h_put_pattern(w, "after-dup2", 64, 3, 0));
    read_check(r, "after-dup", 64, 2);
    read_check(r, "after-dup2", 64, 3);
    read_check(r, "first", 64, 1);
    stats(w, &after);
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(after.noreply_errors, before.noreply_errors + 1);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* A daemon whose catalog is far smaller than its objects (--max-objects
 * 16: 32 entries, 400 objects of 64 bytes) lists each new object in place
 * of an old one: every read right after its put is answered from the
 * mapping, as a catalog with room would, and an object whose listing went
 * is still read whole (from the daemon). */
static void test_full_catalog_lists_newest(void **state)
{
    static const char *const extra[] = {"--max-objects", "16", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    shmb_read_stats_t rs;
    char key[32];
    int i;

    for (i = 0; i < 400; i++) {
        snprintf(key, sizeof(key), "n%d", i);
        ok(w, h_put_pattern(w, key, 64, (uint32_t)i, 0));
        read_check(r, key, 64, (uint32_t)i);
    }
    assert_all_fast(r, 400);
    read_check(r, "n0", 64, 0);
    shmb_read_stats(r, &rs);
    assert_int_equal(rs.fast + rs.fallback, 401);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* A full catalog whose displaced objects, the oldest, were deleted first
 * (as eviction takes them) has every entry taken and none unlisted, so a
 * miss in it is a proof: deleting the objects one by one from the oldest,
 * every object left must still be read whole after each delete. A removal
 * from that table once left an empty entry before listings it should have
 * moved back, and shmb_read answered ENOENT for an object that exists. */
static void test_full_catalog_delete_keeps_reads(void **state)
{
    static const char *const extra[] = {"--max-objects", "16", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    char key[32];
    int i, j;

    for (i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        ok(w, h_put_pattern(w, key, 64, (uint32_t)i, 0));
    }
    for (i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "o%d", i);
        ok(w, shmb_delete(w, key));
        for (j = i + 1; j < 200; j++) {
            snprintf(key, sizeof(key), "o%d", j);
            read_check(r, key, 64, (uint32_t)j);
        }
    }
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* Puts of 4 KiB run through several arenas (each refilled in the write of
 * a commit): every object intact, still one send each. */
static void test_put_refills(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);

    shmb_set_arena(w, 16 * 1024);
    ok(w, h_put_pattern(w, "first", 4096, 1, 0));
    put_series(w, r, "r", 200, 4096, 0, 10);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* shmb_put_nowait sends one request and waits for nothing; the object is
 * visible to everyone once a later call on the same handle was answered.
 * A key that exists makes no error here (the daemon counts it); the reply
 * to the next request tells it, and the next put reports it with the key
 * (-ECANCELED, that put not made); the puts after go on. */
static void test_put_nowait(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    shmb_stats_t st;
    unsigned long at;
    char data[100];

    memset(data, 'x', sizeof(data));
    ok(w, h_put_pattern(w, "first", 64, 1, 0));
    at = sends;
    h_fill(data, sizeof(data), 9);
    ok(w, shmb_put_nowait(w, "later", data, sizeof(data), 0));
    assert_int_equal(sends - at, 1);
    assert_int_equal(shmb_contains(w, "later"), 1);
    read_check(r, "later", sizeof(data), 9);
    ok(w, shmb_put_nowait(w, "later", data, sizeof(data), 0));
    stats(w, &st);
    assert_int_equal(st.noreply_errors, 1);
    fails(w, h_put_pattern(w, "after", 300, 11, 0), -ECANCELED,
          "of 'later' was refused by shmbrokerd (EEXIST: Key 'later' already exists");
    assert_non_null(strstr(shmb_errmsg(w), "This put of 'after' was not made"));
    assert_int_equal(shmb_contains(w, "after"), 0);
    /* The arena is still in step after the refused commit. */
    ok(w, h_put_pattern(w, "after", 300, 11, 0));
    read_check(r, "after", 300, 11);
    /* Arenas off: nothing is sent. */
    shmb_set_arena(w, 0);
    fails(w, shmb_put_nowait(w, "off", data, sizeof(data), 0), -ENOTSUP, "shmb_put");
    assert_int_equal(shmb_contains(w, "off"), 0);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* A put sent without waiting is not lost to another client's need of room:
 * with the daemon stopped, another client asks for more room than is free
 * (the writer's arena is the ring's oldest chunk, its lock IDLE), the
 * writer puts without waiting, and the daemon resumes. The daemon must not
 * take the arena back under the commit still on its way (it did: the commit
 * failed with ESTALE that only the daemon's log saw); the object (which
 * awaits a read, so that it may not be evicted) is there once the writer's
 * next call was answered. */
static void test_nowait_not_lost_to_room(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *filler = h_lib_connect(d, "filler", 0);
    struct h_conn o;
    shmb_stats_t st;
    char key[32], data[100];
    json_t *reply;
    int i;

    json_decref(h_open_hello(&o, d));
    ok(w, h_put_pattern(w, "first", 100, 1, 0)); /* takes the arena: the oldest chunk */
    shmb_set_arena(filler, 0);
    for (i = 0;; i++) {
        stats(filler, &st);
        if (st.free < 64 * 1024)
            break;
        assert_true(i < 200);
        snprintf(key, sizeof(key), "fill-%d", i);
        ok(filler, h_put_pattern(filler, key, 16 * 1024, (uint32_t)i, 0));
    }
    h_fill(data, sizeof(data), 7);
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    assert_int_equal(h_conn_sendline(&o, "{\"op\":\"alloc\",\"key\":\"room\","
                                         "\"size\":100000,\"id\":1}"),
                     0);
    /* An awaited read keeps it from being evicted once committed. */
    ok(w, shmb_put_nowait(w, "victim", data, sizeof(data), 1));
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    reply = h_recv_json(&o); /* room or ENOSPC: either is fine */
    json_decref(reply);
    if (shmb_contains(w, "victim") != 1) {
        stats(filler, &st);
        h_fail("the put sent without waiting is not there after the writer's next call was "
               "answered (noreply errors: %llu)",
               (unsigned long long)st.noreply_errors);
    }
    read_check(filler, "victim", sizeof(data), 7);
    stats(filler, &st);
    assert_int_equal(st.noreply_errors, 0);
    h_conn_close(&o);
    shmb_close(w);
    shmb_close(filler);
    h_pass(f);
}

/* Puts sent without waiting that the daemon refuses are reported with the
 * first one's key by the handle's next put, however the reply that told of
 * them ended (here an error: ENOENT for a get), with how many more; that put
 * is not made, and the next one is. */
static void test_nowait_loss_reported(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0);
    const void *p;
    size_t len;
    char data[64];

    h_fill(data, sizeof(data), 5);
    ok(w, h_put_pattern(w, "dup", 64, 1, 0));
    ok(w, shmb_put_nowait(w, "dup", data, sizeof(data), 0));
    ok(w, shmb_put_nowait(w, "dup", data, sizeof(data), 0));
    fails(w, shmb_get(w, "missing", &p, &len), -ENOENT, "'missing'");
    fails(w, shmb_put_nowait(w, "x", data, sizeof(data), 0), -ECANCELED,
          "(shmb_put_nowait) of 'dup' was refused by shmbrokerd (EEXIST: ");
    assert_non_null(strstr(shmb_errmsg(w), "and 1 more after it"));
    assert_int_equal(shmb_contains(w, "x"), 0);
    ok(w, shmb_put_nowait(w, "x", data, sizeof(data), 0));
    assert_int_equal(shmb_contains(w, "x"), 1);
    ok(w, h_put_pattern(w, "y", 64, 2, 0)); /* nothing more to report */
    shmb_close(w);
    h_pass(f);
}

/* A commit refused before the daemon looked at the arena (here for its
 * "readers", over the daemon's bound: the library does not know that bound)
 * was on its way all the same, and is no more once refused: the writer's
 * arena, idle, goes when the ring needs its room. (The count of commits on
 * their way was taken off only by commits that got as far as the arena; one
 * refused before stayed counted, and the arena stayed the writer's for as
 * long as its connection lived, idle or not, past --alloc-timeout: every
 * other client's alloc failed with ENOSPC naming it.) */
static void test_refused_commit_not_counted(void **state)
{
    struct h_fix *f = *state;
    const char *extra[] = {"--alloc-timeout", "1s", NULL};
    struct h_daemon *d = h_daemon_start(f, "1M", extra);
    shmb_t *w = h_lib_connect(d, "writer", 0), *filler = h_lib_connect(d, "filler", 0);
    char key[32], data[100];
    int i;

    h_fill(data, sizeof(data), 3);
    ok(w, h_put_pattern(w, "first", 100, 1, 0)); /* takes the arena: the oldest chunk */
    fails(w, shmb_put(w, "too-many-readers", data, sizeof(data), 2000000), -EINVAL,
          "\"readers\" must be between 0 and 1000000");
    ok(w, shmb_put_nowait(w, "nowait-too-many", data, sizeof(data), 3000000));
    shmb_set_arena(filler, 0);
    /* Four times the ring: the arena's room is needed, again and again. */
    for (i = 0; i < 256; i++) {
        snprintf(key, sizeof(key), "fill-%d", i);
        ok(filler, h_put_pattern(filler, key, 16 * 1024, (uint32_t)i, 0));
    }
    /* The refused nowait put is told all the same (by the reply to the next
     * call, then by the next put). */
    assert_int_equal(shmb_contains(w, "nowait-too-many"), 0);
    fails(w, shmb_put(w, "after", data, sizeof(data), 0), -ECANCELED,
          "of 'nowait-too-many' was refused by shmbrokerd (EINVAL: ");
    ok(w, shmb_put(w, "after", data, sizeof(data), 0));
    shmb_close(w);
    shmb_close(filler);
    h_pass(f);
}

/* A put sent without waiting whose connection ended before a later reply
 * proved it handled is reported, not taken for made: with the commit in the
 * socket of a stopped daemon, the daemon is killed and started again (it
 * adopts the segment); the call that finds the connection gone names the
 * put, and after shmb_reconnect the next put returns -ECANCELED naming it
 * (before, the error said only that committed objects stay, and the put
 * was never made nor told). A handle that reconnects with such puts
 * outstanding on a live connection first hears what became of them: the
 * daemon's record of a refusal ends with the connection. */
static void test_nowait_lost_with_connection(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0);
    char data[100];

    h_fill(data, sizeof(data), 9);
    ok(w, h_put_pattern(w, "first", 100, 1, 0));
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    ok(w, shmb_put_nowait(w, "victim", data, sizeof(data), 1));
    ok(w, shmb_put_nowait(w, "victim2", data, sizeof(data), 1));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    fails(w, shmb_contains(w, "first"), -ECONNRESET, "(the first of 'victim')");
    ok(w, shmb_reconnect(w));
    assert_int_equal(shmb_contains(w, "victim"), 0);
    fails(w, shmb_put(w, "next", data, sizeof(data), 0), -ECANCELED,
          "(shmb_put_nowait) of 'victim' may not have been made");
    assert_non_null(strstr(shmb_errmsg(w), "and 1 more after it"));
    ok(w, shmb_put(w, "next", data, sizeof(data), 0));
    /* On a connection the handle leaves for a new one, one made and one
     * refused (the key exists): the refused one is reported as such, the
     * other is not taken for lost. */
    ok(w, shmb_put_nowait(w, "made", data, sizeof(data), 0));
    ok(w, shmb_put_nowait(w, "next", data, sizeof(data), 0));
    ok(w, shmb_reconnect(w));
    fails(w, shmb_put(w, "next2", data, sizeof(data), 0), -ECANCELED,
          "(shmb_put_nowait) of 'next' was refused by shmbrokerd (EEXIST: ");
    assert_null(strstr(shmb_errmsg(w), "more after it"));
    ok(w, shmb_put(w, "next2", data, sizeof(data), 0));
    read_check(w, "made", sizeof(data), 9);
    read_check(w, "next2", sizeof(data), 9);
    shmb_close(w);
    h_pass(f);
}

/* A writer that ends with puts sent without waiting learns of a refused
 * one without putting again: shmb_sync waits until they were handled and
 * returns -ECANCELED naming the first refused key (a call answered in
 * between, here shmb_contains, makes no difference), then 0 once told; with
 * nothing outstanding it sends nothing. (Only the next put reported it: a
 * writer whose last puts went without waiting, behind a call answered as a
 * barrier, never learned that one was lost.) */
static void test_sync_reports_lost(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0);
    unsigned long at;
    char data[64];

    h_fill(data, sizeof(data), 5);
    ok(w, h_put_pattern(w, "dup", 64, 1, 0));
    ok(w, shmb_put_nowait(w, "a", data, sizeof(data), 0));
    ok(w, shmb_put_nowait(w, "dup", data, sizeof(data), 0));
    ok(w, shmb_put_nowait(w, "b", data, sizeof(data), 0));
    fails(w, shmb_sync(w), -ECANCELED,
          "(shmb_put_nowait) of 'dup' was refused by shmbrokerd (EEXIST: ");
    assert_null(strstr(shmb_errmsg(w), "This put"));
    assert_int_equal(shmb_contains(w, "b"), 1);
    ok(w, shmb_sync(w));
    ok(w, shmb_put_nowait(w, "dup", data, sizeof(data), 0));
    assert_int_equal(shmb_contains(w, "a"), 1); /* the barrier: its reply tells */
    fails(w, shmb_sync(w), -ECANCELED, "of 'dup' was refused");
    at = sends;
    ok(w, shmb_sync(w));
    assert_int_equal(sends, at); /* nothing outstanding: nothing sent */
    ok(w, h_put_pattern(w, "c", 64, 2, 0));
    shmb_close(w);
    h_pass(f);
}

/* test_nowait_under_pressure: the nowait writer's puts (100 bytes each) and
 * the filler's (16 KiB each, arenas off: an alloc that needs room nearly
 * every time). */
#define PRESSURE_NOWAIT_PUTS 20000
#define PRESSURE_FILL_PUTS 1500

/* A writer of test_nowait_under_pressure, nowait (arg's first byte 'n') or
 * filler: its puts under keys of its own, then one answered call. 0, or 1
 * with the failure on stderr. */
static int pressure_writer(void *arg)
{
    const struct h_daemon *d = *(const struct h_daemon **)((char *)arg + 8);
    bool nowait = *(const char *)arg == 'n';
    int n = nowait ? PRESSURE_NOWAIT_PUTS : PRESSURE_FILL_PUTS, i, rc;
    size_t size = nowait ? 100 : 16 * 1024;
    shmb_t *c = shmb_new();
    shmb_stats_t st;
    char key[32], *data = malloc(size);

    if (c == NULL || data == NULL || shmb_connect(c, d->socket, "pressure") != 0) {
        fprintf(stderr, "pressure writer: cannot connect\n");
        return 1;
    }
    if (!nowait)
        shmb_set_arena(c, 0);
    h_fill(data, size, (uint32_t)getpid());
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%c%d", nowait ? 'n' : 'f', i);
        rc = nowait ? shmb_put_nowait(c, key, data, size, 0) : shmb_put(c, key, data, size, 0);
        if (nowait && i % 4 == 3)
            usleep(50);
        if (rc != 0) {
            fprintf(stderr, "put '%s': %s: %s\n", key, shmb_errname(c), shmb_errmsg(c));
            return 1;
        }
    }
    if (shmb_stats(c, &st) != 0) {
        fprintf(stderr, "shmb_stats: %s: %s\n", shmb_errname(c), shmb_errmsg(c));
        return 1;
    }
    shmb_close(c);
    free(data);
    return 0;
}

/* Under eviction pressure every put sent without waiting is committed: one
 * writer puts small objects without waiting while another fills a 1 MiB
 * ring with large ones, so that the first one's arena is the ring's oldest
 * chunk, wanted for room, again and again while its commits are on their
 * way. The daemon's commits grow by exactly the puts made, and no noreply
 * request failed. */
static void test_nowait_under_pressure(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "watcher", 0);
    struct {
        char role[8];
        const struct h_daemon *d;
    } args[2] = {{"n", d}, {"f", d}};
    shmb_stats_t before, after;
    pid_t pids[2];
    int i;

    stats(c, &before);
    for (i = 0; i < 2; i++)
        assert_true((pids[i] = h_fork(f, pressure_writer, &args[i])) > 0);
    for (i = 0; i < 2; i++)
        assert_int_equal(h_child_wait(f, pids[i], 120000), 0);
    stats(c, &after);
    if (after.commits - before.commits != PRESSURE_NOWAIT_PUTS + PRESSURE_FILL_PUTS ||
        after.noreply_errors != 0)
        h_fail("%d puts made %llu commits; %llu noreply requests failed",
               PRESSURE_NOWAIT_PUTS + PRESSURE_FILL_PUTS,
               (unsigned long long)(after.commits - before.commits),
               (unsigned long long)after.noreply_errors);
    assert_true(after.evictions > before.evictions); /* there was pressure */
    shmb_close(c);
    h_pass(f);
}

/* An arena the daemon took back (the ring needed its space while the
 * writer held it): the next put finds it gone, asks for a new one and
 * lays its chunk out there; nothing is lost but the evicted objects. */
static void test_arena_taken_back(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *filler = h_lib_connect(d, "filler", 0);

    ok(w, h_put_pattern(w, "in-arena", 1000, 1, 0));
    fill_until_gone(w, filler, "in-arena", 32 * 1024);
    ok(w, h_put_pattern(w, "next", 1000, 2, 0));
    read_check(filler, "next", 1000, 2);
    ok(w, h_put_pattern(w, "next2", 1000, 3, 0));
    read_check(filler, "next2", 1000, 3);
    shmb_close(w);
    shmb_close(filler);
    h_pass(f);
}

/* With arenas off (shmb_set_arena(c, 0)) a put is alloc and commit, and
 * the object is the same; objects larger than an arena may be go that way
 * too. */
static void test_put_fallbacks(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    shmb_stats_t before, after;
    size_t large;

    shmb_set_arena(w, 0);
    stats(w, &before);
    ok(w, h_put_pattern(w, "off", 500, 1, 0));
    stats(w, &after);
    assert_int_equal(after.allocs, before.allocs + 1);
    read_check(r, "off", 500, 1);
    shmb_set_arena(w, SHMB_ARENA_DEFAULT);
    large = (size_t)(shmb_info(w)->data_size / 8 + 4096);
    stats(w, &before);
    ok(w, h_put_pattern(w, "large", large, 2, 0));
    ok(w, h_put_pattern(w, "small", 100, 3, 0));
    stats(w, &after);
    assert_int_equal(after.allocs, before.allocs + 1); /* only the large one */
    read_check(r, "large", large, 2);
    read_check(r, "small", 100, 3);
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* An arena does not survive a reconnect, the catalog view is read again:
 * after the daemon is killed and restarts (adopting the segment), puts and
 * reads work. */
static void test_reconnect(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0);
    unsigned char buf[64];
    size_t got;

    ok(w, h_put_pattern(w, "before", 100, 1, 0));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)), 128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    ok(w, shmb_reconnect(w));
    read_check(w, "before", 100, 1);
    ok(w, h_put_pattern(w, "after", 100, 2, 0));
    read_check(w, "after", 100, 2);
    fails(w, shmb_read(w, "never", buf, sizeof(buf), &got), -ENOENT, "'never'");
    assert_all_fast(w, 3);
    shmb_close(w);
    h_pass(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_hit, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_read_miss, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_awaited_rw, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_awaited_ro, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_touch_after_read, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_ro_reads_done, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_put_one_round_trip, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_put_refills, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_full_catalog_lists_newest, h_setup,
                                        h_teardown),
        cmocka_unit_test_setup_teardown(test_full_catalog_delete_keeps_reads, h_setup,
                                        h_teardown),
        cmocka_unit_test_setup_teardown(test_put_nowait, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_nowait_not_lost_to_room, h_setup,
                                        h_teardown),
        cmocka_unit_test_setup_teardown(test_nowait_under_pressure, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_nowait_loss_reported, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_refused_commit_not_counted, h_setup,
                                        h_teardown),
        cmocka_unit_test_setup_teardown(test_nowait_lost_with_connection, h_setup,
                                        h_teardown),
        cmocka_unit_test_setup_teardown(test_sync_reports_lost, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_arena_taken_back, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_put_fallbacks, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_reconnect, h_setup, h_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
