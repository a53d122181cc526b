// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the library under threads: one handle per thread is
 * the contract, and must be free of data races (make test also runs this
 * program built with ThreadSanitizer); two threads on one handle is a misuse
 * that must fail loudly with EBUSY, never mix their replies, crash or hang.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

#define THREADS 4
#define THREAD_ROUNDS 300
/* Rounds of each thread when two share one handle. */
#define SHARED_ROUNDS 3000
#define OBJ_SIZE 1000

/* One worker: what it was given and how it went (no cmocka in a thread). */
struct worker {
    pthread_t tid;
    const struct h_daemon *d;
    shmb_t *c; /* its own handle, or the shared one */
    int index;
    char failure[1200]; /* "" when it went well */
    unsigned long busy; /* EBUSY refusals seen */
};

/* Join tid within ms milliseconds (a misused handle could hang a thread);
 * fails the test when it does not end. */
static void join_within(pthread_t tid, int ms)
{
    struct timespec until;
    int rc;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    rc = pthread_timedjoin_np(tid, NULL, &until);
    if (rc != 0)
        h_fail("a thread did not finish within %d ms (%s)", ms, strerror(rc));
}

/* Record the first failure of a worker; returns NULL for the thread. */
static void *worker_failed(struct worker *w, const char *what, int rc)
{
    if (w->failure[0] == '\0')
        snprintf(w->failure, sizeof(w->failure), "thread %d: %s returned %d (%s: %s)",
                 w->index, what, rc, shmb_errname(w->c), shmb_errmsg(w->c));
    return NULL;
}

/* Its own handle: connect, then put, get, check, release and delete its own
 * keys, then close. */
static void *worker_own_handle(void *arg)
{
    struct worker *w = arg;
    unsigned char buf[OBJ_SIZE];
    int i, rc;

    w->c = shmb_new();
    if (w->c == NULL)
        return worker_failed(w, "shmb_new", -ENOMEM);
    if ((rc = shmb_connect(w->c, w->d->socket, "thread")) != 0)
        return worker_failed(w, "shmb_connect", rc);
    for (i = 0; i < THREAD_ROUNDS; i++) {
        uint32_t seed = (uint32_t)(w->index * 100000 + i);
        char key[64];
        const void *p;
        size_t len;

        snprintf(key, sizeof(key), "t%d-%d", w->index, i);
        h_fill(buf, sizeof(buf), seed);
        if ((rc = shmb_put(w->c, key, buf, sizeof(buf), 0)) != 0)
            return worker_failed(w, "shmb_put", rc);
        if ((rc = shmb_get(w->c, key, &p, &len)) != 0)
            return worker_failed(w, "shmb_get", rc);
        if (len != sizeof(buf) || h_check(p, len, seed) != len)
            return worker_failed(w, "shmb_get (wrong bytes)", 0);
        if ((rc = shmb_release(w->c, key)) != 0)
            return worker_failed(w, "shmb_release", rc);
        if ((rc = shmb_delete(w->c, key)) != 0)
            return worker_failed(w, "shmb_delete", rc);
    }
    shmb_close(w->c);
    w->c = NULL;
    return NULL;
}

/* The allowed use: THREADS threads, a handle each, all at once. Every call
 * succeeds with its own bytes; built with ThreadSanitizer, no race is
 * reported (the library's allocation counters are shared by every handle). */
static void test_handle_per_thread(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    struct worker w[THREADS];
    int i;

    memset(w, 0, sizeof(w));
    for (i = 0; i < THREADS; i++) {
        w[i].d = d;
        w[i].index = i;
        assert_int_equal(pthread_create(&w[i].tid, NULL, worker_own_handle, &w[i]), 0);
    }
    for (i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(w[i].tid, NULL), 0);
    for (i = 0; i < THREADS; i++) {
        if (w[i].c != NULL)
            shmb_close(w[i].c);
        if (w[i].failure[0] != '\0')
            h_fail("%s", w[i].failure);
    }
    h_pass(f);
}

/* A thread that shares its handle: gets of its own key; each must succeed
 * with that key's bytes or be refused with EBUSY (another call is running
 * on the handle), and is then tried again, as is a release. */
static void *worker_shared_handle(void *arg)
{
    struct worker *w = arg;
    char key[32];
    int i, rc;

    snprintf(key, sizeof(key), "shared-%d", w->index);
    for (i = 0; i < SHARED_ROUNDS; i++) {
        const void *p = NULL;
        size_t len = 0;

        while ((rc = shmb_get(w->c, key, &p, &len)) == -EBUSY) {
            w->busy++;
            sched_yield();
        }
        if (rc != 0)
            return worker_failed(w, "shmb_get", rc);
        if (len != OBJ_SIZE || h_check(p, len, (uint32_t)w->index) != len)
            return worker_failed(w, "shmb_get (another key's bytes)", 0);
        while ((rc = shmb_release(w->c, key)) == -EBUSY) {
            w->busy++;
            sched_yield();
        }
        if (rc != 0)
            return worker_failed(w, "shmb_release", rc);
    }
    return NULL;
}

