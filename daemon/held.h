// SPDX-License-Identifier: Apache-2.0
/*
 * The record of the segment files a daemon holds, beside its socket
 * ("<socket>.segments"): what shmbrokerd --remove-segment (the socket
 * unit's ExecStopPost) removes, whatever the settings say by then. Knows
 * paths, names and sizes; nothing of pools, stores or the socket itself.
 */
#ifndef SHMB_HELD_H
#define SHMB_HELD_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"

/* Entries a record keeps: the pools of a daemon and segments earlier runs
 * left, beyond which the oldest are forgotten (the record is a help, not
 * a registry). */
#define HELD_MAX 64

/* One segment file. */
struct held_segment {
    char dir[PATH_MAX];
    char name[NAME_MAX + 1];
    uint64_t size;
};

/* The record's path for a socket path, into out; -ENAMETOOLONG when it does
 * not fit. */
int held_path(const char *socket_path, char *out, size_t len);

/* Read the record at path into out[0..max), *n of them. A record that is
 * not there is 0 entries. A line that is not an entry is skipped, counted
 * in *bad (may be NULL). 0, or a negative errno with err set. */
int held_read(const char *path, struct held_segment *out, size_t max, size_t *n,
              unsigned *bad, struct shmb_error *err);

/* Write the record at path: ours[0..n_ours), then the entries the old record
 * had that are not among them and whose file is still there. No entry left
 * removes the record. Written whole or not at all (a temporary and
 * rename). 0, or a negative errno with err set. */
int held_update(const char *path, const struct held_segment *ours, size_t n_ours,
                struct shmb_error *err);

#endif
