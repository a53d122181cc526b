// SPDX-License-Identifier: Apache-2.0
/*
 * The hostile peer's modes below UCP: UCX 1.13's TCP transport spoken by
 * hand on the relay's UCT TCP interface, after the magic number (and a
 * connection request), where UCX handles what arrives before the relay
 * hears any proof of the key.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "hostile_tcp.h"

/* The relay sends little back on such a stream (a put's ack, a connection's
 * acknowledgement): read until it closes or 3 s pass, print "closed" or
 * "kept" and return 0 or 1. */
static int await_close(int fd)
{
    struct timeval tv = {3, 0};
    char got[64];
    ssize_t n;

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    while ((n = recv(fd, got, sizeof(got), 0)) > 0)
        ;
    bool closed_it = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    close(fd);
    printf("%s\n", closed_it ? "closed" : "kept");
    fflush(stdout);
    return closed_it ? 0 : 1;
}

/* UCX 1.13's TCP transport by hand: the magic number a connecting side
 * sends first, then a PUT request (an AM header of id 33 and length 20:
 * address, length, sequence number) and its 8 bytes, "OWNED!!!", for
 * $HOSTILE_ADDR. The receiving UCX copies such bytes wherever the request
 * says, before any proof of the key (UCP's own ucp_put_nbx over TCP goes as
 * UCP's emulated put instead, which the relay drops: hence by hand). Prints
 * "closed" when the relay ends the connection within 3 s, else "kept" (exit
 * 0 or 1; 2 when it cannot connect). With connreq, a connection request
 * whose address has IPv6's size instead, which UCX 1.13 asserts against
 * (aborting) on an IPv4 stream; with ack, a put's acknowledgement for no put
 * (UCX asserts that one is awaited). */
int tcp_put(const struct addrinfo *res, bool connreq, bool ack)
{
    unsigned char m[8 + 5 + 41];
    uint64_t magic = 0xCAFEBABE12345678ull, len = 8;
    uint32_t hlen = 20, sn = 1;
    const char *a = getenv("HOSTILE_ADDR");
    uint64_t addr = a ? strtoull(a, NULL, 0) : 0x1000;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);

    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        perror("relay-hostile-peer: connect");
        return 2;
    }
    memcpy(m, &magic, 8);
    m[8] = 33; /* UCT_TCP_EP_PUT_REQ_AM_ID: UCT_AM_ID_MAX + 1 */
    memcpy(m + 9, &hlen, 4);
    memcpy(m + 13, &addr, 8);
    memcpy(m + 21, &len, 8);
    memcpy(m + 29, &sn, 4);
    memcpy(m + 33, "OWNED!!!", 8);
    size_t n_m = sizeof(m);
    if (connreq) {
        /* A connection request (UCT_TCP_EP_CM_AM_ID 32, event 1) of 41
         * bytes: its address the size of an IPv6 one, on an IPv4 stream. */
        uint32_t cl = 41, ev = 1;
        memset(m + 8, 0, sizeof(m) - 8);
        m[8] = 32;
        memcpy(m + 9, &cl, 4);
        memcpy(m + 13, &ev, 4);
        n_m = 8 + 5 + 41;
    } else if (ack) {
        /* A put's acknowledgement (UCT_TCP_EP_PUT_ACK_AM_ID 34) of sequence
         * number 2^32 - 1, for a put never made: UCX 1.13 asserts that its
         * endpoint awaits one (and aborts). */
        uint32_t al = 4, asn = UINT32_MAX;
        m[8] = 34;
        memcpy(m + 9, &al, 4);
        memcpy(m + 13, &asn, 4);
        n_m = 8 + 5 + 4;
    }
    if (send(fd, m, n_m, MSG_NOSIGNAL) != (ssize_t)n_m) {
        perror("relay-hostile-peer: send");
        return 2;
    }
    return await_close(fd);
}

/* A fair worker address as UCX 1.13 packs it into a WIREUP (version 0,
 * a worker uuid; one TCP device with its IPv4 address, one interface of
 * transport checksum 0x19cf with its port and an endpoint address for lane
 * 1; then the loopback device): the base the a-* modes below spoil. */
