// SPDX-License-Identifier: Apache-2.0
/*
 * The end-to-end harness: start and stop the real shmbrokerd on a temporary
 * socket, talk to it over raw sockets, run shmbrokerctl, fork helper
 * processes and mount a small tmpfs, and clean all of it up even when a test
 * fails. Knows nothing about what the tests check; it never touches
 * /run/shmbroker or a segment named "shmbroker".
 */
#ifndef SHMB_TESTS_E2E_HARNESS_H
#define SHMB_TESTS_E2E_HARNESS_H

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cmocka.h>
#include <jansson.h>

/* A daemon that does not listen within this long is hung or broken. */
#define H_READY_TIMEOUT_MS 5000
/* SIGTERM to exit: closing connections and unlinking two files is quick. */
#define H_STOP_TIMEOUT_MS 5000
/* One reply from the daemon or one helper process. */
#define H_REPLY_TIMEOUT_MS 5000
/* A run of shmbrokerctl or shmbrokerd that should exit by itself. */
#define H_RUN_TIMEOUT_MS 10000

#define H_MAX_DAEMONS 4
#define H_MAX_CHILDREN 16
#define H_MAX_MOUNTS 2
#define H_MAX_FDS 8

/* One shmbrokerd the harness started (or will start). */
struct h_daemon {
    char socket[108]; /* sun_path */
    char name[64];    /* segment name, "shmbt-<pid>-<n>" */
    char shm_dir[PATH_MAX];
    char size[32];    /* --size as given */
    char log[PATH_MAX];
    pid_t pid;        /* 0 when not running (or reaped) */
    int status;       /* wait status once reaped, -1 before */
};

/* Everything one test owns; h_teardown releases it whatever happened. */
struct h_fix {
    char dir[64];       /* mkdtemp directory: short, sockets live in it */
    struct h_daemon daemons[H_MAX_DAEMONS];
    int ndaemons;
    pid_t children[H_MAX_CHILDREN];
    int nchildren;
    char mounts[H_MAX_MOUNTS][PATH_MAX];
    int nmounts;
    int nruns;          /* numbers the files of h_run */
    bool passed;        /* set by h_pass; logs are printed when false */
    void *arg;          /* the test's initial state (cmocka prestate) */
};

/* A raw protocol connection: line framing and SCM_RIGHTS capture. */
struct h_conn {
    int fd;
    char *buf;  /* bytes received, not yet returned as lines */
    size_t len, cap;
    int fds[H_MAX_FDS]; /* descriptors received, in order */
    int nfds;
};

/* What a finished process printed and how it ended. */
struct h_run {
    int status;   /* exit status, 128 + signal, or -1 on timeout */
    char *out;    /* standard output, NUL-terminated; the caller frees */
    size_t out_len;
    char *err;    /* standard error, NUL-terminated; the caller frees */
    size_t err_len;
};

/* ---- fixtures ----------------------------------------------------------- */

/* cmocka setup: a fresh fixture with its own temporary directory. The test's
 * initial state (if any) is kept in arg. */
int h_setup(void **state);

/* cmocka teardown: kill helpers and daemons, remove their segments, print the
 * daemon logs when the test did not reach h_pass, unmount, remove the dir. */
int h_teardown(void **state);

/* The last line of every test: it got to the end. */
void h_pass(struct h_fix *f);

/* Skip the test with a printed reason (never counted as a pass). */
void h_skip(struct h_fix *f, const char *why);

/* ---- paths and files ---------------------------------------------------- */

/* $SHMBROKERD / $SHMBROKERCTL, else $SHMB_BUILD_DIR/..., else build/.... The
 * strings are static or from the environment. */
const char *h_daemon_bin(void);
const char *h_ctl_bin(void);

/* f->dir/name into out. */
void h_path(const struct h_fix *f, const char *name, char *out, size_t len);

/* The segment file of d. */
void h_segment_path(const struct h_daemon *d, char *out, size_t len);

bool h_exists(const char *path);

/* The whole file, NUL-terminated; the caller frees. NULL when unreadable. */
char *h_read_file(const char *path, size_t *len);
int h_write_file(const char *path, const void *data, size_t len);

/* The pattern byte i of an object seeded with seed: not periodic in 256, so a
 * wrong offset shows up. */
static inline unsigned char h_pattern(uint32_t seed, size_t i)
{
    uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;

    return (unsigned char)((x >> 24) ^ (uint32_t)(i >> 11) ^ seed);
}
void h_fill(void *buf, size_t len, uint32_t seed);
/* Index of the first byte that differs from the pattern, or len. */
size_t h_check(const void *buf, size_t len, uint32_t seed);

/* ---- daemons ------------------------------------------------------------ */

/* Reserve a daemon slot: unique --name, a socket and a log in f->dir,
 * --shm-dir /dev/shm, the given --size. Nothing runs yet. */
struct h_daemon *h_daemon_new(struct h_fix *f, const char *size);

/* Fork and exec $SHMBROKERD --socket --name --size --shm-dir [extra...],
 * stdout and stderr to d->log. extra is NULL-terminated (or NULL). Returns
 * the pid, or -1. */
