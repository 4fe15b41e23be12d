/*
 * The faults scenario of Redlock mode only (--redlock: REDLOCK_NODES
 * independent redis-servers, seeded fresh by the runner):
 *   nodes_frozen  two of three nodes SIGSTOPped (no majority): every call
 *                 returns DLOCK_EREDIS, or DLOCK_ELOST once the lease is
 *                 lost, within its bound; a wait without end waits for the
 *                 nodes; after SIGCONT the calls work again
 * The runner, its watchdog and the helpers are in faults.c (faults.h).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "faults.h"

/* ------------------------------------------------------------------ */
/* nodes_frozen                                                         */

/*
 * A client (lease NF_LEASE_MS, connect NF_CONNECT_MS, command NF_COMMAND_MS:
 * connect + command well below lease/3, as docs/guide.md "Redlock" asks)
 * warms up (an acquire and release: a connection to every node), then holds
 * "h1" and "h2". The runner SIGSTOPs nodes 1 and 2: their kernels still
 * accept connections, nothing answers, and no majority (2 of 3) can be had.
 * The bounds are include/dlock.h's: a call that must open a connection
 * costs the connect timeout and a command timeout more than an exchange,
 * and in Redlock mode one exchange with the node set is bounded by one
 * deadline for all nodes (connect + 2 x command), not per node. The calls,
 * one after the other:
 *   1. release("h1") at once: the lease is still valid; the release reaches
 *      node 0 only: DLOCK_EREDIS within connect + 2 x command;
 *   2. acquire("a", NF_WAIT_MS): a waiting acquire that finds too few nodes
 *      tries again until its wait ends, then DLOCK_EREDIS: it returns after
 *      at least NF_WAIT_MS - lease/3 (its pause between tries is at most
 *      lease/3) and within NF_WAIT_MS + connect + 2 x command;
 *   3. acquire("b", 0), a try: DLOCK_EREDIS within connect + 3 x command;
 *   4. meanwhile a thread's acquire("w", -1): a wait without end waits for
 *      the nodes: it must not return while they are stopped;
 *   5. "h2": its validity ends unrenewed (no majority confirms a renewal):
 *      on_lost once, within a lease + one renewal period (lease/3) + one
 *      exchange (connect + 2 x command) of the stop; then dlock_held 0 and
 *      its release DLOCK_ELOST within connect + 2 x command.
 * Every bound gets NF_SLACK_MS for a loaded machine; the runner reports a
 * HANG if the calls are not done within the sum of the bounds + 2 s. After
 * SIGCONT: the thread's wait gets "w" within one exchange under way + a
 * lease (grants of its own earlier tries, sent before the stop and run by
 * the nodes when continued, end within a lease if the background give-back
 * has not removed them first) + lease/3 (the pause) + slack; a try of a
 * fresh name succeeds at once (first try, within connect + 3 x command +
 * slack), and both releases return DLOCK_OK.
 */
#define NF_LEASE_MS 3000
#define NF_CONNECT_MS 200
#define NF_COMMAND_MS 300
#define NF_WAIT_MS 2000
#define NF_SLACK_MS 1000
#define NF_EXCHANGE_MS (NF_CONNECT_MS + 2 * NF_COMMAND_MS)
#define NF_REL_BOUND (NF_EXCHANGE_MS + NF_SLACK_MS)
#define NF_ACQ_BOUND (NF_WAIT_MS + NF_EXCHANGE_MS + NF_SLACK_MS)
#define NF_ACQ_LOW (NF_WAIT_MS - NF_LEASE_MS / 3)
#define NF_TRY_BOUND (NF_CONNECT_MS + 3 * NF_COMMAND_MS + NF_SLACK_MS)
#define NF_LOST_BOUND (NF_LEASE_MS + NF_LEASE_MS / 3 + NF_EXCHANGE_MS + NF_SLACK_MS)
#define NF_WAITER_BOUND (NF_EXCHANGE_MS + NF_LEASE_MS + NF_LEASE_MS / 3 + NF_SLACK_MS)

/* Which step the client is in, for a HANG's report (ps->call). */
static const char *const nf_call[] = {
    "", "release(h1)", "acquire(a, " XSTR(NF_WAIT_MS) ")", "acquire(b, 0)",
    "waiting for on_lost(h2)", "release(h2)", "",
};

