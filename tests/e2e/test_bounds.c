// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of what one client can make the daemon do to everyone
 * else: the work and the reply of one request line are bounded (reports are
 * refused inside a batch, a list reply is capped in bytes), other clients
 * keep being answered meanwhile and the daemon's memory stays small; a hello
 * behind a full socket still gets its descriptor; connections that never
 * say hello are closed (--hello-timeout); client text is cut on a character
 * boundary and escaped in the log.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "shmbroker.h"

/* Bound of the daemon's peak memory while one client attacks it. */
#define MAX_HWM_KIB (64 * 1024)
/* The other client's generous bound: answered within a second. */
#define LIVENESS_MS 1000
/* A list reply stops growing past 4 MiB (COMMAND_LIST_MAX_REPLY); one entry
 * and the closing fields go over it by at most a few KiB. */
#define LIST_MAX_REPLY (4 * 1024 * 1024 + 4096)

/* ---- helpers --------------------------------------------------------------- */

/* Peak resident memory of pid (VmHWM) in KiB; the test fails when unknown. */
static long long vm_hwm_kib(pid_t pid)
{
    char path[64], *status, *at;
    long long kib = -1;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    status = h_read_file(path, NULL);
    if (status == NULL || (at = strstr(status, "VmHWM:")) == NULL ||
        sscanf(at, "VmHWM: %lld", &kib) != 1)
        h_fail("cannot read VmHWM of pid %d", (int)pid);
    free(status);
    return kib;
}

/* A growing request line. */
struct req {
    char *buf;
    size_t len, cap;
};

static void req_add(struct req *r, const char *s)
{
    size_t n = strlen(s);

    if (r->len + n + 1 > r->cap) {
        r->cap = (r->len + n + 1) * 2;
        r->buf = realloc(r->buf, r->cap);
        assert_non_null(r->buf);
    }
    memcpy(r->buf + r->len, s, n + 1);
    r->len += n;
}

