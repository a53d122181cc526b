// SPDX-License-Identifier: Apache-2.0
/*
 * A queue's memory made and freed off the loop: the jobs (a gigabyte's pages
 * take a tenth of a second to reserve or free), the requests that wait for
 * them, and the loop's part once one is done. Never calls queue.c.
 */
#include "queue_job.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "clock.h"
#include "log.h"
#include "queue_overflow.h"

/* Free q's descriptor, mapping and memory; it is out of the list already. */
void queue_free(struct queue *q)
{
    if (q->base != NULL && q->base != MAP_FAILED)
        munmap(q->base, q->size);
    if (q->fd >= 0)
        close(q->fd);
    shmb_free(q->overflow);
    shmb_free(q);
}

/* A queue's geometry in words, for messages. */
void queue_geometry(char *out, size_t len, uint32_t seats, uint64_t slots,
                           uint64_t slot_size)
{
    snprintf(out, len, "%u seat%s, %llu slot%s of %llu bytes", seats, seats == 1 ? "" : "s",
             (unsigned long long)slots, slots == 1 ? "" : "s", (unsigned long long)slot_size);
}

/* A new job of kind on q; NULL when memory ran out. */
struct queue_job *queue_job_new(struct queue_set *set, struct queue *q,
                                       enum queue_job_kind kind)
{
    struct queue_job *job = shmb_calloc(1, sizeof(*job));

    if (job == NULL)
        return NULL;
    job->kind = kind;
    job->set = set;
    job->q = q;
    TAILQ_INIT(&job->waiters);
    return job;
}

void queue_job_run(struct queue_job *job)
{
    struct queue *q = job->q;
    int rc;

    if (job->kind == QUEUE_JOB_FREE) {
        if (q->base != NULL && q->base != MAP_FAILED)
            munmap(q->base, q->size);
        if (q->fd >= 0)
            close(q->fd);
        q->base = NULL;
        q->fd = -1;
        job->rc = 0;
        return;
    }
    if ((rc = segment_memfd_make(job->memfd, q->size, job->what, "use fewer or smaller slots",
                                 &job->err)) < 0) {
        /* Pages that could not be had are memory the host lacks. */
        if (rc == -ENOSPC)
            job->err.code = rc = -ENOMEM;
        job->rc = rc;
        return;
    }
    q->fd = rc;
    q->base = mmap(NULL, q->size, PROT_READ | PROT_WRITE, MAP_SHARED, q->fd, 0);
    if (q->base == MAP_FAILED) {
        int saved = errno;

        q->base = NULL;
        job->rc = shmb_error_set(&job->err, -ENOMEM, "Cannot map queue '%s' (%zu bytes): %s.",
                                 q->name, q->size, strerror(saved));
        return;
    }
    job->rc = shmb_q_format(q->base, q->size, q->name, q->seats, q->slots, q->slot_size,
                            &job->err);
}

/* The loop's part of making a queue: attach it and join the set, or free
 * it. 0 or the job's error. */
int queue_make_finish(struct queue_job *job)
{
    struct queue_set *set = job->set;
    struct queue *q = job->q;
    char geometry[96];
    int rc = job->rc;

    TAILQ_REMOVE(&set->making, q, link);
    q->making = NULL;
    if (rc == 0)
        rc = shmb_q_attach(&q->q, q->base, q->size, &job->err);
    if (rc < 0) {
        set->n--;
        queue_free(q);
        job->q = NULL;
        return rc;
    }
    /* Objects of an earlier queue of this name (before a restart, or
     * committed after it went) would collide with this one's first keys:
     * its messages number from 0 again. Later ones the libraries delete on
     * EEXIST and retry. */
    queue_drop_keys(q, 0, q->slots);
    TAILQ_INSERT_TAIL(&set->list, q, link);
    q->idle_since_ms = clock_now_ms();
    queue_geometry(geometry, sizeof(geometry), q->seats, q->slots, q->slot_size);
    log_info("queue '%s' of pool '%s' created: %s, %zu bytes%s", q->name, q->pool->cfg.name,
             geometry, q->size, q->temporary ? ", temporary" : "");
    if (set->stopping) {
        /* Made after the daemon began to stop: its members would never be
         * told. */
        q->shut_down = true;
        shmb_q_shutdown(&q->q);
    }
    return 0;
}

void queue_job_finish(struct queue_job *job)
{
    struct queue_waiter *w;
    int rc = 0;

    if (job->kind == QUEUE_JOB_MAKE)
        rc = queue_make_finish(job);
    else
        queue_free(job->q); /* its pages went in queue_job_run; the rest goes here */
    /* Each waiter leaves before it is answered: the answer may free it. */
    while ((w = TAILQ_FIRST(&job->waiters)) != NULL) {
        TAILQ_REMOVE(&job->waiters, w, link);
        w->job = NULL;
        w->done(w, rc, &job->err, rc == 0 && job->kind == QUEUE_JOB_MAKE ? job->q : NULL);
    }
    shmb_free(job);
}

void queue_waiter_cancel(struct queue_waiter *w)
{
    if (w->job == NULL)
        return;
    TAILQ_REMOVE(&w->job->waiters, w, link);
    w->job = NULL;
}

/* w waits for job. */
void queue_job_wait(struct queue_job *job, struct queue_waiter *w)
{
    w->job = job;
    TAILQ_INSERT_TAIL(&job->waiters, w, link);
}

/* Hand job to the offload; false when there is none or it refused. */
bool queue_job_offload(struct queue_set *set, struct queue_job *job)
{
    return set->offload != NULL && set->offload(set->offload_arg, job) == 0;
}
