// SPDX-License-Identifier: Apache-2.0
/*
 * A connection's turns: its lines read and framed, each run through the
 * command layer, the replies delivered and written (the descriptor passed
 * with a hello or queue_open reply), waits for space or pages, a turn
 * deferred, the input's end, the finish.
 */
#include "conn_turn.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/sock.h"
#include "clock.h"
#include "log.h"

/* How long one connection's requests run before the other clients get a
 * turn: a line of cheap requests takes microseconds each, but thousands of
 * pipelined 'list' over a large store would otherwise hold every other
 * client for seconds. */
#define CONN_TURN_MS 10

/* What the connection does after a request. */
enum conn_step {
    CONN_STEP_NEXT,  /* go on with the next request */
    CONN_STEP_CLOSE, /* send what is queued, then close */
    CONN_STEP_WAIT,  /* an alloc waits for space, or the hello reply waits for the
                   write queue to drain: run nothing more until then */
    CONN_STEP_DROP,  /* close at once, dropping what is queued */
};

/* A write in flight; owns the bytes it writes. */
struct conn_write {
    uv_write_t req;
    char *data;
};

static void conn_resume(struct conn *conn);
static void conn_on_writable(uv_poll_t *poll, int status, int events);
static void conn_watch_gone(struct conn *conn);
static void conn_defer(struct conn *conn);
static void conn_after(struct conn *conn, enum conn_step step);
static void conn_on_gone(uv_poll_t *poll, int status, int events);

static void conn_on_write(uv_write_t *req, int status)
{
    struct conn_write *w = (struct conn_write *)req;
    struct conn *conn = req->handle->data;

    shmb_free(w->data);
    shmb_free(w);
    if (status < 0 && conn_peer_gone(status) && conn->state != CONN_CLOSED) {
        conn_lose_peer(conn);
        status = 0;
    }
    if (status < 0 && status != UV_ECANCELED && conn->state != CONN_CLOSED) {
        log_debug("client %s: write failed: %s", conn_pid(conn),
                  uv_strerror(status));
        conn_close(conn);
        return;
    }
    if (conn->state == CONN_HELLO_HELD &&
        uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe) == 0)
        conn_resume(conn);
}

/* Write this batch's replies: directly when the socket takes them, else queue
 * the rest (the write request takes the buffer). */
int conn_flush(struct conn *conn)
{
    uv_stream_t *stream = (uv_stream_t *)&conn->pipe;
    struct conn_write *w;
    uv_buf_t buf;
    size_t done = 0;
    int rc;

    if (conn->out.len == 0 || conn->state == CONN_CLOSED)
        return 0;
    if (conn->reset) {
        conn->out.len = 0; /* nobody to read them */
        return 0;
    }
    /* Output still queued from earlier batches means a client that sends
     * but does not read: past the bound it is cut off, so that it cannot
     * grow the daemon's memory. One large reply (a list) is fine alone. */
    if (uv_stream_get_write_queue_size(stream) > conn->set->policy->max_queued_output) {
        conn_log_unread(conn);
        return UV_ENOBUFS;
    }
    buf = uv_buf_init(conn->out.buf, (unsigned)conn->out.len);
    rc = uv_try_write(stream, &buf, 1);
    if (rc > 0)
        done = (size_t)rc;
    else if (rc != UV_EAGAIN)
        return rc;
    if (done == conn->out.len) {
        conn->out.len = 0; /* keep the buffer for the next batch */
        return 0;
    }
    w = shmb_malloc(sizeof(*w));
    if (w == NULL)
        return UV_ENOMEM;
    if (done > 0)
        memmove(conn->out.buf, conn->out.buf + done, conn->out.len - done);
    w->data = conn->out.buf;
    buf = uv_buf_init(w->data, (unsigned)(conn->out.len - done));
    memset(&conn->out, 0, sizeof(conn->out));
    rc = uv_write(&w->req, stream, &buf, 1, conn_on_write);
    if (rc < 0) {
        shmb_free(w->data);
        shmb_free(w);
        return rc;
    }
    if (uv_stream_get_write_queue_size(stream) > conn->set->policy->max_queued_output)
        conn_set_unread_watch(conn->set);
    return 0;
}

/* Send the pending replies (the hello or queue_open reply last) with fd
 * attached, in one sendmsg: libuv's uv_write2 cannot pass an arbitrary
 * descriptor. Only safe while nothing else is queued. */
