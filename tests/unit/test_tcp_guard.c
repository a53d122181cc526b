// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's parser of UCX 1.13's TCP transport (relay/tcp_guard.c): a
 * stream split at every byte, put requests inside and outside the ranges
 * posted, lengths that overflow, and the recv() it defines over real
 * sockets (a socketpair, and TCP over loopback for a dialled stream).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../relay/relay.h"

static unsigned char target[4096]; /* what a fetch would receive into */

struct bytes {
    unsigned char b[8192];
    size_t n;
};

static void add(struct bytes *s, const void *p, size_t n)
{
    assert_true(s->n + n <= sizeof(s->b));
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

static void magic(struct bytes *s)
{
    uint64_t m = 0xCAFEBABE12345678ull;
    add(s, &m, 8);
}

/* An AM header of id and len, then len bytes of fill. */
static void am(struct bytes *s, uint8_t id, uint32_t len, unsigned char fill)
{
    add(s, &id, 1);
    add(s, &len, 4);
    for (uint32_t i = 0; i < len; i++)
        add(s, &fill, 1);
}

/* A put request for len bytes at addr, without its bytes. */
static void put_req(struct bytes *s, uint64_t addr, uint64_t len)
{
    uint8_t id = 33;
    uint32_t hl = 20, sn = 7;
    add(s, &id, 1);
    add(s, &hl, 4);
    add(s, &addr, 8);
    add(s, &len, 8);
    add(s, &sn, 4);
}

/* A connection packet of len bytes; a request's address is of family fam
 * (AF_INET when 0). */
static void cm_fam(struct bytes *s, uint32_t event, uint32_t len, uint16_t fam)
{
    uint8_t id = 32;
    unsigned char body[64] = {0};
    add(s, &id, 1);
    add(s, &len, 4);
    add(s, &event, 4);
    if (len >= 15)
        memcpy(body + 9, &fam, 2);
    add(s, body, len - 4);
}

static void cm(struct bytes *s, uint32_t event, uint32_t len)
{
    cm_fam(s, event, len, len == 13 + 28 ? AF_INET6 : AF_INET);
}

/* What this side sent before (its put requests, whose acks may come). */
static struct bytes sent_before;

/* Feeds s in two pieces cut at `at`: the result of each. */
static void feed2(enum tcp_stream_state st, const struct bytes *s, size_t at, int *r1,
                  int *r2, struct tcp_stream *out)
{
    char why[200];
    tcp_stream_init(out, st);
    tcp_stream_sent(out, sent_before.b, sent_before.n);
    *r1 = tcp_stream_feed(out, s->b, at, why, sizeof(why));
    *r2 = *r1 < 0 ? -1 : tcp_stream_feed(out, s->b + at, s->n - at, why, sizeof(why));
}

/* A stream as UCX sends it (magic, a connection request, AMs of UCP, a
 * keepalive, the ack of a put this side sent, a put into the posted range
 * and its bytes, whose bytes would read as a bad header, then an AM) passes
 * whole, however it is cut in two, and byte by byte, and ends between
 * messages. */
static void test_fair_stream_every_split(void **state)
{
    struct bytes s = {0};
    struct tcp_stream t;
    uint32_t ack = 7;
    uint8_t ack_id = 34;
    uint32_t four = 4;
    char why[200];
    int r1, r2;
    (void)state;

    tcp_guard_post(&s, target, sizeof(target));
    memset(&sent_before, 0, sizeof(sent_before));
    put_req(&sent_before, 0x1234, 3); /* its number is 7 */
    add(&sent_before, "abc", 3);
    am(&sent_before, 1, 10, 0x33);
    magic(&s);
    cm(&s, 1, 13 + 16);
    am(&s, 1, 113, 0x21);
    am(&s, 35, 0, 0);
    add(&s, &ack_id, 1);
    add(&s, &four, 4);
    add(&s, &ack, 4);
    put_req(&s, (uint64_t)(uintptr_t)target + 100, 64);
    for (int i = 0; i < 64; i++)
        add(&s, "\xff", 1); /* an id past the transport's, were it parsed */
    am(&s, 2, 10, 0x42);
    for (size_t at = 0; at <= s.n; at++) {
        feed2(TCP_STREAM_MAGIC, &s, at, &r1, &r2, &t);
        assert_int_equal(r1, 0);
        assert_int_equal(r2, 0);
        assert_int_equal(t.state, TCP_STREAM_FRAMES);
        assert_int_equal(t.have, 0);
        assert_int_equal(t.skip, 0);
        assert_int_equal(t.put_left, 0);
    }
    tcp_stream_init(&t, TCP_STREAM_MAGIC);
    tcp_stream_sent(&t, sent_before.b, sent_before.n);
    for (size_t i = 0; i < s.n; i++)
        assert_int_equal(tcp_stream_feed(&t, s.b + i, 1, why, sizeof(why)), 0);
    assert_int_equal(t.have, 0);
    memset(&sent_before, 0, sizeof(sent_before));
    tcp_guard_unpost(&s);
}

/* A put request at an address no fetch posted is refused by the piece that
 * completes it, however the stream is cut, and the stream stays refused. */
static void test_put_elsewhere_refused_every_split(void **state)
{
    struct bytes s = {0};
    struct tcp_stream t;
    char why[200];
    int r1, r2;
    (void)state;

    tcp_guard_post(&s, target, sizeof(target));
    magic(&s);
    am(&s, 1, 20, 0x21);
    size_t end = s.n + 25; /* the put request's last byte */
    put_req(&s, 0x1000, 8);
    add(&s, "OWNED!!!", 8);
    for (size_t at = 0; at <= s.n; at++) {
        feed2(TCP_STREAM_MAGIC, &s, at, &r1, &r2, &t);
        assert_int_equal(r1, at >= end ? -1 : 0);
        assert_int_equal(r2, -1);
        assert_int_equal(t.state, TCP_STREAM_REFUSED);
    }
    assert_int_equal(tcp_stream_feed(&t, (const unsigned char *)"x", 1, why, sizeof(why)),
                     -1);
    /* One byte past the range, or from before it, is as bad. */
    const uint64_t near[] = {(uint64_t)(uintptr_t)target - 1,
                             (uint64_t)(uintptr_t)target + sizeof(target) - 7};
    for (int k = 0; k < 2; k++) {
        struct bytes u = {0};
        magic(&u);
        put_req(&u, near[k], 8);
        tcp_stream_init(&t, TCP_STREAM_MAGIC);
        assert_int_equal(tcp_stream_feed(&t, u.b, u.n, why, sizeof(why)), -1);
        assert_non_null(strstr(why, "put request of 8 bytes"));
    }
    tcp_guard_unpost(&s);
    /* Unposted, the range takes no put. */
    struct bytes v = {0};
    magic(&v);
    put_req(&v, (uint64_t)(uintptr_t)target, 8);
    tcp_stream_init(&t, TCP_STREAM_MAGIC);
    assert_int_equal(tcp_stream_feed(&t, v.b, v.n, why, sizeof(why)), -1);
}

/* A put request cut across two receives is judged whole; its bytes, across
 * more receives, are counted, and the header after them is read as one. */
static void test_put_across_receives(void **state)
{
    struct bytes s = {0};
    struct tcp_stream t;
    char why[200];
    (void)state;

    tcp_guard_post(&s, target, sizeof(target));
    magic(&s);
    put_req(&s, (uint64_t)(uintptr_t)target, 1000);
    for (int i = 0; i < 1000; i++)
        add(&s, "\x21", 1);
    am(&s, 36, 0, 0); /* refused: an id UCX does not send */
    tcp_stream_init(&t, TCP_STREAM_MAGIC);
    assert_int_equal(tcp_stream_feed(&t, s.b, 11, why, sizeof(why)), 0);
    assert_int_equal(tcp_stream_feed(&t, s.b + 11, 25, why, sizeof(why)), 0);
    assert_int_equal(t.put_left, 1000 - 3);
    assert_int_equal(tcp_stream_feed(&t, s.b + 36, 500, why, sizeof(why)), 0);
    assert_int_equal(tcp_stream_feed(&t, s.b + 536, 1033 - 536, why, sizeof(why)), 0);
    assert_int_equal(t.put_left, 0);
    assert_int_equal(tcp_stream_feed(&t, s.b + 1033, s.n - 1033, why, sizeof(why)), -1);
    assert_non_null(strstr(why, "id 36"));
    tcp_guard_unpost(&s);
}

/* Lengths that overflow or overrun: a put whose end wraps past 2^64, one
 * longer than its range, an AM longer than UCX's receive buffer (or of 4 GiB),
 * a put request or an ack of the wrong size, a keepalive with a body, a
 * connection packet too short, too long, of an event UCX does not send, or
 * a connection request whose address is not of the stream's family (its
 * size or the family it says). */
static void test_lengths(void **state)
{
    struct tcp_stream t = {0};
    char why[200];
    (void)state;

    tcp_guard_post(&t, target, sizeof(target));
    const struct {
        uint8_t id;
        uint32_t len;
        int want;
    } ams[] = {
        {1, (uint32_t)tcp_guard_am_max(), 0},
        {1, (uint32_t)tcp_guard_am_max() + 1, -1},
        {31, UINT32_MAX, -1},
        {33, 21, -1},
        {33, 19, -1},
        {34, 5, -1},
        {35, 1, -1},
        {32, 3, -1},
        {32, 65, -1},
        {36, 0, -1},
        {255, 0, -1},
    };
    for (size_t i = 0; i < sizeof(ams) / sizeof(ams[0]); i++) {
        struct bytes s = {0};
        add(&s, &ams[i].id, 1);
        add(&s, &ams[i].len, 4);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), ams[i].want);
    }
    const struct {
        uint64_t addr, len;
    } puts[] = {
        {UINT64_MAX - 3, 8},
        {(uint64_t)(uintptr_t)target, sizeof(target) + 1},
        {(uint64_t)(uintptr_t)target + 8, UINT64_MAX - 4},
        {(uint64_t)(uintptr_t)target, UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof(puts) / sizeof(puts[0]); i++) {
        struct bytes s = {0};
        put_req(&s, puts[i].addr, puts[i].len);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), -1);
    }
    /* On an IPv4 stream a connection request carries an IPv4 address:
     * UCX 1.13 asserts its size and aborts on another. */
    const int events[][3] = {{1, 13 + 16, 0}, {1, 13 + 28, -1}, {1, 13, -1}, {2, 4, 0},
                             {4, 4, 0},       {5, 4, -1},       {0, 4, -1}};
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
        struct bytes s = {0};
        cm(&s, (uint32_t)events[i][0], (uint32_t)events[i][1]);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), events[i][2]);
    }
    /* Its address's family is the stream's: UCX asserts it can read it. */
    for (int fam = 0; fam < 3; fam++) {
        struct bytes s = {0};
        cm_fam(&s, 1, 13 + 16, fam == 0 ? AF_INET : fam == 1 ? 0 : AF_INET6);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), fam ? -1 : 0);
    }
    /* And on an IPv6 stream, an IPv6 address. */
    for (int v6 = 0; v6 < 2; v6++) {
        struct bytes s = {0};
        cm(&s, 1, 13 + (v6 ? 28 : 16));
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        t.addr_len = 28;
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), v6 ? 0 : -1);
    }
    tcp_guard_unpost(&t);
}

