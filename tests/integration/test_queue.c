/*
 * The wait queue and targeted wake-ups, against a real redis-server: a
 * release grants the lease directly to the first live waiting client only,
 * in arrival order, which takes it without another call; a grant to a dead
 * waiter lasts its waiter ttl only; a grant racing the waiter's own retry,
 * or its giving up, is resolved without a lost or doubled lease; a
 * client holds one subscription whatever it waits for; a waiter that gives
 * up leaves the queue; a dead waiter is skipped within its ttl; a try never
 * queues; a dropped subscriber connection is recovered.
 *
 * Clients in one process stand for processes: each has its own id, queue
 * entry, subscription and connections. Timing bounds are generous (say why
 * where used); the one that tells a wake-up from the fallback retry compares
 * against a fallback interval made long on purpose (waiter_ttl_ms 8000, so a
 * poller without a wake-up retries after 1.5 to 2 s).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"
#include "proxy.h"


static void settle_subscriber(dlock_client *c);

static dlock_client *open_client_only(uint32_t waiter_ttl_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.waiter_ttl_ms = waiter_ttl_ms;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* A client whose subscriber has read its first confirmation (and woken its
 * pollers, which tests that count commands or messages must not see). */
static dlock_client *open_client(uint32_t waiter_ttl_ms)
{
    dlock_client *c = open_client_only(waiter_ttl_ms);
    settle_subscriber(c);
    return c;
}

static long long rcmd_int(const char *fmt, const char *arg)
{
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    redisReply *r = redisCommand(rc, fmt, arg);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    redisFree(rc);
    return v;
}

/* What Redis holds of name's grant and records, read in the layout of
 * whichever protocol the clients write (fixture.h): so each assertion
 * means the same under DLOCK_TEST_PROTOCOL=1 and 2. */

/* Field what ("owner" or "token") of name's grant, malloc'd, or NULL when
 * there is none (released, or no data). */
static char *grant_field(const char *name, const char *what)
{
    char key[64];
    snprintf(key, sizeof key, "dlock:{%s}", name);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    char *v = fx_grant_get(rc, key, what);
    redisFree(rc);
    return v;
}

/* 1 if name has no grant in Redis: released (or never granted), not one
 * still running or left to run out. */
static int grant_released(const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "dlock:{%s}", name);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    char *token = fx_grant_get(rc, key, "token");
    long long left = fx_lease_ms(rc, key);
    redisFree(rc);
    int none = token == NULL;
    free(token);
    return none && left == -2;
}

/* 1 if name has a turn that has not run out. */
static int turn_live(const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "dlock:{%s}", name);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    int live = fx_turn_live(rc, key);
    redisFree(rc);
    return live;
}

/* Redis's record of client id for name, malloc'd ("<newest attempt> ..."),
 * or NULL when none or run out. */
static char *record_of(const char *name, const char *id)
{
    char key[64];
    snprintf(key, sizeof key, "dlock:{%s}", name);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    char *v = fx_record_get(rc, key, id);
    redisFree(rc);
    return v;
}

/* Subscriptions to this process's wake channels (pattern "dlock:wake:*"). */
static long long wake_channels(void)
{
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    redisReply *r = redisCommand(rc, "PUBSUB CHANNELS dlock:wake:*");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    long long n = (long long)r->elements;
    freeReplyObject(r);
    redisFree(rc);
    return n;
}

/* Waits until `n` wake channels have a subscriber: the subscriber threads
 * subscribe in the background after dlock_client_open. 10 s is generous. */
static void wait_subscribed(long long n)
{
    for (int i = 0; i < 1000 && wake_channels() < n; i++)
        fx_sleep_ms(10);
    assert_int_equal(wake_channels(), n);
}

typedef struct waiter {
    dlock_client *c;
    char name[32];
    int64_t wait_ms;
    int rc;
    long long got_ns;
    uint64_t fence;
    pthread_t th;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, w->name, w->wait_ms, &w->fence);
    if (w->rc != DLOCK_OK)
        fprintf(stderr, "# %s: %s: %s\n", w->name, dlock_err_name(w->rc), dlock_last_error());
    w->got_ns = fx_now_ns();
    if (w->rc == DLOCK_OK)
        dlock_release(w->c, w->name);
    return NULL;
}