static int conn_send_fd(struct conn *conn, int fd)
{
    uv_os_fd_t sock;
    ssize_t n;

    if (uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe) != 0 ||
        uv_fileno((uv_handle_t *)&conn->pipe, &sock) != 0)
        return UV_EAGAIN;
    /* libuv's errors are negative errnos on Unix, as shmb_sock_send_fd's. */
    n = shmb_sock_send_fd(sock, conn->out.buf, conn->out.len, fd);
    if (n < 0)
        return (int)n;
    /* The descriptor travelled with the first byte; the rest, if the socket
     * took only part, goes the ordinary way. */
    if ((size_t)n < conn->out.len)
        memmove(conn->out.buf, conn->out.buf + n, conn->out.len - (size_t)n);
    conn->out.len -= (size_t)n;
    return conn_flush(conn);
}

/* Hold this batch's output, the hello reply last, until it can travel with
 * the segment's descriptor (conn_resume). */
static void conn_hold_output(struct conn *conn)
{
    shmb_free(conn->hello.buf);
    conn->hello = conn->out;
    memset(&conn->out, 0, sizeof(conn->out));
    conn_set_state(conn, CONN_HELLO_HELD);
}

/* sendmsg found no room in the socket for the hello reply: hold this
 * batch's output (the hello reply last) and wait until the socket is
 * writable, then send it with its descriptor (conn_resume). A hello reply
 * never goes without its descriptor. 0 or a libuv error. */
static int conn_hold_hello(struct conn *conn)
{
    int rc;

    if ((rc = conn_watch(conn, UV_WRITABLE, conn_on_writable)) < 0)
        return rc;
    conn_hold_output(conn);
    return 0;
}

/* The socket has room again for a held hello reply. */
static void conn_on_writable(uv_poll_t *poll, int status, int events)
{
    struct conn_watch *w = poll->data;
    struct conn *conn = w->conn;

    (void)events;
    uv_poll_stop(poll);
    if (conn == NULL || conn->state != CONN_HELLO_HELD)
        return;
    if (status < 0) {
        log_debug("client %s: waiting to send the hello reply failed: %s",
                  conn_pid(conn), uv_strerror(status));
        conn_close(conn);
        return;
    }
    /* Replies still queued in libuv go first; their write callback resumes. */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe) == 0)
        conn_resume(conn);
}

/* Send this batch's output, the hello reply last, with the segment's
 * descriptor (a queue_open reply: the queue's, conn->pass_fd); or hold it
 * until the socket has room. 0 when sent, 1 when
 * held, a libuv error when the connection must be dropped. */
static int conn_pass_fd(struct conn *conn)
{
    /* Read-only clients get a descriptor that cannot be mapped for writing. */
    const struct segment *seg = &conn->client.pool->seg;
    bool queue = conn->pass_fd >= 0;
    int rc = conn_send_fd(conn, queue                     ? conn->pass_fd
                                : conn->client.read_only ? seg->ro_fd
                                                         : seg->fd);

    if (rc == UV_EAGAIN && (rc = conn_hold_hello(conn)) == 0)
        return 1;
    if (queue) {
        /* Sent, or never to be: the duplicate is not needed any more. */
        close(conn->pass_fd);
        conn->pass_fd = -1;
    }
    if (queue && conn_peer_gone(rc)) {
        /* The client went: as for any reply, what it sent behind the
         * queue_open still runs (its replies dropped). */
        conn_watch_free(conn);
        conn_lose_peer(conn);
        return 0;
    }
    if (rc < 0) {
        /* Dropped, not closed gracefully: a graceful close would flush the
         * hello reply without its descriptor. */
        log_warn("client %s: cannot pass the %s descriptor: %s; "
                 "disconnecting it",
                 conn_pid(conn), queue ? "queue's" : "segment", uv_strerror(rc));
        return rc;
    }
    /* Sent: the poll for room (and its dup) is not needed any more. */
    conn_watch_free(conn);
    if (queue)
        return 0;
    log_info("client %s uid %d (%s, %s) connected", conn_pid(conn),
             (int)conn->client.uid, conn_name(conn),
             conn->client.read_only ? "read-only" : "read-write");
    return 0;
}

/* Act on a command's result: queue its reply, pass the descriptor after
 * hello, or park the connection as a waiter. */
