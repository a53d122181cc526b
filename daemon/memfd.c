// SPDX-License-Identifier: Apache-2.0
/*
 * The memfd backing: a segment with no file in a directory, sealed against
 * shrinking, created or adopted from the descriptor systemd kept for the
 * daemon. Lays out, reserves and maps through segment.c.
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

/* MFD_NOEXEC_SEAL (Linux 6.3): the memfd can never be made executable. Older
 * C libraries lack the name; older kernels refuse the flag (EINVAL). */
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

/* memfd_create for a segment: sealable, closed on exec, and never
 * executable where the kernel can say so (a kernel set to require that,
 * vm.memfd_noexec=2, refuses a memfd without it). */
static int segment_memfd_open(const char *name)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);

    if (fd < 0 && errno == EINVAL)
        fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    return fd;
}

int segment_memfd_make(const char *name, uint64_t size, const char *what,
                       const char *smaller, struct shmb_error *err)
{
    int fd, rc, saved;

    if ((fd = segment_memfd_open(name)) < 0) {
        saved = errno;
        return shmb_error_set(err, -saved, "Cannot create %s: %s.", what, strerror(saved));
    }
    /* A memfd is made mode 0777 (0666 without exec): anyone who holds a
     * read-only descriptor could open /proc/self/fd/N read-write again. */
    if (fchmod(fd, 0600) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot set mode 0600 on %s: %s.", what,
                            strerror(saved));
        goto fail;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot size %s to %llu bytes: %s.", what,
                            (unsigned long long)size, strerror(saved));
        goto fail;
    }
    /* Every page now, charged to this process's memory cgroup: a limit too
     * small fails here rather than as a client's SIGBUS later. */
    if ((rc = segment_fallocate(fd, size)) != 0) {
        rc = shmb_error_set(
            err, -rc,
            "Cannot reserve %llu MiB for %s: %s. A memfd's pages are "
            "memory: they count against the memory cgroup's limit (memory.max, or "
            "memory.limit_in_bytes) and the host's available memory. Raise the "
            "container's memory limit or free memory, or %s.",
            shmb_mib_rounded(size), what, strerror(rc), smaller);
        goto fail;
    }
    /* No client can shrink or grow it (ftruncate fails with EPERM), nor lift
     * the seals. A hole can still be punched: the guard watches for that. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot seal %s: %s.", what, strerror(saved));
        goto fail;
    }
    return fd;

fail:
    close(fd);
    return rc;
}

int segment_create_memfd(struct segment *seg, const char *name, uint64_t size,
                         uint64_t max_objects, struct shmb_error *err)
{
    char proc[64], what[SEGMENT_MEMFD_NAME_MAX + 32];
    int rc, saved;

    memset(seg, 0, sizeof(*seg));
    seg->fd = seg->ro_fd = seg->lock_fd = -1;
    seg->memfd = true;
    if ((rc = segment_check_name(name, err)) < 0 || (rc = segment_check_size(size, err)) < 0)
        return rc;
    if (strlen(name) > SEGMENT_MEMFD_NAME_MAX)
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Invalid memfd segment name '%s': %zu characters, "
                              "memfd_create takes at most %d.",
                              name, strlen(name), SEGMENT_MEMFD_NAME_MAX);
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    snprintf(seg->path, sizeof(seg->path), "memfd:%s", name);
    snprintf(what, sizeof(what), "memfd segment %s", name);
    if ((rc = segment_memfd_make(name, size, what, "choose a smaller size", err)) < 0)
        return rc;
    seg->fd = rc;
    if ((rc = segment_map(seg, size, err)) < 0)
        goto fail;
    /* A memfd has no path to open read-only; its /proc link is one. */
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", seg->fd);
    if ((seg->ro_fd = open(proc, O_RDONLY | O_CLOEXEC)) < 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved,
                            "Cannot open memfd segment %s read-only through %s: %s "
                            "(is /proc mounted?).",
                            name, proc, strerror(saved));
        goto fail;
    }
    seg->hdr = seg->base;
    segment_lay_out(seg, SHMB_HEADER_PAGE, max_objects);
    seg->hdr->ring_start = seg->hdr->ring_end = seg->hdr->ring_next_id = 0;
    segment_write_header(seg, (uint64_t)time(NULL));
    return 0;