static void waiter_start(waiter *w, dlock_client *c, const char *name, int64_t wait_ms)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->wait_ms = wait_ms;
    assert_int_equal(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

/* Waits until the queue of `name` holds n clients (bounded: 10 s). */
static void wait_queued(const char *name, long long n)
{
    char key[64];
    snprintf(key, sizeof key, "dlock:{%s}:q", name);
    for (int i = 0; i < 1000 && rcmd_int("ZCARD %s", key) != n; i++)
        fx_sleep_ms(10);
    assert_int_equal(rcmd_int("ZCARD %s", key), n);
}

/* The subscriber wakes every poller of its client once, when it reads its
 * first confirmation (client.c, wake_all), which can come after the server
 * counted the subscription (wait_subscribed): under load that wake-up made
 * a waiter try once more than the tests that count commands allow. So c
 * first waits through a crossing with a client of its own: it gets the
 * name by the release's message (read after the confirmation, on that
 * connection) or by a try after a wake-up (that one or the message's). */
static void settle_subscriber(dlock_client *c)
{
    static int n;
    char name[32];
    snprintf(name, sizeof name, "settle%d", n++);
    dlock_client *h = open_client_only(8000);
    assert_int_equal(dlock_acquire(h, name, 0, NULL), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, name, 30000);
    wait_queued(name, 1);
    assert_int_equal(dlock_release(h, name), DLOCK_OK);
    pthread_join(w.th, NULL);
    assert_int_equal(w.rc, DLOCK_OK);
    dlock_client_close(h);
}

/* A holds; B, C, D queue in that order. Each release wakes exactly the next
 * client, within far less than a fallback interval, with one PUBLISH. */
static void test_release_wakes_next_in_order(void **state)
{
    (void)state;
    dlock_client *a = open_client(8000), *b = open_client(8000), *c = open_client(8000),
                 *d = open_client(8000);
    wait_subscribed(4);
    assert_int_equal(dlock_acquire(a, "q1", 0, NULL), DLOCK_OK);
    waiter wb, wc, wd;
    waiter_start(&wb, b, "q1", 30000);
    wait_queued("q1", 1);
    waiter_start(&wc, c, "q1", 30000);
    wait_queued("q1", 2);
    waiter_start(&wd, d, "q1", 30000);
    wait_queued("q1", 3);

    long long pub0 = fx_info_calls("127.0.0.1", fx_server.port, "publish");
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_release(a, "q1"), DLOCK_OK);
    pthread_join(wb.th, NULL);
    pthread_join(wc.th, NULL);
    pthread_join(wd.th, NULL);
    assert_int_equal(wb.rc, DLOCK_OK);
    assert_int_equal(wc.rc, DLOCK_OK);
    assert_int_equal(wd.rc, DLOCK_OK);
    /* Arrival order, and tokens growing with it. */
    assert_true(wb.got_ns < wc.got_ns && wc.got_ns < wd.got_ns);
    assert_true(wb.fence < wc.fence && wc.fence < wd.fence);
    /* a's, b's and c's releases each woke the next client: three PUBLISH;
     * d's found nobody waiting. */
    assert_int_equal(fx_info_calls("127.0.0.1", fx_server.port, "publish") - pub0, 3);
    /* Woken, not polled: the chain of three grants took less than one
     * fallback interval (1.5 s at the least here). */
    long long chain_ms = (wd.got_ns - t0) / 1000000;
    printf("# three cross-client handoffs in %lld ms\n", chain_ms);
    assert_true(chain_ms < 1500);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q1}:q"), 0);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
    dlock_client_close(d);
}

