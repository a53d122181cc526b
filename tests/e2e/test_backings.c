// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of a pool on hugetlbfs (--pool ...,backing=hugetlbfs,
 * dir=MOUNT): the size rounded up to whole huge pages, the start-up check
 * counted in free huge pages, objects served from the huge-page file, and
 * the file a killed daemon left marked retired before --fresh removes it.
 * Needs root, a hugetlbfs mount and huge pages the kernel can reserve; the
 * test reserves a few (vm.nr_hugepages), and gives them back at exit.
 * Skipped, with the reason, where that cannot be done.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"

static long saved_nr = -1; /* vm.nr_hugepages before the test, -1 untouched */

static long read_long(const char *path)
{
    char buf[64] = "";
    FILE *fp = fopen(path, "re");
    long v = -1;

    if (fp != NULL) {
        if (fgets(buf, sizeof(buf), fp) != NULL)
            v = strtol(buf, NULL, 10);
        fclose(fp);
    }
    return v;
}

static bool write_long(const char *path, long v)
{
    FILE *fp = fopen(path, "we");
    bool ok;

    if (fp == NULL)
        return false;
    ok = fprintf(fp, "%ld\n", v) > 0;
    return fclose(fp) == 0 && ok;
}

/* /proc/meminfo's "NAME: N" */
static long meminfo(const char *name)
{
    char line[256];
    size_t len = strlen(name);
    FILE *fp = fopen("/proc/meminfo", "re");
    long v = -1;

    while (fp != NULL && fgets(line, sizeof(line), fp) != NULL)
        if (strncmp(line, name, len) == 0 && line[len] == ':')
            v = strtol(line + len + 1, NULL, 10);
    if (fp != NULL)
        fclose(fp);
    return v;
}

static void restore_hugepages(void)
{
    if (saved_nr >= 0)
        write_long(NR_HUGEPAGES, saved_nr);
    saved_nr = -1;
}

/* Reserve 4 more huge pages and mount hugetlbfs in f->dir; the mount's
 * path in dir, its page size in *page. A reason when it cannot be done. */
static const char *hugetlbfs_setup(struct h_fix *f, char *dir, size_t len, long *page)
{
    long nr;

    if (geteuid() != 0)
        return "not root: cannot reserve huge pages or mount hugetlbfs";
    *page = meminfo("Hugepagesize") * 1024;
    if (*page <= 0 || (nr = read_long(NR_HUGEPAGES)) < 0)
        return "no huge pages on this kernel";
    /* Given back at the test's end, or at exit when a test failed first. */
    if (saved_nr < 0) {
        static bool registered;

        saved_nr = nr;
        if (!registered)
            atexit(restore_hugepages);
        registered = true;
    }
    if (!write_long(NR_HUGEPAGES, saved_nr + 4) || meminfo("HugePages_Free") < 4)
        return "the kernel could not reserve 4 huge pages";
    snprintf(dir, len, "%s/huge", f->dir);
    if (mkdir(dir, 0755) != 0 || mount("none", dir, "hugetlbfs", 0, NULL) != 0)
        return "cannot mount hugetlbfs";
    snprintf(f->mounts[f->nmounts++], sizeof(f->mounts[0]), "%s", dir);
    return NULL;
}

/* Proves a hugetlbfs pool: its size is rounded up to whole huge pages (and
 * the log says so), hello says "hugetlbfs" and passes a descriptor of the
 * file on the mount, an object written through it reads back, another
 * pool beside it is an ordinary file, and the stop removes the file. */
