// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of pools (--pool): several named segments in one
 * shmbrokerd, each with its own keys, limits, counters, access group and
 * backing; adopted one by one after a restart, added and removed on SIGHUP,
 * and listed by shmbrokerctl status. Clients here speak the raw protocol and
 * map the descriptor hello passes, as any client of another language would.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"

/* A raw connection said hello to one pool, with that pool's segment mapped
 * read-write. */
struct pc {
    struct h_conn conn;
    unsigned char *base;
    size_t size;
    long long data_offset, data_size;
};

/* The hello request for pool (NULL: none named) into line. */
static void hello_line(char *line, size_t len, const char *pool)
{
    if (pool == NULL)
        snprintf(line, len, "{\"op\":\"hello\",\"version\":1,\"name\":\"pools\"}");
    else
        snprintf(line, len, "{\"op\":\"hello\",\"version\":1,\"name\":\"pools\",\"pool\":\"%s\"}",
                 pool);
}

/* Connect to d and say hello to pool (NULL: the default pool); fail the test
 * unless it works, the reply names the pool and its descriptor maps. The
 * caller owns the reply. */
#define pc_open(p, d, pool) pc_open_at((p), (d), (pool), __FILE__, __LINE__)
static json_t *pc_open_at(struct pc *p, const struct h_daemon *d, const char *pool,
                          const char *file, int line)
{
    char request[256];
    json_t *reply;
    struct stat st;
    void *base;
    int rc;

    memset(p, 0, sizeof(*p));
    p->conn.fd = -1;
    if ((rc = h_conn_open(&p->conn, d->socket)) < 0)
        h_fail_at(file, line, "cannot connect to %s: %s", d->socket, strerror(-rc));
    hello_line(request, sizeof(request), pool);
    reply = h_call_at(&p->conn, request, file, line);
    h_assert_reply_at(reply, NULL, NULL, file, line);
    if (pool != NULL && strcmp(h_str_at(reply, "pool", file, line), pool) != 0)
        h_fail_at(file, line, "hello to pool '%s' answered for pool '%s'", pool,
                  h_str_at(reply, "pool", file, line));
    if (p->conn.nfds != 1 || fstat(p->conn.fds[0], &st) != 0)
        h_fail_at(file, line, "hello to pool '%s' passed %d descriptors", pool ? pool : "",
                  p->conn.nfds);
    p->size = (size_t)h_int_at(reply, "size", file, line);
    p->data_offset = h_int_at(reply, "data_offset", file, line);
    p->data_size = h_int_at(reply, "data_size", file, line);
    if ((uint64_t)st.st_size < p->size)
        h_fail_at(file, line, "the descriptor of pool '%s' is %lld bytes, hello says %zu",
                  pool ? pool : "", (long long)st.st_size, p->size);
    base = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, p->conn.fds[0], 0);
    if (base == MAP_FAILED)
        h_fail_at(file, line, "cannot map pool '%s': %s", pool ? pool : "", strerror(errno));
    p->base = base;
    return reply;
}

/* pc_open, dropping the reply. */
#define pc_connect(p, d, pool) json_decref(pc_open_at((p), (d), (pool), __FILE__, __LINE__))

static void pc_close(struct pc *p)
{
    if (p->base != NULL)
        munmap(p->base, p->size);
    p->base = NULL;
    h_conn_close(&p->conn);
}

