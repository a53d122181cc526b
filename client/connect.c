// SPDX-License-Identifier: Apache-2.0
/*
 * Connecting a handle: dialling the socket, the hello exchange, mapping the
 * segment it passes and checking it, the errors that say why a connect was
 * refused (permissions, a daemon still starting), reconnecting. It sends
 * hello through client.c's call machinery and knows no other op's fields.
 */
#include "internal.h"

#include <errno.h>
#include <grp.h>
#include <jansson.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "../proto/layout.h"
#include "../proto/sock.h"
#include "../proto/starting.h"
#include "../proto/text.h"

static pthread_once_t client_forks_once = PTHREAD_ONCE_INIT;
static int client_forks_rc; /* pthread_atfork's result */

static void client_count_fork(void)
{
    atomic_fetch_add_explicit(&client_forks, 1, memory_order_relaxed);
}

static void client_watch_forks(void)
{
    client_forks_rc = pthread_atfork(NULL, NULL, client_count_fork);
}

/* Map the descriptor hello passed and check it against what hello said. */
static int client_map(shmb_t *c)
{
    struct shmb_segment_header hdr;
    struct stat st;
    int flags = MAP_SHARED;

    if (c->seg_fd < 0)
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's hello reply carried no segment descriptor.");
    if (fstat(c->seg_fd, &st) != 0 || (uint64_t)st.st_size < c->info.size ||
        c->info.size < SHMB_HEADER_PAGE || c->info.data_offset < SHMB_HEADER_PAGE ||
        c->info.data_offset > c->info.size ||
        c->info.data_size > c->info.size - c->info.data_offset)
        return shmb_error_set(&c->err, -EPROTO,
                              "The segment descriptor (%lld bytes) does not match hello "
                              "(size %llu, data at %llu, %llu bytes).",
                              (long long)st.st_size, (unsigned long long)c->info.size,
                              (unsigned long long)c->info.data_offset,
                              (unsigned long long)c->info.data_size);
    if (c->map != NULL) {
        /* A reconnect: the same file keeps its mapping, and with it every
         * pointer the application holds. */
        if (st.st_dev == c->map_dev && st.st_ino == c->map_ino &&
            c->map_size == c->info.size)
            goto mapped;
        munmap(c->map, c->map_size);
        c->map = NULL;
    }
    if (c->populate)
        flags |= MAP_POPULATE;
    c->map = mmap(NULL, (size_t)c->info.size, PROT_READ | (c->read_only ? 0 : PROT_WRITE),
                  flags, c->seg_fd, 0);
    if (c->map == MAP_FAILED) {
        int saved = errno;

        c->map = NULL;
        return shmb_error_set(&c->err, -saved, "Cannot map the segment (%llu bytes): %s.",
                              (unsigned long long)c->info.size, strerror(saved));
    }
    c->map_size = (size_t)c->info.size;
    c->map_dev = st.st_dev;
    c->map_ino = st.st_ino;
mapped:
    /* The mapping keeps the file; the descriptor is not needed any more. */
    close(c->seg_fd);
    c->seg_fd = -1;
    /* One copy of the header, so that what is checked is what is quoted. */
    memcpy(&hdr, c->map, sizeof(hdr));
    if (hdr.magic != SHMB_SEGMENT_MAGIC)
        return shmb_error_set(
            &c->err, -EPROTO,
            "The descriptor shmbrokerd passed is not a shmbroker segment: its header "
            "starts with 0x%llx, not the magic number 0x%llx: something (a read-write "
            "client can) overwrote the segment's header page. Restart shmbrokerd.",
            (unsigned long long)hdr.magic, (unsigned long long)SHMB_SEGMENT_MAGIC);
    if (hdr.version != SHMB_LAYOUT_VERSION)
        return shmb_error_set(&c->err, -EPROTO,
                              "The segment has layout version %u; this library reads "
                              "version %d. Use a libshmbroker of shmbrokerd's release.",
                              hdr.version, SHMB_LAYOUT_VERSION);
    return 0;
}

/* An integer field of the hello reply, or 0 when absent (an older daemon). */
static uint64_t client_hello_u64(const json_t *reply, const char *field)
{
    json_t *v = json_object_get(reply, field);

    return json_is_integer(v) && json_integer_value(v) >= 0 ? (uint64_t)json_integer_value(v)
                                                            : 0;
}

/* The name of user uid (or group gid, when group) into buf: "?" when it has
 * none here (another container's ids). Returns buf. */
static const char *client_id_name(unsigned id, bool group, char *buf, size_t len)
{
    char tmp[4096];
    struct passwd pw, *pwp = NULL;
    struct group gr, *grp = NULL;

    if (group ? getgrgid_r((gid_t)id, &gr, tmp, sizeof(tmp), &grp) == 0 && grp != NULL
              : getpwuid_r((uid_t)id, &pw, tmp, sizeof(tmp), &pwp) == 0 && pwp != NULL)
        snprintf(buf, len, "%s", group ? grp->gr_name : pwp->pw_name);
    else
        snprintf(buf, len, "?");
    return buf;
}