static void nf_on_lost(const char *name, uint64_t fence, void *arg)
{
    proc_sh *ps = arg;
    (void)fence;
    if (strcmp(name, "h2") != 0)
        return;
    if (__atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE) == 0)
        __atomic_store_n(&ps->lost_ns, now_ns(), __ATOMIC_RELAXED);
    __atomic_add_fetch(&ps->lost_count, 1, __ATOMIC_ACQ_REL);
}

typedef struct nf_waiter {
    dlock_client *c;
    proc_sh *ps;
} nf_waiter;

/* acquire("w", -1): brc[0] its result, bdur[0] when it returned
 * (CLOCK_MONOTONIC ns), brc[1] 1 once returned; brc[2] the release's. */
static void *nf_waiter_main(void *arg)
{
    nf_waiter *w = arg;
    uint64_t fence;
    int rc = dlock_acquire(w->c, "w", -1, &fence);
    w->ps->bdur[0] = now_ns();
    w->ps->brc[0] = rc;
    st_int(&w->ps->brc[1], 1);
    if (rc == DLOCK_OK) {
        if (!wait_go(w->ps, 2, 40000)) /* hold it until the nodes are back */
            return NULL;
        w->ps->brc[2] = dlock_release(w->c, "w");
    }
    return NULL;
}

/* A timed call: rc[i] its result, t[i] its duration. */
#define NF_TIMED(i, expr)                                                                      \
    do {                                                                                       \
        st_int(&ps->call, (i));                                                                \
        int64_t t0_ = now_ns();                                                                \
        ps->rc[(i)] = (expr);                                                                  \
        ps->t[(i)] = now_ns() - t0_;                                                           \
    } while (0)

static void nf_child(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.lease_ms = NF_LEASE_MS;
    cfg.connect_timeout_ms = NF_CONNECT_MS;
    cfg.command_timeout_ms = NF_COMMAND_MS;
    cfg.on_lost = nf_on_lost;
    cfg.on_lost_arg = ps;
    dlock_client *c = open_client(ps, &cfg);
    uint64_t fence;
    int rc = dlock_acquire(c, "warm", 2000, &fence);
    if (rc != DLOCK_OK)
        child_fail(ps, "warm-up acquire: %s: %s", dlock_err_name(rc), dlock_last_error());
    if ((rc = dlock_release(c, "warm")) != DLOCK_OK)
        child_fail(ps, "warm-up release: %s: %s", dlock_err_name(rc), dlock_last_error());
    child_acquire(ps, c, "h1", 2000, "the client (h1)");
    child_acquire(ps, c, "h2", 2000, "the client (h2)");
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 20000))
        child_fail(ps, "never told that the nodes are stopped");

    int64_t t_go = now_ns();
    ps->held[0] = dlock_held(c, "h1");
    NF_TIMED(1, dlock_release(c, "h1"));
    nf_waiter w = {.c = c, .ps = ps};
    pthread_t tid;
    int e = pthread_create(&tid, NULL, nf_waiter_main, &w);
    if (e)
        child_fail(ps, "pthread_create: %s", strerror(e));
    NF_TIMED(2, dlock_acquire(c, "a", NF_WAIT_MS, &fence));
    NF_TIMED(3, dlock_acquire(c, "b", 0, &fence));
    st_int(&ps->call, 4);
    while (__atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE) == 0 &&
           now_ns() < t_go + (int64_t)(NF_LOST_BOUND + 5000) * NS_PER_MS)
        sleep_ms(1);
    ps->held[1] = dlock_held(c, "h2");
    NF_TIMED(5, dlock_release(c, "h2"));
    snprintf(ps->err, sizeof ps->err, "%s", dlock_last_error());
    st_int(&ps->call, 6);
    st_int(&ps->step, 2);

    if (!wait_go(ps, 2, 40000))
        child_fail(ps, "never told that the nodes are continued");
    int64_t t_cont = now_ns();
    /* the thread's wait: NF_WAITER_BOUND + 5 s, then given up on */
    while (!ld(&ps->brc[1]) && now_ns() < t_cont + (int64_t)(NF_WAITER_BOUND + 5000) * NS_PER_MS)
        sleep_ms(1);
    if (!ld(&ps->brc[1]))
        child_fail(ps, "acquire(w, -1) still waiting %d ms after the nodes were continued",
                   NF_WAITER_BOUND + 5000);
    pthread_join(tid, NULL);
    NF_TIMED(6, dlock_acquire(c, "after", 0, &fence));
    if (ps->rc[6] != DLOCK_OK)
        snprintf(ps->err, sizeof ps->err, "%s", dlock_last_error());
    ps->rc[7] = ps->rc[6] == DLOCK_OK ? dlock_release(c, "after") : ps->rc[6];
    st_int(&ps->step, 3);
    child_exit(c);
}

