// SPDX-License-Identifier: Apache-2.0
/*
 * The queue of allocations waiting for space.
 */
#include "waitq.h"

#include "clock.h"

static void waitq_on_timer(uv_timer_t *timer);

/* Arm the timer for the earliest deadline among the waiters, or for the
 * moment a read lease lets the blocker go, if that comes first. */
static void waitq_arm(struct waitq *q)
{
    uint64_t earliest = UINT64_MAX, now = clock_now_ms(), wake;
    struct waitq_entry *e;

    TAILQ_FOREACH(e, &q->entries, link)
        if (e->until_ms < earliest)
            earliest = e->until_ms;
    if (earliest != UINT64_MAX && (wake = command_room_wake_ms(q->env)) < earliest)
        earliest = wake;
    if (earliest == UINT64_MAX)
        uv_timer_stop(&q->timer);
    else
        uv_timer_start(&q->timer, waitq_on_timer, earliest > now ? earliest - now : 0, 0);
}

void waitq_add(struct waitq *q, struct waitq_entry *entry, json_t *request,
               uint64_t until_ms)
{
    /* It just found no room: retry only once something changes. */
    if (TAILQ_EMPTY(&q->entries))
        q->room_gen = command_room_generation(q->env);
    entry->request = request;
    entry->until_ms = until_ms;
    TAILQ_INSERT_TAIL(&q->entries, entry, link);
    waitq_arm(q);
}

/* Take entry out of the queue, keeping its request. */
static void waitq_unlink(struct waitq *q, struct waitq_entry *entry)
{
    TAILQ_REMOVE(&q->entries, entry, link);
    if (q->started && !uv_is_closing((uv_handle_t *)&q->timer))
        waitq_arm(q);
}

void waitq_remove(struct waitq *q, struct waitq_entry *entry)
{
    if (!waitq_waiting(entry))
        return;
    waitq_unlink(q, entry);
    json_decref(entry->request);
    entry->request = NULL;
}

/* Retry one waiter; true when it got its answer (and left the queue). */
static bool waitq_retry(struct waitq *q, struct waitq_entry *entry, bool final)
{
    struct command_result res;

    command_retry(q->env, entry->client, entry->request, entry->until_ms, final, &res);
    if (res.flags & COMMAND_WAIT) {
        json_decref(res.wait_request); /* the same request: keep the one we have */
        return false;
    }
    waitq_unlink(q, entry);
    json_decref(entry->request);
    entry->request = NULL;
    entry->done(entry, &res);
    return true;
}

void waitq_expire(struct waitq *q, struct waitq_entry *entry)
{
    if (waitq_waiting(entry))
        waitq_retry(q, entry, true);
}

/* Serve waiters in arrival order while they fit (those whose deadline is
 * not past now). One that still does not fit holds back the later waiters
 * of its own pool only: a pool keeps its order, and the room one pool makes
 * is no other pool's. After each answer the scan starts again from the
 * oldest (an answer may close connections, and with them their entries). */
static void waitq_serve(struct waitq *q, uint64_t now)
{
    const struct pool *held[CONFIG_MAX_POOLS];
    size_t n_held = 0, i;
    struct waitq_entry *e;

again:
    TAILQ_FOREACH(e, &q->entries, link) {
        const struct pool *pool = e->client->pool;

        if (e->until_ms <= now)
            continue;
        for (i = 0; i < n_held && held[i] != pool; i++)
            ;
        if (i < n_held)
            continue;
        if (waitq_retry(q, e, false))
            goto again;
        if (n_held == CONFIG_MAX_POOLS)
            return;
        held[n_held++] = pool;
    }
}

/* Once per loop iteration: when room may have been made, serve waiters. */
static void waitq_on_room_check(uv_check_t *check)
{
    struct waitq *q = check->data;
    uint64_t gen;

    if (TAILQ_EMPTY(&q->entries))
        return;
    gen = command_room_generation(q->env);
    if (gen == q->room_gen)
        return;
    q->room_gen = gen;
    waitq_serve(q, 0);
}

/* A deadline came, or a read lease ran out: serve waiters in arrival order
 * while they fit, then answer every waiter whose time is up, allocation or
 * ETIMEDOUT. */
static void waitq_on_timer(uv_timer_t *timer)
{
    struct waitq *q = timer->data;
    uint64_t now = clock_now_ms();
    struct waitq_entry *e, *next;

    waitq_serve(q, now);
    for (e = TAILQ_FIRST(&q->entries); e != NULL; e = next) {
        next = TAILQ_NEXT(e, link);
        if (e->until_ms <= now)
            waitq_retry(q, e, true);
    }
    waitq_arm(q);
}

int waitq_init(struct waitq *q, uv_loop_t *loop, struct command_env *env)
{
    int rc;

    q->env = env;
    TAILQ_INIT(&q->entries);
    q->room_gen = 0;
    if ((rc = uv_check_init(loop, &q->room_check)) < 0)
        return rc;
    if ((rc = uv_timer_init(loop, &q->timer)) < 0) {
        uv_close((uv_handle_t *)&q->room_check, NULL);
        return rc;
    }
    q->room_check.data = q;
    q->timer.data = q;
    uv_check_start(&q->room_check, waitq_on_room_check);
    uv_unref((uv_handle_t *)&q->room_check);
    uv_unref((uv_handle_t *)&q->timer);
    q->started = true;
    return 0;
}

void waitq_close(struct waitq *q)
{
    if (!q->started)
        return;
    q->started = false;
    uv_close((uv_handle_t *)&q->room_check, NULL);
    uv_close((uv_handle_t *)&q->timer, NULL);
}
