// SPDX-License-Identifier: Apache-2.0
/*
 * End-to-end tests of shmbrokerctl status read from the segment's header
 * page: --from-segment, the fallback when the daemon does not answer (a stale
 * socket, a daemon stopped with SIGSTOP), segments built by hand (heartbeat,
 * counters, a clean stop, counters caught half written) and files that are
 * not segments of this layout.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "layout.h"
#include "shmbroker.h"

/* ---- helpers --------------------------------------------------------------- */

/* shmbrokerctl [--socket SOCK] --name NAME --shm-dir DIR status ARGS... (a
 * NULL-terminated list) into r. */
static void ctl_status(struct h_fix *f, const char *sock, const char *name,
                       const char *dir, struct h_run *r, ...)
{
    const char *argv[20];
    const char *arg;
    va_list ap;
    int n = 0;

    argv[n++] = h_ctl_bin();
    if (sock != NULL) {
        argv[n++] = "--socket";
        argv[n++] = sock;
    }
    argv[n++] = "--name";
    argv[n++] = name;
    argv[n++] = "--shm-dir";
    argv[n++] = dir;
    argv[n++] = "status";
    va_start(ap, r);
    while ((arg = va_arg(ap, const char *)) != NULL && n < 19)
        argv[n++] = arg;
    va_end(ap);
    argv[n] = NULL;
    assert_int_equal(h_run(f, argv, NULL, 0, r), 0);
}

/* The heartbeat's age status printed ("last heartbeat 2.3 s ago"), or the
 * test fails. */
static double heartbeat_age(const struct h_run *r)
{
    const char *at = strstr(r->out, "last heartbeat ");
    double age;

    if (at == NULL || sscanf(at, "last heartbeat %lf s ago", &age) != 1) {
        h_run_dump("status", r);
        fail_msg("no heartbeat age in status's output");
    }
    return age;
}

/* The counters line status printed, as numbers; false when there is none. */
static bool printed_counters(const struct h_run *r, unsigned long long v[6])
{
    const char *at = strstr(r->out, "counters  ");

    return at != NULL &&
           sscanf(at,
                  "counters  %llu allocs, %llu commits, %llu gets, %llu evictions, %llu "
                  "ENOSPC, %llu fast reads",
                  &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) == 6;
}

static uint64_t now_unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A header page of layout version 2 as a daemon (pid) that last beat
 * age_ms ago writes it, with counters numbered from 11, in a segment file
 * of 1 MiB at dir/name. */
static void write_segment(const char *dir, const char *name, int64_t pid, uint64_t age_ms,
                          uint32_t seq, uint32_t version)
{
    static unsigned char page[SHMB_HEADER_PAGE];
    struct shmb_segment_header *h = (void *)page;
    struct shmb_published_counters *pc = (void *)(page + SHMB_COUNTERS_AT);
    char path[PATH_MAX];
    FILE *fp;

    memset(page, 0, sizeof(page));
    h->magic = SHMB_SEGMENT_MAGIC;
    h->version = version;
    h->header_size = SHMB_HEADER_PAGE;
    h->total_size = 1u << 20;
    h->data_offset = SHMB_HEADER_PAGE;
    h->data_size = (1u << 20) - SHMB_HEADER_PAGE - 16384;
    h->owner_pid = pid != 0 ? pid : 12345;
    h->catalog_offset = (1u << 20) - 16384;
    h->catalog_slots = 512;
    h->catalog_unlisted = 2;
    h->heartbeat_unix_ms = now_unix_ms() - age_ms;
    h->heartbeat_count = 77;
    h->heartbeat_period_ms = 1000;
    pc->seq = seq;
    pc->clients = 9;
    pc->data_size = h->data_size;
    pc->used = 262144;
    pc->free = h->data_size - 262144;
    pc->objects = 3;
    pc->pending = 4;
    pc->pinned = 5;
    pc->arenas = 6;
    pc->arena_bytes = 7 * 1024;
    pc->allocs = 11;
    pc->commits = 12;
    pc->gets = 13;
    pc->evictions = 14;
    pc->enospc = 15;
    pc->expired_allocs = 16;
    pc->lease_expiries = 17;
    pc->fast_reads = 18;
    pc->pid = pid;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(page, 1, sizeof(page), fp), sizeof(page));
    assert_int_equal(ftruncate(fileno(fp), 1 << 20), 0);
    assert_int_equal(fclose(fp), 0);
}

/* ---- segments built by hand ------------------------------------------------ */

/* --from-segment prints what the header page holds: the pid, the heartbeat's
 * age, every published counter, and exits 0 without asking any daemon. */
