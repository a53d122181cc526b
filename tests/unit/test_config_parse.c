// SPDX-License-Identifier: Apache-2.0
/*
 * The flag parser (daemon/config.h): defaults, the size and duration forms,
 * bad values and the messages that name them, the --config file and its
 * precedence under the command line, the allow lists, and the limits that
 * land in cfg->limits for the server. Files live in a temporary directory.
 * (Named test_config_parse: tests/e2e/test_config is the daemon's own run.)
 */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>

#include "config.h"

#define ARGV_MAX 160

/* A temporary directory for --config files. */
static char tmpdir[64];

/* Parse the NULL-terminated flags after "shmbrokerd". */
static enum config_action parse_v(struct config *cfg, struct shmb_error *err,
                                  const char *const *flags)
{
    char *argv[ARGV_MAX + 2];
    int argc = 0;

    argv[argc++] = (char *)"shmbrokerd";
    while (*flags != NULL && argc <= ARGV_MAX)
        argv[argc++] = (char *)*flags++;
    argv[argc] = NULL;
    shmb_error_clear(err);
    return config_parse(cfg, argc, argv, err);
}
#define parse(cfg, err, ...) parse_v((cfg), (err), (const char *const[]){__VA_ARGS__, NULL})

/* The flags must be refused with exactly message. */
static void refused_at(const char *message, const char *const *flags, const char *file,
                       int line)
{
    struct config cfg;
    struct shmb_error err;
    enum config_action action = parse_v(&cfg, &err, flags);

    if (action != CONFIG_EXIT_USAGE || strcmp(err.message, message) != 0) {
        print_error("%s:%d: expected refusal \"%s\"\n  got action %d, \"%s\"\n", file, line,
                    message, (int)action, err.message);
        _fail(file, line);
    }
    assert_true(err.code < 0);
}
#define refused(message, ...) \
    refused_at((message), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)

/* Write text to tmpdir/name; path gets its full name. */
static void write_file(const char *name, const char *text, char *path, size_t len)
{
    FILE *fp;

    snprintf(path, len, "%s/%s", tmpdir, name);
    fp = fopen(path, "w");
    assert_non_null(fp);
    assert_int_equal(fputs(text, fp) >= 0, 1);
    assert_int_equal(fclose(fp), 0);
}

/* Proves every default when no flag, file or environment says otherwise,
 * and that $SHMBROKER_SOCKET moves the default socket. */
static void test_defaults(void **state)
{
    struct config cfg;
    struct shmb_error err;
    char *argv[] = {(char *)"shmbrokerd", NULL};

    (void)state;
    assert_int_equal(unsetenv("SHMBROKER_SOCKET"), 0);
    assert_int_equal(config_parse(&cfg, 1, argv, &err), CONFIG_RUN);
    assert_int_equal(cfg.size, 256ULL << 20);
    assert_int_equal(cfg.max_object_size, 128ULL << 20);
    assert_string_equal(cfg.name, "shmbroker");
    assert_string_equal(cfg.shm_dir, "/dev/shm");
    assert_string_equal(cfg.socket_path, "/run/shmbroker/shmbroker.sock");
    assert_int_equal(cfg.socket_mode, 0660);
    assert_int_equal(cfg.log_level, LOG_INFO);
    assert_false(cfg.fresh);
    assert_int_equal(cfg.alloc_timeout_ms, 60000);
    assert_int_equal(cfg.read_lease_ms, 0);
    assert_int_equal(cfg.limits.max_clients, 1024);
    assert_int_equal(cfg.limits.max_clients_per_uid, 512);
    assert_int_equal(cfg.limits.max_queued_output, 1024 * 1024);
    assert_int_equal(cfg.limits.hello_timeout_ms, 10000);
    assert_int_equal(cfg.limits.n_allow_uid, 0);
    assert_int_equal(cfg.limits.n_allow_gid, 0);
    assert_int_equal(cfg.max_pins, 65536);
    assert_int_equal(cfg.max_pending, 1024);
    assert_string_equal(cfg.config_file, "");
    assert_string_equal(cfg.log_file, "");

    assert_int_equal(setenv("SHMBROKER_SOCKET", "/tmp/elsewhere.sock", 1), 0);
    assert_int_equal(config_parse(&cfg, 1, argv, &err), CONFIG_RUN);
    assert_string_equal(cfg.socket_path, "/tmp/elsewhere.sock");
    assert_int_equal(unsetenv("SHMBROKER_SOCKET"), 0);
}

/* Proves the default max object size: half of --size, at most 128 MiB. */
static void test_default_max_object(void **state)
{
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--size", "1M"), CONFIG_RUN);
    assert_int_equal(cfg.max_object_size, 512 * 1024);
    assert_int_equal(parse(&cfg, &err, "--size", "1G"), CONFIG_RUN);
    assert_int_equal(cfg.max_object_size, 128ULL << 20);
    assert_int_equal(parse(&cfg, &err, "--size", "1G", "--max-object-size", "1000"),
                     CONFIG_RUN);
    assert_int_equal(cfg.max_object_size, 1000);
    /* --max-objects sizes the catalog; the default pool takes it. */
    assert_int_equal(parse(&cfg, &err, "--size", "1M", "--max-objects", "1000"), CONFIG_RUN);
    assert_int_equal(cfg.max_objects, 1000);
    assert_int_equal(cfg.pools[0].max_objects, 1000);
    assert_int_equal(cfg.max_object_size, 512 * 1024);
    assert_int_equal(parse(&cfg, &err, "--size", "64K", "--max-objects", "100000"),
                     CONFIG_RUN);
    assert_int_equal(cfg.max_object_size, 32 * 1024); /* the catalog takes 1/8 at most */
}

