// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of how the library matches replies to requests: every
 * request carries an "id" and every reply must carry it back, so that a reply
 * the library did not expect (a noreply request the daemon answered, a line
 * slipped into its socket) resets the connection instead of being handed to
 * the next call; and keys are checked as UTF-8 before anything is sent, with
 * the same code and words in every call.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

#define BAD_KEY "bin\xff\xfekey"

/* ---- helpers --------------------------------------------------------------- */

/* The seed of an object's pattern: its bytes encode its key. */
static uint32_t key_seed(const char *key)
{
    uint32_t h = 2166136261u;

    while (*key != '\0')
        h = (h ^ (unsigned char)*key++) * 16777619u;
    return h;
}

/* Open descriptors of this process, as a bitmap of the first 1024. */
static void open_fds(unsigned char *set)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    memset(set, 0, 1024);
    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);

        if (e->d_name[0] != '.' && fd >= 0 && fd < 1024 && fd != dirfd(d))
            set[fd] = 1;
    }
    closedir(d);
}

/* A handle connected to d and the descriptor of its socket (the one socket
 * shmb_connect opened), so that a test can slip bytes into the connection. */
static shmb_t *connect_with_fd(const struct h_daemon *d, const char *name, int *sock)
{
    unsigned char before[1024], after[1024];
    shmb_t *c;
    int fd;

    open_fds(before);
    c = h_lib_connect(d, name, 0);
    open_fds(after);
    *sock = -1;
    for (fd = 0; fd < 1024; fd++) {
        char path[64], target[64];
        ssize_t n;

        if (!after[fd] || before[fd])
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, target, sizeof(target) - 1);
        if (n > 0 && strncmp(target, "socket:", 7) == 0) {
            assert_int_equal(*sock, -1);
            *sock = fd;
        }
    }
    assert_true(*sock >= 0);
    return c;
}

/* Stats seen from another handle: the objects pinned. */
static bool nothing_pinned(void *arg)
{
    shmb_stats_t st;

    return shmb_stats(arg, &st) == 0 && st.pinned == 0;
}

/* A fault that must reset the connection: rc and the message. */
static void expect_reset(shmb_t *c, int rc, const char *what)
{
    if (rc != -ECONNRESET || shmb_errcode(c) != -ECONNRESET ||
        strstr(shmb_errmsg(c), "out of step") == NULL ||
        strstr(shmb_errmsg(c), "shmb_reconnect") == NULL)
        h_fail("%s: expected ECONNRESET \"out of step\", got %d (%s: %s)", what, rc,
               shmb_errname(c), shmb_errmsg(c));
}

/* ---- tests ----------------------------------------------------------------- */

/* The reproduction: a release_nowait of a key that is not UTF-8, then
 * a get and an alloc on the same handle. The bad key is refused before it is
 * sent; the get answers with the committed object's own bytes; the alloc
 * never points at them; the committed object stays as it was. */
static void test_desync_reproduction(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *c = h_lib_connect(d, "c", 0);
    const unsigned char *committed, *in_c = NULL;
    const void *p;
    size_t len;
    void *dst = NULL;
    int rc, rc_release, rc_get;

    ok(w, h_put_pattern(w, "desync-committed", 16, 7, 0));
    ok(w, shmb_get(w, "desync-committed", &p, &len));
    committed = p;

    /* The sequence first, the verdicts after, so that the harm shows. */
    rc_release = shmb_release_nowait(c, BAD_KEY);
    rc_get = shmb_get(c, "desync-committed", &p, &len);
    if (rc_get == 0) {
        assert_int_equal(len, 16);
        assert_int_equal(h_check(p, len, 7), len);
        in_c = p; /* the same bytes, in c's own mapping */
        ok(c, shmb_release(c, "desync-committed"));
    }
    rc = shmb_alloc(c, "desync-new", 16, 0, &dst);
    if (rc == 0 && in_c != NULL && (unsigned char *)dst < in_c + 16 &&
        (unsigned char *)dst + 16 > in_c)
        h_fail("alloc of desync-new returned desync-committed's bytes");
    if (rc == 0) {
        memset(dst, 0xAA, 16);
        ok(c, shmb_commit(c, "desync-new"));
    }
    if (h_check(committed, 16, 7) != 16)
        h_fail("desync-committed was overwritten through c's alloc of desync-new");
    assert_int_equal(rc_release, -EINVAL);
    ok(c, rc_get);
    ok(c, rc);
    assert_int_equal(shmb_contains(c, "desync-new"), 1);

    assert_int_equal(h_check(committed, 16, 7), 16);
    ok(w, shmb_release(w, "desync-committed"));
    ok(w, shmb_get(w, "desync-committed", &p, &len));
    assert_int_equal(h_check(p, len, 7), 16);
    ok(w, shmb_release(w, "desync-committed"));
    shmb_close(c);
    shmb_close(w);
    h_pass(f);
}

