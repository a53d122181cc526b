// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of what keeps shmbrokerd serving whatever one client does:
 * hostile input, clients that never read or never commit, read leases,
 * client listing, caps on clients, pins and allocations, running out of
 * descriptors, access control, read-only clients, and surviving a SIGKILL
 * (adopting the segment, a corrupt one included). Helper processes never use
 * cmocka asserts: they report on stderr and exit non-zero.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* Users the access-control tests switch to: nobody, and ids nobody has. */
#define UID_NOBODY 65534
#define GID_NOBODY 65534
#define UID_LISTED 12345
#define GID_OTHER 12346

/* ---- helpers --------------------------------------------------------------- */

/* Occurrences of needle in d's log. */
static int log_count(const struct h_daemon *d, const char *needle)
{
    char *text = h_log_text(d);
    int n = h_count(text, needle);

    free(text);
    return n;
}

/* One counter of a stats reply ("counters":{...}). */
#define counter(reply, name) h_int(json_object_get((reply), "counters"), (name))

/* A stats reply over c; the caller frees. */
static json_t *stats_of(struct h_conn *c)
{
    json_t *reply = h_call(c, "{\"op\":\"stats\"}");

    h_assert_ok(reply);
    return reply;
}

/* One integer of a stats reply over c. */
static long long stat_int(struct h_conn *c, const char *field)
{
    json_t *reply = stats_of(c);
    long long v = h_int(reply, field);

    json_decref(reply);
    return v;
}

/* Send request over c and return its reply's "offset" (the reply must be ok). */
static long long call_offset(struct h_conn *c, const char *request)
{
    json_t *reply = h_call(c, request);
    long long offset;

    h_assert_ok(reply);
    offset = h_int(reply, "offset");
    json_decref(reply);
    return offset;
}

/* A connection that is refused at accept gets exactly one error line with
 * code and a message containing substr, then EOF. Fails the test otherwise. */
#define expect_refused(d, code, substr) expect_refused_at((d), (code), (substr), __FILE__, __LINE__)
/* The body of expect_refused(). */
static void expect_refused_at(const struct h_daemon *d, const char *code, const char *substr,
                              const char *file, int line)
{
    struct h_conn c;
    json_t *reply;
    int rc = h_conn_open(&c, d->socket);

    if (rc < 0)
        h_fail_at(file, line, "cannot connect to %s: %s", d->socket, strerror(-rc));
    reply = h_recv_json_at(&c, file, line);
    h_assert_reply_at(reply, code, substr, file, line);
    json_decref(reply);
    if (h_conn_wait_eof(&c, H_REPLY_TIMEOUT_MS) != 0)
        h_fail_at(file, line, "the refused connection was not closed");
    h_conn_close(&c);
}

/* Try to connect and say hello until it works (a slot frees up only once
 * the daemon has seen a close), for up to timeout_ms. The hello reply is
 * returned (the caller frees it) and c is open; or the test fails. */
static json_t *hello_eventually(struct h_conn *c, const struct h_daemon *d, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        char *line = NULL;
        json_t *reply = NULL;

        if (h_conn_open(c, d->socket) == 0 &&
            h_conn_sendline(c, "{\"op\":\"hello\",\"version\":1,\"name\":\"retry\"}") == 0 &&
            h_conn_recv_line(c, &line, H_REPLY_TIMEOUT_MS) == 0)
            reply = json_loads(line, 0, NULL);
        free(line);
        if (reply != NULL && json_is_true(json_object_get(reply, "ok")))
            return reply;
        json_decref(reply);
        h_conn_close(c);
        if (h_now_ms() >= deadline)
            h_fail("no connection was served within %d ms", timeout_ms);
        h_sleep_ms(20);
    }
}

/* Let users other than root reach the socket: the fixture's directory is
 * 0700 by default. */
static void open_up_dir(struct h_fix *f)
{
    assert_int_equal(chmod(f->dir, 0711), 0);
}

/* Skip the test unless we are root (switching users needs it). */
static void need_root(struct h_fix *f)
{
    if (geteuid() != 0)
        h_skip(f, "needs root to switch to other users");
}

/* ---- helper processes: other users ---------------------------------------- */

/* What a peer helper does: who it becomes, and what it checks. */
struct peer {
    const char *socket;
    uid_t uid;
    gid_t gid;
    const gid_t *groups; /* supplementary groups (none when NULL) */
    size_t n_groups;
    bool read_only;       /* hello with "mode":"ro" and check the descriptor */
    const char *segment;  /* the segment file, which it must not be able to open */
    const char *key;      /* read_only: an object to read through the mapping */
    const char *refusal;  /* when refused, the message must contain this */
    uint32_t seed;
    size_t size;
};

/* How a peer helper ends. */
enum peer_result {
    PEER_SERVED = 0,  /* hello worked (and the read-only checks passed) */
    PEER_EPERM = 10,  /* refused with EPERM, then closed */
    PEER_EDQUOT = 11, /* refused with EDQUOT, then closed */
    PEER_OTHER = 12,  /* anything else (see its stderr) */
};

/* In a helper: become uid/gid with its supplementary groups. */
static int peer_become(const struct peer *p)
{
    if (setgroups(p->groups != NULL ? p->n_groups : 0, p->groups) != 0 ||
        setgid(p->gid) != 0 || setuid(p->uid) != 0) {
        fprintf(stderr, "peer: cannot become uid %d gid %d: %s\n", (int)p->uid, (int)p->gid,
                strerror(errno));
        return -1;
    }
    /* Keep /proc/self accessible to ourselves after the switch. */
    prctl(PR_SET_DUMPABLE, 1);
    return 0;
}

/* In a read-only helper: the descriptor cannot be made writable in any way
 * a client could try, and it still reads the object. */
static int peer_check_read_only(const struct peer *p, struct h_conn *c, const json_t *hello)
{
    long long size = json_integer_value(json_object_get(hello, "size"));
    char path[64], req[128], *line = NULL;
    json_t *reply;
    void *map;
    int fd, rc = PEER_OTHER;

    if (c->nfds != 1) {
        fprintf(stderr, "peer: %d descriptors with hello\n", c->nfds);
        return PEER_OTHER;
    }
    fd = c->fds[0];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if ((map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) !=
            MAP_FAILED || errno != EACCES) {
        fprintf(stderr, "peer: mmap for writing: %s\n",
                map != MAP_FAILED ? "succeeded" : strerror(errno));
        return PEER_OTHER;
    }
    if ((fd = open(path, O_RDWR)) >= 0 || errno != EACCES) {
        fprintf(stderr, "peer: reopening %s for writing: %s\n", path,
                fd >= 0 ? "succeeded" : strerror(errno));
        return PEER_OTHER;
    }
    if ((fd = open(p->segment, O_RDONLY)) >= 0 || errno != EACCES) {
        fprintf(stderr, "peer: opening %s: %s\n", p->segment,
                fd >= 0 ? "succeeded" : strerror(errno));
        return PEER_OTHER;
    }
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, c->fds[0], 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "peer: mmap for reading: %s\n", strerror(errno));
        return PEER_OTHER;
    }
    snprintf(req, sizeof(req), "{\"op\":\"get\",\"key\":\"%s\"}", p->key);
    if (h_conn_sendline(c, req) == 0 && h_conn_recv_line(c, &line, H_REPLY_TIMEOUT_MS) == 0 &&
        (reply = json_loads(line, 0, NULL)) != NULL) {
        long long offset = json_integer_value(json_object_get(reply, "offset"));
        size_t bad;

        if (json_is_true(json_object_get(reply, "ok")) && offset > 0 &&
            (bad = h_check((char *)map + offset, p->size, p->seed)) == p->size)
            rc = PEER_SERVED;
        else
            fprintf(stderr, "peer: get %s: %s\n", p->key, line);
        json_decref(reply);
    }
    free(line);
    munmap(map, (size_t)size);
    return rc;
}

