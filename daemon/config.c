// SPDX-License-Identifier: Apache-2.0
/*
 * Flags and defaults for shmbrokerd.
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
#include "log.h"
#include "segment.h"
#include "store.h"

enum config_opt {
    OPT_SIZE = 256,
    OPT_MAX_OBJECT,
    OPT_MAX_OBJECTS,
    OPT_NAME,
    OPT_SHM_DIR,
    OPT_SOCKET,
    OPT_SOCKET_MODE,
    OPT_LOG_LEVEL,
    OPT_VERSION,
    OPT_HELP,
    OPT_FRESH,
    OPT_ALLOC_TIMEOUT,
    OPT_READ_LEASE,
    OPT_MAX_CLIENTS,
    OPT_MAX_CLIENTS_PER_UID,
    OPT_MAX_PINS,
    OPT_MAX_PENDING,
    OPT_MAX_QUEUED_OUTPUT,
    OPT_ALLOW_UID,
    OPT_ALLOW_GID,
    OPT_CONFIG,
    OPT_LOG_FILE,
    OPT_HELLO_TIMEOUT,
    OPT_STOP_WITH_PID,
    OPT_KEEP_SEGMENT,
    OPT_REMOVE_SEGMENT,
    OPT_CHECK_CONFIG,
    OPT_RELOAD,
    OPT_POOL,
    OPT_CHECK,
    OPT_MAX_QUEUES,
    OPT_MAX_QUEUE_BYTES,
    OPT_QUEUE_LEASE,
};

/* The whole number text starts with (digits first: no sign, no space);
 * *end points after it. -EINVAL or -ERANGE. */
static int config_leading_number(const char *text, unsigned long long *value, char **end)
{
    if (text == NULL || text[0] < '0' || text[0] > '9')
        return -EINVAL;
    errno = 0;
    *value = strtoull(text, end, 10);
    return errno == ERANGE ? -ERANGE : 0;
}

