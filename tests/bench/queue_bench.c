// SPDX-License-Identifier: Apache-2.0
/*
 * shmb-queue-bench: one writer broadcasting to N reader processes, through a
 * shmbroker queue (the library and a running shmbrokerd) and through the
 * references it is compared with in the same run: a busy-polling ring of
 * the queue's own layout (no daemon, no futex: readers burn a core, as
 * vLLM's shm_broadcast does), ZeroMQ PUB/SUB over ipc://, and a fan-out over
 * Unix stream sockets. It starts no daemon itself; scripts/bench.sh does.
 *
 * The parent is the writer; the readers are forked. Every message carries
 * its sequence number and the CLOCK_MONOTONIC time it was sent in its first
 * 16 bytes; readers check the order, read every byte, and leave their
 * counts, latency samples and CPU time in shared memory for the parent.
 * Each run prints one table line and one JSON line.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "bench_util.h"
#include "layout_queue.h"
#include "queue.h"
#include "shmbroker.h"

#define MAX_READERS SHMB_QUEUE_SEATS_MAX
/* Latency samples kept per reader: a paced run sends one message every
 * 200 us at most, so a few seconds of it fit. */
#define MAX_SAMPLES (1u << 17)
/* Every message starts with its sequence number and send time. */
#define MSG_HEADER 16u
#define END_SEQ UINT64_MAX /* the message that ends a run */
/* The queue's geometry, for shmbroker and the busy-poll ring alike: vLLM's
 * 10 slots (max_chunks; --slots changes it), each holding the largest
 * message measured, 1 MiB, inline. */
#define RING_SLOTS 10u
#define RING_SLOT_SIZE (1u << 20)
/* ZeroMQ's queue limit, in messages per pipe: its default (1000), or fewer
 * for big messages, so that at most ~64 MiB wait per reader on either side. */
#define ZMQ_HWM_MAX 1000
#define ZMQ_QUEUED_BYTES (64u << 20)
/* No run takes this long: a stuck reader or writer ends the run by SIGALRM,
 * and a message of a latency run unread for TURN_LIMIT_S fails it. A reader
 * that has not had the end message, or not exited, END_LIMIT_S after it was
 * sent fails the run with its counts: a reader drains at most the queue's
 * slots or ZeroMQ's and the kernel's buffers by then, which take well under a
 * second even on an oversubscribed machine. */
#define RUN_LIMIT_S 60u
#define TURN_LIMIT_S 10u
#define END_LIMIT_S 30u

enum impl { I_SHMB, I_SPIN, I_ZMQ, I_UNIX };
static const char *const impl_names[] = {"shmb", "spin", "zmq", "unix"};

enum run { R_LATENCY, R_THROUGHPUT, R_IDLE };
static const char *const run_names[] = {"latency", "throughput", "idle"};

struct options {
    enum impl impl;
    enum run run;
    const char *socket;
    const char *label;
    size_t size;
    int readers;
    uint64_t slots;
    double seconds;
    long period_us; /* latency: the pace; -1 automatic, 0 back-to-back */
    long spin_us;   /* shmb readers: shmb_queue_set_spin; 0 adaptive */
    long pause_us;  /* readers pause this long after each counted message */
};

static struct options opt = {
    .impl = I_SHMB, .run = R_LATENCY, .label = "", .size = 64, .readers = 1,
    .slots = RING_SLOTS, .seconds = 1.0, .period_us = -1,
};

/* The untimed first lap: messages sent before the clock starts, enough to
 * pass every slot twice, so that the pages and caches a new process would
 * fault in are warm for the run (an idle run has none: it measures waiting).
 * Readers count none of them; their pace is reported apart. */
static uint64_t warm_msgs(void)
{
    if (opt.run == R_IDLE)
        return 0;
    return opt.slots * 2 > 16 ? opt.slots * 2 : 16;
}

static double first_lap_msgs_s; /* the writer's: the first lap's messages/s */

/* What one reader leaves for the parent (in shared memory). */
struct reader_result {
    _Alignas(64) _Atomic uint64_t acked; /* 1 + the last message it finished with */
    uint8_t pad[56];        /* the writer polls acked: a line of its own */
    uint64_t got;           /* messages received (the end message aside) */
    uint64_t lost;          /* sequence numbers skipped */
    uint64_t last_ns;       /* when it received its last message */
    _Atomic int ended;      /* it has the end message */
    double cpu_s;           /* idle: CPU seconds between ready and the end message */
    uint64_t nsamples;
    int failed;
    char error[256];
    double samples[MAX_SAMPLES]; /* one-way latency, microseconds */
};

static struct reader_result *results;

/* The readers, for the writer's failures to take down, and how each
 * ended once reaped. */
static pid_t pids[MAX_READERS];
static int forked;
static bool reaped[MAX_READERS];
static int reaped_status[MAX_READERS];

/* What the writer is doing, for the message of a run stopped by SIGALRM. */
static const char *const phase_names[] = {
    "starting the readers", "waiting for every reader to attach", "sending",
    "closing the writer's side", "waiting for the readers to finish",
};
enum phase { P_START, P_ATTACH, P_SEND, P_CLOSE, P_REAP };
static volatile sig_atomic_t phase;
static char alarm_msg[160]; /* formatted before the alarm is armed */

/* ---- small utilities ------------------------------------------------------ */

