// SPDX-License-Identifier: Apache-2.0
/*
 * The --pool values: one parsed into a pool (its options as a table of
 * handlers), added in order, and resolved against --name, --shm-dir and the
 * default sizes once every flag is read. Knows nothing of getopt.
 */
#include "config_pool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "config_inner.h"
#include "segment.h"
#include "store.h"

/* The default largest object for a segment of size bytes: what one object
 * can really use, since a small size leaves a data area of which the chunk
 * header and the longest key take a good part. */
uint64_t config_default_max_object(uint64_t size, uint64_t max_objects)
{
    uint64_t total = segment_round_size(size);

    return store_default_max_object(
        size, total > SHMB_HEADER_PAGE ? segment_data_size(total, SHMB_HEADER_PAGE, max_objects)
                                       : 0);
}

/* The shape of a --pool value, for the messages that refuse one. */
#define CONFIG_POOL_SHAPE                                                                \
    "NAME:SIZE[,max-object-size=BYTES][,group=GROUP][,backing=shm|memfd|hugetlbfs]"      \
    "[,dir=DIR][,max-queues=N][,max-queue-bytes=BYTES]"
/* How much of a refused --pool value a message quotes: room for the rest. */
#define CONFIG_POOL_QUOTE_MAX 200

/* Refuse the --pool value arg: "--pool ARG: " and what is wrong. */
static int config_pool_error(struct shmb_error *err, const char *arg, const char *fmt,
                             ...) __attribute__((format(printf, 3, 4)));
