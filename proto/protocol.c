// SPDX-License-Identifier: Apache-2.0
/*
 * Protocol helpers used by both ends of the socket.
 */
#include "protocol.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "alloc.h"

const struct shmb_op_info shmb_ops[SHMB_OP_COUNT] = {
#define SHMB_OP(id, name, flags, usage) [SHMB_OP_##id] = {#name, flags, usage},
#include "ops.def"
#undef SHMB_OP
};

const struct shmb_stat_info shmb_stat_fields[SHMB_STAT_COUNT] = {
#define SHMB_STAT(id, name, kind) [SHMB_STAT_##id] = {#name, kind},
#include "stats.def"
#undef SHMB_STAT
};

int shmb_op_find(const char *name)
{
    int i;

    for (i = 0; i < SHMB_OP_COUNT; i++)
        if (strcmp(shmb_ops[i].name, name) == 0)
            return i;
    return -1;
}

const char *shmb_op_names(char *buf, size_t len, unsigned flags, const char *last_sep)
{
    size_t used = 0, n = 0, total = 0;
    int i;

    for (i = 0; i < SHMB_OP_COUNT; i++)
        total += (shmb_ops[i].flags & flags) == flags;
    if (len > 0)
        buf[0] = '\0';
    for (i = 0; i < SHMB_OP_COUNT && used < len; i++) {
        if ((shmb_ops[i].flags & flags) != flags)
            continue;
        n++;
        used += (size_t)snprintf(buf + used, len - used, "%s%s",
                                 n == 1 ? "" : n == total ? last_sep : ", ",
                                 shmb_ops[i].name);
    }
    return buf;
}

int shmb_user_socket_path(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
    int n;

    if (xdg != NULL && xdg[0] == '/')
        n = snprintf(buf, len, "%s/" SHMB_USER_SOCKET_DIR "/" SHMB_USER_SOCKET_NAME, xdg);
    else
        n = snprintf(buf, len, SHMB_USER_SOCKET_TMP "%u/" SHMB_USER_SOCKET_NAME,
                     (unsigned)geteuid());
    if (n < 0 || (size_t)n >= len || (size_t)n >= max)
        return -ENAMETOOLONG;
    return 0;
}

int shmb_user_socket_dir_check(const char *dir, struct shmb_error *err)
{
    struct shmb_error ignored;
    struct stat st;

    if (err == NULL)
        err = &ignored;
    if (lstat(dir, &st) != 0)
        return shmb_error_set(err, -errno, "Cannot look at the socket directory %s: %s.",
                              dir, strerror(errno));
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0)
        return shmb_error_set(
            err, -EPERM,
            "%s is not a private directory of this user's (uid %u): it is %s of uid %u "
            "with mode %04o, so whoever made it could swap the socket. Remove it, or "
            "choose the socket with --socket or $%s.",
            dir, (unsigned)geteuid(),
            S_ISLNK(st.st_mode)   ? "a symbolic link"
            : S_ISDIR(st.st_mode) ? "a directory"
                                  : "a file",
            (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), SHMB_SOCKET_ENV);
    return 0;
}

int shmb_user_socket_dir_prepare(const char *dir, struct shmb_error *err)
{
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return shmb_error_set(err, -errno,
                              "Cannot create directory %s for the socket: %s. Choose the "
                              "socket with --socket or $%s.",
                              dir, strerror(errno), SHMB_SOCKET_ENV);
    return shmb_user_socket_dir_check(dir, err);
}

const char *shmb_socket_path(const char *explicit_path)
{
    static _Thread_local char user[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char dir[sizeof(user)];
    const char *env;
    struct stat st;

    if (explicit_path != NULL && explicit_path[0] != '\0')
        return explicit_path;
    env = getenv(SHMB_SOCKET_ENV);
    if (env != NULL && env[0] != '\0')
        return env;
    /* Root's daemon is the system's. Another user's own daemon (one that
     * could not write /run/shmbroker) is found where it listens; without
     * one, the system's daemon is the one to ask. */
    if (geteuid() != 0 && shmb_user_socket_path(user, sizeof(user)) == 0 &&
        stat(user, &st) == 0 && S_ISSOCK(st.st_mode)) {
        memcpy(dir, user, sizeof(dir));
        *strrchr(dir, '/') = '\0';
        if (shmb_user_socket_dir_check(dir, NULL) == 0)
            return user;
    }
    return SHMB_DEFAULT_SOCKET;
}

int shmb_json_append(struct line *l, const json_t *value)
{
    size_t need = json_dumpb(value, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);

    /* Sized first, then written straight into the buffer: no copy. */
    if (need == 0 || line_reserve(l, need) < 0 ||
        json_dumpb(value, l->buf + l->len, need, JSON_COMPACT | JSON_ENCODE_ANY) != need)
        return -ENOMEM;
    l->len += need;
    return 0;
}

int shmb_json_append_line(struct line *l, const json_t *value)
{
    if (shmb_json_append(l, value) < 0)
        return -ENOMEM;
    return line_lit(l, "\n");
}

json_t *shmb_error_reply(const json_t *id, int code, const char *message)
{
    json_t *reply = json_pack("{s:b, s:s, s:s}", "ok", 0, "error", shmb_error_name(code),
                              "message", message);

    if (reply != NULL && id != NULL &&
        json_object_set_new(reply, "id", json_deep_copy(id)) != 0) {
        json_decref(reply);
        return NULL;
    }
    return reply;
}

int shmb_parse_reply(const char *line, size_t len, json_t **reply, struct shmb_error *err)
{
    return shmb_parse_reply_id(line, len, reply, NULL, err);
}

int shmb_parse_reply_id(const char *line, size_t len, json_t **reply, json_t **id,
                        struct shmb_error *err)
{
    json_error_t jerr;
    json_t *value, *ok;
    const char *code = NULL, *message = NULL;
    int rc;

    *reply = NULL;
    if (id != NULL)
        *id = NULL;
    value = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (value == NULL || !json_is_object(value)) {
        json_decref(value);
        return shmb_error_set(err, -EPROTO,
                              "shmbrokerd sent a reply that is not a JSON "
                              "object (%s).",
                              value == NULL ? jerr.text : "wrong type");
    }
    if (id != NULL)
        *id = json_incref(json_object_get(value, "id"));
    ok = json_object_get(value, "ok");
    if (json_is_true(ok)) {
        *reply = value;
        return 0;
    }
    if (!json_is_false(ok) ||
        json_unpack(value, "{s:s, s:s}", "error", &code, "message", &message) != 0) {
        json_decref(value);
        return shmb_error_set(err, -EPROTO,
                              "shmbrokerd sent a reply without \"ok\", "
                              "\"error\" and \"message\".");
    }
    rc = shmb_error_set(err, shmb_error_from_name(code), "%s", message);
    json_decref(value);
    return rc;
}
