// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the segment (daemon/segment.c) on a real 4 MiB tmpfs: the
 * free-space check and its message, the posix_fallocate reservation, the
 * header, exclusive creation and the owner probe. statvfs is wrapped
 * (-Wl,--wrap=statvfs) so that one test can lie about free space; statfs
 * and fopen too (-Wl,--wrap=statfs,--wrap=fopen), so that the test
 * directory can pass for a hugetlbfs mount with the huge page counts of
 * /sys/kernel/mm/hugepages and /proc/meminfo a test chooses; and
 * posix_fallocate (-Wl,--wrap=posix_fallocate), so that a memfd's
 * reservation can fail as under a memory cgroup's limit. Needs root for the
 * tmpfs; without it those tests are reported as skipped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "segment.h"

#define MIB (1024u * 1024u)
/* The tmpfs the free-space tests run on: small, so that 8 MiB cannot fit. */
#define TMPFS_SIZE (4 * MIB)

/* A hugetlbfs mount as a test describes it: the page size, what statvfs
 * says (0 blocks: mounted without size=) and the kernel's counts (NULL: the
 * file is missing). */
static struct {
    bool on;
    uint64_t page;
    uint64_t blocks, bavail; /* in pages */
    const char *free_pages, *resv, *overcommit, *surplus; /* sysfs files */
    const char *meminfo;
} huge;

/* The linker sends space.c's statvfs calls here. */
int __real_statvfs(const char *path, struct statvfs *buf);
int __wrap_statvfs(const char *path, struct statvfs *buf);

static bool statvfs_lie;        /* report a terabyte free */
static unsigned statvfs_calls;  /* proves the wrap is in place */

/* Forward to the real statvfs; when statvfs_lie is set, claim 1 TiB free. */
int __wrap_statvfs(const char *path, struct statvfs *buf)
{
    int rc = __real_statvfs(path, buf);

    statvfs_calls++;
    if (rc == 0 && huge.on) {
        buf->f_bsize = buf->f_frsize = (unsigned long)huge.page;
        buf->f_blocks = (fsblkcnt_t)huge.blocks;
        buf->f_bavail = buf->f_bfree = (fsblkcnt_t)huge.bavail;
    }
    if (rc == 0 && statvfs_lie && buf->f_frsize > 0) {
        buf->f_bavail = (fsblkcnt_t)((1ULL << 40) / buf->f_frsize);
        buf->f_bfree = buf->f_bavail;
    }
    return rc;
}

int __real_statfs(const char *path, struct statfs *buf);
int __wrap_statfs(const char *path, struct statfs *buf);
FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);

/* Forward to the real statfs; with huge.on, report a hugetlbfs mount. */
int __wrap_statfs(const char *path, struct statfs *buf)
{
    int rc = __real_statfs(path, buf);

    if (rc == 0 && huge.on) {
        buf->f_type = 0x958458f6; /* HUGETLBFS_MAGIC */
        buf->f_bsize = (long)huge.page;
    }
    return rc;
}

/* A read-only stream over text, or NULL with ENOENT when text is NULL. */
static FILE *fake_file(const char *text)
{
    if (text == NULL) {
        errno = ENOENT;
        return NULL;
    }
    return fmemopen((void *)text, strlen(text), "r");
}

/* Forward to the real fopen, except the huge page counts with huge.on. */
FILE *__wrap_fopen(const char *path, const char *mode)
{
    static const char sysfs[] = "/sys/kernel/mm/hugepages/";
    char dir[128];

    if (!huge.on)
        return __real_fopen(path, mode);
    if (strcmp(path, "/proc/meminfo") == 0)
        return fake_file(huge.meminfo);
    if (strncmp(path, sysfs, strlen(sysfs)) != 0)
        return __real_fopen(path, mode);
    /* Only the directory of the mount's page size exists. */
    snprintf(dir, sizeof(dir), "%shugepages-%llukB/", sysfs,
             (unsigned long long)(huge.page / 1024));
    if (strncmp(path, dir, strlen(dir)) != 0)
        return fake_file(NULL);
    path += strlen(dir);
    if (strcmp(path, "free_hugepages") == 0)
        return fake_file(huge.free_pages);
    if (strcmp(path, "resv_hugepages") == 0)
        return fake_file(huge.resv);
    if (strcmp(path, "nr_overcommit_hugepages") == 0)
        return fake_file(huge.overcommit);
    if (strcmp(path, "surplus_hugepages") == 0)
        return fake_file(huge.surplus);
    return fake_file(NULL);
}

int __real_posix_fallocate(int fd, off_t offset, off_t len);
int __wrap_posix_fallocate(int fd, off_t offset, off_t len);

static int fallocate_error; /* what posix_fallocate returns instead, or 0 */

/* Forward to the real posix_fallocate, or fail with fallocate_error. */
int __wrap_posix_fallocate(int fd, off_t offset, off_t len)
{
    if (fallocate_error != 0)
        return fallocate_error;
    return __real_posix_fallocate(fd, offset, len);
}

/* The directory every test works in: a tmpfs when we could mount one. */
static char test_dir[64];
static bool mounted;
static char mount_failure[128];

