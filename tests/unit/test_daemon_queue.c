// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for the daemon's queues (daemon/queue.c and its rooms) over
 * real memfds and a real memfd pool: creation and its limits, roles taken
 * and left, what a member's connection closing does to the area, automatic
 * deletion, the blocker, the header restored, and the pool's overflow
 * objects deleted with the queue. Owners are plain addresses standing for
 * connections.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "../../daemon/clock.h"
#include "../../daemon/queue.h"
#include "../../proto/alloc.h"

/* The store's lookups by key that the queues make (queue_overflow.c),
 * counted (-Wl,--wrap): a seat's departure costs one per object, not one per
 * seat and object. The counted variant may not exist in the code under test
 * (weak). */
static unsigned long key_lookups;

int __real_store_forgo_read(struct store *s, const char *key, size_t key_len);
int __real_store_forgo_reads(struct store *s, const char *key, size_t key_len, uint32_t n)
    __attribute__((weak));
bool __real_store_holder_pins(const struct store *s, const struct store_holder *h,
                              const char *key, size_t key_len);
int __wrap_store_forgo_read(struct store *s, const char *key, size_t key_len);
int __wrap_store_forgo_reads(struct store *s, const char *key, size_t key_len,
                             uint32_t n);
bool __wrap_store_holder_pins(const struct store *s, const struct store_holder *h,
                              const char *key, size_t key_len);

int __wrap_store_forgo_read(struct store *s, const char *key, size_t key_len)
{
    key_lookups++;
    return __real_store_forgo_read(s, key, key_len);
}

int __wrap_store_forgo_reads(struct store *s, const char *key, size_t key_len, uint32_t n)
{
    key_lookups++;
    return __real_store_forgo_reads(s, key, key_len, n);
}

bool __wrap_store_holder_pins(const struct store *s, const struct store_holder *h,
                              const char *key, size_t key_len)
{
    key_lookups++;
    return __real_store_holder_pins(s, h, key, key_len);
}

#define MIB (1024u * 1024u)

/* Three connections. */
static int conn_a, conn_b, conn_c;

struct fixture {
    struct pool *pool;
    struct queue_set set;
    struct shmb_error err;
};

/* Open descriptors of this process. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    struct pool_config pc;
    struct store_config scfg = {0};
    uint64_t rounded;

    log_active_level = LOG_ERROR;
    memset(&pc, 0, sizeof(pc));
    snprintf(pc.name, sizeof(pc.name), "p");
    snprintf(pc.segment, sizeof(pc.segment), "test-dq.%d", (int)getpid());
    pc.size = MIB;
    pc.backing = POOL_BACKING_MEMFD;
    pc.max_object_size = MIB / 4;
    if (f == NULL || pool_check_settings(&pc, &rounded, &f->err) < 0 ||
        (f->pool = pool_new(&pc, rounded, &f->err)) == NULL ||
        pool_plan(f->pool, false, &f->err) < 0 ||
        pool_open(f->pool, &scfg, NULL, &f->err) < 0) {
        print_error("pool: %s\n", f != NULL ? f->err.message : "no memory");
        return -1;
    }
    queue_set_init(&f->set, "test-dq");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    queue_set_free(&f->set);
    pool_close(f->pool, false);
    pool_free(f->pool);
    free(f);
    return 0;
}

static struct queue_member member(uint64_t id, const char *name)
{
    struct queue_member m;

    memset(&m, 0, sizeof(m));
    m.client = id;
    m.pid = (pid_t)(1000 + id);
    snprintf(m.name, sizeof(m.name), "%s", name);
    return m;
}

/* A small queue: seats seats, 4 slots of 64 bytes. */
static struct queue *make(struct fixture *f, const char *name, uint32_t seats, bool temporary)
{
    struct queue *q = NULL;
    bool created = false;

    assert_int_equal(queue_create(&f->set, f->pool, name, seats, 4, 64, temporary, NULL, &q,
                                  &created, &f->err),
                     0);
    assert_true(created);
    return q;
}

/* Proves that a queue is a sealed memfd of its geometry's size, formatted,
 * named after the set's prefix; the same geometry is found again, another is
 * EEXIST naming both. */
static void test_create(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "steps", 2, false), *again = NULL;
    char link[64], target[256];
    struct shmb_q view;
    bool created = true;
    ssize_t n;

    assert_int_equal(q->size, shmb_q_size(2, 4, 64));
    assert_int_equal(lseek(q->fd, 0, SEEK_END), (off_t)q->size);
    /* (and F_SEAL_EXEC where the kernel has MFD_NOEXEC_SEAL) */
    assert_int_equal(fcntl(q->fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL |
                                                   F_SEAL_WRITE),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(shmb_q_attach(&view, q->base, q->size, &f->err), 0);
    assert_int_equal(view.seats, 2);
    snprintf(link, sizeof(link), "/proc/self/fd/%d", q->fd);
    n = readlink(link, target, sizeof(target) - 1);
    assert_true(n > 0);
    target[n] = '\0';
    assert_non_null(strstr(target, "test-dq.q.steps"));
    assert_int_equal(queue_create(&f->set, f->pool, "steps", 2, 4, 64, false, NULL, &again, &created,
                                  &f->err),
                     0);
    assert_ptr_equal(again, q);
    assert_false(created);
    assert_int_equal(queue_create(&f->set, f->pool, "steps", 3, 4, 64, false, NULL, &again, &created,
                                  &f->err),
                     -EEXIST);
    assert_non_null(strstr(f->err.message, "exists with 2 seats, 4 slots of 64 bytes"));
    assert_non_null(strstr(f->err.message, "asks for 3 seats, 4 slots of 64 bytes"));
    assert_ptr_equal(queue_find(&f->set, f->pool, "steps"), q);
    assert_null(queue_find(&f->set, f->pool, "other"));
}

/* Proves the limits: 64 queues (EMFILE naming it; room again after a
 * delete), and a queue larger than the host's memory (ENOMEM with the
 * numbers, nothing made). */
