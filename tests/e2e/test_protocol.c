// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of protocol v1 over a raw Unix socket, without the client
 * library: framing, the hello handshake and its descriptor, every op's
 * success path and every error code. Error cases are data (the table below);
 * each runs on a fresh daemon and then proves the connection and the daemon
 * still work.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "layout.h"

/* Every daemon here: 1 MiB, so the data area is 1 MiB - 4 KiB less the
 * catalog at the end (512 slots of 32 bytes: one per 2 KiB) and the default
 * max object size half of --size. */
#define SEG_SIZE (1024 * 1024)
#define SEG_SIZE_ARG "1M"
#define DATA_OFFSET 4096
#define CATALOG_SLOTS 512
#define CATALOG_OFFSET (SEG_SIZE - CATALOG_SLOTS * 32)
#define DATA_SIZE ((CATALOG_OFFSET - DATA_OFFSET) & ~(SHMB_ALIGN - 1))
#define MAX_OBJECT (SEG_SIZE / 2)

/* A chunk header's fixed part: the key follows, padded to SHMB_ALIGN. */
#define CHUNK_FIXED 48

/* ---- the table of single-request cases ---------------------------------- */

/* One request and what the daemon must answer. In request and pre, "@K255@"
 * and "@K256@" stand for keys of that many bytes. */
struct proto_case {
    const char *name;
    bool no_hello;          /* send the request before hello */
    const char *pre[4];     /* requests on the same connection that must succeed */
    const char *request;
    const char *error;      /* the expected code; NULL: {"ok":true} */
    const char *message;    /* a substring of the message (NULL: any) */
    bool exact;             /* message must equal, not contain */
};

#define ALLOC_K "{\"op\":\"alloc\",\"key\":\"k\",\"size\":100}"
#define COMMIT_K "{\"op\":\"commit\",\"key\":\"k\"}"
#define GET_K "{\"op\":\"get\",\"key\":\"k\"}"
#define RELEASE_K "{\"op\":\"release\",\"key\":\"k\"}"
#define DELETE_K "{\"op\":\"delete\",\"key\":\"k\"}"
#define EXPECTED_ALLOC                                                                   \
    "Expected {\"op\":\"alloc\",\"key\":STRING,\"size\":INTEGER,\"readers\":INTEGER?," \
    "\"wait_ms\":INTEGER?}."

