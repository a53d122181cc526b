// SPDX-License-Identifier: Apache-2.0
/*
 * Facts about the host the daemon runs on: available memory, the memory
 * cgroup's limit (v2 or v1), and whether it is a container. Reads /proc and
 * /sys only, changes nothing; knows nothing about pools or segments.
 */
#ifndef SHMB_HOST_H
#define SHMB_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "../proto/error.h"

/* Memory a new memory-backed pool (memfd, and tmpfs pages, which are charged
 * to the memory cgroup too) can take. */
struct host_memory {
    uint64_t mem_available; /* /proc/meminfo MemAvailable (MemFree when absent) */
    bool has_cgroup_limit;  /* some cgroup on our path has a memory limit */
    /* The cgroup of ours or an ancestor's that leaves the least room: its
     * limit and its usage less its inactive file cache (reclaimed before the
     * limit bites; kubelet's working set). */
    uint64_t cgroup_limit, cgroup_usage;
    /* That cgroup's directory (our own when none has a limit); "" when no
     * memory cgroup was found. */
    char cgroup_path[256];
    int cgroup_version; /* 2, 1, or 0 when no memory cgroup was found */
};

/* Fill out from /proc/meminfo and the memory cgroup of this process. A
 * memory cgroup that cannot be found or read counts as no limit. -EIO with a
 * message when /proc/meminfo cannot be read or says nothing usable. */
int host_memory(struct host_memory *out, struct shmb_error *err);

/* host_memory, reading root/proc/... and root/sys/... (root "" is the real
 * system): for tests, which build a fake tree. */
int host_memory_at(const char *root, struct host_memory *out, struct shmb_error *err);

/* What memory-backed pools can still take: MemAvailable, or less when the
 * cgroup's limit less its usage is smaller (0 when over its limit). */
uint64_t host_memory_room(const struct host_memory *m);

/* Where the daemon runs, as far as can be told, for the fixes it suggests. */
enum host_container {
    HOST_BARE,       /* nothing says container */
    HOST_DOCKER,     /* /.dockerenv */
    HOST_KUBERNETES, /* $KUBERNETES_SERVICE_HOST: a pod */
    HOST_CONTAINER,  /* /run/.containerenv (podman) or a container's cgroup path */
};

enum host_container host_container(void);

/* host_container, looking for root/.dockerenv, root/run/.containerenv and
 * root/proc/self/cgroup, with k8s_host standing for $KUBERNETES_SERVICE_HOST
 * (NULL when unset): for tests. */
enum host_container host_container_at(const char *root, const char *k8s_host);

/* "bare host", "Docker", "Kubernetes", "a container": for messages. */
const char *host_container_name(enum host_container where);

#endif
