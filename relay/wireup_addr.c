// SPDX-License-Identifier: Apache-2.0
/*
 * UCX 1.13's packed worker address (src/ucp/wireup/address.c, the form
 * ucp_address_unpack reads when the worker is not in unified mode), parsed
 * byte by byte within the length the WIREUP carrying it has, with UCX's
 * own bounds. Knows the format and UCX's limits; not peers, streams, nor
 * who calls it.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "wireup_addr.h"

/* UCX 1.13's bounds (src/ucp/core/ucp_types.h, wireup/select.c): the
 * transport addresses it unpacks into an array of UCP_MAX_RESOURCES, an
 * endpoint's lanes, the memory domains and system devices it keeps in
 * 64-bit maps, and the remote devices it counts in a 64-bit map (an index
 * past it shifts out of the map, and past 128 writes outside select.c's
 * remote_dev_count). */
#define MAX_RESOURCES 128
#define MAX_LANES 6
#define MAX_MDS 64
#define MAX_SYS_DEVICES 64
#define MAX_DEVICES 64

/* The header's flags (UCP_ADDRESS_HEADER_FLAG_*): debug info (a worker
 * name), a worker uuid, a client id, only active messages. */
#define HDR_DEBUG_INFO 0x1
#define HDR_WORKER_UUID 0x2
#define HDR_CLIENT_ID 0x4
#define HDR_KNOWN 0xf
/* The flags in a device's, an interface's and a lane's bytes. */
#define FLAG_LAST 0x80
#define DEV_NUM_PATHS 0x40
#define DEV_SYS_DEVICE 0x20
#define DEV_LEN_MASK 0x1f
#define MD_EMPTY_DEV 0x80
#define IFACE_HAS_EP_ADDR 0x40
#define IFACE_LEN_MASK 0x3f
#define NULL_RESOURCE 0xff
/* UCX's checksum of the transport's name "tcp" (CRC-16/X-25): its device
 * address (flags, family, then an IPv4 or IPv6 address, or 16 bytes naming
 * a network namespace for the loopback device), its port, and an
 * endpoint's port and id, all read by libuct with no length. */
#define TL_TCP 0x19cf
#define TCP_DEV_LOOPBACK 0x1
#define TCP_LOCAL_NS 16
#define TCP_IFACE_LEN 2
#define TCP_EP_LEN 10
/* A version 1 interface's receive segment is in units of 64 bytes; one
 * that takes active messages (UCP_ADDR_IFACE_FLAG_AM_SYNC, _CB_ASYNC) and
 * says less than 512 bytes is refused: UCX 1.13 bounds the endpoint's
 * messages by it and aborts where the relay's own remote key does not fit
 * (ucp_ep.c:2634 "rkey_size <= am.max_bcopy", on a segment of 0). UCX's
 * transports take 8 KiB (TCP, shared memory, RC) or an MTU's worth (UD). */
#define SEG_UNIT 64
#define SEG_MIN 512
#define IFACE_FLAGS_AM 0x6

struct cursor {
    const unsigned char *p;
    size_t len, off;
    unsigned version; /* UCX's UCP_OBJECT_VERSION_V1 is 0, V2 is 1 */
    bool wireup;      /* a WIREUP's address, not a connection request's */
    struct wireup_addr_info *info;
    char *why;
    size_t n;
};

