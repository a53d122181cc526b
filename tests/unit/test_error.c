// SPDX-License-Identifier: Apache-2.0
/*
 * Error messages (proto/error.c): every message is valid UTF-8, whatever
 * bytes it quotes and wherever it is cut, because it travels as a JSON
 * string; and the protocol's code names map both ways.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "../../proto/error.h"

/* True when jansson accepts s as a string value (it checks UTF-8). */
static int is_json_string(const char *s)
{
    json_t *v = json_string(s);
    int ok = v != NULL;

    json_decref(v);
    return ok;
}

/* Proves that quoted bytes that are not UTF-8 (a lone lead byte, a stray
 * continuation byte, an overlong form, a surrogate) become '?', and that
 * well-formed characters of every length are kept. */
static void test_message_made_valid_utf8(void **state)
{
    struct shmb_error err;

    (void)state;
    shmb_error_set(&err, -EPROTO, "near '%s' and '%s' and '%s' and '%s'", "\"\\u00\xde",
                   "\x97x", "\xc0\xaf", "\xed\xa0\x80");
    assert_int_equal(err.code, -EPROTO);
    assert_true(is_json_string(err.message));
    /* "?\?" keeps C's trigraphs out of the way. */
    assert_string_equal(err.message, "near '\"\\u00?' and '?x' and '?\?' and '?\?\?'");
    shmb_error_set(&err, -EINVAL, "key '%s'", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_string_equal(err.message, "key '\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80'");
}

/* Proves that a message cut at the buffer's end in the middle of a
 * character is still valid UTF-8. */
static void test_truncated_message_stays_valid(void **state)
{
    char key[SHMB_ERROR_MSG_MAX * 2];
    struct shmb_error err;
    size_t i;

    (void)state;
    for (i = 0; i + 3 < sizeof(key); i += 3)
        memcpy(key + i, "\xe2\x82\xac", 3); /* the euro sign, 3 bytes */
    key[i] = '\0';
    for (i = 0; i < 3; i++) {
        shmb_error_set(&err, -ENOSPC, "%.*s%s", (int)i, "ab", key);
        assert_int_equal(strlen(err.message), SHMB_ERROR_MSG_MAX - 1);
        assert_true(is_json_string(err.message));
    }
}

/* Proves that the protocol's code names and negative errnos map both ways,
 * and that unknown ones fall back to EIO. */
static void test_code_names(void **state)
{
    static const int codes[] = {EPROTO, EINVAL, ENOSYS, EEXIST, ENOENT, E2BIG, ENOSPC,
                                EPERM, EMSGSIZE, ETIMEDOUT, EDQUOT, EMFILE};
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        assert_int_equal(shmb_error_from_name(shmb_error_name(-codes[i])), -codes[i]);
    assert_string_equal(shmb_error_name(-ENOSPC), "ENOSPC");
    assert_string_equal(shmb_error_name(-EXDEV), "EIO");
    assert_int_equal(shmb_error_from_name("ENOPE"), -EIO);
    assert_int_equal(shmb_error_from_name(NULL), -EIO);
}

/* Proves that the names for people are honest: 0 is "OK", the protocol's
 * codes keep their names, a code outside the table gets its own errno name
 * (not the "EIO" of a real I/O error, which the wire names keep), and a
 * number no one names gets "E" and the number. */
static void test_any_names(void **state)
{
    (void)state;
    assert_string_equal(shmb_error_any_name(0), "OK");
    assert_string_equal(shmb_error_any_name(-ENOSPC), "ENOSPC");
    assert_string_equal(shmb_error_any_name(ENOSPC), "ENOSPC");
    assert_string_equal(shmb_error_any_name(-EIO), "EIO");
    assert_string_equal(shmb_error_any_name(-EACCES), "EACCES");
    assert_string_equal(shmb_error_any_name(-EXDEV), "EXDEV");
    assert_string_equal(shmb_error_any_name(-ECHILD), "ECHILD");
    assert_string_equal(shmb_error_any_name(-4000), "E4000");
    /* The wire's names are unchanged: the protocol's table, else EIO. */
    assert_string_equal(shmb_error_name(-EACCES), "EIO");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_made_valid_utf8),
        cmocka_unit_test(test_truncated_message_stays_valid),
        cmocka_unit_test(test_code_names),
        cmocka_unit_test(test_any_names),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
