/*
 * The client's life cycle against a private redis-server (tests/support/fixture.h):
 * dlock_client_shutdown with threads waiting (as pollers in Redis's queue,
 * parked behind a local holder, inside a Redis call on a frozen server),
 * dlock_client_close with threads still inside calls, and cancel tokens
 * (dlock_cancel_*, dlock_acquire_ex, dlock_acquire_handle_ex).
 *
 * Timing: waiting threads must return "promptly": at once when they sleep,
 * within the command timeout (1000 ms, fx_config) when they are inside a
 * Redis call. The bounds below are several times those (5 s), since this
 * runs under sanitizers on a busy 2-core machine; a thread that was never
 * woken waits forever (wait_ms -1), so the bound still tells.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"

/* Woken threads are given this long to return (see the top). */
#define BOUND_MS 5000

/* An acquire on a thread of its own that touches nothing of its client after
 * the call returns (dlock_client_close may free it then), optionally with a
 * cancel token, a handle, and a hold until `let_go` is set. */
typedef struct waiter {
    dlock_client *c;
    char name[64];
    int64_t wait_ms;
    dlock_cancel *cancel;
    int by_handle;
    int rc;
    uint64_t fence;
    atomic_int done;
    pthread_t th;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    dlock_acquire_opts o;
    dlock_acquire_opts_init(&o);
    o.cancel = w->cancel;
    if (w->by_handle) {
        dlock_handle *h = NULL;
        w->rc = dlock_acquire_handle_ex(w->c, w->name, w->wait_ms, &w->fence, &h, &o);
        if (w->rc == DLOCK_OK)
            dlock_handle_release(h);
    } else {
        w->rc = dlock_acquire_ex(w->c, w->name, w->wait_ms, &w->fence, &o);
        if (w->rc == DLOCK_OK)
            dlock_release(w->c, w->name);
    }
    atomic_store(&w->done, 1);
    return NULL;
}

static void waiter_start_as(waiter *w, dlock_client *c, const char *name, dlock_cancel *k,
                            int by_handle)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->by_handle = by_handle;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->wait_ms = -1; /* forever: only a wake-up ends it */
    w->cancel = k;
    w->rc = 1000;
    assert_int_equal(pthread_create(&w->th, NULL, waiter_main, w), 0);
}

static void waiter_start(waiter *w, dlock_client *c, const char *name, dlock_cancel *k)
{
    waiter_start_as(w, c, name, k, 0);
}

/* Joins w, failing instead of hanging if it is not done within bound_ms. */
static void waiter_join(waiter *w, long bound_ms)
{
    long long deadline = fx_now_ns() + bound_ms * 1000000LL;
    while (!atomic_load(&w->done) && fx_now_ns() < deadline)
        fx_sleep_ms(2);
    if (!atomic_load(&w->done))
        fail_msg("the acquire of '%s' still waits after %ld ms", w->name, bound_ms);
    pthread_join(w->th, NULL);
}

static dlock_client *open_prefixed(const char *prefix, uint32_t lease_ms)
{
    return open_client(prefix, lease_ms);
}

/* The number of clients in the Redis wait queue of name. */
static long long queued(const char *prefix, const char *name)
{
    redisReply *r = cmd("ZCARD %s{%s}:q", prefix, name);
    long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return n;
}

/* Waits (at most 10 s) until the wait queue of name holds n clients. */
static void wait_queued(const char *prefix, const char *name, long long n)
{
    for (int i = 0; i < 1000 && queued(prefix, name) != n; i++)
        fx_sleep_ms(10);
    assert_int_equal(queued(prefix, name), n);
}

/* Waits until c has `n` local entries (the waiters have reached them):
 * bounded, 10 s. */
static void wait_entries(dlock_client *c, uint64_t n)
{
    for (int i = 0; i < 1000 && stats(c).entries < n; i++)
        fx_sleep_ms(10);
    assert_true(stats(c).entries >= n);
}

/*
 * Shutdown with threads waiting: pollers in Redis's wait queue (another
 * client holds the name) and threads parked behind a lock this client holds.
 * Every one returns DLOCK_ECLOSED; later acquires do at once, reentrant
 * ones too; the lock still held stays held and renewed, and its release
 * gives the lease back to Redis (to nobody of this client); the client
 * leaves the wait queue.
 */
