// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests of the connection layer and the listener: conn.c, waitq.c and
 * server.c over a real libuv loop and the command layer's fixture (a store
 * in ordinary memory), with a socketpair standing in for a client. No
 * daemon, no segment file: what a connection does with its socket is
 * checked byte by byte.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "clock.h"
#include "conn.h"
#include "fixture.h"
#include "server.h"

#define TEST_SIZE (1024 * 1024)

struct env {
    struct fixture f;
    uv_loop_t loop;
    struct policy policy;
    struct conn_set set;
    unsigned freed; /* on_freed calls */
    int rw_fd, ro_fd; /* the "segment" descriptors: two memfds told apart by inode */
};

static void on_freed(void *arg)
{
    ((struct env *)arg)->freed++;
}

static int memfd(const char *name)
{
    int fd = memfd_create(name, MFD_CLOEXEC);

    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, TEST_SIZE), 0);
    return fd;
}

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof(*e));

    assert_non_null(e);
    assert_int_equal(fixture_init(&e->f, TEST_SIZE, 256 * 1024), 0);
    e->rw_fd = e->f.pool.seg.fd = memfd("rw");
    e->ro_fd = e->f.pool.seg.ro_fd = memfd("ro");
    assert_int_equal(uv_loop_init(&e->loop), 0);
    e->policy.max_queued_output = 1024 * 1024;
    assert_int_equal(conn_set_init(&e->set, &e->loop, &e->f.env, &e->policy, on_freed, e), 0);
    *state = e;
    return 0;
}

/* Run the loop until nothing is left; the loop must close cleanly. */
static int teardown(void **state)
{
    struct env *e = *state;

    conn_set_close(&e->set);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&e->loop), 0);
    close(e->rw_fd);
    close(e->ro_fd);
    fixture_fini(&e->f);
    free(e);
    return 0;
}

/* A client: one end of a socketpair; the other is the connection's. */
static int client_open(struct env *e, uid_t uid)
{
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    assert_int_equal(conn_open(&e->set, sv[0], getpid(), uid, getgid()), 0);
    return sv[1];
}

