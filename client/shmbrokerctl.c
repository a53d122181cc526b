// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerctl: look inside a running shmbrokerd and move files in and out of
 * it. A client of libshmbroker like any other: a table of commands, each of
 * which only formats what the library returns; it reads no wire field.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../proto/error.h"
#include "../proto/names.h"
#include "../proto/protocol.h"
#include "../proto/starting.h"
#include "../proto/text.h"
#include "../proto/utf8.h"
#include "shmbroker.h"
#include "report.h"

#define EXIT_ERROR_REPLY 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 69 /* sysexits.h EX_UNAVAILABLE */
/* A local file, not the daemon, failed: sysexits.h's codes for each case, so
 * that a script can tell them from a refusal (1). */
#define EXIT_NO_INPUT 66   /* EX_NOINPUT: the input file cannot be opened */
#define EXIT_CANT_CREATE 73 /* EX_CANTCREAT: the output file cannot be created */
#define EXIT_IO_ERROR 74   /* EX_IOERR: reading or writing a file failed */
/* status read the figures from the segment because the daemon did not
 * answer: not a success, and not "unreachable" (69) either, since the
 * figures were printed. */
#define EXIT_NOT_ANSWERING 3

/* shmbrokerd's defaults for --name and --shm-dir (proto/protocol.h): where
 * its segment is, for status to read when the daemon does not answer. */
#define CTL_DEFAULT_NAME SHMB_DEFAULT_NAME
#define CTL_DEFAULT_SHM_DIR SHMB_DEFAULT_SHM_DIR
/* How long status waits for the daemon's first answer before it reads the
 * segment instead: a daemon answers stats in microseconds, even loaded. */
#define CTL_DEFAULT_TIMEOUT_S 5

/* What the command line asked for, as the handlers need it. */
struct ctl {
    const char *socket_path;
    const char *pool;      /* --pool NAME (global, or status's own), NULL without */
    const char *name;      /* --name: the daemon's segment name */
    const char *shm_dir;   /* --shm-dir: where its segment is */
    int json, prometheus;  /* status --json, --prometheus */
    int from_segment;      /* status --from-segment */
    unsigned long timeout; /* status --timeout SECONDS */
    unsigned long watch;   /* status --watch SECONDS, 0 without */
    char **args;           /* the command's arguments, after any "--" */
    int nargs;
    char *put_data;        /* put's input, read before connecting */
    size_t put_len;
};

/* One command of the ctl, as tmux's cmd_entry: a row of ctl_cmds below. */
struct ctl_cmd {
    const char *name;
    int min_args, max_args;
    /* Before connecting: parse the command's own options (status), or check
     * its arguments and read its input (0, or the exit status). */
    int (*options)(struct ctl *ctl, int argc, char **argv);
    int (*prepare)(struct ctl *ctl);
    int (*run)(shmb_t *c, struct ctl *ctl); /* the exit status */
    const char *usage, *help;
};

static void usage(FILE *out);

/* The socket the ctl talks to, for messages. */
static const char *ctl_socket;

/* s made safe for a terminal (control bytes and invalid UTF-8 as \xNN) in
 * buf; returns buf. Keys and names come from other clients: printed raw,
 * they could clear the screen, retitle the window or forge table rows. */
static char *esc(const char *s, char *buf, size_t len)
{
    return shmb_escape(s != NULL ? s : "", s != NULL ? strlen(s) : 0, buf, len);
}

/* Room for any escaped string the daemon sends (a key, a path). */
#define ESC_MAX SHMB_ESCAPED_MAX(4096)

/* Print the daemon's (or the library's) error and return the exit status:
 * 69 when the connection was lost (the daemon exited or restarted). */
static int fail(shmb_t *c)
{
    static char buf[SHMB_ESCAPED_MAX(1024)];

    if (shmb_errcode(c) == -ECONNRESET || shmb_errcode(c) == -ENOTCONN) {
        fprintf(stderr,
                "shmbrokerctl: lost the connection to shmbrokerd at %s (the daemon exited "
                "or restarted); run the command again once it is back\n",
                esc(shmb_socket_path(ctl_socket), buf, sizeof(buf)));
        return EXIT_UNAVAILABLE;
    }
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_errname(c),
            esc(shmb_errmsg(c), buf, sizeof(buf)));
    return EXIT_ERROR_REPLY;
}

/* A key the ctl refuses itself (not 1 to 255 bytes of UTF-8): usage. */
static int check_key_arg(const char *key)
{
    struct shmb_error err;

    if (shmb_key_check(key, strlen(key), &err) == 0)
        return 0;
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_strerror(err.code), err.message);
    return EXIT_USAGE;
}

/* "2h 03m", "45s". */
static const char *format_uptime(unsigned long long s, char *buf, size_t len)
{
    if (s >= 86400)
        snprintf(buf, len, "%llud %02lluh", s / 86400, s % 86400 / 3600);
    else if (s >= 3600)
        snprintf(buf, len, "%lluh %02llum", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, len, "%llum %02llus", s / 60, s % 60);
    else
        snprintf(buf, len, "%llus", s);
    return buf;
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static const char *prom_label(const char *s, char *buf, size_t len)
{
    size_t o = 0;

    for (; *s != '\0' && o + 3 < len; s++) {
        if (*s == '\\' || *s == '"' || *s == '\n') {
            buf[o++] = '\\';
            buf[o++] = *s == '\n' ? 'n' : *s;
        } else {
            buf[o++] = *s;
        }
    }
    buf[o] = '\0';
    return buf;
}

/* A metric's # HELP and # TYPE lines. */
static void prom_head(FILE *out, const char *metric, const char *type, const char *help)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", metric, help, metric, type);
}

/* shmbroker_up: whether the daemon answered this scrape. With 0 it is the
 * whole exposition: the last file's figures must not live on in a
 * textfile collector as if they were current. */
static void prom_up(FILE *out, int up)
{
    prom_head(out, "shmbroker_up", "gauge",
              "1 when shmbrokerd answered this scrape, 0 when it did not.");
    fprintf(out, "shmbroker_up %d\n", up);
}

/* The broadcast queues, with their seats when seats, or NULL with the
 * error reported: none from a daemon that has no queues (ENOSYS). The
 * caller frees the list. */
static shmb_queue_list_t *queues_of(shmb_t *c, bool seats, int *rc)
{
    shmb_queue_list_t *list = NULL;

    *rc = 0;
    if ((seats ? shmb_queue_list(c, &list) : shmb_queue_summary(c, &list)) < 0 &&
        shmb_errcode(c) != -ENOSYS)
        *rc = fail(c);
    return list;
}

/* Whether queue q is shown: every pool's, or pool's only. */
static bool queue_shown(const shmb_queue_info_t *q, const char *pool)
{
    return pool == NULL || strcmp(q->pool, pool) == 0;
}

/* The queues' metrics, labelled pool="P",queue="Q" (seats: and state=...):
 * nothing when there is no queue, so that every metric named has samples.
 * A queue whose name its pool's group= hides from this user has no label
 * to tell it from another: it is left out. */
