/*
 * Counting semaphores in Redlock mode through dlock.h (docs/design.md,
 * "Redlock", Semaphores; src/local/rlsem.h): on 3 private redis-servers
 * (tests/support/fixture.h), a name's permits are its slots, each an
 * exclusive quorum lock: never more holders than the limit across
 * clients, a slot's keys in every node, permits passed between threads,
 * a waiting client woken by another's release, permits renewed past their
 * lease and kept with one node stopped, lost with two, given back by
 * close; a limit above the mode's refused.
 *
 * Each test runs on a key prefix of its own, seeded fresh (as `dlockctl
 * seed-fresh` does) before its clients open. The per-test teardown resumes
 * every paused server.
 *
 * Timing: leases of 500 ms, command and connect timeouts of 100 ms (the
 * storm's clients: 2 s and 400 ms; the renewals': 1 s and 300 ms); a fresh client counts a node a lease
 * after it first saw it, so a client's first acquire waits up to 2 s
 * (FIRST_WAIT_MS). Every bound is the lease or the timeouts plus a margin
 * of at least 300 ms for a loaded machine.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"

#define NSRV 3
#define LEASE_MS 500
#define FIRST_WAIT_MS 2000 /* a fresh client's first acquire: a lease + margin */
#define RL_TAG "rlm"

#include "redlock_helpers.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static dlock_client *open_client_of(uint32_t lease_ms, uint32_t timeout_ms)
{
    return rl_open_of(lease_ms, timeout_ms);
}

static dlock_client *open_client(void)
{
    return rl_open_of(LEASE_MS, 100);
}

/* A client whose waits poll rarely: a lease of 30 s and a waiter ttl of
 * 40 s make its fallback retry 10 s (the smaller of a third of the lease
 * and a quarter of the ttl), and its places in the queues live 40 s, so
 * that only a wake-up ends its wait soon and only a leave empties them. */
static dlock_client *open_waiting_client(void)
{
    dlock_config cfg;
    rl_config(&cfg, 30000, 400);
    cfg.waiter_ttl_ms = 40000;
    cfg.on_lost = rl_on_lost;
    return rl_open(&cfg);
}

/* Takes a permit of name (limit) on c, which must succeed within wait. */
static void must(dlock_client *c, const char *name, uint32_t limit, int64_t wait)
{
    int rc = dlock_sem_acquire(c, name, limit, wait);
    if (rc != DLOCK_OK)
        fail_msg("sem acquire %s: %s: %s", name, dlock_err_name(rc), dlock_last_error());
}

/* Slots of name (limit) held on a majority of the nodes. */
static unsigned slots_held(const char *name, uint32_t limit)
{
    unsigned n = 0;
    for (unsigned k = 0; k < limit; k++)
        n += (unsigned)rl_slot_held(name, k);
    return n;
}

static int restore(void **state)
{
    (void)state;
    return fx_redis_restore_set(srv, NSRV);
}

/* ----------------------------------------------------------------- tests */

/* Two clients, limit 2: each takes one, a third try of either is refused
 * (single try, and a short wait), and the slots held in Redis are two;
 * after a release the other client takes it. */
