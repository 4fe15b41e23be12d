/*
 * Integration tests of the public client API against a private redis-server
 * (tests/support/fixture.h): what acquire, release and held do. The name's
 * data in Redis (read in either protocol's layout: the suite holds whatever
 * protocol its clients write, DLOCK_TEST_PROTOCOL), release of a lock not
 * held, try and timed waits across clients and threads, a waiter getting
 * the lock, many names held by one thread, reentrancy at zero Redis cost,
 * fencing tokens, and the local table emptying. Helpers shared with the
 * other test_client*.c files are in client_helpers.h.
 *
 * One server per executable (group setup/teardown); the per-test teardown
 * fx_ensure_server resumes or restarts it if a test left it stopped.
 *
 * Timing: this runs on small, noisy machines and under sanitizers, so every
 * time bound below is an upper bound several times larger than the duration
 * it guards, and says why.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"

/* ---------------------------------------------------------------- helpers */

static long long key_pttl(const char *key)
{
    redisReply *r = cmd("PTTL %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static void key_type_is(const char *key, const char *type)
{
    redisReply *r = cmd("TYPE %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->str, type);
    freeReplyObject(r);
}

/* Calls `fn` on a fresh thread and returns its int result. */
typedef struct call {
    dlock_client *c;
    const char *name;
    int which; /* 0 release, 1 held, 2 try-acquire */
    int rc;
} call;

static void *call_main(void *arg)
{
    call *k = arg;
    if (k->which == 0)
        k->rc = dlock_release(k->c, k->name);
    else if (k->which == 1)
        k->rc = dlock_held(k->c, k->name);
    else
        k->rc = dlock_acquire(k->c, k->name, 0, NULL);
    return NULL;
}

static int on_thread(dlock_client *c, const char *name, int which)
{
    call k = { c, name, which, 1000 };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, call_main, &k), 0);
    pthread_join(th, NULL);
    return k.rc;
}

/* ------------------------------------------------------------------ tests */

static void test_basic_lease_key(void **state)
{
    (void)state;
    const char *prefix = "tc:basic:";
    const uint32_t lease = 20000;
    dlock_client *c = open_client(prefix, lease);
    char key[128];
    lease_key(key, sizeof key, prefix, "order:42");
    assert_int_equal(key_exists(key), 0);

    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "order:42", 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_held(c, "order:42"), 1);
    assert_int_equal(dlock_held(c, "order:43"), 0);

    key_type_is(key, "hash");
    /* in the protocol the client was told to write (fx_config) */
    assert_int_equal(key_protocol(key), config_protocol());
    char *owner = grant_get(key, "owner");
    char *token = grant_get(key, "token");
    assert_non_null(owner);
    assert_true(strlen(owner) > 0);
    assert_non_null(token);
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_string_equal(token, want);
    /* The grant lasts a lease time; its key a lease time more (a fence if
     * it expires unreleased): protocol 1's lease key, protocol 2's hash,
     * which keeps g a lease time past its end (lua/p2/LAYOUT.txt,
     * "Lifetimes"; the pass limit's part, token + pl, is far below a
     * lease time here). */
    long long left = fx_server_lease_ms(key);
    assert_true(left > 0);
    assert_true(left <= lease);
    long long pttl = key_pttl(key);
    assert_true(pttl > lease && pttl <= 2 * (long long)lease);

    dlock_stats s = stats(c);
    assert_int_equal(s.leases_held, 1);
    assert_int_equal(s.entries, 1);
    assert_true(s.acquisitions >= 1);
    assert_true(s.redis_commands >= 1);
    assert_true(s.redis_round_trips >= 1);

    /* A second client has a different owner id. */
    dlock_client *c2 = open_client(prefix, lease);
    assert_int_equal(dlock_acquire(c2, "order:43", 0, NULL), DLOCK_OK);
    char key43[128];
    lease_key(key43, sizeof key43, prefix, "order:43");
    char *owner2 = grant_get(key43, "owner");
    assert_non_null(owner2);
    assert_string_not_equal(owner, owner2);
    assert_int_equal(dlock_release(c2, "order:43"), DLOCK_OK);
    dlock_client_close(c2);

    assert_int_equal(dlock_release(c, "order:42"), DLOCK_OK);
    assert_int_equal(lease_live(key), 0);
    assert_null(grant_get(key, "token")); /* released, not left to expire */
    assert_int_equal(dlock_held(c, "order:42"), 0);
    assert_table_empty(c);
    free(owner);
    free(owner2);
    free(token);
    dlock_client_close(c);
}

