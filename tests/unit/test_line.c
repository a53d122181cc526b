// SPDX-License-Identifier: Apache-2.0
/*
 * The hot path's JSON lines (proto/line.c): what the builder writes is JSON
 * that jansson reads back to the same values, and the recogniser accepts
 * exactly the plain success replies and hands everything else to jansson.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "../../proto/alloc.h"
#include "../../proto/line.h"

/* Proves that strings are quoted and escaped (quotes, backslashes, control
 * bytes) so that jansson decodes the exact bytes, UTF-8 included, and that
 * numbers are written in full. */
static void test_builder_round_trips(void **state)
{
    static const char key[] = "a\"b\\c\n\x01\x1f d\xc3\xa9";
    struct line l = {0};
    json_t *v;
    json_error_t err;

    (void)state;
    assert_int_equal(line_lit(&l, "{\"k\":"), 0);
    assert_int_equal(line_str(&l, key, sizeof(key) - 1), 0);
    assert_int_equal(line_lit(&l, ",\"n\":"), 0);
    assert_int_equal(line_u64(&l, UINT64_C(9223372036854775807)), 0);
    assert_int_equal(line_lit(&l, ",\"z\":"), 0);
    assert_int_equal(line_u64(&l, 0), 0);
    assert_int_equal(line_lit(&l, "}"), 0);
    v = json_loadb(l.buf, l.len, JSON_REJECT_DUPLICATES, &err);
    assert_non_null(v);
    assert_int_equal(json_string_length(json_object_get(v, "k")), sizeof(key) - 1);
    assert_memory_equal(json_string_value(json_object_get(v, "k")), key, sizeof(key) - 1);
    assert_true(json_integer_value(json_object_get(v, "n")) == INT64_C(9223372036854775807));
    assert_int_equal(json_integer_value(json_object_get(v, "z")), 0);
    json_decref(v);
    shmb_free(l.buf);
}

/* Proves that the recogniser reads offset, size and exists from success
 * replies in any order, skips other plain fields, and stops at the object's
 * end. */
static void test_scan_success(void **state)
{
    static const char a[] = "{\"ok\":true,\"offset\":4160,\"size\":64}";
    static const char b[] = "{\"ok\":true,\"id\":\"x\",\"size\":1,\"n\":null,\"offset\":8192}tail";
    static const char c[] = "{\"ok\":true,\"exists\":false}";
    static const char d[] = "{\"ok\":true}";
    struct line_reply r;
    const char *p;

    (void)state;
    p = a;
    assert_int_equal(line_scan_reply(&p, a + strlen(a), &r), 0);
    assert_true(r.has_offset && r.has_size && !r.has_exists);
    assert_int_equal(r.offset, 4160);
    assert_int_equal(r.size, 64);
    assert_ptr_equal(p, a + strlen(a));
    p = b;
    assert_int_equal(line_scan_reply(&p, b + strlen(b), &r), 0);
    assert_int_equal(r.offset, 8192);
    assert_int_equal(r.size, 1);
    assert_string_equal(p, "tail");
    p = c;
    assert_int_equal(line_scan_reply(&p, c + strlen(c), &r), 0);
    assert_true(r.has_exists && !r.exists);
    p = d;
    assert_int_equal(line_scan_reply(&p, d + strlen(d), &r), 0);
    assert_false(r.has_offset || r.has_size || r.has_exists);
}

/* Proves that whatever is not a plain success reply is refused without
 * consuming anything, so that jansson decodes it: errors, escapes,
 * negative, fractional or oversized numbers, nesting, truncation. */
static void test_scan_refuses(void **state)
{
    static const char *const bad[] = {
        "{\"ok\":false,\"error\":\"ENOENT\",\"message\":\"No object\"}",
        "{\"ok\":true,\"offset\":-1,\"size\":1}",
        "{\"ok\":true,\"offset\":1.5}",
        "{\"ok\":true,\"offset\":99999999999999999999}",
        "{\"ok\":true,\"id\":\"a\\\"b\"}",
        "{\"ok\":true,\"id\":[1]}",
        "{\"ok\":true,\"offset\":4160",
        "{ \"ok\":true}",
        "",
    };
    struct line_reply r;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *p = bad[i];

        assert_int_equal(line_scan_reply(&p, bad[i] + strlen(bad[i]), &r), -1);
        assert_ptr_equal(p, bad[i]);
    }
}

