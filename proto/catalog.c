// SPDX-License-Identifier: Apache-2.0
/*
 * The reader's side of the catalog (proto/catalog.h): the key hash, the
 * validated copy-out read and the count of an awaited read. Every byte of
 * the mapping may be anything, so every offset read from it is checked
 * against the view's bounds before it is used, and every loop is bounded.
 * Knows nothing of sockets or handles; the daemon's side is daemon/catalog.c.
 */
#include "catalog.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

/* How often a read looks again at an entry the daemon is writing (odd seq,
 * or a seq that changed under the read) before it leaves the answer to the
 * daemon: an entry write is a few stores, so a second look almost always
 * finds it done; a daemon descheduled in the middle costs a round trip. */
#define CATALOG_ENTRY_TRIES 8
/* The same for the table's moves word (a deletion shifting entries back). */
#define CATALOG_MOVES_TRIES 8
/* Whole reads redone after the chunk changed under the copy, before -EAGAIN. */
#define CATALOG_READ_TRIES 3
/* Compare-and-swaps of a seal that other readers keep changing: each failure
 * means another count got in, so this many is contention no process has. */
#define CATALOG_COUNT_TRIES 1000

/* The payload copy: memcpy, except under ThreadSanitizer, where the copy
 * races with the daemon's reuse of the chunk on purpose (the seal checked
 * after it tells whether the copy is exact): relaxed atomic loads then, so
 * that the intended race is not reported. */
#if defined(__SANITIZE_THREAD__)
#define CATALOG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CATALOG_TSAN 1
#endif
#endif

/* Loads of fields between a sequence word's two reads, and the fence
 * after them. ThreadSanitizer does not model fences (gcc warns that it
 * does not support them), so under it those loads are acquire loads
 * instead, which order the same way. */
#ifdef CATALOG_TSAN
#define CATALOG_RELAXED memory_order_acquire
#define CATALOG_FENCE() ((void)0)
#else
#define CATALOG_RELAXED memory_order_relaxed
#define CATALOG_FENCE() atomic_thread_fence(memory_order_acquire)
#endif

static inline uint64_t catalog_load64(const unsigned char *p, memory_order mo)
{
    return atomic_load_explicit((const _Atomic uint64_t *)(const void *)p, mo);
}

static inline uint32_t catalog_load32(const unsigned char *p, memory_order mo)
{
    return atomic_load_explicit((const _Atomic uint32_t *)(const void *)p, mo);
}

static inline uint16_t catalog_load16(const unsigned char *p)
{
    return atomic_load_explicit((const _Atomic uint16_t *)(const void *)p, CATALOG_RELAXED);
}

/* Copy n bytes of the mapping (src 8-byte aligned) into dst. */
static void catalog_copy(void *dst, const unsigned char *src, size_t n)
{
#ifdef CATALOG_TSAN
    unsigned char *d = dst;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        uint64_t w = catalog_load64(src + i, CATALOG_RELAXED);

        memcpy(d + i, &w, 8);
    }
    for (; i < n; i++)
        d[i] = atomic_load_explicit((const _Atomic unsigned char *)(src + i), CATALOG_RELAXED);
#else
    memcpy(dst, src, n);
#endif
}

uint64_t shmb_catalog_hash(uint32_t seed, const char *key, size_t key_len)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325) ^ seed;
    size_t i;

    for (i = 0; i < key_len; i++) {
        h ^= (unsigned char)key[i];
        h *= UINT64_C(0x100000001b3);
    }
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    return h;
}

/* Whether the view's bounds hang together: a power-of-two table inside the
 * mapping after an aligned data area, and a header page to read. Figures
 * from the hello reply, so this is a check against a confused daemon or a
 * library bug, not against the mapping's bytes. */
