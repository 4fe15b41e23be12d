/*
 * Local handoffs against a real redis-server: a release with a waiting
 * thread of the same client passes the lease with no Redis command and the
 * next token; pass_limit bounds consecutive passes; a lost lease, or one
 * close to its validity deadline, is never passed on.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/slot.h"
#include "entry/park.h"
#include "fixture.h"
#include "local/client.h"


static dlock_stats stats(dlock_client *c)
{
    dlock_stats s;
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s;
}

/* A thread that acquires `name` (waiting forever), records its result and
 * fence, signals `got`, then waits for `go_release` before releasing. */
typedef struct waiter {
    dlock_client *c;
    const char *name;
    int rc, release_rc;
    int held; /* dlock_held right after the acquire returned */
    uint64_t fence;
    int got, go_release;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    int rc = dlock_acquire(w->c, w->name, -1, &w->fence);
    int held = dlock_held(w->c, w->name);
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->held = held;
    w->got = 1;
    pthread_cond_broadcast(&w->cv);
    while (!w->go_release)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    if (rc == DLOCK_OK)
        w->release_rc = dlock_release(w->c, w->name);
    return NULL;
}

static void waiter_start(waiter *w, dlock_client *c, const char *name)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->name = name;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    assert_int_equal(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

/* Waits until the waiter thread sits in dlock_acquire: the entry counts it
 * as a waiter. Observed through the library's own entry count is not
 * possible, so give it time; the test's assertions hold either way except
 * for the handoff count, which is why the wait is generous. */
static void let_it_wait(void)
{
    fx_sleep_ms(200);
}

static void waiter_finish(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->got)
        pthread_cond_wait(&w->cv, &w->mu);
    w->go_release = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

static void waiter_wait_got(waiter *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->got)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* The bound the server keeps on the tokens handed out by the released
 * grants of name (prefix dlock:) in protocol p: protocol 1's fence key; protocol 2's
 * mark of the name's hash slot, "<token> <clock> <pass limit>" (lua/keys.lua,
 * HW), which is the slot's highest, and so the name's while no other name
 * of the slot was granted since. 0 when there is none. */
static uint64_t passed_bound(redisContext *rc, const char *name, uint32_t p)
{
    redisReply *r;
    if (p == 1) {
        r = redisCommand(rc, "GET dlock:{%s}:fence", name);
    } else {
        const char *tag = dlock_slot_tag(dlock_cluster_slot(name, strlen(name)));
        r = redisCommand(rc, "GET dlock:hw:{%s}", tag);
    }
    uint64_t v = r && r->type == REDIS_REPLY_STRING ? strtoull(r->str, NULL, 10) : 0;
    if (r)
        freeReplyObject(r);
    return v;
}

static void test_handoff_costs_no_redis_command(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "h1", -1, &f0), DLOCK_OK);
    assert_int_equal(fx_wait_subscriber(c), 0); /* its start-up is not measured */
    waiter w;
    waiter_start(&w, c, "h1");
    let_it_wait();

    dlock_stats s0 = stats(c);
    long long server0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    assert_int_equal(dlock_release(c, "h1"), DLOCK_OK);
    waiter_wait_got(&w);
    long long server1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);

    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.fence, f0 + 1); /* a pass adds 1 to the token */
    assert_int_equal(s1.handoffs - s0.handoffs, 1);
    assert_int_equal(s1.grants - s0.grants, 0);
    /* Nothing reached Redis between the release and the waiter's grant, on
     * the client's count and the server's (renewals run only every 10 s with
     * the default lease). */
    assert_int_equal(s1.redis_commands - s0.redis_commands, 0);
    assert_int_equal(server1 - server0, 0);
    assert_int_equal(dlock_held(c, "h1"), 0); /* the main thread gave it away */

    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    /* Nobody waited at the last release: the lease went back to Redis. */
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_int_equal(fx_lease_ms(rc, "dlock:{h1}"), -2);
    /* The server keeps the last token handed out, not the grant's. */
    assert_int_equal(passed_bound(rc, "h1", cfg.protocol), f0 + 1);
    redisFree(rc);

    /* So the next grant, from another client, exceeds the passed token. */
    dlock_client *other;
    assert_int_equal(dlock_client_open(&cfg, &other), DLOCK_OK);
    uint64_t f2;
    assert_int_equal(dlock_acquire(other, "h1", 0, &f2), DLOCK_OK);
    assert_true(f2 > f0 + 1);
    assert_int_equal(dlock_release(other, "h1"), DLOCK_OK);
    dlock_client_close(other);
    assert_int_equal(fx_entries_settled(c), 0);
    dlock_client_close(c);
}

