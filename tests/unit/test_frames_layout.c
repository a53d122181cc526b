// SPDX-License-Identifier: Apache-2.0
/*
 * The frames layout (proto/frames.c): its arithmetic, the bytes the writer
 * puts down, and every payload the reader must refuse, hostile ones
 * included (counts and lengths chosen to overflow or to run past the end).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/frames.h"

/* A 64-aligned buffer of size bytes (at least 64), zeroed. */
static unsigned char *buf_new(size_t size)
{
    size_t rounded = (size + 63) / 64 * 64;
    unsigned char *p = aligned_alloc(64, rounded > 0 ? rounded : 64);

    assert_non_null(p);
    memset(p, 0, rounded > 0 ? rounded : 64);
    return p;
}

/* Lay out n frames of these lengths in a new buffer the way a writer does:
 * header, lengths, then byte (i + 1) in every byte of frame i. The payload
 * size in *size; the caller frees. */
static unsigned char *build(size_t n, const size_t *lengths, size_t *size)
{
    uint64_t end, offset;
    unsigned char *p;
    size_t i;

    *size = (size_t)frames_size(n, lengths);
    assert_true(*size >= 64);
    p = buf_new(*size);
    memset(p, 0xee, *size); /* frames_put_header must clear its padding */
    frames_put_header(p, n);
    end = frames_header_size(n);
    for (i = 0; i < n; i++) {
        assert_int_equal(frames_step(&end, lengths[i], &offset), 0);
        frames_put_length(p, i, lengths[i]);
        memset(p + offset, (int)((i + 1) & 0xff), lengths[i]);
    }
    assert_int_equal(end, *size);
    return p;
}

