// SPDX-License-Identifier: Apache-2.0
/*
 * Pools: the segments of a daemon, each with its store.
 */
#include "pool.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../proto/alloc.h"
#include "../proto/text.h"
#include "catalog.h"
#include "host.h"
#include "log.h"

const char *pool_backing_name(enum pool_backing backing)
{
    switch (backing) {
    case POOL_BACKING_SHM: return "shm";
    case POOL_BACKING_MEMFD: return "memfd";
    case POOL_BACKING_HUGETLBFS: return "hugetlbfs";
    }
    return "?";
}

/* Put a pool's words before the message err holds (which shmb_error_set
 * cannot read while it writes). */
static int pool_error_before(struct shmb_error *err, int code, const char *what)
{
    char was[SHMB_ERROR_MSG_MAX];

    snprintf(was, sizeof(was), "%s", err->message);
    return shmb_error_set(err, code, "%s%s", what, was);
}

/* A message from below that names "--size" as the fix: for a declared
 * pool, whose size is not --size, say which setting instead. */
static void pool_error_setting(struct shmb_error *err, const struct pool_config *pc)
{
    static const char *const adjectives[] = {"a smaller ", "a larger "};
    char was[SHMB_ERROR_MSG_MAX];
    const char *at, *adjective = NULL;
    size_t i, n;

    if (err == NULL || (at = strstr(err->message, "--size")) == NULL)
        return;
    snprintf(was, sizeof(was), "%s", err->message);
    /* "choose a smaller --size" reads "choose a smaller size for pool
     * 'main'", not "a smaller the pool's size". */
    for (i = 0; i < sizeof(adjectives) / sizeof(adjectives[0]); i++) {
        n = strlen(adjectives[i]);
        if ((size_t)(at - err->message) >= n && strncmp(at - n, adjectives[i], n) == 0) {
            adjective = adjectives[i];
            at -= n;
            break;
        }
    }
    n = at - err->message;
    at = was + n + (adjective != NULL ? strlen(adjective) : 0) + strlen("--size");
    snprintf(err->message, sizeof(err->message), "%.*s%s%s pool '%s' (--pool %s:SIZE)%s",
             (int)n, was, adjective != NULL ? adjective : "the ",
             adjective != NULL ? "size for" : "size of", pc->name, pc->name, at);
}

/* The implicit pool (no --pool) speaks of the flags; a declared one of
 * itself. */
static bool pool_declared(const struct pool_config *pc)
{
    return strcmp(pc->segment, pc->name) != 0;
}

/* What a size belongs to, for messages: "--size" (the implicit pool), or
 * "the size of pool 'frames'". */
static const char *pool_what(const struct pool_config *pc, char *buf, size_t len)
{
    if (pool_declared(pc))
        snprintf(buf, len, "the size of pool '%s'", pc->name);
    else
        snprintf(buf, len, "--size");
    return buf;
}

