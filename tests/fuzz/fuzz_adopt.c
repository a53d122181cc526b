// SPDX-License-Identifier: Apache-2.0
/*
 * The adoption fuzzer: what a restart does with a segment that a read-write
 * client damaged at random. Each input drives a store over a real segment
 * file (allocations, commits, aborts, gets, releases, deletes), then writes
 * bytes anywhere in the segment (header page, chunk headers, keys), then
 * "SIGKILLs" the daemon (the store's memory goes, nothing in the segment is
 * cleaned up, the lock is released) and restarts the way shmbrokerd does
 * (segment_probe_existing, segment_check_adoptable, segment_adopt,
 * store_adopt). It checks that the restart never refuses and never crashes,
 * that no two chunks of the ring, adopted or allocated afterwards, overlap,
 * that every extent lies in the data area, and that used + free is the data
 * size; then it drives the adopted store further, checking the same after
 * every step, and restarts once more without damage: everything committed
 * must come back, nothing dropped. Built with ASan and UBSan under
 * libFuzzer; 'make fuzz-adopt FUZZ_ADOPT_SECONDS=N' runs it for as long as
 * asked.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ring.h"
#include "segment.h"
#include "store.h"

/* Small, so that a few operations fill the ring and wrap it. */
#define FUZZ_SIZE (64u * 1024u)
/* The data area: the header page and a page of catalog (64 slots) less. */
#define FUZZ_DATA (FUZZ_SIZE - 2 * SHMB_HEADER_PAGE)
#define FUZZ_KEYS 16
#define FUZZ_MAX_OPS 64
#define FUZZ_MAX_POKES 32

static char fuzz_dir[] = "/dev/shm";
static char fuzz_name[NAME_MAX + 1]; /* $FUZZ_ADOPT_NAME, else one with our pid */
static char fuzz_path[PATH_MAX];

/* Stop with a message: libFuzzer saves the input that did it. The segment
 * goes first, so that a failure leaves nothing in /dev/shm. */
#define fuzz_fail(...)                                                        \
    do {                                                                      \
        fprintf(stderr, "fuzz_adopt: " __VA_ARGS__);                          \
        fputc('\n', stderr);                                                  \
        unlink(fuzz_path);                                                    \
        abort();                                                              \
    } while (0)

/* The input, consumed from the front; zeros once it runs out. */
struct input {
    const uint8_t *p;
    size_t n;
};

static uint8_t take8(struct input *in)
{
    uint8_t b = 0;

    if (in->n > 0) {
        b = in->p[0];
        in->p++;
        in->n--;
    }
    return b;
}

static uint64_t take(struct input *in, int bytes)
{
    uint64_t v = 0;
    int i;

    for (i = 0; i < bytes; i++)
        v |= (uint64_t)take8(in) << (8 * i);
    return v;
}

/* Key i of the fuzzer's small key space: "k0" .. "k15". */
static size_t fuzz_key(char *key, unsigned i)
{
    return (size_t)snprintf(key, 8, "k%u", i % FUZZ_KEYS);
}

/* One operation on the store from four bytes of input. Errors are normal
 * outcomes here (ENOSPC, EEXIST, ENOENT ...); only the invariants matter. */
static void fuzz_op(struct store *s, struct store_holder *h, struct input *in)
{
    struct shmb_error err = {0};
    struct store_extent e;
    uint8_t op = take8(in), k = take8(in);
    uint64_t size = take(in, 2) % (FUZZ_DATA / 3) + 1;
    char key[8];
    size_t len = fuzz_key(key, k);

    switch (op % 8) {
    case 0:
    case 1:
        if (store_alloc(s, h, key, len, size, (uint32_t)(k >> 6), &e, &err) == 0 &&
            op % 2 == 0)
            store_commit(s, h, key, len, &err);
        break;
    case 2:
        store_commit(s, h, key, len, &err);
        break;
    case 3:
        store_abort(s, h, key, len, &err);
        break;
    case 4:
    case 5:
        store_delete(s, key, len, &err);
        break;
    case 6:
        store_get(s, h, key, len, &e, &err);
        break;
    case 7:
        store_release(s, h, key, len, &err);
        break;
    }
}

/* What fuzz_check_list collects: the extents of the live objects. */
struct extents {
    size_t n;
    uint64_t off[1024], end[1024];
};