/* The fairness bound of the local succession policy: a thread that has led
 * the local queue for longer than the bound (1 ms; here 200 ms) gets the
 * lease directly at the next release, so the releasing thread, which is
 * running and tries again at once, cannot take it back. Before the policy
 * the release left the lease open to the first thread to run, and that try
 * won it while the waiter was still waking up. */
static void test_longest_waiter_not_passed_over(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "fair", -1, &f0), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "fair");
    let_it_wait();

    assert_int_equal(dlock_release(c, "fair"), DLOCK_OK);
    int barge = dlock_acquire(c, "fair", 0, NULL);
    if (barge == DLOCK_OK)
        dlock_release(c, "fair");
    assert_int_equal(barge, DLOCK_EBUSY);
    waiter_wait_got(&w);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.fence, f0 + 1);
    assert_int_equal(stats(c).handoffs, 1);
    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

/* Storm of one client's threads on one name: every run of passes is at most
 * pass_limit long, so handoffs <= pass_limit * grants; tokens increase. */
enum { STORM_THREADS = 8, STORM_ROUNDS = 300 };

typedef struct storm {
    dlock_client *c;
    pthread_mutex_t *mu;
    uint64_t *last_fence;
    long *counter;
    int errors;
} storm;

static void *storm_main(void *arg)
{
    storm *s = arg;
    for (int i = 0; i < STORM_ROUNDS; i++) {
        uint64_t f;
        if (dlock_acquire(s->c, "hot", -1, &f) != DLOCK_OK) {
            s->errors++;
            continue;
        }
        /* Inside the critical section: the fence must exceed the last one
         * (read under a test mutex only to keep TSan informed: the lock is
         * what serializes these sections). */
        pthread_mutex_lock(s->mu);
        if (f <= *s->last_fence)
            s->errors++;
        *s->last_fence = f;
        long v = *s->counter;
        pthread_mutex_unlock(s->mu);
        sched_yield();
        pthread_mutex_lock(s->mu);
        *s->counter = v + 1;
        pthread_mutex_unlock(s->mu);
        if (dlock_release(s->c, "hot") != DLOCK_OK)
            s->errors++;
    }
    return NULL;
}

static void run_storm(uint32_t pass_limit, dlock_stats *out)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.pass_limit = pass_limit;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t last = 0;
    long counter = 0;
    storm s[STORM_THREADS];
    pthread_t th[STORM_THREADS];
    for (int i = 0; i < STORM_THREADS; i++) {
        s[i] = (storm){c, &mu, &last, &counter, 0};
        assert_int_equal(pthread_create(&th[i], NULL, storm_main, &s[i]), 0);
    }
    for (int i = 0; i < STORM_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(s[i].errors, 0);
    }
    assert_int_equal(counter, STORM_THREADS * STORM_ROUNDS);
    *out = stats(c);
    assert_int_equal(out->acquisitions, STORM_THREADS * STORM_ROUNDS);
    assert_int_equal(out->grants + out->handoffs, STORM_THREADS * STORM_ROUNDS);
    assert_int_equal(out->entries, 0);
    assert_int_equal(out->leases_held, 0);
    dlock_client_close(c);
}

static void test_pass_limit_respected(void **state)
{
    (void)state;
    dlock_stats s;
    run_storm(3, &s);
    printf("# pass_limit 3: %llu grants, %llu handoffs\n", (unsigned long long)s.grants,
           (unsigned long long)s.handoffs);
    assert_true(s.handoffs <= 3 * s.grants);
    assert_true(s.handoffs > 0); /* 8 threads on one name: someone waited */

    run_storm(0, &s);
    assert_int_equal(s.handoffs, 0);
    assert_int_equal(s.grants, STORM_THREADS * STORM_ROUNDS);
}