/* One subscription per client, however many names it waits for. */
static void test_one_subscription_per_client(void **state)
{
    (void)state;
    enum { N = 40 };
    dlock_client *a = open_client(2000), *b = open_client(2000);
    wait_subscribed(2);
    waiter w[N];
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_int_equal(dlock_acquire(a, name, 0, NULL), DLOCK_OK);
        waiter_start(&w[i], b, name, 30000);
    }
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "m%d", i);
        wait_queued(name, 1);
    }
    assert_int_equal(wake_channels(), 2); /* still one channel per client */
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_int_equal(dlock_release(a, name), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(w[i].th, NULL);
        assert_int_equal(w[i].rc, DLOCK_OK);
    }
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A waiter that gives up leaves the queue; a try never joins it. */
static void test_timeout_leaves_queue_try_never_joins(void **state)
{
    (void)state;
    dlock_client *a = open_client(2000), *b = open_client(2000);
    assert_int_equal(dlock_acquire(a, "q2", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(b, "q2", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q2}:q"), 0);
    assert_int_equal(dlock_acquire(b, "q2", 300, NULL), DLOCK_ETIMEDOUT);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q2}:q"), 0);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q2}:qd"), 0);
    assert_int_equal(dlock_release(a, "q2"), DLOCK_OK);
    assert_int_equal(turn_live("q2"), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A dead waiter for tests: a fake queue entry that never retries, placed
 * first in the queue of `name` (held by g->a) with a deadline ttl from now
 * (server ms); with_grant adds the fields a live client writes for a direct
 * grant (attempt, pass limit, waiter ttl), else it has the deadline only.
 * g->b then waits behind it and g->a releases; the caller checks what it
 * wants, then ghost_finish. */
typedef struct ghost_run {
    dlock_client *a, *b;
    waiter wb;
    long long t0;
} ghost_run;

static void ghost_start(ghost_run *g, const char *name, long long ttl, int with_grant)
{
    g->a = open_client((uint32_t)ttl);
    g->b = open_client((uint32_t)ttl);
    wait_subscribed(2);
    assert_int_equal(dlock_acquire(g->a, name, 0, NULL), DLOCK_OK);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    redisReply *t = redisCommand(rc, "TIME");
    long long now_ms = atoll(t->element[0]->str) * 1000 + atoll(t->element[1]->str) / 1000;
    freeReplyObject(t);
    char live[64];
    if (with_grant)
        snprintf(live, sizeof live, "%lld 5 16 %lld", now_ms + ttl, ttl);
    else
        snprintf(live, sizeof live, "%lld", now_ms + ttl);
    freeReplyObject(redisCommand(rc, "ZADD dlock:{%s}:q 1 ghost", name));
    freeReplyObject(redisCommand(rc, "HSET dlock:{%s}:qd ghost %s", name, live));
    redisFree(rc);
    g->t0 = fx_now_ns();
    waiter_start(&g->wb, g->b, name, 20000);
    wait_queued(name, 2);
    assert_int_equal(dlock_release(g->a, name), DLOCK_OK);
}

/* Joins b's wait, which must succeed: not before the ghost's deadline (its
 * turn or grant was respected) and within the ttl plus a fallback interval
 * and generous slack. Closes the clients. */
static void ghost_finish(ghost_run *g, long long ttl, const char *what)
{
    pthread_join(g->wb.th, NULL);
    assert_int_equal(g->wb.rc, DLOCK_OK);
    long long waited_ms = (g->wb.got_ns - g->t0) / 1000000;
    printf("# waiter behind a dead one (%s) got the lock after %lld ms (ttl %lld)\n", what,
           waited_ms, ttl);
    assert_true(waited_ms >= ttl - 50);
    assert_true(waited_ms < 10000);
    dlock_client_close(g->a);
    dlock_client_close(g->b);
}

/* A waiter that stops heartbeating, with a liveness value of a deadline
 * only, gets the turn from the release; once its deadline passes it is
 * skipped and the next waiter gets the lock. */
static void test_dead_waiter_skipped(void **state)
{
    (void)state;
    ghost_run g;
    ghost_start(&g, "q3", 600, 0);
    ghost_finish(&g, 600, "its turn");
}

/* The subscriber connection is killed by the server: it comes back, and a
 * release after that wakes the waiter well within a fallback interval. */
static void test_subscriber_recovers(void **state)
{
    (void)state;
    dlock_client *a = open_client(8000), *b = open_client(8000);
    wait_subscribed(2);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "CLIENT KILL TYPE pubsub"));
    redisFree(rc);
    wait_subscribed(2); /* both resubscribed */

    assert_int_equal(dlock_acquire(a, "q4", 0, NULL), DLOCK_OK);
    waiter wb;
    waiter_start(&wb, b, "q4", 20000);
    wait_queued("q4", 1);
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_release(a, "q4"), DLOCK_OK);
    pthread_join(wb.th, NULL);
    assert_int_equal(wb.rc, DLOCK_OK);
    long long ms = (wb.got_ns - t0) / 1000000;
    printf("# woken after the subscriber reconnected: %lld ms\n", ms);
    assert_true(ms < 1500); /* a fallback retry would take 1.5 s at least */
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A lost wake-up costs at most one fallback interval: the subscriber is
 * killed while the waiter waits, and the release's message goes nowhere. */