static void test_limits(void **state)
{
    struct fixture *f = *state;
    struct queue *q = NULL;
    bool created;
    char name[16];
    int i, fds;

    for (i = 0; i < QUEUE_MAX; i++) {
        snprintf(name, sizeof(name), "q%d", i);
        make(f, name, 1, false);
    }
    fds = count_fds();
    assert_int_equal(queue_create(&f->set, f->pool, "one-more", 1, 4, 64, false, NULL, &q, &created,
                                  &f->err),
                     -EMFILE);
    assert_non_null(strstr(f->err.message, "its limit (64)"));
    assert_int_equal(count_fds(), fds);
    assert_int_equal(queue_delete(&f->set, queue_find(&f->set, f->pool, "q7"), NULL, &f->err), 0);
    assert_int_equal(count_fds(), fds - 1);
    make(f, "one-more", 1, false);
    assert_int_equal(queue_delete(&f->set, queue_find(&f->set, f->pool, "q8"), NULL, &f->err), 0);
    assert_int_equal(queue_create(&f->set, f->pool, "huge", 64, SHMB_QUEUE_SLOTS_MAX,
                                  SHMB_QUEUE_SLOT_SIZE_MAX, false, NULL, &q, &created, &f->err),
                     -ENOMEM);
    assert_non_null(strstr(f->err.message, "Queue 'huge' needs "));
    assert_non_null(strstr(f->err.message, "(64 seats, 65536 slots of 1073741824 bytes)"));
    assert_non_null(strstr(f->err.message, "Use fewer or smaller slots."));
    assert_null(queue_find(&f->set, f->pool, "huge"));
    assert_int_equal(queue_count(&f->set, NULL), QUEUE_MAX - 1);
}

/* Proves roles: one writer (EBUSY naming it), seats by number or the lowest
 * free one (EBUSY naming the holder and the free seats; none free), range,
 * the area's seat live with a new epoch, and roles counted per owner. */
static void test_open(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 3, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    uint32_t seat;
    uint64_t epoch;

    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(atomic_load(&q->q.hdr->writer_live), 1);
    assert_int_equal(queue_open_writer(q, &conn_b, &b, &f->err), -EBUSY);
    assert_non_null(strstr(f->err.message, "client 1 (pid 1001, 'a')"));
    assert_int_equal(queue_open_reader(q, 1, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(seat, 1);
    assert_int_equal(epoch, 1);
    assert_int_equal(atomic_load(&q->q.seat[1].state), SHMB_SEAT_LIVE);
    assert_int_equal(queue_open_reader(q, -1, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(seat, 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_a, &a, &seat, &epoch, &f->err), -EBUSY);
    assert_non_null(strstr(f->err.message, "client 2 (pid 1002, 'b'). Free seats: 2."));
    assert_int_equal(queue_open_reader(q, 3, &conn_a, &a, &seat, &epoch, &f->err), -EINVAL);
    assert_int_equal(queue_open_reader(q, -1, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(seat, 2);
    assert_int_equal(queue_open_reader(q, -1, &conn_c, &a, &seat, &epoch, &f->err), -EBUSY);
    assert_non_null(strstr(f->err.message, "no seat free: all 3"));
    assert_int_equal(queue_roles_of(&f->set, &conn_a), 2);
    assert_int_equal(queue_roles_of(&f->set, &conn_b), 2);
    assert_int_equal(queue_roles_of(&f->set, &conn_c), 0);
}

/* Proves what closing a connection does: its seats dead in the daemon's
 * record and in the area (keeping who held them), its writer role gone
 * (WRITER_GONE), across several queues at once, and taken again: a dead
 * seat is given out with a new epoch, a new writer opens the queue again. */
static void test_owner_gone(void **state)
{
    struct fixture *f = *state;
    struct queue *q1 = make(f, "q1", 2, false), *q2 = make(f, "q2", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    struct queue_status st;
    uint32_t seat;
    uint64_t epoch;

    assert_int_equal(queue_open_writer(q1, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q1, 0, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q2, 1, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_writer(q2, &conn_b, &b, &f->err), 0);
    assert_int_equal(queue_owner_gone(&f->set, &conn_a), 3);
    assert_int_equal(queue_roles_of(&f->set, &conn_a), 0);
    assert_null(q1->writer);
    assert_int_equal(atomic_load(&q1->q.hdr->state), SHMB_QUEUE_WRITER_GONE);
    assert_int_equal(atomic_load(&q1->q.hdr->writer_live), 0);
    assert_int_equal(q1->seat[0].state, SHMB_SEAT_DEAD);
    assert_int_equal(atomic_load(&q1->q.seat[0].state), SHMB_SEAT_DEAD);
    assert_int_equal(q1->seat[0].who.pid, 1001);
    assert_int_equal(q2->seat[1].state, SHMB_SEAT_DEAD);
    assert_int_equal(atomic_load(&q2->q.hdr->state), SHMB_QUEUE_OPEN);
    queue_status(q1, &st);
    assert_string_equal(st.state, "writer_gone");
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.free, 1);
    assert_int_equal(st.live, 0);
    /* Taken again. */
    assert_int_equal(queue_open_reader(q1, -1, &conn_c, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(seat, 0);
    assert_int_equal(epoch, 2);
    assert_int_equal(queue_open_writer(q1, &conn_c, &b, &f->err), 0);
    assert_int_equal(atomic_load(&q1->q.hdr->state), SHMB_QUEUE_OPEN);
    queue_status(q1, &st);
    assert_string_equal(st.state, "open");
}

/* Proves queue_close_roles: by seat, by role, all; ENOENT saying what is
 * held; a reader's seat free (not dead), the writer's going WRITER_GONE. */
static void test_close_roles(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 3, false);
    struct queue_member a = member(1, "a");
    unsigned closed = 0;
    uint32_t seat;
    uint64_t epoch;

    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_ANY, -1, &closed,
                                       &f->err),
                     -ENOENT);
    assert_non_null(strstr(f->err.message, "it holds no role there"));
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 2, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_READER, 1, &closed,
                                       &f->err),
                     -ENOENT);
    assert_non_null(strstr(f->err.message, "the writer role and seat 0, 2"));
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_READER, 2, &closed,
                                       &f->err),
                     0);
    assert_int_equal(closed, 1);
    assert_int_equal(q->seat[2].state, SHMB_SEAT_FREE);
    assert_int_equal(atomic_load(&q->q.seat[2].state), SHMB_SEAT_FREE);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_WRITER, -1, &closed,
                                       &f->err),
                     0);
    assert_int_equal(atomic_load(&q->q.hdr->state), SHMB_QUEUE_WRITER_GONE);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_ANY, -1, &closed,
                                       &f->err),
                     0);
    assert_int_equal(closed, 1);
    assert_int_equal(queue_roles_of(&f->set, &conn_a), 0);
    /* Not temporary, not shut down: it stays. */
    assert_ptr_equal(queue_find(&f->set, f->pool, "q"), q);
}

/* Proves automatic deletion: a temporary queue goes once it has had a writer
 * and nobody holds it (not before its writer came); a queue shut down goes
 * when its last member leaves, and at once when it has none; the descriptor
 * goes with it. */
