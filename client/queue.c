// SPDX-License-Identifier: Apache-2.0
/*
 * The library's broadcast queues: the ops that create, open, close, shut
 * down, delete and list them (one round trip each, through client.c), and
 * the public data path over proto/queue.c's shmb_q_* (its waits are
 * queue_wait.c's; messages longer than a slot go as objects of the
 * connection's pool, queue_overflow.c's). Knows nothing of the daemon's
 * insides; the area's layout is proto/layout_queue.h's.
 */
#include "queue_inner.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../proto/alloc.h"

/* wait_ready looks this often: a start-up call, not a data path. */
#define QUEUE_READY_POLL_NS 1000000L
/* shmb_queue_close waits this long between looks while another thread's
 * call holds the connection. */
#define QUEUE_CLOSE_NAP_NS 1000000L

/* Refuse a call on q in a process made by fork() since q was opened: the
 * area and the seat are the parent's, and a child reading or writing them
 * would take the parent's messages or corrupt its stream. Nothing is
 * touched. */
static int queue_forked(shmb_queue_t *q, const char *call)
{
    return shmb_error_set(&q->c->err, -ECHILD,
                          "%s: queue '%s' was opened by another process, and this one "
                          "was made by fork() since: its %s belongs to the parent. "
                          "Nothing was touched. In the child, connect a new handle and "
                          "open the queue again.",
                          call, q->name,
                          q->seat == SHMB_QUEUE_WRITER ? "writer role" : "reader seat");
}

/* 0 when q is this process's (a load and a compare), else -ECHILD. */
static inline int queue_check_fork(shmb_queue_t *q, const char *call)
{
    if (__builtin_expect(
            q->forks == atomic_load_explicit(&client_forks, memory_order_relaxed), 1))
        return 0;
    return queue_forked(q, call);
}

/* Refuse a name before anything is sent when it cannot be one, by the
 * daemon's own rule and in its words. */
static int queue_check_name(shmb_t *c, const char *name)
{
    return shmb_q_name_check(name, name != NULL ? strlen(name) : 0, &c->err);
}

/* ---- the ops -------------------------------------------------------------- */

static int queue_create(shmb_t *c, const char *name, uint32_t seats, uint64_t slots,
                        uint64_t slot_size, unsigned flags)
{
    json_t *req;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = queue_check_name(c, name)) < 0)
        return rc;
    if (slots > INT64_MAX || slot_size > INT64_MAX ||
        (flags & ~SHMB_QUEUE_TEMPORARY) != 0)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_queue_create: slots and slot_size are below 2^63 and "
                              "flags is 0 or SHMB_QUEUE_TEMPORARY. Nothing was sent.");
    req = json_pack("{s:s, s:s, s:I}", "op", shmb_ops[SHMB_OP_QUEUE_CREATE].name, "name",
                    name, "seats", (json_int_t)seats);
    if (req != NULL &&
        ((slots != 0 &&
          json_object_set_new(req, "slots", json_integer((json_int_t)slots))) ||
         (slot_size != 0 &&
          json_object_set_new(req, "slot_size", json_integer((json_int_t)slot_size))) ||
         ((flags & SHMB_QUEUE_TEMPORARY) &&
          json_object_set_new(req, "temporary", json_true())))) {
        json_decref(req);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    return client_call(c, req, NULL);
}

int shmb_queue_create(shmb_t *c, const char *name, uint32_t seats, uint64_t slots,
                      uint64_t slot_size, unsigned flags)
{
    int rc = client_enter(c);

    return rc < 0 ? rc
                  : client_done(c, queue_create(c, name, seats, slots, slot_size, flags));
}

/* An op whose request is only the queue's name. */
static int queue_name_op(shmb_t *c, enum shmb_op_id op, const char *name)
{
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = queue_check_name(c, name)) < 0)
        return rc;
    return client_call(c, json_pack("{s:s, s:s}", "op", shmb_ops[op].name, "name", name),
                       NULL);
}

int shmb_queue_shutdown(shmb_t *c, const char *name)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, queue_name_op(c, SHMB_OP_QUEUE_SHUTDOWN, name));
}

int shmb_queue_delete(shmb_t *c, const char *name)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, queue_name_op(c, SHMB_OP_QUEUE_DELETE, name));
}

