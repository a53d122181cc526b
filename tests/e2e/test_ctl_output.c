// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of what shmbrokerctl prints and how it exits: keys and
 * client names from other clients are escaped in every human-facing table
 * (no terminal codes, no forged rows) while --json stays exact JSON; keys the
 * ctl refuses itself are usage errors (exit 2); status --watch writes no
 * terminal codes into a pipe and exits 69 when the daemon goes away; with
 * pools, status, ls, clients and --prometheus show each pool, or the one
 * --pool names.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* A key that clears the screen, sets the window title and forges a row. */
#define EVIL_KEY "\x1b[2J\x1b]0;owned\a\nfake-line"
#define EVIL_KEY_ESCAPED "\\x1b[2J\\x1b]0;owned\\x07\\x0afake-line"
#define EVIL_NAME "\x1b[31mred\nforged\x7f"

/* ---- helpers --------------------------------------------------------------- */

/* No byte of s[0..len) is a control byte other than '\n' (ESC, BEL, DEL
 * and the C1 range included), and no line starts with "fake-line" or
 * "forged". */
static void expect_clean(const struct h_run *r, const char *what)
{
    const unsigned char *s = (const unsigned char *)r->out;
    size_t i;

    for (i = 0; i < r->out_len; i++) {
        bool c1 = s[i] == 0xc2 && i + 1 < r->out_len && s[i + 1] >= 0x80 && s[i + 1] < 0xa0;

        if ((s[i] < 0x20 && s[i] != '\n') || s[i] == 0x7f || c1) {
            h_run_dump(what, r);
            h_fail("%s: raw control byte 0x%02x at offset %zu of stdout", what, s[i], i);
        }
    }
    if (strstr(r->out, "\nfake-line") != NULL || strstr(r->out, "\nforged") != NULL) {
        h_run_dump(what, r);
        h_fail("%s: a key or name forged a line", what);
    }
}

/* ---- tests ----------------------------------------------------------------- */

/* ls, status and clients print keys and names escaped; status --json keeps
 * the exact bytes of the key. */
static void test_escaped_tables(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *evil = h_lib_connect(d, EVIL_NAME, 0);
    const void *p;
    size_t len;
    struct h_run r;
    json_t *stats;

    shmb_set_arena(w, 0); /* the pinned object, not an arena, is the blocker */
    ok(w, h_put_pattern(w, EVIL_KEY, 64, 1, 0));
    ok(w, h_put_pattern(w, "plain", 64, 2, 0));
    ok(w, shmb_get(w, EVIL_KEY, &p, &len)); /* pinned: the blocker */

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "ls", NULL), 0);
    h_expect_run(&r, 0, EVIL_KEY_ESCAPED, NULL);
    expect_clean(&r, "ls");
    assert_int_equal(h_count(r.out, "\n"), 3); /* the header and two rows */
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "blocker   '" EVIL_KEY_ESCAPED "'", NULL);
    expect_clean(&r, "status");
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "clients", NULL), 0);
    h_expect_run(&r, 0, "\\x1b[31mred\\x0aforge", NULL); /* cut to 20 bytes */
    expect_clean(&r, "clients");
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--json", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    stats = json_loads(r.out, 0, NULL);
    assert_non_null(stats);
    assert_string_equal(h_str(json_object_get(stats, "blocker"), "key"), EVIL_KEY);
    assert_null(json_object_get(stats, "id"));
    json_decref(stats);
    h_run_free(&r);

    /* The daemon's messages quote keys: escaped too. */
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", EVIL_KEY "-nope", NULL), 0);
    h_expect_run(&r, 1, NULL, "ENOENT");
    assert_null(strchr(r.err, '\x1b'));
    assert_non_null(strstr(r.err, "\\x1b[2J"));
    h_run_free(&r);

    ok(w, shmb_release(w, EVIL_KEY));
    shmb_close(evil);
    shmb_close(w);
    h_pass(f);
}

/* Keys the ctl refuses itself (256 bytes, not UTF-8) and an empty input
 * file are usage errors: exit 2 with the key check's words, nothing sent;
 * local file failures exit 66, 73 or 74, not 1 (the daemon's refusal); and
 * "--" lets a key start with a dash. */