int pool_check_settings(const struct pool_config *pc, uint64_t *size, struct shmb_error *err)
{
    uint64_t page = SHMB_HEADER_PAGE;
    char h1[32], what[64];
    int rc;

    pool_what(pc, what, sizeof(what));
    *size = segment_round_size(pc->size);
    /* A file's size is an off_t: past INT64_MAX (or wrapped to 0 by the
     * rounding) no file can be made, whatever room there is. */
    if (pc->size > (uint64_t)INT64_MAX - (SHMB_HEADER_PAGE - 1))
        return shmb_error_set(err, -EFBIG,
                              "%s (%llu bytes) is too large: a file holds at most %llu "
                              "bytes. Choose a smaller size, such as 64G.",
                              what, (unsigned long long)pc->size,
                              (unsigned long long)((uint64_t)INT64_MAX /
                                                   SHMB_HEADER_PAGE * SHMB_HEADER_PAGE));
    if (*size < SEGMENT_MIN_SIZE)
        return pool_declared(pc)
                   ? shmb_error_set(err, -EINVAL,
                                    "--pool %s: size %llu is too small: a pool needs at "
                                    "least %u bytes (a header page and a data page).",
                                    pc->name, (unsigned long long)pc->size, SEGMENT_MIN_SIZE)
                   : shmb_error_set(err, -EINVAL,
                                    "--size %llu is too small: the segment needs at least %u "
                                    "bytes (a header page and a data page).",
                                    (unsigned long long)pc->size, SEGMENT_MIN_SIZE);
    if (pc->backing != POOL_BACKING_MEMFD)
        page = segment_page_size(pc->dir);
    if (pc->backing == POOL_BACKING_HUGETLBFS && page == SHMB_HEADER_PAGE)
        return shmb_error_set(err, -EINVAL,
                              "--pool %s: backing=hugetlbfs needs dir= on a hugetlbfs mount, "
                              "and %s is not one (mount -t hugetlbfs none DIR, and reserve "
                              "huge pages with sysctl vm.nr_hugepages=N).",
                              pc->name, pc->dir);
    /* A hugetlbfs file is a whole number of huge pages. */
    if (page != SHMB_HEADER_PAGE && *size % page != 0) {
        uint64_t rounded = segment_round_to(*size, page);

        if (rounded == 0)
            return shmb_error_set(err, -EINVAL, "%s %llu is too large.", what,
                                  (unsigned long long)pc->size);
        log_info("%s %llu rounded up to %llu bytes: %s is a hugetlbfs mount with %s pages",
                 what, (unsigned long long)pc->size, (unsigned long long)rounded, pc->dir,
                 shmb_format_bytes(page, h1, sizeof(h1)));
        *size = rounded;
    }
    if ((rc = segment_check_name(pc->segment, err)) < 0)
        return rc;
    snprintf(what, sizeof(what), "--pool %s: ", pc->name);
    if ((rc = store_check_max_object(segment_data_size(*size, page, pc->max_objects),
                                     pc->max_object_size, err)) < 0 &&
        pool_declared(pc)) {
        pool_error_setting(err, pc);
        return pool_error_before(err, rc, what);
    }
    return rc;
}

struct pool *pool_new(const struct pool_config *pc, uint64_t size, struct shmb_error *err)
{
    struct pool *p = shmb_calloc(1, sizeof(*p));

    if (p == NULL) {
        shmb_error_set(err, -ENOMEM, "Out of memory for pool '%s'.", pc->name);
        return NULL;
    }
    p->cfg = *pc;
    p->size = size;
    p->seg.fd = p->seg.ro_fd = p->seg.lock_fd = -1;
    p->kept_fd = -1;
    if (pool_declared(pc))
        snprintf(p->size_setting, sizeof(p->size_setting), "size of pool '%s' (--pool %s:SIZE)",
                 pc->name, pc->name);
    else
        snprintf(p->size_setting, sizeof(p->size_setting), "--size");
    return p;
}

void pool_free(struct pool *p)
{
    if (p != NULL && p->kept_fd >= 0)
        close(p->kept_fd);
    shmb_free(p);
}

/* "Choose another --name." or, for a pool, what to change about it. */
static const char *pool_rename_hint(const struct pool_config *pc)
{
    return pool_declared(pc) ? "choose another --name (the pool's segment is "
                               "<--name>.<pool>)"
                             : "choose another --name";
}