static void test_shutdown_wakes_waiters(void **state)
{
    (void)state;
    const char *px = "life1:";
    dlock_client *other = open_prefixed(px, 0);
    dlock_client *c = open_prefixed(px, 300); /* renewed every 100 ms */
    assert_int_equal(dlock_acquire(other, "x", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "y", 0, NULL), DLOCK_OK);

    enum { NX = 6, NY = 3 };
    waiter wx[NX], wy[NY];
    for (int i = 0; i < NX; i++)
        waiter_start(&wx[i], c, "x", NULL);
    for (int i = 0; i < NY; i++)
        waiter_start(&wy[i], c, "y", NULL);
    wait_queued(px, "x", 1); /* c's poller of x is in Redis's queue */
    fx_sleep_ms(200);        /* the others park (if not, they fail the same way) */
    for (int i = 0; i < NX; i++)
        assert_false(atomic_load(&wx[i].done));
    for (int i = 0; i < NY; i++)
        assert_false(atomic_load(&wy[i].done));

    assert_int_equal(dlock_client_shutdown(c), DLOCK_OK);
    for (int i = 0; i < NX; i++) {
        waiter_join(&wx[i], BOUND_MS);
        assert_int_equal(wx[i].rc, DLOCK_ECLOSED);
    }
    for (int i = 0; i < NY; i++) {
        waiter_join(&wy[i], BOUND_MS);
        assert_int_equal(wy[i].rc, DLOCK_ECLOSED);
    }
    assert_int_equal(dlock_client_shutdown(c), DLOCK_OK); /* again: no harm */

    /* Later acquires: at once, a free name and a reentrant one alike. */
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_acquire(c, "z", -1, NULL), DLOCK_ECLOSED);
    assert_non_null(strstr(dlock_last_error(), "shutting down"));
    assert_int_equal(dlock_acquire(c, "y", -1, NULL), DLOCK_ECLOSED);
    dlock_handle *h = (dlock_handle *)1;
    assert_int_equal(dlock_acquire_handle(c, "z", -1, NULL, &h), DLOCK_ECLOSED);
    assert_null(h);
    assert_true(MS(fx_now_ns() - t0) < BOUND_MS);

    /* y is still held and renewed: 3 lease times later it is valid. */
    char key[64];
    lease_key(key, sizeof key, px, "y");
    fx_sleep_ms(900);
    assert_int_equal(dlock_held(c, "y"), 1);
    assert_true(fx_server_lease_ms(key) > 0);

    /* Its release gives it back to Redis: nobody of c waits any more. */
    assert_int_equal(dlock_release(c, "y"), DLOCK_OK);
    assert_int_equal(fx_server_lease_ms(key), -2);
    wait_queued(px, "x", 0); /* the client left x's queue */

    dlock_stats s = stats(c);
    assert_int_equal(s.cancelled, NX + NY + 3); /* the waiters, z, y and the handle */
    assert_int_equal(s.errors, 0);
    dlock_client_close(c);
    assert_int_equal(dlock_release(other, "x"), DLOCK_OK);
    dlock_client_close(other);
}

/*
 * dlock_client_close with threads still inside calls (the crash a user
 * reported: close freed what waiting threads used). Threads wait as pollers
 * and parked, another thread holds a lock outside any call; close wakes the
 * waiters (DLOCK_ECLOSED), waits until they have returned, releases the
 * held lease in Redis and frees the client: under ASan and TSan no access
 * to freed memory and no race.
 */
