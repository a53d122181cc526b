// SPDX-License-Identifier: Apache-2.0
/*
 * The library's calls on one object: alloc, commit, abort, put, get,
 * release, touch, delete, contains. Each is one request and one reply
 * through the machinery of client.c.
 */
#include "internal.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <string.h>

/* The start of a call on one key: client_enter, then the key's one check
 * (into *k), before it goes down. 0 inside the call (the caller ends it
 * with client_leave), or the refusal, the call ended already. */
static int client_enter_key(shmb_t *c, const char *key, struct client_key *k)
{
    int rc = client_enter(c);

    if (rc < 0)
        return rc;
    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key, k)) < 0)
        client_leave(c);
    return rc;
}

/* A call whose request is only the key, between client_enter and
 * client_leave. */
static int client_key_call(shmb_t *c, enum shmb_op_id op, const char *key)
{
    struct client_key k;
    int rc = client_enter_key(c, key, &k);

    return rc < 0 ? rc : client_done(c, client_key_op(c, op, &k, NULL));
}

int client_alloc(shmb_t *c, const struct client_key *key, size_t size, unsigned readers,
                 void **ptr)
{
    struct line_reply r;
    uint64_t id;
    int rc;

    *ptr = NULL;
    shmb_error_clear(&c->err);
    c->w.len = 0;
    if ((rc = client_check_size(c, size)) < 0 ||
        (rc = client_alloc_op(c, id = client_next_id(c), key, size, readers,
                              c->alloc_wait_ms)) < 0)
        return rc;
    if (line_lit(&c->w, "\n") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
    if ((rc = client_exchange(c, id, &r)) < 0)
        return rc;
    return client_extent(c, &r, size, ptr, NULL);
}

int shmb_alloc(shmb_t *c, const char *key, size_t size, unsigned readers, void **ptr)
{
    struct client_key k;
    int rc;

    *ptr = NULL;
    if ((rc = client_enter_key(c, key, &k)) < 0)
        return rc;
    rc = client_alloc(c, &k, size, readers, ptr);
    client_leave(c);
    return rc;
}

int shmb_commit(shmb_t *c, const char *key)
{
    return client_key_call(c, SHMB_OP_COMMIT, key);
}

int shmb_abort(shmb_t *c, const char *key)
{
    return client_key_call(c, SHMB_OP_ABORT, key);
}

/* A put in two round trips: alloc, memcpy, commit; what shmb_put (arena.c)
 * falls back to without an arena. */
int client_put_copy(shmb_t *c, const struct client_key *key, const void *data,
                    size_t size, unsigned readers)
{
    void *dst;
    int rc;

    if ((rc = client_alloc(c, key, size, readers, &dst)) < 0)
        return rc;
    memcpy(dst, data, size);
    return client_key_op(c, SHMB_OP_COMMIT, key, NULL);
}

int client_get(shmb_t *c, const struct client_key *key, const void **ptr, size_t *size)
{
    struct line_reply r;
    void *p = NULL;
    int rc;

    *ptr = NULL;
    *size = 0;
    rc = client_key_op(c, SHMB_OP_GET, key, &r);
    if (rc == 0)
        rc = client_extent(c, &r, 0, &p, size);
    *ptr = p;
    return rc;
}

int shmb_get(shmb_t *c, const char *key, const void **ptr, size_t *size)
{
    struct client_key k;
    int rc;

    *ptr = NULL;
    *size = 0;
    if ((rc = client_enter_key(c, key, &k)) < 0)
        return rc;
    rc = client_get(c, &k, ptr, size);
    client_leave(c);
    return rc;
}

int shmb_release(shmb_t *c, const char *key)
{
    return client_key_call(c, SHMB_OP_RELEASE, key);
}

static int client_touch(shmb_t *c, const char *key, unsigned readers)
{
    struct client_key k;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key, &k)) < 0)
        return rc;
    return client_call(c,
                       json_pack("{s:s, s:s, s:I}", "op", shmb_ops[SHMB_OP_TOUCH].name,
                                 "key", key, "readers", (json_int_t)readers),
                       NULL);
}

int shmb_touch(shmb_t *c, const char *key, unsigned readers)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_touch(c, key, readers));
}

int shmb_delete(shmb_t *c, const char *key)
{
    return client_key_call(c, SHMB_OP_DELETE, key);
}

static int client_contains(shmb_t *c, const char *key)
{
    struct line_reply r;
    struct client_key k;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_key(c, key, &k)) < 0 ||
        (rc = client_key_op(c, SHMB_OP_CONTAINS, &k, &r)) < 0)
        return rc;
    return r.exists ? 1 : 0;
}

int shmb_contains(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_contains(c, key));
}
