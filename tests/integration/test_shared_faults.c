/*
 * The shared mode beside the exclusive lock in one client, under faults
 * and races, against a real redis-server: a lease lost while an exclusive
 * handoff is open and a thread waiting shared leads the local queue; a
 * direct grant in a mode nobody of the client waits in any more; a lease
 * of one mode lost by its validity alone, then the other mode asked for;
 * a join with too little of the lease left; both modes with short waits,
 * nesting and timeouts from two clients. Each of these failed before its
 * mend (src/local/acquire.c, rpc.c, client.c wake_one, shared.c).
 *
 * Some waits are slowed down on purpose through a wrapper of
 * dlock_waiter_park (tests/CMakeLists.txt links this test with
 * --wrap=dlock_waiter_park, as test_handoff).
 */
#include <signal.h>
#include <stdio.h>

#include "common/common.h"
#include "entry/park.h"
#include "local/client.h"
#include "local/shared.h"
#include "shared_helpers.h"

static int lost_calls;
static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

/* The wrapper: a thread marked `slow_thread` runs `hook` (once armed)
 * right after its next park, without the entry's mutex; with `open_pass`
 * its wait looks shorter than the fairness bound, so a release opens its
 * handoff instead of handing it the lease directly (excl.c, pass). */
void __real_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
static __thread int slow_thread;
static int armed;
static int open_pass;
static int hook_keeps_mutex; /* the hook runs with the entry's mutex held */
static void (*hook)(void);

void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns)
{
    if (slow_thread && open_pass)
        w->since_ns = INT64_MAX / 2;
    __real_dlock_waiter_park(w, mu, deadline_ns);
    if (slow_thread && __atomic_exchange_n(&armed, 0, __ATOMIC_SEQ_CST)) {
        if (!hook_keeps_mutex)
            pthread_mutex_unlock(mu);
        hook();
        if (!hook_keeps_mutex)
            pthread_mutex_lock(mu);
    }
}

static void *slow_taker_main(void *arg)
{
    slow_thread = 1;
    return taker_main(arg);
}

static void slow_taker_start(taker *t, dlock_client *c, const char *name, int shared,
                             int64_t wait_ms)
{
    taker_start_on(t, c, name, shared, wait_ms, slow_taker_main);
}

/* An exclusive release opens a local handoff to a slow exclusive waiter;
 * before it runs, the lease is deleted in Redis and the renewal finds it
 * lost, waking the head of the local queue: a thread waiting shared. It
 * must end the open handoff (the lease's kind's, not its own kind's),
 * poll, and hold the name shared; the exclusive waiter must not take that
 * shared lease as its own. Before the mend both held it, and the releases
 * broke an invariant (release.c). */
static taker *reader;
static void lose_then_let_the_reader_in(void)
{
    int lost0 = __atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL dlock:{lh}"));
    redisFree(rc);
    /* bounded waits, generous: the renewal comes within a third of the
     * 1.5 s lease, the reader's grant within a round trip */
    for (int i = 0; i < 1000 && __atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST) == lost0; i++)
        fx_sleep_ms(10);
    for (int i = 0; i < 1000 && !taker_done(reader); i++)
        fx_sleep_ms(10);
}

static void test_lost_open_handoff_shared_head(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.lease_ms = 1500;
    cfg.join_ms = 1000;
    cfg.on_lost = on_lost;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    hook = lose_then_let_the_reader_in;
    open_pass = 1;
    assert_int_equal(dlock_acquire(c, "lh", 0, NULL), DLOCK_OK);
    taker rd, wr;
    taker_start(&rd, c, "lh", 1, 20000); /* the head of the local queue */
    reader = &rd;
    let_it_wait();
    slow_taker_start(&wr, c, "lh", 0, 20000);
    let_it_wait();
    __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST);
    assert_int_equal(dlock_release(c, "lh"), DLOCK_OK); /* an open handoff to wr */
    assert_int_equal(taker_got(&rd), DLOCK_OK);         /* rd holds it shared */
    let_it_wait();
    int both = taker_done(&wr) && wr.rc == DLOCK_OK;
    taker_finish(&rd);
    assert_int_equal(rd.release_rc, DLOCK_OK);
    taker_finish(&wr);
    assert_false(both);
    assert_int_equal(wr.rc, DLOCK_OK); /* after the reader */
    assert_int_equal(wr.release_rc, DLOCK_OK);
    open_pass = 0;
    dlock_client_close(c);
}

