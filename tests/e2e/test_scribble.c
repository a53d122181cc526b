// SPDX-License-Identifier: Apache-2.0
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
#include <stddef.h>
#include <stdint.h>
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

/* ---- the scribble table -------------------------------------------------------- */

/* One row of tests/scribble/cases (the table's header says what each
 * column means). */
struct table_row {
    int line;
    char name[64], read[16], where[32], change[64], expect[32];
};

/* A place the table names: its offset in the entry, the chunk header or
 * the header page, and its width in bytes. */
struct table_field {
    const char *name;
    size_t at, width;
};

static const struct table_field entry_fields[] = {
    {"seq", 0, 4}, {"hash", 4, 4}, {"chunk", 8, 8}, {"gen", 16, 4}, {"flags", 20, 4},
    {"size", 24, 8}, {NULL, 0, 0},
};
static const struct table_field chunk_fields[] = {
    {"magic", 0, 4},   {"state", 4, 2},       {"key_len", 6, 2},     {"header_size", 8, 4},
    {"tag", 12, 4},    {"id", 16, 8},         {"chunk_size", 24, 8}, {"payload_size", 32, 8},
    {"seal", 40, 8},   {NULL, 0, 0},
};
static const struct table_field header_fields[] = {
    {"moves", offsetof(struct shmb_segment_header, catalog_moves), 4},
    {"unlisted", offsetof(struct shmb_segment_header, catalog_unlisted), 4},
    {"seed", offsetof(struct shmb_segment_header, catalog_seed), 4},
    {"slots", offsetof(struct shmb_segment_header, catalog_slots), 8},
    {"offset", offsetof(struct shmb_segment_header, catalog_offset), 8},
    {"retired", offsetof(struct shmb_segment_header, retired), 4},
    {NULL, 0, 0},
};

static const struct table_field *table_field(const struct table_field *t, const char *name)
{
    for (; t->name != NULL; t++)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

/* The rows of the table at path; returns how many (at most max). */
static int table_load(const char *path, struct table_row *rows, int max)
{
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0, lineno = 0;

    if (f == NULL)
        h_fail("cannot open the scribble table %s: %s (run from the source tree, or set "
               "SHMB_SCRIBBLE_TABLE)", path, strerror(errno));
    while (fgets(line, sizeof(line), f) != NULL) {
        struct table_row *r = &rows[n];
        char extra[2];
        int got;

        lineno++;
        line[strcspn(line, "#\n")] = '\0';
        got = sscanf(line, "%63s %15s %31s %63s %31s %1s", r->name, r->read, r->where, r->change,
                     r->expect, extra);
        if (got <= 0)
            continue;
        if (got != 5)
            h_fail("%s:%d: a row is NAME READ WHERE CHANGE EXPECT", path, lineno);
        if (n == max)
            h_fail("%s: more than %d rows", path, max);
        r->line = lineno;
        n++;
    }
    fclose(f);
    return n;
}

/* value after change ("add:64", "set:next"...), wrapped to width bytes. */
static uint64_t table_change(uint64_t value, const char *change, size_t width, uint64_t next,
                             const struct table_row *r)
{
    const char *arg = strchr(change, ':');
    uint64_t v, mask = width == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * width)) - 1;

    if (arg == NULL)
        h_fail("row %s (line %d): change '%s' is not OP:VALUE", r->name, r->line, change);
    v = strcmp(arg + 1, "next") == 0 ? next : strtoull(arg + 1, NULL, 0);
    if (strncmp(change, "set:", 4) == 0)
        return v & mask;
    if (strncmp(change, "add:", 4) == 0)
        return (value + v) & mask;
    if (strncmp(change, "sub:", 4) == 0)
        return (value - v) & mask;
    if (strncmp(change, "xor:", 4) == 0)
        return (value ^ v) & mask;
    h_fail("row %s (line %d): unknown change '%s'", r->name, r->line, change);
}

