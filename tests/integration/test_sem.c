/*
 * The counting semaphore against a real redis-server (dlock.h,
 * dlock_sem_acquire; src/local/sem.h, M1 to M8): never more than `limit`
 * permits across clients and threads; permits passed between a client's
 * threads with no Redis command; FIFO between clients through direct
 * grants; the limit's mismatch named; a name is a lock or a semaphore;
 * thread exit, close, lost permits, cancel and shutdown; a storm.
 */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shared_helpers.h"

static dlock_client *open_sem_client(uint32_t lease_ms, uint32_t waiter_ttl_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    if (lease_ms)
        cfg.lease_ms = lease_ms;
    if (waiter_ttl_ms)
        cfg.waiter_ttl_ms = waiter_ttl_ms;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

/* The permits Redis counts for `name` now: the sum of the live client
 * fields' counts (lua/p2/SEM.txt: "<n> <exp> ..."), by the server's clock. */
static long long permits_in_redis(const char *name)
{
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    redisReply *t = redisCommand(rc, "TIME");
    long long now = atoll(t->element[0]->str) * 1000 + atoll(t->element[1]->str) / 1000;
    freeReplyObject(t);
    redisReply *r = redisCommand(rc, "HGETALL dlock:{%s}", name);
    long long n = 0;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
        long long k, exp;
        if (strncmp(r->element[i]->str, "c:", 2) == 0 &&
            sscanf(r->element[i + 1]->str, "%lld %lld", &k, &exp) == 2 && exp >= now)
            n += k;
    }
    if (r)
        freeReplyObject(r);
    redisFree(rc);
    return n;
}

/* At most `limit` permits across clients; one given back goes to a waiting
 * client; Redis counts what the clients hold. */
static void test_limit_across_clients(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0),
                 *c = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(a, "s2", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(b, "s2", 2, 0), DLOCK_OK);
    assert_int_equal(permits_in_redis("s2"), 2);
    assert_int_equal(dlock_sem_acquire(c, "s2", 2, 0), DLOCK_EBUSY);
    assert_non_null(strstr(dlock_last_error(), "s2"));
    taker t;
    taker_start_sem(&t, c, "s2", 2, 10000, NULL);
    let_it_wait();
    assert_false(taker_done(&t));
    assert_int_equal(dlock_sem_release(a, "s2"), DLOCK_OK);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    assert_int_equal(permits_in_redis("s2"), 2);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "s2"), DLOCK_OK);
    assert_int_equal(permits_in_redis("s2"), 0);
    assert_int_equal(dlock_sem_release(b, "s2"), DLOCK_ENOTHELD);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
}

/* A thread may hold several permits; a client's threads use the permits it
 * holds; a released permit goes to a waiting thread of the client with no
 * Redis command (M5): the server counts no call, the client a pass. */
