// SPDX-License-Identifier: Apache-2.0
/*
 * Queues with readers on other hosts. On the writer's host, a stream per
 * (queue, remote host) takes reader seats of the local queue, one per remote
 * reader that subscribed, reads each message once and sends it to that
 * host's relay in pieces (WIRE_QMSG); the other seats of the stream are
 * read alongside and let go, so the writer waits for every reader as on
 * one host. On the readers' host, the relay publishes each message whole
 * into a local queue of the same name, where the readers read it as any
 * local reader does. The daemon's calls wait (futexes, the socket), so each
 * stream has a thread and a connection of its own; the loop talks to it
 * through a mutex and an async handle. A stream cut (its peer gone) leaves
 * the quorum as a dead reader does: its seats are closed at once.
 * The threads are stream.c's; this file is the loop's side. Knows peer.c's
 * and local.c's calls, not UCX.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../client/internal.h"
#include "stream.h"

/* Where a remote host's stream of a queue stopped: its count of messages. */
struct record {
    char peer_name[RELAY_NAME_MAX + 1];
    char queue[WIRE_QUEUE_NAME_MAX + 1];
    uint64_t position;
};

struct forward {
    uv_async_t async;
    LIST_HEAD(, stream) streams;
    unsigned nstreams;
    struct record records[FWD_RECORDS_MAX];
    unsigned nrecords;
};

