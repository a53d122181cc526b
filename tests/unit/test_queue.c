// SPDX-License-Identifier: Apache-2.0
/*
 * The broadcast queue's data path (proto/queue.c) over a memfd, without a
 * daemon: the layout and its checks, one writer and four reader processes
 * moving 10,000 messages, timeouts, shutdown, a dead seat, the writer's end,
 * an idle reader's CPU, and a hostile area. The daemon's part is played by
 * the parent calling shmb_q_seat_take and the like.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../proto/queue.h"

/* A mapped, formatted queue; children of fork() share the mapping. */
struct area {
    void *base;
    size_t size;
    size_t mapped; /* size rounded up to whole pages */
    struct shmb_q q;
};

static void area_new(struct area *a, uint32_t seats, uint64_t slots, uint64_t slot_size)
{
    struct shmb_error err;
    int fd = memfd_create("queue", MFD_CLOEXEC);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *guard;

    assert_true(fd >= 0);
    a->size = shmb_q_size(seats, slots, slot_size);
    assert_true(a->size > 0);
    /* An inaccessible page after the area: a write past it faults. In
     * pages of this machine (64 KiB on many aarch64 kernels): a mapping
     * covers whole pages, so a guard of 4 KiB pages would lie inside it.
     * The file fills the pages it is mapped in (qemu-user refuses a fixed
     * shared mapping that ends inside a page past the end of its file). */
    a->mapped = (a->size + page - 1) / page * page;
    assert_int_equal(ftruncate(fd, (off_t)a->mapped), 0);
    guard = mmap(NULL, a->mapped + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(guard != MAP_FAILED);
    a->base = mmap(guard, a->mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    assert_true(a->base == guard);
    close(fd);
    assert_int_equal(shmb_q_format(a->base, a->size, "test", seats, slots, slot_size, &err), 0);
    assert_int_equal(shmb_q_attach(&a->q, a->base, a->size, &err), 0);
}

static void area_free(struct area *a)
{
    munmap(a->base, a->mapped + (size_t)sysconf(_SC_PAGESIZE));
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The exit status of child pid; a child still running after seconds is hung
 * (a lost wake-up): it is killed and the test fails. */
static int wait_child(pid_t pid, int seconds)
{
    int64_t deadline = now_ms() + seconds * 1000;
    int status;

    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("child %d still running after %d s: it was never woken", (int)pid,
                     seconds);
        }
        usleep(1000);
    }
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* Wait (up to 10 s) until *word, read atomically, is at least want. */
static void wait_word(_Atomic uint32_t *word, uint32_t want)
{
    int64_t deadline = now_ms() + 10000;

    while (atomic_load(word) < want) {
        assert_true(now_ms() < deadline);
        usleep(1000);
    }
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    return x ^ (x >> 33);
}

/* Message i's length (8..max) and bytes: both sides compute them from i, so
 * a reader checks every byte without a copy of what was sent. */
static size_t msg_len(uint64_t i, size_t max)
{
    return 8 + (size_t)(mix(i) % (max - 7));
}

static void msg_fill(unsigned char *p, uint64_t i, size_t len)
{
    size_t j;

    memcpy(p, &i, 8);
    for (j = 8; j < len; j++)
        p[j] = (unsigned char)(mix(i) >> (j % 8 * 8)) ^ (unsigned char)j;
}

static int msg_check(const unsigned char *p, uint64_t i, size_t len, size_t max)
{
    uint64_t got;
    size_t j;

    if (len != msg_len(i, max))
        return 0;
    memcpy(&got, p, 8);
    if (got != i)
        return 0;
    for (j = 8; j < len; j++)
        if (p[j] != ((unsigned char)(mix(i) >> (j % 8 * 8)) ^ (unsigned char)j))
            return 0;
    return 1;
}

/* A child's end: 0 when rc is want, else 1 with the message on stderr. */
static void child_exit(int rc, int want, const struct shmb_error *err, const char *what)
{
    if (rc != want) {
        fprintf(stderr, "%s: %d (%s), expected %d\n", what, rc, err->message, want);
        _exit(1);
    }
    _exit(0);
}

/* The geometry's figures, format's refusals, and attach refusing every
 * header a scribbler could leave. */
static void test_format_attach(void **state)
{
    static unsigned char buf[8192 + 4 * 128] __attribute__((aligned(64)));
    struct shmb_queue_header *h = (struct shmb_queue_header *)buf;
    struct shmb_error err;
    struct shmb_q q;
    size_t size = shmb_q_size(2, 4, 64);

    (void)state;
    assert_int_equal(size, 8192 + 4 * 128);
    assert_int_equal(shmb_q_size(64, 2, 65), 8192 + 2 * 192);
    assert_int_equal(shmb_q_size(0, 4, 64), 0);
    assert_int_equal(shmb_q_size(65, 4, 64), 0);
    assert_int_equal(shmb_q_size(1, 1, 64), 0);
    assert_int_equal(shmb_q_size(1, 65537, 64), 0);
    assert_int_equal(shmb_q_size(1, 4, 63), 0);
    assert_int_equal(shmb_q_size(1, 4, SHMB_QUEUE_SLOT_SIZE_MAX + 1), 0);

    assert_int_equal(shmb_q_format(buf, size, "q", 0, 4, 64, &err), -EINVAL);
    assert_non_null(strstr(err.message, "1 to 64 reader seats"));
    assert_int_equal(shmb_q_format(buf, size, "q", 2, 1, 64, &err), -EINVAL);
    assert_int_equal(shmb_q_format(buf, size - 1, "q", 2, 4, 64, &err), -EINVAL);
    assert_int_equal(shmb_q_format(buf, size, "a-name-that-is-far-too-long-for-the-header-"
                                              "of-a-queue-of-64-bytes",
                                   2, 4, 64, &err),
                     -ENAMETOOLONG);

    assert_int_equal(shmb_q_format(buf, size, "q", 2, 4, 64, &err), 0);
    assert_int_equal(shmb_q_attach(&q, buf, size, &err), 0);
    assert_int_equal(q.seats, 2);
    assert_int_equal(q.slots, 4);
    assert_int_equal(q.slot_stride, 128);
    assert_int_equal(q.slots_offset, 8192);
    assert_string_equal(h->name, "q");
    assert_int_equal(shmb_q_attach(&q, buf, size - 1, &err), -EIO);
    assert_int_equal(shmb_q_attach(&q, buf, 100, &err), -EINVAL);

    /* Each field scribbled in turn: refused, then restored. */
#define SCRIBBLE(field, value)                                                           \
    do {                                                                                 \
        __typeof__(h->field) saved = h->field;                                           \
        h->field = (value);                                                              \
        assert_int_equal(shmb_q_attach(&q, buf, size, &err), -EIO);                      \
        h->field = saved;                                                                \
        assert_int_equal(shmb_q_attach(&q, buf, size, &err), 0);                         \
    } while (0)
    SCRIBBLE(magic, 1);
    SCRIBBLE(version, 2);
    SCRIBBLE(seats, 0);
    SCRIBBLE(seats, 65);
    SCRIBBLE(slots, 5);
    SCRIBBLE(slots, UINT64_MAX);
    SCRIBBLE(slot_size, 128);
    SCRIBBLE(slot_size, UINT64_MAX);
    SCRIBBLE(slot_stride, 64);
    SCRIBBLE(slots_offset, 4096);
    SCRIBBLE(total_size, 1);
#undef SCRIBBLE
    memset(h->name, 'x', sizeof(h->name));
    assert_int_equal(shmb_q_attach(&q, buf, size, &err), -EIO);
    assert_non_null(strstr(err.message, "name"));
}

/* One process, one seat: zero-copy and copying writes, reads in place,
 * done, the full ring, sizes, misuse, objects, and the seat's statistics. */
static void test_single(void **state)
{
    struct area a;
    struct shmb_error err;
    struct shmb_q_stats st;
    const void *data;
    size_t len;
    void *buf;

    (void)state;
    area_new(&a, 1, 2, 64);
    /* A FREE seat is nobody's: its reads are refused. */
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -ENOTCONN);
    shmb_q_seat_take(&a.q, 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 1, &data, &len, 0, &err), -EINVAL);

    assert_int_equal(shmb_q_publish(&a.q, 1, &err), -EINVAL);
    assert_int_equal(shmb_q_reserve(&a.q, 65, &buf, 0, &err), -EMSGSIZE);
    assert_int_equal(shmb_q_reserve(&a.q, 5, &buf, 0, &err), 0);
    assert_true((unsigned char *)buf >= (unsigned char *)a.base + a.q.slots_offset);
    memcpy(buf, "hello", 5);
    assert_int_equal(shmb_q_publish(&a.q, 65, &err), -EMSGSIZE);
    assert_int_equal(shmb_q_publish(&a.q, 5, &err), 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "world!", 6, 0, &err), 0);
    /* Two slots, both unread: the writer must wait. */
    assert_int_equal(shmb_q_enqueue(&a.q, "x", 1, 0, &err), -ETIMEDOUT);
    assert_int_equal(shmb_q_enqueue(&a.q, "x", 1, 30, &err), -ETIMEDOUT);
    assert_non_null(strstr(err.message, "seat 0 has not read message 0"));
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.head, 2);
    assert_int_equal(st.depth, 2);
    assert_int_equal(st.blocker, 0);
    assert_int_equal(st.live, 1);

    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(data, "hello", 5);
    assert_int_equal(a.q.msg_flags, SHMB_QUEUE_INLINE);
    /* Held, not done: its slot is still not free. */
    assert_int_equal(shmb_q_enqueue(&a.q, "x", 1, 0, &err), -ETIMEDOUT);
    shmb_q_done(&a.q, 0);
    shmb_q_done(&a.q, 0); /* a second done is nothing */
    assert_int_equal(shmb_q_enqueue(&a.q, "third", 5, 0, &err), 0);
    /* A dequeue marks the held message done first. */
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "world!", 6);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "third", 5);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.depth, 1);
    shmb_q_done(&a.q, 0);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.depth, 0);
    assert_int_equal(st.blocker, -1);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -ETIMEDOUT);

    /* A message by reference: the key in the slot, the size beside it. */
    assert_int_equal(shmb_q_reserve(&a.q, 3, &buf, 0, &err), 0);
    memcpy(buf, "key", 3);
    assert_int_equal(shmb_q_publish_object(&a.q, 3, 1 << 20, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_int_equal(a.q.msg_flags, SHMB_QUEUE_OBJECT);
    assert_int_equal(a.q.msg_aux, 1 << 20);
    assert_memory_equal(data, "key", 3);
    area_free(&a);
}

/* A seat taken starts at the next message; one dropped or taken again is
 * no longer its old holder's; a free or dead seat is not waited for. */
static void test_seats(void **state)
{
    struct area a;
    struct shmb_error err;
    struct shmb_q r1;
    const void *data;
    size_t len;
    uint64_t i;

    (void)state;
    area_new(&a, 2, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    for (i = 0; i < 3; i++) {
        assert_int_equal(shmb_q_enqueue(&a.q, &i, 8, 0, &err), 0);
        assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
        assert_memory_equal(data, &i, 8);
    }
    shmb_q_done(&a.q, 0);
    /* Seat 1 was FREE: never waited for. Taken now, it reads message 3. */
    assert_int_equal(shmb_q_attach(&r1, a.base, a.size, &err), 0);
    shmb_q_seat_take(&a.q, 1);
    assert_int_equal(shmb_q_dequeue(&r1, 1, &data, &len, 0, &err), -ETIMEDOUT);
    assert_int_equal(shmb_q_enqueue(&a.q, &i, 8, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&r1, 1, &data, &len, 0, &err), 0);
    assert_memory_equal(data, &i, 8);
    shmb_q_done(&r1, 1);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    shmb_q_done(&a.q, 0);

    /* Dropped as dead while unread messages fill the ring: the writer goes on. */
    for (i = 4; i < 6; i++)
        assert_int_equal(shmb_q_enqueue(&a.q, &i, 8, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    shmb_q_done(&a.q, 0);
    assert_int_equal(shmb_q_enqueue(&a.q, &i, 8, 0, &err), -ETIMEDOUT);
    shmb_q_seat_drop(&a.q, 1, true);
    assert_int_equal(shmb_q_enqueue(&a.q, &i, 8, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&r1, 1, &data, &len, 0, &err), -ENOTCONN);
    /* Taken again (by another process): the old holder stays out. */
    shmb_q_seat_take(&a.q, 1);
    assert_int_equal(shmb_q_dequeue(&r1, 1, &data, &len, 0, &err), -ENOTCONN);
    assert_non_null(strstr(err.message, "seat 1"));
    area_free(&a);
}

/* The writer's side of the broadcast: message i, zero-copy for even i. */
static void broadcast_writer(struct shmb_q *q, uint64_t count, size_t max)
{
    struct shmb_error err;
    void *buf;
    uint64_t i;
    int rc;

    for (i = 0; i < count; i++) {
        size_t len = msg_len(i, max);

        if (mix(i ^ 0x5555) % 64 == 0)
            usleep((useconds_t)(mix(i) % 300));
        if (i % 2 == 0) {
            if ((rc = shmb_q_reserve(q, len, &buf, 10000, &err)) != 0)
                child_exit(rc, 0, &err, "reserve");
            msg_fill(buf, i, len);
            if ((rc = shmb_q_publish(q, len, &err)) != 0)
                child_exit(rc, 0, &err, "publish");
        } else {
            unsigned char tmp[1024];

            msg_fill(tmp, i, len);
            if ((rc = shmb_q_enqueue(q, tmp, len, 10000, &err)) != 0)
                child_exit(rc, 0, &err, "enqueue");
        }
    }
    _exit(0);
}

static void broadcast_reader(struct shmb_q *q, uint32_t seat, uint64_t count, size_t max)
{
    struct shmb_error err;
    const void *data;
    size_t len;
    uint64_t i;
    int rc;

    for (i = 0; i < count; i++) {
        if ((rc = shmb_q_dequeue(q, seat, &data, &len, 10000, &err)) != 0)
            child_exit(rc, 0, &err, "dequeue");
        if (!msg_check(data, i, len, max)) {
            fprintf(stderr, "seat %u: message %llu differs\n", seat, (unsigned long long)i);
            _exit(1);
        }
        if (mix(i ^ (seat + 1) * 0x9e3779b9) % 64 == 0)
            usleep((useconds_t)(mix(i + seat) % 300));
        shmb_q_done(q, seat);
    }
    _exit(0);
}

/* One writer and four reader processes, 10,000 messages of random sizes up
 * to the slot size through 8 slots, random short sleeps on both sides: every
 * reader gets every message, in order, byte-identical. */
static void test_broadcast(void **state)
{
    enum { READERS = 4, COUNT = 10000, MAX = 1024 };
    struct area a;
    struct shmb_q_stats st;
    pid_t pids[READERS + 1];
    uint32_t s;

    (void)state;
    area_new(&a, READERS, 8, MAX);
    for (s = 0; s < READERS; s++)
        shmb_q_seat_take(&a.q, s);
    for (s = 0; s < READERS; s++) {
        pids[s] = fork();
        assert_true(pids[s] >= 0);
        if (pids[s] == 0)
            broadcast_reader(&a.q, s, COUNT, MAX);
    }
    pids[READERS] = fork();
    assert_true(pids[READERS] >= 0);
    if (pids[READERS] == 0)
        broadcast_writer(&a.q, COUNT, MAX);
    for (s = 0; s <= READERS; s++)
        assert_int_equal(wait_child(pids[s], 60), 0);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.head, COUNT);
    assert_int_equal(st.depth, 0);
    area_free(&a);
}

struct reader_thread {
    struct shmb_q q; /* a view of its own, as another process would have */
    uint32_t seat;
    uint64_t count;
    int bad;
};

static void *reader_thread(void *arg)
{
    struct reader_thread *r = arg;
    struct shmb_error err;
    const void *data;
    size_t len;
    uint64_t i;

    for (i = 0; i < r->count; i++) {
        if (shmb_q_dequeue(&r->q, r->seat, &data, &len, 10000, &err) != 0 ||
            !msg_check(data, i, len, 256)) {
            r->bad = 1;
            break;
        }
        shmb_q_done(&r->q, r->seat);
    }
    return NULL;
}

/* The same broadcast between threads of one process, so that a thread
 * sanitizer build sees every access: a slot published without release
 * ordering, or reused before a reader's release, is a data race there. */
static void test_threads(void **state)
{
    enum { READERS = 2, COUNT = 3000 };
    struct reader_thread r[READERS];
    pthread_t tid[READERS];
    struct shmb_error err;
    struct area a;
    unsigned char tmp[256];
    uint64_t i;
    uint32_t s;

    (void)state;
    area_new(&a, READERS, 4, 256);
    for (s = 0; s < READERS; s++) {
        shmb_q_seat_take(&a.q, s);
        assert_int_equal(shmb_q_attach(&r[s].q, a.base, a.size, &err), 0);
        r[s].seat = s;
        r[s].count = COUNT;
        r[s].bad = 0;
        assert_int_equal(pthread_create(&tid[s], NULL, reader_thread, &r[s]), 0);
    }
    for (i = 0; i < COUNT; i++) {
        size_t len = msg_len(i, 256);

        msg_fill(tmp, i, len);
        assert_int_equal(shmb_q_enqueue(&a.q, tmp, len, 10000, &err), 0);
    }
    for (s = 0; s < READERS; s++) {
        assert_int_equal(pthread_join(tid[s], NULL), 0);
        assert_int_equal(r[s].bad, 0);
    }
    area_free(&a);
}

/* A dequeue on an empty queue returns -ETIMEDOUT once its timeout is over. */
static void test_dequeue_timeout(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    int64_t t0;

    (void)state;
    area_new(&a, 1, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    t0 = now_ms();
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 100, &err), -ETIMEDOUT);
    assert_true(now_ms() - t0 >= 100);
    assert_non_null(strstr(err.message, "100 ms"));
    assert_int_equal(atomic_load(&a.q.hdr->readers_waiting), 0);
    assert_int_equal(atomic_load(&a.q.seat[0].waiting), 0);
    area_free(&a);
}

/* Shutdown wakes a reader blocked on an empty queue and a writer blocked on
 * a full one; both get -ECANCELED, and later calls too. */
static void test_shutdown(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    pid_t reader, writer;
    int rc;

    (void)state;
    area_new(&a, 2, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    shmb_q_seat_take(&a.q, 1); /* never reads: the ring fills */
    assert_int_equal(shmb_q_enqueue(&a.q, "a", 1, 0, &err), 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "b", 1, 0, &err), 0);
    reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err);
        shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err);
        rc = shmb_q_dequeue(&a.q, 0, &data, &len, -1, &err);
        child_exit(rc, -ECANCELED, &err, "blocked dequeue");
    }
    writer = fork();
    assert_true(writer >= 0);
    if (writer == 0) {
        rc = shmb_q_enqueue(&a.q, "c", 1, -1, &err);
        child_exit(rc, -ECANCELED, &err, "blocked enqueue");
    }
    wait_word(&a.q.hdr->readers_waiting, 1);
    wait_word(&a.q.hdr->writer_waiting, 1);
    shmb_q_shutdown(&a.q);
    assert_int_equal(wait_child(reader, 5), 0);
    assert_int_equal(wait_child(writer, 5), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 1, &data, &len, -1, &err), -ECANCELED);
    assert_string_equal(err.message, "cancelled: the queue was shut down.");
    assert_int_equal(shmb_q_enqueue(&a.q, "c", 1, -1, &err), -ECANCELED);
    area_free(&a);
}