int pool_plan(struct pool *p, bool fresh, struct shmb_error *err)
{
    const struct pool_config *pc = &p->cfg;
    char path[PATH_MAX + NAME_MAX + 2];
    struct stat st;
    int64_t pid = 0;
    enum segment_owner owner;
    int rc;

    if (pc->backing == POOL_BACKING_MEMFD) {
        /* No name: only what systemd kept can be there. */
        if (p->kept_fd >= 0 && fresh) {
            /* Clients of the last daemon may still map it. */
            (void)segment_retire_fd(p->kept_fd);
            close(p->kept_fd);
            p->kept_fd = -1;
        }
        p->adopt = p->kept_fd >= 0;
        return 0;
    }
    owner = segment_probe_existing(pc->dir, pc->segment, &pid);
    snprintf(path, sizeof(path), "%s/%s", pc->dir, pc->segment);
    /* Never adopted, never removed (--fresh included): anything but a
     * regular file, and a file another user could read or change (not ours,
     * group or other bits, more than one link), whatever it holds. */
    if (owner != SEGMENT_ABSENT && owner != SEGMENT_LIVE &&
        (rc = segment_check_existing(pc->dir, pc->segment, err)) < 0 && rc != -ENOENT) {
        if (rc == -EPERM || owner == SEGMENT_ORPHANED)
            return rc;
        /* Not a regular file; or ours but not a segment (messages below). */
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
            return rc;
    }
    switch (owner) {
    case SEGMENT_ABSENT:
        return 0;
    case SEGMENT_LIVE:
        /* A running process holds the file's lock; the pid in the header is
         * only a hint for the human. */
        return shmb_error_set(err, -EBUSY,
                              "Segment %s belongs to a running shmbrokerd (pid %lld), "
                              "which holds the segment's lock; stop it first, or %s.",
                              path, (long long)pid, pool_rename_hint(pc));
    case SEGMENT_FOREIGN:
        /* The header page is a hint too: a regular file of exactly the
         * segment's size under its name, locked by nobody, is a segment whose
         * header a read-write client damaged. It is adopted (its header
         * rebuilt) rather than stranding its objects. */
        if (segment_check_adoptable(pc->dir, pc->segment, p->size, NULL) == 0)
            break;
        /* Shorter than a header page: what a client's ftruncate leaves; say
         * so, since the user may take it for a segment of ours. */
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < SHMB_HEADER_PAGE)
            return shmb_error_set(
                err, -EEXIST,
                "%s exists with %lld bytes, less than a segment's %u-byte header: "
                "not a shmbroker segment, or one a client truncated. Remove it "
                "(nothing in it can be adopted), or %s.",
                path, (long long)st.st_size, SHMB_HEADER_PAGE, pool_rename_hint(pc));
        /* Another user's file this user cannot read: most often the
         * system's daemon under the default name, beside a user's own
         * (make run without root). Never suggest removing it. */
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid != geteuid()) {
            char base[NAME_MAX + 1];
            char *dot;

            /* --name: the segment's name, less ".<pool>" for a declared pool. */
            snprintf(base, sizeof(base), "%s", pc->segment);
            if (pool_declared(pc) && (dot = strrchr(base, '.')) != NULL)
                *dot = '\0';
            return shmb_error_set(
                err, -EEXIST,
                "%s belongs to uid %u, not to this user (uid %u): most likely the "
                "segment of another user's shmbrokerd (the system's, if one runs). "
                "Leave it, and %s (e.g. --name %s-%u; make run "
                "RUN_ARGS='--name %s-%u').",
                path, (unsigned)st.st_uid, (unsigned)geteuid(), pool_rename_hint(pc), base,
                (unsigned)geteuid(), base, (unsigned)geteuid());
        }
        return shmb_error_set(err, -EEXIST,
                              "%s exists and is not a shmbroker segment; remove it, or %s.",
                              path, pool_rename_hint(pc));
    case SEGMENT_ORPHANED:
        break;
    }
    p->adopt_pid = pid;
    if (fresh) {
        p->replace = true;
        return 0;
    }
    p->adopt = true;
    rc = segment_check_adoptable(pc->dir, pc->segment, p->size, err);
    if (rc == -EINVAL && pool_declared(pc) && stat(path, &st) == 0) {
        /* Resized: this pool waits, untouched, for its size; the others
         * come back. */
        p->refused = true;
        return shmb_error_set(
            err, rc,
            "Pool '%s' is not served: its segment %s, left by the previous shmbrokerd, "
            "holds %lld bytes, not the %llu the pool asks for now. To serve its objects, "
            "give it its size again (--pool %s:%lld); to start it empty, remove %s.",
            pc->name, path, (long long)st.st_size, (unsigned long long)p->size, pc->name,
            (long long)st.st_size, path);
    }
    if (rc < 0 && pool_declared(pc)) {
        char what[CONFIG_POOL_NAME_MAX + 16];

        snprintf(what, sizeof(what), "Pool '%s': ", pc->name);
        return pool_error_before(err, rc, what);
    }
    return rc < 0 ? rc : 0;
}

