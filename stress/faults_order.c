/*
 * faults scenario on the order of a client's acquire attempts in Redis
 * (not with --sentinel or --cluster: it proxies the one redis-server):
 *   late_acquire   an acquire attempt delivered late by the fault proxy
 *                  (tests/support/proxy.h) never displaces the same client's
 *                  newer grant
 * The runner, its watchdog and the helpers are in faults.c (faults.h).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faults.h"
#include "proxy.h"

/* ------------------------------------------------------------------ */
/* 8. late_acquire                                                      */

/*
 * Client X reaches Redis through the fault proxy (tests/support/proxy.h), which runs
 * in a process of its own (a runner with a proxy thread could not fork
 * children that start threads under ThreadSanitizer) and is driven through
 * shared memory. Client Y connects directly.
 *   1. The proxy holds back the next request that names {late}: X's acquire
 *      attempt N. X's try fails (DLOCK_EREDIS after its 300 ms timeout); the
 *      renewal thread takes over attempt N as a give-back.
 *   2. X acquires again: attempt N2 is granted; X's thread holds the lock.
 *   3. Y waits for the lock (it is in the wait queue).
 *   4. The proxy delivers attempt N to Redis. X keeps holding for 3 s while
 *      the give-back of N runs (after 0, 100, 200, 400, 800 ms), and
 *      records the last time dlock_held() said 1; then X releases.
 * Y must be granted only after that last time, with a greater token; X's
 * release must return DLOCK_OK and on_lost must not run. Before attempts
 * were ordered in Redis, N re-granted X's lease in place and the give-back
 * of N deleted it: Y was granted while X still held (reproduced: a
 * double holder for about a second with lease_ms 6000).
 */
#define LA_LEASE_MS 6000
#define LA_COMMAND_MS 300
#define LA_HOLD_MS 3000

typedef struct la_proxy_sh {
    int port;      /* the proxy's port, set by the proxy process; -1: failed */
    int cmd;       /* runner -> proxy: 1 hold the next "{late}" request, 2 deliver it, 9 stop */
    int held;      /* proxy -> runner: the request is held */
    int released;  /* proxy -> runner: it was written to Redis */
} la_proxy_sh;

static la_proxy_sh *la_px;
static int la_lost;

static void la_proxy_child(void *arg)
{
    la_proxy_sh *px = arg;
    fx_proxy *p = fx_proxy_start(R.port);
    st_int(&px->port, p ? fx_proxy_port(p) : -1);
    if (!p)
        _exit(3);
    int done = 0;
    int64_t until = now_ns() + (int64_t)SCENARIO_TIMEOUT_S * 1000 * NS_PER_MS;
    while (!done && now_ns() < until) {
        int cmd = ld(&px->cmd);
        if (cmd == 1 && !ld(&px->held)) {
            fx_proxy_hold_next(p, "{late}");
            st_int(&px->cmd, 0);
        } else if (cmd == 2) {
            fx_proxy_release_held(p);
            if (fx_proxy_wait_released(p, 10000) == 0)
                st_int(&px->released, 1);
            st_int(&px->cmd, 0);
        } else if (cmd == 9) {
            done = 1;
        }
        if (fx_proxy_held(p))
            st_int(&px->held, 1);
        sleep_ms(1);
    }
    fx_proxy_stop(p);
    _exit(0);
}

static void la_on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_add_fetch(&la_lost, 1, __ATOMIC_RELAXED);
}

static void la_x(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.redis_unix_path = NULL; /* the proxy speaks TCP, also with --unix */
    cfg.redis_host = "127.0.0.1";
    cfg.redis_port = ld(&la_px->port);
    cfg.lease_ms = LA_LEASE_MS;
    cfg.command_timeout_ms = LA_COMMAND_MS;
    cfg.connect_timeout_ms = LA_COMMAND_MS;
    cfg.on_lost = la_on_lost;
    dlock_client *c = open_client(ps, &cfg);
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 20000))
        child_fail(ps, "X: never told that the proxy holds");
    uint64_t fence;
    int64_t t0 = now_ns();
    ps->rc[1] = dlock_acquire(c, "late", 0, &fence); /* attempt N, held back */
    ps->t[1] = now_ns() - t0;
    if (ps->rc[1] != DLOCK_EREDIS)
        child_fail(ps, "X: the held acquire returned %s, not DLOCK_EREDIS",
                   dlock_err_name(ps->rc[1]));
    ps->rc[2] = dlock_acquire(c, "late", 0, &fence); /* attempt N2 */
    if (ps->rc[2] != DLOCK_OK)
        child_fail(ps, "X: the second acquire: %s: %s", dlock_err_name(ps->rc[2]),
                   dlock_last_error());
    ps->fence[0] = fence;
    st_int(&ps->step, 2);
    if (!wait_go(ps, 2, 20000))
        child_fail(ps, "X: never told that the late attempt was delivered");
    int64_t until = now_ns() + LA_HOLD_MS * NS_PER_MS;
    int64_t last_held = 0;
    while (now_ns() < until) {
        if (dlock_held(c, "late"))
            last_held = now_ns();
        sleep_us(500);
    }
    ps->t[2] = last_held;
    ps->rc[3] = dlock_release(c, "late");
    ps->t[3] = now_ns();
    ps->lost_count = __atomic_load_n(&la_lost, __ATOMIC_RELAXED);
    st_int(&ps->step, 3);
    child_exit(c);
}

