// SPDX-License-Identifier: Apache-2.0
/*
 * The listening socket and the set of connections.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/protocol.h"
#include "../proto/sock.h"
#include "log.h"

#define SERVER_BACKLOG 128

/* Fill a sockaddr_un; -ENAMETOOLONG, naming --socket, when path does not fit. */
static int server_address(struct sockaddr_un *sun, const char *path,
                          struct shmb_error *err)
{
    if (shmb_sock_address(sun, path) < 0)
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Socket path %s is longer than %zu bytes; choose a shorter "
                              "--socket.",
                              path, sizeof(sun->sun_path) - 1);
    return 0;
}

int server_probe(const char *path, struct shmb_error *err)
{
    struct sockaddr_un sun;
    struct stat st;
    int fd, rc, saved;

    if ((rc = server_address(&sun, path, err)) < 0)
        return rc;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0
                               : shmb_error_set(err, -errno, "Cannot inspect %s: %s.",
                                                path, strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return shmb_error_set(
            err, -EEXIST,
            "%s exists and is not a socket; remove it or choose another "
            "--socket.",
            path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return shmb_error_set(err, -errno, "Cannot create a socket: %s.",
                              strerror(errno));
    rc = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
    saved = errno;
    close(fd);
    if (rc == 0 || saved == EAGAIN)
        return shmb_error_set(err, -EADDRINUSE,
                              "another shmbrokerd is listening on %s; stop it first, or "
                              "choose another --socket.",
                              path);
    if (saved != ECONNREFUSED)
        return shmb_error_set(err, -saved, "Cannot probe socket %s: %s.", path,
                              strerror(saved));
    return 1;
}

int server_remove_stale(const char *path, struct shmb_error *err)
{
    if (unlink(path) != 0 && errno != ENOENT)
        return shmb_error_set(err, -errno, "Cannot remove stale socket %s: %s.", path,
                              strerror(errno));
    log_info("removed stale socket %s left by a daemon that is gone", path);
    return 0;
}

/* mkdir -p of path's parent directory, mode 0755. */
static int server_make_parent(const char *path, struct shmb_error *err)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *slash;
    size_t i;

    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash == NULL || slash == dir)
        return 0;
    *slash = '\0';
    for (i = 1; dir[i] != '\0'; i++) {
        if (dir[i] != '/')
            continue;
        dir[i] = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return shmb_error_set(err, -errno, "Cannot create directory %s: %s.", dir,
                                  strerror(errno));
        dir[i] = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return shmb_error_set(err, -errno,
                              "Cannot create directory %s for the socket: %s.", dir,
                              strerror(errno));
    return 0;
}

/* Refuse a peer with one error line, then close it. Best effort: a peer
 * that cannot take one short line right away does not get it. */
static void server_refuse(int fd, int code, const char *message)
{
    char line[SHMB_ERROR_MSG_MAX + 512]; /* a whole message, escaped */
    json_t *reply = shmb_error_reply(NULL, code, message);
    size_t n = reply ? json_dumpb(reply, line, sizeof(line) - 1, JSON_COMPACT) : 0;

    json_decref(reply);
    if (n > 0 && n < sizeof(line) - 1) {
        line[n++] = '\n';
        if (send(fd, line, n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
            log_debug("could not tell a refused client why: %s", strerror(errno));
    }
    close(fd);
}

/* True when the peer's uid or one of its groups is on the allow lists (or
 * there are none). The daemon's own user and root are always allowed. */
static bool server_allowed(const struct policy *lim, int fd,
                           const struct ucred *cred)
{
    gid_t small[256], *groups = small;
    socklen_t len = sizeof(small);
    size_t i, j, ngroups = 0;
    bool allowed = false;

    if (lim->n_allow_uid == 0 && lim->n_allow_gid == 0)
        return true;
    if (cred->uid == 0 || cred->uid == geteuid())
        return true;
    for (i = 0; i < lim->n_allow_uid; i++)
        if (lim->allow_uid[i] == cred->uid)
            return true;
    /* A peer may have up to NGROUPS_MAX (65536) groups: ERANGE says how
     * many bytes they take. Out of memory, only its gid counts. */
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        ngroups = len / sizeof(gid_t);
    else if (errno == ERANGE && len > sizeof(small) &&
             (groups = shmb_malloc(len)) != NULL &&
             getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        ngroups = len / sizeof(gid_t);
    for (i = 0; i < lim->n_allow_gid && !allowed; i++) {
        allowed = lim->allow_gid[i] == cred->gid;
        for (j = 0; j < ngroups && !allowed; j++)
            allowed = groups[j] == lim->allow_gid[i];
    }
    if (groups != small)
        shmb_free(groups);
    return allowed;
}

/* Admit or refuse one accepted socket. */
static void server_admit(struct server *srv, int fd)
{
    const struct policy *lim = srv->limits;
    struct ucred cred = {0, (uid_t)-1, (gid_t)-1};
    socklen_t len = sizeof(cred);
    char msg[256];
    int rc;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        log_warn("cannot read a client's credentials: %s; closing it", strerror(errno));
        close(fd);
        return;
    }
    if (!server_allowed(lim, fd, &cred)) {
        snprintf(msg, sizeof(msg),
                 "uid %d (gid %d) may not use this shmbrokerd: it is not in --allow-uid "
                 "or --allow-gid.",
                 (int)cred.uid, (int)cred.gid);
        log_warn("refused client pid %d uid %d gid %d: not allowed", (int)cred.pid,
                 (int)cred.uid, (int)cred.gid);
        server_refuse(fd, -EPERM, msg);
        return;
    }
    if (lim->max_clients != 0 && srv->conns.count >= lim->max_clients) {
        snprintf(
            msg, sizeof(msg),
            "max-clients (%u) reached; try again when a client disconnects, or raise "
            "--max-clients.",
            lim->max_clients);
        log_warn("refused client pid %d: max-clients (%u) reached", (int)cred.pid,
                 lim->max_clients);
        server_refuse(fd, -EDQUOT, msg);
        return;
    }
    if (lim->max_clients_per_uid != 0 &&
        conn_set_count_uid(&srv->conns, cred.uid) >= lim->max_clients_per_uid) {
        snprintf(
            msg, sizeof(msg),
            "max-clients-per-uid (%u) reached for uid %d; close some connections, or "
            "raise --max-clients-per-uid.",
            lim->max_clients_per_uid, (int)cred.uid);
        log_warn("refused client pid %d: max-clients-per-uid (%u) reached for uid %d",
                 (int)cred.pid, lim->max_clients_per_uid, (int)cred.uid);
        server_refuse(fd, -EDQUOT, msg);
        return;
    }
    if ((rc = conn_open(&srv->conns, fd, cred.pid, cred.uid, cred.gid)) < 0)
        log_warn("cannot serve client pid %d: %s", (int)cred.pid, uv_strerror(rc));
}

/* With the reserved descriptor, accept and refuse the clients waiting in the
 * backlog, so that none waits without an answer while descriptors are out. */
static void server_refuse_queued(struct server *srv)
{
    int fd, n;

    if (srv->reserve_fd < 0)
        return;
    close(srv->reserve_fd);
    srv->reserve_fd = -1;
    for (n = 0; n < 64; n++) {
        fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            break;
        server_refuse(fd, -EMFILE,
                      "shmbrokerd is out of file descriptors; try again when a client "
                      "disconnects.");
    }
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* While paused, clients that queue up are refused once a second. */
static void server_on_emfile_timer(uv_timer_t *timer)
{
    struct server *srv = timer->data;

    if (srv->paused)
        server_refuse_queued(srv);
    else
        uv_timer_stop(timer);
}

/* Out of descriptors: refuse the waiting clients with the reserved
 * descriptor, then stop accepting until a connection closes, rather than
 * spin; clients that queue meanwhile are refused once a second. */
static void server_out_of_fds(struct server *srv, int saved)
{
    log_warn("out of file descriptors (%s) with %u clients; not accepting new clients "
             "until one disconnects (raise the limit with ulimit -n or LimitNOFILE=)",
             strerror(saved), srv->conns.count);
    server_refuse_queued(srv);
    uv_poll_stop(&srv->watcher);
    srv->paused = true;
    uv_timer_start(&srv->emfile_timer, server_on_emfile_timer, 1000, 1000);
}

/* The listening socket is readable: accept what is waiting, a bounded batch
 * per wake-up so that clients already connected are served in between. */
static void server_on_readable(uv_poll_t *watcher, int status, int events)
{
    struct server *srv = watcher->data;
    int i;

    (void)events;
    if (status < 0) {
        log_warn("listening socket error: %s", uv_strerror(status));
        return;
    }
    for (i = 0; i < 64 && !srv->paused; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (fd >= 0) {
            server_admit(srv, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EMFILE || errno == ENFILE)
            server_out_of_fds(srv, errno);
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            log_warn("accept failed: %s", strerror(errno));
        break;
    }
}

static void server_on_readable(uv_poll_t *watcher, int status, int events);

/* A connection's descriptor was closed: when descriptors had run out, accept
 * again. */
static void server_on_conn_freed(void *arg)
{
    struct server *srv = arg;

    if (srv->paused && srv->watching && srv->listen_fd >= 0) {
        srv->paused = false;
        uv_timer_stop(&srv->emfile_timer);
        if (srv->reserve_fd < 0)
            srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        uv_poll_start(&srv->watcher, UV_READABLE, server_on_readable);
        log_info("a client left; accepting new clients again");
    }
}

/* Start watching a listening socket, with an empty set of connections. */
static int server_watch(struct server *srv, int fd, struct command_env *env,
                        struct shmb_error *err)
{
    int rc;

    srv->listen_fd = fd;
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if ((rc = uv_poll_init(srv->loop, &srv->watcher, fd)) < 0)
        return shmb_error_set(err, -EIO, "Cannot watch %s: %s.", srv->path,
                              uv_strerror(rc));
    if ((rc = uv_timer_init(srv->loop, &srv->emfile_timer)) < 0) {
        uv_close((uv_handle_t *)&srv->watcher, NULL);
        return shmb_error_set(err, -EIO, "Cannot watch %s: %s.", srv->path,
                              uv_strerror(rc));
    }
    if ((rc = conn_set_init(&srv->conns, srv->loop, env, srv->limits, server_on_conn_freed,
                            srv)) < 0) {
        uv_close((uv_handle_t *)&srv->watcher, NULL);
        uv_close((uv_handle_t *)&srv->emfile_timer, NULL);
        return shmb_error_set(err, -EIO, "Cannot serve %s: %s.", srv->path,
                              uv_strerror(rc));
    }
    srv->watcher.data = srv;
    srv->emfile_timer.data = srv;
    uv_unref((uv_handle_t *)&srv->emfile_timer);
    srv->watching = true;
    if ((rc = uv_poll_start(&srv->watcher, UV_READABLE, server_on_readable)) < 0)
        return shmb_error_set(err, -EIO, "Cannot watch %s: %s.", srv->path,
                              uv_strerror(rc));
    return 0;
}

int server_bind(const char *path, mode_t mode, int *fd_out, struct shmb_error *err)
{
    struct sockaddr_un sun;
    mode_t old_mask;
    int fd, rc, saved;

    *fd_out = -1;
    if ((rc = server_address(&sun, path, err)) < 0 ||
        (rc = server_make_parent(path, err)) < 0)
        return rc;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return shmb_error_set(err, -errno, "Cannot create a socket: %s.",
                              strerror(errno));
    /* Bind under a umask that gives the final mode at once, so there is no
     * moment when the socket is more open than asked. */
    old_mask = umask((mode_t)(~mode & 0777));
    rc = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
    saved = errno;
    umask(old_mask);
    if (rc != 0) {
        close(fd);
        return shmb_error_set(err, -saved, "Cannot bind %s: %s.", path, strerror(saved));
    }
    if (chmod(path, mode) != 0) {
        saved = errno;
        close(fd);
        unlink(path);
        return shmb_error_set(err, -saved, "Cannot set the mode of %s: %s.", path,
                              strerror(saved));
    }
    *fd_out = fd;
    return 0;
}

void server_unbind(int fd, const char *path)
{
    if (fd < 0)
        return;
    close(fd);
    unlink(path);
}

int server_listen(struct server *srv, uv_loop_t *loop, int fd, const char *path,
                  struct command_env *env, const struct policy *limits,
                  struct shmb_error *err)
{
    int rc;

    memset(srv, 0, sizeof(*srv));
    srv->loop = loop;
    srv->limits = limits;
    srv->listen_fd = srv->reserve_fd = -1;
    snprintf(srv->path, sizeof(srv->path), "%s", path);
    srv->owns_path = true;
    srv->listen_fd = fd;
    /* Listening only now, with the segment ready: until then a client's
     * connect is refused, so a socket that accepts means a daemon that
     * serves. */
    if (listen(fd, SERVER_BACKLOG) != 0) {
        rc = errno;
        server_close(srv);
        return shmb_error_set(err, -rc, "Cannot listen on %s: %s.", path, strerror(rc));
    }
    if ((rc = server_watch(srv, fd, env, err)) < 0)
        server_close(srv);
    return rc;
}

void server_refuse_waiting(int fd, int code, const char *message)
{
    int flags = fcntl(fd, F_GETFL), peer, n;

    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return;
    for (n = 0; n < SERVER_REFUSE_WAITING_MAX; n++) {
        if ((peer = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) < 0)
            break;
        server_refuse(peer, code, message);
    }
    if (n > 0)
        log_info("told %d waiting client(s) why shmbrokerd cannot start", n);
}

/* The first descriptor systemd passes (SD_LISTEN_FDS_START). */
#define SERVER_LISTEN_FDS_START 3

int server_activated_fd(int *fd, struct server_kept *kept, struct shmb_error *err)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    const char *names = getenv("LISTEN_FDNAMES");
    struct sockaddr_un sun;
    socklen_t len = sizeof(int);
    int type = 0, listening = 0, n, i, sockets = 0;
    bool ours = pid != NULL && strtol(pid, NULL, 10) == (long)getpid();

    n = fds != NULL ? atoi(fds) : 0;
    if (kept != NULL)
        kept->n = 0;
    *fd = -1;
    /* The names, "a:b:c", one per descriptor (absent: none is kept). */
    for (i = 0; ours && i < n && i < 1024; i++) {
        char name[64] = "";
        size_t l = 0;

        if (names != NULL) {
            l = strcspn(names, ":");
            snprintf(name, sizeof(name), "%.*s", (int)(l < sizeof(name) ? l : sizeof(name) - 1),
                     names);
            names = names[l] == ':' ? names + l + 1 : names + l;
        }
        if (strncmp(name, SERVER_KEPT_PREFIX, strlen(SERVER_KEPT_PREFIX)) != 0) {
            sockets++;
            *fd = SERVER_LISTEN_FDS_START + i;
            continue;
        }
        if (kept != NULL && kept->n < SERVER_KEPT_MAX) {
            kept->fd[kept->n] = SERVER_LISTEN_FDS_START + i;
            snprintf(kept->name[kept->n], sizeof(kept->name[0]), "%s", name);
            fcntl(kept->fd[kept->n], F_SETFD, FD_CLOEXEC);
            kept->n++;
        } else {
            close(SERVER_LISTEN_FDS_START + i);
        }
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (!ours || n <= 0 || sockets == 0)
        return 0;
    if (sockets != 1)
        return shmb_error_set(
            err, -EINVAL,
            "systemd passed %d sockets; shmbrokerd listens on exactly one. "
            "Give shmbrokerd.socket a single ListenStream=.",
            sockets);
    if (getsockopt(*fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
        (len = sizeof(int),
         getsockopt(*fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len)) != 0 ||
        !listening ||
        (len = sizeof(sun), getsockname(*fd, (struct sockaddr *)&sun, &len)) != 0 ||
        sun.sun_family != AF_UNIX)
        return shmb_error_set(
            err, -EINVAL,
            "The socket systemd passed (fd %d) is not a listening Unix "
            "stream socket; use ListenStream=/run/shmbroker/shmbroker.sock "
            "in shmbrokerd.socket.",
            *fd);
    return 1;
}

int server_adopt(struct server *srv, uv_loop_t *loop, int fd, struct command_env *env,
                 const struct policy *limits, struct shmb_error *err)
{
    struct sockaddr_un sun;
    socklen_t len = sizeof(sun);
    int flags, rc;

    memset(srv, 0, sizeof(*srv));
    srv->loop = loop;
    srv->limits = limits;
    srv->listen_fd = srv->reserve_fd = -1;
    memset(&sun, 0, sizeof(sun));
    if (getsockname(fd, (struct sockaddr *)&sun, &len) == 0)
        snprintf(srv->path, sizeof(srv->path), "%s", sun.sun_path);
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 ||
        fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return shmb_error_set(err, -errno, "Cannot set up the socket systemd passed: %s.",
                              strerror(errno));
    srv->owns_path = false; /* systemd's socket: it stays when we exit */
    if ((rc = server_watch(srv, fd, env, err)) < 0)
        server_close(srv);
    return rc;
}

void server_hello_rearm(struct server *srv)
{
    if (srv->watching)
        conn_set_hello_rearm(&srv->conns);
}

void server_close(struct server *srv)
{
    if (srv->watching) {
        uv_close((uv_handle_t *)&srv->watcher, NULL);
        uv_close((uv_handle_t *)&srv->emfile_timer, NULL);
        srv->watching = false;
        conn_set_close(&srv->conns);
    }
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    srv->listen_fd = srv->reserve_fd = -1;
    if (srv->owns_path) {
        unlink(srv->path);
        srv->owns_path = false;
    }
}
