/*
 * Unit tests of the client library (client/) against a fake daemon: a
 * thread listening on a temporary socket that answers each request line
 * with a scripted reply, and passes a memfd holding a segment header as the
 * segment's descriptor. What the library makes of what a daemon says (the
 * reports field by field, a reply out of step, a reply in pieces, a
 * descriptor too many) is checked without a real daemon.
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
    const struct step *steps;
    size_t nsteps;
    pthread_t thread;
    char error[256];   /* what went wrong in the thread, "" when nothing */
    char last[1024];   /* the last request line received */
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

/* The fake daemon: accept one client, answer hello with the segment's
 * descriptor (and the extra one), then each step, then wait for EOF. */
static void *fake_run(void *arg)
{
    struct fake *f = arg;
    char line[8192];
    long long id;
    size_t i, len, half;
    int fd = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0) {
        fake_fail(f, "accept: %s", strerror(errno));
        return NULL;
    }
    if ((id = fake_request(f, fd, "hello")) < 0)
        goto out;
    fake_fill(HELLO_REPLY, id, line, sizeof(line));
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
    for (i = 0; i < f->nsteps; i++) {
        const struct step *s = &f->steps[i];

        if ((id = fake_request(f, fd, s->op)) < 0)
            goto out;
        fake_fill(s->reply, id + s->id_delta, line, sizeof(line));
        len = strlen(line);
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
    return NULL;
}

/* Start a fake daemon that will play steps[0..n); extra: also pass a second
 * descriptor with the hello reply. */
static struct fake *fake_start(const struct step *steps, size_t n, bool extra)
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
    f->steps = steps;
    f->nsteps = n;
    assert_int_equal(pthread_create(&f->thread, NULL, fake_run, f), 0);
    return f;
}

/* Join the fake (the client must have closed) and fail on its error. */
static void fake_stop(struct fake *f)
{
    assert_int_equal(pthread_join(f->thread, NULL), 0);
    close(f->listen_fd);
    close(f->seg_fd);
    if (f->extra_fd >= 0)
        close(f->extra_fd);
    unlink(f->path);
    rmdir(f->dir);
    if (f->error[0] != '\0')
        fail_msg("fake daemon: %s", f->error);
    free(f);
}

static shmb_t *connect_to(struct fake *f)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    shmb_set_populate(c, 0);
    if (shmb_connect(c, f->path, "unit") != 0)
        fail_msg("shmb_connect: %s: %s", shmb_errname(c), shmb_errmsg(c));
    return c;
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
    "\"expired_allocs\":120,\"lease_expiries\":121,\"noreply_errors\":122},\"id\":@ID}"

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
    shmb_close(c);
    fake_stop(f);
}

/* Proves that the first release's entry point, which a program built
 * against the old header calls with the old, smaller struct, writes nothing
 * past that struct, and that a size smaller than it is refused unsent. */
static void test_stats_old_struct(void **state)
{
    static const struct step steps[] = {{"stats", STATS_REPLY, 0, false}};
    struct fake *f = fake_start(steps, 1, false);
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
         "\"connected_unix\":1700000000,\"self\":true},{\"pid\":11,\"uid\":21,\"gid\":31,"
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
        cmocka_unit_test(test_list_every_field),
        cmocka_unit_test(test_list_missing_field),
        cmocka_unit_test(test_clients_every_field),
        cmocka_unit_test(test_wrong_id),
        cmocka_unit_test(test_split_reply),
        cmocka_unit_test(test_extra_descriptor),
        cmocka_unit_test(test_sock_helpers),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
