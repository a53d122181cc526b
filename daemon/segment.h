// SPDX-License-Identifier: Apache-2.0
/*
 * The segment: one file in a shared-memory directory (/dev/shm or a hugetlbfs
 * mount) or an anonymous memfd, its free-space check, its reservation with
 * posix_fallocate and its header page. Knows nothing about objects, keys or
 * sockets.
 */
#ifndef SHMB_SEGMENT_H
#define SHMB_SEGMENT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../proto/error.h"
#include "../proto/layout.h"
#include "lock.h"
#include "space.h"

/* The smallest useful segment: the header page plus one page of data. */
#define SEGMENT_MIN_SIZE (2 * SHMB_HEADER_PAGE)

struct segment {
    int fd;                          /* read-write descriptor, -1 when closed */
    int ro_fd;                       /* read-only descriptor for read-only clients */
    void *base;                      /* the mapping, NULL when unmapped */
    uint64_t size;                   /* bytes in the file and the mapping */
    struct shmb_segment_header *hdr; /* == base; written, never trusted (see below) */
    /* The data area, from the file's size and the layout's constants. Clients
     * that map the segment read-write can change the header page at any time:
     * the daemon never reads these back from it. */
    uint64_t data_offset;
    uint64_t data_size;
    /* The catalog (layout version 2) at the end of the file: catalog_slots
     * entries at catalog_offset (0 slots: none; catalog_offset is then the
     * file's size), hashed with catalog_seed. Private, like the above. */
    uint64_t catalog_offset;
    uint64_t catalog_slots;
    uint32_t catalog_seed;
    /* segment_adopt: the gen_next the header page had (0 when it had no
     * valid header), a floor for the generations the adoption hands out. */
    uint32_t found_gen_next;
    /* A descriptor of the lock file "<dir>/.<name>.lock" (mode 0600, never
     * passed to a client), holding an exclusive flock on it for as long as
     * this daemon owns the segment: the proof, for a daemon starting later,
     * that this one is alive. Removed by segment_close while still held. */
    int lock_fd;
    /* segment_adopt: the size the file had when a client had shrunk or grown
     * it and it was set back to its size; 0 when it had its size. */
    uint64_t resized_from;
    uint64_t owner_start;  /* what the header page says, kept privately */
    uint64_t created_unix;
    char adopt_note[SHMB_ERROR_MSG_MAX]; /* what segment_adopt rebuilt, or "" */
    /* A memfd (segment_create_memfd): no file in any directory, so no lock
     * file and nothing to unlink; dir is "" and path "memfd:NAME". */
    bool memfd;
    char dir[PATH_MAX];
    char name[NAME_MAX + 1];
    char path[PATH_MAX];
};

/* Told between the chunks of a reservation (posix_fallocate of a segment or
 * a memfd, SEGMENT_RESERVE_CHUNK at a time): done of total bytes. A start
 * that reserves gigabytes takes seconds; this is how it shows progress. */
typedef void (*segment_progress_fn)(uint64_t done, uint64_t total, void *arg);

/* Bytes reserved between two progress calls. */
#define SEGMENT_RESERVE_CHUNK (256ULL << 20)

/* Set (fn NULL: clear) the progress callback of every later reservation. */
void segment_set_progress(segment_progress_fn fn, void *arg);

/* Check that name can be a file name in the shm directory. */
int segment_check_name(const char *name, struct shmb_error *err);

/* Round a requested size up to whole pages; 0 when the result would overflow. */
uint64_t segment_round_size(uint64_t size);

/* Round size up to a multiple of page; 0 when the result would overflow. */
uint64_t segment_round_to(uint64_t size, uint64_t page);

/* The catalog never takes more than this part of the file: it is an index,
 * the data area is what the segment is for. */
#define SEGMENT_CATALOG_SHARE 8
/* Fewer slots than this are not worth a catalog: readers then always ask. */
#define SEGMENT_CATALOG_MIN_SLOTS 64u
/* One catalog slot per this many bytes of segment when --max-objects is not
 * given: room for objects of 1.5 KiB at 3/4 load. */
#define SEGMENT_BYTES_PER_SLOT 2048u
/* How often the daemon writes the heartbeat into the header page. */
#define SEGMENT_HEARTBEAT_MS 1000u
/* The largest --max-objects: 2^32 slots of 32 bytes is 128 GiB of catalog. */
#define SEGMENT_MAX_OBJECTS (UINT64_C(3) << 30)