static int fuzz_collect(const struct store_entry *entry, void *arg)
{
    struct extents *x = arg;

    if (entry->offset < SHMB_HEADER_PAGE || entry->size == 0 ||
        entry->size > FUZZ_DATA ||
        entry->offset + entry->size > SHMB_HEADER_PAGE + (uint64_t)FUZZ_DATA)
        fuzz_fail("object of %llu bytes at %llu lies outside the data area",
                  (unsigned long long)entry->size, (unsigned long long)entry->offset);
    if (x->n < 1024) {
        x->off[x->n] = entry->offset;
        x->end[x->n] = entry->offset + entry->size;
        x->n++;
    }
    return 0;
}

/* The invariants: chunks in the data area, pairwise disjoint, objects too,
 * and used + free == data size (by the ring and by the store). */
static void fuzz_check(struct store *s)
{
    const struct ring *r = store_ring(s);
    struct store_stats st;
    struct extents x;
    struct ring_chunk c;
    uint64_t phys[1024], end[1024], sum = 0;
    size_t i, j, n = ring_count(r);

    if (ring_used(r) + ring_free_bytes(r) != FUZZ_DATA || ring_used(r) > FUZZ_DATA)
        fuzz_fail("ring: used %llu + free %llu != %u", (unsigned long long)ring_used(r),
                  (unsigned long long)ring_free_bytes(r), FUZZ_DATA);
    store_counts(s, &st);
    if (st.used + st.free != FUZZ_DATA || st.data_size != FUZZ_DATA)
        fuzz_fail("store: used %llu + free %llu != %u", (unsigned long long)st.used,
                  (unsigned long long)st.free, FUZZ_DATA);
    if (n > 1024)
        fuzz_fail("%zu chunks in a ring of %u bytes", n, FUZZ_DATA);
    for (i = 0; i < n; i++) {
        ring_at(r, i, &c);
        if (c.phys % SHMB_ALIGN != 0 || c.chunk_size == 0 || c.chunk_size > FUZZ_DATA ||
            c.phys + c.chunk_size > FUZZ_DATA)
            fuzz_fail("chunk %zu at %llu of %llu bytes lies outside the data area", i,
                      (unsigned long long)c.phys, (unsigned long long)c.chunk_size);
        phys[i] = c.phys;
        end[i] = c.phys + c.chunk_size;
        sum += c.chunk_size;
        for (j = 0; j < i; j++)
            if (phys[i] < end[j] && phys[j] < end[i])
                fuzz_fail("chunks %zu [%llu, %llu) and %zu [%llu, %llu) overlap", j,
                          (unsigned long long)phys[j], (unsigned long long)end[j], i,
                          (unsigned long long)phys[i], (unsigned long long)end[i]);
    }
    if (sum > ring_used(r))
        fuzz_fail("chunks hold %llu bytes, the ring says %llu are used",
                  (unsigned long long)sum, (unsigned long long)ring_used(r));
    x.n = 0;
    store_list(s, NULL, 0, SIZE_MAX, fuzz_collect, &x);
    for (i = 0; i < x.n; i++)
        for (j = 0; j < i; j++)
            if (x.off[i] < x.end[j] && x.off[j] < x.end[i])
                fuzz_fail("objects at %llu and %llu overlap", (unsigned long long)x.off[j],
                          (unsigned long long)x.off[i]);
}

/* The restart after a SIGKILL, as shmbrokerd's start-up does it: it must
 * never refuse. The caller owns *seg and the returned store. */
static struct store *fuzz_restart(struct segment *seg, struct store_adopt_report *report)
{
    struct store_config cfg = {0};
    struct shmb_error err = {0};
    struct store *s;
    int64_t pid = 0;

