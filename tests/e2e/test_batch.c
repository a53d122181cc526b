// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the fast-path features: the batch op and "noreply" over
 * a raw socket, the library's put_many/get_many/release_many, and allocs that
 * wait for space ("wait_ms"): served on release, timed out naming the
 * blocker, in arrival order, forgotten when their client leaves, with the
 * requests pipelined behind them answered after them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* 1 MiB daemons: data area 1028096 bytes (a 16 KiB catalog follows it), max
 * object 512 KiB. Two objects of BIG bytes leave FREE_LEFT bytes free, too
 * few for one of WANT bytes. */
#define SEG_SIZE_ARG "1M"
#define BIG 500000
#define WANT 300000
#define FREE_LEFT 27904

/* ---- helpers --------------------------------------------------------------- */

/* A stats reply over a raw connection; the caller frees it. */
static json_t *raw_stats(struct h_conn *c)
{
    json_t *reply = h_call(c, "{\"op\":\"stats\"}");

    h_assert_ok(reply);
    return reply;
}

/* counters.noreply_errors of a stats reply. */
static long long noreply_errors(const json_t *stats)
{
    return h_int(json_object_get(stats, "counters"), "noreply_errors");
}

/* The next line on c must be the reply whose "id" is the string want. */
static json_t *expect_id(struct h_conn *c, const char *want)
{
    json_t *reply = h_recv_json(c);
    const char *id = json_string_value(json_object_get(reply, "id"));

    if (id == NULL || strcmp(id, want) != 0) {
        char *s = json_dumps(reply, JSON_COMPACT);

        h_fail("expected the reply with id \"%s\" next, got %s", want, s ? s : "?");
    }
    return reply;
}

/* Nothing arrives on c for ms milliseconds: a waiting request is still
 * waiting, and nothing overtook it. */
static void expect_silence(struct h_conn *c, int ms)
{
    char *line = NULL;
    int rc = h_conn_recv_line(c, &line, ms);

    if (rc != -ETIMEDOUT)
        h_fail("expected no reply within %d ms, got %s (rc %d)", ms, line ? line : "nothing",
               rc);
}

/* The full ring every wait_ms test starts from: "big" (BIG bytes, the
 * oldest, pinned by *pinner) and "filler" (BIG bytes, evictable), FREE_LEFT
 * bytes free. The caller closes both handles. */
static void fill_ring(const struct h_daemon *d, shmb_t **writer, shmb_t **pinner)
{
    const void *p;
    size_t len;
    shmb_stats_t st;

    *writer = h_lib_connect(d, "writer", 0);
    *pinner = h_lib_connect(d, "pinner", 0);
    ok(*writer, h_put_pattern(*writer, "big", BIG, 1, 0));
    ok(*writer, h_put_pattern(*writer, "filler", BIG, 2, 0));
    ok(*pinner, shmb_get(*pinner, "big", &p, &len));
    ok(*writer, shmb_stats(*writer, &st));
    assert_int_equal(st.free, FREE_LEFT);
    assert_int_equal(st.pinned, 1);
}

/* Send a waiting alloc of WANT bytes on a fresh raw connection. */
static void send_waiter(struct h_conn *c, const struct h_daemon *d, const char *key,
                        int wait_ms)
{
    char req[160];

    json_decref(h_open_hello(c, d));
    snprintf(req, sizeof(req),
             "{\"op\":\"alloc\",\"key\":\"%s\",\"size\":%d,\"wait_ms\":%d,\"id\":\"%s\"}", key,
             WANT, wait_ms, key);
    assert_int_equal(h_conn_sendline(c, req), 0);
}

/* ---- batch ----------------------------------------------------------------- */

/* A batch runs its ops in order (the commit sees the alloc before it) and
 * answers them in order on one line; an op's error is its own reply inside
 * an ok batch; each sub-op's "id" and the batch's own "id" come back. */
