// SPDX-License-Identifier: Apache-2.0
/*
 * The command layer (daemon/command.h) without sockets: request lines in,
 * replies and result flags out, over a real store in ordinary memory
 * (tests/support/fixture.c). Only the public interface is used: what conn.c
 * sees of a request is what is checked here.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/alloc.h"
#include "../../proto/layout.h"
#include "fixture.h"

/* 64 KiB of data: three objects of 20000 bytes fill it. */
#define FIX_SIZE (64 * 1024 + 4096)
#define FIX_MAX_OBJECT (32 * 1024)

/* What one request gave back. */
struct outcome {
    json_t *reply;        /* NULL when nothing is to be sent */
    unsigned flags;       /* enum command_flag */
    json_t *wait_request; /* COMMAND_WAIT only */
    uint64_t wait_until_ms;
};

struct ctx {
    struct fixture f;
    struct command_client w, r, other; /* writer, read-only reader, another writer */
};

static void outcome_take(struct command_result *res, struct outcome *o)
{
    o->reply = command_result_json(res);
    o->flags = res->flags;
    o->wait_request = NULL;
    o->wait_until_ms = 0;
    if (res->flags & COMMAND_WAIT) {
        o->wait_request = res->wait_request;
        o->wait_until_ms = res->wait_until_ms;
    } else {
        json_decref(res->wait_request);
    }
    shmb_free(res->text.buf);
}

static void outcome_free(struct outcome *o)
{
    json_decref(o->reply);
    json_decref(o->wait_request);
    memset(o, 0, sizeof(*o));
}

static void run(struct ctx *c, struct command_client *cl, const char *line, struct outcome *o)
{
    struct command_result res;

    memset(&res, 0, sizeof(res));
    command_execute(&c->f.env, cl, line, strlen(line), &res);
    outcome_take(&res, o);
}

static void retry(struct ctx *c, struct command_client *cl, struct outcome *waiting, bool final,
                  struct outcome *o)
{
    struct command_result res;

    memset(&res, 0, sizeof(res));
    command_retry(&c->f.env, cl, waiting->wait_request, waiting->wait_until_ms, final, &res);
    outcome_take(&res, o);
}

/* The reply equals the JSON text want, field for field. */
static void assert_json_at(const json_t *got, const char *want, const char *file, int line)
{
    json_t *w = json_loads(want, JSON_REJECT_DUPLICATES, NULL);
    char *text = got != NULL ? json_dumps(got, JSON_COMPACT) : NULL;
    bool same;

    if (w == NULL)
        fail_msg("%s:%d: bad expected JSON %s", file, line, want);
    same = got != NULL && json_equal(w, got);
    if (!same)
        print_error("%s:%d:\n  expected %s\n  got      %s\n", file, line, want,
                    text != NULL ? text : "(no reply)");
    free(text);
    json_decref(w);
    if (!same)
        _fail(file, line);
}
#define assert_json(got, want) assert_json_at((got), (want), __FILE__, __LINE__)

/* Run line; its reply must equal want and come without flags. */
static void expect_at(struct ctx *c, struct command_client *cl, const char *line,
                      const char *want, const char *file, int lineno)
{
    struct outcome o;

    run(c, cl, line, &o);
    assert_json_at(o.reply, want, file, lineno);
    if (o.flags != 0)
        print_error("%s:%d: flags %#x\n", file, lineno, o.flags);
    assert_int_equal(o.flags, 0);
    outcome_free(&o);
}
#define expect(c, cl, line, want) expect_at((c), (cl), (line), (want), __FILE__, __LINE__)

/* Run line; it must fail with code and a message that contains substr. */
static void expect_error_at(struct ctx *c, struct command_client *cl, const char *line,
                            const char *code, const char *substr, const char *file,
                            int lineno)
{
    struct outcome o;
    const char *err, *msg;

    run(c, cl, line, &o);
    if (o.reply == NULL)
        fail_msg("%s:%d: no reply to %s", file, lineno, line);
    err = json_string_value(json_object_get(o.reply, "error"));
    msg = json_string_value(json_object_get(o.reply, "message"));
    if (err == NULL || strcmp(err, code) != 0 || msg == NULL ||
        (substr != NULL && strstr(msg, substr) == NULL)) {
        char *text = json_dumps(o.reply, JSON_COMPACT);

        print_error("%s:%d: expected %s (%s), got %s\n", file, lineno, code,
                    substr != NULL ? substr : "", text);
        free(text);
        _fail(file, lineno);
    }
    assert_false(json_is_true(json_object_get(o.reply, "ok")));
    outcome_free(&o);
}
#define expect_error(c, cl, line, code, substr) \
    expect_error_at((c), (cl), (line), (code), (substr), __FILE__, __LINE__)

static int setup(void **state)
{
    struct ctx *c = calloc(1, sizeof(*c));

    if (c == NULL || fixture_init(&c->f, FIX_SIZE, FIX_MAX_OBJECT) != 0)
        return -1;
    command_client_open(&c->f.env, &c->w);
    command_client_open(&c->f.env, &c->r);
    command_client_open(&c->f.env, &c->other);
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    struct ctx *c = *state;

    command_client_close(&c->f.env, &c->w);
    command_client_close(&c->f.env, &c->r);
    command_client_close(&c->f.env, &c->other);
    fixture_fini(&c->f);
    free(c);
    return 0;
}

/* Run line; it must succeed. */
static void run_ok_at(struct ctx *c, struct command_client *cl, const char *line,
                      const char *file, int lineno)
{
    struct outcome o;

    run(c, cl, line, &o);
    if (!json_is_true(json_object_get(o.reply, "ok")))
        fail_msg("%s:%d: %s failed", file, lineno, line);
    outcome_free(&o);
}
#define run_ok(c, cl, line) run_ok_at((c), (cl), (line), __FILE__, __LINE__)

