// SPDX-License-Identifier: Apache-2.0
/*
 * status, plain: the view people read (the daemon's line, each pool's
 * figures with its bar, the queues with their seats, the relay's peers),
 * and --watch, which draws it again. Connects to nothing itself.
 */
#include "ctl_human.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "../proto/text.h"

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
int print_status(shmb_t *c, const struct ctl *ctl)
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
int watch_status(shmb_t *c, const struct ctl *ctl)
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
void print_relay(shmb_t *c)
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
