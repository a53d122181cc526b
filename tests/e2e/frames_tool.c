// SPDX-License-Identifier: Apache-2.0
/*
 * shmb-frames-tool: objects of several frames from the command line, for
 * tests that check that other clients (the Python package) read what the C
 * library writes and the other way round. Puts files as frames, or prints
 * each frame's length and SHA-256. Goes through libshmbroker only; not
 * installed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmbroker.h"

static const char usage[] =
    "usage: shmb-frames-tool SOCKET put KEY [FILE...]\n"
    "       shmb-frames-tool SOCKET get KEY\n"
    "put: store the bytes of each FILE, in order, as the frames of one object\n"
    "     under KEY (shmb_put_frames); no FILE makes an object of 0 frames.\n"
    "get: print one line per frame of KEY, \"LENGTH SHA256\": its length in\n"
    "     bytes (decimal) and the SHA-256 of its bytes (64 lowercase hex\n"
    "     digits, as sha256sum and Python's hashlib.sha256().hexdigest()).\n"
    "Exit 0 on success; 1 with the library's error (NAME: message) on\n"
    "standard error when a call fails or a FILE cannot be read; 2 on a usage\n"
    "error.\n";

/* ---- SHA-256 (FIPS 180-4), small and slow: frames in tests are small ---- */

struct sha256 {
    uint32_t h[8];
    unsigned char block[64];
    size_t used;    /* bytes in block */
    uint64_t total; /* bytes hashed */
};

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha256_init(struct sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

    memcpy(s->h, h0, sizeof(h0));
    s->used = 0;
    s->total = 0;
}

static void sha256_block(struct sha256 *s, const unsigned char *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, h, t1, t2;
    int i;

    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++)
        w[i] = w[i - 16] + (ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3)) +
               w[i - 7] + (ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10));
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (i = 0; i < 64; i++) {
        t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[i] +
             w[i];
        t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1;
        d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d;
    s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha256_update(struct sha256 *s, const unsigned char *p, size_t len)
{
    s->total += len;
    while (len > 0) {
        size_t take = 64 - s->used < len ? 64 - s->used : len;

        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        len -= take;
        if (s->used == 64) {
            sha256_block(s, s->block);
            s->used = 0;
        }
    }
}

/* The digest as 64 lowercase hex digits and a NUL in hex. */
static void sha256_hex(struct sha256 *s, char hex[65])
{
    static const unsigned char pad = 0x80, zero = 0;
    unsigned char len[8];
    uint64_t bits = s->total * 8;
    int i;

    sha256_update(s, &pad, 1);
    while (s->used != 56)
        sha256_update(s, &zero, 1);
    for (i = 0; i < 8; i++)
        len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(s, len, 8);
    for (i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", (s->h[i / 4] >> (24 - 8 * (i % 4))) & 0xff);
}

/* ---- the commands -------------------------------------------------------- */

/* The whole of path in *data (malloc'ed, NULL when empty) and *len. */
static int read_file(const char *path, void **data, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    unsigned char *buf = NULL, *grown;
    size_t cap = 0, n = 0, got;

    *data = NULL;
    *len = 0;
    if (fp == NULL)
        return -errno;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 65536;
            if ((grown = realloc(buf, cap)) == NULL) {
                free(buf);
                fclose(fp);
                return -ENOMEM;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(fp)) {
        free(buf);
        fclose(fp);
        return -EIO;
    }
    fclose(fp);
    if (n == 0) {
        free(buf);
        buf = NULL;
    }
    *data = buf;
    *len = n;
    return 0;
}

static int cmd_put(shmb_t *c, const char *key, int nfiles, char **files)
{
    shmb_frame_t *frames = calloc(nfiles > 0 ? (size_t)nfiles : 1, sizeof(*frames));
    int i, rc = 1;

    if (frames == NULL) {
        fprintf(stderr, "shmb-frames-tool: out of memory\n");
        return 1;
    }
    for (i = 0; i < nfiles; i++) {
        void *data;
        int err = read_file(files[i], &data, &frames[i].size);

        frames[i].data = data;
        if (err < 0) {
            fprintf(stderr, "shmb-frames-tool: cannot read %s: %s\n", files[i],
                    strerror(-err));
            goto done;
        }
    }
    if (shmb_put_frames(c, key, (size_t)nfiles, frames, 0) < 0) {
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
        goto done;
    }
    rc = 0;
done:
    for (i = 0; i < nfiles; i++)
        free((void *)frames[i].data);
    free(frames);
    return rc;
}

static int cmd_get(shmb_t *c, const char *key)
{
    /* Room for the most frames an object may hold: one call, one pin. */
    shmb_frame_t *frames = calloc(65535, sizeof(*frames));
    struct sha256 s;
    char hex[65];
    size_t n, i;

    if (frames == NULL) {
        fprintf(stderr, "shmb-frames-tool: out of memory\n");
        return 1;
    }
    if (shmb_get_frames(c, key, frames, 65535, &n) < 0) {
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
        free(frames);
        return 1;
    }
    for (i = 0; i < n; i++) {
        sha256_init(&s);
        sha256_update(&s, frames[i].data, frames[i].size);
        sha256_hex(&s, hex);
        printf("%zu %s\n", frames[i].size, hex);
    }
    free(frames);
    if (shmb_release(c, key) < 0) {
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
        return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    shmb_t *c;
    int rc;

    if (argc < 4 || (strcmp(argv[2], "put") != 0 && strcmp(argv[2], "get") != 0) ||
        (strcmp(argv[2], "get") == 0 && argc != 4)) {
        fputs(usage, stderr);
        return 2;
    }
    if ((c = shmb_new()) == NULL) {
        fprintf(stderr, "shmb-frames-tool: out of memory\n");
        return 1;
    }
    if (shmb_connect(c, argv[1], "shmb-frames-tool") < 0) {
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
        shmb_close(c);
        return 1;
    }
    rc = strcmp(argv[2], "put") == 0 ? cmd_put(c, argv[3], argc - 4, argv + 4)
                                     : cmd_get(c, argv[3]);
    shmb_close(c);
    return rc;
}
