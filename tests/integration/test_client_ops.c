/*
 * Integration tests of the public client API against a private redis-server
 * (tests/support/fixture.h): what operators see and the other ways to hold a lock.
 * Who holds a lease (client id, name, since; connection names), the
 * Prometheus metrics, on_log reporting renewals that fail and work again,
 * handles that move between threads, dlock_with, DLOCK_GUARD, and data of
 * another protocol refused. Helpers shared with the other test_client*.c
 * files are in client_helpers.h.
 *
 * One server per executable (group setup/teardown). Tests that stop or kill
 * it restore it in their per-test teardown even when an assertion fails.
 *
 * Timing: this runs on small, noisy machines and under sanitizers, so every
 * time bound below is an upper bound several times larger than the duration
 * it guards, and says why.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"

/* ------------------------------------------------------------------ tests */

/* What the grant of key says of its holder, in the layout of whichever
 * protocol wrote it: "owner" (client id), "name" (client name) or "since"
 * (server ms of the grant, decimal); "" when there is no grant. */
static void grant_str(const char *key, const char *what, char *out, size_t n)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    char *v = NULL;
    if (!strcmp(what, "since")) {
        long long ms = fx_grant_since_ms(k, key);
        if (ms >= 0 && asprintf(&v, "%lld", ms) < 0)
            v = NULL;
    } else if (!strcmp(what, "name")) {
        v = fx_grant_client_name(k, key);
    } else {
        v = fx_grant_get(k, key, what);
    }
    redisFree(k);
    snprintf(out, n, "%s", v ? v : "");
    free(v);
}

typedef struct waiter_arg {
    dlock_client *c;
    int rc, got, release; /* got, release: atomics between the two threads */
} waiter_arg;

/* Acquires "who", says so, holds it until told, releases it (locks belong
 * to the acquiring thread). */
static void *wait_and_hold(void *arg)
{
    waiter_arg *w = arg;
    w->rc = dlock_acquire(w->c, "who", 10000, NULL);
    __atomic_store_n(&w->got, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&w->release, __ATOMIC_ACQUIRE))
        fx_sleep_ms(5);
    if (w->rc == DLOCK_OK)
        w->rc = dlock_release(w->c, "who");
    return NULL;
}

/* Who holds a lease, for operators: the client's id as owner, its name and
 * the grant's server time in the name's data (also for a direct grant, which
 * the releasing client makes for the waiter); its connections named with
 * CLIENT SETNAME; names Redis would refuse are DLOCK_EINVAL. */
static void test_holder_identity(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:who:";
    dlock_client *a, *b, *d;
    cfg.client_name = "has space";
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "client_name"));
    char longname[DLOCK_CLIENT_NAME_MAX + 2];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cfg.client_name = longname;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_EINVAL);
    cfg.client_name = "";
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_EINVAL);
    cfg.client_name = "alpha-1";
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    cfg.client_name = "beta-2";
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    cfg.client_name = NULL; /* the default: <host>:<pid> */
    assert_int_equal(dlock_client_open(&cfg, &d), DLOCK_OK);
    assert_null(dlock_client_id(NULL));
    const char *id = dlock_client_id(a);
    assert_int_equal(strlen(id), 32);
    assert_true(strspn(id, "0123456789abcdef") == 32);
    assert_string_not_equal(id, dlock_client_id(b));

    redisReply *t = cmd("TIME");
    long long now_ms = atoll(t->element[0]->str) * 1000 + atoll(t->element[1]->str) / 1000;
    freeReplyObject(t);
    assert_int_equal(dlock_acquire(a, "who", 0, NULL), DLOCK_OK);
    char v[100];
    grant_str("tc:who:{who}", "owner", v, sizeof v);
    assert_string_equal(v, id);
    grant_str("tc:who:{who}", "name", v, sizeof v);
    assert_string_equal(v, "alpha-1");
    grant_str("tc:who:{who}", "since", v, sizeof v);
    assert_true(atoll(v) >= now_ms && atoll(v) < now_ms + 10000); /* generous: a slow box */

    /* b waits; a's release grants it directly: the lease names b */
    waiter_arg w = {b, -1, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_and_hold, &w), 0);
    redisReply *q;
    for (int i = 0; i < 500; i++) { /* b is queued (5 s at most) */
        q = cmd("ZCARD tc:who:{who}:q");
        long long n = q->integer;
        freeReplyObject(q);
        if (n == 1)
            break;
        fx_sleep_ms(10);
    }
    assert_int_equal(dlock_release(a, "who"), DLOCK_OK);
    while (!__atomic_load_n(&w.got, __ATOMIC_ACQUIRE))
        fx_sleep_ms(5);
    assert_int_equal(w.rc, DLOCK_OK);
    grant_str("tc:who:{who}", "owner", v, sizeof v);
    assert_string_equal(v, dlock_client_id(b));
    grant_str("tc:who:{who}", "name", v, sizeof v);
    assert_string_equal(v, "beta-2");
    __atomic_store_n(&w.release, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_int_equal(w.rc, DLOCK_OK);

    /* the default name, on the lease and on the connections */
    char host[64], want[120];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    snprintf(want, sizeof want, "%.40s:%ld", host, (long)getpid());
    assert_int_equal(dlock_acquire(d, "who", 0, NULL), DLOCK_OK);
    grant_str("tc:who:{who}", "name", v, sizeof v);
    assert_string_equal(v, want);
    assert_int_equal(dlock_release(d, "who"), DLOCK_OK);
    redisReply *cl = cmd("CLIENT LIST");
    assert_non_null(strstr(cl->str, "name=alpha-1 "));
    assert_non_null(strstr(cl->str, "name=beta-2 "));
    char field[140];
    snprintf(field, sizeof field, "name=%s ", want);
    assert_non_null(strstr(cl->str, field));
    freeReplyObject(cl);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(d);
}

