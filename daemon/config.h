// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerd's settings: defaults, command-line flags and their validation.
 * Knows nothing about the loop, the segment or the store.
 */
#ifndef SHMB_CONFIG_H
#define SHMB_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../proto/error.h"
#include "../proto/names.h"
#include "../proto/protocol.h"
#include "log.h"
#include "policy.h"

#define CONFIG_DEFAULT_SIZE (256ULL << 20)
#define CONFIG_DEFAULT_NAME SHMB_DEFAULT_NAME
#define CONFIG_DEFAULT_SHM_DIR SHMB_DEFAULT_SHM_DIR
#define CONFIG_DEFAULT_SOCKET_MODE 0660
#define CONFIG_DEFAULT_MAX_CLIENTS 1024
#define CONFIG_DEFAULT_MAX_CLIENTS_PER_UID 512
#define CONFIG_DEFAULT_MAX_PINS 65536
#define CONFIG_DEFAULT_MAX_PENDING SHMB_DEFAULT_MAX_PENDING
#define CONFIG_DEFAULT_MAX_QUEUED_OUTPUT (1024 * 1024)
#define CONFIG_DEFAULT_ALLOC_TIMEOUT_MS 60000
/* A client says hello as its first request; a connection silent for this
 * long holds a slot (of --max-clients) for nothing. */
#define CONFIG_DEFAULT_HELLO_TIMEOUT_MS 10000

/* A settings file is a few hundred bytes; one of a megabyte is a mistake
 * (or /dev/zero), and reading it whole must stay cheap on every SIGHUP. */
#define CONFIG_FILE_MAX (1024 * 1024)
/* The longest useful line: a path value and its name. */
#define CONFIG_LINE_MAX (PATH_MAX + 128)

/* Pools (--pool): each its own segment, store, limits and access group. */
#define CONFIG_MAX_POOLS 16
#define CONFIG_POOL_NAME_MAX SHMB_POOL_NAME_MAX /* proto/names.h: shmb_name_ok */
#define CONFIG_GROUP_NAME_MAX 64

/* Queues a daemon holds at once, of all pools: each is a descriptor, a
 * mapping and a memory reservation, and the reports list them all. */
#define CONFIG_QUEUES_MAX 64
/* A pool's queues may take this many bytes at least by default (else as
 * many as the pool's own size): room for vLLM's default MessageQueue (10
 * slots of 10 MiB) twice, and a pool of 4 MiB cannot commit gigabytes. */
#define CONFIG_DEFAULT_QUEUE_BYTES_MIN (256ULL << 20)
/* A queue nobody holds (no writer, no live reader seat) for this long is
 * deleted: long enough for processes that create a queue and then start
 * their members, short enough that an abandoned one does not hold its
 * memory for the daemon's life. */
#define CONFIG_DEFAULT_QUEUE_LEASE_MS (10 * 60 * 1000ULL)

/* Where a pool's bytes live. */
enum pool_backing {
    POOL_BACKING_SHM,       /* a file in --shm-dir or the pool's dir= (tmpfs) */
    POOL_BACKING_MEMFD,     /* memfd_create: no name, nothing left behind */
    POOL_BACKING_HUGETLBFS, /* a file on the hugetlbfs mount dir= */
};

/* One pool as configured: --pool NAME:SIZE[,max-object-size=B][,group=G]
 * [,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N][,max-queue-bytes=B], or the one implicit pool when no
 * --pool is given (named --name, of --size, in --shm-dir: today's segment). */
