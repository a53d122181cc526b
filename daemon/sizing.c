// SPDX-License-Identifier: Apache-2.0
/*
 * shmbrokerd --check: the pools' sizes rounded as the daemon rounds them,
 * summed per file system (st_dev of their directories) against its free
 * space or free huge pages, memfd pools against memory, every memory-backed
 * pool against the memory cgroup; then the fix for where it runs. Creates and
 * reserves nothing; the store and the socket are no concern of it.
 */
#include "sizing.h"

#include <errno.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>

#include "../proto/layout.h"
#include "../proto/text.h"
#include "segment.h"

#define MIB (1ULL << 20)
/* What a fix asks for beyond the bytes needed: other users of the same
 * /dev/shm, a later resize, rounding. */
#define SIZING_HEADROOM_MIN (16 * MIB)

/* One pool as the check sees it. */
struct sizing_pool {
    const struct pool_config *pc;
    uint64_t size;     /* rounded as the daemon rounds it */
    uint64_t reserved; /* what an existing segment of this size already holds */
    int fs;            /* index in the file systems, -1 for memfd */
    bool fits;
};

/* One file system holding pools. */
struct sizing_fs {
    dev_t dev;
    const char *dir;     /* the first pool's directory there */
    char mount[PATH_MAX];
    uint64_t free;       /* what segment_check_space counts as free */
    uint64_t total;      /* its size (statvfs), 0 when unknown */
    uint64_t page;       /* huge page size on hugetlbfs, else 0 */
    uint64_t need;       /* the pools' bytes not yet reserved */
    const char *type;    /* "tmpfs", "hugetlbfs" or "file system" */
    bool fits;
};

/* State of one report. */
struct sizing {
    FILE *out;
    struct sizing_pool pools[CONFIG_MAX_POOLS];
    unsigned n_pools;
    struct sizing_fs fs[CONFIG_MAX_POOLS];
    unsigned n_fs;
    struct host_memory mem;
    bool mem_known;
    enum host_container where;
    uint64_t room;        /* what memory-backed pools can still take */
    uint64_t mem_need;    /* tmpfs and memfd pages not yet reserved: memory */
    uint64_t memfd_need;  /* memfd pools alone */
    uint64_t failing_shm; /* shm pools that do not fit their tmpfs */
    bool cgroup_over;     /* mem_need over the memory cgroup's room */
    bool memfd_over;      /* memfd pools over the memory room */
    bool mem_short;       /* mem_need over MemAvailable: no setting fixes that */
};

static const char *sizing_backing_name(enum pool_backing b)
{
    switch (b) {
    case POOL_BACKING_MEMFD:
        return "memfd";
    case POOL_BACKING_HUGETLBFS:
        return "hugetlbfs";
    case POOL_BACKING_SHM:
        break;
    }
    return "shm";
}

uint64_t sizing_with_headroom_mib(uint64_t bytes)
{
    uint64_t extra = bytes / 8 > SIZING_HEADROOM_MIN ? bytes / 8 : SIZING_HEADROOM_MIN;

    if (bytes > UINT64_MAX - extra - MIB)
        return UINT64_MAX / MIB;
    return (bytes + extra + MIB - 1) / MIB;
}

/* A size as --pool takes it ("64M", "1536K", "4097"), into buf. */
static const char *sizing_size_flag(uint64_t bytes, char *buf, size_t len)
{
    if (bytes != 0 && bytes % (1ULL << 30) == 0)
        snprintf(buf, len, "%lluG", (unsigned long long)(bytes >> 30));
    else if (bytes != 0 && bytes % MIB == 0)
        snprintf(buf, len, "%lluM", (unsigned long long)(bytes >> 20));
    else if (bytes != 0 && bytes % 1024 == 0)
        snprintf(buf, len, "%lluK", (unsigned long long)(bytes >> 10));
    else
        snprintf(buf, len, "%llu", (unsigned long long)bytes);
    return buf;
}

/* The mount point holding dir: the last directory up from its real path on
 * the same device. dir itself when that cannot be told. */