/* Open socket descriptors of pid. */
static int fds_of(pid_t pid)
{
    char path[64], link[400], target[64];
    struct dirent *e;
    DIR *dir;
    int n = 0;
    ssize_t len;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    dir = opendir(path);
    assert_non_null(dir);
    while ((e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
        len = readlink(link, target, sizeof(target) - 1);
        n += len > 7 && memcmp(target, "socket:", 7) == 0;
    }
    closedir(dir);
    return n;
}

/* Send a batch line (ops already in r, after "[") and check every reply. */
static void send_batch(struct h_conn *c, struct req *r, size_t nops)
{
    json_t *reply, *replies;
    size_t i;

    req_add(r, "]}");
    assert_true(r->len < 64 * 1024);
    reply = h_call(c, r->buf);
    h_assert_ok(reply);
    replies = json_object_get(reply, "replies");
    assert_int_equal(json_array_size(replies), nops);
    for (i = 0; i < nops; i++)
        h_assert_ok(json_array_get(replies, i));
    json_decref(reply);
    r->len = 0;
}

/* Put n objects of 1 byte whose keys are key_fmt (with the object's number)
 * followed by pad up to key_len characters (pad is one JSON character,
 * possibly an escape); batches of at most 4096 ops and 60 KiB per line. */
static void put_objects(struct h_conn *c, int n, const char *key_fmt, const char *pad,
                        size_t key_len)
{
    struct req r = {0};
    size_t nops = 0;
    char key[2048], op[4300];
    int i;

    for (i = 0; i < n; i++) {
        int len = snprintf(key, sizeof(key), key_fmt, i);
        size_t chars = (size_t)len;

        while (chars < key_len) {
            strcat(key, pad);
            chars++;
        }
        snprintf(op, sizeof(op),
                 "%s{\"op\":\"alloc\",\"key\":\"%s\",\"size\":1},"
                 "{\"op\":\"commit\",\"key\":\"%s\"}",
                 nops == 0 ? "{\"op\":\"batch\",\"ops\":[" : ",", key, key);
        if (r.len + strlen(op) > 60 * 1024 || nops + 2 > 4096) {
            send_batch(c, &r, nops);
            nops = 0;
            i--;
            continue;
        }
        req_add(&r, op);
        nops += 2;
    }
    if (nops > 0)
        send_batch(c, &r, nops);
    free(r.buf);
}

/* "objects" of a stats reply on c. */
static long long objects_of(struct h_conn *c)
{
    json_t *st = h_call(c, "{\"op\":\"stats\"}");
    long long n;

    h_assert_ok(st);
    n = h_int(st, "objects");
    json_decref(st);
    return n;
}

/* True when bytes are waiting on c. */
static bool readable(const struct h_conn *c)
{
    struct pollfd p = {c->fd, POLLIN, 0};

    return c->len > 0 || poll(&p, 1, 0) > 0;
}

/* While attacker's requests run, keep asking stats on other, each answered
 * within LIVENESS_MS, until attacker's replies start to arrive. */
static void expect_others_served(struct h_conn *attacker, struct h_conn *other,
                                 const char *what)
{
    uint64_t start = h_now_ms();
    char *line = NULL;
    int rounds = 0, rc;

    do {
        uint64_t t0 = h_now_ms();

        assert_int_equal(h_conn_sendline(other, "{\"op\":\"stats\"}"), 0);
        rc = h_conn_recv_line(other, &line, LIVENESS_MS);
        if (rc != 0)
            h_fail("another client's stats got no reply within %d ms (rc %d) while %s ran",
                   LIVENESS_MS, rc, what);
        assert_true(h_contains(line, "\"ok\":true"));
        free(line);
        if (h_now_ms() - t0 > LIVENESS_MS)
            h_fail("another client's stats took %llu ms while %s ran",
                   (unsigned long long)(h_now_ms() - t0), what);
        rounds++;
    } while ((!readable(attacker) || rounds < 3) && h_now_ms() - start < 30000);
}

/* The daemon's peak memory is under MAX_HWM_KIB. */
static void expect_small_daemon(const struct h_daemon *d)
{
#ifndef __SANITIZE_ADDRESS__ /* ASan's shadow memory and quarantine are not the daemon's */
    if (vm_hwm_kib(d->pid) >= MAX_HWM_KIB)
        h_fail("the daemon's peak memory reached %lld KiB (bound %d KiB)",
               vm_hwm_kib(d->pid), MAX_HWM_KIB);
#else
    (void)d;
    (void)vm_hwm_kib;
#endif
}

/* Send a batch of 4096 copies of op on attacker; another client is served
 * meanwhile. The batch's reply: every element an EINVAL naming the op, the
 * line a few hundred KiB at most. The daemon's peak memory stays small. */
static void attack_with_batch(const struct h_daemon *d, struct h_conn *attacker,
                              struct h_conn *other, const char *op, const char *name)
{
    struct req r = {0};
    char *line = NULL, why[64];
    json_t *reply, *replies;
    int i;

    req_add(&r, "{\"op\":\"batch\",\"ops\":[");
    for (i = 0; i < 4096; i++) {
        if (i > 0)
            req_add(&r, ",");
        req_add(&r, op);
    }
    req_add(&r, "]}\n");
    assert_true(r.len <= 64 * 1024);
    assert_int_equal(h_conn_send(attacker, r.buf, r.len), 0);
    free(r.buf);
    snprintf(why, sizeof(why), "a batch of 4096 '%s'", name);
    expect_others_served(attacker, other, why);
    assert_int_equal(h_conn_recv_line(attacker, &line, H_REPLY_TIMEOUT_MS), 0);
    if (strlen(line) > 1024 * 1024)
        h_fail("the reply to one batch of 4096 '%s' is %zu bytes", name, strlen(line));
    reply = json_loads(line, 0, NULL);
    free(line);
    assert_non_null(reply);
    h_assert_ok(reply);
    replies = json_object_get(reply, "replies");
    assert_int_equal(json_array_size(replies), 4096);
    snprintf(why, sizeof(why), "'%s' cannot be part of a batch", name);
    for (i = 0; i < 4096; i++)
        h_assert_error(json_array_get(replies, (size_t)i), "EINVAL", why);
    json_decref(reply);
    expect_small_daemon(d);
}

/* ---- item: bounded work and reply per line -------------------------------- */

/* A batch of 4096 'list' over 150 objects of 210-byte keys (a reply of
 * hundreds of MB before) gets 4096 short EINVAL replies; another client is
 * answered meanwhile, and the daemon stays under 64 MB. */
static void test_batch_of_lists(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct h_conn a, b;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    put_objects(&a, 150, "list-%03d-", "x", 210);
    assert_int_equal(objects_of(&a), 150);
    attack_with_batch(d, &a, &b, "{\"op\":\"list\"}", "list");
    /* On its own line, list works and answers everything. */
    {
        json_t *reply = h_call(&a, "{\"op\":\"list\",\"limit\":1000}");

        h_assert_ok(reply);
        assert_int_equal(json_array_size(json_object_get(reply, "objects")), 150);
        assert_true(json_is_false(json_object_get(reply, "truncated")));
        json_decref(reply);
    }
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* A batch of 4096 'stats' over 100,000 objects (a walk of every object per
 * stats before) is refused element by element at once; another client is
 * answered meanwhile, and the daemon stays under 64 MB. 'clients' is
 * refused in a batch too. */
static void test_batch_of_stats(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    struct h_conn a, b;
    json_t *reply;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    put_objects(&a, 100000, "s%06d", "x", 7);
    assert_int_equal(objects_of(&a), 100000);
    attack_with_batch(d, &a, &b, "{\"op\":\"stats\"}", "stats");
    reply = h_call(&a, "{\"op\":\"batch\",\"ops\":[{\"op\":\"clients\",\"id\":1},"
                       "{\"op\":\"contains\",\"key\":\"s000001\"}]}");
    h_assert_ok(reply);
    h_assert_error(json_array_get(json_object_get(reply, "replies"), 0), "EINVAL",
                   "'clients' cannot be part of a batch");
    h_assert_ok(json_array_get(json_object_get(reply, "replies"), 1));
    json_decref(reply);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* Over 100,000 objects, one write of 2000 pipelined 'list' whose prefix
 * matches nothing (each a pass over every object): the daemon runs them in
 * turns, and another client is answered meanwhile. Every list is answered,
 * in order. */
static void test_pipelined_lists(void **state)
{
    static const char list_line[] = "{\"op\":\"list\",\"prefix\":\"zzz\"}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    size_t n = 2000, len = n * (sizeof(list_line) - 1), i;
    char *lines = malloc(len);
    struct h_conn a, b;

    assert_non_null(lines);
    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    put_objects(&a, 100000, "s%06d", "x", 7);
    assert_int_equal(objects_of(&a), 100000);
    for (i = 0; i < n; i++)
        memcpy(lines + i * (sizeof(list_line) - 1), list_line, sizeof(list_line) - 1);
    assert_int_equal(h_conn_send(&a, lines, len), 0);
    free(lines);
    expect_others_served(&a, &b, "2000 pipelined 'list'");
    for (i = 0; i < n; i++) {
        json_t *reply = h_recv_json(&a);

        h_assert_ok(reply);
        assert_int_equal(json_array_size(json_object_get(reply, "objects")), 0);
        json_decref(reply);
    }
    h_expect_ok(&a, "{\"op\":\"stats\"}");
    expect_small_daemon(d);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* Over 70,000 objects, one list whose prefix only the newest key has looks
 * at 65,536 objects (COMMAND_LIST_MAX_SCAN) and no more: it stops, says
 * truncated, and names in "next" where to go on; the list from there finds
 * the key and says nothing more. A read-only client's list of a prefix few
 * keys have otherwise cost a walk over every object of the pool while
 * nobody else was served (about 25 ms per million objects). */
static void test_list_scan_bounded(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "32M", NULL);
    struct h_conn a, ro;
    json_t *reply, *next, *objects;
    char line[200];

    json_decref(h_open_hello(&a, d));
    put_objects(&a, 70000, "s%06d", "x", 7);
    h_expect_ok(&a, "{\"op\":\"alloc\",\"key\":\"zlast\",\"size\":1}");
    h_expect_ok(&a, "{\"op\":\"commit\",\"key\":\"zlast\"}");
    assert_int_equal(h_conn_open(&ro, d->socket), 0);
    h_expect_ok(&ro, "{\"op\":\"hello\",\"version\":1,\"mode\":\"ro\"}");
    reply = h_call(&ro, "{\"op\":\"list\",\"prefix\":\"zlast\"}");
    h_assert_ok(reply);
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 0);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    next = json_object_get(reply, "next");
    assert_true(json_is_integer(next));
    assert_true(json_integer_value(next) > 0);
    snprintf(line, sizeof(line), "{\"op\":\"list\",\"prefix\":\"zlast\",\"from\":%lld}",
             (long long)json_integer_value(next));
    json_decref(reply);
    reply = h_call(&ro, line);
    h_assert_ok(reply);
    objects = json_object_get(reply, "objects");
    assert_int_equal(json_array_size(objects), 1);
    assert_string_equal(h_str(json_array_get(objects, 0), "key"), "zlast");
    assert_false(json_is_true(json_object_get(reply, "truncated")));
    assert_null(json_object_get(reply, "next"));
    json_decref(reply);
    /* A "from" past every chunk lists nothing; a negative one is refused. */
    reply = h_call(&ro, "{\"op\":\"list\",\"from\":9223372036854775807}");
    h_assert_ok(reply);
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 0);
    json_decref(reply);
    reply = h_call(&ro, "{\"op\":\"list\",\"from\":-1}");
    assert_string_equal(h_str(reply, "error"), "EINVAL");
    json_decref(reply);
    /* The library goes on from "next" itself: shmb_list finds the key. */
    {
        shmb_t *c = shmb_new();
        shmb_list_t *list = NULL;

        assert_non_null(c);
        assert_int_equal(shmb_connect(c, d->socket, "lister"), 0);
        assert_int_equal(shmb_list(c, "zlast", 0, &list), 0);
        assert_int_equal(list->count, 1);
        assert_string_equal(list->objects[0].key, "zlast");
        assert_false(list->truncated);
        shmb_list_free(list);
        assert_int_equal(shmb_list(c, "s06999", 3, &list), 0);
        assert_int_equal(list->count, 3);
        assert_string_equal(list->objects[2].key, "s069992");
        assert_true(list->truncated);
        shmb_list_free(list);
        shmb_close(c);
    }
    h_conn_close(&a);
    h_conn_close(&ro);
    h_pass(f);
}

/* One list with limit 100000 over 3000 objects whose 255-byte keys each
 * escape to 1530 bytes: the reply stops at 4 MiB (--max-queued-output is
 * larger) and says "truncated"; the entries it has are whole and in order. */
static void test_list_reply_bytes(void **state)
{
    static const char *const extra[] = {"--max-queued-output", "16M", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    struct h_conn c;
    json_t *reply, *objects;
    char *line = NULL, want[32];
    size_t n, i;

    json_decref(h_open_hello(&c, d));
    put_objects(&c, 3000, "k%05d", "\\u0001", 255);
    assert_int_equal(objects_of(&c), 3000);
    assert_int_equal(h_conn_sendline(&c, "{\"op\":\"list\",\"limit\":100000,\"id\":7}"), 0);
    assert_int_equal(h_conn_recv_line(&c, &line, H_REPLY_TIMEOUT_MS), 0);
    if (strlen(line) > LIST_MAX_REPLY)
        h_fail("one list reply is %zu bytes, more than %d", strlen(line), LIST_MAX_REPLY);
    reply = json_loads(line, 0, NULL);
    free(line);
    assert_non_null(reply);
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "id"), 7);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    objects = json_object_get(reply, "objects");
    n = json_array_size(objects);
    assert_true(n > 1000 && n < 3000);
    for (i = 0; i < n; i++) {
        const char *key = h_str(json_array_get(objects, i), "key");

        snprintf(want, sizeof(want), "k%05zu\x01", i);
        assert_int_equal(strlen(key), 255);
        assert_memory_equal(key, want, strlen(want));
    }
    json_decref(reply);
    /* The count limit still applies, and says truncated too. */
    reply = h_call(&c, "{\"op\":\"list\",\"limit\":10}");
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 10);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- item: hello behind a full socket -------------------------------------- */

