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
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../proto/starting.h"
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
    h_expect_run(&r, 1, NULL, "lines that are not segments skipped");
    h_run_free(&r);
    assert_true(h_exists(victim));
    h_pass(f);
}

/* A record naming a file of this user's, mode 0600, of exactly the size the
 * line gives, outside the shm directory and without the segment's header (a
 * private key, say): --remove-segment leaves it alone. Only a pool the
 * settings name may be a segment whose header a client damaged; a line of
 * the record must carry the segment's header to be removed. */
static void test_record_names_a_private_file(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char record[PATH_MAX], victim[PATH_MAX], text[PATH_MAX + 64];
    struct h_run r;
    int n;

    record_path(d, record, sizeof(record));
    h_path(f, "id_key", victim, sizeof(victim));
    assert_int_equal(h_write_file(victim, "precious", 8), 0);
    assert_int_equal(chmod(victim, 0600), 0);
    n = snprintf(text, sizeof(text), "shmbroker-segments 1\n8 id_key %s\n", f->dir);
    assert_int_equal(h_write_file(record, text, (size_t)n), 0);
    assert_int_equal(chmod(record, 0644), 0);
    remove_segment(f, d, &r, NULL);
    h_expect_run(&r, 1, NULL, "id_key is not a shmbroker segment");
    h_run_free(&r);
    if (!h_exists(victim))
        h_fail("--remove-segment removed %s, a file that is not a segment, named by the "
               "record",
               victim);
    h_pass(f);
}

/* A record others may write (mode 0666, in a directory a careless user
 * chose with --socket, such as /tmp): anyone could have planted its lines,
 * so --remove-segment does not read it, says so, and still removes the
 * segments its settings name. */
static void test_record_others_may_write(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char record[PATH_MAX], text[PATH_MAX + 64];
    struct h_run r;
    int n;

    record_path(d, record, sizeof(record));
    n = snprintf(text, sizeof(text), "shmbroker-segments 1\n4096 planted %s\n", f->dir);
    assert_int_equal(h_write_file(record, text, (size_t)n), 0);
    assert_int_equal(chmod(record, 0666), 0);
    remove_segment(f, d, &r, NULL);
    h_expect_run(&r, 1, NULL, "others may write");
    h_run_free(&r);
    h_pass(f);
}

/* A size no file can have (past 2^63 bytes, or so close to 2^64 that
 * rounding it up to a page wraps to nothing): --check calls it too large,
 * not "too small", and says what the largest is; nothing is created. Pools
 * whose sizes add up past 2^63 are refused too, not summed into a wrapped
 * figure. */
static void test_check_size_past_a_file(void **state)
{
    static const char *const sizes[] = {"18446744073709551614", "9223372036854775808"};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    struct h_run r;
    size_t i;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const char *argv[] = {h_daemon_bin(), "--socket",  d->socket,  "--name",
                              d->name,        "--shm-dir", d->shm_dir, "--size",
                              sizes[i],       "--check",   NULL};

        assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
        h_expect_run(&r, 2, NULL, "is too large");
        if (h_contains(r.err, "too small") || h_contains(r.out, "too small"))
            h_fail("--size %s was called too small:\n%s", sizes[i], r.err);
        h_run_free(&r);
    }
    {
        /* Three pools that each fit in a file, but whose sum wraps past
         * 2^64: not "fits" for the last one, nor a tiny --shm-size. */
        const char *argv[] = {h_daemon_bin(),
                              "--socket",
                              d->socket,
                              "--name",
                              d->name,
                              "--shm-dir",
                              d->shm_dir,
                              "--pool",
                              "a:6148914691236519936",
                              "--pool",
                              "b:6148914691236519936",
                              "--pool",
                              "c:6148914691236519936",
                              "--check",
                              NULL};

        assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
        h_expect_run(&r, 2, NULL, "add up to more than");
        h_run_free(&r);
    }
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

/* The daemon in a pid namespace of its own (unshare --pid --fork), so that
 * this test's processes are in one it cannot see into, as a client in
 * another pod is: the kernel gives the daemon pid 0 for them. Skips when
 * unshare cannot make one (not root, or no unshare). */
