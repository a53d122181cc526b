// SPDX-License-Identifier: Apache-2.0
/*
 * The library's copy-out read: shmb_read looks the key up in the catalog the
 * daemon publishes in the mapping (proto/catalog.c) and copies the payload
 * with no system call; when the catalog cannot say, it asks the daemon (get,
 * copy, release). The catalog view comes from the hello reply (client.c).
 * A mapping is trusted only while its daemon serves it: the header's retired
 * word, and a look at the connection every CLIENT_LOOK_MS. A miss is no
 * proof while this handle's puts sent without waiting are unanswered: the
 * read of the last one looks for its commit a while, then asks the daemon.
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../proto/layout.h"
#include "../proto/text.h"

/* How often a reader looks at its connection (one poll() with no wait): a
 * daemon that died without a word (SIGKILL; a memfd pool has no file for the
 * next daemon to mark) is noticed within this, plus the coarse clock's tick.
 * Reads in a loop make one system call per CLIENT_LOOK_MS, not one each. */
#define CLIENT_LOOK_MS 10

/* Milliseconds of CLOCK_MONOTONIC_COARSE: read from the vDSO, no system
 * call, to a tick (1 to 10 ms). */
static uint64_t client_coarse_ms(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return UINT64_MAX; /* never: then every read looks */
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Whether the mapping may answer: the daemon has not marked the segment
 * retired (one acquire load), and, at most every CLIENT_LOOK_MS, the
 * daemon's end of the connection is still open. 1: it may; 0: ask the
 * daemon (retired, or a word a client scribbled: the daemon knows);
 * -ECONNRESET when the daemon closed the connection (it stopped or died):
 * the socket is closed, as any lost connection's, so that the calls that
 * follow fail too. */
static int client_mapping_served(shmb_t *c, const char *key)
{
    const uint32_t *retired =
        (const uint32_t *)(c->map + offsetof(struct shmb_segment_header, retired));
    char ebuf[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];
    struct pollfd pfd = {.fd = c->sock, .events = POLLRDHUP};
    uint64_t now;
    int n;

    if (__atomic_load_n(retired, __ATOMIC_ACQUIRE) != 0)
        return 0;
    now = client_coarse_ms();
    if (now - c->looked_ms < CLIENT_LOOK_MS)
        return 1;
    n = poll(&pfd, 1, 0);
    if (n <= 0 || (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) == 0) {
        /* A failed poll (EINTR, say) proves nothing: the next read looks. */
        if (n >= 0 && now != UINT64_MAX)
            c->looked_ms = now;
        return 1;
    }
    (void)client_lost(c, "shmb_read", 0);
    return shmb_error_set(&c->err, -ECONNRESET,
                          "shmb_read of '%s': shmbrokerd closed this handle's connection "
                          "(it stopped, or died), so the segment this handle maps may be "
                          "one no daemon serves; nothing was read from it. Every pin and "
                          "pending allocation of this handle was released. Call "
                          "shmb_reconnect and read again.",
                          shmb_escape(key, strlen(key), ebuf, sizeof(ebuf)));
}

/* Count an awaited read done in place: in the seal on a read-write
 * mapping; a read-only one cannot write it, so a "read" request goes
 * without waiting for its answer. A generation that changed means the
 * object went: nothing left to count. */
static void client_count_read(shmb_t *c, const struct client_key *key,
                              const struct shmb_catalog_hit *hit)
{
    struct shmb_error saved;

    if (!c->read_only) {
        (void)shmb_catalog_count_read(&c->catalog, hit);
        return;
    }
    /* The read itself succeeded; a connection lost while reporting it is
     * the next call's news, not this one's. */
    saved = c->err;
    c->w.len = 0;
    if (client_begin_key(c, SHMB_OP_READ, client_next_id(c), key) == 0 &&
        line_lit(&c->w, ",\"gen\":") == 0 && line_u64(&c->w, hit->gen) == 0 &&
        line_lit(&c->w, ",\"noreply\":true}\n") == 0) {
        c->noreply_sent = true;
        (void)client_send(c);
    }
    c->err = saved;
}

/* A too small buffer: *size says how much is needed. */
static int client_read_nobufs(shmb_t *c, const char *key, size_t cap, uint64_t need,
                              size_t *size)
{
    char ebuf[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];

    *size = (size_t)need;
    return shmb_error_set(&c->err, -ENOBUFS,
                          "shmb_read of '%s': buffer of %zu bytes, object is %llu bytes; "
                          "nothing was copied. Pass a buffer of at least *size bytes.",
                          shmb_escape(key, strlen(key), ebuf, sizeof(ebuf)), cap,
                          (unsigned long long)need);
}

/* The daemon's answer: get (a pin, one read counted), copy, release
 * without waiting. */
static int client_read_slow(shmb_t *c, const struct client_key *key, void *buf,
                            size_t cap, size_t *size)
{
    struct shmb_error saved;
    const void *p = NULL;
    size_t len = 0;
    int rc;

    c->read_stats.fallback++;
    if ((rc = client_get(c, key, &p, &len)) < 0)
        return rc;
    if (len > cap) {
        rc = client_read_nobufs(c, key->s, cap, len, size);
    } else {
        memcpy(buf, p, len);
        *size = len;
    }
    /* A connection lost on the way releases the pin with it: the copy is
     * exact either way, and the loss is the next call's news. */
    saved = c->err;
    (void)client_release_nowait(c, key->s);
    c->err = saved;
    return rc;
}

/* Nanoseconds of CLOCK_MONOTONIC (the vDSO's: no system call). */
static uint64_t client_now_ns(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return UINT64_MAX; /* never: then the wait ends at once */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* How long a read waiting for its own put's commit looks with only a pause
 * between looks, before it yields the CPU between them: about what the
 * daemon takes on another CPU when that CPU is awake. A yield on a host
 * with more runnable processes than CPUs gives the CPU away for a whole
 * slice of another process (most of a millisecond), far more than the
 * commit takes. */
#define CLIENT_LANDING_SPIN_NS 20000u

/* Tell the core this is a spin, so a sibling thread gets the pipeline. */
static void client_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* No hit for the key this handle last put without waiting, while that put
 * is unanswered: its commit may not be handled yet. Look at the catalog
 * again for up to read_wait_us (the daemon publishes it within one wake-up,
 * well under the round trip that asking would cost), pausing between looks
 * at first, then yielding the CPU between them in case the daemon waits
 * for this one. 0 or -ENOBUFS: a
 * hit; else the wait ran out (or was not for this key) and the caller asks
 * the daemon. */
static int client_read_landing(shmb_t *c, const struct client_key *k, void *buf, size_t cap,
                               struct shmb_catalog_hit *hit)
{
    uint64_t start = client_now_ns(), wait = (uint64_t)c->read_wait_us * 1000u, now;
    unsigned retries = 0;
    int rc = -ENOENT;

    if (wait == 0 || start == UINT64_MAX || strcmp(c->unconfirmed.last, k->s) != 0)
        return -ENOENT;
    /* Not only past a miss: a catalog that cannot prove one (full, or
     * moving) still shows the hit once the commit is published. */
    while (rc != 0 && rc != -ENOBUFS && (now = client_now_ns()) - start < wait) {
        if (now - start < CLIENT_LANDING_SPIN_NS)
            client_cpu_relax();
        else
            (void)sched_yield();
        rc = shmb_catalog_read_counted(&c->catalog, k->s, k->len, buf, cap, hit, &retries);
    }
    c->read_stats.retries += retries;
    return rc;
}

static int client_read(shmb_t *c, const char *key, void *buf, size_t cap, size_t *size)
{
    struct shmb_catalog_hit hit;
    struct client_key k;
    char ebuf[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];
    unsigned retries = 0;
    int rc;

    shmb_error_clear(&c->err);
    *size = 0;
    if ((rc = client_check_key(c, key, &k)) < 0)
        return rc;
    if (buf == NULL && cap != 0)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_read: buf is NULL but cap is %zu bytes.", cap);
    /* A handle whose connection is gone asks the daemon, which says so: the
     * mapping may be of a file no daemon serves any more. */
    if (c->catalog.catalog_slots == 0 || c->sock < 0)
        return client_read_slow(c, &k, buf, cap, size);
    /* Nor may a mapping its daemon gave up: the daemon says what it serves
     * now, or the lost connection says it is gone. */
    if ((rc = client_mapping_served(c, key)) <= 0)
        return rc < 0 ? rc : client_read_slow(c, &k, buf, cap, size);
    rc = shmb_catalog_read_counted(&c->catalog, k.s, k.len, buf, cap, &hit, &retries);
    c->read_stats.retries += retries;
    /* A miss proves nothing while puts this handle sent without waiting are
     * unanswered: the daemon may not have handled their commits yet. It
     * handles the connection's requests in order, so asking it answers
     * after them. */
    if (rc != 0 && rc != -ENOBUFS && c->unconfirmed.count > 0 &&
        (rc = client_read_landing(c, &k, buf, cap, &hit)) != 0 && rc != -ENOBUFS)
        return client_read_slow(c, &k, buf, cap, size);
    switch (rc) {
    case 0:
        c->read_stats.fast++;
        *size = (size_t)hit.size;
        if (hit.flags & SHMB_CATALOG_AWAITED)
            client_count_read(c, &k, &hit);
        return 0;
    case -ENOENT:
        c->read_stats.fast++;
        return shmb_error_set(&c->err, -ENOENT,
                              "No object '%s'; check the key, or wait for its writer to "
                              "commit it.",
                              shmb_escape(key, strlen(key), ebuf, sizeof(ebuf)));
    case -ENOBUFS:
        c->read_stats.fast++;
        return client_read_nobufs(c, key, cap, hit.size, size);
    default:
        return client_read_slow(c, &k, buf, cap, size);
    }
}

int shmb_read(shmb_t *c, const char *key, void *buf, size_t cap, size_t *size)
{
    size_t ignored;
    int rc;

    if (size == NULL)
        size = &ignored;
    *size = 0;
    if ((rc = client_enter(c)) < 0)
        return rc;
    return client_done(c, client_read(c, key, buf, cap, size));
}

void shmb_read_stats(const shmb_t *c, shmb_read_stats_t *out)
{
    *out = c->read_stats;
}

int shmb_set_read_wait(shmb_t *c, unsigned wait_us)
{
    if (wait_us > SHMB_READ_WAIT_MAX)
        return shmb_error_set(&c->err, -EINVAL,
                              "shmb_set_read_wait: %u us is over the bound of %u us; a "
                              "daemon that takes longer is better asked (0 asks at once).",
                              wait_us, (unsigned)SHMB_READ_WAIT_MAX);
    c->read_wait_us = wait_us;
    return 0;
}
