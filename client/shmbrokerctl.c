// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerctl: look inside a running shmbrokerd and move files in and out of
 * it. A client of libshmbroker like any other: a table of commands, each of
 * which only formats what the library returns; it reads no wire field.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/names.h"
#include "../proto/protocol.h"
#include "../proto/utf8.h"
#include "ctl.h"
#include "ctl_admin.h"
#include "ctl_objects.h"
#include "ctl_prom.h"
#include "ctl_segment.h"
#include "ctl_status.h"

/* One command of the ctl, as tmux's cmd_entry: a row of ctl_cmds below. */
struct ctl_cmd {
    const char *name;
    int min_args, max_args;
    /* Before connecting: parse the command's own options (status), or check
     * its arguments and read its input (0, or the exit status). */
    int (*options)(struct ctl *ctl, int argc, char **argv);
    int (*prepare)(struct ctl *ctl);
    int (*run)(shmb_t *c, struct ctl *ctl); /* the exit status */
    const char *usage, *help;
};

static void usage(FILE *out);

/* A name a pool can have (or "": the default pool): at most 32 bytes of
 * UTF-8. (A declared pool's is of A-Z, a-z, 0-9, '_' and '-'; the one pool
 * of a daemon without --pool is named after its --name.) */
static bool pool_name_ok(const char *name)
{
    size_t len = strlen(name);

    return len <= SHMB_POOL_NAME_MAX && shmb_utf8_invalid_at(name, len) == len;
}

/* --pool given a name no pool can have: a usage error. */
static int bad_pool_name(const char *name)
{
    static char e[ESC_MAX];

    fprintf(stderr,
            "shmbrokerctl: --pool %s: a pool's name is at most %d bytes of UTF-8 (declared "
            "pools: A-Z, a-z, 0-9, '_' and '-'; \"\" for the default pool)\n",
            esc(name, e, ESC_MAX), SHMB_POOL_NAME_MAX);
    return EXIT_USAGE;
}

/* A whole number of seconds from 1 to max for option flag into *out; false
 * (said on stderr) otherwise. */
static bool seconds_option(const char *flag, const char *arg, unsigned long max,
                           unsigned long *out)
{
    char *end;

    *out = strtoul(arg, &end, 10);
    if (*end == '\0' && *out != 0 && *out <= max && arg[0] != '-')
        return true;
    fprintf(stderr, "shmbrokerctl: %s takes whole seconds from 1 to %lu\n", flag, max);
    return false;
}

/* status's options, after the command: --json, --prometheus, --watch N,
 * --from-segment, --timeout N, --name, --shm-dir, --pool. */
