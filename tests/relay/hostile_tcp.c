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
 * gone), and the relay keeps the connection (exit 1). */
#define GUESSES 20
int tcp_wireup(const struct addrinfo *res, const char *how)
{
    unsigned char m[8 + 5 + 13 + 28 + GUESSES * (5 + 30)] = {0}, *w;
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
    } else if (strcmp(how, "pre") != 0) {
        fprintf(stderr, "relay-hostile-peer: no wireup mode %s\n", how);
        close(fd);
        return 2;
    }
    memcpy(w + 4, &src, 8);
    memcpy(w + 12, &dst, 8);
    if (strcmp(how, "version") != 0)
        w[20] = 0x20; /* version 0 (UCX's V1), flag 2: a worker uuid follows */
    memcpy(w + 21, &uuid, 8);
    w[29] = 0xff; /* UCP_NULL_RESOURCE: no device */
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
