// SPDX-License-Identifier: Apache-2.0
/*
 * The daemon's state: the one struct that the top floor's rooms (main, plan,
 * keep, reload) share. Declares no function; knows nothing of how they use it.
 */
#ifndef SHMB_DAEMON_H
#define SHMB_DAEMON_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "command.h"
#include "config.h"
#include "pool.h"
#include "server.h"

struct daemon {
    struct config cfg;
    struct pool_set pools;
    struct command_env env;
    struct server server;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    uv_timer_t expiry; /* drops allocations older than --alloc-timeout */
    uv_prepare_t expiry_arm; /* before the loop sleeps: arms expiry, or stops it */
    uint64_t expiry_due;     /* monotonic ms expiry is armed for; 0 = stopped */
    uv_async_t sighup;  /* SIGHUP's reload: sent by the signal handler, so a storm is one reload */
    uv_timer_t status;   /* STATUS= for systemd, once a second */
    uv_timer_t watchdog; /* WATCHDOG=1 at half of $WATCHDOG_USEC */
    uv_timer_t heartbeat; /* each pool's heartbeat in its segment, every second */
    uv_poll_t stop_with; /* --stop-with-pid: that process's pidfd, readable once it exits */
    int stop_with_fd;    /* the pidfd; -1 when not watching */
    bool notify;         /* $NOTIFY_SOCKET is set */
    bool activated;      /* systemd passed the listening socket */
    int activated_fd;    /* ... which is ours until the server takes it, else -1 */
    struct server_kept kept; /* memfd pools systemd kept across a restart */
    bool stopping;
    /* A start's progress while it reserves its pools: the file beside the
     * socket that clients read (starting.h), the pool being reserved. */
    struct {
        char path[PATH_MAX];
        int fd; /* the file, locked while the start goes on; -1 before */
        const char *pool;
        int quarter; /* the last quarter of a large reservation logged */
    } progress;
    int argc; /* kept for SIGHUP, which parses them again */
    char **argv;
};

#endif
