// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the bounds on queues: a pool's count and bytes of
 * queues (one pool cannot take every queue of the daemon, nor commit host
 * memory far beyond what it was given), the lease that deletes a queue
 * nobody holds, and a queue's pages made off the daemon's event loop (other
 * clients are answered while a large queue is created; the creator's later
 * requests wait for its reply, in order; its connection closing or the
 * daemon stopping meanwhile harms nothing).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

/* Send a request and fail the test unless it succeeds. */
static void ok(struct h_conn *c, const char *request)
{
    json_t *reply = h_call(c, request);

    h_assert_reply_at(reply, NULL, NULL, __FILE__, __LINE__);
    json_decref(reply);
}

/* Connect to d and say hello in pool (NULL: the default pool). */
static void hello(struct h_conn *c, const struct h_daemon *d, const char *pool)
{
    char line[128];

    assert_int_equal(h_conn_open(c, d->socket), 0);
    if (pool != NULL)
        snprintf(line, sizeof(line), "{\"op\":\"hello\",\"version\":1,\"pool\":\"%s\"}", pool);
    else
        snprintf(line, sizeof(line), "{\"op\":\"hello\",\"version\":1}");
    ok(c, line);
}

/* Whether d holds a descriptor of the memfd of queue name. */
static bool daemon_holds_queue(const struct h_daemon *d, const char *name)
{
    char dir[64], path[PATH_MAX], target[PATH_MAX], want[96];
    struct dirent *e;
    bool found = false;
    DIR *dp;
    ssize_t n;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)d->pid);
    snprintf(want, sizeof(want), ".q.%s ", name);
    if ((dp = opendir(dir)) == NULL)
        return false;
    while (!found && (e = readdir(dp)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if ((n = readlink(path, target, sizeof(target) - 2)) <= 0)
            continue;
        /* "/memfd:<prefix>.q.<name> (deleted)" */
        target[n] = '\0';
        found = strstr(target, "memfd:") != NULL && strstr(target, want) != NULL;
    }
    closedir(dp);
    return found;
}

/* Whether queue_list, asked on c, lists name. */
static bool listed(struct h_conn *c, const char *name)
{
    json_t *reply = h_call(c, "{\"op\":\"queue_list\"}"), *q;
    bool found = false;
    size_t i;

    h_assert_ok(reply);
    json_array_foreach(json_object_get(reply, "queues"), i, q)
        found |= strcmp(json_string_value(json_object_get(q, "name")), name) == 0;
    json_decref(reply);
    return found;
}

/* Proves that one pool cannot take every queue of the daemon: with two
 * pools and the defaults, a client of pool A is refused with EDQUOT naming
 * the limit and the option that raises it once A holds its share (half of
 * the daemon's 64), and a client of pool B can still create queues. */
static void test_pool_cannot_take_all_queues(void **state)
{
    struct h_fix *f = *state;
    static const char two[] = "pool = a:1M\npool = b:1M\n";
    char conf[PATH_MAX], line[160];
    struct h_daemon *d;
    struct h_conn a, b;
    json_t *reply = NULL;
    int i, made = 0;

    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, two, strlen(two)), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    hello(&a, d, "a");
    for (i = 0; i < 70; i++) {
        snprintf(line, sizeof(line),
                 "{\"op\":\"queue_create\",\"name\":\"q%d\",\"seats\":1,\"slots\":2,"
                 "\"slot_size\":64}",
                 i);
        reply = h_call(&a, line);
        if (!json_is_true(json_object_get(reply, "ok")))
            break;
        json_decref(reply);
        reply = NULL;
        made++;
    }
    assert_non_null(reply);
    h_assert_error(reply, "EDQUOT", "Pool 'a' has 32 queues, its limit");
    assert_non_null(strstr(h_str(reply, "message"), "max-queues="));
    json_decref(reply);
    assert_int_equal(made, 32);
    h_conn_close(&a); /* its queues stay: they are not temporary */
    hello(&b, d, "b");
    ok(&b, "{\"op\":\"queue_create\",\"name\":\"mine\",\"seats\":1,\"slots\":2,"
           "\"slot_size\":64}");
    h_conn_close(&b);
    h_pass(f);
}

