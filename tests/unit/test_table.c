/*
 * The entry table (local tier) without Redis: reference counting, lookup,
 * and a storm of concurrent get/put on few names checking that an entry is
 * never freed while referenced (ASan/TSan builds catch a use after free) and
 * that the table is empty at the end.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "entry/table.h"
#include "common/slot.h"

static void test_get_find_put(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_table *t = dlock_table_create("p:", "0123456789abcdef0123456789abcdef", &ctr);
    assert_non_null(t);
    assert_null(dlock_table_find(t, "a", 1));

    dlock_entry *e = dlock_table_get(t, "a", 1);
    assert_non_null(e);
    assert_string_equal(e->name, "a");
    assert_string_equal(e->keys[DLOCK_KEY_LEASE], "p:{a}");
    assert_string_equal(e->keys[DLOCK_KEY_FENCE], "p:{a}:fence");
    assert_string_equal(e->keys[DLOCK_KEY_QUEUE], "p:{a}:q");
    assert_string_equal(e->keys[DLOCK_KEY_LIVE], "p:{a}:qd");
    assert_string_equal(e->keys[DLOCK_KEY_TURN], "p:{a}:turn");
    /* the mark of the name's slot: in the same slot as the name's keys */
    char hw[32];
    snprintf(hw, sizeof hw, "p:hw:{%s}", dlock_slot_tag(dlock_cluster_slot("p:{a}", 5)));
    assert_string_equal(e->keys[DLOCK_KEY_HW], hw);
    assert_int_equal(dlock_cluster_slot(hw, strlen(hw)), dlock_cluster_slot("p:{a}", 5));
    assert_int_equal(e->lease.state, DLOCK_LEASE_NONE);
    assert_int_equal(dlock_table_count(t), 1);
    assert_int_equal(ctr.entries, 1);

    dlock_entry *e2 = dlock_table_get(t, "a", 1);
    assert_ptr_equal(e, e2);
    dlock_entry *e3 = dlock_table_find(t, "a", 1);
    assert_ptr_equal(e, e3);
    assert_int_equal(e->refs, 3);

    /* Names are compared by bytes and length, not as C strings only. */
    dlock_entry *b = dlock_table_get(t, "ab", 2);
    assert_ptr_not_equal(b, e);
    assert_int_equal(dlock_table_count(t), 2);

    dlock_table_put(t, e3);
    dlock_table_put(t, e2);
    assert_int_equal(dlock_table_count(t), 2);
    dlock_table_put(t, e);
    assert_int_equal(dlock_table_count(t), 1);
    assert_null(dlock_table_find(t, "a", 1));
    dlock_table_put(t, b);
    assert_int_equal(dlock_table_count(t), 0);
    assert_int_equal(ctr.entries, 0);
    dlock_table_destroy(t);
}

static void test_ref_keeps_alive(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_table *t = dlock_table_create("", "0123456789abcdef0123456789abcdef", &ctr);
    dlock_entry *e = dlock_table_get(t, "x", 1);
    dlock_table_ref(e);
    dlock_table_put(t, e);
    /* Still referenced once: still found, same entry. */
    dlock_entry *f = dlock_table_find(t, "x", 1);
    assert_ptr_equal(e, f);
    dlock_table_put(t, f);
    dlock_table_put(t, e);
    assert_int_equal(dlock_table_count(t), 0);
    /* A new get after close makes a new entry. */
    e = dlock_table_get(t, "x", 1);
    assert_non_null(e);
    assert_int_equal(e->refs, 1);
    dlock_table_put(t, e);
    dlock_table_destroy(t);
}

static void test_destroy_with_entries(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_table *t = dlock_table_create("p:", "0123456789abcdef0123456789abcdef", &ctr);
    for (int i = 0; i < 100; i++) {
        char n[16];
        snprintf(n, sizeof n, "n%d", i);
        assert_non_null(dlock_table_get(t, n, strlen(n)));
    }
    assert_int_equal(dlock_table_count(t), 100);
    dlock_table_destroy(t); /* frees all, whatever their counts (ASan checks leaks) */
}

enum { THREADS = 8, ROUNDS = 20000, NAMES = 4 };

typedef struct storm {
    dlock_table *t;
    unsigned seed;
    long touched;
} storm;

/* Each round: get a name, write to the entry under its mutex, put it. Many
 * rounds take counts to 0 and back, so closes race with lookups. */
static void *storm_main(void *arg)
{
    storm *s = arg;
    for (int i = 0; i < ROUNDS; i++) {
        char n[2] = {(char)('a' + rand_r(&s->seed) % NAMES), 0};
        dlock_entry *e = dlock_table_get(s->t, n, 1);
        assert_non_null(e);
        assert_int_equal(e->name[0], n[0]);
        pthread_mutex_lock(&e->mu);
        e->waiters++;
        e->waiters--;
        pthread_mutex_unlock(&e->mu);
        if (i % 3 == 0) {
            dlock_entry *f = dlock_table_find(s->t, n, 1);
            assert_ptr_equal(f, e); /* we hold e: it cannot close */
            dlock_table_put(s->t, f);
        }
        dlock_table_put(s->t, e);
        s->touched++;
    }
    return NULL;
}

static void test_concurrent_get_put(void **state)
{
    (void)state;
    dlock_counters ctr = {0};
    dlock_table *t = dlock_table_create("p:", "0123456789abcdef0123456789abcdef", &ctr);
    pthread_t th[THREADS];
    storm s[THREADS];
    for (int i = 0; i < THREADS; i++) {
        s[i] = (storm){t, (unsigned)i * 7919u + 1, 0};
        assert_int_equal(pthread_create(&th[i], NULL, storm_main, &s[i]), 0);
    }
    long total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        total += s[i].touched;
    }
    assert_int_equal(total, (long)THREADS * ROUNDS);
    assert_int_equal(dlock_table_count(t), 0);
    assert_int_equal(ctr.entries, 0);
    dlock_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_find_put),
        cmocka_unit_test(test_ref_keeps_alive),
        cmocka_unit_test(test_destroy_with_entries),
        cmocka_unit_test(test_concurrent_get_put),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
