// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the client library with several processes: writers and
 * readers that fork, each with its own handle, check every byte through the
 * zero-copy pointers; clients killed with SIGKILL; ENOSPC and its release;
 * error reporting; and vLLM's test_shm_storage.py scenarios through
 * shmb_put/shmb_get. Helper processes never use cmocka asserts: they report
 * on stderr and exit non-zero.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* ---- helpers --------------------------------------------------------------- */

/* get key, check size and pattern through the zero-copy pointer, release.
 * 0, a negative errno from the library, or 1 when the bytes are wrong. */
static int get_verify(shmb_t *c, const char *key, size_t size, uint32_t seed)
{
    const void *p;
    size_t len, bad;
    int rc = shmb_get(c, key, &p, &len);

    if (rc < 0)
        return rc;
    bad = h_check(p, len, seed);
    if (len != size || bad != len) {
        fprintf(stderr, "pid %d: %s: %zu bytes (want %zu), first wrong byte at %zu\n",
                (int)getpid(), key, len, size, bad);
        shmb_release(c, key);
        return 1;
    }
    return shmb_release(c, key);
}

/* get + release, whatever the bytes; the test fails unless both work. */
static void read_once(shmb_t *c, const char *key)
{
    const void *p;
    size_t len;

    ok(c, shmb_get(c, key, &p, &len));
    ok(c, shmb_release(c, key));
}

/* Stats, or the test fails. */
static void stats(shmb_t *c, shmb_stats_t *st)
{
    ok(c, shmb_stats(c, st));
}

/* The list reply of the daemon (via shmb_request); the caller frees. */
static json_t *list_objects(shmb_t *c)
{
    char *raw = NULL;
    json_t *reply;

    ok(c, shmb_request(c, "{\"op\":\"list\",\"limit\":100000}", &raw));
    reply = json_loads(raw, 0, NULL);
    free(raw);
    assert_non_null(reply);
    return reply;
}

/* ---- several processes ------------------------------------------------------ */

#define NREADERS 3

struct mp_plan {
    const char *socket;
    size_t sizes[12];
    size_t nsizes;
};

/* The key and seed of object i. */
static void mp_key(size_t i, char *key, size_t len)
{
    snprintf(key, len, "obj-%02zu", i);
}

/* The writer: zero-copy alloc + fill + commit for even objects, shmb_put for
 * odd ones, each awaiting NREADERS reads. */
static int mp_writer(void *arg)
{
    const struct mp_plan *plan = arg;
    shmb_t *c = shmb_new();
    size_t i;
    int errors = 0;

    /* The objects are listed in the order they were put: one after the
     * other in the ring, not some of them in an arena. */
    if (c != NULL)
        shmb_set_arena(c, 0);
    if (c == NULL || shmb_connect(c, plan->socket, "writer") < 0) {
        fprintf(stderr, "writer: connect: %s\n", c ? shmb_errmsg(c) : "no memory");
        return 2;
    }
    for (i = 0; i < plan->nsizes; i++) {
        char key[32];
        void *p;
        int rc;

        mp_key(i, key, sizeof(key));
        if (i % 2 == 0) {
            rc = shmb_alloc(c, key, plan->sizes[i], NREADERS, &p);
            if (rc == 0) {
                h_fill(p, plan->sizes[i], (uint32_t)i + 1);
                rc = shmb_commit(c, key);
            }
        } else {
            rc = h_put_pattern(c, key, plan->sizes[i], (uint32_t)i + 1, NREADERS);
        }
        if (rc < 0) {
            fprintf(stderr, "writer: %s (%zu bytes): %s: %s\n", key, plan->sizes[i],
                    shmb_errname(c), shmb_errmsg(c));
            errors++;
        }
    }
    shmb_close(c);
    return errors ? 1 : 0;
}

/* A reader: waits for each object to be committed, checks every byte through
 * the zero-copy pointer, releases it. */