/* An ack passes only for a put this side sent (sent in pieces, its bytes
 * too): of its last put, once (UCX asserts that put is awaited), or of one
 * before it (numbers wrap: 2^32 - 1 is before 7); never of none, nor past
 * the last (that would complete flushes early). */
static void test_acks(void **state)
{
    struct tcp_stream t;
    struct bytes out = {0};
    char why[200];
    (void)state;

    const struct {
        uint32_t sn;
        int want;
    } cases[] = {{7, 0}, {6, 0}, {0xFFFFFFFF, 0}, {8, -1}, {7u + 0x7FFFFFFFu, -1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct bytes in = {0};
        uint8_t id = 34;
        uint32_t four = 4;
        add(&in, &id, 1);
        add(&in, &four, 4);
        add(&in, &cases[i].sn, 4);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, in.b, in.n, why, sizeof(why)), -1);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        memset(&out, 0, sizeof(out));
        am(&out, 2, 3, 0);
        put_req(&out, 0x1234, 100);
        for (int b = 0; b < 100; b++)
            add(&out, "\x22", 1);
        for (size_t k = 0; k < out.n; k += 7)
            tcp_stream_sent(&t, out.b + k, out.n - k < 7 ? out.n - k : 7);
        assert_int_equal(tcp_stream_feed(&t, in.b, in.n, why, sizeof(why)),
                         cases[i].want);
        if (cases[i].sn == 7) {
            /* Once: a second ack of the same put is refused. */
            assert_int_equal(tcp_stream_feed(&t, in.b, in.n, why, sizeof(why)), -1);
        }
    }
}

