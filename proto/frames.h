// SPDX-License-Identifier: Apache-2.0
/*
 * The frames layout: one payload that holds n buffers ("frames"), each
 * 64-aligned, behind a small header with the count and each length
 * (PROTOCOL.md, "Objects of several buffers (frames)"). Arithmetic, writing
 * and a checking reader over plain bytes; knows nothing about sockets, the
 * daemon or the library's handle, so that either side can use it.
 */
#ifndef SHMB_PROTO_FRAMES_H
#define SHMB_PROTO_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* "MHSBFRM1" as little-endian bytes. */
#define FRAMES_MAGIC 0x314d52464253484dULL
/* The count is a u32 on disk, but a reader must be able to trust it: 65535
 * frames make a header of 512 KiB at most, far more than any serializer
 * produces (pickle's out-of-band buffers, msgpack's tensors). */
#define FRAMES_MAX 65535u
/* Frames start at multiples of this, so that numpy or torch views of them
 * are aligned for any element type (and for AVX-512 loads). */
#define FRAMES_ALIGN 64u
/* magic, count, flags: the bytes before the lengths. */
#define FRAMES_FIXED 16u
/* A payload reaches 2^63 bytes only by overflow: the protocol's sizes are
 * signed 64-bit integers, so no object is that large. */
#define FRAMES_SIZE_LIMIT ((uint64_t)INT64_MAX)

/* The header's size for n frames (n <= FRAMES_MAX): align64(16 + 8n). */
uint64_t frames_header_size(size_t n);

/* One step of the layout: the frame after one that ends at *end starts at
 * align64(*end), returned in *offset, and *end moves to its end. -E2BIG
 * (nothing changed) when that end would pass FRAMES_SIZE_LIMIT. */
int frames_step(uint64_t *end, uint64_t length, uint64_t *offset);

/* The payload size of n frames of these lengths, or 0 when n > FRAMES_MAX
 * or the size would pass FRAMES_SIZE_LIMIT. */
uint64_t frames_size(size_t n, const size_t *lengths);

/* Write the header of n frames (n <= FRAMES_MAX) at dst, which holds at
 * least frames_header_size(n) bytes: magic, count, flags 0 and zero
 * padding; the lengths are left for frames_put_length. */
void frames_put_header(void *dst, size_t n);

/* Write frame i's length into a header frames_put_header wrote. */
void frames_put_length(void *dst, size_t i, uint64_t length);

/* A walk over the frames of a checked payload. */
struct frames_walk {
    const unsigned char *payload;
    uint64_t size;  /* the payload's bytes */
    size_t count;   /* frames in it */
    size_t index;   /* the next frame's */
    uint64_t end;   /* where the previous frame (or the header) ends */
};

/* Check that payload[0..size) is in the frames layout: at least 16 bytes,
 * the magic, flags 0, a count of at most FRAMES_MAX, a header that fits,
 * and a size that is exactly what the lengths give. 0 with w ready to walk
 * (w->count is the count), or -EPROTO with a message in err giving the
 * numbers (w then walks nothing). Reads the payload byte by byte, so it
 * need not be aligned. */
int frames_open(struct frames_walk *w, const void *payload, size_t size,
                struct shmb_error *err);

/* The next frame of the walk: 1 with its offset in the payload and its
 * length, 0 after the last. -EPROTO (with a message) when the frame does
 * not lie inside the payload, which a payload frames_open accepted only
 * shows when someone wrote it since: whatever the bytes say, a frame this
 * returns is inside the payload. */
int frames_next(struct frames_walk *w, uint64_t *offset, uint64_t *length,
                struct shmb_error *err);

#endif