static void test_release_not_held(void **state)
{
    (void)state;
    const char *prefix = "tc:nothe:";
    dlock_client *c = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    char key[128];
    lease_key(key, sizeof key, prefix, "n");

    /* Never acquired: ENOTHELD, no entry left behind. */
    assert_int_equal(dlock_release(c, "never"), DLOCK_ENOTHELD);
    assert_table_empty(c);

    /* Held by this thread: another thread's release is refused and changes
     * nothing; so is another client's. */
    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "n", 0, &f), DLOCK_OK);
    dlock_stats before = stats(c);
    assert_int_equal(on_thread(c, "n", 0), DLOCK_ENOTHELD);
    assert_int_equal(on_thread(c, "n", 1), 0);          /* held is per thread */
    assert_int_equal(dlock_release(c2, "n"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_held(c2, "n"), 0);
    dlock_stats after = stats(c);
    assert_int_equal(after.leases_held, before.leases_held);
    assert_int_equal(after.entries, before.entries);
    assert_int_equal(dlock_held(c, "n"), 1);
    assert_int_equal(lease_live(key), 1);
    char *token = grant_get(key, "token");
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_non_null(token);
    assert_string_equal(token, want);
    free(token);

    /* Still exclusive. */
    assert_int_equal(dlock_acquire(c2, "n", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c, "n"), DLOCK_OK);
    assert_int_equal(dlock_release(c, "n"), DLOCK_ENOTHELD);
    assert_int_equal(lease_live(key), 0);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

static void test_try_busy(void **state)
{
    (void)state;
    const char *prefix = "tc:busy:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    uint64_t f1 = 0, f2 = 0;

    assert_int_equal(dlock_acquire(c1, "b", 0, &f1), DLOCK_OK);
    /* Another client (like another process) is refused at once. */
    assert_int_equal(dlock_acquire(c2, "b", 0, &f2), DLOCK_EBUSY);
    assert_int_equal(dlock_held(c2, "b"), 0);
    /* So is another thread of the same client. */
    assert_int_equal(on_thread(c1, "b", 2), DLOCK_EBUSY);
    /* Failed tries leave no entries behind. */
    assert_table_empty(c2);
    assert_int_equal(stats(c1).entries, 1);

    assert_int_equal(dlock_release(c1, "b"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "b", 0, &f2), DLOCK_OK);
    assert_true(f2 > f1);
    assert_int_equal(dlock_acquire(c1, "b", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c2, "b"), DLOCK_OK);

    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

static void test_timed_wait(void **state)
{
    (void)state;
    const char *prefix = "tc:timed:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    const int64_t wait = 400;
    /* Upper bound: the wait plus 5 s of slack (>10x the wait) for a loaded
     * 2-core machine and sanitizers; it only catches a wait that ignores
     * its deadline. */
    const long long bound_ms = wait + 5000;

    assert_int_equal(dlock_acquire(c1, "t", 0, NULL), DLOCK_OK);

    /* The waiter is the poller of another client. */
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_acquire(c2, "t", wait, NULL), DLOCK_ETIMEDOUT);
    long long el = MS(fx_now_ns() - t0);
    assert_true(el >= wait);
    assert_true(el < bound_ms);
    assert_int_equal(dlock_held(c2, "t"), 0);
    assert_table_empty(c2);

    /* The waiter is a local waiter behind the holder thread of the same client. */
    op o;
    op_start(&o, c1, "t", wait, 1);
    op_join(&o, bound_ms + 5000);
    assert_int_equal(o.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(o.elapsed_ns) >= wait);
    assert_true(MS(o.elapsed_ns) < bound_ms);
    assert_int_equal(o.held, 0);

    /* Two waiters of c2 at once, local waiter and poller: both honour it. */
    op a, b;
    op_start(&a, c2, "t", wait, 1);
    op_start(&b, c2, "t", wait, 1);
    op_join(&a, bound_ms + 5000);
    op_join(&b, bound_ms + 5000);
    assert_int_equal(a.rc, DLOCK_ETIMEDOUT);
    assert_int_equal(b.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(a.elapsed_ns) >= wait && MS(a.elapsed_ns) < bound_ms);
    assert_true(MS(b.elapsed_ns) >= wait && MS(b.elapsed_ns) < bound_ms);

    assert_int_equal(dlock_held(c1, "t"), 1);
    assert_int_equal(dlock_release(c1, "t"), DLOCK_OK);
    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

/* A timeout's and a busy try's message say who holds the lock, for how
 * long, when its lease ends and how many clients wait (issue: "timed out
 * waiting for the lock" told nothing at 3 a.m.). */
static void test_timeout_names_the_holder(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:who:";
    cfg.client_name = "billing-7";
    dlock_client *holder = NULL, *c = open_client("tc:who:", 0);
    assert_int_equal(dlock_client_open(&cfg, &holder), DLOCK_OK);
    assert_int_equal(dlock_acquire(holder, "inv", 0, NULL), DLOCK_OK);
    fx_sleep_ms(300);
    assert_int_equal(dlock_acquire(c, "inv", 0, NULL), DLOCK_EBUSY);
    const char *m = dlock_last_error();
    fprintf(stderr, "# a busy try: %s\n", m);
    assert_non_null(strstr(m, "'inv' is not free: held by billing-7 for "));
    assert_non_null(strstr(m, "its lease ends in "));
    assert_int_equal(dlock_acquire(c, "inv", 300, NULL), DLOCK_ETIMEDOUT);
    m = dlock_last_error();
    fprintf(stderr, "# a timeout: %s\n", m);
    assert_non_null(strstr(m, "timed out waiting for 'inv': held by billing-7 for "));
    assert_non_null(strstr(m, "; 1 client in its wait queue in Redis, this one included"));
    /* the holder held it for the 0.6 s slept and waited, or more (a lower
     * bound, less rounding: the time counts on to the message) */
    const char *f = strstr(m, "billing-7 for ") + strlen("billing-7 for ");
    assert_true(strtod(f, NULL) >= 0.55);
    /* A busy try counts the clients waiting too (it does not join them):
     * one waits now. Before, a try's message never said how many wait. */
    dlock_client *w = open_client("tc:who:", 0);
    op ow;
    op_start(&ow, w, "inv", 20000, 1);
    long long queued = 0;
    for (int i = 0; i < 1000 && queued != 1; i++) { /* 10 s: generous for a loaded machine */
        fx_sleep_ms(10);
        redisReply *r = cmd("ZCARD tc:who:{inv}:q");
        queued = r->integer;
        freeReplyObject(r);
    }
    assert_int_equal(queued, 1);
    assert_int_equal(dlock_acquire(c, "inv", 0, NULL), DLOCK_EBUSY);
    m = dlock_last_error();
    fprintf(stderr, "# a busy try while one waits: %s\n", m);
    assert_non_null(strstr(m, "; 1 client in its wait queue in Redis"));
    assert_null(strstr(m, "this one included"));
    assert_int_equal(dlock_release(holder, "inv"), DLOCK_OK);
    op_join(&ow, 30000);
    assert_int_equal(ow.rc, DLOCK_OK);
    dlock_client_close(w);
    dlock_client_close(holder);
    dlock_client_close(c);
}

static void test_waiter_gets_lock(void **state)
{
    (void)state;
    const char *prefix = "tc:wait:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    uint64_t f1 = 0;
    assert_int_equal(dlock_acquire(c1, "w", 0, &f1), DLOCK_OK);

    /* Waiters in the other client (a poller and a local waiter) and in the
     * same client. They wait up to 20 s so that a lost wake-up fails the
     * test instead of hanging it; the handoff itself should take well under
     * a second (the release wakes the next client). */
    op w1, w2, w3;
    op_start(&w1, c2, "w", 20000, 1);
    op_start(&w2, c2, "w", 20000, 1);
    op_start(&w3, c1, "w", -1, 1); /* forever; op_join bounds it */
    fx_sleep_ms(300);
    assert_int_equal(atomic_load(&w1.done), 0);
    assert_int_equal(atomic_load(&w2.done), 0);
    assert_int_equal(atomic_load(&w3.done), 0);
    assert_int_equal(dlock_release(c1, "w"), DLOCK_OK);
    op_join(&w1, 30000);
    op_join(&w2, 30000);
    op_join(&w3, 30000);
    op *ws[3] = { &w1, &w2, &w3 };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ws[i]->rc, DLOCK_OK);
        assert_int_equal(ws[i]->held, 1);
        assert_int_equal(ws[i]->rel_rc, DLOCK_OK);
        assert_true(ws[i]->fence > f1);
    }
    /* Three grants, three distinct tokens. */
    assert_true(w1.fence != w2.fence && w2.fence != w3.fence && w1.fence != w3.fence);

    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

/* One thread holding more names than it keeps at hand (8), released in
 * arrival order and out of it, across two clients with the same names: each
 * call finds the thread's own hold, nested acquires included, and nothing
 * of the other client's. */
static void test_many_names_held_by_one_thread(void **state)
{
    (void)state;
    enum { N = 20 };
    dlock_client *c = open_client("tc:many:", 30000);
    dlock_client *d = open_client("tc:many:", 30000);
    char name[N][16];
    uint64_t fence[N];
    for (int i = 0; i < N; i++) {
        snprintf(name[i], sizeof name[i], "m%d", i);
        assert_int_equal(dlock_acquire(c, name[i], -1, &fence[i]), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        uint64_t again;
        assert_int_equal(dlock_held(c, name[i]), 1);
        assert_int_equal(dlock_held(d, name[i]), 0); /* same name, the other client */
        assert_int_equal(dlock_acquire(c, name[i], 0, &again), DLOCK_OK); /* nested */
        assert_int_equal(again, fence[i]);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
        assert_int_equal(dlock_release(d, name[i]), DLOCK_ENOTHELD);
    }
    /* Odd names first (in arrival order), then even ones from the last. */
    for (int i = 1; i < N; i += 2)
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
    for (int i = N - 2; i >= 0; i -= 2) {
        assert_int_equal(dlock_held(c, name[i]), 1);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(dlock_held(c, name[i]), 0);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_ENOTHELD);
        /* Free in Redis: the other client takes each at once. */
        assert_int_equal(dlock_acquire(d, name[i], 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_held(d, name[i]), 1);
        assert_int_equal(dlock_held(c, name[i]), 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(dlock_release(d, name[i]), DLOCK_OK);
    assert_int_equal(fx_entries_settled(c), 0);
    assert_int_equal(fx_entries_settled(d), 0);
    dlock_client_close(d);
    dlock_client_close(c);
}

static void test_reentrant(void **state)
{
    (void)state;
    const char *prefix = "tc:reent:";
    /* A long lease: renewal every 20 s, so no renewal falls inside the
     * measured window by chance. */
    dlock_client *c = open_client(prefix, 60000);
    dlock_client *c2 = open_client(prefix, 60000);
    char key[128];
    lease_key(key, sizeof key, prefix, "r");
    uint64_t f1 = 0, f2 = 0, f3 = 0;

    assert_int_equal(dlock_acquire(c, "r", -1, &f1), DLOCK_OK);
    /* The subscribers' start-up commands are not part of the measure. */
    assert_int_equal(fx_wait_subscriber(c), 0);
    assert_int_equal(fx_wait_subscriber(c2), 0);
    dlock_stats s0 = stats(c);
    long long srv0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    assert_true(srv0 > 0);
    assert_int_equal(dlock_acquire(c, "r", 0, &f2), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "r", -1, &f3), DLOCK_OK);
    long long srv1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);
    assert_int_equal(f2, f1);
    assert_int_equal(f3, f1);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 0);
    assert_int_equal(s1.redis_round_trips - s0.redis_round_trips, 0);
    assert_int_equal(srv1 - srv0, 0);
    assert_int_equal(s1.acquisitions - s0.acquisitions, 2);
    assert_int_equal(s1.leases_held, 1);
    assert_int_equal(s1.entries, 1);

    /* Held until the outermost release. */
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 1);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 1);
    assert_int_equal(lease_live(key), 1);
    assert_int_equal(dlock_acquire(c2, "r", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(on_thread(c, "r", 2), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 0);
    assert_int_equal(lease_live(key), 0);
    assert_int_equal(dlock_release(c, "r"), DLOCK_ENOTHELD);

    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

static void test_fence_increases(void **state)
{
    (void)state;
    const char *prefix = "tc:fence:";
    dlock_client *c[2] = { open_client(prefix, 20000), open_client(prefix, 20000) };
    uint64_t last = 0, f = 0;

    for (int i = 0; i < 60; i++) {
        /* Alternate clients, repeat on the same client, and use another thread. */
        dlock_client *k = c[(i / 3) % 2];
        if (i % 5 == 4) {
            op o;
            op_start(&o, k, "f", 10000, 1);
            op_join(&o, 20000);
            assert_int_equal(o.rc, DLOCK_OK);
            assert_int_equal(o.rel_rc, DLOCK_OK);
            f = o.fence;
        } else {
            assert_int_equal(dlock_acquire(k, "f", 10000, &f), DLOCK_OK);
            assert_int_equal(dlock_release(k, "f"), DLOCK_OK);
        }
        if (!(f > last))
            fail_msg("grant %d: fence %" PRIu64 " not above previous %" PRIu64, i, f, last);
        last = f;
    }
    /* Tokens are per name, but a fresh name still gets a nonzero token. */
    assert_int_equal(dlock_acquire(c[0], "other", 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_release(c[0], "other"), DLOCK_OK);

    assert_table_empty(c[0]);
    assert_table_empty(c[1]);
    dlock_client_close(c[0]);
    dlock_client_close(c[1]);
}

static void test_table_empty_after_mix(void **state)
{
    (void)state;
    const char *prefix = "tc:table:";
    dlock_client *c = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    char name[32];
    /* Many names, nested holds, failures of every kind, several threads. */
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
        if (i % 3 == 0)
            assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
        if (i % 5 == 0)
            assert_int_equal(dlock_acquire(c2, name, 0, NULL), DLOCK_EBUSY);
        if (i % 7 == 0)
            assert_int_equal(dlock_acquire(c2, name, 50, NULL), DLOCK_ETIMEDOUT);
        if (i % 11 == 0)
            assert_int_equal(on_thread(c, name, 2), DLOCK_EBUSY);
    }
    assert_int_equal(stats(c).entries, 50);
    assert_int_equal(stats(c).leases_held, 50);
    assert_table_empty(c2);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "m%d", i);
        if (i % 3 == 0)
            assert_int_equal(dlock_release(c, name), DLOCK_OK);
        assert_int_equal(dlock_release(c, name), DLOCK_OK);
        assert_int_equal(dlock_release(c, name), DLOCK_ENOTHELD);
    }
    assert_table_empty(c);
    dlock_stats s = stats(c);
    assert_int_equal(s.leases_lost, 0);
    dlock_client_close(c);
    dlock_client_close(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_basic_lease_key, fx_ensure_server),
        cmocka_unit_test_teardown(test_release_not_held, fx_ensure_server),
        cmocka_unit_test_teardown(test_try_busy, fx_ensure_server),
        cmocka_unit_test_teardown(test_timed_wait, fx_ensure_server),
        cmocka_unit_test_teardown(test_timeout_names_the_holder, fx_ensure_server),
        cmocka_unit_test_teardown(test_waiter_gets_lock, fx_ensure_server),
        cmocka_unit_test_teardown(test_reentrant, fx_ensure_server),
        cmocka_unit_test_teardown(test_many_names_held_by_one_thread, fx_ensure_server),
        cmocka_unit_test_teardown(test_fence_increases, fx_ensure_server),
        cmocka_unit_test_teardown(test_table_empty_after_mix, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