static void test_auto_delete(void **state)
{
    struct fixture *f = *state;
    struct queue *t = make(f, "t", 1, true), *s;
    struct queue_member a = member(1, "a");
    unsigned closed;
    uint32_t seat;
    uint64_t epoch;
    int fds = count_fds();

    assert_int_equal(queue_open_reader(t, 0, &conn_a, &a, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_close_roles(&f->set, t, &conn_a, QUEUE_ROLE_ANY, -1, &closed,
                                       &f->err),
                     0);
    assert_non_null(queue_find(&f->set, f->pool, "t")); /* no writer yet */
    assert_int_equal(queue_open_writer(t, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(t, 0, &conn_b, &a, &seat, &epoch, &f->err), 0);
    queue_owner_gone(&f->set, &conn_a);
    assert_non_null(queue_find(&f->set, f->pool, "t")); /* a live reader */
    queue_owner_gone(&f->set, &conn_b);
    assert_null(queue_find(&f->set, f->pool, "t"));
    assert_int_equal(count_fds(), fds - 1);

    s = make(f, "s", 1, false);
    assert_int_equal(queue_open_reader(s, 0, &conn_a, &a, &seat, &epoch, &f->err), 0);
    queue_shutdown(&f->set, s);
    assert_int_equal(atomic_load(&s->q.hdr->state), SHMB_QUEUE_SHUTDOWN);
    assert_int_equal(queue_open_writer(s, &conn_b, &a, &f->err), -ECANCELED);
    assert_int_equal(queue_open_reader(s, -1, &conn_b, &a, &seat, &epoch, &f->err),
                     -ECANCELED);
    assert_int_equal(queue_create(&f->set, f->pool, "s", 1, 4, 64, false, NULL, &t, &(bool){0},
                                  &f->err),
                     -EEXIST);
    assert_non_null(queue_find(&f->set, f->pool, "s"));
    assert_int_equal(queue_close_roles(&f->set, s, &conn_a, QUEUE_ROLE_ANY, -1, &closed,
                                       &f->err),
                     0);
    assert_null(queue_find(&f->set, f->pool, "s"));
    s = make(f, "s", 1, false);
    queue_shutdown(&f->set, s);
    assert_null(queue_find(&f->set, f->pool, "s"));
    assert_int_equal(count_fds(), fds - 1);
}

/* Proves queue_delete: EBUSY naming the writer and the live seats; a dead
 * seat does not hold it. */
static void test_delete(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    uint32_t seat;
    uint64_t epoch;

    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 1, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_delete(&f->set, q, NULL, &f->err), -EBUSY);
    assert_non_null(strstr(f->err.message, "the writer, client 1 (pid 1001, 'a')"));
    assert_non_null(strstr(f->err.message, "seat 1, client 2 (pid 1002, 'b')"));
    queue_owner_gone(&f->set, &conn_a);
    assert_int_equal(queue_delete(&f->set, q, NULL, &f->err), -EBUSY);
    queue_owner_gone(&f->set, &conn_b); /* seat 1 dead */
    assert_int_equal(queue_delete(&f->set, q, NULL, &f->err), 0);
    assert_int_equal(queue_count(&f->set, NULL), 0);
}

/* Make committed objects keys[0..n-1] in store s. */
static void put_keys(struct fixture *f, const char *const *keys, size_t n)
{
    struct store *s = f->pool->store;
    struct store_holder *h = store_holder_new(s);
    struct store_extent ext;
    size_t i;

    for (i = 0; i < n; i++) {
        assert_int_equal(store_alloc(s, h, keys[i], strlen(keys[i]), 100, 0, &ext, &f->err), 0);
        assert_int_equal(store_commit(s, h, keys[i], strlen(keys[i]), &f->err), 0);
    }
    store_holder_free(s, h);
}

/* Proves that deleting a queue deletes, by key, the pool's objects of the
 * messages still in its ring ("q/<name>/<seq>", seq in [head - slots,
 * head]) and no other: not those of other queues, and not a walk of the
 * prefix (an object out of that range stays). A scribbled head cannot make
 * it loop or reach out of the prefix. */
static void test_delete_objects(void **state)
{
    struct fixture *f = *state;
    struct store *s = f->pool->store;
    const char *keys[] = {"q/q/1", "q/q/2", "q/q/6", "q/q/7", "q/qq/3", "q/other/3", "q/q"};
    struct queue *q = make(f, "q", 1, false);
    struct shmb_q w;
    int i;

    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    for (i = 0; i < 6; i++) /* no live seat: nothing holds the writer */
        assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), 0);
    put_keys(f, keys, sizeof(keys) / sizeof(keys[0]));
    assert_int_equal(queue_delete(&f->set, q, NULL, &f->err), 0);
    assert_false(store_contains(s, "q/q/2", 5)); /* head 6, 4 slots: 2..6 */
    assert_false(store_contains(s, "q/q/6", 5));
    assert_true(store_contains(s, "q/q/1", 5));
    assert_true(store_contains(s, "q/q/7", 5));
    assert_true(store_contains(s, "q/qq/3", 6));
    assert_true(store_contains(s, "q/other/3", 9));
    assert_true(store_contains(s, "q/q", 3));
    q = make(f, "z", 1, false);
    atomic_store(&q->q.hdr->head, UINT64_MAX);
    assert_int_equal(queue_delete(&f->set, q, NULL, &f->err), 0);
    assert_true(store_contains(s, "q/q/7", 5));
}

/* Proves that a queue created where an earlier one of its name left
 * objects (a restart, or an overflow committed after it went) deletes
 * those its first messages would collide with, "q/<name>/0" to
 * "q/<name>/<slots>", and no other; finding it again deletes nothing. */
static void test_create_drops_leftovers(void **state)
{
    struct fixture *f = *state;
    struct store *s = f->pool->store;
    const char *keys[] = {"q/q/0", "q/q/4", "q/q/5", "q/qq/0"};
    const char *again[] = {"q/q/1"};
    struct queue *q = NULL;
    bool created;

    put_keys(f, keys, sizeof(keys) / sizeof(keys[0]));
    make(f, "q", 1, false);
    assert_false(store_contains(s, "q/q/0", 5));
    assert_false(store_contains(s, "q/q/4", 5));
    assert_true(store_contains(s, "q/q/5", 5));
    assert_true(store_contains(s, "q/qq/0", 6));
    put_keys(f, again, 1);
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 4, 64, false, NULL, &q, &created,
                                  &f->err),
                     0);
    assert_false(created);
    assert_true(store_contains(s, "q/q/1", 5));
}

