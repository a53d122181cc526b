// SPDX-License-Identifier: Apache-2.0
/*
 * A segment file read without asking the daemon (report_segment.c): its
 * header page, the pid listening at a socket, the segments of a directory.
 * Part of the library, not installed; the ctl's status reads through it.
 */
#ifndef SHMB_CLIENT_REPORT_SEGMENT_H
#define SHMB_CLIENT_REPORT_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"
#include "../proto/layout.h"

/* What the header page of a segment file says, read from the file without
 * asking the daemon (shmbrokerctl status when the daemon does not answer):
 * its heartbeat and the counters it published with it. */
struct shmb_segment_report {
    uint64_t file_size; /* bytes in the file */
    uint32_t file_uid;  /* the file's owner */
    uint32_t file_mode; /* its permission bits */
    uint64_t total_size, data_size;
    int64_t owner_pid;          /* the header's owner (the daemon that adopted it) */
    uint64_t heartbeat_unix_ms; /* 0: never beat */
    uint64_t heartbeat_count;
    uint32_t heartbeat_period_ms;
    uint64_t catalog_slots;
    uint32_t catalog_unlisted;
    struct shmb_published_counters counters; /* seq: the count they were read under */
    bool counters_settled; /* false: the writer stopped half way (seq stayed odd) */
};

/* Read the header page of the segment file at path into out. 0; -ENOENT (or
 * another errno) when it cannot be opened; -EINVAL when it is not a
 * shmbroker segment; -EPROTO when it is one of another layout version. err
 * says which, with the numbers. */
int shmb_segment_report_read(const char *path, struct shmb_segment_report *out,
                             struct shmb_error *err);

/* The pid of the process listening at the socket path, read with
 * SO_PEERCRED from a connection that sends nothing: the kernel accepts it
 * for a daemon that is stopped or stuck too. 0 when no one listens there,
 * or the listener is in another pid namespace (or is systemd, which
 * listens for a socket-activated daemon: then its pid). Its user into *uid
 * (may be NULL) when not 0. */
long shmb_socket_listener_pid(const char *path, uint32_t *uid);

/* A shmbroker segment file found in a directory. */
struct shmb_segment_found {
    char name[256]; /* its file name in the directory */
    struct shmb_segment_report rep;
};

/* The shmbroker segments of this layout in dir that keep accepts (all when
 * keep is NULL), in the order readdir gives them: up to max into out, and
 * in *n how many there are (more than max when out was too short). Files
 * that are not segments are passed over. 0, or a negative errno when dir
 * cannot be read, with err set. */
int shmb_segment_scan(const char *dir,
                      bool (*keep)(const char *name, const struct shmb_segment_report *rep,
                                   void *arg),
                      void *arg, struct shmb_segment_found *out, size_t max, size_t *n,
                      struct shmb_error *err);

#endif
