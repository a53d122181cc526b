// SPDX-License-Identifier: Apache-2.0
/*
 * A daemon without sockets, for tests and the fuzzer: a segment in ordinary
 * memory, a store over it and the command layer's environment, so requests
 * can be driven through command_execute directly.
 */
#ifndef SHMB_TEST_FIXTURE_H
#define SHMB_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "command.h"
#include "pool.h"
#include "segment.h"
#include "store.h"

/* One pool, named "fixture", whose segment is ordinary memory. */
struct fixture {
    struct pool pool;     /* pool.seg, pool.store */
    struct pool_set pools;
    struct store *store;  /* == pool.store */
    struct command_env env;
};

/* Set up a fixture of size bytes (header page included); 0 or -ENOMEM. */
int fixture_init(struct fixture *f, uint64_t size, uint64_t max_object_size);

/* Free the store and the memory. */
void fixture_fini(struct fixture *f);

/* Run one request line for client; returns the reply's "ok" (1 or 0), or -1
 * when there was no reply (out of memory: the connection would close).
 * When reply_out is not NULL it receives the reply (caller decrefs). */
int fixture_request(struct fixture *f, struct command_client *client, const char *line,
                    json_t **reply_out);

#endif
