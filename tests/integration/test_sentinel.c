/*
 * Sentinel mode and min_replicas against a real topology started here: a
 * master, one replica and three sentinels (redis-server --sentinel) on free
 * loopback ports. The client finds the master through the sentinels (a dead
 * sentinel first in the list is skipped), reports an unknown master name or
 * unreachable sentinels clearly, WAITs for replicas with min_replicas (a
 * grant no replica acknowledged is given back; a renewal no replica
 * acknowledged does not count), and follows a SENTINEL FAILOVER in the
 * middle of a thread storm: errors during the switch are DLOCK_EREDIS or
 * timeouts only, no two threads are ever inside one name's critical section,
 * tokens never go back, and the storm goes on on the new master.
 *
 * Timing bounds are generous on purpose (a loaded 2-core machine): they only
 * catch a hang. The time the storm stalls during the failover is printed,
 * not asserted.
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
#include "route/sentinel.h"

#define MASTER_NAME "tm"

static fx_sentinel_set T;     /* the topology (fixture.h); roles swap on failover */
static char sentinels[200];   /* "127.0.0.1:p,..." with a dead port first */

/* A loopback port where nothing listens (bound, read, closed). */
static int dead_port(void)
{
    fx_redis r;
    if (fx_redis_start(&r) != 0)
        return 1;
    int p = r.port;
    fx_redis_stop(&r);
    return p;
}

#define cmd_at fx_cmd_at
#define is_master fx_is_master

/* 1 if the server at port answers ROLE as a replica; 0 if it answers
 * otherwise or not at all. */
static int is_replica(int port)
{
    redisReply *r = cmd_at(port, "ROLE");
    int s = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "slave") == 0;
    if (r)
        freeReplyObject(r);
    return s;
}

static int wait_topology(int master, int replica)
{
    return fx_sentinel_wait(&T, master, replica);
}

static int master_port(void)
{
    return fx_sentinel_master_port(&T);
}

static int replica_port(void)
{
    return fx_sentinel_replica_port(&T);
}

/* The server (of T) listening on port. */
static fx_redis *server_at(int port)
{
    return T.srv[0].port == port ? &T.srv[0] : &T.srv[1];
}

static int setup(void **state)
{
    (void)state;
    if (fx_sentinel_start(&T, MASTER_NAME) != 0)
        return -1;
    snprintf(sentinels, sizeof sentinels, "127.0.0.1:%d,%s", dead_port(), T.addrs);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    fx_sentinel_stop(&T);
    return 0;
}

static void sentinel_config(dlock_config *cfg, const char *prefix, uint32_t min_replicas)
{
    dlock_config_init(cfg);
    cfg->redis_host = NULL;
    cfg->sentinels = sentinels;
    cfg->sentinel_master = MASTER_NAME;
    cfg->key_prefix = prefix;
    cfg->min_replicas = min_replicas;
    cfg->connect_timeout_ms = 500;
    cfg->command_timeout_ms = 1000;
}

static long long key_exists(int port, const char *key)
{
    redisReply *r = cmd_at(port, "EXISTS %s", key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}

/* The time left of the grant of key on the server at port, in either
 * protocol's layout (fx_lease_ms): -2 when none. */
static long long master_lease_ms(int port, const char *key)
{
    redisContext *k = fx_connect("127.0.0.1", port);
    long long v = k ? fx_lease_ms(k, key) : -3;
    if (k)
        redisFree(k);
    return v;
}

/* The master is found through the sentinels, past a dead one; bad names and
 * dead sentinels are clear errors. */
static void test_resolves_master(void **state)
{
    (void)state;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:a:", 0);
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "x", 0, NULL), DLOCK_OK);
    assert_int_equal(key_exists(master_port(), "ts:a:{x}"), 1);
    assert_int_equal(dlock_release(c, "x"), DLOCK_OK);
    dlock_client_close(c);

    cfg.sentinel_master = "nope";
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "x", 0, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "No such master"));
    dlock_client_close(c);

    char dead[64];
    snprintf(dead, sizeof dead, "127.0.0.1:%d", dead_port());
    cfg.sentinel_master = MASTER_NAME;
    cfg.sentinels = dead;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "x", 0, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "no sentinel gave the address"));
    dlock_client_close(c);
}