static int prometheus_queues(FILE *out, shmb_t *c, const char *pool)
{
    static const char *const states[] = {"live", "dead", "free"};
    static const struct {
        const char *metric, *type, *help;
    } metrics[] = {
        {"shmbroker_queue_messages_total", "counter",
         "Messages published to the queue since it was created."},
        {"shmbroker_queue_depth", "gauge",
         "Messages published that the slowest live reader has not read."},
        {"shmbroker_queue_seats", "gauge", "Reader seats of the queue, by state."},
        {"shmbroker_queue_writer_waiting", "gauge",
         "1 while the queue's writer waits for a free slot."},
    };
    shmb_queue_list_t *list;
    char lp[3 * 32 + 8], lq[3 * 32 + 8];
    size_t i, j, shown = 0;
    int rc, k;

    if ((list = queues_of(c, false, &rc)) == NULL)
        return rc;
    for (j = 0; j < list->count; j++)
        shown += queue_shown(&list->queues[j], pool) && list->queues[j].name[0] != '\0';
    for (i = 0; shown > 0 && i < sizeof(metrics) / sizeof(metrics[0]); i++) {
        prom_head(out, metrics[i].metric, metrics[i].type, metrics[i].help);
        for (j = 0; j < list->count; j++) {
            const shmb_queue_info_t *q = &list->queues[j];
            const uint32_t seats[] = {q->seats_live, q->seats_dead, q->seats_free};

            if (!queue_shown(q, pool) || q->name[0] == '\0')
                continue;
            prom_label(q->pool, lp, sizeof(lp));
            prom_label(q->name, lq, sizeof(lq));
            if (i == 2) {
                for (k = 0; k < 3; k++)
                    fprintf(out, "%s{pool=\"%s\",queue=\"%s\",state=\"%s\"} %u\n",
                            metrics[i].metric, lp, lq, states[k], seats[k]);
                continue;
            }
            fprintf(out, "%s{pool=\"%s\",queue=\"%s\"} %llu\n", metrics[i].metric, lp, lq,
                    (unsigned long long)(i == 0   ? q->messages
                                         : i == 1 ? q->depth
                                                  : (uint64_t)(q->writer_waiting != 0)));
        }
    }
    shmb_queue_list_free(list);
    return 0;
}

/* Who holds a role: "pid P 'NAME', client C" (escaped into buf), or "pid P (name
 * hidden), client C" when the pool's group= hides it (hidden). Pid 0 is a
 * process in a pid namespace the daemon cannot see into: said so. */
static const char *holder(int64_t pid, const char *name, int64_t client, bool hidden,
                          char *buf, size_t len)
{
    static char e[ESC_MAX];
    char p[48];

    if (pid == 0)
        snprintf(p, sizeof(p), "another pid namespace");
    else
        snprintf(p, sizeof(p), "pid %lld", (long long)pid);
    if (hidden) /* by the pool's group=, as the queue's own name */
        snprintf(buf, len, "%s (name hidden), client %lld", p, (long long)client);
    else
        snprintf(buf, len, "%s '%s', client %lld", p, esc(name, e, ESC_MAX),
                 (long long)client);
    return buf;
}

/* status, plain: the queues block (of pool only, when not NULL): a line
 * per queue, its writer, each seat (a dead one with the pid that died) and
 * the seat that holds the writer back. Nothing when there is no queue. */
static int print_queues(shmb_t *c, const char *pool)
{
    static char e[2][ESC_MAX], who[ESC_MAX + 64];
    shmb_queue_list_t *list;
    char b[2][32];
    size_t i, j, shown = 0;
    int rc;

    if ((list = queues_of(c, true, &rc)) == NULL)
        return rc;
    for (i = 0; i < list->count; i++)
        shown += queue_shown(&list->queues[i], pool);
    if (shown > 0)
        printf("\nqueues    %zu\n", shown);
    for (i = 0; i < list->count; i++) {
        const shmb_queue_info_t *q = &list->queues[i];
        /* A queue's name is never empty: "" is one its pool's group= hides,
         * and so are its members'. */
        bool hidden = q->name[0] == '\0';

        if (!queue_shown(q, pool))
            continue;
        printf("queue     %s (pool %s%s): %s, %llu slots of %s (%s), %llu messages, "
               "depth %llu\n",
               hidden ? "(name hidden)" : esc(q->name, e[0], ESC_MAX),
               esc(q->pool, e[1], ESC_MAX),
               q->temporary ? ", temporary" : "", q->state, (unsigned long long)q->slots,
               shmb_format_bytes(q->slot_size, b[0], sizeof(b[0])),
               shmb_format_bytes(q->size, b[1], sizeof(b[1])), (unsigned long long)q->messages,
               (unsigned long long)q->depth);
        if (q->has_writer)
            printf("  writer  %s%s\n",
                   holder(q->writer_pid, q->writer_name, q->writer_client, hidden, who,
                          sizeof(who)),
                   q->writer_waiting ? ", waiting for a free slot" : "");
        else
            printf("  writer  none\n");
        printf("  seats   %u live, %u dead, %u free; %u reader%s waiting\n", q->seats_live,
               q->seats_dead, q->seats_free, q->readers_waiting,
               q->readers_waiting == 1 ? "" : "s");
        for (j = 0; j < q->nseats; j++) {
            const shmb_queue_seat_info_t *s = &q->seat_list[j];

            if (strcmp(s->state, "live") == 0)
                printf("  seat %-2u live, %s, %llu behind\n", s->seat,
                       holder(s->pid, s->name, s->client, hidden, who, sizeof(who)),
                       (unsigned long long)s->behind);
            else if (strcmp(s->state, "dead") == 0)
                printf("  seat %-2u dead, %s: its connection closed without leaving the "
                       "seat; not waited for\n",
                       s->seat, holder(s->pid, s->name, s->client, hidden, who, sizeof(who)));
            else
                printf("  seat %-2u %s\n", s->seat, esc(s->state, e[0], ESC_MAX));
        }
        if (q->blocker_seat >= 0)
            printf("  blocker seat %d (%s) is %llu messages behind and holds the writer "
                   "back\n",
                   q->blocker_seat,
                   holder(q->blocker_pid, q->blocker_name, q->blocker_client, hidden,
                          who, sizeof(who)),
                   (unsigned long long)q->blocker_behind);
    }
    shmb_queue_list_free(list);
    return 0;
}

/* Where a metric's sample comes from. */
enum prom_scope {
    PROM_DAEMON, /* the daemon's own figure: one sample, no label */
    PROM_POOL,   /* a pool's figure: one sample per pool, pool="NAME" */
};

/* The metrics of status --prometheus besides shmbroker_up, shmbroker_info,
 * the counters of proto/stats.def (shmbroker_NAME_total, per pool but for
 * noreply_errors) and the queues' (prometheus_queues). Names follow
 * Prometheus's: the unit last (_bytes, _seconds), a count of things in the
 * plural, counters ending in _total. */