/* queue_close for q's role (its seat, for a reader). */
static int queue_leave(shmb_queue_t *q)
{
    shmb_t *c = q->c;
    json_t *req;

    shmb_error_clear(&c->err);
    if (q->seat == SHMB_QUEUE_WRITER)
        req = json_pack("{s:s, s:s, s:s}", "op", shmb_ops[SHMB_OP_QUEUE_CLOSE].name,
                        "name", q->name, "role", "writer");
    else
        req = json_pack("{s:s, s:s, s:s, s:i}", "op", shmb_ops[SHMB_OP_QUEUE_CLOSE].name,
                        "name", q->name, "role", "reader", "seat", q->seat);
    return client_call(c, req, NULL);
}

/* Map the queue's descriptor (fd, closed here) and check it against the
 * open's reply. */
static int queue_map(shmb_queue_t *q, int fd, const json_t *reply)
{
    shmb_t *c = q->c;
    uint64_t size, seats, slots, slot_size;
    struct stat st;
    int rc;

    if ((rc = client_u64(c, reply, "size", &size)) < 0 ||
        (rc = client_u64(c, reply, "seats", &seats)) < 0 ||
        (rc = client_u64(c, reply, "slots", &slots)) < 0 ||
        (rc = client_u64(c, reply, "slot_size", &slot_size)) < 0)
        goto done;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size || size > SIZE_MAX) {
        rc =
            shmb_error_set(&c->err, -EPROTO,
                           "The queue's descriptor (%lld bytes) is smaller than the %llu "
                           "bytes queue_open said.",
                           (long long)st.st_size, (unsigned long long)size);
        goto done;
    }
    q->map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE,
                  MAP_SHARED | (c->populate ? MAP_POPULATE : 0), fd, 0);
    if (q->map == MAP_FAILED) {
        int saved = errno;

        q->map = NULL;
        rc = shmb_error_set(&c->err, -saved, "Cannot map the queue (%llu bytes): %s.",
                            (unsigned long long)size, strerror(saved));
        goto done;
    }
    q->map_size = (size_t)size;
    if ((rc = shmb_q_attach(&q->q, q->map, q->map_size, &c->err)) < 0)
        goto done;
    if (q->q.seats != seats || q->q.slots != slots || q->q.slot_size != slot_size ||
        (q->seat != SHMB_QUEUE_WRITER && (uint32_t)q->seat >= q->q.seats))
        rc = shmb_error_set(
            &c->err, -EPROTO,
            "The queue's area (%u seats, %llu slots of %llu bytes) is not "
            "what queue_open said (%llu seats, %llu slots of %llu bytes, "
            "seat %d).",
            q->q.seats, (unsigned long long)q->q.slots,
            (unsigned long long)q->q.slot_size, (unsigned long long)seats,
            (unsigned long long)slots, (unsigned long long)slot_size, q->seat);
done:
    close(fd);
    return rc;
}

/* Free q's memory (not its role). */
static void queue_free(shmb_queue_t *q)
{
    if (q->map != NULL)
        munmap(q->map, q->map_size);
    shmb_free(q->objs);
    shmb_free(q);
}

