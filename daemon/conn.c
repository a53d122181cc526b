// SPDX-License-Identifier: Apache-2.0
/*
 * The set of connections and each one's opening: the peer's credentials and
 * groups, the hello deadline, the queues' jobs off the loop, the set's
 * handles, its close.
 */
#include "conn.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "clock.h"
#include "conn_turn.h"
#include "log.h"

static void conn_set_hello_watch(struct conn_set *set);

/* Close callback of a handle that never joined the set. */
static void conn_on_close_unlisted(uv_handle_t *handle)
{
    shmb_free(handle);
}

/* conn did not say hello within timeout_ms (--hello-timeout): tell it with
 * an ETIMEDOUT line, then close it. */
static void conn_hello_timeout(struct conn *conn, uint64_t timeout_ms)
{
    char msg[200];
    json_t *reply;

    if (conn_ended(conn))
        return;
    snprintf(msg, sizeof(msg),
             "No hello within %llu ms of connecting (--hello-timeout); closing the "
             "connection. Send {\"op\":\"hello\",\"version\":%d} first.",
             (unsigned long long)timeout_ms, SHMB_PROTOCOL_VERSION);
    log_info("client %s uid %d did not say hello within %llu ms (--hello-timeout); "
             "closing it",
             conn_pid(conn), (int)conn->client.uid, (unsigned long long)timeout_ms);
    reply = shmb_error_reply(NULL, -ETIMEDOUT, msg);
    if (reply == NULL || shmb_json_append_line(&conn->out, reply) < 0 ||
        conn_flush(conn) < 0 ||
        uv_stream_get_write_queue_size((uv_stream_t *)&conn->pipe) != 0) {
        /* A client that does not read its replies would keep a graceful
         * close waiting forever: drop it. */
        json_decref(reply);
        conn_close(conn);
        return;
    }
    json_decref(reply);
    conn_finish(conn);
}

/* A queue's pages made or freed in libuv's thread pool. */
struct conn_job {
    uv_work_t req;
    struct queue_job *job;
};

static void conn_job_run(uv_work_t *req)
{
    queue_job_run(((struct conn_job *)req)->job);
}

static void conn_job_after(uv_work_t *req, int status)
{
    struct conn_job *j = (struct conn_job *)req;

    (void)status; /* never cancelled: the job's queue needs its end */
    queue_job_finish(j->job);
    shmb_free(j);
}

/* Block, in the calling thread, the signals the daemon's loop handles
 * (old: the mask before). */
static void conn_block_signals(sigset_t *old)
{
    static const int sigs[] = {SIGHUP, SIGTERM, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2,
                               SIGPIPE, SIGCHLD, SIGALRM};
    sigset_t set;
    size_t i;

    sigemptyset(&set);
    for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaddset(&set, sigs[i]);
    pthread_sigmask(SIG_BLOCK, &set, old);
}

/* The queues' offload: job to libuv's thread pool. 0, or a libuv error
 * (the queue does the work at once then). */
static int conn_offload(void *arg, struct queue_job *job)
{
    struct conn_set *set = arg;
    struct conn_job *j = shmb_malloc(sizeof(*j));
    sigset_t old;
    int rc;

    if (j == NULL)
        return UV_ENOMEM;
    j->job = job;
    /* The first job starts libuv's threads, which take the mask of the
     * thread that starts them: with the signals the loop handles blocked
     * there, they always reach the loop's thread, which alone can hold
     * them off while it changes their handling (daemon_handles_close). */
    conn_block_signals(&old);
    rc = uv_queue_work(set->loop, &j->req, conn_job_run, conn_job_after);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0)
        shmb_free(j);
    return rc;
}

/* The peer's supplementary groups when it connected, for a pool's group=
 * (SO_PEERGROUPS), as many as it has; none when the kernel cannot say or
 * memory runs out (then only its gid counts). */
static void conn_peer_groups(int fd, struct command_client *client)
{
    socklen_t len = 0;
    gid_t *groups;

    client->groups = NULL;
    client->n_groups = 0;
    /* The first call says how many bytes they take (ERANGE). */
    if ((getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) != 0 && errno != ERANGE) ||
        len == 0 || (groups = shmb_malloc(len)) == NULL)
        return;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) {
        shmb_free(groups);
        return;
    }
    client->groups = groups;
    client->n_groups = len / sizeof(gid_t);
}

int conn_open(struct conn_set *set, int fd, pid_t pid, uid_t uid, gid_t gid)
{
    struct conn *conn = shmb_calloc(1, sizeof(*conn));
    int rc;

    if (conn == NULL) {
        close(fd);
        return UV_ENOMEM;
    }
    conn->pass_fd = -1;
    if ((rc = uv_pipe_init(set->loop, &conn->pipe, 0)) < 0) {
        close(fd);
        shmb_free(conn);
        return rc;
    }
    conn->set = set;
    if ((rc = uv_pipe_open(&conn->pipe, fd)) < 0) {
        /* The handle did not take the descriptor, but still needs closing. */
        close(fd);
        conn->state = CONN_CLOSED;
        uv_close((uv_handle_t *)&conn->pipe, conn_on_close_unlisted);
        return rc;
    }
    conn->pipe.data = conn;
    conn->state = CONN_READING;
    conn->connected_ms = clock_now_ms();
    conn->client.pid = pid;
    conn->client.uid = uid;
    conn->client.gid = gid;
    conn_peer_groups(fd, &conn->client);
    conn->wait.client = &conn->client;
    conn->wait.done = conn_wait_done;
    set->count++;
    command_client_open(set->env, &conn->client);
    if ((rc = uv_read_start((uv_stream_t *)&conn->pipe, conn_on_alloc, conn_on_read)) <
        0) {
        /* The handle owns the descriptor now: closing it closes that too. */
        conn_close(conn);
        return rc;
    }
    conn_set_hello_watch(set);
    log_debug("accepted client pid %d uid %d", (int)pid, (int)uid);
    return 0;
}

