// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the key index (daemon/index.c): insert, find and remove,
 * growth to 100,000 keys, keys that differ only in length or in embedded
 * bytes, removal from the middle of a chain, and allocation failure during
 * growth. Links only index.o and proto.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc.h"
#include "index.h"

/* A test object with its index node embedded and its key beside it. */
struct item {
    struct index_node node;
    char key[24];
    int value;
};

static void item_set(struct item *it, const char *key, size_t key_len, int value)
{
    memset(it, 0, sizeof(*it));
    assert_true(key_len <= sizeof(it->key));
    memcpy(it->key, key, key_len);
    it->node.key = it->key;
    it->node.key_len = key_len;
    it->value = value;
}

/* The item a find returns, or NULL. */
static struct item *find_item(const struct index *ix, const char *key, size_t key_len)
{
    struct index_node *n = index_find(ix, key, key_len);

    return n != NULL ? (struct item *)(void *)((char *)n - offsetof(struct item, node))
                     : NULL;
}

static size_t chain_length(const struct index *ix, size_t bucket)
{
    const struct index_node *n;
    size_t len = 0;

    for (n = ix->buckets[bucket]; n != NULL; n = n->next)
        len++;
    return len;
}

static bool is_power_of_two(size_t n)
{
    return n != 0 && (n & (n - 1)) == 0;
}

/* Insert makes a key findable (by its bytes, not its pointer) and records its
 * seeded hash in the node; remove makes it unfindable and leaves the others;
 * absent keys are NULL. */
static void test_insert_find_remove(void **state)
{
    struct index ix;
    struct item a, b, c;
    char probe[8];

    (void)state;
    assert_int_equal(index_init(&ix), 0);
    assert_true(is_power_of_two(ix.nbuckets));
    assert_int_equal(ix.count, 0);
    assert_null(index_find(&ix, "alpha", 5));
    item_set(&a, "alpha", 5, 1);
    item_set(&b, "beta", 4, 2);
    item_set(&c, "gamma", 5, 3);
    index_insert(&ix, &a.node);
    index_insert(&ix, &b.node);
    index_insert(&ix, &c.node);
    assert_int_equal(ix.count, 3);
    assert_int_equal(a.node.hash, index_hash(&ix, "alpha", 5));
    memcpy(probe, "alpha", 5);
    assert_ptr_equal(find_item(&ix, probe, 5), &a);
    assert_ptr_equal(find_item(&ix, "beta", 4), &b);
    assert_ptr_equal(find_item(&ix, "gamma", 5), &c);
    assert_null(index_find(&ix, "delta", 5));
    assert_null(index_find(&ix, "alph", 4));

    index_remove(&ix, &b.node);
    assert_int_equal(ix.count, 2);
    assert_null(index_find(&ix, "beta", 4));
    assert_ptr_equal(find_item(&ix, "alpha", 5), &a);
    assert_ptr_equal(find_item(&ix, "gamma", 5), &c);
    index_insert(&ix, &b.node);
    assert_ptr_equal(find_item(&ix, "beta", 4), &b);
    index_remove(&ix, &a.node);
    index_remove(&ix, &b.node);
    index_remove(&ix, &c.node);
    assert_int_equal(ix.count, 0);
    assert_null(index_find(&ix, "gamma", 5));
    index_fini(&ix);
}

/* Keys that differ only in length, or only in bytes after an embedded NUL,
 * are different keys; the empty key is a key too. */
static void test_keys_length_and_embedded_bytes(void **state)
{
    static const struct {
        const char *bytes;
        size_t len;
    } keys[] = {
        {"abc", 3}, {"abc\0", 4}, {"ab", 2},     {"", 0},      {"a\0c", 3},
        {"a\0d", 3}, {"\0", 1},   {"\0\0", 2},   {"abd", 3},   {"a", 1},
        {"abc\0\0", 5}, {"\xff\xfe", 2},
    };
    const size_t n = sizeof(keys) / sizeof(keys[0]);
    struct item items[sizeof(keys) / sizeof(keys[0])];
    struct index ix;
    size_t i;

    (void)state;
    assert_int_equal(index_init(&ix), 0);
    for (i = 0; i < n; i++) {
        item_set(&items[i], keys[i].bytes, keys[i].len, (int)i);
        assert_null(index_find(&ix, keys[i].bytes, keys[i].len));
        index_insert(&ix, &items[i].node);
    }
    for (i = 0; i < n; i++) {
        struct item *it = find_item(&ix, keys[i].bytes, keys[i].len);

        assert_non_null(it);
        assert_int_equal(it->value, (int)i);
    }
    assert_null(index_find(&ix, "abc\0\0\0", 6));
    assert_null(index_find(&ix, "a\0e", 3));
    /* Removing one leaves its look-alikes. */
    index_remove(&ix, &items[0].node);
    assert_null(index_find(&ix, "abc", 3));
    assert_ptr_equal(find_item(&ix, "abc\0", 4), &items[1]);
    assert_ptr_equal(find_item(&ix, "ab", 2), &items[2]);
    index_remove(&ix, &items[4].node);
    assert_null(index_find(&ix, "a\0c", 3));
    assert_ptr_equal(find_item(&ix, "a\0d", 3), &items[5]);
    index_remove(&ix, &items[3].node);
    assert_null(index_find(&ix, "", 0));
    assert_ptr_equal(find_item(&ix, "\0", 1), &items[6]);
    assert_int_equal(ix.count, n - 3);
    index_fini(&ix);
}