/* A reader that stops reading holds the writer back and is named as the
 * blocker; dropped as dead, the writer goes on at once and the other reader
 * gets every message. */
static void test_dead_seat(void **state)
{
    enum { COUNT = 20 };
    struct area a;
    struct shmb_error err;
    struct shmb_q_stats st;
    pid_t reader, writer;
    uint64_t i;

    (void)state;
    area_new(&a, 2, 4, 64);
    shmb_q_seat_take(&a.q, 0);
    shmb_q_seat_take(&a.q, 1); /* its reader is stuck (or died) */
    reader = fork();
    assert_true(reader >= 0);
    if (reader == 0)
        broadcast_reader(&a.q, 0, COUNT, 64);
    writer = fork();
    assert_true(writer >= 0);
    if (writer == 0) {
        for (i = 0; i < COUNT; i++) {
            unsigned char tmp[64];
            size_t len = msg_len(i, 64);
            int rc;

            msg_fill(tmp, i, len);
            if ((rc = shmb_q_enqueue(&a.q, tmp, len, 10000, &err)) != 0)
                child_exit(rc, 0, &err, "enqueue");
        }
        _exit(0);
    }
    wait_word(&a.q.hdr->writer_waiting, 1);
    /* Once seat 0 has read all four, only seat 1 holds the writer back. */
    while (atomic_load(&a.q.seat[0].next) < 4)
        usleep(1000);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.head, 4);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.blocker, 1);
    assert_int_equal(st.writer_waiting, 1);
    shmb_q_seat_drop(&a.q, 1, true);
    assert_int_equal(wait_child(writer, 5), 0);
    assert_int_equal(wait_child(reader, 5), 0);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.head, COUNT);
    assert_int_equal(st.live, 1);
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.depth, 0);
    area_free(&a);
}