/* Report a reader's failure into its result slot. */
static int reader_fail(struct reader_result *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int reader_fail(struct reader_result *r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
    r->failed = 1;
    return -1;
}

/* The writer's failures end the run: the readers are killed by the parent. */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "shmb-queue-bench: %s %s: ", impl_names[opt.impl], run_names[opt.run]);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    while (forked > 0)
        kill(pids[--forked], SIGKILL);
    exit(1);
}

static volatile uint64_t sink; /* keeps the sums alive */

static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* SIGALRM: the run hangs. Say where the writer was (only async-signal-safe
 * calls here), stop the readers and end with status 1, never silently. */
static void on_alarm(int sig)
{
    const char *p = phase_names[phase];
    int i;

    (void)sig;
    if (write(STDERR_FILENO, alarm_msg, strlen(alarm_msg)) < 0 ||
        write(STDERR_FILENO, p, strlen(p)) < 0 ||
        write(STDERR_FILENO, "; the readers were stopped\n", 27) < 0)
        _exit(1);
    for (i = 0; i < forked; i++)
        kill(pids[i], SIGKILL);
    _exit(1);
}

/* Whether reader i has exited; its status is kept for the report. */
static bool reader_exited(int i)
{
    int st;

    if (!reaped[i] && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        reaped[i] = true;
        reaped_status[i] = st;
    }
    return reaped[i];
}

/* Why reader i failed, into buf: its own message, else how it ended. */
static const char *reader_reason(int i, char *buf, size_t size)
{
    int st = reaped_status[i];

    if (results[i].error[0] != '\0')
        return results[i].error;
    if (WIFSIGNALED(st))
        snprintf(buf, size, "killed by signal %d (%s) after %llu messages", WTERMSIG(st),
                 strsignal(WTERMSIG(st)), (unsigned long long)results[i].got);
    else
        snprintf(buf, size, "exited with status %d, no error of its own, after %llu messages",
                 WEXITSTATUS(st), (unsigned long long)results[i].got);
    return buf;
}

/* ---- the busy-poll ring: the queue's layout, no daemon, no futex ----------- */

/* The simplest honest ring over the same header, seats and slots: head
 * published with release, each seat's next likewise, nothing else shared.
 * Both sides wait as vLLM's shm_broadcast does: poll, and sched_yield between
 * polls (which returns at once when nothing else wants the core: the core
 * stays busy either way). The area is mapped before the fork. */
static struct shmb_q spin_q;
static uint64_t spin_next; /* the reader's next message, or the writer's */

/* Map and lay out the ring, every seat live. */
static int spin_setup(void)
{
    size_t size = shmb_q_size((uint32_t)opt.readers, opt.slots, RING_SLOT_SIZE);
    struct shmb_error err;
    void *area;
    int s;

    area = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED)
        return -1;
    if (shmb_q_format(area, size, "bench-spin", (uint32_t)opt.readers, opt.slots,
                      RING_SLOT_SIZE, &err) != 0 ||
        shmb_q_attach(&spin_q, area, size, &err) != 0) {
        fprintf(stderr, "shmb-queue-bench: %s\n", err.message);
        return -1;
    }
    for (s = 0; s < opt.readers; s++)
        atomic_store(&spin_q.seat[s].state, SHMB_SEAT_LIVE);
    return 0;
}

static struct shmb_queue_slot *spin_slot(uint64_t n)
{
    return (struct shmb_queue_slot *)(spin_q.base + spin_q.slots_offset +
                                      (n % spin_q.slots) * spin_q.slot_stride);
}

/* Writer: poll until every reader has read the message that last used the
 * slot of message spin_next. */
static void *spin_reserve(void)
{
    uint64_t n = spin_next;
    int s;

    if (n >= opt.slots)
        for (s = 0; s < opt.readers; s++)
            while (atomic_load_explicit(&spin_q.seat[s].next, memory_order_acquire) <=
                   n - opt.slots)
                sched_yield();
    return (unsigned char *)spin_slot(n) + SHMB_QUEUE_SLOT_HEADER;
}

static void spin_publish(size_t len)
{
    struct shmb_queue_slot *slot = spin_slot(spin_next);

    slot->seq = spin_next;
    slot->flags = SHMB_QUEUE_INLINE;
    slot->len = (uint32_t)len;
    spin_next++;
    atomic_store_explicit(&spin_q.hdr->head, spin_next, memory_order_release);
}

/* Reader: poll head until the next message is published. */
static int spin_dequeue(struct reader_result *r, const unsigned char **p, size_t *len)
{
    struct shmb_queue_slot *slot;

    while (atomic_load_explicit(&spin_q.hdr->head, memory_order_acquire) <= spin_next)
        sched_yield();
    slot = spin_slot(spin_next);
    if (slot->seq != spin_next)
        return reader_fail(r, "spin: slot holds message %llu, not %llu",
                           (unsigned long long)slot->seq, (unsigned long long)spin_next);
    *p = (const unsigned char *)slot + SHMB_QUEUE_SLOT_HEADER;
    *len = slot->len;
    return 0;
}

static void spin_done(int seat)
{
    spin_next++;
    atomic_store_explicit(&spin_q.seat[seat].next, spin_next, memory_order_release);
}

/* ---- the transports, one switch each -------------------------------------- */

