// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of objects of several frames (shmb_put_frames,
 * shmb_get_frames, shmb_frames_size) against the real daemon: counts from 0
 * to 1000, empty frames, the max object size, what a too-small array and a
 * payload not in the layout do to the pin, and keys refused before anything
 * is sent.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* The pins and the awaited reads of key (which must exist). */
static void object_counts(shmb_t *c, const char *key, uint64_t *pins, uint64_t *readers)
{
    shmb_list_t *list = NULL;
    size_t i;

    ok(c, shmb_list(c, key, 0, &list));
    for (i = 0; i < list->count; i++)
        if (strcmp(list->objects[i].key, key) == 0)
            break;
    if (i == list->count)
        h_fail("'%s' is not listed", key);
    *pins = list->objects[i].pins;
    *readers = list->objects[i].readers;
    shmb_list_free(list);
}

static uint64_t pins_of(shmb_t *c, const char *key)
{
    uint64_t pins, readers;

    object_counts(c, key, &pins, &readers);
    return pins;
}

/* Frames of the given lengths, frame i filled with h_fill's pattern for
 * seed + i (an empty frame gets a NULL data). The caller frees each data
 * and the array. */
static shmb_frame_t *frames_new(size_t n, const size_t *lengths, uint32_t seed)
{
    shmb_frame_t *fr = calloc(n > 0 ? n : 1, sizeof(*fr));
    size_t i;

    assert_non_null(fr);
    for (i = 0; i < n; i++) {
        void *data = lengths[i] > 0 ? malloc(lengths[i]) : NULL;

        if (lengths[i] > 0) {
            assert_non_null(data);
            h_fill(data, lengths[i], seed + (uint32_t)i);
        }
        fr[i].data = data;
        fr[i].size = lengths[i];
    }
    return fr;
}

static void frames_free(shmb_frame_t *fr, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        free((void *)fr[i].data);
    free(fr);
}

/* Get key as frames and check there are n of the given lengths, each
 * 64-aligned in memory, laid out in one payload of shmb_frames_size bytes,
 * holding its pattern; then release. */
static void get_frames_check(shmb_t *c, const char *key, size_t n, const size_t *lengths,
                             uint32_t seed)
{
    shmb_frame_t *got = calloc(n + 1, sizeof(*got));
    const void *whole;
    const unsigned char *bytes;
    size_t count = 12345, size, i, at, gap;

    assert_non_null(got);
    ok(c, shmb_get_frames(c, key, got, n + 1, &count));
    assert_int_equal(count, n);
    assert_int_equal(pins_of(c, key), 1);
    ok(c, shmb_get(c, key, &whole, &size));
    assert_int_equal(size, shmb_frames_size(n, lengths));
    bytes = whole;
    gap = 16 + 8 * n; /* the header's padding, then each gap: zeros */
    for (i = 0; i <= n; i++) {
        size_t stop = i < n ? (size_t)((const unsigned char *)got[i].data - bytes) : size;

        for (; gap < stop; gap++)
            if (bytes[gap] != 0)
                h_fail("byte %zu of '%s', padding before frame %zu, is %u", gap, key, i,
                       bytes[gap]);
        if (i < n)
            gap = stop + got[i].size;
    }
    for (i = 0; i < n; i++) {
        if ((uintptr_t)got[i].data % 64 != 0)
            h_fail("frame %zu of '%s' at %p is not 64-aligned", i, key, got[i].data);
        if ((const char *)got[i].data < (const char *)whole ||
            (const char *)got[i].data + got[i].size > (const char *)whole + size)
            h_fail("frame %zu of '%s' lies outside its payload", i, key);
        assert_int_equal(got[i].size, lengths[i]);
        at = h_check(got[i].data, got[i].size, seed + (uint32_t)i);
        if (at != got[i].size)
            h_fail("frame %zu of '%s' differs at byte %zu", i, key, at);
    }
    ok(c, shmb_release(c, key));
    ok(c, shmb_release(c, key));
    assert_int_equal(pins_of(c, key), 0);
    free(got);
}

/* Put n frames of these lengths under key and read them back. */
static void round_trip(shmb_t *c, const char *key, size_t n, const size_t *lengths,
                       uint32_t seed)
{
    shmb_frame_t *fr = frames_new(n, lengths, seed);

    ok(c, shmb_put_frames(c, key, n, fr, 0));
    frames_free(fr, n);
    get_frames_check(c, key, n, lengths, seed);
}

