// SPDX-License-Identifier: Apache-2.0
/*
 * What config's rooms (config.c, config_pool.c, config_flags.c) share and
 * nobody else includes: the flags' getopt values and table, the arguments
 * gathered from the --config file and the command line, and config.c's
 * steps (values, the usage text, the file) that the rooms above it take.
 * Each is described above its definition in config.c.
 */
#ifndef SHMB_CONFIG_INNER_H
#define SHMB_CONFIG_INNER_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct policy;
struct shmb_error;

enum config_opt {
    OPT_SIZE = 256,
    OPT_MAX_OBJECT,
    OPT_MAX_OBJECTS,
    OPT_NAME,
    OPT_SHM_DIR,
    OPT_SOCKET,
    OPT_SOCKET_MODE,
    OPT_LOG_LEVEL,
    OPT_VERSION,
    OPT_HELP,
    OPT_FRESH,
    OPT_ALLOC_TIMEOUT,
    OPT_READ_LEASE,
    OPT_MAX_CLIENTS,
    OPT_MAX_CLIENTS_PER_UID,
    OPT_MAX_PINS,
    OPT_MAX_PENDING,
    OPT_MAX_QUEUED_OUTPUT,
    OPT_ALLOW_UID,
    OPT_ALLOW_GID,
    OPT_CONFIG,
    OPT_LOG_FILE,
    OPT_HELLO_TIMEOUT,
    OPT_STOP_WITH_PID,
    OPT_KEEP_SEGMENT,
    OPT_REMOVE_SEGMENT,
    OPT_CHECK_CONFIG,
    OPT_RELOAD,
    OPT_POOL,
    OPT_CHECK,
    OPT_MAX_QUEUES,
    OPT_MAX_QUEUE_BYTES,
    OPT_QUEUE_LEASE,
};

/* Arguments built from a config file, followed by the command line's. Every
 * string in argv is a copy this struct owns (getopt may permute argv, never
 * the strings); own keeps them in their first order, line the file line each
 * came from (0: the command line), so that an error in a value from the file
 * can name its line. The file's size bounds how many there are. */
struct config_args {
    char **argv, **own;
    int *line;
    int argc, cap;
    const char *file;    /* the --config file, or NULL */
    const char *culprit; /* set by the parser: the argument an error is about */
};

/* Every long option; the --config file accepts the same names. */
extern const struct option config_option_table[];

int config_leading_number(const char *text, unsigned long long *value, char **end);
int config_parse_id(const char *text, bool user, id_t *out);
int config_add_allowed(struct policy *p, bool uid, const char *arg,
                       struct shmb_error *err);
int config_parse_count(const char *flag, const char *text, uint64_t max, uint64_t *out,
                       struct shmb_error *err);
void config_usage(FILE *out);
int config_copy(char *dst, size_t len, const char *flag, const char *value,
                struct shmb_error *err);
int config_args_add(struct config_args *a, const char *arg, int line);
void config_args_free(struct config_args *a);
void config_args_blame(const struct config_args *a, struct shmb_error *err);
char *config_trim(char *s);
int config_read_file(const char *path, struct config_args *a, struct shmb_error *err);

#endif
