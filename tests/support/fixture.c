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

    memset(f, 0, sizeof(*f));
    f->seg.fd = f->seg.ro_fd = f->seg.lock_fd = -1;
    f->seg.base = aligned_alloc(SHMB_HEADER_PAGE, size);
    if (f->seg.base == NULL)
        return -ENOMEM;
    memset(f->seg.base, 0, SHMB_HEADER_PAGE);
    f->seg.size = size;
    f->seg.hdr = hdr = f->seg.base;
    strcpy(f->seg.name, "fixture");
    strcpy(f->seg.dir, "/tmp");
    hdr->magic = SHMB_SEGMENT_MAGIC;
    hdr->version = SHMB_LAYOUT_VERSION;
    hdr->header_size = SHMB_HEADER_PAGE;
    hdr->total_size = size;
    hdr->data_offset = SHMB_HEADER_PAGE;
    hdr->data_size = size - SHMB_HEADER_PAGE;
    f->seg.data_offset = hdr->data_offset;
    f->seg.data_size = hdr->data_size;
    f->store = store_new((char *)f->seg.base + SHMB_HEADER_PAGE, SHMB_HEADER_PAGE,
                         hdr->data_size, hdr, &cfg, NULL);
    if (f->store == NULL) {
        free(f->seg.base);
        return -ENOMEM;
    }
    command_env_init(&f->env);
    f->env.store = f->store;
    f->env.segment = &f->seg;
    f->env.shm_dir = "/tmp";
    f->env.started_ms = clock_now_ms();
    f->env.limits.max_pins = 64;
    f->env.limits.max_pending = 16;
    return 0;
}

void fixture_fini(struct fixture *f)
{
    store_free(f->store);
    free(f->seg.base);
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
