// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of the daemon's queue ops (PROTOCOL.md section 9) over raw
 * connections, as a client of another language would speak them: the memfd
 * queue_open passes (sealed, mapped read-write, its data path working across
 * processes), what a member's death does (a reader SIGKILLed: the blocked
 * writer goes on and the seat shows dead; the writer SIGKILLed: readers
 * drain, then see the end), shutdown and the daemon's stop waking blocked
 * members, a connection holding roles of several queues cleaned up at once,
 * the daemon's descriptors and mappings (one each per queue, none left after
 * deletion), a member scribbling its area, overflow objects deleted with
 * their queue, the per-connection cap on roles, and descriptors running
 * out (EMFILE replies, the spare kept for new clients).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../proto/queue.h"
#include "harness.h"

#define DAEMON_SIZE "1M"
/* More queue_creates than a daemon limited to 48 descriptors can take. */
#define QUEUE_FDS_TRY 60

/* One member's view of a queue: the descriptor its queue_open passed,
 * mapped, and attached. */
struct qview {
    void *base;
    size_t size;
    int seat; /* -1: the writer */
    struct shmb_q q;
};

/* Connect to d and say hello as name. 0 or -errno (for helper processes,
 * which must not fail through cmocka). */
static int conn_hello(struct h_conn *c, const struct h_daemon *d, const char *name)
{
    char line[128];
    char *reply = NULL;
    int rc;

    memset(c, 0, sizeof(*c));
    c->fd = -1;
    if ((rc = h_conn_open(c, d->socket)) < 0)
        return rc;
    snprintf(line, sizeof(line), "{\"op\":\"hello\",\"version\":1,\"name\":\"%s\"}", name);
    if ((rc = h_conn_sendline(c, line)) < 0 ||
        (rc = h_conn_recv_line(c, &reply, H_REPLY_TIMEOUT_MS)) < 0)
        return rc;
    rc = strstr(reply, "\"ok\":true") != NULL ? 0 : -EPROTO;
    free(reply);
    return rc;
}

/* Send a queue_open and map what it passes into v. 0, or -errno; *reply (if
 * not NULL) gets the reply, which the caller frees. */
static int view_open(struct h_conn *c, const char *name, int seat, struct qview *v,
                     json_t **reply_out)
{
    char line[160];
    char *text = NULL;
    json_t *reply;
    struct shmb_error err;
    int nfds = c->nfds, rc;

    memset(v, 0, sizeof(*v));
    if (seat == -1)
        snprintf(line, sizeof(line), "{\"op\":\"queue_open\",\"name\":\"%s\",\"role\":\"writer\"}",
                 name);
    else if (seat == -2)
        snprintf(line, sizeof(line), "{\"op\":\"queue_open\",\"name\":\"%s\",\"role\":\"reader\"}",
                 name);
    else
        snprintf(line, sizeof(line),
                 "{\"op\":\"queue_open\",\"name\":\"%s\",\"role\":\"reader\",\"seat\":%d}", name,
                 seat);
    if ((rc = h_conn_sendline(c, line)) < 0 ||
        (rc = h_conn_recv_line(c, &text, H_REPLY_TIMEOUT_MS)) < 0)
        return rc;
    reply = json_loads(text, 0, NULL);
    free(text);
    if (reply == NULL)
        return -EPROTO;
    if (!json_is_true(json_object_get(reply, "ok")) || c->nfds != nfds + 1) {
        rc = json_is_true(json_object_get(reply, "ok")) ? -EBADF : -EPROTO;
        goto out;
    }
    v->size = (size_t)json_integer_value(json_object_get(reply, "size"));
    v->seat = (int)json_integer_value(json_object_get(reply, "seat"));
    v->base = mmap(NULL, v->size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fds[c->nfds - 1], 0);
    if (v->base == MAP_FAILED) {
        v->base = NULL;
        rc = -errno;
        goto out;
    }
    rc = shmb_q_attach(&v->q, v->base, v->size, &err);
    /* A writer publishes at the epoch its queue_open answered. */
    if (v->seat < 0)
        v->q.writer_epoch = (uint64_t)json_integer_value(json_object_get(reply, "epoch"));
out:
    if (reply_out != NULL)
        *reply_out = reply;
    else
        json_decref(reply);
    return rc;
}

static void view_close(struct qview *v)
{
    if (v->base != NULL)
        munmap(v->base, v->size);
    v->base = NULL;
}

/* Send a request and fail the test unless it succeeds. */
static void ok(struct h_conn *c, const char *request)
{
    json_t *reply = h_call(c, request);

    h_assert_reply_at(reply, NULL, NULL, __FILE__, __LINE__);
    json_decref(reply);
}

/* The entry of queue name in a queue_list reply (borrowed from it); NULL when
 * it is not listed. */
static json_t *listed(json_t *reply, const char *name)
{
    json_t *queues = json_object_get(reply, "queues"), *q;
    size_t i;

    json_array_foreach(queues, i, q)
        if (strcmp(json_string_value(json_object_get(q, "name")), name) == 0)
            return q;
    return NULL;
}

/* A seat's entry in a queue's seat_list (borrowed). */
static json_t *seat_of(json_t *queue, int seat)
{
    return json_array_get(json_object_get(queue, "seat_list"), (size_t)seat);
}

/* What the helper processes get. */
struct helper {
    const struct h_daemon *d;
    struct h_signal sig;
    const char *queue;
    int seat;     /* reader seat, -1 writer */
    int messages; /* the writer publishes this many, then waits */
};