static const struct prom_metric {
    enum shmb_stat_id field;
    const char *metric, *help;
    enum prom_scope scope;
} prom_metrics[] = {
    {SHMB_STAT_SIZE, "shmbroker_segment_bytes", "Size of the segment, header included.",
     PROM_POOL},
    {SHMB_STAT_DATA_SIZE, "shmbroker_data_bytes", "Bytes of the data area.", PROM_POOL},
    {SHMB_STAT_USED, "shmbroker_used_bytes", "Bytes in use (objects, headers, gaps).",
     PROM_POOL},
    {SHMB_STAT_FREE, "shmbroker_free_bytes", "Bytes free in the data area.", PROM_POOL},
    {SHMB_STAT_OBJECTS, "shmbroker_objects", "Committed objects.", PROM_POOL},
    {SHMB_STAT_PENDING, "shmbroker_pending_objects", "Allocations not yet committed.",
     PROM_POOL},
    {SHMB_STAT_PINNED, "shmbroker_pinned_objects", "Objects pinned by a reader.",
     PROM_POOL},
    {SHMB_STAT_CLIENTS, "shmbroker_clients", "Connected clients.", PROM_DAEMON},
    {SHMB_STAT_CLIENTS, "shmbroker_pool_clients", "Clients connected to the pool.",
     PROM_POOL},
    {SHMB_STAT_MAX_OBJECT_SIZE, "shmbroker_max_object_bytes", "Largest object allowed.",
     PROM_POOL},
    {SHMB_STAT_SHM_DIR_FREE, "shmbroker_shm_dir_free_bytes",
     "Bytes free where the pool's segment lives (memory for a memfd pool).", PROM_POOL},
    {SHMB_STAT_UPTIME_S, "shmbroker_uptime_seconds", "Seconds since the daemon started.",
     PROM_DAEMON},
};

/* One metric's samples: the daemon's figure, or each pool's (with --pool,
 * that pool's only). */
static void prom_samples(FILE *out, const char *metric, enum shmb_stat_id field,
                         enum prom_scope scope, const shmb_stats_t *st,
                         const shmb_stats_t *pools, size_t n, bool one_pool)
{
    char label[3 * 32 + 8];
    size_t j;

    if (scope == PROM_DAEMON) {
        fprintf(out, "%s %lld\n", metric, (long long)shmb_stats_number(st, field));
        return;
    }
    for (j = 0; j < n; j++)
        if (!one_pool || strcmp(pools[j].pool, st->pool) == 0)
            fprintf(out, "%s{pool=\"%s\"} %lld\n", metric,
                    prom_label(pools[j].pool, label, sizeof(label)),
                    (long long)shmb_stats_number(&pools[j], field));
}

/* The stats in Prometheus's text exposition format into out: shmbroker_up
 * 1, shmbroker_info, the table above, every counter of proto/stats.def,
 * then the queues'. A figure of a pool has one sample per pool, labelled
 * pool="NAME" (one pool too, so that a dashboard does not change when a
 * second is added; with --pool, that pool only); the daemon's own (clients
 * in all, uptime, noreply errors) have no label. 0, or the exit status
 * with the error said. */
static int prom_write(FILE *out, shmb_t *c, const struct ctl *ctl)
{
    shmb_stats_t st, *pools = NULL;
    char name[128], help[160], label[3 * 32 + 8];
    size_t i, n = 0;
    int rc;

    if (shmb_stats(c, &st) < 0 || shmb_stats_pools(c, &pools, &n) < 0)
        return fail(c);
    prom_up(out, 1);
    prom_head(out, "shmbroker_info", "gauge",
              "Always 1: the daemon's version, and the segment layout and protocol "
              "versions this shmbrokerctl reads.");
    fprintf(out, "shmbroker_info{version=\"%s\",layout=\"%d\",protocol=\"%d\"} 1\n",
            prom_label(st.version, label, sizeof(label)), SHMB_LAYOUT_VERSION,
            SHMB_PROTOCOL_VERSION);
    for (i = 0; i < sizeof(prom_metrics) / sizeof(prom_metrics[0]); i++) {
        prom_head(out, prom_metrics[i].metric, "gauge", prom_metrics[i].help);
        prom_samples(out, prom_metrics[i].metric, prom_metrics[i].field,
                     prom_metrics[i].scope, &st, pools, n, ctl->pool != NULL);
    }
    for (i = 0; i < SHMB_STAT_COUNT; i++) {
        if (shmb_stat_fields[i].kind != SHMB_STATK_COUNTER)
            continue;
        snprintf(name, sizeof(name), "shmbroker_%s_total", shmb_stat_fields[i].name);
        snprintf(help, sizeof(help), "Count of %s since the daemon started.",
                 shmb_stat_fields[i].name);
        prom_head(out, name, "counter", help);
        /* Requests sent without awaiting their reply fail on a connection,
         * not in a pool. */
        prom_samples(out, name, (enum shmb_stat_id)i,
                     i == SHMB_STAT_NOREPLY_ERRORS ? PROM_DAEMON : PROM_POOL, &st, pools,
                     n, ctl->pool != NULL);
    }
    shmb_stats_pools_free(pools);
    rc = prometheus_queues(out, c, ctl->pool != NULL ? st.pool : NULL);
    return rc;
}

/* status --prometheus: the exposition is made whole before any of it is
 * written, so that a scrape that fails half way leaves no half file. */
static int print_prometheus(shmb_t *c, const struct ctl *ctl)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    int rc;

    if (out == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        return EXIT_ERROR_REPLY;
    }
    rc = prom_write(out, c, ctl);
    if (fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        rc = EXIT_ERROR_REPLY;
    }
    /* The daemon went away between the connect and the figures: it is
     * down for this scrape, as when it never answered. */
    if (rc == EXIT_UNAVAILABLE) {
        prom_up(stdout, 0);
        rc = 0;
    } else if (rc == 0 && fwrite(text, 1, len, stdout) != len) {
        rc = EXIT_IO_ERROR;
    }
    free(text);
    return rc;
}

/* The daemon's stats reply as it sent it (without the request's id). */
static int print_json(shmb_t *c)
{
    char *reply = NULL;

    if (shmb_stats_json(c, &reply) < 0)
        return fail(c);
    printf("%s\n", reply);
    free(reply);
    return 0;
}

/* The "used" line of status: a bar of 40, the share, used of data_size and
 * what is free. */