static const struct proto_case cases[] = {
    /* EPROTO: the line is not a JSON object, or there was no hello. */
    {"EPROTO truncated JSON", false, {0}, "{\"op\":\"stats\"", "EPROTO", "not valid JSON", false},
    {"EPROTO plain text", false, {0}, "hello world", "EPROTO", "not valid JSON", false},
    /* jansson quotes the text near the error and may cut a character in
     * two there (here U+0797 after a broken escape); the reply must still be
     * valid JSON (a regression found by the fuzzer). */
    {"EPROTO bad escape before a 2-byte character", false, {0},
     "{\"k\":\"\\u00\xde\x97" "00\"}", "EPROTO", "not valid JSON", false},
    {"EPROTO array", false, {0}, "[\"op\",\"stats\"]", "EPROTO", "not a JSON object", false},
    {"EPROTO number", false, {0}, "42", "EPROTO", NULL, false},
    {"EPROTO string", false, {0}, "\"stats\"", "EPROTO", NULL, false},
    {"EPROTO duplicate field", false, {0}, "{\"op\":\"stats\",\"op\":\"stats\"}", "EPROTO",
     "duplicate object key", false},
    {"EPROTO duplicate key field", false, {0},
     "{\"op\":\"get\",\"key\":\"a\",\"key\":\"b\"}", "EPROTO", "duplicate", false},
    {"EPROTO two objects on a line", false, {0}, "{\"op\":\"stats\"}{\"op\":\"stats\"}",
     "EPROTO", "not valid JSON", false},
    {"EPROTO invalid UTF-8", false, {0}, "{\"op\":\"contains\",\"key\":\"\xff\xfe\"}",
     "EPROTO", "not valid JSON", false},
    {"EPROTO NUL in a string", false, {0}, "{\"op\":\"contains\",\"key\":\"a\\u0000b\"}",
     "EPROTO", "not valid JSON", false},
    {"EPROTO integer beyond int64", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":9223372036854775808}", "EPROTO", NULL, false},
    {"EPROTO stats before hello", true, {0}, "{\"op\":\"stats\"}", "EPROTO",
     "Say hello first: {\"op\":\"hello\",\"version\":1}.", true},
    {"EPROTO alloc before hello", true, {0}, ALLOC_K, "EPROTO", "Say hello first", false},
    {"EPROTO hello version 2", true, {0}, "{\"op\":\"hello\",\"version\":2}", "EPROTO",
     "Unsupported protocol version 2; this shmbrokerd speaks version 1.", true},
    {"EPROTO hello version 0", true, {0}, "{\"op\":\"hello\",\"version\":0}", "EPROTO",
     "Unsupported protocol version 0", false},

    /* EINVAL: missing fields, wrong types, values out of range, extra fields. */
    {"EINVAL no op", false, {0}, "{\"key\":\"a\"}", "EINVAL", "no \"op\" string", false},
    {"EINVAL op not a string", false, {0}, "{\"op\":[\"stats\"]}", "EINVAL", "no \"op\"", false},
    {"EINVAL empty object before hello", true, {0}, "{}", "EINVAL", "no \"op\"", false},
    {"EINVAL hello twice", false, {0}, "{\"op\":\"hello\",\"version\":1}", "EINVAL",
     "already said hello", false},
    {"EINVAL hello without version", true, {0}, "{\"op\":\"hello\"}", "EINVAL",
     "Object item not found: version", false},
    {"EINVAL hello version string", true, {0}, "{\"op\":\"hello\",\"version\":\"1\"}",
     "EINVAL", "Expected integer, got string", false},
    {"EINVAL hello name number", true, {0}, "{\"op\":\"hello\",\"version\":1,\"name\":7}",
     "EINVAL", "Expected string", false},
    {"EINVAL hello unknown field", true, {0},
     "{\"op\":\"hello\",\"version\":1,\"tls\":true}", "EINVAL", "left unpacked: tls", false},
    {"EINVAL alloc without key", false, {0}, "{\"op\":\"alloc\",\"size\":1}", "EINVAL",
     "Invalid 'alloc' request: Object item not found: key. " EXPECTED_ALLOC, true},
    {"EINVAL alloc without size", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\"}", "EINVAL",
     "Object item not found: size", false},
    {"EINVAL alloc key number", false, {0}, "{\"op\":\"alloc\",\"key\":1,\"size\":1}",
     "EINVAL", "Expected string, got integer", false},
    {"EINVAL alloc size string", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":\"10\"}",
     "EINVAL", "Invalid 'alloc' request: Expected integer, got string. " EXPECTED_ALLOC, true},
    {"EINVAL alloc size real", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1.5}",
     "EINVAL", "Expected integer, got real", false},
    {"EINVAL alloc size true", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":true}",
     "EINVAL", "Expected integer, got true", false},
    {"EINVAL alloc size null", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":null}",
     "EINVAL", "Expected integer, got null", false},
    {"EINVAL alloc size negative", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":-1}",
     "EINVAL", "\"size\" must be between 1 and 9223372036854775807, not -1.", true},
    {"EINVAL alloc size zero", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":0}",
     "EINVAL", "\"size\" must be between 1 and", false},
    {"EINVAL alloc unknown field", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"x\":1}", "EINVAL",
     "1 object item(s) left unpacked: x", false},
    {"EINVAL alloc empty key", false, {0}, "{\"op\":\"alloc\",\"key\":\"\",\"size\":1}",
     "EINVAL", "Key of 0 bytes: keys are 1 to 255 bytes long.", true},
    {"EINVAL alloc 256-byte key", false, {0}, "{\"op\":\"alloc\",\"key\":\"@K256@\",\"size\":1}",
     "EINVAL", "Key of 256 bytes: keys are 1 to 255 bytes long.", true},
    {"EINVAL alloc readers negative", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"readers\":-1}", "EINVAL",
     "\"readers\" must be between 0 and 1000000, not -1.", true},
    {"EINVAL alloc readers above limit", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"readers\":1000001}", "EINVAL",
     "\"readers\" must be between 0 and 1000000, not 1000001.", true},
    {"EINVAL alloc readers string", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"readers\":\"1\"}", "EINVAL",
     "Expected integer, got string", false},
    {"EINVAL commit without key", false, {0}, "{\"op\":\"commit\"}", "EINVAL",
     "Invalid 'commit' request: Object item not found: key. Expected "
     "{\"op\":OP,\"key\":STRING}.", true},
    {"EINVAL abort unknown field", false, {0}, "{\"op\":\"abort\",\"key\":\"k\",\"size\":1}",
     "EINVAL", "left unpacked: size", false},
    {"EINVAL get key null", false, {0}, "{\"op\":\"get\",\"key\":null}", "EINVAL",
     "Expected string, got null", false},
    {"EINVAL release key array", false, {0}, "{\"op\":\"release\",\"key\":[\"k\"]}", "EINVAL",
     "Expected string, got array", false},
    {"EINVAL touch without readers", false, {0}, "{\"op\":\"touch\",\"key\":\"k\"}", "EINVAL",
     "Object item not found: readers", false},
    {"EINVAL touch readers negative", false, {0},
     "{\"op\":\"touch\",\"key\":\"k\",\"readers\":-1}", "EINVAL",
     "\"readers\" must be between 0 and 1000000, not -1.", true},
    {"EINVAL touch past the reader limit", false,
     {"{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"readers\":1000000}", COMMIT_K},
     "{\"op\":\"touch\",\"key\":\"k\",\"readers\":1}", "EINVAL",
     "readers=1 would make 1000001 awaited reads, more than the limit of 1000000.", true},
    {"EINVAL delete unknown field", false, {0}, "{\"op\":\"delete\",\"key\":\"k\",\"all\":true}",
     "EINVAL", "left unpacked: all", false},
    {"EINVAL contains without key", false, {0}, "{\"op\":\"contains\"}", "EINVAL",
     "Object item not found: key", false},
    {"EINVAL list limit 0", false, {0}, "{\"op\":\"list\",\"limit\":0}", "EINVAL",
     "\"limit\" must be between 1 and 100000, not 0.", true},
    {"EINVAL list limit above maximum", false, {0}, "{\"op\":\"list\",\"limit\":100001}",
     "EINVAL", "\"limit\" must be between 1 and 100000, not 100001.", true},
    {"EINVAL list limit string", false, {0}, "{\"op\":\"list\",\"limit\":\"5\"}", "EINVAL",
     "Expected integer, got string", false},
    {"EINVAL list prefix number", false, {0}, "{\"op\":\"list\",\"prefix\":1}", "EINVAL",
     "Expected string, got integer", false},
    {"EINVAL stats unknown field", false, {0}, "{\"op\":\"stats\",\"verbose\":true}", "EINVAL",
     "Invalid 'stats' request: 1 object item(s) left unpacked: verbose. Expected "
     "{\"op\":\"stats\",\"seats\":BOOLEAN?}.", true},

    /* ENOSYS: the op is not in the table. */
    {"ENOSYS unknown op", false, {0}, "{\"op\":\"nope\"}", "ENOSYS",
     "Unknown op 'nope'. Known ops: hello, alloc, commit, abort, get, release, touch, "
     "delete, contains, list, stats, clients, batch, queue_create, queue_open, queue_close, "
     "queue_shutdown, queue_delete, queue_list, read, arena, commit_at.", true},
    {"ENOSYS op names are case-sensitive", false, {0}, "{\"op\":\"STATS\"}", "ENOSYS",
     "Unknown op 'STATS'", false},
    {"ENOSYS empty op", false, {0}, "{\"op\":\"\"}", "ENOSYS", "Unknown op ''", false},
    /* Before hello, every op but hello is EPROTO, known or not. */
    {"EPROTO unknown op before hello", true, {0}, "{\"op\":\"put\"}", "EPROTO",
     "Say hello first", false},

    /* EEXIST: the key is taken, committed or pending. */
    {"EEXIST committed key", false, {ALLOC_K, COMMIT_K}, ALLOC_K, "EEXIST",
     "Key 'k' already exists in the storage. Choose another key, or delete it first.", true},
    {"EEXIST pending key", false, {ALLOC_K}, ALLOC_K, "EEXIST", "already exists", false},

    /* ENOENT: no such object, or not in the state the op needs. */
    {"ENOENT commit without alloc", false, {0}, COMMIT_K, "ENOENT",
     "Cannot commit 'k': this connection holds no pending allocation of it. Call alloc "
     "first.", true},
    {"ENOENT commit twice", false, {ALLOC_K, COMMIT_K}, COMMIT_K, "ENOENT",
     "Cannot commit 'k': it is already committed.", false},
    {"ENOENT abort without alloc", false, {0}, "{\"op\":\"abort\",\"key\":\"k\"}", "ENOENT",
     "Cannot abort 'k': this connection holds no pending allocation", false},
    {"ENOENT abort committed", false, {ALLOC_K, COMMIT_K}, "{\"op\":\"abort\",\"key\":\"k\"}",
     "ENOENT", "already committed", false},
    {"ENOENT get missing", false, {0}, GET_K, "ENOENT",
     "No object 'k'; check the key, or wait for its writer to commit it.", true},
    {"ENOENT get pending", false, {ALLOC_K}, GET_K, "ENOENT",
     "No object 'k' yet: it is allocated but not committed.", true},
    {"ENOENT get deleted", false, {ALLOC_K, COMMIT_K, DELETE_K}, GET_K, "ENOENT", NULL, false},
    {"ENOENT release without pin", false, {ALLOC_K, COMMIT_K}, RELEASE_K, "ENOENT",
     "Cannot release 'k': this connection holds no pin on it (every get is released "
     "once).", true},
    {"ENOENT release twice", false, {ALLOC_K, COMMIT_K, GET_K, RELEASE_K}, RELEASE_K,
     "ENOENT", "holds no pin", false},
    {"ENOENT release missing", false, {0}, RELEASE_K, "ENOENT", "holds no pin", false},
    {"ENOENT touch missing", false, {0}, "{\"op\":\"touch\",\"key\":\"k\",\"readers\":1}",
     "ENOENT", "No object 'k' to touch.", true},
    {"ENOENT touch pending", false, {ALLOC_K}, "{\"op\":\"touch\",\"key\":\"k\",\"readers\":1}",
     "ENOENT", "to touch", false},
    {"ENOENT delete missing", false, {0}, DELETE_K, "ENOENT", "No object 'k' to delete.", true},
    {"ENOENT delete pending", false, {ALLOC_K}, DELETE_K, "ENOENT",
     "Cannot delete 'k': it is allocated but not committed; its writer can abort it.", true},
    {"ENOENT delete twice", false, {ALLOC_K, COMMIT_K, DELETE_K}, DELETE_K, "ENOENT",
     "to delete", false},

    /* E2BIG: larger than --max-object-size. */
    {"E2BIG one byte over", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":524289}", "E2BIG",
     "Object size (524289 bytes) exceeds max object size (524288 bytes)", true},
    {"E2BIG largest size", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":9223372036854775807}", "E2BIG",
     "Object size (9223372036854775807 bytes) exceeds max object size (524288 bytes)", true},

    /* The limits themselves are accepted. */
    {"ok alloc 255-byte key", false, {0},
     "{\"op\":\"alloc\",\"key\":\"@K255@\",\"size\":1}", NULL, NULL, false},
    {"ok alloc 1 byte", false, {0}, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1}", NULL, NULL,
     false},
    {"ok alloc max object size", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":524288}", NULL, NULL, false},
    {"ok alloc 1000000 readers", false, {0},
     "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1,\"readers\":1000000}", NULL, NULL, false},
    {"ok alloc UTF-8 key", false, {0},
     "{\"op\":\"alloc\",\"key\":\"\xc3\xa9t\xc3\xa9-\xe2\x82\xac\",\"size\":3}", NULL, NULL,
     false},
    {"ok touch 0 readers", false, {ALLOC_K, COMMIT_K},
     "{\"op\":\"touch\",\"key\":\"k\",\"readers\":0}", NULL, NULL, false},
    {"ok list limit 100000", false, {0}, "{\"op\":\"list\",\"prefix\":\"\",\"limit\":100000}",
     NULL, NULL, false},
    {"ok hello with empty name", true, {0}, "{\"op\":\"hello\",\"version\":1,\"name\":\"\"}",
     NULL, NULL, false},
};