/* Sends sig to nodes 1 and 2 (SIGSTOP: confirmed stopped). 0 or -1. */
static int nf_signal(int sig)
{
    for (int i = 1; i <= 2; i++) {
        fx_redis *n = redlock_node(i);
        if (!n || fx_redis_signal(n, sig) != 0)
            return -1;
        if (sig != SIGSTOP)
            continue;
        int stopped = 0;
        for (int64_t dl = now_ns() + 2000 * NS_PER_MS; !stopped && now_ns() < dl;) {
            int s;
            pid_t w = waitpid(n->pid, &s, WNOHANG | WUNTRACED);
            if (w == n->pid && WIFSTOPPED(s))
                stopped = 1;
            else
                sleep_ms(1);
        }
        if (!stopped)
            return -1;
    }
    return 0;
}

int sc_nodes_frozen(void)
{
    proc_sh *ps = shm_alloc(sizeof *ps);
    if (!ps)
        return fail("mmap failed");
    char why[512], stx[64];
    int st = 0;

    phase = "warming up";
    pid_t pid = start_child(nf_child, ps);
    if (pid < 0)
        return fail("fork failed");
    if (wait_step(ps, 1, 10000) != 1)
        return fail("%s", child_why(ps, pid, "the client", why, sizeof why));

    phase = "calls with nodes 1 and 2 stopped";
    int64_t t_stop = now_ns();
    if (nf_signal(SIGSTOP) != 0) {
        nf_signal(SIGCONT);
        return fail("could not SIGSTOP nodes 1 and 2");
    }
    st_int(&ps->go, 1);
    const long all = NF_REL_BOUND + NF_ACQ_BOUND + NF_TRY_BOUND + NF_LOST_BOUND + NF_REL_BOUND;
    int w = wait_step(ps, 2, all + 2000);
    int64_t t_calls = now_ns();
    int waiter_back = ld(&ps->brc[1]); /* before SIGCONT */
    int64_t t_cont = now_ns();
    nf_signal(SIGCONT);
    if (w != 1) {
        int call = ld(&ps->call);
        int gone = w == 0 && reap(pid, 0, &st);
        kill_kids();
        if (w < 0 || gone)
            return fail("%s", child_why(ps, 0, "the client", why, sizeof why));
        return fail("HANG: the client was still in call %d, %s, %lld ms after the nodes"
                    " stopped (the calls' bounds add up to %ld ms)",
                    call, call >= 1 && call <= 5 ? nf_call[call] : "?", MS(t_calls - t_stop), all);
    }
    phase = "calls after SIGCONT";
    st_int(&ps->go, 2);
    if (wait_step(ps, 3, NF_WAITER_BOUND + 15000) != 1 || !reap(pid, 10000, &st))
        return fail("%s", child_why(ps, pid, "the client after SIGCONT", why, sizeof why));

    int ok = 1;
    char extra[1024] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (ps->held[0] != 1 || ps->rc[1] != DLOCK_EREDIS || MS(ps->t[1]) > NF_REL_BOUND) {
        ok = 0;
        ADD("; release(h1) (dlock_held %d before) returned %s after %lld ms (want DLOCK_EREDIS"
            " within %d ms)", ps->held[0], dlock_err_name(ps->rc[1]), MS(ps->t[1]), NF_REL_BOUND);
    }
    if (ps->rc[2] != DLOCK_EREDIS || MS(ps->t[2]) > NF_ACQ_BOUND || MS(ps->t[2]) < NF_ACQ_LOW) {
        ok = 0;
        ADD("; acquire(a, %d) returned %s after %lld ms (want DLOCK_EREDIS after %d to %d ms)",
            NF_WAIT_MS, dlock_err_name(ps->rc[2]), MS(ps->t[2]), NF_ACQ_LOW, NF_ACQ_BOUND);
    }
    if (ps->rc[3] != DLOCK_EREDIS || MS(ps->t[3]) > NF_TRY_BOUND) {
        ok = 0;
        ADD("; acquire(b, 0) returned %s after %lld ms (want DLOCK_EREDIS within %d ms)",
            dlock_err_name(ps->rc[3]), MS(ps->t[3]), NF_TRY_BOUND);
    }
    if (waiter_back) {
        ok = 0;
        ADD("; acquire(w, -1) returned %s while the nodes were stopped (a wait without end"
            " waits for them)", dlock_err_name(ps->brc[0]));
    }
    int lost_n = __atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE);
    long long lost_ms = lost_n ? MS(ps->lost_ns - t_stop) : -1;
    if (lost_n != 1 || lost_ms > NF_LOST_BOUND) {
        ok = 0;
        ADD("; on_lost(h2) ran %d time(s), first %lld ms after the stop (want once within %d ms)",
            lost_n, lost_ms, NF_LOST_BOUND);
    }
    if (ps->held[1] != 0 || ps->rc[5] != DLOCK_ELOST || MS(ps->t[5]) > NF_REL_BOUND) {
        ok = 0;
        ADD("; after on_lost: dlock_held(h2) %d, release(h2) %s after %lld ms (want 0,"
            " DLOCK_ELOST within %d ms)%s%s", ps->held[1], dlock_err_name(ps->rc[5]),
            MS(ps->t[5]), NF_REL_BOUND, ps->rc[5] != DLOCK_ELOST ? ": " : "",
            ps->rc[5] != DLOCK_ELOST ? ps->err : "");
    }
    long long waiter_ms = MS(ps->bdur[0] - t_cont);
    if (ps->brc[0] != DLOCK_OK || waiter_ms > NF_WAITER_BOUND) {
        ok = 0;
        ADD("; acquire(w, -1) returned %s %lld ms after SIGCONT (want DLOCK_OK within %d ms)",
            dlock_err_name(ps->brc[0]), waiter_ms, NF_WAITER_BOUND);
    } else if (ps->brc[2] != DLOCK_OK) {
        ok = 0;
        ADD("; release(w) returned %s", dlock_err_name(ps->brc[2]));
    }
    if (ps->rc[6] != DLOCK_OK || MS(ps->t[6]) > NF_TRY_BOUND || ps->rc[7] != DLOCK_OK) {
        ok = 0;
        ADD("; after SIGCONT acquire(after, 0) returned %s after %lld ms (want DLOCK_OK within"
            " %d ms), its release %s%s%s", dlock_err_name(ps->rc[6]), MS(ps->t[6]),
            NF_TRY_BOUND, dlock_err_name(ps->rc[7]), ps->rc[6] != DLOCK_OK ? ": " : "",
            ps->rc[6] != DLOCK_OK ? ps->err : "");
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = 0;
        ADD("; client %s", status_text(st, stx, sizeof stx));
    }
