// SPDX-License-Identifier: Apache-2.0
/*
 * The pools of the settings, planned before anything changes (the settings
 * checked, the kept descriptors taken, the space summed), then opened with the
 * start's progress and closed at the stop.
 */
#include "plan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto/error.h"
#include "../proto/starting.h"
#include "../proto/text.h"
#include "config.h"
#include "keep.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "queue.h"
#include "segment.h"

static void daemon_on_lease_expired(const char *key, size_t key_len, uint32_t reads_left,
                                    void *arg);
static void daemon_on_segment_broken(const char *message);

/* Open pool p as planned: create its segment, or adopt or replace the one
 * there. An adopted segment loses the objects of the queues of the daemon
 * that left it ("q/<queue>/<seq>"): queues do not outlive a daemon, and
 * those objects would await reads that never come, holding their bytes
 * against reclaim. The start and SIGHUP both open pools here, so that an
 * adoption is the same whichever adds the pool. */
int daemon_open_pool(struct daemon *d, struct pool *p, struct shmb_error *err)
{
    struct store_config scfg = {
        .max_object_size = p->cfg.max_object_size,
        .read_lease_ms = d->cfg.read_lease_ms,
        .lease_expired = daemon_on_lease_expired,
        .lease_arg = p,
        .size_setting = p->size_setting,
    };
    unsigned gone;
    int rc;

    if ((rc = pool_open(p, &scfg, daemon_on_segment_broken, err)) < 0)
        return rc;
    gone = p->adopt ? queue_drop_orphans(p) : 0;
    if (gone > 0)
        log_info("pool '%s': deleted %u object%s of queues of an earlier run (queues "
                 "do not outlive the daemon; their messages are not read again)",
                 p->cfg.name, gone, gone == 1 ? "" : "s");
    return 0;
}

/* The store tells us, once per object, that a read lease ran out. */
static void daemon_on_lease_expired(const char *key, size_t key_len, uint32_t reads_left,
                                    void *arg)
{
    const struct pool *p = arg;

    if (strcmp(p->cfg.segment, p->cfg.name) != 0)
        log_warn("pool '%s', object '%.*s': read lease of %llu ms ran out with %u reads "
                 "still awaited; it no longer blocks reclaim",
                 p->cfg.name, (int)key_len, key, (unsigned long long)p->read_lease_ms,
                 reads_left);
    else
        log_warn("object '%.*s': read lease of %llu ms ran out with %u reads still awaited; "
                 "it no longer blocks reclaim",
                 (int)key_len, key, (unsigned long long)p->read_lease_ms, reads_left);
}

/* The segment guard found the file broken by a client (segment.h): say so
 * once; every refused allocation repeats it to its client. */
static void daemon_on_segment_broken(const char *message)
{
    log_error("%s", message);
}

/* The checks of the settings alone, before anything is looked at: each
 * pool's size (in sizes[]: whole pages, whole huge pages on hugetlbfs), its
 * directory, its segment's name, its largest object. Also the actions'. */
int daemon_check_settings(const struct config *cfg, uint64_t *sizes,
                          struct shmb_error *err)
{
    uint64_t total = 0;
    unsigned i;
    int rc;

    for (i = 0; i < cfg->n_pools; i++)
        if ((rc = pool_check_settings(&cfg->pools[i], &sizes[i], err)) < 0)
            return rc;
    /* Each fits in a file; together they must fit in the figures that add
     * them up (--check's), which no host comes near anyway. */
    for (i = 0; i < cfg->n_pools; i++) {
        if (sizes[i] > (uint64_t)INT64_MAX - total)
            return shmb_error_set(
                err, -EFBIG,
                "The sizes of the %u pools add up to more than %llu bytes; "
                "no host holds that. Choose smaller sizes.",
                cfg->n_pools, (unsigned long long)INT64_MAX);
        total += sizes[i];
    }
    return 0;
}

/* Free the pools of a start that did not get as far as pool_open. */
void daemon_free_pools(struct daemon *d)
{
    while (d->pools.n > 0)
        pool_free(d->pools.pools[--d->pools.n]);
}

/* Make the pools, decide for each what to do with a segment already there,
 * and check that the new ones fit: every check before any change. */