/* connect() to path was refused with EACCES: say whose the socket is and
 * what would let this process in, instead of asking whether the daemon
 * runs (it does: its socket is there). */
static int client_access_error(shmb_t *c, const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], user[64], group[64], join[64];
    const char *what = path;
    struct stat st;
    char *slash;

    if (stat(path, &st) != 0) {
        /* A directory on the way does not let this user through. */
        snprintf(dir, sizeof(dir), "%s", path);
        slash = strrchr(dir, '/');
        if (slash != NULL && slash != dir)
            *slash = '\0';
        if (stat(dir, &st) != 0)
            return shmb_error_set(
                &c->err, -EACCES,
                "Permission denied connecting to shmbrokerd at %s: this process (uid %u, "
                "gid %u) may not reach the socket's directory. Run as a user who may, or "
                "choose another socket (--socket of shmbrokerd and of this client).",
                path, (unsigned)geteuid(), (unsigned)getegid());
        what = dir;
    }
    client_id_name((unsigned)st.st_gid, true, group, sizeof(group));
    /* usermod takes a gid too: a group without a name here is joined by it. */
    if (strcmp(group, "?") == 0)
        snprintf(join, sizeof(join), "%u", (unsigned)st.st_gid);
    else
        snprintf(join, sizeof(join), "%s", group);
    return shmb_error_set(
        &c->err, -EACCES,
        "Permission denied connecting to shmbrokerd at %s: %s%s belongs to user %s (uid "
        "%u) and group %s (gid %u) with mode %04o, and this process runs as uid %u, gid "
        "%u, whom that mode does not let in. Join the group (usermod -aG %s USER, then "
        "log in again; in a container, add gid %u to the worker's groups), or start "
        "shmbrokerd with "
        "--socket-mode 0666 (with --allow-gid GROUP or --allow-uid USER to keep others "
        "out).",
        path, what == path ? "the socket" : "its directory ", what == path ? "" : what,
        client_id_name((unsigned)st.st_uid, false, user, sizeof(user)),
        (unsigned)st.st_uid, group, (unsigned)st.st_gid, (unsigned)(st.st_mode & 07777),
        (unsigned)geteuid(), (unsigned)getegid(), join, (unsigned)st.st_gid);
}

/* The catalog view and the arena of a new connection, from its hello reply
 * (NULL: none yet): both start afresh on every connect and reconnect. A
 * daemon that does not say "layout":2 publishes no catalog this library
 * reads, and every shmb_read asks it. */
static void client_read_hello(shmb_t *c, const json_t *reply)
{
    memset(&c->catalog, 0, sizeof(c->catalog));
    memset(&c->arena, 0, sizeof(c->arena));
    if (reply == NULL || c->map == NULL ||
        client_hello_u64(reply, "layout") != SHMB_LAYOUT_VERSION)
        return;
    c->catalog.base = c->map;
    c->catalog.map_size = c->map_size;
    c->catalog.data_offset = c->info.data_offset;
    c->catalog.data_size = c->info.data_size;
    c->catalog.catalog_offset = client_hello_u64(reply, "catalog_offset");
    c->catalog.catalog_slots = client_hello_u64(reply, "catalog_slots");
    c->catalog.seed = (uint32_t)client_hello_u64(reply, "catalog_seed");
}

/* A refused connect to a daemon that is still starting (it listens once its
 * pools are reserved, which takes seconds for gigabytes): -EAGAIN with its
 * progress, rather than asking whether it runs. 0 when none is starting. */
static int client_starting_error(shmb_t *c, const char *path)
{
    char text[SHMB_ESCAPED_MAX(SHMB_STARTING_TEXT_MAX)];
    long long pid = 0;

    if (shmb_starting_read(path, &pid, text, sizeof(text)) != 1)
        return 0;
    return shmb_error_set(&c->err, -EAGAIN,
                          "shmbrokerd at %s is starting (pid %lld): %s. It answers once its "
                          "pools are reserved; retry then.",
                          path, pid, text);
}

/* Dial path, say hello, map the segment (keeping a mapping of the same file
 * when keep_map). */
