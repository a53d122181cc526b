// SPDX-License-Identifier: Apache-2.0
/*
 * Assertions about libshmbroker calls, shared by the end-to-end tests that
 * use the library: connect or fail, "this call succeeded", "this call failed
 * with that code and message", and objects with a verifiable pattern.
 */
#ifndef SHMB_TESTS_E2E_CHECKS_H
#define SHMB_TESTS_E2E_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "shmbroker.h"

/* A handle connected to d (read-only when asked), or the test fails. The
 * caller closes it. */
shmb_t *h_lib_connect(const struct h_daemon *d, const char *name, int read_only);

/* rc must be 0; otherwise the test fails showing the library's error. */
void h_check_ok(shmb_t *c, int rc, const char *what, const char *file, int line);
#define ok(c, call) h_check_ok((c), (call), #call, __FILE__, __LINE__)

/* rc and the handle's code must be code, and its message contain substr
 * (when not NULL); otherwise the test fails. */
void h_check_fails(shmb_t *c, int rc, int code, const char *substr, const char *what,
                   const char *file, int line);
#define fails(c, call, code, substr) \
    h_check_fails((c), (call), (code), (substr), #call, __FILE__, __LINE__)

/* Put size bytes of h_fill's pattern for seed under key with shmb_put. */
int h_put_pattern(shmb_t *c, const char *key, size_t size, uint32_t seed, unsigned readers);

/* Get key, check its size and h_fill's pattern for seed through the
 * zero-copy pointer, release; the test fails unless all of it works. */
void h_get_check(shmb_t *c, const char *key, size_t size, uint32_t seed, const char *file,
                 int line);
#define get_check(c, key, size, seed) h_get_check((c), (key), (size), (seed), __FILE__, __LINE__)

#endif
