/*
 * The client library: a blocking connection to shmbrokerd, the mapping of its
 * segment, and one function per protocol op. Protocol details come from
 * proto/, so nothing about the wire is written twice.
 */
#include "shmbroker.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
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
#include "../proto/sock.h"
#include "../proto/text.h"
#include "stats.h"

/* put_many allocates at most this many objects per line before committing
 * them: the daemon's default --max-pending, so that a put_many alone never
 * holds more uncommitted allocations than a connection may by default. */
#define CLIENT_PUT_CHUNK 1024

/* A handle's forks field before it ever connected: no process owns it yet. */
#define CLIENT_NEVER_CONNECTED ULONG_MAX

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
    uint64_t last_id;  /* the "id" of the last request sent; never reused */
    bool noreply_sent; /* requests without a reply went out since the last reply */
    /* Misuse guards, checked on entry to every call (client_enter): the
     * process's fork count when this handle connected (the connection is
     * that process's), the pid that connected, and whether a call runs. */
    atomic_ulong forks;
    atomic_int pid;
    atomic_bool busy;
};

/* How many fork()s made this process, counted in the child by a
 * pthread_atfork handler: a handle connected at another count was connected
 * by an ancestor, whose socket the child shares. A load per call, where
 * getpid() would be a system call. */
static atomic_ulong client_forks;
static pthread_once_t client_forks_once = PTHREAD_ONCE_INIT;
static int client_forks_rc; /* pthread_atfork's result */

/* A call this thread made that was refused without touching its handle
 * (used after fork(), or while another thread's call ran on it): the
 * handle's shmb_errcode, shmb_errname and shmb_errmsg report it in this
 * thread until this thread's next call on a handle. The handle's own error
 * may be another thread's, being written. */
static _Thread_local struct {
    const shmb_t *handle;
    int code;
    char message[400];
} client_refusal;

static void client_count_fork(void)
{
    atomic_fetch_add_explicit(&client_forks, 1, memory_order_relaxed);
}

static void client_watch_forks(void)
{
    client_forks_rc = pthread_atfork(NULL, NULL, client_count_fork);
}

