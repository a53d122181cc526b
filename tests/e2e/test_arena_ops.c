// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of arenas over raw sockets against the real daemon: a
 * client maps the segment it receives at hello, takes an arena, lays its
 * payloads out there itself (taking the arena's lock around the copy, as
 * the library does) and commits them with commit_at; another client gets
 * them byte for byte. A writer killed with SIGKILL mid-way loses only what
 * it had not committed, and a daemon restart keeps what was committed.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* A raw client with the segment mapped read-write, and its arena. */
struct aclient {
    struct h_conn c;
    unsigned char *base;
    size_t size;
    uint64_t arena, arena_size, cursor; /* the arena's first byte and next free one */
    uint64_t token; /* the token the arena's lock word carries (the grant's "token") */
};

/* Connect, say hello and map the segment passed with the reply: 0, or -1
 * (no cmocka asserts: helper processes use it too). */
static int aclient_open(struct aclient *a, const struct h_daemon *d)
{
    char *line = NULL;
    json_t *reply;
    json_int_t size = 0;
    void *p;

    memset(a, 0, sizeof(*a));
    if (h_conn_open(&a->c, d->socket) < 0 ||
        h_conn_sendline(&a->c, "{\"op\":\"hello\",\"version\":1}") < 0 ||
        h_conn_recv_line(&a->c, &line, H_REPLY_TIMEOUT_MS) < 0)
        return -1;
    reply = json_loads(line, 0, NULL);
    free(line);
    if (reply == NULL || json_unpack(reply, "{s:I}", "size", &size) != 0 || a->c.nfds < 1) {
        json_decref(reply);
        return -1;
    }
    json_decref(reply);
    p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, a->c.fds[a->c.nfds - 1],
             0);
    if (p == MAP_FAILED)
        return -1;
    a->base = p;
    a->size = (size_t)size;
    return 0;
}

static void aclient_close(struct aclient *a)
{
    if (a->base != NULL)
        munmap(a->base, a->size);
    a->base = NULL;
    h_conn_close(&a->c);
}

/* One request and its reply, parsed; NULL on failure. The caller frees. */
static json_t *acall(struct aclient *a, const char *request)
{
    char *line = NULL;
    json_t *reply;

    if (h_conn_sendline(&a->c, request) < 0 ||
        h_conn_recv_line(&a->c, &line, H_REPLY_TIMEOUT_MS) < 0)
        return NULL;
    reply = json_loads(line, 0, NULL);
    free(line);
    return reply;
}

/* Take an arena of size bytes: 0 or -1. */
static int aclient_arena(struct aclient *a, uint64_t size)
{
    char req[96];
    json_t *reply;
    json_int_t off = 0, got = 0, token = 0;
    int rc = -1;

    snprintf(req, sizeof(req), "{\"op\":\"arena\",\"size\":%llu}", (unsigned long long)size);
    reply = acall(a, req);
    if (reply != NULL && json_is_true(json_object_get(reply, "ok")) &&
        json_unpack(reply, "{s:I, s:I, s:I}", "offset", &off, "size", &got, "token", &token) ==
            0 &&
        token > 0 && (token & 3) == 0) {
        a->arena = a->cursor = (uint64_t)off;
        a->token = (uint64_t)token;
        a->arena_size = (uint64_t)got;
        rc = 0;
    }
    json_decref(reply);
    return rc;
}

/* The arena's lock: the seal of its header, 64 bytes before its first byte. */
static uint64_t *arena_seal(struct aclient *a)
{
    return (uint64_t *)(a->base + a->arena - 64 + offsetof(struct shmb_chunk_header, seal));
}

/* Lay the payload of key (size bytes of pattern seed) at the cursor under
 * the arena's lock, as the library does; the chunk's offset in *at. 0, or
 * -1 when the arena is revoked or too full. */
