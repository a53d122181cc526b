// SPDX-License-Identifier: Apache-2.0
/*
 * The end-to-end harness: real daemons on temporary sockets, raw protocol
 * connections, shmbrokerctl runs, helper processes and a tmpfs, all owned by
 * a fixture that h_teardown cleans up even after a failed assertion.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Numbers the daemons of this process, so every --name is unique. */
static unsigned h_daemon_counter;

uint64_t h_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

bool h_contains(const char *haystack, const char *needle)
{
    return haystack != NULL && needle != NULL && strstr(haystack, needle) != NULL;
}

void h_fail_at(const char *file, int line, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    print_error("%s\n", msg);
    _fail(file, line);
    abort(); /* _fail does not return while a test runs */
}

bool h_eventually(bool (*fn)(void *), void *arg, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        if (fn(arg))
            return true;
        if (h_now_ms() >= deadline)
            return false;
        h_sleep_ms(2);
    }
}

/* ---- paths and files ---------------------------------------------------- */

/* $var, else $SHMB_BUILD_DIR/file, else build/file. */
static const char *h_bin(const char *var, const char *file, char *buf, size_t len)
{
    const char *env = getenv(var), *build = getenv("SHMB_BUILD_DIR");

    if (env != NULL && env[0] != '\0')
        return env;
    snprintf(buf, len, "%s/%s", build != NULL && build[0] != '\0' ? build : "build", file);
    return buf;
}

const char *h_daemon_bin(void)
{
    static char buf[PATH_MAX];

    return h_bin("SHMBROKERD", "shmbrokerd", buf, sizeof(buf));
}

const char *h_ctl_bin(void)
{
    static char buf[PATH_MAX];

    return h_bin("SHMBROKERCTL", "shmbrokerctl", buf, sizeof(buf));
}

void h_path(const struct h_fix *f, const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", f->dir, name);
}

void h_segment_path(const struct h_daemon *d, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", d->shm_dir, d->name);
}

bool h_exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

char *h_read_file(const char *path, size_t *len)
{
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0 || buf == NULL) {
        if (fd >= 0)
            close(fd);
        free(buf);
        return NULL;
    }
    for (;;) {
        ssize_t r;

        if (n == cap) {
            char *grown = realloc(buf, cap * 2 + 1);

            if (grown == NULL) {
                free(buf);
                close(fd);
                return NULL;
            }
            buf = grown;
            cap *= 2;
        }
        r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    if (len != NULL)
        *len = n;
    return buf;
}

int h_write_file(const char *path, const void *data, size_t len)
{
    const char *p = data;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    if (fd < 0)
        return -errno;
    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int saved = errno;

            close(fd);
            return -saved;
        }
        p += n;
        len -= (size_t)n;
    }
    return close(fd) == 0 ? 0 : -errno;
}

void h_fill(void *buf, size_t len, uint32_t seed)
{
    unsigned char *p = buf;
    size_t i;

    for (i = 0; i < len; i++)
        p[i] = h_pattern(seed, i);
}

size_t h_check(const void *buf, size_t len, uint32_t seed)
{
    const unsigned char *p = buf;
    size_t i;

    for (i = 0; i < len; i++)
        if (p[i] != h_pattern(seed, i))
            return i;
    return len;
}

/* nftw callback of the recursive removal. */
static int h_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

/* ---- fixtures ----------------------------------------------------------- */

