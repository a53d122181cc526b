// SPDX-License-Identifier: Apache-2.0
/*
 * A queue's memory made and freed off the loop: a job per queue, the
 * requests waiting for it, the part that runs on another thread and the
 * loop's part after. queue.c starts the jobs; this room never calls it.
 */
#ifndef SHMB_QUEUE_JOB_H
#define SHMB_QUEUE_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "queue_types.h"
#include "segment.h"

/* What a job does off the loop. */
enum queue_job_kind {
    QUEUE_JOB_MAKE, /* reserve a new queue's pages, map and format them */
    QUEUE_JOB_FREE, /* unmap a deleted queue and close its memfd */
};

/* Work on one queue's memory off the loop (a gigabyte's pages take a tenth
 * of a second to reserve or free), and who waits for it. */
struct queue_job {
    enum queue_job_kind kind;
    struct queue_set *set;
    struct queue *q;              /* MAKE: in set->making; FREE: out of every list */
    struct queue_waiters waiters; /* answered by queue_job_finish */
    char memfd[SEGMENT_MEMFD_NAME_MAX + 1]; /* MAKE: the memfd's name */
    char what[160];               /* MAKE: the queue for messages */
    int rc;                       /* queue_job_run's outcome */
    struct shmb_error err;
};

/* Free q's descriptor, mapping and memory; it is out of the list already. */
void queue_free(struct queue *q);

/* A queue's geometry in words, for messages. */
void queue_geometry(char *out, size_t len, uint32_t seats, uint64_t slots, uint64_t slot_size);

/* A new job of kind on q; NULL when memory ran out. */
struct queue_job *queue_job_new(struct queue_set *set, struct queue *q,
                                enum queue_job_kind kind);

/* The loop's part of making a queue: attach it and join the set, or free
 * it. 0 or the job's error. */
int queue_make_finish(struct queue_job *job);

/* w waits for job. */
void queue_job_wait(struct queue_job *job, struct queue_waiter *w);

/* Hand job to the offload; false when there is none or it refused. */
bool queue_job_offload(struct queue_set *set, struct queue_job *job);

/* Stop waiting (its request's connection closed): w is not answered. The
 * work goes on; a queue being made is made. */
void queue_waiter_cancel(struct queue_waiter *w);

/* The part of job that runs off the loop, in another thread: it touches
 * only the job's own queue, which the loop does not read meanwhile. */
void queue_job_run(struct queue_job *job);

/* The part of job that runs on the loop once queue_job_run returned: the
 * queue made joins the set (or, failed, goes), waiters are answered, and
 * the job is freed. */
void queue_job_finish(struct queue_job *job);

#endif