struct pool_config {
    char name[CONFIG_POOL_NAME_MAX + 1];
    uint64_t size;            /* as given; rounded by the daemon */
    uint64_t max_object_size; /* resolved: the pool's, else --max-object-size, else
                                 store_default_max_object's for its size */
    uint64_t max_objects;     /* the implicit pool: --max-objects (sizes its
                                 catalog); 0: from its size, as declared pools */
    enum pool_backing backing;
    char dir[PATH_MAX];       /* shm, hugetlbfs: the directory; "" for memfd */
    char segment[NAME_MAX + 1]; /* the file's name in dir (memfd: its memfd name) */
    bool has_group;           /* group= given */
    gid_t gid;                /* ... resolved when parsed */
    char group[CONFIG_GROUP_NAME_MAX + 1]; /* ... as written, for messages */
    /* Queues of the pool at once, and their bytes: resolved (the pool's,
     * else --max-queues / --max-queue-bytes, else CONFIG_QUEUES_MAX shared
     * out among the pools, and the larger of the pool's size and
     * CONFIG_DEFAULT_QUEUE_BYTES_MIN). 0: no bound of the pool's own. */
    uint64_t max_queues;
    uint64_t max_queue_bytes;
};

struct config {
    uint64_t size;            /* segment bytes, header page included */
    uint64_t max_object_size; /* not given: store_default_max_object's */
    uint64_t max_objects;     /* --max-objects: sizes the catalog; 0 = from --size */
    char name[NAME_MAX + 1];
    char shm_dir[PATH_MAX];
    char socket_path[108]; /* sun_path */
    mode_t socket_mode;
    enum log_level log_level;
    bool fresh;                     /* discard a segment left by a dead daemon */
    uint64_t alloc_timeout_ms;      /* 0 = pending allocations never expire */
    uint64_t read_lease_ms;         /* 0 = awaited reads hold objects forever */
    struct policy limits;       /* clients, allow lists, queued output */
    uint64_t max_pins, max_pending; /* per connection */
    uint64_t max_queues, max_queue_bytes; /* --max-queues, --max-queue-bytes: 0
                                             when not given */
    uint64_t queue_lease_ms;        /* --queue-lease; 0 = queues nobody holds stay */
    char config_file[PATH_MAX];     /* --config, "" when none */
    char log_file[PATH_MAX];        /* --log-file, "" for stderr */
    pid_t stop_with_pid;            /* --stop-with-pid, 0 when none */
    bool keep_segment;              /* --keep-segment: a clean stop leaves the segment */
    enum config_mode {
        CONFIG_SERVE,          /* run the daemon */
        CONFIG_CHECK,          /* --check-config: parse the settings, say so, exit */
        CONFIG_REMOVE_SEGMENT, /* --remove-segment: remove a segment no daemon holds */
        CONFIG_RELOAD,         /* --reload PID: check, then SIGHUP that shmbrokerd */
        CONFIG_SIZING,         /* --check: will the pools fit here? report, exit */
    } mode;
    pid_t reload_pid; /* --reload */
    /* The pools, in the order given (a later --pool of the same name replaces
     * an earlier one, so flags override the file); pools[0] is the default
     * pool, which a hello without "pool" gets. Always at least one: without
     * --pool, the implicit pool (pools_declared false). */
    struct pool_config pools[CONFIG_MAX_POOLS];
    unsigned n_pools;
    bool pools_declared; /* at least one --pool */
    bool size_set;       /* --size given (unused when pools are declared) */
};

enum config_action { CONFIG_RUN, CONFIG_EXIT_OK, CONFIG_EXIT_USAGE };

/* Fill cfg from defaults, the environment, the --config file and argv (flags
 * override the file). Prints --help and --version itself; on a bad flag or
 * file line, err says which and what is expected. */
enum config_action config_parse(struct config *cfg, int argc, char **argv,
                                struct shmb_error *err);

/* A name a declared pool may have: 1 to CONFIG_POOL_NAME_MAX of
 * [A-Za-z0-9_-], since it is part of a file name and a metric label. */
bool config_pool_name_ok(const char *name);

/* Parse "256M", "1GiB", "4096" into bytes. -EINVAL or -ERANGE. */
int config_parse_size(const char *text, uint64_t *out);

/* Parse "60", "60s", "500ms", "2m" into milliseconds (bare numbers are
 * seconds). -EINVAL or -ERANGE. */
int config_parse_duration(const char *text, uint64_t *out_ms);

#endif
