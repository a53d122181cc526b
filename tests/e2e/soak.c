// SPDX-License-Identifier: Apache-2.0
/*
 * The soak: 32 client processes put, get, release and delete at random
 * against one real shmbrokerd for SOAK_SECONDS, checking every byte they read
 * through the zero-copy pointers, while the test SIGKILLs one of them every
 * few hundred milliseconds (pins and pending allocations held) and starts it
 * again. Afterwards deleting everything must leave an empty segment, the
 * daemon's own memory must not have grown after warm-up, and it must exit 0
 * on SIGTERM: under AddressSanitizer a leak makes that status non-zero, and
 * with SOAK_VALGRIND=1 the daemon runs under memcheck, whose errors give 99.
 * Meanwhile a broadcast queue runs beside them: one writer, three readers
 * that must get every message in order, and a fourth that is SIGKILLed now
 * and then (holding an overflow object's pin, maybe) and takes its dead
 * seat again; messages longer than a slot go as objects of the same busy
 * segment. Workers never use cmocka: they report in a shared page and by
 * exit status.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "shmbroker.h"

#define SOAK_WORKERS 32
/* The queue's processes come after the workers in every array: its writer,
 * SOAK_QUEUE_READERS readers that read everything, and one reader that is
 * killed and started again (the last). */
#define SOAK_QUEUE_READERS 3
#define SOAK_QUEUE_WRITER SOAK_WORKERS
#define SOAK_QUEUE_CHURN (SOAK_WORKERS + 1 + SOAK_QUEUE_READERS)
#define SOAK_PROCS (SOAK_QUEUE_CHURN + 1)
#define SOAK_QUEUE "soakq"
#define SOAK_QUEUE_SLOTS 8
#define SOAK_QUEUE_SLOT 4096
/* A message carries its sequence number in its first 8 bytes. */
#define SOAK_QUEUE_MSG_MIN 8
#define SOAK_SIZE "64M"
#define SOAK_MAX_OBJECT (2u << 20) /* --max-object-size 2M */
/* 192 keys every worker writes, reads and deletes, plus 8 of each worker's
 * own (which others read and delete too): with objects of 130 KiB on average
 * the live set is about the segment's size, so eviction and ENOSPC happen. */
#define SOAK_SHARED_KEYS 192
#define SOAK_OWN_KEYS 8
/* What one worker may hold at once, so that a kill usually finds some. */
#define SOAK_HELD_PINS 6
#define SOAK_HELD_PENDING 3
/* One kill every 150..450 ms, 300 ms on average, as issue 4 asks. */
#define SOAK_KILL_MIN_MS 150
#define SOAK_KILL_SPAN_MS 300
/* Warm-up lasts a third of the run, and until the clients have made 10000
 * operations: the heap, libuv's buffers and the index reach their working
 * size, and under ASan the daemon has freed some 40 MiB, ten times its
 * quarantine (below). On a loaded machine the second condition is the one
 * that counts. After warm-up the daemon's memory must be flat. */
#define SOAK_WARMUP_DIVISOR 3
#define SOAK_WARMUP_OPS 10000
/* The RSS a leak-free daemon may still gain after warm-up. Measured: 0 KiB in
 * the plain and UBSan builds (2.5 and 4 MiB own RSS, the same at warm-up and
 * at the end of 8 s), 0.1 to 0.4 MiB under ASan with the quarantine below
 * (20 MiB own RSS; allocator caches settling). 4 MiB, or 10 % of a larger
 * heap, is well above that noise, yet a leak of 40 bytes per operation is
 * caught: 8 s make more than 100000 operations, 30 s about 400000. */
#define SOAK_RSS_SLACK (4u << 20)
#define SOAK_RSS_SLACK_PERCENT 10
/* ASan keeps freed blocks in a quarantine of 256 MiB by default, which this
 * churn fills at some 30 MiB/s: the RSS would climb for ten seconds without
 * any leak. 4 MiB still holds the blocks of the last thousand or so
 * requests, so a use after free of a recent block is still caught, and it
 * fills early in the warm-up. */
#define SOAK_ASAN_OPTIONS "quarantine_size_mb=4"

/* What one worker slot did, in a page shared with the test: a killed worker's
 * counts survive it. Only the slot's current worker writes, and the test
 * reads after reaping it. */
struct soak_slot {
    uint64_t ops, puts, gets_verified, bytes_verified, releases, deletes;
    uint64_t enospc, enoent, eexist;
    uint64_t pins_now, pending_now; /* held at this moment */
    uint64_t failures;
    char failure[512]; /* the first failure */
};

/* The test's side of the run. */
struct soak_run {
    struct soak_slot *slots; /* SOAK_PROCS, MAP_SHARED */
    pid_t pids[SOAK_PROCS];
    unsigned generation[SOAK_PROCS];
    const char *socket;
    uint64_t seed;
    uint64_t deadline_ms; /* CLOCK_MONOTONIC, the same clock in every process */
    bool valgrind;
};

/* The run. Static, not on the test's stack: a failed assertion leaves the
 * test function, and teardown must still find the workers to kill. */
static struct soak_run soak_run_state;

/* ---- helpers --------------------------------------------------------------- */

/* splitmix64: a small fast generator; a run is repeated from its seed up to
 * scheduling. */
static uint64_t soak_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The pattern seed of an object: from its key and its size, so that any
 * reader can check any writer's object, and a version of a key with another
 * size (put after a delete) has other bytes. */
static uint32_t soak_seed(const char *key, size_t size)
{
    uint32_t h = 2166136261u;

    for (; *key != '\0'; key++)
        h = (h ^ (unsigned char)*key) * 16777619u;
    return h ^ ((uint32_t)size * 2654435761u) ^ (uint32_t)((uint64_t)size >> 32);
}

