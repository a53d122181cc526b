// SPDX-License-Identifier: Apache-2.0
/*
 * Broadcast queues: creation (a sealed memfd, checked against the pool's
 * bounds and the host's memory, its pages made off the loop), membership by
 * connection, the failure handling vLLM lacks (a member's connection
 * closing), shutdown, the lease of queues nobody holds, and deletion.
 */
#include "queue.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/names.h"
#include "../proto/text.h"
#include "../proto/utf8.h"
#include "clock.h"
#include "host.h"
#include "log.h"
#include "segment.h"

void queue_set_init(struct queue_set *set, const char *prefix)
{
    memset(set, 0, sizeof(*set));
    TAILQ_INIT(&set->list);
    TAILQ_INIT(&set->making);
    snprintf(set->prefix, sizeof(set->prefix), "%s", prefix);
    set->max_size = QUEUE_SIZE_MAX;
}

/* The queue called name in pool on list, or NULL. */
static struct queue *queue_find_on(const struct queue_list *list, const struct pool *pool,
                                   const char *name)
{
    struct queue *q;

    TAILQ_FOREACH(q, list, link)
        if (q->pool == pool && strcmp(q->name, name) == 0)
            return q;
    return NULL;
}

struct queue *queue_find(const struct queue_set *set, const struct pool *pool,
                         const char *name)
{
    return queue_find_on(&set->list, pool, name);
}

/* The queue called name in pool that is being made, or NULL. */
static struct queue *queue_find_making(const struct queue_set *set, const struct pool *pool,
                                       const char *name)
{
    return queue_find_on(&set->making, pool, name);
}

