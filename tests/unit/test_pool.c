// SPDX-License-Identifier: Apache-2.0
/*
 * Unit tests for pools (daemon/pool.c) on a real 8 MiB tmpfs: the space
 * check summed over the pools of one file system, adoption of one pool
 * among new ones, a resized pool refused by name, memfd pools, group
 * access, and when a pool may be removed. Needs root for the tmpfs; without
 * it those tests are reported as skipped.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"
#include "pool.h"

#define MIB (1024u * 1024u)

static char dir[64];
static bool mounted;

static int group_setup(void **state)
{
    (void)state;
    log_active_level = LOG_ERROR;
    snprintf(dir, sizeof(dir), "/tmp/shmb-test-pool-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    mounted = geteuid() == 0 && mount("tmpfs", dir, "tmpfs", 0, "size=8m,mode=0700") == 0;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (mounted)
        umount2(dir, MNT_DETACH);
    rmdir(dir);
    return 0;
}

/* A pool config as --pool NAME:SIZE in dir would give. */
static struct pool_config config_of(const char *name, uint64_t size, enum pool_backing b)
{
    struct pool_config pc;

    memset(&pc, 0, sizeof(pc));
    snprintf(pc.name, sizeof(pc.name), "%s", name);
    snprintf(pc.segment, sizeof(pc.segment), "test.%s", name);
    pc.size = size;
    pc.backing = b;
    if (b != POOL_BACKING_MEMFD)
        snprintf(pc.dir, sizeof(pc.dir), "%s", dir);
    pc.max_object_size = size / 4;
    return pc;
}

static struct pool *planned(const char *name, uint64_t size, enum pool_backing b)
{
    struct pool_config pc = config_of(name, size, b);
    struct shmb_error err = {0};
    uint64_t rounded;
    struct pool *p;

    assert_int_equal(pool_check_settings(&pc, &rounded, &err), 0);
    p = pool_new(&pc, rounded, &err);
    assert_non_null(p);
    assert_int_equal(pool_plan(p, false, &err), 0);
    return p;
}

static void open_pool(struct pool *p)
{
    struct store_config scfg = {.max_object_size = p->cfg.max_object_size};
    struct shmb_error err = {0};

    assert_int_equal(pool_open(p, &scfg, NULL, &err), 0);
}

static bool in_dir(const char *segment)
{
    char path[128];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", dir, segment);
    return stat(path, &st) == 0;
}

/* Proves that the pools of one file system are checked together: two pools
 * of 5 MiB each fit the 8 MiB tmpfs alone, not together, and the message
 * names the second, both pools and the numbers. */
static void test_space_summed(void **state)
{
    struct shmb_error err = {0};
    struct pool *p[2];

    (void)state;
    if (!mounted)
        skip();
    p[0] = planned("a", 5 * MIB, POOL_BACKING_SHM);
    p[1] = planned("b", 5 * MIB, POOL_BACKING_SHM);
    assert_int_equal(pool_check_space(&p[0], 1, &err), 0);
    assert_int_equal(pool_check_space(&p[1], 1, &err), 0);
    assert_int_equal(pool_check_space(p, 2, &err), -ENOSPC);
    assert_non_null(strstr(err.message, "Pool 'b' does not fit"));
    assert_non_null(strstr(err.message, "pools a, b need 10 MiB together"));
    assert_non_null(strstr(err.message, "MiB free"));
    pool_free(p[0]);
    pool_free(p[1]);
}

/* Proves that an adopted pool is not counted again: pool a, kept by a
 * daemon that stopped, is adopted beside a new pool b that fits only
 * because a's pages are already reserved; a's object comes back. */
