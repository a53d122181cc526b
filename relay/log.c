// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's clock and log: below every other room, so that each may tell
 * the time and say what happened without calling up to main.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "log.h"

uint64_t relay_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void relay_log(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "shmbroker-relay: %s\n", msg);
}
