// SPDX-License-Identifier: Apache-2.0
/*
 * Facts about the host: /proc/meminfo, the memory cgroup (v2 memory.max or
 * v1 memory.limit_in_bytes, over our cgroup and its ancestors) and signs of
 * a container. Only reads; every path is under a root prefix so that tests
 * can hand it a fake /proc and /sys.
 */
#include "host.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cgroup v1 says "no limit" with the largest page-aligned counter value
 * (9223372036854771712 on 4 KiB pages); anything this large is no limit. */
#define HOST_V1_UNLIMITED (1ULL << 62)
/* A cgroup file holds one number or "max"; /proc/self/cgroup and mountinfo
 * lines are short, but a path can be long. */
#define HOST_LINE_MAX (PATH_MAX * 2 + 256)

/* root and path joined into out; false when it does not fit. */
static bool host_join(char *out, size_t len, const char *root, const char *path)
{
    int n = snprintf(out, len, "%s%s", root, path);

    return n >= 0 && (size_t)n < len;
}

/* src into dst of len bytes, cut short if it must be (a path for messages). */
static void host_copy(char *dst, size_t len, const char *src)
{
    size_t n = strnlen(src, len - 1);

    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* The first line of root/path without its newline; false when unreadable. */
static bool host_read_line(const char *root, const char *path, char *out, size_t len)
{
    char full[PATH_MAX];
    FILE *fp;
    bool ok;

    if (!host_join(full, sizeof(full), root, path) || (fp = fopen(full, "re")) == NULL)
        return false;
    ok = fgets(out, (int)len, fp) != NULL;
    fclose(fp);
    if (ok)
        out[strcspn(out, "\n")] = '\0';
    return ok;
}

/* One unsigned decimal number filling text (surrounding blanks allowed). */
static bool host_parse_u64(const char *text, uint64_t *out)
{
    unsigned long long v;
    char *end;

    while (*text == ' ' || *text == '\t')
        text++;
    if (*text < '0' || *text > '9')
        return false;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end != '\0')
        return false;
    *out = v;
    return true;
}

/* MemAvailable (MemFree on kernels before 3.14) from root/proc/meminfo. */
static int host_meminfo(const char *root, uint64_t *avail, struct shmb_error *err)
{
    char path[PATH_MAX], line[256];
    unsigned long long kib, free_kib = 0;
    bool have_avail = false, have_free = false;
    FILE *fp;

    if (!host_join(path, sizeof(path), root, "/proc/meminfo") ||
        (fp = fopen(path, "re")) == NULL) {
        int saved = errno;
        return shmb_error_set(err, -EIO, "Cannot read available memory from %s: %s.",
                              path, strerror(saved));
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            have_avail = true;
        else if (sscanf(line, "MemFree: %llu kB", &free_kib) == 1)
            have_free = true;
    }
    fclose(fp);
    if (!have_avail && !have_free)
        return shmb_error_set(err, -EIO,
                              "Cannot read available memory from %s: it has no "
                              "MemAvailable or MemFree line.",
                              path);
    if (!have_avail)
        kib = free_kib;
    *avail = kib > UINT64_MAX / 1024 ? UINT64_MAX : (uint64_t)kib * 1024;
    return 0;
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void host_unescape(char *s)
{
    char *w = s;

    for (; *s != '\0'; s++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *w++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *w++ = *s;
        }
    }
    *w = '\0';
}

/* Whether the comma-separated list has item. */
static bool host_list_has(const char *list, const char *item)
{
    size_t n = strlen(item);

    while (*list != '\0') {
        size_t len = strcspn(list, ",");

        if (len == n && strncmp(list, item, n) == 0)
            return true;
        list += len;
        if (*list == ',')
            list++;
    }
    return false;
}

/* Our memory cgroup's path from root/proc/self/cgroup, and its version: a v1
 * line naming the memory controller wins (on a hybrid host the controller is
 * there), else the v2 line "0::PATH". */
static int host_cgroup_of_self(const char *root, char *path, size_t len)
{
    char file[PATH_MAX], line[HOST_LINE_MAX], v2[PATH_MAX] = "";
    bool have_v2 = false;
    FILE *fp;

    if (!host_join(file, sizeof(file), root, "/proc/self/cgroup") ||
        (fp = fopen(file, "re")) == NULL)
        return 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        char *c1 = strchr(line, ':'), *c2;

        line[strcspn(line, "\n")] = '\0';
        if (c1 == NULL || (c2 = strchr(c1 + 1, ':')) == NULL || c2[1] != '/')
            continue;
        *c1 = *c2 = '\0';
        if (strcmp(line, "0") == 0 && c1[1] == '\0') {
            have_v2 = snprintf(v2, sizeof(v2), "%s", c2 + 1) < (int)sizeof(v2);
        } else if (host_list_has(c1 + 1, "memory")) {
            fclose(fp);
            return snprintf(path, len, "%s", c2 + 1) < (int)len ? 1 : 0;
        }
    }
    fclose(fp);
    if (have_v2 && snprintf(path, len, "%s", v2) < (int)len)
        return 2;
    return 0;
}