/* Every call that takes a key refuses one that is not UTF-8 (or empty, or
 * too long) with EINVAL and the same words, before sending anything: the
 * connection is untouched and the daemon counted no failed request. */
static void test_bad_keys_refused_alike(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "c", 0);
    static const char *const bad[] = {BAD_KEY, "", "\xc3", "a\xed\xa0\x80z", NULL};
    char long_key[257];
    const char *keys[3];
    const void *ptrs[3];
    const void *data[3] = {"a", "b", "c"};
    size_t sizes[3] = {1, 1, 1};
    int results[3];
    void *dst;
    const void *p;
    size_t len, i;
    char *raw = NULL;
    shmb_stats_t st;

    memset(long_key, 'k', 256);
    long_key[256] = '\0';
    for (i = 0; i < 5; i++) {
        const char *key = bad[i] != NULL ? bad[i] : long_key;
        char first[1024];

        fails(c, shmb_get(c, key, &p, &len), -EINVAL, "Key");
        snprintf(first, sizeof(first), "%s", shmb_errmsg(c));
        fails(c, shmb_touch(c, key, 1), -EINVAL, first);
        fails(c, shmb_alloc(c, key, 8, 0, &dst), -EINVAL, first);
        fails(c, shmb_put(c, key, "x", 1, 0), -EINVAL, first);
        fails(c, shmb_commit(c, key), -EINVAL, first);
        fails(c, shmb_abort(c, key), -EINVAL, first);
        fails(c, shmb_release(c, key), -EINVAL, first);
        fails(c, shmb_release_nowait(c, key), -EINVAL, first);
        fails(c, shmb_delete(c, key), -EINVAL, first);
        fails(c, shmb_contains(c, key), -EINVAL, first);
        keys[0] = "fine-0";
        keys[1] = key;
        keys[2] = "fine-2";
        fails(c, shmb_put_many(c, 3, keys, data, sizes, 0, results), -EINVAL, "keys[1] of 3");
        assert_non_null(strstr(shmb_errmsg(c), first));
        assert_int_equal(results[0], -EINVAL);
        assert_int_equal(results[2], -EINVAL);
        fails(c, shmb_get_many(c, 3, keys, ptrs, sizes, results), -EINVAL, "keys[1] of 3");
        assert_null(ptrs[0]);
        fails(c, shmb_release_many(c, 3, keys), -EINVAL, "keys[1] of 3");
    }
    /* Nothing was sent: fine-0 was not created, no noreply request failed,
     * and the connection still answers in step. */
    assert_int_equal(shmb_contains(c, "fine-0"), 0);
    ok(c, shmb_request(c, "{\"op\":\"stats\"}", &raw));
    assert_non_null(strstr(raw, "\"noreply_errors\":0"));
    assert_null(strstr(raw, "\"id\""));
    free(raw);
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.objects, 0);
    shmb_close(c);
    h_pass(f);
}

/* A reply that answers another request is never taken: a line slipped into
 * the handle's socket behind its back (a get with an id of its own, whose
 * reply carries an offset, then garbage, whose reply has no id) makes the
 * next call fail with ECONNRESET and reset the connection, so the daemon
 * drops the handle's pins; shmb_reconnect goes on. */