int h_setup(void **state)
{
    struct h_fix *f = calloc(1, sizeof(*f));

    if (f == NULL)
        return -1;
    f->arg = *state;
    snprintf(f->dir, sizeof(f->dir), "/tmp/shmbt-%d-XXXXXX", (int)getpid());
    if (mkdtemp(f->dir) == NULL) {
        print_error("mkdtemp %s: %s\n", f->dir, strerror(errno));
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

void h_pass(struct h_fix *f)
{
    f->passed = true;
}

void h_skip(struct h_fix *f, const char *why)
{
    print_message("skipped: %s\n", why);
    f->passed = true; /* nothing failed: no logs to show */
    skip();
}

void h_daemon_print_log(const struct h_daemon *d)
{
    char *log = h_read_file(d->log, NULL);

    /* Straight to stdout, where cmocka prints: its print_message keeps only
     * the first kilobyte or so, and a sanitizer report comes at the end. */
    fflush(stdout);
    printf("---- log of shmbrokerd --name %s (%s):\n", d->name, d->log);
    fputs(log != NULL ? log : "(unreadable)\n", stdout);
    printf("---- end of log\n");
    fflush(stdout);
    free(log);
}

int h_teardown(void **state)
{
    struct h_fix *f = *state;
    int i, rc = 0;

    if (f == NULL)
        return 0;
    for (i = 0; i < f->nchildren; i++) {
        if (f->children[i] > 0) {
            kill(f->children[i], SIGKILL);
            waitpid(f->children[i], NULL, 0);
        }
    }
    for (i = 0; i < f->ndaemons; i++) {
        struct h_daemon *d = &f->daemons[i];
        char seg[PATH_MAX * 2];
        int status;

        if (d->pid > 0 && (status = h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)) != 0 &&
            f->passed) {
            /* The test passed but left a daemon that did not stop cleanly. */
            print_error("shmbrokerd --name %s: exit status %d at teardown\n", d->name,
                        status < 0 ? -1 : h_exit_code(status));
            f->passed = false;
            rc = -1;
        }
        if (!f->passed)
            h_daemon_print_log(d);
        /* A killed daemon leaves its segment; only our own unique names. */
        h_segment_path(d, seg, sizeof(seg));
        if (strncmp(d->name, "shmbt-", 6) == 0) {
            unlink(seg);
            /* And its liveness lock file, beside it. */
            snprintf(seg, sizeof(seg), "%s/.%s.lock", d->shm_dir, d->name);
            unlink(seg);
        }
    }
    for (i = f->nmounts - 1; i >= 0; i--)
        if (umount2(f->mounts[i], MNT_DETACH) != 0)
            print_error("umount %s: %s\n", f->mounts[i], strerror(errno));
    nftw(f->dir, h_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    free(f);
    *state = NULL;
    return rc;
}

/* ---- processes ---------------------------------------------------------- */

int h_wait_pid(pid_t pid, int timeout_ms, int *status)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    int st = 0;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid) {
            if (status != NULL)
                *status = st;
            return 0;
        }
        if (r < 0 && errno != EINTR)
            return -errno;
        if (h_now_ms() >= deadline)
            return -ETIMEDOUT;
        h_sleep_ms(1);
    }
}

int h_exit_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

/* In a new child: die with the test process, so nothing outlives a crash. */
static void h_child_init(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/* Forget pid in the fixture's list of helpers. */
static void h_forget_child(struct h_fix *f, pid_t pid)
{
    int i;

    for (i = 0; i < f->nchildren; i++)
        if (f->children[i] == pid)
            f->children[i] = 0;
}

pid_t h_fork(struct h_fix *f, int (*fn)(void *), void *arg)
{
    pid_t pid;
    int i;

    for (i = 0; i < f->nchildren && f->children[i] != 0; i++)
        ;
    if (i == H_MAX_CHILDREN)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        h_child_init();
        _exit(fn(arg));
    }
    f->children[i] = pid;
    if (i == f->nchildren)
        f->nchildren++;
    return pid;
}

int h_child_wait(struct h_fix *f, pid_t pid, int timeout_ms)
{
    int status = 0;

    if (h_wait_pid(pid, timeout_ms, &status) < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        h_forget_child(f, pid);
        return -1;
    }
    h_forget_child(f, pid);
    return h_exit_code(status);
}

int h_child_kill(struct h_fix *f, pid_t pid, int sig)
{
    kill(pid, sig);
    return h_child_wait(f, pid, H_STOP_TIMEOUT_MS);
}

/* ---- daemons ------------------------------------------------------------ */

struct h_daemon *h_daemon_new(struct h_fix *f, const char *size)
{
    struct h_daemon *d;
    char dir[sizeof(f->dir)];
    int n;