/* Three writes of 1500 requests before hello, then hello, reading nothing:
 * the replies fill the socket. Read everything afterwards: 4500 EPROTO
 * replies, then the hello reply with the segment's descriptor, and the
 * connection still serves, costing the daemon one descriptor (the one it
 * used to wait for room is gone). 20 times. */
static void test_hello_behind_full_socket(void **state)
{
    static const char stats_line[] = "{\"op\":\"stats\"}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    size_t n = 1500, len = n * (sizeof(stats_line) - 1), i;
    char *chunk = malloc(len);
    int round, w;

    assert_non_null(chunk);
    for (i = 0; i < n; i++)
        memcpy(chunk + i * (sizeof(stats_line) - 1), stats_line, sizeof(stats_line) - 1);
    for (round = 0; round < 20; round++) {
        struct h_conn c;
        json_t *reply;
        int base = fds_of(d->pid);

        assert_int_equal(h_conn_open(&c, d->socket), 0);
        for (w = 0; w < 3; w++) {
            assert_int_equal(h_conn_send(&c, chunk, len), 0);
            h_sleep_ms(20);
        }
        assert_int_equal(h_conn_sendline(&c, "{\"op\":\"hello\",\"version\":1,\"id\":\"h\"}"),
                         0);
        h_sleep_ms(50);
        for (i = 0; i < 3 * n; i++) {
            reply = h_recv_json(&c);
            h_assert_error(reply, "EPROTO", "Say hello first");
            json_decref(reply);
        }
        reply = h_recv_json(&c);
        h_assert_ok(reply);
        assert_string_equal(h_str(reply, "id"), "h");
        json_decref(reply);
        if (c.nfds != 1)
            h_fail("round %d: the hello reply came with %d descriptors, not 1", round,
                   c.nfds);
        h_expect_ok(&c, "{\"op\":\"stats\"}");
        if (fds_of(d->pid) > base + 1)
            h_fail("round %d: the daemon holds %d sockets for one connection", round,
                   fds_of(d->pid) - base);
        h_conn_close(&c);
        h_sleep_ms(20); /* the daemon closes its end */
    }
    free(chunk);
    h_pass(f);
}