/* Proves that a pool's queues may not commit more bytes than its limit:
 * by default the larger of the pool's size and 256 MiB, so a client of a
 * 4 MiB pool cannot make a 320 MiB queue, nor a third of 100 MiB; the
 * refusal is EDQUOT with the numbers and the flag to raise it; a queue past
 * the 1 GiB any queue may have is EINVAL, whatever the pool's bound. */
static void test_bytes_limit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct h_conn c;
    json_t *reply;

    hello(&c, d, NULL);
    reply = h_call(&c, "{\"op\":\"queue_create\",\"name\":\"huge\",\"seats\":1,\"slots\":32,"
                       "\"slot_size\":10485760}");
    h_assert_error(reply, "EDQUOT", "Queue 'huge' needs 335");
    assert_non_null(strstr(h_str(reply, "message"), "268435456"));
    assert_non_null(strstr(h_str(reply, "message"), "--max-queue-bytes"));
    json_decref(reply);
    assert_false(daemon_holds_queue(d, "huge"));
    /* Past the size no queue may have, that is the answer: raising the
     * pool's bound would not help. */
    reply = h_call(&c, "{\"op\":\"queue_create\",\"name\":\"huge\",\"seats\":1,\"slots\":100,"
                       "\"slot_size\":16777216}");
    h_assert_error(reply, "EINVAL", "a queue may have at most 1073741824 bytes");
    json_decref(reply);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"one\",\"seats\":1,\"slots\":10,"
           "\"slot_size\":10485760}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"two\",\"seats\":1,\"slots\":10,"
           "\"slot_size\":10485760}");
    reply = h_call(&c, "{\"op\":\"queue_create\",\"name\":\"three\",\"seats\":1,\"slots\":10,"
                       "\"slot_size\":10485760}");
    h_assert_error(reply, "EDQUOT", "Queue 'three' needs");
    json_decref(reply);
    /* Deleting one makes room again. */
    ok(&c, "{\"op\":\"queue_delete\",\"name\":\"one\"}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"three\",\"seats\":1,\"slots\":10,"
           "\"slot_size\":10485760}");
    h_conn_close(&c);
    h_pass(f);
}

/* Proves that a pool's own max-queues= and max-queue-bytes= (the file's
 * pool lines) bound that pool only, and their refusals name the option. */
static void test_pool_options(void **state)
{
    struct h_fix *f = *state;
    static const char conf_text[] =
        "pool = small:1M,max-queues=2,max-queue-bytes=1M\npool = big:1M\n";
    char conf[PATH_MAX];
    struct h_daemon *d;
    struct h_conn s, b;

    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, conf_text, strlen(conf_text)), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    hello(&s, d, "small");
    ok(&s, "{\"op\":\"queue_create\",\"name\":\"a\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    h_expect_error(&s,
                   "{\"op\":\"queue_create\",\"name\":\"b\",\"seats\":1,\"slots\":2,"
                   "\"slot_size\":1048576}",
                   "EDQUOT", "max-queue-bytes= of pool 'small'");
    ok(&s, "{\"op\":\"queue_create\",\"name\":\"b\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    h_expect_error(&s,
                   "{\"op\":\"queue_create\",\"name\":\"c\",\"seats\":1,\"slots\":2,"
                   "\"slot_size\":64}",
                   "EDQUOT", "max-queues= of pool 'small'");
    /* The same geometry again is found, not counted. */
    ok(&s, "{\"op\":\"queue_create\",\"name\":\"a\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    hello(&b, d, "big");
    ok(&b, "{\"op\":\"queue_create\",\"name\":\"c\",\"seats\":1,\"slots\":2,"
           "\"slot_size\":1048576}");
    h_conn_close(&s);
    h_conn_close(&b);
    h_pass(f);
}

struct lease_wait {
    struct h_conn *c;
    const char *name;
};

static bool gone(void *arg)
{
    struct lease_wait *w = arg;

    return !listed(w->c, w->name);
}

