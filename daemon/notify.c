/*
 * systemd's notify protocol in a few dozen lines.
 */
#include "notify.h"

#include "../proto/error.h"

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
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = strlen(msg)};
    struct msghdr mh = {
        .msg_name = &notify_addr,
        .msg_namelen = notify_len,
        .msg_iov = &iov,
        .msg_iovlen = 1,
    };
    ssize_t n;
    int sock, saved;

    if (fd >= 0) {
        struct cmsghdr *cm;

        memset(&control, 0, sizeof(control));
        mh.msg_control = control.buf;
        mh.msg_controllen = sizeof(control.buf);
        cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    }
    sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -errno;
    n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    saved = errno;
    close(sock);
    return n < 0 ? -saved : 0;
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