/* A helper: become another user, connect, say hello, report how it went. */
static int peer_run(void *arg)
{
    const struct peer *p = arg;
    const char *error;
    struct h_conn c;
    char *line = NULL;
    json_t *reply;
    int rc;

    if (peer_become(p) < 0)
        return PEER_OTHER;
    if ((rc = h_conn_open(&c, p->socket)) < 0) {
        fprintf(stderr, "peer: connect %s: %s\n", p->socket, strerror(-rc));
        return PEER_OTHER;
    }
    rc = h_conn_sendline(&c, p->read_only
                                 ? "{\"op\":\"hello\",\"version\":1,\"name\":\"peer\","
                                   "\"mode\":\"ro\"}"
                                 : "{\"op\":\"hello\",\"version\":1,\"name\":\"peer\"}");
    /* A refused peer may find the socket closed before its hello is sent. */
    if ((rc < 0 && rc != -EPIPE && rc != -ECONNRESET) ||
        h_conn_recv_line(&c, &line, H_REPLY_TIMEOUT_MS) < 0 ||
        (reply = json_loads(line, 0, NULL)) == NULL) {
        fprintf(stderr, "peer: no reply to hello\n");
        free(line);
        h_conn_close(&c);
        return PEER_OTHER;
    }
    if (json_is_true(json_object_get(reply, "ok"))) {
        rc = p->read_only ? peer_check_read_only(p, &c, reply) : PEER_SERVED;
    } else {
        error = json_string_value(json_object_get(reply, "error"));
        rc = PEER_OTHER;
        if (h_conn_wait_eof(&c, H_REPLY_TIMEOUT_MS) != 0)
            fprintf(stderr, "peer: refused but not closed\n");
        else if (p->refusal != NULL &&
                 !h_contains(json_string_value(json_object_get(reply, "message")),
                             p->refusal))
            fprintf(stderr, "peer: the refusal does not say \"%s\"\n", p->refusal);
        else if (error != NULL && strcmp(error, "EPERM") == 0)
            rc = PEER_EPERM;
        else if (error != NULL && strcmp(error, "EDQUOT") == 0)
            rc = PEER_EDQUOT;
        fprintf(stderr, "peer uid %d gid %d: %s\n", (int)p->uid, (int)p->gid, line);
    }
    json_decref(reply);
    free(line);
    h_conn_close(&c);
    return rc;
}

/* Run a peer helper as uid/gid and return its enum peer_result. */
static int run_peer(struct h_fix *f, struct peer *p)
{
    pid_t pid = h_fork(f, peer_run, p);

    assert_true(pid > 0);
    return h_child_wait(f, pid, H_RUN_TIMEOUT_MS);
}

/* ---- hostile input ----------------------------------------------------------- */

/* One hostile request and the reply it must get. */
struct hostile_case {
    const char *request;
    const char *code;
    const char *substr; /* in the message, or NULL */
};

static const struct hostile_case hostile_cases[] = {
    /* Out of range: negative, beyond 64 bits, beyond 2^63, the 32-bit wraps. */
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":-1}", "EINVAL", "\"size\" must be between 1"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":-9223372036854775808}", "EINVAL", "\"size\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":99999999999999999999}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":-99999999999999999999}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":9223372036854775808}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":9223372036854775807}", "E2BIG", "exceeds"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":18446744073709551616}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":-1}", "EINVAL", "\"readers\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":1000001}", "EINVAL", "\"readers\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":4294967297}", "EINVAL",
     "\"readers\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":99999999999999999999}", "EPROTO",
     NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"wait_ms\":-1}", "EINVAL", "\"wait_ms\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"wait_ms\":3600001}", "EINVAL", "\"wait_ms\""},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"wait_ms\":9223372036854775807}", "EINVAL",
     "\"wait_ms\""},
    {"{\"op\":\"touch\",\"key\":\"k\",\"readers\":-1}", "EINVAL", "\"readers\""},
    {"{\"op\":\"touch\",\"key\":\"k\",\"readers\":4294967296}", "EINVAL", "\"readers\""},
    {"{\"op\":\"list\",\"limit\":0}", "EINVAL", "\"limit\""},
    {"{\"op\":\"list\",\"limit\":-1}", "EINVAL", "\"limit\""},
    {"{\"op\":\"list\",\"limit\":100001}", "EINVAL", "\"limit\""},
    {"{\"op\":\"list\",\"limit\":4294967297}", "EINVAL", "\"limit\""},
    {"{\"op\":\"list\",\"limit\":99999999999999999999}", "EPROTO", NULL},
    /* Not integers at all. */
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":1.5}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10.0}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":1e3}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":1e999}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":true}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":null}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":\"10\"}", "EINVAL", "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":false}", "EINVAL",
     "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":0.5}", "EINVAL",
     "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"wait_ms\":true}", "EINVAL",
     "Expected integer"},
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"wait_ms\":2.5}", "EINVAL",
     "Expected integer"},
    {"{\"op\":\"list\",\"limit\":1.0}", "EINVAL", "Expected integer"},
    {"{\"op\":\"list\",\"limit\":true}", "EINVAL", "Expected integer"},
    {"{\"op\":\"touch\",\"key\":\"k\",\"readers\":[1]}", "EINVAL", "Expected integer"},
    /* Embedded NUL in keys and prefixes. */
    {"{\"op\":\"alloc\",\"key\":\"k\\u0000x\",\"size\":10}", "EPROTO", NULL},
    {"{\"op\":\"get\",\"key\":\"k\\u0000x\"}", "EPROTO", NULL},
    {"{\"op\":\"list\",\"prefix\":\"\\u0000\"}", "EPROTO", NULL},
    /* Invalid UTF-8 and invalid escapes. */
    {"{\"op\":\"get\",\"key\":\"\xff\xfe\"}", "EPROTO", NULL},
    {"{\"op\":\"get\",\"key\":\"\xc0\xaf\"}", "EPROTO", NULL},
    {"{\"op\":\"get\",\"key\":\"a\xe2\x82\"}", "EPROTO", NULL},
    {"{\"op\":\"alloc\",\"key\":\"\xed\xa0\x80\",\"size\":10}", "EPROTO", NULL},
    {"{\"op\":\"get\",\"key\":\"\\ud800\"}", "EPROTO", NULL},
    {"{\"op\":\"get\",\"\xff\":\"k\"}", "EPROTO", NULL},
    /* Duplicate fields. */
    {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"size\":99999}", "EPROTO", NULL},
};

/* Hostile integers (negative, beyond 2^63 and 2^64, values that wrap when
 * cut to 32 bits, floats, booleans, null, strings) for size, readers,
 * wait_ms and limit get EINVAL or EPROTO with a message; NUL in keys,
 * invalid UTF-8 and duplicate fields get EPROTO. None of them changes
 * anything or allocates a wild size (the daemon's RSS stays put), and the
 * connection keeps working afterwards. */
static void test_hostile_input(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct h_conn c;
    json_t *reply;
    long long rss0, rss1;
    size_t i;
    int round;

    /* Before hello too: a version that does not fit is not a version. */
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":99999999999999999999}", "EPROTO", NULL);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1.0}", "EINVAL", "Expected integer");
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":true}", "EINVAL", "Expected integer");
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":4294967297}", "EPROTO", "version");
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"hostile\"}");
    h_assert_ok(reply);
    json_decref(reply);

    rss0 = h_proc_rss_kib(d->pid);
    assert_true(rss0 > 0);
    for (round = 0; round < 20; round++) {
        for (i = 0; i < sizeof(hostile_cases) / sizeof(hostile_cases[0]); i++) {
            const struct hostile_case *hc = &hostile_cases[i];

            reply = h_call(&c, hc->request);
            if (round == 0)
                h_assert_error(reply, hc->code, hc->substr);
            else
                h_assert_error(reply, hc->code, NULL);
            json_decref(reply);
        }
    }
    rss1 = h_proc_rss_kib(d->pid);
    if (rss1 - rss0 > 16 * 1024)
        h_fail("the daemon's RSS grew from %lld KiB to %lld KiB on hostile requests", rss0,
               rss1);

    /* Nothing was allocated or counted, and the connection still works. */
    reply = stats_of(&c);
    assert_int_equal(h_int(reply, "objects"), 0);
    assert_int_equal(h_int(reply, "pending"), 0);
    assert_int_equal(h_int(reply, "used"), 0);
    assert_int_equal(counter(reply, "allocs"), 0);
    json_decref(reply);
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":10,\"readers\":1}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"k\"}");
    call_offset(&c, "{\"op\":\"get\",\"key\":\"k\"}");
    h_expect_ok(&c, "{\"op\":\"release\",\"key\":\"k\"}");
    /* touch past 2^32 must not wrap onto a real object's count either. */
    h_expect_error(&c, "{\"op\":\"touch\",\"key\":\"k\",\"readers\":4294967296}", "EINVAL",
                   "\"readers\"");
    reply = h_call(&c, "{\"op\":\"list\"}");
    h_assert_ok(reply);
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 1);
    assert_int_equal(h_int(json_array_get(json_object_get(reply, "objects"), 0), "readers"), 0);
    json_decref(reply);
    h_conn_close(&c);
    h_assert_alive(d);
    h_pass(f);
}

