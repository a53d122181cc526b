// SPDX-License-Identifier: Apache-2.0
/*
 * The key index: a chained hash table of nodes embedded in the caller's
 * objects, with a per-process random seed.
 */
#include "index.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../proto/alloc.h"

/* Start small: most brokers hold thousands of objects, some a million. */
#define INDEX_START_BUCKETS 1024

/* A random seed; falls back to time and pid when getrandom is unavailable. */
static uint64_t index_random_seed(void)
{
    uint64_t seed = 0;
    struct timespec ts;

    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
        return seed;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid();
}

int index_init(struct index *ix)
{
    memset(ix, 0, sizeof(*ix));
    ix->buckets = shmb_calloc(INDEX_START_BUCKETS, sizeof(*ix->buckets));
    if (ix->buckets == NULL)
        return -ENOMEM;
    ix->nbuckets = INDEX_START_BUCKETS;
    ix->seed = index_random_seed();
    return 0;
}

void index_fini(struct index *ix)
{
    shmb_free(ix->buckets);
    ix->buckets = NULL;
    ix->nbuckets = ix->count = 0;
}

/* FNV-1a over the key, started from the seed, then a 64-bit finaliser
 * (splitmix64) so that the low bits used for buckets depend on every byte. */
uint64_t index_hash(const struct index *ix, const char *key, size_t key_len)
{
    uint64_t h = 0xcbf29ce484222325ULL ^ ix->seed;
    size_t i;

    for (i = 0; i < key_len; i++) {
        h ^= (unsigned char)key[i];
        h *= 0x100000001b3ULL;
    }
    h ^= key_len;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

struct index_node *index_find(const struct index *ix, const char *key, size_t key_len)
{
    uint64_t h = index_hash(ix, key, key_len);
    struct index_node *n;

    for (n = ix->buckets[h & (ix->nbuckets - 1)]; n != NULL; n = n->next)
        if (n->hash == h && n->key_len == key_len && memcmp(n->key, key, key_len) == 0)
            return n;
    return NULL;
}

/* Double the bucket array; on allocation failure keep the old one. */
static void index_grow(struct index *ix)
{
    size_t nb = ix->nbuckets * 2, i;
    struct index_node **buckets;

    if (nb > SIZE_MAX / sizeof(*buckets))
        return;
    buckets = shmb_calloc(nb, sizeof(*buckets));
    if (buckets == NULL)
        return;
    for (i = 0; i < ix->nbuckets; i++) {
        struct index_node *n = ix->buckets[i], *next;

        for (; n != NULL; n = next) {
            next = n->next;
            n->next = buckets[n->hash & (nb - 1)];
            buckets[n->hash & (nb - 1)] = n;
        }
    }
    shmb_free(ix->buckets);
    ix->buckets = buckets;
    ix->nbuckets = nb;
}

void index_insert(struct index *ix, struct index_node *node)
{
    struct index_node **bucket;

    if (ix->count >= ix->nbuckets)
        index_grow(ix);
    node->hash = index_hash(ix, node->key, node->key_len);
    bucket = &ix->buckets[node->hash & (ix->nbuckets - 1)];
    node->next = *bucket;
    *bucket = node;
    ix->count++;
}

void index_remove(struct index *ix, struct index_node *node)
{
    struct index_node **link = &ix->buckets[node->hash & (ix->nbuckets - 1)];

    while (*link != NULL && *link != node)
        link = &(*link)->next;
    if (*link == node) {
        *link = node->next;
        node->next = NULL;
        ix->count--;
    }
}
