// SPDX-License-Identifier: Apache-2.0
/*
 * Who may connect to the relay: the --allow-from ranges (parsed as hostile
 * text), the configured peers' addresses as resolved at start, and accept()
 * closing any other connection before UCX reads a byte of it. peer.c asks
 * here before it makes an endpoint; nothing here knows about endpoints,
 * peers' state or what they send.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay.h"

/* UCX's thread reads these (accept below): set before UCX starts. */
static const struct relay *admitting_relay;
static int (*libc_accept)(int, struct sockaddr *, socklen_t *);

/* Up to 80 bytes of text from outside, for a message: bytes that are not
 * printable ASCII (control bytes, UTF-8 or not) become '?'. */
static const char *printable(const char *s, char *out, size_t n)
{
    size_t i;
    for (i = 0; i + 1 < n && i < 80 && s[i]; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = 0;
    return out;
}

/* One --allow-from range into r->allow, refused with a message when it is
 * not an address, its prefix not a number of bits, or bits are set past it. */
int admit_allow_from(struct relay *r, const char *text, struct shmb_error *err)
{
    struct allow_range a = {0};
    char addr[INET6_ADDRSTRLEN], shown[96], net[INET6_ADDRSTRLEN];
    const char *slash = strchr(text, '/');
    size_t al = slash ? (size_t)(slash - text) : strlen(text);
    unsigned max, len;

    if (r->nallow >= RELAY_ALLOW_MAX)
        return shmb_error_set(
            err, -E2BIG,
            "More than %d --allow-from ranges: give the network's prefix "
            "(such as 10.0.0.0/8) rather than its hosts one by one.",
            RELAY_ALLOW_MAX);
    if (al > 0 && al < sizeof(addr)) {
        memcpy(addr, text, al);
        addr[al] = 0;
    } else
        addr[0] = 0;
    if (inet_pton(AF_INET, addr, a.addr) == 1)
        a.family = AF_INET, max = 32;
    else if (inet_pton(AF_INET6, addr, a.addr) == 1)
        a.family = AF_INET6, max = 128;
    else
        return shmb_error_set(
            err, -EINVAL,
            "--allow-from takes ADDR or ADDR/PREFIX, an IPv4 or IPv6 "
            "address (not a host name), such as 10.0.0.0/8 or fd00::/64; "
            "'%s' is not one.",
            printable(text, shown, sizeof(shown)));
    if (a.family == AF_INET6 && IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)a.addr)) {
        /* The listener sees an IPv4 client as IPv4 (ip_of): a mapped range
         * would be taken and admit no one. */
        inet_ntop(AF_INET, a.addr + 12, net, sizeof(net));
        return shmb_error_set(err, -EINVAL,
                              "--allow-from '%s' is an IPv4 address mapped into IPv6, "
                              "which the relay sees as IPv4: write it as IPv4 (%s, with "
                              "its prefix less 96).",
                              printable(text, shown, sizeof(shown)), net);
    }
    a.prefix = max;
    if (slash) {
        const char *d = slash + 1;
        size_t dl = strlen(d);
        if (dl == 0 || dl > 3 || strspn(d, "0123456789") != dl ||
            (dl > 1 && d[0] == '0') || (a.prefix = (unsigned)atoi(d)) > max)
            return shmb_error_set(
                err, -EINVAL,
                "The prefix of --allow-from '%s' is not a number of bits "
                "from 0 to %u.",
                printable(text, shown, sizeof(shown)), max);
    }
    /* Bits set past the prefix are a typo more often than not (10.1.2.3/8
     * for 10.1.2.3/32?): say which network it would be. */
    len = max / 8;
    for (unsigned bit = a.prefix; bit < max; bit++)
        if (a.addr[bit / 8] & (0x80 >> (bit % 8))) {
            unsigned char m[16];
            memcpy(m, a.addr, len);
            for (unsigned b = a.prefix; b < max; b++)
                m[b / 8] &= (unsigned char)~(0x80 >> (b % 8));
            inet_ntop(a.family, m, net, sizeof(net));
            return shmb_error_set(err, -EINVAL,
                                  "--allow-from '%s' has address bits set past its /%u "
                                  "prefix: write the network, %s/%u, or the one address, "
                                  "%s.",
                                  printable(text, shown, sizeof(shown)), a.prefix, net,
                                  a.prefix, addr);
        }
    r->allow[r->nallow++] = a;
    return 0;
}