/* Proves each accepted size form and the refused ones. */
static void test_sizes(void **state)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } good[] = {
        {"0", 0},           {"4096", 4096},       {"5B", 5},
        {"1K", 1024},       {"1k", 1024},         {"1KiB", 1024},
        {"1KB", 1024},      {"2M", 2 << 20},      {"2MiB", 2 << 20},
        {"2MB", 2 << 20},   {"3G", 3ULL << 30},   {"3GiB", 3ULL << 30},
        {"3GB", 3ULL << 30}, {"1T", 1ULL << 40},   {"1TiB", 1ULL << 40},
        {"1TB", 1ULL << 40},
    };
    static const char *const bad[] = {"", "M", "-1", "+1", " 1", "1X", "1 M", "1.5M", "1m",
                                      "1Mi"};
    uint64_t v;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = 12345;
        assert_int_equal(config_parse_size(good[i].text, &v), 0);
        assert_int_equal(v, good[i].bytes);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (config_parse_size(bad[i], &v) != -EINVAL)
            fail_msg("size '%s' was not refused with EINVAL", bad[i]);
    }
    assert_int_equal(config_parse_size("99999999999999999999", &v), -ERANGE);
    assert_int_equal(config_parse_size("16777216T", &v), -ERANGE);
    assert_int_equal(config_parse_size("16777215T", &v), 0);
    assert_int_equal(v, 16777215ULL << 40);
}

/* Proves each accepted duration form (a bare number is seconds) and the
 * refused ones. */
static void test_durations(void **state)
{
    static const struct {
        const char *text;
        uint64_t ms;
    } good[] = {
        {"0", 0},          {"60", 60000},    {"60s", 60000}, {"500ms", 500},
        {"2m", 120000},    {"2min", 120000}, {"1h", 3600000},
    };
    static const char *const bad[] = {"", "s", "5x", "-1", "1.5s", "5 s", "5S", "5mss"};
    uint64_t v;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = 12345;
        assert_int_equal(config_parse_duration(good[i].text, &v), 0);
        assert_int_equal(v, good[i].ms);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (config_parse_duration(bad[i], &v) != -EINVAL)
            fail_msg("duration '%s' was not refused with EINVAL", bad[i]);
    }
    assert_int_equal(config_parse_duration("99999999999999999999", &v), -ERANGE);
    assert_int_equal(config_parse_duration("18446744073709552m", &v), -ERANGE);
    assert_int_equal(config_parse_duration("18446744073709552", &v), -ERANGE);
}

/* Proves that bad values are refused with a message naming the flag, the
 * value and what is expected, with its numbers. */
static void test_bad_values(void **state)
{
    char longpath[200];

    (void)state;
    refused("Invalid --size '12Q': expected bytes with an optional K, M or G (KiB, MiB, "
            "GiB) suffix, for example --size 256M.",
            "--size", "12Q");
    refused("Invalid --max-object-size 'x': expected bytes with an optional K, M or G "
            "(KiB, MiB, GiB) suffix, for example --max-object-size 256M.",
            "--max-object-size", "x");
    refused("Invalid --max-objects '0': expected a whole number from 1 to 3221225472, the "
            "objects the catalog (one 32-byte entry per object, and a quarter more) is "
            "sized for, for example --max-objects 100000.",
            "--max-objects", "0");
    refused("Invalid --max-objects '3221225473': expected a whole number from 1 to "
            "3221225472, the objects the catalog (one 32-byte entry per object, and a "
            "quarter more) is sized for, for example --max-objects 100000.",
            "--max-objects", "3221225473");
    refused("Invalid --max-clients 'abc': expected a whole number from 0 (no limit) to "
            "1000000.",
            "--max-clients", "abc");
    refused("Invalid --max-clients-per-uid '1000001': expected a whole number from 0 (no "
            "limit) to 1000000.",
            "--max-clients-per-uid", "1000001");
    refused("Invalid --max-pins '4294967296': expected a whole number from 0 (no limit) to "
            "4294967295.",
            "--max-pins", "4294967296");
    refused("Invalid --max-pending '-1': expected a whole number from 0 (no limit) to "
            "4294967295.",
            "--max-pending", "-1");
    refused("Invalid --socket-mode '0999': expected an octal mode up to 0777, for example "
            "--socket-mode 0660.",
            "--socket-mode", "0999");
    refused("Invalid --log-level 'loud': expected error, warn, info or debug.",
            "--log-level", "loud");
    refused("Invalid --alloc-timeout '5x': expected a time such as 60s, 500ms or 2m (0 "
            "turns it off).",
            "--alloc-timeout", "5x");
    refused("Invalid --read-lease '1.5s': expected a time such as 60s, 500ms or 2m (0 "
            "turns it off).",
            "--read-lease", "1.5s");
    refused("Invalid --max-queued-output '1K': expected bytes from 4K to 1T, for example "
            "1M.",
            "--max-queued-output", "1K");
    refused("Invalid --max-queued-output '2T': expected bytes from 4K to 1T, for example "
            "1M.",
            "--max-queued-output", "2T");
    refused("Invalid --hello-timeout '25h': expected a time up to 24h such as 10s or 500ms "
            "(0 turns it off).",
            "--hello-timeout", "25h");
    refused("Unknown or incomplete option '--bogus'. Try --help.", "--bogus");
    refused("Unknown or incomplete option '--size'. Try --help.", "--size");
    refused("Unexpected argument 'extra'. Try --help.", "--fresh", "extra");
    refused("--name must not be empty.", "--name", "");
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    {
        char want[400];

        snprintf(want, sizeof(want), "--socket is longer than 107 bytes: %s", longpath);
        refused(want, "--socket", longpath);
    }
}

/* Proves that the limits the server enforces land in cfg->limits, and the
 * per-connection caps and times in their fields. */