/* ---- dead and hung clients ----------------------------------------------------- */

#define STATS_BURST 5000

/* A client that pipelines thousands of requests and never reads the replies
 * is disconnected once more than --max-queued-output (64K here) is queued
 * for it, with a log line naming its pid; it got fewer replies than it
 * asked for. The same burst from a client that reads as it goes is served
 * in full, and the daemon keeps serving others. */
static void test_unread_replies(void **state)
{
    static const char *const flags[] = {"--max-queued-output", "64K", NULL};
    static const char req[] = "{\"op\":\"stats\"}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", flags);
    size_t reqlen = sizeof(req) - 1, i, got = 0;
    char *burst = malloc(reqlen * STATS_BURST), *line = NULL, needle[64];
    struct h_conn c;
    json_t *reply;
    int rc, chunk;

    assert_non_null(burst);
    for (i = 0; i < STATS_BURST; i++)
        memcpy(burst + i * reqlen, req, reqlen);

    /* A reader: 50 rounds of 100 pipelined requests, reading each round. */
    json_decref(h_open_hello(&c, d));
    for (chunk = 0; chunk < STATS_BURST / 100; chunk++) {
        assert_int_equal(h_conn_send(&c, burst, reqlen * 100), 0);
        for (i = 0; i < 100; i++) {
            reply = h_recv_json(&c);
            h_assert_ok(reply);
            json_decref(reply);
        }
    }
    h_conn_close(&c);
    assert_int_equal(log_count(d, "does not read its replies"), 0);

    /* The same number, all at once, without reading. */
    json_decref(h_open_hello(&c, d));
    rc = h_conn_send(&c, burst, reqlen * STATS_BURST);
    assert_true(rc == 0 || rc == -EPIPE || rc == -ECONNRESET);
    snprintf(needle, sizeof(needle), "client pid %d (e2e) does not read its replies",
             (int)getpid());
    h_wait_log(d, needle);
    /* What the kernel had buffered still arrives, then the end. */
    while ((rc = h_conn_recv_line(&c, &line, H_REPLY_TIMEOUT_MS)) == 0) {
        got++;
        free(line);
        line = NULL;
    }
    assert_int_equal(rc, -ECONNRESET);
    if (got >= STATS_BURST)
        h_fail("all %d replies arrived: the client was not disconnected", STATS_BURST);
    assert_int_equal(log_count(d, "limit 65536"), 1);
    h_conn_close(&c);
    free(burst);
    h_assert_alive(d);
    h_pass(f);
}

/* An allocation not committed within --alloc-timeout (300 ms) is dropped:
 * not earlier, its owner's commit then gets ETIMEDOUT naming the flag,
 * stats count it in counters.expired_allocs, the log says so, and the key
 * can be allocated and committed again. An allocation committed in time is
 * not touched. */
static void test_alloc_timeout(void **state)
{
    static const char *const flags[] = {"--alloc-timeout", "300ms", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", flags);
    struct h_conn c;
    json_t *reply;
    uint64_t t0, dropped_after;

    json_decref(h_open_hello(&c, d));
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"slow\",\"size\":1000}");
    t0 = h_now_ms();
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"quick\",\"size\":1000}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"quick\"}");
    assert_int_equal(stat_int(&c, "pending"), 1);
    while (stat_int(&c, "pending") != 0) {
        if (h_now_ms() - t0 > 3000)
            h_fail("the allocation was not dropped within 3 s (--alloc-timeout 300ms)");
        h_sleep_ms(10);
    }
    dropped_after = h_now_ms() - t0;
    if (dropped_after < 250)
        h_fail("the allocation was dropped after %llu ms, before --alloc-timeout 300ms",
               (unsigned long long)dropped_after);

    h_expect_error(&c, "{\"op\":\"commit\",\"key\":\"slow\"}", "ETIMEDOUT", "--alloc-timeout");
    reply = stats_of(&c);
    assert_int_equal(counter(reply, "expired_allocs"), 1);
    assert_int_equal(h_int(reply, "objects"), 1);
    json_decref(reply);
    h_wait_log(d, "dropped 1 allocation(s) not committed within 300 ms (--alloc-timeout)");
    h_expect_error(&c, "{\"op\":\"get\",\"key\":\"slow\"}", "ENOENT", NULL);
    call_offset(&c, "{\"op\":\"get\",\"key\":\"quick\"}");
    h_expect_ok(&c, "{\"op\":\"release\",\"key\":\"quick\"}");

    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"slow\",\"size\":1000}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"slow\"}");
    reply = stats_of(&c);
    assert_int_equal(h_int(reply, "objects"), 2);
    assert_int_equal(counter(reply, "expired_allocs"), 1);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* With --read-lease 400ms, an object put with readers=2 blocks reclaim
 * (ENOSPC naming it) until its lease runs out; then an alloc that needs its
 * space evicts it. The log says "read lease ... ran out" exactly once for it
 * however often stats and allocs look at it, and counters.lease_expiries is
 * 1. */
static void test_read_lease(void **state)
{
    static const char *const flags[] = {"--read-lease", "400ms", NULL};
    struct h_fix *f = *state;
    /* 69632 bytes of data: two objects of 30000 bytes fit, a third does not. */
    struct h_daemon *d = h_daemon_start(f, "72K", flags);
    struct h_conn c;
    json_t *reply;
    uint64_t t0;
    int i;

    json_decref(h_open_hello(&c, d));
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"held\",\"size\":30000,\"readers\":2}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"held\"}");
    t0 = h_now_ms();
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"filler\",\"size\":30000}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"filler\"}");
    h_expect_error(&c, "{\"op\":\"alloc\",\"key\":\"third\",\"size\":30000}", "ENOSPC",
                   "'held' blocks reclaim (pins=0, awaited reads=2)");
    if (h_now_ms() - t0 >= 400)
        h_skip(f, "too slow to check the object before its lease ran out");
    assert_int_equal(log_count(d, "read lease"), 0);

    h_sleep_ms((int)(t0 + 500 - h_now_ms()));
    /* The first look after the lease ran out notices it (and counts it). */
    json_decref(stats_of(&c));
    for (i = 0; i < 3; i++) {
        reply = stats_of(&c);
        assert_int_equal(counter(reply, "lease_expiries"), 1);
        json_decref(reply);
    }
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"third\",\"size\":30000}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"third\"}");
    h_expect_error(&c, "{\"op\":\"get\",\"key\":\"held\"}", "ENOENT", NULL);
    call_offset(&c, "{\"op\":\"alloc\",\"key\":\"fourth\",\"size\":30000}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"fourth\"}");
    reply = stats_of(&c);
    assert_int_equal(counter(reply, "lease_expiries"), 1);
    assert_true(counter(reply, "evictions") >= 2);
    json_decref(reply);
    h_wait_log(d, "object 'held': read lease of 400 ms ran out with 2 reads still awaited");
    assert_int_equal(log_count(d, "read lease"), 1);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- listing clients ----------------------------------------------------------- */

/* What the holder helper needs. */
struct holder_plan {
    const char *socket;
    struct h_signal ready, done;
};

/* A helper that pins "a" twice and "b" once (distinct bytes 3000 + 500),
 * leaves "p" pending, says ready, and waits to be told to go. */