static struct h_daemon *daemon_in_own_pid_ns(struct h_fix *f)
{
    static const char *const where[] = {"/usr/bin/unshare", "/bin/unshare"};
    const char *wrapper[] = {NULL, "--pid", "--fork", "--kill-child=SIGTERM", NULL};
    struct h_run r;
    struct h_daemon *d;
    size_t i;

    for (i = 0; i < sizeof(where) / sizeof(where[0]) && wrapper[0] == NULL; i++)
        if (access(where[i], X_OK) == 0)
            wrapper[0] = where[i];
    if (wrapper[0] == NULL)
        h_skip(f, "no unshare (util-linux)");
    if (h_run(f, (const char *const[]){wrapper[0], "--pid", "--fork", "/bin/true", NULL}, NULL,
              0, &r) < 0 ||
        r.status != 0)
        h_skip(f, "unshare --pid --fork does not run here (needs root and util-linux)");
    h_run_free(&r);
    d = h_daemon_new(f, "4M");
    assert_true(h_daemon_spawn_with(f, d, NULL, (const char *const *)wrapper, 0) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    return d;
}

/* A client in a pid namespace the daemon cannot see into: `clients` shows
 * no pid 0 but "ns:" and the pid the client has in its own namespace (what
 * its hello said) with a line saying what that means; a queue's role it
 * holds is refused to another naming it "a process in another pid
 * namespace" with its pid there and its uid; the daemon's log says so too;
 * the queues report says "another pid namespace", not "pid 0". */
static void test_other_pid_namespace(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = daemon_in_own_pid_ns(f);
    shmb_t *w = h_lib_connect(d, "outsider", 0), *w2 = h_lib_connect(d, "second", 0);
    shmb_queue_t *q = NULL, *q2 = NULL;
    char want[160], *log;
    struct h_run r;

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "clients", NULL), 0);
    snprintf(want, sizeof(want), "ns:%d", (int)getpid());
    h_expect_run(&r, 0, want, NULL);
    h_expect_run(&r, 0, "outsider", NULL);
    h_expect_run(&r, 0, "ns:N: a client in another pid namespace", NULL);
    if (strncmp(r.out, "       0 ", 9) == 0 || h_contains(r.out, "\n       0 "))
        h_fail("a pid 0 is shown:\n%s", r.out);
    h_run_free(&r);

    if (shmb_queue_create(w, "oq", 2, 4, 256, 0) != 0 ||
        shmb_queue_open(w, "oq", SHMB_QUEUE_WRITER, &q) != 0)
        h_fail("queue: %s", shmb_errmsg(w));
    assert_int_equal(shmb_queue_open(w2, "oq", SHMB_QUEUE_WRITER, &q2), -EBUSY);
    snprintf(want, sizeof(want), "a process in another pid namespace (pid %d there, uid %d)",
             (int)getpid(), (int)getuid());
    if (!h_contains(shmb_errmsg(w2), want))
        h_fail("the refusal does not name the writer so: %s", shmb_errmsg(w2));
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "another pid namespace 'outsider'", NULL);
    if (h_contains(r.out, "pid 0"))
        h_fail("status shows pid 0:\n%s", r.out);
    h_run_free(&r);
    shmb_queue_close(q);
    shmb_close(w);
    shmb_close(w2);
    log = h_log_text(d);
    assert_non_null(log);
    snprintf(want, sizeof(want),
             "client in another pid namespace (pid %d there) uid %d (outsider, read-write) "
             "connected",
             (int)getpid(), (int)getuid());
    if (!h_contains(log, want) || h_contains(log, "client pid 0"))
        h_fail("the log does not say so (%s):\n%s", want, log);
    free(log);
    /* unshare ignores SIGTERM while it waits; its end sends the daemon
     * SIGTERM (--kill-child), and the daemon stops as it does. */
    h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS);
    h_wait_log_at(d, "stopped; socket", __FILE__, __LINE__);
    h_pass(f);
}

/* A hello's "pid" that no process can have is refused, and the daemon
 * serves on. */
static void test_hello_pid_bounds(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    static const char *const bad[] = {"0", "-1", "4194305", "9223372036854775807", "\"7\"",
                                      "1.5"};
    char req[160];
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct h_conn c;

        assert_int_equal(h_conn_open(&c, d->socket), 0);
        snprintf(req, sizeof(req), "{\"op\":\"hello\",\"version\":1,\"pid\":%s}", bad[i]);
        h_expect_at(&c, req, "EINVAL", NULL, __FILE__, __LINE__);
        h_conn_close(&c);
    }
    h_assert_alive_at(d, __FILE__, __LINE__);
    h_pass(f);
}

