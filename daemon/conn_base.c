// SPDX-License-Identifier: Apache-2.0
/*
 * What every part of a connection stands on: its state, its names in the
 * log, the watch of its socket, the bound on output left unread and its
 * timer, the input buffer, the close. Calls nothing of the turns or the set.
 */
#include "conn_base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "clock.h"
#include "log.h"

/* The input buffer starts small and grows to one maximal line and its '\n'. */
#define CONN_IN_START 4096
#define CONN_IN_MAX (SHMB_MAX_LINE + 1)

/* How the log names a connection's process: "pid 1234", or for a client in
 * a pid namespace the daemon cannot see into (the kernel's pid is 0), "in
 * another pid namespace (pid 7 there)" with what its hello said. The
 * string is static: one per log line. */
const char *conn_pid(const struct conn *conn)
{
    static char buf[80];

    if (conn->client.pid > 0)
        snprintf(buf, sizeof(buf), "pid %d", (int)conn->client.pid);
    else if (conn->client.own_pid > 0)
        snprintf(buf, sizeof(buf), "in another pid namespace (pid %d there)",
                 (int)conn->client.own_pid);
    else
        snprintf(buf, sizeof(buf), "in another pid namespace");
    return buf;
}

/* The client's hello name, for log lines. */
const char *conn_name(const struct conn *conn)
{
    return conn->client.name[0] ? conn->client.name : "unnamed";
}

static void conn_on_close(uv_handle_t *handle)
{
    struct conn *conn = (struct conn *)handle;
    struct conn_set *set = conn->set;

    set->count--;
    if (conn->pass_fd >= 0)
        close(conn->pass_fd);
    shmb_free(conn->client.groups);
    shmb_free(conn->in);
    shmb_free(conn->out.buf);
    shmb_free(conn->hello.buf);
    shmb_free(conn);
    if (set->on_freed != NULL)
        set->on_freed(set->on_freed_arg);
}

static void conn_on_watch_close(uv_handle_t *handle)
{
    struct conn_watch *w = handle->data;

    close(w->fd);
    shmb_free(w);
}

/* Stop waiting for room in the socket and free the poll. */
void conn_watch_free(struct conn *conn)
{
    struct conn_watch *w = conn->watch;

    if (w == NULL)
        return;
    conn->watch = NULL;
    w->conn = NULL;
    uv_close((uv_handle_t *)&w->poll, conn_on_watch_close);
}

/* Move conn to state, leaving the queue its old state had it in (a
 * deferred turn, a waiting alloc, whose request is dropped). */
void conn_set_state(struct conn *conn, enum conn_state state)
{
    if (conn->state == CONN_DEFERRED)
        TAILQ_REMOVE(&conn->set->deferred, conn, deferred_link);
    else if (conn->state == CONN_WAITING)
        waitq_remove(&conn->set->waitq, &conn->wait);
    conn->state = state;
}

/* Until it finishes or closes, a connection runs requests only while
 * reading; in the other states what comes is buffered. */
bool conn_ended(const struct conn *conn)
{
    return conn->state == CONN_FINISHING || conn->state == CONN_CLOSED;
}

void conn_close(struct conn *conn)
{
    if (conn->state == CONN_CLOSED)
        return;
    conn_set_state(conn, CONN_CLOSED);
    conn_watch_free(conn);
    uv_read_stop((uv_stream_t *)&conn->pipe);
    /* Pins and pending allocations go now, not when libuv gets round to the
     * close callback: a waiting writer may need those bytes. */
    command_client_close(conn->set->env, &conn->client);
    uv_close((uv_handle_t *)&conn->pipe, conn_on_close);
}

/* Bytes of replies the client has not read yet: queued in libuv, and built
 * in this batch. */
size_t conn_unread(const struct conn *conn)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)&conn->pipe) + conn->out.len;
}

void conn_log_unread(const struct conn *conn)
{
    log_warn("client %s (%s) does not read its replies (%zu bytes unread, limit %zu, "
             "--max-queued-output); disconnecting it",
             conn_pid(conn), conn_name(conn),
             conn_unread(conn), conn->set->policy->max_queued_output);
}

/* Called while conn may have too much output unread (conn_set_unread_watch):
 * disconnect it when it has not read any of it for CONN_UNREAD_GRACE_MS.
 * True when it is still over the limit and needs looking at again. */
