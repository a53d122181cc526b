// SPDX-License-Identifier: Apache-2.0
/*
 * The threads of the queues' streams (stream.h): each waits in the daemon's
 * calls on a connection of its own, so that the loop never does, and tells
 * the loop through the stream's async handle. Knows the library's queue
 * calls, not peers or UCX.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../client/internal.h"
#include "stream.h"

static void wake_loop(struct stream *s)
{
    uv_async_send(s->async);
}

bool stream_stopping(struct stream *s)
{
    pthread_mutex_lock(&s->mu);
    bool stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return stop;
}

static int errno_of(int rc)
{
    return rc < 0 ? rc : -EIO;
}

static shmb_t *thread_connect(struct stream *s, const char *who, char *why, size_t whylen)
{
    shmb_t *c = shmb_new();
    if (!c) {
        snprintf(why, whylen, "The relay is out of memory.");
        return NULL;
    }
    shmb_set_arena(c, 0);
    shmb_set_alloc_wait(c, 1);
    if (shmb_connect(c, s->relay->daemon_socket, who) < 0) {
        snprintf(why, whylen, "%s", shmb_errmsg(c));
        shmb_close(c);
        return NULL;
    }
    return c;
}

static void thread_end(struct stream *s, int code, const char *fmt, const char *detail)
{
    pthread_mutex_lock(&s->mu);
    if (s->state != S_ENDED && s->state != S_CUT) {
        s->end_code = code;
        snprintf(s->end_text, sizeof(s->end_text), fmt, detail);
        s->state = S_ENDED;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The last thing a stream's thread does: say it is gone, and wake the loop
 * to join it. */
static void thread_exited(struct stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->exited = true;
    pthread_mutex_unlock(&s->mu);
    wake_loop(s);
}

/* The queue's count of messages published, for what a returning host missed. */
static uint64_t queue_messages(shmb_t *c, const char *name)
{
    shmb_queue_list_t *list = NULL;
    uint64_t n = 0;
    if (shmb_queue_summary(c, &list) < 0)
        return 0;
    for (size_t i = 0; i < list->count; i++)
        if (strcmp(list->queues[i].name, name) == 0)
            n = list->queues[i].messages;
    shmb_queue_list_free(list);
    return n;
}

/* OUT: open one more seat in [seat_from, seat_to): its answer for the loop. */
static shmb_queue_t *open_seat(struct stream *s, shmb_t *c, struct sub_result *res)
{
    shmb_queue_t *q = NULL;
    int rc = -EBUSY;
    memset(res, 0, sizeof(*res));
    for (unsigned seat = s->seat_from; seat < s->seat_to; seat++) {
        rc = shmb_queue_open(c, s->queue, (int)seat, &q);
        if (rc == 0) {
            res->seat = seat;
            return q;
        }
        if (rc != -EBUSY)
            break;
    }
    res->code = rc;
    snprintf(res->text, sizeof(res->text), "%s",
             rc == -EBUSY ? "every seat the subscription may take is held" : shmb_errmsg(c));
    return NULL;
}

/* OUT: open the seats the loop asked for since the last look. */
static int out_open_seats(struct stream *s, shmb_t *c, shmb_queue_t **seats, unsigned *nseats)
{
    for (;;) {
        struct sub_result res;
        pthread_mutex_lock(&s->mu);
        bool more = *nseats < s->want_seats && !s->stop;
        pthread_mutex_unlock(&s->mu);
        if (!more)
            return 0;
        shmb_queue_t *q = open_seat(s, c, &res);
        pthread_mutex_lock(&s->mu);
        if (q) {
            if (*nseats == 0)
                s->base = queue_messages(c, s->queue);
            seats[(*nseats)++] = q;
            res.missed = 0;
            s->state = S_RUNNING;
        } else {
            s->want_seats--;
        }
        if (s->nresults < WIRE_QSEATS_MAX)
            s->results[s->nresults++] = res;
        pthread_mutex_unlock(&s->mu);
        wake_loop(s);
        if (!q && *nseats == 0)
            return res.code;
    }
}

/* OUT: take one message at the first seat (the one sent), waiting up to
 * timeout_ms, and let it go at the others. 0 with *out (the caller's),
 * 1 when there was none within the wait, or -errno. */
static int out_take(shmb_queue_t **seats, unsigned nseats, int timeout_ms, struct fmsg **out)
{
    const void *data;
    size_t len;
    struct fmsg *m;
    int rc = shmb_queue_dequeue(seats[0], &data, &len, timeout_ms);
    if (rc == -ETIMEDOUT)
        return 1;
    if (rc < 0)
        return rc;
    m = len <= FWD_MSG_MAX ? malloc(sizeof(*m) + len) : NULL;
    if (!m) {
        shmb_queue_done(seats[0]);
        return -ENOMEM;
    }
    m->len = len;
    memcpy(m->data, data, len);
    shmb_queue_done(seats[0]);
    /* The other seats of this host only let go of what they see: they
     * started no earlier than the first, so they are never behind it. */
    for (unsigned i = 1; i < nseats; i++)
        while (shmb_queue_dequeue(seats[i], &data, &len, 0) == 0)
            shmb_queue_done(seats[i]);
    *out = m;
    return 0;
}

