// SPDX-License-Identifier: Apache-2.0
/*
 * The broadcast queue's data path: slots filled and read in place, sequence
 * numbers published with release and read with acquire, waits that spin
 * briefly and then sleep on a futex word of the area. The daemon's side is
 * stores and wakes only. Nothing here trusts a byte of the area: indexes are
 * reduced by the private geometry and lengths checked against it.
 */
#include "queue.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* The spin before a futex wait adapts between these (nanoseconds): it
 * doubles when a wait ends while spinning and halves when it had to sleep,
 * so a busy queue stays off the futex and an idle one costs ~a microsecond
 * per wait. 50 us is about the cost of a futex wake and wait on a busy host. */
#define SPIN_MIN_NS 1000u
#define SPIN_START_NS 20000u
#define SPIN_MAX_NS 50000u
/* How long a held-back writer sleeps for its wake mark before any reader's
 * finish may wake it. */
#define MARK_SLEEP_NS 1000000

#define SEAT_BIT(s) (UINT64_C(1) << (s))

/* Tell the core this is a spin, so a sibling thread gets the pipeline. */
static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* The monotonic clock in nanoseconds (the vDSO: no system call). */
static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Sleep while *word == val, until woken or the CLOCK_MONOTONIC deadline
 * (INT64_MAX: none). Not FUTEX_PRIVATE_FLAG: the word is in a MAP_SHARED
 * area that other processes wait on and wake. Any return means "look
 * again" (woken, value changed, signal, deadline). */
static void futex_wait(_Atomic uint32_t *word, uint32_t val, int64_t deadline)
{
    struct timespec ts, *tsp = NULL;

    if (deadline != INT64_MAX) {
        ts.tv_sec = deadline / 1000000000;
        ts.tv_nsec = deadline % 1000000000;
        tsp = &ts;
    }
    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so
     * spurious returns do not stretch the timeout. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, val, tsp, NULL,
            FUTEX_BITSET_MATCH_ANY);
}

/* Wake up to n sleepers on word. */
static void futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* v rounded up to a multiple of to. */
static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

/* Where the slots start for this many seats. */
static uint64_t slots_offset_for(uint32_t seats)
{
    return round_up(SHMB_HEADER_PAGE + (uint64_t)seats * SHMB_QUEUE_SEAT_SIZE,
                    SHMB_HEADER_PAGE);
}

/* Whether a geometry is one this version lays out. */
static int check_geometry(uint32_t seats, uint64_t slots, uint64_t slot_size,
                          struct shmb_error *err)
{
    if (seats < 1 || seats > SHMB_QUEUE_SEATS_MAX)
        return shmb_error_set(err, -EINVAL,
                              "A queue has 1 to %u reader seats, not %u.",
                              SHMB_QUEUE_SEATS_MAX, seats);
    if (slots < SHMB_QUEUE_SLOTS_MIN || slots > SHMB_QUEUE_SLOTS_MAX)
        return shmb_error_set(err, -EINVAL, "A queue has %u to %u slots, not %llu.",
                              SHMB_QUEUE_SLOTS_MIN, SHMB_QUEUE_SLOTS_MAX,
                              (unsigned long long)slots);
    if (slot_size < SHMB_QUEUE_SLOT_SIZE_MIN || slot_size > SHMB_QUEUE_SLOT_SIZE_MAX)
        return shmb_error_set(err, -EINVAL,
                              "A queue's slots hold %u bytes to %llu bytes, not %llu; "
                              "larger messages go as store objects.",
                              SHMB_QUEUE_SLOT_SIZE_MIN,
                              (unsigned long long)SHMB_QUEUE_SLOT_SIZE_MAX,
                              (unsigned long long)slot_size);
    return 0;
}

size_t shmb_q_size(uint32_t seats, uint64_t slots, uint64_t slot_size)
{
    uint64_t stride, total;

    if (check_geometry(seats, slots, slot_size, NULL) != 0)
        return 0;
    /* At most 2^16 slots of 2^30 + 64 bytes: no overflow in 64 bits. */
    stride = round_up(SHMB_QUEUE_SLOT_HEADER + slot_size, SHMB_ALIGN);
    total = slots_offset_for(seats) + slots * stride;
    if (total > SIZE_MAX)
        return 0;
    return (size_t)total;
}