/* Expand "@K255@" and "@K256@" into keys of that length; the caller frees. */
static char *expand(const char *text)
{
    size_t len = strlen(text), i, o = 0;
    char *out = malloc(len + 600);

    assert_non_null(out);
    for (i = 0; i < len;) {
        if (strncmp(text + i, "@K255@", 6) == 0 || strncmp(text + i, "@K256@", 6) == 0) {
            size_t n = text[i + 4] == '5' ? 255 : 256;

            memset(out + o, 'k', n);
            o += n;
            i += 6;
        } else {
            out[o++] = text[i++];
        }
    }
    out[o] = '\0';
    return out;
}

/* Run one table case: the request gets the expected reply, then the same
 * connection still serves (stats with an id) and so does a new one. */
static void test_case(void **state)
{
    struct h_fix *f = *state;
    const struct proto_case *pc = f->arg;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;
    char *line;
    int i;

    if (pc->no_hello) {
        assert_int_equal(h_conn_open(&c, d->socket), 0);
    } else {
        reply = h_open_hello(&c, d);
        json_decref(reply);
    }
    for (i = 0; i < 4 && pc->pre[i] != NULL; i++) {
        line = expand(pc->pre[i]);
        h_expect_ok(&c, line);
        free(line);
    }
    line = expand(pc->request);
    reply = h_call(&c, line);
    free(line);
    if (pc->error == NULL) {
        h_assert_ok(reply);
    } else {
        h_assert_error(reply, pc->error, pc->message);
        if (pc->exact)
            assert_string_equal(h_str(reply, "message"), pc->message);
        assert_null(json_object_get(reply, "id"));
    }
    json_decref(reply);

    /* The connection still works: before hello it still wants hello. */
    if (pc->no_hello && !(pc->error == NULL && h_contains(pc->request, "hello"))) {
        h_expect_error(&c, "{\"op\":\"stats\"}", "EPROTO", "Say hello first");
        h_expect_ok(&c, "{\"op\":\"hello\",\"version\":1}");
    }
    reply = h_call(&c, "{\"op\":\"stats\",\"id\":\"after\"}");
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "after");
    json_decref(reply);
    h_conn_close(&c);
    h_assert_alive(d);
    h_pass(f);
}

/* ---- helpers for the dedicated tests ------------------------------------ */

/* Map the segment descriptor the hello reply passed. */
static unsigned char *map_segment(const struct h_conn *c)
{
    void *p;

    assert_int_equal(c->nfds, 1);
    p = mmap(NULL, SEG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, c->fds[0], 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* A stats reply (the caller frees). */
static json_t *stats(struct h_conn *c)
{
    json_t *reply = h_call(c, "{\"op\":\"stats\"}");

    h_assert_ok(reply);
    return reply;
}

/* One integer of the stats reply. */
static long long stat_int(struct h_conn *c, const char *field)
{
    json_t *reply = stats(c);
    long long v = h_int(reply, field);

    json_decref(reply);
    return v;
}

/* One integer of the stats reply's counters. */
static long long counter(struct h_conn *c, const char *field)
{
    json_t *reply = stats(c);
    long long v = h_int(json_object_get(reply, "counters"), field);

    json_decref(reply);
    return v;
}

/* alloc key with size bytes (and readers); returns the offset. */
static long long do_alloc(struct h_conn *c, const char *key, long long size, int readers)
{
    char req[512];
    json_t *reply;
    long long off;

    snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"%s\",\"size\":%lld,\"readers\":%d}",
             key, size, readers);
    reply = h_call(c, req);
    h_assert_ok(reply);
    off = h_int(reply, "offset");
    assert_int_equal(h_int(reply, "size"), size);
    json_decref(reply);
    return off;
}

/* An op whose only field is the key, expected to succeed. */
static void key_op(struct h_conn *c, const char *op, const char *key)
{
    char req[512];

    snprintf(req, sizeof(req), "{\"op\":\"%s\",\"key\":\"%s\"}", op, key);
    h_expect_ok(c, req);
}

/* alloc + commit. */
static long long do_put(struct h_conn *c, const char *key, long long size, int readers)
{
    long long off = do_alloc(c, key, size, readers);

    key_op(c, "commit", key);
    return off;
}

/* contains, as a C boolean. */
static bool contains(struct h_conn *c, const char *key)
{
    char req[512];
    json_t *reply;
    bool exists;

    snprintf(req, sizeof(req), "{\"op\":\"contains\",\"key\":\"%s\"}", key);
    reply = h_call(c, req);
    h_assert_ok(reply);
    assert_true(json_is_boolean(json_object_get(reply, "exists")));
    exists = json_is_true(json_object_get(reply, "exists"));
    json_decref(reply);
    return exists;
}

/* The list reply's objects for prefix (limit 0: default); the caller frees
 * the reply, *objects is borrowed from it. */
static json_t *list(struct h_conn *c, const char *prefix, int limit, json_t **objects)
{
    char req[512];
    json_t *reply;
    int n = snprintf(req, sizeof(req), "{\"op\":\"list\"");

    if (prefix != NULL)
        n += snprintf(req + n, sizeof(req) - (size_t)n, ",\"prefix\":\"%s\"", prefix);
    if (limit > 0)
        n += snprintf(req + n, sizeof(req) - (size_t)n, ",\"limit\":%d", limit);
    snprintf(req + n, sizeof(req) - (size_t)n, "}");
    reply = h_call(c, req);
    h_assert_ok(reply);
    *objects = json_object_get(reply, "objects");
    assert_true(json_is_array(*objects));
    assert_true(json_is_boolean(json_object_get(reply, "truncated")));
    return reply;
}

/* The list entry of key, or NULL (borrowed from objects). */
static json_t *find_entry(json_t *objects, const char *key)
{
    size_t i;
    json_t *item;

    json_array_foreach(objects, i, item)
        if (strcmp(h_str(item, "key"), key) == 0)
            return item;
    return NULL;
}

/* True once only one client is left and nothing is pinned or pending: what
 * the daemon shows after the other connections closed. */
static bool clean_after_close(void *arg)
{
    struct h_conn *c = arg;
    json_t *reply = stats(c);
    bool clean = h_int(reply, "pinned") == 0 && h_int(reply, "pending") == 0 &&
                 h_int(reply, "clients") == 1;

    json_decref(reply);
    return clean;
}

/* ---- hello --------------------------------------------------------------- */

/* hello's reply describes the segment exactly and carries exactly one
 * descriptor: the segment file itself (its size, its header), and no other
 * reply carries one. */
static void test_hello_reply(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    const struct shmb_segment_header *hdr;
    unsigned char *map;
    struct h_conn c;
    struct stat st;
    json_t *reply;
    uint32_t seed;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"test-hello\",\"id\":1}");
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "version"), 1);
    assert_string_equal(h_str(reply, "segment"), d->name);
    assert_int_equal(h_int(reply, "size"), SEG_SIZE);
    assert_int_equal(h_int(reply, "data_offset"), DATA_OFFSET);
    assert_int_equal(h_int(reply, "data_size"), DATA_SIZE);
    assert_int_equal(h_int(reply, "catalog_offset"), CATALOG_OFFSET);
    assert_int_equal(h_int(reply, "catalog_slots"), CATALOG_SLOTS);
    assert_true(json_is_integer(json_object_get(reply, "catalog_seed")));
    seed = (uint32_t)h_int(reply, "catalog_seed");
    assert_int_equal(h_int(reply, "layout"), 2);
    assert_int_equal(h_int(reply, "max_object_size"), MAX_OBJECT);
    assert_int_equal(h_int(reply, "alignment"), SHMB_ALIGN);
    assert_int_equal(h_int(reply, "id"), 1);
    assert_string_equal(h_str(reply, "mode"), "rw");
    /* Without --pool, the one pool is named after the segment. */
    assert_string_equal(h_str(reply, "pool"), d->name);
    assert_string_equal(h_str(reply, "backing"), "shm");
    assert_int_equal(json_object_size(reply), 16); /* ok, id and the fourteen fields */
    json_decref(reply);

    assert_int_equal(c.nfds, 1);
    assert_int_equal(fstat(c.fds[0], &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_size, SEG_SIZE);
    map = map_segment(&c);
    hdr = (const struct shmb_segment_header *)map;
    assert_true(hdr->magic == SHMB_SEGMENT_MAGIC);
    assert_int_equal(hdr->version, SHMB_LAYOUT_VERSION);
    assert_int_equal(hdr->total_size, SEG_SIZE);
    assert_int_equal(hdr->data_offset, DATA_OFFSET);
    assert_int_equal(hdr->data_size, DATA_SIZE);
    assert_int_equal(hdr->catalog_offset, CATALOG_OFFSET);
    assert_int_equal(hdr->catalog_slots, CATALOG_SLOTS);
    assert_int_equal(hdr->catalog_seed, seed);
    assert_int_equal(hdr->heartbeat_period_ms, 1000);
    assert_true(hdr->heartbeat_count >= 1); /* the beat at start */
    assert_int_equal(((const struct shmb_published_counters *)(map + SHMB_COUNTERS_AT))->pid,
                     d->pid);
    assert_int_equal(hdr->owner_pid, d->pid);

    /* Later replies carry no descriptor. */
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    h_expect_ok(&c, "{\"op\":\"list\"}");
    assert_int_equal(c.nfds, 1);
    munmap(map, SEG_SIZE);
    h_conn_close(&c);
    h_pass(f);
}

