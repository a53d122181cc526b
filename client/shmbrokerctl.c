/*
 * shmbrokerctl: look inside a running shmbrokerd and move files in and out of
 * it. A client of libshmbroker like any other; it has no protocol code of
 * its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../proto/error.h"
#include "../proto/protocol.h"
#include "../proto/text.h"
#include "shmbroker.h"

#define EXIT_ERROR_REPLY 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 69 /* sysexits.h EX_UNAVAILABLE */
/* A local file, not the daemon, failed: sysexits.h's codes for each case, so
 * that a script can tell them from a refusal (1). */
#define EXIT_NO_INPUT 66   /* EX_NOINPUT: the input file cannot be opened */
#define EXIT_CANT_CREATE 73 /* EX_CANTCREAT: the output file cannot be created */
#define EXIT_IO_ERROR 74   /* EX_IOERR: reading or writing a file failed */

static void usage(FILE *out)
{
    fprintf(
        out,
        "Usage: shmbrokerctl [--socket PATH] COMMAND [ARG]...\n"
        "\n"
        "Commands:\n"
        "  status [--json | --prometheus | --watch SECONDS]\n"
        "                         occupancy, clients and counters of the daemon\n"
        "  ls [PREFIX]            objects, oldest first\n"
        "  clients                connections: pid, uid, name, pins, pending, since\n"
        "  put KEY FILE|-         store a file (or standard input) under KEY\n"
        "  get KEY [FILE|-]       write KEY's bytes to FILE (default: standard output)\n"
        "  rm KEY                 delete KEY\n"
        "\n"
        "The socket defaults to $%s, else %s.\n"
        "Exit status: 0 success, 1 the daemon refused, 2 usage, 66 input file cannot be\n"
        "opened, 69 daemon unreachable, 73 output file cannot be created, 74 file I/O error.\n"
        "Put '--' before a key that starts with '-'.\n",
        SHMB_SOCKET_ENV, SHMB_DEFAULT_SOCKET);
}

/* The socket the ctl talks to, for messages. */
static const char *ctl_socket;

/* s made safe for a terminal (control bytes and invalid UTF-8 as \xNN) in
 * buf; returns buf. Keys and names come from other clients: printed raw,
 * they could clear the screen, retitle the window or forge table rows. */
static char *esc(const char *s, char *buf, size_t len)
{
    return shmb_escape(s != NULL ? s : "", s != NULL ? strlen(s) : 0, buf, len);
}

/* Room for any escaped string the daemon sends (a key, a path). */
#define ESC_MAX SHMB_ESCAPED_MAX(4096)

/* Print the daemon's (or the library's) error and return the exit status:
 * 69 when the connection was lost (the daemon exited or restarted). */
static int fail(shmb_t *c)
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
static int check_key_arg(const char *key)
{
    struct shmb_error err;

    if (shmb_key_check(key, strlen(key), &err) == 0)
        return 0;
    fprintf(stderr, "shmbrokerctl: %s: %s\n", shmb_strerror(err.code), err.message);
    return EXIT_USAGE;
}

/* "2h 03m", "45s". */
static const char *format_uptime(unsigned long long s, char *buf, size_t len)
{
    if (s >= 86400)
        snprintf(buf, len, "%llud %02lluh", s / 86400, s % 86400 / 3600);
    else if (s >= 3600)
        snprintf(buf, len, "%lluh %02llum", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, len, "%llum %02llus", s / 60, s % 60);
    else
        snprintf(buf, len, "%llus", s);
    return buf;
}

/* The stats in Prometheus's text exposition format, one metric per figure. */
static int print_prometheus(shmb_t *c)
{
    static const struct {
        const char *field, *metric, *type, *help;
    } gauges[] = {
        {"size", "shmbroker_segment_bytes", "gauge",
         "Size of the segment, header included."},
        {"data_size", "shmbroker_data_bytes", "gauge", "Bytes of the data area."},
        {"used", "shmbroker_used_bytes", "gauge",
         "Bytes in use (objects, headers, gaps)."},
        {"free", "shmbroker_free_bytes", "gauge", "Bytes free in the data area."},
        {"objects", "shmbroker_objects", "gauge", "Committed objects."},
        {"pending", "shmbroker_pending_objects", "gauge",
         "Allocations not yet committed."},
        {"pinned", "shmbroker_pinned_objects", "gauge", "Objects pinned by a reader."},
        {"clients", "shmbroker_clients", "gauge", "Connected clients."},
        {"max_object_size", "shmbroker_max_object_bytes", "gauge",
         "Largest object allowed."},
        {"shm_dir_free", "shmbroker_shm_dir_free_bytes", "gauge",
         "Bytes free in the shared-memory directory."},
        {"uptime_s", "shmbroker_uptime_seconds", "gauge",
         "Seconds since the daemon started."},
    };
    json_t *reply, *counters, *value;
    const char *name;
    char *raw = NULL;
    size_t i;

    if (shmb_request(c, "{\"op\":\"stats\"}", &raw) < 0)
        return fail(c);
    reply = json_loads(raw, 0, NULL);
    free(raw);
    for (i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
        printf("# HELP %s %s\n# TYPE %s %s\n%s %lld\n", gauges[i].metric, gauges[i].help,
               gauges[i].metric, gauges[i].type, gauges[i].metric,
               json_integer_value(json_object_get(reply, gauges[i].field)));
    }
    counters = json_object_get(reply, "counters");
    json_object_foreach(counters, name, value)
    {
        printf("# HELP shmbroker_%s_total Count of %s since the daemon started.\n"
               "# TYPE shmbroker_%s_total counter\nshmbroker_%s_total %lld\n",
               name, name, name, name, json_integer_value(value));
    }
    json_decref(reply);
    return 0;
}