int shmb_q_format(void *base, size_t size, const char *name, uint32_t seats, uint64_t slots,
                  uint64_t slot_size, struct shmb_error *err)
{
    struct shmb_queue_header *h = base;
    size_t need, name_len = strlen(name);
    int rc;

    if ((rc = check_geometry(seats, slots, slot_size, err)) != 0)
        return rc;
    if (name_len >= SHMB_QUEUE_NAME_MAX)
        return shmb_error_set(err, -ENAMETOOLONG,
                              "A queue's name has at most %u bytes, not %zu.",
                              SHMB_QUEUE_NAME_MAX - 1, name_len);
    need = shmb_q_size(seats, slots, slot_size);
    if (need == 0 || size < need)
        return shmb_error_set(err, -EINVAL,
                              "A queue of %u seats and %llu slots of %llu bytes needs "
                              "%zu bytes; the area has %zu.",
                              seats, (unsigned long long)slots,
                              (unsigned long long)slot_size, need, size);
    /* Nobody maps the area yet: plain stores. The slots are not cleared:
     * a reader reads a slot only after the writer has published it. */
    memset(base, 0, (size_t)slots_offset_for(seats));
    h->version = SHMB_QUEUE_VERSION;
    h->seats = seats;
    h->slots = slots;
    h->slot_size = slot_size;
    h->slot_stride = round_up(SHMB_QUEUE_SLOT_HEADER + slot_size, SHMB_ALIGN);
    h->slots_offset = slots_offset_for(seats);
    h->total_size = need;
    memcpy(h->name, name, name_len);
    atomic_store_explicit(&h->state, SHMB_QUEUE_OPEN, memory_order_relaxed);
    h->magic = SHMB_QUEUE_MAGIC;
    return 0;
}

int shmb_q_attach(struct shmb_q *q, void *base, size_t size, struct shmb_error *err)
{
    /* Volatile: each field is read once, below, into a private copy that is
     * checked and used, whatever the area says afterwards. */
    const volatile struct shmb_queue_header *h = base;
    struct shmb_error why;
    uint64_t slots, slot_size, stride, offset, total;
    uint32_t seats;
    size_t need;

    memset(q, 0, sizeof(*q));
    if ((uintptr_t)base % SHMB_ALIGN != 0)
        return shmb_error_set(err, -EINVAL, "A queue's area starts on a multiple of %u "
                              "bytes (a mapping does).", SHMB_ALIGN);
    if (size < SHMB_HEADER_PAGE)
        return shmb_error_set(err, -EINVAL,
                              "A queue's area has %u bytes at least, not %zu.",
                              SHMB_HEADER_PAGE, size);
    if (h->magic != SHMB_QUEUE_MAGIC || h->version != SHMB_QUEUE_VERSION)
        return shmb_error_set(err, -EIO,
                              "This area is not a queue of layout version %d "
                              "(magic %#llx, version %u).",
                              SHMB_QUEUE_VERSION, (unsigned long long)h->magic,
                              h->version);
    seats = h->seats;
    slots = h->slots;
    slot_size = h->slot_size;
    stride = h->slot_stride;
    offset = h->slots_offset;
    total = h->total_size;
    if (check_geometry(seats, slots, slot_size, &why) != 0)
        return shmb_error_set(err, -EIO, "The queue's header is corrupt: %s", why.message);
    need = shmb_q_size(seats, slots, slot_size);
    if (need == 0 || stride != round_up(SHMB_QUEUE_SLOT_HEADER + slot_size, SHMB_ALIGN) ||
        offset != slots_offset_for(seats) || total != need)
        return shmb_error_set(err, -EIO,
                              "The queue's header is corrupt: stride %llu, slots at %llu, "
                              "%llu bytes do not follow from its geometry.",
                              (unsigned long long)stride, (unsigned long long)offset,
                              (unsigned long long)total);
    if (size < need)
        return shmb_error_set(err, -EIO,
                              "The queue needs %zu bytes; its area has %zu.", need, size);
    if (memchr((const char *)h->name, '\0', sizeof(h->name)) == NULL)
        return shmb_error_set(err, -EIO, "The queue's header is corrupt: unterminated name.");
    q->base = base;
    q->size = size;
    q->seats = seats;
    q->slots = slots;
    q->slot_size = slot_size;
    q->slot_stride = stride;
    q->slots_offset = offset;
    q->hdr = base;
    q->seat = (struct shmb_queue_seat *)(q->base + SHMB_HEADER_PAGE);
    q->write_spin = SPIN_START_NS;
    q->read_spin = SPIN_START_NS;
    return 0;
}