/* Every long option; the --config file accepts the same names. */
static const struct option config_option_table[] = {
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
static int config_parse_id(const char *text, bool user, id_t *out)
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
static int config_add_allowed(struct policy *p, bool uid, const char *arg,
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
static int config_parse_count(const char *flag, const char *text, uint64_t max,
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

static void config_usage(FILE *out)
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
static int config_copy(char *dst, size_t len, const char *flag, const char *value,
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

/* The options table is shared by the flag parser and the file reader. */
static const struct option *config_options(void);

/* Arguments built from a config file, followed by the command line's. Every
 * string in argv is a copy this struct owns (getopt may permute argv, never
 * the strings); own keeps them in their first order, line the file line each
 * came from (0: the command line), so that an error in a value from the file
 * can name its line. The file's size bounds how many there are. */
struct config_args {
    char **argv, **own;
    int *line;
    int argc, cap;
    const char *file;    /* the --config file, or NULL */
    const char *culprit; /* set by the parser: the argument an error is about */
};

/* Append one argument (copied), from line of the file (0: the command
 * line); -ENOMEM. */
static int config_args_add(struct config_args *a, const char *arg, int line)
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

static void config_args_free(struct config_args *a)
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
static void config_args_blame(const struct config_args *a, struct shmb_error *err)
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
static char *config_trim(char *s)
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
static int config_read_file(const char *path, struct config_args *a,
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

/* The default largest object for a segment of size bytes: what one object
 * can really use, since a small size leaves a data area of which the chunk
 * header and the longest key take a good part. */
static uint64_t config_default_max_object(uint64_t size, uint64_t max_objects)
{
    uint64_t total = segment_round_size(size);

    return store_default_max_object(
        size, total > SHMB_HEADER_PAGE ? segment_data_size(total, SHMB_HEADER_PAGE, max_objects)
                                       : 0);
}

/* The shape of a --pool value, for the messages that refuse one. */
#define CONFIG_POOL_SHAPE                                                                \
    "NAME:SIZE[,max-object-size=BYTES][,group=GROUP][,backing=shm|memfd|hugetlbfs]"      \
    "[,dir=DIR][,max-queues=N][,max-queue-bytes=BYTES]"
/* How much of a refused --pool value a message quotes: room for the rest. */
#define CONFIG_POOL_QUOTE_MAX 200

/* Refuse the --pool value arg: "--pool ARG: " and what is wrong. */
static int config_pool_error(struct shmb_error *err, const char *arg, const char *fmt,
                             ...) __attribute__((format(printf, 3, 4)));
static int config_pool_error(struct shmb_error *err, const char *arg, const char *fmt,
                             ...)
{
    char what[SHMB_ERROR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return shmb_error_set(err, -EINVAL, "--pool %.*s%s: %s", CONFIG_POOL_QUOTE_MAX, arg,
                          strlen(arg) > CONFIG_POOL_QUOTE_MAX ? "..." : "", what);
}

bool config_pool_name_ok(const char *name)
{
    size_t len = strlen(name);

    return len >= 1 && len <= CONFIG_POOL_NAME_MAX &&
           strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789_-") == len;
}

/* A --pool option's handler: value (trimmed, not empty) into *p; arg is
 * the whole --pool value, for config_pool_error. 0 or -EINVAL. */
typedef int (*config_pool_fn)(struct pool_config *p, const char *arg, const char *value,
                              struct shmb_error *err);

/* max-object-size=BYTES. */
static int config_pool_max_object(struct pool_config *p, const char *arg, const char *value,
                                  struct shmb_error *err)
{
    if (config_parse_size(value, &p->max_object_size) < 0)
        return config_pool_error(err, arg,
                                 "invalid max-object-size '%.32s': expected bytes "
                                 "with an optional K, M or G (KiB, MiB, GiB) "
                                 "suffix, for example max-object-size=64M.",
                                 value);
    return 0;
}

/* group=GROUP: a name or a gid of this host. */
static int config_pool_group(struct pool_config *p, const char *arg, const char *value,
                             struct shmb_error *err)
{
    id_t gid;

    if (strlen(value) > CONFIG_GROUP_NAME_MAX || config_parse_id(value, false, &gid) < 0)
        return config_pool_error(err, arg,
                                 "no group '%.64s' on this host; give the name of "
                                 "an existing group (getent group lists them) or "
                                 "a gid.",
                                 value);
    p->has_group = true;
    p->gid = (gid_t)gid;
    memcpy(p->group, value, strlen(value) + 1);
    return 0;
}

/* backing=shm|memfd|hugetlbfs. */
static int config_pool_backing(struct pool_config *p, const char *arg, const char *value,
                               struct shmb_error *err)
{
    if (strcmp(value, "shm") == 0)
        p->backing = POOL_BACKING_SHM;
    else if (strcmp(value, "memfd") == 0)
        p->backing = POOL_BACKING_MEMFD;
    else if (strcmp(value, "hugetlbfs") == 0)
        p->backing = POOL_BACKING_HUGETLBFS;
    else
        return config_pool_error(err, arg,
                                 "unknown backing '%.32s': expected shm (a file "
                                 "in --shm-dir or dir=), memfd (memory with no "
                                 "file, not limited by /dev/shm) or hugetlbfs (a "
                                 "file on the hugetlbfs mount dir=).",
                                 value);
    return 0;
}

/* dir=DIR. */
static int config_pool_dir(struct pool_config *p, const char *arg, const char *value,
                           struct shmb_error *err)
{
    if (strlen(value) >= sizeof(p->dir))
        return config_pool_error(err, arg, "dir= is longer than %zu bytes.",
                                 sizeof(p->dir) - 1);
    memcpy(p->dir, value, strlen(value) + 1);
    return 0;
}

/* max-queues=N. */
static int config_pool_max_queues(struct pool_config *p, const char *arg, const char *value,
                                  struct shmb_error *err)
{
    unsigned long long count;
    char *end;

    if (config_leading_number(value, &count, &end) < 0 || *end != '\0' || count == 0 ||
        count > CONFIG_QUEUES_MAX)
        return config_pool_error(err, arg,
                                 "invalid max-queues '%.32s': expected a whole "
                                 "number from 1 to %d (the daemon holds at most "
                                 "%d queues of all pools), for example "
                                 "max-queues=8.",
                                 value, CONFIG_QUEUES_MAX, CONFIG_QUEUES_MAX);
    p->max_queues = count;
    return 0;
}

/* max-queue-bytes=BYTES, above 0. */
static int config_pool_max_queue_bytes(struct pool_config *p, const char *arg,
                                       const char *value, struct shmb_error *err)
{
    if (config_parse_size(value, &p->max_queue_bytes) < 0 || p->max_queue_bytes == 0)
        return config_pool_error(err, arg,
                                 "invalid max-queue-bytes '%.32s': expected bytes above 0 "
                                 "with an optional K, M or G (KiB, MiB, GiB) suffix, for "
                                 "example max-queue-bytes=512M.",
                                 value);
    return 0;
}

/* The options of a --pool value after its name and size: the name, what a
 * message shows in place of a missing value, the handler. */
static const struct config_pool_option {
    const char *key;
    const char *placeholder;
    config_pool_fn parse;
} config_pool_options[] = {
    {"max-object-size", "BYTES", config_pool_max_object},
    {"group", "GROUP", config_pool_group},
    {"backing", "shm|memfd|hugetlbfs", config_pool_backing},
    {"dir", "DIR", config_pool_dir},
    {"max-queues", "N", config_pool_max_queues},
    {"max-queue-bytes", "BYTES", config_pool_max_queue_bytes},
};
#define CONFIG_POOL_OPTIONS (sizeof(config_pool_options) / sizeof(config_pool_options[0]))

/* Parse one --pool value into *p. What depends on other flags (the segment's
 * name, shm's default dir, the default max object size) is left for
 * config_resolve_pools, since --name may come after --pool. */
static int config_parse_pool(const char *arg, struct pool_config *p,
                             struct shmb_error *err)
{
    bool seen[CONFIG_POOL_OPTIONS] = {false};
    char buf[CONFIG_LINE_MAX + 1], *name, *size, *opts;
    size_t len = strlen(arg);
    int rc;

    memset(p, 0, sizeof(*p));
    p->backing = POOL_BACKING_SHM;
    if (len == 0)
        return shmb_error_set(err, -EINVAL,
                              "--pool must not be empty: expected " CONFIG_POOL_SHAPE
                              ", for example --pool cache:4G,max-object-size=256M.");
    if (len > CONFIG_LINE_MAX)
        return config_pool_error(err, arg,
                                 "the value is %zu bytes long; it may have at "
                                 "most %d.",
                                 len, CONFIG_LINE_MAX);
    memcpy(buf, arg, len + 1);
    if ((size = strchr(buf, ':')) == NULL)
        return config_pool_error(err, arg,
                                 "expected " CONFIG_POOL_SHAPE
                                 ", for example --pool cache:4G,max-object-size=256M.");
    *size++ = '\0';
    if ((opts = strchr(size, ',')) != NULL)
        *opts++ = '\0';
    name = config_trim(buf);
    size = config_trim(size);
    if (!config_pool_name_ok(name))
        return config_pool_error(
            err, arg,
            "the pool name '%.64s' must be 1 to %d letters, digits, "
            "'_' or '-' (it becomes part of the segment's file name), "
            "for example --pool cache:4G.",
            name, CONFIG_POOL_NAME_MAX);
    memcpy(p->name, name, strlen(name) + 1);
    if (config_parse_size(size, &p->size) < 0)
        return config_pool_error(
            err, arg,
            "invalid size '%.32s': expected bytes with an optional K, "
            "M or G (KiB, MiB, GiB) suffix after the name, for example "
            "--pool %s:256M.",
            size, p->name);
    while (opts != NULL) {
        char *key = opts, *value = NULL, *eq;
        size_t k;

        if ((opts = strchr(key, ',')) != NULL)
            *opts++ = '\0';
        if ((eq = strchr(key, '=')) != NULL) {
            *eq = '\0';
            value = config_trim(eq + 1);
        }
        key = config_trim(key);
        if (key[0] == '\0' && value == NULL)
            return config_pool_error(
                err, arg,
                "an empty option (two commas in a row, or one at the "
                "end); expected " CONFIG_POOL_SHAPE ".");
        for (k = 0; k < CONFIG_POOL_OPTIONS; k++)
            if (strcmp(key, config_pool_options[k].key) == 0)
                break;
        if (k == CONFIG_POOL_OPTIONS)
            return config_pool_error(err, arg,
                                     "unknown option '%.32s'; a pool takes "
                                     "max-object-size=, group=, backing=, dir=, "
                                     "max-queues= and max-queue-bytes=: "
                                     "expected " CONFIG_POOL_SHAPE ".",
                                     key);
        if (value == NULL || value[0] == '\0')
            return config_pool_error(err, arg, "%s has no value; write %s=%s.", key, key,
                                     config_pool_options[k].placeholder);
        if (seen[k])
            return config_pool_error(err, arg, "%s= is given twice; give it once.", key);
        seen[k] = true;
        if ((rc = config_pool_options[k].parse(p, arg, value, err)) < 0)
            return rc;
    }
    if (p->backing == POOL_BACKING_HUGETLBFS && p->dir[0] == '\0')
        return config_pool_error(err, arg,
                                 "a hugetlbfs pool needs dir=, the hugetlbfs mount (e.g. "
                                 "dir=/dev/hugepages).");
    if (p->backing == POOL_BACKING_MEMFD && p->dir[0] != '\0')
        return config_pool_error(err, arg,
                                 "a memfd pool has no directory (its memory has no file "
                                 "name anywhere); drop dir=, or use backing=shm to put "
                                 "the pool in that directory.");
    return 0;
}

/* Add the pool of one --pool value to cfg: a pool of a name already given
 * replaces that one in its place (so the command line overrides the file and
 * the order stays the file's); origin[i] remembers the value of pools[i] for
 * the errors config_resolve_pools finds later. */
static int config_add_pool(struct config *cfg, const char *arg, const char **origin,
                           struct shmb_error *err)
{
    struct pool_config p;
    unsigned i;

    if (config_parse_pool(arg, &p, err) < 0)
        return -EINVAL;
    for (i = 0; i < cfg->n_pools; i++)
        if (strcmp(cfg->pools[i].name, p.name) == 0)
            break;
    if (i == CONFIG_MAX_POOLS)
        return config_pool_error(err, arg,
                                 "more than %d pools; shmbrokerd serves at most %d (a "
                                 "--pool of a name given before replaces that pool and "
                                 "does not count).",
                                 CONFIG_MAX_POOLS, CONFIG_MAX_POOLS);
    cfg->pools[i] = p;
    origin[i] = arg;
    if (i == cfg->n_pools)
        cfg->n_pools++;
    cfg->pools_declared = true;
    return 0;
}

/* A pool's bounds on queues: its own, else the flags', else the defaults:
 * the daemon's CONFIG_QUEUES_MAX shared out evenly (so that pools left at
 * the default can never starve one another of queues), and as many bytes
 * as the pool's own size (what the administrator gave it), at least
 * CONFIG_DEFAULT_QUEUE_BYTES_MIN. */
static void config_resolve_queue_limits(const struct config *cfg, struct pool_config *p)
{
    if (p->max_queues == 0)
        p->max_queues = cfg->max_queues != 0 ? cfg->max_queues
                                             : CONFIG_QUEUES_MAX / cfg->n_pools;
    if (p->max_queue_bytes == 0)
        p->max_queue_bytes = cfg->max_queue_bytes != 0 ? cfg->max_queue_bytes
                             : p->size > CONFIG_DEFAULT_QUEUE_BYTES_MIN
                                 ? p->size
                                 : CONFIG_DEFAULT_QUEUE_BYTES_MIN;
}

/* Once every flag is read: without --pool, the one implicit pool that is
 * today's segment (its max object size is set with cfg's); with pools, each
 * one's segment name, default directory and max object size. On an error,
 * *culprit is the --pool value it is about. */
static int config_resolve_pools(struct config *cfg, const char *const *origin,
                                const char **culprit, struct shmb_error *err)
{
    struct pool_config *p = &cfg->pools[0];
    size_t len;
    unsigned i;

    if (!cfg->pools_declared) {
        memset(p, 0, sizeof(*p));
        /* A --name longer than a pool name is cut, on a UTF-8 character's
         * boundary: the pool's name is only a label; the segment keeps it
         * whole. */
        len = strlen(cfg->name);
        if (len > CONFIG_POOL_NAME_MAX) {
            len = CONFIG_POOL_NAME_MAX;
            while (len > 0 && ((unsigned char)cfg->name[len] & 0xC0) == 0x80)
                len--;
        }
        memcpy(p->name, cfg->name, len);
        p->name[len] = '\0';
        p->size = cfg->size;
        p->backing = POOL_BACKING_SHM;
        memcpy(p->dir, cfg->shm_dir, sizeof(p->dir));
        memcpy(p->segment, cfg->name, sizeof(p->segment));
        cfg->n_pools = 1;
        config_resolve_queue_limits(cfg, p);
        return 0;
    }
    for (i = 0; i < cfg->n_pools; i++) {
        p = &cfg->pools[i];
        if (strlen(cfg->name) + 1 + strlen(p->name) > NAME_MAX) {
            *culprit = origin[i];
            return config_pool_error(
                err, origin[i],
                "its segment file, --name '%.64s%s' and '.%s', would "
                "be longer than %d bytes; choose a shorter --name.",
                cfg->name, strlen(cfg->name) > 64 ? "..." : "", p->name, NAME_MAX);
        }
        len = strlen(cfg->name);
        memcpy(p->segment, cfg->name, len);
        p->segment[len] = '.';
        memcpy(p->segment + len + 1, p->name, strlen(p->name) + 1);
        if (p->backing == POOL_BACKING_SHM && p->dir[0] == '\0')
            memcpy(p->dir, cfg->shm_dir, sizeof(p->dir));
        if (p->max_object_size == 0)
            p->max_object_size = cfg->max_object_size != 0
                                     ? cfg->max_object_size
                                     : config_default_max_object(p->size, 0);
        config_resolve_queue_limits(cfg, p);
    }
    return 0;
}

/* The --config file named on the command line, or NULL. */
static const char *config_find_file(int argc, char **argv)
{
    int i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            return argv[i + 1];
        if (strncmp(argv[i], "--config=", 9) == 0)
            return argv[i] + 9;
        if (strcmp(argv[i], "--") == 0)
            break;
    }
    return NULL;
}

static enum config_action config_parse_args(struct config *cfg, struct config_args *a,
                                            struct shmb_error *err);

enum config_action config_parse(struct config *cfg, int argc, char **argv,
                                struct shmb_error *err)
{
    struct config_args a;
    const char *file = config_find_file(argc, argv);
    enum config_action action = CONFIG_EXIT_USAGE;
    int i;

    memset(&a, 0, sizeof(a));
    a.file = file;
    if (config_args_add(&a, argc > 0 ? argv[0] : "shmbrokerd", 0) < 0 ||
        (file != NULL && config_read_file(file, &a, err) < 0))
        goto out;
    for (i = 1; i < argc; i++)
        if (config_args_add(&a, argv[i], 0) < 0)
            goto out;
    action = config_parse_args(cfg, &a, err);
    if (action == CONFIG_EXIT_USAGE)
        config_args_blame(&a, err);
    if (action == CONFIG_RUN && file != NULL)
        snprintf(cfg->config_file, sizeof(cfg->config_file), "%s", file);
out:
    if (action == CONFIG_EXIT_USAGE && err != NULL && err->code == 0)
        shmb_error_set(err, -ENOMEM, "Out of memory reading the settings.");
    config_args_free(&a);
    return action;
}

/* True when this user may put its socket at the system's default: root,
 * or a user who may write /run/shmbroker (systemd's RuntimeDirectory= makes
 * it the unit's User='s), or make it in /run. */
static bool config_system_socket_usable(void)
{
    char dir[sizeof(SHMB_DEFAULT_SOCKET)] = SHMB_DEFAULT_SOCKET;

    if (geteuid() == 0)
        return true;
    *strrchr(dir, '/') = '\0';
    if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == 0)
        return true;
    if (errno != ENOENT)
        return false;
    *strrchr(dir, '/') = '\0';
    return faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) == 0;
}

/* The socket's default: $SHMBROKER_SOCKET, else the system's when this user
 * may make it there, else the user's own (*user says so): `make run` as
 * anyone else than root gets a daemon, where the clients of that user look
 * (shmb_socket_path). */
static int config_default_socket(struct config *cfg, bool *user, struct shmb_error *err)
{
    const char *env = getenv(SHMB_SOCKET_ENV);

    *user = false;
    if (env != NULL && env[0] != '\0')
        return config_copy(cfg->socket_path, sizeof(cfg->socket_path),
                           "$" SHMB_SOCKET_ENV, env, err);
    if (config_system_socket_usable())
        return config_copy(cfg->socket_path, sizeof(cfg->socket_path), "the socket",
                           SHMB_DEFAULT_SOCKET, err);
    if (shmb_user_socket_path(cfg->socket_path, sizeof(cfg->socket_path)) < 0)
        return shmb_error_set(
            err, -ENAMETOOLONG,
            "$XDG_RUNTIME_DIR is too long for a socket path under it "
            "(at most %zu bytes in all); choose the socket with --socket "
            "or $%s.",
            sizeof(cfg->socket_path) - 1, SHMB_SOCKET_ENV);
    *user = true;
    return 0;
}

/* The user's own socket directory, made private, and the choice said once:
 * a user who looks for the socket in /run/shmbroker is told where it went. */
static int config_user_socket_dir(const struct config *cfg, struct shmb_error *err)
{
    static bool said;
    char dir[sizeof(cfg->socket_path)];
    int rc;

    memcpy(dir, cfg->socket_path, sizeof(dir));
    *strrchr(dir, '/') = '\0';
    if ((rc = shmb_user_socket_dir_prepare(dir, err)) < 0)
        return rc;
    if (!said)
        log_info("not root and %s is not writable: the socket is %s (%s), where this "
                 "user's clients and shmbrokerctl look; --socket or $%s chooses another",
                 "/run/shmbroker", cfg->socket_path,
                 strncmp(dir, SHMB_USER_SOCKET_TMP, strlen(SHMB_USER_SOCKET_TMP)) == 0
                     ? "no $XDG_RUNTIME_DIR: a private directory in /tmp"
                     : "under $XDG_RUNTIME_DIR",
                 SHMB_SOCKET_ENV);
    said = true;
    return 0;
}

/* What the flags' handlers share while config_parse_args reads the flags. */
struct config_flags {
    struct config *cfg;
    const char **pool_origin; /* each pool's --pool value, for config_resolve_pools */
    bool user_socket; /* the socket is the user's default: its directory is made */
};

/* A flag's handler, for the flag opt with its value arg (NULL for a flag
 * without one): 0 to go on, CONFIG_FLAG_DONE when the daemon is to stop at
 * once with success (--version, --help), or a negative errno with err set. */
typedef int (*config_flag_fn)(struct config_flags *f, int opt, const char *arg,
                              struct shmb_error *err);
#define CONFIG_FLAG_DONE 1

/* --size, --max-object-size: bytes with a suffix. */
static int config_flag_size(struct config_flags *f, int opt, const char *arg,
                            struct shmb_error *err)
{
    struct config *cfg = f->cfg;
    int rc;

    if (opt == OPT_SIZE)
        cfg->size_set = true;
    rc = config_parse_size(arg, opt == OPT_SIZE ? &cfg->size : &cfg->max_object_size);
    if (rc < 0)
        return shmb_error_set(
            err, rc,
            "Invalid %s '%s': expected bytes with an optional K, M or G "
            "(KiB, MiB, GiB) suffix, for example %s 256M.",
            opt == OPT_SIZE ? "--size" : "--max-object-size", arg,
            opt == OPT_SIZE ? "--size" : "--max-object-size");
    return 0;
}

/* --max-objects: what the catalog is sized for. */
static int config_flag_max_objects(struct config_flags *f, int opt, const char *arg,
                                   struct shmb_error *err)
{
    unsigned long long count;
    char *end;

    (void)opt;
    if (config_leading_number(arg, &count, &end) < 0 || *end != '\0' || count == 0 ||
        count > SEGMENT_MAX_OBJECTS)
        return shmb_error_set(
            err, -EINVAL,
            "Invalid --max-objects '%s': expected a whole number from 1 "
            "to %llu, the objects the catalog (one 32-byte entry per "
            "object, and a quarter more) is sized for, for example "
            "--max-objects 100000.",
            arg, (unsigned long long)SEGMENT_MAX_OBJECTS);
    f->cfg->max_objects = count;
    return 0;
}

/* --name. */
static int config_flag_name(struct config_flags *f, int opt, const char *arg,
                            struct shmb_error *err)
{
    (void)opt;
    return config_copy(f->cfg->name, sizeof(f->cfg->name), "--name", arg, err);
}

/* --shm-dir. */
static int config_flag_shm_dir(struct config_flags *f, int opt, const char *arg,
                               struct shmb_error *err)
{
    (void)opt;
    return config_copy(f->cfg->shm_dir, sizeof(f->cfg->shm_dir), "--shm-dir", arg, err);
}

/* --socket: a path given is never the user's default. */
static int config_flag_socket(struct config_flags *f, int opt, const char *arg,
                              struct shmb_error *err)
{
    (void)opt;
    f->user_socket = false;
    return config_copy(f->cfg->socket_path, sizeof(f->cfg->socket_path), "--socket", arg,
                       err);
}

/* --socket-mode: octal. */
static int config_flag_socket_mode(struct config_flags *f, int opt, const char *arg,
                                   struct shmb_error *err)
{
    unsigned long mode;
    char *end;

    (void)opt;
    errno = 0;
    mode = strtoul(arg, &end, 8);
    if (errno != 0 || *end != '\0' || arg[0] == '\0' || mode > 0777)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --socket-mode '%s': expected an octal mode up to "
                              "0777, for example --socket-mode 0660.",
                              arg);
    f->cfg->socket_mode = (mode_t)mode;
    return 0;
}

/* --log-level. */
static int config_flag_log_level(struct config_flags *f, int opt, const char *arg,
                                 struct shmb_error *err)
{
    (void)opt;
    if (log_parse_level(arg, &f->cfg->log_level) < 0)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --log-level '%s': expected error, warn, info or "
                              "debug.",
                              arg);
    return 0;
}

/* --fresh. */
static int config_flag_fresh(struct config_flags *f, int opt, const char *arg,
                             struct shmb_error *err)
{
    (void)opt, (void)arg, (void)err;
    f->cfg->fresh = true;
    return 0;
}

/* --alloc-timeout, --read-lease: a time, 0 for none. */
static int config_flag_duration(struct config_flags *f, int opt, const char *arg,
                                struct shmb_error *err)
{
    uint64_t value = 0;

    if (config_parse_duration(arg, &value) < 0)
        return shmb_error_set(
            err, -EINVAL,
            "Invalid %s '%s': expected a time such as 60s, 500ms or 2m "
            "(0 turns it off).",
            opt == OPT_ALLOC_TIMEOUT ? "--alloc-timeout" : "--read-lease", arg);
    *(opt == OPT_ALLOC_TIMEOUT ? &f->cfg->alloc_timeout_ms : &f->cfg->read_lease_ms) =
        value;
    return 0;
}

/* --max-clients, --max-clients-per-uid: up to a million. */
static int config_flag_clients(struct config_flags *f, int opt, const char *arg,
                               struct shmb_error *err)
{
    uint64_t value = 0;
    int rc;

    if (opt == OPT_MAX_CLIENTS) {
        rc = config_parse_count("--max-clients", arg, 1000000, &value, err);
        f->cfg->limits.max_clients = (unsigned)value;
    } else {
        rc = config_parse_count("--max-clients-per-uid", arg, 1000000, &value, err);
        f->cfg->limits.max_clients_per_uid = (unsigned)value;
    }
    return rc;
}

/* --max-pins, --max-pending: per client. */
static int config_flag_per_client(struct config_flags *f, int opt, const char *arg,
                                  struct shmb_error *err)
{
    if (opt == OPT_MAX_PINS)
        return config_parse_count("--max-pins", arg, UINT32_MAX, &f->cfg->max_pins, err);
    return config_parse_count("--max-pending", arg, UINT32_MAX, &f->cfg->max_pending,
                              err);
}

/* --max-queued-output: 4K to 1T. */
static int config_flag_max_queued_output(struct config_flags *f, int opt, const char *arg,
                                         struct shmb_error *err)
{
    uint64_t value = 0;

    (void)opt;
    if (config_parse_size(arg, &value) < 0 || value < 4096 || value > (1ULL << 40))
        return shmb_error_set(err, -EINVAL,
                              "Invalid --max-queued-output '%s': expected bytes from 4K "
                              "to 1T, for example 1M.",
                              arg);
    f->cfg->limits.max_queued_output = (size_t)value;
    return 0;
}

/* --max-queues: of all pools, at most CONFIG_QUEUES_MAX. */
static int config_flag_max_queues(struct config_flags *f, int opt, const char *arg,
                                  struct shmb_error *err)
{
    unsigned long long count;
    char *end;

    (void)opt;
    if (config_leading_number(arg, &count, &end) < 0 || *end != '\0' || count == 0 ||
        count > CONFIG_QUEUES_MAX)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --max-queues '%s': expected a whole number from 1 "
                              "to %d (the daemon holds at most %d queues of all pools), "
                              "for example --max-queues 16.",
                              arg, CONFIG_QUEUES_MAX, CONFIG_QUEUES_MAX);
    f->cfg->max_queues = count;
    return 0;
}

