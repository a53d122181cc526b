/*
 * shmbrokerd: flags, start-up (socket probe, segment, store, listener),
 * signals and the event loop. Everything slow happens before the loop runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "command.h"
#include "config.h"
#include "log.h"
#include "notify.h"
#include "segment.h"
#include "server.h"
#include "sizing.h"
#include "store.h"

struct daemon {
    struct config cfg;
    struct segment seg;
    struct store *store;
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
    uv_poll_t stop_with; /* --stop-with-pid: that process's pidfd, readable once it exits */
    int stop_with_fd;    /* the pidfd; -1 when not watching */
    bool notify;         /* $NOTIFY_SOCKET is set */
    bool activated;      /* systemd passed the listening socket */
    int activated_fd;    /* ... which is ours until the server takes it, else -1 */
    bool adopt;          /* a segment left by a dead daemon is to be adopted */
    bool replace;        /* ... or removed first (--fresh) */
    int64_t adopt_pid;
    bool stopping;
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

/* STATUS= line for systemctl status: occupancy, objects, clients. */
static void daemon_on_status(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    struct store_stats st;
    char used[32], total[32];

    store_counts(d->store, &st);
    notify_send("STATUS=%llu%% used (%s of %s), %llu objects, %u clients",
                st.data_size ? (unsigned long long)(st.used * 100 / st.data_size) : 0ULL,
                shmb_format_bytes(st.used, used, sizeof(used)),
                shmb_format_bytes(st.data_size, total, sizeof(total)),
                (unsigned long long)st.objects, d->env.clients);
}

static void daemon_on_watchdog(uv_timer_t *timer)
{
    (void)timer;
    notify_send("WATCHDOG=1");
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
    if (next.size != d->cfg.size || next.max_object_size != d->cfg.max_object_size)
        fixed = "--size and --max-object-size";
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
    store_set_read_lease(d->store, next.read_lease_ms);
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
    const struct daemon *d = arg;

    log_warn("object '%.*s': read lease of %llu ms ran out with %u reads still awaited; "
             "it no longer blocks reclaim",
             (int)key_len, key, (unsigned long long)d->cfg.read_lease_ms, reads_left);
}

/* Timer: drop allocations their writers did not commit in time. */
static void daemon_on_expiry(uv_timer_t *timer)
{
    struct daemon *d = timer->data;
    size_t n = store_expire_pending(d->store, d->cfg.alloc_timeout_ms);

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
        (uv_handle_t *)&d->sigint,
    };
    size_t i;

    for (i = 0; i < sizeof(handles) / sizeof(handles[0]); i++)
        uv_close(handles[i], NULL);
}