/* A key: mostly one of the shared ones, else one of a worker's own. */
static void soak_key(uint64_t *rng, int own_slot, int shared_percent, char *key,
                     size_t len)
{
    if ((int)(soak_rand(rng) % 100) < shared_percent)
        snprintf(key, len, "s%03u", (unsigned)(soak_rand(rng) % SOAK_SHARED_KEYS));
    else
        snprintf(key, len, "w%02d-%u",
                 own_slot >= 0 ? own_slot : (int)(soak_rand(rng) % SOAK_WORKERS),
                 (unsigned)(soak_rand(rng) % SOAK_OWN_KEYS));
}

/* An object size: most small, some medium, a few up to the maximum. */
static size_t soak_size(uint64_t *rng)
{
    uint64_t r = soak_rand(rng) % 100;

    if (r < 60)
        return 1 + (size_t)(soak_rand(rng) % 4096);
    if (r < 92)
        return 4097 + (size_t)(soak_rand(rng) % (256 * 1024 - 4096));
    return 256 * 1024 + (size_t)(soak_rand(rng) % (SOAK_MAX_OBJECT - 256 * 1024 + 1));
}

/* A signed environment number, or dflt. */
static long soak_env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    char *end;
    long n;

    if (v == NULL || v[0] == '\0')
        return dflt;
    n = strtol(v, &end, 0);
    return *end == '\0' ? n : dflt;
}

/* ---- the worker ------------------------------------------------------------ */

/* One pin or pending allocation a worker holds across operations. */
struct soak_held {
    char key[32];
    const unsigned char *ptr;
    size_t size;
};

/* A worker's state. */
struct soak_worker {
    shmb_t *c;
    struct soak_slot *slot;
    int index;
    uint64_t rng;
    struct soak_held pins[SOAK_HELD_PINS];
    int npins;
    struct soak_held pending[SOAK_HELD_PENDING];
    int npending;
    unsigned char *copy; /* shmb_put's source buffer */
};

/* Record a failure (the first one's text is kept) and print it. Returns -1. */
static int soak_failed(struct soak_worker *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int soak_failed(struct soak_worker *w, const char *fmt, ...)
{
    char msg[sizeof(w->slot->failure)];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "soak worker %d (pid %d): %s\n", w->index, (int)getpid(), msg);
    if (w->slot->failures++ == 0)
        snprintf(w->slot->failure, sizeof(w->slot->failure), "%s", msg);
    return -1;
}

/* Sort a call's result: 0 for success, 1 for an outcome a random operation
 * may have (each bit of normal is one of ENOSPC, ENOENT, EEXIST), -1 for a
 * failure. */
#define SOAK_ENOSPC 1u
#define SOAK_ENOENT 2u
#define SOAK_EEXIST 4u
static int soak_outcome(struct soak_worker *w, int rc, unsigned normal, const char *op,
                        const char *key)
{
    if (rc == 0)
        return 0;
    if (rc == -ENOSPC && (normal & SOAK_ENOSPC)) {
        w->slot->enospc++;
        return 1;
    }
    if (rc == -ENOENT && (normal & SOAK_ENOENT)) {
        w->slot->enoent++;
        return 1;
    }
    if (rc == -EEXIST && (normal & SOAK_EEXIST)) {
        w->slot->eexist++;
        return 1;
    }
    return soak_failed(w, "%s '%s' returned %d (%s: %s)", op, key, rc, shmb_errname(w->c),
                       shmb_errmsg(w->c));
}

/* Check size bytes at p against key's pattern. 0, or -1 (a failure). */
static int soak_verify(struct soak_worker *w, const char *key, const unsigned char *p,
                       size_t size, const char *when)
{
    size_t bad;

    if (size == 0 || size > SOAK_MAX_OBJECT)
        return soak_failed(w, "%s '%s': size %zu is out of range", when, key, size);
    bad = h_check(p, size, soak_seed(key, size));
    if (bad != size)
        return soak_failed(w, "%s '%s' (%zu bytes): byte %zu is 0x%02x, the pattern says "
                           "0x%02x", when, key, size, bad, p[bad],
                           h_pattern(soak_seed(key, size), bad));
    w->slot->gets_verified++;
    w->slot->bytes_verified += size;
    return 0;
}

/* Is key among the held pins? */
static bool soak_pinned(const struct soak_worker *w, const char *key)
{
    int i;

    for (i = 0; i < w->npins; i++)
        if (strcmp(w->pins[i].key, key) == 0)
            return true;
    return false;
}

/* get a key, check every byte, and either keep the pin or release it. A key
 * already held is released at once: with two pins on two versions of a key,
 * release drops the newer one's first, so one held pin per key keeps each
 * held pointer's pin its own. */
static int soak_get(struct soak_worker *w)
{
    const void *p;
    char key[32];
    size_t size;
    int rc;

    soak_key(&w->rng, -1, 75, key, sizeof(key));
    rc = soak_outcome(w, shmb_get(w->c, key, &p, &size), SOAK_ENOENT, "get", key);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    if (soak_verify(w, key, p, size, "get") < 0)
        return -1;
    if (w->npins < SOAK_HELD_PINS && !soak_pinned(w, key) && soak_rand(&w->rng) % 2 == 0) {
        struct soak_held *h = &w->pins[w->npins++];

        snprintf(h->key, sizeof(h->key), "%s", key);
        h->ptr = p;
        h->size = size;
        w->slot->pins_now = (uint64_t)w->npins;
        return 0;
    }
    w->slot->releases++;
    return soak_outcome(w, shmb_release(w->c, key), 0, "release", key);
}

/* Check a held pin's bytes once more (they must not have changed while other
 * workers allocated, deleted and evicted), then release it. */
static int soak_release(struct soak_worker *w, int i)
{
    struct soak_held h = w->pins[i];

    w->pins[i] = w->pins[--w->npins];
    w->slot->pins_now = (uint64_t)w->npins;
    if (soak_verify(w, h.key, h.ptr, h.size, "held pin of") < 0)
        return -1;
    w->slot->releases++;
    return soak_outcome(w, shmb_release(w->c, h.key), 0, "release", h.key);
}