/* A thread waiting shared gives up while a thread of the same client waits
 * exclusively: no leave is sent, and the client stays queued in Redis as a
 * shared waiter. Another client's writer releases before the exclusive
 * waiter tries again: Redis grants this client shared directly ("S"), a
 * grant no thread of it waits for in that mode. It must go back at once:
 * before the mend the exclusive waiter's tries were refused (DLOCKMODE)
 * and it failed with DLOCK_EREDIS, and once that was mended it waited for
 * the grant's waiter ttl (10 s here). */
static dlock_handle *writer;
static void writer_releases(void)
{
    assert_int_equal(dlock_handle_release(writer), DLOCK_OK);
    fx_sleep_ms(200); /* the "S" message arrives meanwhile, with no poller */
}

static void test_grant_in_a_mode_nobody_waits_in(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.waiter_ttl_ms = 10000; /* what an unreturned grant would cost */
    dlock_client *w, *c;
    assert_int_equal(dlock_client_open(&cfg, &w), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    assert_int_equal(dlock_acquire_handle(w, "dg", 0, NULL, &writer), DLOCK_OK);
    taker rd, wr;
    taker_start(&rd, c, "dg", 1, 1000); /* the poller: queued in Redis shared */
    let_it_wait();
    hook = writer_releases;
    slow_taker_start(&wr, c, "dg", 0, 30000);
    let_it_wait();
    __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST); /* its next wake-up: rd's timeout */
    assert_int_equal(taker_got(&rd), DLOCK_ETIMEDOUT);
    long long t0 = fx_now_ns();
    int rc = taker_got(&wr);
    long long ms = (fx_now_ns() - t0) / 1000000;
    print_message("the writer after a shared grant nobody wanted: %s after %lld ms\n",
                  dlock_err_name(rc), ms);
    taker_finish(&rd);
    taker_finish(&wr);
    assert_int_equal(rc, DLOCK_OK);
    /* Given back, it is not waited out: the bound is the waiter ttl (10 s)
     * halved, generous for a loaded machine (a give-back takes a round
     * trip). */
    assert_true(ms < 5000);
    dlock_client_close(w);
    dlock_client_close(c);
}

/* The same stray grant in two other timings: (a) its message reaches the
 * client only once the exclusive waiter is the poller (the subscriber
 * waits for the entry's mutex, which the woken waiter holds while the
 * other client's writer releases): the poller must give it back, though
 * it names an older try; (b) no poller yet, but another thread waits
 * shared behind the exclusive head, which polls first: given back too.
 * Before the mends each cost the writer the waiter ttl (10 s). */
static void a_writer_behind_a_stray_shared_grant(const char *name, int keep_mutex,
                                                 int reader_behind)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.waiter_ttl_ms = 10000;
    dlock_client *w, *c;
    assert_int_equal(dlock_client_open(&cfg, &w), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    assert_int_equal(dlock_acquire_handle(w, name, 0, NULL, &writer), DLOCK_OK);
    taker rd, wr, rd2;
    taker_start(&rd, c, name, 1, 1000); /* the poller: queued in Redis shared */
    let_it_wait();
    hook = writer_releases;
    hook_keeps_mutex = keep_mutex;
    slow_taker_start(&wr, c, name, 0, 30000);
    let_it_wait();
    if (reader_behind) {
        taker_start(&rd2, c, name, 1, 30000);
        let_it_wait();
    }
    __atomic_store_n(&armed, 1, __ATOMIC_SEQ_CST); /* its next wake-up: rd's timeout */
    assert_int_equal(taker_got(&rd), DLOCK_ETIMEDOUT);
    long long t0 = fx_now_ns();
    int rc = taker_got(&wr);
    long long ms = (fx_now_ns() - t0) / 1000000;
    print_message("%s: the writer after a stray shared grant: %s after %lld ms\n", name,
                  dlock_err_name(rc), ms);
    taker_finish(&rd);
    taker_finish(&wr);
    hook_keeps_mutex = 0;
    assert_int_equal(rc, DLOCK_OK);
    /* Given back, the writer's next try after its pause (waiter ttl / 4,
     * 2.5 s) gets the name; waited out, it would take the waiter ttl
     * (10 s): 7.5 s is between, generous for a loaded machine. */
    assert_true(ms < 7500);
    if (reader_behind) {
        assert_int_equal(taker_got(&rd2), DLOCK_OK);
        taker_finish(&rd2);
        assert_int_equal(rd2.release_rc, DLOCK_OK);
    }
    dlock_client_close(w);
    dlock_client_close(c);
}

static void test_stray_grant_reaches_the_other_poller(void **state)
{
    (void)state;
    a_writer_behind_a_stray_shared_grant("dga", 1, 0);
}