/* A put of no bytes writes nothing, but is let through only at an address
 * inside a posted range (its end included), as any put. */
static void test_zero_length_put(void **state)
{
    struct tcp_stream t = {0};
    char why[200];
    (void)state;

    tcp_guard_post(&t, target, sizeof(target));
    const struct {
        uint64_t addr;
        int want;
    } cases[] = {{(uint64_t)(uintptr_t)target, 0},
                 {(uint64_t)(uintptr_t)target + sizeof(target), 0},
                 {(uint64_t)(uintptr_t)target + sizeof(target) + 1, -1},
                 {0, -1},
                 {UINT64_MAX, -1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct bytes s = {0};
        put_req(&s, cases[i].addr, 0);
        am(&s, 1, 3, 0);
        tcp_stream_init(&t, TCP_STREAM_FRAMES);
        assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), cases[i].want);
    }
    tcp_guard_unpost(&t);
}

/* An accepted stream that does not begin with the magic number is not the
 * transport (UCX's sockaddr listener has its own framing): passed unread,
 * from the first byte that differs. */
static void test_not_the_transport(void **state)
{
    struct bytes s = {0};
    struct tcp_stream t;
    char why[200];
    (void)state;

    add(&s, "\x78\x56\x34", 3); /* the magic's first bytes, then not */
    put_req(&s, 0x1000, 8);
    tcp_stream_init(&t, TCP_STREAM_MAGIC);
    assert_int_equal(tcp_stream_feed(&t, s.b, s.n, why, sizeof(why)), 0);
    assert_int_equal(t.state, TCP_STREAM_PASS);
}