/* Write an object: alloc, fill through the pointer, then commit now or keep
 * it pending for a while. */
static int soak_alloc(struct soak_worker *w)
{
    char key[32];
    size_t size = soak_size(&w->rng);
    void *p;
    int rc;

    soak_key(&w->rng, w->index, 60, key, sizeof(key));
    rc = soak_outcome(w, shmb_alloc(w->c, key, size, 0, &p), SOAK_ENOSPC | SOAK_EEXIST,
                      "alloc", key);
    if (rc != 0)
        return rc < 0 ? -1 : 0;
    h_fill(p, size, soak_seed(key, size));
    if (w->npending < SOAK_HELD_PENDING && soak_rand(&w->rng) % 3 == 0) {
        struct soak_held *h = &w->pending[w->npending++];

        snprintf(h->key, sizeof(h->key), "%s", key);
        h->ptr = p;
        h->size = size;
        w->slot->pending_now = (uint64_t)w->npending;
        return 0;
    }
    w->slot->puts++;
    return soak_outcome(w, shmb_commit(w->c, key), 0, "commit", key);
}

/* Commit (mostly) or abort a held pending allocation. */
static int soak_finish(struct soak_worker *w, int i, bool commit)
{
    struct soak_held h = w->pending[i];

    w->pending[i] = w->pending[--w->npending];
    w->slot->pending_now = (uint64_t)w->npending;
    if (!commit)
        return soak_outcome(w, shmb_abort(w->c, h.key), 0, "abort", h.key);
    w->slot->puts++;
    return soak_outcome(w, shmb_commit(w->c, h.key), 0, "commit", h.key);
}

/* Write an object with the copying shmb_put. */
static int soak_put(struct soak_worker *w)
{
    char key[32];
    size_t size = soak_size(&w->rng);
    int rc;

    soak_key(&w->rng, w->index, 60, key, sizeof(key));
    h_fill(w->copy, size, soak_seed(key, size));
    rc = soak_outcome(w, shmb_put(w->c, key, w->copy, size, 0), SOAK_ENOSPC | SOAK_EEXIST,
                      "put", key);
    if (rc == 0)
        w->slot->puts++;
    return rc < 0 ? -1 : 0;
}

/* Delete any key: absent and still-pending keys are ENOENT. */
static int soak_delete(struct soak_worker *w)
{
    char key[32];
    int rc;

    soak_key(&w->rng, -1, 70, key, sizeof(key));
    rc = soak_outcome(w, shmb_delete(w->c, key), SOAK_ENOENT, "delete", key);
    if (rc == 0)
        w->slot->deletes++;
    return rc < 0 ? -1 : 0;
}

/* One random operation. */
static int soak_step(struct soak_worker *w)
{
    uint64_t r = soak_rand(&w->rng) % 100;

    w->slot->ops++;
    if (r < 30)
        return soak_get(w);
    if (r < 42)
        return soak_alloc(w);
    if (r < 54)
        return soak_put(w);
    if (r < 66)
        return w->npins > 0 ? soak_release(w, (int)(soak_rand(&w->rng) % (uint64_t)w->npins))
                            : soak_get(w);
    if (r < 74)
        return w->npending > 0
                   ? soak_finish(w, (int)(soak_rand(&w->rng) % (uint64_t)w->npending),
                                 soak_rand(&w->rng) % 4 != 0)
                   : soak_alloc(w);
    return soak_delete(w);
}

/* A worker process: random operations until the deadline, then release and
 * commit what it holds and disconnect. Exit status 0, or 1 after a failure. */
static int soak_worker_main(struct soak_run *run, int index)
{
    struct soak_worker w;
    char name[32];
    int rc;

    memset(&w, 0, sizeof(w));
    w.slot = &run->slots[index];
    w.index = index;
    w.rng = run->seed ^ ((uint64_t)index << 32) ^ ((uint64_t)run->generation[index] << 48);
    w.copy = malloc(SOAK_MAX_OBJECT);
    w.c = shmb_new();
    if (w.copy == NULL || w.c == NULL) {
        soak_failed(&w, "out of memory");
        return 1;
    }
    snprintf(name, sizeof(name), "soak-%d.%u", index, run->generation[index]);
    rc = shmb_connect(w.c, run->socket, name);
    if (rc < 0) {
        soak_failed(&w, "connect: %s: %s", shmb_errname(w.c), shmb_errmsg(w.c));
        return 1;
    }
    while (h_now_ms() < run->deadline_ms)
        if (soak_step(&w) < 0)
            return 1;
    while (w.npins > 0)
        if (soak_release(&w, w.npins - 1) < 0)
            return 1;
    while (w.npending > 0)
        if (soak_finish(&w, w.npending - 1, true) < 0)
            return 1;
    shmb_close(w.c);
    free(w.copy);
    return 0;
}

/* ---- the queue's processes ------------------------------------------------- */

/* The queue's writer: messages of random sizes (one in eight longer than a
 * slot: an object of the segment the workers churn, so an allocation may
 * find it full and is tried again) until the deadline, then it closes: the
 * end of the queue. slot->puts counts the messages. */
