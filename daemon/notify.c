// SPDX-License-Identifier: Apache-2.0
/*
 * systemd's notify protocol in a few dozen lines.
 */
#include "notify.h"

#include "../proto/error.h"
#include "../proto/sock.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static struct sockaddr_un notify_addr;
static socklen_t notify_len;
static uint64_t watchdog_usec;

bool notify_init(void)
{
    const char *path = getenv("NOTIFY_SOCKET");
    const char *usec = getenv("WATCHDOG_USEC"), *wpid = getenv("WATCHDOG_PID");
    size_t len;

    notify_len = 0;
    watchdog_usec = 0;
    if (usec != NULL && (wpid == NULL || strtol(wpid, NULL, 10) == (long)getpid()))
        watchdog_usec = strtoull(usec, NULL, 10);
    if (path == NULL || (path[0] != '/' && path[0] != '@'))
        return false;
    len = strlen(path);
    if (len >= sizeof(notify_addr.sun_path))
        return false;
    memset(&notify_addr, 0, sizeof(notify_addr));
    notify_addr.sun_family = AF_UNIX;
    memcpy(notify_addr.sun_path, path, len);
    /* An abstract address starts with a NUL and is exactly len bytes long. */
    if (path[0] == '@')
        notify_addr.sun_path[0] = '\0';
    notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                             (path[0] == '/' ? 1 : 0));
    return true;
}

/* One datagram of msg, with fd attached when it is not -1. */
static int notify_datagram(const char *msg, int fd)
{
    ssize_t n;
    int sock, saved;

    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -errno;
    if (connect(sock, (struct sockaddr *)&notify_addr, notify_len) != 0)
        n = -errno;
    else if (fd >= 0)
        n = shmb_sock_send_fd(sock, msg, strlen(msg), fd);
    else
        n = send(sock, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 ? -errno : 0;
    saved = n < 0 ? (int)-n : 0;
    close(sock);
    return -saved;
}

int notify_send(const char *fmt, ...)
{
    char msg[SHMB_ERROR_MSG_MAX + 128]; /* a start-up error's STATUS= whole */
    va_list ap;

    if (notify_len == 0)
        return 0;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return notify_datagram(msg, -1);
}

int notify_store_fd(int fd, const char *name)
{
    char msg[128];

    if (notify_len == 0)
        return 0;
    snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
    return notify_datagram(msg, fd);
}

int notify_unstore_fd(const char *name)
{
    char msg[128];

    if (notify_len == 0)
        return 0;
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
    return notify_datagram(msg, -1);
}

uint64_t notify_watchdog_usec(void)
{
    return watchdog_usec;
}
