// SPDX-License-Identifier: Apache-2.0
/*
 * What a segment file says without asking the daemon (shmbrokerctl status
 * when the daemon does not answer): its header page read, the pid listening
 * at a socket, the segments of a directory. Reads files and asks the kernel;
 * never talks to the daemon.
 */
#include "report_segment.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto/layout.h"

/* Copies of the published counters tried while their seq is odd or moves: a
 * daemon writes them in well under a microsecond, so a seq that stays odd
 * this long belongs to a daemon stopped half way through. */
#define REPORT_COUNTER_TRIES 1000

/* The counters and heartbeat words of the header page at page, copied under
 * the counters' seq. */
static void report_copy_counters(const unsigned char *page,
                                 struct shmb_segment_report *out)
{
    const struct shmb_segment_header *h = (const void *)page;
    const struct shmb_published_counters *pc = (const void *)(page + SHMB_COUNTERS_AT);
    uint32_t s1 = 0, s2;
    int i;

    for (i = 0; i < REPORT_COUNTER_TRIES; i++) {
        s1 = __atomic_load_n(&pc->seq, __ATOMIC_ACQUIRE);
        out->heartbeat_unix_ms = __atomic_load_n(&h->heartbeat_unix_ms, __ATOMIC_RELAXED);
        out->heartbeat_count = __atomic_load_n(&h->heartbeat_count, __ATOMIC_RELAXED);
        memcpy(&out->counters, pc, sizeof(out->counters));
#if defined(__SANITIZE_THREAD__)
        /* ThreadSanitizer does not model fences (gcc warns of them); the
         * writer is another process, which it cannot see anyway. */
        s2 = __atomic_load_n(&pc->seq, __ATOMIC_ACQUIRE);
#else
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&pc->seq, __ATOMIC_RELAXED);
#endif
        if ((s1 & 1) == 0 && s1 == s2) {
            out->counters_settled = true;
            break;
        }
        sched_yield();
    }
    out->counters.seq = s1;
}

int shmb_segment_report_read(const char *path, struct shmb_segment_report *out,
                             struct shmb_error *err)
{
    const unsigned char *page = MAP_FAILED;
    const struct shmb_segment_header *h;
    size_t map_len = SHMB_HEADER_PAGE;
    struct stat st;
    uint64_t magic;
    uint32_t version, header_size;
    int fd, rc = 0;

    memset(out, 0, sizeof(*out));
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        rc = -errno;
        shmb_error_set(err, rc, "Cannot open the segment %s: %s.", path, strerror(-rc));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        shmb_error_set(err, rc, "Cannot stat the segment %s: %s.", path, strerror(-rc));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < SHMB_HEADER_PAGE) {
        rc = shmb_error_set(
            err, -EINVAL,
            "%s is not a shmbroker segment: %s of %lld bytes, where a segment "
            "is a file of at least its %u-byte header page.",
            path, S_ISREG(st.st_mode) ? "a file" : "not a regular file",
            (long long)st.st_size, SHMB_HEADER_PAGE);
        goto out;
    }
    out->file_size = (uint64_t)st.st_size;
    out->file_uid = (uint32_t)st.st_uid;
    out->file_mode = (uint32_t)(st.st_mode & 07777);
    /* A file on hugetlbfs maps in whole huge pages (its block size). */
    if ((uint64_t)st.st_blksize > SHMB_HEADER_PAGE &&
        (uint64_t)st.st_blksize <= out->file_size)
        map_len = (size_t)st.st_blksize;
    page = mmap(NULL, map_len, PROT_READ, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED) {
        rc = -errno;
        shmb_error_set(err, rc, "Cannot map the header page of %s: %s.", path,
                       strerror(-rc));
        goto out;
    }
    h = (const void *)page;
    magic = __atomic_load_n(&h->magic, __ATOMIC_RELAXED);
    version = __atomic_load_n(&h->version, __ATOMIC_RELAXED);
    header_size = __atomic_load_n(&h->header_size, __ATOMIC_RELAXED);
    if (magic != SHMB_SEGMENT_MAGIC) {
        rc = shmb_error_set(
            err, -EINVAL,
            "%s is not a shmbroker segment: it starts with 0x%016llx, not the "
            "magic number 0x%016llx (\"SHMBSEG1\"). Check --name and --shm-dir.",
            path, (unsigned long long)magic, (unsigned long long)SHMB_SEGMENT_MAGIC);
        goto out;
    }
    if (version != SHMB_LAYOUT_VERSION) {
        rc = shmb_error_set(
            err, -EPROTO,
            "%s is a shmbroker segment of layout version %u; this "
            "shmbrokerctl reads layout %d only (a shmbrokerd of another release "
            "wrote it: use that release's shmbrokerctl).",
            path, version, SHMB_LAYOUT_VERSION);
        goto out;
    }
    if (header_size != SHMB_HEADER_PAGE) {
        rc = shmb_error_set(
            err, -EINVAL,
            "%s is not a valid shmbroker segment: its header says %u bytes of "
            "header, not %u.",
            path, header_size, SHMB_HEADER_PAGE);
        goto out;
    }
    out->total_size = __atomic_load_n(&h->total_size, __ATOMIC_RELAXED);
    out->data_size = __atomic_load_n(&h->data_size, __ATOMIC_RELAXED);
    out->owner_pid = __atomic_load_n(&h->owner_pid, __ATOMIC_RELAXED);
    out->heartbeat_period_ms = __atomic_load_n(&h->heartbeat_period_ms, __ATOMIC_RELAXED);
    out->catalog_slots = __atomic_load_n(&h->catalog_slots, __ATOMIC_RELAXED);
    out->catalog_unlisted = __atomic_load_n(&h->catalog_unlisted, __ATOMIC_RELAXED);
    report_copy_counters(page, out);
