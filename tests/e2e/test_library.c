// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the library's own edges: the names it gives codes
 * (0, codes outside the protocol's table), sizes it refuses before anything
 * is sent, and a descriptor whose header is not a shmbroker segment's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "shmbroker.h"

/* 0 is "OK"; the protocol's codes keep their names; any other code gets its
 * own errno name (or E and its number), never the EIO of a real I/O error. */
static void test_code_names(void **state)
{
    struct h_fix *f = *state;
    shmb_t *c = shmb_new();
    char path[200];

    assert_non_null(c);
    assert_string_equal(shmb_strerror(0), "OK");
    assert_string_equal(shmb_strerror(-ENOSPC), "ENOSPC");
    assert_string_equal(shmb_strerror(-EIO), "EIO");
    assert_string_equal(shmb_strerror(-EACCES), "EACCES");
    assert_string_equal(shmb_strerror(-ENAMETOOLONG), "ENAMETOOLONG");
    assert_string_equal(shmb_strerror(-ECHILD), "ECHILD");
    assert_string_equal(shmb_strerror(-4000), "E4000");
    assert_string_equal(shmb_errname(c), "OK");
    /* A socket path the library cannot use: its own code, named honestly. */
    memset(path, 'p', sizeof(path) - 1);
    path[sizeof(path) - 1] = '\0';
    assert_int_equal(shmb_connect(c, path, NULL), -ENAMETOOLONG);
    assert_string_equal(shmb_errname(c), "ENAMETOOLONG");
    shmb_close(c);
    h_pass(f);
}

/* A size the protocol cannot carry (2^63 bytes or more) is refused by the
 * library with E2BIG, in the daemon's words, before anything is sent: for
 * alloc, put and put_many (which then sends nothing at all). */
static void test_huge_sizes_refused(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = h_lib_connect(d, "c", 0);
    const size_t huge[] = {(size_t)1 << 63, SIZE_MAX};
    const char *keys[3] = {"huge-0", "huge-1", "huge-2"};
    const void *data[3] = {"a", "b", "c"};
    size_t sizes[3] = {1, 0, 1};
    int results[3], i;
    void *dst = (void *)1;
    shmb_stats_t before, after;

    ok(c, shmb_stats(c, &before));
    for (i = 0; i < 2; i++) {
        fails(c, shmb_alloc(c, "huge", huge[i], 0, &dst), -E2BIG, "exceeds max object size");
        assert_null(dst);
        fails(c, shmb_put(c, "huge", "x", huge[i], 0), -E2BIG, "exceeds max object size");
        sizes[1] = huge[i];
        fails(c, shmb_put_many(c, 3, keys, data, sizes, 0, results), -E2BIG,
              "sizes[1] of 3");
        assert_int_equal(results[0], -E2BIG);
        assert_int_equal(results[1], -E2BIG);
        assert_int_equal(results[2], -E2BIG);
    }
    ok(c, shmb_stats(c, &after));
    assert_int_equal(after.allocs, before.allocs);
    assert_int_equal(shmb_contains(c, "huge"), 0);
    assert_int_equal(shmb_contains(c, "huge-0"), 0);
    /* The connection is untouched: the next call works. */
    ok(c, shmb_put(c, "small", "x", 1, 0));
    shmb_close(c);
    h_pass(f);
}

/* A one-connection stand-in for the daemon: answers hello with a real
 * daemon's reply line, passing a descriptor of a file whose header is zeros. */
struct fake_hello {
    int listen_fd;
    int seg_fd;
    char *reply; /* the reply line, '\n' included */
};

static int fake_hello_serve(void *arg)
{
    struct fake_hello *fh = arg;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = fh->reply, .iov_len = strlen(fh->reply)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    struct cmsghdr *cmsg;
    char c;
    int fd = accept(fh->listen_fd, NULL, NULL);

    if (fd < 0)
        return 1;
    while (read(fd, &c, 1) == 1 && c != '\n')
        ;
    memset(&control, 0, sizeof(control));
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fh->seg_fd, sizeof(int));
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != (ssize_t)iov.iov_len)
        return 1;
    while (read(fd, &c, 1) > 0) /* until the client closes */
        ;
    close(fd);
    return 0;
}

/* With the segment header's magic number zeroed, connecting says that the
 * descriptor is not a shmbroker segment, rather than quoting a magic and a
 * version as if the layout were merely another release's. The daemon writes
 * its header page again at every hello, so a stand-in passes the damaged
 * descriptor, with the hello reply a real daemon gave. */
static void test_not_a_segment(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct fake_hello fh;
    struct h_conn raw;
    shmb_t *c = shmb_new();
    char path[PATH_MAX], *line;
    json_t *reply;
    pid_t pid;
    int rc;

    reply = h_open_hello(&raw, d);
    /* The library's hello is its request 1. */
    assert_int_equal(json_object_set_new(reply, "id", json_integer(1)), 0);
    line = json_dumps(reply, JSON_COMPACT);
    assert_non_null(line);
    fh.reply = malloc(strlen(line) + 2);
    assert_non_null(fh.reply);
    sprintf(fh.reply, "%s\n", line);
    free(line);
    json_decref(reply);
    h_conn_close(&raw);

    h_path(f, "zeros", path, sizeof(path));
    fh.seg_fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fh.seg_fd >= 0);
    assert_int_equal(ftruncate(fh.seg_fd, 4 << 20), 0);
    h_path(f, "fake.sock", addr.sun_path, sizeof(addr.sun_path));
    fh.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fh.listen_fd >= 0);
    assert_int_equal(bind(fh.listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    assert_int_equal(listen(fh.listen_fd, 1), 0);
    pid = h_fork(f, fake_hello_serve, &fh);
    rc = shmb_connect(c, addr.sun_path, "c");
    fails(c, rc, -EPROTO, "not a shmbroker segment");
    shmb_close(c);
    assert_int_equal(h_child_wait(f, pid, H_STOP_TIMEOUT_MS), 0);
    close(fh.listen_fd);
    close(fh.seg_fd);
    free(fh.reply);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_code_names),
        TEST(test_huge_sizes_refused),
        TEST(test_not_a_segment),
    };

    return cmocka_run_group_tests_name("test_library", tests, NULL, NULL);
}