/* Proves that objects of 0, 1, 3 and 1000 frames, empty frames (with NULL
 * data) among them, come back as they were put: count, lengths and bytes,
 * each frame 64-aligned in memory and inside the object's payload. */
static void test_put_get(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    shmb_t *c = h_lib_connect(d, "frames", 0);
    const size_t one[] = {100000}, three[] = {0, 5000, 0}, empties[] = {0, 0, 0, 0};
    size_t many[1000], i;

    round_trip(c, "zero", 0, NULL, 1);
    round_trip(c, "one", 1, one, 2);
    round_trip(c, "three", 3, three, 3);
    round_trip(c, "empties", 4, empties, 4);
    for (i = 0; i < 1000; i++)
        many[i] = (i * 37) % 300; /* 0 to 299 bytes, some 0 */
    round_trip(c, "thousand", 1000, many, 5);
    shmb_close(c);
    h_pass(f);
}

/* Proves that the awaited reads pass through (readers), that a second put
 * of a key is refused with EEXIST leaving the first object intact, and that
 * a read-only connection reads frames but may not put them. */
static void test_readers_exists_read_only(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "reader", 1);
    const size_t lengths[] = {10, 100};
    shmb_frame_t *fr = frames_new(2, lengths, 7), got[2];
    uint64_t pins, readers;
    size_t n;

    ok(c, shmb_put_frames(c, "awaited", 2, fr, 3));
    object_counts(c, "awaited", &pins, &readers);
    assert_int_equal(readers, 3);
    fails(c, shmb_put_frames(c, "awaited", 2, fr, 0), -EEXIST, "awaited");
    get_frames_check(ro, "awaited", 2, lengths, 7); /* two gets */
    object_counts(c, "awaited", &pins, &readers);
    assert_int_equal(readers, 1);
    fails(ro, shmb_put_frames(ro, "ro-put", 2, fr, 0), -EPERM, NULL);
    fails(c, shmb_get_frames(c, "absent", got, 2, &n), -ENOENT, "absent");
    assert_int_equal(n, 0);
    frames_free(fr, 2);
    shmb_close(ro);
    shmb_close(c);
    h_pass(f);
}

/* Proves the max object size boundary: frames whose payload (header and
 * padding included) is exactly the daemon's max object size are stored,
 * one byte more is refused with E2BIG, and nothing is left allocated. */
static void test_max_object_size(void **state)
{
    struct h_fix *f = *state;
    static const char *const extra[] = {"--max-object-size", "64K", NULL};
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    shmb_t *c = h_lib_connect(d, "max", 0);
    size_t max = (size_t)shmb_info(c)->max_object_size, lengths[2];
    shmb_frame_t *fr;

    assert_int_equal(max, 65536);
    /* Header 64, frame 0 at 64 (1000 bytes), frame 1 at 1088 to the end. */
    lengths[0] = 1000;
    lengths[1] = max - 1088;
    assert_int_equal(shmb_frames_size(2, lengths), max);
    fr = frames_new(2, lengths, 11);
    ok(c, shmb_put_frames(c, "fits", 2, fr, 0));
    frames_free(fr, 2);
    get_frames_check(c, "fits", 2, lengths, 11);
    lengths[1]++;
    assert_int_equal(shmb_frames_size(2, lengths), max + 1);
    fr = frames_new(2, lengths, 12);
    fails(c, shmb_put_frames(c, "too-big", 2, fr, 0), -E2BIG, "exceeds max object size");
    frames_free(fr, 2);
    assert_int_equal(shmb_contains(c, "too-big"), 0);
    ok(c, shmb_alloc(c, "too-big", 1, 0, &(void *){NULL})); /* the key is free */
    ok(c, shmb_abort(c, "too-big"));
    shmb_close(c);
    h_pass(f);
}

/* Proves that an array too small for the object's frames fails with
 * ENOBUFS, the count in *n, the pin released; that max 0 with no array
 * asks the count; and that the call then succeeds with room enough. */