/* --max-queue-bytes: above 0. */
static int config_flag_max_queue_bytes(struct config_flags *f, int opt, const char *arg,
                                       struct shmb_error *err)
{
    (void)opt;
    if (config_parse_size(arg, &f->cfg->max_queue_bytes) < 0 ||
        f->cfg->max_queue_bytes == 0)
        return shmb_error_set(
            err, -EINVAL,
            "Invalid --max-queue-bytes '%s': expected bytes above 0 with "
            "an optional K, M or G (KiB, MiB, GiB) suffix, for example "
            "--max-queue-bytes 1G.",
            arg);
    return 0;
}

/* --queue-lease: a time, 0 to keep queues nobody holds. */
static int config_flag_queue_lease(struct config_flags *f, int opt, const char *arg,
                                   struct shmb_error *err)
{
    (void)opt;
    if (config_parse_duration(arg, &f->cfg->queue_lease_ms) < 0)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --queue-lease '%s': expected a time such as 10m, "
                              "60s or 500ms (0 keeps queues nobody holds).",
                              arg);
    return 0;
}

/* --hello-timeout: up to a day. */
static int config_flag_hello_timeout(struct config_flags *f, int opt, const char *arg,
                                     struct shmb_error *err)
{
    uint64_t value = 0;

    (void)opt;
    if (config_parse_duration(arg, &value) < 0 || value > 24 * 3600 * 1000ULL)
        return shmb_error_set(err, -EINVAL,
                              "Invalid --hello-timeout '%s': expected a time up to 24h "
                              "such as 10s or 500ms (0 turns it off).",
                              arg);
    f->cfg->limits.hello_timeout_ms = value;
    return 0;
}

