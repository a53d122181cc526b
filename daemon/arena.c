// SPDX-License-Identifier: Apache-2.0
/*
 * Arenas: an arena's record, its size, the placement checks of commit_at,
 * and the lock in the seal of its header (see arena.h).
 */
#include "arena.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "segment.h"

/* The seal of an arena's header: the arena's own generation (given with the
 * grant), the lock in the count. It is shared with the client, which takes
 * the lock with a compare-and-swap of its own that expects that generation:
 * once the arena's bytes are reused, whatever lies there (a new chunk's
 * header, a payload of zeros) is not that seal, and the client's
 * compare-and-swap fails instead of writing into another's bytes. The
 * daemon's accesses are atomic too, and guarded (segment_atomic_*), since a
 * client may have truncated the file under it. */
#define ARENA_SEAL(a, lock) SHMB_ARENA_WORD((a)->token, (lock))

int arena_grant_size(uint64_t asked, uint64_t max_object, uint64_t data_size,
                     uint64_t *out, struct shmb_error *err)
{
    uint64_t size = asked;

    if (size > max_object)
        size = max_object;
    if (size > data_size / 8)
        size = data_size / 8;
    /* The arena header's tag counts committed bytes in SHMB_ALIGN units. */
    if (size > (uint64_t)UINT32_MAX * SHMB_ALIGN)
        size = (uint64_t)UINT32_MAX * SHMB_ALIGN;
    size &= ~(uint64_t)(SHMB_ALIGN - 1);
    if (size < ARENA_MIN_SIZE)
        return shmb_error_set(
            err, -EINVAL,
            "An arena of %llu bytes is too small: an arena holds at least %llu bytes "
            "(one chunk with the longest key), and this pool grants at most %llu "
            "(the max object size, %llu bytes, and 1/8 of the data area, %llu "
            "bytes).%s",
            (unsigned long long)size, (unsigned long long)ARENA_MIN_SIZE,
            (unsigned long long)((max_object < data_size / 8 ? max_object : data_size / 8) &
                                 ~(uint64_t)(SHMB_ALIGN - 1)),
            (unsigned long long)max_object, (unsigned long long)(data_size / 8),
            asked < ARENA_MIN_SIZE ? " Ask for more." : " Use alloc and commit here.");
    *out = size;
    return 0;
}

void arena_init(struct arena *a, void *holder, uint64_t client, uint64_t ring_id,
                uint64_t chunk, uint64_t start, uint64_t end, uint64_t *seal,
                uint64_t token, uint64_t now_ms)
{
    memset(a, 0, sizeof(*a));
    a->token = token;
    a->holder = holder;
    a->client = client;
    a->ring_id = ring_id;
    a->chunk = chunk;
    a->start = a->cursor = start;
    a->end = end;
    a->seal = seal;
    a->inflight = (uint64_t *)(void *)((unsigned char *)seal -
                                       offsetof(struct shmb_chunk_header, seal) +
                                       SHMB_ARENA_INFLIGHT_AT);
    a->published = (uint64_t *)(void *)((unsigned char *)seal -
                                        offsetof(struct shmb_chunk_header, seal) +
                                        SHMB_ARENA_PUBLISHED_AT);
    a->last_use_ms = now_ms;
    TAILQ_INIT(&a->objects);
}