static int mp_reader(void *arg)
{
    const struct mp_plan *plan = arg;
    shmb_t *c = shmb_new();
    size_t i;
    int errors = 0;

    if (c == NULL || shmb_connect(c, plan->socket, "reader") < 0) {
        fprintf(stderr, "reader: connect: %s\n", c ? shmb_errmsg(c) : "no memory");
        return 2;
    }
    for (i = 0; i < plan->nsizes; i++) {
        uint64_t deadline = h_now_ms() + H_REPLY_TIMEOUT_MS;
        char key[32];
        int rc;

        mp_key(i, key, sizeof(key));
        while ((rc = get_verify(c, key, plan->sizes[i], (uint32_t)i + 1)) == -ENOENT &&
               h_now_ms() < deadline)
            h_sleep_ms(1);
        if (rc != 0) {
            fprintf(stderr, "reader %d: %s: %d %s: %s\n", (int)getpid(), key, rc,
                    shmb_errname(c), shmb_errmsg(c));
            errors++;
        }
    }
    shmb_close(c);
    return errors ? 1 : 0;
}

/* One writer and three readers, each a process with its own handle: objects
 * of 1 byte, odd sizes and max_object_size arrive intact, byte for byte, in
 * every reader; afterwards every awaited read was counted and nothing is
 * pinned. */
static void test_writer_and_readers(void **state)
{
    static const size_t sizes[] = {1, 3, 63, 64, 65, 4095, 4097, 65537, 1000003};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "8M", NULL);
    struct mp_plan plan;
    pid_t readers[NREADERS], writer;
    shmb_t *c = h_lib_connect(d, "test", 0);
    shmb_stats_t st;
    json_t *reply, *item;
    size_t i;

    memset(&plan, 0, sizeof(plan));
    plan.socket = d->socket;
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        plan.sizes[plan.nsizes++] = sizes[i];
    plan.sizes[plan.nsizes++] = shmb_info(c)->max_object_size;
    assert_int_equal(shmb_info(c)->max_object_size, 4 << 20);

    for (i = 0; i < NREADERS; i++)
        assert_true((readers[i] = h_fork(f, mp_reader, &plan)) > 0);
    assert_true((writer = h_fork(f, mp_writer, &plan)) > 0);
    assert_int_equal(h_child_wait(f, writer, H_RUN_TIMEOUT_MS), 0);
    for (i = 0; i < NREADERS; i++)
        assert_int_equal(h_child_wait(f, readers[i], H_RUN_TIMEOUT_MS), 0);

    stats(c, &st);
    assert_int_equal(st.objects, plan.nsizes);
    assert_int_equal(st.commits, plan.nsizes);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.evictions, 0);
    reply = list_objects(c);
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), plan.nsizes);
    json_array_foreach(json_object_get(reply, "objects"), i, item) {
        assert_int_equal(h_int(item, "size"), plan.sizes[i]);
        assert_int_equal(h_int(item, "readers"), 0); /* every awaited read happened */
        assert_int_equal(h_int(item, "pins"), 0);
    }
    json_decref(reply);
    /* And this process sees the same bytes. */
    for (i = 0; i < plan.nsizes; i++) {
        char key[32];

        mp_key(i, key, sizeof(key));
        assert_int_equal(get_verify(c, key, plan.sizes[i], (uint32_t)i + 1), 0);
    }
    shmb_close(c);
    h_pass(f);
}

#define THIRD 300000 /* three of these fill most of a 1 MiB segment */

struct holder_arg {
    const char *socket;
    const char *key;
    struct h_signal ready;
    bool alloc; /* alloc (and write, never commit) rather than get */
};

/* A client that pins key (or leaves an alloc of it uncommitted), says so, and
 * waits to be killed. */
static int holder(void *arg)
{
    struct holder_arg *a = arg;
    shmb_t *c = shmb_new();
    const void *p;
    void *w;
    size_t len;
    int rc;

    if (c == NULL || shmb_connect(c, a->socket, "holder") < 0)
        return 2;
    if (a->alloc) {
        rc = shmb_alloc(c, a->key, 1000, 0, &w);
        if (rc == 0)
            memset(w, 0xab, 1000);
    } else {
        rc = shmb_get(c, a->key, &p, &len);
    }
    if (rc < 0) {
        fprintf(stderr, "holder: %s: %s\n", shmb_errname(c), shmb_errmsg(c));
        return 3;
    }
    h_signal_notify(&a->ready);
    for (;;)
        pause();
}

