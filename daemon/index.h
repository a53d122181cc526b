// SPDX-License-Identifier: Apache-2.0
/*
 * The key index: an intrusive, chained hash table from key bytes to nodes
 * embedded in the caller's objects. O(1) expected lookup, insert and remove;
 * grows by doubling at load factor 1 and never shrinks below its start size.
 * The hash is seeded per process so that clients cannot aim keys at one chain.
 * Knows nothing about what the objects are.
 */
#ifndef SHMB_INDEX_H
#define SHMB_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* Embedded in each indexed object; key points at bytes the object owns. */
struct index_node {
    struct index_node *next;
    uint64_t hash;
    const char *key;
    size_t key_len;
};

struct index {
    struct index_node **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;
    uint64_t seed;
};

/* Set up an empty index; -ENOMEM. */
int index_init(struct index *ix);

/* Free the bucket array; the nodes belong to the caller. */
void index_fini(struct index *ix);

/* The node with this key, or NULL. The index keeps no ownership. */
struct index_node *index_find(const struct index *ix, const char *key, size_t key_len);

/* Insert node (node->key and node->key_len set by the caller); the key must
 * not be present. Growth failure is not an error: the chains get longer. */
void index_insert(struct index *ix, struct index_node *node);

/* Remove node, which must be in the index. */
void index_remove(struct index *ix, struct index_node *node);

/* The seeded hash of a key. */
uint64_t index_hash(const struct index *ix, const char *key, size_t key_len);

#endif
