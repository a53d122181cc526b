// SPDX-License-Identifier: Apache-2.0
/*
 * Flags and defaults for shmbrokerd: the values a flag takes (bytes, times,
 * counts, ids), the table of flags and their usage text, and the --config
 * file read into arguments. The --pool values are config_pool.c's, the
 * flags' handlers and config_parse config_flags.c's.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/protocol.h"
#include "config_inner.h"
#include "log.h"
#include "segment.h"
#include "store.h"

/* The whole number text starts with (digits first: no sign, no space);
 * *end points after it. -EINVAL or -ERANGE. */
int config_leading_number(const char *text, unsigned long long *value, char **end)
{
    if (text == NULL || text[0] < '0' || text[0] > '9')
        return -EINVAL;
    errno = 0;
    *value = strtoull(text, end, 10);
    return errno == ERANGE ? -ERANGE : 0;
}

/* Every long option; the --config file accepts the same names. */
const struct option config_option_table[] = {
    {"size", required_argument, NULL, OPT_SIZE},
    {"max-object-size", required_argument, NULL, OPT_MAX_OBJECT},
    {"max-objects", required_argument, NULL, OPT_MAX_OBJECTS},
    {"name", required_argument, NULL, OPT_NAME},
    {"shm-dir", required_argument, NULL, OPT_SHM_DIR},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"socket-mode", required_argument, NULL, OPT_SOCKET_MODE},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"version", no_argument, NULL, OPT_VERSION},
    {"fresh", no_argument, NULL, OPT_FRESH},
    {"alloc-timeout", required_argument, NULL, OPT_ALLOC_TIMEOUT},
    {"read-lease", required_argument, NULL, OPT_READ_LEASE},
    {"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
    {"max-clients-per-uid", required_argument, NULL, OPT_MAX_CLIENTS_PER_UID},
    {"max-pins", required_argument, NULL, OPT_MAX_PINS},
    {"max-pending", required_argument, NULL, OPT_MAX_PENDING},
    {"max-queued-output", required_argument, NULL, OPT_MAX_QUEUED_OUTPUT},
    {"max-queues", required_argument, NULL, OPT_MAX_QUEUES},
    {"max-queue-bytes", required_argument, NULL, OPT_MAX_QUEUE_BYTES},
    {"queue-lease", required_argument, NULL, OPT_QUEUE_LEASE},
    {"hello-timeout", required_argument, NULL, OPT_HELLO_TIMEOUT},
    {"stop-with-pid", required_argument, NULL, OPT_STOP_WITH_PID},
    {"keep-segment", no_argument, NULL, OPT_KEEP_SEGMENT},
    {"remove-segment", no_argument, NULL, OPT_REMOVE_SEGMENT},
    {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
    {"reload", required_argument, NULL, OPT_RELOAD},
    {"check", no_argument, NULL, OPT_CHECK},
    {"pool", required_argument, NULL, OPT_POOL},
    {"allow-uid", required_argument, NULL, OPT_ALLOW_UID},
    {"allow-gid", required_argument, NULL, OPT_ALLOW_GID},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"log-file", required_argument, NULL, OPT_LOG_FILE},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static const struct option *config_options(void)
{
    return config_option_table;
}

int config_parse_size(const char *text, uint64_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {
        {"", 0},     {"B", 0},   {"K", 10},   {"KiB", 10}, {"M", 20},
        {"MiB", 20}, {"G", 30},  {"GiB", 30}, {"T", 40},   {"TiB", 40},
        {"k", 10},   {"KB", 10}, {"MB", 20},  {"GB", 30},  {"TB", 40},
    };
    unsigned long long value;
    char *end;
    size_t i;
    int rc;

    if ((rc = config_leading_number(text, &value, &end)) < 0)
        return rc;
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            if (units[i].shift && value > (UINT64_MAX >> units[i].shift))
                return -ERANGE;
            *out = (uint64_t)value << units[i].shift;
            return 0;
        }
    }
    return -EINVAL;
}

int config_parse_duration(const char *text, uint64_t *out_ms)
{
    unsigned long long value;
    uint64_t scale;
    char *end;
    int rc;

    if ((rc = config_leading_number(text, &value, &end)) < 0)
        return rc;
    if (strcmp(end, "") == 0 || strcmp(end, "s") == 0)
        scale = 1000;
    else if (strcmp(end, "ms") == 0)
        scale = 1;
    else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
        scale = 60000;
    else if (strcmp(end, "h") == 0)
        scale = 3600000;
    else
        return -EINVAL;
    if (value > UINT64_MAX / scale)
        return -ERANGE;
    *out_ms = value * scale;
    return 0;
}