static void test_batch_in_order(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply, *replies, *r, *st;

    json_decref(h_open_hello(&c, d));
    reply = h_call(&c, "{\"op\":\"batch\",\"id\":\"outer\",\"ops\":["
                       "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100,\"id\":1},"
                       "{\"op\":\"commit\",\"key\":\"a\",\"id\":\"two\"},"
                       "{\"op\":\"get\",\"key\":\"nope\",\"id\":[3]},"
                       "{\"op\":\"get\",\"key\":\"a\"},"
                       "{\"op\":\"contains\",\"key\":\"a\",\"id\":5},"
                       "{\"op\":\"release\",\"key\":\"a\",\"id\":{\"six\":6}}]}");
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "outer");
    replies = json_object_get(reply, "replies");
    assert_true(json_is_array(replies));
    assert_int_equal(json_array_size(replies), 6);

    r = json_array_get(replies, 0);
    h_assert_ok(r);
    assert_int_equal(h_int(r, "id"), 1);
    assert_int_equal(h_int(r, "size"), 100);
    r = json_array_get(replies, 1);
    h_assert_ok(r);
    assert_string_equal(h_str(r, "id"), "two");
    r = json_array_get(replies, 2);
    h_assert_error(r, "ENOENT", "'nope'");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(r, "id"), 0)), 3);
    r = json_array_get(replies, 3);
    h_assert_ok(r);
    assert_null(json_object_get(r, "id"));
    assert_int_equal(h_int(r, "offset"), h_int(json_array_get(replies, 0), "offset"));
    r = json_array_get(replies, 4);
    h_assert_ok(r);
    assert_true(json_is_true(json_object_get(r, "exists")));
    assert_int_equal(h_int(r, "id"), 5);
    r = json_array_get(replies, 5);
    h_assert_ok(r);
    assert_int_equal(h_int(json_object_get(r, "id"), "six"), 6);
    json_decref(reply);

    /* The batch's effects stay: one committed object, no pin left. */
    st = raw_stats(&c);
    assert_int_equal(h_int(st, "objects"), 1);
    assert_int_equal(h_int(st, "pinned"), 0);
    json_decref(st);
    h_conn_close(&c);
    h_pass(f);
}

/* hello, batch, wait_ms and noreply are refused inside a batch, and so is an
 * element that is not an object, each with its own EINVAL while the rest of
 * the batch runs; "ops" that is not an array fails the whole request. */
static void test_batch_refusals(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    static const char *const why[] = {
        "'hello' cannot be part of a batch",
        "'batch' cannot be part of a batch",
        "\"wait_ms\" cannot be used inside a batch",
        "\"noreply\"",
        "Each op of a batch is a JSON object",
        "Each op of a batch is a JSON object",
    };
    struct h_conn c;
    json_t *reply, *replies, *r;
    size_t i;

    json_decref(h_open_hello(&c, d));
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"p\",\"size\":10}");
    reply = h_call(&c, "{\"op\":\"batch\",\"ops\":["
                       "{\"op\":\"hello\",\"version\":1,\"id\":0},"
                       "{\"op\":\"batch\",\"ops\":[],\"id\":1},"
                       "{\"op\":\"alloc\",\"key\":\"w\",\"size\":10,\"wait_ms\":5,\"id\":2},"
                       "{\"op\":\"commit\",\"key\":\"p\",\"noreply\":true,\"id\":3},"
                       "42,"
                       "\"stats\","
                       "{\"op\":\"contains\",\"key\":\"w\",\"id\":6}]}");
    h_assert_ok(reply);
    replies = json_object_get(reply, "replies");
    assert_int_equal(json_array_size(replies), 7);
    for (i = 0; i < 6; i++) {
        r = json_array_get(replies, i);
        h_assert_error(r, "EINVAL", why[i]);
        if (i < 4)
            assert_int_equal(h_int(r, "id"), (long long)i);
    }
    /* The refused alloc did not happen; the op after the refusals ran. */
    r = json_array_get(replies, 6);
    h_assert_ok(r);
    assert_true(json_is_false(json_object_get(r, "exists")));
    assert_int_equal(h_int(r, "id"), 6);
    json_decref(reply);
    /* The refused noreply commit did not happen either. */
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"p\"}");

    h_expect_error(&c, "{\"op\":\"batch\",\"ops\":{\"op\":\"stats\"}}", "EINVAL",
                   "must be an array");
    h_expect_error(&c, "{\"op\":\"batch\",\"ops\":\"stats\"}", "EINVAL", "must be an array");
    h_expect_error(&c, "{\"op\":\"batch\"}", "EINVAL", "Invalid 'batch' request");
    reply = h_call(&c, "{\"op\":\"batch\",\"ops\":[]}");
    h_assert_ok(reply);
    assert_int_equal(json_array_size(json_object_get(reply, "replies")), 0);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- noreply --------------------------------------------------------------- */

