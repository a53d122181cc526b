// SPDX-License-Identifier: Apache-2.0
/*
 * systemd's notify protocol, by hand: one datagram per message to the
 * socket named by $NOTIFY_SOCKET (a path, or '@' for an abstract address).
 * READY=1, STATUS=..., STOPPING=1, WATCHDOG=1 and the file-descriptor
 * store (FDSTORE=1 with the descriptor, FDSTOREREMOVE=1). No libsystemd. Knows
 * nothing about what the daemon does.
 */
#ifndef SHMB_NOTIFY_H
#define SHMB_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Read $NOTIFY_SOCKET and $WATCHDOG_USEC/$WATCHDOG_PID. Returns true when a
 * notify socket is set (every other call is a no-op otherwise). */
bool notify_init(void);

/* Send one message ("READY=1", "STATUS=..."); 0 or a negative errno. */
int notify_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Ask systemd to keep a duplicate of fd under name (FDSTORE=1, FDNAME=;
 * the unit needs FileDescriptorStoreMax=), to be passed back at the next
 * start with LISTEN_FDNAMES. 0 or a negative errno; 0 without systemd. */
int notify_store_fd(int fd, const char *name);

/* Ask systemd to close the descriptors it keeps under name. */
int notify_unstore_fd(const char *name);

/* The watchdog interval systemd asked for, in microseconds; 0 when none. */
uint64_t notify_watchdog_usec(void);

#endif
