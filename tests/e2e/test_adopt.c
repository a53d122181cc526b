/*
 * End-to-end tests of what a read-write client can do to the segment it
 * maps, around a restart: it writes the header page while the daemon runs,
 * or between a SIGKILL and the next start, or damages a chunk header. The
 * daemon answers from its own values, treats the header as a hint, proves a
 * live owner by the segment's lock, and never hands out space over a
 * committed object. The test plays the hostile client: it opens the
 * segment file read-write and maps it, as any client of the same user can.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* The segment's header page, mapped read-write as a hostile client maps it.
 * The caller unmaps it with unmap_header. */
static struct shmb_segment_header *map_header(const struct h_daemon *d)
{
    char path[PATH_MAX * 2];
    void *p;
    int fd;

    h_segment_path(d, path, sizeof(path));
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        h_fail("cannot open %s read-write: %s", path, strerror(errno));
    p = mmap(NULL, SHMB_HEADER_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        h_fail("cannot map %s: %s", path, strerror(errno));
    return p;
}

static void unmap_header(struct shmb_segment_header *h)
{
    munmap(h, SHMB_HEADER_PAGE);
}

/* Restart d1's segment and socket in a new daemon; fail unless it serves. */
static struct h_daemon *restart(struct h_fix *f, const struct h_daemon *d1, const char *why)
{
    struct h_daemon *d = h_daemon_again(f, d1);

    assert_true(h_daemon_spawn(f, d, NULL) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("the daemon refused to start after %s (exit %d)", why,
               h_exit_code(d->status));
    }
    return d;
}

/* Issue 10, item 5. A client that writes data_offset and data_size in the
 * header page of a running daemon changes nothing for the others: hello
 * answers from the daemon's own values, and new clients connect, put and
 * get. Before the fix hello passed the client's numbers on and every later
 * connect failed with EPROTO. */
static void test_hello_ignores_header(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct shmb_segment_header *h = map_header(d);
    struct h_conn raw;
    json_t *hello;
    shmb_t *c;

    h->data_offset = 0;
    h->data_size = UINT64_C(1) << 40;
    hello = h_open_hello(&raw, d);
    assert_int_equal(h_int(hello, "data_offset"), SHMB_HEADER_PAGE);
    assert_int_equal(h_int(hello, "data_size"), 1024 * 1024 - SHMB_HEADER_PAGE);
    json_decref(hello);
    h_conn_close(&raw);
    c = h_lib_connect(d, "after", 0);
    ok(c, h_put_pattern(c, "k", 5000, 7, 0));
    get_check(c, "k", 5000, 7);
    shmb_close(c);
    unmap_header(h);
    h_pass(f);
}

/* Issue 10, item 5. Between a SIGKILL and the next start a client writes
 * the header page: magic 0, then owner pid 1 with start time 0 (a process
 * that is alive), then data offset 0. Each time the next daemon adopts the
 * segment, says the header was rebuilt, and every committed object comes
 * back byte for byte. Before the fix the start refused with EEXIST, EBUSY
 * and EINVAL, stranding the objects until --fresh. */
static void test_restart_damaged_header(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    struct shmb_segment_header *h;
    shmb_t *c;
    int round;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "a", 3000, 1, 0));
    ok(c, h_put_pattern(c, "b", 70000, 2, 1));
    shmb_close(c);
    d = d1;
    for (round = 0; round < 3; round++) {
        assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                         128 + SIGKILL);
        h = map_header(d1);
        if (round == 0) {
            h->magic = 0;
        } else if (round == 1) {
            h->owner_pid = 1;
            h->owner_start = 0;
        } else {
            h->data_offset = 0;
        }
        unmap_header(h);
        d = restart(f, d1, round == 0   ? "magic 0"
                           : round == 1 ? "owner pid 1"
                                        : "data offset 0");
        h_wait_log(d, "restored 2 objects");
        if (round != 1)
            h_wait_log(d, "header page damaged");
        c = h_lib_connect(d, "r", 0);
        get_check(c, "a", 3000, 1);
        shmb_close(c);
        h = map_header(d);
        assert_int_equal(h->magic, SHMB_SEGMENT_MAGIC);
        assert_int_equal(h->data_offset, SHMB_HEADER_PAGE);
        assert_int_equal(h->owner_pid, d->pid);
        unmap_header(h);
    }
    h_pass(f);
}

