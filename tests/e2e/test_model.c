// SPDX-License-Identifier: Apache-2.0
/*
 * The model test: writer and reader processes (the C library, forked) do
 * random operations on a shared key space (shmb_put through the arena,
 * shmb_put_nowait, alloc/commit, alloc/abort, delete, shmb_read, shmb_get and
 * release), while the test SIGKILLs random writers and readers and kills and
 * restarts the daemon, which adopts the segment. Every payload carries its
 * key, its version and a checksum, so a process can verify alone what it
 * read; a ledger in shared memory says what each key's owner knows is
 * committed, so that reads and the restarted daemon's list can be held to it.
 *
 * Seeded: the seed is printed; SHMB_MODEL_SEED replays it (the operations,
 * not the machine's timing). SHMB_MODEL_SECONDS sets the length of each of
 * the two runs (default 12 s).
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checks.h"
#include "harness.h"
#include "layout.h"
#include "payload.h"
#include "shmbroker.h"

#define NWRITERS 3
#define NREADERS 3
#define NWORKERS (NWRITERS + NREADERS)
/* Durable run: each writer owns its keys; pressure run: all share these. */
#define KEYS_PER_WRITER 24
#define NKEYS (NWRITERS * KEYS_PER_WRITER)
#define HEAD_BYTES PAYLOAD_HEAD
#define MAX_PAYLOAD (512u * 1024u)

/* A key's ledger state, kept by its owner (durable run): what it knows. */
enum { L_ABSENT = 0, L_COMMITTED = 1, L_UNCERTAIN = 2 };

/* One key of the ledger. ops is odd while an operation whose outcome is not
 * known is in flight (or was cut short by a kill); state and version are
 * meaningful while it is even. attempted: the highest version ever tried. */
struct lkey {
    uint64_t ops;
    uint64_t state;
    uint64_t version;
    uint64_t attempted;
};

/* What the test and its processes share (MAP_SHARED, made before forking). */
struct model {
    bool durable;
    char socket[108];
    uint64_t seed;
    int stop;
    uint64_t budget_used, budget_max; /* bytes the durable writers may put */
    uint64_t next_seq[NWRITERS];      /* version counters, across incarnations */
    struct lkey keys[NKEYS];
    uint64_t incarnation[NWORKERS];
    /* Counts (atomic adds), for the summary line. */
    uint64_t puts, nowaits, commits, aborts, deletes, reads, read_misses, gets, small_bufs;
    uint64_t reconnects, strict_checks;
    uint64_t failures;
    int fail_lock;
    char failure[768];
};

static struct model *M;