/* A user (user) or group name, or a numeric uid or gid below the (id_t)-1
 * that means "none". -ENOENT when it is neither. */
int config_parse_id(const char *text, bool user, id_t *out)
{
    unsigned long v;
    struct passwd *pw;
    struct group *gr;
    char *end;

    errno = 0;
    v = strtoul(text, &end, 10);
    if (text[0] != '\0' && *end == '\0' && errno == 0 && v < (unsigned long)(id_t)-1) {
        *out = (id_t)v;
        return 0;
    }
    if (user && (pw = getpwnam(text)) != NULL)
        *out = pw->pw_uid;
    else if (!user && (gr = getgrnam(text)) != NULL)
        *out = gr->gr_gid;
    else
        return -ENOENT;
    return 0;
}

/* One --allow-uid (uid) or --allow-gid entry: a name or a number, at most
 * POLICY_MAX_ALLOW of each. */
int config_add_allowed(struct policy *p, bool uid, const char *arg,
                       struct shmb_error *err)
{
    size_t *n = uid ? &p->n_allow_uid : &p->n_allow_gid;
    int rc = -EINVAL;
    id_t id;

    if (*n < POLICY_MAX_ALLOW && (rc = config_parse_id(arg, uid, &id)) == 0) {
        if (uid)
            p->allow_uid[*n] = (uid_t)id;
        else
            p->allow_gid[*n] = (gid_t)id;
    }
    if (rc < 0)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --allow-%s '%s': expected a %s name or %s (at most "
                              "%d of them).",
                              uid ? "uid" : "gid", arg, uid ? "user" : "group",
                              uid ? "uid" : "gid", POLICY_MAX_ALLOW);
    (*n)++;
    return 0;
}

/* A count flag: a whole number from 0 (no limit) up to max. */
int config_parse_count(const char *flag, const char *text, uint64_t max,
                       uint64_t *out, struct shmb_error *err)
{
    unsigned long long v;
    char *end;

    errno = 0;
    v = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || v > max)
        return shmb_error_set(
            err, -EINVAL,
            "Invalid %s '%s': expected a whole number from 0 (no limit) "
            "to %llu.",
            flag, text, (unsigned long long)max);
    *out = v;
    return 0;
}

