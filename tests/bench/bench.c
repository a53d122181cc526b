// SPDX-License-Identifier: Apache-2.0
/*
 * shmb-bench: measure a running shmbrokerd through the client library, and
 * the references it is compared with in the same run: Redis over a Unix
 * socket (a small RESP client of the same shape), memcpy of the same bytes,
 * and a bare Unix-socket round trip against an echo server it forks. It
 * starts no daemon itself; scripts/bench.sh does.
 *
 * N client processes are forked; they connect, wait on a barrier (a pipe the
 * parent closes), run, and leave their counts and latency samples in shared
 * memory, which the parent aggregates. Each run prints one table line and
 * one JSON line.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "shmbroker.h"

/* Latency samples kept per client: enough for a p99.9 of a few seconds of
 * small operations; beyond it every k-th operation is sampled. */
#define MAX_SAMPLES (1u << 20)
#define MAX_CLIENTS 256
#define MAX_BATCH 1024 /* the daemon's default --max-pending */
/* The bytes of one request line in rtt mode: about a real request. */
#define RTT_MSG 64

enum mode {
    M_PUT, M_GET, M_PUTGET, M_BPUT, M_BGET, M_BPUTGET, M_REDIS, M_RTT, M_MEMCPY,
    M_SCALE, M_READY, M_PUTREAD, M_READ, M_PUTREAD_NOWAIT,
};

static const char *const mode_names[] = {
    "put", "get", "putget", "batch-put", "batch-get", "batch-putget", "redis", "rtt",
    "memcpy", "scale", "ready", "putread", "read", "putread-nowait",
};

struct options {
    enum mode mode;
    const char *socket;
    const char *redis_socket;
    const char *label;
    size_t size;
    int clients;
    uint64_t ops;       /* per client; 0: run for seconds */
    double seconds;
    int batch;
    uint64_t objects;   /* scale: live objects */
    int release_nowait; /* plain get: release without waiting for the answer */
    size_t memcpy_span; /* memcpy: bytes the source (and destination) rotate over */
    double lap;         /* seconds of the untimed first lap; < 0: a tenth of the run */
};

/* What one client leaves for the parent (in shared memory). */
struct client_result {
    uint64_t ops;     /* objects (or round trips, or memcpys) done */
    uint64_t start_ns, end_ns;
    uint64_t nsamples;
    uint64_t sample_every;
    int failed;
    char error[256];
    uint64_t fast, fallback; /* putread, read: shmb_read_stats at the end */
    uint64_t first_ops, first_ns; /* the untimed first lap: units done, its time */
    int warm;                     /* the first lap is over: the clock runs */
    double samples[MAX_SAMPLES]; /* latency per unit, in microseconds */
};

static struct options opt = {
    .mode = M_PUTGET, .size = 4096, .clients = 1, .seconds = 2.0, .batch = 16,
    .objects = 1000000, .label = "", .memcpy_span = 256u << 20, .lap = -1,
};

/* ---- small utilities ------------------------------------------------------ */

