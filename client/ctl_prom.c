// SPDX-License-Identifier: Apache-2.0
/*
 * status --prometheus: the daemon's figures, each pool's and the queues' in
 * Prometheus's text exposition format, made whole before any is written.
 * Knows nothing of the plain view or the segment.
 */
#include "ctl_prom.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/protocol.h"
#include "report.h"

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
void prom_up(FILE *out, int up)
{
    prom_head(out, "shmbroker_up", "gauge",
              "1 when shmbrokerd answered this scrape, 0 when it did not.");
    fprintf(out, "shmbroker_up %d\n", up);
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
int print_prometheus(shmb_t *c, const struct ctl *ctl)
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
