// SPDX-License-Identifier: Apache-2.0
/*
 * config_parse: the --config file's arguments, then the command line's, read
 * through the table of flags (one small handler each), the defaults first
 * and the checks across flags last; the socket's default place. Entered by
 * config_parse (config.h) only.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../proto/protocol.h"
#include "config_inner.h"
#include "config_pool.h"
#include "log.h"
#include "segment.h"

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
