/*
 * faults scenarios whose faults are in the one redis-server (not with
 * --sentinel or --cluster):
 *   redis_frozen        Redis SIGSTOPped: every call returns DLOCK_EREDIS
 *                       within connect + 2 x command timeout; works after
 *   started_redis_down  a client opened while Redis is down works once
 *                       Redis is up
 *   signal_storm        Redis SIGSTOPped and a signal every 10 ms to the
 *                       calling thread: calls still fail within their bound
 * redis_restarted is in faults_restart.c; the runner, its watchdog and the
 * helpers are in faults.c (faults.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "faults.h"

/* ------------------------------------------------------------------ */
/* 4. redis_frozen                                                      */

/*
 * A client that holds nothing (after one warm-up acquire and release, so
 * its connections exist) while the runner SIGSTOPs Redis: the kernel still
 * accepts connections, nothing answers. Each call must return DLOCK_EREDIS
 * within what include/dlock.h states: connect timeout + two command
 * timeouts (one of them spent waiting for a free connection while all are
 * stuck) = 300 + 2 x 500 = 1300 ms, plus 1000 ms of slack for scheduling on
 * a loaded machine. That is far below the 5 s the calls are allowed to wait,
 * and one call waits forever (wait_ms -1): a call that waited for the lock
 * rather than failing would be caught. The calls:
 *   1. acquire("a", 5000)      2. acquire("b", 0) (a try)
 *   3. acquire("a", -1)        4. release("c") (never held): DLOCK_ENOTHELD
 *      at once, no Redis involved
 *   5. 12 threads at once with pool_size 4: 8 on distinct names and 4 on one
 *      name (a poller and the threads behind it, which fail with it)
 * After SIGCONT an acquire succeeds (the first try, within 2 s).
 */
#define RF_SLACK_MS 1000
#define RF_BURST 12
#define RF_AFTER_BOUND_MS 2000

typedef struct rf_targ {
    dlock_client *c;
    proc_sh *ps;
    int i;
    pthread_t tid;
} rf_targ;

static void *rf_burst_main(void *arg)
{
    rf_targ *ta = arg;
    char name[16];
    if (ta->i < 8)
        snprintf(name, sizeof name, "d%d", ta->i);
    else
        snprintf(name, sizeof name, "same");
    uint64_t fence;
    int64_t t0 = now_ns();
    ta->ps->brc[ta->i] = dlock_acquire(ta->c, name, 5000, &fence);
    ta->ps->bdur[ta->i] = now_ns() - t0;
    if (ta->ps->brc[ta->i] == DLOCK_OK)
        dlock_release(ta->c, name);
    return NULL;
}