/* The slot of message n: inside the area whatever n is. */
static struct shmb_queue_slot *slot_at(const struct shmb_q *q, uint64_t n)
{
    return (struct shmb_queue_slot *)(q->base + q->slots_offset + (n % q->slots) * q->slot_stride);
}

/* The error of every wait after shutdown, worded as vLLM's. */
static int cancelled(struct shmb_error *err)
{
    return shmb_error_set(err, -ECANCELED, "cancelled: the queue was shut down.");
}

/* A state no version writes: the area was scribbled. */
static int bad_state(uint32_t state, struct shmb_error *err)
{
    return shmb_error_set(err, -EIO, "The queue's state is %u, which no version writes: "
                          "its area is corrupt.", state);
}

/* 0 while this handle holds the writer role (its epoch is the area's), else
 * -ENOTCONN: its connection closed and another writer took the queue. */
static int writer_still(const struct shmb_q *q, struct shmb_error *err)
{
    uint64_t now = atomic_load_explicit(&q->hdr->writer_epoch, memory_order_acquire);

    if (now == q->writer_epoch)
        return 0;
    return shmb_error_set(err, -ENOTCONN,
                          "This handle is no longer the queue's writer (writer %llu; this "
                          "one was %llu): its connection closed and another writer took "
                          "the queue. Open it again to write.",
                          (unsigned long long)now, (unsigned long long)q->writer_epoch);
}

/* The writer's condition: 1 when the slot of message q->head is free (every
 * live seat has read the message that last used it), 0 not yet, or an
 * error when the queue is no longer open. */
static int writer_ready(struct shmb_q *q, uint32_t unused, struct shmb_error *err)
{
    uint32_t state = atomic_load_explicit(&q->hdr->state, memory_order_acquire);
    uint64_t n = q->head;
    uint32_t s;
    int rc;

    (void)unused;
    if (state == SHMB_QUEUE_SHUTDOWN)
        return cancelled(err);
    if (state == SHMB_QUEUE_WRITER_GONE)
        return shmb_error_set(err, -EPIPE,
                              "This queue's writer was removed (its connection closed).");
    if (state != SHMB_QUEUE_OPEN)
        return bad_state(state, err);
    if ((rc = writer_still(q, err)) < 0)
        return rc;
    if (n < q->slots)
        return 1;
    for (s = 0; s < q->seats; s++) {
        /* Acquire: the reader's release of next came after its last read of
         * the slot, so the writer's overwrite comes after that read. */
        if (atomic_load_explicit(&q->seat[s].state, memory_order_acquire) != SHMB_SEAT_LIVE)
            continue;
        if (atomic_load_explicit(&q->seat[s].next, memory_order_acquire) <= n - q->slots) {
            q->blocker = s;
            return 0;
        }
    }
    return 1;
}

/* Reader at seat s: 1 when message seat.next is published, 0 not yet, or
 * an error. The state is read before head: a writer's last messages,
 * published before the daemon wrote WRITER_GONE, are drained first. */
static int reader_ready(struct shmb_q *q, uint32_t s, struct shmb_error *err)
{
    struct shmb_queue_seat *seat = &q->seat[s];
    uint32_t state = atomic_load_explicit(&q->hdr->state, memory_order_acquire);
    uint64_t n;

    if (state == SHMB_QUEUE_SHUTDOWN)
        return cancelled(err);
    if (state != SHMB_QUEUE_OPEN && state != SHMB_QUEUE_WRITER_GONE)
        return bad_state(state, err);
    if (atomic_load_explicit(&seat->state, memory_order_acquire) != SHMB_SEAT_LIVE ||
        atomic_load_explicit(&seat->epoch, memory_order_relaxed) != q->epoch[s])
        return shmb_error_set(err, -ENOTCONN,
                              "Reader seat %u of this queue is no longer this process's: "
                              "it was dropped or taken again.", s);
    n = atomic_load_explicit(&seat->next, memory_order_relaxed);
    if (atomic_load_explicit(&q->hdr->head, memory_order_acquire) > n)
        return 1;
    if (state == SHMB_QUEUE_WRITER_GONE)
        return shmb_error_set(err, -EPIPE,
                              "End of queue: its writer is gone and every message it "
                              "published has been read.");
    return 0;
}