static enum conn_step conn_deliver(struct conn *conn, struct command_result *res)
{
    int rc;

    if ((res->flags & COMMAND_WAIT_SOFT) && conn->eof) {
        /* A wait the request did not ask for (commits on their way): after
         * the end of input it is answered at once, as it was before such
         * waits, and the requests behind it run. */
        struct command_result now;

        command_retry(conn->set->env, &conn->client, res->wait_request,
                      res->wait_until_ms, true, &now);
        json_decref(res->wait_request);
        return conn_deliver(conn, &now);
    }
    if ((res->flags & COMMAND_WAIT) && conn->eof) {
        /* After the end of input an alloc does not wait (a waiting alloc
         * does not outlive the end of input either): the client may be
         * gone, and its pins would stay with the wait, up to an hour. */
        json_decref(res->wait_request);
        log_info("client %s: an alloc that would wait came after the end of its "
                 "input; closing the connection",
                 conn_pid(conn));
        return conn->reset ? CONN_STEP_DROP : CONN_STEP_CLOSE;
    }
    if (res->flags & COMMAND_WORK) {
        /* The reply comes through conn_on_work_done; the requests behind
         * it wait, in order. */
        conn_set_state(conn, CONN_WORKING);
        return CONN_STEP_WAIT;
    }
    if (res->flags & COMMAND_WAIT) {
        conn->wait_soft = (res->flags & COMMAND_WAIT_SOFT) != 0;
        conn_set_state(conn, CONN_WAITING);
        waitq_add(&conn->set->waitq, &conn->wait, res->wait_request, res->wait_until_ms);
        /* Reading paused already (behind a queue's pages or a short wait):
         * this wait may be long, and the client's going must end it. */
        conn_watch_gone(conn);
        return CONN_STEP_WAIT;
    }
    if (!(res->flags & COMMAND_SILENT)) {
        rc = conn_queue(conn, res);
        shmb_free(res->text.buf);
        if (rc < 0) {
            log_warn("client %s: out of memory for a reply; disconnecting it",
                     conn_pid(conn));
            return CONN_STEP_CLOSE;
        }
    }
    if ((res->flags & COMMAND_SEND_FD) && conn->reset) {
        conn->out.len = 0; /* the client is gone: no descriptor to pass */
        return res->flags & COMMAND_CLOSE ? CONN_STEP_CLOSE : CONN_STEP_NEXT;
    }
    if ((res->flags & COMMAND_SEND_FD) && res->fd >= 0) {
        /* A queue's descriptor, borrowed: a duplicate of it waits with the
         * reply, since the queue may go before the reply can be sent. */
        if (conn->pass_fd >= 0)
            close(conn->pass_fd);
        if ((conn->pass_fd = fcntl(res->fd, F_DUPFD_CLOEXEC, 0)) < 0) {
            log_warn("client %s: cannot duplicate a queue's descriptor: %s; "
                     "disconnecting it",
                     conn_pid(conn), strerror(errno));
            return CONN_STEP_DROP;
        }
    }
    if ((res->flags & COMMAND_SEND_FD) &&
        uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe) != 0) {
        /* Replies of earlier requests are still queued, and the descriptor
         * must travel with the hello reply, after them: hold this batch's
         * output until the queue drains (conn_on_write). */
        conn_hold_output(conn);
        return CONN_STEP_WAIT;
    }
    if (res->flags & COMMAND_SEND_FD) {
        rc = conn_pass_fd(conn);
        if (rc != 0)
            return rc > 0 ? CONN_STEP_WAIT : CONN_STEP_DROP;
    }
    return res->flags & COMMAND_CLOSE ? CONN_STEP_CLOSE : CONN_STEP_NEXT;
}

/* Run one complete line. */
static enum conn_step conn_handle_line(struct conn *conn, const char *line, size_t len)
{
    struct command_result res;

    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0)
        return CONN_STEP_NEXT; /* blank lines are not requests */
    /* One reply never exceeds what the client may leave unread. */
    conn->set->env->max_reply = conn->set->policy->max_queued_output;
    command_execute(conn->set->env, &conn->client, line, len, &res);
    return conn_deliver(conn, &res);
}

/* Over the bound on unread output with more requests behind: first hand
 * the kernel what it takes (a client that reads as it pipelines makes room
 * while the daemon builds), then judge on what is left. True when the
 * client is to be dropped (already logged). */
