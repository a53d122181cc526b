/*
 * Allocation wrapper with a failure injector for chaos tests.
 */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static unsigned long alloc_count;
static unsigned long alloc_fail_at; /* absolute count that fails, 0 = never */
static long alloc_live;             /* blocks handed out and not yet freed */

/* True when this allocation is the one a test asked to fail. */
static int alloc_should_fail(void)
{
    alloc_count++;
    return alloc_fail_at != 0 && alloc_count == alloc_fail_at;
}

void *shmb_malloc(size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = malloc(size ? size : 1);
    alloc_live += p != NULL;
    return p;
}

void *shmb_calloc(size_t count, size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = calloc(count ? count : 1, size ? size : 1);
    alloc_live += p != NULL;
    return p;
}

void *shmb_realloc(void *ptr, size_t size)
{
    void *p;

    if (alloc_should_fail())
        return NULL;
    p = realloc(ptr, size ? size : 1);
    alloc_live += ptr == NULL && p != NULL;
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
    alloc_live -= ptr != NULL;
    free(ptr);
}

long shmb_alloc_live(void)
{
    return alloc_live;
}

void shmb_alloc_fail_at(unsigned long n)
{
    alloc_fail_at = n ? alloc_count + n : 0;
}

unsigned long shmb_alloc_count(void)
{
    return alloc_count;
}