/* The family and bytes of an IP address (an IPv4 address mapped into IPv6,
 * as a dual-stack listener sees IPv4 clients, as IPv4): 0, or -1 when sa is
 * neither. */
static int ip_of(const struct sockaddr_storage *sa, int *family, unsigned char out[16])
{
    if (sa->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        *family = AF_INET;
        return 0;
    }
    if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            memcpy(out, a6->s6_addr + 12, 4);
            *family = AF_INET;
        } else {
            memcpy(out, a6->s6_addr, 16);
            *family = AF_INET6;
        }
        return 0;
    }
    return -1;
}

/* Whether the address a (of family fa) lies in one of the n ranges. */
static bool in_ranges(const struct allow_range *ranges, unsigned n, int fa,
                      const unsigned char *a)
{
    for (unsigned i = 0; i < n; i++) {
        const struct allow_range *w = &ranges[i];
        unsigned full = w->prefix / 8, rest = w->prefix % 8;
        if (w->family != fa || memcmp(a, w->addr, full) != 0)
            continue;
        if (rest == 0 || ((a[full] ^ w->addr[full]) & (0xff00 >> rest) & 0xff) == 0)
            return true;
    }
    return false;
}

/* Whether the listener admits a connection from sa: the address of a
 * configured peer (as resolved at start), or one in an --allow-from range.
 * Reads only what is fixed before UCX starts: UCX's thread calls it too. */
bool admit_address(const struct relay *r, const struct sockaddr_storage *sa)
{
    unsigned char a[16];
    int fa;

    if (ip_of(sa, &fa, a) < 0)
        return false;
    return in_ranges(r->peer_ips, r->npeer_ips, fa, a) ||
           in_ranges(r->allow, r->nallow, fa, a);
}

/* The configured peers' addresses fixed, and accept() told whom to admit. */
void admit_start(struct relay *r)
{
    const struct peer *p;
    r->npeer_ips = 0;
    LIST_FOREACH(p, &r->peers, link)
    {
        struct allow_range *w = &r->peer_ips[r->npeer_ips];
        if (!p->configured || r->npeer_ips >= RELAY_PEERS_MAX ||
            ip_of(&p->sa, &w->family, w->addr) < 0)
            continue;
        w->prefix = w->family == AF_INET ? 32 : 128;
        r->npeer_ips++;
    }
    if (!libc_accept)
        libc_accept =
            (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
    admitting_relay = r;
}

/* What accept() refused since the last call, for the loop's counter. */
uint64_t admit_take_refused(void)
{
    return relay_take_refusals();
}

/* UCX's TCP transport listens on a port of its own besides the listener
 * (the one 'ss -ltnp' shows on the device's address), where it takes
 * connections and then messages for the UCP handlers without any
 * ucp_listener in the way: the address check at peer_accept would not see
 * them. UCX accepts there, and at the listener, with libc's accept() (from
 * libucs, in UCX's own thread), so the relay defines accept() and closes a
 * connection from an address it does not admit before UCX sees it. libuv
 * uses accept4(), which this leaves alone, as it leaves sockets that are
 * not IP. */
int accept(int fd, struct sockaddr *addr, socklen_t *addrlen)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        const struct relay *r = admitting_relay;
        int c;

        if (!libc_accept)
            libc_accept =
                (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
        if (!libc_accept) {
            errno = ENOSYS;
            return -1;
        }
        c = libc_accept(fd, (struct sockaddr *)&ss, &sl);
        if (c < 0)
            return c;
        if (!r || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) ||
            admit_address(r, &ss)) {
            if ((ss.ss_family == AF_INET || ss.ss_family == AF_INET6) &&
                tcp_guard_accepted(c) < 0) {
                relay_log_refusal(
                    "refused a connection on descriptor %d: the relay guards "
                    "UCX's TCP connections below descriptor %d only",
                    c, TCP_GUARD_FDS);
                close(c);
                continue;
            }
            if (addr && addrlen) {
                memcpy(addr, &ss, sl < *addrlen ? sl : *addrlen);
                *addrlen = sl;
            }
            return c;
        }
        char host[64] = "?", port[16] = "?";
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        relay_log_refusal(
            "refused a connection from %s:%s to UCX: %s is not a configured peer's "
            "address nor in an --allow-from range (add --allow-from %s if it is a "
            "relay)",
            host, port, host, host);
        close(c);
    }
}
