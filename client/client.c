/*
 * The client library: a blocking connection to shmbrokerd, the mapping of its
 * segment, and one function per protocol op. Protocol details come from
 * proto/, so nothing about the wire is written twice.
 */
#include "shmbroker.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/layout.h"
#include "../proto/line.h"
#include "../proto/protocol.h"

struct shmb {
    int sock;           /* -1 when not connected */
    int seg_fd;         /* the descriptor hello passed, until it is mapped */
    unsigned char *map; /* the segment mapping, NULL before */
    size_t map_size;
    dev_t map_dev; /* the mapped file, to recognise it after a restart */
    ino_t map_ino;
    int populate;
    int read_only;
    unsigned alloc_wait_ms;
    char path[108]; /* where shmb_connect found the daemon */
    char name[SHMB_NAME_MAX + 1];
    shmb_info_t info;
    struct shmb_error err;
    char *rbuf; /* bytes received, not yet a whole reply */
    size_t rlen, rcap;
    struct line w; /* the request lines being sent, reused */
};

shmb_t *shmb_new(void)
{
    shmb_t *c = shmb_calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->sock = -1;
    c->seg_fd = -1;
    c->populate = 1;
    return c;
}

void shmb_set_populate(shmb_t *c, int populate)
{
    c->populate = populate;
}

void shmb_set_read_only(shmb_t *c, int read_only)
{
    c->read_only = read_only;
}

void shmb_set_alloc_wait(shmb_t *c, unsigned wait_ms)
{
    c->alloc_wait_ms = wait_ms;
}

int shmb_errcode(const shmb_t *c)
{
    return c->err.code;
}

const char *shmb_errname(const shmb_t *c)
{
    return c->err.code ? shmb_error_name(c->err.code) : "OK";
}

const char *shmb_errmsg(const shmb_t *c)
{
    return c->err.message;
}

const char *shmb_strerror(int code)
{
    return shmb_error_name(code);
}

const shmb_info_t *shmb_info(const shmb_t *c)
{
    return c->map != NULL ? &c->info : NULL;
}

/* Forget the connection (and the mapping too, unless keep_map). */
static void client_disconnect(shmb_t *c, bool keep_map)
{
    if (c->sock >= 0)
        close(c->sock);
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    c->sock = c->seg_fd = -1;
    c->rlen = 0;
    if (keep_map)
        return;
    if (c->map != NULL)
        munmap(c->map, c->map_size);
    c->map = NULL;
    c->map_size = 0;
}

void shmb_close(shmb_t *c)
{
    if (c == NULL)
        return;
    client_disconnect(c, false);
    shmb_free(c->rbuf);
    shmb_free(c->w.buf);
    shmb_free(c);
}

/* The connection broke: say so, and close the socket (the mapping stays
 * until shmb_close, so pointers already handed out remain readable). */
static int client_lost(shmb_t *c, const char *what, int saved)
{
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
    return shmb_error_set(&c->err, -ECONNRESET,
                          "Connection to shmbrokerd lost (%s: %s); every pin and pending "
                          "allocation of this handle was released. Call shmb_reconnect to "
                          "go on: committed objects and the mapping stay.",
                          what, saved ? strerror(saved) : "closed by the daemon");
}

/* Keep a descriptor that arrived as SCM_RIGHTS; close any extra. */
static void client_take_fds(shmb_t *c, struct msghdr *msg)
{
    struct cmsghdr *cmsg;

    for (cmsg = CMSG_FIRSTHDR(msg); cmsg != NULL; cmsg = CMSG_NXTHDR(msg, cmsg)) {
        size_t i, n;

        if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
            continue;
        n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < n; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
            if (c->seg_fd < 0)
                c->seg_fd = fd;
            else
                close(fd);
        }
    }
}

/* Receive until the buffer holds one whole line; returns its length (without
 * the '\n'), which the caller consumes with client_consume. */
