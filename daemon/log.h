// SPDX-License-Identifier: Apache-2.0
/*
 * Logging: one line per event on stderr, with a time, the pid and a level.
 * Nothing is formatted below the active level. Knows nothing else.
 */
#ifndef SHMB_LOG_H
#define SHMB_LOG_H

#include <stdbool.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern enum log_level log_active_level;

/* Parse "error", "warn", "info" or "debug"; -EINVAL otherwise. */
/* Look whether stderr is journald's stream ($JOURNAL_STREAM); again after
 * stderr moved (--log-file). Lines to the journal carry a syslog priority
 * and no stamp of their own. */
void log_detect_journal(void);

/* A start-up error, the daemon's last word: "shmbrokerd: message" on
 * stderr, at error priority for the journal. */
void log_startup_error(const char *message);

int log_parse_level(const char *name, enum log_level *out);
const char *log_level_name(enum log_level level);

void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The level check happens before any argument is formatted. */
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)                                                                    \
    do {                                                                                 \
        if (log_active_level >= LOG_WARN)                                                \
            log_write(LOG_WARN, __VA_ARGS__);                                            \
    } while (0)
#define log_info(...)                                                                    \
    do {                                                                                 \
        if (log_active_level >= LOG_INFO)                                                \
            log_write(LOG_INFO, __VA_ARGS__);                                            \
    } while (0)
#define log_debug(...)                                                                   \
    do {                                                                                 \
        if (log_active_level >= LOG_DEBUG)                                               \
            log_write(LOG_DEBUG, __VA_ARGS__);                                           \
    } while (0)

#endif