static int group_setup(void **state)
{
    (void)state;
    snprintf(test_dir, sizeof(test_dir), "/tmp/shmb-test-segment-XXXXXX");
    if (mkdtemp(test_dir) == NULL) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    if (mount("tmpfs", test_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0700") == 0) {
        mounted = true;
    } else {
        snprintf(mount_failure, sizeof(mount_failure), "%s", strerror(errno));
        mounted = false;
    }
    return 0;
}

static void empty_test_dir(void)
{
    DIR *d = opendir(test_dir);
    struct dirent *e;
    char path[PATH_MAX];

    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", test_dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static int group_teardown(void **state)
{
    (void)state;
    empty_test_dir();
    if (mounted && umount2(test_dir, 0) != 0 && umount2(test_dir, MNT_DETACH) != 0)
        fprintf(stderr, "umount %s: %s\n", test_dir, strerror(errno));
    if (rmdir(test_dir) != 0)
        fprintf(stderr, "rmdir %s: %s\n", test_dir, strerror(errno));
    return 0;
}

/* Each test starts with an empty directory and an honest statvfs. */
static int test_setup(void **state)
{
    (void)state;
    empty_test_dir();
    statvfs_lie = false;
    fallocate_error = 0;
    memset(&huge, 0, sizeof(huge));
    return 0;
}

/* Skip (reported as skipped, with the reason) when there is no tmpfs. */
static void need_tmpfs(void)
{
    if (!mounted) {
        printf("SKIPPED: cannot mount a tmpfs (%s) — free-space test needs root\n",
               mount_failure);
        skip();
    }
}

static size_t dir_entries(void)
{
    DIR *d = opendir(test_dir);
    struct dirent *e;
    size_t n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* What the real statvfs says is free in the test directory. */
static uint64_t real_free(void)
{
    struct statvfs v;

    assert_int_equal(__real_statvfs(test_dir, &v), 0);
    return (uint64_t)v.f_bavail * v.f_frsize;
}

static void path_in_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", test_dir, name);
}

/* A segment larger than the free space is refused before anything is
 * created, with -ENOSPC and vLLM's message plus our advice, exactly. */
static void test_too_big_refused(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char want[512];
    unsigned calls = statvfs_calls;
    uint64_t free_bytes = 0;

    (void)state;
    need_tmpfs();
    assert_int_equal(real_free(), TMPFS_SIZE);
    assert_int_equal(segment_create(&seg, test_dir, "big", 8 * MIB, 0, &err), -ENOSPC);
    assert_int_equal(err.code, -ENOSPC);
    snprintf(want, sizeof(want),
             "Insufficient space in %s: 8 MiB required, 4 MiB free. Give %s more room "
             "(mount -o remount,size=N on its tmpfs; shmbrokerd --check prints the fix "
             "for where it runs), or choose a smaller --size.",
             test_dir, test_dir);
    assert_string_equal(err.message, want);
    assert_true(statvfs_calls > calls);
    assert_int_equal(dir_entries(), 0);
    assert_int_equal(seg.fd, -1);
    assert_null(seg.base);

    assert_int_equal(segment_check_space(test_dir, 4 * MIB + 1, &free_bytes, &err), -ENOSPC);
    assert_int_equal(free_bytes, TMPFS_SIZE);
    assert_int_equal(segment_check_space(test_dir, 4 * MIB, &free_bytes, &err), 0);
}

/* A segment that fits is created mode 0600, every page reserved (the blocks
 * are allocated and, on the tmpfs, free space drops by its size), mapped,
 * and its header carries magic, version, sizes, data offset 4096 and our
 * pid. Without root it runs in a plain directory. */
static void test_create_fits(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    struct stat st;
    mode_t old_umask;
    time_t now = time(NULL);
    uint64_t size = 2 * MIB;
    const struct shmb_segment_header *h;

    (void)state;
    /* With no umask, an over-permissive mode would show. */
    old_umask = umask(0);
    assert_int_equal(segment_create(&seg, test_dir, "seg", size, 0, &err), 0);
    umask(old_umask);
    assert_true(seg.fd >= 0);
    assert_non_null(seg.base);
    assert_ptr_equal(seg.hdr, seg.base);
    assert_int_equal(seg.size, size);
    assert_int_equal(fstat(seg.fd, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal((uint64_t)st.st_size, size);
    assert_true((uint64_t)st.st_blocks * 512 >= size);
    if (mounted)
        assert_true(real_free() <= TMPFS_SIZE - size);

    h = seg.hdr;
    assert_int_equal(h->magic, SHMB_SEGMENT_MAGIC);
    assert_int_equal(h->version, SHMB_LAYOUT_VERSION);
    assert_int_equal(h->header_size, SHMB_HEADER_PAGE);
    assert_int_equal(h->total_size, size);
    assert_int_equal(h->data_offset, 4096);
    /* Layout 2: the catalog at the end, one slot per 2 KiB, 32 bytes each. */
    assert_int_equal(h->catalog_slots, 1024);
    assert_int_equal(h->catalog_offset, size - 1024 * 32);
    assert_int_equal(h->catalog_seed, seg.catalog_seed);
    assert_int_equal(h->heartbeat_period_ms, 1000);
    assert_int_equal(h->data_size, size - 4096 - 1024 * 32);
    assert_int_equal(h->data_size % SHMB_ALIGN, 0);
    assert_int_equal(h->owner_pid, getpid());
    assert_true(h->created_unix + 60 >= (uint64_t)now && h->created_unix <= (uint64_t)now + 60);
    assert_int_equal(h->ring_start + h->ring_end + h->ring_next_id, 0);
    assert_ptr_equal(segment_data(&seg), (char *)seg.base + 4096);
    /* The whole mapping is usable. */
    memset(segment_data(&seg), 0x5a, h->data_size);
    assert_string_equal(seg.name, "seg");
    segment_destroy(&seg);
    assert_int_equal(dir_entries(), 0);
}

/* A second create of an existing name is -EEXIST and leaves the first
 * segment alone; segment_destroy unlinks the file, and (on the tmpfs) its
 * space returns. */
static void test_exists_and_destroy(void **state)
{
    struct shmb_error err = {0};
    struct segment seg, seg2;
    char path[PATH_MAX];
    struct stat st;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 1 * MIB, 0, &err), 0);
    seg.hdr->ring_next_id = 42;
    assert_int_equal(segment_create(&seg2, test_dir, "seg", 1 * MIB, 0, &err), -EEXIST);
    assert_int_equal(err.code, -EEXIST);
    assert_true(err.message[0] != '\0');
    assert_int_equal(dir_entries(), 2); /* the segment and its lock file */
    assert_int_equal(seg.hdr->magic, SHMB_SEGMENT_MAGIC);
    assert_int_equal(seg.hdr->ring_next_id, 42);
    path_in_dir(path, sizeof(path), "seg");
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, 1 * MIB);

    segment_destroy(&seg);
    assert_int_equal(stat(path, &st), -1);
    assert_int_equal(errno, ENOENT);
    assert_int_equal(seg.fd, -1);
    assert_null(seg.base);
    if (mounted)
        assert_int_equal(real_free(), TMPFS_SIZE);
    /* The name can be used again. */
    assert_int_equal(segment_create(&seg, test_dir, "seg", 1 * MIB, 0, &err), 0);
    segment_close(&seg);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(unlink(path), 0);
}

/* With statvfs lying that a terabyte is free, a segment bigger than the
 * tmpfs passes the check and fails at posix_fallocate: -ENOSPC with an
 * "Insufficient space" message, no file left, and all the space back. This
 * proves the reservation, not the statvfs check, catches a full tmpfs. */
static void test_reservation_catches_full_tmpfs(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char want[128];
    unsigned calls;

    (void)state;
    need_tmpfs();
    statvfs_lie = true;
    calls = statvfs_calls;
    assert_int_equal(segment_check_space(test_dir, 8 * MIB, NULL, &err), 0);
    assert_int_equal(segment_create(&seg, test_dir, "big", 8 * MIB, 0, &err), -ENOSPC);
    statvfs_lie = false;
    assert_true(statvfs_calls >= calls + 2);
    assert_int_equal(err.code, -ENOSPC);
    snprintf(want, sizeof(want), "Insufficient space in %s", test_dir);
    if (strstr(err.message, want) == NULL)
        fail_msg("message lacks '%s': '%s'", want, err.message);
    if (strstr(err.message, "8 MiB") == NULL)
        fail_msg("message does not give the 8 MiB asked for: '%s'", err.message);
    assert_int_equal(dir_entries(), 0);
    assert_int_equal(seg.fd, -1);
    assert_null(seg.base);
    assert_int_equal(real_free(), TMPFS_SIZE);
}

/* A missing shared-memory directory is an error whose message names the
 * directory; so is a path that is not a directory. Nothing is created. */
static void test_missing_directory(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char missing[PATH_MAX], file[PATH_MAX];
    int fd;

    (void)state;
    snprintf(missing, sizeof(missing), "%s/no-such-dir", test_dir);
    assert_int_equal(segment_create(&seg, missing, "seg", 8192, 0, &err), -ENOENT);
    assert_int_equal(err.code, -ENOENT);
    if (strstr(err.message, missing) == NULL)
        fail_msg("message does not name %s: '%s'", missing, err.message);
    assert_int_equal(segment_check_space(missing, 8192, NULL, &err), -ENOENT);
    assert_int_equal(dir_entries(), 0);

    path_in_dir(file, sizeof(file), "plain-file");
    fd = open(file, O_CREAT | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    shmb_error_clear(&err);
    assert_int_equal(segment_create(&seg, file, "seg", 8192, 0, &err), -ENOTDIR);
    if (strstr(err.message, file) == NULL)
        fail_msg("message does not name %s: '%s'", file, err.message);
    assert_int_equal(unlink(file), 0);
}

/* Names that are not a single file name are -EINVAL, from the check and
 * from create, and create nothing. */
static void test_invalid_names(void **state)
{
    static const char *const bad[] = {"", "a/b", "..", ".", "/abs", "dir/"};
    char too_long[NAME_MAX + 2];
    struct shmb_error err = {0};
    struct segment seg;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        shmb_error_clear(&err);
        assert_int_equal(segment_check_name(bad[i], &err), -EINVAL);
        assert_int_equal(err.code, -EINVAL);
        assert_true(err.message[0] != '\0');
        assert_int_equal(segment_create(&seg, test_dir, bad[i], 8192, 0, &err), -EINVAL);
    }
    memset(too_long, 'n', NAME_MAX + 1);
    too_long[NAME_MAX + 1] = '\0';
    assert_int_equal(segment_check_name(too_long, &err), -EINVAL);
    too_long[NAME_MAX] = '\0';
    assert_int_equal(segment_check_name(too_long, &err), 0);
    assert_int_equal(segment_check_name("shmbroker", &err), 0);
    assert_int_equal(segment_check_name("...", &err), 0);
    assert_int_equal(dir_entries(), 0);
}

/* Sizes: segment_round_size rounds up to whole pages (0 on overflow), and
 * create refuses sizes that are not whole pages or below the minimum. */
static void test_sizes(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;

    (void)state;
    assert_int_equal(segment_round_size(1), 4096);
    assert_int_equal(segment_round_size(4096), 4096);
    assert_int_equal(segment_round_size(4097), 8192);
    assert_int_equal(segment_round_size(UINT64_MAX), 0);
    assert_int_equal(segment_create(&seg, test_dir, "s", 4096, 0, &err), -EINVAL);
    assert_int_equal(segment_create(&seg, test_dir, "s", 8192 + 100, 0, &err), -EINVAL);
    assert_int_equal(segment_create(&seg, test_dir, "s", 0, 0, &err), -EINVAL);
    assert_int_equal(dir_entries(), 0);
}

/* segment_probe_existing tells apart no file, a file a live daemon holds
 * locked (us, whatever pid its header names), one nobody holds locked (a
 * segment closed by its owner: orphaned, even though the pid in its header,
 * ours, is alive, and even with pid 1 and start time 0 in the header) and a
 * file that is not a segment (garbage, or too short), and reports the
 * recorded pid; it changes nothing. Issue 10, item 5: before the fix the
 * pid in the header decided, so pid 1 with start time 0 counted as alive. */
static void test_probe_existing(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char path[PATH_MAX], garbage[4096];
    int64_t pid = -1;
    pid_t child;
    int status, fd;

    (void)state;
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_ABSENT);
    assert_int_equal(pid, 0);

    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    assert_int_equal(pid, getpid());

    /* A live owner whose header a client rewrote to name a dead process. */
    child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(0);
    assert_int_equal(waitpid(child, &status, 0), child);
    seg.hdr->owner_pid = child;
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    assert_int_equal(pid, child);

    /* Its owner gone (the lock released), whatever the header says. */
    seg.hdr->owner_pid = 1;
    seg.hdr->owner_start = 0;
    segment_close(&seg);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_ORPHANED);
    assert_int_equal(pid, 1);
    path_in_dir(path, sizeof(path), "seg");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_ABSENT);

    path_in_dir(path, sizeof(path), "junk");
    memset(garbage, 'x', sizeof(garbage));
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, garbage, sizeof(garbage)), (ssize_t)sizeof(garbage));
    close(fd);
    assert_int_equal(segment_probe_existing(test_dir, "junk", &pid), SEGMENT_FOREIGN);
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, garbage, 10), 10);
    close(fd);
    assert_int_equal(segment_probe_existing(test_dir, "junk", &pid), SEGMENT_FOREIGN);
    assert_int_equal(unlink(path), 0);
}

