// SPDX-License-Identifier: Apache-2.0
/*
 * The relay's parser of UCX 1.13's packed worker address (relay/
 * wireup_addr.c): addresses UCX 1.13 sent between two relays pass; each cut
 * at every byte, in a buffer of exactly that size (so that a read past it
 * is the sanitizer's), is refused; and so is each with a count, length or
 * index set past what UCX packs or bounds.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../relay/wireup_addr.h"

/* Captured from the WIREUPs of a fetch between two relays over TCP (UCX
 * 1.13.1, UCX_TLS=tcp), after their 20-byte header: a pre-request's address
 * (version 0: an uuid, the veth device with its IPv4 address, its
 * interface's port and an endpoint address for lane 1, then the loopback
 * device with its namespace), the same with UCX_ADDRESS_VERSION=v2
 * (version 1: a flags byte, 8 bytes of attributes), the first with all
 * of UCX's transports on (below), and an
 * acknowledgement's (no device). */
static const unsigned char v0_pre[] = {
    0x20, 0x1b, 0x40, 0x79, 0x58, 0x4f, 0xf9, 0x01, 0x1e, 0x20, 0x06, 0x00, 0x02, 0x0a, 0xd5,
    0x54, 0x02, 0xcf, 0x19, 0x17, 0xb7, 0x51, 0x38, 0x57, 0x74, 0x8d, 0x4e, 0x71, 0x6a, 0xb0,
    0x36, 0x01, 0x13, 0x23, 0x00, 0x00, 0xc2, 0xe1, 0xad, 0x0a, 0xe1, 0xad, 0x05, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x81, 0x20, 0x92, 0x01, 0x02, 0xbd, 0x4a, 0xd5, 0xda, 0x42,
    0x76, 0xb0, 0xc3, 0x96, 0x01, 0x00, 0xf0, 0x00, 0x00, 0x00, 0x00, 0xcf, 0x19, 0x17, 0xb7,
    0x51, 0x38, 0x53, 0x9e, 0x3e, 0x4b, 0xd7, 0xe0, 0x37, 0x37, 0x01, 0x13, 0x23, 0x00, 0x01,
    0x82, 0xaf, 0x8f};
static const unsigned char v1_pre[] = {
    0x01, 0x02, 0x45, 0xbf, 0xf7, 0x07, 0x1a, 0x40, 0x17, 0x73, 0x00, 0x12, 0x01, 0x02, 0xbd,
    0x4a, 0xd5, 0xda, 0x42, 0x76, 0xb0, 0xc3, 0x96, 0x01, 0x00, 0xf0, 0x00, 0x00, 0x00, 0x00,
    0xcf, 0x19, 0x0c, 0x01, 0x5a, 0x01, 0x80, 0x00, 0x8b, 0x00, 0x00, 0x82, 0xc9, 0x41, 0x00,
    0x86, 0x00, 0x02, 0x0a, 0xd5, 0xf7, 0x02, 0xcf, 0x19, 0x0c, 0x12, 0x49, 0x01, 0x80, 0x00,
    0x8b, 0x00, 0x01, 0xc2, 0xcf, 0xad, 0x0a, 0xcf, 0xad, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x81};
/* The same with UCX_TLS=all: six devices of one transport each (self, TCP
 * on the loopback device and on the veth, sysv and posix shared memory,
 * cma). */