    snprintf(dir, sizeof(dir), "%s", f->dir);
    if (f->ndaemons == H_MAX_DAEMONS)
        h_fail("more than %d daemons in one test", H_MAX_DAEMONS);
    n = f->ndaemons++;
    d = &f->daemons[n];
    memset(d, 0, sizeof(*d));
    d->status = -1;
    snprintf(d->name, sizeof(d->name), "shmbt-%d-%u", (int)getpid(), h_daemon_counter++);
    snprintf(d->socket, sizeof(d->socket), "%s/sock%d", dir, n);
    snprintf(d->shm_dir, sizeof(d->shm_dir), "/dev/shm");
    snprintf(d->size, sizeof(d->size), "%s", size);
    snprintf(d->log, sizeof(d->log), "%s/daemon%d.log", dir, n);
    return d;
}

pid_t h_daemon_spawn(struct h_fix *f, struct h_daemon *d, const char *const *extra)
{
    return h_daemon_spawn_nofile(f, d, extra, 0);
}

int h_daemon_wait_ready(struct h_daemon *d, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;
    struct h_conn c;

    for (;;) {
        int status;

        if (d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            d->status = status;
            return -1;
        }
        if (h_conn_open(&c, d->socket) == 0) {
            h_conn_close(&c);
            return 0;
        }
        if (h_now_ms() >= deadline)
            return -1;
        h_sleep_ms(2);
    }
}

struct h_daemon *h_daemon_start(struct h_fix *f, const char *size,
                                const char *const *extra)
{
    struct h_daemon *d = h_daemon_new(f, size);

    if (h_daemon_spawn(f, d, extra) < 0)
        h_fail("cannot start %s: %s", h_daemon_bin(), strerror(errno));
    if (h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd (%s) did not listen on %s within %d ms (exit status %d)",
               h_daemon_bin(), d->socket, H_READY_TIMEOUT_MS,
               d->status >= 0 ? h_exit_code(d->status) : -1);
    }
    return d;
}

int h_daemon_signal(struct h_daemon *d, int sig, int timeout_ms)
{
    int status = 0;

    if (d->pid <= 0)
        return d->status;
    kill(d->pid, sig);
    if (h_wait_pid(d->pid, timeout_ms, &status) < 0) {
        print_error("shmbrokerd pid %d did not exit within %d ms of signal %d; killing it\n",
                    (int)d->pid, timeout_ms, sig);
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &status, 0);
        d->pid = 0;
        d->status = status;
        return -1;
    }
    d->pid = 0;
    d->status = status;
    return status;
}

int h_daemon_wait_exit(struct h_daemon *d, int timeout_ms)
{
    int status = 0;

    if (d->pid <= 0)
        return d->status;
    if (h_wait_pid(d->pid, timeout_ms, &status) < 0) {
        h_daemon_signal(d, SIGKILL, timeout_ms);
        return -1;
    }
    d->pid = 0;
    d->status = status;
    return status;
}

/* ---- running programs --------------------------------------------------- */

int h_run(struct h_fix *f, const char *const *argv, const void *in, size_t in_len,
          struct h_run *r)
{
    char out_path[PATH_MAX], err_path[PATH_MAX], in_path[PATH_MAX], name[32];
    int n = f->nruns++, status = 0;
    pid_t pid;