static void test_adopted_not_counted(void **state)
{
    struct store_extent ext;
    struct store_holder *h;
    struct shmb_error err = {0};
    struct pool *p[2];

    (void)state;
    if (!mounted)
        skip();
    p[0] = planned("a", 5 * MIB, POOL_BACKING_SHM);
    open_pool(p[0]);
    h = store_holder_new(p[0]->store);
    assert_int_equal(store_alloc(p[0]->store, h, "k", 1, 100, 0, &ext, &err), 0);
    memcpy((char *)p[0]->seg.base + ext.offset, "adopt me", 9);
    assert_int_equal(store_commit(p[0]->store, h, "k", 1, &err), 0);
    store_holder_free(p[0]->store, h);
    pool_close(p[0], true);
    pool_free(p[0]);
    assert_true(in_dir("test.a"));

    p[0] = planned("a", 5 * MIB, POOL_BACKING_SHM);
    assert_true(p[0]->adopt);
    p[1] = planned("b", 2 * MIB, POOL_BACKING_SHM);
    assert_int_equal(pool_check_space(p, 2, &err), 0);
    open_pool(p[0]);
    h = store_holder_new(p[0]->store);
    assert_int_equal(store_get(p[0]->store, h, "k", 1, &ext, &err), 0);
    assert_string_equal((char *)p[0]->seg.base + ext.offset, "adopt me");
    assert_int_equal(store_release(p[0]->store, h, "k", 1, &err), 0);
    store_holder_free(p[0]->store, h);
    pool_close(p[0], false);
    pool_free(p[0]);
    pool_free(p[1]);
    assert_false(in_dir("test.a"));
}

/* Proves that a kept pool planned with another size is refused, naming the
 * pool, and left as it was. */
static void test_resized_refused(void **state)
{
    struct pool_config pc = config_of("r", 2 * MIB, POOL_BACKING_SHM);
    struct shmb_error err = {0};
    struct pool *p;
    uint64_t size;

    (void)state;
    if (!mounted)
        skip();
    p = planned("r", 4 * MIB, POOL_BACKING_SHM);
    open_pool(p);
    pool_close(p, true);
    pool_free(p);

    assert_int_equal(pool_check_settings(&pc, &size, &err), 0);
    p = pool_new(&pc, size, &err);
    assert_int_equal(pool_plan(p, false, &err), -EINVAL);
    assert_true(p->refused);
    assert_non_null(strstr(err.message, "Pool 'r' is not served"));
    assert_non_null(strstr(err.message, "holds 4194304 bytes, not the 2097152"));
    assert_non_null(strstr(err.message, "(--pool r:4194304)"));
    pool_free(p);
    assert_true(in_dir("test.r"));
    /* --fresh replaces it, counting its pages as free. */
    p = pool_new(&pc, size, &err);
    assert_int_equal(pool_plan(p, true, &err), 0);
    assert_true(p->replace);
    assert_int_equal(pool_check_space(&p, 1, &err), 0);
    open_pool(p);
    assert_int_equal(p->seg.size, 2 * MIB);
    pool_close(p, false);
    pool_free(p);
}

/* Proves that a memfd pool serves without a file: nothing appears in the
 * directory, the descriptor cannot be shrunk, and closing it even with
 * keep leaves nothing. */
static void test_memfd_pool(void **state)
{
    struct store_extent ext;
    struct store_holder *h;
    struct shmb_error err = {0};
    struct pool *p = planned("m", 2 * MIB, POOL_BACKING_MEMFD);

    (void)state;
    assert_false(p->adopt);
    assert_int_equal(pool_check_space(&p, 1, &err), 0);
    open_pool(p);
    assert_true(p->seg.memfd);
    assert_int_equal(ftruncate(p->seg.fd, 4096), -1);
    h = store_holder_new(p->store);
    assert_int_equal(store_alloc(p->store, h, "k", 1, 4096, 0, &ext, &err), 0);
    assert_int_equal(store_commit(p->store, h, "k", 1, &err), 0);
    store_holder_free(p->store, h);
    if (mounted)
        assert_false(in_dir("test.m"));
    pool_close(p, true);
    pool_free(p);
}

/* Proves that memfd pools are checked against the memory the process may
 * use: one larger than all memory is refused, naming it; an adopted one is
 * not counted again. */
static void test_memfd_too_big(void **state)
{
    struct shmb_error err = {0};
    struct pool *p = planned("huge", 1ULL << 50, POOL_BACKING_MEMFD);

    (void)state;
    assert_int_equal(pool_check_space(&p, 1, &err), -ENOSPC);
    assert_non_null(strstr(err.message, "memfd pool 'huge'"));
    assert_non_null(strstr(err.message, "MiB available"));
    /* Adopted (what systemd kept), its pages are held already. */
    p->adopt = true;
    assert_int_equal(pool_check_space(&p, 1, &err), 0);
    pool_free(p);
}

/* Proves group= access: a member by gid or by a supplementary group, root
 * and the daemon's own user pass; anyone else gets EPERM naming the pool
 * and the group. A pool without group= lets everyone in. */
