// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of a library handle across fork(): the child shares the
 * parent's socket, so a call on the inherited handle would interleave its
 * requests and replies with the parent's and take another key's extent. The
 * library refuses every such call in the child with ECHILD, before anything
 * is sent, and says to connect a new handle there.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* How many gets each side makes in the concurrent case. */
#define FORK_ROUNDS 2000

/* What a helper process gets: the parent's handle and a way to start. */
struct fork_arg {
    shmb_t *c;
    const struct h_daemon *d;
    struct h_signal go;
};

/* rc and the handle's error are the fork refusal: ECHILD, and a message
 * that names fork() and says what to do. Reports on stderr (no cmocka in a
 * helper); true when it is. */
static bool refused_in_child(shmb_t *c, int rc, const char *what)
{
    const char *msg = shmb_errmsg(c);

    if (rc == -ECHILD && shmb_errcode(c) == -ECHILD &&
        strcmp(shmb_errname(c), "ECHILD") == 0 && strstr(msg, "fork()") != NULL &&
        strstr(msg, "connect a new handle") != NULL)
        return true;
    fprintf(stderr, "child: %s on the inherited handle returned %d (%s: %s); expected the "
                    "ECHILD fork refusal\n",
            what, rc, shmb_errname(c), msg);
    return false;
}

/* The helper of the concurrent case: FORK_ROUNDS gets of fork-b on the
 * parent's handle, while the parent gets fork-a on it. */
static int child_gets_on_inherited(void *arg)
{
    struct fork_arg *a = arg;
    int i;

    if (!h_signal_wait(&a->go, H_REPLY_TIMEOUT_MS))
        return 90;
    for (i = 0; i < FORK_ROUNDS; i++) {
        const void *p = NULL;
        size_t len = 0;
        int rc = shmb_get(a->c, "fork-b", &p, &len);

        if (!refused_in_child(a->c, rc, "shmb_get") || p != NULL || len != 0) {
            fprintf(stderr, "child: round %d of %d\n", i, FORK_ROUNDS);
            return 1;
        }
    }
    return 0;
}

/* The reproduction: parent and child both get on the handle the
 * parent connected. The child is refused at once, every time; the parent
 * gets its own key's bytes every time, and its connection is not disturbed. */
static void test_child_refused_parent_unharmed(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "parent", 0);
    struct fork_arg a;
    pid_t pid;
    int i, code;

    ok(c, h_put_pattern(c, "fork-a", 4000, 1, 0));
    ok(c, h_put_pattern(c, "fork-b", 3000, 2, 0));
    a.c = c;
    a.d = d;
    h_signal_open(&a.go);
    pid = h_fork(f, child_gets_on_inherited, &a);
    assert_true(pid > 0);
    h_signal_notify(&a.go);
    for (i = 0; i < FORK_ROUNDS; i++) {
        const void *p;
        size_t len;

        ok(c, shmb_get(c, "fork-a", &p, &len));
        if (len != 4000 || h_check(p, len, 1) != len)
            h_fail("round %d: the parent's get of fork-a returned %zu bytes that are not "
                   "fork-a's",
                   i, len);
        ok(c, shmb_release(c, "fork-a"));
    }
    code = h_child_wait(f, pid, 60000);
    h_signal_close(&a.go);
    assert_int_equal(code, 0);
    shmb_close(c);
    h_pass(f);
}

/* The helper of the every-call case: each call that talks to the daemon is
 * refused on the inherited handle; then the child closes it (which leaves
 * the parent's connection alone) and connects a handle of its own, which
 * works. */
static int child_every_call(void *arg)
{
    struct fork_arg *a = arg;
    shmb_t *c = a->c, *mine;
    const char *keys[2] = {"fork-a", "fork-new"};
    const void *data[2] = {"x", "y"}, *ptrs[2], *p = NULL;
    size_t sizes[2] = {1, 1}, len = 0;
    int results[2], bad = 0;
    void *dst = NULL;
    char *reply = NULL;
    shmb_stats_t st;

#define CHILD_REFUSED(call) bad += !refused_in_child(c, (call), #call)
    CHILD_REFUSED(shmb_get(c, "fork-a", &p, &len));
    CHILD_REFUSED(shmb_release(c, "fork-a"));
    CHILD_REFUSED(shmb_release_nowait(c, "fork-a"));
    CHILD_REFUSED(shmb_alloc(c, "fork-new", 8, 0, &dst));
    CHILD_REFUSED(shmb_commit(c, "fork-new"));
    CHILD_REFUSED(shmb_abort(c, "fork-new"));
    CHILD_REFUSED(shmb_put(c, "fork-new", "x", 1, 0));
    CHILD_REFUSED(shmb_put_many(c, 2, keys, data, sizes, 0, results));
    CHILD_REFUSED(shmb_get_many(c, 2, keys, ptrs, sizes, results));
    CHILD_REFUSED(shmb_release_many(c, 2, keys));
    CHILD_REFUSED(shmb_touch(c, "fork-a", 1));
    CHILD_REFUSED(shmb_delete(c, "fork-a"));
    CHILD_REFUSED(shmb_contains(c, "fork-a"));
    CHILD_REFUSED(shmb_stats(c, &st));
    CHILD_REFUSED(shmb_request(c, "{\"op\":\"stats\"}", &reply));
    CHILD_REFUSED(shmb_reconnect(c));
    CHILD_REFUSED(shmb_connect(c, a->d->socket, "child"));
#undef CHILD_REFUSED
    if (bad != 0 || p != NULL || dst != NULL || reply != NULL)
        return 1;
    shmb_close(c);
    mine = shmb_new();
    if (mine == NULL || shmb_connect(mine, a->d->socket, "child") != 0 ||
        shmb_get(mine, "fork-a", &p, &len) != 0 || len != 4000 || h_check(p, len, 1) != len ||
        shmb_release(mine, "fork-a") != 0) {
        fprintf(stderr, "child: a new handle failed: %s: %s\n",
                mine ? shmb_errname(mine) : "ENOMEM", mine ? shmb_errmsg(mine) : "");
        shmb_close(mine);
        return 2;
    }
    shmb_close(mine);
    return 0;
}

/* Every call on the inherited handle is refused in the child, nothing of it
 * reaches the daemon (the parent's pin and its counters are as they were),
 * and closing it in the child does not close the parent's connection. */
static void test_every_call_refused(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "parent", 0);
    shmb_stats_t before, after;
    struct fork_arg a;
    const void *p;
    size_t len;
    pid_t pid;

    ok(c, h_put_pattern(c, "fork-a", 4000, 1, 0));
    ok(c, shmb_get(c, "fork-a", &p, &len)); /* a pin the parent holds across fork */
    ok(c, shmb_stats(c, &before));
    a.c = c;
    a.d = d;
    h_signal_open(&a.go);
    pid = h_fork(f, child_every_call, &a);
    assert_true(pid > 0);
    assert_int_equal(h_child_wait(f, pid, 30000), 0);
    h_signal_close(&a.go);
    ok(c, shmb_stats(c, &after));
    /* The child's own handle made one get; the inherited one none. */
    assert_int_equal(after.gets, before.gets + 1);
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(after.pinned, 1);
    assert_int_equal(shmb_contains(c, "fork-new"), 0);
    assert_int_equal(h_check(p, len, 1), len);
    ok(c, shmb_release(c, "fork-a"));
    ok(c, shmb_get(c, "fork-a", &p, &len));
    ok(c, shmb_release(c, "fork-a"));
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_child_refused_parent_unharmed),
        TEST(test_every_call_refused),
    };

    return cmocka_run_group_tests_name("test_fork", tests, NULL, NULL);
}