    switch (segment_probe_existing(fuzz_dir, fuzz_name, &pid)) {
    case SEGMENT_ABSENT:
        fuzz_fail("the segment is gone");
    case SEGMENT_LIVE:
        fuzz_fail("a segment nobody holds is taken for live (header pid %lld)",
                  (long long)pid);
    case SEGMENT_FOREIGN:
    case SEGMENT_ORPHANED:
        break;
    }
    if (segment_check_adoptable(fuzz_dir, fuzz_name, FUZZ_SIZE, &err) < 0)
        fuzz_fail("the restart refuses: %s", err.message);
    if (segment_adopt(seg, fuzz_dir, fuzz_name, FUZZ_SIZE, 0, &err) < 0)
        fuzz_fail("segment_adopt refuses: %s", err.message);
    if (seg->data_offset != SHMB_HEADER_PAGE || seg->data_size != FUZZ_DATA)
        fuzz_fail("the data area is %llu bytes at %llu",
                  (unsigned long long)seg->data_size, (unsigned long long)seg->data_offset);
    s = store_adopt(segment_data(seg), seg->data_offset, seg->data_size, seg->hdr, &cfg,
                    report, &err);
    if (s == NULL)
        fuzz_fail("store_adopt refuses: %s", err.message);
    return s;
}

/* The daemon dies: its memory goes, the segment stays as it is. */
static void fuzz_crash(struct segment *seg, struct store *s)
{
    store_free(s);
    segment_close(seg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *name = getenv("FUZZ_ADOPT_NAME");

    (void)argc;
    (void)argv;
    if (name != NULL && name[0] != '\0')
        snprintf(fuzz_name, sizeof(fuzz_name), "%s", name);
    else
        snprintf(fuzz_name, sizeof(fuzz_name), "shmb-fuzz-adopt-%d", (int)getpid());
    snprintf(fuzz_path, sizeof(fuzz_path), "%s/%s", fuzz_dir, fuzz_name);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    struct store_config cfg = {0};
    struct shmb_error err = {0};
    struct store_adopt_report report;
    struct store_stats st;
    struct segment seg;
    struct store_holder *h;
    struct store *s;
    unsigned i, ops, pokes;

    unlink(fuzz_path);
    if (segment_create(&seg, fuzz_dir, fuzz_name, FUZZ_SIZE, 0, &err) < 0)
        fuzz_fail("segment_create: %s", err.message);
    s = store_new(segment_data(&seg), seg.data_offset, seg.data_size, seg.hdr, &cfg, &err);
    if (s == NULL)
        fuzz_fail("store_new: %s", err.message);
    h = store_holder_new(s);
    ops = take8(&in) % FUZZ_MAX_OPS;
    for (i = 0; i < ops; i++)
        fuzz_op(s, h, &in);

    /* A read-write client writes 1, 2, 4 or 8 bytes anywhere, then the
     * daemon dies. Most writes aim at what adoption reads: the header page
     * and the chunk headers (with their keys) of the ring. */
    pokes = take8(&in) % FUZZ_MAX_POKES;
    for (i = 0; i < pokes; i++) {
        uint8_t kind = take8(&in);
        int width = 1 << (kind % 4);
        uint64_t at = take(&in, 2), value;
        size_t count = ring_count(store_ring(s));
        struct ring_chunk c;

        switch ((kind >> 2) % 4) {
        case 0: /* anywhere */
            at %= FUZZ_SIZE;
            break;
        case 1: /* the header page's fields */
            at %= sizeof(struct shmb_segment_header);
            break;
        default: /* a chunk header or its key */
            if (count == 0) {
                at %= FUZZ_SIZE;
                break;
            }
            ring_at(store_ring(s), (size_t)(at >> 8) % count, &c);
            at = SHMB_HEADER_PAGE + c.phys + (at & 0xff) % 64;
            break;
        }
        at &= ~(uint64_t)(width - 1);
        value = take(&in, width);
        memcpy((char *)seg.base + at, &value, (size_t)width);
    }
    fuzz_crash(&seg, s);

    s = fuzz_restart(&seg, &report);
    fuzz_check(s);
    h = store_holder_new(s);
    while (in.n > 0) {
        fuzz_op(s, h, &in);
        fuzz_check(s);
    }

    /* A second crash without damage loses nothing committed. */
    store_counts(s, &st);
    fuzz_crash(&seg, s);
    s = fuzz_restart(&seg, &report);
    fuzz_check(s);
    if (report.corrupt || report.restored != st.objects || report.dropped_invalid != 0)
        fuzz_fail("an undamaged restart restored %llu of %llu objects (%llu invalid): %s",
                  (unsigned long long)report.restored, (unsigned long long)st.objects,
                  (unsigned long long)report.dropped_invalid,
                  report.corrupt ? report.message : "not corrupt");
    store_free(s);
    segment_destroy(&seg);
    return 0;
}