static void test_close_with_threads_inside(void **state)
{
    (void)state;
    const char *px = "life2:";
    dlock_client *other = open_prefixed(px, 0);
    dlock_client *c = open_prefixed(px, 0);
    assert_int_equal(dlock_acquire(other, "x", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "y", 0, NULL), DLOCK_OK); /* held, in no call */

    enum { NX = 8, NY = 4 };
    waiter wx[NX], wy[NY];
    for (int i = 0; i < NX; i++)
        waiter_start(&wx[i], c, "x", NULL);
    for (int i = 0; i < NY; i++)
        waiter_start(&wy[i], c, "y", NULL);
    wait_queued(px, "x", 1);
    wait_entries(c, 2);
    fx_sleep_ms(200);

    long long t0 = fx_now_ns();
    dlock_client_close(c); /* c is gone after this: the waiters touch it no more */
    long long took = MS(fx_now_ns() - t0);
    for (int i = 0; i < NX; i++) {
        assert_true(atomic_load(&wx[i].done)); /* returned before close did */
        waiter_join(&wx[i], 0);
        assert_int_equal(wx[i].rc, DLOCK_ECLOSED);
    }
    for (int i = 0; i < NY; i++) {
        assert_true(atomic_load(&wy[i].done));
        waiter_join(&wy[i], 0);
        assert_int_equal(wy[i].rc, DLOCK_ECLOSED);
    }
    assert_true(took < BOUND_MS);
    char key[64];
    lease_key(key, sizeof key, px, "y");
    assert_int_equal(fx_server_lease_ms(key), -2); /* close released it */
    wait_queued(px, "x", 0);                       /* and left x's queue */
    assert_int_equal(dlock_release(other, "x"), DLOCK_OK);
    dlock_client_close(other);
}

/*
 * Shutdown while the poller is inside a Redis call that cannot finish (the
 * server frozen): the call ends at its command timeout, then the acquire
 * returns DLOCK_ECLOSED, not a Redis error.
 */
static void test_shutdown_during_redis_call(void **state)
{
    (void)state;
    const char *px = "life3:";
    dlock_client *c = open_prefixed(px, 0);
    assert_int_equal(dlock_acquire(c, "warm", 0, NULL), DLOCK_OK); /* connected */
    assert_int_equal(dlock_release(c, "warm"), DLOCK_OK);
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    waiter w;
    waiter_start(&w, c, "x", NULL);
    fx_sleep_ms(200); /* inside its acquire call, which waits for the server */
    assert_false(atomic_load(&w.done));
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_client_shutdown(c), DLOCK_OK);
    waiter_join(&w, BOUND_MS);
    long long took = MS(fx_now_ns() - t0);
    assert_int_equal(w.rc, DLOCK_ECLOSED);
    assert_true(took < BOUND_MS);
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    dlock_client_close(c);
}

/*
 * Cancel tokens. A fired token ends exactly the acquires that use it (a
 * poller in Redis's queue, a thread parked behind it, one in another client)
 * with DLOCK_ECANCELED; the others keep waiting and get the lock. A client
 * whose only waiter was cancelled leaves the wait queue at once. A fired
 * token cancels new acquires at once, handles too, until it is reset.
 */