static void test_stray_grant_with_its_mode_queued_behind(void **state)
{
    (void)state;
    a_writer_behind_a_stray_shared_grant("dgb", 0, 1);
}

/* A thread's records of shared holds of clients closed since (closing a
 * client while a thread holds a name is allowed) are dropped when its
 * array fills, not kept until the thread exits: 100 of them leave at most
 * the array's room. Before the mend all 100 stayed. */
static void test_records_of_closed_clients_dropped(void **state)
{
    (void)state;
    assert_null(dlock_shold_last());
    for (int i = 0; i < 100; i++) {
        dlock_client *c = open_client(20);
        assert_int_equal(dlock_acquire_shared(c, "cr", 0, NULL), DLOCK_OK);
        dlock_client_close(c);
    }
    unsigned n = 0;
    dlock_shold *h;
    while ((h = dlock_shold_last()) != NULL) {
        h->depth = h->nested = 0; /* (records of closed clients: nothing to release) */
        dlock_shold_tidy(h);
        n++;
    }
    print_message("records left after 100 closed clients: %u\n", n);
    assert_true(n <= 4);
}

/* (The boot clock's skew is set with a plain atomic store, which
 * ThreadSanitizer sees, as the library reads it.)
 * A lease of one mode lost by its validity alone (Redis paused past it:
 * the renewal could not tell) while Redis still has it as this client's;
 * then the same client asks for the name in `then_shared` mode. Returns
 * the acquire's result (3 s wait). */
static int lose_then_acquire(const char *name, int shared, int then_shared)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.lease_ms = 6000;
    cfg.on_lost = on_lost;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0);
    int lost0 = __atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST);
    assert_int_equal(shared ? dlock_acquire_shared(c, name, 0, NULL)
                            : dlock_acquire(c, name, 0, NULL),
                     DLOCK_OK);
    /* past the validity */
    __atomic_store_n(&dlock_boot_skew_ns, 6100ULL * 1000000ULL, __ATOMIC_RELAXED);
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    for (int i = 0; i < 100 && __atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST) == lost0; i++)
        fx_sleep_ms(50);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    __atomic_store_n(&dlock_boot_skew_ns, 0, __ATOMIC_RELAXED);
    assert_int_equal(__atomic_load_n(&lost_calls, __ATOMIC_SEQ_CST), lost0 + 1);
    assert_int_equal(shared ? dlock_release_shared(c, name) : dlock_release(c, name),
                     DLOCK_ELOST);
    int rc = then_shared ? dlock_acquire_shared(c, name, 3000, NULL)
                         : dlock_acquire(c, name, 3000, NULL);
    print_message("%s lost, then %s: %s (%s)\n", shared ? "shared" : "exclusive",
                  then_shared ? "shared" : "exclusive", dlock_err_name(rc),
                  rc == DLOCK_OK ? "" : dlock_last_error());
    if (rc == DLOCK_ETIMEDOUT)
        assert_non_null(strstr(dlock_last_error(), "other mode"));
    if (rc == DLOCK_OK)
        assert_int_equal(then_shared ? dlock_release_shared(c, name) : dlock_release(c, name),
                         DLOCK_OK);
    dlock_client_close(c);
    return rc;
}

/* The same mode again takes the lease over at once (the unconfirmed
 * token); the other mode waits for that lease's end in Redis, at most a
 * lease time (docs/guide.md, "Shared mode"), and says why: before the
 * mend an exclusive acquire after a lost shared lease failed at once with
 * DLOCK_EREDIS (DLOCKMODE). */
static void test_lost_lease_then_the_other_mode(void **state)
{
    (void)state;
    assert_int_equal(lose_then_acquire("lx", 0, 0), DLOCK_OK);
    assert_int_equal(lose_then_acquire("ls", 1, 1), DLOCK_OK);
    int rc = lose_then_acquire("lsx", 1, 0);
    assert_true(rc == DLOCK_OK || rc == DLOCK_ETIMEDOUT);
    rc = lose_then_acquire("lxs", 0, 1);
    assert_true(rc == DLOCK_OK || rc == DLOCK_ETIMEDOUT);
}

/* A join needs the margin a local handoff keeps: with 50 ms of a 3 s
 * lease's validity left, a thread does not join (it would hold nothing
 * valid a moment later); before the mend it did. */
