// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of a reader whose daemon is gone: shmb_read answers from
 * the mapping without asking, so a handle whose daemon stopped serving its
 * segment (a clean stop, a kill and a start with --fresh, a memfd pool
 * started again, the socket unit's stop) must notice that by itself and
 * fail, instead of answering old bytes and misses for keys put since. The
 * poll()s a reader makes to look at its connection are counted by wrapping
 * poll() (the link's --wrap=poll): they stay rare.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* Every poll() of this process. */
static unsigned long polls;
int __real_poll(struct pollfd *fds, nfds_t nfds, int timeout);
int __wrap_poll(struct pollfd *fds, nfds_t nfds, int timeout);
int __wrap_poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
    polls++;
    return __real_poll(fds, nfds, timeout);
}

/* Where the header keeps the word a daemon sets when it gives a segment
 * up (proto/layout.h, struct shmb_segment_header.retired). */
#define RETIRED_AT 140

/* A reader must give up well within this; far longer than the bound the
 * README states, so that a loaded machine does not fail the test. */
#define GIVE_UP_MS 5000

/* A handle of d's pool (NULL: the default), read-only when asked. */
static shmb_t *connect_pool(const struct h_daemon *d, const char *pool, const char *name,
                            int read_only)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    shmb_set_read_only(c, read_only);
    if (pool != NULL)
        shmb_set_pool(c, pool);
    if (shmb_connect(c, d->socket, name) != 0)
        h_fail("shmb_connect to %s: %s: %s", d->socket, shmb_errname(c), shmb_errmsg(c));
    return c;
}

/* shmb_read of key gives size bytes of seed's pattern. */
static void read_check_at(shmb_t *c, const char *key, size_t size, uint32_t seed,
                          const char *file, int line)
{
    unsigned char buf[4096];
    size_t got = 0;

    h_check_ok(c, shmb_read(c, key, buf, sizeof(buf), &got), "shmb_read", file, line);
    if (got != size || h_check(buf, got, seed) != got)
        h_fail_at(file, line, "shmb_read of %s: %zu bytes, not %zu of seed %u", key, got,
                  size, seed);
}
#define read_check(c, key, size, seed) read_check_at((c), (key), (size), (seed), __FILE__, __LINE__)

/* shmb_read of key fails as a handle that lost its daemon does: -ECONNRESET
 * the first time (with a message that says to reconnect), and whatever
 * follows fails too (-ENOTCONN, "not connected"), never a success from the
 * old mapping nor a miss. */
static void read_lost_at(shmb_t *c, const char *key, const char *file, int line)
{
    unsigned char buf[4096];
    size_t got = 0;
    int i;

    h_check_fails(c, shmb_read(c, key, buf, sizeof(buf), &got), -ECONNRESET, "reconnect",
                  "shmb_read", file, line);
    for (i = 0; i < 3; i++)
        h_check_fails(c, shmb_read(c, key, buf, sizeof(buf), &got), -ENOTCONN, NULL,
                      "shmb_read again", file, line);
}
#define read_lost(c, key) read_lost_at((c), (key), __FILE__, __LINE__)

/* Read key until the read fails, within GIVE_UP_MS (until the reader's
 * next look at its connection, reads may still answer from the mapping: the
 * old bytes, or a miss), then check the failure as read_lost does. */
static void read_until_lost_at(shmb_t *c, const char *key, const char *file, int line)
{
    unsigned char buf[4096];
    uint64_t end = h_now_ms() + GIVE_UP_MS;
    size_t got = 0;
    int rc;

    while ((rc = shmb_read(c, key, buf, sizeof(buf), &got)) == 0 || rc == -ENOENT) {
        if (h_now_ms() > end)
            h_fail_at(file, line,
                      "shmb_read of %s still answers from the mapping %d ms after its "
                      "daemon went",
                      key, GIVE_UP_MS);
        h_sleep_ms(1);
    }
    if (rc != -ECONNRESET || strstr(shmb_errmsg(c), "reconnect") == NULL)
        h_fail_at(file, line, "shmb_read of %s returned %d (%s: %s), not ECONNRESET", key, rc,
                  shmb_errname(c), shmb_errmsg(c));
    for (int i = 0; i < 3; i++)
        h_check_fails(c, shmb_read(c, key, buf, sizeof(buf), &got), -ENOTCONN, NULL,
                      "shmb_read again", file, line);
}
#define read_until_lost(c, key) read_until_lost_at((c), (key), __FILE__, __LINE__)