/* Apply row r's scribble; *at and saved[] get what to put back (*n bytes). */
static void table_scribble(struct seg *s, const struct table_row *r, const char *victim,
                           const char *absent, unsigned char **at, unsigned char *saved,
                           size_t *n)
{
    struct shmb_catalog_entry *ve = entry_of(s, victim);
    const struct table_field *fd = NULL;
    const char *dot = strchr(r->where, '.');
    char key_next[96];
    uint64_t vchunk, nchunk, value = 0;
    unsigned char *base;

    *n = 0;
    if (strcmp(r->where, "-") == 0)
        return;
    snprintf(key_next, sizeof(key_next), "%s/next", r->name);
    if (ve == NULL || entry_of(s, key_next) == NULL)
        h_fail("row %s: the catalog does not list its objects", r->name);
    vchunk = ve->chunk;
    nchunk = entry_of(s, key_next)->chunk;
    if (strcmp(r->where, "forge") == 0) {
        uint64_t h = key_hash(s->seed, absent);
        struct shmb_catalog_entry *e = entry_at(s, h);

        *at = (unsigned char *)e;
        *n = sizeof(*e);
        memcpy(saved, e, *n);
        entry_forge(e, (uint32_t)(h >> 32), vchunk, ve->gen, ve->size);
        e->flags = 0;
        return;
    }
    if (strncmp(r->where, "chunk@", 6) == 0) {
        static struct table_field one = {"byte", 0, 1};

        one.at = strtoul(r->where + 6, NULL, 0);
        fd = &one;
        base = s->base + vchunk;
    } else if (dot != NULL && strncmp(r->where, "entry.", 6) == 0) {
        fd = table_field(entry_fields, dot + 1);
        base = (unsigned char *)ve;
    } else if (dot != NULL && strncmp(r->where, "header.", 7) == 0) {
        fd = table_field(header_fields, dot + 1);
        base = s->base;
    } else if (strcmp(r->where, "chunk.key") == 0 || strcmp(r->where, "chunk.key_last") == 0) {
        static struct table_field key = {"key", 0, 1};

        key.at = sizeof(struct shmb_chunk_header) +
                 (strcmp(r->where, "chunk.key") == 0 ? 0 : strlen(victim) - 1);
        fd = &key;
        base = s->base + vchunk;
    } else if (dot != NULL && strncmp(r->where, "chunk.", 6) == 0) {
        fd = table_field(chunk_fields, dot + 1);
        base = s->base + vchunk;
    } else {
        base = NULL;
    }
    if (fd == NULL)
        h_fail("row %s (line %d): unknown place '%s'", r->name, r->line, r->where);
    *at = base + fd->at;
    *n = fd->width;
    memcpy(saved, *at, *n);
    memcpy(&value, *at, *n); /* little-endian, as the table's widths */
    value = table_change(value, r->change, fd->width, nchunk, r);
    memcpy(*at, &value, *n);
}

/* The most places one row changes at once. */
#define TABLE_PLACES 4

/* Apply each of row r's scribbles: its places and changes may be several,
 * joined by '+', one change per place (a forgery of two fields that agree,
 * which only one check turns away). at[], saved[], n[] get what to put back;
 * returns how many places. */
static int table_scribble_all(struct seg *s, const struct table_row *r, const char *victim,
                              const char *absent, unsigned char *at[],
                              unsigned char saved[][64], size_t n[])
{
    struct table_row one = *r;
    char where[sizeof(r->where)], change[sizeof(r->change)], *wsave = NULL, *csave = NULL;
    char *w, *c;
    int k = 0;

    memcpy(where, r->where, sizeof(where));
    memcpy(change, r->change, sizeof(change));
    w = strtok_r(where, "+", &wsave);
    c = strtok_r(change, "+", &csave);
    while (w != NULL || c != NULL) {
        if (w == NULL || c == NULL || k == TABLE_PLACES)
            h_fail("row %s (line %d): '%s' and '%s' are not as many places as changes "
                   "(at most %d)", r->name, r->line, r->where, r->change, TABLE_PLACES);
        snprintf(one.where, sizeof(one.where), "%s", w);
        snprintf(one.change, sizeof(one.change), "%s", c);
        table_scribble(s, &one, victim, absent, &at[k], saved[k], &n[k]);
        k++;
        w = strtok_r(NULL, "+", &wsave);
        c = strtok_r(NULL, "+", &csave);
    }
    return k;
}

/* What shmb_read of key on c made of the row: "hit", "daemon",
 * "notfound", "daemon-notfound", or a failure's name; the bytes in buf. */