static int client_dial(shmb_t *c, const char *path, const char *name, bool keep_map)
{
    struct sockaddr_un sun;
    json_t *reply = NULL;
    const char *segment = NULL;
    int rc;

    if (c->sock >= 0 && c->unconfirmed.count > 0) {
        char key[SHMB_KEY_MAX + 1];
        struct client_key k;

        /* Puts sent without waiting on the connection being left: a reply
         * proves them handled (or tells of refused ones), so that only
         * those are reported, not every one as maybe lost. The key was
         * checked when it was put. */
        memcpy(key, c->unconfirmed.key, sizeof(key));
        k = client_key_trusted(key);
        (void)client_key_op(c, SHMB_OP_CONTAINS, &k, NULL);
    }
    shmb_error_clear(&c->err);
    client_disconnect(c, keep_map);
    client_read_hello(c, NULL);
    pthread_once(&client_forks_once, client_watch_forks);
    if (client_forks_rc != 0)
        return shmb_error_set(&c->err, -client_forks_rc,
                              "Cannot watch for fork() (pthread_atfork: %s).",
                              strerror(client_forks_rc));
    if (shmb_sock_address(&sun, path) < 0)
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
    c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->sock < 0)
        return shmb_error_set(&c->err, -errno, "Cannot create a socket: %s.",
                              strerror(errno));
    if (connect(c->sock, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        int saved = errno;

        char user[sizeof(sun.sun_path)];

        client_disconnect(c, keep_map);
        if ((saved == ECONNREFUSED || saved == ENOENT) && client_starting_error(c, path) < 0)
            return c->err.code;
        if (saved == EACCES)
            return client_access_error(c, path);
        /* The system's socket was tried because this user has none of its
         * own: say where a daemon of its own would be. */
        if (strcmp(path, SHMB_DEFAULT_SOCKET) == 0 && geteuid() != 0 &&
            shmb_user_socket_path(user, sizeof(user)) == 0)
            return shmb_error_set(&c->err, -saved,
                                  "Cannot connect to shmbrokerd at %s: %s, nor at this "
                                  "user's %s. Is shmbrokerd running? Start it (make run, "
                                  "systemctl start shmbrokerd), or set %s or pass the "
                                  "socket path.",
                                  path, strerror(saved), user, SHMB_SOCKET_ENV);
        return shmb_error_set(
            &c->err, -saved,
            "Cannot connect to shmbrokerd at %s: %s. Is shmbrokerd running? "
            "(Set %s or pass the socket path.)",
            path, strerror(saved), SHMB_SOCKET_ENV);
    }
    rc = client_call_ex(c,
                        /* Our pid, which a daemon in another pid namespace
                         * cannot see (the kernel gives it 0), for its reports. */
                        json_pack("{s:s, s:i, s:s?, s:s, s:s*, s:I}", "op", shmb_ops[SHMB_OP_HELLO].name, "version",
                                  SHMB_PROTOCOL_VERSION, "name", name, "mode",
                                  c->read_only ? "ro" : "rw", "pool",
                                  c->dial_pool[0] != '\0' ? c->dial_pool : NULL, "pid",
                                  (json_int_t)getpid()),
                        true, &reply);
    if (rc < 0)
        goto fail;
    /* A daemon without pools says neither: both stay "". */
    client_copy_string(reply, "pool", c->info.pool, sizeof(c->info.pool));
    client_copy_string(reply, "backing", c->info.backing, sizeof(c->info.backing));
    if ((rc = client_u64(c, reply, "size", &c->info.size)) < 0 ||
        (rc = client_u64(c, reply, "data_offset", &c->info.data_offset)) < 0 ||
        (rc = client_u64(c, reply, "data_size", &c->info.data_size)) < 0 ||
        (rc = client_u64(c, reply, "max_object_size", &c->info.max_object_size)) < 0 ||
        (rc = client_u64(c, reply, "alignment", &c->info.alignment)) < 0)
        goto fail;
    if (json_unpack(reply, "{s:s}", "segment", &segment) == 0)
        snprintf(c->info.segment, sizeof(c->info.segment), "%s", segment);
    if ((rc = client_map(c)) < 0)
        goto fail;
    client_read_hello(c, reply);
    json_decref(reply);
    /* The connection is this process's (client_enter). */
    atomic_store_explicit(&c->pid, (int)getpid(), memory_order_relaxed);
    atomic_store_explicit(&c->forks, atomic_load_explicit(&client_forks, memory_order_relaxed),
                          memory_order_relaxed);
    return 0;

fail:
    json_decref(reply);
    client_disconnect(c, keep_map);
    return rc;
}

static int client_connect(shmb_t *c, const char *socket_path, const char *name)
{
    const char *path = shmb_socket_path(socket_path);

    if (strlen(path) >= sizeof(c->path))
        return shmb_error_set(&c->err, -ENAMETOOLONG, "Socket path %s is too long.",
                              path);
    if (c->pool_too_long)
        return shmb_error_set(&c->err, -EINVAL,
                              "The pool name given to shmb_set_pool is longer than %zu bytes; "
                              "pool names are 1 to %zu of A-Z, a-z, 0-9, '_' and '-'. Nothing "
                              "was sent.",
                              sizeof(c->pool) - 1, sizeof(c->pool) - 1);
    snprintf(c->path, sizeof(c->path), "%s", path);
    snprintf(c->name, sizeof(c->name), "%s", name != NULL ? name : "");
    memcpy(c->dial_pool, c->pool, sizeof(c->dial_pool));
    return client_dial(c, c->path, name, false);
}

static int client_reconnect(shmb_t *c)
{
    if (c->path[0] == '\0')
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Never connected; call shmb_connect first.");
    return client_dial(c, c->path, c->name[0] ? c->name : NULL, true);
}



int shmb_connect(shmb_t *c, const char *socket_path, const char *name)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_connect(c, socket_path, name));
}

int shmb_reconnect(shmb_t *c)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_reconnect(c));
}