/* A reader that takes its seat, says so, and waits for ever in dequeue: exit
 * 0 when the wait ends with ECANCELED, 10 + errno otherwise. */
static int reader_blocked(void *arg)
{
    struct helper *h = arg;
    struct h_conn c;
    struct qview v;
    struct shmb_error err;
    const void *data;
    size_t len;
    int rc;

    if (conn_hello(&c, h->d, "blocked-reader") < 0 || view_open(&c, h->queue, h->seat, &v, NULL) < 0)
        return 2;
    h_signal_notify(&h->sig);
    rc = shmb_q_dequeue(&v.q, (uint32_t)v.seat, &data, &len, -1, &err);
    return rc == -ECANCELED ? 0 : 10 + (rc < 0 ? -rc : 0);
}

/* A writer that takes the role, says so, and waits for ever for a slot (the
 * readers never read): exit 0 when the wait ends with ECANCELED. */
static int writer_blocked(void *arg)
{
    struct helper *h = arg;
    struct h_conn c;
    struct qview v;
    struct shmb_error err;
    int rc, i;

    if (conn_hello(&c, h->d, "blocked-writer") < 0 || view_open(&c, h->queue, -1, &v, NULL) < 0)
        return 2;
    for (i = 0; i < (int)v.q.slots; i++)
        if (shmb_q_enqueue(&v.q, "x", 1, 0, &err) != 0)
            return 3;
    h_signal_notify(&h->sig);
    rc = shmb_q_enqueue(&v.q, "x", 1, -1, &err);
    return rc == -ECANCELED ? 0 : 10 + (rc < 0 ? -rc : 0);
}

/* A member that takes its role (and, as the writer, publishes "m0", "m1",
 * ...), says so, and sleeps until killed. */
static int member_idle(void *arg)
{
    struct helper *h = arg;
    struct h_conn c;
    struct qview v;
    struct shmb_error err;
    char msg[16];
    int i;

    if (conn_hello(&c, h->d, h->seat == -1 ? "doomed-writer" : "doomed-reader") < 0 ||
        view_open(&c, h->queue, h->seat, &v, NULL) < 0)
        return 2;
    for (i = 0; i < h->messages; i++) {
        snprintf(msg, sizeof(msg), "m%d", i);
        if (shmb_q_enqueue(&v.q, msg, strlen(msg), 0, &err) != 0)
            return 3;
    }
    h_signal_notify(&h->sig);
    for (;;)
        pause();
    return 0;
}

/* Kill a process after a moment: the blocked wait of the test starts first
 * (if it did not, the test still passes, through the other path). */
static int killer(void *arg)
{
    pid_t victim = *(pid_t *)arg;

    h_sleep_ms(100);
    kill(victim, SIGKILL);
    return 0;
}

/* Proves that queue_open passes one descriptor: a memfd of the reply's size,
 * named after the daemon, sealed against resizing, that maps read-write; its
 * header is the reply's geometry; and what a writer publishes through its
 * mapping a reader of another connection reads through its own. */