pid_t h_daemon_spawn(struct h_fix *f, struct h_daemon *d, const char *const *extra);

/* Wait until d's socket accepts a connection: 0, or -1 when the daemon exited
 * (d->status tells how) or did not listen in time. */
int h_daemon_wait_ready(struct h_daemon *d, int timeout_ms);

/* h_daemon_new + h_daemon_spawn + h_daemon_wait_ready; fails the test (and
 * prints the log) when the daemon does not come up. */
struct h_daemon *h_daemon_start(struct h_fix *f, const char *size,
                                const char *const *extra);

/* Send sig and reap: the wait status, or -1 when it did not exit within
 * timeout_ms (it is then killed with SIGKILL and reaped). */
int h_daemon_signal(struct h_daemon *d, int sig, int timeout_ms);

/* Wait for a daemon that should exit by itself; wait status or -1. */
int h_daemon_wait_exit(struct h_daemon *d, int timeout_ms);

/* Print d's log (for failures). */
void h_daemon_print_log(const struct h_daemon *d);

/* The daemon's log so far; the caller frees. Never NULL. */
char *h_log_text(const struct h_daemon *d);

/* Whether the daemon's log so far contains needle. */
bool h_log_contains(const struct h_daemon *d, const char *needle);

/* Wait until the daemon's log contains needle, or print the log and fail
 * the test. */
void h_wait_log_at(const struct h_daemon *d, const char *needle, const char *file, int line);
#define h_wait_log(d, needle) h_wait_log_at((d), (needle), __FILE__, __LINE__)

/* Send d SIGHUP and wait (5 s) for its outcome in the log, applied or
 * refused ("SIGHUP: settings ..."); fail the test when none comes. */
void h_reload_at(const struct h_daemon *d, const char *file, int line);
#define h_reload(d) h_reload_at((d), __FILE__, __LINE__)

/* ---- processes ---------------------------------------------------------- */

/* Reap pid within timeout_ms: 0 and *status, or -ETIMEDOUT. */
int h_wait_pid(pid_t pid, int timeout_ms, int *status);

/* Exit status, or 128 + signal, of a wait status. */
int h_exit_code(int status);

/* Fork a helper that runs fn(arg) and _exits with its result (no cmocka
 * asserts in there: report on stderr and return non-zero). -1 on failure. */
pid_t h_fork(struct h_fix *f, int (*fn)(void *), void *arg);

/* Reap a helper: its exit code (or 128 + signal), or -1 when it did not exit
 * in time (then it is killed). */
int h_child_wait(struct h_fix *f, pid_t pid, int timeout_ms);

/* Kill a helper with sig and reap it; its exit code or -1. */
int h_child_kill(struct h_fix *f, pid_t pid, int sig);

/* Run argv (argv[0] is the program) with stdin from in (NULL: /dev/null);
 * fills r. 0, or -1 when the program could not be run. */
int h_run(struct h_fix *f, const char *const *argv, const void *in, size_t in_len,
          struct h_run *r);
void h_run_free(struct h_run *r);

/* Print what a run printed (status, stdout, stderr), headed by what. */
void h_run_dump(const char *what, const struct h_run *r);

/* The run exited with status and its stdout (out) / stderr (err) contain the
 * given strings (either may be NULL); otherwise show the run and fail. */
void h_expect_run_at(const struct h_run *r, int status, const char *out, const char *err,
                     const char *file, int line);
#define h_expect_run(r, status, out, err) \
    h_expect_run_at((r), (status), (out), (err), __FILE__, __LINE__)

/* shmbrokerctl --socket d->socket ARGS... (NULL-terminated) with stdin in. */
int h_ctl(struct h_fix *f, const struct h_daemon *d, const void *in, size_t in_len,
          struct h_run *r, ...);

/* Mount a tmpfs of the given size ("8m") on a new directory in f->dir;
 * unmounted by h_teardown. 0, or -errno when mount(2) fails. */
int h_mount_tmpfs(struct h_fix *f, const char *size, char *dir, size_t len);

/* ---- raw connections ---------------------------------------------------- */

/* Connect to a Unix socket: 0 or -errno. */
int h_conn_open(struct h_conn *c, const char *socket_path);

/* Close the socket and every received descriptor. Safe to call twice. */
void h_conn_close(struct h_conn *c);

/* Send bytes (all of them): 0 or -errno. */
int h_conn_send(struct h_conn *c, const void *data, size_t len);
/* Send line and a '\n'. */
int h_conn_sendline(struct h_conn *c, const char *line);

/* The next reply line without its '\n' in *line (the caller frees):
 * 0, -ETIMEDOUT, -ECONNRESET when the daemon closed, or -errno. Descriptors
 * that arrive are appended to c->fds. */
int h_conn_recv_line(struct h_conn *c, char **line, int timeout_ms);

/* After the last reply: 0 when the daemon closes the connection within
 * timeout_ms, 1 when more bytes arrive instead, -ETIMEDOUT. */
int h_conn_wait_eof(struct h_conn *c, int timeout_ms);