static void test_cancel(void **state)
{
    (void)state;
    const char *px = "life4:";
    dlock_client *holder = open_prefixed(px, 0);
    dlock_client *c = open_prefixed(px, 0);
    dlock_client *d = open_prefixed(px, 0);
    dlock_cancel *k1, *k2;
    assert_int_equal(dlock_cancel_create(&k1), DLOCK_OK);
    assert_int_equal(dlock_cancel_create(&k2), DLOCK_OK);
    assert_int_equal(dlock_cancel_create(NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_cancel_fired(k1), 0);
    assert_int_equal(dlock_acquire(holder, "x", 0, NULL), DLOCK_OK);

    waiter a, b, keep, other;
    waiter_start(&a, c, "x", k1); /* c's poller, or parked: the first to come */
    wait_queued(px, "x", 1);
    waiter_start(&b, c, "x", k1);
    waiter_start(&keep, c, "x", NULL);
    waiter_start(&other, d, "x", k2);
    wait_queued(px, "x", 2);
    fx_sleep_ms(200);

    long long t0 = fx_now_ns();
    dlock_cancel_fire(k1);
    waiter_join(&a, BOUND_MS);
    waiter_join(&b, BOUND_MS);
    assert_true(MS(fx_now_ns() - t0) < BOUND_MS);
    assert_int_equal(a.rc, DLOCK_ECANCELED);
    assert_int_equal(b.rc, DLOCK_ECANCELED);
    assert_int_equal(dlock_cancel_fired(k1), 1);
    fx_sleep_ms(100);
    assert_false(atomic_load(&keep.done)); /* not its token */
    assert_false(atomic_load(&other.done));

    dlock_cancel_fire(k2); /* d's only waiter: d leaves the queue (in the background) */
    waiter_join(&other, BOUND_MS);
    assert_int_equal(other.rc, DLOCK_ECANCELED);
    wait_queued(px, "x", 1); /* c's, for `keep` */

    assert_int_equal(dlock_release(holder, "x"), DLOCK_OK);
    waiter_join(&keep, BOUND_MS);
    assert_int_equal(keep.rc, DLOCK_OK);

    /* A fired token cancels at once, also on a free name and for a handle. */
    dlock_acquire_opts o;
    dlock_acquire_opts_init(&o);
    o.cancel = k1;
    assert_int_equal(dlock_acquire_ex(c, "free", -1, NULL, &o), DLOCK_ECANCELED);
    assert_non_null(strstr(dlock_last_error(), "cancelled"));
    dlock_handle *h = NULL;
    assert_int_equal(dlock_acquire_handle_ex(c, "free", -1, NULL, &h, &o), DLOCK_ECANCELED);
    assert_null(h);
    /* Reset, it is a token again; NULL options are the defaults. */
    dlock_cancel_reset(k1);
    assert_int_equal(dlock_cancel_fired(k1), 0);
    assert_int_equal(dlock_acquire_ex(c, "free", 0, NULL, &o), DLOCK_OK);
    assert_int_equal(dlock_release(c, "free"), DLOCK_OK);
    assert_int_equal(dlock_acquire_handle_ex(c, "free", 0, NULL, &h, NULL), DLOCK_OK);
    assert_int_equal(dlock_handle_release(h), DLOCK_OK);

    assert_int_equal(stats(c).cancelled, 4);
    assert_int_equal(stats(d).cancelled, 1);
    dlock_cancel_fire(NULL);
    dlock_cancel_reset(NULL);
    dlock_cancel_destroy(NULL);
    assert_int_equal(dlock_cancel_fired(NULL), 0);
    dlock_cancel_destroy(k1);
    dlock_cancel_destroy(k2);
    assert_table_empty(c);
    dlock_client_close(d);
    dlock_client_close(c);
    dlock_client_close(holder);
}

/*
 * A token fired while a thread waits behind a lock of its own client (no
 * Redis call involved) and a handle's acquire waiting in Redis's queue:
 * both cancelled; the lock's holder is not disturbed.
 */
static void test_cancel_local_and_handle(void **state)
{
    (void)state;
    const char *px = "life5:";
    dlock_client *holder = open_prefixed(px, 0);
    dlock_client *c = open_prefixed(px, 0);
    dlock_cancel *k;
    assert_int_equal(dlock_cancel_create(&k), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "mine", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(holder, "theirs", 0, NULL), DLOCK_OK);
    waiter local, handle;
    waiter_start(&local, c, "mine", k);
    waiter_start_as(&handle, c, "theirs", k, 1);
    wait_queued(px, "theirs", 1);
    wait_entries(c, 2);
    fx_sleep_ms(100);
    dlock_cancel_fire(k);
    waiter_join(&local, BOUND_MS);
    waiter_join(&handle, BOUND_MS);
    assert_int_equal(local.rc, DLOCK_ECANCELED);
    assert_int_equal(handle.rc, DLOCK_ECANCELED);
    assert_int_equal(dlock_held(c, "mine"), 1);
    wait_queued(px, "theirs", 0);
    assert_int_equal(dlock_release(c, "mine"), DLOCK_OK);
    assert_int_equal(dlock_release(holder, "theirs"), DLOCK_OK);
    dlock_cancel_destroy(k);
    assert_table_empty(c);
    dlock_client_close(c);
    dlock_client_close(holder);
}

/* on_log lines, kept for the test to read. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

static void keep_log(int level, const char *message, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, "%d %s\n", level, message);
    pthread_mutex_unlock(&log_mu);
}

static int logged(const char *what)
{
    pthread_mutex_lock(&log_mu);
    int yes = strstr(log_text, what) != NULL;
    pthread_mutex_unlock(&log_mu);
    return yes;
}

static dlock_client *open_logged(const char *prefix, uint32_t lease_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    if (lease_ms)
        cfg.lease_ms = lease_ms;
    cfg.on_log = keep_log;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* A thread that takes `n` names (the first twice, nested) and a handle,
 * then exits holding all of them. */
typedef struct exiter {
    dlock_client *c;
    int n;
    const char *fmt;
    dlock_handle *h;
    int rc;
} exiter;

static void *exit_holding(void *arg)
{
    exiter *x = arg;
    char name[32];
    x->rc = DLOCK_OK;
    for (int i = 0; i < x->n && x->rc == DLOCK_OK; i++) {
        snprintf(name, sizeof name, x->fmt, i);
        x->rc = dlock_acquire(x->c, name, 5000, NULL);
        if (i == 0 && x->rc == DLOCK_OK)
            x->rc = dlock_acquire(x->c, name, 0, NULL); /* depth 2 */
    }
    if (x->rc == DLOCK_OK)
        x->rc = dlock_acquire_handle(x->c, "ex:handle", 0, NULL, &x->h);
    return NULL; /* exits holding them */
}

/*
 * A thread that exits holding locks (more names than a thread's cache, one
 * nested) has them released for it: the leases are gone from Redis, on_log
 * names each lock and the thread, dlock_stats.abandoned counts them; the
 * next holder (another client) is told DLOCK_UNCLEAN_ABANDONED, and the one
 * after a release is told nothing. A handle is no thread's: it stays held.
 * (Before, the leases stayed held and renewed until the client closed.)
 */
static void test_thread_exit_releases(void **state)
{
    (void)state;
    const char *px = "life6:";
    log_text[0] = '\0';
    dlock_client *c = open_logged(px, 0);
    enum { N = 12 };
    exiter x = {c, N, "ex:%d", NULL, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, exit_holding, &x), 0);
    pthread_join(th, NULL);
    assert_int_equal(x.rc, DLOCK_OK);
    char key[64], name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "ex:%d", i);
        lease_key(key, sizeof key, px, name);
        assert_int_equal(fx_server_lease_ms(key), -2);
        char line[64];
        snprintf(line, sizeof line, "exited holding '%s'", name);
        assert_true(logged(line));
    }
    assert_true(logged("(token "));
    dlock_stats s = stats(c);
    assert_int_equal(s.abandoned, N);
    assert_int_equal(s.leases_held, 1); /* the handle's */
    lease_key(key, sizeof key, px, "ex:handle");
    assert_true(fx_server_lease_ms(key) > 0);
    assert_int_equal(dlock_handle_unclean(x.h), 0);
    assert_int_equal(dlock_handle_release(x.h), DLOCK_OK);

    dlock_client *d = open_prefixed(px, 0);
    assert_int_equal(dlock_acquire(d, "ex:0", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_unclean(d, "ex:0"), DLOCK_UNCLEAN_ABANDONED);
    assert_int_equal(dlock_acquire(d, "ex:0", 0, NULL), DLOCK_OK); /* reentrant: the same */
    assert_int_equal(dlock_unclean(d, "ex:0"), DLOCK_UNCLEAN_ABANDONED);
    assert_int_equal(dlock_release(d, "ex:0"), DLOCK_OK);
    assert_int_equal(dlock_release(d, "ex:0"), DLOCK_OK);
    assert_int_equal(dlock_acquire(d, "ex:0", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_unclean(d, "ex:0"), 0);
    assert_int_equal(dlock_release(d, "ex:0"), DLOCK_OK);
    assert_int_equal(stats(d).unclean, 1);
    assert_int_equal(dlock_unclean(d, "ex:0"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_unclean(NULL, "ex:0"), DLOCK_EINVAL);
    assert_int_equal(dlock_handle_unclean(NULL), DLOCK_EINVAL);
    assert_table_empty(c);
    dlock_client_close(d);
    dlock_client_close(c);
}

/* A waiter of the exiting thread's name: a thread of the same client (local
 * handoff, no Redis command) or another client (a direct grant from the
 * release, message "u"). Either is told DLOCK_UNCLEAN_ABANDONED. */
typedef struct told {
    dlock_client *c;
    const char *name;
    int rc, unclean;
} told;

static void *acquire_and_tell(void *arg)
{
    told *t = arg;
    t->rc = dlock_acquire(t->c, t->name, 10000, NULL);
    if (t->rc == DLOCK_OK) {
        t->unclean = dlock_unclean(t->c, t->name);
        dlock_release(t->c, t->name);
    }
    return NULL;
}

/* Holds "lw" and "rw" until told to go, then exits holding both. */
struct gate {
    dlock_client *c;
    atomic_int held, go;
};

static void *hold_two_then_exit(void *arg)
{
    struct gate *g = arg;
    if (dlock_acquire(g->c, "lw", 0, NULL) != DLOCK_OK || dlock_acquire(g->c, "rw", 0, NULL) != DLOCK_OK)
        return NULL;
    atomic_store(&g->held, 1);
    while (!atomic_load(&g->go))
        fx_sleep_ms(2);
    return NULL;
}

static void test_thread_exit_tells_waiters(void **state)
{
    (void)state;
    const char *px = "life7:";
    log_text[0] = '\0';
    dlock_client *c = open_logged(px, 0);
    dlock_client *d = open_prefixed(px, 0);
    /* the exiting thread holds "lx" (a waiter of c) and "rx" (a waiter of d) */
    exiter x1 = {c, 1, "lx", NULL, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, exit_holding, &x1), 0);
    pthread_join(th, NULL); /* (released at once: nobody waited) */
    assert_int_equal(x1.rc, DLOCK_OK);
    assert_int_equal(dlock_handle_release(x1.h), DLOCK_OK);

    /* Now with waiters: the exiting thread waits for a go before it exits. */
    struct gate g = {c, 0, 0};
    told local = {c, "lw", 1000, -1}, remote = {d, "rw", 1000, -1};
    pthread_t holder;
    assert_int_equal(pthread_create(&holder, NULL, hold_two_then_exit, &g), 0);
    while (!atomic_load(&g.held))
        fx_sleep_ms(2);
    pthread_t tl, tr;
    assert_int_equal(pthread_create(&tl, NULL, acquire_and_tell, &local), 0);
    assert_int_equal(pthread_create(&tr, NULL, acquire_and_tell, &remote), 0);
    wait_queued(px, "rw", 1); /* d waits in Redis */
    wait_entries(c, 2);
    fx_sleep_ms(100);
    long long h0 = stats(c).handoffs;
    atomic_store(&g.go, 1);
    pthread_join(holder, NULL);
    pthread_join(tl, NULL);
    pthread_join(tr, NULL);
    assert_int_equal(local.rc, DLOCK_OK);
    assert_int_equal(local.unclean, DLOCK_UNCLEAN_ABANDONED);
    assert_int_equal((long long)stats(c).handoffs - h0, 1); /* passed locally */
    assert_int_equal(remote.rc, DLOCK_OK);
    assert_int_equal(remote.unclean, DLOCK_UNCLEAN_ABANDONED);
    assert_int_equal(stats(d).direct_grants, 1); /* from the release's message */
    assert_true(logged("exited holding 'lw'"));
    assert_true(logged("exited holding 'rw'"));
    assert_table_empty(c);
    assert_table_empty(d);
    dlock_client_close(d);
    dlock_client_close(c);
}

static void *exit_holding_marked(void *arg)
{
    exiter *x = arg;
    x->rc = dlock_acquire(x->c, "ex:marked", 0, NULL);
    if (x->rc == DLOCK_OK) /* another protocol's mark (lua/acquire.lua, "Protocol") */
        freeReplyObject(fx_cmd_at(fx_server.port, "HSET tc:exm:{ex:marked} pv 3"));
    return NULL;
}

/* A thread that exits holding a lock whose release then fails (here: the
 * lease hash gained another protocol's mark) is logged as such, with the
 * reason, not as released. */
static void test_thread_exit_release_fails(void **state)
{
    (void)state;
    log_text[0] = '\0';
    dlock_client *c = open_logged("tc:exm:", 0);
    exiter x = {.c = c};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, exit_holding_marked, &x), 0);
    pthread_join(t, NULL);
    assert_int_equal(x.rc, DLOCK_OK);
    assert_true(logged("exited holding 'ex:marked'"));
    assert_true(logged("its release failed (DLOCK_ESERVER"));
    assert_true(logged("dlock protocol 3"));
    assert_false(logged("released for it"));
    assert_int_equal(stats(c).abandoned, 1);
    dlock_client_close(c);
}