static void test_open_passes_memfd(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn w, r;
    struct qview wv, rv;
    struct shmb_error err;
    char link[64], target[256], want[128];
    const void *data;
    json_t *reply;
    struct stat st;
    size_t len;
    ssize_t n;

    assert_int_equal(conn_hello(&w, d, "w"), 0);
    assert_int_equal(conn_hello(&r, d, "r"), 0);
    ok(&w, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":2,\"slots\":3,\"slot_size\":128}");
    assert_int_equal(view_open(&w, "q", -1, &wv, &reply), 0);
    assert_int_equal(w.nfds, 2); /* the segment's, then the queue's */
    assert_int_equal(h_int(reply, "seat"), -1);
    json_decref(reply);
    assert_int_equal(fstat(w.fds[1], &st), 0);
    assert_int_equal((size_t)st.st_size, wv.size);
    assert_int_equal(fcntl(w.fds[1], F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE),
                     F_SEAL_SHRINK | F_SEAL_GROW);
    assert_int_not_equal(ftruncate(w.fds[1], 0), 0);
    assert_int_equal(fcntl(w.fds[1], F_GETFL) & O_ACCMODE, O_RDWR);
    snprintf(link, sizeof(link), "/proc/self/fd/%d", w.fds[1]);
    n = readlink(link, target, sizeof(target) - 1);
    assert_true(n > 0);
    target[n] = '\0';
    snprintf(want, sizeof(want), "memfd:%s.q.q", d->name);
    if (!h_contains(target, want))
        h_fail("the queue's memfd is %s, not %s", target, want);
    assert_int_equal(wv.q.seats, 2);
    assert_int_equal(wv.q.slots, 3);
    assert_int_equal(wv.q.slot_size, 128);
    assert_int_equal(view_open(&r, "q", 1, &rv, &reply), 0);
    assert_int_equal(h_int(reply, "epoch"), (long long)atomic_load(&rv.q.seat[1].epoch));
    json_decref(reply);
    assert_int_equal(shmb_q_enqueue(&wv.q, "hello", 5, 1000, &err), 0);
    assert_int_equal(shmb_q_dequeue(&rv.q, 1, &data, &len, 1000, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(data, "hello", 5);
    shmb_q_done(&rv.q, 1);
    view_close(&wv);
    view_close(&rv);
    h_conn_close(&w);
    h_conn_close(&r);
    h_pass(f);
}

/* Proves that a reader SIGKILLed while the writer waits for its slot frees
 * the writer at once (no timeout is needed for the wait to end), and that
 * queue_list then shows its seat dead, naming the process that died, until a
 * new reader takes it. */
static void test_reader_killed(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct helper h = {.d = d, .queue = "q", .seat = 0};
    struct h_conn w;
    struct qview wv, rv;
    struct shmb_error err;
    json_t *reply, *q;
    void *buf;
    pid_t reader, k;

    assert_int_equal(conn_hello(&w, d, "w"), 0);
    ok(&w, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    assert_int_equal(view_open(&w, "q", -1, &wv, NULL), 0);
    h_signal_open(&h.sig);
    reader = h_fork(f, member_idle, &h);
    assert_true(reader > 0);
    assert_true(h_signal_wait(&h.sig, H_REPLY_TIMEOUT_MS));
    assert_int_equal(shmb_q_enqueue(&wv.q, "a", 1, 0, &err), 0);
    assert_int_equal(shmb_q_enqueue(&wv.q, "b", 1, 0, &err), 0);
    /* Both slots hold messages the live reader has not read. */
    assert_int_equal(shmb_q_reserve(&wv.q, 1, &buf, 0, &err), -ETIMEDOUT);
    reply = h_call(&w, "{\"op\":\"queue_list\"}");
    q = listed(reply, "q");
    assert_non_null(q);
    assert_int_equal(h_int(json_object_get(q, "blocker"), "pid"), reader);
    json_decref(reply);
    k = h_fork(f, killer, &reader);
    assert_true(k > 0);
    /* Blocked until the reader dies, which the daemon tells the writer at
     * once; 30 s is only there so that a broken daemon fails the test. */
    assert_int_equal(shmb_q_reserve(&wv.q, 1, &buf, 30000, &err), 0);
    assert_int_equal(shmb_q_publish(&wv.q, 1, &err), 0);
    assert_int_equal(h_child_wait(f, k, H_REPLY_TIMEOUT_MS), 0);
    h_child_wait(f, reader, H_REPLY_TIMEOUT_MS);
    reply = h_call(&w, "{\"op\":\"queue_list\",\"seats\":true}");
    q = listed(reply, "q");
    assert_string_equal(h_str(seat_of(q, 0), "state"), "dead");
    assert_int_equal(h_int(seat_of(q, 0), "pid"), reader);
    assert_string_equal(h_str(seat_of(q, 0), "name"), "doomed-reader");
    assert_int_equal(h_int(q, "seats_dead"), 1);
    assert_true(json_is_null(json_object_get(q, "blocker")));
    json_decref(reply);
    /* A new reader takes the dead seat and starts at the next message. */
    {
        struct h_conn r;
        const void *data;
        size_t len;

        assert_int_equal(conn_hello(&r, d, "r2"), 0);
        assert_int_equal(view_open(&r, "q", -2, &rv, NULL), 0);
        assert_int_equal(rv.seat, 0);
        assert_int_equal(shmb_q_enqueue(&wv.q, "next", 4, 1000, &err), 0);
        assert_int_equal(shmb_q_dequeue(&rv.q, 0, &data, &len, 1000, &err), 0);
        assert_memory_equal(data, "next", 4);
        view_close(&rv);
        h_conn_close(&r);
    }
    h_signal_close(&h.sig);
    view_close(&wv);
    h_conn_close(&w);
    h_pass(f);
}

/* Proves that a writer SIGKILLed leaves its readers what it published, then
 * the end of the queue (EPIPE); queue_list says "writer_gone"; a new writer
 * opens the queue again and its readers go on. */
static void test_writer_killed(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct helper h = {.d = d, .queue = "q", .seat = -1, .messages = 3};
    struct h_conn r, w2;
    struct qview rv, wv;
    struct shmb_error err;
    const void *data;
    size_t len;
    json_t *reply;
    char want[8];
    pid_t writer;
    int i;

    assert_int_equal(conn_hello(&r, d, "r"), 0);
    ok(&r, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":1,\"slots\":4,\"slot_size\":64}");
    assert_int_equal(view_open(&r, "q", 0, &rv, NULL), 0);
    h_signal_open(&h.sig);
    writer = h_fork(f, member_idle, &h);
    assert_true(writer > 0);
    assert_true(h_signal_wait(&h.sig, H_REPLY_TIMEOUT_MS));
    h_child_kill(f, writer, SIGKILL);
    for (i = 0; i < 3; i++) {
        snprintf(want, sizeof(want), "m%d", i);
        assert_int_equal(shmb_q_dequeue(&rv.q, 0, &data, &len, 5000, &err), 0);
        assert_int_equal(len, strlen(want));
        assert_memory_equal(data, want, len);
    }
    assert_int_equal(shmb_q_dequeue(&rv.q, 0, &data, &len, 5000, &err), -EPIPE);
    reply = h_call(&r, "{\"op\":\"queue_list\"}");
    assert_string_equal(h_str(listed(reply, "q"), "state"), "writer_gone");
    assert_true(json_is_null(json_object_get(listed(reply, "q"), "writer")));
    json_decref(reply);
    assert_int_equal(conn_hello(&w2, d, "w2"), 0);
    assert_int_equal(view_open(&w2, "q", -1, &wv, NULL), 0);
    reply = h_call(&r, "{\"op\":\"queue_list\"}");
    assert_string_equal(h_str(listed(reply, "q"), "state"), "open");
    json_decref(reply);
    assert_int_equal(shmb_q_enqueue(&wv.q, "again", 5, 1000, &err), 0);
    assert_int_equal(shmb_q_dequeue(&rv.q, 0, &data, &len, 5000, &err), 0);
    assert_memory_equal(data, "again", 5);
    h_signal_close(&h.sig);
    view_close(&rv);
    view_close(&wv);
    h_conn_close(&r);
    h_conn_close(&w2);
    h_pass(f);
}

/* Proves that queue_shutdown ends a reader's and a writer's endless waits,
 * in other processes, with ECANCELED, and that the queue then goes as its
 * members leave. */
static void test_shutdown_wakes(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct helper hr = {.d = d, .queue = "r", .seat = 0}, hw = {.d = d, .queue = "w"};
    struct h_conn c;
    struct qview v;
    json_t *reply;
    pid_t reader, writer;

    assert_int_equal(conn_hello(&c, d, "admin"), 0);
    /* Two queues: a reader with no writer, a writer whose reader (here)
     * never reads. */
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"r\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"w\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    assert_int_equal(view_open(&c, "w", 0, &v, NULL), 0);
    h_signal_open(&hr.sig);
    h_signal_open(&hw.sig);
    reader = h_fork(f, reader_blocked, &hr);
    assert_true(h_signal_wait(&hr.sig, H_REPLY_TIMEOUT_MS));
    writer = h_fork(f, writer_blocked, &hw);
    assert_true(h_signal_wait(&hw.sig, H_REPLY_TIMEOUT_MS));
    /* The reader read nothing; wait until both sleep, then shut down. */
    h_sleep_ms(50);
    ok(&c, "{\"op\":\"queue_shutdown\",\"name\":\"r\"}");
    ok(&c, "{\"op\":\"queue_shutdown\",\"name\":\"w\"}");
    assert_int_equal(h_child_wait(f, writer, H_REPLY_TIMEOUT_MS), 0);
    assert_int_equal(h_child_wait(f, reader, H_REPLY_TIMEOUT_MS), 0);
    h_sleep_ms(100);
    reply = h_call(&c, "{\"op\":\"queue_list\"}");
    assert_null(listed(reply, "r"));
    assert_string_equal(h_str(listed(reply, "w"), "state"), "shutdown"); /* held here */
    json_decref(reply);
    ok(&c, "{\"op\":\"queue_close\",\"name\":\"w\"}");
    reply = h_call(&c, "{\"op\":\"queue_list\"}");
    assert_null(listed(reply, "w"));
    json_decref(reply);
    view_close(&v);
    h_signal_close(&hr.sig);
    h_signal_close(&hw.sig);
    h_conn_close(&c);
    h_pass(f);
}

/* Proves that the daemon's stop (SIGTERM) shuts its queues down: a reader
 * blocked in another process wakes with ECANCELED. */
static void test_stop_cancels(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct helper h = {.d = d, .queue = "q", .seat = -2};
    struct h_conn c;
    pid_t reader;

    assert_int_equal(conn_hello(&c, d, "admin"), 0);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    h_signal_open(&h.sig);
    reader = h_fork(f, reader_blocked, &h);
    assert_true(h_signal_wait(&h.sig, H_REPLY_TIMEOUT_MS));
    h_sleep_ms(50);
    assert_int_equal(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS), 0);
    assert_int_equal(h_child_wait(f, reader, H_REPLY_TIMEOUT_MS), 0);
    assert_true(h_log_contains(d, "shutting down 1 queue"));
    h_signal_close(&h.sig);
    h_conn_close(&c);
    h_pass(f);
}

/* Proves that one connection holding the writer role and seats of several
 * queues, two seats of one and both roles of another, leaves every one of
 * them when it closes: seats dead, writers gone, its temporary queue gone. */
static void test_close_cleans_every_role(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn m, other;
    struct qview v[6];
    json_t *reply, *q;
    int i;

    assert_int_equal(conn_hello(&m, d, "many"), 0);
    assert_int_equal(conn_hello(&other, d, "other"), 0);
    ok(&m, "{\"op\":\"queue_create\",\"name\":\"q1\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    ok(&m, "{\"op\":\"queue_create\",\"name\":\"q2\",\"seats\":3,\"slots\":2,\"slot_size\":64}");
    ok(&m, "{\"op\":\"queue_create\",\"name\":\"q3\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    ok(&m, "{\"op\":\"queue_create\",\"name\":\"t\",\"seats\":1,\"slots\":2,\"slot_size\":64,"
           "\"temporary\":true}");
    assert_int_equal(view_open(&m, "q1", -1, &v[0], NULL), 0);
    assert_int_equal(view_open(&m, "q2", 0, &v[1], NULL), 0);
    assert_int_equal(view_open(&m, "q2", 2, &v[2], NULL), 0);
    assert_int_equal(view_open(&m, "q3", -1, &v[3], NULL), 0);
    assert_int_equal(view_open(&m, "q3", 0, &v[4], NULL), 0);
    assert_int_equal(view_open(&m, "t", -1, &v[5], NULL), 0);
    h_conn_close(&m);
    h_sleep_ms(100);
    reply = h_call(&other, "{\"op\":\"queue_list\",\"seats\":true}");
    q = listed(reply, "q1");
    assert_string_equal(h_str(q, "state"), "writer_gone");
    q = listed(reply, "q2");
    assert_string_equal(h_str(q, "state"), "open");
    assert_int_equal(h_int(q, "seats_dead"), 2);
    assert_int_equal(h_int(q, "seats_free"), 1);
    q = listed(reply, "q3");
    assert_string_equal(h_str(q, "state"), "writer_gone");
    assert_string_equal(h_str(seat_of(q, 0), "state"), "dead");
    assert_null(listed(reply, "t"));
    assert_int_equal(json_array_size(json_object_get(reply, "queues")), 3);
    json_decref(reply);
    /* In the areas too: the data path sees the same. */
    assert_int_equal(atomic_load(&v[1].q.seat[0].state), SHMB_SEAT_DEAD);
    assert_int_equal(atomic_load(&v[2].q.seat[2].state), SHMB_SEAT_DEAD);
    assert_int_equal(atomic_load(&v[0].q.hdr->state), SHMB_QUEUE_WRITER_GONE);
    for (i = 0; i < 6; i++)
        view_close(&v[i]);
    h_conn_close(&other);
    h_pass(f);
}

/* The daemon's open descriptors and its mappings of queue memfds. */
static void daemon_resources(const struct h_daemon *d, int *fds, int *maps)
{
    char path[64], line[512];
    struct dirent *e;
    DIR *dir;
    FILE *fp;

    snprintf(path, sizeof(path), "/proc/%d/fd", (int)d->pid);
    dir = opendir(path);
    assert_non_null(dir);
    *fds = 0;
    while ((e = readdir(dir)) != NULL)
        *fds += e->d_name[0] != '.';
    closedir(dir);
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)d->pid);
    fp = fopen(path, "r");
    assert_non_null(fp);
    *maps = 0;
    while (fgets(line, sizeof(line), fp) != NULL)
        *maps += strstr(line, ".q.") != NULL && strstr(line, "memfd:") != NULL;
    fclose(fp);
}

/* Proves that the daemon keeps one descriptor and one mapping per queue,
 * however many times members open and close it, and none once deleted. */
static void test_daemon_resources(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn c;
    struct qview v;
    int fds0, maps0, fds, maps, i;

    assert_int_equal(conn_hello(&c, d, "c"), 0);
    daemon_resources(d, &fds0, &maps0);
    assert_int_equal(maps0, 0);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"a\",\"seats\":2,\"slots\":2,\"slot_size\":64}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"b\",\"seats\":2,\"slots\":2,\"slot_size\":64}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"c\",\"seats\":2,\"slots\":2,\"slot_size\":64}");
    for (i = 0; i < 20; i++) {
        assert_int_equal(view_open(&c, i % 2 ? "a" : "b", i % 3 == 0 ? -1 : -2, &v, NULL), 0);
        view_close(&v);
        close(c.fds[--c.nfds]); /* the harness keeps 8 */
        ok(&c, i % 2 ? "{\"op\":\"queue_close\",\"name\":\"a\"}"
                     : "{\"op\":\"queue_close\",\"name\":\"b\"}");
    }
    daemon_resources(d, &fds, &maps);
    assert_int_equal(fds, fds0 + 3);
    assert_int_equal(maps, 3);
    ok(&c, "{\"op\":\"queue_delete\",\"name\":\"a\"}");
    ok(&c, "{\"op\":\"queue_delete\",\"name\":\"b\"}");
    ok(&c, "{\"op\":\"queue_delete\",\"name\":\"c\"}");
    daemon_resources(d, &fds, &maps);
    assert_int_equal(fds, fds0);
    assert_int_equal(maps, 0);
    h_conn_close(&c);
    h_pass(f);
}

/* Proves that a member scribbling its area (the header's geometry) hurts
 * neither the daemon nor the next member, who gets a sound header, nor
 * another queue. */
static void test_hostile_member(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn bad, good;
    struct qview bv, gv, ov;
    struct shmb_error err;
    struct shmb_queue_header *hdr;
    const void *data;
    size_t len;

    assert_int_equal(conn_hello(&bad, d, "bad"), 0);
    assert_int_equal(conn_hello(&good, d, "good"), 0);
    ok(&good, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":2,\"slots\":2,\"slot_size\":64}");
    ok(&good, "{\"op\":\"queue_create\",\"name\":\"o\",\"seats\":1,\"slots\":2,\"slot_size\":64}");
    assert_int_equal(view_open(&bad, "q", 0, &bv, NULL), 0);
    hdr = bv.base;
    hdr->magic = 0;
    hdr->seats = 64;
    hdr->slots = 1;
    hdr->total_size = 1;
    hdr->slots_offset = 0;
    memset(hdr->name, 'x', sizeof(hdr->name));
    assert_int_equal(view_open(&good, "q", -1, &gv, NULL), 0);
    assert_int_equal(gv.q.seats, 2);
    assert_int_equal(view_open(&good, "o", 0, &ov, NULL), 0);
    h_assert_alive(d);
    assert_int_equal(shmb_q_enqueue(&gv.q, "fine", 4, 1000, &err), 0);
    assert_int_equal(shmb_q_dequeue(&bv.q, 0, &data, &len, 1000, &err), 0);
    view_close(&bv);
    view_close(&gv);
    view_close(&ov);
    h_conn_close(&bad);
    h_conn_close(&good);
    h_pass(f);
}

/* Proves that a queue's deletion (here automatic: a temporary queue its
 * writer leaves) deletes the pool's objects of the messages still in its
 * ring ("q/<name>/<seq>", seq in [head - slots, head], looked up by key)
 * and no other: not another queue's, not one out of that range. */
static void test_overflow_objects_deleted(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn c;
    struct qview v;
    const char *keys[] = {"q/t/1", "q/t/3", "q/t/9", "q/t2/0", "keep"};
    struct shmb_error err;
    char line[128];
    json_t *reply;
    size_t i;

    assert_int_equal(conn_hello(&c, d, "c"), 0);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"t\",\"seats\":1,\"slots\":2,\"slot_size\":64,"
           "\"temporary\":true}");
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        snprintf(line, sizeof(line), "{\"op\":\"alloc\",\"key\":\"%s\",\"size\":100}", keys[i]);
        ok(&c, line);
        snprintf(line, sizeof(line), "{\"op\":\"commit\",\"key\":\"%s\"}", keys[i]);
        ok(&c, line);
    }
    assert_int_equal(view_open(&c, "t", -1, &v, NULL), 0);
    for (i = 0; i < 3; i++) /* head 3, 2 slots: messages 1..3 */
        assert_int_equal(shmb_q_enqueue(&v.q, "m", 1, 1000, &err), 0);
    view_close(&v);
    ok(&c, "{\"op\":\"queue_close\",\"name\":\"t\"}");
    reply = h_call(&c, "{\"op\":\"queue_list\"}");
    assert_null(listed(reply, "t"));
    json_decref(reply);
    reply = h_call(&c, "{\"op\":\"list\"}");
    assert_int_equal(json_array_size(json_object_get(reply, "objects")), 3);
    assert_string_equal(h_str(json_array_get(json_object_get(reply, "objects"), 0), "key"),
                        "q/t/9");
    assert_string_equal(h_str(json_array_get(json_object_get(reply, "objects"), 1), "key"),
                        "q/t2/0");
    assert_string_equal(h_str(json_array_get(json_object_get(reply, "objects"), 2), "key"),
                        "keep");
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* Proves the cap of 256 roles per connection (EMFILE naming it), counted
 * over every queue. */