static void test_no_join_at_the_end_of_the_lease(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.lease_ms = 3000;
    cfg.join_ms = 3000;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(c, "jm", 0, NULL), DLOCK_OK);
    dlock_entry *e = dlock_table_find(c->table, "jm", 2);
    pthread_mutex_lock(&e->mu);
    int64_t left = e->lease.valid_until_ns - dlock_boot_ns();
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    __atomic_store_n(&dlock_boot_skew_ns, (uint64_t)(left - 50 * DLOCK_NS_PER_MS),
                     __ATOMIC_RELAXED);
    taker t;
    taker_start(&t, c, "jm", 1, 0);
    int rc = taker_got(&t);
    __atomic_store_n(&dlock_boot_skew_ns, 0, __ATOMIC_RELAXED);
    taker_finish(&t);
    assert_int_equal(rc, DLOCK_EBUSY);
    assert_int_equal(dlock_release_shared(c, "jm"), DLOCK_OK);
    dlock_client_close(c);
}

/* Both modes from two clients, 8 threads, short waits (0 to 7 ms: many
 * timeouts, leaves and dropped grants), some shared acquires nested in
 * exclusive holds: every call returns OK, EBUSY or ETIMEDOUT, and never a
 * reader beside a writer. Before the mends some returned DLOCK_EREDIS. */
enum { RS_THREADS = 8, RS_ROUNDS = 400 };
static int rs_readers, rs_writers, rs_bad;
static pthread_mutex_t rs_mu = PTHREAD_MUTEX_INITIALIZER;

static void *rs_main(void *arg)
{
    dlock_client *c = arg;
    unsigned seed = (unsigned)(uintptr_t)pthread_self();
    for (int i = 0; i < RS_ROUNDS; i++) {
        int r = rand_r(&seed) % 10;
        int shared = r < 6, nest = r == 9;
        int64_t wait = rand_r(&seed) % 4 == 0 ? 0 : rand_r(&seed) % 8;
        int rc = shared ? dlock_acquire_shared(c, "rs", wait, NULL)
                        : dlock_acquire(c, "rs", wait, NULL);
        if (rc != DLOCK_OK) {
            if (rc != DLOCK_ETIMEDOUT && rc != DLOCK_EBUSY) {
                print_message("acquire %s: %s %s\n", shared ? "shared" : "exclusive",
                              dlock_err_name(rc), dlock_last_error());
                __atomic_add_fetch(&rs_bad, 1, __ATOMIC_SEQ_CST);
            }
            continue;
        }
        if (nest && dlock_acquire_shared(c, "rs", 0, NULL) != DLOCK_OK)
            __atomic_add_fetch(&rs_bad, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&rs_mu);
        if (shared ? rs_writers > 0 : rs_writers > 0 || rs_readers > 0)
            rs_bad++;
        *(shared ? &rs_readers : &rs_writers) += 1;
        pthread_mutex_unlock(&rs_mu);
        if (rand_r(&seed) % 3 == 0)
            fx_sleep_ms(1);
        pthread_mutex_lock(&rs_mu);
        *(shared ? &rs_readers : &rs_writers) -= 1;
        pthread_mutex_unlock(&rs_mu);
        if (nest && dlock_release(c, "rs") != DLOCK_OK)
            __atomic_add_fetch(&rs_bad, 1, __ATOMIC_SEQ_CST);
        rc = shared || nest ? dlock_release_shared(c, "rs") : dlock_release(c, "rs");
        if (rc != DLOCK_OK) {
            print_message("release: %s %s\n", dlock_err_name(rc), dlock_last_error());
            __atomic_add_fetch(&rs_bad, 1, __ATOMIC_SEQ_CST);
        }
    }
    return NULL;
}

static void test_both_modes_short_waits(void **state)
{
    (void)state;
    dlock_client *c[2] = {open_client(5), open_client(5)};
    pthread_t th[RS_THREADS];
    rs_bad = rs_readers = rs_writers = 0;
    for (int i = 0; i < RS_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, rs_main, c[i % 2]), 0);
    for (int i = 0; i < RS_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(rs_bad, 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fx_entries_settled(c[i]), 0);
        dlock_client_close(c[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lost_open_handoff_shared_head, fx_ensure_server),
        cmocka_unit_test_teardown(test_grant_in_a_mode_nobody_waits_in, fx_ensure_server),
        cmocka_unit_test_teardown(test_stray_grant_reaches_the_other_poller, fx_ensure_server),
        cmocka_unit_test_teardown(test_stray_grant_with_its_mode_queued_behind,
                                  fx_ensure_server),
        cmocka_unit_test_teardown(test_records_of_closed_clients_dropped, fx_ensure_server),
        cmocka_unit_test_teardown(test_lost_lease_then_the_other_mode, fx_ensure_server),
        cmocka_unit_test_teardown(test_no_join_at_the_end_of_the_lease, fx_ensure_server),
        cmocka_unit_test_teardown(test_both_modes_short_waits, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