static int holder_run(void *arg)
{
    struct holder_plan *plan = arg;
    shmb_t *c = shmb_new();
    const void *ptr;
    void *wptr;
    size_t len;

    if (c == NULL || shmb_connect(c, plan->socket, "holder") != 0 ||
        h_put_pattern(c, "a", 3000, 1, 0) != 0 || h_put_pattern(c, "b", 500, 2, 0) != 0 ||
        shmb_get(c, "a", &ptr, &len) != 0 || shmb_get(c, "a", &ptr, &len) != 0 ||
        shmb_get(c, "b", &ptr, &len) != 0 || shmb_alloc(c, "p", 100, 0, &wptr) != 0) {
        fprintf(stderr, "holder: %s\n", c ? shmb_errmsg(c) : "no memory");
        return 2;
    }
    h_signal_notify(&plan->ready);
    if (!h_signal_wait(&plan->done, H_RUN_TIMEOUT_MS))
        return 3;
    shmb_close(c);
    return 0;
}

/* The clients entry with this name; fails the test when absent. */
static const json_t *client_named(const json_t *reply, const char *name)
{
    const json_t *item;
    size_t i;

    json_array_foreach(json_object_get(reply, "clients"), i, item)
        if (strcmp(h_str(item, "name"), name) == 0)
            return item;
    h_fail("no client named %s in the clients reply", name);
}

/* The "clients" op lists every connection with its pid (the connecting
 * process's, from SO_PEERCRED), uid, gid, name, mode, pins (a key pinned
 * twice counts twice), pending allocations, bytes pinned (distinct objects)
 * and when it connected; `shmbrokerctl clients` shows the same. */
static void test_clients(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct holder_plan plan = {d->socket, {{-1, -1}}, {{-1, -1}}};
    const json_t *holder, *self;
    char pidtext[32], *row;
    struct h_conn c;
    struct h_run r;
    json_t *reply;
    long long now = (long long)time(NULL);
    pid_t pid;
    int fields;
    char name[32], mode[8], pinned[32];
    long long rpid, ruid, pins, pending;

    h_signal_open(&plan.ready);
    h_signal_open(&plan.done);
    pid = h_fork(f, holder_run, &plan);
    assert_true(pid > 0);
    if (!h_signal_wait(&plan.ready, H_REPLY_TIMEOUT_MS))
        h_fail("the holder did not get ready");

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"lister\",\"mode\":\"ro\"}");
    h_assert_ok(reply);
    json_decref(reply);
    reply = h_call(&c, "{\"op\":\"clients\"}");
    h_assert_ok(reply);
    assert_int_equal(json_array_size(json_object_get(reply, "clients")), 2);
    holder = client_named(reply, "holder");
    assert_int_equal(h_int(holder, "pid"), pid);
    assert_int_equal(h_int(holder, "uid"), getuid());
    assert_int_equal(h_int(holder, "gid"), getgid());
    assert_string_equal(h_str(holder, "mode"), "rw");
    assert_int_equal(h_int(holder, "pins"), 3);
    assert_int_equal(h_int(holder, "pending"), 1);
    assert_int_equal(h_int(holder, "bytes_pinned"), 3500);
    assert_true(h_int(holder, "connected_unix") >= now - 60 &&
                h_int(holder, "connected_unix") <= now + 1);
    assert_false(json_is_true(json_object_get(holder, "self")));
    self = client_named(reply, "lister");
    assert_int_equal(h_int(self, "pid"), getpid());
    assert_string_equal(h_str(self, "mode"), "ro");
    assert_int_equal(h_int(self, "pins"), 0);
    assert_int_equal(h_int(self, "pending"), 0);
    assert_true(json_is_true(json_object_get(self, "self")));
    json_decref(reply);

    /* shmbrokerctl clients: a header and one row per connection. */
    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "clients", NULL), 0);
    if (r.status != 0 || !h_contains(r.out, "PID") || !h_contains(r.out, "CONNECTED SINCE"))
        h_fail("shmbrokerctl clients: exit %d\n%s%s", r.status, r.out, r.err);
    snprintf(pidtext, sizeof(pidtext), "\n%8d ", (int)pid);
    row = strstr(r.out, pidtext);
    if (row == NULL)
        h_fail("no row for pid %d in:\n%s", (int)pid, r.out);
    fields = sscanf(row + 1, "%lld %lld %31s %7s %lld %lld %31s", &rpid, &ruid, name, mode,
                    &pins, &pending, pinned);
    assert_int_equal(fields, 7);
    assert_int_equal(rpid, pid);
    assert_int_equal(ruid, getuid());
    assert_string_equal(name, "holder");
    assert_string_equal(mode, "rw");
    assert_int_equal(pins, 3);
    assert_int_equal(pending, 1);
    assert_true(h_contains(r.out, "(this command)"));
    assert_true(h_contains(r.out, " lister "));
    h_run_free(&r);

    /* Once the holder is gone, so is its row and what it held. */
    h_signal_notify(&plan.done);
    assert_int_equal(h_child_wait(f, pid, H_RUN_TIMEOUT_MS), 0);
    while (stat_int(&c, "clients") != 1)
        h_sleep_ms(5);
    reply = h_call(&c, "{\"op\":\"clients\"}");
    assert_int_equal(json_array_size(json_object_get(reply, "clients")), 1);
    json_decref(reply);
    h_conn_close(&c);
    h_signal_close(&plan.ready);
    h_signal_close(&plan.done);
    h_pass(f);
}

/* ---- limits ------------------------------------------------------------------------ */

/* --max-clients 3: the fourth connection gets one EDQUOT line naming
 * max-clients (3) and is closed, the three keep working, the refusal is
 * logged, and once one of them closes a new connection is served. */
