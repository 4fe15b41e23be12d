/*
 * Integration tests of the public client API against a private redis-server
 * (tests/fixture.h): config defaults and argument checking, acquire/release/
 * held, the Redis lease key, try and timed waits across clients and threads,
 * reentrancy at zero Redis cost, fencing tokens, error names, Redis
 * unreachable / stopped / restarted / closing idle connections, unknown
 * acquire outcomes, release with Redis down, fork, a holder process that
 * dies, close releasing everything, and the local table emptying.
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

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"


/* The fork test opens a new client (which starts threads) in a child of this
 * multi-threaded process. ThreadSanitizer does not support threads started
 * after a multi-threaded fork (the child dies, or with die_after_fork=0
 * reports "dup thread with used id"), so under TSan that part of the child
 * is left out; the EFORK checks still run. */
#if defined(__SANITIZE_THREAD__)
#define FX_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FX_TSAN 1
#endif
#endif

#define MS(ns) ((ns) / 1000000LL)

/* ---------------------------------------------------------------- helpers */

static dlock_client *open_client(const char *prefix, uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    if (lease_ms)
        cfg.lease_ms = lease_ms;
    dlock_client *c = NULL;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK)
        fail_msg("dlock_client_open: %s (%s)", dlock_err_name(rc), dlock_last_error());
    assert_non_null(c);
    return c;
}

static redisReply *cmd(const char *fmt, ...)
{
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    if (!k)
        fail_msg("cannot connect to the test redis on port %d", fx_server.port);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(k, fmt, ap);
    va_end(ap);
    redisFree(k);
    if (!r)
        fail_msg("redis command failed");
    return r;
}

static void lease_key(char *out, size_t n, const char *prefix, const char *name)
{
    int w = snprintf(out, n, "%s{%s}", prefix, name);
    assert_true(w > 0 && (size_t)w < n);
}

static long long key_exists(const char *key)
{
    redisReply *r = cmd("EXISTS %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

static long long key_pttl(const char *key)
{
    redisReply *r = cmd("PTTL %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    return v;
}

/* HGET as a malloc'd string, NULL when absent. */
static char *key_hget(const char *key, const char *field)
{
    redisReply *r = cmd("HGET %b %s", key, strlen(key), field);
    char *v = NULL;
    if (r->type == REDIS_REPLY_STRING)
        v = strdup(r->str);
    else
        assert_int_equal(r->type, REDIS_REPLY_NIL);
    freeReplyObject(r);
    return v;
}

static void key_type_is(const char *key, const char *type)
{
    redisReply *r = cmd("TYPE %b", key, strlen(key));
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    assert_string_equal(r->str, type);
    freeReplyObject(r);
}

static dlock_stats stats(dlock_client *c)
{
    dlock_stats s;
    memset(&s, 0xa5, sizeof s);
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s;
}

static void assert_table_empty(dlock_client *c)
{
    dlock_stats s = stats(c);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.leases_held, 0);
}

/* A loopback port where nothing listens (bound, read, closed). */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* One acquire (and optional release) on another thread. */
typedef struct op {
    dlock_client *c;
    const char *name;
    int64_t wait_ms;
    int release;        /* release after a successful acquire */
    int rc, rel_rc, held;
    uint64_t fence;
    long long elapsed_ns;
    atomic_int done;
    pthread_t th;
} op;

static void *op_main(void *arg)
{
    op *o = arg;
    long long t0 = fx_now_ns();
    o->rc = dlock_acquire(o->c, o->name, o->wait_ms, &o->fence);
    o->elapsed_ns = fx_now_ns() - t0;
    o->held = dlock_held(o->c, o->name);
    if (o->rc == DLOCK_OK && o->release)
        o->rel_rc = dlock_release(o->c, o->name);
    atomic_store(&o->done, 1);
    return NULL;
}

static void op_start(op *o, dlock_client *c, const char *name, int64_t wait_ms, int release)
{
    memset(o, 0, sizeof *o);
    o->c = c;
    o->name = name;
    o->wait_ms = wait_ms;
    o->release = release;
    o->rc = o->rel_rc = 1000;
    assert_int_equal(pthread_create(&o->th, NULL, op_main, o), 0);
}

/* Joins, failing (instead of hanging) if the thread is not done in bound_ms. */
static void op_join(op *o, long bound_ms)
{
    long long deadline = fx_now_ns() + bound_ms * 1000000LL;
    while (!atomic_load(&o->done) && fx_now_ns() < deadline)
        fx_sleep_ms(5);
    if (!atomic_load(&o->done))
        fail_msg("thread acquiring '%s' still running after %ld ms", o->name, bound_ms);
    pthread_join(o->th, NULL);
}

/* Calls `fn` on a fresh thread and returns its int result. */
typedef struct call {
    dlock_client *c;
    const char *name;
    int which; /* 0 release, 1 held, 2 try-acquire */
    int rc;
} call;

static void *call_main(void *arg)
{
    call *k = arg;
    if (k->which == 0)
        k->rc = dlock_release(k->c, k->name);
    else if (k->which == 1)
        k->rc = dlock_held(k->c, k->name);
    else
        k->rc = dlock_acquire(k->c, k->name, 0, NULL);
    return NULL;
}

static int on_thread(dlock_client *c, const char *name, int which)
{
    call k = { c, name, which, 1000 };
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, call_main, &k), 0);
    pthread_join(th, NULL);
    return k.rc;
}

/* ------------------------------------------------------------------ tests */

/* The library's version is the header's, and the number matches the string. */
static void test_version(void **state)
{
    (void)state;
    assert_string_equal(dlock_version(), DLOCK_VERSION_STRING);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", DLOCK_VERSION_MAJOR, DLOCK_VERSION_MINOR,
             DLOCK_VERSION_PATCH);
    assert_string_equal(v, DLOCK_VERSION_STRING);
    assert_int_equal(DLOCK_VERSION_NUMBER, DLOCK_VERSION_MAJOR * 10000 +
                                               DLOCK_VERSION_MINOR * 100 + DLOCK_VERSION_PATCH);
}

