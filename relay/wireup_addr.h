// SPDX-License-Identifier: Apache-2.0
/*
 * The worker address UCX 1.13 packs after a WIREUP's header, parsed within
 * the message's length before UCX reads it (UCX's ucp_address_unpack reads
 * it with no length). Knows UCX 1.13's packed address format and its
 * bounds; not peers, streams or the handler it is called from.
 */
#ifndef SHMB_RELAY_WIREUP_ADDR_H
#define SHMB_RELAY_WIREUP_ADDR_H

#include <stddef.h>

/* What a fair address told: how many transport addresses it carries. */
struct wireup_addr_info {
    unsigned devices;
    unsigned entries;
};

/* 0 when UCX 1.13 (not in unified mode) may read the len bytes at addr as
 * a WIREUP's worker address: it parses exactly to len, within UCX's counts
 * and with none of the fields UCX asserts on, or dereferences as present
 * when they are not (a TCP interface's port of no bytes). Else -EINVAL and
 * what is wrong, with its offset, in why (n bytes). info may be NULL. */
int wireup_addr_check(const unsigned char *addr, size_t len, struct wireup_addr_info *info,
                      char *why, size_t n);

#endif
