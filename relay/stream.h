// SPDX-License-Identifier: Apache-2.0
/*
 * One stream of a queue between hosts (forward.c): what its thread and the
 * loop share under its mutex, and the thread's side. OUT (the writer's
 * host): the thread holds reader seats of the local queue and reads each
 * message once for the loop to send. IN (the readers' host): the thread is
 * the local queue's writer and publishes what the loop put together. The
 * thread has a daemon connection of its own, as the daemon's calls wait;
 * it wakes the loop through the stream's async handle. An OUT thread sends
 * what it read itself when the UCP worker takes calls from any thread
 * (stream_out_send, forward.c's); stream.c knows no peer and no UCX.
 */
#ifndef SHMB_RELAY_STREAM_H
#define SHMB_RELAY_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include <uv.h>

#include "relay.h"

#define FWD_WINDOW 128         /* messages sent and not yet published there */
#define FWD_WINDOW_BYTES (64u << 20) /* their bytes: a larger message goes alone */
/* Sends unacknowledged past which the writer's relay holds what it reads
 * for their acknowledgement (Nagle's rule): a few, so that messages a
 * millisecond apart never wait for an acknowledgement even where the
 * round trip takes several, while back-to-back ones fill batches. */
#define FWD_HOLD_SENDS 4
/* Sends unacknowledged at which a send asks for an acknowledgement (the
 * readers' relay acknowledges only those, or half the window): one
 * acknowledgement in three messages a millisecond apart, not each. */
#define FWD_ASK_SENDS 3
#define FWD_WAIT_MS 200        /* a thread's wait, between looks at its stop flag */
#define FWD_MSG_MAX (1ull << 30) /* a message longer than a slot's largest is not one */
#define FWD_STREAMS_MAX 256    /* streams at once, both directions */
#define FWD_ENDED_KEEP 16      /* ended streams kept to say why: the last ones */
#define FWD_PEER_STREAMS_MAX 64 /* queues one peer may read here at once: a thread each */
#define FWD_WAITERS_MAX 64     /* local subscriptions waiting for their answer */
#define FWD_RECORDS_MAX 1024   /* where remote hosts' streams stopped, for their return */

enum stream_dir { OUT, IN };
enum stream_state { S_OPENING, S_RUNNING, S_CUT, S_ENDED };

/* One message between the thread and the loop. */
struct fmsg {
    STAILQ_ENTRY(fmsg) link;
    size_t len;
    unsigned char data[];
};
STAILQ_HEAD(fmsg_list, fmsg);

/* A seat's answer, from the thread (OUT) or the peer (IN). */
struct sub_result {
    int code;
    unsigned seat;
    uint64_t missed;
    char text[WIRE_TEXT_MAX + 1];
};

struct stream {
    uv_async_t *async; /* the loop's: wakes it */
    LIST_ENTRY(stream) link;
    struct relay *relay;
    enum stream_dir dir;
    struct peer *peer; /* NULL once the peer is gone */
    char peer_name[RELAY_NAME_MAX + 1];
    uint64_t id; /* the subscriber's number for it */
    char queue[WIRE_QUEUE_NAME_MAX + 1];
    unsigned seat_from, seat_to;
    uint64_t slots, slot_size; /* IN: the local queue's, when the relay makes it */
    unsigned seats;
    /* Shared with the thread, under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, stop, exited;
    enum stream_state state;
    int end_code;
    char end_text[WIRE_TEXT_MAX + 1];
    struct fmsg_list msgs;     /* OUT: to send (by the loop); IN: to publish */
    ucp_ep_h ep;               /* OUT: the peer's endpoint until it goes: with a
                                * multi-thread worker the thread sends on it itself */
    uint64_t thread_msgs, thread_bytes; /* OUT: what it sent, not yet in the peer's counts */
    uint64_t sent_by_thread;   /* OUT: of wire_sends, those the thread sent itself */
    uint64_t marks[FWD_WINDOW]; /* OUT: the message count at the end of each send not
                                 * yet acknowledged, oldest at marks_head */
    unsigned marks_head, marks_len;
    unsigned nmsgs;
    uint64_t queued_bytes;     /* IN: the bytes of msgs */
    uint64_t produced, acked;  /* OUT: messages read, and published there */
    uint64_t sizes[FWD_WINDOW]; /* OUT: the sizes of the last ones, by count */
    uint64_t unacked_bytes;    /* OUT: the bytes of those not yet published there */
    uint64_t published;        /* IN: messages published here */
    shmb_queue_t *in_q;        /* IN: the local queue, while the thread holds it */
    bool in_idle;              /* IN: the thread waits for messages (in cv) */
    bool in_objects;           /* IN: it published a message larger than a slot */
    uint64_t published_now;    /* IN: of published, those the loop published itself */
    /* Counters for status: where a message's time goes (notes in status). */
    uint64_t handoffs;         /* OUT: the thread's wake-ups of the loop with messages */
    uint64_t holds;            /* OUT: messages held for an acknowledgement (Nagle) */
    uint64_t sent_on_ack;      /* OUT: of wire_sends, those the loop sent with an ack */
    uint64_t window_waits;     /* OUT: the thread found the window full and waited */
    uint64_t wire_sends;       /* OUT: active messages sent with messages (batches, pieces);
                                * IN: those received */
    uint64_t acks;             /* OUT: acknowledgements received; IN: sent */
    uint64_t thread_rounds;    /* IN: the thread's wake-ups to publish */
    unsigned want_seats;       /* OUT: seats asked for */
    struct sub_result results[WIRE_QSEATS_MAX];
    unsigned nresults;         /* OUT: seat answers for the loop to send */
    uint64_t base;             /* OUT: the queue's message count when its first seat opened */
    /* Loop side. */
    bool end_sent;
    bool ended_by_peer;        /* IN: its QEND came */
    uint64_t acked_sent;       /* IN: the count last acknowledged */
    uint64_t received;         /* IN: messages that came whole */
    uint64_t ack_asked;        /* IN: of those, up to which the peer asked for an ack */
    unsigned char *asm_buf;    /* IN: the message being put together */
    uint64_t asm_total, asm_len;
    bool asm_open;
    struct local_client *waiters[FWD_WAITERS_MAX]; /* IN: subscriptions in order */
    unsigned nwaiters;
    uint64_t missed;
    unsigned granted; /* IN: seats the writer's relay gave this stream */
};

/* Where a remote host's stream of a queue stopped: its count of messages. */
/* The threads' bodies (pthread_create's start routines). */
void *stream_out_thread(void *arg);
void *stream_in_thread(void *arg);
/* IN, from the loop with s->mu held: publish len bytes into the local
 * queue now, when the thread waits idle and the queue takes them without a
 * wait or a daemon call (within a slot, a free slot). true if published;
 * false: hand them to the thread as before. One wake-up less a message. */
bool stream_in_publish_now(struct stream *s, const void *data, size_t len);
/* OUT, with s->mu held, from the thread (from_thread, on s->ep) or the
 * loop (to s->peer): send s->msgs in order, the small ones that came
 * together as batches, freeing each once sent. What the thread could not
 * send stays in s->msgs (it hands it to the loop). */
void stream_out_send(struct stream *s, bool from_thread);
/* OUT, with s->mu held: s->acked moved; forget the sends it covers. */
void stream_out_acked(struct stream *s);
/* Whether the loop asked s's thread to stop (under its lock). */
bool stream_stopping(struct stream *s);

#endif