/* The names of the pools in pools[0..n) that share what pools[i] is checked
 * against (the same file system, or memfd), up to i: "a, b". */
static void pool_group_names(struct pool *const *pools, unsigned n, unsigned i,
                             const bool *same, char *out, size_t len)
{
    size_t used = 0;
    unsigned j;

    out[0] = '\0';
    for (j = 0; j <= i && j < n; j++) {
        int w;

        if (!same[j])
            continue;
        w = snprintf(out + used, len - used, "%s%s", used ? ", " : "", pools[j]->cfg.name);
        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
    }
}

/* The memory the pools to be made will take: the memfd pools against the
 * memory available, and those and the tmpfs pools (whose pages are charged
 * to the memory cgroup of the process that reserves them: this daemon)
 * against the room its memory cgroup leaves. Adopted pools hold their pages
 * already; hugetlbfs pages are not charged to the memory cgroup. */
static int pool_check_memory(struct pool *const *pools, unsigned n, struct shmb_error *err)
{
    bool memfd[CONFIG_MAX_POOLS] = {false}, charged[CONFIG_MAX_POOLS] = {false};
    uint64_t memfd_need = 0, charged_need = 0, cgroup_room;
    char names[CONFIG_MAX_POOLS * (CONFIG_POOL_NAME_MAX + 2)], limit[160] = "";
    struct host_memory mem;
    bool any = false, any_memfd = false;
    unsigned i;
    int rc;

    for (i = 0; i < n; i++) {
        if (pools[i]->adopt)
            continue;
        memfd[i] = pools[i]->cfg.backing == POOL_BACKING_MEMFD;
        charged[i] = memfd[i] || pools[i]->cfg.backing == POOL_BACKING_SHM;
        any |= charged[i];
        any_memfd |= memfd[i];
    }
    if (!any)
        return 0;
    if ((rc = host_memory(&mem, err)) < 0)
        return any_memfd ? rc : 0; /* tmpfs pools were checked against their file system */
    cgroup_room = mem.cgroup_usage < mem.cgroup_limit ? mem.cgroup_limit - mem.cgroup_usage : 0;
    if (mem.has_cgroup_limit)
        snprintf(limit, sizeof(limit), "; memory cgroup limit %llu MiB with %llu MiB used",
                 shmb_mib_rounded(mem.cgroup_limit), shmb_mib_rounded(mem.cgroup_usage));
    for (i = 0; i < n; i++) {
        if (memfd[i] && (memfd_need += pools[i]->size) > host_memory_room(&mem)) {
            pool_group_names(pools, n, i, memfd, names, sizeof(names));
            return shmb_error_set(
                err, -ENOSPC,
                "Insufficient memory for memfd pool '%s': %llu MiB required (memfd pools %s "
                "together), %llu MiB available (MemAvailable %llu MiB%s). Make the pools "
                "smaller, raise the memory limit, or use backing=shm.",
                pools[i]->cfg.name, shmb_mib_rounded(memfd_need), names,
                shmb_mib_rounded(host_memory_room(&mem)),
                shmb_mib_rounded(mem.mem_available), limit);
        }
        if (charged[i] && (charged_need += pools[i]->size) > cgroup_room &&
            mem.has_cgroup_limit) {
            pool_group_names(pools, n, i, charged, names, sizeof(names));
            return shmb_error_set(
                err, -ENOSPC,
                "Insufficient memory for pool '%s': pools %s need %llu MiB together, and "
                "their pages count against this daemon's memory cgroup (%s: limit %llu "
                "MiB, %llu MiB used, %llu MiB left). Raise the memory limit, or make the "
                "pools smaller.",
                pools[i]->cfg.name, names, shmb_mib_rounded(charged_need), mem.cgroup_path,
                shmb_mib_rounded(mem.cgroup_limit), shmb_mib_rounded(mem.cgroup_usage),
                shmb_mib_rounded(cgroup_room));
        }
    }
    return 0;
}