out:
    if (page != MAP_FAILED)
        munmap((void *)page, map_len);
    if (fd >= 0)
        close(fd);
    return rc;
}

long shmb_socket_listener_pid(const char *path, uint32_t *uid)
{
    struct sockaddr_un sun;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    long pid = 0;
    int fd;

    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path))
        return 0;
    memcpy(sun.sun_path, path, strlen(path) + 1);
    /* Non-blocking: a listener whose backlog is full is not waited for. */
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) == 0 &&
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        pid = (long)cred.pid;
        if (uid != NULL)
            *uid = (uint32_t)cred.uid;
    }
    close(fd);
    return pid;
}

/* Whether the file name in dir starts with a segment's magic number: read
 * first, so that a scan maps only the headers of segments. */
static bool report_has_magic(int dirfd, const char *name)
{
    uint64_t magic = 0;
    struct stat st;
    bool yes = false;
    int fd =
        openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);

    if (fd < 0)
        return false;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= SHMB_HEADER_PAGE &&
        pread(fd, &magic, sizeof(magic), 0) == (ssize_t)sizeof(magic))
        yes = magic == SHMB_SEGMENT_MAGIC;
    close(fd);
    return yes;
}

int shmb_segment_scan(const char *dir,
                      bool (*keep)(const char *name,
                                   const struct shmb_segment_report *rep, void *arg),
                      void *arg, struct shmb_segment_found *out, size_t max, size_t *n,
                      struct shmb_error *err)
{
    struct shmb_error ignored;
    char path[PATH_MAX];
    struct dirent *e;
    DIR *d = opendir(dir);
    int rc;

    *n = 0;
    if (d == NULL) {
        rc = -errno;
        return shmb_error_set(err, rc, "Cannot read the directory %s: %s.", dir,
                              strerror(-rc));
    }
    while ((e = readdir(d)) != NULL) {
        struct shmb_segment_report rep;

        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(out->name) ||
            !report_has_magic(dirfd(d), e->d_name))
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path) ||
            shmb_segment_report_read(path, &rep, &ignored) < 0 ||
            (keep != NULL && !keep(e->d_name, &rep, arg)))
            continue;
        if (*n < max) {
            memcpy(out[*n].name, e->d_name, strlen(e->d_name) + 1);
            out[*n].rep = rep;
        }
        (*n)++;
    }
    closedir(d);
    return 0;
}