/* OUT, under s->mu: whether the messages waiting in s->msgs wait for an
 * acknowledgement of those in flight, which the loop sends them with
 * (Nagle's rule, bounded by what is already published: a message is
 * never held for one not yet written). They go now while fewer than
 * FWD_HOLD_SENDS sends are unacknowledged (a lone message is never
 * delayed), when they fill a batch, when one of them is larger than a
 * batch takes, or when the thread is about to stop (rc: its error). */
static bool out_hold(struct stream *s, int rc)
{
    uint64_t bytes = 0;
    struct fmsg *m;
    if (s->marks_len < FWD_HOLD_SENDS || rc < 0 || s->stop || s->nmsgs >= WIRE_BATCH_MAX ||
        s->nresults != 0)
        return false;
    STAILQ_FOREACH(m, &s->msgs, link) {
        bytes += 2 + m->len;
        if (bytes > WIRE_BATCH_BYTES)
            return false;
    }
    return true;
}

/* OUT: wait for the next message, then take every one already published
 * that the window has room for, and send them (the small ones in one
 * batch), or hold them for an acknowledgement, or hand them to the loop
 * with one wake-up. 0, 1 when there was none within the wait, or -errno
 * (after sending or handing over what was taken). */
static int out_step(struct stream *s, shmb_queue_t **seats, unsigned nseats)
{
    struct fmsg_list got = STAILQ_HEAD_INITIALIZER(got);
    struct fmsg *m;
    uint64_t room, bytes;
    unsigned n = 1;
    int rc = out_take(seats, nseats, FWD_WAIT_MS, &m);
    if (rc != 0)
        return rc;
    STAILQ_INSERT_TAIL(&got, m, link);
    bytes = m->len;
    pthread_mutex_lock(&s->mu);
    room = FWD_WINDOW - (s->produced - s->acked); /* acks only widen it meanwhile */
    uint64_t unacked = s->unacked_bytes;
    pthread_mutex_unlock(&s->mu);
    while (n < room && unacked + bytes <= FWD_WINDOW_BYTES) {
        rc = out_take(seats, nseats, 0, &m);
        if (rc != 0)
            break;
        STAILQ_INSERT_TAIL(&got, m, link);
        bytes += m->len;
        n++;
    }
    pthread_mutex_lock(&s->mu);
    STAILQ_FOREACH(m, &got, link) {
        s->sizes[s->produced % FWD_WINDOW] = m->len;
        s->unacked_bytes += m->len;
        s->produced++;
        s->nmsgs++;
    }
    STAILQ_CONCAT(&s->msgs, &got);
    bool handed = false;
    if (out_hold(s, rc)) {
        s->holds++; /* the loop sends them with the acknowledgement */
    } else {
        /* Sent from here, after any handed to the loop before (the loop
         * sends under the same lock, the seats' answers first): no
         * wake-up of the loop. */
        if (s->relay->worker_mt && s->nresults == 0)
            stream_out_send(s, true);
        handed = !STAILQ_EMPTY(&s->msgs);
        s->handoffs += handed;
    }
    pthread_mutex_unlock(&s->mu);
    if (handed)
        wake_loop(s);
    if (rc < 0)
        return rc; /* the error after the messages before it: the next look sees it */
    pthread_mutex_lock(&s->mu);
    if (s->produced - s->acked >= FWD_WINDOW || s->unacked_bytes > FWD_WINDOW_BYTES)
        s->window_waits++;
    while ((s->produced - s->acked >= FWD_WINDOW || s->unacked_bytes > FWD_WINDOW_BYTES) &&
           !s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += FWD_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void *stream_out_thread(void *arg)
{
    struct stream *s = arg;
    shmb_queue_t *seats[WIRE_QSEATS_MAX];
    unsigned nseats = 0;
    char who[128], why[256];
    shmb_t *c;
    int rc = 0;

    snprintf(who, sizeof(who), "shmbroker-relay %s for %.64s", s->queue, s->peer_name);
    c = thread_connect(s, who, why, sizeof(why));
    if (!c) {
        pthread_mutex_lock(&s->mu);
        s->results[0] = (struct sub_result){.code = -ECONNREFUSED};
        snprintf(s->results[0].text, sizeof(s->results[0].text), "%s", why);
        s->nresults = 1;
        s->state = S_ENDED;
        s->end_code = -ECONNREFUSED;
        pthread_mutex_unlock(&s->mu);
        goto out;
    }
    while (!stream_stopping(s)) {
        if ((rc = out_open_seats(s, c, seats, &nseats)) < 0)
            break;
        if (nseats == 0)
            break;
        rc = out_step(s, seats, nseats);
        if (rc < 0)
            break;
    }
    if (rc == -EPIPE)
        thread_end(s, -EPIPE, "%s", "the writer left and every message was forwarded");
    else if (rc == -ECANCELED)
        thread_end(s, -ECANCELED, "%s", "the queue was shut down");
    else if (rc < 0)
        thread_end(s, errno_of(rc), "%s", shmb_errmsg(c));
    for (unsigned i = 0; i < nseats; i++)
        shmb_queue_close(seats[i]);
    shmb_close(c);
out:
    thread_exited(s);
    return NULL;
}

bool stream_in_publish_now(struct stream *s, const void *data, size_t len)
{
    /* After a message larger than a slot, the queue's next reserve may
     * delete objects read since: a daemon call, which the loop must not
     * wait for. Such a stream stays with its thread. */
    if (!s->in_q || !s->in_idle || s->in_objects || s->stop || s->state == S_ENDED ||
        !STAILQ_EMPTY(&s->msgs) || len > shmb_queue_slot_size(s->in_q))
        return false;
    if (shmb_queue_enqueue(s->in_q, data, len, 0) < 0)
        return false; /* full, or worse: the thread sees it with the next one */
    s->published++;
    s->published_now++;
    return true;
}

/* IN: the local queue as its writer, made when no reader made it first. */
static shmb_queue_t *in_open_writer(struct stream *s, shmb_t *c)
{
    shmb_queue_t *q = NULL;
    int rc = shmb_queue_open(c, s->queue, SHMB_QUEUE_WRITER, &q);
    if (rc == -ENOENT) {
        rc = shmb_queue_create(c, s->queue, s->seats, s->slots, s->slot_size,
                               SHMB_QUEUE_TEMPORARY);
        if (rc == 0)
            rc = shmb_queue_open(c, s->queue, SHMB_QUEUE_WRITER, &q);
    }
    if (rc < 0)
        thread_end(s, rc, "cannot publish into the local queue: %s", shmb_errmsg(c));
    return rc < 0 ? NULL : q;
}

void *stream_in_thread(void *arg)
{
    struct stream *s = arg;
    char who[128], why[256];
    shmb_queue_t *q = NULL;
    shmb_t *c;

    snprintf(who, sizeof(who), "shmbroker-relay %s from %.64s", s->queue, s->peer_name);
    c = thread_connect(s, who, why, sizeof(why));
    if (!c) {
        thread_end(s, -ECONNREFUSED, "%s", why);
        goto out;
    }
    q = in_open_writer(s, c);
    pthread_mutex_lock(&s->mu);
    s->in_q = q;
    pthread_mutex_unlock(&s->mu);
    while (q) {
        STAILQ_HEAD(, fmsg) batch = STAILQ_HEAD_INITIALIZER(batch);
        struct fmsg *m;
        int rc = 0;
        /* Everything the loop put together so far, published with one
         * wake-up of the loop after (its acknowledgement). */
        pthread_mutex_lock(&s->mu);
        s->in_idle = true; /* the loop may publish meanwhile */
        while (STAILQ_EMPTY(&s->msgs) && !s->stop && s->state != S_ENDED)
            pthread_cond_wait(&s->cv, &s->mu);
        s->in_idle = false;
        /* They count against the peer's window (nmsgs, queued_bytes) until
         * each is published: the loop refuses a peer that sends more. */
        if (!s->stop && !STAILQ_EMPTY(&s->msgs)) {
            STAILQ_CONCAT(&batch, &s->msgs);
            s->thread_rounds++;
        }
        pthread_mutex_unlock(&s->mu);
        if (STAILQ_EMPTY(&batch))
            break;
        while ((m = STAILQ_FIRST(&batch))) {
            STAILQ_REMOVE_HEAD(&batch, link);
            if (rc == 0) {
                if (m->len > shmb_queue_slot_size(q)) {
                    pthread_mutex_lock(&s->mu);
                    s->in_objects = true;
                    pthread_mutex_unlock(&s->mu);
                }
                bool woke = false;
                do {
                    rc = shmb_queue_enqueue(q, m->data, m->len, FWD_WAIT_MS);
                    /* The queue is full: the loop acknowledges what was
                     * published before, if asked, while this one waits for
                     * room (not only once the whole batch is). */
                    if (rc == -ETIMEDOUT && !woke) {
                        wake_loop(s);
                        woke = true;
                    }
                } while (rc == -ETIMEDOUT && !stream_stopping(s));
                if (rc == 0) {
                    pthread_mutex_lock(&s->mu);
                    s->published++;
                    pthread_mutex_unlock(&s->mu);
                }
            }
            pthread_mutex_lock(&s->mu);
            s->nmsgs--;
            s->queued_bytes -= m->len;
            pthread_mutex_unlock(&s->mu);
            free(m);
        }
        if (rc < 0 && rc != -ETIMEDOUT)
            thread_end(s, rc, "cannot publish into the local queue: %s", shmb_errmsg(c));
        wake_loop(s);
        if (rc < 0)
            break;
    }
    pthread_mutex_lock(&s->mu);
    s->in_q = NULL;
    s->in_idle = false;
    pthread_mutex_unlock(&s->mu);
    shmb_queue_close(q);
    shmb_close(c);
out:
    thread_exited(s);
    return NULL;
}