int pool_check_space(struct pool *const *pools, unsigned n, struct shmb_error *err)
{
    bool done[CONFIG_MAX_POOLS] = {false};
    char names[CONFIG_MAX_POOLS * (CONFIG_POOL_NAME_MAX + 2)], what[SHMB_ERROR_MSG_MAX];
    unsigned i, j;
    int rc;

    /* The implicit pool alone: today's check and today's message (and then
     * the memory cgroup's room). */
    if (n == 1 && !pool_declared(&pools[0]->cfg) && !pools[0]->adopt &&
        pools[0]->cfg.backing != POOL_BACKING_MEMFD) {
        rc = pools[0]->replace ? segment_check_replace(pools[0]->cfg.dir,
                                                       pools[0]->cfg.segment, pools[0]->size,
                                                       err)
                               : segment_check_space(pools[0]->cfg.dir, pools[0]->size, NULL,
                                                     err);
        return rc < 0 ? rc : pool_check_memory(pools, n, err);
    }
    for (i = 0; i < n; i++) {
        bool same[CONFIG_MAX_POOLS] = {false};
        uint64_t need = 0, reclaim = 0;
        struct stat a, b;

        if (done[i] || pools[i]->cfg.backing == POOL_BACKING_MEMFD)
            continue;
        if (stat(pools[i]->cfg.dir, &a) != 0)
            return segment_check_space(pools[i]->cfg.dir, pools[i]->size, NULL, err);
        /* Every pool on this file system, in order; an adopted one holds its
         * pages already. */
        for (j = i; j < n; j++) {
            if (done[j] || pools[j]->cfg.backing == POOL_BACKING_MEMFD ||
                stat(pools[j]->cfg.dir, &b) != 0 || b.st_dev != a.st_dev)
                continue;
            done[j] = true;
            if (pools[j]->adopt)
                continue;
            same[j] = true;
            need += pools[j]->size;
            if (pools[j]->replace)
                reclaim += segment_reclaimable(pools[j]->cfg.dir, pools[j]->cfg.segment);
            rc = segment_check_space_reclaim(pools[j]->cfg.dir, need, reclaim, NULL, err);
            if (rc == 0)
                continue;
            pool_group_names(pools, n, j, same, names, sizeof(names));
            if (strchr(names, ',') == NULL)
                snprintf(what, sizeof(what), "Pool '%s' does not fit: ", pools[j]->cfg.name);
            else
                snprintf(what, sizeof(what),
                         "Pool '%s' does not fit: pools %s need %llu MiB together in %.256s. ",
                         pools[j]->cfg.name, names, shmb_mib_rounded(need),
                         pools[j]->cfg.dir);
            pool_error_setting(err, &pools[j]->cfg);
            return pool_error_before(err, rc, what);
        }
    }
    return pool_check_memory(pools, n, err);
}

/* Keys of the adopted objects whose bytes run past a truncation point. */
struct pool_lost {
    uint64_t end; /* the file's size when it was found truncated */
    struct {
        char *key;
        size_t len;
    } *keys;
    size_t n, cap;
    bool oom;
};

/* store_list callback: collect an object that ends past lost->end. */
static int pool_collect_lost(const struct store_entry *e, void *arg)
{
    struct pool_lost *lost = arg;
    void *grown;

    if (e->offset + e->size <= lost->end)
        return 0;
    if (lost->n == lost->cap) {
        size_t cap = lost->cap ? lost->cap * 2 : 16;

        if ((grown = shmb_realloc(lost->keys, cap * sizeof(*lost->keys))) == NULL) {
            lost->oom = true;
            return 1;
        }
        lost->keys = grown;
        lost->cap = cap;
    }
    lost->keys[lost->n].len = e->key_len;
    if ((lost->keys[lost->n].key = shmb_strndup(e->key, e->key_len)) == NULL) {
        lost->oom = true;
        return 1;
    }
    lost->n++;
    return 0;
}

