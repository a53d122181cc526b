// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of shmbrokerd's start-up decisions: a killed daemon that
 * is still a zombie counts as gone, a start that is refused changes nothing
 * (neither the socket nor the segment), --fresh checks the space before it
 * removes anything, a small --size gets a default max object size that fits,
 * and a hugetlbfs --shm-dir counts free huge pages and rounds --size up to
 * them. Runs the real daemon; the tmpfs and hugetlbfs cases need root.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* ---- helpers --------------------------------------------------------------- */

/* The daemon's log contains needle; the test fails (printing it) otherwise. */
#define assert_log(d, needle) assert_log_at((d), (needle), __FILE__, __LINE__)
/* The body of assert_log(). */
static void assert_log_at(const struct h_daemon *d, const char *needle, const char *file,
                          int line)
{
    char *text = h_read_file(d->log, NULL);
    bool found = h_contains(text, needle);

    free(text);
    if (!found) {
        h_daemon_print_log(d);
        h_fail_at(file, line, "the log of --name %s does not say \"%s\"", d->name,
                  needle);
    }
}

/* Start d (already set up) and expect it to refuse: exit status 1. */
#define expect_refused_start(f, d, extra)                                                \
    expect_refused_start_at((f), (d), (extra), __FILE__, __LINE__)
/* The body of expect_refused_start(). */
static void expect_refused_start_at(struct h_fix *f, struct h_daemon *d,
                                    const char *const *extra, const char *file, int line)
{
    int status;

    if (h_daemon_spawn(f, d, extra) <= 0)
        h_fail_at(file, line, "cannot start %s", h_daemon_bin());
    status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
    if (status < 0 || h_exit_code(status) != 1) {
        h_daemon_print_log(d);
        h_fail_at(file, line, "the start was not refused (exit %d)",
                  status < 0 ? -1 : h_exit_code(status));
    }
}

/* A socket file nobody listens on, as a daemon that died leaves it. */
static void make_stale_socket(const char *path)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    close(fd);
}

/* path exists and is a socket. */
static bool is_socket(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* The state letter of pid (field 3 of /proc/PID/stat), or '?'. */
static char proc_state(pid_t pid)
{
    char path[64], *text, *paren, state = '?';

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    text = h_read_file(path, NULL);
    paren = text != NULL ? strrchr(text, ')') : NULL;
    if (paren != NULL && paren[1] == ' ')
        state = paren[2];
    free(text);
    return state;
}

/* h_eventually callback: the process is a zombie. */
static bool is_zombie(void *arg)
{
    return proc_state(*(pid_t *)arg) == 'Z';
}

/* Skip the test unless we are root (mounting needs it). */
static void need_root(struct h_fix *f)
{
    if (geteuid() != 0)
        h_skip(f, "needs root (mount)");
}

/* ---- a zombie owner, refused starts ----------------------------------------- */

/* After SIGKILL the old daemon stays a zombie (nobody reaps it): it holds no
 * descriptor and serves nobody, so a new daemon on the same socket and
 * segment removes the stale socket, adopts the segment and serves its
 * committed objects. */
static void test_zombie_owner_is_gone(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d2;
    pid_t old;
    int status;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "kept", 5000, 7, 0));
    shmb_close(c);
    old = d1->pid;
    assert_int_equal(kill(old, SIGKILL), 0);
    if (!h_eventually(is_zombie, &old, H_STOP_TIMEOUT_MS))
        h_fail("pid %d did not become a zombie (state %c)", (int)old, proc_state(old));

    d2 = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d2);
        h_fail("the daemon did not start while the old one was a zombie (exit %d)",
               d2->status < 0 ? -1 : h_exit_code(d2->status));
    }
    assert_int_equal(proc_state(old), 'Z');
    assert_log(d2, "adopted segment");
    c = h_lib_connect(d2, "r", 0);
    get_check(c, "kept", 5000, 7);
    ok(c, h_put_pattern(c, "new", 3000, 8, 0));
    get_check(c, "new", 3000, 8);
    shmb_close(c);

    /* Reap the zombie now, so that teardown sees only d2. */
    assert_int_equal(waitpid(old, &status, 0), old);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    d1->pid = 0;
    d1->status = status;
    h_pass(f);
}

/* A start refused because of the segment leaves the socket file alone: a
 * stale socket next to a segment a live daemon owns stays, and the live
 * daemon keeps serving; a stale socket next to an orphaned segment of
 * another --size stays, and so does the segment, objects and all. */
