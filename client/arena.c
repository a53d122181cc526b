// SPDX-License-Identifier: Apache-2.0
/*
 * The library's puts in one round trip: a handle holds an arena (a run of
 * the segment the daemon granted this connection), copies each payload into
 * it under the arena's lock and commits it with one commit_at; the next
 * arena is asked for in the same write as a commit when the current one
 * runs low. Without an arena (read-only handle, arenas off, an object larger
 * than an arena may be, a daemon that gives none) a put is alloc, memcpy,
 * commit. Built on the request machinery of client.c; the daemon's side is
 * daemon/arena.c.
 */
#include "internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../proto/layout.h"
#include "../proto/text.h"

/* Puts that go without an arena after the daemon had no room for one: each
 * refused arena costs a round trip before the put's own two, so the next
 * few do not ask again. */
#define CLIENT_ARENA_SKIP 16

/* The largest arena this connection's daemon grants, in which a chunk must
 * fit: min(max_object_size, data_size / 8), no more than the arena's tag
 * counts (2^32 SHMB_ALIGN units), in whole SHMB_ALIGN units. */
static uint64_t arena_limit(const shmb_t *c)
{
    uint64_t lim = c->info.data_size / 8;

    if (c->info.max_object_size < lim)
        lim = c->info.max_object_size;
    if (lim > (uint64_t)UINT32_MAX * SHMB_ALIGN)
        lim = (uint64_t)UINT32_MAX * SHMB_ALIGN;
    return lim & ~(uint64_t)(SHMB_ALIGN - 1);
}

/* The size to ask for with a chunk of chunk bytes to lay out: the floor set
 * by shmb_set_arena, room for four such chunks, and no less than the smallest
 * arena the daemon grants; no more than it grants. */
static uint64_t arena_ask(const shmb_t *c, uint64_t chunk)
{
    uint64_t ask = c->arena_want, lim = arena_limit(c);

    if (ask < 4 * chunk)
        ask = 4 * chunk;
    if (ask < SHMB_CHUNK_SIZE(SHMB_KEY_MAX, 64))
        ask = SHMB_CHUNK_SIZE(SHMB_KEY_MAX, 64);
    return ask < lim ? ask : lim;
}