static int soak_queue_writer(struct soak_worker *w, shmb_queue_t *q, uint64_t deadline)
{
    uint64_t seq = 0;
    void *buf;
    size_t len;
    int rc;

    if ((rc = shmb_queue_wait_ready(q, 60000)) < 0)
        return soak_failed(w, "queue wait_ready: %s: %s", shmb_errname(w->c),
                           shmb_errmsg(w->c));
    while (h_now_ms() < deadline) {
        uint64_t r = soak_rand(&w->rng);

        len = r % 8 == 0 ? SOAK_QUEUE_SLOT + 1 + (size_t)(r >> 8) % (4 * SOAK_QUEUE_SLOT)
                         : SOAK_QUEUE_MSG_MIN + (size_t)(r >> 8) % (SOAK_QUEUE_SLOT - 7);
        rc = shmb_queue_reserve(q, len, &buf, 60000);
        /* The segment full (at once, or after the 100 ms of alloc wait):
         * the same message again. */
        if (len > SOAK_QUEUE_SLOT && (rc == -ENOSPC || rc == -ETIMEDOUT)) {
            w->slot->enospc++;
            usleep(1000);
            continue;
        }
        if (rc < 0)
            return soak_failed(w, "queue reserve of %zu bytes: %s: %s", len,
                               shmb_errname(w->c), shmb_errmsg(w->c));
        memcpy(buf, &seq, sizeof(seq));
        h_fill((unsigned char *)buf + 8, len - 8, (uint32_t)(seq * 2654435761u));
        if ((rc = shmb_queue_publish(q, len)) < 0)
            return soak_failed(w, "queue publish: %s: %s", shmb_errname(w->c),
                               shmb_errmsg(w->c));
        w->slot->puts++;
        w->slot->ops++;
        seq++;
        if (r % 4 == 0)
            usleep((useconds_t)(r >> 40) % 400);
    }
    return 0;
}

/* A queue reader: every message after the first has the next sequence
 * number and its pattern, until the end of the queue (EPIPE).
 * slot->gets_verified counts the messages. */
static int soak_queue_reader(struct soak_worker *w, shmb_queue_t *q, uint64_t deadline)
{
    uint64_t seq, last = 0;
    bool first = true;
    const void *data;
    size_t len, bad;
    int rc;

    for (;;) {
        rc = shmb_queue_dequeue(q, &data, &len, (int)(deadline - h_now_ms()) + 60000);
        if (rc == -EPIPE)
            return 0;
        if (rc < 0)
            return soak_failed(w, "queue dequeue after message %llu: %s: %s",
                               (unsigned long long)last, shmb_errname(w->c),
                               shmb_errmsg(w->c));
        if (len < SOAK_QUEUE_MSG_MIN)
            return soak_failed(w, "queue message after %llu has %zu bytes",
                               (unsigned long long)last, len);
        memcpy(&seq, data, sizeof(seq));
        if (!first && seq != last + 1)
            return soak_failed(w, "queue message %llu came after %llu",
                               (unsigned long long)seq, (unsigned long long)last);
        bad = h_check((const unsigned char *)data + 8, len - 8, (uint32_t)(seq * 2654435761u));
        if (bad != len - 8)
            return soak_failed(w, "queue message %llu (%zu bytes): byte %zu is wrong",
                               (unsigned long long)seq, len, bad + 8);
        first = false;
        last = seq;
        w->slot->gets_verified++;
        w->slot->bytes_verified += len;
        w->slot->ops++;
        if (soak_rand(&w->rng) % 32 == 0)
            usleep((useconds_t)(soak_rand(&w->rng) % 300));
    }
}

/* A process of the queue (index past the workers'): connect, open its role,
 * run, close. */
static int soak_queue_main(struct soak_run *run, int index)
{
    struct soak_worker w;
    shmb_queue_t *q = NULL;
    char name[32];
    /* The churning reader takes the last seat, and when started again any
     * free or dead one: its own, the others being live. */
    int seat = index == SOAK_QUEUE_WRITER ? SHMB_QUEUE_WRITER
               : index == SOAK_QUEUE_CHURN && run->generation[index] > 0
                   ? SHMB_QUEUE_ANY_SEAT
                   : index - SOAK_QUEUE_WRITER - 1;
    int rc;

    memset(&w, 0, sizeof(w));
    w.slot = &run->slots[index];
    w.index = index;
    w.rng = run->seed ^ ((uint64_t)index << 32) ^ ((uint64_t)run->generation[index] << 48);
    snprintf(name, sizeof(name), "soakq-%d.%u", index, run->generation[index]);
    if ((w.c = shmb_new()) == NULL) {
        soak_failed(&w, "out of memory");
        return 1;
    }
    shmb_set_alloc_wait(w.c, 100);
    if (shmb_connect(w.c, run->socket, name) < 0 ||
        shmb_queue_open(w.c, SOAK_QUEUE, seat, &q) < 0) {
        soak_failed(&w, "connect and open %s: %s: %s", SOAK_QUEUE, shmb_errname(w.c),
                    shmb_errmsg(w.c));
        return 1;
    }
    rc = seat == SHMB_QUEUE_WRITER ? soak_queue_writer(&w, q, run->deadline_ms)
                                   : soak_queue_reader(&w, q, run->deadline_ms);
    if (rc < 0)
        return 1;
    if (shmb_queue_close(q) < 0) {
        soak_failed(&w, "queue close: %s: %s", shmb_errname(w.c), shmb_errmsg(w.c));
        return 1;
    }
    shmb_close(w.c);
    return 0;
}

/* Fork the worker of slot index. -1 when fork fails. */
static pid_t soak_spawn_worker(struct soak_run *run, int index)
{
    pid_t parent = getpid(), pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* A test that dies takes its workers with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        _exit(index < SOAK_WORKERS ? soak_worker_main(run, index)
                                   : soak_queue_main(run, index));
    }
    run->pids[index] = pid;
    return pid;
}

/* ---- the test's side ------------------------------------------------------- */

/* Start shmbrokerd under valgrind's memcheck, in a harness slot (so teardown
 * stops it, removes its segment and prints its log on failure). */
static struct h_daemon *soak_start_valgrind(struct h_fix *f, const char *const *extra)
{
    static const char *const valgrind[] = {
        "valgrind", "--tool=memcheck", "--error-exitcode=99", "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect", "--track-fds=no", NULL,
    };
    struct h_daemon *d = h_daemon_new(f, SOAK_SIZE);