/* Poll: does an alloc of THIRD bytes under "d" succeed now? */
static bool alloc_d_succeeds(void *arg)
{
    shmb_t *c = arg;
    void *p;

    return shmb_alloc(c, "d", THIRD, 0, &p) == 0;
}

/* A reader killed with SIGKILL while it pins the oldest object stops
 * blocking reclaim: ENOSPC (naming that object and its pin) before the kill,
 * success after it. */
static void test_killed_reader(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0);
    struct holder_arg a = {d->socket, "a", {{-1, -1}}, false};
    shmb_stats_t st;
    pid_t pid;
    void *p;

    ok(c, h_put_pattern(c, "a", THIRD, 1, 0));
    ok(c, h_put_pattern(c, "b", THIRD, 2, 0));
    ok(c, h_put_pattern(c, "c", THIRD, 3, 0));
    h_signal_open(&a.ready);
    assert_true((pid = h_fork(f, holder, &a)) > 0);
    if (!h_signal_wait(&a.ready, H_REPLY_TIMEOUT_MS))
        h_fail("the helper process did not get ready within %d ms", H_REPLY_TIMEOUT_MS);
    stats(c, &st);
    assert_int_equal(st.pinned, 1);
    fails(c, shmb_alloc(c, "d", THIRD, 0, &p), -ENOSPC,
          "the oldest object 'a' blocks reclaim (pins=1, awaited reads=0)");
    assert_null(p);

    assert_int_equal(h_child_kill(f, pid, SIGKILL), 128 + SIGKILL);
    assert_true(h_eventually(alloc_d_succeeds, c, 2000));
    assert_int_equal(shmb_errcode(c), 0);
    ok(c, shmb_commit(c, "d"));
    assert_int_equal(shmb_contains(c, "a"), 0);
    stats(c, &st);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.clients, 1);
    h_signal_close(&a.ready);
    shmb_close(c);
    h_pass(f);
}

/* Poll: nothing pending any more. */
static bool nothing_pending(void *arg)
{
    shmb_stats_t st;

    return shmb_stats(arg, &st) == 0 && st.pending == 0;
}

/* The uncommitted allocation of a writer killed with SIGKILL is dropped: the
 * key can be allocated again and stats show nothing pending. */
static void test_killed_writer(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0);
    struct holder_arg a = {d->socket, "w", {{-1, -1}}, true};
    shmb_stats_t st;
    const void *r;
    size_t len;
    pid_t pid;
    void *p;

    h_signal_open(&a.ready);
    assert_true((pid = h_fork(f, holder, &a)) > 0);
    if (!h_signal_wait(&a.ready, H_REPLY_TIMEOUT_MS))
        h_fail("the helper process did not get ready within %d ms", H_REPLY_TIMEOUT_MS);
    stats(c, &st);
    assert_int_equal(st.pending, 1);
    assert_true(st.used > 0);
    fails(c, shmb_alloc(c, "w", 10, 0, &p), -EEXIST, "already exists");
    fails(c, shmb_get(c, "w", &r, &len), -ENOENT, "not committed");
    assert_int_equal(shmb_contains(c, "w"), 0);

    assert_int_equal(h_child_kill(f, pid, SIGKILL), 128 + SIGKILL);
    assert_true(h_eventually(nothing_pending, c, 2000));
    stats(c, &st);
    assert_int_equal(st.used, 0);
    ok(c, h_put_pattern(c, "w", 10, 5, 0));
    assert_int_equal(get_verify(c, "w", 10, 5), 0);
    h_signal_close(&a.ready);
    shmb_close(c);
    h_pass(f);
}

/* ENOSPC while the oldest object is pinned (by this very handle), success
 * once it is released; eviction takes the oldest object only. */