/* Say that this side is about to sleep, or no longer is. A writer's mark
 * asks to be woken only once the slowest reader has freed half the ring. */
static void announce(struct shmb_q *q, bool writer, uint32_t s, bool on, bool mark)
{
    if (writer) {
        /* Before the flag: a reader that sees the flag sees this mark.
         * Sleeping until the slowest reader frees half the ring, not one
         * slot, makes one wake-up per half ring of messages instead of one
         * per message when readers are the slower side. */
        if (on)
            atomic_store(&q->hdr->wake_at,
                         mark && q->head >= q->slots
                             ? q->head - q->slots + 1 + (q->slots - 1) / 2
                             : 0);
        atomic_store(&q->hdr->writer_waiting, on ? 1u : 0u);
    } else if (on) {
        /* In this order, a reader killed between the two stores leaves
         * the count one too high (a needless wake), never wrapped. */
        atomic_fetch_add(&q->hdr->readers_waiting, 1);
        atomic_store(&q->seat[s].waiting, 1);
    } else if (atomic_exchange(&q->seat[s].waiting, 0) != 0) {
        /* Whoever clears the flag takes the reader off the count: this
         * reader, or the daemon dropping or taking its seat meanwhile. */
        atomic_fetch_sub(&q->hdr->readers_waiting, 1);
    }
}

/* Wait until ready() says 1 (returns 0) or an error (returns it): a spin of
 * the side's adaptive budget, then futex waits. No lost wake-up: the waiter
 * announces, fences, reads the word, re-checks, and sleeps only while the
 * word still holds what it read; a waker changes the condition, bumps the
 * word, fences, then reads the announcement. */
static int wait_for(struct shmb_q *q, bool writer, uint32_t s, int timeout_ms,
                    struct shmb_error *err)
{
    int (*ready)(struct shmb_q *, uint32_t, struct shmb_error *) =
        writer ? writer_ready : reader_ready;
    _Atomic uint32_t *word = writer ? &q->hdr->free_word : &q->hdr->head_word;
    uint32_t *budget = writer ? &q->write_spin : &q->read_spin;
    uint32_t spin = q->spin_ns != 0 ? q->spin_ns : *budget;
    int64_t start, deadline;
    uint32_t val;
    unsigned i;
    bool mark;
    int rc;

    if ((rc = ready(q, s, err)) != 0)
        return rc < 0 ? rc : 0;
    if (timeout_ms == 0)
        goto timed_out;
    start = now_ns();
    deadline = timeout_ms < 0 ? INT64_MAX : start + (int64_t)timeout_ms * 1000000;
    for (i = 1;; i++) {
        int64_t t;

        /* A few microseconds of pause, then yield the CPU between looks:
         * on a host with more runnable processes than CPUs (five members
         * on two cores) a pause-spin would take the slice the other side
         * needs to make progress. */
        if (i <= 256)
            cpu_relax();
        else
            sched_yield();
        if ((rc = ready(q, s, err)) != 0) {
            *budget = *budget * 2 > SPIN_MAX_NS ? SPIN_MAX_NS : *budget * 2;
            return rc < 0 ? rc : 0;
        }
        if (i % 64 == 0 && ((t = now_ns()) - start >= spin || t >= deadline))
            break;
    }
    *budget = *budget / 2 < SPIN_MIN_NS ? SPIN_MIN_NS : *budget / 2;
    for (mark = writer;; mark = false) {
        /* The writer's first sleep waits for the mark, but at most
         * MARK_SLEEP_NS: a slowest reader that frees a slot and then stops
         * reading (it waits for something from the writer) would otherwise
         * hold the writer while a slot is free. After it, any reader's
         * finish wakes the writer. */
        int64_t until = mark && deadline - now_ns() > MARK_SLEEP_NS ? now_ns() + MARK_SLEEP_NS
                                                                    : deadline;

        announce(q, writer, s, true, mark);
        atomic_thread_fence(memory_order_seq_cst);
        val = atomic_load_explicit(word, memory_order_acquire);
        rc = ready(q, s, err);
        if (rc == 0 && now_ns() < until)
            futex_wait(word, val, until);
        announce(q, writer, s, false, false);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        if (now_ns() >= deadline) {
            /* What the last sleep may have missed at its very end. */
            if ((rc = ready(q, s, err)) != 0)
                return rc < 0 ? rc : 0;
            break;
        }
    }
timed_out:
    if (writer)
        return shmb_error_set(err, -ETIMEDOUT,
                              "No free slot in %d ms: reader seat %u has not read message "
                              "%llu of this queue.",
                              timeout_ms, q->blocker, (unsigned long long)(q->head - q->slots));
    return shmb_error_set(err, -ETIMEDOUT, "No message in %d ms.", timeout_ms);
}