static int aclient_lay(struct aclient *a, const char *key, uint64_t size, uint32_t seed,
                       uint64_t *at)
{
    uint64_t chunk = SHMB_CHUNK_SIZE(strlen(key), size);
    uint64_t idle = SHMB_ARENA_WORD(a->token, SHMB_ARENA_IDLE);

    if (a->cursor + chunk > a->arena + a->arena_size)
        return -1;
    if (!__atomic_compare_exchange_n(arena_seal(a), &idle, SHMB_ARENA_WORD(a->token, SHMB_ARENA_BUSY),
                                     false, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE))
        return -1;
    h_fill(a->base + a->cursor + SHMB_CHUNK_HEADER_SIZE(strlen(key)), size, seed);
    __atomic_store_n(arena_seal(a), SHMB_ARENA_WORD(a->token, SHMB_ARENA_IDLE), __ATOMIC_RELEASE);
    *at = a->cursor;
    return 0;
}

/* A put through the arena: lay it out, commit_at (noreply, or waiting for
 * its reply, which must name the payload). 0 or -1. */
static int aclient_put(struct aclient *a, const char *key, uint64_t size, uint32_t seed,
                       bool noreply)
{
    char req[512];
    json_t *reply;
    json_int_t off = 0, got = 0;
    uint64_t at;
    int rc = -1;

    if (aclient_lay(a, key, size, seed, &at) < 0)
        return -1;
    snprintf(req, sizeof(req),
             "{\"op\":\"commit_at\",\"key\":\"%s\",\"offset\":%llu,\"size\":%llu%s}", key,
             (unsigned long long)at, (unsigned long long)size,
             noreply ? ",\"noreply\":true" : "");
    a->cursor += SHMB_CHUNK_SIZE(strlen(key), size);
    if (noreply)
        return h_conn_sendline(&a->c, req) < 0 ? -1 : 0;
    reply = acall(a, req);
    if (reply != NULL && json_is_true(json_object_get(reply, "ok")) &&
        json_unpack(reply, "{s:I, s:I}", "offset", &off, "size", &got) == 0 &&
        (uint64_t)off == at + SHMB_CHUNK_HEADER_SIZE(strlen(key)) && (uint64_t)got == size)
        rc = 0;
    else if (reply != NULL) {
        char *text = json_dumps(reply, JSON_COMPACT);

        fprintf(stderr, "commit_at '%s': %s\n", key, text != NULL ? text : "?");
        free(text);
    }
    json_decref(reply);
    return rc;
}

/* get key through r, compare its bytes with the pattern, release it. */
static void get_check(struct aclient *r, const char *key, uint64_t size, uint32_t seed)
{
    char req[320];
    json_t *reply;
    long long off;

    snprintf(req, sizeof(req), "{\"op\":\"get\",\"key\":\"%s\"}", key);
    reply = acall(r, req);
    if (reply == NULL)
        h_fail("no reply to get '%s'", key);
    h_assert_ok(reply);
    off = h_int(reply, "offset");
    assert_int_equal(h_int(reply, "size"), (long long)size);
    json_decref(reply);
    if (h_check(r->base + off, size, seed) != size)
        h_fail("'%s': byte %zu differs from what was put", key,
               h_check(r->base + off, size, seed));
    snprintf(req, sizeof(req), "{\"op\":\"release\",\"key\":\"%s\"}", key);
    h_expect_ok(&r->c, req);
}

static void open_ok(struct aclient *a, const struct h_daemon *d)
{
    if (aclient_open(a, d) < 0)
        h_fail("cannot connect to and map the daemon's segment");
}

/* A writer takes an arena and puts through it (with and without noreply,
 * payloads of 1 byte to 100 KB); a reader on another connection gets each
 * byte-exact; list shows them as ordinary objects. */
static void test_put_and_get(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct aclient w, r;
    json_t *reply;

    open_ok(&w, d);
    open_ok(&r, d);
    assert_int_equal(aclient_arena(&w, 256 * 1024), 0);
    assert_int_equal(w.arena % 64, 0);
    assert_int_equal(aclient_put(&w, "one", 1, 1, false), 0);
    assert_int_equal(aclient_put(&w, "two", 4096, 2, true), 0);
    assert_int_equal(aclient_put(&w, "three", 100000, 3, false), 0);
    /* The noreply one is visible: a later request of its connection was
     * answered. */
    get_check(&r, "one", 1, 1);
    get_check(&r, "two", 4096, 2);
    get_check(&r, "three", 100000, 3);
    reply = h_call(&r.c, "{\"op\":\"list\"}");
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 3);
    json_decref(reply);
    aclient_close(&w);
    aclient_close(&r);
    h_pass(f);
}

