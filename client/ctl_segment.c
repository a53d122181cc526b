// SPDX-License-Identifier: Apache-2.0
/*
 * status from the segment's header page, when the daemon does not answer
 * or --from-segment asks: which file is the daemon's (never another
 * daemon's in silence) and its published figures. Asks the daemon nothing.
 */
#include "ctl_segment.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../proto/error.h"
#include "../proto/protocol.h"
#include "../proto/text.h"
#include "report_segment.h"

/* The segment status reads, as segment_find found it. */
struct ctl_segment {
    char path[PATH_MAX];
    char why[512]; /* how it was found, for the reader to judge */
    bool by_owner; /* its header names the daemon listening at the socket */
};

/* Segments one directory may hold for status to choose from: a daemon has
 * at most one per pool. */
#define CTL_SEGMENTS_MAX 64

/* Whether segment file name is pool's: named after it (a daemon without
 * --pool names its one pool after --name), or --name.POOL. */
static bool segment_of_pool(const char *name, const char *pool)
{
    size_t n = strlen(name), p = strlen(pool);

    return strcmp(name, pool) == 0 ||
           (n > p + 1 && name[n - p - 1] == '.' && strcmp(name + n - p, pool) == 0);
}

/* Which segments a scan keeps: pool's (all without), and with owner > 0
 * only those whose header names that pid as their daemon, in a file of
 * owner_uid's that no one else may open, as a daemon makes its segment:
 * anyone may copy a header (and the pid in it) into a file of their own. */
struct ctl_segment_filter {
    const char *pool;
    long owner;
    uint32_t owner_uid;
};

static bool segment_keep(const char *name, const struct shmb_segment_report *rep,
                         void *arg)
{
    const struct ctl_segment_filter *f = arg;

    return (f->pool == NULL || segment_of_pool(name, f->pool)) &&
           (f->owner <= 0 ||
            ((rep->owner_pid == f->owner || rep->counters.pid == f->owner) &&
             rep->file_uid == f->owner_uid && (rep->file_mode & 077) == 0));
}

/* The names of found[0..n), for a message: "a, b and c" (and how many more
 * when total is larger). */
static const char *segment_names(const struct shmb_segment_found *found, size_t n,
                                 size_t total, char *buf, size_t len)
{
    static char e[ESC_MAX];
    size_t i, used = 0;

    buf[0] = '\0';
    for (i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s",
                                 i == 0                     ? ""
                                 : i + 1 == n && n == total ? " and "
                                                            : ", ",
                                 esc(found[i].name, e, ESC_MAX));
    if (total > n && used < len)
        snprintf(buf + used, len - used, " and %zu more", total - n);
    return buf;
}

/* The segment file status reads. Named (--name, with ".POOL" for --pool),
 * that one. Else it is found in --shm-dir (/dev/shm) by what its header
 * says: the segment whose owner is the daemon listening at the socket (the
 * kernel tells its pid without the daemon answering), of --pool's name
 * when given; when no daemon listening there owns one (none listens, or
 * systemd does for a socket-activated daemon), the default name's, else
 * the only one of that pool. Never another daemon's in silence: out->why
 * says how it was chosen. 0, or the exit status with the reason printed
 * (unless quiet): 66 for none, 2 when several fit and a flag must choose. */