/* on_lost calls, and the log's lines that report a lease run out while it
 * was passed (on_log) */
static atomic_int lost_calls, ran_out_logged;

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    atomic_fetch_add(&lost_calls, 1);
}

static int lost_count(void) { return atomic_load(&lost_calls); }

static void test_lost_lease_not_passed(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 300;
    cfg.on_lost = on_lost;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "h2", -1, &f0), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "h2");
    let_it_wait();
    int lost0 = lost_count();
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL dlock:{h2}"));
    /* The renewal finds it gone within a period (100 ms); 10 s is generous
     * for a loaded machine. */
    for (int i = 0; i < 1000 && lost_count() == lost0; i++)
        fx_sleep_ms(10);
    assert_int_equal(lost_count(), lost0 + 1);
    assert_int_equal(dlock_held(c, "h2"), 0);

    dlock_stats s0 = stats(c);
    assert_int_equal(dlock_release(c, "h2"), DLOCK_ELOST);
    waiter_wait_got(&w);
    dlock_stats s1 = stats(c);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(s1.handoffs - s0.handoffs, 0); /* not passed */
    assert_int_equal(s1.grants - s0.grants, 1);     /* a new grant from Redis */
    assert_true(w.fence > f0);
    char *token = fx_grant_get(rc, "dlock:{h2}", "token");
    assert_non_null(token);
    assert_int_equal(strtoull(token, NULL, 10), w.fence);
    free(token);
    redisFree(rc);
    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

/* A lease that missed its renewals (Redis frozen) is not passed on when its
 * validity is close to running out. */
static void test_stale_lease_not_passed(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 900;
    cfg.command_timeout_ms = 300;
    cfg.on_lost = on_lost;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "h3", -1, NULL), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "h3");
    let_it_wait();
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    /* Renewals now fail; after 2/3 of the lease since the last renewal less
     * than a third is left. Wait one lease time (validity is at most one
     * lease from the last renewal, which was before SIGSTOP): then the lease
     * is lost or at least past the handoff margin. */
    fx_sleep_ms(900);
    dlock_stats s0 = stats(c);
    int rc = dlock_release(c, "h3");
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    /* Lost (found by the renewal thread) or not told to Redis: never OK by a
     * pass. */
    assert_true(rc == DLOCK_ELOST || rc == DLOCK_EREDIS);
    waiter_wait_got(&w);
    dlock_stats s1 = stats(c);
    assert_int_equal(s1.handoffs - s0.handoffs, 0);
    waiter_finish(&w);
    dlock_client_close(c);
}

/*
 * A direct handoff (I10: the head has led the local queue past the fairness
 * bound, so the release makes it the owner) happens while the lease is
 * valid, but the thread it is passed to may run much later. Here it runs
 * only after the lease was lost meanwhile: the test wraps the library's
 * parking (linked with --wrap=dlock_waiter_park, tests/CMakeLists.txt) so
 * that the granted thread, once woken, first waits for `hold_woken` to
 * run. Before the fix the thread returned DLOCK_OK holding a lost lease
 * (dlock_held 0 at once, its release DLOCK_ELOST).
 */
void __real_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
static void (*hold_woken)(void);      /* run once by the next granted thread, without mu */
static void (*hold_woken_open)(void); /* run once by the next thread woken, not granted */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;

void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);
void __wrap_dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns)
{
    __real_dlock_waiter_park(w, mu, deadline_ns);
    pthread_mutex_lock(&hold_mu);
    void (**hook)(void) = dlock_waiter_granted(w) ? &hold_woken : &hold_woken_open;
    void (*fn)(void) = *hook;
    *hook = NULL;
    pthread_mutex_unlock(&hold_mu);
    if (fn) {
        /* The caller looks at the entry again after a park, whatever woke
         * it: letting go of its mutex meanwhile is what a slow wake-up does. */
        pthread_mutex_unlock(mu);
        fn();
        pthread_mutex_lock(mu);
    }
}

static const char *hold_key;

/* The lease is deleted behind the client's back and the renewal finds it
 * gone (it marks the entry LOST). A period is 100 ms; 10 s is generous. */
