// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerd: flags, start-up (socket probe, segment, store, listener),
 * signals and the event loop. Everything slow happens before the loop runs.
 * The pools' plan and opening are plan.c's, the reload reload.c's, the
 * descriptor store's bookkeeping keep.c's; the state they share daemon.h's.
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
#include "daemon.h"
#include "held.h"
#include "hup.h"
#include "keep.h"
#include "log.h"
#include "notify.h"
#include "plan.h"
#include "pool.h"
#include "reload.h"
#include "segment.h"
#include "server.h"
#include "sizing.h"
#include "store.h"

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

/* SIGHUP: reopen the log and apply the settings that can change while
 * running (log level, limits, timeouts, allow lists); say which cannot. */
static void daemon_on_sighup(uv_async_t *handle)
{
    struct daemon *d = handle->data;
    struct shmb_error err = {0};
    struct config next;
    const char *fixed = NULL;

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

/* Timer: drop allocations their writers did not commit in time. */
static void daemon_on_expiry(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    size_t n = 0;
    unsigned i;

    for (i = 0; i < d->pools.n; i++) {
        /* An arena in use by publishing alone is a used one. */
        store_fold_published(d->pools.pools[i]->store, NULL, false);
        n += store_expire_pending(d->pools.pools[i]->store, d->cfg.alloc_timeout_ms);
    }

    d->expiry_due = 0; /* daemon_on_expiry_arm arms it for the next one */
    log_debug("expiry timer: %zu allocation(s) dropped", n);

    if (n > 0)
        log_info(
            "dropped %zu allocation(s) not committed within %llu ms (--alloc-timeout)", n,
            (unsigned long long)d->cfg.alloc_timeout_ms);
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
    hup_ignore();
    for (i = 0; i < sizeof(handles) / sizeof(handles[0]); i++)
        uv_close(handles[i], NULL);
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
    uv_signal_t *signals[] = {&d->sigterm, &d->sigint};
    uv_handle_t *made[8];
    size_t n = 0, i;
    int rc = uv_prepare_init(&d->loop, &d->expiry_arm);

    if (rc == 0)
        made[n++] = (uv_handle_t *)&d->expiry_arm;
    for (i = 0; rc == 0 && i < 4; i++)
        if ((rc = uv_timer_init(&d->loop, timers[i])) == 0)
            made[n++] = (uv_handle_t *)timers[i];
    for (i = 0; rc == 0 && i < 2; i++)
        if ((rc = uv_signal_init(&d->loop, signals[i])) == 0)
            made[n++] = (uv_handle_t *)signals[i];
    if (rc == 0 && (rc = uv_async_init(&d->loop, &d->sighup, daemon_on_sighup)) == 0)
        made[n++] = (uv_handle_t *)&d->sighup;
    for (i = 0; i < n; i++)
        made[i]->data = d;
    if (rc == 0 && (rc = uv_prepare_start(&d->expiry_arm, daemon_on_expiry_arm)) == 0 &&
        (rc = uv_signal_start(&d->sigterm, daemon_on_signal, SIGTERM)) == 0 &&
        (rc = uv_signal_start(&d->sigint, daemon_on_signal, SIGINT)) == 0 &&
        (rc = hup_catch(&d->sighup)) == 0 &&
        (rc = uv_timer_start(&d->heartbeat, daemon_on_heartbeat, SEGMENT_HEARTBEAT_MS,
                             SEGMENT_HEARTBEAT_MS)) == 0) {
        uv_unref((uv_handle_t *)&d->expiry_arm);
        uv_unref((uv_handle_t *)&d->heartbeat);
        return 0;
    }
    hup_ignore();
    while (n > 0)
        uv_close(made[--n], NULL);
    return shmb_error_set(err, -EIO, "Cannot set up the event loop's handles: %s.",
                          uv_strerror(rc));
}

/* The start is done: say so in the log (each pool, or the one segment when
 * no pool is declared) and to systemd (READY=1), and start the status and
 * watchdog timers systemd asked for. passed_fd is the socket systemd passed,
 * for the log. */
static void daemon_announce_ready(struct daemon *d, int passed_fd)
{
    char h1[32], h2[32], h3[32];
    unsigned i;

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
        return;
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
}

/* Everything before the loop: probe, segments, stores, listener. */
static int daemon_start(struct daemon *d, struct shmb_error *err)
{
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
    daemon_announce_ready(d, passed_fd);
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
