/*
 * Allocation wrapper with a failure injector for chaos tests.
 */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static unsigned long alloc_count;
static unsigned long alloc_fail_at; /* absolute count that fails, 0 = never */

/* True when this allocation is the one a test asked to fail. */
static int alloc_should_fail(void)
{
    alloc_count++;
    return alloc_fail_at != 0 && alloc_count == alloc_fail_at;
}

void *shmb_malloc(size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *shmb_calloc(size_t count, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *shmb_realloc(void *ptr, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return realloc(ptr, size ? size : 1);
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
    free(ptr);
}

void shmb_alloc_fail_at(unsigned long n)
{
    alloc_fail_at = n ? alloc_count + n : 0;
}

unsigned long shmb_alloc_count(void)
{
    return alloc_count;
}
