// SPDX-License-Identifier: Apache-2.0
/*
 * The room a directory has for a segment: free space, huge pages, the page
 * size, the hint to grow it, a path in it. Knows nothing of a segment's file.
 */
#ifndef SHMB_SPACE_H
#define SHMB_SPACE_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/error.h"

/* statfs's f_type of a hugetlbfs mount (linux/magic.h). */
#define SEGMENT_HUGETLBFS_MAGIC 0x958458f6

/* Fail with -ENOSPC and vLLM's message when dir cannot hold required bytes;
 * -ENOENT/-ENOTDIR when dir is missing. Reports what is free in *free_bytes
 * when that is not NULL: what statvfs says, or on hugetlbfs the free huge
 * pages of the mount's page size (bounded by its size= when it has one). */
int segment_check_space(const char *dir, uint64_t required, uint64_t *free_bytes,
                        struct shmb_error *err);

/* segment_check_space counting reclaim bytes as free (the files of
 * segments about to be replaced), with the same message. */
int segment_check_space_reclaim(const char *dir, uint64_t required, uint64_t reclaim,
                                uint64_t *free_bytes, struct shmb_error *err);

/* The bytes removing dir/name would give back: its blocks, when it is a
 * regular file nothing else links; else 0. */
uint64_t segment_reclaimable(const char *dir, const char *name);

/* segment_check_space for a segment that replaces dir/name (--fresh): the
 * space that file holds counts as free, so the check can run before the old
 * segment is removed. */
int segment_check_replace(const char *dir, const char *name, uint64_t required,
                          struct shmb_error *err);

/* The page size of dir: its huge page size on a hugetlbfs mount (a segment
 * there must be a whole number of them), else SHMB_HEADER_PAGE. */
uint64_t segment_page_size(const char *dir);

/* How to give dir more room, for a message ending "..., or choose a smaller
 * ...": written into out (len bytes), which is returned. */
const char *segment_grow_hint(const char *dir, char *out, size_t len);

/* Build dir/name into out; -ENAMETOOLONG (with a message when err is not
 * NULL) when it does not fit. */
int segment_join_path(char *out, size_t len, const char *dir, const char *name,
                      struct shmb_error *err);

#endif
