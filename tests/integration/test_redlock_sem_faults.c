/*
 * Redlock mode's semaphores (src/local/rlsem.h) under races held still, on
 * 3 private redis-servers: a thread woken late (--wrap=dlock_waiter_park),
 * and the renewal finding the permits lost while a try is answered
 * (--wrap=dlock_rlsem_acquire), and a granted try taken up after its
 * validity (the same wrap). Each permit a client's threads hold is a slot
 * it holds on a majority of the nodes: a name's holders never pass its
 * limit.
 *
 * Timing: leases of 2 s, command and connect timeouts of 1 s; a thread
 * held still waits for the test's word, and every wait for an event is
 * bounded at 10 s or more (generous for a loaded machine).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"
#include "entry/park.h"
#include "local/rlsem.h"

#define NSRV 3
#define LEASE_MS 2000
#define RL_TAG "rmf"

#include "redlock_helpers.h"

/* ------------------------------------------------------------- wrappers */

/* The thread delay_th, once woken from its park, waits until the test
 * lets it go on (delay_go; 30 s at most). */
static pthread_t delay_th;
static int delay_on, delay_go;

void __real_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns)
{
    __real_dlock_waiter_park(w, mu, deadline_ns);
    if (__atomic_load_n(&delay_on, __ATOMIC_SEQ_CST) && pthread_equal(pthread_self(), delay_th)) {
        __atomic_store_n(&delay_on, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(mu);
        for (int i = 0; i < 3000 && !__atomic_load_n(&delay_go, __ATOMIC_SEQ_CST); i++)
            fx_sleep_ms(10);
        pthread_mutex_lock(mu);
    }
}

/* With lose_slot >= 0, the next granted try deletes that slot of name
 * lose_name on every node (its holder's grant gone behind its back) and
 * waits until the renewal found the permits lost, before the local tier
 * takes the grant. */
static int lose_slot = -1;
static const char *lose_name;
/* With late_ms > 0, the next granted try is held that long before the
 * local tier takes it up (the caller descheduled). */
static int late_ms;

int __real_dlock_rlsem_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t);
int __wrap_dlock_rlsem_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t);
int __wrap_dlock_rlsem_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t)
{
    int rc = __real_dlock_rlsem_acquire(c, e, t);
    int late = __atomic_exchange_n(&late_ms, 0, __ATOMIC_SEQ_CST);
    if (late > 0 && rc == DLOCK_OK)
        fx_sleep_ms(late);
    int k = __atomic_exchange_n(&lose_slot, -1, __ATOMIC_SEQ_CST);
    if (k >= 0 && rc == DLOCK_OK) {
        int lost0 = rl_lost_count();
        for (int i = 0; i < NSRV; i++) {
            redisReply *r = fx_cmd_at(srv[i].port, "DEL %s{%s}:s%d", prefix, lose_name, k);
            if (r)
                freeReplyObject(r);
        }
        for (int i = 0; i < 1000 && rl_lost_count() == lost0; i++)
            fx_sleep_ms(10);
        assert_int_equal(rl_lost_count(), lost0 + 1);
    } else if (k >= 0) {
        __atomic_store_n(&lose_slot, k, __ATOMIC_SEQ_CST); /* the next one */
    }
    return rc;
}

/* -------------------------------------------------------------- helpers */

/* Clients in slot k's wait queue on node 0. */
static long long queued_on(const char *name, unsigned k)
{
    redisReply *r = fx_cmd_at(srv[0].port, "ZCARD %s{%s}:s%u:q", prefix, name, k);
    long long n = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    if (r)
        freeReplyObject(r);
    return n;
}

static dlock_client *client(void)
{
    dlock_client *c = rl_open_of(LEASE_MS, 1000);
    /* it counts the nodes a lease after it first saw them */
    assert_int_equal(dlock_sem_acquire(c, "warm", 8, 3 * LEASE_MS), DLOCK_OK);
    assert_int_equal(dlock_sem_release(c, "warm"), DLOCK_OK);
    return c;
}