static int client_read_line(shmb_t *c, size_t *line_len)
{
    for (;;) {
        union {
            struct cmsghdr hdr;
            char buf[CMSG_SPACE(4 * sizeof(int))];
        } control;
        struct msghdr msg;
        struct iovec iov;
        char *nl = c->rlen ? memchr(c->rbuf, '\n', c->rlen) : NULL;
        ssize_t n;

        if (nl != NULL) {
            *line_len = (size_t)(nl - c->rbuf);
            return 0;
        }
        if (c->rlen >= SHMB_MAX_REPLY)
            return shmb_error_set(&c->err, -EMSGSIZE,
                                  "Reply from shmbrokerd longer than %d bytes.",
                                  SHMB_MAX_REPLY);
        if (c->rcap - c->rlen < 4096) {
            size_t cap = c->rcap ? c->rcap * 2 : 16384;
            char *grown = shmb_realloc(c->rbuf, cap);

            if (grown == NULL)
                return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a reply.");
            c->rbuf = grown;
            c->rcap = cap;
        }
        memset(&msg, 0, sizeof(msg));
        iov.iov_base = c->rbuf + c->rlen;
        iov.iov_len = c->rcap - c->rlen;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return client_lost(c, "receive", n < 0 ? errno : 0);
        client_take_fds(c, &msg);
        c->rlen += (size_t)n;
    }
}

/* Drop the first line (and its '\n') from the receive buffer. */
static void client_consume(shmb_t *c, size_t line_len)
{
    memmove(c->rbuf, c->rbuf + line_len + 1, c->rlen - line_len - 1);
    c->rlen -= line_len + 1;
}