/* Issue 10, item 5. A second daemon started on the segment of a running one
 * refuses, even when a client rewrote the owner in the header to a process
 * that is gone: the running daemon's lock is the proof. The first daemon
 * and its objects are untouched. Before the fix the second daemon took the
 * pid in the header for the truth and adopted the live segment. */
static void test_live_owner_by_lock(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d2;
    struct shmb_segment_header *h;
    shmb_t *c;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "a", 3000, 1, 0));
    h = map_header(d1);
    h->owner_pid = 0;
    h->owner_start = 0;
    unmap_header(h);
    d2 = h_daemon_again(f, d1);
    h_path(f, "second.sock", d2->socket, sizeof(d2->socket));
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(d2, H_RUN_TIMEOUT_MS)), 1);
    h_wait_log(d2, "belongs to a running shmbrokerd");
    get_check(c, "a", 3000, 1);
    ok(c, h_put_pattern(c, "b", 3000, 2, 0));
    get_check(c, "b", 3000, 2);
    shmb_close(c);
    h_assert_alive(d1);
    h_pass(f);
}

/* The offset of key's payload, by a raw get (the pin goes with the daemon). */
static long long offset_of(const struct h_daemon *d, const char *key)
{
    struct h_conn raw;
    char line[128];
    json_t *reply;
    long long offset;

    json_decref(h_open_hello(&raw, d));
    snprintf(line, sizeof(line), "{\"op\":\"get\",\"key\":\"%s\"}", key);
    reply = h_call(&raw, line);
    h_assert_ok(reply);
    offset = h_int(reply, "offset");
    json_decref(reply);
    h_conn_close(&raw);
    return offset;
}

/* Issue 10, item 1. The ring wraps: "b" is the first chunk of a new lap,
 * after a skipped tail gap, and its header is damaged before the restart.
 * The adoption keeps "z" and "a"; deleting "a" (the newest adopted object)
 * and putting "c" must not touch "z". Before the fix the ring's end stayed
 * after the gap, the delete moved it back to the start, and "c" was placed
 * over "z", whose get then returned "c"'s bytes. */
static void test_restart_wrapped_damaged(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    static const uint32_t bad_magic = 0xdeadbeef;
    char seg[PATH_MAX * 2];
    long long b_offset;
    shmb_t *c;
    int fd;

    c = h_lib_connect(d1, "w", 0);
    ok(c, h_put_pattern(c, "x", 500000, 1, 0));
    ok(c, h_put_pattern(c, "z", 200000, 2, 0));
    ok(c, h_put_pattern(c, "a", 200000, 3, 0));
    ok(c, shmb_delete(c, "x"));
    ok(c, h_put_pattern(c, "b", 300000, 4, 0)); /* does not fit before the end */
    shmb_close(c);
    b_offset = offset_of(d1, "b");
    assert_true(b_offset < 300000); /* it started a new lap */
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    /* "b" has a one-byte key: its chunk header is the 64 bytes before it. */
    h_segment_path(d1, seg, sizeof(seg));
    fd = open(seg, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &bad_magic, sizeof(bad_magic), (off_t)(b_offset - 64)),
                     (ssize_t)sizeof(bad_magic));
    close(fd);

    d = restart(f, d1, "a damaged chunk header");
    h_wait_log(d, "restored 2 objects");
    c = h_lib_connect(d, "r", 0);
    ok(c, shmb_delete(c, "a"));
    ok(c, h_put_pattern(c, "c", 200000, 5, 0));
    get_check(c, "z", 200000, 2);
    get_check(c, "c", 200000, 5);
    shmb_close(c);
    h_pass(f);
}

