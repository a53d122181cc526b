// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of `shmbrokerctl check` (shmbrokerd --check): on a real
 * 1 MiB tmpfs, pools that do not fit exit 1 with the fix for where the test
 * runs (a Kubernetes emptyDir when $KUBERNETES_SERVICE_HOST is set), pools
 * that fit exit 0, two pools that fit alone but not together name the second,
 * memfd pools are weighed against memory, and a missing shmbrokerd is said.
 * The tmpfs needs root; without it those tests are skipped.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* A 1 MiB tmpfs in the fixture's directory, into dir; skips without root. */
static void small_tmpfs(struct h_fix *f, char *dir, size_t len)
{
    int rc;

    if (geteuid() != 0)
        h_skip(f, "needs root (mount)");
    if ((rc = h_mount_tmpfs(f, "1m", dir, len)) < 0)
        h_fail("cannot mount a tmpfs: %s", strerror(-rc));
}

/* shmbrokerctl check ARGS... (NULL-terminated), with a segment name of the
 * test's own so that nothing of another run is looked at. */
static void check(struct h_fix *f, struct h_run *r, ...)
{
    const char *argv[32];
    int n = 0;
    const char *a;
    va_list ap;
    char name[64];

    snprintf(name, sizeof(name), "shmbt-%d-size", (int)getpid());
    argv[n++] = h_ctl_bin();
    argv[n++] = "check";
    argv[n++] = "--name";
    argv[n++] = name;
    va_start(ap, r);
    while ((a = va_arg(ap, const char *)) != NULL && n < 31)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    if (h_run(f, argv, NULL, 0, r) < 0)
        h_fail("cannot run %s", argv[0]);
}

/* The report's fix when the test's environment is a bare host or Docker
 * (where the daemon runs, as host_container tells it): a 64M pool on a 1 MiB
 * tmpfs asks for 80 MiB (64 and the 16 MiB of headroom) there, and for the
 * memfd backing instead. */
static void test_small_tmpfs_prints_fix(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX], want[PATH_MAX + 64];
    const char *k8s = getenv("KUBERNETES_SERVICE_HOST");
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    if (k8s != NULL && k8s[0] != '\0')
        h_skip(f, "runs in a Kubernetes pod: test_kubernetes_fix covers that fix");
    check(f, &r, "--shm-dir", dir, "--size", "64M", NULL);
    h_expect_run(&r, 1, "does NOT fit", NULL);
    h_expect_run(&r, 1, "Summary: 1 of 1 pool does NOT fit", NULL);
    if (access("/.dockerenv", F_OK) == 0) {
        snprintf(want, sizeof(want), "docker run --tmpfs %s:size=80m", dir);
        h_expect_run(&r, 1, "To fix it (Docker)", NULL);
    } else if (h_contains(r.out, "on a container")) {
        snprintf(want, sizeof(want), "docker run --tmpfs %s:size=80m", dir);
    } else {
        snprintf(want, sizeof(want), "mount -o remount,size=80M %s", dir);
        h_expect_run(&r, 1, "To fix it (bare host)", NULL);
    }
    h_expect_run(&r, 1, want, NULL);
    h_expect_run(&r, 1, ",backing=memfd", NULL);
    h_expect_run(&r, 1, "64M,backing=memfd", NULL);
    h_run_free(&r);
    h_pass(f);
}

/* In a pod ($KUBERNETES_SERVICE_HOST set): the fix is an emptyDir of medium
 * Memory, of 80Mi, mounted where the pool's directory is. */
static void test_kubernetes_fix(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX], want[PATH_MAX + 32];
    char *old = getenv("KUBERNETES_SERVICE_HOST");
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    old = old != NULL ? strdup(old) : NULL;
    setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
    check(f, &r, "--shm-dir", dir, "--size", "64M", NULL);
    if (old != NULL)
        setenv("KUBERNETES_SERVICE_HOST", old, 1);
    else
        unsetenv("KUBERNETES_SERVICE_HOST");
    free(old);
    h_expect_run(&r, 1, "on Kubernetes", NULL);
    h_expect_run(&r, 1, "To fix it (Kubernetes)", NULL);
    h_expect_run(&r, 1, "emptyDir: {medium: Memory, sizeLimit: 80Mi}", NULL);
    snprintf(want, sizeof(want), "mountPath: %s\n", dir);
    h_expect_run(&r, 1, want, NULL);
    if (h_contains(r.out, "docker run"))
        h_fail("a Docker fix in a pod:\n%s", r.out);
    h_run_free(&r);
    h_pass(f);
}

/* What fits exits 0 and says so, with the tmpfs's free space. */
static void test_fits(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX];
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    check(f, &r, "--shm-dir", dir, "--size", "512K", NULL);
    h_expect_run(&r, 0, "fits (needs 512 KiB; 1 MiB free)", NULL);
    h_expect_run(&r, 0, "Summary: the pool fits.", NULL);
    if (h_contains(r.out, "NOT"))
        h_fail("a pool that fits reported otherwise:\n%s", r.out);
    h_run_free(&r);
    h_pass(f);
}