/* Where the parts of a segment go (layout version 2): the header page, the
 * data area, the catalog at the end of the file. */
struct segment_plan {
    uint64_t data_size;      /* bytes of the data area, from SHMB_HEADER_PAGE */
    uint64_t catalog_offset; /* page-aligned; size when there is no catalog */
    uint64_t catalog_slots;  /* a power of two, or 0 */
    uint64_t catalog_bytes;  /* slots * 32 rounded up to page, or 0 */
};

/* Plan a segment of size bytes (from segment_round_size, or whole pages of
 * page bytes on hugetlbfs): catalog_slots from max_objects (4/3 of it,
 * rounded up to a power of two) or, when 0, one per SEGMENT_BYTES_PER_SLOT,
 * at least SEGMENT_CATALOG_MIN_SLOTS; halved while the catalog would take
 * more than 1/SEGMENT_CATALOG_SHARE of the file, and 0 when not even the
 * minimum fits. page: the segment's page size (segment_page_size). */
void segment_plan(uint64_t size, uint64_t page, uint64_t max_objects,
                  struct segment_plan *out);

/* The data area of a segment of size bytes (segment_plan's data_size). */
uint64_t segment_data_size(uint64_t size, uint64_t page, uint64_t max_objects);

/* Create dir/name exclusively (mode 0600), size it, reserve every page with
 * posix_fallocate, map it and write the header (the catalog planned by
 * segment_plan with max_objects, its seed drawn at random). size must come from
 * segment_round_size (segment_round_to segment_page_size on hugetlbfs). On failure
 * nothing is left behind. -EEXIST when the file exists (see segment_probe_existing). */
int segment_create(struct segment *seg, const char *dir, const char *name, uint64_t size,
                   uint64_t max_objects, struct shmb_error *err);

/* The longest name memfd_create takes: the kernel prefixes it with "memfd:"
 * and the whole must fit in NAME_MAX. */
#define SEGMENT_MEMFD_NAME_MAX (NAME_MAX - 6)

/* A new memfd called name of size bytes: mode 0600, closed on exec, never
 * executable where the kernel can say so, every page reserved with
 * posix_fallocate, sealed against shrinking, growing and further seals. what
 * names it in messages ("memfd segment NAME"); smaller ends the message of
 * a reservation that failed ("choose a smaller size"). The descriptor (the
 * caller owns it), or a negative errno with err. */
int segment_memfd_make(const char *name, uint64_t size, const char *what,
                       const char *smaller, struct shmb_error *err);

/* Create an anonymous segment with memfd_create(name), size it, reserve every
 * page with posix_fallocate (charged to this process's memory cgroup: -ENOSPC
 * or -ENOMEM with the numbers when it does not fit), seal it against
 * shrinking and growing (no client can ftruncate it: EPERM), map it and write
 * the header as segment_create does. Its mode is 0600, so that a read-only
 * client cannot reopen its descriptor read-write through /proc; ro_fd is a
 * read-only reopening. Nothing is left behind on failure, nor once every
 * descriptor and mapping of it is gone. size as for segment_create. */
int segment_create_memfd(struct segment *seg, const char *name, uint64_t size,
                         uint64_t max_objects, struct shmb_error *err);

/* 0 when fd can be adopted as memfd segment name of size bytes: a memfd
 * open read-write, sealed against shrinking and growing and not against
 * writes, of that size; -EINVAL with a message saying what it is not. */
int segment_check_memfd(int fd, const char *name, uint64_t size, struct shmb_error *err);

/* Adopt the memfd fd (this call owns it from now on, closed on failure)
 * that an earlier daemon made with segment_create_memfd(name, size) and
 * systemd kept in its file-descriptor store across the restart: checked
 * (a memfd sealed against shrinking and growing, of size bytes: -EINVAL
 * otherwise), its pages reserved again, mapped, its header page rewritten
 * as segment_adopt does; the ring cursor is left for the store. */
int segment_adopt_memfd(struct segment *seg, int fd, const char *name, uint64_t size,
                        uint64_t max_objects, struct shmb_error *err);

/* True when process pid has a descriptor of a memfd made with name (a link
 * "/memfd:NAME (deleted)" in /proc/PID/fd): a daemon whose segment is that
 * memfd still holds it. */
bool segment_memfd_held_by(const char *name, pid_t pid);