/* Stop serving: the loop ends once every handle has closed. */
static void daemon_shutdown(struct daemon *d)
{
    if (d->stopping)
        return;
    d->stopping = true;
    notify_send("STOPPING=1");
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

/* Decide what to do with a segment file already there, changing nothing:
 * adopt one left by a daemon that is gone (or replace it with --fresh),
 * refuse anything else. Every check that can refuse the start runs here,
 * before the socket is touched, so that a refused start leaves the socket
 * and the segment as they were: the owner, the header and --size of a
 * segment to adopt, the free space for a new one (for --fresh, counting the
 * space of the one it replaces). */
static int daemon_check_segment(struct daemon *d, uint64_t size, struct shmb_error *err)
{
    const struct config *cfg = &d->cfg;
    int64_t pid = 0;
    enum segment_owner owner = segment_probe_existing(cfg->shm_dir, cfg->name, &pid);
    int rc;

    /* Never adopted, never removed (--fresh included): anything but a
     * regular file, and a file another user could read or change (not ours,
     * group or other bits, more than one link), whatever it holds. */
    if (owner != SEGMENT_ABSENT && owner != SEGMENT_LIVE &&
        (rc = segment_check_existing(cfg->shm_dir, cfg->name, err)) < 0 && rc != -ENOENT) {
        if (rc == -EPERM || owner == SEGMENT_ORPHANED)
            return rc;
        /* Not a regular file; or ours but not a segment (messages below). */
        {
            char path[PATH_MAX + 2 * NAME_MAX];
            struct stat st;

            snprintf(path, sizeof(path), "%s/%s", cfg->shm_dir, cfg->name);
            if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
                return rc;
        }
    }
    switch (owner) {
    case SEGMENT_ABSENT:
        return segment_check_space(cfg->shm_dir, size, NULL, err);
    case SEGMENT_LIVE:
        /* A running process holds the file's lock; the pid in the header is
         * only a hint for the human. */
        return shmb_error_set(err, -EBUSY,
                              "Segment %s/%s belongs to a running shmbrokerd (pid %lld), "
                              "which holds the segment's lock; stop it first, or choose "
                              "another --name.",
                              cfg->shm_dir, cfg->name, (long long)pid);
    case SEGMENT_FOREIGN:
        /* The header page is a hint too: a regular file of exactly the
         * segment's size under its name, locked by nobody, is a segment whose
         * header a read-write client damaged. It is adopted (its header
         * rebuilt) rather than stranding its objects. */
        if (segment_check_adoptable(cfg->shm_dir, cfg->name, size, NULL) == 0)
            break;
        {
            char path[PATH_MAX + 2 * NAME_MAX];
            struct stat st;

            /* Shorter than a header page: what a client's ftruncate leaves;
             * say so, since the user may take it for a segment of ours. */
            snprintf(path, sizeof(path), "%s/%s", cfg->shm_dir, cfg->name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < SHMB_HEADER_PAGE)
                return shmb_error_set(
                    err, -EEXIST,
                    "%s exists with %lld bytes, less than a segment's %u-byte header: "
                    "not a shmbroker segment, or one a client truncated. Remove it "
                    "(nothing in it can be adopted), or choose another --name.",
                    path, (long long)st.st_size, SHMB_HEADER_PAGE);
        }
        return shmb_error_set(
            err, -EEXIST,
            "%s/%s exists and is not a shmbroker segment; remove it, or "
            "choose another --name.",
            cfg->shm_dir, cfg->name);
    case SEGMENT_ORPHANED:
        break;
    }
    d->adopt_pid = pid;
    if (cfg->fresh) {
        d->replace = true;
        return segment_check_replace(cfg->shm_dir, cfg->name, size, err);
    }
    d->adopt = true;
    rc = segment_check_adoptable(cfg->shm_dir, cfg->name, size, err);
    return rc < 0 ? rc : 0;
}

/* --fresh, once every check has passed: remove the segment left by a daemon
 * that is gone. */
static int daemon_remove_segment(struct daemon *d, struct shmb_error *err)
{
    const struct config *cfg = &d->cfg;
    char path[PATH_MAX + NAME_MAX + 2];

    snprintf(path, sizeof(path), "%s/%s", cfg->shm_dir, cfg->name);
    if (unlink(path) != 0 && errno != ENOENT)
        return shmb_error_set(err, -errno, "Cannot remove stale segment %s: %s.", path,
                              strerror(errno));
    log_info("removed segment %s left by shmbrokerd pid %lld, which is gone (--fresh)",
             path, (long long)d->adopt_pid);
    return 0;
}

/* Bring back the objects of a segment left by a daemon that died. */
static int daemon_adopt(struct daemon *d, const struct store_config *scfg, uint64_t size,
                        struct shmb_error *err)
{
    struct store_adopt_report report;
    char h1[32];
    int rc;

    if ((rc = segment_adopt(&d->seg, d->cfg.shm_dir, d->cfg.name, size, err)) < 0)
        return rc;
    if (d->seg.adopt_note[0] != '\0')
        log_warn("segment %s: %s", d->seg.path, d->seg.adopt_note);
    /* The guard before the walk: a client may shrink the file while the
     * daemon reads the chunk headers (they are read through segment_load). */
    if ((rc = segment_guard_watch(&d->seg, daemon_on_segment_broken, err)) < 0) {
        segment_close(&d->seg);
        return rc;
    }
    /* Only private values: the data area's place and size come from the
     * file's size (segment_adopt), never from the header page, which a client
     * may change during the restart; store_adopt reads the ring cursor once
     * and ring_adopt copies every chunk header before checking it. */
    d->store = store_adopt(segment_data(&d->seg), d->seg.data_offset, d->seg.data_size,
                           d->seg.hdr, scfg, &report, err);
    if (d->store == NULL) {
        segment_close(&d->seg);
        return err->code;
    }
    if (report.corrupt)
        log_warn("segment %s: %s", d->seg.path, report.message);
    log_info(
        "adopted segment %s left by shmbrokerd pid %lld: restored %llu objects (%s); "
        "dropped %llu uncommitted, %llu freed and %llu invalid chunks",
        d->seg.path, (long long)d->adopt_pid, (unsigned long long)report.restored,
        shmb_format_bytes(report.restored_bytes, h1, sizeof(h1)),
        (unsigned long long)report.dropped_pending,
        (unsigned long long)report.dropped_free,
        (unsigned long long)report.dropped_invalid);
    return 0;
}

/* Keys of the adopted objects whose bytes run past a truncation point. */
struct daemon_lost {
    uint64_t end; /* the file's size when it was found truncated */
    struct {
        char *key;
        size_t len;
    } *keys;
    size_t n, cap;
    bool oom;
};

/* store_list callback: collect an object that ends past lost->end. */
static int daemon_collect_lost(const struct store_entry *e, void *arg)
{
    struct daemon_lost *lost = arg;
    void *grown;

    if (e->offset + e->size <= lost->end)
        return 0;
    if (lost->n == lost->cap) {
        size_t cap = lost->cap ? lost->cap * 2 : 16;

        if ((grown = shmb_realloc(lost->keys, cap * sizeof(*lost->keys))) == NULL) {
            lost->oom = true;
            return 1;
        }
        lost->keys = grown;
        lost->cap = cap;
    }
    lost->keys[lost->n].len = e->key_len;
    if ((lost->keys[lost->n].key = shmb_strndup(e->key, e->key_len)) == NULL) {
        lost->oom = true;
        return 1;
    }
    lost->n++;
    return 0;
}

/* After adopting a segment a client had truncated (and segment_regrow grew
 * back): an object whose header survived but whose bytes ran past the cut
 * now reads as zeros; drop it rather than serve it. */
static void daemon_drop_truncated(struct daemon *d, uint64_t truncated_at)
{
    struct daemon_lost lost = {.end = truncated_at};
    size_t i;

    if (truncated_at == UINT64_MAX)
        return;
    store_list(d->store, "", 0, SIZE_MAX, daemon_collect_lost, &lost);
    for (i = 0; i < lost.n; i++) {
        log_warn("object '%.*s' dropped: its bytes ran past the %llu bytes left of the "
                 "truncated segment",
                 (int)lost.keys[i].len, lost.keys[i].key, (unsigned long long)truncated_at);
        store_delete(d->store, lost.keys[i].key, lost.keys[i].len, NULL);
        shmb_free(lost.keys[i].key);
    }
    shmb_free(lost.keys);
    if (lost.oom)
        log_error("out of memory listing the objects past the truncation point; some "
                  "may read as zeros");
}

/* Before the loop sleeps: arm the expiry timer for the deadline of the
 * oldest pending allocation, or stop it when nothing can expire, so that an
 * idle daemon is not woken at all. Re-armed only when that deadline moved. */
static void daemon_on_expiry_arm(uv_prepare_t *handle)
{
    struct daemon *d = handle->data;
    uint64_t oldest = store_oldest_pending_ms(d->store), due, now;

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
    uv_timer_t *timers[] = {&d->expiry, &d->status, &d->watchdog};
    uv_signal_t *signals[] = {&d->sigterm, &d->sigint, &d->sighup};
    uv_handle_t *made[7];
    size_t n = 0, i;
    int rc = uv_prepare_init(&d->loop, &d->expiry_arm);

    if (rc == 0)
        made[n++] = (uv_handle_t *)&d->expiry_arm;
    for (i = 0; rc == 0 && i < 3; i++)
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
        (rc = uv_signal_start(&d->sighup, daemon_on_sighup, SIGHUP)) == 0) {
        uv_unref((uv_handle_t *)&d->expiry_arm);
        return 0;
    }
    while (n > 0)
        uv_close(made[--n], NULL);
    return shmb_error_set(err, -EIO, "Cannot set up the event loop's handles: %s.",
                          uv_strerror(rc));
}

