/*
 * A semaphore's claim of its name in Redlock mode (route/redlock.h,
 * dlock_redlock_claim; lua/p2/sem_claim.lua; docs/design.md "Redlock",
 * Semaphores), through dlock.h on 3 private redis-servers: across
 * clients, a second limit for a name is refused while the first is in
 * use, and a lock and a semaphore of one name refuse each other; the
 * claim lives while permits are held (the renewals claim again), and
 * ends two leases after the last; a claim on a minority of the nodes
 * stops no one (a wait goes on while a node is stopped), one on a
 * majority does; a lock's try counts the claims of counting nodes only.
 *
 * Each test runs on a key prefix of its own, seeded fresh before its
 * clients open.
 *
 * Timing: leases of 500 ms (a claim lives 1 s), command and connect
 * timeouts of 300 ms; a fresh client counts a node a lease after it first
 * saw it (FIRST_WAIT_MS). Every wait for a claim to end polls, bounded at
 * 10 s: ten times the claim's life.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"

#define NSRV 3
#define LEASE_MS 500
#define FIRST_WAIT_MS 2000 /* a fresh client's first acquire: a lease + margin */
#define RL_TAG "rlc"

#include "redlock_helpers.h"

static dlock_client *open_client(void)
{
    return rl_open_of(LEASE_MS, 300);
}

static void must(dlock_client *c, const char *name, uint32_t limit, int64_t wait)
{
    int rc = dlock_sem_acquire(c, name, limit, wait);
    if (rc != DLOCK_OK)
        fail_msg("sem acquire %s: %s: %s", name, dlock_err_name(rc), dlock_last_error());
}

/* rc (a call's) is `want`, its message holding `what`. */
static void refused(int rc, int want, const char *what)
{
    if (rc != want || !strstr(dlock_last_error(), what))
        fail_msg("want %s with \"%s\", got %s: %s", dlock_err_name(want), what,
                 dlock_err_name(rc), dlock_last_error());
}

/* The name's claim on node i (its hash, "<prefix>{<name>}"): its limit,
 * 0 if none; *pttl its time to live (ms). */
static long long claim_at(int i, const char *name, long long *pttl)
{
    char key[160];
    snprintf(key, sizeof key, "%s{%s}", prefix, name);
    redisReply *r = fx_cmd_at(srv[i].port, "HGET %s l", key);
    assert_non_null(r);
    long long l = r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
    freeReplyObject(r);
    r = fx_cmd_at(srv[i].port, "PTTL %s", key);
    assert_non_null(r);
    *pttl = r->integer;
    freeReplyObject(r);
    return l;
}

/* Whether c takes a permit of name (limit), or the lock name if limit is
 * 0, by single tries every 50 ms within 10 s (then holding it). */
static int eventually(dlock_client *c, const char *name, uint32_t limit)
{
    for (int i = 0; i < 200; i++) {
        int rc = limit ? dlock_sem_acquire(c, name, limit, 0) : dlock_acquire(c, name, 0, NULL);
        if (rc == DLOCK_OK)
            return 1;
        fx_sleep_ms(50);
    }
    return 0;
}

/* Per test: every paused server resumed. */
static int restore(void **state)
{
    (void)state;
    return fx_redis_restore_set(srv, NSRV);
}

/* ----------------------------------------------------------------- tests */

/* a holds a permit of limit 2; b's limit 3 is refused (a single try and a
 * wait alike, at once, naming both limits), b's limit 2 is not; once a's
 * permits are all back, b's limit 3 comes within the claim's life. */
