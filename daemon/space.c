// SPDX-License-Identifier: Apache-2.0
/*
 * The room a directory has for a segment: its free space (statvfs, or the free
 * huge pages of a hugetlbfs mount), its page size, the hint that says how to
 * grow it, and the path of a file in it. Reads only; knows nothing of a
 * segment's file or mapping.
 */
#include "space.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stddef.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../proto/layout.h"
#include "../proto/text.h"

uint64_t segment_page_size(const char *dir)
{
    struct statfs fs;

    if (statfs(dir, &fs) == 0 && (uint32_t)fs.f_type == SEGMENT_HUGETLBFS_MAGIC &&
        fs.f_bsize > 0 && (uint64_t)fs.f_bsize % SHMB_HEADER_PAGE == 0)
        return (uint64_t)fs.f_bsize;
    return SHMB_HEADER_PAGE;
}

/* One unsigned number, the whole content of dir/name (a sysfs attribute). */
static bool segment_read_number(const char *dir, const char *name,
                                unsigned long long *value)
{
    char path[160];
    FILE *fp;
    bool ok;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fp = fopen(path, "re");
    if (fp == NULL)
        return false;
    ok = fscanf(fp, "%llu", value) == 1;
    fclose(fp);
    return ok;
}

/* The huge pages of page_size bytes a new file can still get: the free ones
 * not promised to mappings already made, plus what overcommit allows. From
 * sysfs, else (sysfs not mounted) /proc/meminfo when page_size is the
 * default huge page size. False when the kernel does not say. */
static bool segment_free_huge_pages(uint64_t page_size, uint64_t *pages)
{
    unsigned long long free_pages = 0, resv = 0, over = 0, surplus = 0, kib = 0;
    char dir[96], line[128];
    bool have_free = false, have_resv = false;
    FILE *fp;

    snprintf(dir, sizeof(dir), "/sys/kernel/mm/hugepages/hugepages-%llukB",
             (unsigned long long)(page_size / 1024));
    if (segment_read_number(dir, "free_hugepages", &free_pages) &&
        segment_read_number(dir, "resv_hugepages", &resv)) {
        if (!segment_read_number(dir, "nr_overcommit_hugepages", &over) ||
            !segment_read_number(dir, "surplus_hugepages", &surplus))
            over = surplus = 0;
    } else {
        fp = fopen("/proc/meminfo", "re");
        if (fp == NULL)
            return false;
        while (fgets(line, sizeof(line), fp) != NULL) {
            if (sscanf(line, "HugePages_Free: %llu", &free_pages) == 1)
                have_free = true;
            else if (sscanf(line, "HugePages_Rsvd: %llu", &resv) == 1)
                have_resv = true;
            else
                sscanf(line, "Hugepagesize: %llu kB", &kib);
        }
        fclose(fp);
        if (!have_free || !have_resv || kib * 1024 != page_size)
            return false;
    }
    *pages = (free_pages > resv ? free_pages - resv : 0) +
             (over > surplus ? over - surplus : 0);
    return true;
}

/* What dir can still hold, in *avail, and its huge page size in *huge_page
 * (0 when it is not hugetlbfs). statvfs says for a tmpfs; a hugetlbfs mount
 * made without size= reports 0 blocks (no limit of its own), so there the
 * free huge pages of its page size count, bounded by size= when it has one. */
static int segment_free_space(const char *dir, uint64_t *avail, uint64_t *huge_page,
                              uint64_t *huge_free, struct shmb_error *err)
{
    struct statvfs vfs;
    struct statfs fs;
    uint64_t pages = 0;
    int saved;

    if (statvfs(dir, &vfs) != 0) {
        saved = errno;
        return shmb_error_set(err, -saved, "Cannot read free space of %s: %s.", dir,
                              strerror(saved));
    }
    *avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    *huge_page = *huge_free = 0;
    if (statfs(dir, &fs) != 0 || (uint32_t)fs.f_type != SEGMENT_HUGETLBFS_MAGIC ||
        fs.f_bsize <= 0)
        return 0;
    *huge_page = (uint64_t)fs.f_bsize;
    if (!segment_free_huge_pages(*huge_page, &pages))
        return shmb_error_set(err, -EIO,
                              "Cannot tell how many huge pages of %llu KiB are free for "
                              "the hugetlbfs mount %s: neither "
                              "/sys/kernel/mm/hugepages nor /proc/meminfo says.",
                              (unsigned long long)(*huge_page / 1024), dir);
    *huge_free = pages > UINT64_MAX / *huge_page ? UINT64_MAX : pages * *huge_page;
    if (vfs.f_blocks == 0 || *huge_free < *avail)
        *avail = *huge_free;
    return 0;
}