    if (h_daemon_spawn_with(f, d, extra, valgrind, 0) < 0)
        h_fail("cannot start valgrind for %s: %s", h_daemon_bin(), strerror(errno));
    /* memcheck starts slowly: seconds, not milliseconds. */
    if (h_daemon_wait_ready(d, 60000) < 0)
        h_fail("shmbrokerd under valgrind did not listen on %s (exit status %d)", d->socket,
               d->status >= 0 ? h_exit_code(d->status) : -1);
    return d;
}

/* The daemon's memory, from /proc/PID/status, in bytes. */
struct soak_rss {
    uint64_t vm_rss, rss_anon, rss_file, rss_shmem;
};

/* One field of /proc/PID/status in bytes (the file says kB), or 0. */
static uint64_t soak_status_field(const char *text, const char *field)
{
    const char *p = strstr(text, field);

    return p != NULL ? strtoull(p + strlen(field), NULL, 10) * 1024 : 0;
}

/* Sample pid's memory; the test fails when /proc cannot tell. */
static struct soak_rss soak_sample_rss(pid_t pid)
{
    char path[64];
    struct soak_rss r;
    char *text;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    text = h_read_file(path, NULL);
    if (text == NULL)
        h_fail("cannot read %s", path);
    r.vm_rss = soak_status_field(text, "VmRSS:");
    r.rss_anon = soak_status_field(text, "RssAnon:");
    r.rss_file = soak_status_field(text, "RssFile:");
    r.rss_shmem = soak_status_field(text, "RssShmem:");
    free(text);
    if (r.vm_rss == 0)
        h_fail("no VmRSS in %s", path);
    return r;
}

/* The part of the RSS that is the daemon's own: VmRSS less the segment's
 * pages. The daemon maps the segment without prefaulting it and touches a
 * chunk header wherever the ring allocates, so RssShmem climbs as the ring
 * first laps the 64 MiB; that is the segment (whose size is fixed), not the
 * daemon's heap. */
static uint64_t soak_own_rss(const struct soak_rss *r)
{
    return r->vm_rss - r->rss_shmem;
}

/* Give an ASan daemon a quarantine that fills during warm-up (see
 * SOAK_ASAN_OPTIONS), unless ASAN_OPTIONS already sets one. Other builds
 * ignore the variable; the workers are forks, which never read it again. */
static void soak_set_asan_options(void)
{
    const char *old = getenv("ASAN_OPTIONS");
    char opts[1024];

    if (old != NULL && strstr(old, "quarantine_size") != NULL)
        return;
    snprintf(opts, sizeof(opts), "%s%s%s", old != NULL ? old : "",
             old != NULL && old[0] != '\0' ? ":" : "", SOAK_ASAN_OPTIONS);
    setenv("ASAN_OPTIONS", opts, 1);
}

/* Print a sample. */
static void soak_print_rss(const char *when, const struct soak_rss *r)
{
    printf("soak: daemon RSS %-9s VmRSS %6llu KiB = own %6llu KiB (anon %llu, file %llu) "
           "+ segment %llu KiB\n", when, (unsigned long long)r->vm_rss / 1024,
           (unsigned long long)soak_own_rss(r) / 1024, (unsigned long long)r->rss_anon / 1024,
           (unsigned long long)r->rss_file / 1024, (unsigned long long)r->rss_shmem / 1024);
}

/* Operations the workers have made so far (they go on writing meanwhile). */
static uint64_t soak_ops_so_far(const struct soak_run *run)
{
    uint64_t ops = 0;
    int i;

    for (i = 0; i < SOAK_WORKERS; i++)
        ops += __atomic_load_n(&run->slots[i].ops, __ATOMIC_RELAXED);
    return ops;
}

/* Reap a worker that ended by itself, or SIGKILL it first (kill is true).
 * Returns its wait status. */
static int soak_reap(struct soak_run *run, int index, bool kill_it)
{
    int status = 0;

    if (kill_it)
        kill(run->pids[index], SIGKILL);
    while (waitpid(run->pids[index], &status, 0) < 0 && errno == EINTR)
        ;
    run->pids[index] = 0;
    return status;
}

/* A worker ended by itself before the deadline, or with a failure: count it. */
static void soak_unexpected_exit(struct soak_run *run, int index, int status)
{
    struct soak_slot *s = &run->slots[index];

    if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && s->failures > 0)
        return; /* it has said what went wrong */
    s->failures++;
    fprintf(stderr, "soak: worker %d ended with status %d before the deadline\n", index,
            h_exit_code(status));
    if (s->failure[0] == '\0')
        snprintf(s->failure, sizeof(s->failure), "ended with status %d",
                 h_exit_code(status));
}

/* Delete every object with one client: list, delete what is committed, and
 * again until the list is empty (pins and pending allocations of the workers
 * go when the daemon has seen their connections close). */
/* A worker SIGKILLed while it copied into its arena leaves that arena BUSY:
 * the daemon keeps its bytes (another process may still hold the mapping
 * and be writing) until reclaim reaches it, which the ring's wrap does. So
 * that the check below proves every byte can be had again, put objects of
 * the largest size until the ring has wrapped past everything, then delete
 * them: a byte that reclaim cannot take fails a put (ENOSPC). */
static void soak_sweep_arenas(shmb_t *c, shmb_stats_t *st)
{
    uint64_t size = st->max_object_size, n = st->data_size / size + 2, i;
    unsigned char *buf = calloc(1, size);
    char key[32];

    assert_non_null(buf);
    printf("soak: %llu bytes left in arenas of workers killed mid-copy; %llu puts of "
           "%llu bytes wrap the ring past them\n", (unsigned long long)st->used,
           (unsigned long long)n, (unsigned long long)size);
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "soak-sweep-%llu", (unsigned long long)i);
        if (shmb_put(c, key, buf, size, 0) < 0)
            h_fail("sweep put %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    }
    for (i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "soak-sweep-%llu", (unsigned long long)i);
        if (shmb_delete(c, key) < 0 && shmb_errcode(c) != -ENOENT)
            h_fail("sweep delete %s: %s: %s", key, shmb_errname(c), shmb_errmsg(c));
    }
    free(buf);
    if (shmb_stats(c, st) < 0)
        h_fail("stats: %s: %s", shmb_errname(c), shmb_errmsg(c));
}