    memset(r, 0, sizeof(*r));
    r->status = -1;
    snprintf(name, sizeof(name), "run%d.out", n);
    h_path(f, name, out_path, sizeof(out_path));
    snprintf(name, sizeof(name), "run%d.err", n);
    h_path(f, name, err_path, sizeof(err_path));
    snprintf(name, sizeof(name), "run%d.in", n);
    h_path(f, name, in_path, sizeof(in_path));
    if (in != NULL && h_write_file(in_path, in, in_len) < 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd_in = open(in != NULL ? in_path : "/dev/null", O_RDONLY);
        int fd_out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fd_err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        h_child_init();
        if (fd_in < 0 || fd_out < 0 || fd_err < 0)
            _exit(126);
        dup2(fd_in, STDIN_FILENO);
        dup2(fd_out, STDOUT_FILENO);
        dup2(fd_err, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        dprintf(STDERR_FILENO, "harness: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (h_wait_pid(pid, H_RUN_TIMEOUT_MS, &status) < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        r->status = -1;
    } else {
        r->status = h_exit_code(status);
    }
    r->out = h_read_file(out_path, &r->out_len);
    r->err = h_read_file(err_path, &r->err_len);
    if (r->out == NULL || r->err == NULL) {
        h_run_free(r);
        return -1;
    }
    return 0;
}

void h_run_free(struct h_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int h_ctl(struct h_fix *f, const struct h_daemon *d, const void *in, size_t in_len,
          struct h_run *r, ...)
{
    const char *argv[16];
    const char *arg;
    va_list ap;
    int n = 0;

    argv[n++] = h_ctl_bin();
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    va_start(ap, r);
    while ((arg = va_arg(ap, const char *)) != NULL && n < 15)
        argv[n++] = arg;
    va_end(ap);
    argv[n] = NULL;
    return h_run(f, argv, in, in_len, r);
}

int h_mount_tmpfs(struct h_fix *f, const char *size, char *dir, size_t len)
{
    char opts[64];

    if (f->nmounts == H_MAX_MOUNTS)
        return -ENOSPC;
    snprintf(dir, len, "%s/tmpfs%d", f->dir, f->nmounts);
    if (mkdir(dir, 0755) != 0)
        return -errno;
    snprintf(opts, sizeof(opts), "size=%s,mode=0755", size);
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0)
        return -errno;
    snprintf(f->mounts[f->nmounts++], sizeof(f->mounts[0]), "%s", dir);
    return 0;
}

/* ---- raw connections ---------------------------------------------------- */

int h_conn_open(struct h_conn *c, const char *socket_path)
{
    struct sockaddr_un sun;

    memset(c, 0, sizeof(*c));
    c->fd = -1;
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    if (strlen(socket_path) >= sizeof(sun.sun_path))
        return -ENAMETOOLONG;
    memcpy(sun.sun_path, socket_path, strlen(socket_path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -errno;
    if (connect(c->fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        int saved = errno;

        close(c->fd);
        c->fd = -1;
        return -saved;
    }
    return 0;
}

void h_conn_close(struct h_conn *c)
{
    int i;

    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    for (i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    c->nfds = 0;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = 0;
}

int h_conn_send(struct h_conn *c, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int h_conn_sendline(struct h_conn *c, const char *line)
{
    size_t len = strlen(line);
    char *buf = malloc(len + 1);
    int rc;

    if (buf == NULL)
        return -ENOMEM;
    memcpy(buf, line, len);
    buf[len] = '\n';
    rc = h_conn_send(c, buf, len + 1);
    free(buf);
    return rc;
}

/* Keep the descriptors of an SCM_RIGHTS message (extra ones are closed). */
static void h_conn_take_fds(struct h_conn *c, struct msghdr *msg)
{
    struct cmsghdr *cm;

    for (cm = CMSG_FIRSTHDR(msg); cm != NULL; cm = CMSG_NXTHDR(msg, cm)) {
        size_t i, n;

        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (i = 0; i < n; i++) {
            int fd;

            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (c->nfds < H_MAX_FDS)
                c->fds[c->nfds++] = fd;
            else
                close(fd);
        }
    }
}

/* One recvmsg into the buffer after waiting for data: bytes read, 0 at EOF,
 * -ETIMEDOUT or -errno. */
static ssize_t h_conn_fill(struct h_conn *c, int timeout_ms)
{
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(H_MAX_FDS * sizeof(int))];
    } control;
    struct pollfd pfd = {c->fd, POLLIN, 0};
    struct msghdr msg;
    struct iovec iov;
    ssize_t n;
    int rc;

    if (c->cap - c->len < 65536) {
        size_t cap = c->cap ? c->cap * 2 : 131072;
        char *grown = realloc(c->buf, cap);

        if (grown == NULL)
            return -ENOMEM;
        c->buf = grown;
        c->cap = cap;
    }
    do
        rc = poll(&pfd, 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return -errno;
    if (rc == 0)
        return -ETIMEDOUT;
    memset(&msg, 0, sizeof(msg));
    iov.iov_base = c->buf + c->len;
    iov.iov_len = c->cap - c->len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    do
        n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == ECONNRESET ? 0 : -errno;
    h_conn_take_fds(c, &msg);
    c->len += (size_t)n;
    return n;
}

int h_conn_recv_line(struct h_conn *c, char **line, int timeout_ms)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;

    *line = NULL;
    for (;;) {
        char *nl = c->len > 0 ? memchr(c->buf, '\n', c->len) : NULL;
        uint64_t now;
        ssize_t n;

        if (nl != NULL) {
            size_t len = (size_t)(nl - c->buf);

            *line = malloc(len + 1);
            if (*line == NULL)
                return -ENOMEM;
            memcpy(*line, c->buf, len);
            (*line)[len] = '\0';
            memmove(c->buf, nl + 1, c->len - len - 1);
            c->len -= len + 1;
            return 0;
        }
        now = h_now_ms();
        if (now >= deadline)
            return -ETIMEDOUT;
        n = h_conn_fill(c, (int)(deadline - now));
        if (n == 0)
            return -ECONNRESET;
        if (n < 0)
            return (int)n;
    }
}

int h_conn_wait_eof(struct h_conn *c, int timeout_ms)
{
    ssize_t n;

    if (c->len > 0)
        return 1;
    n = h_conn_fill(c, timeout_ms);
    if (n == 0)
        return 0;
    return n > 0 ? 1 : (int)n;
}

json_t *h_recv_json_at(struct h_conn *c, const char *file, int line)
{
    json_error_t jerr;
    char *text = NULL;
    json_t *reply;
    int rc = h_conn_recv_line(c, &text, H_REPLY_TIMEOUT_MS);

    if (rc < 0)
        h_fail_at(file, line, "no reply from shmbrokerd: %s", strerror(-rc));
    reply = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (reply == NULL || !json_is_object(reply)) {
        json_decref(reply);
        print_error("reply: %s\n", text);
        free(text);
        h_fail_at(file, line, "the reply is not a JSON object");
    }
    free(text);
    return reply;
}

json_t *h_call_at(struct h_conn *c, const char *request, const char *file, int line)
{
    int rc = h_conn_sendline(c, request);

    if (rc < 0)
        h_fail_at(file, line, "cannot send %s: %s", request, strerror(-rc));
    return h_recv_json_at(c, file, line);
}

json_t *h_open_hello_at(struct h_conn *c, const struct h_daemon *d, const char *file,
                        int line)
{
    json_t *reply;
    int rc = h_conn_open(c, d->socket);

    if (rc < 0)
        h_fail_at(file, line, "cannot connect to %s: %s", d->socket, strerror(-rc));
    reply = h_call_at(c, "{\"op\":\"hello\",\"version\":1,\"name\":\"e2e\"}", file, line);
    h_assert_reply_at(reply, NULL, NULL, file, line);
    return reply;
}

void h_assert_reply_at(const json_t *reply, const char *code, const char *substr,
                       const char *file, int line)
{
    const json_t *ok = json_object_get(reply, "ok");
    const char *error = json_string_value(json_object_get(reply, "error"));
    const char *message = json_string_value(json_object_get(reply, "message"));
    bool good;

    if (code == NULL)
        good = json_is_true(ok) && error == NULL;
    else
        good = json_is_false(ok) && error != NULL && strcmp(error, code) == 0 &&
               message != NULL && message[0] != '\0' &&
               (substr == NULL || strstr(message, substr) != NULL);
    if (!good) {
        char *text = json_dumps(reply, JSON_COMPACT);

        h_fail_at(file, line, "expected %s%s%s%s, got %s", code ? code : "ok",
                  substr ? " with message containing \"" : "", substr ? substr : "",
                  substr ? "\"" : "", text ? text : "(null)");
    }
}

void h_expect_at(struct h_conn *c, const char *request, const char *code,
                 const char *substr, const char *file, int line)
{
    json_t *reply = h_call_at(c, request, file, line);

    h_assert_reply_at(reply, code, substr, file, line);
    json_decref(reply);
}

long long h_int_at(const json_t *obj, const char *field, const char *file, int line)
{
    const json_t *v = json_object_get(obj, field);

    if (!json_is_integer(v)) {
        char *text = json_dumps(obj, JSON_COMPACT);

        h_fail_at(file, line, "no integer \"%s\" in %s", field, text ? text : "(null)");
    }
    return (long long)json_integer_value(v);
}

const char *h_str_at(const json_t *obj, const char *field, const char *file, int line)
{
    const json_t *v = json_object_get(obj, field);

    if (!json_is_string(v)) {
        char *text = json_dumps(obj, JSON_COMPACT);

        h_fail_at(file, line, "no string \"%s\" in %s", field, text ? text : "(null)");
    }
    return json_string_value(v);
}

void h_assert_alive_at(const struct h_daemon *d, const char *file, int line)
{
    struct h_conn c;
    json_t *reply = h_open_hello_at(&c, d, file, line);

    json_decref(reply);
    h_expect_at(&c, "{\"op\":\"stats\"}", NULL, NULL, file, line);
    h_conn_close(&c);
}

/* ---- daemons with resource limits, restarts ----------------------------- */

pid_t h_daemon_spawn_nofile(struct h_fix *f, struct h_daemon *d, const char *const *extra,
                            unsigned long nofile)
{
    return h_daemon_spawn_with(f, d, extra, NULL, nofile);
}

pid_t h_daemon_spawn_with(struct h_fix *f, struct h_daemon *d, const char *const *extra,
                          const char *const *wrapper, unsigned long nofile)
{
    struct rlimit lim = {(rlim_t)nofile, (rlim_t)nofile};
    const char *argv[48];
    int n = 0, i, fd;
    pid_t pid;

    (void)f;
    for (i = 0; wrapper != NULL && wrapper[i] != NULL && n < 16; i++)
        argv[n++] = wrapper[i];
    argv[n++] = h_daemon_bin();
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--name";
    argv[n++] = d->name;
    argv[n++] = "--size";
    argv[n++] = d->size;
    argv[n++] = "--shm-dir";
    argv[n++] = d->shm_dir;
    for (i = 0; extra != NULL && extra[i] != NULL && n < 47; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        close(fd);
        return -1;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);

        h_child_init();
        if (null >= 0)
            dup2(null, STDIN_FILENO);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        /* Descriptors the test process left open would count against the
         * limit; the daemon must start with only its standard three. */
        for (i = STDERR_FILENO + 1; nofile != 0 && i < 1024; i++)
            close(i);
        if (nofile != 0 && setrlimit(RLIMIT_NOFILE, &lim) != 0) {
            dprintf(STDERR_FILENO, "harness: setrlimit(RLIMIT_NOFILE, %lu): %s\n", nofile,
                    strerror(errno));
            _exit(126);
        }
        execvp(argv[0], (char *const *)argv);
        dprintf(STDERR_FILENO, "harness: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    d->pid = pid;
    d->status = -1;
    return pid;
}

struct h_daemon *h_daemon_again(struct h_fix *f, const struct h_daemon *old)
{
    struct h_daemon copy = *old;
    struct h_daemon *d = h_daemon_new(f, copy.size);

    snprintf(d->name, sizeof(d->name), "%s", copy.name);
    snprintf(d->socket, sizeof(d->socket), "%s", copy.socket);
    snprintf(d->shm_dir, sizeof(d->shm_dir), "%s", copy.shm_dir);
    return d;
}

long long h_proc_cpu_ticks(pid_t pid)
{
    char path[64], *text, *p;
    unsigned long long utime, stime;
    long long ticks = -1;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    text = h_read_file(path, NULL);
    if (text == NULL)
        return -1;
    /* After the command name in parentheses: state is field 3, utime 14,
     * stime 15. */
    p = strrchr(text, ')');
    if (p != NULL && sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                            &utime, &stime) == 2)
        ticks = (long long)(utime + stime);
    free(text);
    return ticks;
}

long long h_proc_rss_kib(pid_t pid)
{
    char path[64], *text, *p;
    long long kib = -1;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    text = h_read_file(path, NULL);
    if (text == NULL)
        return -1;
    p = strstr(text, "\nVmRSS:");
    if (p != NULL)
        kib = strtoll(p + 7, NULL, 10);
    free(text);
    return kib;
}

int h_count(const char *haystack, const char *needle)
{
    size_t len = needle != NULL ? strlen(needle) : 0;
    int n = 0;

    if (haystack == NULL || len == 0)
        return 0;
    while ((haystack = strstr(haystack, needle)) != NULL) {
        n++;
        haystack += len;
    }
    return n;
}

void h_signal_open(struct h_signal *s)
{
    assert_int_equal(pipe(s->fds), 0);
}

void h_signal_close(struct h_signal *s)
{
    close(s->fds[0]);
    close(s->fds[1]);
}

void h_signal_notify(struct h_signal *s)
{
    char b = 1;

    if (write(s->fds[1], &b, 1) != 1)
        _exit(90);
}

bool h_signal_wait(struct h_signal *s, int timeout_ms)
{
    struct pollfd pfd = {s->fds[0], POLLIN, 0};
    char b;

    return poll(&pfd, 1, timeout_ms) == 1 && read(s->fds[0], &b, 1) == 1;
}

/* ---- daemon logs ------------------------------------------------------------ */

char *h_log_text(const struct h_daemon *d)
{
    char *text = h_read_file(d->log, NULL);

    return text != NULL ? text : strdup("");
}

bool h_log_contains(const struct h_daemon *d, const char *needle)
{
    char *text = h_log_text(d);
    bool found = text != NULL && h_contains(text, needle);

    free(text);
    return found;
}

/* What h_wait_log polls for. */
struct h_log_wait {
    const struct h_daemon *d;
    const char *needle;
};

/* h_eventually callback: the log contains the needle. */
static bool h_log_has(void *arg)
{
    const struct h_log_wait *w = arg;

    return h_log_contains(w->d, w->needle);
}

void h_wait_log_at(const struct h_daemon *d, const char *needle, const char *file, int line)
{
    struct h_log_wait w = {d, needle};

    if (!h_eventually(h_log_has, &w, H_READY_TIMEOUT_MS)) {
        h_daemon_print_log(d);
        h_fail_at(file, line, "the log never said \"%s\"", needle);
    }
}

/* What h_reloaded polls for: the log has at least n SIGHUP outcomes. */
struct h_reload_wait {
    const struct h_daemon *d;
    int n;
};

/* The SIGHUP outcomes logged so far, applied or refused. */
static int h_reloads(const struct h_daemon *d)
{
    char *log = h_log_text(d);
    int n = h_count(log, "SIGHUP: settings");

    free(log);
    return n;
}

static bool h_reloaded(void *arg)
{
    const struct h_reload_wait *w = arg;

    return h_reloads(w->d) >= w->n;
}

void h_reload_at(const struct h_daemon *d, const char *file, int line)
{
    struct h_reload_wait w = {d, h_reloads(d) + 1};

    if (kill(d->pid, SIGHUP) != 0)
        h_fail_at(file, line, "cannot send SIGHUP to pid %d: %s", (int)d->pid,
                  strerror(errno));
    if (!h_eventually(h_reloaded, &w, 5000)) {
        h_daemon_print_log(d);
        h_fail_at(file, line, "no reload outcome logged within 5 s of SIGHUP");
    }
}

/* ---- runs of programs --------------------------------------------------------- */

void h_run_dump(const char *what, const struct h_run *r)
{
    print_error("%s: exit %d\n---- stdout:\n%s---- stderr:\n%s----\n", what, r->status,
                r->out ? r->out : "", r->err ? r->err : "");
}

void h_expect_run_at(const struct h_run *r, int status, const char *out, const char *err,
                     const char *file, int line)
{
    if (r->status != status || (out != NULL && strstr(r->out, out) == NULL) ||
        (err != NULL && strstr(r->err, err) == NULL)) {
        h_run_dump("unexpected result", r);
        h_fail_at(file, line, "expected exit %d%s%s%s%s", status, out ? ", stdout with " : "",
                  out ? out : "", err ? ", stderr with " : "", err ? err : "");
    }
}