static int restore(void **state)
{
    (void)state;
    __atomic_store_n(&lose_slot, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&late_ms, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&delay_on, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&delay_go, 0, __ATOMIC_SEQ_CST);
    rl_lost_reset();
    return fx_redis_restore_set(srv, NSRV);
}

typedef struct taker {
    pthread_t th;
    dlock_client *c;
    const char *name;
    uint32_t limit;
    int64_t wait_ms;
    int delayed; /* its park is held still (delay_th) */
    int rc;      /* its acquire's, set before got */
    int got;     /* its acquire returned */
    int go;      /* set: it gives its permit back (if any) and ends */
    int release_rc;
} taker;

static void *taker_main(void *arg)
{
    taker *t = arg;
    if (t->delayed) {
        delay_th = pthread_self();
        __atomic_store_n(&delay_on, 1, __ATOMIC_SEQ_CST);
    }
    t->rc = dlock_sem_acquire(t->c, t->name, t->limit, t->wait_ms);
    __atomic_store_n(&t->got, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&t->go, __ATOMIC_SEQ_CST))
        fx_sleep_ms(5);
    if (t->rc == DLOCK_OK)
        t->release_rc = dlock_sem_release(t->c, t->name);
    return NULL;
}

/* Waits (10 s at most) until t's acquire returned: its code. */
static int taker_got(taker *t)
{
    for (int i = 0; i < 1000 && !__atomic_load_n(&t->got, __ATOMIC_SEQ_CST); i++)
        fx_sleep_ms(10);
    assert_true(__atomic_load_n(&t->got, __ATOMIC_SEQ_CST));
    return t->rc;
}

/* Lets t give its permit back and end: its release's code (0 if none). */
static int taker_end(taker *t)
{
    __atomic_store_n(&t->go, 1, __ATOMIC_SEQ_CST);
    pthread_join(t->th, NULL);
    return t->release_rc;
}

static void taker_start(taker *t, dlock_client *c, const char *name, uint32_t limit,
                        int64_t wait_ms, int delayed)
{
    *t = (taker){.c = c, .name = name, .limit = limit, .wait_ms = wait_ms, .delayed = delayed};
    assert_int_equal(pthread_create(&t->th, NULL, taker_main, t), 0);
}

/* ---------------------------------------------------------------- tests */

/* A wait of client a, queued on both slots (H: one of them), times out
 * while a second thread of a waits behind it (so no leave is sent yet),
 * and that thread is held still as it wakes, until the single try below
 * is done. H's holder releases: H goes to a directly, and a third
 * thread's single try takes it. That grant ends the wait: the second
 * thread's wait that follows does not queue on H, whose leave would give
 * the single try's permit up (leave.lua gives up grants of older
 * attempts). Before the mend it kept H as its home (a wait then queued on
 * its home alone): a's permit was gone from the nodes, a fourth client
 * got one, and three held a limit of 2. */
static void test_single_try_on_the_home_slot_ends_the_wait(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = client(), *b = client(), *c = client(), *d = client();
    assert_int_equal(dlock_sem_acquire(b, "h", 2, 0), DLOCK_OK);
    unsigned bslot = rl_slot_held("h", 0) ? 0 : 1;
    assert_int_equal(dlock_sem_acquire(c, "h", 2, 0), DLOCK_OK);
    taker w1, w2;
    taker_start(&w1, a, "h", 2, 1500, 0);
    int home = -1;
    for (int i = 0; i < 1000 && home < 0; i++) {
        for (unsigned k = 0; k < 2; k++)
            if (queued_on("h", k) > 0)
                home = (int)k;
        fx_sleep_ms(5);
    }
    assert_true(home >= 0);
    taker_start(&w2, a, "h", 2, 20000, 1); /* parks behind w1 */
    assert_int_equal(taker_got(&w1), DLOCK_ETIMEDOUT);
    assert_int_equal(taker_end(&w1), 0);
    /* w2 is held still now: the home slot's holder releases it, a gets it
     * directly (still queued there), and a single try of a takes it */
    dlock_client *home_holder = (unsigned)home == bslot ? b : c;
    dlock_client *other = home_holder == b ? c : b;
    assert_int_equal(dlock_sem_release(home_holder, "h"), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "h", 2, 0), DLOCK_OK);
    /* w2 goes on and waits for the other slot, which is then released */
    __atomic_store_n(&delay_go, 1, __ATOMIC_SEQ_CST);
    assert_int_equal(dlock_sem_release(other, "h"), DLOCK_OK);
    assert_int_equal(taker_got(&w2), DLOCK_OK);
    fx_sleep_ms(500); /* (a background leave, if any, has run) */
    /* a's two permits are its slots, both held: nobody else gets one */
    assert_int_equal(rl_slot_held("h", 0) + rl_slot_held("h", 1), 2);
    assert_int_equal(dlock_sem_acquire(d, "h", 2, 0), DLOCK_EBUSY);
    assert_int_equal(taker_end(&w2), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "h"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
    dlock_client_close(d);
}