static void soak_delete_all(shmb_t *c, int timeout_ms, unsigned *deleted, unsigned *rounds)
{
    uint64_t deadline = h_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        json_error_t jerr;
        json_t *reply, *objects, *o;
        char *text = NULL, *first = NULL;
        size_t i, left = 0;
        int rc;

        (*rounds)++;
        rc = shmb_request(c, "{\"op\":\"list\",\"prefix\":\"\",\"limit\":100000}", &text);
        if (rc < 0)
            h_fail("list: %s: %s", shmb_errname(c), shmb_errmsg(c));
        reply = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        objects = json_object_get(reply, "objects");
        if (!json_is_array(objects) || json_is_true(json_object_get(reply, "truncated")))
            h_fail("unexpected list reply: %.200s", text);
        free(text);
        json_array_foreach(objects, i, o) {
            const char *key = json_string_value(json_object_get(o, "key"));
            const char *state = json_string_value(json_object_get(o, "state"));

            left++;
            if (key == NULL || state == NULL || strcmp(state, "committed") != 0)
                continue;
            rc = shmb_delete(c, key);
            if (rc == 0)
                (*deleted)++;
            else if (rc != -ENOENT)
                h_fail("delete '%s': %s: %s", key, shmb_errname(c), shmb_errmsg(c));
        }
        if (left > 0 && h_now_ms() > deadline)
            first = json_dumps(json_array_get(objects, 0), JSON_COMPACT);
        json_decref(reply);
        if (left == 0)
            return;
        if (first != NULL)
            h_fail("%zu objects still listed %d ms after the workers stopped, the first: %s",
                   left, timeout_ms, first);
        h_sleep_ms(10);
    }
}

/* Nothing but the cleaning client is connected. */
static bool soak_only_one_client(void *arg)
{
    shmb_stats_t st;

    return shmb_stats(arg, &st) == 0 && st.clients == 1;
}

/* 32 clients at random for SOAK_SECONDS with kills and restarts, every byte
 * read checked; then an empty segment (used 0, no object, pending alloc or
 * pin), a daemon whose own RSS did not grow after warm-up, and exit status 0
 * on SIGTERM, which under ASan or valgrind means no leak and no memory error. */