static void client_send(int fd, const char *text)
{
    size_t len = strlen(text);

    assert_int_equal(send(fd, text, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Run the loop until fd has something to read (or its peer is gone), for at
 * most timeout_ms; true when it has. */
static bool pump(struct env *e, int fd, unsigned timeout_ms)
{
    uint64_t end = clock_now_ms() + timeout_ms;
    struct pollfd p = {.fd = fd, .events = POLLIN};

    do {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        if (poll(&p, 1, 1) == 1)
            return true;
    } while (clock_now_ms() < end);
    return false;
}

/* Read one reply line into buf (NUL-terminated, without '\n'), running the
 * loop meanwhile; *fd_out gets a descriptor passed with it, or -1. Returns
 * the line's length, or -1 at EOF or after 2 s without one. */
static ssize_t read_line(struct env *e, int fd, char *buf, size_t cap, int *fd_out)
{
    size_t len = 0;

    if (fd_out != NULL)
        *fd_out = -1;
    while (len < cap - 1) {
        union {
            struct cmsghdr hdr;
            char buf[CMSG_SPACE(sizeof(int))];
        } control;
        struct iovec iov = {buf + len, 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        struct cmsghdr *c;
        ssize_t n;

        if (!pump(e, fd, 2000))
            return -1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            return -1;
        for (c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                assert_non_null(fd_out);
                memcpy(fd_out, CMSG_DATA(c), sizeof(int));
            }
        if (buf[len] == '\n') {
            buf[len] = '\0';
            return (ssize_t)len;
        }
        len++;
    }
    fail_msg("reply longer than %zu bytes", cap);
    return -1;
}

/* Read one reply and check it is exactly want. */
static void expect_line(struct env *e, int fd, const char *want)
{
    char buf[4096];

    assert_true(read_line(e, fd, buf, sizeof(buf), NULL) >= 0);
    assert_string_equal(buf, want);
}

/* Say hello on fd and read the reply, closing the segment descriptor it
 * carries. */
static void client_hello(struct env *e, int fd)
{
    char buf[1024];
    int got = -1;

    client_send(fd, "{\"op\":\"hello\",\"version\":1}\n");
    assert_true(read_line(e, fd, buf, sizeof(buf), &got) > 0);
    assert_true(got >= 0);
    close(got);
}

/* True when fd's peer has closed: EOF after whatever was left unread, or
 * ECONNRESET, which a Unix socket reports when its peer closed with bytes
 * of ours still unread. */
static bool closed_by_peer(struct env *e, int fd)
{
    char buf[4096];

    for (;;) {
        ssize_t n;

        if (!pump(e, fd, 2000))
            return false;
        n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            return false;
    }
}

static ino_t inode_of(int fd)
{
    struct stat st;

    assert_int_equal(fstat(fd, &st), 0);
    return st.st_ino;
}

/* The hello reply carries the segment's descriptor: the read-write one for a
 * read-write client, the read-only one for "mode":"ro". */
static void test_hello_passes_descriptor(void **state)
{
    struct env *e = *state;
    int rw = client_open(e, getuid()), ro = client_open(e, getuid()), got;
    char buf[1024];

    client_send(rw, "{\"op\":\"hello\",\"version\":1,\"id\":1}\n");
    assert_true(read_line(e, rw, buf, sizeof(buf), &got) > 0);
    assert_non_null(strstr(buf, "\"ok\":true"));
    assert_true(got >= 0);
    assert_int_equal(inode_of(got), inode_of(e->rw_fd));
    close(got);
    client_send(ro, "{\"op\":\"hello\",\"version\":1,\"mode\":\"ro\"}\n");
    assert_true(read_line(e, ro, buf, sizeof(buf), &got) > 0);
    assert_non_null(strstr(buf, "\"mode\":\"ro\""));
    assert_true(got >= 0);
    assert_int_equal(inode_of(got), inode_of(e->ro_fd));
    close(got);
    assert_int_equal(e->f.env.clients, 2);
    close(rw);
    close(ro);
}

/* Requests pipelined in one write are answered in order, one line each,
 * a blank line and a '\r' before the '\n' ignored. */
static void test_pipelined_in_order(void **state)
{
    struct env *e = *state;
    int c = client_open(e, getuid()), got;
    char buf[1024], want[64];
    int i;

    client_send(c, "{\"op\":\"hello\",\"version\":1}\n\n"
                   "{\"op\":\"contains\",\"key\":\"a\",\"id\":0}\r\n");
    assert_true(read_line(e, c, buf, sizeof(buf), &got) > 0);
    close(got);
    expect_line(e, c, "{\"ok\":true,\"exists\":false,\"id\":0}");
    for (i = 1; i <= 200; i++) {
        snprintf(buf, sizeof(buf), "{\"op\":\"contains\",\"key\":\"k%d\",\"id\":%d}\n", i, i);
        client_send(c, buf);
    }
    for (i = 1; i <= 200; i++) {
        snprintf(want, sizeof(want), "{\"ok\":true,\"exists\":false,\"id\":%d}", i);
        expect_line(e, c, want);
    }
    close(c);
}

/* An alloc that waits for space (through the wait queue) holds back the
 * requests behind it; a release and delete by another client answers it,
 * and the held requests follow, in order. */
static void test_wait_then_answer(void **state)
{
    struct env *e = *state;
    int a = client_open(e, getuid()), b = client_open(e, getuid());
    char buf[1024];

    client_hello(e, a);
    client_hello(e, b);
    /* a fills most of the store and pins it. */
    client_send(a, "{\"op\":\"alloc\",\"key\":\"big\",\"size\":262144,\"id\":1}\n"
                   "{\"op\":\"commit\",\"key\":\"big\",\"id\":2}\n");
    assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"ok\":true"));
    expect_line(e, a, "{\"ok\":true,\"id\":2}");
    client_send(a, "{\"op\":\"get\",\"key\":\"big\",\"id\":3}\n");
    assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    /* b's allocs need the room big takes: the third waits. */
    client_send(b, "{\"op\":\"alloc\",\"key\":\"b1\",\"size\":262144,\"id\":1}\n"
                   "{\"op\":\"alloc\",\"key\":\"b2\",\"size\":262144,\"id\":2}\n"
                   "{\"op\":\"alloc\",\"key\":\"b3\",\"size\":262144,\"wait_ms\":5000,"
                   "\"id\":3}\n"
                   "{\"op\":\"contains\",\"key\":\"big\",\"id\":4}\n");
    assert_true(read_line(e, b, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"ok\":true"));
    assert_true(read_line(e, b, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"ok\":true"));
    assert_false(pump(e, b, 200)); /* waiting: nothing, not even id 4 */
    assert_int_equal(e->set.waitq.entries.tqh_first != NULL, 1);
    client_send(a, "{\"op\":\"release\",\"key\":\"big\",\"id\":4}\n"
                   "{\"op\":\"delete\",\"key\":\"big\",\"id\":5}\n");
    expect_line(e, a, "{\"ok\":true,\"id\":4}");
    expect_line(e, a, "{\"ok\":true,\"id\":5}");
    assert_true(read_line(e, b, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"ok\":true,\"offset\":"));
    assert_non_null(strstr(buf, "\"id\":3}"));
    expect_line(e, b, "{\"ok\":true,\"exists\":false,\"id\":4}");
    assert_null(e->set.waitq.entries.tqh_first);
    close(a);
    close(b);
}

/* A waiting alloc ends with ETIMEDOUT at its deadline, naming the wait. */
static void test_wait_times_out(void **state)
{
    struct env *e = *state;
    int a = client_open(e, getuid());
    char buf[2048];

    client_hello(e, a);
    client_send(a, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":262144,\"id\":1}\n"
                   "{\"op\":\"commit\",\"key\":\"x\",\"id\":2}\n"
                   "{\"op\":\"get\",\"key\":\"x\",\"id\":3}\n"
                   "{\"op\":\"alloc\",\"key\":\"y\",\"size\":262144,\"id\":4}\n"
                   "{\"op\":\"alloc\",\"key\":\"z\",\"size\":262144,\"id\":5}\n"
                   "{\"op\":\"alloc\",\"key\":\"w\",\"size\":262144,\"wait_ms\":100,"
                   "\"id\":6}\n");
    for (int i = 0; i < 5; i++)
        assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"error\":\"ETIMEDOUT\""));
    assert_non_null(strstr(buf, "Waited 100 ms for space."));
    assert_non_null(strstr(buf, "\"id\":6"));
    close(a);
}