/* Receive one reply and parse it; fails the test when none comes or it is
 * not a JSON object. The caller owns the result. */
#define h_recv_json(c) h_recv_json_at((c), __FILE__, __LINE__)
json_t *h_recv_json_at(struct h_conn *c, const char *file, int line);

/* Send one request line and return its parsed reply (as h_recv_json). */
#define h_call(c, line) h_call_at((c), (line), __FILE__, __LINE__)
json_t *h_call_at(struct h_conn *c, const char *request, const char *file, int line);

/* Connect and say hello; fails the test unless both work. Returns the hello
 * reply (the caller owns it). */
#define h_open_hello(c, d) h_open_hello_at((c), (d), __FILE__, __LINE__)
json_t *h_open_hello_at(struct h_conn *c, const struct h_daemon *d, const char *file,
                        int line);

/* ---- reply checks (they fail the test at the caller's line) ------------ */

/* reply is {"ok":true,...}. Takes no reference. */
#define h_assert_ok(reply) h_assert_reply_at((reply), NULL, NULL, __FILE__, __LINE__)
/* reply is {"ok":false,"error":code,"message":...} and the message contains
 * substr (when not NULL). */
#define h_assert_error(reply, code, substr) \
    h_assert_reply_at((reply), (code), (substr), __FILE__, __LINE__)
void h_assert_reply_at(const json_t *reply, const char *code, const char *substr,
                       const char *file, int line);

/* Send request, check the reply as above, free it. */
#define h_expect_ok(c, request) h_expect_at((c), (request), NULL, NULL, __FILE__, __LINE__)
#define h_expect_error(c, request, code, substr) \
    h_expect_at((c), (request), (code), (substr), __FILE__, __LINE__)
void h_expect_at(struct h_conn *c, const char *request, const char *code,
                 const char *substr, const char *file, int line);

/* An integer or string field that must be present. */
#define h_int(obj, field) h_int_at((obj), (field), __FILE__, __LINE__)
long long h_int_at(const json_t *obj, const char *field, const char *file, int line);
#define h_str(obj, field) h_str_at((obj), (field), __FILE__, __LINE__)
const char *h_str_at(const json_t *obj, const char *field, const char *file, int line);

/* Check that the daemon still serves: a new connection says hello and gets
 * stats. */
#define h_assert_alive(d) h_assert_alive_at((d), __FILE__, __LINE__)
void h_assert_alive_at(const struct h_daemon *d, const char *file, int line);

/* Fail the test with a message (printf-style) at the caller's line. */
#define h_fail(...) h_fail_at(__FILE__, __LINE__, __VA_ARGS__)
void h_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

/* Poll fn(arg) every 2 ms until it returns true or timeout_ms passes. */
bool h_eventually(bool (*fn)(void *), void *arg, int timeout_ms);

/* Sleep for ms milliseconds. */
void h_sleep_ms(int ms);

/* Monotonic milliseconds. */
uint64_t h_now_ms(void);

/* True when haystack contains needle (either may be NULL: false). */
bool h_contains(const char *haystack, const char *needle);

/* ---- one-byte signals between the test and its helper processes -------- */

/* A pipe a helper uses to say "ready" and the test uses to say "go". */
struct h_signal {
    int fds[2];
};

/* Open it before forking the helper; close both ends once it is gone. */
void h_signal_open(struct h_signal *s);
void h_signal_close(struct h_signal *s);

/* Write one byte (either side; a helper that cannot exits with 90). */
void h_signal_notify(struct h_signal *s);

/* Wait for one byte: true when it came within timeout_ms. */
bool h_signal_wait(struct h_signal *s, int timeout_ms);

/* ---- daemons with resource limits, restarts ----------------------------- */

/* As h_daemon_spawn, but the child runs with RLIMIT_NOFILE set to nofile
 * (soft and hard) before it execs, as after `ulimit -n nofile`, and with
 * only its standard descriptors open; nofile 0 leaves both as they are. */
pid_t h_daemon_spawn_nofile(struct h_fix *f, struct h_daemon *d, const char *const *extra,
                            unsigned long nofile);

/* As h_daemon_spawn_nofile, with the daemon's command line behind wrapper
 * (a NULL-terminated argv such as valgrind and its flags; NULL for none). */
pid_t h_daemon_spawn_with(struct h_fix *f, struct h_daemon *d, const char *const *extra,
                          const char *const *wrapper, unsigned long nofile);

/* A new daemon slot for a restart of old: the same --name, --socket,
 * --shm-dir and --size, its own log. Nothing runs yet (h_daemon_spawn). */
struct h_daemon *h_daemon_again(struct h_fix *f, const struct h_daemon *old);

/* CPU time (user + system) pid has used, in clock ticks; -1 when unknown. */
long long h_proc_cpu_ticks(pid_t pid);

/* Resident set size of pid in KiB (VmRSS); -1 when unknown. */
long long h_proc_rss_kib(pid_t pid);

/* How many times needle occurs in haystack (0 when either is NULL). */
int h_count(const char *haystack, const char *needle);

#endif