/* A worker's failure: counted, the first kept, the worker exits 1. */
static void mfail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void mfail(const char *fmt, ...)
{
    va_list ap;

    while (__atomic_exchange_n(&M->fail_lock, 1, __ATOMIC_ACQUIRE))
        ;
    if (M->failures++ == 0) {
        va_start(ap, fmt);
        vsnprintf(M->failure, sizeof(M->failure), fmt, ap);
        va_end(ap);
    }
    __atomic_store_n(&M->fail_lock, 0, __ATOMIC_RELEASE);
    va_start(ap, fmt);
    fprintf(stderr, "model (pid %d): ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    _exit(1);
}

static void count(uint64_t *c)
{
    __atomic_add_fetch(c, 1, __ATOMIC_RELAXED);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void key_name(int k, char *buf, size_t len)
{
    if (M->durable)
        snprintf(buf, len, "d/w%d/%d", k / KEYS_PER_WRITER, k % KEYS_PER_WRITER);
    else
        snprintf(buf, len, "p/%d", k);
}

/* ---- payloads ---------------------------------------------------------------- */

/* Check that buf (size bytes, as read under key k) is exactly a payload put
 * under k; its version in *version. Fails the worker otherwise. */
static void payload_check(const unsigned char *buf, size_t size, uint32_t k, uint64_t *version,
                          const char *how)
{
    char key[64], what[256];

    if (!payload_verify(buf, size, k, version, what, sizeof(what))) {
        key_name((int)k, key, sizeof(key));
        mfail("%s '%s': returned %s", how, key, what);
    }
}

/* ---- connections --------------------------------------------------------------- */

/* The errors of a daemon that went away (or is coming back). */
static bool conn_error(int rc)
{
    return rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNREFUSED || rc == -ENOTCONN ||
           rc == -ECONNABORTED || rc == -ESHUTDOWN;
}

static shmb_t *model_connect(const char *name, bool read_only)
{
    uint64_t until = h_now_ms() + 20000;
    shmb_t *c;

    for (;;) {
        c = shmb_new();
        if (c == NULL)
            mfail("shmb_new: out of memory");
        shmb_set_populate(c, 0);
        shmb_set_read_only(c, read_only);
        if (shmb_connect(c, M->socket, name) == 0)
            return c;
        shmb_close(c);
        if (__atomic_load_n(&M->stop, __ATOMIC_ACQUIRE))
            _exit(0);
        if (h_now_ms() > until)
            mfail("could not connect to %s for 20 s", M->socket);
        h_sleep_ms(5);
    }
}

/* After a connection error: connect again until the daemon answers. */
static void model_reconnect(shmb_t *c)
{
    uint64_t until = h_now_ms() + 20000;
    int rc;

    count(&M->reconnects);
    while ((rc = shmb_reconnect(c)) != 0) {
        if (__atomic_load_n(&M->stop, __ATOMIC_ACQUIRE))
            _exit(0);
        if (!conn_error(rc) && rc != -ENOENT)
            mfail("shmb_reconnect: %s: %s", shmb_errname(c), shmb_errmsg(c));
        if (h_now_ms() > until)
            mfail("could not reconnect to %s for 20 s: %s", M->socket, shmb_errmsg(c));
        h_sleep_ms(5);
    }
}

/* ---- the ledger (durable run) ---------------------------------------------------- */

static void ledger_begin(int k, uint64_t version)
{
    struct lkey *l = &M->keys[k];

    if (!M->durable)
        return; /* shared keys: no owner knows their state */
    if (version != 0)
        __atomic_store_n(&l->attempted, version, __ATOMIC_RELEASE);
    __atomic_store_n(&l->state, (uint64_t)L_UNCERTAIN, __ATOMIC_RELEASE);
    __atomic_add_fetch(&l->ops, 1, __ATOMIC_ACQ_REL);
}

static void ledger_end(int k, uint64_t state, uint64_t version)
{
    struct lkey *l = &M->keys[k];

    if (!M->durable)
        return;
    __atomic_store_n(&l->version, version, __ATOMIC_RELEASE);
    __atomic_store_n(&l->state, state, __ATOMIC_RELEASE);
    __atomic_add_fetch(&l->ops, 1, __ATOMIC_ACQ_REL);
}

static bool ledger_open(int k)
{
    return __atomic_load_n(&M->keys[k].ops, __ATOMIC_ACQUIRE) % 2 == 1;
}

/* A read of key k that started at ledger ops0 (state0, version0) and found
 * version (0: no object): held to the ledger when nothing changed under it. */
/* What the daemon says of key now, for a failure's message. */
static void diagnose(shmb_t *c, const char *key, char *out, size_t len)
{
    shmb_read_stats_t rs;
    const void *p;
    size_t size = 0;
    int rc = shmb_get(c, key, &p, &size);

    if (rc == 0)
        shmb_release(c, key);
    shmb_read_stats(c, &rs);
    snprintf(out, len, " [now: get says %d, %zu bytes; this handle's reads: %llu fast, %llu "
             "asked the daemon, %llu retried]", rc, size,
             (unsigned long long)rs.fast, (unsigned long long)rs.fallback,
             (unsigned long long)rs.retries);
}

static void ledger_check_read(shmb_t *c, int k, uint64_t ops0, uint64_t state0,
                              uint64_t version0, uint64_t version, const char *how)
{
    char diag[256];

    struct lkey *l = &M->keys[k];
    uint64_t ops1 = __atomic_load_n(&l->ops, __ATOMIC_ACQUIRE);
    char key[64];

    if (!M->durable)
        return;
    key_name(k, key, sizeof(key));
    if (version != 0 && version > __atomic_load_n(&l->attempted, __ATOMIC_ACQUIRE))
        mfail("%s '%s': version %#llx was never put under it", how, key,
              (unsigned long long)version);
    if (ops0 % 2 == 1 || ops1 != ops0)
        return; /* an operation was in flight: either outcome */
    count(&M->strict_checks);
    if ((state0 == L_COMMITTED && version != version0) || (state0 == L_ABSENT && version != 0))
        diagnose(c, key, diag, sizeof(diag));
    if (state0 == L_COMMITTED && version != version0)
        mfail("%s '%s': %s, but version %#llx was committed (its put returned 0) and not "
              "deleted%s", how, key, version ? "another version" : "no object",
              (unsigned long long)version0, diag);
    if (state0 == L_ABSENT && version != 0)
        mfail("%s '%s': version %#llx, but the key was deleted (or never put) and nothing "
              "was put since%s", how, key, (unsigned long long)version, diag);
}

/* ---- readers ----------------------------------------------------------------------- */

/* The end of a read that found nothing or failed: a miss is counted, a lost
 * daemon reconnected (false: nothing to hold to the ledger), anything else
 * fails the worker. */
static bool read_ended(shmb_t *c, int rc, const char *how, const char *key)
{
    if (rc == -ENOENT) {
        count(&M->read_misses);
        return true;
    }
    if (conn_error(rc)) {
        model_reconnect(c);
        return false;
    }
    mfail("%s '%s': %d (%s: %s)", how, key, rc, shmb_errname(c), shmb_errmsg(c));
}

/* shmb_read of key k into a buffer of random capacity, every answer checked. */
static void op_read(shmb_t *c, int k, unsigned char *buf, uint64_t *rng)
{
    struct lkey *l = &M->keys[k];
    uint64_t ops0 = __atomic_load_n(&l->ops, __ATOMIC_ACQUIRE);
    uint64_t state0 = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE);
    uint64_t version0 = __atomic_load_n(&l->version, __ATOMIC_ACQUIRE), version = 0;
    size_t cap = xorshift(rng) % 8 == 0 ? xorshift(rng) % 2048 : MAX_PAYLOAD, size = 0;
    char key[64];
    int rc;

    key_name(k, key, sizeof(key));
    rc = shmb_read(c, key, buf, cap, &size);
    if (rc == 0) {
        if (size > cap)
            mfail("shmb_read '%s': %zu bytes into a buffer of %zu", key, size, cap);
        payload_check(buf, size, (uint32_t)k, &version, "shmb_read");
        count(&M->reads);
    } else if (rc == -ENOBUFS) {
        if (size <= cap)
            mfail("shmb_read '%s': -ENOBUFS for a buffer of %zu, size says %zu", key, cap,
                  size);
        count(&M->small_bufs);
        return; /* nothing read: nothing to hold to the ledger */
    } else if (!read_ended(c, rc, "shmb_read", key)) {
        return;
    }
    ledger_check_read(c, k, ops0, state0, version0, version, "shmb_read");
}

/* shmb_get of key k: checked in place, held a little, released. */
static void op_get(shmb_t *c, int k, uint64_t *rng)
{
    struct lkey *l = &M->keys[k];
    uint64_t ops0 = __atomic_load_n(&l->ops, __ATOMIC_ACQUIRE);
    uint64_t state0 = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE);
    uint64_t version0 = __atomic_load_n(&l->version, __ATOMIC_ACQUIRE), version = 0;
    const void *p;
    size_t size;
    char key[64];
    int rc;

    key_name(k, key, sizeof(key));
    rc = shmb_get(c, key, &p, &size);
    if (rc == 0) {
        payload_check(p, size, (uint32_t)k, &version, "shmb_get");
        if (xorshift(rng) % 16 == 0)
            h_sleep_ms(1);
        /* Still the same bytes while pinned. */
        payload_check(p, size, (uint32_t)k, &version, "shmb_get (pinned)");
        count(&M->gets);
        rc = xorshift(rng) % 2 ? shmb_release(c, key) : shmb_release_nowait(c, key);
        if (conn_error(rc)) {
            model_reconnect(c);
            return;
        }
        if (rc != 0)
            mfail("shmb_release '%s': %d (%s: %s)", key, rc, shmb_errname(c), shmb_errmsg(c));
    } else if (!read_ended(c, rc, "shmb_get", key)) {
        return;
    }
    ledger_check_read(c, k, ops0, state0, version0, version, "shmb_get");
}

