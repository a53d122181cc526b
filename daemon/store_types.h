// SPDX-License-Identifier: Apache-2.0
/*
 * The store's types that its callers and its own rooms both use: its
 * settings, what it reports, the states of an object. store.h has the calls;
 * this header is apart so that the store's rooms below store.c (keys.c,
 * reads.c, reclaim.c) can have the types without store.c's calls.
 */
#ifndef SHMB_STORE_TYPES_H
#define SHMB_STORE_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "../proto/layout.h"

struct store;
struct store_holder;

/* Readers one object may wait for; larger values are a client bug. */
#define STORE_MAX_READERS 1000000u
/* The largest default max object size: beyond it, a bigger segment holds
 * more objects rather than bigger ones. */
#define STORE_DEFAULT_MAX_OBJECT (128ULL << 20)

struct store_config {
    uint64_t max_object_size; /* payload bytes; 0 = store_default_max_object
                                 (data_size, data_size) */
    uint64_t read_lease_ms;   /* awaited reads stop blocking reclaim this long
                                 after commit; 0 = never */
    /* Told once per object when its read lease runs out with reads still
     * awaited (the daemon logs it); may be NULL. */
    void (*lease_expired)(const char *key, size_t key_len, uint32_t reads_left,
                          void *arg);
    void *lease_arg;
    /* How messages name the setting that sizes this store: "--size" when
     * NULL; a pool's own words otherwise. Must outlive the store. */
    const char *size_setting;
    /* The segment's catalog (daemon/catalog.h), borrowed: committed objects
     * are listed there and get their generations from it. NULL: nothing is
     * listed and the store counts generations itself. Must outlive the
     * store. */
    struct catalog *catalog;
    /* store_adopt: generations handed out before, which the adopted objects
     * must not reuse (the old header page's gen_next); 0 when unknown. */
    uint32_t gen_floor;
};

/* What store_adopt found in an existing segment. */
struct store_adopt_report {
    uint64_t restored, restored_bytes; /* committed objects brought back */
    uint64_t dropped_pending;          /* allocations their writers never committed */
    uint64_t dropped_free;             /* deleted or freed chunks */
    uint64_t dropped_invalid;          /* committed chunks with a bad key (NUL inside,
                                          not UTF-8) or a duplicate one */
    uint64_t arena_dropped_bytes;      /* arena bytes after a bad chunk in them */
    bool corrupt;                      /* the walk stopped early; message says where */
    char message[SHMB_ERROR_MSG_MAX];
};

/* Where an object's payload lives, in bytes from the start of the segment. */
struct store_extent {
    uint64_t offset;
    uint64_t size;
};

enum store_state {
    STORE_PENDING = 1,   /* allocated by a holder, not yet committed */
    STORE_COMMITTED = 2, /* visible to every holder */
    STORE_DELETED = 3,   /* key gone; bytes stay until the last pin goes */
};

/* One object as list and stats report it. key is not NUL-terminated. */
struct store_entry {
    const char *key;
    size_t key_len;
    uint64_t offset, size;
    uint32_t pins;
    uint32_t awaited_reads;
    enum store_state state;
    uint64_t age_ms;
    uint64_t chunk_offset; /* its chunk header, in bytes from the segment's start */
    uint32_t gen;          /* its generation while committed, else 0 */
};

/* Chunks a client published in its arena that a fold refused: how many, the
 * first one's key, code and message (taken with store_holder_refused). */
struct store_refused {
    uint64_t count;
    int code;
    size_t key_len;
    char key[SHMB_KEY_MAX];
    char message[SHMB_ERROR_MSG_MAX];
};

struct store_stats {
    uint64_t data_size, used, free;
    uint64_t objects;        /* committed objects reachable by key */
    uint64_t pending;        /* allocations not yet committed */
    uint64_t pinned;         /* objects (deleted ones included) with pins */
    uint64_t deleted_pinned; /* deleted objects still pinned */
    uint64_t max_object_size;
    /* Counters since the store was created. */
    uint64_t allocs, commits, gets, evictions, enospc;
    uint64_t expired_allocs, lease_expiries;
    uint64_t fast_reads; /* awaited reads that came through the catalog path */
    uint64_t arenas;      /* arenas held by clients */
    uint64_t arena_bytes; /* their bytes not yet committed into */
    /* The oldest object, when it stops reclaim (pinned, awaited or pending). */
    bool has_blocker;
    char blocker_key[SHMB_KEY_MAX + 1];
    uint32_t blocker_pins, blocker_readers;
    enum store_state blocker_state;
};

/* What store_list's fn is called with; non-zero stops the list. */
typedef int (*store_list_fn)(const struct store_entry *entry, void *arg);

#endif