static void test_hand_built_from_segment(void **state)
{
    struct h_fix *f = *state;
    unsigned long long v[6];
    struct h_run r;
    double age;

    write_segment(f->dir, "seg", (int64_t)getpid(), 5000, 40, SHMB_LAYOUT_VERSION);
    ctl_status(f, NULL, "seg", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 0, "shmbrokerd (pid ", NULL);
    h_expect_run(&r, 0, "the daemon was not asked", NULL);
    age = heartbeat_age(&r);
    assert_true(age >= 5.0 && age < 600.0);
    assert_true(printed_counters(&r, v));
    assert_int_equal(v[0], 11);
    assert_int_equal(v[1], 12);
    assert_int_equal(v[2], 13);
    assert_int_equal(v[3], 14);
    assert_int_equal(v[4], 15);
    assert_int_equal(v[5], 18);
    h_expect_run(&r, 0, "objects   3 committed, 4 pending, 5 pinned\n", NULL);
    h_expect_run(&r, 0, "clients   9\n", NULL);
    h_expect_run(&r, 0, "arenas    6 held, 7 KiB unused\n", NULL);
    h_expect_run(&r, 0, "expired   16 allocations, 17 leases\n", NULL);
    h_expect_run(&r, 0, "catalog   512 slots, 2 objects not listed\n", NULL);
    h_expect_run(&r, 0, "as of     heartbeat 77 at ", NULL);
    h_expect_run(&r, 0, "256 KiB of ", NULL);
    assert_null(strstr(r.out, "may not add up"));
    assert_null(strstr(r.out, "not answering"));
    h_run_free(&r);
    h_pass(f);
}

/* No daemon at the socket, the segment named: status says the daemon is
 * not answering, with its pid and the heartbeat's age, prints the counters
 * and exits 3; a pid that no longer runs is said to have died. Without
 * --name/--shm-dir, a socket of its own is not matched to the default
 * segment: the usual error, 69. */
static void test_no_daemon_reads_segment(void **state)
{
    struct h_fix *f = *state;
    const char *argv[5];
    unsigned long long v[6];
    char sock[PATH_MAX];
    struct h_run r;
    pid_t dead;
    int status;

    h_path(f, "nobody.sock", sock, sizeof(sock));
    write_segment(f->dir, "seg", (int64_t)getpid(), 2000, 40, SHMB_LAYOUT_VERSION);
    ctl_status(f, sock, "seg", f->dir, &r, NULL);
    h_expect_run(&r, 3, "is not answering: last heartbeat ", NULL);
    assert_true(heartbeat_age(&r) >= 2.0);
    assert_true(printed_counters(&r, v));
    assert_int_equal(v[1], 12);
    assert_null(strstr(r.out, "no process"));
    h_run_free(&r);

    /* The pid of a process that has exited. */
    dead = fork();
    assert_true(dead >= 0);
    if (dead == 0)
        _exit(0);
    assert_int_equal(h_wait_pid(dead, H_RUN_TIMEOUT_MS, &status), 0);
    write_segment(f->dir, "seg", (int64_t)dead, 2000, 40, SHMB_LAYOUT_VERSION);
    ctl_status(f, sock, "seg", f->dir, &r, NULL);
    h_expect_run(&r, 3, "is not answering", NULL);
    h_expect_run(&r, 3, "it died without a clean stop", NULL);
    h_run_free(&r);

    argv[0] = h_ctl_bin();
    argv[1] = "--socket";
    argv[2] = sock;
    argv[3] = "status";
    argv[4] = NULL;
    assert_int_equal(h_run(f, argv, NULL, 0, &r), 0);
    h_expect_run(&r, 69, NULL, "Is shmbrokerd running?");
    assert_int_equal(r.out_len, 0);
    h_run_free(&r);
    h_pass(f);
}

/* pid 0 is a clean stop: "stopped at"; a seq left odd (the daemon stopped
 * while writing) is said, and the counters printed all the same. */
static void test_stopped_and_half_written(void **state)
{
    struct h_fix *f = *state;
    unsigned long long v[6];
    struct h_run r;

    write_segment(f->dir, "seg", 0, 3000, 40, SHMB_LAYOUT_VERSION);
    ctl_status(f, NULL, "seg", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 0, "shmbrokerd stopped at ", NULL);
    h_expect_run(&r, 0, " UTC (", NULL);
    assert_true(printed_counters(&r, v));
    h_run_free(&r);

    write_segment(f->dir, "seg", (int64_t)getpid(), 1000, 41, SHMB_LAYOUT_VERSION);
    ctl_status(f, NULL, "seg", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 0, "stopped while writing these counters (seq 41)", NULL);
    assert_true(printed_counters(&r, v));
    assert_int_equal(v[2], 13);
    h_run_free(&r);
    h_pass(f);
}

