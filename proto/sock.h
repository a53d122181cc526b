// SPDX-License-Identifier: Apache-2.0
/*
 * Unix-domain socket plumbing that the daemon and the library share: the
 * address of a socket path, and the one message that carries a descriptor
 * (the segment's, with the hello reply). Knows nothing about JSON, the
 * protocol's messages or libuv.
 */
#ifndef SHMB_PROTO_SOCK_H
#define SHMB_PROTO_SOCK_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/un.h>

/* Fill *sun (zeroed first) with AF_UNIX and path. 0, or -ENAMETOOLONG when
 * path (with its NUL) does not fit sun_path (108 bytes on Linux); the caller
 * words the message, which names its own flag or call. */
int shmb_sock_address(struct sockaddr_un *sun, const char *path);

/* One sendmsg of buf[0..len) carrying fd as SCM_RIGHTS, without blocking and
 * without SIGPIPE (MSG_NOSIGNAL | MSG_DONTWAIT), retried on EINTR. Returns
 * the bytes sent (the descriptor travelled with the first of them; the caller
 * sends any rest the ordinary way), or -errno: -EAGAIN when the socket has no
 * room now. len must be at least 1: a descriptor needs a byte to ride on. */
ssize_t shmb_sock_send_fd(int sock, const void *buf, size_t len, int fd);

/* One recvmsg into buf[0..len), retried on EINTR, taking descriptors with
 * MSG_CMSG_CLOEXEC: the first one received goes into *fd when *fd is -1;
 * every other one (a second descriptor, one more in a later message) is
 * closed, so that a confused or hostile peer cannot leak descriptors into the
 * process. Returns the bytes received (0: the peer closed), or -errno. */
ssize_t shmb_sock_recv_fd(int sock, void *buf, size_t len, int *fd);

#endif