/* Open dir/name left by a daemon that is gone, check the file against size
 * (from segment_round_size), take its lock (-EBUSY when a live daemon holds
 * it) and re-reserve its pages. The header page is only a hint: it is
 * checked against the file, rewritten whole from the file's size and the
 * layout's constants (adopt_note says what was wrong with it, if anything),
 * and the header's owner becomes this process; the ring cursor is left for
 * the store to read and check. Refuses what segment_check_adoptable refuses;
 * a file a client shrank or grew is set back to size (resized_from). */
int segment_adopt(struct segment *seg, const char *dir, const char *name, uint64_t size,
                  uint64_t max_objects, struct shmb_error *err);

/* The checks segment_adopt makes before it changes anything, without
 * opening the file for writing: a regular file (a FIFO or a symbolic link is
 * refused, never waited on) owned by this user, mode 0600, one link
 * (-EPERM otherwise), not of layout version 1 (-EPROTO with the fix: this
 * daemon writes layout 2 and never adopts an older one), of size bytes (0), or whose header page records size
 * though the file is not that size (1: a client shrank or grew it;
 * segment_adopt sets it back to size). -EINVAL with a --size hint otherwise. */
int segment_check_adoptable(const char *dir, const char *name, uint64_t size,
                            struct shmb_error *err);

/* The file at dir/name, opened without following links or blocking: 0 when
 * it is a regular file segment_check_owner accepts, -ENOENT when there is
 * none, -errno with a message otherwise. */
int segment_check_existing(const char *dir, const char *name, struct shmb_error *err);

/* What an existing segment file holds, for deciding whether it may go. */
enum segment_owner {
    SEGMENT_ABSENT,   /* no file */
    SEGMENT_FOREIGN,  /* no shmbroker magic (or unreadable, or not a regular file) */
    SEGMENT_ORPHANED, /* a shmbroker segment that no live daemon holds locked */
    SEGMENT_LIVE,     /* a file a live process holds locked (a running daemon) */
};

/* Look at dir/name without changing it; *owner_pid gets the owner recorded
 * in the header, for messages only (0 when the header is unreadable). A
 * daemon is alive when it holds the file's lock, whatever the header says. */
enum segment_owner segment_probe_existing(const char *dir, const char *name,
                                          int64_t *owner_pid);

/* Mark the segment file open on fd given up (proto/layout.h, retired)
 * before it is removed or dropped, for the clients that still map it: a
 * pwrite, so that a file a client shrank cannot fault (on hugetlbfs, which
 * has no write(), a store under the guard through a mapping of its first
 * page). Anything but a regular file (a memfd is one) of at least a header
 * page is left alone.
 * 0 or -errno; failing only costs those clients a later notice (their
 * connection's end), so callers go on. */
int segment_retire_fd(int fd);

/* segment_retire_fd of the file at path (not followed if a link). */
int segment_retire_path(const char *path);

/* Remove dir/name when it is a shmbroker segment that no running daemon
 * holds (one a daemon left with --keep-segment, or a crash), or, when
 * may_be_damaged (a pool the settings name, not a line of a record anyone
 * could have written), a file a start would adopt as one whose header a
 * client damaged (exactly size bytes, from segment_round_size): 1 and its
 * size in *bytes when removed, 0 when there is none; -EBUSY while a daemon
 * holds it, -EEXIST for a file that is not a segment (left alone), with a
 * message. The lock is held while the file goes, so that no daemon adopts
 * it then. */
int segment_remove_orphaned(const char *dir, const char *name, uint64_t size,
                            bool may_be_damaged, uint64_t *bytes, int64_t *owner_pid,
                            struct shmb_error *err);

/* Make the segment fit to hand to a new client: -EIO saying so when a
 * client truncated the file (nothing could map it); else write the header
 * page again from private values (magic, layout version, sizes, data offset,
 * owner, the catalog's offset, slots and seed; not the ring cursor nor the
 * words the catalog keeps) through segment_store, undoing whatever a
 * read-write client wrote there. -EIO with a message when the page is gone. */
int segment_restore_header(const struct segment *seg, struct shmb_error *err);

/* Stop guarding it (segment_guard_unwatch), unmap and close without removing
 * the file. */
void segment_close(struct segment *seg);

/* Unlink the file (a memfd has none), unmap and close (segment_close). */
void segment_destroy(struct segment *seg);

