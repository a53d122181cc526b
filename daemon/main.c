// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerd: flags, start-up (socket probe, segment, store, listener),
 * signals and the event loop. Everything slow happens before the loop runs.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "../proto/alloc.h"
#include "../proto/starting.h"
#include "../proto/text.h"
#include "command.h"
#include "config.h"
#include "held.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "segment.h"
#include "server.h"
#include "sizing.h"
#include "store.h"

struct daemon {
    struct config cfg;
    struct pool_set pools;
    struct command_env env;
    struct server server;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t expiry; /* drops allocations older than --alloc-timeout */
    uv_prepare_t expiry_arm; /* before the loop sleeps: arms expiry, or stops it */
    uint64_t expiry_due;     /* monotonic ms expiry is armed for; 0 = stopped */
    uv_signal_t sighup;
    uv_timer_t status;   /* STATUS= for systemd, once a second */
    uv_timer_t watchdog; /* WATCHDOG=1 at half of $WATCHDOG_USEC */
    uv_timer_t heartbeat; /* each pool's heartbeat in its segment, every second */
    uv_poll_t stop_with; /* --stop-with-pid: that process's pidfd, readable once it exits */
    int stop_with_fd;    /* the pidfd; -1 when not watching */
    bool notify;         /* $NOTIFY_SOCKET is set */
    bool activated;      /* systemd passed the listening socket */
    int activated_fd;    /* ... which is ours until the server takes it, else -1 */
    struct server_kept kept; /* memfd pools systemd kept across a restart */
    bool stopping;
    /* A start's progress while it reserves its pools: the file beside the
     * socket that clients read (starting.h), the pool being reserved. */
    struct {
        char path[PATH_MAX];
        int fd; /* the file, locked while the start goes on; -1 before */
        const char *pool;
        int quarter; /* the last quarter of a large reservation logged */
    } progress;
    int argc; /* kept for SIGHUP, which parses them again */
    char **argv;
};

static void daemon_start_expiry(struct daemon *d);

/* Point stderr at --log-file (append), so every log line goes there. */
static int daemon_open_log(const char *path, struct shmb_error *err)
{
    int fd;

    if (path[0] == '\0')
        return 0;
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0)
        return shmb_error_set(err, -errno, "Cannot open --log-file %s: %s.", path,
                              strerror(errno));
    if (dup2(fd, STDERR_FILENO) < 0) {
        int saved = errno;

        close(fd);
        return shmb_error_set(err, -saved, "Cannot log to %s: %s.", path,
                              strerror(saved));
    }
    close(fd);
    return 0;
}

/* The occupancy of every pool together. */
static void daemon_counts(const struct daemon *d, struct store_stats *sum)
{
    struct store_stats st;
    unsigned i;

    memset(sum, 0, sizeof(*sum));
    for (i = 0; i < d->pools.n; i++) {
        store_counts(d->pools.pools[i]->store, &st);
        sum->used += st.used;
        sum->data_size += st.data_size;
        sum->objects += st.objects;
    }
}

/* STATUS= line for systemctl status: occupancy, objects, clients, of every
 * pool together, and the queues. */
static void daemon_on_status(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    struct store_stats st;
    char used[32], total[32], pools[32] = "";

    daemon_counts(d, &st);

    if (d->pools.n > 1)
        snprintf(pools, sizeof(pools), " in %u pools", d->pools.n);
    notify_send("STATUS=%llu%% used (%s of %s%s), %llu object%s, %u client%s, %u queue%s",
                st.data_size ? (unsigned long long)(st.used * 100 / st.data_size) : 0ULL,
                shmb_format_bytes(st.used, used, sizeof(used)),
                shmb_format_bytes(st.data_size, total, sizeof(total)), pools,
                (unsigned long long)st.objects, st.objects == 1 ? "" : "s", d->env.clients,
                d->env.clients == 1 ? "" : "s", d->env.queues.n,
                d->env.queues.n == 1 ? "" : "s");
}

static void daemon_on_watchdog(uv_timer_t *timer)
{
    (void)timer;
    notify_send("WATCHDOG=1");
}

/* Every pool's heartbeat and published counters, in its segment's header
 * page: what shmbrokerctl status reads when the daemon does not answer. */
static void daemon_on_heartbeat(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    unsigned i;

    for (i = 0; i < d->pools.n; i++)
        pool_beat(d->pools.pools[i], false);
    /* Queues nobody has held for --queue-lease go: a second late at most. */
    queue_expire(&d->env.queues, clock_now_ms());
}

static void daemon_on_lease_expired(const char *key, size_t key_len, uint32_t reads_left,
                                    void *arg);
static void daemon_on_segment_broken(const char *message);
static void daemon_keep_memfd(const struct daemon *d, const struct pool *p);
static void daemon_unkeep_memfd(const struct daemon *d, const struct pool *p);

