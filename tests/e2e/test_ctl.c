// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of shmbrokerctl (run as a program, as a user would) and of
 * shmbrokerd's start-up and shutdown: flags, the free-space check on a small
 * tmpfs, stale and live sockets and segments, and what SIGTERM leaves behind.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "shmbroker.h"

/* ---- helpers --------------------------------------------------------------- */

/* A connected library handle, or the test fails. */
static shmb_t *connect_to(const struct h_daemon *d)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    if (shmb_connect(c, d->socket, "test") != 0) {
        print_error("shmb_connect: %s\n", shmb_errmsg(c));
        shmb_close(c);
        fail();
    }
    return c;
}

/* Run shmbrokerd with argv after the program name (NULL-terminated). */
static void run_daemon(struct h_fix *f, struct h_run *r, const char *const *args)
{
    const char *argv[24];
    int n = 0;

    argv[n++] = h_daemon_bin();
    while (*args != NULL && n < 23)
        argv[n++] = *args++;
    argv[n] = NULL;
    assert_int_equal(h_run(f, argv, NULL, 0, r), 0);
}

/* Entries in dir other than . and .., or -1. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* Create a socket file at path that nobody listens on: bind, then close
 * without unlink, as a crashed daemon leaves it. */
static void make_stale_socket(const char *path)
{
    struct sockaddr_un sun;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    close(fd);
}

/* ---- shmbrokerctl ------------------------------------------------------------ */

/* status shows the daemon's version, pid, socket, segment, occupancy, object
 * counts, clients, counters and the head-of-line blocker, and follows the
 * blocker as it changes. */
static void test_status(void **state)
{
    static const char zeros[2000];
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = connect_to(d);
    char want[512];
    struct h_run r;
    const void *p;
    size_t len;
    void *w;

    shmb_set_arena(c, 0); /* the counts below are of allocs and chunks */
    assert_int_equal(shmb_put(c, "a", zeros, 1000, 0), 0);
    assert_int_equal(shmb_put(c, "b", zeros, 2000, 0), 0);
    assert_int_equal(shmb_alloc(c, "p", 1000, 0, &w), 0);
    assert_int_equal(shmb_get(c, "a", &p, &len), 0);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    snprintf(want, sizeof(want), "shmbrokerd %s, pid %d, up ", SHMB_VERSION, (int)d->pid);
    h_expect_run(&r, 0, want, NULL);
    snprintf(want, sizeof(want), "socket    %s\n", d->socket);
    h_expect_run(&r, 0, want, NULL);
    snprintf(want, sizeof(want), "segment   %s in /dev/shm: 4 MiB (", d->name);
    h_expect_run(&r, 0, want, NULL);
    h_expect_run(&r, 0, "max object 2 MiB\n", NULL);
    h_expect_run(&r, 0, "left in /dev/shm\n", NULL);
    /* 3 chunks: 64-byte headers, payloads padded to 1024, 2048, 1024. */
    h_expect_run(&r, 0, "%  4.2 KiB of 3.9 MiB (", NULL); /* a 64 KiB catalog */
    h_expect_run(&r, 0, "objects   2 committed, 1 pending, 1 pinned\n", NULL);
    h_expect_run(&r, 0, "clients   2\n", NULL); /* this test and the ctl itself */
    h_expect_run(&r, 0, "counters  3 allocs, 2 commits, 1 gets, 0 evictions, 0 ENOSPC\n",
               NULL);
    h_expect_run(&r, 0, "blocker   'a' (committed, 1 pins, 0 awaited reads) stops reclaim\n",
               NULL);
    assert_int_equal(r.err_len, 0);
    h_run_free(&r);

    assert_int_equal(shmb_release(c, "a"), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "blocker   'p' (pending, 0 pins, 0 awaited reads) stops reclaim\n",
               NULL);
    h_run_free(&r);
    assert_int_equal(shmb_abort(c, "p"), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "blocker   none\n", NULL);
    h_expect_run(&r, 0, "objects   2 committed, 0 pending, 0 pinned\n", NULL);
    h_run_free(&r);
    shmb_close(c);
    h_pass(f);
}

/* status --json prints the daemon's stats as one JSON object: used + free ==
 * data_size, and the object count and identity are right. */
