// SPDX-License-Identifier: Apache-2.0
/*
 * shmb-read-tool: shmb_read of keys from the command line, on a read-write
 * and a read-only handle, saying for each read whether the mapping or the
 * daemon answered. The Python package's tests run it on the segment they
 * scribbled over, so that the C reader and Client.read are held to the same
 * table (tests/scribble/cases). Goes through libshmbroker only; not installed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmbroker.h"

static const char usage[] =
    "usage: shmb-read-tool SOCKET [KEY...]\n"
    "Connects a read-write and a read-only handle, then reads each KEY (without\n"
    "KEY, each line of standard input, as it comes) with shmb_read on the one,\n"
    "then the other, and prints a line per read: \"KEY MODE OUTCOME SIZE HEX\n"
    "RETRIES\", flushed after each key. Reading from standard input lets a test\n"
    "change the segment between keys, under handles that connected before the\n"
    "change. MODE: rw or ro. OUTCOME: hit (from the mapping), daemon (the\n"
    "daemon's answer), notfound (a miss proven from the mapping), daemon-notfound\n"
    "(the daemon said ENOENT), or error:NAME for any other failure. SIZE and HEX:\n"
    "the bytes read (\"0 -\" when none). RETRIES: the copies the read redid after\n"
    "the chunk changed under one (shmb_read_stats). Exit 0 when every read was\n"
    "made; 1 when a handle could not connect (NAME: message on standard error);\n"
    "2 on a usage error.\n";

/* The largest object read: the scribble table's are 100 bytes. */
#define READ_MAX (1u << 20)

/* Read key on c and print its line. */
static void read_one(shmb_t *c, const char *mode, const char *key, unsigned char *buf)
{
    shmb_read_stats_t before, after;
    const char *outcome;
    size_t size = 0, i;
    int rc;

    shmb_read_stats(c, &before);
    rc = shmb_read(c, key, buf, READ_MAX, &size);
    shmb_read_stats(c, &after);
    if (rc == 0)
        outcome = after.fallback > before.fallback ? "daemon" : "hit";
    else if (rc == -ENOENT)
        outcome = after.fallback > before.fallback ? "daemon-notfound" : "notfound";
    else
        outcome = NULL;
    if (outcome != NULL)
        printf("%s %s %s %zu ", key, mode, outcome, rc == 0 ? size : 0);
    else
        printf("%s %s error:%s 0 ", key, mode, shmb_errname(c));
    if (rc != 0 || size == 0)
        putchar('-');
    for (i = 0; rc == 0 && i < size; i++)
        printf("%02x", buf[i]);
    printf(" %llu\n", (unsigned long long)(after.retries - before.retries));
}

int main(int argc, char **argv)
{
    unsigned char *buf = NULL;
    shmb_t *c[2] = {NULL, NULL};
    int rc = 1, m, i;

    char line[1024];

    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if ((buf = malloc(READ_MAX)) == NULL) {
        fprintf(stderr, "shmb-read-tool: out of memory\n");
        goto fail;
    }
    for (m = 0; m < 2; m++) {
        if ((c[m] = shmb_new()) == NULL) {
            fprintf(stderr, "shmb-read-tool: out of memory\n");
            goto fail;
        }
        shmb_set_read_only(c[m], m);
        if (shmb_connect(c[m], argv[1], m ? "shmb-read-tool-ro" : "shmb-read-tool-rw") < 0) {
            fprintf(stderr, "%s: %s\n", shmb_errname(c[m]), shmb_errmsg(c[m]));
            goto fail;
        }
    }
    for (i = 2; i < argc; i++)
        for (m = 0; m < 2; m++)
            read_one(c[m], m ? "ro" : "rw", argv[i], buf);
    while (argc == 2 && fgets(line, sizeof(line), stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        for (m = 0; m < 2; m++)
            read_one(c[m], m ? "ro" : "rw", line, buf);
        if (fflush(stdout) != 0)
            goto fail;
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
fail:
    for (m = 0; m < 2; m++)
        if (c[m] != NULL)
            shmb_close(c[m]);
    free(buf);
    return rc;
}