static int queue_open(shmb_t *c, const char *name, int seat, shmb_queue_t **out)
{
    shmb_queue_t *q = NULL;
    json_t *req, *reply = NULL;
    uint64_t got_seat = 0, epoch = 0;
    bool granted = false;
    int rc, fd;

    shmb_error_clear(&c->err);
    if ((rc = queue_check_name(c, name)) < 0)
        return rc;
    if (seat < SHMB_QUEUE_ANY_SEAT || seat >= (int)SHMB_QUEUE_SEATS_MAX)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_queue_open: seat %d is none of SHMB_QUEUE_WRITER, "
                              "SHMB_QUEUE_ANY_SEAT and 0..%u. Nothing was sent.",
                              seat, SHMB_QUEUE_SEATS_MAX - 1);
    q = shmb_calloc(1, sizeof(*q));
    if (q == NULL)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a queue handle.");
    q->c = c;
    q->forks = atomic_load_explicit(&c->forks, memory_order_relaxed);
    snprintf(q->name, sizeof(q->name), "%s", name);
    if (seat == SHMB_QUEUE_WRITER)
        req = json_pack("{s:s, s:s, s:s}", "op", shmb_ops[SHMB_OP_QUEUE_OPEN].name,
                        "name", name, "role", "writer");
    else if (seat == SHMB_QUEUE_ANY_SEAT)
        req = json_pack("{s:s, s:s, s:s}", "op", shmb_ops[SHMB_OP_QUEUE_OPEN].name,
                        "name", name, "role", "reader");
    else
        req = json_pack("{s:s, s:s, s:s, s:i}", "op", shmb_ops[SHMB_OP_QUEUE_OPEN].name,
                        "name", name, "role", "reader", "seat", seat);
    /* The queue's descriptor arrives with the reply, where hello's did. */
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    c->seg_fd = -1;
    rc = client_call(c, req, &reply);
    fd = c->seg_fd;
    c->seg_fd = -1;
    if (rc < 0)
        goto fail;
    if ((rc = client_u64(c, reply, "epoch", &epoch)) < 0)
        goto fail;
    if (seat == SHMB_QUEUE_WRITER) {
        q->seat = SHMB_QUEUE_WRITER;
    } else {
        if ((rc = client_u64(c, reply, "seat", &got_seat)) < 0)
            goto fail;
        if (got_seat >= SHMB_QUEUE_SEATS_MAX) {
            rc = shmb_error_set(&c->err, -EPROTO, "queue_open gave seat %llu, past %u.",
                                (unsigned long long)got_seat, SHMB_QUEUE_SEATS_MAX - 1);
            goto fail;
        }
        q->seat = (int)got_seat;
    }
    granted = true;
    if (fd < 0) {
        rc = shmb_error_set(&c->err, -EPROTO,
                            "shmbrokerd's queue_open reply carried no descriptor.");
        goto fail;
    }
    rc = queue_map(q, fd, reply);
    fd = -1; /* queue_map closed it */
    if (rc < 0)
        goto fail;
    if (q->seat != SHMB_QUEUE_WRITER) {
        /* The seat is this handle's at this epoch: a later one means the
         * daemon gave it to another (shmb_q_dequeue then says -ENOTCONN). */
        q->q.epoch[q->seat] = epoch;
        q->q.known |= UINT64_C(1) << q->seat;
    } else {
        /* The role is this handle's at this epoch: a later one means its
         * connection closed and another writer took the queue. */
        q->q.writer_epoch = epoch;
        queue_adopt_objects(q);
    }
    json_decref(reply);
    *out = q;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    json_decref(reply);
    if (granted) {
        /* Give the role back, keeping the first error. */
        struct shmb_error first = c->err;

        queue_leave(q);
        c->err = first;
    }
    queue_free(q);
    return rc;
}

int shmb_queue_open(shmb_t *c, const char *name, int seat, shmb_queue_t **q)
{
    int rc = client_enter(c);

    *q = NULL;
    return rc < 0 ? rc : client_done(c, queue_open(c, name, seat, q));
}

int shmb_queue_seat(const shmb_queue_t *q)
{
    return q->seat;
}

size_t shmb_queue_slot_size(const shmb_queue_t *q)
{
    return (size_t)q->q.slot_size;
}

int shmb_queue_set_spin(shmb_queue_t *q, unsigned spin_us)
{
    if ((uint64_t)spin_us * 1000 > SHMB_Q_SPIN_MAX_NS)
        return shmb_error_set(&q->c->err, -EINVAL,
                              "spin_us=%u is more than the limit of %u us: past it, "
                              "sleep on the futex.",
                              spin_us, SHMB_Q_SPIN_MAX_NS / 1000);
    q->q.spin_ns = spin_us * 1000u;
    return 0;
}

/* Refuse a writer's call on a reader's handle, or the reverse. */
static int queue_wrong_role(shmb_queue_t *q, const char *call)
{
    return shmb_error_set(
        &q->c->err, -EINVAL, "%s on a handle of %s of queue '%s': %s.", call,
        q->seat == SHMB_QUEUE_WRITER ? "the writer" : "a reader seat", q->name,
        q->seat == SHMB_QUEUE_WRITER
            ? "dequeue and done need a reader seat (open one with "
              "shmb_queue_open)"
            : "reserve, publish and enqueue need the writer role");
}

/* ---- the data path ---------------------------------------------------------- */