static const unsigned char fair_addr[] = {
    0x20, 0x1b, 0x40, 0x79, 0x58, 0x4f, 0xf9, 0x01, 0x1e,             /* 0 */
    0x20, 0x06, 0x00, 0x02, 0x0a, 0xd5, 0x54, 0x02,                   /* 9 */
    0xcf, 0x19, 0x17, 0xb7, 0x51, 0x38, 0x57, 0x74, 0x8d, 0x4e,       /* 17 */
    0x71, 0x6a, 0xb0, 0x36, 0x01, 0x13, 0x23, 0x00, 0x00,             /* 27 */
    0xc2, 0xe1, 0xad, 0x0a, 0xe1, 0xad, 0x05, 0, 0, 0, 0, 0, 0, 0,   /* 36 */
    0x81,                                                             /* 50 */
    0x20, 0x92, 0x01, 0x02, 0xbd, 0x4a, 0xd5, 0xda, 0x42, 0x76, 0xb0, /* 51 */
    0xc3, 0x96, 0x01, 0x00, 0xf0, 0, 0, 0, 0,                         /* 62 */
    0xcf, 0x19, 0x17, 0xb7, 0x51, 0x38, 0x53, 0x9e, 0x3e, 0x4b,       /* 71 */
    0xd7, 0xe0, 0x37, 0x37, 0x01, 0x13, 0x23, 0x00, 0x01,             /* 81 */
    0x82, 0xaf, 0x8f,                                                 /* 90 */
};
#define WIREUP_ADDR_MAX (65536 - 5 - 5 - 20) /* UCX's receive buffer, less headers */

/* The worker address of mode a-HOW into w (room for WIREUP_ADDR_MAX),
 * its length; 0 for no such mode. Each is the fair address spoiled where
 * UCX 1.13's ucp_address_unpack or what follows it trusts the sender: cut
 * (cuthdr: inside the uuid; cutdev: inside the device address; cutattr:
 * inside the interface's attributes; cutep: inside the endpoint address),
 * nodev (a TCP device address of no bytes: UCX passes NULL for it to the
 * transport's reachability check), noiface (the same for the interface's
 * port), family (a TCP device address of family 99), runon (empty devices,
 * none marked last, to the end of UCX's receive buffer), devs (200 devices:
 * UCX counts remote devices in arrays of 128 and maps of 64 bits), lane (an
 * endpoint address for lane 63, of UCX's 6), csum (an unknown transport),
 * sysdev (a system device 200, of UCX's 64), paths (a device of 0 paths),
 * nan (a bandwidth that is not a number), mdidx (a version 1 address whose
 * memory domain index is 255, of UCX's 64), hugelen (a version 1 address
 * whose device address says 255 bytes, past the message), v1segN (a fair
 * version 1 address whose interface takes active messages of N times 64
 * bytes: UCX 1.13 aborts on 0). */
static size_t hostile_addr(const char *how, unsigned char *w)
{
    size_t n = sizeof(fair_addr);
    memcpy(w, fair_addr, n);
    if (strcmp(how, "cuthdr") == 0)
        return 4;
    if (strcmp(how, "cutdev") == 0)
        return 14;
    if (strcmp(how, "cutattr") == 0)
        return 25;
    if (strcmp(how, "cutep") == 0)
        return 44;
    if (strcmp(how, "nodev") == 0 || strcmp(how, "noiface") == 0 ||
        strcmp(how, "family") == 0) {
        /* One device, its one interface without endpoint addresses. */
        w[10] = 0x86;
        w[36] = 0x82;
        n = 39;
        if (how[2] == 'd') { /* nodev: the device's 6 bytes go */
            w[10] = 0x80;
            memmove(w + 11, w + 17, n - 17);
            n -= 6;
        } else if (how[2] == 'i') { /* noiface: the port goes */
            w[36] = 0x80;
            n = 37;
        } else {
            w[12] = 99;
        }
        return n;
    }
    if (strcmp(how, "runon") == 0) {
        for (n = 9; n + 2 <= WIREUP_ADDR_MAX; n += 2)
            w[n] = 0x80, w[n + 1] = 0x00; /* an empty device, not the last */
        return n;
    }
    if (strcmp(how, "devs") == 0) {
        for (n = 9; n < 9 + 2 * 200; n += 2)
            w[n] = 0x80, w[n + 1] = 0x00;
        memcpy(w + n, fair_addr + 9, sizeof(fair_addr) - 9);
        return n + sizeof(fair_addr) - 9;
    }
    if (strcmp(how, "lane") == 0) {
        w[50] = 0x80 | 0x3f;
    } else if (strcmp(how, "csum") == 0) {
        w[17] = 0x5a, w[18] = 0xa5;
    } else if (strcmp(how, "sysdev") == 0 || strcmp(how, "paths") == 0) {
        /* One more byte after the device's length byte: its system device
         * (flag 0x20) or its number of paths (flag 0x40). */
        memmove(w + 12, w + 11, n - 11);
        w[10] |= how[0] == 's' ? 0x20 : 0x40;
        w[11] = how[0] == 's' ? 200 : 0;
        n++;
    } else if (strcmp(how, "nan") == 0) {
        w[23] = 0x01, w[24] = 0x00, w[25] = 0xc0, w[26] = 0x7f; /* bandwidth */
    } else if (strcmp(how, "mdidx") == 0 || strcmp(how, "hugelen") == 0) {
        /* Version 1: a second header byte for the flags; 8 bytes of
         * attributes (fp8s, a priority, a segment size, flags). */
        static const unsigned char v1[] = {
            0x01, 0x02, 0x1b, 0x40, 0x79, 0x58, 0x4f, 0xf9, 0x01, 0x1e,
            0x7f, 200, 0x86, 0x00, 0x02, 0x0a, 0xd5, 0x54, 0x02, 0xcf, 0x19,
            0x10, 0x90, 0x10, 0x01, 0x00, 0x04, 0x00, 0x00, 0x00, 0x82, 0xe1, 0xad};
        memcpy(w, v1, sizeof(v1));
        n = sizeof(v1);
        if (how[0] == 'h') {
            w[10] = 0x00, w[11] = 0x9f, w[12] = 0xff; /* md 0; a length of 255 */
            n = 19;
        }
    } else if (strncmp(how, "v1seg", 5) == 0) {
        /* A fair version 1 address of one device (UCX_ADDRESS_VERSION=v2),
         * its receive segment 64 bytes times the number after "v1seg". */
        static const unsigned char v1[] = {
            0x01, 0x02, 0x45, 0xbf, 0xf7, 0x07, 0x1a, 0x40, 0x17, 0x73, 0x00, 0x86, 0x00,
            0x02, 0x0a, 0xd5, 0xf7, 0x02, 0xcf, 0x19, 0x0c, 0x12, 0x49, 0x01, 0x80, 0x00,
            0x8b, 0x00, 0x01, 0x82, 0xcf, 0xad};
        unsigned seg = (unsigned)strtoul(how + 5, NULL, 0);
        memcpy(w, v1, sizeof(v1));
        w[24] = seg & 0xff, w[25] = seg >> 8;
        n = sizeof(v1);
    } else {
        return 0;
    }
    return n;
}