static void test_refused_arguments(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    char long_key[257], empty[PATH_MAX];
    struct h_run r;

    memset(long_key, 'k', 256);
    long_key[256] = '\0';
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "rm", long_key, NULL), 0);
    h_expect_run(&r, 2, NULL, "EINVAL: Key of 256 bytes");
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "bin\xff\xfekey", NULL), 0);
    h_expect_run(&r, 2, NULL, "not valid UTF-8");
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, "x", 1, &r, "put", long_key, "-", NULL), 0);
    h_expect_run(&r, 2, NULL, "Key of 256 bytes");
    h_run_free(&r);
    h_path(f, "empty", empty, sizeof(empty));
    assert_int_equal(h_write_file(empty, "", 0), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", empty, NULL), 0);
    h_expect_run(&r, 2, NULL, "is empty");
    h_run_free(&r);
    /* Local files that fail have sysexits codes of their own, and an input
     * that cannot be read is found before anything is sent. */
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", "/nonexistent/input", NULL), 0);
    h_expect_run(&r, 66, NULL, "cannot open /nonexistent/input");
    h_run_free(&r);
    h_path(f, "adir", empty, sizeof(empty));
    assert_int_equal(mkdir(empty, 0700), 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "put", "k", empty, NULL), 0);
    h_expect_run(&r, 74, NULL, "cannot read");
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, "v", 1, &r, "put", "k", "-", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "k", "/nonexistent/output", NULL), 0);
    h_expect_run(&r, 73, NULL, "cannot open /nonexistent/output");
    h_run_free(&r);
    /* "--" lets a key start with a dash. */
    assert_int_equal(h_ctl(f, d, "dash", 4, &r, "put", "--", "-x", "-", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "get", "--", "-x", NULL), 0);
    h_expect_run(&r, 0, "dash", NULL);
    h_run_free(&r);
    /* The daemon's own refusal is still 1. */
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "rm", "absent", NULL), 0);
    h_expect_run(&r, 1, NULL, "ENOENT");
    h_run_free(&r);
    h_pass(f);
}

/* Stop the daemon (arg) after a moment, while status --watch runs. */
static int stop_daemon_later(void *arg)
{
    const struct h_daemon *d = arg;

    h_sleep_ms(1500);
    return kill(d->pid, SIGTERM) == 0 ? 0 : 1;
}

/* status --watch into a pipe: views one after another without terminal
 * codes; when the daemon goes away, exit 69 with the ctl's own words. */
static void test_watch_pipe_and_exit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct h_run r;
    pid_t helper;

    assert_true((helper = h_fork(f, stop_daemon_later, d)) > 0);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--watch", "1", NULL), 0);
    h_expect_run(&r, 69, "shmbrokerd ", "lost the connection to shmbrokerd");
    expect_clean(&r, "status --watch");
    assert_null(strstr(r.out, "\x1b["));
    assert_null(strstr(r.err, "shmb_reconnect"));
    h_run_free(&r);
    assert_int_equal(h_child_wait(f, helper, 5000), 0);
    h_pass(f);
}

/* The line of text that starts with prefix at or after from, as a pointer,
 * or NULL. */
static const char *line_at(const char *from, const char *prefix)
{
    const char *p = from;

    for (;;) {
        if (strncmp(p, prefix, strlen(prefix)) == 0)
            return p;
        p = strchr(p, '\n');
        if (p == NULL)
            return NULL;
        p++;
    }
}

/* Whether line was found, before end (in the section that ends there). */
static bool before(const char *line, const char *end)
{
    return line != NULL && line < end;
}

/* Pools: status shows every pool in order, each with its bar, objects and
 * blocker; status --pool NAME (or --pool NAME status) one; an unknown pool
 * is the daemon's refusal (exit 1) listing its pools; --prometheus labels a
 * pool's figures pool="NAME" and the daemon's not; ls and clients follow
 * --pool and show the pool. A daemon of one pool keeps its old views. */