static const char *table_read(shmb_t *c, const char *key, unsigned char *buf, size_t *size)
{
    shmb_read_stats_t before, after;
    int rc;

    shmb_read_stats(c, &before);
    rc = shmb_read(c, key, buf, MAX_SIZE, size);
    shmb_read_stats(c, &after);
    if (rc == 0)
        return after.fallback > before.fallback ? "daemon" : "hit";
    if (rc == -ENOENT)
        return after.fallback > before.fallback ? "daemon-notfound" : "notfound";
    return shmb_errname(c);
}

/* The table of scribbles both readers are held to (tests/scribble/cases;
 * tests/python/test_scribble_table.py runs it through Client.read and this
 * library): each row's scribble over a real segment, then shmb_read on a
 * read-write and a read-only handle that connected before it must give the
 * row's outcome, exactly the victim's bytes or nothing, never another
 * key's. The daemon serves throughout and every object goes at the end. */
static void test_scribble_table(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "8M", NULL);
    shmb_t *w = h_lib_connect(d, "table-writer", 0), *r = h_lib_connect(d, "table-ro", 1);
    shmb_t *handles[2] = {w, r};
    const char *path = getenv("SHMB_SCRIBBLE_TABLE");
    static struct table_row rows[256];
    unsigned char *buf = malloc(MAX_SIZE), vdata[100], ndata[100];
    unsigned char saved[TABLE_PLACES][64], *at[TABLE_PLACES];
    int nrows, i, m, wrong = 0;
    shmb_stats_t st;
    struct seg s;

    assert_non_null(buf);
    nrows = table_load(path != NULL ? path : "tests/scribble/cases", rows, 256);
    assert_true(nrows > 30);
    memset(&s, 0, sizeof(s));
    seg_map(&s, d);
    for (i = 0; i < nrows; i++) {
        const struct table_row *row = &rows[i];
        char victim[96], next[96], absent[96];
        size_t n[TABLE_PLACES], j;
        int places, k;

        /* The table's payloads, as the Python test makes them. */
        for (j = 0; j < sizeof(vdata); j++) {
            vdata[j] = (unsigned char)(i * 7 + j * 13);
            ndata[j] = (unsigned char)(i * 7 + 101 + j * 13);
        }
        snprintf(victim, sizeof(victim), "%s/victim", row->name);
        snprintf(next, sizeof(next), "%s/next", row->name);
        snprintf(absent, sizeof(absent), "%s/absent", row->name);
        ok(w, shmb_put(w, victim, vdata, sizeof(vdata), 0));
        ok(w, shmb_put(w, next, ndata, sizeof(ndata), 0));
        places = table_scribble_all(&s, row, victim, absent, at, saved, n);
        for (m = 0; m < 2; m++) {
            const char *key = strcmp(row->read, "victim") == 0 ? victim : absent;
            size_t size = 0;
            const char *got = table_read(handles[m], key, buf, &size);
            int exact = strcmp(got, "hit") == 0 || strcmp(got, "daemon") == 0;

            if (exact && (size != sizeof(vdata) || memcmp(buf, vdata, size) != 0)) {
                printf("row %s (line %d): %s shmb_read returned %zu bytes that are not %s's\n",
                       row->name, row->line, m ? "ro" : "rw", size, victim);
                wrong++;
            } else if (strcmp(got, row->expect) != 0) {
                printf("row %s (line %d): %s shmb_read gave %s, the table says %s\n",
                       row->name, row->line, m ? "ro" : "rw", got, row->expect);
                wrong++;
            }
        }
        for (k = places - 1; k >= 0; k--)
            if (n[k] > 0)
                memcpy(at[k], saved[k], n[k]);
        ok(w, shmb_delete(w, victim));
        ok(w, shmb_delete(w, next));
    }
    if (wrong > 0)
        h_fail("%d reads of the scribble table went otherwise than it says", wrong);
    ok(w, shmb_stats(w, &st));
    assert_int_equal(st.objects, 0);
    h_assert_alive(d);
    seg_unmap(&s);
    free(buf);
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
        TEST(test_scribble_table),
        TEST(test_scribble_storm),
    };

    return cmocka_run_group_tests_name("test_scribble", tests, NULL, NULL);
}