void config_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: shmbrokerd [OPTION]...\n"
        "Own a shared-memory segment and hand out space in it to local clients.\n"
        "\n"
        "  --size BYTES             segment size, header page included (default 256M)\n"
        "  --max-object-size BYTES  largest object (default: the smaller of 128M,\n"
        "                           half of --size and what one object can hold)\n"
        "  --max-objects N          objects the catalog of reads in place is sized\n"
        "                           for (default: one per 2 KiB of --size)\n"
        "  --name NAME              segment file name in --shm-dir (default %s)\n"
        "  --shm-dir DIR            shared-memory directory: a tmpfs or hugetlbfs\n"
        "                           mount (default %s)\n"
        "  --pool NAME:SIZE[,max-object-size=BYTES][,group=GROUP]\n"
        "         [,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N]\n"
        "         [,max-queue-bytes=BYTES]\n"
        "                           pool NAME of SIZE, its own segment: the file\n"
        "                           --name.NAME in --shm-dir or dir=, a memfd, or a\n"
        "                           file on the hugetlbfs mount dir=; group= admits\n"
        "                           only that group. Repeatable, up to %d; the first\n"
        "                           is the default pool; a later --pool NAME replaces\n"
        "                           the earlier one in its place. Without --pool, one\n"
        "                           pool: the segment --name of --size in --shm-dir\n"
        "  --socket PATH            control socket (default: $%s, else\n"
        "                           %s; a user who cannot write\n"
        "                           /run/shmbroker: $XDG_RUNTIME_DIR/shmbroker/,\n"
        "                           else /tmp/shmbroker-UID/)\n"
        "  --socket-mode MODE       octal file mode of the socket (default 0660)\n"
        "  --log-level LEVEL        error, warn, info or debug (default info)\n"
        "  --log-file PATH          append logs to PATH instead of stderr; SIGHUP\n"
        "                           reopens it\n"
        "  --config FILE            settings as 'name = value' lines, named after\n"
        "                           these options; flags override them\n"
        "  --fresh                  discard a segment left by a daemon that died\n"
        "                           (default: adopt it and keep its objects)\n"
        "  --stop-with-pid PID      stop, as on SIGTERM, when process PID exits (a\n"
        "                           private daemon a program starts for itself)\n"
        "  --keep-segment           a clean stop leaves the segment and its objects\n"
        "                           for the next start to adopt (default: remove it)\n"
        "  --alloc-timeout TIME     drop allocations not committed within TIME\n"
        "                           (default 60s; 0 = never)\n"
        "  --read-lease TIME        awaited reads stop holding an object TIME after\n"
        "                           its commit (default 0 = they hold it until read)\n"
        "  --max-clients N          connections at once (default %d; 0 = no limit)\n"
        "  --max-clients-per-uid N  connections of one user (default %d)\n"
        "  --max-pins N             pins one connection may hold (default %d)\n"
        "  --max-pending N          uncommitted allocations per connection (default %d)\n"
        "  --max-queued-output BYTES  replies a client may leave unread before it is\n"
        "                           disconnected (default 1M)\n"
        "  --max-queues N           queues of one pool at once (default: %d shared\n"
        "                           out among the pools; a pool's max-queues= wins)\n"
        "  --max-queue-bytes BYTES  bytes of one pool's queues (default: the larger\n"
        "                           of the pool's size and 256M; max-queue-bytes=)\n"
        "  --queue-lease TIME       delete a queue nobody has held for TIME\n"
        "                           (default 10m; 0 = never)\n"
        "  --hello-timeout TIME     close a connection that has not said hello\n"
        "                           within TIME (default 10s; 0 = never)\n"
        "  --allow-uid USER         only this user may connect (repeatable; with\n"
        "                           --allow-gid, either may); root and the daemon's\n"
        "                           own user always may\n"
        "  --allow-gid GROUP        only members of this group may connect (repeatable)\n"
        "  --version                print the version and exit\n"
        "  --help                   print this help and exit\n"
        "\n"
        "Instead of running (with the same settings, to name the same segment):\n"
        "  --check-config           check the settings and the --config file, exit\n"
        "  --check                  report whether the pools fit here: free space,\n"
        "                           memory and its cgroup limit, huge pages, and the\n"
        "                           fix when they do not (exit 0 fit, 1 not, 2 bad\n"
        "                           settings)\n"
        "  --reload PID             check them, then make the shmbrokerd running as\n"
        "                           PID re-read them (SIGHUP)\n"
        "  --remove-segment         remove the segment a stopped daemon left\n"
        "\n"
        "Sizes take K, M, G (or KiB, MiB, GiB) suffixes; all are powers of 1024.\n"
        "Times take ms, s, m or h suffixes; a bare number is seconds.\n",
        CONFIG_DEFAULT_NAME, CONFIG_DEFAULT_SHM_DIR, CONFIG_MAX_POOLS, SHMB_SOCKET_ENV,
        SHMB_DEFAULT_SOCKET, CONFIG_DEFAULT_MAX_CLIENTS,
        CONFIG_DEFAULT_MAX_CLIENTS_PER_UID, CONFIG_DEFAULT_MAX_PINS,
        CONFIG_DEFAULT_MAX_PENDING, CONFIG_QUEUES_MAX);
}

/* Copy a string flag into a fixed buffer; -ENAMETOOLONG names the limit. */
int config_copy(char *dst, size_t len, const char *flag, const char *value,
                struct shmb_error *err)
{
    if (strlen(value) >= len)
        return shmb_error_set(err, -ENAMETOOLONG, "%s is longer than %zu bytes: %s", flag,
                              len - 1, value);
    if (value[0] == '\0')
        return shmb_error_set(err, -EINVAL, "%s must not be empty.", flag);
    memcpy(dst, value, strlen(value) + 1);
    return 0;
}

/* Append one argument (copied), from line of the file (0: the command
 * line); -ENOMEM. */