static bool conn_overflows(struct conn *conn)
{
    int rc;

    if (conn_unread(conn) <= conn->set->policy->max_queued_output)
        return false;
    if (conn->state != CONN_HELLO_HELD && (rc = conn_flush(conn)) < 0) {
        if (conn_peer_gone(rc)) {
            conn_lose_peer(conn);
            return false;
        }
        if (rc != UV_ENOBUFS) /* conn_flush logged that one */
            log_debug("client %s: write failed: %s", conn_pid(conn),
                      uv_strerror(rc));
        return true;
    }
    if (conn_unread(conn) <= conn->set->policy->max_queued_output)
        return false;
    conn_log_unread(conn);
    return true;
}

/* Frame and run the complete lines in the buffer, in order, until one asks
 * to close or to wait. After the client's end of input (conn->eof), the
 * last line run closes the connection. */
static enum conn_step conn_process(struct conn *conn)
{
    enum conn_step step = CONN_STEP_NEXT;
    uint64_t turn_start = clock_now_ms();
    size_t start = 0;
    char *nl;

    if (conn->state != CONN_READING)
        return CONN_STEP_WAIT;
    while (step == CONN_STEP_NEXT &&
           (nl = memchr(conn->in + start, '\n', conn->in_len - start)) != NULL) {
        size_t len = (size_t)(nl - (conn->in + start));

        step = conn_handle_line(conn, conn->in + start, len);
        start += len + 1;
        /* More replies than the bound on unread output, and more requests
         * behind them: the client sends without reading (a line of
         * pipelined 'list' requests would make the daemon hold gigabytes).
         * One large reply on its own is fine. */
        if (step == CONN_STEP_NEXT &&
            memchr(conn->in + start, '\n', conn->in_len - start) != NULL &&
            conn_overflows(conn))
            step = CONN_STEP_DROP;
        /* Its turn is over: the rest waits for the next loop iteration. */
        if (step == CONN_STEP_NEXT && clock_now_ms() - turn_start >= CONN_TURN_MS &&
            memchr(conn->in + start, '\n', conn->in_len - start) != NULL) {
            conn_defer(conn);
            step = CONN_STEP_WAIT;
        }
    }
    if (start > 0) {
        memmove(conn->in, conn->in + start, conn->in_len - start);
        conn->in_len -= start;
    }
    if (step == CONN_STEP_NEXT && conn->in_len > SHMB_MAX_LINE) {
        struct command_result res;

        command_oversized(SHMB_MAX_LINE, &res);
        conn_queue(conn, &res);
        shmb_free(res.text.buf);
        log_info("client %s sent a request line over %d bytes; closed",
                 conn_pid(conn), SHMB_MAX_LINE);
        return CONN_STEP_CLOSE;
    }
    /* Everything the client sent has run (a last line without its '\n' is
     * not a request). */
    if (step == CONN_STEP_NEXT && conn->eof)
        return conn->reset ? CONN_STEP_DROP : CONN_STEP_CLOSE;
    return step;
}

static void conn_on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *conn = req->handle->data;

    (void)status;
    shmb_free(req);
    conn_close(conn);
}

/* Flush what this batch produced, then close gracefully: the last reply
 * (an EMSGSIZE, say) reaches the client before the socket closes. */
void conn_finish(struct conn *conn)
{
    uv_shutdown_t *req;

    if (conn_ended(conn))
        return;
    /* Nothing more runs: not a turn left over, not a held hello. */
    conn_set_state(conn, CONN_FINISHING);
    uv_read_stop((uv_stream_t *)&conn->pipe);
    if (conn_flush(conn) == 0 && (req = shmb_malloc(sizeof(*req))) != NULL) {
        if (uv_shutdown(req, (uv_stream_t *)&conn->pipe, conn_on_shutdown) == 0)
            return;
        shmb_free(req);
    }
    conn_close(conn);
}

/* The client sent its last byte (eof) or is gone (reset): what it sent
 * before still runs, in turns, in order, so its noreply commits count.
 * After a half-close the replies are sent and the connection closes
 * gracefully; after a reset nobody reads them, so they are dropped. A
 * waiting alloc or a held hello reply closes at once, as it always did:
 * what was queued behind it is not run. */
