// SPDX-License-Identifier: Apache-2.0
/*
 * Objects of several frames: shmb_put_frames writes n buffers as one
 * payload in the frames layout (proto/frames.h), straight into one
 * allocation; shmb_get_frames pins such an object and hands out a pointer
 * per frame. Built on the one-object calls of objects.c; the layout itself
 * is proto's.
 */
#include "internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../proto/frames.h"
#include "../proto/text.h"

size_t shmb_frames_size(size_t n, const size_t *lengths)
{
    uint64_t size = n > 0 && lengths == NULL ? 0 : frames_size(n, lengths);

    return size > SIZE_MAX ? 0 : (size_t)size;
}

/* Everything that could refuse the call is checked before the alloc, so
 * that nothing can fail between the alloc and the commit. The payload's
 * size in *total. */
static int frames_check_put(shmb_t *c, const char *key, struct client_key *k, size_t n,
                            const shmb_frame_t *frames, uint64_t *total)
{
    uint64_t end, offset;
    size_t i;
    int rc;

    if ((rc = client_check_key(c, key, k)) < 0)
        return rc;
    if (n > FRAMES_MAX)
        return shmb_error_set(&c->err, -EINVAL,
                              "%zu frames: an object holds at most %u. Put the rest in "
                              "another object, or join small frames into one.",
                              n, FRAMES_MAX);
    if (n > 0 && frames == NULL)
        return shmb_error_set(&c->err, -EINVAL, "frames is NULL, and n is %zu.", n);
    end = frames_header_size(n);
    for (i = 0; i < n; i++) {
        if (frames[i].data == NULL && frames[i].size > 0)
            return shmb_error_set(&c->err, -EINVAL, "frames[%zu].data is NULL, and its size %zu.",
                                  i, frames[i].size);
        if (frames_step(&end, frames[i].size, &offset) < 0 || end > SIZE_MAX)
            return shmb_error_set(&c->err, -E2BIG,
                                  "Object size (more than 2^63 bytes once frames[%zu] of %zu "
                                  "bytes is added, %zu frames in all) exceeds max object size "
                                  "(%llu bytes).",
                                  i, frames[i].size, n,
                                  (unsigned long long)(c->info.max_object_size != 0
                                                           ? c->info.max_object_size
                                                           : FRAMES_SIZE_LIMIT));
    }
    *total = end;
    return 0;
}

static int client_put_frames(shmb_t *c, const char *key, size_t n, const shmb_frame_t *frames,
                             unsigned readers)
{
    struct shmb_error commit_err;
    struct client_key k;
    uint64_t total = 0, end, offset;
    unsigned char *dst;
    void *p;
    size_t i;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = frames_check_put(c, key, &k, n, frames, &total)) < 0 ||
        (rc = client_alloc(c, &k, (size_t)total, readers, &p)) < 0)
        return rc;
    dst = p;
    frames_put_header(dst, n);
    end = frames_header_size(n);
    for (i = 0; i < n; i++) {
        uint64_t prev = end;

        frames_step(&end, frames[i].size, &offset); /* frames_check_put passed it */
        frames_put_length(dst, i, frames[i].size);
        /* The gap before a frame is zeros, not an earlier object's bytes. */
        memset(dst + prev, 0, (size_t)(offset - prev));
        if (frames[i].size > 0)
            memcpy(dst + offset, frames[i].data, frames[i].size);
    }
    rc = client_key_op(c, SHMB_OP_COMMIT, &k, NULL);
    if (rc < 0) {
        /* The allocation is normally gone already (it expired, or went with
         * the connection); should it not be, it must not wait for its
         * timeout. The commit's error is the one to report. */
        commit_err = c->err;
        (void)client_key_op(c, SHMB_OP_ABORT, &k, NULL);
        c->err = commit_err;
    }
    return rc;
}

int shmb_put_frames(shmb_t *c, const char *key, size_t n, const shmb_frame_t *frames,
                    unsigned readers)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_put_frames(c, key, n, frames, readers));
}

/* Fill frames[0..w->count) from a walk over payload. */
static int frames_fill(struct frames_walk *w, const unsigned char *payload,
                       shmb_frame_t *frames, struct shmb_error *err)
{
    uint64_t offset, length;
    size_t i;
    int rc;

    for (i = 0; (rc = frames_next(w, &offset, &length, err)) > 0; i++) {
        frames[i].data = payload + offset;
        frames[i].size = (size_t)length;
    }
    return rc;
}

static int client_get_frames(shmb_t *c, const char *key, shmb_frame_t *frames, size_t max,
                             size_t *n)
{
    char shown[SHMB_ESCAPED_MAX(SHMB_KEY_MAX_LEN)], released[SHMB_ERROR_MSG_MAX];
    struct shmb_error err;
    struct frames_walk w;
    struct client_key k;
    const void *p;
    size_t size;
    int rc;

    *n = 0;
    if (max > 0 && frames == NULL) {
        shmb_error_clear(&c->err);
        return shmb_error_set(&c->err, -EINVAL, "frames is NULL, and max is %zu.", max);
    }
    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key, &k)) < 0 ||
        (rc = client_get(c, &k, &p, &size)) < 0)
        return rc;
    shmb_error_clear(&err);
    rc = frames_open(&w, p, size, &err);
    if (rc == 0 && w.count > max) {
        *n = w.count;
        rc = shmb_error_set(&err, -ENOBUFS,
                            "Object '%s' holds %zu frames, more than the %zu asked for; its "
                            "pin was released. Call again with max of at least %zu.",
                            shmb_escape(key, strlen(key), shown, sizeof(shown)), w.count, max,
                            w.count);
    }
    if (rc == 0 && (rc = frames_fill(&w, p, frames, &err)) == 0) {
        *n = w.count;
        return 0;
    }
    /* Not handed out: the pin goes now, and the caller reads why. */
    if (rc != -ENOBUFS) {
        size_t i;

        *n = 0;
        for (i = 0; i < max && i < w.count; i++)
            frames[i] = (shmb_frame_t){NULL, 0};
    }
    if (client_key_op(c, SHMB_OP_RELEASE, &k, NULL) < 0) {
        snprintf(released, sizeof(released), "%s", c->err.message);
        shmb_error_set(&c->err, rc, "%s Releasing its pin failed too: %s", err.message,
                       released);
    } else {
        c->err = err;
    }
    return rc;
}

int shmb_get_frames(shmb_t *c, const char *key, shmb_frame_t *frames, size_t max, size_t *n)
{
    int rc = client_enter(c);

    if (rc < 0) {
        *n = 0;
        return rc;
    }
    return client_done(c, client_get_frames(c, key, frames, max, n));
}