/* Files that are not segments of this layout: random bytes, a short file, a
 * directory, layout version 1: a message naming the file and what is wrong,
 * exit 2; no file at all: exit 66. */
static void test_not_a_segment(void **state)
{
    struct h_fix *f = *state;
    static unsigned char junk[8192];
    char path[PATH_MAX];
    struct h_run r;
    size_t i;

    for (i = 0; i < sizeof(junk); i++)
        junk[i] = h_pattern(16, i);
    h_path(f, "junk", path, sizeof(path));
    assert_int_equal(h_write_file(path, junk, sizeof(junk)), 0);
    ctl_status(f, NULL, "junk", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 2, NULL, "junk is not a shmbroker segment: it starts with 0x");
    h_expect_run(&r, 2, NULL, "not the magic number 0x31474553424d4853");
    assert_int_equal(r.out_len, 0);
    h_run_free(&r);

    h_path(f, "short", path, sizeof(path));
    assert_int_equal(h_write_file(path, "SHMBSEG1", 8), 0);
    ctl_status(f, NULL, "short", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 2, NULL, "a file of 8 bytes");
    h_run_free(&r);

    ctl_status(f, NULL, ".", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 2, NULL, "not a regular file");
    h_run_free(&r);

    write_segment(f->dir, "old", (int64_t)getpid(), 0, 40, 1);
    ctl_status(f, NULL, "old", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 2, NULL, "of layout version 1; this shmbrokerctl reads layout 2");
    h_run_free(&r);

    ctl_status(f, NULL, "none", f->dir, &r, "--from-segment", NULL);
    h_expect_run(&r, 66, NULL, "No such file or directory");
    h_run_free(&r);
    h_pass(f);
}

/* ---- a real daemon ----------------------------------------------------------- */

/* status --from-segment of a running daemon until its next heartbeat has
 * published what was done: then its counters are stats' (the figures are
 * published once a second; nothing changes them meanwhile). */
static void test_from_segment_matches_stats(void **state)
{
    static const char data[3000];
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = shmb_new();
    unsigned long long v[6];
    shmb_stats_t st;
    struct h_run r;
    const void *p;
    size_t len;
    char want[128];
    int i;

    assert_non_null(c);
    assert_int_equal(shmb_connect(c, d->socket, "test"), 0);
    for (i = 0; i < 5; i++) {
        snprintf(want, sizeof(want), "k%d", i);
        assert_int_equal(shmb_put(c, want, data, sizeof(data), 0), 0);
    }
    assert_int_equal(shmb_get(c, "k1", &p, &len), 0);
    assert_int_equal(shmb_get(c, "k2", &p, &len), 0);
    assert_int_equal(shmb_release(c, "k2"), 0);
    assert_int_equal(shmb_delete(c, "k3"), 0);
    assert_int_equal(shmb_stats(c, &st), 0);
    for (i = 0; i < 100; i++) {
        ctl_status(f, NULL, d->name, d->shm_dir, &r, "--from-segment", NULL);
        h_expect_run(&r, 0, "the daemon was not asked", NULL);
        if (printed_counters(&r, v) && v[0] == st.allocs && v[1] == st.commits &&
            v[2] == st.gets)
            break;
        h_run_free(&r);
        usleep(100 * 1000);
    }
    if (i == 100)
        fail_msg("the published counters never matched stats (%llu allocs, %llu commits, "
                 "%llu gets)",
                 (unsigned long long)st.allocs, (unsigned long long)st.commits,
                 (unsigned long long)st.gets);
    snprintf(want, sizeof(want), "shmbrokerd (pid %d): last heartbeat ", (int)d->pid);
    h_expect_run(&r, 0, want, NULL);
    assert_int_equal(v[3], st.evictions);
    assert_int_equal(v[4], st.enospc);
    snprintf(want, sizeof(want), "objects   %llu committed, %llu pending, %llu pinned\n",
             (unsigned long long)st.objects, (unsigned long long)st.pending,
             (unsigned long long)st.pinned);
    h_expect_run(&r, 0, want, NULL);
    h_expect_run(&r, 0, "objects   4 committed, 0 pending, 1 pinned\n", NULL);
    h_expect_run(&r, 0, "clients   1\n", NULL);
    h_run_free(&r);
    shmb_close(c);
    h_pass(f);
}

/* Wait until d's segment shows a heartbeat (one is written at start), or
 * fail the test. */