static void test_soak(void **state)
{
    static const char *const extra[] = {"--max-object-size", "2M", NULL};
    struct h_fix *f = *state;
    struct soak_run *run = &soak_run_state;
    struct soak_rss warm = {0, 0, 0, 0}, end, clean;
    struct soak_slot total;
    struct h_daemon *d;
    shmb_stats_t st;
    shmb_t *c;
    uint64_t start, warm_at, rng, slack, kills = 0, kills_holding = 0, queue_kills = 0;
    unsigned deleted = 0, rounds = 0, failures = 0;
    long seconds = soak_env_long("SOAK_SECONDS", 8);
    bool warm_sampled = false;
    int i, status;

    memset(run, 0, sizeof(*run));
    run->valgrind = soak_env_long("SOAK_VALGRIND", 0) == 1;
    run->seed = (uint64_t)soak_env_long("SOAK_SEED", 0);
    if (run->seed == 0)
        run->seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (seconds < 1)
        seconds = 1;
    printf("soak: seed %llu (SOAK_SEED=%llu repeats it), %ld s, %d workers%s\n",
           (unsigned long long)run->seed, (unsigned long long)run->seed, seconds, SOAK_WORKERS,
           run->valgrind ? ", daemon under valgrind memcheck" : "");
    fflush(stdout);
    rng = run->seed;

    soak_set_asan_options();
    d = run->valgrind ? soak_start_valgrind(f, extra) : h_daemon_start(f, SOAK_SIZE, extra);
    run->socket = d->socket;
    run->slots = mmap(NULL, sizeof(struct soak_slot) * SOAK_PROCS, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(run->slots != MAP_FAILED);

    start = h_now_ms();
    run->deadline_ms = start + (uint64_t)seconds * 1000;
    warm_at = start + (uint64_t)seconds * 1000 / SOAK_WARMUP_DIVISOR;
    c = shmb_new();
    assert_non_null(c);
    if (shmb_connect(c, d->socket, "soak-queue") < 0 ||
        shmb_queue_create(c, SOAK_QUEUE, SOAK_QUEUE_READERS + 1, SOAK_QUEUE_SLOTS,
                          SOAK_QUEUE_SLOT, 0) < 0)
        h_fail("queue %s: %s: %s", SOAK_QUEUE, shmb_errname(c), shmb_errmsg(c));
    shmb_close(c);
    for (i = 0; i < SOAK_PROCS; i++)
        if (soak_spawn_worker(run, i) < 0)
            h_fail("fork: %s", strerror(errno));

    /* Kill a random worker now and then, and start it again. */
    for (;;) {
        uint64_t now = h_now_ms(), next = now + SOAK_KILL_MIN_MS +
                                          soak_rand(&rng) % SOAK_KILL_SPAN_MS;

        if (next > run->deadline_ms)
            next = run->deadline_ms;
        while ((now = h_now_ms()) < next) {
            if (!warm_sampled && !run->valgrind && now >= warm_at &&
                soak_ops_so_far(run) >= SOAK_WARMUP_OPS) {
                warm = soak_sample_rss(d->pid);
                warm_sampled = true;
            }
            h_sleep_ms((int)(next - now < 20 ? next - now : 20));
        }
        /* Workers that ended by themselves (a failure) are counted.
         * Each by its pid: waitpid(-1) could reap the daemon. */
        for (i = 0; i < SOAK_PROCS; i++) {
            if (run->pids[i] <= 0 || waitpid(run->pids[i], &status, WNOHANG) != run->pids[i])
                continue;
            run->pids[i] = 0;
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                h_now_ms() >= run->deadline_ms)
                continue; /* it stopped at the deadline, as it should */
            soak_unexpected_exit(run, i, status); /* not restarted: the test fails */
        }
        if (now >= run->deadline_ms)
            break;
        /* One time in three, the churning queue reader too, once the
         * writer has found every seat live and published. */
        if (soak_rand(&rng) % 3 == 0 && run->pids[SOAK_QUEUE_CHURN] > 0 &&
            __atomic_load_n(&run->slots[SOAK_QUEUE_WRITER].puts, __ATOMIC_RELAXED) > 0) {
            status = soak_reap(run, SOAK_QUEUE_CHURN, true);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && h_now_ms() >= run->deadline_ms)
                break; /* it reached the deadline by its own clock just before the kill */
            if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
                soak_unexpected_exit(run, SOAK_QUEUE_CHURN, status);
            queue_kills++;
            run->generation[SOAK_QUEUE_CHURN]++;
            if (soak_spawn_worker(run, SOAK_QUEUE_CHURN) < 0)
                h_fail("fork: %s", strerror(errno));
        }
        i = (int)(soak_rand(&rng) % SOAK_WORKERS);
        if (run->pids[i] <= 0)
            continue;
        if (run->slots[i].pins_now > 0 || run->slots[i].pending_now > 0)
            kills_holding++;
        status = soak_reap(run, i, true);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && h_now_ms() >= run->deadline_ms)
            break; /* it reached the deadline by its own clock just before the kill */
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
            soak_unexpected_exit(run, i, status);
        kills++;
        run->slots[i].pins_now = run->slots[i].pending_now = 0;
        run->generation[i]++;
        if (soak_spawn_worker(run, i) < 0)
            h_fail("fork: %s", strerror(errno));
    }
    if (!run->valgrind)
        end = soak_sample_rss(d->pid);

    /* Every worker stops by itself at the deadline, after its current step;
     * the queue's readers once they have read what its writer published. */
    for (i = 0; i < SOAK_PROCS; i++) {
        if (run->pids[i] <= 0)
            continue;
        if (h_wait_pid(run->pids[i], run->valgrind ? 60000 : 20000, &status) < 0) {
            soak_reap(run, i, true);
            h_fail("worker %d did not stop after the deadline", i);
        }
        run->pids[i] = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            soak_unexpected_exit(run, i, status);
    }

    memset(&total, 0, sizeof(total));
    for (i = 0; i < SOAK_WORKERS; i++) {
        struct soak_slot *s = &run->slots[i];

        total.ops += s->ops;
        total.puts += s->puts;
        total.gets_verified += s->gets_verified;
        total.bytes_verified += s->bytes_verified;
        total.releases += s->releases;
        total.deletes += s->deletes;
        total.enospc += s->enospc;
        total.enoent += s->enoent;
        total.eexist += s->eexist;
    }
    for (i = 0; i < SOAK_PROCS; i++) {
        struct soak_slot *s = &run->slots[i];

        if (s->failures > 0)
            print_error("worker %d: %llu failure(s), the first: %s\n", i,
                        (unsigned long long)s->failures, s->failure);
        failures += (unsigned)s->failures;
    }
    printf("soak: %llu ops, %llu puts, %llu gets verified (%llu MiB), %llu releases, "
           "%llu deletes; normal outcomes: %llu ENOSPC, %llu ENOENT, %llu EEXIST; "
           "%llu kills (%llu holding pins or pending allocs), %u failures\n",
           (unsigned long long)total.ops, (unsigned long long)total.puts,
           (unsigned long long)total.gets_verified,
           (unsigned long long)(total.bytes_verified >> 20),
           (unsigned long long)total.releases, (unsigned long long)total.deletes,
           (unsigned long long)total.enospc, (unsigned long long)total.enoent,
           (unsigned long long)total.eexist, (unsigned long long)kills,
           (unsigned long long)kills_holding, failures);
    fflush(stdout);
    printf("soak: queue: %llu messages published (%llu times the segment was full for an "
           "overflow object), read by %d readers: %llu, %llu, %llu; the churning reader "
           "read %llu and was killed %llu times\n",
           (unsigned long long)run->slots[SOAK_QUEUE_WRITER].puts,
           (unsigned long long)run->slots[SOAK_QUEUE_WRITER].enospc, SOAK_QUEUE_READERS,
           (unsigned long long)run->slots[SOAK_QUEUE_WRITER + 1].gets_verified,
           (unsigned long long)run->slots[SOAK_QUEUE_WRITER + 2].gets_verified,
           (unsigned long long)run->slots[SOAK_QUEUE_WRITER + 3].gets_verified,
           (unsigned long long)run->slots[SOAK_QUEUE_CHURN].gets_verified,
           (unsigned long long)queue_kills);
    fflush(stdout);
    if (failures > 0)
        h_fail("%u failure(s) in the workers (see above)", failures);
    /* Every message reached every reader that was there from the start. */
    if (run->slots[SOAK_QUEUE_WRITER].puts == 0)
        h_fail("the queue's writer published nothing");
    for (i = SOAK_QUEUE_WRITER + 1; i < SOAK_QUEUE_CHURN; i++)
        if (run->slots[i].gets_verified != run->slots[SOAK_QUEUE_WRITER].puts)
            h_fail("queue reader %d read %llu of %llu messages", i - SOAK_QUEUE_WRITER - 1,
                   (unsigned long long)run->slots[i].gets_verified,
                   (unsigned long long)run->slots[SOAK_QUEUE_WRITER].puts);
    /* A soak that did nothing proves nothing. */
    if (total.gets_verified == 0 || total.puts == 0 || total.deletes == 0 ||
        (seconds >= 2 && kills == 0))
        h_fail("the soak did too little to prove anything");

    /* Delete everything: the segment must be empty. */
    c = shmb_new();
    assert_non_null(c);
    if (shmb_connect(c, d->socket, "soak-cleaner") < 0)
        h_fail("connect: %s: %s", shmb_errname(c), shmb_errmsg(c));
    if (!h_eventually(soak_only_one_client, c, run->valgrind ? 30000 : 10000))
        h_fail("the workers' connections are still open after they exited");
    /* Its members gone, the queue goes, and its overflow objects with it. */
    if (shmb_queue_delete(c, SOAK_QUEUE) < 0)
        h_fail("queue_delete %s: %s: %s", SOAK_QUEUE, shmb_errname(c), shmb_errmsg(c));
    soak_delete_all(c, run->valgrind ? 30000 : 10000, &deleted, &rounds);
    if (shmb_stats(c, &st) < 0)
        h_fail("stats: %s: %s", shmb_errname(c), shmb_errmsg(c));
    if (st.used != 0 && st.objects == 0 && st.pending == 0 && st.pinned == 0)
        soak_sweep_arenas(c, &st);
    printf("soak: deleted %u objects in %u list rounds; then used %llu, objects %llu, "
           "pending %llu, pinned %llu\n", deleted, rounds, (unsigned long long)st.used,
           (unsigned long long)st.objects, (unsigned long long)st.pending,
           (unsigned long long)st.pinned);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.free, st.data_size);
    shmb_close(c);

    /* The daemon's own memory after warm-up: flat within the slack. */
    if (!run->valgrind) {
        if (!warm_sampled)
            h_fail("the clients made only %llu operations; the RSS check needs %d before "
                   "warm-up ends: run longer (SOAK_SECONDS)",
                   (unsigned long long)total.ops, SOAK_WARMUP_OPS);
        clean = soak_sample_rss(d->pid);
        soak_print_rss("warm-up", &warm);
        soak_print_rss("end", &end);
        soak_print_rss("cleaned", &clean);
        slack = soak_own_rss(&warm) * SOAK_RSS_SLACK_PERCENT / 100;
        if (slack < SOAK_RSS_SLACK)
            slack = SOAK_RSS_SLACK;
        if (soak_own_rss(&end) > soak_own_rss(&warm) + slack ||
            soak_own_rss(&clean) > soak_own_rss(&warm) + slack)
            h_fail("the daemon's own RSS grew after warm-up: %llu KiB, then %llu KiB at the "
                   "end and %llu KiB after cleaning (allowed: +%llu KiB)",
                   (unsigned long long)soak_own_rss(&warm) / 1024,
                   (unsigned long long)soak_own_rss(&end) / 1024,
                   (unsigned long long)soak_own_rss(&clean) / 1024,
                   (unsigned long long)slack / 1024);
    }

    /* SIGTERM: exit status 0 (memcheck says 99 for errors, ASan non-zero for a leak). */
    status = h_daemon_signal(d, SIGTERM, run->valgrind ? 60000 : 20000);
    if (status < 0 || h_exit_code(status) != 0) {
        h_daemon_print_log(d);
        h_fail("shmbrokerd exited with status %d on SIGTERM%s", status < 0 ? -1 :
               h_exit_code(status), run->valgrind && status >= 0 && h_exit_code(status) == 99
                                        ? " (valgrind memcheck found errors: see its log)"
                                        : "");
    }
    if (run->valgrind) {
        char *log = h_read_file(d->log, NULL);
        const char *line = log != NULL ? strstr(log, "ERROR SUMMARY:") : NULL;

        if (line != NULL)
            printf("soak: valgrind: %.*s\n", (int)strcspn(line, "\n"), line);
        free(log);
    }
    fflush(stdout);
    h_pass(f);
}

