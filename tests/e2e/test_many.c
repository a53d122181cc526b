// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the library's _many calls at any n: put_many,
 * get_many and release_many split their work into batch lines of at most
 * 4096 ops and 64 KiB, in order, against a daemon with its default limits,
 * so that no line is refused and no connection (with its pins) is lost.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* How the keys of a round are spelled. */
enum key_kind {
    KEY_SHORT,   /* 31 bytes, the example */
    KEY_LONG,    /* 255 bytes of ASCII */
    KEY_UTF8,    /* 255 bytes, two-byte characters */
    KEY_CONTROL, /* 255 bytes, mostly control bytes: six bytes each on the wire */
};

/* Key i of a round into key (256 bytes). */
static void make_key(enum key_kind kind, const char *round, size_t i, char *key)
{
    int n = snprintf(key, 256, "%s-%zu-", round, i);
    size_t len = (size_t)n, want = kind == KEY_SHORT ? 31 : 255;

    while (len < want) {
        if (kind == KEY_UTF8 && len + 2 <= want) {
            key[len++] = '\xc3';
            key[len++] = '\xa9';
        } else if (kind == KEY_CONTROL) {
            key[len] = (char)(1 + (len + i) % 31);
            len++;
        } else {
            key[len++] = 'k';
        }
    }
    key[len] = '\0';
}

/* put_many, get_many (every byte checked) and release_many of n objects on
 * one connection; stats on the same connection prove nothing was lost. */
static void round_trip(shmb_t *c, size_t n, enum key_kind kind, const char *round)
{
    char (*names)[256] = calloc(n, 256);
    const char **keys = calloc(n, sizeof(*keys));
    const void **data = calloc(n, sizeof(*data)), **ptrs = calloc(n, sizeof(*ptrs));
    size_t *sizes = calloc(n, sizeof(*sizes)), *got = calloc(n, sizeof(*got)), i;
    int *results = calloc(n, sizeof(*results));
    unsigned char *bytes;
    shmb_stats_t before, st;

    assert_true(names && keys && data && ptrs && sizes && got && results);
    for (i = 0; i < n; i++) {
        make_key(kind, round, i, names[i]);
        keys[i] = names[i];
        sizes[i] = 1 + (i * 37) % 200;
        bytes = malloc(sizes[i]);
        assert_non_null(bytes);
        h_fill(bytes, sizes[i], (uint32_t)i + 1);
        data[i] = bytes;
        results[i] = 1;
    }
    ok(c, shmb_stats(c, &before));
    ok(c, shmb_put_many(c, n, keys, data, sizes, 0, results));
    for (i = 0; i < n; i++)
        if (results[i] != 0)
            h_fail("%s: put_many result %zu is %d", round, i, results[i]);
    ok(c, shmb_get_many(c, n, keys, ptrs, got, results));
    for (i = 0; i < n; i++) {
        if (results[i] != 0 || got[i] != sizes[i] ||
            h_check(ptrs[i], got[i], (uint32_t)i + 1) != got[i])
            h_fail("%s: object %zu came back wrong (result %d, %zu bytes)", round, i,
                   results[i], got[i]);
    }
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.objects, before.objects + n);
    assert_int_equal(st.pinned, n);
    assert_int_equal(st.pending, 0);
    ok(c, shmb_release_many(c, n, keys));
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.evictions, 0);
    for (i = 0; i < n; i++)
        free((void *)data[i]);
    free(names);
    free(keys);
    free(data);
    free(ptrs);
    free(sizes);
    free(got);
    free(results);
}

/* n = 1, 4096, 4097 and 20,000 with 255-byte keys, the 1000 and
 * 5000 keys of 31 bytes, and keys that are six bytes per byte on the wire,
 * all on one connection of a daemon with default limits. */
static void test_many_any_n(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "64M", NULL);
    shmb_t *c = h_lib_connect(d, "many", 0);

    round_trip(c, 1, KEY_LONG, "one");
    round_trip(c, 4096, KEY_LONG, "max");
    round_trip(c, 4097, KEY_UTF8, "over");
    round_trip(c, 20000, KEY_LONG, "big");
    round_trip(c, 1000, KEY_SHORT, "s1000");
    round_trip(c, 5000, KEY_SHORT, "s5000");
    round_trip(c, 4097, KEY_CONTROL, "ctl");
    shmb_close(c);
    h_pass(f);
}

/* Failures stay per key across lines: in a put_many of 5000 whose keys 10
 * and 4500 exist already, exactly those two fail with EEXIST (the call
 * reports the first, index 10) and the others are committed; in a get_many
 * of 6000 with missing keys in several lines, each result is its own key's. */
