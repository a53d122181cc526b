// SPDX-License-Identifier: Apache-2.0
/*
 * UCX 1.13's handlers of emulated RMA replaced before the worker is made:
 * the messages UCX handles inside its progress, before the relay hears a
 * peer's proof, that would read or write this process's memory where a
 * peer says, and the connection messages (WIREUP) that UCX 1.13 asserts
 * on or follows as addresses unchecked. Knows UCX's exported handler tables
 * and the WIREUP header, not peers or the daemon.
 */
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <uct/api/uct.h>

#include "relay.h"
#include "wireup_addr.h"

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
extern struct ucx_am_handler_head ucp_am_handler_UCP_AM_ID_WIREUP __attribute__((weak));
static uct_am_callback_t ucx_wireup_cb;
static bool ucx_113;

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

/* UCX 1.13's WIREUP header (src/ucp/wireup/wireup.h, packed): type,
 * error mode, connection number (16 bits), the sender's endpoint id, ours;
 * the sender's packed worker address follows. */
#define WIREUP_HDR 20
#define WIREUP_DST_OFF 12
#define WIREUP_TYPES 6 /* PRE_REQUEST, REQUEST, REPLY, ACK, EP_CHECK, EP_REMOVED */
#define WIREUP_ERR_MODES 2 /* UCP_ERR_HANDLING_MODE_NONE, _PEER */

/* Why UCX 1.13 must not handle this WIREUP (0: it may), in why. UCX reads
 * the header and the address after it with no length (the address is
 * parsed here first, wireup_addr.c: one that does not end exactly at the
 * message's end, exceeds UCX's counts or has fields UCX asserts on or
 * follows as present when they are not is refused); it aborts on a type
 * it does not know (ucs_bug) and on an address of a version it does not
 * know; it takes our endpoint id as the endpoint's
 * address when its low bit is clear (ucs_ptr_map_get); and every type but a
 * request asserts or dereferences that endpoint with no id (0), as a
 * request does when its id is 0 but an endpoint matches (and this relay
 * makes endpoints by address and port only, whose requests name ours). */
static int wireup_refusal(const unsigned char *d, size_t length, char *why, size_t n)
{
    char addr_why[200];
    uint64_t dst;
    if (length <= WIREUP_HDR) {
        snprintf(why, n, "a WIREUP of %zu bytes, where its header alone is %d", length,
                 WIREUP_HDR);
        return -1;
    }
    memcpy(&dst, d + WIREUP_DST_OFF, sizeof(dst));
    if (d[0] >= WIREUP_TYPES || d[1] >= WIREUP_ERR_MODES) {
        snprintf(why, n, "a WIREUP of type %u and error mode %u, which UCX 1.13 does "
                 "not send", d[0], d[1]);
        return -1;
    }
    if ((d[WIREUP_HDR] & 0xf) > 1) {
        /* The address's version: UCX 1.13 knows 0 and 1, and asserts. */
        snprintf(why, n, "a WIREUP of type %u whose address is of version %u, which UCX "
                 "1.13 does not know", d[0], d[WIREUP_HDR] & 0xf);
        return -1;
    }
    if (!(dst & 1)) {
        snprintf(why, n, "a WIREUP of type %u naming this relay's endpoint by %s %#llx",
                 d[0], dst ? "the address" : "no id,", (unsigned long long)dst);
        return -1;
    }
    if (wireup_addr_check(d + WIREUP_HDR, length - WIREUP_HDR, WIREUP_ADDR_WIREUP, NULL,
                          addr_why, sizeof(addr_why)) < 0) {
        snprintf(why, n, "a WIREUP of type %u whose worker address (%zu bytes) UCX 1.13 "
                 "would misread: %s", d[0], length - WIREUP_HDR, addr_why);
        return -1;
    }
    if (!tcp_guard_wireup_fits(d[0], dst)) {
        snprintf(why, n, "a WIREUP of type %u to this relay's endpoint %#llx, which sent "
                 "nothing that asks for it (or on a connection already cut)", d[0],
                 (unsigned long long)dst);
        return -1;
    }
    return 0;
}

/* UCX's WIREUP handler, called only for a message that passes
 * wireup_refusal; another is dropped, counted and logged as a refusal, and
 * its TCP connection cut (the sender is a stranger or broken: nothing of
 * this relay waits on a message that was never UCX's to send). */