static void test_foreign_reply_resets(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *c;
    static const char *const injected[] = {
        "{\"op\":\"get\",\"key\":\"committed\",\"id\":999999}\n",
        "this is not json\n",
        "{\"op\":\"release\",\"key\":\"nope\",\"noreply\":1}\n",
        "{\"op\":\"release\",\"key\":\"nope\",\"noreply\":true}\nnot json either\n",
    };
    const void *p;
    size_t len, i;
    void *dst;
    int sock;

    ok(w, h_put_pattern(w, "committed", 64, 3, 0));
    c = connect_with_fd(d, "c", &sock);
    for (i = 0; i < 4; i++) {
        const char *keys[2] = {"committed", "committed"};
        const void *ptrs[2];
        size_t sizes[2];
        const void *const data[1] = {"x"};
        size_t one[1] = {1};
        int rc = 0;

        ok(c, shmb_get(c, "committed", &p, &len)); /* a pin the reset must drop */
        assert_false(nothing_pinned(w));
        ok(c, shmb_release_nowait(c, "committed-not-pinned"));
        assert_int_equal(write(sock, injected[i], strlen(injected[i])),
                         (ssize_t)strlen(injected[i]));
        switch (i) {
        case 0:
            dst = NULL;
            rc = shmb_alloc(c, "new", 64, 0, &dst);
            assert_null(dst);
            break;
        case 1:
            rc = shmb_get_many(c, 2, keys, ptrs, sizes, NULL);
            assert_null(ptrs[0]);
            break;
        case 2:
            rc = shmb_put_many(c, 1, (const char *const[]){"new"}, data, one, 0, NULL);
            break;
        default:
            rc = shmb_touch(c, "committed", 1);
            break;
        }
        expect_reset(c, rc, injected[i]);
        assert_true(h_eventually(nothing_pinned, w, 3000));
        assert_int_equal(shmb_contains(w, "new"), 0);
        /* The handle is unusable until it reconnects, then works. */
        fails(c, shmb_get(c, "committed", &p, &len), -ENOTCONN, NULL);
        ok(c, shmb_reconnect(c));
        shmb_close(c);
        c = connect_with_fd(d, "c", &sock);
    }
    ok(c, shmb_get(c, "committed", &p, &len));
    assert_int_equal(h_check(p, len, 3), 64);
    ok(c, shmb_release(c, "committed"));
    shmb_close(c);
    shmb_close(w);
    h_pass(f);
}

/* shmb_request matches the caller's own "id" when there is one, and hands
 * back the reply without the library's id when there is none; a reply to a
 * request slipped in behind it resets the connection. */
static void test_request_ids(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c;
    char *raw = NULL;
    int sock;

    c = connect_with_fd(d, "c", &sock);
    ok(c, shmb_request(c, "{\"op\":\"contains\",\"key\":\"k\",\"id\":\"mine\"}", &raw));
    assert_string_equal(raw, "{\"ok\":true,\"exists\":false,\"id\":\"mine\"}");
    free(raw);
    ok(c, shmb_request(c, "{\"op\":\"contains\",\"key\":\"k\"}", &raw));
    assert_string_equal(raw, "{\"ok\":true,\"exists\":false}");
    free(raw);
    raw = NULL;
    fails(c, shmb_request(c, "{\"op\":\"release\",\"key\":\"k\",\"noreply\":true}", &raw),
          -EINVAL, "noreply");
    {
        static const char slipped[] = "{\"op\":\"stats\",\"id\":\"mine\"}\n";

        assert_int_equal(write(sock, slipped, strlen(slipped)), (ssize_t)strlen(slipped));
    }
    expect_reset(c, shmb_request(c, "{\"op\":\"stats\",\"id\":\"mine2\"}", &raw), "request");
    assert_null(raw);
    shmb_close(c);
    h_pass(f);
}

/* ---- fuzz-style: random valid and invalid calls on one handle ------------- */

#define FZ_MAX 4096

/* What the test knows about one object it committed. */
struct fz_obj {
    char key[256];
    size_t size;
    const unsigned char *ptr;
    int pins; /* held by the fuzzed handle */
};