static int reader_main(int slot)
{
    uint64_t rng = M->seed * 31 + (uint64_t)slot * 7 + M->incarnation[slot] * 1000003 + 1;
    unsigned char *buf = malloc(MAX_PAYLOAD);
    char name[32];
    shmb_t *c;

    snprintf(name, sizeof(name), "model-reader-%d", slot);
    if (buf == NULL)
        mfail("out of memory");
    c = model_connect(name, slot % 2 == 1);
    while (!__atomic_load_n(&M->stop, __ATOMIC_ACQUIRE)) {
        int k = (int)(xorshift(&rng) % NKEYS);

        if (xorshift(&rng) % 4 == 0)
            op_get(c, k, &rng);
        else
            op_read(c, k, buf, &rng);
    }
    shmb_close(c);
    free(buf);
    return 0;
}

/* ---- writers ----------------------------------------------------------------------- */

struct writer {
    int slot;
    shmb_t *c;
    uint64_t rng;
    unsigned char *buf, *rbuf;
    /* put_nowait's keys whose commit no later reply has confirmed yet */
    int unconfirmed[NKEYS];
    uint64_t unconfirmed_version[NKEYS];
    int nunconfirmed;
    /* The connection was lost or left since this writer's last put: the
     * library reports the put_nowait it had sent without a reply since
     * (may not have been made) with -ECANCELED from the next put, which is
     * not made; resolve_open_keys found out what became of them. */
    bool cancel_due;
};

