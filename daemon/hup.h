// SPDX-License-Identifier: Apache-2.0
/*
 * SIGHUP caught by a handler of its own, which sends a uv_async: not a
 * uv_signal_t, whose pipe (one message per delivery, never blocking) a
 * storm of SIGHUPs slower to handle than to send fills, dropping the
 * SIGTERM that comes then. uv_async_send is async-signal-safe and
 * coalesces: any number of SIGHUPs before the loop looks is one callback.
 * Knows nothing of what a reload does.
 */
#ifndef SHMB_HUP_H
#define SHMB_HUP_H

#include <uv.h>

/* SIGHUP from now on sends async (initialized by the caller): 0 or -errno. */
int hup_catch(uv_async_t *async);

/* SIGHUP ignored from now on, async no longer sent (before it closes). */
void hup_ignore(void);

#endif