static void conn_input_end(struct conn *conn, bool reset)
{
    uv_read_stop((uv_stream_t *)&conn->pipe);
    conn->paused = false;
    conn->eof = true;
    if (reset)
        conn_lose_peer(conn);
    /* A queue's pages take a moment, not an alloc's wait: what the client
     * sent after the request still runs once it is answered
     * (conn_on_work_done), its replies dropped after a reset. */
    if (conn->state == CONN_WORKING)
        return;
    if (conn->state == CONN_WAITING && conn->wait_soft) {
        /* A wait it did not ask for: answered now (conn_wait_done), and
         * what it sent after still runs. */
        waitq_expire(&conn->set->waitq, &conn->wait);
        return;
    }
    if (conn->state == CONN_HELLO_HELD && conn->pass_fd >= 0) {
        /* A queue_open reply held behind earlier replies, or for room in
         * the socket: after a half-close it still goes once they have
         * (conn_resume), then what came after it runs; after a reset
         * nobody reads it, and what came after it runs now. */
        if (!reset)
            return;
        shmb_free(conn->hello.buf);
        memset(&conn->hello, 0, sizeof(conn->hello));
        close(conn->pass_fd);
        conn->pass_fd = -1;
        conn_watch_free(conn);
        conn_set_state(conn, CONN_READING);
        conn_after(conn, conn_process(conn));
        return;
    }
    if (conn->state == CONN_WAITING || conn->state == CONN_HELLO_HELD) {
        conn_close(conn);
        return;
    }
    if (conn->state == CONN_READING)
        conn_after(conn, conn_process(conn));
}

/* After a batch of requests: write the replies, and read on unless the
 * connection waits or closes. */
static void conn_after(struct conn *conn, enum conn_step step)
{
    int rc;

    if (step == CONN_STEP_CLOSE) {
        conn_finish(conn);
        return;
    }
    if (step == CONN_STEP_DROP) {
        conn_close(conn);
        return;
    }
    if (conn_ended(conn))
        return;
    if ((rc = conn_flush(conn)) < 0 && conn_peer_gone(rc)) {
        conn_lose_peer(conn);
        rc = 0;
    }
    if (rc < 0) {
        if (rc != UV_ENOBUFS)
            log_debug("client %s: write failed: %s", conn_pid(conn),
                      uv_strerror(rc));
        conn_close(conn);
        return;
    }
    /* A waiting connection keeps reading, so that its disconnect is seen at
     * once, but only buffers what comes (conn_process runs nothing while it
     * waits); reading pauses when the buffer is full (conn_on_read). */
    if (step == CONN_STEP_NEXT && conn->paused && !conn->eof) {
        conn->paused = false;
        conn_watch_free(conn);
        uv_read_start((uv_stream_t *)&conn->pipe, conn_on_alloc, conn_on_read);
    }
}

/* Reading is paused (conn->paused): behind an alloc that waits for room,
 * watch for the client's going, which reading would have shown. Not behind
 * a wait the request did not ask for (commits on their way, a moment) nor
 * behind a queue's pages: what the client sent after them runs, gone or
 * not, once they are answered and reading goes on. */
static void conn_watch_gone(struct conn *conn)
{
    int rc;

    if (conn->paused && conn->state == CONN_WAITING && !conn->wait_soft &&
        (rc = conn_watch(conn, UV_DISCONNECT, conn_on_gone)) < 0)
        log_debug("client %s: cannot watch its socket while it waits: %s",
                  conn_pid(conn), uv_strerror(rc));
}

/* The client went (closed, half-closed or reset) while reading was paused
 * behind its waiting alloc: as when reading sees the end during a wait, the
 * connection closes at once, what it queued behind the wait does not run
 * (PROTOCOL.md, "End of input"), and what it held goes now, not when the
 * wait ends. */
static void conn_on_gone(uv_poll_t *poll, int status, int events)
{
    struct conn_watch *w = poll->data;
    struct conn *conn = w->conn;

    (void)status;
    (void)events;
    uv_poll_stop(poll);
    if (conn == NULL || !conn->paused || conn->state != CONN_WAITING || conn->wait_soft)
        return;
    log_info("client %s (%s) disconnected", conn_pid(conn), conn_name(conn));
    conn_close(conn);
}