/* Refuse a call on c without touching c; returns code. */
static int client_refuse(const shmb_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int client_refuse(const shmb_t *c, int code, const char *fmt, ...)
{
    va_list ap;

    client_refusal.handle = c;
    client_refusal.code = code;
    va_start(ap, fmt);
    vsnprintf(client_refusal.message, sizeof(client_refusal.message), fmt, ap);
    va_end(ap);
    return code;
}

/* The start of every call that uses the connection or the handle's buffers:
 * refuse it in a process that did not connect the handle (a child of
 * fork() shares the parent's socket, and the two would take each other's
 * replies), and while another call runs on the handle (another thread's: a
 * handle serves one call at a time). Nothing is sent and the handle is not
 * touched then. An atomic exchange and two loads: nothing next to a round
 * trip. */
static int client_enter(shmb_t *c)
{
    unsigned long forks = atomic_load_explicit(&c->forks, memory_order_relaxed);

    if (forks != CLIENT_NEVER_CONNECTED &&
        forks != atomic_load_explicit(&client_forks, memory_order_relaxed))
        return client_refuse(
            c, -ECHILD,
            "This handle was connected by process %d and is used in process %d, made by "
            "fork() since: the connection belongs to the parent, and sharing it would "
            "mix the two processes' replies. Nothing was sent. In the child, shmb_close "
            "this handle (the parent's connection is left alone) and connect a new "
            "handle (shmb_new, shmb_connect).",
            atomic_load_explicit(&c->pid, memory_order_relaxed), (int)getpid());
    if (atomic_exchange_explicit(&c->busy, true, memory_order_acquire))
        return client_refuse(
            c, -EBUSY,
            "Another call is running on this handle (in another thread); nothing was "
            "sent. A handle serves one call at a time: use one handle per thread.");
    if (client_refusal.handle != NULL)
        client_refusal.handle = NULL;
    return 0;
}

/* The end of a call client_enter let in. */
static void client_leave(shmb_t *c)
{
    atomic_store_explicit(&c->busy, false, memory_order_release);
}

shmb_t *shmb_new(void)
{
    shmb_t *c = shmb_calloc(1, sizeof(*c));

    if (c == NULL)
        return NULL;
    c->sock = -1;
    c->seg_fd = -1;
    c->populate = 1;
    atomic_init(&c->forks, CLIENT_NEVER_CONNECTED);
    atomic_init(&c->pid, 0);
    atomic_init(&c->busy, false);
    if (client_refusal.handle == c) /* a refusal of a handle freed since */
        client_refusal.handle = NULL;
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
    return client_refusal.handle == c ? client_refusal.code : c->err.code;
}

const char *shmb_errname(const shmb_t *c)
{
    return shmb_error_any_name(shmb_errcode(c));
}

const char *shmb_errmsg(const shmb_t *c)
{
    return client_refusal.handle == c ? client_refusal.message : c->err.message;
}

const char *shmb_strerror(int code)
{
    return shmb_error_any_name(code);
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
    if (client_refusal.handle == c)
        client_refusal.handle = NULL;
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
    c->rlen = 0;
    return shmb_error_set(&c->err, -ECONNRESET,
                          "Connection to shmbrokerd lost (%s: %s); every pin and pending "
                          "allocation of this handle was released. Call shmb_reconnect to "
                          "go on: committed objects and the mapping stay.",
                          what, saved ? strerror(saved) : "closed by the daemon");
}

/* Receive until the buffer holds one whole line; returns its length (without
 * the '\n'), which the caller consumes with client_consume. */
static int client_read_line(shmb_t *c, size_t *line_len)
{
    for (;;) {
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
        /* The segment's descriptor comes with the hello reply; any other
         * descriptor is closed there. */
        n = shmb_sock_recv_fd(c->sock, c->rbuf + c->rlen, c->rcap - c->rlen, &c->seg_fd);
        if (n <= 0)
            return client_lost(c, "receive", n < 0 ? (int)-n : 0);
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

/* The "id" of the next request: a per-handle counter, never 0 and never
 * reused, even across reconnects, so that a late reply cannot match. */
static uint64_t client_next_id(shmb_t *c)
{
    return ++c->last_id;
}

/* An id as text for a message: id_json when not NULL, else the integer id;
 * "none" when has is false. */
static const char *client_id_text(const json_t *id_json, uint64_t id, bool has, char *buf,
                                  size_t len)
{
    char *dumped;

    if (!has)
        return "none";
    if (id_json == NULL) {
        snprintf(buf, len, "%llu", (unsigned long long)id);
        return buf;
    }
    dumped = json_dumps(id_json, JSON_COMPACT | JSON_ENCODE_ANY);
    shmb_escape(dumped != NULL ? dumped : "?", dumped != NULL ? strlen(dumped) : 1, buf,
                len);
    free(dumped);
    return buf;
}

/* The reply at the head of the buffer (len bytes) does not answer the
 * request just sent: its "id" is another's, or it has none (the daemon
 * answers a line it cannot parse without one, even one that said noreply).
 * Taking it would hand one call's reply to another, say another object's
 * offset to an alloc. So the connection is reset, as a disconnect does. */
static int client_out_of_step(shmb_t *c, const char *want, const char *got, size_t len)
{
    char seen[256];
    bool noreply = c->noreply_sent;

    shmb_escape(c->rbuf, len < 160 ? len : 160, seen, sizeof(seen));
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
    c->rlen = 0;
    c->noreply_sent = false;
    return shmb_error_set(&c->err, -ECONNRESET,
                          "Reply out of step with its request: expected id %s, got id %s "
                          "(%s%s)%s. The connection was reset so that no call takes "
                          "another's reply: every pin and pending allocation of this "
                          "handle was released. Call shmb_reconnect to go on.",
                          want, got, seen, len > 160 ? "..." : "",
                          noreply ? "; requests sent without waiting for their reply "
                                    "(shmb_release_nowait, shmb_release_many) were "
                                    "outstanding"
                                  : "");
}

/* Whether got (a reply's "id", may be NULL) answers the request whose id is
 * want (a caller's own id, in shmb_request) or, when want is NULL, id. */
static bool client_id_matches(const json_t *got, const json_t *want, uint64_t id)
{
    if (got == NULL)
        return false;
    if (want != NULL)
        return json_equal(got, want);
    return json_is_integer(got) && json_integer_value(got) >= 0 &&
           (uint64_t)json_integer_value(got) == id;
}

/* Decode the reply line (len bytes) at the head of the buffer after checking
 * that it answers the request (want or id, as client_id_matches). first: the
 * connection's first request (hello), which a refusal at connect time answers
 * without an id (nothing else was sent, so nothing can be confused). 0 with
 * *reply owned by the caller (when reply is not NULL), the reply's error, or
 * -ECONNRESET when the reply is out of step. */
static int client_decode(shmb_t *c, size_t len, const json_t *want, uint64_t id, bool first,
                         json_t **reply)
{
    json_t *value = NULL, *got = NULL;
    int rc = shmb_parse_reply_id(c->rbuf, len, &value, &got, &c->err);

    if (!client_id_matches(got, want, id) && !(first && got == NULL && rc < 0)) {
        char wbuf[96], gbuf[96];

        rc = client_out_of_step(c, client_id_text(want, id, true, wbuf, sizeof(wbuf)),
                                client_id_text(got, 0, got != NULL, gbuf, sizeof(gbuf)),
                                len);
        json_decref(value);
        json_decref(got);
        return rc;
    }
    json_decref(got);
    client_consume(c, len);
    c->noreply_sent = false;
    if (reply != NULL)
        *reply = value;
    else
        json_decref(value);
    return rc;
}

/* Send request (the library keeps no reference) and wait for its reply:
 * 0 with *reply owned by the caller (when reply is not NULL), or the error.
 * The request gets the next id unless it has its own; the reply must carry
 * it. first as in client_decode. */
static int client_call_ex(shmb_t *c, json_t *request, bool first, json_t **reply)
{
    json_t *want = NULL;
    uint64_t id = 0;
    size_t len = 0;
    int rc;

    shmb_error_clear(&c->err);
    if (reply != NULL)
        *reply = NULL;
    c->w.len = 0;
    if (request == NULL)
        return shmb_error_set(&c->err, -EINVAL,
                              "Cannot build the request: its text (a client name given to "
                              "shmb_connect, a key) must be valid UTF-8.");
    if (c->sock < 0) {
        json_decref(request);
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    }
    want = json_incref(json_object_get(request, "id"));
    if (want == NULL && (id = client_next_id(c),
                         json_object_set_new(request, "id", json_integer((json_int_t)id)) != 0))
        rc = -ENOMEM;
    else
        rc = shmb_json_append_line(&c->w, request);
    json_decref(request);
    if (rc < 0) {
        json_decref(want);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    if ((rc = client_send(c)) == 0 && (rc = client_read_line(c, &len)) == 0)
        rc = client_decode(c, len, want, id, first, reply);
    json_decref(want);
    return rc;
}

static int client_call(shmb_t *c, json_t *request, json_t **reply)
{
    return client_call_ex(c, request, false, reply);
}

/* The public header states the key length for itself (it includes nothing
 * of proto/); it must be the protocol's. */
_Static_assert(SHMB_KEY_MAX_LEN == SHMB_KEY_MAX,
               "shmbroker.h's SHMB_KEY_MAX_LEN differs from proto/layout.h's SHMB_KEY_MAX");

/* Each op's flags as constants, so that what the library assumes of an op
 * is checked against proto/ops.def when it compiles. */
enum client_op_flags {
#define SHMB_OP(id, name, flags, usage) CLIENT_OPF_##id = (flags),
#include "../proto/ops.def"
#undef SHMB_OP
};
_Static_assert(CLIENT_OPF_RELEASE & SHMB_OPF_NOREPLY,
               "shmb_release_nowait and shmb_release_many send release with noreply");
_Static_assert((CLIENT_OPF_ALLOC & CLIENT_OPF_COMMIT & CLIENT_OPF_ABORT & CLIENT_OPF_GET &
                SHMB_OPF_BATCH) != 0,
               "shmb_put_many and shmb_get_many batch alloc, commit, abort and get");

/* Check a key before anything goes on the wire: the same check, code and
 * words as the daemon's (proto/text.c), for every call that takes a key. */
static int client_check_key(shmb_t *c, const char *key)
{
    size_t len = 0;

    /* The common key is short ASCII, which is UTF-8 as it is: one pass
     * finds that and its length, and only the length rule is left. Anything
     * else gets the whole check. */
    if (key != NULL) {
        while (key[len] != '\0' && (unsigned char)key[len] < 0x80)
            len++;
        if (key[len] == '\0')
            return shmb_key_len_check(len, &c->err);
        len += strlen(key + len);
    }
    return shmb_key_check(key, len, &c->err);
}

/* Check the n keys of a _many call; the message names the first bad one's
 * index. */
static int client_check_keys(shmb_t *c, size_t n, const char *const *keys)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (client_check_key(c, keys[i]) < 0) {
            char why[SHMB_ERROR_MSG_MAX];

            snprintf(why, sizeof(why), "%s", c->err.message);
            return shmb_error_set(&c->err, -EINVAL,
                                  "keys[%zu] of %zu: %s Nothing was sent.", i, n, why);
        }
    }
    return 0;
}

/* Refuse an object size the protocol cannot carry (its integers are signed
 * 64-bit: 2^63 bytes or more would reach the daemon as a JSON error), with
 * E2BIG and the daemon's words, before anything is sent. */
static int client_check_size(shmb_t *c, size_t size)
{
    if ((uint64_t)size <= (uint64_t)INT64_MAX)
        return 0;
    return shmb_error_set(&c->err, -E2BIG,
                          "Object size (%llu bytes) exceeds max object size (%llu bytes).",
                          (unsigned long long)size,
                          (unsigned long long)(c->info.max_object_size != 0
                                                   ? c->info.max_object_size
                                                   : (uint64_t)INT64_MAX));
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
    struct shmb_segment_header hdr;
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
    /* One copy of the header, so that what is checked is what is quoted. */
    memcpy(&hdr, c->map, sizeof(hdr));
    if (hdr.magic != SHMB_SEGMENT_MAGIC)
        return shmb_error_set(
            &c->err, -EPROTO,
            "The descriptor shmbrokerd passed is not a shmbroker segment: its header "
            "starts with 0x%llx, not the magic number 0x%llx: something (a read-write "
            "client can) overwrote the segment's header page. Restart shmbrokerd.",
            (unsigned long long)hdr.magic, (unsigned long long)SHMB_SEGMENT_MAGIC);
    if (hdr.version != SHMB_LAYOUT_VERSION)
        return shmb_error_set(&c->err, -EPROTO,
                              "The segment has layout version %u; this library reads "
                              "version %d. Use a libshmbroker of shmbrokerd's release.",
                              hdr.version, SHMB_LAYOUT_VERSION);
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
    pthread_once(&client_forks_once, client_watch_forks);
    if (client_forks_rc != 0)
        return shmb_error_set(&c->err, -client_forks_rc,
                              "Cannot watch for fork() (pthread_atfork: %s).",
                              strerror(client_forks_rc));
    if (shmb_sock_address(&sun, path) < 0)
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
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
    rc = client_call_ex(c,
                        json_pack("{s:s, s:i, s:s?, s:s}", "op", shmb_ops[SHMB_OP_HELLO].name, "version",
                                  SHMB_PROTOCOL_VERSION, "name", name, "mode",
                                  c->read_only ? "ro" : "rw"),
                        true, &reply);
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
    /* The connection is this process's (client_enter). */
    atomic_store_explicit(&c->pid, (int)getpid(), memory_order_relaxed);
    atomic_store_explicit(&c->forks, atomic_load_explicit(&client_forks, memory_order_relaxed),
                          memory_order_relaxed);
    return 0;

fail:
    json_decref(reply);
    client_disconnect(c, keep_map);
    return rc;
}

static int client_connect(shmb_t *c, const char *socket_path, const char *name)
{
    const char *path = shmb_socket_path(socket_path);

    if (strlen(path) >= sizeof(c->path))
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
    snprintf(c->path, sizeof(c->path), "%s", path);
    snprintf(c->name, sizeof(c->name), "%s", name != NULL ? name : "");
    return client_dial(c, c->path, name, false);
}

static int client_reconnect(shmb_t *c)
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

/* Send the lines in c->w (the last one a request whose id is id) and read
 * its reply into r: the common success shapes are recognised by hand,
 * anything else (errors) goes through jansson. 0 or the reply's error, its
 * message in c->err; -ECONNRESET when the reply answers another request. */
static int client_exchange(shmb_t *c, uint64_t id, struct line_reply *r)
{
    json_t *reply = NULL;
    const char *p;
    size_t len = 0;
    int rc;

    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    p = c->rbuf;
    if (line_scan_reply(&p, c->rbuf + len, r) == 0 && p == c->rbuf + len) {
        char wbuf[24], gbuf[24];

        if (!r->has_id || r->id != id)
            return client_out_of_step(c, client_id_text(NULL, id, true, wbuf, sizeof(wbuf)),
                                      client_id_text(NULL, r->id, r->has_id, gbuf,
                                                     sizeof(gbuf)),
                                      len);
        client_consume(c, len);
        c->noreply_sent = false;
        return 0;
    }
    rc = client_decode(c, len, NULL, id, false, &reply);
    if (rc == 0)
        client_reply_fields(reply, r);
    json_decref(reply);
    return rc;
}

/* Start a request {"op":"OP"[,"id":ID],"key":KEY in c->w; id 0 for a
 * batch's element, which needs none. The caller checked the key. */
static int client_begin_key(shmb_t *c, enum shmb_op_id op, uint64_t id, const char *key)
{
    if (c->sock < 0)
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    if (line_lit(&c->w, "{\"op\":\"") < 0 || line_lit(&c->w, shmb_ops[op].name) < 0 ||
        (id != 0 && (line_lit(&c->w, "\",\"id\":") < 0 || line_u64(&c->w, id) < 0 ||
                     line_lit(&c->w, ",\"key\":") < 0)) ||
        (id == 0 && line_lit(&c->w, "\",\"key\":") < 0) ||
        line_str(&c->w, key, strlen(key)) < 0)
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
static int client_key_op(shmb_t *c, enum shmb_op_id op, const char *key,
                         struct line_reply *r)
{
    struct line_reply ignored;
    uint64_t id;
    int rc;

    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_check_key(c, key)) < 0 ||
        (rc = client_begin_key(c, op, id = client_next_id(c), key)) < 0)
        return rc;
    if (line_lit(&c->w, "}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return client_exchange(c, id, r != NULL ? r : &ignored);
}

/* The alloc request for key, appended to c->w (without a newline); id 0 in a
 * batch. */
static int client_alloc_op(shmb_t *c, uint64_t id, const char *key, size_t size,
                           unsigned readers, unsigned wait_ms)
{
    int rc;

    if ((rc = client_begin_key(c, SHMB_OP_ALLOC, id, key)) < 0)
        return rc;
    if (line_lit(&c->w, ",\"size\":") < 0 || line_u64(&c->w, size) < 0 ||
        line_lit(&c->w, ",\"readers\":") < 0 || line_u64(&c->w, readers) < 0 ||
        (wait_ms != 0 &&
         (line_lit(&c->w, ",\"wait_ms\":") < 0 || line_u64(&c->w, wait_ms) < 0)) ||
        line_lit(&c->w, "}") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

static int client_alloc(shmb_t *c, const char *key, size_t size, unsigned readers,
                        void **ptr)
{
    struct line_reply r;
    uint64_t id;
    int rc;

    *ptr = NULL;
    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_check_key(c, key)) < 0 || (rc = client_check_size(c, size)) < 0 ||
        (rc = client_alloc_op(c, id = client_next_id(c), key, size, readers,
                              c->alloc_wait_ms)) < 0)
        return rc;
    if (line_lit(&c->w, "\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    if ((rc = client_exchange(c, id, &r)) < 0)
        return rc;
    return client_extent(c, &r, size, ptr, NULL);
}

static int client_commit(shmb_t *c, const char *key)
{
    return client_key_op(c, SHMB_OP_COMMIT, key, NULL);
}

static int client_abort(shmb_t *c, const char *key)
{
    return client_key_op(c, SHMB_OP_ABORT, key, NULL);
}

static int client_put(shmb_t *c, const char *key, const void *data, size_t size,
                      unsigned readers)
{
    void *dst;
    int rc;

    if ((rc = client_alloc(c, key, size, readers, &dst)) < 0)
        return rc;
    memcpy(dst, data, size);
    return client_commit(c, key);
}

static int client_get(shmb_t *c, const char *key, const void **ptr, size_t *size)
{
    struct line_reply r;
    void *p = NULL;
    int rc;

    *ptr = NULL;
    *size = 0;
    rc = client_key_op(c, SHMB_OP_GET, key, &r);
    if (rc == 0)
        rc = client_extent(c, &r, 0, &p, size);
    *ptr = p;
    return rc;
}

static int client_release(shmb_t *c, const char *key)
{
    return client_key_op(c, SHMB_OP_RELEASE, key, NULL);
}

static int client_release_many(shmb_t *c, size_t n, const char *const *keys);

static int client_release_nowait(shmb_t *c, const char *key)
{
    return client_release_many(c, 1, &key);
}

static int client_release_many(shmb_t *c, size_t n, const char *const *keys)
{
    size_t i;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_keys(c, n, keys)) < 0)
        return rc;
    c->w.len = 0;
    for (i = 0; i < n; i++) {
        /* Each line has its id too: a reply to it, which should never come,
         * is then recognised as out of step rather than taken for the next
         * call's. Sent in writes of about SHMB_MAX_LINE bytes. */
        if ((rc = client_begin_key(c, SHMB_OP_RELEASE, client_next_id(c), keys[i])) < 0)
            return rc;
        if (line_lit(&c->w, ",\"noreply\":true}\n") < 0)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
        c->noreply_sent = true;
        if ((c->w.len >= SHMB_MAX_LINE || i + 1 == n) && (rc = client_send(c)) < 0)
            return rc;
        if (c->w.len >= SHMB_MAX_LINE)
            c->w.len = 0;
    }
    return 0;
}

/* One op of a _many call: op i appended to c->w as a batch element. */
typedef int (*client_op_fn)(shmb_t *c, size_t i, const void *arg);

/* Build in c->w one batch line of the ops first, first + 1, ... < n, at most
 * max of them and at most SHMB_MAX_LINE bytes (the daemon closes the
 * connection on a longer line); *count gets how many went in (at least one)
 * and *id the batch's id. */
static int client_batch_fill(shmb_t *c, size_t first, size_t n, size_t max, client_op_fn op,
                             const void *arg, size_t *count, uint64_t *id)
{
    static const char tail[] = "]}\n";
    size_t i;
    int rc;

    c->w.len = 0;
    *id = client_next_id(c);
    if (line_lit(&c->w, "{\"op\":\"") < 0 ||
        line_lit(&c->w, shmb_ops[SHMB_OP_BATCH].name) < 0 || line_lit(&c->w, "\",\"id\":") < 0 || line_u64(&c->w, *id) < 0 ||
        line_lit(&c->w, ",\"ops\":[") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    for (i = first; i < n && i - first < max; i++) {
        size_t mark = c->w.len;

        if (i > first && line_lit(&c->w, ",") < 0)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        if ((rc = op(c, i, arg)) < 0)
            return rc;
        if (c->w.len + sizeof(tail) - 1 > SHMB_MAX_LINE) {
            if (i == first) /* an op is at most a few KiB: cannot happen */
                return shmb_error_set(&c->err, -EMSGSIZE,
                                      "One batch op is longer than %d bytes.",
                                      SHMB_MAX_LINE);
            c->w.len = mark;
            break;
        }
    }
    *count = i - first;
    if (line_lit(&c->w, tail) < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return 0;
}

/* Send the batch line in c->w (whose id is id, with n ops) and decode its
 * replies: res[i] gets each op's reply fields, rcs[i] its 0 or error, and
 * *failed the index of the first op that failed (n when none), whose message
 * stays in c->err. Returns the exchange's own error, or 0. */
static int client_batch_exchange(shmb_t *c, uint64_t id, size_t n, struct line_reply *res,
                                 int *rcs, size_t *failed)
{
    struct line_reply whole;
    json_t *reply = NULL, *replies;
    size_t len = 0, i;
    int rc;

    *failed = n;
    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    if (line_scan_batch(c->rbuf, c->rbuf + len, res, n, &whole) == 0) {
        char wbuf[24], gbuf[24];

        if (!whole.has_id || whole.id != id)
            return client_out_of_step(c, client_id_text(NULL, id, true, wbuf, sizeof(wbuf)),
                                      client_id_text(NULL, whole.id, whole.has_id, gbuf,
                                                     sizeof(gbuf)),
                                      len);
        client_consume(c, len);
        c->noreply_sent = false;
        memset(rcs, 0, n * sizeof(*rcs));
        return 0;
    }
    /* Some op failed (or the reply has an unusual shape): jansson. */
    if ((rc = client_decode(c, len, NULL, id, false, &reply)) < 0)
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
        if (*failed == n) {
            *failed = i;
            shmb_error_set(&c->err, rcs[i], "%s",
                           message != NULL ? message : "malformed batch reply");
        }
    }
    json_decref(reply);
    return 0;
}

/* The first failure of a _many call so far: its index and error. */
struct client_first {
    size_t index;
    struct shmb_error err;
};

/* Remember op index's failure (its message in c->err) if it comes first. */
static void client_note_failure(shmb_t *c, struct client_first *first, size_t index)
{
    if (index < first->index) {
        first->index = index;
        first->err = c->err;
    }
}

/* The arguments of put_many's ops. */
struct client_put_args {
    size_t n;     /* keys in the whole call */
    size_t limit; /* allocations per line: CLIENT_PUT_CHUNK, less once a cap was met */
    const char *const *keys;
    const size_t *sizes;
    unsigned readers;
    const size_t *idx; /* commit/abort: the keys' indexes, in order */
    const int *ok;     /* commit/abort: 1 to commit, 0 to abort */
};

static int client_put_alloc_op(shmb_t *c, size_t i, const void *arg)
{
    const struct client_put_args *a = arg;

    return client_alloc_op(c, 0, a->keys[i], a->sizes[i], a->readers, 0);
}

static int client_put_commit_op(shmb_t *c, size_t k, const void *arg)
{
    const struct client_put_args *a = arg;
    int rc = client_begin_key(c, a->ok[k] ? SHMB_OP_COMMIT : SHMB_OP_ABORT, 0,
                              a->keys[a->idx[k]]);

    if (rc == 0 && line_lit(&c->w, "}") < 0)
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return rc;
}

/* put_many's work space for one chunk, CLIENT_PUT_CHUNK entries each. */
struct client_put_space {
    size_t *idx;              /* the allocated keys' indexes */
    int *ok;                  /* 1 to commit, 0 to abort */
    struct line_reply *cres; /* the commits' replies */
    int *crcs;
};

/* One chunk of put_many: allocate the keys from start on that fit one line
 * (*end gets where the chunk ends), write what was allocated, commit it
 * (abort a bad extent). rcs gets each key's result. */
static int client_put_chunk(shmb_t *c, struct client_put_args *a, const void *const *data,
                            size_t start, size_t n, size_t *end, struct line_reply *res,
                            int *rcs, struct client_put_space *sp,
                            struct client_first *first)
{
    size_t i, m = 0, k, count, failed;
    uint64_t id;
    int rc;

    if ((rc = client_batch_fill(c, start, n, a->limit, client_put_alloc_op, a,
                                &count, &id)) < 0 ||
        (rc = client_batch_exchange(c, id, count, res + start, rcs + start, &failed)) < 0)
        return rc;
    *end = start + count;
    if (failed < count)
        client_note_failure(c, first, start + failed);
    for (i = start; i < *end; i++) {
        void *dst = NULL;

        if (rcs[i] < 0)
            continue;
        sp->idx[m] = i;
        sp->ok[m] = client_extent(c, &res[i], a->sizes[i], &dst, NULL) == 0;
        if (sp->ok[m]) {
            memcpy(dst, data[i], a->sizes[i]);
        } else {
            rcs[i] = c->err.code;
            client_note_failure(c, first, i);
        }
        m++;
    }
    a->idx = sp->idx;
    a->ok = sp->ok;
    for (k = 0; k < m; k += count) {
        size_t j;

        if ((rc = client_batch_fill(c, k, m, CLIENT_PUT_CHUNK, client_put_commit_op, a,
                                    &count, &id)) < 0 ||
            (rc = client_batch_exchange(c, id, count, sp->cres, sp->crcs, &failed)) < 0)
            return rc;
        /* A commit that failed makes that object's result its error. */
        for (j = 0; j < count; j++) {
            if (sp->crcs[j] < 0 && rcs[sp->idx[k + j]] == 0) {
                rcs[sp->idx[k + j]] = sp->crcs[j];
                if (j == failed)
                    client_note_failure(c, first, sp->idx[k + j]);
            }
        }
    }
    /* The daemon's --max-pending (or allocations this handle already
     * holds) stopped the chunk part way: the allocations after the cap all
     * failed with EDQUOT. What was allocated is committed now, so the rest
     * goes again in the next chunk; only a chunk that allocated nothing
     * reports EDQUOT. */
    if (m > 0) {
        for (i = start; i < *end && rcs[i] != -EDQUOT; i++)
            ;
        if (i > start && i < *end) {
            memset(rcs + i, 0, (*end - i) * sizeof(*rcs));
            *end = i;
            if (first->index >= i)
                first->index = a->n;
            /* The cap lets about m through at a time: ask for no more, so
             * that each line makes progress without refusals to resend. */
            a->limit = m;
        }
    }
    return 0;
}

static int client_put_many(shmb_t *c, size_t n, const char *const *keys,
                           const void *const *data, const size_t *sizes, unsigned readers,
                           int *results)
{
    struct client_put_args a = {n, CLIENT_PUT_CHUNK, keys, sizes, readers, NULL, NULL};
    struct client_put_space sp = {NULL, NULL, NULL, NULL};
    struct client_first first;
    struct line_reply *res = NULL;
    int *rcs = NULL, rc = 0;
    size_t i, start = 0, end = 0, chunk = n < CLIENT_PUT_CHUNK ? n : CLIENT_PUT_CHUNK;

    shmb_error_clear(&c->err);
    first.index = n;
    if ((rc = client_check_keys(c, n, keys)) < 0)
        goto fail;
    for (i = 0; i < n; i++) {
        if ((rc = client_check_size(c, sizes[i])) < 0) {
            char why[SHMB_ERROR_MSG_MAX];

            snprintf(why, sizeof(why), "%s", c->err.message);
            rc = shmb_error_set(&c->err, -E2BIG, "sizes[%zu] of %zu: %s Nothing was sent.",
                                i, n, why);
            goto fail;
        }
    }
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    sp.idx = shmb_calloc(chunk, sizeof(*sp.idx));
    sp.ok = shmb_calloc(chunk, sizeof(*sp.ok));
    sp.cres = shmb_calloc(chunk, sizeof(*sp.cres));
    sp.crcs = shmb_calloc(chunk, sizeof(*sp.crcs));
    if (res == NULL || rcs == NULL || sp.idx == NULL || sp.ok == NULL || sp.cres == NULL ||
        sp.crcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto fail;
    }
    /* Chunk by chunk, in order: each chunk's objects are committed before
     * the next chunk is allocated. */
    for (start = 0; start < n; start = end)
        if ((rc = client_put_chunk(c, &a, data, start, n, &end, res, rcs, &sp, &first)) < 0)
            goto fail;
    for (i = 0; results != NULL && i < n; i++)
        results[i] = rcs[i];
    if (first.index < n) {
        c->err = first.err;
        rc = first.err.code;
    } else {
        shmb_error_clear(&c->err); /* refusals that were retried are not the result */
    }
    goto out;
fail:
    /* The call failed as a whole: what earlier chunks committed stays;
     * every other key gets the call's error. */
    for (i = 0; results != NULL && i < n; i++)
        results[i] = i < start && rcs != NULL ? rcs[i] : rc;
out:
    shmb_free(res);
    shmb_free(rcs);
    shmb_free(sp.idx);
    shmb_free(sp.ok);
    shmb_free(sp.cres);
    shmb_free(sp.crcs);
    return rc;
}

static int client_get_op(shmb_t *c, size_t i, const void *arg)
{
    const char *const *keys = arg;
    int rc = client_begin_key(c, SHMB_OP_GET, 0, keys[i]);

    if (rc == 0 && line_lit(&c->w, "}") < 0)
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return rc;
}

static int client_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                           size_t *sizes, int *results)
{
    struct client_first first;
    struct line_reply *res = NULL;
    int *rcs = NULL, rc = 0;
    size_t i, start = 0, count, failed;
    uint64_t id;

    shmb_error_clear(&c->err);
    first.index = n;
    for (i = 0; i < n; i++) {
        ptrs[i] = NULL;
        sizes[i] = 0;
    }
    if ((rc = client_check_keys(c, n, keys)) < 0)
        goto fail;
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    if (res == NULL || rcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto fail;
    }
    for (start = 0; start < n; start += count) {
        if ((rc = client_batch_fill(c, start, n, SHMB_MAX_BATCH, client_get_op, keys, &count,
                                    &id)) < 0 ||
            (rc = client_batch_exchange(c, id, count, res + start, rcs + start, &failed)) < 0)
            goto fail;
        if (failed < count)
            client_note_failure(c, &first, start + failed);
        for (i = start; i < start + count; i++) {
            void *p = NULL;

            if (rcs[i] == 0 && (rcs[i] = client_extent(c, &res[i], 0, &p, &sizes[i])) < 0)
                client_note_failure(c, &first, i);
            ptrs[i] = p;
        }
    }
    for (i = 0; results != NULL && i < n; i++)
        results[i] = rcs[i];
    rc = 0;
    if (first.index < n) {
        c->err = first.err;
        rc = first.err.code;
    }
    goto out;
fail:
    /* The call failed as a whole; pins taken by earlier lines went with the
     * connection, or are released here, so no pointer is handed out. */
    for (i = 0; i < n; i++) {
        if (ptrs[i] != NULL && c->sock >= 0) {
            struct shmb_error saved = c->err;

            client_release_nowait(c, keys[i]);
            c->err = saved;
        }
        ptrs[i] = NULL;
        sizes[i] = 0;
        if (results != NULL)
            results[i] = rc;
    }
out:
    shmb_free(res);
    shmb_free(rcs);
    return rc;
}

static int client_touch(shmb_t *c, const char *key, unsigned readers)
{
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key)) < 0)
        return rc;
    return client_call(c,
                       json_pack("{s:s, s:s, s:I}", "op", shmb_ops[SHMB_OP_TOUCH].name, "key", key, "readers",
                                 (json_int_t)readers),
                       NULL);
}