/* A reply-waiting call returned 0: every put_nowait sent before it on this
 * connection has been handled (PROTOCOL.md's ordering rule), so committed. */
static void confirm_nowaits(struct writer *w)
{
    int i;

    for (i = 0; i < w->nunconfirmed; i++)
        ledger_end(w->unconfirmed[i], L_COMMITTED, w->unconfirmed_version[i]);
    w->nunconfirmed = 0;
}

/* Find out what became of the keys whose last operation was cut short (by a
 * kill of this writer's earlier incarnation, or of the daemon): get it. */
static void resolve_open_keys(struct writer *w)
{
    int k, rc;

    w->nunconfirmed = 0;
    for (k = 0; M->durable && k < NKEYS; k++) {
        const void *p;
        size_t size;
        uint64_t version;
        char key[64];

        if (k / KEYS_PER_WRITER != w->slot)
            continue;
        if (!ledger_open(k))
            continue;
        key_name(k, key, sizeof(key));
        for (;;) {
            rc = shmb_get(w->c, key, &p, &size);
            if (!conn_error(rc))
                break;
            model_reconnect(w->c);
        }
        if (rc == 0) {
            payload_check(p, size, (uint32_t)k, &version, "shmb_get (resolving)");
            if (version > M->keys[k].attempted)
                mfail("'%s': version %#llx was never put", key, (unsigned long long)version);
            shmb_release_nowait(w->c, key);
            ledger_end(k, L_COMMITTED, version);
        } else if (rc == -ENOENT) {
            ledger_end(k, L_ABSENT, 0);
        } else {
            mfail("shmb_get '%s' (resolving): %d (%s: %s)", key, rc, shmb_errname(w->c),
                  shmb_errmsg(w->c));
        }
    }
}

static void writer_reconnect(struct writer *w)
{
    model_reconnect(w->c);
    resolve_open_keys(w);
    w->cancel_due = true;
}

/* A size: mostly small, sometimes a few KiB, in the pressure run sometimes
 * large. */
static size_t pick_size(struct writer *w)
{
    uint64_t r = xorshift(&w->rng) % 64;

    if (!M->durable && r == 0)
        return HEAD_BYTES + xorshift(&w->rng) % (MAX_PAYLOAD - HEAD_BYTES);
    if (r < 8)
        return HEAD_BYTES + xorshift(&w->rng) % 16384;
    return HEAD_BYTES + xorshift(&w->rng) % 1024;
}

/* The errors a put may end with besides a lost daemon: the key exists (a
 * shared key, pressure run), no room now (pressure run). */
static bool put_error_ok(int rc)
{
    if (M->durable)
        return false;
    /* ECANCELED: an earlier put_nowait of this writer was refused (its key
     * existed), reported by this put, which was not made. */
    return rc == -EEXIST || rc == -ENOSPC || rc == -ETIMEDOUT || rc == -ECANCELED;
}