/* Review: a reader that lost its seat (dropped and given to another) and
 * then finishes with the message it held must not rewind the new reader:
 * the new one reads on from where it is, no message twice. */
static void test_stale_done(void **state)
{
    struct area a;
    struct shmb_q b; /* the new reader's own handle of the same area */
    struct shmb_error err;
    const void *data;
    size_t len;
    int i;

    (void)state;
    area_new(&a, 1, 8, 64);
    assert_int_equal(shmb_q_attach(&b, a.base, a.size, &err), 0);
    shmb_q_seat_take(&a.q, 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "m0", 3, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0); /* held */
    shmb_q_seat_drop(&a.q, 0, true);
    shmb_q_seat_take(&a.q, 0); /* the new reader's, from message 1 */
    for (i = 1; i <= 4; i++) {
        char m[3] = {'m', (char)('0' + i), 0};

        assert_int_equal(shmb_q_enqueue(&a.q, m, 3, 0, &err), 0);
    }
    assert_int_equal(shmb_q_dequeue(&b, 0, &data, &len, 0, &err), 0);
    assert_string_equal(data, "m1");
    assert_int_equal(shmb_q_dequeue(&b, 0, &data, &len, 0, &err), 0);
    assert_string_equal(data, "m2");
    shmb_q_done(&b, 0);
    /* The old reader's next call: its seat is gone, and its late "done"
     * changes nothing. */
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -ENOTCONN);
    assert_int_equal(atomic_load(&a.q.seat[0].next), 3);
    assert_int_equal(shmb_q_dequeue(&b, 0, &data, &len, 0, &err), 0);
    assert_string_equal(data, "m3");
    area_free(&a);
}

