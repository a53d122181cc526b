// SPDX-License-Identifier: Apache-2.0
/*
 * The record of the segment files a daemon holds: a line per segment,
 * "<size> <name> <dir>", each name and directory with the bytes below '!',
 * '%' and DEL written as %XX, so that a name with spaces or a newline reads
 * back as written. It lives beside the socket, in the run directory the
 * daemon's user owns. Nothing here removes a segment: --remove-segment does,
 * with segment_remove_orphaned's checks (not held by a live daemon, the
 * segment's magic, this user's file), and reads only a record that is this
 * user's alone: its lines name files anywhere.
 */
#include "held.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first line: a record of another format is not read as this one. */
#define HELD_MAGIC "shmbroker-segments 1"

int held_path(const char *socket_path, char *out, size_t len)
{
    int n = snprintf(out, len, "%s.segments", socket_path);

    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* s, escaped, onto f. */
static void held_put(FILE *f, const char *s)
{
    const unsigned char *p;

    for (p = (const unsigned char *)s; *p != '\0'; p++)
        if (*p <= ' ' || *p == '%' || *p == 0x7f)
            fprintf(f, "%%%02X", *p);
        else
            fputc(*p, f);
}

/* One escaped field of in (up to a space or the end) into out; the rest of
 * in after it, or NULL when it is empty, too long or badly escaped. */
static const char *held_get(const char *in, char *out, size_t len)
{
    size_t n = 0;
    unsigned v;

    while (*in != '\0' && *in != ' ' && *in != '\n') {
        if (n + 1 >= len)
            return NULL;
        if (*in == '%') {
            if (sscanf(in + 1, "%2x", &v) != 1 || v == 0 || in[1] == '\0' || in[2] == '\0')
                return NULL;
            out[n++] = (char)v;
            in += 3;
        } else {
            out[n++] = *in++;
        }
    }
    out[n] = '\0';
    return n > 0 ? in : NULL;
}

/* One line into e: true when it is an entry. */
static bool held_parse(const char *line, struct held_segment *e)
{
    char *end;
    unsigned long long size;

    if (line[0] < '0' || line[0] > '9')
        return false;
    errno = 0;
    size = strtoull(line, &end, 10);
    if (errno != 0 || *end != ' ' || size == 0)
        return false;
    e->size = size;
    if ((line = held_get(end + 1, e->name, sizeof(e->name))) == NULL || *line != ' ')
        return false;
    if ((line = held_get(line + 1, e->dir, sizeof(e->dir))) == NULL ||
        (*line != '\0' && *line != '\n'))
        return false;
    /* Only what a pool can be: an absolute directory, a name without '/'. */
    return e->dir[0] == '/' && strchr(e->name, '/') == NULL && strcmp(e->name, ".") != 0 &&
           strcmp(e->name, "..") != 0;
}

int held_read(const char *path, struct held_segment *out, size_t max, size_t *n,
              unsigned *bad, struct shmb_error *err)
{
    char line[PATH_MAX * 3 + NAME_MAX * 3 + 64];
    unsigned skipped = 0;
    bool first = true;
    struct stat st;
    FILE *f;
    int fd;

    *n = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int saved = errno;

        if (saved == ENOENT)
            return 0;
        return shmb_error_set(err, -saved, "Cannot read the record of held segments %s: %s.",
                              path, strerror(saved));
    }
    /* Its lines name files to remove: a record another user owns, or one
     * others may write (beside a socket a careless user put in /tmp), could
     * have been planted there to remove this user's files. */
    if (fstat(fd, &st) != 0) {
        int saved = errno;

        close(fd);
        return shmb_error_set(err, -saved, "Cannot read %s: %s.", path, strerror(saved));
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0 ||
        st.st_nlink != 1) {
        close(fd);
        return shmb_error_set(err, -EPERM,
                              "%s, the record of held segments, is owned by uid %u with "
                              "mode %04o and %llu link(s): others may write it, or it is "
                              "not this user's (uid %u); it is not read, and only the "
                              "segments the settings name are removed. Remove it (as its "
                              "owner or root) if no daemon of yours wrote it.",
                              path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                              (unsigned long long)st.st_nlink, (unsigned)geteuid());
    }
    if ((f = fdopen(fd, "r")) == NULL) {
        int saved = errno;

        close(fd);
        return shmb_error_set(err, -saved, "Cannot read %s: %s.", path, strerror(saved));
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        size_t len = strlen(line);

        /* A line longer than any entry: skip the rest of it. */
        if (len > 0 && line[len - 1] != '\n' && !feof(f)) {
            int c;

            while ((c = fgetc(f)) != EOF && c != '\n')
                ;
            skipped++;
            first = false;
            continue;
        }
        if (first) {
            first = false;
            if (strncmp(line, HELD_MAGIC, strlen(HELD_MAGIC)) == 0)
                continue;
            fclose(f);
            return shmb_error_set(err, -EINVAL,
                                  "%s is not a record of held segments (its first line is "
                                  "not \"" HELD_MAGIC "\"); left alone.",
                                  path);
        }
        if (*n < max && held_parse(line, &out[*n]))
            (*n)++;
        else
            skipped++;
    }
    fclose(f);
    if (bad != NULL)
        *bad = skipped;
    return 0;
}