/* The checks of the settings alone, before anything is looked at: the
 * segment's size (in *size: whole pages, whole huge pages on a hugetlbfs
 * --shm-dir), its name, the largest object. Also --check-config's. */
static int daemon_check_settings(const struct config *cfg, uint64_t *size,
                                 struct shmb_error *err)
{
    uint64_t page;
    char h1[32];
    int rc;

    *size = segment_round_size(cfg->size);
    if (*size < SEGMENT_MIN_SIZE)
        return shmb_error_set(err, -EINVAL,
                              "--size %llu is too small: the segment needs at least %u "
                              "bytes (a header page and a data page).",
                              (unsigned long long)cfg->size, SEGMENT_MIN_SIZE);
    /* A hugetlbfs file is a whole number of huge pages. */
    page = segment_page_size(cfg->shm_dir);
    if (page != SHMB_HEADER_PAGE && *size % page != 0) {
        uint64_t rounded = segment_round_to(*size, page);

        if (rounded == 0)
            return shmb_error_set(err, -EINVAL, "--size %llu is too large.",
                                  (unsigned long long)cfg->size);
        log_info("--size %llu rounded up to %llu bytes: %s is a hugetlbfs mount with "
                 "%s pages",
                 (unsigned long long)cfg->size, (unsigned long long)rounded, cfg->shm_dir,
                 shmb_format_bytes(page, h1, sizeof(h1)));
        *size = rounded;
    }
    if ((rc = segment_check_name(cfg->name, err)) < 0)
        return rc;
    return store_check_max_object(segment_data_size(*size), cfg->max_object_size, err);
}