static void test_roles_cap(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    struct h_conn c;
    char line[160];
    json_t *reply;
    int i, j;

    assert_int_equal(conn_hello(&c, d, "greedy"), 0);
    for (i = 0; i < 5; i++) {
        snprintf(line, sizeof(line),
                 "{\"op\":\"queue_create\",\"name\":\"q%d\",\"seats\":64,\"slots\":2,"
                 "\"slot_size\":64}",
                 i);
        ok(&c, line);
    }
    for (i = 0; i < 4; i++)
        for (j = 0; j < 64; j++) {
            snprintf(line, sizeof(line),
                     "{\"op\":\"queue_open\",\"name\":\"q%d\",\"role\":\"reader\"}", i);
            ok(&c, line);
        }
    h_expect_error(&c, "{\"op\":\"queue_open\",\"name\":\"q4\",\"role\":\"writer\"}", "EMFILE",
                   "holds 256 queue roles, the most one may (256)");
    ok(&c, "{\"op\":\"queue_close\",\"name\":\"q0\",\"seat\":5}");
    reply = h_call(&c, "{\"op\":\"queue_open\",\"name\":\"q4\",\"role\":\"writer\"}");
    h_assert_reply_at(reply, NULL, NULL, __FILE__, __LINE__);
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* Write text to the daemon's configuration file path and reload it. */
static void reload_with(struct h_fix *f, const struct h_daemon *d, const char *path,
                        const char *text)
{
    char tmp[PATH_MAX];

    h_path(f, "next.conf", tmp, sizeof(tmp));
    assert_int_equal(h_write_file(tmp, text, strlen(text)), 0);
    assert_int_equal(rename(tmp, path), 0);
    h_reload(d);
}

/* Proves that a pool SIGHUP no longer names stays while it has queues (a
 * queue is a channel its processes will open again), and goes once they are
 * deleted; the queues of one pool are not another's. */
static void test_pool_with_queues_stays(void **state)
{
    struct h_fix *f = *state;
    static const char one[] = "pool = main:1M\n";
    static const char two[] = "pool = main:1M\npool = extra:1M\n";
    char conf[PATH_MAX];
    struct h_daemon *d;
    struct h_conn c;

    h_path(f, "pools.conf", conf, sizeof(conf));
    assert_int_equal(h_write_file(conf, two, strlen(two)), 0);
    d = h_daemon_start(f, "1M", (const char *const[]){"--config", conf, NULL});
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    ok(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"extra\"}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"q\",\"seats\":1,\"slots\":2,"
           "\"slot_size\":64}");
    h_conn_close(&c);
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    ok(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"main\"}");
    h_expect_error(&c, "{\"op\":\"queue_delete\",\"name\":\"q\"}", "ENOENT",
                   "No queue 'q' in pool 'main'; its queues are: none.");
    h_conn_close(&c);
    h_sleep_ms(100); /* the first connection's close reached the daemon */
    reload_with(f, d, conf, one);
    h_wait_log(d, "SIGHUP: pool 'extra' stays: it has 1 queue.");
    assert_int_equal(h_conn_open(&c, d->socket), 0);
    ok(&c, "{\"op\":\"hello\",\"version\":1,\"pool\":\"extra\"}");
    ok(&c, "{\"op\":\"queue_delete\",\"name\":\"q\"}");
    h_conn_close(&c);
    h_sleep_ms(100);
    reload_with(f, d, conf, one);
    h_wait_log(d, "SIGHUP: pool 'extra' removed (it was empty)");
    h_pass(f);
}

/* The length of queue name's entry in reply's "queues", as JSON text. */
static size_t entry_len(json_t *reply, const char *name)
{
    json_t *q = listed(reply, name);
    char *text;
    size_t len;

    assert_non_null(q);
    text = json_dumps(q, JSON_COMPACT);
    assert_non_null(text);
    len = strlen(text);
    free(text);
    return len;
}

/* Issue 24: the reports cost what the peer asked for. Proves that a queue's
 * entry in queue_list and in stats is a summary whose size does not grow
 * with its seats (64 live readers, each named, weigh no more than one), and
 * that "seats":true brings every seat, with its holder, in both. */
static void test_reports_sized_by_request(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, DAEMON_SIZE, NULL);
    const char *ops[] = {"{\"op\":\"queue_list\"}", "{\"op\":\"stats\"}"};
    const char *with_seats[] = {"{\"op\":\"queue_list\",\"seats\":true}",
                                "{\"op\":\"stats\",\"seats\":true}"};
    struct h_conn c;
    json_t *reply, *q, *seats;
    size_t i;
    int s;

    assert_int_equal(conn_hello(&c, d, "a-reader-with-a-long-name"), 0);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"one\",\"seats\":1,\"slots\":2,"
           "\"slot_size\":64}");
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"big\",\"seats\":64,\"slots\":2,"
           "\"slot_size\":64}");
    ok(&c, "{\"op\":\"queue_open\",\"name\":\"one\",\"role\":\"reader\"}");
    for (s = 0; s < 64; s++)
        ok(&c, "{\"op\":\"queue_open\",\"name\":\"big\",\"role\":\"reader\"}");
    for (i = 0; i < 2; i++) {
        reply = h_call(&c, ops[i]);
        h_assert_ok(reply);
        /* The same fields, a few digits more (64 seats, 64 live). */
        if (entry_len(reply, "big") > entry_len(reply, "one") + 16)
            h_fail("%s: the entry of a queue of 64 live seats is %zu bytes, of 1 seat %zu: "
                   "the summary grows with seats",
                   ops[i], entry_len(reply, "big"), entry_len(reply, "one"));
        q = listed(reply, "big");
        assert_int_equal(h_int(q, "seats_live"), 64);
        assert_null(json_object_get(q, "seat_list"));
        json_decref(reply);
        reply = h_call(&c, with_seats[i]);
        h_assert_ok(reply);
        q = listed(reply, "big");
        seats = json_object_get(q, "seat_list");
        assert_int_equal(json_array_size(seats), 64);
        assert_string_equal(h_str(json_array_get(seats, 63), "state"), "live");
        assert_string_equal(h_str(json_array_get(seats, 63), "name"),
                            "a-reader-with-a-long-name");
        assert_int_equal(json_array_size(json_object_get(listed(reply, "one"), "seat_list")),
                         1);
        json_decref(reply);
    }
    reply = h_call(&c, "{\"op\":\"queue_list\",\"seats\":1}");
    h_assert_error(reply, "EINVAL", "queue_list");
    json_decref(reply);
    h_conn_close(&c);
    h_pass(f);
}