static void test_limit_across_clients(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "s1", 2, FIRST_WAIT_MS);
    must(b, "s1", 2, FIRST_WAIT_MS);
    assert_int_equal(slots_held("s1", 2), 2);
    assert_int_equal(dlock_sem_acquire(a, "s1", 2, 0), DLOCK_EBUSY);
    assert_non_null(strstr(dlock_last_error(), "held by others"));
    assert_int_equal(dlock_sem_acquire(b, "s1", 2, 200), DLOCK_ETIMEDOUT);
    assert_int_equal(dlock_sem_release(a, "s1"), DLOCK_OK);
    assert_int_equal(slots_held("s1", 2), 1);
    must(b, "s1", 2, 1000);
    assert_int_equal(slots_held("s1", 2), 2);
    assert_int_equal(dlock_sem_release(b, "s1"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "s1"), DLOCK_OK);
    assert_int_equal(slots_held("s1", 2), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A client holding one permit of two waits for the second, which another
 * client holds, and gives up: its wait's home slot is never the slot it
 * holds, whose leave would give that permit up (leave.lua gives up its
 * grants of older attempts). Before the mend the home was drawn among
 * every slot: half the waits lost the permit held. 8 waits: such a bug
 * escapes 1 time in 256. */
static void test_wait_for_second_permit_keeps_first(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "s7", 2, FIRST_WAIT_MS);
    must(b, "s7", 2, FIRST_WAIT_MS);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(dlock_sem_acquire(a, "s7", 2, 100), DLOCK_ETIMEDOUT);
        if (slots_held("s7", 2) != 2)
            fail_msg("wait %d gave up the permit its client held", i);
    }
    assert_int_equal(dlock_sem_release(a, "s7"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "s7"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A limit above the mode's is refused, naming it; 0 too. */
static void test_bad_limits(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client();
    assert_int_equal(dlock_sem_acquire(a, "s2", 65, 0), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "at most 64"));
    assert_int_equal(dlock_sem_acquire(a, "s2", 0, 0), DLOCK_EINVAL);
    must(a, "s2", 64, FIRST_WAIT_MS);
    assert_int_equal(slots_held("s2", 64), 1);
    assert_int_equal(dlock_sem_release(a, "s2"), DLOCK_OK);
    dlock_client_close(a);
}

typedef struct waiter {
    pthread_t th;
    dlock_client *c;
    const char *name;
    uint32_t limit;
    int64_t wait_ms;
    int rc;
    int64_t got_ms;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_sem_acquire(w->c, w->name, w->limit, w->wait_ms);
    w->got_ms = now_ms();
    if (w->rc == DLOCK_OK)
        w->rc = dlock_sem_release(w->c, w->name);
    return NULL;
}

/* A client waits for the one permit another holds: the holder's release
 * wakes it (a node's message) well before its fallback retry (10 s:
 * open_waiting_client), and then no slot is left held. */
static void test_waiter_woken_by_release(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_waiting_client(), *b = open_waiting_client();
    must(a, "s3", 1, FIRST_WAIT_MS);
    must(b, "s3w", 1, FIRST_WAIT_MS); /* b counts the nodes now */
    assert_int_equal(dlock_sem_release(b, "s3w"), DLOCK_OK);
    waiter w = {.c = b, .name = "s3", .limit = 1, .wait_ms = 20000};
    assert_int_equal(pthread_create(&w.th, NULL, waiter_main, &w), 0);
    /* its tries queued it (on every node: 10 s is generous) */
    char key[160];
    snprintf(key, sizeof key, "%s{s3}:s0:q", prefix);
    long long n = 0;
    for (int i = 0; i < 1000 && n == 0; i++) {
        redisReply *r = fx_cmd_at(srv[0].port, "ZCARD %s", key);
        n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
        if (r)
            freeReplyObject(r);
        if (n == 0)
            fx_sleep_ms(10);
    }
    assert_true(n > 0);
    int64_t t0 = now_ms();
    assert_int_equal(dlock_sem_release(a, "s3"), DLOCK_OK);
    pthread_join(w.th, NULL);
    assert_int_equal(w.rc, DLOCK_OK);
    printf("# woken %" PRId64 " ms after the release\n", w.got_ms - t0);
    assert_true(w.got_ms - t0 < 5000); /* the fallback: 10 s */
    assert_int_equal(slots_held("s3", 1), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* The clients queued on slot k of name at node i (its queue's ZCARD). */
static long long queued_on(unsigned i, const char *name, unsigned k)
{
    redisReply *r = fx_cmd_at(srv[i].port, "ZCARD %s{%s}:s%u:q", prefix, name, k);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return n;
}

/* Whether every queue of name's slots 0 .. limit - 1 at every node holds
 * at least one client (want 1), or none (want 0): polled for up to 10 s,
 * generous for a loaded machine (the leaves go out in the background). */
static int queues_are(const char *name, uint32_t limit, int want)
{
    for (int t = 0; t < 1000; t++) {
        int all = 1;
        for (unsigned i = 0; i < NSRV; i++)
            for (unsigned k = 0; k < limit; k++)
                all &= want ? queued_on(i, name, k) > 0 : queued_on(i, name, k) == 0;
        if (all)
            return 1;
        fx_sleep_ms(10);
    }
    return 0;
}

/* The queues of name's 3 slots at every node, for a failure's message. */
static void queues_text(const char *name, char *out, size_t size)
{
    size_t at = 0;
    for (unsigned k = 0; k < 3; k++)
        for (unsigned i = 0; i < NSRV && at < size; i++)
            at += (size_t)snprintf(out + at, size - at, "%ss%u@%u=%lld", at ? " " : "", k, i,
                                   queued_on(i, name, k));
}

/* A client waits for a permit of 3 another holds all of: its tries queue
 * it on every slot at every node, so that a release of any wakes it well
 * before its fallback retry (10 s: open_waiting_client); once it has a
 * permit it is out of the other slots' queues, which would otherwise keep
 * it (and a direct grant to it) for its waiter ttl (40 s). With 3 slots,
 * one of them is neither the wait's home nor the slot released, whatever
 * the draws. Before, a wait queued on its home slot only: a release of
 * another slot was found by the fallback. */
static void test_waiter_queued_on_every_slot(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_waiting_client(), *b = open_waiting_client();
    for (int i = 0; i < 3; i++)
        must(a, "s8", 3, FIRST_WAIT_MS);
    must(b, "s8w", 1, FIRST_WAIT_MS); /* b counts the nodes now */
    assert_int_equal(dlock_sem_release(b, "s8w"), DLOCK_OK);
    waiter w = {.c = b, .name = "s8", .limit = 3, .wait_ms = 20000};
    assert_int_equal(pthread_create(&w.th, NULL, waiter_main, &w), 0);
    char q[256];
    if (!queues_are("s8", 3, 1)) {
        queues_text("s8", q, sizeof q);
        fail_msg("the waiter is not queued on every slot at every node: %s", q);
    }
    int64_t t0 = now_ms();
    assert_int_equal(dlock_sem_release(a, "s8"), DLOCK_OK);
    pthread_join(w.th, NULL);
    assert_int_equal(w.rc, DLOCK_OK);
    printf("# woken %" PRId64 " ms after the release\n", w.got_ms - t0);
    assert_true(w.got_ms - t0 < 5000); /* the fallback: 10 s */
    if (!queues_are("s8", 3, 0)) {
        queues_text("s8", q, sizeof q);
        fail_msg("the waiter is still queued: %s", q);
    }
    assert_int_equal(dlock_sem_release(a, "s8"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "s8"), DLOCK_OK);
    assert_int_equal(slots_held("s8", 3), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A wait that times out leaves the queue of every slot it asked (its
 * places would otherwise live its waiter ttl, 40 s: open_waiting_client). */
static void test_timed_out_wait_leaves_every_queue(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_waiting_client(), *b = open_waiting_client();
    must(a, "s9", 3, FIRST_WAIT_MS);
    must(a, "s9", 3, FIRST_WAIT_MS);
    must(a, "s9", 3, FIRST_WAIT_MS);
    must(b, "s9w", 1, FIRST_WAIT_MS); /* b counts the nodes now */
    assert_int_equal(dlock_sem_release(b, "s9w"), DLOCK_OK);
    waiter w = {.c = b, .name = "s9", .limit = 3, .wait_ms = 3000};
    assert_int_equal(pthread_create(&w.th, NULL, waiter_main, &w), 0);
    char q[256];
    if (!queues_are("s9", 3, 1)) { /* (well within its 3 s) */
        queues_text("s9", q, sizeof q);
        fail_msg("the waiter is not queued on every slot at every node: %s", q);
    }
    pthread_join(w.th, NULL);
    assert_int_equal(w.rc, DLOCK_ETIMEDOUT);
    if (!queues_are("s9", 3, 0)) {
        queues_text("s9", q, sizeof q);
        fail_msg("the wait that ended is still queued: %s", q);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(dlock_sem_release(a, "s9"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Permits held across several leases are renewed slot by slot: still
 * held (in Redis, and no on_lost) after 3 leases; with one node stopped
 * too; with two stopped they are lost (on_lost, DLOCK_ELOST). A lease of
 * 1 s (renewed every 333 ms), timeouts of 300 ms: a stall of the loaded
 * machine shorter than 600 ms loses nothing. */
static void test_renewed_kept_then_lost(void **state)
{
    (void)state;
    rl_prefix_new(1);
    int lost0 = rl_lost_count();
    dlock_client *a = open_client_of(1000, 300);
    must(a, "s4", 3, 3000);
    must(a, "s4", 3, 1000);
    fx_sleep_ms(3000);
    assert_int_equal(slots_held("s4", 3), 2);
    assert_int_equal(dlock_held(a, "s4"), 1);
    assert_int_equal(rl_lost_count(), lost0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    fx_sleep_ms(3000);
    assert_int_equal(dlock_held(a, "s4"), 1);
    assert_int_equal(rl_lost_count(), lost0);
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    /* lost within its validity and a round (2 leases), plus margin */
    for (int i = 0; i < 500 && rl_lost_count() == lost0; i++)
        fx_sleep_ms(10);
    assert_int_equal(fx_redis_signal(&srv[1], SIGCONT), 0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    assert_int_equal(rl_lost_count(), lost0 + 1);
    assert_int_equal(dlock_sem_release(a, "s4"), DLOCK_ELOST);
    assert_int_equal(dlock_sem_release(a, "s4"), DLOCK_ELOST);
    /* and the name is usable again */
    must(a, "s4", 3, 3000);
    assert_int_equal(dlock_sem_release(a, "s4"), DLOCK_OK);
    dlock_client_close(a);
}

/* Close gives every slot back: a client holding two permits closes, and
 * another takes all three at once. */
static void test_close_gives_back(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "s5", 3, FIRST_WAIT_MS);
    must(a, "s5", 3, 1000);
    dlock_client_close(a);
    assert_int_equal(slots_held("s5", 3), 0);
    for (int i = 0; i < 3; i++)
        must(b, "s5", 3, i == 0 ? FIRST_WAIT_MS : 0);
    assert_int_equal(slots_held("s5", 3), 3);
    dlock_client_close(b);
}

/* Threads of two clients storm a semaphore of limit 3: never more than 3
 * holders at once (counted by the holders), and every call returns OK,
 * EBUSY or ETIMEDOUT. */
enum { ST_THREADS = 4, ST_ROUNDS = 40, ST_LIMIT = 3 };
static int st_in, st_max, st_bad;

static void *storm_main(void *arg)
{
    dlock_client *c = arg;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    for (int i = 0; i < ST_ROUNDS; i++) {
        int rc = dlock_sem_acquire(c, "s6", ST_LIMIT, rand_r(&seed) % 2 ? 0 : 300);
        if (rc != DLOCK_OK) {
            if (rc != DLOCK_EBUSY && rc != DLOCK_ETIMEDOUT) {
                fprintf(stderr, "# storm: %s: %s\n", dlock_err_name(rc), dlock_last_error());
                __atomic_add_fetch(&st_bad, 1, __ATOMIC_SEQ_CST);
            }
            continue;
        }
        int in = __atomic_add_fetch(&st_in, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&mu);
        if (in > st_max)
            st_max = in;
        pthread_mutex_unlock(&mu);
        fx_sleep_ms(rand_r(&seed) % 5);
        __atomic_sub_fetch(&st_in, 1, __ATOMIC_SEQ_CST);
        rc = dlock_sem_release(c, "s6");
        if (rc != DLOCK_OK) {
            fprintf(stderr, "# storm release: %s: %s\n", dlock_err_name(rc), dlock_last_error());
            __atomic_add_fetch(&st_bad, 1, __ATOMIC_SEQ_CST);
        }
    }
    return NULL;
}

static void test_storm_within_limit(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *c[2] = {open_client_of(2000, 400), open_client_of(2000, 400)};
    for (int i = 0; i < 2; i++) { /* each counts the nodes first */
        must(c[i], "s6", ST_LIMIT, FIRST_WAIT_MS);
        assert_int_equal(dlock_sem_release(c[i], "s6"), DLOCK_OK);
    }
    pthread_t th[2 * ST_THREADS];
    for (int i = 0; i < 2 * ST_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, storm_main, c[i % 2]), 0);
    for (int i = 0; i < 2 * ST_THREADS; i++)
        pthread_join(th[i], NULL);
    printf("# most holders at once: %d (limit %d)\n", st_max, ST_LIMIT);
    assert_int_equal(st_bad, 0);
    assert_true(st_max >= 1 && st_max <= ST_LIMIT);
    dlock_client_close(c[0]);
    dlock_client_close(c[1]);
    assert_int_equal(slots_held("s6", ST_LIMIT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_limit_across_clients, restore),
        cmocka_unit_test_teardown(test_bad_limits, restore),
        cmocka_unit_test_teardown(test_wait_for_second_permit_keeps_first, restore),
        cmocka_unit_test_teardown(test_waiter_woken_by_release, restore),
        cmocka_unit_test_teardown(test_waiter_queued_on_every_slot, restore),
        cmocka_unit_test_teardown(test_timed_out_wait_leaves_every_queue, restore),
        cmocka_unit_test_teardown(test_renewed_kept_then_lost, restore),
        cmocka_unit_test_teardown(test_close_gives_back, restore),
        cmocka_unit_test_teardown(test_storm_within_limit, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