static void test_limits(void **state)
{
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--max-clients", "5", "--max-clients-per-uid", "3",
                           "--max-queued-output", "64K", "--hello-timeout", "500ms",
                           "--max-pins", "7", "--max-pending", "0", "--alloc-timeout", "2m",
                           "--read-lease", "1h", "--socket-mode", "600", "--fresh",
                           "--log-level", "debug", "--name", "n1", "--shm-dir", "/tmp",
                           "--socket", "/tmp/s.sock", "--log-file", "/tmp/l.log"),
                     CONFIG_RUN);
    assert_int_equal(cfg.limits.max_clients, 5);
    assert_int_equal(cfg.limits.max_clients_per_uid, 3);
    assert_int_equal(cfg.limits.max_queued_output, 64 * 1024);
    assert_int_equal(cfg.limits.hello_timeout_ms, 500);
    assert_int_equal(cfg.max_pins, 7);
    assert_int_equal(cfg.max_pending, 0);
    assert_int_equal(cfg.alloc_timeout_ms, 120000);
    assert_int_equal(cfg.read_lease_ms, 3600000);
    assert_int_equal(cfg.socket_mode, 0600);
    assert_true(cfg.fresh);
    assert_int_equal(cfg.log_level, LOG_DEBUG);
    assert_string_equal(cfg.name, "n1");
    assert_string_equal(cfg.shm_dir, "/tmp");
    assert_string_equal(cfg.socket_path, "/tmp/s.sock");
    assert_string_equal(cfg.log_file, "/tmp/l.log");
    /* The --flag=value form too. */
    assert_int_equal(parse(&cfg, &err, "--max-clients=0", "--size=8M"), CONFIG_RUN);
    assert_int_equal(cfg.limits.max_clients, 0);
    assert_int_equal(cfg.size, 8 << 20);
}

/* Proves --allow-uid and --allow-gid: numbers and names, in order, up to
 * POLICY_MAX_ALLOW of each, and a name that does not exist refused. */
static void test_allow_lists(void **state)
{
    const char *flags[2 * (POLICY_MAX_ALLOW + 1) + 1];
    struct config cfg;
    struct shmb_error err;
    int i;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--allow-uid", "0", "--allow-uid", "root",
                           "--allow-uid", "1234", "--allow-gid", "5", "--allow-gid", "root"),
                     CONFIG_RUN);
    assert_int_equal(cfg.limits.n_allow_uid, 3);
    assert_int_equal(cfg.limits.allow_uid[0], 0);
    assert_int_equal(cfg.limits.allow_uid[1], 0);
    assert_int_equal(cfg.limits.allow_uid[2], 1234);
    assert_int_equal(cfg.limits.n_allow_gid, 2);
    assert_int_equal(cfg.limits.allow_gid[0], 5);
    assert_int_equal(cfg.limits.allow_gid[1], 0);
    refused("Invalid --allow-uid 'no-such-user-shmb': expected a user name or uid (at most "
            "64 of them).",
            "--allow-uid", "no-such-user-shmb");
    refused("Invalid --allow-gid 'no-such-group-shmb': expected a group name or gid (at "
            "most 64 of them).",
            "--allow-gid", "no-such-group-shmb");

    for (i = 0; i < POLICY_MAX_ALLOW; i++) {
        flags[2 * i] = "--allow-uid";
        flags[2 * i + 1] = "7";
    }
    flags[2 * POLICY_MAX_ALLOW] = NULL;
    assert_int_equal(parse_v(&cfg, &err, flags), CONFIG_RUN);
    assert_int_equal(cfg.limits.n_allow_uid, POLICY_MAX_ALLOW);
    flags[2 * POLICY_MAX_ALLOW] = "--allow-uid";
    flags[2 * POLICY_MAX_ALLOW + 1] = "8";
    flags[2 * POLICY_MAX_ALLOW + 2] = NULL;
    assert_int_equal(parse_v(&cfg, &err, flags), CONFIG_EXIT_USAGE);
    assert_string_equal(err.message, "Invalid --allow-uid '8': expected a user name or uid "
                                     "(at most 64 of them).");
}

/* Proves that a --config file sets what it names, that flags on the
 * command line win over it wherever they stand, and that cfg->config_file
 * records the file. */
static void test_file_and_flags(void **state)
{
    char path[PATH_MAX], arg[PATH_MAX + 16];
    struct config cfg;
    struct shmb_error err;

    (void)state;
    write_file("good.conf",
               "# shmbrokerd settings\n"
               "\n"
               "size = 8M\n"
               "  name =  fromfile  \n"
               "fresh = yes\n"
               "max-pins = 7\n"
               "allow-uid = 11\n"
               "max-queued-output = 8K\n",
               path, sizeof(path));
    assert_int_equal(parse(&cfg, &err, "--name", "fromflag", "--config", path), CONFIG_RUN);
    assert_int_equal(cfg.size, 8 << 20);
    assert_string_equal(cfg.name, "fromflag");
    assert_true(cfg.fresh);
    assert_int_equal(cfg.max_pins, 7);
    assert_int_equal(cfg.limits.max_queued_output, 8192);
    assert_int_equal(cfg.limits.n_allow_uid, 1);
    assert_int_equal(cfg.limits.allow_uid[0], 11);
    assert_string_equal(cfg.config_file, path);

    /* The file's lists come first, the command line's after them. */
    snprintf(arg, sizeof(arg), "--config=%s", path);
    assert_int_equal(parse(&cfg, &err, arg, "--allow-uid", "12", "--size", "2M"), CONFIG_RUN);
    assert_string_equal(cfg.name, "fromfile");
    assert_int_equal(cfg.size, 2 << 20);
    assert_int_equal(cfg.limits.n_allow_uid, 2);
    assert_int_equal(cfg.limits.allow_uid[0], 11);
    assert_int_equal(cfg.limits.allow_uid[1], 12);

    write_file("off.conf", "fresh = no\n", path, sizeof(path));
    assert_int_equal(parse(&cfg, &err, "--config", path), CONFIG_RUN);
    assert_false(cfg.fresh);
}

/* Proves that a bad --config file is refused with a message naming the
 * file, the line and what is wrong. */
