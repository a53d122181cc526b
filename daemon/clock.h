// SPDX-License-Identifier: Apache-2.0
/*
 * The daemon's one clock: monotonic milliseconds, for ages, deadlines, turns
 * and uptime. Never the wall clock, which can step back under an NTP fix and
 * would expire or resurrect everything at once. Knows nothing else.
 */
#ifndef SHMB_CLOCK_H
#define SHMB_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC (since boot, not counting suspend). */
static inline uint64_t clock_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

#endif
