// SPDX-License-Identifier: Apache-2.0
/*
 * shmb_fetch: an object from another host, through the relays. The library
 * asks the local shmbroker-relay on its socket (the daemon's path with
 * SHMB_RELAY_SOCKET_SUFFIX), one JSON line each way; the relays move the
 * bytes and the object lands in the local pool under the same key. Knows the
 * relay's socket, not UCX.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

#define FETCH_REPLY_MAX (64 * 1024) /* a relay's answer is a line of JSON; longer is a bug */
#define FETCH_PEER_MAX 64           /* the relay's peer names */

/* Free text jansson made (json_dumps): with the allocator the application
 * may have given jansson, not necessarily free(). */
static void fetch_free_json_text(char *s)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    if (s)
        f(s);
}

/* Send all of buf on sock. */
static int fetch_send_all(int sock, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(sock, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Ask the relay: one request line out, one reply line back (the caller
 * owns *reply). */
static int fetch_ask(shmb_t *c, const char *path, const char *line, json_t **reply)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    char buf[FETCH_REPLY_MAX];
    size_t got = 0;
    json_error_t jerr;
    int sock = -1, rc, saved;

    if (strlen(path) >= sizeof(sun.sun_path))
        return shmb_error_set(&c->err, -ENAMETOOLONG, "The relay's socket path %s is too long.",
                              path);
    strcpy(sun.sun_path, path);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return shmb_error_set(&c->err, -errno, "Cannot make a socket: %s.", strerror(errno));
    if (connect(sock, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        saved = errno;
        close(sock);
        return shmb_error_set(&c->err, -ENOTCONN,
                              "No relay answers at %s (%s): start shmbroker-relay next to "
                              "the daemon to fetch from other hosts.",
                              path, strerror(saved));
    }
    if ((rc = fetch_send_all(sock, line, strlen(line))) < 0) {
        close(sock);
        return shmb_error_set(&c->err, -ECONNRESET, "Cannot send to the relay at %s: %s.",
                              path, strerror(-rc));
    }
    for (;;) {
        ssize_t n;
        if (got == sizeof(buf)) {
            close(sock);
            return shmb_error_set(&c->err, -EBADMSG,
                                  "The relay at %s answered with more than %d bytes "
                                  "without an end of line.", path, FETCH_REPLY_MAX);
        }
        n = recv(sock, buf + got, sizeof(buf) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            saved = n < 0 ? errno : 0;
            close(sock);
            return shmb_error_set(&c->err, -ECONNRESET,
                                  "The relay at %s closed the connection before it "
                                  "answered%s%s; is it still running?",
                                  path, saved ? ": " : "", saved ? strerror(saved) : "");
        }
        if (memchr(buf + got, '\n', (size_t)n)) {
            got += (size_t)n;
            break;
        }
        got += (size_t)n;
    }
    close(sock);
    *reply = json_loadb(buf, (size_t)((char *)memchr(buf, '\n', got) - buf),
                        JSON_REJECT_DUPLICATES, &jerr);
    if (!*reply || !json_is_object(*reply)) {
        json_decref(*reply);
        *reply = NULL;
        return shmb_error_set(&c->err, -EBADMSG, "The relay at %s answered with %s.", path,
                              "something that is not a JSON object");
    }
    return 0;
}

/* The relay's socket, beside the daemon's this handle connected to, into
 * path (len bytes); -ENOTCONN when the handle never connected. */
static int fetch_relay_path(shmb_t *c, char *path, size_t len)
{
    if (!c->path[0])
        return shmb_error_set(&c->err, -ENOTCONN,
                              "This handle was never connected: shmb_connect first (the "
                              "relay's socket is found next to the daemon's).");
    snprintf(path, len, "%s%s", c->path, SHMB_RELAY_SOCKET_SUFFIX);
    return 0;
}

int shmb_fetch(shmb_t *c, const char *peer, const char *key)
{
    struct client_key k;
    char path[sizeof(c->path) + sizeof(SHMB_RELAY_SOCKET_SUFFIX)];
    json_t *req = NULL, *reply = NULL;
    char *line = NULL;
    char out[4096]; /* a key of 255 bytes escaped and a peer name fit */
    size_t pl;
    int rc;

    if ((rc = client_enter(c)) < 0)
        return rc;
    if ((rc = client_check_key(c, key, &k)) < 0)
        goto done;
    pl = peer ? strlen(peer) : 0;
    if (pl == 0 || pl > FETCH_PEER_MAX ||
        strspn(peer, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") !=
            pl) {
        rc = shmb_error_set(&c->err, -EINVAL,
                            "A peer is named by 1 to %d of A-Z a-z 0-9 - _ . (as the relay's "
                            "--peer NAME=ADDR:PORT), not %zu bytes like that.",
                            FETCH_PEER_MAX, pl);
        goto done;
    }
    if ((rc = fetch_relay_path(c, path, sizeof(path))) < 0)
        goto done;
    req = json_pack("{s:s, s:s, s:s}", "op", "fetch", "peer", peer, "key", key);
    line = req ? json_dumps(req, JSON_COMPACT) : NULL;
    if (!line) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a fetch request.");
        goto done;
    }
    if (snprintf(out, sizeof(out), "%s\n", line) >= (int)sizeof(out)) {
        rc = shmb_error_set(&c->err, -EINVAL, "A fetch request over %zu bytes.", sizeof(out));
        goto done;
    }
    if ((rc = fetch_ask(c, path, out, &reply)) < 0)
        goto done;
    if (json_is_true(json_object_get(reply, "ok"))) {
        shmb_error_clear(&c->err);
        rc = 0;
    } else {
        const char *name = json_string_value(json_object_get(reply, "error"));
        const char *msg = json_string_value(json_object_get(reply, "message"));
        int code = name ? shmb_error_from_name(name) : 0;
        rc = shmb_error_set(&c->err, code < 0 ? code : -EIO, "%s",
                            msg ? msg : "The relay refused the fetch without saying why.");
    }
done:
    json_decref(req);
    json_decref(reply);
    fetch_free_json_text(line);
    return client_done(c, rc);
}

int shmb_relay_status(shmb_t *c, char **json)
{
    char path[sizeof(c->path) + sizeof(SHMB_RELAY_SOCKET_SUFFIX)];
    json_t *reply = NULL;
    char *text = NULL;
    int rc;

    *json = NULL;
    if ((rc = client_enter(c)) < 0)
        return rc;
    if ((rc = fetch_relay_path(c, path, sizeof(path))) < 0)
        goto done;
    if ((rc = fetch_ask(c, path, "{\"op\":\"status\"}\n", &reply)) < 0)
        goto done;
    if (!json_is_true(json_object_get(reply, "ok"))) {
        const char *msg = json_string_value(json_object_get(reply, "message"));
        rc = shmb_error_set(&c->err, -EIO, "The relay at %s refused status: %s", path,
                            msg ? msg : "no reason given");
        goto done;
    }
    text = json_dumps(reply, JSON_COMPACT);
    if (!text || !(*json = malloc(strlen(text) + 1))) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for the relay's status.");
        goto done;
    }
    strcpy(*json, text);
    shmb_error_clear(&c->err);
done:
    fetch_free_json_text(text);
    json_decref(reply);
    return client_done(c, rc);
}