/* Put key k by one of the ways a client can; false when the durable run's
 * budget is spent (nothing done). */
static bool op_put(struct writer *w, int k)
{
    size_t size = pick_size(w);
    uint64_t version = ((uint64_t)(w->slot + 1) << 48) |
                       __atomic_add_fetch(&M->next_seq[w->slot], 1, __ATOMIC_RELAXED);
    unsigned readers = !M->durable && xorshift(&w->rng) % 8 == 0 ? 1 : 0;
    uint64_t how = xorshift(&w->rng) % 8;
    char key[64];
    void *p;
    int rc;

    if (M->durable && __atomic_add_fetch(&M->budget_used, SHMB_CHUNK_SIZE(16, size),
                                         __ATOMIC_RELAXED) > M->budget_max)
        return false; /* the durable run never fills the ring: no eviction */
    key_name(k, key, sizeof(key));
    payload_fill(w->buf, (uint32_t)k, version, size);
    ledger_begin(k, version);
    rc = 0;
    if (how < 3) {
        rc = shmb_put(w->c, key, w->buf, size, readers);
        count(&M->puts);
    } else if (how < 5) {
        rc = shmb_put_nowait(w->c, key, w->buf, size, readers);
        count(&M->nowaits);
    }
    if (how < 5 && w->cancel_due) {
        w->cancel_due = false;
        if (rc == -ECANCELED) {
            ledger_end(k, L_ABSENT, 0); /* not made: it reported the lost ones */
            return true;
        }
    }
    if (how >= 3 && how < 5) {
        if (rc == 0 && !M->durable)
            return true;
        if (rc == 0) {
            /* Not known until a later reply: confirm now or later. */
            w->unconfirmed[w->nunconfirmed] = k;
            w->unconfirmed_version[w->nunconfirmed++] = version;
            if (xorshift(&w->rng) % 2 == 0) {
                rc = shmb_contains(w->c, key);
                if (rc == 1 || (rc == 0 && !M->durable)) {
                    confirm_nowaits(w);
                    return true;
                }
                if (rc == 0)
                    mfail("'%s': put_nowait then contains on the same handle: not there",
                          key);
                if (conn_error(rc)) {
                    writer_reconnect(w);
                    return true;
                }
                mfail("shmb_contains '%s': %d (%s: %s)", key, rc, shmb_errname(w->c),
                      shmb_errmsg(w->c));
            }
            return true;
        }
    } else if (how >= 5) {
        rc = shmb_alloc(w->c, key, size, readers, &p);
        if (rc == 0) {
            memcpy(p, w->buf, size);
            if (how == 7) {
                rc = shmb_abort(w->c, key);
                count(&M->aborts);
                if (rc == 0) {
                    confirm_nowaits(w);
                    ledger_end(k, L_ABSENT, 0);
                    return true;
                }
            } else {
                rc = shmb_commit(w->c, key);
                count(&M->commits);
            }
        }
    }
    if (rc == 0) {
        confirm_nowaits(w);
        ledger_end(k, L_COMMITTED, version);
    } else if (conn_error(rc)) {
        writer_reconnect(w);
    } else if (rc == -ENOTSUP && how >= 3 && how < 5) {
        ledger_end(k, L_ABSENT, 0); /* no arena (a daemon without them): nothing sent */
    } else if (put_error_ok(rc)) {
        ledger_end(k, L_UNCERTAIN, 0); /* pressure run: not tracked */
    } else {
        mfail("put '%s' (%s) of %zu bytes: %d (%s: %s)", key,
              how < 3 ? "shmb_put" : how < 5 ? "shmb_put_nowait" : "alloc/commit", size, rc,
              shmb_errname(w->c), shmb_errmsg(w->c));
    }
    return true;
}

/* Confirm the put_nowait of key k with a call that waits for a reply. */
static void op_confirm(struct writer *w, int k)
{
    char key[64];
    int rc;

    key_name(k, key, sizeof(key));
    rc = shmb_contains(w->c, key);
    if (rc == 1)
        confirm_nowaits(w);
    else if (conn_error(rc))
        writer_reconnect(w);
    else
        mfail("'%s': put_nowait, then contains on the same handle: %d (%s)", key, rc,
              rc == 0 ? "not there" : shmb_errmsg(w->c));
}