int shmb_q_reserve(struct shmb_q *q, size_t len, void **buf, int timeout_ms,
                   struct shmb_error *err)
{
    int rc;

    if (len > q->slot_size)
        return shmb_error_set(err, -EMSGSIZE,
                              "A message of %zu bytes does not fit this queue's slots of "
                              "%llu bytes.", len, (unsigned long long)q->slot_size);
    if (!q->writing) {
        q->head = atomic_load_explicit(&q->hdr->head, memory_order_acquire);
        q->writing = true;
    }
    if ((rc = wait_for(q, true, 0, timeout_ms, err)) != 0)
        return rc;
    q->reserved = true;
    *buf = (unsigned char *)slot_at(q, q->head) + SHMB_QUEUE_SLOT_HEADER;
    return 0;
}

/* Fill the reserved slot's header and publish it as message q->head. */
static int publish(struct shmb_q *q, uint32_t flags, size_t len, uint64_t aux,
                   struct shmb_error *err)
{
    struct shmb_queue_slot *slot;

    if (!q->reserved)
        return shmb_error_set(err, -EINVAL, "No slot is reserved: call shmb_q_reserve first.");
    /* Checked again: the role may have gone while the slot was filled. */
    if (writer_still(q, err) < 0) {
        q->reserved = false;
        return -ENOTCONN;
    }
    if (len > q->slot_size)
        return shmb_error_set(err, -EMSGSIZE,
                              "A message of %zu bytes does not fit this queue's slots of "
                              "%llu bytes.", len, (unsigned long long)q->slot_size);
    slot = slot_at(q, q->head);
    slot->seq = q->head;
    slot->flags = flags;
    slot->len = (uint32_t)len;
    slot->aux = aux;
    slot->aux2 = 0;
    q->reserved = false;
    q->head++;
    /* head is the release store that publishes the slot; head_word is the
     * futex word, bumped after it (by the writer and by the daemon's
     * wakes, so it is a counter, not a copy of head's low bits). */
    atomic_store_explicit(&q->hdr->head, q->head, memory_order_release);
    atomic_fetch_add(&q->hdr->head_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&q->hdr->readers_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->head_word, INT_MAX);
    return 0;
}

int shmb_q_publish(struct shmb_q *q, size_t len, struct shmb_error *err)
{
    return publish(q, SHMB_QUEUE_INLINE, len, 0, err);
}

int shmb_q_publish_object(struct shmb_q *q, size_t len, uint64_t size,
                          struct shmb_error *err)
{
    return publish(q, SHMB_QUEUE_OBJECT, len, size, err);
}

int shmb_q_enqueue(struct shmb_q *q, const void *data, size_t len, int timeout_ms,
                   struct shmb_error *err)
{
    void *buf;
    int rc;

    if ((rc = shmb_q_reserve(q, len, &buf, timeout_ms, err)) != 0)
        return rc;
    memcpy(buf, data, len);
    return shmb_q_publish(q, len, err);
}