/* UCX_TCP_RX_SEG_SIZE read as UCX reads it; what it cannot be is the default. */
static void test_rx_seg(void **state)
{
    (void)state;
    assert_int_equal(tcp_guard_rx_seg(NULL), 65536);
    assert_int_equal(tcp_guard_rx_seg("8kb"), 8192);
    assert_int_equal(tcp_guard_rx_seg("64K"), 65536);
    assert_int_equal(tcp_guard_rx_seg("1m"), 1 << 20);
    assert_int_equal(tcp_guard_rx_seg("4096"), 4096);
    assert_int_equal(tcp_guard_rx_seg("auto"), 65536);
    assert_int_equal(tcp_guard_rx_seg("-1"), 65536);
    assert_int_equal(tcp_guard_rx_seg("5"), 65536);
    assert_int_equal(tcp_guard_rx_seg("99999999999g"), 65536);
    assert_int_equal(tcp_guard_rx_seg("8kbx"), 65536);
}

/* recv() as UCX calls it, over a socketpair taken as an accepted stream: a
 * fair put goes through; the posted range going cuts the put under way (the
 * next receive fails as a reset connection); a put elsewhere fails the
 * receive that carries it; close() forgets the descriptor. */
static void test_recv_over_socket(void **state)
{
    int sv[2];
    unsigned char buf[256];
    struct bytes s = {0};
    (void)state;

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(tcp_guard_accepted(sv[0]), 0);
    tcp_guard_post(&s, target, sizeof(target));
    magic(&s);
    put_req(&s, (uint64_t)(uintptr_t)target, 100);
    add(&s, "0123456789", 10);
    assert_int_equal(write(sv[1], s.b, s.n), (ssize_t)s.n);
    assert_int_equal(recv(sv[0], buf, sizeof(buf), 0), (ssize_t)s.n);
    tcp_guard_unpost(&s);
    send(sv[1], "abc", 3, MSG_NOSIGNAL);
    errno = 0;
    assert_int_equal(recv(sv[0], buf, sizeof(buf), 0), -1);
    assert_int_equal(errno, ECONNRESET);
    assert_int_equal(close(sv[0]), 0);
    close(sv[1]);

    /* A put elsewhere; then the same descriptor number, closed and made
     * again, is not the transport until accepted as one. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(tcp_guard_accepted(sv[0]), 0);
    struct bytes u = {0};
    magic(&u);
    put_req(&u, 0x1000, 8);
    assert_int_equal(write(sv[1], u.b, u.n), (ssize_t)u.n);
    errno = 0;
    assert_int_equal(recv(sv[0], buf, sizeof(buf), 0), -1);
    assert_int_equal(errno, ECONNRESET);
    int fd = sv[0];
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(sv[0], fd);
    assert_int_equal(write(sv[1], u.b, u.n), (ssize_t)u.n);
    assert_int_equal(recv(sv[0], buf, sizeof(buf), 0), (ssize_t)u.n);
    close(sv[0]);
    close(sv[1]);
}

/* Dialled TCP streams: one whose first send is the magic number is the
 * transport (a put elsewhere arriving is refused); one whose first send is
 * anything else (the sockaddr side) is passed unread. */
static void test_dialled(void **state)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    unsigned char buf[256];
    struct bytes u = {0};
    uint64_t m = 0xCAFEBABE12345678ull;
    (void)state;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(l >= 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(l, 4), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    put_req(&u, 0x1000, 8);
    for (int uct = 1; uct >= 0; uct--) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
        int a = accept(l, NULL, NULL);
        assert_true(a >= 0);
        if (uct)
            assert_int_equal(send(c, &m, sizeof(m), 0), (ssize_t)sizeof(m));
        else
            assert_int_equal(send(c, "hello", 5, 0), 5);
        assert_int_equal(write(a, u.b, u.n), (ssize_t)u.n);
        ssize_t n = 0;
        for (size_t got = 0; got < u.n && n >= 0; got += (size_t)n)
            n = recv(c, buf, sizeof(buf), 0);
        assert_int_equal(n < 0, uct);
        close(c);
        close(a);
    }
    close(l);
}

