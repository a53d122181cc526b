// SPDX-License-Identifier: Apache-2.0
/*
 * status: the connection that waits at most --timeout for the daemon's
 * answer, and the choice of rendering. --json (the daemon's reply as it
 * sent it) is here; the plain view and --watch, --prometheus, and the view
 * from the segment are rooms of their own, below.
 */
#include "ctl_status.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../proto/starting.h"
#include "ctl_human.h"
#include "ctl_prom.h"
#include "ctl_segment.h"

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

int run_status(shmb_t *c, struct ctl *ctl)
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
int status_connect(const struct ctl *ctl, shmb_t **out)
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
