// SPDX-License-Identifier: Apache-2.0
/*
 * Who may connect and how much a client may leave unread: plain numbers that
 * config fills in from flags and the server enforces at accept and on every
 * write. Knows nothing about sockets, the loop or the store.
 */
#ifndef SHMB_POLICY_H
#define SHMB_POLICY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define POLICY_MAX_ALLOW 64 /* entries in each of --allow-uid and --allow-gid */

/* Who may connect, how many, and how much output a client may leave unread. */
struct policy {
    unsigned max_clients;
    unsigned max_clients_per_uid;
    size_t max_queued_output;
    uint64_t hello_timeout_ms; /* close connections silent this long before
                                  hello; 0 = never */
    uid_t allow_uid[POLICY_MAX_ALLOW];
    size_t n_allow_uid;
    gid_t allow_gid[POLICY_MAX_ALLOW];
    size_t n_allow_gid;
};

#endif