static void print_used(uint64_t used, uint64_t data_size, uint64_t free_bytes)
{
    char b[3][32], bar[41];
    double pct = data_size ? 100.0 * (double)used / (double)data_size : 0.0;
    int i, filled = (int)(pct * 40.0 / 100.0 + 0.5);

    for (i = 0; i < 40; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[40] = '\0';
    printf("used      [%s] %5.1f%%  %s of %s (%s free)\n", bar, pct,
           shmb_format_bytes(used, b[0], sizeof(b[0])),
           shmb_format_bytes(data_size, b[1], sizeof(b[1])),
           shmb_format_bytes(free_bytes, b[2], sizeof(b[2])));
}

/* One pool's figures in the status view: its name line (with_pool), its
 * segment, free space, bar, objects, clients (with_clients), counters and
 * blocker. */
static void print_pool(const shmb_stats_t *st, int with_pool, int with_clients)
{
    static char e[4][ESC_MAX];
    char b[4][32];
    int memfd = strcmp(st->backing, "memfd") == 0;

    if (with_pool)
        printf("pool      %s (%s%s%s)\n", esc(st->pool, e[0], ESC_MAX),
               st->backing[0] != '\0' ? esc(st->backing, e[1], ESC_MAX) : "shm",
               st->group[0] != '\0' ? ", group " : "", esc(st->group, e[2], ESC_MAX));
    printf("segment   %s in %s: %s (%s for data), max object %s\n",
           esc(st->segment, e[0], ESC_MAX), memfd ? "memory" : esc(st->shm_dir, e[1], ESC_MAX),
           shmb_format_bytes(st->size, b[0], sizeof(b[0])),
           shmb_format_bytes(st->data_size, b[1], sizeof(b[1])),
           shmb_format_bytes(st->max_object_size, b[2], sizeof(b[2])));
    if (memfd)
        printf("mem free  %s available (memory and cgroup limit)\n",
               shmb_format_bytes(st->shm_dir_free, b[0], sizeof(b[0])));
    else
        printf("shm free  %s left in %s\n",
               shmb_format_bytes(st->shm_dir_free, b[0], sizeof(b[0])),
               esc(st->shm_dir, e[1], ESC_MAX));
    print_used(st->used, st->data_size, st->free);
    printf("objects   %llu committed, %llu pending, %llu pinned\n",
           (unsigned long long)st->objects, (unsigned long long)st->pending,
           (unsigned long long)st->pinned);
    if (with_clients)
        printf("clients   %llu\n", (unsigned long long)st->clients);
    printf(
        "counters  %llu allocs, %llu commits, %llu gets, %llu evictions, %llu ENOSPC\n",
        (unsigned long long)st->allocs, (unsigned long long)st->commits,
        (unsigned long long)st->gets, (unsigned long long)st->evictions,
        (unsigned long long)st->enospc);
    if (st->has_blocker && st->blocker_key[0] == '\0') /* hidden by the pool's group= */
        printf("blocker   a key (%s, %llu pins, %llu awaited reads) stops reclaim\n",
               esc(st->blocker_state, e[3], ESC_MAX), (unsigned long long)st->blocker_pins,
               (unsigned long long)st->blocker_readers);
    else if (st->has_blocker)
        printf("blocker   '%s' (%s, %llu pins, %llu awaited reads) stops reclaim\n",
               esc(st->blocker_key, e[2], ESC_MAX), esc(st->blocker_state, e[3], ESC_MAX),
               (unsigned long long)st->blocker_pins,
               (unsigned long long)st->blocker_readers);
    else
        printf("blocker   none\n");
}

/* status, plain: one view of the figures. A daemon of one pool gets the view
 * it always had; with --pool, that pool, named (its clients: the pool's);
 * otherwise every pool, each with its own bar, objects, clients and
 * blocker, after the daemon's line and its clients in all. */
static int print_status(shmb_t *c, const struct ctl *ctl)
{
    static char e[ESC_MAX];
    shmb_stats_t st, *pools = NULL;
    char b[32];
    size_t i, n = 0;

    if (shmb_stats(c, &st) < 0 || shmb_stats_pools(c, &pools, &n) < 0)
        return fail(c);
    printf("shmbrokerd %s, pid %lld, up %s\n", esc(st.version, e, ESC_MAX),
           (long long)st.pid, format_uptime(st.uptime_s, b, sizeof(b)));
    printf("socket    %s\n", esc(shmb_socket_path(ctl->socket_path), e, ESC_MAX));
    if (ctl->pool != NULL) {
        /* Connected to that pool, or (outside its group) to another. */
        for (i = 0; i < n && strcmp(pools[i].pool, ctl->pool) != 0; i++)
            ;
        print_pool(i < n ? &pools[i] : &st, 1, 1);
    } else if (n <= 1) {
        print_pool(&st, 0, 1);
    } else {
        printf("clients   %llu in all, %zu pools\n", (unsigned long long)st.clients, n);
        for (i = 0; i < n; i++) {
            printf("\n");
            print_pool(&pools[i], 1, 1);
        }
    }
    shmb_stats_pools_free(pools);
    return print_queues(c, ctl->pool != NULL ? st.pool : NULL);
}

/* status --watch: redraw in place on a terminal; elsewhere (a pipe, a file)
 * append one view after another, without terminal codes. Until interrupted
 * or the daemon goes away (exit 69). */
static int watch_status(shmb_t *c, const struct ctl *ctl)
{
    int tty = isatty(STDOUT_FILENO), rc;

    for (;;) {
        if (tty)
            printf("\033[H\033[2J");
        rc = print_status(c, ctl);
        if (rc != 0)
            break;
        printf(tty ? "\n(every %lus; Ctrl-C to stop)\n" : "\n", ctl->watch);
        fflush(stdout);
        sleep((unsigned)ctl->watch);
    }
    fflush(stdout);
    return rc;
}

/* A string field of the relay's status, "" when absent. */
static const char *relay_str(const json_t *obj, const char *field)
{
    const char *s = json_string_value(json_object_get(obj, field));
    return s ? s : "";
}

/* The relay attached to the daemon (shmbroker-relay), after status: its
 * peers, one line each. Nothing when no relay answers. */
static void print_relay(shmb_t *c)
{
    static char e[ESC_MAX];
    char *text = NULL, b[2][32];
    json_t *st, *peers, *p;
    size_t i;

    if (shmb_relay_status(c, &text) < 0)
        return;
    st = json_loads(text, 0, NULL);
    free(text);
    if (!st)
        return;
    peers = json_object_get(st, "peers");
    {
        const char *rname = json_string_value(json_object_get(st, "name"));
        if (!rname)
            rname = "?";
        printf("\nRelay %s", shmb_escape(rname, strlen(rname), e, sizeof(e)));
    }
    if (json_string_length(json_object_get(st, "listen")))
        printf(" listening on %s", json_string_value(json_object_get(st, "listen")));
    printf(": %zu peers, %lld refused, %lld transfers under way\n", json_array_size(peers),
           (long long)json_integer_value(json_object_get(st, "refused")),
           (long long)json_integer_value(json_object_get(st, "transfers")));
    if (json_array_size(peers))
        printf("  %-16s %-22s %-4s %-12s %-9s %10s %10s %9s %7s %7s %6s  %s\n", "PEER", "ADDRESS",
               "DIR", "STATE", "TRANSPORT", "BYTES IN", "BYTES OUT", "MSGS I/O", "SERVED",
               "FETCHED", "PINNED", "LAST ERROR");
    json_array_foreach(peers, i, p) {
        const char *name = relay_str(p, "name");
        const char *last = relay_str(p, "last_error");
        char msgs[48];
        snprintf(msgs, sizeof(msgs), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(p, "messages_in")),
                 (long long)json_integer_value(json_object_get(p, "messages_out")));
        printf("  %-16s ", shmb_escape(name, strlen(name), e, sizeof(e)));
        printf("%-22s %-4s %-12s %-9s %10s %10s %9s %7lld %7lld %6lld  ",
               relay_str(p, "address"),
               relay_str(p, "direction"),
               relay_str(p, "state"),
               relay_str(p, "transport"),
               shmb_format_bytes((unsigned long long)json_integer_value(
                                     json_object_get(p, "bytes_in")), b[0], sizeof(b[0])),
               shmb_format_bytes((unsigned long long)json_integer_value(
                                     json_object_get(p, "bytes_out")), b[1], sizeof(b[1])),
               msgs, (long long)json_integer_value(json_object_get(p, "fetches_served")),
               (long long)json_integer_value(json_object_get(p, "transfers")),
               (long long)json_integer_value(json_object_get(p, "pinned")));
        printf("%s\n", last[0] ? shmb_escape(last, strlen(last), e, sizeof(e)) : "-");
    }
    json_decref(st);
}

