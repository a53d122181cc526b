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

/* Where the address comes from, which sets what UCX unpacks with it:
 * a WIREUP's (UCP_ADDRESS_PACK_FLAGS_ALL: a version 0 address always has a
 * uuid, a worker name is skipped, each interface carries its resource
 * index), or a sockaddr connection request's private data (the connection
 * manager's flags: none of those; its device addresses are replaced by
 * the connection's own, and the data's exact length is not known: len is
 * a bound, not the end). */
enum wireup_addr_form { WIREUP_ADDR_WIREUP, WIREUP_ADDR_CONN_REQUEST };

/* 0 when UCX 1.13 (not in unified mode) may read the len bytes at addr as
 * a worker address of that form: it parses exactly to len (within len for
 * a connection request), within UCX's counts and with none of the fields
 * UCX asserts on, or dereferences as present when they are not (a TCP
 * interface's port of no bytes). Else -EINVAL and what is wrong, with its
 * offset, in why (n bytes). info may be NULL. */
int wireup_addr_check(const unsigned char *addr, size_t len, enum wireup_addr_form form,
                      struct wireup_addr_info *info, char *why, size_t n);

#endif