/* The value of the metric line that starts with `prefix` (name and
 * labels), or -1 if there is none. */
static double metric(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* Every line is a comment or `name{labels} value`: what a Prometheus
 * scraper accepts. */
static void check_exposition(const char *text)
{
    for (const char *p = text; *p;) {
        const char *end = strchr(p, '\n');
        assert_non_null(end);
        if (*p != '#') {
            const char *brace = memchr(p, '{', (size_t)(end - p));
            const char *close = memchr(p, '}', (size_t)(end - p));
            assert_non_null(brace);
            assert_non_null(close);
            assert_true(close[1] == ' ' && close + 2 < end);
            for (const char *q = p; q < brace; q++)
                assert_true((*q >= 'a' && *q <= 'z') || *q == '_');
        }
        p = end + 1;
    }
}

/* The metrics count what the calls did: successes (with their waits and
 * holds), a busy try, a timeout, a release error by code. */
static void test_metrics(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:met:";
    cfg.client_name = "met\"q";
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    cfg.client_name = "other";
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    assert_null(dlock_client_metrics_prometheus(NULL));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dlock_acquire(a, "m", 0, NULL), DLOCK_OK);
        fx_sleep_ms(2); /* a hold of 2 ms at least */
        assert_int_equal(dlock_release(a, "m"), DLOCK_OK);
    }
    assert_int_equal(dlock_acquire(b, "m", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "m", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_acquire(a, "m", 50, NULL), DLOCK_ETIMEDOUT);
    assert_int_equal(dlock_release(a, "m"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_release(b, "m"), DLOCK_OK);
    char *t = dlock_client_metrics_prometheus(a);
    assert_non_null(t);
    check_exposition(t);
    assert_true(metric(t, "dlock_acquisitions_total{client=\"met\\\"q\"}") == 3);
    assert_true(metric(t, "dlock_acquire_busy_total{client=\"met\\\"q\"}") == 1);
    assert_true(metric(t, "dlock_acquire_timeouts_total{client=\"met\\\"q\"}") == 1);
    assert_true(metric(t, "dlock_release_errors_total{client=\"met\\\"q\",code=\"DLOCK_ENOTHELD\"}") == 1);
    assert_true(metric(t, "dlock_release_errors_total{client=\"met\\\"q\",code=\"DLOCK_EREDIS\"}") == 0);
    assert_true(metric(t, "dlock_wait_seconds_count{client=\"met\\\"q\"}") == 3);
    assert_true(metric(t, "dlock_wait_seconds_bucket{client=\"met\\\"q\",le=\"+Inf\"}") == 3);
    assert_true(metric(t, "dlock_hold_seconds_count{client=\"met\\\"q\"}") == 3);
    assert_true(metric(t, "dlock_hold_seconds_sum{client=\"met\\\"q\"}") >= 0.006);
    /* 2 ms holds are not in the buckets up to 1.024 ms */
    assert_true(metric(t, "dlock_hold_seconds_bucket{client=\"met\\\"q\",le=\"0.001024\"}") == 0);
    assert_true(metric(t, "dlock_grants_total{client=\"met\\\"q\"}") == 3);
    assert_true(metric(t, "dlock_leases_held{client=\"met\\\"q\"}") == 0);
    free(t);
    dlock_stats st;
    assert_int_equal(dlock_client_stats(a, &st), DLOCK_OK);
    assert_int_equal(st.busy, 1);
    assert_int_equal(st.timeouts, 1);
    assert_int_equal(st.errors, 1);
    dlock_client_close(a);
    dlock_client_close(b);
}

static char renew_log[4][300];
static int renew_logs;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static char lost_log[300], fit_log[2][300];
static int fit_logs;

static void keep_log(int level, const char *message, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&log_mu);
    if (strncmp(message, "renewal", 7) == 0 && renew_logs < 4)
        snprintf(renew_log[renew_logs++], sizeof renew_log[0], "%d %s", level, message);
    if (strstr(message, "lost"))
        snprintf(lost_log, sizeof lost_log, "%d %s", level, message);
    if (strstr(message, "fit for dlock") && fit_logs < 2)
        snprintf(fit_log[fit_logs++], sizeof fit_log[0], "%d %s", level, message);
    pthread_mutex_unlock(&log_mu);
}

