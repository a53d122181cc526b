// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of what a read-write client can do to the segment file
 * through the descriptor hello hands it: truncate it, or punch a hole in it.
 * The daemon must survive, refuse allocations with EIO naming the cause,
 * keep serving the objects the file still holds, and start again on the same
 * segment after a SIGKILL.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* The read-write descriptor of d's segment, as hello hands it to every
 * client (not a path only root could open). The caller closes c. */
static int segment_fd_of(struct h_conn *c, const struct h_daemon *d)
{
    json_decref(h_open_hello(c, d));
    if (c->nfds < 1)
        h_fail("hello did not pass the segment descriptor");
    return c->fds[0];
}

/* After a truncation no new client can connect (hello says why, EIO): the
 * daemon is alive when it still answers a connection made before. */
#define alive_for(c) alive_for_at((c), __FILE__, __LINE__)
static void alive_for_at(shmb_t *c, const char *file, int line)
{
    shmb_stats_t st;

    h_check_ok(c, shmb_stats(c, &st), "shmb_stats", file, line);
}

/* SIGKILL d and start it again on the same segment; the test fails unless it
 * comes up. */
static struct h_daemon *restart(struct h_fix *f, struct h_daemon *d)
{
    struct h_daemon *d2;

    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d2);
        h_fail("the daemon did not start again on the damaged segment");
    }
    return d2;
}

/* A client truncates the segment through its own descriptor, below an object
 * and above another. The daemon does not die of SIGBUS: an alloc gets EIO
 * saying the file was truncated and what to do, the log says it once, the
 * object still in the file reads back intact, deleting the one whose bytes
 * are gone (a write into a lost page) leaves it serving, and a new client's
 * hello is refused with EIO saying the file was truncated. After a SIGKILL the
 * daemon starts again on that segment (today it refused it): it grows the
 * file back, keeps the object the file still held, and takes new objects. */
static void test_truncated_segment(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "2M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 1), *n;
    struct h_conn raw;
    shmb_stats_t st;
    int fd;

    ok(w, h_put_pattern(w, "low", 1000, 1, 0));
    ok(w, h_put_pattern(w, "high", 500000, 2, 0));
    fd = segment_fd_of(&raw, d);
    /* The header page and 64 KiB of data stay: "low" is in them. */
    assert_int_equal(ftruncate(fd, SHMB_HEADER_PAGE + 65536), 0);

    fails(w, h_put_pattern(w, "more", 1000, 3, 0), -EIO, "was truncated to 69632");
    fails(w, h_put_pattern(w, "more", 1000, 3, 0), -EIO, "restart shmbrokerd");
    alive_for(w);
    n = shmb_new();
    assert_non_null(n);
    fails(n, shmb_connect(n, d->socket, "late"), -EIO, "truncated by a client to 69632");
    shmb_close(n);
    assert_true(h_log_contains(d, "was truncated to 69632"));
    get_check(r, "low", 1000, 1);
    ok(w, shmb_delete(w, "high"));
    ok(w, shmb_stats(w, &st));
    assert_int_equal(st.objects, 1);
    get_check(r, "low", 1000, 1);
    alive_for(w);
    /* Down to the header page alone, as the reproduction did. */
    assert_int_equal(ftruncate(fd, SHMB_HEADER_PAGE), 0);
    fails(w, h_put_pattern(w, "more", 1000, 3, 0), -EIO, "truncated");
    ok(w, shmb_delete(w, "low"));
    alive_for(w);
    h_conn_close(&raw);
    shmb_close(r);
    shmb_close(w);

    /* A restart re-reserves the segment: "low" was gone with its page the
     * second time, so a new put and get is what proves it serves. */
    d = restart(f, d);
    assert_true(h_log_contains(d, "grown back"));
    n = h_lib_connect(d, "after", 0);
    ok(n, h_put_pattern(n, "after", 300000, 4, 0));
    get_check(n, "after", 300000, 4);
    shmb_close(n);
    h_pass(f);
}

/* The same truncation, then a restart straight away: the object the file
 * still holds comes back byte-identical, the one beyond the cut is dropped,
 * and the ring takes new objects over the whole data area again. */
static void test_truncated_restart_keeps(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "2M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *n;
    struct h_conn raw;
    shmb_stats_t st;
    int fd;

    ok(w, h_put_pattern(w, "low", 1000, 1, 0));
    ok(w, h_put_pattern(w, "high", 500000, 2, 0));
    fd = segment_fd_of(&raw, d);
    assert_int_equal(ftruncate(fd, SHMB_HEADER_PAGE + 65536), 0);
    h_conn_close(&raw);
    shmb_close(w);

    d = restart(f, d);
    n = h_lib_connect(d, "after", 0);
    get_check(n, "low", 1000, 1);
    assert_int_equal(shmb_contains(n, "high"), 0);
    ok(n, h_put_pattern(n, "big", 1000000, 5, 0));
    get_check(n, "big", 1000000, 5);
    ok(n, shmb_stats(n, &st));
    assert_int_equal(st.objects, 2);
    shmb_close(n);
    h_pass(f);
}

