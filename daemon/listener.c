// SPDX-License-Identifier: Apache-2.0
/*
 * Whose is the socket listening at a path: the listener the kernel's
 * sock_diag shows bound to the file (or, without it, those /proc/net/unix
 * names), and whether a process holds it among its descriptors. --reload's
 * proof that a pid is the daemon its settings name. Reads only; never
 * binds, accepts or connects but to ask a listener's credentials.
 */
#include "listener.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

#include "../proto/alloc.h"
#include "../proto/sock.h"

/* Listeners one socket name may have before server_listener_held_by stops
 * listing them: more than one is already settled by a connection. */
#define SERVER_LISTENERS_MAX 16
/* /proc/net/unix's flag of a listening socket (__SO_ACCEPTCON). */
#define SERVER_PROC_ACCEPTCON 0x10000ul

/* The inodes of the stream sockets listening under path, from
 * /proc/net/unix, into ino (up to SERVER_LISTENERS_MAX): how many there
 * are, or -errno with err set. */
static int server_listeners(const char *path, unsigned long *ino, struct shmb_error *err)
{
    char line[512];
    int n = 0, saved;
    FILE *f = fopen("/proc/net/unix", "re");

    if (f == NULL) {
        saved = errno;
        return shmb_error_set(
            err, -saved,
            "Cannot read /proc/net/unix to find the socket that listens "
            "on %s: %s. Mount /proc, or send SIGHUP to shmbrokerd "
            "yourself.",
            path, strerror(saved));
    }
    /* "Num: RefCount Protocol Flags Type St Inode Path" */
    while (fgets(line, sizeof(line), f) != NULL) {
        unsigned long flags, inode;
        unsigned type, st;
        int at = 0;
        char *name;

        if (sscanf(line, "%*s %*s %*s %lx %x %x %lu %n", &flags, &type, &st, &inode,
                   &at) != 4 ||
            at == 0)
            continue;
        name = line + at;
        name[strcspn(name, "\n")] = '\0';
        if ((flags & SERVER_PROC_ACCEPTCON) == 0 || type != SOCK_STREAM ||
            strcmp(name, path) != 0)
            continue;
        if (n < SERVER_LISTENERS_MAX)
            ino[n] = inode;
        n++;
    }
    fclose(f);
    return n;
}

/* Whether pid has a descriptor of one of the n sockets ino: 1, 0, or
 * -errno with err set. */
static int server_holds_socket(pid_t pid, const unsigned long *ino, int n,
                               struct shmb_error *err)
{
    char dir[64], link[64], want[64];
    struct dirent *e;
    int found = 0, i, saved;
    ssize_t len;
    DIR *d;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    if ((d = opendir(dir)) == NULL) {
        saved = errno;
        if (saved == ENOENT)
            return shmb_error_set(err, -ESRCH, "Process %d is gone.", (int)pid);
        return shmb_error_set(
            err, -saved,
            "Cannot look at the descriptors of process %d (%s): %s. Run "
            "--reload as the daemon's user or as root.",
            (int)pid, dir, strerror(saved));
    }
    while (!found && (e = readdir(d)) != NULL) {
        if ((len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1)) < 0)
            continue;
        link[len] = '\0';
        for (i = 0; i < n && !found; i++) {
            snprintf(want, sizeof(want), "socket:[%lu]", ino[i]);
            found = strcmp(link, want) == 0;
        }
    }
    closedir(d);
    return found;
}

/* The pid of the process that made the socket listening at path, as a
 * connection's SO_PEERCRED names it; -errno when it cannot be had. The
 * connection is closed at once (the daemon logs a client that left). */
static pid_t server_listener_pid(const char *path)
{
    struct sockaddr_un sun;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    pid_t pid;
    int fd;

    if (shmb_sock_address(&sun, path) < 0)
        return -ENAMETOOLONG;
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        pid = -errno;
    else
        pid = cred.pid;
    close(fd);
    return pid;
}

/* server_listener_held_by from /proc/net/unix, for a kernel without the
 * Unix sockets' sock_diag: listeners found by the name they were bound to,
 * which a socket of another mount namespace may share (and a socket's
 * abstract name may forge, since the file prints names as they are), so that
 * more than one goes to a connection's proof. */
static int server_listener_held_by_name(const char *path, pid_t pid, struct shmb_error *err)
{
    unsigned long ino[SERVER_LISTENERS_MAX];
    int n, rc;
    pid_t maker;

    if ((n = server_listeners(path, ino, err)) < 0)
        return n;
    if (n == 0) {
        shmb_error_set(err, 0, "no socket listens on %s", path);
        return 0;
    }
    /* More listeners than are listed: only the connection can tell. */
    if (n <= SERVER_LISTENERS_MAX && (rc = server_holds_socket(pid, ino, n, err)) <= 0) {
        if (rc == 0)
            shmb_error_set(err, 0, "it does not listen on %s", path);
        return rc;
    }
    if (n == 1)
        return 1;
    /* Several listeners carry the name: is pid's the one path leads to
     * here? A daemon that made its socket itself is named by the
     * connection; under socket activation systemd made it, and which one
     * pid holds cannot be told. */
    if ((maker = server_listener_pid(path)) == pid)
        return 1;
    if (maker > 0)
        return shmb_error_set(
            err, -ENOTUNIQ,
            "%d listening sockets are named %s (processes in other mount "
            "namespaces), and the one that path leads to here was made "
            "by process %d, not %d. Send SIGHUP to shmbrokerd yourself.",
            n, path, (int)maker, (int)pid);
    return shmb_error_set(err, -ENOTUNIQ,
                          "%d listening sockets are named %s (processes in other mount "
                          "namespaces), and a connection to that path failed: %s. Send "
                          "SIGHUP to shmbrokerd yourself.",
                          n, path, strerror((int)-maker));
}

