// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of shmbrokerd's systemd integration on a machine where
 * systemd is not PID 1: the notify protocol on our own datagram socket
 * (READY, STATUS, STOPPING, WATCHDOG), socket activation through systemd's
 * systemd-socket-activate, the units as systemd-analyze sees them, make
 * install and the pkg-config file, --config, SIGHUP, and shmbrokerctl's
 * machine-readable and refreshing status. systemd's tools must be there (the
 * dependency step installs them); other tools that are missing are skipped
 * with a reason; nothing here touches /run/shmbroker or a segment named
 * "shmbroker".
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "shmbroker.h"

/* make install builds first when something is out of date. */
#define INSTALL_TIMEOUT_MS 120000
/* The daemon's STATUS= timer fires once a second; allow one miss. */
#define STATUS_TIMEOUT_MS 2500

/* ---- helpers --------------------------------------------------------------- */

/* The absolute path of an executable named name on $PATH, into out; false
 * when there is none. */
static bool find_program(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");
    char dirs[4096], *dir, *save = NULL;

    snprintf(dirs, sizeof(dirs), "%s", path != NULL ? path : "/usr/bin:/bin");
    for (dir = strtok_r(dirs, ":", &save); dir != NULL; dir = strtok_r(NULL, ":", &save)) {
        snprintf(out, len, "%s/%s", dir[0] != '\0' ? dir : ".", name);
        if (access(out, X_OK) == 0)
            return true;
    }
    return false;
}

/* find_program, or skip the test saying what is missing. */
static void need_program(struct h_fix *f, const char *name, char *out, size_t len)
{
    char why[256];

    if (find_program(name, out, len))
        return;
    snprintf(why, sizeof(why), "%s is not installed (not on $PATH)", name);
    h_skip(f, why);
}

/* find_program for a tool of Debian's systemd package, which make test's
 * dependency step (scripts/install-deps.sh test) installs: a missing one
 * means that step is broken, so the test fails instead of skipping. */
static void need_systemd_tool(const char *name, char *out, size_t len)
{
    if (!find_program(name, out, len))
        h_fail("%s is not installed (not on $PATH); scripts/install-deps.sh test "
               "installs Debian's systemd package, which provides it",
               name);
}

/* The source tree: the current directory when it is one (make test runs
 * there), else two levels above the daemon binary (ROOT/build/shmbrokerd). */
static void repo_root(char *out, size_t len)
{
    char bin[PATH_MAX], probe[PATH_MAX + 64], *slash;
    int i;

    if (h_exists("Makefile") && h_exists("systemd/shmbrokerd.service.in") &&
        getcwd(out, len) != NULL)
        return;
    if (realpath(h_daemon_bin(), bin) == NULL)
        h_fail("cannot find the source tree: %s: %s", h_daemon_bin(), strerror(errno));
    for (i = 0; i < 2; i++) {
        slash = strrchr(bin, '/');
        if (slash == NULL || slash == bin)
            h_fail("cannot find the source tree above %s", h_daemon_bin());
        *slash = '\0';
    }
    snprintf(probe, sizeof(probe), "%s/systemd/shmbrokerd.service.in", bin);
    if (!h_exists(probe))
        h_fail("%s does not look like the shmbroker source tree", bin);
    snprintf(out, len, "%s", bin);
}

/* In a child about to exec: apply env, a list of "NAME=value" (set) and
 * "NAME" (unset) entries; the value "$PID" stands for the child's own pid. */
static void child_env(const char *const *env)
{
    static const char *const systemd_vars[] = {
        "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS",
        "LISTEN_FDNAMES",
    };
    size_t i;

    /* Whatever runs the tests (a systemd unit, say) must not leak in. */
    for (i = 0; i < sizeof(systemd_vars) / sizeof(systemd_vars[0]); i++)
        unsetenv(systemd_vars[i]);
    for (i = 0; env != NULL && env[i] != NULL; i++) {
        const char *eq = strchr(env[i], '=');
        char name[128], pid[32];

        if (eq == NULL) {
            unsetenv(env[i]);
            continue;
        }
        snprintf(name, sizeof(name), "%.*s", (int)(eq - env[i]), env[i]);
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv(name, strcmp(eq + 1, "$PID") == 0 ? pid : eq + 1, 1);
    }
}

/* Fork and exec argv with env applied (see child_env), stdin from
 * /dev/null, stdout to out_path and stderr to err_path (appended; either may
 * name the same file), and fd3 (when >= 0) as descriptor 3. The child dies
 * with the test. Returns the pid, or fails the test. */
static pid_t spawn(const char *const *argv, const char *const *env, const char *out_path,
                   const char *err_path, int fd3)
{
    int out, err;
    pid_t pid;

    out = open(out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    err = open(err_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out < 0 || err < 0)
        h_fail("cannot open %s or %s: %s", out_path, err_path, strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        h_fail("fork: %s", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        child_env(env);
        if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
            dup2(err, STDERR_FILENO) < 0)
            _exit(126);
        if (fd3 >= 0 && (fd3 == 3 ? fcntl(3, F_SETFD, 0) : dup2(fd3, 3)) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        dprintf(STDERR_FILENO, "test_systemd: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(out);
    close(err);
    return pid;
}

/* Run argv to completion with env applied, as h_run does (output files in
 * f->dir), within timeout_ms. Fills r; the caller frees it. */
static void run_env(struct h_fix *f, const char *const *argv, const char *const *env,
                    int timeout_ms, struct h_run *r)
{
    char out_path[PATH_MAX], err_path[PATH_MAX], name[32];
    int n = f->nruns++, status = 0;
    pid_t pid;

    memset(r, 0, sizeof(*r));
    snprintf(name, sizeof(name), "envrun%d.out", n);
    h_path(f, name, out_path, sizeof(out_path));
    snprintf(name, sizeof(name), "envrun%d.err", n);
    h_path(f, name, err_path, sizeof(err_path));
    pid = spawn(argv, env, out_path, err_path, -1);
    if (h_wait_pid(pid, timeout_ms, &status) < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        r->status = -1;
    } else {
        r->status = h_exit_code(status);
    }
    r->out = h_read_file(out_path, &r->out_len);
    r->err = h_read_file(err_path, &r->err_len);
    if (r->out == NULL || r->err == NULL)
        h_fail("cannot read the output of %s", argv[0]);
}

/* The daemon's command line for d without --size (a --config file may give
 * it): --socket, --name, --shm-dir, then extra (NULL-terminated or NULL). */
static void daemon_argv(const struct h_daemon *d, const char *const *extra, const char **argv,
                        size_t max)
{
    size_t n = 0, i;

    argv[n++] = h_daemon_bin();
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--name";
    argv[n++] = d->name;
    argv[n++] = "--shm-dir";
    argv[n++] = d->shm_dir;
    for (i = 0; extra != NULL && extra[i] != NULL && n + 1 < max; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
}

/* Start the daemon d with extra arguments, env and fd 3 (see spawn), its
 * output to d->log; d->pid is set so that h_teardown stops it. Does not
 * wait for anything. */
static void daemon_spawn_env(struct h_daemon *d, const char *const *extra,
                             const char *const *env, int fd3)
{
    const char *argv[32];

    daemon_argv(d, extra, argv, sizeof(argv) / sizeof(argv[0]));
    d->pid = spawn(argv, env, d->log, d->log, fd3);
    d->status = -1;
}

/* d's log contains needle. */
static bool log_has(const struct h_daemon *d, const char *needle)
{
    char *text = h_read_file(d->log, NULL);
    bool found = h_contains(text, needle);

    free(text);
    return found;
}

/* A file and a string that h_eventually waits for. */
struct file_wait {
    const char *path;
    const char *needle;
};

/* h_eventually callback: the file exists and contains the string. */
static bool file_has(void *arg)
{
    const struct file_wait *w = arg;
    char *text = h_read_file(w->path, NULL);
    bool found = h_contains(text, w->needle);

    free(text);
    return found;
}

/* Wait until path contains needle, or fail the test showing the file. */
#define wait_file(path, needle, ms) wait_file_at((path), (needle), (ms), __FILE__, __LINE__)
/* The body of wait_file(). */
static void wait_file_at(const char *path, const char *needle, int timeout_ms,
                         const char *file, int line)
{
    struct file_wait w = {path, needle};

    if (!h_eventually(file_has, &w, timeout_ms)) {
        char *text = h_read_file(path, NULL);

        print_error("---- %s:\n%s---- end\n", path, text ? text : "(unreadable)\n");
        free(text);
        h_fail_at(file, line, "%s did not get \"%s\" within %d ms", path, needle, timeout_ms);
    }
}

/* Occurrences of needle in haystack. */
static int count_of(const char *haystack, const char *needle)
{
    int n = 0;

    while (haystack != NULL && (haystack = strstr(haystack, needle)) != NULL) {
        n++;
        haystack += strlen(needle);
    }
    return n;
}

/* A connected library handle, or the test fails. */
static shmb_t *connect_lib(const char *socket_path)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    if (shmb_connect(c, socket_path, "test_systemd") != 0) {
        print_error("shmb_connect %s: %s\n", socket_path, shmb_errmsg(c));
        shmb_close(c);
        fail();
    }
    return c;
}

/* Put key with value and read it back through c. */
static void put_get(shmb_t *c, const char *key, const char *value)
{
    const void *p;
    size_t len;

    assert_int_equal(shmb_put(c, key, value, strlen(value), 0), 0);
    assert_int_equal(shmb_get(c, key, &p, &len), 0);
    assert_int_equal(len, strlen(value));
    assert_memory_equal(p, value, len);
    assert_int_equal(shmb_release(c, key), 0);
}

/* ---- the notify socket ------------------------------------------------------ */

/* Our end of $NOTIFY_SOCKET: what systemd would bind. */
struct notify_rx {
    int fd;
    char env[160];      /* "NOTIFY_SOCKET=..." for the daemon */
    char seen[8192];    /* every message so far, for failure reports */
};

/* Bind a datagram socket: at f->dir/name, or in the abstract namespace
 * when abstract (NOTIFY_SOCKET=@name). */
static void notify_open(struct h_fix *f, struct notify_rx *rx, const char *name, bool abstract)
{
    struct sockaddr_un sun;
    socklen_t len;
    char path[sizeof(sun.sun_path)];

    memset(rx, 0, sizeof(*rx));
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (abstract) {
        /* "@shmbt-<pid>-<name>": unique, and the kernel frees it with us. */
        snprintf(path, sizeof(path), "@shmbt-%d-%s", (int)getpid(), name);
        memcpy(sun.sun_path + 1, path + 1, strlen(path) - 1);
        len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
    } else {
        h_path(f, name, path, sizeof(path));
        memcpy(sun.sun_path, path, strlen(path) + 1);
        len = (socklen_t)sizeof(sun);
    }
    rx->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(rx->fd >= 0);
    if (bind(rx->fd, (struct sockaddr *)&sun, len) != 0)
        h_fail("cannot bind the notify socket %s: %s", path, strerror(errno));
    snprintf(rx->env, sizeof(rx->env), "NOTIFY_SOCKET=%s", path);
}

static void notify_close(struct notify_rx *rx)
{
    if (rx->fd >= 0)
        close(rx->fd);
    rx->fd = -1;
}

/* The next datagram into msg (NUL-terminated): its length, or -ETIMEDOUT. */
static int notify_recv(struct notify_rx *rx, char *msg, size_t len, int timeout_ms)
{
    struct pollfd pfd = {rx->fd, POLLIN, 0};
    ssize_t n;
    int rc;

    do
        rc = poll(&pfd, 1, timeout_ms < 0 ? 0 : timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc <= 0)
        return -ETIMEDOUT;
    n = recv(rx->fd, msg, len - 1, 0);
    if (n < 0)
        return -errno;
    msg[n] = '\0';
    if (strlen(rx->seen) + (size_t)n + 2 < sizeof(rx->seen)) {
        strcat(rx->seen, msg);
        strcat(rx->seen, "|");
    }
    return (int)n;
}

/* The line of msg (messages are newline-separated assignments) that starts
 * with prefix, copied into out; false when none does. */
static bool notify_line(const char *msg, const char *prefix, char *out, size_t len)
{
    const char *line = msg;

    while (line != NULL && *line != '\0') {
        const char *end = strchr(line, '\n');
        size_t n = end != NULL ? (size_t)(end - line) : strlen(line);

        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            snprintf(out, len, "%.*s", (int)n, line);
            return true;
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return false;
}

/* Wait for a message with a line starting with prefix (and matching re
 * when not NULL); the line goes to out. Fails the test, listing what did
 * arrive, when none comes within timeout_ms. */
#define notify_expect(rx, prefix, re, out, ms) \
    notify_expect_at((rx), (prefix), (re), (out), (ms), __FILE__, __LINE__)
/* The body of notify_expect(). */
static void notify_expect_at(struct notify_rx *rx, const char *prefix, const regex_t *re,
                             char out[512], int timeout_ms, const char *file, int line)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    char msg[1024];

    for (;;) {
        int64_t left = (int64_t)deadline - (int64_t)h_now_ms();

        if (left <= 0 || notify_recv(rx, msg, sizeof(msg), (int)left) < 0)
            h_fail_at(file, line, "no %s%s on the notify socket within %d ms; got: %s",
                      prefix, re != NULL ? " of the expected form" : "", timeout_ms,
                      rx->seen[0] ? rx->seen : "nothing");
        if (notify_line(msg, prefix, out, 512) &&
            (re == NULL || regexec(re, out, 0, NULL, 0) == 0))
            return;
    }
}

/* WATCHDOG=1 messages on each of n sockets during ms milliseconds. */
static void count_watchdogs(struct notify_rx *rx, int n, int ms, int *counts)
{
    uint64_t deadline = h_now_ms() + (uint64_t)ms;
    struct pollfd pfd[4];
    char msg[1024], line[64];
    int i;

    assert_true(n <= 4);
    for (i = 0; i < n; i++) {
        pfd[i].fd = rx[i].fd;
        pfd[i].events = POLLIN;
        counts[i] = 0;
    }
    for (;;) {
        int64_t left = (int64_t)deadline - (int64_t)h_now_ms();

        if (left <= 0)
            break;
        if (poll(pfd, (nfds_t)n, (int)left) <= 0)
            continue;
        for (i = 0; i < n; i++)
            if ((pfd[i].revents & POLLIN) && notify_recv(&rx[i], msg, sizeof(msg), 0) > 0 &&
                notify_line(msg, "WATCHDOG=1", line, sizeof(line)))
                counts[i]++;
    }
}

/* READY=1 comes only once the segment is reserved and the control socket
 * accepts (a connect right after it, with the daemon stopped, succeeds);
 * STATUS= then reports occupancy in the documented form with
 * the object and client counts; SIGTERM sends STOPPING=1 and the daemon
 * exits 0. */
static void test_notify_ready_status_stopping(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    const char *extra[] = {"--size", "4M", NULL};
    char line[512], seg[PATH_MAX * 2];
    struct notify_rx rx;
    const char *env[2];
    struct h_conn c;
    struct stat st;
    regex_t re;
    shmb_t *lib;
    int rc, seg_rc, status;

    notify_open(f, &rx, "notify", false);
    env[0] = rx.env;
    env[1] = NULL;
    daemon_spawn_env(d, extra, env, -1);
    notify_expect(&rx, "READY=1", NULL, line, H_READY_TIMEOUT_MS);
    /* Freeze the daemon where READY=1 left it: a listening socket takes the
     * connection into its backlog even now. */
    kill(d->pid, SIGSTOP);
    rc = h_conn_open(&c, d->socket);
    h_segment_path(d, seg, sizeof(seg));
    seg_rc = stat(seg, &st);
    kill(d->pid, SIGCONT);
    if (rc != 0)
        h_fail("READY=1 arrived but %s does not accept yet: %s", d->socket, strerror(-rc));
    if (seg_rc != 0 || st.st_size != 4 << 20)
        h_fail("READY=1 arrived before the segment %s was reserved", seg);
    h_conn_close(&c);

    lib = connect_lib(d->socket);
    shmb_set_arena(lib, 0); /* used is the one chunk's 128 bytes */
    assert_int_equal(shmb_put(lib, "one", "payload", 7, 0), 0);
    /* The data area of a 4 MiB segment is 4 MiB less the header page and
     * the catalog (64 KiB). */
    assert_int_equal(regcomp(&re,
                             "^STATUS=[0-9]+% used \\([0-9.]+ (B|KiB|MiB) of 3\\.9 MiB\\), "
                             "1 object, 1 client, 0 queues$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    notify_expect(&rx, "STATUS=", &re, line, STATUS_TIMEOUT_MS);
    regfree(&re);
    assert_true(h_contains(line, "0% used (128 B of 3.9 MiB)"));
    shmb_close(lib);

    kill(d->pid, SIGTERM);
    notify_expect(&rx, "STOPPING=1", NULL, line, H_STOP_TIMEOUT_MS);
    status = h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS);
    assert_int_equal(h_exit_code(status), 0);
    notify_close(&rx);
    h_pass(f);
}

/* A start that reserves a large pool says how far in STATUS= before
 * READY=1: held after its first 256 MiB of 512 (tests/e2e/slow_reserve.c,
 * preloaded, waits on a file), the last STATUS= is that, and no READY=1 has
 * come; let go, READY=1 follows. */
static void test_notify_progress(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    const char *extra[] = {"--pool", "big:512M", NULL};
    const char *build = getenv("SHMB_BUILD_DIR");
    char line[512], lib[PATH_MAX], rel[PATH_MAX], gate[PATH_MAX], preload[PATH_MAX + 16],
        gate_env[PATH_MAX + 32];
    const char *env[5];
    struct notify_rx rx;
    regex_t re;

    snprintf(rel, sizeof(rel), "%s/tests/slow_reserve.so", build != NULL ? build : "build");
    if (realpath(rel, lib) == NULL)
        h_skip(f, "tests/slow_reserve.so is not built (make it beside test_operator)");
    h_path(f, "gate", gate, sizeof(gate));
    assert_int_equal(h_write_file(gate, "", 0), 0);
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib);
    snprintf(gate_env, sizeof(gate_env), "SHMB_TEST_RESERVE_GATE=%s", gate);
    notify_open(f, &rx, "notify", false);
    env[0] = rx.env;
    env[1] = preload;
    env[2] = gate_env;
    env[3] = "ASAN_OPTIONS=verify_asan_link_order=0";
    env[4] = NULL;
    daemon_spawn_env(d, extra, env, -1);
    assert_int_equal(regcomp(&re, "^STATUS=reserving pool 'big': 256 MiB of 512 MiB$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    notify_expect(&rx, "STATUS=", &re, line, 30000);
    regfree(&re);
    if (h_contains(rx.seen, "READY=1"))
        h_fail("READY=1 came while the pool was being reserved: %s", rx.seen);
    assert_int_equal(unlink(gate), 0);
    notify_expect(&rx, "READY=1", NULL, line, 30000);
    kill(d->pid, SIGTERM);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS)), 0);
    notify_close(&rx);
    h_pass(f);
}

/* NOTIFY_SOCKET=@name names an abstract socket (no file, no trailing NUL in
 * the address length): READY=1 and STOPPING=1 arrive there too. */
static void test_notify_abstract(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    const char *extra[] = {"--size", "4M", NULL};
    struct notify_rx rx;
    const char *env[2];
    char line[512];

    notify_open(f, &rx, "abstract", true);
    assert_true(strncmp(rx.env, "NOTIFY_SOCKET=@", 15) == 0);
    env[0] = rx.env;
    env[1] = NULL;
    daemon_spawn_env(d, extra, env, -1);
    notify_expect(&rx, "READY=1", NULL, line, H_READY_TIMEOUT_MS);
    h_assert_alive(d);
    kill(d->pid, SIGTERM);
    notify_expect(&rx, "STOPPING=1", NULL, line, H_STOP_TIMEOUT_MS);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS)), 0);
    notify_close(&rx);
    h_pass(f);
}