/* Two threads hammering one handle: no call is handed the other's reply, no
 * call fails but with EBUSY, nothing crashes or hangs, and the handle works
 * afterwards. */
static void test_shared_handle_hammered(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "shared", 0);
    struct worker w[2];
    shmb_stats_t st;
    int i;

    memset(w, 0, sizeof(w));
    for (i = 0; i < 2; i++) {
        char key[32];

        snprintf(key, sizeof(key), "shared-%d", i);
        ok(c, h_put_pattern(c, key, OBJ_SIZE, (uint32_t)i, 0));
        w[i].d = d;
        w[i].c = c;
        w[i].index = i;
    }
    for (i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&w[i].tid, NULL, worker_shared_handle, &w[i]), 0);
    for (i = 0; i < 2; i++)
        join_within(w[i].tid, 60000);
    for (i = 0; i < 2; i++)
        if (w[i].failure[0] != '\0')
            h_fail("%s", w[i].failure);
    print_message("EBUSY refusals: %lu and %lu\n", w[0].busy, w[1].busy);
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 0);
    shmb_close(c);
    h_pass(f);
}

/* What the thread that waits inside a call gets. */
struct waiter {
    pthread_t tid;
    shmb_t *c;
    int rc;
    void *dst;
};

/* The thread that waits inside shmb_alloc (it may first find the main
 * thread's get on the handle, and tries again). */
static void *waiter_alloc(void *arg)
{
    struct waiter *a = arg;

    while ((a->rc = shmb_alloc(a->c, "waited", 256 * 1024, 0, &a->dst)) == -EBUSY)
        sched_yield();
    return NULL;
}

/* While one thread waits inside shmb_alloc for room, a second thread's call
 * on the same handle is refused at once with EBUSY and a message that says
 * what happened (read with shmb_errmsg in that thread), instead of sending
 * a request and reading the waiting call's reply. The waiting call is not
 * disturbed: when room is made, it gets its extent. */
static void test_second_thread_refused(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "filler", 0), *c = h_lib_connect(d, "shared", 0);
    struct waiter a;
    char key[32];
    int i, n = 0, rc = 0;
    uint64_t deadline;
    const void *p;
    size_t len;

    /* Fill the segment with objects the filler keeps pinned. */
    for (n = 0; n < 64; n++) {
        snprintf(key, sizeof(key), "fill-%d", n);
        if ((rc = h_put_pattern(w, key, 256 * 1024, (uint32_t)n, 0)) == -ENOSPC)
            break;
        ok(w, rc);
        ok(w, shmb_get(w, key, &p, &len));
    }
    assert_int_equal(rc, -ENOSPC);
    memset(&a, 0, sizeof(a));
    a.c = c;
    shmb_set_alloc_wait(c, 10000);
    assert_int_equal(pthread_create(&a.tid, NULL, waiter_alloc, &a), 0);
    /* Until the waiter is inside its call, a get of an absent key is ENOENT;
     * once it is, EBUSY. Nothing else is right. */
    deadline = h_now_ms() + 10000;
    for (;;) {
        rc = shmb_get(c, "absent", &p, &len);
        if (rc != -ENOENT || h_now_ms() > deadline)
            break;
        h_sleep_ms(5);
    }
    if (rc != -EBUSY || shmb_errcode(c) != -EBUSY ||
        strcmp(shmb_errname(c), "EBUSY") != 0 ||
        strstr(shmb_errmsg(c), "one handle per thread") == NULL) {
        /* Make room so the waiter (if it still waits) returns. */
        for (i = 0; i < n; i++) {
            snprintf(key, sizeof(key), "fill-%d", i);
            shmb_release(w, key);
            shmb_delete(w, key);
        }
        join_within(a.tid, 30000);
        h_fail("a second thread's get returned %d (%s: %s); expected EBUSY at once (the "
               "waiting alloc returned %d)",
               rc, shmb_errname(c), shmb_errmsg(c), a.rc);
    }
    /* Room: the waiting alloc may reclaim the fill as soon as it is
     * released, so a delete may find it gone. */
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "fill-%d", i);
        ok(w, shmb_release(w, key));
        rc = shmb_delete(w, key);
        if (rc != -ENOENT)
            ok(w, rc);
    }
    join_within(a.tid, 30000);
    if (a.rc != 0 || a.dst == NULL)
        h_fail("the waiting alloc returned %d (%s: %s)", a.rc, shmb_errname(c),
               shmb_errmsg(c));
    memset(a.dst, 0x5a, 256 * 1024);
    ok(c, shmb_commit(c, "waited"));
    ok(c, shmb_get(c, "waited", &p, &len));
    assert_int_equal(len, 256 * 1024);
    ok(c, shmb_release(c, "waited"));
    shmb_close(c);
    shmb_close(w);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_handle_per_thread),
        TEST(test_shared_handle_hammered),
        TEST(test_second_thread_refused),
    };

    return cmocka_run_group_tests_name("test_threads", tests, NULL, NULL);
}
