// SPDX-License-Identifier: Apache-2.0
/*
 * The commands on objects: ls, put, get, rm and fetch (from another host,
 * through shmbroker-relay), with the files they read and write. Keys are
 * checked before connecting.
 */
#include "ctl_objects.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../proto/text.h"
#include "../proto/utf8.h"

int run_ls(shmb_t *c, struct ctl *ctl)
{
    const char *prefix = ctl->nargs ? ctl->args[0] : "";
    shmb_list_t *list = NULL;
    char key[ESC_MAX], state[ESC_MAX];
    size_t i;

    if (shmb_utf8_invalid_at(prefix, strlen(prefix)) < strlen(prefix)) {
        fprintf(stderr, "shmbrokerctl: EINVAL: the prefix must be valid UTF-8\n");
        return EXIT_USAGE;
    }
    if (shmb_list(c, prefix, SHMB_LIST_MAX_LIMIT, &list) < 0)
        return fail(c);
    printf("%-32s %12s %5s %7s %-9s %10s %12s\n", "KEY", "SIZE", "PINS", "READERS",
           "STATE", "AGE_MS", "OFFSET");
    for (i = 0; i < list->count; i++) {
        const shmb_object_info_t *o = &list->objects[i];

        printf("%-32s %12lld %5lld %7lld %-9s %10lld %12lld\n",
               esc(o->key, key, sizeof(key)), (long long)o->size, (long long)o->pins,
               (long long)o->readers, esc(o->state, state, sizeof(state)),
               (long long)o->age_ms, (long long)o->offset);
    }
    if (list->truncated)
        printf("(more objects not shown; narrow the prefix)\n");
    shmb_list_free(list);
    return 0;
}

/* Read all of fd into a malloc'ed buffer. */
static int read_all(int fd, char **out, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);

    if (buf == NULL)
        return -ENOMEM;
    for (;;) {
        ssize_t r;

        if (n == cap) {
            char *grown = realloc(buf, cap * 2);

            if (grown == NULL) {
                free(buf);
                return -ENOMEM;
            }
            buf = grown;
            cap *= 2;
        }
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int saved = errno;

            free(buf);
            return -saved;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* Read the input of put (a file, or standard input for "-") into
 * ctl->put_data (malloc'ed; main frees it) before connecting: a file that
 * cannot be read needs no daemon. 0 or the exit status. */
static int put_input(struct ctl *ctl)
{
    const char *file = ctl->args[1];
    int fd = strcmp(file, "-") == 0 ? STDIN_FILENO : open(file, O_RDONLY | O_CLOEXEC);
    int rc;

    if (fd < 0) {
        fprintf(stderr, "shmbrokerctl: cannot open %s: %s\n", file, strerror(errno));
        return EXIT_NO_INPUT;
    }
    rc = read_all(fd, &ctl->put_data, &ctl->put_len);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        fprintf(stderr, "shmbrokerctl: cannot read %s: %s\n", file, strerror(-rc));
        return EXIT_IO_ERROR;
    }
    if (ctl->put_len == 0) {
        free(ctl->put_data);
        ctl->put_data = NULL;
        fprintf(stderr, "shmbrokerctl: %s is empty; objects hold at least 1 byte\n",
                file);
        return EXIT_USAGE;
    }
    return 0;
}

/* Keys are checked before connecting: a key the ctl refuses is a usage
 * error, not the daemon's refusal. put reads its input then too. */
int key_prepare(struct ctl *ctl)
{
    return check_key_arg(ctl->args[0]);
}

int put_prepare(struct ctl *ctl)
{
    int rc = key_prepare(ctl);

    return rc != 0 ? rc : put_input(ctl);
}

int run_put(shmb_t *c, struct ctl *ctl)
{
    return shmb_put(c, ctl->args[0], ctl->put_data, ctl->put_len, 0) < 0 ? fail(c) : 0;
}

int run_rm(shmb_t *c, struct ctl *ctl)
{
    return shmb_delete(c, ctl->args[0]) < 0 ? fail(c) : 0;
}

int fetch_prepare(struct ctl *ctl)
{
    return check_key_arg(ctl->args[1]);
}

/* KEY from another host, through shmbroker-relay (shmb_fetch). */
int run_fetch(shmb_t *c, struct ctl *ctl)
{
    static char buf[SHMB_ESCAPED_MAX(1024)];

    if (shmb_fetch(c, ctl->args[0], ctl->args[1]) == 0)
        return 0;
    /* Not fail(): ENOTCONN and ECONNRESET here are the relay's or the
     * transfer's, not a lost connection to the daemon. */
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_errname(c),
            esc(shmb_errmsg(c), buf, sizeof(buf)));
    return EXIT_ERROR_REPLY;
}

/* Write len bytes to fd. */
static int write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int run_get(shmb_t *c, struct ctl *ctl)
{
    const char *key = ctl->args[0], *file = ctl->nargs == 2 ? ctl->args[1] : NULL;
    const void *p;
    size_t len;
    int fd, rc;

    if (shmb_get(c, key, &p, &len) < 0)
        return fail(c);
    fd = file == NULL || strcmp(file, "-") == 0
             ? STDOUT_FILENO
             : open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "shmbrokerctl: cannot open %s: %s\n", file, strerror(errno));
        shmb_release(c, key);
        return EXIT_CANT_CREATE;
    }
    rc = write_all(fd, p, len);
    if (fd != STDOUT_FILENO)
        close(fd);
    shmb_release(c, key);
    if (rc < 0) {
        fprintf(stderr, "shmbrokerctl: cannot write %s: %s\n", file ? file : "output",
                strerror(-rc));
        return EXIT_IO_ERROR;
    }
    return 0;
}