static void rf_child(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.connect_timeout_ms = FROZEN_CONNECT_MS;
    cfg.command_timeout_ms = FROZEN_COMMAND_MS;
    cfg.pool_size = 4;
    dlock_client *c = open_client(ps, &cfg);
    uint64_t fence;
    int rc = dlock_acquire(c, "warm", 2000, &fence);
    if (rc != DLOCK_OK)
        child_fail(ps, "warm-up acquire: %s: %s", dlock_err_name(rc), dlock_last_error());
    rc = dlock_release(c, "warm");
    if (rc != DLOCK_OK)
        child_fail(ps, "warm-up release: %s: %s", dlock_err_name(rc), dlock_last_error());
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 20000))
        child_fail(ps, "never told that redis is frozen");

    int64_t t0;
    st_int(&ps->call, 1);
    t0 = now_ns();
    ps->rc[1] = dlock_acquire(c, "a", 5000, &fence);
    ps->t[1] = now_ns() - t0;
    st_int(&ps->call, 2);
    t0 = now_ns();
    ps->rc[2] = dlock_acquire(c, "b", 0, &fence);
    ps->t[2] = now_ns() - t0;
    st_int(&ps->call, 3);
    t0 = now_ns();
    ps->rc[3] = dlock_acquire(c, "a", -1, &fence);
    ps->t[3] = now_ns() - t0;
    st_int(&ps->call, 4);
    t0 = now_ns();
    ps->rc[4] = dlock_release(c, "c");
    ps->t[4] = now_ns() - t0;
    st_int(&ps->call, 5);
    rf_targ ta[RF_BURST];
    for (int i = 0; i < RF_BURST; i++) {
        ta[i] = (rf_targ){ .c = c, .ps = ps, .i = i };
        int e = pthread_create(&ta[i].tid, NULL, rf_burst_main, &ta[i]);
        if (e)
            child_fail(ps, "pthread_create: %s", strerror(e));
    }
    for (int i = 0; i < RF_BURST; i++)
        pthread_join(ta[i].tid, NULL);
    st_int(&ps->call, 6);
    st_int(&ps->step, 2);

    if (!wait_go(ps, 2, 20000))
        child_fail(ps, "never told that redis is continued");
    /* up to 5 s of tries; the runner wants the first to succeed */
    int64_t start = now_ns(), deadline = start + 5000 * NS_PER_MS;
    int tries = 0;
    for (;;) {
        tries++;
        rc = dlock_acquire(c, "a", 5000, &fence);
        if (rc == DLOCK_OK || now_ns() >= deadline)
            break;
        if (tries == 1)
            snprintf(ps->err, sizeof ps->err, "first acquire after SIGCONT: %s: %s",
                     dlock_err_name(rc), dlock_last_error());
        sleep_ms(100);
    }
    ps->t[5] = now_ns() - start;
    ps->rc[5] = rc;
    ps->rc[6] = tries;
    ps->rc[7] = rc == DLOCK_OK ? dlock_release(c, "a") : rc;
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_redis_frozen(void)
{
    proc_sh *ps = shm_alloc(sizeof *ps);
    if (!ps)
        return fail("mmap failed");
    char why[512], stx[64];
    int st = 0;
    const long bound = FROZEN_CONNECT_MS + 2 * FROZEN_COMMAND_MS + RF_SLACK_MS;
    static const char *const call_name[] = {
        "", "acquire(a, 5000)", "acquire(b, 0)", "acquire(a, -1)", "release(c)",
        "12 concurrent acquires", "",
    };

    phase = "warming up";
    pid_t pid = start_child(rf_child, ps);
    if (pid < 0)
        return fail("fork failed");
    if (wait_step(ps, 1, 10000) != 1)
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));

    phase = "calls with redis frozen";
    if (fx_redis_signal(&R, SIGSTOP) != 0)
        return fail("could not SIGSTOP redis-server");
    int64_t t_stop = now_ns();
    st_int(&ps->go, 1);
    /* 4 calls that may each take a bound, then the burst (one bound):
     * 5 bounds + 2 s, after which the client is stuck in one call */
    int w = wait_step(ps, 2, 5 * bound + 2000);
    int64_t t_calls = now_ns();
    fx_redis_signal(&R, SIGCONT);
    if (w != 1) {
        int call = ld(&ps->call);
        int gone = 0;
        if (w == 0 && reap(pid, 0, &st))
            gone = 1;
        kill_kids();
        if (w < 0 || gone)
            return fail("%s", child_why(ps, 0, "the client", why, sizeof why));
        return fail("HANG: the client was still in call %d, %s, %lld ms after redis froze"
                    " (bound per call %ld ms)", call,
                    call >= 1 && call <= 5 ? call_name[call] : "?", MS(t_calls - t_stop), bound);
    }
    phase = "acquire after SIGCONT";
    st_int(&ps->go, 2);
    if (wait_step(ps, 3, 15000) != 1 || !reap(pid, 10000, &st))
        return fail("%s", child_why(ps, pid, "the client after SIGCONT", why, sizeof why));

    int ok = 1;
    char extra[1024] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    long long max_burst = 0;
    for (int i = 1; i <= 3; i++) {
        long long ms = MS(ps->t[i]);
        if (ps->rc[i] != DLOCK_EREDIS || ms > bound) {
            ok = 0;
            ADD("; %s returned %s after %lld ms", call_name[i], dlock_err_name(ps->rc[i]), ms);
        }
    }
    if (ps->rc[4] != DLOCK_ENOTHELD || MS(ps->t[4]) > 200) {
        ok = 0;
        ADD("; release(c) returned %s after %lld ms (want DLOCK_ENOTHELD at once)",
            dlock_err_name(ps->rc[4]), MS(ps->t[4]));
    }
    int burst_bad = 0;
    for (int i = 0; i < RF_BURST; i++) {
        long long ms = MS(ps->bdur[i]);
        if (ms > max_burst)
            max_burst = ms;
        if (ps->brc[i] != DLOCK_EREDIS || ms > bound) {
            if (!burst_bad++)
                ADD("; concurrent acquire %d (%s) returned %s after %lld ms", i,
                    i < 8 ? "own name" : "shared name", dlock_err_name(ps->brc[i]), ms);
            ok = 0;
        }
    }
    if (burst_bad > 1)
        ADD(" (%d of %d concurrent calls wrong)", burst_bad, RF_BURST);
    if (ps->rc[5] != DLOCK_OK || ps->rc[6] != 1 || MS(ps->t[5]) > RF_AFTER_BOUND_MS) {
        ok = 0;
        ADD("; after SIGCONT: %s after %d tries and %lld ms (want the first try to succeed"
            " within %d ms)%s%s", dlock_err_name(ps->rc[5]), ps->rc[6], MS(ps->t[5]),
            RF_AFTER_BOUND_MS, ps->err[0] ? "; " : "", ps->err);
    }
    if (ps->rc[7] != DLOCK_OK) {
        ok = 0;
        ADD("; release after SIGCONT returned %s", dlock_err_name(ps->rc[7]));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = 0;
        ADD("; client %s", status_text(st, stx, sizeof stx));
    }