/* A client whose alloc waits, with more than its input buffer of requests
 * queued behind it (so reading pauses), and which then closes: the daemon
 * sees it go at once, its pins go, and what it queued never runs, not even
 * when room is made later. */
static void test_paused_wait_sees_close(void **state)
{
    struct env *e = *state;
    int a = client_open(e, getuid()), b = client_open(e, getuid());
    struct store_stats st;
    char buf[1024];
    size_t sent = 0;

    client_hello(e, a);
    client_hello(e, b);
    client_send(a, "{\"op\":\"alloc\",\"key\":\"big\",\"size\":262144}\n"
                   "{\"op\":\"commit\",\"key\":\"big\"}\n"
                   "{\"op\":\"get\",\"key\":\"big\"}\n");
    for (int i = 0; i < 3; i++)
        assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    client_send(b, "{\"op\":\"get\",\"key\":\"big\"}\n"
                   "{\"op\":\"alloc\",\"key\":\"b1\",\"size\":262144}\n"
                   "{\"op\":\"alloc\",\"key\":\"b2\",\"size\":262144}\n"
                   "{\"op\":\"alloc\",\"key\":\"b3\",\"size\":262144,\"wait_ms\":60000}\n"
                   "{\"op\":\"alloc\",\"key\":\"late\",\"size\":64}\n"
                   "{\"op\":\"commit\",\"key\":\"late\",\"noreply\":true}\n");
    for (int i = 0; i < 3; i++)
        assert_true(read_line(e, b, buf, sizeof(buf), NULL) > 0);
    /* Padding behind the wait until the daemon stops reading. */
    while (sent < 4 * SHMB_MAX_LINE) {
        const char pad[] = "{\"op\":\"contains\",\"key\":\"pad\"}\n";

        if (send(b, pad, sizeof(pad) - 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            break;
        sent += sizeof(pad) - 1;
        uv_run(&e->loop, UV_RUN_NOWAIT);
    }
    for (int i = 0; i < 50; i++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    assert_int_equal(e->f.env.clients, 2);
    close(b);
    for (int i = 0; i < 500 && e->f.env.clients == 2; i++) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(e->f.env.clients, 1); /* seen going during the wait */
    store_counts(e->f.store, &st);
    assert_int_equal(st.pending, 0); /* b1, b2: released with it */
    assert_int_equal(st.pinned, 1);  /* a's pin only */
    /* Room made now runs nothing of b's. */
    client_send(a, "{\"op\":\"release\",\"key\":\"big\",\"id\":1}\n"
                   "{\"op\":\"delete\",\"key\":\"big\",\"id\":2}\n");
    expect_line(e, a, "{\"ok\":true,\"id\":1}");
    expect_line(e, a, "{\"ok\":true,\"id\":2}");
    for (int i = 0; i < 50; i++)
        uv_run(&e->loop, UV_RUN_NOWAIT);
    client_send(a, "{\"op\":\"contains\",\"key\":\"late\",\"id\":3}\n");
    expect_line(e, a, "{\"ok\":true,\"exists\":false,\"id\":3}");
    close(a);
}

/* A client that goes releases everything at once; the set forgets it once
 * libuv has closed its handle, and tells its owner. */
static void test_disconnect_releases(void **state)
{
    struct env *e = *state;
    int a = client_open(e, 1234), got;
    struct store_stats st;
    char buf[1024];

    client_send(a, "{\"op\":\"hello\",\"version\":1}\n"
                   "{\"op\":\"alloc\",\"key\":\"p\",\"size\":100}\n"
                   "{\"op\":\"alloc\",\"key\":\"q\",\"size\":100}\n"
                   "{\"op\":\"commit\",\"key\":\"q\"}\n"
                   "{\"op\":\"get\",\"key\":\"q\"}\n");
    assert_true(read_line(e, a, buf, sizeof(buf), &got) > 0);
    close(got);
    for (int i = 0; i < 4; i++)
        assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    store_counts(e->f.store, &st);
    assert_int_equal(st.pending, 1);
    assert_int_equal(st.pinned, 1);
    assert_int_equal(conn_set_count_uid(&e->set, 1234), 1);
    assert_int_equal(e->set.count, 1);
    close(a);
    for (int i = 0; i < 200 && e->freed == 0; i++) {
        uv_run(&e->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(e->freed, 1);
    assert_int_equal(e->set.count, 0);
    assert_int_equal(e->f.env.clients, 0);
    assert_int_equal(conn_set_count_uid(&e->set, 1234), 0);
    store_counts(e->f.store, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.objects, 1); /* committed: it stays */
}

/* Connections are counted per uid for --max-clients-per-uid. */
static void test_count_uid(void **state)
{
    struct env *e = *state;
    int a = client_open(e, 1000), b = client_open(e, 1000), c = client_open(e, 7);

    assert_int_equal(conn_set_count_uid(&e->set, 1000), 2);
    assert_int_equal(conn_set_count_uid(&e->set, 7), 1);
    assert_int_equal(conn_set_count_uid(&e->set, 8), 0);
    assert_int_equal(e->set.count, 3);
    close(a);
    close(b);
    close(c);
}

/* --hello-timeout: a connection silent that long gets one ETIMEDOUT line
 * and is closed. */
static void test_hello_timeout(void **state)
{
    struct env *e = *state;
    int a;

    e->policy.hello_timeout_ms = 50;
    a = client_open(e, getuid());
    expect_line(e, a,
                "{\"ok\":false,\"error\":\"ETIMEDOUT\",\"message\":\"No hello within 50 ms "
                "of connecting (--hello-timeout); closing the connection. Send "
                "{\\\"op\\\":\\\"hello\\\",\\\"version\\\":1} first.\"}");
    assert_true(closed_by_peer(e, a));
    close(a);
}

/* A line longer than SHMB_MAX_LINE is answered EMSGSIZE, then the
 * connection closes. */
static void test_oversized_line(void **state)
{
    struct env *e = *state;
    int a = client_open(e, getuid());
    size_t n = SHMB_MAX_LINE + 100;
    char *big = malloc(n + 1), buf[512];

    assert_non_null(big);
    memset(big, 'x', n);
    big[n] = '\0';
    client_send(a, big);
    assert_true(read_line(e, a, buf, sizeof(buf), NULL) > 0);
    assert_non_null(strstr(buf, "\"error\":\"EMSGSIZE\""));
    assert_true(closed_by_peer(e, a));
    free(big);
    close(a);
}

/* The client's half-close: what it sent before still runs and is answered,
 * then the connection closes. */
static void test_half_close_runs_input(void **state)
{
    struct env *e = *state;
    int a = client_open(e, getuid()), got;
    char buf[1024];

    client_send(a, "{\"op\":\"hello\",\"version\":1}\n"
                   "{\"op\":\"contains\",\"key\":\"a\",\"id\":9}\n");
    assert_int_equal(shutdown(a, SHUT_WR), 0);
    assert_true(read_line(e, a, buf, sizeof(buf), &got) > 0);
    close(got);
    expect_line(e, a, "{\"ok\":true,\"exists\":false,\"id\":9}");
    assert_true(closed_by_peer(e, a));
    close(a);
}

/* The listener: with --max-clients 1, a second client is refused with one
 * EDQUOT line naming the flag; the first is served. */
static void test_server_max_clients(void **state)
{
    struct env *e = *state;
    struct server srv;
    struct shmb_error err = {0};
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    char dir[] = "/tmp/shmb-test-conn-XXXXXX", path[108], buf[1024];
    int fd, a, b, got;

    conn_set_close(&e->set); /* the server keeps its own set */
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    e->policy.max_clients = 1;
    assert_int_equal(server_bind(path, 0600, &fd, &err), 0);
    assert_int_equal(
        server_listen(&srv, &e->loop, fd, path, &e->f.env, &e->policy, &err), 0);
    memcpy(sun.sun_path, path, strlen(path) + 1);
    a = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(a, (struct sockaddr *)&sun, sizeof(sun)), 0);
    client_send(a, "{\"op\":\"hello\",\"version\":1}\n");
    assert_true(read_line(e, a, buf, sizeof(buf), &got) > 0);
    assert_non_null(strstr(buf, "\"ok\":true"));
    close(got);
    b = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_int_equal(connect(b, (struct sockaddr *)&sun, sizeof(sun)), 0);
    expect_line(e, b,
                "{\"ok\":false,\"error\":\"EDQUOT\",\"message\":\"max-clients (1) reached; "
                "try again when a client disconnects, or raise --max-clients.\"}");
    assert_true(closed_by_peer(e, b));
    close(a);
    close(b);
    server_close(&srv);
    uv_run(&e->loop, UV_RUN_DEFAULT); /* srv's handles close before it goes */
    assert_int_equal(access(path, F_OK), -1); /* unlinked */
    assert_int_equal(rmdir(dir), 0);
    /* teardown closes the (already closed) set again: harmless. */
}

/* A second daemon never displaces a live one: the probe says so. */
static void test_server_probe_live(void **state)
{
    struct env *e = *state;
    struct server srv;
    struct shmb_error err = {0};
    char dir[] = "/tmp/shmb-test-conn-XXXXXX", path[108];
    int fd;

    conn_set_close(&e->set);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    assert_int_equal(server_probe(path, &err), 0);
    assert_int_equal(server_bind(path, 0600, &fd, &err), 0);
    assert_int_equal(server_listen(&srv, &e->loop, fd, path, &e->f.env, &e->policy, &err),
                     0);
    assert_int_equal(server_probe(path, &err), -EADDRINUSE);
    assert_non_null(strstr(err.message, "another shmbrokerd is listening on"));
    server_close(&srv);
    uv_run(&e->loop, UV_RUN_DEFAULT); /* srv's handles close before it goes */
    assert_int_equal(server_probe(path, &err), 0);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hello_passes_descriptor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_then_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_disconnect_releases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_paused_wait_sees_close, setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hello_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_half_close_runs_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_max_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_probe_live, setup, teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
