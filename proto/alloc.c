// SPDX-License-Identifier: Apache-2.0
/*
 * Allocation wrapper with a failure injector for chaos tests. The counters
 * are atomic: the library links this file, and its users may run one handle
 * per thread.
 */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Relaxed atomics: each counter is only counted, never used to order other
 * memory, and an increment costs little beside a malloc. */
static atomic_ulong alloc_count;
static atomic_ulong alloc_fail_at; /* absolute count that fails, 0 = never */
static atomic_long alloc_live;     /* blocks handed out and not yet freed */

/* True when this allocation is the one a test asked to fail. */
static int alloc_should_fail(void)
{
    unsigned long n = atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed) + 1;
    unsigned long fail_at = atomic_load_explicit(&alloc_fail_at, memory_order_relaxed);

    return fail_at != 0 && n == fail_at;
}

/* Count a block handed out (p not NULL) or given back (delta -1). */
static void alloc_count_live(long delta)
{
    atomic_fetch_add_explicit(&alloc_live, delta, memory_order_relaxed);
}

void *shmb_malloc(size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = malloc(size ? size : 1);
    if (p != NULL)
        alloc_count_live(1);
    return p;
}

void *shmb_calloc(size_t count, size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = calloc(count ? count : 1, size ? size : 1);
    if (p != NULL)
        alloc_count_live(1);
    return p;
}

void *shmb_realloc(void *ptr, size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = realloc(ptr, size ? size : 1);
    if (ptr == NULL && p != NULL)
        alloc_count_live(1);
    return p;
}

char *shmb_strndup(const char *s, size_t len)
{
    char *copy = shmb_malloc(len + 1);

    if (copy == NULL)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    return copy;
}

void shmb_free(void *ptr)
{
    if (ptr != NULL)
        alloc_count_live(-1);
    free(ptr);
}

long shmb_alloc_live(void)
{
    return atomic_load_explicit(&alloc_live, memory_order_relaxed);
}

void shmb_alloc_fail_at(unsigned long n)
{
    atomic_store_explicit(&alloc_fail_at,
                          n ? atomic_load_explicit(&alloc_count, memory_order_relaxed) + n
                            : 0,
                          memory_order_relaxed);
}

unsigned long shmb_alloc_fail_pause(void)
{
    unsigned long at = atomic_exchange_explicit(&alloc_fail_at, 0, memory_order_relaxed);
    unsigned long now = atomic_load_explicit(&alloc_count, memory_order_relaxed);

    return at > now ? at - now : 0;
}

unsigned long shmb_alloc_count(void)
{
    return atomic_load_explicit(&alloc_count, memory_order_relaxed);
}
