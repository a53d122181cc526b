// SPDX-License-Identifier: Apache-2.0
/*
 * The names the daemon and the library agree on: what a pool's or a queue's
 * name may be, and the key "q/<queue>/<seq>" of a queue message carried as
 * a store object. One home for each rule, so the daemon, the library and
 * the ctl refuse the same names with the same words (Python's copies are
 * held equal by tests/python/test_tables.py). Knows nothing of sockets,
 * JSON or the store.
 */
#ifndef SHMB_PROTO_NAMES_H
#define SHMB_PROTO_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

/* A pool's name: 1 to this many bytes of [A-Za-z0-9_-]; it becomes part of
 * file names, memfd names and metric labels, so nothing else. */
#define SHMB_POOL_NAME_MAX 32
/* A queue's name follows a pool's rule: its memfd is "<prefix>.q.<name>". */
#define SHMB_QUEUE_NAME_LEN_MAX SHMB_POOL_NAME_MAX
/* Where an overflow object's key starts; "q/<queue>/<seq>", seq in decimal
 * without leading zeros. */
#define SHMB_QUEUE_KEY_PREFIX "q/"
/* The longest overflow key, with its NUL: "q/", a name, "/", 20 digits. */
#define SHMB_QUEUE_KEY_MAX (2 + SHMB_QUEUE_NAME_LEN_MAX + 1 + 20 + 1)

/* True when name[0..len) is 1 to SHMB_POOL_NAME_MAX of [A-Za-z0-9_-] (so
 * no NUL, no '/', nothing outside ASCII). */
bool shmb_name_ok(const char *name, size_t len);

/* 0 when name (len bytes; NULL counts as empty) is a queue's name; else
 * -EINVAL with a message that quotes it back and names the rule. */
int shmb_q_name_check(const char *name, size_t len, struct shmb_error *err);

/* "q/<queue>/<seq>" into key[0..cap); its length without the NUL, or 0
 * when it does not fit. */
size_t shmb_q_key(char *key, size_t cap, const char *queue, uint64_t seq);

/* The seq of an overflow key key[0..len) whose first prefix bytes are its
 * queue's "q/<queue>/": decimal digits only, no leading zero, within 64
 * bits. False when the rest is not such a number. */
bool shmb_q_key_seq(const char *key, size_t len, size_t prefix, uint64_t *seq);

#endif