/* Append {"op":"arena","id":ID,"size":SIZE} to c->w; *id gets its id. */
static int arena_request(shmb_t *c, uint64_t size, uint64_t *id)
{
    if (c->sock < 0)
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    if (line_lit(&c->w, "{\"op\":\"") < 0 || line_lit(&c->w, shmb_ops[SHMB_OP_ARENA].name) < 0 ||
        line_lit(&c->w, "\",\"id\":") < 0 || line_u64(&c->w, *id = client_next_id(c)) < 0 ||
        line_lit(&c->w, ",\"size\":") < 0 || line_u64(&c->w, size) < 0 ||
        line_lit(&c->w, "}\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    return 0;
}

/* Read the reply to the arena request id and hold what it granted. The
 * arena held before is the daemon's again either way (a new arena gives the
 * old one back). A daemon that gives this connection none (ENOSYS from an
 * older daemon, EPERM, EINVAL: a segment too small) is not asked again;
 * ENOSPC: not for the next few puts. */
static int arena_take(shmb_t *c, uint64_t id)
{
    uint64_t end = c->info.data_offset + c->info.data_size, offset = 0, size = 0, token = 0;
    json_t *reply = NULL;
    size_t len = 0;
    int rc;

    c->arena.size = 0;
    c->arena.unsure = false;
    /* Through jansson: an arena is asked for once in many puts, and its
     * reply carries the lock's token besides offset and size. */
    if ((rc = client_read_line(c, &len)) == 0)
        rc = client_decode(c, len, NULL, id, false, &reply);
    if (rc == -ENOSYS || rc == -EPERM || rc == -EINVAL)
        c->arena.off = true;
    else if (rc == -ENOSPC)
        c->arena.skip = CLIENT_ARENA_SKIP;
    if (rc == 0 && ((rc = client_u64(c, reply, "offset", &offset)) < 0 ||
                    (rc = client_u64(c, reply, "size", &size)) < 0 ||
                    (rc = client_u64(c, reply, "token", &token)) < 0))
        c->arena.off = true;
    json_decref(reply);
    if (rc < 0)
        return rc;
    if (offset % SHMB_ALIGN != 0 || offset < c->info.data_offset + SHMB_ALIGN ||
        offset > end || size > end - offset || size == 0 || token == 0 ||
        (token & 3) != 0) {
        c->arena.off = true;
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd granted an arena [%llu, +%llu) outside the data "
                              "area [%llu, +%llu), or a lock token %llu; puts on this "
                              "connection go without one.",
                              (unsigned long long)offset, (unsigned long long)size,
                              (unsigned long long)c->info.data_offset,
                              (unsigned long long)c->info.data_size,
                              (unsigned long long)token);
    }
    c->arena.offset = c->arena.cursor = offset;
    c->arena.chunks = 0;
    c->arena.size = size;
    c->arena.token = token;
    return 0;
}

/* Ask for an arena with room for chunk bytes and wait for it. */
static int arena_renew(shmb_t *c, uint64_t chunk)
{
    uint64_t id;
    int rc;

    c->w.len = 0;
    if ((rc = arena_request(c, arena_ask(c, chunk), &id)) < 0 || (rc = client_send(c)) < 0)
        return rc;
    return arena_take(c, id);
}

/* Give the held arena back ({"op":"arena","size":0}): arenas were turned
 * off. */
static int arena_give_back(shmb_t *c)
{
    uint64_t id;
    int rc;

    c->w.len = 0;
    if ((rc = arena_request(c, 0, &id)) < 0 || (rc = client_send(c)) < 0)
        return rc;
    rc = arena_take(c, id);
    c->arena.off = false; /* a refusal to give back is no refusal to give */
    return rc;
}

/* The arena's lock: its own chunk header's seal, just before the arena's
 * first byte, holding the grant's random token (the arena reply's "token")
 * and the lock (SHMB_ARENA_WORD), so that a word there that is not the
 * grant's is seen as the arena gone, whatever reused the bytes. */
static _Atomic uint64_t *arena_lock_word(shmb_t *c)
{
    return (_Atomic uint64_t *)(void *)(c->map + c->arena.offset - SHMB_ALIGN +
                                        offsetof(struct shmb_chunk_header, seal));
}

/* The count of this handle's commits on their way into its arena
 * (SHMB_ARENA_INFLIGHT_AT in the arena's header): one is added for each
 * chunk laid out, before the lock goes IDLE again, and the daemon takes it
 * off as it handles the commit_at; it does not take the arena back while
 * the count is not 0. */
static _Atomic uint64_t *arena_inflight_word(shmb_t *c)
{
    return (_Atomic uint64_t *)(void *)(c->map + c->arena.offset - SHMB_ALIGN +
                                        SHMB_ARENA_INFLIGHT_AT);
}

/* The span arena_write looks at in one mincore: as many pages as
 * arena_pages_present's vector holds. */
#define ARENA_ONE_LOOK (256u * 4096u)

/* Whether every page of [p, p + n) of the mapping is in memory: a client
 * may have truncated the file or punched a hole in it (the daemon then
 * refuses allocations with EIO), and a write there would be a SIGBUS in
 * this process, not an error. The mapping is populated at connect, so the
 * arena's pages are resident unless the file lost them (or the kernel
 * swapped them out: then the put only takes the slower way, and the arena
 * is kept for the next). A handle that
 * maps without populating (shmb_set_populate(c, 0)) is not checked: its
 * pages come in as they are written. */
static bool arena_pages_present(const shmb_t *c, const unsigned char *p, size_t n)
{
    unsigned char vec[256];
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = (uintptr_t)p & ~(page - 1);
    uintptr_t end = (uintptr_t)p + n;

    if (!c->populate)
        return true;
    while (at < end) {
        size_t pages = (end - at + page - 1) / page, i;

        if (pages > sizeof(vec))
            pages = sizeof(vec);
        if (mincore((void *)at, pages * page, vec) != 0)
            return false;
        for (i = 0; i < pages; i++)
            if (!(vec[i] & 1))
                return false;
        at += pages * page;
    }
    return true;
}

/* Swap the arena's lock word from state from to state to under the grant's
 * token (order: the swap's, when it is made). false when the word held
 * anything else, which *seen then gets: the arena was taken back, and is
 * forgotten. */
static bool arena_lock_swap(shmb_t *c, _Atomic uint64_t *lock, uint64_t from, uint64_t to,
                            memory_order order, uint64_t *seen)
{
    uint64_t want = SHMB_ARENA_WORD(c->arena.token, from);

    if (atomic_compare_exchange_strong_explicit(lock, &want,
                                                SHMB_ARENA_WORD(c->arena.token, to),
                                                order, memory_order_relaxed))
        return true;
    c->arena.size = 0;
    *seen = want;
    return false;
}

/* Copy the payload to the cursor, after the chunk header the daemon will
 * write, holding the lock (IDLE -> BUSY -> IDLE), and count the commit that
 * follows before the lock goes IDLE: the daemon takes an arena back only
 * while no one writes into it and no commit is on its way. -ESTALE when it
 * was taken back (before, or during a write so long that the daemon stopped
 * waiting). The caller sends the commit_at, or takes the count back
 * (arena_uncount) when it cannot. */
static int arena_write(shmb_t *c, uint64_t hsize, const void *data, size_t size)
{
    _Atomic uint64_t *lock = arena_lock_word(c), *inflight = arena_inflight_word(c);
    uint64_t seen = 0;
    const unsigned char *lo = (const unsigned char *)lock,
                        *at = c->map + c->arena.cursor + hsize;
    /* One look (one mincore) from the lock word to the payload's end while
     * that span is short, as it is in a small arena or early in a large
     * one: a look costs about 1.3 us on a VM whatever its length up to
     * ARENA_ONE_LOOK bytes, a tenth of what a 64-byte put and its read cost
     * this process; the pages between are the arena's, in memory too. */
    bool present = (size_t)(at + size - lo) <= ARENA_ONE_LOOK
                       ? arena_pages_present(c, lo, (size_t)(at + size - lo))
                       : arena_pages_present(c, lo, sizeof(*lock)) &&
                             arena_pages_present(c, at, size);

    if (!present)
        return shmb_error_set(&c->err, -EFAULT,
                              "The pages of the arena at %llu are not in memory (a client "
                              "truncated the segment or punched a hole in it?); the put "
                              "goes through alloc and commit.",
                              (unsigned long long)c->arena.offset);
    if (!arena_lock_swap(c, lock, SHMB_ARENA_IDLE, SHMB_ARENA_BUSY, memory_order_acquire,
                         &seen))
        return shmb_error_set(
            &c->err, -ESTALE,
            "The arena at %llu was taken back by shmbrokerd (its lock "
            "word reads %#llx, not IDLE under the grant's token); ask for "
            "a new one.",
            (unsigned long long)c->arena.offset, (unsigned long long)seen);
    memcpy(c->map + c->arena.cursor + hsize, data, size);
    /* Counted before the lock is IDLE (the release below publishes both):
     * a daemon that swaps the lock to REVOKED after this reads the count
     * and gives the arena back to us. */
    atomic_fetch_add_explicit(inflight, 1, memory_order_relaxed);
    if (!arena_lock_swap(c, lock, SHMB_ARENA_BUSY, SHMB_ARENA_IDLE, memory_order_release,
                         &seen))
        return shmb_error_set(&c->err, -ESTALE,
                              "The arena at %llu was taken back by shmbrokerd while %zu "
                              "bytes were copied into it; ask for a new one.",
                              (unsigned long long)c->arena.offset, size);
    return 0;
}

/* A commit counted by arena_write will not be sent after all (no memory for
 * the request): the count goes back, so that the arena does not stay the
 * handle's for ever. */
static void arena_uncount(shmb_t *c)
{
    atomic_fetch_sub_explicit(arena_inflight_word(c), 1, memory_order_relaxed);
}

/* Send commit_at for the chunk laid out at the cursor (and, when the arena
 * runs low, the next arena's request in the same write) and read the
 * replies: nowait reads only the arena's. The daemon's error, or -ESTALE
 * when the arena went under the commit (the caller lays the chunk out
 * again in the next). */
static int arena_commit(shmb_t *c, const struct client_key *key, uint64_t hsize,
                        size_t size, unsigned readers, uint64_t chunk, bool nowait)
{
    struct line_reply r;
    struct shmb_error saved;
    uint64_t at = c->arena.cursor, cid, aid = 0;
    uint64_t left = c->arena.offset + c->arena.size - (at + chunk);
    /* The daemon takes SHMB_ARENA_MAX_OBJECTS objects per arena: the last
     * one asks for the next arena, as when room runs short. */
    bool refill = left < chunk || left < c->arena.size / 4 ||
                  ++c->arena.chunks >= SHMB_ARENA_MAX_OBJECTS,
         unsure = c->arena.unsure;
    int rc, arc;

    c->w.len = 0;
    if ((rc = client_begin_key(c, SHMB_OP_COMMIT_AT, cid = client_next_id(c), key)) < 0) {
        arena_uncount(c);
        return rc;
    }
    if (line_lit(&c->w, ",\"offset\":") < 0 || line_u64(&c->w, at) < 0 ||
        line_lit(&c->w, ",\"size\":") < 0 || line_u64(&c->w, size) < 0 ||
        line_lit(&c->w, ",\"readers\":") < 0 || line_u64(&c->w, readers) < 0 ||
        line_lit(&c->w, nowait ? ",\"noreply\":true}\n" : "}\n") < 0) {
        arena_uncount(c);
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    }
    if (refill && (rc = arena_request(c, arena_ask(c, chunk), &aid)) < 0) {
        arena_uncount(c);
        return rc;
    }
    if ((rc = client_send(c)) < 0)
        return rc;
    if (nowait) {
        if (c->unconfirmed.count++ == 0)
            snprintf(c->unconfirmed.key, sizeof(c->unconfirmed.key), "%s", key->s);
        memcpy(c->unconfirmed.last, key->s, key->len + 1); /* checked: <= SHMB_KEY_MAX */
        c->noreply_sent = true;
        c->arena.cursor += chunk;
        c->arena.unsure = true;
        rc = 0;
    } else if ((rc = client_receive(c, cid, &r)) == 0) {
        c->arena.cursor += chunk;
        c->arena.unsure = false;
        if (!r.has_offset || r.offset != at + hsize) {
            char ebuf[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];

            rc = shmb_error_set(&c->err, -EPROTO,
                                "shmbrokerd committed '%s' at %llu; the library laid its "
                                "payload out at %llu.",
                                shmb_escape(key->s, key->len, ebuf, sizeof(ebuf)),
                                (unsigned long long)r.offset,
                                (unsigned long long)(at + hsize));
        }
    } else if (c->sock < 0) {
        return rc; /* the connection went, and the arena with it */
    } else if (rc == -EEXIST) {
        /* Refused for its key at the arena's next free byte: the daemon
         * stepped over the chunk (PROTOCOL.md section 11), and so do we. */
        c->arena.cursor += chunk;
    }
    /* A commit refused because the arena went (ESTALE), or after a commit
     * sent without waiting failed (the daemon's cursor is then behind ours,
     * and it refuses the offset): the arena is of no more use, the next one
     * may be on its way. A key that exists is the key's fault. */
    if (rc == -ESTALE || (unsure && rc < 0 && rc != -EEXIST)) {
        c->arena.size = 0;
        rc = -ESTALE;
    }
    if (!refill)
        return rc;
    saved = c->err;
    arc = arena_take(c, aid);
    if (c->sock < 0 && rc == 0)
        return arc;
    c->err = saved;
    return rc;
}

/* Why this handle puts without an arena, or NULL when it may have one. */
static const char *arena_unusable(const shmb_t *c)
{
    if (c->read_only)
        return "this handle is read-only";
    if (c->arena_want == 0)
        return "arenas are off (shmb_set_arena(c, 0))";
    if (c->arena.off)
        return "shmbrokerd gives this connection no arena (an older daemon, or a segment "
               "too small for one)";
    return NULL;
}

/* Puts sent without waiting that the daemon refused, told by a reply since,
 * or that may be lost with their connection (c->lost): -ECANCELED naming
 * the first one's key and error, and the record is cleared. key: the put
 * that reports them, which is not made (the caller puts again what was
 * lost, then this one); NULL for shmb_sync. */
static int arena_report_lost(shmb_t *c, const char *key)
{
    char lost[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)], this[SHMB_ESCAPED_MAX(SHMB_KEY_MAX)];
    char said[SHMB_ERROR_MSG_MAX], more[96] = "";
    char then[SHMB_ESCAPED_MAX(SHMB_KEY_MAX) + 64];

    memcpy(said, c->lost.message, sizeof(said));
    said[sizeof(said) - 1] = '\0';
    if (c->lost.count > 1)
        snprintf(more, sizeof(more), ", and %llu more after it",
                 (unsigned long long)(c->lost.count - 1));
    c->lost.count = 0;
    /* A commit refused other than for its key leaves the daemon's cursor
     * behind this handle's, and every later one in that arena would be
     * refused too: the next put asks for a new arena. */
    c->arena.size = 0;
    if (key != NULL)
        snprintf(then, sizeof(then), "This put of '%s' was not made: ",
                 shmb_escape(key, strlen(key), this, sizeof(this)));
    else
        then[0] = '\0';
    shmb_escape(c->lost.key, strlen(c->lost.key), lost, sizeof(lost));
    if (c->lost.code == -ECONNRESET)
        return shmb_error_set(
            &c->err, -ECANCELED,
            "A put sent without waiting (shmb_put_nowait) of '%s' may not have been "
            "made: %s%s. %s%sook for what may be lost (shmb_contains) and put it "
            "again%s.",
            lost, said, more, then, key != NULL ? "l" : "L",
            key != NULL ? ", then this" : "");
    return shmb_error_set(
        &c->err, -ECANCELED,
        "A put sent without waiting (shmb_put_nowait) of '%s' was refused by shmbrokerd "
        "(%s: %.400s)%s. %s%sut again what was lost%s.",
        lost, shmb_error_name(c->lost.code), said, more, then, key != NULL ? "p" : "P",
        key != NULL ? ", then this" : "");
}