/* One arena takes SHMB_ARENA_MAX_OBJECTS objects and refuses the next with
 * ESTALE, which asks for a new arena; the new one takes it. Its chunk goes
 * with all its objects at once when reclaim comes to it: a 128 MiB arena of
 * 128-byte chunks held a million objects, and the alloc that reclaimed them
 * stalled every client for half a second. */
static void test_arena_objects_bounded(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "32M", NULL);
    struct aclient w;
    char key[32], req[160];
    json_t *reply;
    uint64_t at;
    int i;

    open_ok(&w, d);
    assert_int_equal(aclient_arena(&w, 2 * 1024 * 1024), 0);
    for (i = 0; i < SHMB_ARENA_MAX_OBJECTS; i++) {
        snprintf(key, sizeof(key), "a%05d", i);
        assert_int_equal(aclient_put(&w, key, 1, (uint32_t)i, true), 0);
    }
    assert_int_equal(aclient_lay(&w, "over", 1, 7, &at), 0);
    snprintf(req, sizeof(req), "{\"op\":\"commit_at\",\"key\":\"over\",\"offset\":%llu,\"size\":1}",
             (unsigned long long)at);
    reply = acall(&w, req);
    assert_non_null(reply);
    assert_string_equal(h_str(reply, "error"), "ESTALE");
    assert_non_null(strstr(h_str(reply, "message"), "already holds 8192 objects"));
    json_decref(reply);
    reply = acall(&w, "{\"op\":\"stats\"}");
    assert_non_null(reply);
    assert_int_equal(h_int(reply, "objects"), SHMB_ARENA_MAX_OBJECTS);
    json_decref(reply);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    assert_int_equal(aclient_put(&w, "over", 1, 7, false), 0);
    aclient_close(&w);
    h_pass(f);
}

/* The library asks for a new arena before its arena holds
 * SHMB_ARENA_MAX_OBJECTS objects: 20,000 one-byte puts without waiting into
 * arenas of 4 MiB (room for 32,768 such chunks each) are all made. */
static void test_library_renews_full_arena(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "64M", NULL);
    shmb_t *c = shmb_new();
    shmb_stats_t st;
    char key[32];
    int i;

    assert_non_null(c);
    assert_int_equal(shmb_connect(c, d->socket, "many"), 0);
    shmb_set_arena(c, 4 * 1024 * 1024);
    for (i = 0; i < 20000; i++) {
        snprintf(key, sizeof(key), "n%05d", i);
        if (shmb_put_nowait(c, key, "x", 1, 0) != 0)
            h_fail("put %d: %s", i, shmb_errmsg(c));
    }
    if (shmb_sync(c) != 0)
        h_fail("shmb_sync: %s", shmb_errmsg(c));
    assert_int_equal(shmb_stats(c, &st), 0);
    assert_int_equal(st.objects, 20000);
    shmb_close(c);
    h_pass(f);
}

/* What the killed writer does, in a helper process. */
struct writer_arg {
    const struct h_daemon *d;
    struct h_signal ready;
    uint64_t arena; /* written to the pipe for the test */
};

/* Put k1 and k2, lay k3 out without committing it, say ready, wait. */
static int writer_main(void *p)
{
    struct writer_arg *arg = p;
    struct aclient w;
    uint64_t at;

    if (aclient_open(&w, arg->d) < 0 || aclient_arena(&w, 64 * 1024) < 0 ||
        aclient_put(&w, "k1", 1000, 11, false) < 0 ||
        aclient_put(&w, "k2", 2000, 12, false) < 0 ||
        aclient_lay(&w, "k3", 3000, 13, &at) < 0)
        return 1;
    if (write(arg->ready.fds[1], &w.arena, sizeof(w.arena)) != sizeof(w.arena))
        return 2;
    for (;;)
        pause();
}

/* kill -9 of the arena's holder after two commits and a third chunk laid
 * out: the two committed objects stay byte-exact, the third never shows,
 * and the arena's unused rest is free at once (the next allocation comes
 * right after k2's chunk). */