/* Issue 10, item 5. A segment whose owner is gone is adopted whatever its
 * header page says: magic, layout version, sizes, data offset and owner
 * (pid 1, start time 0) are only hints, checked against the file's size.
 * The header is rewritten whole from the file's size (this process the
 * owner), the ring cursor kept, and adopt_note says what was wrong. Before
 * the fix the start refused such a segment (EEXIST, EBUSY or EINVAL),
 * stranding every object in it. */
static void test_adopt_rebuilds_header(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    struct shmb_segment_header *h;
    int64_t pid = -1;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    h = seg.hdr;
    h->ring_start = 128;
    h->ring_end = 640;
    h->ring_next_id = 42;
    h->magic = 0;
    h->version = 7;
    h->header_size = 0;
    h->total_size = 1;
    h->data_offset = 0;
    h->data_size = UINT64_C(1) << 30;
    h->owner_pid = 1;
    h->owner_start = 0;
    segment_close(&seg);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_FOREIGN);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), 0);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 128 * 1024, &err), -EINVAL);
    if (strstr(err.message, "start with --size 65536") == NULL)
        fail_msg("unexpected message: '%s'", err.message);

    if (segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err) != 0)
        fail_msg("segment_adopt: %d %s", err.code, err.message);
    h = seg.hdr;
    assert_int_equal(h->magic, SHMB_SEGMENT_MAGIC);
    assert_int_equal(h->version, SHMB_LAYOUT_VERSION);
    assert_int_equal(h->header_size, SHMB_HEADER_PAGE);
    assert_int_equal(h->total_size, 64 * 1024);
    assert_int_equal(h->data_offset, 4096);
    assert_int_equal(h->data_size, 64 * 1024 - 4096 - 4096); /* a page of catalog */
    assert_int_equal(h->catalog_offset, 64 * 1024 - 4096);
    assert_int_equal(h->catalog_slots, 64);
    assert_int_equal(h->owner_pid, getpid());
    assert_int_equal(h->ring_start, 128);
    assert_int_equal(h->ring_end, 640);
    assert_int_equal(h->ring_next_id, 42);
    assert_int_equal(seg.data_offset, 4096);
    assert_int_equal(seg.data_size, 64 * 1024 - 4096 - 4096);
    if (strstr(seg.adopt_note, "header page damaged (magic 0x0") == NULL)
        fail_msg("unexpected note: '%s'", seg.adopt_note);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    segment_destroy(&seg);
    assert_int_equal(dir_entries(), 0);
}