/* After adopting a segment a client had truncated (and segment_adopt grew
 * back): an object whose header survived but whose bytes ran past the cut
 * now reads as zeros; drop it rather than serve it. */
static void pool_drop_truncated(struct pool *p, uint64_t truncated_at)
{
    struct pool_lost lost = {.end = truncated_at};
    size_t i;

    store_list(p->store, "", 0, SIZE_MAX, pool_collect_lost, &lost);
    for (i = 0; i < lost.n; i++) {
        log_warn("object '%.*s' dropped: its bytes ran past the %llu bytes left of the "
                 "truncated segment %s",
                 (int)lost.keys[i].len, lost.keys[i].key, (unsigned long long)truncated_at,
                 p->seg.path);
        store_delete(p->store, lost.keys[i].key, lost.keys[i].len, NULL);
        shmb_free(lost.keys[i].key);
    }
    shmb_free(lost.keys);
    if (lost.oom)
        log_error("out of memory listing the objects past the truncation point; some "
                  "may read as zeros");
}

/* The catalog of the pool's segment, just created or adopted, and the store
 * settings that use it (own: scfg with the catalog and, from an adopted
 * header page, the generations already used). */
static int pool_open_catalog(struct pool *p, const struct store_config *scfg,
                             struct store_config *own, struct shmb_error *err)
{
    p->catalog = catalog_new(p->seg.base, p->seg.catalog_offset, p->seg.catalog_slots,
                             p->seg.catalog_seed, p->seg.hdr, err);
    if (p->catalog == NULL)
        return err->code;
    *own = *scfg;
    own->catalog = p->catalog;
    own->gen_floor = p->seg.found_gen_next;
    return 0;
}

/* Bring back the objects of a segment left by a daemon that died. */
static int pool_adopt(struct pool *p, const struct store_config *scfg,
                      void (*on_broken)(const char *message), struct shmb_error *err)
{
    struct store_config own;
    struct store_adopt_report report;
    char h1[32], from[64];
    int rc;

    if (p->cfg.backing == POOL_BACKING_MEMFD) {
        int fd = p->kept_fd;

        p->kept_fd = -1; /* segment_adopt_memfd's now */
        rc = segment_adopt_memfd(&p->seg, fd, p->cfg.segment, p->size, p->cfg.max_objects,
                                 err);
    } else {
        rc = segment_adopt(&p->seg, p->cfg.dir, p->cfg.segment, p->size, p->cfg.max_objects,
                           err);
    }
    if (rc < 0)
        return rc;
    if ((rc = pool_open_catalog(p, scfg, &own, err)) < 0) {
        segment_close(&p->seg);
        return rc;
    }
    scfg = &own;
    if (p->seg.adopt_note[0] != '\0')
        log_warn("segment %s: %s", p->seg.path, p->seg.adopt_note);
    /* The guard before the walk: a client may shrink the file while the
     * daemon reads the chunk headers (they are read through segment_load). */
    if ((rc = segment_guard_watch(&p->seg, on_broken, err)) < 0) {
        catalog_free(p->catalog);
        p->catalog = NULL;
        segment_close(&p->seg);
        return rc;
    }
    /* Only private values: the data area's place and size come from the
     * file's size (segment_adopt), never from the header page, which a client
     * may change during the restart; store_adopt reads the ring cursor once
     * and ring_adopt copies every chunk header before checking it. */
    /* Readers that kept their mapping across the restart look keys up
     * meanwhile: no miss is a proof until every object is listed again. */
    catalog_hold(p->catalog);
    p->store = store_adopt(segment_data(&p->seg), p->seg.data_offset, p->seg.data_size,
                           p->seg.hdr, scfg, &report, err);
    catalog_release(p->catalog);
    if (p->store == NULL) {
        catalog_free(p->catalog);
        p->catalog = NULL;
        segment_close(&p->seg);
        return err->code;
    }
    if (report.corrupt)
        log_warn("segment %s: %s", p->seg.path, report.message);
    if (p->seg.memfd)
        snprintf(from, sizeof(from), "that systemd kept across the restart");
    else
        snprintf(from, sizeof(from), "left by shmbrokerd pid %lld", (long long)p->adopt_pid);
    log_info(
        "adopted segment %s %s: restored %llu object%s (%s); "
        "dropped %llu uncommitted, %llu freed and %llu invalid chunks",
        p->seg.path, from, (unsigned long long)report.restored,
        report.restored == 1 ? "" : "s",
        shmb_format_bytes(report.restored_bytes, h1, sizeof(h1)),
        (unsigned long long)report.dropped_pending, (unsigned long long)report.dropped_free,
        (unsigned long long)report.dropped_invalid);
    if (p->seg.resized_from != 0)
        log_warn("segment %s had been %s by a client to %llu bytes; %s back to its "
                 "%llu bytes (objects in a lost part are gone)",
                 p->seg.path, p->seg.resized_from < p->size ? "truncated" : "grown",
                 (unsigned long long)p->seg.resized_from,
                 p->seg.resized_from < p->size ? "grown" : "truncated",
                 (unsigned long long)p->size);
    if (p->seg.resized_from != 0 && p->seg.resized_from < p->size)
        pool_drop_truncated(p, p->seg.resized_from);
    return 0;
}

