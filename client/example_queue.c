// SPDX-License-Identifier: Apache-2.0
/* A broadcast queue: one writer, two reader processes; every reader gets
 * every message, in order. docs/queues.md's example. Build: cc example_queue.c
 * $(pkg-config --cflags --libs shmbroker) */
#include <errno.h>
#include <shmbroker.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int reader(int seat)
{
    shmb_t *c = shmb_new();
    shmb_queue_t *q;
    const void *msg;
    size_t len;
    int rc;

    if (shmb_connect(c, NULL, "reader") < 0 || shmb_queue_open(c, "steps", seat, &q) < 0)
        return fprintf(stderr, "%s\n", shmb_errmsg(c)), 1;
    while ((rc = shmb_queue_dequeue(q, &msg, &len, 5000)) == 0) /* in place, no copy */
        printf("seat %d: %.*s\n", seat, (int)len, (const char *)msg);
    if (rc != -EPIPE) /* -EPIPE: the writer closed and everything was read */
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
    shmb_queue_close(q);
    shmb_close(c);
    return rc == -EPIPE ? 0 : 1;
}

int main(void)
{
    shmb_t *c = shmb_new();
    shmb_queue_t *w;
    char text[64];
    void *slot;

    /* 2 reader seats, 8 slots of 64 KiB; gone once writer and readers have left. */
    if (shmb_connect(c, NULL, "writer") < 0 ||
        shmb_queue_create(c, "steps", 2, 8, 65536, SHMB_QUEUE_TEMPORARY) < 0 ||
        shmb_queue_open(c, "steps", SHMB_QUEUE_WRITER, &w) < 0)
        return fprintf(stderr, "%s\n", shmb_errmsg(c)), 1;
    for (int seat = 0; seat < 2; seat++)
        if (fork() == 0)
            exit(reader(seat));
    shmb_queue_wait_ready(w, 5000); /* both seats taken */
    for (int i = 0; i < 3; i++) {
        int n = snprintf(text, sizeof(text), "step %d", i);
        shmb_queue_enqueue(w, text, (size_t)n, -1); /* copies into the slot */
    }
    shmb_queue_reserve(w, 5, &slot, -1); /* zero-copy: fill the slot itself */
    memcpy(slot, "done.", 5);
    shmb_queue_publish(w, 5);
    shmb_queue_close(w); /* end of queue for the readers */
    while (wait(NULL) > 0)
        ;
    shmb_close(c);
    return 0;
}