#undef ADD
    snprintf(res, sizeof res,
             "with redis frozen: acquire(a, 5000) %s in %lld ms, acquire(b, 0) %s in %lld ms,"
             " acquire(a, -1) %s in %lld ms, release(c) %s in %lld ms; 12 concurrent acquires"
             " (pool 4) all failed within %lld ms; bound %ld ms = connect %d + 2 x command %d +"
             " slack %d; after SIGCONT the acquire succeeded in %lld ms (try %d)%s",
             dlock_err_name(ps->rc[1]), MS(ps->t[1]), dlock_err_name(ps->rc[2]), MS(ps->t[2]),
             dlock_err_name(ps->rc[3]), MS(ps->t[3]), dlock_err_name(ps->rc[4]), MS(ps->t[4]),
             max_burst, bound, FROZEN_CONNECT_MS, FROZEN_COMMAND_MS, RF_SLACK_MS, MS(ps->t[5]),
             ps->rc[6], extra);
    return ok;
}

/* ------------------------------------------------------------------ */
/* 6. started_redis_down                                                */

/*
 * Redis is started (for a port), then SIGKILLed (fx_redis_signal, which
 * keeps the port and directory for fx_redis_restart; fx_redis_stop would
 * remove them). A child opens a client: DLOCK_OK (an unreachable Redis is
 * not an error there). Its acquire fails with DLOCK_EREDIS quickly: within
 * connect + 2 x command timeouts + 1 s of slack (a refused connection
 * should fail at once). The runner restarts Redis on that port; the child
 * retries an acquire every 100 ms for up to 10 s. The first success must
 * come within 100 ms (the retry period) + connect + 2 x command (a try that
 * began just before Redis answered) + 1 s of slack of Redis answering PING.
 * Then three more acquire/release pairs on two names must all succeed, and
 * every failed try before must have been DLOCK_EREDIS.
 */
#define SD_SLACK_MS 1000
#define SD_RETRY_MS 100