/* ---- item: --hello-timeout ------------------------------------------------- */

/* With --hello-timeout 1: a connection that says nothing gets an ETIMEDOUT
 * line naming the flag and is closed; one that said hello stays, however
 * long it is idle; the daemon logs the closing. */
static void test_hello_timeout(void **state)
{
    static const char *const extra[] = {"--hello-timeout", "1", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", extra);
    struct h_conn silent, greeted;
    char *line = NULL, *log;
    uint64_t start = h_now_ms();
    json_t *reply;

    json_decref(h_open_hello(&greeted, d));
    assert_int_equal(h_conn_open(&silent, d->socket), 0);
    assert_int_equal(h_conn_recv_line(&silent, &line, 5000), 0);
    assert_true(h_now_ms() - start >= 900);
    reply = json_loads(line, 0, NULL);
    free(line);
    h_assert_error(reply, "ETIMEDOUT", "--hello-timeout");
    json_decref(reply);
    assert_int_equal(h_conn_wait_eof(&silent, 2000), 0);
    h_sleep_ms(600); /* past the timeout for the greeted one too */
    h_expect_ok(&greeted, "{\"op\":\"stats\"}");
    log = h_read_file(d->log, NULL);
    assert_true(h_contains(log, "did not say hello within 1000 ms (--hello-timeout)"));
    free(log);
    h_conn_close(&silent);
    h_conn_close(&greeted);
    h_pass(f);
}

/* ---- item: client names ---------------------------------------------------- */

/* A hello name of 63 'a' and an 'é' (65 bytes) is cut to 63 bytes, on the
 * character boundary, and 'clients' keeps working for everyone. */
static void test_name_cut_on_character(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct h_conn named, other;
    char req[200], a63[64];
    json_t *reply, *list;
    size_t i;
    bool seen = false;

    memset(a63, 'a', 63);
    a63[63] = '\0';
    snprintf(req, sizeof(req), "{\"op\":\"hello\",\"version\":1,\"name\":\"%s\xc3\xa9\"}", a63);
    assert_int_equal(h_conn_open(&named, d->socket), 0);
    reply = h_call(&named, req);
    h_assert_ok(reply);
    json_decref(reply);
    json_decref(h_open_hello(&other, d));
    reply = h_call(&other, "{\"op\":\"clients\"}");
    h_assert_ok(reply);
    list = json_object_get(reply, "clients");
    for (i = 0; i < json_array_size(list); i++)
        seen |= strcmp(h_str(json_array_get(list, i), "name"), a63) == 0;
    assert_true(seen);
    json_decref(reply);
    reply = h_call(&named, "{\"op\":\"clients\"}");
    h_assert_ok(reply);
    json_decref(reply);
    h_conn_close(&named);
    h_conn_close(&other);
    h_pass(f);
}

/* ---- item: the log --------------------------------------------------------- */

/* h_eventually's test: the daemon's log shows a client's disconnect. */
static bool log_has_disconnect(void *arg)
{
    const struct h_daemon *d = arg;
    char *log = h_read_file(d->log, NULL);
    /* Escaped or not: the test says which afterwards. */
    bool seen = h_contains(log, "\\x07) disconnected") || h_contains(log, "\x07) disconnected");

    free(log);
    return seen;
}

/* A hello name with a newline, an escape sequence and a BEL cannot forge a
 * log line or reach a terminal: the "connected" line holds it, escaped. */
static void test_log_escapes_names(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct h_conn c;
    char *log;
    json_t *reply;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,"
                       "\"name\":\"x\\nshmbrokerd[1] error: forged\\u001b[2J\\u0007\"}");
    h_assert_ok(reply);
    json_decref(reply);
    h_conn_close(&c);
    /* The daemon logs the disconnect last: wait for it. */
    assert_true(h_eventually(log_has_disconnect, d, 5000));
    log = h_read_file(d->log, NULL);
    assert_non_null(log);
    if (h_contains(log, "\nshmbrokerd[1]") ||
        !h_contains(log, "(x\\x0ashmbrokerd[1] error: forged\\x1b[2J\\x07, read-write) "
                         "connected"))
        h_fail("the name is not escaped in the log:\n%s", log);
    assert_null(strchr(log, '\x1b'));
    assert_null(strchr(log, '\x07'));
    free(log);
    h_pass(f);
}