static const unsigned char v0_all[] = {
    0x20, 0x34, 0xa7, 0x9a, 0x3f, 0xe5, 0x60, 0xdc, 0xd7, 0x20, 0x00, 0x63, 0x75, 0x77, 0xcc,
    0x2b, 0x32, 0x00, 0xf8, 0xd7, 0x4f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x4f, 0x03, 0x00, 0x00,
    0x88, 0x67, 0xf0, 0x45, 0xb1, 0x4c, 0xe4, 0x34, 0xcb, 0x21, 0x12, 0x01, 0x02, 0xbd, 0x4a,
    0xd5, 0xda, 0x42, 0x76, 0xb0, 0xc3, 0x96, 0x01, 0x00, 0xf0, 0x00, 0x00, 0x00, 0x00, 0xcf,
    0x19, 0x17, 0xb7, 0x51, 0x38, 0x53, 0x9e, 0x3e, 0x4b, 0xd7, 0xe0, 0x37, 0x37, 0x01, 0x13,
    0x23, 0x00, 0x01, 0x82, 0xc8, 0x2b, 0x21, 0x06, 0x00, 0x02, 0x0a, 0xd5, 0xb7, 0x02, 0xcf,
    0x19, 0x17, 0xb7, 0x51, 0x38, 0x57, 0x74, 0x8d, 0x4e, 0x71, 0x6a, 0xb0, 0x36, 0x01, 0x13,
    0x23, 0x00, 0x02, 0xc2, 0xee, 0x35, 0x0a, 0xee, 0x35, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x81, 0x42, 0x08, 0xbd, 0x4a, 0xd5, 0xda, 0x42, 0x76, 0xb0, 0x43, 0x8d, 0x53,
    0x77, 0xcc, 0x2b, 0x32, 0x00, 0x4c, 0x3e, 0x50, 0x77, 0xcc, 0xab, 0x33, 0x00, 0x4f, 0x23,
    0x00, 0x03, 0x88, 0x34, 0x80, 0xc8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x43, 0x08, 0xbd, 0x4a,
    0xd5, 0xda, 0x42, 0x76, 0xb0, 0x43, 0xa7, 0xd3, 0x77, 0xcc, 0x2b, 0x32, 0x00, 0x4c, 0x3e,
    0x50, 0x77, 0xcc, 0xab, 0x33, 0x00, 0x4f, 0x23, 0x00, 0x04, 0x88, 0x19, 0x1d, 0x00, 0x80,
    0x05, 0x00, 0x00, 0xc0, 0x24, 0x88, 0xbd, 0x4a, 0xd5, 0xda, 0x42, 0x76, 0xb0, 0x43, 0x47,
    0x8b, 0xbd, 0x37, 0x06, 0x36, 0x00, 0x24, 0x2e, 0x50, 0x77, 0xcc, 0xab, 0x33, 0x00, 0x92,
    0x21, 0x00, 0x05, 0x84, 0x19, 0x1d, 0x00, 0x00};
static const unsigned char v0_ack[] = {0x20, 0x1b, 0x40, 0x79, 0x58, 0x4f, 0xf9, 0x01, 0x1e, 0xff};

static const struct {
    const unsigned char *b;
    size_t n;
    unsigned devices, entries;
} fair[] = {
    {v0_pre, sizeof(v0_pre), 2, 2},
    {v1_pre, sizeof(v1_pre), 2, 2},
    {v0_all, sizeof(v0_all), 6, 6},
    {v0_ack, sizeof(v0_ack), 0, 0},
};

/* The check of a copy of len bytes of b, in a buffer of exactly len bytes,
 * with byte at (if below len) set to v; its why in why. */
static int check_copy(const unsigned char *b, size_t len, size_t at, unsigned char v,
                      char *why, size_t n)
{
    unsigned char *copy = malloc(len ? len : 1);
    struct wireup_addr_info info;
    int rc;

    assert_non_null(copy);
    memcpy(copy, b, len);
    if (at < len)
        copy[at] = v;
    why[0] = 0;
    rc = wireup_addr_check(copy, len, WIREUP_ADDR_WIREUP, &info, why, n);
    free(copy);
    return rc;
}

/* What UCX 1.13 itself sent passes, with its devices and transport
 * addresses counted. */
static void fair_addresses_pass(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(fair) / sizeof(fair[0]); i++) {
        struct wireup_addr_info info = {99, 99};
        char why[256] = "";
        int rc = wireup_addr_check(fair[i].b, fair[i].n, WIREUP_ADDR_WIREUP, &info, why,
                                   sizeof(why));
        if (rc != 0)
            fail_msg("fair address %zu refused: %s", i, why);
        assert_int_equal(info.devices, fair[i].devices);
        assert_int_equal(info.entries, fair[i].entries);
    }
}

/* Every address cut short, at every byte, is refused as running past its
 * end, and nothing past the cut is read (the sanitizer's build says so). */
static void cut_at_every_byte_is_refused(void **state)
{
    char why[256];
    (void)state;
    for (size_t i = 0; i < sizeof(fair) / sizeof(fair[0]); i++)
        for (size_t len = 0; len < fair[i].n; len++) {
            if (check_copy(fair[i].b, len, len, 0, why, sizeof(why)) != -EINVAL)
                fail_msg("address %zu cut to %zu of %zu bytes passed", i, len, fair[i].n);
            assert_non_null(strstr(why, "runs past the address's end"));
        }
}

/* A byte more than the address is refused: UCX would ignore it, but no
 * UCX 1.13 sends it (its packer asserts the address ends exactly). */
static void trailing_bytes_are_refused(void **state)
{
    unsigned char more[sizeof(v0_pre) + 1] = {0};
    char why[256];
    (void)state;
    memcpy(more, v0_pre, sizeof(v0_pre));
    assert_int_equal(check_copy(more, sizeof(more), sizeof(more), 0, why, sizeof(why)),
                     -EINVAL);
    assert_non_null(strstr(why, "1 bytes follow the address"));
}