/* The shared mode through the sentinels, with min_replicas: shared grants
 * and their renewals are confirmed by WAIT like exclusive ones; readers of
 * two clients at once, a writer after them. */
static void test_shared_through_sentinels(void **state)
{
    (void)state;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:s:", 1);
    cfg.lease_ms = 1500;
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    uint64_t fa, fb, fw;
    assert_int_equal(dlock_acquire_shared(a, "r", 0, &fa), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(b, "r", 0, &fb), DLOCK_OK);
    assert_int_equal(key_exists(master_port(), "ts:s:{r}"), 1);
    assert_int_equal(dlock_acquire(b, "w", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(b, "w"), DLOCK_OK);
    fx_sleep_ms(2500); /* held past the lease time only if renewed */
    assert_int_equal(dlock_held(a, "r"), 1);
    assert_int_equal(dlock_release_shared(a, "r"), DLOCK_OK);
    assert_int_equal(dlock_release_shared(b, "r"), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "r", 0, &fw), DLOCK_OK);
    assert_true(fw > fa && fw > fb);
    assert_int_equal(dlock_release(a, "r"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* Semaphores through the sentinels, with min_replicas: permits on the
 * master, renewed past the lease time; a grant fewer replicas
 * acknowledged is given back (with the attempt's number: nothing stays
 * counted). */
static void test_sem_through_sentinels(void **state)
{
    (void)state;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:p:", 1);
    cfg.lease_ms = 1500;
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "p", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(b, "p", 2, 0), DLOCK_OK);
    assert_int_equal(key_exists(master_port(), "ts:p:{p}"), 1);
    fx_sleep_ms(2500); /* held past the lease time only if renewed */
    assert_int_equal(dlock_sem_acquire(a, "p", 2, 0), DLOCK_EBUSY);
    assert_int_equal(dlock_sem_release(a, "p"), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "p", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "p"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "p"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);

    /* two replicas asked, one exists: the grant is given back */
    dlock_client *c;
    sentinel_config(&cfg, "ts:p:", 2);
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(c, "q", 1, 0), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "reached 1 of the 2 replicas"));
    dlock_client_close(c);
    sentinel_config(&cfg, "ts:p:", 1);
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    /* given back in the background (or at close): free within 10 s (generous) */
    int rc = DLOCK_EBUSY;
    for (int i = 0; i < 100 && (rc = dlock_sem_acquire(c, "q", 1, 0)) == DLOCK_EBUSY; i++)
        fx_sleep_ms(100);
    assert_int_equal(rc, DLOCK_OK);
    assert_int_equal(dlock_sem_release(c, "q"), DLOCK_OK);
    dlock_client_close(c);
}

/* min_replicas: WAIT after each batch; a grant fewer replicas acknowledged
 * is given back; a renewal no replica acknowledged does not count. */
