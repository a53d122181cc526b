// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's Unix socket, next to the daemon's (DAEMON_SOCKET.relay): local
 * clients and the ctl ask for fetches and status there, one JSON line each
 * way. The socket gets the daemon socket's mode and group: whoever may use
 * the daemon may fetch into it. Answers status itself and hands every other
 * op up through relay.hooks.local_request; knows no UCX.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "../proto/protocol.h"
#include "../proto/text.h"
#include "relay.h"

#define LOCAL_QUEUED_MAX (1024 * 1024) /* replies a client leaves unread: then it goes */

struct write_req {
    uv_write_t req;
    char *data;
};

static void on_written(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    (void)status;
    free(w->data);
    free(w);
}

static void on_client_closed(uv_handle_t *h)
{
    struct local_client *lc = h->data;
    free(lc);
}

static void local_client_close(struct local_client *lc)
{
    struct relay *r = lc->relay;
    if (lc->closing)
        return;
    lc->closing = true;
    r->hooks.local_gone(lc);
    LIST_REMOVE(lc, link);
    r->nclients--;
    uv_close((uv_handle_t *)&lc->pipe, on_client_closed);
}

void local_reply(struct local_client *lc, const char *line)
{
    size_t n = strlen(line);
    struct write_req *w;
    uv_buf_t buf;
    if (lc->closing)
        return;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&lc->pipe) > LOCAL_QUEUED_MAX) {
        relay_log("a local client left %zu bytes of replies unread; closing it",
                  uv_stream_get_write_queue_size((uv_stream_t *)&lc->pipe));
        local_client_close(lc);
        return;
    }
    w = calloc(1, sizeof(*w));
    if (!w || !(w->data = malloc(n + 1))) {
        free(w);
        local_client_close(lc);
        return;
    }
    memcpy(w->data, line, n);
    w->data[n] = '\n';
    buf = uv_buf_init(w->data, (unsigned)(n + 1));
    if (uv_write(&w->req, (uv_stream_t *)&lc->pipe, &buf, 1, on_written) < 0) {
        free(w->data);
        free(w);
        local_client_close(lc);
    }
}

void local_reply_json(struct local_client *lc, json_t *reply)
{
    char *line = reply ? json_dumps(reply, JSON_COMPACT) : NULL;

    if (line)
        local_reply(lc, line);
    else
        local_reply_error(lc, -ENOMEM, "The relay is out of memory.");
    free(line);
    json_decref(reply);
}

void local_reply_error(struct local_client *lc, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    json_t *reply;
    char *line;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    reply = shmb_error_reply(NULL, code, msg);
    line = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    if (line)
        local_reply(lc, line);
    else
        local_client_close(lc);
    free(line);
    json_decref(reply);
}

static const char *state_name(enum peer_state s)
{
    switch (s) {
    case PEER_IDLE:
        return "disconnected";
    case PEER_CONNECTING:
        return "connecting";
    case PEER_READY:
        return "connected";
    case PEER_CLOSING:
        return "closing";
    }
    return "?";
}

static void local_status(struct local_client *lc)
{
    struct relay *r = lc->relay;
    json_t *peers = json_array(), *reply;
    const char *tls = getenv("UCX_TLS");
    struct peer *p;

    LIST_FOREACH(p, &r->peers, link) {
        json_array_append_new(
            peers, json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                             "s:s}",
                             "name", p->name, "address", p->address, "direction",
                             p->configured ? "out" : "in", "state", state_name(p->state),
                             "transport", tls && *tls ? tls : "auto", "bytes_in",
                             (json_int_t)p->bytes_in, "bytes_out", (json_int_t)p->bytes_out,
                             "messages_in", (json_int_t)p->msgs_in, "messages_out",
                             (json_int_t)p->msgs_out, "fetches_served",
                             (json_int_t)p->fetches_served, "transfers",
                             (json_int_t)p->transfers, "pinned", (json_int_t)p->nserved,
                             "last_error", p->last_error));
    }
    reply = json_pack("{s:b, s:s, s:s, s:I, s:o}", "ok", 1, "name", r->name, "listen",
                      r->listen_addr ? r->listen_addr : "", "refused", (json_int_t)r->refused,
                      "peers", peers);
    if (reply)
        r->hooks.status(r, reply);
    local_reply_json(lc, reply);
}

/* One request line: {"op":"status"} here, any other op up to the hooks
 * ({"op":"fetch","peer":P,"key":K}, the queues' ops). */