static bool present(void *arg)
{
    struct lease_wait *w = arg;

    return listed(w->c, w->name);
}

struct holds {
    const struct h_daemon *d;
    const char *name;
};

static bool holds(void *arg)
{
    struct holds *h = arg;

    return daemon_holds_queue(h->d, h->name);
}

static bool freed(void *arg)
{
    return !holds(arg);
}

/* Proves the lease: a queue nobody holds (no writer, no live reader seat)
 * for --queue-lease is deleted, logged, and its memory freed (the daemon
 * holds no descriptor of it); one a reader holds stays however long, and
 * goes a lease after the reader leaves. */
static void test_lease(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d =
        h_daemon_start(f, "1M", (const char *const[]){"--queue-lease", "1s", NULL});
    struct h_conn c, member;
    struct lease_wait w = {&c, "idle"};
    struct holds idle = {d, "idle"}, held = {d, "held"};

    hello(&c, d, NULL);
    hello(&member, d, NULL);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"idle\",\"seats\":1,\"slots\":4,"
           "\"slot_size\":65536}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"held\",\"seats\":1,\"slots\":4,"
           "\"slot_size\":65536}");
    ok(&member, "{\"op\":\"queue_open\",\"name\":\"held\",\"role\":\"reader\"}");
    assert_true(daemon_holds_queue(d, "idle"));
    assert_true(h_eventually(gone, &w, 10000));
    h_wait_log(d, "queue 'idle' of pool");
    assert_true(h_log_contains(d, "--queue-lease"));
    /* Its memory is freed off the loop, after it left the list. */
    assert_true(h_eventually(freed, &idle, 10000));
    /* Three leases more: the held one stays. */
    h_sleep_ms(3000);
    assert_true(listed(&c, "held"));
    assert_true(daemon_holds_queue(d, "held"));
    ok(&member, "{\"op\":\"queue_close\",\"name\":\"held\"}");
    w.name = "held";
    assert_true(h_eventually(gone, &w, 10000));
    assert_true(h_eventually(freed, &held, 10000));
    h_conn_close(&member);
    h_conn_close(&c);
    h_pass(f);
}

/* Proves that a queue_create that finds the queue starts its lease again:
 * the process that asked for it opens it next, and must not find it
 * deleted in between. The queue goes a whole lease after that request
 * was sent at the earliest (the daemon's clock is the test's), not a lease
 * after it was made. */
static void test_create_restarts_lease(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d =
        h_daemon_start(f, "1M", (const char *const[]){"--queue-lease", "2s", NULL});
    static const char create[] = "{\"op\":\"queue_create\",\"name\":\"again\",\"seats\":1,"
                                 "\"slots\":4,\"slot_size\":65536}";
    struct h_conn c;
    struct lease_wait w = {&c, "again"};
    uint64_t sent;
    json_t *reply;

    hello(&c, d, NULL);
    ok(&c, create);
    h_sleep_ms(1500);
    sent = h_now_ms();
    reply = h_call(&c, create);
    h_assert_ok(reply);
    assert_false(json_is_true(json_object_get(reply, "created")));
    json_decref(reply);
    assert_true(h_eventually(gone, &w, 10000));
    assert_true(h_now_ms() - sent >= 2000);
    h_conn_close(&c);
    h_pass(f);
}

/* The big queue's request: ~1000 MiB (100 slots of 10 MiB). */
#define BIG_CREATE                                                                        \
    "{\"op\":\"queue_create\",\"name\":\"big\",\"seats\":1,\"slots\":100,"              \
    "\"slot_size\":10485760,\"id\":1}\n{\"op\":\"contains\",\"key\":\"k\",\"id\":2}\n"