/* ---- item: what was received before the client went still runs ------------ */

/* Committed objects among the first n "obj%03d" keys, seen from c. */
static int committed_of(struct h_conn *c, int n)
{
    json_t *reply = h_call(c, "{\"op\":\"list\",\"prefix\":\"obj\",\"limit\":1000}");
    json_t *objects = json_object_get(reply, "objects");
    int committed = 0;
    size_t i;

    h_assert_ok(reply);
    for (i = 0; i < json_array_size(objects); i++)
        committed += strcmp(h_str(json_array_get(objects, i), "state"), "committed") == 0;
    json_decref(reply);
    assert_true(committed <= n);
    return committed;
}

struct committed_arg {
    struct h_conn *c;
    int n;
};

/* h_eventually's test: all n objects are committed. */
static bool all_committed(void *arg)
{
    struct committed_arg *a = arg;

    return committed_of(a->c, a->n) == a->n;
}

/* A writer allocates 300 objects, then sends in one write 300 'list' lines
 * that walk 50,000 objects (longer than one turn) and 300 noreply commits,
 * and ends its input: with a half-close (SHUT_WR) it gets every list reply
 * and then the end of the connection; with a close that leaves replies
 * unread (the daemon sees a reset) nothing is answered. Either way all 300
 * commits are done: the turns used to stop at the end of input. */
