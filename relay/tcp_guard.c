// SPDX-License-Identifier: Apache-2.0
/*
 * UCX 1.13's TCP transport read as it arrives, below UCX: the relay defines
 * recv(), send(), sendmsg(), connect() and close() (as admit.c defines
 * accept()) and parses each stream of the transport on the way in, so that
 * a "PUT request" (write these bytes at this address) lands only in a range
 * the relay posted to receive into, and a message UCX would overrun its
 * buffer with, or assert against, never reaches UCX. Knows the transport's
 * framing and the posted ranges; not peers, transfers or the daemon.
 */
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "relay.h"

/* UCX 1.13's src/uct/tcp/tcp.h: the magic number a connecting side sends
 * first, the AM header (id, then length, packed), the ids past UCT's own
 * (32 and up) and the put request's body (address, length, sequence). */
#define UCT_MAGIC 0xCAFEBABE12345678ull
#define AM_HDR 5
#define ID_CM 32
#define ID_PUT_REQ 33
#define ID_PUT_ACK 34
#define ID_KEEPALIVE 35
#define PUT_REQ_LEN 20
#define PUT_ACK_LEN 4
#define CM_MIN 4  /* the event */
#define CM_MAX 64 /* a connection request: event, flags, id and a sockaddr_in6 */
#define RX_SEG_DEFAULT 65536 /* UCX_TCP_RX_SEG_SIZE's default, 64kb */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct tcp_stream streams[TCP_GUARD_FDS];
static struct {
    const void *owner;
    uint64_t start, end;
} posted[RELAY_TRANSFERS_MAX];
static _Atomic uint64_t puts_allowed;
/* The stream of the transport this thread last received on: UCX handles
 * the messages of one receive before its next (uct_tcp_ep_progress_am_rx). */
static _Thread_local int receiving_fd = -1;
static ssize_t (*libc_recv)(int, void *, size_t, int);
static ssize_t (*libc_send)(int, const void *, size_t, int);
static ssize_t (*libc_sendmsg)(int, const struct msghdr *, int);
static int (*libc_connect)(int, const struct sockaddr *, socklen_t);
static int (*libc_close)(int);

/* libc's own call, found once (UCX's thread may be first: any thread may
 * store the same pointer). */
static void *next_fn(void *volatile *slot, const char *name)
{
    void *f = *slot;
    if (!f) {
        f = dlsym(RTLD_NEXT, name);
        *slot = f;
    }
    return f;
}
#define LIBC(fn) ((__typeof__(libc_##fn))next_fn((void *volatile *)&libc_##fn, #fn))

/* UCX_TCP_RX_SEG_SIZE's value as UCX reads it (a number with an optional k,
 * m or g, and an optional b; NULL: unset), or its default where it is not
 * one of those. */
size_t tcp_guard_rx_seg(const char *v)
{
    char *end = NULL;
    unsigned long long n = v ? strtoull(v, &end, 10) : 0;
    unsigned long long mult = 1;
    if (!v || end == v || *v == '-' || *v == '+')
        return RX_SEG_DEFAULT;
    switch (*end | 0x20) {
    case 'k':
        mult = 1ull << 10, end++;
        break;
    case 'm':
        mult = 1ull << 20, end++;
        break;
    case 'g':
        mult = 1ull << 30, end++;
        break;
    default:
        break;
    }
    if ((*end | 0x20) == 'b')
        end++;
    if (*end != 0 || n == 0 || n > (1ull << 31) / mult || n * mult <= AM_HDR)
        return RX_SEG_DEFAULT;
    return (size_t)(n * mult);
}

/* The largest message UCX's receive buffer holds: the segment less the AM
 * header. A message longer than that overruns UCX's buffer. */
size_t tcp_guard_am_max(void)
{
    static _Atomic size_t cached;
    size_t seg = cached;
    if (!seg)
        cached = seg = tcp_guard_rx_seg(getenv("UCX_TCP_RX_SEG_SIZE"));
    return seg - AM_HDR;
}

/* Whether [addr, addr + len) lies inside a posted range (len 0: addr inside
 * or at its end). Called with the lock held. */