/* commit, abort, release, touch and delete with "noreply": true answer
 * nothing, so the next line read is the next request's reply; they still
 * take effect; their errors are counted in counters.noreply_errors and only
 * theirs ("noreply": false replies as usual). */
static void test_noreply(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;

    json_decref(h_open_hello(&c, d));
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":100}");
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"k2\",\"size\":100}");
    /* Everything in one write: only the requests with an id are answered. */
    assert_int_equal(
        h_conn_sendline(&c, "{\"op\":\"commit\",\"key\":\"k\",\"noreply\":true,\"id\":\"x\"}\n"
                            "{\"op\":\"abort\",\"key\":\"k2\",\"noreply\":true}\n"
                            "{\"op\":\"get\",\"key\":\"k\",\"id\":\"get\"}\n"
                            "{\"op\":\"touch\",\"key\":\"k\",\"readers\":1,\"noreply\":true}\n"
                            "{\"op\":\"release\",\"key\":\"k\",\"noreply\":true}\n"
                            "{\"op\":\"delete\",\"key\":\"k\",\"noreply\":true}\n"
                            "{\"op\":\"stats\",\"id\":\"s1\"}"),
        0);
    reply = expect_id(&c, "get");
    h_assert_ok(reply); /* the silent commit ran before it */
    json_decref(reply);
    reply = expect_id(&c, "s1");
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "objects"), 0); /* deleted */
    assert_int_equal(h_int(reply, "pending"), 0); /* k2 aborted */
    assert_int_equal(h_int(reply, "pinned"), 0);  /* released */
    assert_int_equal(noreply_errors(reply), 0);
    json_decref(reply);

    /* Five failing noreply requests, one failing request that wants a reply. */
    assert_int_equal(
        h_conn_sendline(&c, "{\"op\":\"commit\",\"key\":\"no\",\"noreply\":true}\n"
                            "{\"op\":\"abort\",\"key\":\"no\",\"noreply\":true}\n"
                            "{\"op\":\"release\",\"key\":\"no\",\"noreply\":true}\n"
                            "{\"op\":\"touch\",\"key\":\"no\",\"readers\":1,\"noreply\":true}\n"
                            "{\"op\":\"delete\",\"key\":\"no\",\"noreply\":true}\n"
                            "{\"op\":\"delete\",\"key\":\"no\",\"noreply\":false,\"id\":\"f\"}\n"
                            "{\"op\":\"stats\",\"id\":\"s2\"}"),
        0);
    reply = expect_id(&c, "f");
    h_assert_error(reply, "ENOENT", "'no'");
    json_decref(reply);
    reply = expect_id(&c, "s2");
    assert_int_equal(noreply_errors(reply), 5);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* "noreply" on ops that must answer (get, alloc, stats, contains) or with a
 * value that is not a boolean is EINVAL, and that error is replied. */