/* held_at_end_of_input: a queue_open whose reply waits behind earlier
 * replies the client has not read yet (its descriptor travels with the
 * reply, after them), and a client that half-closes (or, reset, closes)
 * right after its last requests: those behind the queue_open still run, as
 * PROTOCOL.md's End of input promises for every request but an alloc that
 * waits and the hello reply. After a half-close the client gets every
 * reply, the queue_open's with the descriptor; either way the noreply
 * delete behind it runs. (The held reply was taken for a held hello reply:
 * the connection closed at once, the delete never ran, and the replies
 * queued were dropped.) */
static void open_held_at_end_of_input(void **state, bool reset)
{
    static const char *const extra[] = {"--max-queued-output", "16M", NULL};
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "8M", extra);
    char key[240], *line, *batch;
    size_t used;
    struct h_conn c, o;
    json_t *reply;
    int i, b, fds;
    bool gone = false;

    assert_int_equal(conn_hello(&c, d, "writer"), 0);
    assert_int_equal(conn_hello(&o, d, "other"), 0);
    ok(&c, "{\"op\":\"queue_create\",\"name\":\"held\",\"seats\":1,\"slots\":4,"
           "\"slot_size\":64}");
    /* 1200 objects with long keys: a list of them is far more than the
     * socket holds. */
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    batch = malloc(64 * 1024);
    assert_non_null(batch);
    for (b = 0; b < 12; b++) {
        used = (size_t)snprintf(batch, 64 * 1024, "{\"op\":\"batch\",\"ops\":[");
        for (i = 0; i < 100; i++)
            used +=
                (size_t)snprintf(batch + used, 64 * 1024 - used,
                                 "%s{\"op\":\"alloc\",\"key\":\"%.200s%05d\",\"size\":1},"
                                 "{\"op\":\"commit\",\"key\":\"%.200s%05d\"}",
                                 i > 0 ? "," : "", key, b * 100 + i, key, b * 100 + i);
        snprintf(batch + used, 64 * 1024 - used, "]}");
        ok(&c, batch);
    }
    free(batch);
    ok(&c, "{\"op\":\"alloc\",\"key\":\"gone\",\"size\":1}");
    ok(&c, "{\"op\":\"commit\",\"key\":\"gone\"}");
    fds = c.nfds;
    line = "{\"op\":\"list\",\"limit\":100000,\"id\":1}\n"
           "{\"op\":\"list\",\"limit\":100000,\"id\":2}\n";
    assert_int_equal(h_conn_send(&c, line, strlen(line)), 0);
    /* Their replies wait in the daemon, unread, before the rest comes (a
     * later batch); a slower daemon would only make this test pass. */
    h_sleep_ms(300);
    line = "{\"op\":\"queue_open\",\"name\":\"held\",\"role\":\"writer\",\"id\":3}\n"
           "{\"op\":\"delete\",\"key\":\"gone\",\"noreply\":true}\n"
           "{\"op\":\"contains\",\"key\":\"gone\",\"id\":4}\n";
    assert_int_equal(h_conn_send(&c, line, strlen(line)), 0);
    if (reset) {
        /* Unread replies in its socket: the daemon sees a reset. */
        h_conn_close(&c);
        for (i = 0; i < 100 && !gone; i++) {
            reply = h_call(&o, "{\"op\":\"contains\",\"key\":\"gone\"}");
            gone = json_is_false(json_object_get(reply, "exists"));
            json_decref(reply);
            if (!gone)
                h_sleep_ms(100);
        }
        assert_true(gone);
        h_conn_close(&o);
        h_pass(f);
        return;
    }
    assert_int_equal(shutdown(c.fd, SHUT_WR), 0);
    for (i = 1; i <= 4; i++) {
        reply = h_recv_json(&c);
        h_assert_ok(reply);
        assert_int_equal(h_int(reply, "id"), i);
        if (i == 4)
            assert_true(json_is_false(json_object_get(reply, "exists")));
        json_decref(reply);
    }
    assert_int_equal(c.nfds, fds + 1);
    assert_int_equal(h_conn_wait_eof(&c, H_REPLY_TIMEOUT_MS), 0);
    reply = h_call(&o, "{\"op\":\"contains\",\"key\":\"gone\"}");
    assert_true(json_is_false(json_object_get(reply, "exists")));
    json_decref(reply);
    h_conn_close(&c);
    h_conn_close(&o);
    h_pass(f);
}