int config_args_add(struct config_args *a, const char *arg, int line)
{
    char *copy;

    if (a->argc + 1 >= a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        char **grown = shmb_realloc(a->argv, (size_t)cap * sizeof(*grown));
        char **grown_own;
        int *grown_line;

        if (grown == NULL)
            return -ENOMEM;
        a->argv = grown;
        if ((grown_own = shmb_realloc(a->own, (size_t)cap * sizeof(*grown_own))) == NULL)
            return -ENOMEM;
        a->own = grown_own;
        if ((grown_line = shmb_realloc(a->line, (size_t)cap * sizeof(*grown_line))) ==
            NULL)
            return -ENOMEM;
        a->line = grown_line;
        a->cap = cap;
    }
    if ((copy = shmb_strndup(arg, strlen(arg))) == NULL)
        return -ENOMEM;
    a->own[a->argc] = copy;
    a->line[a->argc] = line;
    a->argv[a->argc++] = copy;
    a->argv[a->argc] = NULL;
    return 0;
}

void config_args_free(struct config_args *a)
{
    int i;

    for (i = 0; i < a->argc; i++)
        shmb_free(a->own[i]);
    shmb_free(a->argv);
    shmb_free(a->own);
    shmb_free(a->line);
    memset(a, 0, sizeof(*a));
}

/* When the argument err is about (a->culprit, a pointer into one of the
 * strings, as optarg of --flag=value is) came from a line of the file,
 * put "FILE:LINE: " before the message, as the file's own errors have. */
void config_args_blame(const struct config_args *a, struct shmb_error *err)
{
    char message[SHMB_ERROR_MSG_MAX];
    int i;

    if (a->culprit == NULL || a->file == NULL || err == NULL || err->code == 0)
        return;
    for (i = 0; i < a->argc; i++) {
        const char *s = a->own[i];

        if (a->culprit >= s && a->culprit <= s + strlen(s))
            break;
    }
    if (i == a->argc || a->line[i] == 0)
        return;
    snprintf(message, sizeof(message), "%s", err->message);
    shmb_error_set(err, err->code, "%s:%d: %s", a->file, a->line[i], message);
}

