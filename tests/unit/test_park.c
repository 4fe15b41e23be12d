/*
 * Parking of local waiters (src/entry/park.c) without Redis: the queue keeps
 * arrival order and knows since when its head leads; a grant hands the
 * token to a parked thread, which wakes with it; a wake-up is delivered
 * once; a park honours its deadline.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "common/common.h"
#include "entry/park.h"

static void node_init(dlock_waiter *w)
{
    memset(w, 0, sizeof *w);
    w->self = pthread_self();
}

static void test_queue_order(void **state)
{
    (void)state;
    dlock_waitq q = {0};
    dlock_waiter a, b, c;
    node_init(&a);
    node_init(&b);
    node_init(&c);
    dlock_waitq_push(&q, &a, 100);
    dlock_waitq_push(&q, &b, 200);
    dlock_waitq_push(&q, &c, 300);
    assert_int_equal(q.n, 3);
    assert_ptr_equal(q.head, &a);
    assert_ptr_equal(q.tail, &c);
    assert_int_equal(q.head_since_ns, 100); /* a led since it arrived */

    dlock_waitq_remove(&q, &b); /* from the middle: order kept */
    assert_ptr_equal(a.next, &c);
    assert_ptr_equal(c.prev, &a);
    assert_int_equal(b.queued, 0);
    dlock_waitq_remove(&q, &b); /* not queued: nothing happens */
    assert_int_equal(q.n, 2);

    int64_t before = dlock_now_ns();
    dlock_waitq_remove(&q, &a); /* the head leaves: c leads from now */
    assert_ptr_equal(q.head, &c);
    assert_true(q.head_since_ns >= before);

    dlock_waitq_remove(&q, &c);
    assert_null(q.head);
    assert_null(q.tail);
    assert_int_equal(q.n, 0);
}

static void test_wake_once(void **state)
{
    (void)state;
    dlock_waitq q = {0};
    dlock_waiter a;
    node_init(&a);
    dlock_waitq_push(&q, &a, 1);
    /* Not parked: the flag is set, no futex wake is needed. */
    assert_null(dlock_waitq_wake_later(&a));
    assert_int_equal(a.wake, 1);
    a.wake = 0;
    a.parked = 1;
    assert_ptr_equal(dlock_waitq_wake_later(&a), &a);
    /* Told and not yet looked: a second wake-up adds nothing. */
    assert_null(dlock_waitq_wake_later(&a));
    dlock_waitq_remove(&q, &a);
}

typedef struct parker {
    pthread_mutex_t mu;
    dlock_waitq q;
    dlock_waiter *node;
    uint64_t token;
    int parks;
} parker;

static void *parker_main(void *arg)
{
    parker *p = arg;
    pthread_mutex_lock(&p->mu);
    dlock_waiter *w = dlock_waiter_self();
    dlock_waitq_push(&p->q, w, dlock_now_ns());
    p->node = w;
    while (!dlock_waiter_granted(w)) {
        p->parks++;
        dlock_waiter_park(w, &p->mu, DLOCK_NEVER);
    }
    p->token = w->token;
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void test_grant_wakes_parked_thread(void **state)
{
    (void)state;
    parker p;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, parker_main, &p), 0);
    /* Until the thread is parked on its futex. */
    for (;;) {
        pthread_mutex_lock(&p.mu);
        if (p.node && p.node->parked)
            break;
        pthread_mutex_unlock(&p.mu);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    dlock_waiter *w = p.node;
    dlock_waiter *wk = dlock_waitq_grant(&p.q, w, 4242);
    assert_ptr_equal(wk, w); /* parked: the granter must wake it */
    assert_null(p.q.head);   /* out of the queue at once */
    pthread_mutex_unlock(&p.mu);
    dlock_waiter_unpark(wk); /* after the unlock, as a release does */
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(p.token, 4242);
    assert_true(p.parks >= 1);
    pthread_mutex_destroy(&p.mu);
}

static void test_park_deadline(void **state)
{
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    dlock_waitq q = {0};
    pthread_mutex_lock(&mu);
    dlock_waiter *w = dlock_waiter_self();
    dlock_waitq_push(&q, w, dlock_now_ns());
    int64_t deadline = dlock_now_ns() + 20 * DLOCK_NS_PER_MS;
    /* Spurious returns are allowed: the caller loops, as acquire does. */
    while (dlock_now_ns() < deadline)
        dlock_waiter_park(w, &mu, deadline);
    assert_int_equal(w->parked, 0);
    assert_false(dlock_waiter_granted(w));
    dlock_waitq_remove(&q, w);
    pthread_mutex_unlock(&mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_order),
        cmocka_unit_test(test_wake_once),
        cmocka_unit_test(test_grant_wakes_parked_thread),
        cmocka_unit_test(test_park_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