static bool catalog_view_ok(const struct shmb_catalog_view *v)
{
    uint64_t slots = v->catalog_slots;

    return v->base != NULL && slots != 0 && (slots & (slots - 1)) == 0 &&
           slots <= UINT64_MAX / sizeof(struct shmb_catalog_entry) &&
           v->map_size >= SHMB_HEADER_PAGE && v->data_offset >= SHMB_HEADER_PAGE &&
           v->data_offset % SHMB_ALIGN == 0 && v->catalog_offset % SHMB_ALIGN == 0 &&
           v->data_size <= v->catalog_offset &&
           v->data_offset <= v->catalog_offset - v->data_size &&
           v->catalog_offset <= v->map_size &&
           slots * sizeof(struct shmb_catalog_entry) <= v->map_size - v->catalog_offset;
}

/* One entry as read under its seq. */
struct catalog_entry_copy {
    uint32_t hash, gen, flags;
    uint64_t chunk, size;
};

/* Read entry e consistently: 0, or -EAGAIN when the daemon kept writing it. */
static int catalog_entry_read(const unsigned char *e, struct catalog_entry_copy *out)
{
    int tries;

    for (tries = 0; tries < CATALOG_ENTRY_TRIES; tries++) {
        uint32_t s1 = catalog_load32(e + offsetof(struct shmb_catalog_entry, seq),
                                     memory_order_acquire);

        if (s1 & 1u)
            continue;
        out->hash = catalog_load32(e + offsetof(struct shmb_catalog_entry, hash),
                                   CATALOG_RELAXED);
        out->chunk = catalog_load64(e + offsetof(struct shmb_catalog_entry, chunk),
                                    CATALOG_RELAXED);
        out->gen = catalog_load32(e + offsetof(struct shmb_catalog_entry, gen),
                                  CATALOG_RELAXED);
        out->flags = catalog_load32(e + offsetof(struct shmb_catalog_entry, flags),
                                    CATALOG_RELAXED);
        out->size = catalog_load64(e + offsetof(struct shmb_catalog_entry, size),
                                   CATALOG_RELAXED);
        CATALOG_FENCE();
        if (catalog_load32(e + offsetof(struct shmb_catalog_entry, seq),
                           CATALOG_RELAXED) == s1)
            return 0;
    }
    return -EAGAIN;
}

/* Whether the chunk at ch (bounds checked) holds key, committed, sealed
 * with generation gen, payload size bytes. */
static bool catalog_chunk_holds(const unsigned char *ch, const char *key, size_t key_len,
                                uint32_t gen, uint64_t size)
{
    unsigned char kbuf[SHMB_KEY_MAX];
    uint64_t seal = catalog_load64(ch + offsetof(struct shmb_chunk_header, seal),
                                   memory_order_acquire);

    if (SHMB_SEAL_GEN(seal) != gen ||
        catalog_load32(ch + offsetof(struct shmb_chunk_header, magic), CATALOG_RELAXED) !=
            SHMB_CHUNK_MAGIC ||
        catalog_load16(ch + offsetof(struct shmb_chunk_header, state)) != SHMB_CHUNK_COMMITTED ||
        catalog_load16(ch + offsetof(struct shmb_chunk_header, key_len)) != key_len ||
        catalog_load64(ch + offsetof(struct shmb_chunk_header, payload_size),
                       CATALOG_RELAXED) != size)
        return false;
    catalog_copy(kbuf, ch + sizeof(struct shmb_chunk_header), key_len);
    return memcmp(kbuf, key, key_len) == 0;
}

/* After the copy: the chunk still has gen, COMMITTED and key, so what was
 * copied is what was committed under key. */
static bool catalog_chunk_unchanged(const unsigned char *ch, const char *key, size_t key_len,
                                    uint32_t gen)
{
    unsigned char kbuf[SHMB_KEY_MAX];

    CATALOG_FENCE();
    if (SHMB_SEAL_GEN(catalog_load64(ch + offsetof(struct shmb_chunk_header, seal),
                                     memory_order_acquire)) != gen ||
        catalog_load16(ch + offsetof(struct shmb_chunk_header, state)) != SHMB_CHUNK_COMMITTED)
        return false;
    catalog_copy(kbuf, ch + sizeof(struct shmb_chunk_header), key_len);
    return memcmp(kbuf, key, key_len) == 0;
}