/* A thread of a holds a permit (slot S). Another's try is granted a second
 * slot, and before the local tier takes that grant, S is deleted on every
 * node and the renewal finds the permits lost, taking the fresh slot out
 * with them or not. The try's count is read again: a's threads never hold
 * more permits than slots of a on the nodes, so another client takes what
 * is left and no more. Before the mend the try counted 2 permits on one
 * slot left: a third thread of a took a "spare" permit without Redis, and
 * b's took the rest, 4 holders of a limit of 3. */
static void test_permits_lost_while_a_try_is_answered(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = client(), *b = client();
    taker t0;
    taker_start(&t0, a, "l", 3, 3000, 0);
    assert_int_equal(taker_got(&t0), DLOCK_OK);
    int s = -1;
    for (int i = 0; i < 1000 && s < 0; i++) {
        for (unsigned k = 0; k < 3; k++)
            if (rl_slot_held("l", k))
                s = (int)k;
        fx_sleep_ms(10);
    }
    assert_true(s >= 0);
    lose_name = "l";
    __atomic_store_n(&lose_slot, s, __ATOMIC_SEQ_CST);
    int rc1 = dlock_sem_acquire(a, "l", 3, 0); /* the try, held still */
    assert_true(rc1 == DLOCK_OK || rc1 == DLOCK_EBUSY);
    taker x; /* a third thread of a: a spare permit, or a try */
    taker_start(&x, a, "l", 3, 0, 0);
    int rc2 = taker_got(&x);
    int mine = (rc1 == DLOCK_OK) + (rc2 == DLOCK_OK), others = 0;
    for (int i = 0; i < 3; i++)
        others += dlock_sem_acquire(b, "l", 3, 0) == DLOCK_OK;
    printf("# a's threads hold %d, b took %d (limit 3)\n", mine, others);
    assert_true(mine + others <= 3);
    (void)taker_end(&x);
    if (rc1 == DLOCK_OK)
        (void)dlock_sem_release(a, "l");
    assert_int_equal(taker_end(&t0), DLOCK_ELOST); /* its slot was deleted */
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A try granted a slot, taken up by the local tier only after the slot's
 * validity (the caller held up a lease and more): refused as a grant
 * answered late, and the slot given back, so another client gets the one
 * permit. Before the mend (the late check was off in Redlock mode) a held
 * a permit the nodes could have ended: two holders of a limit of 1. */
static void test_grant_taken_up_late_given_back(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = client(), *b = client();
    __atomic_store_n(&late_ms, LEASE_MS + 300, __ATOMIC_SEQ_CST);
    int rc = dlock_sem_acquire(a, "t", 1, 0);
    if (rc == DLOCK_OK)
        (void)dlock_sem_release(a, "t");
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "after the permit could have ended"));
    assert_int_equal(dlock_sem_acquire(b, "t", 1, 3000), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "t"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_single_try_on_the_home_slot_ends_the_wait, restore),
        cmocka_unit_test_teardown(test_permits_lost_while_a_try_is_answered, restore),
        cmocka_unit_test_teardown(test_grant_taken_up_late_given_back, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