/* Whether c has bytes to read now. */
static bool has_input(const struct h_conn *c)
{
    char byte;

    return c->len > 0 || recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* Proves that a large queue's pages are made off the event loop: once the
 * daemon has the queue's memfd (its pages being reserved), another client's
 * request is answered before the creator's reply comes; the creator's
 * request pipelined behind the create is answered after it, in order. A
 * loaded machine may finish the reservation before the test looks: the
 * best of three tries. */
static void test_create_off_loop(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--max-queue-bytes", "2G", NULL});
    struct holds big = {d, "big"};
    struct h_conn a, b;
    json_t *reply;
    int try, before = 0;

    hello(&a, d, NULL);
    hello(&b, d, NULL);
    for (try = 0; try < 3 && before == 0; try++) {
        assert_int_equal(h_conn_send(&a, BIG_CREATE, strlen(BIG_CREATE)), 0);
        assert_true(h_eventually(holds, &big, 60000));
        reply = h_call(&b, "{\"op\":\"contains\",\"key\":\"k\"}");
        h_assert_ok(reply);
        json_decref(reply);
        before += !has_input(&a);
        reply = h_recv_json(&a);
        h_assert_ok(reply);
        assert_int_equal(h_int(reply, "id"), 1);
        assert_true(json_is_true(json_object_get(reply, "created")));
        json_decref(reply);
        reply = h_recv_json(&a);
        assert_int_equal(h_int(reply, "id"), 2);
        json_decref(reply);
        ok(&a, "{\"op\":\"queue_delete\",\"name\":\"big\"}");
        /* The reply comes once its memory is freed. */
        assert_false(daemon_holds_queue(d, "big"));
    }
    assert_int_equal(before, 1);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* Proves that a large queue's memory is freed off the event loop: once the
 * queue has left the set (another client's queue_list no longer shows
 * it), that client is answered while the deleter still waits for its
 * reply, which comes once the memory is freed. The best of three tries, as
 * above. */
static void test_delete_off_loop(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--max-queue-bytes", "2G", NULL});
    struct h_conn a, b;
    struct lease_wait w = {NULL, "big"};
    json_t *reply;
    int try, before = 0;

    hello(&a, d, NULL);
    hello(&b, d, NULL);
    w.c = &b;
    for (try = 0; try < 3 && before == 0; try++) {
        assert_int_equal(h_conn_send(&a, BIG_CREATE, strlen(BIG_CREATE)), 0);
        json_decref(h_recv_json(&a));
        json_decref(h_recv_json(&a));
        assert_int_equal(h_conn_sendline(&a, "{\"op\":\"queue_delete\",\"name\":\"big\"}"),
                         0);
        assert_true(h_eventually(gone, &w, 10000));
        before += !has_input(&a);
        reply = h_recv_json(&a);
        h_assert_ok(reply);
        json_decref(reply);
        assert_false(daemon_holds_queue(d, "big"));
    }
    assert_int_equal(before, 1);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* Proves that a creator that goes while its queue is being made, and a
 * daemon stopped while one is, harm nothing: the queue is made and listed
 * (it is not temporary), and the daemon stops cleanly. */
static void test_create_interrupted(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--max-queue-bytes", "2G", NULL});
    struct holds big = {d, "big"};
    struct lease_wait w = {NULL, "big"};
    struct h_conn a, b;

    hello(&a, d, NULL);
    hello(&b, d, NULL);
    assert_int_equal(h_conn_send(&a, BIG_CREATE, strlen(BIG_CREATE)), 0);
    assert_true(h_eventually(holds, &big, 60000));
    h_conn_close(&a);
    w.c = &b;
    /* Made all the same, and listed then. */
    assert_true(h_eventually(present, &w, 10000));
    hello(&a, d, NULL);
    ok(&a, "{\"op\":\"queue_delete\",\"name\":\"big\"}");
    assert_int_equal(h_conn_send(&a, BIG_CREATE, strlen(BIG_CREATE)), 0);
    assert_true(h_eventually(holds, &big, 60000));
    assert_int_equal(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS), 0);
    assert_int_equal(h_exit_code(d->status), 0);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* Proves that requests pipelined behind a queue_create still run when the
 * client goes while the queue is being made, as behind any request
 * (PROTOCOL.md, "End of input"): its connection is reset (it closed with a
 * reply unread), and the queue_delete it sent after the create still
 * deletes the queue once it is made. */
static void test_reset_while_creating(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--max-queue-bytes", "2G", NULL});
    static const char create_delete[] =
        "{\"op\":\"queue_create\",\"name\":\"big\",\"seats\":1,\"slots\":100,"
        "\"slot_size\":10485760}\n{\"op\":\"queue_delete\",\"name\":\"big\"}\n";
    struct holds big = {d, "big"};
    struct h_conn a, b;
    struct pollfd pfd;

    hello(&a, d, NULL);
    hello(&b, d, NULL);
    pfd.fd = a.fd;
    pfd.events = POLLIN;
    /* A reply left unread (in the socket) makes the close a reset. */
    assert_int_equal(h_conn_sendline(&a, "{\"op\":\"stats\"}"), 0);
    assert_int_equal(poll(&pfd, 1, H_REPLY_TIMEOUT_MS), 1);
    assert_int_equal(h_conn_send(&a, create_delete, strlen(create_delete)), 0);
    assert_true(h_eventually(holds, &big, 60000));
    h_conn_close(&a);
    /* The delete ran: the queue's memory is freed (it is held from its
     * making until then), and it is gone. */
    assert_true(h_eventually(freed, &big, 60000));
    assert_false(listed(&b, "big"));
    h_assert_alive(d);
    h_conn_close(&b);
    h_pass(f);
}

/* Proves that a client that half-closes after more than the daemon's input
 * buffer of requests behind a queue_create gets every reply, in order, the
 * create's first, and then the end of the connection: the daemon stops
 * reading while the queue is being made (its input is bounded), and the
 * end of input seen meanwhile does not drop what was sent before it. */
static void test_half_close_behind_create(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--max-queue-bytes", "2G", NULL});
    char key[256], *out;
    size_t len = 0, cap = 128 * 1024;
    struct h_conn a;
    struct pollfd pfd;
    json_t *reply;
    int i, n = 400; /* 400 lines of ~250 bytes: past the 64 KiB input buffer */

    memset(key, 'x', 200);
    key[200] = '\0';
    assert_non_null(out = malloc(cap));
    hello(&a, d, NULL);
    len += (size_t)snprintf(out + len, cap - len,
                            "{\"op\":\"queue_create\",\"name\":\"big\",\"seats\":1,"
                            "\"slots\":100,\"slot_size\":10485760,\"id\":0}\n");
    for (i = 1; i <= n; i++)
        len += (size_t)snprintf(out + len, cap - len,
                                "{\"op\":\"contains\",\"key\":\"%s\",\"id\":%d}\n", key, i);
    len += (size_t)snprintf(out + len, cap - len,
                            "{\"op\":\"queue_delete\",\"name\":\"big\",\"id\":%d}\n", n + 1);
    assert_true(len < cap);
    assert_int_equal(h_conn_send(&a, out, len), 0);
    free(out);
    assert_int_equal(shutdown(a.fd, SHUT_WR), 0);
    /* A GiB of pages takes seconds on a busy machine: the create's reply
     * may come later than a reply's usual time. */
    pfd.fd = a.fd;
    pfd.events = POLLIN;
    assert_int_equal(poll(&pfd, 1, 60000), 1);
    for (i = 0; i <= n + 1; i++) {
        reply = h_recv_json(&a);
        h_assert_ok(reply);
        assert_int_equal(h_int(reply, "id"), i);
        json_decref(reply);
    }
    assert_int_equal(h_conn_wait_eof(&a, H_REPLY_TIMEOUT_MS), 0);
    assert_false(daemon_holds_queue(d, "big"));
    h_conn_close(&a);
    h_pass(f);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_pool_cannot_take_all_queues),
        TEST(test_bytes_limit),
        TEST(test_pool_options),
        TEST(test_lease),
        TEST(test_create_restarts_lease),
        TEST(test_create_off_loop),
        TEST(test_delete_off_loop),
        TEST(test_create_interrupted),
        TEST(test_reset_while_creating),
        TEST(test_half_close_behind_create),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_queue_limits", tests, NULL, NULL);
}
