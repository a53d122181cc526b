// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's ground floor: its one clock and its log. Every other room of
 * the relay stands on it; it knows none of them.
 */
#ifndef SHMB_RELAY_LOG_H
#define SHMB_RELAY_LOG_H

#include <stdint.h>

/* Monotonic milliseconds: the one clock of deadlines and retries. */
uint64_t relay_now_ms(void);
/* One line on stderr, prefixed with the program's name. */
void relay_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A connection refused below the relay's loop (accept(), recv(): any
 * thread): counted, and logged within a budget of 10 lines a minute, the
 * rest said in one line. */
void relay_log_refusal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The refusals counted since the last call, for the status's "refused". */
uint64_t relay_take_refusals(void);

#endif