/* What one pass of a read found. */
enum catalog_pass {
    CATALOG_HIT,     /* copied (or too big: hit->size) */
    CATALOG_MISS,    /* the probe ended at an empty entry, past no entry of key's tag
                        that failed its checks */
    CATALOG_CHANGED, /* the chunk changed under the copy: redo */
    CATALOG_UNSURE,  /* cannot say: -EAGAIN */
};

/* One probe from key's home: the entry of key, its checks and the copy. */
static enum catalog_pass catalog_pass(const struct shmb_catalog_view *v, const char *key,
                                      size_t key_len, uint64_t h, void *buf, size_t cap,
                                      struct shmb_catalog_hit *hit, int *rc)
{
    const unsigned char *table = v->base + v->catalog_offset;
    uint64_t mask = v->catalog_slots - 1, end = v->data_offset + v->data_size;
    uint32_t tag = (uint32_t)(h >> 32);
    bool suspect = false;
    unsigned p;

    for (p = 0; p < SHMB_CATALOG_PROBES && p <= mask; p++) {
        const unsigned char *e =
            table + ((h + p) & mask) * sizeof(struct shmb_catalog_entry);
        struct catalog_entry_copy ec;
        const unsigned char *ch;
        uint64_t hsize = SHMB_CHUNK_HEADER_SIZE(key_len);

        if (catalog_entry_read(e, &ec) < 0)
            return CATALOG_UNSURE;
        if (ec.chunk == 0)
            return suspect ? CATALOG_UNSURE : CATALOG_MISS;
        if (ec.hash != tag)
            continue;
        /* From here on, an entry that fails a check makes a miss unsure:
         * it may be key's own, changed under the read or scribbled over,
         * and only the daemon knows. */
        suspect = true;
        /* Bounds, from the view only: the chunk, its header and payload lie
         * inside the data area (each step checked against overflow). */
        if (ec.chunk < v->data_offset || ec.chunk % SHMB_ALIGN != 0 || ec.size == 0 ||
            ec.chunk > end || hsize > end - ec.chunk || ec.size > end - ec.chunk - hsize ||
            ec.gen == 0)
            continue;
        ch = v->base + ec.chunk;
        if (!catalog_chunk_holds(ch, key, key_len, ec.gen, ec.size))
            continue;
        hit->chunk = ec.chunk;
        hit->size = ec.size;
        hit->gen = ec.gen;
        hit->flags = ec.flags;
        if (ec.size > cap) {
            *rc = -ENOBUFS;
            return CATALOG_HIT;
        }
        catalog_copy(buf, ch + hsize, (size_t)ec.size);
        if (!catalog_chunk_unchanged(ch, key, key_len, ec.gen))
            return CATALOG_CHANGED;
        *rc = 0;
        return CATALOG_HIT;
    }
    /* The probe ran its length without an empty entry: an entry is never
     * further from its home, but a table this full is not worth trusting. */
    return CATALOG_UNSURE;
}

/* Whether the header page still describes the table this view was given
 * (the hello's seed, place and size): a daemon that restarted on the
 * segment may have laid out another, and then a miss in ours proves
 * nothing. A client's scribble here only sends reads to the daemon. */
static bool catalog_same_table(const struct shmb_catalog_view *v, const unsigned char *hdr)
{
    return catalog_load32(hdr + offsetof(struct shmb_segment_header, catalog_seed),
                          CATALOG_RELAXED) == v->seed &&
           catalog_load64(hdr + offsetof(struct shmb_segment_header, catalog_slots),
                          CATALOG_RELAXED) == v->catalog_slots &&
           catalog_load64(hdr + offsetof(struct shmb_segment_header, catalog_offset),
                          CATALOG_RELAXED) == v->catalog_offset;
}

/* The read, counting in *retries the copies redone after the chunk changed
 * under them. */