static void test_enospc_until_release(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0);
    shmb_stats_t st;
    const void *r;
    size_t len;
    void *p;

    ok(c, h_put_pattern(c, "a", THIRD, 1, 0));
    ok(c, shmb_get(c, "a", &r, &len));
    ok(c, h_put_pattern(c, "b", THIRD, 2, 0));
    ok(c, h_put_pattern(c, "c", THIRD, 3, 0));
    fails(c, shmb_alloc(c, "d", THIRD, 0, &p), -ENOSPC, "'a'");
    assert_string_equal(shmb_errname(c), "ENOSPC");
    assert_true(h_contains(shmb_errmsg(c), "pins=1"));
    stats(c, &st);
    assert_int_equal(st.enospc, 1);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "a");
    assert_int_equal(st.blocker_pins, 1);
    assert_string_equal(st.blocker_state, "committed");
    assert_int_equal(h_check(r, len, 1), THIRD); /* still intact */

    ok(c, shmb_release(c, "a"));
    ok(c, shmb_alloc(c, "d", THIRD, 0, &p));
    assert_non_null(p);
    h_fill(p, THIRD, 4);
    ok(c, shmb_commit(c, "d"));
    assert_int_equal(shmb_contains(c, "a"), 0);
    assert_int_equal(shmb_contains(c, "b"), 1);
    assert_int_equal(get_verify(c, "d", THIRD, 4), 0);
    assert_int_equal(get_verify(c, "b", THIRD, 2), 0);
    shmb_close(c);
    h_pass(f);
}

/* delete while another client pins the object: the key is gone and reusable
 * at once, the pinned bytes stay readable until release, then they are
 * reclaimed. */
static void test_delete_while_pinned(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 0);
    const void *old, *fresh;
    size_t old_len, fresh_len;
    shmb_stats_t st;
    uint64_t used_pinned;

    ok(w, h_put_pattern(w, "k", 100000, 1, 0));
    ok(r, shmb_get(r, "k", &old, &old_len));
    ok(w, shmb_delete(w, "k"));
    assert_int_equal(shmb_contains(r, "k"), 0);
    fails(w, shmb_get(w, "k", &fresh, &fresh_len), -ENOENT, NULL);
    fails(w, shmb_delete(w, "k"), -ENOENT, NULL);
    ok(w, h_put_pattern(w, "k", 5000, 2, 0));
    assert_int_equal(h_check(old, old_len, 1), 100000);

    ok(r, shmb_get(r, "k", &fresh, &fresh_len));
    assert_true(fresh != old);
    assert_int_equal(fresh_len, 5000);
    assert_int_equal(h_check(fresh, fresh_len, 2), 5000);
    stats(w, &st);
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.pinned, 2);
    used_pinned = st.used;
    ok(r, shmb_release(r, "k")); /* the new object's pin */
    assert_int_equal(h_check(old, old_len, 1), 100000);
    ok(r, shmb_release(r, "k")); /* the deleted object's pin */
    fails(r, shmb_release(r, "k"), -ENOENT, NULL);
    stats(w, &st);
    assert_int_equal(st.pinned, 0);
    assert_true(st.used < used_pinned); /* the deleted bytes came back */
    shmb_close(w);
    shmb_close(r);
    h_pass(f);
}

/* contains, touch and stats through the library: contains is 1 only for
 * committed keys, touch adds awaited reads that make the object the blocker
 * until they are read, and stats carries the daemon's figures. */