static int cmd_status(shmb_t *c, struct ctl *ctl)
{
    int rc;

    if (ctl->watch != 0)
        return watch_status(c, ctl);
    if (ctl->json)
        return print_json(c);
    if (ctl->prometheus)
        return print_prometheus(c, ctl);
    rc = print_status(c, ctl);
    if (rc == 0)
        print_relay(c);
    return rc;
}

/* Why status reads the segment: asked to (--from-segment), or the daemon
 * did not answer. */
enum ctl_segment_why { CTL_SEG_ASKED, CTL_SEG_NO_ANSWER };

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
static int print_segment_status(const struct ctl *ctl, enum ctl_segment_why why)
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

/* A name a pool can have (or "": the default pool): at most 32 bytes of
 * UTF-8. (A declared pool's is of A-Z, a-z, 0-9, '_' and '-'; the one pool
 * of a daemon without --pool is named after its --name.) */
static bool pool_name_ok(const char *name)
{
    size_t len = strlen(name);

    return len <= SHMB_POOL_NAME_MAX && shmb_utf8_invalid_at(name, len) == len;
}

/* --pool given a name no pool can have: a usage error. */
static int bad_pool_name(const char *name)
{
    static char e[ESC_MAX];

    fprintf(stderr,
            "shmbrokerctl: --pool %s: a pool's name is at most %d bytes of UTF-8 (declared "
            "pools: A-Z, a-z, 0-9, '_' and '-'; \"\" for the default pool)\n",
            esc(name, e, ESC_MAX), SHMB_POOL_NAME_MAX);
    return EXIT_USAGE;
}

/* A whole number of seconds from 1 to max for option flag into *out; false
 * (said on stderr) otherwise. */
static bool seconds_option(const char *flag, const char *arg, unsigned long max,
                           unsigned long *out)
{
    char *end;

    *out = strtoul(arg, &end, 10);
    if (*end == '\0' && *out != 0 && *out <= max && arg[0] != '-')
        return true;
    fprintf(stderr, "shmbrokerctl: %s takes whole seconds from 1 to %lu\n", flag, max);
    return false;
}

/* status's options, after the command: --json, --prometheus, --watch N,
 * --from-segment, --timeout N, --name, --shm-dir, --pool. */