/* The mount of the memory cgroup hierarchy of version (cgroup2, or cgroup
 * with the memory option) whose root best contains cgpath: its mount point
 * and root. false when there is none. */
static bool host_cgroup_mount(const char *root, int version, const char *cgpath,
                              char *mnt, char *mnt_root, size_t len)
{
    char file[PATH_MAX], line[HOST_LINE_MAX];
    size_t best = 0;
    bool found = false;
    FILE *fp;

    if (!host_join(file, sizeof(file), root, "/proc/self/mountinfo") ||
        (fp = fopen(file, "re")) == NULL)
        return false;
    while (fgets(line, sizeof(line), fp) != NULL) {
        char *field[6], *dash, *fstype, *opts, *save = NULL;
        int i;

        line[strcspn(line, "\n")] = '\0';
        /* Optional fields come before " - ": split there first. */
        if ((dash = strstr(line, " - ")) == NULL)
            continue;
        *dash = '\0';
        fstype = strtok_r(dash + 3, " ", &save);
        (void)strtok_r(NULL, " ", &save); /* source */
        opts = strtok_r(NULL, " ", &save);
        save = NULL;
        for (i = 0; i < 6; i++)
            if ((field[i] = strtok_r(i == 0 ? line : NULL, " ", &save)) == NULL)
                break;
        if (i < 5 || fstype == NULL)
            continue;
        if (version == 2 ? strcmp(fstype, "cgroup2") != 0
                         : strcmp(fstype, "cgroup") != 0 || opts == NULL ||
                               !host_list_has(opts, "memory"))
            continue;
        host_unescape(field[3]);
        host_unescape(field[4]);
        size_t rlen = strlen(field[3]);
        bool contains = strcmp(field[3], "/") == 0 ||
                        (strncmp(cgpath, field[3], rlen) == 0 &&
                         (cgpath[rlen] == '/' || cgpath[rlen] == '\0'));
        /* The mount whose root holds our cgroup, the deepest such; else the
         * first (a cgroup namespace may show a path outside every root). */
        if ((contains && (!found || rlen + 1 > best)) || !found) {
            if (strlen(field[4]) >= len || rlen >= len)
                continue;
            strcpy(mnt, field[4]);
            strcpy(mnt_root, field[3]);
            best = contains ? rlen + 1 : 0;
            found = true;
        }
    }
    fclose(fp);
    return found;
}

/* A number file of the cgroup directory dir (under root): 1 and *value, 0
 * when it says "max" (no limit), -1 when it is absent or not a number. */
static int host_cgroup_number(const char *root, const char *dir, const char *name,
                              uint64_t *value)
{
    char path[PATH_MAX], text[64];

    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path) ||
        !host_read_line(root, path, text, sizeof(text)))
        return -1;
    if (strcmp(text, "max") == 0)
        return 0;
    return host_parse_u64(text, value) ? 1 : -1;
}

/* The inactive file cache of the cgroup dir, which the kernel reclaims before
 * the limit is hit: v2's inactive_file, v1's total_inactive_file (the
 * hierarchy's). 0 when memory.stat does not say. */
static uint64_t host_cgroup_inactive(const char *root, const char *dir, int version)
{
    const char *key = version == 2 ? "inactive_file " : "total_inactive_file ";
    char path[PATH_MAX], line[256];
    uint64_t value = 0;
    FILE *fp;

    if (snprintf(path, sizeof(path), "%s%s/memory.stat", root, dir) >= (int)sizeof(path) ||
        (fp = fopen(path, "re")) == NULL)
        return 0;
    while (fgets(line, sizeof(line), fp) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, key, strlen(key)) == 0) {
            if (!host_parse_u64(line + strlen(key), &value))
                value = 0;
            break;
        }
    }
    fclose(fp);
    return value;
}

/* Fill the cgroup fields of m: our memory cgroup and the ancestor (or
 * itself) with the least room under its limit, up to the mount's root. */
