// SPDX-License-Identifier: Apache-2.0
/*
 * The segment file: free-space check, exclusive creation, reservation of every
 * page at start-up (so a full tmpfs fails here, not as a client's SIGBUS
 * later), mapping and the header page.
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

/* statfs's f_type of a hugetlbfs mount (linux/magic.h). */
#define SEGMENT_HUGETLBFS_MAGIC 0x958458f6

/* Read the state (field 3) and the start time in clock ticks after boot
 * (field 22) of /proc/PID/stat; false when it cannot be read. */
static bool segment_process_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024], *p;
    unsigned long long ticks = 0;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: count from the last ')'. */
    p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ' || p[2] == '\0')
        return false;
    *state = p[2];
    for (field = 2; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p + 1, "%llu", &ticks) != 1)
        return false;
    *start = ticks;
    return true;
}

/* A process's start time (see segment_process_stat), or 0 when unknown. */
static uint64_t segment_process_start(pid_t pid)
{
    uint64_t start = 0;
    char state;

    return segment_process_stat(pid, &state, &start) ? start : 0;
}

int segment_check_name(const char *name, struct shmb_error *err)
{
    size_t len = name ? strlen(name) : 0;

    if (len == 0 || len > NAME_MAX || strchr(name, '/') != NULL ||
        strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return shmb_error_set(err, -EINVAL,
                              "Invalid segment name '%s': use 1 to %d characters "
                              "without '/', for example --name shmbroker.",
                              name ? name : "", NAME_MAX);
    return 0;
}

uint64_t segment_round_size(uint64_t size)
{
    return segment_round_to(size, SHMB_HEADER_PAGE);
}

uint64_t segment_round_to(uint64_t size, uint64_t page)
{
    if (page == 0 || size > UINT64_MAX - (page - 1))
        return 0;
    return (size + page - 1) / page * page;
}

/* The smallest power of two >= n (n <= 2^63). */
static uint64_t segment_pow2ceil(uint64_t n)
{
    uint64_t p = 1;

    while (p < n)
        p <<= 1;
    return p;
}

void segment_plan(uint64_t size, uint64_t page, uint64_t max_objects,
                  struct segment_plan *out)
{
    uint64_t slots, bytes = 0, want;

    if (page == 0)
        page = SHMB_HEADER_PAGE;
    want = max_objects != 0 ? max_objects + (max_objects + 2) / 3 : size / SEGMENT_BYTES_PER_SLOT;
    if (max_objects > SEGMENT_MAX_OBJECTS)
        want = SEGMENT_MAX_OBJECTS + SEGMENT_MAX_OBJECTS / 3;
    slots = segment_pow2ceil(want < SEGMENT_CATALOG_MIN_SLOTS ? SEGMENT_CATALOG_MIN_SLOTS : want);
    for (; slots >= SEGMENT_CATALOG_MIN_SLOTS; slots /= 2) {
        bytes = segment_round_to(slots * sizeof(struct shmb_catalog_entry), page);
        if (bytes != 0 && bytes <= size / SEGMENT_CATALOG_SHARE)
            break;
    }
    if (slots < SEGMENT_CATALOG_MIN_SLOTS || size < SEGMENT_MIN_SIZE + bytes)
        slots = bytes = 0;
    out->catalog_slots = slots;
    out->catalog_bytes = bytes;
    out->catalog_offset = size - bytes;
    out->data_size = size > SHMB_HEADER_PAGE + bytes
                         ? (size - bytes - SHMB_HEADER_PAGE) & ~(uint64_t)(SHMB_ALIGN - 1)
                         : 0;
}

uint64_t segment_data_size(uint64_t size, uint64_t page, uint64_t max_objects)
{
    struct segment_plan plan;

    segment_plan(size, page, max_objects, &plan);
    return plan.data_size;
}

/* Lay seg out for its size: the data area and the catalog (segment_plan),
 * with a new random seed for the catalog's hash. */
static void segment_lay_out(struct segment *seg, uint64_t page, uint64_t max_objects)
{
    struct segment_plan plan;
    uint32_t seed = 0;

    segment_plan(seg->size, page, max_objects, &plan);
    seg->data_offset = SHMB_HEADER_PAGE;
    seg->data_size = plan.data_size;
    seg->catalog_offset = plan.catalog_offset;
    seg->catalog_slots = plan.catalog_slots;
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed))
        seed = (uint32_t)time(NULL) ^ ((uint32_t)getpid() << 16);
    seg->catalog_seed = seed;
}

/* An adopted segment keeps the catalog its header page describes when that
 * is a layout segment_plan could have made for its size (another
 * --max-objects then): the ring's positions depend on the data area's size,
 * so the objects stay only with the data area they were written in. */