/* Whether e is among list[0..n). */
static bool held_has(const struct held_segment *list, size_t n, const struct held_segment *e)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (strcmp(list[i].dir, e->dir) == 0 && strcmp(list[i].name, e->name) == 0)
            return true;
    return false;
}

int held_update(const char *path, const struct held_segment *ours, size_t n_ours,
                struct shmb_error *err)
{
    static struct held_segment old[HELD_MAX], all[HELD_MAX];
    char tmp[PATH_MAX], file[PATH_MAX * 2];
    size_t n_old = 0, n = 0, i;
    struct stat st;
    FILE *f = NULL;
    int fd = -1, saved;

    /* An unreadable record is replaced: it can only say less than ours. */
    if (held_read(path, old, HELD_MAX, &n_old, NULL, NULL) < 0)
        n_old = 0;
    for (i = 0; i < n_ours && n < HELD_MAX; i++)
        if (!held_has(all, n, &ours[i]))
            all[n++] = ours[i];
    for (i = 0; i < n_old && n < HELD_MAX; i++) {
        int w = snprintf(file, sizeof(file), "%.*s/%.*s", PATH_MAX, old[i].dir, NAME_MAX,
                         old[i].name);

        if (w > 0 && (size_t)w < sizeof(file) && !held_has(all, n, &old[i]) &&
            lstat(file, &st) == 0 && S_ISREG(st.st_mode))
            all[n++] = old[i];
    }
    if (n == 0) {
        if (unlink(path) != 0 && errno != ENOENT) {
            saved = errno;
            return shmb_error_set(err, -saved, "Cannot remove %s: %s.", path,
                                  strerror(saved));
        }
        return 0;
    }
    if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
        return shmb_error_set(err, -ENAMETOOLONG, "%s.new is longer than %zu bytes.", path,
                              sizeof(tmp) - 1);
    (void)unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 || (f = fdopen(fd, "w")) == NULL) {
        saved = errno;
        if (fd >= 0)
            close(fd);
        return shmb_error_set(err, -saved,
                              "Cannot write %s, the record of the segments this daemon "
                              "holds: %s. A stop through --remove-segment removes only the "
                              "segments the settings name then.",
                              tmp, strerror(saved));
    }
    fprintf(f, HELD_MAGIC "\n");
    for (i = 0; i < n; i++) {
        fprintf(f, "%llu ", (unsigned long long)all[i].size);
        held_put(f, all[i].name);
        fputc(' ', f);
        held_put(f, all[i].dir);
        fputc('\n', f);
    }
    saved = 0;
    if (fflush(f) != 0 || ferror(f))
        saved = errno != 0 ? errno : EIO;
    if (fclose(f) != 0 && saved == 0)
        saved = errno != 0 ? errno : EIO;
    if (saved == 0 && rename(tmp, path) != 0)
        saved = errno;
    if (saved != 0) {
        (void)unlink(tmp);
        return shmb_error_set(err, -saved, "Cannot write %s: %s.", path, strerror(saved));
    }
    return 0;
}