/* Issue 10, item 2. After segment_adopt the data area's place and size are
 * private values: a client that rewrites data_offset and data_size in the
 * header page once the header was checked (clients keep their mapping
 * across a restart) moves neither segment_data nor the size the daemon
 * uses. Before the fix segment_data read data_offset from the mapping again
 * (and the daemon read data_size from it), so the ring went where the
 * client said. */
static void test_adopt_values_are_private(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    segment_close(&seg);
    if (segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err) != 0)
        fail_msg("segment_adopt: %d %s", err.code, err.message);
    assert_string_equal(seg.adopt_note, "");
    seg.hdr->data_offset = 0;
    seg.hdr->data_size = UINT64_C(1) << 30;
    assert_ptr_equal(segment_data(&seg), (char *)seg.base + 4096);
    assert_int_equal(seg.data_size, 64 * 1024 - 4096 - 4096);
    segment_destroy(&seg);
}

/* A segment of layout version 1 (an older daemon's, whose data area runs
 * to the end of the file where layout 2 keeps its catalog) is not adopted:
 * -EPROTO with what was found, what this daemon writes and the fix; the
 * file stays. An adoption keeps the catalog a layout-2 header describes
 * when --max-objects changed, since the ring's positions depend on the
 * data area's size; guarded atomics work on the mapping. */
static void test_adopt_layouts(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    uint32_t one = 1, two = 2;
    uint64_t word = 0, data_size, data_size1 = 64 * 1024 - 4096, zeros[2] = {0, 0};
    char path[PATH_MAX];
    int fd;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 1000, &err), 0);
    assert_int_equal(seg.catalog_slots, 256); /* 2048 asked, capped at 1/8 of 64 KiB */
    segment_close(&seg);
    assert_int_equal(segment_create(&seg, test_dir, "big", 1 * MIB, 1000, &err), 0);
    assert_int_equal(seg.catalog_slots, 2048);
    data_size = seg.data_size;
    assert_int_equal(segment_atomic_store64(&seg.hdr->ring_next_id, 7), 0);
    assert_int_equal(segment_atomic_exchange64(&seg.hdr->ring_next_id, 9, &word), 0);
    assert_int_equal(word, 7);
    word = 8;
    assert_int_equal(segment_atomic_cas64(&seg.hdr->ring_next_id, &word, 10), -EAGAIN);
    assert_int_equal(word, 9);
    assert_int_equal(segment_atomic_cas64(&seg.hdr->ring_next_id, &word, 10), 0);
    assert_int_equal(segment_atomic_load64(&seg.hdr->ring_next_id, &word), 0);
    assert_int_equal(word, 10);
    seg.hdr->ring_next_id = 0;
    segment_close(&seg);
    assert_int_equal(segment_adopt(&seg, test_dir, "big", 1 * MIB, 0, &err), 0);
    assert_int_equal(seg.catalog_slots, 2048); /* not the default 512 */
    assert_int_equal(seg.data_size, data_size);
    segment_close(&seg);

    path_in_dir(path, sizeof(path), "seg");
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    /* A version of 1 alone is a damaged layout-2 header, rebuilt. */
    assert_int_equal(pwrite(fd, &one, sizeof(one), 8), (ssize_t)sizeof(one));
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), 0);
    /* Layout 1 throughout: the data area to the end, no catalog. */
    assert_int_equal(pwrite(fd, &data_size1, sizeof(data_size1), 32),
                     (ssize_t)sizeof(data_size1));
    assert_int_equal(pwrite(fd, zeros, sizeof(zeros), 88), (ssize_t)sizeof(zeros));
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), -EPROTO);
    if (strstr(err.message, "layout version 1 (65536 bytes)") == NULL ||
        strstr(err.message, "writes layout version 2") == NULL ||
        strstr(err.message, "--remove-segment") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err), -EPROTO);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(pwrite(fd, &two, sizeof(two), 8), (ssize_t)sizeof(two));
    close(fd);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), 0);
    assert_int_equal(unlink(path), 0);
    path_in_dir(path, sizeof(path), "big");
    assert_int_equal(unlink(path), 0);
}

/* Issue 10, item 5. A segment a live daemon holds (its lock) is never
 * adopted by a second one, even when the header names a process that is
 * gone: segment_adopt is -EBUSY and changes nothing. Before the fix only
 * the pid in the header was looked at, and the second daemon adopted the
 * segment under the first. */