/* A lost lease that its release finds before the renewal does is logged
 * too (it used to reach on_lost only): the key deleted behind the holder's
 * back, released at once (the renewal comes every 10 s). */
static void test_log_lost_at_release(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:lrl:";
    cfg.on_log = keep_log;
    lost_log[0] = '\0';
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "g", 0, NULL), DLOCK_OK);
    freeReplyObject(cmd("DEL tc:lrl:{g}"));
    assert_int_equal(dlock_release(c, "g"), DLOCK_ELOST);
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "log: %s\n", lost_log);
    assert_true(lost_log[0] == '0' + DLOCK_LOG_WARN);
    assert_non_null(strstr(lost_log, "'g'"));
    assert_non_null(strstr(lost_log, "gone from Redis at its release"));
    pthread_mutex_unlock(&log_mu);
    dlock_client_close(c);
}

/* Renewals that start failing (Redis frozen) are logged once, and once when
 * they work again, and counted. */
static void test_log_renewal_failing(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:log:";
    cfg.lease_ms = 3000; /* renewed every second */
    cfg.command_timeout_ms = 200;
    cfg.on_log = keep_log;
    renew_logs = 0;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "l", 0, NULL), DLOCK_OK);
    fx_sleep_ms(1200); /* one good round */
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    fx_sleep_ms(1500); /* a round fails, then retries every 100 ms (all failing) */
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    fx_sleep_ms(800); /* a retry succeeds; the lease (3 s) is still valid */
    dlock_stats st;
    assert_int_equal(dlock_client_stats(c, &st), DLOCK_OK);
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < renew_logs; i++)
        fprintf(stderr, "log: %s\n", renew_log[i]);
    assert_int_equal(renew_logs, 2);
    assert_true(renew_log[0][0] == '0' + DLOCK_LOG_WARN);
    assert_non_null(strstr(renew_log[0], "renewal failing: 1 of 1 leases not confirmed"));
    assert_true(renew_log[1][0] == '0' + DLOCK_LOG_INFO);
    assert_non_null(strstr(renew_log[1], "renewal works again"));
    pthread_mutex_unlock(&log_mu);
    assert_true(st.renew_failures >= 1);
    assert_true(st.renewed >= 2);
    assert_int_equal(dlock_held(c, "l"), 1);
    assert_int_equal(dlock_release(c, "l"), DLOCK_OK);
    dlock_client_close(c);
}

/* An eviction policy set on the server after the client connected: the
 * renewal thread's periodic check (every second with a 300 ms lease) finds
 * it, logs it, and acquires fail with DLOCK_ESERVER saying why, until the
 * policy is mended. Polled with 10 s bounds (several periods). */
static int restore_server(void **state)
{
    (void)state;
    freeReplyObject(cmd("CONFIG SET maxmemory-policy noeviction"));
    freeReplyObject(cmd("CONFIG SET maxmemory 0"));
    return fx_ensure_server(state);
}