static void test_status_json(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = connect_to(d);
    json_error_t jerr;
    struct h_run r;
    json_t *st;

    shmb_set_arena(c, 0); /* the counts below are of allocs and chunks */
    assert_int_equal(shmb_put(c, "x", "x", 1, 0), 0);
    assert_int_equal(shmb_put(c, "y", "yy", 2, 0), 0);
    assert_int_equal(shmb_put(c, "z", "zzz", 3, 0), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--json", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    st = json_loads(r.out, 0, &jerr);
    if (st == NULL) {
        h_run_dump("status --json", &r);
        h_fail("not JSON: %s", jerr.text);
    }
    assert_true(json_is_true(json_object_get(st, "ok")));
    assert_int_equal(h_int(st, "used") + h_int(st, "free"), h_int(st, "data_size"));
    assert_int_equal(h_int(st, "data_size"), (4 << 20) - 4096 - 65536); /* 2048 slots */
    assert_int_equal(h_int(st, "used"), 3 * 128);
    assert_int_equal(h_int(st, "objects"), 3);
    assert_int_equal(h_int(st, "pid"), d->pid);
    assert_string_equal(h_str(st, "segment"), d->name);
    assert_int_equal(h_int(json_object_get(st, "counters"), "commits"), 3);
    json_decref(st);
    h_run_free(&r);
    shmb_close(c);
    h_pass(f);
}

/* put KEY FILE and get KEY FILE (or standard output) round-trip arbitrary
 * bytes, NULs included. */
static void test_put_get_file(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    size_t len = 300001, got;
    unsigned char *data = malloc(len);
    char in[PATH_MAX], out[PATH_MAX];
    struct h_run r;
    char *back;

    assert_non_null(data);
    h_fill(data, len, 77);
    h_path(f, "in.bin", in, sizeof(in));
    h_path(f, "out.bin", out, sizeof(out));
    assert_int_equal(h_write_file(in, data, len), 0);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "blob", in, NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    assert_int_equal(r.out_len + r.err_len, 0);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "blob", out, NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    back = h_read_file(out, &got);
    assert_non_null(back);
    assert_int_equal(got, len);
    assert_memory_equal(back, data, len);
    free(back);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "blob", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    assert_int_equal(r.out_len, len);
    assert_memory_equal(r.out, data, len);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "blob", "-", NULL), 0);
    assert_int_equal(r.out_len, len);
    assert_memory_equal(r.out, data, len);
    h_run_free(&r);
    free(data);
    h_pass(f);
}

/* put KEY - reads standard input; the bytes come back unchanged. */
static void test_put_stdin(void **state)
{
    static const char text[] = "line one\nline two\0with a NUL\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c;
    const void *p;
    struct h_run r;
    size_t len;

    assert_int_equal(h_ctl(f, d, text, sizeof(text), &r, "put", "from-stdin", "-", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    c = connect_to(d);
    assert_int_equal(shmb_get(c, "from-stdin", &p, &len), 0);
    assert_int_equal(len, sizeof(text));
    assert_memory_equal(p, text, sizeof(text));
    assert_int_equal(shmb_release(c, "from-stdin"), 0);
    shmb_close(c);

    /* An empty input is refused: objects hold at least one byte. */
    assert_int_equal(h_ctl(f, d, "", 0, &r, "put", "empty", "-", NULL), 0);
    h_expect_run(&r, 2, NULL, "objects hold at least 1 byte");
    h_run_free(&r);
    h_pass(f);
}

/* ls lists keys oldest first, one line each, and filters by prefix. */
static void test_ls(void **state)
{
    static const char *const keys[] = {"b/x", "a", "c", "b/y"};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = connect_to(d);
    const char *prev;
    struct h_run r;
    size_t i;

    for (i = 0; i < 4; i++)
        assert_int_equal(shmb_put(c, keys[i], "0123456789", 10, 0), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "ls", NULL), 0);
    h_expect_run(&r, 0, "KEY", NULL);
    prev = strstr(r.out, "KEY");
    for (i = 0; i < 4; i++) {
        char line[64];
        const char *at;

        snprintf(line, sizeof(line), "\n%-32s %12d ", keys[i], 10);
        at = strstr(r.out, line);
        if (at == NULL || at < prev) {
            h_run_dump("ls", &r);
            h_fail("'%s' missing or out of order", keys[i]);
        }
        prev = at;
    }
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "ls", "b/", NULL), 0);
    h_expect_run(&r, 0, "\nb/x ", NULL);
    h_expect_run(&r, 0, "\nb/y ", NULL);
    assert_null(strstr(r.out, "\na "));
    assert_null(strstr(r.out, "\nc "));
    h_run_free(&r);
    shmb_close(c);
    h_pass(f);
}