static void test_refused_start_changes_nothing(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    char seg[PATH_MAX * 2];
    struct stat st;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "keep", 10000, 42, 0));

    /* The segment belongs to a live daemon; the socket asked for is stale. */
    d = h_daemon_new(f, "1M");
    snprintf(d->name, sizeof(d->name), "%s", d1->name);
    make_stale_socket(d->socket);
    expect_refused_start(f, d, NULL);
    assert_log(d, "belongs to a running shmbrokerd");
    if (!is_socket(d->socket))
        h_fail("the refused start removed the stale socket %s", d->socket);
    h_assert_alive(d1);
    get_check(c, "keep", 10000, 42);
    shmb_close(c);
    assert_int_equal(unlink(d->socket), 0);

    /* The owner is gone (its socket file stays); --size differs. */
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    assert_true(is_socket(d1->socket));
    h_segment_path(d1, seg, sizeof(seg));
    d = h_daemon_again(f, d1);
    snprintf(d->size, sizeof(d->size), "2M");
    expect_refused_start(f, d, NULL);
    assert_log(d, "start with --size 1048576 to keep its objects");
    if (!is_socket(d1->socket))
        h_fail("the refused start removed the stale socket %s", d1->socket);
    assert_int_equal(stat(seg, &st), 0);
    assert_int_equal(st.st_size, 1048576);

    /* With the right size it comes back, objects included. */
    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    assert_log(d, "removed stale socket");
    c = h_lib_connect(d, "r", 0);
    get_check(c, "keep", 10000, 42);
    shmb_close(c);
    h_pass(f);
}

/* A killed daemon on its own tmpfs of the given size, with --size size; its
 * segment and socket file stay. */
static struct h_daemon *killed_on_tmpfs(struct h_fix *f, const char *tmpfs,
                                        const char *size)
{
    struct h_daemon *d;
    char dir[PATH_MAX];
    int rc;

    need_root(f);
    if ((rc = h_mount_tmpfs(f, tmpfs, dir, sizeof(dir))) < 0)
        h_fail("cannot mount a tmpfs: %s", strerror(-rc));
    d = h_daemon_new(f, size);
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("the daemon did not start on a %s tmpfs", tmpfs);
    }
    return d;
}

/* --fresh checks the space before it removes the old segment: --fresh
 * --size 600M on a 512M tmpfs is refused with the space message, and the old
 * segment, its objects and the stale socket are all still there. */
static void test_fresh_checks_space_first(void **state)
{
    static const char *const fresh[] = {"--fresh", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d1 = killed_on_tmpfs(f, "512m", "8M"), *d;
    char seg[PATH_MAX * 2];
    struct stat st;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "old", 100000, 3, 0));
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    h_segment_path(d1, seg, sizeof(seg));

    d = h_daemon_again(f, d1);
    snprintf(d->size, sizeof(d->size), "600M");
    expect_refused_start(f, d, fresh);
    assert_log(d, "Insufficient space in");
    assert_log(d, "600 MiB required");
    assert_int_equal(stat(seg, &st), 0);
    assert_int_equal(st.st_size, 8 << 20);
    assert_true(is_socket(d1->socket));

    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    c = h_lib_connect(d, "r", 0);
    get_check(c, "old", 100000, 3);
    shmb_close(c);
    h_pass(f);
}

/* --fresh with a socket that cannot be made (its directory cannot be
 * created under /proc) is refused before the old segment is removed: the
 * segment and its object are still there for the next start. */
static void test_fresh_checks_socket_first(void **state)
{
    static const char *const fresh[] = {"--fresh", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "4M", NULL), *d;
    char seg[PATH_MAX * 2];
    struct stat before, after;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "old", 10000, 7, 0));
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    h_segment_path(d1, seg, sizeof(seg));
    assert_int_equal(stat(seg, &before), 0);

    d = h_daemon_again(f, d1);
    snprintf(d->socket, sizeof(d->socket), "/proc/shmb-no-such-dir/s.sock");
    expect_refused_start(f, d, fresh);
    assert_log(d, "/proc/shmb-no-such-dir");
    assert_int_equal(stat(seg, &after), 0);
    assert_int_equal(after.st_ino, before.st_ino);

    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    c = h_lib_connect(d, "r", 0);
    get_check(c, "old", 10000, 7);
    shmb_close(c);
    h_pass(f);
}