static void test_enobufs(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "enobufs", 0);
    const size_t lengths[] = {1, 2, 3, 4, 5};
    shmb_frame_t *fr = frames_new(5, lengths, 21), got[5];
    size_t n = 0;

    ok(c, shmb_put_frames(c, "five", 5, fr, 0));
    memset(got, 0, sizeof(got));
    fails(c, shmb_get_frames(c, "five", got, 4, &n), -ENOBUFS,
          "holds 5 frames, more than the 4 asked for");
    assert_string_equal(shmb_errname(c), "ENOBUFS");
    assert_int_equal(n, 5);
    assert_null(got[0].data);
    assert_int_equal(pins_of(c, "five"), 0);
    n = 0;
    fails(c, shmb_get_frames(c, "five", NULL, 0, &n), -ENOBUFS, "at least 5");
    assert_int_equal(n, 5);
    assert_int_equal(pins_of(c, "five"), 0);
    fails(c, shmb_get_frames(c, "five", NULL, 5, &n), -EINVAL, "frames is NULL");
    get_frames_check(c, "five", 5, lengths, 21);
    /* An object of no frames needs no array. */
    ok(c, shmb_put_frames(c, "none", 0, NULL, 0));
    n = 9;
    ok(c, shmb_get_frames(c, "none", NULL, 0, &n));
    assert_int_equal(n, 0);
    ok(c, shmb_release(c, "none"));
    frames_free(fr, 5);
    shmb_close(c);
    h_pass(f);
}

/* Put size bytes under key with plain shmb_put and check that
 * shmb_get_frames refuses it with EPROTO and a message containing want,
 * *n 0, the pin released. */
static void not_frames(shmb_t *c, const char *key, const void *data, size_t size,
                       const char *want)
{
    shmb_frame_t got[4];
    size_t n = 7;

    ok(c, shmb_put(c, key, data, size, 0));
    fails(c, shmb_get_frames(c, key, got, 4, &n), -EPROTO, want);
    assert_non_null(strstr(shmb_errmsg(c), "Not a frames payload"));
    assert_int_equal(n, 0);
    assert_int_equal(pins_of(c, key), 0);
}

static void le64(unsigned char *p, uint64_t v)
{
    int i;

    for (i = 0; i < 8; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Proves that objects put with plain shmb_put are refused with EPROTO and
 * the pin released, hostile headers included (a count whose header is
 * larger than the object, 65535 frames of 2^63 bytes, a frame running past
 * the end, one byte too many), and that a payload written by hand to
 * PROTOCOL.md's bytes is read as frames. */
static void test_not_frames(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "eproto", 0);
    unsigned char *p = calloc(1, 524352);
    const size_t lengths[] = {10, 100};
    shmb_frame_t got[2];
    size_t n, i;

    assert_non_null(p);
    not_frames(c, "text", "hello, shared memory", 20, "not the magic");
    not_frames(c, "short", "MHSBFRM1", 8, "8 bytes, fewer than the 16");
    memcpy(p, "MHSBFRM1", 8);
    p[8] = 0xff;
    p[9] = 0xff; /* 65535 frames in 64 bytes */
    not_frames(c, "big-count", p, 64, "65535 frames need a header of 524352 bytes");
    for (i = 0; i < 65535; i++)
        le64(p + 16 + 8 * i, (uint64_t)1 << 63);
    not_frames(c, "huge-lengths", p, 524352, "runs past the payload's end");
    memset(p, 0, 64);
    memcpy(p, "MHSBFRM1", 8);
    p[8] = 2;
    le64(p + 16, 10);
    le64(p + 24, 101);
    not_frames(c, "past-end", p, 228, "frame 1 of 2 (101 bytes from offset 128) runs past");
    le64(p + 24, 100);
    not_frames(c, "one-more", p, 229, "make 228 bytes, and the payload has 229");
    /* The documented bytes, written by hand, are frames. */
    memset(p + 64, 'a', 10);
    memset(p + 128, 'b', 100);
    ok(c, shmb_put(c, "by-hand", p, 228, 0));
    ok(c, shmb_get_frames(c, "by-hand", got, 2, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0].size, lengths[0]);
    assert_int_equal(got[1].size, lengths[1]);
    assert_memory_equal(got[0].data, p + 64, 10);
    assert_memory_equal(got[1].data, p + 128, 100);
    ok(c, shmb_release(c, "by-hand"));
    free(p);
    shmb_close(c);
    h_pass(f);
}

/* Proves that bad keys, counts, pointers and sizes are refused before
 * anything is sent (no alloc reaches the daemon), with the library's
 * codes and words. */
static void test_refused_before_sending(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "bad", 0);
    char long_key[SHMB_KEY_MAX_LEN + 2];
    const char *bad_keys[] = {"", long_key, "bad\xff"};
    shmb_frame_t fr[2] = {{"x", 1}, {NULL, 5}}, got[2];
    shmb_frame_t huge[2] = {{"x", (size_t)1 << 62}, {"y", (size_t)1 << 62}};
    shmb_stats_t before, after;
    size_t n, i;

    memset(long_key, 'k', sizeof(long_key) - 1);
    long_key[sizeof(long_key) - 1] = '\0';
    ok(c, shmb_stats(c, &before));
    for (i = 0; i < 3; i++) {
        fails(c, shmb_put_frames(c, bad_keys[i], 1, fr, 0), -EINVAL, "ey");
        n = 3;
        fails(c, shmb_get_frames(c, bad_keys[i], got, 2, &n), -EINVAL, "ey");
        assert_int_equal(n, 0);
    }
    fails(c, shmb_put_frames(c, "null-data", 2, fr, 0), -EINVAL, "frames[1].data is NULL");
    fails(c, shmb_put_frames(c, "null-array", 2, NULL, 0), -EINVAL, "frames is NULL");
    fails(c, shmb_put_frames(c, "too-many", 65536, fr, 0), -EINVAL,
          "65536 frames: an object holds at most 65535");
    fails(c, shmb_put_frames(c, "huge", 2, huge, 0), -E2BIG, "exceeds max object size");
    assert_int_equal(shmb_frames_size(65536, NULL), 0);
    assert_int_equal(shmb_frames_size(2, (const size_t[]){(size_t)1 << 62, (size_t)1 << 62}),
                     0);
    ok(c, shmb_stats(c, &after));
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(after.gets, before.gets);
    ok(c, shmb_put_frames(c, "good", 1, fr, 0)); /* the handle is untouched */
    shmb_close(c);
    h_pass(f);
}