static void test_open_held_at_half_close(void **state)
{
    open_held_at_end_of_input(state, false);
}

static void test_open_held_at_reset(void **state)
{
    open_held_at_end_of_input(state, true);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

/* Proves what a daemon short of descriptors does: queue_create stops with
 * EMFILE (numbers and a hint) while some are left for clients; once
 * clients have taken those, queue_open replies EMFILE holding no role
 * rather than dropping the connection; and the daemon still answers new
 * clients once one leaves. */
static void test_out_of_fds(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d;
    struct h_conn c, others[16], late;
    struct rlimit old, lim;
    char line[160];
    json_t *reply, *q;
    int i, n = 0, made = 0;

    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    lim.rlim_cur = 48; /* inherited by the daemon */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    d = h_daemon_start(f, DAEMON_SIZE, NULL);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(conn_hello(&c, d, "c"), 0);
    for (i = 0; i < QUEUE_FDS_TRY; i++) {
        snprintf(line, sizeof(line),
                 "{\"op\":\"queue_create\",\"name\":\"q%d\",\"seats\":2,\"slots\":2,"
                 "\"slot_size\":64}",
                 i);
        reply = h_call(&c, line);
        if (!json_is_true(json_object_get(reply, "ok"))) {
            h_assert_error(reply, "EMFILE", "Cannot create queue");
            assert_non_null(strstr(h_str(reply, "message"), "ulimit -n"));
            json_decref(reply);
            break;
        }
        json_decref(reply);
        made++;
    }
    assert_true(made > 0 && made < QUEUE_FDS_TRY);
    /* Clients take what was left. */
    while (n < 16 && conn_hello(&others[n], d, "o") == 0)
        n++;
    assert_true(n > 0 && n < 16);
    h_conn_close(&others[n]);
    reply = h_call(&c, "{\"op\":\"queue_open\",\"name\":\"q0\",\"role\":\"reader\"}");
    h_assert_error(reply, "EMFILE", "Cannot open queue 'q0'");
    json_decref(reply);
    reply = h_call(&c, "{\"op\":\"queue_list\"}");
    q = listed(reply, "q0");
    assert_non_null(q);
    assert_int_equal(json_integer_value(json_object_get(q, "seats_free")), 2);
    json_decref(reply);
    h_conn_close(&others[--n]);
    assert_int_equal(conn_hello(&late, d, "late"), 0);
    h_conn_close(&late);
    while (n > 0)
        h_conn_close(&others[--n]);
    h_assert_alive(d);
    h_conn_close(&c);
    h_pass(f);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_open_passes_memfd),   TEST(test_reader_killed),
        TEST(test_writer_killed),       TEST(test_shutdown_wakes),
        TEST(test_stop_cancels),        TEST(test_close_cleans_every_role),
        TEST(test_daemon_resources),    TEST(test_hostile_member),
        TEST(test_overflow_objects_deleted), TEST(test_roles_cap),
        TEST(test_pool_with_queues_stays), TEST(test_out_of_fds),
        TEST(test_reports_sized_by_request), TEST(test_open_held_at_half_close),
        TEST(test_open_held_at_reset),
    };

    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    return cmocka_run_group_tests_name("test_queue_ops", tests, NULL, NULL);
}