static void test_pass_between_threads_costs_no_redis_command(void **state)
{
    (void)state;
    /* a long waiter ttl: the poller's fallback retry (a quarter of it)
     * falls outside the measured window */
    dlock_client *c = open_sem_client(0, 60000);
    assert_int_equal(dlock_sem_acquire(c, "pass", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(c, "pass", 2, 0), DLOCK_OK); /* a second one */
    assert_int_equal(permits_in_redis("pass"), 2);
    taker poller, queued;
    taker_start_sem(&poller, c, "pass", 2, 30000, NULL); /* asks Redis, is queued there */
    let_it_wait();
    taker_start_sem(&queued, c, "pass", 2, 30000, NULL); /* waits behind it, locally */
    let_it_wait();
    assert_false(taker_done(&poller));
    assert_false(taker_done(&queued));
    dlock_stats s0 = stats(c);
    long long calls0 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    assert_int_equal(dlock_sem_release(c, "pass"), DLOCK_OK);
    assert_int_equal(taker_got(&queued), DLOCK_OK);
    long long calls1 = fx_info_lock_calls("127.0.0.1", fx_server.port);
    dlock_stats s1 = stats(c);
    assert_int_equal(calls1 - calls0, 0);
    assert_int_equal(s1.sem_passes - s0.sem_passes, 1);
    assert_int_equal(s1.sem_acquisitions - s0.sem_acquisitions, 1);
    assert_int_equal(permits_in_redis("pass"), 2);
    assert_false(taker_done(&poller));
    /* the one the main thread still holds goes to the poller */
    assert_int_equal(dlock_sem_release(c, "pass"), DLOCK_OK);
    assert_int_equal(taker_got(&poller), DLOCK_OK);
    taker_finish(&queued);
    taker_finish(&poller);
    assert_int_equal(queued.release_rc, DLOCK_OK);
    assert_int_equal(poller.release_rc, DLOCK_OK);
    assert_int_equal(permits_in_redis("pass"), 0);
    dlock_client_close(c);
}

/* FIFO between clients: a permit given back goes to the client queued
 * first, through a direct grant, not to one queued after it. */
static void test_fifo_between_clients(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0),
                 *c = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(a, "fifo", 1, 0), DLOCK_OK);
    taker tb, tc;
    taker_start_sem(&tb, b, "fifo", 1, 20000, NULL);
    let_it_wait();
    taker_start_sem(&tc, c, "fifo", 1, 20000, NULL);
    let_it_wait();
    assert_int_equal(dlock_sem_release(a, "fifo"), DLOCK_OK);
    assert_int_equal(taker_got(&tb), DLOCK_OK);
    let_it_wait();
    assert_false(taker_done(&tc));
    assert_int_equal(dlock_sem_acquire(a, "fifo", 1, 0), DLOCK_EBUSY); /* no overtaking */
    taker_finish(&tb);
    assert_int_equal(taker_got(&tc), DLOCK_OK);
    assert_int_equal(permits_in_redis("fifo"), 1);
    taker_finish(&tc);
    assert_int_equal(tb.release_rc, DLOCK_OK);
    assert_int_equal(tc.release_rc, DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
}

/* A limit other than the holders' is refused, naming both: by Redis across
 * clients, locally between a client's threads; once nobody holds or waits,
 * a new limit takes over. */
static void test_limit_mismatch(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(a, "lim", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(b, "lim", 3, 0), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "limit 2"));
    assert_non_null(strstr(dlock_last_error(), "limit 3"));
    taker t;
    taker_start_sem(&t, a, "lim", 5, 0, NULL); /* another thread of a */
    assert_int_equal(taker_got(&t), DLOCK_EINVAL);
    taker_finish(&t);
    assert_int_equal(dlock_sem_acquire(b, "lim", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_release(a, "lim"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "lim"), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(b, "lim", 3, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "lim"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A name is a lock or a semaphore (M1, lua/p2/SEM.txt): refused locally
 * while this client uses it the other way, by Redis while its data is the
 * other kind's. */
static void test_lock_or_semaphore(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(a, "kind", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "kind", 0, NULL), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "semaphore"));
    assert_int_equal(dlock_acquire_shared(a, "kind", 0, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(b, "kind", 0, NULL), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "semaphore"));
    assert_int_equal(dlock_release(a, "kind"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_release_shared(a, "kind"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_sem_release(a, "kind"), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "lockname", 0, NULL), DLOCK_OK);
    taker t;
    taker_start_sem(&t, a, "lockname", 2, 0, NULL);
    assert_int_equal(taker_got(&t), DLOCK_EINVAL); /* used as a lock by this client */
    taker_finish(&t);
    assert_int_equal(dlock_sem_acquire(b, "lockname", 2, 0), DLOCK_ESERVER);
    assert_non_null(strstr(dlock_last_error(), "lock"));
    assert_int_equal(dlock_sem_release(a, "lockname"), DLOCK_ENOTHELD);
    assert_int_equal(dlock_release(a, "lockname"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A thread that exits holding permits has them given back for it; a client
 * closed holding permits gives them back. */
static void test_thread_exit_and_close(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0);
    taker t;
    taker_start_sem(&t, a, "exit", 1, 0, NULL);
    t.exit_holding = 1;
    assert_int_equal(taker_got(&t), DLOCK_OK);
    assert_int_equal(permits_in_redis("exit"), 1);
    taker_finish(&t);
    assert_int_equal(dlock_sem_acquire(b, "exit", 1, 5000), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "exit"), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "close", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "close", 2, 0), DLOCK_OK);
    assert_int_equal(permits_in_redis("close"), 2);
    dlock_client_close(a);
    assert_int_equal(permits_in_redis("close"), 0);
    assert_int_equal(dlock_sem_acquire(b, "close", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_sem_release(b, "close"), DLOCK_OK);
    dlock_client_close(b);
}

/* A client that dies holding a permit (a process that exits without
 * closing it: no release, no more renewals) frees it a lease time after
 * its last renewal, never later: nothing leaks. Forked before this test
 * makes any thread (every client of the tests before it is closed). */
static void test_dead_client_frees_its_permit(void **state)
{
    (void)state;
    enum { LEASE_MS = 1500 };
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dlock_client *d = open_sem_client(LEASE_MS, 0);
        char ok = dlock_sem_acquire(d, "dead", 1, 0) == DLOCK_OK ? 'y' : 'n';
        if (write(fds[1], &ok, 1) != 1)
            _exit(2);
        _exit(0); /* no dlock_client_close: the process dies holding it */
    }
    close(fds[1]);
    char ok = 0;
    assert_int_equal(read(fds[0], &ok, 1), 1);
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(ok, 'y');
    dlock_client *b = open_sem_client(0, 0);
    long long t0 = fx_now_ns();
    assert_int_equal(dlock_sem_acquire(b, "dead", 1, 0), DLOCK_EBUSY);
    /* generous: the permit ends within a lease time of its grant */
    assert_int_equal(dlock_sem_acquire(b, "dead", 1, 10 * LEASE_MS), DLOCK_OK);
    long long waited_ms = (fx_now_ns() - t0) / 1000000;
    print_message("dead client's permit free after %lld ms (lease %d ms)\n", waited_ms,
                  LEASE_MS);
    assert_int_equal(permits_in_redis("dead"), 1);
    assert_int_equal(dlock_sem_release(b, "dead"), DLOCK_OK);
    dlock_client_close(b);
}

static int lost_calls;
static uint64_t lost_fence = 99;
static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)arg;
    if (strcmp(name, "lost") != 0)
        return;
    pthread_mutex_lock(&lost_mu);
    lost_calls++;
    lost_fence = fence;
    pthread_mutex_unlock(&lost_mu);
}