/* --stop-with-pid: a pid from 1. */
static int config_flag_stop_with_pid(struct config_flags *f, int opt, const char *arg,
                                     struct shmb_error *err)
{
    uint64_t value = 0;

    (void)opt;
    if (config_parse_count("--stop-with-pid", arg, INT32_MAX, &value, err) < 0 ||
        value == 0)
        return shmb_error_set(
            err, -EINVAL,
            "Invalid --stop-with-pid '%s': expected the pid of a running "
            "process, from 1 to %d.",
            arg, INT32_MAX);
    f->cfg->stop_with_pid = (pid_t)value;
    return 0;
}

/* --keep-segment. */
static int config_flag_keep_segment(struct config_flags *f, int opt, const char *arg,
                                    struct shmb_error *err)
{
    (void)opt, (void)arg, (void)err;
    f->cfg->keep_segment = true;
    return 0;
}

/* --check-config, --check, --remove-segment, --reload PID: what to do
 * instead of serving, one of them. */
static int config_flag_mode(struct config_flags *f, int opt, const char *arg,
                            struct shmb_error *err)
{
    struct config *cfg = f->cfg;
    enum config_mode todo = opt == OPT_CHECK_CONFIG     ? CONFIG_CHECK
                            : opt == OPT_CHECK          ? CONFIG_SIZING
                            : opt == OPT_REMOVE_SEGMENT ? CONFIG_REMOVE_SEGMENT
                                                        : CONFIG_RELOAD;
    uint64_t value = 0;

