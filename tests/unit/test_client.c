// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests of the client library (client/) against a fake daemon: a
 * thread listening on a temporary socket that answers each request line
 * with a scripted reply, and passes a memfd holding a segment header as the
 * segment's descriptor. What the library makes of what a daemon says (the
 * reports field by field, a reply out of step, a reply in pieces, a
 * descriptor too many, a queue's descriptor missing or unlike what its
 * reply says) is checked without a real daemon.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../client/shmbroker.h"
#include "../../proto/layout.h"
#include "../../proto/queue.h"
#include "../../proto/sock.h"

#define SEG_SIZE 8192

/* The hello reply the fake sends; "@ID" stands for the request's id. */
#define HELLO_REPLY                                                                      \
    "{\"ok\":true,\"segment\":\"fake\",\"size\":8192,\"data_offset\":4096,"               \
    "\"data_size\":4096,\"max_object_size\":4096,\"alignment\":64,\"version\":1,"         \
    "\"id\":@ID}"

/* One request the fake expects after hello, and what it answers. */
struct step {
    const char *op;    /* the request's "op" */
    const char *reply; /* the reply line, without '\n'; "@ID" is the request's id */
    int id_delta;      /* added to the id the reply carries: not 0 is out of step */
    bool split;        /* send the reply in three pieces, a pause between */
};

struct fake {
    char dir[64], path[108];
    int listen_fd, seg_fd;
    int extra_fd;      /* >= 0: a second descriptor, sent with the hello reply's tail */
    const char *hello; /* the hello reply, HELLO_REPLY unless set before the thread runs */
    int dials;         /* connections to serve, one after the other (reconnects) */
    const struct step *steps; /* played on the last connection */
    size_t nsteps;
    int step_fd;       /* >= 0: passed with the reply of step step_fd_at */
    size_t step_fd_at;
    pthread_t thread;
    char error[256];   /* what went wrong in the thread, "" when nothing */
    char last[1024];   /* the last request line received */
    char hellos[2][1024]; /* the hello request line of each connection */
};

/* A memfd of SEG_SIZE bytes starting with a valid segment header. */
static int segment_memfd(void)
{
    struct shmb_segment_header hdr;
    int fd = memfd_create("fake-segment", MFD_CLOEXEC);

    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, SEG_SIZE), 0);
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = SHMB_SEGMENT_MAGIC;
    hdr.version = SHMB_LAYOUT_VERSION;
    hdr.header_size = SHMB_HEADER_PAGE;
    hdr.total_size = SEG_SIZE;
    hdr.data_offset = SHMB_HEADER_PAGE;
    hdr.data_size = SEG_SIZE - SHMB_HEADER_PAGE;
    assert_int_equal(pwrite(fd, &hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
    return fd;
}

static void fake_fail(struct fake *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fake_fail(struct fake *f, const char *fmt, ...)
{
    va_list ap;

    if (f->error[0] != '\0')
        return;
    va_start(ap, fmt);
    vsnprintf(f->error, sizeof(f->error), fmt, ap);
    va_end(ap);
}

/* Read one line from fd into buf (without its '\n'); false at EOF. */
static bool fake_read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;

    while (n + 1 < cap) {
        char ch;
        ssize_t r = read(fd, &ch, 1);

        if (r <= 0)
            return false;
        if (ch == '\n')
            break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return true;
}

/* The reply template with "@ID" replaced by id, and a '\n'. */
static void fake_fill(const char *tmpl, long long id, char *out, size_t cap)
{
    const char *at = strstr(tmpl, "@ID");

    if (at == NULL)
        snprintf(out, cap, "%s\n", tmpl);
    else
        snprintf(out, cap, "%.*s%lld%s\n", (int)(at - tmpl), tmpl, id, at + 3);
}

static void fake_write(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, s, len);

        if (n <= 0)
            return;
        s += n;
        len -= (size_t)n;
    }
}

/* Read a request, check its op, return its id (-1 on failure or EOF). */
static long long fake_request(struct fake *f, int fd, const char *op)
{
    json_t *req;
    long long id;

    if (!fake_read_line(fd, f->last, sizeof(f->last)))
        return -1;
    req = json_loads(f->last, 0, NULL);
    if (req == NULL || json_string_value(json_object_get(req, "op")) == NULL ||
        strcmp(json_string_value(json_object_get(req, "op")), op) != 0 ||
        !json_is_integer(json_object_get(req, "id"))) {
        fake_fail(f, "expected a request with op %s and an id, got %s", op, f->last);
        json_decref(req);
        return -1;
    }
    id = json_integer_value(json_object_get(req, "id"));
    json_decref(req);
    return id;
}

/* One connection of the fake daemon: answer hello with the segment's
 * descriptor (and the extra one), then each step when last, then wait for
 * EOF. */
static void fake_serve(struct fake *f, int fd, int dial, bool last)
{
    char line[8192];
    long long id;
    size_t i, len, half;

    if ((id = fake_request(f, fd, "hello")) < 0)
        goto out;
    snprintf(f->hellos[dial], sizeof(f->hellos[dial]), "%s", f->last);
    fake_fill(f->hello != NULL ? f->hello : HELLO_REPLY, id, line, sizeof(line));
    len = strlen(line);
    half = f->extra_fd >= 0 ? len / 2 : len;
    if (shmb_sock_send_fd(fd, line, half, f->seg_fd) != (ssize_t)half) {
        fake_fail(f, "cannot send the hello reply with its descriptor");
        goto out;
    }
    if (half < len) {
        usleep(20000); /* so that the library reads the two parts apart */
        if (shmb_sock_send_fd(fd, line + half, len - half, f->extra_fd) !=
            (ssize_t)(len - half)) {
            fake_fail(f, "cannot send the extra descriptor");
            goto out;
        }
    }
    for (i = 0; last && i < f->nsteps; i++) {
        const struct step *s = &f->steps[i];

        if ((id = fake_request(f, fd, s->op)) < 0)
            goto out;
        fake_fill(s->reply, id + s->id_delta, line, sizeof(line));
        len = strlen(line);
        if (f->step_fd >= 0 && i == f->step_fd_at) {
            if (shmb_sock_send_fd(fd, line, len, f->step_fd) != (ssize_t)len)
                fake_fail(f, "cannot send step %zu's reply with its descriptor", i);
            continue;
        }
        if (!s->split) {
            fake_write(fd, line, len);
            continue;
        }
        fake_write(fd, line, 1);
        usleep(20000);
        fake_write(fd, line + 1, len / 2);
        usleep(20000);
        fake_write(fd, line + 1 + len / 2, len - 1 - len / 2);
    }
    /* Until the library closes its end. */
    while (fake_read_line(fd, line, sizeof(line)))
        ;
out:
    close(fd);
}