static void test_contains_touch_stats(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0), *other = h_lib_connect(d, "other", 0);
    shmb_stats_t st;
    void *p;

    assert_int_equal(shmb_contains(c, "k"), 0);
    ok(c, shmb_alloc(c, "k", 100, 0, &p));
    assert_int_equal(shmb_contains(c, "k"), 0);
    ok(c, shmb_commit(c, "k"));
    assert_int_equal(shmb_contains(c, "k"), 1);
    assert_int_equal(shmb_contains(other, "k"), 1);

    fails(c, shmb_touch(c, "missing", 1), -ENOENT, "No object 'missing' to touch.");
    stats(c, &st);
    assert_false(st.has_blocker);
    ok(c, shmb_touch(c, "k", 2));
    stats(c, &st);
    assert_true(st.has_blocker);
    assert_string_equal(st.blocker_key, "k");
    assert_int_equal(st.blocker_readers, 2);
    read_once(other, "k");
    stats(c, &st);
    assert_int_equal(st.blocker_readers, 1);
    read_once(other, "k");
    stats(c, &st);
    assert_false(st.has_blocker);

    ok(c, shmb_alloc(c, "p", 1000, 0, &p));
    stats(c, &st);
    assert_string_equal(st.segment, d->name);
    assert_int_equal(st.size, 1 << 20);
    assert_int_equal(st.data_size, (1 << 20) - 4096 - 16384); /* 512 catalog slots */
    assert_int_equal(st.used + st.free, st.data_size);
    assert_int_equal(st.used, (64 + 128) + (64 + 1024));
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.clients, 2);
    assert_int_equal(st.max_object_size, 512 * 1024);
    assert_int_equal(st.pid, d->pid);
    assert_string_equal(st.version, SHMB_VERSION);
    assert_string_equal(st.shm_dir, "/dev/shm");
    assert_true(st.shm_dir_free > 0);
    assert_int_equal(st.allocs, 2);
    assert_int_equal(st.commits, 1);
    assert_int_equal(st.gets, 2);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.enospc, 0);
    shmb_close(c);
    shmb_close(other);
    h_pass(f);
}

/* Errors carry the daemon's code, name and message (-EEXIST, "EEXIST", the
 * sentence); a successful call clears them; bad keys are refused by the
 * library before they reach the wire; shmb_info describes the segment. */
static void test_error_reporting(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0);
    const shmb_info_t *info = shmb_info(c);
    char key[300];
    const void *r;
    size_t len;
    void *p;

    assert_non_null(info);
    assert_string_equal(info->segment, d->name);
    assert_int_equal(info->size, 1 << 20);
    assert_int_equal(info->data_offset, 4096);
    assert_int_equal(info->data_size, (1 << 20) - 4096 - 16384);
    assert_int_equal(info->max_object_size, 512 * 1024);
    assert_int_equal(info->alignment, 64);

    assert_int_equal(shmb_errcode(c), 0);
    assert_string_equal(shmb_errname(c), "OK");
    ok(c, h_put_pattern(c, "k", 10, 1, 0));
    assert_int_equal(h_put_pattern(c, "k", 10, 1, 0), -EEXIST);
    assert_int_equal(shmb_errcode(c), -EEXIST);
    assert_string_equal(shmb_errname(c), "EEXIST");
    assert_string_equal(shmb_errmsg(c),
                        "Key 'k' already exists in the storage. Choose another key, or "
                        "delete it first.");
    assert_int_equal(shmb_contains(c, "k"), 1);
    assert_int_equal(shmb_errcode(c), 0);
    assert_string_equal(shmb_errname(c), "OK");
    assert_string_equal(shmb_errmsg(c), "");

    fails(c, shmb_alloc(c, "big", 512 * 1024 + 1, 0, &p), -E2BIG,
          "Object size (524289 bytes) exceeds max object size (524288 bytes)");
    assert_string_equal(shmb_errname(c), "E2BIG");
    fails(c, shmb_get(c, "nope", &r, &len), -ENOENT, "No object 'nope'");
    assert_null(r);
    assert_int_equal(len, 0);
    fails(c, shmb_release(c, "k"), -ENOENT, "holds no pin");
    fails(c, shmb_commit(c, "k"), -ENOENT, "already committed");
    fails(c, shmb_abort(c, "nope"), -ENOENT, NULL);
    fails(c, h_put_pattern(c, "", 1, 0, 0), -EINVAL, "Key of 0 bytes");
    memset(key, 'k', 256);
    key[256] = '\0';
    fails(c, h_put_pattern(c, key, 1, 0, 0), -EINVAL, "Key of 256 bytes");
    key[255] = '\0';
    ok(c, h_put_pattern(c, key, 1, 0, 0));
    assert_string_equal(shmb_strerror(-ENOSPC), "ENOSPC");
    assert_string_equal(shmb_strerror(-ECONNRESET), "ECONNRESET");
    shmb_close(c);
    h_pass(f);
}