/* Two pools on one tmpfs that fit one at a time but not together: exit 1,
 * the second named as the one that does not fit; each alone exits 0. */
static void test_pools_together(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX];
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    check(f, &r, "--shm-dir", dir, "--pool", "first:600K", NULL);
    h_expect_run(&r, 0, "pool 'first' (shm, 600 KiB)", NULL);
    h_run_free(&r);
    check(f, &r, "--shm-dir", dir, "--pool", "second:600K", NULL);
    h_expect_run(&r, 0, "pool 'second' (shm, 600 KiB)", NULL);
    h_run_free(&r);
    check(f, &r, "--shm-dir", dir, "--pool", "first:600K", "--pool", "second:600K", NULL);
    h_expect_run(&r, 1, "pool 'first' (shm, 600 KiB)", NULL);
    h_expect_run(&r, 1, "does NOT fit (needs 1.2 MiB with the pools above; 1 MiB free)",
                 NULL);
    h_expect_run(&r, 1, "Summary: 1 of 2 pools does NOT fit: 'second'.", NULL);
    if (!h_contains(strstr(r.out, "pool 'first'"), ": fits (needs 600 KiB"))
        h_fail("the first pool should fit:\n%s", r.out);
    h_run_free(&r);
    h_pass(f);
}

/* A segment of the pool's name and size already there (a daemon that
 * kept it, or is running) would be adopted: its pages count as the pool's
 * own, not as space it still needs, and the report says so. */
static void test_existing_segment(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX], path[PATH_MAX + 64];
    static char data[600 * 1024];
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/shmbt-%d-size.first", dir, (int)getpid());
    memset(data, 1, sizeof(data));
    assert_int_equal(h_write_file(path, data, sizeof(data)), 0);
    check(f, &r, "--shm-dir", dir, "--pool", "first:600K", NULL);
    h_expect_run(&r, 0, "fits (needs 0 B;", NULL);
    h_expect_run(&r, 0, "the segment is there already, of this size", NULL);
    h_run_free(&r);
    check(f, &r, "--shm-dir", dir, "--pool", "first:604K", NULL);
    h_expect_run(&r, 1, "Summary: 1 of 1 pool does NOT fit: 'first'.", NULL);
    h_run_free(&r);
    assert_int_equal(unlink(path), 0);
    h_pass(f);
}

/* A memfd pool takes no room in the shm directory, however small: it is
 * weighed against memory (MemAvailable, the cgroup). One larger than the
 * memory there is does not fit. */
static void test_memfd_against_memory(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX];
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    check(f, &r, "--shm-dir", dir, "--pool", "cache:8M,backing=memfd", NULL);
    h_expect_run(&r, 0, "available (MemAvailable)", NULL);
    h_expect_run(&r, 0, "memory (memfd pools):", NULL);
    h_expect_run(&r, 0, "pool 'cache' (memfd, 8 MiB) -> memfd:", NULL);
    h_expect_run(&r, 0, "fits (needs 8 MiB;", NULL);
    if (h_contains(r.out, dir))
        h_fail("a memfd pool was put in the shm directory:\n%s", r.out);
    h_run_free(&r);
    check(f, &r, "--shm-dir", dir, "--pool", "cache:8M,backing=memfd", "--pool",
          "huge:64T,backing=memfd", NULL);
    h_expect_run(&r, 1, "pool 'huge' (memfd, 64 TiB)", NULL);
    h_expect_run(&r, 1, "Summary: 1 of 2 pools does NOT fit: 'huge'", NULL);
    h_expect_run(&r, 1, "- memory:", NULL);
    h_expect_run(&r, 1, "- memory: NO setting fixes this", NULL);
    h_run_free(&r);
    h_pass(f);
}

/* MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read. */
static unsigned long long mem_available(void)
{
    unsigned long long kib = 0;
    char line[256];
    FILE *fp = fopen("/proc/meminfo", "re");

    if (fp == NULL)
        return 0;
    while (fgets(line, sizeof(line), fp) != NULL)
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(fp);
    return kib * 1024;
}

/* A pool larger than the host's memory: the report says that no setting
 * fixes it (a larger tmpfs only lets the start reserve what is not there),
 * and the tmpfs's figure is explained, not left bare: its parts (the pools,
 * what the mount holds, the headroom) and the same MiB in the command. */
