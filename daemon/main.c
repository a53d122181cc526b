/*
 * shmbrokerd: flags, start-up (socket probe, segment, store, listener),
 * signals and the event loop. Everything slow happens before the loop runs.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "command.h"
#include "config.h"
#include "log.h"
#include "segment.h"
#include "server.h"
#include "store.h"

struct daemon {
    struct config cfg;
    struct segment seg;
    struct store *store;
    struct command_env env;
    struct server server;
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    bool stopping;
};

/* SIGTERM or SIGINT: stop accepting, close every client, let the loop end. */
static void daemon_on_signal(uv_signal_t *handle, int signum)
{
    struct daemon *d = handle->data;

    if (d->stopping)
        return;
    d->stopping = true;
    log_info("%s received; shutting down", strsignal(signum));
    server_close(&d->server);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
}

/* Remove a segment left by a daemon that is gone; refuse anything else. */
static int daemon_clear_segment(const struct config *cfg, struct shmb_error *err)
{
    char path[PATH_MAX + NAME_MAX + 2];
    int64_t pid = 0;

    switch (segment_probe_existing(cfg->shm_dir, cfg->name, &pid)) {
    case SEGMENT_ABSENT:
        return 0;
    case SEGMENT_LIVE:
        return shmb_error_set(err, -EBUSY,
                              "Segment %s/%s belongs to a running shmbrokerd (pid %lld); "
                              "stop it first, or choose another --name.",
                              cfg->shm_dir, cfg->name, (long long)pid);
    case SEGMENT_FOREIGN:
        return shmb_error_set(err, -EEXIST,
                              "%s/%s exists and is not a shmbroker segment; remove it, or "
                              "choose another --name.", cfg->shm_dir, cfg->name);
    case SEGMENT_ORPHANED:
        break;
    }
    snprintf(path, sizeof(path), "%s/%s", cfg->shm_dir, cfg->name);
    if (unlink(path) != 0 && errno != ENOENT)
        return shmb_error_set(err, -errno, "Cannot remove stale segment %s: %s.", path,
                              strerror(errno));
    log_info("removed segment %s left by shmbrokerd pid %lld, which is gone", path,
             (long long)pid);
    return 0;
}

/* Everything before the loop: probe, segment, store, listener. */
static int daemon_start(struct daemon *d, struct shmb_error *err)
{
    struct store_config scfg = {.max_object_size = d->cfg.max_object_size};
    uint64_t size = segment_round_size(d->cfg.size);
    char h1[32], h2[32], h3[32];
    int rc;

    if (size < SEGMENT_MIN_SIZE)
        return shmb_error_set(err, -EINVAL,
                              "--size %llu is too small: the segment needs at least %u "
                              "bytes (a header page and a data page).",
                              (unsigned long long)d->cfg.size, SEGMENT_MIN_SIZE);
    if ((rc = segment_check_name(d->cfg.name, err)) < 0 ||
        (rc = server_probe(d->cfg.socket_path, err)) < 0 ||
        (rc = daemon_clear_segment(&d->cfg, err)) < 0 ||
        (rc = segment_create(&d->seg, d->cfg.shm_dir, d->cfg.name, size, err)) < 0)
        return rc;
    d->store = store_new(segment_data(&d->seg), d->seg.hdr->data_offset,
                         d->seg.hdr->data_size, d->seg.hdr, &scfg, err);
    if (d->store == NULL) {
        segment_destroy(&d->seg);
        return err->code;
    }
    d->env.store = d->store;
    d->env.segment = &d->seg;
    d->env.shm_dir = d->cfg.shm_dir;
    d->env.started_ms = command_now_ms();
    if ((rc = uv_loop_init(&d->loop)) < 0) {
        rc = shmb_error_set(err, -ENOMEM, "Cannot start the event loop: %s.", uv_strerror(rc));
        goto fail;
    }
    if ((rc = server_listen(&d->server, &d->loop, d->cfg.socket_path, d->cfg.socket_mode,
                            &d->env, err)) < 0)
        goto fail_loop;
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d->sigint.data = d;
    uv_signal_start(&d->sigterm, daemon_on_signal, SIGTERM);
    uv_signal_start(&d->sigint, daemon_on_signal, SIGINT);
    log_info("shmbrokerd %s ready: segment %s (%s, %s for data, max object %s), socket %s",
             SHMB_VERSION, d->seg.path, shmb_format_bytes(d->seg.size, h1, sizeof(h1)),
             shmb_format_bytes(d->seg.hdr->data_size, h2, sizeof(h2)),
             shmb_format_bytes(d->cfg.max_object_size, h3, sizeof(h3)),
             d->cfg.socket_path);
    return 0;

fail_loop:
    uv_run(&d->loop, UV_RUN_NOWAIT);
    uv_loop_close(&d->loop);
fail:
    store_free(d->store);
    d->store = NULL;
    segment_destroy(&d->seg);
    return rc;
}

/* After the loop: close what is left, remove the segment. */
static void daemon_stop(struct daemon *d)
{
    uv_run(&d->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&d->loop) != 0)
        log_warn("event loop closed with handles still open");
    store_free(d->store);
    segment_destroy(&d->seg);
    log_info("stopped; socket %s and segment removed", d->cfg.socket_path);
}

int main(int argc, char **argv)
{
    static struct daemon d;
    struct shmb_error err = {0};

    switch (config_parse(&d.cfg, argc, argv, &err)) {
    case CONFIG_EXIT_OK:
        return 0;
    case CONFIG_EXIT_USAGE:
        fprintf(stderr, "shmbrokerd: %s\n", err.message);
        return 2;
    case CONFIG_RUN:
        break;
    }
    log_active_level = d.cfg.log_level;
    signal(SIGPIPE, SIG_IGN);
    if (daemon_start(&d, &err) < 0) {
        fprintf(stderr, "shmbrokerd: %s\n", err.message);
        return 1;
    }
    uv_run(&d.loop, UV_RUN_DEFAULT);
    daemon_stop(&d);
    return 0;
}