static ucs_status_t checked_wireup(void *arg, void *data, size_t length, unsigned flags)
{
    char why[320];
    int fd;
    if (wireup_refusal(data, length, why, sizeof(why)) == 0)
        return ucx_wireup_cb(arg, data, length, flags);
    fd = tcp_guard_cut_receiving();
    if (fd >= 0)
        relay_log_refusal("cut a connection of UCX's TCP transport on descriptor %d: it "
                          "sent %s (dropped before UCX read it)", fd, why);
    else
        relay_log_refusal("dropped %s before UCX read it", why);
    return UCS_OK;
}

/* UCX's WIREUP handler wrapped in checked_wireup, on UCX 1.13 only. */
static void guard_wireup(void)
{
    if (!&ucp_am_handler_UCP_AM_ID_WIREUP || !ucp_am_handler_UCP_AM_ID_WIREUP.cb) {
        relay_log("UCX 1.13 without its WIREUP handler table: malformed connection "
                  "messages from admitted addresses may stop the relay");
        return;
    }
    if (ucp_am_handler_UCP_AM_ID_WIREUP.cb != checked_wireup) {
        ucx_wireup_cb = ucp_am_handler_UCP_AM_ID_WIREUP.cb;
        ucp_am_handler_UCP_AM_ID_WIREUP.cb = checked_wireup;
    }
}

/* UCX 1.13's ucp_conn_request_t (src/ucp/core/ucp_ep.h): the sockaddr
 * data, then the client's packed worker address, follow it in the same
 * allocation, copied from the connection's private data. */
struct ucx_conn_request {
    void *listener, *uct_listener, *uct_req;
    uint8_t cm_idx;
    char dev_name[UCT_DEVICE_NAME_MAX];
    void *remote_dev_addr;
    struct sockaddr_storage client_address;
    void *ep;
};
#define SA_DATA_BASE 9    /* the client's endpoint id, a header byte */
#define SA_DATA_V1 11     /* and an address mode and a device index */
#define SA_DATA_VERSION_SHIFT 5

int ucx_guard_conn_request(ucp_conn_request_h req, const struct sockaddr_storage *client,
                           const char *host, const char *port)
{
    const struct ucx_conn_request *cr = (const void *)req;
    const unsigned char *sa = (const unsigned char *)(cr + 1);
    size_t len = malloc_usable_size((void *)req), at;
    char addr_why[200];

    /* The layout is UCX 1.13's: the client's address, which UCX told the
     * relay, must be where it says. */
    if (!ucx_113)
        return 0;
    if (len < sizeof(*cr) + SA_DATA_BASE ||
        memcmp(&cr->client_address, client, sizeof(struct sockaddr_in)) != 0) {
        static bool told;
        if (!told)
            relay_log("UCX's connection request is not laid out as UCX 1.13's: the worker "
                      "address a connecting host sends goes unchecked");
        told = true;
        return 0;
    }
    len -= sizeof(*cr);
    /* Another sockaddr data version, or address mode, UCX refuses itself. */
    at = (sa[SA_DATA_BASE - 1] >> SA_DATA_VERSION_SHIFT) == 0 ? SA_DATA_V1 : SA_DATA_BASE;
    if (len <= at ||
        wireup_addr_check(sa + at, len - at, WIREUP_ADDR_CONN_REQUEST, NULL, addr_why,
                          sizeof(addr_why)) == 0)
        return 0;
    relay_log_refusal("refused a connection from %s:%s: its request's worker address UCX "
                      "1.13 would misread: %s", host, port, addr_why);
    return -EINVAL;
}

void ucx_guard_emulated_rma(void)
{
    unsigned major = 0, minor = 0, release = 0;

    ucp_get_version(&major, &minor, &release);
    if (major != 1 || minor != 13 || !&ucp_am_handler_UCP_AM_ID_PUT ||
        !&ucp_am_handler_UCP_AM_ID_GET_REQ || !ucp_am_handler_UCP_AM_ID_GET_REQ.cb ||
        !&ucp_am_handler_UCP_AM_ID_GET_REP || !ucp_am_handler_UCP_AM_ID_GET_REP.cb) {
        relay_log("UCX %u.%u: the relay cannot keep peers' emulated RMA (TCP) to reads of "
                  "the pool, nor check UCP's WIREUP; a peer that proves the key may read "
                  "and write this process, and an admitted address may stop it",
                  major, minor);
        return;
    }
    ucp_am_handler_UCP_AM_ID_PUT.cb = dropped_put;
    ucp_am_handler_UCP_AM_ID_GET_REQ.cb = dropped_get_req;
    ucp_am_handler_UCP_AM_ID_GET_REP.cb = dropped_get_rep;
    ucx_113 = true;
    guard_wireup();
}