int shmb_q_dequeue(struct shmb_q *q, uint32_t seat, const void **data, size_t *len,
                   int timeout_ms, struct shmb_error *err)
{
    const volatile struct shmb_queue_slot *slot;
    uint64_t n, seq, aux;
    uint32_t flags, slot_len;
    int rc;

    if (seat >= q->seats)
        return shmb_error_set(err, -EINVAL, "This queue has %u reader seats; there is no "
                              "seat %u.", q->seats, seat);
    shmb_q_done(q, seat);
    /* The seat is this process's from its first read while LIVE: a later
     * epoch means the daemon gave it to someone else. */
    if (!(q->known & SEAT_BIT(seat)) &&
        atomic_load_explicit(&q->seat[seat].state, memory_order_acquire) == SHMB_SEAT_LIVE) {
        q->epoch[seat] = atomic_load_explicit(&q->seat[seat].epoch, memory_order_relaxed);
        q->known |= SEAT_BIT(seat);
    }
    if ((rc = wait_for(q, false, seat, timeout_ms, err)) != 0)
        return rc;
    n = atomic_load_explicit(&q->seat[seat].next, memory_order_relaxed);
    /* Each field read once, through volatile, then checked: the checked
     * copy is the one used. */
    slot = slot_at(q, n);
    seq = slot->seq;
    flags = slot->flags;
    slot_len = slot->len;
    aux = slot->aux;
    if (seq != n || slot_len > q->slot_size ||
        (flags != SHMB_QUEUE_INLINE && flags != SHMB_QUEUE_OBJECT))
        return shmb_error_set(err, -EIO,
                              "Slot %llu of this queue holds message %llu (flags %u, %u "
                              "bytes) where message %llu was published: its area is "
                              "corrupt.", (unsigned long long)(n % q->slots),
                              (unsigned long long)seq, flags, slot_len,
                              (unsigned long long)n);
    q->held |= SEAT_BIT(seat);
    q->held_seq[seat] = n;
    q->msg_flags = flags;
    q->msg_aux = aux;
    *data = (const unsigned char *)slot + SHMB_QUEUE_SLOT_HEADER;
    *len = slot_len;
    return 0;
}