#undef ADD
    snprintf(res, sizeof res,
             "nodes 1, 2 of 3 stopped: release(h1) %s in %lld ms (bound %d), acquire(a, %d) %s"
             " in %lld ms (%d..%d), acquire(b, 0) %s in %lld ms (bound %d), on_lost(h2) after"
             " %lld ms (bound %d), release(h2) %s in %lld ms, acquire(w, -1) %s;"
             " after SIGCONT acquire(w, -1) %s in %lld ms (bound %d), acquire(after, 0) %s in"
             " %lld ms; timeouts connect %d command %d, lease %d, slack %d%s",
             short_name(ps->rc[1]), MS(ps->t[1]), NF_REL_BOUND, NF_WAIT_MS, short_name(ps->rc[2]),
             MS(ps->t[2]), NF_ACQ_LOW, NF_ACQ_BOUND, short_name(ps->rc[3]), MS(ps->t[3]),
             NF_TRY_BOUND, lost_ms, NF_LOST_BOUND, short_name(ps->rc[5]), MS(ps->t[5]),
             waiter_back ? "had returned" : "still waiting", short_name(ps->brc[0]), waiter_ms, NF_WAITER_BOUND, short_name(ps->rc[6]),
             MS(ps->t[6]), NF_CONNECT_MS, NF_COMMAND_MS, NF_LEASE_MS, NF_SLACK_MS, extra);
    return ok;
}