void queue_names(const struct queue_set *set, const struct pool *pool, char *out, size_t len)
{
    const struct queue *q;
    size_t used = 0;

    snprintf(out, len, "none");
    TAILQ_FOREACH(q, &set->list, link) {
        int n;

        if (q->pool != pool)
            continue;
        n = snprintf(out + used, len - used, "%s%s", used > 0 ? ", " : "", q->name);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}

unsigned queue_count(const struct queue_set *set, const struct pool *pool)
{
    const struct queue *q;
    unsigned n = 0;

    TAILQ_FOREACH(q, &set->list, link)
        n += pool == NULL || q->pool == pool;
    TAILQ_FOREACH(q, &set->making, link)
        n += pool == NULL || q->pool == pool;
    return n;
}

uint64_t queue_bytes(const struct queue_set *set, const struct pool *pool)
{
    const struct queue *q;
    uint64_t n = 0;

    TAILQ_FOREACH(q, &set->list, link)
        n += q->pool == pool ? q->size : 0;
    TAILQ_FOREACH(q, &set->making, link)
        n += q->pool == pool ? q->size : 0;
    return n;
}

/* -ENOMEM when size bytes more would not fit the host's memory (the check
 * memfd pools pass at start), beside the queues being made (their pages
 * are not all taken yet, and each was checked alone). */
static int queue_check_memory(const struct queue_set *set, const char *name, size_t size,
                              const char *geometry, struct shmb_error *err)
{
    struct host_memory mem;
    const struct queue *q;
    uint64_t room, making = 0;

    if (host_memory(&mem, NULL) < 0)
        return 0; /* nothing to judge by: posix_fallocate still judges */
    room = host_memory_room(&mem);
    TAILQ_FOREACH(q, &set->making, link)
        making += q->size;
    room = room > making ? room - making : 0;
    if (size > room)
        return shmb_error_set(err, -ENOMEM,
                              "Queue '%s' needs %zu bytes (%s); the host has %llu bytes of "
                              "memory left (MemAvailable / memory cgroup). Use fewer or "
                              "smaller slots.",
                              name, size, geometry, (unsigned long long)room);
    return 0;
}

int queue_check_fds(unsigned need, const char *what, struct shmb_error *err)
{
    int fds[QUEUE_FD_SPARE + 2 + QUEUE_MAX];
    unsigned n = 0, i;
    int saved = 0;
    struct rlimit lim;

    if (need > sizeof(fds) / sizeof(fds[0]))
        need = sizeof(fds) / sizeof(fds[0]);
    /* Probing by taking them is exact where counting /proc would not be:
     * only the loop opens descriptors but for the jobs of queues being
     * made, which the caller counts in need. */
    for (n = 0; n < need; n++)
        if ((fds[n] = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0)) < 0 &&
            (fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
            saved = errno;
            break;
        }
    for (i = 0; i < n; i++)
        close(fds[i]);
    if (n == need)
        return 0;
    if (getrlimit(RLIMIT_NOFILE, &lim) < 0)
        lim.rlim_cur = 0;
    return shmb_error_set(err, -EMFILE,
                          "Cannot %s: shmbrokerd has %u file descriptors left of its limit "
                          "of %llu (%s) and keeps %u for new clients and queues being made. "
                          "Delete unused queues, close connections, or raise the limit "
                          "(ulimit -n, LimitNOFILE=).",
                          what, n, (unsigned long long)lim.rlim_cur,
                          strerror(saved != 0 ? saved : EMFILE), need - 1);
}

/* Refuse a queue of size bytes that would take pool past its bounds:
 * -EDQUOT naming the bound and the option that raises it. */
static int queue_check_quota(const struct queue_set *set, const struct pool *pool,
                             const char *name, size_t size, const char *geometry,
                             struct shmb_error *err)
{
    unsigned n = queue_count(set, pool);
    uint64_t used = queue_bytes(set, pool), cap = pool->cfg.max_queue_bytes;
    char most[32];

    if (pool->cfg.max_queues != 0 && n >= pool->cfg.max_queues)
        return shmb_error_set(err, -EDQUOT,
                              "Pool '%s' has %u queues, its limit (max-queues= of pool '%s', "
                              "or --max-queues): queue '%s' is not created. Delete queues "
                              "the pool no longer uses (queue_delete), or raise the limit.",
                              pool->cfg.name, n, pool->cfg.name, name);
    if (cap != 0 && (used > cap || size > cap - used))
        return shmb_error_set(err, -EDQUOT,
                              "Queue '%s' needs %zu bytes (%s); pool '%s' has %llu bytes of "
                              "queues and may have %llu (%s: max-queue-bytes= of pool '%s', "
                              "or --max-queue-bytes). Use fewer or smaller slots, delete "
                              "queues the pool no longer uses, or raise the limit.",
                              name, size, geometry, pool->cfg.name, (unsigned long long)used,
                              (unsigned long long)cap, shmb_format_bytes(cap, most, sizeof(most)),
                              pool->cfg.name);
    return 0;
}

int queue_create(struct queue_set *set, struct pool *pool, const char *name, uint32_t seats,
                 uint64_t slots, uint64_t slot_size, bool temporary,
                 struct queue_waiter *waiter, struct queue **out, bool *created,
                 struct shmb_error *err)
{
    char geometry[96], had[96], what[160];
    struct queue_job *job = NULL;
    struct queue *q;
    unsigned making;
    size_t size;
    int rc;

    *out = NULL;
    *created = false;
    queue_geometry(geometry, sizeof(geometry), seats, slots, slot_size);
    if ((q = queue_find(set, pool, name)) != NULL ||
        (q = queue_find_making(set, pool, name)) != NULL) {
        queue_geometry(had, sizeof(had), q->seats, q->slots, q->slot_size);
        if (q->shut_down)
            return shmb_error_set(err, -EEXIST,
                                  "Queue '%s' of pool '%s' was shut down and is still held "
                                  "by members; it goes when they close it. Use another "
                                  "name, or wait for them to close.",
                                  name, pool->cfg.name);
        if (q->seats != seats || q->slots != slots || q->slot_size != slot_size)
            return shmb_error_set(err, -EEXIST,
                                  "Queue '%s' of pool '%s' exists with %s; this request "
                                  "asks for %s. Open it as it is, or delete it first.",
                                  name, pool->cfg.name, had, geometry);
        if (q->making != NULL) {
            /* Its maker's request is answered first: this one is the
             * next to wait for it. */
            if (waiter == NULL)
                return shmb_error_set(err, -EBUSY,
                                      "Queue '%s' of pool '%s' is being created by another "
                                      "request; try again once it is.",
                                      name, pool->cfg.name);
            queue_job_wait(q->making, waiter);
            return -EINPROGRESS;
        }
        /* Its requester opens it next: a lease about to run out must not
         * delete it in between. Nobody holds it: its lease starts again. */
        if (q->idle_since_ms != 0)
            q->idle_since_ms = clock_now_ms();
        *out = q;
        return 0;
    }
    if (set->n >= QUEUE_MAX)
        return shmb_error_set(err, -EMFILE,
                              "This shmbrokerd holds %u queues, its limit (%d). Delete "
                              "queues that are no longer used (queue_delete), or shut them "
                              "down.",
                              set->n, QUEUE_MAX);
    if ((size = shmb_q_size(seats, slots, slot_size)) == 0)
        return shmb_error_set(err, -EINVAL, "Queue '%s': %s is not a valid geometry.", name,
                              geometry);
    if ((rc = queue_check_memory(set, name, size, geometry, err)) < 0)
        return rc;
    if (size > set->max_size) {
        char most[32];

        return shmb_error_set(err, -EINVAL,
                              "Queue '%s' would need %zu bytes (%s); a queue may have at most "
                              "%llu bytes (%s), since its memory is made in one go. Use "
                              "fewer or smaller slots: messages larger than a slot go as "
                              "store objects anyway.",
                              name, size, geometry, (unsigned long long)set->max_size,
                              shmb_format_bytes(set->max_size, most, sizeof(most)));
    }
    /* Past the size no queue may have, raising the pool's bound would not
     * help: that refusal comes first. */
    if ((rc = queue_check_quota(set, pool, name, size, geometry, err)) < 0)
        return rc;
    snprintf(what, sizeof(what), "create queue '%s'", name);
    /* The queues being made open their memfds off the loop, later: each
     * needs its descriptor as much as this one does. */
    making = 0;
    TAILQ_FOREACH(q, &set->making, link)
        making++;
    if ((rc = queue_check_fds(QUEUE_FD_SPARE + 1 + making, what, err)) < 0)
        return rc;
    if ((q = shmb_calloc(1, sizeof(*q))) == NULL ||
        (job = queue_job_new(set, q, QUEUE_JOB_MAKE)) == NULL) {
        shmb_free(q);
        return shmb_error_set(err, -ENOMEM, "Out of memory for queue '%s'.", name);
    }
    q->fd = -1;
    snprintf(q->name, sizeof(q->name), "%s", name);
    q->pool = pool;
    q->seats = seats;
    q->slots = slots;
    q->slot_size = slot_size;
    q->size = size;
    q->temporary = temporary;
    q->making = job;
    /* The memfd's name only shows in /proc: cut rather than refuse. */
    snprintf(job->memfd, sizeof(job->memfd), "%.*s.q.%s",
             (int)(SEGMENT_MEMFD_NAME_MAX - 3 - strlen(name)), set->prefix, name);
    snprintf(job->what, sizeof(job->what), "queue '%s' (%s)", name, geometry);
    /* Counted and found by name from now on: its bounds hold while it is
     * being made, and a second request for it waits for this one. */
    TAILQ_INSERT_TAIL(&set->making, q, link);
    set->n++;
    *created = true;
    if (waiter != NULL) {
        queue_job_wait(job, waiter);
        if (queue_job_offload(set, job))
            return -EINPROGRESS;
        queue_waiter_cancel(waiter);
    }
    queue_job_run(job);
    if ((rc = queue_make_finish(job)) < 0) {
        *created = false;
        *err = job->err;
    } else
        *out = q;
    shmb_free(job);
    return rc;
}

unsigned queue_roles_of(const struct queue_set *set, const void *owner)
{
    const struct queue *q;
    unsigned n = 0, s;

    TAILQ_FOREACH(q, &set->list, link) {
        n += q->writer == owner;
        for (s = 0; s < q->seats; s++)
            n += q->seat[s].owner == owner;
    }
    return n;
}

/* -ECANCELED once q is shut down. */
static int queue_check_open(const struct queue *q, struct shmb_error *err)
{
    if (q->shut_down)
        return shmb_error_set(err, -ECANCELED,
                              "Queue '%s' was shut down; it goes once its members close "
                              "it. Create a new one to go on.",
                              q->name);
    return 0;
}

const char *queue_member_pid(const struct queue_member *who, char *buf, size_t len)
{
    if (who->pid > 0)
        snprintf(buf, len, "pid %d", (int)who->pid);
    else if (who->own_pid > 0)
        snprintf(buf, len, "a process in another pid namespace (pid %d there, uid %u)",
                 (int)who->own_pid, (unsigned)who->uid);
    else
        snprintf(buf, len, "a process in another pid namespace (uid %u)", (unsigned)who->uid);
    return buf;
}

int queue_open_writer(struct queue *q, const void *owner, const struct queue_member *who,
                      struct shmb_error *err)
{
    char pid[96];
    int rc;

    if ((rc = queue_check_open(q, err)) < 0)
        return rc;
    if (q->writer != NULL)
        return shmb_error_set(err, -EBUSY,
                              "Queue '%s' already has a writer: client %llu (%s, '%s'). "
                              "A queue has one writer; close it there first.",
                              q->name, (unsigned long long)q->writer_who.client,
                              queue_member_pid(&q->writer_who, pid, sizeof(pid)),
                              q->writer_who.name);
    q->writer = owner;
    q->writer_who = *who;
    q->had_writer = true;
    q->idle_since_ms = 0;
    shmb_q_writer_take(&q->q, ++q->writer_epoch);
    return 0;
}

/* "0, 3, 5": the free or dead seats of q. */
static void queue_open_seats(const struct queue *q, char *out, size_t len)
{
    size_t used = 0;
    uint32_t s;

    out[0] = '\0';
    for (s = 0; s < q->seats; s++) {
        int n;

        if (q->seat[s].state == SHMB_SEAT_LIVE)
            continue;
        n = snprintf(out + used, len - used, "%s%u", used > 0 ? ", " : "", s);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}

int queue_open_reader(struct queue *q, int seat, const void *owner,
                      const struct queue_member *who, uint32_t *seat_out, uint64_t *epoch,
                      struct shmb_error *err)
{
    char pid[96];
    char open_seats[SHMB_QUEUE_SEATS_MAX * 4];
    struct queue_seat *st;
    int rc;

    if ((rc = queue_check_open(q, err)) < 0)
        return rc;
    if (seat >= (int)q->seats || seat < -1)
        return shmb_error_set(err, -EINVAL,
                              "\"seat\" must be between 0 and %u: queue '%s' has %u seats, "
                              "not %d.",
                              q->seats - 1, q->name, q->seats, seat);
    if (seat < 0) {
        for (seat = 0; seat < (int)q->seats; seat++)
            if (q->seat[seat].state != SHMB_SEAT_LIVE)
                break;
        if (seat == (int)q->seats)
            return shmb_error_set(err, -EBUSY,
                                  "Queue '%s' has no seat free: all %u are held by live "
                                  "readers. Close one, or create the queue with more seats.",
                                  q->name, q->seats);
    }
    st = &q->seat[seat];
    if (st->state == SHMB_SEAT_LIVE) {
        queue_open_seats(q, open_seats, sizeof(open_seats));
        return shmb_error_set(err, -EBUSY,
                              "Seat %d of queue '%s' is taken: client %llu (%s, '%s'). "
                              "Free seats: %s.",
                              seat, q->name, (unsigned long long)st->who.client,
                              queue_member_pid(&st->who, pid, sizeof(pid)), st->who.name,
                              open_seats[0] != '\0' ? open_seats : "none");
    }
    st->owner = owner;
    st->state = SHMB_SEAT_LIVE;
    st->who = *who;
    q->idle_since_ms = 0;
    /* The epoch is reported as a JSON integer: one scribbled past that
     * range starts again (the seat's holder compares it for equality). */
    if (atomic_load(&q->q.seat[seat].epoch) >= QUEUE_COUNT_MAX)
        atomic_store(&q->q.seat[seat].epoch, 0);
    shmb_q_seat_take(&q->q, (uint32_t)seat);
    queue_expect_read(q, atomic_load(&q->q.seat[seat].next));
    *seat_out = (uint32_t)seat;
    *epoch = atomic_load(&q->q.seat[seat].epoch);
    return 0;
}

/* Whether a member holds q: its writer, or a live reader seat. */
static bool queue_held(const struct queue *q)
{
    uint32_t s;

    if (q->writer != NULL)
        return true;
    for (s = 0; s < q->seats; s++)
        if (q->seat[s].state == SHMB_SEAT_LIVE)
            return true;
    return false;
}

/* Whether q is left to be deleted: nobody holds it, and it was temporary
 * and had a writer, or was shut down. */
static bool queue_done(const struct queue *q)
{
    return !queue_held(q) && ((q->temporary && q->had_writer) || q->shut_down);
}

/* Take q out of the set, with its objects, and free it: its memory off the
 * loop when there is an offload (then, with a waiter, -EINPROGRESS: the
 * waiter is told once the memory is freed), else at once. */
static int queue_remove(struct queue_set *set, struct queue *q, bool objects,
                        struct queue_waiter *waiter)
{
    struct queue_job *job;

    TAILQ_REMOVE(&set->list, q, link);
    set->n--;
    if (objects)
        queue_drop_objects(q);
    log_info("queue '%s' of pool '%s' deleted", q->name, q->pool->cfg.name);
    if (set->offload != NULL && (job = queue_job_new(set, q, QUEUE_JOB_FREE)) != NULL) {
        if (waiter != NULL)
            queue_job_wait(job, waiter);
        if (queue_job_offload(set, job))
            return waiter != NULL ? -EINPROGRESS : 0;
        if (waiter != NULL)
            queue_waiter_cancel(waiter);
        shmb_free(job);
    }
    queue_free(q);
    return 0;
}

/* Delete q if it is left to be (queue_done); else, once nobody holds it,
 * its lease starts. */
static void queue_settle(struct queue_set *set, struct queue *q)
{
    if (queue_done(q))
        queue_remove(set, q, true, NULL);
    else if (!queue_held(q) && q->idle_since_ms == 0)
        q->idle_since_ms = clock_now_ms();
}

unsigned queue_expire(struct queue_set *set, uint64_t now_ms)
{
    struct queue *q, *next;
    unsigned n = 0;

    if (set->lease_ms == 0)
        return 0;
    for (q = TAILQ_FIRST(&set->list); q != NULL; q = next) {
        next = TAILQ_NEXT(q, link);
        if (q->idle_since_ms == 0 || queue_held(q) || now_ms < q->idle_since_ms ||
            now_ms - q->idle_since_ms < set->lease_ms)
            continue;
        log_info("queue '%s' of pool '%s': nobody has held it for %llu ms (--queue-lease "
                 "%llu ms); deleting it",
                 q->name, q->pool->cfg.name, (unsigned long long)(now_ms - q->idle_since_ms),
                 (unsigned long long)set->lease_ms);
        queue_remove(set, q, true, NULL);
        n++;
    }
    return n;
}

/* "the writer and seats 1, 2": the roles owner holds on q. */
static void queue_roles_text(const struct queue *q, const void *owner, char *out, size_t len)
{
    size_t used = 0;
    uint32_t s, n = 0;
    int w;

    out[0] = '\0';
    if (q->writer == owner)
        used = (size_t)snprintf(out, len, "the writer role");
    for (s = 0; s < q->seats; s++) {
        if (q->seat[s].owner != owner)
            continue;
        w = snprintf(out + used, len - used, "%s%u",
                     n == 0 ? (used > 0 ? " and seat " : "seat ") : ", ", s);
        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
        n++;
    }
    if (used == 0)
        snprintf(out, len, "no role");
}

int queue_close_roles(struct queue_set *set, struct queue *q, const void *owner,
                      enum queue_role role, int seat, unsigned *closed,
                      struct shmb_error *err)
{
    char holds[SHMB_QUEUE_SEATS_MAX * 4 + 32];
    unsigned n = 0;
    uint32_t s;

    if (role != QUEUE_ROLE_READER && q->writer == owner) {
        q->writer = NULL;
        shmb_q_writer_gone(&q->q);
        n++;
    }
    if (role != QUEUE_ROLE_WRITER) {
        uint64_t leaving = 0;

        for (s = 0; s < q->seats; s++)
            if (q->seat[s].owner == owner && (seat < 0 || (uint32_t)seat == s))
                leaving |= UINT64_C(1) << s;
        /* All at once, while their holder is still named. */
        queue_forgo_reads(q, leaving);
        for (s = 0; s < q->seats; s++) {
            if (!(leaving & (UINT64_C(1) << s)))
                continue;
            q->seat[s].owner = NULL;
            q->seat[s].state = SHMB_SEAT_FREE;
            memset(&q->seat[s].who, 0, sizeof(q->seat[s].who));
            shmb_q_seat_drop(&q->q, s, false);
            n++;
        }
    }
    *closed = n;
    if (n == 0) {
        queue_roles_text(q, owner, holds, sizeof(holds));
        return shmb_error_set(err, -ENOENT,
                              "This connection holds no %s of queue '%s' to close; it holds "
                              "%s there.",
                              role == QUEUE_ROLE_WRITER ? "writer role"
                              : seat >= 0              ? "such seat"
                                                       : "role",
                              q->name, holds);
    }
    queue_settle(set, q);
    return 0;
}

unsigned queue_owner_gone(struct queue_set *set, const void *owner)
{
    char pid[96];
    struct queue *q, *next;
    unsigned n = 0;
    uint32_t s;

    for (q = TAILQ_FIRST(&set->list); q != NULL; q = next) {
        uint64_t leaving = 0;
        bool held = false;

        next = TAILQ_NEXT(q, link);
        for (s = 0; s < q->seats; s++)
            if (q->seat[s].owner == owner)
                leaving |= UINT64_C(1) << s;
        /* All at once, while their holder's pins are still there. */
        queue_forgo_reads(q, leaving);
        if (q->writer == owner) {
            q->writer = NULL;
            shmb_q_writer_gone(&q->q);
            log_info("queue '%s': its writer (%s) is gone; readers drain it, then see "
                     "its end",
                     q->name, queue_member_pid(&q->writer_who, pid, sizeof(pid)));
            held = true;
            n++;
        }
        for (s = 0; s < q->seats; s++) {
            if (q->seat[s].owner != owner)
                continue;
            /* who stays: status names the reader that died. */
            q->seat[s].who.holder = NULL; /* freed with its connection */
            q->seat[s].owner = NULL;
            q->seat[s].state = SHMB_SEAT_DEAD;
            shmb_q_seat_drop(&q->q, s, true);
            log_info("queue '%s': the reader at seat %u (%s) is gone; the writer no "
                     "longer waits for it",
                     q->name, s, queue_member_pid(&q->seat[s].who, pid, sizeof(pid)));
            held = true;
            n++;
        }
        if (held)
            queue_settle(set, q);
    }
    return n;
}

void queue_shutdown(struct queue_set *set, struct queue *q)
{
    if (!q->shut_down)
        log_info("queue '%s' of pool '%s' shut down", q->name, q->pool->cfg.name);
    q->shut_down = true;
    shmb_q_shutdown(&q->q);
    queue_settle(set, q);
}

void queue_shutdown_all(struct queue_set *set)
{
    struct queue *q;

    set->stopping = true;
    TAILQ_FOREACH(q, &set->list, link) {
        q->shut_down = true;
        shmb_q_shutdown(&q->q);
    }
}

/* "writer client 3 (pid 10, 'w'), seat 0 client 4 (pid 11, 'r')": who
 * holds q. */
static void queue_members_text(const struct queue *q, char *out, size_t len)
{
    char pid[96];
    size_t used = 0;
    uint32_t s;
    int n;

    out[0] = '\0';
    if (q->writer != NULL) {
        n = snprintf(out, len, "the writer, client %llu (%s, '%s')",
                     (unsigned long long)q->writer_who.client,
                     queue_member_pid(&q->writer_who, pid, sizeof(pid)), q->writer_who.name);
        used = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
    }
    for (s = 0; s < q->seats && used + 1 < len; s++) {
        const struct queue_seat *st = &q->seat[s];

        if (st->state != SHMB_SEAT_LIVE)
            continue;
        n = snprintf(out + used, len - used, "%sseat %u, client %llu (%s, '%s')",
                     used > 0 ? "; " : "", s, (unsigned long long)st->who.client,
                     queue_member_pid(&st->who, pid, sizeof(pid)), st->who.name);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
}

int queue_delete(struct queue_set *set, struct queue *q, struct queue_waiter *waiter,
                 struct shmb_error *err)
{
    char members[SHMB_ERROR_MSG_MAX / 2];

    queue_members_text(q, members, sizeof(members));
    if (members[0] != '\0')
        return shmb_error_set(err, -EBUSY,
                              "Queue '%s' is in use by %s. Its members must close it first "
                              "(or shut it down: it goes once they have).",
                              q->name, members);
    return queue_remove(set, q, true, waiter);
}

void queue_drop_pool(struct queue_set *set, const struct pool *pool)
{
    struct queue *q, *next;

    for (q = TAILQ_FIRST(&set->list); q != NULL; q = next) {
        next = TAILQ_NEXT(q, link);
        if (q->pool == pool)
            queue_remove(set, q, false, NULL);
    }
}

void queue_set_free(struct queue_set *set)
{
    struct queue *q;

    while ((q = TAILQ_FIRST(&set->list)) != NULL) {
        TAILQ_REMOVE(&set->list, q, link);
        queue_free(q);
    }
    /* None is left being made once the loop has ended; without a loop
     * (tests), none was ever. */
    while ((q = TAILQ_FIRST(&set->making)) != NULL) {
        TAILQ_REMOVE(&set->making, q, link);
        shmb_free(q->making);
        queue_free(q);
    }
    set->n = 0;
}

void queue_restore_header(struct queue *q)
{
    struct shmb_queue_header *h = q->q.hdr;
    size_t len = strlen(q->name);
    uint32_t s;

    h->version = SHMB_QUEUE_VERSION;
    h->seats = q->seats;
    h->slots = q->slots;
    h->slot_size = q->slot_size;
    h->slot_stride = q->q.slot_stride;
    h->slots_offset = q->q.slots_offset;
    h->total_size = q->size;
    memset(h->name, 0, sizeof(h->name));
    memcpy(h->name, q->name, len);
    h->magic = SHMB_QUEUE_MAGIC;
    /* The states are the daemon's records; the area's words only mirror
     * them, and a member may have scribbled those too. */
    atomic_store(&h->state, q->shut_down              ? SHMB_QUEUE_SHUTDOWN
                            : q->writer == NULL && q->had_writer ? SHMB_QUEUE_WRITER_GONE
                                                                 : SHMB_QUEUE_OPEN);
    atomic_store(&h->writer_live, q->writer != NULL);
    atomic_store(&h->writer_epoch, q->writer_epoch);
    for (s = 0; s < q->seats; s++)
        atomic_store(&q->q.seat[s].state, q->seat[s].state);
}

void queue_status(const struct queue *q, struct queue_status *out)
{
    uint32_t count[SHMB_SEAT_DEAD + 1] = {0};
    struct shmb_q_stats st;
    uint64_t next;
    uint32_t s;

    memset(out, 0, sizeof(*out));
    shmb_q_stats(&q->q, &st);
    out->state = q->shut_down                      ? "shutdown"
                 : q->writer == NULL && q->had_writer ? "writer_gone"
                                                      : "open";
    /* The area's words are the members' to scribble: what is shown stays
     * within what the daemon knows to be possible (a JSON integer, no
     * more behind than slots), never a negative count. */
    out->messages = st.head > QUEUE_COUNT_MAX ? QUEUE_COUNT_MAX : st.head;
    out->writer_waiting = st.writer_waiting != 0;
    out->readers_waiting = st.readers_waiting > q->seats ? q->seats : st.readers_waiting;
    out->blocker = -1;
    /* The seats as the daemon knows them; how far behind, as the area says. */
    for (s = 0; s < q->seats; s++) {
        uint32_t state = q->seat[s].state;

        count[state <= SHMB_SEAT_DEAD ? state : SHMB_SEAT_FREE]++;
        if (state != SHMB_SEAT_LIVE)
            continue;
        next = atomic_load_explicit(&q->q.seat[s].next, memory_order_relaxed);
        out->behind[s] = next < st.head ? st.head - next : 0;
        if (out->behind[s] > q->slots)
            out->behind[s] = q->slots;
        if (out->behind[s] > out->depth || (out->blocker < 0 && out->behind[s] > 0)) {
            out->depth = out->behind[s];
            out->blocker = (int32_t)s;
        }
    }
    out->live = count[SHMB_SEAT_LIVE];
    out->dead = count[SHMB_SEAT_DEAD];
    out->free = count[SHMB_SEAT_FREE];
    /* Only a seat that holds a writer back is its blocker: with no writer,
     * nobody is held. */
    if (q->writer == NULL)
        out->writer_waiting = false;
    if (out->blocker >= 0 &&
        (q->writer == NULL || !(out->depth >= q->slots || out->writer_waiting)))
        out->blocker = -1;
}