static void sd_child(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.connect_timeout_ms = FROZEN_CONNECT_MS;
    cfg.command_timeout_ms = FROZEN_COMMAND_MS;
    dlock_client *c = NULL;
    int64_t t0 = now_ns();
    ps->rc[0] = dlock_client_open(&cfg, &c);
    ps->t[0] = now_ns() - t0;
    if (ps->rc[0] != DLOCK_OK)
        child_fail(ps, "dlock_client_open: %s: %s", dlock_err_name(ps->rc[0]), dlock_last_error());
    uint64_t fence;
    t0 = now_ns();
    ps->rc[1] = dlock_acquire(c, "s", 1000, &fence);
    ps->t[1] = now_ns() - t0;
    snprintf(ps->err, sizeof ps->err, "%s", dlock_last_error());
    st_int(&ps->step, 1);
    if (ps->rc[1] == DLOCK_OK)
        dlock_release(c, "s");
    /* retry every 100 ms for up to 10 s */
    int64_t deadline = now_ns() + 10000 * NS_PER_MS;
    int tries = 0, rc;
    unsigned seen = 0; /* bit -rc for each failure code */
    for (;;) {
        tries++;
        rc = dlock_acquire(c, "s", 1000, &fence);
        if (rc == DLOCK_OK)
            break;
        if (-rc > 0 && -rc < 32)
            seen |= 1u << -rc;
        if (now_ns() >= deadline)
            break;
        sleep_ms(SD_RETRY_MS);
    }
    ps->t[2] = now_ns();
    ps->rc[2] = rc;
    ps->rc[3] = tries;
    ps->rc[4] = (int)seen;
    if (rc != DLOCK_OK)
        child_fail(ps, "no acquire succeeded within 10 s (%d tries, last %s: %s)", tries,
                   dlock_err_name(rc), dlock_last_error());
    int more_ok = dlock_release(c, "s") == DLOCK_OK;
    for (int i = 0; i < 3; i++) {
        const char *n = i % 2 ? "s2" : "s";
        more_ok = more_ok && dlock_acquire(c, n, 2000, &fence) == DLOCK_OK;
        more_ok = more_ok && dlock_release(c, n) == DLOCK_OK;
    }
    ps->rc[5] = more_ok;
    if (!more_ok)
        snprintf(ps->err, sizeof ps->err, "%s", dlock_last_error());
    st_int(&ps->step, 2);
    child_exit(c);
}

int sc_started_redis_down(void)
{
    proc_sh *ps = shm_alloc(sizeof *ps);
    if (!ps)
        return fail("mmap failed");
    char why[512], stx[64];
    int st = 0;
    const long down_bound = FROZEN_CONNECT_MS + 2 * FROZEN_COMMAND_MS + SD_SLACK_MS;
    const long up_bound = SD_RETRY_MS + FROZEN_CONNECT_MS + 2 * FROZEN_COMMAND_MS + SD_SLACK_MS;

    phase = "stopping redis";
    if (fx_redis_signal(&R, SIGKILL) != 0)
        return fail("could not SIGKILL redis-server");
    int port = R.port;
    phase = "client with redis down";
    pid_t pid = start_child(sd_child, ps);
    if (pid < 0)
        return fail("fork failed");
    if (wait_step(ps, 1, 10000) != 1)
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));
    phase = "restarting redis";
    int64_t t_restart = now_ns();
    if (fx_redis_restart(&R) != 0)
        return fail("could not restart redis-server on port %d", port);
    int64_t t_up = now_ns();
    phase = "client retrying";
    if (wait_step(ps, 2, 15000) != 1 || !reap(pid, 10000, &st))
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));

    long long up_ms = MS(ps->t[2] - t_up);
    int ok = 1;
    char extra[768] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (ps->rc[1] != DLOCK_EREDIS || MS(ps->t[1]) > down_bound) {
        ok = 0;
        ADD("; the acquire with redis down returned %s after %lld ms (want DLOCK_EREDIS within"
            " %ld ms)", dlock_err_name(ps->rc[1]), MS(ps->t[1]), down_bound);
    }
    if (up_ms > up_bound) {
        ok = 0;
        ADD("; first success over the bound of %ld ms = retry %d + connect %d + 2 x command %d +"
            " slack %d", up_bound, SD_RETRY_MS, FROZEN_CONNECT_MS, FROZEN_COMMAND_MS, SD_SLACK_MS);
    }
    unsigned seen = (unsigned)ps->rc[4] & ~(1u << -DLOCK_EREDIS);
    if (seen) {
        ok = 0;
        ADD("; failed tries returned codes other than DLOCK_EREDIS:");
        for (int i = 1; i < 32; i++)
            if (seen & (1u << i))
                ADD(" %s", dlock_err_name(-i));
    }
    if (!ps->rc[5]) {
        ok = 0;
        ADD("; a later acquire/release failed: %s", ps->err);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = 0;
        ADD("; client %s", status_text(st, stx, sizeof stx));
    }