static void segment_keep_layout(struct segment *seg, const struct shmb_segment_header *hdr,
                                uint64_t page)
{
    uint64_t slots = hdr->catalog_slots, bytes;

    if (hdr->magic != SHMB_SEGMENT_MAGIC || hdr->version != SHMB_LAYOUT_VERSION ||
        hdr->total_size != seg->size)
        return;
    /* The seed too: a reader that kept its mapping across the restart
     * hashes with the one it was given, and finds keys where they were. */
    if (hdr->catalog_seed != 0)
        seg->catalog_seed = hdr->catalog_seed;
    if (slots == seg->catalog_slots ||
        (slots != 0 && (slots < SEGMENT_CATALOG_MIN_SLOTS || (slots & (slots - 1)) != 0 ||
                        slots > (UINT64_C(1) << 40))))
        return;
    bytes = slots != 0 ? segment_round_to(slots * sizeof(struct shmb_catalog_entry), page) : 0;
    if (bytes > seg->size / SEGMENT_CATALOG_SHARE || seg->size < SEGMENT_MIN_SIZE + bytes ||
        hdr->catalog_offset != seg->size - bytes ||
        hdr->data_size != ((seg->size - bytes - SHMB_HEADER_PAGE) & ~(uint64_t)(SHMB_ALIGN - 1)))
        return;
    seg->catalog_slots = slots;
    seg->catalog_offset = hdr->catalog_offset;
    seg->data_size = hdr->data_size;
}

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
static const char *segment_grow_hint(const char *dir, char *out, size_t len)
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
static int segment_join_path(char *out, size_t len, const char *dir, const char *name,
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

/* Open the read-only descriptor that read-only clients receive: a PROT_WRITE
 * mapping of it fails, whatever the client does. */
static int segment_open_readonly(struct segment *seg, struct shmb_error *err)
{
    struct stat a, b;
    int saved;

    seg->ro_fd = open(seg->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (seg->ro_fd < 0) {
        saved = errno;
        return shmb_error_set(err, -saved, "Cannot open segment %s read-only: %s.",
                              seg->path, strerror(saved));
    }
    if (fstat(seg->fd, &a) != 0 || fstat(seg->ro_fd, &b) != 0 || a.st_ino != b.st_ino ||
        a.st_dev != b.st_dev)
        return shmb_error_set(
            err, -EBUSY, "Segment %s was replaced while it was being opened.", seg->path);
    return 0;
}

static segment_progress_fn segment_progress;
static void *segment_progress_arg;

void segment_set_progress(segment_progress_fn fn, void *arg)
{
    segment_progress = fn;
    segment_progress_arg = arg;
}

/* posix_fallocate of fd's first size bytes, a chunk at a time, telling the
 * progress callback before the first and after each. 0 or an errno (as
 * posix_fallocate: positive). */
static int segment_fallocate(int fd, uint64_t size)
{
    uint64_t done = 0, len;
    int rc;

    if (segment_progress == NULL || size <= SEGMENT_RESERVE_CHUNK)
        return posix_fallocate(fd, 0, (off_t)size);
    segment_progress(0, size, segment_progress_arg);
    while (done < size) {
        len = size - done < SEGMENT_RESERVE_CHUNK ? size - done : SEGMENT_RESERVE_CHUNK;
        if ((rc = posix_fallocate(fd, (off_t)done, (off_t)len)) != 0)
            return rc;
        done += len;
        segment_progress(done, size, segment_progress_arg);
    }
    return 0;
}

/* Reserve every page of the file; vLLM's message on ENOSPC. */
static int segment_reserve(struct segment *seg, uint64_t size, uint64_t free_bytes,
                           struct shmb_error *err)
{
    char hint[PATH_MAX + 160];
    int rc = segment_fallocate(seg->fd, size);

    if (rc == 0)
        return 0;
    if (rc == ENOSPC)
        return shmb_error_set(err, -ENOSPC,
                              "Insufficient space in %s: could not reserve %llu MiB "
                              "(%llu MiB were free before). %s, or choose a smaller --size.",
                              seg->dir, shmb_mib_rounded(size),
                              shmb_mib_rounded(free_bytes),
                              segment_grow_hint(seg->dir, hint, sizeof(hint)));
    return shmb_error_set(err, -rc, "Cannot reserve %llu bytes for segment %s: %s.",
                          (unsigned long long)size, seg->path, strerror(rc));
}

/* Map the whole file read-write. */
static int segment_map(struct segment *seg, uint64_t size, struct shmb_error *err)
{
    int saved;

    seg->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (seg->base == MAP_FAILED) {
        saved = errno;
        seg->base = NULL;
        return shmb_error_set(err, -saved, "Cannot map segment %s (%llu bytes): %s.",
                              seg->path, (unsigned long long)size, strerror(saved));
    }
    seg->size = size;
    return 0;
}

/* The liveness lock's file: "<dir>/.<name>.lock", beside the segment. No
 * client ever gets a descriptor of it (the segment's own inode would not do:
 * every client holds a descriptor of that one and could flock it). */
static int segment_lock_path(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/.%s.lock", dir, name);

    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int segment_check_owner(const struct stat *st, const char *path, struct shmb_error *err)
{
    if (st->st_uid == geteuid() && (st->st_mode & 077) == 0 && st->st_nlink == 1)
        return 0;
    return shmb_error_set(
        err, -EPERM,
        "%s is owned by uid %u with mode %04o and %llu link(s); shmbrokerd uses only a "
        "file owned by its own user (uid %u) with mode 0600 and one link, since anyone "
        "else who can open it could read and change every object. Find out who made it, "
        "then remove it (as its owner or root), or choose another --name.",
        path, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
        (unsigned long long)st->st_nlink, (unsigned)geteuid());
}

/* Open an existing path without following a symbolic link and without
 * blocking (a FIFO there would block open() forever), and refuse anything
 * but a regular file: the descriptor, or -errno with a message. */
static int segment_open_existing(const char *path, int flags, struct stat *st,
                                 struct shmb_error *err)
{
    int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), saved;

    if (fd < 0) {
        saved = errno;
        if (saved == ELOOP)
            return shmb_error_set(err, -EINVAL,
                                  "%s is a symbolic link, not a segment; remove it, or "
                                  "choose another --name.",
                                  path);
        return shmb_error_set(err, -saved, "Cannot open %s: %s.", path, strerror(saved));
    }
    if (fstat(fd, st) != 0) {
        saved = errno;
        close(fd);
        return shmb_error_set(err, -saved, "Cannot read %s: %s.", path, strerror(saved));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return shmb_error_set(err, -EINVAL,
                              "%s is not a regular file (a FIFO, socket, device or "
                              "directory); remove it, or choose another --name.",
                              path);
    }
    return fd;
}

/* Take this daemon's liveness lock: an exclusive flock on the lock file
 * (created when missing, mode 0600), without waiting. 0 and the descriptor
 * in *lock_fd; -EBUSY when another process holds it; -errno with a message
 * otherwise (a lock file that is not a regular file of ours, mode 0600, one
 * link, is refused: another user could hold it). When create is false a
 * missing lock file is -ENOENT (nobody holds it). A flock belongs to the
 * open file description, never passed to a client: only this process can
 * release it, and its exit always does (SIGKILL included). */
static int segment_lock(const char *dir, const char *name, bool create, int *lock_fd,
                        struct shmb_error *err)
{
    char path[PATH_MAX];
    struct stat st, now;
    int fd, saved, tries;

    *lock_fd = -1;
    if (segment_lock_path(path, sizeof(path), dir, name) < 0)
        return shmb_error_set(err, -ENAMETOOLONG, "Lock file path for %s/%s is too long.",
                              dir, name);
    for (tries = 0; tries < 8; tries++) {
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (create ? O_CREAT : 0),
                  0600);
        if (fd < 0) {
            saved = errno;
            if (saved == ENOENT && !create)
                return -ENOENT;
            return shmb_error_set(err, -saved, "Cannot open lock file %s: %s.", path,
                                  saved == ELOOP ? "it is a symbolic link" : strerror(saved));
        }
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return shmb_error_set(err, -EINVAL,
                                  "Lock file %s is not a regular file; remove it.", path);
        }
        if ((st.st_mode & 07777) != 0600 || st.st_uid != geteuid() || st.st_nlink != 1) {
            close(fd);
            return segment_check_owner(&st, path, err) < 0
                       ? -EPERM
                       : shmb_error_set(err, -EPERM,
                                        "Lock file %s has mode %04o, not 0600; remove it.",
                                        path, (unsigned)(st.st_mode & 07777));
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            saved = errno == EWOULDBLOCK ? EBUSY : errno;
            close(fd);
            if (saved == EBUSY)
                return -EBUSY;
            return shmb_error_set(err, -saved, "Cannot lock %s: %s.", path, strerror(saved));
        }
        /* A daemon that stopped cleanly removes the file while it holds the
         * lock: a lock taken on a file no longer at path proves nothing. */
        if (stat(path, &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino) {
            *lock_fd = fd;
            return 0;
        }
        close(fd);
        if (!create)
            return -ENOENT;
    }
    return shmb_error_set(err, -EBUSY, "Lock file %s keeps being replaced.", path);
}

/* Take the segment's lock for this daemon; -EBUSY with a message when a
 * live process holds it. */
static int segment_take_lock(struct segment *seg, struct shmb_error *err)
{
    int rc = segment_lock(seg->dir, seg->name, true, &seg->lock_fd, err);

    if (rc == -EBUSY)
        return shmb_error_set(err, -EBUSY,
                              "Segment %s is locked by another running process (a "
                              "shmbrokerd); stop it first, or choose another --name.",
                              seg->path);
    return rc;
}

/* Write the whole header page from private values (the file's size and the
 * layout's constants), the ring cursor excepted; the magic goes last, so a
 * header is valid only once it is complete. */
static int segment_write_header(struct segment *seg, uint64_t created_unix)
{
    struct shmb_segment_header *hdr = seg->hdr;
    /* Built privately and copied in through the guard (segment_store): a
     * client holding the descriptor may shrink the file at any time. */
    struct shmb_segment_header h;

    if (segment_load(&h, hdr, sizeof(h)) < 0)
        return -EIO;
    h.version = SHMB_LAYOUT_VERSION;
    h.header_size = SHMB_HEADER_PAGE;
    h.total_size = seg->size;
    h.data_offset = seg->data_offset;
    h.data_size = seg->data_size;
    h.owner_pid = getpid();
    h.owner_start = seg->owner_start = segment_process_start(getpid());
    h.created_unix = seg->created_unix = created_unix;
    h.catalog_offset = seg->catalog_offset;
    h.catalog_slots = seg->catalog_slots;
    h.catalog_seed = seg->catalog_seed;
    h.heartbeat_period_ms = SEGMENT_HEARTBEAT_MS;
    h.retired = 0;
    if (segment_store((char *)hdr + sizeof(h.magic), (char *)&h + sizeof(h.magic),
                      sizeof(h) - sizeof(h.magic)) < 0)
        return -EIO;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return segment_store(&hdr->magic, &(uint64_t){SHMB_SEGMENT_MAGIC}, sizeof(hdr->magic));
}

int segment_restore_header(const struct segment *seg, struct shmb_error *err)
{
    struct shmb_segment_header hdr = {
        .magic = SHMB_SEGMENT_MAGIC,
        .version = SHMB_LAYOUT_VERSION,
        .header_size = SHMB_HEADER_PAGE,
        .total_size = seg->size,
        .data_offset = seg->data_offset,
        .data_size = seg->data_size,
        .owner_pid = getpid(),
        .owner_start = seg->owner_start,
        .created_unix = seg->created_unix,
        .catalog_offset = seg->catalog_offset,
        .catalog_slots = seg->catalog_slots,
        .catalog_seed = seg->catalog_seed,
    };
    const size_t cat = offsetof(struct shmb_segment_header, catalog_offset),
                 cat_end = offsetof(struct shmb_segment_header, catalog_moves);
    struct stat st;

    /* A client that truncated the file leaves nothing a new client could
     * map: say why, rather than pass a descriptor that cannot be used. */
    if (fstat(seg->fd, &st) == 0 && (uint64_t)st.st_size < seg->size)
        return shmb_error_set(err, -EIO,
                              "Segment %s was truncated by a client to %lld of its %llu "
                              "bytes; no new client can map it. Restart shmbrokerd: it "
                              "grows the file back and keeps the objects still in it.",
                              seg->name, (long long)st.st_size,
                              (unsigned long long)seg->size);
    /* Everything before the ring cursor, which the store keeps. */
    if (seg->hdr == NULL ||
        segment_store(seg->hdr, &hdr, offsetof(struct shmb_segment_header, ring_start)) < 0 ||
        segment_store((char *)seg->hdr + cat, (const char *)&hdr + cat, cat_end - cat) < 0)
        return shmb_error_set(err, -EIO,
                              "Cannot rewrite the header page of segment %s: the page is "
                              "gone (a client truncated the file or punched a hole in "
                              "it). Restart shmbrokerd.",
                              seg->path);
    return 0;
}

/* Record where seg's file lives: dir, name and their path. -ENAMETOOLONG. */
static int segment_set_path(struct segment *seg, const char *dir, const char *name,
                            struct shmb_error *err)
{
    int rc;

    if (strlen(dir) >= sizeof(seg->dir))
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Shared-memory directory path is too long.");
    if ((rc = segment_join_path(seg->path, sizeof(seg->path), dir, name, err)) < 0)
        return rc;
    snprintf(seg->dir, sizeof(seg->dir), "%s", dir);
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    return 0;
}

/* Check that size can be a segment's: whole pages, at least the minimum,
 * and a size mmap takes. */
static int segment_check_size(uint64_t size, struct shmb_error *err)
{
    if (size < SEGMENT_MIN_SIZE || size % SHMB_HEADER_PAGE != 0 ||
        size > (uint64_t)SSIZE_MAX)
        return shmb_error_set(err, -EINVAL,
                              "Segment size %llu bytes is not a whole number of pages "
                              "of at least %u bytes; choose another --size.",
                              (unsigned long long)size, SEGMENT_MIN_SIZE);
    return 0;
}

int segment_create(struct segment *seg, const char *dir, const char *name, uint64_t size,
                   uint64_t max_objects, struct shmb_error *err)
{
    struct shmb_segment_header *hdr;
    uint64_t free_bytes = 0, page;
    int rc, saved, created = 0;

    memset(seg, 0, sizeof(*seg));
    seg->fd = seg->ro_fd = seg->lock_fd = -1;
    if ((rc = segment_check_name(name, err)) < 0 || (rc = segment_check_size(size, err)) < 0)
        return rc;
    if ((rc = segment_set_path(seg, dir, name, err)) < 0)
        return rc;
    page = segment_page_size(dir);
    if (size % page != 0)
        return shmb_error_set(err, -EINVAL,
                              "Segment size %llu bytes is not a whole number of the "
                              "%llu KiB huge pages of %s; round --size up to one.",
                              (unsigned long long)size, (unsigned long long)(page / 1024),
                              dir);

    if ((rc = segment_check_space(dir, size, &free_bytes, err)) < 0)
        return rc;

    seg->fd = open(seg->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (seg->fd < 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot create segment %s: %s.", seg->path,
                            strerror(saved));
        goto fail;
    }
    created = 1;
    if ((rc = segment_take_lock(seg, err)) < 0)
        goto fail;
    if (ftruncate(seg->fd, (off_t)size) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot size segment %s to %llu bytes: %s.",
                            seg->path, (unsigned long long)size, strerror(saved));
        goto fail;
    }
    /* The header first, on its own reserved page(s): a daemon killed while
     * it reserves the rest (seconds for gigabytes) leaves a segment the next
     * start adopts, empty, not a file of no known kind that it refuses. */
    if ((rc = segment_reserve(seg, page, free_bytes, err)) < 0 ||
        (rc = segment_map(seg, size, err)) < 0 || (rc = segment_open_readonly(seg, err)) < 0)
        goto fail;
    seg->hdr = hdr = seg->base;
    segment_lay_out(seg, page, max_objects);
    hdr->ring_start = hdr->ring_end = hdr->ring_next_id = 0;
    segment_write_header(seg, (uint64_t)time(NULL));
    /* Reserve every page now. Without this, tmpfs hands out pages on first
     * touch, and a client that touches one after /dev/shm filled up dies of
     * SIGBUS long after start-up succeeded. */
    if ((rc = segment_reserve(seg, size, free_bytes, err)) < 0)
        goto fail;
    return 0;

fail:
    saved = rc;
    segment_close(seg);
    if (created)
        unlink(seg->path);
    return saved;
}

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