static void test_noreply_refused(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;

    json_decref(h_open_hello(&c, d));
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":10}");
    h_expect_ok(&c, "{\"op\":\"commit\",\"key\":\"k\"}");
    reply = h_call(&c, "{\"op\":\"get\",\"key\":\"k\",\"noreply\":true,\"id\":1}");
    h_assert_error(reply, "EINVAL", "not for 'get'");
    assert_int_equal(h_int(reply, "id"), 1);
    json_decref(reply);
    h_expect_error(&c, "{\"op\":\"alloc\",\"key\":\"j\",\"size\":10,\"noreply\":true}",
                   "EINVAL", "not for 'alloc'");
    h_expect_error(&c, "{\"op\":\"stats\",\"noreply\":true}", "EINVAL", "not for 'stats'");
    h_expect_error(&c, "{\"op\":\"contains\",\"key\":\"k\",\"noreply\":true}", "EINVAL",
                   "not for 'contains'");
    h_expect_error(&c, "{\"op\":\"release\",\"key\":\"k\",\"noreply\":\"yes\"}", "EINVAL",
                   "\"noreply\" is a boolean");
    /* None of them took effect: no pin, no allocation of j. */
    reply = raw_stats(&c);
    assert_int_equal(h_int(reply, "pinned"), 0);
    assert_int_equal(h_int(reply, "pending"), 0);
    assert_int_equal(noreply_errors(reply), 0);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- the library's batches --------------------------------------------------- */

/* put_many writes every byte, get_many hands back pointers to them,
 * release_many drops every pin (stats after it, on the same connection, sees
 * none); per-item results carry an EEXIST or ENOENT in the middle while the
 * items around it succeed, and the existing object keeps its bytes. */
static void test_library_many(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    static const size_t sizes[3] = {64, 5000, 100000};
    const char *keys[3] = {"m0", "m1", "m2"};
    const char *mixed[3] = {"n0", "m1", "n2"};
    unsigned char *bufs[3];
    const void *data[3], *ptrs[3];
    size_t got[3];
    int results[3], i;
    shmb_stats_t st;
    shmb_t *c = h_lib_connect(d, "many", 0);

    for (i = 0; i < 3; i++) {
        bufs[i] = malloc(sizes[i]);
        assert_non_null(bufs[i]);
        h_fill(bufs[i], sizes[i], (uint32_t)(10 + i));
        data[i] = bufs[i];
    }
    ok(c, shmb_put_many(c, 3, keys, data, sizes, 0, results));
    for (i = 0; i < 3; i++)
        assert_int_equal(results[i], 0);
    ok(c, shmb_get_many(c, 3, keys, ptrs, got, results));
    for (i = 0; i < 3; i++) {
        assert_int_equal(results[i], 0);
        assert_int_equal(got[i], sizes[i]);
        assert_int_equal(h_check(ptrs[i], got[i], (uint32_t)(10 + i)), got[i]);
    }
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 3);
    ok(c, shmb_release_many(c, 3, keys));
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 0);

    /* m1 exists: only it fails, the others are written and committed. */
    for (i = 0; i < 3; i++)
        h_fill(bufs[i], sizes[i], (uint32_t)(20 + i));
    assert_int_equal(shmb_put_many(c, 3, mixed, data, sizes, 0, results), -EEXIST);
    assert_int_equal(shmb_errcode(c), -EEXIST);
    assert_non_null(strstr(shmb_errmsg(c), "'m1'"));
    assert_int_equal(results[0], 0);
    assert_int_equal(results[1], -EEXIST);
    assert_int_equal(results[2], 0);
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pending, 0);
    ok(c, shmb_get_many(c, 3, mixed, ptrs, got, results));
    assert_int_equal(h_check(ptrs[0], got[0], 20), sizes[0]);
    assert_int_equal(h_check(ptrs[1], got[1], 11), sizes[1]); /* the old m1 */
    assert_int_equal(h_check(ptrs[2], got[2], 22), sizes[2]);
    ok(c, shmb_release_many(c, 3, mixed));

    /* An absent key in the middle of get_many. */
    mixed[1] = "absent";
    assert_int_equal(shmb_get_many(c, 3, mixed, ptrs, got, results), -ENOENT);
    assert_int_equal(results[0], 0);
    assert_int_equal(results[1], -ENOENT);
    assert_null(ptrs[1]);
    assert_int_equal(results[2], 0);
    assert_int_equal(h_check(ptrs[2], got[2], 22), sizes[2]);
    {
        const char *pinned[2] = {"n0", "n2"};

        ok(c, shmb_release_many(c, 2, pinned));
    }
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.objects, 5);
    for (i = 0; i < 3; i++)
        free(bufs[i]);
    shmb_close(c);
    h_pass(f);
}