/* Send the printf-formatted request and return its reply (the caller owns it). */
#define pc_call(p, ...) pc_call_at((p), __FILE__, __LINE__, __VA_ARGS__)
static json_t *pc_call_at(struct pc *p, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static json_t *pc_call_at(struct pc *p, const char *file, int line, const char *fmt, ...)
{
    char request[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(request, sizeof(request), fmt, ap);
    va_end(ap);
    return h_call_at(&p->conn, request, file, line);
}

/* The byte range [offset, offset + size) of a reply, checked to lie in the
 * data area. */
static unsigned char *pc_bytes_at(const struct pc *p, const json_t *reply, size_t size,
                                  const char *file, int line)
{
    long long offset = h_int_at(reply, "offset", file, line);

    if (offset < p->data_offset || (long long)size > p->data_size ||
        offset - p->data_offset > p->data_size - (long long)size)
        h_fail_at(file, line, "offset %lld (+%zu) is outside the data area", offset, size);
    return p->base + offset;
}

/* alloc key of size bytes: the reply, which the caller checks and owns. */
#define pc_alloc(p, key, size) \
    pc_call((p), "{\"op\":\"alloc\",\"key\":\"%s\",\"size\":%zu}", (key), (size_t)(size))

/* Put size bytes of h_fill's pattern for seed under key, or fail. */
#define pc_put(p, key, size, seed) pc_put_at((p), (key), (size), (seed), __FILE__, __LINE__)
static void pc_put_at(struct pc *p, const char *key, size_t size, uint32_t seed,
                      const char *file, int line)
{
    json_t *reply = pc_call_at(p, file, line, "{\"op\":\"alloc\",\"key\":\"%s\",\"size\":%zu}",
                               key, size);

    h_assert_reply_at(reply, NULL, NULL, file, line);
    h_fill(pc_bytes_at(p, reply, size, file, line), size, seed);
    json_decref(reply);
    reply = pc_call_at(p, file, line, "{\"op\":\"commit\",\"key\":\"%s\"}", key);
    h_assert_reply_at(reply, NULL, NULL, file, line);
    json_decref(reply);
}

/* Get key, check its size and pattern, and release it unless keep_pin. */
#define pc_check(p, key, size, seed, keep_pin) \
    pc_check_at((p), (key), (size), (seed), (keep_pin), __FILE__, __LINE__)
static void pc_check_at(struct pc *p, const char *key, size_t size, uint32_t seed,
                        bool keep_pin, const char *file, int line)
{
    json_t *reply = pc_call_at(p, file, line, "{\"op\":\"get\",\"key\":\"%s\"}", key);
    size_t bad;

    h_assert_reply_at(reply, NULL, NULL, file, line);
    if ((size_t)h_int_at(reply, "size", file, line) != size)
        h_fail_at(file, line, "'%s' is %lld bytes, want %zu", key,
                  h_int_at(reply, "size", file, line), size);
    bad = h_check(pc_bytes_at(p, reply, size, file, line), size, seed);
    if (bad != size)
        h_fail_at(file, line, "'%s': first wrong byte at %zu of %zu", key, bad, size);
    json_decref(reply);
    if (!keep_pin) {
        reply = pc_call_at(p, file, line, "{\"op\":\"release\",\"key\":\"%s\"}", key);
        h_assert_reply_at(reply, NULL, NULL, file, line);
        json_decref(reply);
    }
}

/* The stats of p's pool (the caller owns them). */
static json_t *pc_stats(struct pc *p)
{
    json_t *reply = pc_call(p, "{\"op\":\"stats\"}");

    h_assert_ok(reply);
    return reply;
}

/* The entry of pool name in a stats reply's "pools", or the test fails. */
static json_t *pools_entry(const json_t *stats, const char *name)
{
    const json_t *pools = json_object_get(stats, "pools");
    size_t i;

    if (!json_is_array(pools))
        h_fail("stats has no \"pools\" array");
    for (i = 0; i < json_array_size(pools); i++) {
        json_t *e = json_array_get(pools, i);

        if (json_is_string(json_object_get(e, "pool")) &&
            strcmp(json_string_value(json_object_get(e, "pool")), name) == 0)
            return e;
    }
    h_fail("stats \"pools\" has no pool '%s'", name);
}

/* A counter of a stats object (top level or a "pools" entry). */
static long long counter(const json_t *stats, const char *name)
{
    return h_int(json_object_get(stats, "counters"), name);
}

/* Fail unless two stats objects hold the same value of field (JSON-equal). */
#define same_field(a, b, field) same_field_at((a), (b), (field), __FILE__, __LINE__)
static void same_field_at(const json_t *a, const json_t *b, const char *field,
                          const char *file, int line)
{
    if (!json_equal(json_object_get(a, field), json_object_get(b, field))) {
        char *ta = json_dumps(json_object_get(a, field), JSON_COMPACT | JSON_ENCODE_ANY);
        char *tb = json_dumps(json_object_get(b, field), JSON_COMPACT | JSON_ENCODE_ANY);

        h_fail_at(file, line, "\"%s\" changed from %s to %s", field, ta ? ta : "(none)",
                  tb ? tb : "(none)");
    }
}

/* The number of entries of dir other than "." and "..", or -1. */
static int dir_entries(const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    int n = 0;

    if (dp == NULL)
        return -1;
    while ((e = readdir(dp)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(dp);
    return n;
}

/* The segment file of pool in d's shm directory. */
static void pool_path(const struct h_daemon *d, const char *pool, char *out, size_t len)
{
    snprintf(out, len, "%s/%s.%s", d->shm_dir, d->name, pool);
}

/* Start a daemon with extra flags and expect it to refuse: its exit code
 * (the log is printed when it did not exit). */
static int start_refused(struct h_fix *f, struct h_daemon *d, const char *const *extra)
{
    int status;

    assert_true(h_daemon_spawn(f, d, extra) > 0);
    status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
    if (status == -1) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd --name %s did not exit by itself", d->name);
    }
    return h_exit_code(status);
}

/* Fail unless the log of d contains needle. */
#define log_has(d, needle) log_has_at((d), (needle), __FILE__, __LINE__)
static void log_has_at(const struct h_daemon *d, const char *needle, const char *file,
                       int line)
{
    if (!h_log_contains(d, needle)) {
        h_daemon_print_log(d);
        h_fail_at(file, line, "the log of shmbrokerd --name %s lacks \"%s\"", d->name,
                  needle);
    }
}

/* Issue 14: filling one pool leaves the others alone. "small" (4 MiB) is
 * filled twice over (its objects evicted), then with pinned objects until
 * ENOSPC. "big" (16 MiB), filled before, keeps every object byte for byte,
 * its counters, objects and used bytes do not move, and its allocations
 * still succeed. */
static void test_pool_full_isolated(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "small:4M", "--pool", "big:16M", NULL});
    const size_t big_size = 700000, small_size = 200000;
    struct pc big, small;
    json_t *before, *after, *reply, *st;
    char key[32];
    int i, n;

    pc_connect(&big, d, "big");
    pc_connect(&small, d, "small");
    for (i = 0; i < 12; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        pc_put(&big, key, big_size, 100 + (uint32_t)i);
    }
    before = pc_stats(&big);
    assert_string_equal(h_str(before, "pool"), "big");
    assert_int_equal(h_int(before, "objects"), 12);

    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "s%d", i);
        pc_put(&small, key, small_size, (uint32_t)i);
    }
    for (n = 0;; n++) {
        if (n == 100)
            h_fail("100 pinned objects of %zu bytes fit in a 4 MiB pool", small_size);
        snprintf(key, sizeof(key), "p%d", n);
        reply = pc_alloc(&small, key, small_size);
        if (json_is_false(json_object_get(reply, "ok")))
            break;
        h_fill(pc_bytes_at(&small, reply, small_size, __FILE__, __LINE__), small_size,
               1000 + (uint32_t)n);
        json_decref(reply);
        reply = pc_call(&small, "{\"op\":\"commit\",\"key\":\"%s\"}", key);
        h_assert_ok(reply);
        json_decref(reply);
        pc_check(&small, key, small_size, 1000 + (uint32_t)n, true);
    }
    h_assert_error(reply, "ENOSPC", "No space for");
    json_decref(reply);
    st = pc_stats(&small);
    assert_int_equal(counter(st, "enospc"), 1);
    assert_true(counter(st, "evictions") > 0);
    json_decref(st);

    after = pc_stats(&big);
    same_field(before, after, "counters");
    same_field(before, after, "objects");
    same_field(before, after, "used");
    same_field(before, after, "pinned");
    same_field(before, after, "blocker");
    same_field(pools_entry(before, "big"), pools_entry(after, "big"), "counters");
    json_decref(after);
    for (i = 0; i < 12; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        pc_check(&big, key, big_size, 100 + (uint32_t)i, false);
    }
    for (i = 12; i < 16; i++) {
        snprintf(key, sizeof(key), "b%d", i);
        pc_put(&big, key, big_size, 100 + (uint32_t)i);
    }
    after = pc_stats(&big);
    assert_int_equal(counter(after, "allocs"), counter(before, "allocs") + 4);
    assert_int_equal(counter(after, "evictions"), 0);
    assert_int_equal(counter(after, "enospc"), 0);
    assert_int_equal(h_int(after, "objects"), 16);
    json_decref(after);
    json_decref(before);
    pc_close(&small);
    pc_close(&big);
    h_pass(f);
}

/* Issue 14: keys are per pool. The same key holds different bytes in two
 * pools, and deleting it in one leaves the other. The library's
 * shmb_set_pool reaches the pool it names, and an unknown one fails
 * shmb_connect with ENOENT. */
static void test_pool_keys(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "x:2M", "--pool", "y:2M", NULL});
    struct pc x, y;
    json_t *reply;
    shmb_t *c;

    pc_connect(&x, d, "x");
    pc_connect(&y, d, "y");
    pc_put(&x, "k", 1000, 1);
    pc_put(&y, "k", 3000, 2);
    pc_check(&x, "k", 1000, 1, false);
    pc_check(&y, "k", 3000, 2, false);
    h_expect_ok(&x.conn, "{\"op\":\"delete\",\"key\":\"k\"}");
    reply = pc_call(&y, "{\"op\":\"contains\",\"key\":\"k\"}");
    h_assert_ok(reply);
    assert_true(json_is_true(json_object_get(reply, "exists")));
    json_decref(reply);
    pc_check(&y, "k", 3000, 2, false);
    h_expect_error(&x.conn, "{\"op\":\"get\",\"key\":\"k\"}", "ENOENT", "No object 'k'");

    c = shmb_new();
    assert_non_null(c);
    shmb_set_pool(c, "y");
    ok(c, shmb_connect(c, d->socket, "lib"));
    get_check(c, "k", 3000, 2);
    ok(c, h_put_pattern(c, "lib", 2000, 7, 0));
    shmb_close(c);
    pc_check(&y, "lib", 2000, 7, false);
    h_expect_error(&x.conn, "{\"op\":\"get\",\"key\":\"lib\"}", "ENOENT", NULL);
    c = shmb_new();
    assert_non_null(c);
    shmb_set_pool(c, "z");
    fails(c, shmb_connect(c, d->socket, "lib"), -ENOENT, "its pools are: x, y.");
    shmb_close(c);
    pc_close(&x);
    pc_close(&y);
    h_pass(f);
}