/* A UCP WIREUP (UCT AM id 1) by hand, after the magic number and a fair
 * connection request (event 1, no flags, this stream's own address): its
 * header (type, error mode, connection number, the sender's endpoint id,
 * ours) and an empty worker address (version 1 header, a uuid, no device).
 * HOW: "pre" a pre-request naming no endpoint of ours (id 0: UCX 1.13
 * asserts at wireup.c:469), "ack" an acknowledgement naming none (UCX
 * dereferences the missing endpoint), "addr" a reply naming ours by an
 * address, 0x4141414141414140 (its low bit clear: UCX takes it as the
 * endpoint itself), "short" 12 bytes (less than the 20 of its header),
 * "type" a type 9 (ucs_bug), "version" an address of version 7 (UCX asserts
 * it knows it), "mode" an error mode 200, "guessack" acknowledgements to
 * the ids UCX gives endpoints first (3, 5, ... 41: some are endpoints that
 * sent no reply, and UCX 1.13 asserts that they did); the relay must cut
 * each. And
 * "unknownep", an endpoint check naming an endpoint id that is no
 * endpoint's (its low bit set): UCX answers it itself (that endpoint is
 * gone), and the relay keeps the connection (exit 1). "a-HOW": such an
 * endpoint check, whose worker address is hostile_addr's (UCX unpacks it
 * and makes an endpoint to it). */