/* Whether the settings name a pool of that name. */
static bool daemon_names_pool(const struct config *cfg, const char *name)
{
    unsigned i;

    for (i = 0; i < cfg->n_pools; i++)
        if (strcmp(cfg->pools[i].name, name) == 0)
            return true;
    return false;
}

/* Open pool p as planned: create its segment, or adopt or replace the one
 * there. An adopted segment loses the objects of the queues of the daemon
 * that left it ("q/<queue>/<seq>"): queues do not outlive a daemon, and
 * those objects would await reads that never come, holding their bytes
 * against reclaim. The start and SIGHUP both open pools here, so that an
 * adoption is the same whichever adds the pool. */
static int daemon_open_pool(struct daemon *d, struct pool *p, struct shmb_error *err)
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

/* Record the segment files the daemon holds beside its socket (held.h),
 * all of them when mine is true, none otherwise (they were removed): what
 * --remove-segment removes at the socket unit's stop, even after the
 * settings were changed under it. A failure is logged; the daemon serves
 * on. */
static void daemon_record_held(const struct daemon *d, bool mine)
{
    static struct held_segment ours[CONFIG_MAX_POOLS];
    struct shmb_error err = {0};
    char path[PATH_MAX];
    size_t n = 0;
    unsigned i;

    if (held_path(d->cfg.socket_path, path, sizeof(path)) < 0)
        return;
    for (i = 0; mine && i < d->pools.n; i++) {
        const struct pool *p = d->pools.pools[i];

        if (p->seg.memfd)
            continue;
        snprintf(ours[n].dir, sizeof(ours[n].dir), "%s", p->cfg.dir);
        snprintf(ours[n].name, sizeof(ours[n].name), "%s", p->cfg.segment);
        ours[n++].size = p->seg.size;
    }
    if (held_update(path, ours, n, &err) < 0)
        log_warn("%s", err.message);
}

/* SIGHUP: the pools of the new settings. A new one is added (with the space
 * check); one no longer named goes if it is empty, and stays (logged) if
 * anything is in it or connected to it; one whose size, backing, directory
 * or largest object changed stays as it is (a restart applies that); its
 * group applies to the next hello. The order becomes the settings'. */
static void daemon_reload_pools(struct daemon *d, const struct config *next)
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

/* SIGHUP: reopen the log and apply the settings that can change while
 * running (log level, limits, timeouts, allow lists); say which cannot. */