/* sock_diag's state of a listening socket (TCP_LISTEN, which Unix sockets
 * share), and its bit in a request's states. */
#define SERVER_DIAG_STATE_LISTEN 10
#define SERVER_DIAG_LISTEN (1u << SERVER_DIAG_STATE_LISTEN)
/* The dump's buffer: the kernel fills at most 32 KiB per message. */
#define SERVER_DIAG_BUF (64 * 1024)

/* The inodes of the stream sockets listening on the file path leads to
 * here, from the kernel's table of Unix sockets (sock_diag), each with the
 * device and inode of the file it was bound to, matched against
 * stat(path): neither a socket of another mount namespace bound under the
 * same name nor a name printed to look like it can match, and under
 * socket activation the file is the one systemd bound. How many (up to
 * SERVER_LISTENERS_MAX kept in ino), or -errno with err set; -ENOSYS when
 * the kernel has no sock_diag for Unix sockets. */
static int server_listeners_at(const char *path, unsigned long *ino, struct shmb_error *err)
{
    struct {
        struct nlmsghdr nlh;
        struct unix_diag_req req;
    } ask = {
        .nlh = {.nlmsg_len = sizeof(ask),
                .nlmsg_type = SOCK_DIAG_BY_FAMILY,
                .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
                .nlmsg_seq = 1},
        .req = {.sdiag_family = AF_UNIX,
                .udiag_states = SERVER_DIAG_LISTEN,
                .udiag_show = UDIAG_SHOW_VFS},
    };
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    struct stat st;
    char *buf = NULL;
    int fd = -1, n = 0, rc = 0, saved;
    bool done = false;

    if (stat(path, &st) != 0) {
        saved = errno;
        if (saved == ENOENT || saved == ENOTDIR)
            return 0;
        return shmb_error_set(err, -saved, "Cannot look at %s: %s.", path, strerror(saved));
    }
    if (!S_ISSOCK(st.st_mode))
        return 0;
    if ((buf = shmb_malloc(SERVER_DIAG_BUF)) == NULL)
        return shmb_error_set(err, -ENOMEM, "Out of memory for the list of sockets.");
    /* No netlink here (a kernel without it, a sandbox that forbids it:
     * RestrictAddressFamilies=, seccomp, an LSM): -ENOSYS, whatever the
     * reason, so that the caller falls back to names. */
    fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0 ||
        sendto(fd, &ask, sizeof(ask), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0) {
        saved = errno;
        rc = shmb_error_set(err, -ENOSYS, "Cannot ask the kernel for its Unix sockets: %s.",
                            strerror(saved));
        goto out;
    }
    while (!done) {
        ssize_t got = recv(fd, buf, SERVER_DIAG_BUF, 0);
        const struct nlmsghdr *h = (const struct nlmsghdr *)(const void *)buf;
        int len = (int)got;

        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            saved = got < 0 ? errno : EPROTO;
            rc = shmb_error_set(err, -saved,
                                "Cannot read the kernel's list of Unix sockets: %s.",
                                strerror(saved));
            goto out;
        }
        for (; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
            const struct unix_diag_msg *m = NLMSG_DATA(h);
            const struct rtattr *a;
            int left;

            if (h->nlmsg_seq != ask.nlh.nlmsg_seq)
                continue;
            if (h->nlmsg_type == NLMSG_DONE) {
                done = true;
                break;
            }
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);

                saved = h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error < 0 ? -e->error
                                                                                  : EPROTO;
                /* No unix_diag in this kernel (ENOENT: nor a module to load),
                 * or a policy that refuses it: fall back as well. */
                rc = shmb_error_set(err, -ENOSYS,
                                    "The kernel did not list its Unix sockets: %s.",
                                    strerror(saved));
                goto out;
            }
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
                h->nlmsg_len < NLMSG_LENGTH(sizeof(*m)) || m->udiag_type != SOCK_STREAM ||
                m->udiag_state != SERVER_DIAG_STATE_LISTEN)
                continue;
            left = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
            for (a = (const struct rtattr *)(const void *)(m + 1); RTA_OK(a, left);
                 a = RTA_NEXT(a, left)) {
                const struct unix_diag_vfs *v = RTA_DATA(a);

                /* The kernel's device number: major in the top 12 bits. */
                if (a->rta_type != UNIX_DIAG_VFS || RTA_PAYLOAD(a) < sizeof(*v) ||
                    v->udiag_vfs_ino != (uint32_t)st.st_ino ||
                    v->udiag_vfs_dev >> 20 != major(st.st_dev) ||
                    (v->udiag_vfs_dev & 0xfffffu) != minor(st.st_dev))
                    continue;
                if (n < SERVER_LISTENERS_MAX)
                    ino[n] = m->udiag_ino;
                n++;
            }
        }
    }
    rc = n;
out:
    if (fd >= 0)
        close(fd);
    shmb_free(buf);
    return rc;
}

int server_listener_held_by(const char *path, pid_t pid, struct shmb_error *err)
{
    unsigned long ino[SERVER_LISTENERS_MAX];
    int n, rc;

    if ((n = server_listeners_at(path, ino, err)) == -ENOSYS)
        return server_listener_held_by_name(path, pid, err);
    if (n < 0)
        return n;
    if (n == 0) {
        shmb_error_set(err, 0, "no socket listens on %s", path);
        return 0;
    }
    /* One file, one socket bound to it: more is not a listener of ours. */
    if (n > SERVER_LISTENERS_MAX)
        n = SERVER_LISTENERS_MAX;
    if ((rc = server_holds_socket(pid, ino, n, err)) == 0)
        shmb_error_set(err, 0, "it does not listen on %s", path);
    return rc;
}