/* Permits gone from Redis are found by the renewal (on_lost, fence 0);
 * each thread holding one gets DLOCK_ELOST from its release, and the next
 * acquire takes a new permit. */
static void test_lost_permits(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.lease_ms = 1500; /* renewed every 500 ms */
    cfg.on_lost = on_lost;
    dlock_client *a;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(a, "lost", 3, 0), DLOCK_OK);
    taker t;
    taker_start_sem(&t, a, "lost", 3, 0, NULL);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL dlock:{lost}"));
    redisFree(rc);
    /* generous: a renewal round comes within a third of the lease */
    for (int i = 0; i < 100; i++) {
        pthread_mutex_lock(&lost_mu);
        int n = lost_calls;
        pthread_mutex_unlock(&lost_mu);
        if (n)
            break;
        fx_sleep_ms(50);
    }
    pthread_mutex_lock(&lost_mu);
    assert_int_equal(lost_calls, 1);
    assert_int_equal(lost_fence, 0);
    pthread_mutex_unlock(&lost_mu);
    assert_int_equal(dlock_sem_acquire(a, "lost", 3, 0), DLOCK_OK); /* a new permit */
    assert_int_equal(permits_in_redis("lost"), 1);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_ELOST);
    /* the main thread holds a lost permit and a new one: one release each */
    int r1 = dlock_sem_release(a, "lost"), r2 = dlock_sem_release(a, "lost");
    assert_true((r1 == DLOCK_ELOST && r2 == DLOCK_OK) || (r1 == DLOCK_OK && r2 == DLOCK_ELOST));
    assert_int_equal(dlock_sem_release(a, "lost"), DLOCK_ENOTHELD);
    assert_int_equal(permits_in_redis("lost"), 0);
    dlock_client_close(a);
}

static int with_ran;

/* dlock_sem_with's function: it holds one permit, counted in Redis. */
static void count_in_fn(void *arg)
{
    (void)arg;
    with_ran = (int)permits_in_redis("ph");
}