/* A failed hello (wrong version) passes no descriptor and leaves the
 * connection waiting for a good hello, which then passes exactly one. */
static void test_hello_retry(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":2}", "EPROTO", "Unsupported");
    assert_int_equal(c.nfds, 0);
    h_expect_error(&c, "{\"op\":\"get\",\"key\":\"k\"}", "EPROTO", "Say hello first");
    h_expect_ok(&c, "{\"op\":\"hello\",\"version\":1}");
    assert_int_equal(c.nfds, 1);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1}", "EINVAL", "already said hello");
    assert_int_equal(c.nfds, 1);
    h_conn_close(&c);
    h_pass(f);
}

/* ---- id, framing, ordering ---------------------------------------------- */

/* "id" comes back unchanged, whatever JSON value it is, on success and on
 * error replies (before hello too); a request without id gets none. */
static void test_id_echo(void **state)
{
    static const char *const ids[] = {
        "7", "-3", "\"abc\"", "{\"a\":[1,{\"b\":null}]}", "[1,2,3]", "null", "true", "2.5",
    };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply, *want;
    char req[256];
    size_t i;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"id\":{\"x\":1},\"op\":\"stats\"}");
    h_assert_error(reply, "EPROTO", "Say hello first");
    want = json_loads("{\"x\":1}", 0, NULL);
    assert_true(json_equal(json_object_get(reply, "id"), want));
    json_decref(want);
    json_decref(reply);
    h_expect_ok(&c, "{\"op\":\"hello\",\"version\":1}");

    for (i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        static const char *const fmts[] = {
            "{\"op\":\"stats\",\"id\":%s}",                /* success */
            "{\"id\":%s,\"op\":\"get\",\"key\":\"none\"}", /* ENOENT */
            "{\"op\":\"alloc\",\"id\":%s}",                /* EINVAL */
            "{\"op\":\"frob\",\"id\":%s}",                 /* ENOSYS */
            "{\"id\":%s}",                                 /* EINVAL, no op */
        };
        size_t j;

        want = json_loads(ids[i], JSON_DECODE_ANY, NULL);
        assert_non_null(want);
        for (j = 0; j < sizeof(fmts) / sizeof(fmts[0]); j++) {
            snprintf(req, sizeof(req), fmts[j], ids[i]);
            reply = h_call(&c, req);
            if (j == 0)
                h_assert_ok(reply);
            assert_non_null(json_object_get(reply, "id"));
            if (!json_equal(json_object_get(reply, "id"), want))
                h_fail("request %s: id not echoed", req);
            json_decref(reply);
        }
        json_decref(want);
    }
    reply = h_call(&c, "{\"op\":\"stats\"}");
    assert_null(json_object_get(reply, "id"));
    json_decref(reply);
    reply = h_call(&c, "{\"op\":\"contains\",\"key\":\"x\"}");
    assert_null(json_object_get(reply, "id"));
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* Requests written in one go are answered one reply per request, in order:
 * a whole session (hello included, whose descriptor still arrives) in one
 * write, then 200 pipelined requests. */
static void test_pipelined(void **state)
{
    static const struct {
        const char *request;
        const char *error;
    } session[] = {
        {"{\"op\":\"hello\",\"version\":1,\"id\":0}", NULL},
        {"{\"op\":\"alloc\",\"key\":\"p\",\"size\":10,\"id\":1}", NULL},
        {"{\"op\":\"get\",\"key\":\"p\",\"id\":2}", "ENOENT"},
        {"{\"op\":\"commit\",\"key\":\"p\",\"id\":3}", NULL},
        {"{\"op\":\"get\",\"key\":\"p\",\"id\":4}", NULL},
        {"{\"op\":\"bogus\",\"id\":5}", "ENOSYS"},
        {"not json", "EPROTO"},
        {"{\"op\":\"release\",\"key\":\"p\",\"id\":7}", NULL},
        {"{\"op\":\"release\",\"key\":\"p\",\"id\":8}", "ENOENT"},
        {"{\"op\":\"stats\",\"id\":9}", NULL},
    };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    char *batch = malloc(200 * 64);
    struct h_conn c;
    size_t i, n = 0;

    assert_non_null(batch);
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    for (i = 0; i < sizeof(session) / sizeof(session[0]); i++)
        n += (size_t)sprintf(batch + n, "%s\n", session[i].request);
    assert_int_equal(h_conn_send(&c, batch, n), 0);
    for (i = 0; i < sizeof(session) / sizeof(session[0]); i++) {
        json_t *reply = h_recv_json(&c);

        if (session[i].error == NULL)
            h_assert_ok(reply);
        else
            h_assert_error(reply, session[i].error, NULL);
        if (strcmp(session[i].request, "not json") != 0)
            assert_int_equal(h_int(reply, "id"), (long long)i);
        json_decref(reply);
    }
    assert_int_equal(c.nfds, 1);

    n = 0;
    for (i = 0; i < 200; i++)
        n += (size_t)sprintf(batch + n, "{\"op\":\"%s\",\"key\":\"p\",\"id\":%zu}\n",
                             i % 2 ? "contains" : "get", i);
    assert_int_equal(h_conn_send(&c, batch, n), 0);
    for (i = 0; i < 200; i++) {
        json_t *reply = h_recv_json(&c);

        h_assert_ok(reply);
        assert_int_equal(h_int(reply, "id"), (long long)i);
        json_decref(reply);
    }
    /* 100 gets pinned p 100 times; each is released once. */
    assert_int_equal(stat_int(&c, "pinned"), 1);
    for (i = 0; i < 100; i++)
        key_op(&c, "release", "p");
    assert_int_equal(stat_int(&c, "pinned"), 0);
    free(batch);
    h_conn_close(&c);
    h_pass(f);
}