/* Each count, length and index of the fair addresses set past what UCX
 * packs or bounds is refused (at: the byte's offset; v: its new value). */
static void huge_fields_are_refused(void **state)
{
    static const struct {
        const unsigned char *b;
        size_t n, at;
        unsigned char v;
        const char *what;
    } cases[] = {
        {v0_pre, sizeof(v0_pre), 0, 0x2f, "version 15"},
        {v0_pre, sizeof(v0_pre), 0, 0x30, "a worker name of 32 bytes (the uuid's first)"},
        {v0_pre, sizeof(v0_pre), 10, 0x1f, "a device address of 31 bytes"},
        {v0_pre, sizeof(v0_pre), 10, 0x46, "a device of 0 paths (the flag set: its address's first byte)"},
        {v0_pre, sizeof(v0_pre), 35, 0xff, "a resource index of 255"},
        {v0_pre, sizeof(v0_pre), 36, 0xff, "an interface address of 63 bytes"},
        {v0_pre, sizeof(v0_pre), 39, 0xff, "an endpoint address of 255 bytes"},
        {v0_pre, sizeof(v0_pre), 50, 0xbf, "lane 63"},
        {v0_pre, sizeof(v0_pre), 50, 0x01, "an endpoint address not the last"},
        {v0_pre, sizeof(v0_pre), 52, 0x9f, "a second device address of 31 bytes"},
        {v0_pre, sizeof(v0_pre), 90, 0xbf, "a second interface address of 63 bytes"},
        {v0_pre, sizeof(v0_pre), 26, 0x7f, "a bandwidth that is not a number"},
        {v1_pre, sizeof(v1_pre), 1, 0x12, "header flags 0x12"},
        {v1_pre, sizeof(v1_pre), 10, 0x7f, "a memory domain extended to the next byte: "
                                          "what follows shifts by one"},
        {v1_pre, sizeof(v1_pre), 11, 0x1f, "a device address's length in the next byte"},
        {v1_pre, sizeof(v1_pre), 41, 0xbf, "an interface address's length in the next "
                                          "byte"},
        {v1_pre, sizeof(v1_pre), 45, 0xa6, "a second device with a system device 0 and "
                                          "one byte fewer"},
        {v1_pre, sizeof(v1_pre), 66, 0xff, "an endpoint address of 255 bytes"},
        {v0_ack, sizeof(v0_ack), 9, 0x80, "an empty device whose length runs past"},
    };
    char why[256];
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (check_copy(cases[i].b, cases[i].n, cases[i].at, cases[i].v, why, sizeof(why)) !=
            -EINVAL)
            fail_msg("passed: %s (byte %zu set to %#x)", cases[i].what, cases[i].at,
                     cases[i].v);
        else if (getenv("SHOW_WHY"))
            printf("%s: %s\n", cases[i].what, why);
}

/* Counts past UCX's arrays and maps: 65 empty devices (UCX counts remote
 * devices in 64-bit maps, and in select.c an array of 128 that a device
 * index past it overruns), 7 endpoint addresses for one interface, a
 * memory domain of 200 (version 1 extends it to a byte) and a system
 * device of 64. Each is refused, saying which. */
static void counts_past_ucx_bounds_are_refused(void **state)
{
    unsigned char b[512];
    char why[256];
    size_t n;
    (void)state;

    memcpy(b, v0_ack, 9);
    for (n = 9; n < 9 + 2 * 65; n += 2)
        b[n] = 0x80, b[n + 1] = 0x00; /* an empty device of no address */
    b[n - 1] = 0x80;                  /* the 65th is the last */
    assert_int_equal(check_copy(b, n, n, 0, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "more than 64 devices"));
    memmove(b + 9, b + 11, n - 11); /* 64 devices: fair in count */
    assert_int_equal(check_copy(b, n - 2, n, 0, why, sizeof(why)), 0);

    /* The first device's interface with 6, then 7, endpoint addresses. */
    for (unsigned k = 6; k <= 7; k++) {
        memcpy(b, v0_pre, 39);
        for (n = 39; n < 39 + k * 12; n += 12) {
            memcpy(b + n, v0_pre + 39, 12); /* its length, 10 bytes, lane 1 */
            b[n + 11] = n + 12 == 39 + k * 12 ? 0x81 : 0x01;
        }
        memcpy(b + n, v0_pre + 51, sizeof(v0_pre) - 51);
        n += sizeof(v0_pre) - 51;
        assert_int_equal(check_copy(b, n, n, 0, why, sizeof(why)), k == 6 ? 0 : -EINVAL);
    }
    assert_non_null(strstr(why, "more than 6 endpoint addresses"));

    memcpy(b, v1_pre, 10);
    b[10] = 0x7f, b[11] = 200; /* the memory domain, extended */
    memcpy(b + 12, v1_pre + 11, sizeof(v1_pre) - 11);
    assert_int_equal(check_copy(b, sizeof(v1_pre) + 1, 999, 0, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "memory domain 200"));
    b[11] = 63;
    assert_int_equal(check_copy(b, sizeof(v1_pre) + 1, 999, 0, why, sizeof(why)), 0);

    memcpy(b, v1_pre, 12);
    b[11] |= 0x20; /* a system device follows the length */
    b[12] = 64;
    memcpy(b + 13, v1_pre + 12, sizeof(v1_pre) - 12);
    assert_int_equal(check_copy(b, sizeof(v1_pre) + 1, 999, 0, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "system device 64"));
    b[12] = 63;
    assert_int_equal(check_copy(b, sizeof(v1_pre) + 1, 999, 0, why, sizeof(why)), 0);
}