    if (cfg->mode != CONFIG_SERVE && cfg->mode != todo)
        return shmb_error_set(err, -EINVAL,
                              "--check-config, --check, --reload and --remove-segment "
                              "each say what to do instead of running; give one of "
                              "them.");
    cfg->mode = todo;
    if (opt == OPT_RELOAD &&
        (config_parse_count("--reload", arg, INT32_MAX, &value, err) < 0 || value == 0))
        return shmb_error_set(err, -EINVAL,
                              "Invalid --reload '%s': expected the pid of the running "
                              "shmbrokerd, from 1 to %d ($MAINPID under systemd).",
                              arg, INT32_MAX);
    if (opt == OPT_RELOAD)
        cfg->reload_pid = (pid_t)value;
    return 0;
}

/* --pool. */
static int config_flag_pool(struct config_flags *f, int opt, const char *arg,
                            struct shmb_error *err)
{
    (void)opt;
    return config_add_pool(f->cfg, arg, f->pool_origin, err);
}

/* --allow-uid, --allow-gid. */
static int config_flag_allow(struct config_flags *f, int opt, const char *arg,
                             struct shmb_error *err)
{
    return config_add_allowed(&f->cfg->limits, opt == OPT_ALLOW_UID, arg, err);
}

/* --config: read before the flags, by config_parse. */
static int config_flag_config(struct config_flags *f, int opt, const char *arg,
                              struct shmb_error *err)
{
    (void)f, (void)opt, (void)arg, (void)err;
    return 0;
}

