// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the host facts (daemon/host.c) over fake /proc and /sys
 * trees written in a temporary directory: cgroup v2 and v1, with and without
 * limits, under a cgroup namespace, none at all, and garbled files. Then the
 * container detection, and the tmpfs fixes daemon/sizing.c prints for each
 * place the daemon can run.
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "host.h"
#include "sizing.h"

#define MIB (1ULL << 20)
#define GIB (1ULL << 30)

/* The fake root of one test. */
static char root[64];

/* mkdir -p root/path's directory, then write text to root/path. */
static void put(const char *path, const char *text)
{
    char full[PATH_MAX], *p;
    FILE *fp;

    snprintf(full, sizeof(full), "%s%s", root, path);
    for (p = full + strlen(root) + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        if (mkdir(full, 0755) != 0 && errno != EEXIST)
            fail_msg("mkdir %s: %s", full, strerror(errno));
        *p = '/';
    }
    fp = fopen(full, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof(root), "/tmp/shmb-host-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];

    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* 4 GiB available. */
static void put_meminfo(void)
{
    put("/proc/meminfo", "MemTotal:       8388608 kB\n"
                         "MemFree:        1048576 kB\n"
                         "MemAvailable:   4194304 kB\n"
                         "Buffers:          10000 kB\n");
}

/* A v2 host: the unified hierarchy at /sys/fs/cgroup, our cgroup path. */
static void put_v2(const char *cgroup)
{
    char line[256];

    put_meminfo();
    snprintf(line, sizeof(line), "0::%s\n", cgroup);
    put("/proc/self/cgroup", line);
    put("/proc/self/mountinfo",
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "35 22 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 "
        "cgroup2 rw,nsdelegate,memory_recursiveprot\n"
        "36 22 0:31 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw\n");
}

/* A v1 host: the memory controller at /sys/fs/cgroup/memory mounted from
 * mount_root, and our cgroup path as /proc/self/cgroup says it. */
static void put_v1(const char *mount_root, const char *cgroup)
{
    char text[1024];

    put_meminfo();
    snprintf(text, sizeof(text),
             "9:name=systemd:/\n"
             "4:memory:%s\n"
             "2:cpuacct,cpu:/\n"
             "0::/\n",
             cgroup);
    put("/proc/self/cgroup", text);
    snprintf(text, sizeof(text),
             "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
             "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup "
             "rw,cpu,cpuacct\n"
             "35 31 0:32 %s /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
             mount_root);
    put("/proc/self/mountinfo", text);
}

/* cgroup v2: the smallest room over our cgroup and its ancestors with a
 * limit wins (here the grandparent's, though the parent's limit is lower),
 * usage less inactive file cache, and the room is that when smaller than
 * MemAvailable. */
static void test_v2_limit(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_v2("/kubepods/pod1/c1");
    put("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n");
    put("/sys/fs/cgroup/kubepods/pod1/c1/memory.current", "1000\n");
    put("/sys/fs/cgroup/kubepods/pod1/memory.max", "1073741824\n");
    put("/sys/fs/cgroup/kubepods/pod1/memory.current", "268435456\n");
    put("/sys/fs/cgroup/kubepods/pod1/memory.stat", "anon 1\ninactive_file 67108864\n");
    put("/sys/fs/cgroup/kubepods/memory.max", "8589934592\n");
    put("/sys/fs/cgroup/kubepods/memory.current", "8053063680\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.mem_available, 4 * GIB);
    assert_int_equal(m.cgroup_version, 2);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(m.cgroup_limit, 8 * GIB);
    assert_int_equal(m.cgroup_usage, 8053063680ULL);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/kubepods");
    assert_int_equal(host_memory_room(&m), 512 * MIB);

    /* Without the grandparent's limit, the parent's counts, its inactive
     * file cache left out of its usage. */
    put("/sys/fs/cgroup/kubepods/memory.max", "max\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(m.cgroup_limit, GIB);
    assert_int_equal(m.cgroup_usage, 256 * MIB - 64 * MIB);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/kubepods/pod1");
    assert_int_equal(host_memory_room(&m), GIB - 192 * MIB);
}

/* cgroup v2 with "max" everywhere: no limit, the room is MemAvailable. */
static void test_v2_max(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_v2("/user.slice/session-1.scope");
    put("/sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
    put("/sys/fs/cgroup/user.slice/session-1.scope/memory.current", "123456\n");
    put("/sys/fs/cgroup/user.slice/memory.max", "max\n");
    put("/sys/fs/cgroup/user.slice/memory.current", "123456\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 2);
    assert_false(m.has_cgroup_limit);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/user.slice/session-1.scope");
    assert_int_equal(host_memory_room(&m), 4 * GIB);
}

/* cgroup v1 with a limit on our cgroup and none (2^63 - 4096) above: the
 * memory controller's line is used, not the v2 "0::/" line beside it. */
static void test_v1_limit(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_v1("/", "/process_api/abc");
    put("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "2147483648\n");
    put("/sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", "1207959552\n");
    put("/sys/fs/cgroup/memory/process_api/abc/memory.stat",
        "cache 1\ninactive_file 5\ntotal_inactive_file 134217728\n");
    put("/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/process_api/memory.usage_in_bytes", "1207959552\n");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/memory.usage_in_bytes", "5000000000\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 1);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(m.cgroup_limit, 2 * GIB);
    assert_int_equal(m.cgroup_usage, GIB);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/memory/process_api/abc");
    assert_int_equal(host_memory_room(&m), GIB);
}

/* cgroup v1 where every limit is the "unlimited" value: no limit. */
static void test_v1_unlimited(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_v1("/", "/process_api/abc");
    put("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes",
        "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", "4169728\n");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/memory.usage_in_bytes", "4169728\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 1);
    assert_false(m.has_cgroup_limit);
    assert_int_equal(host_memory_room(&m), 4 * GIB);
}

/* Under a cgroup namespace (or a container that mounts its own cgroup), the
 * mount's root is our cgroup: its files are at the mount point itself,
 * whether /proc/self/cgroup shows the full path or "/". */
static void test_v1_namespace_root(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_v1("/docker/abc", "/docker/abc");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
    put("/sys/fs/cgroup/memory/memory.usage_in_bytes", "134217728\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(m.cgroup_limit, 512 * MIB);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/memory");
    assert_int_equal(host_memory_room(&m), 384 * MIB);

    put_v1("/docker/abc", "/");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(host_memory_room(&m), 384 * MIB);

    /* A path outside the mount's root names no directory of this mount,
     * even when one of that name is there. */
    put_v1("/docker/abc", "/other");
    put("/sys/fs/cgroup/memory/other/memory.limit_in_bytes", "1048576\n");
    put("/sys/fs/cgroup/memory/other/memory.usage_in_bytes", "0\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_limit, 512 * MIB);
    assert_string_equal(m.cgroup_path, "/sys/fs/cgroup/memory");
}

/* No /proc/self/cgroup, or no mount for the hierarchy it names: no cgroup,
 * MemAvailable alone. */
static void test_no_cgroup(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;

    (void)state;
    put_meminfo();
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 0);
    assert_false(m.has_cgroup_limit);
    assert_string_equal(m.cgroup_path, "");
    assert_int_equal(host_memory_room(&m), 4 * GIB);

    put("/proc/self/cgroup", "0::/a\n");
    put("/proc/self/mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 0);
    assert_int_equal(host_memory_room(&m), 4 * GIB);
}

/* Garbled files: a limit that is not a number and a missing usage count as
 * no limit; lines without fields are skipped; a meminfo without
 * MemAvailable falls back to MemFree; one with neither is a clear error. */
static void test_malformed(void **state)
{
    struct shmb_error err = {0};
    struct host_memory m;
    char path[PATH_MAX];

    (void)state;
    put_v2("/a/b");
    put("/sys/fs/cgroup/a/b/memory.max", "lots\n");
    put("/sys/fs/cgroup/a/b/memory.current", "100\n");
    put("/sys/fs/cgroup/a/memory.max", "1073741824\n"); /* no memory.current */
    put("/sys/fs/cgroup/a/memory.stat", "inactive_file x\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.cgroup_version, 2);
    assert_false(m.has_cgroup_limit);

    /* Usage below the inactive cache it reports, a negative or huge limit. */
    put("/sys/fs/cgroup/a/memory.current", "-5\n");
    put("/sys/fs/cgroup/a/b/memory.max", "99999999999999999999999\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_false(m.has_cgroup_limit);
    put("/sys/fs/cgroup/a/memory.current", "10\n");
    put("/sys/fs/cgroup/a/memory.stat", "inactive_file 4096\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_true(m.has_cgroup_limit);
    assert_int_equal(m.cgroup_usage, 0);
    assert_int_equal(host_memory_room(&m), GIB);

    put("/proc/self/cgroup", "garbage\n::\n4:memory\n\n0::\n");
    put("/proc/self/mountinfo", "nonsense\n1 2 3\n - cgroup2\n35 22 0:30 / - cgroup2\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_false(m.has_cgroup_limit);
    assert_int_equal(host_memory_room(&m), 4 * GIB);

    put("/proc/meminfo", "MemTotal: 100 kB\nMemFree: 2048 kB\n");
    assert_int_equal(host_memory_at(root, &m, &err), 0);
    assert_int_equal(m.mem_available, 2 * MIB);

    put("/proc/meminfo", "MemTotal: lots\nMemAvailable: some\n");
    assert_int_equal(host_memory_at(root, &m, &err), -EIO);
    assert_non_null(strstr(err.message, "/proc/meminfo"));
    assert_non_null(strstr(err.message, "MemAvailable"));

    snprintf(path, sizeof(path), "%s/proc/meminfo", root);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(host_memory_at(root, &m, &err), -EIO);
    assert_non_null(strstr(err.message, "Cannot read available memory"));
}

/* Where it runs: $KUBERNETES_SERVICE_HOST before /.dockerenv (a pod's
 * container can have both), then podman's /run/.containerenv, then a
 * container's cgroup path; else a bare host. */
static void test_container(void **state)
{
    char path[PATH_MAX];

    (void)state;
    put("/proc/self/cgroup", "0::/user.slice/user-1000.slice/session-2.scope\n");
    assert_int_equal(host_container_at(root, NULL), HOST_BARE);
    assert_int_equal(host_container_at(root, ""), HOST_BARE);
    assert_int_equal(host_container_at(root, "10.0.0.1"), HOST_KUBERNETES);
    put("/proc/self/cgroup", "0::/kubepods/besteffort/pod1/abc\n");
    assert_int_equal(host_container_at(root, NULL), HOST_CONTAINER);
    put("/proc/self/cgroup", "4:memory:/docker/0123abcd\n0::/\n");
    assert_int_equal(host_container_at(root, NULL), HOST_CONTAINER);
    put("/proc/self/cgroup", "0::/\n");
    put("/run/.containerenv", "");
    assert_int_equal(host_container_at(root, NULL), HOST_CONTAINER);
    put("/.dockerenv", "");
    assert_int_equal(host_container_at(root, NULL), HOST_DOCKER);
    assert_int_equal(host_container_at(root, "10.0.0.1"), HOST_KUBERNETES);
    snprintf(path, sizeof(path), "%s/.dockerenv", root);
    unlink(path);
    snprintf(path, sizeof(path), "%s/run/.containerenv", root);
    unlink(path);
    assert_int_equal(host_container_at(root, NULL), HOST_BARE);
    assert_string_equal(host_container_name(HOST_BARE), "bare host");
    assert_string_equal(host_container_name(HOST_KUBERNETES), "Kubernetes");
}

/* The fix for a tmpfs, printed into a string. The caller frees. */
static char *fix_text(enum host_container where, const char *mount, uint64_t needed)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);

    assert_non_null(fp);
    sizing_print_tmpfs_fix(fp, where, mount, 64 * MIB, needed);
    fclose(fp);
    return buf;
}

/* The headroom: an eighth, at least 16 MiB, rounded up to whole MiB. */
static void test_headroom(void **state)
{
    (void)state;
    assert_int_equal(sizing_with_headroom_mib(64 * MIB), 80);
    assert_int_equal(sizing_with_headroom_mib(GIB), 1152);
    assert_int_equal(sizing_with_headroom_mib(MIB + 1), 18);
    assert_int_equal(sizing_with_headroom_mib(UINT64_MAX), UINT64_MAX / MIB);
}

/* Each place gets its own fix: Docker's --shm-size and --ipc=host for
 * /dev/shm (--tmpfs for another mount), Kubernetes' emptyDir of medium
 * Memory mounted there, a bare host's remount, both forms for an unknown
 * container. */
static void test_tmpfs_fix(void **state)
{
    char *t;

    (void)state;
    t = fix_text(HOST_DOCKER, "/dev/shm", 256 * MIB);
    assert_non_null(strstr(t, "docker run --shm-size=288m"));
    assert_non_null(strstr(t, "--ipc=host"));
    assert_null(strstr(t, "emptyDir"));
    free(t);
    t = fix_text(HOST_DOCKER, "/srv/shm", 256 * MIB);
    assert_non_null(strstr(t, "docker run --tmpfs /srv/shm:size=288m"));
    assert_null(strstr(t, "--shm-size"));
    free(t);
    t = fix_text(HOST_KUBERNETES, "/dev/shm", 256 * MIB);
    assert_non_null(strstr(t, "- name: dshm\n"));
    assert_non_null(strstr(t, "emptyDir: {medium: Memory, sizeLimit: 288Mi}"));
    assert_non_null(strstr(t, "mountPath: /dev/shm\n"));
    assert_null(strstr(t, "docker"));
    free(t);
    t = fix_text(HOST_BARE, "/dev/shm", 256 * MIB);
    assert_non_null(strstr(t, "mount -o remount,size=288M /dev/shm"));
    assert_null(strstr(t, "docker"));
    free(t);
    t = fix_text(HOST_CONTAINER, "/dev/shm", 256 * MIB);
    assert_non_null(strstr(t, "--shm-size=288m"));
    assert_non_null(strstr(t, "sizeLimit: 288Mi"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_v2_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v2_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_unlimited, setup, teardown),
        cmocka_unit_test_setup_teardown(test_v1_namespace_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_cgroup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_container, setup, teardown),
        cmocka_unit_test(test_headroom),
        cmocka_unit_test(test_tmpfs_fix),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