/* Says what is wrong at the cursor's offset; -EINVAL. */
__attribute__((format(printf, 2, 3))) static int refuse(struct cursor *c, const char *fmt,
                                                        ...)
{
    va_list ap;
    int k = snprintf(c->why, c->n, "at byte %zu of %zu: ", c->off, c->len);
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < c->n)
        vsnprintf(c->why + k, c->n - k, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* k bytes at the cursor, in *out (NULL: skipped), or a refusal. */
static int take(struct cursor *c, size_t k, const unsigned char **out, const char *what)
{
    if (out)
        *out = c->p;
    if (c->len - c->off < k)
        return refuse(c, "%s of %zu bytes runs past the address's end", what, k);
    if (out)
        *out = c->p + c->off;
    c->off += k;
    return 0;
}

static int take_byte(struct cursor *c, unsigned *v, const char *what)
{
    const unsigned char *b = NULL;
    int rc = take(c, 1, &b, what);
    *v = rc == 0 ? *b : 0;
    return rc;
}

/* A value in the low bits of a byte (mask), whose flags are in *flags;
 * in version 1 a value of all those bits set is in the next byte instead
 * (ucp_address_unpack_byte_extended). */
static int take_extended(struct cursor *c, unsigned mask, unsigned *v, unsigned *flags,
                         const char *what)
{
    unsigned b = 0;
    int rc = take_byte(c, &b, what);
    if (rc < 0)
        return rc;
    *flags = b & ~mask & 0xff;
    *v = b & mask;
    if (c->version == 1 && *v == mask)
        rc = take_byte(c, v, what);
    return rc;
}

/* The header: version, flags, then the uuid, client id and worker name
 * they say follow (a WIREUP's version 0 address always has a uuid: UCX
 * 1.13 reads one there whatever its flags say; a connection request's is
 * never read for a worker name). */
static int header(struct cursor *c)
{
    unsigned h = 0, flags = 0, name_len = 0;
    int rc = take_byte(c, &h, "the header");
    if (rc < 0)
        return rc;
    c->version = h & 0xf;
    if (c->version > 1)
        return refuse(c, "an address of version %u, which UCX 1.13 does not know (it "
                      "asserts on it)", c->version);
    flags = h >> 4;
    if (c->version == 1 && (rc = take_byte(c, &flags, "the header's flags")) < 0)
        return rc;
    if (flags & ~HDR_KNOWN)
        return refuse(c, "header flags %#x, of which UCX 1.13 knows %#x", flags, HDR_KNOWN);
    if (((c->version == 0 && c->wireup) || (flags & HDR_WORKER_UUID)) &&
        (rc = take(c, 8, NULL, "the worker's uuid")) < 0)
        return rc;
    if ((flags & HDR_CLIENT_ID) && (rc = take(c, 8, NULL, "the client id")) < 0)
        return rc;
    if ((flags & HDR_DEBUG_INFO) && c->wireup) {
        if ((rc = take_byte(c, &name_len, "the worker name's length")) < 0)
            return rc;
        rc = take(c, name_len, NULL, "the worker name");
    }
    return rc;
}

/* A TCP device address: what uct_tcp_iface_is_reachable and the
 * connection to it read (the family, then its address or namespace). A
 * connection request's are the connection's own, not the address's. */
static int tcp_device(struct cursor *c, const unsigned char *dev, unsigned len)
{
    unsigned want;
    if (len < 2)
        return refuse(c, "a TCP device address of %u bytes, where UCX reads at least 2 (a "
                      "device address of none is passed to it as NULL)", len);
    if (dev[0] & ~TCP_DEV_LOOPBACK)
        return refuse(c, "a TCP device address with flags %#x, of which UCX 1.13 knows %#x",
                      dev[0], TCP_DEV_LOOPBACK);
    if (dev[1] != AF_INET && dev[1] != AF_INET6)
        return refuse(c, "a TCP device address of family %u, neither IPv4 (%d) nor IPv6 "
                      "(%d)", dev[1], AF_INET, AF_INET6);
    want = 2 + ((dev[0] & TCP_DEV_LOOPBACK) ? TCP_LOCAL_NS : dev[1] == AF_INET ? 4 : 16);
    if (len != want)
        return refuse(c, "a TCP device address of %u bytes, where its family and flags "
                      "make %u", len, want);
    return 0;
}

/* The endpoint addresses after an interface's (its lanes'), up to the one
 * whose lane byte is marked last. */
static int ep_addrs(struct cursor *c, bool tcp)
{
    unsigned count = 0, len = 0, lane = 0;
    int rc;
    do {
        if (++count > MAX_LANES)
            return refuse(c, "more than %d endpoint addresses for one interface",
                          MAX_LANES);
        if ((rc = take_byte(c, &len, "an endpoint address's length")) < 0 ||
            (rc = take(c, len, NULL, "an endpoint address")) < 0)
            return rc;
        if (tcp && len != TCP_EP_LEN)
            return refuse(c, "a TCP endpoint address of %u bytes, where UCX reads %d",
                          len, TCP_EP_LEN);
        if ((rc = take_byte(c, &lane, "an endpoint address's lane")) < 0)
            return rc;
        if ((lane & IFACE_LEN_MASK) >= MAX_LANES || (lane & ~(FLAG_LAST | IFACE_LEN_MASK)))
            return refuse(c, "an endpoint address for lane %u (byte %#x), where UCX 1.13 "
                          "has %d lanes", lane & IFACE_LEN_MASK, lane, MAX_LANES);
    } while (!(lane & FLAG_LAST));
    return 0;
}

/* One interface (a transport on the device): the transport's checksum,
 * its attributes, its address, then its endpoint addresses if it says so. */
static int iface(struct cursor *c, const unsigned char *dev, unsigned dev_len, bool *last)
{
    const unsigned char *csum = NULL, *attr = NULL;
    unsigned len = 0, flags = 0;
    float f[3];
    bool tcp;
    int rc;

    if (++c->info->entries > MAX_RESOURCES)
        return refuse(c, "more than %d transport addresses", MAX_RESOURCES);
    if ((rc = take(c, 2, &csum, "a transport's checksum")) < 0)
        return rc;
    tcp = (csum[0] | csum[1] << 8) == TL_TCP;
    /* Version 0: overhead, bandwidth and latency as floats and 32 bits of
     * priority and flags; version 1: 8 bytes; then the resource index. */
    if ((rc = take(c, (c->version == 0 ? 16 : 8) + c->wireup, &attr,
                   "an interface's attributes")) < 0)
        return rc;
    if (c->version == 1 && (attr[6] & IFACE_FLAGS_AM) &&
        (attr[4] | attr[5] << 8) * SEG_UNIT < SEG_MIN)
        return refuse(c, "an interface taking active messages of %u bytes at most, where "
                      "UCX 1.13 needs room for its remote keys (the relay asks for %d)",
                      (attr[4] | attr[5] << 8) * SEG_UNIT, SEG_MIN);
    if (c->version == 0) {
        memcpy(f, attr, sizeof(f));
        if (!isfinite(f[0]) || !isfinite(f[1]) || !isfinite(f[2]) || f[1] == 0)
            return refuse(c, "an interface whose overhead, bandwidth or latency is %g, %g, "
                          "%g (UCX computes with them)", f[0], f[1], f[2]);
    }
    if (c->wireup && attr[c->version == 0 ? 16 : 8] >= MAX_RESOURCES)
        return refuse(c, "an interface of resource index %u, of UCX's %d",
                      attr[c->version == 0 ? 16 : 8], MAX_RESOURCES);
    if ((rc = take_extended(c, IFACE_LEN_MASK, &len, &flags, "an interface's length")) < 0 ||
        (rc = take(c, len, NULL, "an interface address")) < 0)
        return rc;
    *last = flags & FLAG_LAST;
    if (tcp && c->wireup && (rc = tcp_device(c, dev, dev_len)) < 0)
        return rc;
    if (tcp && len != TCP_IFACE_LEN)
        return refuse(c, "a TCP interface address of %u bytes, where UCX reads %d (one of "
                      "none is passed to it as NULL)", len, TCP_IFACE_LEN);
    return (flags & IFACE_HAS_EP_ADDR) ? ep_addrs(c, tcp) : 0;
}

/* One device: its memory domain, its address, then its interfaces unless
 * it is marked empty; *last when it is the address's last. */
static int device(struct cursor *c, bool *last)
{
    const unsigned char *dev = NULL;
    unsigned md = 0, md_flags = 0, len = 0, flags = 0, v = 0;
    bool last_tl = false;
    int rc;

    if (++c->info->devices > MAX_DEVICES)
        return refuse(c, "more than %d devices", MAX_DEVICES);
    if ((rc = take_extended(c, c->version == 0 ? 0x1f : 0x7f, &md, &md_flags,
                            "a device's memory domain")) < 0)
        return rc;
    if (md >= MAX_MDS)
        return refuse(c, "a device of memory domain %u, of UCX's %d", md, MAX_MDS);
    if ((rc = take_extended(c, DEV_LEN_MASK, &len, &flags, "a device's length")) < 0)
        return rc;
    *last = flags & FLAG_LAST;
    if (flags & DEV_NUM_PATHS) {
        if ((rc = take_byte(c, &v, "a device's number of paths")) < 0)
            return rc;
        if (v == 0)
            return refuse(c, "a device of 0 paths (UCX asserts at least 1)");
    }
    if (flags & DEV_SYS_DEVICE) {
        if ((rc = take_byte(c, &v, "a device's system device")) < 0)
            return rc;
        if (v >= MAX_SYS_DEVICES)
            return refuse(c, "a device of system device %u, of UCX's %d", v,
                          MAX_SYS_DEVICES);
    }
    if ((rc = take(c, len, &dev, "a device address")) < 0)
        return rc;
    while (!(md_flags & MD_EMPTY_DEV) && !last_tl)
        if ((rc = iface(c, dev, len, &last_tl)) < 0)
            return rc;
    return 0;
}

int wireup_addr_check(const unsigned char *addr, size_t len, enum wireup_addr_form form,
                      struct wireup_addr_info *info, char *why, size_t n)
{
    struct wireup_addr_info none;
    struct cursor c = {.p = addr, .len = len, .wireup = form == WIREUP_ADDR_WIREUP,
                       .info = info ? info : &none, .why = why, .n = n};
    bool last = false;
    int rc;

    memset(c.info, 0, sizeof(*c.info));
    if ((rc = header(&c)) < 0)
        return rc;
    if (c.off < len && addr[c.off] == NULL_RESOURCE) {
        c.off++; /* no device */
    } else {
        while (!last)
            if ((rc = device(&c, &last)) < 0)
                return rc;
    }
    if (c.off != len && c.wireup)
        return refuse(&c, "%zu bytes follow the address", len - c.off);
    return 0;
}