/* Say hello on all three clients: w and other read-write, r read-only. */
static void hello_all(struct ctx *c)
{
    run_ok(c, &c->w, "{\"op\":\"hello\",\"version\":1,\"name\":\"writer\"}");
    run_ok(c, &c->other, "{\"op\":\"hello\",\"version\":1,\"name\":\"other\"}");
    run_ok(c, &c->r, "{\"op\":\"hello\",\"version\":1,\"mode\":\"ro\",\"name\":\"reader\"}");
}

/* Proves that a successful hello answers the segment's figures and asks for
 * the descriptor (COMMAND_SEND_FD), once: a failed or second hello does not. */
static void test_hello(void **state)
{
    struct ctx *c = *state;
    struct outcome o;

    run(c, &c->w, "{\"op\":\"hello\",\"version\":2,\"id\":1}", &o);
    assert_int_equal(o.flags & COMMAND_SEND_FD, 0);
    assert_json(o.reply, "{\"ok\":false,\"error\":\"EPROTO\",\"message\":\"Unsupported "
                         "protocol version 2; this shmbrokerd speaks version 1.\",\"id\":1}");
    outcome_free(&o);

    run(c, &c->w, "{\"op\":\"hello\",\"version\":1,\"id\":\"h\"}", &o);
    assert_int_equal(o.flags, COMMAND_SEND_FD);
    assert_json(o.reply, "{\"ok\":true,\"version\":1,\"segment\":\"fixture\",\"size\":69632,"
                         "\"data_offset\":4096,\"data_size\":65536,\"catalog_offset\":69632,"
                         "\"catalog_slots\":0,\"catalog_seed\":0,\"layout\":2,"
                         "\"max_object_size\":32768,"
                         "\"alignment\":64,\"mode\":\"rw\",\"pool\":\"fixture\","
                         "\"backing\":\"shm\",\"id\":\"h\"}");
    outcome_free(&o);

    run(c, &c->w, "{\"op\":\"hello\",\"version\":1}", &o);
    assert_int_equal(o.flags & COMMAND_SEND_FD, 0);
    outcome_free(&o);

    /* A pool the daemon does not have: refused, listing the pools. */
    run(c, &c->other, "{\"op\":\"hello\",\"version\":1,\"pool\":\"nope\",\"id\":3}", &o);
    assert_int_equal(o.flags & COMMAND_SEND_FD, 0);
    assert_json(o.reply, "{\"ok\":false,\"error\":\"ENOENT\",\"message\":\"No pool 'nope' in "
                         "this shmbrokerd; its pools are: fixture.\",\"id\":3}");
    outcome_free(&o);
    run(c, &c->other, "{\"op\":\"hello\",\"version\":1,\"pool\":\"fixture\",\"id\":4}", &o);
    assert_int_equal(o.flags, COMMAND_SEND_FD);
    outcome_free(&o);

    run(c, &c->r, "{\"op\":\"hello\",\"version\":1,\"mode\":\"ro\"}", &o);
    assert_int_equal(o.flags, COMMAND_SEND_FD);
    assert_string_equal(json_string_value(json_object_get(o.reply, "mode")), "ro");
    outcome_free(&o);
}

/* Proves that every op but hello is refused before hello, with EPROTO. */
static void test_before_hello(void **state)
{
    struct ctx *c = *state;

    expect_error(c, &c->w, "{\"op\":\"stats\"}", "EPROTO", "Say hello first");
    expect_error(c, &c->w, "{\"op\":\"nope\"}", "EPROTO", "Say hello first");
    expect_error(c, &c->w, "not json", "EPROTO", "not valid JSON");
    expect_error(c, &c->w, "{\"id\":1}", "EINVAL", "no \"op\" string");
}

/* Proves each op's reply fields on success, and its main errors. */
static void test_op_replies(void **state)
{
    struct ctx *c = *state;

    hello_all(c);
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100,\"id\":7}",
           "{\"ok\":true,\"offset\":4160,\"size\":100,\"id\":7}");
    expect_error(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":1}", "EEXIST",
                 "Key 'a' already exists");
    expect_error(c, &c->w, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":40000}", "E2BIG",
                 "Object size (40000 bytes) exceeds max object size (32768 bytes)");
    expect(c, &c->w, "{\"op\":\"contains\",\"key\":\"a\"}", "{\"ok\":true,\"exists\":false}");
    expect_error(c, &c->other, "{\"op\":\"commit\",\"key\":\"a\"}", "ENOENT",
                 "holds no pending allocation");
    expect(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\"}", "{\"ok\":true}");
    expect(c, &c->w, "{\"op\":\"contains\",\"key\":\"a\"}", "{\"ok\":true,\"exists\":true}");
    expect(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}",
           "{\"ok\":true,\"offset\":4160,\"size\":100}");
    expect_error(c, &c->r, "{\"op\":\"get\",\"key\":\"zz\"}", "ENOENT", "No object 'zz'");
    expect(c, &c->w, "{\"op\":\"touch\",\"key\":\"a\",\"readers\":2}", "{\"ok\":true}");
    expect_error(c, &c->w, "{\"op\":\"touch\",\"key\":\"a\",\"readers\":999999}", "EINVAL",
                 "would make 1000001 awaited reads");
    expect(c, &c->r, "{\"op\":\"release\",\"key\":\"a\"}", "{\"ok\":true}");
    expect_error(c, &c->r, "{\"op\":\"release\",\"key\":\"a\"}", "ENOENT",
                 "holds no pin on it");
    expect(c, &c->w, "{\"op\":\"delete\",\"key\":\"a\"}", "{\"ok\":true}");
    expect_error(c, &c->w, "{\"op\":\"delete\",\"key\":\"a\"}", "ENOENT", "to delete");
    /* Deleted and unpinned: its room is reclaimed for the next alloc. */
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":10}",
           "{\"ok\":true,\"offset\":4160,\"size\":10}");
    expect(c, &c->w, "{\"op\":\"abort\",\"key\":\"b\"}", "{\"ok\":true}");
    expect_error(c, &c->w, "{\"op\":\"abort\",\"key\":\"b\"}", "ENOENT",
                 "holds no pending allocation");
    expect_error(c, &c->w, "{\"op\":\"get\",\"key\":\"\"}", "EINVAL",
                 "Key of 0 bytes: keys are 1 to 255 bytes long.");
    expect_error(c, &c->w, "{\"op\":\"frob\",\"id\":[1]}", "ENOSYS",
                 "Known ops: hello, alloc, commit, abort, get, release, touch, delete, "
                 "contains, list, stats, clients, batch, queue_create, queue_open, "
                 "queue_close, queue_shutdown, queue_delete, queue_list, read, arena, "
                 "commit_at.");
    expect(c, &c->w, "{\"op\":\"list\"}",
           "{\"ok\":true,\"objects\":[],\"truncated\":false}");
}