/* $SHMB_BUILD_DIR/tests/slow_reserve.so (or build/...), into out; skips
 * when it was not built. */
static void slow_reserve_lib(struct h_fix *f, char *out, size_t len)
{
    const char *build = getenv("SHMB_BUILD_DIR");
    char rel[PATH_MAX];

    snprintf(rel, sizeof(rel), "%s/tests/slow_reserve.so", build != NULL ? build : "build");
    if (realpath(rel, out) == NULL || strlen(out) >= len)
        h_skip(f, "tests/slow_reserve.so is not built (make it beside test_operator)");
}

/* shmbrokerctl status of d, into r. */
static void ctl_status(struct h_fix *f, const struct h_daemon *d, struct h_run *r)
{
    assert_int_equal(h_run(f,
                           (const char *const[]){h_ctl_bin(), "--socket", d->socket, "status",
                                                 NULL},
                           NULL, 0, r),
                     0);
}

/* A start that reserves a large pool, held after its first 256 MiB (the
 * preloaded posix_fallocate waits on a file): shmbrokerctl status says
 * "starting: reserving pool 'big': 256 MiB of 512 MiB" and exits 69 rather
 * than "Connection refused. Is shmbrokerd running?"; the library's connect
 * fails with EAGAIN and the same progress; the log says it once the
 * reservation is a gigabyte or more (here not). Let go, the daemon serves,
 * status answers, and no progress file is left. */