static void test_kill_writer(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    struct writer_arg arg = {.d = d};
    struct aclient r;
    json_t *reply;
    uint64_t arena = 0;
    pid_t pid;

    h_signal_open(&arg.ready);
    pid = h_fork(f, writer_main, &arg);
    assert_true(pid > 0);
    assert_true(read(arg.ready.fds[0], &arena, sizeof(arena)) == sizeof(arena));
    assert_int_equal(h_child_kill(f, pid, SIGKILL), 128 + SIGKILL);
    h_signal_close(&arg.ready);
    h_wait_log(d, "disconnected");

    open_ok(&r, d);
    get_check(&r, "k1", 1000, 11);
    get_check(&r, "k2", 2000, 12);
    h_expect_error(&r.c, "{\"op\":\"get\",\"key\":\"k3\"}", "ENOENT", NULL);
    reply = h_call(&r.c, "{\"op\":\"alloc\",\"key\":\"next\",\"size\":10}");
    h_assert_ok(reply);
    assert_int_equal(h_int(reply, "offset"),
                     (long long)(arena + SHMB_CHUNK_SIZE(2, 1000) + SHMB_CHUNK_SIZE(2, 2000) +
                                 64));
    json_decref(reply);
    aclient_close(&r);
    h_pass(f);
}

/* A daemon killed and started again on the same segment brings back the
 * objects committed into an arena, byte-exact, and a new arena works. */
static void test_restart_keeps(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d1 = h_daemon_start(f, "4M", NULL), *d2;
    struct aclient w, r;
    uint64_t at;

    open_ok(&w, d1);
    assert_int_equal(aclient_arena(&w, 128 * 1024), 0);
    assert_int_equal(aclient_put(&w, "r1", 5000, 21, false), 0);
    assert_int_equal(aclient_put(&w, "r2", 60000, 22, false), 0);
    assert_int_equal(aclient_lay(&w, "lost", 100, 23, &at), 0);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    aclient_close(&w);

    d2 = h_daemon_again(f, d1);
    assert_true(h_daemon_spawn(f, d2, NULL) > 0);
    if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0)
        h_fail("the daemon did not start again on its segment");
    h_wait_log(d2, "restored 2 objects");
    open_ok(&r, d2);
    get_check(&r, "r1", 5000, 21);
    get_check(&r, "r2", 60000, 22);
    h_expect_error(&r.c, "{\"op\":\"get\",\"key\":\"lost\"}", "ENOENT", NULL);
    assert_int_equal(aclient_arena(&r, 4096), 0);
    assert_int_equal(aclient_put(&r, "r3", 10, 24, false), 0);
    get_check(&r, "r3", 10, 24);
    aclient_close(&r);
    h_pass(f);
}

/* A held arena at the head of the ring blocks reclaim while its client
 * writes into it (lock BUSY): an alloc that waits for room gets it soon
 * after the lock goes IDLE (the daemon looks again, since nothing tells it),
 * the arena being revoked then; its client's next commit_at is ESTALE. */
static void test_wait_behind_busy_arena(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct aclient w, o;
    char req[128];
    json_t *reply;
    int i;

    open_ok(&w, d);
    open_ok(&o, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    assert_int_equal(aclient_put(&w, "in-arena", 100, 31, false), 0);
    *arena_seal(&w) = SHMB_ARENA_WORD(w.token, SHMB_ARENA_BUSY);
    for (i = 0;; i++) {
        snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":100000}", i);
        reply = h_call(&o.c, req);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            h_assert_error(reply, "ENOSPC", "arena of client");
            json_decref(reply);
            break;
        }
        json_decref(reply);
        snprintf(req, sizeof(req), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        h_expect_ok(&o.c, req);
        assert_true(i < 20);
    }
    assert_int_equal(h_conn_sendline(&o.c, "{\"op\":\"alloc\",\"key\":\"waiter\","
                                           "\"size\":100000,\"wait_ms\":60000}"),
                     0);
    h_sleep_ms(50);
    __atomic_store_n(arena_seal(&w), SHMB_ARENA_WORD(w.token, SHMB_ARENA_IDLE), __ATOMIC_RELEASE);
    /* The wait is far longer than a reply may take (H_REPLY_TIMEOUT_MS):
     * the allocation must come from the daemon looking again, not from
     * its deadline. */
    reply = h_recv_json(&o.c);
    h_assert_ok(reply);
    json_decref(reply);
    /* Its space is reused by now: the writer must not touch it again. */
    snprintf(req, sizeof(req),
             "{\"op\":\"commit_at\",\"key\":\"late\",\"offset\":%llu,\"size\":10}",
             (unsigned long long)w.cursor);
    h_expect_error(&w.c, req, "ESTALE", NULL);
    aclient_close(&w);
    aclient_close(&o);
    h_pass(f);
}