static void test_max_clients(void **state)
{
    static const char *const flags[] = {"--max-clients", "3", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", flags);
    struct h_conn c[4];
    char needle[80];
    int i;

    json_decref(h_open_hello(&c[0], d));
    /* The readiness probe's connection may not be gone yet. */
    while (stat_int(&c[0], "clients") != 1)
        h_sleep_ms(2);
    json_decref(h_open_hello(&c[1], d));
    json_decref(h_open_hello(&c[2], d));
    expect_refused(d, "EDQUOT", "max-clients (3) reached");
    expect_refused(d, "EDQUOT", "raise --max-clients");
    for (i = 0; i < 3; i++)
        assert_int_equal(stat_int(&c[i], "clients"), 3);
    snprintf(needle, sizeof(needle), "refused client pid %d: max-clients (3) reached",
             (int)getpid());
    h_wait_log(d, needle);

    h_conn_close(&c[2]);
    json_decref(hello_eventually(&c[3], d, 3000));
    assert_int_equal(stat_int(&c[3], "clients"), 3);
    expect_refused(d, "EDQUOT", "max-clients (3) reached");
    for (i = 0; i < 4; i++)
        if (i != 2)
            h_conn_close(&c[i]);
    h_pass(f);
}

/* --max-clients-per-uid 2: a third connection of root gets EDQUOT naming
 * max-clients-per-uid and is closed, while another user (nobody) is still
 * served, and root's two connections keep working. */
static void test_max_clients_per_uid(void **state)
{
    static const char *const flags[] = {"--max-clients-per-uid", "2", "--socket-mode", "0666",
                                        NULL};
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct peer p;
    struct h_conn c[2];

    need_root(f);
    open_up_dir(f);
    d = h_daemon_start(f, "1M", flags);
    json_decref(h_open_hello(&c[0], d));
    while (stat_int(&c[0], "clients") != 1)
        h_sleep_ms(2);
    json_decref(h_open_hello(&c[1], d));
    expect_refused(d, "EDQUOT", "max-clients-per-uid (2) reached for uid 0");
    memset(&p, 0, sizeof(p));
    p.socket = d->socket;
    p.uid = UID_NOBODY;
    p.gid = GID_NOBODY;
    assert_int_equal(run_peer(f, &p), PEER_SERVED);
    assert_int_equal(stat_int(&c[0], "clients"), 2);
    assert_int_equal(stat_int(&c[1], "clients"), 2);
    h_wait_log(d, "max-clients-per-uid (2) reached for uid 0");
    h_conn_close(&c[0]);
    h_conn_close(&c[1]);
    h_pass(f);
}

/* --max-pins 3: the fourth get on one connection is EDQUOT naming max-pins;
 * another connection may still pin; after a release the first may pin
 * again. */
static void test_max_pins(void **state)
{
    static const char *const flags[] = {"--max-pins", "3", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", flags);
    struct h_conn a, b;
    int i;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    call_offset(&a, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":100}");
    h_expect_ok(&a, "{\"op\":\"commit\",\"key\":\"x\"}");
    call_offset(&a, "{\"op\":\"alloc\",\"key\":\"y\",\"size\":100}");
    h_expect_ok(&a, "{\"op\":\"commit\",\"key\":\"y\"}");
    call_offset(&a, "{\"op\":\"get\",\"key\":\"x\"}");
    call_offset(&a, "{\"op\":\"get\",\"key\":\"x\"}");
    call_offset(&a, "{\"op\":\"get\",\"key\":\"y\"}");
    h_expect_error(&a, "{\"op\":\"get\",\"key\":\"y\"}", "EDQUOT", "max-pins (3) reached");
    h_expect_error(&a, "{\"op\":\"get\",\"key\":\"x\"}", "EDQUOT", "--max-pins");
    for (i = 0; i < 3; i++)
        call_offset(&b, "{\"op\":\"get\",\"key\":\"y\"}");
    h_expect_ok(&a, "{\"op\":\"release\",\"key\":\"x\"}");
    call_offset(&a, "{\"op\":\"get\",\"key\":\"y\"}");
    h_expect_error(&a, "{\"op\":\"get\",\"key\":\"y\"}", "EDQUOT", "max-pins");
    assert_int_equal(stat_int(&b, "pinned"), 2);
    h_conn_close(&a);
    h_conn_close(&b);
    h_assert_alive(d);
    h_pass(f);
}

/* --max-pending 2: a third uncommitted alloc on one connection is EDQUOT
 * naming max-pending and allocates nothing; another connection may still
 * allocate; after a commit the first may allocate again. */
static void test_max_pending(void **state)
{
    static const char *const flags[] = {"--max-pending", "2", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", flags);
    struct h_conn a, b;
    json_t *reply;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    call_offset(&a, "{\"op\":\"alloc\",\"key\":\"p1\",\"size\":100}");
    call_offset(&a, "{\"op\":\"alloc\",\"key\":\"p2\",\"size\":100}");
    h_expect_error(&a, "{\"op\":\"alloc\",\"key\":\"p3\",\"size\":100}", "EDQUOT",
                   "max-pending (2) reached");
    h_expect_error(&a, "{\"op\":\"alloc\",\"key\":\"p3\",\"size\":100}", "EDQUOT",
                   "--max-pending");
    reply = h_call(&b, "{\"op\":\"contains\",\"key\":\"p3\"}");
    h_assert_ok(reply);
    assert_true(json_is_false(json_object_get(reply, "exists")));
    json_decref(reply);
    assert_int_equal(stat_int(&b, "pending"), 2);
    call_offset(&b, "{\"op\":\"alloc\",\"key\":\"q1\",\"size\":100}");
    call_offset(&b, "{\"op\":\"alloc\",\"key\":\"q2\",\"size\":100}");
    h_expect_ok(&a, "{\"op\":\"commit\",\"key\":\"p1\"}");
    call_offset(&a, "{\"op\":\"alloc\",\"key\":\"p3\",\"size\":100}");
    h_expect_error(&a, "{\"op\":\"alloc\",\"key\":\"p4\",\"size\":100}", "EDQUOT",
                   "max-pending");
    assert_int_equal(stat_int(&b, "pending"), 4);
    h_conn_close(&a);
    h_conn_close(&b);
    h_assert_alive(d);
    h_pass(f);
}

/* ---- running out of descriptors --------------------------------------------------- */

#define EMFILE_NOFILE 32
#define EMFILE_WAITERS 3

/* Descriptors pid has open, or -1. */
static int count_fds(pid_t pid)
{
    char path[64];
    struct dirent *e;
    DIR *dir;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    if ((dir = opendir(path)) == NULL)
        return -1;
    while ((e = readdir(dir)) != NULL)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* What a connection of the EMFILE test got after its hello. */
enum fd_outcome { FD_SERVED, FD_REFUSED, FD_CLOSED, FD_WAITING };

/* Read c's answer to hello within timeout_ms and classify it; a refusal must
 * be EMFILE with a message, followed by EOF. */
static enum fd_outcome fd_outcome_of(struct h_conn *c, int timeout_ms)
{
    enum fd_outcome out;
    char *line = NULL;
    json_t *reply;
    int rc = h_conn_recv_line(c, &line, timeout_ms);

    if (rc == -ETIMEDOUT)
        return FD_WAITING;
    if (rc < 0)
        return FD_CLOSED;
    reply = json_loads(line, 0, NULL);
    if (reply == NULL)
        h_fail("not JSON: %s", line);
    free(line);
    if (json_is_true(json_object_get(reply, "ok"))) {
        out = FD_SERVED;
    } else {
        h_assert_error(reply, "EMFILE", "out of file descriptors");
        assert_int_equal(h_conn_wait_eof(c, H_REPLY_TIMEOUT_MS), 0);
        out = FD_REFUSED;
    }
    json_decref(reply);
    return out;
}

/* Started with RLIMIT_NOFILE 32 and hit by a burst of clients (queued while
 * it was stopped), the daemon serves clients until its descriptors run out,
 * refuses every client still queued with an EMFILE line (through its
 * reserved descriptor) so that none waits without an answer, logs "out of
 * file descriptors" once, and stops accepting instead of spinning: its CPU
 * time stays low for a second while new clients arrive, and those are
 * refused too, within about a second. Once some connections close it says it
 * accepts again, and new clients are served. */
static void test_emfile(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    struct h_conn *conns, extra, late[2];
    int base, capacity, nconns, i, n[4] = {0, 0, 0, 0}, closed = 0;
    enum fd_outcome *outcome;
    long long cpu0, cpu1;
    uint64_t t0, elapsed;
    json_t *reply;

    assert_true(h_daemon_spawn_nofile(f, d, NULL, EMFILE_NOFILE) > 0);
    h_wait_log(d, " ready: segment");
    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    base = count_fds(d->pid);
    capacity = EMFILE_NOFILE - base;
    if (base < 3 || capacity < EMFILE_WAITERS + 3)
        h_fail("the daemon has %d descriptors open of %d", base, EMFILE_NOFILE);
    /* Everyone it can serve, and more than it can. */
    nconns = capacity + 1 + EMFILE_WAITERS;
    conns = calloc((size_t)nconns, sizeof(*conns));
    outcome = calloc((size_t)nconns, sizeof(*outcome));
    assert_true(conns != NULL && outcome != NULL);
    for (i = 0; i < nconns; i++) {
        assert_int_equal(h_conn_open(&conns[i], d->socket), 0);
        assert_int_equal(h_conn_sendline(&conns[i],
                                         "{\"op\":\"hello\",\"version\":1,\"name\":\"fd\"}"), 0);
    }
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    h_wait_log(d, "out of file descriptors");
    for (i = 0; i < nconns; i++) {
        outcome[i] = fd_outcome_of(&conns[i], 2000);
        n[outcome[i]]++;
    }
    if (n[FD_REFUSED] < 1 || n[FD_CLOSED] != 0 || n[FD_SERVED] < capacity - 2 ||
        n[FD_WAITING] != 0 || n[FD_SERVED] + n[FD_REFUSED] != nconns)
        h_fail("of %d clients (%d descriptors free): %d served, %d refused with EMFILE, %d "
               "closed, %d waiting", nconns, capacity, n[FD_SERVED], n[FD_REFUSED],
               n[FD_CLOSED], n[FD_WAITING]);

    /* New clients arrive while it is out of descriptors: it must not spin on
     * the listener, and it refuses them within about a second. */
    cpu0 = h_proc_cpu_ticks(d->pid);
    t0 = h_now_ms();
    for (i = 0; i < 2; i++) {
        assert_int_equal(h_conn_open(&late[i], d->socket), 0);
        assert_int_equal(h_conn_sendline(&late[i],
                                         "{\"op\":\"hello\",\"version\":1,\"name\":\"late\"}"), 0);
    }
    for (i = 0; i < 2; i++) {
        assert_int_equal(fd_outcome_of(&late[i], 2500), FD_REFUSED);
        h_conn_close(&late[i]);
    }
    h_sleep_ms(500);
    cpu1 = h_proc_cpu_ticks(d->pid);
    elapsed = h_now_ms() - t0;
    assert_true(cpu0 >= 0 && cpu1 >= 0);
    if ((cpu1 - cpu0) * 1000 / sysconf(_SC_CLK_TCK) > (long long)elapsed / 4)
        h_fail("the daemon used %lld ticks of CPU in %llu ms while out of descriptors",
               cpu1 - cpu0, (unsigned long long)elapsed);
    assert_int_equal(log_count(d, "out of file descriptors"), 1);

    /* Served clients leave: it accepts again, and new clients are served. */
    for (i = 0; i < nconns && closed < 3; i++) {
        if (outcome[i] == FD_SERVED) {
            h_conn_close(&conns[i]);
            closed++;
        }
    }
    h_wait_log(d, "accepting new clients again");
    reply = hello_eventually(&extra, d, 3000);
    json_decref(reply);
    assert_int_equal(stat_int(&extra, "pid"), d->pid);
    h_conn_close(&extra);
    assert_int_equal(log_count(d, "out of file descriptors"), 1);
    for (i = 0; i < nconns; i++)
        h_conn_close(&conns[i]); /* idempotent: some closed above */
    free(conns);
    free(outcome);
    h_pass(f);
}

/* ---- access control ------------------------------------------------------------------- */

/* --allow-uid 12345 --allow-gid 65534 (socket mode 0666, so the file mode
 * lets everyone in): nobody in group 12346 is refused with EPERM and closed,
 * and the refusal is logged; uid 12345 is allowed by uid, nobody in group
 * nogroup (65534) by its primary gid, and root always. */
static void test_allow_lists(void **state)
{
    static const char *const flags[] = {"--allow-uid", "12345", "--allow-gid", "65534",
                                        "--socket-mode", "0666", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct peer p;
    struct h_conn c;

    need_root(f);
    open_up_dir(f);
    d = h_daemon_start(f, "1M", flags);
    memset(&p, 0, sizeof(p));
    p.socket = d->socket;

    p.uid = UID_NOBODY;
    p.gid = GID_OTHER;
    assert_int_equal(run_peer(f, &p), PEER_EPERM);
    h_wait_log(d, "uid 65534 gid 12346: not allowed");

    p.uid = UID_LISTED;
    p.gid = GID_OTHER;
    assert_int_equal(run_peer(f, &p), PEER_SERVED);

    p.uid = UID_NOBODY;
    p.gid = GID_NOBODY;
    assert_int_equal(run_peer(f, &p), PEER_SERVED);

    p.uid = UID_LISTED + 7;
    p.gid = GID_OTHER + 7;
    assert_int_equal(run_peer(f, &p), PEER_EPERM);

    json_decref(h_open_hello(&c, d));
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    h_conn_close(&c);
    h_pass(f);
}

/* --allow-gid 20000: a peer whose supplementary groups are many (300 of
 * them, 20000 the last, as a user of a large directory service may have)
 * is allowed by that group, not refused because its groups did not fit in
 * what the daemon asked the kernel for. */
static void test_allow_gid_many_groups(void **state)
{
    static const char *const flags[] = {"--allow-gid", "20000", "--socket-mode", "0666",
                                        NULL};
    static gid_t groups[300];
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct peer p;
    size_t i;

    need_root(f);
    open_up_dir(f);
    for (i = 0; i < 299; i++)
        groups[i] = (gid_t)(30000 + i);
    groups[299] = 20000;
    d = h_daemon_start(f, "1M", flags);
    memset(&p, 0, sizeof(p));
    p.socket = d->socket;
    p.uid = UID_NOBODY;
    p.gid = GID_OTHER;
    p.groups = groups;
    p.n_groups = 300;
    assert_int_equal(run_peer(f, &p), PEER_SERVED);
    p.n_groups = 299; /* without 20000 */
    assert_int_equal(run_peer(f, &p), PEER_EPERM);
    h_pass(f);
}

/* With --allow-uid only, nobody (uid 65534, gid 65534) gets one EPERM line
 * whose message names its uid and the flags, and is closed; the refusal is
 * logged with its pid; root is still served. */
static void test_allow_uid_message(void **state)
{
    static const char *const flags[] = {"--allow-uid", "12345", "--socket-mode", "0666", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct peer p;

    need_root(f);
    open_up_dir(f);
    d = h_daemon_start(f, "1M", flags);
    memset(&p, 0, sizeof(p));
    p.socket = d->socket;
    p.uid = UID_NOBODY;
    p.gid = GID_NOBODY;
    p.refusal = "uid 65534 (gid 65534) may not use this shmbrokerd: it is not in --allow-uid";
    assert_int_equal(run_peer(f, &p), PEER_EPERM);
    h_wait_log(d, "uid 65534 gid 65534: not allowed");
    h_assert_alive(d);
    h_pass(f);
}

/* ---- read-only clients --------------------------------------------------------------- */

/* A read-only client (hello "mode":"ro") gets "mode":"ro" back and a
 * descriptor that cannot be mapped for writing (mmap and mprotect fail with
 * EACCES), so it cannot write even by ignoring the library; alloc, commit,
 * abort, touch and delete are EPERM while get, release, contains, list,
 * stats and clients work. Through the library, shmb_set_read_only gives a
 * handle that reads and gets -EPERM on writes. The segment file is 0600 and
 * the daemon's; a read-only client running as another user can neither
 * reopen the descriptor for writing nor open the file. */
static void test_read_only(void **state)
{
    static const char *const flags[] = {"--socket-mode", "0666", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d;
    shmb_t *w, *ro;
    struct h_conn c;
    json_t *reply;
    char seg[PATH_MAX * 2];
    struct stat st;
    long long size, offset;
    unsigned char *map;
    const void *p;
    size_t len;
    void *wp;
    struct peer peer;

    if (geteuid() == 0)
        open_up_dir(f);
    d = h_daemon_start(f, "1M", flags);
    w = h_lib_connect(d, "writer", 0);
    ok(w, h_put_pattern(w, "obj", 5000, 7, 0));

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"ro\",\"mode\":\"ro\"}");
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "mode"), "ro");
    size = h_int(reply, "size");
    json_decref(reply);
    assert_int_equal(c.nfds, 1);
    assert_int_equal(fcntl(c.fds[0], F_GETFL) & O_ACCMODE, O_RDONLY);

    h_expect_error(&c, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":10}", "EPERM", "read-only");
    h_expect_error(&c, "{\"op\":\"commit\",\"key\":\"obj\"}", "EPERM", "'commit'");
    h_expect_error(&c, "{\"op\":\"abort\",\"key\":\"obj\"}", "EPERM", "'abort'");
    h_expect_error(&c, "{\"op\":\"touch\",\"key\":\"obj\",\"readers\":1}", "EPERM", "'touch'");
    h_expect_error(&c, "{\"op\":\"delete\",\"key\":\"obj\"}", "EPERM", "'delete'");
    offset = call_offset(&c, "{\"op\":\"get\",\"key\":\"obj\"}");
    reply = h_call(&c, "{\"op\":\"contains\",\"key\":\"obj\"}");
    h_assert_ok(reply);
    assert_true(json_is_true(json_object_get(reply, "exists")));
    json_decref(reply);
    h_expect_ok(&c, "{\"op\":\"list\"}");
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    h_expect_ok(&c, "{\"op\":\"clients\"}");

    errno = 0;
    map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, c.fds[0], 0);
    if (map != MAP_FAILED)
        h_fail("a read-only client mapped the segment for writing");
    assert_int_equal(errno, EACCES);
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, c.fds[0], 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(h_check(map + offset, 5000, 7), 5000);
    assert_int_equal(mprotect(map, (size_t)size, PROT_READ | PROT_WRITE), -1);
    assert_int_equal(errno, EACCES);
    munmap(map, (size_t)size);
    h_expect_ok(&c, "{\"op\":\"release\",\"key\":\"obj\"}");
    h_conn_close(&c);

    /* The library's read-only mode. */
    ro = h_lib_connect(d, "ro-lib", 1);
    get_check(ro, "obj", 5000, 7);
    fails(ro, shmb_alloc(ro, "x", 10, 0, &wp), -EPERM, "read-only");
    fails(ro, h_put_pattern(ro, "x", 10, 1, 0), -EPERM, NULL);
    fails(ro, shmb_delete(ro, "obj"), -EPERM, NULL);
    fails(ro, shmb_touch(ro, "obj", 1), -EPERM, NULL);
    assert_int_equal(shmb_contains(ro, "obj"), 1);
    ok(ro, shmb_get(ro, "obj", &p, &len));
    assert_int_equal(len, 5000);
    ok(ro, shmb_release(ro, "obj"));
    shmb_close(ro);
    /* The writer is not affected. */
    ok(w, h_put_pattern(w, "obj2", 100, 8, 0));
    get_check(w, "obj2", 100, 8);

    h_segment_path(d, seg, sizeof(seg));
    assert_int_equal(stat(seg, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(st.st_uid, geteuid());

    if (geteuid() == 0) {
        memset(&peer, 0, sizeof(peer));
        peer.socket = d->socket;
        peer.uid = UID_NOBODY;
        peer.gid = GID_NOBODY;
        peer.read_only = true;
        peer.segment = seg;
        peer.key = "obj";
        peer.seed = 7;
        peer.size = 5000;
        assert_int_equal(run_peer(f, &peer), PEER_SERVED);
    }
    shmb_close(w);
    h_pass(f);
}

/* ---- surviving a daemon restart ------------------------------------------------------- */

/* The objects the restart test puts, oldest first. */
static const struct {
    const char *key;
    size_t size;
    unsigned readers;
} restart_objects[] = {
    {"awaited", 50000, 1}, {"awaited3", 7000, 3}, {"obj-1", 1, 0},
    {"obj-63", 63, 0},     {"obj-64", 64, 0},     {"obj-65", 65, 0},
    {"obj-4096", 4096, 0}, {"obj-100000", 100000, 0}, {"obj-300000", 300000, 0},
};
#define RESTART_N (sizeof(restart_objects) / sizeof(restart_objects[0]))

/* What the pinning helper of the restart test needs. */
struct pin_plan {
    const char *socket;
    struct h_signal ready, go;
};

/* In a helper: lines of /proc/self/maps that map the segment name with
 * these permissions ("r--s"). */
static int maps_lines(const char *segment, const char *perms)
{
    char *maps = h_read_file("/proc/self/maps", NULL), *line, *save = NULL;
    int n = 0;

    if (maps == NULL)
        return -1;
    for (line = strtok_r(maps, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
        n += h_contains(line, segment) && h_contains(line, perms);
    free(maps);
    return n;
}

/* A helper that pins obj-100000 and keeps the pointer across a daemon
 * restart: its next call is -ECONNRESET, shmb_reconnect works, the old
 * pointer still reads the same bytes, and a new get returns the same
 * pointer. The page it reads is made read-only beforehand, which splits the
 * mapping: that split is still there after the reconnect only when the
 * library kept the mapping rather than mapping the file again (perhaps at
 * the same address). */
static int pin_run(void *arg)
{
    struct pin_plan *plan = arg;
    shmb_t *c = shmb_new();
    const void *p, *q;
    size_t len, bad;
    shmb_stats_t st;
    uintptr_t page;
    int rc;

    if (c == NULL || shmb_connect(c, plan->socket, "pinner") != 0 ||
        shmb_get(c, "obj-100000", &p, &len) != 0) {
        fprintf(stderr, "pinner: %s\n", c ? shmb_errmsg(c) : "no memory");
        return 2;
    }
    page = (uintptr_t)p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
    if (mprotect((void *)page, (size_t)sysconf(_SC_PAGESIZE), PROT_READ) != 0 ||
        maps_lines(shmb_info(c)->segment, "r--s") != 1) {
        fprintf(stderr, "pinner: cannot split the mapping: %s\n", strerror(errno));
        return 8;
    }
    h_signal_notify(&plan->ready);
    if (!h_signal_wait(&plan->go, H_RUN_TIMEOUT_MS))
        return 3;
    if ((rc = shmb_stats(c, &st)) != -ECONNRESET) {
        fprintf(stderr, "pinner: stats after the restart returned %d, not -ECONNRESET\n", rc);
        return 4;
    }
    if ((rc = shmb_reconnect(c)) != 0) {
        fprintf(stderr, "pinner: reconnect returned %d: %s\n", rc, shmb_errmsg(c));
        return 5;
    }
    if (maps_lines(shmb_info(c)->segment, "r--s") != 1) {
        fprintf(stderr, "pinner: the segment was mapped again on reconnect\n");
        return 9;
    }
    if ((bad = h_check(p, 100000, 8)) != 100000) {
        fprintf(stderr, "pinner: the old pointer reads a wrong byte at %zu\n", bad);
        return 6;
    }
    if ((rc = shmb_get(c, "obj-100000", &q, &len)) != 0 || q != p || len != 100000) {
        fprintf(stderr, "pinner: get after reconnect: %d, %p vs %p\n", rc, q, p);
        return 7;
    }
    shmb_release(c, "obj-100000");
    shmb_close(c);
    return 0;
}

/* SIGKILL the daemon and start it again with the same --name, --size and
 * --socket: every committed object is back byte-identical, with its awaited
 * reads (an object put with readers=1 still blocks reclaim until read, one
 * read twice of three still awaits two); deleted objects, also one deleted
 * while pinned, and pending allocations stay gone. A handle connected before
 * the kill gets -ECONNRESET, reconnects and works; a pointer from a get
 * before the restart still reads the same bytes. The daemon goes on working:
 * new puts, deletes, and a ring that empties to used == 0. */
static void test_restart_adopts(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "2M", NULL), *d2;
    struct pin_plan plan = {d1->socket, {{-1, -1}}, {{-1, -1}}};
    shmb_t *w, *r, *n;
    struct h_conn raw;
    json_t *reply, *objects, *item;
    shmb_stats_t st;
    const void *p;
    char *raw_reply = NULL;
    size_t len, i;
    char key[32], needle[64];
    pid_t pinner;
    int rc;

    w = h_lib_connect(d1, "writer", 0);
    r = h_lib_connect(d1, "reader", 0);
    for (i = 0; i < RESTART_N; i++)
        ok(w, h_put_pattern(w, restart_objects[i].key, restart_objects[i].size,
                          (uint32_t)(i + 1), restart_objects[i].readers));
    ok(r, shmb_get(r, "awaited3", &p, &len));
    ok(r, shmb_release(r, "awaited3"));
    ok(w, h_put_pattern(w, "gone", 1000, 99, 0));
    ok(w, shmb_delete(w, "gone"));
    ok(w, h_put_pattern(w, "deleted-pinned", 1000, 98, 0));
    ok(r, shmb_get(r, "deleted-pinned", &p, &len));
    ok(w, shmb_delete(w, "deleted-pinned"));
    json_decref(h_open_hello(&raw, d1));
    call_offset(&raw, "{\"op\":\"alloc\",\"key\":\"pend\",\"size\":1000}");
    h_signal_open(&plan.ready);
    h_signal_open(&plan.go);
    pinner = h_fork(f, pin_run, &plan);
    assert_true(pinner > 0);
    if (!h_signal_wait(&plan.ready, H_REPLY_TIMEOUT_MS))
        h_fail("the pinner did not get ready");

    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    h_conn_close(&raw);
    d2 = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0)
        h_fail("the restarted daemon did not come up");
    snprintf(needle, sizeof(needle), "restored %zu objects", RESTART_N);
    h_wait_log(d2, needle);
    h_wait_log(d2, "dropped 1 uncommitted");

    /* Handles of the old daemon: lost, then reconnected. */
    fails(w, shmb_stats(w, &st), -ECONNRESET, NULL);
    ok(w, shmb_reconnect(w));
    ok(w, shmb_stats(w, &st));
    assert_int_equal(st.objects, RESTART_N);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pinned, 0);
    h_signal_notify(&plan.go);
    assert_int_equal(h_child_wait(f, pinner, H_RUN_TIMEOUT_MS), 0);
    fails(r, shmb_contains(r, "obj-1"), -ECONNRESET, NULL);
    ok(r, shmb_reconnect(r));

    /* A new client sees exactly what was committed, byte for byte. */
    n = h_lib_connect(d2, "after", 0);
    shmb_set_arena(n, 0); /* used is 0 once all is deleted: no arena held */
    assert_int_equal(shmb_request(n, "{\"op\":\"list\"}", &raw_reply), 0);
    reply = json_loads(raw_reply, 0, NULL);
    free(raw_reply);
    assert_non_null(reply);
    objects = json_object_get(reply, "objects");
    assert_int_equal(json_array_size(objects), RESTART_N);
    json_array_foreach(objects, i, item) {
        assert_string_equal(h_str(item, "key"), restart_objects[i].key);
        assert_int_equal(h_int(item, "size"), restart_objects[i].size);
        assert_string_equal(h_str(item, "state"), "committed");
        assert_int_equal(h_int(item, "pins"), 0);
        assert_int_equal(h_int(item, "readers"),
                         i == 1 ? 2 : restart_objects[i].readers);
    }
    json_decref(reply);
    for (i = 2; i < RESTART_N; i++)
        get_check(n, restart_objects[i].key, restart_objects[i].size, (uint32_t)(i + 1));
    assert_int_equal(shmb_contains(n, "gone"), 0);
    assert_int_equal(shmb_contains(n, "deleted-pinned"), 0);
    assert_int_equal(shmb_contains(n, "pend"), 0);
    ok(n, h_put_pattern(n, "pend", 1000, 97, 0));
    get_check(n, "pend", 1000, 97);

    /* The awaited read survived: "awaited" blocks reclaim until it is read. */
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "fill-%zu", i);
        rc = h_put_pattern(n, key, 400000, (uint32_t)(200 + i), 0);
        if (rc != 0)
            break;
    }
    fails(n, rc, -ENOSPC, "'awaited' blocks reclaim (pins=0, awaited reads=1)");
    get_check(n, "awaited", 50000, 1);
    get_check(n, "awaited3", 7000, 2);
    get_check(n, "awaited3", 7000, 2);
    ok(n, h_put_pattern(n, key, 400000, 300, 0));
    get_check(n, key, 400000, 300);

    /* It keeps working to the end: delete everything, nothing is left. */
    assert_int_equal(shmb_request(n, "{\"op\":\"list\",\"limit\":100000}", &raw_reply), 0);
    reply = json_loads(raw_reply, 0, NULL);
    free(raw_reply);
    assert_non_null(reply);
    json_array_foreach(json_object_get(reply, "objects"), i, item)
        ok(n, shmb_delete(n, h_str(item, "key")));
    json_decref(reply);
    ok(n, shmb_stats(n, &st));
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.used, 0);
    ok(w, h_put_pattern(w, "again", 300000, 5, 0));
    get_check(r, "again", 300000, 5);
    shmb_close(n);
    shmb_close(r);
    shmb_close(w);
    h_signal_close(&plan.ready);
    h_signal_close(&plan.go);
    h_pass(f);
}

/* A restart with a different --size refuses to start, suggests --size N
 * (the old size) or --fresh, and leaves the segment and its objects
 * intact: a start with the old size brings them back. --fresh discards
 * them. */
static void test_restart_size_and_fresh(void **state)
{
    static const char *const fresh[] = {"--fresh", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    char seg[PATH_MAX * 2];
    struct stat st;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "keep", 10000, 42, 0));
    shmb_close(c);
    h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS);
    h_segment_path(d1, seg, sizeof(seg));

    d = h_daemon_again(f, d1);
    snprintf(d->size, sizeof(d->size), "2M");
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS)), 1);
    h_wait_log(d, "start with --size 1048576 to keep its objects, or with --fresh");
    assert_int_equal(stat(seg, &st), 0);
    assert_int_equal(st.st_size, 1048576);

    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    c = h_lib_connect(d, "r", 0);
    get_check(c, "keep", 10000, 42);
    shmb_close(c);
    h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS);

    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, fresh) > 0);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    h_wait_log(d, "(--fresh)");
    c = h_lib_connect(d, "r", 0);
    assert_int_equal(shmb_contains(c, "keep"), 0);
    ok(c, h_put_pattern(c, "keep", 10000, 43, 0));
    get_check(c, "keep", 10000, 43);
    shmb_close(c);
    h_pass(f);
}