/* Proves that what status shows of a scribbled area stays within what can
 * be: messages a JSON integer, behind and depth at most slots, readers
 * waiting at most seats; a scribbled epoch starts again rather than be
 * reported negative. */
static void test_status_scribbled(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    struct queue_status st;
    uint32_t seat;
    uint64_t epoch;

    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    atomic_store(&q->q.hdr->head, UINT64_MAX);
    atomic_store(&q->q.seat[0].next, 0);
    atomic_store(&q->q.hdr->readers_waiting, UINT32_MAX);
    atomic_store(&q->q.seat[1].epoch, UINT64_MAX - 5);
    queue_status(q, &st);
    assert_true(st.messages <= (uint64_t)INT64_MAX);
    assert_int_equal(st.behind[0], 4);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.readers_waiting, 2);
    assert_int_equal(queue_open_reader(q, 1, &conn_c, &b, &seat, &epoch, &f->err), 0);
    assert_true(epoch <= (uint64_t)INT64_MAX);
    assert_int_equal(epoch, atomic_load(&q->q.seat[1].epoch));
}

/* Proves that scribbled state words (the queue's, writer_live, the writer
 * epoch, a seat's)
 * are written back from the daemon's records before the next open. */
static void test_restore_state(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    unsigned closed;
    uint32_t seat;
    uint64_t epoch;

    atomic_store(&q->q.hdr->state, 7);
    queue_restore_header(q);
    assert_int_equal(atomic_load(&q->q.hdr->state), SHMB_QUEUE_OPEN);
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_WRITER, -1, &closed,
                                       &f->err),
                     0);
    atomic_store(&q->q.hdr->state, 0xffffffffu);
    atomic_store(&q->q.hdr->writer_live, 1);
    atomic_store(&q->q.hdr->writer_epoch, 99);
    atomic_store(&q->q.seat[0].state, SHMB_SEAT_FREE);
    atomic_store(&q->q.seat[1].state, SHMB_SEAT_LIVE);
    queue_restore_header(q);
    assert_int_equal(atomic_load(&q->q.hdr->state), SHMB_QUEUE_WRITER_GONE);
    assert_int_equal(atomic_load(&q->q.hdr->writer_live), 0);
    assert_int_equal(atomic_load(&q->q.hdr->writer_epoch), 1);
    assert_int_equal(atomic_load(&q->q.seat[0].state), SHMB_SEAT_LIVE);
    assert_int_equal(atomic_load(&q->q.seat[1].state), SHMB_SEAT_FREE);
    queue_shutdown(&f->set, q);
    atomic_store(&q->q.hdr->state, SHMB_QUEUE_OPEN);
    queue_restore_header(q);
    assert_int_equal(atomic_load(&q->q.hdr->state), SHMB_QUEUE_SHUTDOWN);
}

/* Proves that a seat is a blocker only while a writer holds the queue: a
 * full ring whose writer has gone (and whose writer_waiting word says
 * otherwise) has none, and no writer waiting. */
static void test_blocker_needs_writer(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 1, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    struct queue_status st;
    struct shmb_q w;
    unsigned closed;
    uint32_t seat;
    uint64_t epoch;
    int i;

    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    w.writer_epoch = q->writer_epoch;
    for (i = 0; i < 4; i++)
        assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), 0);
    queue_status(q, &st);
    assert_int_equal(st.blocker, 0);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_WRITER, -1, &closed,
                                       &f->err),
                     0);
    atomic_store(&q->q.hdr->writer_waiting, 1);
    queue_status(q, &st);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.blocker, -1);
    assert_false(st.writer_waiting);
}

/* Proves the size cap: a geometry within the host's memory but over 1 GiB
 * is EINVAL with the numbers, nothing made. */
static void test_size_cap(void **state)
{
    struct fixture *f = *state;
    struct queue *q = NULL;
    bool created = true;
    int fds = count_fds();
    int rc = queue_create(&f->set, f->pool, "big", 1, 2, SHMB_QUEUE_SLOT_SIZE_MAX, false, NULL, &q,
                          &created, &f->err);

    if (rc == -ENOMEM) {
        print_message("SKIP: test_size_cap: this host has less than 2 GiB of memory left\n");
        skip();
    }
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(f->err.message, "at most 1073741824 bytes (1 GiB)"));
    assert_false(created);
    assert_null(queue_find(&f->set, f->pool, "big"));
    assert_int_equal(count_fds(), fds);
}

/* The limit of descriptors that leaves exactly n free (n <= 16). */
static rlim_t limit_leaving(int n)
{
    int fds[16], i, top = 0;

    for (i = 0; i < n; i++) {
        fds[i] = dup(0);
        assert_true(fds[i] >= 0);
        top = fds[i] > top ? fds[i] : top;
    }
    for (i = 0; i < n; i++)
        close(fds[i]);
    return (rlim_t)top + 1;
}

/* Proves that a queue is not created into the daemon's last descriptors:
 * EMFILE with the numbers and a hint, nothing made, descriptors kept. */
static void test_fd_spare(void **state)
{
    struct fixture *f = *state;
    struct queue *q = NULL;
    struct rlimit old, lim;
    bool created = true;
    int fds = count_fds(), rc;

    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    lim.rlim_cur = limit_leaving(QUEUE_FD_SPARE); /* one short of a queue and the spare */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    rc = queue_create(&f->set, f->pool, "q", 1, 4, 64, false, NULL, &q, &created, &f->err);
    assert_int_equal(queue_check_fds(2, "open queue 'q'", &f->err), 0);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, -EMFILE);
    assert_false(created);
    assert_non_null(strstr(f->err.message, "Cannot create queue 'q'"));
    assert_non_null(strstr(f->err.message, "ulimit -n"));
    assert_int_equal(count_fds(), fds);
    lim.rlim_cur = limit_leaving(1);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    rc = queue_check_fds(2, "open queue 'q'", &f->err);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, -EMFILE);
    assert_non_null(strstr(f->err.message, "Cannot open queue 'q': shmbrokerd has 1 file"));
    make(f, "q", 1, false);
}

/* Proves the status: messages, depth, behind per seat, and the blocker only
 * while the slowest live seat holds the writer back. */