static void test_server_rechecked(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:chk:";
    cfg.lease_ms = 300;
    cfg.on_log = keep_log;
    fit_logs = 0;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "k", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "k"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "held", 0, NULL), DLOCK_OK); /* held throughout */
    fx_sleep_ms(400); /* renewed on its connection by now (every 100 ms): a renewal
                         connection opened to an unfit server is refused too */
    freeReplyObject(cmd("CONFIG SET maxmemory 1000000000"));
    freeReplyObject(cmd("CONFIG SET maxmemory-policy allkeys-lru"));
    int rc = DLOCK_OK;
    for (int i = 0; i < 100 && rc == DLOCK_OK; i++) {
        rc = dlock_acquire(c, "k", 0, NULL);
        if (rc == DLOCK_OK) {
            dlock_release(c, "k");
            fx_sleep_ms(100);
        }
    }
    assert_int_equal(rc, DLOCK_ESERVER);
    fprintf(stderr, "# %s\n", dlock_last_error());
    assert_non_null(strstr(dlock_last_error(), "allkeys-lru"));
    assert_non_null(strstr(dlock_last_error(), "until it is mended"));
    /* a held lock stays held and reentrant: no Redis call needed */
    assert_int_equal(dlock_acquire(c, "held", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "held"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "held"), 1);
    freeReplyObject(cmd("CONFIG SET maxmemory-policy noeviction"));
    for (int i = 0; i < 100 && rc != DLOCK_OK; i++) {
        rc = dlock_acquire(c, "k", 0, NULL);
        if (rc != DLOCK_OK)
            fx_sleep_ms(100);
    }
    assert_int_equal(rc, DLOCK_OK);
    assert_int_equal(dlock_release(c, "k"), DLOCK_OK);
    assert_int_equal(dlock_release(c, "held"), DLOCK_OK);
    dlock_client_close(c);
    pthread_mutex_lock(&log_mu);
    assert_int_equal(fit_logs, 2);
    assert_true(fit_log[0][0] == '0' + DLOCK_LOG_ERROR);
    assert_non_null(strstr(fit_log[0], "no longer fit"));
    assert_true(fit_log[1][0] == '0' + DLOCK_LOG_INFO);
    pthread_mutex_unlock(&log_mu);
}

/* Data of another protocol (a later release marks it with the lease
 * hash's field pv: lua/acquire.lua, "Protocol") is refused, not misread:
 * an acquire, waiting or not, fails with DLOCK_ESERVER naming both
 * protocols (the client's: the one it writes, config_protocol) and leaves
 * the data as it was; so does the release of a lease this client holds if
 * its hash gains the mark (released locally all the same). pv 1 or 2, a
 * protocol this release speaks, changes nothing. */
static void test_other_protocol_refused(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:pv:", 2000);
    char mine[48];
    snprintf(mine, sizeof mine, "speaks protocol %d", config_protocol());
    freeReplyObject(cmd("HSET tc:pv:{p} pv 3"));
    long long scripts0 = fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                         fx_info_calls("127.0.0.1", fx_server.port, "eval");
    for (int wait = 0; wait <= 1; wait++) {
        assert_int_equal(dlock_acquire(c, "p", wait ? 200 : 0, NULL), DLOCK_ESERVER);
        fprintf(stderr, "# %s\n", dlock_last_error());
        assert_non_null(strstr(dlock_last_error(), "refused by the server"));
        assert_non_null(strstr(dlock_last_error(), "'p'"));
        assert_non_null(strstr(dlock_last_error(), "dlock protocol 3"));
        assert_non_null(strstr(dlock_last_error(), mine));
    }
    /* two script calls, the two acquires: no background release of their
     * attempts follows (a refusal comes again while the mark stays; before,
     * seven tries each over the next 6 s). 0.5 s covers three of them. */
    fx_sleep_ms(500);
    assert_int_equal(fx_info_calls("127.0.0.1", fx_server.port, "evalsha") +
                         fx_info_calls("127.0.0.1", fx_server.port, "eval") - scripts0,
                     2);
    assert_int_equal(key_exists("tc:pv:{p}:q"), 0); /* not queued */
    /* the hash as written: pv alone (no grant, record or flag of either
     * layout), and no time to live */
    redisReply *r = cmd("HGETALL tc:pv:{p}");
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->elements, 2);
    assert_string_equal(r->element[0]->str, "pv");
    assert_string_equal(r->element[1]->str, "3");
    freeReplyObject(r);
    r = cmd("PTTL tc:pv:{p}");
    assert_int_equal(r->integer, -1);
    freeReplyObject(r);

    assert_int_equal(dlock_acquire(c, "q", 0, NULL), DLOCK_OK);
    freeReplyObject(cmd("HSET tc:pv:{q} pv 3"));
    assert_int_equal(dlock_release(c, "q"), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "dlock protocol 3"));
    assert_int_equal(dlock_held(c, "q"), 0);

    freeReplyObject(cmd("DEL tc:pv:{q}"));
    assert_int_equal(dlock_acquire(c, "q", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "q"), DLOCK_OK);
    /* a mark of a protocol this build speaks (either, but in a build of
     * one: CMakeLists.txt, DLOCK_PROTOCOL_ONLY): granted in it */
