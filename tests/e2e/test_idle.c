// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of an idle daemon: it sleeps until there is something to
 * do. The expiry of --alloc-timeout wakes it only while an allocation is
 * pending, at that allocation's deadline, not on a fixed tick.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "harness.h"

/* The voluntary context switches of pid's main thread so far: each time the
 * daemon's loop sleeps and is woken counts one. -1 when unknown. */
static long long wakeups(pid_t pid)
{
    char path[64], *text, *at;
    long long n = -1;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    text = h_read_file(path, NULL);
    at = text != NULL ? strstr(text, "voluntary_ctxt_switches:") : NULL;
    if (at != NULL && (at == text || at[-1] == '\n'))
        n = strtoll(at + strlen("voluntary_ctxt_switches:"), NULL, 10);
    free(text);
    return n;
}

/* How many times pid is woken in ms milliseconds. */
static long long wakeups_during(pid_t pid, int ms)
{
    long long before = wakeups(pid), after;

    assert_true(before >= 0);
    h_sleep_ms(ms);
    after = wakeups(pid);
    assert_true(after >= before);
    return after - before;
}

/* What pending_gone polls. */
struct pending_wait {
    struct h_conn *c;
};

/* h_eventually callback: stats says nothing is pending. */
static bool pending_gone(void *arg)
{
    struct pending_wait *w = arg;
    json_t *reply = h_call(w->c, "{\"op\":\"stats\"}");
    bool gone = h_int(reply, "pending") == 0;

    json_decref(reply);
    return gone;
}

/* With --alloc-timeout 40ms (which ticked every 10 ms: about 200 wake-ups in
 * 2 s) an idle daemon, one that has served a put and holds a connection, is
 * not woken at all in 2 s: nothing can expire. An allocation left pending is
 * still dropped at its deadline (within a generous 5 s), twice in a row (the
 * timer is armed again after it fired), and the daemon sleeps again after. */
static void test_idle_not_woken(void **state)
{
    struct h_fix *f = *state;
    const char *const extra[] = {"--alloc-timeout", "40ms", NULL};
    struct h_daemon *d = h_daemon_start(f, "1M", extra);
    struct h_conn c;
    struct pending_wait w = {&c};
    long long n;
    int i;

    json_decref(h_open_hello(&c, d));
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"a\"}");
    h_sleep_ms(100);
    n = wakeups_during(d->pid, 2000);
    if (n >= 10)
        h_fail("an idle daemon was woken %lld times in 2 s", n);

    for (i = 0; i < 2; i++) {
        h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":100}");
        if (!h_eventually(pending_gone, &w, 5000))
            h_fail("a pending allocation was not dropped within 5 s of its 40 ms "
                   "--alloc-timeout");
        h_expect_error(&c, "{\"op\":\"commit\",\"key\":\"b\"}", "ETIMEDOUT", NULL);
    }
    h_sleep_ms(100);
    n = wakeups_during(d->pid, 2000);
    if (n >= 10)
        h_fail("the daemon was woken %lld times in 2 s after the expiries", n);
    h_conn_close(&c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_idle_not_woken),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_idle", tests, NULL, NULL);
}
