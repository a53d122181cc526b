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
         "%s:1: the last line does not end with a newline: the file looks cut short (is it "
         "being written?). End it with a newline."},
        {"empty.conf", "",
         "--config %s is empty; keep a comment line in it to run with no settings from the "
         "file."},
        {"noeq.conf", "size 1M\n", "%s:1: expected 'name = value', got 'size 1M'."},
        {"bool.conf", "fresh = maybe\n", "%s:1: fresh takes yes or no, not 'maybe'."},
        {"value.conf", "max-clients = many\n",
         "Invalid --max-clients 'many': expected a whole number from 0 (no limit) to "
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
    static const char *const names[] = {"good.conf",  "off.conf",  "unknown.conf",
                                        "nested.conf", "cut.conf",  "empty.conf",
                                        "noeq.conf",  "bool.conf", "value.conf"};
    char path[PATH_MAX];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    return rmdir(tmpdir) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),       cmocka_unit_test(test_default_max_object),
        cmocka_unit_test(test_sizes),          cmocka_unit_test(test_durations),
        cmocka_unit_test(test_bad_values),     cmocka_unit_test(test_limits),
        cmocka_unit_test(test_allow_lists),    cmocka_unit_test(test_file_and_flags),
        cmocka_unit_test(test_bad_files),      cmocka_unit_test(test_exit_ok),
    };

    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