/* rm deletes a key: a later get exits 1 with "shmbrokerctl: ENOENT: ..." on
 * stderr; other refusals print their code the same way. */
static void test_rm_and_errors(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    char in[PATH_MAX];
    struct h_run r;

    h_path(f, "in.txt", in, sizeof(in));
    assert_int_equal(h_write_file(in, "hello", 5), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", in, NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", in, NULL), 0);
    h_expect_run(&r, 1, NULL, "shmbrokerctl: EEXIST: Key 'k' already exists");
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "rm", "k", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "k", NULL), 0);
    h_expect_run(&r, 1, NULL, NULL);
    assert_int_equal(r.out_len, 0);
    assert_string_equal(r.err, "shmbrokerctl: ENOENT: No object 'k'; check the key, or "
                               "wait for its writer to commit it.\n");
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "rm", "k", NULL), 0);
    h_expect_run(&r, 1, NULL, "shmbrokerctl: ENOENT: No object 'k' to delete.");
    h_run_free(&r);
    h_path(f, "missing.txt", in, sizeof(in));
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", in, NULL), 0);
    h_expect_run(&r, 66, NULL, "cannot open");
    h_run_free(&r);
    h_pass(f);
}

/* Bad usage exits 2 with the usage on stderr, before any connection: no
 * daemon is needed to tell. --help exits 0. */
static void test_usage(void **state)
{
    static const char *const bad[][5] = {
        {NULL},
        {"frob", NULL},
        {"put", "k", NULL},
        {"put", "k", "f", "extra", NULL},
        {"get", NULL},
        {"rm", NULL},
        {"status", "extra", NULL},
        {"ls", "a", "b", NULL},
        {"--bogus", "status", NULL},
    };
    struct h_fix *f = *state;
    char sock[PATH_MAX];
    struct h_run r;
    size_t i;

    h_path(f, "nobody.sock", sock, sizeof(sock));
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *argv[10] = {h_ctl_bin(), "--socket", sock};
        int j;

        for (j = 0; bad[i][j] != NULL; j++)
            argv[3 + j] = bad[i][j];
        argv[3 + j] = NULL;
        assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
        if (r.status != 2 || strstr(r.err, "Usage: shmbrokerctl") == NULL) {
            h_run_dump(bad[i][0] ? bad[i][0] : "(no command)", &r);
            h_fail("bad usage %zu: expected exit 2 and the usage", i);
        }
        h_run_free(&r);
    }
    {
        const char *argv[] = {h_ctl_bin(), "--help", NULL};

        assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
        h_expect_run(&r, 0, "Usage: shmbrokerctl", NULL);
        h_expect_run(&r, 0, "Exit status: 0 success, 1 the daemon refused, 2 usage, 66", NULL);
        h_run_free(&r);
    }
    h_pass(f);
}

/* Without a daemon (no socket file, or a stale one) every command exits 69
 * with a message naming the socket path. */
static void test_no_daemon(void **state)
{
    struct h_fix *f = *state;
    char sock[PATH_MAX];
    struct h_run r;
    const char *argv[] = {h_ctl_bin(), "--socket", sock, "status", NULL};

    h_path(f, "nobody.sock", sock, sizeof(sock));
    assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
    h_expect_run(&r, 69, NULL, sock);
    h_expect_run(&r, 69, NULL, "Is shmbrokerd running?");
    assert_int_equal(r.out_len, 0);
    h_run_free(&r);

    make_stale_socket(sock);
    argv[3] = "ls";
    assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
    h_expect_run(&r, 69, NULL, sock);
    h_expect_run(&r, 69, NULL, "Connection refused");
    h_run_free(&r);
    h_pass(f);
}

/* ---- shmbrokerd start-up and shutdown --------------------------------------- */

/* On an 8 MiB tmpfs a 64 MiB segment is refused before anything is created:
 * a non-zero exit, the free-space message on stderr, no segment file and no
 * socket file. */
