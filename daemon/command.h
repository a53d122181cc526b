// SPDX-License-Identifier: Apache-2.0
/*
 * The protocol step of the daemon: one request line in, one reply out. Parses
 * and validates the JSON, dispatches through the op table, calls the store.
 * Knows nothing about sockets or libuv: conn.c frames the lines and writes
 * the replies, so this layer can be driven by a fuzzer or a unit test.
 */
#ifndef SHMB_COMMAND_H
#define SHMB_COMMAND_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "command_types.h"

/* Execute one request line (without its '\n'). Never fails: a bad request
 * gets an error reply. out->text is empty without COMMAND_SILENT or
 * COMMAND_WAIT only when memory ran out. */
void command_execute(struct command_env *env, struct command_client *client,
                     const char *line, size_t len, struct command_result *out);

/* Retry a waiting alloc (a wait_request from COMMAND_WAIT). Without final,
 * it may wait again (COMMAND_WAIT with no reply); with final, the wait is
 * over and the reply is the allocation or ETIMEDOUT naming the blocker. */
void command_retry(struct command_env *env, struct command_client *client,
                   json_t *wait_request, uint64_t wait_until_ms, bool final,
                   struct command_result *out);

/* What may make room in the store since the last call: a release, delete,
 * abort, disconnect or expiry. Waiting allocs are retried when it changes. */
uint64_t command_room_generation(const struct command_env *env);

/* When room may appear without any request (a read lease running out), in
 * clock_now_ms time; UINT64_MAX when nothing is due. */
uint64_t command_room_wake_ms(const struct command_env *env);

/* The reply to a request line longer than SHMB_MAX_LINE; the connection
 * closes after it. */
void command_oversized(size_t limit, struct command_result *out);

/* Zero env and make its client list empty; the caller fills in the rest. */
void command_env_init(struct command_env *env);

/* Register a new connection's client (zeroed by the caller, credentials
 * filled in) so that "clients" and "stats" see it. */
void command_client_open(struct command_env *env, struct command_client *client);

/* The reply of a result parsed back into JSON; a new reference, NULL when
 * there is none. For tests and the fuzzer. */
json_t *command_result_json(const struct command_result *res);

/* Drop everything client holds in the store (pins, pending allocs) and in
 * queues (its seats die, its writer roles go) and unregister it. A request
 * of its waiting for a queue's pages is not answered (the work goes on). */
void command_client_close(struct command_env *env, struct command_client *client);


#endif