static int status_options(struct ctl *ctl, int argc, char **argv)
{
    while (optind < argc && argv[optind][0] == '-') {
        if (strcmp(argv[optind], "--json") == 0) {
            ctl->json = 1;
        } else if (strcmp(argv[optind], "--prometheus") == 0) {
            ctl->prometheus = 1;
        } else if (strcmp(argv[optind], "--from-segment") == 0) {
            ctl->from_segment = 1;
        } else if (strcmp(argv[optind], "--name") == 0 && optind + 1 < argc) {
            ctl->name = argv[++optind];
        } else if (strcmp(argv[optind], "--shm-dir") == 0 && optind + 1 < argc) {
            ctl->shm_dir = argv[++optind];
        } else if (strcmp(argv[optind], "--timeout") == 0 && optind + 1 < argc) {
            if (!seconds_option("--timeout", argv[++optind], 3600, &ctl->timeout))
                return EXIT_USAGE;
        } else if (strcmp(argv[optind], "--pool") == 0 && optind + 1 < argc) {
            optind++;
            ctl->pool = argv[optind][0] != '\0' ? argv[optind] : NULL;
            if (!pool_name_ok(argv[optind]))
                return bad_pool_name(argv[optind]);
        } else if (strcmp(argv[optind], "--watch") == 0 && optind + 1 < argc) {
            if (!seconds_option("--watch", argv[++optind], 86400, &ctl->watch))
                return EXIT_USAGE;
        } else {
            fprintf(stderr, "shmbrokerctl: unknown status option %s\n", argv[optind]);
            usage(stderr);
            return EXIT_USAGE;
        }
        optind++;
    }
    if (ctl->json + ctl->prometheus + (ctl->watch != 0) + ctl->from_segment > 1) {
        fprintf(stderr, "shmbrokerctl: choose one of --json, --prometheus, --watch and "
                        "--from-segment\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* clients: every connection; with a POOL column when the daemon has more
 * than one pool (a daemon of one pool gets the table it always had). */
static int cmd_clients(shmb_t *c, struct ctl *ctl)
{
    shmb_clients_t *list = NULL;
    shmb_stats_t *pools = NULL;
    char since[32], pinned[32], name[ESC_MAX], mode[ESC_MAX], pool[ESC_MAX + 1], pid[32];
    size_t i, npools = 0, other_ns = 0;
    int width = 16; /* of the POOL column: its longest name, at least 16 */

    (void)ctl;
    if (shmb_stats_pools(c, &pools, &npools) < 0)
        return fail(c);
    for (i = 0; i < npools; i++)
        if ((int)strlen(esc(pools[i].pool, pool, sizeof(pool) - 1)) > width)
            width = (int)strlen(pool);
    shmb_stats_pools_free(pools);
    if (shmb_clients(c, &list) < 0)
        return fail(c);
    printf("%8s %6s %-20s %-*s%-4s %7s %7s %10s  %s\n", "PID", "UID", "NAME",
           npools > 1 ? width + 1 : 0, npools > 1 ? "POOL" : "", "MODE", "PINS", "PENDING",
           "PINNED", "CONNECTED SINCE");
    for (i = 0; i < list->count; i++) {
        const shmb_client_info_t *cl = &list->clients[i];
        time_t t = (time_t)cl->connected_unix;
        struct tm tm;

        localtime_r(&t, &tm);
        strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S", &tm);
        esc(cl->name, name, sizeof(name));
        pool[0] = '\0';
        if (npools > 1) {
            esc(list->pools[i][0] != '\0' ? list->pools[i] : "-", pool, sizeof(pool) - 1);
            snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool), "%*s",
                     (int)strlen(pool) <= width ? width + 1 - (int)strlen(pool) : 1, "");
        }
        /* Pid 0: the client is in a pid namespace the daemon cannot see
         * into; its own pid there, as its hello said, marked as such. */
        if (cl->pid != 0)
            snprintf(pid, sizeof(pid), "%lld", (long long)cl->pid);
        else if (list->own_pids != NULL && list->own_pids[i] > 0)
            snprintf(pid, sizeof(pid), "ns:%lld", (long long)list->own_pids[i]);
        else
            snprintf(pid, sizeof(pid), "ns:?");
        other_ns += cl->pid == 0;
        /* At most 20 bytes of the name, cut on a character boundary. */
        printf("%8s %6lld %-20.*s %s%-4s %7lld %7lld %10s  %s%s\n", pid,
               (long long)cl->uid, (int)shmb_utf8_cut(name, strlen(name), 20), name, pool,
               esc(cl->mode, mode, sizeof(mode)), (long long)cl->pins,
               (long long)cl->pending,
               shmb_format_bytes((unsigned long long)cl->bytes_pinned, pinned,
                                 sizeof(pinned)),
               since, cl->self ? " (this command)" : "");
    }
    if (other_ns > 0)
        printf("ns:N: a client in another pid namespace (a container or pod of its own), "
               "which shmbrokerd sees no pid of; N is its own pid there, as it said at "
               "hello (? when it did not).\n");
    shmb_clients_free(list);
    return 0;
}

static int cmd_ls(shmb_t *c, struct ctl *ctl)
{
    const char *prefix = ctl->nargs ? ctl->args[0] : "";
    shmb_list_t *list = NULL;
    char key[ESC_MAX], state[ESC_MAX];
    size_t i;

    if (shmb_utf8_invalid_at(prefix, strlen(prefix)) < strlen(prefix)) {
        fprintf(stderr, "shmbrokerctl: EINVAL: the prefix must be valid UTF-8\n");
        return EXIT_USAGE;
    }
    if (shmb_list(c, prefix, SHMB_LIST_MAX_LIMIT, &list) < 0)
        return fail(c);
    printf("%-32s %12s %5s %7s %-9s %10s %12s\n", "KEY", "SIZE", "PINS", "READERS",
           "STATE", "AGE_MS", "OFFSET");
    for (i = 0; i < list->count; i++) {
        const shmb_object_info_t *o = &list->objects[i];

        printf("%-32s %12lld %5lld %7lld %-9s %10lld %12lld\n",
               esc(o->key, key, sizeof(key)), (long long)o->size, (long long)o->pins,
               (long long)o->readers, esc(o->state, state, sizeof(state)),
               (long long)o->age_ms, (long long)o->offset);
    }
    if (list->truncated)
        printf("(more objects not shown; narrow the prefix)\n");
    shmb_list_free(list);
    return 0;
}

/* Read all of fd into a malloc'ed buffer. */
static int read_all(int fd, char **out, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);

    if (buf == NULL)
        return -ENOMEM;
    for (;;) {
        ssize_t r;

        if (n == cap) {
            char *grown = realloc(buf, cap * 2);

            if (grown == NULL) {
                free(buf);
                return -ENOMEM;
            }
            buf = grown;
            cap *= 2;
        }
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int saved = errno;

            free(buf);
            return -saved;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Read the input of put (a file, or standard input for "-") into
 * ctl->put_data (malloc'ed; main frees it) before connecting: a file that
 * cannot be read needs no daemon. 0 or the exit status. */
static int put_input(struct ctl *ctl)
{
    const char *file = ctl->args[1];
    int fd = strcmp(file, "-") == 0 ? STDIN_FILENO : open(file, O_RDONLY | O_CLOEXEC);
    int rc;

    if (fd < 0) {
        fprintf(stderr, "shmbrokerctl: cannot open %s: %s\n", file, strerror(errno));
        return EXIT_NO_INPUT;
    }
    rc = read_all(fd, &ctl->put_data, &ctl->put_len);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        fprintf(stderr, "shmbrokerctl: cannot read %s: %s\n", file, strerror(-rc));
        return EXIT_IO_ERROR;
    }
    if (ctl->put_len == 0) {
        free(ctl->put_data);
        ctl->put_data = NULL;
        fprintf(stderr, "shmbrokerctl: %s is empty; objects hold at least 1 byte\n",
                file);
        return EXIT_USAGE;
    }
    return 0;
}

/* Keys are checked before connecting: a key the ctl refuses is a usage
 * error, not the daemon's refusal. put reads its input then too. */
static int key_prepare(struct ctl *ctl)
{
    return check_key_arg(ctl->args[0]);
}

static int put_prepare(struct ctl *ctl)
{
    int rc = key_prepare(ctl);

    return rc != 0 ? rc : put_input(ctl);
}

static int cmd_put(shmb_t *c, struct ctl *ctl)
{
    return shmb_put(c, ctl->args[0], ctl->put_data, ctl->put_len, 0) < 0 ? fail(c) : 0;
}

static int cmd_rm(shmb_t *c, struct ctl *ctl)
{
    return shmb_delete(c, ctl->args[0]) < 0 ? fail(c) : 0;
}

static int fetch_prepare(struct ctl *ctl)
{
    return check_key_arg(ctl->args[1]);
}

/* KEY from another host, through shmbroker-relay (shmb_fetch). */
static int cmd_fetch(shmb_t *c, struct ctl *ctl)
{
    static char buf[SHMB_ESCAPED_MAX(1024)];

    if (shmb_fetch(c, ctl->args[0], ctl->args[1]) == 0)
        return 0;
    /* Not fail(): ENOTCONN and ECONNRESET here are the relay's or the
     * transfer's, not a lost connection to the daemon. */
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_errname(c),
            esc(shmb_errmsg(c), buf, sizeof(buf)));
    return EXIT_ERROR_REPLY;
}

/* Write len bytes to fd. */
static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int cmd_get(shmb_t *c, struct ctl *ctl)
{
    const char *key = ctl->args[0], *file = ctl->nargs == 2 ? ctl->args[1] : NULL;
    const void *p;
    size_t len;
    int fd, rc;

    if (shmb_get(c, key, &p, &len) < 0)
        return fail(c);
    fd = file == NULL || strcmp(file, "-") == 0
             ? STDOUT_FILENO
             : open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "shmbrokerctl: cannot open %s: %s\n", file, strerror(errno));
        shmb_release(c, key);
        return EXIT_CANT_CREATE;
    }
    rc = write_all(fd, p, len);
    if (fd != STDOUT_FILENO)
        close(fd);
    shmb_release(c, key);
    if (rc < 0) {
        fprintf(stderr, "shmbrokerctl: cannot write %s: %s\n", file ? file : "output",
                strerror(-rc));
        return EXIT_IO_ERROR;
    }
    return 0;
}

/* The commands, in the order usage lists them. */
static const struct ctl_cmd ctl_cmds[] = {
    {"status", 0, 0, status_options, NULL, cmd_status,
     "status [--pool NAME] [--json | --prometheus | --watch SECONDS]\n"
     "         [--from-segment] [--timeout SECONDS] [--name NAME] [--shm-dir DIR]",
     "occupancy, clients and counters of every pool (or NAME's);\n"
     "                         from the segment when the daemon does not answer"},
    {"ls", 0, 1, NULL, NULL, cmd_ls, "ls [PREFIX]", "objects, oldest first"},
    {"clients", 0, 0, NULL, NULL, cmd_clients, "clients",
     "connections: pid, uid, name, pool, pins, pending, since"},
    {"put", 2, 2, NULL, put_prepare, cmd_put, "put KEY FILE|-",
     "store a file (or standard input) under KEY"},
    {"get", 1, 2, NULL, key_prepare, cmd_get, "get KEY [FILE|-]",
     "write KEY's bytes to FILE (default: standard output)"},
    {"rm", 1, 1, NULL, key_prepare, cmd_rm, "rm KEY", "delete KEY"},
    {"fetch", 2, 2, NULL, fetch_prepare, cmd_fetch, "fetch PEER KEY",
     "bring KEY from relay PEER's host into this daemon (shmbroker-relay)"},
    {"check", 0, 0, NULL, NULL, NULL, "check [DAEMON FLAG]...",
     "would the daemon's pools fit here? (shmbrokerd --check; 0 yes, 1 no)"},
};