static void test_tmpfs_too_small(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    char dir[PATH_MAX], want[PATH_MAX * 3];
    char *log;
    int rc = h_mount_tmpfs(f, "8m", dir, sizeof(dir)), status;

    if (rc < 0) {
        char why[PATH_MAX + 128];

        snprintf(why, sizeof(why), "cannot mount a tmpfs on %s (%s); the free-space test "
                 "needs root", dir, strerror(-rc));
        h_skip(f, why);
    }
    d = h_daemon_new(f, "64M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
    assert_true(status >= 0);
    assert_int_not_equal(h_exit_code(status), 0);
    log = h_read_file(d->log, NULL);
    assert_non_null(log);
    snprintf(want, sizeof(want),
             "shmbrokerd: Insufficient space in %s: 64 MiB required, 8 MiB free. Give %s more "
             "room (mount -o remount,size=N on its tmpfs; shmbrokerd --check prints the fix "
             "for where it runs), or choose a smaller --size.\n", dir, dir);
    if (strstr(log, want) == NULL) {
        h_daemon_print_log(d);
        free(log);
        h_fail("the log lacks: %s", want);
    }
    free(log);
    assert_int_equal(count_entries(dir), 0);
    assert_false(h_exists(d->socket));
    h_pass(f);
}

/* On the same kind of tmpfs a segment that fits is created there with every
 * page reserved up front, and stats reports that directory and its free
 * space. */
static void test_tmpfs_reserved(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    char dir[PATH_MAX], seg[PATH_MAX * 2];
    int rc = h_mount_tmpfs(f, "8m", dir, sizeof(dir));
    shmb_stats_t st;
    struct stat sb;
    shmb_t *c;

    if (rc < 0) {
        char why[PATH_MAX + 128];

        snprintf(why, sizeof(why), "cannot mount a tmpfs on %s (%s); the reservation test "
                 "needs root", dir, strerror(-rc));
        h_skip(f, why);
    }
    d = h_daemon_new(f, "6M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0)
        h_fail("shmbrokerd did not start on %s", dir);
    h_segment_path(d, seg, sizeof(seg));
    assert_int_equal(stat(seg, &sb), 0);
    assert_int_equal(sb.st_size, 6 << 20);
    assert_true((long long)sb.st_blocks * 512 >= 6LL << 20); /* reserved, not sparse */
    c = connect_to(d);
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_string_equal(st.shm_dir, dir);
    assert_true(st.shm_dir_free <= 2u << 20);
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_int_equal(count_entries(dir), 0);
    h_pass(f);
}

/* SIGTERM (and SIGINT) with clients connected: the daemon exits 0 and removes
 * its socket and its segment. */
static void test_signal_cleanup(void **state)
{
    static const int sigs[] = {SIGTERM, SIGINT};
    struct h_fix *f = *state;
    char seg[PATH_MAX * 2];
    size_t i;

    for (i = 0; i < 2; i++) {
        struct h_daemon *d = h_daemon_start(f, "2M", NULL);
        shmb_t *c = connect_to(d);
        void *p;
        char *log;

        assert_int_equal(shmb_put(c, "k", "v", 1, 0), 0);
        assert_int_equal(shmb_alloc(c, "pending", 10, 0, &p), 0);
        h_segment_path(d, seg, sizeof(seg));
        assert_true(h_exists(seg));
        assert_true(h_exists(d->socket));
        assert_int_equal(h_exit_code(h_daemon_signal(d, sigs[i], H_STOP_TIMEOUT_MS)), 0);
        assert_false(h_exists(seg));
        assert_false(h_exists(d->socket));
        log = h_read_file(d->log, NULL);
        assert_true(h_contains(log, "shutting down"));
        free(log);
        shmb_close(c);
    }
    h_pass(f);
}

/* A second daemon on a live daemon's socket (and segment name) fails with
 * "another shmbrokerd is listening on PATH" and disturbs nothing: the first
 * keeps its socket, its segment and its objects, and keeps serving. A second
 * daemon on another socket but the same live segment name is refused too. */
static void test_second_daemon(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *a = h_daemon_start(f, "2M", NULL), *b;
    char seg[PATH_MAX * 2], want[256];
    shmb_t *c = connect_to(a);
    shmb_stats_t st;
    struct h_run r;
    char *log;
    int status;

    assert_int_equal(shmb_put(c, "k", "v", 1, 0), 0);
    b = h_daemon_new(f, "2M");
    snprintf(b->socket, sizeof(b->socket), "%s", a->socket);
    snprintf(b->name, sizeof(b->name), "%s", a->name);
    assert_true(h_daemon_spawn(f, b, NULL) > 0);
    status = h_daemon_wait_exit(b, H_RUN_TIMEOUT_MS);
    assert_true(status >= 0);
    assert_int_not_equal(h_exit_code(status), 0);
    log = h_read_file(b->log, NULL);
    snprintf(want, sizeof(want), "another shmbrokerd is listening on %s", a->socket);
    assert_true(h_contains(log, want));
    free(log);

    h_segment_path(a, seg, sizeof(seg));
    assert_true(h_exists(seg));
    assert_true(h_exists(a->socket));
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_int_equal(st.objects, 1);
    h_assert_alive(a);
    assert_int_equal(h_ctl(f, a, NULL, 0, &r, "status", NULL), 0);
    snprintf(want, sizeof(want), "pid %d,", (int)a->pid);
    h_expect_run(&r, 0, want, NULL);
    h_run_free(&r);

    /* Another socket, the same segment name: the live segment is not taken. */
    b = h_daemon_new(f, "2M");
    snprintf(b->name, sizeof(b->name), "%s", a->name);
    assert_true(h_daemon_spawn(f, b, NULL) > 0);
    status = h_daemon_wait_exit(b, H_RUN_TIMEOUT_MS);
    assert_int_not_equal(h_exit_code(status), 0);
    log = h_read_file(b->log, NULL);
    snprintf(want, sizeof(want), "belongs to a running shmbrokerd (pid %d)", (int)a->pid);
    assert_true(h_contains(log, want));
    free(log);
    assert_false(h_exists(b->socket));
    assert_true(h_exists(seg));
    assert_int_equal(shmb_contains(c, "k"), 1);
    shmb_close(c);
    h_pass(f);
}

/* A stale socket file (bound, closed, never unlinked) is replaced with a log
 * line and the new daemon serves; a path that is not a socket is refused and
 * left alone. */
static void test_stale_socket(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "2M"), *e;
    char *log, *content;
    int status;

    make_stale_socket(d->socket);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0)
        h_fail("shmbrokerd did not replace the stale socket %s", d->socket);
    h_assert_alive(d);
    log = h_read_file(d->log, NULL);
    assert_true(h_contains(log, "removed stale socket"));
    free(log);

    e = h_daemon_new(f, "2M");
    assert_int_equal(h_write_file(e->socket, "not a socket", 12), 0);
    assert_true(h_daemon_spawn(f, e, NULL) > 0);
    status = h_daemon_wait_exit(e, H_RUN_TIMEOUT_MS);
    assert_int_not_equal(h_exit_code(status), 0);
    log = h_read_file(e->log, NULL);
    assert_true(h_contains(log, "exists and is not a socket"));
    free(log);
    content = h_read_file(e->socket, NULL);
    assert_string_equal(content, "not a socket");
    free(content);
    h_pass(f);
}