static void test_bad_files(void **state)
{
    static const struct {
        const char *name, *text, *message; /* %s: the file's path */
    } cases[] = {
        {"unknown.conf", "size = 1M\nbogus = 1\n",
         "%s:2: unknown setting 'bogus'; settings are named after shmbrokerd's long "
         "options (see --help)."},
        {"nested.conf", "config = /x\n",
         "%s:1: unknown setting 'config'; settings are named after shmbrokerd's long "
         "options (see --help)."},
        {"cut.conf", "size = 1M",
         "%s:1: the last line does not end with a newline: the file looks cut short (is "
         "it "
         "being written?). End it with a newline."},
        {"empty.conf", "",
         "--config %s is empty; keep a comment line in it to run with no settings from "
         "the "
         "file."},
        {"noeq.conf", "size 1M\n", "%s:1: expected 'name = value', got 'size 1M'."},
        {"bool.conf", "fresh = maybe\n", "%s:1: fresh takes yes or no, not 'maybe'."},
        {"value.conf", "max-clients = many\n",
         "%s:1: Invalid --max-clients 'many': expected a whole number from 0 (no limit) "
         "to "
         "1000000."},
    };
    char path[PATH_MAX], want[PATH_MAX + 256];
    struct config cfg;
    struct shmb_error err;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(cases[i].name, cases[i].text, path, sizeof(path));
        snprintf(want, sizeof(want), cases[i].message, path);
        if (parse(&cfg, &err, "--config", path) != CONFIG_EXIT_USAGE ||
            strcmp(err.message, want) != 0)
            fail_msg("%s: expected \"%s\"\n  got \"%s\"", cases[i].name, want, err.message);
    }
    snprintf(path, sizeof(path), "%s/missing.conf", tmpdir);
    assert_int_equal(parse(&cfg, &err, "--config", path), CONFIG_EXIT_USAGE);
    assert_int_equal(err.code, -ENOENT);
    snprintf(want, sizeof(want), "Cannot read --config %s: No such file or directory.", path);
    assert_string_equal(err.message, want);
    assert_int_equal(parse(&cfg, &err, "--config", tmpdir), CONFIG_EXIT_USAGE);
    assert_int_equal(err.code, -EISDIR);
}

/* The pool a daemon without --pool serves: today's segment, field by field. */
static void assert_implicit_pool(const struct config *cfg, const char *name)
{
    const struct pool_config *p = &cfg->pools[0];

    assert_false(cfg->pools_declared);
    assert_int_equal(cfg->n_pools, 1);
    assert_string_equal(p->name, name);
    assert_int_equal(p->size, cfg->size);
    assert_int_equal(p->max_object_size, cfg->max_object_size);
    assert_int_equal(p->backing, POOL_BACKING_SHM);
    assert_string_equal(p->dir, cfg->shm_dir);
    assert_string_equal(p->segment, cfg->name);
    assert_false(p->has_group);
    assert_string_equal(p->group, "");
}

/* Proves that without --pool there is exactly one pool, today's segment:
 * --name, --size, the resolved --max-object-size, shm in --shm-dir; that a
 * --name longer than a pool name is cut only in the pool's name, on a UTF-8
 * character's boundary; and that size_set says whether --size was given. */
static void test_implicit_pool(void **state)
{
    struct config cfg;
    struct shmb_error err;
    char longname[64];

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--fresh"), CONFIG_RUN);
    assert_implicit_pool(&cfg, "shmbroker");
    assert_int_equal(cfg.pools[0].size, 256ULL << 20);
    assert_int_equal(cfg.pools[0].max_object_size, 128ULL << 20);
    assert_string_equal(cfg.pools[0].dir, "/dev/shm");
    assert_false(cfg.size_set);

    assert_int_equal(
        parse(&cfg, &err, "--size", "1M", "--name", "n1", "--shm-dir", "/tmp"),
        CONFIG_RUN);
    assert_implicit_pool(&cfg, "n1");
    assert_int_equal(cfg.pools[0].size, 1 << 20);
    assert_int_equal(cfg.pools[0].max_object_size, 512 * 1024);
    assert_true(cfg.size_set);
    assert_int_equal(parse(&cfg, &err, "--max-object-size", "1000", "--size", "1G"),
                     CONFIG_RUN);
    assert_implicit_pool(&cfg, "shmbroker");
    assert_int_equal(cfg.pools[0].max_object_size, 1000);

    /* 40 bytes: the pool's name keeps 32, the segment all. */
    snprintf(longname, sizeof(longname), "%s",
             "abcdefghijklmnopqrstuvwxyz0123456789ABCD");
    assert_int_equal(parse(&cfg, &err, "--name", longname), CONFIG_RUN);
    assert_string_equal(cfg.pools[0].segment, longname);
    assert_string_equal(cfg.pools[0].name, "abcdefghijklmnopqrstuvwxyz012345");
    /* 31 bytes and a two-byte character: the character is not split. */
    snprintf(longname, sizeof(longname), "%s\xc3\xa9", "abcdefghijklmnopqrstuvwxyz01234");
    assert_int_equal(parse(&cfg, &err, "--name", longname), CONFIG_RUN);
    assert_string_equal(cfg.pools[0].segment, longname);
    assert_string_equal(cfg.pools[0].name, "abcdefghijklmnopqrstuvwxyz01234");
}

/* Proves pools from flags: every option, in the order given, each segment
 * named "<--name>.<pool>" and shm's directory --shm-dir, with --name and
 * --shm-dir given after the pools; a group by name and by number. */