void shmb_q_done(struct shmb_q *q, uint32_t seat)
{
    uint64_t held;

    if (seat >= q->seats || !(q->held & SEAT_BIT(seat)))
        return;
    q->held &= ~SEAT_BIT(seat);
    held = q->held_seq[seat];
    /* Release: every read of the slot comes before the writer may reuse it.
     * Only from the message held: a seat the daemon dropped and gave to
     * another reader meanwhile starts at head, past it, and is left alone
     * (an unconditional store would rewind the new reader). */
    if (!atomic_compare_exchange_strong_explicit(&q->seat[seat].next, &held, held + 1,
                                                 memory_order_release, memory_order_relaxed))
        return;
    atomic_fetch_add(&q->hdr->free_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    /* Only the reader whose finish reaches the writer's mark wakes it (each
     * reader's next passes it once); the writer re-checks every seat. */
    if (atomic_load_explicit(&q->hdr->writer_waiting, memory_order_relaxed) != 0) {
        uint64_t at = atomic_load_explicit(&q->hdr->wake_at, memory_order_relaxed);

        if (at == 0 || at == held + 1)
            futex_wake(&q->hdr->free_word, 1);
    }
}

void shmb_q_seat_take(struct shmb_q *q, uint32_t seat)
{
    struct shmb_queue_seat *st;

    if (seat >= q->seats)
        return;
    st = &q->seat[seat];
    atomic_store_explicit(&st->next, atomic_load(&q->hdr->head), memory_order_relaxed);
    if (atomic_exchange(&st->waiting, 0) != 0)
        atomic_fetch_sub(&q->hdr->readers_waiting, 1);
    atomic_fetch_add_explicit(&st->epoch, 1, memory_order_relaxed);
    atomic_store(&st->state, SHMB_SEAT_LIVE);
    /* A writer that checked the seats before it was LIVE may be filling the
     * slot of any message up to head: start at head as read after the
     * seat is LIVE (the writer fences between publishing and checking). */
    atomic_thread_fence(memory_order_seq_cst);
    atomic_store_explicit(&st->next, atomic_load(&q->hdr->head), memory_order_release);
}

void shmb_q_seat_drop(struct shmb_q *q, uint32_t seat, bool dead)
{
    struct shmb_queue_seat *st;

    if (seat >= q->seats)
        return;
    st = &q->seat[seat];
    atomic_store(&st->state, dead ? SHMB_SEAT_DEAD : SHMB_SEAT_FREE);
    /* Its reader, if asleep, wakes to -ENOTCONN (and, if it died asleep,
     * is taken off the count): the word first, then the flag. */
    atomic_fetch_add(&q->hdr->head_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_exchange(&st->waiting, 0) != 0) {
        atomic_fetch_sub(&q->hdr->readers_waiting, 1);
        futex_wake(&q->hdr->head_word, INT_MAX);
    }
    atomic_fetch_add(&q->hdr->free_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&q->hdr->writer_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->free_word, 1);
}

void shmb_q_writer_gone(struct shmb_q *q)
{
    uint32_t open = SHMB_QUEUE_OPEN;

    /* A queue shut down stays so. */
    atomic_compare_exchange_strong(&q->hdr->state, &open, SHMB_QUEUE_WRITER_GONE);
    atomic_store(&q->hdr->writer_live, 0);
    atomic_fetch_add(&q->hdr->head_word, 1);
    atomic_fetch_add(&q->hdr->free_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&q->hdr->readers_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->head_word, INT_MAX);
    /* A writer still asleep (its connection closed under it) wakes to
     * -EPIPE; one killed asleep no longer has readers wake it for nothing. */
    if (atomic_exchange(&q->hdr->writer_waiting, 0) != 0)
        futex_wake(&q->hdr->free_word, INT_MAX);
}

void shmb_q_writer_take(struct shmb_q *q, uint64_t epoch)
{
    uint32_t gone = SHMB_QUEUE_WRITER_GONE;

    /* Before the state opens: the old writer, if still running, fails. */
    atomic_store(&q->hdr->writer_epoch, epoch);

    /* A queue shut down stays so; one whose writer went is open again, and
     * the new writer goes on from the header's head. */
    atomic_compare_exchange_strong(&q->hdr->state, &gone, SHMB_QUEUE_OPEN);
    atomic_store(&q->hdr->writer_live, 1);
    /* Readers waiting for a writer (wait_ready) look again. */
    atomic_fetch_add(&q->hdr->head_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&q->hdr->readers_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->head_word, INT_MAX);
}

void shmb_q_shutdown(struct shmb_q *q)
{
    atomic_store(&q->hdr->state, SHMB_QUEUE_SHUTDOWN);
    atomic_fetch_add(&q->hdr->head_word, 1);
    atomic_fetch_add(&q->hdr->free_word, 1);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&q->hdr->readers_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->head_word, INT_MAX);
    if (atomic_load_explicit(&q->hdr->writer_waiting, memory_order_relaxed) != 0)
        futex_wake(&q->hdr->free_word, INT_MAX);
}

void shmb_q_stats(const struct shmb_q *q, struct shmb_q_stats *out)
{
    uint64_t head = atomic_load_explicit(&q->hdr->head, memory_order_acquire), next;
    uint32_t s;

    memset(out, 0, sizeof(*out));
    out->head = head;
    out->blocker = -1;
    out->state = atomic_load_explicit(&q->hdr->state, memory_order_relaxed);
    out->readers_waiting = atomic_load_explicit(&q->hdr->readers_waiting, memory_order_relaxed);
    out->writer_waiting = atomic_load_explicit(&q->hdr->writer_waiting, memory_order_relaxed);
    for (s = 0; s < q->seats; s++) {
        switch (atomic_load_explicit(&q->seat[s].state, memory_order_relaxed)) {
        case SHMB_SEAT_LIVE:
            out->live++;
            next = atomic_load_explicit(&q->seat[s].next, memory_order_relaxed);
            /* A next past head (scribbled, or read before head moved) is
             * no depth. */
            if (next < head && head - next > out->depth) {
                out->depth = head - next;
                out->blocker = (int32_t)s;
            }
            break;
        case SHMB_SEAT_DEAD:
            out->dead++;
            break;
        default:
            out->free++;
            break;
        }
    }
}