/* Review: dropping the seat of a sleeping reader wakes it (-ENOTCONN) and
 * takes it off the count exactly once, so that another sleeping reader is
 * still woken by the next message; a writer blocked when the writer is
 * declared gone is woken with -EPIPE. */
static void test_drop_and_gone_wake(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    pid_t r0, r1, w;
    int rc;

    (void)state;
    area_new(&a, 2, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    shmb_q_seat_take(&a.q, 1);
    r0 = fork();
    assert_true(r0 >= 0);
    if (r0 == 0) {
        rc = shmb_q_dequeue(&a.q, 0, &data, &len, -1, &err);
        child_exit(rc, -ENOTCONN, &err, "dequeue on a dropped seat");
    }
    wait_word(&a.q.hdr->readers_waiting, 1);
    r1 = fork();
    assert_true(r1 >= 0);
    if (r1 == 0) {
        rc = shmb_q_dequeue(&a.q, 1, &data, &len, -1, &err);
        child_exit(rc, 0, &err, "dequeue after another seat's drop");
    }
    wait_word(&a.q.hdr->readers_waiting, 2);
    shmb_q_seat_drop(&a.q, 0, false);
    assert_int_equal(wait_child(r0, 5), 0);
    assert_int_equal(atomic_load(&a.q.hdr->readers_waiting), 1);
    assert_int_equal(shmb_q_enqueue(&a.q, "go", 3, 0, &err), 0);
    assert_int_equal(wait_child(r1, 5), 0);
    assert_int_equal(atomic_load(&a.q.hdr->readers_waiting), 0);

    /* Seat 1 has read "go" but not said done: fill the other slot, then a
     * writer blocks on the full ring until the writer is declared gone. */
    assert_int_equal(shmb_q_enqueue(&a.q, "x", 1, 0, &err), 0);
    w = fork();
    assert_true(w >= 0);
    if (w == 0) {
        rc = shmb_q_enqueue(&a.q, "y", 1, -1, &err);
        child_exit(rc, -EPIPE, &err, "blocked enqueue");
    }
    wait_word(&a.q.hdr->writer_waiting, 1);
    shmb_q_writer_gone(&a.q);
    assert_int_equal(wait_child(w, 5), 0);
    area_free(&a);
}

/* The writer gone: a reader first gets every message published, then
 * -EPIPE; a reader asleep on an empty queue is woken with -EPIPE. */
static void test_writer_gone(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    pid_t reader;
    int i, rc;

    (void)state;
    area_new(&a, 2, 4, 64);
    shmb_q_seat_take(&a.q, 0);
    shmb_q_seat_take(&a.q, 1);
    reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        for (i = 0; (rc = shmb_q_dequeue(&a.q, 1, &data, &len, 10000, &err)) == 0; i++)
            ;
        child_exit(i == 3 ? rc : 0, -EPIPE, &err, "the fourth dequeue");
    }
    wait_word(&a.q.hdr->readers_waiting, 1);
    assert_int_equal(shmb_q_enqueue(&a.q, "one", 3, 0, &err), 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "two", 3, 0, &err), 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "six", 3, 0, &err), 0);
    atomic_store(&a.q.hdr->writer_waiting, 1); /* as a writer killed asleep leaves it */
    shmb_q_writer_gone(&a.q);
    assert_int_equal(atomic_load(&a.q.hdr->writer_waiting), 0);
    for (i = 0; i < 3; i++)
        assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 1000, &err), 0);
    assert_memory_equal(data, "six", 3);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 1000, &err), -EPIPE);
    assert_non_null(strstr(err.message, "End of queue"));
    assert_int_equal(shmb_q_enqueue(&a.q, "x", 1, 0, &err), -EPIPE);
    /* The child, asleep when the messages came, reads all three, then
     * gets -EPIPE. */
    assert_int_equal(wait_child(reader, 15), 0);
    area_free(&a);
}