/* Strip blanks at both ends of s in place. */
char *config_trim(char *s)
{
    char *end;

    while (*s == ' ' || *s == '\t')
        s++;
    end = s + strlen(s);
    while (end > s &&
           (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

/* Read the whole of path into a NUL-terminated buffer the caller frees
 * (shmb_free). Only a regular file of at most CONFIG_FILE_MAX bytes: a FIFO
 * would block the open or the read, /dev/zero would never end, a directory
 * reads as nothing. The file must not change while it is read, so that a
 * rewrite in progress is not taken for the settings. */
static int config_load(const char *path, char **out, size_t *out_len,
                       struct shmb_error *err)
{
    struct stat before, after;
    char *buf = NULL;
    size_t len = 0;
    ssize_t n;
    int fd, rc = 0, saved;

    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        saved = errno;
        return shmb_error_set(err, -saved, "Cannot read --config %s: %s.", path,
                              strerror(saved));
    }
    if (fstat(fd, &before) != 0) {
        saved = errno;
        rc = shmb_error_set(err, -saved, "Cannot read --config %s: %s.", path,
                            strerror(saved));
        goto out;
    }
    if (S_ISDIR(before.st_mode)) {
        rc = shmb_error_set(err, -EISDIR,
                            "--config %s is a directory; give the settings file.", path);
        goto out;
    }
    if (!S_ISREG(before.st_mode)) {
        rc = shmb_error_set(err, -EINVAL,
                            "--config %s is not a regular file (a FIFO, device or "
                            "socket); give the settings file.",
                            path);
        goto out;
    }
    if (before.st_size > CONFIG_FILE_MAX) {
        rc = shmb_error_set(err, -EFBIG,
                            "--config %s is %lld bytes; a settings file may have at most "
                            "%d.",
                            path, (long long)before.st_size, CONFIG_FILE_MAX);
        goto out;
    }
    /* One byte more than the limit tells a file that grew past it. */
    if ((buf = shmb_malloc(CONFIG_FILE_MAX + 2)) == NULL) {
        rc = shmb_error_set(err, -ENOMEM, "Out of memory reading --config %s.", path);
        goto out;
    }
    while (len <= CONFIG_FILE_MAX &&
           (n = read(fd, buf + len, CONFIG_FILE_MAX + 1 - len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            saved = errno;
            rc = shmb_error_set(err, -saved, "Cannot read --config %s: %s.", path,
                                strerror(saved));
            goto out;
        }
        len += (size_t)n;
    }
    if (len > CONFIG_FILE_MAX) {
        rc = shmb_error_set(err, -EFBIG,
                            "--config %s is more than %d bytes, the most a settings file "
                            "may have.",
                            path, CONFIG_FILE_MAX);
        goto out;
    }
    if (fstat(fd, &after) != 0 || after.st_size != (off_t)len ||
        after.st_size != before.st_size ||
        after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != before.st_mtim.tv_nsec) {
        rc = shmb_error_set(err, -EAGAIN,
                            "--config %s changed while it was being read; write it to "
                            "another file and rename that over it.",
                            path);
        goto out;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    buf = NULL;
out:
    shmb_free(buf);
    close(fd);
    return rc;
}

/* Turn "name = value" lines of path into "--name value" arguments. The file
 * is read whole and parsed whole: an error anywhere fails it all. */
int config_read_file(const char *path, struct config_args *a,
                     struct shmb_error *err)
{
    char *text = NULL, *line, *next;
    size_t len = 0;
    int lineno = 0, rc;

    if ((rc = config_load(path, &text, &len, err)) < 0)
        return rc;
    if (len == 0) {
        /* What a file being rewritten in place looks like between its
         * truncation and its first write. */
        rc = shmb_error_set(err, -EINVAL,
                            "--config %s is empty; keep a comment line in it to run "
                            "with no settings from the file.",
                            path);
        goto out;
    }
    for (line = text; rc == 0 && line < text + len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        const struct option *opt;
        char *key, *value, *eq, flag[96];

        lineno++;
        if (nl == NULL) {
            rc = shmb_error_set(err, -EINVAL,
                                "%s:%d: the last line does not end with a newline: the "
                                "file looks cut short (is it being written?). End it with "
                                "a newline.",
                                path, lineno);
            break;
        }
        *nl = '\0';
        next = nl + 1;
        if ((size_t)(nl - line) > CONFIG_LINE_MAX) {
            rc = shmb_error_set(err, -EINVAL,
                                "%s:%d: the line is %zu bytes long; a line may have at "
                                "most %d.",
                                path, lineno, (size_t)(nl - line), CONFIG_LINE_MAX);
            break;
        }
        if (strlen(line) != (size_t)(nl - line)) {
            rc = shmb_error_set(err, -EINVAL, "%s:%d: the line holds a NUL byte.", path,
                                lineno);
            break;
        }
        key = config_trim(line);
        if (key[0] == '\0' || key[0] == '#')
            continue;
        eq = strchr(key, '=');
        if (eq == NULL) {
            rc = shmb_error_set(err, -EINVAL,
                                "%s:%d: expected 'name = value', got '%.64s'.", path,
                                lineno, key);
            break;
        }
        *eq = '\0';
        key = config_trim(key);
        value = config_trim(eq + 1);
        for (opt = config_options(); opt->name != NULL; opt++)
            if (strcmp(opt->name, key) == 0)
                break;
        if (opt->name != NULL &&
            (strcmp(key, "check-config") == 0 || strcmp(key, "reload") == 0 ||
             strcmp(key, "remove-segment") == 0 || strcmp(key, "check") == 0)) {
            rc = shmb_error_set(err, -EINVAL,
                                "%s:%d: '%s' is something to do instead of running, not a "
                                "setting; give it on the command line.",
                                path, lineno, key);
            break;
        }
        if (opt->name == NULL || strcmp(key, "config") == 0 || strcmp(key, "help") == 0 ||
            strcmp(key, "version") == 0) {
            rc =
                shmb_error_set(err, -EINVAL,
                               "%s:%d: unknown setting '%.64s'; settings are named after "
                               "shmbrokerd's long options (see --help).",
                               path, lineno, key);
            break;
        }
        snprintf(flag, sizeof(flag), "--%s", key);
        if (opt->has_arg == no_argument) {
            if (strcmp(value, "yes") != 0 && strcmp(value, "true") != 0 &&
                strcmp(value, "1") != 0 && strcmp(value, "no") != 0 &&
                strcmp(value, "false") != 0 && strcmp(value, "0") != 0) {
                rc = shmb_error_set(err, -EINVAL,
                                    "%s:%d: %s takes yes or no, not '%.32s'.", path,
                                    lineno, key, value);
                break;
            }
            if (value[0] == 'y' || value[0] == 't' || value[0] == '1')
                rc = config_args_add(a, flag, lineno);
        } else if ((rc = config_args_add(a, flag, lineno)) == 0) {
            rc = config_args_add(a, value, lineno);
        }
        if (rc == -ENOMEM)
            shmb_error_set(err, rc, "%s:%d: out of memory.", path, lineno);
    }
out:
    shmb_free(text);
    return rc;
}

