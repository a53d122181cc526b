// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of what an operator meets: the socket unit's stop
 * (--remove-segment) removing what the daemon held even after its settings
 * changed, the wording of the start's errors, a client in another pid
 * namespace, and a start that reserves a large pool answering "starting"
 * rather than refusing connections.
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
#include "shmbroker.h"

/* The record of held segments beside d's socket. */
static void record_path(const struct h_daemon *d, char *out, size_t len)
{
    snprintf(out, len, "%s.segments", d->socket);
}

/* d's segment of pool name, into out. */
static void pool_segment(const struct h_daemon *d, const char *pool, char *out, size_t len)
{
    snprintf(out, len, "%.3000s/%.64s.%.64s", d->shm_dir, d->name, pool);
}

/* shmbrokerd --remove-segment with d's socket, name and directory, and the
 * pools given (NULL-terminated), into r. */
static void remove_segment(struct h_fix *f, const struct h_daemon *d, struct h_run *r, ...)
{
    const char *argv[32];
    const char *a;
    int n = 0;
    va_list ap;

    argv[n++] = h_daemon_bin();
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--name";
    argv[n++] = d->name;
    argv[n++] = "--shm-dir";
    argv[n++] = d->shm_dir;
    va_start(ap, r);
    while ((a = va_arg(ap, const char *)) != NULL && n < 30)
        argv[n++] = a;
    va_end(ap);
    argv[n++] = "--remove-segment";
    argv[n] = NULL;
    assert_int_equal(h_run(f, argv, NULL, 0, r), 0);
}

/* The socket unit's stop after the settings changed under a running daemon
 * (its pools reordered and renamed): --remove-segment reads the new
 * settings, and still removes the segments the daemon held, from the
 * record it kept beside its socket, which goes with them. */
static void test_stop_removes_what_was_held(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M",
        (const char *const[]){"--keep-segment", "--pool", "first:1M", "--pool", "second:1M",
                              NULL});
    char first[PATH_MAX + 64], second[PATH_MAX + 64], record[PATH_MAX];
    struct h_run r;

    pool_segment(d, "first", first, sizeof(first));
    pool_segment(d, "second", second, sizeof(second));
    record_path(d, record, sizeof(record));
    assert_true(h_exists(record));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_true(h_exists(first));
    assert_true(h_exists(second));
    remove_segment(f, d, &r, "--pool", "second:1M", "--pool", "third:1M", NULL);
    h_expect_run(&r, 0, "removed segment", NULL);
    h_run_free(&r);
    if (h_exists(first))
        h_fail("%s, which the daemon held, was left behind by the stop", first);
    assert_false(h_exists(second));
    assert_false(h_exists(record));
    h_pass(f);
}

/* A daemon stopped without --keep-segment removes its segments and its
 * record: nothing is left for a stop to find. */
static void test_clean_stop_leaves_no_record(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    char record[PATH_MAX];

    record_path(d, record, sizeof(record));
    assert_true(h_exists(record));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_false(h_exists(record));
    h_pass(f);
}

/* A record someone scribbled over (bytes that are not UTF-8, a size past
 * 64 bits, a relative directory, a line longer than any path, a file that
 * is not a segment): --remove-segment removes only segments, says what it
 * left alone, and exits 1; the file that was not a segment is still there. */
static void test_scribbled_record(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char record[PATH_MAX], victim[PATH_MAX], text[PATH_MAX * 2 + 9000];
    char *long_line = malloc(9000);
    struct h_run r;
    int n;

    assert_non_null(long_line);
    memset(long_line, 'x', 8999);
    long_line[8999] = '\0';
    record_path(d, record, sizeof(record));
    h_path(f, "not-a-segment", victim, sizeof(victim));
    assert_int_equal(h_write_file(victim, "precious", 8), 0);
    n = snprintf(text, sizeof(text),
                 "shmbroker-segments 1\n"
                 "\xff\xfe\x80 junk\n"
                 "99999999999999999999999 big /tmp\n"
                 "4096 rel relative/dir\n"
                 "4096 %s\n"
                 "8 not-a-segment %s\n",
                 long_line, f->dir);
    free(long_line);
    assert_int_equal(h_write_file(record, text, (size_t)n), 0);
    remove_segment(f, d, &r, NULL);
    h_expect_run(&r, 1, NULL, "not-a-segment is not a shmbroker segment");
    h_expect_run(&r, 1, NULL, "lines that are not segments were skipped");
    h_run_free(&r);
    assert_true(h_exists(victim));
    h_pass(f);
}

/* A declared pool too large for its directory: the start's message names
 * the pool's own size setting in a sentence (not "a smaller the pool's
 * size"), and a directory other than /dev/shm is not told about Docker's
 * --shm-size, which sizes /dev/shm alone. */
static void test_pool_too_large_wording(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    char dir[PATH_MAX], *log;
    int status, rc;

    if (geteuid() != 0)
        h_skip(f, "needs root (mount)");
    if ((rc = h_mount_tmpfs(f, "1m", dir, sizeof(dir))) < 0)
        h_fail("cannot mount a tmpfs: %s", strerror(-rc));
    d = h_daemon_new(f, "1M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--pool", "main:64M", NULL}) > 0);
    status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
    assert_true(status >= 0);
    assert_int_not_equal(h_exit_code(status), 0);
    log = h_log_text(d);
    assert_non_null(log);
    if (!h_contains(log, "or choose a smaller size for pool 'main' (--pool main:SIZE).") ||
        h_contains(log, "smaller the") || h_contains(log, "--shm-size") ||
        !h_contains(log, "more room (mount -o remount,size=N on its tmpfs"))
        h_fail("the start's message is not as it should read:\n%s", log);
    free(log);
    h_pass(f);
}

/* One declared pool is "1 pool", not "1 pools". */
static void test_one_pool_singular(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d =
        h_daemon_start(f, "1M", (const char *const[]){"--pool", "only:1M", NULL});
    char *log;

    h_wait_log_at(d, "ready:", __FILE__, __LINE__);
    log = h_log_text(d);
    assert_non_null(log);
    if (!h_contains(log, "ready: 1 pool, socket") || h_contains(log, "1 pools"))
        h_fail("the ready line does not read '1 pool':\n%s", log);
    free(log);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_stop_removes_what_was_held),
        TEST(test_clean_stop_leaves_no_record),
        TEST(test_scribbled_record),
        TEST(test_pool_too_large_wording),
        TEST(test_one_pool_singular),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
