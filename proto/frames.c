// SPDX-License-Identifier: Apache-2.0
/*
 * The frames layout's arithmetic, writer and checking reader. Integers are
 * little-endian whatever the host (a payload may be written to disk or read
 * by another language), so they go byte by byte.
 */
#include "frames.h"

#include <errno.h>
#include <string.h>

#include "layout.h"

/* Every payload starts at a multiple of SHMB_ALIGN in the segment, so frames
 * at multiples of FRAMES_ALIGN in the payload are aligned in memory too. */
_Static_assert(SHMB_ALIGN % FRAMES_ALIGN == 0, "payloads must start frame-aligned");
_Static_assert(FRAMES_MAX <= (FRAMES_SIZE_LIMIT - FRAMES_FIXED) / 8,
               "the largest header must be representable");

static uint64_t get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    int i;

    for (i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    int i;

    for (i = 0; i < bytes; i++, v >>= 8)
        p[i] = (unsigned char)(v & 0xff);
}

uint64_t frames_header_size(size_t n)
{
    return ((uint64_t)FRAMES_FIXED + 8 * (uint64_t)n + FRAMES_ALIGN - 1) &
           ~(uint64_t)(FRAMES_ALIGN - 1);
}

int frames_step(uint64_t *end, uint64_t length, uint64_t *offset)
{
    uint64_t start;

    if (*end > FRAMES_SIZE_LIMIT - (FRAMES_ALIGN - 1))
        return -E2BIG;
    start = (*end + FRAMES_ALIGN - 1) & ~(uint64_t)(FRAMES_ALIGN - 1);
    if (length > FRAMES_SIZE_LIMIT - start)
        return -E2BIG;
    *offset = start;
    *end = start + length;
    return 0;
}

uint64_t frames_size(size_t n, const size_t *lengths)
{
    uint64_t end, offset;
    size_t i;

    if (n > FRAMES_MAX)
        return 0;
    end = frames_header_size(n);
    for (i = 0; i < n; i++)
        if (frames_step(&end, lengths[i], &offset) < 0)
            return 0;
    return end;
}

void frames_put_header(void *dst, size_t n)
{
    unsigned char *p = dst;

    memset(p, 0, (size_t)frames_header_size(n));
    put_le(p, FRAMES_MAGIC, 8);
    put_le(p + 8, n, 4);
    /* flags (p + 12) stay 0: none is defined. */
}

void frames_put_length(void *dst, size_t i, uint64_t length)
{
    put_le((unsigned char *)dst + FRAMES_FIXED + 8 * i, length, 8);
}

int frames_next(struct frames_walk *w, uint64_t *offset, uint64_t *length,
                struct shmb_error *err)
{
    uint64_t len, start, end = w->end;

    if (w->index >= w->count)
        return 0;
    len = get_le64(w->payload + FRAMES_FIXED + 8 * w->index);
    if (frames_step(&end, len, &start) < 0 || end > w->size)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: frame %zu of %zu (%llu bytes from "
                              "offset %llu) runs past the payload's end at %llu bytes.",
                              w->index, w->count, (unsigned long long)len,
                              (unsigned long long)((w->end + FRAMES_ALIGN - 1) &
                                                   ~(uint64_t)(FRAMES_ALIGN - 1)),
                              (unsigned long long)w->size);
    w->index++;
    w->end = end;
    *offset = start;
    *length = len;
    return 1;
}

int frames_open(struct frames_walk *w, const void *payload, size_t size,
                struct shmb_error *err)
{
    const unsigned char *p = payload;
    uint64_t magic, header, offset, length;
    uint32_t count, flags;
    int rc;

    memset(w, 0, sizeof(*w));
    if (size < FRAMES_FIXED)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: %zu bytes, fewer than the %u of its "
                              "header.",
                              size, FRAMES_FIXED);
    magic = get_le64(p);
    count = get_le32(p + 8);
    flags = get_le32(p + 12);
    if (magic != FRAMES_MAGIC)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: its first 8 bytes read 0x%016llx, not "
                              "the magic 0x%016llx (\"MHSBFRM1\"); it was not written as "
                              "frames (shmb_put_frames, or put with a list of buffers).",
                              (unsigned long long)magic, (unsigned long long)FRAMES_MAGIC);
    if (flags != 0)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: flags 0x%x, where this reader knows "
                              "only 0 (was it written by a newer version?).",
                              flags);
    if (count > FRAMES_MAX)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: %u frames, more than the %u a payload "
                              "may hold.",
                              count, FRAMES_MAX);
    header = frames_header_size(count);
    if (header > size)
        return shmb_error_set(err, -EPROTO,
                              "Not a frames payload: %u frames need a header of %llu "
                              "bytes, and the payload has %zu.",
                              count, (unsigned long long)header, size);
    w->payload = p;
    w->size = size;
    w->count = count;
    w->end = header;
    while ((rc = frames_next(w, &offset, &length, err)) > 0)
        ;
    if (rc == 0 && w->end != size)
        rc = shmb_error_set(err, -EPROTO,
                            "Not a frames payload: its %u lengths make %llu bytes, and the "
                            "payload has %zu.",
                            count, (unsigned long long)w->end, size);
    if (rc < 0) {
        memset(w, 0, sizeof(*w)); /* a refused payload has nothing to walk */
        return rc;
    }
    w->index = 0;
    w->end = header;
    return 0;
}
