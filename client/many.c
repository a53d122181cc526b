// SPDX-License-Identifier: Apache-2.0
/*
 * The library's calls on many objects: put_many, get_many and the releases
 * sent without waiting, cut into batch lines the daemon accepts. Built on
 * the machinery of client.c; knows nothing of the single-object calls.
 */
#include "internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "../proto/alloc.h"

/* put_many allocates at most this many objects per line before committing
 * them: the daemon's default --max-pending (proto/protocol.h says why). */
#define CLIENT_PUT_CHUNK SHMB_DEFAULT_MAX_PENDING

static int client_release_many(shmb_t *c, size_t n, const char *const *keys)
{
    size_t i;
    int rc;

    shmb_error_clear(&c->err);
    if ((rc = client_check_keys(c, n, keys)) < 0)
        return rc;
    c->w.len = 0;
    for (i = 0; i < n; i++) {
        /* Each line has its id too: a reply to it, which should never come,
         * is then recognised as out of step rather than taken for the next
         * call's. Sent in writes of about SHMB_MAX_LINE bytes. */
        struct client_key k = client_key_trusted(keys[i]); /* checked above */

        if ((rc = client_begin_key(c, SHMB_OP_RELEASE, client_next_id(c), &k)) < 0)
            return rc;
        if (line_lit(&c->w, ",\"noreply\":true}\n") < 0)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a request.");
        c->noreply_sent = true;
        if ((c->w.len >= SHMB_MAX_LINE || i + 1 == n) && (rc = client_send(c)) < 0)
            return rc;
        if (c->w.len >= SHMB_MAX_LINE)
            c->w.len = 0;
    }
    return 0;
}

int client_release_nowait(shmb_t *c, const char *key)
{
    return client_release_many(c, 1, &key);
}

/* One op of a _many call: op i appended to c->w as a batch element. */
typedef int (*client_op_fn)(shmb_t *c, size_t i, const void *arg);

/* Build in c->w one batch line of the ops first, first + 1, ... < n, at most
 * max of them and at most SHMB_MAX_LINE bytes (the daemon closes the
 * connection on a longer line); *count gets how many went in (at least one)
 * and *id the batch's id. */
