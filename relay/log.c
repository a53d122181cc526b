// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's clock and log: below every other room, so that each may tell
 * the time and say what happened without calling up to main.c.
 */
#include <stdarg.h>
#include <stdatomic.h>
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

/* The first LOG_REFUSALS_PER_MINUTE refusals of each minute are logged one
 * by one and the rest counted, said in one line when the next minute's
 * first comes: a host that dials in a loop, or a stream cut again and again,
 * would otherwise write a line for each, as fast as it can. */
#define LOG_REFUSALS_PER_MINUTE 10
static _Atomic uint64_t refusals, log_minute_ms, logged_this_minute, unlogged;

void relay_log_refusal(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    uint64_t now = relay_now_ms();

    refusals++;
    if (now - log_minute_ms >= 60000) {
        uint64_t missed = atomic_exchange(&unlogged, 0);
        log_minute_ms = now;
        logged_this_minute = 0;
        if (missed)
            relay_log("refused %llu more connections in the last minute, not logged one "
                      "by one (the status's \"refused\" counts every one)",
                      (unsigned long long)missed);
    }
    if (logged_this_minute++ >= LOG_REFUSALS_PER_MINUTE) {
        unlogged++;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    relay_log("%s", msg);
}

uint64_t relay_take_refusals(void)
{
    return atomic_exchange(&refusals, 0);
}
