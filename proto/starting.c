// SPDX-License-Identifier: Apache-2.0
/*
 * The starting daemon's progress file (starting.h): written whole, read
 * bounded, judged stale by its pid and its age.
 */
#include "starting.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "text.h"

int shmb_starting_path(const char *socket_path, char *out, size_t len)
{
    int n = snprintf(out, len, "%s" SHMB_STARTING_SUFFIX, socket_path);

    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int shmb_starting_write(const char *path, long long pid, const char *text)
{
    char tmp[4096 + 8], buf[SHMB_STARTING_TEXT_MAX + 32];
    int fd, n, saved = 0;

    if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
        return -ENAMETOOLONG;
    n = snprintf(buf, sizeof(buf), "%lld\n%.*s\n", pid, SHMB_STARTING_TEXT_MAX, text);
    if (n < 0 || (size_t)n >= sizeof(buf))
        n = (int)sizeof(buf) - 1;
    (void)unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -errno;
    if (fchmod(fd, 0644) != 0 || write(fd, buf, (size_t)n) != n)
        saved = errno != 0 ? errno : EIO;
    if (close(fd) != 0 && saved == 0)
        saved = errno;
    if (saved == 0 && rename(tmp, path) != 0)
        saved = errno;
    if (saved != 0)
        (void)unlink(tmp);
    return -saved;
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
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    n = read(fd, buf, sizeof(buf) - 1);
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
    /* Its daemon is alive when this process sees it; one this process
     * cannot see (ESRCH: gone, or in another pid namespace) counts while the
     * file is recent. */
    if (kill((pid_t)p, 0) != 0 && errno != EPERM &&
        (errno != ESRCH || time(NULL) - st.st_mtime > SHMB_STARTING_FRESH_S))
        return 0;
    *pid = p;
    shmb_escape(end, strlen(end), text, len);
    return 1;
}