static void test_end_of_input_runs_received(void **state)
{
    enum { N = 300 };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "16M", NULL);
    struct h_conn a, w;
    struct req r = {0};
    char op[128];
    int round, i;

    json_decref(h_open_hello(&a, d));
    put_objects(&a, 50000, "f%06d", "x", 7);
    for (round = 0; round < 2; round++) {
        struct committed_arg arg = {&a, N};
        json_t *reply;

        json_decref(h_open_hello(&w, d));
        req_add(&r, "{\"op\":\"batch\",\"ops\":[");
        for (i = 0; i < N; i++) {
            snprintf(op, sizeof(op), "%s{\"op\":\"alloc\",\"key\":\"obj%03d\",\"size\":8}",
                     i > 0 ? "," : "", i);
            req_add(&r, op);
        }
        req_add(&r, "]}");
        reply = h_call(&w, r.buf);
        h_assert_ok(reply);
        json_decref(reply);
        r.len = 0;
        for (i = 0; i < N; i++)
            req_add(&r, "{\"op\":\"list\",\"prefix\":\"zz\",\"limit\":1}\n");
        for (i = 0; i < N; i++) {
            snprintf(op, sizeof(op), "{\"op\":\"commit\",\"key\":\"obj%03d\",\"noreply\":true}\n",
                     i);
            req_add(&r, op);
        }
        assert_true(r.len < 64 * 1024);
        assert_int_equal(h_conn_send(&w, r.buf, r.len), 0);
        r.len = 0;
        if (round == 0) {
            assert_int_equal(shutdown(w.fd, SHUT_WR), 0);
            for (i = 0; i < N; i++) {
                reply = h_recv_json(&w);
                h_assert_ok(reply);
                json_decref(reply);
            }
            assert_int_equal(h_conn_wait_eof(&w, 10000), 0);
            h_conn_close(&w);
        } else {
            h_sleep_ms(5); /* some replies arrive unread: the close is a reset */
            h_conn_close(&w);
        }
        if (!h_eventually(all_committed, &arg, 10000))
            h_fail("round %d: %d of %d noreply commits done after the client %s", round,
                   committed_of(&a, N), N, round == 0 ? "half-closed" : "closed");
        reply = h_call(&a, "{\"op\":\"batch\",\"ops\":[]}");
        json_decref(reply);
        /* Clear for the next round. */
        r.len = 0;
        req_add(&r, "{\"op\":\"batch\",\"ops\":[");
        for (i = 0; i < N; i++) {
            snprintf(op, sizeof(op), "%s{\"op\":\"delete\",\"key\":\"obj%03d\"}", i > 0 ? "," : "",
                     i);
            req_add(&r, op);
        }
        req_add(&r, "]}");
        json_decref(h_call(&a, r.buf));
        r.len = 0;
    }
    free(r.buf);
    h_assert_alive(d);
    h_conn_close(&a);
    h_pass(f);
}