/* The frames tool of this build. */
static const char *tool_bin(void)
{
    static char buf[4096];
    const char *build = getenv("SHMB_BUILD_DIR");

    snprintf(buf, sizeof(buf), "%s/tests/shmb-frames-tool", build != NULL ? build : "build");
    return buf;
}

/* Proves that shmb-frames-tool puts files as frames the library reads back,
 * prints "LENGTH SHA256" per frame of what the library put (checked against
 * SHA-256's published digests of "abc" and of nothing), and fails with the
 * library's error and exit status 1 on a payload that is not frames. */
static void test_tool(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "tool", 0);
    char abc[300], empty[300];
    shmb_frame_t put[2] = {{"abc", 3}, {NULL, 0}}, got[2];
    struct h_run r;
    size_t n;

    h_path(f, "abc", abc, sizeof(abc));
    h_path(f, "empty", empty, sizeof(empty));
    assert_int_equal(h_write_file(abc, "abc", 3), 0);
    assert_int_equal(h_write_file(empty, "", 0), 0);
    assert_int_equal(h_run(f, (const char *const[]){tool_bin(), d->socket, "put", "from-tool",
                                                     empty, abc, NULL},
                           NULL, 0, &r),
                     0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    ok(c, shmb_get_frames(c, "from-tool", got, 2, &n));
    assert_int_equal(n, 2);
    assert_int_equal(got[0].size, 0);
    assert_int_equal(got[1].size, 3);
    assert_memory_equal(got[1].data, "abc", 3);
    ok(c, shmb_release(c, "from-tool"));
    ok(c, shmb_put_frames(c, "from-lib", 2, put, 0));
    assert_int_equal(
        h_run(f, (const char *const[]){tool_bin(), d->socket, "get", "from-lib", NULL}, NULL,
              0, &r),
        0);
    h_expect_run(&r, 0, NULL, NULL);
    assert_string_equal(
        r.out, "3 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
               "0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n");
    h_run_free(&r);
    ok(c, shmb_put(c, "plain", "abc", 3, 0));
    assert_int_equal(
        h_run(f, (const char *const[]){tool_bin(), d->socket, "get", "plain", NULL}, NULL, 0,
              &r),
        0);
    h_expect_run(&r, 1, NULL, "EPROTO: Not a frames payload");
    h_run_free(&r);
    assert_int_equal(pins_of(c, "plain"), 0);
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_put_get),
        TEST(test_readers_exists_read_only),
        TEST(test_max_object_size),
        TEST(test_enobufs),
        TEST(test_not_frames),
        TEST(test_refused_before_sending),
        TEST(test_tool),
    };

    return cmocka_run_group_tests_name("test_frames", tests, NULL, NULL);
}