static int catalog_read(const struct shmb_catalog_view *v, const char *key, size_t key_len,
                        void *buf, size_t cap, struct shmb_catalog_hit *hit, unsigned *retries)
{
    const unsigned char *hdr;
    int copies = 0, moves = 0;
    uint64_t h;

    if (hit != NULL)
        memset(hit, 0, sizeof(*hit));
    if (v == NULL || !catalog_view_ok(v) || key_len > SHMB_KEY_MAX || hit == NULL ||
        (buf == NULL && cap != 0))
        return -EAGAIN;
    hdr = v->base;
    h = shmb_catalog_hash(v->seed, key, key_len);
    while (copies <= CATALOG_READ_TRIES && moves <= CATALOG_MOVES_TRIES) {
        uint32_t m1 = catalog_load32(hdr + offsetof(struct shmb_segment_header, catalog_moves),
                                     memory_order_acquire);
        int rc = -EAGAIN;

        if (m1 & 1u) {
            moves++;
            continue;
        }
        switch (catalog_pass(v, key, key_len, h, buf, cap, hit, &rc)) {
        case CATALOG_HIT:
            return rc;
        case CATALOG_UNSURE:
            memset(hit, 0, sizeof(*hit));
            return -EAGAIN;
        case CATALOG_CHANGED:
            memset(hit, 0, sizeof(*hit));
            copies++;
            (*retries)++;
            continue;
        case CATALOG_MISS:
            break;
        }
        /* A miss proves something only if no entry moved during the probe
         * (a deletion shifts entries back, past a reader) and the catalog
         * lists every committed object. */
        CATALOG_FENCE();
        if (catalog_load32(hdr + offsetof(struct shmb_segment_header, catalog_moves),
                           CATALOG_RELAXED) != m1) {
            moves++;
            continue;
        }
        if (catalog_load32(hdr + offsetof(struct shmb_segment_header, catalog_unlisted),
                           memory_order_acquire) != 0 ||
            !catalog_same_table(v, hdr))
            return -EAGAIN;
        return -ENOENT;
    }
    return -EAGAIN;
}

int shmb_catalog_read_counted(const struct shmb_catalog_view *v, const char *key,
                              size_t key_len, void *buf, size_t cap,
                              struct shmb_catalog_hit *hit, unsigned *retries)
{
    unsigned ignored = 0;

    return catalog_read(v, key, key_len, buf, cap, hit, retries != NULL ? retries : &ignored);
}

int shmb_catalog_read(const struct shmb_catalog_view *v, const char *key, size_t key_len,
                      void *buf, size_t cap, struct shmb_catalog_hit *hit)
{
    return shmb_catalog_read_counted(v, key, key_len, buf, cap, hit, NULL);
}

int shmb_catalog_count_read(const struct shmb_catalog_view *v,
                            const struct shmb_catalog_hit *hit)
{
    _Atomic uint64_t *seal;
    uint64_t old;
    int tries;

    if (v == NULL || hit == NULL || v->base == NULL || hit->gen == 0 ||
        hit->chunk < v->data_offset || hit->chunk % SHMB_ALIGN != 0 ||
        hit->chunk > v->map_size || sizeof(struct shmb_chunk_header) > v->map_size - hit->chunk)
        return -EINVAL;
    /* The mapping is writable for the read-write handles that call this. */
    seal = (_Atomic uint64_t *)(void *)((unsigned char *)(uintptr_t)v->base + hit->chunk +
                                        offsetof(struct shmb_chunk_header, seal));
    old = atomic_load_explicit(seal, memory_order_relaxed);
    for (tries = 0; tries < CATALOG_COUNT_TRIES; tries++) {
        if (SHMB_SEAL_GEN(old) != hit->gen)
            return -ESTALE;
        if (SHMB_SEAL_COUNT(old) == UINT32_MAX) /* the daemon will fold it in */
            return 0;
        if (atomic_compare_exchange_weak_explicit(
                seal, &old, SHMB_SEAL(hit->gen, SHMB_SEAL_COUNT(old) + 1),
                memory_order_acq_rel, memory_order_relaxed))
            return 0;
    }
    return -EAGAIN;
}