#undef ADD
    snprintf(res, sizeof res,
             "open with redis down %s in %lld ms; acquire %s in %lld ms (\"%s\"); redis up on port"
             " %d after %lld ms of restart; first acquire success %lld ms after redis answered"
             " (bound %ld ms, %d tries); 3 more acquire/release pairs %s%s",
             dlock_err_name(ps->rc[0]), MS(ps->t[0]), dlock_err_name(ps->rc[1]), MS(ps->t[1]),
             ps->rc[1] == DLOCK_EREDIS ? ps->err : "", port, MS(t_up - t_restart), up_ms,
             up_bound, ps->rc[3], ps->rc[5] ? "ok" : "FAILED", extra);
    return ok;
}

/* ------------------------------------------------------------------ */
/* 7. signal_storm                                                      */

/*
 * A client process holds "held"; the runner freezes Redis (SIGSTOP); the
 * client's main thread then receives a SIGUSR1 (handler installed with
 * SA_RESTART, like an interval timer or a sampling profiler) every 10 ms
 * from another thread for up to 6 s, while it calls acquire("a", 5000),
 * acquire("b", 0) and release("held"). Each must fail with DLOCK_EREDIS
 * within connect + 2 x command timeout + 1 s of slack (the bound of
 * redis_frozen): a call whose timeout started over after every signal would
 * not return until the signals stop. After SIGCONT an acquire succeeds.
 */
#define SS_SLACK_MS 1000
#define SS_PERIOD_MS 10
#define SS_STORM_MS 6000

static volatile sig_atomic_t ss_delivered;

static void ss_on_usr1(int sig)
{
    (void)sig;
    ss_delivered++;
}

typedef struct ss_storm {
    pthread_t tid, target;
    int stop;
} ss_storm;

static void *ss_storm_main(void *arg)
{
    ss_storm *st = arg;
    int64_t until = now_ns() + SS_STORM_MS * NS_PER_MS;
    while (!ld(&st->stop) && now_ns() < until) {
        pthread_kill(st->target, SIGUSR1);
        sleep_ms(SS_PERIOD_MS);
    }
    return NULL;
}