/* The fake daemon: serve f->dials connections, one after the other. */
static void *fake_run(void *arg)
{
    struct fake *f = arg;
    int dial;

    for (dial = 0; dial < f->dials; dial++) {
        int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);

        if (fd < 0) {
            fake_fail(f, "accept: %s", strerror(errno));
            return NULL;
        }
        fake_serve(f, fd, dial, dial == f->dials - 1);
    }
    return NULL;
}

/* A fake daemon, not started yet (fake_go), that answers hello with hello
 * (NULL: HELLO_REPLY), dials times, and plays steps[0..n) on the last
 * connection; extra: also pass a second descriptor with the hello reply. */
static struct fake *fake_new(const char *hello, int dials, const struct step *steps,
                             size_t n, bool extra)
{
    struct fake *f = calloc(1, sizeof(*f));
    struct sockaddr_un sun;

    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/shmb-test-client-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/sock", f->dir);
    assert_int_equal(shmb_sock_address(&sun, f->path), 0);
    f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->listen_fd >= 0);
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    assert_int_equal(listen(f->listen_fd, 4), 0);
    f->seg_fd = segment_memfd();
    f->extra_fd = extra ? memfd_create("extra", MFD_CLOEXEC) : -1;
    f->hello = hello;
    f->dials = dials;
    assert_true(dials >= 1 && dials <= (int)(sizeof(f->hellos) / sizeof(f->hellos[0])));
    f->steps = steps;
    f->nsteps = n;
    f->step_fd = -1;
    return f;
}

/* Start the fake daemon's thread. */
static struct fake *fake_go(struct fake *f)
{
    assert_int_equal(pthread_create(&f->thread, NULL, fake_run, f), 0);
    return f;
}

/* Start a fake daemon: fake_new's, at once. */
static struct fake *fake_start_ex(const char *hello, int dials, const struct step *steps,
                                  size_t n, bool extra)
{
    return fake_go(fake_new(hello, dials, steps, n, extra));
}

/* Start a fake daemon that will play steps[0..n); extra: also pass a second
 * descriptor with the hello reply. */
static struct fake *fake_start(const struct step *steps, size_t n, bool extra)
{
    return fake_start_ex(NULL, 1, steps, n, extra);
}

/* Join the fake (the client must have closed) and fail on its error. */
static void fake_stop(struct fake *f)
{
    assert_int_equal(pthread_join(f->thread, NULL), 0);
    close(f->listen_fd);
    close(f->seg_fd);
    if (f->extra_fd >= 0)
        close(f->extra_fd);
    if (f->step_fd >= 0)
        close(f->step_fd);
    unlink(f->path);
    rmdir(f->dir);
    if (f->error[0] != '\0')
        fail_msg("fake daemon: %s", f->error);
    free(f);
}

/* A handle connected to f, to pool when not NULL (shmb_set_pool). */
static shmb_t *connect_pool(struct fake *f, const char *pool)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    shmb_set_populate(c, 0);
    if (pool != NULL)
        shmb_set_pool(c, pool);
    if (shmb_connect(c, f->path, "unit") != 0)
        fail_msg("shmb_connect: %s: %s", shmb_errname(c), shmb_errmsg(c));
    return c;
}

static shmb_t *connect_to(struct fake *f)
{
    return connect_pool(f, NULL);
}

/* How many descriptors this process has open. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* opendir's own */
}

/* A stats reply with a different figure in every field. */
#define STATS_REPLY                                                                      \
    "{\"ok\":true,\"segment\":\"seg-name\",\"size\":101,\"data_size\":102,\"used\":103,"  \
    "\"free\":104,\"objects\":105,\"pending\":106,\"pinned\":107,\"clients\":108,"        \
    "\"max_object_size\":109,\"uptime_s\":110,\"pid\":111,\"version\":\"9.8.7\","         \
    "\"shm_dir\":\"/dev/shm\",\"shm_dir_free\":112,\"blocker\":{\"key\":\"blk\","         \
    "\"pins\":113,\"readers\":114,\"state\":\"committed\"},\"counters\":{\"allocs\":115,"  \
    "\"commits\":116,\"gets\":117,\"evictions\":118,\"enospc\":119,"                      \
    "\"expired_allocs\":120,\"lease_expiries\":121,\"noreply_errors\":122,"              \
    "\"fast_reads\":123},\"id\":@ID}"

/* Proves that shmb_stats fills every field of shmb_stats_t from the reply,
 * the three counters the first release lacked included. */