/* No daemon at the path: -ENOENT (no file) or -ECONNREFUSED (a socket file
 * nobody listens on), with a message naming the path; an unconnected handle
 * refuses calls with -ENOTCONN. */
static void test_connect_without_daemon(void **state)
{
    struct h_fix *f = *state;
    struct sockaddr_un sun;
    char path[sizeof(sun.sun_path)];
    shmb_stats_t st;
    shmb_t *c = shmb_new();
    int fd;

    assert_non_null(c);
    h_path(f, "missing.sock", path, sizeof(path));
    fails(c, shmb_connect(c, path, "test"), -ENOENT, path);
    assert_true(h_contains(shmb_errmsg(c), "Is shmbrokerd running?"));
    assert_null(shmb_info(c));

    h_path(f, "stale.sock", path, sizeof(path));
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    close(fd);
    fails(c, shmb_connect(c, path, "test"), -ECONNREFUSED, path);
    fails(c, shmb_stats(c, &st), -ENOTCONN, NULL);
    shmb_close(c);
    h_pass(f);
}

/* After the daemon is stopped with SIGTERM, a call on an open handle fails
 * with -ECONNRESET (and says the connection was lost), while bytes already
 * pinned stay readable until shmb_close. */
static void test_daemon_gone(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    shmb_t *c = h_lib_connect(d, "test", 0);
    shmb_stats_t st;
    const void *r;
    size_t len;

    ok(c, h_put_pattern(c, "k", 4000, 9, 0));
    ok(c, shmb_get(c, "k", &r, &len));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    fails(c, shmb_stats(c, &st), -ECONNRESET, "Connection to shmbrokerd lost");
    assert_string_equal(shmb_errname(c), "ECONNRESET");
    assert_int_equal(h_check(r, len, 9), 4000);
    assert_true(shmb_contains(c, "k") < 0);
    shmb_close(c);
    h_pass(f);
}

/* ---- vLLM's test_shm_storage.py, through the library ----------------------
 * vLLM's setUp: a 100 KiB ring, max_object_size 10 KiB, n_readers 2. Here:
 * --size 104K (a 4 KiB header page and exactly 100 KiB of data),
 * --max-object-size 10K, and every put awaits VLLM_READERS reads. vLLM's
 * MemoryError is our -ENOSPC, its ValueError -EEXIST / -E2BIG / -ENOENT. */

#define VLLM_READERS 2
#define VLLM_ITEMS 1000

static const char *const vllm_flags[] = {"--max-object-size", "10K", NULL};

/* vLLM's value for item i: "data_i" * 100. The caller frees. */
static char *vllm_value(int i, size_t *len)
{
    char unit[32];
    size_t n = (size_t)snprintf(unit, sizeof(unit), "data_%d", i), k;
    char *v = malloc(n * 100 + 1);

    assert_non_null(v);
    for (k = 0; k < 100; k++)
        memcpy(v + k * n, unit, n);
    v[n * 100] = '\0';
    *len = n * 100;
    return v;
}

/* Put item_i until the first failure (or VLLM_ITEMS): the next i. The
 * failure must be -ENOSPC. */
static int vllm_fill(shmb_t *c, int from)
{
    int i;

    for (i = from; i < VLLM_ITEMS; i++) {
        char key[32];
        size_t len;
        char *v = vllm_value(i, &len);
        int rc;

        snprintf(key, sizeof(key), "item_%d", i);
        rc = shmb_put(c, key, v, len, VLLM_READERS);
        free(v);
        if (rc < 0) {
            fails(c, rc, -ENOSPC, "No space for 'item_");
            break;
        }
    }
    return i;
}