/* A version 1 interface that takes active messages in segments of less
 * than 512 bytes is refused (UCX 1.13 aborted on one of 0: the relay's
 * remote key did not fit); one of 512 passes, and so does one of 0 that
 * takes none (an RMA-only transport's). */
static void small_am_segment_is_refused(void **state)
{
    unsigned char b[sizeof(v1_pre)];
    char why[256];
    (void)state;
    memcpy(b, v1_pre, sizeof(b));
    b[36] = 7, b[37] = 0; /* 448 bytes */
    assert_int_equal(check_copy(b, sizeof(b), 999, 0, why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "active messages of 448 bytes"));
    b[36] = 8;
    assert_int_equal(check_copy(b, sizeof(b), 999, 0, why, sizeof(why)), 0);
    b[36] = 0, b[38] &= ~0x6; /* no active messages */
    assert_int_equal(check_copy(b, sizeof(b), 999, 0, why, sizeof(why)), 0);
}

/* A sockaddr connection request's address, as UCX 1.13 unpacks it with
 * the connection manager's flags (no uuid unless flagged, no resource
 * index): version 1, one device of no address (the connection's own
 * stands for it), a TCP interface of 8 KiB segments with its port and an
 * endpoint address. It passes in that form, with slack after it (the
 * relay knows only the allocation's size); cut anywhere, or with segments
 * of 0 bytes, it is refused; read as a WIREUP's it is refused. */
static void conn_request_form(void **state)
{
    static const unsigned char cm[] = {
        0x01, 0x00, 0x00, 0x80, 0xcf, 0x19, 0x0c, 0x12, 0x49, 0x01, 0x80, 0x00, 0x8b,
        0x00, 0xc2, 0xcf, 0xad, 0x0a, 0xcf, 0xad, 0x05, 0, 0, 0, 0, 0, 0, 0, 0x80};
    unsigned char slack[sizeof(cm) + 7] = {0};
    char why[256];
    (void)state;
    memcpy(slack, cm, sizeof(cm));
    assert_int_equal(wireup_addr_check(cm, sizeof(cm), WIREUP_ADDR_CONN_REQUEST, NULL, why,
                                       sizeof(why)), 0);
    assert_int_equal(wireup_addr_check(slack, sizeof(slack), WIREUP_ADDR_CONN_REQUEST, NULL,
                                       why, sizeof(why)), 0);
    assert_int_equal(wireup_addr_check(cm, sizeof(cm), WIREUP_ADDR_WIREUP, NULL, why,
                                       sizeof(why)), -EINVAL);
    for (size_t len = 0; len < sizeof(cm); len++) {
        unsigned char *cut = malloc(len ? len : 1);
        assert_non_null(cut);
        memcpy(cut, cm, len);
        assert_int_equal(wireup_addr_check(cut, len, WIREUP_ADDR_CONN_REQUEST, NULL, why,
                                           sizeof(why)), -EINVAL);
        free(cut);
    }
    slack[10] = 0; /* segments of 0 bytes, active messages on */
    assert_int_equal(wireup_addr_check(slack, sizeof(slack), WIREUP_ADDR_CONN_REQUEST, NULL,
                                       why, sizeof(why)), -EINVAL);
    assert_non_null(strstr(why, "active messages of 0 bytes"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fair_addresses_pass),
        cmocka_unit_test(cut_at_every_byte_is_refused),
        cmocka_unit_test(trailing_bytes_are_refused),
        cmocka_unit_test(huge_fields_are_refused),
        cmocka_unit_test(counts_past_ucx_bounds_are_refused),
        cmocka_unit_test(small_am_segment_is_refused),
        cmocka_unit_test(conn_request_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