static void test_pool_views(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "alpha:2M", "--pool", "beta:3M", NULL});
    struct h_daemon *one;
    shmb_t *b = shmb_new();
    const char *alpha, *beta;
    const void *p;
    size_t len;
    struct h_run r;

    shmb_set_pool(b, "beta");
    if (shmb_connect(b, d->socket, "in-beta") != 0)
        h_fail("connect to pool beta: %s", shmb_errmsg(b));
    shmb_set_arena(b, 0); /* the pinned object, not an arena, is the blocker */
    ok(b, h_put_pattern(b, "held", 64, 1, 0));
    ok(b, shmb_get(b, "held", &p, &len)); /* pinned: beta's blocker */

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "clients   2 in all, 2 pools", NULL);
    alpha = line_at(r.out, "pool      alpha (shm)");
    beta = line_at(r.out, "pool      beta (shm)");
    if (alpha == NULL || beta == NULL || beta < alpha || h_count(r.out, "\nused      [") != 2 ||
        h_count(r.out, "\nobjects   ") != 2 || h_count(r.out, "\nblocker   ") != 2 ||
        !before(line_at(alpha, "blocker   none"), beta) ||
        line_at(beta, "blocker   'held'") == NULL ||
        line_at(beta, "objects   1 committed") == NULL ||
        !before(line_at(alpha, "objects   0 committed"), beta)) {
        h_run_dump("status", &r);
        h_fail("status does not show pools alpha then beta, each with its figures");
    }
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--pool", "beta", NULL), 0);
    h_expect_run(&r, 0, "pool      beta (shm)", NULL);
    if (h_contains(r.out, "alpha") || h_count(r.out, "\nused      [") != 1 ||
        !h_contains(r.out, "\nblocker   'held'")) {
        h_run_dump("status --pool beta", &r);
        h_fail("status --pool beta shows other than pool beta");
    }
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "--pool", "beta", "status", NULL), 0);
    h_expect_run(&r, 0, "blocker   'held'", NULL);
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--pool", "gamma", NULL), 0);
    h_expect_run(&r, 1, NULL, "gamma");
    if (!h_contains(r.err, "alpha") || !h_contains(r.err, "beta")) {
        h_run_dump("status --pool gamma", &r);
        h_fail("the refusal of pool gamma does not list the pools");
    }
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "--pool", "gamma", "ls", NULL), 0);
    h_expect_run(&r, 1, NULL, "alpha");
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "--pool", "beta", "ls", NULL), 0);
    h_expect_run(&r, 0, "\nheld ", NULL);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "ls", NULL), 0);
    h_expect_run(&r, 0, NULL, NULL);
    assert_int_equal(h_count(r.out, "\n"), 1); /* alpha's: the header alone */
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--prometheus", NULL), 0);
    h_expect_run(&r, 0, "\nshmbroker_objects{pool=\"alpha\"} 0\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_objects{pool=\"beta\"} 1\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_pinned_objects{pool=\"beta\"} 1\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_commits_total{pool=\"beta\"} 1\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_commits_total{pool=\"alpha\"} 0\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_pool_clients{pool=\"beta\"} 1\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_clients 2\n", NULL);
    h_expect_run(&r, 0, "\nshmbroker_uptime_seconds ", NULL);
    assert_int_equal(h_count(r.out, "\nshmbroker_objects{"), 2);
    h_run_free(&r);
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--pool", "beta", "--prometheus",
                           NULL), 0);
    h_expect_run(&r, 0, "\nshmbroker_objects{pool=\"beta\"} 1\n", NULL);
    if (h_contains(r.out, "alpha")) {
        h_run_dump("status --pool beta --prometheus", &r);
        h_fail("status --pool beta --prometheus shows pool alpha");
    }
    h_run_free(&r);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "clients", NULL), 0);
    h_expect_run(&r, 0, " POOL ", NULL);
    if (!h_contains(r.out, "in-beta              beta ") ||
        !h_contains(r.out, "shmbrokerctl         alpha ")) {
        h_run_dump("clients", &r);
        h_fail("clients does not show each connection's pool");
    }
    h_run_free(&r);
    ok(b, shmb_release(b, "held"));
    shmb_close(b);

    /* One pool: no pool line, no POOL column, as before pools. */
    one = h_daemon_start(f, "1M", NULL);
    assert_int_equal(h_ctl(f, one, NULL, 0, &r, "status", NULL), 0);
    h_expect_run(&r, 0, "\nclients   1\n", NULL);
    if (h_contains(r.out, "pool") || h_count(r.out, "\nused      [") != 1) {
        h_run_dump("status of one pool", &r);
        h_fail("status of a daemon of one pool is not the view it always was");
    }
    h_run_free(&r);
    assert_int_equal(h_ctl(f, one, NULL, 0, &r, "clients", NULL), 0);
    h_expect_run(&r, 0, "CONNECTED SINCE", NULL);
    assert_false(h_contains(r.out, "POOL"));
    h_run_free(&r);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_escaped_tables),
        TEST(test_refused_arguments),
        TEST(test_watch_pipe_and_exit),
        TEST(test_pool_views),
    };

    return cmocka_run_group_tests_name("test_ctl_output", tests, NULL, NULL);
}