static void test_pools_from_flags(void **state)
{
    struct config cfg;
    struct shmb_error err;
    const struct pool_config *p = cfg.pools;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--pool", "cache:4G,max-object-size=256M",
                           "--pool", "frames:1G,group=root,backing=memfd", "--pool",
                           "huge:64M,backing=hugetlbfs,dir=/dev/hugepages,group=7",
                           "--pool", "Meta_2-x:8M,dir=/tmp/p,backing=shm", "--name",
                           "app", "--shm-dir", "/run/shm"),
                     CONFIG_RUN);
    assert_true(cfg.pools_declared);
    assert_false(cfg.size_set);
    assert_int_equal(cfg.n_pools, 4);

    assert_string_equal(p[0].name, "cache");
    assert_int_equal(p[0].size, 4ULL << 30);
    assert_int_equal(p[0].max_object_size, 256ULL << 20);
    assert_int_equal(p[0].backing, POOL_BACKING_SHM);
    assert_string_equal(p[0].dir, "/run/shm");
    assert_string_equal(p[0].segment, "app.cache");
    assert_false(p[0].has_group);

    assert_string_equal(p[1].name, "frames");
    assert_int_equal(p[1].size, 1ULL << 30);
    assert_int_equal(p[1].backing, POOL_BACKING_MEMFD);
    assert_string_equal(p[1].dir, "");
    assert_string_equal(p[1].segment, "app.frames");
    assert_true(p[1].has_group);
    assert_int_equal(p[1].gid, 0);
    assert_string_equal(p[1].group, "root");

    assert_string_equal(p[2].name, "huge");
    assert_int_equal(p[2].backing, POOL_BACKING_HUGETLBFS);
    assert_string_equal(p[2].dir, "/dev/hugepages");
    assert_string_equal(p[2].segment, "app.huge");
    assert_true(p[2].has_group);
    assert_int_equal(p[2].gid, 7);
    assert_string_equal(p[2].group, "7");

    assert_string_equal(p[3].name, "Meta_2-x");
    assert_int_equal(p[3].size, 8 << 20);
    assert_int_equal(p[3].backing, POOL_BACKING_SHM);
    assert_string_equal(p[3].dir, "/tmp/p");
    assert_string_equal(p[3].segment, "app.Meta_2-x");

    /* --size beside pools is recorded, for the daemon's warning. */
    assert_int_equal(parse(&cfg, &err, "--size", "1M", "--pool", "a:1M"), CONFIG_RUN);
    assert_true(cfg.size_set);
    assert_string_equal(cfg.pools[0].segment, "shmbroker.a");
    assert_string_equal(cfg.pools[0].dir, "/dev/shm");
}

/* Proves each pool's max object size: its own max-object-size=, else
 * --max-object-size (wherever it stands), else the default for the pool's
 * own size (half of it up to 128M, less for a tiny one); and that
 * max-object-size=0 means "not given", as --max-object-size 0 does. */
static void test_pool_max_object(void **state)
{
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--pool", "a:1M", "--pool", "b:1G", "--pool",
                           "c:1G,max-object-size=300M", "--pool", "d:8K", "--pool",
                           "e:2M,max-object-size=0"),
                     CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_object_size, 512 * 1024);
    assert_int_equal(cfg.pools[1].max_object_size, 128ULL << 20);
    assert_int_equal(cfg.pools[2].max_object_size, 300ULL << 20);
    assert_true(cfg.pools[3].max_object_size > 0);
    assert_true(cfg.pools[3].max_object_size < 4096);
    assert_int_equal(cfg.pools[4].max_object_size, 1 << 20);
    /* --size's default is untouched by the pools. */
    assert_int_equal(cfg.max_object_size, 128ULL << 20);

    assert_int_equal(parse(&cfg, &err, "--pool", "a:1M", "--pool",
                           "c:1G,max-object-size=300M", "--max-object-size", "1000"),
                     CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_object_size, 1000);
    assert_int_equal(cfg.pools[1].max_object_size, 300ULL << 20);
}

/* Proves pools from a --config file's "pool = ..." lines (blanks around
 * the options allowed), that a --pool flag of the same name replaces the
 * file's in its place, that a new one comes after, and that the last of two
 * of the same name on the command line wins too. */
static void test_pools_from_file(void **state)
{
    char path[PATH_MAX];
    struct config cfg;
    struct shmb_error err;

    (void)state;
    write_file("pools.conf",
               "name = svc\n"
               "pool = cache:4G,max-object-size=256M\n"
               "pool = frames:1G, backing = memfd , group=root\n"
               "pool = meta:16M\n",
               path, sizeof(path));
    assert_int_equal(parse(&cfg, &err, "--config", path), CONFIG_RUN);
    assert_int_equal(cfg.n_pools, 3);
    assert_string_equal(cfg.pools[0].segment, "svc.cache");
    assert_int_equal(cfg.pools[0].max_object_size, 256ULL << 20);
    assert_string_equal(cfg.pools[1].segment, "svc.frames");
    assert_int_equal(cfg.pools[1].backing, POOL_BACKING_MEMFD);
    assert_string_equal(cfg.pools[1].group, "root");
    assert_string_equal(cfg.pools[2].segment, "svc.meta");

    assert_int_equal(
        parse(&cfg, &err, "--pool", "frames:2G", "--config", path, "--pool", "extra:1M"),
        CONFIG_RUN);
    assert_int_equal(cfg.n_pools, 4);
    assert_string_equal(cfg.pools[0].name, "cache");
    assert_string_equal(cfg.pools[1].name, "frames");
    assert_int_equal(cfg.pools[1].size, 2ULL << 30);
    assert_int_equal(cfg.pools[1].backing, POOL_BACKING_SHM); /* replaced whole */
    assert_false(cfg.pools[1].has_group);
    assert_string_equal(cfg.pools[1].dir, "/dev/shm");
    assert_string_equal(cfg.pools[2].name, "meta");
    assert_string_equal(cfg.pools[3].name, "extra");
    assert_string_equal(cfg.pools[3].segment, "svc.extra");

    assert_int_equal(parse(&cfg, &err, "--pool", "a:1M", "--pool", "b:1M", "--pool",
                           "a:2M,backing=memfd"),
                     CONFIG_RUN);
    assert_int_equal(cfg.n_pools, 2);
    assert_string_equal(cfg.pools[0].name, "a");
    assert_int_equal(cfg.pools[0].size, 2 << 20);
    assert_int_equal(cfg.pools[0].backing, POOL_BACKING_MEMFD);
    assert_string_equal(cfg.pools[1].name, "b");
}