static void la_y(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.lease_ms = LA_LEASE_MS;
    dlock_client *c = open_client(ps, &cfg);
    st_int(&ps->step, 1);
    child_acquire(ps, c, "late", 20000, "Y");
    st_int(&ps->step, 2);
    ps->rc[1] = dlock_release(c, "late");
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_late_acquire(void)
{
    proc_sh *sh = shm_alloc(2 * sizeof *sh);
    la_px = shm_alloc(sizeof *la_px);
    if (!sh || !la_px)
        return fail("mmap failed");
    proc_sh *x = &sh[0], *y = &sh[1];
    char why[512], stx[64];
    int st = 0;

    phase = "starting the proxy";
    pid_t pp = start_child(la_proxy_child, la_px);
    if (pp < 0)
        return fail("fork failed");
    for (int i = 0; i < 5000 && ld(&la_px->port) == 0; i++)
        sleep_ms(1);
    if (ld(&la_px->port) <= 0)
        return fail("the proxy did not start");
    phase = "X opening";
    pid_t px = start_child(la_x, x);
    if (px < 0)
        return fail("fork failed");
    if (wait_step(x, 1, 10000) != 1)
        return fail("%s", child_why(x, px, "X", why, sizeof why));
    phase = "X's first attempt held back";
    st_int(&la_px->cmd, 1);
    for (int i = 0; i < 5000 && ld(&la_px->cmd) != 0; i++)
        sleep_ms(1);
    st_int(&x->go, 1);
    if (wait_step(x, 2, 10000) != 1)
        return fail("%s", child_why(x, px, "X", why, sizeof why));
    if (!ld(&la_px->held))
        return fail("the proxy did not hold X's first attempt");
    phase = "Y queueing";
    pid_t py = start_child(la_y, y);
    if (py < 0)
        return fail("fork failed");
    if (wait_step(y, 1, 10000) != 1)
        return fail("%s", child_why(y, py, "Y", why, sizeof why));
    long long q = -1;
    if (!wait_zcard(KEY_PREFIX "{late}:q", 1, 5000, &q))
        return fail("Y not in the wait queue within 5 s (ZCARD = %lld)", q);
    phase = "the late attempt delivered";
    int64_t t_late = now_ns();
    st_int(&la_px->cmd, 2);
    for (int i = 0; i < 10000 && !ld(&la_px->released); i++)
        sleep_ms(1);
    if (!ld(&la_px->released))
        return fail("the proxy did not deliver the held attempt");
    int64_t t_delivered = now_ns();
    st_int(&x->go, 2);
    if (wait_step(x, 3, LA_HOLD_MS + 10000) != 1 || !reap(px, 10000, &st))
        return fail("%s", child_why(x, px, "X", why, sizeof why));
    int st_y = 0;
    if (wait_step(y, 3, 15000) != 1 || !reap(py, 10000, &st_y))
        return fail("%s", child_why(y, py, "Y", why, sizeof why));
    st_int(&la_px->cmd, 9);
    reap(pp, 5000, NULL);

    int ok = 1;
    char extra[512] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    int64_t y_got = y->t[1], x_last = x->t[2];
    if (x_last == 0) {
        ok = 0;
        ADD("; X's dlock_held never said 1 after the late attempt");
    }
    if (y_got <= x_last) {
        ok = 0;
        ADD("; Y was granted %lld ms BEFORE X's holder stopped seeing dlock_held() == 1"
            " (two holders)", MS(x_last - y_got));
    }
    if (y->fence[0] <= x->fence[0]) {
        ok = 0;
        ADD("; Y's token is not above X's");
    }
    if (x->rc[3] != DLOCK_OK) {
        ok = 0;
        ADD("; X's release returned %s", dlock_err_name(x->rc[3]));
    }
    if (x->lost_count != 0) {
        ok = 0;
        ADD("; X's on_lost ran %d times", x->lost_count);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !WIFEXITED(st_y) || WEXITSTATUS(st_y) != 0) {
        ok = 0;
        ADD("; X %s, Y %s", status_text(st, stx, sizeof stx), status_text(st_y, why, 64));
    }
#undef ADD
    snprintf(res, sizeof res,
             "X's attempt held back, X's call failed in %lld ms, X re-acquired; the late"
             " attempt reached redis %lld ms later; X held on for %d ms (last dlock_held() == 1"
             " %lld ms after delivery), released %s; Y granted %lld ms after X's release, tokens"
             " %" PRIu64 " < %" PRIu64 "%s",
             MS(x->t[1]), MS(t_delivered - t_late), LA_HOLD_MS, MS(x_last - t_delivered),
             dlock_err_name(x->rc[3]), MS(y_got - x->t[3]), x->fence[0], y->fence[0], extra);
    return ok;
}
