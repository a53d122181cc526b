// SPDX-License-Identifier: Apache-2.0
/*
 * A queue's messages longer than a slot, carried as objects of the
 * connection's pool under the key q/<queue>/<seq> (proto/names.h): the
 * writer's reserve, its list of objects in flight and their deletion once
 * every live seat read them; a reader's get and pin. Calls the library's
 * object calls; knows nothing of the queue ops (open, close, list).
 */
#include "queue_inner.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "../proto/alloc.h"

/* The key of message seq's object (q's name was checked: it fits). */
static void queue_key(const shmb_queue_t *q, uint64_t seq, char *key)
{
    shmb_q_key(key, QUEUE_KEY_MAX, q->name, seq);
}

/* Send key's op (delete or release) without waiting for its reply, as
 * shmb_release_nowait does: an error is logged by the daemon. */
static int queue_send_noreply(shmb_t *c, enum shmb_op_id op, const char *key)
{
    /* A queue's key: valid by its making. */
    struct client_key k = client_key_trusted(key);
    int rc;

    c->w.len = 0;
    if ((rc = client_begin_key(c, op, client_next_id(c), &k)) < 0)
        return rc;
    if (line_lit(&c->w, ",\"noreply\":true}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    c->noreply_sent = true;
    return client_send(c);
}

/* Remember that message seq went as an object. 0 or -ENOMEM. */
int queue_objs_push(shmb_queue_t *q, uint64_t seq)
{
    if (q->objs_count == q->objs_cap) {
        size_t cap = q->objs_cap ? q->objs_cap * 2 : 16, i;
        uint64_t *grown = shmb_malloc(cap * sizeof(*grown));

        if (grown == NULL)
            return -ENOMEM;
        for (i = 0; i < q->objs_count; i++)
            grown[i] = q->objs[(q->objs_first + i) % q->objs_cap];
        shmb_free(q->objs);
        q->objs = grown;
        q->objs_cap = cap;
        q->objs_first = 0;
    }
    q->objs[(q->objs_first + q->objs_count) % q->objs_cap] = seq;
    q->objs_count++;
    return 0;
}

/* A writer that follows another (gone, or killed) takes over the objects
 * of the messages still in the ring, so that it deletes them once they are
 * read: what the slots say is only a key of this queue to delete. */
void queue_adopt_objects(shmb_queue_t *q)
{
    uint64_t head = atomic_load_explicit(&q->q.hdr->head, memory_order_acquire);
    uint64_t n = head > q->q.slots ? head - q->q.slots : 0;

    for (; n < head; n++) {
        const volatile struct shmb_queue_slot *slot =
            (const void *)(q->q.base + q->q.slots_offset +
                           (n % q->q.slots) * q->q.slot_stride);

        if (slot->seq == n && slot->flags == SHMB_QUEUE_OBJECT &&
            queue_objs_push(q, n) < 0)
            return;
    }
}

/* Delete (without waiting) the objects of the messages every live seat has
 * read: nobody reads them any more (a seat taken later starts at the next
 * message), and those of dead readers would otherwise await their reads for
 * ever. Inside a call client_enter let in. */
void queue_collect(shmb_queue_t *q)
{
    uint64_t min = atomic_load_explicit(&q->q.hdr->head, memory_order_acquire), next;
    char key[QUEUE_KEY_MAX];
    uint32_t s;

    if (q->objs_count == 0)
        return;
    for (s = 0; s < q->q.seats; s++) {
        if (atomic_load_explicit(&q->q.seat[s].state, memory_order_acquire) !=
            SHMB_SEAT_LIVE)
            continue;
        next = atomic_load_explicit(&q->q.seat[s].next, memory_order_acquire);
        if (next < min)
            min = next;
    }
    while (q->objs_count > 0 && q->objs[q->objs_first] < min) {
        queue_key(q, q->objs[q->objs_first], key);
        if (queue_send_noreply(q->c, SHMB_OP_DELETE, key) < 0)
            return;
        q->objs_first = (q->objs_first + 1) % q->objs_cap;
        q->objs_count--;
    }
}

/* Drop the object reserved and not published (a second reserve, a close).
 * Inside a call client_enter let in. */
int queue_drop_reserved(shmb_queue_t *q)
{
    struct client_key k;

    if (!q->obj_reserved)
        return 0;
    q->obj_reserved = false;
    k = client_key_trusted(q->obj_key);
    return client_key_op(q->c, SHMB_OP_ABORT, &k, NULL);
}

/* The live seats now: the reads an object awaits. */
static unsigned queue_live_seats(const shmb_queue_t *q)
{
    unsigned n = 0;
    uint32_t s;

    for (s = 0; s < q->q.seats; s++)
        n += atomic_load_explicit(&q->q.seat[s].state, memory_order_acquire) ==
             SHMB_SEAT_LIVE;
    return n;
}

/* Reserve message q->q.head's slot for an object of len bytes: the key in
 * the slot, the object allocated in the pool. */
int queue_reserve_object(shmb_queue_t *q, size_t len, void **buf, int timeout_ms)
{
    shmb_t *c = q->c;
    void *slot, *ptr = NULL;
    char key[QUEUE_KEY_MAX];
    struct client_key k;
    unsigned readers;
    int rc;

    if ((rc = client_check_size(c, len)) < 0)
        return rc;
    /* Waiting for the slot does not hold the connection. */
    {
        struct queue_wait w = {.len = QUEUE_KEY_MAX, .buf = &slot};

        if ((rc = queue_wait(q, &w, timeout_ms)) < 0)
            return rc;
    }
    if ((rc = client_enter(c)) < 0) {
        q->q.reserved = false;
        return rc;
    }
    queue_collect(q);
    queue_key(q, q->q.head, key);
    k = client_key_trusted(key); /* a queue's key: valid by its making */
    readers = queue_live_seats(q);
    rc = client_alloc(c, &k, len, readers, &ptr);
    if (rc == -EEXIST) {
        /* Left by a writer that died between its commit and its publish:
         * nobody can have read it. */
        client_key_op(c, SHMB_OP_DELETE, &k, NULL);
        rc = client_alloc(c, &k, len, readers, &ptr);
    }
    client_leave(c);
    if (rc < 0) {
        /* No object: the slot holds nothing to publish. */
        q->q.reserved = false;
        return rc;
    }
    memcpy(slot, key, strlen(key));
    memcpy(q->obj_key, key, sizeof(key));
    q->obj_reserved = true;
    q->res_len = len;
    *buf = ptr;
    return 0;
}

/* Reader, inside a call client_enter let in: send the release of the pin
 * the handle still owes. A release that cannot be sent is lost with the
 * connection, and so is the pin (the daemon releases a closed
 * connection's pins). */
void queue_release_pin(shmb_queue_t *q)
{
    if (!q->pinned)
        return;
    q->pinned = false;
    queue_send_noreply(q->c, SHMB_OP_RELEASE, q->pin_key);
}

/* The message held at q's seat was not taken after all: the seat does not
 * go past it, and the next dequeue returns it again. */
static void queue_unhold(shmb_queue_t *q)
{
    q->q.held &= ~(UINT64_C(1) << q->seat);
}

/* The message just dequeued is an object whose key the slot holds (len
 * bytes at slot): pin it and point *data and *len at its bytes. */
int queue_get_object(shmb_queue_t *q, const void *slot, size_t len, const void **data,
                     size_t *size)
{
    shmb_t *c = q->c;
    uint64_t seq = q->q.held_seq[q->seat], want_len = q->q.msg_aux;
    char want[QUEUE_KEY_MAX], got[QUEUE_KEY_MAX];
    struct client_key k;
    const void *ptr = NULL;
    size_t have = 0;
    int rc;

    queue_key(q, seq, want);
    if (len >= sizeof(got))
        len = sizeof(got) - 1;
    memcpy(got, slot, len);
    got[len] = '\0';
    if (strcmp(got, want) != 0)
        return shmb_error_set(&c->err, -EIO,
                              "Message %llu of queue '%s' names object '%.*s', not '%s': "
                              "the queue's area is corrupt.",
                              (unsigned long long)seq, q->name, (int)len, got, want);
    if ((rc = client_enter(c)) < 0) {
        /* Nothing was asked: the message stays for the next dequeue. */
        queue_unhold(q);
        return rc;
    }
    queue_release_pin(q);
    k = client_key_trusted(want); /* a queue's key: valid by its making */
    rc = client_get(c, &k, &ptr, &have);
    if (rc == -ECONNRESET)
        queue_unhold(q); /* unanswered: the seat is dropped anyway */
    if (rc == 0 && want_len > have) {
        queue_send_noreply(c, SHMB_OP_RELEASE, want);
        rc = shmb_error_set(&c->err, -EIO,
                            "Message %llu of queue '%s' says %llu bytes; its object '%s' "
                            "has %zu: the queue's area is corrupt.",
                            (unsigned long long)seq, q->name,
                            (unsigned long long)want_len, want, have);
    }
    client_leave(c);
    if (rc < 0)
        return rc;
    memcpy(q->pin_key, want, sizeof(want));
    q->pinned = true;
    *data = ptr;
    *size = (size_t)want_len;
    return 0;
}