/* Proves how a pool's bounds on queues resolve: its own max-queues= and
 * max-queue-bytes=, else --max-queues and --max-queue-bytes, else the
 * daemon's 64 queues shared out among the pools and the larger of the
 * pool's size and 256 MiB; --queue-lease defaults to 10 minutes. Bad
 * values are refused with what is expected. */
static void test_queue_bounds(void **state)
{
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--size", "4M"), CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_queues, 64);
    assert_int_equal(cfg.pools[0].max_queue_bytes, 256ULL << 20);
    assert_int_equal(cfg.queue_lease_ms, 600000);
    assert_int_equal(parse(&cfg, &err, "--size", "4M", "--max-queues", "5",
                           "--max-queue-bytes", "1G", "--queue-lease", "30s"),
                     CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_queues, 5);
    assert_int_equal(cfg.pools[0].max_queue_bytes, 1ULL << 30);
    assert_int_equal(cfg.queue_lease_ms, 30000);
    assert_int_equal(parse(&cfg, &err, "--pool", "a:1G", "--pool", "b:1M", "--pool",
                           "c:1M,max-queues=40,max-queue-bytes=2M"),
                     CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_queues, 21);
    assert_int_equal(cfg.pools[0].max_queue_bytes, 1ULL << 30);
    assert_int_equal(cfg.pools[1].max_queues, 21);
    assert_int_equal(cfg.pools[1].max_queue_bytes, 256ULL << 20);
    assert_int_equal(cfg.pools[2].max_queues, 40);
    assert_int_equal(cfg.pools[2].max_queue_bytes, 2ULL << 20);
    assert_int_equal(parse(&cfg, &err, "--max-queues", "3", "--pool", "a:1M"), CONFIG_RUN);
    assert_int_equal(cfg.pools[0].max_queues, 3);
    refused("Invalid --max-queues '0': expected a whole number from 1 to 64 (the daemon "
            "holds at most 64 queues of all pools), for example --max-queues 16.",
            "--max-queues", "0");
    refused("Invalid --max-queues '65': expected a whole number from 1 to 64 (the daemon "
            "holds at most 64 queues of all pools), for example --max-queues 16.",
            "--max-queues", "65");
    refused("Invalid --max-queue-bytes '-1': expected bytes above 0 with an optional K, M "
            "or G (KiB, MiB, GiB) suffix, for example --max-queue-bytes 1G.",
            "--max-queue-bytes", "-1");
    refused("Invalid --queue-lease 'soon': expected a time such as 10m, 60s or 500ms (0 "
            "keeps queues nobody holds).",
            "--queue-lease", "soon");
    refused("--pool a:1M,max-queues=x: invalid max-queues 'x': expected a whole number "
            "from 1 to 64 (the daemon holds at most 64 queues of all pools), for example "
            "max-queues=8.",
            "--pool", "a:1M,max-queues=x");
    refused("--pool a:1M,max-queue-bytes=0: invalid max-queue-bytes '0': expected bytes "
            "above 0 with an optional K, M or G (KiB, MiB, GiB) suffix, for example "
            "max-queue-bytes=512M.",
            "--pool", "a:1M,max-queue-bytes=0");
}

/* Proves that each wrong --pool is refused, quoting the value, saying what
 * is wrong and what is expected. */
static void test_pool_errors(void **state)
{
    static char longdir[PATH_MAX + 16], want[SHMB_ERROR_MSG_MAX];

    (void)state;
    refused("--pool cache: expected NAME:SIZE[,max-object-size=BYTES][,group=GROUP]"
            "[,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N][,max-queue-bytes=BYTES], "
            "for example --pool cache:4G,max-object-size=256M.",
            "--pool", "cache");
    refused("--pool must not be empty: expected NAME:SIZE[,max-object-size=BYTES]"
            "[,group=GROUP][,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N]"
            "[,max-queue-bytes=BYTES], for example --pool cache:4G,max-object-size=256M.",
            "--pool", "");
    refused(
        "--pool cache:4Q: invalid size '4Q': expected bytes with an optional K, M or G "
        "(KiB, MiB, GiB) suffix after the name, for example --pool cache:256M.",
        "--pool", "cache:4Q");
    refused(
        "--pool cache:,backing=memfd: invalid size '': expected bytes with an optional "
        "K, M or G (KiB, MiB, GiB) suffix after the name, for example --pool "
        "cache:256M.",
        "--pool", "cache:,backing=memfd");
    refused("--pool cache:4G,colour=red: unknown option 'colour'; a pool takes "
            "max-object-size=, group=, backing=, dir=, max-queues= and max-queue-bytes=: "
            "expected NAME:SIZE[,max-object-size=BYTES][,group=GROUP]"
            "[,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N]"
            "[,max-queue-bytes=BYTES].",
            "--pool", "cache:4G,colour=red");
    refused("--pool cache:4G,: an empty option (two commas in a row, or one at the end); "
            "expected NAME:SIZE[,max-object-size=BYTES][,group=GROUP]"
            "[,backing=shm|memfd|hugetlbfs][,dir=DIR][,max-queues=N]"
            "[,max-queue-bytes=BYTES].",
            "--pool", "cache:4G,");
    refused("--pool cache:4G,group=: group has no value; write group=GROUP.", "--pool",
            "cache:4G,group=");
    refused("--pool cache:4G,dir: dir has no value; write dir=DIR.", "--pool",
            "cache:4G,dir");
    refused("--pool cache:4G,backing= ,dir=/x: backing has no value; write "
            "backing=shm|memfd|hugetlbfs.",
            "--pool", "cache:4G,backing= ,dir=/x");
    refused("--pool cache:4G,max-object-size=1M,max-object-size=2M: max-object-size= is "
            "given twice; give it once.",
            "--pool", "cache:4G,max-object-size=1M,max-object-size=2M");
    refused(
        "--pool cache:4G,max-object-size=lots: invalid max-object-size 'lots': expected "
        "bytes with an optional K, M or G (KiB, MiB, GiB) suffix, for example "
        "max-object-size=64M.",
        "--pool", "cache:4G,max-object-size=lots");
    refused(
        "--pool cache:4G,backing=tmpfs: unknown backing 'tmpfs': expected shm (a file "
        "in --shm-dir or dir=), memfd (memory with no file, not limited by /dev/shm) or "
        "hugetlbfs (a file on the hugetlbfs mount dir=).",
        "--pool", "cache:4G,backing=tmpfs");
    refused(
        "--pool frames:1G,backing=hugetlbfs: a hugetlbfs pool needs dir=, the hugetlbfs "
        "mount (e.g. dir=/dev/hugepages).",
        "--pool", "frames:1G,backing=hugetlbfs");
    refused("--pool frames:1G,dir=/tmp,backing=memfd: a memfd pool has no directory (its "
            "memory has no file name anywhere); drop dir=, or use backing=shm to put the "
            "pool in that directory.",
            "--pool", "frames:1G,dir=/tmp,backing=memfd");
    refused(
        "--pool frames:1G,group=no-such-group-shmb: no group 'no-such-group-shmb' on "
        "this host; give the name of an existing group (getent group lists them) or a "
        "gid.",
        "--pool", "frames:1G,group=no-such-group-shmb");
    /* A long value is quoted in part, so that the message keeps its end. */
    memcpy(longdir, "a:1M,dir=/", 10);
    memset(longdir + 10, 'd', PATH_MAX);
    longdir[PATH_MAX + 10] = '\0';
    snprintf(want, sizeof(want), "--pool %.200s...: dir= is longer than %d bytes.",
             longdir, PATH_MAX - 1);
    refused(want, "--pool", longdir);
}