/* ---- wait_ms ----------------------------------------------------------------- */

/* A waiting alloc is not answered while the oldest object is pinned, and is
 * answered promptly (well under a second) once that pin is released. */
static void test_wait_served_on_release(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    shmb_t *writer, *pinner;
    struct h_conn w;
    json_t *reply;
    uint64_t t0, dt;

    fill_ring(d, &writer, &pinner);
    send_waiter(&w, d, "w", 10000);
    expect_silence(&w, 300);
    t0 = h_now_ms();
    ok(pinner, shmb_release(pinner, "big"));
    reply = h_recv_json(&w);
    dt = h_now_ms() - t0;
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "w");
    assert_int_equal(h_int(reply, "size"), WANT);
    json_decref(reply);
    if (dt >= 1000)
        h_fail("the waiter was served %llu ms after the release", (unsigned long long)dt);
    h_expect_ok(&w, "{\"op\":\"commit\",\"key\":\"w\"}");
    h_conn_close(&w);
    shmb_close(pinner);
    shmb_close(writer);
    h_pass(f);
}

/* A waiter held back by an object that awaits a read (not pinned) is
 * served once that read is done in place, counted in the chunk's seal as a
 * reader of the mapping does: nothing reaches the daemon, which looks at
 * the blocker again every 10 ms while allocations wait. Without that the
 * waiter would time out. */
static void test_wait_served_on_read_in_place(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    char path[PATH_MAX * 2];
    struct h_conn w, r;
    uint64_t *seal, old;
    json_t *reply;
    unsigned char *map;
    long long offset;
    shmb_t *writer;
    int fd;

    writer = h_lib_connect(d, "writer", 0);
    ok(writer, h_put_pattern(writer, "big", BIG, 1, 1)); /* awaits one read */
    ok(writer, h_put_pattern(writer, "filler", BIG, 2, 0));
    json_decref(h_open_hello(&r, d));
    reply = h_call(&r, "{\"op\":\"list\",\"prefix\":\"big\"}");
    offset = h_int(json_array_get(json_object_get(reply, "objects"), 0), "offset");
    json_decref(reply);
    send_waiter(&w, d, "w", 10000);
    expect_silence(&w, 300);
    h_segment_path(d, path, sizeof(path));
    fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    map = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(map != MAP_FAILED);
    seal = (uint64_t *)(map + offset - SHMB_CHUNK_HEADER_SIZE(3) +
                        offsetof(struct shmb_chunk_header, seal));
    old = __atomic_load_n(seal, __ATOMIC_ACQUIRE);
    assert_true(SHMB_SEAL_GEN(old) != 0);
    assert_true(__atomic_compare_exchange_n(seal, &old, SHMB_SEAL(SHMB_SEAL_GEN(old), 1), false,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    reply = h_recv_json(&w);
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "size"), WANT);
    json_decref(reply);
    reply = h_call(&r, "{\"op\":\"stats\"}");
    assert_int_equal(h_int(json_object_get(reply, "counters"), "fast_reads"), 1);
    assert_int_equal(h_int(json_object_get(reply, "counters"), "evictions"), 1);
    json_decref(reply);
    munmap(map, 1 << 20);
    h_conn_close(&w);
    h_conn_close(&r);
    shmb_close(writer);
    h_pass(f);
}

/* A waiter whose time runs out gets ETIMEDOUT naming the blocker, after (not
 * before) its wait_ms. */
static void test_wait_timeout(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    shmb_t *writer, *pinner;
    struct h_conn w;
    json_t *reply;
    uint64_t t0, dt;

    fill_ring(d, &writer, &pinner);
    t0 = h_now_ms();
    send_waiter(&w, d, "w", 300);
    reply = h_recv_json(&w);
    dt = h_now_ms() - t0;
    h_assert_error(reply, "ETIMEDOUT", "Waited 300 ms");
    h_assert_error(reply, "ETIMEDOUT", "the oldest object 'big' blocks reclaim (pins=1");
    assert_string_equal(h_str(reply, "id"), "w");
    json_decref(reply);
    if (dt < 290 || dt > 3000)
        h_fail("ETIMEDOUT came after %llu ms, wait_ms was 300", (unsigned long long)dt);
    /* The connection goes on, and nothing was allocated. */
    reply = raw_stats(&w);
    assert_int_equal(h_int(reply, "pending"), 0);
    json_decref(reply);
    h_conn_close(&w);
    shmb_close(pinner);
    shmb_close(writer);
    h_pass(f);
}