/* Proves that a read-only client is refused exactly the writing ops, and
 * gets the others. */
static void test_read_only(void **state)
{
    struct ctx *c = *state;
    static const char *const refused[] = {
        "{\"op\":\"alloc\",\"key\":\"a\",\"size\":1}", "{\"op\":\"commit\",\"key\":\"a\"}",
        "{\"op\":\"abort\",\"key\":\"a\"}", "{\"op\":\"touch\",\"key\":\"a\",\"readers\":1}",
        "{\"op\":\"delete\",\"key\":\"a\"}"};
    struct outcome o;
    size_t i;

    hello_all(c);
    for (i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        expect_error(c, &c->r, refused[i], "EPERM", "needs a read-write connection");
    expect(c, &c->r, "{\"op\":\"contains\",\"key\":\"a\"}", "{\"ok\":true,\"exists\":false}");
    expect_error(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}", "ENOENT", NULL);
    expect_error(c, &c->r, "{\"op\":\"release\",\"key\":\"a\"}", "ENOENT", NULL);
    expect(c, &c->r, "{\"op\":\"batch\",\"ops\":[{\"op\":\"delete\",\"key\":\"a\"}]}",
           "{\"ok\":true,\"replies\":[{\"ok\":false,\"error\":\"EPERM\",\"message\":\"This "
           "connection is read-only (hello said \\\"mode\\\":\\\"ro\\\"); 'delete' needs a "
           "read-write connection.\"}]}");
    run(c, &c->r, "{\"op\":\"stats\"}", &o);
    assert_true(json_is_true(json_object_get(o.reply, "ok")));
    outcome_free(&o);
    /* The refusals changed nothing. */
    assert_false(store_contains(c->f.store, "a", 1));
}

/* Proves that "noreply": true is COMMAND_SILENT with nothing to send, on
 * success and on failure (before hello and on a read-only client too), that
 * failures are counted, and that "noreply": false is answered. */
static void test_noreply(void **state)
{
    struct ctx *c = *state;
    struct outcome o;
    uint64_t errors = c->f.env.noreply_errors;

    run(c, &c->w, "{\"op\":\"release\",\"key\":\"a\",\"noreply\":true}", &o);
    assert_int_equal(o.flags, COMMAND_SILENT);
    assert_null(o.reply);
    outcome_free(&o);
    hello_all(c);
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":10}",
           "{\"ok\":true,\"offset\":4160,\"size\":10}");
    run(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\",\"noreply\":true}", &o);
    assert_int_equal(o.flags, COMMAND_SILENT);
    assert_null(o.reply);
    outcome_free(&o);
    assert_true(store_contains(c->f.store, "a", 1));
    run(c, &c->r, "{\"op\":\"delete\",\"key\":\"a\",\"noreply\":true}", &o);
    assert_int_equal(o.flags, COMMAND_SILENT);
    assert_null(o.reply);
    outcome_free(&o);
    assert_true(store_contains(c->f.store, "a", 1));
    assert_int_equal(c->f.env.noreply_errors, errors + 2);
    expect_error(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\",\"noreply\":false}", "ENOENT",
                 NULL);
    expect_error(c, &c->w, "{\"op\":\"get\",\"key\":\"a\",\"noreply\":true}", "EINVAL",
                 "\"noreply\" is a boolean for commit, abort, release, touch, delete, read "
                 "and commit_at outside a batch, not for 'get'.");
    expect_error(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\",\"noreply\":1}", "EINVAL",
                 "not for 'commit'");
}

