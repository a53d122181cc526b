// SPDX-License-Identifier: Apache-2.0
/*
 * Text across trust boundaries (proto/text.c): UTF-8 validation, cutting on
 * a character boundary, escaping for terminals and logs, and the shared key
 * check.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/text.h"

/* Proves that the first malformed byte is found, whatever kind it is, and
 * that well-formed text of every sequence length is accepted whole. */
static void test_invalid_at(void **state)
{
    (void)state;
    assert_int_equal(shmb_utf8_invalid_at("abc", 3), 3);
    assert_int_equal(shmb_utf8_invalid_at("a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10), 10);
    assert_int_equal(shmb_utf8_invalid_at("bin\xff\xfekey", 8), 3);
    assert_int_equal(shmb_utf8_invalid_at("ab\xc3", 3), 2);          /* cut short */
    assert_int_equal(shmb_utf8_invalid_at("a\xc0\xaf", 3), 1);       /* overlong */
    assert_int_equal(shmb_utf8_invalid_at("xy\xed\xa0\x80", 5), 2);  /* surrogate */
    assert_int_equal(shmb_utf8_invalid_at("\x80", 1), 0);            /* stray continuation */
}

/* Proves that a cut never splits a character: 63 'a' then 'é' cut at 64
 * keeps the 63 'a', and text that fits is kept whole. */
static void test_cut(void **state)
{
    char name[66];

    (void)state;
    memset(name, 'a', 63);
    memcpy(name + 63, "\xc3\xa9", 2);
    assert_int_equal(shmb_utf8_cut(name, 65, 64), 63);
    assert_int_equal(shmb_utf8_cut(name, 65, 65), 65);
    assert_int_equal(shmb_utf8_cut("\xe2\x82\xac\xe2\x82\xac", 6, 5), 3);
    assert_int_equal(shmb_utf8_cut("ab\xff\xff", 4, 3), 3); /* a bad byte is one unit */
    assert_int_equal(shmb_utf8_cut("abc", 3, 10), 3);
}

/* Proves that control bytes (C0, DEL, C1) and malformed bytes are shown as
 * \xNN, bidirectional formatting characters and separators as \uNNNN, a
 * backslash doubles, and printable UTF-8 passes unchanged. */
static void test_escape(void **state)
{
    char out[128];

    (void)state;
    assert_string_equal(shmb_escape("\x1b[2J\x1b]0;owned\a\nfake", 19, out, sizeof(out)),
                        "\\x1b[2J\\x1b]0;owned\\x07\\x0afake");
    assert_string_equal(shmb_escape("caf\xc3\xa9 \\ \x7f", 9, out, sizeof(out)),
                        "caf\xc3\xa9 \\\\ \\x7f");
    assert_string_equal(shmb_escape("\xc2\x9b" "1m\xff", 5, out, sizeof(out)),
                        "\\xc2\\x9b1m\\xff");
    /* Bidi overrides and isolates, marks and separators reorder or break a
     * row: U+202E, U+2066, U+2028, U+200F and U+061C are shown as \uNNNN. */
    assert_string_equal(shmb_escape("a\xe2\x80\xae" "b\xe2\x81\xa6" "c\xe2\x80\xa8"
                                    "d\xe2\x80\x8f\xd8\x9c", 18, out, sizeof(out)),
                        "a\\u202eb\\u2066c\\u2028d\\u200f\\u061c");
    /* Neighbours of those ranges pass (U+2027, U+202F, U+2065, U+206A). */
    assert_string_equal(shmb_escape("\xe2\x80\xa7\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa", 12,
                                    out, sizeof(out)),
                        "\xe2\x80\xa7\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa");
    /* An escape that does not fit whole is left out, and out ends in NUL. */
    assert_string_equal(shmb_escape("ab\x01", 3, out, 5), "ab");
    assert_string_equal(shmb_escape("abc", 3, out, 1), "");
}

/* Proves that every part of shmbroker refuses the same keys with EINVAL and
 * a message naming the figures: empty, too long, NUL inside, not UTF-8. */
static void test_key_check(void **state)
{
    struct shmb_error err;
    char longkey[300];

    (void)state;
    memset(longkey, 'k', sizeof(longkey));
    assert_int_equal(shmb_key_check("k", 1, &err), 0);
    assert_int_equal(shmb_key_check(longkey, 255, &err), 0);
    assert_int_equal(shmb_key_check(longkey, 256, &err), -EINVAL);
    assert_string_equal(err.message, "Key of 256 bytes: keys are 1 to 255 bytes long.");
    assert_int_equal(shmb_key_check("", 0, &err), -EINVAL);
    assert_int_equal(shmb_key_check(NULL, 3, &err), -EINVAL);
    assert_int_equal(shmb_key_check("a\0b", 3, &err), -EINVAL);
    assert_non_null(strstr(err.message, "NUL byte at offset 1"));
    assert_int_equal(shmb_key_check("bin\xff\xfekey", 8, &err), -EINVAL);
    assert_string_equal(err.message, "Key is not valid UTF-8 (byte 0xff at offset 3); keys are "
                                     "UTF-8 text of 1 to 255 bytes.");
}

/* Proves how byte counts read in messages: whole units without a fraction,
 * one decimal otherwise, plain bytes under 1 KiB, TiB the largest unit; and
 * MiB rounded to the nearest. */
static void test_format_bytes(void **state)
{
    char buf[32];

    (void)state;
    assert_string_equal(shmb_format_bytes(0, buf, sizeof(buf)), "0 B");
    assert_string_equal(shmb_format_bytes(1023, buf, sizeof(buf)), "1023 B");
    assert_string_equal(shmb_format_bytes(1024, buf, sizeof(buf)), "1 KiB");
    assert_string_equal(shmb_format_bytes(256ULL << 20, buf, sizeof(buf)), "256 MiB");
    assert_string_equal(shmb_format_bytes(3ULL << 29, buf, sizeof(buf)), "1.5 GiB");
    assert_string_equal(shmb_format_bytes(2048ULL << 40, buf, sizeof(buf)), "2048 TiB");
    assert_int_equal(shmb_mib_rounded((1ULL << 20) + (1ULL << 19) - 1), 1);
    assert_int_equal(shmb_mib_rounded((1ULL << 20) + (1ULL << 19)), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_at),
        cmocka_unit_test(test_cut),
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_key_check),
        cmocka_unit_test(test_format_bytes),
    };

    return cmocka_run_group_tests_name("text", tests, NULL, NULL);
}
