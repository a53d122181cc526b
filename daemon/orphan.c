// SPDX-License-Identifier: Apache-2.0
/*
 * The segment files a daemon finds that are not its own: whose they are
 * (segment_probe_existing), marking one retired for the clients that still
 * map it, and removing one no live daemon holds, under its lock.
 */
#include "segment.h"

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

#include "../proto/text.h"

enum segment_owner segment_probe_existing(const char *dir, const char *name,
                                          int64_t *owner_pid)
{
    struct shmb_segment_header hdr;
    char path[PATH_MAX];
    struct stat st;
    enum segment_owner owner;
    ssize_t n;
    int fd, lock_fd, rc;

    *owner_pid = 0;
    if (segment_join_path(path, sizeof(path), dir, name, NULL) < 0)
        return SEGMENT_ABSENT;
    fd = segment_open_existing(path, O_RDONLY, &st, NULL);
    if (fd < 0)
        return fd == -ENOENT ? SEGMENT_ABSENT : SEGMENT_FOREIGN;
    /* A copy of the header, read once: its owner is for messages only. */
    n = pread(fd, &hdr, sizeof(hdr), 0);
    close(fd);
    if (n == (ssize_t)sizeof(hdr) && hdr.magic == SHMB_SEGMENT_MAGIC)
        *owner_pid = hdr.owner_pid;
    /* The proof of a live daemon is its lock, not the pid in the header,
     * which any read-write client can write. */
    rc = segment_lock(dir, name, false, &lock_fd, NULL);
    if (rc == -EBUSY)
        return SEGMENT_LIVE;
    if (rc == 0)
        close(lock_fd);
    owner = n == (ssize_t)sizeof(hdr) && hdr.magic == SHMB_SEGMENT_MAGIC ? SEGMENT_ORPHANED
                                                                         : SEGMENT_FOREIGN;
    return rc == 0 || rc == -ENOENT ? owner : SEGMENT_FOREIGN;
}

/* The checks segment_remove_orphaned makes under the lock: path is a regular
 * file with the segment's magic (unless damaged: a client zeroed it),
 * owned by this user with mode 0600 and one link; *bytes its size. */
static int segment_check_removable(const char *path, bool damaged, uint64_t *bytes,
                                   struct shmb_error *err)
{
    struct shmb_segment_header hdr;
    struct stat st, now;
    ssize_t n;
    int fd = segment_open_existing(path, O_RDONLY, &st, err), rc;

    if (fd < 0)
        return fd;
    n = pread(fd, &hdr, sizeof(hdr), 0);
    close(fd);
    if (!damaged && (n != (ssize_t)sizeof(hdr) || hdr.magic != SHMB_SEGMENT_MAGIC))
        return shmb_error_set(err, -EEXIST, "%s is not a shmbroker segment; left alone.",
                              path);
    if ((rc = segment_check_owner(&st, path, err)) < 0) {
        char was[SHMB_ERROR_MSG_MAX];

        snprintf(was, sizeof(was), "%s", err->message);
        return shmb_error_set(err, rc, "%s Left alone.", was);
    }
    if (stat(path, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino)
        return shmb_error_set(err, -EBUSY, "%s was replaced while it was checked; left alone.",
                              path);
    *bytes = (uint64_t)st.st_size;
    return 0;
}

/* segment_retire_fd through a mapping of the file's first page (a huge
 * page on hugetlbfs, which has no write()), the store under the guard: a
 * file a client shrank since the fstat ends it with -EIO, not a SIGBUS. */
static int segment_retire_mapped(int fd, off_t size)
{
    size_t page = SHMB_HEADER_PAGE;
    struct statfs fs;
    void *map;
    int rc;

    if (fstatfs(fd, &fs) == 0 && (uint32_t)fs.f_type == SEGMENT_HUGETLBFS_MAGIC &&
        fs.f_bsize > 0)
        page = (size_t)fs.f_bsize;
    if ((uint64_t)size < page)
        return -EINVAL;
    map = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return -errno;
    rc = segment_atomic_store32(
        (uint32_t *)((char *)map + offsetof(struct shmb_segment_header, retired)),
        SHMB_SEGMENT_RETIRED);
    munmap(map, page);
    return rc;
}

int segment_retire_fd(int fd)
{
    const uint32_t word = SHMB_SEGMENT_RETIRED;
    struct stat st;

    if (fstat(fd, &st) != 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || st.st_size < (off_t)SHMB_HEADER_PAGE)
        return -EINVAL;
    /* Any value but 0 means retired, so a torn copy still says so. */
    if (pwrite(fd, &word, sizeof(word), offsetof(struct shmb_segment_header, retired)) ==
        (ssize_t)sizeof(word))
        return 0;
    /* hugetlbfs refuses write() (EINVAL): through a mapping then. */
    return segment_retire_mapped(fd, st.st_size);
}

int segment_retire_path(const char *path)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), rc;

    if (fd < 0)
        return -errno;
    rc = segment_retire_fd(fd);
    close(fd);
    return rc;
}

int segment_remove_orphaned(const char *dir, const char *name, uint64_t size,
                            bool may_be_damaged, uint64_t *bytes, int64_t *owner_pid,
                            struct shmb_error *err)
{
    char path[PATH_MAX], lock_path[PATH_MAX];
    bool damaged = false;
    int lock_fd, rc;

    *bytes = 0;
    switch (segment_probe_existing(dir, name, owner_pid)) {
    case SEGMENT_ABSENT:
        return 0;
    case SEGMENT_LIVE:
        return shmb_error_set(err, -EBUSY,
                              "Segment %s/%s belongs to a running shmbrokerd (pid %lld); "
                              "stop it first.",
                              dir, name, (long long)*owner_pid);
    case SEGMENT_FOREIGN:
        /* As a start judges it: a file of exactly the segment's size, this
         * user's alone and locked by nobody, is a segment whose header a
         * read-write client damaged; its memory goes like any other's. */
        if (may_be_damaged && segment_check_adoptable(dir, name, size, NULL) == 0) {
            damaged = true;
            break;
        }
        return shmb_error_set(err, -EEXIST,
                              "%s/%s is not a shmbroker segment this user may remove (or "
                              "its lock file .%s.lock is not this user's); left alone.",
                              dir, name, name);
    case SEGMENT_ORPHANED:
        break;
    }
    if (segment_join_path(path, sizeof(path), dir, name, err) < 0 ||
        segment_lock_path(lock_path, sizeof(lock_path), dir, name) < 0)
        return shmb_error_set(err, -ENAMETOOLONG, "Segment path %s/%s is too long.", dir,
                              name);
    if ((rc = segment_lock(dir, name, true, &lock_fd, err)) < 0)
        return rc == -EBUSY ? shmb_error_set(err, -EBUSY,
                                             "Segment %s is locked by a shmbrokerd that "
                                             "just started; left alone.",
                                             path)
                            : rc;
    /* Under the lock, the file at path again: still a segment, and one this
     * user owns alone (as a start requires), or it is left alone: root, or
     * a directory without the sticky bit, could otherwise remove another
     * user's file that merely looks like a segment. */
    rc = segment_check_removable(path, damaged, bytes, err);
    /* Clients of the dead daemon may still map it: tell them first. */
    if (rc == 0)
        (void)segment_retire_path(path);
    if (rc == 0)
        rc = unlink(path) == 0 ? 1
                               : shmb_error_set(err, -errno, "Cannot remove segment %s: %s.",
                                                path, strerror(errno));
    unlink(lock_path); /* ours: segment_lock made or checked it */
    close(lock_fd);
    return rc;
}