/* Everything before the loop: probe, segment, store, listener. */
static int daemon_start(struct daemon *d, struct shmb_error *err)
{
    struct store_config scfg = {
        .max_object_size = d->cfg.max_object_size,
        .read_lease_ms = d->cfg.read_lease_ms,
        .lease_expired = daemon_on_lease_expired,
        .lease_arg = d,
    };
    uint64_t size, truncated_at = UINT64_MAX;
    char h1[32], h2[32], h3[32];
    int listen_fd = d->activated_fd; /* main took it from systemd, or -1 */
    int stale = 0, rc;

    if ((rc = daemon_check_settings(&d->cfg, &size, err)) < 0)
        return rc;
    /* Every check before any change: a refused start leaves the socket and
     * the segment as they were. */
    if ((rc = daemon_open_stop_with(d, err)) < 0)
        return rc;
    if (!d->activated && (stale = server_probe(d->cfg.socket_path, err)) < 0)
        return stale;
    if ((rc = daemon_check_segment(d, size, err)) < 0)
        return rc;
    if (stale == 1 && (rc = server_remove_stale(d->cfg.socket_path, err)) < 0)
        return rc;
    /* The socket before the segment: a path that cannot be bound refuses the
     * start before --fresh removes anything. */
    if (!d->activated &&
        (rc = server_bind(d->cfg.socket_path, d->cfg.socket_mode, &listen_fd, err)) < 0)
        return rc;
    if (d->replace && (rc = daemon_remove_segment(d, err)) < 0)
        goto fail_socket;
    if (d->adopt) {
        if ((rc = daemon_adopt(d, &scfg, size, err)) < 0)
            goto fail_socket;
        if (d->seg.resized_from != 0)
            log_warn("segment %s had been %s by a client to %llu bytes; %s back to its "
                     "%llu bytes (objects in a lost part are gone)",
                     d->seg.path, d->seg.resized_from < size ? "truncated" : "grown",
                     (unsigned long long)d->seg.resized_from,
                     d->seg.resized_from < size ? "grown" : "truncated",
                     (unsigned long long)size);
        if (d->seg.resized_from != 0 && d->seg.resized_from < size)
            truncated_at = d->seg.resized_from;
        daemon_drop_truncated(d, truncated_at);
    } else {
        if ((rc = segment_create(&d->seg, d->cfg.shm_dir, d->cfg.name, size, err)) < 0)
            goto fail_socket;
        if ((rc = segment_guard_watch(&d->seg, daemon_on_segment_broken, err)) < 0) {
            segment_destroy(&d->seg);
            goto fail_socket;
        }
        d->store = store_new(segment_data(&d->seg), d->seg.data_offset,
                             d->seg.data_size, d->seg.hdr, &scfg, err);
        if (d->store == NULL) {
            segment_destroy(&d->seg);
            rc = err->code;
            goto fail_socket;
        }
    }
    command_env_init(&d->env);
    d->env.store = d->store;
    d->env.segment = &d->seg;
    d->env.shm_dir = d->cfg.shm_dir;
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
    if (d->activated)
        log_info("serving the listening socket systemd passed (fd 3): %s", d->server.path);
    if (d->notify) {
        uint64_t wd = notify_watchdog_usec() / 2000; /* half the interval, in ms */

        uv_timer_start(&d->status, daemon_on_status, 1000, 1000);
        if (wd > 0)
            uv_timer_start(&d->watchdog, daemon_on_watchdog, wd, wd);
    }
    log_info(
        "shmbrokerd %s ready: segment %s (%s, %s for data, max object %s), socket %s",
        SHMB_VERSION, d->seg.path, shmb_format_bytes(d->seg.size, h1, sizeof(h1)),
        shmb_format_bytes(d->seg.data_size, h2, sizeof(h2)),
        shmb_format_bytes(d->cfg.max_object_size, h3, sizeof(h3)), d->server.path);
    /* Ready only now: the segment is reserved and the listener is up. */
    notify_send("READY=1\nSTATUS=serving %s on %s", d->seg.path, d->server.path);
    return 0;

fail_loop:
    uv_run(&d->loop, UV_RUN_NOWAIT);
    uv_loop_close(&d->loop);
fail:
    store_free(d->store);
    d->store = NULL;
    /* An adopted segment holds objects committed before the crash: keep it
     * for the next attempt. A new one goes. */
    if (d->adopt)
        segment_close(&d->seg);
    else
        segment_destroy(&d->seg);
fail_socket:
    if (!d->activated)
        server_unbind(listen_fd, d->cfg.socket_path);
    if (d->stop_with_fd >= 0)
        close(d->stop_with_fd); /* opened, never watched (a watched one closed above) */
    return rc;
}