static int client_delete(shmb_t *c, const char *key)
{
    return client_key_op(c, SHMB_OP_DELETE, key, NULL);
}

static int client_contains(shmb_t *c, const char *key)
{
    struct line_reply r;
    int rc = client_key_op(c, SHMB_OP_CONTAINS, key, &r);

    return rc < 0 ? rc : r.exists ? 1 : 0;
}

/* Copy a string field of a reply into a fixed buffer, "" when absent. */
static void client_copy_string(const json_t *obj, const char *field, char *dst,
                               size_t len)
{
    const char *s = json_string_value(json_object_get(obj, field));

    snprintf(dst, len, "%s", s != NULL ? s : "");
}

/* Every row of proto/stats.def names a member of shmb_stats_t of the same
 * name (the blocker row: has_blocker), so a row added without its member
 * does not compile. */
#define CLIENT_STAT_MEMBER(name)                                                          \
    {offsetof(shmb_stats_t, name), sizeof(((shmb_stats_t *)0)->name)}
#define CLIENT_STAT_PLACE_SHMB_STATK_STRING(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_NUMBER(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_COUNTER(name) CLIENT_STAT_MEMBER(name)
#define CLIENT_STAT_PLACE_SHMB_STATK_BLOCKER(name) CLIENT_STAT_MEMBER(has_blocker)

