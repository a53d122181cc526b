/*
 * The listening socket and the set of connections.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"

#define SERVER_BACKLOG 128

/* Fill a sockaddr_un; -ENAMETOOLONG when path does not fit. */
static int server_address(struct sockaddr_un *sun, const char *path, struct shmb_error *err)
{
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun->sun_path))
        return shmb_error_set(err, -ENAMETOOLONG,
                              "Socket path %s is longer than %zu bytes; choose a shorter "
                              "--socket.", path, sizeof(sun->sun_path) - 1);
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
                               : shmb_error_set(err, -errno, "Cannot inspect %s: %s.", path,
                                                strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return shmb_error_set(err, -EEXIST,
                              "%s exists and is not a socket; remove it or choose another "
                              "--socket.", path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return shmb_error_set(err, -errno, "Cannot create a socket: %s.", strerror(errno));
    rc = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
    saved = errno;
    close(fd);
    if (rc == 0 || saved == EAGAIN)
        return shmb_error_set(err, -EADDRINUSE,
                              "another shmbrokerd is listening on %s; stop it first, or "
                              "choose another --socket.", path);
    if (saved != ECONNREFUSED)
        return shmb_error_set(err, -saved, "Cannot probe socket %s: %s.", path,
                              strerror(saved));
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

static void server_on_connection(uv_stream_t *listener, int status)
{
    struct server *srv = listener->data;
    int rc;

    if (status < 0) {
        log_warn("accept failed: %s", uv_strerror(status));
        return;
    }
    if ((rc = conn_accept(srv, listener)) < 0)
        log_warn("cannot accept a client: %s", uv_strerror(rc));
}

int server_listen(struct server *srv, uv_loop_t *loop, const char *path, mode_t mode,
                  struct command_env *env, struct shmb_error *err)
{
    struct sockaddr_un sun;
    mode_t old_mask;
    int fd = -1, rc, saved;

    memset(srv, 0, sizeof(*srv));
    srv->loop = loop;
    srv->env = env;
    if ((rc = server_address(&sun, path, err)) < 0 || (rc = server_make_parent(path, err)) < 0)
        return rc;
    snprintf(srv->path, sizeof(srv->path), "%s", path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return shmb_error_set(err, -errno, "Cannot create a socket: %s.", strerror(errno));
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
    srv->owns_path = true;
    if (chmod(path, mode) != 0 || listen(fd, SERVER_BACKLOG) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot listen on %s: %s.", path, strerror(saved));
        goto fail;
    }
    if ((rc = uv_pipe_init(loop, &srv->listener, 0)) < 0 ||
        (rc = uv_pipe_open(&srv->listener, fd)) < 0) {
        rc = shmb_error_set(err, -EIO, "Cannot watch %s: %s.", path, uv_strerror(rc));
        goto fail;
    }
    fd = -1; /* the pipe owns it now */
    srv->listener.data = srv;
    if ((rc = uv_listen((uv_stream_t *)&srv->listener, SERVER_BACKLOG,
                        server_on_connection)) < 0) {
        rc = shmb_error_set(err, -EIO, "Cannot listen on %s: %s.", path, uv_strerror(rc));
        goto fail;
    }
    srv->listening = true;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    if (uv_is_active((uv_handle_t *)&srv->listener) || srv->listener.loop != NULL)
        uv_close((uv_handle_t *)&srv->listener, NULL);
    unlink(path);
    srv->owns_path = false;
    return rc;
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
    srv->env->clients = srv->nconns;
}

void server_close(struct server *srv)
{
    struct conn *conn;

    if (srv->listening) {
        uv_close((uv_handle_t *)&srv->listener, NULL);
        srv->listening = false;
    }
    for (conn = srv->conns; conn != NULL; conn = conn->next)
        conn_close(conn);
    if (srv->owns_path) {
        unlink(srv->path);
        srv->owns_path = false;
    }
}