/* Report a failure of a client into its result slot. */
static int client_fail(struct client_result *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int client_fail(struct client_result *r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
    r->failed = 1;
    return -1;
}

/* Record one unit's latency (every k-th once the array is full). */
static void record(struct client_result *r, uint64_t ns, uint64_t n)
{
    if (r->ops % r->sample_every == 0 && r->nsamples < MAX_SAMPLES)
        r->samples[r->nsamples++] = (double)ns / 1000.0 / (double)n;
    r->ops += n;
}

/* Whether a client should go on: by count or by time. A timed run begins
 * with an untimed first lap (--lap): the first requests of a process pay for
 * what later ones find ready (pages of its buffers and of the daemon's, the
 * caches, the daemon's first arena for it), as a real client pays once, so
 * the lap is counted apart and reported on a line of its own. */
static bool keep_going(struct client_result *r)
{
    uint64_t now;

    if (opt.ops != 0)
        return r->ops < opt.ops;
    if (!r->warm) {
        now = now_ns();
        if (now - r->start_ns < (uint64_t)(opt.lap * 1e9))
            return true;
        r->first_ops = r->ops;
        r->first_ns = now - r->start_ns;
        r->ops = 0;
        r->nsamples = 0;
        r->start_ns = now;
        r->warm = 1;
    }
    return now_ns() - r->start_ns < (uint64_t)(opt.seconds * 1e9);
}

static volatile uint64_t sink; /* keeps the sums alive */

/* The descriptor a client writes one byte to once it is ready to start. */
static int ready_fd = -1;

/* Say ready, then wait until the parent opens the gate (EOF on barrier):
 * every client starts together, after every one has connected and mapped. */
static int wait_gate(struct client_result *r, int barrier)
{
    char byte = 1;

    if (write(ready_fd, &byte, 1) != 1 || read(barrier, &byte, 1) < 0)
        return client_fail(r, "barrier: %s", strerror(errno));
    return 0;
}

/* ---- shmbroker ------------------------------------------------------------ */

/* Keys unique to this client and this run: no collision between clients,
 * rounds or repeated runs against the same daemon. */
static void make_key(char *buf, size_t len, int client, uint64_t i)
{
    static int run; /* the parent's pid, asked once: a system call per key is
                       no part of what is measured (Redis's key is made once) */

    if (run == 0)
        run = (int)getppid();
    snprintf(buf, len, "b%d-%d-%llu", run, client, (unsigned long long)i);
}

/* put: alloc, write the pattern through the zero-copy pointer, commit.
 * readers 0, so that eviction reclaims it once nobody pins it. */
static int do_put(shmb_t *c, struct client_result *r, const char *key, uint64_t i)
{
    void *p;

    if (shmb_alloc(c, key, opt.size, 0, &p) != 0)
        return client_fail(r, "alloc %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    memset(p, (int)(i & 0xff), opt.size);
    if (shmb_commit(c, key) != 0)
        return client_fail(r, "commit %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    return 0;
}

/* get: pin, read every byte through the pointer, release. */
static int do_get(shmb_t *c, struct client_result *r, const char *key)
{
    const void *p;
    size_t n;

    if (shmb_get(c, key, &p, &n) != 0)
        return client_fail(r, "get %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    sink += sum_bytes(p, n);
    if ((opt.release_nowait ? shmb_release_nowait(c, key) : shmb_release(c, key)) != 0)
        return client_fail(r, "release %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    return 0;
}

/* The batch modes' buffers: B keys, B sources for put_many. */
struct batch_bufs {
    char keys[MAX_BATCH][64];
    const char *kp[MAX_BATCH];
    const void *data[MAX_BATCH];
    const void *ptrs[MAX_BATCH];
    size_t sizes[MAX_BATCH];
    size_t got[MAX_BATCH];
    unsigned char *src;
};

/* One client's run against the daemon, in the plain or batch modes. */
static int run_shmb(int id, struct client_result *r, int barrier)
{
    static struct batch_bufs bb;
    shmb_t *c = shmb_new();
    char key[64];
    uint64_t i = 0, t;
    int b, nb = opt.batch;

    if (c == NULL || shmb_connect(c, opt.socket, "shmb-bench") != 0)
        return client_fail(r, "connect %s: %s", opt.socket, c ? shmb_errmsg(c) : "ENOMEM");
    /* With many clients and big objects the oldest object in the ring is
     * often one another client is still reading: wait for it, as a real
     * writer would, rather than fail with ENOSPC. */
    shmb_set_alloc_wait(c, 30000);
    if (opt.mode == M_BPUT || opt.mode == M_BGET || opt.mode == M_BPUTGET) {
        bb.src = malloc(opt.size);
        if (bb.src == NULL)
            return client_fail(r, "out of memory");
        memset(bb.src, 0x5a, opt.size);
        for (b = 0; b < nb; b++) {
            bb.kp[b] = bb.keys[b];
            bb.data[b] = bb.src;
            bb.sizes[b] = opt.size;
        }
    }
    /* get modes read objects written before the clock starts. */
    if (opt.mode == M_GET) {
        make_key(key, sizeof(key), id, 0);
        if (do_put(c, r, key, 0) != 0)
            return -1;
    } else if (opt.mode == M_BGET) {
        for (b = 0; b < nb; b++)
            make_key(bb.keys[b], sizeof(bb.keys[b]), id, (uint64_t)b);
        if (shmb_put_many(c, (size_t)nb, bb.kp, bb.data, bb.sizes, 0, NULL) != 0)
            return client_fail(r, "put_many: %s", shmb_errmsg(c));
    }
    if (wait_gate(r, barrier) != 0)
        return -1;
    r->start_ns = now_ns();
    while (keep_going(r)) {
        t = now_ns();
        switch (opt.mode) {
        case M_PUT:
            make_key(key, sizeof(key), id, i);
            if (do_put(c, r, key, i) != 0)
                return -1;
            record(r, now_ns() - t, 1);
            break;
        case M_GET:
            make_key(key, sizeof(key), id, 0);
            if (do_get(c, r, key) != 0)
                return -1;
            record(r, now_ns() - t, 1);
            break;
        case M_PUTGET:
            make_key(key, sizeof(key), id, i);
            if (do_put(c, r, key, i) != 0 || do_get(c, r, key) != 0)
                return -1;
            record(r, now_ns() - t, 1);
            break;
        case M_BPUT:
        case M_BPUTGET:
            for (b = 0; b < nb; b++)
                make_key(bb.keys[b], sizeof(bb.keys[b]), id, i * (uint64_t)nb + (uint64_t)b);
            if (shmb_put_many(c, (size_t)nb, bb.kp, bb.data, bb.sizes, 0, NULL) != 0)
                return client_fail(r, "put_many: %s: %s", shmb_errname(c), shmb_errmsg(c));
            if (opt.mode == M_BPUT) {
                record(r, now_ns() - t, (uint64_t)nb);
                break;
            }
            /* fall through */
        case M_BGET:
            if (shmb_get_many(c, (size_t)nb, bb.kp, bb.ptrs, bb.got, NULL) != 0)
                return client_fail(r, "get_many: %s: %s", shmb_errname(c), shmb_errmsg(c));
            for (b = 0; b < nb; b++)
                sink += sum_bytes(bb.ptrs[b], bb.got[b]);
            if (shmb_release_many(c, (size_t)nb, bb.kp) != 0)
                return client_fail(r, "release_many: %s", shmb_errmsg(c));
            record(r, now_ns() - t, (uint64_t)nb);
            break;
        default:
            return client_fail(r, "not a daemon mode");
        }
        i++;
    }
    r->end_ns = now_ns();
    shmb_close(c);
    free(bb.src);
    return 0;
}

/* The new calls: putread = shmb_put (one round trip through the arena) and
 * shmb_read (no round trip: the catalog in the mapping) of a new key each
 * time, every byte written and read; read = shmb_read of one hot key put
 * before the clock starts; putread-nowait = shmb_put_nowait (the commit not
 * waited for) and shmb_read, which finds the commit in the catalog once the
 * daemon published it (shmb_set_read_wait), every put confirmed by
 * shmb_sync at the end. Each client reports how its reads were served.
 * Once the clients run, a read run makes no system call (the clock is the
 * vDSO's): strace -c -f counts as many calls for a thousand reads as for a
 * million (scripts/bench.sh). */
static int run_reads(int id, struct client_result *r, int barrier)
{
    shmb_t *c = shmb_new();
    unsigned char *src = malloc(opt.size), *dst = malloc(opt.size);
    shmb_read_stats_t rs;
    char key[64];
    uint64_t i = 0, t;
    size_t n;

    if (c == NULL || src == NULL || dst == NULL)
        return client_fail(r, "out of memory");
    if (shmb_connect(c, opt.socket, "shmb-bench") != 0)
        return client_fail(r, "connect %s: %s", opt.socket, shmb_errmsg(c));
    shmb_set_alloc_wait(c, 30000);
    memset(src, 0x5a, opt.size);
    if (opt.mode == M_READ) {
        make_key(key, sizeof(key), id, 0);
        if (shmb_put(c, key, src, opt.size, 0) != 0)
            return client_fail(r, "put %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    }
    if (wait_gate(r, barrier) != 0)
        return -1;
    r->start_ns = now_ns();
    while (keep_going(r)) {
        t = now_ns();
        if (opt.mode != M_READ) {
            make_key(key, sizeof(key), id, i);
            src[0] = (unsigned char)i;
            if ((opt.mode == M_PUTREAD_NOWAIT ? shmb_put_nowait(c, key, src, opt.size, 0)
                                              : shmb_put(c, key, src, opt.size, 0)) != 0)
                return client_fail(r, "put %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
        }
        if (shmb_read(c, key, dst, opt.size, &n) != 0)
            return client_fail(r, "read %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
        sink += sum_bytes(dst, n);
        record(r, now_ns() - t, 1);
        i++;
    }
    r->end_ns = now_ns();
    /* Every put sent without waiting was made, or the run says so. */
    if (shmb_sync(c) != 0)
        return client_fail(r, "sync: %s: %s", shmb_errname(c), shmb_errmsg(c));
    shmb_read_stats(c, &rs);
    r->fast = rs.fast;
    r->fallback = rs.fallback;
    shmb_close(c);
    free(src);
    free(dst);
    return 0;
}

/* ---- Redis: a small RESP client over the Unix socket ---------------------- */

/* A buffered connection to redis-server. */
struct resp {
    int fd;
    char *buf;
    size_t len, cap, pos;
};

static int resp_send(struct resp *rc, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = send(rc->fd, p, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Make at least want unread bytes available in rc->buf. */
static int resp_fill(struct resp *rc, size_t want)
{
    if (rc->pos > 0 && rc->len - rc->pos < want) {
        memmove(rc->buf, rc->buf + rc->pos, rc->len - rc->pos);
        rc->len -= rc->pos;
        rc->pos = 0;
    }
    if (rc->cap < want) {
        char *g = realloc(rc->buf, want);

        if (g == NULL)
            return -1;
        rc->buf = g;
        rc->cap = want;
    }
    while (rc->len - rc->pos < want) {
        ssize_t n = recv(rc->fd, rc->buf + rc->len, rc->cap - rc->len, 0);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        rc->len += (size_t)n;
    }
    return 0;
}

/* Read one line ending in \r\n; returns its start (NUL-terminated). */
static char *resp_line(struct resp *rc)
{
    for (;;) {
        char *s = rc->buf + rc->pos, *e = memchr(s, '\n', rc->len - rc->pos);

        if (e != NULL) {
            *e = '\0';
            rc->pos = (size_t)(e + 1 - rc->buf);
            return s;
        }
        if (resp_fill(rc, rc->len - rc->pos + 1) < 0)
            return NULL;
    }
}

/* SET key value: the value written into a buffer, then sent. */
static int redis_set(struct resp *rc, const char *key, const void *val, size_t len)
{
    char hdr[128];
    int n = snprintf(hdr, sizeof(hdr), "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                     strlen(key), key, len);
    char *line;

    if (resp_send(rc, hdr, (size_t)n) < 0 || resp_send(rc, val, len) < 0 ||
        resp_send(rc, "\r\n", 2) < 0 || (line = resp_line(rc)) == NULL)
        return -1;
    return line[0] == '+' ? 0 : -1;
}

/* GET key: the value received into the read buffer and summed, as the
 * shmbroker reader sums the bytes it reads in place. */
static int redis_get(struct resp *rc, const char *key, size_t want)
{
    char hdr[128];
    int n = snprintf(hdr, sizeof(hdr), "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
    char *line;
    size_t len;

    if (resp_send(rc, hdr, (size_t)n) < 0 || (line = resp_line(rc)) == NULL || line[0] != '$')
        return -1;
    len = strtoull(line + 1, NULL, 10);
    if (len != want || resp_fill(rc, len + 2) < 0)
        return -1;
    sink += sum_bytes(rc->buf + rc->pos, len);
    rc->pos += len + 2;
    return 0;
}

/* One client's SET+GET loop: one key per client, overwritten each round
 * (redis-benchmark's shape), so Redis's memory stays bounded. */
static int run_redis(int id, struct client_result *r, int barrier)
{
    struct resp rc = {-1, NULL, 0, 0, 0};
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    unsigned char *val = malloc(opt.size);
    char key[64];
    uint64_t i = 0, t;

    if (val == NULL)
        return client_fail(r, "out of memory");
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", opt.redis_socket);
    rc.fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (rc.fd < 0 || connect(rc.fd, (struct sockaddr *)&sun, sizeof(sun)) != 0)
        return client_fail(r, "connect %s: %s", opt.redis_socket, strerror(errno));
    snprintf(key, sizeof(key), "bench:%d:%d", (int)getppid(), id);
    if (wait_gate(r, barrier) != 0)
        return -1;
    r->start_ns = now_ns();
    while (keep_going(r)) {
        t = now_ns();
        memset(val, (int)(i & 0xff), opt.size);
        if (redis_set(&rc, key, val, opt.size) < 0 || redis_get(&rc, key, opt.size) < 0)
            return client_fail(r, "redis SET/GET of %zu bytes failed", opt.size);
        record(r, now_ns() - t, 1);
        i++;
    }
    r->end_ns = now_ns();
    close(rc.fd);
    free(rc.buf);
    free(val);
    return 0;
}

/* ---- references: memcpy and the bare round trip --------------------------- */

/* memcpy of size bytes in this process, from and to prefaulted buffers that
 * rotate over --memcpy-span bytes each (shared out among the clients): the broker's ring never hands out the
 * same bytes twice in a row, so its data is as cold in the caches as this
 * (--memcpy-span 0: the same two buffers every time, cache-hot). Small sizes
 * are timed in blocks (a clock read costs more than a 64-byte copy). */
static int run_memcpy(struct client_result *r, int barrier)
{
    size_t reps = opt.size >= (1u << 20) ? 1 : (1u << 20) / opt.size, k;
    size_t slots = opt.memcpy_span / (size_t)opt.clients / opt.size, slot = 0;
    unsigned char *src, *dst;
    uint64_t t;

    if (slots < 1)
        slots = 1;
    src = malloc(slots * opt.size);
    dst = malloc(slots * opt.size);
    if (src == NULL || dst == NULL)
        return client_fail(r, "out of memory");
    memset(src, 0x5a, slots * opt.size);
    memset(dst, 0, slots * opt.size);
    if (wait_gate(r, barrier) != 0)
        return -1;
    r->start_ns = now_ns();
    while (keep_going(r)) {
        t = now_ns();
        for (k = 0; k < reps; k++) {
            memcpy(dst + slot * opt.size, src + slot * opt.size, opt.size);
            __asm__ __volatile__("" : : "r"(dst) : "memory");
            if (++slot == slots)
                slot = 0;
        }
        record(r, now_ns() - t, reps);
    }
    r->end_ns = now_ns();
    sink += dst[opt.size - 1];
    free(src);
    free(dst);
    return 0;
}

/* The echo server of rtt mode: one process, poll over every connection,
 * echo what arrives (the daemon's shape: single-threaded, one loop). */
static void echo_server(int lfd)
{
    struct pollfd pfd[MAX_CLIENTS + 1];
    char buf[4096];
    int n = 1, i;

    pfd[0].fd = lfd;
    pfd[0].events = POLLIN;
    for (;;) {
        if (poll(pfd, (nfds_t)n, -1) < 0 && errno != EINTR)
            _exit(1);
        if ((pfd[0].revents & POLLIN) && n <= MAX_CLIENTS) {
            int fd = accept(lfd, NULL, NULL);

            if (fd >= 0) {
                pfd[n].fd = fd;
                pfd[n].events = POLLIN;
                pfd[n].revents = 0;
                n++;
            }
        }
        for (i = 1; i < n; i++) {
            ssize_t got;

            if (!(pfd[i].revents & (POLLIN | POLLHUP)))
                continue;
            got = read(pfd[i].fd, buf, sizeof(buf));
            if (got <= 0) {
                close(pfd[i].fd);
                pfd[i] = pfd[--n];
                i--;
                continue;
            }
            if (write(pfd[i].fd, buf, (size_t)got) != got)
                _exit(1);
        }
    }
}

/* A client of the echo server: send a request-sized line, read it back. */
static int run_rtt(struct client_result *r, int barrier, const char *path)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    char msg[RTT_MSG], back[RTT_MSG];
    uint64_t t;
    size_t got;
    int fd;

    memset(msg, 'x', sizeof(msg));
    msg[sizeof(msg) - 1] = '\n';
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0)
        return client_fail(r, "connect echo: %s", strerror(errno));
    if (wait_gate(r, barrier) != 0)
        return -1;
    r->start_ns = now_ns();
    while (keep_going(r)) {
        t = now_ns();
        if (send(fd, msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t)sizeof(msg))
            return client_fail(r, "send: %s", strerror(errno));
        for (got = 0; got < sizeof(back);) {
            ssize_t n = recv(fd, back + got, sizeof(back) - got, 0);

            if (n <= 0)
                return client_fail(r, "recv: %s", n < 0 ? strerror(errno) : "EOF");
            got += (size_t)n;
        }
        record(r, now_ns() - t, 1);
    }
    r->end_ns = now_ns();
    close(fd);
    return 0;
}

/* ---- the parent: fork, barrier, aggregate --------------------------------- */

/* Print one table line and one JSON line for a finished run. */
static void report(const struct client_result *res, int n)
{
    uint64_t ops = 0, start = UINT64_MAX, end = 0, total = 0, fast = 0, fallback = 0;
    uint64_t first_ops = 0, first_ns = 0;
    double *all, secs, ops_s, gbs, first_s;
    size_t k = 0;
    int i;

    for (i = 0; i < n; i++) {
        total += res[i].nsamples;
        ops += res[i].ops;
        fast += res[i].fast;
        fallback += res[i].fallback;
        first_ops += res[i].first_ops;
        if (res[i].first_ns > first_ns)
            first_ns = res[i].first_ns;
        if (res[i].start_ns < start)
            start = res[i].start_ns;
        if (res[i].end_ns > end)
            end = res[i].end_ns;
    }
    all = malloc((total ? total : 1) * sizeof(*all));
    if (all == NULL) {
        fprintf(stderr, "shmb-bench: out of memory\n");
        exit(1);
    }
    for (i = 0; i < n; i++) {
        memcpy(all + k, res[i].samples, res[i].nsamples * sizeof(*all));
        k += res[i].nsamples;
    }
    qsort(all, k, sizeof(*all), cmp_double);
    secs = (double)(end - start) / 1e9;
    ops_s = (double)ops / secs;
    gbs = opt.mode == M_RTT ? 0 : ops_s * (double)opt.size / 1e9;
    first_s = first_ns ? (double)first_ops / ((double)first_ns / 1e9) : 0;
    printf("%-13s %10zu %3d %12.0f %9.3f %10.2f %10.2f %10.2f  %s\n", mode_names[opt.mode],
           opt.size, n, ops_s, gbs, quantile(all, k, 0.5), quantile(all, k, 0.99),
           quantile(all, k, 0.999), opt.label);
    printf("{\"mode\":\"%s\",\"label\":\"%s\",\"size\":%zu,\"clients\":%d,\"batch\":%d,"
           "\"ops\":%llu,\"seconds\":%.3f,\"ops_per_s\":%.1f,\"gb_per_s\":%.4f,"
           "\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"reads_fast\":%llu,"
           "\"reads_fallback\":%llu,\"first_lap_ops\":%llu,\"first_lap_ops_per_s\":%.1f}\n",
           mode_names[opt.mode], opt.label, opt.size, n,
           opt.mode == M_BPUT || opt.mode == M_BGET || opt.mode == M_BPUTGET ? opt.batch : 1,
           (unsigned long long)ops, secs, ops_s, gbs, quantile(all, k, 0.5),
           quantile(all, k, 0.99), quantile(all, k, 0.999), (unsigned long long)fast,
           (unsigned long long)fallback, (unsigned long long)first_ops, first_s);
    fflush(stdout);
    free(all);
}

/* Fork the clients, let them go together, wait, aggregate. */
static int run_clients(void)
{
    size_t bytes = sizeof(struct client_result) * (size_t)opt.clients;
    struct client_result *res;
    char echo_path[108] = "";
    pid_t echo = 0, pids[MAX_CLIENTS];
    int gate[2], ready[2], i, failed = 0;
    char byte;

    res = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED || pipe(gate) != 0 || pipe(ready) != 0) {
        perror("shmb-bench: mmap/pipe");
        return 1;
    }
    if (opt.mode == M_RTT) {
        struct sockaddr_un sun = {.sun_family = AF_UNIX};
        int lfd = socket(AF_UNIX, SOCK_STREAM, 0);

        snprintf(echo_path, sizeof(echo_path), "/tmp/shmb-bench-echo-%d.sock", (int)getpid());
        unlink(echo_path);
        snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", echo_path);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sun, sizeof(sun)) != 0 ||
            listen(lfd, MAX_CLIENTS) != 0) {
            perror("shmb-bench: echo socket");
            return 1;
        }
        echo = fork();
        if (echo == 0) {
            close(gate[0]); /* or the clients' barrier never opens */
            close(gate[1]);
            close(ready[0]);
            close(ready[1]);
            echo_server(lfd);
        }
        close(lfd);
    }
    for (i = 0; i < opt.clients; i++) {
        struct client_result *r = &res[i];

        r->sample_every = 1;
        if (opt.ops > MAX_SAMPLES)
            r->sample_every = opt.ops / MAX_SAMPLES + 1;
        pids[i] = fork();
        if (pids[i] < 0) {
            perror("shmb-bench: fork");
            return 1;
        }
        if (pids[i] == 0) {
            int rc;

            close(gate[1]);
            close(ready[0]);
            ready_fd = ready[1];
            switch (opt.mode) {
            case M_REDIS: rc = run_redis(i, r, gate[0]); break;
            case M_MEMCPY: rc = run_memcpy(r, gate[0]); break;
            case M_RTT: rc = run_rtt(r, gate[0], echo_path); break;
            case M_PUTREAD:
            case M_PUTREAD_NOWAIT:
            case M_READ: rc = run_reads(i, r, gate[0]); break;
            default: rc = run_shmb(i, r, gate[0]); break;
            }
            _exit(rc == 0 ? 0 : 1);
        }
    }
    close(gate[0]);
    close(ready[1]);
    /* Every client says ready once it has connected and prepared (a
     * MAP_POPULATE of a big segment takes a while); a client that failed
     * closes its end without a byte. Then open the gate. */
    for (i = 0; i < opt.clients && read(ready[0], &byte, 1) == 1; i++)
        ;
    close(ready[0]);
    close(gate[1]);
    for (i = 0; i < opt.clients; i++) {
        int st;

        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || res[i].failed) {
            fprintf(stderr, "shmb-bench: client %d failed: %s\n", i,
                    res[i].error[0] ? res[i].error : "crashed");
            failed = 1;
        }
    }
    if (echo > 0) {
        kill(echo, SIGTERM);
        waitpid(echo, NULL, 0);
        unlink(echo_path);
    }
    if (!failed)
        report(res, opt.clients);
    munmap(res, bytes);
    return failed;
}

/* ---- scale: a million live objects --------------------------------------- */

/* A field of /proc/pid/status in kB, or -1. */
static long proc_status_kb(long pid, const char *field)
{
    char path[64], line[256];
    size_t flen = strlen(field);
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, flen) == 0 && line[flen] == ':')
            v = strtol(line + flen + 1, NULL, 10);
    fclose(f);
    return v;
}

/* Put objects [from, to) of 64 bytes (opt.size) in batches. */
static int scale_fill(shmb_t *c, uint64_t from, uint64_t to)
{
    static char keys[256][32];
    const char *kp[256];
    const void *data[256];
    size_t sizes[256];
    unsigned char val[64] = {0};
    size_t n, k;

    while (from < to) {
        n = to - from < 256 ? (size_t)(to - from) : 256;
        for (k = 0; k < n; k++) {
            snprintf(keys[k], sizeof(keys[k]), "s%08llu", (unsigned long long)(from + k));
            kp[k] = keys[k];
            data[k] = val;
            sizes[k] = opt.size > sizeof(val) ? sizeof(val) : opt.size;
        }
        if (shmb_put_many(c, n, kp, data, sizes, 0, NULL) != 0) {
            fprintf(stderr, "shmb-bench: scale fill at %llu: %s\n", (unsigned long long)from,
                    shmb_errmsg(c));
            return -1;
        }
        from += n;
    }
    return 0;
}

/* Mean ns of get + read + release of random keys among the first n. */
static double scale_measure(shmb_t *c, uint64_t n, double seconds)
{
    uint64_t t0 = now_ns(), ops = 0, x = 88172645463325252ull;
    char key[32];

    while (now_ns() - t0 < (uint64_t)(seconds * 1e9)) {
        const void *p;
        size_t len;
        int j;

        for (j = 0; j < 64; j++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            snprintf(key, sizeof(key), "s%08llu", (unsigned long long)(x % n));
            if (shmb_get(c, key, &p, &len) != 0 || shmb_release(c, key) != 0) {
                fprintf(stderr, "shmb-bench: scale get %s: %s\n", key, shmb_errmsg(c));
                return -1;
            }
            sink += sum_bytes(p, len);
        }
        ops += 64;
    }
    return (double)(now_ns() - t0) / (double)ops;
}

/* Per-op cost with 1,000 and with opt.objects live objects, and the daemon's
 * memory per object. Needs a fresh daemon with room for all of them. */
static int run_scale(void)
{
    shmb_t *c = shmb_new();
    shmb_stats_t st;
    long rss0, rss1, anon0, anon1;
    double c1k, cbig, fill_s;
    uint64_t t;

    if (opt.size > 64)
        opt.size = 64;
    if (c == NULL || shmb_connect(c, opt.socket, "shmb-bench-scale") != 0 ||
        shmb_stats(c, &st) != 0) {
        fprintf(stderr, "shmb-bench: %s\n", c ? shmb_errmsg(c) : "ENOMEM");
        return 1;
    }
    if (st.objects != 0)
        fprintf(stderr, "shmb-bench: warning: the daemon already holds %llu objects\n",
                (unsigned long long)st.objects);
    if (scale_fill(c, 0, 1000) != 0)
        return 1;
    c1k = scale_measure(c, 1000, opt.seconds);
    rss0 = proc_status_kb((long)st.pid, "VmRSS");
    anon0 = proc_status_kb((long)st.pid, "RssAnon");
    t = now_ns();
    if (scale_fill(c, 1000, opt.objects) != 0)
        return 1;
    fill_s = (double)(now_ns() - t) / 1e9;
    rss1 = proc_status_kb((long)st.pid, "VmRSS");
    anon1 = proc_status_kb((long)st.pid, "RssAnon");
    cbig = scale_measure(c, opt.objects, opt.seconds);
    if (c1k < 0 || cbig < 0 || shmb_stats(c, &st) != 0)
        return 1;
    if (st.objects != opt.objects || st.evictions != 0)
        fprintf(stderr, "shmb-bench: warning: %llu objects, %llu evictions (segment too "
                "small?)\n", (unsigned long long)st.objects,
                (unsigned long long)st.evictions);
    {
        double per_rss = (double)(rss1 - rss0) * 1024.0 / (double)(opt.objects - 1000);
        double per_anon = (double)(anon1 - anon0) * 1024.0 / (double)(opt.objects - 1000);

        printf("scale: get+release %.2f us with 1000 objects, %.2f us with %llu (x%.2f); "
               "daemon VmRSS +%.0f B/object (RssAnon +%.0f B/object, the rest is the "
               "segment's own pages); fill %.0f objects/s\n",
               c1k / 1000, cbig / 1000, (unsigned long long)opt.objects, cbig / c1k, per_rss,
               per_anon, (double)(opt.objects - 1000) / fill_s);
        printf("{\"mode\":\"scale\",\"label\":\"%s\",\"objects\":%llu,\"payload\":%zu,"
               "\"ns_per_op_1k\":%.1f,\"ns_per_op_big\":%.1f,\"ratio\":%.3f,"
               "\"vmrss_kb_before\":%ld,\"vmrss_kb_after\":%ld,\"rss_bytes_per_object\":%.1f,"
               "\"anon_bytes_per_object\":%.1f,\"fill_objects_per_s\":%.0f}\n",
               opt.label, (unsigned long long)opt.objects, opt.size, c1k, cbig, cbig / c1k,
               rss0, rss1, per_rss, per_anon, (double)(opt.objects - 1000) / fill_s);
    }
    shmb_close(c);
    return 0;
}

/* ---- ready: how long a daemon takes to answer hello ------------------------ */

/* Poll until a hello on opt.socket succeeds; print CLOCK_REALTIME in ns. The
 * script takes the time before exec'ing the daemon, so the difference is
 * exec to ready. */
static int run_ready(void)
{
    uint64_t deadline = now_ns() + (uint64_t)(opt.seconds * 1e9);
    struct timespec ts;

    for (;;) {
        shmb_t *c = shmb_new();

        if (c == NULL)
            return 1;
        shmb_set_populate(c, 0);
        if (shmb_connect(c, opt.socket, "shmb-bench-ready") == 0) {
            clock_gettime(CLOCK_REALTIME, &ts);
            printf("%llu\n", (unsigned long long)ts.tv_sec * 1000000000ull +
                                 (unsigned long long)ts.tv_nsec);
            shmb_close(c);
            return 0;
        }
        shmb_close(c);
        if (now_ns() > deadline) {
            fprintf(stderr, "shmb-bench: no daemon ready at %s\n", opt.socket);
            return 1;
        }
        usleep(500);
    }
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: shmb-bench --mode MODE [OPTION]...\n"
            "Measure a running shmbrokerd, or a reference, and print one table line and\n"
            "one JSON line (ops/s, GB/s, p50/p99/p99.9 latency in microseconds).\n\n"
            "  --mode MODE       put, get, putget (plain calls); batch-put, batch-get,\n"
            "                    batch-putget (put_many/get_many/release_many); putread\n"
            "                    (shmb_put through the arena + shmb_read); putread-nowait\n"
            "                    (shmb_put_nowait + shmb_read: no round trip waited for,\n"
            "                    shmb_sync at the end); read (shmb_read\n"
            "                    of one hot key per client, no system call); redis\n"
            "                    (SET+GET over --redis-socket); rtt (bare Unix-socket\n"
            "                    round trip to an echo server it forks); memcpy; scale\n"
            "                    (1,000 vs --objects live objects); ready (wait for a\n"
            "                    daemon to answer hello, print the realtime in ns)\n"
            "  --socket PATH     the daemon's socket (default $SHMBROKER_SOCKET)\n"
            "  --redis-socket PATH  redis-server's unix socket (mode redis)\n"
            "  --size BYTES      object size (K, M, G suffixes; default 4K)\n"
            "  --clients N       client processes (default 1, at most %d)\n"
            "  --ops N           operations per client (default: run for --seconds)\n"
            "  --seconds S       duration (default 2; scale: per measurement; ready:\n"
            "                    timeout)\n"
            "  --batch N         objects per batch call (default 16, at most %d)\n"
            "  --objects N       live objects in scale mode (default 1000000)\n"
            "  --release-nowait  plain get releases without waiting for the answer\n"
            "  --lap SECONDS     the untimed first lap of a timed run, reported apart\n"
            "                    (default a tenth of --seconds, at most 0.5; 0: none)\n"
            "  --memcpy-span BYTES  memcpy rotates over this many bytes (default 256M,\n"
            "                    cold caches like the ring; 0: cache-hot)\n"
            "  --label TEXT      carried into the output\n\n"
            "One operation is one object: a put, a get, or a put and a get (putget,\n"
            "redis); its latency is the time per object (a batch's time / its size).\n",
            MAX_CLIENTS, MAX_BATCH);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"mode", required_argument, NULL, 'm'},
        {"socket", required_argument, NULL, 's'},
        {"redis-socket", required_argument, NULL, 'r'},
        {"size", required_argument, NULL, 'z'},
        {"clients", required_argument, NULL, 'c'},
        {"ops", required_argument, NULL, 'n'},
        {"seconds", required_argument, NULL, 't'},
        {"batch", required_argument, NULL, 'b'},
        {"objects", required_argument, NULL, 'o'},
        {"release-nowait", no_argument, NULL, 'w'},
        {"label", required_argument, NULL, 'l'},
        {"memcpy-span", required_argument, NULL, 'p'},
        {"lap", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    size_t i;

    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'm':
            for (i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]); i++)
                if (strcmp(optarg, mode_names[i]) == 0)
                    break;
            if (i == sizeof(mode_names) / sizeof(mode_names[0])) {
                fprintf(stderr, "shmb-bench: unknown mode '%s'\n", optarg);
                return 2;
            }
            opt.mode = (enum mode)i;
            break;
        case 's': opt.socket = optarg; break;
        case 'r': opt.redis_socket = optarg; break;
        case 'z':
            if (parse_size(optarg, &opt.size) != 0 || opt.size == 0) {
                fprintf(stderr, "shmb-bench: bad --size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'c': opt.clients = atoi(optarg); break;
        case 'n': opt.ops = strtoull(optarg, NULL, 10); break;
        case 't': opt.seconds = atof(optarg); break;
        case 'b': opt.batch = atoi(optarg); break;
        case 'o': opt.objects = strtoull(optarg, NULL, 10); break;
        case 'w': opt.release_nowait = 1; break;
        case 'l': opt.label = optarg; break;
        case 'p':
            if (parse_size(optarg, &opt.memcpy_span) != 0) {
                fprintf(stderr, "shmb-bench: bad --memcpy-span '%s'\n", optarg);
                return 2;
            }
            break;
        case 'L': opt.lap = atof(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (opt.clients < 1 || opt.clients > MAX_CLIENTS || opt.batch < 1 ||
        opt.batch > MAX_BATCH || opt.seconds <= 0 || opt.objects < 2000) {
        fprintf(stderr, "shmb-bench: --clients 1..%d, --batch 1..%d, --seconds > 0, "
                "--objects >= 2000\n", MAX_CLIENTS, MAX_BATCH);
        return 2;
    }
    if (opt.lap < 0)
        opt.lap = opt.seconds / 10 > 0.5 ? 0.5 : opt.seconds / 10;
    if (opt.mode == M_REDIS && opt.redis_socket == NULL) {
        fprintf(stderr, "shmb-bench: mode redis needs --redis-socket\n");
        return 2;
    }
    if (opt.socket == NULL)
        opt.socket = getenv("SHMBROKER_SOCKET");
    if (opt.socket == NULL && opt.mode != M_REDIS && opt.mode != M_RTT &&
        opt.mode != M_MEMCPY) {
        fprintf(stderr, "shmb-bench: --socket (or $SHMBROKER_SOCKET) is needed\n");
        return 2;
    }
    if (opt.mode == M_RTT)
        opt.size = RTT_MSG; /* what each round trip carries */
    if (opt.mode == M_SCALE)
        return run_scale();
    if (opt.mode == M_READY)
        return run_ready();
    return run_clients();
}