#define GUESSES 20
int tcp_wireup(const struct addrinfo *res, const char *how)
{
    static unsigned char m[8 + 5 + 13 + 128 + 5 + 20 + WIREUP_ADDR_MAX + GUESSES * (5 + 30)];
    unsigned char *w;
    uint64_t magic = 0xCAFEBABE12345678ull, src = 3, dst = 0, uuid = 0x5eed;
    uint32_t ev = 1, cl, wl = 20 + 10;
    struct sockaddr_storage me = {0};
    socklen_t ml = sizeof(me);
    size_t n = 0;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);

    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&me, &ml) < 0) {
        perror("relay-hostile-peer: connect");
        return 2;
    }
    memcpy(m, &magic, 8);
    cl = 13 + ml;
    m[8] = 32; /* UCT_TCP_EP_CM_AM_ID */
    memcpy(m + 9, &cl, 4);
    memcpy(m + 13, &ev, 4); /* then flags 0 and a connection id 0 */
    memcpy(m + 26, &me, ml);
    n = 26 + ml;
    w = m + n + 5;
    w[0] = 0; /* type, error mode, conn_sn, src, dst, then the address */
    if (strcmp(how, "ack") == 0) {
        w[0] = 3;
    } else if (strcmp(how, "addr") == 0) {
        w[0] = 2, dst = 0x4141414141414140ull;
    } else if (strcmp(how, "short") == 0) {
        wl = 12;
    } else if (strcmp(how, "type") == 0) {
        w[0] = 9;
    } else if (strcmp(how, "version") == 0) {
        w[0] = 1, w[20] = 7;
    } else if (strcmp(how, "mode") == 0) {
        w[0] = 1, w[1] = 200;
    } else if (strcmp(how, "guessack") == 0) {
        w[0] = 3, dst = 3;
    } else if (strcmp(how, "unknownep") == 0) {
        w[0] = 4, dst = 0x100001;
    } else if (strncmp(how, "a-", 2) == 0) {
        w[0] = 4, dst = 0x100001; /* an endpoint check: UCX unpacks its address */
        wl = hostile_addr(how + 2, w + 20);
        if (!wl) {
            fprintf(stderr, "relay-hostile-peer: no wireup mode %s\n", how);
            close(fd);
            return 2;
        }
        wl += 20;
    } else if (strcmp(how, "pre") != 0) {
        fprintf(stderr, "relay-hostile-peer: no wireup mode %s\n", how);
        close(fd);
        return 2;
    }
    memcpy(w + 4, &src, 8);
    memcpy(w + 12, &dst, 8);
    if (strncmp(how, "a-", 2) == 0) {
        ; /* the address is in place */
    } else {
        if (strcmp(how, "version") != 0)
            w[20] = 0x20; /* version 0 (UCX's V1), flag 2: a worker uuid follows */
        memcpy(w + 21, &uuid, 8);
        w[29] = 0xff; /* UCP_NULL_RESOURCE: no device */
    }
    m[n] = 1; /* UCP_AM_ID_WIREUP */
    memcpy(m + n + 1, &wl, 4);
    n += 5 + wl;
    for (int i = 1; strcmp(how, "guessack") == 0 && i < GUESSES; i++, n += 5 + wl) {
        memcpy(m + n, m + n - 5 - wl, 5 + wl); /* the next id: 5, 7, ... */
        dst += 2;
        memcpy(m + n + 5 + 12, &dst, 8);
    }
    if (send(fd, m, n, MSG_NOSIGNAL) != (ssize_t)n) {
        perror("relay-hostile-peer: send");
        close(fd);
        return 2;
    }
    return await_close(fd);
}

/* UCX 1.13's sockaddr connection (the TCP connection manager, the
 * --listen port) by hand: the private data's header (its length, a status,
 * padded to 16 bytes), then UCP's sockaddr data (the client's endpoint id,
 * its error mode, the address mode 2 "CM address", a device index) and the
 * client's worker address (version 1, no uuid: UCX unpacks it with the
 * connection manager's flags, without resource indices). HOW: "seg0", one
 * TCP interface that takes active messages in segments of 0 bytes; "fair",
 * the same with segments of 8 KiB. The relay admits B's address, makes an
 * endpoint for the request, and UCX reads the address. */
int tcp_cm(const struct addrinfo *res, const char *how)
{
    unsigned char m[16 + 64] = {0}, *d = m + 16;
    uint64_t len, ep_id = 0x3;
    static const unsigned char addr[] = {
        0x01, 0x00,                                     /* version 1, no flags */
        0x00, 0x80,                                     /* md 0; last device, no address */
        0xcf, 0x19, 0x0c, 0x12, 0x49, 0x01, 0x80, 0x00, 0x8b, 0x00, /* tcp, 8 KiB */
        0xc2, 0xcf, 0xad,                               /* last, endpoint addresses, port */
        0x0a, 0xcf, 0xad, 0x05, 0, 0, 0, 0, 0, 0, 0, 0x80}; /* lane 0, last */
    int fd = socket(res->ai_family, SOCK_STREAM, 0);

    if (strcmp(how, "seg0") != 0 && strcmp(how, "fair") != 0) {
        fprintf(stderr, "relay-hostile-peer: no cm mode %s\n", how);
        return 2;
    }
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        perror("relay-hostile-peer: connect");
        return 2;
    }
    memcpy(d, &ep_id, 8);
    d[8] = 1;    /* UCP_ERR_HANDLING_MODE_PEER */
    d[9] = 2;    /* UCP_WIREUP_SA_DATA_CM_ADDR */
    d[10] = 0;   /* device index */
    memcpy(d + 11, addr, sizeof(addr));
    if (strcmp(how, "seg0") == 0)
        d[11 + 10] = 0; /* the segment: 0 */
    len = 11 + sizeof(addr);
    memcpy(m, &len, 8);
    if (send(fd, m, 16 + len, MSG_NOSIGNAL) != (ssize_t)(16 + len)) {
        perror("relay-hostile-peer: send");
        close(fd);
        return 2;
    }
    return await_close(fd);
}