static bool put_allowed(uint64_t addr, uint64_t len)
{
    if (addr + len < addr)
        return false;
    for (unsigned i = 0; i < RELAY_TRANSFERS_MAX; i++)
        if (posted[i].owner && addr >= posted[i].start && addr + len <= posted[i].end)
            return true;
    return false;
}

/* A stream at its start, IPv4 until told otherwise. */
void tcp_stream_init(struct tcp_stream *s, enum tcp_stream_state state)
{
    memset(s, 0, sizeof(*s));
    s->state = state;
    s->addr_len = sizeof(struct sockaddr_in);
}

/* One message's header in s->hdr (s->have == AM_HDR), or the header and
 * body of a put request or a CM packet: 0 to go on, or -1 with why. */
static int message(struct tcp_stream *s, char *why, size_t whylen)
{
    uint8_t id = s->hdr[0];
    uint32_t len;
    memcpy(&len, s->hdr + 1, sizeof(len));

    if (s->have == AM_HDR) {
        if (id > ID_KEEPALIVE) {
            snprintf(why, whylen, "a message of id %u, which UCX 1.13 does not send", id);
            return -1;
        }
        if (len > tcp_guard_am_max() || (id == ID_PUT_REQ && len != PUT_REQ_LEN) ||
            (id == ID_PUT_ACK && len != PUT_ACK_LEN) ||
            (id == ID_KEEPALIVE && len != 0) ||
            (id == ID_CM && (len < CM_MIN || len > CM_MAX))) {
            snprintf(why, whylen,
                     "a message of id %u and %u bytes (UCX's receive buffer "
                     "takes %zu)",
                     id, len, tcp_guard_am_max());
            return -1;
        }
        if (id != ID_PUT_REQ && id != ID_CM && id != ID_PUT_ACK) {
            s->skip = len; /* passed to UCX unread */
            s->have = 0;
        }
        return 0; /* a put request's, an ack's or a CM packet's body comes next */
    }
    if (id == ID_PUT_ACK) {
        uint32_t sn;
        memcpy(&sn, s->hdr + AM_HDR, sizeof(sn));
        /* UCX asserts that an ack of its last put's number finds that put
         * awaited, and an ack past it would complete flushes early: an ack
         * is of a put this stream sent, the last or one before it. */
        if (!s->tx.awaiting || (int32_t)(s->tx.put_sn - sn) < 0) {
            snprintf(why, whylen,
                     "an acknowledgement of put %u, where this relay awaits %s", sn,
                     s->tx.awaiting ? "an earlier one" : "none");
            return -1;
        }
        if (sn == s->tx.put_sn)
            s->tx.awaiting = false;
        s->have = 0;
        return 0;
    }
    if (id == ID_PUT_REQ) {
        uint64_t addr, plen;
        memcpy(&addr, s->hdr + AM_HDR, sizeof(addr));
        memcpy(&plen, s->hdr + AM_HDR + 8, sizeof(plen));
        if (!put_allowed(addr, plen)) {
            snprintf(why, whylen,
                     "a put request of %llu bytes at %#llx, where this relay "
                     "posted no receive",
                     (unsigned long long)plen, (unsigned long long)addr);
            return -1;
        }
        s->put_addr = addr;
        s->put_left = plen;
        s->have = 0;
        puts_allowed++;
        return 0;
    }
    uint32_t event;
    uint16_t family = 0;
    memcpy(&event, s->hdr + AM_HDR, sizeof(event));
    if (len >= 13 + sizeof(family))
        memcpy(&family, s->hdr + AM_HDR + 13, sizeof(family));
    /* A connection request carries, after its 13 bytes (event, flags, id),
     * an address of the connection's own family, whose size and family UCX
     * asserts (aborting the relay on another); an acknowledgement or a
     * close, the event and little more. */
    if (event < 1 || event > 4 ||
        (event == 1 &&
         (len != 13u + s->addr_len ||
          family != (s->addr_len == sizeof(struct sockaddr_in6) ? AF_INET6 : AF_INET)))) {
        snprintf(why, whylen,
                 "a connection packet of %u bytes for event %u (address family "
                 "%u), which UCX 1.13 does not send",
                 len, event, family);
        return -1;
    }
    s->have = 0;
    return 0;
}