/* Proves the pool name's rules: 1 to 32 of [A-Za-z0-9_-]. */
static void test_pool_names(void **state)
{
    static const char *const bad[] = {"",
                                      "a.b",
                                      "a/b",
                                      "a b",
                                      "caf\xc3\xa9",
                                      "a:b",
                                      "abcdefghijklmnopqrstuvwxyz0123456"};
    char arg[96], want[512];
    struct config cfg;
    struct shmb_error err;
    size_t i;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--pool", "abcdefghijklmnopqrstuvwxyzABCDEF:1M",
                           "--pool", "Z9_-:1M", "--pool", "0:1M"),
                     CONFIG_RUN);
    assert_string_equal(cfg.pools[0].name, "abcdefghijklmnopqrstuvwxyzABCDEF");
    assert_string_equal(cfg.pools[1].name, "Z9_-");
    assert_string_equal(cfg.pools[2].name, "0");
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(arg, sizeof(arg), "%s:1M", bad[i]);
        /* "a:b:1M" is the name "a" and the size "b:1M". */
        if (strcmp(bad[i], "a:b") == 0)
            snprintf(
                want, sizeof(want),
                "--pool a:b:1M: invalid size 'b:1M': expected bytes with an optional "
                "K, M or G (KiB, MiB, GiB) suffix after the name, for example --pool "
                "a:256M.");
        else
            snprintf(
                want, sizeof(want),
                "--pool %s: the pool name '%s' must be 1 to 32 letters, digits, '_' or "
                "'-' (it becomes part of the segment's file name), for example --pool "
                "cache:4G.",
                arg, bad[i]);
        refused(want, "--pool", arg);
    }
}

/* Proves the limit of 16 pools: 16 are served, a 17th is refused naming the
 * limit, and a --pool replacing one of the 16 does not count. */
static void test_pool_limit(void **state)
{
    const char *flags[2 * (CONFIG_MAX_POOLS + 1) + 1];
    char args[CONFIG_MAX_POOLS + 1][16];
    struct config cfg;
    struct shmb_error err;
    int i;

    (void)state;
    for (i = 0; i <= CONFIG_MAX_POOLS; i++) {
        snprintf(args[i], sizeof(args[i]), "p%d:1M", i);
        flags[2 * i] = "--pool";
        flags[2 * i + 1] = args[i];
    }
    flags[2 * CONFIG_MAX_POOLS] = NULL;
    assert_int_equal(parse_v(&cfg, &err, flags), CONFIG_RUN);
    assert_int_equal(cfg.n_pools, CONFIG_MAX_POOLS);
    assert_string_equal(cfg.pools[15].segment, "shmbroker.p15");

    snprintf(args[CONFIG_MAX_POOLS], sizeof(args[0]), "p3:2M");
    flags[2 * CONFIG_MAX_POOLS] = "--pool";
    flags[2 * CONFIG_MAX_POOLS + 1] = args[CONFIG_MAX_POOLS];
    flags[2 * CONFIG_MAX_POOLS + 2] = NULL;
    assert_int_equal(parse_v(&cfg, &err, flags), CONFIG_RUN);
    assert_int_equal(cfg.n_pools, CONFIG_MAX_POOLS);
    assert_int_equal(cfg.pools[3].size, 2 << 20);

    snprintf(args[CONFIG_MAX_POOLS], sizeof(args[0]), "p16:1M");
    assert_int_equal(parse_v(&cfg, &err, flags), CONFIG_EXIT_USAGE);
    assert_string_equal(
        err.message, "--pool p16:1M: more than 16 pools; shmbrokerd serves at most 16 (a "
                     "--pool of a name given before replaces that pool and does not "
                     "count).");
}