/*
 * An acquire cancelled, or stopped by a shutdown, at the moment a release
 * passes it the lease (an open handoff: the releasing thread leaves the
 * lease for the first waiter to run) must not leave the lease held with no
 * thread to release it: the last waiter to go gives it back to Redis. The
 * race is made many times over (the release comes 0.1 to 0.9 ms after the
 * waiter queued, so its handoff is open); after each round the client
 * holds no lease and another client gets the name at once. Before, the
 * lease stayed held and renewed with no owner on the first round.
 */
static dlock_cancel *strand_k;
static dlock_client *strand_c;
static int strand_rc;

static void *strand_waiter(void *arg)
{
    (void)arg;
    dlock_acquire_opts o;
    dlock_acquire_opts_init(&o);
    o.cancel = strand_k;
    strand_rc = dlock_acquire_ex(strand_c, "strand", -1, NULL, &o);
    if (strand_rc == DLOCK_OK)
        dlock_release(strand_c, "strand");
    return NULL;
}

static void test_stop_during_handoff(void **state)
{
    (void)state;
    const char *px = "life8:";
    dlock_client *other = open_prefixed(px, 0);
    assert_int_equal(dlock_cancel_create(&strand_k), DLOCK_OK);
    int cancelled = 0, closed = 0;
    for (int round = 0; round < 300; round++) {
        int shut = round % 6 == 5; /* a shutdown instead: the client is closed after it */
        if (!strand_c)
            strand_c = open_prefixed(px, 2000);
        dlock_cancel_reset(strand_k);
        assert_int_equal(dlock_acquire(strand_c, "strand", 5000, NULL), DLOCK_OK);
        pthread_t th;
        strand_rc = 1000;
        assert_int_equal(pthread_create(&th, NULL, strand_waiter, NULL), 0);
        struct timespec ts = {0, (100 + (round * 37) % 800) * 1000L}; /* 0.1 to 0.9 ms */
        nanosleep(&ts, NULL);
        assert_int_equal(dlock_release(strand_c, "strand"), DLOCK_OK);
        if (shut)
            assert_int_equal(dlock_client_shutdown(strand_c), DLOCK_OK);
        else
            dlock_cancel_fire(strand_k);
        pthread_join(th, NULL);
        assert_true(strand_rc == DLOCK_OK || strand_rc == DLOCK_ECANCELED ||
                    strand_rc == DLOCK_ECLOSED);
        cancelled += strand_rc == DLOCK_ECANCELED;
        closed += strand_rc == DLOCK_ECLOSED;
        if (stats(strand_c).leases_held != 0)
            fail_msg("round %d: the waiter returned %s and the client still holds the lease",
                     round, dlock_err_name(strand_rc));
        int rc = dlock_acquire(other, "strand", 5000, NULL); /* at once: nobody holds it */
        if (rc != DLOCK_OK)
            fail_msg("round %d: another client could not take the name: %s", round,
                     dlock_err_name(rc));
        assert_int_equal(dlock_release(other, "strand"), DLOCK_OK);
        if (shut) {
            dlock_client_close(strand_c);
            strand_c = NULL;
        }
    }
    fprintf(stderr, "# 300 rounds: %d waiters cancelled, %d stopped by a shutdown\n", cancelled,
            closed);
    if (strand_c)
        dlock_client_close(strand_c);
    strand_c = NULL;
    dlock_cancel_destroy(strand_k);
    dlock_client_close(other);
}