/* Issue 14: max-object-size is per pool. 100,000 bytes are refused in a
 * pool whose maximum is 64 KiB (hello and stats say so) and accepted in a
 * pool of the same size without one. */
static void test_pool_max_object(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M",
        (const char *const[]){"--pool", "tiny:2M,max-object-size=64K", "--pool", "wide:2M",
                              NULL});
    struct pc tiny, wide;
    json_t *hello, *st;

    hello = pc_open(&tiny, d, "tiny");
    assert_int_equal(h_int(hello, "max_object_size"), 65536);
    json_decref(hello);
    hello = pc_open(&wide, d, "wide");
    assert_true(h_int(hello, "max_object_size") >= 100000);
    json_decref(hello);
    h_expect_error(&tiny.conn, "{\"op\":\"alloc\",\"key\":\"o\",\"size\":100000}", "E2BIG",
                   "exceeds max object size (65536 bytes)");
    pc_put(&tiny, "o", 65536, 3);
    pc_put(&wide, "o", 100000, 4);
    pc_check(&tiny, "o", 65536, 3, false);
    pc_check(&wide, "o", 100000, 4, false);
    st = pc_stats(&wide);
    assert_int_equal(h_int(pools_entry(st, "tiny"), "max_object_size"), 65536);
    assert_int_equal(h_int(st, "max_object_size"), h_int(pools_entry(st, "wide"),
                                                          "max_object_size"));
    json_decref(st);
    pc_close(&tiny);
    pc_close(&wide);
    h_pass(f);
}

/* Issue 14: a hello naming a pool the daemon does not have is ENOENT,
 * listing its pools, passes no descriptor, and leaves the connection
 * waiting for another hello. */
static void test_pool_unknown(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "a:1M", "--pool", "b:1M", NULL});
    struct h_conn c;
    json_t *reply;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"nope\"}", "ENOENT",
                   "No pool 'nope' in this shmbrokerd; its pools are: a, b.");
    assert_int_equal(c.nfds, 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"b\"}");
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "pool"), "b");
    assert_int_equal(c.nfds, 1);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* What the group test's helper does: become nobody, in no group or in
 * group 12345, and say hello to a pool. */
struct group_try {
    const char *socket;
    bool in_group; /* supplementary group 12345 */
    bool many;     /* ... and 299 others before it */
    const char *pool;
    const char *want_error; /* NULL: the hello must succeed */
    const char *want_text[3];
};

/* Helper process body: 0 when the hello went as wanted. */
static int group_try_run(void *arg)
{
    const struct group_try *t = arg;
    gid_t groups[300];
    char request[256], *line = NULL;
    struct h_conn c;
    json_t *reply;
    const char *error, *message;
    int rc = 1, i;

    size_t n = 0;

    while (t->many && n < 299) {
        groups[n] = (gid_t)(20000 + n);
        n++;
    }
    if (t->in_group)
        groups[n++] = 12345;
    if (setgroups(n, groups) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
        fprintf(stderr, "helper: cannot become nobody: %s\n", strerror(errno));
        return 2;
    }
    if (h_conn_open(&c, t->socket) < 0) {
        fprintf(stderr, "helper: cannot connect as nobody to %s\n", t->socket);
        return 3;
    }
    hello_line(request, sizeof(request), t->pool);
    if (h_conn_sendline(&c, request) < 0 || h_conn_recv_line(&c, &line, 5000) < 0 ||
        (reply = json_loads(line, 0, NULL)) == NULL) {
        fprintf(stderr, "helper: no reply to %s\n", request);
        free(line);
        h_conn_close(&c);
        return 4;
    }
    error = json_string_value(json_object_get(reply, "error"));
    message = json_string_value(json_object_get(reply, "message"));
    if (t->want_error == NULL) {
        rc = json_is_true(json_object_get(reply, "ok")) && c.nfds == 1 ? 0 : 5;
    } else if (error != NULL && strcmp(error, t->want_error) == 0 && c.nfds == 0) {
        rc = 0;
        for (i = 0; i < 3 && t->want_text[i] != NULL; i++)
            if (message == NULL || strstr(message, t->want_text[i]) == NULL)
                rc = 6;
    }
    if (rc != 0)
        fprintf(stderr, "helper (uid 65534%s) hello to pool '%s': got %s\n",
                t->in_group ? ", group 12345" : "", t->pool ? t->pool : "", line);
    json_decref(reply);
    free(line);
    h_conn_close(&c);
    return rc;
}

/* Run one group_try in a helper; fail unless it returns 0. */
static void group_try(struct h_fix *f, const struct group_try *t)
{
    pid_t pid = h_fork(f, group_try_run, (void *)t);

    assert_true(pid > 0);
    if (h_child_wait(f, pid, H_REPLY_TIMEOUT_MS * 2) != 0)
        h_fail("the helper's hello to pool '%s' did not go as expected",
               t->pool ? t->pool : "");
}

/* Issue 14: group= restricts a pool beyond the socket's mode. A process of
 * uid 65534 in no group gets EPERM naming the pool from "locked"
 * (group=12345), and gets "open" on the same socket; in group 12345 it gets
 * "locked" too, and so does root. */
static void test_pool_group(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct group_try t;
    struct pc p;

    if (geteuid() != 0)
        h_skip(f, "needs root to act as another user");
    assert_int_equal(chmod(f->dir, 0711), 0);
    d = h_daemon_start(f, "1M",
                       (const char *const[]){"--socket-mode", "0666", "--pool", "open:1M",
                                             "--pool", "locked:1M,group=12345", NULL});
    memset(&t, 0, sizeof(t));
    t.socket = d->socket;
    t.pool = "locked";
    t.want_error = "EPERM";
    t.want_text[0] = "Pool 'locked' is restricted to group ";
    t.want_text[1] = "(gid 12345); uid 65534 (gid 65534) is not a member.";
    group_try(f, &t);
    memset(&t, 0, sizeof(t));
    t.socket = d->socket;
    t.pool = "open";
    group_try(f, &t);
    t.pool = NULL; /* the default pool: "open" */
    group_try(f, &t);
    t.pool = "locked";
    t.in_group = true;
    group_try(f, &t);
    /* A member with 300 groups, 12345 the last of them. */
    t.many = true;
    group_try(f, &t);
    pc_connect(&p, d, "locked");
    pc_put(&p, "root", 100, 9);
    pc_close(&p);
    h_pass(f);
}

/* What the outsider helper runs: shmbrokerctl ARGS as uid 65534 in no
 * group, its output into a file. */
struct outsider_run {
    const char *socket, *out;
    const char *args[4];
};

