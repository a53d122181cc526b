// SPDX-License-Identifier: Apache-2.0
/*
 * What a queue's stream on the writer's host sends its peer (stream.h):
 * the messages its thread read, in batches or in pieces, sent by the
 * thread itself when the UCP worker takes calls from any thread, else by
 * the loop, always under the stream's lock so that they go in order.
 * Knows wire.c's encoders and peer.c's sends, not the daemon.
 */
#include <errno.h>
#include <stdlib.h>

#include "stream.h"

/* One message of stream s to its peer, from its thread or the loop. */
static int out_wire_send(struct stream *s, const void *buf, size_t len, bool from_thread)
{
    ucs_status_t st;
    int rc;
    if (!from_thread)
        rc = s->peer ? peer_send(s->peer, buf, len) : -ENOTCONN;
    else if (!s->ep)
        rc = -ENOTCONN;
    else if ((rc = peer_send_ep(s->ep, buf, len, &st)) == 0) {
        s->thread_msgs++;
        s->thread_bytes += len;
        s->sent_by_thread++;
    }
    if (rc == 0)
        s->wire_sends++;
    return rc;
}

/* A send ended at message count end: the thread holds what it reads while
 * FWD_HOLD_SENDS such sends wait for their acknowledgement. */
static void out_mark(struct stream *s)
{
    uint64_t end = s->produced - s->nmsgs;
    if (s->marks_len < FWD_WINDOW)
        s->marks[(s->marks_head + s->marks_len++) % FWD_WINDOW] = end;
}

void stream_out_acked(struct stream *s)
{
    while (s->marks_len && s->marks[s->marks_head] <= s->acked) {
        s->marks_head = (s->marks_head + 1) % FWD_WINDOW;
        s->marks_len--;
    }
}

/* Whether the send about to end a batch or a message asks the peer to
 * acknowledge it (WIRE_ASK_ACK): when it leaves FWD_ASK_SENDS sends
 * unacknowledged, or half the window waits. The peer acknowledges
 * nothing else before half the window was published, so every wait of
 * the thread (the window full, messages held) has an ask before it. */
static bool out_asks(const struct stream *s)
{
    return s->marks_len + 1 >= FWD_ASK_SENDS || s->produced - s->acked >= FWD_WINDOW / 2 ||
           s->unacked_bytes >= FWD_WINDOW_BYTES / 2;
}

/* Take the first message of s->msgs off, once sent. */
static void out_drop(struct stream *s)
{
    struct fmsg *m = STAILQ_FIRST(&s->msgs);
    STAILQ_REMOVE_HEAD(&s->msgs, link);
    s->nmsgs--;
    free(m);
}

void stream_out_send(struct stream *s, bool from_thread)
{
    unsigned char buf[WIRE_MSG_MAX];
    while (!STAILQ_EMPTY(&s->msgs)) {
        struct fmsg *m = STAILQ_FIRST(&s->msgs);
        struct fmsg *m2 = STAILQ_NEXT(m, link);
        /* Small messages that came together go together: one active
         * message, one wake-up of the peer's loop and of its thread. */
        if (m2 && m->len + m2->len + 4 <= WIRE_BATCH_BYTES) {
            struct wire_batch b;
            unsigned n = 0;
            wire_qbatch_begin(&b, buf, s->id);
            for (m = STAILQ_FIRST(&s->msgs); m && wire_qbatch_add(&b, m->data, m->len) == 0;
                 m = STAILQ_NEXT(m, link))
                n++;
            size_t len = wire_qbatch_end(&b);
            if (out_asks(s))
                wire_ask_ack(buf);
            if (out_wire_send(s, buf, len, from_thread) < 0 && from_thread)
                return;
            while (n--)
                out_drop(s);
            out_mark(s);
            continue;
        }
        /* Alone, in pieces: the thread sends the first or hands it all over. */
        for (size_t off = 0; off < m->len || m->len == 0;) {
            size_t n = m->len - off < WIRE_CHUNK_MAX ? m->len - off : WIRE_CHUNK_MAX;
            size_t len = (size_t)wire_qmsg(buf, s->id, m->len, off, m->data + off, n);
            if (off + n == m->len && out_asks(s))
                wire_ask_ack(buf);
            int rc = out_wire_send(s, buf, len, from_thread);
            if (rc < 0 && from_thread && off == 0)
                return;
            off += n;
            if (m->len == 0)
                break;
        }
        out_drop(s);
        out_mark(s);
    }
}