/* Overwrite bytes of the segment file at offset. */
static void poke(const char *path, uint64_t offset, const void *bytes, size_t len)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);

    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, len, (off_t)offset), (ssize_t)len);
    close(fd);
}

/* A segment whose second chunk header lost its magic after a crash is
 * adopted: the objects before and after it come back byte-identical, the
 * corrupt chunk alone is dropped with a log line naming the bad magic, and
 * the daemon goes on working through several laps of the ring. A ring
 * cursor that makes no sense drops everything with a log line. Never a
 * crash. */
static void test_restart_corrupt(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    static const uint32_t bad_magic = 0xdeadbeef;
    uint64_t bad_end = UINT64_C(1) << 60;
    char seg[PATH_MAX * 2], key[32];
    struct h_conn raw;
    shmb_t *c;
    long long b_offset;
    int i;

    c = h_lib_connect(d1, "w", 0);
    /* Each object in a ring chunk of its own: a bad one is dropped alone. */
    shmb_set_arena(c, 0);
    ok(c, h_put_pattern(c, "a", 1000, 1, 0));
    ok(c, h_put_pattern(c, "b", 2000, 2, 0));
    ok(c, h_put_pattern(c, "c", 3000, 3, 0));
    shmb_close(c);
    json_decref(h_open_hello(&raw, d1));
    b_offset = call_offset(&raw, "{\"op\":\"get\",\"key\":\"b\"}");
    h_conn_close(&raw);
    h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS);
    h_segment_path(d1, seg, sizeof(seg));
    /* "b" has a one-byte key: its chunk header is the 64 bytes before it. */
    poke(seg, (uint64_t)b_offset - 64, &bad_magic, sizeof(bad_magic));

    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0)
        h_fail("the daemon did not start over a corrupt segment (exit %d)",
               h_exit_code(d->status));
    h_wait_log(d, "bad chunk magic 0xdeadbeef");
    h_wait_log(d, "restored 2 objects");
    c = h_lib_connect(d, "r", 0);
    get_check(c, "a", 1000, 1);
    assert_int_equal(shmb_contains(c, "b"), 0);
    get_check(c, "c", 3000, 3);
    ok(c, h_put_pattern(c, "b", 2000, 22, 0));
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "lap-%d", i);
        ok(c, h_put_pattern(c, key, 100000, (uint32_t)(400 + i), 0));
    }
    get_check(c, key, 100000, 439);
    shmb_close(c);
    h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS);

    /* A cursor pointing far outside the ring. */
    poke(seg, offsetof(struct shmb_segment_header, ring_end), &bad_end, sizeof(bad_end));
    d = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0)
        h_fail("the daemon did not start over a corrupt ring cursor (exit %d)",
               h_exit_code(d->status));
    h_wait_log(d, "Corrupt ring cursor");
    c = h_lib_connect(d, "r", 0);
    ok(c, h_put_pattern(c, "fresh", 5000, 6, 0));
    get_check(c, "fresh", 5000, 6);
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_hostile_input),
        TEST(test_unread_replies),
        TEST(test_alloc_timeout),
        TEST(test_read_lease),
        TEST(test_clients),
        TEST(test_max_clients),
        TEST(test_max_clients_per_uid),
        TEST(test_max_pins),
        TEST(test_max_pending),
        TEST(test_emfile),
        TEST(test_allow_lists),
        TEST(test_allow_gid_many_groups),
        TEST(test_allow_uid_message),
        TEST(test_read_only),
        TEST(test_restart_adopts),
        TEST(test_restart_size_and_fresh),
        TEST(test_restart_corrupt),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_reliability", tests, NULL, NULL);
}
