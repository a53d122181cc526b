// SPDX-License-Identifier: Apache-2.0
/*
 * The descriptor store's bookkeeping: the memfd pools systemd kept across a
 * restart, taken back for the pools the settings still name, closed or
 * dropped for the others, and each memfd pool stored or removed by name.
 */
#include "keep.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "segment.h"

/* The store's name of a memfd pool's descriptor. */
static void daemon_kept_name(const struct pool *p, char *out, size_t len)
{
    snprintf(out, len, "%s%s", SERVER_KEPT_PREFIX, p->cfg.name);
}

/* A memfd pool: the descriptor systemd kept for it, if it kept one that
 * can be adopted (a memfd of the pool's size, sealed against resizing,
 * writable). Anything else under its name (another size, a file, a pipe, a
 * second descriptor), and everything with --fresh, is dropped and the store
 * entry made again once the pool is open: the pool starts empty rather than
 * refusing every start. */
void daemon_take_kept(struct daemon *d, struct pool *p)
{
    struct shmb_error err = {0};
    char name[64];
    unsigned i;

    daemon_kept_name(p, name, sizeof(name));
    for (i = 0; i < d->kept.n; i++) {
        int fd = d->kept.fd[i];

        if (fd < 0 || strcmp(d->kept.name[i], name) != 0)
            continue;
        d->kept.fd[i] = -1;
        if (d->cfg.fresh)
            log_info("pool '%s': the memfd systemd kept is dropped (--fresh)", p->cfg.name);
        else if (p->kept_fd >= 0)
            log_warn("pool '%s': systemd kept more than one memfd for it; the later one is "
                     "dropped",
                     p->cfg.name);
        else if (segment_check_memfd(fd, p->cfg.segment, p->size, &err) < 0)
            log_warn("pool '%s': %s It is dropped: the pool starts empty.", p->cfg.name,
                     err.message);
        else {
            p->kept_fd = fd;
            continue;
        }
        close(fd);
        p->kept_again = true;
    }
    if (p->kept_fd < 0)
        log_info("pool '%s' is a memfd: it has no name, so %s", p->cfg.name,
                 d->notify ? "systemd keeps it across restarts (its file-descriptor store), "
                             "not across a stop"
                           : "it cannot be adopted after a restart; its objects go with "
                             "this daemon");
}

/* A start refused: close what systemd passed, which it still keeps for the
 * next attempt. */
void daemon_close_kept(struct daemon *d)
{
    unsigned i;

    for (i = 0; i < d->kept.n; i++)
        if (d->kept.fd[i] >= 0)
            close(d->kept.fd[i]);
    d->kept.n = 0;
}

/* A memfd pool that goes for good (a stop without --keep-segment, or a
 * reload that removed it): systemd must not keep it any longer. */
void daemon_unkeep_memfd(const struct daemon *d, const struct pool *p)
{
    char name[64];

    if (!d->notify || !p->seg.memfd)
        return;
    daemon_kept_name(p, name, sizeof(name));
    notify_unstore_fd(name);
}

/* Descriptors systemd kept for pools no longer configured: let them go. */
void daemon_drop_kept(struct daemon *d)
{
    unsigned i;

    for (i = 0; i < d->kept.n; i++) {
        if (d->kept.fd[i] < 0)
            continue;
        log_info("systemd kept %s for a memfd pool that is no longer configured; "
                 "released",
                 d->kept.name[i]);
        close(d->kept.fd[i]);
        d->kept.fd[i] = -1;
        notify_unstore_fd(d->kept.name[i]);
    }
    d->kept.n = 0;
}

/* A memfd pool made now: ask systemd to keep it across restarts. */
void daemon_keep_memfd(const struct daemon *d, const struct pool *p)
{
    char name[64];
    int rc;

    if (!d->notify || !p->seg.memfd || (p->adopt && !p->kept_again))
        return;
    daemon_kept_name(p, name, sizeof(name));
    /* Exactly one descriptor under the name: whatever else is there goes. */
    notify_unstore_fd(name);
    if ((rc = notify_store_fd(p->seg.fd, name)) < 0)
        log_warn("pool '%s': cannot hand its memfd to systemd to keep: %s", p->cfg.name,
                 strerror(-rc));
}