/* Fill the data area with three committed objects pinned by r. */
static void fill_pinned(struct ctx *c)
{
    char line[128];
    int i;

    for (i = 0; i < 3; i++) {
        snprintf(line, sizeof(line), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":20000}", i);
        run_ok(c, &c->w, line);
        snprintf(line, sizeof(line), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        run_ok(c, &c->w, line);
        snprintf(line, sizeof(line), "{\"op\":\"get\",\"key\":\"f%d\"}", i);
        run_ok(c, &c->r, line);
    }
}

/* Proves that an alloc with wait_ms and no room is COMMAND_WAIT with the
 * request to retry and its deadline, and no reply; that a retry before room
 * appears waits again; and that one after a release gets the room. */
static void test_wait_then_room(void **state)
{
    struct ctx *c = *state;
    struct outcome waiting, o;
    uint64_t before;

    hello_all(c);
    fill_pinned(c);
    expect_error(c, &c->w, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":20000}", "ENOSPC",
                 "the oldest object 'f0' blocks reclaim (pins=1, awaited reads=0)");
    before = clock_now_ms();
    run(c, &c->w, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":20000,\"wait_ms\":5000,\"id\":9}",
        &waiting);
    assert_int_equal(waiting.flags, COMMAND_WAIT);
    assert_null(waiting.reply);
    assert_non_null(waiting.wait_request);
    assert_true(waiting.wait_until_ms >= before + 5000);
    assert_true(waiting.wait_until_ms <= clock_now_ms() + 5000);

    retry(c, &c->w, &waiting, false, &o);
    assert_int_equal(o.flags, COMMAND_WAIT);
    assert_null(o.reply);
    outcome_free(&o);

    expect(c, &c->r, "{\"op\":\"release\",\"key\":\"f0\"}", "{\"ok\":true}");
    retry(c, &c->w, &waiting, false, &o);
    assert_int_equal(o.flags, 0);
    assert_json(o.reply, "{\"ok\":true,\"offset\":4160,\"size\":20000,\"id\":9}");
    outcome_free(&o);
    outcome_free(&waiting);
}

/* Proves that the final retry of an alloc still without room is an
 * ETIMEDOUT naming the time waited and the blocker, not another wait. */
static void test_wait_times_out(void **state)
{
    struct ctx *c = *state;
    struct outcome waiting, o;

    hello_all(c);
    fill_pinned(c);
    run(c, &c->w, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":20000,\"wait_ms\":300}", &waiting);
    assert_int_equal(waiting.flags, COMMAND_WAIT);
    retry(c, &c->w, &waiting, true, &o);
    assert_int_equal(o.flags, 0);
    assert_non_null(o.reply);
    assert_string_equal(json_string_value(json_object_get(o.reply, "error")), "ETIMEDOUT");
    assert_non_null(strstr(json_string_value(json_object_get(o.reply, "message")),
                           "Waited 300 ms for space. No space for 'x' (20000 bytes)"));
    assert_false(store_contains(c->f.store, "x", 1));
    outcome_free(&o);
    outcome_free(&waiting);
}

/* Proves that a batch answers one reply per element, in order, with the
 * elements' ids, errors in their slots, and the batch's own id. */
static void test_batch(void **state)
{
    struct ctx *c = *state;

    hello_all(c);
    expect(c, &c->w,
           "{\"op\":\"batch\",\"ops\":[{\"op\":\"alloc\",\"key\":\"a\",\"size\":10,\"id\":1},"
           "{\"op\":\"commit\",\"key\":\"a\"},{\"op\":\"get\",\"key\":\"a\",\"id\":\"g\"},"
           "{\"op\":\"get\",\"key\":\"n\"},{\"op\":\"stats\"},7,"
           "{\"op\":\"alloc\",\"key\":\"w\",\"size\":1,\"wait_ms\":1}],\"id\":{\"b\":1}}",
           "{\"ok\":true,\"replies\":[{\"ok\":true,\"offset\":4160,\"size\":10,\"id\":1},"
           "{\"ok\":true},{\"ok\":true,\"offset\":4160,\"size\":10,\"id\":\"g\"},"
           "{\"ok\":false,\"error\":\"ENOENT\",\"message\":\"No object 'n'; check the key, or "
           "wait for its writer to commit it.\"},"
           "{\"ok\":false,\"error\":\"EINVAL\",\"message\":\"'stats' cannot be part of a "
           "batch: send it on a line of its own (its reply is bounded per request, not per "
           "batch).\"},"
           "{\"ok\":false,\"error\":\"EINVAL\",\"message\":\"Each op of a batch is a JSON "
           "object.\"},"
           "{\"ok\":false,\"error\":\"EINVAL\",\"message\":\"\\\"wait_ms\\\" cannot be used "
           "inside a batch: a batch never waits.\"}],\"id\":{\"b\":1}}");
    expect_error(c, &c->w, "{\"op\":\"batch\",\"ops\":3}", "EINVAL",
                 "\"ops\" must be an array of at most 4096 requests.");
}

/* Proves that a list reply stops at env->max_reply bytes when that is set,
 * saying truncated, and holds everything without it. */
static void test_list_cap(void **state)
{
    struct ctx *c = *state;
    struct outcome o;
    char line[128];
    int i;

    hello_all(c);
    for (i = 0; i < 20; i++) {
        snprintf(line, sizeof(line), "{\"op\":\"alloc\",\"key\":\"k%02d\",\"size\":1}", i);
        run_ok(c, &c->w, line);
        snprintf(line, sizeof(line), "{\"op\":\"commit\",\"key\":\"k%02d\"}", i);
        run_ok(c, &c->w, line);
    }
    run(c, &c->w, "{\"op\":\"list\"}", &o);
    assert_int_equal(json_array_size(json_object_get(o.reply, "objects")), 20);
    assert_true(json_is_false(json_object_get(o.reply, "truncated")));
    outcome_free(&o);

    c->f.env.max_reply = 400;
    run(c, &c->w, "{\"op\":\"list\"}", &o);
    assert_true(json_is_true(json_object_get(o.reply, "truncated")));
    assert_in_range(json_array_size(json_object_get(o.reply, "objects")), 1, 10);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(o.reply, "objects"), 0), "key")),
                        "k00");
    outcome_free(&o);
    c->f.env.max_reply = 0;

    run(c, &c->w, "{\"op\":\"list\",\"prefix\":\"k1\",\"limit\":3}", &o);
    assert_int_equal(json_array_size(json_object_get(o.reply, "objects")), 3);
    assert_true(json_is_true(json_object_get(o.reply, "truncated")));
    outcome_free(&o);
}