/* dlock_client_shutdown running on one thread when dlock_client_close
 * starts on another (the user guide's two-step stop, by a signal thread and
 * main): close waits until the shutdown has left its visit of the entries,
 * which used to read what close had freed. The shutdown is held inside its
 * visit for 300 ms (dlock_test_shutdown_delay_ns, a hook for tests); close
 * starts 50 ms into it, so it must take 250 ms or more (a lower bound: a
 * loaded machine only makes it longer). */
extern uint64_t dlock_test_shutdown_delay_ns;

static void *shutdown_main(void *arg)
{
    dlock_client_shutdown(arg);
    return NULL;
}

static void test_shutdown_and_close_at_once(void **state)
{
    (void)state;
    const char *px = "life9:";
    dlock_client *holder = open_prefixed(px, 0);
    assert_int_equal(dlock_acquire(holder, "n", 0, NULL), DLOCK_OK);
    dlock_client *c = open_prefixed(px, 0);
    waiter w;
    waiter_start(&w, c, "n", NULL);
    wait_entries(c, 1);
    __atomic_store_n(&dlock_test_shutdown_delay_ns, 300 * 1000000ULL, __ATOMIC_RELAXED);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, shutdown_main, c), 0);
    fx_sleep_ms(50);
    long long t0 = fx_now_ns();
    dlock_client_close(c);
    long long took = MS(fx_now_ns() - t0);
    pthread_join(th, NULL);
    __atomic_store_n(&dlock_test_shutdown_delay_ns, 0, __ATOMIC_RELAXED);
    waiter_join(&w, 0);
    assert_int_equal(w.rc, DLOCK_ECLOSED);
    assert_true(took >= 250);
    dlock_client_close(holder);
}