/* Three waiters are served in arrival order: when the release makes room,
 * the ring allocates them one after the other, so their offsets rise in the
 * order they asked. */
static void test_waiters_in_order(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    static const char *const keys[3] = {"w1", "w2", "w3"};
    shmb_t *writer, *pinner;
    struct h_conn w[3];
    long long offsets[3];
    json_t *reply;
    int i;

    fill_ring(d, &writer, &pinner);
    for (i = 0; i < 3; i++) {
        send_waiter(&w[i], d, keys[i], 10000);
        h_sleep_ms(50); /* let the daemon queue it before the next one */
    }
    for (i = 0; i < 3; i++)
        expect_silence(&w[i], 50);
    ok(pinner, shmb_release(pinner, "big"));
    for (i = 0; i < 3; i++) {
        reply = h_recv_json(&w[i]);
        h_assert_ok(reply);
        assert_string_equal(h_str(reply, "id"), keys[i]);
        offsets[i] = h_int(reply, "offset");
        json_decref(reply);
    }
    if (!(offsets[0] < offsets[1] && offsets[1] < offsets[2]))
        h_fail("waiters allocated out of order: w1 at %lld, w2 at %lld, w3 at %lld",
               offsets[0], offsets[1], offsets[2]);
    for (i = 0; i < 3; i++)
        h_conn_close(&w[i]);
    shmb_close(pinner);
    shmb_close(writer);
    h_pass(f);
}

/* h_eventually's condition: the daemon counts three clients. */
static bool three_clients(void *arg)
{
    shmb_stats_t st;

    return shmb_stats(arg, &st) == 0 && st.clients == 3;
}

/* A waiter that disconnects leaves no trace: it is not served (and does not
 * block) when room comes, nothing is pending, allocs work, and the waiter
 * behind it is served. */
static void test_waiter_disconnects(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    shmb_t *writer, *pinner;
    struct h_conn gone, w;
    shmb_stats_t st;
    json_t *reply;

    fill_ring(d, &writer, &pinner);
    send_waiter(&gone, d, "gone", 10000);
    h_sleep_ms(50);
    h_conn_close(&gone);
    send_waiter(&w, d, "w", 10000);
    expect_silence(&w, 100);
    /* The daemon notices the disconnect while the waiter waits: three
     * clients (writer, pinner, w), not four. */
    if (!h_eventually(three_clients, writer, 1000))
        h_fail("the daemon still counts the disconnected waiter as a client");
    ok(writer, shmb_stats(writer, &st));
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.allocs, 2); /* big and filler */

    ok(pinner, shmb_release(pinner, "big"));
    reply = h_recv_json(&w);
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "w");
    json_decref(reply);
    h_expect_ok(&w, "{\"op\":\"commit\",\"key\":\"w\"}");
    ok(writer, shmb_stats(writer, &st));
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.clients, 3);
    /* Only w's alloc was served: the gone waiter never was. */
    assert_int_equal(st.allocs, 3);
    assert_int_equal(shmb_contains(writer, "gone"), 0);
    ok(writer, h_put_pattern(writer, "gone", 1000, 3, 0)); /* its key was never taken */
    ok(writer, h_put_pattern(writer, "later", 1000, 4, 0));
    h_conn_close(&w);
    shmb_close(pinner);
    shmb_close(writer);
    h_assert_alive(d);
    h_pass(f);
}

/* Requests pipelined behind a waiting alloc on the same connection are not
 * answered before it (nothing overtakes), and are answered after it, in
 * order. */