/* The space the old segment holds counts for --fresh, which frees it: on a
 * 16M tmpfs holding a 12M segment, --fresh --size 12M starts (4M are free
 * before the old one goes), and --fresh --size 20M is refused, saying the
 * old segment's space was counted. */
static void test_fresh_counts_old_segment(void **state)
{
    static const char *const fresh[] = {"--fresh", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d1 = killed_on_tmpfs(f, "16m", "12M"), *d;

    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    d = h_daemon_again(f, d1);
    snprintf(d->size, sizeof(d->size), "20M");
    expect_refused_start(f, d, fresh);
    assert_log(d, "20 MiB required, 16 MiB free, the 12 MiB of the segment it would "
                  "replace included");
    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, fresh) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("--fresh did not count the space of the segment it replaces");
    }
    assert_log(d, "(--fresh)");
    h_pass(f);
}

/* ---- small sizes ------------------------------------------------------------ */

/* Without --max-object-size, a small --size (8K: one data page) starts, and
 * an object of the max size it reports fits, with the longest key, twice in
 * a row (the second evicts the first). A --max-object-size that does not fit
 * is still refused, naming the flag. */
static void test_small_sizes(void **state)
{
    static const char *const sizes[] = {"8K", "12K", "64K"};
    static const char *const too_big[] = {"--max-object-size", "4096", NULL};
    struct h_fix *f = *state;
    char key[SHMB_KEY_MAX + 1];
    struct h_daemon *d;
    size_t i, max;
    shmb_t *c;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        d = h_daemon_new(f, sizes[i]);
        assert_true(h_daemon_spawn(f, d, NULL) > 0);
        if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
            h_daemon_print_log(d);
            h_fail("--size %s without --max-object-size did not start", sizes[i]);
        }
        c = h_lib_connect(d, "w", 0);
        max = shmb_info(c)->max_object_size;
        assert_true(max > 0);
        memset(key, 'k', SHMB_KEY_MAX);
        key[SHMB_KEY_MAX] = '\0';
        ok(c, h_put_pattern(c, key, max, 1, 0));
        get_check(c, key, max, 1);
        key[0] = 'j';
        ok(c, h_put_pattern(c, key, max, 2, 0));
        get_check(c, key, max, 2);
        shmb_close(c);
        assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    }

    d = h_daemon_new(f, "8K");
    expect_refused_start(f, d, too_big);
    assert_log(d, "Max object size (4096 bytes) does not fit");
    assert_log(d, "--max-object-size");
    h_pass(f);
}

/* ---- hugetlbfs ----------------------------------------------------------------- */

/* What test_hugetlbfs changed, for its teardown to undo. */
static char huge_dir[64];
static bool huge_mounted;
static long huge_old_nr = -1;

/* vm.nr_hugepages, or -1. */
static long nr_hugepages(void)
{
    char *text = h_read_file("/proc/sys/vm/nr_hugepages", NULL);
    long n = text != NULL ? strtol(text, NULL, 10) : -1;

    free(text);
    return n;
}

/* Set vm.nr_hugepages: 0 or -1. */
static int set_nr_hugepages(long n)
{
    char buf[32];
    int len = snprintf(buf, sizeof(buf), "%ld\n", n);

    return h_write_file("/proc/sys/vm/nr_hugepages", buf, (size_t)len);
}

/* The harness's teardown (daemons stopped, segments removed), then unmount
 * the hugetlbfs and give the huge pages back. */
static int huge_teardown(void **state)
{
    int rc = h_teardown(state);

    if (huge_mounted && umount2(huge_dir, MNT_DETACH) != 0)
        fprintf(stderr, "umount %s: %s\n", huge_dir, strerror(errno));
    huge_mounted = false;
    if (huge_dir[0] != '\0')
        rmdir(huge_dir);
    huge_dir[0] = '\0';
    if (huge_old_nr >= 0 && set_nr_hugepages(huge_old_nr) != 0)
        fprintf(stderr, "cannot restore vm.nr_hugepages to %ld\n", huge_old_nr);
    huge_old_nr = -1;
    return rc;
}

/* The huge pages of the default size still free, from /proc/meminfo. */
static long free_huge_pages(void)
{
    char *text = h_read_file("/proc/meminfo", NULL);
    const char *line = text != NULL ? strstr(text, "HugePages_Free:") : NULL;
    long n = line != NULL ? strtol(line + strlen("HugePages_Free:"), NULL, 10) : -1;

    free(text);
    return n;
}