static void test_status_blocker(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    struct queue_status st;
    struct shmb_q w, r;
    const void *data;
    size_t len;
    uint32_t seat;
    uint64_t epoch;
    int i;

    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 1, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    w.writer_epoch = q->writer_epoch;
    assert_int_equal(shmb_q_attach(&r, q->base, q->size, &f->err), 0);
    for (i = 0; i < 3; i++)
        assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), 0);
    assert_int_equal(shmb_q_dequeue(&r, 1, &data, &len, 0, &f->err), 0);
    shmb_q_done(&r, 1);
    queue_status(q, &st);
    assert_int_equal(st.messages, 3);
    assert_int_equal(st.depth, 3);
    assert_int_equal(st.behind[0], 3);
    assert_int_equal(st.behind[1], 2);
    assert_int_equal(st.blocker, -1); /* 3 < 4 slots: nobody held back */
    assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), 0);
    queue_status(q, &st);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.blocker, 0);
    assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), -ETIMEDOUT);
    /* Seat 0's connection goes: the writer goes on, the blocker is seat 1. */
    q->seat[0].owner = &conn_c;
    queue_owner_gone(&f->set, &conn_c);
    assert_int_equal(shmb_q_enqueue(&w, "hi", 2, 0, &f->err), 0);
    queue_status(q, &st);
    assert_int_equal(st.depth, 4);
    assert_int_equal(st.blocker, 1);
    assert_int_equal(st.dead, 1);
    assert_int_equal(st.behind[0], 0);
}

/* Proves that a scribbled header is put back before the next member
 * attaches, and the dynamic words are left alone. */
static void test_restore_header(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct shmb_q view;

    assert_int_equal(shmb_q_attach(&view, q->base, q->size, &f->err), 0);
    assert_int_equal(shmb_q_enqueue(&view, "x", 1, 0, &f->err), 0);
    q->q.hdr->magic = 0;
    q->q.hdr->seats = 60;
    q->q.hdr->slot_stride = 1;
    memset(q->q.hdr->name, 'x', sizeof(q->q.hdr->name));
    assert_int_not_equal(shmb_q_attach(&view, q->base, q->size, &f->err), 0);
    queue_restore_header(q);
    assert_int_equal(shmb_q_attach(&view, q->base, q->size, &f->err), 0);
    assert_int_equal(view.seats, 2);
    assert_string_equal(q->q.hdr->name, "q");
    assert_int_equal(atomic_load(&q->q.hdr->head), 1);
}

/* Proves that the daemon's stop shuts every queue down and a pool's queues
 * go with it. */
static void test_shutdown_all_and_drop_pool(void **state)
{
    struct fixture *f = *state;
    struct queue *a = make(f, "a", 1, false), *b = make(f, "b", 1, false);
    struct queue_status st;

    queue_shutdown_all(&f->set);
    assert_int_equal(atomic_load(&a->q.hdr->state), SHMB_QUEUE_SHUTDOWN);
    assert_int_equal(atomic_load(&b->q.hdr->state), SHMB_QUEUE_SHUTDOWN);
    queue_status(b, &st);
    assert_string_equal(st.state, "shutdown");
    assert_int_equal(queue_count(&f->set, f->pool), 2);
    queue_drop_pool(&f->set, f->pool);
    assert_int_equal(queue_count(&f->set, NULL), 0);
}

/* Proves that the objects of queues of an earlier run (every key under
 * "q/") go at an adopting start, and nothing else. */
static void test_drop_orphans(void **state)
{
    struct fixture *f = *state;
    const char *keys[] = {"q/a/0", "keep", "q/b/17", "qq/x", "q"};

    put_keys(f, keys, 5);
    assert_int_equal(queue_drop_orphans(f->pool), 2);
    assert_false(store_contains(f->pool->store, "q/a/0", 5));
    assert_false(store_contains(f->pool->store, "q/b/17", 6));
    assert_true(store_contains(f->pool->store, "keep", 4));
    assert_true(store_contains(f->pool->store, "qq/x", 4));
    assert_true(store_contains(f->pool->store, "q", 1));
    assert_int_equal(queue_drop_orphans(f->pool), 0);
}

/* Proves a pool's bounds: past max_queues, and past max_queue_bytes (the
 * queues it has plus the new one), queue_create is EDQUOT naming the
 * option, with the numbers, and makes nothing; the same geometry is still
 * found; another pool is not held to them; 0 is no bound of the pool's. */
static void test_pool_bounds(void **state)
{
    struct fixture *f = *state;
    struct queue *q = NULL;
    bool created;
    size_t one = shmb_q_size(1, 4, 64);
    int fds;

    f->pool->cfg.max_queues = 2;
    make(f, "a", 1, false);
    make(f, "b", 1, false);
    fds = count_fds();
    assert_int_equal(queue_create(&f->set, f->pool, "c", 1, 4, 64, false, NULL, &q, &created,
                                  &f->err),
                     -EDQUOT);
    assert_non_null(strstr(f->err.message, "Pool 'p' has 2 queues, its limit (max-queues= "
                                           "of pool 'p', or --max-queues)"));
    assert_int_equal(count_fds(), fds);
    assert_int_equal(queue_create(&f->set, f->pool, "a", 1, 4, 64, false, NULL, &q, &created,
                                  &f->err),
                     0);
    assert_false(created);
    f->pool->cfg.max_queues = 0;
    f->pool->cfg.max_queue_bytes = 3 * one - 1;
    assert_int_equal(queue_create(&f->set, f->pool, "c", 1, 4, 64, false, NULL, &q, &created,
                                  &f->err),
                     -EDQUOT);
    assert_non_null(strstr(f->err.message, "max-queue-bytes= of pool 'p'"));
    assert_non_null(strstr(f->err.message, "--max-queue-bytes"));
    assert_null(queue_find(&f->set, f->pool, "c"));
    f->pool->cfg.max_queue_bytes = 3 * one;
    make(f, "c", 1, false);
    assert_int_equal(queue_bytes(&f->set, f->pool), 3 * one);
    assert_int_equal(queue_count(&f->set, f->pool), 3);
}

/* Proves the lease: a queue nobody holds goes once lease_ms has passed
 * since it was made or since its last member left, not before; one a
 * writer or a live seat holds stays; 0 turns it off. */