static void test_pipelined_behind_wait(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    shmb_t *writer, *pinner;
    struct h_conn w;
    json_t *reply;

    fill_ring(d, &writer, &pinner);
    json_decref(h_open_hello(&w, d));
    assert_int_equal(
        h_conn_sendline(&w, "{\"op\":\"alloc\",\"key\":\"w\",\"size\":300000,"
                            "\"wait_ms\":10000,\"id\":\"a\"}\n"
                            "{\"op\":\"contains\",\"key\":\"filler\",\"id\":\"b\"}\n"
                            "{\"op\":\"commit\",\"key\":\"w\",\"id\":\"c\"}\n"
                            "{\"op\":\"stats\",\"id\":\"d\"}"),
        0);
    expect_silence(&w, 300);
    ok(pinner, shmb_release(pinner, "big"));
    reply = expect_id(&w, "a");
    h_assert_ok(reply);
    json_decref(reply);
    reply = expect_id(&w, "b");
    h_assert_ok(reply);
    json_decref(reply);
    reply = expect_id(&w, "c");
    h_assert_ok(reply); /* the commit ran after the alloc it needs */
    json_decref(reply);
    reply = expect_id(&w, "d");
    assert_int_equal(h_int(reply, "pending"), 0);
    json_decref(reply);
    h_conn_close(&w);
    shmb_close(pinner);
    shmb_close(writer);
    h_pass(f);
}

/* The helper of test_library_wait: a put that waits up to 10 s for space. */
static int library_waiter(void *arg)
{
    const struct h_daemon *d = arg;
    unsigned char *buf = calloc(1, WANT);
    shmb_t *c = shmb_new();
    int rc = -ENOMEM;

    if (c != NULL && buf != NULL && (rc = shmb_connect(c, d->socket, "waiter")) == 0) {
        shmb_set_alloc_wait(c, 10000);
        rc = shmb_put(c, "lw", buf, WANT, 0);
    }
    if (rc != 0)
        fprintf(stderr, "library_waiter: %d %s\n", rc, c ? shmb_errmsg(c) : "");
    shmb_close(c);
    free(buf);
    return rc == 0 ? 0 : 1;
}

/* shmb_set_alloc_wait: without it a full ring is ENOSPC at once; with it the
 * library times out with ETIMEDOUT naming the blocker, or returns as soon as
 * another client releases the blocking pin. */
static void test_library_wait(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    shmb_t *writer, *pinner;
    void *p;
    uint64_t t0, dt;
    int status;
    pid_t pid;

    fill_ring(d, &writer, &pinner);
    t0 = h_now_ms();
    assert_int_equal(shmb_alloc(writer, "t", WANT, 0, &p), -ENOSPC);
    assert_true(h_now_ms() - t0 < 200);
    shmb_set_alloc_wait(writer, 200);
    t0 = h_now_ms();
    assert_int_equal(shmb_alloc(writer, "t", WANT, 0, &p), -ETIMEDOUT);
    dt = h_now_ms() - t0;
    assert_non_null(strstr(shmb_errmsg(writer), "'big'"));
    if (dt < 190 || dt > 3000)
        h_fail("ETIMEDOUT after %llu ms, wait was 200", (unsigned long long)dt);

    assert_true((pid = h_fork(f, library_waiter, d)) > 0);
    h_sleep_ms(300);
    assert_int_equal(waitpid(pid, &status, WNOHANG), 0); /* still waiting */
    ok(pinner, shmb_release(pinner, "big"));
    assert_int_equal(h_child_wait(f, pid, 3000), 0);
    assert_int_equal(shmb_contains(writer, "lw"), 1);
    shmb_close(pinner);
    shmb_close(writer);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_batch_in_order),
        TEST(test_batch_refusals),
        TEST(test_noreply),
        TEST(test_noreply_refused),
        TEST(test_library_many),
        TEST(test_wait_served_on_release),
        TEST(test_wait_served_on_read_in_place),
        TEST(test_wait_timeout),
        TEST(test_waiters_in_order),
        TEST(test_waiter_disconnects),
        TEST(test_pipelined_behind_wait),
        TEST(test_library_wait),
    };

    return cmocka_run_group_tests_name("test_batch", tests, NULL, NULL);
}