const struct shmb_stats_place shmb_stats_places[SHMB_STAT_COUNT] = {
#define SHMB_STAT(id, name, kind) [SHMB_STAT_##id] = CLIENT_STAT_PLACE_##kind(name),
#include "../proto/stats.def"
#undef SHMB_STAT
};

/* The size of the first release's shmb_stats_t, which ended before
 * expired_allocs: what shmb_stats fills. */
#define CLIENT_STATS_V1_SIZE offsetof(shmb_stats_t, expired_allocs)

uint64_t shmb_stats_number(const shmb_stats_t *st, enum shmb_stat_id id)
{
    uint64_t v = 0;

    if ((shmb_stat_fields[id].kind == SHMB_STATK_NUMBER ||
         shmb_stat_fields[id].kind == SHMB_STATK_COUNTER) &&
        shmb_stats_places[id].size == sizeof(v))
        memcpy(&v, (const char *)st + shmb_stats_places[id].offset, sizeof(v));
    return v;
}

/* The blocker of a stats reply (an object, or null when nothing blocks). */
static void client_stats_blocker(const json_t *blocker, shmb_stats_t *out)
{
    if (!json_is_object(blocker))
        return;
    out->has_blocker = 1;
    client_copy_string(blocker, "key", out->blocker_key, sizeof(out->blocker_key));
    client_copy_string(blocker, "state", out->blocker_state, sizeof(out->blocker_state));
    out->blocker_pins = (uint64_t)json_integer_value(json_object_get(blocker, "pins"));
    out->blocker_readers = (uint64_t)json_integer_value(json_object_get(blocker, "readers"));
}