static bool conn_unread_check(struct conn *conn, uint64_t now_ms)
{
    size_t queued = uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe);

    if (conn->state == CONN_CLOSED || queued <= conn->set->policy->max_queued_output) {
        conn->unread_mark_ms = 0;
        return false;
    }
    if (conn->unread_mark_ms == 0 || queued < conn->unread_mark) {
        /* First seen over the limit, or the client read some: its grace
         * starts again. */
        conn->unread_mark = queued;
        conn->unread_mark_ms = now_ms;
        return true;
    }
    if (now_ms - conn->unread_mark_ms < CONN_UNREAD_GRACE_MS)
        return true;
    log_warn("client %s (%s) has not read its replies for %d ms (%zu bytes unread, "
             "limit %zu, --max-queued-output); disconnecting it",
             conn_pid(conn), conn_name(conn),
             CONN_UNREAD_GRACE_MS, queued, conn->set->policy->max_queued_output);
    conn_close(conn);
    return false;
}

/* Start (or switch) conn's watch of its socket for events. 0 or a libuv
 * error. */
int conn_watch(struct conn *conn, int events, uv_poll_cb cb)
{
    struct conn_watch *w = conn->watch;
    uv_os_fd_t sock;
    int rc;

    if (w == NULL) {
        if ((rc = uv_fileno((uv_handle_t *)&conn->pipe, &sock)) < 0)
            return rc;
        w = shmb_calloc(1, sizeof(*w));
        if (w == NULL)
            return UV_ENOMEM;
        w->fd = fcntl(sock, F_DUPFD_CLOEXEC, 0);
        if (w->fd < 0) {
            rc = uv_translate_sys_error(errno);
            shmb_free(w);
            return rc;
        }
        if ((rc = uv_poll_init(conn->set->loop, &w->poll, w->fd)) < 0) {
            close(w->fd);
            shmb_free(w);
            return rc;
        }
        w->poll.data = w;
        w->conn = conn;
        conn->watch = w;
    }
    return uv_poll_start(&w->poll, events, cb);
}

/* Append one reply to this batch's output, with its newline. -ENOMEM. */
int conn_queue(struct conn *conn, struct command_result *res)
{
    if (res->text.len == 0 || line_raw(&conn->out, res->text.buf, res->text.len) < 0 ||
        line_lit(&conn->out, "\n") < 0)
        return -ENOMEM;
    return 0;
}

/* Give libuv room at the end of the input buffer, growing it up to one line. */
void conn_on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct conn *conn = (struct conn *)handle;

    (void)suggested;
    if (conn->in_len == conn->in_cap && conn->in_cap < CONN_IN_MAX) {
        size_t cap = conn->in_cap ? conn->in_cap * 2 : CONN_IN_START;
        char *grown;

        if (cap > CONN_IN_MAX)
            cap = CONN_IN_MAX;
        grown = shmb_realloc(conn->in, cap);
        if (grown != NULL) {
            conn->in = grown;
            conn->in_cap = cap;
        }
    }
    *buf = uv_buf_init(conn->in ? conn->in + conn->in_len : NULL,
                       (unsigned)(conn->in_cap - conn->in_len));
}

/* A write or send failure that means the peer is gone. */
bool conn_peer_gone(int rc)
{
    return rc == UV_EPIPE || rc == UV_ECONNRESET;
}

/* Writing failed because the client is gone: its replies are dropped from
 * now on, but what it sent before it went is still read and run. */
void conn_lose_peer(struct conn *conn)
{
    conn->reset = true;
    conn->out.len = 0;
}

/* The connection a client belongs to: every client in env->client_list is a
 * connection's. */
struct conn *conn_of(struct command_client *client)
{
    return (struct conn *)((char *)client - offsetof(struct conn, client));
}

/* Look at every connection with too much output unread; wake again while
 * any is left. */
static void conn_set_on_unread_timer(uv_timer_t *timer)
{
    struct conn_set *set = timer->data;
    uint64_t now = clock_now_ms();
    bool again = false;
    struct command_client *cl, *next;

    for (cl = TAILQ_FIRST(&set->env->client_list); cl != NULL; cl = next) {
        next = TAILQ_NEXT(cl, link);
        if (conn_unread_check(conn_of(cl), now))
            again = true;
    }
    if (again)
        uv_timer_start(&set->unread_timer, conn_set_on_unread_timer, CONN_UNREAD_TICK_MS, 0);
}

/* A connection has more output unread than --max-queued-output: look at it
 * again until it reads (conn_unread_check). */
void conn_set_unread_watch(struct conn_set *set)
{
    if (set->started && !uv_is_active((uv_handle_t *)&set->unread_timer))
        uv_timer_start(&set->unread_timer, conn_set_on_unread_timer, CONN_UNREAD_TICK_MS, 0);
}