/* How to give dir more room, for a message ending "..., or choose a smaller
 * --size.": Docker's flags only for /dev/shm, which they size; any other
 * directory is a mount of the user's own. */
const char *segment_grow_hint(const char *dir, char *out, size_t len)
{
    char real[PATH_MAX], shm[PATH_MAX];

    if (strcmp(dir, "/dev/shm") == 0 || strcmp(dir, "/dev/shm/") == 0 ||
        (realpath(dir, real) != NULL && realpath("/dev/shm", shm) != NULL &&
         strcmp(real, shm) == 0))
        snprintf(out, len, "Increase /dev/shm (e.g. --shm-size or --ipc=host)");
    else
        snprintf(out, len,
                 "Give %.256s more room (mount -o remount,size=N on its tmpfs; "
                 "shmbrokerd --check prints the fix for where it runs)",
                 dir);
    return out;
}

/* segment_check_space, counting reclaim bytes (a file about to be replaced)
 * as free. */
static int segment_space(const char *dir, uint64_t required, uint64_t reclaim,
                         uint64_t *free_bytes, struct shmb_error *err)
{
    struct stat st;
    uint64_t avail = 0, huge_page = 0, huge_free = 0;
    char page[32], also[96] = "", hint[PATH_MAX + 160];
    int rc;

    if (stat(dir, &st) != 0) {
        int saved = errno;
        return shmb_error_set(err, -saved,
                              "Shared-memory directory %s: %s. Create it (or mount a "
                              "tmpfs there), or choose another --shm-dir.",
                              dir, strerror(saved));
    }
    if (!S_ISDIR(st.st_mode))
        return shmb_error_set(err, -ENOTDIR,
                              "Shared-memory directory %s is not a directory. "
                              "Choose another --shm-dir.",
                              dir);
    if ((rc = segment_free_space(dir, &avail, &huge_page, &huge_free, err)) < 0)
        return rc;
    avail = avail > UINT64_MAX - reclaim ? UINT64_MAX : avail + reclaim;
    if (free_bytes != NULL)
        *free_bytes = avail;
    if (required <= avail)
        return 0;
    if (reclaim > 0)
        snprintf(also, sizeof(also),
                 ", the %llu MiB of the segment it would replace included",
                 shmb_mib_rounded(reclaim));
    if (huge_page != 0)
        return shmb_error_set(
            err, -ENOSPC,
            "Insufficient space in %s: %llu MiB required, %llu MiB free (hugetlbfs, "
            "%llu free huge pages of %s%s). Reserve more huge pages (e.g. sysctl "
            "vm.nr_hugepages=N) or raise the mount's size=, or choose a smaller --size.",
            dir, shmb_mib_rounded(required), shmb_mib_rounded(avail),
            (unsigned long long)(huge_free / huge_page),
            shmb_format_bytes(huge_page, page, sizeof(page)), also);
    return shmb_error_set(err, -ENOSPC,
                          "Insufficient space in %s: %llu MiB required, %llu MiB "
                          "free%s. %s, or choose a smaller --size.",
                          dir, shmb_mib_rounded(required), shmb_mib_rounded(avail), also,
                          segment_grow_hint(dir, hint, sizeof(hint)));
}

int segment_check_space(const char *dir, uint64_t required, uint64_t *free_bytes,
                        struct shmb_error *err)
{
    return segment_space(dir, required, 0, free_bytes, err);
}

/* Build dir/name into out; -ENAMETOOLONG when it does not fit. */
int segment_join_path(char *out, size_t len, const char *dir, const char *name,
                             struct shmb_error *err)
{
    int n = snprintf(out, len, "%s/%s", dir, name);

    if (n < 0 || (size_t)n >= len)
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Segment path %s/%s is longer than %zu bytes.", dir, name,
                              len - 1);
    return 0;
}

int segment_check_space_reclaim(const char *dir, uint64_t required, uint64_t reclaim,
                                uint64_t *free_bytes, struct shmb_error *err)
{
    return segment_space(dir, required, reclaim, free_bytes, err);
}

uint64_t segment_reclaimable(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    if (segment_join_path(path, sizeof(path), dir, name, NULL) < 0)
        return 0;
    /* Its pages return only if nothing else links it. */
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1)
        return (uint64_t)st.st_blocks * 512;
    return 0;
}

int segment_check_replace(const char *dir, const char *name, uint64_t required,
                          struct shmb_error *err)
{
    char path[PATH_MAX];
    int rc;

    if ((rc = segment_join_path(path, sizeof(path), dir, name, err)) < 0)
        return rc;
    return segment_space(dir, required, segment_reclaimable(dir, name), NULL, err);
}