/* --fresh, once every check has passed: remove the segment left by a daemon
 * that is gone. */
static int pool_remove_stale(struct pool *p, struct shmb_error *err)
{
    char path[PATH_MAX + NAME_MAX + 2];

    snprintf(path, sizeof(path), "%s/%s", p->cfg.dir, p->cfg.segment);
    /* Clients of the dead daemon may still map it: tell them first. */
    (void)segment_retire_path(path);
    if (unlink(path) != 0 && errno != ENOENT)
        return shmb_error_set(err, -errno, "Cannot remove stale segment %s: %s.", path,
                              strerror(errno));
    log_info("removed segment %s left by shmbrokerd pid %lld, which is gone (--fresh)",
             path, (long long)p->adopt_pid);
    return 0;
}

int pool_open(struct pool *p, const struct store_config *scfg,
              void (*on_broken)(const char *message), struct shmb_error *err)
{
    struct store_config own;
    int rc;

    p->read_lease_ms = scfg->read_lease_ms;
    if (p->replace && (rc = pool_remove_stale(p, err)) < 0)
        return rc;
    if (p->adopt) {
        if ((rc = pool_adopt(p, scfg, on_broken, err)) == 0)
            pool_beat(p, false);
        if (rc == 0 || p->cfg.backing != POOL_BACKING_MEMFD)
            return rc;
        /* What systemd kept could not be adopted after all: a memfd pool
         * starts empty rather than failing every start. */
        log_warn("pool '%s': the memfd systemd kept is not adopted: %s The pool starts "
                 "empty.",
                 p->cfg.name, err->message);
        p->adopt = false;
    }
    rc = p->cfg.backing == POOL_BACKING_MEMFD
             ? segment_create_memfd(&p->seg, p->cfg.segment, p->size, p->cfg.max_objects, err)
             : segment_create(&p->seg, p->cfg.dir, p->cfg.segment, p->size,
                              p->cfg.max_objects, err);
    if (rc < 0)
        return rc;
    if ((rc = segment_guard_watch(&p->seg, on_broken, err)) < 0 ||
        (rc = pool_open_catalog(p, scfg, &own, err)) < 0) {
        segment_destroy(&p->seg);
        return rc;
    }
    if (p->cfg.max_objects != 0 &&
        p->seg.catalog_slots < p->cfg.max_objects + p->cfg.max_objects / 3)
        log_warn("--max-objects %llu asks for a catalog of %llu slots or more; %llu fit in "
                 "1/8 of the segment's %llu bytes, so readers ask the daemon for the "
                 "objects it cannot list. A larger --size makes room.",
                 (unsigned long long)p->cfg.max_objects,
                 (unsigned long long)(p->cfg.max_objects + p->cfg.max_objects / 3),
                 (unsigned long long)p->seg.catalog_slots, (unsigned long long)p->size);
    p->store = store_new(segment_data(&p->seg), p->seg.data_offset, p->seg.data_size,
                         p->seg.hdr, &own, err);
    if (p->store == NULL) {
        catalog_free(p->catalog);
        p->catalog = NULL;
        segment_destroy(&p->seg);
        return err->code;
    }
    pool_beat(p, false);
    return 0;
}

