// SPDX-License-Identifier: Apache-2.0
/*
 * Logging to stderr, one line per event, client text escaped.
 */
#include "log.h"

#include "../proto/text.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum log_level log_active_level = LOG_INFO;

/* stderr is journald's stream (systemd sets $JOURNAL_STREAM to its device and
 * inode): the journal stamps each line itself, so a line is only "<N>" (the
 * syslog priority sd-daemon(3) defines, which journald reads) and the
 * message. */
static bool log_to_journal;

/* The syslog priorities of error, warn, info and debug. */
static const int level_priorities[] = {3, 4, 6, 7};

void log_detect_journal(void)
{
    const char *stream = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;

    log_to_journal = stream != NULL && sscanf(stream, "%llu:%llu", &dev, &ino) == 2 &&
                     fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
                     (unsigned long long)st.st_ino == ino;
}

void log_startup_error(const char *message)
{
    /* Escaped like every log line: a flag or a settings file may hold a
     * newline, which would start a line (and a priority) of its own. */
    char line[SHMB_ESCAPED_MAX(1024)];

    shmb_escape(message, strnlen(message, 1024), line, sizeof(line));
    if (log_to_journal)
        fprintf(stderr, "<%d>shmbrokerd: %s\n", level_priorities[LOG_ERROR], line);
    else
        fprintf(stderr, "shmbrokerd: %s\n", line);
}

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
    /* The message is escaped (shmb_escape) before it is written, so that
     * nothing a client sends (a name, a key) can put a newline or a terminal
     * control sequence in the log: one event is one line. */
    char msg[1024], line[64 + SHMB_ESCAPED_MAX(sizeof(msg))], stamp[32];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    if (level > log_active_level)
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    va_start(ap, fmt);
    n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n < 0)
        msg[0] = '\0';
    if (log_to_journal)
        n = snprintf(line, sizeof(line), "<%d>", level_priorities[level]);
    else
        n = snprintf(line, sizeof(line), "%s.%03dZ shmbrokerd[%d] %s: ", stamp,
                     (int)(tv.tv_usec / 1000), (int)getpid(), level_names[level]);
    if (n < 0 || (size_t)n >= sizeof(line))
        return;
    shmb_escape(msg, strlen(msg), line + n, sizeof(line) - (size_t)n - 1);
    /* One write per line so that lines from a crash or a signal never mix. */
    n = (int)strlen(line);
    line[n++] = '\n';
    if (write(STDERR_FILENO, line, (size_t)n) < 0)
        return;
}