/* Fill out from a stats reply, row by row of proto/stats.def: the one place
 * that knows the reply's shape. Numbers and counters must be there. */
static int client_stats_fill(shmb_t *c, const json_t *reply, shmb_stats_t *out)
{
    const json_t *counters = json_object_get(reply, "counters");
    int i, rc;

    memset(out, 0, sizeof(*out));
    for (i = 0; i < SHMB_STAT_COUNT; i++) {
        const char *name = shmb_stat_fields[i].name;
        char *member = (char *)out + shmb_stats_places[i].offset;
        uint64_t v;

        switch (shmb_stat_fields[i].kind) {
        case SHMB_STATK_STRING:
            client_copy_string(reply, name, member, shmb_stats_places[i].size);
            break;
        case SHMB_STATK_BLOCKER:
            client_stats_blocker(json_object_get(reply, name), out);
            break;
        case SHMB_STATK_NUMBER:
        case SHMB_STATK_COUNTER:
            rc = client_u64(c, shmb_stat_fields[i].kind == SHMB_STATK_COUNTER ? counters
                                                                               : reply,
                            name, &v);
            if (rc < 0)
                return rc;
            memcpy(member, &v, sizeof(v));
            break;
        }
    }
    return 0;
}

/* The request {"op":OP} of a report that takes no argument; NULL when out
 * of memory (client_call says so). */
