// SPDX-License-Identifier: Apache-2.0
/*
 * libFuzzer target: arbitrary request lines and sessions through the real
 * request handler (parse, dispatch, store, ring) of shmbrokerd.
 *
 * Input: lines separated by '\n'. "#0", "#1", "#2" switch to that client;
 * "#x" disconnects the current client (everything it held is released) and
 * connects a fresh one. Every other line is a request of the current client.
 * After every request the reply must be a well-formed reply and the store
 * must account for every byte; after the session, no client may hold
 * anything.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../proto/alloc.h"
#include "fixture.h"

#define FUZZ_CLIENTS 3

/* Abort (a crash libFuzzer reports) when an invariant does not hold, saying
 * which. */
static void fuzz_assert(int cond, const char *what, int line)
{
    if (!cond) {
        fprintf(stderr, "fuzz_command.c:%d: invariant failed: %s\n", line, what);
        abort();
    }
}
#define fuzz_check(cond) fuzz_assert((cond), #cond, __LINE__)

/* A reply has "ok"; an error reply has a known code name and a message. */
static void fuzz_check_reply(json_t *reply)
{
    json_t *ok = json_object_get(reply, "ok");

    fuzz_check(json_is_object(reply) && json_is_boolean(ok));
    if (json_is_false(ok)) {
        const char *code = json_string_value(json_object_get(reply, "error"));

        fuzz_check(code != NULL && shmb_error_from_name(code) != -EIO);
        fuzz_check(json_is_string(json_object_get(reply, "message")));
    }
}

/* Used and free bytes always add up to the data area. */
static void fuzz_check_store(struct store *s)
{
    struct store_stats st;

    store_stats(s, &st);
    fuzz_check(st.used + st.free == st.data_size);
    fuzz_check(st.used <= st.data_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct command_client clients[FUZZ_CLIENTS];
    struct fixture f;
    struct store_stats st;
    const char *p = (const char *)data, *end = p + size;
    int current = 0, i;

    if (fixture_init(&f, 64 * 1024, 16 * 1024) < 0)
        return 0;
    /* Queues of 1 GiB would make each run slow and the host's memory the
     * limit; 1 MiB reaches every path. */
    f.env.queues.max_size = 1 << 20;
    memset(clients, 0, sizeof(clients));
    for (i = 0; i < FUZZ_CLIENTS; i++)
        command_client_open(&f.env, &clients[i]);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        struct command_result res;

        if (len == 2 && p[0] == '#' && p[1] >= '0' && p[1] < '0' + FUZZ_CLIENTS) {
            current = p[1] - '0';
        } else if (len == 2 && p[0] == '#' && p[1] == 'x') {
            command_client_close(&f.env, &clients[current]);
            memset(&clients[current], 0, sizeof(clients[current]));
            command_client_open(&f.env, &clients[current]);
        } else if (len > 0 && len <= SHMB_MAX_LINE) {
            json_t *reply;

            command_execute(&f.env, &clients[current], p, len, &res);
            /* The reply, written out by hand or by jansson, is JSON that
             * parses to a well-formed reply. */
            reply = command_result_json(&res);
            json_decref(res.wait_request); /* a waiting alloc is not retried here */
            shmb_free(res.text.buf);
            if (!(res.flags & (COMMAND_SILENT | COMMAND_WAIT))) {
                fuzz_check(reply != NULL);
                fuzz_check_reply(reply);
            }
            json_decref(reply);
            fuzz_check_store(f.store);
        }
        p += len + (nl != NULL);
    }
    for (i = 0; i < FUZZ_CLIENTS; i++)
        command_client_close(&f.env, &clients[i]);
    store_stats(f.store, &st);
    fuzz_check(st.pending == 0 && st.pinned == 0 && f.env.clients == 0);
    fixture_fini(&f);
    return 0;
}