static void op_delete(struct writer *w, int k)
{
    char key[64];
    int rc;

    key_name(k, key, sizeof(key));
    ledger_begin(k, 0);
    rc = shmb_delete(w->c, key);
    count(&M->deletes);
    if (rc == 0) {
        confirm_nowaits(w);
        ledger_end(k, L_ABSENT, 0);
    } else if (conn_error(rc)) {
        writer_reconnect(w);
    } else if (rc == -ENOENT && !M->durable) {
        ledger_end(k, L_UNCERTAIN, 0);
    } else {
        mfail("shmb_delete '%s': %d (%s: %s)", key, rc, shmb_errname(w->c), shmb_errmsg(w->c));
    }
}

static int writer_main(int slot)
{
    struct writer w;
    char name[32];

    memset(&w, 0, sizeof(w));
    w.slot = slot;
    w.rng = M->seed * 17 + (uint64_t)slot * 13 + M->incarnation[slot] * 999983 + 3;
    w.buf = malloc(MAX_PAYLOAD);
    w.rbuf = malloc(MAX_PAYLOAD);
    if (w.buf == NULL || w.rbuf == NULL)
        mfail("out of memory");
    snprintf(name, sizeof(name), "model-writer-%d", slot);
    w.c = model_connect(name, false);
    if (!M->durable)
        shmb_set_alloc_wait(w.c, 20);
    resolve_open_keys(&w);
    while (!__atomic_load_n(&M->stop, __ATOMIC_ACQUIRE)) {
        int k = M->durable ? slot * KEYS_PER_WRITER + (int)(xorshift(&w.rng) % KEYS_PER_WRITER)
                           : (int)(xorshift(&w.rng) % NKEYS);
        uint64_t r = xorshift(&w.rng) % 8;

        if (M->durable && ledger_open(k))
            op_confirm(&w, k); /* an unconfirmed put_nowait */
        else if (M->durable ? M->keys[k].state == L_ABSENT : r < 4) {
            if (!op_put(&w, k))
                op_read(w.c, k, w.rbuf, &w.rng);
        } else if (r < 6)
            op_delete(&w, k);
        else if (r < 7)
            op_read(w.c, k, w.rbuf, &w.rng);
        else
            op_get(w.c, k, &w.rng);
    }
    shmb_close(w.c);
    free(w.buf);
    free(w.rbuf);
    return 0;
}

/* ---- the test's side --------------------------------------------------------------- */

static int worker_run(void *arg)
{
    int slot = (int)(intptr_t)arg;

    return slot < NWRITERS ? writer_main(slot) : reader_main(slot);
}

