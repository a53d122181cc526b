/*
 * A hostile read-write client against the catalog: it maps the segment
 * through the descriptor hello hands every client and writes what it likes
 * over the catalog, the header page's catalog words and counters, and the
 * chunk headers and seals of listed objects, or forges entries that point
 * one key at another key's chunk. Honest clients go on putting and reading:
 * the daemon keeps serving, their puts succeed, and no read ever returns
 * bytes of another key (a read may fail or ask the daemon instead).
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

#define HONEST_KEYS 16
#define MAX_SIZE (64u * 1024u)

/* A segment mapped read-write by a client, described by its hello reply. */
struct seg {
    struct h_conn raw;
    unsigned char *base;
    uint64_t size, data_offset, data_size, catalog_offset, slots;
    uint32_t seed;
};

static void seg_map(struct seg *s, const struct h_daemon *d)
{
    json_t *hello = h_open_hello(&s->raw, d);

    if (s->raw.nfds < 1)
        h_fail("hello passed no descriptor");
    s->size = (uint64_t)h_int(hello, "size");
    s->data_offset = (uint64_t)h_int(hello, "data_offset");
    s->data_size = (uint64_t)h_int(hello, "data_size");
    s->catalog_offset = (uint64_t)h_int(hello, "catalog_offset");
    s->slots = (uint64_t)h_int(hello, "catalog_slots");
    s->seed = (uint32_t)h_int(hello, "catalog_seed");
    json_decref(hello);
    if (s->slots == 0 || s->catalog_offset + s->slots * sizeof(struct shmb_catalog_entry) > s->size)
        h_fail("the segment has no usable catalog (%llu slots at %llu of %llu bytes)",
               (unsigned long long)s->slots, (unsigned long long)s->catalog_offset,
               (unsigned long long)s->size);
    s->base = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, s->raw.fds[0], 0);
    if (s->base == MAP_FAILED)
        h_fail("mmap of the segment: %s", strerror(errno));
}

static void seg_unmap(struct seg *s)
{
    munmap(s->base, s->size);
    h_conn_close(&s->raw);
}

/* The catalog hash as the contract spells it (computed here again, so that
 * a daemon that hashed otherwise would show: its entries would not be found). */
static uint64_t key_hash(uint32_t seed, const char *key)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;

    for (; *key != '\0'; key++)
        h = (h ^ (unsigned char)*key) * 0x100000001b3ull;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 32);
}

static struct shmb_catalog_entry *entry_at(const struct seg *s, uint64_t slot)
{
    return (struct shmb_catalog_entry *)(void *)(s->base + s->catalog_offset +
                                                 (slot & (s->slots - 1)) *
                                                     sizeof(struct shmb_catalog_entry));
}

/* The entry listing key (its chunk header holds that key), or NULL. */
static struct shmb_catalog_entry *entry_of(const struct seg *s, const char *key)
{
    uint64_t h = key_hash(s->seed, key);
    size_t len = strlen(key);
    uint32_t p;

    for (p = 0; p < SHMB_CATALOG_PROBES; p++) {
        struct shmb_catalog_entry *e = entry_at(s, h + p);
        const struct shmb_chunk_header *ch;

        if (e->chunk == 0)
            return NULL;
        if (e->hash != (uint32_t)(h >> 32) || e->chunk < s->data_offset ||
            e->chunk + SHMB_CHUNK_HEADER_SIZE(len) > s->data_offset + s->data_size)
            continue;
        ch = (const void *)(s->base + e->chunk);
        if (ch->key_len == len && memcmp(ch + 1, key, len) == 0)
            return e;
    }
    return NULL;
}

/* Rewrite entry e as the daemon would (seq odd, fields, seq even). */
static void entry_forge(struct shmb_catalog_entry *e, uint32_t hash, uint64_t chunk,
                        uint32_t gen, uint64_t size)
{
    uint32_t seq = __atomic_load_n(&e->seq, __ATOMIC_RELAXED) | 1;

    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
    e->hash = hash;
    e->chunk = chunk;
    e->gen = gen;
    e->flags = SHMB_CATALOG_AWAITED;
    e->size = size;
    __atomic_store_n(&e->seq, seq + 1, __ATOMIC_RELEASE);
}