/* Proves that a segment file name "<--name>.<pool>" longer than NAME_MAX is
 * refused, whichever comes first, and that 255 bytes are accepted. */
static void test_pool_segment_name(void **state)
{
    char name[NAME_MAX + 8], want[SHMB_ERROR_MSG_MAX];
    struct config cfg;
    struct shmb_error err;

    (void)state;
    memset(name, 'n', NAME_MAX - 2); /* + ".p" = 255 */
    name[NAME_MAX - 2] = '\0';
    assert_int_equal(parse(&cfg, &err, "--pool", "p:1M", "--name", name), CONFIG_RUN);
    assert_int_equal(strlen(cfg.pools[0].segment), NAME_MAX);
    assert_int_equal(parse(&cfg, &err, "--pool", "pq:1M", "--name", name),
                     CONFIG_EXIT_USAGE);
    snprintf(
        want, sizeof(want),
        "--pool pq:1M: its segment file, --name '%.64s...' and '.pq', would be longer "
        "than 255 bytes; choose a shorter --name.",
        name);
    assert_string_equal(err.message, want);
    assert_int_equal(parse(&cfg, &err, "--name", name, "--pool", "pq:1M"),
                     CONFIG_EXIT_USAGE);
    assert_string_equal(err.message, want);
}

/* Proves that an error in a value from the --config file names the file and
 * line, for --pool both while the line is parsed and once every flag is
 * (its segment name), and the same value on the command line does not. */
static void test_pool_file_errors(void **state)
{
    char path[PATH_MAX], want[PATH_MAX + SHMB_ERROR_MSG_MAX], name[NAME_MAX + 1];
    struct config cfg;
    struct shmb_error err;

    (void)state;
    write_file("badpool.conf", "size = 1M\n\npool = frames:1G,backing=hugetlbfs\n", path,
               sizeof(path));
    assert_int_equal(parse(&cfg, &err, "--config", path), CONFIG_EXIT_USAGE);
    snprintf(want, sizeof(want),
             "%s:3: --pool frames:1G,backing=hugetlbfs: a hugetlbfs pool needs dir=, the "
             "hugetlbfs mount (e.g. dir=/dev/hugepages).",
             path);
    assert_string_equal(err.message, want);

    write_file("longpool.conf", "# pools\npool = a:1M\npool = pq:1M\n", path,
               sizeof(path));
    memset(name, 'n', NAME_MAX - 2);
    name[NAME_MAX - 2] = '\0';
    assert_int_equal(parse(&cfg, &err, "--config", path, "--name", name),
                     CONFIG_EXIT_USAGE);
    snprintf(
        want, sizeof(want),
        "%s:3: --pool pq:1M: its segment file, --name '%.64s...' and '.pq', would be "
        "longer than 255 bytes; choose a shorter --name.",
        path, name);
    assert_string_equal(err.message, want);
    /* The flag replacing the file's pq is the command line's own error. */
    assert_int_equal(
        parse(&cfg, &err, "--config", path, "--name", name, "--pool", "pq:2M"),
        CONFIG_EXIT_USAGE);
    snprintf(
        want, sizeof(want),
        "--pool pq:2M: its segment file, --name '%.64s...' and '.pq', would be longer "
        "than 255 bytes; choose a shorter --name.",
        name);
    assert_string_equal(err.message, want);
}

/* Proves --check: the sizing report's mode, not --check-config's (no
 * abbreviation), exclusive with the other actions, and refused in a file. */
static void test_check_action(void **state)
{
    char path[PATH_MAX], want[PATH_MAX + 256];
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--pool", "a:1M", "--check"), CONFIG_RUN);
    assert_int_equal(cfg.mode, CONFIG_SIZING);
    assert_int_equal(parse(&cfg, &err, "--check-config"), CONFIG_RUN);
    assert_int_equal(cfg.mode, CONFIG_CHECK);
    refused("--check-config, --check, --reload and --remove-segment each say what to do "
            "instead of running; give one of them.",
            "--check", "--check-config");
    refused("--check-config, --check, --reload and --remove-segment each say what to do "
            "instead of running; give one of them.",
            "--remove-segment", "--check");
    write_file("check.conf", "check = yes\n", path, sizeof(path));
    assert_int_equal(parse(&cfg, &err, "--config", path), CONFIG_EXIT_USAGE);
    snprintf(
        want, sizeof(want),
        "%s:1: 'check' is something to do instead of running, not a setting; give it "
        "on the command line.",
        path);
    assert_string_equal(err.message, want);
}

/* Proves that --version and --help end the parse with CONFIG_EXIT_OK. */
static void test_exit_ok(void **state)
{
    struct config cfg;
    struct shmb_error err;

    (void)state;
    assert_int_equal(parse(&cfg, &err, "--version"), CONFIG_EXIT_OK);
    assert_int_equal(parse(&cfg, &err, "--size", "1M", "--help"), CONFIG_EXIT_OK);
}

static int make_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/shmbcfg-%d-XXXXXX", (int)getpid());
    return mkdtemp(tmpdir) != NULL ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    char path[PATH_MAX];
    struct dirent *e;
    DIR *dir;

    (void)state;
    if ((dir = opendir(tmpdir)) != NULL) {
        while ((e = readdir(dir)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof(path), "%s/%s", tmpdir, e->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    return rmdir(tmpdir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_default_max_object),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_allow_lists),
        cmocka_unit_test(test_file_and_flags),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_implicit_pool),
        cmocka_unit_test(test_pools_from_flags),
        cmocka_unit_test(test_pool_max_object),
        cmocka_unit_test(test_pools_from_file),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_queue_bounds),
        cmocka_unit_test(test_pool_names),
        cmocka_unit_test(test_pool_limit),
        cmocka_unit_test(test_pool_segment_name),
        cmocka_unit_test(test_pool_file_errors),
        cmocka_unit_test(test_check_action),
        cmocka_unit_test(test_exit_ok),
    };

    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