/* Pipelining is allowed before hello too: 5000 requests, hello and one more
 * request in one write, read only afterwards, get 5000 EPROTO replies, the
 * hello reply with its descriptor, and the last reply, in order. The earlier
 * replies fill the socket and queue up in the daemon, so the hello reply
 * must wait for them to drain before it can carry the descriptor. */
static void test_pipelined_before_hello(void **state)
{
    static const char stats_line[] = "{\"op\":\"stats\"}\n";
    static const char tail[] = "{\"op\":\"hello\",\"version\":1,\"id\":\"h\"}\n"
                               "{\"op\":\"stats\",\"id\":\"last\"}\n";
    struct h_fix *f = *state;
    struct h_daemon *d;
    size_t n = 5000, len = n * (sizeof(stats_line) - 1) + sizeof(tail) - 1, i;
    char *batch;
    struct h_conn c;
    json_t *reply;

    d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    batch = malloc(len);
    assert_non_null(batch);
    for (i = 0; i < n; i++)
        memcpy(batch + i * (sizeof(stats_line) - 1), stats_line, sizeof(stats_line) - 1);
    memcpy(batch + n * (sizeof(stats_line) - 1), tail, sizeof(tail) - 1);
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    assert_int_equal(h_conn_send(&c, batch, len), 0);
    free(batch);
    /* Read nothing until the daemon has run every line: its replies fill the
     * socket and queue up behind it, as they do for a busy client. */
    h_sleep_ms(300);
    for (i = 0; i < n; i++) {
        reply = h_recv_json(&c);
        h_assert_error(reply, "EPROTO", "Say hello first");
        json_decref(reply);
    }
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "h");
    json_decref(reply);
    assert_int_equal(c.nfds, 1);
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "last");
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* Framing: blank lines (and "\r\n" endings) are not requests, and a request
 * that arrives a few bytes at a time is answered once, when its '\n' comes. */
static void test_framing(void **state)
{
    static const char req[] = "{\"op\":\"stats\",\"id\":\"slow\"}\n";
    static const char blank[] = "\n\n\r\n{\"op\":\"stats\",\"id\":1}\r\n\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;
    char *line;
    size_t i;

    json_decref(h_open_hello(&c, d));
    assert_int_equal(h_conn_send(&c, blank, sizeof(blank) - 1), 0);
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "id"), 1);
    json_decref(reply);
    /* Nothing else comes for the blank lines. */
    assert_int_equal(h_conn_recv_line(&c, &line, 200), -ETIMEDOUT);

    for (i = 0; i + 1 < sizeof(req); i += 3) {
        size_t n = sizeof(req) - 1 - i < 3 ? sizeof(req) - 1 - i : 3;

        assert_int_equal(h_conn_send(&c, req + i, n), 0);
        if (i + n < sizeof(req) - 1)
            assert_int_equal(h_conn_recv_line(&c, &line, 5), -ETIMEDOUT);
    }
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "id"), "slow");
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* Garbage bytes (NULs, control characters, invalid UTF-8) on one line get
 * one EPROTO reply; the connection and the daemon carry on. */
static void test_binary_garbage(void **state)
{
    static const char junk[] = "\x00\x01\x02{\"op\":\x00\"stats\"}\xff\xc0\x80\x7f\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;

    json_decref(h_open_hello(&c, d));
    assert_int_equal(h_conn_send(&c, junk, sizeof(junk) - 1), 0);
    reply = h_recv_json(&c);
    h_assert_error(reply, "EPROTO", "not valid JSON");
    json_decref(reply);
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    h_conn_close(&c);
    h_assert_alive(d);
    h_pass(f);
}

/* A request line of exactly 64 KiB is served; one byte more gets EMSGSIZE and
 * the connection is closed, releasing what it held; the daemon carries on. */
static void test_line_limit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    size_t max = 64 * 1024;
    char *line = malloc(max + 2);
    struct h_conn c, other;
    json_t *reply;

    assert_non_null(line);
    json_decref(h_open_hello(&c, d));
    json_decref(h_open_hello(&other, d));

    /* 65536 bytes before the '\n': {"op":"stats","id":1, spaces, }. */
    memset(line, ' ', max);
    memcpy(line, "{\"op\":\"stats\",\"id\":1", 20);
    line[max - 1] = '}';
    line[max] = '\n';
    assert_int_equal(h_conn_send(&c, line, max + 1), 0);
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "id"), 1);
    json_decref(reply);

    /* The connection holds a pin and a pending allocation when it goes. */
    do_put(&c, "held", 100, 0);
    key_op(&c, "get", "held");
    do_alloc(&c, "pending", 100, 0);
    assert_int_equal(stat_int(&other, "pinned"), 1);
    assert_int_equal(stat_int(&other, "pending"), 1);

    memmove(line + 1, line, max + 1); /* 65537 bytes, then '\n' */
    line[0] = ' ';
    h_conn_send(&c, line, max + 2); /* the daemon may close before it has all */
    reply = h_recv_json(&c);
    h_assert_error(reply, "EMSGSIZE",
                   "Request line longer than 65536 bytes; requests are small JSON "
                   "objects. Closing the connection.");
    json_decref(reply);
    assert_int_equal(h_conn_wait_eof(&c, H_REPLY_TIMEOUT_MS), 0);
    h_conn_close(&c);

    assert_true(h_eventually(clean_after_close, &other, 2000));
    do_alloc(&other, "pending", 100, 0);
    h_conn_close(&other);
    h_assert_alive(d);
    free(line);
    h_pass(f);
}

/* ---- the ops -------------------------------------------------------------- */

/* alloc hands out an aligned extent inside the data area with a PENDING chunk
 * header in front of it; bytes written there are what another connection
 * reads after commit + get, at the same offset; release then ends the pin. */
