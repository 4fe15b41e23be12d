/*
 * The counting semaphore beside the lock in one client, under faults and
 * races, against a real redis-server (src/local/sem.h, M1 to M8). White
 * box where a race needs holding still: a test may keep a reference on a
 * name's entry (entry/table.h) as another thread of the library would for
 * a moment (a refused lock call, the subscriber, a renewal round).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "local/client.h"

static int lost_calls;

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

static void redis_del(const char *key)
{
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL %s", key));
    redisFree(rc);
}

/* A name used as a semaphore, then (once nobody uses it so and its data is
 * gone from Redis) as a lock by the same client, on the same entry: the
 * lock's lease must be renewed as a lock's. Before the mend the entry kept
 * lease.sem from its permits, so the renewal filed the lock under the
 * semaphore's group (sem_renew.lua, which answers 0 on a lock's hash) and
 * the lock was lost at the first round. */
static void test_lock_after_semaphore_on_one_entry(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 1500; /* renewed every 500 ms */
    cfg.on_lost = on_lost;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(c, "mix", 2, 0), DLOCK_OK);
    /* another thread's reference for a moment (a lock call refused by M1,
     * the subscriber's wake-up, a renewal round): the entry lives on */
    dlock_entry *e = dlock_table_find(c->table, "mix", 3);
    assert_non_null(e);
    assert_int_equal(dlock_sem_release(c, "mix"), DLOCK_OK);
    redis_del("dlock:{mix}"); /* its record lifetime ran out */
    int lost0 = __atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST);
    assert_int_equal(dlock_acquire(c, "mix", 0, NULL), DLOCK_OK);
    /* three renewal rounds at least */
    for (int i = 0; i < 20; i++) {
        fx_sleep_ms(100);
        if (__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST) != lost0)
            break;
    }
    assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), lost0);
    assert_int_equal(dlock_held(c, "mix"), 1);
    assert_int_equal(dlock_release(c, "mix"), DLOCK_OK);
    dlock_table_put(c->table, e);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lock_after_semaphore_on_one_entry, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
