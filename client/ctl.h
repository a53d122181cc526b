// SPDX-License-Identifier: Apache-2.0
/*
 * What the ctl's commands share (ctl.c): the exit statuses, the command line
 * as the handlers need it, escaping, the error and the connection. The
 * commands' rooms stand on it; it knows none of them.
 */
#ifndef SHMB_CLIENT_CTL_H
#define SHMB_CLIENT_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../proto/protocol.h"
#include "../proto/text.h"
#include "shmbroker.h"

#define EXIT_ERROR_REPLY 1
#define EXIT_USAGE 2
#define EXIT_UNAVAILABLE 69 /* sysexits.h EX_UNAVAILABLE */
/* A local file, not the daemon, failed: sysexits.h's codes for each case, so
 * that a script can tell them from a refusal (1). */
#define EXIT_NO_INPUT 66   /* EX_NOINPUT: the input file cannot be opened */
#define EXIT_CANT_CREATE 73 /* EX_CANTCREAT: the output file cannot be created */
#define EXIT_IO_ERROR 74   /* EX_IOERR: reading or writing a file failed */
/* status read the figures from the segment because the daemon did not
 * answer: not a success, and not "unreachable" (69) either, since the
 * figures were printed. */
#define EXIT_NOT_ANSWERING 3

/* shmbrokerd's defaults for --name and --shm-dir (proto/protocol.h): where
 * its segment is, for status to read when the daemon does not answer. */
#define CTL_DEFAULT_NAME SHMB_DEFAULT_NAME
#define CTL_DEFAULT_SHM_DIR SHMB_DEFAULT_SHM_DIR
/* How long status waits for the daemon's first answer before it reads the
 * segment instead: a daemon answers stats in microseconds, even loaded. */
#define CTL_DEFAULT_TIMEOUT_S 5

/* What the command line asked for, as the handlers need it. */
struct ctl {
    const char *socket_path;
    const char *pool;      /* --pool NAME (global, or status's own), NULL without */
    const char *name;      /* --name: the daemon's segment name */
    const char *shm_dir;   /* --shm-dir: where its segment is */
    int json, prometheus;  /* status --json, --prometheus */
    int from_segment;      /* status --from-segment */
    unsigned long timeout; /* status --timeout SECONDS */
    unsigned long watch;   /* status --watch SECONDS, 0 without */
    char **args;           /* the command's arguments, after any "--" */
    int nargs;
    char *put_data;        /* put's input, read before connecting */
    size_t put_len;
};

/* The socket the ctl talks to, for messages (main sets it). */
extern const char *ctl_socket;

/* Room for any escaped string the daemon sends (a key, a path). */
#define ESC_MAX SHMB_ESCAPED_MAX(4096)

/* s made safe for a terminal (control bytes and invalid UTF-8 as \xNN) in
 * buf; returns buf. Keys and names come from other clients: printed raw,
 * they could clear the screen, retitle the window or forge table rows. */
char *esc(const char *s, char *buf, size_t len);

/* Print the daemon's (or the library's) error and return the exit status:
 * 69 when the connection was lost (the daemon exited or restarted). */
int fail(shmb_t *c);

/* A key the ctl refuses itself (not 1 to 255 bytes of UTF-8): usage. */
int check_key_arg(const char *key);

/* The broadcast queues, with their seats when seats, or NULL with the
 * error reported: none from a daemon that has no queues (ENOSYS). The
 * caller frees the list. */
shmb_queue_list_t *queues_of(shmb_t *c, bool seats, int *rc);

/* Whether queue q is shown: every pool's, or pool's only. */
bool queue_shown(const shmb_queue_info_t *q, const char *pool);

/* The "used" line of status: a bar of 40, the share, used of data_size and
 * what is free. */
void print_used(uint64_t used, uint64_t data_size, uint64_t free_bytes);

/* Why a connection failed, kept for the caller instead of printed. */
struct ctl_failure {
    int code; /* the library's -errno */
    char message[SHMB_ESCAPED_MAX(1024)];
};

/* Connect as shmbrokerctl (to pool, NULL: the default one; for a report,
 * to the default one when pool's group leaves this user out); on failure
 * print why (or, with why, keep it there) and return the exit status (69
 * when no daemon can be reached there), else 0 with *out. */
int ctl_connect(const char *socket_path, const char *pool, bool report, shmb_t **out,
                struct ctl_failure *why);

#endif
