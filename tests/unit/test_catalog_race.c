// SPDX-License-Identifier: Apache-2.0
/*
 * Reads racing eviction and reuse: one thread plays the daemon over a private
 * area laid out as a layout-2 segment (header page, data area of chunks with
 * their seals, catalog), listing, unlisting and reusing chunks in a tight
 * loop with daemon/catalog.c and the seal rules of the contract, while
 * reader threads call shmb_catalog_read (proto/catalog.c) on random keys.
 * Every payload carries its key, its generation and a pattern derived from
 * both, so a reader can tell alone whether what it got is exactly what was
 * committed under that key in that generation. Built plain, under ASan and
 * under ThreadSanitizer (which checks the orderings themselves).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../daemon/catalog.h"
#include "../../proto/catalog.h"
#include "../../proto/layout.h"

/* The area: a header page, NCHUNK chunks of CHUNK_BYTES, the catalog. */
#define NCHUNK 48
#define CHUNK_BYTES 1024u
#define DATA_SIZE ((uint64_t)NCHUNK * CHUNK_BYTES)
#define CATALOG_AT (SHMB_HEADER_PAGE + DATA_SIZE)
/* Keys the daemon lists and unlists; keys it lists once and never touches
 * again (their entries still move when a neighbour goes); keys it never
 * lists. */
#define NDYN 40
#define NSTABLE 4
#define NNEVER 4
#define NKEYS (NDYN + NSTABLE + NNEVER)
#define NREADERS 3
/* The generations one run may use: key_of_gen records, per generation, the
 * key committed in it. */
#define MAX_GEN (1u << 22)
#define NO_KEY 0xffffu

/* What the daemon thread and the readers share. */
struct race {
    unsigned char *base; /* the area (MAP_SHARED anonymous) */
    size_t size;
    uint64_t slots;
    struct shmb_catalog_view view;
    char keys[NKEYS][160];
    size_t key_len[NKEYS];
    uint16_t *key_of_gen; /* [MAX_GEN], atomically written before publishing */
    int ready;            /* atomic: the stable keys are listed */
    int stop;             /* atomic */
    uint64_t seed;
    /* The daemon's books (its thread only, read by main after the join). */
    uint64_t published, unlisted_adds, reuses, folds;
    uint64_t harvested; /* counts taken back from seals */
    /* The readers' (atomic adds). */
    uint64_t hits, misses, again, nobufs, counted, stale;
    uint64_t stable_hits;
    uint64_t failures;
    char failure[512]; /* the first one, under fail_lock */
    pthread_mutex_t fail_lock;
};

/* A reader's or the daemon thread's failure: counted, the first one kept
 * (cmocka's asserts belong to the main thread). */
