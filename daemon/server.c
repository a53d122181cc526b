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

#include "../proto/protocol.h"
#include "conn.h"
#include "log.h"

#define SERVER_BACKLOG 128

/* Fill a sockaddr_un; -ENAMETOOLONG when path does not fit. */
static int server_address(struct sockaddr_un *sun, const char *path,
                          struct shmb_error *err)
{
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun->sun_path))
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Socket path %s is longer than %zu bytes; choose a shorter "
                              "--socket.",
                              path, sizeof(sun->sun_path) - 1);
    memcpy(sun->sun_path, path, strlen(path) + 1);
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
    char line[512];
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
    gid_t groups[256];
    socklen_t len = sizeof(groups);
    size_t i, j, ngroups = 0;

    if (lim->n_allow_uid == 0 && lim->n_allow_gid == 0)
        return true;
    if (cred->uid == 0 || cred->uid == geteuid())
        return true;
    for (i = 0; i < lim->n_allow_uid; i++)
        if (lim->allow_uid[i] == cred->uid)
            return true;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        ngroups = len / sizeof(gid_t);
    for (i = 0; i < lim->n_allow_gid; i++) {
        if (lim->allow_gid[i] == cred->gid)
            return true;
        for (j = 0; j < ngroups; j++)
            if (groups[j] == lim->allow_gid[i])
                return true;
    }
    return false;
}