static void daemon_on_sighup(uv_signal_t *handle, int signum)
{
    struct daemon *d = handle->data;
    struct shmb_error err = {0};
    struct config next;
    const char *fixed = NULL;

    (void)signum;
    if (daemon_open_log(d->cfg.log_file, &err) < 0)
        log_error("%s", err.message);
    log_detect_journal();
    if (config_parse(&next, d->argc, d->argv, &err) != CONFIG_RUN) {
        log_error("SIGHUP: settings not reloaded, nothing changed: %s", err.message);
        return;
    }
    if (!next.pools_declared && !d->cfg.pools_declared &&
        (next.size != d->cfg.size || next.max_object_size != d->cfg.max_object_size ||
         next.max_objects != d->cfg.max_objects))
        fixed = "--size, --max-object-size and --max-objects";
    else if (strcmp(next.name, d->cfg.name) != 0 ||
             strcmp(next.shm_dir, d->cfg.shm_dir) != 0)
        fixed = "--name and --shm-dir";
    else if (!d->activated && (strcmp(next.socket_path, d->cfg.socket_path) != 0 ||
                               next.socket_mode != d->cfg.socket_mode))
        fixed = "--socket and --socket-mode";
    if (fixed != NULL)
        log_warn(
            "SIGHUP: %s are not reloadable (the segment and socket stay as they are); "
            "restart shmbrokerd to change them",
            fixed);
    log_active_level = next.log_level;
    d->cfg.log_level = next.log_level;
    d->cfg.limits = next.limits; /* the server reads them through a pointer */
    server_hello_rearm(&d->server);
    d->cfg.max_pins = d->env.limits.max_pins = next.max_pins;
    d->cfg.max_pending = d->env.limits.max_pending = next.max_pending;
    d->cfg.read_lease_ms = next.read_lease_ms;
    d->cfg.queue_lease_ms = d->env.queues.lease_ms = next.queue_lease_ms;
    daemon_reload_pools(d, &next);
    daemon_record_held(d, true);
    d->cfg.keep_segment = next.keep_segment;
    if (next.alloc_timeout_ms != d->cfg.alloc_timeout_ms) {
        d->cfg.alloc_timeout_ms = next.alloc_timeout_ms;
        daemon_start_expiry(d);
    }
    log_info("SIGHUP: settings reloaded (log level %s, max-clients %u, alloc-timeout %llu "
             "ms, keep-segment %s)",
             log_level_name(d->cfg.log_level), d->cfg.limits.max_clients,
             (unsigned long long)d->cfg.alloc_timeout_ms,
             d->cfg.keep_segment ? "yes" : "no");
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

/* Timer: drop allocations their writers did not commit in time. */
static void daemon_on_expiry(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    size_t n = 0;
    unsigned i;

    for (i = 0; i < d->pools.n; i++)
        n += store_expire_pending(d->pools.pools[i]->store, d->cfg.alloc_timeout_ms);

    d->expiry_due = 0; /* daemon_on_expiry_arm arms it for the next one */
    log_debug("expiry timer: %zu allocation(s) dropped", n);

    if (n > 0)
        log_info(
            "dropped %zu allocation(s) not committed within %llu ms (--alloc-timeout)", n,
            (unsigned long long)d->cfg.alloc_timeout_ms);
}

/* The segment guard found the file broken by a client (segment.h): say so
 * once; every refused allocation repeats it to its client. */
static void daemon_on_segment_broken(const char *message)
{
    log_error("%s", message);
}

/* SIGTERM or SIGINT: stop accepting, close every client, let the loop end. */
/* The pidfd of --stop-with-pid goes once its handle has closed. */
static void daemon_on_stop_with_closed(uv_handle_t *handle)
{
    struct daemon *d = handle->data;

    close(d->stop_with_fd);
    d->stop_with_fd = -1;
}

/* Close the handles daemon_handles_init made. */
static void daemon_handles_close(struct daemon *d)
{
    uv_handle_t *handles[] = {
        (uv_handle_t *)&d->expiry, (uv_handle_t *)&d->expiry_arm, (uv_handle_t *)&d->sighup,
        (uv_handle_t *)&d->status, (uv_handle_t *)&d->watchdog,    (uv_handle_t *)&d->sigterm,
        (uv_handle_t *)&d->sigint, (uv_handle_t *)&d->heartbeat,
    };
    sigset_t hup, old;
    size_t i;

    /* Closing the handler gives SIGHUP its default action back, which ends
     * the process: a reload sent while the daemon stops (logrotate,
     * systemctl reload) would kill it before it removes its socket and
     * segments. There is nothing left to reload: held off meanwhile (the
     * thread pool's threads block it, conn_offload), then ignored, which
     * drops one that came. */
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hup, &old);
    for (i = 0; i < sizeof(handles) / sizeof(handles[0]); i++)
        uv_close(handles[i], NULL);
    signal(SIGHUP, SIG_IGN);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Stop serving: the loop ends once every handle has closed. */
static void daemon_shutdown(struct daemon *d)
{
    unsigned i;

    if (d->stopping)
        return;
    d->stopping = true;
    notify_send("STOPPING=1");
    /* Before the connections close: their members wake to ECANCELED (shut
     * down), not to a writer gone or a seat dead. */
    if (d->env.queues.n > 0)
        log_info("shutting down %u queue%s", d->env.queues.n, d->env.queues.n == 1 ? "" : "s");
    queue_shutdown_all(&d->env.queues);
    /* Readers answer nothing more from the mappings, before the
     * connections that would tell them so close. */
    for (i = 0; i < d->pools.n; i++)
        pool_retire(d->pools.pools[i]);
    server_close(&d->server);
    daemon_handles_close(d);
    if (d->stop_with_fd >= 0)
        uv_close((uv_handle_t *)&d->stop_with, daemon_on_stop_with_closed);
}

static void daemon_on_signal(uv_signal_t *handle, int signum)
{
    struct daemon *d = handle->data;

    if (!d->stopping)
        log_info("%s received; shutting down", strsignal(signum));
    daemon_shutdown(d);
}

/* --stop-with-pid: the process watched has exited. */
static void daemon_on_stop_with(uv_poll_t *handle, int status, int events)
{
    struct daemon *d = handle->data;

    (void)status;
    (void)events;
    if (!d->stopping)
        log_info("process %d exited (--stop-with-pid); shutting down",
                 (int)d->cfg.stop_with_pid);
    daemon_shutdown(d);
}

/* --stop-with-pid PID, among the checks before any change: a pidfd of PID,
 * which becomes readable when the process exits (the process, not one of its
 * threads). A PID that is not running refuses the start. */
static int daemon_open_stop_with(struct daemon *d, struct shmb_error *err)
{
    pid_t pid = d->cfg.stop_with_pid;
    int fd;

    if (pid == 0)
        return 0;
    fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0)
        return shmb_error_set(err, -errno,
                              "--stop-with-pid %d: cannot watch that process: %s%s.", (int)pid,
                              strerror(errno), errno == ESRCH ? " (it is not running)" : "");
    d->stop_with_fd = fd;
    return 0;
}

/* Watch the pidfd on the loop; on failure it is closed. */
static int daemon_watch_stop_with(struct daemon *d, struct shmb_error *err)
{
    int rc;

    if (d->stop_with_fd < 0)
        return 0;
    if ((rc = uv_poll_init(&d->loop, &d->stop_with, d->stop_with_fd)) < 0) {
        close(d->stop_with_fd);
        d->stop_with_fd = -1;
        return shmb_error_set(err, -EIO, "--stop-with-pid %d: cannot watch that process: %s.",
                              (int)d->cfg.stop_with_pid, uv_strerror(rc));
    }
    d->stop_with.data = d;
    uv_poll_start(&d->stop_with, UV_READABLE, daemon_on_stop_with);
    return 0;
}