/* The command table's usage and help lines, aligned as one table. */
static void usage(FILE *out)
{
    size_t i;

    fprintf(out, "Usage: shmbrokerctl [--socket PATH] [--pool NAME] [--name NAME] "
                 "[--shm-dir DIR]\n                    COMMAND [ARG]...\n\n"
                 "Commands:\n");
    for (i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++) {
        if (strlen(ctl_cmds[i].usage) < 23)
            fprintf(out, "  %-23s%s\n", ctl_cmds[i].usage, ctl_cmds[i].help);
        else
            fprintf(out, "  %s\n%25s%s\n", ctl_cmds[i].usage, "", ctl_cmds[i].help);
    }
    fprintf(
        out,
        "\n"
        "The socket defaults to $%s, else %s.\n"
        "--pool NAME uses the daemon's pool NAME (default: its first).\n"
        "--name and --shm-dir are the daemon's (default %s in %s): where status finds\n"
        "the segment to read when the daemon does not answer within --timeout (%d s).\n"
        "Exit status: 0 success, 1 the daemon refused, 2 usage, 66 input file cannot be\n"
        "opened, 69 daemon unreachable, 73 output file cannot be created, 74 file I/O "
        "error.\n"
        "status: 3 when the daemon did not answer and the figures are the segment's,\n"
        "2 when that file is not a segment of this release.\n"
        "Put '--' before a key that starts with '-'.\n",
        SHMB_SOCKET_ENV, SHMB_DEFAULT_SOCKET, CTL_DEFAULT_NAME, CTL_DEFAULT_SHM_DIR,
        CTL_DEFAULT_TIMEOUT_S);
}

/* check: run shmbrokerd --check with the daemon flags given, the
 * shmbrokerd installed beside this shmbrokerctl first (the pair from one
 * build or package), else $SHMBROKERD, else PATH's. Returns only when none
 * could be run: 127 when none was found, 126 when one could not be run. */
static int cmd_check(int argc, char **argv)
{
    char self[PATH_MAX], beside[PATH_MAX + 16];
    const char *env = getenv("SHMBROKERD");
    char **args = calloc((size_t)argc + 3, sizeof(*args));
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const char *tried = NULL, *missing = NULL;
    int saved = 0;

    if (args == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        return EXIT_ERROR_REPLY;
    }
    args[0] = "shmbrokerd";
    args[1] = "--check";
    memcpy(args + 2, argv, (size_t)argc * sizeof(*args));
    fflush(stdout);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');

        if (slash != NULL) {
            *slash = '\0';
            snprintf(beside, sizeof(beside), "%s/shmbrokerd", self);
            /* One there that cannot be run is an error, not a reason to
             * run another build's. */
            if (access(beside, F_OK) == 0) {
                execv(beside, args);
                saved = errno;
                tried = beside;
            }
        }
    }
    if (saved == 0 && env != NULL && env[0] != '\0') {
        if (access(env, F_OK) != 0) {
            missing = env;
        } else {
            execv(env, args);
            saved = errno;
            tried = env;
        }
    }
    if (saved == 0 && missing == NULL) {
        execvp("shmbrokerd", args);
        if (errno != ENOENT) {
            saved = errno;
            tried = "shmbrokerd (from PATH)";
        }
    }
    free(args);
    if (saved != 0) {
        fprintf(stderr, "shmbrokerctl: cannot run %s: %s\n", tried, strerror(saved));
        return 126;
    }
    if (missing != NULL) {
        fprintf(stderr, "shmbrokerctl: SHMBROKERD=%s: no such file; point it at shmbrokerd.\n",
                missing);
        return 127;
    }
    fprintf(stderr,
            "shmbrokerctl: check runs shmbrokerd --check, but no shmbrokerd was found beside "
            "shmbrokerctl (%s), in $SHMBROKERD or in PATH. Install shmbrokerd, or set "
            "SHMBROKERD=/path/to/shmbrokerd.\n",
            n > 0 ? self : "?");
    return 127;
}

/* The row of the command called name, or NULL. */
static const struct ctl_cmd *find_cmd(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++)
        if (strcmp(ctl_cmds[i].name, name) == 0)
            return &ctl_cmds[i];
    return NULL;
}

/* Whether the connect failure of c is the daemon's refusal of the pool
 * (ENOENT: no such pool, the message listing them) rather than a missing
 * socket, which is ENOENT too: the socket is there. */