static void test_group_access(void **state)
{
    struct pool_config pc = config_of("g", 2 * MIB, POOL_BACKING_MEMFD);
    struct shmb_error err = {0};
    gid_t other[2] = {7, 4242};
    struct pool *p;
    uid_t stranger = geteuid() == 65534 ? 65533 : 65534;

    (void)state;
    pc.has_group = true;
    pc.gid = 4242;
    snprintf(pc.group, sizeof(pc.group), "video");
    p = pool_new(&pc, 2 * MIB, &err);
    assert_int_equal(pool_check_access(p, stranger, 4242, NULL, 0, &err), 0);
    assert_int_equal(pool_check_access(p, stranger, 100, other, 2, &err), 0);
    assert_int_equal(pool_check_access(p, 0, 100, NULL, 0, &err), 0);
    assert_int_equal(pool_check_access(p, geteuid(), 100, NULL, 0, &err), 0);
    assert_int_equal(pool_check_access(p, stranger, 100, other, 1, &err), -EPERM);
    assert_non_null(strstr(err.message, "Pool 'g' is restricted to group video (gid 4242)"));
    p->cfg.has_group = false;
    assert_int_equal(pool_check_access(p, stranger, 100, NULL, 0, &err), 0);
    pool_free(p);
}

/* Proves that a pool may go only when empty: an object, a pending
 * allocation or a connected client keeps it. */
static void test_removable(void **state)
{
    struct store_extent ext;
    struct store_holder *h;
    struct shmb_error err = {0};
    struct pool *p = planned("x", 2 * MIB, POOL_BACKING_MEMFD);

    (void)state;
    open_pool(p);
    assert_int_equal(pool_check_removable(p, &err), 0);
    p->clients = 1;
    assert_int_equal(pool_check_removable(p, &err), -EBUSY);
    assert_non_null(strstr(err.message, "1 client)"));
    p->clients = 0;
    h = store_holder_new(p->store);
    assert_int_equal(store_alloc(p->store, h, "k", 1, 10, 0, &ext, &err), 0);
    assert_int_equal(pool_check_removable(p, &err), -EBUSY);
    assert_non_null(strstr(err.message, "1 pending allocation,"));
    assert_int_equal(store_commit(p->store, h, "k", 1, &err), 0);
    assert_int_equal(pool_check_removable(p, &err), -EBUSY);
    assert_non_null(strstr(err.message, "1 object,"));
    store_holder_free(p->store, h);
    pool_close(p, false);
    pool_free(p);
}

/* Proves pool_find and pool_names over a set. */
static void test_find_and_names(void **state)
{
    struct pool_config a = config_of("alpha", 2 * MIB, POOL_BACKING_MEMFD);
    struct pool_config b = config_of("beta", 2 * MIB, POOL_BACKING_MEMFD);
    struct shmb_error err = {0};
    struct pool_set set = {.n = 2};
    char names[64];

    (void)state;
    set.pools[0] = pool_new(&a, 2 * MIB, &err);
    set.pools[1] = pool_new(&b, 2 * MIB, &err);
    assert_ptr_equal(pool_find(&set, "beta"), set.pools[1]);
    assert_null(pool_find(&set, "gamma"));
    assert_null(pool_find(&set, "bet"));
    pool_names(&set, names, sizeof(names));
    assert_string_equal(names, "alpha, beta");
    pool_free(set.pools[0]);
    pool_free(set.pools[1]);
}

/* Proves that backing=hugetlbfs on a directory that is not a hugetlbfs
 * mount is refused with the fix. */
static void test_hugetlbfs_needs_mount(void **state)
{
    struct pool_config pc = config_of("h", 4 * MIB, POOL_BACKING_HUGETLBFS);
    struct shmb_error err = {0};
    uint64_t size;

    (void)state;
    snprintf(pc.dir, sizeof(pc.dir), "/tmp");
    assert_int_equal(pool_check_settings(&pc, &size, &err), -EINVAL);
    assert_non_null(strstr(err.message, "--pool h: backing=hugetlbfs"));
    assert_non_null(strstr(err.message, "mount -t hugetlbfs"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_space_summed),
        cmocka_unit_test(test_adopted_not_counted),
        cmocka_unit_test(test_resized_refused),
        cmocka_unit_test(test_memfd_pool),
        cmocka_unit_test(test_memfd_too_big),
        cmocka_unit_test(test_group_access),
        cmocka_unit_test(test_removable),
        cmocka_unit_test(test_find_and_names),
        cmocka_unit_test(test_hugetlbfs_needs_mount),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
