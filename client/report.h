// SPDX-License-Identifier: Apache-2.0
/*
 * The fields of shmb_stats_t by row of the stats reply (proto/stats.def):
 * the library's reader fills them through this, and the ctl's formats read
 * them through it, so that neither restates the reply's field names. Part
 * of the library, not installed.
 */
#ifndef SHMB_CLIENT_REPORT_H
#define SHMB_CLIENT_REPORT_H

#include <stddef.h>
#include <stdint.h>

#include <stdbool.h>

#include "../proto/error.h"
#include "../proto/layout.h"
#include "../proto/protocol.h"
#include "shmbroker.h"

/* Where a row of proto/stats.def lands in shmb_stats_t: its member's offset
 * and size (a blocker row: has_blocker, and the blocker_ members after). */
struct shmb_stats_place {
    size_t offset, size;
};

/* The places, indexed by enum shmb_stat_id. */
extern const struct shmb_stats_place shmb_stats_places[SHMB_STAT_COUNT];

/* The value of a number or counter row (SHMB_STATK_NUMBER or
 * SHMB_STATK_COUNTER) in st; 0 for the other kinds. */
uint64_t shmb_stats_number(const shmb_stats_t *st, enum shmb_stat_id id);

#endif