static void put_payload(shmb_t *c, const char *key, uint32_t k, uint64_t version, size_t size)
{
    unsigned char *buf = malloc(size);

    assert_non_null(buf);
    payload_fill(buf, k, version, size);
    ok(c, shmb_put(c, key, buf, size, 0));
    free(buf);
}

/* shmb_read of key must give the payload of key number k (any version) or
 * fail; it must never give another key's bytes. Returns the call's result. */
static int read_checked(shmb_t *c, const char *key, uint32_t k)
{
    unsigned char *buf = malloc(MAX_SIZE);
    size_t size = 0;
    uint64_t version;
    char what[256];
    int rc;

    assert_non_null(buf);
    rc = shmb_read(c, key, buf, MAX_SIZE, &size);
    if (rc == 0 && !payload_verify(buf, size, k, &version, what, sizeof(what)))
        h_fail("shmb_read '%s' returned %s", key, what);
    free(buf);
    return rc;
}

/* A forged entry sends key "fa" to the chunk of "fb" (with fb's generation
 * and size, under an even seq: a perfect forgery of the table), another
 * sends a key nobody put there, a third points past the end of the mapping;
 * then the header page says the catalog is always moving and lists
 * everything. Reads, read-write and read-only, return fa's own bytes or
 * ENOENT, never fb's, and nothing crashes; the daemon keeps serving. */
static void test_forged_entries(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "8M", NULL);
    shmb_t *w = h_lib_connect(d, "writer", 0), *r = h_lib_connect(d, "reader", 1);
    shmb_t *handles[2] = {w, r};
    struct shmb_catalog_entry *ea, *eb, *ec;
    struct shmb_segment_header *hdr;
    shmb_read_stats_t before, after;
    uint64_t chunk_b, size_b, hc;
    uint32_t gen_b;
    struct seg s;
    int i;

    put_payload(w, "fa", 1, 1, 3000);
    put_payload(w, "fb", 2, 1, 5000);
    memset(&s, 0, sizeof(s));
    seg_map(&s, d);
    /* Both listed as the contract says: found by its hash, fb's entry
     * carries the generation of fb's seal. */
    ea = entry_of(&s, "fa");
    eb = entry_of(&s, "fb");
    if (ea == NULL || eb == NULL)
        h_fail("the catalog does not list fa and fb where their hash says");
    chunk_b = eb->chunk;
    gen_b = eb->gen;
    size_b = eb->size;
    assert_int_equal(size_b, 5000);
    assert_int_equal(SHMB_SEAL_GEN(((const struct shmb_chunk_header *)(const void *)(s.base +
                                                                               chunk_b))->seal),
                     gen_b);
    for (i = 0; i < 2; i++)
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);

    /* fa -> fb's chunk. */
    shmb_read_stats(w, &before);
    entry_forge(ea, ea->hash, chunk_b, gen_b, size_b);
    for (i = 0; i < 2; i++) {
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);
        assert_int_equal(read_checked(handles[i], "fb", 2), 0);
    }
    shmb_read_stats(w, &after);
    /* The forged entry was not served from the mapping: the daemon was asked. */
    assert_true(after.fallback > before.fallback);

    /* A key nobody put, listed at its home with fb's chunk. */
    hc = key_hash(s.seed, "fc");
    ec = entry_at(&s, hc);
    entry_forge(ec, (uint32_t)(hc >> 32), chunk_b, gen_b, size_b);
    for (i = 0; i < 2; i++)
        fails(handles[i], read_checked(handles[i], "fc", 3), -ENOENT, "fc");

    /* Entries past the end of the data area, of the mapping, and at the
     * catalog itself, with absurd sizes. */
    entry_forge(ea, ea->hash, s.size + 65536, gen_b, 1u << 30);
    for (i = 0; i < 2; i++)
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);
    entry_forge(ea, ea->hash, s.data_offset + s.data_size - 64, gen_b, UINT64_MAX - 100);
    for (i = 0; i < 2; i++)
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);
    entry_forge(ea, ea->hash, s.catalog_offset, gen_b, 64);
    for (i = 0; i < 2; i++)
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);

    /* The header page lies: the catalog is always moving, lists nothing
     * beyond it, has no slots, lives elsewhere. Readers trust hello. */
    hdr = (struct shmb_segment_header *)(void *)s.base;
    hdr->catalog_moves = 1;
    hdr->catalog_unlisted = 0xffffffffu;
    hdr->catalog_slots = 0;
    hdr->catalog_offset = 12345;
    hdr->data_size = 1;
    for (i = 0; i < 2; i++) {
        assert_int_equal(read_checked(handles[i], "fa", 1), 0);
        assert_int_equal(read_checked(handles[i], "fb", 2), 0);
        fails(handles[i], read_checked(handles[i], "fc", 3), -ENOENT, NULL);
    }

    /* The daemon serves, puts work, and its own books are not the header's. */
    put_payload(w, "fd", 4, 1, 100);
    assert_int_equal(read_checked(r, "fd", 4), 0);
    h_assert_alive(d);
    seg_unmap(&s);
    shmb_close(r);
    shmb_close(w);
    h_pass(f);
}