static void wait_heartbeat(struct h_fix *f, const struct h_daemon *d)
{
    struct h_run r;
    int i;

    for (i = 0; i < 100; i++) {
        ctl_status(f, NULL, d->name, d->shm_dir, &r, "--from-segment", NULL);
        if (strstr(r.out, "last heartbeat ") != NULL) {
            h_run_free(&r);
            return;
        }
        h_run_free(&r);
        usleep(100 * 1000);
    }
    fail_msg("the daemon's segment never showed a heartbeat");
}

/* A daemon killed with SIGKILL leaves its socket (connections refused) and
 * its segment: status says it is not answering and that its process is
 * gone, prints what it last published, and exits 3. */
static void test_killed_daemon(void **state)
{
    static const char data[100];
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    shmb_t *c = shmb_new();
    char want[128];
    struct h_run r;
    int pid = (int)d->pid, i;

    assert_non_null(c);
    assert_int_equal(shmb_connect(c, d->socket, "test"), 0);
    assert_int_equal(shmb_put(c, "k", data, sizeof(data), 0), 0);
    shmb_close(c);
    /* Until a heartbeat has published the commit. */
    for (i = 0; i < 100; i++) {
        ctl_status(f, NULL, d->name, d->shm_dir, &r, "--from-segment", NULL);
        if (strstr(r.out, "objects   1 committed") != NULL)
            break;
        h_run_free(&r);
        usleep(100 * 1000);
    }
    if (i == 100)
        fail_msg("the commit was never published");
    h_run_free(&r);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGKILL, H_STOP_TIMEOUT_MS)),
                     128 + SIGKILL);
    assert_true(h_exists(d->socket));
    ctl_status(f, d->socket, d->name, d->shm_dir, &r, NULL);
    snprintf(want, sizeof(want), "shmbrokerd (pid %d) is not answering: last heartbeat ",
             pid);
    h_expect_run(&r, 3, want, NULL);
    snprintf(want, sizeof(want), "no process %d any more: it died without a clean stop",
             pid);
    h_expect_run(&r, 3, want, NULL);
    h_expect_run(&r, 3, "objects   1 committed, 0 pending, 0 pinned\n", NULL);
    /* A put through an arena is a commit_at: no alloc. */
    h_expect_run(&r, 3, "counters  0 allocs, 1 commits, 0 gets", NULL);
    h_run_free(&r);
    h_pass(f);
}

/* A daemon stopped with SIGSTOP accepts connections but never answers:
 * status waits --timeout, then says it is not answering, with its pid and a
 * heartbeat age that grows from one status to the next, and exits 3. Once
 * continued it answers as usual. */
static void test_stopped_daemon(void **state)
{
    struct h_fix *f = *state;
    struct h_daemon *d = h_daemon_start(f, "4M", NULL);
    char want[128];
    struct h_run r;
    double first, second;

    wait_heartbeat(f, d);

    assert_int_equal(kill(d->pid, SIGSTOP), 0);
    ctl_status(f, d->socket, d->name, d->shm_dir, &r, "--timeout", "1", NULL);
    snprintf(want, sizeof(want), "shmbrokerd (pid %d) is not answering: last heartbeat ",
             (int)d->pid);
    h_expect_run(&r, 3, want, NULL);
    h_expect_run(&r, 3, "counters  ", NULL);
    first = heartbeat_age(&r);
    h_run_free(&r);
    usleep(1200 * 1000);
    ctl_status(f, d->socket, d->name, d->shm_dir, &r, "--timeout", "1", NULL);
    h_expect_run(&r, 3, want, NULL);
    second = heartbeat_age(&r);
    h_run_free(&r);
    assert_int_equal(kill(d->pid, SIGCONT), 0);
    if (!(second > first))
        fail_msg("the heartbeat's age did not grow: %.1f s, then %.1f s", first, second);

    ctl_status(f, d->socket, d->name, d->shm_dir, &r, NULL);
    snprintf(want, sizeof(want), "pid %d, up ", (int)d->pid);
    h_expect_run(&r, 0, want, NULL);
    assert_null(strstr(r.out, "not answering"));
    h_run_free(&r);
    assert_int_equal(h_exit_code(h_daemon_signal(d, SIGTERM, H_STOP_TIMEOUT_MS)), 0);
    h_pass(f);
}

#define TEST(fn) cmocka_unit_test_setup_teardown(fn, h_setup, h_teardown)

int main(void)
{
    static const struct CMUnitTest tests[] = {
        TEST(test_hand_built_from_segment),
        TEST(test_no_daemon_reads_segment),
        TEST(test_stopped_and_half_written),
        TEST(test_not_a_segment),
        TEST(test_from_segment_matches_stats),
        TEST(test_stopped_daemon),
        TEST(test_killed_daemon),
    };

    return cmocka_run_group_tests_name("test_ctl_segment", tests, NULL, NULL);
}