static int status_options(struct ctl *ctl, int argc, char **argv)
{
    while (optind < argc && argv[optind][0] == '-') {
        if (strcmp(argv[optind], "--json") == 0) {
            ctl->json = 1;
        } else if (strcmp(argv[optind], "--prometheus") == 0) {
            ctl->prometheus = 1;
        } else if (strcmp(argv[optind], "--from-segment") == 0) {
            ctl->from_segment = 1;
        } else if (strcmp(argv[optind], "--name") == 0 && optind + 1 < argc) {
            ctl->name = argv[++optind];
        } else if (strcmp(argv[optind], "--shm-dir") == 0 && optind + 1 < argc) {
            ctl->shm_dir = argv[++optind];
        } else if (strcmp(argv[optind], "--timeout") == 0 && optind + 1 < argc) {
            if (!seconds_option("--timeout", argv[++optind], 3600, &ctl->timeout))
                return EXIT_USAGE;
        } else if (strcmp(argv[optind], "--pool") == 0 && optind + 1 < argc) {
            optind++;
            ctl->pool = argv[optind][0] != '\0' ? argv[optind] : NULL;
            if (!pool_name_ok(argv[optind]))
                return bad_pool_name(argv[optind]);
        } else if (strcmp(argv[optind], "--watch") == 0 && optind + 1 < argc) {
            if (!seconds_option("--watch", argv[++optind], 86400, &ctl->watch))
                return EXIT_USAGE;
        } else {
            fprintf(stderr, "shmbrokerctl: unknown status option %s\n", argv[optind]);
            usage(stderr);
            return EXIT_USAGE;
        }
        optind++;
    }
    if (ctl->json + ctl->prometheus + (ctl->watch != 0) + ctl->from_segment > 1) {
        fprintf(stderr, "shmbrokerctl: choose one of --json, --prometheus, --watch and "
                        "--from-segment\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* The commands, in the order usage lists them. */
static const struct ctl_cmd ctl_cmds[] = {
    {"status", 0, 0, status_options, NULL, run_status,
     "status [--pool NAME] [--json | --prometheus | --watch SECONDS]\n"
     "         [--from-segment] [--timeout SECONDS] [--name NAME] [--shm-dir DIR]",
     "occupancy, clients and counters of every pool (or NAME's);\n"
     "                         from the segment when the daemon does not answer"},
    {"ls", 0, 1, NULL, NULL, run_ls, "ls [PREFIX]", "objects, oldest first"},
    {"clients", 0, 0, NULL, NULL, run_clients, "clients",
     "connections: pid, uid, name, pool, pins, pending, since"},
    {"put", 2, 2, NULL, put_prepare, run_put, "put KEY FILE|-",
     "store a file (or standard input) under KEY"},
    {"get", 1, 2, NULL, key_prepare, run_get, "get KEY [FILE|-]",
     "write KEY's bytes to FILE (default: standard output)"},
    {"rm", 1, 1, NULL, key_prepare, run_rm, "rm KEY", "delete KEY"},
    {"fetch", 2, 2, NULL, fetch_prepare, run_fetch, "fetch PEER KEY",
     "bring KEY from relay PEER's host into this daemon (shmbroker-relay)"},
    {"check", 0, 0, NULL, NULL, NULL, "check [DAEMON FLAG]...",
     "would the daemon's pools fit here? (shmbrokerd --check; 0 yes, 1 no)"},
};

/* The command table's usage and help lines, aligned as one table. */
static void usage(FILE *out)
{
    size_t i;

    fprintf(out, "Usage: shmbrokerctl [--socket PATH] [--pool NAME] [--name NAME] "
                 "[--shm-dir DIR]\n                    COMMAND [ARG]...\n\n"
                 "Commands:\n");
    for (i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++) {
        if (strlen(ctl_cmds[i].usage) < 23)
            fprintf(out, "  %-23s%s\n", ctl_cmds[i].usage, ctl_cmds[i].help);
        else
            fprintf(out, "  %s\n%25s%s\n", ctl_cmds[i].usage, "", ctl_cmds[i].help);
    }
    fprintf(
        out,
        "\n"
        "The socket defaults to $%s, else %s.\n"
        "--pool NAME uses the daemon's pool NAME (default: its first).\n"
        "--name and --shm-dir are the daemon's (default %s in %s): where status finds\n"
        "the segment to read when the daemon does not answer within --timeout (%d s).\n"
        "Exit status: 0 success, 1 the daemon refused, 2 usage, 66 input file cannot be\n"
        "opened, 69 daemon unreachable, 73 output file cannot be created, 74 file I/O "
        "error.\n"
        "status: 3 when the daemon did not answer and the figures are the segment's,\n"
        "2 when that file is not a segment of this release.\n"
        "Put '--' before a key that starts with '-'.\n",
        SHMB_SOCKET_ENV, SHMB_DEFAULT_SOCKET, CTL_DEFAULT_NAME, CTL_DEFAULT_SHM_DIR,
        CTL_DEFAULT_TIMEOUT_S);
}

/* The row of the command called name, or NULL. */
static const struct ctl_cmd *find_cmd(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++)
        if (strcmp(ctl_cmds[i].name, name) == 0)
            return &ctl_cmds[i];
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"socket", required_argument, NULL, 's'},
        {"pool", required_argument, NULL, 'p'},
        {"name", required_argument, NULL, 'n'},
        {"shm-dir", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, 'j'},
        {NULL, 0, NULL, 0},
    };
    struct ctl ctl;
    const struct ctl_cmd *cmd;
    const char *name;
    int opt, rc;
    shmb_t *c;

    memset(&ctl, 0, sizeof(ctl));
    while ((opt = getopt_long(argc, argv, "+s:h", options, NULL)) != -1) {
        switch (opt) {
        case 's':
            ctl.socket_path = optarg;
            break;
        case 'p':
            ctl.pool = optarg[0] != '\0' ? optarg : NULL; /* "": the default pool */
            if (!pool_name_ok(optarg))
                return bad_pool_name(optarg);
            break;
        case 'n':
            ctl.name = optarg;
            break;
        case 'd':
            ctl.shm_dir = optarg;
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
    name = argv[optind++];
    /* check starts the daemon's own check: its flags are shmbrokerd's. */
    if (strcmp(name, "check") == 0)
        return run_check(argc - optind, argv + optind);
    cmd = find_cmd(name);
    if (cmd != NULL && cmd->options != NULL && (rc = cmd->options(&ctl, argc, argv)) != 0)
        return rc;
    /* "--" ends the options, so that a key may start with '-'. */
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    ctl.args = argv + optind;
    ctl.nargs = argc - optind;
    if (cmd == NULL || ctl.nargs < cmd->min_args || ctl.nargs > cmd->max_args) {
        fprintf(stderr, "shmbrokerctl: wrong command or arguments: %s\n", name);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (cmd->prepare != NULL && (rc = cmd->prepare(&ctl)) != 0)
        return rc;
    ctl_socket = ctl.socket_path;
    if (cmd->run == run_status && ctl.from_segment)
        return print_segment_status(&ctl, CTL_SEG_ASKED);
    if (cmd->run == run_status && ctl.watch == 0) {
        rc = status_connect(&ctl, &c);
        /* A daemon that does not answer is a figure for a scraper, not a
         * failure to write one: the file says shmbroker_up 0 (the reason
         * is on stderr), so that a textfile collector stops exporting the
         * last figures as if they were current. */
        if (rc == EXIT_UNAVAILABLE && ctl.prometheus) {
            prom_up(stdout, 0);
            rc = 0;
        }
    } else {
        rc = ctl_connect(ctl.socket_path, ctl.pool,
                         strcmp(cmd->name, "clients") == 0 || cmd->run == run_status, &c,
                         NULL);
    }
    if (rc == 0 && c != NULL) {
        rc = cmd->run(c, &ctl);
        shmb_close(c);
    }
    free(ctl.put_data);
    return rc;
}
