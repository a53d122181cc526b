// SPDX-License-Identifier: Apache-2.0
/*
 * The liveness lock beside a segment file, who holds it, and opening a path
 * safely. Knows nothing of the segment's content.
 */
#ifndef SHMB_LOCK_H
#define SHMB_LOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "../proto/error.h"

/* Refuse (-EPERM with a message naming owner, mode and links, and the fix)
 * a file not owned by this process's effective user, with any group or other
 * permission bit, or with more than one link: another user could read and
 * change it. Never adopted, never removed. */
int segment_check_owner(const struct stat *st, const char *path, struct shmb_error *err);

/* True when process pid holds the liveness lock of dir/name (/proc/locks):
 * it is the shmbrokerd serving that segment. */
bool segment_locked_by(const char *dir, const char *name, pid_t pid);

/* A process's start time in clock ticks after boot (/proc/PID/stat), or 0
 * when unknown: with the pid, it tells a live owner from a reused pid. */
uint64_t segment_process_start(pid_t pid);

/* The liveness lock's file of dir/name into out; -ENAMETOOLONG. */
int segment_lock_path(char *out, size_t len, const char *dir, const char *name);

/* Open an existing path without following a symbolic link and without
 * blocking; *st gets its fstat. -errno with a message when err is not NULL. */
int segment_open_existing(const char *path, int flags, struct stat *st,
                          struct shmb_error *err);

/* Take the liveness lock of dir/name (creating its file when create) into
 * *lock_fd: -EBUSY with a message while a live daemon holds it. */
int segment_lock(const char *dir, const char *name, bool create, int *lock_fd,
                 struct shmb_error *err);

#endif