static int client_batch_fill(shmb_t *c, size_t first, size_t n, size_t max, client_op_fn op,
                             const void *arg, size_t *count, uint64_t *id)
{
    static const char tail[] = "]}\n";
    size_t i;
    int rc;

    c->w.len = 0;
    *id = client_next_id(c);
    if (line_lit(&c->w, "{\"op\":\"") < 0 ||
        line_lit(&c->w, shmb_ops[SHMB_OP_BATCH].name) < 0 || line_lit(&c->w, "\",\"id\":") < 0 || line_u64(&c->w, *id) < 0 ||
        line_lit(&c->w, ",\"ops\":[") < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    for (i = first; i < n && i - first < max; i++) {
        size_t mark = c->w.len;

        if (i > first && line_lit(&c->w, ",") < 0)
            return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        if ((rc = op(c, i, arg)) < 0)
            return rc;
        if (c->w.len + sizeof(tail) - 1 > SHMB_MAX_LINE) {
            if (i == first) /* an op is at most a few KiB: cannot happen */
                return shmb_error_set(&c->err, -EMSGSIZE,
                                      "One batch op is longer than %d bytes.",
                                      SHMB_MAX_LINE);
            c->w.len = mark;
            break;
        }
    }
    *count = i - first;
    if (line_lit(&c->w, tail) < 0)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return 0;
}

/* Send the batch line in c->w (whose id is id, with n ops) and decode its
 * replies: res[i] gets each op's reply fields, rcs[i] its 0 or error, and
 * *failed the index of the first op that failed (n when none), whose message
 * stays in c->err. Returns the exchange's own error, or 0. */
static int client_batch_exchange(shmb_t *c, uint64_t id, size_t n, struct line_reply *res,
                                 int *rcs, size_t *failed)
{
    struct line_reply whole;
    json_t *reply = NULL, *replies;
    size_t len = 0, i;
    int rc;

    *failed = n;
    if ((rc = client_send(c)) < 0 || (rc = client_read_line(c, &len)) < 0)
        return rc;
    if (line_scan_batch(c->rbuf, c->rbuf + len, res, n, &whole) == 0) {
        char wbuf[24], gbuf[24];

        if (!whole.has_id || whole.id != id)
            return client_out_of_step(c, client_id_text(NULL, id, true, wbuf, sizeof(wbuf)),
                                      client_id_text(NULL, whole.id, whole.has_id, gbuf,
                                                     sizeof(gbuf)),
                                      len);
        client_consume(c, len);
        client_replied(c);
        memset(rcs, 0, n * sizeof(*rcs));
        return 0;
    }
    /* Some op failed (or the reply has an unusual shape): jansson. */
    if ((rc = client_decode(c, len, NULL, id, false, &reply)) < 0)
        return rc;
    replies = json_object_get(reply, "replies");
    if (!json_is_array(replies) || json_array_size(replies) != n) {
        json_decref(reply);
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's batch reply does not have %zu replies.", n);
    }
    for (i = 0; i < n; i++) {
        json_t *r = json_array_get(replies, i);
        const char *code = NULL, *message = NULL;

        memset(&res[i], 0, sizeof(res[i]));
        if (json_is_true(json_object_get(r, "ok"))) {
            client_reply_fields(r, &res[i]);
            rcs[i] = 0;
            continue;
        }
        rcs[i] = json_unpack(r, "{s:s, s:s}", "error", &code, "message", &message) == 0
                     ? shmb_error_from_name(code)
                     : -EPROTO;
        if (*failed == n) {
            *failed = i;
            shmb_error_set(&c->err, rcs[i], "%s",
                           message != NULL ? message : "malformed batch reply");
        }
    }
    json_decref(reply);
    return 0;
}

/* The first failure of a _many call so far: its index and error. */
struct client_first {
    size_t index;
    struct shmb_error err;
};

/* Remember op index's failure (its message in c->err) if it comes first. */
static void client_note_failure(shmb_t *c, struct client_first *first, size_t index)
{
    if (index < first->index) {
        first->index = index;
        first->err = c->err;
    }
}

/* The arguments of put_many's ops. */
struct client_put_args {
    size_t n;     /* keys in the whole call */
    size_t limit; /* allocations per line: CLIENT_PUT_CHUNK, less once a cap was met */
    const char *const *keys;
    const size_t *sizes;
    unsigned readers;
    const size_t *idx; /* commit/abort: the keys' indexes, in order */
    const int *ok;     /* commit/abort: 1 to commit, 0 to abort */
};

static int client_put_alloc_op(shmb_t *c, size_t i, const void *arg)
{
    const struct client_put_args *a = arg;
    /* client_check_keys passed it. */
    struct client_key k = client_key_trusted(a->keys[i]);

    return client_alloc_op(c, 0, &k, a->sizes[i], a->readers, 0);
}

static int client_put_commit_op(shmb_t *c, size_t k, const void *arg)
{
    const struct client_put_args *a = arg;
    struct client_key key = client_key_trusted(a->keys[a->idx[k]]); /* checked */
    int rc = client_begin_key(c, a->ok[k] ? SHMB_OP_COMMIT : SHMB_OP_ABORT, 0, &key);

    if (rc == 0 && line_lit(&c->w, "}") < 0)
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return rc;
}

/* put_many's work space for one chunk, CLIENT_PUT_CHUNK entries each. */
struct client_put_space {
    size_t *idx;              /* the allocated keys' indexes */
    int *ok;                  /* 1 to commit, 0 to abort */
    struct line_reply *cres; /* the commits' replies */
    int *crcs;
};

/* One chunk of put_many: allocate the keys from start on that fit one line
 * (*end gets where the chunk ends), write what was allocated, commit it
 * (abort a bad extent). rcs gets each key's result. */
static int client_put_chunk(shmb_t *c, struct client_put_args *a, const void *const *data,
                            size_t start, size_t n, size_t *end, struct line_reply *res,
                            int *rcs, struct client_put_space *sp,
                            struct client_first *first)
{
    size_t i, m = 0, k, count, failed;
    uint64_t id;
    int rc;

    if ((rc = client_batch_fill(c, start, n, a->limit, client_put_alloc_op, a,
                                &count, &id)) < 0 ||
        (rc = client_batch_exchange(c, id, count, res + start, rcs + start, &failed)) < 0)
        return rc;
    *end = start + count;
    if (failed < count)
        client_note_failure(c, first, start + failed);
    for (i = start; i < *end; i++) {
        void *dst = NULL;

        if (rcs[i] < 0)
            continue;
        sp->idx[m] = i;
        sp->ok[m] = client_extent(c, &res[i], a->sizes[i], &dst, NULL) == 0;
        if (sp->ok[m]) {
            memcpy(dst, data[i], a->sizes[i]);
        } else {
            rcs[i] = c->err.code;
            client_note_failure(c, first, i);
        }
        m++;
    }
    a->idx = sp->idx;
    a->ok = sp->ok;
    for (k = 0; k < m; k += count) {
        size_t j;

        if ((rc = client_batch_fill(c, k, m, CLIENT_PUT_CHUNK, client_put_commit_op, a,
                                    &count, &id)) < 0 ||
            (rc = client_batch_exchange(c, id, count, sp->cres, sp->crcs, &failed)) < 0)
            return rc;
        /* A commit that failed makes that object's result its error. */
        for (j = 0; j < count; j++) {
            if (sp->crcs[j] < 0 && rcs[sp->idx[k + j]] == 0) {
                rcs[sp->idx[k + j]] = sp->crcs[j];
                if (j == failed)
                    client_note_failure(c, first, sp->idx[k + j]);
            }
        }
    }
    /* The daemon's --max-pending (or allocations this handle already
     * holds) stopped the chunk part way: the allocations after the cap all
     * failed with EDQUOT. What was allocated is committed now, so the rest
     * goes again in the next chunk; only a chunk that allocated nothing
     * reports EDQUOT. */
    if (m > 0) {
        for (i = start; i < *end && rcs[i] != -EDQUOT; i++)
            ;
        if (i > start && i < *end) {
            memset(rcs + i, 0, (*end - i) * sizeof(*rcs));
            *end = i;
            if (first->index >= i)
                first->index = a->n;
            /* The cap lets about m through at a time: ask for no more, so
             * that each line makes progress without refusals to resend. */
            a->limit = m;
        }
    }
    return 0;
}

static int client_put_many(shmb_t *c, size_t n, const char *const *keys,
                           const void *const *data, const size_t *sizes, unsigned readers,
                           int *results)
{
    struct client_put_args a = {n, CLIENT_PUT_CHUNK, keys, sizes, readers, NULL, NULL};
    struct client_put_space sp = {NULL, NULL, NULL, NULL};
    struct client_first first;
    struct line_reply *res = NULL;
    int *rcs = NULL, rc = 0;
    size_t i, start = 0, end = 0, chunk = n < CLIENT_PUT_CHUNK ? n : CLIENT_PUT_CHUNK;

    shmb_error_clear(&c->err);
    first.index = n;
    if ((rc = client_check_keys(c, n, keys)) < 0)
        goto fail;
    for (i = 0; i < n; i++) {
        if ((rc = client_check_size(c, sizes[i])) < 0) {
            char why[SHMB_ERROR_MSG_MAX];

            snprintf(why, sizeof(why), "%s", c->err.message);
            rc = shmb_error_set(&c->err, -E2BIG, "sizes[%zu] of %zu: %s Nothing was sent.",
                                i, n, why);
            goto fail;
        }
    }
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    sp.idx = shmb_calloc(chunk, sizeof(*sp.idx));
    sp.ok = shmb_calloc(chunk, sizeof(*sp.ok));
    sp.cres = shmb_calloc(chunk, sizeof(*sp.cres));
    sp.crcs = shmb_calloc(chunk, sizeof(*sp.crcs));
    if (res == NULL || rcs == NULL || sp.idx == NULL || sp.ok == NULL || sp.cres == NULL ||
        sp.crcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto fail;
    }
    /* Chunk by chunk, in order: each chunk's objects are committed before
     * the next chunk is allocated. */
    for (start = 0; start < n; start = end)
        if ((rc = client_put_chunk(c, &a, data, start, n, &end, res, rcs, &sp, &first)) < 0)
            goto fail;
    for (i = 0; results != NULL && i < n; i++)
        results[i] = rcs[i];
    if (first.index < n) {
        c->err = first.err;
        rc = first.err.code;
    } else {
        shmb_error_clear(&c->err); /* refusals that were retried are not the result */
    }
    goto out;
fail:
    /* The call failed as a whole: what earlier chunks committed stays;
     * every other key gets the call's error. */
    for (i = 0; results != NULL && i < n; i++)
        results[i] = i < start && rcs != NULL ? rcs[i] : rc;
out:
    shmb_free(res);
    shmb_free(rcs);
    shmb_free(sp.idx);
    shmb_free(sp.ok);
    shmb_free(sp.cres);
    shmb_free(sp.crcs);
    return rc;
}

static int client_get_op(shmb_t *c, size_t i, const void *arg)
{
    const char *const *keys = arg;
    struct client_key k = client_key_trusted(keys[i]); /* client_check_keys passed it */
    int rc = client_begin_key(c, SHMB_OP_GET, 0, &k);

    if (rc == 0 && line_lit(&c->w, "}") < 0)
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
    return rc;
}

static int client_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                           size_t *sizes, int *results)
{
    struct client_first first;
    struct line_reply *res = NULL;
    int *rcs = NULL, rc = 0;
    size_t i, start = 0, count, failed;
    uint64_t id;

    shmb_error_clear(&c->err);
    first.index = n;
    for (i = 0; i < n; i++) {
        ptrs[i] = NULL;
        sizes[i] = 0;
    }
    if ((rc = client_check_keys(c, n, keys)) < 0)
        goto fail;
    if (n == 0)
        return 0;
    res = shmb_calloc(n, sizeof(*res));
    rcs = shmb_calloc(n, sizeof(*rcs));
    if (res == NULL || rcs == NULL) {
        rc = shmb_error_set(&c->err, -ENOMEM, "Out of memory for a batch.");
        goto fail;
    }
    for (start = 0; start < n; start += count) {
        if ((rc = client_batch_fill(c, start, n, SHMB_MAX_BATCH, client_get_op, keys, &count,
                                    &id)) < 0 ||
            (rc = client_batch_exchange(c, id, count, res + start, rcs + start, &failed)) < 0)
            goto fail;
        if (failed < count)
            client_note_failure(c, &first, start + failed);
        for (i = start; i < start + count; i++) {
            void *p = NULL;

            if (rcs[i] == 0 && (rcs[i] = client_extent(c, &res[i], 0, &p, &sizes[i])) < 0)
                client_note_failure(c, &first, i);
            ptrs[i] = p;
        }
    }
    for (i = 0; results != NULL && i < n; i++)
        results[i] = rcs[i];
    rc = 0;
    if (first.index < n) {
        c->err = first.err;
        rc = first.err.code;
    }
    goto out;
fail:
    /* The call failed as a whole; pins taken by earlier lines went with the
     * connection, or are released here, so no pointer is handed out. */
    for (i = 0; i < n; i++) {
        if (ptrs[i] != NULL && c->sock >= 0) {
            struct shmb_error saved = c->err;

            client_release_nowait(c, keys[i]);
            c->err = saved;
        }
        ptrs[i] = NULL;
        sizes[i] = 0;
        if (results != NULL)
            results[i] = rc;
    }
out:
    shmb_free(res);
    shmb_free(rcs);
    return rc;
}

int shmb_release_nowait(shmb_t *c, const char *key)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_release_nowait(c, key));
}

int shmb_release_many(shmb_t *c, size_t n, const char *const *keys)
{
    int rc = client_enter(c);

    return rc < 0 ? rc : client_done(c, client_release_many(c, n, keys));
}

int shmb_put_many(shmb_t *c, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, unsigned readers, int *results)
{
    int rc = client_enter(c);
    size_t i;

    if (rc < 0) {
        for (i = 0; results != NULL && i < n; i++)
            results[i] = rc;
        return rc;
    }
    rc = client_put_many(c, n, keys, data, sizes, readers, results);
    client_leave(c);
    return rc;
}

int shmb_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                  size_t *sizes, int *results)
{
    int rc = client_enter(c);
    size_t i;

    if (rc < 0) {
        for (i = 0; i < n; i++) {
            ptrs[i] = NULL;
            sizes[i] = 0;
            if (results != NULL)
                results[i] = rc;
        }
        return rc;
    }
    rc = client_get_many(c, n, keys, ptrs, sizes, results);
    client_leave(c);
    return rc;
}