/* A cancelled acquire returns at once, also while Redis does not answer
 * (CLIENT PAUSE for 2.5 s, command timeout 3 s): its client leaves the wait
 * queue in the background. Before, the cancelled thread made that call
 * itself and returned only when Redis answered, after the pause. The bound
 * (1.5 s after the fire) is far from both. */
static void test_cancel_returns_at_once(void **state)
{
    (void)state;
    const char *px = "life10:";
    dlock_client *holder = open_prefixed(px, 0);
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = px;
    cfg.command_timeout_ms = 3000;
    dlock_client *c = NULL;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    dlock_cancel *k;
    assert_int_equal(dlock_cancel_create(&k), DLOCK_OK);
    assert_int_equal(dlock_acquire(holder, "x", 0, NULL), DLOCK_OK);
    waiter w;
    waiter_start(&w, c, "x", k);
    wait_queued(px, "x", 1);
    fx_sleep_ms(100); /* the poller sleeps between its tries */
    freeReplyObject(cmd("CLIENT PAUSE 2500 WRITE")); /* scripts wait; reads pass */
    long long t0 = fx_now_ns();
    dlock_cancel_fire(k);
    waiter_join(&w, BOUND_MS);
    long long took = MS(fx_now_ns() - t0);
    assert_int_equal(w.rc, DLOCK_ECANCELED);
    assert_true(took < 1500);
    wait_queued(px, "x", 0); /* once Redis answers again */
    assert_int_equal(dlock_release(holder, "x"), DLOCK_OK);
    dlock_cancel_destroy(k);
    dlock_client_close(c);
    dlock_client_close(holder);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    assert_int_equal(dlock_client_shutdown(NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire_ex(NULL, "x", 0, NULL, NULL), DLOCK_EINVAL);
    dlock_handle *h = NULL;
    assert_int_equal(dlock_acquire_handle_ex(NULL, "x", 0, NULL, &h, NULL), DLOCK_EINVAL);
    dlock_acquire_opts_init(NULL);
    assert_string_equal(dlock_err_name(DLOCK_ECANCELED), "DLOCK_ECANCELED");
    assert_string_equal(dlock_err_name(DLOCK_ECLOSED), "DLOCK_ECLOSED");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_shutdown_wakes_waiters),
        cmocka_unit_test(test_close_with_threads_inside),
        cmocka_unit_test_teardown(test_shutdown_during_redis_call, fx_ensure_server),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cancel_local_and_handle),
        cmocka_unit_test(test_cancel_returns_at_once),
        cmocka_unit_test(test_thread_exit_releases),
        cmocka_unit_test(test_thread_exit_tells_waiters),
        cmocka_unit_test(test_thread_exit_release_fails),
        cmocka_unit_test(test_stop_during_handoff),
        cmocka_unit_test(test_shutdown_and_close_at_once),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