static void host_cgroup(const char *root, struct host_memory *m)
{
    char cgpath[PATH_MAX], mnt[PATH_MAX], mnt_root[PATH_MAX], dir[PATH_MAX], test[PATH_MAX];
    const char *rel, *limit_name, *usage_name;
    size_t rlen, mlen;
    uint64_t best_room = UINT64_MAX;
    int version = host_cgroup_of_self(root, cgpath, sizeof(cgpath));

    if (version == 0 || !host_cgroup_mount(root, version, cgpath, mnt, mnt_root, sizeof(mnt)))
        return;
    /* Our cgroup's directory: the path less the mount's root. Under a cgroup
     * namespace the path can be outside the mount's root (the namespace's
     * root is what is mounted): then the mount itself is our cgroup. */
    rlen = strlen(mnt_root);
    if (strcmp(mnt_root, "/") == 0)
        rel = cgpath;
    else if (strncmp(cgpath, mnt_root, rlen) == 0 &&
             (cgpath[rlen] == '/' || cgpath[rlen] == '\0'))
        rel = cgpath + rlen;
    else
        rel = "";
    if (strcmp(rel, "/") == 0)
        rel = "";
    if (snprintf(dir, sizeof(dir), "%s%s", mnt, rel) >= (int)sizeof(dir))
        return;
    if (rel[0] != '\0' && (!host_join(test, sizeof(test), root, dir) || access(test, F_OK) != 0))
        snprintf(dir, sizeof(dir), "%s", mnt);
    m->cgroup_version = version;
    host_copy(m->cgroup_path, sizeof(m->cgroup_path), dir);
    limit_name = version == 2 ? "memory.max" : "memory.limit_in_bytes";
    usage_name = version == 2 ? "memory.current" : "memory.usage_in_bytes";
    mlen = strlen(mnt);
    for (;;) {
        uint64_t limit = 0, usage = 0, inactive, room;
        char *slash;

        /* A level whose files are missing or garbled tells nothing. */
        if (host_cgroup_number(root, dir, limit_name, &limit) == 1 &&
            (version == 2 || limit < HOST_V1_UNLIMITED) &&
            host_cgroup_number(root, dir, usage_name, &usage) == 1) {
            inactive = host_cgroup_inactive(root, dir, version);
            usage = inactive <= usage ? usage - inactive : 0;
            room = limit > usage ? limit - usage : 0;
            if (room < best_room) {
                best_room = room;
                m->has_cgroup_limit = true;
                m->cgroup_limit = limit;
                m->cgroup_usage = usage;
                host_copy(m->cgroup_path, sizeof(m->cgroup_path), dir);
            }
        }
        if (strlen(dir) <= mlen || (slash = strrchr(dir, '/')) == NULL ||
            (size_t)(slash - dir) < mlen)
            break;
        *slash = '\0';
    }
}

int host_memory_at(const char *root, struct host_memory *out, struct shmb_error *err)
{
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = host_meminfo(root, &out->mem_available, err)) < 0)
        return rc;
    host_cgroup(root, out);
    return 0;
}

int host_memory(struct host_memory *out, struct shmb_error *err)
{
    return host_memory_at("", out, err);
}

uint64_t host_memory_room(const struct host_memory *m)
{
    uint64_t room = m->mem_available;

    if (m->has_cgroup_limit) {
        uint64_t cg = m->cgroup_limit > m->cgroup_usage ? m->cgroup_limit - m->cgroup_usage : 0;

        if (cg < room)
            room = cg;
    }
    return room;
}

/* A cgroup path that only a container's process has. */
static bool host_cgroup_looks_contained(const char *root)
{
    static const char *const hints[] = {"/docker/", "/docker-", "kubepods", "containerd",
                                        "libpod"};
    char file[PATH_MAX], line[HOST_LINE_MAX];
    bool found = false;
    size_t i;
    FILE *fp;

    if (!host_join(file, sizeof(file), root, "/proc/self/cgroup") ||
        (fp = fopen(file, "re")) == NULL)
        return false;
    while (!found && fgets(line, sizeof(line), fp) != NULL)
        for (i = 0; i < sizeof(hints) / sizeof(hints[0]); i++)
            if (strstr(line, hints[i]) != NULL)
                found = true;
    fclose(fp);
    return found;
}

enum host_container host_container_at(const char *root, const char *k8s_host)
{
    char path[PATH_MAX];

    /* A pod first: its container may have been started by Docker as well. */
    if (k8s_host != NULL && k8s_host[0] != '\0')
        return HOST_KUBERNETES;
    if (host_join(path, sizeof(path), root, "/.dockerenv") && access(path, F_OK) == 0)
        return HOST_DOCKER;
    if (host_join(path, sizeof(path), root, "/run/.containerenv") && access(path, F_OK) == 0)
        return HOST_CONTAINER;
    return host_cgroup_looks_contained(root) ? HOST_CONTAINER : HOST_BARE;
}

enum host_container host_container(void)
{
    return host_container_at("", getenv("KUBERNETES_SERVICE_HOST"));
}

const char *host_container_name(enum host_container where)
{
    switch (where) {
    case HOST_DOCKER:
        return "Docker";
    case HOST_KUBERNETES:
        return "Kubernetes";
    case HOST_CONTAINER:
        return "a container";
    case HOST_BARE:
        break;
    }
    return "bare host";
}
