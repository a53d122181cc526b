// SPDX-License-Identifier: Apache-2.0
/*
 * The commands about the daemon rather than its objects: clients (its
 * connections) and check (shmbrokerd --check, run with the flags given).
 */
#include "ctl_admin.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../proto/text.h"
#include "../proto/utf8.h"

/* clients: every connection; with a POOL column when the daemon has more
 * than one pool (a daemon of one pool gets the table it always had). */
int run_clients(shmb_t *c, struct ctl *ctl)
{
    shmb_clients_t *list = NULL;
    shmb_stats_t *pools = NULL;
    char since[32], pinned[32], name[ESC_MAX], mode[ESC_MAX], pool[ESC_MAX + 1], pid[32];
    size_t i, npools = 0, other_ns = 0;
    int width = 16; /* of the POOL column: its longest name, at least 16 */

    (void)ctl;
    if (shmb_stats_pools(c, &pools, &npools) < 0)
        return fail(c);
    for (i = 0; i < npools; i++)
        if ((int)strlen(esc(pools[i].pool, pool, sizeof(pool) - 1)) > width)
            width = (int)strlen(pool);
    shmb_stats_pools_free(pools);
    if (shmb_clients(c, &list) < 0)
        return fail(c);
    printf("%8s %6s %-20s %-*s%-4s %7s %7s %10s  %s\n", "PID", "UID", "NAME",
           npools > 1 ? width + 1 : 0, npools > 1 ? "POOL" : "", "MODE", "PINS", "PENDING",
           "PINNED", "CONNECTED SINCE");
    for (i = 0; i < list->count; i++) {
        const shmb_client_info_t *cl = &list->clients[i];
        time_t t = (time_t)cl->connected_unix;
        struct tm tm;

        localtime_r(&t, &tm);
        strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S", &tm);
        esc(cl->name, name, sizeof(name));
        pool[0] = '\0';
        if (npools > 1) {
            esc(list->pools[i][0] != '\0' ? list->pools[i] : "-", pool, sizeof(pool) - 1);
            snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool), "%*s",
                     (int)strlen(pool) <= width ? width + 1 - (int)strlen(pool) : 1, "");
        }
        /* Pid 0: the client is in a pid namespace the daemon cannot see
         * into; its own pid there, as its hello said, marked as such. */
        if (cl->pid != 0)
            snprintf(pid, sizeof(pid), "%lld", (long long)cl->pid);
        else if (list->own_pids != NULL && list->own_pids[i] > 0)
            snprintf(pid, sizeof(pid), "ns:%lld", (long long)list->own_pids[i]);
        else
            snprintf(pid, sizeof(pid), "ns:?");
        other_ns += cl->pid == 0;
        /* At most 20 bytes of the name, cut on a character boundary. */
        printf("%8s %6lld %-20.*s %s%-4s %7lld %7lld %10s  %s%s\n", pid,
               (long long)cl->uid, (int)shmb_utf8_cut(name, strlen(name), 20), name, pool,
               esc(cl->mode, mode, sizeof(mode)), (long long)cl->pins,
               (long long)cl->pending,
               shmb_format_bytes((unsigned long long)cl->bytes_pinned, pinned,
                                 sizeof(pinned)),
               since, cl->self ? " (this command)" : "");
    }
    if (other_ns > 0)
        printf("ns:N: a client in another pid namespace (a container or pod of its own), "
               "which shmbrokerd sees no pid of; N is its own pid there, as it said at "
               "hello (? when it did not).\n");
    shmb_clients_free(list);
    return 0;
}

/* check: run shmbrokerd --check with the daemon flags given, the
 * shmbrokerd installed beside this shmbrokerctl first (the pair from one
 * build or package), else $SHMBROKERD, else PATH's. Returns only when none
 * could be run: 127 when none was found, 126 when one could not be run. */
int run_check(int argc, char **argv)
{
    char self[PATH_MAX], beside[PATH_MAX + 16];
    const char *env = getenv("SHMBROKERD");
    char **args = calloc((size_t)argc + 3, sizeof(*args));
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    const char *tried = NULL, *missing = NULL;
    int saved = 0;

    if (args == NULL) {
        fprintf(stderr, "shmbrokerctl: out of memory\n");
        return EXIT_ERROR_REPLY;
    }
    args[0] = "shmbrokerd";
    args[1] = "--check";
    memcpy(args + 2, argv, (size_t)argc * sizeof(*args));
    fflush(stdout);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');

        if (slash != NULL) {
            *slash = '\0';
            snprintf(beside, sizeof(beside), "%s/shmbrokerd", self);
            /* One there that cannot be run is an error, not a reason to
             * run another build's. */
            if (access(beside, F_OK) == 0) {
                execv(beside, args);
                saved = errno;
                tried = beside;
            }
        }
    }
    if (saved == 0 && env != NULL && env[0] != '\0') {
        if (access(env, F_OK) != 0) {
            missing = env;
        } else {
            execv(env, args);
            saved = errno;
            tried = env;
        }
    }
    if (saved == 0 && missing == NULL) {
        execvp("shmbrokerd", args);
        if (errno != ENOENT) {
            saved = errno;
            tried = "shmbrokerd (from PATH)";
        }
    }
    free(args);
    if (saved != 0) {
        fprintf(stderr, "shmbrokerctl: cannot run %s: %s\n", tried, strerror(saved));
        return 126;
    }
    if (missing != NULL) {
        fprintf(stderr, "shmbrokerctl: SHMBROKERD=%s: no such file; point it at shmbrokerd.\n",
                missing);
        return 127;
    }
    fprintf(stderr,
            "shmbrokerctl: check runs shmbrokerd --check, but no shmbrokerd was found beside "
            "shmbrokerctl (%s), in $SHMBROKERD or in PATH. Install shmbrokerd, or set "
            "SHMBROKERD=/path/to/shmbrokerd.\n",
            n > 0 ? self : "?");
    return 127;
}