static json_t *client_report_request(enum shmb_op_id op)
{
    return json_pack("{s:s}", "op", shmb_ops[op].name);
}

static int client_stats(shmb_t *c, shmb_stats_t *out, size_t size)
{
    shmb_stats_t all;
    json_t *reply = NULL;
    int rc;

    memset(out, 0, size);
    if (size < CLIENT_STATS_V1_SIZE)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_stats_sized: size %zu is smaller than the first "
                              "release's shmb_stats_t (%zu bytes); pass sizeof(*out).",
                              size, (size_t)CLIENT_STATS_V1_SIZE);
    rc = client_call(c, client_report_request(SHMB_OP_STATS), &reply);
    if (rc == 0) {
        rc = client_stats_fill(c, reply, &all);
        memcpy(out, &all, size < sizeof(all) ? size : sizeof(all));
    }
    json_decref(reply);
    return rc;
}

/* Send req (the library keeps no reference) and give its reply as one line
 * of compact JSON in *reply (malloc'ed, caller frees), without the "id" the
 * library added when req had none (own_id false). */
static int client_call_text(shmb_t *c, json_t *req, bool own_id, char **reply)
{
    json_t *rep = NULL;
    int rc = client_call(c, req, &rep);

    if (rep != NULL) {
        if (!own_id)
            json_object_del(rep, "id");
        *reply = json_dumps(rep, JSON_COMPACT);
        json_decref(rep);
        if (*reply == NULL)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for the reply.");
    }
    return rc;
}