/* What the ZeroMQ reference does to be measured fairly, as an application
 * that needs every message would use it:
 * - XPUB with XPUB_NODROP and SNDHWM = RCVHWM = zmq_hwm(): at the high-water
 *   mark a send blocks until a reader makes room, as our queue's writer
 *   waits for a free slot; a PUB would drop messages instead and be measured
 *   sending what nobody received.
 * - The slow joiner: the writer waits until every reader's subscription has
 *   arrived (XPUB_VERBOSE) before the first message, so none is lost to a
 *   subscription still on its way.
 * - The first lap is untimed, as for every transport.
 * - Readers read each message in place in its zmq_msg_t, with no copy.
 * - The writer keeps its socket open until every reader has the end message.
 *   libzmq 4.3 drops what a SUB has not yet taken from the kernel's socket
 *   buffer when the publisher hangs up while the SUB's pipe is at its RCVHWM
 *   (its engine, input stopped, takes the hang-up as an error): a reader
 *   behind by more than its pipe lost the tail of the run and the end
 *   message, and waited for it forever. Waiting is not measured: a run's time
 *   ends when the last reader had the last counted message. */

/* Each process's side of the transport. */
static struct {
    /* shmbroker */
    shmb_t *c;
    shmb_queue_t *q;
    char qname[33];
    /* ZeroMQ */
    void *zctx, *zsock;
    zmq_msg_t zmsg;
    char zpath[108];
    int hwm;
    /* Unix sockets: both ends of each reader's pair (made before the
     * fork), the one a reader keeps, and the message buffer */
    int fds[MAX_READERS], rfds[MAX_READERS];
    int fd;
    unsigned char *buf;
} tr;

/* ZeroMQ's HWM for this size (see ZMQ_QUEUED_BYTES). */
static int zmq_hwm(void)
{
    size_t h = ZMQ_QUEUED_BYTES / opt.size;

    if (h > ZMQ_HWM_MAX)
        h = ZMQ_HWM_MAX;
    if (h < 16)
        h = 16;
    return (int)h;
}

/* Before the fork: what the readers inherit. */
static void setup_before_fork(void)
{
    int i, sv[2];

    switch (opt.impl) {
    case I_SPIN:
        if (spin_setup() != 0)
            die("cannot map the ring: %s", strerror(errno));
        break;
    case I_UNIX:
        for (i = 0; i < opt.readers; i++) {
            if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
                die("socketpair: %s", strerror(errno));
            tr.fds[i] = sv[0];
            tr.rfds[i] = sv[1];
        }
        break;
    case I_ZMQ:
        tr.hwm = zmq_hwm();
        snprintf(tr.zpath, sizeof(tr.zpath), "ipc:///tmp/shmb-qbench-%d.ipc", (int)getpid());
        break;
    case I_SHMB:
        snprintf(tr.qname, sizeof(tr.qname), "qbench-%d", (int)getpid());
        break;
    }
}

/* The writer's side, once the readers are forked (and before they open
 * theirs: a reader's seat or subscription needs the queue or the socket). */