int arena_check_commit(const struct arena *a, uint64_t offset, uint64_t chunk_size,
                       struct shmb_error *err)
{
    if (a == NULL)
        return shmb_error_set(err, -ESTALE,
                              "commit_at: this connection holds no arena (it was given "
                              "back or taken back); ask for a new one with "
                              "{\"op\":\"arena\",\"size\":N} and lay the chunk out again.");
    if (offset < a->start || offset >= a->end)
        return shmb_error_set(err, -ESTALE,
                              "commit_at offset %llu lies outside this connection's arena "
                              "(%llu..%llu): the arena it was written into is gone; ask "
                              "for a new one.",
                              (unsigned long long)offset, (unsigned long long)a->start,
                              (unsigned long long)a->end);
    if (a->made >= SHMB_ARENA_MAX_OBJECTS)
        return shmb_error_set(err, -ESTALE,
                              "commit_at: this connection's arena already holds %u objects, "
                              "the most one arena may hold (reclaim frees an arena's "
                              "objects all at once); ask for a new one with "
                              "{\"op\":\"arena\",\"size\":N} and lay the chunk out again.",
                              (unsigned)SHMB_ARENA_MAX_OBJECTS);
    if (offset != a->cursor)
        return shmb_error_set(err, -EINVAL,
                              "commit_at offset %llu is not the arena's next free byte "
                              "%llu (arena %llu..%llu): lay chunks out in order.",
                              (unsigned long long)offset, (unsigned long long)a->cursor,
                              (unsigned long long)a->start, (unsigned long long)a->end);
    if (chunk_size == 0 || chunk_size > a->end - offset)
        return shmb_error_set(err, -EINVAL,
                              "commit_at chunk of %llu bytes at %llu runs past the end of "
                              "the arena (%llu..%llu, %llu bytes left): ask for a new "
                              "arena.",
                              (unsigned long long)chunk_size, (unsigned long long)offset,
                              (unsigned long long)a->start, (unsigned long long)a->end,
                              (unsigned long long)(a->end - offset));
    return 0;
}

int arena_open(struct arena *a)
{
    int rc;

    if ((rc = segment_atomic_store64(a->inflight, 0)) < 0 ||
        (rc = segment_atomic_store64(a->published, a->start)) < 0)
        return rc;
    return segment_atomic_store64(a->seal, ARENA_SEAL(a, SHMB_ARENA_IDLE));
}

int arena_published(const struct arena *a, bool close, uint64_t *end)
{
    uint64_t word = 0;
    int rc = close ? segment_atomic_exchange64(a->published, SHMB_ARENA_PUBLISH_CLOSED, &word)
                   : segment_atomic_load64(a->published, &word);

    /* Anything but an end inside the arena past the cursor publishes
     * nothing: the grant's start, the closed mark, or a scribble. */
    *end = rc == 0 && !a->fold_stopped && word > a->cursor && word <= a->end ? word
                                                                            : a->cursor;
    return rc;
}

/* How many times arena_commit_seen tries its compare-and-swap against a
 * client adding to the count at the same moment: an honest client adds once
 * per chunk it copies, so a second try is already rare. */
#define ARENA_COUNT_TRIES 64

bool arena_commit_seen(struct arena *a)
{
    uint64_t n = 0;
    int i, rc;

    if (segment_atomic_load64(a->inflight, &n) < 0)
        return false;
    /* Never below 0: a client that did not count (an older library) keeps
     * it at 0, and one that wrote nonsense there only keeps its own arena. */
    for (i = 0; i < ARENA_COUNT_TRIES && n > 0; i++)
        if ((rc = segment_atomic_cas64(a->inflight, &n, n - 1)) != -EAGAIN)
            return rc == 0 && n == 1;
    return n == 0;
}

/* The count of the arena's commits on their way: 0 or -EIO. */
static int arena_inflight(const struct arena *a, uint64_t *n)
{
    return segment_atomic_load64(a->inflight, n);
}

/* Whether a's client published chunks the daemon has not folded yet (read
 * after the lock went REVOKED from IDLE: it publishes only while BUSY, so
 * none can follow). Folds run outside reclaim, where objects may be made;
 * until one has, the arena stays its client's, as with commits on their
 * way. */
static bool arena_unfolded(const struct arena *a)
{
    uint64_t end = 0;

    return arena_published(a, false, &end) == 0 && end != a->cursor;
}

bool arena_commits_sent(const struct arena *a)
{
    uint64_t n = 0;

    return arena_inflight(a, &n) < 0 || n != 0;
}