static int cmd_status(shmb_t *c, const char *socket_path, int json, int prometheus)
{
    static char e[4][ESC_MAX];
    shmb_stats_t st;
    char b[4][32], bar[41];
    double pct;
    int i, filled;

    if (json) {
        char *reply = NULL;

        if (shmb_request(c, "{\"op\":\"stats\"}", &reply) < 0)
            return fail(c);
        printf("%s\n", reply);
        free(reply);
        return 0;
    }
    if (prometheus)
        return print_prometheus(c);
    if (shmb_stats(c, &st) < 0)
        return fail(c);
    pct = st.data_size ? 100.0 * (double)st.used / (double)st.data_size : 0.0;
    filled = (int)(pct * 40.0 / 100.0 + 0.5);
    for (i = 0; i < 40; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[40] = '\0';
    printf("shmbrokerd %s, pid %lld, up %s\n", esc(st.version, e[0], ESC_MAX),
           (long long)st.pid, format_uptime(st.uptime_s, b[0], sizeof(b[0])));
    printf("socket    %s\n", esc(shmb_socket_path(socket_path), e[0], ESC_MAX));
    printf("segment   %s in %s: %s (%s for data), max object %s\n",
           esc(st.segment, e[0], ESC_MAX), esc(st.shm_dir, e[1], ESC_MAX),
           shmb_format_bytes(st.size, b[0], sizeof(b[0])),
           shmb_format_bytes(st.data_size, b[1], sizeof(b[1])),
           shmb_format_bytes(st.max_object_size, b[2], sizeof(b[2])));
    printf("shm free  %s left in %s\n",
           shmb_format_bytes(st.shm_dir_free, b[0], sizeof(b[0])), e[1]);
    printf("used      [%s] %5.1f%%  %s of %s (%s free)\n", bar, pct,
           shmb_format_bytes(st.used, b[0], sizeof(b[0])),
           shmb_format_bytes(st.data_size, b[1], sizeof(b[1])),
           shmb_format_bytes(st.free, b[2], sizeof(b[2])));
    printf("objects   %llu committed, %llu pending, %llu pinned\n",
           (unsigned long long)st.objects, (unsigned long long)st.pending,
           (unsigned long long)st.pinned);
    printf("clients   %llu\n", (unsigned long long)st.clients);
    printf(
        "counters  %llu allocs, %llu commits, %llu gets, %llu evictions, %llu ENOSPC\n",
        (unsigned long long)st.allocs, (unsigned long long)st.commits,
        (unsigned long long)st.gets, (unsigned long long)st.evictions,
        (unsigned long long)st.enospc);
    if (st.has_blocker)
        printf("blocker   '%s' (%s, %llu pins, %llu awaited reads) stops reclaim\n",
               esc(st.blocker_key, e[2], ESC_MAX), esc(st.blocker_state, e[3], ESC_MAX),
               (unsigned long long)st.blocker_pins,
               (unsigned long long)st.blocker_readers);
    else
        printf("blocker   none\n");
    return 0;
}

static int cmd_clients(shmb_t *c)
{
    json_t *reply, *list, *item;
    char *raw = NULL, since[32], pinned[32], name[ESC_MAX], mode[ESC_MAX];
    size_t i;

    if (shmb_request(c, "{\"op\":\"clients\"}", &raw) < 0)
        return fail(c);
    reply = json_loads(raw, 0, NULL);
    free(raw);
    list = json_object_get(reply, "clients");
    printf("%8s %6s %-20s %-4s %7s %7s %10s  %s\n", "PID", "UID", "NAME", "MODE", "PINS",
           "PENDING", "PINNED", "CONNECTED SINCE");
    json_array_foreach(list, i, item)
    {
        time_t t = (time_t)json_integer_value(json_object_get(item, "connected_unix"));
        struct tm tm;

        localtime_r(&t, &tm);
        strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S", &tm);
        esc(json_string_value(json_object_get(item, "name")), name, sizeof(name));
        /* At most 20 bytes of the name, cut on a character boundary. */
        printf("%8lld %6lld %-20.*s %-4s %7lld %7lld %10s  %s%s\n",
               json_integer_value(json_object_get(item, "pid")),
               json_integer_value(json_object_get(item, "uid")),
               (int)shmb_utf8_cut(name, strlen(name), 20), name,
               esc(json_string_value(json_object_get(item, "mode")), mode, sizeof(mode)),
               json_integer_value(json_object_get(item, "pins")),
               json_integer_value(json_object_get(item, "pending")),
               shmb_format_bytes((unsigned long long)json_integer_value(
                                     json_object_get(item, "bytes_pinned")),
                                 pinned, sizeof(pinned)),
               since,
               json_is_true(json_object_get(item, "self")) ? " (this command)" : "");
    }
    json_decref(reply);
    return 0;
}

static int cmd_ls(shmb_t *c, const char *prefix)
{
    json_t *req, *reply, *objects, *item;
    char *line, *raw = NULL, key[ESC_MAX], state[ESC_MAX];
    size_t i;
    int rc;

    req = json_pack("{s:s, s:s, s:i}", "op", "list", "prefix", prefix ? prefix : "",
                    "limit", SHMB_LIST_MAX_LIMIT);
    line = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (line == NULL) {
        fprintf(stderr, "shmbrokerctl: EINVAL: the prefix must be valid UTF-8\n");
        return EXIT_USAGE;
    }
    rc = shmb_request(c, line, &raw);
    free(line);
    if (rc < 0)
        return fail(c);
    reply = json_loads(raw, 0, NULL);
    free(raw);
    objects = json_object_get(reply, "objects");
    printf("%-32s %12s %5s %7s %-9s %10s %12s\n", "KEY", "SIZE", "PINS", "READERS",
           "STATE", "AGE_MS", "OFFSET");
    json_array_foreach(objects, i, item)
    {
        printf("%-32s %12lld %5lld %7lld %-9s %10lld %12lld\n",
               esc(json_string_value(json_object_get(item, "key")), key, sizeof(key)),
               json_integer_value(json_object_get(item, "size")),
               json_integer_value(json_object_get(item, "pins")),
               json_integer_value(json_object_get(item, "readers")),
               esc(json_string_value(json_object_get(item, "state")), state, sizeof(state)),
               json_integer_value(json_object_get(item, "age_ms")),
               json_integer_value(json_object_get(item, "offset")));
    }
    if (json_is_true(json_object_get(reply, "truncated")))
        printf("(more objects not shown; narrow the prefix)\n");
    json_decref(reply);
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

/* Read the input of put (a file, or standard input for "-") into *data
 * (malloc'ed, caller frees) before connecting: a file that cannot be read
 * needs no daemon. 0 or the exit status. */
static int put_input(const char *file, char **data, size_t *len)
{
    int fd = strcmp(file, "-") == 0 ? STDIN_FILENO : open(file, O_RDONLY | O_CLOEXEC);
    int rc;

    *data = NULL;
    *len = 0;
    if (fd < 0) {
        fprintf(stderr, "shmbrokerctl: cannot open %s: %s\n", file, strerror(errno));
        return EXIT_NO_INPUT;
    }
    rc = read_all(fd, data, len);
    if (fd != STDIN_FILENO)
        close(fd);
    if (rc < 0) {
        fprintf(stderr, "shmbrokerctl: cannot read %s: %s\n", file, strerror(-rc));
        return EXIT_IO_ERROR;
    }
    if (*len == 0) {
        free(*data);
        *data = NULL;
        fprintf(stderr, "shmbrokerctl: %s is empty; objects hold at least 1 byte\n",
                file);
        return EXIT_USAGE;
    }
    return 0;
}

static int cmd_put(shmb_t *c, const char *key, const char *data, size_t len)
{
    return shmb_put(c, key, data, len, 0) < 0 ? fail(c) : 0;
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

static int cmd_get(shmb_t *c, const char *key, const char *file)
{
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

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"socket", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    const char *socket_path = NULL, *cmd;
    char *put_data = NULL;
    size_t put_len = 0;
    int opt, json = 0, prometheus = 0, rc, nargs;
    unsigned long watch = 0;
    shmb_t *c;

    while ((opt = getopt_long(argc, argv, "+s:h", options, NULL)) != -1) {
        switch (opt) {
        case 's':
            socket_path = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    cmd = argv[optind++];
    while (strcmp(cmd, "status") == 0 && optind < argc && argv[optind][0] == '-') {
        if (strcmp(argv[optind], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[optind], "--prometheus") == 0) {
            prometheus = 1;
        } else if (strcmp(argv[optind], "--watch") == 0 && optind + 1 < argc) {
            char *end;

            watch = strtoul(argv[++optind], &end, 10);
            if (*end != '\0' || watch == 0 || watch > 86400) {
                fprintf(stderr,
                        "shmbrokerctl: --watch takes whole seconds from 1 to 86400\n");
                return EXIT_USAGE;
            }
        } else {
            fprintf(stderr, "shmbrokerctl: unknown status option %s\n", argv[optind]);
            usage(stderr);
            return EXIT_USAGE;
        }
        optind++;
    }
    if (json + prometheus + (watch != 0) > 1) {
        fprintf(stderr, "shmbrokerctl: choose one of --json, --prometheus and --watch\n");
        return EXIT_USAGE;
    }
    /* "--" ends the options, so that a key may start with '-'. */
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    nargs = argc - optind;
    if (!((strcmp(cmd, "status") == 0 && nargs == 0) ||
          (strcmp(cmd, "ls") == 0 && nargs <= 1) ||
          (strcmp(cmd, "clients") == 0 && nargs == 0) ||
          (strcmp(cmd, "put") == 0 && nargs == 2) ||
          (strcmp(cmd, "get") == 0 && (nargs == 1 || nargs == 2)) ||
          (strcmp(cmd, "rm") == 0 && nargs == 1))) {
        fprintf(stderr, "shmbrokerctl: wrong command or arguments: %s\n", cmd);
        usage(stderr);
        return EXIT_USAGE;
    }
    /* Keys are checked here, before connecting: a key the ctl refuses is a
     * usage error, not the daemon's refusal. */
    if ((strcmp(cmd, "put") == 0 || strcmp(cmd, "get") == 0 || strcmp(cmd, "rm") == 0) &&
        (rc = check_key_arg(argv[optind])) != 0)
        return rc;
    if (strcmp(cmd, "put") == 0 && (rc = put_input(argv[optind + 1], &put_data, &put_len)) != 0)
        return rc;
    ctl_socket = socket_path;
    c = shmb_new();
    if (c == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        free(put_data);
        return EXIT_ERROR_REPLY;
    }
    /* Tools map the segment lazily: prefaulting is for workers' hot paths. */
    shmb_set_populate(c, 0);
    if (shmb_connect(c, socket_path, "shmbrokerctl") < 0) {
        static char msg[SHMB_ESCAPED_MAX(1024)];

        fprintf(stderr, "shmbrokerctl: %s\n", esc(shmb_errmsg(c), msg, sizeof(msg)));
        rc = shmb_errcode(c) == -ECONNREFUSED || shmb_errcode(c) == -ENOENT ||
                     shmb_errcode(c) == -EACCES || shmb_errcode(c) == -ENOTDIR ||
                     shmb_errcode(c) == -ECONNRESET || shmb_errcode(c) == -ENAMETOOLONG
                 ? EXIT_UNAVAILABLE
                 : EXIT_ERROR_REPLY;
        shmb_close(c);
        free(put_data);
        return rc;
    }
    if (strcmp(cmd, "status") == 0 && watch != 0) {
        /* Redraw in place on a terminal; elsewhere (a pipe, a file) append
         * one view after another, without terminal codes. Until interrupted
         * or the daemon goes away (exit 69). */
        int tty = isatty(STDOUT_FILENO);

        for (;;) {
            if (tty)
                printf("\033[H\033[2J");
            rc = cmd_status(c, socket_path, 0, 0);
            if (rc != 0)
                break;
            printf(tty ? "\n(every %lus; Ctrl-C to stop)\n" : "\n", watch);
            fflush(stdout);
            sleep((unsigned)watch);
        }
        fflush(stdout);
    } else if (strcmp(cmd, "status") == 0)
        rc = cmd_status(c, socket_path, json, prometheus);
    else if (strcmp(cmd, "ls") == 0)
        rc = cmd_ls(c, nargs ? argv[optind] : NULL);
    else if (strcmp(cmd, "clients") == 0)
        rc = cmd_clients(c);
    else if (strcmp(cmd, "put") == 0)
        rc = cmd_put(c, argv[optind], put_data, put_len);
    else if (strcmp(cmd, "get") == 0)
        rc = cmd_get(c, argv[optind], nargs == 2 ? argv[optind + 1] : NULL);
    else
        rc = shmb_delete(c, argv[optind]) < 0 ? fail(c) : 0;
    shmb_close(c);
    free(put_data);
    return rc;
}