/* Put n empty-looking 8-byte objects named <prefix><i>, by batches of
 * alloc and commit over a raw connection: a long ring to walk. */
static void fill_small(const struct h_daemon *d, const char *prefix, int n)
{
    enum { PER_BATCH = 500 };
    static char line[PER_BATCH * 160 + 64];
    struct h_conn raw;
    int i, b;

    json_decref(h_open_hello(&raw, d));
    for (b = 0; b < n; b += PER_BATCH) {
        size_t len = (size_t)snprintf(line, sizeof(line), "{\"op\":\"batch\",\"ops\":[");
        json_t *reply;

        for (i = b; i < n && i < b + PER_BATCH; i++)
            len += (size_t)snprintf(line + len, sizeof(line) - len,
                                    "%s{\"op\":\"alloc\",\"key\":\"%s%d\",\"size\":8},"
                                    "{\"op\":\"commit\",\"key\":\"%s%d\"}",
                                    i == b ? "" : ",", prefix, i, prefix, i);
        snprintf(line + len, sizeof(line) - len, "]}");
        reply = h_call(&raw, line);
        h_assert_ok(reply);
        json_decref(reply);
    }
    h_conn_close(&raw);
}

/* Whether pid has path mapped (the daemon maps the segment, then walks it). */
static bool maps_path(pid_t pid, const char *path)
{
    char maps[64], *text;
    bool found;

    snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)pid);
    text = h_read_file(maps, NULL);
    if (text == NULL)
        return false;
    found = strstr(text, path) != NULL;
    free(text);
    return found;
}

/* Issue 10, item 4, during adoption. A client keeps its read-write
 * descriptor across a SIGKILL of the daemon and truncates the file as soon
 * as the next daemon has mapped it, while that daemon walks a ring of
 * 100,000 chunks. The daemon must not die of SIGBUS: the walk ends where
 * the file ends (what was read is kept) and the daemon serves, refusing
 * allocations with a message naming the truncation; or, when the header
 * copy itself faulted, the start is refused with a clear message. A round
 * whose truncation came after the walk is retried (up to 6). Before the
 * fix the walk read the mapping unguarded and the daemon died of SIGBUS. */
static void test_truncated_during_adoption(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "16M", NULL), *d2 = h_daemon_again(f, d1);
    const char *walk = "truncated under the walk", *copy = "while it was being adopted";
    char seg[PATH_MAX * 2], prefix[16], *text;
    int round, fd, before, after, hits = 0;
    struct h_conn raw;
    uint64_t t0;

    h_segment_path(d1, seg, sizeof(seg));
    for (round = 0; round < 6 && hits == 0; round++) {
        snprintf(prefix, sizeof(prefix), "r%dk", round);
        fill_small(d1, prefix, 100000);
        fd = open(seg, O_RDWR | O_CLOEXEC); /* the descriptor a client kept */
        assert_true(fd >= 0);
        assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                         128 + SIGKILL);
        text = h_log_text(d2);
        before = h_count(text, walk) + h_count(text, copy);
        free(text);
        assert_true(h_daemon_spawn(f, d2, NULL) > 0);
        t0 = h_now_ms();
        while (!maps_path(d2->pid, seg) && h_now_ms() - t0 < H_READY_TIMEOUT_MS)
            ;
        assert_int_equal(ftruncate(fd, 8192), 0);
        close(fd);
        if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0) {
            if (WIFSIGNALED(d2->status)) {
                h_daemon_print_log(d2);
                h_fail("the adopting daemon died of signal %d", WTERMSIG(d2->status));
            }
            h_wait_log(d2, copy); /* the start refused, saying why */
            hits++;
        } else {
            text = h_log_text(d2);
            after = h_count(text, walk) + h_count(text, copy);
            free(text);
            if (after > before) {
                hits++;
                /* It serves, and says what happened to whoever connects. */
                assert_int_equal(h_conn_open(&raw, d2->socket), 0);
                h_expect_error(&raw, "{\"op\":\"hello\",\"version\":1,\"name\":\"e2e\"}",
                               "EIO", "truncated");
                h_conn_close(&raw);
            }
            /* Still running (not dead of SIGBUS) until this SIGKILL. */
            assert_int_equal(h_exit_code(h_daemon_signal(d2, SIGKILL, H_STOP_TIMEOUT_MS)),
                             128 + SIGKILL);
        }
        /* The next start grows the file back and serves from it. */
        assert_true(h_daemon_spawn(f, d1, NULL) > 0);
        if (h_daemon_wait_ready(d1, H_READY_TIMEOUT_MS) < 0) {
            h_daemon_print_log(d1);
            h_fail("no restart after the truncation (exit %d)", h_exit_code(d1->status));
        }
    }
    if (hits == 0)
        h_fail("in 6 rounds the truncation never came during the adoption");
    h_pass(f);
}