static void test_min_replicas(void **state)
{
    (void)state;
    int mp = master_port(), rp = replica_port();
    dlock_config cfg;
    sentinel_config(&cfg, "ts:m:", 1);
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    long long w0 = fx_info_calls("127.0.0.1", mp, "wait");
    assert_int_equal(dlock_acquire(c, "x", 0, NULL), DLOCK_OK);
    assert_true(fx_info_calls("127.0.0.1", mp, "wait") > w0);
    assert_int_equal(key_exists(rp, "ts:m:{x}"), 1); /* on the replica already */
    assert_int_equal(dlock_release(c, "x"), DLOCK_OK);
    dlock_client_close(c);

    /* two replicas asked, one exists: the grant is given back */
    sentinel_config(&cfg, "ts:m:", 2);
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "y", 0, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "reached 1 of the 2 replicas"));
    assert_int_equal(dlock_held(c, "y"), 0);
    /* given back in the background: gone within 10 s (generous) */
    for (int i = 0; i < 1000 && master_lease_ms(mp, "ts:m:{y}") != -2; i++)
        fx_sleep_ms(10);
    assert_int_equal(master_lease_ms(mp, "ts:m:{y}"), -2);
    dlock_client_close(c);

    /* a held lease whose renewals no replica acknowledges (the replica
     * stopped): its validity runs out, though the master still has it */
    sentinel_config(&cfg, "ts:m:", 1);
    cfg.lease_ms = 600;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "z", 0, NULL), DLOCK_OK);
    fx_redis *replica = server_at(rp);
    assert_int_equal(fx_redis_signal(replica, SIGSTOP), 0);
    int held = 1;
    for (int i = 0; i < 500 && held; i++) { /* 5 s: the lease is 0.6 s */
        fx_sleep_ms(10);
        held = dlock_held(c, "z");
    }
    long long still = key_exists(mp, "ts:m:{z}");
    /* the renewal thread reports it lost at its next round (within 5 s),
     * while the replica still cannot acknowledge anything */
    dlock_stats st = {0};
    for (int i = 0; i < 500 && st.leases_lost == 0; i++) {
        assert_int_equal(dlock_client_stats(c, &st), DLOCK_OK);
        fx_sleep_ms(10);
    }
    assert_int_equal(fx_redis_signal(replica, SIGCONT), 0);
    assert_int_equal(held, 0);
    assert_int_equal(still, 1);
    assert_int_equal(st.leases_lost, 1);
    assert_int_equal(dlock_release(c, "z"), DLOCK_ELOST);
    dlock_client_close(c);
    assert_int_equal(wait_topology(mp, rp), 0);
}


/* With min_replicas, a renewal round that fails part-way (its last chunk
 * held back by the proxy) extends no lease, not even those of the chunks
 * that answered before: no WAIT confirmed them. The replica is stopped
 * from t0, so its copies expire by t0 + lease; at t0 + lease + 10% the
 * client must hold none of them (4000 leases: 20 chunks of 200). */
static void test_min_replicas_partial_round(void **state)
{
    (void)state;
    enum { N = 4000 };
    int mp = master_port(), rp = replica_port();
    fx_redis *replica = server_at(rp);
    fx_proxy *p = fx_proxy_start(mp);
    assert_non_null(p);
    dlock_config cfg;
    dlock_config_init(&cfg);
    cfg.redis_port = fx_proxy_port(p);
    cfg.min_replicas = 1;
    cfg.lease_ms = 3000;
    cfg.key_prefix = "ts:p:";
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    char name[16];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "k%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
    }
    fx_sleep_ms(1200); /* a renewal round that WAIT confirmed */
    long long t0 = fx_now_ns();
    assert_int_equal(fx_redis_signal(replica, SIGSTOP), 0); /* nothing acked from now on */
    fx_sleep_ms(600);
    fx_proxy_hold_next(p, "{k0}"); /* a chunk of the next round never reaches Redis */
    while (fx_now_ns() < t0 + 3300LL * 1000000)
        fx_sleep_ms(10);
    int held = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "k%d", i);
        held += dlock_held(c, name);
    }
    int was_held_back = fx_proxy_held(p);
    assert_int_equal(fx_redis_signal(replica, SIGCONT), 0);
    fx_proxy_release_held(p);
    dlock_client_close(c);
    fx_proxy_stop(p);
    assert_true(was_held_back);
    assert_int_equal(held, 0);
    assert_int_equal(wait_topology(mp, rp), 0);
}

/* ------------------------------------------------------------------ */
/* A storm across a failover                                            */

#define NAMES 8
#define CLIENTS 2
#define THREADS 3

typedef struct storm storm;

typedef struct worker {
    storm *s;
    int client, idx;
} worker;

struct storm {
    dlock_client *c[CLIENTS];
    worker w[CLIENTS * THREADS];
    pthread_t th[CLIENTS * THREADS];
    volatile int stop;
    int occupancy[NAMES];
    uint64_t last_token[NAMES];
    long long violations, regressions, ok, other_errors;
    long long eredis, timeouts;
    long long last_ok_ns[CLIENTS * THREADS];
    long long max_gap_ns; /* longest time between two successes of the storm */
    long long last_any_ok_ns;
    pthread_mutex_t mu;   /* guards the figures above, not the lock under test */
};