/* How many bytes of the current header s still needs. */
static size_t hdr_need(const struct tcp_stream *s)
{
    uint32_t len;
    if (s->have < AM_HDR)
        return AM_HDR - s->have;
    memcpy(&len, s->hdr + 1, sizeof(len));
    return AM_HDR + len - s->have; /* a put request or a CM packet: bounded above */
}

/* Bytes received, in order: magic, headers, bodies held or passed, a put's
 * bytes counted. */
int tcp_stream_feed(struct tcp_stream *s, const unsigned char *p, size_t n, char *why,
                    size_t whylen)
{
    static const uint64_t magic = UCT_MAGIC;

    if (s->state == TCP_STREAM_REFUSED) {
        snprintf(why, whylen, "a stream already refused");
        return -1;
    }
    if (n)
        s->fed = true;
    while (n && s->state != TCP_STREAM_PASS) {
        size_t k;
        if (s->state == TCP_STREAM_MAGIC) {
            k = sizeof(magic) - s->have < n ? sizeof(magic) - s->have : n;
            if (memcmp(p, (const unsigned char *)&magic + s->have, k) != 0) {
                /* Not the transport (the sockaddr listener's own framing):
                 * UCX closes a transport connection whose magic is wrong. */
                s->state = TCP_STREAM_PASS;
                return 0;
            }
            s->have += k;
            if (s->have == sizeof(magic)) {
                s->state = TCP_STREAM_FRAMES;
                s->have = 0;
            }
        } else if (s->put_left || s->skip) {
            uint64_t *left = s->put_left ? &s->put_left : &s->skip;
            k = *left < n ? (size_t)*left : n;
            *left -= k;
            if (left == &s->put_left)
                s->put_addr += k;
        } else {
            k = hdr_need(s) < n ? hdr_need(s) : n;
            memcpy(s->hdr + s->have, p, k);
            s->have += k;
            /* A header is checked once whole, a body once whole. */
            if ((s->have == AM_HDR || hdr_need(s) == 0) && message(s, why, whylen) < 0) {
                s->state = TCP_STREAM_REFUSED;
                return -1;
            }
        }
        p += k;
        n -= k;
    }
    return 0;
}

/* UCP's WIREUP this process sent over the transport, by the endpoint id it
 * sent them from (its own): the types, one bit each, of the last
 * WIREUP_SENT_MAX endpoints. An endpoint's exchange is short (a
 * pre-request, a request, a reply, an acknowledgement). */
#define ID_WIREUP 1
#define WIREUP_HDR 20
#define WIREUP_SENT_MAX 1024
static struct {
    uint64_t id;
    unsigned types;
} wireup_sent[WIREUP_SENT_MAX];
static unsigned wireup_sent_next;

/* Called with the lock held. */
static unsigned *wireup_sent_types(uint64_t id, bool add)
{
    for (unsigned i = 0; i < WIREUP_SENT_MAX; i++)
        if (wireup_sent[i].id == id && id)
            return &wireup_sent[i].types;
    if (!add)
        return NULL;
    unsigned i = wireup_sent_next++ % WIREUP_SENT_MAX;
    wireup_sent[i].id = id;
    wireup_sent[i].types = 0;
    return &wireup_sent[i].types;
}

/* Bytes this process sent, in order: its put requests' numbers, and the
 * type and source of its WIREUP messages. */