/* Proves the fields of a stats reply and that its counts follow the store. */
static void test_stats(void **state)
{
    static const char *const fields[] = {
        "ok", "segment", "size", "data_size", "used", "free", "objects", "pending",
        "pinned", "clients", "max_object_size", "uptime_s", "pid", "version", "shm_dir",
        "shm_dir_free", "blocker", "counters"};
    static const char *const counters[] = {"allocs",         "commits",        "gets",
                                           "evictions",      "enospc",         "expired_allocs",
                                           "lease_expiries", "noreply_errors", "fast_reads"};
    struct ctx *c = *state;
    struct outcome o;
    json_t *cnt;
    size_t i;

    hello_all(c);
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100}",
           "{\"ok\":true,\"offset\":4160,\"size\":100}");
    expect(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\"}", "{\"ok\":true}");
    expect(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}",
           "{\"ok\":true,\"offset\":4160,\"size\":100}");
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":10}",
           "{\"ok\":true,\"offset\":4352,\"size\":10}");
    run(c, &c->w, "{\"op\":\"stats\",\"id\":2}", &o);
    /* The fields, "pool", "pools", "queues" and "id". */
    assert_int_equal(json_object_size(o.reply), sizeof(fields) / sizeof(fields[0]) + 4);
    assert_true(json_is_array(json_object_get(o.reply, "queues")));
    assert_string_equal(json_string_value(json_object_get(o.reply, "pool")), "fixture");
    {
        json_t *pools = json_object_get(o.reply, "pools"), *p0 = json_array_get(pools, 0);

        assert_int_equal(json_array_size(pools), 1);
        /* Every field but "ok", then pool, backing and group; clients: its hellos. */
        assert_int_equal(json_object_size(p0), sizeof(fields) / sizeof(fields[0]) + 2);
        assert_string_equal(json_string_value(json_object_get(p0, "pool")), "fixture");
        assert_string_equal(json_string_value(json_object_get(p0, "backing")), "shm");
        assert_true(json_is_null(json_object_get(p0, "group")));
        assert_int_equal(json_integer_value(json_object_get(p0, "clients")), 3);
        assert_int_equal(json_integer_value(json_object_get(p0, "used")), 320);
        assert_true(json_equal(json_object_get(p0, "counters"),
                               json_object_get(o.reply, "counters")));
    }
    for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        assert_non_null(json_object_get(o.reply, fields[i]));
    assert_int_equal(json_integer_value(json_object_get(o.reply, "id")), 2);
    assert_string_equal(json_string_value(json_object_get(o.reply, "segment")), "fixture");
    assert_int_equal(json_integer_value(json_object_get(o.reply, "data_size")), 65536);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "used")), 320);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "free")), 65536 - 320);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "objects")), 1);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "pending")), 1);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "pinned")), 1);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "clients")), 3);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "max_object_size")), 32768);
    assert_string_equal(json_string_value(json_object_get(o.reply, "shm_dir")), "/tmp");
    assert_json(json_object_get(o.reply, "blocker"),
                "{\"key\":\"a\",\"pins\":1,\"readers\":0,\"state\":\"committed\"}");
    cnt = json_object_get(o.reply, "counters");
    assert_int_equal(json_object_size(cnt), sizeof(counters) / sizeof(counters[0]));
    for (i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
        assert_true(json_is_integer(json_object_get(cnt, counters[i])));
    assert_int_equal(json_integer_value(json_object_get(cnt, "allocs")), 2);
    assert_int_equal(json_integer_value(json_object_get(cnt, "commits")), 1);
    assert_int_equal(json_integer_value(json_object_get(cnt, "gets")), 1);
    outcome_free(&o);
}

/* Proves that each number of a stats reply the store gathers is the store's
 * own field of that name, with counts made different from one another so
 * that a field read from its neighbour shows. */
static void test_stats_numbers(void **state)
{
    struct ctx *c = *state;
    struct store_stats st;
    struct outcome o;
    json_t *cnt;
    size_t i;

    hello_all(c);
    for (i = 0; i < 7; i++) {
        char line[80];

        snprintf(line, sizeof(line), "{\"op\":\"alloc\",\"key\":\"%c\",\"size\":%zu}",
                 (char)('a' + i), 100 * (i + 1));
        run_ok(c, &c->w, line);
        if (i < 5) {
            snprintf(line, sizeof(line), "{\"op\":\"commit\",\"key\":\"%c\"}",
                     (char)('a' + i));
            run_ok(c, &c->w, line);
        }
    }
    run_ok(c, &c->w, "{\"op\":\"delete\",\"key\":\"e\"}");
    for (i = 0; i < 3; i++)
        run_ok(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}");
    run(c, &c->w, "{\"op\":\"stats\"}", &o);
    store_stats(c->f.store, &st);
    cnt = json_object_get(o.reply, "counters");
    {
        const struct {
            const char *name;
            json_t *in;
            uint64_t want;
        } nums[] = {
            {"data_size", o.reply, st.data_size}, {"used", o.reply, st.used},
            {"free", o.reply, st.free}, {"objects", o.reply, st.objects},
            {"pending", o.reply, st.pending}, {"pinned", o.reply, st.pinned},
            {"max_object_size", o.reply, st.max_object_size}, {"allocs", cnt, st.allocs},
            {"commits", cnt, st.commits}, {"gets", cnt, st.gets},
            {"evictions", cnt, st.evictions}, {"enospc", cnt, st.enospc},
            {"expired_allocs", cnt, st.expired_allocs},
            {"lease_expiries", cnt, st.lease_expiries}, {"fast_reads", cnt, st.fast_reads},
        };

        for (i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
            json_t *v = json_object_get(nums[i].in, nums[i].name);

            if (!json_is_integer(v) || (uint64_t)json_integer_value(v) != nums[i].want)
                fail_msg("stats \"%s\" is %lld, the store's field %llu", nums[i].name,
                         json_is_integer(v) ? (long long)json_integer_value(v) : -1LL,
                         (unsigned long long)nums[i].want);
        }
    }
    /* Different counts, so that a field read from another shows. */
    assert_int_equal(st.allocs, 7);
    assert_int_equal(st.commits, 5);
    assert_int_equal(st.objects, 4);
    assert_int_equal(st.gets, 3);
    assert_int_equal(st.pending, 2);
    assert_int_equal(st.pinned, 1);
    assert_true(st.used != st.free && st.free != st.data_size);
    outcome_free(&o);
}

/* Proves that clients lists every registered client, newest first, with
 * what it holds and which one asked. */