/* Before the loop sleeps: arm the expiry timer for the deadline of the
 * oldest pending allocation, or stop it when nothing can expire, so that an
 * idle daemon is not woken at all. Re-armed only when that deadline moved. */
static void daemon_on_expiry_arm(uv_prepare_t *handle)
{
    struct daemon *d = handle->data;
    uint64_t oldest = UINT64_MAX, due, now;
    unsigned i;

    for (i = 0; i < d->pools.n; i++) {
        uint64_t t = store_oldest_pending_ms(d->pools.pools[i]->store);

        if (t < oldest)
            oldest = t;
    }

    if (d->cfg.alloc_timeout_ms == 0 || oldest == UINT64_MAX) {
        if (d->expiry_due != 0)
            uv_timer_stop(&d->expiry);
        d->expiry_due = 0;
        return;
    }
    due = oldest + d->cfg.alloc_timeout_ms;
    if (due == d->expiry_due)
        return;
    now = clock_now_ms();
    d->expiry_due = due;
    uv_timer_start(&d->expiry, daemon_on_expiry, due > now ? due - now : 0, 0);
}

/* --alloc-timeout changed (SIGHUP): arm the timer again for the new deadline. */
static void daemon_start_expiry(struct daemon *d)
{
    uv_timer_stop(&d->expiry);
    d->expiry_due = 0;
    daemon_on_expiry_arm(&d->expiry_arm);
}

/* The daemon's own handles on the loop: expiry, signals, systemd's status
 * and watchdog timers. On failure those made so far are closed. */
static int daemon_handles_init(struct daemon *d, struct shmb_error *err)
{
    uv_timer_t *timers[] = {&d->expiry, &d->status, &d->watchdog, &d->heartbeat};
    uv_signal_t *signals[] = {&d->sigterm, &d->sigint, &d->sighup};
    uv_handle_t *made[8];
    size_t n = 0, i;
    int rc = uv_prepare_init(&d->loop, &d->expiry_arm);

    if (rc == 0)
        made[n++] = (uv_handle_t *)&d->expiry_arm;
    for (i = 0; rc == 0 && i < 4; i++)
        if ((rc = uv_timer_init(&d->loop, timers[i])) == 0)
            made[n++] = (uv_handle_t *)timers[i];
    for (i = 0; rc == 0 && i < 3; i++)
        if ((rc = uv_signal_init(&d->loop, signals[i])) == 0)
            made[n++] = (uv_handle_t *)signals[i];
    for (i = 0; i < n; i++)
        made[i]->data = d;
    if (rc == 0 && (rc = uv_prepare_start(&d->expiry_arm, daemon_on_expiry_arm)) == 0 &&
        (rc = uv_signal_start(&d->sigterm, daemon_on_signal, SIGTERM)) == 0 &&
        (rc = uv_signal_start(&d->sigint, daemon_on_signal, SIGINT)) == 0 &&
        (rc = uv_signal_start(&d->sighup, daemon_on_sighup, SIGHUP)) == 0 &&
        (rc = uv_timer_start(&d->heartbeat, daemon_on_heartbeat, SEGMENT_HEARTBEAT_MS,
                             SEGMENT_HEARTBEAT_MS)) == 0) {
        uv_unref((uv_handle_t *)&d->expiry_arm);
        uv_unref((uv_handle_t *)&d->heartbeat);
        return 0;
    }
    while (n > 0)
        uv_close(made[--n], NULL);
    return shmb_error_set(err, -EIO, "Cannot set up the event loop's handles: %s.",
                          uv_strerror(rc));
}

/* The checks of the settings alone, before anything is looked at: each
 * pool's size (in sizes[]: whole pages, whole huge pages on hugetlbfs), its
 * directory, its segment's name, its largest object. Also the actions'. */