/* Issue 10, item 3 (second review). Writer A allocates 64 bytes, B the next
 * 64, and A writes 65: its last byte lands on B's chunk-header magic. The
 * running daemon never reads headers back; after a SIGKILL the restart
 * loses B only: the walk resynchronises on the next sound header, and the
 * ten objects before and the hundred after come back byte for byte. The
 * space B held is reclaimed in its turn (puts then fill the ring). Before
 * the fix the walk stopped at B and dropped every object after it. */
static void test_overrun_loses_one_object(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "1M", NULL), *d;
    char key[32];
    void *pa, *pb;
    shmb_t *c;
    int i;

    c = h_lib_connect(d1, "w", 0);
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "old%d", i);
        ok(c, h_put_pattern(c, key, 64, (uint32_t)i, 0));
    }
    ok(c, shmb_alloc(c, "A", 64, 0, &pa));
    ok(c, shmb_alloc(c, "B", 64, 0, &pb));
    assert_ptr_equal((char *)pb, (char *)pa + 64 + 64); /* B's header between */
    memset(pb, 'b', 64);
    memset(pa, 'a', 65); /* one byte too many */
    ok(c, shmb_commit(c, "A"));
    ok(c, shmb_commit(c, "B"));
    for (i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "new%d", i);
        ok(c, h_put_pattern(c, key, 64, (uint32_t)(100 + i), 0));
    }
    shmb_close(c);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);

    d = restart(f, d1, "an overrun into a chunk header");
    h_wait_log(d, "restored 111 objects");
    h_wait_log(d, "Skipped 128 damaged bytes in 1 place(s)");
    c = h_lib_connect(d, "r", 0);
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "old%d", i);
        get_check(c, key, 64, (uint32_t)i);
    }
    for (i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "new%d", i);
        get_check(c, key, 64, (uint32_t)(100 + i));
    }
    fails(c, shmb_get(c, "B", &(const void *){NULL}, &(size_t){0}), -ENOENT, NULL);
    /* Everything can go, B's bytes included: the ring then takes two
     * objects that fill nearly all of it. */
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "old%d", i);
        ok(c, shmb_delete(c, key));
    }
    ok(c, shmb_delete(c, "A"));
    for (i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "new%d", i);
        ok(c, shmb_delete(c, key));
    }
    ok(c, h_put_pattern(c, "big1", 500000, 7, 0));
    ok(c, h_put_pattern(c, "big2", 500000, 8, 0));
    get_check(c, "big1", 500000, 7);
    get_check(c, "big2", 500000, 8);
    shmb_close(c);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_hello_ignores_header),
        TEST(test_restart_damaged_header),
        TEST(test_live_owner_by_lock),
        TEST(test_restart_wrapped_damaged),
        TEST(test_truncated_during_adoption),
        TEST(test_overrun_loses_one_object),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