static uint64_t model_seed(void)
{
    const char *s = getenv("SHMB_MODEL_SEED");

    if (s != NULL && *s != '\0')
        return strtoull(s, NULL, 0);
    return (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
}

static double model_seconds(void)
{
    const char *s = getenv("SHMB_MODEL_SECONDS");

    return s != NULL && atof(s) > 0 ? atof(s) : 12.0;
}

/* The daemon is still the one we started: it did not die by itself. */
static void check_daemon(struct h_daemon *d)
{
    int status;

    if (d->pid > 0 && waitpid(d->pid, &status, WNOHANG) == d->pid) {
        d->pid = 0;
        d->status = status;
        h_daemon_print_log(d);
        h_fail("shmbrokerd died by itself (status %d) during the model run (seed %llu)",
               h_exit_code(status), (unsigned long long)M->seed);
    }
}

static void check_failures(void)
{
    if (__atomic_load_n(&M->failures, __ATOMIC_ACQUIRE) != 0)
        h_fail("model (seed %llu, SHMB_MODEL_SEED to replay): %s", (unsigned long long)M->seed,
               M->failure);
}

/* The daemon's list against the ledger, every object read back whole (the
 * durable run: a committed object is there with its version, a deleted one
 * is not; the pressure run: every listed object is exactly a payload). */
static void check_list(struct h_daemon *d, const char *when)
{
    shmb_t *c = h_lib_connect(d, "model-check", 0);
    shmb_list_t *list = NULL;
    bool listed[NKEYS] = {false};
    size_t i;
    int k;

    ok(c, shmb_list(c, M->durable ? "d/" : "p/", 10000, &list));
    for (i = 0; i < list->count; i++) {
        const char *key = list->objects[i].key;
        const void *p;
        size_t size;
        uint64_t version;
        char name[64], what[256];

        if (strcmp(list->objects[i].state, "committed") != 0)
            continue;
        for (k = 0; k < NKEYS; k++) {
            key_name(k, name, sizeof(name));
            if (strcmp(name, key) == 0)
                break;
        }
        if (k == NKEYS)
            h_fail("%s: the daemon lists '%s', which no writer put", when, key);
        listed[k] = true;
        if (shmb_get(c, key, &p, &size) != 0) {
            if (shmb_errcode(c) == -ENOENT)
                continue; /* deleted since the list (pressure run) */
            h_fail("%s: get '%s': %s", when, key, shmb_errmsg(c));
        }
        if (!payload_verify(p, size, (uint32_t)k, &version, what, sizeof(what)))
            h_fail("%s: get '%s' returned %s", when, key, what);
        if (M->durable && !ledger_open(k) && M->keys[k].state == L_COMMITTED &&
            M->keys[k].version != version)
            h_fail("%s: '%s' holds version %#llx, the ledger says %#llx was committed", when,
                   key, (unsigned long long)version, (unsigned long long)M->keys[k].version);
        if (M->durable && !ledger_open(k) && M->keys[k].state == L_ABSENT)
            h_fail("%s: '%s' (version %#llx) is there, but it was deleted", when, key,
                   (unsigned long long)version);
        ok(c, shmb_release(c, key));
    }
    for (k = 0; M->durable && k < NKEYS; k++) {
        char name[64];

        key_name(k, name, sizeof(name));
        if (!listed[k] && !ledger_open(k) && M->keys[k].state == L_COMMITTED)
            h_fail("%s: '%s' (version %#llx) was committed (its put returned 0), never "
                   "deleted, and is gone", when, name, (unsigned long long)M->keys[k].version);
    }
    if (M->durable) {
        shmb_stats_t st;

        ok(c, shmb_stats(c, &st));
        if (st.evictions != 0)
            h_fail("%s: %llu evictions in the durable run: the test's premise (no pressure) "
                   "failed", when, (unsigned long long)st.evictions);
    }
    shmb_list_free(list);
    shmb_close(c);
}

/* Stop or continue the writers (the readers read on through a restart). */
static void signal_writers(const pid_t *pids, int sig)
{
    int i;

    for (i = 0; i < NWRITERS; i++)
        if (pids[i] > 0)
            kill(pids[i], sig);
}

/* A kill that the test made: the worker is reaped; any other end of it is a
 * failure (a crash, or an exit with the failure it reported). */
static void reap_killed(struct h_fix *f, pid_t pid)
{
    int code = h_child_kill(f, pid, SIGKILL);

    check_failures();
    if (code != 128 + SIGKILL && code != 0)
        h_fail("a model worker ended with %d before it was killed (seed %llu)", code,
               (unsigned long long)M->seed);
}

static void model_run(struct h_fix *f, bool durable)
{
    const char *const extra[] = {"--log-level", "warn", NULL};
    struct h_daemon *d;
    pid_t pids[NWORKERS];
    uint64_t rng, end, next_restart, t0 = h_now_ms();
    double seconds = model_seconds();
    int i, kills = 0, restarts = 0;

    M = mmap(NULL, sizeof(*M), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(M != MAP_FAILED);
    memset(M, 0, sizeof(*M));
    M->durable = durable;
    M->seed = model_seed();
    rng = M->seed | 1;
    /* Durable: 128 MiB, at most half of it ever put (arenas given up by
     * killed writers included), so the ring never has to evict. Pressure:
     * 16 MiB that the puts fill many times over. */
    d = h_daemon_start(f, durable ? "128M" : "16M", extra);
    M->budget_max = 48u << 20;
    snprintf(M->socket, sizeof(M->socket), "%s", d->socket);
    printf("model run (%s): seed %llu (SHMB_MODEL_SEED to replay), %.0f s\n",
           durable ? "durable" : "pressure", (unsigned long long)M->seed, seconds);
    fflush(stdout);
    for (i = 0; i < NWORKERS; i++) {
        pids[i] = h_fork(f, worker_run, (void *)(intptr_t)i);
        assert_true(pids[i] > 0);
    }
    end = t0 + (uint64_t)(seconds * 1000);
    next_restart = t0 + (end - t0) / 4;
    while (h_now_ms() < end) {
        h_sleep_ms(40 + (int)(xorshift(&rng) % 160));
        check_daemon(d);
        check_failures();
        if (h_now_ms() >= next_restart) {
            /* Kill the daemon in the middle of everything. The durable
             * run holds the writers still meanwhile, so that the restored
             * objects can be compared with the ledger; its readers go on
             * reading (from the mapping while no daemon answers, through
             * the new daemon's adoption), held to the ledger all along. */
            if (durable)
                signal_writers(pids, SIGSTOP);
            assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                             128 + SIGKILL);
            if (h_daemon_spawn(f, d, extra) <= 0 ||
                h_daemon_wait_ready(d, H_READY_TIMEOUT_MS) < 0) {
                h_daemon_print_log(d);
                h_fail("the daemon did not start again on its segment (seed %llu)",
                       (unsigned long long)M->seed);
            }
            check_list(d, "after a restart");
            if (durable)
                signal_writers(pids, SIGCONT);
            restarts++;
            next_restart += (end - t0) / 4;
            continue;
        }
        /* SIGKILL a random worker at a random point, start another. */
        i = (int)(xorshift(&rng) % NWORKERS);
        if (xorshift(&rng) % 3 == 0) {
            reap_killed(f, pids[i]);
            kills++;
            M->incarnation[i]++;
            pids[i] = h_fork(f, worker_run, (void *)(intptr_t)i);
            assert_true(pids[i] > 0);
        }
    }
    __atomic_store_n(&M->stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < NWORKERS; i++) {
        int code = h_child_wait(f, pids[i], H_RUN_TIMEOUT_MS);

        check_failures();
        if (code != 0)
            h_fail("model worker %d ended with %d (seed %llu)", i, code,
                   (unsigned long long)M->seed);
    }
    check_daemon(d);
    check_list(d, "at the end");
    h_assert_alive(d);
    printf("model run (%s, seed %llu): %llu puts, %llu put_nowait, %llu commits, %llu aborts, "
           "%llu deletes; %llu exact reads, %llu gets, %llu misses, %llu short buffers; "
           "%llu reads held to the ledger; %d workers killed, %d daemon restarts, %llu "
           "reconnects\n",
           durable ? "durable" : "pressure", (unsigned long long)M->seed,
           (unsigned long long)M->puts, (unsigned long long)M->nowaits,
           (unsigned long long)M->commits, (unsigned long long)M->aborts,
           (unsigned long long)M->deletes, (unsigned long long)M->reads,
           (unsigned long long)M->gets, (unsigned long long)M->read_misses,
           (unsigned long long)M->small_bufs, (unsigned long long)M->strict_checks, kills,
           restarts, (unsigned long long)M->reconnects);
    /* The run did what it says. */
    assert_true(M->reads > 100 && M->gets > 10 && M->puts > 10 && M->nowaits > 10);
    assert_true(restarts >= 3);
    if (durable)
        assert_true(M->strict_checks > 100);
    munmap(M, sizeof(*M));
    M = NULL;
}

/* A daemon with room for everything (no eviction possible): reads are exact
 * and agree with what the owners know is committed or deleted; after every
 * restart (SIGKILL, adoption) every committed object is there with its
 * version and no deleted one is back. */
static void test_model_durable(void **state)
{
    struct h_fix *f = *state;

    model_run(f, true);
    h_pass(f);
}

/* A small daemon under pressure (eviction, awaited reads, shared keys,
 * large objects): every read that succeeds is exactly a payload put under
 * its key, and the daemon survives it all. */
static void test_model_pressure(void **state)
{
    struct h_fix *f = *state;

    model_run(f, false);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_model_durable),
        TEST(test_model_pressure),
    };

    return cmocka_run_group_tests_name("test_model", tests, NULL, NULL);
}
