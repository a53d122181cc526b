// SPDX-License-Identifier: Apache-2.0
/*
 * Chaos: fail the Nth allocation (jansson's and the project's own, which both
 * go through shmb_malloc) at every point of a request session, and check
 * that each failure becomes an error reply or a closed connection: never a
 * crash, never a leak, never a store that loses count of its bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/alloc.h"
#include "fixture.h"

/* Two clients: a writer and a read-only reader; every op, good and bad. */
static const struct {
    int client;
    const char *line;
} session[] = {
    {0, "{\"op\":\"hello\",\"version\":1,\"name\":\"writer\"}"},
    {0, "{\"op\":\"alloc\",\"key\":\"a\",\"size\":100,\"readers\":1,\"id\":[1,{\"x\":2}]}"},
    {0, "{\"op\":\"commit\",\"key\":\"a\"}"},
    {1, "{\"op\":\"hello\",\"version\":1,\"mode\":\"ro\",\"name\":\"reader\"}"},
    {1, "{\"op\":\"get\",\"key\":\"a\"}"},
    {1, "{\"op\":\"get\",\"key\":\"a\"}"},
    {1, "{\"op\":\"stats\"}"},
    {1, "{\"op\":\"list\",\"prefix\":\"\",\"limit\":5}"},
    {1, "{\"op\":\"clients\"}"},
    {1, "{\"op\":\"release\",\"key\":\"a\"}"},
    {1, "{\"op\":\"alloc\",\"key\":\"ro\",\"size\":1}"},
    {0, "{\"op\":\"alloc\",\"key\":\"b\",\"size\":20000}"},
    {0, "{\"op\":\"commit\",\"key\":\"b\"}"},
    {0, "{\"op\":\"get\",\"key\":\"b\"}"},
    {0, "{\"op\":\"delete\",\"key\":\"b\"}"},
    {0, "{\"op\":\"alloc\",\"key\":\"c\",\"size\":30000}"},
    {0, "{\"op\":\"release\",\"key\":\"b\"}"},
    {0, "{\"op\":\"touch\",\"key\":\"a\",\"readers\":2}"},
    {0, "{\"op\":\"contains\",\"key\":\"a\"}"},
    {0, "{\"op\":\"abort\",\"key\":\"c\"}"},
    {0, "{\"op\":\"delete\",\"key\":\"a\"}"},
    {1, "this is not json"},
    {1, "{\"op\":\"frobnicate\",\"id\":\"x\"}"},
    {0, "{\"op\":\"alloc\",\"key\":\"d\",\"size\":10}"},
};

#define NCLIENTS 2

/* Run the session once; returns how many requests got no reply. */
static int run_session(struct fixture *f, struct command_client *clients)
{
    size_t i;
    int dropped = 0;

    for (i = 0; i < sizeof(session) / sizeof(session[0]); i++) {
        struct command_client *cl = &clients[session[i].client];

        if (fixture_request(f, cl, session[i].line, NULL) < 0) {
            /* What conn.c does when a reply cannot be built: close, and the
             * client connects again. */
            command_client_close(&f->env, cl);
            memset(cl, 0, sizeof(*cl));
            command_client_open(&f->env, cl);
            dropped++;
        }
    }
    return dropped;
}

/* One round with the Nth allocation failing; returns the session's drops. */
static int chaos_round(unsigned long n, long *leaked, int *consistent)
{
    struct command_client clients[NCLIENTS];
    struct store_stats st;
    struct fixture f;
    long live_before = shmb_alloc_live();
    int i, dropped;

    assert_int_equal(fixture_init(&f, 64 * 1024 + 4096, 32 * 1024), 0);
    memset(clients, 0, sizeof(clients));
    for (i = 0; i < NCLIENTS; i++)
        command_client_open(&f.env, &clients[i]);
    shmb_alloc_fail_at(n);
    dropped = run_session(&f, clients);
    shmb_alloc_fail_at(0);
    for (i = 0; i < NCLIENTS; i++)
        command_client_close(&f.env, &clients[i]);
    store_stats(f.store, &st);
    *consistent = st.used + st.free == st.data_size && st.pending == 0 && st.pinned == 0;
    fixture_fini(&f);
    *leaked = shmb_alloc_live() - live_before;
    return dropped;
}

/* Proves that a failure at every single allocation of the session is
 * survived without a leak and with the store's books intact, and that
 * failures really were injected (some requests lost their reply). */
static void test_fail_every_allocation(void **state)
{
    unsigned long before, total, n;
    int failures_seen = 0;
    long leaked;
    int consistent;

    (void)state;
    before = shmb_alloc_count();
    chaos_round(0, &leaked, &consistent);
    total = shmb_alloc_count() - before;
    assert_int_equal(leaked, 0);
    assert_true(consistent);
    assert_true(total > 50); /* the session really allocates */
    for (n = 1; n <= total + 5; n++) {
        int dropped = chaos_round(n, &leaked, &consistent);

        if (leaked != 0 || !consistent)
            print_error("allocation %lu of %lu: leaked %ld blocks, consistent %d\n", n,
                        total, leaked, consistent);
        assert_int_equal(leaked, 0);
        assert_true(consistent);
        failures_seen += dropped > 0;
    }
    print_message("failed each of %lu allocations in turn; %d rounds lost a reply\n", total,
                  failures_seen);
    assert_true(failures_seen > 0);
}

/* Proves that after an injected failure the same client keeps working: the
 * failed request gets an error reply and the next one succeeds. */
static void test_recovers_after_failure(void **state)
{
    struct command_client cl;
    struct fixture f;
    json_t *reply = NULL;
    int ok;

    (void)state;
    assert_int_equal(fixture_init(&f, 64 * 1024 + 4096, 32 * 1024), 0);
    memset(&cl, 0, sizeof(cl));
    command_client_open(&f.env, &cl);
    assert_int_equal(fixture_request(&f, &cl, "{\"op\":\"hello\",\"version\":1}", NULL), 1);
    shmb_alloc_fail_at(1);
    ok = fixture_request(&f, &cl, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":10}", &reply);
    shmb_alloc_fail_at(0);
    /* The first allocation is jansson's parse of the request, so the request
     * fails as a whole, with an error reply. */
    assert_int_equal(ok, 0);
    json_decref(reply);
    assert_false(store_contains(f.store, "k", 1));
    assert_int_equal(fixture_request(&f, &cl, "{\"op\":\"alloc\",\"key\":\"k\",\"size\":10}",
                                     NULL), 1);
    assert_int_equal(fixture_request(&f, &cl, "{\"op\":\"commit\",\"key\":\"k\"}", NULL), 1);
    assert_true(store_contains(f.store, "k", 1));
    command_client_close(&f.env, &cl);
    fixture_fini(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_every_allocation),
        cmocka_unit_test(test_recovers_after_failure),
    };

    json_set_alloc_funcs(shmb_malloc, shmb_free);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