int daemon_plan_pools(struct daemon *d, struct shmb_error *err)
{
    uint64_t sizes[CONFIG_MAX_POOLS];
    unsigned i, refused = 0;
    int rc;

    if ((rc = daemon_check_settings(&d->cfg, sizes, err)) < 0)
        return rc;
    if (d->cfg.pools_declared && d->cfg.size_set)
        log_warn("--size is not used: every --pool has its own size");
    if (d->cfg.pools_declared && d->cfg.max_objects != 0)
        log_warn("--max-objects is not used: every --pool sizes its catalog from its own "
                 "size (one entry per 2 KiB)");
    for (i = 0; i < d->cfg.n_pools; i++) {
        struct pool *p = pool_new(&d->cfg.pools[i], sizes[i], err);

        if (p == NULL) {
            daemon_free_pools(d);
            return err->code;
        }
        d->pools.pools[d->pools.n++] = p;
        if (p->cfg.backing == POOL_BACKING_MEMFD)
            daemon_take_kept(d, p);
        if ((rc = pool_plan(p, d->cfg.fresh, err)) < 0 && p->refused && i == 0) {
            /* Clients that name no pool would land in another one. */
            char was[SHMB_ERROR_MSG_MAX];

            snprintf(was, sizeof(was), "%s", err->message);
            shmb_error_set(err, rc,
                           "%s It is the default pool (the first), which clients that "
                           "name no pool use: shmbrokerd does not start without it.",
                           was);
            daemon_free_pools(d);
            return rc;
        }
        if (rc < 0 && p->refused) {
            /* A pool resized since its segment was made waits for its size
             * (or its segment's removal); the others come back. */
            log_error("%s", err->message);
            pool_free(d->pools.pools[--d->pools.n]);
            refused++;
            continue;
        }
        if (rc < 0) {
            daemon_free_pools(d);
            return rc;
        }
    }
    if (d->pools.n == 0) /* every pool refused: err says why the last was */
        return err->code;
    if ((rc = pool_check_space(d->pools.pools, d->pools.n, err)) < 0)
        daemon_free_pools(d);
    else if (refused > 0)
        log_warn("%u of %u pools not served (see above); the others are", refused,
                 d->cfg.n_pools);
    return rc;
}

/* Segments in the pools' directories that these settings no longer name:
 * a pool removed from the settings while the daemon was down (its segment
 * kept, or left by a crash), or the segment of --name from before pools
 * were declared. They are left as they are, objects and all, and said so:
 * each holds memory until it is served again or removed. */
static void daemon_note_unconfigured(const struct daemon *d)
{
    const struct config *cfg = &d->cfg;
    size_t len = strlen(cfg->name);
    unsigned i, j;

    for (i = 0; i < cfg->n_pools; i++) {
        const char *dir = cfg->pools[i].dir;
        struct dirent *e;
        DIR *dp;

        if (cfg->pools[i].backing == POOL_BACKING_MEMFD)
            continue;
        for (j = 0; j < i && strcmp(cfg->pools[j].dir, dir) != 0; j++)
            ;
        if (j < i || (dp = opendir(dir)) == NULL)
            continue; /* seen already, or unreadable */
        while ((e = readdir(dp)) != NULL) {
            const char *rest = e->d_name + len;
            int64_t pid;

            if (strncmp(e->d_name, cfg->name, len) != 0 ||
                (*rest != '\0' && (*rest != '.' || !config_pool_name_ok(rest + 1))))
                continue;
            for (j = 0; j < cfg->n_pools; j++)
                if (strcmp(cfg->pools[j].segment, e->d_name) == 0 &&
                    strcmp(cfg->pools[j].dir, dir) == 0)
                    break;
            if (j < cfg->n_pools ||
                segment_probe_existing(dir, e->d_name, &pid) != SEGMENT_ORPHANED)
                continue;
            log_warn("segment %s/%s is not one of the configured pools' (left by shmbrokerd "
                     "pid %lld): it is left as it is, with its objects and its memory. "
                     "Configure its pool again to serve them, or remove it and its lock "
                     "file %s/.%s.lock.",
                     dir, e->d_name, (long long)pid, dir, e->d_name);
        }
        closedir(dp);
    }
}

/* A reservation of the start went on (segment_set_progress): say how far
 * in systemd's STATUS=, in the file clients read when their connect is
 * refused (shmbrokerctl status: "starting: ..."), and, for a gigabyte or
 * more, in the log at each quarter. */