static void test_memory_cannot_hold(void **state)
{
    struct h_fix *f = *state;
    unsigned long long avail = mem_available(), mib = 0;
    char dir[PATH_MAX], size[32], want[64];
    const char *at;
    struct h_run r;

    small_tmpfs(f, dir, sizeof(dir));
    if (avail == 0)
        h_fail("cannot read MemAvailable from /proc/meminfo");
    /* Twice the memory there is, in whole GiB. */
    snprintf(size, sizeof(size), "%lluG", (avail >> 30) * 2 + 2);
    check(f, &r, "--shm-dir", dir, "--size", size, NULL);
    h_expect_run(&r, 1, "does NOT fit, whatever the settings", NULL);
    h_expect_run(&r, 1, "this host's memory cannot hold them, and no setting fixes that.",
                 NULL);
    h_expect_run(&r, 1, "- memory: NO setting fixes this", NULL);
    h_expect_run(&r, 1, "(and memory to hold it, above)", NULL);
    h_expect_run(&r, 1, "of headroom (an eighth, at least 16 MiB", NULL);
    at = strstr(r.out, "a size of ");
    if (at == NULL || sscanf(at, "a size of %llu MiB is the pools' ", &mib) != 1 || mib == 0)
        h_fail("the figure is not explained:\n%s", r.out);
    /* Memory cannot hold it: memfd is no way out either. */
    if (h_contains(r.out, "backing=memfd"))
        h_fail("memfd offered for pools memory cannot hold:\n%s", r.out);
    snprintf(want, sizeof(want), "size=%llu", mib);
    if (!h_contains(r.out, want))
        h_fail("the command does not ask for the %llu MiB explained:\n%s", mib, r.out);
    h_run_free(&r);
    h_pass(f);
}

/* A directory that is not there cannot be checked: exit 2, saying why. */
static void test_missing_dir(void **state)
{
    struct h_fix *f = *state;
    char dir[PATH_MAX];
    struct h_run r;

    h_path(f, "absent", dir, sizeof(dir));
    check(f, &r, "--shm-dir", dir, "--size", "1M", NULL);
    h_expect_run(&r, 2, "No such file or directory", NULL);
    h_run_free(&r);
    h_pass(f);
}

/* Settings a start would refuse are refused by check too, exit 2 with the
 * start's message, not judged on their space: a pool smaller than two
 * pages, a largest object that cannot fit, hugetlbfs on a directory that is
 * not a hugetlbfs mount. */
static void test_bad_settings(void **state)
{
    struct h_fix *f = *state;
    char pool[PATH_MAX + 64];
    struct h_run r;

    check(f, &r, "--pool", "a:100", NULL);
    h_expect_run(&r, 2, NULL, "--pool a: size 100 is too small");
    h_run_free(&r);
    check(f, &r, "--pool", "a:64K,max-object-size=1G", NULL);
    h_expect_run(&r, 2, NULL, "--pool a: Max object size (1073741824 bytes) does not fit");
    h_run_free(&r);
    snprintf(pool, sizeof(pool), "a:4M,backing=hugetlbfs,dir=%s", f->dir);
    check(f, &r, "--pool", pool, NULL);
    h_expect_run(&r, 2, NULL, "is not one (mount -t hugetlbfs none DIR");
    h_run_free(&r);
    h_pass(f);
}

/* shmbrokerctl with no shmbrokerd beside it, in $SHMBROKERD or in PATH:
 * exit 127 and say how to point it at one. */
static void test_no_daemon_found(void **state)
{
    struct h_fix *f = *state;
    char bin[PATH_MAX], *old_path = NULL, *old_d = NULL;
    const char *argv[] = {bin, "check", "--size", "1M", NULL};
    size_t len;
    char *data = h_read_file(h_ctl_bin(), &len);
    struct h_run r;
    int rc;

    assert_non_null(data);
    h_path(f, "shmbrokerctl", bin, sizeof(bin));
    assert_int_equal(h_write_file(bin, data, len), 0);
    free(data);
    assert_int_equal(chmod(bin, 0755), 0);
    if (getenv("PATH") != NULL)
        old_path = strdup(getenv("PATH"));
    if (getenv("SHMBROKERD") != NULL)
        old_d = strdup(getenv("SHMBROKERD"));
    setenv("PATH", "/nonexistent", 1);
    unsetenv("SHMBROKERD");
    rc = h_run(f, argv, NULL, 0, &r);
    if (old_path != NULL)
        setenv("PATH", old_path, 1);
    if (old_d != NULL)
        setenv("SHMBROKERD", old_d, 1);
    free(old_path);
    free(old_d);
    assert_int_equal(rc, 0);
    h_expect_run(&r, 127, NULL, "no shmbrokerd was found");
    h_expect_run(&r, 127, NULL, "SHMBROKERD=");
    h_run_free(&r);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_small_tmpfs_prints_fix),
        TEST(test_kubernetes_fix),
        TEST(test_fits),
        TEST(test_memory_cannot_hold),
        TEST(test_pools_together),
        TEST(test_existing_segment),
        TEST(test_memfd_against_memory),
        TEST(test_missing_dir),
        TEST(test_bad_settings),
        TEST(test_no_daemon_found),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_sizing", tests, NULL, NULL);
}