/* ---- the storm ------------------------------------------------------------------ */

/* What the processes of the storm share. */
struct storm {
    char socket[108];
    uint64_t seed;
    int stop;
    uint64_t puts, reads, gets, misses, fallbacks_seen, scribbles, forgeries;
    int failed;
    char failure[512];
};

static struct storm *S;

static void storm_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void storm_fail(const char *fmt, ...)
{
    va_list ap;

    if (__atomic_exchange_n(&S->failed, 1, __ATOMIC_ACQ_REL) == 0) {
        va_start(ap, fmt);
        vsnprintf(S->failure, sizeof(S->failure), fmt, ap);
        va_end(ap);
    }
    va_start(ap, fmt);
    fprintf(stderr, "scribble (pid %d): ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    _exit(1);
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static shmb_t *storm_connect(const char *name, int read_only)
{
    shmb_t *c = shmb_new();

    if (c == NULL)
        storm_fail("out of memory");
    shmb_set_read_only(c, read_only);
    shmb_set_populate(c, 0);
    if (shmb_connect(c, S->socket, name) != 0)
        storm_fail("connect: %s", shmb_errmsg(c));
    return c;
}

/* The honest writer: delete and put again its keys, every put must work. */
static int honest_writer(void *arg)
{
    shmb_t *c = storm_connect("honest-writer", 0);
    unsigned char *buf = malloc(MAX_SIZE);
    uint64_t x = S->seed | 1, version = 0;
    char key[32];

    (void)arg;
    if (buf == NULL)
        storm_fail("out of memory");
    shmb_set_alloc_wait(c, 5000);
    while (!__atomic_load_n(&S->stop, __ATOMIC_ACQUIRE)) {
        uint32_t k = (uint32_t)(xorshift(&x) % HONEST_KEYS);
        size_t size = PAYLOAD_HEAD + xorshift(&x) % (xorshift(&x) % 8 ? 2000 : MAX_SIZE - 64);
        int rc;

        snprintf(key, sizeof(key), "h/%u", k);
        rc = shmb_delete(c, key);
        if (rc != 0 && rc != -ENOENT)
            storm_fail("honest delete '%s': %s: %s", key, shmb_errname(c), shmb_errmsg(c));
        payload_fill(buf, k, ++version, size);
        if (xorshift(&x) % 4 == 0) {
            void *p;

            rc = shmb_alloc(c, key, size, 0, &p);
            if (rc == 0) {
                memcpy(p, buf, size);
                rc = shmb_commit(c, key);
            }
        } else {
            rc = shmb_put(c, key, buf, size, xorshift(&x) % 4 == 0 ? 1 : 0);
        }
        if (rc != 0)
            storm_fail("honest put '%s' of %zu bytes: %s: %s", key, size, shmb_errname(c),
                       shmb_errmsg(c));
        __atomic_add_fetch(&S->puts, 1, __ATOMIC_RELAXED);
    }
    shmb_close(c);
    free(buf);
    return 0;
}

/* An honest reader: every read that works is exactly a payload of its key. */
static int honest_reader(void *arg)
{
    int read_only = (int)(intptr_t)arg;
    shmb_t *c = storm_connect(read_only ? "honest-ro" : "honest-rw", read_only);
    unsigned char *buf = malloc(MAX_SIZE);
    uint64_t x = S->seed * 3 + (uint64_t)read_only + 7, version;
    char key[32], what[256];
    shmb_read_stats_t rs;

    if (buf == NULL)
        storm_fail("out of memory");
    while (!__atomic_load_n(&S->stop, __ATOMIC_ACQUIRE)) {
        uint32_t k = (uint32_t)(xorshift(&x) % HONEST_KEYS);
        size_t size = 0;
        int rc;

        snprintf(key, sizeof(key), "h/%u", k);
        if (xorshift(&x) % 4 == 0) {
            const void *p;

            rc = shmb_get(c, key, &p, &size);
            if (rc == 0) {
                if (!payload_verify(p, size, k, &version, what, sizeof(what)))
                    storm_fail("honest get '%s' returned %s", key, what);
                if (shmb_release(c, key) != 0)
                    storm_fail("release '%s': %s", key, shmb_errmsg(c));
                __atomic_add_fetch(&S->gets, 1, __ATOMIC_RELAXED);
                continue;
            }
        } else {
            rc = shmb_read(c, key, buf, MAX_SIZE, &size);
            if (rc == 0) {
                if (!payload_verify(buf, size, k, &version, what, sizeof(what)))
                    storm_fail("honest shmb_read '%s' returned %s", key, what);
                __atomic_add_fetch(&S->reads, 1, __ATOMIC_RELAXED);
                continue;
            }
        }
        if (rc != -ENOENT)
            storm_fail("honest read '%s': %s: %s", key, shmb_errname(c), shmb_errmsg(c));
        __atomic_add_fetch(&S->misses, 1, __ATOMIC_RELAXED);
    }
    shmb_read_stats(c, &rs);
    __atomic_add_fetch(&S->fallbacks_seen, rs.fallback, __ATOMIC_RELAXED);
    shmb_close(c);
    free(buf);
    return 0;
}

/* The chunk an entry names, when it is a chunk of an honest key (so that
 * scribbling over its header never touches a payload: honest keys are
 * short, their headers 64 bytes); else 0. */
static uint64_t honest_chunk(const struct seg *s, const struct shmb_catalog_entry *e)
{
    uint64_t chunk = e->chunk;
    const struct shmb_chunk_header *ch;

    if (chunk < s->data_offset || chunk % 64 != 0 || chunk + 64 > s->data_offset + s->data_size)
        return 0;
    ch = (const void *)(s->base + chunk);
    if (ch->magic != SHMB_CHUNK_MAGIC || ch->key_len < 3 || ch->key_len > 4 ||
        memcmp(ch + 1, "h/", 2) != 0)
        return 0;
    return chunk;
}

static void scribble(void *p, size_t n, uint64_t *x)
{
    unsigned char *b = p;
    size_t i;

    for (i = 0; i < n; i++)
        b[i] = (unsigned char)xorshift(x);
}

/* The hostile client: a loop of damage. */
static int hostile(void *arg)
{
    const struct h_daemon *d = arg;
    uint64_t x = S->seed * 5 + 11;
    struct seg s;

    memset(&s, 0, sizeof(s));
    /* Its own hello: a read-write mapping, as any client gets. */
    if (h_conn_open(&s.raw, d->socket) != 0)
        storm_fail("hostile: cannot connect");
    {
        json_t *hello;
        char *line = NULL;

        if (h_conn_sendline(&s.raw, "{\"op\":\"hello\",\"version\":1,\"name\":\"hostile\"}") != 0 ||
            h_conn_recv_line(&s.raw, &line, H_REPLY_TIMEOUT_MS) != 0)
            storm_fail("hostile: no hello reply");
        hello = json_loads(line, 0, NULL);
        free(line);
        if (hello == NULL || s.raw.nfds < 1)
            storm_fail("hostile: bad hello reply");
        s.size = (uint64_t)json_integer_value(json_object_get(hello, "size"));
        s.data_offset = (uint64_t)json_integer_value(json_object_get(hello, "data_offset"));
        s.data_size = (uint64_t)json_integer_value(json_object_get(hello, "data_size"));
        s.catalog_offset = (uint64_t)json_integer_value(json_object_get(hello, "catalog_offset"));
        s.slots = (uint64_t)json_integer_value(json_object_get(hello, "catalog_slots"));
        s.seed = (uint32_t)json_integer_value(json_object_get(hello, "catalog_seed"));
        json_decref(hello);
        if (s.slots == 0)
            storm_fail("hostile: no catalog in the hello reply");
        s.base = mmap(NULL, s.size, PROT_READ | PROT_WRITE, MAP_SHARED, s.raw.fds[0], 0);
        if (s.base == MAP_FAILED)
            storm_fail("hostile: mmap: %s", strerror(errno));
    }
    while (!__atomic_load_n(&S->stop, __ATOMIC_ACQUIRE)) {
        struct shmb_catalog_entry *e = entry_at(&s, xorshift(&x));
        uint64_t what = xorshift(&x) % 10, chunk;

        switch (what) {
        case 0: /* an entry, any bytes */
            scribble(e, sizeof(*e), &x);
            break;
        case 1: /* the header page's catalog and heartbeat words */
            scribble(s.base + 88 + xorshift(&x) % 48, 8, &x);
            break;
        case 2: /* the published counters */
            scribble(s.base + SHMB_COUNTERS_AT + xorshift(&x) % 136, 8, &x);
            break;
        case 3: /* an entry's generation or size only: a plausible entry */
            if (xorshift(&x) % 2)
                e->gen += 1;
            else
                e->size += 64;
            break;
        case 4: /* a listed honest chunk's seal */
        case 5:
            if ((chunk = honest_chunk(&s, e)) != 0) {
                uint64_t *seal = (uint64_t *)(void *)(s.base + chunk + 40);

                *seal = xorshift(&x) % 2 ? xorshift(&x) : SHMB_SEAL((uint32_t)*seal, 0xfffffff0u);
            }
            break;
        case 6: /* a listed honest chunk's header */
            if ((chunk = honest_chunk(&s, e)) != 0)
                scribble(s.base + chunk + xorshift(&x) % 56, 8, &x);
            break;
        default: { /* forge: one honest key's entry sent to another's chunk */
            char a[32], b[32];
            struct shmb_catalog_entry *ea, *eb;

            snprintf(a, sizeof(a), "h/%u", (unsigned)(xorshift(&x) % HONEST_KEYS));
            snprintf(b, sizeof(b), "h/%u", (unsigned)(xorshift(&x) % HONEST_KEYS));
            ea = entry_of(&s, a);
            eb = entry_of(&s, b);
            if (ea != NULL && eb != NULL && ea != eb) {
                entry_forge(ea, ea->hash, eb->chunk, eb->gen, eb->size);
                __atomic_add_fetch(&S->forgeries, 1, __ATOMIC_RELAXED);
            } else if (eb != NULL) {
                uint64_t h = key_hash(s.seed, a);

                entry_forge(entry_at(&s, h), (uint32_t)(h >> 32), eb->chunk, eb->gen, eb->size);
                __atomic_add_fetch(&S->forgeries, 1, __ATOMIC_RELAXED);
            }
            break;
        }
        }
        __atomic_add_fetch(&S->scribbles, 1, __ATOMIC_RELAXED);
        if (xorshift(&x) % 64 == 0)
            usleep(200);
    }
    munmap(s.base, s.size);
    h_conn_close(&s.raw);
    return 0;
}

/* Honest clients (a writer, a read-write and a read-only reader) work while
 * a hostile one scribbles over the catalog, the header page and listed
 * chunks' headers and seals, and forges entries: the daemon answers
 * throughout, every honest put succeeds, no honest read returns another
 * key's bytes (or torn ones), nobody crashes; after a SIGKILL the daemon
 * adopts the scribbled segment and serves what it kept, exactly. */
static void test_scribble_storm(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "32M", NULL), *d2;
    const char *s_env = getenv("SHMB_SCRIBBLE_SECONDS");
    double seconds = s_env != NULL && atof(s_env) > 0 ? atof(s_env) : 6.0;
    pid_t pids[4];
    uint64_t end;
    shmb_t *c;
    shmb_stats_t st;
    int i, k;

    S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(S != MAP_FAILED);
    memset(S, 0, sizeof(*S));
    snprintf(S->socket, sizeof(S->socket), "%s", d->socket);
    S->seed = getenv("SHMB_MODEL_SEED") ? strtoull(getenv("SHMB_MODEL_SEED"), NULL, 0)
                                        : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    printf("scribble storm: seed %llu (SHMB_MODEL_SEED to replay), %.0f s\n",
           (unsigned long long)S->seed, seconds);
    fflush(stdout);
    pids[0] = h_fork(f, honest_writer, NULL);
    pids[1] = h_fork(f, honest_reader, (void *)(intptr_t)0);
    pids[2] = h_fork(f, honest_reader, (void *)(intptr_t)1);
    pids[3] = h_fork(f, hostile, d);
    for (i = 0; i < 4; i++)
        assert_true(pids[i] > 0);
    c = h_lib_connect(d, "watcher", 0);
    end = h_now_ms() + (uint64_t)(seconds * 1000);
    while (h_now_ms() < end && !S->failed) {
        h_sleep_ms(100);
        ok(c, shmb_stats(c, &st)); /* the daemon answers all along */
    }
    __atomic_store_n(&S->stop, 1, __ATOMIC_RELEASE);
    for (i = 0; i < 4; i++) {
        int code = h_child_wait(f, pids[i], H_RUN_TIMEOUT_MS);

        if (S->failed)
            h_fail("%s (seed %llu)", S->failure, (unsigned long long)S->seed);
        if (code != 0)
            h_fail("storm process %d ended with %d (seed %llu)", i, code,
                   (unsigned long long)S->seed);
    }
    printf("scribble storm (seed %llu): %llu scribbles, %llu forged entries; honest: %llu "
           "puts, %llu exact reads, %llu gets, %llu misses, %llu reads asked the daemon\n",
           (unsigned long long)S->seed, (unsigned long long)S->scribbles,
           (unsigned long long)S->forgeries, (unsigned long long)S->puts,
           (unsigned long long)S->reads, (unsigned long long)S->gets,
           (unsigned long long)S->misses, (unsigned long long)S->fallbacks_seen);
    assert_true(S->puts > 50 && S->reads > 50 && S->gets > 10);
    assert_true(S->forgeries > 10 && S->scribbles > 1000);
    ok(c, shmb_stats(c, &st));
    shmb_close(c);
    h_assert_alive(d);

    /* A SIGKILL, then adoption of what the hostile client left: the daemon
     * comes up, and every honest object it kept reads back exactly. */
    kill(d->pid, SIGKILL);
    if (h_daemon_wait_exit(d, H_STOP_TIMEOUT_MS) < 0 || !WIFSIGNALED(d->status))
        h_fail("the daemon did not die of the SIGKILL (status %d)", d->status);
    d2 = h_daemon_again(f, d);
    if (h_daemon_spawn(f, d2, NULL) <= 0 || h_daemon_wait_ready(d2, H_READY_TIMEOUT_MS) < 0) {
        h_daemon_print_log(d2);
        h_fail("the daemon did not start again on the scribbled segment");
    }
    c = h_lib_connect(d2, "after", 0);
    for (k = 0; k < HONEST_KEYS; k++) {
        char key[32];
        int rc;

        snprintf(key, sizeof(key), "h/%d", k);
        rc = read_checked(c, key, (uint32_t)k);
        if (rc != 0 && rc != -ENOENT)
            h_fail("read '%s' after the restart: %s", key, shmb_errmsg(c));
    }
    put_payload(c, "after", 99, 1, 4000);
    assert_int_equal(read_checked(c, "after", 99), 0);
    shmb_close(c);
    munmap(S, sizeof(*S));
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_forged_entries),
        TEST(test_scribble_storm),
    };

    return cmocka_run_group_tests_name("test_scribble", tests, NULL, NULL);
}