static int segment_find(const struct ctl *ctl, struct ctl_segment *out, bool quiet)
{
    static struct shmb_segment_found found[CTL_SEGMENTS_MAX];
    static char e[2][ESC_MAX], names[ESC_MAX];
    const char *dir = ctl->shm_dir != NULL ? ctl->shm_dir : CTL_DEFAULT_SHM_DIR;
    const char *sock = shmb_socket_path(ctl->socket_path);
    struct ctl_segment_filter filter = {ctl->pool, 0, 0};
    struct shmb_segment_report rep;
    struct shmb_error err;
    size_t n = 0;
    bool by_name = false;
    int len;

    memset(out, 0, sizeof(*out));
    if (ctl->name != NULL) {
        len = ctl->pool != NULL
                  ? snprintf(out->path, sizeof(out->path), "%s/%s.%s", dir, ctl->name,
                             ctl->pool)
                  : snprintf(out->path, sizeof(out->path), "%s/%s", dir, ctl->name);
        if (len < 0 || (size_t)len >= sizeof(out->path)) {
            if (!quiet)
                fprintf(stderr,
                        "shmbrokerctl: the segment path --shm-dir/--name is longer than "
                        "%zu bytes\n",
                        sizeof(out->path) - 1);
            return EXIT_USAGE;
        }
        snprintf(out->why, sizeof(out->why), "named by --name%s",
                 ctl->pool != NULL ? " and --pool" : "");
        return 0;
    }
    shmb_error_clear(&err);
    filter.owner = shmb_socket_listener_pid(sock, &filter.owner_uid);
    if (filter.owner > 0 && shmb_segment_scan(dir, segment_keep, &filter, found,
                                              CTL_SEGMENTS_MAX, &n, &err) < 0)
        goto unreadable;
    out->by_owner = n > 0;
    if (n == 0) {
        /* The default name's, as the daemon's default flags name it. */
        len = ctl->pool != NULL ? snprintf(out->path, sizeof(out->path), "%s/%s.%s", dir,
                                           CTL_DEFAULT_NAME, ctl->pool)
                                : snprintf(out->path, sizeof(out->path), "%s/%s", dir,
                                           CTL_DEFAULT_NAME);
        by_name = len > 0 && (size_t)len < sizeof(out->path) &&
                  shmb_segment_report_read(out->path, &rep, &err) == 0;
        shmb_error_clear(&err);
        filter.owner = 0;
        if (!by_name && shmb_segment_scan(dir, segment_keep, &filter, found,
                                          CTL_SEGMENTS_MAX, &n, &err) < 0)
            goto unreadable;
    }
    if (!by_name && n == 0) {
        if (!quiet)
            fprintf(
                stderr,
                "shmbrokerctl: no shmbroker segment%s%s in %s is the daemon's listening "
                "at "
                "%s (a memfd pool, or segments in another --shm-dir: name the segment "
                "with --shm-dir and --name)\n",
                ctl->pool != NULL ? " of pool " : "",
                ctl->pool != NULL ? esc(ctl->pool, names, ESC_MAX) : "",
                esc(dir, e[0], ESC_MAX), esc(sock, e[1], ESC_MAX));
        return EXIT_NO_INPUT;
    }
    if (!by_name && n > 1) {
        if (!quiet)
            fprintf(stderr,
                    "shmbrokerctl: %zu segments in %s fit: %s (%s); choose one with %s\n",
                    n, esc(dir, e[0], ESC_MAX),
                    segment_names(found, n < CTL_SEGMENTS_MAX ? n : CTL_SEGMENTS_MAX, n,
                                  names, sizeof(names)),
                    out->by_owner ? "the pools of the daemon listening at the socket"
                                  : "no daemon listening at the socket owns one",
                    out->by_owner ? "--pool NAME" : "--name (and --pool)");
        return EXIT_USAGE;
    }
    if (!by_name)
        snprintf(out->path, sizeof(out->path), "%s/%s", dir, found[0].name);
    if (out->by_owner)
        snprintf(out->why, sizeof(out->why),
                 "the segment of the shmbrokerd listening at %s (pid %ld)",
                 esc(sock, e[0], ESC_MAX), filter.owner);
    else
        snprintf(out->why, sizeof(out->why),
                 "%s: no daemon listening at %s owns a segment here to say which is its "
                 "(name one with --name)",
                 by_name ? "by its default name" : "the only one that fits",
                 esc(sock, e[0], ESC_MAX));
    return 0;

unreadable:
    if (!quiet)
        fprintf(stderr, "shmbrokerctl: %s\n", esc(err.message, e[0], ESC_MAX));
    return EXIT_NO_INPUT;
}

/* A wall-clock time in milliseconds as "2026-12-01 09:00:00 UTC". */
static const char *format_unix_ms(uint64_t ms, char *buf, size_t len)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;

    if (gmtime_r(&t, &tm) == NULL ||
        strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
        snprintf(buf, len, "%llu ms after the epoch", (unsigned long long)ms);
    return buf;
}

/* status from the segment's header page: who wrote it and how long ago it
 * last beat, then the counters it published with that beat. The exit
 * status: 0 when asked to (--from-segment), 3 when the daemon did not
 * answer, 2 for a file that is not a segment of this layout, 66 when there
 * is none to read. */