static void put_le64(unsigned char *p, uint64_t v)
{
    int i;

    for (i = 0; i < 8; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    int i;

    for (i = 0; i < 4; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

/* frames_open must refuse payload[0..size) with -EPROTO and a message that
 * contains want; the walk then yields nothing. */
static void refused(const void *payload, size_t size, const char *want)
{
    struct shmb_error err;
    struct frames_walk w;
    uint64_t offset, length;

    shmb_error_clear(&err);
    assert_int_equal(frames_open(&w, payload, size, &err), -EPROTO);
    assert_int_equal(err.code, -EPROTO);
    if (strstr(err.message, want) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.message, want);
    assert_non_null(strstr(err.message, "Not a frames payload"));
    assert_int_equal(frames_next(&w, &offset, &length, &err), 0);
}

/* Proves the arithmetic of PROTOCOL.md's figures: the header is
 * align64(16 + 8n), frame 0 starts right after it, each next frame at the
 * next multiple of 64, and nothing follows the last frame. */
static void test_layout_figures(void **state)
{
    const size_t two[] = {10, 100}, empties[] = {0, 0}, one_then_empty[] = {1, 0};
    const size_t exact[] = {64, 64}, three[] = {1, 63, 65};

    (void)state;
    assert_int_equal(frames_header_size(0), 64);
    assert_int_equal(frames_header_size(1), 64);
    assert_int_equal(frames_header_size(6), 64);
    assert_int_equal(frames_header_size(7), 128);
    assert_int_equal(frames_header_size(65535), 524352);
    assert_int_equal(frames_size(0, NULL), 64);
    assert_int_equal(frames_size(2, two), 228);
    assert_int_equal(frames_size(2, empties), 64);
    assert_int_equal(frames_size(2, one_then_empty), 128);
    assert_int_equal(frames_size(2, exact), 192);
    /* 64 + 1 -> 128 + 63 = 191 -> 192 + 65 = 257 */
    assert_int_equal(frames_size(3, three), 257);
}

/* Proves that the writer's bytes are exactly the documented ones: the
 * magic as "MHSBFRM1", count and lengths little-endian, flags 0, zero
 * padding to 64, whatever the buffer held before. */
static void test_header_bytes(void **state)
{
    const size_t two[] = {10, 100};
    static const unsigned char want[32] = {
        'M', 'H', 'S', 'B', 'F', 'R', 'M', '1', 2, 0, 0, 0, 0, 0, 0, 0,
        10,  0,   0,   0,   0,   0,   0,   0,   100, 0, 0, 0, 0, 0, 0, 0,
    };
    size_t size, i;
    unsigned char *p = build(2, two, &size);

    (void)state;
    assert_int_equal(size, 228);
    assert_memory_equal(p, want, sizeof(want));
    for (i = 32; i < 64; i++)
        assert_int_equal(p[i], 0);
    assert_int_equal(p[64], 1);
    assert_int_equal(p[73], 1);
    assert_int_equal(p[128], 2);
    assert_int_equal(p[227], 2);
    free(p);
}

/* Walk a payload build() made and check each frame's place and bytes. */
static void walk_check(const unsigned char *p, size_t size, size_t n, const size_t *lengths)
{
    struct shmb_error err;
    struct frames_walk w;
    uint64_t offset, length, prev_end;
    size_t i, j;

    shmb_error_clear(&err);
    assert_int_equal(frames_open(&w, p, size, &err), 0);
    assert_int_equal(w.count, n);
    prev_end = frames_header_size(n);
    for (i = 0; i < n; i++) {
        assert_int_equal(frames_next(&w, &offset, &length, &err), 1);
        assert_int_equal(offset % 64, 0);
        assert_true(offset >= prev_end && offset - prev_end < 64);
        assert_int_equal(length, lengths[i]);
        for (j = 0; j < length; j++)
            if (p[offset + j] != (unsigned char)((i + 1) & 0xff))
                fail_msg("frame %zu byte %zu is %u", i, j, p[offset + j]);
        prev_end = offset + length;
    }
    assert_int_equal(prev_end, size);
    assert_int_equal(frames_next(&w, &offset, &length, &err), 0);
}

/* Proves that what the writer lays down the reader accepts and walks back,
 * for 0, 1, 3 and the largest count of frames, empty frames included, each
 * frame 64-aligned and holding its own bytes. */
static void test_round_trip(void **state)
{
    const size_t one[] = {1000}, three[] = {0, 7, 129};
    size_t *many, size, i;
    unsigned char *p;

    (void)state;
    p = build(0, NULL, &size);
    assert_int_equal(size, 64);
    walk_check(p, size, 0, NULL);
    free(p);
    p = build(1, one, &size);
    assert_int_equal(size, 1064);
    walk_check(p, size, 1, one);
    free(p);
    p = build(3, three, &size);
    walk_check(p, size, 3, three);
    free(p);
    many = calloc(FRAMES_MAX, sizeof(*many));
    assert_non_null(many);
    for (i = 0; i < FRAMES_MAX; i++)
        many[i] = i % 3 + 1; /* 1 to 3 bytes: every frame in its own 64 */
    p = build(FRAMES_MAX, many, &size);
    assert_int_equal(size, 524352 + (FRAMES_MAX - 1) * 64 + 3);
    walk_check(p, size, FRAMES_MAX, many);
    free(p);
    free(many);
}

/* Proves that sizes past 2^63 bytes (the protocol's limit) and counts past
 * 65535 give 0, never a wrapped-around small size, and that the largest
 * size the limit allows is still computed. */
static void test_size_overflow(void **state)
{
    const size_t huge[] = {(size_t)INT64_MAX}, halves[] = {(size_t)1 << 62, (size_t)1 << 62};
    const size_t max_one[] = {(size_t)INT64_MAX - 64}, over_one[] = {(size_t)INT64_MAX - 63};
    const size_t wrap[] = {SIZE_MAX, 65}, rounds_over[] = {(size_t)INT64_MAX - 74, 0};
    const size_t rounds_to_limit[] = {(size_t)INT64_MAX - 127, 0};
    size_t *many;
    uint64_t end = (uint64_t)INT64_MAX - 62, offset = 7;

    (void)state;
    assert_int_equal(frames_size(FRAMES_MAX + 1, NULL), 0);
    assert_int_equal(frames_size(1, huge), 0);
    assert_int_equal(frames_size(2, halves), 0);
    assert_int_equal(frames_size(1, max_one), (uint64_t)INT64_MAX);
    assert_int_equal(frames_size(1, over_one), 0);
    assert_int_equal(frames_size(2, wrap), 0);
    /* The second frame's start is rounded up past the limit. */
    assert_int_equal(frames_size(2, rounds_over), 0);
    assert_int_equal(frames_size(2, rounds_to_limit), (uint64_t)INT64_MAX - 63);
    /* A step that would round past the limit changes nothing. */
    assert_int_equal(frames_step(&end, 0, &offset), -E2BIG);
    assert_int_equal(end, (uint64_t)INT64_MAX - 62);
    assert_int_equal(offset, 7);
    /* 65535 frames of 2^63 bytes each: refused, not wrapped. */
    many = malloc(FRAMES_MAX * sizeof(*many));
    assert_non_null(many);
    for (size_t i = 0; i < FRAMES_MAX; i++)
        many[i] = (size_t)1 << 63;
    assert_int_equal(frames_size(FRAMES_MAX, many), 0);
    free(many);
}

/* Proves each of the reader's refusals, with the numbers in its message:
 * too short, wrong magic, flags, too many frames, a header longer than the
 * payload, a size one byte off either way. */
static void test_refusals(void **state)
{
    const size_t two[] = {10, 100};
    unsigned char *p, *q;
    size_t size;

    (void)state;
    p = build(2, two, &size);
    refused(p, 15, "15 bytes, fewer than the 16");
    refused(p, 0, "0 bytes");
    /* A payload written with plain put: text. */
    refused("hello, shared memory", 20, "not the magic 0x314d52464253484d");
    q = buf_new(size);
    memcpy(q, p, size);
    q[7] = '2';
    refused(q, size, "0x324d52464253484d");
    memcpy(q, p, size);
    q[12] = 1;
    refused(q, size, "flags 0x1");
    memcpy(q, p, size);
    q[15] = 0x80;
    refused(q, size, "flags 0x80000000");
    /* Exact size: one byte more, one byte less, the padding of the header
     * alone. */
    memcpy(q, p, size);
    refused(q, 227, "frame 1 of 2 (100 bytes from offset 128) runs past");
    free(q);
    q = buf_new(size + 1);
    memcpy(q, p, size);
    refused(q, size + 1, "make 228 bytes, and the payload has 229");
    refused(p, 64, "frame 0 of 2 (10 bytes from offset 64) runs past the payload's end at 64");
    refused(p, 40, "2 frames need a header of 64 bytes, and the payload has 40");
    free(q);
    free(p);
}

/* Proves that a hostile header cannot make the reader read or point
 * outside the payload: a count above 65535, a count whose header is larger
 * than the object, 65535 frames of 2^63 bytes, lengths that wrap around
 * 2^64, and a frame running past the end by one byte. */
static void test_hostile(void **state)
{
    size_t size = 524352, i;
    unsigned char *p = buf_new(size + 64);

    (void)state;
    frames_put_header(p, 0);
    put_le32(p + 8, 65536);
    refused(p, 64, "65536 frames, more than the 65535");
    put_le32(p + 8, 0xffffffffu);
    refused(p, 64, "4294967295 frames");
    put_le32(p + 8, 65535);
    refused(p, 64, "65535 frames need a header of 524352 bytes, and the payload has 64");
    /* The largest header, every length 2^63: the first one runs past. */
    for (i = 0; i < 65535; i++)
        put_le64(p + 16 + 8 * i, (uint64_t)1 << 63);
    refused(p, size, "frame 0 of 65535 (9223372036854775808 bytes from offset 524352)");
    /* Lengths that add up to 2^64 + a little: wrapping would look small. */
    frames_put_header(p, 2);
    put_le64(p + 16, UINT64_MAX - 63);
    put_le64(p + 24, 200);
    refused(p, 256, "frame 0 of 2 (18446744073709551552 bytes");
    put_le64(p + 16, 64);
    put_le64(p + 24, UINT64_MAX);
    refused(p, 256, "frame 1 of 2 (18446744073709551615 bytes from offset 128)");
    /* One byte past the end. */
    put_le64(p + 16, 10);
    put_le64(p + 24, 101);
    refused(p, 228, "frame 1 of 2 (101 bytes from offset 128) runs past the payload's end at 228");
    put_le64(p + 24, 100);
    {
        struct shmb_error err;
        struct frames_walk w;

        assert_int_equal(frames_open(&w, p, 228, &err), 0);
    }
    free(p);
}

/* Proves that the walk checks every frame again: a payload changed after
 * frames_open accepted it (a hostile writer of the segment) gives -EPROTO,
 * never a frame outside the payload. */
static void test_changed_after_open(void **state)
{
    const size_t two[] = {10, 100};
    struct shmb_error err;
    struct frames_walk w;
    uint64_t offset, length;
    size_t size;
    unsigned char *p = build(2, two, &size);

    (void)state;
    shmb_error_clear(&err);
    assert_int_equal(frames_open(&w, p, size, &err), 0);
    assert_int_equal(frames_next(&w, &offset, &length, &err), 1);
    put_le64(p + 24, (uint64_t)1 << 40);
    assert_int_equal(frames_next(&w, &offset, &length, &err), -EPROTO);
    assert_non_null(strstr(err.message, "frame 1 of 2 (1099511627776 bytes"));
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_figures), cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_round_trip),     cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_refusals),       cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_changed_after_open),
    };

    return cmocka_run_group_tests_name("frames_layout", tests, NULL, NULL);
}
