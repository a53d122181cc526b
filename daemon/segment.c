// SPDX-License-Identifier: Apache-2.0
/*
 * The segment file: its layout, exclusive creation, reservation of every page
 * at start-up (so a full tmpfs fails here, not as a client's SIGBUS later),
 * mapping, the header page, and adoption of a file a daemon left. The room a
 * directory has is space.c's, the liveness lock lock.c's, the memfd backing
 * memfd.c's, files that are not ours orphan.c's, the SIGBUS guard guard.c's.
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
void segment_lay_out(struct segment *seg, uint64_t page, uint64_t max_objects)
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
void segment_keep_layout(struct segment *seg, const struct shmb_segment_header *hdr,
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
int segment_fallocate(int fd, uint64_t size)
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
int segment_reserve(struct segment *seg, uint64_t size, uint64_t free_bytes,
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
int segment_map(struct segment *seg, uint64_t size, struct shmb_error *err)
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
int segment_write_header(struct segment *seg, uint64_t created_unix)
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
int segment_check_size(uint64_t size, struct shmb_error *err)
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
bool segment_is_layout1(const struct shmb_segment_header *hdr, uint64_t size)
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
void segment_note_header(struct segment *seg, const struct shmb_segment_header *hdr)
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