/* A permit owned by a handle: beside the thread's own permits, kept when
 * the acquiring thread exits, given back by another thread (passed to a
 * waiting thread of the client, with no Redis command), counted in Redis
 * meanwhile; lost, it says so and its release is DLOCK_ELOST. dlock_held
 * answers for the thread's permits; dlock_sem_with gives back its own
 * permit, not a lost one the thread holds (before, it gave back the lost
 * one and said DLOCK_ELOST, leaving its own held). */
static void test_permit_handle(void **state)
{
    (void)state;
    dlock_client *c = open_sem_client(1500, 60000); /* renewed every 500 ms */
    handle_job j = {.c = c, .name = "ph", .limit = 2};
    assert_int_equal(handle_job_run(handle_job_take, &j), DLOCK_OK); /* its thread ended */
    assert_int_equal(stats(c).abandoned, 0);
    assert_int_equal(dlock_handle_held(j.h), 1);
    assert_int_equal(dlock_handle_unclean(j.h), 0);
    assert_int_equal(dlock_sem_release(c, "ph"), DLOCK_ENOTHELD); /* not the thread's */
    assert_int_equal(dlock_sem_acquire(c, "ph", 2, 0), DLOCK_OK);  /* its own, beside it */
    assert_int_equal(permits_in_redis("ph"), 2);
    dlock_handle *h2 = NULL;
    assert_int_equal(dlock_sem_acquire_handle(c, "ph", 2, 0, &h2), DLOCK_EBUSY);
    assert_null(h2);
    assert_int_equal(dlock_sem_acquire_handle(c, "ph", 3, 0, &h2), DLOCK_EINVAL); /* limit */
    taker t;
    taker_start_sem(&t, c, "ph", 2, 30000, NULL);
    let_it_wait();
    assert_false(taker_done(&t));
    dlock_stats s0 = stats(c);
    assert_int_equal(handle_job_run(handle_job_release, &j), DLOCK_OK);
    assert_int_equal(taker_got(&t), DLOCK_OK);
    assert_int_equal(stats(c).sem_passes - s0.sem_passes, 1);
    taker_finish(&t);
    assert_int_equal(t.release_rc, DLOCK_OK);
    assert_int_equal(dlock_sem_release(c, "ph"), DLOCK_OK);
    assert_int_equal(permits_in_redis("ph"), 0);

    assert_int_equal(dlock_sem_acquire_handle(c, "ph", 2, 0, &h2), DLOCK_OK);
    assert_int_equal(dlock_held(c, "ph"), 0); /* the handle's, not the thread's */
    assert_int_equal(dlock_sem_acquire(c, "ph", 2, 0), DLOCK_OK);
    assert_int_equal(dlock_held(c, "ph"), 1); /* a permit of the thread's */
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    freeReplyObject(redisCommand(rc, "DEL dlock:{ph}"));
    redisFree(rc);
    /* generous: a renewal round comes within a third of the lease */
    for (int i = 0; i < 200 && dlock_handle_held(h2); i++)
        fx_sleep_ms(50);
    assert_int_equal(dlock_handle_held(h2), 0);
    assert_int_equal(dlock_held(c, "ph"), 0); /* lost */
    assert_int_equal(dlock_handle_release(h2), DLOCK_ELOST);
    /* dlock_sem_with gives back its own permit, not the thread's lost one */
    with_ran = 0;
    assert_int_equal(dlock_sem_with(c, "ph", 2, 0, count_in_fn, NULL), DLOCK_OK);
    assert_int_equal(with_ran, 1);
    assert_int_equal(permits_in_redis("ph"), 0);
    assert_int_equal(dlock_sem_release(c, "ph"), DLOCK_ELOST); /* the thread's */
    assert_int_equal(dlock_sem_acquire_handle(c, "ph", 2, 0, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_sem_acquire_handle(c, "ph", 0, 0, &h2), DLOCK_EINVAL);
    dlock_client_close(c);
}

typedef struct with_ctx {
    dlock_client *other;
    int ran, busy;
} with_ctx;

static void with_sem_body(void *arg)
{
    with_ctx *x = arg;
    x->ran = 1;
    x->busy = dlock_sem_acquire(x->other, "wp", 1, 0); /* the one permit is taken */
}

/* dlock_sem_with runs the function holding a permit and gives it back;
 * the permit guard gives it back at the end of its scope. */
static void test_with_and_guard_sem(void **state)
{
    (void)state;
    dlock_client *c = open_sem_client(0, 0), *other = open_sem_client(0, 0);
    with_ctx x = {.other = other};
    assert_int_equal(dlock_sem_with(c, "wp", 1, 0, with_sem_body, &x), DLOCK_OK);
    assert_int_equal(x.ran, 1);
    assert_int_equal(x.busy, DLOCK_EBUSY);
    assert_int_equal(permits_in_redis("wp"), 0);
    assert_int_equal(dlock_sem_with(c, "wp", 1, 0, NULL, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_sem_acquire(other, "wp", 1, 0), DLOCK_OK);
    x.ran = 0;
    assert_int_equal(dlock_sem_with(c, "wp", 1, 0, with_sem_body, &x), DLOCK_EBUSY);
    assert_int_equal(x.ran, 0); /* not run */
    assert_int_equal(dlock_sem_release(other, "wp"), DLOCK_OK);
    {
        DLOCK_GUARD(p);
        assert_int_equal(dlock_guard_sem_acquire(&p, c, "gp", 1, 0), DLOCK_OK);
        assert_int_equal(dlock_guard_sem_acquire(&p, c, "gq", 1, 0), DLOCK_EINVAL);
        assert_int_equal(dlock_held(c, "gp"), 1);
        assert_int_equal(permits_in_redis("gp"), 1);
        assert_int_equal(dlock_sem_acquire(other, "gp", 1, 0), DLOCK_EBUSY);
    }
    assert_int_equal(dlock_held(c, "gp"), 0);
    assert_int_equal(permits_in_redis("gp"), 0);
    assert_int_equal(dlock_sem_acquire(other, "gp", 1, 0), DLOCK_OK); /* free again */
    assert_int_equal(dlock_sem_release(other, "gp"), DLOCK_OK);
    dlock_client_close(c);
    dlock_client_close(other);
}

/* A waiting acquire stops on its cancel token and on a shutdown. */
static void test_cancel_and_shutdown(void **state)
{
    (void)state;
    dlock_client *a = open_sem_client(0, 0), *b = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(a, "stop", 1, 0), DLOCK_OK);
    dlock_cancel *k;
    assert_int_equal(dlock_cancel_create(&k), DLOCK_OK);
    taker t1, t2;
    taker_start_sem(&t1, b, "stop", 1, -1, NULL);
    let_it_wait();
    taker_start_sem(&t2, b, "stop", 1, -1, k); /* a second waiter of b, with a token */
    let_it_wait();
    dlock_cancel_fire(k);
    assert_int_equal(taker_got(&t2), DLOCK_ECANCELED);
    assert_false(taker_done(&t1));
    assert_int_equal(dlock_client_shutdown(b), DLOCK_OK);
    assert_int_equal(taker_got(&t1), DLOCK_ECLOSED);
    taker_finish(&t1);
    taker_finish(&t2);
    dlock_cancel_destroy(k);
    assert_int_equal(dlock_sem_release(a, "stop"), DLOCK_OK);
    dlock_client_close(b);
    assert_int_equal(permits_in_redis("stop"), 0);
    dlock_client_close(a);
}

/* Bad input: a NULL client or name, a limit of 0, a release of a permit
 * not held. */
static void test_bad_input(void **state)
{
    (void)state;
    assert_int_equal(dlock_sem_acquire(NULL, "x", 1, 0), DLOCK_EINVAL);
    assert_int_equal(dlock_sem_release(NULL, "x"), DLOCK_EINVAL);
    dlock_client *c = open_sem_client(0, 0);
    assert_int_equal(dlock_sem_acquire(c, NULL, 1, 0), DLOCK_EINVAL);
    assert_int_equal(dlock_sem_acquire(c, "x", 0, 0), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "limit"));
    assert_int_equal(dlock_sem_release(c, ""), DLOCK_EINVAL);
    assert_int_equal(dlock_sem_release(c, "x"), DLOCK_ENOTHELD);
    dlock_client_close(c);
}