/* --log-file. */
static int config_flag_log_file(struct config_flags *f, int opt, const char *arg,
                                struct shmb_error *err)
{
    (void)opt;
    return config_copy(f->cfg->log_file, sizeof(f->cfg->log_file), "--log-file", arg,
                       err);
}

/* --version. */
static int config_flag_version(struct config_flags *f, int opt, const char *arg,
                               struct shmb_error *err)
{
    (void)f, (void)opt, (void)arg, (void)err;
    printf("shmbrokerd %s (protocol %d)\n", SHMB_VERSION, SHMB_PROTOCOL_VERSION);
    return CONFIG_FLAG_DONE;
}

/* --help. */
static int config_flag_help(struct config_flags *f, int opt, const char *arg,
                            struct shmb_error *err)
{
    (void)f, (void)opt, (void)arg, (void)err;
    config_usage(stdout);
    return CONFIG_FLAG_DONE;
}

/* Each flag's handler, by its getopt value (config_option_table) less OPT_SIZE. */
static const config_flag_fn config_flag_table[] = {
    [OPT_SIZE - OPT_SIZE] = config_flag_size,
    [OPT_MAX_OBJECT - OPT_SIZE] = config_flag_size,
    [OPT_MAX_OBJECTS - OPT_SIZE] = config_flag_max_objects,
    [OPT_NAME - OPT_SIZE] = config_flag_name,
    [OPT_SHM_DIR - OPT_SIZE] = config_flag_shm_dir,
    [OPT_SOCKET - OPT_SIZE] = config_flag_socket,
    [OPT_SOCKET_MODE - OPT_SIZE] = config_flag_socket_mode,
    [OPT_LOG_LEVEL - OPT_SIZE] = config_flag_log_level,
    [OPT_VERSION - OPT_SIZE] = config_flag_version,
    [OPT_HELP - OPT_SIZE] = config_flag_help,
    [OPT_FRESH - OPT_SIZE] = config_flag_fresh,
    [OPT_ALLOC_TIMEOUT - OPT_SIZE] = config_flag_duration,
    [OPT_READ_LEASE - OPT_SIZE] = config_flag_duration,
    [OPT_MAX_CLIENTS - OPT_SIZE] = config_flag_clients,
    [OPT_MAX_CLIENTS_PER_UID - OPT_SIZE] = config_flag_clients,
    [OPT_MAX_PINS - OPT_SIZE] = config_flag_per_client,
    [OPT_MAX_PENDING - OPT_SIZE] = config_flag_per_client,
    [OPT_MAX_QUEUED_OUTPUT - OPT_SIZE] = config_flag_max_queued_output,
    [OPT_ALLOW_UID - OPT_SIZE] = config_flag_allow,
    [OPT_ALLOW_GID - OPT_SIZE] = config_flag_allow,
    [OPT_CONFIG - OPT_SIZE] = config_flag_config,
    [OPT_LOG_FILE - OPT_SIZE] = config_flag_log_file,
    [OPT_HELLO_TIMEOUT - OPT_SIZE] = config_flag_hello_timeout,
    [OPT_STOP_WITH_PID - OPT_SIZE] = config_flag_stop_with_pid,
    [OPT_KEEP_SEGMENT - OPT_SIZE] = config_flag_keep_segment,
    [OPT_REMOVE_SEGMENT - OPT_SIZE] = config_flag_mode,
    [OPT_CHECK_CONFIG - OPT_SIZE] = config_flag_mode,
    [OPT_RELOAD - OPT_SIZE] = config_flag_mode,
    [OPT_POOL - OPT_SIZE] = config_flag_pool,
    [OPT_CHECK - OPT_SIZE] = config_flag_mode,
    [OPT_MAX_QUEUES - OPT_SIZE] = config_flag_max_queues,
    [OPT_MAX_QUEUE_BYTES - OPT_SIZE] = config_flag_max_queue_bytes,
    [OPT_QUEUE_LEASE - OPT_SIZE] = config_flag_queue_lease,
};

