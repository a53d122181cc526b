// SPDX-License-Identifier: Apache-2.0
/*
 * Payloads that say what they are: a 32-byte head (magic, key number,
 * version, size, checksum of the rest) and a body derived from the key and
 * the version, so that a process that read an object can tell alone whether
 * it holds exactly what some put committed under that key: not another key's
 * bytes, not a torn mix of two versions. Shared by test_model and
 * test_scribble.
 */
#ifndef SHMB_TESTS_E2E_PAYLOAD_H
#define SHMB_TESTS_E2E_PAYLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PAYLOAD_HEAD 32u
#define PAYLOAD_MAGIC 0x4c444f4du /* "MODL" */

static inline uint64_t payload_word(uint32_t k, uint64_t version, size_t i)
{
    uint64_t z = version * 0x9e3779b97f4a7c15ull ^ ((uint64_t)k << 40) ^ (uint64_t)i;

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t payload_sum(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;

    for (i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Fill buf with the payload of key number k, version, size bytes (at least
 * PAYLOAD_HEAD). */
static inline void payload_fill(unsigned char *buf, uint32_t k, uint64_t version, size_t size)
{
    uint32_t magic = PAYLOAD_MAGIC;
    uint64_t sz = size, sum;
    size_t i;

    for (i = PAYLOAD_HEAD; i < size; i += 8) {
        uint64_t w = payload_word(k, version, i);

        memcpy(buf + i, &w, size - i < 8 ? size - i : 8);
    }
    sum = payload_sum(buf + PAYLOAD_HEAD, size - PAYLOAD_HEAD);
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &k, 4);
    memcpy(buf + 8, &version, 8);
    memcpy(buf + 16, &sz, 8);
    memcpy(buf + 24, &sum, 8);
}

/* Whether buf (size bytes, read under key number k) is exactly a payload put
 * under k: true and its version in *version, or false with why in what. */
static inline bool payload_verify(const unsigned char *buf, size_t size, uint32_t k,
                                  uint64_t *version, char *what, size_t what_len)
{
    uint32_t magic, pk;
    uint64_t sz, sum;
    size_t i;

    *version = 0;
    if (size < PAYLOAD_HEAD) {
        snprintf(what, what_len, "%zu bytes, shorter than any payload put", size);
        return false;
    }
    memcpy(&magic, buf, 4);
    memcpy(&pk, buf + 4, 4);
    memcpy(version, buf + 8, 8);
    memcpy(&sz, buf + 16, 8);
    memcpy(&sum, buf + 24, 8);
    if (magic != PAYLOAD_MAGIC || sz != size) {
        snprintf(what, what_len, "%zu bytes whose head says magic %#x size %llu: not a payload "
                 "put under any key", size, magic, (unsigned long long)sz);
        return false;
    }
    if (pk != k) {
        snprintf(what, what_len, "the payload of key %u (version %#llx): another key's bytes",
                 pk, (unsigned long long)*version);
        return false;
    }
    if (payload_sum(buf + PAYLOAD_HEAD, size - PAYLOAD_HEAD) != sum) {
        snprintf(what, what_len, "version %#llx whose checksum differs (torn or overwritten)",
                 (unsigned long long)*version);
        return false;
    }
    for (i = PAYLOAD_HEAD; i < size; i += 8) {
        uint64_t w = payload_word(k, *version, i);

        if (memcmp(buf + i, &w, size - i < 8 ? size - i : 8) != 0) {
            snprintf(what, what_len, "version %#llx whose byte %zu of %zu differs",
                     (unsigned long long)*version, i, size);
            return false;
        }
    }
    return true;
}

#endif