static void test_lease(void **state)
{
    struct fixture *f = *state;
    struct queue_member w = member(1, "w");
    struct queue *idle = make(f, "idle", 1, false), *held = make(f, "held", 1, false);
    uint64_t now = clock_now_ms(), epoch;
    uint32_t seat;
    unsigned closed;

    assert_int_equal(queue_expire(&f->set, now + 3600000), 0); /* off */
    f->set.lease_ms = 1000;
    assert_int_equal(queue_open_writer(held, &conn_a, &w, &f->err), 0);
    assert_int_equal(queue_expire(&f->set, now + 950), 0);
    assert_int_equal(queue_expire(&f->set, now + 60000), 1);
    assert_null(queue_find(&f->set, f->pool, "idle"));
    assert_non_null(queue_find(&f->set, f->pool, "held"));
    (void)idle;
    /* The writer leaves, a reader comes and dies: nobody holds it from then. */
    assert_int_equal(queue_close_roles(&f->set, held, &conn_a, QUEUE_ROLE_ANY, -1, &closed,
                                       &f->err),
                     0);
    assert_int_equal(queue_open_reader(held, -1, &conn_b, &w, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_expire(&f->set, now + 120000), 0);
    queue_owner_gone(&f->set, &conn_b);
    now = clock_now_ms();
    assert_int_equal(queue_expire(&f->set, now + 500), 0);
    assert_int_equal(queue_expire(&f->set, now + 1001), 1);
    assert_int_equal(queue_count(&f->set, NULL), 0);
}

/* An offload that keeps the jobs for the test to run. */
static struct queue_job *jobs[4];
static int n_jobs;

static int keep_job(void *arg, struct queue_job *job)
{
    (void)arg;
    jobs[n_jobs++] = job;
    return 0;
}

/* A waiter that records its answer. */
struct answer {
    struct queue_waiter w;
    int calls, rc;
    const struct queue *q;
};

static void answered(struct queue_waiter *w, int rc, const struct shmb_error *err,
                     const struct queue *q)
{
    struct answer *a = (struct answer *)w;

    (void)err;
    a->calls++;
    a->rc = rc;
    a->q = q;
}

/* Proves creation and deletion off the loop: a queue being made counts
 * against the bounds and is found by a second create (which waits with
 * the first, or is EEXIST for another geometry, or EBUSY without a
 * waiter), but is served to nobody until its job has run and finished;
 * then its waiters are answered in order, a cancelled one not at all. A
 * delete takes the queue out at once and answers when its memory is
 * freed. */
static void test_offload(void **state)
{
    struct fixture *f = *state;
    struct answer first = {.w.done = answered}, second = {.w.done = answered},
                  gone = {.w.done = answered}, del = {.w.done = answered};
    struct queue *q = NULL;
    bool created;

    n_jobs = 0;
    f->set.offload = keep_job;
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 4, 64, false, &first.w, &q,
                                  &created, &f->err),
                     -EINPROGRESS);
    assert_true(created);
    assert_int_equal(n_jobs, 1);
    assert_null(queue_find(&f->set, f->pool, "q"));
    assert_int_equal(queue_count(&f->set, f->pool), 1);
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 4, 64, false, &second.w, &q,
                                  &created, &f->err),
                     -EINPROGRESS);
    assert_false(created);
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 4, 64, false, &gone.w, &q,
                                  &created, &f->err),
                     -EINPROGRESS);
    queue_waiter_cancel(&gone.w);
    assert_int_equal(queue_create(&f->set, f->pool, "q", 2, 4, 64, false, &gone.w, &q,
                                  &created, &f->err),
                     -EEXIST);
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 4, 64, false, NULL, &q,
                                  &created, &f->err),
                     -EBUSY);
    assert_int_equal(n_jobs, 1);
    queue_job_run(jobs[0]);
    assert_int_equal(first.calls, 0);
    queue_job_finish(jobs[0]);
    assert_int_equal(first.calls, 1);
    assert_int_equal(first.rc, 0);
    assert_int_equal(second.calls, 1);
    assert_int_equal(gone.calls, 0);
    q = queue_find(&f->set, f->pool, "q");
    assert_non_null(q);
    assert_ptr_equal(first.q, q);
    assert_ptr_equal(second.q, q);
    assert_int_equal(queue_delete(&f->set, q, &del.w, &f->err), -EINPROGRESS);
    assert_null(queue_find(&f->set, f->pool, "q"));
    assert_int_equal(queue_count(&f->set, NULL), 0);
    assert_int_equal(n_jobs, 2);
    queue_job_run(jobs[1]);
    assert_int_equal(del.calls, 0);
    queue_job_finish(jobs[1]);
    assert_int_equal(del.calls, 1);
    assert_int_equal(del.rc, 0);
    f->set.offload = NULL;
}

/* Proves that the queues being made count against the descriptors a
 * creation must leave: each takes one once its job runs, so a second
 * creation while the first's memfd is not open yet, with room for one
 * queue and the spare only, is EMFILE, not a queue that would take a
 * descriptor kept for new clients. */
static void test_fd_spare_making(void **state)
{
    struct fixture *f = *state;
    struct answer a = {.w.done = answered}, b = {.w.done = answered};
    struct queue *q = NULL;
    struct rlimit old, lim;
    bool created;
    int rc;

    n_jobs = 0;
    f->set.offload = keep_job;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    lim = old;
    lim.rlim_cur = limit_leaving(QUEUE_FD_SPARE + 1); /* one queue and the spare */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0);
    rc = queue_create(&f->set, f->pool, "a", 1, 4, 64, false, &a.w, &q, &created, &f->err);
    assert_int_equal(rc, -EINPROGRESS);
    rc = queue_create(&f->set, f->pool, "b", 1, 4, 64, false, &b.w, &q, &created, &f->err);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_int_equal(rc, -EMFILE);
    assert_non_null(strstr(f->err.message, "Cannot create queue 'b'"));
    while (n_jobs > 0) {
        queue_job_run(jobs[n_jobs - 1]);
        queue_job_finish(jobs[--n_jobs]);
    }
    assert_int_equal(a.rc, 0);
    assert_non_null(queue_find(&f->set, f->pool, "a"));
    f->set.offload = NULL;
}

/* Proves that a queue deleted off the loop frees all it had, its record of
 * the writer's overflow objects included: the job that frees its pages
 * used to free the queue without that record, so a client creating,
 * overflowing and deleting queues (or temporary queues going with their
 * members) grew the daemon by up to 512 KiB a queue, for ever. */
static void test_offload_frees_overflow_record(void **state)
{
    struct fixture *f = *state;
    struct answer made = {.w.done = answered}, del = {.w.done = answered};
    struct queue_member a = member(1, "a");
    struct queue *q = NULL;
    long before = shmb_alloc_live();
    char key[64];
    bool created;
    int i;

    n_jobs = 0;
    f->set.offload = keep_job;
    assert_int_equal(queue_create(&f->set, f->pool, "q", 1, 64, 64, false, &made.w, &q,
                                  &created, &f->err),
                     -EINPROGRESS);
    assert_int_equal(n_jobs, 1);
    queue_job_run(jobs[0]);
    queue_job_finish(jobs[0]);
    q = queue_find(&f->set, f->pool, "q");
    assert_non_null(q);
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "q/q/%d", i);
        queue_overflow_made(&f->set, f->pool, &conn_a, key, strlen(key));
    }
    assert_int_equal(q->overflow_n, 40);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_a, QUEUE_ROLE_WRITER, -1,
                                       &(unsigned){0}, &f->err),
                     0);
    assert_int_equal(queue_delete(&f->set, q, &del.w, &f->err), -EINPROGRESS);
    assert_int_equal(n_jobs, 2);
    queue_job_run(jobs[1]);
    queue_job_finish(jobs[1]);
    assert_int_equal(del.calls, 1);
    assert_int_equal(shmb_alloc_live(), before);
    f->set.offload = NULL;
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