static void test_stats_every_field(void **state)
{
    static const struct step steps[] = {{"stats", STATS_REPLY, 0, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    shmb_stats_t st;

    (void)state;
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_string_equal(st.segment, "seg-name");
    assert_int_equal(st.size, 101);
    assert_int_equal(st.data_size, 102);
    assert_int_equal(st.used, 103);
    assert_int_equal(st.free, 104);
    assert_int_equal(st.objects, 105);
    assert_int_equal(st.pending, 106);
    assert_int_equal(st.pinned, 107);
    assert_int_equal(st.clients, 108);
    assert_int_equal(st.max_object_size, 109);
    assert_int_equal(st.uptime_s, 110);
    assert_int_equal(st.pid, 111);
    assert_string_equal(st.version, "9.8.7");
    assert_string_equal(st.shm_dir, "/dev/shm");
    assert_int_equal(st.shm_dir_free, 112);
    assert_int_equal(st.has_blocker, 1);
    assert_string_equal(st.blocker_key, "blk");
    assert_int_equal(st.blocker_pins, 113);
    assert_int_equal(st.blocker_readers, 114);
    assert_string_equal(st.blocker_state, "committed");
    assert_int_equal(st.allocs, 115);
    assert_int_equal(st.commits, 116);
    assert_int_equal(st.gets, 117);
    assert_int_equal(st.evictions, 118);
    assert_int_equal(st.enospc, 119);
    assert_int_equal(st.expired_allocs, 120);
    assert_int_equal(st.lease_expiries, 121);
    assert_int_equal(st.noreply_errors, 122);
    assert_int_equal(st.fast_reads, 123);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that the first release's entry point, which a program built
 * against the old header calls with the old, smaller struct, writes nothing
 * past that struct, and that a size smaller than it is refused unsent. */
static void test_stats_old_struct(void **state)
{
    static const struct step steps[] = {{"stats", STATS_REPLY, 0, false},
                                        {"stats", STATS_REPLY, 0, false}};
    struct fake *f = fake_start(steps, 2, false);
    shmb_t *c = connect_to(f);
    size_t old = offsetof(shmb_stats_t, expired_allocs);
    unsigned char buf[sizeof(shmb_stats_t)];
    size_t i;

    (void)state;
    assert_int_equal(shmb_stats_sized(c, (shmb_stats_t *)buf, old - 1), -EINVAL);
    memset(buf, 0xa5, sizeof(buf));
    assert_int_equal((shmb_stats)(c, (shmb_stats_t *)buf), 0);
    assert_int_equal(((shmb_stats_t *)buf)->enospc, 119);
    for (i = old; i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0xa5);
    /* A program built before pools: its struct ends before pool. */
    memset(buf, 0xa5, sizeof(buf));
    assert_int_equal(shmb_stats_sized(c, (shmb_stats_t *)buf, offsetof(shmb_stats_t, pool)), 0);
    assert_int_equal(((shmb_stats_t *)buf)->noreply_errors, 122);
    for (i = offsetof(shmb_stats_t, pool); i < sizeof(buf); i++)
        assert_int_equal(buf[i], 0xa5);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_stats_json hands over the reply as the daemon sent it,
 * without the id the library added. */
static void test_stats_json(void **state)
{
    static const struct step steps[] = {
        {"stats", "{\"ok\":true,\"zeta\":1,\"alpha\":{\"b\":2,\"a\":\"x\"},\"id\":@ID}", 0,
         false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    char *json = NULL;

    (void)state;
    assert_int_equal(shmb_stats_json(c, &json), 0);
    assert_string_equal(json, "{\"ok\":true,\"zeta\":1,\"alpha\":{\"b\":2,\"a\":\"x\"}}");
    free(json);
    shmb_close(c);
    fake_stop(f);
}

/* The hello reply of a daemon with pools: the pool's name and backing. */
#define HELLO_POOL_REPLY                                                                 \
    "{\"ok\":true,\"segment\":\"fake.frames\",\"size\":8192,\"data_offset\":4096,"        \
    "\"data_size\":4096,\"max_object_size\":4096,\"alignment\":64,\"version\":1,"         \
    "\"pool\":\"frames\",\"backing\":\"memfd\",\"id\":@ID}"

/* The "pool" a hello request line names, as a string in buf ("(none)" when
 * it names none). */
static const char *hello_pool(const char *line, char *buf, size_t len)
{
    json_t *req = json_loads(line, 0, NULL), *pool;

    assert_non_null(req);
    pool = json_object_get(req, "pool");
    if (pool == NULL)
        snprintf(buf, len, "(none)");
    else
        snprintf(buf, len, "%s", json_is_string(pool) ? json_string_value(pool) : "(not a string)");
    json_decref(req);
    return buf;
}

/* Proves that shmb_set_pool makes hello name the pool, and that
 * shmb_info gives the pool and backing the daemon answered. */
static void test_pool_hello(void **state)
{
    struct fake *f = fake_start_ex(HELLO_POOL_REPLY, 1, NULL, 0, false);
    shmb_t *c = connect_pool(f, "frames");
    char buf[64];

    (void)state;
    assert_string_equal(hello_pool(f->hellos[0], buf, sizeof(buf)), "frames");
    assert_string_equal(shmb_info(c)->pool, "frames");
    assert_string_equal(shmb_info(c)->backing, "memfd");
    assert_string_equal(shmb_info(c)->segment, "fake.frames");
    shmb_close(c);
    fake_stop(f);
}

/* Proves that without shmb_set_pool (or with "" or NULL after a name) hello
 * names no pool, so that a daemon without pools takes it as before, and
 * that info's pool and backing are "" when the daemon says neither. */
static void test_pool_default(void **state)
{
    struct fake *f = fake_start_ex(NULL, 2, NULL, 0, false);
    shmb_t *c = connect_pool(f, NULL);
    char buf[64];

    (void)state;
    assert_string_equal(hello_pool(f->hellos[0], buf, sizeof(buf)), "(none)");
    assert_string_equal(shmb_info(c)->pool, "");
    assert_string_equal(shmb_info(c)->backing, "");
    shmb_set_pool(c, "x");
    shmb_set_pool(c, NULL);
    assert_int_equal(shmb_reconnect(c), 0);
    assert_string_equal(hello_pool(f->hellos[1], buf, sizeof(buf)), "(none)");
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_reconnect names the same pool again: a reconnected
 * handle must not land in the default pool, nor in one shmb_set_pool named
 * after the connect (a 33-byte name then does not make reconnect fail). */
static void test_pool_reconnect(void **state)
{
    struct fake *f = fake_start_ex(HELLO_POOL_REPLY, 2, NULL, 0, false);
    shmb_t *c = connect_pool(f, "frames");
    char buf[64];

    (void)state;
    shmb_set_pool(c, "other");
    shmb_set_pool(c, "123456789012345678901234567890123");
    assert_int_equal(shmb_reconnect(c), 0);
    assert_string_equal(hello_pool(f->hellos[0], buf, sizeof(buf)), "frames");
    assert_string_equal(hello_pool(f->hellos[1], buf, sizeof(buf)), "frames");
    assert_string_equal(shmb_info(c)->pool, "frames");
    shmb_close(c);
    fake_stop(f);
}

/* Proves that a pool name of 33 bytes is refused by shmb_connect with
 * -EINVAL before anything is dialled (the socket does not even exist, which
 * would be -ENOENT), and that 32 bytes go out whole. */
static void test_pool_name_length(void **state)
{
    static const char name32[] = "abcdefghijklmnopqrstuvwxyz012345";
    char name33[sizeof(name32) + 1], buf[64];
    struct fake *f;
    shmb_t *c = shmb_new();

    (void)state;
    assert_int_equal(strlen(name32), 32);
    snprintf(name33, sizeof(name33), "%s6", name32);
    shmb_set_pool(c, name33);
    assert_int_equal(shmb_connect(c, "/nonexistent/shmb-unit.sock", "unit"), -EINVAL);
    assert_int_equal(shmb_errcode(c), -EINVAL);
    assert_non_null(strstr(shmb_errmsg(c), "32 bytes"));
    shmb_close(c);

    f = fake_start_ex(NULL, 1, NULL, 0, false);
    c = connect_pool(f, name32);
    assert_string_equal(hello_pool(f->hellos[0], buf, sizeof(buf)), name32);
    shmb_close(c);
    fake_stop(f);
}

/* A stats reply of a daemon with two pools: the top level is pool "frames"
 * (the connection's), "clients" all connections; each pool's object has
 * every field, different figures, its own blocker (or none) and counters. */
#define STATS_POOLS_REPLY                                                                 \
    "{\"ok\":true,\"segment\":\"d.frames\",\"size\":201,\"data_size\":202,\"used\":203,"  \
    "\"free\":204,\"objects\":205,\"pending\":206,\"pinned\":207,\"clients\":9,"          \
    "\"max_object_size\":209,\"uptime_s\":210,\"pid\":211,\"version\":\"9.8.7\","         \
    "\"shm_dir\":\"/dev/shm\",\"shm_dir_free\":212,\"blocker\":null,"                     \
    "\"counters\":{\"allocs\":215,\"commits\":216,\"gets\":217,\"evictions\":218,"        \
    "\"enospc\":219,\"expired_allocs\":220,\"lease_expiries\":221,\"noreply_errors\":222," \
    "\"fast_reads\":223},"                                                            \
    "\"pool\":\"frames\",\"pools\":["                                                     \
    "{\"segment\":\"d.meta\",\"size\":301,\"data_size\":302,\"used\":303,"                \
    "\"free\":304,\"objects\":305,\"pending\":306,\"pinned\":307,\"clients\":3,"          \
    "\"max_object_size\":309,\"uptime_s\":210,\"pid\":211,\"version\":\"9.8.7\","         \
    "\"shm_dir\":\"/dev/shm\",\"shm_dir_free\":312,\"blocker\":{\"key\":\"held\","        \
    "\"pins\":313,\"readers\":314,\"state\":\"committed\"},"                              \
    "\"counters\":{\"allocs\":315,\"commits\":316,\"gets\":317,\"evictions\":318,"        \
    "\"enospc\":319,\"expired_allocs\":320,\"lease_expiries\":321,\"noreply_errors\":322," \
    "\"fast_reads\":323},"                                                            \
    "\"pool\":\"meta\",\"backing\":\"shm\",\"group\":null},"                              \
    "{\"segment\":\"d.frames\",\"size\":201,\"data_size\":202,\"used\":203,"              \
    "\"free\":204,\"objects\":205,\"pending\":206,\"pinned\":207,\"clients\":6,"          \
    "\"max_object_size\":209,\"uptime_s\":210,\"pid\":211,\"version\":\"9.8.7\","         \
    "\"shm_dir\":\"\",\"shm_dir_free\":412,\"blocker\":null,"                             \
    "\"counters\":{\"allocs\":215,\"commits\":216,\"gets\":217,\"evictions\":218,"        \
    "\"enospc\":219,\"expired_allocs\":220,\"lease_expiries\":221,\"noreply_errors\":222," \
    "\"fast_reads\":223},"                                                            \
    "\"pool\":\"frames\",\"backing\":\"memfd\",\"group\":\"video\"}],\"id\":@ID}"

/* Proves that shmb_stats_pools reads every pool of "pools" in order with
 * every field (blocker, counters, pool, backing, group; null group: ""),
 * and that shmb_stats reads the connection's pool with its backing and
 * group found in "pools". */
static void test_stats_pools(void **state)
{
    static const struct step steps[] = {{"stats", STATS_POOLS_REPLY, 0, false},
                                        {"stats", STATS_POOLS_REPLY, 0, false}};
    struct fake *f = fake_start(steps, 2, false);
    shmb_t *c = connect_to(f);
    shmb_stats_t *p = NULL, st;
    size_t n = 0;

    (void)state;
    assert_int_equal(shmb_stats_pools(c, &p, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(p[0].pool, "meta");
    assert_string_equal(p[0].backing, "shm");
    assert_string_equal(p[0].group, "");
    assert_string_equal(p[0].segment, "d.meta");
    assert_int_equal(p[0].size, 301);
    assert_int_equal(p[0].data_size, 302);
    assert_int_equal(p[0].used, 303);
    assert_int_equal(p[0].free, 304);
    assert_int_equal(p[0].objects, 305);
    assert_int_equal(p[0].pending, 306);
    assert_int_equal(p[0].pinned, 307);
    assert_int_equal(p[0].clients, 3);
    assert_int_equal(p[0].max_object_size, 309);
    assert_int_equal(p[0].uptime_s, 210);
    assert_int_equal(p[0].pid, 211);
    assert_string_equal(p[0].version, "9.8.7");
    assert_string_equal(p[0].shm_dir, "/dev/shm");
    assert_int_equal(p[0].shm_dir_free, 312);
    assert_int_equal(p[0].has_blocker, 1);
    assert_string_equal(p[0].blocker_key, "held");
    assert_int_equal(p[0].blocker_pins, 313);
    assert_int_equal(p[0].blocker_readers, 314);
    assert_string_equal(p[0].blocker_state, "committed");
    assert_int_equal(p[0].allocs, 315);
    assert_int_equal(p[0].commits, 316);
    assert_int_equal(p[0].gets, 317);
    assert_int_equal(p[0].evictions, 318);
    assert_int_equal(p[0].enospc, 319);
    assert_int_equal(p[0].expired_allocs, 320);
    assert_int_equal(p[0].lease_expiries, 321);
    assert_int_equal(p[0].noreply_errors, 322);
    assert_string_equal(p[1].pool, "frames");
    assert_string_equal(p[1].backing, "memfd");
    assert_string_equal(p[1].group, "video");
    assert_string_equal(p[1].shm_dir, "");
    assert_int_equal(p[1].shm_dir_free, 412);
    assert_int_equal(p[1].clients, 6);
    assert_int_equal(p[1].has_blocker, 0);
    assert_int_equal(p[1].used, 203);
    assert_int_equal(p[1].enospc, 219);
    shmb_stats_pools_free(p);

    assert_int_equal(shmb_stats(c, &st), 0);
    assert_string_equal(st.pool, "frames");
    assert_string_equal(st.backing, "memfd");
    assert_string_equal(st.group, "video");
    assert_int_equal(st.clients, 9);
    assert_int_equal(st.used, 203);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_stats_pools of a daemon without pools gives its one
 * segment as one entry, pool "", and that a "pools" that is not an array
 * of objects is -EPROTO with nothing handed out. */
static void test_stats_pools_fallback(void **state)
{
    static const struct step steps[] = {
        {"stats", STATS_REPLY, 0, false},
        {"stats", "{\"ok\":true,\"pools\":{},\"id\":@ID}", 0, false},
        {"stats", "{\"ok\":true,\"pools\":[1],\"id\":@ID}", 0, false}};
    struct fake *f = fake_start(steps, 3, false);
    shmb_t *c = connect_to(f);
    shmb_stats_t *p = NULL;
    size_t n = 0;

    (void)state;
    assert_int_equal(shmb_stats_pools(c, &p, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(p[0].pool, "");
    assert_string_equal(p[0].segment, "seg-name");
    assert_int_equal(p[0].used, 103);
    assert_int_equal(p[0].noreply_errors, 122);
    shmb_stats_pools_free(p);
    p = (shmb_stats_t *)1;
    assert_int_equal(shmb_stats_pools(c, &p, &n), -EPROTO);
    assert_null(p);
    assert_int_equal(n, 0);
    p = (shmb_stats_t *)1;
    assert_int_equal(shmb_stats_pools(c, &p, &n), -EPROTO);
    assert_null(p);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_list returns every field of every object in order, and
 * the truncated flag, and sends the prefix and the limit asked for. */
static void test_list_every_field(void **state)
{
    static const struct step steps[] = {
        {"list",
         "{\"ok\":true,\"objects\":[{\"key\":\"k\\u00e9y\",\"offset\":4096,\"size\":10,"
         "\"pins\":2,\"readers\":3,\"state\":\"committed\",\"age_ms\":44},"
         "{\"key\":\"b\",\"offset\":4160,\"size\":11,\"pins\":0,\"readers\":1,"
         "\"state\":\"pending\",\"age_ms\":5}],\"truncated\":true,\"id\":@ID}",
         0, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    shmb_list_t *l = NULL;

    (void)state;
    assert_int_equal(shmb_list(c, "pre", 7, &l), 0);
    assert_non_null(strstr(f->last, "\"prefix\":\"pre\""));
    assert_non_null(strstr(f->last, "\"limit\":7"));
    assert_int_equal(l->count, 2);
    assert_true(l->truncated);
    assert_string_equal(l->objects[0].key, "k\xc3\xa9y");
    assert_int_equal(l->objects[0].offset, 4096);
    assert_int_equal(l->objects[0].size, 10);
    assert_int_equal(l->objects[0].pins, 2);
    assert_int_equal(l->objects[0].readers, 3);
    assert_string_equal(l->objects[0].state, "committed");
    assert_int_equal(l->objects[0].age_ms, 44);
    assert_string_equal(l->objects[1].key, "b");
    assert_int_equal(l->objects[1].offset, 4160);
    assert_int_equal(l->objects[1].size, 11);
    assert_int_equal(l->objects[1].pins, 0);
    assert_int_equal(l->objects[1].readers, 1);
    assert_string_equal(l->objects[1].state, "pending");
    assert_int_equal(l->objects[1].age_ms, 5);
    shmb_list_free(l);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that a list entry without one of its fields is refused with
 * -EPROTO, and that no list is handed out then. */
static void test_list_missing_field(void **state)
{
    static const struct step steps[] = {
        {"list",
         "{\"ok\":true,\"objects\":[{\"key\":\"a\",\"offset\":4096,\"size\":10,"
         "\"pins\":2,\"state\":\"committed\",\"age_ms\":44}],\"truncated\":false,"
         "\"id\":@ID}",
         0, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    shmb_list_t *l = (shmb_list_t *)1;

    (void)state;
    assert_int_equal(shmb_list(c, NULL, 0, &l), -EPROTO);
    assert_null(l);
    assert_non_null(strstr(shmb_errmsg(c), "\"readers\""));
    assert_null(strstr(f->last, "\"limit\"")); /* 0: the daemon's default */
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_clients returns every field of every connection. */
static void test_clients_every_field(void **state)
{
    static const struct step steps[] = {
        {"clients",
         "{\"ok\":true,\"clients\":[{\"pid\":10,\"uid\":20,\"gid\":30,\"name\":\"unit\","
         "\"mode\":\"rw\",\"pins\":1,\"pending\":2,\"bytes_pinned\":3,"
         "\"connected_unix\":1700000000,\"self\":true,\"pool\":\"frames\"},{\"pid\":11,\"uid\":21,\"gid\":31,"
         "\"name\":\"\",\"mode\":\"ro\",\"pins\":4,\"pending\":5,\"bytes_pinned\":6,"
         "\"connected_unix\":1700000001,\"self\":false}],\"id\":@ID}",
         0, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    shmb_clients_t *l = NULL;

    (void)state;
    assert_int_equal(shmb_clients(c, &l), 0);
    assert_int_equal(l->count, 2);
    assert_int_equal(l->clients[0].pid, 10);
    assert_int_equal(l->clients[0].uid, 20);
    assert_int_equal(l->clients[0].gid, 30);
    assert_string_equal(l->clients[0].name, "unit");
    assert_string_equal(l->clients[0].mode, "rw");
    assert_int_equal(l->clients[0].pins, 1);
    assert_int_equal(l->clients[0].pending, 2);
    assert_int_equal(l->clients[0].bytes_pinned, 3);
    assert_int_equal(l->clients[0].connected_unix, 1700000000);
    assert_int_equal(l->clients[0].self, 1);
    assert_string_equal(l->pools[0], "frames");
    assert_int_equal(l->clients[1].pid, 11);
    assert_int_equal(l->clients[1].uid, 21);
    assert_int_equal(l->clients[1].gid, 31);
    assert_string_equal(l->clients[1].name, "");
    assert_string_equal(l->clients[1].mode, "ro");
    assert_int_equal(l->clients[1].pins, 4);
    assert_int_equal(l->clients[1].pending, 5);
    assert_int_equal(l->clients[1].bytes_pinned, 6);
    assert_int_equal(l->clients[1].connected_unix, 1700000001);
    assert_int_equal(l->clients[1].self, 0);
    assert_string_equal(l->pools[1], ""); /* a daemon without pools */
    shmb_clients_free(l);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that a reply carrying another request's id fails the call with
 * -ECONNRESET and drops the connection, so no later call takes it. */
static void test_wrong_id(void **state)
{
    static const struct step steps[] = {{"contains", "{\"ok\":true,\"exists\":true,\"id\":@ID}",
                                         1, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);

    (void)state;
    assert_int_equal(shmb_contains(c, "k"), -ECONNRESET);
    assert_non_null(strstr(shmb_errmsg(c), "out of step"));
    assert_int_equal(shmb_contains(c, "k"), -ENOTCONN);
    shmb_close(c);
    fake_stop(f);
}

/* How often the library ran the key check (linked with
 * -Wl,--wrap=shmb_key_len_check,--wrap=shmb_key_check). */
static int key_checks;
int __real_shmb_key_len_check(size_t len, struct shmb_error *err);
int __real_shmb_key_check(const char *key, size_t len, struct shmb_error *err);
int __wrap_shmb_key_len_check(size_t len, struct shmb_error *err);
int __wrap_shmb_key_check(const char *key, size_t len, struct shmb_error *err);

int __wrap_shmb_key_len_check(size_t len, struct shmb_error *err)
{
    key_checks++;
    return __real_shmb_key_len_check(len, err);
}

int __wrap_shmb_key_check(const char *key, size_t len, struct shmb_error *err)
{
    key_checks++;
    return __real_shmb_key_check(key, len, err);
}

/* Proves that a put's key is checked once, at the public entry, and passed
 * down checked: a put without an arena (alloc, then commit), for an ASCII
 * key and one that needs the whole UTF-8 check, and an alloc, each check
 * their key once; a bad key is still refused with the daemon's words and
 * nothing sent. */
static void test_key_checked_once(void **state)
{
    static const struct step steps[] = {
        {"alloc", "{\"ok\":true,\"offset\":4160,\"size\":5,\"id\":@ID}", 0, false},
        {"commit", "{\"ok\":true,\"id\":@ID}", 0, false},
        {"alloc", "{\"ok\":true,\"offset\":4224,\"size\":3,\"id\":@ID}", 0, false},
        {"commit", "{\"ok\":true,\"id\":@ID}", 0, false},
        {"alloc", "{\"ok\":true,\"offset\":4288,\"size\":2,\"id\":@ID}", 0, false}};
    struct fake *f = fake_start(steps, 5, false);
    shmb_t *c = connect_to(f);
    void *p = NULL;

    (void)state;
    shmb_set_arena(c, 0); /* the put's two round trips, through objects.c */
    key_checks = 0;
    assert_int_equal(shmb_put(c, "k", "hello", 5, 1), 0);
    assert_int_equal(key_checks, 1);
    key_checks = 0;
    assert_int_equal(shmb_put(c, "cl\xc3\xa9", "abc", 3, 1), 0);
    assert_int_equal(key_checks, 1);
    key_checks = 0;
    assert_int_equal(shmb_alloc(c, "a", 2, 1, &p), 0);
    assert_non_null(p);
    assert_int_equal(key_checks, 1);
    key_checks = 0;
    assert_int_equal(shmb_put(c, "bad\xff", "x", 1, 1), -EINVAL);
    assert_non_null(strstr(shmb_errmsg(c), "UTF-8"));
    assert_int_equal(key_checks, 1);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that a reply arriving in pieces, on the slow path and on the fast
 * one, is put together before it is read. */
static void test_split_reply(void **state)
{
    static const struct step steps[] = {
        {"contains", "{\"ok\":true,\"exists\":true,\"id\":@ID}", 0, true},
        {"stats", STATS_REPLY, 0, true}};
    struct fake *f = fake_start(steps, 2, false);
    shmb_t *c = connect_to(f);
    shmb_stats_t st;

    (void)state;
    assert_int_equal(shmb_contains(c, "k"), 1);
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_int_equal(st.noreply_errors, 122);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that the library maps the first descriptor the daemon passes and
 * closes a second one (sent with the rest of the hello reply): a
 * connection leaves no descriptor behind but its socket. */
static void test_extra_descriptor(void **state)
{
    struct fake *f = fake_start(NULL, 0, true);
    int before = open_fds();
    shmb_t *c = connect_to(f);

    (void)state;
    assert_non_null(shmb_info(c));
    assert_int_equal(shmb_info(c)->size, SEG_SIZE);
    /* The library's socket and the fake's accepted one, nothing else. */
    assert_int_equal(open_fds(), before + 2);
    shmb_close(c);
    fake_stop(f);
}

/* ---- queues ------------------------------------------------------------- */

/* The geometry of the fake's queue: 2 seats, 4 slots of 64 bytes. */
#define Q_SIZE 8704
#define Q_OPEN_REPLY(seats, epoch, size)                                                 \
    "{\"ok\":true,\"name\":\"q\",\"pool\":\"p\",\"role\":\"reader\",\"seat\":1,"         \
    "\"epoch\":" #epoch ",\"seats\":" #seats ",\"slots\":4,\"slot_size\":64,"            \
    "\"size\":" #size ",\"id\":@ID}"
#define Q_CLOSE_REPLY "{\"ok\":true,\"closed\":1,\"id\":@ID}"

/* A memfd holding a queue area of the fake's geometry, formatted, with
 * seat 1 taken once (epoch 1), as the daemon leaves it for a reader. */
static int queue_memfd(void)
{
    size_t size = shmb_q_size(2, 4, 64);
    int fd = memfd_create("fake-queue", MFD_CLOEXEC);
    struct shmb_q q;
    void *p;

    assert_int_equal(size, Q_SIZE);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    assert_int_equal(shmb_q_format(p, size, "q", 2, 4, 64, NULL), 0);
    assert_int_equal(shmb_q_attach(&q, p, size, NULL), 0);
    shmb_q_seat_take(&q, 1);
    munmap(p, size);
    return fd;
}

/* Open reader seat 1 of the fake's queue, answered with reply and (pass)
 * the queue's descriptor; then a queue_close is expected. The handle, or
 * NULL with the call's code in *rc. */
static shmb_queue_t *open_fake_queue(struct fake **f, shmb_t **c,
                                     const struct step *steps, bool pass, int *rc)
{
    shmb_queue_t *q = (shmb_queue_t *)1;

    *f = fake_new(NULL, 1, steps, 2, false);
    if (pass) {
        (*f)->step_fd = queue_memfd();
        (*f)->step_fd_at = 0;
    }
    fake_go(*f);
    *c = connect_to(*f);
    *rc = shmb_queue_open(*c, "q", 1, &q);
    return q;
}

/* Proves that a reader's queue_open maps the descriptor that comes with the
 * reply and takes the seat at the epoch it says: the seat, the slot size,
 * a wait that times out, the seat's request in queue_close; and that the
 * epoch is checked: one the area does not hold is a seat taken since. */
static void test_queue_open(void **state)
{
    static const struct step steps[] = {
        {"queue_open", Q_OPEN_REPLY(2, 1, 8704), 0, false},
        {"queue_close", Q_CLOSE_REPLY, 0, false}};
    static const struct step stale[] = {
        {"queue_open", Q_OPEN_REPLY(2, 7, 8704), 0, false},
        {"queue_close", Q_CLOSE_REPLY, 0, false}};
    struct fake *f;
    shmb_t *c;
    shmb_queue_t *q;
    const void *data;
    size_t len;
    int rc, before = open_fds();

    (void)state;
    q = open_fake_queue(&f, &c, steps, true, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(f->last, "\"role\":\"reader\""));
    assert_non_null(strstr(f->last, "\"seat\":1"));
    assert_int_equal(shmb_queue_seat(q), 1);
    assert_int_equal(shmb_queue_slot_size(q), 64);
    assert_int_equal(shmb_queue_dequeue(q, &data, &len, 0), -ETIMEDOUT);
    assert_int_equal(shmb_queue_close(q), 0);
    assert_non_null(strstr(f->last, "\"op\":\"queue_close\""));
    assert_non_null(strstr(f->last, "\"seat\":1"));
    shmb_close(c);
    fake_stop(f);
    /* The queue's descriptor was closed once mapped. */
    assert_int_equal(open_fds(), before);

    q = open_fake_queue(&f, &c, stale, true, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(shmb_queue_dequeue(q, &data, &len, 0), -ENOTCONN);
    assert_int_equal(shmb_queue_close(q), 0);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that a queue_open reply the library cannot trust (no descriptor,
 * a descriptor smaller than the size it says, an area of another geometry)
 * fails with -EPROTO saying why, hands out no handle, and gives the seat
 * back with queue_close. */
static void test_queue_open_refused(void **state)
{
    static const struct step none[] = {{"queue_open", Q_OPEN_REPLY(2, 1, 8704), 0, false},
                                       {"queue_close", Q_CLOSE_REPLY, 0, false}};
    static const struct step big[] = {
        {"queue_open", Q_OPEN_REPLY(2, 1, 1048576), 0, false},
        {"queue_close", Q_CLOSE_REPLY, 0, false}};
    static const struct step other[] = {
        {"queue_open", Q_OPEN_REPLY(3, 1, 8704), 0, false},
        {"queue_close", Q_CLOSE_REPLY, 0, false}};
    static const struct {
        const struct step *steps;
        bool pass;
        const char *why;
    } cases[] = {{none, false, "no descriptor"},
                 {big, true, "smaller than the 1048576 bytes"},
                 {other, true, "not what queue_open said"}};
    struct fake *f;
    shmb_t *c;
    shmb_queue_t *q;
    size_t i;
    int rc;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        q = open_fake_queue(&f, &c, cases[i].steps, cases[i].pass, &rc);
        assert_int_equal(rc, -EPROTO);
        assert_null(q);
        if (strstr(shmb_errmsg(c), cases[i].why) == NULL)
            fail_msg("case %zu: %s", i, shmb_errmsg(c));
        assert_non_null(strstr(f->last, "\"op\":\"queue_close\""));
        assert_non_null(strstr(f->last, "\"seat\":1"));
        shmb_close(c);
        fake_stop(f);
    }
}

/* Issue 24: shmb_queue_list asks for the seats ("seats":true) and
 * shmb_queue_summary does not, and takes a reply without seat_list (nseats
 * 0); a name a pool's group= hides (null) reads as "". */
static void test_queue_summary(void **state)
{
    static const char summary[] =
        "{\"ok\":true,\"queues\":[{\"name\":null,\"pool\":\"p\",\"seats\":64,"
        "\"slots\":4,\"slot_size\":64,\"size\":8704,\"temporary\":false,"
        "\"state\":\"open\",\"messages\":9,\"depth\":4,\"seats_live\":64,"
        "\"seats_dead\":0,\"seats_free\":0,\"writer\":{\"client\":3,\"pid\":33,"
        "\"name\":null},\"writer_waiting\":true,\"readers_waiting\":1,"
        "\"blocker\":null}],\"id\":@ID}";
    static const struct step steps[] = {{"queue_list", summary, 0, false},
                                        {"queue_list", summary, 0, false}};
    struct fake *f = fake_start(steps, 2, false);
    shmb_t *c = connect_to(f);
    shmb_queue_list_t *l = NULL;

    (void)state;
    assert_int_equal(shmb_queue_summary(c, &l), 0);
    assert_null(strstr(f->last, "seats"));
    assert_int_equal(l->count, 1);
    assert_string_equal(l->queues[0].name, "");
    assert_string_equal(l->queues[0].writer_name, "");
    assert_int_equal(l->queues[0].writer_pid, 33);
    assert_int_equal(l->queues[0].seats_live, 64);
    assert_int_equal(l->queues[0].nseats, 0);
    shmb_queue_list_free(l);
    assert_int_equal(shmb_queue_list(c, &l), 0);
    assert_non_null(strstr(f->last, "\"seats\":true"));
    shmb_queue_list_free(l);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that shmb_queue_list returns every field of every queue and seat,
 * a writer and a blocker of null included. */
static void test_queue_list_every_field(void **state)
{
    static const struct step steps[] = {
        {"queue_list",
         "{\"ok\":true,\"queues\":[{\"name\":\"a\",\"pool\":\"p\",\"seats\":2,"
         "\"slots\":4,\"slot_size\":64,\"size\":8704,\"temporary\":true,"
         "\"state\":\"open\",\"messages\":9,\"depth\":4,\"seats_live\":1,"
         "\"seats_dead\":1,\"seats_free\":0,\"writer\":{\"client\":3,\"pid\":33,"
         "\"name\":\"w\"},\"writer_waiting\":true,\"readers_waiting\":1,"
         "\"blocker\":{\"seat\":0,\"client\":4,\"pid\":44,\"name\":\"slow\","
         "\"behind\":4},\"seat_list\":[{\"seat\":0,\"state\":\"live\",\"client\":4,"
         "\"pid\":44,\"name\":\"slow\",\"behind\":4},{\"seat\":1,\"state\":\"dead\","
         "\"client\":5,\"pid\":55,\"name\":\"gone\",\"behind\":2}]},"
         "{\"name\":\"b\",\"pool\":\"p2\",\"seats\":1,\"slots\":2,\"slot_size\":128,"
         "\"size\":8448,\"temporary\":false,\"state\":\"shutdown\",\"messages\":0,"
         "\"depth\":0,\"seats_live\":0,\"seats_dead\":0,\"seats_free\":1,"
         "\"writer\":null,\"writer_waiting\":false,\"readers_waiting\":0,"
         "\"blocker\":null,\"seat_list\":[{\"seat\":0,\"state\":\"free\","
         "\"client\":null,\"pid\":null,\"name\":null,\"behind\":0}]}],\"id\":@ID}",
         0, false}};
    struct fake *f = fake_start(steps, 1, false);
    shmb_t *c = connect_to(f);
    shmb_queue_list_t *l = NULL;
    const shmb_queue_info_t *a, *b;

    (void)state;
    assert_int_equal(shmb_queue_list(c, &l), 0);
    assert_int_equal(l->count, 2);
    a = &l->queues[0];
    b = &l->queues[1];
    assert_string_equal(a->name, "a");
    assert_string_equal(a->pool, "p");
    assert_int_equal(a->seats, 2);
    assert_int_equal(a->slots, 4);
    assert_int_equal(a->slot_size, 64);
    assert_int_equal(a->size, 8704);
    assert_int_equal(a->temporary, 1);
    assert_string_equal(a->state, "open");
    assert_int_equal(a->messages, 9);
    assert_int_equal(a->depth, 4);
    assert_int_equal(a->seats_live, 1);
    assert_int_equal(a->seats_dead, 1);
    assert_int_equal(a->seats_free, 0);
    assert_int_equal(a->has_writer, 1);
    assert_int_equal(a->writer_client, 3);
    assert_int_equal(a->writer_pid, 33);
    assert_string_equal(a->writer_name, "w");
    assert_int_equal(a->writer_waiting, 1);
    assert_int_equal(a->readers_waiting, 1);
    assert_int_equal(a->blocker_seat, 0);
    assert_int_equal(a->blocker_client, 4);
    assert_int_equal(a->blocker_pid, 44);
    assert_string_equal(a->blocker_name, "slow");
    assert_int_equal(a->blocker_behind, 4);
    assert_int_equal(a->nseats, 2);
    assert_int_equal(a->seat_list[1].seat, 1);
    assert_string_equal(a->seat_list[1].state, "dead");
    assert_int_equal(a->seat_list[1].client, 5);
    assert_int_equal(a->seat_list[1].pid, 55);
    assert_string_equal(a->seat_list[1].name, "gone");
    assert_int_equal(a->seat_list[1].behind, 2);
    assert_string_equal(b->name, "b");
    assert_string_equal(b->pool, "p2");
    assert_int_equal(b->temporary, 0);
    assert_string_equal(b->state, "shutdown");
    assert_int_equal(b->has_writer, 0);
    assert_int_equal(b->writer_pid, -1);
    assert_int_equal(b->blocker_seat, -1);
    assert_int_equal(b->nseats, 1);
    assert_string_equal(b->seat_list[0].state, "free");
    assert_int_equal(b->seat_list[0].pid, -1);
    assert_string_equal(b->seat_list[0].name, "");
    shmb_queue_list_free(l);
    shmb_close(c);
    fake_stop(f);
}

/* Proves that proto/sock refuses a socket path that does not fit sun_path
 * (one byte short of it fits), and that sending with a descriptor on a full
 * socket says -EAGAIN rather than blocking, as the daemon's loop needs. */
static void test_sock_helpers(void **state)
{
    struct sockaddr_un sun;
    char path[sizeof(sun.sun_path) + 1], chunk[4096];
    int sv[2], fd = memfd_create("probe", MFD_CLOEXEC), received = -1;
    ssize_t n;

    (void)state;
    memset(path, 'p', sizeof(path));
    path[sizeof(sun.sun_path)] = '\0';
    assert_int_equal(shmb_sock_address(&sun, path), -ENAMETOOLONG);
    path[sizeof(sun.sun_path) - 1] = '\0';
    assert_int_equal(shmb_sock_address(&sun, path), 0);
    assert_string_equal(sun.sun_path, path);
    assert_int_equal(sun.sun_family, AF_UNIX);

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(shmb_sock_send_fd(sv[0], "x", 1, fd), 1);
    assert_int_equal(shmb_sock_recv_fd(sv[1], chunk, sizeof(chunk), &received), 1);
    assert_true(received >= 0 && received != fd);
    close(received);
    memset(chunk, 'y', sizeof(chunk));
    do
        n = shmb_sock_send_fd(sv[0], chunk, sizeof(chunk), fd);
    while (n > 0);
    assert_int_equal(n, -EAGAIN);
    close(sv[0]);
    close(sv[1]);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_every_field),
        cmocka_unit_test(test_stats_old_struct),
        cmocka_unit_test(test_stats_json),
        cmocka_unit_test(test_pool_hello),
        cmocka_unit_test(test_pool_default),
        cmocka_unit_test(test_pool_reconnect),
        cmocka_unit_test(test_pool_name_length),
        cmocka_unit_test(test_stats_pools),
        cmocka_unit_test(test_stats_pools_fallback),
        cmocka_unit_test(test_list_every_field),
        cmocka_unit_test(test_list_missing_field),
        cmocka_unit_test(test_clients_every_field),
        cmocka_unit_test(test_wrong_id),
        cmocka_unit_test(test_key_checked_once),
        cmocka_unit_test(test_split_reply),
        cmocka_unit_test(test_extra_descriptor),
        cmocka_unit_test(test_queue_open),
        cmocka_unit_test(test_queue_open_refused),
        cmocka_unit_test(test_queue_list_every_field),
        cmocka_unit_test(test_queue_summary),
        cmocka_unit_test(test_sock_helpers),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