#ifdef DLOCK_PROTOCOL_ONLY
    const int pv_lo = DLOCK_PROTOCOL_ONLY, pv_hi = DLOCK_PROTOCOL_ONLY;
#else
    const int pv_lo = DLOCK_PROTOCOL_LOWEST, pv_hi = DLOCK_PROTOCOL_HIGHEST;
#endif
    for (int pv = pv_lo; pv <= pv_hi; pv++) {
        freeReplyObject(cmd("DEL tc:pv:{p}"));
        freeReplyObject(cmd("HSET tc:pv:{p} pv %d", pv));
        assert_int_equal(dlock_acquire(c, "p", 0, NULL), DLOCK_OK);
        assert_int_equal(key_protocol("tc:pv:{p}"), pv);
        assert_int_equal(lease_live("tc:pv:{p}"), 1);
        assert_int_equal(dlock_release(c, "p"), DLOCK_OK);
        assert_int_equal(lease_live("tc:pv:{p}"), 0);
    }
    dlock_client_close(c);
}

typedef struct hop {
    dlock_handle *h;
    int rc, held;
} hop;

static void *release_elsewhere(void *arg)
{
    hop *x = arg;
    x->held = dlock_handle_held(x->h);
    x->rc = dlock_handle_release(x->h);
    return NULL;
}

typedef struct taker {
    dlock_client *c;
    int rc;
    uint64_t token;
} taker;

static void *take_and_release(void *arg)
{
    taker *t = arg;
    t->rc = dlock_acquire(t->c, "hop", 10000, &t->token);
    if (t->rc == DLOCK_OK)
        t->rc = dlock_release(t->c, "hop");
    return NULL;
}

/* A lock held by a handle is released by another thread; no thread of the
 * client takes it for its own meanwhile (not by name, not reentrantly): a
 * thread of the same client waits for the handle's release, then gets it
 * (a local handoff) with the next token. */
static void test_handle_moves_between_threads(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:hd:", 0);
    dlock_handle *h = NULL;
    uint64_t t1;
    assert_int_equal(dlock_acquire_handle(c, "hop", 0, &t1, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire_handle(c, "hop", 0, &t1, &h), DLOCK_OK);
    assert_non_null(h);
    assert_int_equal(dlock_handle_held(h), 1);
    assert_int_equal(dlock_held(c, "hop"), 0);                 /* not the thread's */
    assert_int_equal(dlock_release(c, "hop"), DLOCK_ENOTHELD);  /* not by name */
    assert_int_equal(dlock_acquire(c, "hop", 0, NULL), DLOCK_EBUSY); /* not reentrant */
    /* a thread of this client waits for it */
    taker t = {c, -1, 0};
    pthread_t tt;
    assert_int_equal(pthread_create(&tt, NULL, take_and_release, &t), 0);
    fx_sleep_ms(100);
    assert_int_equal(t.rc, -1);
    /* another thread releases the handle */
    hop x = {h, -1, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_elsewhere, &x), 0);
    pthread_join(th, NULL);
    assert_int_equal(x.held, 1);
    assert_int_equal(x.rc, DLOCK_OK);
    pthread_join(tt, NULL);
    assert_int_equal(t.rc, DLOCK_OK);
    assert_true(t.token > t1);
    /* the acquiring thread holding it already: no handle on top */
    assert_int_equal(dlock_acquire(c, "hop", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire_handle(c, "hop", 0, NULL, &h), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, "hop"), DLOCK_OK);
    assert_int_equal(dlock_handle_release(NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_handle_held(NULL), 0);
    dlock_client_close(c);
}

/* A handle whose lease was lost (deleted in Redis, renewal found it) says
 * so, and its release is DLOCK_ELOST. */
typedef struct holder9 {
    dlock_client *c;
    int go, done; /* atomics */
} holder9;

static void *hold_y(void *arg)
{
    holder9 *x = arg;
    assert_int_equal(dlock_acquire(x->c, "y", 0, NULL), DLOCK_OK);
    __atomic_store_n(&x->go, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&x->done, __ATOMIC_ACQUIRE))
        fx_sleep_ms(5);
    assert_int_equal(dlock_release(x->c, "y"), DLOCK_OK);
    return NULL;
}

