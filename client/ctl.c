// SPDX-License-Identifier: Apache-2.0
/*
 * What the ctl's commands share: the command line as they need it, the
 * escaping of what other clients wrote, the error and its exit status, the
 * connection, and the pieces the plain views and the metrics both print.
 * Knows no command.
 */
#include "ctl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../proto/error.h"
#include "../proto/text.h"

/* The socket the ctl talks to, for messages. */
const char *ctl_socket;

/* s made safe for a terminal (control bytes and invalid UTF-8 as \xNN) in
 * buf; returns buf. Keys and names come from other clients: printed raw,
 * they could clear the screen, retitle the window or forge table rows. */
char *esc(const char *s, char *buf, size_t len)
{
    return shmb_escape(s != NULL ? s : "", s != NULL ? strlen(s) : 0, buf, len);
}

/* Print the daemon's (or the library's) error and return the exit status:
 * 69 when the connection was lost (the daemon exited or restarted). */
int fail(shmb_t *c)
{
    static char buf[SHMB_ESCAPED_MAX(1024)];

    if (shmb_errcode(c) == -ECONNRESET || shmb_errcode(c) == -ENOTCONN) {
        fprintf(stderr,
                "shmbrokerctl: lost the connection to shmbrokerd at %s (the daemon exited "
                "or restarted); run the command again once it is back\n",
                esc(shmb_socket_path(ctl_socket), buf, sizeof(buf)));
        return EXIT_UNAVAILABLE;
    }
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_errname(c),
            esc(shmb_errmsg(c), buf, sizeof(buf)));
    return EXIT_ERROR_REPLY;
}

/* A key the ctl refuses itself (not 1 to 255 bytes of UTF-8): usage. */
int check_key_arg(const char *key)
{
    struct shmb_error err;

    if (shmb_key_check(key, strlen(key), &err) == 0)
        return 0;
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_strerror(err.code), err.message);
    return EXIT_USAGE;
}

/* The broadcast queues, with their seats when seats, or NULL with the
 * error reported: none from a daemon that has no queues (ENOSYS). The
 * caller frees the list. */
shmb_queue_list_t *queues_of(shmb_t *c, bool seats, int *rc)
{
    shmb_queue_list_t *list = NULL;

    *rc = 0;
    if ((seats ? shmb_queue_list(c, &list) : shmb_queue_summary(c, &list)) < 0 &&
        shmb_errcode(c) != -ENOSYS)
        *rc = fail(c);
    return list;
}

/* Whether queue q is shown: every pool's, or pool's only. */
bool queue_shown(const shmb_queue_info_t *q, const char *pool)
{
    return pool == NULL || strcmp(q->pool, pool) == 0;
}

/* The "used" line of status: a bar of 40, the share, used of data_size and
 * what is free. */
void print_used(uint64_t used, uint64_t data_size, uint64_t free_bytes)
{
    char b[3][32], bar[41];
    double pct = data_size ? 100.0 * (double)used / (double)data_size : 0.0;
    int i, filled = (int)(pct * 40.0 / 100.0 + 0.5);

    for (i = 0; i < 40; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[40] = '\0';
    printf("used      [%s] %5.1f%%  %s of %s (%s free)\n", bar, pct,
           shmb_format_bytes(used, b[0], sizeof(b[0])),
           shmb_format_bytes(data_size, b[1], sizeof(b[1])),
           shmb_format_bytes(free_bytes, b[2], sizeof(b[2])));
}

/* Whether the connect failure of c is the daemon's refusal of the pool
 * (ENOENT: no such pool, the message listing them) rather than a missing
 * socket, which is ENOENT too: the socket is there. */
static int pool_refused(shmb_t *c, const char *socket_path, const char *pool)
{
    struct stat st;

    return pool != NULL && shmb_errcode(c) == -ENOENT &&
           stat(shmb_socket_path(socket_path), &st) == 0 && S_ISSOCK(st.st_mode);
}

/* Connect as shmbrokerctl (to pool, NULL: the default one; for a report,
 * to the default one when pool's group leaves this user out); on failure
 * print why (or, with why, keep it there) and return the exit status (69
 * when no daemon can be reached there), else 0 with *out. */
int ctl_connect(const char *socket_path, const char *pool, bool report,
                       shmb_t **out, struct ctl_failure *why)
{
    static char msg[SHMB_ESCAPED_MAX(1024)];
    shmb_t *c = shmb_new();
    int rc;

    *out = NULL;
    if (c == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        return EXIT_ERROR_REPLY;
    }
    /* Tools map the segment lazily: prefaulting is for workers' hot paths. */
    shmb_set_populate(c, 0);
    shmb_set_pool(c, pool);
    if (shmb_connect(c, socket_path, "shmbrokerctl") < 0) {
        /* A report of a pool whose group leaves this user out: its figures
         * are every client's to see, through a pool this user may use. */
        if (report && pool != NULL && shmb_errcode(c) == -EPERM) {
            shmb_close(c);
            return ctl_connect(socket_path, NULL, false, out, why);
        }
        if (why != NULL) {
            why->code = shmb_errcode(c);
            esc(shmb_errmsg(c), why->message, sizeof(why->message));
        } else {
            fprintf(stderr, "shmbrokerctl: %s\n", esc(shmb_errmsg(c), msg, sizeof(msg)));
        }
        rc = pool_refused(c, socket_path, pool) ? EXIT_ERROR_REPLY
             : shmb_errcode(c) == -ECONNREFUSED || shmb_errcode(c) == -ENOENT ||
                     shmb_errcode(c) == -EAGAIN ||
                     shmb_errcode(c) == -EACCES || shmb_errcode(c) == -ENOTDIR ||
                     shmb_errcode(c) == -ECONNRESET || shmb_errcode(c) == -ENAMETOOLONG
                 ? EXIT_UNAVAILABLE
                 : EXIT_ERROR_REPLY;
        shmb_close(c);
        return rc;
    }
    *out = c;
    return 0;
}
