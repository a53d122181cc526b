/*
 * The segment file: free-space check, exclusive creation, reservation of every
 * page at start-up (so a full tmpfs fails here, not as a client's SIGBUS
 * later), mapping and the header page.
 */
#include "segment.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* A process's start time in clock ticks after boot (field 22 of
 * /proc/PID/stat), or 0 when it cannot be read. */
static uint64_t segment_process_start(pid_t pid)
{
    char path[64], buf[1024], *p;
    unsigned long long start = 0;
    ssize_t n;
    int fd, field;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: count from the last ')'. */
    p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    for (field = 2; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL || sscanf(p + 1, "%llu", &start) != 1)
        return 0;
    return start;
}

/* True when the process that recorded itself as owner still runs. */
static bool segment_owner_alive(int64_t pid, uint64_t start)
{
    uint64_t now_start;

    if (pid <= 0 || pid > INT_MAX)
        return false;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM)
        return false;
    now_start = segment_process_start((pid_t)pid);
    return start == 0 || now_start == 0 || now_start == start;
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
    if (size > UINT64_MAX - (SHMB_HEADER_PAGE - 1))
        return 0;
    return (size + SHMB_HEADER_PAGE - 1) & ~(uint64_t)(SHMB_HEADER_PAGE - 1);
}

int segment_check_space(const char *dir, uint64_t required, uint64_t *free_bytes,
                        struct shmb_error *err)
{
    struct statvfs vfs;
    struct stat st;
    uint64_t avail;

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
    if (statvfs(dir, &vfs) != 0) {
        int saved = errno;
        return shmb_error_set(err, -saved, "Cannot read free space of %s: %s.", dir,
                              strerror(saved));
    }
    avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    if (free_bytes != NULL)
        *free_bytes = avail;
    if (required > avail)
        return shmb_error_set(err, -ENOSPC,
                              "Insufficient space in %s: %llu MiB required, %llu MiB "
                              "free. Increase %s (e.g. --shm-size or --ipc=host), or "
                              "choose a smaller --size.",
                              dir, shmb_mib_rounded(required), shmb_mib_rounded(avail),
                              dir);
    return 0;
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

/* Open the read-only descriptor that read-only clients receive: a PROT_WRITE
 * mapping of it fails, whatever the client does. */
static int segment_open_readonly(struct segment *seg, struct shmb_error *err)
{
    struct stat a, b;
    int saved;

    seg->ro_fd = open(seg->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
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

/* Reserve every page of the file; vLLM's message on ENOSPC. */
static int segment_reserve(struct segment *seg, uint64_t size, uint64_t free_bytes,
                           struct shmb_error *err)
{
    int rc = posix_fallocate(seg->fd, 0, (off_t)size);

    if (rc == 0)
        return 0;
    if (rc == ENOSPC)
        return shmb_error_set(err, -ENOSPC,
                              "Insufficient space in %s: could not reserve %llu MiB "
                              "(%llu MiB were free before). Increase %s (e.g. "
                              "--shm-size or --ipc=host), or choose a smaller --size.",
                              seg->dir, shmb_mib_rounded(size),
                              shmb_mib_rounded(free_bytes), seg->dir);
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

int segment_create(struct segment *seg, const char *dir, const char *name, uint64_t size,
                   struct shmb_error *err)
{
    struct shmb_segment_header *hdr;
    uint64_t free_bytes = 0;
    int rc, saved, created = 0;

    memset(seg, 0, sizeof(*seg));
    seg->fd = seg->ro_fd = -1;
    if ((rc = segment_check_name(name, err)) < 0)
        return rc;
    if (size < SEGMENT_MIN_SIZE || size % SHMB_HEADER_PAGE != 0 ||
        size > (uint64_t)SSIZE_MAX)
        return shmb_error_set(err, -EINVAL,
                              "Segment size %llu bytes is not a whole number of pages "
                              "of at least %u bytes; choose another --size.",
                              (unsigned long long)size, SEGMENT_MIN_SIZE);
    if (strlen(dir) >= sizeof(seg->dir))
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Shared-memory directory path is too long.");
    if ((rc = segment_join_path(seg->path, sizeof(seg->path), dir, name, err)) < 0)
        return rc;
    snprintf(seg->dir, sizeof(seg->dir), "%s", dir);
    snprintf(seg->name, sizeof(seg->name), "%s", name);

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
    if (ftruncate(seg->fd, (off_t)size) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot size segment %s to %llu bytes: %s.",
                            seg->path, (unsigned long long)size, strerror(saved));
        goto fail;
    }
    /* Reserve every page now. Without this, tmpfs hands out pages on first
     * touch, and a client that touches one after /dev/shm filled up dies of
     * SIGBUS long after start-up succeeded. */
    if ((rc = segment_reserve(seg, size, free_bytes, err)) < 0 ||
        (rc = segment_map(seg, size, err)) < 0)
        goto fail;
    if ((rc = segment_open_readonly(seg, err)) < 0)
        goto fail;
    seg->hdr = hdr = seg->base;
    hdr->version = SHMB_LAYOUT_VERSION;
    hdr->header_size = SHMB_HEADER_PAGE;
    hdr->total_size = size;
    hdr->data_offset = SHMB_HEADER_PAGE;
    hdr->data_size = (size - SHMB_HEADER_PAGE) & ~(uint64_t)(SHMB_ALIGN - 1);
    hdr->owner_pid = getpid();
    hdr->owner_start = segment_process_start(getpid());
    hdr->created_unix = (uint64_t)time(NULL);
    hdr->ring_start = hdr->ring_end = hdr->ring_next_id = 0;
    /* The magic goes last: a header is valid only once it is complete. */
    __atomic_store_n(&hdr->magic, SHMB_SEGMENT_MAGIC, __ATOMIC_RELEASE);
    return 0;

fail:
    saved = rc;
    segment_close(seg);
    if (created)
        unlink(seg->path);
    return saved;
}

enum segment_owner segment_probe_existing(const char *dir, const char *name,
                                          int64_t *owner_pid)
{
    struct shmb_segment_header hdr;
    char path[PATH_MAX];
    ssize_t n;
    int fd;

    *owner_pid = 0;
    if (segment_join_path(path, sizeof(path), dir, name, NULL) < 0)
        return SEGMENT_ABSENT;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? SEGMENT_ABSENT : SEGMENT_FOREIGN;
    n = pread(fd, &hdr, sizeof(hdr), 0);
    close(fd);
    if (n != (ssize_t)sizeof(hdr) || hdr.magic != SHMB_SEGMENT_MAGIC)
        return SEGMENT_FOREIGN;
    *owner_pid = hdr.owner_pid;
    return segment_owner_alive(hdr.owner_pid, hdr.owner_start) ? SEGMENT_LIVE
                                                               : SEGMENT_ORPHANED;
}

void segment_close(struct segment *seg)
{
    if (seg->base != NULL)
        munmap(seg->base, (size_t)seg->size);
    seg->base = NULL;
    seg->hdr = NULL;
    if (seg->fd >= 0)
        close(seg->fd);
    if (seg->ro_fd >= 0)
        close(seg->ro_fd);
    seg->fd = seg->ro_fd = -1;
}

int segment_adopt(struct segment *seg, const char *dir, const char *name, uint64_t size,
                  struct shmb_error *err)
{
    struct shmb_segment_header hdr;
    struct stat st;
    int rc, saved;

    memset(seg, 0, sizeof(*seg));
    seg->fd = seg->ro_fd = -1;
    if ((rc = segment_check_name(name, err)) < 0)
        return rc;
    if (strlen(dir) >= sizeof(seg->dir))
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Shared-memory directory path is too long.");
    if ((rc = segment_join_path(seg->path, sizeof(seg->path), dir, name, err)) < 0)
        return rc;
    snprintf(seg->dir, sizeof(seg->dir), "%s", dir);
    snprintf(seg->name, sizeof(seg->name), "%s", name);
    seg->fd = open(seg->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (seg->fd < 0) {
        saved = errno;
        return shmb_error_set(err, -saved, "Cannot open segment %s: %s.", seg->path,
                              strerror(saved));
    }
    if (fstat(seg->fd, &st) != 0 ||
        pread(seg->fd, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr)) {
        rc =
            shmb_error_set(err, -EIO, "Cannot read the header of segment %s.", seg->path);
        goto fail;
    }
    if (hdr.magic != SHMB_SEGMENT_MAGIC || hdr.version != SHMB_LAYOUT_VERSION ||
        hdr.header_size != SHMB_HEADER_PAGE || hdr.data_offset != SHMB_HEADER_PAGE ||
        hdr.total_size != (uint64_t)st.st_size ||
        hdr.data_size !=
            ((hdr.total_size - SHMB_HEADER_PAGE) & ~(uint64_t)(SHMB_ALIGN - 1))) {
        rc = shmb_error_set(err, -EINVAL,
                            "Segment %s has an unknown or inconsistent header (layout "
                            "version %u); start with --fresh to discard it.",
                            seg->path, hdr.version);
        goto fail;
    }
    if (hdr.total_size != size) {
        rc = shmb_error_set(
            err, -EINVAL,
            "Segment %s left by the previous shmbrokerd is %llu bytes, not "
            "the %llu asked for: start with --size %llu to keep its objects, "
            "or with --fresh to discard them.",
            seg->path, (unsigned long long)hdr.total_size, (unsigned long long)size,
            (unsigned long long)hdr.total_size);
        goto fail;
    }
    if ((rc = segment_reserve(seg, size, 0, err)) < 0 ||
        (rc = segment_map(seg, size, err)) < 0 ||
        (rc = segment_open_readonly(seg, err)) < 0)
        goto fail;
    seg->hdr = seg->base;
    seg->hdr->owner_pid = getpid();
    seg->hdr->owner_start = segment_process_start(getpid());
    return 0;

fail:
    segment_close(seg);
    return rc;
}

void segment_destroy(struct segment *seg)
{
    if (seg->path[0] != '\0' && seg->fd >= 0)
        unlink(seg->path);
    segment_close(seg);
}