static int config_pool_error(struct shmb_error *err, const char *arg, const char *fmt,
                             ...)
{
    char what[SHMB_ERROR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return shmb_error_set(err, -EINVAL, "--pool %.*s%s: %s", CONFIG_POOL_QUOTE_MAX, arg,
                          strlen(arg) > CONFIG_POOL_QUOTE_MAX ? "..." : "", what);
}

bool config_pool_name_ok(const char *name)
{
    return shmb_name_ok(name, strlen(name));
}

/* A --pool option's handler: value (trimmed, not empty) into *p; arg is
 * the whole --pool value, for config_pool_error. 0 or -EINVAL. */
typedef int (*config_pool_fn)(struct pool_config *p, const char *arg, const char *value,
                              struct shmb_error *err);

/* max-object-size=BYTES. */
static int config_pool_max_object(struct pool_config *p, const char *arg, const char *value,
                                  struct shmb_error *err)
{
    if (config_parse_size(value, &p->max_object_size) < 0)
        return config_pool_error(err, arg,
                                 "invalid max-object-size '%.32s': expected bytes "
                                 "with an optional K, M or G (KiB, MiB, GiB) "
                                 "suffix, for example max-object-size=64M.",
                                 value);
    return 0;
}

/* group=GROUP: a name or a gid of this host. */
static int config_pool_group(struct pool_config *p, const char *arg, const char *value,
                             struct shmb_error *err)
{
    id_t gid;

    if (strlen(value) > CONFIG_GROUP_NAME_MAX || config_parse_id(value, false, &gid) < 0)
        return config_pool_error(err, arg,
                                 "no group '%.64s' on this host; give the name of "
                                 "an existing group (getent group lists them) or "
                                 "a gid.",
                                 value);
    p->has_group = true;
    p->gid = (gid_t)gid;
    memcpy(p->group, value, strlen(value) + 1);
    return 0;
}

/* backing=shm|memfd|hugetlbfs. */
static int config_pool_backing(struct pool_config *p, const char *arg, const char *value,
                               struct shmb_error *err)
{
    if (strcmp(value, "shm") == 0)
        p->backing = POOL_BACKING_SHM;
    else if (strcmp(value, "memfd") == 0)
        p->backing = POOL_BACKING_MEMFD;
    else if (strcmp(value, "hugetlbfs") == 0)
        p->backing = POOL_BACKING_HUGETLBFS;
    else
        return config_pool_error(err, arg,
                                 "unknown backing '%.32s': expected shm (a file "
                                 "in --shm-dir or dir=), memfd (memory with no "
                                 "file, not limited by /dev/shm) or hugetlbfs (a "
                                 "file on the hugetlbfs mount dir=).",
                                 value);
    return 0;
}

/* dir=DIR. */
static int config_pool_dir(struct pool_config *p, const char *arg, const char *value,
                           struct shmb_error *err)
{
    if (strlen(value) >= sizeof(p->dir))
        return config_pool_error(err, arg, "dir= is longer than %zu bytes.",
                                 sizeof(p->dir) - 1);
    memcpy(p->dir, value, strlen(value) + 1);
    return 0;
}

/* max-queues=N. */
static int config_pool_max_queues(struct pool_config *p, const char *arg, const char *value,
                                  struct shmb_error *err)
{
    unsigned long long count;
    char *end;

    if (config_leading_number(value, &count, &end) < 0 || *end != '\0' || count == 0 ||
        count > CONFIG_QUEUES_MAX)
        return config_pool_error(err, arg,
                                 "invalid max-queues '%.32s': expected a whole "
                                 "number from 1 to %d (the daemon holds at most "
                                 "%d queues of all pools), for example "
                                 "max-queues=8.",
                                 value, CONFIG_QUEUES_MAX, CONFIG_QUEUES_MAX);
    p->max_queues = count;
    return 0;
}

/* max-queue-bytes=BYTES, above 0. */
static int config_pool_max_queue_bytes(struct pool_config *p, const char *arg,
                                       const char *value, struct shmb_error *err)
{
    if (config_parse_size(value, &p->max_queue_bytes) < 0 || p->max_queue_bytes == 0)
        return config_pool_error(err, arg,
                                 "invalid max-queue-bytes '%.32s': expected bytes above 0 "
                                 "with an optional K, M or G (KiB, MiB, GiB) suffix, for "
                                 "example max-queue-bytes=512M.",
                                 value);
    return 0;
}

/* The options of a --pool value after its name and size: the name, what a
 * message shows in place of a missing value, the handler. */
static const struct config_pool_option {
    const char *key;
    const char *placeholder;
    config_pool_fn parse;
} config_pool_options[] = {
    {"max-object-size", "BYTES", config_pool_max_object},
    {"group", "GROUP", config_pool_group},
    {"backing", "shm|memfd|hugetlbfs", config_pool_backing},
    {"dir", "DIR", config_pool_dir},
    {"max-queues", "N", config_pool_max_queues},
    {"max-queue-bytes", "BYTES", config_pool_max_queue_bytes},
};
#define CONFIG_POOL_OPTIONS (sizeof(config_pool_options) / sizeof(config_pool_options[0]))

/* Parse one --pool value into *p. What depends on other flags (the segment's
 * name, shm's default dir, the default max object size) is left for
 * config_resolve_pools, since --name may come after --pool. */
static int config_parse_pool(const char *arg, struct pool_config *p,
                             struct shmb_error *err)
{
    bool seen[CONFIG_POOL_OPTIONS] = {false};
    char buf[CONFIG_LINE_MAX + 1], *name, *size, *opts;
    size_t len = strlen(arg);
    int rc;

    memset(p, 0, sizeof(*p));
    p->backing = POOL_BACKING_SHM;
    if (len == 0)
        return shmb_error_set(err, -EINVAL,
                              "--pool must not be empty: expected " CONFIG_POOL_SHAPE
                              ", for example --pool cache:4G,max-object-size=256M.");
    if (len > CONFIG_LINE_MAX)
        return config_pool_error(err, arg,
                                 "the value is %zu bytes long; it may have at "
                                 "most %d.",
                                 len, CONFIG_LINE_MAX);
    memcpy(buf, arg, len + 1);
    if ((size = strchr(buf, ':')) == NULL)
        return config_pool_error(err, arg,
                                 "expected " CONFIG_POOL_SHAPE
                                 ", for example --pool cache:4G,max-object-size=256M.");
    *size++ = '\0';
    if ((opts = strchr(size, ',')) != NULL)
        *opts++ = '\0';
    name = config_trim(buf);
    size = config_trim(size);
    if (!config_pool_name_ok(name))
        return config_pool_error(
            err, arg,
            "the pool name '%.64s' must be 1 to %d letters, digits, "
            "'_' or '-' (it becomes part of the segment's file name), "
            "for example --pool cache:4G.",
            name, CONFIG_POOL_NAME_MAX);
    memcpy(p->name, name, strlen(name) + 1);
    if (config_parse_size(size, &p->size) < 0)
        return config_pool_error(
            err, arg,
            "invalid size '%.32s': expected bytes with an optional K, "
            "M or G (KiB, MiB, GiB) suffix after the name, for example "
            "--pool %s:256M.",
            size, p->name);
    while (opts != NULL) {
        char *key = opts, *value = NULL, *eq;
        size_t k;

        if ((opts = strchr(key, ',')) != NULL)
            *opts++ = '\0';
        if ((eq = strchr(key, '=')) != NULL) {
            *eq = '\0';
            value = config_trim(eq + 1);
        }
        key = config_trim(key);
        if (key[0] == '\0' && value == NULL)
            return config_pool_error(
                err, arg,
                "an empty option (two commas in a row, or one at the "
                "end); expected " CONFIG_POOL_SHAPE ".");
        for (k = 0; k < CONFIG_POOL_OPTIONS; k++)
            if (strcmp(key, config_pool_options[k].key) == 0)
                break;
        if (k == CONFIG_POOL_OPTIONS)
            return config_pool_error(err, arg,
                                     "unknown option '%.32s'; a pool takes "
                                     "max-object-size=, group=, backing=, dir=, "
                                     "max-queues= and max-queue-bytes=: "
                                     "expected " CONFIG_POOL_SHAPE ".",
                                     key);
        if (value == NULL || value[0] == '\0')
            return config_pool_error(err, arg, "%s has no value; write %s=%s.", key, key,
                                     config_pool_options[k].placeholder);
        if (seen[k])
            return config_pool_error(err, arg, "%s= is given twice; give it once.", key);
        seen[k] = true;
        if ((rc = config_pool_options[k].parse(p, arg, value, err)) < 0)
            return rc;
    }
    if (p->backing == POOL_BACKING_HUGETLBFS && p->dir[0] == '\0')
        return config_pool_error(err, arg,
                                 "a hugetlbfs pool needs dir=, the hugetlbfs mount (e.g. "
                                 "dir=/dev/hugepages).");
    if (p->backing == POOL_BACKING_MEMFD && p->dir[0] != '\0')
        return config_pool_error(err, arg,
                                 "a memfd pool has no directory (its memory has no file "
                                 "name anywhere); drop dir=, or use backing=shm to put "
                                 "the pool in that directory.");
    return 0;
}

/* Add the pool of one --pool value to cfg: a pool of a name already given
 * replaces that one in its place (so the command line overrides the file and
 * the order stays the file's); origin[i] remembers the value of pools[i] for
 * the errors config_resolve_pools finds later. */
int config_add_pool(struct config *cfg, const char *arg, const char **origin,
                    struct shmb_error *err)
{
    struct pool_config p;
    unsigned i;

    if (config_parse_pool(arg, &p, err) < 0)
        return -EINVAL;
    for (i = 0; i < cfg->n_pools; i++)
        if (strcmp(cfg->pools[i].name, p.name) == 0)
            break;
    if (i == CONFIG_MAX_POOLS)
        return config_pool_error(err, arg,
                                 "more than %d pools; shmbrokerd serves at most %d (a "
                                 "--pool of a name given before replaces that pool and "
                                 "does not count).",
                                 CONFIG_MAX_POOLS, CONFIG_MAX_POOLS);
    cfg->pools[i] = p;
    origin[i] = arg;
    if (i == cfg->n_pools)
        cfg->n_pools++;
    cfg->pools_declared = true;
    return 0;
}

/* A pool's bounds on queues: its own, else the flags', else the defaults:
 * the daemon's CONFIG_QUEUES_MAX shared out evenly (so that pools left at
 * the default can never starve one another of queues), and as many bytes
 * as the pool's own size (what the administrator gave it), at least
 * CONFIG_DEFAULT_QUEUE_BYTES_MIN. */
static void config_resolve_queue_limits(const struct config *cfg, struct pool_config *p)
{
    if (p->max_queues == 0)
        p->max_queues = cfg->max_queues != 0 ? cfg->max_queues
                                             : CONFIG_QUEUES_MAX / cfg->n_pools;
    if (p->max_queue_bytes == 0)
        p->max_queue_bytes = cfg->max_queue_bytes != 0 ? cfg->max_queue_bytes
                             : p->size > CONFIG_DEFAULT_QUEUE_BYTES_MIN
                                 ? p->size
                                 : CONFIG_DEFAULT_QUEUE_BYTES_MIN;
}

/* Once every flag is read: without --pool, the one implicit pool that is
 * today's segment (its max object size is set with cfg's); with pools, each
 * one's segment name, default directory and max object size. On an error,
 * *culprit is the --pool value it is about. */
int config_resolve_pools(struct config *cfg, const char *const *origin,
                         const char **culprit, struct shmb_error *err)
{
    struct pool_config *p = &cfg->pools[0];
    size_t len;
    unsigned i;

    if (!cfg->pools_declared) {
        memset(p, 0, sizeof(*p));
        /* A --name longer than a pool name is cut, on a UTF-8 character's
         * boundary: the pool's name is only a label; the segment keeps it
         * whole. */
        len = strlen(cfg->name);
        if (len > CONFIG_POOL_NAME_MAX) {
            len = CONFIG_POOL_NAME_MAX;
            while (len > 0 && ((unsigned char)cfg->name[len] & 0xC0) == 0x80)
                len--;
        }
        memcpy(p->name, cfg->name, len);
        p->name[len] = '\0';
        p->size = cfg->size;
        p->backing = POOL_BACKING_SHM;
        memcpy(p->dir, cfg->shm_dir, sizeof(p->dir));
        memcpy(p->segment, cfg->name, sizeof(p->segment));
        cfg->n_pools = 1;
        config_resolve_queue_limits(cfg, p);
        return 0;
    }
    for (i = 0; i < cfg->n_pools; i++) {
        p = &cfg->pools[i];
        if (strlen(cfg->name) + 1 + strlen(p->name) > NAME_MAX) {
            *culprit = origin[i];
            return config_pool_error(
                err, origin[i],
                "its segment file, --name '%.64s%s' and '.%s', would "
                "be longer than %d bytes; choose a shorter --name.",
                cfg->name, strlen(cfg->name) > 64 ? "..." : "", p->name, NAME_MAX);
        }
        len = strlen(cfg->name);
        memcpy(p->segment, cfg->name, len);
        p->segment[len] = '.';
        memcpy(p->segment + len + 1, p->name, strlen(p->name) + 1);
        if (p->backing == POOL_BACKING_SHM && p->dir[0] == '\0')
            memcpy(p->dir, cfg->shm_dir, sizeof(p->dir));
        if (p->max_object_size == 0)
            p->max_object_size = cfg->max_object_size != 0
                                     ? cfg->max_object_size
                                     : config_default_max_object(p->size, 0);
        config_resolve_queue_limits(cfg, p);
    }
    return 0;
}