static void segment_note_header(struct segment *seg, const struct shmb_segment_header *hdr);
static bool segment_is_layout1(const struct shmb_segment_header *hdr, uint64_t size);

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

bool segment_locked_by(const char *dir, const char *name, pid_t pid)
{
    char path[PATH_MAX], line[256];
    unsigned long long ino;
    unsigned maj, min;
    struct stat st;
    bool found = false;
    FILE *f;
    long holder;

    if (segment_lock_path(path, sizeof(path), dir, name) < 0 || stat(path, &st) != 0 ||
        (f = fopen("/proc/locks", "re")) == NULL)
        return false;
    /* "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF" */
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = sscanf(line, "%*d: FLOCK %*s %*s %ld %x:%x:%llu", &holder, &maj, &min,
                       &ino) == 4 &&
                holder == (long)pid && makedev(maj, min) == st.st_dev &&
                ino == (unsigned long long)st.st_ino;
    fclose(f);
    return found;
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

void segment_close(struct segment *seg)
{
    char path[PATH_MAX];
    struct stat a, b;

    segment_guard_unwatch(seg);
    if (seg->base != NULL)
        munmap(seg->base, (size_t)seg->size);
    seg->base = NULL;
    seg->hdr = NULL;
    if (seg->fd >= 0)
        close(seg->fd);
    if (seg->ro_fd >= 0)
        close(seg->ro_fd);
    if (seg->lock_fd >= 0) {
        /* The lock file goes while this daemon still holds its lock, and only
         * if it is still ours (segment_lock checks for that). */
        if (seg->dir[0] != '\0' && segment_lock_path(path, sizeof(path), seg->dir,
                                                    seg->name) == 0 &&
            stat(path, &a) == 0 && fstat(seg->lock_fd, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            unlink(path);
        close(seg->lock_fd); /* releases the lock */
    }
    seg->fd = seg->ro_fd = seg->lock_fd = -1;
}

/* True when hdr (a private copy) is the header a daemon of layout version 1
 * wrote for a file of size bytes. */
static bool segment_is_layout1(const struct shmb_segment_header *hdr, uint64_t size)
{
    return hdr->version == 1 && hdr->catalog_offset == 0 && hdr->catalog_slots == 0 &&
           hdr->data_size == ((size - SHMB_HEADER_PAGE) & ~(uint64_t)(SHMB_ALIGN - 1));
}

/* Check that the file open on fd (at path) can be the segment: a regular
 * file of this user's, mode 0600, one link (segment_check_owner), of size
 * bytes. 0 when it is; 1 when only its size differs but its header page (a
 * private copy) records size as the segment's size: a client shrank or grew
 * it, and it may be set back to size. Otherwise the header page is not
 * consulted: a read-write client may have written anything there, and
 * segment_adopt rewrites it. */
static int segment_check_file(int fd, const char *path, uint64_t size,
                              struct shmb_error *err)
{
    struct shmb_segment_header hdr;
    struct stat st;
    uint64_t hint;
    bool have;
    int rc;

    if (fstat(fd, &st) != 0)
        return shmb_error_set(err, -EIO, "Cannot read the size of segment %s.", path);
    if (!S_ISREG(st.st_mode))
        return shmb_error_set(err, -EINVAL,
                              "%s is not a regular file; remove it, or choose another "
                              "--name.",
                              path);
    if ((rc = segment_check_owner(&st, path, err)) < 0)
        return rc;
    have = pread(fd, &hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr) &&
           hdr.magic == SHMB_SEGMENT_MAGIC;
    /* An older daemon's layout: its data area runs to the end of the file,
     * where this one keeps the catalog. Never adopted, never removed here:
     * its objects may still be read by the clients that map it. Only a
     * header that is layout 1 throughout (its data area to the end, nothing
     * where layout 2 records its catalog) is taken for one: a client that
     * wrote 1 into a layout-2 header damaged it, and the adoption rebuilds it. */
    if (have && segment_is_layout1(&hdr, (uint64_t)st.st_size))
        return shmb_error_set(
            err, -EPROTO,
            "Segment %s holds layout version 1 (%llu bytes), written by an older "
            "shmbrokerd; this shmbrokerd writes layout version 2 and does not adopt it. "
            "Drain it (let its clients finish), then remove it with shmbrokerd "
            "--remove-segment, or choose another --name.",
            path, (unsigned long long)st.st_size);
    if ((uint64_t)st.st_size == size)
        return 0;
    hint = (uint64_t)st.st_size;
    if (have && hdr.version == SHMB_LAYOUT_VERSION) {
        if (hdr.total_size == size)
            return 1;
        /* Neither the file nor its header agrees with --size, nor with each
         * other: nothing says which size it was made with. */
        if (hdr.total_size != hint)
            return shmb_error_set(
                err, -EINVAL,
                "Segment %s left by the previous shmbrokerd is %llu bytes, its header "
                "page records %llu and --size asks for %llu: a client changed the file "
                "or its header. Start with the --size it was created with to keep its "
                "objects, or with --fresh to discard them.",
                path, (unsigned long long)hint, (unsigned long long)hdr.total_size,
                (unsigned long long)size);
    }
    return shmb_error_set(
        err, -EINVAL,
        "Segment %s left by the previous shmbrokerd is %llu bytes, not "
        "the %llu asked for: start with --size %llu to keep its objects, "
        "or with --fresh to discard them.",
        path, (unsigned long long)hint, (unsigned long long)size, (unsigned long long)hint);
}

/* Open the segment file dir/name, which must exist, read-only; path gets
 * its path (PATH_MAX bytes). The descriptor, or -errno with err set. */
static int segment_open_named(const char *dir, const char *name, char *path,
                              struct stat *st, struct shmb_error *err)
{
    int rc;

    if ((rc = segment_join_path(path, PATH_MAX, dir, name, err)) < 0)
        return rc;
    return segment_open_existing(path, O_RDONLY, st, err);
}

int segment_check_adoptable(const char *dir, const char *name, uint64_t size,
                            struct shmb_error *err)
{
    char path[PATH_MAX];
    struct stat st;
    int fd, rc;

    if ((fd = segment_open_named(dir, name, path, &st, err)) < 0)
        return fd;
    rc = segment_check_file(fd, path, size, err);
    close(fd);
    return rc;
}

int segment_check_existing(const char *dir, const char *name, struct shmb_error *err)
{
    char path[PATH_MAX];
    struct stat st;
    int fd;

    if ((fd = segment_open_named(dir, name, path, &st, err)) < 0)
        return fd;
    close(fd);
    return segment_check_owner(&st, path, err);
}

/* Say in seg->adopt_note what the header page (a private copy, hdr) had
 * wrong, compared with what the file's size and the layout say. */
static void segment_note_header(struct segment *seg, const struct shmb_segment_header *hdr)
{
    if (hdr->magic == SHMB_SEGMENT_MAGIC && hdr->version == SHMB_LAYOUT_VERSION &&
        hdr->header_size == SHMB_HEADER_PAGE && hdr->total_size == seg->size &&
        hdr->data_offset == seg->data_offset && hdr->data_size == seg->data_size)
        return;
    snprintf(seg->adopt_note, sizeof(seg->adopt_note),
             "header page damaged (magic 0x%llx, layout version %u, header %u bytes, "
             "total %llu, data offset %llu, data size %llu); rebuilt from the file's "
             "size (%llu bytes)",
             (unsigned long long)hdr->magic, hdr->version, hdr->header_size,
             (unsigned long long)hdr->total_size, (unsigned long long)hdr->data_offset,
             (unsigned long long)hdr->data_size, (unsigned long long)seg->size);
}

int segment_adopt(struct segment *seg, const char *dir, const char *name, uint64_t size,
                  uint64_t max_objects, struct shmb_error *err)
{
    struct shmb_segment_header copy;
    struct stat st;
    uint64_t created;
    int rc, saved;

    memset(seg, 0, sizeof(*seg));
    seg->fd = seg->ro_fd = seg->lock_fd = -1;
    if ((rc = segment_check_name(name, err)) < 0)
        return rc;
    if ((rc = segment_set_path(seg, dir, name, err)) < 0)
        return rc;
    if ((seg->fd = segment_open_existing(seg->path, O_RDWR, &st, err)) < 0)
        return seg->fd;
    if ((rc = segment_check_file(seg->fd, seg->path, size, err)) < 0 ||
        (rc = segment_take_lock(seg, err)) < 0 ||
        (rc = segment_check_file(seg->fd, seg->path, size, err)) < 0)
        goto fail;
    if (rc == 1) {
        /* A client shrank or grew the file: back to the size its header and
         * --size agree on (bytes past the ring hold no data; bytes lost to a
         * shrink read as zeros, and the caller drops what lay there). */
        if (fstat(seg->fd, &st) != 0 || ftruncate(seg->fd, (off_t)size) != 0) {
            saved = errno;
            rc = shmb_error_set(err, -saved,
                                "Cannot set segment %s back to its %llu bytes: %s. Start "
                                "with --fresh to discard it.",
                                seg->path, (unsigned long long)size, strerror(saved));
            goto fail;
        }
        seg->resized_from = (uint64_t)st.st_size;
        if ((rc = segment_check_file(seg->fd, seg->path, size, err)) < 0)
            goto fail;
    }
    if ((rc = segment_reserve(seg, size, 0, err)) < 0 ||
        (rc = segment_map(seg, size, err)) < 0 ||
        (rc = segment_open_readonly(seg, err)) < 0)
        goto fail;
    seg->hdr = seg->base;
    /* Everything the daemon uses comes from the file's size and the layout's
     * constants, never from the header page, which read-write clients keep
     * mapped across a restart and may change at any time. One private copy
     * of the header says only what to log. */
    segment_lay_out(seg, segment_page_size(dir), max_objects);
    if (segment_load(&copy, seg->hdr, sizeof(copy)) < 0)
        goto truncated;
    segment_keep_layout(seg, &copy, segment_page_size(dir));
    segment_note_header(seg, &copy);
    seg->found_gen_next = copy.magic == SHMB_SEGMENT_MAGIC ? copy.gen_next : 0;
    created = copy.magic == SHMB_SEGMENT_MAGIC ? copy.created_unix : (uint64_t)time(NULL);
    if (segment_write_header(seg, created) < 0)
        goto truncated;
    return 0;

truncated:
    /* The guard caught the SIGBUS of a read or write of the header page. */
    rc = shmb_error_set(err, -EIO,
                        "Segment %s was truncated or holed while it was being adopted "
                        "(a client still holds its read-write descriptor): not "
                        "adopted. Stop that client and start shmbrokerd again.",
                        seg->path);

fail:
    segment_close(seg);
    return rc;
}

void segment_destroy(struct segment *seg)
{
    struct stat a, b;

    /* Only the file this daemon made: another may have been renamed over
     * the path since (and be another daemon's live segment). A memfd has no
     * path: it goes with its last descriptor and mapping. */
    if (!seg->memfd && seg->path[0] != '\0' && seg->fd >= 0 && stat(seg->path, &a) == 0 &&
        fstat(seg->fd, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        unlink(seg->path);
    segment_close(seg);
}

/* The guard (segment.h). Its state is static: the SIGBUS handler can only
 * reach it that way. One entry per watched segment, found by the address
 * range of its mapping. */
struct segment_guard_entry {
    uintptr_t begin, end;               /* the mapping; end == 0 when unused */
    int fd;                             /* the watched file */
    uint64_t size;                      /* its size when watched */
    uint64_t blocks;                    /* its reserved 512-byte blocks then */
    bool broken;                        /* found shrunk, holed, or faulted */
    char message[SHMB_ERROR_MSG_MAX];   /* why, for every refused allocation */
    void (*on_broken)(const char *message);
    char path[PATH_MAX];
};

static struct segment_guard_entry segment_guards[SEGMENT_GUARD_MAX];

/* Where segment_store's write or segment_load's read jumps back to on
 * SIGBUS; NULL outside one. */
static sigjmp_buf *volatile segment_guard_jump;

/* The address whose access raised the last caught SIGBUS. */
static void *volatile segment_guard_fault;

/* SIGBUS: a copy of segment_store or segment_load hit a page the file no
 * longer has. Anything else is a real fault: die of it as without the
 * handler. */
static void segment_on_sigbus(int signo, siginfo_t *info, void *context)
{
    sigjmp_buf *jump = segment_guard_jump;

    (void)context;
    if (jump != NULL) {
        segment_guard_jump = NULL;
        segment_guard_fault = info != NULL ? info->si_addr : NULL;
        siglongjmp(*jump, 1);
    }
    signal(signo, SIG_DFL);
    raise(signo);
}

/* The watched segment whose mapping holds addr, or NULL. */
static struct segment_guard_entry *segment_guard_find(const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    size_t i;

    for (i = 0; i < SEGMENT_GUARD_MAX; i++)
        if (segment_guards[i].end != 0 && a >= segment_guards[i].begin &&
            a < segment_guards[i].end)
            return &segment_guards[i];
    return NULL;
}

/* Mark g broken, once, with what happened and what to do. */
static void segment_guard_break(struct segment_guard_entry *g, const char *what)
{
    /* Built apart: gcc cannot tell that g->path is not g->message. */
    char message[sizeof(g->message)];

    if (g->broken)
        return;
    g->broken = true;
    snprintf(message, sizeof(message),
             "Segment %.300s is broken: %.160s, through the read-write descriptor every "
             "client receives. The daemon refuses new allocations; objects still in "
             "the file can be read. Find and fix the client that changes the file, "
             "then restart shmbrokerd: %s",
             g->path, what,
             strncmp(g->path, "memfd:", 6) == 0
                 ? "under systemd it adopts the memfd again with the objects it still "
                   "holds; run by hand, the pool starts empty."
                 : "it re-reserves the segment and keeps the objects the file still "
                   "holds.");
    memcpy(g->message, message, sizeof(message));
    if (g->on_broken != NULL)
        g->on_broken(g->message);
}

/* Install the SIGBUS handler: once from segment_load and segment_store,
 * which may run before segment_guard_watch (the header copy of
 * segment_adopt); again (force) from segment_guard_watch. */
static int segment_guard_install(bool force)
{
    static bool installed;
    struct sigaction sa;

    if (installed && !force)
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = segment_on_sigbus;
    /* SIGBUS stays unblocked in the handler, so that siglongjmp needs no
     * saved mask and segment_store no system call. */
    sa.sa_flags = SA_NODEFER | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) != 0)
        return -errno;
    installed = true;
    return 0;
}

int segment_guard_watch(const struct segment *seg, void (*on_broken)(const char *message),
                        struct shmb_error *err)
{
    struct segment_guard_entry *g = NULL;
    uintptr_t begin = (uintptr_t)seg->base, end = begin + (uintptr_t)seg->size;
    struct stat st;
    size_t i;
    int rc;

    if (seg->base == NULL || seg->size == 0)
        return shmb_error_set(err, -EINVAL, "Cannot watch segment %s: it is not mapped.",
                              seg->path);
    if ((rc = segment_guard_install(true)) < 0)
        return shmb_error_set(err, rc, "Cannot watch segment %s: %s.", seg->path,
                              strerror(-rc));
    if (fstat(seg->fd, &st) != 0)
        return shmb_error_set(err, -errno, "Cannot watch segment %s: %s.", seg->path,
                              strerror(errno));
    /* Mappings never overlap: an entry that overlaps this one is this
     * segment watched before, or one unmapped without segment_close. */
    for (i = 0; i < SEGMENT_GUARD_MAX; i++) {
        if (segment_guards[i].end != 0 && segment_guards[i].begin < end &&
            begin < segment_guards[i].end)
            segment_guards[i].end = 0;
        if (segment_guards[i].end == 0 && g == NULL)
            g = &segment_guards[i];
    }
    if (g == NULL)
        return shmb_error_set(err, -ENOSPC,
                              "Cannot watch segment %s: the guard already watches %d "
                              "segments, as many as it can (SEGMENT_GUARD_MAX).",
                              seg->path, SEGMENT_GUARD_MAX);
    memset(g, 0, sizeof(*g));
    g->begin = begin;
    g->end = end;
    g->fd = seg->fd;
    g->size = seg->size;
    g->blocks = (uint64_t)st.st_blocks;
    g->on_broken = on_broken;
    snprintf(g->path, sizeof(g->path), "%s", seg->path);
    return 0;
}

void segment_guard_unwatch(const struct segment *seg)
{
    struct segment_guard_entry *g;

    if (seg->base != NULL && (g = segment_guard_find(seg->base)) != NULL &&
        g->begin == (uintptr_t)seg->base)
        g->end = 0;
}

int segment_guard_check(const void *addr, struct shmb_error *err)
{
    struct segment_guard_entry *g = segment_guard_find(addr);
    struct stat st;
    char what[160];

    if (g == NULL)
        return 0;
    if (!g->broken && fstat(g->fd, &st) == 0) {
        /* A shrunk file loses its tail; a punched hole gives back pages the
         * daemon reserved, which show as fewer blocks. */
        if ((uint64_t)st.st_size < g->size) {
            snprintf(what, sizeof(what), "it was truncated to %llu of its %llu bytes",
                     (unsigned long long)st.st_size, (unsigned long long)g->size);
            segment_guard_break(g, what);
        } else if ((uint64_t)st.st_blocks < g->blocks) {
            snprintf(what, sizeof(what),
                     "%llu KiB of its reserved pages were given back (a hole was "
                     "punched in it)",
                     (unsigned long long)(g->blocks - (uint64_t)st.st_blocks) / 2);
            segment_guard_break(g, what);
        }
    }
    if (g->broken)
        return shmb_error_set(err, -EIO, "%s", g->message);
    return 0;
}

/* Copy len bytes between the segment (at mapped) and private memory under
 * the guard: a SIGBUS on a page the file no longer has ends the copy with
 * -EIO and marks the segment holding the faulting address broken (mapped's
 * when the kernel gave none), naming what (a read or a write) hit it. */
static int segment_guarded_copy(void *dst, const void *src, size_t len,
                                const void *mapped, const char *what)
{
    struct segment_guard_entry *g;
    sigjmp_buf jump;
    char why[160];

    if (segment_guard_install(false) < 0)
        return -EIO;
    if (sigsetjmp(jump, 0) != 0) {
        g = segment_guard_find(segment_guard_fault);
        if (g == NULL)
            g = segment_guard_find(mapped);
        snprintf(why, sizeof(why),
                 "a %s it hit a page the file no longer has (SIGBUS): it was truncated "
                 "or a hole was punched in it",
                 what);
        if (g != NULL)
            segment_guard_break(g, why);
        return -EIO;
    }
    segment_guard_jump = &jump;
    memcpy(dst, src, len);
    segment_guard_jump = NULL;
    return 0;
}

int segment_store(void *dst, const void *src, size_t len)
{
    /* Tried even once the segment is broken: a state written where the file
     * still has its page (an object deleted) must be there for a restart. */
    return segment_guarded_copy(dst, src, len, dst, "write into");
}

int segment_load(void *dst, const void *src, size_t len)
{
    return segment_guarded_copy(dst, src, len, src, "read of");
}

/* One atomic access to a word of the segment, for segment_guarded_atomic. */
enum segment_atomic_op {
    SEGMENT_LOAD64,
    SEGMENT_STORE64,
    SEGMENT_EXCHANGE64,
    SEGMENT_CAS64,
    SEGMENT_STORE32,
};

/* Do op on addr under the guard, as segment_guarded_copy: -EIO when the
 * page is gone. value: what to store (the desired word of a CAS); *io: the
 * word loaded (the old word of an exchange; the expected word of a CAS in,
 * the word found out). A CAS that fails returns -EAGAIN. */
static int segment_guarded_atomic(void *addr, enum segment_atomic_op op, uint64_t value,
                                  uint64_t *io)
{
    struct segment_guard_entry *g;
    sigjmp_buf jump;
    bool done = true;

    if (segment_guard_install(false) < 0)
        return -EIO;
    if (sigsetjmp(jump, 0) != 0) {
        g = segment_guard_find(segment_guard_fault);
        if (g == NULL)
            g = segment_guard_find(addr);
        if (g != NULL)
            segment_guard_break(g, "an atomic access hit a page the file no longer has "
                                   "(SIGBUS): it was truncated or a hole was punched in it");
        return -EIO;
    }
    segment_guard_jump = &jump;
    switch (op) {
    case SEGMENT_LOAD64:
        *io = __atomic_load_n((uint64_t *)addr, __ATOMIC_ACQUIRE);
        break;
    case SEGMENT_STORE64:
        __atomic_store_n((uint64_t *)addr, value, __ATOMIC_RELEASE);
        break;
    case SEGMENT_EXCHANGE64:
        *io = __atomic_exchange_n((uint64_t *)addr, value, __ATOMIC_ACQ_REL);
        break;
    case SEGMENT_CAS64:
        done = __atomic_compare_exchange_n((uint64_t *)addr, io, value, false,
                                           __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        break;
    case SEGMENT_STORE32:
        __atomic_store_n((uint32_t *)addr, (uint32_t)value, __ATOMIC_RELEASE);
        break;
    }
    segment_guard_jump = NULL;
    return done ? 0 : -EAGAIN;
}

int segment_atomic_load64(const uint64_t *addr, uint64_t *out)
{
    return segment_guarded_atomic((void *)(uintptr_t)addr, SEGMENT_LOAD64, 0, out);
}

int segment_atomic_store64(uint64_t *addr, uint64_t value)
{
    return segment_guarded_atomic(addr, SEGMENT_STORE64, value, NULL);
}

int segment_atomic_exchange64(uint64_t *addr, uint64_t value, uint64_t *old)
{
    return segment_guarded_atomic(addr, SEGMENT_EXCHANGE64, value, old);
}

int segment_atomic_cas64(uint64_t *addr, uint64_t *expected, uint64_t desired)
{
    return segment_guarded_atomic(addr, SEGMENT_CAS64, desired, expected);
}

int segment_atomic_store32(uint32_t *addr, uint32_t value)
{
    return segment_guarded_atomic(addr, SEGMENT_STORE32, value, NULL);
}