static void test_adopt_refuses_locked(void **state)
{
    struct shmb_error err = {0};
    struct segment seg, seg2;
    int64_t pid = -1;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    seg.hdr->owner_pid = 0;
    seg.hdr->owner_start = 0;
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    assert_int_equal(segment_adopt(&seg2, test_dir, "seg", 64 * 1024, 0, &err), -EBUSY);
    if (strstr(err.message, "locked by another running process") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(seg.hdr->owner_pid, 0);
    segment_destroy(&seg);
}

/* Set up the fake hugetlbfs: 2 MiB pages, no size= (statvfs: 0 blocks). */
static void fake_hugetlbfs(const char *free_pages, const char *resv)
{
    memset(&huge, 0, sizeof(huge));
    huge.on = true;
    huge.page = 2 * MIB;
    huge.free_pages = free_pages;
    huge.resv = resv;
}

/* On hugetlbfs mounted without size=, statvfs says 0 blocks: the free space
 * is the free huge pages of the mount's page size not promised to mappings
 * (free_hugepages - resv_hugepages), plus what overcommit still allows;
 * bounded by size= when the mount has one. The message names hugetlbfs and
 * the huge pages. */
static void test_hugetlbfs_free_space(void **state)
{
    struct shmb_error err = {0};
    uint64_t free_bytes = 0;

    (void)state;
    fake_hugetlbfs("5\n", "1\n");
    assert_int_equal(segment_page_size(test_dir), 2 * MIB);
    assert_int_equal(segment_check_space(test_dir, 8 * MIB, &free_bytes, &err), 0);
    assert_int_equal(free_bytes, 8 * MIB);
    assert_int_equal(segment_check_space(test_dir, 8 * MIB + 1, &free_bytes, &err),
                     -ENOSPC);
    assert_int_equal(segment_check_space(test_dir, 9 * MIB, &free_bytes, &err), -ENOSPC);
    if (strstr(err.message, "9 MiB required, 8 MiB free (hugetlbfs, 4 free huge pages "
                            "of 2 MiB)") == NULL ||
        strstr(err.message, "nr_hugepages") == NULL)
        fail_msg("unexpected message: '%s'", err.message);

    /* Overcommit: 3 surplus pages allowed, 1 already made. */
    huge.overcommit = "3\n";
    huge.surplus = "1\n";
    assert_int_equal(segment_check_space(test_dir, 0, &free_bytes, &err), 0);
    assert_int_equal(free_bytes, 12 * MIB);

    /* Mounted with size=4M, 1 page of it used: statvfs bounds it. */
    huge.blocks = 2;
    huge.bavail = 1;
    assert_int_equal(segment_check_space(test_dir, 0, &free_bytes, &err), 0);
    assert_int_equal(free_bytes, 2 * MIB);
    /* ...unless the pool has less. */
    huge.blocks = huge.bavail = 100;
    huge.free_pages = "2\n";
    huge.resv = "2\n";
    huge.overcommit = huge.surplus = NULL;
    assert_int_equal(segment_check_space(test_dir, 1, &free_bytes, &err), -ENOSPC);
    assert_int_equal(free_bytes, 0);
}

/* Without sysfs, /proc/meminfo says for the default huge page size only;
 * when nothing says, the check fails with -EIO naming the page size rather
 * than guessing. */
static void test_hugetlbfs_meminfo(void **state)
{
    struct shmb_error err = {0};
    uint64_t free_bytes = 0;

    (void)state;
    fake_hugetlbfs(NULL, NULL);
    huge.meminfo = "MemTotal:       1000 kB\nHugePages_Total:       8\n"
                   "HugePages_Free:        6\nHugePages_Rsvd:        1\n"
                   "HugePages_Surp:        0\nHugepagesize:       2048 kB\n";
    assert_int_equal(segment_check_space(test_dir, 10 * MIB, &free_bytes, &err), 0);
    assert_int_equal(free_bytes, 10 * MIB);
    /* A 1 GiB mount: meminfo's pages are 2 MiB ones, so nothing says. */
    huge.page = 1024 * MIB;
    assert_int_equal(segment_check_space(test_dir, 0, &free_bytes, &err), -EIO);
    if (strstr(err.message, "1048576 KiB") == NULL)
        fail_msg("message does not give the page size: '%s'", err.message);
    huge.page = 2 * MIB;
    huge.meminfo = NULL;
    assert_int_equal(segment_check_space(test_dir, 0, &free_bytes, &err), -EIO);
}

/* A segment on hugetlbfs is a whole number of huge pages: create refuses
 * another size before it makes any file, and segment_round_to rounds up. */
static void test_hugetlbfs_sizes(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;

    (void)state;
    assert_int_equal(segment_page_size(test_dir), 4096);
    assert_int_equal(segment_round_to(3 * MIB, 2 * MIB), 4 * MIB);
    assert_int_equal(segment_round_to(4 * MIB, 2 * MIB), 4 * MIB);
    assert_int_equal(segment_round_to(UINT64_MAX - 5, 2 * MIB), 0);
    fake_hugetlbfs("100\n", "0\n");
    assert_int_equal(segment_create(&seg, test_dir, "h", 1 * MIB, 0, &err), -EINVAL);
    if (strstr(err.message, "2048 KiB huge pages") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(dir_entries(), 0);
}

/* --fresh's check counts the space of the segment it replaces as free, and
 * says so when that is still not enough; nothing is removed. */
static void test_check_replace(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;

    (void)state;
    need_tmpfs();
    assert_int_equal(segment_create(&seg, test_dir, "old", 3 * MIB, 0, &err), 0);
    segment_close(&seg);
    assert_int_equal(segment_check_space(test_dir, 3 * MIB, NULL, &err), -ENOSPC);
    assert_int_equal(segment_check_replace(test_dir, "old", 4 * MIB, &err), 0);
    assert_int_equal(segment_check_replace(test_dir, "old", 5 * MIB, &err), -ENOSPC);
    if (strstr(err.message, "5 MiB required, 4 MiB free, the 3 MiB of the segment it "
                            "would replace included") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    /* A name that is not there counts nothing. */
    assert_int_equal(segment_check_replace(test_dir, "none", 3 * MIB, &err), -ENOSPC);
    assert_int_equal(dir_entries(), 1);
}

/* The state letter of pid (field 3 of /proc/PID/stat), or '?'. */
static char state_of(pid_t pid)
{
    char path[64], buf[1024], *p;
    FILE *fp;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fp = __real_fopen(path, "r");
    if (fp == NULL)
        return '?';
    p = fgets(buf, sizeof(buf), fp) != NULL ? strrchr(buf, ')') : NULL;
    fclose(fp);
    return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* An owner that was killed and not reaped yet (a zombie, state Z) is gone:
 * its exit released the segment's lock, though its pid still exists. */
static void test_probe_zombie_owner(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    int64_t pid = -1;
    int ready[2], status, i;
    pid_t child;
    char c = 0;

    (void)state;
    assert_int_equal(pipe(ready), 0);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        if (segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err) != 0)
            _exit(1);
        c = 1;
        if (write(ready[1], &c, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    assert_int_equal(pid, child);
    assert_int_equal(kill(child, SIGKILL), 0);
    for (i = 0; i < 5000 && state_of(child) != 'Z'; i++)
        usleep(1000);
    assert_int_equal(state_of(child), 'Z');
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_ORPHANED);
    assert_int_equal(pid, child);
    assert_int_equal(waitpid(child, &status, 0), child);
    if (segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err) != 0)
        fail_msg("segment_adopt: %d %s", err.code, err.message);
    segment_destroy(&seg);
}

/* The guard: a write into a page the file lost (truncated by someone else
 * holding a descriptor) is -EIO from segment_store, not a SIGBUS that kills
 * the process; a write into a page still there works; segment_guard_check
 * then says the segment is broken, how, and what to do, and so it stays.
 * A hole punched in a second segment shows in its blocks. */
static void test_guard(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    uint64_t size = 64 * 1024;
    char *data;
    int fd;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "guarded", size, 0, &err), 0);
    assert_int_equal(segment_guard_watch(&seg, NULL, &err), 0);
    data = segment_data(&seg);
    assert_int_equal(segment_guard_check(data, &err), 0);
    assert_int_equal(segment_store(data + 8192, "abcd", 4), 0);
    fd = open(seg.path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(segment_store(data + 8192, "abcd", 4), -EIO);
    assert_int_equal(segment_store(data + 16, "abcd", 4), 0);
    assert_memory_equal(data + 16, "abcd", 4);
    assert_int_equal(segment_guard_check(data, &err), -EIO);
    assert_non_null(strstr(err.message, "a write into it hit a page the file no longer "
                                        "has (SIGBUS)"));
    assert_non_null(strstr(err.message, "then restart shmbrokerd"));
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(segment_guard_check(data, &err), -EIO);
    close(fd);
    segment_destroy(&seg);

    assert_int_equal(segment_create(&seg, test_dir, "holed", size, 0, &err), 0);
    assert_int_equal(segment_guard_watch(&seg, NULL, &err), 0);
    data = segment_data(&seg);
    assert_int_equal(segment_guard_check(data, &err), 0);
    assert_int_equal(fallocate(seg.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 16384,
                               16384),
                     0);
    assert_int_equal(segment_guard_check(data, &err), -EIO);
    assert_non_null(strstr(err.message, "16 KiB of its reserved pages were given back"));
    segment_destroy(&seg);
    assert_int_equal(dir_entries(), 0);
}

/* Finding 10 of the second review. segment_destroy removes the path only
 * while it still names the daemon's own file: a file renamed over it since
 * (another daemon's segment) stays. Before the fix it was unlinked. */
static void test_destroy_only_own_file(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char path[PATH_MAX], other[PATH_MAX];
    struct stat st;
    int fd;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    path_in_dir(path, sizeof(path), "seg");
    path_in_dir(other, sizeof(other), "other");
    fd = open(other, O_CREAT | O_WRONLY | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(rename(other, path), 0);
    segment_destroy(&seg);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(dir_entries(), 0); /* the lock file went too */
}

/* Finding 2 of the second review. A client's flock on the segment (its
 * descriptor is the segment's) does not make a segment whose daemon is gone
 * look alive, and does not stop its adoption; a live daemon still shows
 * through its lock file. Before the fix the probe said SEGMENT_LIVE. */
static void test_client_flock_not_liveness(void **state)
{
    struct shmb_error err = {0};
    struct segment seg, seg2;
    char path[PATH_MAX];
    int64_t pid = 0;
    int fd;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    path_in_dir(path, sizeof(path), "seg");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    segment_close(&seg);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_ORPHANED);
    if (segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err) != 0)
        fail_msg("segment_adopt: %d %s", err.code, err.message);
    assert_int_equal(segment_probe_existing(test_dir, "seg", &pid), SEGMENT_LIVE);
    assert_int_equal(segment_adopt(&seg2, test_dir, "seg", 64 * 1024, 0, &err), -EBUSY);
    close(fd);
    segment_destroy(&seg);
    assert_int_equal(dir_entries(), 0);
}

/* Issue 10, item 4 (adoption). The guarded read: segment_load from a page
 * the file lost (truncated by someone else holding a descriptor, as a
 * client can while a restarted daemon walks the chunk headers) is -EIO, not
 * a SIGBUS that kills the process; a read from a page still there works and
 * copies the bytes; the guard then says the segment is broken and why.
 * Before segment_load the adoption read the mapping with memcpy and died. */
static void test_guard_load(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    uint64_t size = 64 * 1024;
    char *data, buf[8] = "";
    int fd;

    (void)state;
    assert_int_equal(segment_create(&seg, test_dir, "loaded", size, 0, &err), 0);
    assert_int_equal(segment_guard_watch(&seg, NULL, &err), 0);
    data = segment_data(&seg);
    assert_int_equal(segment_store(data + 16, "abcd", 4), 0);
    assert_int_equal(segment_store(data + 12288, "wxyz", 4), 0);
    assert_int_equal(segment_load(buf, data + 12288, 4), 0);
    assert_memory_equal(buf, "wxyz", 4);
    fd = open(seg.path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(segment_load(buf, data + 12288, 4), -EIO);
    assert_int_equal(segment_load(buf, data + 16, 4), 0);
    assert_memory_equal(buf, "abcd", 4);
    assert_int_equal(segment_guard_check(data, &err), -EIO);
    if (strstr(err.message, "a read of it hit a page the file no longer has (SIGBUS)") ==
        NULL)
        fail_msg("unexpected message: '%s'", err.message);
    close(fd);
    segment_destroy(&seg);
    assert_int_equal(dir_entries(), 0);
}

/* Findings 1 and 8 of the second review: segment_check_adoptable refuses a
 * FIFO at once (no blocking open), and a file of ours with group or other
 * bits or a second link (-EPERM, naming mode and links). */
static void test_adoptable_checks_file(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char path[PATH_MAX], link2[PATH_MAX];
    int64_t pid = 0;

    (void)state;
    path_in_dir(path, sizeof(path), "fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(segment_probe_existing(test_dir, "fifo", &pid), SEGMENT_FOREIGN);
    assert_int_equal(segment_check_adoptable(test_dir, "fifo", 64 * 1024, &err), -EINVAL);
    if (strstr(err.message, "is not a regular file") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(unlink(path), 0);

    assert_int_equal(segment_create(&seg, test_dir, "seg", 64 * 1024, 0, &err), 0);
    segment_close(&seg);
    path_in_dir(path, sizeof(path), "seg");
    assert_int_equal(chmod(path, 0640), 0);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), -EPERM);
    if (strstr(err.message, "mode 0640 and 1 link(s)") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(segment_adopt(&seg, test_dir, "seg", 64 * 1024, 0, &err), -EPERM);
    assert_int_equal(chmod(path, 0600), 0);
    path_in_dir(link2, sizeof(link2), "seg2");
    assert_int_equal(link(path, link2), 0);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), -EPERM);
    if (strstr(err.message, "2 link(s)") == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    assert_int_equal(unlink(link2), 0);
    assert_int_equal(segment_check_adoptable(test_dir, "seg", 64 * 1024, &err), 0);
    assert_int_equal(unlink(path), 0);
}

/* The memfd every memfd test makes; unique to this process. */
static void memfd_name(char *out, size_t len, const char *what)
{
    snprintf(out, len, "shmb-test-%d-%s", (int)getpid(), what);
}

/* Issue 14 (memfd backing). A memfd segment has every page reserved, the
 * header written, mode 0600, no lock file and the path "memfd:NAME"; it is
 * sealed, so a client's ftruncate on either descriptor it may receive fails
 * (EPERM on the read-write one) and the seals cannot be lifted; the
 * read-only descriptor is the same memory and can neither be written nor
 * mapped writable; segment_restore_header rewrites a header a client
 * scribbled on; segment_memfd_held_by finds it in /proc/self/fd by name. */
static void test_memfd_create(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    const struct shmb_segment_header *hdr;
    uint64_t size = 256 * 1024;
    char name[64], other[64];
    struct stat a, b;
    void *map;
    int seals;

    (void)state;
    memfd_name(name, sizeof(name), "create");
    memfd_name(other, sizeof(other), "other");
    if (segment_create_memfd(&seg, name, size, 0, &err) != 0)
        fail_msg("segment_create_memfd: %d %s", err.code, err.message);
    assert_true(seg.memfd);
    assert_string_equal(seg.dir, "");
    assert_string_equal(seg.name, name);
    assert_true(strncmp(seg.path, "memfd:", 6) == 0);
    assert_string_equal(seg.path + 6, name);
    assert_int_equal(seg.lock_fd, -1);
    assert_int_equal(seg.size, size);
    assert_int_equal(seg.data_offset, SHMB_HEADER_PAGE);
    assert_int_equal(seg.data_size, segment_data_size(size, SHMB_HEADER_PAGE, 0));
    hdr = seg.hdr;
    assert_true(hdr->magic == SHMB_SEGMENT_MAGIC);
    assert_int_equal(hdr->total_size, size);
    assert_int_equal(hdr->owner_pid, getpid());

    assert_int_equal(fstat(seg.fd, &a), 0);
    assert_int_equal(a.st_size, size);
    assert_true((uint64_t)a.st_blocks * 512 >= size); /* every page reserved */
    assert_int_equal(a.st_mode & 07777, 0600);
    seals = fcntl(seg.fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ftruncate(seg.fd, 8192), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(seg.fd, (off_t)(2 * size)), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(seg.ro_fd, 8192), -1);
    assert_int_equal(fcntl(seg.fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    assert_int_equal(errno, EPERM);

    assert_int_equal(fstat(seg.ro_fd, &b), 0);
    assert_true(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
    assert_int_equal(write(seg.ro_fd, "x", 1), -1);
    assert_int_equal(errno, EBADF);
    assert_true(mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, seg.ro_fd,
                     0) == MAP_FAILED);
    assert_int_equal(errno, EACCES);
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, seg.ro_fd, 0);
    assert_true(map != MAP_FAILED);
    assert_true(((const struct shmb_segment_header *)map)->magic == SHMB_SEGMENT_MAGIC);

    memset(seg.base, 0xee, 64);
    assert_int_equal(segment_restore_header(&seg, &err), 0);
    assert_true(((const struct shmb_segment_header *)map)->magic == SHMB_SEGMENT_MAGIC);
    assert_int_equal(hdr->total_size, size);
    assert_int_equal(munmap(map, (size_t)size), 0);

    assert_true(segment_memfd_held_by(name, getpid()));
    assert_false(segment_memfd_held_by(other, getpid()));
    segment_destroy(&seg);
    assert_int_equal(seg.fd, -1);
    assert_int_equal(seg.ro_fd, -1);
    assert_null(seg.base);
    assert_false(segment_memfd_held_by(name, getpid()));
}

/* Issue 14 (memfd backing). A client running as another user cannot turn
 * the read-only descriptor it received into a read-write one by opening
 * /proc/self/fd/N again: the memfd is mode 0600, not the 0777 memfd_create
 * gives it. Needs root to become another user. */
static void test_memfd_readonly_reopen(void **state)
{
    struct shmb_error err = {0};
    struct segment seg;
    char name[64], proc[64];
    pid_t child;
    int status, fd;

    (void)state;
    if (geteuid() != 0) {
        printf("SKIPPED: needs root to run a client as another user\n");
        skip();
    }
    memfd_name(name, sizeof(name), "reopen");
    assert_int_equal(segment_create_memfd(&seg, name, 64 * 1024, 0, &err), 0);
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", seg.ro_fd);
    child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(2);
        fd = open(proc, O_RDWR);
        _exit(fd < 0 && errno == EACCES ? 0 : 1);
    }
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    segment_destroy(&seg);
}

/* Issue 14 (memfd backing). A reservation the memory cgroup refuses
 * (posix_fallocate failing with ENOMEM or ENOSPC) fails the creation with
 * that code, the size in MiB, and where to look; nothing is left: no
 * descriptor, no mapping, no memfd. A bad size or a name longer than
 * memfd_create takes is refused before anything is made. */
static void test_memfd_reserve_fails(void **state)
{
    static const int codes[] = {ENOMEM, ENOSPC};
    struct shmb_error err = {0};
    struct segment seg;
    char name[64], want[256], longname[NAME_MAX + 1];
    size_t i;

    (void)state;
    memfd_name(name, sizeof(name), "full");
    for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        fallocate_error = codes[i];
        assert_int_equal(segment_create_memfd(&seg, name, 3 * MIB, 0, &err), -codes[i]);
        assert_int_equal(err.code, -codes[i]);
        snprintf(want, sizeof(want), "Cannot reserve 3 MiB for memfd segment %s: %s. ",
                 name, strerror(codes[i]));
        if (strncmp(err.message, want, strlen(want)) != 0 ||
            strstr(err.message, "memory cgroup's limit (memory.max") == NULL ||
            strstr(err.message, "available memory") == NULL)
            fail_msg("unexpected message: '%s'", err.message);
        assert_int_equal(seg.fd, -1);
        assert_int_equal(seg.ro_fd, -1);
        assert_null(seg.base);
        assert_false(segment_memfd_held_by(name, getpid()));
    }
    fallocate_error = 0;
    assert_int_equal(segment_create_memfd(&seg, name, 4096, 0, &err), -EINVAL);
    memset(longname, 'm', sizeof(longname) - 1);
    longname[SEGMENT_MEMFD_NAME_MAX + 1] = '\0';
    assert_int_equal(segment_create_memfd(&seg, longname, 64 * 1024, 0, &err), -ENAMETOOLONG);
    longname[SEGMENT_MEMFD_NAME_MAX] = '\0';
    assert_int_equal(segment_create_memfd(&seg, longname, 64 * 1024, 0, &err), 0);
    assert_true(segment_memfd_held_by(longname, getpid()));
    segment_destroy(&seg);
}

/* Called by the guard with the message of a broken segment. */
static unsigned broken_calls;
static char broken_message[SHMB_ERROR_MSG_MAX];

static void on_broken(const char *message)
{
    broken_calls++;
    snprintf(broken_message, sizeof(broken_message), "%s", message);
}

/* Issue 14 (the guard for several segments). With two watched segments, a
 * write into a page one of them lost breaks that one only: its check fails,
 * naming it, once; the other's check passes and its stores still work. A
 * hole punched in a third (a memfd: it cannot be truncated, but it can be
 * holed) breaks that one only. An address no watched segment holds checks
 * fine, and so does a segment once closed. */
static void test_guard_several(void **state)
{
    struct shmb_error err = {0};
    struct segment a, b, m;
    uint64_t size = 64 * 1024;
    char *da, *db, *dm, name[64];
    int fd;

    (void)state;
    broken_calls = 0;
    memfd_name(name, sizeof(name), "holed");
    assert_int_equal(segment_create(&a, test_dir, "a", size, 0, &err), 0);
    assert_int_equal(segment_create(&b, test_dir, "b", size, 0, &err), 0);
    assert_int_equal(segment_create_memfd(&m, name, size, 0, &err), 0);
    assert_int_equal(segment_guard_watch(&a, on_broken, &err), 0);
    assert_int_equal(segment_guard_watch(&b, on_broken, &err), 0);
    assert_int_equal(segment_guard_watch(&m, on_broken, &err), 0);
    da = segment_data(&a);
    db = segment_data(&b);
    dm = segment_data(&m);

    fd = open(a.path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(segment_store(da + 8192, "abcd", 4), -EIO);
    assert_int_equal(broken_calls, 1);
    assert_non_null(strstr(broken_message, a.path));
    assert_int_equal(segment_guard_check(da, &err), -EIO);
    assert_non_null(strstr(err.message, a.path));
    assert_int_equal(segment_guard_check(da + a.data_size - 1, &err), -EIO);
    assert_int_equal(segment_guard_check(db, &err), 0);
    assert_int_equal(segment_guard_check(dm, &err), 0);
    assert_int_equal(segment_store(db + 8192, "efgh", 4), 0);
    assert_memory_equal(db + 8192, "efgh", 4);
    assert_int_equal(segment_guard_check(db + 8192, &err), 0);
    assert_int_equal(broken_calls, 1);
    close(fd);

    assert_int_equal(fallocate(m.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 16384,
                               16384),
                     0);
    assert_int_equal(segment_guard_check(dm, &err), -EIO);
    assert_non_null(strstr(err.message, m.path));
    assert_non_null(strstr(err.message, "16 KiB of its reserved pages were given back"));
    assert_int_equal(broken_calls, 2);
    assert_int_equal(segment_guard_check(db, &err), 0);
    assert_int_equal(segment_guard_check(&err, &err), 0); /* not in any segment */

    segment_destroy(&a);
    assert_int_equal(segment_guard_check(da, &err), 0);
    segment_destroy(&m);
    segment_destroy(&b);
    assert_int_equal(dir_entries(), 0);
}

/* Issue 14 (the guard for several segments). An unwatched segment is not
 * checked (its hole goes unnoticed); watched again, it is, from its state
 * then; watching a segment again takes no second place. The guard watches
 * SEGMENT_GUARD_MAX segments at once and refuses one more with a message
 * saying so; a segment closed frees its place. */
static void test_guard_watch_unwatch(void **state)
{
    struct shmb_error err = {0};
    struct segment segs[SEGMENT_GUARD_MAX + 1];
    char name[64], what[16];
    char *data;
    size_t i;

    (void)state;
    for (i = 0; i <= SEGMENT_GUARD_MAX; i++) {
        snprintf(what, sizeof(what), "w%zu", i);
        memfd_name(name, sizeof(name), what);
        assert_int_equal(segment_create_memfd(&segs[i], name, 2 * SHMB_HEADER_PAGE, 0, &err),
                         0);
    }
    data = segment_data(&segs[0]);
    assert_int_equal(segment_guard_watch(&segs[0], NULL, &err), 0);
    segment_guard_unwatch(&segs[0]);
    assert_int_equal(fallocate(segs[0].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                               SHMB_HEADER_PAGE),
                     0);
    assert_int_equal(segment_guard_check(data, &err), 0);
    assert_int_equal(segment_guard_watch(&segs[0], NULL, &err), 0);
    assert_int_equal(segment_guard_check(data, &err), 0);
    assert_int_equal(fallocate(segs[0].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                               SHMB_HEADER_PAGE, SHMB_HEADER_PAGE),
                     0);
    assert_int_equal(segment_guard_check(data, &err), -EIO);
    for (i = 0; i < 2 * SEGMENT_GUARD_MAX; i++)
        assert_int_equal(segment_guard_watch(&segs[0], NULL, &err), 0);
    assert_int_equal(segment_guard_check(data, &err), 0); /* afresh */

    for (i = 1; i < SEGMENT_GUARD_MAX; i++)
        assert_int_equal(segment_guard_watch(&segs[i], NULL, &err), 0);
    assert_int_equal(segment_guard_watch(&segs[SEGMENT_GUARD_MAX], NULL, &err), -ENOSPC);
    snprintf(name, sizeof(name), "already watches %d segments", SEGMENT_GUARD_MAX);
    if (strstr(err.message, segs[SEGMENT_GUARD_MAX].path) == NULL ||
        strstr(err.message, name) == NULL)
        fail_msg("unexpected message: '%s'", err.message);
    segment_close(&segs[1]);
    assert_int_equal(segment_guard_watch(&segs[SEGMENT_GUARD_MAX], NULL, &err), 0);
    for (i = 0; i <= SEGMENT_GUARD_MAX; i++)
        segment_destroy(&segs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_too_big_refused, test_setup),
        cmocka_unit_test_setup(test_create_fits, test_setup),
        cmocka_unit_test_setup(test_exists_and_destroy, test_setup),
        cmocka_unit_test_setup(test_reservation_catches_full_tmpfs, test_setup),
        cmocka_unit_test_setup(test_missing_directory, test_setup),
        cmocka_unit_test_setup(test_invalid_names, test_setup),
        cmocka_unit_test_setup(test_sizes, test_setup),
        cmocka_unit_test_setup(test_probe_existing, test_setup),
        cmocka_unit_test_setup(test_adopt_rebuilds_header, test_setup),
        cmocka_unit_test_setup(test_adopt_values_are_private, test_setup),
        cmocka_unit_test_setup(test_adopt_layouts, test_setup),
        cmocka_unit_test_setup(test_adopt_refuses_locked, test_setup),
        cmocka_unit_test_setup(test_hugetlbfs_free_space, test_setup),
        cmocka_unit_test_setup(test_hugetlbfs_meminfo, test_setup),
        cmocka_unit_test_setup(test_hugetlbfs_sizes, test_setup),
        cmocka_unit_test_setup(test_check_replace, test_setup),
        cmocka_unit_test_setup(test_probe_zombie_owner, test_setup),
        cmocka_unit_test_setup(test_guard, test_setup),
        cmocka_unit_test_setup(test_destroy_only_own_file, test_setup),
        cmocka_unit_test_setup(test_client_flock_not_liveness, test_setup),
        cmocka_unit_test_setup(test_adoptable_checks_file, test_setup),
        cmocka_unit_test_setup(test_guard_load, test_setup),
        cmocka_unit_test_setup(test_memfd_create, test_setup),
        cmocka_unit_test_setup(test_memfd_readonly_reopen, test_setup),
        cmocka_unit_test_setup(test_memfd_reserve_fails, test_setup),
        cmocka_unit_test_setup(test_guard_several, test_setup),
        cmocka_unit_test_setup(test_guard_watch_unwatch, test_setup),
    };

    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