void tcp_stream_sent(struct tcp_stream *s, const unsigned char *p, size_t n)
{
    struct tcp_stream_tx *t = &s->tx;
    while (n) {
        size_t k;
        if (t->magic_left || t->skip) {
            uint64_t *left = t->magic_left ? &t->magic_left : &t->skip;
            k = *left < n ? (size_t)*left : n;
            *left -= k;
        } else {
            bool body = t->have >= AM_HDR &&
                        (t->hdr[0] == ID_PUT_REQ || t->hdr[0] == ID_WIREUP);
            size_t need = (body ? AM_HDR + PUT_REQ_LEN : AM_HDR) - t->have;
            uint32_t len;
            k = need < n ? need : n;
            memcpy(t->hdr + t->have, p, k);
            t->have += k;
            memcpy(&len, t->hdr + 1, sizeof(len));
            if (t->have == AM_HDR && t->hdr[0] != ID_PUT_REQ &&
                (t->hdr[0] != ID_WIREUP || len < WIREUP_HDR)) {
                t->skip = len;
                t->have = 0;
            } else if (t->have == AM_HDR + WIREUP_HDR && t->hdr[0] == ID_WIREUP) {
                /* Our own WIREUP: its type, from which endpoint. */
                uint64_t src;
                memcpy(&src, t->hdr + AM_HDR + 4, sizeof(src));
                if (t->hdr[AM_HDR] < 32)
                    *wireup_sent_types(src, true) |= 1u << t->hdr[AM_HDR];
                t->skip = len - WIREUP_HDR;
                t->have = 0;
            } else if (t->have == AM_HDR + PUT_REQ_LEN) {
                /* Our own put: its number, and its bytes to pass. */
                memcpy(&t->skip, t->hdr + AM_HDR + 8, sizeof(t->skip));
                memcpy(&t->put_sn, t->hdr + AM_HDR + 16, sizeof(t->put_sn));
                t->awaiting = true;
                t->have = 0;
            }
        }
        p += k;
        n -= k;
    }
}

/* Whether a WIREUP of type naming our endpoint dst fits what this process
 * sent from that endpoint, over the transport: a pre-request goes to an
 * endpoint that sent none yet (it waits for one), a request to one that
 * sent a pre-request, a reply to one that sent a request, an
 * acknowledgement to one that sent a reply. UCX 1.13 asserts each of these
 * on the endpoint's state (an acknowledgement to an endpoint that sent no
 * reply: wireup.c:782). Checked only for a message that came over the
 * transport (this thread's last receive): over another, true; on a stream
 * already cut (UCX goes on with the rest of that receive), false. */
bool tcp_guard_wireup_fits(unsigned type, uint64_t dst)
{
    static const int needs[] = {-1, 0, 1, 2}; /* PRE_REQUEST, REQUEST, REPLY, ACK */
    int fd = receiving_fd;
    bool fits = true;
    if (fd < 0 || fd >= TCP_GUARD_FDS || type >= sizeof(needs) / sizeof(needs[0]))
        return true;
    pthread_mutex_lock(&lock);
    if (streams[fd].state == TCP_STREAM_REFUSED) {
        fits = false; /* cut by an earlier message of the same receive */
    } else if (streams[fd].state == TCP_STREAM_FRAMES) {
        unsigned *types = wireup_sent_types(dst, false);
        if (needs[type] < 0)
            fits = !types || !*types;
        else
            fits = types && (*types & (1u << needs[type]));
    }
    pthread_mutex_unlock(&lock);
    return fits;
}

/* A receive the relay posted: puts may land in it until it is unposted. */
void tcp_guard_post(const void *owner, const void *ptr, size_t len)
{
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < RELAY_TRANSFERS_MAX; i++)
        if (!posted[i].owner) {
            posted[i].owner = owner;
            posted[i].start = (uint64_t)(uintptr_t)ptr;
            posted[i].end = posted[i].start + len;
            break;
        }
    pthread_mutex_unlock(&lock);
}

/* The range goes; a put under way into it is cut: its connection's next
 * receive fails, before UCX writes another byte there. */
void tcp_guard_unpost(const void *owner)
{
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < RELAY_TRANSFERS_MAX; i++) {
        if (posted[i].owner != owner)
            continue;
        for (int fd = 0; fd < TCP_GUARD_FDS; fd++) {
            struct tcp_stream *s = &streams[fd];
            if (s->put_left && s->put_addr < posted[i].end &&
                s->put_addr + s->put_left > posted[i].start) {
                s->state = TCP_STREAM_REFUSED;
                shutdown(fd, SHUT_RDWR);
            }
        }
        posted[i].owner = NULL;
    }
    pthread_mutex_unlock(&lock);
}

