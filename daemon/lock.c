// SPDX-License-Identifier: Apache-2.0
/*
 * The liveness lock: an exclusive flock on "<dir>/.<name>.lock" beside the
 * segment, held by the daemon serving it; who holds it (/proc/locks) and
 * when that process started; opening a path without following links and
 * refusing a file another user could change. Knows nothing of the segment's
 * content.
 */
#include "lock.h"

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
uint64_t segment_process_start(pid_t pid)
{
    uint64_t start = 0;
    char state;

    return segment_process_stat(pid, &state, &start) ? start : 0;
}

/* The liveness lock's file: "<dir>/.<name>.lock", beside the segment. No
 * client ever gets a descriptor of it (the segment's own inode would not do:
 * every client holds a descriptor of that one and could flock it). */
int segment_lock_path(char *out, size_t len, const char *dir, const char *name)
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
int segment_open_existing(const char *path, int flags, struct stat *st,
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
int segment_lock(const char *dir, const char *name, bool create, int *lock_fd,
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
