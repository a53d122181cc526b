// SPDX-License-Identifier: Apache-2.0
/*
 * UCX 1.13's handlers of emulated RMA replaced before the worker is made:
 * the messages UCX handles inside its progress, before the relay hears a
 * peer's proof, that would read or write this process's memory where a
 * peer says. Knows UCX's exported handler tables, not peers or the daemon.
 */
#include <stdint.h>
#include <string.h>

#include <uct/api/uct.h>

#include "relay.h"

/* UCX emulates RMA where the transport has none (TCP) with messages of its
 * own, handled inside progress, and those handlers check no remote key and
 * no proof: any connection, before it proved the key or without it, could
 * write any byte of this process (a put) or read, and by reading an
 * unmapped address crash, any byte (a get). And a get answered on an
 * endpoint that failed meanwhile (its peer killed while the bytes moved)
 * stopped the process inside UCX (ucp_get_req_handler: "Endpoint
 * timeout"). The relay never lets a peer read by emulated RMA: where an
 * endpoint has no RMA, it sends the object's bytes itself (fetch.c), and
 * its own send fails when the peer goes. Nor does it read by emulated RMA
 * itself: a peer that answers a fetch over such an endpoint with a remote
 * key is closed (fetch.c), and over RDMA its reads are the hardware's. So
 * before the worker is made, every emulated put and get is dropped, and so
 * is every reply to an emulated get: UCX would copy a reply's bytes into
 * the request its id names, and an id whose low bit is clear is an address
 * (ucs_ptr_map_get), wherever the peer chose. The handlers are UCX 1.13's
 * exported tables, whose first two fields (the features that install a
 * handler, its callback) and the get request's first two (address, length)
 * and the reply's first (the request id) are read here; another UCX leaves
 * them alone, and the relay says so. A peer's put or get dropped never
 * completes. */
struct ucx_am_handler_head {
    uint64_t features;
    uct_am_callback_t cb;
};
extern struct ucx_am_handler_head ucp_am_handler_UCP_AM_ID_PUT __attribute__((weak));
extern struct ucx_am_handler_head ucp_am_handler_UCP_AM_ID_GET_REQ __attribute__((weak));
extern struct ucx_am_handler_head ucp_am_handler_UCP_AM_ID_GET_REP __attribute__((weak));

static ucs_status_t dropped_get_req(void *arg, void *data, size_t length, unsigned flags)
{
    uint64_t addr = 0, len = 0;
    (void)arg, (void)flags;
    if (length >= 2 * sizeof(uint64_t)) {
        memcpy(&addr, data, sizeof(addr));
        memcpy(&len, (const char *)data + sizeof(addr), sizeof(len));
    }
    relay_log("dropped a peer's emulated RMA read of %llu bytes at %#llx: over a transport "
              "without RMA the relay sends objects itself", (unsigned long long)len,
              (unsigned long long)addr);
    return UCS_OK;
}

/* A reply to an emulated read (GET_REP): the request id, the offset, the
 * bytes. The relay makes no emulated read, so every reply is a forgery. */
static ucs_status_t dropped_get_rep(void *arg, void *data, size_t length, unsigned flags)
{
    uint64_t req_id = 0;
    (void)arg, (void)flags;
    if (length >= sizeof(req_id))
        memcpy(&req_id, data, sizeof(req_id));
    relay_log("dropped a peer's emulated RMA read reply of %zu bytes naming request %#llx: "
              "this relay makes no emulated read", length, (unsigned long long)req_id);
    return UCS_OK;
}

static ucs_status_t dropped_put(void *arg, void *data, size_t length, unsigned flags)
{
    uint64_t addr = 0;
    (void)arg, (void)flags;
    if (length >= sizeof(addr))
        memcpy(&addr, data, sizeof(addr));
    relay_log("dropped a peer's emulated RMA write of %zu bytes at %#llx: peers may only "
              "read the pool", length, (unsigned long long)addr);
    return UCS_OK;
}

void ucx_guard_emulated_rma(void)
{
    unsigned major = 0, minor = 0, release = 0;

    ucp_get_version(&major, &minor, &release);
    if (major != 1 || minor != 13 || !&ucp_am_handler_UCP_AM_ID_PUT ||
        !&ucp_am_handler_UCP_AM_ID_GET_REQ || !ucp_am_handler_UCP_AM_ID_GET_REQ.cb ||
        !&ucp_am_handler_UCP_AM_ID_GET_REP || !ucp_am_handler_UCP_AM_ID_GET_REP.cb) {
        relay_log("UCX %u.%u: the relay cannot keep peers' emulated RMA (TCP) to reads of "
                  "the pool; a peer that proves the key may read and write this process",
                  major, minor);
        return;
    }
    ucp_am_handler_UCP_AM_ID_PUT.cb = dropped_put;
    ucp_am_handler_UCP_AM_ID_GET_REQ.cb = dropped_get_req;
    ucp_am_handler_UCP_AM_ID_GET_REP.cb = dropped_get_rep;
}