static void *storm_thread(void *arg)
{
    worker *w = arg;
    storm *s = w->s;
    dlock_client *c = s->c[w->client];
    unsigned seed = (unsigned)(w->idx * 7919 + 1);
    while (!__atomic_load_n(&s->stop, __ATOMIC_RELAXED)) {
        int i = (int)(rand_r(&seed) % NAMES);
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        uint64_t tok;
        int rc = dlock_acquire(c, name, 2000, &tok);
        if (rc == DLOCK_OK) {
            int occ = __atomic_add_fetch(&s->occupancy[i], 1, __ATOMIC_ACQ_REL);
            uint64_t last = __atomic_load_n(&s->last_token[i], __ATOMIC_ACQUIRE);
            fx_sleep_ms(1);
            pthread_mutex_lock(&s->mu);
            if (occ != 1)
                s->violations++;
            if (tok <= last)
                s->regressions++;
            s->ok++;
            long long now = fx_now_ns();
            if (s->last_any_ok_ns && now - s->last_any_ok_ns > s->max_gap_ns)
                s->max_gap_ns = now - s->last_any_ok_ns;
            s->last_any_ok_ns = now;
            pthread_mutex_unlock(&s->mu);
            if (tok > last)
                __atomic_store_n(&s->last_token[i], tok, __ATOMIC_RELEASE);
            __atomic_sub_fetch(&s->occupancy[i], 1, __ATOMIC_ACQ_REL);
            rc = dlock_release(c, name);
            if (rc != DLOCK_OK && rc != DLOCK_EREDIS && rc != DLOCK_ELOST) {
                pthread_mutex_lock(&s->mu);
                s->other_errors++;
                pthread_mutex_unlock(&s->mu);
            }
        } else {
            pthread_mutex_lock(&s->mu);
            if (rc == DLOCK_EREDIS)
                s->eredis++;
            else if (rc == DLOCK_ETIMEDOUT)
                s->timeouts++;
            else {
                s->other_errors++;
                fprintf(stderr, "storm: %s: %s\n", dlock_err_name(rc), dlock_last_error());
            }
            pthread_mutex_unlock(&s->mu);
            fx_sleep_ms(5);
        }
    }
    return NULL;
}

/* Opens CLIENTS clients with cfg and starts their THREADS threads each. */
static void storm_start(storm *s, const dlock_config *cfg)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    for (int k = 0; k < CLIENTS; k++)
        assert_int_equal(dlock_client_open(cfg, &s->c[k]), DLOCK_OK);
    for (int i = 0; i < CLIENTS * THREADS; i++) {
        s->w[i] = (worker){.s = s, .client = i / THREADS, .idx = i};
        assert_int_equal(pthread_create(&s->th[i], NULL, storm_thread, &s->w[i]), 0);
    }
}

/* Stops and joins the threads; the figures stay readable. */
static void storm_stop(storm *s)
{
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < CLIENTS * THREADS; i++)
        pthread_join(s->th[i], NULL);
}

/* Closes the clients. */
static void storm_close(storm *s)
{
    for (int k = 0; k < CLIENTS; k++)
        dlock_client_close(s->c[k]);
    pthread_mutex_destroy(&s->mu);
}

/* SENTINEL FAILOVER in the middle of a storm with min_replicas 1: every
 * grant is on the replica before its holder runs, so the promoted replica
 * keeps every lease a thread holds: no overlap, no token regression, errors
 * only DLOCK_EREDIS or timeouts during the switch, and the storm goes on
 * against the new master. */