/* A writer whose role was taken by another (its connection closed, the
 * daemon gave the queue a new writer epoch) can neither reserve nor publish
 * a slot it reserved before; the new writer goes on from head. */
static void test_writer_replaced(void **state)
{
    struct area a;
    struct shmb_q old, new;
    struct shmb_error err;
    const void *data;
    size_t len;
    void *buf;

    (void)state;
    area_new(&a, 1, 4, 64);
    shmb_q_seat_take(&a.q, 0);
    shmb_q_writer_take(&a.q, 1);
    assert_int_equal(shmb_q_attach(&old, a.base, a.size, &err), 0);
    old.writer_epoch = 1;
    assert_int_equal(shmb_q_enqueue(&old, "one", 3, 0, &err), 0);
    assert_int_equal(shmb_q_reserve(&old, 3, &buf, 0, &err), 0);
    memcpy(buf, "two", 3);
    shmb_q_writer_gone(&a.q);
    shmb_q_writer_take(&a.q, 2);
    assert_int_equal(shmb_q_publish(&old, 3, &err), -ENOTCONN);
    assert_non_null(strstr(err.message, "no longer the queue's writer"));
    assert_int_equal(shmb_q_enqueue(&old, "two", 3, 0, &err), -ENOTCONN);
    assert_int_equal(shmb_q_attach(&new, a.base, a.size, &err), 0);
    new.writer_epoch = 2;
    assert_int_equal(shmb_q_enqueue(&new, "new", 3, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "one", 3);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "new", 3);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -ETIMEDOUT);
    area_free(&a);
}

