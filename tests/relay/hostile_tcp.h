// SPDX-License-Identifier: Apache-2.0
/*
 * The hostile peer's modes that speak UCX 1.13's TCP transport by hand,
 * below UCP: each prints "closed" or "kept" and returns 0 (the relay cut
 * the connection), 1 (it kept it) or 2 (no connection).
 */
#ifndef SHMB_TESTS_HOSTILE_TCP_H
#define SHMB_TESTS_HOSTILE_TCP_H

#include <netdb.h>
#include <stdbool.h>

int tcp_put(const struct addrinfo *res, bool connreq, bool ack);
int tcp_wireup(const struct addrinfo *res, const char *how);
int tcp_cm(const struct addrinfo *res, const char *how);

#endif