static void test_failover_in_storm(void **state)
{
    (void)state;
    int old_master = master_port(), old_replica = replica_port();
    storm s;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:f:", 1);
    cfg.lease_ms = 3000;
    storm_start(&s, &cfg);
    fx_sleep_ms(1500);
    pthread_mutex_lock(&s.mu);
    long long before = s.ok;
    pthread_mutex_unlock(&s.mu);
    long long t0 = fx_now_ns();
    redisReply *r = cmd_at(T.sentinel[0].port, "SENTINEL FAILOVER %s", MASTER_NAME);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("SENTINEL FAILOVER: %s", r->str);
    freeReplyObject(r);
    /* With one replica and min_replicas 1 no grant can be acknowledged from
     * the promotion until the sentinels turn the old master into the new
     * one's replica: the storm stalls (errors only) for that long. It goes
     * on until 200 acquisitions succeeded after the old master stepped down
     * (at most 60 s: the sentinels take about 10 s, see docs/deployments.md). */
    long long promoted_ns = 0, demoted_ns = 0, resumed_ns = 0, ok_at_demotion = 0;
    for (int i = 0; i < 6000 && !resumed_ns; i++) {
        fx_sleep_ms(10);
        long long now = fx_now_ns();
        if (!promoted_ns && is_master(old_replica))
            promoted_ns = now;
        pthread_mutex_lock(&s.mu);
        long long ok = s.ok;
        pthread_mutex_unlock(&s.mu);
        if (promoted_ns && !demoted_ns && !is_master(old_master)) {
            demoted_ns = now;
            ok_at_demotion = ok;
        }
        if (demoted_ns && ok >= ok_at_demotion + 200)
            resumed_ns = now;
    }
    storm_stop(&s);
    fprintf(stderr, "failover: %lld acquisitions before, %lld in all; %lld DLOCK_EREDIS, %lld "
                    "timeouts; after SENTINEL FAILOVER: replica promoted %.1f s, old master a "
                    "replica %.1f s, 200 acquisitions on the new master %.1f s; longest time "
                    "without an acquisition %.1f s\n",
            before, s.ok, s.eredis, s.timeouts, promoted_ns ? (promoted_ns - t0) / 1e9 : -1.0,
            demoted_ns ? (demoted_ns - t0) / 1e9 : -1.0,
            resumed_ns ? (resumed_ns - t0) / 1e9 : -1.0, s.max_gap_ns / 1e9);
    assert_true(before > 0);
    assert_true(promoted_ns > 0);
    assert_true(resumed_ns > 0);
    assert_int_equal(s.violations, 0);
    assert_int_equal(s.regressions, 0);
    assert_int_equal(s.other_errors, 0);
    assert_true(is_master(old_replica));
    storm_close(&s);
    assert_int_equal(wait_topology(old_replica, old_master), 0);

    /* a new client finds the new master at once, and its wake-ups work */
    sentinel_config(&cfg, "ts:f:", 0);
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "after", 0, NULL), DLOCK_OK);
    assert_int_equal(key_exists(old_replica, "ts:f:{after}"), 1);
    assert_int_equal(dlock_release(a, "after"), DLOCK_OK);
    dlock_client_close(a);
    (void)b;
}


/* Without min_replicas: after SENTINEL FAILOVER the deposed master keeps
 * answering until the sentinels demote it (about 10 s), but the clients ask
 * the sentinels every second (sentinel.h) and leave it before that: every
 * connection, the subscribers' included, moves to the new master. Overlaps
 * between a lease the old master granted and one the new master granted
 * are possible here (asynchronous replication) and only printed. */
