// SPDX-License-Identifier: Apache-2.0
/*
 * Pool and queue names, and the overflow key of a queue message (names.h).
 */
#include "names.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "layout_queue.h"
#include "utf8.h"

_Static_assert(SHMB_QUEUE_NAME_LEN_MAX < SHMB_QUEUE_NAME_MAX,
               "a queue's name and its NUL fit the area header's field");
_Static_assert(SHMB_QUEUE_KEY_MAX <= SHMB_QUEUE_SLOT_SIZE_MIN,
               "an overflow key fits the smallest slot");

bool shmb_name_ok(const char *name, size_t len)
{
    size_t i;

    if (name == NULL || len < 1 || len > SHMB_POOL_NAME_MAX)
        return false;
    for (i = 0; i < len; i++) {
        char ch = name[i];

        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

int shmb_q_name_check(const char *name, size_t len, struct shmb_error *err)
{
    if (name == NULL)
        name = "", len = 0;
    if (shmb_name_ok(name, len))
        return 0;
    /* Quoted back up to a NUL or a byte that is not UTF-8 in it, cut on a
     * character boundary: the message stays text whatever the name held. */
    return shmb_error_set(err, -EINVAL,
                          "Invalid queue name '%.*s' (%zu bytes): a queue's name is 1 to %d "
                          "characters of A-Z a-z 0-9 _ -, like a pool's.",
                          (int)shmb_utf8_cut(name, shmb_utf8_invalid_at(name, strnlen(name, len)),
                                             2 * SHMB_QUEUE_NAME_LEN_MAX),
                          name, len, SHMB_QUEUE_NAME_LEN_MAX);
}

size_t shmb_q_key(char *key, size_t cap, const char *queue, uint64_t seq)
{
    int len = snprintf(key, cap, SHMB_QUEUE_KEY_PREFIX "%s/%" PRIu64, queue, seq);

    return len > 0 && (size_t)len < cap ? (size_t)len : 0;
}

bool shmb_q_key_seq(const char *key, size_t len, size_t prefix, uint64_t *seq)
{
    uint64_t v = 0;
    size_t i;

    if (len <= prefix || len - prefix > 20 || (key[prefix] == '0' && len - prefix > 1))
        return false;
    for (i = prefix; i < len; i++) {
        uint64_t d = (uint64_t)(key[i] - '0');

        /* Exact: 18446744073709551615 is a seq like any other. */
        if (key[i] < '0' || key[i] > '9' || v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *seq = v;
    return true;
}