/* The handler of getopt's value opt, or NULL for an unknown or incomplete
 * option ('?', ':'). */
static config_flag_fn config_flag_handler(int opt)
{
    size_t i = (size_t)(opt - OPT_SIZE);

    if (opt < OPT_SIZE || i >= sizeof(config_flag_table) / sizeof(config_flag_table[0]))
        return NULL;
    return config_flag_table[i];
}

static enum config_action config_parse_args(struct config *cfg, struct config_args *a,
                                            struct shmb_error *err)
{
    const char *pool_origin[CONFIG_MAX_POOLS];
    char **argv = a->argv;
    int argc = a->argc, opt;
    struct config_flags f = {
        .cfg = cfg, .pool_origin = pool_origin, .user_socket = false};

    memset(cfg, 0, sizeof(*cfg));
    cfg->size = CONFIG_DEFAULT_SIZE;
    snprintf(cfg->name, sizeof(cfg->name), "%s", CONFIG_DEFAULT_NAME);
    snprintf(cfg->shm_dir, sizeof(cfg->shm_dir), "%s", CONFIG_DEFAULT_SHM_DIR);
    if (config_default_socket(cfg, &f.user_socket, err) < 0)
        return CONFIG_EXIT_USAGE;
    cfg->socket_mode = CONFIG_DEFAULT_SOCKET_MODE;
    cfg->log_level = LOG_INFO;
    cfg->alloc_timeout_ms = CONFIG_DEFAULT_ALLOC_TIMEOUT_MS;
    cfg->limits.max_clients = CONFIG_DEFAULT_MAX_CLIENTS;
    cfg->limits.max_clients_per_uid = CONFIG_DEFAULT_MAX_CLIENTS_PER_UID;
    cfg->limits.max_queued_output = CONFIG_DEFAULT_MAX_QUEUED_OUTPUT;
    cfg->limits.hello_timeout_ms = CONFIG_DEFAULT_HELLO_TIMEOUT_MS;
    cfg->max_pins = CONFIG_DEFAULT_MAX_PINS;
    cfg->max_pending = CONFIG_DEFAULT_MAX_PENDING;
    cfg->queue_lease_ms = CONFIG_DEFAULT_QUEUE_LEASE_MS;

    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", config_option_table, NULL)) != -1) {
        const char *arg = optarg;
        config_flag_fn handler = config_flag_handler(opt);
        int rc;