static void test_many_errors_per_key(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "64M", NULL);
    shmb_t *c = h_lib_connect(d, "many", 0);
    size_t n = 6000, i;
    char (*names)[256] = calloc(n, 256);
    const char **keys = calloc(n, sizeof(*keys));
    const void **data = calloc(n, sizeof(*data)), **ptrs = calloc(n, sizeof(*ptrs));
    size_t *sizes = calloc(n, sizeof(*sizes));
    int *results = calloc(n, sizeof(*results)), rc;
    shmb_stats_t st;
    static const char payload[8] = "payload";

    assert_true(names && keys && data && ptrs && sizes && results);
    for (i = 0; i < n; i++) {
        make_key(KEY_LONG, "e", i, names[i]);
        keys[i] = names[i];
        data[i] = payload;
        sizes[i] = sizeof(payload);
    }
    ok(c, shmb_put(c, keys[10], payload, sizeof(payload), 0));
    ok(c, shmb_put(c, keys[4500], payload, sizeof(payload), 0));
    rc = shmb_put_many(c, 5000, keys, data, sizes, 0, results);
    fails(c, rc, -EEXIST, NULL);
    assert_non_null(strstr(shmb_errmsg(c), keys[10]));
    for (i = 0; i < 5000; i++)
        assert_int_equal(results[i], i == 10 || i == 4500 ? -EEXIST : 0);
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.objects, 5000);
    assert_int_equal(st.pending, 0);

    rc = shmb_get_many(c, n, keys, ptrs, sizes, results);
    fails(c, rc, -ENOENT, keys[5000]);
    for (i = 0; i < n; i++) {
        assert_int_equal(results[i], i < 5000 ? 0 : -ENOENT);
        if (i < 5000)
            assert_memory_equal(ptrs[i], payload, sizeof(payload));
        else
            assert_null(ptrs[i]);
    }
    ok(c, shmb_release_many(c, 5000, keys));
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.pinned, 0);
    free(names);
    free(keys);
    free(data);
    free(ptrs);
    free(sizes);
    free(results);
    shmb_close(c);
    h_pass(f);
}

/* put_many of any n works under a lower --max-pending (100) too, and while
 * the handle already holds allocations of its own (90 of the 100): each line
 * commits what the cap let through and the rest goes again. Only when the
 * handle itself holds the whole cap does put_many fail, with EDQUOT naming
 * it. Under --max-pending 2 with one held, every key still goes in, and the
 * handle's error after the success is "OK", not a retried refusal. */
static void test_many_under_max_pending(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d =
        h_daemon_start(f, "64M", (const char *const[]){"--max-pending", "100", NULL});
    shmb_t *c = h_lib_connect(d, "many", 0);
    size_t n = 300, i;
    char (*names)[256] = calloc(n, 256), held[32];
    const char **keys = calloc(n, sizeof(*keys));
    const void **data = calloc(n, sizeof(*data));
    size_t *sizes = calloc(n, sizeof(*sizes));
    int *results = calloc(n, sizeof(*results)), rc;
    shmb_stats_t st;
    void *p;
    static const char payload[8] = "payload";

    assert_true(names && keys && data && sizes && results);
    round_trip(c, 300, KEY_SHORT, "cap");
    for (i = 0; i < 90; i++) {
        snprintf(held, sizeof(held), "held-%zu", i);
        ok(c, shmb_alloc(c, held, 16, 0, &p));
    }
    for (i = 0; i < n; i++) {
        make_key(KEY_SHORT, "p", i, names[i]);
        keys[i] = names[i];
        data[i] = payload;
        sizes[i] = sizeof(payload);
        results[i] = 1;
    }
    ok(c, shmb_put_many(c, n, keys, data, sizes, 0, results));
    for (i = 0; i < n; i++)
        assert_int_equal(results[i], 0);
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.objects, 600);
    assert_int_equal(st.pending, 90);
    for (i = 90; i < 100; i++) {
        snprintf(held, sizeof(held), "held-%zu", i);
        ok(c, shmb_alloc(c, held, 16, 0, &p));
    }
    for (i = 0; i < 5; i++)
        make_key(KEY_SHORT, "q", i, names[i]);
    rc = shmb_put_many(c, 5, keys, data, sizes, 0, results);
    fails(c, rc, -EDQUOT, "max-pending");
    for (i = 0; i < 5; i++)
        assert_int_equal(results[i], -EDQUOT);
    shmb_close(c);

    /* --max-pending 2 with one allocation held: one object a line, and a
     * success leaves no stale error behind; the held allocation commits. */
    d = h_daemon_start(f, "16M", (const char *const[]){"--max-pending", "2", NULL});
    c = h_lib_connect(d, "tight", 0);
    ok(c, shmb_alloc(c, "held", 16, 0, &p));
    for (i = 0; i < n; i++)
        make_key(KEY_SHORT, "t", i, names[i]);
    ok(c, shmb_put_many(c, n, keys, data, sizes, 0, results));
    assert_string_equal(shmb_errname(c), "OK");
    for (i = 0; i < n; i++)
        assert_int_equal(results[i], 0);
    memset(p, 'h', 16);
    ok(c, shmb_commit(c, "held"));
    ok(c, shmb_stats(c, &st));
    assert_int_equal(st.objects, n + 1);
    assert_int_equal(st.pending, 0);
    free(names);
    free(keys);
    free(data);
    free(sizes);
    free(results);
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_many_any_n),
        TEST(test_many_errors_per_key),
        TEST(test_many_under_max_pending),
    };

    return cmocka_run_group_tests_name("test_many", tests, NULL, NULL);
}
