// SPDX-License-Identifier: Apache-2.0
/*
 * The wait of a queue's data path: a reserve or a dequeue over
 * proto/queue.c's shmb_q_*, cut into slices with a look at the connection
 * between them, so that a member notices a daemon that was killed. Knows
 * nothing of the ops or of overflow objects.
 */
#include "queue_inner.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <time.h>

/* The monotonic clock in nanoseconds. */
int64_t queue_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 0 while q's connection is open, else -ECONNRESET: the daemon went away
 * (killed: a clean stop shuts the queues down first). The socket is only
 * polled, never read: replies stay where the calls look for them. */
int queue_watch(shmb_queue_t *q)
{
    struct pollfd p = {.fd = q->c->sock, .events = POLLRDHUP};

    if (p.fd < 0 || poll(&p, 1, 0) <= 0 ||
        (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0)
        return 0;
    return shmb_error_set(&q->c->err, -ECONNRESET,
                          "shmbrokerd went away: the connection under queue '%s' was "
                          "closed without a clean stop (the daemon was killed?), so the "
                          "queue has no daemon to watch its members; reconnect and open "
                          "it again.",
                          q->name);
}

/* Reserve or dequeue as w says, waiting up to timeout_ms (-1: for ever) in
 * slices of QUEUE_SLICE_MS with a look at the connection between them. */
int queue_wait(shmb_queue_t *q, const struct queue_wait *w, int timeout_ms)
{
    int64_t deadline, left;
    int rc, slice;

    if (timeout_ms >= 0 && timeout_ms <= QUEUE_SLICE_MS)
        slice = timeout_ms;
    else
        slice = QUEUE_SLICE_MS;
    deadline = timeout_ms < 0 ? INT64_MAX : queue_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        if (w->msg == NULL)
            rc = shmb_q_reserve(&q->q, w->len, w->buf, slice, &q->c->err);
        else
            rc = shmb_q_dequeue(&q->q, (uint32_t)q->seat, w->msg, w->msg_len, slice,
                                &q->c->err);
        if (rc != -ETIMEDOUT)
            return rc;
        /* Every wait that ends empty looks at the connection, the short
         * ones too: a loop of short timeouts sees a killed daemon. */
        if (timeout_ms != 0 && (rc = queue_watch(q)) < 0)
            return rc;
        if (slice == timeout_ms)
            return -ETIMEDOUT;
        left = deadline - queue_now_ns();
        if (left <= 0)
            break;
        slice = left >= (int64_t)QUEUE_SLICE_MS * 1000000 ? QUEUE_SLICE_MS
                                                          : (int)((left + 999999) / 1000000);
    }
    /* The last slice's message names the slice; the caller waited longer. */
    if (w->msg == NULL)
        return shmb_error_set(&q->c->err, -ETIMEDOUT,
                              "No free slot in %d ms: reader seat %u has not read message "
                              "%llu of this queue.",
                              timeout_ms, q->q.blocker,
                              (unsigned long long)(q->q.head - q->q.slots));
    return shmb_error_set(&q->c->err, -ETIMEDOUT, "No message in %d ms.", timeout_ms);
}
