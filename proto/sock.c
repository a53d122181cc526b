// SPDX-License-Identifier: Apache-2.0
/*
 * Unix-domain socket plumbing shared by the daemon and the library: socket
 * addresses and descriptor passing (SCM_RIGHTS).
 */
#include "sock.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Descriptors one receive takes at most: one is expected, the others are
 * closed; the kernel discards whatever does not fit. */
#define SOCK_RECV_FDS 4

int shmb_sock_address(struct sockaddr_un *sun, const char *path)
{
    size_t len = strlen(path);

    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    if (len >= sizeof(sun->sun_path))
        return -ENAMETOOLONG;
    memcpy(sun->sun_path, path, len + 1);
    return 0;
}

ssize_t shmb_sock_send_fd(int sock, const void *buf, size_t len, int fd)
{
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {(void *)buf, len};
    struct msghdr msg;
    struct cmsghdr *cmsg;
    ssize_t n;

    memset(&msg, 0, sizeof(msg));
    memset(&control, 0, sizeof(control));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

/* Keep the first descriptor that arrived as SCM_RIGHTS in *fd (when it is
 * -1); close every other. */
static void sock_take_fds(struct msghdr *msg, int *fd)
{
    struct cmsghdr *cmsg;

    for (cmsg = CMSG_FIRSTHDR(msg); cmsg != NULL; cmsg = CMSG_NXTHDR(msg, cmsg)) {
        size_t i, n;

        if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
            continue;
        n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < n; i++) {
            int got;

            memcpy(&got, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
            if (*fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
}

ssize_t shmb_sock_recv_fd(int sock, void *buf, size_t len, int *fd)
{
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(SOCK_RECV_FDS * sizeof(int))];
    } control;
    struct iovec iov = {buf, len};
    struct msghdr msg;
    ssize_t n;

    do {
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    sock_take_fds(&msg, fd);
    return n;
}