static int client_request(shmb_t *c, const char *request, char **reply)
{
    json_error_t jerr;
    json_t *req;

    *reply = NULL;
    shmb_error_clear(&c->err);
    req = json_loads(request, JSON_REJECT_DUPLICATES, &jerr);
    if (req == NULL)
        return shmb_error_set(&c->err, -EINVAL, "Request is not valid JSON: %s.",
                              jerr.text);
    if (!json_is_object(req) || json_is_true(json_object_get(req, "noreply"))) {
        json_decref(req);
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_request sends one JSON object and waits for its reply: "
                              "not an array or a scalar, and not \"noreply\": true.");
    }
    /* The caller's "id" is matched as it is; without one, the library's is
     * used and taken out of the reply again. */
    return client_call_text(c, req, json_object_get(req, "id") != NULL, reply);
}

static int client_stats_json(shmb_t *c, char **json)
{
    *json = NULL;
    return client_call_text(c, client_report_request(SHMB_OP_STATS), false, json);
}

/* A string field of a report's item, or NULL (-EPROTO in c->err). */
static const char *client_string(shmb_t *c, const json_t *obj, const char *field)
{
    const char *s = json_string_value(json_object_get(obj, field));

    if (s == NULL)
        shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply lacks a string \"%s\".", field);
    return s;
}

/* A report as one block the caller frees with shmb_free: head_size bytes,
 * then one element of elem_size per item of the reply's array field, then
 * the text of each item's string field text (NUL-terminated). *items gets
 * the array, *elems and *texts where those parts start. */
static void *client_report_block(shmb_t *c, const json_t *reply, const char *array,
                                 const char *text, size_t head_size, size_t elem_size,
                                 json_t **items, char **elems, char **texts)
{
    size_t i, room = 0, n;
    char *block;

    *items = json_object_get(reply, array);
    if (!json_is_array(*items)) {
        shmb_error_set(&c->err, -EPROTO, "shmbrokerd's reply lacks an array \"%s\".", array);
        return NULL;
    }
    n = json_array_size(*items);
    for (i = 0; i < n; i++) {
        const char *s = client_string(c, json_array_get(*items, i), text);

        if (s == NULL)
            return NULL;
        room += strlen(s) + 1;
    }
    block = shmb_malloc(head_size + n * elem_size + room);
    if (block == NULL) {
        shmb_error_set(&c->err, -ENOMEM, "Out of memory for a reply of %zu entries.", n);
        return NULL;
    }
    *elems = block + head_size;
    *texts = *elems + n * elem_size;
    return block;
}

/* Copy an item's string field (checked by client_report_block) to *texts,
 * moving it on; returns the copy. */
static const char *client_report_text(const json_t *item, const char *field, char **texts)
{
    const char *s = json_string_value(json_object_get(item, field));
    char *copy = *texts;
    size_t len = strlen(s) + 1;

    memcpy(copy, s, len);
    *texts += len;
    return copy;
}

/* Decode a list reply: one block, every field of every object checked. */
static int client_list_decode(shmb_t *c, const json_t *reply, shmb_list_t **out)
{
    shmb_list_t *list;
    json_t *items, *truncated = json_object_get(reply, "truncated");
    char *elems, *texts;
    size_t i;
    int rc;

    if (!json_is_boolean(truncated))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks a boolean \"truncated\".");
    list = client_report_block(c, reply, "objects", "key", sizeof(*list),
                               sizeof(*list->objects), &items, &elems, &texts);
    if (list == NULL)
        return c->err.code;
    list->count = json_array_size(items);
    list->truncated = json_is_true(truncated);
    list->objects = (shmb_object_info_t *)elems;
    for (i = 0; i < list->count; i++) {
        const json_t *item = json_array_get(items, i);
        shmb_object_info_t *o = &list->objects[i];
        const char *state = client_string(c, item, "state");

        if (state == NULL || (rc = client_u64(c, item, "offset", &o->offset)) < 0 ||
            (rc = client_u64(c, item, "size", &o->size)) < 0 ||
            (rc = client_u64(c, item, "pins", &o->pins)) < 0 ||
            (rc = client_u64(c, item, "readers", &o->readers)) < 0 ||
            (rc = client_u64(c, item, "age_ms", &o->age_ms)) < 0) {
            shmb_free(list);
            return c->err.code;
        }
        snprintf(o->state, sizeof(o->state), "%s", state);
        o->key = client_report_text(item, "key", &texts);
    }
    *out = list;
    return 0;
}