/* Proves that a batch reply is recognised only with exactly the expected
 * number of success replies and nothing after it. */
static void test_scan_batch(void **state)
{
    static const char ok[] = "{\"ok\":true,\"replies\":[{\"ok\":true,\"offset\":4160,\"size\":"
                             "8},{\"ok\":true}]}";
    static const char failed[] = "{\"ok\":true,\"replies\":[{\"ok\":true},{\"ok\":false,"
                                 "\"error\":\"EEXIST\",\"message\":\"m\"}]}";
    static const char with_id[] = "{\"ok\":true,\"replies\":[{\"ok\":true}],\"id\":77}";
    static const char bad_id[] = "{\"ok\":true,\"replies\":[{\"ok\":true}],\"id\":\"x\"}";
    struct line_reply r[2], whole;

    (void)state;
    assert_int_equal(line_scan_batch(ok, ok + strlen(ok), r, 2, &whole), 0);
    assert_int_equal(r[0].offset, 4160);
    assert_int_equal(r[0].size, 8);
    assert_false(r[1].has_offset);
    assert_false(whole.has_id);
    assert_int_equal(line_scan_batch(ok, ok + strlen(ok), r, 1, &whole), -1);
    assert_int_equal(line_scan_batch(ok, ok + strlen(ok) - 1, r, 2, &whole), -1);
    assert_int_equal(line_scan_batch(failed, failed + strlen(failed), r, 2, &whole), -1);
    assert_int_equal(line_scan_batch(with_id, with_id + strlen(with_id), r, 1, &whole), 0);
    assert_true(whole.has_id);
    assert_int_equal(whole.id, 77);
    assert_int_equal(line_scan_batch(bad_id, bad_id + strlen(bad_id), r, 1, &whole), -1);
}

/* Proves that the recogniser reports a reply's integer "id" wherever it
 * stands, reports none for an id of another kind, and refuses a second
 * "id" (jansson refuses duplicates; a reply must answer one request). */
static void test_scan_id(void **state)
{
    static const char a[] = "{\"ok\":true,\"offset\":4160,\"size\":64,\"id\":12}";
    static const char b[] = "{\"ok\":true,\"id\":4611686018427387904}";
    static const char c[] = "{\"ok\":true,\"id\":\"12\"}";
    static const char d[] = "{\"ok\":true}";
    static const char *const dup[] = {
        "{\"ok\":true,\"id\":1,\"id\":2}",
        "{\"ok\":true,\"id\":\"x\",\"id\":2}",
        "{\"ok\":true,\"id\":null,\"offset\":1,\"id\":2}",
    };
    struct line_reply r;
    const char *p;
    size_t i;

    (void)state;
    p = a;
    assert_int_equal(line_scan_reply(&p, a + strlen(a), &r), 0);
    assert_true(r.has_id && r.has_offset);
    assert_int_equal(r.id, 12);
    p = b;
    assert_int_equal(line_scan_reply(&p, b + strlen(b), &r), 0);
    assert_true(r.has_id);
    assert_true(r.id == UINT64_C(4611686018427387904));
    p = c;
    assert_int_equal(line_scan_reply(&p, c + strlen(c), &r), 0);
    assert_false(r.has_id);
    p = d;
    assert_int_equal(line_scan_reply(&p, d + strlen(d), &r), 0);
    assert_false(r.has_id);
    for (i = 0; i < sizeof(dup) / sizeof(dup[0]); i++) {
        p = dup[i];
        assert_int_equal(line_scan_reply(&p, dup[i] + strlen(dup[i]), &r), -1);
        assert_ptr_equal(p, dup[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_round_trips),
        cmocka_unit_test(test_scan_success),
        cmocka_unit_test(test_scan_refuses),
        cmocka_unit_test(test_scan_batch),
        cmocka_unit_test(test_scan_id),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