/* Helper body: exec shmbrokerctl as nobody; its exit status is ours. */
static int outsider_run(void *arg)
{
    const struct outsider_run *r = arg;
    const char *argv[8];
    int fd, n = 0, i;

    /* The file first: nobody may not create one in the fixture's directory. */
    fd = open(r->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
        return 121;
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        return 120;
    argv[n++] = h_ctl_bin();
    argv[n++] = "--socket";
    argv[n++] = r->socket;
    for (i = 0; i < 4 && r->args[i] != NULL; i++)
        argv[n++] = r->args[i];
    argv[n] = NULL;
    execv(argv[0], (char *const *)argv);
    return 122;
}

/* Review: a client outside the group of the first pool still reaches the
 * daemon. A hello that names no pool gets the first pool it may use, and
 * shmbrokerctl status, status --pool of the restricted pool, and clients
 * work for it (the figures of every pool are every client's to see); a
 * hello naming the restricted pool is still EPERM. */
static void test_pool_group_default(void **state)
{
    struct h_fix *f = *state;
    const char *cmds[][3] = {{"status", NULL, NULL},
                             {"status", "--pool", "locked"},
                             {"clients", NULL, NULL}};
    const char *wants[] = {"pool      locked (shm, group 12345)", "pool      locked",
                           "PID"};
    struct h_daemon *d;
    struct group_try t;
    char out[PATH_MAX];
    size_t i;

    if (geteuid() != 0)
        h_skip(f, "needs root to act as another user");
    assert_int_equal(chmod(f->dir, 0711), 0);
    d = h_daemon_start(f, "1M",
                       (const char *const[]){"--socket-mode", "0666", "--pool",
                                             "locked:1M,group=12345", "--pool", "open:1M",
                                             NULL});
    memset(&t, 0, sizeof(t));
    t.socket = d->socket;
    t.pool = NULL; /* lands in "open" */
    group_try(f, &t);
    t.pool = "locked";
    t.want_error = "EPERM";
    t.want_text[0] = "Pool 'locked' is restricted to group ";
    group_try(f, &t);
    for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        struct outsider_run r = {d->socket, out, {cmds[i][0], cmds[i][1], cmds[i][2], NULL}};
        pid_t pid;
        char *text;

        h_path(f, "outsider.out", out, sizeof(out));
        pid = h_fork(f, outsider_run, &r);
        if (h_child_wait(f, pid, H_REPLY_TIMEOUT_MS * 2) != 0 ||
            !h_contains(text = h_read_file(out, NULL), wants[i]))
            h_fail("shmbrokerctl %s %s as nobody: %s", cmds[i][0], cmds[i][1] ? cmds[i][1] : "",
                   (text = h_read_file(out, NULL)) ? text : "(no output)");
        free(text);
    }
    h_pass(f);
}

/* What the peeking helper does: become nobody, in group 12345 or in none,
 * say hello to the default pool and ask for the reports. */
struct peek {
    const char *socket;
    bool in_group;
};

/* The reply to request on c, parsed into *reply and its text kept in
 * *text (the caller frees both); 0, or a helper's exit status. */
static int peek_call(struct h_conn *c, const char *request, json_t **reply, char **text)
{
    *text = NULL;
    *reply = NULL;
    if (h_conn_sendline(c, request) < 0 || h_conn_recv_line(c, text, 5000) < 0 ||
        (*reply = json_loads(*text, 0, NULL)) == NULL ||
        !json_is_true(json_object_get(*reply, "ok"))) {
        fprintf(stderr, "helper: %s got %s\n", request, *text ? *text : "(nothing)");
        return 10;
    }
    return 0;
}

/* Helper body: 0 when the reports hide the names of pool "locked" from an
 * outsider (and show its figures), or show them to a member. */
static int peek_run(void *arg)
{
    const struct peek *t = arg;
    const char *requests[] = {"{\"op\":\"stats\"}", "{\"op\":\"queue_list\"}",
                              "{\"op\":\"clients\"}", "{\"op\":\"stats\",\"seats\":true}",
                              "{\"op\":\"queue_list\",\"seats\":true}"};
    gid_t group = 12345;
    struct h_conn c;
    json_t *reply, *locked = NULL, *q;
    char *text;
    size_t i, j;
    int rc = 0;

    if (setgroups(t->in_group ? 1 : 0, &group) != 0 || setgid(65534) != 0 ||
        setuid(65534) != 0)
        return 2;
    if (h_conn_open(&c, t->socket) < 0 ||
        peek_call(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"peeker\"}", &reply, &text) != 0)
        return 3;
    json_decref(reply);
    free(text);
    for (i = 0; i < sizeof(requests) / sizeof(requests[0]) && rc == 0; i++) {
        if ((rc = peek_call(&c, requests[i], &reply, &text)) != 0)
            break;
        if ((strstr(text, "secret") != NULL) != t->in_group) {
            fprintf(stderr, "helper (%s): %s answered %s\n",
                    t->in_group ? "in group 12345" : "outsider", requests[i], text);
            rc = 11;
        }
        /* The figures stay: the locked pool's pending alloc, its blocker's
         * pins and state, the queue's seats and the client of the pool. */
        if (i == 0)
            json_array_foreach(json_object_get(reply, "pools"), j, q)
                if (strcmp(json_string_value(json_object_get(q, "pool")), "locked") == 0)
                    locked = q;
        if (i == 0 && (locked == NULL ||
                       json_integer_value(json_object_get(locked, "pending")) != 1 ||
                       strcmp(json_string_value(json_object_get(
                                  json_object_get(locked, "blocker"), "state")),
                              "pending") != 0 ||
                       json_array_size(json_object_get(reply, "queues")) != 1))
            rc = 12;
        if (i == 1 && (q = json_array_get(json_object_get(reply, "queues"), 0)) != NULL &&
            (json_integer_value(json_object_get(q, "seats_live")) != 1 ||
             strcmp(json_string_value(json_object_get(q, "pool")), "locked") != 0 ||
             !json_is_object(json_object_get(q, "writer"))))
            rc = 13;
        if (i == 2 && json_array_size(json_object_get(reply, "clients")) != 2)
            rc = 14;
        if (rc > 11)
            fprintf(stderr, "helper: %s lost a figure: %s\n", requests[i], text);
        json_decref(reply);
        free(text);
    }
    h_conn_close(&c);
    return rc;
}

/* Issue 24: group= hides the names of what it guards. Proves that a peer
 * outside pool "locked"'s group reads, through stats, queue_list (with and
 * without its seats) and clients, none of that pool's names: not its
 * blocker's key, its queue's name, nor the names of the clients in it or of
 * its queue's members; the figures stay (the pending alloc, the blocker's
 * state, the queue's seats, the client counted). A member of the group reads
 * them all. */