static void test_clients(void **state)
{
    struct ctx *c = *state;
    struct outcome o;
    json_t *list;

    hello_all(c);
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100}",
           "{\"ok\":true,\"offset\":4160,\"size\":100}");
    run(c, &c->r, "{\"op\":\"clients\"}", &o);
    list = json_object_get(o.reply, "clients");
    assert_int_equal(json_array_size(list), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "name")),
                        "other");
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 1), "name")),
                        "reader");
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 1), "mode")),
                        "ro");
    assert_true(json_is_true(json_object_get(json_array_get(list, 1), "self")));
    assert_true(json_is_false(json_object_get(json_array_get(list, 2), "self")));
    assert_int_equal(json_integer_value(json_object_get(json_array_get(list, 2), "pending")),
                     1);
    assert_int_equal(json_object_size(json_array_get(list, 0)), 12);
    /* No hello here says its pid: own_pid is there, and null. */
    assert_true(json_is_null(json_object_get(json_array_get(list, 0), "own_pid")));
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "pool")),
                        "fixture");
    outcome_free(&o);
}

/* Proves the per-connection caps: EDQUOT naming the flag. */
static void test_caps(void **state)
{
    struct ctx *c = *state;

    hello_all(c);
    c->f.env.limits.max_pending = 1;
    c->f.env.limits.max_pins = 1;
    expect(c, &c->w, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":10}",
           "{\"ok\":true,\"offset\":4160,\"size\":10}");
    expect_error(c, &c->w, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":10}", "EDQUOT",
                 "max-pending (1) reached: this connection holds 1 uncommitted allocations.");
    expect(c, &c->w, "{\"op\":\"commit\",\"key\":\"a\"}", "{\"ok\":true}");
    expect(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}",
           "{\"ok\":true,\"offset\":4160,\"size\":10}");
    expect_error(c, &c->r, "{\"op\":\"get\",\"key\":\"a\"}", "EDQUOT",
                 "max-pins (1) reached: this connection holds 1 pins.");
}

/* jansson's allocations while counted (test_commit_at_by_hand). */
static unsigned long json_allocs;

static void *counting_malloc(size_t size)
{
    json_allocs++;
    return malloc(size);
}

/* The reply's "offset", or fail. */
static uint64_t reply_offset(const struct outcome *o)
{
    json_t *v = json_object_get(o->reply, "offset");

    if (!json_is_integer(v)) {
        char *text = o->reply != NULL ? json_dumps(o->reply, JSON_COMPACT) : NULL;

        fail_msg("no offset in %s", text != NULL ? text : "(no reply)");
    }
    return (uint64_t)json_integer_value(v);
}

/* Proves that a commit_at line as the libraries write it (every put
 * through an arena sends one) is served without a jansson tree: at most
 * one jansson allocation (the id the reply carries), where a parse takes
 * one per field. And that the lines read by hand mean what jansson reads
 * in them, while every other form of commit_at (escapes, bytes beyond
 * ASCII, other numbers, another order, a read-only client) still takes
 * the general path, with its replies and errors unchanged. */
