// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of shmb_read after shmb_put_nowait on the same handle,
 * through the library against the real daemon: the read of a put whose
 * commit is still on its way gets the put's bytes (from the catalog once
 * the daemon published it, else from the daemon, which answers after the
 * commit), never a miss the put is about to undo. The requests a handle
 * sends are counted by wrapping send() (the link's --wrap=send).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* Every send() of this process: a put sent without waiting is one, and a
 * read served from the mapping makes none. */
static unsigned long sends;
ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
    sends++;
    return __real_send(fd, buf, len, flags);
}

/* shmb_read of key: size bytes of h_fill's pattern for seed. */
static void read_check_at(shmb_t *c, const char *key, size_t size, uint32_t seed,
                          const char *file, int line)
{
    unsigned char buf[512];
    size_t got = 0, bad;

    memset(buf, 0xee, sizeof(buf));
    h_check_ok(c, shmb_read(c, key, buf, sizeof(buf), &got), "shmb_read", file, line);
    if (got != size)
        h_fail_at(file, line, "shmb_read of %s: %zu bytes, expected %zu", key, got, size);
    if ((bad = h_check(buf, size, seed)) != size)
        h_fail_at(file, line, "shmb_read of %s: byte %zu differs", key, bad);
}
#define read_check(c, key, size, seed) read_check_at((c), (key), (size), (seed), __FILE__, __LINE__)

/* A helper that lets a stopped daemon go on after ms milliseconds: the
 * test's own call is then already waiting, whichever way it waits. */
struct resume {
    pid_t daemon;
    long ms;
};

static int resume_later(void *arg)
{
    const struct resume *r = arg;
    struct timespec ts = {.tv_sec = r->ms / 1000, .tv_nsec = (r->ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
    if (kill(r->daemon, SIGCONT) != 0) {
        perror("kill SIGCONT");
        return 1;
    }
    return 0;
}

/* A read of the key just put without waiting, while the daemon has not
 * handled the commit (it is stopped), is the put's bytes: the catalog does
 * not list it yet, so the read asks the daemon, which answers after the
 * commit. (It was -ENOENT: a miss in the catalog was taken for proof while
 * the handle's own put was on its way.) A key this handle did not put
 * misses as before, the daemon asked; a read-only reader sees the object
 * once the writer's read was answered. */
static void test_read_own_put_in_flight(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 1);
    struct resume res = {.daemon = d->pid, .ms = 300};
    shmb_read_stats_t rs;
    unsigned char data[100], buf[16];
    size_t got = 0;
    pid_t helper;

    h_fill(data, sizeof(data), 7);
    ok(w, h_put_pattern(w, "first", 64, 1, 0)); /* the arena, asked for and held */
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    ok(w, shmb_put_nowait(w, "landing", data, sizeof(data), 0));
    helper = h_fork(f, resume_later, &res);
    assert_true(helper > 0);
    read_check(w, "landing", sizeof(data), 7);
    assert_int_equal(h_child_wait(f, helper, 10000), 0);
    shmb_read_stats(w, &rs);
    assert_int_equal(rs.fallback, 1);
    /* Another key, with a put on its way again: a miss, told by the daemon. */
    ok(w, shmb_put_nowait(w, "landing2", data, sizeof(data), 0));
    fails(w, shmb_read(w, "never-put", buf, sizeof(buf), &got), -ENOENT, "No object");
    shmb_read_stats(w, &rs);
    assert_int_equal(rs.fallback, 2);
    read_check(r, "landing", sizeof(data), 7);
    read_check(r, "landing2", sizeof(data), 7);
    ok(w, shmb_sync(w));
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* With a wait long enough for any daemon (shmb_set_read_wait's bound), a
 * read of the key just put without waiting finds the commit in the catalog
 * once the daemon published it: the put's bytes, served from the mapping,
 * no request sent for it (a put and its read cost one send and no wait).
 * A wait of 0 asks the daemon at once; a wait over the bound is refused. */
static void test_read_waits_for_commit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0);
    struct resume res = {.daemon = d->pid, .ms = 300};
    shmb_read_stats_t rs;
    unsigned char data[200];
    pid_t helper;
    unsigned long at;
    char key[32];
    int i;

    ok(w, h_put_pattern(w, "first", 64, 1, 0)); /* the arena, asked for and held */
    fails(w, shmb_set_read_wait(w, SHMB_READ_WAIT_MAX + 1), -EINVAL, "over the bound");
    ok(w, shmb_set_read_wait(w, SHMB_READ_WAIT_MAX));
    at = sends;
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        h_fill(data, sizeof(data), 100 + (uint32_t)i);
        ok(w, shmb_put_nowait(w, key, data, sizeof(data), 0));
        read_check(w, key, sizeof(data), 100 + (uint32_t)i);
    }
    if (sends - at != 40)
        h_fail("40 puts without waiting and their reads made %lu sends, not 40", sends - at);
    shmb_read_stats(w, &rs);
    if (rs.fallback != 0 || rs.fast != 40)
        h_fail("shmb_read_stats: %llu fast, %llu fallback; expected 40 fast, 0 fallback",
               (unsigned long long)rs.fast, (unsigned long long)rs.fallback);
    /* No wait: the daemon (stopped, so that the commit cannot land first)
     * is asked, and answers after the commit. */
    ok(w, shmb_set_read_wait(w, 0));
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    ok(w, shmb_put_nowait(w, "asked", data, sizeof(data), 0));
    helper = h_fork(f, resume_later, &res);
    assert_true(helper > 0);
    read_check(w, "asked", sizeof(data), 139);
    assert_int_equal(h_child_wait(f, helper, 10000), 0);
    shmb_read_stats(w, &rs);
    assert_int_equal(rs.fallback, 1);
    ok(w, shmb_sync(w));
    shmb_close(w);
    h_pass(f);
}

/* A daemon that dies (SIGKILL) with the commit on its way: the read of
 * that put waits no longer than its bound and says the connection was lost
 * (the put is named as one that may not have been made), never a miss; the
 * writer, reconnected to a new daemon, is told of it by its next put. */
static void test_read_daemon_killed(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL), *d2;
    shmb_t *w = h_lib_connect(d, "writer", 0);
    unsigned char data[100], buf[128];
    size_t got = 0;

    h_fill(data, sizeof(data), 3);
    ok(w, h_put_pattern(w, "first", 64, 1, 0));
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    ok(w, shmb_put_nowait(w, "doomed", data, sizeof(data), 0));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    fails(w, shmb_read(w, "doomed", buf, sizeof(buf), &got), -ECONNRESET, NULL);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS), 0);
    ok(w, shmb_reconnect(w));
    fails(w, shmb_put(w, "next", data, sizeof(data), 0), -ECANCELED,
          "(shmb_put_nowait) of 'doomed' may not have been made");
    ok(w, shmb_put_nowait(w, "doomed", data, sizeof(data), 0));
    read_check(w, "doomed", sizeof(data), 3);
    ok(w, shmb_sync(w));
    shmb_close(w);
    h_pass(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_read_own_put_in_flight, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_read_waits_for_commit, h_setup, h_teardown),
        cmocka_unit_test_setup_teardown(test_read_daemon_killed, h_setup, h_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