static void test_pool_group_hides_names(void **state)
{
    struct h_fix *f = *state;
    const char *cmds[][2] = {{"status", NULL}, {"status", "--prometheus"}, {"clients", NULL}};
    const char *wants[] = {"queue     (name hidden) (pool locked)",
                           "shmbroker_pending_objects{pool=\"locked\"} 1", "locked"};
    struct h_daemon *d;
    struct h_conn c;
    struct peek t;
    char out[PATH_MAX];
    size_t i;
    pid_t pid;

    if (geteuid() != 0)
        h_skip(f, "needs root to act as another user");
    assert_int_equal(chmod(f->dir, 0711), 0);
    d = h_daemon_start(f, "1M",
                       (const char *const[]){"--socket-mode", "0666", "--pool", "open:1M",
                                             "--pool", "locked:1M,group=12345", NULL});
    memset(&c, 0, sizeof(c));
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_ok(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"secret-holder\","
                    "\"pool\":\"locked\"}");
    h_expect_ok(&c, "{\"op\":\"alloc\",\"key\":\"secret-key\",\"size\":100}");
    h_expect_ok(&c, "{\"op\":\"queue_create\",\"name\":\"secretq\",\"seats\":2,\"slots\":2,"
                    "\"slot_size\":64}");
    h_expect_ok(&c, "{\"op\":\"queue_open\",\"name\":\"secretq\",\"role\":\"writer\"}");
    h_expect_ok(&c, "{\"op\":\"queue_open\",\"name\":\"secretq\",\"role\":\"reader\"}");
    t.socket = d->socket;
    t.in_group = false;
    pid = h_fork(f, peek_run, &t);
    assert_true(pid > 0);
    if (h_child_wait(f, pid, H_REPLY_TIMEOUT_MS * 2) != 0)
        h_fail("an outsider's reports named what pool 'locked' holds, or lost its figures");
    t.in_group = true;
    pid = h_fork(f, peek_run, &t);
    assert_true(pid > 0);
    if (h_child_wait(f, pid, H_REPLY_TIMEOUT_MS * 2) != 0)
        h_fail("a member of group 12345 did not read pool 'locked''s names");
    /* shmbrokerctl as the outsider: the figures, no name. */
    for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        struct outsider_run r = {d->socket, out, {cmds[i][0], cmds[i][1], NULL, NULL}};
        char *text = NULL;

        h_path(f, "outsider.out", out, sizeof(out));
        pid = h_fork(f, outsider_run, &r);
        if (h_child_wait(f, pid, H_REPLY_TIMEOUT_MS * 2) != 0 ||
            (text = h_read_file(out, NULL)) == NULL || h_contains(text, "secret") ||
            !h_contains(text, wants[i]) ||
            /* its members are the queue's: hidden, not nameless */
            (i == 0 && (!h_contains(text, "(name hidden), client") || h_contains(text, "''"))))
            h_fail("shmbrokerctl %s %s as nobody: %s", cmds[i][0], cmds[i][1] ? cmds[i][1] : "",
                   text != NULL ? text : "(no output)");
        free(text);
    }
    h_conn_close(&c);
    h_pass(f);
}

/* The objects of the restart test: two in each of three pools. */
static const struct {
    const char *pool, *key;
    size_t size;
    uint32_t seed;
} restart_objects[] = {
    {"a", "one", 5000, 11},   {"a", "two", 300000, 12}, {"b", "one", 70000, 21},
    {"b", "two", 1000000, 22}, {"c", "one", 1, 31},      {"c", "two", 1500000, 32},
};
#define N_RESTART_OBJECTS (sizeof(restart_objects) / sizeof(restart_objects[0]))

/* Check (put when put) every restart object in d. */
static void restart_objects_at(const struct h_daemon *d, bool put)
{
    struct pc p;
    size_t i;

    for (i = 0; i < N_RESTART_OBJECTS; i++) {
        pc_connect(&p, d, restart_objects[i].pool);
        if (put)
            pc_put(&p, restart_objects[i].key, restart_objects[i].size,
                   restart_objects[i].seed);
        pc_check(&p, restart_objects[i].key, restart_objects[i].size,
                 restart_objects[i].seed, false);
        pc_close(&p);
    }
}

/* A daemon for a restart of old, started with extra; fail unless it serves. */
static struct h_daemon *restart(struct h_fix *f, const struct h_daemon *old,
                                const char *const *extra)
{
    struct h_daemon *d = h_daemon_again(f, old);

    assert_true(h_daemon_spawn(f, d, extra) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("the restarted daemon did not serve (exit %d)", h_exit_code(d->status));
    }
    return d;
}

/* Issue 14: each pool is adopted on its own. Three pools' objects come back
 * byte for byte after a clean stop with --keep-segment and after SIGKILL; a
 * start with one pool resized serves the other two with their objects and
 * not that one (the log says how to serve it again; a hello to it is
 * ENOENT), leaving its segment as it was: the next start with the old sizes
 * adopts all three again. */
static void test_pool_restart(void **state)
{
    struct h_fix *f = *state;
    static const char *const pools[] = {"--keep-segment", "--pool", "a:2M", "--pool", "b:3M",
                                        "--pool", "c:4M", NULL};
    static const char *const resized[] = {"--pool", "a:2M", "--pool", "b:5M",
                                          "--pool", "c:4M", NULL};
    struct h_daemon *d1 = h_daemon_start(f, "1M", pools), *d;
    char path[PATH_MAX * 2], want[PATH_MAX * 5];

    restart_objects_at(d1, true);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    pool_path(d1, "b", path, sizeof(path));
    assert_true(h_exists(path));
    d = restart(f, d1, pools);
    restart_objects_at(d, false);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);

    d = restart(f, d1, resized);
    snprintf(want, sizeof(want),
             "Pool 'b' is not served: its segment %s, left by the previous shmbrokerd, holds "
             "3145728 bytes, not the 5242880 the pool asks for now. To serve its objects, "
             "give it its size again (--pool b:3145728); to start it empty, remove %s.",
             path, path);
    log_has(d, want);
    log_has(d, "1 of 3 pools not served");
    {
        struct pc a, c;
        struct h_conn b;
        char hello[256];

        pc_connect(&a, d, "a");
        pc_check(&a, "two", 300000, 12, false);
        pc_close(&a);
        pc_connect(&c, d, "c");
        pc_check(&c, "two", 1500000, 32, false);
        pc_close(&c);
        assert_int_equal(h_conn_open(&b, d->socket), 0);
        hello_line(hello, sizeof(hello), "b");
        h_expect_error(&b, hello, "ENOENT", "its pools are: a, c.");
        h_conn_close(&b);
    }
    assert_true(h_exists(path));
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);

    d = restart(f, d1, pools);
    restart_objects_at(d, false);
    h_pass(f);
}

/* Issue 14: the start-up space check sums the pools on one file system. Two
 * pools of 6 MiB in an 8 MiB tmpfs: the start is refused (exit 1) naming the
 * pool that does not fit and the numbers, and creates nothing there. */
static void test_pool_space_check(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    char dir[PATH_MAX], want[PATH_MAX * 2 + 160];
    int rc;

    if (geteuid() != 0)
        h_skip(f, "needs root to mount a tmpfs");
    if ((rc = h_mount_tmpfs(f, "8m", dir, sizeof(dir))) < 0)
        h_skip(f, "cannot mount a tmpfs here");
    d = h_daemon_new(f, "1M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_int_equal(
        start_refused(f, d,
                      (const char *const[]){"--pool", "first:6M", "--pool", "second:6M", NULL}),
        1);
    snprintf(want, sizeof(want),
             "Pool 'second' does not fit: pools first, second need 12 MiB together in %s. "
             "Insufficient space in %s: 12 MiB required, 8 MiB free",
             dir, dir);
    log_has(d, want);
    assert_int_equal(dir_entries(dir), 0);
    h_pass(f);
}

/* Issue 14: shmbrokerctl status shows every pool, status --pool one,
 * --prometheus labels pool-scoped metrics with pool="NAME", and --json
 * carries "pools", one entry per pool in configuration order. */