/* The awaited reads of key in f's pool (-1: no such object). */
static int awaited_cb(const struct store_entry *e, void *arg)
{
    *(long *)arg = (long)e->awaited_reads;
    return 1;
}

static long awaited(struct fixture *f, const char *key)
{
    long n = -1;

    store_list(f->pool->store, key, strlen(key), 1, awaited_cb, &n);
    return n;
}

/* The writer (conn_a) of q allocates and commits the overflow object of its
 * next message, as the daemon's alloc does, then publishes the message. */
static void overflow_message(struct fixture *f, struct queue *q, struct shmb_q *w,
                             struct store_holder *h)
{
    char key[64];
    uint32_t readers = 0;
    uint64_t seq = atomic_load(&q->q.hdr->head);
    struct store_extent ext;

    snprintf(key, sizeof(key), "q/%s/%llu", q->name, (unsigned long long)seq);
    queue_overflow_readers(&f->set, f->pool, &conn_a, key, strlen(key), &readers);
    assert_int_equal(store_alloc(f->pool->store, h, key, strlen(key), 100, readers, &ext, &f->err),
                     0);
    queue_overflow_made(&f->set, f->pool, &conn_a, key, strlen(key));
    assert_int_equal(store_commit(f->pool->store, h, key, strlen(key), &f->err), 0);
    assert_int_equal(shmb_q_enqueue(w, "k", 1, 0, &f->err), 0);
}

/* Issue 24: a reader seat that leaves forgoes its reads of the overflow
 * objects the writer made, whatever a member wrote in the area's head, and
 * does not scan a ring of slots to find them. Proves that with the head
 * scribbled far past the messages (the old scan looked only there) the
 * leaving seat's awaited reads are given back; with the head scribbled
 * below the seat, too; and that an object of the queue's prefix which the
 * writer did not allocate is left alone (the daemon follows its own record
 * of the writer's overflows, not the area's numbers). */
static void test_forgo_reads_scribbled_head(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b"), c = member(3, "c");
    struct store_holder *h = store_holder_new(f->pool->store);
    struct store_holder *hb = store_holder_new(f->pool->store);
    struct store_holder *hc = store_holder_new(f->pool->store);
    const char *foreign[] = {"q/q/9"};
    struct shmb_q w;
    uint32_t seat;
    uint64_t epoch;
    unsigned closed;

    b.holder = hb;
    c.holder = hc;
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 1, &conn_c, &c, &seat, &epoch, &f->err), 0);
    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    w.writer_epoch = q->writer_epoch;
    overflow_message(f, q, &w, h);
    overflow_message(f, q, &w, h);
    overflow_message(f, q, &w, h);
    assert_int_equal(awaited(f, "q/q/0"), 2);
    assert_int_equal(awaited(f, "q/q/2"), 2);
    /* Seat 0 has read nothing; the head is scribbled far ahead. */
    atomic_store(&q->q.hdr->head, UINT64_C(1) << 62);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_b, QUEUE_ROLE_READER, 0, &closed,
                                       &f->err),
                     0);
    assert_int_equal(awaited(f, "q/q/0"), 1);
    assert_int_equal(awaited(f, "q/q/1"), 1);
    assert_int_equal(awaited(f, "q/q/2"), 1);
    /* Seat 1 read message 0; the head is scribbled below it. */
    atomic_store(&q->q.hdr->head, 0);
    atomic_store(&q->q.seat[1].next, 1);
    put_keys(f, foreign, 1);
    assert_int_equal(store_touch(f->pool->store, "q/q/9", 5, 1, &f->err), 0);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_c, QUEUE_ROLE_READER, 1, &closed,
                                       &f->err),
                     0);
    assert_int_equal(awaited(f, "q/q/0"), 1);
    assert_int_equal(awaited(f, "q/q/1"), 0);
    assert_int_equal(awaited(f, "q/q/2"), 0);
    assert_int_equal(awaited(f, "q/q/9"), 1);
    store_holder_free(f->pool->store, hb);
    store_holder_free(f->pool->store, hc);
    store_holder_free(f->pool->store, h);
}

/* The writer (conn_a) allocates and commits the overflow object key, as
 * the daemon's alloc does, without publishing it. */
static void overflow_object(struct fixture *f, struct store_holder *h, const char *key)
{
    uint32_t readers = 0;
    struct store_extent ext;

    queue_overflow_readers(&f->set, f->pool, &conn_a, key, strlen(key), &readers);
    assert_int_equal(store_alloc(f->pool->store, h, key, strlen(key), 100, readers, &ext, &f->err),
                     0);
    queue_overflow_made(&f->set, f->pool, &conn_a, key, strlen(key));
    assert_int_equal(store_commit(f->pool->store, h, key, strlen(key), &f->err), 0);
}

/* Proves that the record takes every seq a key can carry, up to 2^64 - 1
 * (the seqs a writer numbers from a head scribbled near 2^64): the parse
 * refused the six highest as overflowing, so a seat leaving kept its reads
 * of those objects, and they held reclaim for ever. A number past 2^64 - 1,
 * or with a leading zero, is no seq: its object is left alone. */
static void test_record_seqs_near_2_64(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 1, false);
    struct queue_member a = member(1, "a"), b = member(2, "b");
    struct store_holder *h = store_holder_new(f->pool->store);
    struct store_holder *hb = store_holder_new(f->pool->store);
    const char *keys[] = {"q/q/18446744073709551611", "q/q/18446744073709551614",
                          "q/q/18446744073709551615"};
    const char *foreign[] = {"q/q/18446744073709551616", "q/q/018446744073709551615"};
    uint32_t seat;
    uint64_t epoch;
    unsigned closed;
    size_t i;

    b.holder = hb;
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        overflow_object(f, h, keys[i]);
    for (i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++)
        overflow_object(f, h, foreign[i]);
    assert_int_equal(q->overflow_n, 3);
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        assert_int_equal(awaited(f, keys[i]), 1);
    assert_int_equal(queue_close_roles(&f->set, q, &conn_b, QUEUE_ROLE_READER, 0, &closed,
                                       &f->err),
                     0);
    for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        assert_int_equal(awaited(f, keys[i]), 0);
    for (i = 0; i < sizeof(foreign) / sizeof(foreign[0]); i++)
        assert_int_equal(awaited(f, foreign[i]), 1);
    store_holder_free(f->pool->store, hb);
    store_holder_free(f->pool->store, h);
}