static int daemon_check_settings(const struct config *cfg, uint64_t *sizes,
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
static void daemon_free_pools(struct daemon *d)
{
    while (d->pools.n > 0)
        pool_free(d->pools.pools[--d->pools.n]);
}

/* The store's name of a memfd pool's descriptor. */
static void daemon_kept_name(const struct pool *p, char *out, size_t len)
{
    snprintf(out, len, "%s%s", SERVER_KEPT_PREFIX, p->cfg.name);
}

/* A memfd pool: the descriptor systemd kept for it, if it kept one that
 * can be adopted (a memfd of the pool's size, sealed against resizing,
 * writable). Anything else under its name (another size, a file, a pipe, a
 * second descriptor), and everything with --fresh, is dropped and the store
 * entry made again once the pool is open: the pool starts empty rather than
 * refusing every start. */
static void daemon_take_kept(struct daemon *d, struct pool *p)
{
    struct shmb_error err = {0};
    char name[64];
    unsigned i;

    daemon_kept_name(p, name, sizeof(name));
    for (i = 0; i < d->kept.n; i++) {
        int fd = d->kept.fd[i];

        if (fd < 0 || strcmp(d->kept.name[i], name) != 0)
            continue;
        d->kept.fd[i] = -1;
        if (d->cfg.fresh)
            log_info("pool '%s': the memfd systemd kept is dropped (--fresh)", p->cfg.name);
        else if (p->kept_fd >= 0)
            log_warn("pool '%s': systemd kept more than one memfd for it; the later one is "
                     "dropped",
                     p->cfg.name);
        else if (segment_check_memfd(fd, p->cfg.segment, p->size, &err) < 0)
            log_warn("pool '%s': %s It is dropped: the pool starts empty.", p->cfg.name,
                     err.message);
        else {
            p->kept_fd = fd;
            continue;
        }
        close(fd);
        p->kept_again = true;
    }
    if (p->kept_fd < 0)
        log_info("pool '%s' is a memfd: it has no name, so %s", p->cfg.name,
                 d->notify ? "systemd keeps it across restarts (its file-descriptor store), "
                             "not across a stop"
                           : "it cannot be adopted after a restart; its objects go with "
                             "this daemon");
}

/* A start refused: close what systemd passed, which it still keeps for the
 * next attempt. */
static void daemon_close_kept(struct daemon *d)
{
    unsigned i;

    for (i = 0; i < d->kept.n; i++)
        if (d->kept.fd[i] >= 0)
            close(d->kept.fd[i]);
    d->kept.n = 0;
}

/* A memfd pool that goes for good (a stop without --keep-segment, or a
 * reload that removed it): systemd must not keep it any longer. */
static void daemon_unkeep_memfd(const struct daemon *d, const struct pool *p)
{
    char name[64];

    if (!d->notify || !p->seg.memfd)
        return;
    daemon_kept_name(p, name, sizeof(name));
    notify_unstore_fd(name);
}

/* Descriptors systemd kept for pools no longer configured: let them go. */
static void daemon_drop_kept(struct daemon *d)
{
    unsigned i;

    for (i = 0; i < d->kept.n; i++) {
        if (d->kept.fd[i] < 0)
            continue;
        log_info("systemd kept %s for a memfd pool that is no longer configured; "
                 "released",
                 d->kept.name[i]);
        close(d->kept.fd[i]);
        d->kept.fd[i] = -1;
        notify_unstore_fd(d->kept.name[i]);
    }
    d->kept.n = 0;
}

/* Make the pools, decide for each what to do with a segment already there,
 * and check that the new ones fit: every check before any change. */
static int daemon_plan_pools(struct daemon *d, struct shmb_error *err)
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

/* A memfd pool made now: ask systemd to keep it across restarts. */
static void daemon_keep_memfd(const struct daemon *d, const struct pool *p)
{
    char name[64];
    int rc;

    if (!d->notify || !p->seg.memfd || (p->adopt && !p->kept_again))
        return;
    daemon_kept_name(p, name, sizeof(name));
    /* Exactly one descriptor under the name: whatever else is there goes. */
    notify_unstore_fd(name);
    if ((rc = notify_store_fd(p->seg.fd, name)) < 0)
        log_warn("pool '%s': cannot hand its memfd to systemd to keep: %s", p->cfg.name,
                 strerror(-rc));
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
static void daemon_progress_end(struct daemon *d)
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
static void daemon_progress_begin(struct daemon *d)
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
static int daemon_open_pools(struct daemon *d, struct shmb_error *err)
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
static void daemon_close_pools(struct daemon *d, bool keep)
{
    unsigned i;

    for (i = 0; i < d->pools.n; i++)
        pool_close(d->pools.pools[i], keep);
    daemon_free_pools(d);
}

/* Everything before the loop: probe, segments, stores, listener. */
static int daemon_start(struct daemon *d, struct shmb_error *err)
{
    char h1[32], h2[32], h3[32];
    int listen_fd = d->activated_fd; /* main took it from systemd, or -1 */
    int passed_fd = d->activated_fd, stale = 0, rc;
    unsigned i;

    /* Every check before any change: a refused start leaves the socket and
     * the segments as they were. */
    if ((rc = daemon_open_stop_with(d, err)) < 0)
        return rc;
    if (!d->activated && (rc = stale = server_probe(d->cfg.socket_path, err)) < 0)
        goto fail_stop_with;
    if ((rc = daemon_plan_pools(d, err)) < 0) {
        daemon_close_kept(d);
        goto fail_stop_with;
    }
    if (stale == 1 && (rc = server_remove_stale(d->cfg.socket_path, err)) < 0)
        goto fail_plan;
    /* The socket before the segments: a path that cannot be bound refuses
     * the start before --fresh removes anything. */
    if (!d->activated &&
        (rc = server_bind(d->cfg.socket_path, d->cfg.socket_mode, &listen_fd, err)) < 0)
        goto fail_plan;
    /* The socket's path is this daemon's now: so is its progress file (one
     * a daemon killed while starting left goes), beside the socket clients
     * dial: systemd's when it passed one. */
    daemon_progress_begin(d);
    if ((rc = daemon_open_pools(d, err)) < 0)
        goto fail_socket;
    /* Before any client can connect: a stop from then on finds it. */
    daemon_record_held(d, true);
    command_env_init(&d->env);
    queue_set_init(&d->env.queues, d->cfg.name);
    d->env.queues.lease_ms = d->cfg.queue_lease_ms;
    d->env.pools = &d->pools;
    d->env.started_ms = clock_now_ms();
    d->env.limits.max_pins = d->cfg.max_pins;
    d->env.limits.max_pending = d->cfg.max_pending;
    if ((rc = uv_loop_init(&d->loop)) < 0) {
        rc = shmb_error_set(err, -ENOMEM, "Cannot start the event loop: %s.",
                            uv_strerror(rc));
        goto fail;
    }
    /* The signal handlers before the listener: a client that can connect
     * may stop the daemon with SIGTERM, and that stop is a clean one. */
    if ((rc = daemon_handles_init(d, err)) < 0)
        goto fail_loop;
    if ((rc = daemon_watch_stop_with(d, err)) < 0) {
        daemon_handles_close(d);
        goto fail_loop;
    }
    rc = d->activated
             ? server_adopt(&d->server, &d->loop, listen_fd, &d->env, &d->cfg.limits, err)
             : server_listen(&d->server, &d->loop, listen_fd, d->cfg.socket_path, &d->env,
                             &d->cfg.limits, err);
    listen_fd = d->activated_fd = -1; /* the server's now, or closed by it */
    if (rc < 0) {
        daemon_handles_close(d);
        if (d->stop_with_fd >= 0)
            uv_close((uv_handle_t *)&d->stop_with, daemon_on_stop_with_closed);
        goto fail_loop;
    }
    daemon_progress_end(d);
    if (d->activated)
        log_info("serving the listening socket systemd passed (fd %d): %s", passed_fd,
                 d->server.path);
    if (d->notify) {
        uint64_t wd = notify_watchdog_usec() / 2000; /* half the interval, in ms */

        uv_timer_start(&d->status, daemon_on_status, 1000, 1000);
        if (wd > 0)
            uv_timer_start(&d->watchdog, daemon_on_watchdog, wd, wd);
    }
    if (!d->cfg.pools_declared) {
        const struct pool *p = d->pools.pools[0];

        log_info("shmbrokerd %s ready: segment %s (%s, %s for data, max object %s), "
                 "socket %s",
                 SHMB_VERSION, p->seg.path, shmb_format_bytes(p->seg.size, h1, sizeof(h1)),
                 shmb_format_bytes(p->seg.data_size, h2, sizeof(h2)),
                 shmb_format_bytes(p->cfg.max_object_size, h3, sizeof(h3)), d->server.path);
        /* Ready only now: the segment is reserved and the listener is up. */
        notify_send("READY=1\nSTATUS=serving %s on %s", p->seg.path, d->server.path);
        return 0;
    }
    for (i = 0; i < d->pools.n; i++) {
        const struct pool *p = d->pools.pools[i];

        log_info("pool '%s'%s: segment %s (%s backing, %s, %s for data, max object %s%s%s)",
                 p->cfg.name, i == 0 ? " (default)" : "", p->seg.path,
                 pool_backing_name(p->cfg.backing),
                 shmb_format_bytes(p->seg.size, h1, sizeof(h1)),
                 shmb_format_bytes(p->seg.data_size, h2, sizeof(h2)),
                 shmb_format_bytes(p->cfg.max_object_size, h3, sizeof(h3)),
                 p->cfg.has_group ? ", group " : "", p->cfg.has_group ? p->cfg.group : "");
    }
    log_info("shmbrokerd %s ready: %u pool%s, socket %s", SHMB_VERSION, d->pools.n,
             d->pools.n == 1 ? "" : "s", d->server.path);
    notify_send("READY=1\nSTATUS=serving %u pool%s on %s", d->pools.n,
                d->pools.n == 1 ? "" : "s", d->server.path);
    return 0;

fail_loop:
    uv_run(&d->loop, UV_RUN_NOWAIT);
    uv_loop_close(&d->loop);
fail:
    /* An adopted segment holds objects committed before the crash: keep
     * them for the next attempt. A new one goes. */
    for (i = 0; i < d->pools.n; i++)
        pool_close(d->pools.pools[i], d->pools.pools[i]->adopt);
    daemon_record_held(d, false); /* keeps the adopted ones, still there */
fail_socket:
    daemon_progress_end(d);
    if (!d->activated)
        server_unbind(listen_fd, d->cfg.socket_path);
fail_plan:
    daemon_free_pools(d);
fail_stop_with:
    if (d->stop_with_fd >= 0)
        close(d->stop_with_fd); /* opened, never watched (a watched one closed above) */
    d->stop_with_fd = -1;
    return rc;
}

/* After the loop: close what is left, remove the segments (or, with
 * --keep-segment, leave them and their committed objects to the next
 * start: a file by its name, a memfd in systemd's descriptor store, which
 * is all a memfd can be kept by). */
static void daemon_stop(struct daemon *d)
{
    struct store_stats st;
    char used[32], what[PATH_MAX + 32], memfd[96] = "";
    unsigned i, n_memfd = 0;

    uv_run(&d->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&d->loop) != 0)
        log_warn("event loop closed with handles still open");
    /* Queues are not kept across a restart: their processes make them again. */
    queue_set_free(&d->env.queues);
    if (d->pools.n == 1)
        snprintf(what, sizeof(what), "segment %s", d->pools.pools[0]->seg.path);
    else
        snprintf(what, sizeof(what), "the segments of %u pools", d->pools.n);
    for (i = 0; i < d->pools.n; i++)
        n_memfd += d->pools.pools[i]->seg.memfd;
    if (d->cfg.keep_segment) {
        /* What is kept: file segments, and memfds only in systemd's store. */
        memset(&st, 0, sizeof(st));
        for (i = 0; i < d->pools.n; i++) {
            struct store_stats one;

            if (d->pools.pools[i]->seg.memfd && !d->notify)
                continue;
            store_counts(d->pools.pools[i]->store, &one);
            st.objects += one.objects;
            st.used += one.used;
        }
        if (n_memfd > 0)
            snprintf(memfd, sizeof(memfd), "; %s",
                     d->notify ? "memfd pools kept by systemd's descriptor store"
                               : "memfd pools removed (without systemd, nothing keeps a memfd)");
        log_info("stopped; %s kept with %llu object%s (%s) for the next start to adopt "
                 "(--keep-segment)%s%s",
                 what, (unsigned long long)st.objects, st.objects == 1 ? "" : "s",
                 shmb_format_bytes(st.used, used, sizeof(used)), memfd,
                 d->activated ? "; the socket stays with systemd" : "");
        daemon_record_held(d, true);
        daemon_close_pools(d, true);
        return;
    }
    for (i = 0; i < d->pools.n; i++)
        daemon_unkeep_memfd(d, d->pools.pools[i]);
    snprintf(what, sizeof(what), "%s", d->pools.n == 1 ? "segment" : "segments");
    daemon_close_pools(d, false);
    daemon_record_held(d, false);
    if (d->activated)
        log_info("stopped; %s removed (the socket %s stays with systemd)", what,
                 d->server.path);
    else
        log_info("stopped; socket %s and %s removed", d->server.path, what);
}

/* A start refused: tell systemd why (systemctl status shows it), and the
 * clients waiting on systemd's socket, so that it is not started again for
 * them in a loop. */
static void daemon_refuse_start(struct daemon *d, const struct shmb_error *err)
{
    char message[SHMB_ERROR_MSG_MAX + 32];

    notify_send("STATUS=failed to start: %s\nERRNO=%d", err->message,
                err->code < 0 ? -err->code : EINVAL);
    if (d->activated_fd < 0)
        return;
    snprintf(message, sizeof(message), "shmbrokerd cannot start: %s", err->message);
    server_refuse_waiting(d->activated_fd, err->code < 0 ? err->code : -EINVAL, message);
}

/* --reload PID: the settings are good (main checked them): ask the running
 * shmbrokerd PID to apply them. Only a process named shmbrokerd is sent the
 * signal, so that a stale pid does not hang up something else, and only
 * one that proves to be the daemon these settings name. */
static int daemon_send_reload(const struct config *cfg, pid_t pid)
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

/* --remove-segment: remove the segments the daemon last recorded holding
 * beside its socket (held.h), and those these settings name, when no daemon
 * holds them (what systemctl stop shmbrokerd.socket runs). The record comes
 * first: settings changed while the daemon ran (pools reordered, renamed,
 * moved) would leave its segments behind. A memfd pool has none. Every
 * segment is tried; 1 when one could not be removed. */
static int daemon_remove_segment_only(const struct config *cfg)
{
    static struct held_segment list[HELD_MAX + CONFIG_MAX_POOLS];
    /* Whether list[k] is a pool the settings name: only such a file may
     * lack the segment's header (a client damaged it) and still go. The
     * record's lines must prove they are segments: a line can name any
     * file of this user's, of any size. */
    static bool named[HELD_MAX + CONFIG_MAX_POOLS];
    uint64_t sizes[CONFIG_MAX_POOLS];
    struct shmb_error err = {0};
    char record[PATH_MAX];
    size_t n = 0, k, j;
    unsigned i, bad = 0;
    int status = 0;

    if (daemon_check_settings(cfg, sizes, &err) < 0) {
        log_startup_error(err.message);
        return 1;
    }
    if (held_path(cfg->socket_path, record, sizeof(record)) < 0)
        record[0] = '\0';
    else if (held_read(record, list, HELD_MAX, &n, &bad, &err) < 0) {
        log_startup_error(err.message);
        status = 1;
    } else if (bad > 0) {
        log_warn("%s: %u line%s that %s not segments skipped", record, bad,
                 bad == 1 ? "" : "s", bad == 1 ? "is" : "are");
    }
    for (i = 0; i < cfg->n_pools; i++) {
        const struct pool_config *pc = &cfg->pools[i];

        if (pc->backing == POOL_BACKING_MEMFD)
            continue;
        for (j = 0; j < n; j++)
            if (strcmp(list[j].dir, pc->dir) == 0 && strcmp(list[j].name, pc->segment) == 0)
                break;
        if (j == n) {
            snprintf(list[n].dir, sizeof(list[n].dir), "%s", pc->dir);
            snprintf(list[n].name, sizeof(list[n].name), "%s", pc->segment);
            n++;
        }
        list[j].size = sizes[i];
        named[j] = true;
    }
    for (k = 0; k < n; k++) {
        const struct held_segment *e = &list[k];
        uint64_t bytes;
        int64_t pid = 0;
        char human[32];
        int rc;

        rc = segment_remove_orphaned(e->dir, e->name, e->size, named[k], &bytes, &pid,
                                     &err);
        if (rc < 0) {
            log_startup_error(err.message);
            status = 1;
        } else if (rc == 0) {
            printf("shmbrokerd: no segment %s/%s; nothing to remove\n", e->dir, e->name);
        } else {
            printf("shmbrokerd: removed segment %s/%s (%s) left by shmbrokerd pid %lld\n",
                   e->dir, e->name, shmb_format_bytes(bytes, human, sizeof(human)),
                   (long long)pid);
        }
    }
    /* The record keeps only what is still there (one a live daemon holds). */
    if (record[0] != '\0' && held_update(record, NULL, 0, &err) < 0) {
        log_startup_error(err.message);
        status = 1;
    }
    return status;
}

int main(int argc, char **argv)
{
    static struct daemon d = {.stop_with_fd = -1, .activated_fd = -1, .progress.fd = -1};
    struct shmb_error err = {0};
    int rc;

    d.notify = notify_init();
    log_detect_journal();
    switch (config_parse(&d.cfg, argc, argv, &err)) {
    case CONFIG_EXIT_OK:
        return 0;
    case CONFIG_EXIT_USAGE:
        log_startup_error(err.message);
        if (server_activated_fd(&d.activated_fd, NULL, NULL) != 1)
            d.activated_fd = -1;
        daemon_refuse_start(&d, &err);
        return 2;
    case CONFIG_RUN:
        break;
    }
    switch (d.cfg.mode) {
    case CONFIG_SERVE:
        break;
    case CONFIG_SIZING: {
        uint64_t sizes[CONFIG_MAX_POOLS];

        /* What a start would refuse as bad settings, --check refuses too. */
        if (daemon_check_settings(&d.cfg, sizes, &err) < 0) {
            log_startup_error(err.message);
            return 2;
        }
        return sizing_report(&d.cfg, stdout);
    }
    case CONFIG_CHECK:
    case CONFIG_RELOAD: {
        uint64_t sizes[CONFIG_MAX_POOLS];

        if (daemon_check_settings(&d.cfg, sizes, &err) < 0) {
            log_startup_error(err.message);
            return 2;
        }
        if (d.cfg.mode == CONFIG_RELOAD)
            return daemon_send_reload(&d.cfg, d.cfg.reload_pid);
        printf("shmbrokerd: settings OK%s%s\n", d.cfg.config_file[0] ? ", with " : "",
               d.cfg.config_file);
        return 0;
    }
    case CONFIG_REMOVE_SEGMENT:
        return daemon_remove_segment_only(&d.cfg);
    }
    log_active_level = d.cfg.log_level;
    d.argc = argc;
    d.argv = argv;
    signal(SIGPIPE, SIG_IGN);
    json_set_alloc_funcs(shmb_malloc, shmb_free);
    /* systemd's socket first: a start refused from here on answers the
     * clients already waiting on it. */
    if ((rc = server_activated_fd(&d.activated_fd, &d.kept, &err)) < 0) {
        log_startup_error(err.message);
        daemon_refuse_start(&d, &err);
        return 1;
    }
    d.activated = rc == 1;
    if (!d.activated)
        d.activated_fd = -1;
    if (daemon_open_log(d.cfg.log_file, &err) < 0) {
        log_startup_error(err.message);
        daemon_refuse_start(&d, &err);
        return 1;
    }
    log_detect_journal(); /* --log-file moved stderr */
    if (daemon_start(&d, &err) < 0) {
        log_startup_error(err.message);
        daemon_refuse_start(&d, &err);
        return 1;
    }
    uv_run(&d.loop, UV_RUN_DEFAULT);
    daemon_stop(&d);
    return 0;
}