static void test_pool_status(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "alpha:2M", "--pool", "beta:3M", NULL});
    char alpha[96], beta[96];
    json_error_t jerr;
    struct h_run r;
    struct pc p;
    json_t *st, *pools;

    snprintf(alpha, sizeof(alpha), "%s.alpha", d->name);
    snprintf(beta, sizeof(beta), "%s.beta", d->name);
    pc_connect(&p, d, "beta");
    pc_put(&p, "only-in-beta", 4000, 5);

    h_ctl(f, d, NULL, 0, &r, "status", NULL);
    h_expect_run(&r, 0, alpha, NULL);
    h_expect_run(&r, 0, beta, NULL);
    h_run_free(&r);

    h_ctl(f, d, NULL, 0, &r, "status", "--pool", "beta", NULL);
    h_expect_run(&r, 0, beta, NULL);
    h_expect_run(&r, 0, "1 committed", NULL);
    if (h_contains(r.out, "alpha")) {
        h_run_dump("status --pool beta", &r);
        h_fail("status --pool beta shows pool alpha");
    }
    h_run_free(&r);

    h_ctl(f, d, NULL, 0, &r, "status", "--prometheus", NULL);
    h_expect_run(&r, 0, "shmbroker_objects{pool=\"alpha\"} 0\n", NULL);
    h_expect_run(&r, 0, "shmbroker_objects{pool=\"beta\"} 1\n", NULL);
    h_expect_run(&r, 0, "shmbroker_segment_bytes{pool=\"beta\"} 3145728\n", NULL);
    h_run_free(&r);

    h_ctl(f, d, NULL, 0, &r, "status", "--json", NULL);
    h_expect_run(&r, 0, NULL, NULL);
    st = json_loads(r.out, 0, &jerr);
    if (st == NULL) {
        h_run_dump("status --json", &r);
        h_fail("not JSON: %s", jerr.text);
    }
    pools = json_object_get(st, "pools");
    assert_int_equal(json_array_size(pools), 2);
    assert_string_equal(h_str(json_array_get(pools, 0), "pool"), "alpha");
    assert_string_equal(h_str(json_array_get(pools, 1), "pool"), "beta");
    assert_int_equal(h_int(json_array_get(pools, 0), "objects"), 0);
    assert_int_equal(h_int(json_array_get(pools, 1), "objects"), 1);
    assert_int_equal(h_int(json_array_get(pools, 1), "size"), 3 << 20);
    json_decref(st);
    h_run_free(&r);

    /* A name no pool can have is a usage error (2), not a refusal (1). */
    h_ctl(f, d, NULL, 0, &r, "status", "--pool", "123456789012345678901234567890123", NULL);
    h_expect_run(&r, 2, NULL, "a pool's name is at most 32 bytes of UTF-8");
    h_run_free(&r);
    pc_close(&p);
    h_pass(f);
}

/* Write text to the config file path (whole, by rename), send SIGHUP and
 * wait for its outcome in the log. */
static void reload_with(struct h_fix *f, const struct h_daemon *d, const char *path,
                        const char *text)
{
    char tmp[PATH_MAX];

    h_path(f, "next.conf", tmp, sizeof(tmp));
    assert_int_equal(h_write_file(tmp, text, strlen(text)), 0);
    assert_int_equal(rename(tmp, path), 0);
    h_reload(d);
}

/* What no_clients polls: the pool named, through a connection to another. */
struct pool_wait {
    struct h_conn *conn;
    const char *pool;
};

/* h_eventually callback: the pool has no connection left (the daemon has
 * seen ours close; a pool someone is connected to is not removed). */
static bool no_clients(void *arg)
{
    const struct pool_wait *w = arg;
    json_t *st = h_call(w->conn, "{\"op\":\"stats\"}");
    bool none;

    h_assert_ok(st);
    none = h_int(pools_entry(st, w->pool), "clients") == 0;
    json_decref(st);
    return none;
}

/* Close p, connected to pool, and wait until d has seen it go. */
static void pc_close_wait(struct pc *p, const struct h_daemon *d, const char *pool)
{
    struct h_conn c;
    struct pool_wait w = {&c, pool};

    pc_close(p);
    json_decref(h_open_hello(&c, d));
    if (!h_eventually(no_clients, &w, 5000))
        h_fail("pool '%s' still counts a client 5 s after it closed", pool);
    h_conn_close(&c);
}

/* Issue 14: SIGHUP adds a pool from the config file and removes an empty
 * one (its segment goes), and refuses to remove a pool holding an object:
 * the pool stays, with its object, and the log says why. */
static void test_pool_reload(void **state)
{
    struct h_fix *f = *state;
    static const char one[] = "pool = main:2M\n";
    static const char two[] = "pool = main:2M\npool = extra:2M\n";
    char conf[PATH_MAX], path[PATH_MAX * 2];
    struct h_daemon *d;
    struct h_conn c;
    struct pc p;

    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, one, strlen(one)), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    pool_path(d, "extra", path, sizeof(path));
    assert_false(h_exists(path));

    reload_with(f, d, conf, two);
    log_has(d, "SIGHUP: pool 'extra' added: segment ");
    pc_connect(&p, d, "extra");
    pc_close_wait(&p, d, "extra");
    assert_true(h_exists(path));

    reload_with(f, d, conf, one);
    log_has(d, "SIGHUP: pool 'extra' removed (it was empty)");
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"extra\"}", "ENOENT",
                   "No pool 'extra' in this shmbrokerd; its pools are: main.");
    h_conn_close(&c);
    assert_false(h_exists(path));

    reload_with(f, d, conf, two);
    pc_connect(&p, d, "extra");
    pc_put(&p, "kept", 12345, 8);
    pc_close_wait(&p, d, "extra");
    reload_with(f, d, conf, one);
    log_has(d, "SIGHUP: pool 'extra' is not empty (1 object, 0 pending allocations, 0 "
               "clients); it stays");
    pc_connect(&p, d, "extra");
    pc_check(&p, "kept", 12345, 8, false);
    pc_close(&p);
    assert_true(h_exists(path));
    h_pass(f);
}

/* Whether key is in p's pool (contains), or the test fails. */
static bool pc_contains(struct pc *p, const char *key)
{
    json_t *reply = pc_call(p, "{\"op\":\"contains\",\"key\":\"%s\"}", key);
    bool found;

    h_assert_ok(reply);
    found = json_is_true(json_object_get(reply, "exists"));
    json_decref(reply);
    return found;
}

/* Issue 24: a pool SIGHUP adds over a segment a killed daemon left adopts
 * it as a start does: the objects of that daemon's queues ("q/<queue>/<seq>",
 * awaiting reads that will never come, so holding their bytes for ever) go,
 * the log says how many, and the pool's other objects stay. */
static void test_pool_reload_adopts_as_start(void **state)
{
    struct h_fix *f = *state;
    static const char one[] = "pool = main:2M\n";
    static const char two[] = "pool = main:2M\npool = extra:2M\n";
    char conf[PATH_MAX];
    const char *const args[] = {"--config", conf, NULL};
    struct h_daemon *d1, *d;
    json_t *reply;
    struct pc p;

    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, two, strlen(two)), 0);
    d1 = h_daemon_start(f, "1M", args);
    pc_connect(&p, d1, "extra");
    reply = pc_call(
        &p, "{\"op\":\"alloc\",\"key\":\"q/feed/7\",\"size\":1000,\"readers\":1}");
    h_assert_ok(reply);
    json_decref(reply);
    reply = pc_call(&p, "{\"op\":\"commit\",\"key\":\"q/feed/7\"}");
    h_assert_ok(reply);
    json_decref(reply);
    pc_put(&p, "plain", 5000, 4);
    pc_close(&p);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);

    /* Started without the pool, which SIGHUP then adds over the old segment. */
    assert_int_equal(h_write_file(conf, one, strlen(one)), 0);
    d = restart(f, d1, args);
    reload_with(f, d, conf, two);
    log_has(d, "SIGHUP: pool 'extra' added: segment ");
    pc_connect(&p, d, "extra");
    assert_false(pc_contains(&p, "q/feed/7"));
    pc_check(&p, "plain", 5000, 4, false);
    pc_close(&p);
    log_has(d, "pool 'extra': deleted 1 object of queues of an earlier run");
    h_pass(f);
}