/* A storm: clients x threads taking and giving back permits of one name;
 * never more holders than the limit at once, and none left after. */
enum { STORM_CLIENTS = 3, STORM_THREADS = 4, STORM_LIMIT = 3, STORM_MS = 2000 };
static int storm_in, storm_max, storm_over, storm_failed;
static long storm_ok;
static pthread_mutex_t storm_mu = PTHREAD_MUTEX_INITIALIZER;

static void *storm_main(void *arg)
{
    dlock_client *c = arg;
    long long end = fx_now_ns() + (long long)STORM_MS * 1000000;
    while (fx_now_ns() < end) {
        int rc = dlock_sem_acquire(c, "storm", STORM_LIMIT, 10000);
        if (rc != DLOCK_OK) {
            pthread_mutex_lock(&storm_mu);
            storm_failed++;
            fprintf(stderr, "storm: acquire: %s: %s\n", dlock_err_name(rc), dlock_last_error());
            pthread_mutex_unlock(&storm_mu);
            continue;
        }
        pthread_mutex_lock(&storm_mu);
        storm_in++;
        if (storm_in > storm_max)
            storm_max = storm_in;
        storm_over += storm_in > STORM_LIMIT;
        storm_ok++;
        pthread_mutex_unlock(&storm_mu);
        fx_sleep_ms(1);
        pthread_mutex_lock(&storm_mu);
        storm_in--;
        pthread_mutex_unlock(&storm_mu);
        rc = dlock_sem_release(c, "storm");
        if (rc != DLOCK_OK) {
            pthread_mutex_lock(&storm_mu);
            storm_failed++;
            fprintf(stderr, "storm: release: %s: %s\n", dlock_err_name(rc), dlock_last_error());
            pthread_mutex_unlock(&storm_mu);
        }
    }
    return NULL;
}

