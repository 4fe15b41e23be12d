/*
 * Shared mode in Redlock mode through dlock.h (docs/design.md, "Redlock",
 * Shared mode): on 3 private redis-servers (tests/support/fixture.h),
 * readers of several clients hold a name side by side while writers wait,
 * a writer's token is above every shared token handed out before it and
 * the next shared token above the writer's, a shared lease is renewed past
 * its lease, survives one node stopped, is woken when a writer releases,
 * works through handles, dlock_with_shared and cancel tokens, and readers
 * and writers of two clients never overlap.
 *
 * Each test runs on a key prefix of its own, seeded fresh (as `dlockctl
 * seed-fresh` does) before its clients open. The per-test teardown resumes
 * every paused server.
 *
 * Timing: leases of 500 ms, command and connect timeouts of 100 ms (the
 * readers and writers of two clients: 2 s and 400 ms); a fresh client
 * counts a node a lease after it first saw it, so a client's first acquire
 * waits up to 2 s (FIRST_WAIT_MS). Every bound is the lease or the
 * timeouts plus a margin of at least 300 ms for a loaded machine.
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
#define RL_TAG "rls"

#include "redlock_helpers.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------- helpers */

static dlock_client *open_client_of(uint32_t lease_ms, uint32_t timeout_ms)
{
    return rl_open_of(lease_ms, timeout_ms);
}

static dlock_client *open_client(void)
{
    return rl_open_of(LEASE_MS, 100);
}

/* Acquires name on c, shared or not, which must succeed within `wait`: the
 * token. */
static uint64_t must(dlock_client *c, const char *name, int shared, int64_t wait)
{
    uint64_t t = 0;
    int rc = shared ? dlock_acquire_shared(c, name, wait, &t) : dlock_acquire(c, name, wait, &t);
    if (rc != DLOCK_OK)
        fail_msg("%s acquire of %s: %s: %s", shared ? "shared" : "exclusive", name,
                 dlock_strerror(rc), dlock_last_error());
    return t;
}

static int restore(void **state)
{
    (void)state;
    for (int i = 0; i < NSRV; i++)
        if (fx_redis_signal(&srv[i], SIGCONT) != 0)
            return -1;
    rl_lost_reset();
    return 0;
}

/* ------------------------------------------------------------------ tests */

/* Two clients' readers side by side, a writer refused meanwhile; the
 * writer's token above both shared tokens, and the next reader's above the
 * writer's; a reader refused while the writer holds. Semaphores are still
 * refused in this mode. */