/* Issue 14: a pool SIGHUP adds passes the space check first. In a 4 MiB
 * tmpfs holding a 2 MiB pool, a 4 MiB pool is not added (logged with the
 * numbers, no file made, hello to it ENOENT); a 1 MiB one then is. */
static void test_pool_reload_space(void **state)
{
    struct h_fix *f = *state;
    static const char one[] = "pool = a:2M\n";
    static const char big[] = "pool = a:2M\npool = b:4M\n";
    static const char small[] = "pool = a:2M\npool = b:1M\n";
    char conf[PATH_MAX], dir[PATH_MAX], path[PATH_MAX * 2], want[PATH_MAX + 160];
    struct h_daemon *d;
    struct h_conn c;
    struct pc p;

    if (geteuid() != 0)
        h_skip(f, "needs root to mount a tmpfs");
    if (h_mount_tmpfs(f, "4m", dir, sizeof(dir)) < 0)
        h_skip(f, "cannot mount a tmpfs here");
    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, one, strlen(one)), 0);
    d = h_daemon_new(f, "1M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--config", conf, NULL}) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("a 2 MiB pool did not start in a 4 MiB tmpfs");
    }
    pool_path(d, "b", path, sizeof(path));

    reload_with(f, d, conf, big);
    snprintf(want, sizeof(want),
             "SIGHUP: pool 'b' not added: Pool 'b' does not fit: Insufficient space in %s: "
             "4 MiB required, 2 MiB free",
             dir);
    log_has(d, want);
    assert_false(h_exists(path));
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"b\"}", "ENOENT",
                   "its pools are: a.");
    h_conn_close(&c);

    reload_with(f, d, conf, small);
    log_has(d, "SIGHUP: pool 'b' added: segment ");
    pc_connect(&p, d, "b");
    pc_put(&p, "fits", 500000, 6);
    pc_check(&p, "fits", 500000, 6, false);
    pc_close(&p);
    assert_true(h_exists(path));
    h_pass(f);
}

/* Whether the daemon pid holds a memfd named name. */
static bool holds_memfd(pid_t pid, const char *name)
{
    char dir[64], link[PATH_MAX], target[PATH_MAX], want[PATH_MAX];
    struct dirent *e;
    bool found = false;
    DIR *dp;
    ssize_t n;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    if ((dp = opendir(dir)) == NULL)
        return false;
    while (!found && (e = readdir(dp)) != NULL) {
        snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
        n = readlink(link, target, sizeof(target) - 1);
        if (n > 0) {
            target[n] = '\0';
            found = strcmp(target, want) == 0;
        }
    }
    closedir(dp);
    return found;
}

/* Issue 14: a memfd pool serves clients while the shm directory is a 1 MiB
 * tmpfs: objects larger than that directory go in and come back, nothing
 * appears in the directory, and nothing is left after the daemon stops.
 * Without root (no mount), the shm directory is an empty directory. */
static void test_pool_memfd(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    char dir[PATH_MAX], name[128], pattern[PATH_MAX];
    json_t *hello, *st;
    glob_t g;
    struct pc p;

    if (geteuid() != 0 || h_mount_tmpfs(f, "1m", dir, sizeof(dir)) < 0) {
        h_path(f, "shm", dir, sizeof(dir));
        assert_int_equal(mkdir(dir, 0700), 0);
    }
    d = h_daemon_new(f, "1M");
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", dir);
    assert_true(h_daemon_spawn(f, d, (const char *const[]){"--pool", "mem:8M,backing=memfd",
                                                            NULL}) > 0);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("a memfd pool did not start with a 1 MiB shm directory");
    }
    snprintf(name, sizeof(name), "%s.mem", d->name);
    assert_true(holds_memfd(d->pid, name));
    log_has(d, "pool 'mem' is a memfd: it has no name, so it cannot be adopted after a "
               "restart");
    hello = pc_open(&p, d, NULL);
    assert_string_equal(h_str(hello, "pool"), "mem");
    assert_string_equal(h_str(hello, "backing"), "memfd");
    assert_int_equal(h_int(hello, "size"), 8 << 20);
    json_decref(hello);
    pc_put(&p, "big", 2000000, 1);
    pc_put(&p, "bigger", 3000000, 2);
    pc_check(&p, "big", 2000000, 1, false);
    pc_check(&p, "bigger", 3000000, 2, false);
    st = pc_stats(&p);
    assert_string_equal(h_str(st, "shm_dir"), "");
    assert_string_equal(h_str(pools_entry(st, "mem"), "backing"), "memfd");
    assert_string_equal(h_str(pools_entry(st, "mem"), "shm_dir"), "");
    json_decref(st);
    assert_int_equal(dir_entries(dir), 0);
    pc_close(&p);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_int_equal(dir_entries(dir), 0);
    snprintf(pattern, sizeof(pattern), "/dev/shm/*%s*", d->name);
    assert_int_equal(glob(pattern, 0, NULL, &g), GLOB_NOMATCH);
    h_pass(f);
}

/* Issue 14: a daemon without --pool behaves as before: its one pool is named
 * by --name, its segment is the file of that name, a hello without "pool"
 * and one naming it both work, and the library puts and gets as ever. */
static void test_pool_implicit(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "2M", NULL);
    char path[PATH_MAX * 2];
    json_t *hello, *st;
    struct pc p;
    shmb_t *c;

    h_segment_path(d, path, sizeof(path));
    assert_true(h_exists(path));
    hello = pc_open(&p, d, NULL);
    assert_string_equal(h_str(hello, "pool"), d->name);
    assert_string_equal(h_str(hello, "backing"), "shm");
    assert_string_equal(h_str(hello, "segment"), d->name);
    assert_int_equal(h_int(hello, "size"), 2 << 20);
    json_decref(hello);
    pc_put(&p, "raw", 777, 3);
    st = pc_stats(&p);
    assert_string_equal(h_str(st, "pool"), d->name);
    assert_string_equal(h_str(st, "segment"), d->name);
    assert_int_equal(json_array_size(json_object_get(st, "pools")), 1);
    assert_string_equal(h_str(pools_entry(st, d->name), "segment"), d->name);
    json_decref(st);
    pc_close(&p);
    pc_connect(&p, d, d->name);
    pc_check(&p, "raw", 777, 3, false);
    pc_close(&p);
    c = h_lib_connect(d, "lib", 0);
    ok(c, h_put_pattern(c, "lib", 5000, 4, 0));
    get_check(c, "lib", 5000, 4);
    get_check(c, "raw", 777, 3);
    shmb_close(c);
    h_pass(f);
}

/* Review: a waiting alloc in a full pool holds back only its own pool. Pools
 * a and b are full of awaited objects; a waiter on a (wait_ms 20 s) comes
 * first, then a waiter on b; room made in b serves b's waiter at once,
 * while a's still waits (it has no reply yet, long before its deadline). */