/* ---- item: unread output is bounded per connection ------------------------- */

/* With --max-queued-output 64K, one list of 2000 objects (about 180 KB of
 * entries) stops at 64 KiB and says "truncated": a client that sends it and
 * never reads holds no more than the bound in the daemon. */
static void test_list_capped_by_queued_output(void **state)
{
    static const char *const extra[] = {"--max-queued-output", "64K", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    struct h_conn c;
    char *line = NULL;
    json_t *reply;

    json_decref(h_open_hello(&c, d));
    put_objects(&c, 2000, "k%05d", "x", 60);
    assert_int_equal(h_conn_sendline(&c, "{\"op\":\"list\",\"limit\":100000}"), 0);
    assert_int_equal(h_conn_recv_line(&c, &line, H_REPLY_TIMEOUT_MS), 0);
    if (strlen(line) > 64 * 1024 + 2048)
        h_fail("one list reply is %zu bytes, more than --max-queued-output 64K",
               strlen(line));
    reply = json_loads(line, 0, NULL);
    free(line);
    assert_non_null(reply);
    h_assert_ok(reply);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    assert_true(json_array_size(json_object_get(reply, "objects")) > 100);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* A client that reads as it pipelines is not cut off: three lists of about
 * 40 KB each in one write with --max-queued-output 64K; the second passes
 * the bound before anything was written, but the socket takes it all. */
static void test_pipelining_reader_served(void **state)
{
    static const char *const extra[] = {"--max-queued-output", "64K", NULL};
    static const char lines[] = "{\"op\":\"list\",\"limit\":100000,\"id\":1}\n"
                                "{\"op\":\"list\",\"limit\":100000,\"id\":2}\n"
                                "{\"op\":\"list\",\"limit\":100000,\"id\":3}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    struct h_conn c;
    json_t *reply;
    int i;

    json_decref(h_open_hello(&c, d));
    put_objects(&c, 250, "k%05d", "x", 60);
    assert_int_equal(h_conn_send(&c, lines, sizeof(lines) - 1), 0);
    for (i = 1; i <= 3; i++) {
        reply = h_recv_json(&c);
        h_assert_ok(reply);
        assert_int_equal(h_int(reply, "id"), i);
        assert_int_equal(json_array_size(json_object_get(reply, "objects")), 250);
        assert_true(json_is_false(json_object_get(reply, "truncated")));
        json_decref(reply);
    }
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    h_conn_close(&c);
    h_pass(f);
}


/* Bytes waiting unread in c's socket. */
static int unread_in(const struct h_conn *c)
{
    int n = 0;

    assert_int_equal(ioctl(c->fd, FIONREAD, &n), 0);
    return n;
}

/* h_eventually's test: the daemon logged that a client stopped reading. */
static bool log_has_unread_cut(void *arg)
{
    const struct h_daemon *d = arg;
    char *log = h_read_file(d->log, NULL);
    bool seen = h_contains(log, "has not read its replies for");

    free(log);
    return seen;
}

/* With --max-queued-output 64K, a client sends one list at a time (replies
 * of about 66 KB) until the socket is full and the daemon queues the last
 * reply, over the bound; then it goes quiet, reading nothing. The daemon
 * disconnects it after its grace (5 s) instead of holding the reply for
 * ever. */
static void test_unread_reply_cut_off(void **state)
{
    static const char *const extra[] = {"--max-queued-output", "64K", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", extra);
    struct h_conn c;
    int last = -1, sent;

    json_decref(h_open_hello(&c, d));
    put_objects(&c, 2000, "k%05d", "x", 60);
    for (sent = 0; sent < 200; sent++) {
        int now;

        assert_int_equal(h_conn_sendline(&c, "{\"op\":\"list\",\"limit\":100000}"), 0);
        h_sleep_ms(200);
        now = unread_in(&c);
        if (now == last)
            break; /* the socket took nothing of this reply: it is queued */
        last = now;
    }
    assert_true(sent < 200);
    if (!h_eventually(log_has_unread_cut, d, 15000))
        h_fail("a client with %d replies unread was not disconnected within 15 s",
               sent + 1);
    h_assert_alive(d);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- item: one batch line's reply is bounded ------------------------------ */

/* Behind a pending blocker whose 255-byte key escapes to 1530 bytes, a
 * batch of allocs with 200-byte keys all get ENOSPC: each element's reply
 * is at most 512 bytes (the message quotes keys cut to 64 bytes and is cut
 * itself), so the batch reply stays within 4096 x 512 bytes plus the ids. */
static void test_batch_reply_bounded(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct h_conn c;
    struct req r = {0};
    char key[256], op[400], *line = NULL;
    json_t *reply, *replies;
    size_t i, n = 0;

    json_decref(h_open_hello(&c, d));
    r.len = 0;
    req_add(&r, "{\"op\":\"alloc\",\"key\":\"");
    for (i = 0; i < 255; i++)
        req_add(&r, "\\u0001");
    req_add(&r, "\",\"size\":524288}");
    reply = h_call(&c, r.buf);
    h_assert_ok(reply);
    json_decref(reply);
    r.len = 0;
    memset(key, 'b', 200);
    key[200] = '\0';
    req_add(&r, "{\"op\":\"batch\",\"ops\":[{\"op\":\"contains\",\"key\":\"a\"}");
    while (r.len + 300 < 60 * 1024) {
        snprintf(op, sizeof(op), ",{\"op\":\"alloc\",\"key\":\"%s%03zu\",\"size\":524288}",
                 key, n % 1000);
        req_add(&r, op);
        n++;
    }
    req_add(&r, "]}");
    assert_int_equal(h_conn_sendline(&c, r.buf), 0);
    assert_int_equal(h_conn_recv_line(&c, &line, H_REPLY_TIMEOUT_MS), 0);
    if (strlen(line) > (n + 1) * 512 + 64)
        h_fail("a batch of %zu ops got a %zu-byte reply", n + 1, strlen(line));
    reply = json_loads(line, 0, NULL);
    free(line);
    assert_non_null(reply);
    replies = json_object_get(reply, "replies");
    assert_int_equal(json_array_size(replies), n + 1);
    h_assert_ok(json_array_get(replies, 0));
    for (i = 1; i <= n; i++) {
        json_t *e = json_array_get(replies, i);
        char *text = json_dumps(e, JSON_COMPACT);

        h_assert_error(e, "ENOSPC", "No space for 'bbbbbbbb");
        if (strlen(text) > 512)
            h_fail("element %zu's reply is %zu bytes: %s", i, strlen(text), text);
        free(text);
    }
    json_decref(reply);
    free(r.buf);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- item: SIGHUP applies --hello-timeout to open connections ------------- */

/* A silent connection opened under --hello-timeout 60s is closed about a
 * second after a reload sets it to 1s, not a minute later. */
static void test_hello_timeout_reload(void **state)
{
    struct h_fix *f = *state;
    char conf[PATH_MAX], *line = NULL;
    struct h_daemon *d;
    struct h_conn silent;
    json_t *reply;
    int rc;

    h_path(f, "shmbrokerd.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, "hello-timeout = 60s\n", 20), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    assert_int_equal(h_conn_open(&silent, d->socket), 0);
    h_sleep_ms(200);
    assert_int_equal(h_write_file(conf, "hello-timeout = 1s\n", 19), 0);
    assert_int_equal(kill(d->pid, SIGHUP), 0);
    rc = h_conn_recv_line(&silent, &line, 5000);
    if (rc != 0)
        h_fail("the silent connection was not closed within 5 s of the reload (rc %d)", rc);
    reply = json_loads(line, 0, NULL);
    free(line);
    h_assert_error(reply, "ETIMEDOUT", "--hello-timeout");
    json_decref(reply);
    h_conn_close(&silent);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_batch_of_lists),
        TEST(test_batch_of_stats),
        TEST(test_pipelined_lists),
        TEST(test_list_reply_bytes),
        TEST(test_list_scan_bounded),
        TEST(test_hello_behind_full_socket),
        TEST(test_hello_timeout),
        TEST(test_name_cut_on_character),
        TEST(test_log_escapes_names),
        TEST(test_end_of_input_runs_received),
        TEST(test_list_capped_by_queued_output),
        TEST(test_pipelining_reader_served),
        TEST(test_unread_reply_cut_off),
        TEST(test_batch_reply_bounded),
        TEST(test_hello_timeout_reload),
    };

    return cmocka_run_group_tests_name("test_bounds", tests, NULL, NULL);
}