static void test_hugetlbfs_pool(void **state)
{
    struct h_fix *f = *state;
    char mnt[PATH_MAX], pool[PATH_MAX + 64], file[PATH_MAX + 320], want[128];
    const char *skip;
    struct h_daemon *d = h_daemon_new(f, "2M");
    struct h_conn c;
    json_t *reply;
    long page = 0;
    unsigned char *map;
    long long off, size;

    if ((skip = hugetlbfs_setup(f, mnt, sizeof(mnt), &page)) != NULL) {
        restore_hugepages();
        h_skip(f, skip);
        return;
    }
    /* One huge page and a bit: two of them. */
    snprintf(pool, sizeof(pool), "big:%ld,backing=hugetlbfs,dir=%s", page + 4096, mnt);
    {
        const char *extra[] = {"--pool", pool, "--pool", "small:1M", NULL};

        assert_true(h_daemon_spawn(f, d, extra) > 0);
    }
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd did not start with a hugetlbfs pool");
    }
    snprintf(want, sizeof(want), "rounded up to %ld bytes", 2 * page);
    assert_true(h_log_contains(d, want));
    snprintf(file, sizeof(file), "%s/%s.big", mnt, d->name);
    assert_true(h_exists(file));

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"big\"}");
    h_assert_ok(reply);
    assert_string_equal(h_str(reply, "backing"), "hugetlbfs");
    size = h_int(reply, "size");
    assert_int_equal(size, 2 * page);
    json_decref(reply);
    assert_int_equal(c.nfds, 1);
    map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, c.fds[0], 0);
    assert_true(map != MAP_FAILED);
    reply = h_call(&c, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":100000}");
    off = h_int(reply, "offset");
    json_decref(reply);
    h_fill(map + off, 100000, 7);
    json_decref(h_call(&c, "{\"op\":\"commit\",\"key\":\"k\"}"));
    munmap(map, (size_t)size);
    h_conn_close(&c);

    /* Read back on a connection of its own, through a mapping of its own. */
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    json_decref(h_call(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"big\",\"mode\":\"ro\"}"));
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, c.fds[0], 0);
    assert_true(map != MAP_FAILED);
    reply = h_call(&c, "{\"op\":\"get\",\"key\":\"k\"}");
    h_assert_ok(reply);
    assert_int_equal(h_check(map + h_int(reply, "offset"), 100000, 7), 100000);
    json_decref(reply);
    munmap(map, (size_t)size);
    h_conn_close(&c);

    assert_int_equal(h_daemon_signal(d, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    assert_false(h_exists(file));
    restore_hugepages();
    h_pass(f);
}

/* Proves that a hugetlbfs pool is checked against the free huge pages:
 * one larger than all of them is refused at start-up, exit 1, naming the
 * mount and the huge pages, and nothing is left on the mount. */
static void test_hugetlbfs_too_big(void **state)
{
    struct h_fix *f = *state;
    char mnt[PATH_MAX], pool[PATH_MAX + 64], file[PATH_MAX + 320];
    const char *skip;
    struct h_daemon *d = h_daemon_new(f, "2M");
    long page = 0, free_pages;
    int status;

    if ((skip = hugetlbfs_setup(f, mnt, sizeof(mnt), &page)) != NULL) {
        restore_hugepages();
        h_skip(f, skip);
        return;
    }
    free_pages = meminfo("HugePages_Free");
    snprintf(pool, sizeof(pool), "big:%ld,backing=hugetlbfs,dir=%s", (free_pages + 1) * page,
             mnt);
    {
        const char *extra[] = {"--pool", pool, NULL};

        assert_true(h_daemon_spawn(f, d, extra) > 0);
    }
    status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
    assert_int_equal(h_exit_code(status), 1);
    assert_true(h_log_contains(d, "Pool 'big' does not fit"));
    assert_true(h_log_contains(d, "free huge pages"));
    snprintf(file, sizeof(file), "%s/%s.big", mnt, d->name);
    assert_false(h_exists(file));
    restore_hugepages();
    h_pass(f);
}

/* Proves that a daemon started with --fresh marks the hugetlbfs segment a
 * killed daemon left retired (proto/layout.h) before it removes it, as it
 * does a file in /dev/shm: the readers that still map it stop answering
 * from it at once. hugetlbfs has no write(), so a pwrite() of the word
 * cannot do it. */
static void test_hugetlbfs_fresh_retires(void **state)
{
    struct h_fix *f = *state;
    char mnt[PATH_MAX], pool[PATH_MAX + 64], file[PATH_MAX + 320];
    const char *skip;
    struct h_daemon *d = h_daemon_new(f, "2M"), *d2;
    const uint32_t *retired;
    long page = 0;
    unsigned char *map;
    int fd;

    if ((skip = hugetlbfs_setup(f, mnt, sizeof(mnt), &page)) != NULL) {
        restore_hugepages();
        h_skip(f, skip);
        return;
    }
    snprintf(pool, sizeof(pool), "big:%ld,backing=hugetlbfs,dir=%s", page, mnt);
    {
        const char *extra[] = {"--pool", pool, NULL};

        assert_true(h_daemon_spawn(f, d, extra) > 0);
        if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
            h_daemon_print_log(d);
            h_fail("shmbrokerd did not start with a hugetlbfs pool");
        }
        /* The mapping a reader of the daemon keeps. */
        snprintf(file, sizeof(file), "%s/%s.big", mnt, d->name);
        fd = open(file, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        map = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(map != MAP_FAILED);
        close(fd);
        retired = (const uint32_t *)(map + 140);
        assert_int_equal(__atomic_load_n(retired, __ATOMIC_ACQUIRE), 0);
        assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                         128 + SIGKILL);
        d2 = h_daemon_again(f, d);
        {
            const char *again[] = {"--pool", pool, "--fresh", NULL};

            assert_true(h_daemon_spawn(f, d2, again) > 0);
        }
        if (h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0) {
            h_daemon_print_log(d2);
            h_fail("shmbrokerd --fresh did not start with a hugetlbfs pool");
        }
    }
    assert_true(h_log_contains(d2, "removed segment"));
    if (__atomic_load_n(retired, __ATOMIC_ACQUIRE) == 0)
        h_fail("the hugetlbfs segment %s left by a killed daemon was removed by --fresh "
               "without being marked retired",
               file);
    munmap(map, (size_t)page);
    assert_int_equal(h_daemon_signal(d2, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    restore_hugepages();
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_hugetlbfs_pool),
        TEST(test_hugetlbfs_too_big),
        TEST(test_hugetlbfs_fresh_retires),
    };

    return cmocka_run_group_tests_name("test_backings", tests, NULL, NULL);
}