static void test_pool_wait_per_pool(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(
        f, "1M", (const char *const[]){"--pool", "a:1M", "--pool", "b:1M", NULL});
    struct pc a, b, wa, wb;
    char *line = NULL, line_a[128], line_b[128];
    json_t *reply;
    long long max;

    pc_connect(&a, d, "a");
    pc_connect(&b, d, "b");
    reply = pc_call(&a, "{\"op\":\"stats\"}");
    max = h_int(reply, "max_object_size");
    json_decref(reply);
    /* Each pool: one object awaiting a read, and no room for another. */
    json_decref(pc_call(&a, "{\"op\":\"alloc\",\"key\":\"x\",\"size\":%lld,\"readers\":1}", max));
    json_decref(pc_call(&a, "{\"op\":\"commit\",\"key\":\"x\"}"));
    json_decref(pc_call(&b, "{\"op\":\"alloc\",\"key\":\"y\",\"size\":%lld,\"readers\":1}", max));
    json_decref(pc_call(&b, "{\"op\":\"commit\",\"key\":\"y\"}"));
    pc_connect(&wa, d, "a");
    pc_connect(&wb, d, "b");
    /* As large as an object may be: more than either pool has free. */
    snprintf(line_a, sizeof(line_a),
             "{\"op\":\"alloc\",\"key\":\"wa\",\"size\":%lld,\"wait_ms\":20000}", max);
    snprintf(line_b, sizeof(line_b),
             "{\"op\":\"alloc\",\"key\":\"wb\",\"size\":%lld,\"wait_ms\":20000}", max);
    assert_int_equal(h_conn_sendline(&wa.conn, line_a), 0);
    h_sleep_ms(100); /* a's waiter is the older */
    assert_int_equal(h_conn_sendline(&wb.conn, line_b), 0);
    h_sleep_ms(100);
    /* Room in b: its object read (and released), so it may go. */
    reply = pc_call(&b, "{\"op\":\"get\",\"key\":\"y\"}");
    h_assert_ok(reply);
    json_decref(reply);
    json_decref(pc_call(&b, "{\"op\":\"release\",\"key\":\"y\"}"));
    reply = h_recv_json(&wb.conn);
    h_assert_ok(reply);
    json_decref(reply);
    /* a's waiter is still waiting: nothing has come on its connection. */
    assert_int_equal(h_conn_recv_line(&wa.conn, &line, 0), -ETIMEDOUT);
    free(line);
    pc_close(&wa);
    pc_close(&wb);
    pc_close(&a);
    pc_close(&b);
    h_pass(f);
}

/* Review: a reload from sixteen empty pools to one new pool removes the
 * sixteen and adds the new one (the room they free counts). */
static void test_pool_reload_sixteen(void **state)
{
    struct h_fix *f = *state;
    char conf[PATH_MAX], text[1024];
    size_t used = 0;
    struct h_daemon *d;
    struct h_conn c;
    struct pc p;
    int i;

    for (i = 0; i < 16; i++)
        used += (size_t)snprintf(text + used, sizeof(text) - used, "pool = p%d:64K\n", i);
    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, text, strlen(text)), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    reload_with(f, d, conf, "pool = x:64K\n");
    log_has(d, "SIGHUP: pool 'x' added");
    pc_connect(&p, d, "x");
    pc_close(&p);
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    h_expect_error(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"p0\"}", "ENOENT",
                   "its pools are: x.");
    h_conn_close(&c);
    h_pass(f);
}

/* Review: the default pool resized refuses the start (clients that name no
 * pool would land in another), with the hint; a pool no longer configured
 * is named in the log of the next start, and left as it is. */
static void test_pool_restart_default_and_gone(void **state)
{
    struct h_fix *f = *state;
    static const char *const pools[] = {"--keep-segment", "--pool", "a:2M", "--pool", "b:2M",
                                        NULL};
    static const char *const a_resized[] = {"--pool", "a:3M", "--pool", "b:2M", NULL};
    static const char *const b_gone[] = {"--pool", "a:2M", NULL};
    struct h_daemon *d1 = h_daemon_start(f, "1M", pools), *d;
    char path[PATH_MAX * 2], want[PATH_MAX * 3];
    struct pc p;

    pc_connect(&p, d1, "b");
    pc_put(&p, "kept", 1000, 5);
    pc_close(&p);
    assert_int_equal(h_exit_code(h_daemon_signal(d1, SIGTERM, H_STOP_TIMEOUT_MS)), 0);

    d = h_daemon_again(f, d1);
    assert_int_equal(start_refused(f, d, a_resized), 1);
    log_has(d, "Pool 'a' is not served");
    log_has(d, "It is the default pool (the first), which clients that name no pool use: "
               "shmbrokerd does not start without it.");

    d = restart(f, d1, b_gone);
    pool_path(d1, "b", path, sizeof(path));
    snprintf(want, sizeof(want), "segment %s is not one of the configured pools'", path);
    log_has(d, want);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_true(h_exists(path));
    d = restart(f, d1, pools);
    pc_connect(&p, d, "b");
    pc_check(&p, "kept", 1000, 5, false);
    pc_close(&p);
    h_pass(f);
}

/* h_teardown, then remove the pool segments and lock files the daemons of
 * this test left in /dev/shm (a killed or refused daemon leaves them, and
 * the harness knows only the one segment named --name). */
static int pools_teardown(void **state)
{
    char names[H_MAX_DAEMONS][64], pattern[PATH_MAX];
    struct h_fix *f = *state;
    int n = 0, i, j, rc;
    glob_t g;

    for (i = 0; f != NULL && i < f->ndaemons; i++)
        snprintf(names[n++], sizeof(names[0]), "%s", f->daemons[i].name);
    rc = h_teardown(state);
    for (i = 0; i < n; i++) {
        if (strncmp(names[i], "shmbt-", 6) != 0)
            continue;
        snprintf(pattern, sizeof(pattern), "/dev/shm/%s.*", names[i]);
        if (glob(pattern, 0, NULL, &g) == 0)
            for (j = 0; j < (int)g.gl_pathc; j++)
                unlink(g.gl_pathv[j]);
        globfree(&g);
        snprintf(pattern, sizeof(pattern), "/dev/shm/.%s.*", names[i]);
        if (glob(pattern, GLOB_PERIOD, NULL, &g) == 0)
            for (j = 0; j < (int)g.gl_pathc; j++)
                unlink(g.gl_pathv[j]);
        globfree(&g);
    }
    return rc;
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, pools_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_pool_full_isolated), TEST(test_pool_keys),    TEST(test_pool_max_object),
        TEST(test_pool_unknown),       TEST(test_pool_group),   TEST(test_pool_restart),
        TEST(test_pool_space_check),   TEST(test_pool_status),  TEST(test_pool_reload),
        TEST(test_pool_reload_space),  TEST(test_pool_memfd),   TEST(test_pool_implicit),
        TEST(test_pool_wait_per_pool), TEST(test_pool_reload_sixteen),
        TEST(test_pool_restart_default_and_gone), TEST(test_pool_group_default),
        TEST(test_pool_reload_adopts_as_start),
        TEST(test_pool_group_hides_names),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_pools", tests, NULL, NULL);
}