void pool_beat(struct pool *p, bool stopped)
{
    struct shmb_published_counters c = {0};
    struct store_stats st;
    struct timespec ts;

    if (p->catalog == NULL || p->store == NULL)
        return;
    store_counts(p->store, &st);
    clock_gettime(CLOCK_REALTIME, &ts);
    c.clients = p->clients;
    c.data_size = st.data_size;
    c.used = st.used;
    c.free = st.free;
    c.objects = st.objects;
    c.pending = st.pending;
    c.pinned = st.pinned;
    c.arenas = st.arenas;
    c.arena_bytes = st.arena_bytes;
    c.allocs = st.allocs;
    c.commits = st.commits;
    c.gets = st.gets;
    c.evictions = st.evictions;
    c.enospc = st.enospc;
    c.expired_allocs = st.expired_allocs;
    c.lease_expiries = st.lease_expiries;
    c.fast_reads = st.fast_reads;
    c.pid = stopped ? 0 : (int64_t)getpid();
    catalog_beat(p->catalog, &c, (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000);
}

void pool_retire(struct pool *p)
{
    if (p->catalog != NULL)
        catalog_retire(p->catalog);
}

void pool_close(struct pool *p, bool keep)
{
    pool_retire(p);
    pool_beat(p, true);
    store_free(p->store);
    p->store = NULL;
    catalog_free(p->catalog);
    p->catalog = NULL;
    if (keep && !p->seg.memfd)
        segment_close(&p->seg);
    else
        segment_destroy(&p->seg);
}

struct pool *pool_find(const struct pool_set *set, const char *name)
{
    unsigned i;

    for (i = 0; i < set->n; i++)
        if (strcmp(set->pools[i]->cfg.name, name) == 0)
            return set->pools[i];
    return NULL;
}

void pool_names(const struct pool_set *set, char *out, size_t len)
{
    size_t used = 0;
    unsigned i;

    if (len == 0)
        return;
    out[0] = '\0';
    for (i = 0; i < set->n; i++) {
        int w = snprintf(out + used, len - used, "%s%s", i ? ", " : "",
                         set->pools[i]->cfg.name);

        if (w < 0 || (size_t)w >= len - used)
            break;
        used += (size_t)w;
    }
}

int pool_check_access(const struct pool *p, uid_t uid, gid_t gid, const gid_t *groups,
                      size_t n_groups, struct shmb_error *err)
{
    size_t i;

    if (!p->cfg.has_group || uid == 0 || uid == geteuid() || gid == p->cfg.gid)
        return 0;
    for (i = 0; i < n_groups; i++)
        if (groups[i] == p->cfg.gid)
            return 0;
    return shmb_error_set(err, -EPERM,
                          "Pool '%s' is restricted to group %s (gid %d); uid %d (gid %d) "
                          "is not a member. Add the user to that group (and start the "
                          "client again), or use another pool.",
                          p->cfg.name, p->cfg.group, (int)p->cfg.gid, (int)uid, (int)gid);
}

int pool_check_removable(const struct pool *p, struct shmb_error *err)
{
    struct store_stats st;

    store_counts(p->store, &st);
    if (st.objects != 0 || st.pending != 0 || p->clients != 0)
        return shmb_error_set(err, -EBUSY,
                              "pool '%s' is not empty (%llu object%s, %llu pending "
                              "allocation%s, %u client%s); it stays",
                              p->cfg.name, (unsigned long long)st.objects,
                              st.objects == 1 ? "" : "s", (unsigned long long)st.pending,
                              st.pending == 1 ? "" : "s", p->clients,
                              p->clients == 1 ? "" : "s");
    return 0;
}