static void test_second_limit_refused(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "l1", 2, FIRST_WAIT_MS);
    long long pttl;
    for (int i = 0; i < NSRV; i++) {
        assert_int_equal(claim_at(i, "l1", &pttl), 2);
        assert_true(pttl > 0 && pttl <= 2 * LEASE_MS);
    }
    /* (b's first acquire waits until its nodes count) */
    refused(dlock_sem_acquire(b, "l1", 3, FIRST_WAIT_MS), DLOCK_EINVAL, "limit 2");
    assert_non_null(strstr(dlock_last_error(), "limit 3"));
    refused(dlock_sem_acquire(b, "l1", 3, 0), DLOCK_EINVAL, "limit 2");
    must(b, "l1", 2, 0);
    assert_int_equal(dlock_sem_release(b, "l1"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "l1"), DLOCK_OK);
    assert_true(eventually(b, "l1", 3));
    assert_int_equal(claim_at(0, "l1", &pttl), 3);
    assert_int_equal(dlock_sem_release(b, "l1"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A semaphore's name refuses another client's lock (a try and a wait
 * alike, at once), and a lock's name another client's semaphore; each
 * name serves the other kind once its holder is done (a semaphore's
 * claim ends two leases after its last permit; a lock's data never, so
 * the lock's name stays a lock's). */
static void test_lock_and_semaphore_refuse_each_other(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "k1", 3, FIRST_WAIT_MS);
    refused(dlock_acquire(b, "k1", FIRST_WAIT_MS, NULL), DLOCK_ESERVER, "semaphore");
    refused(dlock_acquire(b, "k1", 0, NULL), DLOCK_ESERVER, "semaphore");
    assert_int_equal(dlock_acquire(b, "k2", 0, NULL), DLOCK_OK);
    refused(dlock_sem_acquire(a, "k2", 3, 0), DLOCK_ESERVER, "lock's data");
    refused(dlock_sem_acquire(a, "k2", 3, 300), DLOCK_ESERVER, "lock's data");
    assert_int_equal(dlock_release(b, "k2"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "k1"), DLOCK_OK);
    assert_true(eventually(b, "k1", 0));
    assert_int_equal(dlock_release(b, "k1"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Permits held for 6 leases (3 claim lives): the renewals claim the name
 * again, so another client's lock is still refused at the end, and the
 * claim's time to live stays within two leases. */
static void test_claim_lives_while_held(void **state)
{
    (void)state;
    rl_prefix_new(1);
    int lost0 = rl_lost_count();
    dlock_client *a = open_client(), *b = open_client();
    must(a, "h1", 2, FIRST_WAIT_MS);
    assert_int_equal(dlock_acquire(b, "other", FIRST_WAIT_MS, NULL), DLOCK_OK);
    fx_sleep_ms(6 * LEASE_MS);
    assert_int_equal(dlock_held(a, "h1"), 1);
    assert_int_equal(rl_lost_count(), lost0);
    refused(dlock_acquire(b, "h1", 0, NULL), DLOCK_ESERVER, "semaphore");
    long long pttl;
    for (int i = 0; i < NSRV; i++) {
        assert_int_equal(claim_at(i, "h1", &pttl), 2);
        assert_true(pttl > 0 && pttl <= 2 * LEASE_MS);
    }
    assert_int_equal(dlock_sem_release(a, "h1"), DLOCK_OK);
    assert_int_equal(dlock_release(b, "other"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Another limit's claim written on one node (a minority) stops no one:
 * the name is claimed by the other two. On two nodes (a majority) it
 * refuses the semaphore, naming that limit. */
static void test_claim_needs_a_majority(void **state)
{
    (void)state;
    rl_prefix_new(1);
    char key[160];
    snprintf(key, sizeof key, "%s{m1}", prefix);
    redisReply *r = fx_cmd_at(srv[0].port, "HSET %s pv 2 k s l 5", key);
    assert_non_null(r);
    freeReplyObject(r);
    dlock_client *a = open_client();
    must(a, "m1", 2, FIRST_WAIT_MS);
    long long pttl;
    assert_int_equal(claim_at(0, "m1", &pttl), 5);
    assert_int_equal(claim_at(1, "m1", &pttl), 2);
    assert_int_equal(dlock_sem_release(a, "m1"), DLOCK_OK);

    snprintf(key, sizeof key, "%s{m2}", prefix);
    for (int i = 0; i < 2; i++) {
        r = fx_cmd_at(srv[i].port, "HSET %s pv 2 k s l 5", key);
        assert_non_null(r);
        freeReplyObject(r);
    }
    refused(dlock_sem_acquire(a, "m2", 2, 0), DLOCK_EINVAL, "limit 5");
    assert_int_equal(claim_at(2, "m2", &pttl), 2); /* (claimed there: harmless) */
    dlock_client_close(a);
}

/* A lock's try refused as a semaphore's name (DLOCKKIND) by a node that
 * does not count (its seed key names another run) and by one that does,
 * the third granting: one counting refusal is not more than n - m, so the
 * try fails as too few nodes counting (DLOCK_EREDIS), not as the name
 * being a semaphore's (DLOCK_ESERVER, which a refusal counted from the
 * node that does not count would make). */
static void test_kind_counts_counting_nodes_only(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client();
    assert_int_equal(dlock_acquire(a, "warm", FIRST_WAIT_MS, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(a, "warm"), DLOCK_OK);
    char key[160];
    snprintf(key, sizeof key, "%s{k1}", prefix);
    for (int i = 0; i < 2; i++) {
        redisReply *r = fx_cmd_at(srv[i].port, "HSET %s pv 2 k s l 5", key);
        assert_non_null(r);
        freeReplyObject(r);
    }
    redisReply *r = fx_cmd_at(srv[0].port, "SET %sredlock:seed another-run", prefix);
    assert_non_null(r);
    freeReplyObject(r);
    refused(dlock_acquire(a, "k1", 0, NULL), DLOCK_EREDIS, "1 of 3 nodes count and answered");
    dlock_client_close(a);
}

/* Another limit's claim on one node (a minority, left by a client gone)
 * while a third node is stopped for 0.8 s: a lock's wait and a wait for a
 * permit of this limit go on while too few nodes answer (DLOCK_EREDIS
 * inside, tried again) and are granted once the node is back, instead of
 * ending with that minority's refusal (DLOCK_ESERVER after 450 ms, and
 * DLOCK_EINVAL naming limit 5, before the mend). Waits of 3 s: 2.2 s to
 * spare for a loaded machine. */
static void *cont_later(void *arg)
{
    fx_sleep_ms(800);
    assert_int_equal(fx_redis_signal((fx_redis *)arg, SIGCONT), 0);
    return NULL;
}

static void test_minority_claim_waits_for_node(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client();
    must(a, "warm", 2, FIRST_WAIT_MS);
    assert_int_equal(dlock_sem_release(a, "warm"), DLOCK_OK);
    for (int k = 1; k <= 2; k++) {
        char key[160];
        snprintf(key, sizeof key, "%s{q%d}", prefix, k);
        redisReply *r = fx_cmd_at(srv[0].port, "HSET %s pv 2 k s l 5", key);
        assert_non_null(r);
        freeReplyObject(r);
    }
    pthread_t th;
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    assert_int_equal(pthread_create(&th, NULL, cont_later, &srv[2]), 0);
    int rc = dlock_acquire(a, "q1", 3000, NULL);
    pthread_join(th, NULL);
    if (rc != DLOCK_OK)
        fail_msg("lock wait: %s: %s", dlock_err_name(rc), dlock_last_error());
    assert_int_equal(dlock_release(a, "q1"), DLOCK_OK);
    fx_sleep_ms(1200); /* (node 2 answers again: the calls ask it again) */
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    assert_int_equal(pthread_create(&th, NULL, cont_later, &srv[2]), 0);
    rc = dlock_sem_acquire(a, "q2", 2, 3000);
    pthread_join(th, NULL);
    if (rc != DLOCK_OK)
        fail_msg("permit wait: %s: %s", dlock_err_name(rc), dlock_last_error());
    assert_int_equal(dlock_sem_release(a, "q2"), DLOCK_OK);
    dlock_client_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_limit_refused),
        cmocka_unit_test(test_lock_and_semaphore_refuse_each_other),
        cmocka_unit_test(test_claim_lives_while_held),
        cmocka_unit_test(test_claim_needs_a_majority),
        cmocka_unit_test(test_kind_counts_counting_nodes_only),
        cmocka_unit_test_teardown(test_minority_claim_waits_for_node, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