/* A daemon killed with SIGKILL leaves its segment and socket; a new daemon
 * with the same --name and --socket and --fresh replaces both (with a log
 * line naming the dead pid) and serves a fresh, empty segment. Without
 * --fresh it adopts the segment instead (test_restart_adopts). */
static void test_stale_segment(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *a = h_daemon_start(f, "2M", NULL), *b;
    char seg[PATH_MAX * 2], want[PATH_MAX * 3];
    shmb_stats_t st;
    pid_t dead = a->pid;
    shmb_t *c = connect_to(a);
    char *log;

    assert_int_equal(shmb_put(c, "old", "v", 1, 0), 0);
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(a, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    h_segment_path(a, seg, sizeof(seg));
    assert_true(h_exists(seg));
    assert_true(h_exists(a->socket));

    b = h_daemon_new(f, "2M");
    snprintf(b->socket, sizeof(b->socket), "%s", a->socket);
    snprintf(b->name, sizeof(b->name), "%s", a->name);
    {
        const char *const fresh[] = {"--fresh", NULL};

        assert_true(h_daemon_spawn(f, b, fresh) > 0);
    }
    if (h_daemon_wait_ready(b, H_READY_TIMEOUT_MS) < 0)
        h_fail("shmbrokerd did not replace the stale segment %s", seg);
    c = connect_to(b);
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_int_equal(st.pid, b->pid);
    assert_int_equal(st.objects, 0);
    assert_int_equal(shmb_contains(c, "old"), 0);
    assert_int_equal(shmb_put(c, "new", "v", 1, 0), 0);
    shmb_close(c);
    log = h_read_file(b->log, NULL);
    snprintf(want, sizeof(want),
             "removed segment %s left by shmbrokerd pid %d, which is gone (--fresh)", seg,
             (int)dead);
    assert_true(h_contains(log, want));
    assert_true(h_contains(log, "removed stale socket"));
    free(log);
    h_pass(f);
}

/* Invalid flags exit 2 with a message that names the flag, and create
 * nothing. */
static void test_bad_flags(void **state)
{
    static const struct {
        const char *flag, *value, *message;
    } bad[] = {
        {"--size", "abc", "Invalid --size 'abc': expected bytes with an optional K, M or G"},
        {"--size", "12X", "Invalid --size '12X'"},
        {"--max-object-size", "-5", "Invalid --max-object-size '-5'"},
        {"--socket-mode", "999", "Invalid --socket-mode '999': expected an octal mode up to "
                                 "0777"},
        {"--log-level", "loud", "Invalid --log-level 'loud': expected error, warn, info or "
                                "debug."},
        {"--bogus", NULL, "Unknown or incomplete option '--bogus'. Try --help."},
        {"stray", NULL, "Unexpected argument 'stray'. Try --help."},
        {"--name", "", "--name must not be empty."},
    };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "2M"); /* never started: names only */
    char seg[PATH_MAX * 2];
    struct h_run r;
    size_t i;

    h_segment_path(d, seg, sizeof(seg));
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *args[] = {"--socket", d->socket, "--name", d->name, bad[i].flag,
                              bad[i].value, NULL};

        run_daemon(f, &r, args);
        if (r.status != 2 || !h_contains(r.err, bad[i].message) ||
            strncmp(r.err, "shmbrokerd: ", 12) != 0) {
            h_run_dump(bad[i].flag, &r);
            h_fail("%s %s: expected exit 2 and \"%s\"", bad[i].flag,
                   bad[i].value ? bad[i].value : "", bad[i].message);
        }
        h_run_free(&r);
        assert_false(h_exists(d->socket));
        assert_false(h_exists(seg));
    }
    h_pass(f);
}

