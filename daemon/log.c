/*
 * Logging to stderr, one line per event.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum log_level log_active_level = LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int log_parse_level(const char *name, enum log_level *out)
{
    int i;

    for (i = LOG_ERROR; i <= LOG_DEBUG; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *log_level_name(enum log_level level)
{
    return level >= LOG_ERROR && level <= LOG_DEBUG ? level_names[level] : "unknown";
}

void log_write(enum log_level level, const char *fmt, ...)
{
    char line[1024], stamp[32];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    if (level > log_active_level)
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    n = snprintf(line, sizeof(line), "%s.%03dZ shmbrokerd[%d] %s: ", stamp,
                 (int)(tv.tv_usec / 1000), (int)getpid(), level_names[level]);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so that lines from a crash or a signal never mix. */
    n = (int)strlen(line);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    if (write(STDERR_FILENO, line, (size_t)n) < 0)
        return;
}
