// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the --config reader, at start-up and on SIGHUP: only a
 * regular file of bounded size, read whole, with over-long lines refused by
 * number, no cap on the number of settings, and a reload that applies a file
 * completely or not at all.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Start a daemon with --config path and expect it to refuse within 5 s (a
 * generous bound: it used to hang), exit 2, and log want. */
#define expect_refused(f, path, want) expect_refused_at((f), (path), (want), __FILE__, __LINE__)
/* The body of expect_refused(). */
static void expect_refused_at(struct h_fix *f, const char *path, const char *want,
                              const char *file, int line)
{
    struct h_daemon *d = h_daemon_new(f, "1M");
    int status;
    char *log;

    if (h_daemon_spawn(f, d, (const char *const[]){"--config", path, NULL}) <= 0)
        h_fail_at(file, line, "cannot start shmbrokerd");
    status = h_daemon_wait_exit(d, 5000);
    if (status == -1)
        h_fail_at(file, line, "shmbrokerd --config %s did not exit within 5 s", path);
    log = h_log_text(d);
    if (h_exit_code(status) != 2 || !h_contains(log, want)) {
        h_daemon_print_log(d);
        free(log);
        h_fail_at(file, line, "shmbrokerd --config %s: exit %d, want 2 and '%s'", path,
                  h_exit_code(status), want);
    }
    free(log);
}

/* A FIFO, /dev/zero and a directory are refused at once with a message
 * saying what they are: the FIFO used to block in fopen, /dev/zero to loop
 * forever, the directory to read as an empty file. */
static void test_config_not_a_file(void **state)
{
    struct h_fix *f = *state;
    char fifo[PATH_MAX];

    h_path(f, "fifo", fifo, sizeof(fifo));
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_refused(f, fifo, "is not a regular file");
    expect_refused(f, "/dev/zero", "is not a regular file");
    expect_refused(f, f->dir, "is a directory");
    h_pass(f);
}

/* A line longer than the limit is refused with its number; it used to be
 * split, and the tail of a comment was parsed as a setting. */
static void test_config_long_line(void **state)
{
    struct h_fix *f = *state;
    char path[PATH_MAX], *text;
    size_t n = 0;

    text = malloc(8192);
    assert_non_null(text);
    n += (size_t)sprintf(text, "log-level = info\n#");
    memset(text + n, 'x', 4222);
    n += 4222;
    n += (size_t)sprintf(text + n, "max-clients = 5\n");
    h_path(f, "long.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, text, n), 0);
    free(text);
    expect_refused(f, path, "long.conf:2: the line is 4238 bytes long; a line may have "
                            "at most 4224");
    h_pass(f);
}

/* 1,100 settings are read (the reader used to fail at the 1,024th with "out
 * of memory"), and a file over the size limit is refused, naming it. */
static void test_config_sizes(void **state)
{
    struct h_fix *f = *state;
    static const char setting[] = "log-level = info\n";
    static const char comment[] = "# a comment line of sixty-four bytes, padded out to that length\n";
    char path[PATH_MAX];
    char *text = malloc(2 * 1024 * 1024 + 64);
    struct h_daemon *d;
    size_t n = 0, i;

    assert_non_null(text);
    for (i = 0; i < 1100; i++, n += sizeof(setting) - 1)
        memcpy(text + n, setting, sizeof(setting) - 1);
    h_path(f, "many.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, text, n), 0);
    d = h_daemon_new(f, "1M");
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--config", path, NULL}) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd did not start with 1100 settings");
    }
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);

    for (n = 0; n < 2 * 1024 * 1024; n += sizeof(comment) - 1)
        memcpy(text + n, comment, sizeof(comment) - 1);
    h_path(f, "big.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, text, n), 0);
    free(text);
    expect_refused(f, path, "a settings file may have at most 1048576");
    h_pass(f);
}

/* Point link at target, send SIGHUP, wait (5 s) for its outcome in the log,
 * and check the daemon still answers. */
static void hup(const struct h_daemon *d, const char *link, const char *target)
{
    char tmp[PATH_MAX + 8];

    snprintf(tmp, sizeof(tmp), "%s.new", link);
    unlink(tmp);
    assert_int_equal(symlink(target, tmp), 0);
    assert_int_equal(rename(tmp, link), 0);
    h_reload(d);
    h_assert_alive(d);
}

/* A reload applies a file whole or not at all. A file cut short in the
 * middle of a line (as an in-place rewrite is seen half-way) and an empty
 * one (just truncated) change nothing and are logged; they used to be
 * applied, reverting max-clients. A FIFO, /dev/zero and a directory are
 * refused at once, the daemon keeps answering (/dev/zero used to spin it
 * forever, the FIFO to block it). A complete file is then applied. */
