// SPDX-License-Identifier: Apache-2.0
/*
 * The starting daemon's progress file (starting.h): written in place under
 * the daemon's flock, read bounded, believed only while locked.
 */
#include "starting.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "text.h"

int shmb_starting_path(const char *socket_path, char *out, size_t len)
{
    int n = snprintf(out, len, "%s" SHMB_STARTING_SUFFIX, socket_path);

    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int shmb_starting_open(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644), saved;
    struct stat st;

    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) != 0) {
        saved = errno;
        close(fd);
        return -saved;
    }
    /* Only a file of this user's with no other name is taken over: beside
     * a socket in a directory others may write (/tmp), a hard link planted
     * there would have the progress written over the file it names. */
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_nlink != 1) {
        close(fd);
        return -EPERM;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fchmod(fd, 0644) != 0) {
        saved = errno;
        close(fd);
        return -saved;
    }
    return fd;
}

int shmb_starting_update(int fd, long long pid, const char *text)
{
    char buf[SHMB_STARTING_TEXT_MAX + 32];
    int n = snprintf(buf, sizeof(buf), "%lld\n%.*s\n", pid, SHMB_STARTING_TEXT_MAX, text);

    if (n < 0 || (size_t)n >= sizeof(buf))
        return -EINVAL;
    if (pwrite(fd, buf, (size_t)n, 0) != n || ftruncate(fd, n) != 0)
        return errno != 0 ? -errno : -EIO;
    return 0;
}

/* Whether uid, the owner of the progress file at path, may speak for the
 * daemon: this user, root, or the owner of the directory it is in (the
 * run directory the daemon's user was given). */
static bool shmb_starting_trusted(const char *path, uid_t uid)
{
    char dir[4096 + 16];
    struct stat st;
    char *slash;

    if (uid == geteuid() || uid == 0)
        return true;
    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    return stat(dir, &st) == 0 && st.st_uid == uid;
}

int shmb_starting_read(const char *socket_path, long long *pid, char *text, size_t len)
{
    char path[4096 + 16], buf[SHMB_STARTING_TEXT_MAX + 64], *nl, *end;
    struct stat st;
    ssize_t n;
    long long p;
    int fd;

    if (shmb_starting_path(socket_path, path, sizeof(path)) < 0)
        return 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return 0;
    /* Unlocked: no daemon is starting there (one was killed at it). One
     * others may write, or of a user who is not this one, root or the
     * directory's owner, anyone could have planted (in /tmp) and hold. */
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 022) != 0 ||
        !shmb_starting_trusted(path, st.st_uid) || flock(fd, LOCK_SH | LOCK_NB) == 0 ||
        errno != EWOULDBLOCK) {
        close(fd);
        return 0;
    }
    n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    errno = 0;
    p = strtoll(buf, &end, 10);
    if (errno != 0 || end == buf || *end != '\n' || p <= 0 || p > 4194304)
        return 0;
    end++;
    if ((nl = strchr(end, '\n')) == NULL)
        return 0;
    *nl = '\0';
    *pid = p;
    shmb_escape(end, strlen(end), text, len);
    return 1;
}
