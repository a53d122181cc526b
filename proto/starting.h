// SPDX-License-Identifier: Apache-2.0
/*
 * The progress of a daemon that is starting, in a file beside its socket
 * ("<socket>.starting"): the daemon writes it while it reserves its pools,
 * before its socket listens, holding an exclusive flock on it the while, and
 * removes it once it serves; a client whose connect is refused reads it to
 * say "starting: reserving pool 'cache': 2.1 GiB of 4.5 GiB" rather than
 * "is shmbrokerd running?". The lock, not a pid, tells a live start from a
 * file a killed one left: it works across pid namespaces and goes with the
 * process. One format, written and read here. Knows nothing of pools or
 * the protocol.
 */
#ifndef SHMB_PROTO_STARTING_H
#define SHMB_PROTO_STARTING_H

#include <stddef.h>

/* The file's name: the socket's, with this after it. */
#define SHMB_STARTING_SUFFIX ".starting"
/* The progress text's bytes at most. */
#define SHMB_STARTING_TEXT_MAX 256

/* The file's path for socket_path into out: 0, or -ENAMETOOLONG. */
int shmb_starting_path(const char *socket_path, char *out, size_t len);

/* Create (or take over, when it is this user's with one link) path, mode
 * 0644 (clients of any user read it), and lock it: the descriptor, or a
 * negative errno (-EWOULDBLOCK: another process holds it; -EPERM: another
 * user's file, or one with other names). */
int shmb_starting_open(const char *path);

/* Write "<pid>\n<text>\n" over what fd holds. 0 or a negative errno. */
int shmb_starting_update(int fd, long long pid, const char *text);

/* 1 when a daemon starting at socket_path says what it does (its file is
 * locked): its pid in *pid and its text in text (escaped as shmb_escape
 * does: whoever can write the run directory wrote it); 0 when there is no
 * such file, one nobody holds (its daemon gone), one not in the format, or
 * one anyone could have planted: writable by others, or owned by a user
 * other than this one, root and the owner of its directory. */
int shmb_starting_read(const char *socket_path, long long *pid, char *text, size_t len);

#endif
