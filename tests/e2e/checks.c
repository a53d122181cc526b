// SPDX-License-Identifier: Apache-2.0
/*
 * Assertions about libshmbroker calls for the end-to-end tests.
 */
#include "checks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

shmb_t *h_lib_connect(const struct h_daemon *d, const char *name, int read_only)
{
    shmb_t *c = shmb_new();

    assert_non_null(c);
    shmb_set_read_only(c, read_only);
    if (shmb_connect(c, d->socket, name) != 0) {
        print_error("shmb_connect: %s: %s\n", shmb_errname(c), shmb_errmsg(c));
        shmb_close(c);
        fail();
    }
    return c;
}

void h_check_ok(shmb_t *c, int rc, const char *what, const char *file, int line)
{
    if (rc != 0)
        h_fail_at(file, line, "%s returned %d (%s: %s)", what, rc, shmb_errname(c),
                  shmb_errmsg(c));
}

void h_check_fails(shmb_t *c, int rc, int code, const char *substr, const char *what,
                   const char *file, int line)
{
    if (rc != code || shmb_errcode(c) != code ||
        (substr != NULL && strstr(shmb_errmsg(c), substr) == NULL))
        h_fail_at(file, line,
                  "%s returned %d, errcode %d (%s: %s); expected %d (%s) with \"%s\"", what,
                  rc, shmb_errcode(c), shmb_errname(c), shmb_errmsg(c), code,
                  shmb_strerror(code), substr ? substr : "");
}

int h_put_pattern(shmb_t *c, const char *key, size_t size, uint32_t seed, unsigned readers)
{
    unsigned char *buf = malloc(size);
    int rc;

    if (buf == NULL)
        return -ENOMEM;
    h_fill(buf, size, seed);
    rc = shmb_put(c, key, buf, size, readers);
    free(buf);
    return rc;
}

void h_get_check(shmb_t *c, const char *key, size_t size, uint32_t seed, const char *file,
                 int line)
{
    const void *p;
    size_t len, bad;
    int rc = shmb_get(c, key, &p, &len);

    if (rc != 0)
        h_fail_at(file, line, "get '%s' returned %d (%s: %s)", key, rc, shmb_errname(c),
                  shmb_errmsg(c));
    bad = h_check(p, len, seed);
    if (len != size || bad != len)
        h_fail_at(file, line, "'%s': %zu bytes (want %zu), first wrong byte at %zu", key, len,
                  size, bad);
    h_check_ok(c, shmb_release(c, key), "shmb_release", file, line);
}