/* A client truncates the segment to 0 bytes, header page and all. A new
 * client's hello gets EIO saying so (not a descriptor it cannot map), the
 * connected ones go on, and after a SIGKILL the restart refuses the empty
 * file with a message that says what it is and what to do; once it is
 * removed, the daemon starts. */
static void test_truncated_to_nothing(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "2M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0), *n = shmb_new();
    char path[PATH_MAX];
    struct h_conn raw;
    int fd;

    ok(w, h_put_pattern(w, "low", 1000, 1, 0));
    fd = segment_fd_of(&raw, d);
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_non_null(n);
    fails(n, shmb_connect(n, d->socket, "late"), -EIO, "truncated by a client to 0 of its");
    shmb_close(n);
    alive_for(w);
    h_conn_close(&raw);
    shmb_close(w);

    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_not_equal(h_exit_code(h_daemon_wait_exit(d2, H_READY_TIMEOUT_MS)), 0);
    assert_true(h_log_contains(d2, "exists with 0 bytes, less than a segment's 4096-byte header"));
    h_segment_path(d2, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    d2 = h_daemon_again(f, d2);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    h_pass(f);
}

/* Fill dir with a file until it is full, so that a page punched out of the
 * segment cannot come back on the next touch. */
static void fill_up(const char *dir)
{
    char path[PATH_MAX + 16], block[65536];
    int fd;

    snprintf(path, sizeof(path), "%s/filler", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    memset(block, 0xAB, sizeof(block));
    while (write(fd, block, sizeof(block)) > 0)
        ;
    close(fd);
}

/* A client punches a hole in the segment (fallocate PUNCH_HOLE, size kept)
 * over the free part of the ring, on a tmpfs that another file then fills:
 * the next chunk header the daemon would write has no page to go to (SIGBUS
 * without the guard). The daemon refuses the alloc with EIO naming the hole,
 * keeps serving the object before the hole, survives a delete whose header
 * write lands in the hole, and starts again once there is room: adoption
 * re-reserves the hole, keeps the object before it and not the deleted one. */
static void test_punched_hole(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX], filler[PATH_MAX + 16];
    struct h_daemon *d;
    struct h_conn raw;
    shmb_t *w, *r, *n;
    int fd, rc = h_mount_tmpfs(f, "3m", dir, sizeof(dir));

    if (rc < 0) {
        char why[PATH_MAX + 128];

        snprintf(why, sizeof(why), "cannot mount a tmpfs on %s (%s); the hole test needs "
                 "root", dir, strerror(-rc));
        h_skip(f, why);
    }
    d = h_daemon_new(f, "2M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0)
        h_fail("the daemon did not start on the small tmpfs");
    w = h_lib_connect(d, "writer", 0);
    r = h_lib_connect(d, "reader", 1);
    ok(w, h_put_pattern(w, "low", 1000, 1, 0));
    ok(w, h_put_pattern(w, "mid", 100000, 2, 0));
    ok(w, h_put_pattern(w, "top", 100000, 5, 0));
    fd = segment_fd_of(&raw, d);
    /* From 64 KiB into the data area to the end: "mid"'s tail, all of "top"
     * and the free part of the ring. */
    assert_int_equal(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               SHMB_HEADER_PAGE + 65536, 2 * 1024 * 1024 - SHMB_HEADER_PAGE -
                                                           65536),
                     0);
    fill_up(dir);

    fails(w, h_put_pattern(w, "more", 1000, 3, 0), -EIO, "a hole was punched");
    h_assert_alive(d);
    assert_true(h_log_contains(d, "a hole was punched"));
    get_check(r, "low", 1000, 1);
    ok(w, shmb_delete(w, "top"));
    ok(w, shmb_delete(w, "mid"));
    fails(w, h_put_pattern(w, "more", 1000, 3, 0), -EIO, "restart shmbrokerd");
    h_assert_alive(d);
    h_conn_close(&raw);
    shmb_close(r);
    shmb_close(w);

    snprintf(filler, sizeof(filler), "%s/filler", dir);
    assert_int_equal(unlink(filler), 0);
    d = restart(f, d);
    n = h_lib_connect(d, "after", 0);
    get_check(n, "low", 1000, 1);
    assert_int_equal(shmb_contains(n, "mid"), 0);
    ok(n, h_put_pattern(n, "after", 900000, 4, 0));
    get_check(n, "after", 900000, 4);
    shmb_close(n);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_truncated_segment),
        TEST(test_truncated_restart_keeps),
        TEST(test_truncated_to_nothing),
        TEST(test_punched_hole),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_hostile_rw", tests, NULL, NULL);
}