/* With WATCHDOG_USEC=200000 the daemon pings WATCHDOG=1 at about half the
 * interval (several a second, not a flood), also when WATCHDOG_PID is its
 * own pid; when WATCHDOG_PID names another process the watchdog is not its
 * and it sends none (READY=1 still comes). */
static void test_notify_watchdog(void **state)
{
    struct h_fix *f = *state;
    const char *extra[] = {"--size", "2M", NULL};
    static const char *const names[] = {"wd-plain", "wd-self", "wd-other"};
    struct notify_rx rx[3];
    struct h_daemon *d[3];
    char other[32], line[512];
    int counts[3], i;

    /* pid 1 is never the daemon. */
    snprintf(other, sizeof(other), "WATCHDOG_PID=%d", 1);
    for (i = 0; i < 3; i++) {
        const char *env[4] = {NULL, "WATCHDOG_USEC=200000", NULL, NULL};

        notify_open(f, &rx[i], names[i], false);
        env[0] = rx[i].env;
        env[2] = i == 1 ? "WATCHDOG_PID=$PID" : i == 2 ? other : NULL;
        d[i] = h_daemon_new(f, "2M");
        daemon_spawn_env(d[i], extra, env, -1);
    }
    for (i = 0; i < 3; i++)
        notify_expect(&rx[i], "READY=1", NULL, line, H_READY_TIMEOUT_MS);
    count_watchdogs(rx, 3, 1000, counts);
    print_message("WATCHDOG=1 in 1 s: %d plain, %d with our WATCHDOG_PID, %d with another\n",
                  counts[0], counts[1], counts[2]);
    for (i = 0; i < 2; i++)
        if (counts[i] < 4 || counts[i] > 20)
            h_fail("%s: %d WATCHDOG=1 in 1 s with WATCHDOG_USEC=200000; expected about 10 "
                   "(every 100 ms); got: %s", names[i], counts[i], rx[i].seen);
    if (counts[2] != 0)
        h_fail("WATCHDOG_PID named another process, yet %d WATCHDOG=1 arrived", counts[2]);
    for (i = 0; i < 3; i++)
        notify_close(&rx[i]);
    h_pass(f);
}

/* ---- socket activation ------------------------------------------------------ */

/* h_eventually callback: the path exists. */
/* True when a socket bound at path (arg) listens: /proc/net/unix shows its
 * flags with __SO_ACCEPTCON (0x10000). The path alone appears at bind(),
 * before listen(), when a connect is still refused; and a probing connect
 * would itself be the first connection that activates the daemon. */
static bool path_listens(void *arg)
{
    const char *path = arg;
    char line[PATH_MAX + 128];
    bool found = false;
    FILE *fp = fopen("/proc/net/unix", "re");

    if (fp == NULL)
        return false;
    while (!found && fgets(line, sizeof(line), fp) != NULL) {
        char *name = strrchr(line, ' ');
        unsigned long flags = 0;

        line[strcspn(line, "\n")] = '\0';
        if (name == NULL || strcmp(name + 1, path) != 0)
            continue;
        found = sscanf(line, "%*s %*s %*s %lx", &flags) == 1 && (flags & 0x10000) != 0;
    }
    fclose(fp);
    return found;
}

/* The basename of the program pid runs, into out. */
static void proc_exe(pid_t pid, char *out, size_t len)
{
    char link[64], target[PATH_MAX];
    ssize_t n;
    const char *base;

    snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
    n = readlink(link, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = '\0';
    base = strrchr(target, '/');
    snprintf(out, len, "%s", base != NULL ? base + 1 : target);
}

/* Through systemd's own systemd-socket-activate, which listens first and
 * execs the daemon (same pid) on the first connection: a client that
 * connects and sends hello before the daemon even runs is served from the
 * backlog, a later client too; the daemon says it serves the passed socket
 * and never creates its own --socket; on SIGTERM it exits 0 and leaves the
 * passed socket's path in place (it belongs to systemd). */
static void test_socket_activation(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char activate[PATH_MAX], path[108], exe[PATH_MAX], want[256];
    const char *argv[20];
    struct h_conn c;
    struct stat st;
    json_t *reply;
    shmb_t *lib;
    int n = 0;

    need_systemd_tool("systemd-socket-activate", activate, sizeof(activate));
    h_path(f, "activated.sock", path, sizeof(path));
    argv[n++] = activate;
    argv[n++] = "-l";
    argv[n++] = path;
    /* --socket names a path that must stay unused: the daemon serves the
     * passed socket, and a failed activation cannot fall back to
     * /run/shmbroker. */
    daemon_argv(d, (const char *const[]){"--size", "4M", NULL}, argv + n, 20 - (size_t)n);
    d->pid = spawn(argv, NULL, d->log, d->log, -1);
    if (!h_eventually(path_listens, path, H_READY_TIMEOUT_MS))
        h_fail("systemd-socket-activate did not listen on %s", path);

    /* The daemon does not run yet: only the first connection starts it. */
    proc_exe(d->pid, exe, sizeof(exe));
    assert_string_equal(exe, "systemd-socket-activate");
    assert_int_equal(h_conn_open(&c, path), 0);
    assert_int_equal(h_conn_sendline(&c, "{\"op\":\"hello\",\"version\":1,\"name\":\"early\"}"),
                     0);
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    json_decref(reply);
    h_expect_ok(&c, "{\"op\":\"stats\"}");
    proc_exe(d->pid, exe, sizeof(exe));
    assert_string_equal(exe, "shmbrokerd");

    lib = connect_lib(path);
    put_get(lib, "after", "served after start");
    shmb_close(lib);
    h_conn_close(&c);
    snprintf(want, sizeof(want), "the listening socket systemd passed (fd 3): %s", path);
    assert_true(log_has(d, want));
    /* SIGHUP does not mistake systemd's socket for a changed --socket. */
    assert_int_equal(kill(d->pid, SIGHUP), 0);
    wait_file(d->log, "settings reloaded", 5000);
    assert_false(log_has(d, "not reloadable"));

    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    snprintf(want, sizeof(want), "the socket %s stays with systemd", path);
    if (!log_has(d, want)) {
        h_daemon_print_log(d);
        h_fail("the log does not say \"%s\"", want);
    }
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_false(h_exists(d->socket));
    h_pass(f);
}

/* A listening Unix stream socket at path (bound, listen()ed); the fd. */
static int listen_unix(const char *path, int type, bool do_listen)
{
    struct sockaddr_un sun;
    int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);

    assert_true(fd >= 0);
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
    if (do_listen)
        assert_int_equal(listen(fd, 8), 0);
    return fd;
}

/* Started by a client on systemd's socket, a daemon that reserves a large
 * pool keeps that client waiting (systemd's socket accepted it); status,
 * given no answer within its --timeout, says "starting: ..." with the
 * progress beside the socket systemd passed, not "stopped or stuck"; let
 * go, the waiting client is served. */