static void test_storm(void **state)
{
    (void)state;
    dlock_client *cs[STORM_CLIENTS];
    pthread_t th[STORM_CLIENTS][STORM_THREADS];
    for (int i = 0; i < STORM_CLIENTS; i++)
        cs[i] = open_sem_client(0, 0);
    for (int i = 0; i < STORM_CLIENTS; i++)
        for (int j = 0; j < STORM_THREADS; j++)
            assert_int_equal(pthread_create(&th[i][j], NULL, storm_main, cs[i]), 0);
    for (int i = 0; i < STORM_CLIENTS; i++)
        for (int j = 0; j < STORM_THREADS; j++)
            pthread_join(th[i][j], NULL);
    assert_int_equal(storm_over, 0);
    assert_int_equal(storm_failed, 0);
    assert_true(storm_max >= 1 && storm_max <= STORM_LIMIT);
    assert_true(storm_ok > 0);
    assert_int_equal(permits_in_redis("storm"), 0);
    uint64_t passes = 0;
    for (int i = 0; i < STORM_CLIENTS; i++) {
        passes += stats(cs[i]).sem_passes;
        dlock_client_close(cs[i]);
    }
    print_message("storm: %ld permits taken, most held at once %d, %llu passed locally\n",
                  storm_ok, storm_max, (unsigned long long)passes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_limit_across_clients, fx_ensure_server),
        cmocka_unit_test_teardown(test_pass_between_threads_costs_no_redis_command,
                                  fx_ensure_server),
        cmocka_unit_test_teardown(test_fifo_between_clients, fx_ensure_server),
        cmocka_unit_test_teardown(test_limit_mismatch, fx_ensure_server),
        cmocka_unit_test_teardown(test_lock_or_semaphore, fx_ensure_server),
        cmocka_unit_test_teardown(test_thread_exit_and_close, fx_ensure_server),
        cmocka_unit_test_teardown(test_lost_permits, fx_ensure_server),
        cmocka_unit_test_teardown(test_dead_client_frees_its_permit, fx_ensure_server),
        cmocka_unit_test_teardown(test_permit_handle, fx_ensure_server),
        cmocka_unit_test_teardown(test_with_and_guard_sem, fx_ensure_server),
        cmocka_unit_test_teardown(test_cancel_and_shutdown, fx_ensure_server),
        cmocka_unit_test_teardown(test_bad_input, fx_ensure_server),
        cmocka_unit_test_teardown(test_storm, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
