// SPDX-License-Identifier: Apache-2.0
/*
 * The --pool values: each parsed (its options as a table, one handler
 * each), added in order (a name given again replaces its pool), and
 * resolved against the other flags once all are read. For config_flags.c;
 * each is described above its definition in config_pool.c.
 */
#ifndef SHMB_CONFIG_POOL_H
#define SHMB_CONFIG_POOL_H

#include <stdint.h>

#include "config.h"

uint64_t config_default_max_object(uint64_t size, uint64_t max_objects);
int config_add_pool(struct config *cfg, const char *arg, const char **origin,
                    struct shmb_error *err);
int config_resolve_pools(struct config *cfg, const char *const *origin,
                         const char **culprit, struct shmb_error *err);

#endif