void conn_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *conn = (struct conn *)stream;

    (void)buf;
    if (nread == 0 || conn->state == CONN_CLOSED)
        return;
    if (nread == UV_ENOBUFS && conn->in_len == conn->in_cap &&
        conn->state != CONN_READING) {
        /* A waiting connection filled its input buffer with requests queued
         * behind the wait: stop reading until the wait is over, watching
         * for the client's going where that ends the wait. */
        uv_read_stop(stream);
        conn->paused = true;
        conn_watch_gone(conn);
        return;
    }
    if (nread < 0) {
        if (nread != UV_EOF)
            log_debug("client %s: read failed: %s", conn_pid(conn),
                      uv_strerror((int)nread));
        log_info("client %s (%s) disconnected", conn_pid(conn),
                 conn_name(conn));
        if (nread == UV_ENOBUFS) {
            conn_close(conn); /* out of memory for its input */
            return;
        }
        conn_input_end(conn, nread != UV_EOF);
        return;
    }
    conn->in_len += (size_t)nread;
    conn_after(conn, conn_process(conn));
}

/* The write queue drained under a held hello reply: send it with the
 * descriptor now, then go on with the requests behind it. */
static void conn_resume(struct conn *conn)
{
    enum conn_step step = CONN_STEP_NEXT;
    int rc;

    if (conn->state != CONN_HELLO_HELD)
        return;
    shmb_free(conn->out.buf);
    conn->out = conn->hello;
    memset(&conn->hello, 0, sizeof(conn->hello));
    conn_set_state(conn, CONN_READING);
    rc = conn_pass_fd(conn);
    if (rc != 0)
        step = rc > 0 ? CONN_STEP_WAIT : CONN_STEP_DROP;
    if (step == CONN_STEP_NEXT)
        step = conn_process(conn);
    conn_after(conn, step);
}

/* Run the requests left over from conn's last turn (conn_defer). */
static void conn_continue(struct conn *conn)
{
    if (conn->state != CONN_DEFERRED)
        return;
    conn_set_state(conn, CONN_READING);
    conn_after(conn, conn_process(conn));
}

/* The waiting alloc got its answer (res has no COMMAND_WAIT; the queue has
 * let it go): deliver it and go on with the requests that queued up behind
 * it. */
void conn_wait_done(struct waitq_entry *entry, struct command_result *res)
{
    struct conn *conn = (struct conn *)((char *)entry - offsetof(struct conn, wait));
    enum conn_step step;

    conn->state = CONN_READING; /* the queue has let it go already */
    step = conn_deliver(conn, res);
    if (step == CONN_STEP_NEXT)
        step = conn_process(conn);
    conn_after(conn, step);
}

/* The reply to a queue request that waited for its pages (COMMAND_WORK):
 * queue it, and run the requests behind it on the next loop iteration, not
 * from inside the queues' update that answered it. */
void conn_on_work_done(struct command_env *env, struct command_client *client,
                       struct command_result *res)
{
    struct conn *conn = (struct conn *)((char *)client - offsetof(struct conn, client));
    enum conn_step step;

    (void)env;
    if (conn->state != CONN_WORKING) {
        shmb_free(res->text.buf); /* cannot be: a closed one is not answered */
        return;
    }
    conn->state = CONN_READING;
    step = conn_deliver(conn, res);
    if (step == CONN_STEP_NEXT) {
        conn_defer(conn);
        step = CONN_STEP_WAIT;
    }
    conn_after(conn, step);
}

/* Continue the connections whose turn ended with requests left, each once;
 * an idle handle runs once per loop iteration, after the other events. */
static void conn_set_on_resume(uv_idle_t *idle)
{
    struct conn_set *set = idle->data;
    struct conn *c;
    size_t n = 0;

    /* Each of those deferred now runs once; one that defers again goes to
     * the back, for the next iteration. */
    TAILQ_FOREACH(c, &set->deferred, deferred_link)
        n++;
    while (n-- > 0 && (c = TAILQ_FIRST(&set->deferred)) != NULL)
        conn_continue(c);
    if (TAILQ_EMPTY(&set->deferred))
        uv_idle_stop(idle);
}

/* conn used its turn with complete requests left: continue it on the next
 * loop iteration, after the other clients' events. */
static void conn_defer(struct conn *conn)
{
    struct conn_set *set = conn->set;

    conn_set_state(conn, CONN_DEFERRED);
    TAILQ_INSERT_TAIL(&set->deferred, conn, deferred_link);
    if (set->started)
        uv_idle_start(&set->resume_idle, conn_set_on_resume);
}
