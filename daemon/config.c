/*
 * Flags and defaults for shmbrokerd.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/protocol.h"

int config_parse_size(const char *text, uint64_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {
        {"", 0},    {"B", 0},     {"K", 10},    {"KiB", 10}, {"M", 20},
        {"MiB", 20}, {"G", 30},   {"GiB", 30},  {"T", 40},   {"TiB", 40},
        {"k", 10},  {"KB", 10},   {"MB", 20},   {"GB", 30},  {"TB", 40},
    };
    unsigned long long value;
    char *end;
    size_t i;

    if (text == NULL || text[0] < '0' || text[0] > '9')
        return -EINVAL;
    errno = 0;
    value = strtoull(text, &end, 10);
    if (errno == ERANGE)
        return -ERANGE;
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

static void config_usage(FILE *out)
{
    fprintf(out,
            "Usage: shmbrokerd [OPTION]...\n"
            "Own a shared-memory segment and hand out space in it to local clients.\n"
            "\n"
            "  --size BYTES             segment size, header page included (default 256M)\n"
            "  --max-object-size BYTES  largest object (default: the smaller of 128M and\n"
            "                           half of --size)\n"
            "  --name NAME              segment file name in --shm-dir (default %s)\n"
            "  --shm-dir DIR            shared-memory directory: a tmpfs or hugetlbfs\n"
            "                           mount (default %s)\n"
            "  --socket PATH            control socket (default: $%s, else\n"
            "                           %s)\n"
            "  --socket-mode MODE       octal file mode of the socket (default 0660)\n"
            "  --log-level LEVEL        error, warn, info or debug (default info)\n"
            "  --version                print the version and exit\n"
            "  --help                   print this help and exit\n"
            "\n"
            "Sizes take K, M, G (or KiB, MiB, GiB) suffixes; all are powers of 1024.\n",
            CONFIG_DEFAULT_NAME, CONFIG_DEFAULT_SHM_DIR, SHMB_SOCKET_ENV,
            SHMB_DEFAULT_SOCKET);
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

enum config_action config_parse(struct config *cfg, int argc, char **argv,
                                struct shmb_error *err)
{
    enum { OPT_SIZE = 256, OPT_MAX_OBJECT, OPT_NAME, OPT_SHM_DIR, OPT_SOCKET,
           OPT_SOCKET_MODE, OPT_LOG_LEVEL, OPT_VERSION, OPT_HELP };
    static const struct option options[] = {
        {"size", required_argument, NULL, OPT_SIZE},
        {"max-object-size", required_argument, NULL, OPT_MAX_OBJECT},
        {"name", required_argument, NULL, OPT_NAME},
        {"shm-dir", required_argument, NULL, OPT_SHM_DIR},
        {"socket", required_argument, NULL, OPT_SOCKET},
        {"socket-mode", required_argument, NULL, OPT_SOCKET_MODE},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"version", no_argument, NULL, OPT_VERSION},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    int opt;

    memset(cfg, 0, sizeof(*cfg));
    cfg->size = CONFIG_DEFAULT_SIZE;
    snprintf(cfg->name, sizeof(cfg->name), "%s", CONFIG_DEFAULT_NAME);
    snprintf(cfg->shm_dir, sizeof(cfg->shm_dir), "%s", CONFIG_DEFAULT_SHM_DIR);
    if (config_copy(cfg->socket_path, sizeof(cfg->socket_path), "$" SHMB_SOCKET_ENV,
                    shmb_socket_path(NULL), err) < 0)
        return CONFIG_EXIT_USAGE;
    cfg->socket_mode = CONFIG_DEFAULT_SOCKET_MODE;
    cfg->log_level = LOG_INFO;

    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        const char *arg = optarg;
        char *end;
        unsigned long mode;
        int rc = 0;

        switch (opt) {
        case OPT_SIZE:
        case OPT_MAX_OBJECT:
            rc = config_parse_size(arg, opt == OPT_SIZE ? &cfg->size : &cfg->max_object_size);
            if (rc < 0) {
                shmb_error_set(err, rc,
                               "Invalid %s '%s': expected bytes with an optional K, M or G "
                               "(KiB, MiB, GiB) suffix, for example %s 256M.",
                               opt == OPT_SIZE ? "--size" : "--max-object-size", arg,
                               opt == OPT_SIZE ? "--size" : "--max-object-size");
                return CONFIG_EXIT_USAGE;
            }
            break;
        case OPT_NAME:
            rc = config_copy(cfg->name, sizeof(cfg->name), "--name", arg, err);
            break;
        case OPT_SHM_DIR:
            rc = config_copy(cfg->shm_dir, sizeof(cfg->shm_dir), "--shm-dir", arg, err);
            break;
        case OPT_SOCKET:
            rc = config_copy(cfg->socket_path, sizeof(cfg->socket_path), "--socket", arg, err);
            break;
        case OPT_SOCKET_MODE:
            errno = 0;
            mode = strtoul(arg, &end, 8);
            if (errno != 0 || *end != '\0' || arg[0] == '\0' || mode > 0777) {
                shmb_error_set(err, -EINVAL,
                               "Invalid --socket-mode '%s': expected an octal mode up to "
                               "0777, for example --socket-mode 0660.", arg);
                return CONFIG_EXIT_USAGE;
            }
            cfg->socket_mode = (mode_t)mode;
            break;
        case OPT_LOG_LEVEL:
            if (log_parse_level(arg, &cfg->log_level) < 0) {
                shmb_error_set(err, -EINVAL,
                               "Invalid --log-level '%s': expected error, warn, info or "
                               "debug.", arg);
                return CONFIG_EXIT_USAGE;
            }
            break;
        case OPT_VERSION:
            printf("shmbrokerd %s (protocol %d)\n", SHMB_VERSION, SHMB_PROTOCOL_VERSION);
            return CONFIG_EXIT_OK;
        case OPT_HELP:
            config_usage(stdout);
            return CONFIG_EXIT_OK;
        default:
            shmb_error_set(err, -EINVAL, "Unknown or incomplete option '%s'. Try --help.",
                           argv[optind - 1]);
            return CONFIG_EXIT_USAGE;
        }
        if (rc < 0)
            return CONFIG_EXIT_USAGE;
    }
    if (optind < argc) {
        shmb_error_set(err, -EINVAL, "Unexpected argument '%s'. Try --help.", argv[optind]);
        return CONFIG_EXIT_USAGE;
    }
    if (cfg->max_object_size == 0) {
        cfg->max_object_size = cfg->size / 2;
        if (cfg->max_object_size > CONFIG_DEFAULT_MAX_OBJECT)
            cfg->max_object_size = CONFIG_DEFAULT_MAX_OBJECT;
    }
    return CONFIG_RUN;
}
