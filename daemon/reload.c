// SPDX-License-Identifier: Apache-2.0
/*
 * The pool reload: SIGHUP's new settings applied to the pools (added,
 * resized, removed) without a restart, and --reload, which asks a running
 * daemon for one.
 */
#include "reload.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "../proto/error.h"
#include "../proto/text.h"
#include "config.h"
#include "keep.h"
#include "log.h"
#include "plan.h"
#include "pool.h"
#include "queue.h"
#include "segment.h"
#include "server.h"
#include "store.h"

/* Whether the settings name a pool of that name. */
static bool daemon_names_pool(const struct config *cfg, const char *name)
{
    unsigned i;

    for (i = 0; i < cfg->n_pools; i++)
        if (strcmp(cfg->pools[i].name, name) == 0)
            return true;
    return false;
}

/* A pool of the settings SIGHUP read that the daemon does not have yet:
 * checked, its space checked, opened; logged either way. */
static struct pool *daemon_add_pool(struct daemon *d, const struct pool_config *pc)
{
    struct shmb_error err = {0};
    struct pool *p = NULL;
    uint64_t size;
    char h1[32];

    if (pool_check_settings(pc, &size, &err) < 0 ||
        (p = pool_new(pc, size, &err)) == NULL || pool_plan(p, false, &err) < 0 ||
        pool_check_space(&p, 1, &err) < 0 || daemon_open_pool(d, p, &err) < 0)
        goto fail;
    daemon_keep_memfd(d, p);
    log_info("SIGHUP: pool '%s' added: segment %s (%s, %s backing)", pc->name, p->seg.path,
             shmb_format_bytes(p->seg.size, h1, sizeof(h1)), pool_backing_name(pc->backing));
    return p;
fail:
    log_error("SIGHUP: pool '%s' not added: %s", pc->name, err.message);
    pool_free(p);
    return NULL;
}

/* SIGHUP: the pools of the new settings. A new one is added (with the space
 * check); one no longer named goes if it is empty, and stays (logged) if
 * anything is in it or connected to it; one whose size, backing, directory
 * or largest object changed stays as it is (a restart applies that); its
 * group applies to the next hello. The order becomes the settings'. */
void daemon_reload_pools(struct daemon *d, const struct config *next)
{
    struct pool_set old = d->pools, stay = {.n = 0}, gone = {.n = 0};
    struct shmb_error err = {0};
    unsigned i, placed = 0;

    /* First the pools no longer named: the empty ones are to go (they make
     * room for new ones), the others stay, at the end. */
    d->pools.n = 0;
    for (i = 0; i < old.n; i++) {
        struct pool *p = old.pools[i];

        if (daemon_names_pool(next, p->cfg.name))
            d->pools.pools[d->pools.n++] = p;
        else if (queue_count(&d->env.queues, p) > 0) {
            /* A queue is a channel its processes will open again. */
            log_warn("SIGHUP: pool '%s' stays: it has %u queue%s. Delete them "
                     "(queue_delete) and send SIGHUP again to remove it",
                     p->cfg.name, queue_count(&d->env.queues, p),
                     queue_count(&d->env.queues, p) == 1 ? "" : "s");
            stay.pools[stay.n++] = p;
        } else if (pool_check_removable(p, &err) == 0)
            gone.pools[gone.n++] = p;
        else {
            log_warn("SIGHUP: %s", err.message);
            stay.pools[stay.n++] = p;
        }
    }
    old = d->pools; /* the pools still named */
    d->pools.n = 0;
    for (i = 0; i < next->n_pools; i++) {
        const struct pool_config *pc = &next->pools[i];
        struct pool *p = pool_find(&old, pc->name);
        uint64_t size = 0;

        if (p == NULL) {
            if (d->pools.n + (old.n - placed) + stay.n >= CONFIG_MAX_POOLS) {
                log_error("SIGHUP: pool '%s' not added: the daemon would have more than "
                          "%d pools",
                          pc->name, CONFIG_MAX_POOLS);
                continue;
            }
            if ((p = daemon_add_pool(d, pc)) != NULL)
                d->pools.pools[d->pools.n++] = p;
            continue;
        }
        placed++;
        (void)pool_check_settings(pc, &size, &err);
        if (size != p->size || pc->backing != p->cfg.backing ||
            strcmp(pc->dir, p->cfg.dir) != 0 || strcmp(pc->segment, p->cfg.segment) != 0 ||
            pc->max_object_size != p->cfg.max_object_size)
            log_warn("SIGHUP: pool '%s': its size, backing, dir and max-object-size are not "
                     "reloadable (it keeps its objects as it is); restart shmbrokerd to "
                     "change them",
                     pc->name);
        p->cfg.has_group = pc->has_group;
        p->cfg.gid = pc->gid;
        /* The bounds on its queues apply to the next queue_create. */
        p->cfg.max_queues = pc->max_queues;
        p->cfg.max_queue_bytes = pc->max_queue_bytes;
        memcpy(p->cfg.group, pc->group, sizeof(p->cfg.group));
        d->pools.pools[d->pools.n++] = p;
    }
    for (i = 0; i < stay.n; i++)
        d->pools.pools[d->pools.n++] = stay.pools[i];
    /* A daemon always serves at least one pool: when no other is left, the
     * first that was to go stays. */
    for (i = 0; i < gone.n; i++) {
        struct pool *p = gone.pools[i];

        if (d->pools.n == 0) {
            log_warn("SIGHUP: pool '%s' stays: no pool of the new settings could be added, "
                     "and a daemon serves at least one",
                     p->cfg.name);
            d->pools.pools[d->pools.n++] = p;
            continue;
        }
        log_info("SIGHUP: pool '%s' removed (it was empty); segment %s removed", p->cfg.name,
                 p->seg.path);
        daemon_unkeep_memfd(d, p);
        queue_drop_pool(&d->env.queues, p); /* none: a pool with queues stays */
        pool_close(p, false);
        pool_free(p);
    }
    for (i = 0; i < d->pools.n; i++) {
        d->pools.pools[i]->read_lease_ms = next->read_lease_ms;
        store_set_read_lease(d->pools.pools[i]->store, next->read_lease_ms);
    }
}