static void test_config_reload(void **state)
{
    struct h_fix *f = *state;
    static const char good[] = "max-clients = 777\nallow-uid = 0\n";
    static const char cut[] = "max-clients = 77";
    static const char next[] = "max-clients = 555\n";
    char link[PATH_MAX], good_path[PATH_MAX], cut_path[PATH_MAX], empty_path[PATH_MAX],
        next_path[PATH_MAX], fifo[PATH_MAX];
    struct h_daemon *d;
    char *log;

    h_path(f, "shmbrokerd.conf", link, sizeof(link));
    h_path(f, "good.conf", good_path, sizeof(good_path));
    h_path(f, "cut.conf", cut_path, sizeof(cut_path));
    h_path(f, "empty.conf", empty_path, sizeof(empty_path));
    h_path(f, "next.conf", next_path, sizeof(next_path));
    h_path(f, "fifo", fifo, sizeof(fifo));
    assert_int_equal(h_write_file(good_path, good, strlen(good)), 0);
    assert_int_equal(h_write_file(cut_path, cut, strlen(cut)), 0);
    assert_int_equal(h_write_file(empty_path, "", 0), 0);
    assert_int_equal(h_write_file(next_path, next, strlen(next)), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(symlink(good_path, link), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", link, NULL});

    hup(d, link, good_path);
    hup(d, link, cut_path);
    hup(d, link, empty_path);
    hup(d, link, "/dev/zero");
    hup(d, link, fifo);
    hup(d, link, f->dir);
    log = h_log_text(d);
    if (h_count(log, "settings reloaded (") != 1 || h_contains(log, "max-clients 77,") ||
        h_contains(log, "max-clients 1024,") ||
        h_count(log, "settings not reloaded, nothing changed") != 5 ||
        !h_contains(log, "shmbrokerd.conf:1: the last line does not end with a newline") ||
        !h_contains(log, "is empty") || !h_contains(log, "is not a regular file") ||
        !h_contains(log, "is a directory")) {
        free(log);
        h_daemon_print_log(d);
        h_fail("a reload that should have changed nothing did, or was not logged");
    }
    free(log);
    hup(d, link, next_path);
    log = h_log_text(d);
    if (!h_contains(log, "max-clients 555,")) {
        free(log);
        h_daemon_print_log(d);
        h_fail("a complete file was not applied");
    }
    free(log);
    h_pass(f);
}

/* The impostor of test_reload_memfd_impostor: a process that calls itself
 * shmbrokerd and holds a memfd named as the daemon's segment (anyone can
 * make one), waiting. SIGHUP's default action would end it. */
static int memfd_impostor(void *arg)
{
    if (memfd_create(arg, MFD_CLOEXEC) < 0 ||
        prctl(PR_SET_NAME, "shmbrokerd", 0, 0, 0) != 0)
        return 1;
    for (;;)
        pause();
    return 0;
}

/* Run shmbrokerd --config conf --reload pid with d's socket, name and
 * directory, as systemd's ExecReload does. */
static void run_reload(struct h_fix *f, const struct h_daemon *d, const char *conf,
                       pid_t pid, struct h_run *r)
{
    char pid_text[32];

    snprintf(pid_text, sizeof(pid_text), "%d", (int)pid);
    assert_int_equal(
        h_run(f,
              (const char *const[]){h_daemon_bin(), "--socket", d->socket, "--name",
                                    d->name, "--shm-dir", d->shm_dir, "--config", conf,
                                    "--reload", pid_text, NULL},
              NULL, 0, r),
        0);
}

/* Issue 24: when the first pool is a memfd, --reload PID is not fooled by a
 * process that names itself shmbrokerd and holds a memfd named like the
 * segment: it is refused with a message saying why, nothing is sent (the
 * impostor lives), the daemon's settings stay. The daemon itself still
 * reloads. */
static void test_reload_memfd_impostor(void **state)
{
    struct h_fix *f = *state;
    static const char before[] = "pool = mem:4M,backing=memfd\nmax-clients = 5\n";
    static const char after[] = "pool = mem:4M,backing=memfd\nmax-clients = 3\n";
    char conf[PATH_MAX], segment[128];
    struct h_daemon *d;
    struct h_run r;
    pid_t impostor;
    char *log;

    h_path(f, "memfd.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, before, strlen(before)), 0);
    d = h_daemon_start(f, "4M", (const char *const[]){"--config", conf, NULL});
    snprintf(segment, sizeof(segment), "%s.mem", d->name);
    impostor = h_fork(f, memfd_impostor, segment);
    assert_true(impostor > 0);
    h_sleep_ms(200); /* it has its memfd and its name */
    assert_int_equal(h_write_file(conf, after, strlen(after)), 0);

    run_reload(f, d, conf, impostor, &r);
    h_expect_run(&r, 1, NULL, "does not listen on");
    h_expect_run(&r, 1, NULL, d->socket);
    h_run_free(&r);
    h_sleep_ms(200);
    assert_int_equal(waitpid(impostor, NULL, WNOHANG), 0); /* no SIGHUP reached it */
    log = h_log_text(d);
    if (h_contains(log, "SIGHUP")) {
        free(log);
        h_daemon_print_log(d);
        h_fail("the daemon reloaded for a refused --reload");
    }
    free(log);

    run_reload(f, d, conf, d->pid, &r);
    h_expect_run(&r, 0, "asked to reload", NULL);
    h_run_free(&r);
    h_wait_log(d, "SIGHUP: settings reloaded (log level info, max-clients 3,");
    h_child_kill(f, impostor, SIGKILL);
    h_assert_alive(d);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_config_not_a_file),
        TEST(test_config_long_line),
        TEST(test_config_sizes),
        TEST(test_config_reload),
        TEST(test_reload_memfd_impostor),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_config", tests, NULL, NULL);
}