static void lose_by_renewal(void)
{
    int lost0 = lost_count();
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL %s", hold_key));
    redisFree(rc);
    for (int i = 0; i < 1000 && lost_count() == lost0; i++)
        fx_sleep_ms(10);
}

/* Redis is frozen past the lease's validity (300 ms from the last renewal,
 * which came before the freeze): the lease runs out. The renewal's command
 * timeout (5 s) outlasts the freeze, so its round waits for Redis and no
 * verdict marks the lease lost: the woken thread finds it HELD but run out.
 * Redis stays frozen until the test has seen that thread count the lease
 * lost (thaw_after_ran_out), so that no renewal answered after a thaw can
 * decide first. Frozen for three lease times: the key has expired in Redis
 * too (its time to live is two lease times). */
static void lose_by_validity(void)
{
    fx_redis_signal(&fx_server, SIGSTOP);
    fx_sleep_ms(900);
}

static void thaw_after_ran_out(dlock_client *c, const dlock_stats *s0)
{
    /* 10 s: generous for a busy machine; the thread decides at once */
    for (int i = 0; i < 1000 && stats(c).leases_lost == s0->leases_lost; i++)
        fx_sleep_ms(10);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_int_equal(stats(c).leases_lost, s0->leases_lost + 1);
}

static void on_log(int level, const char *message, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(message, "ran out while it was passed"))
        atomic_fetch_add(&ran_out_logged, 1);
}

static int ran_out_count(void) { return atomic_load(&ran_out_logged); }

static void direct_handoff_lost(const char *name, const char *key, void (*lose)(void))
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 300;
    cfg.command_timeout_ms = lose == lose_by_validity ? 5000 : 200;
    cfg.on_lost = on_lost;
    cfg.on_log = on_log;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, name, -1, &f0), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, name);
    let_it_wait(); /* 200 ms: past the fairness bound, the release hands it directly */
    hold_key = key;
    pthread_mutex_lock(&hold_mu);
    hold_woken = lose;
    pthread_mutex_unlock(&hold_mu);
    dlock_stats s0 = stats(c);
    int lost0 = lost_count(), logged0 = ran_out_count();
    assert_int_equal(dlock_release(c, name), DLOCK_OK);
    if (lose == lose_by_validity)
        thaw_after_ran_out(c, &s0);
    waiter_wait_got(&w);
    dlock_stats s1 = stats(c);
    pthread_mutex_lock(&hold_mu);
    assert_null(hold_woken); /* the hook ran: the lease was passed directly */
    pthread_mutex_unlock(&hold_mu);
    assert_int_equal(s1.handoffs - s0.handoffs, 1);
    if (lose == lose_by_validity) {
        /* Run out in passing: no thread held it, so on_lost has nobody to
         * tell; the log says so, once. */
        assert_int_equal(lost_count(), lost0);
        assert_int_equal(ran_out_count(), logged0 + 1);
    } else {
        /* Found gone by the renewal: reported as any lost lease (on_lost,
         * which lose_by_renewal waited for), and not again by the log. */
        assert_int_equal(lost_count(), lost0 + 1);
        assert_int_equal(ran_out_count(), logged0);
    }
    /* Whatever the acquire returns, it never returns a lease it does not
     * hold: here it polled Redis again and got a new grant. */
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.held, 1);
    assert_int_equal(s1.grants - s0.grants, 1);
    assert_true(w.fence > f0 + 1);
    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

/*
 * The clock rule (release.c, handoff_in_time): the k-th local handoff of a
 * grant only once k us have passed since the client learned it, so that no
 * token is ahead of the server's clock. A handoff here takes microseconds,
 * so the rule never binds on its own; the test moves the moment the client
 * learned the grant 10 s ahead (white-box: the entry's grant_boot_ns), as
 * if it had just been granted on a much faster machine. The release must
 * then give the lease back to Redis rather than pass it on. (The client
 * records no trace, src/common/trace.h: its state is changed behind the
 * model's back.)
 */