/* Close the connections that have not said hello within --hello-timeout,
 * and wake again for the earliest one left. One timer for all of them:
 * pre-hello connections are few, and a walk of the list is cheap next to
 * a timer per connection. */
static void conn_set_on_hello_timer(uv_timer_t *timer)
{
    struct conn_set *set = timer->data;
    uint64_t limit = set->policy->hello_timeout_ms, now = clock_now_ms();
    uint64_t earliest = UINT64_MAX;
    struct command_client *cl, *next;

    if (limit == 0)
        return;
    for (cl = TAILQ_FIRST(&set->env->client_list); cl != NULL; cl = next) {
        struct conn *c = conn_of(cl);

        next = TAILQ_NEXT(cl, link);
        if (conn_ended(c) || cl->said_hello)
            continue;
        if (now - c->connected_ms >= limit)
            conn_hello_timeout(c, limit);
        else if (c->connected_ms + limit < earliest)
            earliest = c->connected_ms + limit;
    }
    if (earliest != UINT64_MAX)
        uv_timer_start(&set->hello_timer, conn_set_on_hello_timer, earliest - now, 0);
}

/* A connection opened: make sure the hello timer will look at it. */
static void conn_set_hello_watch(struct conn_set *set)
{
    /* A new connection's deadline is the latest of all: a timer already
     * running fires first and re-arms for it. */
    if (set->policy->hello_timeout_ms != 0 && set->started &&
        !uv_is_active((uv_handle_t *)&set->hello_timer))
        uv_timer_start(&set->hello_timer, conn_set_on_hello_timer,
                       set->policy->hello_timeout_ms, 0);
}

void conn_set_hello_rearm(struct conn_set *set)
{
    if (!set->started)
        return;
    uv_timer_stop(&set->hello_timer);
    /* Closes the connections already past the new limit and arms the timer
     * for the earliest of the others. */
    conn_set_on_hello_timer(&set->hello_timer);
}

int conn_set_init(struct conn_set *set, uv_loop_t *loop, struct command_env *env,
                  const struct policy *policy, void (*on_freed)(void *arg), void *arg)
{
    int rc;

    memset(set, 0, sizeof(*set));
    set->loop = loop;
    set->env = env;
    set->policy = policy;
    set->on_freed = on_freed;
    set->on_freed_arg = arg;
    TAILQ_INIT(&set->deferred);
    if ((rc = waitq_init(&set->waitq, loop, env)) < 0)
        return rc;
    if ((rc = uv_timer_init(loop, &set->hello_timer)) < 0)
        goto fail_waitq;
    if ((rc = uv_timer_init(loop, &set->unread_timer)) < 0)
        goto fail_hello;
    if ((rc = uv_idle_init(loop, &set->resume_idle)) < 0)
        goto fail_unread;
    set->hello_timer.data = set->unread_timer.data = set->resume_idle.data = set;
    /* A queue's pages are made and freed off the loop; its requester waits. */
    env->work_done = conn_on_work_done;
    env->queues.offload = conn_offload;
    env->queues.offload_arg = set;
    uv_unref((uv_handle_t *)&set->hello_timer);
    uv_unref((uv_handle_t *)&set->unread_timer);
    uv_unref((uv_handle_t *)&set->resume_idle);
    set->started = true;
    return 0;

fail_unread:
    uv_close((uv_handle_t *)&set->unread_timer, NULL);
fail_hello:
    uv_close((uv_handle_t *)&set->hello_timer, NULL);
fail_waitq:
    waitq_close(&set->waitq);
    return rc;
}

void conn_set_close(struct conn_set *set)
{
    struct command_client *cl;

    if (set->started) {
        set->started = false;
        waitq_close(&set->waitq);
        uv_close((uv_handle_t *)&set->hello_timer, NULL);
        uv_close((uv_handle_t *)&set->unread_timer, NULL);
        uv_close((uv_handle_t *)&set->resume_idle, NULL);
    }
    /* conn_close takes each out of the list. */
    while ((cl = TAILQ_FIRST(&set->env->client_list)) != NULL)
        conn_close(conn_of(cl));
}

unsigned conn_set_count_uid(const struct conn_set *set, uid_t uid)
{
    const struct command_client *cl;
    unsigned n = 0;

    TAILQ_FOREACH(cl, &set->env->client_list, link)
        n += cl->uid == uid;
    return n;
}