static void stream_free(struct stream *s)
{
    struct fmsg *m;
    LIST_REMOVE(s, link);
    s->relay->fwd->nstreams--;
    while ((m = STAILQ_FIRST(&s->msgs))) {
        STAILQ_REMOVE_HEAD(&s->msgs, link);
        free(m);
    }
    free(s->asm_buf);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Streams kept only to say why they ended: past keep of them, the oldest
 * go (a relay serves many queues over its life, each made afresh). */
static void reclaim_ended(struct relay *r, unsigned keep)
{
    for (;;) {
        struct stream *s, *oldest = NULL;
        unsigned n = 0;
        LIST_FOREACH(s, &r->fwd->streams, link)
            if (s->dir == IN && s->stop && !s->started && s->nwaiters == 0) {
                oldest = s; /* the list is newest first */
                n++;
            }
        if (n <= keep || !oldest)
            return;
        stream_free(oldest);
    }
}

static struct stream *stream_new(struct relay *r, enum stream_dir dir, struct peer *p,
                                 uint64_t id, const char *queue)
{
    struct stream *s;
    if (r->fwd->nstreams >= FWD_STREAMS_MAX)
        reclaim_ended(r, 0);
    if (r->fwd->nstreams >= FWD_STREAMS_MAX)
        return NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->relay = r;
    s->async = &r->fwd->async;
    s->dir = dir;
    s->peer = p;
    snprintf(s->peer_name, sizeof(s->peer_name), "%s", p->name);
    s->id = id;
    snprintf(s->queue, sizeof(s->queue), "%s", queue);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    STAILQ_INIT(&s->msgs);
    s->state = S_OPENING;
    LIST_INSERT_HEAD(&r->fwd->streams, s, link);
    r->fwd->nstreams++;
    return s;
}

static int stream_start(struct stream *s)
{
    int rc = pthread_create(&s->thread, NULL, s->dir == OUT ? stream_out_thread : stream_in_thread, s);
    if (rc != 0)
        return -rc;
    s->started = true;
    return 0;
}

static void stream_stop(struct stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static struct record *record_for(struct forward *f, const char *peer, const char *queue,
                                 bool make)
{
    for (unsigned i = 0; i < f->nrecords; i++)
        if (strcmp(f->records[i].peer_name, peer) == 0 &&
            strcmp(f->records[i].queue, queue) == 0)
            return &f->records[i];
    if (!make)
        return NULL;
    struct record *rec = &f->records[f->nrecords < FWD_RECORDS_MAX ? f->nrecords++
                                                                    : FWD_RECORDS_MAX - 1];
    snprintf(rec->peer_name, sizeof(rec->peer_name), "%s", peer);
    snprintf(rec->queue, sizeof(rec->queue), "%s", queue);
    rec->position = 0;
    return rec;
}

static void reply_waiter(struct stream *s, const struct sub_result *res)
{
    struct local_client *lc;
    char line[512];
    if (s->nwaiters == 0)
        return;
    lc = s->waiters[0];
    memmove(s->waiters, s->waiters + 1, --s->nwaiters * sizeof(s->waiters[0]));
    if (res->code < 0) {
        local_reply_error(lc, res->code, "Peer %s cannot give queue '%s' a reader: %s.",
                          s->peer_name, s->queue, res->text);
        return;
    }
    snprintf(line, sizeof(line), "{\"ok\":true,\"seat\":%u,\"missed\":%llu}", res->seat,
             (unsigned long long)res->missed);
    local_reply(lc, line);
}

/* OUT, loop: what the thread sent itself into the peer's counts. */
static void out_count(struct stream *s)
{
    if (s->peer) {
        s->peer->msgs_out += s->thread_msgs;
        s->peer->bytes_out += s->thread_bytes;
    }
    s->thread_msgs = s->thread_bytes = 0;
}

/* OUT: send the seats' answers and what the thread handed over, under the
 * stream's lock, so that the thread's own sends come after them in order. */
static void out_pump(struct stream *s)
{
    unsigned char buf[WIRE_MSG_MAX];

    pthread_mutex_lock(&s->mu);
    out_count(s);
    for (unsigned i = 0; i < s->nresults; i++) {
        struct sub_result *res = &s->results[i];
        struct record *rec = record_for(s->relay->fwd, s->peer_name, s->queue, false);
        if (res->code == 0 && rec && s->base >= rec->position) {
            res->missed = s->base - rec->position;
            if (res->missed)
                relay_log("queue %s: peer %s returned; it missed %llu messages published "
                          "while it was away", s->queue, s->peer_name,
                          (unsigned long long)res->missed);
        }
        if (s->peer)
            peer_send(s->peer, buf, (size_t)wire_qsub_reply(buf, s->id, res->code, res->missed,
                                                            res->seat, res->text));
    }
    s->nresults = 0;
    stream_out_send(s, false);
    if (s->state == S_ENDED && !s->end_sent && s->peer) {
        s->end_sent = true;
        peer_send(s->peer, buf, (size_t)wire_qend(buf, s->id, s->end_code, s->end_text));
    }
    pthread_mutex_unlock(&s->mu);
}

/* IN: acknowledge what was published; answer subscriptions when it ended. */
static void in_pump(struct stream *s)
{
    unsigned char buf[WIRE_MSG_MAX];
    uint64_t published;
    bool ended;
    pthread_mutex_lock(&s->mu);
    published = s->published;
    ended = s->state == S_ENDED || s->state == S_CUT;
    pthread_mutex_unlock(&s->mu);
    /* Only what the writer's relay asked for, or half the window: it asks
     * before any wait of its own for an acknowledgement. */
    if (published != s->acked_sent && s->peer &&
        (s->ack_asked > s->acked_sent || published - s->acked_sent >= FWD_WINDOW / 2)) {
        s->acked_sent = published;
        s->acks++;
        peer_send(s->peer, buf, (size_t)wire_qack(buf, s->id, published));
    }
    /* Ended here (the local queue refused the writer, say): the writer's
     * relay lets go of its seats, or its writer would wait for them. */
    if (ended && !s->end_sent && s->peer && !s->ended_by_peer) {
        s->end_sent = true;
        peer_send(s->peer, buf, (size_t)wire_qunsub(buf, s->id, s->end_code, s->end_text));
    }
    while (ended && s->nwaiters) {
        struct sub_result res = {.code = s->end_code ? s->end_code : -EPIPE};
        snprintf(res.text, sizeof(res.text), "%s", s->end_text);
        reply_waiter(s, &res);
    }
}


static void on_async(uv_async_t *h)
{
    struct relay *r = h->data;
    struct stream *s, *next;
    for (s = LIST_FIRST(&r->fwd->streams); s; s = next) {
        bool exited;
        next = LIST_NEXT(s, link);
        /* Read before the pump, so that the pump sends what the thread left
         * before it exited (its last messages, its end); a thread that
         * exits after this wakes the loop again. */
        pthread_mutex_lock(&s->mu);
        exited = s->exited;
        pthread_mutex_unlock(&s->mu);
        if (s->dir == OUT)
            out_pump(s);
        else
            in_pump(s);
        if (!exited || !s->started)
            continue;
        pthread_join(s->thread, NULL);
        s->started = false;
        s->stop = true; /* (its thread is gone: no lock needed) */
        /* An IN stream stays until a new subscription to its queue replaces
         * it, so that its readers can ask why it ended. */
        if (s->dir == OUT)
            stream_free(s);
    }
    reclaim_ended(r, FWD_ENDED_KEEP);
}

static struct stream *stream_find(struct relay *r, enum stream_dir dir, struct peer *p,
                                  const char *peer_name, uint64_t id, const char *queue)
{
    struct stream *s;
    LIST_FOREACH(s, &r->fwd->streams, link) {
        if (s->dir != dir)
            continue;
        if (p && s->peer == p && (queue == NULL ? s->id == id : strcmp(s->queue, queue) == 0))
            return s;
        if (!p && peer_name && strcmp(s->peer_name, peer_name) == 0 && queue &&
            strcmp(s->queue, queue) == 0)
            return s;
    }
    return NULL;
}

static unsigned peer_streams(struct relay *r, const struct peer *p)
{
    struct stream *s;
    unsigned n = 0;
    LIST_FOREACH(s, &r->fwd->streams, link)
        n += s->peer == p && s->dir == OUT;
    return n;
}

/* A peer asks for a reader seat of one of our queues for its host. */
static void on_qsub(struct peer *p, const struct wire_msg *m)
{
    struct relay *r = p->relay;
    unsigned char buf[WIRE_MSG_MAX];
    struct stream *s = stream_find(r, OUT, p, NULL, m->id, NULL);
    if (s && (s->seat_from != m->size || s->seat_to != m->addr ||
              strcmp(s->queue, m->key) != 0)) {
        peer_fail(p, "asked for other seats or another queue under stream %llu",
                  (unsigned long long)m->id);
        return;
    }
    if (!s && peer_streams(r, p) >= FWD_PEER_STREAMS_MAX) {
        peer_send(p, buf, (size_t)wire_qsub_reply(buf, m->id, -EMFILE, 0, 0,
                                                  "a peer may read 64 queues here at once"));
        return;
    }
    if (!s) {
        s = stream_new(r, OUT, p, m->id, m->key);
        if (!s) {
            peer_send(p, buf, (size_t)wire_qsub_reply(buf, m->id, -EMFILE, 0, 0,
                                                      "the relay carries too many streams"));
            return;
        }
        s->seat_from = (unsigned)m->size;
        s->seat_to = (unsigned)m->addr;
        s->ep = p->ep; /* the thread is not started yet */
    }
    pthread_mutex_lock(&s->mu);
    bool over = s->want_seats >= s->seat_to - s->seat_from;
    if (!over)
        s->want_seats++;
    pthread_mutex_unlock(&s->mu);
    if (over) {
        peer_send(p, buf, (size_t)wire_qsub_reply(buf, m->id, -EBUSY, 0, 0,
                                                  "every seat the subscription may take is held"));
        return;
    }
    if (!s->started && !s->exited && stream_start(s) < 0) {
        peer_send(p, buf, (size_t)wire_qsub_reply(buf, m->id, -EAGAIN, 0, 0,
                                                  "the relay cannot start a thread"));
        stream_free(s);
        return;
    }
    relay_log("queue %s: peer %s subscribes (seats %u..%u)", s->queue, p->name, s->seat_from,
              s->seat_to - 1);
}

/* A piece of the next message of one of our subscriptions. */
static void on_qmsg(struct peer *p, struct stream *s, const struct wire_msg *m)
{
    struct fmsg *f;
    if (!s->asm_open) {
        if (m->addr != 0 || m->size > s->relay->max_object || m->size > FWD_MSG_MAX) {
            peer_fail(p, "sent a message of %llu bytes starting at %llu for queue %s (at most "
                      "%llu, from 0)", (unsigned long long)m->size,
                      (unsigned long long)m->addr, s->queue,
                      (unsigned long long)s->relay->max_object);
            return;
        }
        pthread_mutex_lock(&s->mu);
        unsigned queued = s->nmsgs;
        uint64_t queued_bytes = s->queued_bytes;
        pthread_mutex_unlock(&s->mu);
        if (queued >= FWD_WINDOW || queued_bytes > FWD_WINDOW_BYTES) {
            peer_fail(p, "sent more than %d messages or %u bytes of queue %s ahead of their "
                      "publishing", FWD_WINDOW, FWD_WINDOW_BYTES, s->queue);
            return;
        }
        s->asm_buf = malloc(sizeof(struct fmsg) + m->size);
        if (!s->asm_buf) {
            peer_fail(p, "sent a message of %llu bytes, which the relay cannot hold",
                      (unsigned long long)m->size);
            return;
        }
        s->asm_open = true;
        s->asm_total = m->size;
        s->asm_len = 0;
    }
    if (m->size != s->asm_total || m->addr != s->asm_len) {
        peer_fail(p, "sent a piece at %llu of %llu bytes where %llu of %llu were expected",
                  (unsigned long long)m->addr, (unsigned long long)m->size,
                  (unsigned long long)s->asm_len, (unsigned long long)s->asm_total);
        return;
    }
    f = (struct fmsg *)s->asm_buf;
    s->wire_sends++;
    memcpy(f->data + s->asm_len, m->rkey, m->rkey_len);
    s->asm_len += m->rkey_len;
    if (s->asm_len < s->asm_total)
        return;
    f->len = s->asm_total;
    s->asm_buf = NULL;
    s->asm_open = false;
    s->received++;
    if (m->ask_ack)
        s->ack_asked = s->received;
    pthread_mutex_lock(&s->mu);
    if (stream_in_publish_now(s, f->data, f->len)) {
        pthread_mutex_unlock(&s->mu);
        free(f);
        in_pump(s); /* its acknowledgement */
        return;
    }
    STAILQ_INSERT_TAIL(&s->msgs, f, link);
    s->nmsgs++;
    s->queued_bytes += f->len;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Several whole messages of one of our subscriptions, in order. */
static void on_qbatch(struct peer *p, struct stream *s, const struct wire_msg *m)
{
    struct fmsg_list got = STAILQ_HEAD_INITIALIZER(got);
    const unsigned char *bytes;
    size_t off = 0, n;
    uint64_t total = 0;
    struct fmsg *f;

    if (s->asm_open) {
        peer_fail(p, "sent a batch of queue %s inside a message in pieces (%llu of %llu "
                  "bytes came)", s->queue, (unsigned long long)s->asm_len,
                  (unsigned long long)s->asm_total);
        return;
    }
    pthread_mutex_lock(&s->mu);
    unsigned queued = s->nmsgs;
    uint64_t queued_bytes = s->queued_bytes;
    pthread_mutex_unlock(&s->mu);
    if (queued + m->size > FWD_WINDOW || queued_bytes > FWD_WINDOW_BYTES) {
        peer_fail(p, "sent a batch of %llu messages of queue %s with %u waiting to be "
                  "published (at most %d ahead of their publishing)",
                  (unsigned long long)m->size, s->queue, queued, FWD_WINDOW);
        return;
    }
    s->wire_sends++;
    while (wire_qbatch_next(m, &off, &bytes, &n)) {
        if (n > s->relay->max_object) {
            peer_fail(p, "sent a message of %zu bytes for queue %s (at most %llu)", n,
                      s->queue, (unsigned long long)s->relay->max_object);
            break;
        }
        f = malloc(sizeof(*f) + n);
        if (!f) {
            peer_fail(p, "sent a batch of %llu messages, which the relay cannot hold",
                      (unsigned long long)m->size);
            break;
        }
        f->len = n;
        memcpy(f->data, bytes, n);
        total += n;
        STAILQ_INSERT_TAIL(&got, f, link);
    }
    if (p->state == PEER_CLOSING) {
        while ((f = STAILQ_FIRST(&got))) {
            STAILQ_REMOVE_HEAD(&got, link);
            free(f);
        }
        return;
    }
    unsigned count = (unsigned)m->size;
    uint64_t published;
    s->received += count;
    if (m->ask_ack)
        s->ack_asked = s->received;
    pthread_mutex_lock(&s->mu);
    published = s->published;
    while ((f = STAILQ_FIRST(&got)) && stream_in_publish_now(s, f->data, f->len)) {
        STAILQ_REMOVE_HEAD(&got, link);
        count--;
        total -= f->len;
        free(f);
    }
    STAILQ_CONCAT(&s->msgs, &got);
    s->nmsgs += count;
    s->queued_bytes += total;
    if (count)
        pthread_cond_broadcast(&s->cv);
    published = s->published != published;
    pthread_mutex_unlock(&s->mu);
    if (published)
        in_pump(s); /* the acknowledgement of those published here */
}

void forward_on_message(struct peer *p, const struct wire_msg *m)
{
    struct relay *r = p->relay;
    struct stream *s;
    if (m->type == WIRE_QSUB) {
        on_qsub(p, m);
        return;
    }
    s = stream_find(r, m->type == WIRE_QACK || m->type == WIRE_QUNSUB ? OUT : IN, p, NULL,
                    m->id, NULL);
    if (!s || (s->dir == IN && s->stop)) {
        if (m->type == WIRE_QSUB_REPLY)
            peer_fail(p, "answered for stream %llu, which this relay never asked for",
                      (unsigned long long)m->id);
        return; /* pieces and acks of a stream that just ended */
    }
    switch (m->type) {
    case WIRE_QSUB_REPLY: {
        struct sub_result res = {.code = m->code, .seat = (unsigned)m->addr,
                                 .missed = m->size};
        snprintf(res.text, sizeof(res.text), "%s", m->text);
        if (res.code == 0) {
            s->state = S_RUNNING;
            s->missed += m->size;
            s->granted++;
        }
        reply_waiter(s, &res);
        break;
    }
    case WIRE_QMSG:
        on_qmsg(p, s, m);
        break;
    case WIRE_QBATCH:
        on_qbatch(p, s, m);
        break;
    case WIRE_QACK:
        pthread_mutex_lock(&s->mu);
        s->acks++;
        while (s->acked < m->size && s->acked < s->produced) {
            s->unacked_bytes -= s->sizes[s->acked % FWD_WINDOW];
            s->acked++;
        }
        stream_out_acked(s);
        pthread_cond_broadcast(&s->cv);
        bool held = !STAILQ_EMPTY(&s->msgs);
        uint64_t before = s->wire_sends;
        pthread_mutex_unlock(&s->mu);
        out_pump(s); /* what the thread held for this acknowledgement */
        if (held) {
            pthread_mutex_lock(&s->mu);
            s->sent_on_ack += s->wire_sends - before;
            pthread_mutex_unlock(&s->mu);
        }
        break;
    case WIRE_QUNSUB:
        relay_log("queue %s: peer %s left (%s)", s->queue, p->name, m->text);
        stream_stop(s);
        break;
    default: /* WIRE_QEND: the local writer leaves once it has published what came */
        pthread_mutex_lock(&s->mu);
        s->state = S_ENDED;
        s->end_code = m->code;
        snprintf(s->end_text, sizeof(s->end_text), "%s", m->text);
        s->ended_by_peer = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        relay_log("queue %s from peer %s ended: %s", s->queue, p->name, m->text);
        in_pump(s);
        break;
    }
}

/* The peer went: its streams are cut. Our seats for it close at once (the
 * writer no longer waits for that host); the local writer of its streams
 * leaves, so the local readers get the end once they read what came. */
void forward_peer_gone(struct peer *p)
{
    struct relay *r = p->relay;
    struct stream *s;
    LIST_FOREACH(s, &r->fwd->streams, link) {
        if (s->peer != p)
            continue;
        pthread_mutex_lock(&s->mu);
        if (s->dir == OUT)
            out_count(s);
        s->ep = NULL; /* closed after this: the thread sends no more on it */
        if (s->state != S_ENDED) {
            s->state = S_CUT;
            s->end_code = -ECONNRESET;
            snprintf(s->end_text, sizeof(s->end_text),
                     "the connection to peer %s was lost: %.300s", s->peer_name,
                     p->last_error[0] ? p->last_error : "closed");
        }
        pthread_mutex_unlock(&s->mu);
        if (s->dir == OUT) {
            struct record *rec = record_for(r->fwd, s->peer_name, s->queue, true);
            rec->position = s->base + s->produced;
        }
        s->peer = NULL;
        stream_stop(s);
        if (s->dir == IN)
            in_pump(s);
    }
    uv_async_send(&r->fwd->async);
}

/* The live readers of this host's queue name (UINT_MAX when the daemon
 * cannot say: then the writer's relay is asked). */
static unsigned local_readers(struct relay *r, const char *name)
{
    shmb_queue_list_t *list = NULL;
    unsigned n = UINT_MAX;
    if (shmb_queue_summary(r->c, &list) < 0)
        return n;
    for (size_t i = 0; i < list->count; i++)
        if (strcmp(list->queues[i].name, name) == 0)
            n = list->queues[i].seats_live;
    shmb_queue_list_free(list);
    return n;
}

/* A local {"op":"queue_subscribe","peer":P,"queue":Q,"seat_from":A,
 * "seat_to":B,"seats":N,"slots":S,"slot_size":Z}: a reader of this host
 * joins P's queue Q; the answer comes when P's relay has a seat for it. */
void forward_local_subscribe(struct local_client *lc, json_t *req)
{
    struct relay *r = lc->relay;
    json_error_t jerr;
    const char *op, *peer, *queue;
    json_int_t from, to, seats, slots, slot_size;
    unsigned char buf[WIRE_MSG_MAX];
    struct peer *p;
    struct stream *s;

    if (json_unpack_ex(req, &jerr, JSON_STRICT, "{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I}",
                       "op", &op, "peer", &peer, "queue", &queue, "seat_from", &from,
                       "seat_to", &to, "seats", &seats, "slots", &slots, "slot_size",
                       &slot_size) < 0) {
        local_reply_error(lc, -EINVAL, "queue_subscribe takes \"peer\", \"queue\", "
                          "\"seat_from\", \"seat_to\", \"seats\", \"slots\" and \"slot_size\": %s.",
                          jerr.text);
        return;
    }
    if (!wire_queue_name_ok(queue, strlen(queue)) || from < 0 || to <= from ||
        to > WIRE_QSEATS_MAX || seats < 1 || seats > WIRE_QSEATS_MAX || slots < 0 ||
        slot_size < 0) {
        local_reply_error(lc, -EINVAL, "queue_subscribe: a queue name of 1 to %d of A-Z a-z "
                          "0-9 _ -, seats 0 <= seat_from < seat_to <= %d, 1 to %d local "
                          "seats, and slots and slot_size of 0 or more.",
                          WIRE_QUEUE_NAME_MAX, WIRE_QSEATS_MAX, WIRE_QSEATS_MAX);
        return;
    }
    p = peer_find(r, peer);
    if (!p || p->state != PEER_READY) {
        local_reply_error(lc, -ENOTCONN, "Peer %.64s is not connected%s%s.", peer,
                          p && p->last_error[0] ? ": " : "", p ? p->last_error : "");
        return;
    }
    /* A stream that ended or was cut and whose thread is gone is replaced;
     * one still running takes another seat. */
    struct stream *next;
    s = NULL;
    for (struct stream *t = LIST_FIRST(&r->fwd->streams); t; t = next) {
        next = LIST_NEXT(t, link);
        if (t->dir != IN || strcmp(t->peer_name, peer) != 0 || strcmp(t->queue, queue) != 0)
            continue;
        if (t->stop && !t->started)
            stream_free(t);
        else if (t->peer == p && !t->stop && t->state != S_ENDED && t->state != S_CUT)
            s = t;
    }
    if (s && s->nwaiters >= FWD_WAITERS_MAX) {
        local_reply_error(lc, -EBUSY, "%u subscriptions to queue '%s' wait already.",
                          s->nwaiters, queue);
        return;
    }
    if (!s) {
        s = stream_new(r, IN, p, ++r->next_id, queue);
        if (!s) {
            local_reply_error(lc, -EMFILE, "The relay carries %d streams already.",
                              FWD_STREAMS_MAX);
            return;
        }
        s->seat_from = (unsigned)from;
        s->seat_to = (unsigned)to;
        s->seats = (unsigned)seats;
        s->slots = (uint64_t)slots;
        s->slot_size = (uint64_t)slot_size;
        if (stream_start(s) < 0) {
            stream_free(s);
            local_reply_error(lc, -EAGAIN, "The relay cannot start a thread.");
            return;
        }
    }
    /* A reader that left and joins again takes its old place in the
     * stream: the writer's relay is asked for a seat only for a reader
     * more than it gave seats to. */
    if (s->state == S_RUNNING && s->nwaiters == 0 && local_readers(r, queue) <= s->granted) {
        char line[64];
        snprintf(line, sizeof(line), "{\"ok\":true,\"seat\":-1,\"missed\":0}");
        local_reply(lc, line);
        return;
    }
    s->waiters[s->nwaiters++] = lc;
    peer_send(p, buf, (size_t)wire_qsub(buf, s->id, s->seat_from, s->seat_to, queue));
}

/* A local {"op":"queue_state","peer":P,"queue":Q}: whether this host's
 * stream of P's queue Q runs, and if not why it ended. */
void forward_local_state(struct local_client *lc, json_t *req)
{
    json_error_t jerr;
    const char *op, *peer, *queue;
    struct stream *s;
    json_t *reply;
    static const char *names[] = {"opening", "running", "cut", "ended"};

    if (json_unpack_ex(req, &jerr, JSON_STRICT, "{s:s, s:s, s:s}", "op", &op, "peer", &peer,
                       "queue", &queue) < 0) {
        local_reply_error(lc, -EINVAL, "queue_state takes \"peer\" and \"queue\": %s.",
                          jerr.text);
        return;
    }
    s = NULL;
    LIST_FOREACH(s, &lc->relay->fwd->streams, link)
        if (s->dir == IN && strcmp(s->peer_name, peer) == 0 && strcmp(s->queue, queue) == 0)
            break;
    if (!s) {
        local_reply_error(lc, -ENOENT, "This relay carries no queue '%.40s' from peer %.64s.",
                          queue, peer);
        return;
    }
    pthread_mutex_lock(&s->mu);
    reply = json_pack("{s:b, s:s, s:i, s:s, s:I, s:I}", "ok", 1, "state", names[s->state],
                      "code", s->end_code, "message", s->end_text, "published",
                      (json_int_t)s->published, "missed", (json_int_t)s->missed);
    pthread_mutex_unlock(&s->mu);
    local_reply_json(lc, reply);
}

void forward_client_gone(struct local_client *lc)
{
    struct stream *s;
    LIST_FOREACH(s, &lc->relay->fwd->streams, link) {
        unsigned j = 0;
        for (unsigned i = 0; i < s->nwaiters; i++)
            if (s->waiters[i] != lc)
                s->waiters[j++] = s->waiters[i];
        s->nwaiters = j;
    }
}

int forward_setup(struct relay *r, struct shmb_error *err)
{
    r->fwd = calloc(1, sizeof(*r->fwd));
    if (!r->fwd)
        return shmb_error_set(err, -ENOMEM, "The relay is out of memory.");
    LIST_INIT(&r->fwd->streams);
    uv_async_init(r->loop, &r->fwd->async, on_async);
    r->fwd->async.data = r;
    return 0;
}

/* Every stream stopped and its thread joined: the threads' waits are
 * bounded, so this takes at most about FWD_WAIT_MS. */
void forward_teardown(struct relay *r)
{
    struct stream *s;
    if (!r->fwd)
        return;
    LIST_FOREACH(s, &r->fwd->streams, link)
        stream_stop(s);
    while ((s = LIST_FIRST(&r->fwd->streams))) {
        if (s->started)
            pthread_join(s->thread, NULL);
        stream_free(s);
    }
    uv_close((uv_handle_t *)&r->fwd->async, NULL);
}

void forward_status(const struct relay *r, json_t *reply)
{
    json_t *streams = json_array();
    struct stream *s;
    static const char *names[] = {"opening", "running", "cut", "ended"};
    if (!r->fwd || !streams)
        return;
    LIST_FOREACH(s, &r->fwd->streams, link) {
        pthread_mutex_lock(&s->mu);
        json_t *q = json_pack(
            "{s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "queue", s->queue, "peer",
            s->peer_name, "direction", s->dir == OUT ? "out" : "in", "state", names[s->state],
            "messages", (json_int_t)(s->dir == OUT ? s->produced : s->published),
            "published_by_loop", (json_int_t)s->published_now, "wire_messages",
            (json_int_t)s->wire_sends, "acks", (json_int_t)s->acks);
        if (q && s->dir == OUT)
            json_object_update_new(
                q, json_pack("{s:I, s:I, s:I, s:I, s:I}", "handoffs", (json_int_t)s->handoffs,
                             "window_waits", (json_int_t)s->window_waits, "sent_by_thread",
                             (json_int_t)s->sent_by_thread, "holds", (json_int_t)s->holds,
                             "sent_on_ack", (json_int_t)s->sent_on_ack));
        else if (q)
            json_object_set_new(q, "thread_rounds", json_integer((json_int_t)s->thread_rounds));
        json_array_append_new(streams, q);
        pthread_mutex_unlock(&s->mu);
    }
    json_object_set_new(reply, "queues", streams);
}
