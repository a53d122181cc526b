// SPDX-License-Identifier: Apache-2.0
/*
 * Small helpers both benchmarks share (tests/bench/bench.c and
 * queue_bench.c): the clock, sizes with suffixes, a reader's byte sum and
 * quantiles. Header-only: each benchmark is one file.
 */
#ifndef SHMB_BENCH_UTIL_H
#define SHMB_BENCH_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "64", "4K", "16M", "2G" (powers of 1024; "KiB" and "KB" too). */
static inline int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);

    if (end == s)
        return -1;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    *out = (size_t)v;
    return 0;
}

/* Sum every byte of p, 8 at a time: a reader that looks at all the data at
 * memory speed (a byte loop would make the reader, not the transport, the
 * bottleneck). */
static inline uint64_t sum_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t s = 0, w;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        memcpy(&w, b + i, 8);
        s += w;
    }
    for (; i < n; i++)
        s += b[i];
    return s;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* The q-quantile of sorted v (nearest rank). */
static inline double quantile(const double *v, size_t n, double q)
{
    size_t i;

    if (n == 0)
        return 0;
    i = (size_t)ceil(q * (double)n);
    return v[i == 0 ? 0 : i - 1];
}

#endif
