// SPDX-License-Identifier: Apache-2.0
/*
 * A socket-less daemon for tests and the fuzzer.
 */
#include "fixture.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../proto/alloc.h"

int fixture_init(struct fixture *f, uint64_t size, uint64_t max_object_size)
{
    struct store_config cfg = {.max_object_size = max_object_size};
    struct shmb_segment_header *hdr;
    struct segment *seg = &f->pool.seg;

    memset(f, 0, sizeof(*f));
    seg->fd = seg->ro_fd = seg->lock_fd = -1;
    seg->base = aligned_alloc(SHMB_HEADER_PAGE, size);
    if (seg->base == NULL)
        return -ENOMEM;
    memset(seg->base, 0, SHMB_HEADER_PAGE);
    seg->size = size;
    seg->hdr = hdr = seg->base;
    strcpy(seg->name, "fixture");
    strcpy(seg->dir, "/tmp");
    hdr->magic = SHMB_SEGMENT_MAGIC;
    hdr->version = SHMB_LAYOUT_VERSION;
    hdr->header_size = SHMB_HEADER_PAGE;
    hdr->total_size = size;
    hdr->data_offset = SHMB_HEADER_PAGE;
    hdr->data_size = size - SHMB_HEADER_PAGE;
    seg->data_offset = hdr->data_offset;
    seg->data_size = hdr->data_size;
    /* No catalog (0 slots): it would start at the end of the file. */
    seg->catalog_offset = hdr->catalog_offset = size;
    f->store = store_new((char *)seg->base + SHMB_HEADER_PAGE, SHMB_HEADER_PAGE,
                         hdr->data_size, hdr, &cfg, NULL);
    if (f->store == NULL) {
        free(seg->base);
        return -ENOMEM;
    }
    command_env_init(&f->env);
    f->pool.store = f->store;
    strcpy(f->pool.cfg.name, "fixture");
    strcpy(f->pool.cfg.segment, "fixture");
    strcpy(f->pool.cfg.dir, "/tmp");
    f->pool.cfg.backing = POOL_BACKING_SHM;
    f->pool.size = size;
    f->pools.pools[0] = &f->pool;
    f->pools.n = 1;
    f->env.pools = &f->pools;
    f->env.started_ms = clock_now_ms();
    f->env.limits.max_pins = 64;
    f->env.limits.max_pending = 16;
    return 0;
}

void fixture_fini(struct fixture *f)
{
    queue_set_free(&f->env.queues);
    store_free(f->store);
    free(f->pool.seg.base);
    memset(f, 0, sizeof(*f));
}

int fixture_request(struct fixture *f, struct command_client *client, const char *line,
                    json_t **reply_out)
{
    struct command_result res;
    json_t *reply;
    unsigned long fail_in;
    int ok;

    command_execute(&f->env, client, line, strlen(line), &res);
    /* The test's own parse of the reply is not the code under test. */
    fail_in = shmb_alloc_fail_pause();
    reply = command_result_json(&res);
    shmb_alloc_fail_at(fail_in);
    json_decref(res.wait_request);
    shmb_free(res.text.buf);
    if (reply == NULL)
        return -1;
    ok = json_is_true(json_object_get(reply, "ok"));
    if (reply_out != NULL)
        *reply_out = reply;
    else
        json_decref(reply);
    return ok;
}