/* Read item_i once (get, compare, release): true when the value matches. */
static bool vllm_read(shmb_t *c, int i)
{
    char key[32];
    const void *p;
    size_t len, want;
    char *v = vllm_value(i, &want);
    bool same;

    snprintf(key, sizeof(key), "item_%d", i);
    ok(c, shmb_get(c, key, &p, &len));
    same = len == want && memcmp(p, v, len) == 0;
    free(v);
    ok(c, shmb_release(c, key));
    return same;
}

/* test_minimal_put_get_cycle: a value put under a key is in the index and
 * comes back equal. */
static void test_vllm_minimal_put_get_cycle(void **state)
{
    static const char value[] = "{\"field1\": 10, \"field2\": 20}";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    const void *p;
    size_t len;

    ok(c, shmb_put(c, "test_key", value, sizeof(value), VLLM_READERS));
    assert_int_equal(shmb_contains(c, "test_key"), 1);
    ok(c, shmb_get(c, "test_key", &p, &len));
    assert_int_equal(len, sizeof(value));
    assert_memory_equal(p, value, sizeof(value));
    ok(c, shmb_release(c, "test_key"));
    shmb_close(c);
    h_pass(f);
}

/* test_put_same_key_twice: the second put of a key fails with "already
 * exists in the storage" and leaves the first value. */
static void test_vllm_put_same_key_twice(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    const void *p;
    size_t len;

    ok(c, shmb_put(c, "duplicate_key", "first value", 11, VLLM_READERS));
    ok(c, shmb_get(c, "duplicate_key", &p, &len));
    assert_memory_equal(p, "first value", 11);
    ok(c, shmb_release(c, "duplicate_key"));
    fails(c, shmb_put(c, "duplicate_key", "second value", 12, VLLM_READERS), -EEXIST,
          "already exists in the storage");
    ok(c, shmb_get(c, "duplicate_key", &p, &len));
    assert_int_equal(len, 11);
    assert_memory_equal(p, "first value", 11);
    ok(c, shmb_release(c, "duplicate_key"));
    shmb_close(c);
    h_pass(f);
}

/* test_large_object_rejection: max_object_size + 100 bytes is refused with
 * "exceeds max object size". */
static void test_vllm_large_object_rejection(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    size_t size = shmb_info(c)->max_object_size + 100;
    char *large = malloc(size);

    assert_non_null(large);
    assert_int_equal(shmb_info(c)->max_object_size, 10 * 1024);
    memset(large, 'x', size);
    fails(c, shmb_put(c, "large_key", large, size, VLLM_READERS), -E2BIG,
          "exceeds max object size");
    assert_int_equal(shmb_contains(c, "large_key"), 0);
    free(large);
    shmb_close(c);
    h_pass(f);
}

/* test_buffer_overflow_and_cleanup: puts fill the ring until ENOSPC; every
 * stored item reads back equal; objects awaiting two reads still block after
 * one; once read twice they are all evicted by new puts, which fill the ring
 * again. */
static void test_vllm_buffer_overflow_and_cleanup(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    int stored, more, i, r, accessible = 0;
    shmb_stats_t st;
    void *p;

    /* The ring filled as vLLM's is, object after object: the room left when
     * it is full is what decides the refusals below. */
    shmb_set_arena(c, 0);
    stored = vllm_fill(c, 0);
    assert_true(stored > 10 && stored < VLLM_ITEMS);
    print_message("buffer filled after %d items\n", stored);
    for (i = 0; i < stored; i++)
        accessible += vllm_read(c, i);
    assert_int_equal(accessible, stored);
    /* One read of two: still awaited, still blocking. */
    fails(c, shmb_alloc(c, "more", 700, VLLM_READERS, &p), -ENOSPC,
          "the oldest object 'item_0' blocks reclaim (pins=0, awaited reads=1)");
    for (i = 0; i < stored; i++)
        for (r = 1; r < VLLM_READERS; r++)
            accessible += vllm_read(c, i);
    assert_int_equal(accessible, stored * VLLM_READERS);

    /* The new puts evict every old item (all read, all older than the new
     * ones) before they fill the ring again. */
    more = vllm_fill(c, stored);
    assert_true(more - stored > 10);
    stats(c, &st);
    assert_int_equal(st.evictions, stored);
    assert_int_equal(st.objects, more - stored);
    for (i = 0; i < stored; i++) {
        char key[32];

        snprintf(key, sizeof(key), "item_%d", i);
        assert_int_equal(shmb_contains(c, key), 0);
    }
    for (i = stored; i < more; i++)
        for (r = 0; r < VLLM_READERS; r++)
            assert_true(vllm_read(c, i));
    shmb_close(c);
    h_pass(f);
}