static void test_starting_progress(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char lib[PATH_MAX], gate[PATH_MAX], progress[PATH_MAX], asan[512];
    const char *old_asan = getenv("ASAN_OPTIONS");
    uint64_t deadline;
    shmb_t *c;
    struct h_run r;
    bool seen = false;

    slow_reserve_lib(f, lib, sizeof(lib));
    h_path(f, "gate", gate, sizeof(gate));
    assert_int_equal(h_write_file(gate, "", 0), 0);
    snprintf(progress, sizeof(progress), "%s.starting", d->socket);
    /* The daemon alone runs with the preload (a sanitizer's runtime is let
     * come after it). */
    setenv("LD_PRELOAD", lib, 1);
    setenv("SHMB_TEST_RESERVE_GATE", gate, 1);
    snprintf(asan, sizeof(asan), "%s%sverify_asan_link_order=0", old_asan ? old_asan : "",
             old_asan ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--pool", "big:512M", NULL}) > 0);
    unsetenv("LD_PRELOAD");
    unsetenv("SHMB_TEST_RESERVE_GATE");
    if (old_asan != NULL)
        setenv("ASAN_OPTIONS", old_asan, 1);
    else
        unsetenv("ASAN_OPTIONS");

    /* Bounded generously: the first chunk on a loaded machine. */
    deadline = h_now_ms() + 30000;
    while (!seen && h_now_ms() < deadline) {
        ctl_status(f, d, &r);
        seen = r.status == 69 &&
               h_contains(r.out, "starting: reserving pool 'big': 256 MiB of 512 MiB");
        if (!seen && h_contains(r.out, "socket "))
            h_fail("the daemon served while held:\n%s", r.out);
        if (!seen)
            h_run_free(&r);
        else if (h_contains(r.err, "refused") || h_contains(r.err, "Is shmbrokerd running"))
            h_fail("status says refused while starting:\n%s", r.err);
        if (!seen)
            h_sleep_ms(20);
    }
    if (!seen) {
        h_daemon_print_log(d);
        h_fail("status never said the daemon was starting");
    }
    h_run_free(&r);
    c = shmb_new();
    assert_non_null(c);
    assert_int_equal(shmb_connect(c, d->socket, "early"), -EAGAIN);
    if (!h_contains(shmb_errmsg(c), "is starting") ||
        !h_contains(shmb_errmsg(c), "reserving pool 'big': 256 MiB of 512 MiB") ||
        h_contains(shmb_errmsg(c), "Is shmbrokerd running"))
        h_fail("the library's error: %s", shmb_errmsg(c));
    shmb_close(c);
    assert_true(h_exists(progress));

    assert_int_equal(unlink(gate), 0);
    assert_int_equal(h_daemon_wait_ready(d, 30000), 0);
    ctl_status(f, d, &r);
    h_expect_run(&r, 0, "socket ", NULL);
    h_run_free(&r);
    assert_false(h_exists(progress));
    h_pass(f);
}

/* A progress path that is a hard link to another file (planted between the
 * start's removal of a stale one and its open, in a directory others may
 * write, as /tmp for a --socket there): the start does not take it over,
 * and the file linked keeps its bytes and its mode. */
static void test_starting_open_refuses_a_link(void **state)
{
    struct h_fix *f = *state;
    char victim[PATH_MAX], progress[PATH_MAX + 16], buf[16] = {0};
    struct stat st;
    int fd, opened;

    h_path(f, "victim", victim, sizeof(victim));
    h_path(f, "s.sock" SHMB_STARTING_SUFFIX, progress, sizeof(progress));
    assert_int_equal(h_write_file(victim, "precious", 8), 0);
    assert_int_equal(chmod(victim, 0600), 0);
    assert_int_equal(link(victim, progress), 0);
    opened = shmb_starting_open(progress);
    if (opened >= 0) {
        (void)shmb_starting_update(opened, 1234, "reserving");
        close(opened);
    }
    fd = open(victim, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(read(fd, buf, sizeof(buf) - 1), 8);
    close(fd);
    assert_int_equal(stat(victim, &st), 0);
    if (strcmp(buf, "precious") != 0 || (st.st_mode & 07777) != 0600)
        h_fail("the start wrote through a hard link: %s now holds \"%s\", mode %04o",
               victim, buf, (unsigned)(st.st_mode & 07777));
    if (opened >= 0)
        h_fail("the start took over %s, a hard link to %s", progress, victim);
    h_pass(f);
}

/* A refused connect with progress at sock's ".starting", locked (as a
 * starting daemon holds it) or not: the library's code and message. */
static int connect_with_progress(const char *sock, const char *content, bool locked,
                                 char *msg, size_t len)
{
    char progress[PATH_MAX + 16];
    int fd, rc;
    shmb_t *c = shmb_new();

    assert_non_null(c);
    snprintf(progress, sizeof(progress), "%s.starting", sock);
    fd = open(progress, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    if (locked)
        assert_int_equal(flock(fd, LOCK_EX), 0);
    rc = shmb_connect(c, sock, "x");
    snprintf(msg, len, "%s", shmb_errmsg(c));
    shmb_close(c);
    close(fd);
    return rc;
}

/* A progress file nobody holds (a daemon killed while it started left it):
 * a refused connect says refused, not starting. One held but scribbled (not
 * a pid, no newline, a pid past pid_max, bytes that are not UTF-8) is not
 * believed either. One held, whose text has a terminal's escape sequence,
 * is shown escaped. */
static void test_starting_stale_or_scribbled(void **state)
{
    struct h_fix *f = *state;
    static const char *const bad[] = {"x\nreserving\n", "123", "0\nreserving\n",
                                      "99999999999\nreserving\n", "\xff\xfe\n\x80\n", ""};
    char sock[PATH_MAX], msg[2048], live[128];
    size_t i;

    h_path(f, "sock", sock, sizeof(sock));
    snprintf(live, sizeof(live), "%d\nreserving pool 'x': 1 of 2\n", (int)getpid());
    assert_int_equal(connect_with_progress(sock, live, false, msg, sizeof(msg)), -ENOENT);
    if (h_contains(msg, "starting"))
        h_fail("an unheld file said starting: %s", msg);
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(connect_with_progress(sock, bad[i], true, msg, sizeof(msg)), -ENOENT);
        if (h_contains(msg, "starting"))
            h_fail("case %zu said starting: %s", i, msg);
    }
    snprintf(live, sizeof(live), "%d\nreserving \x1b[2J pool\n", (int)getpid());
    assert_int_equal(connect_with_progress(sock, live, true, msg, sizeof(msg)), -EAGAIN);
    if (!h_contains(msg, "reserving \\x1b[2J pool"))
        h_fail("the text is not escaped: %s", msg);
    h_pass(f);
}

/* A progress file others may write (mode 0666: in a directory such as
 * /tmp, anyone could have planted it and hold its lock), or, when the test
 * may give files away, another user's: a refused connect says refused, not
 * "starting" with whatever text the file holds. */
static void test_starting_planted(void **state)
{
    struct h_fix *f = *state;
    char sock[PATH_MAX], progress[PATH_MAX + 16], text[128];
    int fd, n, rc, pass;
    shmb_t *c;

    h_path(f, "sock", sock, sizeof(sock));
    snprintf(progress, sizeof(progress), "%s" SHMB_STARTING_SUFFIX, sock);
    n = snprintf(text, sizeof(text), "%d\nreserving pool 'x': planted\n", (int)getpid());
    for (pass = 0; pass < (geteuid() == 0 ? 2 : 1); pass++) {
        fd = open(progress, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, (size_t)n), n);
        if (pass == 0)
            assert_int_equal(fchmod(fd, 0666), 0);
        else
            assert_int_equal(fchown(fd, 65534, 65534), 0);
        assert_int_equal(flock(fd, LOCK_EX), 0);
        c = shmb_new();
        assert_non_null(c);
        rc = shmb_connect(c, sock, "x");
        if (rc == -EAGAIN || h_contains(shmb_errmsg(c), "planted"))
            h_fail("a planted progress file (%s) was believed: %s",
                   pass == 0 ? "mode 0666" : "uid 65534", shmb_errmsg(c));
        assert_int_equal(rc, -ENOENT);
        shmb_close(c);
        close(fd);
        assert_int_equal(unlink(progress), 0);
    }
    h_pass(f);
}

/* A daemon SIGKILLed while it reserved leaves its progress file, unheld:
 * status says refused (not starting); the next start takes the path, and
 * adopts the half-reserved segment (its header was written first) rather
 * than refusing a file of no known kind. */
static void test_starting_killed(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M"), *d2;
    char lib[PATH_MAX], gate[PATH_MAX], progress[PATH_MAX];
    const char *old_asan = getenv("ASAN_OPTIONS");
    uint64_t deadline;
    struct h_run r;

    slow_reserve_lib(f, lib, sizeof(lib));
    h_path(f, "gate", gate, sizeof(gate));
    assert_int_equal(h_write_file(gate, "", 0), 0);
    snprintf(progress, sizeof(progress), "%s.starting", d->socket);
    setenv("LD_PRELOAD", lib, 1);
    setenv("SHMB_TEST_RESERVE_GATE", gate, 1);
    setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--pool", "big:512M", NULL}) > 0);
    unsetenv("LD_PRELOAD");
    unsetenv("SHMB_TEST_RESERVE_GATE");
    if (old_asan != NULL)
        setenv("ASAN_OPTIONS", old_asan, 1);
    else
        unsetenv("ASAN_OPTIONS");
    deadline = h_now_ms() + 30000;
    while (!h_exists(progress) && h_now_ms() < deadline)
        h_sleep_ms(10);
    assert_true(h_exists(progress));
    h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS);
    assert_true(h_exists(progress));
    ctl_status(f, d, &r);
    if (h_contains(r.out, "starting"))
        h_fail("a killed start is said to be starting:\n%s", r.out);
    h_run_free(&r);
    unlink(gate);
    d2 = h_daemon_again(f, d);
    assert_true(h_daemon_spawn(f, d2, (const char *const[]){"--pool", "big:512M", NULL}) > 0);
    if (h_daemon_wait_ready(d2, 30000) != 0) {
        h_daemon_print_log(d2);
        h_fail("the start after a killed one did not serve");
    }
    /* Gone once the daemon serves: it may unlink the file just after its
     * socket first accepts. */
    deadline = h_now_ms() + 10000;
    while (h_exists(progress) && h_now_ms() < deadline)
        h_sleep_ms(10);
    assert_false(h_exists(progress));
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_stop_removes_what_was_held),
        TEST(test_clean_stop_leaves_no_record),
        TEST(test_scribbled_record),
        TEST(test_record_names_a_private_file),
        TEST(test_record_others_may_write),
        TEST(test_check_size_past_a_file),
        TEST(test_pool_too_large_wording),
        TEST(test_one_pool_singular),
        TEST(test_other_pid_namespace),
        TEST(test_hello_pid_bounds),
        TEST(test_starting_progress),
        TEST(test_starting_stale_or_scribbled),
        TEST(test_starting_killed),
        TEST(test_starting_open_refuses_a_link),
        TEST(test_starting_planted),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
