// SPDX-License-Identifier: Apache-2.0
/*
 * The guard against clients that break the segment's file: a SIGBUS handler
 * that turns a fault into -EIO for the copy or the atomic access that met it,
 * and the checks that a watched file still has every byte and block it had.
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

/* After a guarded access jumped out on SIGBUS: break the segment holding
 * the faulting address (mapped's when the kernel gave none), saying why. */
static void segment_guard_faulted(const void *mapped, const char *why)
{
    struct segment_guard_entry *g = segment_guard_find(segment_guard_fault);

    if (g == NULL)
        g = segment_guard_find(mapped);
    if (g != NULL)
        segment_guard_break(g, why);
}

/* Copy len bytes between the segment (at mapped) and private memory under
 * the guard: a SIGBUS on a page the file no longer has ends the copy with
 * -EIO and marks the segment holding the faulting address broken (mapped's
 * when the kernel gave none), naming what (a read or a write) hit it. */
static int segment_guarded_copy(void *dst, const void *src, size_t len,
                                const void *mapped, const char *what)
{
    sigjmp_buf jump;
    char why[160];

    if (segment_guard_install(false) < 0)
        return -EIO;
    if (sigsetjmp(jump, 0) != 0) {
        snprintf(why, sizeof(why),
                 "a %s it hit a page the file no longer has (SIGBUS): it was truncated "
                 "or a hole was punched in it",
                 what);
        segment_guard_faulted(mapped, why);
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
    sigjmp_buf jump;
    bool done = true;

    if (segment_guard_install(false) < 0)
        return -EIO;
    if (sigsetjmp(jump, 0) != 0) {
        segment_guard_faulted(addr, "an atomic access hit a page the file no longer has "
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