bool arena_committing(const struct arena *a)
{
    uint64_t n = 0;

    return arena_inflight(a, &n) < 0 || n != 0 || arena_unfolded(a);
}

int arena_revoke(struct arena *a, uint64_t now_ms, uint64_t busy_limit_ms)
{
    uint64_t expected = ARENA_SEAL(a, SHMB_ARENA_IDLE), n = 0;
    int rc;

    /* The client sets the lock IDLE only after it counted its commit, and
     * takes it again only from IDLE: a swap to REVOKED that read its IDLE
     * is followed by a read of the count that sees that commit, and any
     * later write of the client fails on REVOKED. (The count is read first
     * too, so that a client that is committing does not see its lock
     * REVOKED for a moment for nothing.) */
    if ((rc = arena_inflight(a, &n)) == 0 && n == 0 && !arena_unfolded(a) &&
        (rc = segment_atomic_cas64(a->seal, &expected, ARENA_SEAL(a, SHMB_ARENA_REVOKED))) ==
            0 &&
        (rc = arena_inflight(a, &n)) == 0 && (n != 0 || arena_unfolded(a))) {
        uint64_t revoked = ARENA_SEAL(a, SHMB_ARENA_REVOKED);

        /* Commits on their way: the arena stays its client's. Its own
         * write, had it looked in between, failed and asks for a new arena;
         * the commits already sent still land in this one. */
        rc = segment_atomic_cas64(a->seal, &revoked, ARENA_SEAL(a, SHMB_ARENA_IDLE));
    }
    if (rc == 0 && (n != 0 || arena_unfolded(a)))
        rc = -EAGAIN; /* committing: as BUSY */
    if (rc == -EIO) {
        /* Its page is gone (a client cut the file): a look all the same, so
         * that the next is due --alloc-timeout from now, not at once for
         * ever (arena_due_ms). */
        a->busy_seen_ms = now_ms;
        return rc;
    }
    if (rc == 0 || expected == ARENA_SEAL(a, SHMB_ARENA_REVOKED)) {
        a->busy_since_ms = 0;
        return 0;
    }
    /* The client is writing into it or committing (or scribbled over its
     * lock or count). */
    if (a->busy_since_ms == 0)
        a->busy_since_ms = now_ms;
    a->busy_seen_ms = now_ms;
    if (busy_limit_ms == 0 || now_ms - a->busy_since_ms < busy_limit_ms)
        return -EBUSY;
    a->busy_since_ms = 0;
    return segment_atomic_store64(a->seal, ARENA_SEAL(a, SHMB_ARENA_REVOKED));
}

bool arena_close(struct arena *a)
{
    uint64_t old = 0;

    a->busy_since_ms = 0;
    if (segment_atomic_exchange64(a->seal, ARENA_SEAL(a, SHMB_ARENA_REVOKED), &old) < 0)
        return true; /* the page is gone: nothing is handed out there anyway */
    return old == ARENA_SEAL(a, SHMB_ARENA_BUSY);
}

uint64_t arena_token(void)
{
    static uint64_t state;
    uint64_t z;

    if (state == 0 && getrandom(&state, sizeof(state), GRND_NONBLOCK) != sizeof(state))
        state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    /* splitmix64 */
    do {
        z = (state += UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        z ^= z >> 31;
        z &= ~UINT64_C(3) & ~(UINT64_C(1) << 63); /* lock bits clear; a JSON integer */
    } while (z == 0);
    return z;
}

uint64_t arena_due_ms(const struct arena *a, uint64_t timeout_ms)
{
    /* Not from busy_since_ms: once that plus the timeout has passed, the
     * deadline would stay in the past while the lock stays BUSY, and the
     * daemon's timer would fire again at once, for ever. */
    return (a->busy_seen_ms > a->last_use_ms ? a->busy_seen_ms : a->last_use_ms) +
           timeout_ms;
}