static void daemon_on_progress(uint64_t done, uint64_t total, void *arg)
{
    struct daemon *d = arg;
    char text[SHMB_STARTING_TEXT_MAX], a[32], b[32];
    int quarter = total > 0 ? (int)(done * 4 / total) : 4, rc;

    snprintf(text, sizeof(text), "reserving pool '%s': %s of %s",
             d->progress.pool != NULL ? d->progress.pool : "?",
             shmb_format_bytes(done, a, sizeof(a)), shmb_format_bytes(total, b, sizeof(b)));
    notify_send("STATUS=%s", text);
    if (d->progress.path[0] != '\0' && d->progress.fd < 0 &&
        (d->progress.fd = shmb_starting_open(d->progress.path)) < 0)
        rc = d->progress.fd;
    else
        rc = d->progress.fd >= 0
                 ? shmb_starting_update(d->progress.fd, (long long)getpid(), text)
                 : 0;
    if (rc < 0) {
        log_warn("cannot write %s (clients are told 'connection refused' meanwhile): %s",
                 d->progress.path, strerror(-rc));
        d->progress.path[0] = '\0';
    }
    if (total >= (1ULL << 30) && quarter != d->progress.quarter) {
        d->progress.quarter = quarter;
        if (done == 0)
            log_info("%s (a large pool takes seconds; shmbrokerctl status shows how far)",
                     text);
        else
            log_info("%s", text);
    }
}

/* The start serves, or was refused: no progress file is left to tell
 * clients it is starting. */
void daemon_progress_end(struct daemon *d)
{
    if (d->progress.path[0] != '\0')
        (void)unlink(d->progress.path);
    if (d->progress.fd >= 0)
        close(d->progress.fd); /* after the unlink: no unlocked moment */
    d->progress.fd = -1;
}

/* Where the start's progress goes: beside the socket clients dial (the one
 * systemd passed, by its address, else --socket). One a start killed at it
 * left there goes. */
void daemon_progress_begin(struct daemon *d)
{
    struct sockaddr_un sun;
    socklen_t len = sizeof(sun);
    const char *sock = d->cfg.socket_path;

    memset(&sun, 0, sizeof(sun));
    if (d->activated && d->activated_fd >= 0 &&
        getsockname(d->activated_fd, (struct sockaddr *)&sun, &len) == 0 &&
        sun.sun_family == AF_UNIX && sun.sun_path[0] != '\0' &&
        len <= sizeof(sun) && memchr(sun.sun_path, '\0', sizeof(sun.sun_path)) != NULL)
        sock = sun.sun_path;
    if (shmb_starting_path(sock, d->progress.path, sizeof(d->progress.path)) < 0)
        d->progress.path[0] = '\0';
    daemon_progress_end(d);
}

/* Open the pools planned; on failure close those opened (an adopted
 * segment keeps its objects for the next attempt; a new one goes). */
int daemon_open_pools(struct daemon *d, struct shmb_error *err)
{
    unsigned i;
    int rc = 0;

    segment_set_progress(daemon_on_progress, d);
    for (i = 0; i < d->pools.n; i++) {
        d->progress.pool = d->pools.pools[i]->cfg.name;
        d->progress.quarter = -1;
        if ((rc = daemon_open_pool(d, d->pools.pools[i], err)) < 0)
            break;
    }
    /* Queues' areas are made off the loop's thread later: no callback. */
    segment_set_progress(NULL, NULL);
    d->progress.pool = NULL;
    if (rc == 0) {
        for (i = 0; i < d->pools.n; i++)
            daemon_keep_memfd(d, d->pools.pools[i]);
        daemon_drop_kept(d);
        daemon_note_unconfigured(d);
        return 0;
    }
    while (i > 0) {
        struct pool *p = d->pools.pools[--i];

        pool_close(p, p->adopt);
    }
    daemon_free_pools(d);
    return rc;
}

/* Close every pool (keeping file segments with --keep-segment). */
void daemon_close_pools(struct daemon *d, bool keep)
{
    unsigned i;

    for (i = 0; i < d->pools.n; i++)
        pool_close(d->pools.pools[i], keep);
    daemon_free_pools(d);
}