/* For the status's tcp_puts. */
uint64_t tcp_guard_puts_allowed(void)
{
    return puts_allowed;
}

/* Cut the stream whose message UCX is handling on this thread (its last
 * receive): its next receive fails as a reset connection. The descriptor,
 * or -1 when this thread is not handling one (another transport). */
int tcp_guard_cut_receiving(void)
{
    int fd = receiving_fd;
    if (fd < 0 || fd >= TCP_GUARD_FDS)
        return -1;
    pthread_mutex_lock(&lock);
    if (streams[fd].state != TCP_STREAM_FRAMES) {
        fd = -1;
    } else {
        streams[fd].state = TCP_STREAM_REFUSED;
        shutdown(fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&lock);
    return fd;
}

/* An accepted IP stream (admit.c's accept()): the magic number is due. */
int tcp_guard_accepted(int fd)
{
    if (fd < 0 || fd >= TCP_GUARD_FDS)
        return -EMFILE;
    struct sockaddr_storage ss = {0};
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    pthread_mutex_lock(&lock);
    tcp_stream_init(&streams[fd], TCP_STREAM_MAGIC);
    if (ss.ss_family == AF_INET6)
        streams[fd].addr_len = sizeof(struct sockaddr_in6);
    pthread_mutex_unlock(&lock);
    return 0;
}

/* The transport's connections that this relay dials: its first send is the
 * magic number. Until something is sent, what arrives is parsed as the
 * transport (strict: the sockaddr side sends first too). */
int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    int type = 0;
    socklen_t tl = sizeof(type);
    if (!LIBC(connect)) {
        errno = ENOSYS;
        return -1;
    }
    if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6) &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_STREAM) {
        if (fd >= TCP_GUARD_FDS) {
            relay_log(
                "refused to connect descriptor %d: the relay guards the TCP transport's "
                "descriptors below %d only",
                fd, TCP_GUARD_FDS);
            errno = EMFILE;
            return -1;
        }
        pthread_mutex_lock(&lock);
        tcp_stream_init(&streams[fd], TCP_STREAM_DIALLED);
        if (sa->sa_family == AF_INET6)
            streams[fd].addr_len = sizeof(struct sockaddr_in6);
        pthread_mutex_unlock(&lock);
    } else if (fd >= 0 && fd < TCP_GUARD_FDS) {
        /* Not the transport, whatever the number held before (libuv closes
         * its descriptors without close()). */
        pthread_mutex_lock(&lock);
        tcp_stream_init(&streams[fd], TCP_STREAM_UNTRACKED);
        pthread_mutex_unlock(&lock);
    }
    return libc_connect(fd, sa, len);
}

/* What this process sends on a stream of the transport, for the acks that
 * may come back (tcp_stream_sent). Called with the lock held. */
static void sent(struct tcp_stream *s, const struct iovec *iov, size_t iovcnt, size_t n)
{
    for (size_t i = 0; i < iovcnt && n; i++) {
        size_t k = iov[i].iov_len < n ? iov[i].iov_len : n;
        tcp_stream_sent(s, iov[i].iov_base, k);
        n -= k;
    }
}

/* The first send on a dialled stream tells whether it is the transport. */
static void classify(struct tcp_stream *s, const void *buf, size_t len)
{
    static const uint64_t magic = UCT_MAGIC;
    bool uct = len >= sizeof(magic) && memcmp(buf, &magic, sizeof(magic)) == 0;
    s->state = uct || s->fed ? TCP_STREAM_FRAMES : TCP_STREAM_PASS;
    if (uct)
        s->tx.magic_left = sizeof(magic);
}

/* libc's send(), after which the bytes sent on a stream of the transport are
 * read for its put requests. */
ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    ssize_t n;
    if (!LIBC(send)) {
        errno = ENOSYS;
        return -1;
    }
    if (fd < 0 || fd >= TCP_GUARD_FDS)
        return libc_send(fd, buf, len, flags);
    struct tcp_stream *s = &streams[fd];
    pthread_mutex_lock(&lock);
    if (s->state == TCP_STREAM_DIALLED)
        classify(s, buf, len);
    pthread_mutex_unlock(&lock);
    n = libc_send(fd, buf, len, flags);
    if (n > 0) {
        int saved = errno;
        struct iovec iov = {(void *)buf, (size_t)n};
        pthread_mutex_lock(&lock);
        if (s->state == TCP_STREAM_MAGIC || s->state == TCP_STREAM_FRAMES)
            sent(s, &iov, 1, (size_t)n);
        pthread_mutex_unlock(&lock);
        errno = saved;
    }
    return n;
}