/* --help lists every flag and exits 0; --version prints the version. Both
 * get a private socket and name, so that a broken flag cannot make a daemon
 * start on the defaults. */
static void test_help_version(void **state)
{
    static const char *const flags[] = {
        "--size BYTES", "--max-object-size BYTES", "--name NAME", "--shm-dir DIR",
        "--socket PATH", "--socket-mode MODE", "--log-level LEVEL", "--version", "--help",
    };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "2M"); /* never started: names only */
    const char *help[] = {"--socket", d->socket, "--name", d->name, "--help", NULL};
    const char *version[] = {"--socket", d->socket, "--name", d->name, "--version", NULL};
    struct h_run r;
    char want[64];
    size_t i;

    run_daemon(f, &r, help);
    h_expect_run(&r, 0, "Usage: shmbrokerd [OPTION]...", NULL);
    for (i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
        h_expect_run(&r, 0, flags[i], NULL);
    assert_int_equal(r.err_len, 0);
    h_run_free(&r);

    run_daemon(f, &r, version);
    snprintf(want, sizeof(want), "shmbrokerd %s (protocol 1)\n", SHMB_VERSION);
    h_expect_run(&r, 0, NULL, NULL);
    assert_string_equal(r.out, want);
    h_run_free(&r);
    assert_false(h_exists(d->socket));
    h_pass(f);
}

/* --socket-mode sets the socket's mode (default 0660), and a missing parent
 * directory of --socket is created. */
static void test_socket_mode_and_parent(void **state)
{
    static const char *const mode[] = {"--socket-mode", "0600", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "2M", NULL), *e;
    struct stat st;

    assert_int_equal(stat(d->socket, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0660);

    e = h_daemon_new(f, "2M");
    snprintf(e->socket, sizeof(e->socket), "%s/run/sub/e.sock", f->dir);
    assert_true(h_daemon_spawn(f, e, mode) > 0);
    if (h_daemon_wait_ready(e, H_READY_TIMEOUT_MS) < 0)
        h_fail("shmbrokerd did not listen on %s", e->socket);
    assert_int_equal(stat(e->socket, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    h_assert_alive(e);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_status),
        TEST(test_status_json),
        TEST(test_put_get_file),
        TEST(test_put_stdin),
        TEST(test_ls),
        TEST(test_rm_and_errors),
        TEST(test_usage),
        TEST(test_no_daemon),
        TEST(test_tmpfs_too_small),
        TEST(test_tmpfs_reserved),
        TEST(test_signal_cleanup),
        TEST(test_second_daemon),
        TEST(test_stale_socket),
        TEST(test_stale_segment),
        TEST(test_bad_flags),
        TEST(test_help_version),
        TEST(test_socket_mode_and_parent),
    };

    return cmocka_run_group_tests_name("test_ctl", tests, NULL, NULL);
}