static int pool_refused(shmb_t *c, const char *socket_path, const char *pool)
{
    struct stat st;

    return pool != NULL && shmb_errcode(c) == -ENOENT &&
           stat(shmb_socket_path(socket_path), &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Why a connection failed, kept for the caller instead of printed. */
struct ctl_failure {
    int code; /* the library's -errno */
    char message[SHMB_ESCAPED_MAX(1024)];
};

/* Connect as shmbrokerctl (to pool, NULL: the default one; for a report,
 * to the default one when pool's group leaves this user out); on failure
 * print why (or, with why, keep it there) and return the exit status (69
 * when no daemon can be reached there), else 0 with *out. */
static int ctl_connect(const char *socket_path, const char *pool, bool report,
                       shmb_t **out, struct ctl_failure *why)
{
    static char msg[SHMB_ESCAPED_MAX(1024)];
    shmb_t *c = shmb_new();
    int rc;

    *out = NULL;
    if (c == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        return EXIT_ERROR_REPLY;
    }
    /* Tools map the segment lazily: prefaulting is for workers' hot paths. */
    shmb_set_populate(c, 0);
    shmb_set_pool(c, pool);
    if (shmb_connect(c, socket_path, "shmbrokerctl") < 0) {
        /* A report of a pool whose group leaves this user out: its figures
         * are every client's to see, through a pool this user may use. */
        if (report && pool != NULL && shmb_errcode(c) == -EPERM) {
            shmb_close(c);
            return ctl_connect(socket_path, NULL, false, out, why);
        }
        if (why != NULL) {
            why->code = shmb_errcode(c);
            esc(shmb_errmsg(c), why->message, sizeof(why->message));
        } else {
            fprintf(stderr, "shmbrokerctl: %s\n", esc(shmb_errmsg(c), msg, sizeof(msg)));
        }
        rc = pool_refused(c, socket_path, pool) ? EXIT_ERROR_REPLY
             : shmb_errcode(c) == -ECONNREFUSED || shmb_errcode(c) == -ENOENT ||
                     shmb_errcode(c) == -EAGAIN ||
                     shmb_errcode(c) == -EACCES || shmb_errcode(c) == -ENOTDIR ||
                     shmb_errcode(c) == -ECONNRESET || shmb_errcode(c) == -ENAMETOOLONG
                 ? EXIT_UNAVAILABLE
                 : EXIT_ERROR_REPLY;
        shmb_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* status's first exchange with the daemon, in a thread of its own so that
 * a daemon that accepts connections but never answers (stopped, stuck)
 * cannot hang status: main waits for it at most ctl->timeout seconds. */
struct ctl_probe {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    const struct ctl *ctl;
    shmb_t *c;                  /* connected and answering, when rc == 0 */
    int rc;                     /* ctl_connect's exit status */
    struct ctl_failure failure; /* why, when rc != 0 */
};

static void *probe_run(void *arg)
{
    struct ctl_probe *p = arg;
    shmb_stats_t st;
    shmb_t *c = NULL;
    int rc = ctl_connect(p->ctl->socket_path, p->ctl->pool, true, &c, &p->failure);

    /* One request after hello: the daemon answers requests, not only
     * connections. Its error, if any, is the command's to report. */
    if (rc == 0)
        (void)shmb_stats(c, &st);
    pthread_mutex_lock(&p->lock);
    p->c = c;
    p->rc = rc;
    p->done = true;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* Whether the daemon's segment is there for status to read. A segment
 * named (--name, --shm-dir), the one whose header names the daemon
 * listening at the socket, or the default one when the socket is the
 * default one too: a daemon on a socket of its own has a segment of its
 * own, and another daemon's figures would mislead. */
static bool segment_exists(const struct ctl *ctl)
{
    const char *env = getenv(SHMB_SOCKET_ENV);
    struct ctl_segment seg;
    struct stat st;

    if (segment_find(ctl, &seg, true) != 0 || stat(seg.path, &st) != 0)
        return false;
    return seg.by_owner || ctl->name != NULL || ctl->shm_dir != NULL ||
           (ctl->socket_path == NULL && (env == NULL || env[0] == '\0'));
}

/* The plain status of a daemon that is starting (reserving its pools, with
 * its progress file held beside its socket): printed, true. */
static bool print_starting(const struct ctl *ctl)
{
    char text[SHMB_ESCAPED_MAX(SHMB_STARTING_TEXT_MAX)];
    long long pid = 0;

    if (ctl->json || ctl->prometheus ||
        shmb_starting_read(shmb_socket_path(ctl->socket_path), &pid, text, sizeof(text)) != 1)
        return false;
    printf("starting: %s (shmbrokerd pid %lld; it answers once its pools are reserved)\n",
           text, pid);
    return true;
}

/* Connect for status, waiting at most the timeout for an answer; when the
 * daemon does not answer (or refuses connections: it is gone) and its
 * segment is there, the plain view prints the figures of the segment
 * instead (--json and --prometheus are for programs: they get the error).
 * 0 with *out connected, or the exit status. */
static int status_connect(const struct ctl *ctl, shmb_t **out)
{
    static char e[ESC_MAX];
    /* Static: a probe given up on at the timeout still writes its result
     * here when the daemon answers at last, while this returns and main
     * prints and exits. */
    static struct ctl_probe p;
    pthread_condattr_t attr;
    pthread_t thread;
    struct timespec deadline;
    unsigned long timeout = ctl->timeout != 0 ? ctl->timeout : CTL_DEFAULT_TIMEOUT_S;
    bool plain = !ctl->json && !ctl->prometheus, done;
    int rc = 0;

    *out = NULL;
    memset(&p, 0, sizeof(p));
    p.ctl = ctl;
    pthread_mutex_init(&p.lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&p.cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&thread, NULL, probe_run, &p) != 0) {
        probe_run(&p); /* no thread to spare: ask without a timeout */
    } else {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += (time_t)timeout;
        pthread_mutex_lock(&p.lock);
        while (!p.done && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&p.cond, &p.lock, &deadline);
        done = p.done;
        pthread_mutex_unlock(&p.lock);
        if (!done) {
            /* The thread stays blocked in the library; exit ends it. A
             * daemon socket activation started waits to answer until its
             * pools are reserved. */
            if (print_starting(ctl))
                return EXIT_UNAVAILABLE;
            if (plain && segment_exists(ctl))
                return print_segment_status(ctl, CTL_SEG_NO_ANSWER);
            fprintf(stderr,
                    "shmbrokerctl: shmbrokerd at %s accepted the connection but did not "
                    "answer within %lu s (stopped or stuck?); %s\n",
                    esc(shmb_socket_path(ctl->socket_path), e, ESC_MAX), timeout,
                    plain
                        ? "no segment to read instead (name it with --name and --shm-dir)"
                        : "plain status reads its segment instead");
            return EXIT_UNAVAILABLE;
        }
        pthread_join(thread, NULL);
    }
    pthread_cond_destroy(&p.cond);
    pthread_mutex_destroy(&p.lock);
    if (p.rc == 0) {
        *out = p.c;
        return 0;
    }
    /* It is starting (reserving its pools): say how far, not refused; exit
     * as unavailable, which it is until then. */
    if (p.rc == EXIT_UNAVAILABLE && p.failure.code == -EAGAIN && print_starting(ctl))
        return EXIT_UNAVAILABLE;
    /* Nothing listens there (the daemon died or stopped), but its segment
     * stayed. */
    if (p.rc == EXIT_UNAVAILABLE &&
        (p.failure.code == -ECONNREFUSED || p.failure.code == -ENOENT ||
         p.failure.code == -ECONNRESET) &&
        plain && segment_exists(ctl))
        return print_segment_status(ctl, CTL_SEG_NO_ANSWER);
    fprintf(stderr, "shmbrokerctl: %s\n", p.failure.message);
    return p.rc;
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"socket", required_argument, NULL, 's'},
        {"pool", required_argument, NULL, 'p'},
        {"name", required_argument, NULL, 'n'},
        {"shm-dir", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    struct ctl ctl;
    const struct ctl_cmd *cmd;
    const char *name;
    int opt, rc;
    shmb_t *c;

    memset(&ctl, 0, sizeof(ctl));
    while ((opt = getopt_long(argc, argv, "+s:h", options, NULL)) != -1) {
        switch (opt) {
        case 's':
            ctl.socket_path = optarg;
            break;
        case 'p':
            ctl.pool = optarg[0] != '\0' ? optarg : NULL; /* "": the default pool */
            if (!pool_name_ok(optarg))
                return bad_pool_name(optarg);
            break;
        case 'n':
            ctl.name = optarg;
            break;
        case 'd':
            ctl.shm_dir = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    name = argv[optind++];
    /* check starts the daemon's own check: its flags are shmbrokerd's. */
    if (strcmp(name, "check") == 0)
        return cmd_check(argc - optind, argv + optind);
    cmd = find_cmd(name);
    if (cmd != NULL && cmd->options != NULL && (rc = cmd->options(&ctl, argc, argv)) != 0)
        return rc;
    /* "--" ends the options, so that a key may start with '-'. */
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    ctl.args = argv + optind;
    ctl.nargs = argc - optind;
    if (cmd == NULL || ctl.nargs < cmd->min_args || ctl.nargs > cmd->max_args) {
        fprintf(stderr, "shmbrokerctl: wrong command or arguments: %s\n", name);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (cmd->prepare != NULL && (rc = cmd->prepare(&ctl)) != 0)
        return rc;
    ctl_socket = ctl.socket_path;
    if (cmd->run == cmd_status && ctl.from_segment)
        return print_segment_status(&ctl, CTL_SEG_ASKED);
    if (cmd->run == cmd_status && ctl.watch == 0) {
        rc = status_connect(&ctl, &c);
        /* A daemon that does not answer is a figure for a scraper, not a
         * failure to write one: the file says shmbroker_up 0 (the reason
         * is on stderr), so that a textfile collector stops exporting the
         * last figures as if they were current. */
        if (rc == EXIT_UNAVAILABLE && ctl.prometheus) {
            prom_up(stdout, 0);
            rc = 0;
        }
    } else {
        rc = ctl_connect(ctl.socket_path, ctl.pool,
                         strcmp(cmd->name, "clients") == 0 || cmd->run == cmd_status, &c,
                         NULL);
    }
    if (rc == 0 && c != NULL) {
        rc = cmd->run(c, &ctl);
        shmb_close(c);
    }
    free(ctl.put_data);
    return rc;
}