/* --reload PID: the settings are good (main checked them): ask the running
 * shmbrokerd PID to apply them. Only a process named shmbrokerd is sent the
 * signal, so that a stale pid does not hang up something else, and only
 * one that proves to be the daemon these settings name. */
int daemon_send_reload(const struct config *cfg, pid_t pid)
{
    const struct pool_config *first = &cfg->pools[0];
    struct shmb_error err = {0}, why = {0};
    char path[64], comm[32] = "";
    bool memfd = first->backing == POOL_BACKING_MEMFD;
    int held = 1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
    if ((f = fopen(path, "re")) != NULL) {
        if (fgets(comm, sizeof(comm), f) == NULL)
            comm[0] = '\0';
        fclose(f);
    }
    comm[strcspn(comm, "\n")] = '\0';
    if (f == NULL)
        shmb_error_set(&err, -ESRCH, "--reload %d: no such process; is shmbrokerd running?",
                       (int)pid);
    else if (strcmp(comm, "shmbrokerd") != 0)
        /* Its name is the process's own choice: log_startup_error escapes it. */
        shmb_error_set(&err, -EPERM,
                       "--reload %d: that process is '%s', not shmbrokerd; nothing sent.",
                       (int)pid, comm);
    /* The name is anyone's to choose: the proof is what the daemon alone
     * holds. A file segment's lock; for a memfd, whose name anyone can give
     * to one of theirs (and whose descriptor every client of the pool
     * holds), the socket listening at --socket, which the daemon holds
     * (systemd passes it to the daemon alone), and then the memfd. */
    else if (memfd && (held = server_listener_held_by(cfg->socket_path, pid, &why)) < 0)
        shmb_error_set(&err, held,
                       "--reload %d: cannot tell whether that process is the shmbrokerd "
                       "these settings name: %s Nothing sent.",
                       (int)pid, why.message);
    else if (held == 0)
        shmb_error_set(&err, -EPERM,
                       "--reload %d: that process is not the shmbrokerd these settings "
                       "name: %s (--socket); nothing sent.",
                       (int)pid, why.message);
    else if (!(memfd ? segment_memfd_held_by(first->segment, pid)
                     : segment_locked_by(first->dir, first->segment, pid)))
        shmb_error_set(&err, -EPERM,
                       "--reload %d: that process does not hold %s segment %s%s%s: "
                       "it is not the shmbrokerd these settings name (--name, --shm-dir, "
                       "--pool); nothing sent.",
                       (int)pid, memfd ? "the memfd" : "the lock of", first->dir,
                       memfd ? "" : "/", first->segment);
    else if (kill(pid, SIGHUP) != 0)
        shmb_error_set(&err, -errno, "--reload %d: cannot signal it: %s.", (int)pid,
                       strerror(errno));
    if (err.code != 0) {
        log_startup_error(err.message);
        return 1;
    }
    printf("shmbrokerd: settings OK; shmbrokerd pid %d asked to reload them (its log "
           "says what changed)\n",
           (int)pid);
    return 0;
}
