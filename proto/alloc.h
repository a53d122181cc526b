// SPDX-License-Identifier: Apache-2.0
/*
 * The one allocation wrapper every shmbroker module goes through, so that a
 * test can fail the Nth allocation (as jansson's test_chaos does) and prove
 * that every failure becomes an error, never a crash or a leak.
 */
#ifndef SHMB_PROTO_ALLOC_H
#define SHMB_PROTO_ALLOC_H

#include <stddef.h>

/* malloc/calloc/realloc/free that honour the failure injector below. The
 * caller owns what they return. */
void *shmb_malloc(size_t size);
void *shmb_calloc(size_t count, size_t size);
void *shmb_realloc(void *ptr, size_t size);
char *shmb_strndup(const char *s, size_t len);
void shmb_free(void *ptr);

/* Make the Nth allocation from now fail (1 = the next one); 0 turns it off.
 * For tests only. */
void shmb_alloc_fail_at(unsigned long n);

/* Turn the injector off, returning how many allocations from now the
 * failure was due (0: none was); shmb_alloc_fail_at(that) turns it back on
 * where it was. For a test's own work between the code under test (jansson
 * 2.14's parser crashes on a failed allocation, so a test parses replies
 * with the injector paused). */
unsigned long shmb_alloc_fail_pause(void);

/* How many allocations have been requested since start; for tests. */
unsigned long shmb_alloc_count(void);

/* Blocks allocated through this wrapper and not yet freed; for leak tests. */
long shmb_alloc_live(void);

#endif