/* shmb_sync: a request answered proves every one sent before it handled
 * (its reply tells of refused puts), then what was told is reported. */
static int client_sync(shmb_t *c)
{
    char key[SHMB_KEY_MAX + 1];
    struct client_key k;
    int rc;

    shmb_error_clear(&c->err);
    if (c->unconfirmed.count > 0 && c->sock >= 0) {
        memcpy(key, c->unconfirmed.key, sizeof(key));
        k = client_key_trusted(key); /* checked when it was put */
        /* A connection lost on the way makes them lost (client_lost). */
        if ((rc = client_key_op(c, SHMB_OP_CONTAINS, &k, NULL)) < 0 && c->lost.count == 0)
            return rc;
    }
    return c->lost.count > 0 ? arena_report_lost(c, NULL) : 0;
}

int shmb_sync(shmb_t *c)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_sync(c));
}

static int client_arena_put(shmb_t *c, const char *key, const void *data, size_t size,
                            unsigned readers, bool nowait)
{
    struct client_key k;
    const char *why;
    uint64_t hsize, chunk;
    int attempt, rc;

    shmb_error_clear(&c->err);
    if (c->lost.count > 0)
        return arena_report_lost(c, key);
    /* The one check of the put's key: what goes down is k. */
    if ((rc = client_check_key(c, key, &k)) < 0 || (rc = client_check_size(c, size)) < 0)
        return rc;
    if (c->sock < 0)
        return shmb_error_set(&c->err, -ENOTCONN,
                              "Not connected to shmbrokerd; call shmb_connect (or "
                              "shmb_reconnect after a lost connection) first.");
    if ((why = arena_unusable(c)) != NULL) {
        if (nowait)
            return shmb_error_set(&c->err, -ENOTSUP,
                                  "shmb_put_nowait needs an arena, and %s. Nothing was "
                                  "sent; use shmb_put.",
                                  why);
        if (c->arena.size != 0 && c->arena_want == 0 && (rc = arena_give_back(c)) < 0 &&
            c->sock < 0)
            return rc;
        return client_put_copy(c, &k, data, size, readers);
    }
    hsize = SHMB_CHUNK_HEADER_SIZE(k.len);
    chunk = hsize + SHMB_ALIGN_UP(size);
    /* An empty object, one larger than any arena, or a daemon short of room:
     * the two round trips of alloc and commit. */
    if (size == 0 || chunk > arena_limit(c))
        return client_put_copy(c, &k, data, size, readers);
    if (c->arena.skip > 0 && c->arena.size == 0) {
        c->arena.skip--;
        return client_put_copy(c, &k, data, size, readers);
    }
    /* A second try when the arena went under the first. */
    for (attempt = 0; attempt < 2; attempt++) {
        if (c->arena.size == 0 || chunk > c->arena.offset + c->arena.size - c->arena.cursor ||
            c->arena.chunks >= SHMB_ARENA_MAX_OBJECTS) {
            if ((rc = arena_renew(c, chunk)) < 0) {
                if (c->sock < 0)
                    return rc;
                if (nowait && c->arena.off) {
                    char said[SHMB_ERROR_MSG_MAX];

                    memcpy(said, c->err.message, sizeof(said));
                    return shmb_error_set(&c->err, -ENOTSUP,
                                          "shmb_put_nowait needs an arena, and %s (%s). "
                                          "Nothing was sent; use shmb_put.",
                                          arena_unusable(c), said);
                }
                return client_put_copy(c, &k, data, size, readers);
            }
            if (chunk > c->arena.size)
                return client_put_copy(c, &k, data, size, readers);
        }
        if ((rc = arena_write(c, hsize, data, size)) == -ESTALE)
            continue;
        if (rc < 0)
            break;
        if ((rc = arena_commit(c, &k, hsize, size, readers, chunk, nowait)) != -ESTALE)
            return rc;
    }
    /* Taken back twice in a row (the daemon is short of room), or pages
     * gone from the file (the daemon says what happened): no arena. */
    return client_put_copy(c, &k, data, size, readers);
}

int shmb_put(shmb_t *c, const char *key, const void *data, size_t size, unsigned readers)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_arena_put(c, key, data, size, readers, false));
}

int shmb_put_nowait(shmb_t *c, const char *key, const void *data, size_t size,
                    unsigned readers)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_arena_put(c, key, data, size, readers, true));
}

void shmb_set_arena(shmb_t *c, size_t bytes)
{
    c->arena_want = bytes;
}