static void local_request(struct local_client *lc, const char *line, size_t len)
{
    json_error_t jerr;
    json_t *req = NULL;
    const char *op = NULL;

    /* Asked at the first request, not at accept: a client connects to the
     * daemon first, and the daemon's list of clients is what says that it
     * may. */
    if (!lc->admitted) {
        struct shmb_error err = {0};
        if (lc->relay->hooks.local_admit(lc->relay, lc->uid, &err) < 0) {
            relay_log("refused a local client of uid %u: %s", (unsigned)lc->uid,
                      err.message);
            local_reply_error(lc, err.code, "%s", err.message);
            local_client_close(lc);
            return;
        }
        lc->admitted = true;
    }
    req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!req || json_unpack_ex(req, &jerr, 0, "{s:s}", "op", &op) < 0)
        local_reply_error(lc, -EINVAL, "A request is one JSON object with an \"op\": %s.",
                          jerr.text);
    else if (strcmp(op, "status") == 0)
        local_status(lc);
    else
        lc->relay->hooks.local_request(lc, op, req);
    json_decref(req);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct local_client *lc = h->data;
    (void)suggested;
    *buf = uv_buf_init(lc->buf + lc->len, (unsigned)(sizeof(lc->buf) - lc->len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct local_client *lc = s->data;
    char *nl;
    (void)buf;
    if (nread < 0) {
        local_client_close(lc);
        return;
    }
    lc->len += (size_t)nread;
    while (!lc->closing && (nl = memchr(lc->buf, '\n', lc->len))) {
        size_t n = (size_t)(nl - lc->buf);
        local_request(lc, lc->buf, n);
        memmove(lc->buf, nl + 1, lc->len - n - 1);
        lc->len -= n + 1;
    }
    if (!lc->closing && lc->len == sizeof(lc->buf)) {
        local_reply_error(lc, -EINVAL, "A request longer than %d bytes.", RELAY_LOCAL_LINE);
        local_client_close(lc);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    struct relay *r = server->data;
    struct local_client *lc;
    if (status < 0)
        return;
    lc = calloc(1, sizeof(*lc));
    if (!lc)
        return;
    lc->relay = r;
    uv_pipe_init(r->loop, &lc->pipe, 0);
    lc->pipe.data = lc;
    if (uv_accept(server, (uv_stream_t *)&lc->pipe) < 0) {
        uv_close((uv_handle_t *)&lc->pipe, on_client_closed);
        return;
    }
    LIST_INSERT_HEAD(&r->clients, lc, link);
    r->nclients++;
    {
        struct ucred cred;
        socklen_t clen = sizeof(cred);
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&lc->pipe, &fd) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
            relay_log("cannot read a local client's credentials; closing it");
            local_client_close(lc);
            return;
        }
        lc->uid = cred.uid;
    }
    if (r->nclients > RELAY_LOCAL_MAX) {
        local_reply_error(lc, -EMFILE, "The relay serves %d local clients at most.",
                          RELAY_LOCAL_MAX);
        local_client_close(lc);
        return;
    }
    uv_read_start((uv_stream_t *)&lc->pipe, on_alloc, on_read);
}

int local_listen(struct relay *r, struct shmb_error *err)
{
    struct sockaddr_un sun;
    struct stat st;
    int fd, rc;
    mode_t mode = 0660;

    if (strlen(r->local_path) >= sizeof(sun.sun_path))
        return shmb_error_set(err, -ENAMETOOLONG, "The relay's socket path %s is too long.",
                              r->local_path);
    /* A live relay is never displaced: probe before unlinking. */
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    strcpy(sun.sun_path, r->local_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        rc = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
        close(fd);
        if (rc == 0)
            return shmb_error_set(err, -EADDRINUSE,
                                  "Another relay serves %s already; stop it first.",
                                  r->local_path);
    }
    unlink(r->local_path);
    if (stat(r->daemon_socket, &st) == 0)
        mode = st.st_mode & 0777;
    uv_pipe_init(r->loop, &r->local, 0);
    r->local.data = r;
    r->local_open = true;
    mode_t old = umask((mode_t)(~mode & 0777));
    rc = uv_pipe_bind(&r->local, r->local_path);
    umask(old);
    if (rc < 0)
        return shmb_error_set(err, -EADDRINUSE, "Cannot bind %s: %s.", r->local_path,
                              uv_strerror(rc));
    if (stat(r->daemon_socket, &st) == 0 && chown(r->local_path, (uid_t)-1, st.st_gid) != 0)
        relay_log("cannot give %s the daemon socket's group %u", r->local_path,
                  (unsigned)st.st_gid);
    rc = uv_listen((uv_stream_t *)&r->local, 64, on_connection);
    if (rc < 0)
        return shmb_error_set(err, -EIO, "Cannot listen on %s: %s.", r->local_path,
                              uv_strerror(rc));
    return 0;
}

void local_close_all(struct relay *r)
{
    while (!LIST_EMPTY(&r->clients))
        local_client_close(LIST_FIRST(&r->clients));
    if (r->local_open) {
        uv_close((uv_handle_t *)&r->local, NULL);
        unlink(r->local_path);
        r->local_open = false;
    }
}