static void test_commit_at_by_hand(void **state)
{
    struct ctx *c = *state;
    struct outcome o;
    char line[512];
    uint64_t at, before;

    hello_all(c);
    run(c, &c->w, "{\"op\":\"arena\",\"id\":1,\"size\":8192}", &o);
    at = reply_offset(&o);
    outcome_free(&o);

    /* The libraries' form: the reply's offset is the payload's, after the
     * header and the key. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":7,\"key\":\"k-1 ~!\",\"offset\":%llu,"
             "\"size\":10,\"readers\":0}",
             (unsigned long long)at);
    json_allocs = 0;
    json_set_alloc_funcs(counting_malloc, free);
    run(c, &c->w, line, &o);
    json_set_alloc_funcs(malloc, free);
    before = json_allocs;
    assert_int_equal(reply_offset(&o), at + SHMB_CHUNK_HEADER_SIZE(6));
    assert_int_equal(json_integer_value(json_object_get(o.reply, "id")), 7);
    assert_int_equal(json_integer_value(json_object_get(o.reply, "size")), 10);
    outcome_free(&o);
    /* run() parses the reply it got with jansson too: one for the id, the
     * rest the reply's. */
    json_allocs = 0;
    json_set_alloc_funcs(counting_malloc, free);
    o.reply = json_loads("{\"ok\":true,\"offset\":1,\"size\":10,\"id\":7}", 0, NULL);
    json_set_alloc_funcs(malloc, free);
    json_decref(o.reply);
    if (before > json_allocs + 1)
        fail_msg("the commit_at took %lu jansson allocations; parsing its reply alone "
                 "takes %lu",
                 before, json_allocs);
    at += SHMB_CHUNK_SIZE(6, 10);

    /* noreply: nothing to send. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":8,\"key\":\"k2\",\"offset\":%llu,\"size\":3,"
             "\"readers\":2,\"noreply\":true}",
             (unsigned long long)at);
    run(c, &c->w, line, &o);
    assert_null(o.reply);
    outcome_free(&o);
    at += SHMB_CHUNK_SIZE(2, 3);
    expect(c, &c->w, "{\"op\":\"contains\",\"key\":\"k2\"}",
           "{\"ok\":true,\"exists\":true}");

    /* Readers over the bound: the hand's numbers reach the same check. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":9,\"key\":\"k3\",\"offset\":%llu,\"size\":3,"
             "\"readers\":1000001}",
             (unsigned long long)at);
    expect_error(c, &c->w, line, "EINVAL", "\"readers\" must be between 0 and 1000000");
    /* A number jansson refuses (a leading zero), one over int64, and an
     * escaped key: the general path, as before. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":9,\"key\":\"k3\",\"offset\":0%llu,\"size\":3,"
             "\"readers\":0}",
             (unsigned long long)at);
    expect_error(c, &c->w, line, "EPROTO", "not valid JSON");
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":9,\"key\":\"k3\",\"offset\":%llu,"
             "\"size\":99999999999999999999,\"readers\":0}",
             (unsigned long long)at);
    expect_error(c, &c->w, line, "EPROTO", "not valid JSON");
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":9,\"key\":\"k\\u0033\",\"offset\":%llu,"
             "\"size\":3,\"readers\":0}",
             (unsigned long long)at);
    run(c, &c->w, line, &o);
    assert_int_equal(reply_offset(&o), at + SHMB_CHUNK_HEADER_SIZE(2));
    outcome_free(&o);
    at += SHMB_CHUNK_SIZE(2, 3);
    expect(c, &c->w, "{\"op\":\"contains\",\"key\":\"k3\"}",
           "{\"ok\":true,\"exists\":true}");
    /* A key of UTF-8 beyond ASCII, and fields in another order. */
    snprintf(
        line, sizeof(line),
        "{\"op\":\"commit_at\",\"id\":10,\"key\":\"\xc3\xa9t\xc3\xa9\",\"offset\":%llu,"
        "\"size\":4,\"readers\":0}",
        (unsigned long long)at);
    run(c, &c->w, line, &o);
    assert_int_equal(reply_offset(&o), at + SHMB_CHUNK_HEADER_SIZE(5));
    outcome_free(&o);
    at += SHMB_CHUNK_SIZE(5, 4);
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"key\":\"k5\",\"id\":11,\"size\":4,\"offset\":%llu}",
             (unsigned long long)at);
    run(c, &c->w, line, &o);
    assert_int_equal(reply_offset(&o), at + SHMB_CHUNK_HEADER_SIZE(2));
    outcome_free(&o);
    at += SHMB_CHUNK_SIZE(2, 4);
    /* The key that exists: EEXIST, as from jansson's path. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":12,\"key\":\"k5\",\"offset\":%llu,\"size\":4,"
             "\"readers\":0}",
             (unsigned long long)at);
    expect_error(c, &c->w, line, "EEXIST", NULL);
    /* A read-only client and one that said no hello: refused as before. */
    expect_error(c, &c->r, line, "EPERM", "read-only");
    command_client_close(&c->f.env, &c->other);
    command_client_open(&c->f.env, &c->other);
    expect_error(c, &c->other, line, "EPROTO", "Say hello first");
    /* Refused without a reply (noreply): the next reply names the key. */
    snprintf(line, sizeof(line),
             "{\"op\":\"commit_at\",\"id\":13,\"key\":\"k5\",\"offset\":%llu,\"size\":4,"
             "\"readers\":0,\"noreply\":true}",
             (unsigned long long)at);
    run(c, &c->w, line, &o);
    assert_null(o.reply);
    outcome_free(&o);
    run(c, &c->w, "{\"op\":\"contains\",\"key\":\"k5\"}", &o);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(o.reply, "lost"), "key")),
        "k5");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(o.reply, "lost"), "error")),
        "EEXIST");
    outcome_free(&o);
}

/* One side of test_commit_at_differential: a fixture with a writer that
 * said hello and holds an arena at arena_at. */
struct diff_side {
    struct fixture f;
    struct command_client w;
    unsigned long long arena_at;
};

static void diff_open(struct diff_side *d)
{
    json_t *reply = NULL;

    memset(d, 0, sizeof(*d));
    assert_int_equal(fixture_init(&d->f, FIX_SIZE, FIX_MAX_OBJECT), 0);
    command_client_open(&d->f.env, &d->w);
    assert_int_equal(
        fixture_request(&d->f, &d->w, "{\"op\":\"hello\",\"version\":1}", NULL), 1);
    assert_int_equal(
        fixture_request(&d->f, &d->w, "{\"op\":\"arena\",\"size\":8192}", &reply), 1);
    d->arena_at =
        (unsigned long long)json_integer_value(json_object_get(reply, "offset"));
    json_decref(reply);
}

static void diff_close(struct diff_side *d)
{
    command_client_close(&d->f.env, &d->w);
    fixture_fini(&d->f);
}