/* A lease field, "" when absent (the caller frees nothing). */
static void lease_field_str(const char *key, const char *field, char *out, size_t n)
{
    redisReply *r = cmd("HGET %s %s", key, field);
    snprintf(out, n, "%s", r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
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
 * the grant's server time in the lease hash (also for a direct grant, which
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
    lease_field_str("tc:who:{who}", "owner", v, sizeof v);
    assert_string_equal(v, id);
    lease_field_str("tc:who:{who}", "name", v, sizeof v);
    assert_string_equal(v, "alpha-1");
    lease_field_str("tc:who:{who}", "since", v, sizeof v);
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
    lease_field_str("tc:who:{who}", "owner", v, sizeof v);
    assert_string_equal(v, dlock_client_id(b));
    lease_field_str("tc:who:{who}", "name", v, sizeof v);
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
    lease_field_str("tc:who:{who}", "name", v, sizeof v);
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

static void keep_log(int level, const char *message, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&log_mu);
    if (strncmp(message, "renewal", 7) == 0 && renew_logs < 4)
        snprintf(renew_log[renew_logs++], sizeof renew_log[0], "%d %s", level, message);
    pthread_mutex_unlock(&log_mu);
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

static void test_config_defaults(void **state)
{
    (void)state;
    dlock_config cfg;
    memset(&cfg, 0xab, sizeof cfg);
    dlock_config_init(&cfg);
    assert_non_null(cfg.redis_host);
    assert_string_equal(cfg.redis_host, "127.0.0.1");
    assert_int_equal(cfg.redis_port, 6379);
    assert_null(cfg.redis_password);
    assert_int_equal(cfg.redis_db, 0);
    assert_non_null(cfg.key_prefix);
    assert_string_equal(cfg.key_prefix, "dlock:");
    assert_int_equal(cfg.lease_ms, 30000);
    assert_int_equal(cfg.connect_timeout_ms, 1000);
    assert_int_equal(cfg.command_timeout_ms, 1000);
    assert_int_equal(cfg.pass_limit, 128);
    assert_null(cfg.on_lost);
    assert_null(cfg.on_lost_arg);
    assert_null(cfg.redis_unix_path);
    assert_null(cfg.sentinels);
    assert_null(cfg.cluster_nodes);
    assert_int_equal(cfg.min_replicas, 0);
    assert_int_equal(cfg.pool_size, 4);
    assert_int_equal(cfg.waiter_ttl_ms, 2000);
}

/* Opens with cfg and expects `want`; closes the client if one was made. */
static void expect_open(const dlock_config *cfg, int want, const char *what)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(cfg, &c);
    if (rc == DLOCK_OK)
        dlock_client_close(c);
    if (rc != want)
        fail_msg("%s: dlock_client_open returned %s, expected %s", what, dlock_err_name(rc),
                 dlock_err_name(want));
    if (want == DLOCK_EINVAL && dlock_last_error()[0] == '\0')
        fail_msg("%s: EINVAL without a message in dlock_last_error()", what);
}

static void test_open_invalid(void **state)
{
    (void)state;
    dlock_config good, cfg;
    fx_config(&good, &fx_server);
    good.key_prefix = "tc:open:";

    /* The baseline opens, so each failure below is due to its one change. */
    expect_open(&good, DLOCK_OK, "baseline");

    dlock_client *c = (dlock_client *)0x1;
    assert_int_equal(dlock_client_open(NULL, &c), DLOCK_EINVAL);
    assert_int_equal(dlock_client_open(&good, NULL), DLOCK_EINVAL);

    char prefix65[DLOCK_PREFIX_MAX + 2], prefix64[DLOCK_PREFIX_MAX + 1];
    memset(prefix65, 'p', DLOCK_PREFIX_MAX + 1);
    prefix65[DLOCK_PREFIX_MAX + 1] = '\0';
    memset(prefix64, 'q', DLOCK_PREFIX_MAX);
    prefix64[DLOCK_PREFIX_MAX] = '\0';

#define BAD(field, value)                                                      \
    do {                                                                       \
        cfg = good;                                                            \
        cfg.field = value;                                                     \
        expect_open(&cfg, DLOCK_EINVAL, #field " = " #value);                  \
    } while (0)
#define OK(field, value)                                                       \
    do {                                                                       \
        cfg = good;                                                            \
        cfg.field = value;                                                     \
        expect_open(&cfg, DLOCK_OK, #field " = " #value);                      \
    } while (0)

    BAD(redis_host, NULL);
    BAD(redis_port, 0);
    BAD(redis_port, -1);
    BAD(redis_port, 70000);
    BAD(key_prefix, NULL);
    BAD(key_prefix, prefix65);
    BAD(lease_ms, 0);
    BAD(lease_ms, DLOCK_LEASE_MIN_MS - 1);
    BAD(lease_ms, DLOCK_LEASE_MAX_MS + 1);
    BAD(connect_timeout_ms, 0);
    BAD(connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS + 1);
    BAD(command_timeout_ms, 0);
    BAD(command_timeout_ms, DLOCK_TIMEOUT_MAX_MS + 1);
    BAD(pool_size, 0);
    BAD(pool_size, 1025);
    BAD(redis_db, -1);
    BAD(redis_host, "");
    BAD(waiter_ttl_ms, 0);
    BAD(waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS - 1);
    BAD(waiter_ttl_ms, DLOCK_LEASE_MAX_MS + 1);
    BAD(pass_limit, DLOCK_PASS_LIMIT_MAX + 1);
    /* Handoff tokens must stay below the lease time in us (good has the
     * default 30 s lease). */
    BAD(pass_limit, 30000u * 1000u);
    cfg = good;
    cfg.lease_ms = 100;
    cfg.pass_limit = 100000; /* = lease_ms * 1000 */
    expect_open(&cfg, DLOCK_EINVAL, "pass_limit 100000 with lease_ms 100");
    cfg.pass_limit = 99999;
    expect_open(&cfg, DLOCK_OK, "pass_limit 99999 with lease_ms 100");

    /* The limits themselves are accepted. */
    OK(pass_limit, 0);
    OK(pass_limit, DLOCK_PASS_LIMIT_MAX);
    OK(pool_size, 1024);
    OK(waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS);
    OK(waiter_ttl_ms, DLOCK_LEASE_MAX_MS);
    OK(key_prefix, prefix64);
    OK(lease_ms, DLOCK_LEASE_MIN_MS);
    OK(lease_ms, DLOCK_LEASE_MAX_MS);
    OK(connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    OK(command_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    OK(redis_port, 65535);
#undef BAD
#undef OK

    /* NULL is ignored by close; NULL arguments of stats are rejected. */
    dlock_client_close(NULL);
    dlock_stats s;
    assert_int_equal(dlock_client_stats(NULL, &s), DLOCK_EINVAL);
    dlock_client *k = open_client("tc:open:", 0);
    assert_int_equal(dlock_client_stats(k, NULL), DLOCK_EINVAL);
    dlock_client_close(k);
}

static void test_name_arguments(void **state)
{
    (void)state;
    const char *prefix = "tc:names:";
    dlock_client *c = open_client(prefix, 0);
    char too_long[DLOCK_NAME_MAX + 2], longest[DLOCK_NAME_MAX + 1];
    memset(too_long, 'x', DLOCK_NAME_MAX + 1);
    too_long[DLOCK_NAME_MAX + 1] = '\0';
    memset(longest, 'y', DLOCK_NAME_MAX);
    longest[DLOCK_NAME_MAX] = '\0';
    uint64_t f = 0;

    assert_int_equal(dlock_acquire(NULL, "a", 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, NULL, 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, "", 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, too_long, 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, too_long, -1, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_release(NULL, "a"), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, ""), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, too_long), DLOCK_EINVAL);
    assert_int_equal(dlock_held(NULL, "a"), 0);
    assert_int_equal(dlock_held(c, NULL), 0);
    assert_int_equal(dlock_held(c, ""), 0);
    assert_int_equal(dlock_held(c, too_long), 0);
    assert_table_empty(c);

    /* Exactly DLOCK_NAME_MAX bytes works, and names the Redis key in full. */
    char key[DLOCK_NAME_MAX + 64];
    lease_key(key, sizeof key, prefix, longest);
    assert_int_equal(dlock_acquire(c, longest, 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_held(c, longest), 1);
    assert_int_equal(key_exists(key), 1);
    assert_int_equal(dlock_release(c, longest), DLOCK_OK);
    assert_int_equal(key_exists(key), 0);
    assert_int_equal(dlock_held(c, longest), 0);

    /* A name may hold any bytes but NUL: braces, colons, spaces. */
    const char *odd = "a:{b} c";
    lease_key(key, sizeof key, prefix, odd);
    assert_int_equal(dlock_acquire(c, odd, 0, &f), DLOCK_OK);
    assert_int_equal(key_exists(key), 1);
    assert_int_equal(dlock_release(c, odd), DLOCK_OK);
    assert_int_equal(key_exists(key), 0);

    assert_table_empty(c);
    dlock_client_close(c);
}

static void test_basic_lease_key(void **state)
{
    (void)state;
    const char *prefix = "tc:basic:";
    const uint32_t lease = 20000;
    dlock_client *c = open_client(prefix, lease);
    char key[128];
    lease_key(key, sizeof key, prefix, "order:42");
    assert_int_equal(key_exists(key), 0);

    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "order:42", 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_held(c, "order:42"), 1);
    assert_int_equal(dlock_held(c, "order:43"), 0);

    key_type_is(key, "hash");
    char *owner = key_hget(key, "owner");
    char *token = key_hget(key, "token");
    assert_non_null(owner);
    assert_true(strlen(owner) > 0);
    assert_non_null(token);
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_string_equal(token, want);
    long long pttl = key_pttl(key);
    assert_true(pttl > 0);
    assert_true(pttl <= lease);

    dlock_stats s = stats(c);
    assert_int_equal(s.leases_held, 1);
    assert_int_equal(s.entries, 1);
    assert_true(s.acquisitions >= 1);
    assert_true(s.redis_commands >= 1);
    assert_true(s.redis_round_trips >= 1);

    /* A second client has a different owner id. */
    dlock_client *c2 = open_client(prefix, lease);
    assert_int_equal(dlock_acquire(c2, "order:43", 0, NULL), DLOCK_OK);
    char key43[128];
    lease_key(key43, sizeof key43, prefix, "order:43");
    char *owner2 = key_hget(key43, "owner");
    assert_non_null(owner2);
    assert_string_not_equal(owner, owner2);
    assert_int_equal(dlock_release(c2, "order:43"), DLOCK_OK);
    dlock_client_close(c2);

    assert_int_equal(dlock_release(c, "order:42"), DLOCK_OK);
    assert_int_equal(key_exists(key), 0);
    assert_int_equal(dlock_held(c, "order:42"), 0);
    assert_table_empty(c);
    free(owner);
    free(owner2);
    free(token);
    dlock_client_close(c);
}

static void test_release_not_held(void **state)
{
    (void)state;
    const char *prefix = "tc:nothe:";
    dlock_client *c = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    char key[128];
    lease_key(key, sizeof key, prefix, "n");

    /* Never acquired: ENOTHELD, no entry left behind. */
    assert_int_equal(dlock_release(c, "never"), DLOCK_ENOTHELD);
    assert_table_empty(c);

    /* Held by this thread: another thread's release is refused and changes
     * nothing; so is another client's. */
    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "n", 0, &f), DLOCK_OK);
    dlock_stats before = stats(c);
    assert_int_equal(on_thread(c, "n", 0), DLOCK_ENOTHELD);
    assert_int_equal(on_thread(c, "n", 1), 0);          /* held is per thread */
    assert_int_equal(dlock_release(c2, "n"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_held(c2, "n"), 0);
    dlock_stats after = stats(c);
    assert_int_equal(after.leases_held, before.leases_held);
    assert_int_equal(after.entries, before.entries);
    assert_int_equal(dlock_held(c, "n"), 1);
    assert_int_equal(key_exists(key), 1);
    char *token = key_hget(key, "token");
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_non_null(token);
    assert_string_equal(token, want);
    free(token);

    /* Still exclusive. */
    assert_int_equal(dlock_acquire(c2, "n", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c, "n"), DLOCK_OK);
    assert_int_equal(dlock_release(c, "n"), DLOCK_ENOTHELD);
    assert_int_equal(key_exists(key), 0);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

static void test_try_busy(void **state)
{
    (void)state;
    const char *prefix = "tc:busy:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    uint64_t f1 = 0, f2 = 0;

    assert_int_equal(dlock_acquire(c1, "b", 0, &f1), DLOCK_OK);
    /* Another client (like another process) is refused at once. */
    assert_int_equal(dlock_acquire(c2, "b", 0, &f2), DLOCK_EBUSY);
    assert_int_equal(dlock_held(c2, "b"), 0);
    /* So is another thread of the same client. */
    assert_int_equal(on_thread(c1, "b", 2), DLOCK_EBUSY);
    /* Failed tries leave no entries behind. */
    assert_table_empty(c2);
    assert_int_equal(stats(c1).entries, 1);

    assert_int_equal(dlock_release(c1, "b"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "b", 0, &f2), DLOCK_OK);
    assert_true(f2 > f1);
    assert_int_equal(dlock_acquire(c1, "b", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c2, "b"), DLOCK_OK);

    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

static void test_timed_wait(void **state)
{
    (void)state;
    const char *prefix = "tc:timed:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    const int64_t wait = 400;
    /* Upper bound: the wait plus 5 s of slack (>10x the wait) for a loaded
     * 2-core machine and sanitizers; it only catches a wait that ignores
     * its deadline. */
    const long long bound_ms = wait + 5000;

    assert_int_equal(dlock_acquire(c1, "t", 0, NULL), DLOCK_OK);

    /* The waiter is the poller of another client. */
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_acquire(c2, "t", wait, NULL), DLOCK_ETIMEDOUT);
    long long el = MS(fx_now_ns() - t0);
    assert_true(el >= wait);
    assert_true(el < bound_ms);
    assert_int_equal(dlock_held(c2, "t"), 0);
    assert_table_empty(c2);

    /* The waiter is a local waiter behind the holder thread of the same client. */
    op o;
    op_start(&o, c1, "t", wait, 1);
    op_join(&o, bound_ms + 5000);
    assert_int_equal(o.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(o.elapsed_ns) >= wait);
    assert_true(MS(o.elapsed_ns) < bound_ms);
    assert_int_equal(o.held, 0);

    /* Two waiters of c2 at once, local waiter and poller: both honour it. */
    op a, b;
    op_start(&a, c2, "t", wait, 1);
    op_start(&b, c2, "t", wait, 1);
    op_join(&a, bound_ms + 5000);
    op_join(&b, bound_ms + 5000);
    assert_int_equal(a.rc, DLOCK_ETIMEDOUT);
    assert_int_equal(b.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(a.elapsed_ns) >= wait && MS(a.elapsed_ns) < bound_ms);
    assert_true(MS(b.elapsed_ns) >= wait && MS(b.elapsed_ns) < bound_ms);

    assert_int_equal(dlock_held(c1, "t"), 1);
    assert_int_equal(dlock_release(c1, "t"), DLOCK_OK);
    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

static void test_waiter_gets_lock(void **state)
{
    (void)state;
    const char *prefix = "tc:wait:";
    dlock_client *c1 = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    uint64_t f1 = 0;
    assert_int_equal(dlock_acquire(c1, "w", 0, &f1), DLOCK_OK);

    /* Waiters in the other client (a poller and a local waiter) and in the
     * same client. They wait up to 20 s so that a lost wake-up fails the
     * test instead of hanging it; the handoff itself should take well under
     * a second (the release wakes the next client). */
    op w1, w2, w3;
    op_start(&w1, c2, "w", 20000, 1);
    op_start(&w2, c2, "w", 20000, 1);
    op_start(&w3, c1, "w", -1, 1); /* forever; op_join bounds it */
    fx_sleep_ms(300);
    assert_int_equal(atomic_load(&w1.done), 0);
    assert_int_equal(atomic_load(&w2.done), 0);
    assert_int_equal(atomic_load(&w3.done), 0);
    assert_int_equal(dlock_release(c1, "w"), DLOCK_OK);
    op_join(&w1, 30000);
    op_join(&w2, 30000);
    op_join(&w3, 30000);
    op *ws[3] = { &w1, &w2, &w3 };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ws[i]->rc, DLOCK_OK);
        assert_int_equal(ws[i]->held, 1);
        assert_int_equal(ws[i]->rel_rc, DLOCK_OK);
        assert_true(ws[i]->fence > f1);
    }
    /* Three grants, three distinct tokens. */
    assert_true(w1.fence != w2.fence && w2.fence != w3.fence && w1.fence != w3.fence);

    assert_table_empty(c1);
    assert_table_empty(c2);
    dlock_client_close(c1);
    dlock_client_close(c2);
}

/* One thread holding more names than it keeps at hand (8), released in
 * arrival order and out of it, across two clients with the same names: each
 * call finds the thread's own hold, nested acquires included, and nothing
 * of the other client's. */
static void test_many_names_held_by_one_thread(void **state)
{
    (void)state;
    enum { N = 20 };
    dlock_client *c = open_client("tc:many:", 30000);
    dlock_client *d = open_client("tc:many:", 30000);
    char name[N][16];
    uint64_t fence[N];
    for (int i = 0; i < N; i++) {
        snprintf(name[i], sizeof name[i], "m%d", i);
        assert_int_equal(dlock_acquire(c, name[i], -1, &fence[i]), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        uint64_t again;
        assert_int_equal(dlock_held(c, name[i]), 1);
        assert_int_equal(dlock_held(d, name[i]), 0); /* same name, the other client */
        assert_int_equal(dlock_acquire(c, name[i], 0, &again), DLOCK_OK); /* nested */
        assert_int_equal(again, fence[i]);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
        assert_int_equal(dlock_release(d, name[i]), DLOCK_ENOTHELD);
    }
    /* Odd names first (in arrival order), then even ones from the last. */
    for (int i = 1; i < N; i += 2)
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
    for (int i = N - 2; i >= 0; i -= 2) {
        assert_int_equal(dlock_held(c, name[i]), 1);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_OK);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(dlock_held(c, name[i]), 0);
        assert_int_equal(dlock_release(c, name[i]), DLOCK_ENOTHELD);
        /* Free in Redis: the other client takes each at once. */
        assert_int_equal(dlock_acquire(d, name[i], 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_held(d, name[i]), 1);
        assert_int_equal(dlock_held(c, name[i]), 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(dlock_release(d, name[i]), DLOCK_OK);
    assert_int_equal(stats(c).entries, 0);
    assert_int_equal(stats(d).entries, 0);
    dlock_client_close(d);
    dlock_client_close(c);
}

static void test_reentrant(void **state)
{
    (void)state;
    const char *prefix = "tc:reent:";
    /* A long lease: renewal every 20 s, so no renewal falls inside the
     * measured window by chance. */
    dlock_client *c = open_client(prefix, 60000);
    dlock_client *c2 = open_client(prefix, 60000);
    char key[128];
    lease_key(key, sizeof key, prefix, "r");
    uint64_t f1 = 0, f2 = 0, f3 = 0;

    assert_int_equal(dlock_acquire(c, "r", -1, &f1), DLOCK_OK);
    /* The subscribers' start-up commands are not part of the measure. */
    assert_int_equal(fx_wait_subscriber(c), 0);
    assert_int_equal(fx_wait_subscriber(c2), 0);
    dlock_stats s0 = stats(c);
    long long srv0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    assert_true(srv0 > 0);
    assert_int_equal(dlock_acquire(c, "r", 0, &f2), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "r", -1, &f3), DLOCK_OK);
    long long srv1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);
    assert_int_equal(f2, f1);
    assert_int_equal(f3, f1);
    assert_int_equal(s1.redis_commands - s0.redis_commands, 0);
    assert_int_equal(s1.redis_round_trips - s0.redis_round_trips, 0);
    assert_int_equal(srv1 - srv0, 0);
    assert_int_equal(s1.acquisitions - s0.acquisitions, 2);
    assert_int_equal(s1.leases_held, 1);
    assert_int_equal(s1.entries, 1);

    /* Held until the outermost release. */
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 1);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 1);
    assert_int_equal(key_exists(key), 1);
    assert_int_equal(dlock_acquire(c2, "r", 0, NULL), DLOCK_EBUSY);
    assert_int_equal(on_thread(c, "r", 2), DLOCK_EBUSY);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
    assert_int_equal(dlock_held(c, "r"), 0);
    assert_int_equal(key_exists(key), 0);
    assert_int_equal(dlock_release(c, "r"), DLOCK_ENOTHELD);

    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

static void test_fence_increases(void **state)
{
    (void)state;
    const char *prefix = "tc:fence:";
    dlock_client *c[2] = { open_client(prefix, 20000), open_client(prefix, 20000) };
    uint64_t last = 0, f = 0;

    for (int i = 0; i < 60; i++) {
        /* Alternate clients, repeat on the same client, and use another thread. */
        dlock_client *k = c[(i / 3) % 2];
        if (i % 5 == 4) {
            op o;
            op_start(&o, k, "f", 10000, 1);
            op_join(&o, 20000);
            assert_int_equal(o.rc, DLOCK_OK);
            assert_int_equal(o.rel_rc, DLOCK_OK);
            f = o.fence;
        } else {
            assert_int_equal(dlock_acquire(k, "f", 10000, &f), DLOCK_OK);
            assert_int_equal(dlock_release(k, "f"), DLOCK_OK);
        }
        if (!(f > last))
            fail_msg("grant %d: fence %" PRIu64 " not above previous %" PRIu64, i, f, last);
        last = f;
    }
    /* Tokens are per name, but a fresh name still gets a nonzero token. */
    assert_int_equal(dlock_acquire(c[0], "other", 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_release(c[0], "other"), DLOCK_OK);

    assert_table_empty(c[0]);
    assert_table_empty(c[1]);
    dlock_client_close(c[0]);
    dlock_client_close(c[1]);
}

static void test_errors(void **state)
{
    (void)state;
    struct { int code; const char *name, *msg; } all[] = {
#define XX(name, val, msg) { DLOCK_##name, "DLOCK_" #name, msg },
        DLOCK_ERRNO_MAP(XX)
#undef XX
    };
    size_t n = sizeof all / sizeof all[0];
    assert_int_equal(n, 10);
    for (size_t i = 0; i < n; i++) {
        assert_true(all[i].code < 0);
        assert_string_equal(dlock_strerror(all[i].code), all[i].msg);
        assert_string_equal(dlock_err_name(all[i].code), all[i].name);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(all[i].code, all[j].code);
    }
    assert_non_null(dlock_strerror(DLOCK_OK));
    assert_non_null(dlock_err_name(DLOCK_OK));
    assert_string_not_equal(dlock_strerror(DLOCK_OK), "unknown error");

    int unknown[] = { -11, -1000, 1, 42, INT32_MIN, INT32_MAX };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(dlock_strerror(unknown[i]), "unknown error");
        const char *nm = dlock_err_name(unknown[i]);
        assert_non_null(nm);
        assert_true(strlen(nm) > 0);
        for (size_t j = 0; j < n; j++)
            assert_string_not_equal(nm, all[j].name);
    }
}

static void test_redis_unreachable(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.redis_port = dead_port();
    cfg.key_prefix = "tc:down:";
    dlock_client *c = NULL;
    /* Not an error at open (a server may start before its Redis). */
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_non_null(c);

    /* Connection refused: fails fast. Bound: connect + command timeouts
     * (1.5 s) times ~6, for a loaded machine; a refused connect takes ~0. */
    const long long bound_ms = 10000;
    int64_t waits[] = { 0, 2000, -1 };
    for (size_t i = 0; i < 3; i++) {
        long long t0 = fx_now_ns();
        int rc = dlock_acquire(c, "x", waits[i], NULL);
        long long el = MS(fx_now_ns() - t0);
        if (rc != DLOCK_EREDIS)
            fail_msg("wait %" PRId64 ": acquire returned %s, expected DLOCK_EREDIS", waits[i],
                     dlock_err_name(rc));
        assert_true(dlock_last_error()[0] != '\0');
        if (el >= bound_ms)
            fail_msg("wait %" PRId64 ": EREDIS after %lld ms", waits[i], el);
        assert_int_equal(dlock_held(c, "x"), 0);
    }
    assert_int_equal(dlock_release(c, "x"), DLOCK_ENOTHELD);
    assert_table_empty(c);
    dlock_client_close(c);
}

static void test_redis_stopped(void **state)
{
    (void)state;
    const char *prefix = "tc:stop:";
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f0 = 0, f = 0;
    assert_int_equal(dlock_acquire(c, "s", 0, &f0), DLOCK_OK);
    assert_int_equal(dlock_release(c, "s"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    /* Connect 500 ms + command 1000 ms; 10 s is ~6x that, for a loaded
     * machine. A hang would run into it. */
    const long long bound_ms = 10000;
    long long t0 = fx_now_ns();
    int rc = dlock_acquire(c, "s", 0, &f);
    long long el = MS(fx_now_ns() - t0);
    int rc2 = dlock_acquire(c, "s2", -1, &f);
    long long el2 = MS(fx_now_ns() - t0) - el;
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    if (rc != DLOCK_EREDIS || rc2 != DLOCK_EREDIS)
        fail_msg("acquire with Redis stopped: %s and %s, expected DLOCK_EREDIS", dlock_err_name(rc),
                 dlock_err_name(rc2));
    assert_true(dlock_last_error()[0] != '\0');
    if (el >= bound_ms || el2 >= bound_ms)
        fail_msg("EREDIS after %lld / %lld ms", el, el2);
    assert_int_equal(dlock_held(c, "s"), 0);

    /* Works again after SIGCONT. The first call may still find the stale
     * connection dead; it must recover within a few calls (10 s bound). */
    long long deadline = fx_now_ns() + 10000 * 1000000LL;
    int tries = 0;
    for (;;) {
        rc = dlock_acquire(c, "s", 5000, &f);
        tries++;
        if (rc == DLOCK_OK || fx_now_ns() > deadline)
            break;
        assert_int_equal(rc, DLOCK_EREDIS);
        fx_sleep_ms(100);
    }
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f > f0);
    assert_int_equal(dlock_held(c, "s"), 1);
    assert_int_equal(dlock_release(c, "s"), DLOCK_OK);
    char key[64];
    lease_key(key, sizeof key, prefix, "s");
    assert_int_equal(key_exists(key), 0);
    assert_table_empty(c);
    dlock_client_close(c);
}

/* DESIGN.md 4, rule 5: a local waiter honours its deadline while the
 * poller of its client is stuck in Redis (stopped server, 5 s command
 * timeout). */
static void test_waiter_deadline_while_poller_stuck(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:stuck:";
    cfg.command_timeout_ms = 5000;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "warm", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "warm"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    op poller, waiter;
    op_start(&poller, c, "x", 20000, 1);
    fx_sleep_ms(200); /* the poller is in Redis now (not required for the check) */
    op_start(&waiter, c, "x", 300, 1);
    /* The waiter's 300 ms wait, with 10x slack: still well under the
     * poller's 5 s command timeout. */
    op_join(&waiter, 3000);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    op_join(&poller, 30000);
    assert_int_equal(waiter.rc, DLOCK_ETIMEDOUT);
    assert_true(MS(waiter.elapsed_ns) >= 300);
    assert_true(MS(waiter.elapsed_ns) < 3000);
    /* The poller's call was answered late or timed out. */
    assert_true(poller.rc == DLOCK_OK || poller.rc == DLOCK_EREDIS);
    if (poller.rc == DLOCK_OK)
        assert_int_equal(poller.rel_rc, DLOCK_OK);
    assert_table_empty(c);
    dlock_client_close(c);
}

/* An acquire whose reply never came (server stopped) has an unknown outcome:
 * the script may run when the server resumes. The lease must then be
 * released or confirmed, not left to expire after lease_ms (DESIGN.md 5). */
static void test_unknown_outcome_no_orphan(void **state)
{
    (void)state;
    const char *prefix = "tc:orphan:";
    const uint32_t lease = 60000;
    dlock_client *c = open_client(prefix, lease);
    dlock_client *c2 = open_client(prefix, lease);
    /* Warm both clients' connections up. */
    assert_int_equal(dlock_acquire(c, "o", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "o"), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "o2", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "o2"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    int rc = dlock_acquire(c, "o", 0, NULL);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_int_equal(dlock_held(c, "o"), 0);

    /* Another client gets the name well before the 60 s lease could expire:
     * 15 s is far more than cleanup needs, and 4x less than the lease. */
    long long t0 = fx_now_ns();
    uint64_t f = 0;
    rc = dlock_acquire(c2, "o", 15000, &f);
    long long el = MS(fx_now_ns() - t0);
    if (rc != DLOCK_OK)
        fail_msg("orphan lease: second client got %s after %lld ms (lease %u ms)",
                 dlock_err_name(rc), el, lease);
    assert_int_equal(dlock_release(c2, "o"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Release while Redis is stopped: DLOCK_EREDIS in bounded time, and the lock
 * is released locally all the same; in Redis the lease goes away (released
 * late, or expired after lease_ms) so another client gets it. */
static void test_release_redis_down(void **state)
{
    (void)state;
    const char *prefix = "tc:reldown:";
    const uint32_t lease = 2000;
    dlock_client *c = open_client(prefix, lease);
    dlock_client *c2 = open_client(prefix, lease);
    uint64_t f = 0, f2 = 0;
    assert_int_equal(dlock_acquire(c, "rd", 0, &f), DLOCK_OK);
    assert_int_equal(dlock_acquire(c2, "warm", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "warm"), DLOCK_OK);

    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    long long t0 = fx_now_ns();
    int rc = dlock_release(c, "rd");
    long long el = MS(fx_now_ns() - t0);
    int held = dlock_held(c, "rd");
    dlock_stats s = stats(c);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_true(el < 10000); /* ~6x connect + command timeouts */
    assert_int_equal(held, 0);
    assert_int_equal(s.entries, 0);
    assert_int_equal(s.leases_held, 0);
    assert_int_equal(dlock_release(c, "rd"), DLOCK_ENOTHELD);

    /* 15 s: 7x the lease. */
    rc = dlock_acquire(c2, "rd", 15000, &f2);
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f2 > f);
    assert_int_equal(dlock_release(c2, "rd"), DLOCK_OK);
    /* And c works again for that name. */
    long long until = fx_now_ns() + 10000 * 1000000LL;
    while ((rc = dlock_acquire(c, "rd", 2000, &f)) != DLOCK_OK && fx_now_ns() < until) {
        assert_int_equal(rc, DLOCK_EREDIS);
        fx_sleep_ms(50);
    }
    assert_int_equal(rc, DLOCK_OK);
    assert_true(f > f2);
    assert_int_equal(dlock_release(c, "rd"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Redis' own `timeout` setting (common in production, like idle-closing
 * proxies) closes idle client connections. Redis stays reachable, so calls
 * after an idle period must work: DLOCK_EREDIS means "unreachable or
 * failed", and a failed release would leave the lease blocking every other
 * process for lease_ms. */
static void test_idle_connection_closed_by_server(void **state)
{
    (void)state;
    const char *prefix = "tc:idle:";
    dlock_client *c = open_client(prefix, 60000);
    dlock_client *c2 = open_client(prefix, 60000);
    char key[64];
    lease_key(key, sizeof key, prefix, "i");
    freeReplyObject(cmd("CONFIG SET timeout %d", 1));

    assert_int_equal(dlock_acquire(c, "i", 0, NULL), DLOCK_OK);
    fx_sleep_ms(2500); /* the server closes connections idle for 1 s */
    int rc = dlock_release(c, "i");
    if (rc != DLOCK_OK)
        fail_msg("release after an idle period: %s (%s)", dlock_err_name(rc),
                 dlock_last_error());
    assert_int_equal(key_exists(key), 0);
    assert_int_equal(dlock_acquire(c2, "i", 0, NULL), DLOCK_OK);

    fx_sleep_ms(2500);
    rc = dlock_acquire(c, "j", 0, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire after an idle period: %s (%s)", dlock_err_name(rc),
                 dlock_last_error());
    assert_int_equal(dlock_release(c, "j"), DLOCK_OK);
    assert_int_equal(dlock_release(c2, "i"), DLOCK_OK);
    assert_table_empty(c);
    assert_table_empty(c2);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Teardown of the test above: the idle timeout must not outlive it. */
static int reset_idle_timeout(void **state)
{
    if (fx_server.pid > 0) {
        redisContext *k = fx_connect("127.0.0.1", fx_server.port);
        if (k) {
            redisReply *r = redisCommand(k, "CONFIG SET timeout 0");
            if (r)
                freeReplyObject(r);
            redisFree(k);
        }
    }
    return fx_ensure_server(state);
}

static void test_redis_restarted(void **state)
{
    (void)state;
    const char *prefix = "tc:restart:";
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f0 = 0, f = 0;
    assert_int_equal(dlock_acquire(c, "r", 0, &f0), DLOCK_OK);
    assert_int_equal(dlock_release(c, "r"), DLOCK_OK);

    for (int round = 0; round < 2; round++) {
        assert_int_equal(fx_redis_signal(&fx_server, SIGKILL), 0);
        /* While it is down: a fast EREDIS (10 s bound as above). */
        long long t0 = fx_now_ns();
        assert_int_equal(dlock_acquire(c, "r", 0, &f), DLOCK_EREDIS);
        assert_true(MS(fx_now_ns() - t0) < 10000);
        assert_int_equal(fx_redis_restart(&fx_server), 0);

        /* The restarted server has an empty script cache: the client must
         * reconnect and fall back from EVALSHA (NOSCRIPT). Allow a few calls
         * for the reconnect, within 10 s. */
        long long deadline = fx_now_ns() + 10000 * 1000000LL;
        int rc;
        for (;;) {
            rc = dlock_acquire(c, "r", 5000, &f);
            if (rc == DLOCK_OK || fx_now_ns() > deadline)
                break;
            if (rc != DLOCK_EREDIS)
                fail_msg("after restart: %s (%s)", dlock_err_name(rc), dlock_last_error());
            fx_sleep_ms(100);
        }
        if (rc != DLOCK_OK)
            fail_msg("no recovery after restart: %s (%s)", dlock_err_name(rc), dlock_last_error());
        char key[64];
        lease_key(key, sizeof key, prefix, "r");
        assert_int_equal(key_exists(key), 1);
        assert_true(f > f0);
        f0 = f;
        assert_int_equal(dlock_release(c, "r"), DLOCK_OK);
        assert_int_equal(key_exists(key), 0);
        /* And the next call works at once, also for a new name. */
        assert_int_equal(dlock_acquire(c, "r2", 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_release(c, "r2"), DLOCK_OK);
    }
    assert_table_empty(c);
    dlock_client_close(c);
}

static void test_fork_child(void **state)
{
    (void)state;
    const char *prefix = "tc:fork:";
    dlock_client *c = open_client(prefix, 20000);
    char key[64];
    lease_key(key, sizeof key, prefix, "fk");
    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "fk", 0, &f), DLOCK_OK);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* No cmocka here: report through the exit status. */
        int bad = 0;
        if (dlock_acquire(c, "fk", 0, NULL) != DLOCK_EFORK)
            bad |= 1;
        if (dlock_acquire(c, "other", -1, NULL) != DLOCK_EFORK)
            bad |= 2;
        if (dlock_release(c, "fk") != DLOCK_EFORK)
            bad |= 4;
        if (dlock_held(c, "fk") != 0)
            bad |= 8;
        dlock_client_close(c); /* only forgets the parent's client */
#ifndef FX_TSAN
        /* A new client in the child is an independent owner. */
        dlock_config cfg;
        fx_config(&cfg, &fx_server);
        cfg.key_prefix = prefix;
        dlock_client *k = NULL;
        if (dlock_client_open(&cfg, &k) != DLOCK_OK) {
            bad |= 16;
        } else {
            if (dlock_acquire(k, "fk", 0, NULL) != DLOCK_EBUSY)
                bad |= 32;
            if (dlock_acquire(k, "child", 0, NULL) != DLOCK_OK ||
                dlock_release(k, "child") != DLOCK_OK)
                bad |= 64;
            dlock_client_close(k);
        }
#endif
        _exit(bad ? 100 + bad : 0); /* 100+: not a sanitizer's exit code */
    }
    /* The child's calls are all local or quick: 20 s bound, then kill it. */
    int st = 0;
    long long deadline = fx_now_ns() + 20000 * 1000000LL;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && fx_now_ns() < deadline)
        fx_sleep_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("forked child hung");
    }
    if (!WIFEXITED(st))
        fail_msg("forked child died with signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    if (WEXITSTATUS(st) > 100)
        fail_msg("forked child: failed checks mask %d (1,2 acquire not EFORK; 4 release not "
                 "EFORK; 8 held; 16 open; 32 new client not EBUSY; 64 new client acquire)",
                 WEXITSTATUS(st) - 100);
    if (WEXITSTATUS(st) != 0)
        fail_msg("forked child exited with status %d (a sanitizer report?)", WEXITSTATUS(st));

    /* The parent's lease survived the child's close. */
    assert_int_equal(dlock_held(c, "fk"), 1);
    assert_int_equal(key_exists(key), 1);
    char *token = key_hget(key, "token");
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_non_null(token);
    assert_string_equal(token, want);
    free(token);
    assert_int_equal(dlock_release(c, "fk"), DLOCK_OK);
    assert_int_equal(key_exists(key), 0);
    assert_table_empty(c);
    dlock_client_close(c);
}

static void *hold_and_leave(void *arg)
{
    dlock_client *c = arg;
    intptr_t rc = dlock_acquire(c, "thread-held", 0, NULL);
    return (void *)rc;
}

static void test_close_releases(void **state)
{
    (void)state;
    const char *prefix = "tc:close:";
    const uint32_t lease = 60000;
    dlock_client *c = open_client(prefix, lease);
    const char *names[] = { "a", "b", "c", "d", "e" };
    for (int i = 0; i < 5; i++)
        assert_int_equal(dlock_acquire(c, names[i], 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "a", 0, NULL), DLOCK_OK); /* nested */
    pthread_t th;
    void *ret;
    assert_int_equal(pthread_create(&th, NULL, hold_and_leave, c), 0);
    pthread_join(th, &ret);
    assert_int_equal((intptr_t)ret, DLOCK_OK);
    assert_int_equal(stats(c).leases_held, 6);

    char key[64];
    for (int i = 0; i < 5; i++) {
        lease_key(key, sizeof key, prefix, names[i]);
        assert_int_equal(key_exists(key), 1);
    }
    dlock_client_close(c);
    for (int i = 0; i < 5; i++) {
        lease_key(key, sizeof key, prefix, names[i]);
        assert_int_equal(key_exists(key), 0);
    }
    lease_key(key, sizeof key, prefix, "thread-held");
    assert_int_equal(key_exists(key), 0);

    /* So another client gets them at once, long before the 60 s lease. */
    dlock_client *c2 = open_client(prefix, lease);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dlock_acquire(c2, names[i], 0, NULL), DLOCK_OK);
        assert_int_equal(dlock_release(c2, names[i]), DLOCK_OK);
    }
    assert_table_empty(c2);
    dlock_client_close(c2);
}

static void test_table_empty_after_mix(void **state)
{
    (void)state;
    const char *prefix = "tc:table:";
    dlock_client *c = open_client(prefix, 20000);
    dlock_client *c2 = open_client(prefix, 20000);
    char name[32];
    /* Many names, nested holds, failures of every kind, several threads. */
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "m%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
        if (i % 3 == 0)
            assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
        if (i % 5 == 0)
            assert_int_equal(dlock_acquire(c2, name, 0, NULL), DLOCK_EBUSY);
        if (i % 7 == 0)
            assert_int_equal(dlock_acquire(c2, name, 50, NULL), DLOCK_ETIMEDOUT);
        if (i % 11 == 0)
            assert_int_equal(on_thread(c, name, 2), DLOCK_EBUSY);
    }
    assert_int_equal(stats(c).entries, 50);
    assert_int_equal(stats(c).leases_held, 50);
    assert_table_empty(c2);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "m%d", i);
        if (i % 3 == 0)
            assert_int_equal(dlock_release(c, name), DLOCK_OK);
        assert_int_equal(dlock_release(c, name), DLOCK_OK);
        assert_int_equal(dlock_release(c, name), DLOCK_ENOTHELD);
    }
    assert_table_empty(c);
    dlock_stats s = stats(c);
    assert_int_equal(s.leases_lost, 0);
    dlock_client_close(c);
    dlock_client_close(c2);
}

/* Redis without requirepass: AUTH with a password fails; a db index beyond
 * the server's 16 fails SELECT. Either gives an error, not a hang. */
static void test_bad_auth_and_db(void **state)
{
    (void)state;
    const long long bound_ms = 10000; /* ~6x connect + command timeouts */
    for (int k = 0; k < 2; k++) {
        dlock_config cfg;
        fx_config(&cfg, &fx_server);
        cfg.key_prefix = "tc:auth:";
        if (k == 0)
            cfg.redis_password = "not-the-password";
        else
            cfg.redis_db = 1000;
        dlock_client *c = NULL;
        long long t0 = fx_now_ns();
        int rc = dlock_client_open(&cfg, &c);
        assert_true(MS(fx_now_ns() - t0) < bound_ms);
        /* Only NULL/out-of-range arguments fail open; the server's refusal is
         * reported by the calls. */
        assert_int_equal(rc, DLOCK_OK);
        t0 = fx_now_ns();
        rc = dlock_acquire(c, "a", 0, NULL);
        long long el = MS(fx_now_ns() - t0);
        /* A refused password is no passing failure: DLOCK_ESERVER. */
        int want = k == 0 ? DLOCK_ESERVER : DLOCK_EREDIS;
        if (rc != want)
            fail_msg("%s: acquire returned %s, expected %s",
                     k ? "redis_db 1000" : "wrong password", dlock_err_name(rc),
                     dlock_err_name(want));
        assert_true(dlock_last_error()[0] != '\0');
        assert_true(el < bound_ms);
        t0 = fx_now_ns();
        rc = dlock_acquire(c, "a", 1000, NULL);
        assert_int_equal(rc, want);
        assert_true(MS(fx_now_ns() - t0) < bound_ms);
        assert_int_equal(dlock_held(c, "a"), 0);
        assert_table_empty(c);
        dlock_client_close(c);
    }
    /* Nothing was written by those clients. */
    assert_int_equal(key_exists("tc:auth:{a}"), 0);
}

/* Child mode of test_holder_process_dies: a fresh process (exec'd, so it
 * shares nothing with the test) that takes a lease, reports its fence on
 * stdout, and dies without releasing anything. */
static int hold_and_die(int port, const char *prefix)
{
    fx_server.port = port;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    cfg.lease_ms = 2000;
    dlock_client *c = NULL;
    uint64_t f = 0;
    if (dlock_client_open(&cfg, &c) != DLOCK_OK || dlock_acquire(c, "dead", 0, &f) != DLOCK_OK)
        return 3;
    printf("%" PRIu64 "\n", f);
    fflush(stdout);
    raise(SIGKILL);
    return 4;
}

/* DESIGN.md 5: a holder process that dies frees the name within its lease. */
static void test_holder_process_dies(void **state)
{
    (void)state;
    const char *prefix = "tc:dies:";
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char port[16];
    snprintf(port, sizeof port, "%d", fx_server.port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/proc/self/exe", "test_client", "--hold-and-die", port, prefix, (char *)NULL);
        _exit(5);
    }
    close(fds[1]);
    /* The child starts, connects and acquires: 20 s is far more than that. */
    char buf[64] = "";
    size_t got = 0;
    long long deadline = fx_now_ns() + 20000 * 1000000LL;
    while (got < sizeof buf - 1 && !strchr(buf, '\n') && fx_now_ns() < deadline) {
        struct pollfd pfd = { fds[0], POLLIN, 0 };
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        buf[got] = '\0';
    }
    close(fds[0]);
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && fx_now_ns() < deadline)
        fx_sleep_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    if (!strchr(buf, '\n'))
        fail_msg("holder child reported no fence (status 0x%x)", st);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    uint64_t child_fence = strtoull(buf, NULL, 10);
    assert_true(child_fence > 0);

    /* Its 2 s lease runs out with nobody renewing it; the wait of 15 s is
     * 7x the lease, for a loaded machine. */
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f = 0;
    long long t0 = fx_now_ns();
    int rc = dlock_acquire(c, "dead", 15000, &f);
    long long el = MS(fx_now_ns() - t0);
    if (rc != DLOCK_OK)
        fail_msg("name of a dead holder not free after %lld ms: %s", el, dlock_err_name(rc));
    assert_true(f > child_fence);
    assert_int_equal(dlock_release(c, "dead"), DLOCK_OK);
    assert_table_empty(c);
    dlock_client_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--hold-and-die"))
        return hold_and_die(atoi(argv[2]), argv[3]);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_holder_identity),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_handle_moves_between_threads),
        cmocka_unit_test(test_handle_lost),
        cmocka_unit_test(test_with_and_guard),
        cmocka_unit_test_teardown(test_log_renewal_failing, fx_ensure_server),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_errors),
        cmocka_unit_test_teardown(test_open_invalid, fx_ensure_server),
        cmocka_unit_test_teardown(test_name_arguments, fx_ensure_server),
        cmocka_unit_test_teardown(test_basic_lease_key, fx_ensure_server),
        cmocka_unit_test_teardown(test_release_not_held, fx_ensure_server),
        cmocka_unit_test_teardown(test_try_busy, fx_ensure_server),
        cmocka_unit_test_teardown(test_timed_wait, fx_ensure_server),
        cmocka_unit_test_teardown(test_waiter_gets_lock, fx_ensure_server),
        cmocka_unit_test_teardown(test_reentrant, fx_ensure_server),
        cmocka_unit_test_teardown(test_many_names_held_by_one_thread, fx_ensure_server),
        cmocka_unit_test_teardown(test_fence_increases, fx_ensure_server),
        cmocka_unit_test_teardown(test_close_releases, fx_ensure_server),
        cmocka_unit_test_teardown(test_table_empty_after_mix, fx_ensure_server),
        cmocka_unit_test_teardown(test_fork_child, fx_ensure_server),
        cmocka_unit_test_teardown(test_holder_process_dies, fx_ensure_server),
        cmocka_unit_test_teardown(test_bad_auth_and_db, fx_ensure_server),
        cmocka_unit_test_teardown(test_redis_unreachable, fx_ensure_server),
        cmocka_unit_test_teardown(test_redis_stopped, fx_ensure_server),
        cmocka_unit_test_teardown(test_unknown_outcome_no_orphan, fx_ensure_server),
        cmocka_unit_test_teardown(test_waiter_deadline_while_poller_stuck, fx_ensure_server),
        cmocka_unit_test_teardown(test_release_redis_down, fx_ensure_server),
        cmocka_unit_test_teardown(test_idle_connection_closed_by_server, reset_idle_timeout),
        cmocka_unit_test_teardown(test_redis_restarted, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