struct fz {
    shmb_t *c;
    struct fz_obj objs[FZ_MAX];
    size_t nobjs;
    unsigned next_key;
    uint64_t rng;
};

static uint32_t fz_rand(struct fz *z)
{
    z->rng ^= z->rng << 13;
    z->rng ^= z->rng >> 7;
    z->rng ^= z->rng << 17;
    return (uint32_t)(z->rng >> 16);
}

/* A fresh valid key: ASCII, multi-byte UTF-8, control bytes or long. */
static void fz_key(struct fz *z, char *key)
{
    unsigned n = z->next_key++;
    size_t len;

    switch (fz_rand(z) % 4) {
    case 0:
        snprintf(key, 256, "fz-%u", n);
        break;
    case 1:
        snprintf(key, 256, "fz-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80-%u", n);
        break;
    case 2:
        snprintf(key, 256, "fz\n\"\\\x01\x1b[2J-%u", n);
        break;
    default:
        len = (size_t)snprintf(key, 256, "fz-long-%u-", n);
        memset(key + len, 'L', 255 - len);
        key[255] = '\0';
        break;
    }
}

/* A bad key of some kind. */
static const char *fz_bad_key(struct fz *z)
{
    static char long_key[300];
    static const char *const bad[] = {BAD_KEY, "", "\xc3", "\xed\xa0\x80", "ok\xf5"};
    uint32_t r = fz_rand(z) % 6;

    if (r < 5)
        return bad[r];
    memset(long_key, 'x', 256);
    long_key[256] = '\0';
    return long_key;
}

/* Whether [p, p + size) overlaps a committed object the test knows. */
static const struct fz_obj *fz_overlap(const struct fz *z, const void *p, size_t size)
{
    const unsigned char *a = p;
    size_t i;

    for (i = 0; i < z->nobjs; i++)
        if (a < z->objs[i].ptr + z->objs[i].size && a + size > z->objs[i].ptr)
            return &z->objs[i];
    return NULL;
}

/* alloc, write the key's pattern, commit (or abort, when commit is false). */
static void fz_put(struct fz *z, bool commit)
{
    struct fz_obj *o = &z->objs[z->nobjs];
    const struct fz_obj *hit;
    void *dst = NULL;

    if (z->nobjs == FZ_MAX)
        return;
    fz_key(z, o->key);
    o->size = 1 + fz_rand(z) % 2048;
    ok(z->c, shmb_alloc(z->c, o->key, o->size, 0, &dst));
    if ((hit = fz_overlap(z, dst, o->size)) != NULL)
        h_fail("alloc of %zu bytes overlaps committed object of %zu bytes", o->size,
               hit->size);
    h_fill(dst, o->size, key_seed(o->key));
    if (!commit) {
        ok(z->c, shmb_abort(z->c, o->key));
        return;
    }
    ok(z->c, shmb_commit(z->c, o->key));
    o->ptr = dst;
    o->pins = 0;
    z->nobjs++;
}

/* get a known object and check its bytes (a pin the model remembers). */
static void fz_get(struct fz *z, struct fz_obj *o)
{
    const void *p;
    size_t len;

    ok(z->c, shmb_get(z->c, o->key, &p, &len));
    if (p != o->ptr || len != o->size || h_check(p, len, key_seed(o->key)) != len)
        h_fail("get returned %zu bytes at %p for an object of %zu at %p", len, p, o->size,
               (const void *)o->ptr);
    o->pins++;
}

