// SPDX-License-Identifier: Apache-2.0
/* Put an object, read it back in place, delete it.
 * Build: cc example.c $(pkg-config --cflags --libs shmbroker) */
#include <shmbroker.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    shmb_t *c = shmb_new();
    const void *p;
    size_t n;

    if (shmb_connect(c, NULL, "example") < 0 ||
        shmb_put(c, "c-example", "hello, shared memory", 20, 0) < 0 ||
        shmb_get(c, "c-example", &p, &n) < 0) {
        fprintf(stderr, "%s: %s\n", shmb_errname(c), shmb_errmsg(c));
        shmb_close(c);
        return 1;
    }
    printf("%.*s\n", (int)n, (const char *)p); /* read straight from the segment */
    shmb_release(c, "c-example");
    shmb_delete(c, "c-example");
    shmb_close(c);
    return 0;
}