/* A descriptor closed without close() (libuv's way) and made again as a
 * Unix socket is not read as the transport once connect() sees it. */
static void test_connect_forgets(void **state)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    unsigned char buf[256];
    struct bytes u = {0};
    (void)state;

    magic(&u);
    put_req(&u, 0x1000, 8);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/test-tcp-guard-%d", (int)getpid());
    int l = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(l, 1), 0);
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(tcp_guard_accepted(c), 0);
    syscall(SYS_close, c);
    assert_int_equal(socket(AF_UNIX, SOCK_STREAM, 0), c);
    assert_int_equal(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    int a = accept(l, NULL, NULL);
    assert_int_equal(write(a, u.b, u.n), (ssize_t)u.n);
    assert_int_equal(recv(c, buf, sizeof(buf), 0), (ssize_t)u.n);
    close(a);
    close(c);
    close(l);
    unlink(sa.sun_path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fair_stream_every_split),
        cmocka_unit_test(test_put_elsewhere_refused_every_split),
        cmocka_unit_test(test_put_across_receives),
        cmocka_unit_test(test_lengths),
        cmocka_unit_test(test_acks),
        cmocka_unit_test(test_zero_length_put),
        cmocka_unit_test(test_not_the_transport),
        cmocka_unit_test(test_rx_seg),
        cmocka_unit_test(test_recv_over_socket),
        cmocka_unit_test(test_dialled),
        cmocka_unit_test(test_connect_forgets),
    };
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