/* On a hugetlbfs mount made without size= (statvfs says 0 blocks), the
 * daemon counts free huge pages: --size 3M rounds up to 4M (two 2M pages)
 * with a log line, and a --max-object-size that only 4M can hold is taken, the segment file is 4M and serves objects; a --size
 * larger than the free huge pages is refused with the space message. Needs
 * root and 4 free huge pages of 2 MiB (reserved here, then given back). */
static void test_hugetlbfs(void **state)
{
    struct h_fix *f = *state;
    char seg[PATH_MAX * 2], want[128];
    struct h_daemon *d;
    struct stat st;
    char *meminfo;
    long before;
    bool two_mib;
    shmb_t *c;

    need_root(f);
    if ((before = nr_hugepages()) < 0)
        h_skip(f, "no /proc/sys/vm/nr_hugepages (kernel without hugetlb)");
    meminfo = h_read_file("/proc/meminfo", NULL);
    two_mib = h_contains(meminfo, "Hugepagesize:       2048 kB");
    free(meminfo);
    if (!two_mib)
        h_skip(f, "the default huge page size is not 2 MiB");
    huge_old_nr = before;
    if (set_nr_hugepages(before + 4) != 0 || free_huge_pages() < 4)
        h_skip(f, "cannot reserve 4 huge pages of 2 MiB (vm.nr_hugepages)");
    snprintf(huge_dir, sizeof(huge_dir), "/tmp/shmbt-huge-XXXXXX");
    if (mkdtemp(huge_dir) == NULL) {
        huge_dir[0] = '\0';
        h_fail("mkdtemp: %s", strerror(errno));
    }
    if (mount("none", huge_dir, "hugetlbfs", MS_NOSUID | MS_NODEV, "mode=0755") != 0)
        h_skip(f, "cannot mount hugetlbfs");
    huge_mounted = true;

    /* More than the free huge pages: refused, naming hugetlbfs. */
    d = h_daemon_new(f, "64M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", huge_dir);
    expect_refused_start(f, d, NULL);
    assert_log(d, "64 MiB required");
    assert_log(d, "hugetlbfs");

    /* --max-object-size 3M fits the rounded 4M segment, not a 3M one: the
     * check is made against the size the segment will have. */
    d = h_daemon_new(f, "3M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", huge_dir);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--max-object-size", "3M", NULL}) >
                0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("the daemon did not start on hugetlbfs");
    }
    snprintf(want, sizeof(want), "--size %d rounded up to %d bytes", 3 << 20, 4 << 20);
    assert_log(d, want);
    h_segment_path(d, seg, sizeof(seg));
    assert_int_equal(stat(seg, &st), 0);
    assert_int_equal(st.st_size, 4 << 20);
    c = h_lib_connect(d, "w", 0);
    assert_int_equal(shmb_info(c)->size, 4 << 20);
    ok(c, h_put_pattern(c, "huge", 1 << 20, 5, 0));
    get_check(c, "huge", 1 << 20, 5);
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    h_pass(f);
}

/* ---- a stop as soon as it listens ------------------------------------------ */

/* A client that can connect may stop the daemon at once (a test's teardown,
 * systemd's stop right after start): SIGTERM the moment the socket accepts a
 * connection, 40 times, and every stop is the clean one (exit 0, socket and
 * segment removed). Before the fix the listener came up before the signal
 * handlers, and a SIGTERM in between killed the daemon (exit 143). */
static void test_stop_as_soon_as_it_listens(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char seg[PATH_MAX * 2];
    int round;

    h_segment_path(d, seg, sizeof(seg));
    for (round = 0; round < 40; round++) {
        uint64_t deadline;
        struct h_conn c;
        int status;

        assert_true(h_daemon_spawn(f, d, NULL) > 0);
        deadline = h_now_ms() + H_READY_TIMEOUT_MS;
        while (h_conn_open(&c, d->socket) != 0) /* no pause: catch the first moment */
            if (h_now_ms() > deadline)
                h_fail("round %d: no listener within %d ms", round, H_READY_TIMEOUT_MS);
        kill(d->pid, SIGTERM);
        h_conn_close(&c);
        status = h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS);
        if (status < 0 || h_exit_code(status) != 0) {
            h_daemon_print_log(d);
            h_fail("round %d: SIGTERM right after listen gave exit %d, not a clean stop",
                   round, status < 0 ? -1 : h_exit_code(status));
        }
        assert_false(is_socket(d->socket));
        assert_int_equal(access(seg, F_OK), -1);
    }
    h_pass(f);
}