static void test_lost_wakeup_costs_one_fallback(void **state)
{
    (void)state;
    dlock_client *a = open_client(800), *b = open_client(800);
    wait_subscribed(2);
    assert_int_equal(dlock_acquire(a, "q5", 0, NULL), DLOCK_OK);
    waiter wb;
    waiter_start(&wb, b, "q5", 20000);
    wait_queued("q5", 1);
    /* Unsubscribe everyone behind the library's back by killing the pubsub
     * connections, then release at once: the PUBLISH may find nobody. */
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "CLIENT KILL TYPE pubsub"));
    redisFree(rc);
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_release(a, "q5"), DLOCK_OK);
    pthread_join(wb.th, NULL);
    assert_int_equal(wb.rc, DLOCK_OK);
    long long ms = (wb.got_ns - t0) / 1000000;
    printf("# after a possibly lost wake-up: %lld ms (fallback 200 ms)\n", ms);
    assert_true(ms < 5000); /* one fallback (200 ms) plus generous slack */
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A timed wait that runs out costs one try (which queues) and one leave:
 * no try after the deadline. With waiter_ttl 8 s the fallback retry (1.5 to
 * 2 s) never comes within the 300 ms wait. */
static void test_timed_wait_round_trips(void **state)
{
    (void)state;
    dlock_client *a = open_client(8000), *b = open_client(8000);
    wait_subscribed(2); /* a first subscription wakes pollers: not in the count */
    assert_int_equal(dlock_acquire(a, "q6", 0, NULL), DLOCK_OK);
    dlock_stats s0, s1;
    dlock_client_stats(b, &s0);
    assert_int_equal(dlock_acquire(b, "q6", 300, NULL), DLOCK_ETIMEDOUT);
    dlock_client_stats(b, &s1);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 2);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q6}:q"), 0);
    assert_int_equal(dlock_release(a, "q6"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Several threads of one client give up at different times, one of them
 * with a try in between: when the last one is gone the client is no longer
 * queued, whichever thread was the poller. */
static void test_last_waiter_leaves(void **state)
{
    (void)state;
    dlock_client *a = open_client(8000), *b = open_client(8000);
    assert_int_equal(dlock_acquire(a, "q7", 0, NULL), DLOCK_OK);
    waiter w1, w2, w3;
    waiter_start(&w1, b, "q7", 200);
    waiter_start(&w2, b, "q7", 400);
    fx_sleep_ms(100);
    waiter_start(&w3, b, "q7", 0); /* a try */
    pthread_join(w1.th, NULL);
    pthread_join(w2.th, NULL);
    pthread_join(w3.th, NULL);
    assert_int_equal(w1.rc, DLOCK_ETIMEDOUT);
    assert_int_equal(w2.rc, DLOCK_ETIMEDOUT);
    assert_int_equal(w3.rc, DLOCK_EBUSY);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q7}:q"), 0);
    assert_int_equal(rcmd_int("EXISTS %s", "dlock:{q7}:qd"), 0);
    assert_int_equal(dlock_release(a, "q7"), DLOCK_OK);
    assert_int_equal(turn_live("q7"), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A crossing between clients costs the waiter's refused try and the
 * holder's release: the release grants the lease to the waiter, which takes
 * it from the message, with no acquire call after it (waiter_ttl 8 s: no
 * fallback retry within the test). */
static void test_direct_grant_no_acquire_after_release(void **state)
{
    (void)state;
    dlock_client *a = open_client(8000), *b = open_client(8000);
    wait_subscribed(2);
    uint64_t fa;
    assert_int_equal(dlock_acquire(a, "dg1", 0, &fa), DLOCK_OK);
    dlock_stats s0, s1;
    dlock_client_stats(b, &s0);
    waiter wb;
    waiter_start(&wb, b, "dg1", 30000);
    wait_queued("dg1", 1);
    long long calls0 = fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                       fx_info_calls("127.0.0.1", fx_server.port, "eval");
    assert_int_equal(dlock_release(a, "dg1"), DLOCK_OK);
    pthread_join(wb.th, NULL);
    assert_int_equal(wb.rc, DLOCK_OK);
    assert_true(wb.fence > fa);
    /* a's release and b's own release, nothing else: no acquire by b */
    assert_int_equal(fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                         fx_info_calls("127.0.0.1", fx_server.port, "eval") - calls0,
                     2);
    dlock_client_stats(b, &s1);
    assert_int_equal(s1.direct_grants - s0.direct_grants, 1);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 2); /* its try and its release */
    assert_int_equal(s1.leases_lost, 0);
    assert_true(grant_released("dg1"));
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A ghost with the fields of a live client is granted the lease by the
 * release, for its own waiter ttl only: the next waiter gets it once that
 * has passed. */
static void test_direct_grant_to_dead_waiter_lasts_its_ttl(void **state)
{
    (void)state;
    ghost_run g;
    ghost_start(&g, "dg2", 600, 1);
    char *owner = grant_field("dg2", "owner");
    assert_non_null(owner);
    assert_string_equal(owner, "ghost");
    free(owner);
    long long left = fx_server_lease_ms("dlock:{dg2}");
    assert_true(left > 0 && left <= 600);
    ghost_finish(&g, 600, "its grant");
}

/* Three clients: a and c direct, b through a fresh fault proxy with its own
 * lease_ms (0: the default) and waiter_ttl_ms; all subscribed. */
typedef struct trio {
    fx_proxy *px;
    dlock_client *a, *b, *c;
} trio;

static void trio_open(trio *t, uint32_t b_lease_ms, uint32_t b_waiter_ttl_ms)
{
    t->px = fx_proxy_start(fx_server.port);
    assert_non_null(t->px);
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.redis_port = fx_proxy_port(t->px);
    if (b_lease_ms)
        cfg.lease_ms = b_lease_ms;
    cfg.waiter_ttl_ms = b_waiter_ttl_ms;
    t->a = open_client(8000);
    t->c = open_client(8000);
    assert_int_equal(dlock_client_open(&cfg, &t->b), DLOCK_OK);
    settle_subscriber(t->b);
    wait_subscribed(3);
}

static void trio_close(trio *t)
{
    dlock_client_close(t->a);
    dlock_client_close(t->b);
    dlock_client_close(t->c);
    fx_proxy_stop(t->px);
}

/* The grant races the waiter's own retry: b's retry is held back by a
 * proxy while a's release grants b the lease under b's previous try. The
 * retry then finds the lease b's own and gets it again with a new token:
 * b must hold that grant (the token Redis has), not the one of the message,
 * and release it cleanly. */
static void test_direct_grant_racing_a_retry(void **state)
{
    (void)state;
    trio t;
    trio_open(&t, 0, 400); /* b retries every 75 to 100 ms */
    dlock_client *a = t.a, *b = t.b; /* c unused here */
    fx_proxy *px = t.px;
    assert_int_equal(dlock_acquire(a, "dg3", 0, NULL), DLOCK_OK);
    waiter wb;
    waiter_start(&wb, b, "dg3", 20000);
    wait_queued("dg3", 1);
    fx_proxy_hold_next(px, "{dg3}");
    assert_int_equal(fx_proxy_wait_held(px, 10000), 0); /* b's retry, held */
    dlock_stats s0, s1;
    dlock_client_stats(b, &s0);
    assert_int_equal(dlock_release(a, "dg3"), DLOCK_OK); /* grants b: a message */
    fx_sleep_ms(200); /* the message reaches b while its retry is held */
    fx_proxy_release_held(px);
    pthread_join(wb.th, NULL);
    assert_int_equal(wb.rc, DLOCK_OK); /* and it released cleanly: waiter_main */
    dlock_client_stats(b, &s1);
    assert_int_equal(s1.direct_grants - s0.direct_grants, 0); /* the retry's grant won */
    assert_int_equal(s1.leases_lost, 0);
    assert_true(grant_released("dg3")); /* released, not left */
    trio_close(&t);
}

/* The grant races the waiter giving up: b's leave is held back while a's
 * release grants b the lease; the leave then gives the lease back, so the
 * name is free at once (not blocked for b's waiter ttl). */
static void test_direct_grant_racing_a_leave(void **state)
{
    (void)state;
    trio t;
    trio_open(&t, 0, 8000); /* no retry within b's 500 ms wait */
    dlock_client *a = t.a, *b = t.b, *c = t.c;
    fx_proxy *px = t.px;
    assert_int_equal(dlock_acquire(a, "dg4", 0, NULL), DLOCK_OK);
    waiter wb;
    waiter_start(&wb, b, "dg4", 500);
    wait_queued("dg4", 1);
    fx_proxy_hold_next(px, "{dg4}");
    assert_int_equal(fx_proxy_wait_held(px, 10000), 0); /* b's leave, held */
    assert_int_equal(dlock_release(a, "dg4"), DLOCK_OK); /* grants b */
    char *owner = grant_field("dg4", "owner");
    assert_non_null(owner); /* b's, provisionally */
    free(owner);
    fx_proxy_release_held(px);
    pthread_join(wb.th, NULL);
    assert_int_equal(wb.rc, DLOCK_ETIMEDOUT);
    assert_true(grant_released("dg4")); /* given back */
    assert_int_equal(dlock_acquire(c, "dg4", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "dg4"), DLOCK_OK);
    trio_close(&t);
}



typedef struct keeper {
    dlock_client *c;
    char name[32];
    int64_t wait_ms;
    int rc;
    int got, check, checked, held, stop; /* atomics (__atomic builtins) */
    pthread_t th;
} keeper;

/* Acquires, then holds until told to stop, reporting dlock_held when told
 * to check. */
static void *keeper_main(void *arg)
{
    keeper *k = arg;
    k->rc = dlock_acquire(k->c, k->name, k->wait_ms, NULL);
    __atomic_store_n(&k->got, 1, __ATOMIC_SEQ_CST);
    if (k->rc != DLOCK_OK)
        return NULL;
    while (!__atomic_load_n(&k->check, __ATOMIC_SEQ_CST))
        fx_sleep_ms(1);
    __atomic_store_n(&k->held, dlock_held(k->c, k->name), __ATOMIC_SEQ_CST);
    __atomic_store_n(&k->checked, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&k->stop, __ATOMIC_SEQ_CST))
        fx_sleep_ms(5);
    dlock_release(k->c, k->name);
    return NULL;
}

static void keeper_start(keeper *k, dlock_client *c, const char *name, int64_t wait_ms)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    snprintf(k->name, sizeof k->name, "%s", name);
    k->wait_ms = wait_ms;
    assert_int_equal(pthread_create(&k->th, NULL, keeper_main, k), 0);
}

static void wait_flag(int *flag)
{
    for (int i = 0; i < 10000 && !__atomic_load_n(flag, __ATOMIC_SEQ_CST); i++)
        fx_sleep_ms(1);
    assert_true(__atomic_load_n(flag, __ATOMIC_SEQ_CST));
}

/* With lease_ms shorter than waiter_ttl_ms, the holder of a renewed direct
 * grant counts its validity from the renewal by the shorter lease time,
 * while Redis keeps the grant at least the waiter ttl (a renewal never moves
 * its end back). b's network then stalls; once Redis has expired the lease
 * and c took it, b must no longer believe it holds it. (Found by review:
 * the validity counted the waiter ttl while a renewal cut Redis's expiry to
 * the lease time.) */
static void test_direct_grant_validity_follows_renewal(void **state)
{
    (void)state;
    trio t;
    trio_open(&t, 300, 3000);
    dlock_client *a = t.a, *b = t.b, *c = t.c;
    fx_proxy *px = t.px;
    assert_int_equal(dlock_acquire(a, "dg5", 0, NULL), DLOCK_OK);
    dlock_stats before;
    dlock_client_stats(b, &before); /* (its subscriber's settling was one) */
    keeper kb;
    keeper_start(&kb, b, "dg5", 20000);
    wait_queued("dg5", 1);
    assert_int_equal(dlock_release(a, "dg5"), DLOCK_OK);
    wait_flag(&kb.got);
    assert_int_equal(kb.rc, DLOCK_OK);
    dlock_stats s0, s1;
    dlock_client_stats(b, &s0);
    assert_int_equal(s0.direct_grants - before.direct_grants, 1);
    /* A round is counted once written to the proxy, before Redis has run
     * it (a slow sanitizer build showed the PTTL read below overtaking it).
     * Every round counted after s0 renews dg5 (registered before the
     * acquire returned); once a second one is counted, the first one's
     * replies were read, so Redis has run a renewal. Rounds come every
     * 100 ms; bounded at 10 s. */
    for (int i = 0; i < 1000; i++) {
        dlock_client_stats(b, &s1);
        if (s1.renew_rounds >= s0.renew_rounds + 2)
            break;
        fx_sleep_ms(10);
    }
    assert_true(s1.renew_rounds >= s0.renew_rounds + 2);
    long long left = fx_server_lease_ms("dlock:{dg5}");
    assert_true(left > 0 && left <= 3000);
    fx_proxy_stall(px, 1);
    for (int i = 0; i < 1000 && fx_server_lease_ms("dlock:{dg5}") != -2; i++)
        fx_sleep_ms(10); /* b's grant expires in Redis (3 s at most) */
    assert_int_equal(dlock_acquire(c, "dg5", 0, NULL), DLOCK_OK);
    __atomic_store_n(&kb.check, 1, __ATOMIC_SEQ_CST);
    wait_flag(&kb.checked);
    assert_int_equal(__atomic_load_n(&kb.held, __ATOMIC_SEQ_CST), 0);
    __atomic_store_n(&kb.stop, 1, __ATOMIC_SEQ_CST);
    fx_proxy_stall(px, 0);
    pthread_join(kb.th, NULL);
    assert_int_equal(dlock_release(c, "dg5"), DLOCK_OK);
    trio_close(&t);
}

/* A copy of a leave held in the network past the client's record lifetime
 * arrives while the client holds the lease under a newer attempt: it must
 * leave that lease alone. (Found by review: the leave gave up any lease the
 * client owned, and only the record, which expires, told it was late.) */
static void test_late_leave_spares_newer_grant(void **state)
{
    (void)state;
    trio t;
    trio_open(&t, 300, 1000); /* records kept 2 s */
    dlock_client *a = t.a, *b = t.b, *c = t.c;
    fx_proxy *px = t.px;
    assert_int_equal(dlock_acquire(a, "dg6", 0, NULL), DLOCK_OK);
    /* b's leave is the only call of b that carries the wake prefix. */
    fx_proxy_hold_next(px, "dlock:wake:");
    assert_int_equal(dlock_acquire(b, "dg6", 150, NULL), DLOCK_ETIMEDOUT);
    assert_int_equal(fx_proxy_wait_held(px, 10000), 0);
    wait_queued("dg6", 0); /* the renewal thread's retry of the leave ran */
    assert_int_equal(dlock_release(a, "dg6"), DLOCK_OK);
    keeper kb;
    keeper_start(&kb, b, "dg6", 5000);
    wait_flag(&kb.got);
    assert_int_equal(kb.rc, DLOCK_OK);
    char *owner = grant_field("dg6", "owner");
    assert_non_null(owner);
    char *rec = record_of("dg6", owner);
    assert_non_null(rec);
    for (int i = 0; i < 1000 && rec; i++) {
        free(rec);
        fx_sleep_ms(10); /* b's record expires; b keeps renewing */
        rec = record_of("dg6", owner);
    }
    assert_null(rec);
    fx_proxy_release_held(px);
    assert_int_equal(fx_proxy_wait_released(px, 10000), 0);
    fx_sleep_ms(100); /* the late leave runs */
    char *now_owner = grant_field("dg6", "owner");
    assert_non_null(now_owner);
    assert_string_equal(now_owner, owner);
    assert_int_equal(dlock_acquire(c, "dg6", 0, NULL), DLOCK_EBUSY);
    __atomic_store_n(&kb.check, 1, __ATOMIC_SEQ_CST);
    wait_flag(&kb.checked);
    assert_int_equal(__atomic_load_n(&kb.held, __ATOMIC_SEQ_CST), 1);
    __atomic_store_n(&kb.stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(kb.th, NULL);
    free(owner);
    free(now_owner);
    trio_close(&t);
}

/* A direct grant message (release.lua: "g <attempt> <token> <name>") is
 * taken only if it names the poller's last refused try (I11). Here B waits
 * behind A, retrying every 50 ms (waiter ttl 200 ms); the test then sends B
 * a message naming one of its earlier tries, as a late message from a
 * release that ran before B's newer tries would. B must drop it and go on
 * waiting: A still holds the lease in Redis. Taken, it would return
 * DLOCK_OK beside A. */
static void test_direct_grant_of_an_older_try_dropped(void **state)
{
    (void)state;
    dlock_client *a = open_client(200), *b = open_client(200);
    char channel[64];
    snprintf(channel, sizeof channel, "dlock:wake:%s", dlock_client_id(b));
    assert_int_equal(fx_wait_channel(&fx_server, channel), 0);
    assert_int_equal(dlock_acquire(a, "old", 0, NULL), DLOCK_OK);
    waiter wb;
    waiter_start(&wb, b, "old", 3000);
    wait_queued("old", 1);
    /* B's newest attempt, as Redis recorded it (its record: "<attempt> ..."),
     * then at least two tries more (a fallback retry every <= 50 ms). */
    char *rec = record_of("old", dlock_client_id(b));
    assert_non_null(rec);
    unsigned long long old_try = strtoull(rec, NULL, 10);
    free(rec);
    assert_true(old_try > 0);
    unsigned long long now_try = old_try;
    for (int i = 0; i < 1000 && now_try < old_try + 2; i++) {
        fx_sleep_ms(10);
        rec = record_of("old", dlock_client_id(b));
        now_try = rec ? strtoull(rec, NULL, 10) : 0;
        free(rec);
    }
    assert_true(now_try >= old_try + 2);
    char msg[64];
    snprintf(msg, sizeof msg, "g %llu 12345 old", old_try);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(rc);
    redisReply *r = redisCommand(rc, "PUBLISH dlock:wake:%s %s", dlock_client_id(b), msg);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(rc);
    /* B is still waiting half a second later (its wait lasts 3 s): it gets
     * the lock only once A releases it (its time read after the join). */
    fx_sleep_ms(500);
    long long released = fx_now_ns();
    assert_int_equal(dlock_release(a, "old"), DLOCK_OK);
    pthread_join(wb.th, NULL);
    assert_true(wb.got_ns >= released);
    assert_int_equal(wb.rc, DLOCK_OK);
    assert_true(wb.fence != 12345);
    dlock_client_close(a);
    dlock_client_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_wakes_next_in_order),
        cmocka_unit_test(test_one_subscription_per_client),
        cmocka_unit_test(test_timeout_leaves_queue_try_never_joins),
        cmocka_unit_test(test_dead_waiter_skipped),
        cmocka_unit_test(test_subscriber_recovers),
        cmocka_unit_test(test_lost_wakeup_costs_one_fallback),
        cmocka_unit_test(test_timed_wait_round_trips),
        cmocka_unit_test(test_last_waiter_leaves),
        cmocka_unit_test(test_direct_grant_no_acquire_after_release),
        cmocka_unit_test(test_direct_grant_to_dead_waiter_lasts_its_ttl),
        cmocka_unit_test(test_direct_grant_racing_a_retry),
        cmocka_unit_test(test_direct_grant_racing_a_leave),
        cmocka_unit_test(test_direct_grant_validity_follows_renewal),
        cmocka_unit_test(test_late_leave_spares_newer_grant),
        cmocka_unit_test(test_direct_grant_of_an_older_try_dropped),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