/* Print what the daemon logged, but for the thousands of connect and
 * disconnect lines. The harness prints the log through cmocka's
 * print_message, which keeps only its first 1024 bytes; a sanitizer's or
 * memcheck's report comes at the end. */
static void soak_print_daemon_log(const struct h_daemon *d)
{
    char *log = h_read_file(d->log, NULL), *line, *save = NULL;
    unsigned skipped = 0;

    if (log == NULL)
        return;
    fprintf(stderr, "---- shmbrokerd --name %s: its log without client (dis)connections:\n",
            d->name);
    for (line = strtok_r(log, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        if (strstr(line, " info: client pid ") != NULL &&
            (strstr(line, ") connected") != NULL || strstr(line, ") disconnected") != NULL ||
             strstr(line, " disconnected") != NULL)) {
            skipped++;
            continue;
        }
        fprintf(stderr, "%s\n", line);
    }
    fprintf(stderr, "---- end of log (%u connection lines left out)\n", skipped);
    free(log);
}

/* Teardown: kill the workers a failed assertion left running; after a
 * failure, stop the daemon and show its log in full; then the harness's
 * cleanup. */
static int soak_teardown(void **state)
{
    struct soak_run *run = &soak_run_state;
    struct h_fix *f = *state;
    int i;

    for (i = 0; i < SOAK_PROCS; i++)
        if (run->pids[i] > 0)
            soak_reap(run, i, true);
    if (f != NULL && !f->passed && f->ndaemons > 0) {
        struct h_daemon *d = &f->daemons[0];
        int status = h_daemon_signal(d, SIGTERM, 60000);

        fflush(stdout);
        if (status < 0)
            fprintf(stderr, "soak: shmbrokerd did not stop on SIGTERM\n");
        else if (WIFSIGNALED(status))
            fprintf(stderr, "soak: shmbrokerd was killed by signal %d\n", WTERMSIG(status));
        else
            fprintf(stderr, "soak: shmbrokerd exit status %d\n", WEXITSTATUS(status));
        soak_print_daemon_log(d);
    }
    if (run->slots != NULL && run->slots != MAP_FAILED)
        munmap(run->slots, sizeof(struct soak_slot) * SOAK_PROCS);
    run->slots = NULL;
    return h_teardown(state);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_soak, h_setup, soak_teardown),
    };

    return cmocka_run_group_tests_name("soak", tests, NULL, NULL);
}