/* The hash depends on the seed, the key bytes and the length. */
static void test_hash_is_seeded(void **state)
{
    struct index ix;
    uint64_t h1, h2;
    int same = 0, i;
    char key[16];

    (void)state;
    assert_int_equal(index_init(&ix), 0);
    assert_int_not_equal(index_hash(&ix, "abc", 3), index_hash(&ix, "abd", 3));
    assert_int_not_equal(index_hash(&ix, "abc", 3), index_hash(&ix, "abc\0", 4));
    assert_int_equal(index_hash(&ix, "abc", 3), index_hash(&ix, "abcdef", 3));
    for (i = 0; i < 64; i++) {
        snprintf(key, sizeof(key), "key%d", i);
        ix.seed = 1;
        h1 = index_hash(&ix, key, strlen(key));
        ix.seed = 2;
        h2 = index_hash(&ix, key, strlen(key));
        same += h1 == h2;
    }
    assert_int_equal(same, 0);
    index_fini(&ix);
}

#define MANY 100000

/* 100,000 keys: the table doubles as it fills (a power of two, at most one
 * key per bucket on average), chains stay short, every key is found, and
 * removing half and then all of them leaves exactly the rest findable. */
static void test_many_keys_with_growth(void **state)
{
    struct item *items = calloc(MANY, sizeof(*items));
    struct index ix;
    size_t start, grew = 0, prev, i, longest = 0;
    char key[24];

    (void)state;
    assert_non_null(items);
    assert_int_equal(index_init(&ix), 0);
    start = ix.nbuckets;
    prev = start;
    for (i = 0; i < MANY; i++) {
        int len = snprintf(key, sizeof(key), "obj:%zu", i * 7919);

        item_set(&items[i], key, (size_t)len, (int)i);
        index_insert(&ix, &items[i].node);
        if (ix.nbuckets != prev) {
            assert_int_equal(ix.nbuckets, prev * 2);
            prev = ix.nbuckets;
            grew++;
        }
    }
    assert_int_equal(ix.count, MANY);
    assert_true(grew > 0);
    assert_true(is_power_of_two(ix.nbuckets));
    assert_true(ix.nbuckets >= MANY);
    assert_true(ix.nbuckets <= 4 * (size_t)MANY);
    for (i = 0; i < ix.nbuckets; i++) {
        size_t len = chain_length(&ix, i);

        if (len > longest)
            longest = len;
    }
    assert_true(longest <= 16);
    for (i = 0; i < MANY; i++) {
        int len = snprintf(key, sizeof(key), "obj:%zu", i * 7919);
        struct item *it = find_item(&ix, key, (size_t)len);

        assert_ptr_equal(it, &items[i]);
    }
    assert_null(index_find(&ix, "obj:1", 5));
    for (i = 0; i < MANY; i += 2)
        index_remove(&ix, &items[i].node);
    assert_int_equal(ix.count, MANY / 2);
    for (i = 0; i < MANY; i++) {
        int len = snprintf(key, sizeof(key), "obj:%zu", i * 7919);
        struct item *it = find_item(&ix, key, (size_t)len);

        if (i % 2 == 0)
            assert_null(it);
        else
            assert_ptr_equal(it, &items[i]);
    }
    for (i = 1; i < MANY; i += 2)
        index_remove(&ix, &items[i].node);
    assert_int_equal(ix.count, 0);
    assert_true(ix.nbuckets >= start);
    for (i = 0; i < ix.nbuckets; i++)
        assert_null(ix.buckets[i]);
    index_fini(&ix);
    free(items);
}

/* Removing the middle, then the head, then the tail of one chain (keys
 * chosen to share a bucket) keeps every other key of the chain findable. */