/* The reply to line[0, len) as text ("" when nothing is sent). Caller frees. */
static char *diff_run(struct diff_side *d, const char *line, size_t len)
{
    struct command_result res;
    json_t *reply, *obj;
    char *text;
    size_t i;

    memset(&res, 0, sizeof(res));
    command_execute(&d->f.env, &d->w, line, len, &res);
    reply = command_result_json(&res);
    json_decref(res.wait_request);
    shmb_free(res.text.buf);
    if (reply == NULL)
        return strdup("");
    /* A line jansson refuses is refused at a column, which the added
     * space may move: the code and the rest are what must agree. */
    if (strcmp(json_string_value(json_object_get(reply, "error")) != NULL
                   ? json_string_value(json_object_get(reply, "error"))
                   : "",
               "EPROTO") == 0 &&
        strstr(json_string_value(json_object_get(reply, "message")), "not valid JSON"))
        json_object_set_new(reply, "message", json_string("not valid JSON"));
    /* A list's ages are the clock's, not the request's. */
    json_array_foreach(json_object_get(reply, "objects"), i, obj)
        json_object_del(obj, "age_ms");
    text = json_dumps(reply, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(reply);
    return text;
}

/* What the store holds after a case: counters, the objects listed, and the
 * next reply (which tells a noreply commit_at that was refused). Caller
 * frees. */
static char *diff_state(struct diff_side *d)
{
    struct store_stats st;
    char *list, *next, *out;
    size_t n;

    store_stats(d->f.store, &st);
    list = diff_run(d, "{\"op\":\"list\"}", 13);
    next = diff_run(d, "{\"op\":\"contains\",\"key\":\"k\"}", 27);
    n = strlen(list) + strlen(next) + 200;
    out = malloc(n);
    assert_non_null(out);
    snprintf(out, n, "used %llu objects %llu commits %llu arena %llu list %s next %s",
             (unsigned long long)st.used, (unsigned long long)st.objects,
             (unsigned long long)st.commits, (unsigned long long)st.arena_bytes, list,
             next);
    free(list);
    free(next);
    return out;
}

/* Run one case: line (len bytes, '@' standing for the arena's offset) as it
 * is on one fixture and with a space after it on another, which only the
 * general path reads; the replies and what the stores hold must agree. */
static void diff_case(const char *tmpl, size_t len)
{
    struct diff_side a, b;
    char line[1024], spaced[1024], *ra, *rb, *sa, *sb;
    size_t n = 0, i;

    diff_open(&a);
    diff_open(&b);
    assert_int_equal(a.arena_at, b.arena_at);
    for (i = 0; i < len && n + 24 < sizeof(line); i++) {
        if (tmpl[i] == '@')
            n += (size_t)snprintf(line + n, sizeof(line) - n, "%llu", a.arena_at);
        else
            line[n++] = tmpl[i];
    }
    memcpy(spaced, line, n);
    spaced[n] = ' ';
    ra = diff_run(&a, line, n);
    rb = diff_run(&b, spaced, n + 1);
    sa = diff_state(&a);
    sb = diff_state(&b);
    if (strcmp(ra, rb) != 0 || strcmp(sa, sb) != 0) {
        print_error("line   %.*s\n  by hand  %s\n           %s\n"
                    "  general  %s\n           %s\n",
                    (int)n, line, ra, sa, rb, sb);
        fail();
    }
    free(ra);
    free(rb);
    free(sa);
    free(sb);
    diff_close(&a);
    diff_close(&b);
}

/* Proves that a commit_at line means the same read by hand as read by
 * jansson: each line below, each cut of the libraries' line at every byte,
 * and the libraries' line with each byte replaced by others, give the same
 * reply and leave the same store whether or not the hand may read them. */
#define CA "{\"op\":\"commit_at\"," /* the start every case shares */
static void test_commit_at_differential(void **state)
{
    static const char *const cases[] = {
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":2,"
        "\"noreply\":true}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":false}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":1}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":null}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":true,\"noreply\":true}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":true}}",
        CA "\"id\":1,\"key\":\"k\",\"key\":\"j\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"id\":2,\"key\":\"k\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"op\":\"commit_at\",\"id\":1,\"key\":\"k\",\"offset\":@,"
        "\"size\":5,\"readers\":0}",
        CA "\"id\":0,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":00,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":-0,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":-1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1e3,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1.0,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":999999999999999999,\"key\":\"k\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1000000000000000000,\"key\":\"k\",\"offset\":@,"
        "\"size\":5,\"readers\":0}",
        CA "\"id\":9223372036854775807,\"key\":\"k\",\"offset\":@,"
        "\"size\":5,\"readers\":0}",
        CA "\"id\":9223372036854775808,\"key\":\"k\",\"offset\":@,"
        "\"size\":5,\"readers\":0}",
        CA "\"id\":\"1\",\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":null,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":true,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":[1],\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":{},\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\\u0000\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\\ud800\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\\ud83d\\ude00\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\xff\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\xc0\xaf\",\"offset\":@,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\x01\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\x7f\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\t\",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k \",\"offset\":@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":0,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@0,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":-@,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@.0,\"size\":5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":0,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":-0,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":-5,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5e0,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":8192,\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":999999999999999999,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":9223372036854775807,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":999999999999999999,\"size\":5,"
        "\"readers\":0}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":1000000}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":1000001}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,"
        "\"readers\":4294967296}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":-1}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"pool\":\"fixture\"}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}x",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}{}",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0"
        ",\"noreply\":true",
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0}\r",
    };
    static const char base[] =
        CA "\"id\":1,\"key\":\"k\",\"offset\":@,\"size\":5,\"readers\":0,"
        "\"noreply\":true}";
    static const char bytes[] = {'\0', '"', '\\', ' ', '0', '9',
                                 '-',  '}', ',',  'k', '\xff'};
    char line[sizeof(base)], key[300];
    size_t i, j;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        diff_case(cases[i], strlen(cases[i]));
    /* The longest key and one over. */
    for (i = SHMB_KEY_MAX; i <= SHMB_KEY_MAX + 1; i++) {
        char longline[1024];

        memset(key, 'a', i);
        key[i] = '\0';
        snprintf(longline, sizeof(longline),
                 CA "\"id\":1,\"key\":\"%s\",\"offset\":@,\"size\":5,"
                 "\"readers\":0}",
                 key);
        diff_case(longline, strlen(longline));
    }
    for (i = 1; i < sizeof(base) - 1; i++)
        diff_case(base, i);
    for (i = 0; i < sizeof(base) - 1; i++)
        for (j = 0; j < sizeof(bytes); j++) {
            memcpy(line, base, sizeof(base));
            if (line[i] == '@')
                continue;
            line[i] = bytes[j];
            diff_case(line, sizeof(base) - 1);
        }
}
#undef CA

/* Proves that the reply to an oversized line is EMSGSIZE and closes. */
static void test_oversized(void **state)
{
    struct command_result res;
    struct outcome o;

    (void)state;
    memset(&res, 0, sizeof(res));
    command_oversized(SHMB_MAX_LINE, &res);
    outcome_take(&res, &o);
    assert_int_equal(o.flags, COMMAND_CLOSE);
    assert_json(o.reply, "{\"ok\":false,\"error\":\"EMSGSIZE\",\"message\":\"Request line "
                         "longer than 65536 bytes; requests are small JSON objects. Closing "
                         "the connection.\"}");
    outcome_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_before_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_noreply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_then_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_numbers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_at_by_hand, setup, teardown),
        cmocka_unit_test(test_commit_at_differential),
        cmocka_unit_test(test_oversized),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