/* A blocked reader woken by the writer's end, with nothing to drain. */
static void test_writer_gone_wakes(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    pid_t reader;
    int rc;

    (void)state;
    area_new(&a, 1, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    reader = fork();
    assert_true(reader >= 0);
    if (reader == 0) {
        rc = shmb_q_dequeue(&a.q, 0, &data, &len, -1, &err);
        child_exit(rc, -EPIPE, &err, "blocked dequeue");
    }
    wait_word(&a.q.hdr->readers_waiting, 1);
    shmb_q_writer_gone(&a.q);
    assert_int_equal(wait_child(reader, 5), 0);
    area_free(&a);
}

static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* A reader waiting 1 s for a message sleeps: its CPU time is a small part of
 * the wall time (a spinning reader uses all of it). */
static void test_idle_cpu(void **state)
{
    struct area a;
    struct shmb_error err;
    const void *data;
    size_t len;
    double cpu;
    int64_t t0, wall;

    (void)state;
    area_new(&a, 1, 2, 64);
    shmb_q_seat_take(&a.q, 0);
    t0 = now_ms();
    cpu = cpu_seconds();
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 1000, &err), -ETIMEDOUT);
    cpu = cpu_seconds() - cpu;
    wall = now_ms() - t0;
    printf("idle reader: %.3f ms of CPU over %lld ms of waiting\n", cpu * 1000,
           (long long)wall);
    assert_true(cpu * 1000 < wall / 2.0);
    area_free(&a);
}