static void race_fail(struct race *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void race_fail(struct race *r, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&r->fail_lock);
    if (r->failures++ == 0) {
        va_start(ap, fmt);
        vsnprintf(r->failure, sizeof(r->failure), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&r->fail_lock);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Byte i of the payload of key k in generation gen, after its 16-byte head
 * (key index, generation, size). */
static unsigned char pattern(uint32_t k, uint32_t gen, size_t i)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ gen * 40503u ^ k * 2246822519u;

    return (unsigned char)(x >> 24 ^ x);
}

/* Payload size for a chunk of key k: from 1 byte to what the chunk holds,
 * so that the head is sometimes cut short. */
static uint64_t payload_room(size_t key_len)
{
    return CHUNK_BYTES - SHMB_CHUNK_HEADER_SIZE(key_len);
}

/* Stores into the area are atomic (relaxed) like the loads of the reader's
 * copy, so that ThreadSanitizer reports only what is not meant to race:
 * here one thread plays writers that live in other processes. */
static void store8(unsigned char *p, unsigned char v)
{
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

static void store_bytes(unsigned char *dst, const unsigned char *src, size_t n)
{
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        uint64_t w;

        memcpy(&w, src + i, 8);
        __atomic_store_n((uint64_t *)(void *)(dst + i), w, __ATOMIC_RELAXED);
    }
    for (; i < n; i++)
        store8(dst + i, src[i]);
}

static struct shmb_chunk_header *chunk_at(struct race *r, int c)
{
    return (struct shmb_chunk_header *)(void *)(r->base + SHMB_HEADER_PAGE +
                                                (uint64_t)c * CHUNK_BYTES);
}

static uint64_t chunk_offset(int c)
{
    return SHMB_HEADER_PAGE + (uint64_t)c * CHUNK_BYTES;
}

/* Write chunk c's header, key and payload for key k in generation gen, as
 * a client and the daemon would before the object is published. */
static void write_chunk(struct race *r, int c, int k, uint32_t gen, uint64_t size)
{
    struct shmb_chunk_header *h = chunk_at(r, c);
    size_t len = r->key_len[k];
    unsigned char buf[CHUNK_BYTES];
    uint32_t head[2] = {(uint32_t)k, gen};
    size_t i;

    __atomic_store_n(&h->magic, SHMB_CHUNK_MAGIC, __ATOMIC_RELAXED);
    __atomic_store_n(&h->state, (uint16_t)SHMB_CHUNK_COMMITTED, __ATOMIC_RELAXED);
    __atomic_store_n(&h->key_len, (uint16_t)len, __ATOMIC_RELAXED);
    __atomic_store_n(&h->header_size, (uint32_t)SHMB_CHUNK_HEADER_SIZE(len), __ATOMIC_RELAXED);
    __atomic_store_n(&h->tag, 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&h->id, (uint64_t)gen, __ATOMIC_RELAXED);
    __atomic_store_n(&h->chunk_size, (uint64_t)CHUNK_BYTES, __ATOMIC_RELAXED);
    __atomic_store_n(&h->payload_size, size, __ATOMIC_RELAXED);
    store_bytes((unsigned char *)(h + 1), (const unsigned char *)r->keys[k], len);
    memcpy(buf, head, sizeof(head));
    memcpy(buf + 8, &size, 8);
    for (i = 16; i < size; i++)
        buf[i] = pattern((uint32_t)k, gen, i);
    store_bytes((unsigned char *)h + SHMB_CHUNK_HEADER_SIZE(len), buf, size);
}

/* Check what a read returned for key k: its own head, the pattern of its
 * generation, the generation the hit names, and that generation was
 * committed under k. Returns false (and says why) otherwise. */
static bool check_payload(struct race *r, int k, const unsigned char *buf, size_t size,
                          const struct shmb_catalog_hit *hit)
{
    unsigned char head[16] = {0};
    uint32_t pk, pg;
    uint64_t psize;
    uint16_t committed;
    size_t i;

    memcpy(head, buf, size < 16 ? size : 16);
    memcpy(&pk, head, 4);
    memcpy(&pg, head + 4, 4);
    memcpy(&psize, head + 8, 8);
    if (hit->size != size) {
        race_fail(r, "key %d: hit says %llu bytes, read returned %zu", k,
                  (unsigned long long)hit->size, size);
        return false;
    }
    if (hit->gen == 0 || hit->gen >= MAX_GEN) {
        race_fail(r, "key %d: hit generation %u", k, hit->gen);
        return false;
    }
    committed = __atomic_load_n(&r->key_of_gen[hit->gen], __ATOMIC_ACQUIRE);
    if (committed != k) {
        race_fail(r, "key %d: generation %u was committed under key %d", k, hit->gen,
                  committed == NO_KEY ? -1 : (int)committed);
        return false;
    }
    /* A head cut short by a small size is compared as far as it goes. */
    {
        unsigned char want[16];
        uint32_t wk = (uint32_t)k, wg = hit->gen;
        uint64_t ws = size;

        memcpy(want, &wk, 4);
        memcpy(want + 4, &wg, 4);
        memcpy(want + 8, &ws, 8);
        if (memcmp(head, want, size < 16 ? size : 16) != 0) {
            race_fail(r, "key %d gen %u size %zu: the payload is of key %u gen %u size %llu "
                      "(another key's or another generation's bytes)", k, hit->gen, size, pk,
                      pg, (unsigned long long)psize);
            return false;
        }
    }
    for (i = 16; i < size; i++)
        if (buf[i] != pattern((uint32_t)k, hit->gen, i)) {
            race_fail(r, "key %d gen %u: byte %zu of %zu differs (torn copy)", k, hit->gen, i,
                      size);
            return false;
        }
    return true;
}

/* ---- the daemon's side ------------------------------------------------------ */

/* What the daemon thread knows of one chunk and one key. */
struct dstate {
    int chunk_key[NCHUNK]; /* -1: free */
    uint32_t chunk_gen[NCHUNK];
    bool chunk_listed[NCHUNK];
    int key_chunk[NKEYS]; /* -1: not committed */
    size_t listed;
    uint32_t unlisted;
};

/* Commit key k into free chunk c: the bytes, then the seal SHMB_SEAL(gen,
 * 0) with release order, then the catalog entry (the contract's order). */
static void d_publish(struct race *r, struct catalog *cat, struct dstate *d, int c, int k,
                      uint64_t *rng)
{
    uint32_t gen = catalog_next_gen(cat);
    uint64_t room = payload_room(r->key_len[k]);
    uint64_t size = xorshift(rng) % 4 == 0 ? 1 + xorshift(rng) % 24 : 1 + xorshift(rng) % room;
    struct shmb_chunk_header *h = chunk_at(r, c);
    uint64_t seal = __atomic_load_n(&h->seal, __ATOMIC_ACQUIRE);
    int rc;

    if (gen == 0 || gen >= MAX_GEN) {
        race_fail(r, "catalog_next_gen gave %u", gen);
        __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
        return;
    }
    /* A reader's count that came in late must not have touched a free
     * chunk's seal: it stays 0 until the chunk is published again. */
    if (seal != 0)
        race_fail(r, "the seal of free chunk %d is %#llx, not 0 (a stale count changed it)", c,
                  (unsigned long long)seal);
    __atomic_store_n(&r->key_of_gen[gen], (uint16_t)k, __ATOMIC_RELEASE);
    write_chunk(r, c, k, gen, size);
    __atomic_store_n(&h->seal, SHMB_SEAL(gen, 0), __ATOMIC_RELEASE);
    rc = catalog_add(cat, r->keys[k], r->key_len[k], chunk_offset(c), gen, size,
                     k % 2 ? SHMB_CATALOG_AWAITED : 0, NULL, NULL);
    if (rc != 0 && rc != -ENOSPC)
        race_fail(r, "catalog_add returned %d", rc);
    d->chunk_key[c] = k;
    d->chunk_gen[c] = gen;
    d->chunk_listed[c] = rc == 0;
    d->key_chunk[k] = c;
    if (rc == 0)
        d->listed++;
    else {
        d->unlisted++;
        r->unlisted_adds++;
    }
    r->published++;
}

/* Take chunk c's object away: unlist it first, then swap the seal to 0
 * (the count it held is harvested), then scribble over the bytes, as a
 * reuse by another writer would. */
static void d_unpublish(struct race *r, struct catalog *cat, struct dstate *d, int c,
                        uint64_t *rng)
{
    int k = d->chunk_key[c];
    struct shmb_chunk_header *h = chunk_at(r, c);
    uint64_t old;
    unsigned char junk[64];
    size_t i;

    catalog_remove(cat, r->keys[k], r->key_len[k], chunk_offset(c), d->chunk_listed[c]);
    old = __atomic_exchange_n(&h->seal, 0, __ATOMIC_ACQ_REL);
    if (SHMB_SEAL_GEN(old) != d->chunk_gen[c])
        race_fail(r, "chunk %d: seal generation %u, the daemon set %u", c, SHMB_SEAL_GEN(old),
                  d->chunk_gen[c]);
    r->harvested += SHMB_SEAL_COUNT(old);
    if (d->chunk_listed[c])
        d->listed--;
    else
        d->unlisted--;
    d->key_chunk[k] = -1;
    d->chunk_key[c] = -1;
    __atomic_store_n(&h->state, (uint16_t)SHMB_CHUNK_FREE, __ATOMIC_RELAXED);
    for (i = 0; i < sizeof(junk); i++)
        junk[i] = (unsigned char)xorshift(rng);
    store_bytes((unsigned char *)h + 64 + (xorshift(rng) % (CHUNK_BYTES / 64 - 1)) * 64, junk,
                sizeof(junk));
}

/* Fold the reads counted in a live chunk's seal into the daemon's books, as
 * the daemon does before deciding reclaim: {gen,c} -> {gen,0}. */
static void d_fold(struct race *r, struct dstate *d, int c)
{
    struct shmb_chunk_header *h = chunk_at(r, c);
    uint64_t s = __atomic_load_n(&h->seal, __ATOMIC_ACQUIRE);

    while (SHMB_SEAL_COUNT(s) != 0) {
        if (SHMB_SEAL_GEN(s) != d->chunk_gen[c]) {
            race_fail(r, "chunk %d: seal generation %u while live at %u", c, SHMB_SEAL_GEN(s),
                      d->chunk_gen[c]);
            return;
        }
        if (__atomic_compare_exchange_n(&h->seal, &s, SHMB_SEAL(d->chunk_gen[c], 0), false,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            r->harvested += SHMB_SEAL_COUNT(s);
            r->folds++;
            return;
        }
    }
}

/* The daemon's books against the catalog's own figures and the header's. */
static void d_check_books(struct race *r, struct catalog *cat, const struct dstate *d)
{
    const struct shmb_segment_header *hdr = (const void *)r->base;

    if (catalog_listed(cat) != d->listed || catalog_unlisted(cat) != d->unlisted ||
        __atomic_load_n(&hdr->catalog_unlisted, __ATOMIC_RELAXED) != d->unlisted)
        race_fail(r, "catalog counts listed %zu unlisted %u (header %u), expected %zu and %u",
                  catalog_listed(cat), catalog_unlisted(cat), hdr->catalog_unlisted, d->listed,
                  d->unlisted);
    if ((__atomic_load_n(&hdr->catalog_moves, __ATOMIC_RELAXED) & 1) != 0)
        race_fail(r, "catalog_moves is odd (%u) between two daemon calls", hdr->catalog_moves);
}

struct daemon_arg {
    struct race *r;
    struct catalog *cat;
    double seconds;
};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The daemon thread: list the stable keys once, then unlist and reuse the
 * chunks of the others as fast as it can until the time is up; at the end
 * take everything back so that every count is harvested. */
static void *daemon_main(void *arg)
{
    struct daemon_arg *a = arg;
    struct race *r = a->r;
    struct dstate d;
    uint64_t rng = r->seed * 2 + 1, n = 0;
    double end = now_s() + a->seconds;
    int c, k;

    for (c = 0; c < NCHUNK; c++)
        d.chunk_key[c] = -1;
    for (k = 0; k < NKEYS; k++)
        d.key_chunk[k] = -1;
    d.listed = 0;
    d.unlisted = 0;
    /* Dynamic keys first, so that the stable ones are listed past their
     * home slots and move back as those go: a stable key's miss is then a
     * probe that ran while entries moved. */
    for (k = 0; k < (int)(r->slots / 2); k++)
        d_publish(r, a->cat, &d, NSTABLE + k, k, &rng);
    for (k = NDYN; k < NDYN + NSTABLE; k++)
        d_publish(r, a->cat, &d, k - NDYN, k, &rng);
    __atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        c = NSTABLE + (int)(xorshift(&rng) % (NCHUNK - NSTABLE));
        if (d.chunk_key[c] >= 0) {
            int old = d.chunk_key[c];

            if (xorshift(&rng) % 8 == 0)
                d_fold(r, &d, c);
            d_unpublish(r, a->cat, &d, c, &rng);
            /* Reuse at once, half the time by another key, half by the
             * same key in a new generation. */
            k = xorshift(&rng) % 2 ? old : (int)(xorshift(&rng) % NDYN);
            if (d.key_chunk[k] < 0) {
                d_publish(r, a->cat, &d, c, k, &rng);
                r->reuses++;
            }
        } else {
            k = (int)(xorshift(&rng) % NDYN);
            if (d.key_chunk[k] < 0)
                d_publish(r, a->cat, &d, c, k, &rng);
        }
        if (++n % 1024 == 0) {
            d_check_books(r, a->cat, &d);
            if (now_s() > end || r->failures != 0)
                break;
        }
    }
    __atomic_store_n(&r->stop, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* ---- the readers ------------------------------------------------------------ */

struct reader_arg {
    struct race *r;
    uint64_t seed;
};

/* One reader: random keys, random buffer sizes, every answer checked. */
static void *reader_main(void *arg)
{
    struct reader_arg *a = arg;
    struct race *r = a->r;
    unsigned char buf[CHUNK_BYTES];
    uint64_t rng = a->seed;

    while (!__atomic_load_n(&r->ready, __ATOMIC_ACQUIRE))
        sched_yield();
    while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
        /* Half the reads are of stable keys: their misses must never be
         * claimed, however their entries move. */
        int k = xorshift(&rng) % 2 ? NDYN + (int)(xorshift(&rng) % NSTABLE)
                                   : (int)(xorshift(&rng) % NKEYS);
        size_t cap = xorshift(&rng) % 16 == 0 ? xorshift(&rng) % 64 : sizeof(buf);
        struct shmb_catalog_hit hit;
        int rc;

        memset(&hit, 0, sizeof(hit));
        rc = shmb_catalog_read(&r->view, r->keys[k], r->key_len[k], buf, cap, &hit);
        if (rc == 0) {
            if (k >= NDYN + NSTABLE) {
                race_fail(r, "key %d was never listed, yet read returned 0", k);
                continue;
            }
            if (hit.size > cap) {
                race_fail(r, "read returned %llu bytes into a buffer of %zu",
                          (unsigned long long)hit.size, cap);
                continue;
            }
            if (!check_payload(r, k, buf, (size_t)hit.size, &hit))
                continue;
            __atomic_add_fetch(&r->hits, 1, __ATOMIC_RELAXED);
            if (k >= NDYN)
                __atomic_add_fetch(&r->stable_hits, 1, __ATOMIC_RELAXED);
            if (hit.flags & SHMB_CATALOG_AWAITED) {
                rc = shmb_catalog_count_read(&r->view, &hit);
                if (rc == 0)
                    __atomic_add_fetch(&r->counted, 1, __ATOMIC_RELAXED);
                else if (rc == -ESTALE)
                    __atomic_add_fetch(&r->stale, 1, __ATOMIC_RELAXED);
                else
                    race_fail(r, "shmb_catalog_count_read returned %d", rc);
            }
        } else if (rc == -ENOENT) {
            /* A stable key is listed all along (the crowded catalog may
             * not list it: then the miss must not be authoritative). */
            if (k >= NDYN && k < NDYN + NSTABLE)
                race_fail(r, "stable key %d: -ENOENT though it was committed all along "
                          "(a miss trusted while entries moved?)", k);
            __atomic_add_fetch(&r->misses, 1, __ATOMIC_RELAXED);
        } else if (rc == -ENOBUFS) {
            if (hit.size <= cap || hit.size > payload_room(r->key_len[k]))
                race_fail(r, "key %d: -ENOBUFS with size %llu for a buffer of %zu", k,
                          (unsigned long long)hit.size, cap);
            __atomic_add_fetch(&r->nobufs, 1, __ATOMIC_RELAXED);
        } else if (rc == -EAGAIN) {
            __atomic_add_fetch(&r->again, 1, __ATOMIC_RELAXED);
        } else {
            race_fail(r, "shmb_catalog_read returned %d", rc);
        }
    }
    return NULL;
}

/* ---- the runs ------------------------------------------------------------------ */

static uint64_t run_seed(void)
{
    const char *s = getenv("SHMB_RACE_SEED");

    if (s != NULL && *s != '\0')
        return strtoull(s, NULL, 0);
    return (uint64_t)time(NULL) ^ (uint64_t)getpid() << 16;
}

static double run_seconds(void)
{
    const char *s = getenv("SHMB_RACE_SECONDS");

    return s != NULL && atof(s) > 0 ? atof(s) : 1.5;
}

/* Lay the area out (header page fields the readers' view and the catalog
 * use), give it a catalog of slots entries and keys of several lengths (so
 * that header sizes, and payload offsets, differ between the keys a chunk
 * holds in turn). */
static void race_init(struct race *r, uint64_t slots, uint64_t seed)
{
    struct shmb_segment_header *hdr;
    uint64_t catalog_bytes = (slots * sizeof(struct shmb_catalog_entry) + SHMB_HEADER_PAGE - 1) /
                             SHMB_HEADER_PAGE * SHMB_HEADER_PAGE;
    int k;

    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->fail_lock, NULL);
    r->seed = seed;
    r->slots = slots;
    /* An inaccessible page after the area: a read past it faults. */
    r->size = CATALOG_AT + catalog_bytes;
    r->base = mmap(NULL, r->size + SHMB_HEADER_PAGE, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(r->base != MAP_FAILED);
    assert_int_equal(mprotect(r->base + r->size, SHMB_HEADER_PAGE, PROT_NONE), 0);
    hdr = (struct shmb_segment_header *)(void *)r->base;
    hdr->magic = SHMB_SEGMENT_MAGIC;
    hdr->version = SHMB_LAYOUT_VERSION;
    hdr->header_size = SHMB_HEADER_PAGE;
    hdr->total_size = r->size;
    hdr->data_offset = SHMB_HEADER_PAGE;
    hdr->data_size = DATA_SIZE;
    hdr->catalog_offset = CATALOG_AT;
    hdr->catalog_slots = slots;
    hdr->catalog_seed = (uint32_t)seed;
    r->view.base = r->base;
    r->view.map_size = r->size;
    r->view.data_offset = SHMB_HEADER_PAGE;
    r->view.data_size = DATA_SIZE;
    r->view.catalog_offset = CATALOG_AT;
    r->view.catalog_slots = slots;
    r->view.seed = (uint32_t)seed;
    r->key_of_gen = calloc(MAX_GEN, sizeof(uint16_t));
    assert_non_null(r->key_of_gen);
    memset(r->key_of_gen, 0xff, MAX_GEN * sizeof(uint16_t));
    for (k = 0; k < NKEYS; k++) {
        if (k % 5 == 4) /* a long key: a 192-byte chunk header */
            snprintf(r->keys[k], sizeof(r->keys[k]),
                     "race/long/%d/%0120d", k, k);
        else
            snprintf(r->keys[k], sizeof(r->keys[k]), "%s%d",
                     k < NDYN ? "k" : k < NDYN + NSTABLE ? "stable-" : "never-", k);
        r->key_len[k] = strlen(r->keys[k]);
    }
}

static void race_free(struct race *r)
{
    munmap(r->base, r->size + SHMB_HEADER_PAGE);
    free(r->key_of_gen);
    pthread_mutex_destroy(&r->fail_lock);
}

/* One run over a catalog of slots entries; returns nothing, asserts. */
static void race_run(uint64_t slots, bool crowded)
{
    struct race r;
    struct shmb_error err;
    struct catalog *cat;
    struct daemon_arg da;
    struct reader_arg ra[NREADERS];
    pthread_t dt, rt[NREADERS];
    uint64_t seed = run_seed();
    int i;

    race_init(&r, slots, seed);
    memset(&err, 0, sizeof(err));
    cat = catalog_new(r.base, CATALOG_AT, slots, (uint32_t)seed,
                      (struct shmb_segment_header *)(void *)r.base, &err);
    if (cat == NULL)
        fail_msg("catalog_new: %s", err.message);
    da.r = &r;
    da.cat = cat;
    da.seconds = run_seconds();
    for (i = 0; i < NREADERS; i++) {
        ra[i].r = &r;
        ra[i].seed = seed * 7919 + (uint64_t)i * 104729 + 1;
        assert_int_equal(pthread_create(&rt[i], NULL, reader_main, &ra[i]), 0);
    }
    assert_int_equal(pthread_create(&dt, NULL, daemon_main, &da), 0);
    assert_int_equal(pthread_join(dt, NULL), 0);
    for (i = 0; i < NREADERS; i++)
        assert_int_equal(pthread_join(rt[i], NULL), 0);
    /* Take back what the last live chunks counted. */
    for (i = 0; i < NCHUNK; i++) {
        uint64_t s = __atomic_exchange_n(&chunk_at(&r, i)->seal, 0, __ATOMIC_ACQ_REL);

        r.harvested += SHMB_SEAL_COUNT(s);
    }
    printf("catalog race (seed %llu, SHMB_RACE_SEED to replay; %llu slots): %llu published, "
           "%llu reused, %llu not listed; reads: %llu exact (%llu of stable keys), %llu misses, "
           "%llu asked the daemon, %llu short buffers; counted %llu, stale %llu, harvested "
           "%llu (%llu folds)\n",
           (unsigned long long)seed, (unsigned long long)slots, (unsigned long long)r.published,
           (unsigned long long)r.reuses, (unsigned long long)r.unlisted_adds,
           (unsigned long long)r.hits, (unsigned long long)r.stable_hits,
           (unsigned long long)r.misses, (unsigned long long)r.again,
           (unsigned long long)r.nobufs, (unsigned long long)r.counted,
           (unsigned long long)r.stale, (unsigned long long)r.harvested,
           (unsigned long long)r.folds);
    if (r.failures != 0)
        fail_msg("%llu failure(s), the first: %s (seed %llu)", (unsigned long long)r.failures,
                 r.failure, (unsigned long long)seed);
    /* Every count a reader made landed in a seal of the generation it read
     * and was taken back by the daemon; none landed anywhere else. */
    assert_int_equal(r.harvested, r.counted);
    /* The run did race: reuses happened and reads both hit and missed. */
    assert_true(r.reuses > 500);
    assert_true(r.hits > 100);
    assert_true(r.stable_hits > 0);
    assert_true(r.misses + r.again > 0);
    if (crowded)
        assert_true(r.unlisted_adds > 0);
    else
        assert_int_equal(r.unlisted_adds, 0);
    catalog_free(cat);
    race_free(&r);
}

/* A roomy catalog (64 slots for at most 44 objects): every object listed,
 * entries shifted back on every unlisting; reads are exact or fail, misses
 * of stable keys never claimed. */
static void test_race_roomy(void **state)
{
    (void)state;
    race_run(64, false);
}

/* A crowded one (32 slots for up to 44 objects): some objects are not
 * listed, so misses are not authoritative; reads stay exact. */
static void test_race_crowded(void **state)
{
    (void)state;
    race_run(32, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_race_roomy),
        cmocka_unit_test(test_race_crowded),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