/* Proves that a reader that died holding the message it stood at (it took
 * the object's pin, and with it its read) does not forgo that read again,
 * whatever a member wrote in the area's head: the check asked for the
 * message to be below the head too, so a head scribbled down to it gave
 * the read back twice and the object awaited none while another live seat
 * had still to read it (reclaim could take it from under that reader). */
static void test_forgo_pinned_scribbled_head(void **state)
{
    struct fixture *f = *state;
    struct queue *q = make(f, "q", 2, false);
    struct queue_member a = member(1, "a"), b = member(2, "b"), c = member(3, "c");
    struct store_holder *h = store_holder_new(f->pool->store);
    struct store_holder *hb = store_holder_new(f->pool->store);
    struct store_holder *hc = store_holder_new(f->pool->store);
    struct store_extent ext;
    struct shmb_q w;
    uint32_t seat;
    uint64_t epoch;

    b.holder = hb;
    c.holder = hc;
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 0, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 1, &conn_c, &c, &seat, &epoch, &f->err), 0);
    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    w.writer_epoch = q->writer_epoch;
    overflow_message(f, q, &w, h);
    assert_int_equal(awaited(f, "q/q/0"), 2);
    /* Seat 0 takes message 0's object and dies before it moves on. */
    assert_int_equal(store_get(f->pool->store, hb, "q/q/0", 5, &ext, &f->err), 0);
    assert_int_equal(awaited(f, "q/q/0"), 1);
    atomic_store(&q->q.hdr->head, 0);
    assert_int_equal(queue_owner_gone(&f->set, &conn_b), 1);
    assert_int_equal(awaited(f, "q/q/0"), 1);
    store_holder_free(f->pool->store, hb);
    store_holder_free(f->pool->store, hc);
    store_holder_free(f->pool->store, h);
}

/* Proves that a connection holding many seats of a queue costs, when it
 * closes, about one store lookup per overflow object, not one per seat and
 * object: 64 seats of a 65,536-slot queue whose every slot had overflowed
 * held the daemon's loop ~2.8 s (4.2 million lookups), every pool's clients
 * with it. And that the reads are forgone as before: each object awaits
 * the reads of the seats that stay and had not read it, no more (a seat of
 * the closing connection at a message it pinned counts as having read it). */
static void test_forgo_many_seats_one_pass(void **state)
{
    struct fixture *f = *state;
    struct queue *q = NULL;
    struct queue_member a = member(1, "a"), b = member(2, "b"), c = member(3, "c");
    struct store_holder *h = store_holder_new(f->pool->store);
    struct store_holder *hb = store_holder_new(f->pool->store);
    struct store_holder *hc = store_holder_new(f->pool->store);
    struct store_extent ext;
    struct shmb_q w;
    uint32_t seat, s;
    uint64_t epoch;
    bool created;
    char key[64];
    int i;

    b.holder = hb;
    c.holder = hc;
    assert_int_equal(queue_create(&f->set, f->pool, "q", 16, 64, 64, false, NULL, &q,
                                  &created, &f->err),
                     0);
    assert_int_equal(queue_open_writer(q, &conn_a, &a, &f->err), 0);
    /* Seats 0..14 are one connection's, seat 15 another's. */
    for (s = 0; s < 15; s++)
        assert_int_equal(
            queue_open_reader(q, (int)s, &conn_b, &b, &seat, &epoch, &f->err), 0);
    assert_int_equal(queue_open_reader(q, 15, &conn_c, &c, &seat, &epoch, &f->err), 0);
    assert_int_equal(shmb_q_attach(&w, q->base, q->size, &f->err), 0);
    w.writer_epoch = q->writer_epoch;
    for (i = 0; i < 40; i++)
        overflow_message(f, q, &w, h);
    assert_int_equal(awaited(f, "q/q/0"), 16);
    /* Seats 0..4 read up to message 10, seat 5 holds message 10 (pinned,
     * its read taken), seats 6..14 read nothing; seat 15 read up to 20. */
    for (s = 0; s < 6; s++)
        atomic_store(&q->q.seat[s].next, 10);
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "q/q/%d", i);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
    }
    assert_int_equal(store_get(f->pool->store, hb, "q/q/10", 6, &ext, &f->err), 0);
    atomic_store(&q->q.seat[15].next, 20);
    for (i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "q/q/%d", i);
        assert_int_equal(store_forgo_read(f->pool->store, key, strlen(key)), 0);
    }
    assert_int_equal(awaited(f, "q/q/0"), 9);
    assert_int_equal(awaited(f, "q/q/10"), 14);
    key_lookups = 0;
    assert_int_equal(queue_owner_gone(&f->set, &conn_b), 15);
    assert_true(key_lookups <= 2 * 40);
    /* What stays awaited is seat 15's, where it has not read. */
    for (i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "q/q/%d", i);
        assert_int_equal(awaited(f, key), i < 20 ? 0 : 1);
    }
    store_holder_free(f->pool->store, hb);
    store_holder_free(f->pool->store, hc);
    store_holder_free(f->pool->store, h);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_create),
        TEST(test_limits),
        TEST(test_open),
        TEST(test_owner_gone),
        TEST(test_close_roles),
        TEST(test_auto_delete),
        TEST(test_delete),
        TEST(test_delete_objects),
        TEST(test_status_blocker),
        TEST(test_restore_header),
        TEST(test_shutdown_all_and_drop_pool),
        TEST(test_create_drops_leftovers),
        TEST(test_status_scribbled),
        TEST(test_restore_state),
        TEST(test_blocker_needs_writer),
        TEST(test_size_cap),
        TEST(test_fd_spare),
        TEST(test_drop_orphans),
        TEST(test_pool_bounds),
        TEST(test_lease),
        TEST(test_offload),
        TEST(test_forgo_reads_scribbled_head),
        TEST(test_fd_spare_making),
        TEST(test_offload_frees_overflow_record),
        TEST(test_record_seqs_near_2_64),
        TEST(test_forgo_pinned_scribbled_head),
        TEST(test_forgo_many_seats_one_pass),
    };

    return cmocka_run_group_tests_name("test_daemon_queue", tests, NULL, NULL);
}