/* ---- --stop-with-pid ---------------------------------------------------------- */

/* A private daemon a program starts for itself goes with that program, even
 * when it is killed with SIGKILL: the daemon stops cleanly (exit 0, socket and
 * segment removed) once the process named by --stop-with-pid exits. A pid
 * that is not running refuses the start, changing nothing. */
static void test_stop_with_pid(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char seg[PATH_MAX * 2], pid_text[32];
    const char *extra[] = {"--stop-with-pid", pid_text, NULL};
    pid_t owner = fork();
    int status;

    assert_true(owner >= 0);
    if (owner == 0) {
        pause();
        _exit(0);
    }
    h_segment_path(d, seg, sizeof(seg));
    snprintf(pid_text, sizeof(pid_text), "%d", (int)owner);
    assert_true(h_daemon_spawn(f, d, extra) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("no start with --stop-with-pid %d", (int)owner);
    }
    assert_int_equal(kill(owner, SIGKILL), 0);
    assert_int_equal(waitpid(owner, &status, 0), owner);
    status = h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS);
    if (status < 0 || h_exit_code(status) != 0) {
        h_daemon_print_log(d);
        h_fail("the daemon did not stop cleanly when pid %d exited (exit %d)", (int)owner,
               status < 0 ? -1 : h_exit_code(status));
    }
    assert_log(d, "exited (--stop-with-pid); shutting down");
    assert_false(is_socket(d->socket));
    assert_int_equal(access(seg, F_OK), -1);
    /* The same pid, now gone: refused, and nothing is left behind. */
    expect_refused_start(f, d, extra);
    assert_log(d, "(it is not running)");
    assert_false(is_socket(d->socket));
    assert_int_equal(access(seg, F_OK), -1);
    h_pass(f);
}

/* ---- a reload during a stop ----------------------------------------------------- */

/* A reload (SIGHUP: logrotate, systemctl reload) that comes while the daemon
 * stops does not end it half way: with SIGHUP sent without pause from
 * before the SIGTERM until the daemon is gone, every stop is the clean one
 * (exit 0, socket and segment removed), 5 times. Before the fix the stop
 * closed the SIGHUP handler first, the signal's default action came back,
 * and the next SIGHUP killed the daemon (exit 129) with its segment and
 * socket left for the next start to adopt. */
static void test_reload_during_stop(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "64M");
    char seg[PATH_MAX * 2];
    int round;

    h_segment_path(d, seg, sizeof(seg));
    for (round = 0; round < 5; round++) {
        pid_t daemon_pid, hup;
        int status;

        assert_true(h_daemon_spawn(f, d, NULL) > 0);
        if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
            h_daemon_print_log(d);
            h_fail("round %d: no start", round);
        }
        daemon_pid = d->pid;
        hup = fork();
        assert_true(hup >= 0);
        if (hup == 0) {
            /* Until the daemon is gone (then ESRCH, or a zombie: its
             * parent reaps it only after this one is killed). */
            while (kill(daemon_pid, SIGHUP) == 0)
                ;
            _exit(0);
        }
        h_sleep_ms(20);
        kill(d->pid, SIGTERM);
        status = h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS);
        kill(hup, SIGKILL);
        waitpid(hup, NULL, 0);
        if (status < 0 || h_exit_code(status) != 0) {
            h_daemon_print_log(d);
            h_fail("round %d: SIGTERM under SIGHUPs gave exit %d, not a clean stop", round,
                   status < 0 ? -1 : h_exit_code(status));
        }
        assert_false(is_socket(d->socket));
        assert_int_equal(access(seg, F_OK), -1);
    }
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_zombie_owner_is_gone),
        TEST(test_refused_start_changes_nothing),
        TEST(test_fresh_checks_space_first),
        TEST(test_fresh_counts_old_segment),
        TEST(test_fresh_checks_socket_first),
        TEST(test_small_sizes),
        TEST(test_stop_as_soon_as_it_listens),
        TEST(test_stop_with_pid),
        TEST(test_reload_during_stop),
        cmocka_unit_test_setup_teardown(test_hugetlbfs, h_setup, huge_teardown),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_startup", tests, NULL, NULL);
}