/* After a reconnect the handle reads what the new daemon serves. */
static void reconnect_and_read(shmb_t *c)
{
    ok(c, shmb_reconnect(c));
    read_check(c, "k", 100, 2);
    read_check(c, "new", 100, 3);
}

/* A clean stop (SIGTERM: the segment is removed) and a new daemon on the
 * same socket: the very next read of a read-only and of a read-write
 * handle fails, as the old daemon marked its segment retired before it let
 * go of it; neither answers the old value of "k" nor a miss for "new". */
static void test_clean_stop(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1),
           *rw = h_lib_connect(d, "rw", 0), *w2;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    read_check(rw, "k", 100, 1);
    shmb_close(w);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    w2 = h_lib_connect(d2, "writer2", 0);
    ok(w2, h_put_pattern(w2, "k", 100, 2, 0));
    ok(w2, h_put_pattern(w2, "new", 100, 3, 0));
    read_lost(ro, "k");
    read_lost(rw, "new");
    reconnect_and_read(ro);
    reconnect_and_read(rw);
    shmb_close(w2);
    shmb_close(ro);
    shmb_close(rw);
    h_pass(f);
}

/* SIGKILL, then a daemon with --fresh on the same socket, which removes the
 * segment the dead one left: it marks that file retired first, so the old
 * handles' next read fails. */
static void test_kill_fresh(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1), *w2;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, (const char *const[]){"--fresh", NULL}) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    w2 = h_lib_connect(d2, "writer2", 0);
    ok(w2, h_put_pattern(w2, "k", 100, 2, 0));
    ok(w2, h_put_pattern(w2, "new", 100, 3, 0));
    read_lost(ro, "new");
    read_lost(w, "k");
    reconnect_and_read(ro);
    shmb_close(w2);
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* A daemon killed with nothing started after it: no word is set in the
 * segment, and the reader finds out from its connection, which the kernel
 * closed at the kill; its reads fail within the bound, not never. */
static void test_kill_alone(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1);

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    read_until_lost(ro, "k");
    read_until_lost(w, "k");
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* A memfd pool: killed, and a new daemon started by hand makes a new memfd
 * (nothing removes the old one, which the handles keep mapped). The handles
 * of the old one fail their reads within the bound, as the daemon is gone;
 * after a reconnect they read the new pool. A clean stop of the new daemon
 * fails the next read at once (the memfd is marked retired). */