static void ss_child(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.connect_timeout_ms = FROZEN_CONNECT_MS;
    cfg.command_timeout_ms = FROZEN_COMMAND_MS;
    dlock_client *c = open_client(ps, &cfg);
    child_acquire(ps, c, "held", 2000, "client");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ss_on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 20000))
        child_fail(ps, "never told that redis is frozen");

    ss_storm st = {.target = pthread_self()};
    int e = pthread_create(&st.tid, NULL, ss_storm_main, &st);
    if (e)
        child_fail(ps, "pthread_create: %s", strerror(e));
    uint64_t fence;
    int64_t t0 = now_ns();
    ps->rc[1] = dlock_acquire(c, "a", 5000, &fence);
    ps->t[1] = now_ns() - t0;
    t0 = now_ns();
    ps->rc[2] = dlock_acquire(c, "b", 0, &fence);
    ps->t[2] = now_ns() - t0;
    t0 = now_ns();
    ps->rc[3] = dlock_release(c, "held");
    ps->t[3] = now_ns() - t0;
    ps->rc[4] = (int)ss_delivered;
    st_int(&st.stop, 1);
    pthread_join(st.tid, NULL);
    st_int(&ps->step, 2);

    if (!wait_go(ps, 2, 20000))
        child_fail(ps, "never told that redis is continued");
    t0 = now_ns();
    ps->rc[5] = dlock_acquire(c, "a", 5000, &fence);
    ps->t[5] = now_ns() - t0;
    ps->rc[6] = ps->rc[5] == DLOCK_OK ? dlock_release(c, "a") : ps->rc[5];
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_signal_storm(void)
{
    proc_sh *ps = shm_alloc(sizeof *ps);
    if (!ps)
        return fail("mmap failed");
    char why[512], stx[64];
    int st = 0;
    const long bound = FROZEN_CONNECT_MS + 2 * FROZEN_COMMAND_MS + SS_SLACK_MS;
    static const char *const call_name[] = {"", "acquire(a, 5000)", "acquire(b, 0)",
                                            "release(held)"};
    phase = "warming up";
    pid_t pid = start_child(ss_child, ps);
    if (pid < 0)
        return fail("fork failed");
    if (wait_step(ps, 1, 10000) != 1)
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));
    phase = "calls with redis frozen under a signal storm";
    if (fx_redis_signal(&R, SIGSTOP) != 0)
        return fail("could not SIGSTOP redis-server");
    st_int(&ps->go, 1);
    /* Three calls of one bound each; the storm itself lasts 6 s. */
    int w = wait_step(ps, 2, 3 * bound + SS_STORM_MS + 2000);
    fx_redis_signal(&R, SIGCONT);
    if (w != 1)
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));
    phase = "acquire after SIGCONT";
    st_int(&ps->go, 2);
    if (wait_step(ps, 3, 15000) != 1 || !reap(pid, 10000, &st))
        return fail("%s", child_why(ps, pid, "the client after SIGCONT", why, sizeof why));

    int ok = 1;
    char extra[512] = "";
    size_t el = 0;
    for (int i = 1; i <= 3; i++) {
        if (ps->rc[i] != DLOCK_EREDIS || MS(ps->t[i]) > bound) {
            ok = 0;
            el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0,
                                   "; %s returned %s after %lld ms", call_name[i],
                                   dlock_err_name(ps->rc[i]), MS(ps->t[i]));
        }
    }
    if (ps->rc[4] < 10) {
        ok = 0;
        el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0,
                               "; only %d signals were delivered during the calls", ps->rc[4]);
    }
    if (ps->rc[5] != DLOCK_OK || ps->rc[6] != DLOCK_OK) {
        ok = 0;
        el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0,
                               "; after SIGCONT: acquire %s, release %s",
                               dlock_err_name(ps->rc[5]), dlock_err_name(ps->rc[6]));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = 0;
        el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0,
                               "; client %s", status_text(st, stx, sizeof stx));
    }
    snprintf(res, sizeof res,
             "redis frozen, SIGUSR1 every %d ms to the calling thread (%d delivered during the"
             " calls): acquire(a, 5000) %s in %lld ms, acquire(b, 0) %s in %lld ms,"
             " release(held) %s in %lld ms; bound %ld ms = connect %d + 2 x command %d + slack"
             " %d; after SIGCONT acquire %s in %lld ms%s",
             SS_PERIOD_MS, ps->rc[4], dlock_err_name(ps->rc[1]), MS(ps->t[1]),
             dlock_err_name(ps->rc[2]), MS(ps->t[2]), dlock_err_name(ps->rc[3]), MS(ps->t[3]),
             bound, FROZEN_CONNECT_MS, FROZEN_COMMAND_MS, SS_SLACK_MS,
             dlock_err_name(ps->rc[5]), MS(ps->t[5]), extra);
    return ok;
}