static int client_list(shmb_t *c, const char *prefix, size_t limit, shmb_list_t **out)
{
    json_t *req, *reply = NULL;
    int rc;

    *out = NULL;
    req = json_pack("{s:s, s:s*}", "op", shmb_ops[SHMB_OP_LIST].name, "prefix",
                    prefix != NULL && prefix[0] != '\0' ? prefix : NULL);
    if (req != NULL && limit != 0 &&
        json_object_set_new(req, "limit",
                            json_integer(limit < INT64_MAX ? (json_int_t)limit
                                                           : (json_int_t)INT64_MAX)) != 0) {
        json_decref(req);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    if ((rc = client_call(c, req, &reply)) == 0)
        rc = client_list_decode(c, reply, out);
    json_decref(reply);
    return rc;
}

void shmb_list_free(shmb_list_t *list)
{
    shmb_free(list);
}

/* Decode a clients reply: one block, every field of every client checked. */
static int client_clients_decode(shmb_t *c, const json_t *reply, shmb_clients_t **out)
{
    shmb_clients_t *list;
    json_t *items;
    char *elems, *texts;
    size_t i;
    int rc;

    list = client_report_block(c, reply, "clients", "name", sizeof(*list),
                               sizeof(*list->clients), &items, &elems, &texts);
    if (list == NULL)
        return c->err.code;
    list->count = json_array_size(items);
    list->clients = (shmb_client_info_t *)elems;
    for (i = 0; i < list->count; i++) {
        const json_t *item = json_array_get(items, i), *self = json_object_get(item, "self");
        shmb_client_info_t *o = &list->clients[i];
        const char *mode = client_string(c, item, "mode");
        uint64_t pid = 0, uid = 0, gid = 0;

        if (mode == NULL || (rc = client_u64(c, item, "pid", &pid)) < 0 ||
            (rc = client_u64(c, item, "uid", &uid)) < 0 ||
            (rc = client_u64(c, item, "gid", &gid)) < 0 ||
            (rc = client_u64(c, item, "pins", &o->pins)) < 0 ||
            (rc = client_u64(c, item, "pending", &o->pending)) < 0 ||
            (rc = client_u64(c, item, "bytes_pinned", &o->bytes_pinned)) < 0 ||
            (rc = client_u64(c, item, "connected_unix", &o->connected_unix)) < 0 ||
            (!json_is_boolean(self) &&
             shmb_error_set(&c->err, -EPROTO,
                            "shmbrokerd's reply lacks a boolean \"self\".") < 0)) {
            shmb_free(list);
            return c->err.code;
        }
        o->pid = (int64_t)pid;
        o->uid = (int64_t)uid;
        o->gid = (int64_t)gid;
        o->self = json_is_true(self);
        snprintf(o->mode, sizeof(o->mode), "%s", mode);
        o->name = client_report_text(item, "name", &texts);
    }
    *out = list;
    return 0;
}

static int client_clients(shmb_t *c, shmb_clients_t **out)
{
    json_t *reply = NULL;
    int rc;

    *out = NULL;
    if ((rc = client_call(c, client_report_request(SHMB_OP_CLIENTS), &reply)) == 0)
        rc = client_clients_decode(c, reply, out);
    json_decref(reply);
    return rc;
}

void shmb_clients_free(shmb_clients_t *clients)
{
    shmb_free(clients);
}

/* ---- the public calls: each one is its work between client_enter and
 * client_leave, with its outputs set to "nothing" when it is refused ---- */

int shmb_connect(shmb_t *c, const char *socket_path, const char *name)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_connect(c, socket_path, name);
    client_leave(c);
    return rc;
}

int shmb_reconnect(shmb_t *c)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_reconnect(c);
    client_leave(c);
    return rc;
}

int shmb_alloc(shmb_t *c, const char *key, size_t size, unsigned readers, void **ptr)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *ptr = NULL;
        return rc;
    }
    rc = client_alloc(c, key, size, readers, ptr);
    client_leave(c);
    return rc;
}

int shmb_commit(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_commit(c, key);
    client_leave(c);
    return rc;
}

int shmb_abort(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_abort(c, key);
    client_leave(c);
    return rc;
}

int shmb_put(shmb_t *c, const char *key, const void *data, size_t size, unsigned readers)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_put(c, key, data, size, readers);
    client_leave(c);
    return rc;
}

int shmb_get(shmb_t *c, const char *key, const void **ptr, size_t *size)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *ptr = NULL;
        *size = 0;
        return rc;
    }
    rc = client_get(c, key, ptr, size);
    client_leave(c);
    return rc;
}

int shmb_release(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_release(c, key);
    client_leave(c);
    return rc;
}

int shmb_release_nowait(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_release_nowait(c, key);
    client_leave(c);
    return rc;
}

int shmb_release_many(shmb_t *c, size_t n, const char *const *keys)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_release_many(c, n, keys);
    client_leave(c);
    return rc;
}

int shmb_put_many(shmb_t *c, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, unsigned readers, int *results)
{
    int rc = client_enter(c);
    size_t i;

    if (rc < 0) {
        for (i = 0; results != NULL && i < n; i++)
            results[i] = rc;
        return rc;
    }
    rc = client_put_many(c, n, keys, data, sizes, readers, results);
    client_leave(c);
    return rc;
}

int shmb_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                  size_t *sizes, int *results)
{
    int rc = client_enter(c);
    size_t i;

    if (rc < 0) {
        for (i = 0; i < n; i++) {
            ptrs[i] = NULL;
            sizes[i] = 0;
            if (results != NULL)
                results[i] = rc;
        }
        return rc;
    }
    rc = client_get_many(c, n, keys, ptrs, sizes, results);
    client_leave(c);
    return rc;
}

int shmb_touch(shmb_t *c, const char *key, unsigned readers)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_touch(c, key, readers);
    client_leave(c);
    return rc;
}

int shmb_delete(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_delete(c, key);
    client_leave(c);
    return rc;
}

int shmb_contains(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    rc = client_contains(c, key);
    client_leave(c);
    return rc;
}

/* The end of a call client_enter let in, passing its result on. */
static int client_done(shmb_t *c, int rc)
{
    client_leave(c);
    return rc;
}

int shmb_stats_sized(shmb_t *c, shmb_stats_t *out, size_t size)
{
    int rc = client_enter(c);

    if (rc < 0) {
        memset(out, 0, size);
        return rc;
    }
    return client_done(c, client_stats(c, out, size));
}

#undef shmb_stats
int shmb_stats(shmb_t *c, shmb_stats_t *out)
{
    return shmb_stats_sized(c, out, CLIENT_STATS_V1_SIZE);
}

int shmb_stats_json(shmb_t *c, char **json)
{
    int rc = client_enter(c);

    *json = NULL;
    return rc < 0 ? rc : client_done(c, client_stats_json(c, json));
}

int shmb_list(shmb_t *c, const char *prefix, size_t limit, shmb_list_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_list(c, prefix, limit, out));
}

int shmb_clients(shmb_t *c, shmb_clients_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_clients(c, out));
}

int shmb_request(shmb_t *c, const char *request, char **reply)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *reply = NULL;
        return rc;
    }
    rc = client_request(c, request, reply);
    client_leave(c);
    return rc;
}