/* test_blocking_unread_object: with every item read except the oldest, a new
 * put fails naming it; once it is read, new puts succeed again (at least 10
 * more items). */
static void test_vllm_blocking_unread_object(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    int stored, more, i, r, accessible = 0;
    size_t len;
    char *v;

    stored = vllm_fill(c, 0);
    assert_true(stored > 10 && stored < VLLM_ITEMS);
    for (i = 1; i < stored; i++) {
        bool same = true;

        for (r = 0; r < VLLM_READERS; r++)
            same = vllm_read(c, i) && same;
        accessible += same;
    }
    assert_int_equal(accessible, stored - 1);

    v = vllm_value(stored, &len);
    fails(c, shmb_put(c, "item_blocked", v, len, VLLM_READERS), -ENOSPC,
          "the oldest object 'item_0' blocks reclaim (pins=0, awaited reads=2)");
    free(v);
    for (r = 0; r < VLLM_READERS; r++)
        assert_true(vllm_read(c, 0));
    more = vllm_fill(c, stored);
    assert_true(more >= accessible + 10);
    shmb_close(c);
    h_pass(f);
}

/* test_invalid_get_operations and test_clear_storage: a get of a key never
 * stored fails with ENOENT; once every object is deleted the ring is empty
 * and the next put starts again at the beginning of the data area. */
static void test_vllm_invalid_get_and_clear(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "104K", vllm_flags);
    shmb_t *c = h_lib_connect(d, "vllm", 0);
    shmb_stats_t st;
    json_t *reply, *first;
    const void *p;
    size_t len;
    char key[32];
    int i;

    /* As vLLM's ring: used is 0 once all is deleted, and the next put starts
     * at the beginning (no arena held). */
    shmb_set_arena(c, 0);
    fails(c, shmb_get(c, "99999", &p, &len), -ENOENT, NULL);
    ok(c, shmb_put(c, "test", "value", 5, VLLM_READERS));
    fails(c, shmb_get(c, "test-100", &p, &len), -ENOENT, NULL);
    for (i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        ok(c, shmb_put(c, key, "value", 5, VLLM_READERS));
    }
    ok(c, shmb_delete(c, "test"));
    for (i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "item_%d", i);
        ok(c, shmb_delete(c, key));
    }
    stats(c, &st);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.used, 0);
    ok(c, shmb_put(c, "new_item", "new_value", 9, VLLM_READERS));
    reply = list_objects(c);
    first = json_array_get(json_object_get(reply, "objects"), 0);
    assert_string_equal(h_str(first, "key"), "new_item");
    /* The first chunk: its 64-byte header at the start of the data area. */
    assert_int_equal(h_int(first, "offset"), shmb_info(c)->data_offset + 64);
    json_decref(reply);
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_writer_and_readers),
        TEST(test_killed_reader),
        TEST(test_killed_writer),
        TEST(test_enospc_until_release),
        TEST(test_delete_while_pinned),
        TEST(test_contains_touch_stats),
        TEST(test_error_reporting),
        TEST(test_connect_without_daemon),
        TEST(test_daemon_gone),
        TEST(test_vllm_minimal_put_get_cycle),
        TEST(test_vllm_put_same_key_twice),
        TEST(test_vllm_large_object_rejection),
        TEST(test_vllm_buffer_overflow_and_cleanup),
        TEST(test_vllm_blocking_unread_object),
        TEST(test_vllm_invalid_get_and_clear),
    };

    return cmocka_run_group_tests_name("test_clients", tests, NULL, NULL);
}