static void test_failover_clients_move_before_demotion(void **state)
{
    (void)state;
    int old_master = master_port(), old_replica = replica_port();
    storm s;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:g:", 0);
    cfg.lease_ms = 3000;
    storm_start(&s, &cfg);
    fx_sleep_ms(1500);
    long long t0 = fx_now_ns();
    redisReply *r = cmd_at(T.sentinel[0].port, "SENTINEL FAILOVER %s", MASTER_NAME);
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("SENTINEL FAILOVER: %s", r->str);
    freeReplyObject(r);
    /* Watch the old master's script calls until it is demoted (at most 60 s).
     * A read that gets no answer (a busy machine, the server at its
     * demotion) tells nothing: it is neither a call nor a demotion, which
     * only ROLE answering "slave" shows. */
    long long last_calls = -1, last_change_ns = t0, demoted_ns = 0;
    for (int i = 0; i < 6000 && !demoted_ns; i++) {
        long long sha = fx_info_calls("127.0.0.1", old_master, "evalsha");
        long long ev = fx_info_calls("127.0.0.1", old_master, "eval");
        long long now = fx_now_ns();
        if (sha >= 0 && ev >= 0 && sha + ev != last_calls) {
            last_calls = sha + ev;
            last_change_ns = now;
        }
        if (is_replica(old_master))
            demoted_ns = now;
        else
            fx_sleep_ms(10);
    }
    /* the subscribers are on the new master (10 s: generous) */
    long long subs = 0;
    for (int i = 0; i < 1000 && subs < CLIENTS; i++) {
        redisReply *x = cmd_at(old_replica, "PUBSUB CHANNELS ts:g:wake:*");
        subs = x && x->type == REDIS_REPLY_ARRAY ? (long long)x->elements : 0;
        if (x)
            freeReplyObject(x);
        if (subs < CLIENTS)
            fx_sleep_ms(10);
    }
    pthread_mutex_lock(&s.mu);
    long long ok_before_stop = s.ok;
    pthread_mutex_unlock(&s.mu);
    fx_sleep_ms(500);
    storm_stop(&s);
    fprintf(stderr, "failover without min_replicas: the old master's last script call %.1f s "
                    "after SENTINEL FAILOVER, demoted at %.1f s; %lld acquisitions, %lld "
                    "DLOCK_EREDIS, %lld timeouts, %lld overlaps, %lld token regressions\n",
            (last_change_ns - t0) / 1e9, demoted_ns ? (demoted_ns - t0) / 1e9 : -1.0, s.ok,
            s.eredis, s.timeouts, s.violations, s.regressions);
    assert_true(demoted_ns > 0);
    assert_true(last_change_ns < demoted_ns); /* left before the demotion */
    assert_int_equal(subs, CLIENTS);
    assert_true(s.ok > ok_before_stop);        /* still acquiring, on the new master */
    assert_int_equal(s.other_errors, 0);
    storm_close(&s);
    assert_int_equal(wait_topology(old_replica, old_master), 0);
}

/* The sentinel that runs a failover raises the config-epoch when it
 * promotes the replica, but its SENTINEL MASTER keeps naming the old master
 * until every other replica is reconfigured (here: never, the other replica
 * is stopped as the failover starts, so for the failover-timeout, 8 s). A
 * client asking that sentinel first must still move to the promoted replica
 * and not come back to the old master (the address is taken from
 * get-master-addr-by-name, which names the promoted replica in that
 * window). Each client moves at its own next check of the sentinels, so
 * calls on the old master are counted from SETTLE_MS after the first call
 * on the promoted replica: every client has checked by then, and each
 * checks again (asking the leader first) at least once a second after. A
 * topology of its own: a master, two replicas, three sentinels. */
