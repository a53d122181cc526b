// SPDX-License-Identifier: Apache-2.0
/* SIGHUP to a uv_async (hup.h). */
#include "hup.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

static uv_async_t *hup_async;

static void hup_on_signal(int signum)
{
    int saved = errno;

    (void)signum;
    if (hup_async != NULL)
        uv_async_send(hup_async);
    errno = saved;
}

int hup_catch(uv_async_t *async)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = hup_on_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    hup_async = async;
    if (sigaction(SIGHUP, &sa, NULL) != 0) {
        hup_async = NULL;
        return -errno;
    }
    return 0;
}

void hup_ignore(void)
{
    signal(SIGHUP, SIG_IGN);
    hup_async = NULL;
}