static void writer_open(void)
{
    int one = 1, hwm = tr.hwm, rc;

    switch (opt.impl) {
    case I_SHMB:
        tr.c = shmb_new();
        if (tr.c == NULL)
            die("out of memory");
        shmb_set_populate(tr.c, 0); /* the queue's area is its own memfd */
        if (shmb_connect(tr.c, opt.socket, "queue-bench-writer") != 0)
            die("connect %s: %s", opt.socket, shmb_errmsg(tr.c));
        rc = shmb_queue_create(tr.c, tr.qname, (uint32_t)opt.readers, opt.slots,
                               RING_SLOT_SIZE, SHMB_QUEUE_TEMPORARY);
        if (rc == 0)
            rc = shmb_queue_open(tr.c, tr.qname, SHMB_QUEUE_WRITER, &tr.q);
        if (rc != 0)
            die("queue %s: %s: %s", tr.qname, shmb_errname(tr.c), shmb_errmsg(tr.c));
        break;
    case I_ZMQ:
        tr.zctx = zmq_ctx_new();
        tr.zsock = tr.zctx ? zmq_socket(tr.zctx, ZMQ_XPUB) : NULL;
        /* XPUB_VERBOSE: every subscription reaches the writer (the
         * slow-joiner wait below counts them); XPUB_NODROP: at the HWM a
         * send waits (blocks) instead of dropping the message. */
        if (tr.zsock == NULL ||
            zmq_setsockopt(tr.zsock, ZMQ_XPUB_VERBOSE, &one, sizeof(one)) != 0 ||
            zmq_setsockopt(tr.zsock, ZMQ_XPUB_NODROP, &one, sizeof(one)) != 0 ||
            zmq_setsockopt(tr.zsock, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
            zmq_bind(tr.zsock, tr.zpath) != 0)
            die("zmq XPUB on %s: %s", tr.zpath, zmq_strerror(zmq_errno()));
        break;
    default:
        break;
    }
}

/* Once every reader said it is ready: make sure each is attached, so that
 * no message is sent before a reader can receive it. */
static void writer_wait_readers(void)
{
    int timeout = 20000, i;
    unsigned char sub[64];

    switch (opt.impl) {
    case I_SHMB:
        if (shmb_queue_wait_ready(tr.q, timeout) != 0)
            die("wait_ready: %s", shmb_errmsg(tr.c));
        break;
    case I_ZMQ:
        /* The slow joiner: a SUB's subscription reaches the XPUB once its
         * pipe is attached; messages sent before that are lost to it. */
        zmq_setsockopt(tr.zsock, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
        for (i = 0; i < opt.readers; i++)
            if (zmq_recv(tr.zsock, sub, sizeof(sub), 0) < 1 || sub[0] != 1)
                die("zmq: %d of %d subscriptions arrived", i, opt.readers);
        break;
    default:
        break;
    }
}

/* A buffer of opt.size bytes to fill with the next message: in the slot
 * (shmbroker, the ring), in a ZeroMQ message, or the writer's own buffer. */
static unsigned char *writer_begin(void)
{
    void *p = NULL;

    switch (opt.impl) {
    case I_SHMB:
        if (shmb_queue_reserve(tr.q, opt.size, &p, -1) != 0)
            die("reserve: %s", shmb_errmsg(tr.c));
        return p;
    case I_SPIN:
        return spin_reserve();
    case I_ZMQ:
        if (zmq_msg_init_size(&tr.zmsg, opt.size) != 0)
            die("zmq_msg_init_size: %s", zmq_strerror(zmq_errno()));
        return zmq_msg_data(&tr.zmsg);
    case I_UNIX:
        return tr.buf;
    }
    return NULL;
}

/* Send the message filled since writer_begin to every reader. */
static void writer_send(void)
{
    size_t off;
    ssize_t n;
    int i;

    switch (opt.impl) {
    case I_SHMB:
        if (shmb_queue_publish(tr.q, opt.size) != 0)
            die("publish: %s", shmb_errmsg(tr.c));
        break;
    case I_SPIN:
        spin_publish(opt.size);
        break;
    case I_ZMQ:
        if (zmq_msg_send(&tr.zmsg, tr.zsock, 0) != (int)opt.size)
            die("zmq_msg_send: %s", zmq_strerror(zmq_errno()));
        break;
    case I_UNIX:
        /* The fan-out: the same bytes to each reader in turn; a full socket
         * buffer blocks the writer until that reader reads. */
        for (i = 0; i < opt.readers; i++)
            for (off = 0; off < opt.size; off += (size_t)n) {
                n = send(tr.fds[i], tr.buf + off, opt.size - off, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR) {
                    n = 0;
                    continue;
                }
                if (n <= 0)
                    die("send to reader %d: %s", i, strerror(errno));
            }
        break;
    }
}

static void writer_close(void)
{
    int i;

    switch (opt.impl) {
    case I_SHMB:
        if (shmb_queue_close(tr.q) != 0)
            die("close: %s", shmb_errmsg(tr.c));
        shmb_close(tr.c);
        break;
    case I_ZMQ:
        /* Every reader has the end message (writer_wait_ended): nothing is
         * left for the linger to deliver. */
        zmq_close(tr.zsock);
        zmq_ctx_term(tr.zctx);
        break;
    case I_UNIX:
        for (i = 0; i < opt.readers; i++)
            close(tr.fds[i]);
        break;
    default:
        break;
    }
}

/* A reader's side: connect (before the writer is ready) ... */
static int reader_connect(struct reader_result *r, int id)
{
    int i, hwm = zmq_hwm();

    switch (opt.impl) {
    case I_SHMB:
        tr.c = shmb_new();
        if (tr.c == NULL)
            return reader_fail(r, "out of memory");
        shmb_set_populate(tr.c, 0);
        if (shmb_connect(tr.c, opt.socket, "queue-bench-reader") != 0)
            return reader_fail(r, "connect %s: %s", opt.socket, shmb_errmsg(tr.c));
        break;
    case I_ZMQ:
        tr.zctx = zmq_ctx_new();
        tr.zsock = tr.zctx ? zmq_socket(tr.zctx, ZMQ_SUB) : NULL;
        if (tr.zsock == NULL || zmq_setsockopt(tr.zsock, ZMQ_RCVHWM, &hwm, sizeof(hwm)) != 0)
            return reader_fail(r, "zmq SUB: %s", zmq_strerror(zmq_errno()));
        break;
    case I_UNIX:
        tr.fd = tr.rfds[id];
        for (i = 0; i < opt.readers; i++) {
            close(tr.fds[i]);
            if (i != id)
                close(tr.rfds[i]);
        }
        if ((tr.buf = malloc(opt.size)) == NULL)
            return reader_fail(r, "out of memory");
        break;
    default:
        break;
    }
    return 0;
}

/* ... then take its seat or subscribe (after the writer's side exists). */
static int reader_attach(struct reader_result *r, int id)
{
    switch (opt.impl) {
    case I_SHMB:
        if (shmb_queue_open(tr.c, tr.qname, id, &tr.q) != 0)
            return reader_fail(r, "open seat %d: %s: %s", id, shmb_errname(tr.c),
                               shmb_errmsg(tr.c));
        if (opt.spin_us > 0 && shmb_queue_set_spin(tr.q, (unsigned)opt.spin_us) != 0)
            return reader_fail(r, "--spin-us %ld: %s", opt.spin_us, shmb_errmsg(tr.c));
        break;
    case I_ZMQ:
        if (zmq_setsockopt(tr.zsock, ZMQ_SUBSCRIBE, "", 0) != 0 ||
            zmq_connect(tr.zsock, tr.zpath) != 0)
            return reader_fail(r, "zmq connect %s: %s", tr.zpath, zmq_strerror(zmq_errno()));
        break;
    default:
        break;
    }
    return 0;
}

/* The next message, in place where the transport allows it. */
static int reader_next(struct reader_result *r, const unsigned char **p, size_t *len)
{
    const void *d;
    size_t got;
    ssize_t n;
    int rc;

    switch (opt.impl) {
    case I_SHMB:
        if ((rc = shmb_queue_dequeue(tr.q, &d, len, -1)) != 0)
            return reader_fail(r, "dequeue: %s: %s", shmb_errname(tr.c), shmb_errmsg(tr.c));
        *p = d;
        return 0;
    case I_SPIN:
        return spin_dequeue(r, p, len);
    case I_ZMQ:
        if (zmq_msg_init(&tr.zmsg) != 0 || zmq_msg_recv(&tr.zmsg, tr.zsock, 0) < 0)
            return reader_fail(r, "zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
        *p = zmq_msg_data(&tr.zmsg);
        *len = zmq_msg_size(&tr.zmsg);
        return 0;
    case I_UNIX:
        /* Every message of a run has opt.size bytes: no framing needed. */
        for (got = 0; got < opt.size; got += (size_t)n) {
            n = recv(tr.fd, tr.buf + got, opt.size - got, MSG_WAITALL);
            if (n < 0 && errno == EINTR) {
                n = 0;
                continue;
            }
            if (n <= 0)
                return reader_fail(r, "recv: %s", n < 0 ? strerror(errno) : "end of stream");
        }
        *p = tr.buf;
        *len = opt.size;
        return 0;
    }
    return -1;
}

/* Finished with the message reader_next returned. */
static void reader_done(int id)
{
    switch (opt.impl) {
    case I_SHMB: shmb_queue_done(tr.q); break;
    case I_SPIN: spin_done(id); break;
    case I_ZMQ: zmq_msg_close(&tr.zmsg); break;
    default: break;
    }
}

static void reader_close(void)
{
    switch (opt.impl) {
    case I_SHMB:
        shmb_queue_close(tr.q);
        shmb_close(tr.c);
        break;
    case I_ZMQ:
        zmq_close(tr.zsock);
        zmq_ctx_term(tr.zctx);
        break;
    case I_UNIX:
        close(tr.fd);
        free(tr.buf);
        break;
    default:
        break;
    }
}

/* ---- the reader process ------------------------------------------------------ */

/* Receive until the end message: check the order and the last byte (a slot
 * overwritten under the reader shows there), read every byte, keep the
 * latency of each message. */
static int reader_run(struct reader_result *r, int id, int gate, int ready)
{
    const unsigned char *p = NULL;
    uint64_t expect = 0, seq, sent, t, warm = warm_msgs();
    double cpu0 = 0;
    size_t len = 0;
    char byte = 1;

    if (reader_connect(r, id) != 0)
        return -1;
    if (read(gate, &byte, 1) < 0) /* EOF: the writer's side exists */
        return reader_fail(r, "gate: %s", strerror(errno));
    close(gate);
    if (reader_attach(r, id) != 0)
        return -1;
    cpu0 = cpu_seconds();
    /* Closed after the byte: the writer sees EOF once every reader has
     * said ready or exited, and never waits for one that failed. */
    if (write(ready, &byte, 1) != 1)
        return reader_fail(r, "ready: %s", strerror(errno));
    close(ready);
    for (;;) {
        if (reader_next(r, &p, &len) != 0)
            return -1;
        t = now_ns();
        memcpy(&seq, p, 8);
        memcpy(&sent, p + 8, 8);
        if (seq == END_SEQ) {
            reader_done(id);
            atomic_store_explicit(&r->ended, 1, memory_order_release);
            break;
        }
        if (len != opt.size || seq < expect || p[len - 1] != (unsigned char)seq)
            return reader_fail(r, "message %llu (expected %llu): %zu bytes, last byte %u",
                               (unsigned long long)seq, (unsigned long long)expect, len,
                               p[len - 1]);
        r->lost += seq - expect;
        expect = seq + 1;
        sink += sum_bytes(p, len);
        if (seq < warm) {
            reader_done(id);
            atomic_store_explicit(&r->acked, seq + 1, memory_order_release);
            continue;
        }
        if (warm != 0 && r->got == 0)
            cpu0 = cpu_seconds(); /* the run's CPU, from its first counted message */
        if (opt.run == R_LATENCY && r->nsamples < MAX_SAMPLES)
            r->samples[r->nsamples++] = (double)(t - sent) / 1000.0;
        r->got++;
        r->last_ns = t;
        reader_done(id);
        atomic_store_explicit(&r->acked, seq + 1, memory_order_release);
        if (opt.pause_us > 0) {
            struct timespec ts = {(time_t)(opt.pause_us / 1000000),
                                  (opt.pause_us % 1000000) * 1000};

            nanosleep(&ts, NULL);
        }
    }
    r->cpu_s = cpu_seconds() - cpu0;
    reader_close();
    return 0;
}

/* ---- the writer (the parent) --------------------------------------------------- */

/* Fill a message: the pattern, then the sequence number and, last, the
 * time it is sent. */
static void fill(unsigned char *p, uint64_t seq)
{
    uint64_t t;

    memset(p + MSG_HEADER, (int)(seq & 0xff), opt.size - MSG_HEADER);
    memcpy(p, &seq, 8);
    t = now_ns();
    memcpy(p + 8, &t, 8);
}

/* Latency: wait until every reader has finished with message seq - 1
 * (one message in flight), then until the pace's next tick. */
static void wait_turn(uint64_t seq, uint64_t tick)
{
    struct timespec ts;
    uint64_t limit = now_ns() + (uint64_t)TURN_LIMIT_S * 1000000000u;
    int i;

    for (i = 0; i < opt.readers; i++)
        while (atomic_load_explicit(&results[i].acked, memory_order_acquire) < seq) {
            if (opt.period_us == 0) {
                sched_yield();
            } else {
                ts.tv_sec = 0;
                ts.tv_nsec = 20000;
                nanosleep(&ts, NULL);
            }
            if (now_ns() > limit)
                die("reader %d did not read message %llu", i, (unsigned long long)seq - 1);
        }
    if (opt.period_us > 0 && now_ns() < tick) {
        ts.tv_sec = (time_t)(tick / 1000000000u);
        ts.tv_nsec = (long)(tick % 1000000000u);
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    }
}

/* Send for opt.seconds (idle: send nothing for opt.seconds), then the end
 * message. Returns the number of messages sent; *start when it began. */
static uint64_t writer_run(uint64_t *start)
{
    uint64_t period = (uint64_t)(opt.period_us > 0 ? opt.period_us : 0) * 1000u;
    uint64_t dur = (uint64_t)(opt.seconds * 1e9), seq = 0, t0, tick;
    uint64_t warm = warm_msgs();
    unsigned char *p;

    if (warm != 0) {
        t0 = now_ns();
        for (seq = 0; seq < warm; seq++) {
            if (opt.run == R_LATENCY)
                wait_turn(seq, 0);
            p = writer_begin();
            fill(p, seq);
            writer_send();
        }
        wait_turn(seq, 0); /* every reader has had the whole lap */
        first_lap_msgs_s = (double)warm / ((double)(now_ns() - t0) / 1e9);
    }
    t0 = tick = now_ns();
    *start = t0;
    if (opt.run == R_IDLE) {
        struct timespec ts = {(time_t)(dur / 1000000000u), (long)(dur % 1000000000u)};

        nanosleep(&ts, NULL);
    } else {
        while (now_ns() - t0 < dur || seq == warm) {
            if (opt.run == R_LATENCY) {
                /* A late message does not make the next one early: the
                 * pace is a least interval, never a burst to catch up. */
                wait_turn(seq, tick);
                tick = now_ns() > tick ? now_ns() + period : tick + period;
            }
            p = writer_begin();
            fill(p, seq);
            writer_send();
            seq++;
        }
    }
    p = writer_begin();
    memset(p, 0, opt.size);
    memset(p, 0xff, 8); /* END_SEQ */
    writer_send();
    return seq - warm;
}

/* ---- the parent: fork, gate, aggregate --------------------------------------- */

/* Print one table line and one JSON line for a finished run. */
static void report(uint64_t sent, uint64_t start)
{
    uint64_t last = start, lost = 0, total = 0, got_min = UINT64_MAX;
    double *all, secs, msgs_s, cpu = 0, cpu_max = 0;
    size_t k = 0;
    int i;

    for (i = 0; i < opt.readers; i++) {
        total += results[i].nsamples;
        lost += results[i].lost;
        if (results[i].got < got_min)
            got_min = results[i].got;
        if (results[i].last_ns > last)
            last = results[i].last_ns;
        cpu += results[i].cpu_s;
        if (results[i].cpu_s > cpu_max)
            cpu_max = results[i].cpu_s;
    }
    cpu /= opt.readers;
    all = malloc((total ? total : 1) * sizeof(*all));
    if (all == NULL)
        die("out of memory");
    for (i = 0; i < opt.readers; i++) {
        memcpy(all + k, results[i].samples, results[i].nsamples * sizeof(*all));
        k += results[i].nsamples;
    }
    qsort(all, k, sizeof(*all), cmp_double);
    /* Until the last reader had the last message: a writer that ran ahead
     * of its readers (into socket buffers) is not faster for it. */
    secs = (double)(last - start) / 1e9;
    msgs_s = secs > 0 ? (double)sent / secs : 0;
    printf("%-5s %-10s %8zu %2d %12.0f %10.2f %10.2f %10.2f %8.3f  %s\n", impl_names[opt.impl],
           run_names[opt.run], opt.size, opt.readers, msgs_s, quantile(all, k, 0.5),
           quantile(all, k, 0.99), quantile(all, k, 0.999), cpu, opt.label);
    printf("{\"mode\":\"queue\",\"impl\":\"%s\",\"run\":\"%s\",\"label\":\"%s\",\"size\":%zu,"
           "\"readers\":%d,\"msgs\":%llu,\"received_min\":%llu,\"lost\":%llu,\"seconds\":%.3f,\"msgs_per_s\":%.1f,"
           "\"gb_per_s\":%.4f,\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,"
           "\"samples\":%zu,\"period_us\":%ld,\"cpu_s_per_reader\":%.4f,\"cpu_s_max\":%.4f,"
           "\"slots\":%llu,\"zmq_hwm\":%d,\"spin_us\":%ld,\"first_lap_msgs\":%llu,"
           "\"first_lap_msgs_per_s\":%.1f}\n",
           impl_names[opt.impl], run_names[opt.run], opt.label, opt.size, opt.readers,
           (unsigned long long)sent, (unsigned long long)got_min, (unsigned long long)lost,
           secs, msgs_s,
           msgs_s * (double)opt.size / 1e9, quantile(all, k, 0.5), quantile(all, k, 0.99),
           quantile(all, k, 0.999), k, opt.run == R_LATENCY ? opt.period_us : 0L, cpu,
           cpu_max, (unsigned long long)opt.slots, opt.impl == I_ZMQ ? zmq_hwm() : 0,
           opt.impl == I_SHMB ? opt.spin_us : 0L, (unsigned long long)warm_msgs(),
           first_lap_msgs_s);
    fflush(stdout);
    free(all);
}

/* ZeroMQ: wait until every reader has the end message, or has failed or
 * exited (reaped below, with its reason), before the writer hangs up (see
 * the ZeroMQ reference's comment above). */
static void writer_wait_ended(uint64_t sent)
{
    uint64_t limit = now_ns() + (uint64_t)END_LIMIT_S * 1000000000u;
    struct timespec ts = {0, 1000000};
    int i;

    for (i = 0; i < opt.readers; i++)
        while (!atomic_load_explicit(&results[i].ended, memory_order_acquire) &&
               !results[i].failed && !reader_exited(i)) {
            if (now_ns() > limit)
                die("reader %d has not had the end message %u s after it was sent: it "
                    "received %llu of the %llu messages sent after the first lap (%llu "
                    "skipped)",
                    i, END_LIMIT_S, (unsigned long long)results[i].got,
                    (unsigned long long)sent, (unsigned long long)results[i].lost);
            nanosleep(&ts, NULL);
        }
}

/* Reap every reader within END_LIMIT_S; stop those still running then. Says
 * why each failed reader failed; returns whether any did. */
static int reap_readers(uint64_t sent, bool stop)
{
    uint64_t limit = now_ns() + (uint64_t)END_LIMIT_S * 1000000000u;
    struct timespec ts = {0, 1000000};
    char why[160];
    int i, st, failed = 0;

    for (i = 0; i < opt.readers; i++) {
        if (stop && !reader_exited(i))
            kill(pids[i], SIGTERM);
        while (!reader_exited(i) && now_ns() < limit)
            nanosleep(&ts, NULL);
        if (!reader_exited(i)) {
            fprintf(stderr, "shmb-queue-bench: %s %s: reader %d has not exited %u s after "
                    "the end message was sent: it received %llu of the %llu messages sent "
                    "after the first lap (%llu skipped), end message %s; stopped\n",
                    impl_names[opt.impl], run_names[opt.run], i, END_LIMIT_S,
                    (unsigned long long)results[i].got, (unsigned long long)sent,
                    (unsigned long long)results[i].lost,
                    atomic_load(&results[i].ended) ? "received" : "not received");
            kill(pids[i], SIGKILL);
            waitpid(pids[i], &st, 0);
            reaped[i] = true;
            reaped_status[i] = st;
            failed = 1;
            continue;
        }
        st = reaped_status[i];
        if (stop || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || results[i].failed) {
            /* A reader stopped because another failed says nothing itself. */
            if (stop && results[i].error[0] == '\0' && WIFSIGNALED(st) &&
                WTERMSIG(st) == SIGTERM)
                continue;
            fprintf(stderr, "shmb-queue-bench: %s %s: reader %d failed: %s\n",
                    impl_names[opt.impl], run_names[opt.run], i,
                    reader_reason(i, why, sizeof(why)));
            failed = 1;
        }
    }
    return failed;
}

static int run(void)
{
    size_t bytes = sizeof(struct reader_result) * (size_t)opt.readers;
    int gate[2], ready[2], i, failed = 0;
    pid_t parent = getpid();
    uint64_t sent = 0, start = 0;
    char byte;

    results = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (results == MAP_FAILED || pipe(gate) != 0 || pipe(ready) != 0) {
        perror("shmb-queue-bench: mmap/pipe");
        return 1;
    }
    /* A run that hangs ends (SIGALRM), and its readers with it, saying so. */
    snprintf(alarm_msg, sizeof(alarm_msg),
             "shmb-queue-bench: %s %s: still running after %u s (--seconds + %u), while ",
             impl_names[opt.impl], run_names[opt.run], (unsigned)opt.seconds + RUN_LIMIT_S,
             RUN_LIMIT_S);
    signal(SIGALRM, on_alarm);
    alarm((unsigned)opt.seconds + RUN_LIMIT_S);
    setup_before_fork();
    if (opt.impl == I_UNIX && (tr.buf = malloc(opt.size)) == NULL)
        die("out of memory");
    for (i = 0; i < opt.readers; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            die("fork: %s", strerror(errno));
        if (pids[i] == 0) {
            int rc;

            prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
            if (getppid() != parent)
                _exit(1);
            close(gate[1]);
            close(ready[0]);
            rc = reader_run(&results[i], i, gate[0], ready[1]);
            _exit(rc == 0 ? 0 : 1);
        }
        forked++;
    }
    close(gate[0]);
    close(ready[1]);
    if (opt.impl == I_UNIX)
        for (i = 0; i < opt.readers; i++)
            close(tr.rfds[i]);
    phase = P_ATTACH;
    writer_open();
    close(gate[1]);
    /* Every reader says ready once attached; one that failed closes its
     * end without a byte. */
    for (i = 0; i < opt.readers && read(ready[0], &byte, 1) == 1; i++)
        ;
    close(ready[0]);
    if (i < opt.readers) {
        failed = 1;
        fprintf(stderr, "shmb-queue-bench: %s %s: %d of %d readers attached\n",
                impl_names[opt.impl], run_names[opt.run], i, opt.readers);
    } else {
        writer_wait_readers();
        phase = P_SEND;
        sent = writer_run(&start);
        phase = P_CLOSE;
        if (opt.impl == I_ZMQ)
            writer_wait_ended(sent);
        writer_close();
    }
    phase = P_REAP;
    if (reap_readers(sent, failed != 0))
        failed = 1;
    if (opt.impl == I_ZMQ)
        unlink(tr.zpath + strlen("ipc://"));
    if (!failed)
        report(sent, start);
    munmap(results, bytes);
    return failed;
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: shmb-queue-bench --impl IMPL --run RUN [OPTION]...\n"
            "One writer (this process) broadcasts to --readers reader processes; prints\n"
            "one table line and one JSON line.\n\n"
            "  --impl IMPL       shmb (a queue of a running shmbrokerd, through the\n"
            "                    library), spin (a busy-polling ring of the queue's\n"
            "                    layout: no daemon, no futex), zmq (ZeroMQ PUB/SUB over\n"
            "                    ipc://), unix (a Unix stream socket per reader)\n"
            "  --run RUN         latency (one message in flight, paced: one-way\n"
            "                    p50/p99/p99.9), throughput (back to back: messages/s\n"
            "                    until the last reader has the last one), idle (readers\n"
            "                    wait --seconds for a message: their CPU seconds)\n"
            "  --socket PATH     the daemon's socket (shmb; default $SHMBROKER_SOCKET)\n"
            "  --size BYTES      message size, 17 to %u (K, M suffixes; default 64)\n"
            "  --readers N       reader processes, 1 to %u (default 1)\n"
            "  --seconds S       how long the writer sends, or waits (default 1)\n"
            "  --period-us US    latency: at most one message per US microseconds\n"
            "                    (default: 200, or size/1 KiB for bigger messages; 0:\n"
            "                    the next as soon as every reader has the last)\n"
            "  --slots N         the queue's and the ring's slots, %u to %u (default %u)\n"
            "  --spin-us US      shmb: readers spin US microseconds before they sleep\n"
            "                    (shmb_queue_set_spin; default 0: adaptive, 1 to 50 us)\n"
            "  --reader-pause-us US  readers pause US microseconds after each message\n"
            "                    they count: readers slower than the writer (default 0)\n"
            "  --label TEXT      carried into the output\n\n"
            "Queues and the ring have slots of %u bytes: every size fits a slot.\n",
            RING_SLOT_SIZE, MAX_READERS, SHMB_QUEUE_SLOTS_MIN, SHMB_QUEUE_SLOTS_MAX, RING_SLOTS,
            RING_SLOT_SIZE);
}

/* The index of arg among names[0..n), or -1 (said on stderr). */
static int lookup(const char *flag, const char *const *names, int n, const char *arg)
{
    int i;

    for (i = 0; i < n; i++)
        if (strcmp(arg, names[i]) == 0)
            return i;
    fprintf(stderr, "shmb-queue-bench: unknown %s '%s'\n", flag, arg);
    return -1;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"impl", required_argument, NULL, 'i'},
        {"run", required_argument, NULL, 'r'},
        {"socket", required_argument, NULL, 's'},
        {"size", required_argument, NULL, 'z'},
        {"readers", required_argument, NULL, 'n'},
        {"seconds", required_argument, NULL, 't'},
        {"period-us", required_argument, NULL, 'p'},
        {"slots", required_argument, NULL, 'k'},
        {"spin-us", required_argument, NULL, 'u'},
        {"reader-pause-us", required_argument, NULL, 'P'},
        {"label", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch, k;

    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'i':
            if ((k = lookup("--impl", impl_names, 4, optarg)) < 0)
                return 2;
            opt.impl = (enum impl)k;
            break;
        case 'r':
            if ((k = lookup("--run", run_names, 3, optarg)) < 0)
                return 2;
            opt.run = (enum run)k;
            break;
        case 's': opt.socket = optarg; break;
        case 'z':
            if (parse_size(optarg, &opt.size) != 0) {
                fprintf(stderr, "shmb-queue-bench: bad --size '%s'\n", optarg);
                return 2;
            }
            break;
        case 'n': opt.readers = atoi(optarg); break;
        case 't': opt.seconds = atof(optarg); break;
        case 'p': opt.period_us = atol(optarg); break;
        case 'k': opt.slots = strtoull(optarg, NULL, 10); break;
        case 'u': opt.spin_us = atol(optarg); break;
        case 'P': opt.pause_us = atol(optarg); break;
        case 'l': opt.label = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (opt.readers < 1 || opt.readers > (int)MAX_READERS || opt.seconds <= 0 ||
        opt.seconds > 3600 || opt.size <= MSG_HEADER || opt.size > RING_SLOT_SIZE ||
        opt.period_us < -1 || opt.spin_us < 0 || opt.spin_us > 100000 ||
        opt.pause_us < 0 || opt.pause_us > 1000000 ||
        opt.slots < SHMB_QUEUE_SLOTS_MIN ||
        opt.slots > SHMB_QUEUE_SLOTS_MAX) {
        fprintf(stderr, "shmb-queue-bench: --readers 1..%u, --seconds 0..3600, --size "
                "%u..%u, --period-us >= 0, --spin-us 0..100000, --reader-pause-us "
                "0..1000000, --slots %u..%u\n", MAX_READERS,
                MSG_HEADER + 1,
                RING_SLOT_SIZE, SHMB_QUEUE_SLOTS_MIN, SHMB_QUEUE_SLOTS_MAX);
        return 2;
    }
    if (opt.period_us < 0)
        opt.period_us = opt.size / 1024 > 200 ? (long)(opt.size / 1024) : 200;
    if (opt.socket == NULL)
        opt.socket = getenv("SHMBROKER_SOCKET");
    if (opt.impl == I_SHMB && opt.socket == NULL) {
        fprintf(stderr, "shmb-queue-bench: --socket (or $SHMBROKER_SOCKET) is needed\n");
        return 2;
    }
    /* The pace's sleeps end when asked, not up to 50 us later. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    return run();
}
