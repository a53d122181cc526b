// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerd --check: whether the configured pools fit where the daemon
 * would put them (file systems, huge pages, memory and its cgroup), and the
 * fix for this host when they do not. Creates nothing; knows nothing about
 * the store or sockets.
 */
#ifndef SHMB_SIZING_H
#define SHMB_SIZING_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "host.h"

/* Print the report on out. Returns the exit status: 0 when every pool fits,
 * 1 when one does not, 2 when the settings cannot be checked (a missing
 * directory, a size that overflows), with the reason printed. */
int sizing_report(const struct config *cfg, FILE *out);

/* How to give the tmpfs mounted at mount (now size_bytes big) room for
 * needed bytes where the daemon runs: docker run --shm-size / --tmpfs,
 * a Kubernetes emptyDir of medium Memory, or mount -o remount. Printed on
 * out, each line indented by two spaces. */
void sizing_print_tmpfs_fix(FILE *out, enum host_container where, const char *mount,
                            uint64_t size_bytes, uint64_t needed);

/* The size to ask for: bytes with headroom (an eighth, at least 16 MiB),
 * in whole MiB. */
uint64_t sizing_with_headroom_mib(uint64_t bytes);

#endif