static void sizing_mount_of(const char *dir, char *out, size_t len)
{
    char path[PATH_MAX];
    struct stat st, up;
    char *slash;

    if (realpath(dir, path) == NULL || stat(path, &st) != 0) {
        snprintf(out, len, "%s", dir);
        return;
    }
    for (;;) {
        slash = strrchr(path, '/');
        if (slash == NULL || slash == path) {
            if (slash == path && path[1] != '\0' && stat("/", &up) == 0 &&
                up.st_dev == st.st_dev)
                path[1] = '\0';
            break;
        }
        *slash = '\0';
        if (stat(path, &up) != 0 || up.st_dev != st.st_dev) {
            *slash = '/';
            break;
        }
    }
    snprintf(out, len, "%s", path);
}

void sizing_print_tmpfs_fix(FILE *out, enum host_container where, const char *mount,
                            uint64_t size_bytes, uint64_t needed)
{
    unsigned long long mib = (unsigned long long)sizing_with_headroom_mib(needed);
    bool dev_shm = strcmp(mount, "/dev/shm") == 0;
    char now[32];

    shmb_format_bytes(size_bytes, now, sizeof(now));
    switch (where) {
    case HOST_DOCKER:
    case HOST_CONTAINER:
        if (where == HOST_CONTAINER)
            fprintf(out, "  In Docker (or podman):\n");
        if (dev_shm) {
            fprintf(out, "  docker run --shm-size=%llum ...   (/dev/shm is %s now)\n", mib,
                    now);
            fprintf(out, "  or share the host's /dev/shm: docker run --ipc=host ...\n");
        } else {
            fprintf(out, "  docker run --tmpfs %s:size=%llum ...   (%s is %s now)\n", mount,
                    mib, mount, now);
        }
        if (where == HOST_DOCKER)
            break;
        fprintf(out, "  In Kubernetes, in the pod's spec:\n");
        /* fall through */
    case HOST_KUBERNETES:
        fprintf(out,
                "  volumes:\n"
                "  - name: %s\n"
                "    emptyDir: {medium: Memory, sizeLimit: %lluMi}\n"
                "  and in the container:\n"
                "  volumeMounts:\n"
                "  - name: %s\n"
                "    mountPath: %s\n",
                dev_shm ? "dshm" : "shmbroker", mib, dev_shm ? "dshm" : "shmbroker", mount);
        fprintf(out, "  (%s is %s now; the emptyDir's pages count against the pod's memory "
                     "limit)\n",
                mount, now);
        break;
    case HOST_BARE:
        fprintf(out, "  mount -o remount,size=%lluM %s   (as root; %s is %s now; /etc/fstab "
                     "keeps it across reboots)\n",
                mib, mount, mount, now);
        break;
    }
}

/* How to give the memory cgroup (or the host) room for limit_needed bytes. */
static void sizing_print_memory_fix(const struct sizing *s, uint64_t limit_needed)
{
    unsigned long long mib = (unsigned long long)sizing_with_headroom_mib(limit_needed);

    if (!s->mem.has_cgroup_limit) {
        fprintf(s->out, "  Free memory on this host, or choose smaller pools.\n");
        return;
    }
    switch (s->where) {
    case HOST_DOCKER:
        fprintf(s->out, "  docker run --memory=%llum ...\n", mib);
        break;
    case HOST_KUBERNETES:
        fprintf(s->out, "  resources: {limits: {memory: %lluMi}}   (the container's)\n", mib);
        break;
    case HOST_CONTAINER:
        fprintf(s->out, "  docker run --memory=%llum ..., or in Kubernetes resources: "
                        "{limits: {memory: %lluMi}}\n",
                mib, mib);
        break;
    case HOST_BARE:
        fprintf(s->out, "  Raise the limit of the memory cgroup %s to %llu MiB (under "
                        "systemd: MemoryMax=%lluM).\n",
                s->mem.cgroup_path, mib, mib);
        break;
    }
}

/* Size, directory, page size and any existing segment of pool i; 0, or 2
 * with the reason printed. */