static void test_failover_leader_reconfiguring(void **state)
{
    (void)state;
    fx_sentinel_set t2;
    /* down-after 8 s: the stopped replica is not given up on for 8 s, and
     * the leader waits for it that long (failover-timeout 8 s) */
    assert_int_equal(fx_sentinel_start_n(&t2, "tl", 2, 8000), 0);
    int a = t2.srv[0].port, b = t2.srv[1].port;
    storm s;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:l:", 0);
    cfg.sentinels = t2.addrs; /* the leader, sentinel 0, is asked first */
    cfg.sentinel_master = "tl";
    storm_start(&s, &cfg);
    fx_sleep_ms(1000);
    /* The third server (never promoted) stops answering: the leader waits
     * for it to follow the new master until its failover-timeout. */
    assert_int_equal(fx_redis_signal(&t2.srv[2], SIGSTOP), 0);
    long long t0 = fx_now_ns();
    redisReply *r = cmd_at(t2.sentinel[0].port, "SENTINEL FAILOVER tl");
    assert_non_null(r);
    if (r->type == REDIS_REPLY_ERROR)
        fail_msg("SENTINEL FAILOVER: %s", r->str);
    freeReplyObject(r);
    /* Watch for 7.5 s (within the leader's 8 s of reconfiguration): when
     * did B first serve a lock call, did A serve any once every client had
     * had time to move, and when did the leader's SENTINEL MASTER start
     * naming B? SETTLE_MS: one check period plus one sentinel's timeout,
     * with as much again for a loaded 2-core machine. */
    const long long SETTLE_MS = 2 * (DLOCK_SENTINEL_CHECK_MS + DLOCK_SENTINEL_TIMEOUT_MS);
    long long b0 = fx_info_calls("127.0.0.1", b, "evalsha") + fx_info_calls("127.0.0.1", b, "eval");
    long long a_at_b = -1, a_after = 0, b_first_ns = 0, leader_moved_ns = 0;
    while (fx_now_ns() < t0 + 7500LL * 1000000) {
        long long bc = fx_info_calls("127.0.0.1", b, "evalsha") +
                       fx_info_calls("127.0.0.1", b, "eval");
        long long ac = fx_info_calls("127.0.0.1", a, "evalsha") +
                       fx_info_calls("127.0.0.1", a, "eval");
        if (!b_first_ns && bc > b0) {
            b_first_ns = fx_now_ns();
        } else if (b_first_ns && fx_now_ns() >= b_first_ns + SETTLE_MS * 1000000) {
            if (a_at_b < 0)
                a_at_b = ac;
            else if (ac > a_at_b)
                a_after = ac - a_at_b;
        }
        if (!leader_moved_ns) {
            /* when does the leader's SENTINEL MASTER name B? */
            redisReply *x = cmd_at(t2.sentinel[0].port, "SENTINEL MASTER tl");
            for (size_t k = 0; x && x->type == REDIS_REPLY_ARRAY && k + 1 < x->elements; k += 2)
                if (!strcmp(x->element[k]->str, "port") && atoi(x->element[k + 1]->str) == b)
                    leader_moved_ns = fx_now_ns();
            if (x)
                freeReplyObject(x);
        }
        fx_sleep_ms(20);
    }
    storm_stop(&s);
    fprintf(stderr, "leader reconfiguring: the promoted replica served its first lock call "
                    "%.1f s after SENTINEL FAILOVER; %lld calls reached the old master from "
                    "%.1f s on; the leader's SENTINEL MASTER named it at %.1f s\n",
            b_first_ns ? (b_first_ns - t0) / 1e9 : -1.0, a_after,
            b_first_ns ? (b_first_ns - t0) / 1e9 + SETTLE_MS / 1e3 : -1.0,
            leader_moved_ns ? (leader_moved_ns - t0) / 1e9 : -1.0);
    storm_close(&s);
    fx_redis_signal(&t2.srv[2], SIGCONT);
    fx_sentinel_stop(&t2);
    assert_true(b_first_ns > 0);
    /* moved early enough to leave a window of a second or more: 1.0 s on
     * an idle machine, 4 s is generous */
    assert_true(b_first_ns - t0 < 4000LL * 1000000);
    assert_true(a_at_b >= 0);
    /* moved while the leader's SENTINEL MASTER still named A */
    assert_true(!leader_moved_ns || b_first_ns < leader_moved_ns);
    assert_int_equal(a_after, 0);
    assert_int_equal(s.other_errors, 0);
}

/* Sentinels that lost their state (redeployed without their config) count
 * config-epochs from 0 again. A client that recorded the master at a higher
 * epoch must still follow them once its master says it is none: it then
 * asks every sentinel, and believes a lower epoch that all of them give.
 * Here the roles are swapped by hand (REPLICAOF) and the sentinels restarted
 * fresh on their ports, monitoring the new master. Runs after the failover
 * tests, which raised the epoch. */