int print_segment_status(const struct ctl *ctl, enum ctl_segment_why why)
{
    static char e[ESC_MAX];
    struct shmb_segment_report rep;
    const struct shmb_published_counters *pc = &rep.counters;
    struct shmb_error err;
    struct timespec now;
    static struct ctl_segment seg;
    const char *path = seg.path;
    char when[64], b[2][32];
    double age;
    int64_t pid;
    int rc;

    if ((rc = segment_find(ctl, &seg, false)) != 0)
        return rc;
    shmb_error_clear(&err);
    if ((rc = shmb_segment_report_read(path, &rep, &err)) < 0) {
        fprintf(stderr, "shmbrokerctl: %s\n", esc(err.message, e, ESC_MAX));
        return rc == -EINVAL || rc == -EPROTO ? EXIT_USAGE : EXIT_NO_INPUT;
    }
    clock_gettime(CLOCK_REALTIME, &now);
    age = ((double)now.tv_sec * 1000.0 + (double)now.tv_nsec / 1e6 -
           (double)rep.heartbeat_unix_ms) /
          1000.0;
    pid = pc->pid;
    if (rep.heartbeat_unix_ms == 0)
        printf(
            "shmbrokerd (pid %lld)%s: no heartbeat in its segment yet (it beats once at "
            "start, then every second)\n",
            (long long)rep.owner_pid,
            why == CTL_SEG_NO_ANSWER ? " is not answering" : "");
    else if (pid == 0)
        printf("shmbrokerd stopped at %s (%.1f s ago): figures as of its stop\n",
               format_unix_ms(rep.heartbeat_unix_ms, when, sizeof(when)), age);
    else
        printf("shmbrokerd (pid %lld)%s: last heartbeat %.1f s ago%s\n", (long long)pid,
               why == CTL_SEG_NO_ANSWER ? " is not answering" : "", age,
               why == CTL_SEG_ASKED ? " (read from the segment; the daemon was not asked)"
                                    : "");
    if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        printf("          no process %lld any more: it died without a clean stop\n",
               (long long)pid);
    printf("segment   %s: %s (%s for data), layout %d\n", esc(path, e, ESC_MAX),
           shmb_format_bytes(rep.total_size, b[0], sizeof(b[0])),
           shmb_format_bytes(rep.data_size, b[1], sizeof(b[1])), SHMB_LAYOUT_VERSION);
    printf("          %s\n", seg.why);
    if (rep.heartbeat_unix_ms == 0) {
        printf("counters  none published\n");
        return why == CTL_SEG_ASKED ? 0 : EXIT_NOT_ANSWERING;
    }
    print_used(pc->used, pc->data_size, pc->free);
    printf("objects   %llu committed, %llu pending, %llu pinned\n",
           (unsigned long long)pc->objects, (unsigned long long)pc->pending,
           (unsigned long long)pc->pinned);
    printf("clients   %u\n", pc->clients);
    printf("arenas    %llu held, %s unused\n", (unsigned long long)pc->arenas,
           shmb_format_bytes(pc->arena_bytes, b[0], sizeof(b[0])));
    printf("counters  %llu allocs, %llu commits, %llu gets, %llu evictions, %llu ENOSPC, "
           "%llu fast reads\n",
           (unsigned long long)pc->allocs, (unsigned long long)pc->commits,
           (unsigned long long)pc->gets, (unsigned long long)pc->evictions,
           (unsigned long long)pc->enospc, (unsigned long long)pc->fast_reads);
    printf("expired   %llu allocations, %llu leases\n",
           (unsigned long long)pc->expired_allocs,
           (unsigned long long)pc->lease_expiries);
    printf("catalog   %llu slots, %u objects not listed\n",
           (unsigned long long)rep.catalog_slots, rep.catalog_unlisted);
    printf("as of     heartbeat %llu at %s (every %u ms)\n",
           (unsigned long long)rep.heartbeat_count,
           format_unix_ms(rep.heartbeat_unix_ms, when, sizeof(when)),
           rep.heartbeat_period_ms);
    if (!rep.counters_settled)
        printf("          the daemon stopped while writing these counters (seq %u): they "
               "may not add up\n",
               pc->seq);
    return why == CTL_SEG_ASKED ? 0 : EXIT_NOT_ANSWERING;
}

/* Whether the daemon's segment is there for status to read. A segment
 * named (--name, --shm-dir), the one whose header names the daemon
 * listening at the socket, or the default one when the socket is the
 * default one too: a daemon on a socket of its own has a segment of its
 * own, and another daemon's figures would mislead. */
bool segment_exists(const struct ctl *ctl)
{
    const char *env = getenv(SHMB_SOCKET_ENV);
    struct ctl_segment seg;
    struct stat st;

    if (segment_find(ctl, &seg, true) != 0 || stat(seg.path, &st) != 0)
        return false;
    return seg.by_owner || ctl->name != NULL || ctl->shm_dir != NULL ||
           (ctl->socket_path == NULL && (env == NULL || env[0] == '\0'));
}