/* After the loop: close what is left, remove the segment (or, with
 * --keep-segment, leave it and its committed objects to the next start). */
static void daemon_stop(struct daemon *d)
{
    struct store_stats st;
    char used[32];

    uv_run(&d->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&d->loop) != 0)
        log_warn("event loop closed with handles still open");
    store_counts(d->store, &st);
    store_free(d->store);
    if (d->cfg.keep_segment) {
        segment_close(&d->seg);
        log_info("stopped; segment %s kept with %llu objects (%s) for the next start to "
                 "adopt (--keep-segment)%s",
                 d->seg.path, (unsigned long long)st.objects,
                 shmb_format_bytes(st.used, used, sizeof(used)),
                 d->activated ? "; the socket stays with systemd" : "");
        return;
    }
    segment_destroy(&d->seg);
    if (d->activated)
        log_info("stopped; segment removed (the socket %s stays with systemd)",
                 d->server.path);
    else
        log_info("stopped; socket %s and segment removed", d->server.path);
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
 * signal, so that a stale pid does not hang up something else. */
static int daemon_send_reload(const struct config *cfg, pid_t pid)
{
    struct shmb_error err = {0};
    char path[64], comm[32] = "";
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
    /* The name is anyone's to choose: the proof is the segment's lock. */
    else if (!segment_locked_by(cfg->shm_dir, cfg->name, pid))
        shmb_error_set(&err, -EPERM,
                       "--reload %d: that process does not hold the lock of segment %s/%s: "
                       "it is not the shmbrokerd these settings name (--name, --shm-dir); "
                       "nothing sent.",
                       (int)pid, cfg->shm_dir, cfg->name);
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

/* --remove-segment: remove the segment these settings name, when no daemon
 * holds it (what systemctl stop shmbrokerd.socket runs). */
static int daemon_remove_segment_only(const struct config *cfg)
{
    struct shmb_error err = {0};
    uint64_t bytes, size;
    int64_t pid = 0;
    char human[32];
    int rc = daemon_check_settings(cfg, &size, &err);

    if (rc == 0)
        rc = segment_remove_orphaned(cfg->shm_dir, cfg->name, size, &bytes, &pid, &err);
    if (rc < 0) {
        log_startup_error(err.message);
        return 1;
    }
    if (rc == 0)
        printf("shmbrokerd: no segment %s/%s; nothing to remove\n", cfg->shm_dir,
               cfg->name);
    else
        printf("shmbrokerd: removed segment %s/%s (%s) left by shmbrokerd pid %lld\n",
               cfg->shm_dir, cfg->name, shmb_format_bytes(bytes, human, sizeof(human)),
               (long long)pid);
    return 0;
}

int main(int argc, char **argv)
{
    static struct daemon d = {.stop_with_fd = -1, .activated_fd = -1};
    struct shmb_error err = {0};
    int rc;

    d.notify = notify_init();
    log_detect_journal();
    switch (config_parse(&d.cfg, argc, argv, &err)) {
    case CONFIG_EXIT_OK:
        return 0;
    case CONFIG_EXIT_USAGE:
        log_startup_error(err.message);
        if (server_activated_fd(&d.activated_fd, NULL) != 1)
            d.activated_fd = -1;
        daemon_refuse_start(&d, &err);
        return 2;
    case CONFIG_RUN:
        break;
    }
    switch (d.cfg.mode) {
    case CONFIG_SERVE:
        break;
    case CONFIG_CHECK:
    case CONFIG_RELOAD: {
        uint64_t size;

        if (daemon_check_settings(&d.cfg, &size, &err) < 0) {
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
    case CONFIG_SIZING:
        return sizing_report(&d.cfg, stdout);
    }
    log_active_level = d.cfg.log_level;
    d.argc = argc;
    d.argv = argv;
    signal(SIGPIPE, SIG_IGN);
    json_set_alloc_funcs(shmb_malloc, shmb_free);
    /* systemd's socket first: a start refused from here on answers the
     * clients already waiting on it. */
    if ((rc = server_activated_fd(&d.activated_fd, &err)) < 0) {
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