fail:
    segment_close(seg);
    return rc;
}

int segment_check_memfd(int fd, const char *name, uint64_t size, struct shmb_error *err)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS), mode = fcntl(fd, F_GETFL);

    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || seals < 0 ||
        (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return shmb_error_set(err, -EINVAL,
                              "The descriptor kept for memfd segment %s is not a memfd "
                              "sealed against resizing.",
                              name);
    if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0 || mode < 0 ||
        (mode & O_ACCMODE) != O_RDWR)
        return shmb_error_set(err, -EINVAL,
                              "The descriptor kept for memfd segment %s cannot be written "
                              "(read-only, or sealed against writes).",
                              name);
    if ((uint64_t)st.st_size != size)
        return shmb_error_set(err, -EINVAL,
                              "The memfd segment %s kept across the restart has %llu bytes, "
                              "not the pool's %llu.",
                              name, (unsigned long long)st.st_size, (unsigned long long)size);
    return 0;
}

int segment_adopt_memfd(struct segment *seg, int fd, const char *name, uint64_t size,
                        uint64_t max_objects, struct shmb_error *err)
{
    struct shmb_segment_header copy;
    char proc[64];
    int rc, saved;

    memset(seg, 0, sizeof(*seg));
    seg->fd = fd;
    seg->ro_fd = seg->lock_fd = -1;
    seg->memfd = true;
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    snprintf(seg->path, sizeof(seg->path), "memfd:%s", name);
    if ((rc = segment_check_memfd(fd, name, size, err)) < 0)
        goto fail;
    /* Pages a client punched out come back (as zeros) before anything is
     * read: the walk checks every chunk header it reads. */
    if ((rc = segment_reserve(seg, size, 0, err)) < 0 || (rc = segment_map(seg, size, err)) < 0)
        goto fail;
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", seg->fd);
    if ((seg->ro_fd = open(proc, O_RDONLY | O_CLOEXEC)) < 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot open memfd segment %s read-only: %s.", name,
                            strerror(saved));
        goto fail;
    }
    seg->hdr = seg->base;
    segment_lay_out(seg, SHMB_HEADER_PAGE, max_objects);
    if (segment_load(&copy, seg->hdr, sizeof(copy)) < 0) {
        rc = shmb_error_set(err, -EIO, "Memfd segment %s lost its header page; not adopted.",
                            name);
        goto fail;
    }
    if (copy.magic == SHMB_SEGMENT_MAGIC && segment_is_layout1(&copy, size)) {
        rc = shmb_error_set(err, -EPROTO,
                            "Memfd segment %s holds layout version 1, written by an older "
                            "shmbrokerd; this shmbrokerd writes layout version 2 and does "
                            "not adopt it.",
                            name);
        goto fail;
    }
    segment_keep_layout(seg, &copy, SHMB_HEADER_PAGE);
    segment_note_header(seg, &copy);
    seg->found_gen_next = copy.magic == SHMB_SEGMENT_MAGIC ? copy.gen_next : 0;
    if (segment_write_header(seg, copy.magic == SHMB_SEGMENT_MAGIC ? copy.created_unix
                                                                   : (uint64_t)time(NULL)) < 0) {
        rc = shmb_error_set(err, -EIO, "Memfd segment %s lost its header page; not adopted.",
                            name);
        goto fail;
    }
    return 0;

fail:
    segment_close(seg);
    return rc;
}

bool segment_memfd_held_by(const char *name, pid_t pid)
{
    char dir[64], want[NAME_MAX + 32], link[NAME_MAX + 32];
    struct dirent *e;
    bool found = false;
    ssize_t n;
    DIR *d;

    snprintf(want, sizeof(want), "/memfd:%s (deleted)", name);
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    if ((d = opendir(dir)) == NULL)
        return false;
    while (!found && (e = readdir(d)) != NULL) {
        n = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        if (n < 0)
            continue;
        link[n] = '\0';
        found = strcmp(link, want) == 0;
    }
    closedir(d);
    return found;
}