static void test_readers_side_by_side(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client(), *w = open_client();
    uint64_t ta = must(a, "r", 1, FIRST_WAIT_MS);
    uint64_t tb = must(b, "r", 1, FIRST_WAIT_MS);
    assert_true(ta > 0 && tb > 0);
    assert_int_equal(dlock_held(a, "r"), 1);
    assert_int_equal(dlock_held(b, "r"), 1);
    must(w, "warm", 0, FIRST_WAIT_MS); /* w counts its nodes */
    assert_int_equal(dlock_release(w, "warm"), DLOCK_OK);
    assert_int_equal(dlock_acquire(w, "r", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release_shared(a, "r"), DLOCK_OK);
    assert_int_equal(dlock_acquire(w, "r", 0, NULL), DLOCK_EBUSY); /* b still reads */
    assert_int_equal(dlock_release_shared(b, "r"), DLOCK_OK);
    uint64_t tw = must(w, "r", 0, 1000);
    assert_true(tw > ta && tw > tb);
    assert_int_equal(dlock_acquire_shared(a, "r", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(w, "r"), DLOCK_OK);
    uint64_t ta2 = must(a, "r", 1, 1000);
    assert_true(ta2 > tw);
    assert_int_equal(dlock_release_shared(a, "r"), DLOCK_OK);
    assert_int_equal(rl_lost_count(), 0);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(w);
}

/* A shared lease held for 4 leases is renewed by the renewal thread: still
 * held, never lost, released cleanly, and a writer waits for it. */
static void test_shared_renewed(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *w = open_client();
    uint64_t t = must(a, "long", 1, FIRST_WAIT_MS);
    must(w, "warm", 0, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(w, "warm"), DLOCK_OK);
    fx_sleep_ms(4 * LEASE_MS);
    assert_int_equal(dlock_held(a, "long"), 1);
    assert_int_equal(dlock_acquire(w, "long", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release_shared(a, "long"), DLOCK_OK);
    assert_true(must(w, "long", 0, 1000) > t);
    assert_int_equal(dlock_release(w, "long"), DLOCK_OK);
    assert_int_equal(rl_lost_count(), 0);
    dlock_client_close(a);
    dlock_client_close(w);
}

/* One node of 3 stopped: readers are still granted by the other two, and
 * a writer still refused beside them. */
static void test_one_node_stopped(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *b = open_client();
    must(a, "warm", 0, FIRST_WAIT_MS);
    must(b, "warm2", 0, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(a, "warm"), DLOCK_OK);
    assert_int_equal(dlock_release(b, "warm2"), DLOCK_OK);
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    uint64_t ta = must(a, "n", 1, 1000), tb = must(b, "n", 1, 1000);
    assert_true(ta > 0 && tb > 0);
    assert_int_equal(dlock_acquire(b, "m", 0, NULL), DLOCK_OK); /* another name: free */
    assert_int_equal(dlock_release(b, "m"), DLOCK_OK);
    assert_int_equal(dlock_release_shared(a, "n"), DLOCK_OK);
    assert_int_equal(dlock_release_shared(b, "n"), DLOCK_OK);
    assert_int_equal(rl_lost_count(), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A reader that waits while a writer holds is granted once the writer
 * releases, within its wait. */
typedef struct waiter {
    dlock_client *c;
    int rc;
    uint64_t token;
} waiter;

static void *wait_shared(void *arg)
{
    waiter *x = arg;
    x->rc = dlock_acquire_shared(x->c, "q", 3000, &x->token);
    if (x->rc == DLOCK_OK)
        x->rc = dlock_release_shared(x->c, "q");
    return NULL;
}

static void test_reader_waits_for_writer(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *w = open_client();
    must(a, "warm", 0, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(a, "warm"), DLOCK_OK);
    uint64_t tw = must(w, "q", 0, FIRST_WAIT_MS);
    waiter x = {.c = a, .rc = -100};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_shared, &x), 0);
    fx_sleep_ms(300);
    assert_int_equal(dlock_release(w, "q"), DLOCK_OK);
    pthread_join(th, NULL);
    assert_int_equal(x.rc, DLOCK_OK);
    assert_true(x.token > tw);
    dlock_client_close(a);
    dlock_client_close(w);
}

/* A shared handle released from another thread, dlock_with_shared, and a
 * shared wait behind a writer cancelled by its token: the same calls as
 * on one server. */
static uint64_t with_fence;

static void with_fn(void *arg, uint64_t fence)
{
    (void)arg;
    with_fence = fence;
}

typedef struct cancelled {
    dlock_client *c;
    dlock_cancel *k;
    int rc;
} cancelled;

static void *wait_cancelled(void *arg)
{
    cancelled *x = arg;
    dlock_acquire_opts o;
    dlock_acquire_opts_init(&o);
    o.cancel = x->k;
    x->rc = dlock_acquire_shared_ex(x->c, "h", 10000, NULL, &o);
    return NULL;
}

static void *release_handle(void *arg)
{
    return (void *)(intptr_t)dlock_handle_release(arg);
}

static void test_handles_with_cancel(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(), *w = open_client();
    dlock_handle *h = NULL;
    uint64_t t = 0;
    assert_int_equal(dlock_acquire_shared_handle(a, "h", FIRST_WAIT_MS, &t, &h), DLOCK_OK);
    assert_int_equal(dlock_handle_held(h), 1);
    must(w, "warm", 0, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(w, "warm"), DLOCK_OK);
    assert_int_equal(dlock_acquire(w, "h", 0, NULL), DLOCK_EBUSY);
    pthread_t th;
    void *ret;
    assert_int_equal(pthread_create(&th, NULL, release_handle, h), 0);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, DLOCK_OK);
    uint64_t tw = must(w, "h", 0, 1000);
    assert_true(tw > t);
    /* a reader of a waits behind w's hold; its token fires */
    cancelled x = {.c = a, .rc = -100};
    assert_int_equal(dlock_cancel_create(&x.k), DLOCK_OK);
    assert_int_equal(pthread_create(&th, NULL, wait_cancelled, &x), 0);
    fx_sleep_ms(300);
    dlock_cancel_fire(x.k);
    pthread_join(th, NULL);
    assert_int_equal(x.rc, DLOCK_ECANCELED);
    dlock_cancel_destroy(x.k);
    assert_int_equal(dlock_release(w, "h"), DLOCK_OK);
    with_fence = 0;
    assert_int_equal(dlock_with_shared(a, "h", 1000, with_fn, NULL), DLOCK_OK);
    assert_true(with_fence > tw);
    assert_int_equal(rl_lost_count(), 0);
    dlock_client_close(a);
    dlock_client_close(w);
}

/* Two clients, each with two reader threads and one writer thread, on one
 * name for 2 s: no reader inside beside a writer, no two writers inside,
 * each writer's token above every token handed out before it, and both
 * kinds got in. */
typedef struct mixed_run {
    dlock_client *c;
    int shared;
    int64_t until_ms;
    int errors;
} mixed_run;

static int readers, writers, overlaps, reads, writes, backwards;
static uint64_t high;

static void *mixed_worker(void *arg)
{
    mixed_run *r = arg;
    while (now_ms() < r->until_ms) {
        uint64_t t;
        int rc = r->shared ? dlock_acquire_shared(r->c, "x", 1000, &t)
                           : dlock_acquire(r->c, "x", 1000, &t);
        if (rc == DLOCK_ETIMEDOUT)
            continue;
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire: %s: %s\n", dlock_strerror(rc), dlock_last_error());
            r->errors++;
            continue;
        }
        pthread_mutex_lock(&mu);
        if (writers || (!r->shared && readers))
            overlaps++;
        if (r->shared) {
            readers++;
            reads++;
        } else {
            writers++;
            writes++;
            if (t <= high) /* (a writer's token is above every one before it) */
                backwards++;
        }
        if (t > high)
            high = t;
        pthread_mutex_unlock(&mu);
        fx_sleep_ms(2);
        pthread_mutex_lock(&mu);
        if (r->shared)
            readers--;
        else
            writers--;
        pthread_mutex_unlock(&mu);
        rc = r->shared ? dlock_release_shared(r->c, "x") : dlock_release(r->c, "x");
        if (rc != DLOCK_OK) {
            fprintf(stderr, "release: %s: %s\n", dlock_strerror(rc), dlock_last_error());
            r->errors++;
        }
    }
    return NULL;
}

static void test_readers_and_writers(void **state)
{
    (void)state;
    rl_prefix_new(1);
    /* (a lease of 2 s and timeouts of 400 ms: six threads of two clients
     * keep three nodes busy, and a loaded machine must not turn a slow
     * answer into an error) */
    dlock_client *a = open_client_of(2000, 400), *b = open_client_of(2000, 400);
    must(a, "warm", 0, FIRST_WAIT_MS);
    must(b, "warm2", 0, FIRST_WAIT_MS);
    assert_int_equal(dlock_release(a, "warm"), DLOCK_OK);
    assert_int_equal(dlock_release(b, "warm2"), DLOCK_OK);
    readers = writers = overlaps = reads = writes = backwards = 0;
    high = 0;
    mixed_run r[6];
    pthread_t th[6];
    int64_t until = now_ms() + 2000;
    for (int i = 0; i < 6; i++) {
        r[i] = (mixed_run){.c = i % 2 ? b : a, .shared = i >= 2, .until_ms = until};
        assert_int_equal(pthread_create(&th[i], NULL, mixed_worker, &r[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        errors += r[i].errors;
    }
    dlock_client_close(a); /* (first: a traced build writes its trace then) */
    dlock_client_close(b);
    assert_int_equal(errors, 0);
    assert_int_equal(overlaps, 0);
    assert_int_equal(backwards, 0);
    /* (a few of each at least, on a loaded machine: each takes a few ms) */
    assert_true(reads >= 10);
    assert_true(writes >= 4);
    assert_int_equal(rl_lost_count(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_readers_side_by_side, restore),
        cmocka_unit_test_teardown(test_shared_renewed, restore),
        cmocka_unit_test_teardown(test_one_node_stopped, restore),
        cmocka_unit_test_teardown(test_reader_waits_for_writer, restore),
        cmocka_unit_test_teardown(test_handles_with_cancel, restore),
        cmocka_unit_test_teardown(test_readers_and_writers, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