/* A hostile member rewrites the slots, head and the seats: the reader gets
 * -EIO, never a pointer or length outside its slot; the writer is not held
 * by a next from the future. */
static void test_hostile(void **state)
{
    struct area a;
    struct shmb_error err;
    struct shmb_queue_slot *slot;
    struct shmb_q_stats st;
    const void *data;
    size_t len;

    (void)state;
    /* Slots of a page each: a slot index past the ring is past the mapping. */
    area_new(&a, 2, 2, 4096 - SHMB_QUEUE_SLOT_HEADER);
    assert_int_equal(a.size % 4096, 0);
    shmb_q_seat_take(&a.q, 0);
    slot = (struct shmb_queue_slot *)((unsigned char *)a.base + a.q.slots_offset);
    assert_int_equal(shmb_q_enqueue(&a.q, "m0", 2, 0, &err), 0);
    slot->len = 1u << 31;
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -EIO);
    slot->len = 2;
    slot->seq = 7;
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -EIO);
    assert_non_null(strstr(err.message, "corrupt"));
    slot->seq = 0;
    slot->flags = 9;
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -EIO);
    slot->flags = SHMB_QUEUE_INLINE;
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "m0", 2);
    shmb_q_done(&a.q, 0);

    /* head far ahead: the slot it points to does not hold that message. */
    atomic_store(&a.q.hdr->head, UINT64_MAX);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -EIO);
    atomic_store(&a.q.hdr->head, 1);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.depth, 0);
    /* The geometry in the header changes after attach: the private copy
     * rules, so the slot indexes stay inside the area. */
    a.q.hdr->slots = 1u << 30;
    a.q.hdr->seats = 64;
    assert_int_equal(shmb_q_enqueue(&a.q, "m1", 2, 0, &err), 0);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), 0);
    assert_memory_equal(data, "m1", 2);
    /* A seat whose next is in the future does not hold the writer back. */
    atomic_store(&a.q.seat[0].next, UINT64_MAX);
    assert_int_equal(shmb_q_enqueue(&a.q, "m2", 2, 0, &err), 0);
    assert_int_equal(shmb_q_enqueue(&a.q, "m3", 2, 0, &err), 0);
    shmb_q_stats(&a.q, &st);
    assert_int_equal(st.depth, 0);
    /* An unknown state is refused on both sides. */
    atomic_store(&a.q.hdr->state, 77);
    assert_int_equal(shmb_q_enqueue(&a.q, "m4", 2, 0, &err), -EIO);
    assert_int_equal(shmb_q_dequeue(&a.q, 0, &data, &len, 0, &err), -EIO);
    area_free(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_attach),  cmocka_unit_test(test_single),
        cmocka_unit_test(test_seats),          cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_dequeue_timeout), cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_dead_seat),      cmocka_unit_test(test_writer_gone),
        cmocka_unit_test(test_writer_replaced),
        cmocka_unit_test(test_writer_gone_wakes), cmocka_unit_test(test_idle_cpu),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_stale_done),     cmocka_unit_test(test_drop_and_gone_wake),
    };

    return cmocka_run_group_tests_name("queue", tests, NULL, NULL);
}