static void test_handoff_waits_for_the_clock(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    dlock_client *c;
    char *trace = getenv("DLOCK_TRACE_DIR") ? strdup(getenv("DLOCK_TRACE_DIR")) : NULL;
    unsetenv("DLOCK_TRACE_DIR");
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    if (trace) {
        setenv("DLOCK_TRACE_DIR", trace, 1);
        free(trace);
    }
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "clk", -1, &f0), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "clk");
    let_it_wait();
    dlock_entry *e = dlock_table_find(c->table, "clk", 3);
    assert_non_null(e);
    pthread_mutex_lock(&e->mu);
    e->lease.grant_boot_ns = dlock_boot_ns() + 10000 * DLOCK_NS_PER_MS;
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    dlock_stats s0 = stats(c);
    assert_int_equal(dlock_release(c, "clk"), DLOCK_OK);
    waiter_wait_got(&w);
    dlock_stats s1 = stats(c);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(s1.handoffs - s0.handoffs, 0); /* not passed */
    assert_int_equal(s1.grants - s0.grants, 1);     /* granted anew by Redis */
    assert_true(w.fence > f0);
    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

static void test_direct_handoff_lost_by_renewal(void **state)
{
    (void)state;
    direct_handoff_lost("h4", "dlock:{h4}", lose_by_renewal);
}

static void test_direct_handoff_lost_by_validity(void **state)
{
    (void)state;
    direct_handoff_lost("h5", "dlock:{h5}", lose_by_validity);
}

/* The same for an open handoff (I10: the head has not led the local queue
 * for the fairness bound, so the release leaves the lease to whichever
 * thread runs first and wakes the head): the head runs only after the
 * lease's validity ran out (lose_by_validity): it finds the lease HELD but
 * past its validity, and must not take it (take_handoff). */
static void test_open_handoff_past_validity(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 300;
    cfg.command_timeout_ms = 5000;
    cfg.on_lost = on_lost;
    cfg.on_log = on_log;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    uint64_t f0;
    assert_int_equal(dlock_acquire(c, "h6", -1, &f0), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "h6");
    let_it_wait();
    /* The head is new to the queue (white-box: it became the head "in 10
     * s"), so the release opens the handoff instead of handing it directly. */
    dlock_entry *e = dlock_table_find(c->table, "h6", 2);
    assert_non_null(e);
    pthread_mutex_lock(&e->mu);
    e->wq.head_since_ns = dlock_now_ns() + 10000 * DLOCK_NS_PER_MS;
    pthread_mutex_unlock(&e->mu);
    dlock_table_put(c->table, e);
    pthread_mutex_lock(&hold_mu);
    hold_woken_open = lose_by_validity;
    pthread_mutex_unlock(&hold_mu);
    dlock_stats s0 = stats(c);
    int lost0 = lost_count(), logged0 = ran_out_count();
    assert_int_equal(dlock_release(c, "h6"), DLOCK_OK);
    thaw_after_ran_out(c, &s0);
    waiter_wait_got(&w);
    assert_int_equal(lost_count(), lost0);
    assert_int_equal(ran_out_count(), logged0 + 1);
    dlock_stats s1 = stats(c);
    pthread_mutex_lock(&hold_mu);
    assert_null(hold_woken_open); /* the hook ran */
    pthread_mutex_unlock(&hold_mu);
    assert_int_equal(s1.handoffs - s0.handoffs, 1); /* it was passed (opened) */
    assert_int_equal(w.rc, DLOCK_OK);
    assert_int_equal(w.held, 1);                /* but not taken: polled anew */
    assert_int_equal(s1.grants - s0.grants, 1);
    assert_true(w.fence > f0 + 1);
    waiter_finish(&w);
    assert_int_equal(w.release_rc, DLOCK_OK);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handoff_costs_no_redis_command),
        cmocka_unit_test(test_longest_waiter_not_passed_over),
        cmocka_unit_test(test_pass_limit_respected),
        cmocka_unit_test(test_lost_lease_not_passed),
        cmocka_unit_test(test_stale_lease_not_passed),
        cmocka_unit_test(test_handoff_waits_for_the_clock),
        cmocka_unit_test(test_direct_handoff_lost_by_renewal),
        cmocka_unit_test(test_direct_handoff_lost_by_validity),
        cmocka_unit_test(test_open_handoff_past_validity),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