/* The same for sendmsg(): UCX sends its puts' headers and bytes with it. */
ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    ssize_t n;
    if (!LIBC(sendmsg)) {
        errno = ENOSYS;
        return -1;
    }
    if (fd < 0 || fd >= TCP_GUARD_FDS)
        return libc_sendmsg(fd, msg, flags);
    struct tcp_stream *s = &streams[fd];
    pthread_mutex_lock(&lock);
    if (s->state == TCP_STREAM_DIALLED)
        classify(s, msg->msg_iovlen ? msg->msg_iov[0].iov_base : "",
                 msg->msg_iovlen ? msg->msg_iov[0].iov_len : 0);
    pthread_mutex_unlock(&lock);
    n = libc_sendmsg(fd, msg, flags);
    if (n > 0) {
        int saved = errno;
        pthread_mutex_lock(&lock);
        if (s->state == TCP_STREAM_MAGIC || s->state == TCP_STREAM_FRAMES)
            sent(s, msg->msg_iov, msg->msg_iovlen, (size_t)n);
        pthread_mutex_unlock(&lock);
        errno = saved;
    }
    return n;
}

/* libc's recv(), whose bytes on a stream of the transport are parsed before
 * UCX sees them: a receive that completes a refused message fails as a reset
 * connection, and so does every later one on that stream. */
ssize_t recv(int fd, void *buf, size_t len, int flags)
{
    struct tcp_stream *s;
    char why[200];
    ssize_t n;
    int rc;

    if (!LIBC(recv)) {
        errno = ENOSYS;
        return -1;
    }
    receiving_fd = -1;
    if (fd < 0 || fd >= TCP_GUARD_FDS || (flags & MSG_PEEK))
        return libc_recv(fd, buf, len, flags);
    s = &streams[fd];
    pthread_mutex_lock(&lock);
    enum tcp_stream_state state = s->state;
    pthread_mutex_unlock(&lock);
    if (state == TCP_STREAM_UNTRACKED || state == TCP_STREAM_PASS)
        return libc_recv(fd, buf, len, flags);
    if (state == TCP_STREAM_REFUSED) {
        errno = ECONNRESET;
        return -1;
    }
    n = libc_recv(fd, buf, len, flags);
    if (n <= 0)
        return n;
    int saved = errno;
    receiving_fd = fd;
    pthread_mutex_lock(&lock);
    if (s->state == TCP_STREAM_DIALLED)
        s->state = TCP_STREAM_FRAMES;
    rc = tcp_stream_feed(s, buf, (size_t)n, why, sizeof(why));
    pthread_mutex_unlock(&lock);
    if (rc == 0) {
        errno = saved;
        return n;
    }
    /* UCX sees a reset connection and ends its endpoint: the bytes of this
     * receive, the refused message among them, are never handled. */
    shutdown(fd, SHUT_RDWR);
    relay_log_refusal(
        "cut a connection of UCX's TCP transport on descriptor %d: it sent %s "
        "(peers may write only into the fetches this relay receives)",
        fd, why);
    errno = ECONNRESET;
    return -1;
}

/* libc's close(), which forgets what the guard held for fd. */
int close(int fd)
{
    if (!LIBC(close)) {
        errno = ENOSYS;
        return -1;
    }
    if (fd >= 0 && fd < TCP_GUARD_FDS) {
        pthread_mutex_lock(&lock);
        if (streams[fd].state != TCP_STREAM_UNTRACKED)
            tcp_stream_init(&streams[fd], TCP_STREAM_UNTRACKED);
        pthread_mutex_unlock(&lock);
    }
    return libc_close(fd);
}