/* A thread that holds more names than it caches (8) asks for a handle on a
 * name another thread holds: busy, not "held by the calling thread". */
static void test_handle_beyond_the_cache(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:h9:", 0);
    holder9 x = {c, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hold_y, &x), 0);
    while (!__atomic_load_n(&x.go, __ATOMIC_ACQUIRE))
        fx_sleep_ms(5);
    char name[16];
    for (int i = 0; i < 9; i++) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
    }
    dlock_handle *h = NULL;
    assert_int_equal(dlock_acquire_handle(c, "y", 0, NULL, &h), DLOCK_EBUSY);
    assert_null(h);
    __atomic_store_n(&x.done, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    assert_int_equal(dlock_acquire_handle(c, "y", 1000, NULL, &h), DLOCK_OK);
    assert_int_equal(dlock_handle_release(h), DLOCK_OK);
    for (int i = 0; i < 9; i++) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(dlock_release(c, name), DLOCK_OK);
    }
    dlock_client_close(c);
}

static void test_handle_lost(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:hl:", 600); /* renewed every 200 ms */
    dlock_handle *h;
    assert_int_equal(dlock_acquire_handle(c, "gone", 0, NULL, &h), DLOCK_OK);
    redisReply *r = cmd("DEL tc:hl:{gone}");
    freeReplyObject(r);
    for (int i = 0; i < 300 && dlock_handle_held(h); i++)
        fx_sleep_ms(10);
    assert_int_equal(dlock_handle_held(h), 0);
    assert_int_equal(dlock_handle_release(h), DLOCK_ELOST);
    dlock_client_close(c);
}

static void with_body(void *arg, uint64_t fence)
{
    uint64_t *seen = arg;
    *seen = fence;
}

/* dlock_with runs the function holding the lock and releases it; the guard
 * releases at the end of its scope. */
static void test_with_and_guard(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:wg:", 0);
    uint64_t seen = 0;
    assert_int_equal(dlock_with(c, "w", 0, with_body, &seen), DLOCK_OK);
    assert_true(seen > 0);
    assert_int_equal(dlock_held(c, "w"), 0);
    assert_int_equal(dlock_with(c, "w", 0, NULL, NULL), DLOCK_EINVAL);
    dlock_client *other = open_client("tc:wg:", 0);
    assert_int_equal(dlock_acquire(other, "w", 0, NULL), DLOCK_OK);
    seen = 0;
    assert_int_equal(dlock_with(c, "w", 0, with_body, &seen), DLOCK_EBUSY);
    assert_true(seen == 0); /* not run */
    assert_int_equal(dlock_release(other, "w"), DLOCK_OK);
    dlock_client_close(other);
    {
        DLOCK_GUARD(g);
        uint64_t fence;
        assert_int_equal(dlock_guard_acquire(&g, c, "g", 0, &fence), DLOCK_OK);
        assert_int_equal(dlock_guard_acquire(&g, c, "g2", 0, NULL), DLOCK_EINVAL);
        assert_int_equal(dlock_held(c, "g"), 1);
    }
    assert_int_equal(dlock_held(c, "g"), 0);
    assert_int_equal(dlock_acquire(c, "g", 0, NULL), DLOCK_OK); /* free again */
    assert_int_equal(dlock_release(c, "g"), DLOCK_OK);
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holder_identity),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_handle_moves_between_threads),
        cmocka_unit_test(test_handle_lost),
        cmocka_unit_test(test_handle_beyond_the_cache),
        cmocka_unit_test(test_with_and_guard),
        cmocka_unit_test_teardown(test_log_renewal_failing, fx_ensure_server),
        cmocka_unit_test(test_log_lost_at_release),
        cmocka_unit_test_teardown(test_server_rechecked, restore_server),
        cmocka_unit_test(test_other_protocol_refused),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