        /* What an error below is about, for config_args_blame. */
        a->culprit = arg != NULL ? arg : argv[optind - 1];
        if (handler == NULL) {
            shmb_error_set(err, -EINVAL, "Unknown or incomplete option '%s'. Try --help.",
                           argv[optind - 1]);
            return CONFIG_EXIT_USAGE;
        }
        rc = handler(&f, opt, arg, err);
        if (rc == CONFIG_FLAG_DONE)
            return CONFIG_EXIT_OK;
        if (rc < 0)
            return CONFIG_EXIT_USAGE;
    }
    if (optind < argc) {
        a->culprit = argv[optind];
        shmb_error_set(err, -EINVAL, "Unexpected argument '%s'. Try --help.",
                       argv[optind]);
        return CONFIG_EXIT_USAGE;
    }
    if (config_resolve_pools(cfg, pool_origin, &a->culprit, err) < 0)
        return CONFIG_EXIT_USAGE;
    /* Only a daemon that binds the socket makes its directory: --check,
     * --reload and --remove-segment leave the file system alone, and a
     * socket-activated daemon's socket is systemd's. */
    if (f.user_socket && cfg->mode == CONFIG_SERVE && getenv("LISTEN_FDS") == NULL &&
        config_user_socket_dir(cfg, err) < 0)
        return CONFIG_EXIT_USAGE;
    if (cfg->max_object_size == 0)
        cfg->max_object_size = config_default_max_object(cfg->size, cfg->max_objects);
    if (!cfg->pools_declared) {
        cfg->pools[0].max_object_size = cfg->max_object_size;
        cfg->pools[0].max_objects = cfg->max_objects;
    }
    return CONFIG_RUN;
}