static void test_activation_starting(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "1M");
    char activate[PATH_MAX], path[108], lib[PATH_MAX], rel[PATH_MAX], gate[PATH_MAX],
        preload[PATH_MAX + 16], gate_env[PATH_MAX + 32];
    const char *build = getenv("SHMB_BUILD_DIR");
    const char *argv[32], *env[4];
    uint64_t deadline;
    struct h_conn c;
    struct h_run r;
    json_t *reply;
    bool seen = false;
    int n = 0, i;

    need_systemd_tool("systemd-socket-activate", activate, sizeof(activate));
    snprintf(rel, sizeof(rel), "%s/tests/slow_reserve.so", build != NULL ? build : "build");
    if (realpath(rel, lib) == NULL)
        h_skip(f, "tests/slow_reserve.so is not built (make it beside test_operator)");
    h_path(f, "gate", gate, sizeof(gate));
    assert_int_equal(h_write_file(gate, "", 0), 0);
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", lib);
    snprintf(gate_env, sizeof(gate_env), "SHMB_TEST_RESERVE_GATE=%s", gate);
    env[0] = preload;
    env[1] = gate_env;
    env[2] = "ASAN_OPTIONS=verify_asan_link_order=0";
    env[3] = NULL;
    h_path(f, "activated.sock", path, sizeof(path));
    argv[n++] = activate;
    argv[n++] = "-l";
    argv[n++] = path;
    /* systemd-socket-activate passes the daemon only what -E names. */
    for (i = 0; env[i] != NULL; i++) {
        argv[n++] = "-E";
        argv[n++] = env[i];
    }
    daemon_argv(d, (const char *const[]){"--pool", "big:512M", NULL}, argv + n,
                32 - (size_t)n);
    d->pid = spawn(argv, NULL, d->log, d->log, -1);
    if (!h_eventually(path_listens, path, H_READY_TIMEOUT_MS))
        h_fail("systemd-socket-activate did not listen on %s", path);
    assert_int_equal(h_conn_open(&c, path), 0);
    assert_int_equal(h_conn_sendline(&c, "{\"op\":\"hello\",\"version\":1}"), 0);
    deadline = h_now_ms() + 30000;
    while (!seen && h_now_ms() < deadline) {
        assert_int_equal(h_run(f,
                               (const char *const[]){h_ctl_bin(), "--socket", path, "status",
                                                     "--timeout", "1", NULL},
                               NULL, 0, &r),
                         0);
        seen = r.status == 69 &&
               h_contains(r.out, "starting: reserving pool 'big': 256 MiB of 512 MiB");
        if (!seen && h_contains(r.out, "socket "))
            h_fail("the daemon served while held:\n%s", r.out);
        h_run_free(&r);
    }
    if (!seen) {
        h_daemon_print_log(d);
        h_fail("status never said the activated daemon was starting");
    }
    assert_int_equal(unlink(gate), 0);
    reply = h_recv_json(&c);
    h_assert_ok(reply);
    json_decref(reply);
    h_conn_close(&c);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    h_pass(f);
}

/* A descriptor passed as fd 3 with LISTEN_PID naming the daemon and
 * LISTEN_FDS=1 that is not a listening Unix stream socket (a regular file,
 * a datagram socket, a stream socket that does not listen, a TCP listener)
 * is refused: exit 1, a message saying so, no socket and no segment made. */
static void test_activation_bad_fd(void **state)
{
    static const char *const kinds[] = {"regular file", "datagram socket",
                                        "stream socket not listening", "TCP listener"};
    static const char *const env[] = {"LISTEN_PID=$PID", "LISTEN_FDS=1", NULL};
    struct h_fix *f = *state;
    char path[PATH_MAX], seg[PATH_MAX * 2];
    int i;

    for (i = 0; i < 4; i++) {
        struct h_daemon *d = h_daemon_new(f, "2M");
        const char *extra[] = {"--size", "2M", NULL};
        struct sockaddr_in sin;
        int fd = -1, status;

        snprintf(path, sizeof(path), "%s/bad%d", f->dir, i);
        if (i == 0) {
            fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        } else if (i == 1) {
            fd = listen_unix(path, SOCK_DGRAM, false);
        } else if (i == 2) {
            fd = listen_unix(path, SOCK_STREAM, false);
        } else {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            memset(&sin, 0, sizeof(sin));
            sin.sin_family = AF_INET;
            sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
                listen(fd, 8) != 0) {
                print_message("no TCP listener here (%s); that case is left out\n",
                              strerror(errno));
                if (fd >= 0)
                    close(fd);
                continue;
            }
        }
        assert_true(fd >= 0);
        daemon_spawn_env(d, extra, env, fd);
        close(fd);
        status = h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS);
        if (h_exit_code(status) != 1 || !log_has(d, "not a listening Unix stream socket")) {
            h_daemon_print_log(d);
            h_fail("a %s passed as fd 3: exit %d, wanted 1 and \"not a listening Unix "
                   "stream socket\"", kinds[i], h_exit_code(status));
        }
        assert_true(log_has(d, "(fd 3)"));
        assert_false(h_exists(d->socket));
        h_segment_path(d, seg, sizeof(seg));
        assert_false(h_exists(seg));
    }
    h_pass(f);
}

/* Socket activation meant for another process (LISTEN_PID is not the
 * daemon) is ignored: the daemon creates and serves its own --socket, and
 * leaves the stray fd 3 alone. More than one passed socket is refused with a
 * message that says how to fix the unit. */
static void test_activation_not_ours(void **state)
{
    static const char *const other[] = {"LISTEN_PID=1", "LISTEN_FDS=1", NULL};
    static const char *const two[] = {"LISTEN_PID=$PID", "LISTEN_FDS=2", NULL};
    const char *extra[] = {"--size", "2M", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "2M"), *e = h_daemon_new(f, "2M");
    char path[PATH_MAX];
    int fd;

    h_path(f, "stray.sock", path, sizeof(path));
    fd = listen_unix(path, SOCK_STREAM, true);
    daemon_spawn_env(d, extra, other, fd);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("with LISTEN_PID=1 the daemon did not listen on its own --socket");
    }
    h_assert_alive(d);
    assert_false(log_has(d, "stays with systemd"));

    daemon_spawn_env(e, extra, two, fd);
    close(fd);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(e, H_RUN_TIMEOUT_MS)), 1);
    if (!log_has(e, "systemd passed 2 sockets")) {
        h_daemon_print_log(e);
        h_fail("LISTEN_FDS=2 was not refused with \"systemd passed 2 sockets\"");
    }
    assert_false(h_exists(e->socket));
    h_pass(f);
}

/* ---- the service's lifecycle: keep, remove, check, reload, refused start ----- */

static void expect_max_clients(const struct h_daemon *d, unsigned n);

/* Run shmbrokerd with d's --name and --shm-dir (and --socket) and extra,
 * an action that exits; r holds its status and output. */
static void run_daemon_action(struct h_fix *f, const struct h_daemon *d,
                              const char *const *extra, struct h_run *r)
{
    const char *argv[32];

    daemon_argv(d, extra, argv, sizeof(argv) / sizeof(argv[0]));
    run_env(f, argv, NULL, H_RUN_TIMEOUT_MS, r);
}

/* The run exited with status and its output (stdout or stderr) holds
 * needle; otherwise the test fails showing it. */
static void expect_action(const struct h_run *r, const char *what, int status,
                          const char *needle)
{
    if (r->status != status ||
        (!h_contains(r->out, needle) && !h_contains(r->err, needle))) {
        h_run_dump(what, r);
        h_fail("%s: exit %d, wanted %d and \"%s\"", what, r->status, status, needle);
    }
}

/* --keep-segment: a clean stop leaves the segment with its committed
 * objects (and says how many), the next start adopts it and serves them;
 * a stop without the flag removes it. */