/* The first byte of the data area. */
static inline void *segment_data(const struct segment *seg)
{
    return (char *)seg->base + seg->data_offset;
}

/* The steps of making and adopting a segment that its memfd backing
 * (memfd.c) takes as a file's do; each is described where it is defined. */
int segment_check_size(uint64_t size, struct shmb_error *err);
int segment_fallocate(int fd, uint64_t size);
int segment_reserve(struct segment *seg, uint64_t size, uint64_t free_bytes,
                    struct shmb_error *err);
int segment_map(struct segment *seg, uint64_t size, struct shmb_error *err);
void segment_lay_out(struct segment *seg, uint64_t page, uint64_t max_objects);
int segment_write_header(struct segment *seg, uint64_t created_unix);
bool segment_is_layout1(const struct shmb_segment_header *hdr, uint64_t size);
void segment_keep_layout(struct segment *seg, const struct shmb_segment_header *hdr,
                         uint64_t page);
void segment_note_header(struct segment *seg, const struct shmb_segment_header *hdr);

/*
 * The guard against a client that breaks a segment under the daemon. Every
 * client gets a read-write descriptor of the segment; with it, one can
 * ftruncate() the file (not a sealed memfd) or punch a hole in it (fallocate
 * PUNCH_HOLE), after which a write by the daemon into the lost pages is a
 * SIGBUS. The guard watches each registered segment (segment_guard_check,
 * before each allocation: one fstat) and catches the SIGBUS of the daemon's
 * own copies (segment_store, segment_load), so that the daemon refuses
 * allocations in that segment with EIO instead of dying. Segments are told
 * apart by the address range of their mapping: a fault, or a check, names an
 * address and concerns only the segment whose mapping holds it.
 */

/* Segments watched at once: a daemon's pools (CONFIG_MAX_POOLS) and room for
 * as many again while a reload replaces them. */
#define SEGMENT_GUARD_MAX 32

/* Install the SIGBUS handler (the first time) and watch seg: its size and the
 * blocks reserved for it now. Watching a segment again (or one mapped where a
 * forgotten one was) starts afresh. on_broken, when not NULL, is called once
 * with the message when the segment is found broken (for the log). -ENOSPC
 * with a message when SEGMENT_GUARD_MAX segments are watched already. */
int segment_guard_watch(const struct segment *seg, void (*on_broken)(const char *message),
                        struct shmb_error *err);

/* Stop watching seg (segment_close does it); nothing when it is not watched. */
void segment_guard_unwatch(const struct segment *seg);

/* 0 while the watched segment whose mapping holds addr still has every byte
 * and page it had; -EIO with a message naming the cause and the fix once it
 * has not (for good: the daemon never writes into it again). 0 when no
 * watched segment holds addr. */
int segment_guard_check(const void *addr, struct shmb_error *err);

/* Copy len bytes into the segment at dst. -EIO (and the guard reports the
 * segment holding the faulting address broken) when the write faulted: the
 * page is gone. */
int segment_store(void *dst, const void *src, size_t len);

/* Copy len bytes out of the segment at src into private memory at dst: the
 * daemon's reads of the mapping while a client may shrink the file (the
 * adoption walk). -EIO (and the guard reports the segment holding the
 * faulting address broken) when the read faulted: the page is gone. */
int segment_load(void *dst, const void *src, size_t len);

/* Atomic accesses to one word of the segment (a chunk's seal, the catalog's
 * words), under the guard as segment_store: -EIO when the page is gone (a
 * client truncated the file or punched a hole in it). Loads acquire, stores
 * release, exchange and compare-and-swap both.
 *   segment_atomic_load64:     *out = *addr
 *   segment_atomic_store64:    *addr = value
 *   segment_atomic_exchange64: *old = *addr, *addr = value
 *   segment_atomic_cas64:      when *addr == *expected, *addr = desired and 0;
 *                              else *expected = *addr and -EAGAIN */
int segment_atomic_load64(const uint64_t *addr, uint64_t *out);
int segment_atomic_store64(uint64_t *addr, uint64_t value);
int segment_atomic_exchange64(uint64_t *addr, uint64_t value, uint64_t *old);
int segment_atomic_cas64(uint64_t *addr, uint64_t *expected, uint64_t desired);
/* A 32-bit release store, for the catalog's 32-bit words. */
int segment_atomic_store32(uint32_t *addr, uint32_t value);

#endif