static void test_alloc_commit_get_release(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    const struct shmb_chunk_header *ch;
    unsigned char *wmap, *rmap;
    struct h_conn w, r;
    long long off, size = 1000, first;
    json_t *reply;

    json_decref(h_open_hello(&w, d));
    json_decref(h_open_hello(&r, d));
    wmap = map_segment(&w);
    rmap = map_segment(&r);

    first = do_alloc(&w, "first", 1, 0);
    off = do_alloc(&w, "obj", size, 3);
    assert_int_equal(first % SHMB_ALIGN, 0);
    assert_int_equal(off % SHMB_ALIGN, 0);
    assert_true(first >= DATA_OFFSET);
    assert_true(off > first);
    assert_true(off + size <= DATA_OFFSET + DATA_SIZE);
    /* The chunk header: fixed part, then the key, padded to the alignment. */
    ch = (const struct shmb_chunk_header *)(wmap + off - SHMB_ALIGN);
    assert_int_equal(ch->magic, SHMB_CHUNK_MAGIC);
    assert_int_equal(ch->state, SHMB_CHUNK_PENDING);
    assert_int_equal(ch->key_len, 3);
    assert_int_equal(ch->header_size, SHMB_ALIGN);
    assert_int_equal(ch->payload_size, size);
    assert_memory_equal((const char *)ch + CHUNK_FIXED, "obj", 3);

    h_fill(wmap + off, (size_t)size, 42);
    h_expect_error(&r, "{\"op\":\"get\",\"key\":\"obj\"}", "ENOENT", "not committed");
    key_op(&w, "commit", "obj");
    assert_int_equal(ch->state, SHMB_CHUNK_COMMITTED);

    reply = h_call(&r, "{\"op\":\"get\",\"key\":\"obj\"}");
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "offset"), off);
    assert_int_equal(h_int(reply, "size"), size);
    assert_int_equal(json_object_size(reply), 3);
    json_decref(reply);
    assert_int_equal(h_check(rmap + off, (size_t)size, 42), (size_t)size);
    key_op(&r, "release", "obj");
    h_expect_error(&r, "{\"op\":\"release\",\"key\":\"obj\"}", "ENOENT", "holds no pin");

    /* Replies of commit and release carry nothing but ok. */
    reply = h_call(&w, "{\"op\":\"commit\",\"key\":\"first\"}");
    h_assert_ok(reply);
    assert_int_equal(json_object_size(reply), 1);
    json_decref(reply);
    munmap(wmap, SEG_SIZE);
    munmap(rmap, SEG_SIZE);
    h_conn_close(&w);
    h_conn_close(&r);
    h_pass(f);
}

/* A connection may pin a key several times; each get counts a pin and a
 * read, each is released once, and pins are per connection. */