/* One call with a bad key, chosen among every call that takes keys. */
static void fz_bad_call(struct fz *z)
{
    const char *bad = fz_bad_key(z);
    const char *keys[3] = {"fz-fine", bad, "fz-fine-2"};
    const void *data[3] = {"a", "b", "c"};
    size_t sizes[3] = {1, 1, 1};
    const void *ptrs[3];
    const void *p;
    size_t len;
    void *dst;
    int rc;

    switch (fz_rand(z) % 10) {
    case 0: rc = shmb_get(z->c, bad, &p, &len); break;
    case 1: rc = shmb_alloc(z->c, bad, 10, 0, &dst); break;
    case 2: rc = shmb_touch(z->c, bad, 1); break;
    case 3: rc = shmb_release_nowait(z->c, bad); break;
    case 4: rc = shmb_put_many(z->c, 3, keys, data, sizes, 0, NULL); break;
    case 5: rc = shmb_get_many(z->c, 3, keys, ptrs, sizes, NULL); break;
    case 6: rc = shmb_release_many(z->c, 3, keys); break;
    case 7: rc = shmb_contains(z->c, bad); break;
    case 8: rc = shmb_commit(z->c, bad); break;
    default: rc = shmb_delete(z->c, bad); break;
    }
    fails(z->c, rc, -EINVAL, NULL);
}

/* put_many of up to 20 new keys, checked object by object. */
static void fz_put_many(struct fz *z)
{
    size_t n = 1 + fz_rand(z) % 20, i;
    const char *keys[20];
    const void *data[20];
    size_t sizes[20];
    unsigned char *bufs[20];
    int results[20];
    const void *p;
    size_t len;

    if (z->nobjs + n > FZ_MAX)
        return;
    for (i = 0; i < n; i++) {
        struct fz_obj *o = &z->objs[z->nobjs + i];

        fz_key(z, o->key);
        o->size = 1 + fz_rand(z) % 512;
        bufs[i] = malloc(o->size);
        assert_non_null(bufs[i]);
        h_fill(bufs[i], o->size, key_seed(o->key));
        keys[i] = o->key;
        data[i] = bufs[i];
        sizes[i] = o->size;
    }
    ok(z->c, shmb_put_many(z->c, n, keys, data, sizes, 0, results));
    for (i = 0; i < n; i++) {
        struct fz_obj *o = &z->objs[z->nobjs + i];

        assert_int_equal(results[i], 0);
        free(bufs[i]);
        /* Learn where it is (and check it) through a get. */
        ok(z->c, shmb_get(z->c, o->key, &p, &len));
        assert_int_equal(len, o->size);
        assert_int_equal(h_check(p, len, key_seed(o->key)), len);
        if (fz_overlap(z, p, len) != NULL)
            h_fail("put_many placed an object over another");
        ok(z->c, shmb_release(z->c, o->key));
        o->ptr = p;
        o->pins = 0;
    }
    z->nobjs += n;
}

/* get_many of known and missing keys; each result belongs to its key. */
static void fz_get_many(struct fz *z)
{
    size_t n = 1 + fz_rand(z) % 16, i, npinned = 0;
    const char *keys[16], *pinned[16];
    struct fz_obj *objs[16];
    const void *ptrs[16];
    size_t sizes[16];
    int results[16], rc;

    for (i = 0; i < n; i++) {
        if (z->nobjs > 0 && fz_rand(z) % 4 != 0) {
            objs[i] = &z->objs[fz_rand(z) % z->nobjs];
            keys[i] = objs[i]->key;
        } else {
            objs[i] = NULL;
            keys[i] = "fz-missing";
        }
    }
    rc = shmb_get_many(z->c, n, keys, ptrs, sizes, results);
    for (i = 0; i < n; i++) {
        if (objs[i] == NULL) {
            assert_int_equal(results[i], -ENOENT);
            assert_null(ptrs[i]);
            continue;
        }
        assert_int_equal(results[i], 0);
        if (ptrs[i] != objs[i]->ptr || sizes[i] != objs[i]->size ||
            h_check(ptrs[i], sizes[i], key_seed(keys[i])) != sizes[i])
            h_fail("get_many result %zu is not its key's object", i);
        pinned[npinned++] = keys[i];
    }
    if (rc != 0)
        fails(z->c, rc, -ENOENT, "fz-missing");
    if (npinned > 0)
        ok(z->c, shmb_release_many(z->c, npinned, pinned));
}

/* Random valid and invalid calls (bad keys, noreply releases, batches, raw
 * requests) on one handle; every reply must belong to its call: gets return
 * their own key's bytes, allocs never overlap a committed object, counts and
 * results match the model, and every object is intact at the end. */
