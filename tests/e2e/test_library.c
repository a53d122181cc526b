/*
 * End-to-end tests of the library's own edges: the names it gives codes
 * (0, codes outside the protocol's table), sizes it refuses before anything
 * is sent, and a descriptor whose header is not a shmbroker segment's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* 0 is "OK"; the protocol's codes keep their names; any other code gets its
 * own errno name (or E and its number), never the EIO of a real I/O error. */
static void test_code_names(void **state)
{
    struct h_fix *f = *state;
    shmb_t *c = shmb_new();
    char path[200];

    assert_non_null(c);
    assert_string_equal(shmb_strerror(0), "OK");
    assert_string_equal(shmb_strerror(-ENOSPC), "ENOSPC");
    assert_string_equal(shmb_strerror(-EIO), "EIO");
    assert_string_equal(shmb_strerror(-EACCES), "EACCES");
    assert_string_equal(shmb_strerror(-ENAMETOOLONG), "ENAMETOOLONG");
    assert_string_equal(shmb_strerror(-ECHILD), "ECHILD");
    assert_string_equal(shmb_strerror(-4000), "E4000");
    assert_string_equal(shmb_errname(c), "OK");
    /* A socket path the library cannot use: its own code, named honestly. */
    memset(path, 'p', sizeof(path) - 1);
    path[sizeof(path) - 1] = '\0';
    assert_int_equal(shmb_connect(c, path, NULL), -ENAMETOOLONG);
    assert_string_equal(shmb_errname(c), "ENAMETOOLONG");
    shmb_close(c);
    h_pass(f);
}

/* A size the protocol cannot carry (2^63 bytes or more) is refused by the
 * library with E2BIG, in the daemon's words, before anything is sent: for
 * alloc, put and put_many (which then sends nothing at all). */
static void test_huge_sizes_refused(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "c", 0);
    const size_t huge[] = {(size_t)1 << 63, SIZE_MAX};
    const char *keys[3] = {"huge-0", "huge-1", "huge-2"};
    const void *data[3] = {"a", "b", "c"};
    size_t sizes[3] = {1, 0, 1};
    int results[3], i;
    void *dst = (void *)1;
    shmb_stats_t before, after;

    ok(c, shmb_stats(c, &before));
    for (i = 0; i < 2; i++) {
        fails(c, shmb_alloc(c, "huge", huge[i], 0, &dst), -E2BIG, "exceeds max object size");
        assert_null(dst);
        fails(c, shmb_put(c, "huge", "x", huge[i], 0), -E2BIG, "exceeds max object size");
        sizes[1] = huge[i];
        fails(c, shmb_put_many(c, 3, keys, data, sizes, 0, results), -E2BIG,
              "sizes[1] of 3");
        assert_int_equal(results[0], -E2BIG);
        assert_int_equal(results[1], -E2BIG);
        assert_int_equal(results[2], -E2BIG);
    }
    ok(c, shmb_stats(c, &after));
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(shmb_contains(c, "huge"), 0);
    assert_int_equal(shmb_contains(c, "huge-0"), 0);
    /* The connection is untouched: the next call works. */
    ok(c, shmb_put(c, "small", "x", 1, 0));
    shmb_close(c);
    h_pass(f);
}

/* With the segment header's magic number zeroed, connecting says that the
 * descriptor is not a shmbroker segment, rather than quoting a magic and a
 * version as if the layout were merely another release's. */
static void test_not_a_segment(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = shmb_new();
    char seg[PATH_MAX];
    uint64_t magic = 0, zero = 0;
    int fd, rc;

    h_segment_path(d, seg, sizeof(seg));
    fd = open(seg, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &magic, sizeof(magic), 0), sizeof(magic));
    assert_int_equal(pwrite(fd, &zero, sizeof(zero), 0), sizeof(zero));
    rc = shmb_connect(c, d->socket, "c");
    /* Put the magic back before judging, so that the daemon stops cleanly. */
    assert_int_equal(pwrite(fd, &magic, sizeof(magic), 0), sizeof(magic));
    close(fd);
    fails(c, rc, -EPROTO, "not a shmbroker segment");
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_code_names),
        TEST(test_huge_sizes_refused),
        TEST(test_not_a_segment),
    };

    return cmocka_run_group_tests_name("test_library", tests, NULL, NULL);
}