static void test_keep_segment(void **state)
{
    const char *keep[] = {"--size", "4M", "--keep-segment", NULL};
    const char *plain[] = {"--size", "4M", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M"), *e;
    char seg[PATH_MAX * 2];
    const void *ptr;
    size_t size;
    shmb_t *lib;

    h_segment_path(d, seg, sizeof(seg));
    daemon_spawn_env(d, keep, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    lib = connect_lib(d->socket);
    assert_int_equal(shmb_put(lib, "kept", "across the stop", 15, 0), 0);
    shmb_close(lib);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    if (!h_exists(seg) || !log_has(d, "kept with 1 object ")) {
        h_daemon_print_log(d);
        h_fail("--keep-segment: a clean stop did not keep %s and say so", seg);
    }

    e = h_daemon_again(f, d);
    daemon_spawn_env(e, plain, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(e, H_READY_TIMEOUT_MS), 0);
    assert_true(log_has(e, "restored 1 object "));
    lib = connect_lib(e->socket);
    assert_int_equal(shmb_get(lib, "kept", &ptr, &size), 0);
    assert_int_equal(size, 15);
    assert_memory_equal(ptr, "across the stop", 15);
    shmb_close(lib);
    assert_int_equal(h_exit_code(h_daemon_signal(e, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    if (h_exists(seg))
        h_fail("a stop without --keep-segment left %s", seg);
    h_pass(f);
}

/* --remove-segment removes a segment no daemon holds (and its lock file),
 * refuses one a running daemon holds or a file that is not a segment
 * (leaving both), and is content when there is none. */
static void test_remove_segment(void **state)
{
    const char *keep[] = {"--size", "4M", "--keep-segment", NULL};
    const char *remove[] = {"--remove-segment", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char seg[PATH_MAX * 2], lock[PATH_MAX * 2];
    struct h_run r;

    h_segment_path(d, seg, sizeof(seg));
    snprintf(lock, sizeof(lock), "%s/.%s.lock", d->shm_dir, d->name);
    daemon_spawn_env(d, keep, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    run_daemon_action(f, d, remove, &r);
    expect_action(&r, "--remove-segment while the daemon runs", 1,
                  "belongs to a running shmbrokerd");
    h_run_free(&r);
    assert_true(h_exists(seg));
    h_assert_alive(d);

    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_true(h_exists(seg));
    run_daemon_action(f, d, remove, &r);
    expect_action(&r, "--remove-segment after a kept stop", 0, "removed segment");
    h_run_free(&r);
    if (h_exists(seg) || h_exists(lock))
        h_fail("--remove-segment left %s or its lock file", seg);
    run_daemon_action(f, d, remove, &r);
    expect_action(&r, "--remove-segment with none", 0, "nothing to remove");
    h_run_free(&r);

    /* A kept segment whose magic a read-write client zeroed is still the
     * segment (a start would adopt it): removed, its memory freed. */
    daemon_spawn_env(d, keep, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    {
        int fd = open(seg, O_WRONLY | O_CLOEXEC);
        static const char zeros[8];

        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, zeros, sizeof(zeros), 0), (ssize_t)sizeof(zeros));
        close(fd);
    }
    run_daemon_action(f, d, (const char *const[]){"--size", "4M", "--remove-segment", NULL},
                      &r);
    expect_action(&r, "--remove-segment of a kept segment with its magic zeroed", 0,
                  "removed segment");
    h_run_free(&r);
    assert_false(h_exists(seg));

    /* A segment another user could read (mode 0644), as a start refuses
     * it: left alone, even by root. */
    daemon_spawn_env(d, keep, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    assert_int_equal(chmod(seg, 0644), 0);
    run_daemon_action(f, d, remove, &r);
    expect_action(&r, "--remove-segment of a segment others may read", 1, "Left alone.");
    h_run_free(&r);
    assert_true(h_exists(seg));
    unlink(seg);

    assert_int_equal(h_write_file(seg, "not a segment\n", 14), 0);
    run_daemon_action(f, d, remove, &r);
    expect_action(&r, "--remove-segment of another file", 1, "not a shmbroker segment");
    h_run_free(&r);
    assert_true(h_exists(seg));
    unlink(seg);
    h_pass(f);
}

/* --check-config parses the flags and the --config file as a start would:
 * exit 0 and "settings OK" for good ones; exit 2 naming the file's line for
 * a bad value, an action written in the file, or two actions at once. */
static void test_check_config(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char path[PATH_MAX], line[PATH_MAX + 32];
    const char *check[] = {"--config", path, "--check-config", NULL};
    const char *both[] = {"--check-config", "--reload", "1", NULL};
    struct h_run r;

    h_path(f, "settings.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, "size = 8M\nmax-clients = 7\n", 26), 0);
    run_daemon_action(f, d, check, &r);
    expect_action(&r, "--check-config", 0, "settings OK");
    h_run_free(&r);

    assert_int_equal(h_write_file(path, "size = 8M\nmax-clients = lots\n", 29), 0);
    run_daemon_action(f, d, check, &r);
    expect_action(&r, "--check-config of a bad value", 2, "Invalid --max-clients 'lots'");
    h_run_free(&r);
    assert_int_equal(h_write_file(path, "reload = 1\n", 11), 0);
    run_daemon_action(f, d, check, &r);
    snprintf(line, sizeof(line), "%s:1: 'reload' is something to do", path);
    expect_action(&r, "--check-config of an action in the file", 2, line);
    h_run_free(&r);
    run_daemon_action(f, d, both, &r);
    expect_action(&r, "--check-config --reload", 2, "give one of them");
    h_run_free(&r);
    /* Nothing was made. */
    assert_false(h_exists(d->socket));
    h_pass(f);
}

/* A child that names itself with a terminal escape and a carriage return,
 * and waits to be killed. */
static int renamed_sleeper(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "x\x1b[2J\r<0>F", 0, 0, 0);
    pause();
    return 0;
}

/* --reload PID applies an edited --config file to the daemon PID (its
 * max-clients changes), refuses a broken file without signalling (the
 * daemon keeps its settings), and signals nothing but a shmbrokerd. */
static void test_reload_pid(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char path[PATH_MAX], pid[32], *text;
    const char *extra[] = {"--config", path, NULL};
    const char *reload[] = {"--config", path, "--reload", pid, NULL};
    const char *sleeper[] = {"/bin/sleep", "30", NULL};
    char out[PATH_MAX];
    struct h_conn c;
    struct h_run r;
    pid_t other;

    h_path(f, "settings.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, "size = 4M\nmax-clients = 5\n", 26), 0);
    daemon_spawn_env(d, extra, NULL, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    snprintf(pid, sizeof(pid), "%d", (int)d->pid);

    assert_int_equal(h_write_file(path, "size = 4M\nmax-clients = 1\n", 26), 0);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload", 0, "asked to reload");
    h_run_free(&r);
    h_wait_log(d, "SIGHUP: settings reloaded (log level info, max-clients 1,");
    json_decref(h_open_hello(&c, d));
    expect_max_clients(d, 1);
    h_conn_close(&c);

    assert_int_equal(h_write_file(path, "size = 4M\nmax-clients = -1\n", 27), 0);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload with a broken file", 2, "Invalid --max-clients '-1'");
    h_run_free(&r);
    h_sleep_ms(200);
    text = h_log_text(d);
    assert_int_equal(h_count(text, "SIGHUP"), 1);
    free(text);

    assert_int_equal(h_write_file(path, "size = 4M\n", 10), 0);
    /* A program that only calls itself shmbrokerd is not sent anything:
     * it does not hold the segment's lock. */
    {
        char fake[PATH_MAX], cmd[PATH_MAX * 2 + 16];
        const char *impostor[] = {fake, "30", NULL};

        h_path(f, "shmbrokerd", fake, sizeof(fake));
        snprintf(cmd, sizeof(cmd), "cp /bin/sleep %s", fake);
        assert_int_equal(system(cmd), 0);
        h_path(f, "impostor.out", out, sizeof(out));
        other = spawn(impostor, NULL, out, out, -1);
        h_sleep_ms(100);
        snprintf(pid, sizeof(pid), "%d", (int)other);
        run_daemon_action(f, d, reload, &r);
        expect_action(&r, "--reload of a program named shmbrokerd", 1,
                      "does not hold the lock of segment");
        h_run_free(&r);
        h_sleep_ms(100);
        assert_int_equal(waitpid(other, NULL, WNOHANG), 0); /* still running */
        kill(other, SIGKILL);
        waitpid(other, NULL, 0);
    }
    h_path(f, "sleeper.out", out, sizeof(out));
    other = spawn(sleeper, NULL, out, out, -1);
    snprintf(pid, sizeof(pid), "%d", (int)other);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload of another program", 1, "not shmbrokerd; nothing sent");
    h_run_free(&r);
    h_sleep_ms(100);
    assert_int_equal(waitpid(other, NULL, WNOHANG), 0); /* still running */
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload of a pid that is gone", 1, "no such process");
    h_run_free(&r);

    /* A process picks its own name: a terminal escape or a carriage return
     * in it reaches neither the terminal nor the journal raw. */
    other = h_fork(f, renamed_sleeper, NULL);
    h_sleep_ms(100);
    snprintf(pid, sizeof(pid), "%d", (int)other);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload of a process named with control bytes", 1,
                  "not shmbrokerd");
    if (h_contains(r.err, "\x1b") || h_contains(r.err, "\r") ||
        !h_contains(r.err, "\\x1b")) {
        h_run_dump("--reload", &r);
        h_fail("a process's name reached --reload's message with its control bytes raw");
    }
    h_run_free(&r);
    h_child_kill(f, other, SIGKILL);
    h_assert_alive(d);
    h_pass(f);
}

/* Issue 24: under socket activation the listening socket was made by
 * another process, which keeps it (systemd; the test here). --reload of a
 * daemon whose first pool is a memfd still finds the daemon holding that
 * socket, as systemd's ExecReload runs it, and the daemon reloads. */
static void test_reload_activated_memfd(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    static const char before[] = "pool = mem:4M,backing=memfd\nmax-clients = 5\n";
    static const char after[] = "pool = mem:4M,backing=memfd\nmax-clients = 3\n";
    char conf[PATH_MAX], pid[32];
    const char *extra[] = {"--config", conf, NULL};
    const char *reload[] = {"--config", conf, "--reload", pid, NULL};
    const char *env[] = {"LISTEN_PID=$PID", "LISTEN_FDS=1", NULL};
    struct h_run r;
    int fd;

    h_path(f, "memfd.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, before, strlen(before)), 0);
    fd = listen_unix(d->socket, SOCK_STREAM, true);
    daemon_spawn_env(d, extra, env, fd);
    wait_file(d->log, " ready: ", H_READY_TIMEOUT_MS);
    assert_true(log_has(d, "serving the listening socket systemd passed (fd 3)"));
    snprintf(pid, sizeof(pid), "%d", (int)d->pid);
    assert_int_equal(h_write_file(conf, after, strlen(after)), 0);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload of an activated daemon with a memfd pool", 0,
                  "asked to reload");
    h_run_free(&r);
    wait_file(d->log, "SIGHUP: settings reloaded (log level info, max-clients 3,", 5000);
    close(fd);
    h_pass(f);
}

/* What listen_named_line makes: a line of /proc/net/unix naming path. */
struct named_line {
    const char *path;    /* the listener the line names */
    const char *segment; /* not NULL: also a memfd of that name, and the name shmbrokerd */
};

/* Any local user can do this: a socket whose abstract name holds a newline
 * and then a whole line of /proc/net/unix (which prints names as they are)
 * saying that a stream socket listens on arg's path, its inode one that
 * this process holds. Waits, holding both (SIGHUP's default ends it). */
static int listen_named_line(void *arg)
{
    const struct named_line *nl = arg;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    struct stat st;
    int held = socket(AF_UNIX, SOCK_STREAM, 0), fd = socket(AF_UNIX, SOCK_STREAM, 0), len;

    if (held < 0 || fd < 0 || fstat(held, &st) != 0)
        return 1;
    len = snprintf(sun.sun_path + 1, sizeof(sun.sun_path) - 1,
                   "x\n0000000000000000: 00000002 00000000 00010000 0001 01 %lu %s",
                   (unsigned long)st.st_ino, nl->path);
    if (len < 0 || (size_t)len >= sizeof(sun.sun_path) - 1 ||
        bind(fd, (struct sockaddr *)&sun,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)) != 0 ||
        listen(fd, 1) != 0)
        return 1;
    if (nl->segment != NULL && (syscall(SYS_memfd_create, nl->segment, 0) < 0 ||
                                prctl(PR_SET_NAME, "shmbrokerd", 0, 0, 0) != 0))
        return 1;
    for (;;)
        pause();
    return 0;
}

/* Issue 24: a line another user's socket writes into /proc/net/unix does
 * not decide --reload. The socket-activated daemon of a memfd pool still
 * reloads when a second listener seems to carry its --socket (it was
 * refused: "2 listening sockets are named ..."), and a process that calls
 * itself shmbrokerd, holds a memfd named like the segment and a socket the
 * forged line names is refused when no daemon listens at --socket (it was
 * sent SIGHUP, and --reload said the daemon had reloaded). */
static void test_reload_forged_listener(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    static const char before[] = "pool = mem:4M,backing=memfd\nmax-clients = 5\n";
    static const char after[] = "pool = mem:4M,backing=memfd\nmax-clients = 3\n";
    char conf[PATH_MAX], pid[32], nobody[PATH_MAX], segment[128];
    const char *extra[] = {"--config", conf, NULL};
    const char *reload[] = {"--config", conf, "--reload", pid, NULL};
    const char *elsewhere[] = {"--config", conf, "--socket", nobody, "--reload", pid, NULL};
    const char *env[] = {"LISTEN_PID=$PID", "LISTEN_FDS=1", NULL};
    struct named_line forged = {.path = d->socket}, impostor;
    struct h_run r;
    pid_t forger, other;
    int fd;

    h_path(f, "memfd.conf", conf, sizeof(conf));
    h_path(f, "nobody.sock", nobody, sizeof(nobody));
    assert_int_equal(h_write_file(conf, before, strlen(before)), 0);
    fd = listen_unix(d->socket, SOCK_STREAM, true);
    daemon_spawn_env(d, extra, env, fd);
    wait_file(d->log, " ready: ", H_READY_TIMEOUT_MS);
    forger = h_fork(f, listen_named_line, &forged);
    assert_true(forger > 0);
    h_sleep_ms(200); /* its socket listens */
    assert_int_equal(waitpid(forger, NULL, WNOHANG), 0);
    snprintf(pid, sizeof(pid), "%d", (int)d->pid);
    assert_int_equal(h_write_file(conf, after, strlen(after)), 0);
    run_daemon_action(f, d, reload, &r);
    expect_action(&r, "--reload of an activated daemon beside a forged listener", 0,
                  "asked to reload");
    h_run_free(&r);
    wait_file(d->log, "SIGHUP: settings reloaded (log level info, max-clients 3,", 5000);

    snprintf(segment, sizeof(segment), "%s.mem", d->name);
    impostor.path = nobody;
    impostor.segment = segment;
    other = h_fork(f, listen_named_line, &impostor);
    assert_true(other > 0);
    h_sleep_ms(200); /* it has its memfd, its name and its socket */
    assert_int_equal(waitpid(other, NULL, WNOHANG), 0);
    snprintf(pid, sizeof(pid), "%d", (int)other);
    run_daemon_action(f, d, elsewhere, &r);
    expect_action(&r, "--reload of an impostor named by a forged line", 1, "nothing sent");
    h_run_free(&r);
    h_sleep_ms(200);
    assert_int_equal(waitpid(other, NULL, WNOHANG), 0); /* no SIGHUP reached it */
    h_child_kill(f, other, SIGKILL);
    h_child_kill(f, forger, SIGKILL);
    close(fd);
    h_pass(f);
}

/* A library client waiting on the socket given as arg: connects (its hello
 * sent into the backlog), then expects the refusal of a start. */
static int refused_library_client(void *arg)
{
    shmb_t *c = shmb_new();
    int rc = c != NULL ? shmb_connect(c, arg, "waiting") : -ENOMEM;

    if (rc == 0 || c == NULL || !h_contains(shmb_errmsg(c), "shmbrokerd cannot start: ")) {
        fprintf(stderr, "shmb_connect to a daemon that cannot start: %d %s\n", rc,
                c != NULL ? shmb_errmsg(c) : "");
        return 1;
    }
    shmb_close(c);
    return 0;
}

/* A start refused under socket activation answers the client already
 * waiting in the backlog with the cause (so that systemd does not start the
 * daemon again for it, in a loop), leaves the backlog empty, and tells
 * systemd through STATUS= and ERRNO=: exit 1 for a refused start, 2 for bad
 * settings. */
static void test_activation_refused_start(void **state)
{
    static const struct {
        const char *flag, *value, *cause, *status;
        int exit_code, errno_value;
    } cases[] = {
        {"--size", "1K", "--size 1024 is too small", "STATUS=failed to start: --size 1024",
         1, EINVAL},
        {"--max-clients", "lots", "Invalid --max-clients 'lots'",
         "STATUS=failed to start: Invalid --max-clients", 2, EINVAL},
    };
    struct h_fix *f = *state;
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct h_daemon *d = h_daemon_new(f, "4M");
        const char *extra[] = {"--size", "4M", cases[i].flag, cases[i].value, NULL};
        char path[PATH_MAX], name[32], msg[2048], want[64], seg[PATH_MAX * 2];
        const char *env[] = {"LISTEN_PID=$PID", "LISTEN_FDS=1", NULL, NULL};
        struct notify_rx rx;
        struct h_conn c;
        json_t *reply;
        int fd, peer;
        pid_t lib_client;

        snprintf(name, sizeof(name), "notify%zu", i);
        notify_open(f, &rx, name, false);
        env[2] = rx.env;
        snprintf(name, sizeof(name), "activated%zu.sock", i);
        h_path(f, name, path, sizeof(path));
        fd = listen_unix(path, SOCK_STREAM, true);
        /* Clients in the backlog before the daemon runs, as systemd's
         * socket holds them: one silent, one the library's, its hello sent. */
        assert_int_equal(h_conn_open(&c, path), 0);
        lib_client = h_fork(f, refused_library_client, path);
        h_sleep_ms(200);
        daemon_spawn_env(d, extra, env, fd);
        if (h_exit_code(h_daemon_wait_exit(d, H_RUN_TIMEOUT_MS)) != cases[i].exit_code) {
            h_daemon_print_log(d);
            h_fail("%s %s under activation: not exit %d", cases[i].flag, cases[i].value,
                   cases[i].exit_code);
        }
        reply = h_recv_json(&c);
        h_assert_error(reply, "EINVAL", "shmbrokerd cannot start: ");
        h_assert_error(reply, "EINVAL", cases[i].cause);
        json_decref(reply);
        h_conn_close(&c);
        if (h_child_wait(f, lib_client, H_RUN_TIMEOUT_MS) != 0)
            h_fail("the library's client was not told why the start was refused");
        /* Nobody left waiting: systemd would not start it again. */
        assert_int_equal(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
        peer = accept(fd, NULL, NULL);
        assert_int_equal(peer, -1);
        assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        close(fd);
        /* The whole datagram: STATUS= and ERRNO= travel together. */
        do {
            if (notify_recv(&rx, msg, sizeof(msg), H_RUN_TIMEOUT_MS) < 0)
                h_fail("no STATUS=failed to start from a refused start");
        } while (!h_contains(msg, "STATUS=failed to start: "));
        if (!h_contains(msg, cases[i].status))
            h_fail("the STATUS= of a refused start is not \"%s\": %s", cases[i].status, msg);
        snprintf(want, sizeof(want), "\nERRNO=%d", cases[i].errno_value);
        if (!h_contains(msg, want))
            h_fail("the refused start sent no %s: %s", want + 1, msg);
        notify_close(&rx);
        h_segment_path(d, seg, sizeof(seg));
        assert_false(h_exists(seg));
    }
    h_pass(f);
}

/* "JOURNAL_STREAM=dev:ino" of d's log (made empty), into out; the inode
 * plus skew, to name another file. */
static void journal_stream_of(const struct h_daemon *d, unsigned skew, char *out, size_t len)
{
    struct stat st;

    assert_int_equal(h_write_file(d->log, "", 0), 0);
    assert_int_equal(stat(d->log, &st), 0);
    snprintf(out, len, "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + skew);
}

/* With stderr on journald's stream ($JOURNAL_STREAM naming its device and
 * inode), lines carry the syslog priority journald reads ("<6>" info, "<3>"
 * error) and no time stamp or pid of their own, which the journal adds;
 * with $JOURNAL_STREAM naming another file, lines keep their stamp. */
static void test_journal_stream(void **state)
{
    const char *extra[] = {"--size", "4M", NULL};
    const char *bad[] = {"--size", "1K", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M"), *e = h_daemon_new(f, "4M");
    struct h_daemon *g = h_daemon_new(f, "4M");
    char stream[64], other[64], *text;
    const char *env[] = {stream, NULL};
    const char *env_other[] = {other, NULL};

    journal_stream_of(d, 0, stream, sizeof(stream));
    journal_stream_of(d, 1, other, sizeof(other));
    daemon_spawn_env(d, extra, env, -1);
    assert_int_equal(h_daemon_wait_ready(d, H_READY_TIMEOUT_MS), 0);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    text = h_read_file(d->log, NULL);
    if (text == NULL || strncmp(text, "<6>shmbrokerd ", 14) != 0 ||
        !h_contains(text, "\n<6>Terminated received") || h_contains(text, "Z shmbrokerd[")) {
        h_daemon_print_log(d);
        free(text);
        h_fail("lines to the journal do not start with <6> alone");
    }
    free(text);

    /* A refused start's last word, at error priority. */
    journal_stream_of(e, 0, stream, sizeof(stream));
    daemon_spawn_env(e, bad, env, -1);
    assert_int_equal(h_exit_code(h_daemon_wait_exit(e, H_RUN_TIMEOUT_MS)), 1);
    if (!log_has(e, "<3>shmbrokerd: --size 1024 is too small")) {
        h_daemon_print_log(e);
        h_fail("a refused start does not say so at error priority to the journal");
    }

    /* A newline in a flag stays in its line: no second line, no forged
     * priority. */
    {
        struct h_daemon *n = h_daemon_new(f, "4M");
        const char *forged[] = {"--size", "4M", "--shm-dir", "/nonexistent\n<0>FORGED", NULL};

        journal_stream_of(n, 0, stream, sizeof(stream));
        daemon_spawn_env(n, forged, env, -1);
        assert_int_not_equal(h_exit_code(h_daemon_wait_exit(n, H_RUN_TIMEOUT_MS)), 0);
        text = h_read_file(n->log, NULL);
        assert_non_null(text);
        if (!h_contains(text, "<3>shmbrokerd: ") || h_contains(text, "\n<0>") ||
            h_count(text, "\n") != 1) {
            h_daemon_print_log(n);
            free(text);
            h_fail("a newline in --shm-dir made a line of its own in the journal");
        }
        free(text);
    }

    daemon_spawn_env(g, extra, env_other, -1);
    assert_int_equal(h_daemon_wait_ready(g, H_READY_TIMEOUT_MS), 0);
    /* The socket listens a moment before the "ready" line is written. */
    h_wait_log(g, "Z shmbrokerd[");
    assert_false(log_has(g, "<6>"));
    h_pass(f);
}

/* ---- install ---------------------------------------------------------------- */

/* The arguments that make the sub-make use the build of the binaries under
 * test: BUILD=<their directory> and SANITIZER to match it ("" when plain).
 * *sanflag is the compiler flag a program linking that library needs. */
static void build_settings(char *build_arg, size_t blen, char *san_arg, size_t slen,
                           const char **sanflag)
{
    char bin[PATH_MAX], *slash;
    const char *base;

    if (realpath(h_daemon_bin(), bin) == NULL)
        h_fail("%s: %s", h_daemon_bin(), strerror(errno));
    slash = strrchr(bin, '/');
    *slash = '\0';
    base = strrchr(bin, '/') != NULL ? strrchr(bin, '/') + 1 : bin;
    snprintf(build_arg, blen, "BUILD=%s", bin);
    *sanflag = NULL;
    if (strcmp(base, "build-address") == 0) {
        snprintf(san_arg, slen, "SANITIZER=address");
        *sanflag = "-fsanitize=address";
    } else if (strcmp(base, "build-undefined") == 0) {
        snprintf(san_arg, slen, "SANITIZER=undefined");
        *sanflag = "-fsanitize=undefined";
    } else {
        snprintf(san_arg, slen, "SANITIZER=");
    }
}

/* Run make TARGET DESTDIR=destdir PREFIX=/usr/local in the source tree, for
 * the build under test; fails the test unless it exits 0. */
static void run_make_prefix(struct h_fix *f, const char *target, const char *destdir,
                            const char *prefix, const char **sanflag)
{
    /* A make test that runs us passes its jobserver and flags down; this
     * make is separate. */
    static const char *const env[] = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", NULL};
    char make[PATH_MAX], root[PATH_MAX], dest_arg[PATH_MAX + 16], build_arg[PATH_MAX + 16];
    char san_arg[64], prefix_arg[PATH_MAX + 16];
    struct h_run r;

    need_program(f, "make", make, sizeof(make));
    snprintf(prefix_arg, sizeof(prefix_arg), "PREFIX=%s", prefix);
    repo_root(root, sizeof(root));
    build_settings(build_arg, sizeof(build_arg), san_arg, sizeof(san_arg), sanflag);
    snprintf(dest_arg, sizeof(dest_arg), "DESTDIR=%s", destdir);
    run_env(f,
            (const char *const[]){make, "--no-print-directory", "-C", root, target, dest_arg,
                                  prefix_arg, build_arg, san_arg, NULL},
            env, INSTALL_TIMEOUT_MS, &r);
    if (r.status != 0) {
        h_run_dump(target, &r);
        h_fail("make %s DESTDIR=%s %s failed", target, destdir, prefix_arg);
    }
    h_run_free(&r);
}

/* make TARGET DESTDIR=destdir PREFIX=/usr/local from the repository root. */
static void run_make(struct h_fix *f, const char *target, const char *destdir,
                     const char **sanflag)
{
    run_make_prefix(f, target, destdir, "/usr/local", sanflag);
}

/* The installed unit and pkg-config file name the PREFIX of the install,
 * whatever an earlier build or install used. */
static void test_install_prefix(void **state)
{
    struct h_fix *f = *state;
    char dest[PATH_MAX], p[PATH_MAX * 2];
    const char *sanflag;
    char *text;

    h_path(f, "dest", dest, sizeof(dest));
    assert_int_equal(mkdir(dest, 0755), 0);
    run_make_prefix(f, "install", dest, "/usr", &sanflag);
    snprintf(p, sizeof(p), "%s/usr/lib/systemd/system/shmbrokerd.service", dest);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "ExecStart=/usr/sbin/shmbrokerd "));
    free(text);
    snprintf(p, sizeof(p), "%s/usr/lib/pkgconfig/shmbroker.pc", dest);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "libdir=/usr/lib\n"));
    assert_null(strstr(text, "/usr/local"));
    free(text);
    run_make_prefix(f, "uninstall", dest, "/usr", &sanflag);
    h_pass(f);
}

/* The strings of a 64-bit ELF file's dynamic entries with the given tag
 * (DT_SONAME, DT_NEEDED), each followed by a space, into out. -1 when the
 * file is not a 64-bit ELF file with a dynamic section. */
static int elf_dynamic_strings(const char *path, int64_t tag, char *out, size_t len)
{
    size_t size = 0, i, j;
    char *buf = h_read_file(path, &size);
    Elf64_Ehdr eh;
    int rc = -1;

    out[0] = '\0';
    if (buf == NULL || size < sizeof(eh))
        goto out;
    memcpy(&eh, buf, sizeof(eh));
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > size ||
        (size - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
        goto out;
    for (i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh, strtab;

        memcpy(&sh, buf + eh.e_shoff + i * sizeof(sh), sizeof(sh));
        if (sh.sh_type != SHT_DYNAMIC || sh.sh_link >= eh.e_shnum || sh.sh_offset > size ||
            sh.sh_size > size - sh.sh_offset)
            continue;
        memcpy(&strtab, buf + eh.e_shoff + sh.sh_link * sizeof(strtab), sizeof(strtab));
        if (strtab.sh_offset > size || strtab.sh_size > size - strtab.sh_offset)
            continue;
        rc = 0;
        for (j = 0; j + sizeof(Elf64_Dyn) <= sh.sh_size; j += sizeof(Elf64_Dyn)) {
            Elf64_Dyn dyn;

            memcpy(&dyn, buf + sh.sh_offset + j, sizeof(dyn));
            if (dyn.d_tag == DT_NULL)
                break;
            if (dyn.d_tag == tag && dyn.d_un.d_val < strtab.sh_size) {
                const char *s = buf + strtab.sh_offset + dyn.d_un.d_val;

                if (memchr(s, '\0', strtab.sh_size - dyn.d_un.d_val) != NULL &&
                    strlen(out) + strlen(s) + 2 < len) {
                    strcat(out, s);
                    strcat(out, " ");
                }
            }
        }
    }
out:
    free(buf);
    return rc;
}

/* Everything make install puts under DESTDIR/usr/local. */
static const char *const installed_files[] = {
    "sbin/shmbrokerd",
    "bin/shmbrokerctl",
    "lib/libshmbroker.a",
    "lib/libshmbroker.so.1",
    "lib/libshmbroker.so",
    "include/shmbroker.h",
    "lib/pkgconfig/shmbroker.pc",
    "lib/systemd/system/shmbrokerd.service",
    "lib/systemd/system/shmbrokerd.socket",
    "lib/sysusers.d/shmbroker.conf",
    "share/man/man8/shmbrokerd.8",
    "share/man/man1/shmbrokerctl.1",
    "sbin/shmbroker-relay",
    "lib/systemd/system/shmbroker-relay.service",
    "share/man/man8/shmbroker-relay.8",
};

/* The settings files, under DESTDIR (SYSCONFDIR is /etc whatever PREFIX):
 * installed when absent, kept by make uninstall (they are the operator's). */
static const char *const settings_files[] = {"etc/shmbrokerd.conf", "etc/default/shmbrokerd",
                                              "etc/default/shmbroker-relay"};

/* Files and symlinks nftw found (nftw has no user argument). */
static int leftover_count;

/* nftw callback: count what is not a directory nor a settings file, and say
 * what it is. */
static int count_leftover(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    size_t i, n = strlen(path);

    (void)st;
    (void)ftw;
    for (i = 0; i < sizeof(settings_files) / sizeof(settings_files[0]); i++)
        if (n >= strlen(settings_files[i]) &&
            strcmp(path + n - strlen(settings_files[i]), settings_files[i]) == 0)
            return 0;
    if (flag != FTW_D && flag != FTW_DP) {
        print_error("left after make uninstall: %s\n", path);
        leftover_count++;
    }
    return 0;
}

/* A "@NAME@" make install fills in, left unfilled. */
static bool has_placeholder(const char *text)
{
    const char *at = text;

    while ((at = strchr(at, '@')) != NULL) {
        const char *end = at + 1;

        while (*end >= 'A' && *end <= 'Z')
            end++;
        if (*end == '@' && end > at + 1)
            return true;
        at++;
    }
    return false;
}

/* The same bytes in both files. */
static bool same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *ta = h_read_file(a, &la), *tb = h_read_file(b, &lb);
    bool same = ta != NULL && tb != NULL && la == lb && memcmp(ta, tb, la) == 0;

    free(ta);
    free(tb);
    return same;
}

/* make install DESTDIR=... PREFIX=/usr/local puts the daemon and ctl (mode
 * 0755), the static and shared library (SONAME libshmbroker.so.1, the .so
 * symlink to it), the header, the pkg-config file (with the prefix, not the
 * DESTDIR), both units (the service naming /usr/local/sbin/shmbrokerd), the
 * sysusers file and both man pages where they belong; make uninstall
 * removes every one of them. */
static void test_install_tree(void **state)
{
    struct h_fix *f = *state;
    char dest[PATH_MAX], root[PATH_MAX], p[PATH_MAX * 2], q[PATH_MAX * 2], link[64];
    char soname[256];
    const char *sanflag;
    struct stat st;
    char *text;
    size_t i;
    ssize_t n;

    h_path(f, "dest", dest, sizeof(dest));
    assert_int_equal(mkdir(dest, 0755), 0);
    run_make(f, "install", dest, &sanflag);
    repo_root(root, sizeof(root));

    for (i = 0; i < sizeof(installed_files) / sizeof(installed_files[0]); i++) {
        snprintf(p, sizeof(p), "%s/usr/local/%s", dest, installed_files[i]);
        if (lstat(p, &st) != 0)
            h_fail("make install did not create %s", p);
    }
    snprintf(p, sizeof(p), "%s/usr/local/sbin/shmbrokerd", dest);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0755);
    snprintf(p, sizeof(p), "%s/usr/local/bin/shmbrokerctl", dest);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0755);

    snprintf(p, sizeof(p), "%s/usr/local/lib/libshmbroker.so", dest);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    n = readlink(p, link, sizeof(link) - 1);
    assert_true(n > 0);
    link[n] = '\0';
    assert_string_equal(link, "libshmbroker.so.1");
    snprintf(p, sizeof(p), "%s/usr/local/lib/libshmbroker.so.1", dest);
    if (elf_dynamic_strings(p, DT_SONAME, soname, sizeof(soname)) < 0)
        h_fail("%s is not a 64-bit shared object", p);
    assert_string_equal(soname, "libshmbroker.so.1 ");
    snprintf(p, sizeof(p), "%s/usr/local/lib/libshmbroker.a", dest);
    text = h_read_file(p, NULL);
    assert_true(text != NULL && strncmp(text, "!<arch>\n", 8) == 0);
    free(text);

    snprintf(p, sizeof(p), "%s/usr/local/lib/systemd/system/shmbrokerd.service", dest);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    if (!h_contains(text, "\nExecStart=/usr/local/sbin/shmbrokerd --config "
                          "/etc/shmbrokerd.conf --keep-segment $SHMBROKERD_OPTS\n") ||
        !h_contains(text, "\nExecReload=/usr/local/sbin/shmbrokerd --config "
                          "/etc/shmbrokerd.conf --keep-segment $SHMBROKERD_OPTS --reload "
                          "$MAINPID\n") ||
        !h_contains(text, "\nEnvironmentFile=-/etc/default/shmbrokerd\n") ||
        h_contains(text, "/bin/kill") || has_placeholder(text)) {
        print_error("%s:\n%s", p, text);
        free(text);
        h_fail("the installed service does not run /usr/local/sbin/shmbrokerd with "
               "/etc/shmbrokerd.conf, or reloads with kill(1)");
    }
    /* ExecReload's --reload proves $MAINPID by the kernel's sock_diag: without
     * netlink it falls back to names in /proc/net/unix, which any local user
     * can forge (test_reload_forged_listener). */
    if (!h_contains(text, "\nRestrictAddressFamilies=AF_UNIX AF_NETLINK\n")) {
        print_error("%s:\n%s", p, text);
        free(text);
        h_fail("the installed service does not let --reload use AF_NETLINK");
    }
    free(text);
    snprintf(p, sizeof(p), "%s/usr/local/lib/systemd/system/shmbrokerd.socket", dest);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    if (!h_contains(text, "\nExecStopPost=-/usr/local/sbin/shmbrokerd --config "
                          "/etc/shmbrokerd.conf $SHMBROKERD_OPTS --remove-segment\n") ||
        has_placeholder(text)) {
        print_error("%s:\n%s", p, text);
        free(text);
        h_fail("the installed socket does not remove the segment with "
               "/usr/local/sbin/shmbrokerd when it stops");
    }
    free(text);
    /* The settings files, as shipped; an operator's edit survives a second
     * make install, and make uninstall keeps it. */
    for (i = 0; i < sizeof(settings_files) / sizeof(settings_files[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dest, settings_files[i]);
        snprintf(q, sizeof(q), "%s/systemd/%s", root,
                 i == 0 ? "shmbrokerd.conf" : i == 1 ? "shmbrokerd.default"
                                                    : "shmbroker-relay.default");
        if (!same_file(p, q))
            h_fail("%s differs from %s", p, q);
    }
    snprintf(p, sizeof(p), "%s/etc/shmbrokerd.conf", dest);
    assert_int_equal(h_write_file(p, "max-clients = 7\n", 16), 0);
    run_make(f, "install", dest, &sanflag);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    if (strcmp(text, "max-clients = 7\n") != 0) {
        free(text);
        h_fail("a second make install replaced the edited %s", p);
    }
    free(text);
    snprintf(p, sizeof(p), "%s/usr/local/lib/pkgconfig/shmbroker.pc", dest);
    text = h_read_file(p, NULL);
    assert_non_null(text);
    if (!h_contains(text, "prefix=/usr/local\n") || !h_contains(text, "libdir=/usr/local/lib\n") ||
        !h_contains(text, "includedir=/usr/local/include\n") || h_contains(text, dest) ||
        h_contains(text, "@PREFIX@") || h_contains(text, "@LIBDIR@") ||
        h_contains(text, "@INCLUDEDIR@") || h_contains(text, "@VERSION@")) {
        print_error("%s:\n%s", p, text);
        free(text);
        h_fail("the installed pkg-config file does not name /usr/local");
    }
    free(text);
    /* The files installed as they are. */
    {
        static const char *const copies[][2] = {
            {"systemd/shmbroker.sysusers", "lib/sysusers.d/shmbroker.conf"},
            {"daemon/shmbrokerd.8", "share/man/man8/shmbrokerd.8"},
            {"client/shmbrokerctl.1", "share/man/man1/shmbrokerctl.1"},
            {"client/shmbroker.h", "include/shmbroker.h"},
        };

        for (i = 0; i < sizeof(copies) / sizeof(copies[0]); i++) {
            snprintf(p, sizeof(p), "%s/%s", root, copies[i][0]);
            snprintf(q, sizeof(q), "%s/usr/local/%s", dest, copies[i][1]);
            if (!same_file(p, q))
                h_fail("%s differs from %s", q, p);
        }
    }

    run_make(f, "uninstall", dest, &sanflag);
    for (i = 0; i < sizeof(installed_files) / sizeof(installed_files[0]); i++) {
        snprintf(p, sizeof(p), "%s/usr/local/%s", dest, installed_files[i]);
        if (h_exists(p))
            h_fail("make uninstall left %s", p);
    }
    leftover_count = 0;
    nftw(dest, count_leftover, 16, FTW_PHYS);
    assert_int_equal(leftover_count, 0);
    snprintf(p, sizeof(p), "%s/etc/shmbrokerd.conf", dest);
    if (!h_exists(p))
        h_fail("make uninstall removed the operator's %s", p);
    h_pass(f);
}

/* A small program that uses the installed library: put and get one object
 * on the daemon at argv[1]. */
static const char pc_client_src[] =
    "#include <stdio.h>\n"
    "#include <string.h>\n"
    "#include <shmbroker.h>\n"
    "\n"
    "int main(int argc, char **argv)\n"
    "{\n"
    "    const void *p;\n"
    "    size_t n;\n"
    "    shmb_t *c = shmb_new();\n"
    "\n"
    "    if (argc != 3 || c == NULL || shmb_connect(c, argv[1], \"pc-client\") != 0) {\n"
    "        fprintf(stderr, \"connect: %s\\n\", c ? shmb_errmsg(c) : \"no handle\");\n"
    "        return 1;\n"
    "    }\n"
    "    if (shmb_put(c, argv[2], \"installed\", 9, 0) != 0 ||\n"
    "        shmb_get(c, argv[2], &p, &n) != 0 || n != 9 || memcmp(p, \"installed\", 9) != 0) {\n"
    "        fprintf(stderr, \"put/get: %s\\n\", shmb_errmsg(c));\n"
    "        return 1;\n"
    "    }\n"
    "    shmb_release(c, argv[2]);\n"
    "    shmb_close(c);\n"
    "    printf(\"round trip ok\\n\");\n"
    "    return 0;\n"
    "}\n";

/* Split pkg-config's output on blanks into argv (pointers into text). */
static void split_words(char *text, const char **argv, int *n, int max)
{
    char *save = NULL, *w;

    for (w = strtok_r(text, " \t\n", &save); w != NULL && *n < max - 1;
         w = strtok_r(NULL, " \t\n", &save))
        argv[(*n)++] = w;
    argv[*n] = NULL;
}

/* Build pc_client_src with `cc client.c $(pkg-config [--static] --cflags
 * --libs shmbroker)` against the DESTDIR tree into out; when static, the
 * library itself is taken as libshmbroker.a. */
static void build_pc_client(struct h_fix *f, const char *pkgconfig, const char *cc,
                            const char *const *env, const char *sanflag, bool is_static,
                            const char *src, const char *out)
{
    const char *argv[64];
    struct h_run r;
    int n = 0, i;

    run_env(f,
            is_static ? (const char *const[]){pkgconfig, "--static", "--cflags", "--libs",
                                              "shmbroker", NULL}
                      : (const char *const[]){pkgconfig, "--cflags", "--libs", "shmbroker",
                                              NULL},
            env, H_RUN_TIMEOUT_MS, &r);
    if (r.status != 0) {
        h_run_dump("pkg-config", &r);
        h_fail("pkg-config does not know the installed shmbroker.pc");
    }
    argv[n++] = cc;
    argv[n++] = "-std=c11";
    argv[n++] = "-Wall";
    argv[n++] = "-Wextra";
    argv[n++] = "-Werror";
    if (sanflag != NULL)
        argv[n++] = sanflag;
    argv[n++] = "-o";
    argv[n++] = out;
    argv[n++] = src;
    i = n;
    split_words(r.out, argv, &n, 64);
    for (; i < n; i++)
        if (is_static && strcmp(argv[i], "-lshmbroker") == 0)
            argv[i] = "-l:libshmbroker.a";
    {
        struct h_run cr;

        run_env(f, argv, env, H_RUN_TIMEOUT_MS * 3, &cr);
        if (cr.status != 0) {
            print_error("pkg-config%s said: %s", is_static ? " --static" : "", r.out);
            h_run_dump("cc", &cr);
            h_run_free(&r);
            h_run_free(&cr);
            h_fail("the client does not build with the installed pkg-config file");
        }
        h_run_free(&cr);
    }
    h_run_free(&r);
}

/* The installed pkg-config file, found through PKG_CONFIG_PATH with
 * PKG_CONFIG_SYSROOT_DIR set to the DESTDIR, compiles and links a client
 * against the shared library (which then runs with LD_LIBRARY_PATH and
 * needs libshmbroker.so.1) and, with --static, against the static one
 * (which runs without it); both put and get an object on a test daemon. */
static void test_install_pkgconfig(void **state)
{
    struct h_fix *f = *state;
    char dest[PATH_MAX], pcpath[PATH_MAX + 64], sysroot[PATH_MAX + 32], ldpath[PATH_MAX + 32];
    char pkgconfig[PATH_MAX], cc[PATH_MAX], src[PATH_MAX], dyn[PATH_MAX], sta[PATH_MAX];
    char needed[1024];
    const char *sanflag, *env[3];
    struct h_daemon *d;
    struct h_run r;
    shmb_t *lib;
    const void *p;
    size_t len;

    need_program(f, "pkg-config", pkgconfig, sizeof(pkgconfig));
    need_program(f, "cc", cc, sizeof(cc));
    h_path(f, "dest", dest, sizeof(dest));
    assert_int_equal(mkdir(dest, 0755), 0);
    run_make(f, "install", dest, &sanflag);
    snprintf(pcpath, sizeof(pcpath), "PKG_CONFIG_PATH=%s/usr/local/lib/pkgconfig", dest);
    snprintf(sysroot, sizeof(sysroot), "PKG_CONFIG_SYSROOT_DIR=%s", dest);
    env[0] = pcpath;
    env[1] = sysroot;
    env[2] = NULL;
    h_path(f, "client.c", src, sizeof(src));
    assert_int_equal(h_write_file(src, pc_client_src, strlen(pc_client_src)), 0);
    h_path(f, "client-shared", dyn, sizeof(dyn));
    h_path(f, "client-static", sta, sizeof(sta));
    build_pc_client(f, pkgconfig, cc, env, sanflag, false, src, dyn);
    build_pc_client(f, pkgconfig, cc, env, sanflag, true, src, sta);

    assert_int_equal(elf_dynamic_strings(dyn, DT_NEEDED, needed, sizeof(needed)), 0);
    assert_true(h_contains(needed, "libshmbroker.so.1 "));
    assert_int_equal(elf_dynamic_strings(sta, DT_NEEDED, needed, sizeof(needed)), 0);
    assert_false(h_contains(needed, "libshmbroker"));

    d = h_daemon_start(f, "4M", NULL);
    snprintf(ldpath, sizeof(ldpath), "LD_LIBRARY_PATH=%s/usr/local/lib", dest);
    run_env(f, (const char *const[]){dyn, d->socket, "shared", NULL},
            (const char *const[]){ldpath, NULL}, H_RUN_TIMEOUT_MS, &r);
    if (r.status != 0 || !h_contains(r.out, "round trip ok")) {
        h_run_dump("client linked against libshmbroker.so", &r);
        h_fail("the shared client did not put and get");
    }
    h_run_free(&r);
    run_env(f, (const char *const[]){sta, d->socket, "static", NULL},
            (const char *const[]){"LD_LIBRARY_PATH", NULL}, H_RUN_TIMEOUT_MS, &r);
    if (r.status != 0 || !h_contains(r.out, "round trip ok")) {
        h_run_dump("client linked against libshmbroker.a", &r);
        h_fail("the static client did not put and get");
    }
    h_run_free(&r);
    /* Both really talked to this daemon. */
    lib = connect_lib(d->socket);
    assert_int_equal(shmb_get(lib, "shared", &p, &len), 0);
    assert_int_equal(len, 9);
    assert_int_equal(shmb_get(lib, "static", &p, &len), 0);
    assert_memory_equal(p, "installed", 9);
    shmb_close(lib);
    h_pass(f);
}

/* ---- units ------------------------------------------------------------------ */

/* src with every "@SBINDIR@/shmbrokerd" made bin and "@SYSCONFDIR@" /etc,
 * written to f's file name; fails when src names the daemon nowhere. */
static void write_unit(struct h_fix *f, const char *src, const char *bin, const char *name,
                       char *out_path, size_t out_len)
{
    static const char *const from[] = {"@SBINDIR@/shmbrokerd", "@SYSCONFDIR@"};
    size_t len, cap, i, at, k, n = 0;
    char *text = h_read_file(src, &len), *out;

    assert_non_null(text);
    cap = len * 2 + strlen(bin) * 8 + 1;
    out = malloc(cap);
    assert_non_null(out);
    for (at = 0, k = 0; at < len;) {
        for (i = 0; i < 2; i++)
            if (strncmp(text + at, from[i], strlen(from[i])) == 0)
                break;
        if (i < 2) {
            const char *to = i == 0 ? bin : "/etc";

            assert_true(k + strlen(to) < cap);
            memcpy(out + k, to, strlen(to));
            k += strlen(to);
            at += strlen(from[i]);
            n += i == 0;
        } else {
            assert_true(k + 1 < cap);
            out[k++] = text[at++];
        }
    }
    out[k] = '\0';
    free(text);
    if (n == 0 || has_placeholder(out)) {
        free(out);
        h_fail("%s: no @SBINDIR@/shmbrokerd, or a placeholder make install does not fill",
               src);
    }
    h_path(f, name, out_path, out_len);
    assert_int_equal(h_write_file(out_path, out, k), 0);
    free(out);
}

/* systemd-analyze verify --man=no accepts the service and the socket (with
 * @SBINDIR@ set to the built daemon's directory, so that their Exec lines
 * are executable): exit 0 and nothing on standard error. */
static void test_units_verify(void **state)
{
    struct h_fix *f = *state;
    char analyze[PATH_MAX], root[PATH_MAX], src[PATH_MAX * 2], service[PATH_MAX];
    char socket_unit[PATH_MAX], bin[PATH_MAX];
    const char *env[] = {"SYSTEMD_LOG_COLOR=0", NULL};
    struct h_run r;

    need_systemd_tool("systemd-analyze", analyze, sizeof(analyze));
    repo_root(root, sizeof(root));
    if (realpath(h_daemon_bin(), bin) == NULL)
        h_fail("%s: %s", h_daemon_bin(), strerror(errno));
    snprintf(src, sizeof(src), "%s/systemd/shmbrokerd.service.in", root);
    write_unit(f, src, bin, "shmbrokerd.service", service, sizeof(service));
    snprintf(src, sizeof(src), "%s/systemd/shmbrokerd.socket.in", root);
    write_unit(f, src, bin, "shmbrokerd.socket", socket_unit, sizeof(socket_unit));

    run_env(f, (const char *const[]){analyze, "verify", "--man=no", service, socket_unit, NULL},
            env, H_RUN_TIMEOUT_MS * 3, &r);
    if (r.status != 0 || r.err_len != 0) {
        h_run_dump("systemd-analyze verify", &r);
        h_fail("systemd-analyze verify found problems in the units");
    }
    h_run_free(&r);
    h_pass(f);
}

/* ---- --config and SIGHUP ------------------------------------------------------ */

/* Connect, say hello and return the daemon's stats (the caller owns them);
 * c stays open. */
static json_t *hello_stats(struct h_conn *c, const struct h_daemon *d)
{
    json_decref(h_open_hello(c, d));
    return h_call(c, "{\"op\":\"stats\"}");
}

/* The next connection to d is refused with EDQUOT naming max-clients (n). */
static void expect_max_clients(const struct h_daemon *d, unsigned n)
{
    char want[64];
    struct h_conn c;
    json_t *reply;

    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_recv_json(&c);
    snprintf(want, sizeof(want), "max-clients (%u) reached", n);
    h_assert_error(reply, "EDQUOT", want);
    json_decref(reply);
    h_conn_close(&c);
}

/* --config FILE: "name = value" lines with comments, blank lines and blanks
 * around '=' set the segment size (8 MiB here, no --size given) and the
 * client limit (3); a flag on the command line overrides the file (--size
 * 4M wins). */
static void test_config_file(void **state)
{
    static const char conf[] = "# shmbrokerd settings for the test\n"
                               "size = 8M\n"
                               "\n"
                               "   # an indented comment\n"
                               "max-clients=3\n"
                               "\t\n"
                               "log-level =   info  \n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "8M"), *e = h_daemon_new(f, "4M");
    char path[PATH_MAX];
    struct h_conn c[3];
    json_t *st;
    int i;

    h_path(f, "shmbrokerd.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, conf, strlen(conf)), 0);
    daemon_spawn_env(d, (const char *const[]){"--config", path, NULL}, NULL, -1);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd --config %s did not start", path);
    }
    st = hello_stats(&c[0], d);
    assert_int_equal(h_int(st, "size"), 8 << 20);
    json_decref(st);
    for (i = 1; i < 3; i++)
        json_decref(h_open_hello(&c[i], d));
    expect_max_clients(d, 3);
    for (i = 0; i < 3; i++)
        h_conn_close(&c[i]);

    daemon_spawn_env(e, (const char *const[]){"--config", path, "--size", "4M", NULL}, NULL,
                     -1);
    if (h_daemon_wait_ready(e, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(e);
        h_fail("shmbrokerd --config %s --size 4M did not start", path);
    }
    st = hello_stats(&c[0], e);
    assert_int_equal(h_int(st, "size"), 4 << 20);
    json_decref(st);
    h_conn_close(&c[0]);
    h_pass(f);
}

/* A --config line that names no option fails with "FILE:LINE: unknown
 * setting" and exit 2, as does a line without '='; nothing is created. */
static void test_config_errors(void **state)
{
    static const char unknown[] = "size = 4M\n\n# fine so far\nbogus-setting = 1\n";
    static const char no_eq[] = "size 4M\n";
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char path[PATH_MAX], want[PATH_MAX + 64], seg[PATH_MAX * 2];
    const char *argv[16];
    struct h_run r;

    h_path(f, "bad.conf", path, sizeof(path));
    assert_int_equal(h_write_file(path, unknown, strlen(unknown)), 0);
    daemon_argv(d, (const char *const[]){"--config", path, NULL}, argv, 16);
    assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
    snprintf(want, sizeof(want), "%s:4: unknown setting 'bogus-setting'", path);
    if (r.status != 2 || !h_contains(r.err, want)) {
        h_run_dump("unknown setting", &r);
        h_fail("expected exit 2 and \"%s\"", want);
    }
    h_run_free(&r);

    assert_int_equal(h_write_file(path, no_eq, strlen(no_eq)), 0);
    assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
    snprintf(want, sizeof(want), "%s:1: expected 'name = value'", path);
    if (r.status != 2 || !h_contains(r.err, want)) {
        h_run_dump("line without '='", &r);
        h_fail("expected exit 2 and \"%s\"", want);
    }
    h_run_free(&r);
    assert_false(h_exists(d->socket));
    h_segment_path(d, seg, sizeof(seg));
    assert_false(h_exists(seg));
    h_pass(f);
}

/* Connect and say hello, retrying while the daemon refuses with EDQUOT (it
 * has not yet seen a previous client leave); fails after a while. */
static void open_when_room(struct h_conn *c, const struct h_daemon *d)
{
    uint64_t deadline = h_now_ms() + H_REPLY_TIMEOUT_MS;

    for (;;) {
        json_t *reply;

        assert_int_equal(h_conn_open(c, d->socket), 0);
        /* A refused client may find the connection closed before its hello
         * goes out; the refusal is still there to read. */
        (void)h_conn_sendline(c, "{\"op\":\"hello\",\"version\":1,\"name\":\"e2e\"}");
        reply = h_recv_json(c);
        if (json_is_true(json_object_get(reply, "ok"))) {
            json_decref(reply);
            return;
        }
        h_assert_error(reply, "EDQUOT", "max-clients");
        json_decref(reply);
        h_conn_close(c);
        if (h_now_ms() >= deadline)
            h_fail("no room for a client within %d ms", H_REPLY_TIMEOUT_MS);
        h_sleep_ms(10);
    }
}

/* Write the config file of the SIGHUP test. */
static void write_conf(const char *path, const char *size, const char *level,
                       unsigned max_clients)
{
    char text[256];

    snprintf(text, sizeof(text), "size = %s\nlog-level = %s\nmax-clients = %u\n", size, level,
             max_clients);
    assert_int_equal(h_write_file(path, text, strlen(text)), 0);
}

/* SIGHUP re-reads --config: a new log level (debug lines start) and client
 * limit (a second simultaneous client is refused with EDQUOT) take effect
 * and the log says so; --log-file is reopened (after a rename the old name
 * gets a new file); a new size is refused as not reloadable and the segment
 * keeps its size. */
static void test_sighup_reload(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "4M");
    char conf[PATH_MAX], old[PATH_MAX + 8], *text;
    struct h_conn a;
    json_t *st;

    h_path(f, "reload.conf", conf, sizeof(conf));
    snprintf(old, sizeof(old), "%s.old", d->log);
    write_conf(conf, "4M", "info", 8);
    daemon_spawn_env(d, (const char *const[]){"--config", conf, "--log-file", d->log, NULL},
                     NULL, -1);
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd --config %s did not start", conf);
    }
    st = hello_stats(&a, d);
    assert_int_equal(h_int(st, "size"), 4 << 20);
    json_decref(st);
    wait_file(d->log, "client pid", H_REPLY_TIMEOUT_MS);
    assert_false(log_has(d, "] debug: "));

    write_conf(conf, "4M", "debug", 1);
    assert_int_equal(rename(d->log, old), 0);
    kill(d->pid, SIGHUP);
    wait_file(d->log, "SIGHUP: settings reloaded", H_REPLY_TIMEOUT_MS);
    assert_true(log_has(d, "log level debug, max-clients 1"));
    assert_false(log_has(d, "not reloadable"));
    text = h_read_file(old, NULL);
    assert_false(h_contains(text, "settings reloaded"));
    free(text);

    /* a is the one client max-clients 1 allows. */
    expect_max_clients(d, 1);
    wait_file(d->log, "max-clients (1) reached", H_REPLY_TIMEOUT_MS);
    /* Once a has gone there is room for one again, and its acceptance is
     * logged at debug level. */
    h_conn_close(&a);
    open_when_room(&a, d);
    wait_file(d->log, "] debug: accepted client", H_REPLY_TIMEOUT_MS);

    write_conf(conf, "8M", "debug", 1);
    kill(d->pid, SIGHUP);
    wait_file(d->log, "are not reloadable", H_REPLY_TIMEOUT_MS);
    assert_true(log_has(d, "--size"));
    st = h_call(&a, "{\"op\":\"stats\"}");
    h_assert_ok(st);
    assert_int_equal(h_int(st, "size"), 4 << 20);
    json_decref(st);
    h_conn_close(&a);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    h_pass(f);
}

/* ---- shmbrokerctl status for machines --------------------------------------- */

/* A metric name or label-free sample as Prometheus's text format allows. */
static bool metric_name_ok(const char *s, size_t len)
{
    size_t i;

    if (len == 0)
        return false;
    for (i = 0; i < len; i++) {
        char ch = s[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
              ch == ':' || (i > 0 && ch >= '0' && ch <= '9')))
            return false;
    }
    return true;
}

/* What the exposition says about one metric. */
struct metric {
    char name[128];
    char type[16];
    bool help;
    bool sampled;
    double value;
    char pool[64]; /* its pool="..." label, "" without */
    bool labelled;
};

/* Parse Prometheus text exposition (as shmbrokerctl prints it for a daemon
 * of one pool): "# HELP name text", "# TYPE name type" before each family's
 * single sample "name value" or "name{pool=\"NAME\"} value"; fails the test
 * at the first bad line. Returns the number of metrics in m. */
static int parse_exposition(const char *text, struct metric *m, int max)
{
    char line[512];
    int n = 0, lineno = 0;

    if (text[0] == '\0' || text[strlen(text) - 1] != '\n')
        h_fail("the exposition does not end with a newline");
    while (*text != '\0') {
        const char *nl = strchr(text, '\n');
        char *sp, *end, *label = NULL;
        int i;

        snprintf(line, sizeof(line), "%.*s", (int)(nl - text), text);
        text = nl + 1;
        lineno++;
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            bool help = line[2] == 'H';

            sp = strchr(line + 7, ' ');
            if (sp == NULL || !metric_name_ok(line + 7, (size_t)(sp - line - 7)) ||
                sp[1] == '\0')
                h_fail("line %d is not a valid # HELP/# TYPE line: %s", lineno, line);
            *sp = '\0';
            for (i = 0; i < n && strcmp(m[i].name, line + 7) != 0; i++)
                ;
            if (i == n) {
                assert_true(n < max);
                assert_true(strlen(line + 7) < sizeof(m[n].name));
                memset(&m[n], 0, sizeof(m[n]));
                memcpy(m[n].name, line + 7, strlen(line + 7) + 1);
                n++;
            }
            if (m[i].sampled || (help && m[i].help) || (!help && m[i].type[0] != '\0'))
                h_fail("line %d: %s repeated or after the sample of %s", lineno,
                       help ? "# HELP" : "# TYPE", m[i].name);
            if (help) {
                m[i].help = true;
            } else {
                if (strcmp(sp + 1, "gauge") != 0 && strcmp(sp + 1, "counter") != 0 &&
                    strcmp(sp + 1, "untyped") != 0)
                    h_fail("line %d: unknown type %s", lineno, sp + 1);
                snprintf(m[i].type, sizeof(m[i].type), "%s", sp + 1);
            }
            continue;
        }
        if (line[0] == '#' || line[0] == '\0')
            h_fail("line %d is neither a sample nor # HELP/# TYPE: '%s'", lineno, line);
        sp = strchr(line, ' ');
        if (sp == NULL)
            h_fail("line %d is not a valid sample: %s", lineno, line);
        *sp = '\0';
        label = strchr(line, '{');
        /* shmbroker_info's labels are its versions, read by
         * tests/python/test_prometheus.py with Prometheus's own parser. */
        if (label != NULL && strncmp(line, "shmbroker_info{", 15) == 0) {
            *label = '\0';
            label = NULL;
        }
        if (label != NULL) {
            char *close = strstr(label, "\"}");

            if (strncmp(label, "{pool=\"", 7) != 0 || close == NULL || close[2] != '\0' ||
                memchr(label + 7, '"', (size_t)(close - label - 7)) != NULL)
                h_fail("line %d: labels other than one pool=\"NAME\": %s", lineno, line);
            *label = '\0';
            *close = '\0';
        }
        if (!metric_name_ok(line, strlen(line)))
            h_fail("line %d is not a valid sample: %s", lineno, line);
        for (i = 0; i < n && strcmp(m[i].name, line) != 0; i++)
            ;
        if (i == n || m[i].type[0] == '\0' || !m[i].help || m[i].sampled)
            h_fail("line %d: sample %s without its # HELP and # TYPE, or twice", lineno, line);
        errno = 0;
        m[i].value = strtod(sp + 1, &end);
        if (errno != 0 || end == sp + 1 || *end != '\0')
            h_fail("line %d: %s has no number: %s", lineno, line, sp + 1);
        m[i].sampled = true;
        m[i].labelled = label != NULL;
        snprintf(m[i].pool, sizeof(m[i].pool), "%s", label != NULL ? label + 7 : "");
    }
    return n;
}

/* The metric named name, sampled, or fail. */
static const struct metric *metric_find(const struct metric *m, int n, const char *name)
{
    int i;

    for (i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0 && m[i].sampled)
            return &m[i];
    h_fail("no sample of %s", name);
}

/* The value of the metric named name, or fail. */
static long long metric_value(const struct metric *m, int n, const char *name)
{
    return (long long)metric_find(m, n, name)->value;
}

/* The metric named name carries pool="pool" (pool NULL: no label). */
static void expect_pool_label(const struct metric *m, int n, const char *name,
                              const char *pool)
{
    const struct metric *x = metric_find(m, n, name);

    if (x->labelled != (pool != NULL) || (pool != NULL && strcmp(x->pool, pool) != 0))
        h_fail("%s: label pool=\"%s\"%s, expected %s%s%s", name, x->pool,
               x->labelled ? "" : " (none)", pool != NULL ? "pool=\"" : "no label",
               pool != NULL ? pool : "", pool != NULL ? "\"" : "");
}

/* status --prometheus prints valid text exposition: # HELP and # TYPE
 * before each sample, shmbroker_used_bytes and shmbroker_objects equal to
 * the daemon's stats, and every counter (TYPE counter) named *_total and
 * vice versa, with the right counts. The pool's figures carry pool="NAME"
 * (the one pool of a daemon without --pool is named after --name), the
 * daemon's own none. */
static void test_status_prometheus(void **state)
{
    static const char big[3000];
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *lib = connect_lib(d->socket);
    struct metric m[64];
    shmb_stats_t st;
    struct h_run r;
    const void *p;
    size_t len;
    int n, i, counters = 0;

    assert_int_equal(shmb_put(lib, "a", big, sizeof(big), 0), 0);
    assert_int_equal(shmb_put(lib, "b", "b", 1, 0), 0);
    assert_int_equal(shmb_get(lib, "a", &p, &len), 0);
    assert_int_equal(shmb_release(lib, "a"), 0);
    assert_int_equal(shmb_stats(lib, &st), 0);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--prometheus", NULL), 0);
    if (r.status != 0 || r.err_len != 0) {
        h_run_dump("status --prometheus", &r);
        h_fail("status --prometheus failed");
    }
    n = parse_exposition(r.out, m, 64);
    assert_int_equal(metric_value(m, n, "shmbroker_used_bytes"), (long long)st.used);
    assert_true(st.used >= sizeof(big));
    assert_int_equal(metric_value(m, n, "shmbroker_objects"), 2);
    assert_int_equal(metric_value(m, n, "shmbroker_segment_bytes"), 4 << 20);
    assert_int_equal(metric_value(m, n, "shmbroker_commits_total"), 2);
    assert_int_equal(metric_value(m, n, "shmbroker_gets_total"), 1);
    expect_pool_label(m, n, "shmbroker_used_bytes", d->name);
    expect_pool_label(m, n, "shmbroker_commits_total", d->name);
    expect_pool_label(m, n, "shmbroker_pool_clients", d->name);
    expect_pool_label(m, n, "shmbroker_clients", NULL);
    expect_pool_label(m, n, "shmbroker_uptime_seconds", NULL);
    expect_pool_label(m, n, "shmbroker_noreply_errors_total", NULL);
    for (i = 0; i < n; i++) {
        size_t l = strlen(m[i].name);
        bool total = l > 6 && strcmp(m[i].name + l - 6, "_total") == 0;

        assert_true(m[i].sampled);
        assert_true(strncmp(m[i].name, "shmbroker_", 10) == 0);
        if (total != (strcmp(m[i].type, "counter") == 0))
            h_fail("%s has # TYPE %s: counters, and only they, end in _total", m[i].name,
                   m[i].type);
        counters += total;
    }
    assert_true(counters >= 5);
    h_run_free(&r);
    shmb_close(lib);
    h_pass(f);
}

/* status --watch 1 prints the status view every second: run for about 1.5 s
 * into a file it has printed the view (header, figures) at least twice, with
 * no screen clears (those are for a terminal only); --watch 0 is a usage
 * error. */
static void test_status_watch(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    char out[PATH_MAX], header[64], *text;
    struct h_run r;
    int views, clears, status = 0;
    pid_t pid;

    h_path(f, "watch.out", out, sizeof(out));
    pid = spawn((const char *const[]){h_ctl_bin(), "--socket", d->socket, "status", "--watch",
                                      "1", NULL},
                NULL, out, out, -1);
    h_sleep_ms(1500);
    kill(pid, SIGINT);
    if (h_wait_pid(pid, H_STOP_TIMEOUT_MS, &status) < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        h_fail("shmbrokerctl status --watch did not stop on SIGINT");
    }
    text = h_read_file(out, NULL);
    assert_non_null(text);
    snprintf(header, sizeof(header), "shmbrokerd %s, pid %d, up ", SHMB_VERSION, (int)d->pid);
    views = count_of(text, header);
    clears = count_of(text, "\033[2J");
    if (views < 2 || clears != 0 || count_of(text, "\033[") != 0 ||
        count_of(text, "objects   0 committed") < 2) {
        print_error("---- output of status --watch 1:\n%s---- end\n", text);
        free(text);
        h_fail("status --watch 1 showed %d views (%d screen clears) in 1.5 s; expected 2",
               views, clears);
    }
    free(text);

    assert_int_equal(h_ctl(f, d, NULL, 0, &r, "status", "--watch", "0", NULL), 0);
    if (r.status != 2 || !h_contains(r.err, "--watch")) {
        h_run_dump("status --watch 0", &r);
        h_fail("status --watch 0 is not a usage error");
    }
    h_run_free(&r);
    h_pass(f);
}


/* The next datagram that says want, and the descriptor it carries: -1 when
 * none comes within timeout_ms (or it carries none). */
static int notify_recv_fd(struct notify_rx *rx, const char *want, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } control;
        char msg[1024];
        struct iovec iov = {msg, sizeof(msg) - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        struct pollfd pfd = {rx->fd, POLLIN, 0};
        int64_t left = (int64_t)deadline - (int64_t)h_now_ms();
        struct cmsghdr *cm;
        int fd = -1;
        ssize_t n;

        mh.msg_control = control.buf;
        mh.msg_controllen = sizeof(control.buf);
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return -1;
        if ((n = recvmsg(rx->fd, &mh, MSG_CMSG_CLOEXEC)) < 0)
            return -1;
        msg[n] = '\0';
        if (strlen(rx->seen) + (size_t)n + 2 < sizeof(rx->seen)) {
            strcat(rx->seen, msg);
            strcat(rx->seen, "|");
        }
        for (cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                memcpy(&fd, CMSG_DATA(cm), sizeof(int));
        if (h_contains(msg, want))
            return fd;
        if (fd >= 0)
            close(fd);
    }
}

/* A memfd pool under systemd is kept across a restart by the
 * file-descriptor store: the daemon hands its memfd over (FDSTORE=1,
 * FDNAME=pool-NAME), the next daemon started with it in $LISTEN_FDS (named
 * in $LISTEN_FDNAMES) adopts it with its objects; a stop without
 * --keep-segment takes it back (FDSTOREREMOVE=1), and a kept memfd of
 * another size is dropped, the pool starting empty. */
static void test_memfd_fd_store(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_new(f, "2M"), *d2, *d3;
    const char *keep[] = {"--pool", "meta:2M,backing=memfd", "--keep-segment", NULL};
    const char *nokeep[] = {"--pool", "meta:2M,backing=memfd", NULL};
    const char *bigger[] = {"--pool", "meta:4M,backing=memfd", NULL};
    char line[512], want[256], buf[32];
    struct notify_rx rx;
    struct h_conn c;
    json_t *reply;
    long long off;
    int fd, fd2;

    notify_open(f, &rx, "notify-fdstore", false);
    {
        const char *env[] = {rx.env, NULL};

        daemon_spawn_env(d, keep, env, -1);
    }
    fd = notify_recv_fd(&rx, "FDSTORE=1\nFDNAME=pool-meta", 10000);
    if (fd < 0) {
        h_daemon_print_log(d);
        h_fail("no FDSTORE=1 with a descriptor for pool-meta; got: %s", rx.seen);
    }
    notify_expect(&rx, "READY=1", NULL, line, 10000);
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    reply = h_call(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"meta\"}");
    h_assert_ok(reply);
    json_decref(reply);
    reply = h_call(&c, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":11}");
    off = h_int(reply, "offset");
    json_decref(reply);
    /* The descriptor systemd got is the pool's memfd: write through it. */
    assert_int_equal(pwrite(fd, "kept bytes", 11, off), 11);
    json_decref(h_call(&c, "{\"op\":\"commit\",\"key\":\"k\"}"));
    h_conn_close(&c);
    assert_int_equal(h_daemon_signal(d, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    assert_true(log_has(d, "memfd pools kept by systemd's descriptor store"));

    /* Restarted with the kept descriptor: the object is there. */
    d2 = h_daemon_again(f, d);
    {
        const char *env[] = {rx.env, "LISTEN_PID=$PID", "LISTEN_FDS=1",
                             "LISTEN_FDNAMES=pool-meta", NULL};

        daemon_spawn_env(d2, nokeep, env, fd);
    }
    notify_expect(&rx, "READY=1", NULL, line, 10000);
    snprintf(want, sizeof(want), "adopted segment memfd:%s.meta that systemd kept", d->name);
    if (!log_has(d2, want) || !log_has(d2, "restored 1 object ")) {
        h_daemon_print_log(d2);
        h_fail("the kept memfd was not adopted with its object");
    }
    /* Adopted, not handed over again. */
    assert_int_equal(h_count(rx.seen, "FDSTORE=1\n"), 1);
    assert_int_equal(h_conn_open(&c, d2->socket), 0);
    json_decref(h_call(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"meta\"}"));
    reply = h_call(&c, "{\"op\":\"get\",\"key\":\"k\"}");
    h_assert_ok(reply);
    assert_int_equal(pread(fd, buf, 11, h_int(reply, "offset")), 11);
    assert_string_equal(buf, "kept bytes");
    json_decref(reply);
    h_conn_close(&c);
    /* Stopped without --keep-segment: systemd is told to let it go. */
    assert_int_equal(h_daemon_signal(d2, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    if (notify_recv_fd(&rx, "FDSTOREREMOVE=1\nFDNAME=pool-meta", 10000) != -1 ||
        !h_contains(rx.seen, "FDSTOREREMOVE=1\nFDNAME=pool-meta"))
        h_fail("no FDSTOREREMOVE=1 for pool-meta at a stop without --keep-segment; got: %s",
               rx.seen);

    /* A kept memfd of another size: dropped, the pool starts empty. */
    d3 = h_daemon_again(f, d);
    {
        const char *env[] = {rx.env, "LISTEN_PID=$PID", "LISTEN_FDS=1",
                             "LISTEN_FDNAMES=pool-meta", NULL};

        daemon_spawn_env(d3, bigger, env, fd);
    }
    fd2 = notify_recv_fd(&rx, "FDSTORE=1\nFDNAME=pool-meta", 10000);
    if (fd2 < 0 || !h_contains(rx.seen, "FDSTOREREMOVE=1\nFDNAME=pool-meta|FDSTORE=1")) {
        h_daemon_print_log(d3);
        h_fail("the 2 MiB memfd kept for a 4 MiB pool was not replaced; got: %s", rx.seen);
    }
    notify_expect(&rx, "READY=1", NULL, line, 10000);
    assert_true(log_has(d3, "kept across the restart has 2097152 bytes, not the pool's "
                            "4194304. It is dropped: the pool starts empty."));
    assert_int_equal(h_daemon_signal(d3, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    {
        struct stat st;

        assert_int_equal(fstat(fd2, &st), 0);
        assert_int_equal(st.st_size, 4 << 20);
    }
    close(fd2);
    close(fd);
    notify_close(&rx);
    h_pass(f);
}

/* Review: what systemd passes under a pool's name and cannot be adopted (a
 * regular file; or, with --fresh, even a good memfd) is dropped: the store
 * entry is made anew (FDSTOREREMOVE=1, then FDSTORE=1 with the new memfd),
 * the pool starts empty and the daemon serves, rather than failing every
 * start. */
static void test_memfd_fd_store_dropped(void **state)
{
    struct h_fix *f = *state;
    const char *pool[] = {"--pool", "meta:2M,backing=memfd", NULL};
    const char *fresh[] = {"--pool", "meta:2M,backing=memfd", "--fresh", NULL};
    const char *env_t[] = {NULL, "LISTEN_PID=$PID", "LISTEN_FDS=1", "LISTEN_FDNAMES=pool-meta",
                           NULL};
    char path[PATH_MAX], line[512];
    struct notify_rx rx;
    int round;

    notify_open(f, &rx, "notify-dropped", false);
    env_t[0] = rx.env;
    for (round = 0; round < 2; round++) {
        struct h_daemon *d = h_daemon_new(f, "2M");
        int fd, got;

        if (round == 0) {
            h_path(f, "not-a-memfd", path, sizeof(path));
            fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            assert_true(fd >= 0 && ftruncate(fd, 2 << 20) == 0);
        } else {
            fd = (int)syscall(SYS_memfd_create, "good", 3 /* CLOEXEC|ALLOW_SEALING */);
            assert_true(fd >= 0 && ftruncate(fd, 2 << 20) == 0);
            assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        }
        rx.seen[0] = '\0';
        daemon_spawn_env(d, round == 0 ? pool : fresh, env_t, fd);
        close(fd);
        got = notify_recv_fd(&rx, "FDSTORE=1\nFDNAME=pool-meta", 10000);
        notify_expect(&rx, "READY=1", NULL, line, 10000);
        if (got < 0 || !h_contains(rx.seen, "FDSTOREREMOVE=1\nFDNAME=pool-meta|FDSTORE=1")) {
            h_daemon_print_log(d);
            h_fail("round %d: the kept descriptor was not replaced; got: %s", round, rx.seen);
        }
        close(got);
        assert_true(log_has(d, round == 0 ? "is not a memfd sealed against resizing. It is "
                                            "dropped: the pool starts empty."
                                          : "the memfd systemd kept is dropped (--fresh)"));
        assert_int_equal(h_daemon_signal(d, SIGTERM, H_RUN_TIMEOUT_MS), 0);
    }
    notify_close(&rx);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_notify_ready_status_stopping),
        TEST(test_notify_progress),
        TEST(test_activation_starting),
        TEST(test_notify_abstract),
        TEST(test_notify_watchdog),
        TEST(test_socket_activation),
        TEST(test_activation_bad_fd),
        TEST(test_activation_not_ours),
        TEST(test_keep_segment),
        TEST(test_remove_segment),
        TEST(test_check_config),
        TEST(test_reload_pid),
        TEST(test_reload_activated_memfd),
        TEST(test_reload_forged_listener),
        TEST(test_activation_refused_start),
        TEST(test_memfd_fd_store),
        TEST(test_memfd_fd_store_dropped),
        TEST(test_journal_stream),
        TEST(test_install_tree),
        TEST(test_install_prefix),
        TEST(test_install_pkgconfig),
        TEST(test_units_verify),
        TEST(test_config_file),
        TEST(test_config_errors),
        TEST(test_sighup_reload),
        TEST(test_status_prometheus),
        TEST(test_status_watch),
    };

    return cmocka_run_group_tests_name("test_systemd", tests, NULL, NULL);
}