static void test_fuzz_interleaved(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "64M", NULL);
    struct fz *z = calloc(1, sizeof(*z));
    const char *seed_env = getenv("SHMB_TEST_SEED");
    uint64_t seed = seed_env != NULL ? strtoull(seed_env, NULL, 0) : h_now_ms();
    shmb_t *check;
    shmb_stats_t st;
    size_t step, i;

    assert_non_null(z);
    printf("test_fuzz_interleaved: SHMB_TEST_SEED=%llu\n", (unsigned long long)seed);
    z->rng = seed * 2654435761u + 1;
    z->c = h_lib_connect(d, "fuzzed", 0);
    for (step = 0; step < 3000; step++) {
        struct fz_obj *o = z->nobjs > 0 ? &z->objs[fz_rand(z) % z->nobjs] : NULL;
        uint32_t r = fz_rand(z) % 14;
        const void *p;
        size_t len;
        char req[600], *raw = NULL;

        if (o == NULL && r >= 2)
            r = 0;
        switch (r) {
        case 0:
            fz_put(z, true);
            break;
        case 1:
            fz_put(z, false);
            break;
        case 2:
            fz_get(z, o);
            break;
        case 3:
            if (o->pins > 0) {
                ok(z->c, fz_rand(z) % 2 ? shmb_release(z->c, o->key)
                                         : shmb_release_nowait(z->c, o->key));
                o->pins--;
            }
            break;
        case 4:
            fails(z->c, shmb_get(z->c, "fz-missing", &p, &len), -ENOENT, "fz-missing");
            break;
        case 5:
        case 6:
            fz_bad_call(z);
            break;
        case 7:
            assert_int_equal(shmb_contains(z->c, o->key), 1);
            assert_int_equal(shmb_contains(z->c, "fz-missing"), 0);
            break;
        case 8:
            fz_put_many(z);
            break;
        case 9:
            fz_get_many(z);
            break;
        case 10:
            /* A release of nothing: the daemon fails it silently. */
            ok(z->c, shmb_release_nowait(z->c, "fz-never-pinned"));
            break;
        case 11:
            ok(z->c, shmb_touch(z->c, o->key, 0));
            break;
        case 12:
            snprintf(req, sizeof(req), "{\"op\":\"contains\",\"key\":\"fz-missing\",\"id\":%u}",
                     (unsigned)step);
            ok(z->c, shmb_request(z->c, req, &raw));
            snprintf(req, sizeof(req), "{\"ok\":true,\"exists\":false,\"id\":%u}",
                     (unsigned)step);
            assert_string_equal(raw, req);
            free(raw);
            break;
        default: {
            size_t pinned = 0;

            for (i = 0; i < z->nobjs; i++)
                pinned += z->objs[i].pins > 0;
            ok(z->c, shmb_stats(z->c, &st));
            assert_int_equal(st.objects, z->nobjs);
            assert_int_equal(st.pinned, pinned);
            assert_int_equal(st.pending, 0);
            break;
        }
        }
    }
    /* Every pin released, every object intact, seen from another handle. */
    for (i = 0; i < z->nobjs; i++)
        while (z->objs[i].pins-- > 0)
            ok(z->c, shmb_release(z->c, z->objs[i].key));
    check = h_lib_connect(d, "check", 0);
    ok(check, shmb_stats(check, &st));
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.objects, z->nobjs);
    assert_int_equal(st.pinned, 0);
    for (i = 0; i < z->nobjs; i++) {
        const void *p;
        size_t len;

        ok(check, shmb_get(check, z->objs[i].key, &p, &len));
        assert_int_equal(len, z->objs[i].size);
        assert_int_equal(h_check(p, len, key_seed(z->objs[i].key)), len);
        ok(check, shmb_release(check, z->objs[i].key));
    }
    shmb_close(check);
    shmb_close(z->c);
    free(z);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_desync_reproduction),
        TEST(test_bad_keys_refused_alike),
        TEST(test_foreign_reply_resets),
        TEST(test_request_ids),
        TEST(test_fuzz_interleaved),
    };

    return cmocka_run_group_tests_name("test_ids", tests, NULL, NULL);
}