static void test_memfd_restart(void **state)
{
    struct h_fix *f = *state;
    const char *const extra[] = {"--pool", "mem:4M,backing=memfd", NULL};
    struct h_daemon *d = h_daemon_start(f, "1M", extra), *d2;
    shmb_t *w = connect_pool(d, "mem", "writer", 0), *ro = connect_pool(d, "mem", "ro", 1),
           *w2;

    assert_string_equal(shmb_info(ro)->backing, "memfd");
    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, extra) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    w2 = connect_pool(d2, "mem", "writer2", 0);
    ok(w2, h_put_pattern(w2, "k", 100, 2, 0));
    ok(w2, h_put_pattern(w2, "new", 100, 3, 0));
    read_until_lost(ro, "new");
    read_until_lost(w, "k");
    reconnect_and_read(ro);
    shmb_close(w2);
    assert_int_equal(h_exit_code(h_daemon_signal(d2, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    read_lost(ro, "k");
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* What `systemctl stop shmbrokerd.socket` does: the service (run with
 * --keep-segment) gets SIGTERM and keeps its segment, then the socket
 * unit's ExecStopPost runs shmbrokerd --remove-segment; a start makes a new
 * segment. The kept file is marked retired by the stopping daemon, so the
 * old handles' next read fails even before the file is removed. */
static void test_socket_unit_stop(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", (const char *const[]){"--keep-segment", NULL}),
                    *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1),
           *rw = h_lib_connect(d, "rw", 0), *w2;
    char seg[PATH_MAX];
    struct h_run r;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    read_check(rw, "k", 100, 1);
    shmb_close(w);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    h_segment_path(d, seg, sizeof(seg));
    assert_true(h_exists(seg));
    read_lost(rw, "k"); /* kept, but given up */
    assert_int_equal(h_run(f,
                           (const char *const[]){h_daemon_bin(), "--socket", d->socket,
                                                 "--name", d->name, "--size", d->size,
                                                 "--shm-dir", d->shm_dir, "--remove-segment",
                                                 NULL},
                           NULL, 0, &r),
                     0);
    h_expect_run(&r, 0, "removed segment", NULL);
    h_run_free(&r);
    assert_false(h_exists(seg));
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, (const char *const[]){"--keep-segment", NULL}) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    w2 = h_lib_connect(d2, "writer2", 0);
    ok(w2, h_put_pattern(w2, "k", 100, 2, 0));
    ok(w2, h_put_pattern(w2, "new", 100, 3, 0));
    read_lost(ro, "new");
    reconnect_and_read(ro);
    reconnect_and_read(rw);
    shmb_close(w2);
    shmb_close(ro);
    shmb_close(rw);
    h_pass(f);
}

/* A kept segment adopted by the next daemon is served again: the word the
 * stopping daemon set is cleared, and a reconnected handle (same file, same
 * mapping) reads from the mapping again, with no round trip. */
static void test_adopted_served_again(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", (const char *const[]){"--keep-segment", NULL}),
                    *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1);
    shmb_read_stats_t before, after;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    read_lost(ro, "k");
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    ok(ro, shmb_reconnect(ro));
    shmb_read_stats(ro, &before);
    read_check(ro, "k", 100, 1);
    shmb_read_stats(ro, &after);
    assert_int_equal(after.fast, before.fast + 1);
    assert_int_equal(after.fallback, before.fallback);
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* A read-write client that writes the retired word of a segment its daemon
 * still serves only sends the readers to the daemon: their reads are
 * answered (by a round trip each), the right bytes, and misses still are
 * misses. */
static void test_scribbled_word(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1);
    shmb_read_stats_t before, after;
    const uint32_t junk = 0xdeadbeef;
    unsigned char buf[64];
    char seg[PATH_MAX];
    size_t got;
    int fd;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    h_segment_path(d, seg, sizeof(seg));
    fd = open(seg, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &junk, sizeof(junk), RETIRED_AT), (ssize_t)sizeof(junk));
    close(fd);
    shmb_read_stats(ro, &before);
    read_check(ro, "k", 100, 1);
    fails(ro, shmb_read(ro, "absent", buf, sizeof(buf), &got), -ENOENT, "'absent'");
    shmb_read_stats(ro, &after);
    assert_int_equal(after.fallback, before.fallback + 2);
    h_assert_alive(d);
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

/* Reads stay free of system calls: a reader that reads in a loop looks at
 * its connection with poll() at most once per 10 ms (plus one), however
 * many reads it makes. */
static void test_polls_are_rare(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *ro = h_lib_connect(d, "ro", 1);
    unsigned long at, reads = 0;
    uint64_t start, ms;
    unsigned char buf[128];
    size_t got;

    ok(w, h_put_pattern(w, "k", 100, 1, 0));
    read_check(ro, "k", 100, 1);
    at = polls;
    start = h_now_ms();
    while (h_now_ms() - start < 200 || reads < 100000) {
        ok(ro, shmb_read(ro, "k", buf, sizeof(buf), &got));
        reads++;
    }
    ms = h_now_ms() - start;
    if (polls - at > ms / 10 + 2)
        h_fail("%lu poll()s for %lu reads in %llu ms: more than one per 10 ms", polls - at,
               reads, (unsigned long long)ms);
    shmb_close(w);
    shmb_close(ro);
    h_pass(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_clean_stop, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_kill_fresh, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_kill_alone, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_memfd_restart, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_socket_unit_stop, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_adopted_served_again, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_scribbled_word, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_polls_are_rare, h_setup, h_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