static int sizing_add_pool(struct sizing *s, const struct pool_config *pc)
{
    struct sizing_pool *p = &s->pools[s->n_pools++];
    struct shmb_error err = {0};
    char path[PATH_MAX];
    struct stat st;
    uint64_t page, free_bytes;
    unsigned i;

    p->pc = pc;
    p->fs = -1;
    p->size = segment_round_size(pc->size);
    if (pc->backing == POOL_BACKING_MEMFD) {
        if (p->size == 0) {
            fprintf(s->out, "pool '%s': size %llu is too large.\n", pc->name,
                    (unsigned long long)pc->size);
            return 2;
        }
        return 0;
    }
    /* segment_check_space's message says what is wrong with the directory. */
    if (stat(pc->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        segment_check_space(pc->dir, 0, NULL, &err);
        fprintf(s->out, "pool '%s': %s\n", pc->name,
                err.message[0] ? err.message : "its directory is not a directory.");
        return 2;
    }
    page = segment_page_size(pc->dir);
    if (page != SHMB_HEADER_PAGE)
        p->size = segment_round_to(p->size, page);
    if (p->size == 0) {
        fprintf(s->out, "pool '%s': size %llu is too large.\n", pc->name,
                (unsigned long long)pc->size);
        return 2;
    }
    /* An existing segment of the same size would be adopted: its reserved
     * pages need no new room. Of another size it would be refused. */
    if (snprintf(path, sizeof(path), "%s/%s", pc->dir, pc->segment) < (int)sizeof(path)) {
        struct stat seg;

        if (lstat(path, &seg) == 0 && S_ISREG(seg.st_mode) && (uint64_t)seg.st_size == p->size) {
            p->reserved = (uint64_t)seg.st_blocks * 512;
            if (p->reserved > p->size)
                p->reserved = p->size;
        }
    }
    for (i = 0; i < s->n_fs; i++)
        if (s->fs[i].dev == st.st_dev)
            break;
    if (i == s->n_fs) {
        struct sizing_fs *fs = &s->fs[s->n_fs];
        struct statvfs vfs;
        struct statfs sfs;

        if (segment_check_space(pc->dir, 0, &free_bytes, &err) < 0) {
            fprintf(s->out, "pool '%s': %s\n", pc->name, err.message);
            return 2;
        }
        s->n_fs++;
        fs->dev = st.st_dev;
        fs->dir = pc->dir;
        fs->free = free_bytes;
        fs->page = page != SHMB_HEADER_PAGE ? page : 0;
        if (statvfs(pc->dir, &vfs) == 0)
            fs->total = (uint64_t)vfs.f_blocks * (uint64_t)vfs.f_frsize;
        sizing_mount_of(pc->dir, fs->mount, sizeof(fs->mount));
        fs->type = fs->page                                   ? "hugetlbfs"
                   : statfs(pc->dir, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC ? "tmpfs"
                                                                             : "file system";
        fs->fits = true;
    }
    p->fs = (int)i;
    return 0;
}

/* One pool's line: what, where, and whether it fits with the ones before it. */
static void sizing_print_pool(const struct sizing *s, const struct sizing_pool *p,
                              uint64_t cumulative, uint64_t room, bool first)
{
    char b[4][32];
    const struct pool_config *pc = p->pc;

    fprintf(s->out, "  pool '%s' (%s, %s", pc->name, sizing_backing_name(pc->backing),
            shmb_format_bytes(p->size, b[0], sizeof(b[0])));
    if (p->size != pc->size)
        fprintf(s->out, ", rounded up from %llu bytes", (unsigned long long)pc->size);
    if (pc->backing == POOL_BACKING_MEMFD)
        fprintf(s->out, ") -> memfd:%s: ", pc->segment);
    else
        fprintf(s->out, ") -> %s/%s: ", pc->dir, pc->segment);
    fprintf(s->out, "%s (needs %s%s; %s %s)\n", p->fits ? "fits" : "does NOT fit",
            shmb_format_bytes(cumulative, b[1], sizeof(b[1])),
            first ? "" : " with the pools above",
            shmb_format_bytes(room, b[2], sizeof(b[2])),
            pc->backing == POOL_BACKING_MEMFD ? "of memory room" : "free");
    if (p->reserved > 0)
        fprintf(s->out, "    (the segment is there already, of this size: its %s "
                        "reserved are counted as its own)\n",
                shmb_format_bytes(p->reserved, b[3], sizeof(b[3])));
}

/* The memory line: MemAvailable and the memory cgroup. */
static void sizing_print_memory(const struct sizing *s)
{
    char b[4][32];
    const struct host_memory *m = &s->mem;

    fprintf(s->out, "memory: %s available (MemAvailable)",
            shmb_format_bytes(m->mem_available, b[0], sizeof(b[0])));
    if (m->has_cgroup_limit)
        fprintf(s->out, "; memory cgroup v%d %s: limit %s, %s in use, %s room\n",
                m->cgroup_version, m->cgroup_path,
                shmb_format_bytes(m->cgroup_limit, b[1], sizeof(b[1])),
                shmb_format_bytes(m->cgroup_usage, b[2], sizeof(b[2])),
                shmb_format_bytes(m->cgroup_limit > m->cgroup_usage
                                      ? m->cgroup_limit - m->cgroup_usage
                                      : 0,
                                  b[3], sizeof(b[3])));
    else if (m->cgroup_version != 0)
        fprintf(s->out, "; memory cgroup v%d %s: no limit\n", m->cgroup_version,
                m->cgroup_path);
    else
        fprintf(s->out, "; no memory cgroup found\n");
}

/* The memory no setting can make: memory-backed pools (tmpfs pages and
 * memfds are both memory) past MemAvailable. A larger tmpfs or a higher
 * cgroup limit only lets the daemon begin reserving what the host does not
 * have (swapping, or the OOM killer, meets it). */
static void sizing_print_memory_short(const struct sizing *s)
{
    char b[2][32];

    fprintf(s->out,
            "- memory: NO setting fixes this: the pools' pages are memory (a tmpfs's and a "
            "memfd's alike), %s of them, and this host has %s available (MemAvailable). A "
            "larger tmpfs or memory limit would only let the start reserve what is not "
            "there, and the kernel would swap or kill processes for it. Choose pools of at "
            "most %s in all, or run them on a host with more free memory.\n",
            shmb_format_bytes(s->mem_need, b[0], sizeof(b[0])),
            shmb_format_bytes(s->mem.mem_available, b[1], sizeof(b[1])),
            shmb_format_bytes(s->mem.mem_available, b[1], sizeof(b[1])));
}

/* The fix of a tmpfs, with its figure explained: the pools' bytes, what
 * the mount holds now, and the headroom. */
static void sizing_print_fs_fix(const struct sizing *s, const struct sizing_fs *fs)
{
    uint64_t used = fs->total > fs->free ? fs->total - fs->free : 0;
    uint64_t mib = sizing_with_headroom_mib(used + fs->need);
    uint64_t headroom = mib * MIB > used + fs->need ? mib * MIB - used - fs->need : 0;
    char b[4][32];

    if (fs->page) {
        uint64_t missing = (fs->need - fs->free + fs->page - 1) / fs->page;

        fprintf(s->out,
                "- %s: reserve %llu more huge pages of %s (sysctl vm.nr_hugepages, or "
                "/sys/kernel/mm/hugepages/hugepages-%llukB/nr_hugepages), or raise "
                "the mount's size=.\n",
                fs->dir, (unsigned long long)missing,
                shmb_format_bytes(fs->page, b[0], sizeof(b[0])),
                (unsigned long long)(fs->page / 1024));
        return;
    }
    fprintf(s->out, "- %s needs %s more room%s; a size of %llu MiB is the pools' %s, the %s "
                    "%s holds now, and %s of headroom (an eighth, at least 16 MiB: other "
                    "users of it, rounding):\n",
            fs->mount, shmb_format_bytes(fs->need - fs->free, b[0], sizeof(b[0])),
            s->mem_short ? " (and memory to hold it, above)" : "", (unsigned long long)mib,
            shmb_format_bytes(fs->need, b[1], sizeof(b[1])),
            shmb_format_bytes(used, b[2], sizeof(b[2])), fs->mount,
            shmb_format_bytes(headroom, b[3], sizeof(b[3])));
    sizing_print_tmpfs_fix(s->out, s->where, fs->mount, fs->total, used + fs->need);
}

/* "To fix it": what memory cannot hold first, then each file system, the
 * memory cgroup, and memfd in place of a tmpfs. */
static void sizing_print_fixes(const struct sizing *s)
{
    char b[2][32], flag[32];
    unsigned i, j;

    fprintf(s->out, "\nTo fix it (%s):\n", host_container_name(s->where));
    if (s->mem_short)
        sizing_print_memory_short(s);
    for (i = 0; i < s->n_fs; i++)
        if (!s->fs[i].fits)
            sizing_print_fs_fix(s, &s->fs[i]);
    if (s->memfd_over || s->cgroup_over) {
        uint64_t limit_needed = s->mem.has_cgroup_limit ? s->mem.cgroup_usage + s->mem_need
                                                        : s->mem_need;

        fprintf(s->out, "- memory: %s needed by memory-backed pools, %s room:\n",
                shmb_format_bytes(s->cgroup_over ? s->mem_need : s->memfd_need, b[0],
                                  sizeof(b[0])),
                shmb_format_bytes(s->room, b[1], sizeof(b[1])));
        sizing_print_memory_fix(s, limit_needed);
    }
    /* memfd needs no /dev/shm at all: the way out without touching the
     * container, when memory has the room. */
    if (s->failing_shm > 0 && s->mem_known && !s->cgroup_over && !s->mem_short &&
        s->memfd_need + s->failing_shm <= s->room) {
        fprintf(s->out, "- or, with no change to %s: back the pools that do not fit with "
                        "memory (it has %s room), which takes no room in any file system:\n",
                s->where == HOST_BARE ? "the mounts" : "the container",
                shmb_format_bytes(s->room, b[0], sizeof(b[0])));
        for (j = 0; j < s->n_pools; j++)
            if (!s->pools[j].fits && s->pools[j].pc->backing == POOL_BACKING_SHM)
                fprintf(s->out, "  --pool %s:%s,backing=memfd\n", s->pools[j].pc->name,
                        sizing_size_flag(s->pools[j].pc->size, flag, sizeof(flag)));
    }
}

/* Each file system: its pools in order, each fitting with those before. */
static void sizing_check_fs(struct sizing *s, unsigned *n_bad)
{
    char b[2][32];
    uint64_t cum;
    unsigned i, j;

    for (i = 0; i < s->n_fs; i++) {
        struct sizing_fs *fs = &s->fs[i];
        bool first = true;

        fprintf(s->out, "\n%s (%s mounted at %s): %s free", fs->dir, fs->type, fs->mount,
                shmb_format_bytes(fs->free, b[0], sizeof(b[0])));
        if (fs->page)
            fprintf(s->out, " (%llu free huge pages of %s)\n",
                    (unsigned long long)(fs->free / fs->page),
                    shmb_format_bytes(fs->page, b[1], sizeof(b[1])));
        else
            fprintf(s->out, " of %s\n", shmb_format_bytes(fs->total, b[1], sizeof(b[1])));
        cum = 0;
        for (j = 0; j < s->n_pools; j++) {
            struct sizing_pool *p = &s->pools[j];

            if (p->fs != (int)i)
                continue;
            cum += p->size - p->reserved;
            p->fits = cum <= fs->free;
            if (!p->fits) {
                fs->fits = false;
                (*n_bad)++;
                if (p->pc->backing == POOL_BACKING_SHM)
                    s->failing_shm += p->size - p->reserved;
            }
            if (p->pc->backing != POOL_BACKING_HUGETLBFS && !fs->page)
                s->mem_need += p->size - p->reserved;
            sizing_print_pool(s, p, cum, fs->free, first);
            first = false;
        }
        fs->need = cum;
    }
}

/* memfd pools: against the memory room. */
static void sizing_check_memfd(struct sizing *s, unsigned *n_bad)
{
    char b[32];
    uint64_t cum = 0;
    unsigned j;

    for (j = 0; j < s->n_pools; j++) {
        struct sizing_pool *p = &s->pools[j];

        if (p->fs >= 0)
            continue;
        if (cum == 0)
            fprintf(s->out, "\nmemory (memfd pools): %s room\n",
                    s->mem_known ? shmb_format_bytes(s->room, b, sizeof(b)) : "unknown");
        cum += p->size;
        s->mem_need += p->size;
        p->fits = s->mem_known && cum <= s->room;
        if (!p->fits) {
            (*n_bad)++;
            s->memfd_over = true;
        }
        sizing_print_pool(s, p, cum, s->room, cum == p->size);
    }
    s->memfd_need = cum;
}

/* Memory-backed pools against the memory cgroup's limit and MemAvailable.
 * tmpfs pages are charged to the cgroup of whoever touches them first: the
 * daemon, which reserves them all at start-up. */
static void sizing_check_memory(struct sizing *s)
{
    char b[2][32];

    if (!s->mem_known || s->mem_need == 0)
        return;
    if (s->mem.has_cgroup_limit) {
        uint64_t cg_room = s->mem.cgroup_limit > s->mem.cgroup_usage
                               ? s->mem.cgroup_limit - s->mem.cgroup_usage
                               : 0;

        fprintf(s->out,
                "\nshm pools' tmpfs pages and memfd pools are charged to the daemon's "
                "memory cgroup (it touches them first, reserving them): %s together, "
                "%s room under its limit: %s\n",
                shmb_format_bytes(s->mem_need, b[0], sizeof(b[0])),
                shmb_format_bytes(cg_room, b[1], sizeof(b[1])),
                s->mem_need <= cg_room ? "fits" : "does NOT fit");
        s->cgroup_over = s->mem_need > cg_room;
    } else if (s->mem.cgroup_version != 0) {
        fprintf(s->out,
                "\nshm pools' tmpfs pages and memfd pools are charged to the daemon's "
                "memory cgroup (it touches them first, reserving them); it has no limit.\n");
    }
    s->mem_short = s->mem_need > s->mem.mem_available;
    if (s->mem_short)
        fprintf(s->out,
                "\nmemory-backed pools need %s of memory, and the host has %s available "
                "(MemAvailable): does NOT fit, whatever the settings\n",
                shmb_format_bytes(s->mem_need, b[0], sizeof(b[0])),
                shmb_format_bytes(s->mem.mem_available, b[1], sizeof(b[1])));
}

int sizing_report(const struct config *cfg, FILE *out)
{
    static struct sizing s;
    struct shmb_error err = {0};
    unsigned i, j, n_bad = 0;
    int rc = 0;

    memset(&s, 0, sizeof(s));
    s.out = out;
    s.where = host_container();
    fprintf(out, "shmbrokerd --check: %u pool%s, on %s; nothing is created\n", cfg->n_pools,
            cfg->n_pools == 1 ? "" : "s", host_container_name(s.where));
    if (host_memory(&s.mem, &err) == 0) {
        s.mem_known = true;
        s.room = host_memory_room(&s.mem);
        sizing_print_memory(&s);
    } else {
        fprintf(out, "memory: unknown: %s\n", err.message);
    }
    for (i = 0; i < cfg->n_pools && i < CONFIG_MAX_POOLS; i++)
        if (sizing_add_pool(&s, &cfg->pools[i]) != 0)
            rc = 2;
    if (rc != 0)
        return rc;
    sizing_check_fs(&s, &n_bad);
    sizing_check_memfd(&s, &n_bad);
    if (!s.mem_known && s.memfd_need > 0)
        rc = 2;
    sizing_check_memory(&s);

    fprintf(out, "\n");
    if (n_bad == 0 && !s.cgroup_over && !s.mem_short) {
        fprintf(out, "Summary: %s.\n",
                s.n_pools == 1 ? "the pool fits" : "all the pools fit");
        return rc;
    }
    if (n_bad > 0) {
        bool listed = false;

        fprintf(out, "Summary: %u of %u pool%s %s NOT fit:", n_bad, s.n_pools,
                s.n_pools == 1 ? "" : "s", n_bad == 1 ? "does" : "do");
        for (j = 0; j < s.n_pools; j++)
            if (!s.pools[j].fits) {
                fprintf(out, "%s '%s'", listed ? "," : "", s.pools[j].pc->name);
                listed = true;
            }
        fprintf(out, "%s", s.mem_short ? "; " : ".\n");
    } else if (s.cgroup_over) {
        fprintf(out, "Summary: the pools do NOT fit in the memory cgroup's limit%s",
                s.mem_short ? "; " : ".\n");
    } else {
        fprintf(out, "Summary: ");
    }
    if (s.mem_short)
        fprintf(out, "this host's memory cannot hold them, and no setting fixes that.\n");
    sizing_print_fixes(&s);
    return rc != 0 ? rc : 1;
}
