// SPDX-License-Identifier: Apache-2.0
/*
 * LD_PRELOAD for tests of a start that reserves a large pool: posix_fallocate
 * past a file's first byte waits while the file named by
 * $SHMB_TEST_RESERVE_GATE exists. The daemon reserves a large pool a chunk
 * at a time, so it stops after its first chunk, starting, for as long as
 * the test looks at it: no race with a reservation that a fast machine ends
 * before the test looks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int posix_fallocate(int fd, off_t offset, off_t len);

int posix_fallocate(int fd, off_t offset, off_t len)
{
    static int (*real)(int, off_t, off_t);
    const char *gate = getenv("SHMB_TEST_RESERVE_GATE");
    struct timespec pause = {0, 10 * 1000 * 1000};

    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "posix_fallocate");
    while (offset > 0 && gate != NULL && access(gate, F_OK) == 0)
        nanosleep(&pause, NULL);
    return real(fd, offset, len);
}