/* Admit or refuse one accepted socket. */
static void server_admit(struct server *srv, int fd)
{
    const struct policy *lim = srv->limits;
    struct ucred cred = {0, (uid_t)-1, (gid_t)-1};
    socklen_t len = sizeof(cred);
    char msg[256];
    unsigned same_uid = 0;
    struct conn *c;
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
    if (lim->max_clients != 0 && srv->nconns >= lim->max_clients) {
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
    for (c = srv->conns; c != NULL; c = c->next)
        same_uid += !c->closing && c->client.uid == cred.uid;
    if (lim->max_clients_per_uid != 0 && same_uid >= lim->max_clients_per_uid) {
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
    if ((rc = conn_open(srv, fd, cred.pid, cred.uid, cred.gid)) < 0) {
        log_warn("cannot serve client pid %d: %s", (int)cred.pid, uv_strerror(rc));
        close(fd);
    }
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
             strerror(saved), srv->nconns);
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

static void server_on_wait_timer(uv_timer_t *timer);

/* Arm the timer for the earliest deadline among the waiters, or for the
 * moment a read lease lets the blocker go, if that comes first. */
static void server_arm_wait_timer(struct server *srv)
{
    uint64_t earliest = UINT64_MAX, now = clock_now_ms(), wake;
    struct conn *c;

    for (c = srv->wait_head; c != NULL; c = c->wait_next)
        if (c->wait_until_ms < earliest)
            earliest = c->wait_until_ms;
    if (earliest != UINT64_MAX && (wake = command_room_wake_ms(srv->env)) < earliest)
        earliest = wake;
    if (earliest == UINT64_MAX)
        uv_timer_stop(&srv->wait_timer);
    else
        uv_timer_start(&srv->wait_timer, server_on_wait_timer,
                       earliest > now ? earliest - now : 0, 0);
}

void server_wait_add(struct server *srv, struct conn *conn)
{
    /* It just found no room: retry only once something changes. */
    if (srv->wait_head == NULL)
        srv->room_gen = command_room_generation(srv->env);
    conn->wait_next = NULL;
    conn->wait_prev = srv->wait_tail;
    if (srv->wait_tail != NULL)
        srv->wait_tail->wait_next = conn;
    else
        srv->wait_head = conn;
    srv->wait_tail = conn;
    server_arm_wait_timer(srv);
}

void server_wait_remove(struct server *srv, struct conn *conn)
{
    if (conn->wait_prev != NULL)
        conn->wait_prev->wait_next = conn->wait_next;
    else if (srv->wait_head == conn)
        srv->wait_head = conn->wait_next;
    else
        return;
    if (conn->wait_next != NULL)
        conn->wait_next->wait_prev = conn->wait_prev;
    else
        srv->wait_tail = conn->wait_prev;
    conn->wait_prev = conn->wait_next = NULL;
    if (!uv_is_closing((uv_handle_t *)&srv->wait_timer))
        server_arm_wait_timer(srv);
}

/* Retry one waiter; true when it got its answer (and left the queue). */
static bool server_retry(struct server *srv, struct conn *conn, bool final)
{
    struct command_result res;

    command_retry(srv->env, &conn->client, conn->wait_request, conn->wait_until_ms, final,
                  &res);
    if (res.flags & COMMAND_WAIT) {
        json_decref(res.wait_request); /* the same request: keep the one we have */
        return false;
    }
    server_wait_remove(srv, conn);
    conn_wait_done(conn, &res);
    return true;
}

/* Once per loop iteration: when room may have been made, serve waiters in
 * arrival order, stopping at the first that still does not fit. */
static void server_on_room_check(uv_check_t *check)
{
    struct server *srv = check->data;
    uint64_t gen;

    if (srv->wait_head == NULL)
        return;
    gen = command_room_generation(srv->env);
    if (gen == srv->room_gen)
        return;
    srv->room_gen = gen;
    while (srv->wait_head != NULL && server_retry(srv, srv->wait_head, false))
        ;
}

/* A deadline came, or a read lease ran out: serve waiters in arrival order
 * while they fit, then answer every waiter whose time is up, allocation or
 * ETIMEDOUT. */
static void server_on_wait_timer(uv_timer_t *timer)
{
    struct server *srv = timer->data;
    uint64_t now = clock_now_ms();
    struct conn *c, *next;

    while (srv->wait_head != NULL && srv->wait_head->wait_until_ms > now &&
           server_retry(srv, srv->wait_head, false))
        ;
    for (c = srv->wait_head; c != NULL; c = next) {
        next = c->wait_next;
        if (c->wait_until_ms <= now)
            server_retry(srv, c, true);
    }
    server_arm_wait_timer(srv);
}

/* Start watching a listening socket. */
static int server_watch(struct server *srv, int fd, struct shmb_error *err)
{
    int rc;

    srv->listen_fd = fd;
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if ((rc = uv_poll_init(srv->loop, &srv->watcher, fd)) < 0)
        return shmb_error_set(err, -EIO, "Cannot watch %s: %s.", srv->path,
                              uv_strerror(rc));
    srv->watcher.data = srv;
    srv->watching = true;
    uv_check_init(srv->loop, &srv->room_check);
    srv->room_check.data = srv;
    uv_check_start(&srv->room_check, server_on_room_check);
    uv_unref((uv_handle_t *)&srv->room_check);
    uv_timer_init(srv->loop, &srv->wait_timer);
    srv->wait_timer.data = srv;
    uv_unref((uv_handle_t *)&srv->wait_timer);
    uv_timer_init(srv->loop, &srv->emfile_timer);
    srv->emfile_timer.data = srv;
    uv_unref((uv_handle_t *)&srv->emfile_timer);
    uv_timer_init(srv->loop, &srv->hello_timer);
    srv->hello_timer.data = srv;
    uv_unref((uv_handle_t *)&srv->hello_timer);
    uv_timer_init(srv->loop, &srv->unread_timer);
    srv->unread_timer.data = srv;
    uv_unref((uv_handle_t *)&srv->unread_timer);
    uv_idle_init(srv->loop, &srv->resume_idle);
    srv->resume_idle.data = srv;
    uv_unref((uv_handle_t *)&srv->resume_idle);
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
    srv->env = env;
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
    if ((rc = server_watch(srv, fd, err)) < 0)
        server_close(srv);
    return rc;
}

/* The first descriptor systemd passes (SD_LISTEN_FDS_START). */
#define SERVER_LISTEN_FDS_START 3

int server_activated_fd(int *fd, struct shmb_error *err)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    struct sockaddr_un sun;
    socklen_t len = sizeof(int);
    int type = 0, listening = 0, n;
    bool ours = pid != NULL && strtol(pid, NULL, 10) == (long)getpid();

    n = fds != NULL ? atoi(fds) : 0;
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (!ours || n <= 0)
        return 0;
    if (n != 1)
        return shmb_error_set(
            err, -EINVAL,
            "systemd passed %d sockets; shmbrokerd listens on exactly one. "
            "Give shmbrokerd.socket a single ListenStream=.",
            n);
    *fd = SERVER_LISTEN_FDS_START;
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
    srv->env = env;
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
    if ((rc = server_watch(srv, fd, err)) < 0)
        server_close(srv);
    return rc;
}

/* Close the connections that have not said hello within --hello-timeout,
 * and wake again for the earliest one left. One timer for all of them:
 * pre-hello connections are few, and a walk of the list is cheap next to
 * a timer per connection. */
static void server_on_hello_timer(uv_timer_t *timer)
{
    struct server *srv = timer->data;
    uint64_t limit = srv->limits->hello_timeout_ms, now = clock_now_ms();
    uint64_t earliest = UINT64_MAX;
    struct conn *c, *next;

    if (limit == 0)
        return;
    for (c = srv->conns; c != NULL; c = next) {
        next = c->next;
        if (c->closing || c->client.said_hello)
            continue;
        if (now - c->connected_ms >= limit)
            conn_hello_timeout(c, limit);
        else if (c->connected_ms + limit < earliest)
            earliest = c->connected_ms + limit;
    }
    if (earliest != UINT64_MAX)
        uv_timer_start(&srv->hello_timer, server_on_hello_timer, earliest - now, 0);
}

void server_hello_watch(struct server *srv)
{
    /* A new connection's deadline is the latest of all: a timer already
     * running fires first and re-arms for it. */
    if (srv->limits->hello_timeout_ms != 0 && srv->watching &&
        !uv_is_active((uv_handle_t *)&srv->hello_timer))
        uv_timer_start(&srv->hello_timer, server_on_hello_timer,
                       srv->limits->hello_timeout_ms, 0);
}

/* Look at every connection with too much output unread; wake again while
 * any is left. */
static void server_on_unread_timer(uv_timer_t *timer)
{
    struct server *srv = timer->data;
    uint64_t now = clock_now_ms();
    bool again = false;
    struct conn *c, *next;

    for (c = srv->conns; c != NULL; c = next) {
        next = c->next;
        if (!c->closing && conn_unread_check(c, now))
            again = true;
    }
    if (again)
        uv_timer_start(&srv->unread_timer, server_on_unread_timer, CONN_UNREAD_TICK_MS, 0);
}

void server_unread_watch(struct server *srv)
{
    if (srv->watching && !uv_is_active((uv_handle_t *)&srv->unread_timer))
        uv_timer_start(&srv->unread_timer, server_on_unread_timer, CONN_UNREAD_TICK_MS, 0);
}

void server_hello_rearm(struct server *srv)
{
    if (!srv->watching)
        return;
    uv_timer_stop(&srv->hello_timer);
    /* Closes the connections already past the new limit and arms the timer
     * for the earliest of the others. */
    server_on_hello_timer(&srv->hello_timer);
}

/* Continue every connection whose turn ended with requests left; an idle
 * handle runs once per loop iteration, after the events of the others. */
static void server_on_resume_idle(uv_idle_t *idle)
{
    struct server *srv = idle->data;
    struct conn *c, *next;

    /* A connection closed meanwhile stays in the list until its close
     * callback, so next stays valid; new connections go to the front. */
    for (c = srv->conns; c != NULL; c = next) {
        next = c->next;
        if (c->deferred && !c->closing)
            conn_continue(c);
    }
    if (srv->ndeferred == 0)
        uv_idle_stop(idle);
}

void server_defer(struct server *srv, struct conn *conn)
{
    if (conn->deferred)
        return;
    conn->deferred = true;
    srv->ndeferred++;
    if (srv->watching)
        uv_idle_start(&srv->resume_idle, server_on_resume_idle);
}

void server_undefer(struct server *srv, struct conn *conn)
{
    if (!conn->deferred)
        return;
    conn->deferred = false;
    srv->ndeferred--;
}

void server_forget(struct server *srv, struct conn *conn)
{
    if (conn->prev != NULL)
        conn->prev->next = conn->next;
    else
        srv->conns = conn->next;
    if (conn->next != NULL)
        conn->next->prev = conn->prev;
    srv->nconns--;
    if (srv->paused && srv->watching && srv->listen_fd >= 0) {
        srv->paused = false;
        uv_timer_stop(&srv->emfile_timer);
        if (srv->reserve_fd < 0)
            srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        uv_poll_start(&srv->watcher, UV_READABLE, server_on_readable);
        log_info("a client left; accepting new clients again");
    }
}

void server_close(struct server *srv)
{
    struct conn *conn;

    if (srv->watching) {
        uv_close((uv_handle_t *)&srv->watcher, NULL);
        uv_close((uv_handle_t *)&srv->room_check, NULL);
        uv_close((uv_handle_t *)&srv->wait_timer, NULL);
        uv_close((uv_handle_t *)&srv->emfile_timer, NULL);
        uv_close((uv_handle_t *)&srv->hello_timer, NULL);
        uv_close((uv_handle_t *)&srv->unread_timer, NULL);
        uv_close((uv_handle_t *)&srv->resume_idle, NULL);
        srv->watching = false;
    }
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    if (srv->reserve_fd >= 0)
        close(srv->reserve_fd);
    srv->listen_fd = srv->reserve_fd = -1;
    for (conn = srv->conns; conn != NULL; conn = conn->next)
        conn_close(conn);
    if (srv->owns_path) {
        unlink(srv->path);
        srv->owns_path = false;
    }
}
