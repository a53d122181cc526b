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

#endif