/* Send the bytes of c->w. */
static int client_send(shmb_t *c)
{
    size_t off = 0;

    while (off < c->w.len) {
        ssize_t n = send(c->sock, c->w.buf + off, c->w.len - off, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return client_lost(c, "send", errno);
        off += (size_t)n;
    }
    return 0;
}

/* Queue request (the library keeps no reference) as a line in c->w. */
static int client_queue(shmb_t *c, json_t *request)
{
    int rc;

    if (request == NULL)
        return shmb_error_set(&c->err, -EINVAL,
                              "Cannot build the request: a key must be valid UTF-8, 1 to "
                              "%d bytes.",
                              SHMB_KEY_MAX_LEN);
    if (c->sock < 0) {
        json_decref(request);
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    }
    rc = shmb_json_append_line(&c->w, request);
    json_decref(request);
    if (rc < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

/* Send request (the library keeps no reference) and wait for its reply:
 * 0 with *reply owned by the caller (when reply is not NULL), or the error. */
static int client_call(shmb_t *c, json_t *request, json_t **reply)
{
    json_t *value = NULL;
    size_t len = 0;
    int rc;

    shmb_error_clear(&c->err);
    if (reply != NULL)
        *reply = NULL;
    c->w.len = 0;
    if ((rc = client_queue(c, request)) < 0)
        return rc;
    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    rc = shmb_parse_reply(c->rbuf, len, &value, &c->err);
    client_consume(c, len);
    if (rc < 0)
        return rc;
    if (reply != NULL)
        *reply = value;
    else
        json_decref(value);
    return 0;
}

/* Check a key before it goes on the wire. */
static int client_check_key(shmb_t *c, const char *key)
{
    size_t len = key != NULL ? strlen(key) : 0;

    if (len == 0 || len > SHMB_KEY_MAX_LEN)
        return shmb_error_set(&c->err, -EINVAL,
                              "Key of %zu bytes: keys are 1 to %d bytes.", len,
                              SHMB_KEY_MAX_LEN);
    return 0;
}

/* Read an unsigned integer field of a reply. */
static int client_u64(shmb_t *c, const json_t *obj, const char *field, uint64_t *out)
{
    json_t *v = json_object_get(obj, field);

    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks a non-negative integer \"%s\".",
                              field);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Map the descriptor hello passed and check it against what hello said. */
static int client_map(shmb_t *c)
{
    const struct shmb_segment_header *hdr;
    struct stat st;
    int flags = MAP_SHARED;

    if (c->seg_fd < 0)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's hello reply carried no segment descriptor.");
    if (fstat(c->seg_fd, &st) != 0 || (uint64_t)st.st_size < c->info.size ||
        c->info.size < SHMB_HEADER_PAGE || c->info.data_offset < SHMB_HEADER_PAGE ||
        c->info.data_offset > c->info.size ||
        c->info.data_size > c->info.size - c->info.data_offset)
        return shmb_error_set(&c->err, -EPROTO,
                              "The segment descriptor (%lld bytes) does not match hello "
                              "(size %llu, data at %llu, %llu bytes).",
                              (long long)st.st_size, (unsigned long long)c->info.size,
                              (unsigned long long)c->info.data_offset,
                              (unsigned long long)c->info.data_size);
    if (c->map != NULL) {
        /* A reconnect: the same file keeps its mapping, and with it every
         * pointer the application holds. */
        if (st.st_dev == c->map_dev && st.st_ino == c->map_ino &&
            c->map_size == c->info.size)
            goto mapped;
        munmap(c->map, c->map_size);
        c->map = NULL;
    }
    if (c->populate)
        flags |= MAP_POPULATE;
    c->map = mmap(NULL, (size_t)c->info.size, PROT_READ | (c->read_only ? 0 : PROT_WRITE),
                  flags, c->seg_fd, 0);
    if (c->map == MAP_FAILED) {
        int saved = errno;

        c->map = NULL;
        return shmb_error_set(&c->err, -saved, "Cannot map the segment (%llu bytes): %s.",
                              (unsigned long long)c->info.size, strerror(saved));
    }
    c->map_size = (size_t)c->info.size;
    c->map_dev = st.st_dev;
    c->map_ino = st.st_ino;
mapped:
    /* The mapping keeps the file; the descriptor is not needed any more. */
    close(c->seg_fd);
    c->seg_fd = -1;
    hdr = (const struct shmb_segment_header *)c->map;
    if (hdr->magic != SHMB_SEGMENT_MAGIC || hdr->version != SHMB_LAYOUT_VERSION)
        return shmb_error_set(
            &c->err, -EPROTO,
            "The segment has magic 0x%llx version %u; this library reads "
            "version %d.",
            (unsigned long long)hdr->magic, hdr->version, SHMB_LAYOUT_VERSION);
    return 0;
}

/* Dial path, say hello, map the segment (keeping a mapping of the same file
 * when keep_map). */
static int client_dial(shmb_t *c, const char *path, const char *name, bool keep_map)
{
    struct sockaddr_un sun;
    json_t *reply = NULL;
    const char *segment = NULL;
    int rc;

    shmb_error_clear(&c->err);
    client_disconnect(c, keep_map);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path))
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
    memcpy(sun.sun_path, path, strlen(path) + 1);
    c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->sock < 0)
        return shmb_error_set(&c->err, -errno, "Cannot create a socket: %s.",
                              strerror(errno));
    if (connect(c->sock, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        int saved = errno;

        client_disconnect(c, keep_map);
        return shmb_error_set(
            &c->err, -saved,
            "Cannot connect to shmbrokerd at %s: %s. Is shmbrokerd running? "
            "(Set %s or pass the socket path.)",
            path, strerror(saved), SHMB_SOCKET_ENV);
    }
    rc = client_call(c,
                     json_pack("{s:s, s:i, s:s?, s:s}", "op", "hello", "version",
                               SHMB_PROTOCOL_VERSION, "name", name, "mode",
                               c->read_only ? "ro" : "rw"),
                     &reply);
    if (rc < 0)
        goto fail;
    if ((rc = client_u64(c, reply, "size", &c->info.size)) < 0 ||
        (rc = client_u64(c, reply, "data_offset", &c->info.data_offset)) < 0 ||
        (rc = client_u64(c, reply, "data_size", &c->info.data_size)) < 0 ||
        (rc = client_u64(c, reply, "max_object_size", &c->info.max_object_size)) < 0 ||
        (rc = client_u64(c, reply, "alignment", &c->info.alignment)) < 0)
        goto fail;
    if (json_unpack(reply, "{s:s}", "segment", &segment) == 0)
        snprintf(c->info.segment, sizeof(c->info.segment), "%s", segment);
    if ((rc = client_map(c)) < 0)
        goto fail;
    json_decref(reply);
    return 0;

fail:
    json_decref(reply);
    client_disconnect(c, keep_map);
    return rc;
}

int shmb_connect(shmb_t *c, const char *socket_path, const char *name)
{
    const char *path = shmb_socket_path(socket_path);

    if (strlen(path) >= sizeof(c->path))
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
    snprintf(c->path, sizeof(c->path), "%s", path);
    snprintf(c->name, sizeof(c->name), "%s", name != NULL ? name : "");
    return client_dial(c, c->path, name, false);
}

int shmb_reconnect(shmb_t *c)
{
    if (c->path[0] == '\0')
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Never connected; call shmb_connect first.");
    return client_dial(c, c->path, c->name[0] ? c->name : NULL, true);
}

/* The fields of a success reply decoded by jansson (the slow path). */
static void client_reply_fields(const json_t *reply, struct line_reply *r)
{
    json_t *v;

    memset(r, 0, sizeof(*r));
    if (json_is_integer(v = json_object_get(reply, "offset")) && json_integer_value(v) >= 0) {
        r->offset = (uint64_t)json_integer_value(v);
        r->has_offset = true;
    }
    if (json_is_integer(v = json_object_get(reply, "size")) && json_integer_value(v) >= 0) {
        r->size = (uint64_t)json_integer_value(v);
        r->has_size = true;
    }
    if (json_is_boolean(v = json_object_get(reply, "exists"))) {
        r->exists = json_is_true(v);
        r->has_exists = true;
    }
}

/* Send the lines in c->w and read one reply into r: the common success
 * shapes are recognised by hand, anything else (errors) goes through
 * jansson. 0 or the reply's error, its message in c->err. */
static int client_exchange(shmb_t *c, struct line_reply *r)
{
    json_t *reply = NULL;
    const char *p;
    size_t len = 0;
    int rc;

    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    p = c->rbuf;
    if (line_scan_reply(&p, c->rbuf + len, r) == 0 && p == c->rbuf + len) {
        client_consume(c, len);
        return 0;
    }
    rc = shmb_parse_reply(c->rbuf, len, &reply, &c->err);
    client_consume(c, len);
    if (rc == 0)
        client_reply_fields(reply, r);
    json_decref(reply);
    return rc;
}

/* Start a request line {"op":"OP","key":KEY in c->w (after a key check). */
static int client_begin_key(shmb_t *c, const char *op, const char *key)
{
    int rc;

    if ((rc = client_check_key(c, key)) < 0)
        return rc;
    if (c->sock < 0)
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    if (line_lit(&c->w, "{\"op\":\"") < 0 || line_lit(&c->w, op) < 0 ||
        line_lit(&c->w, "\",\"key\":") < 0 || line_str(&c->w, key, strlen(key)) < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

/* A pointer to [offset, offset + size) after checking it lies in the data
 * area of the mapping: a confused daemon must not make us scribble. */
static int client_extent(shmb_t *c, const struct line_reply *r, size_t want, void **ptr,
                         size_t *size)
{
    if (!r->has_offset || !r->has_size)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks \"offset\" or \"size\".");
    if (r->offset < c->info.data_offset || r->offset > c->map_size ||
        r->size > c->map_size - r->offset || (want != 0 && r->size != want))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd returned extent [%llu, +%llu) outside the data "
                              "area [%llu, %zu).",
                              (unsigned long long)r->offset, (unsigned long long)r->size,
                              (unsigned long long)c->info.data_offset, c->map_size);
    *ptr = c->map + r->offset;
    if (size != NULL)
        *size = (size_t)r->size;
    return 0;
}

/* A request whose only field is the key; its reply's fields in r (may be
 * NULL). */
static int client_key_op(shmb_t *c, const char *op, const char *key, struct line_reply *r)
{
    struct line_reply ignored;
    int rc;

    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_begin_key(c, op, key)) < 0)
        return rc;
    if (line_lit(&c->w, "}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return client_exchange(c, r != NULL ? r : &ignored);
}

/* The alloc request for key, appended to c->w (without a newline). */
static int client_alloc_op(shmb_t *c, const char *key, size_t size, unsigned readers,
                           unsigned wait_ms)
{
    int rc;

    if ((rc = client_begin_key(c, "alloc", key)) < 0)
        return rc;
    if (line_lit(&c->w, ",\"size\":") < 0 || line_u64(&c->w, size) < 0 ||
        line_lit(&c->w, ",\"readers\":") < 0 || line_u64(&c->w, readers) < 0 ||
        (wait_ms != 0 &&
         (line_lit(&c->w, ",\"wait_ms\":") < 0 || line_u64(&c->w, wait_ms) < 0)) ||
        line_lit(&c->w, "}") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

int shmb_alloc(shmb_t *c, const char *key, size_t size, unsigned readers, void **ptr)
{
    struct line_reply r;
    int rc;

    *ptr = NULL;
    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_alloc_op(c, key, size, readers, c->alloc_wait_ms)) < 0)
        return rc;
    if (line_lit(&c->w, "\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    if ((rc = client_exchange(c, &r)) < 0)
        return rc;
    return client_extent(c, &r, size, ptr, NULL);
}

int shmb_commit(shmb_t *c, const char *key)
{
    return client_key_op(c, "commit", key, NULL);
}

int shmb_abort(shmb_t *c, const char *key)
{
    return client_key_op(c, "abort", key, NULL);
}

int shmb_put(shmb_t *c, const char *key, const void *data, size_t size, unsigned readers)
{
    void *dst;
    int rc;

    if ((rc = shmb_alloc(c, key, size, readers, &dst)) < 0)
        return rc;
    memcpy(dst, data, size);
    return shmb_commit(c, key);
}

int shmb_get(shmb_t *c, const char *key, const void **ptr, size_t *size)
{
    struct line_reply r;
    void *p = NULL;
    int rc;

    *ptr = NULL;
    *size = 0;
    rc = client_key_op(c, "get", key, &r);
    if (rc == 0)
        rc = client_extent(c, &r, 0, &p, size);
    *ptr = p;
    return rc;
}

int shmb_release(shmb_t *c, const char *key)
{
    return client_key_op(c, "release", key, NULL);
}

int shmb_release_nowait(shmb_t *c, const char *key)
{
    return shmb_release_many(c, 1, &key);
}

int shmb_release_many(shmb_t *c, size_t n, const char *const *keys)
{
    size_t i;
    int rc;

    shmb_error_clear(&c->err);
    c->w.len = 0;
    for (i = 0; i < n; i++) {
        if ((rc = client_begin_key(c, "release", keys[i])) < 0)
            return rc;
        if (line_lit(&c->w, ",\"noreply\":true}\n") < 0)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    return client_send(c);
}

/* Open a batch request in c->w; ops are appended by the caller, separated
 * by client_batch_next, and closed by client_batch_exchange. */
static int client_batch_begin(shmb_t *c)
{
    c->w.len = 0;
    if (line_lit(&c->w, "{\"op\":\"batch\",\"ops\":[") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return 0;
}

static int client_batch_next(shmb_t *c, size_t i)
{
    return i > 0 && line_lit(&c->w, ",") < 0 ? -ENOMEM : 0;
}

/* Close the batch of n ops, send it, and decode its replies: res[i] gets
 * each op's reply fields, rc[i] its 0 or error; the first error's message
 * stays in c->err. Returns the exchange's own error, or 0. */
static int client_batch_exchange(shmb_t *c, size_t n, struct line_reply *res, int *rcs)
{
    json_t *reply = NULL, *replies;
    size_t len = 0, i;
    int rc, first = 0;

    if (line_lit(&c->w, "]}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    if (line_scan_batch(c->rbuf, c->rbuf + len, res, n) == 0) {
        client_consume(c, len);
        memset(rcs, 0, n * sizeof(*rcs));
        return 0;
    }
    /* Some op failed (or the reply has an unusual shape): jansson. */
    rc = shmb_parse_reply(c->rbuf, len, &reply, &c->err);
    client_consume(c, len);
    if (rc < 0)
        return rc;
    replies = json_object_get(reply, "replies");
    if (!json_is_array(replies) || json_array_size(replies) != n) {
        json_decref(reply);
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's batch reply does not have %zu replies.", n);
    }
    for (i = 0; i < n; i++) {
        json_t *r = json_array_get(replies, i);
        const char *code = NULL, *message = NULL;

        memset(&res[i], 0, sizeof(res[i]));
        if (json_is_true(json_object_get(r, "ok"))) {
            client_reply_fields(r, &res[i]);
            rcs[i] = 0;
            continue;
        }
        rcs[i] = json_unpack(r, "{s:s, s:s}", "error", &code, "message", &message) == 0
                     ? shmb_error_from_name(code)
                     : -EPROTO;
        if (first == 0) {
            first = rcs[i];
            shmb_error_set(&c->err, rcs[i], "%s",
                           message != NULL ? message : "malformed batch reply");
        }
    }
    json_decref(reply);
    return 0;
}

int shmb_put_many(shmb_t *c, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, unsigned readers, int *results)
{
    struct line_reply *res = NULL;
    struct shmb_error first_err;
    int *rcs = NULL, first = 0, rc;
    size_t i, ncommit = 0;

    shmb_error_clear(&c->err);
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    if (res == NULL || rcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto out;
    }
    if ((rc = client_batch_begin(c)) < 0)
        goto out;
    for (i = 0; i < n; i++)
        if ((rc = client_batch_next(c, i)) < 0 ||
            (rc = client_alloc_op(c, keys[i], sizes[i], readers, 0)) < 0)
            goto out;
    if ((rc = client_batch_exchange(c, n, res, rcs)) < 0)
        goto out;
    /* Write what was allocated, then commit it (abort a bad extent). */
    first_err = c->err;
    if ((rc = client_batch_begin(c)) < 0)
        goto out;
    for (i = 0; i < n; i++) {
        void *dst = NULL;
        int r = rcs[i];

        if (r == 0 && (r = client_extent(c, &res[i], sizes[i], &dst, NULL)) < 0 &&
            first_err.code == 0)
            first_err = c->err;
        if (r == 0)
            memcpy(dst, data[i], sizes[i]);
        if (rcs[i] == 0 && ((rc = client_batch_next(c, ncommit)) < 0 ||
                            (rc = client_begin_key(c, r == 0 ? "commit" : "abort", keys[i])) < 0 ||
                            (rc = line_lit(&c->w, "}")) < 0))
            goto out;
        ncommit += rcs[i] == 0;
        rcs[i] = r;
    }
    if (ncommit > 0) {
        struct line_reply *cres = shmb_calloc(ncommit, sizeof(*cres));
        int *crcs = shmb_calloc(ncommit, sizeof(*crcs));
        size_t k = 0;

        rc = cres == NULL || crcs == NULL
                 ? shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.")
                 : client_batch_exchange(c, ncommit, cres, crcs);
        /* A commit that failed makes that object's result its error. */
        for (i = 0; rc == 0 && i < n; i++)
            if (rcs[i] == 0 && crcs[k++] < 0)
                rcs[i] = crcs[k - 1];
        shmb_free(cres);
        shmb_free(crcs);
        if (rc < 0)
            goto out;
    }
    for (i = 0; i < n; i++) {
        if (results != NULL)
            results[i] = rcs[i];
        if (first == 0)
            first = rcs[i];
    }
    /* The earliest error (allocation before commit) is the one reported,
     * code and message together. */
    if (first_err.code < 0)
        c->err = first_err;
    rc = first < 0 && c->err.code < 0 ? c->err.code : first;
out:
    shmb_free(res);
    shmb_free(rcs);
    return rc;
}

int shmb_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                  size_t *sizes, int *results)
{
    struct line_reply *res = NULL;
    int *rcs = NULL, first = 0, rc;
    size_t i;

    shmb_error_clear(&c->err);
    for (i = 0; i < n; i++) {
        ptrs[i] = NULL;
        sizes[i] = 0;
        if ((rc = client_check_key(c, keys[i])) < 0)
            return rc;
    }
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    if (res == NULL || rcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto out;
    }
    if ((rc = client_batch_begin(c)) < 0)
        goto out;
    for (i = 0; i < n; i++)
        if ((rc = client_batch_next(c, i)) < 0 || (rc = client_begin_key(c, "get", keys[i])) < 0 ||
            (rc = line_lit(&c->w, "}")) < 0)
            goto out;
    if ((rc = client_batch_exchange(c, n, res, rcs)) < 0)
        goto out;
    for (i = 0; i < n; i++) {
        void *p = NULL;

        if (rcs[i] == 0 && (rcs[i] = client_extent(c, &res[i], 0, &p, &sizes[i])) < 0 &&
            first == 0)
            first = rcs[i];
        ptrs[i] = p;
        if (results != NULL)
            results[i] = rcs[i];
        if (first == 0)
            first = rcs[i];
    }
    rc = first;
out:
    shmb_free(res);
    shmb_free(rcs);
    return rc;
}

int shmb_touch(shmb_t *c, const char *key, unsigned readers)
{
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key)) < 0)
        return rc;
    return client_call(c,
                       json_pack("{s:s, s:s, s:I}", "op", "touch", "key", key, "readers",
                                 (json_int_t)readers),
                       NULL);
}

int shmb_delete(shmb_t *c, const char *key)
{
    return client_key_op(c, "delete", key, NULL);
}

int shmb_contains(shmb_t *c, const char *key)
{
    struct line_reply r;
    int rc = client_key_op(c, "contains", key, &r);

    return rc < 0 ? rc : r.exists ? 1 : 0;
}

/* Copy a string field of a reply into a fixed buffer, "" when absent. */
static void client_copy_string(const json_t *obj, const char *field, char *dst,
                               size_t len)
{
    const char *s = json_string_value(json_object_get(obj, field));

    snprintf(dst, len, "%s", s != NULL ? s : "");
}

int shmb_stats(shmb_t *c, shmb_stats_t *out)
{
    json_t *reply = NULL, *counters, *blocker;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = client_call(c, json_pack("{s:s}", "op", "stats"), &reply);
    if (rc < 0)
        return rc;
    counters = json_object_get(reply, "counters");
    if ((rc = client_u64(c, reply, "size", &out->size)) < 0 ||
        (rc = client_u64(c, reply, "data_size", &out->data_size)) < 0 ||
        (rc = client_u64(c, reply, "used", &out->used)) < 0 ||
        (rc = client_u64(c, reply, "free", &out->free)) < 0 ||
        (rc = client_u64(c, reply, "objects", &out->objects)) < 0 ||
        (rc = client_u64(c, reply, "pending", &out->pending)) < 0 ||
        (rc = client_u64(c, reply, "pinned", &out->pinned)) < 0 ||
        (rc = client_u64(c, reply, "clients", &out->clients)) < 0 ||
        (rc = client_u64(c, reply, "max_object_size", &out->max_object_size)) < 0 ||
        (rc = client_u64(c, reply, "uptime_s", &out->uptime_s)) < 0 ||
        (rc = client_u64(c, reply, "shm_dir_free", &out->shm_dir_free)) < 0 ||
        (rc = client_u64(c, counters, "allocs", &out->allocs)) < 0 ||
        (rc = client_u64(c, counters, "commits", &out->commits)) < 0 ||
        (rc = client_u64(c, counters, "gets", &out->gets)) < 0 ||
        (rc = client_u64(c, counters, "evictions", &out->evictions)) < 0 ||
        (rc = client_u64(c, counters, "enospc", &out->enospc)) < 0)
        goto out;
    out->pid = json_integer_value(json_object_get(reply, "pid"));
    client_copy_string(reply, "segment", out->segment, sizeof(out->segment));
    client_copy_string(reply, "version", out->version, sizeof(out->version));
    client_copy_string(reply, "shm_dir", out->shm_dir, sizeof(out->shm_dir));
    blocker = json_object_get(reply, "blocker");
    if (json_is_object(blocker)) {
        out->has_blocker = 1;
        client_copy_string(blocker, "key", out->blocker_key, sizeof(out->blocker_key));
        client_copy_string(blocker, "state", out->blocker_state,
                           sizeof(out->blocker_state));
        out->blocker_pins =
            (uint64_t)json_integer_value(json_object_get(blocker, "pins"));
        out->blocker_readers =
            (uint64_t)json_integer_value(json_object_get(blocker, "readers"));
    }
out:
    json_decref(reply);
    return rc;
}

int shmb_request(shmb_t *c, const char *request, char **reply)
{
    json_error_t jerr;
    json_t *req, *rep = NULL;
    int rc;

    *reply = NULL;
    shmb_error_clear(&c->err);
    req = json_loads(request, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL)
        return shmb_error_set(&c->err, -EINVAL, "Request is not valid JSON: %s.",
                              jerr.text);
    rc = client_call(c, req, &rep);
    if (rep != NULL) {
        *reply = json_dumps(rep, JSON_COMPACT);
        json_decref(rep);
        if (*reply == NULL)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for the reply.");
    }
    return rc;
}