/* The arena's lock word reads REVOKED (its arena given back). */
static bool seal_revoked(void *p)
{
    struct aclient *a = p;

    return __atomic_load_n(arena_seal(a), __ATOMIC_ACQUIRE) ==
           SHMB_ARENA_WORD(a->token, SHMB_ARENA_REVOKED);
}

/* A held arena whose lock stays BUSY (a client stopped mid-copy, or one
 * that scribbled the word) past twice --alloc-timeout is looked at again
 * later, not on every turn of the loop: the idle daemon uses far less than
 * a core over two seconds (a spinning one uses about all of it). Once the
 * lock is IDLE again the arena still expires. */
static void test_busy_arena_no_spin(void **state)
{
    struct h_fix *f = *state;
    const char *const extra[] = {"--alloc-timeout", "100ms", NULL};
    struct h_daemon *d = h_daemon_start(f, "1M", extra);
    long long cpu0, cpu1, ticks = sysconf(_SC_CLK_TCK);
    struct aclient w;

    open_ok(&w, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    __atomic_store_n(arena_seal(&w), SHMB_ARENA_WORD(w.token, SHMB_ARENA_BUSY),
                     __ATOMIC_RELEASE);
    h_sleep_ms(500); /* past 2 x --alloc-timeout */
    cpu0 = h_proc_cpu_ticks(d->pid);
    h_sleep_ms(2000);
    cpu1 = h_proc_cpu_ticks(d->pid);
    assert_true(cpu0 >= 0 && cpu1 >= 0 && ticks > 0);
    if ((cpu1 - cpu0) * 10 >= 3 * ticks)
        h_fail("the idle daemon used %lld ticks (%lld a second) of CPU in 2 s behind a "
               "BUSY arena",
               cpu1 - cpu0, ticks);
    assert_false(seal_revoked(&w)); /* a BUSY arena is never taken back */
    __atomic_store_n(arena_seal(&w), SHMB_ARENA_WORD(w.token, SHMB_ARENA_IDLE),
                     __ATOMIC_RELEASE);
    if (!h_eventually(seal_revoked, &w, 3000))
        h_fail("the arena was not given back after its lock went IDLE");
    h_assert_alive(d);
    aclient_close(&w);
    h_pass(f);
}

/* A held arena whose header page a client cut off the segment file (it
 * truncated the file) cannot be looked at (its lock reads as an I/O
 * error): past --alloc-timeout it is looked at again once per timeout, not
 * on every turn of the loop, so the idle daemon uses far less than a core
 * (it spun as for a BUSY lock); once the file has its size back the daemon
 * serves on. */
static void test_cut_arena_no_spin(void **state)
{
    struct h_fix *f = *state;
    const char *const extra[] = {"--alloc-timeout", "100ms", NULL};
    struct h_daemon *d = h_daemon_start(f, "1M", extra);
    long long cpu0, cpu1, ticks = sysconf(_SC_CLK_TCK);
    struct aclient w, o;
    char path[256];
    int fd;

    open_ok(&w, d);
    open_ok(&o, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    h_segment_path(d, path, sizeof(path));
    assert_true((fd = open(path, O_RDWR)) >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(w.arena - 64) / 4096 * 4096), 0);
    h_sleep_ms(500); /* past 2 x --alloc-timeout */
    cpu0 = h_proc_cpu_ticks(d->pid);
    h_sleep_ms(2000);
    cpu1 = h_proc_cpu_ticks(d->pid);
    assert_int_equal(ftruncate(fd, (off_t)w.size), 0);
    close(fd);
    assert_true(cpu0 >= 0 && cpu1 >= 0 && ticks > 0);
    if ((cpu1 - cpu0) * 10 >= 3 * ticks)
        h_fail("the idle daemon used %lld ticks (%lld a second) of CPU in 2 s behind an "
               "arena cut off the segment file",
               cpu1 - cpu0, ticks);
    h_assert_alive(d);
    h_expect_ok(&o.c, "{\"op\":\"stats\"}");
    aclient_close(&w);
    aclient_close(&o);
    h_pass(f);
}

/* The arena's count of commits on their way (SHMB_ARENA_INFLIGHT_AT). */
static uint64_t *arena_inflight(struct aclient *a)
{
    return (uint64_t *)(a->base + a->arena - 64 + SHMB_ARENA_INFLIGHT_AT);
}

/* A client whose count of commits on their way stays above 0 (it stopped
 * between its copy and its send, or scribbled the count) holds its arena as
 * a BUSY lock does: another client's alloc that needs the arena's room
 * waits a little for those commits, then gets ENOSPC naming the arena,
 * every time, without the daemon spinning; once the count is back to 0 the
 * arena goes and the alloc fits. */
static void test_commits_on_their_way_hold_arena(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    long long cpu0, cpu1, ticks = sysconf(_SC_CLK_TCK);
    struct aclient w, o;
    char req[128];
    json_t *reply;
    int i;

    open_ok(&w, d);
    open_ok(&o, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    assert_int_equal(aclient_put(&w, "in-arena", 100, 31, false), 0);
    __atomic_store_n(arena_inflight(&w), UINT64_MAX, __ATOMIC_RELEASE);
    for (i = 0;; i++) {
        snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":100000}", i);
        reply = h_call(&o.c, req);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            h_assert_error(reply, "ENOSPC", "arena of client");
            json_decref(reply);
            break;
        }
        json_decref(reply);
        snprintf(req, sizeof(req), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        h_expect_ok(&o.c, req);
        assert_true(i < 20);
    }
    cpu0 = h_proc_cpu_ticks(d->pid);
    for (i = 0; i < 5; i++)
        h_expect_error(&o.c, "{\"op\":\"alloc\",\"key\":\"again\",\"size\":100000}",
                       "ENOSPC", "has commits on their way to it");
    cpu1 = h_proc_cpu_ticks(d->pid);
    assert_true(cpu0 >= 0 && cpu1 >= 0 && ticks > 0);
    if ((cpu1 - cpu0) * 10 >= 3 * ticks)
        h_fail("the daemon used %lld ticks of CPU (%lld a second) for 5 allocs held up by an "
               "arena's commits",
               cpu1 - cpu0, ticks);
    assert_int_equal(__atomic_load_n(arena_seal(&w), __ATOMIC_ACQUIRE),
                     SHMB_ARENA_WORD(w.token, SHMB_ARENA_IDLE));
    __atomic_store_n(arena_inflight(&w), 0, __ATOMIC_RELEASE);
    h_expect_ok(&o.c, "{\"op\":\"alloc\",\"key\":\"again\",\"size\":100000}");
    /* Taken back (its bytes may be reused already): not the writer's any more. */
    assert_true(__atomic_load_n(arena_seal(&w), __ATOMIC_ACQUIRE) !=
                SHMB_ARENA_WORD(w.token, SHMB_ARENA_IDLE));
    aclient_close(&w);
    aclient_close(&o);
    h_pass(f);
}

/* An alloc that did not ask to wait, held up by another client's commits
 * on their way, and the requests behind it still run when the client
 * half-closes right after sending them, as they did before allocs waited
 * for such commits: the alloc is answered (ENOSPC), then the get, then the
 * noreply delete runs, and the connection closes. (The wait the client did
 * not ask for was taken for one it asked for: the connection closed at once,
 * without a reply, and the delete never ran.) */
static void test_commit_wait_at_end_of_input(void **state)
{
    static const char pipelined[] =
        "{\"op\":\"alloc\",\"key\":\"big\",\"size\":100000,\"id\":1}\n"
        "{\"op\":\"contains\",\"key\":\"f0\",\"id\":2}\n"
        "{\"op\":\"delete\",\"key\":\"f0\",\"noreply\":true}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct aclient w, o, r;
    char req[128];
    json_t *reply;
    int i;

    open_ok(&w, d);
    open_ok(&o, d);
    open_ok(&r, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    /* A commit on its way that is never sent: the writer stopped after its copy. */
    __atomic_store_n(arena_inflight(&w), 1, __ATOMIC_RELEASE);
    for (i = 0;; i++) {
        snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":100000}",
                 i);
        reply = h_call(&o.c, req);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            h_assert_error(reply, "ENOSPC", "arena of client");
            json_decref(reply);
            break;
        }
        json_decref(reply);
        snprintf(req, sizeof(req), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        h_expect_ok(&o.c, req);
        assert_true(i < 20);
    }
    assert_int_equal(h_conn_send(&o.c, pipelined, strlen(pipelined)), 0);
    assert_int_equal(shutdown(o.c.fd, SHUT_WR), 0);
    reply = h_recv_json(&o.c);
    h_assert_error(reply, "ENOSPC", "arena of client");
    json_decref(reply);
    reply = h_recv_json(&o.c);
    assert_true(json_is_true(json_object_get(reply, "exists")));
    json_decref(reply);
    assert_int_equal(h_conn_wait_eof(&o.c, H_REPLY_TIMEOUT_MS), 0);
    reply = h_call(&r.c, "{\"op\":\"contains\",\"key\":\"f0\"}");
    assert_true(json_is_false(json_object_get(reply, "exists")));
    json_decref(reply);
    aclient_close(&w);
    aclient_close(&o);
    aclient_close(&r);
    h_pass(f);
}

/* The same with more than the daemon's input buffer (64 KiB) sent behind
 * the alloc: reading pauses while the alloc waits for the commits on their
 * way, and the half-close seen then must not close the connection at once
 * either: the alloc is answered, the noreply delete behind the padding runs,
 * and the contains after it is answered. (The watch for the client's going
 * while paused took the short wait for one the client asked for.) */
static void test_commit_wait_paused_at_end_of_input(void **state)
{
    static const char head[] =
        "{\"op\":\"alloc\",\"key\":\"big\",\"size\":100000,\"id\":1}\n";
    static const char tail[] = "{\"op\":\"delete\",\"key\":\"f0\",\"noreply\":true}\n"
                               "{\"op\":\"contains\",\"key\":\"f0\",\"id\":2}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct aclient w, o, r;
    size_t pad = 96 * 1024;
    char req[128], *pipelined;
    json_t *reply;
    int i;

    open_ok(&w, d);
    open_ok(&o, d);
    open_ok(&r, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    __atomic_store_n(arena_inflight(&w), 1, __ATOMIC_RELEASE);
    for (i = 0;; i++) {
        snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":100000}",
                 i);
        reply = h_call(&o.c, req);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            h_assert_error(reply, "ENOSPC", "arena of client");
            json_decref(reply);
            break;
        }
        json_decref(reply);
        snprintf(req, sizeof(req), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        h_expect_ok(&o.c, req);
        assert_true(i < 20);
    }
    /* Blank lines are no requests, but fill the daemon's input buffer. */
    pipelined = malloc(sizeof(head) + pad + sizeof(tail));
    assert_non_null(pipelined);
    memcpy(pipelined, head, sizeof(head) - 1);
    memset(pipelined + sizeof(head) - 1, '\n', pad);
    memcpy(pipelined + sizeof(head) - 1 + pad, tail, sizeof(tail));
    assert_int_equal(h_conn_send(&o.c, pipelined, strlen(pipelined)), 0);
    free(pipelined);
    assert_int_equal(shutdown(o.c.fd, SHUT_WR), 0);
    reply = h_recv_json(&o.c);
    h_assert_error(reply, "ENOSPC", "arena of client");
    json_decref(reply);
    reply = h_recv_json(&o.c);
    assert_true(json_is_false(json_object_get(reply, "exists")));
    json_decref(reply);
    assert_int_equal(h_conn_wait_eof(&o.c, H_REPLY_TIMEOUT_MS), 0);
    reply = h_call(&r.c, "{\"op\":\"contains\",\"key\":\"f0\"}");
    assert_true(json_is_false(json_object_get(reply, "exists")));
    json_decref(reply);
    aclient_close(&w);
    aclient_close(&o);
    aclient_close(&r);
    h_pass(f);
}

/* Stats' count of connections, through c. */
static long long clients_now(struct aclient *c)
{
    json_t *reply = h_call(&c->c, "{\"op\":\"stats\"}");
    long long n = h_int(reply, "clients");

    json_decref(reply);
    return n;
}

/* A client whose reading is paused behind a short wait (commits on their
 * way, 96 KiB sent behind) and that then, among the requests buffered
 * behind it, waits for room with wait_ms, is seen going while that wait
 * lasts: it pinned an object and closed, and its connection and pin go at
 * once, not when its minute is up. (The short wait does not watch for the
 * client's going; the long one must, reading still paused.) */
static void test_wait_after_paused_short_wait_sees_close(void **state)
{
    static const char head[] = "{\"op\":\"alloc\",\"key\":\"big\",\"size\":100000}\n"
                               "{\"op\":\"get\",\"key\":\"f0\"}\n"
                               "{\"op\":\"alloc\",\"key\":\"big\",\"size\":100000,"
                               "\"wait_ms\":60000}\n";
    static const char tail[] = "{\"op\":\"contains\",\"key\":\"f0\"}\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "1M", NULL);
    struct aclient w, o, r;
    size_t pad = 96 * 1024;
    char req[128], *pipelined;
    json_t *reply;
    int i;

    open_ok(&w, d);
    open_ok(&o, d);
    open_ok(&r, d);
    assert_int_equal(aclient_arena(&w, 64 * 1024), 0);
    __atomic_store_n(arena_inflight(&w), 1, __ATOMIC_RELEASE);
    for (i = 0;; i++) {
        snprintf(req, sizeof(req), "{\"op\":\"alloc\",\"key\":\"f%d\",\"size\":100000}",
                 i);
        reply = h_call(&o.c, req);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            json_decref(reply);
            break;
        }
        json_decref(reply);
        snprintf(req, sizeof(req), "{\"op\":\"commit\",\"key\":\"f%d\"}", i);
        h_expect_ok(&o.c, req);
        assert_true(i < 20);
    }
    pipelined = malloc(sizeof(head) + pad + sizeof(tail));
    assert_non_null(pipelined);
    memcpy(pipelined, head, sizeof(head) - 1);
    memset(pipelined + sizeof(head) - 1, '\n', pad);
    memcpy(pipelined + sizeof(head) - 1 + pad, tail, sizeof(tail));
    assert_int_equal(h_conn_send(&o.c, pipelined, strlen(pipelined)), 0);
    free(pipelined);
    /* The short wait's ENOSPC and the get's reply: the long wait has begun. */
    reply = h_recv_json(&o.c);
    h_assert_error(reply, "ENOSPC", "arena of client");
    json_decref(reply);
    reply = h_recv_json(&o.c);
    h_assert_ok(reply);
    json_decref(reply);
    assert_int_equal(clients_now(&r), 3);
    aclient_close(&o);
    /* Well within the minute the alloc would wait. */
    for (i = 0; i < 200 && clients_now(&r) != 2; i++)
        h_sleep_ms(100);
    assert_int_equal(clients_now(&r), 2);
    aclient_close(&w);
    aclient_close(&r);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_put_and_get),
        TEST(test_arena_objects_bounded),
        TEST(test_library_renews_full_arena),
        TEST(test_kill_writer),
        TEST(test_restart_keeps),
        TEST(test_wait_behind_busy_arena),
        TEST(test_busy_arena_no_spin),
        TEST(test_cut_arena_no_spin),
        TEST(test_commits_on_their_way_hold_arena),
        TEST(test_commit_wait_at_end_of_input),
        TEST(test_commit_wait_paused_at_end_of_input),
        TEST(test_wait_after_paused_short_wait_sees_close),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
