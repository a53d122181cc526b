// SPDX-License-Identifier: Apache-2.0
/*
 * The library's report of the broadcast queues (shmb_queue_list,
 * shmb_queue_summary): the one place that knows the queue_list reply's
 * shape, so that the ctl only formats. Knows nothing of a queue's mapping
 * or its data path (queue.c).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../proto/alloc.h"
#include "internal.h"

/* A string field of a report, "" when absent or null (a name that a
 * pool's group= hides from this peer). */
static const char *client_queue_str(const json_t *obj, const char *field)
{
    const char *s = json_string_value(json_object_get(obj, field));

    return s != NULL ? s : "";
}

/* An integer field of a report, dflt when absent or null. */
static int64_t client_queue_int(const json_t *obj, const char *field, int64_t dflt)
{
    const json_t *v = json_object_get(obj, field);

    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

/* Fill one queue's entry (its seats at seat_list, when the reply has them)
 * from its object. */
static int client_queue_fill(shmb_t *c, const json_t *item, shmb_queue_info_t *o,
                             shmb_queue_seat_info_t *seat_list)
{
    const json_t *writer = json_object_get(item, "writer");
    const json_t *blocker = json_object_get(item, "blocker");
    const json_t *seats = json_object_get(item, "seat_list");
    uint64_t v[9];
    size_t i;
    int rc;

    if (!json_is_object(item) || (!json_is_string(json_object_get(item, "name")) &&
                                  !json_is_null(json_object_get(item, "name"))))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's queue_list reply has a queue without a "
                              "\"name\".");
    if ((rc = client_u64(c, item, "seats", &v[0])) < 0 ||
        (rc = client_u64(c, item, "slots", &v[1])) < 0 ||
        (rc = client_u64(c, item, "slot_size", &v[2])) < 0 ||
        (rc = client_u64(c, item, "size", &v[3])) < 0 ||
        (rc = client_u64(c, item, "messages", &v[4])) < 0 ||
        (rc = client_u64(c, item, "depth", &v[5])) < 0 ||
        (rc = client_u64(c, item, "seats_live", &v[6])) < 0 ||
        (rc = client_u64(c, item, "seats_dead", &v[7])) < 0 ||
        (rc = client_u64(c, item, "seats_free", &v[8])) < 0)
        return rc;
    o->name = client_queue_str(item, "name");
    o->pool = client_queue_str(item, "pool");
    o->state = client_queue_str(item, "state");
    o->seats = (uint32_t)v[0];
    o->slots = v[1];
    o->slot_size = v[2];
    o->size = v[3];
    o->messages = v[4];
    o->depth = v[5];
    o->seats_live = (uint32_t)v[6];
    o->seats_dead = (uint32_t)v[7];
    o->seats_free = (uint32_t)v[8];
    o->temporary = json_is_true(json_object_get(item, "temporary"));
    o->writer_waiting = json_is_true(json_object_get(item, "writer_waiting"));
    o->readers_waiting = (uint32_t)client_queue_int(item, "readers_waiting", 0);
    o->has_writer = json_is_object(writer);
    o->writer_client = client_queue_int(writer, "client", -1);
    o->writer_pid = client_queue_int(writer, "pid", -1);
    o->writer_name = client_queue_str(writer, "name");
    o->blocker_seat =
        json_is_object(blocker) ? (int)client_queue_int(blocker, "seat", -1) : -1;
    o->blocker_client = client_queue_int(blocker, "client", -1);
    o->blocker_pid = client_queue_int(blocker, "pid", -1);
    o->blocker_name = client_queue_str(blocker, "name");
    o->blocker_behind = (uint64_t)client_queue_int(blocker, "behind", 0);
    o->nseats = json_array_size(seats);
    o->seat_list = seat_list;
    for (i = 0; i < o->nseats; i++) {
        const json_t *s = json_array_get(seats, i);

        seat_list[i].seat = (uint32_t)client_queue_int(s, "seat", (int64_t)i);
        seat_list[i].state = client_queue_str(s, "state");
        seat_list[i].client = client_queue_int(s, "client", -1);
        seat_list[i].pid = client_queue_int(s, "pid", -1);
        seat_list[i].name = client_queue_str(s, "name");
        seat_list[i].behind = (uint64_t)client_queue_int(s, "behind", 0);
    }
    return 0;
}

/* Decode a queue_list reply into one block that keeps the reply (whose
 * strings the entries point at). */
static int client_queue_list_decode(shmb_t *c, json_t *reply, shmb_queue_list_t **out)
{
    const json_t *items = json_object_get(reply, "queues");
    shmb_queue_list_t *list;
    shmb_queue_info_t *queues;
    shmb_queue_seat_info_t *seats;
    size_t i, n, nseats = 0;
    int rc;

    if (!json_is_array(items))
        return shmb_error_set(&c->err, -EPROTO,
                              "shmbrokerd's reply lacks an array \"queues\".");
    n = json_array_size(items);
    for (i = 0; i < n; i++)
        nseats += json_array_size(json_object_get(json_array_get(items, i), "seat_list"));
    list = shmb_calloc(1, sizeof(*list) + n * sizeof(*queues) + nseats * sizeof(*seats));
    if (list == NULL)
        return shmb_error_set(&c->err, -ENOMEM, "Out of memory for a list of %zu queues.",
                              n);
    queues = (shmb_queue_info_t *)(list + 1);
    seats = (shmb_queue_seat_info_t *)(queues + n);
    for (i = 0; i < n; i++) {
        if ((rc = client_queue_fill(c, json_array_get(items, i), &queues[i], seats)) <
            0) {
            shmb_free(list);
            return rc;
        }
        seats += queues[i].nseats;
    }
    list->count = n;
    list->queues = queues;
    list->reply = json_incref(reply);
    *out = list;
    return 0;
}

/* queue_list, with each queue's seats when seats. */
static int client_queue_list(shmb_t *c, bool seats, shmb_queue_list_t **out)
{
    json_t *reply = NULL;
    int rc;

    shmb_error_clear(&c->err);
    rc = client_call(c,
                     seats ? json_pack("{s:s, s:b}", "op", shmb_ops[SHMB_OP_QUEUE_LIST].name,
                                       "seats", 1)
                           : json_pack("{s:s}", "op", shmb_ops[SHMB_OP_QUEUE_LIST].name),
                     &reply);
    if (rc == 0)
        rc = client_queue_list_decode(c, reply, out);
    json_decref(reply);
    return rc;
}

int shmb_queue_list(shmb_t *c, shmb_queue_list_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_queue_list(c, true, out));
}

int shmb_queue_summary(shmb_t *c, shmb_queue_list_t **out)
{
    int rc = client_enter(c);

    *out = NULL;
    return rc < 0 ? rc : client_done(c, client_queue_list(c, false, out));
}

void shmb_queue_list_free(shmb_queue_list_t *list)
{
    if (list == NULL)
        return;
    json_decref(list->reply);
    shmb_free(list);
}
