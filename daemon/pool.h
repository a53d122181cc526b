// SPDX-License-Identifier: Apache-2.0
/*
 * A pool: one segment, its store and who may use it. shmbrokerd owns one or
 * more (--pool), each with its own size, largest object, access group and
 * backing (a file in a tmpfs or a hugetlbfs mount, or a memfd). One filling
 * up never evicts from or blocks another: they share nothing but the
 * connections' caps. Knows nothing about sockets or the protocol.
 */
#ifndef SHMB_POOL_H
#define SHMB_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../proto/error.h"
#include "config.h"
#include "segment.h"
#include "store.h"

struct pool {
    struct pool_config cfg; /* as configured */
    uint64_t size;          /* the segment's bytes: cfg.size in whole (huge) pages */
    struct segment seg;
    struct store *store; /* NULL until pool_open */
    struct catalog *catalog; /* the segment's catalog, NULL until pool_open */
    unsigned clients;    /* connections that said hello to this pool */
    /* What pool_plan decided about a file already there. */
    bool adopt;          /* one left by a daemon that is gone: adopt it */
    bool replace;        /* ... or remove it first (--fresh) */
    int64_t adopt_pid;   /* the owner its header names, for the log */
    uint64_t read_lease_ms; /* for the lease-expiry log line */
    /* A memfd pool's segment that systemd kept in its file-descriptor store
     * across a restart, to adopt; -1 when none. Owned by the pool. */
    int kept_fd;
    /* Other descriptors systemd kept under this pool's name were dropped:
     * its store entry must be made again, with this pool's memfd alone. */
    bool kept_again;
    /* pool_plan: a declared pool whose segment has another size is refused
     * alone (not served; its segment left as it is), the others come back. */
    bool refused;
    /* How messages name the setting that sizes it: "--size", or
     * "size of pool 'NAME' (--pool NAME:SIZE)". */
    char size_setting[CONFIG_POOL_NAME_MAX * 2 + 40];
};

/* The pools of a daemon, in configuration order; pools[0] is the default. */
struct pool_set {
    struct pool *pools[CONFIG_MAX_POOLS];
    unsigned n;
};

/* The name of a backing, as settings and replies spell it. */
const char *pool_backing_name(enum pool_backing backing);

/* The checks of one pool's settings alone: its size in whole pages (whole
 * huge pages on hugetlbfs: rounded up, and said so in the log) into *size,
 * the backing's directory, the segment's name, the largest object. */
int pool_check_settings(const struct pool_config *pc, uint64_t *size, struct shmb_error *err);

/* A new pool for pc (checked by pool_check_settings), nothing opened yet;
 * NULL with -ENOMEM in err. */
struct pool *pool_new(const struct pool_config *pc, uint64_t size, struct shmb_error *err);

/* Free a pool that pool_open did not open, or that pool_close closed. */
void pool_free(struct pool *p);

/* Decide what to do with a segment file already there, changing nothing:
 * adopt one left by a daemon that is gone (or replace it with fresh),
 * refuse anything else (a live daemon's, a foreign file, a size that is
 * not the pool's: for a declared pool, -EINVAL with refused set, and a
 * message saying how to serve it again). A memfd pool adopts its kept_fd when it has one (not
 * with fresh, which closes it). */
int pool_plan(struct pool *p, bool fresh, struct shmb_error *err);

/* Whether the pools pool_plan left to create fit, before any is made: per
 * file system, the sum of the new ones against its free space (a file
 * --fresh replaces counts as free); memfd pools against available memory
 * and the memory cgroup's room. -ENOSPC naming the first pool that does not
 * fit and the numbers. */
int pool_check_space(struct pool *const *pools, unsigned n, struct shmb_error *err);

/* Create the pool's segment (or adopt or replace it, as pool_plan decided),
 * watch it, and set up its store. On failure nothing is left behind but an
 * adopted segment, which keeps its objects for the next start. */
int pool_open(struct pool *p, const struct store_config *scfg,
              void (*on_broken)(const char *message), struct shmb_error *err);

/* Write the heartbeat and the published counters of the pool into its
 * segment's header page (daemon/catalog.h): every SEGMENT_HEARTBEAT_MS, and
 * once more at a clean stop (stopped: the counters' pid is 0). */
void pool_beat(struct pool *p, bool stopped);

/* Stop readers answering from the pool's segment (proto/layout.h,
 * retired): they ask the daemon instead. At a stop, before the connections
 * close; pool_close does it too. */
void pool_retire(struct pool *p);

/* Mark the segment retired, drop the store and close the segment: remove it, or keep it (a file;
 * --keep-segment) for the next start to adopt. A memfd is never kept. */
void pool_close(struct pool *p, bool keep);

/* The pool named name in set; NULL when there is none. */
struct pool *pool_find(const struct pool_set *set, const char *name);

/* "a, b, c": the names of the pools, for messages. */
void pool_names(const struct pool_set *set, char *out, size_t len);

/* May a peer with these credentials use p? Root and the daemon's own user
 * always may; with group=, only members (its gid or one of its groups).
 * -EPERM with a message naming the pool and the group otherwise. */
int pool_check_access(const struct pool *p, uid_t uid, gid_t gid, const gid_t *groups,
                      size_t n_groups, struct shmb_error *err);

/* A pool may go (SIGHUP) when nothing is in it: no object, no pending
 * allocation, no client. -EBUSY saying what holds it otherwise. */
int pool_check_removable(const struct pool *p, struct shmb_error *err);

#endif