static void test_sentinels_lost_state(void **state)
{
    (void)state;
    int m = master_port(), r = replica_port();
    redisReply *x = cmd_at(T.sentinel[0].port, "SENTINEL MASTER %s", MASTER_NAME);
    long long epoch = -1;
    for (size_t k = 0; x && x->type == REDIS_REPLY_ARRAY && k + 1 < x->elements; k += 2)
        if (!strcmp(x->element[k]->str, "config-epoch"))
            epoch = atoll(x->element[k + 1]->str);
    if (x)
        freeReplyObject(x);
    if (epoch < 1)
        fail_msg("needs a config-epoch above 0 (the failover tests run first), got %lld", epoch);
    dlock_config cfg;
    sentinel_config(&cfg, "ts:e:", 0);
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "e1", 0, NULL), DLOCK_OK); /* recorded: m */
    assert_int_equal(dlock_release(c, "e1"), DLOCK_OK);

    /* new roles by hand, fresh sentinels monitoring r at epoch 0 */
    freeReplyObject(cmd_at(r, "REPLICAOF NO ONE"));
    freeReplyObject(cmd_at(m, "REPLICAOF 127.0.0.1 %d", r));
    /* Every sentinel is stopped before any starts again: a fresh one that
     * heard an old one (still at the raised epoch, still naming m) took
     * its config and named m, now a replica, as the down master (seen on
     * a loaded 2-core machine, the fixture's wait timing out). And, as
     * setup rather than what is tested, sentinels that still have not
     * agreed within the fixture's 30 s are restarted once more. */
    int ready = -1;
    for (int attempt = 0; attempt < 2 && ready != 0; attempt++) {
        for (int i = 0; i < FX_SENTINELS; i++)
            assert_int_equal(fx_redis_signal(&T.sentinel[i], SIGKILL), 0);
        for (int i = 0; i < FX_SENTINELS; i++) {
            T.sentinel[i].opts.sentinel_master_port = r;
            assert_int_equal(fx_redis_restart(&T.sentinel[i]), 0);
        }
        ready = wait_topology(r, m);
    }
    assert_int_equal(ready, 0);

    /* the client follows within 10 s (generous; a check a second) */
    int rc = DLOCK_EREDIS;
    long long t0 = fx_now_ns();
    while (rc != DLOCK_OK && fx_now_ns() < t0 + 10000LL * 1000000) {
        rc = dlock_acquire(c, "e2", 0, NULL);
        if (rc != DLOCK_OK)
            fx_sleep_ms(50);
    }
    fprintf(stderr, "sentinels restarted at epoch 0 (the client had %lld): followed in %.1f s\n",
            epoch, (fx_now_ns() - t0) / 1e9);
    assert_int_equal(rc, DLOCK_OK);
    assert_int_equal(key_exists(r, "ts:e:{e2}"), 1);
    assert_int_equal(dlock_release(c, "e2"), DLOCK_OK);
    dlock_client_close(c);
}

#ifdef DLOCKCTL_PATH
/* dlockctl in Sentinel mode: it finds the master through the sentinels
 * (past the dead one listed first), shows the holder, and a forced release
 * reaches the holder. */
static void test_dlockctl_through_sentinels(void **state)
{
    (void)state;
    dlock_config cfg;
    sentinel_config(&cfg, "ts:ctl:", 0);
    cfg.client_name = "via-sentinel";
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "s1", 0, NULL), DLOCK_OK);
    char command[700], out[4096];
    snprintf(command, sizeof command, "%s --sentinels '%s' --master %s --prefix ts:ctl: --json show s1",
             DLOCKCTL_PATH, sentinels, MASTER_NAME);
    FILE *f = popen(command, "r");
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(out, "\"holder_name\":\"via-sentinel\""));
    snprintf(command, sizeof command, "%s --sentinels '%s' --master %s --prefix ts:ctl: release s1 "
             "--force >/dev/null", DLOCKCTL_PATH, sentinels, MASTER_NAME);
    assert_int_equal(system(command), 0);
    for (int i = 0; i < 200 && dlock_held(c, "s1"); i++) /* 2 s: generous */
        fx_sleep_ms(10);
    assert_int_equal(dlock_held(c, "s1"), 0);
    assert_int_equal(dlock_release(c, "s1"), DLOCK_ELOST);
    dlock_client_close(c);
}
#endif

int main(void)
{
    /* DLOCK_TEST_FILTER: only the tests whose names match (cmocka's pattern,
     * with * and ?), as scripts/check-client runs the min_replicas ones. */
    const char *only = getenv("DLOCK_TEST_FILTER");
    if (only && *only)
        cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolves_master),
        cmocka_unit_test(test_shared_through_sentinels),
        cmocka_unit_test(test_sem_through_sentinels),
#ifdef DLOCKCTL_PATH
        cmocka_unit_test(test_dlockctl_through_sentinels),
#endif
        cmocka_unit_test(test_min_replicas),
        cmocka_unit_test(test_min_replicas_partial_round),
        cmocka_unit_test(test_failover_in_storm),
        cmocka_unit_test(test_failover_clients_move_before_demotion),
        cmocka_unit_test(test_failover_leader_reconfiguring),
        cmocka_unit_test(test_sentinels_lost_state),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