static void test_pins(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn a, b;
    json_t *reply, *objects;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    do_put(&a, "k", 64, 3);
    key_op(&a, "get", "k");
    key_op(&a, "get", "k");
    key_op(&b, "get", "k");
    reply = list(&a, "k", 0, &objects);
    assert_int_equal(h_int(find_entry(objects, "k"), "pins"), 3);
    assert_int_equal(h_int(find_entry(objects, "k"), "readers"), 0);
    json_decref(reply);
    assert_int_equal(stat_int(&a, "pinned"), 1);
    assert_int_equal(counter(&a, "gets"), 3);

    key_op(&b, "release", "k");
    h_expect_error(&b, "{\"op\":\"release\",\"key\":\"k\"}", "ENOENT", NULL);
    key_op(&a, "release", "k");
    assert_int_equal(stat_int(&a, "pinned"), 1);
    key_op(&a, "release", "k");
    assert_int_equal(stat_int(&a, "pinned"), 0);
    h_expect_error(&a, "{\"op\":\"release\",\"key\":\"k\"}", "ENOENT", NULL);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* abort drops the pending allocation: the key is free again, the bytes come
 * back, and a second abort finds nothing. */
static void test_abort(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;

    json_decref(h_open_hello(&c, d));
    do_alloc(&c, "k", 1000, 0);
    assert_int_equal(stat_int(&c, "pending"), 1);
    assert_true(stat_int(&c, "used") > 0);
    key_op(&c, "abort", "k");
    assert_int_equal(stat_int(&c, "pending"), 0);
    assert_int_equal(stat_int(&c, "used"), 0);
    assert_false(contains(&c, "k"));
    h_expect_error(&c, "{\"op\":\"abort\",\"key\":\"k\"}", "ENOENT", NULL);
    do_put(&c, "k", 10, 0);
    assert_true(contains(&c, "k"));
    h_conn_close(&c);
    h_pass(f);
}

/* Only the connection that allocated a key may commit or abort it; others
 * get ENOENT and cannot read it until it is committed. */
static void test_commit_other_connection(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn a, b;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    do_alloc(&a, "k", 100, 0);
    h_expect_error(&b, "{\"op\":\"commit\",\"key\":\"k\"}", "ENOENT",
                   "Cannot commit 'k': this connection holds no pending allocation of it.");
    h_expect_error(&b, "{\"op\":\"abort\",\"key\":\"k\"}", "ENOENT", "Cannot abort 'k'");
    h_expect_error(&b, "{\"op\":\"get\",\"key\":\"k\"}", "ENOENT", "not committed");
    h_expect_error(&b, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":1}", "EEXIST", NULL);
    assert_false(contains(&b, "k"));
    key_op(&a, "commit", "k");
    assert_true(contains(&b, "k"));
    key_op(&b, "get", "k");
    key_op(&b, "release", "k");
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* touch adds awaited reads to a committed object; each get takes one away. */
static void test_touch(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply, *objects;

    json_decref(h_open_hello(&c, d));
    do_put(&c, "k", 100, 1);
    h_expect_ok(&c, "{\"op\":\"touch\",\"key\":\"k\",\"readers\":2}");
    reply = list(&c, NULL, 0, &objects);
    assert_int_equal(h_int(find_entry(objects, "k"), "readers"), 3);
    json_decref(reply);
    key_op(&c, "get", "k");
    key_op(&c, "release", "k");
    reply = list(&c, NULL, 0, &objects);
    assert_int_equal(h_int(find_entry(objects, "k"), "readers"), 2);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* delete removes the key at once (contains false, get ENOENT, the key can be
 * allocated again) while a pinned object's bytes stay until the last release;
 * list shows it as "deleted" until then. */
static void test_delete(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    unsigned char *map;
    struct h_conn a, b;
    json_t *reply, *objects, *e;
    long long off, off2;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    map = map_segment(&a);

    do_put(&a, "gone", 100, 0);
    key_op(&a, "delete", "gone");
    assert_false(contains(&a, "gone"));
    assert_int_equal(stat_int(&a, "used"), 0);

    off = do_alloc(&a, "k", 5000, 0);
    h_fill(map + off, 5000, 7);
    key_op(&a, "commit", "k");
    key_op(&b, "get", "k");
    key_op(&a, "delete", "k");
    assert_false(contains(&a, "k"));
    h_expect_error(&a, "{\"op\":\"get\",\"key\":\"k\"}", "ENOENT", NULL);
    assert_int_equal(stat_int(&a, "objects"), 0);
    assert_int_equal(stat_int(&a, "pinned"), 1);
    reply = list(&a, NULL, 0, &objects);
    assert_int_equal(json_array_size(objects), 1);
    e = json_array_get(objects, 0);
    assert_string_equal(h_str(e, "key"), "k");
    assert_string_equal(h_str(e, "state"), "deleted");
    assert_int_equal(h_int(e, "pins"), 1);
    json_decref(reply);

    /* The key is free for a new object; the old bytes are intact. */
    off2 = do_put(&a, "k", 10, 0);
    assert_true(off2 != off);
    assert_int_equal(h_check(map + off, 5000, 7), 5000);
    assert_int_equal(stat_int(&a, "objects"), 1);

    key_op(&b, "release", "k"); /* releases the deleted object's pin */
    assert_int_equal(stat_int(&a, "pinned"), 0);
    reply = list(&a, NULL, 0, &objects);
    assert_int_equal(json_array_size(objects), 1);
    assert_string_equal(h_str(json_array_get(objects, 0), "state"), "committed");
    assert_int_equal(h_int(json_array_get(objects, 0), "offset"), off2);
    json_decref(reply);
    munmap(map, SEG_SIZE);
    h_conn_close(&a);
    h_conn_close(&b);
    h_pass(f);
}

/* contains is true only for committed objects. */
static void test_contains(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c;
    json_t *reply;

    json_decref(h_open_hello(&c, d));
    assert_false(contains(&c, "k"));
    do_alloc(&c, "k", 10, 0);
    assert_false(contains(&c, "k"));
    key_op(&c, "commit", "k");
    assert_true(contains(&c, "k"));
    assert_false(contains(&c, "K"));
    reply = h_call(&c, "{\"op\":\"contains\",\"key\":\"k\"}");
    assert_int_equal(json_object_size(reply), 2); /* ok, exists */
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* list reports objects oldest first with every field, filters by prefix,
 * stops at limit (default 1000) and says whether it stopped early. */
static void test_list(void **state)
{
    static const char *const keys[] = {"b/2", "a/1", "b/1", "c", "b/3"};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn c, w;
    json_t *reply, *objects, *e;
    long long offs[5];
    char key[32];
    size_t i;

    json_decref(h_open_hello(&c, d));
    json_decref(h_open_hello(&w, d));
    for (i = 0; i < 5; i++)
        offs[i] = do_put(&c, keys[i], (long long)(i + 1) * 100, (int)i);
    do_alloc(&w, "b/pending", 7, 0);
    key_op(&c, "get", "c");

    reply = list(&c, NULL, 0, &objects);
    assert_int_equal(json_array_size(objects), 6);
    assert_false(json_is_true(json_object_get(reply, "truncated")));
    for (i = 0; i < 5; i++) {
        e = json_array_get(objects, i);
        assert_string_equal(h_str(e, "key"), keys[i]);
        assert_int_equal(h_int(e, "offset"), offs[i]);
        assert_int_equal(h_int(e, "size"), (long long)(i + 1) * 100);
        assert_int_equal(h_int(e, "pins"), i == 3 ? 1 : 0);
        assert_int_equal(h_int(e, "readers"), i == 3 ? 2 : (long long)i);
        assert_string_equal(h_str(e, "state"), "committed");
        assert_true(h_int(e, "age_ms") >= 0);
        assert_int_equal(json_object_size(e), 7);
    }
    e = json_array_get(objects, 5);
    assert_string_equal(h_str(e, "key"), "b/pending");
    assert_string_equal(h_str(e, "state"), "pending");
    json_decref(reply);

    reply = list(&c, "b/", 0, &objects);
    assert_int_equal(json_array_size(objects), 4);
    assert_string_equal(h_str(json_array_get(objects, 0), "key"), "b/2");
    assert_string_equal(h_str(json_array_get(objects, 1), "key"), "b/1");
    assert_string_equal(h_str(json_array_get(objects, 2), "key"), "b/3");
    assert_string_equal(h_str(json_array_get(objects, 3), "key"), "b/pending");
    json_decref(reply);

    reply = list(&c, "b/", 2, &objects);
    assert_int_equal(json_array_size(objects), 2);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    assert_string_equal(h_str(json_array_get(objects, 1), "key"), "b/1");
    json_decref(reply);
    reply = list(&c, "b/", 4, &objects);
    assert_int_equal(json_array_size(objects), 4);
    assert_false(json_is_true(json_object_get(reply, "truncated")));
    json_decref(reply);
    reply = list(&c, "zzz", 0, &objects);
    assert_int_equal(json_array_size(objects), 0);
    json_decref(reply);

    /* The default limit is 1000. */
    for (i = 0; i < 1001; i++) {
        snprintf(key, sizeof(key), "many/%04zu", i);
        do_put(&c, key, 1, 0);
    }
    reply = list(&c, "many/", 0, &objects);
    assert_int_equal(json_array_size(objects), 1000);
    assert_true(json_is_true(json_object_get(reply, "truncated")));
    assert_string_equal(h_str(json_array_get(objects, 999), "key"), "many/0999");
    json_decref(reply);
    h_conn_close(&c);
    h_conn_close(&w);
    h_pass(f);
}

/* stats has every field with the right figures: the segment, occupancy
 * (used + free == data_size), objects, pending, pinned, clients, the
 * daemon's pid and version, the shm directory, the blocker and counters. */
static void test_stats(void **state)
{
    static const char *const fields[] = {
        "segment", "size", "data_size", "used", "free", "objects", "pending", "pinned",
        "clients", "max_object_size", "uptime_s", "pid", "version", "shm_dir",
        "shm_dir_free", "blocker", "counters",
    };
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn a, b;
    json_t *reply, *blocker, *counters;
    size_t i;
    long long used;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    reply = stats(&a);
    for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (json_object_get(reply, fields[i]) == NULL)
            h_fail("stats has no \"%s\"", fields[i]);
    /* ok, the fields, the pool's name, the pools (one) and the queues (none). */
    assert_int_equal(json_object_size(reply), 4 + sizeof(fields) / sizeof(fields[0]));
    assert_int_equal(json_array_size(json_object_get(reply, "queues")), 0);
    assert_string_equal(h_str(reply, "pool"), d->name);
    assert_int_equal(json_array_size(json_object_get(reply, "pools")), 1);
    assert_string_equal(h_str(reply, "segment"), d->name);
    assert_int_equal(h_int(reply, "size"), SEG_SIZE);
    assert_int_equal(h_int(reply, "data_size"), DATA_SIZE);
    assert_int_equal(h_int(reply, "used"), 0);
    assert_int_equal(h_int(reply, "free"), DATA_SIZE);
    assert_int_equal(h_int(reply, "objects"), 0);
    assert_int_equal(h_int(reply, "max_object_size"), MAX_OBJECT);
    assert_int_equal(h_int(reply, "pid"), d->pid);
    assert_string_equal(h_str(reply, "version"), SHMB_VERSION);
    assert_string_equal(h_str(reply, "shm_dir"), "/dev/shm");
    assert_true(h_int(reply, "shm_dir_free") > 0);
    assert_true(h_int(reply, "uptime_s") >= 0);
    assert_true(json_is_null(json_object_get(reply, "blocker")));
    counters = json_object_get(reply, "counters");
    assert_int_equal(json_object_size(counters), 9);
    assert_int_equal(h_int(counters, "fast_reads"), 0);
    assert_int_equal(h_int(counters, "expired_allocs"), 0);
    assert_int_equal(h_int(counters, "lease_expiries"), 0);
    assert_int_equal(h_int(counters, "noreply_errors"), 0);
    assert_int_equal(h_int(counters, "allocs"), 0);
    assert_int_equal(h_int(counters, "commits"), 0);
    assert_int_equal(h_int(counters, "gets"), 0);
    assert_int_equal(h_int(counters, "evictions"), 0);
    assert_int_equal(h_int(counters, "enospc"), 0);
    json_decref(reply);

    do_put(&a, "one", 1000, 0);
    do_put(&a, "two", 2000, 0);
    do_alloc(&b, "three", 3000, 0);
    key_op(&b, "get", "one");
    key_op(&a, "get", "one");
    key_op(&a, "get", "two");
    reply = stats(&a);
    used = h_int(reply, "used");
    /* Three chunks of a 64-byte header plus the payload padded to 64. */
    assert_int_equal(used, (64 + 1024) + (64 + 2048) + (64 + 3008));
    assert_int_equal(used + h_int(reply, "free"), DATA_SIZE);
    assert_int_equal(h_int(reply, "objects"), 2);
    assert_int_equal(h_int(reply, "pending"), 1);
    assert_int_equal(h_int(reply, "pinned"), 2);
    assert_int_equal(h_int(reply, "clients"), 2);
    blocker = json_object_get(reply, "blocker");
    assert_string_equal(h_str(blocker, "key"), "one");
    assert_int_equal(h_int(blocker, "pins"), 2);
    assert_int_equal(h_int(blocker, "readers"), 0);
    counters = json_object_get(reply, "counters");
    assert_int_equal(h_int(counters, "allocs"), 3);
    assert_int_equal(h_int(counters, "commits"), 2);
    assert_int_equal(h_int(counters, "gets"), 3);
    json_decref(reply);

    /* The blocker moves to the next object that stops reclaim. */
    key_op(&a, "release", "one");
    key_op(&b, "release", "one");
    reply = stats(&a);
    assert_string_equal(h_str(json_object_get(reply, "blocker"), "key"), "two");
    json_decref(reply);
    h_conn_close(&b); /* drops the pending "three" */
    key_op(&a, "release", "two");
    assert_true(h_eventually(clean_after_close, &a, 2000));
    reply = stats(&a);
    assert_true(json_is_null(json_object_get(reply, "blocker")));
    json_decref(reply);
    h_conn_close(&a);
    h_pass(f);
}

/* ---- space ----------------------------------------------------------------- */

#define THIRD 300000 /* three of these fill most of the 1 MiB segment */

/* alloc reclaims committed objects oldest first, only as many as it needs;
 * when the oldest is pinned it fails with ENOSPC naming that key and its
 * pins, and succeeds once the pin is released. */
static void test_enospc_pinned(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn w, r;
    json_t *reply, *blocker;

    json_decref(h_open_hello(&w, d));
    json_decref(h_open_hello(&r, d));
    do_put(&w, "a", THIRD, 0);
    do_put(&w, "b", THIRD, 0);
    do_put(&w, "c", THIRD, 0);
    key_op(&r, "get", "a");

    reply = h_call(&w, "{\"op\":\"alloc\",\"key\":\"d\",\"size\":300000}");
    h_assert_error(reply, "ENOSPC", "the oldest object 'a' blocks reclaim (pins=1, "
                                    "awaited reads=0)");
    assert_true(h_contains(h_str(reply, "message"), "No space for 'd' (300000 bytes)"));
    json_decref(reply);
    reply = stats(&w);
    assert_int_equal(h_int(json_object_get(reply, "counters"), "enospc"), 1);
    assert_int_equal(h_int(json_object_get(reply, "counters"), "evictions"), 0);
    blocker = json_object_get(reply, "blocker");
    assert_string_equal(h_str(blocker, "key"), "a");
    assert_int_equal(h_int(blocker, "pins"), 1);
    json_decref(reply);
    assert_true(contains(&w, "a"));

    key_op(&r, "release", "a");
    do_alloc(&w, "d", THIRD, 0);
    assert_false(contains(&w, "a"));
    assert_true(contains(&w, "b")); /* one eviction was enough */
    assert_true(contains(&w, "c"));
    assert_int_equal(counter(&w, "evictions"), 1);
    h_conn_close(&w);
    h_conn_close(&r);
    h_pass(f);
}

/* An object that still awaits reads, or an allocation still being written,
 * blocks reclaim when it is the oldest; the ENOSPC message says which. */
static void test_enospc_awaited_and_pending(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn w, p;

    json_decref(h_open_hello(&w, d));
    json_decref(h_open_hello(&p, d));
    do_put(&w, "a", THIRD, 2);
    do_put(&w, "b", THIRD, 0);
    do_put(&w, "c", THIRD, 0);
    h_expect_error(&w, "{\"op\":\"alloc\",\"key\":\"d\",\"size\":300000}", "ENOSPC",
                   "the oldest object 'a' blocks reclaim (pins=0, awaited reads=2)");
    key_op(&p, "get", "a");
    key_op(&p, "release", "a");
    h_expect_error(&w, "{\"op\":\"alloc\",\"key\":\"d\",\"size\":300000}", "ENOSPC",
                   "awaited reads=1");
    key_op(&p, "get", "a");
    key_op(&p, "release", "a");
    do_put(&w, "d", THIRD, 0); /* evicts a */

    /* Now b is the oldest; make a pending allocation the oldest instead. */
    key_op(&w, "delete", "b");
    key_op(&w, "delete", "c");
    key_op(&w, "delete", "d");
    do_alloc(&p, "e", THIRD, 0);
    do_put(&w, "f", THIRD, 0);
    do_put(&w, "g", THIRD, 0);
    h_expect_error(&w, "{\"op\":\"alloc\",\"key\":\"h\",\"size\":300000}", "ENOSPC",
                   "the oldest object 'e' (pins=0) is still being written and blocks "
                   "reclaim");
    key_op(&p, "abort", "e");
    do_alloc(&w, "h", THIRD, 0);
    assert_int_equal(counter(&w, "enospc"), 3);
    h_conn_close(&w);
    h_conn_close(&p);
    h_pass(f);
}

/* Closing a connection that holds pins (one key twice) and pending
 * allocations releases all of it: stats show pinned 0 and pending 0, the
 * pending key can be allocated again, committed objects stay. */
static void test_disconnect_cleanup(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, SEG_SIZE_ARG, NULL);
    struct h_conn a, b;
    json_t *reply;

    json_decref(h_open_hello(&a, d));
    json_decref(h_open_hello(&b, d));
    do_put(&a, "kept", 1000, 0);
    key_op(&a, "get", "kept");
    key_op(&a, "get", "kept");
    do_alloc(&a, "pend", 1000, 0);
    do_alloc(&a, "pend2", 1000, 0);
    reply = stats(&b);
    assert_int_equal(h_int(reply, "pinned"), 1);
    assert_int_equal(h_int(reply, "pending"), 2);
    json_decref(reply);

    h_conn_close(&a);
    assert_true(h_eventually(clean_after_close, &b, 2000));
    assert_true(contains(&b, "kept"));
    do_put(&b, "pend", 10, 0);
    do_put(&b, "pend2", 10, 0);
    h_expect_error(&b, "{\"op\":\"release\",\"key\":\"kept\"}", "ENOENT", NULL);
    /* A connection that never said hello holds nothing and breaks nothing. */
    assert_int_equal(h_conn_open(&a, d->socket), 0);
    h_conn_close(&a);
    h_expect_ok(&b, "{\"op\":\"stats\"}");
    h_conn_close(&b);
    h_pass(f);
}

/* ---- main ------------------------------------------------------------------ */

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest fixed[] = {
        TEST(test_hello_reply),
        TEST(test_hello_retry),
        TEST(test_id_echo),
        TEST(test_pipelined),
        TEST(test_pipelined_before_hello),
        TEST(test_framing),
        TEST(test_binary_garbage),
        TEST(test_line_limit),
        TEST(test_alloc_commit_get_release),
        TEST(test_pins),
        TEST(test_abort),
        TEST(test_commit_other_connection),
        TEST(test_touch),
        TEST(test_delete),
        TEST(test_contains),
        TEST(test_list),
        TEST(test_stats),
        TEST(test_enospc_pinned),
        TEST(test_enospc_awaited_and_pending),
        TEST(test_disconnect_cleanup),
    };
    size_t ncases = sizeof(cases) / sizeof(cases[0]);
    size_t nfixed = sizeof(fixed) / sizeof(fixed[0]), i;
    struct CMUnitTest *tests = calloc(ncases + nfixed, sizeof(*tests));
    int rc;

    if (tests == NULL)
        return 1;
    for (i = 0; i < nfixed; i++)
        tests[i] = fixed[i];
    for (i = 0; i < ncases; i++) {
        tests[nfixed + i].name = cases[i].name;
        tests[nfixed + i].test_func = test_case;
        tests[nfixed + i].setup_func = h_setup;
        tests[nfixed + i].teardown_func = h_teardown;
        tests[nfixed + i].initial_state = (void *)&cases[i];
    }
    rc = _cmocka_run_group_tests("test_protocol", tests, ncases + nfixed, NULL, NULL);
    free(tests);
    return rc;
}
