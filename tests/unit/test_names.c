// SPDX-License-Identifier: Apache-2.0
/*
 * The names the daemon and the library share (proto/names.c): a pool's or a
 * queue's name, and a queue's overflow key "q/<queue>/<seq>" both ways.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/names.h"
#include "../../proto/utf8.h"

#define NAME32 "abcdefghijklmnopqrstuvwxyz012345"

/* Proves a name's rule: 1 to 32 of A-Z a-z 0-9 _ -, and nothing else: not
 * empty, not 33 bytes, no space, '/', '.', NUL inside, nor a byte outside
 * ASCII. */
static void test_name_ok(void **state)
{
    (void)state;
    assert_true(shmb_name_ok("a-b_C9", 6));
    assert_true(shmb_name_ok(NAME32, 32));
    assert_false(shmb_name_ok(NAME32 "6", 33));
    assert_false(shmb_name_ok("", 0));
    assert_false(shmb_name_ok(NULL, 3));
    assert_false(shmb_name_ok("a b", 3));
    assert_false(shmb_name_ok("a/b", 3));
    assert_false(shmb_name_ok("a.b", 3));
    assert_false(shmb_name_ok("ab\0c", 4));
    assert_false(shmb_name_ok("\xc3\xa9t\xc3\xa9", 5));
    assert_false(shmb_name_ok("ab\xff", 3));
    /* The length given is the name: a longer string is judged on len. */
    assert_true(shmb_name_ok("ab/c", 2));
}

/* Proves a queue name's check refuses with -EINVAL and a message that
 * quotes the name, its length and the rule (the words the protocol cases
 * pin), and that a name of bytes that are not UTF-8 is quoted only up to
 * them, so the message stays text. */
static void test_queue_name_check(void **state)
{
    struct shmb_error err = {0};

    (void)state;
    assert_int_equal(shmb_q_name_check("steps", 5, &err), 0);
    assert_int_equal(shmb_q_name_check(NAME32 "6", 33, &err), -EINVAL);
    assert_string_equal(err.message,
                        "Invalid queue name '" NAME32 "6' (33 bytes): a queue's name is 1 "
                        "to 32 characters of A-Z a-z 0-9 _ -, like a pool's.");
    assert_int_equal(shmb_q_name_check(NULL, 7, &err), -EINVAL);
    assert_non_null(strstr(err.message, "name '' (0 bytes)"));
    assert_int_equal(shmb_q_name_check("ab\xff\xfe" "cd", 6, &err), -EINVAL);
    assert_non_null(strstr(err.message, "name 'ab' (6 bytes)"));
    assert_int_equal(shmb_utf8_invalid_at(err.message, strlen(err.message)),
                     strlen(err.message));
    assert_int_equal(shmb_q_name_check("ab\0cd", 5, &err), -EINVAL);
    assert_non_null(strstr(err.message, "name 'ab' (5 bytes)"));
}

/* Proves the overflow key's format, that the longest (a 32-byte name, the
 * largest seq) fits SHMB_QUEUE_KEY_MAX exactly, and that a buffer too
 * small gives 0 rather than a cut key. */
static void test_queue_key(void **state)
{
    char key[SHMB_QUEUE_KEY_MAX];

    (void)state;
    assert_int_equal(shmb_q_key(key, sizeof(key), "steps", 0), 9);
    assert_string_equal(key, "q/steps/0");
    assert_int_equal(shmb_q_key(key, sizeof(key), NAME32, UINT64_MAX),
                     SHMB_QUEUE_KEY_MAX - 1);
    assert_string_equal(key, "q/" NAME32 "/18446744073709551615");
    assert_int_equal(shmb_q_key(key, 9, "steps", 0), 0);
    assert_int_equal(shmb_q_key(key, 10, "steps", 0), 9);
}

/* Proves the seq is read back exactly (UINT64_MAX included) and that
 * anything else after the prefix is refused: nothing, a leading zero, a
 * sign, a letter, 2^64, 21 digits. */
static void test_queue_key_seq(void **state)
{
    char key[SHMB_QUEUE_KEY_MAX];
    uint64_t seq = 1;
    size_t len;

    (void)state;
    len = shmb_q_key(key, sizeof(key), "steps", 123);
    assert_true(shmb_q_key_seq(key, len, 8, &seq));
    assert_int_equal(seq, 123);
    assert_true(shmb_q_key_seq("q/s/0", 5, 4, &seq));
    assert_int_equal(seq, 0);
    assert_true(shmb_q_key_seq("q/s/18446744073709551615", 24, 4, &seq));
    assert_true(seq == UINT64_MAX);
    seq = 7;
    assert_false(shmb_q_key_seq("q/s/", 4, 4, &seq));
    assert_false(shmb_q_key_seq("q/s/01", 6, 4, &seq));
    assert_false(shmb_q_key_seq("q/s/-1", 6, 4, &seq));
    assert_false(shmb_q_key_seq("q/s/1a", 6, 4, &seq));
    assert_false(shmb_q_key_seq("q/s/18446744073709551616", 24, 4, &seq));
    assert_false(shmb_q_key_seq("q/s/100000000000000000000", 25, 4, &seq));
    assert_int_equal(seq, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_ok),
        cmocka_unit_test(test_queue_name_check),
        cmocka_unit_test(test_queue_key),
        cmocka_unit_test(test_queue_key_seq),
    };

    return cmocka_run_group_tests_name("names", tests, NULL, NULL);
}