/* The start of a call of the data path (call names it): refused in a
 * process made by fork() since q was opened, or on a handle of the other
 * role (the writer when writer, else a reader seat). */
static int queue_check_role(shmb_queue_t *q, const char *call, bool writer)
{
    int rc;

    if ((rc = queue_check_fork(q, call)) < 0)
        return rc;
    shmb_error_clear(&q->c->err);
    if (writer ? q->seat != SHMB_QUEUE_WRITER : q->seat < 0)
        return queue_wrong_role(q, call);
    return 0;
}

int shmb_queue_reserve(shmb_queue_t *q, size_t len, void **buf, int timeout_ms)
{
    shmb_t *c = q->c;
    int rc;

    *buf = NULL;
    if ((rc = queue_check_role(q, "shmb_queue_reserve", true)) < 0)
        return rc;
    if (q->obj_reserved || q->objs_count > 0) {
        if ((rc = client_enter(c)) < 0) {
            /* An object to abort needs the connection; collecting can wait. */
            if (q->obj_reserved)
                return rc;
        } else {
            rc = queue_drop_reserved(q);
            queue_collect(q);
            client_leave(c);
            if (rc < 0 && rc != -ENOENT && rc != -ETIMEDOUT)
                return rc;
            shmb_error_clear(&c->err);
        }
    }
    if (len > q->q.slot_size)
        return queue_reserve_object(q, len, buf, timeout_ms);
    {
        struct queue_wait w = {.len = len, .buf = buf};

        if ((rc = queue_wait(q, &w, timeout_ms)) == 0)
            q->res_len = len;
    }
    return rc;
}

int shmb_queue_publish(shmb_queue_t *q, size_t len)
{
    shmb_t *c = q->c;
    uint64_t seq = q->q.head;
    struct client_key k;
    int rc;

    if ((rc = queue_check_role(q, "shmb_queue_publish", true)) < 0)
        return rc;
    if (q->q.reserved && len > q->res_len)
        return shmb_error_set(&c->err, -EMSGSIZE,
                              "shmb_queue_publish: %zu bytes, but %zu were reserved.",
                              len, q->res_len);
    if (!q->obj_reserved)
        return shmb_q_publish(&q->q, len, &c->err);
    if ((rc = client_enter(c)) < 0)
        return rc;
    /* Committed before the slot is published: a reader's get must find it. */
    k = client_key_trusted(q->obj_key); /* a queue's key: valid by its making */
    rc = client_key_op(c, SHMB_OP_COMMIT, &k, NULL);
    client_leave(c);
    q->obj_reserved = false;
    if (rc < 0) {
        /* The slot holds a key, not a message: it must not go out. */
        q->q.reserved = false;
        return rc;
    }
    /* Untracked when out of memory: the daemon deletes it with the queue. */
    (void)queue_objs_push(q, seq);
    /* aux is the message's length, which may be less than the object's
     * size (what was reserved): readers take the first aux bytes. */
    return shmb_q_publish_object(&q->q, strlen(q->obj_key), len, &c->err);
}

int shmb_queue_enqueue(shmb_queue_t *q, const void *data, size_t len, int timeout_ms)
{
    void *buf;
    int rc;

    if ((rc = shmb_queue_reserve(q, len, &buf, timeout_ms)) < 0)
        return rc;
    if (len != 0)
        memcpy(buf, data, len);
    return shmb_queue_publish(q, len);
}

/* Reader: let go of the message held (its slot, then its pin). The pin's
 * release waits in the handle while another thread's call holds the
 * connection: the next call that gets in sends it. */
static void queue_done(shmb_queue_t *q)
{
    shmb_q_done(&q->q, (uint32_t)q->seat);
    if (q->pinned && client_enter(q->c) == 0) {
        queue_release_pin(q);
        client_leave(q->c);
    }
}

void shmb_queue_done(shmb_queue_t *q)
{
    if (q != NULL && q->seat >= 0 && queue_check_fork(q, "shmb_queue_done") == 0)
        queue_done(q);
}