static void test_remove_from_chain(void **state)
{
    enum { CANDIDATES = 20000, WANT = 5 };
    struct item *cand = calloc(CANDIDATES, sizeof(*cand));
    struct index_node *order[WANT];
    struct index_node *n;
    struct index ix;
    size_t *count, bucket = 0, i, k;
    char key[24];

    (void)state;
    assert_non_null(cand);
    assert_int_equal(index_init(&ix), 0);
    count = calloc(ix.nbuckets, sizeof(*count));
    assert_non_null(count);
    /* Find a bucket that WANT candidate keys hash to. */
    for (i = 0; i < CANDIDATES; i++) {
        int len = snprintf(key, sizeof(key), "chain-%zu", i);

        item_set(&cand[i], key, (size_t)len, (int)i);
        bucket = index_hash(&ix, key, (size_t)len) & (ix.nbuckets - 1);
        if (++count[bucket] == WANT)
            break;
    }
    assert_true(i < CANDIDATES);
    for (i = 0, k = 0; k < WANT; i++) {
        if ((index_hash(&ix, cand[i].key, cand[i].node.key_len) & (ix.nbuckets - 1)) ==
            bucket) {
            index_insert(&ix, &cand[i].node);
            k++;
        }
    }
    assert_int_equal(chain_length(&ix, bucket), WANT);
    for (n = ix.buckets[bucket], k = 0; n != NULL; n = n->next)
        order[k++] = n;

    /* Middle. */
    index_remove(&ix, order[2]);
    assert_int_equal(chain_length(&ix, bucket), WANT - 1);
    assert_null(index_find(&ix, order[2]->key, order[2]->key_len));
    for (k = 0; k < WANT; k++)
        if (k != 2)
            assert_ptr_equal(index_find(&ix, order[k]->key, order[k]->key_len), order[k]);
    /* Head. */
    index_remove(&ix, order[0]);
    assert_null(index_find(&ix, order[0]->key, order[0]->key_len));
    assert_ptr_equal(index_find(&ix, order[1]->key, order[1]->key_len), order[1]);
    /* Tail. */
    index_remove(&ix, order[WANT - 1]);
    assert_null(index_find(&ix, order[WANT - 1]->key, order[WANT - 1]->key_len));
    assert_ptr_equal(index_find(&ix, order[1]->key, order[1]->key_len), order[1]);
    assert_ptr_equal(index_find(&ix, order[3]->key, order[3]->key_len), order[3]);
    assert_int_equal(chain_length(&ix, bucket), 2);
    assert_int_equal(ix.count, 2);
    /* Put one back: found again, beside the rest. */
    index_insert(&ix, order[2]);
    assert_ptr_equal(index_find(&ix, order[2]->key, order[2]->key_len), order[2]);
    assert_int_equal(chain_length(&ix, bucket), 3);
    free(count);
    free(cand);
    index_fini(&ix);
}

/* index_init reports -ENOMEM when its allocation fails; when growing fails,
 * insert still works (chains get longer, the table keeps its size) and the
 * table grows at the next insert that can allocate. */
static void test_growth_failure(void **state)
{
    struct item *items;
    struct index ix;
    size_t start, i, total;
    char key[24];

    (void)state;
    shmb_alloc_fail_at(1);
    assert_int_equal(index_init(&ix), -ENOMEM);
    shmb_alloc_fail_at(0);

    assert_int_equal(index_init(&ix), 0);
    start = ix.nbuckets;
    total = start * 3;
    items = calloc(total + 1, sizeof(*items));
    assert_non_null(items);
    for (i = 0; i < total; i++) {
        int len = snprintf(key, sizeof(key), "g%zu", i);

        item_set(&items[i], key, (size_t)len, (int)i);
        shmb_alloc_fail_at(1);
        index_insert(&ix, &items[i].node);
        shmb_alloc_fail_at(0);
    }
    assert_int_equal(ix.nbuckets, start);
    assert_int_equal(ix.count, total);
    for (i = 0; i < total; i++) {
        int len = snprintf(key, sizeof(key), "g%zu", i);

        assert_ptr_equal(find_item(&ix, key, (size_t)len), &items[i]);
    }
    item_set(&items[total], "last", 4, -1);
    index_insert(&ix, &items[total].node);
    assert_true(ix.nbuckets > start);
    for (i = 0; i <= total; i++)
        assert_ptr_equal(index_find(&ix, items[i].key, items[i].node.key_len),
                         &items[i].node);
    index_fini(&ix);
    free(items);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_find_remove),
        cmocka_unit_test(test_keys_length_and_embedded_bytes),
        cmocka_unit_test(test_hash_is_seeded),
        cmocka_unit_test(test_many_keys_with_growth),
        cmocka_unit_test(test_remove_from_chain),
        cmocka_unit_test(test_growth_failure),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