int shmb_queue_dequeue(shmb_queue_t *q, const void **data, size_t *len, int timeout_ms)
{
    const void *slot;
    size_t slot_len;
    int rc;

    *data = NULL;
    *len = 0;
    if ((rc = queue_check_role(q, "shmb_queue_dequeue", false)) < 0)
        return rc;
    queue_done(q);
    {
        struct queue_wait w = {.msg = &slot, .msg_len = &slot_len};

        if ((rc = queue_wait(q, &w, timeout_ms)) < 0)
            return rc;
    }
    if (q->q.msg_flags != SHMB_QUEUE_OBJECT) {
        *data = slot;
        *len = slot_len;
        return 0;
    }
    /* A get refused by the daemon (corrupt) leaves the message held: the
     * next dequeue goes past it. One never asked (the connection busy in
     * another thread) leaves it in place: the next dequeue gets it. */
    return queue_get_object(q, slot, slot_len, data, len);
}

/* 1 when q is ready (wait_ready's condition), 0 not yet, or an error. A
 * reader is ready once there is something to dequeue or to learn: a writer
 * live, messages published, or the writer gone (dequeue says end of
 * queue). */
static int queue_ready(shmb_queue_t *q)
{
    uint32_t state = atomic_load_explicit(&q->q.hdr->state, memory_order_acquire), s;

    if (state == SHMB_QUEUE_SHUTDOWN)
        return shmb_error_set(&q->c->err, -ECANCELED,
                              "cancelled: the queue was shut down.");
    if (q->seat != SHMB_QUEUE_WRITER)
        return atomic_load_explicit(&q->q.hdr->writer_live, memory_order_acquire) != 0 ||
               atomic_load_explicit(&q->q.hdr->head, memory_order_acquire) != 0 ||
               state == SHMB_QUEUE_WRITER_GONE;
    for (s = 0; s < q->q.seats; s++)
        if (atomic_load_explicit(&q->q.seat[s].state, memory_order_acquire) !=
            SHMB_SEAT_LIVE)
            return 0;
    return 1;
}

int shmb_queue_wait_ready(shmb_queue_t *q, int timeout_ms)
{
    int64_t now = queue_now_ns(), deadline = now + (int64_t)timeout_ms * 1000000;
    int64_t watch_at = now + (int64_t)QUEUE_SLICE_MS * 1000000;
    struct timespec pause = {0, QUEUE_READY_POLL_NS};
    int rc;

    if ((rc = queue_check_fork(q, "shmb_queue_wait_ready")) < 0)
        return rc;
    shmb_error_clear(&q->c->err);
    while ((rc = queue_ready(q)) == 0) {
        now = queue_now_ns();
        if (now >= watch_at) {
            if ((rc = queue_watch(q)) < 0)
                return rc;
            watch_at = now + (int64_t)QUEUE_SLICE_MS * 1000000;
        }
        if (timeout_ms >= 0 && now >= deadline)
            return shmb_error_set(&q->c->err, -ETIMEDOUT,
                                  q->seat == SHMB_QUEUE_WRITER
                                      ? "Not every seat of queue '%s' had a live reader "
                                        "within %d ms."
                                      : "Queue '%s' had no writer within %d ms.",
                                  q->name, timeout_ms);
        nanosleep(&pause, NULL);
    }
    return rc < 0 ? rc : 0;
}

int shmb_queue_close(shmb_queue_t *q)
{
    shmb_t *c;
    int rc;

    if (q == NULL)
        return 0;
    c = q->c;
    /* A child of fork() frees its copy and leaves the parent's role alone. */
    if ((rc = queue_check_fork(q, "shmb_queue_close")) == 0) {
        /* Another thread's call on the connection ends soon: wait for it,
         * so that the role is left and no pin stays behind. */
        while ((rc = client_enter(c)) == -EBUSY) {
            struct timespec nap = {0, QUEUE_CLOSE_NAP_NS};

            nanosleep(&nap, NULL);
        }
    }
    if (rc == 0) {
        if (q->seat == SHMB_QUEUE_WRITER) {
            queue_drop_reserved(q);
            queue_collect(q);
        } else {
            /* The message held is done first: the seat moves past it before
             * its pin goes, so the daemon knows this reader took its read
             * (otherwise it would forgo the read a second time). */
            shmb_q_done(&q->q, (uint32_t)q->seat);
            queue_release_pin(q);
        }
        rc = queue_leave(q);
        client_leave(c);
    }
    queue_free(q);
    return rc;
}
