/*
 * faults scenarios whose faults are in the lock's holders and waiters (the
 * client processes), the three that also run with --sentinel and --cluster
 * (the first two with --redlock too):
 *   holder_killed   the holder is SIGKILLed; a queued waiter takes over
 *                   (Redlock: a polling one)
 *   holder_frozen   the holder is SIGSTOPped past its lease; it learns of
 *                   the loss (on_lost, dlock_held, ELOST) after SIGCONT
 *                   and its token is below its successor's
 *   waiter_killed   a queued waiter is SIGKILLed: the next waiter is
 *                   delayed at most about one waiter ttl
 * The runner, its watchdog and the helpers are in faults.c (faults.h).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "faults.h"

/* ------------------------------------------------------------------ */
/* 1. holder_killed                                                     */

/*
 * A acquires "k" and reports its token; B then waits for "k" (generous wait)
 * and is in the wait queue in Redis; the runner SIGKILLs A. A's lease runs
 * out at most lease_ms after its last renewal; B's poller retries every
 * waiter_ttl/4 and sooner when the lease is about to run out, so B should
 * have it within lease_ms + waiter_ttl/4 + a round trip of A's death. Bound:
 * lease_ms + waiter_ttl_ms + 3 s. The 3 s of slack cover a late poller
 * wake-up and a late B process on a loaded 2-core machine (sanitizer builds
 * included); a B that waited for its whole wait (20 s) or for the keys to be
 * cleaned up some other way would still be far outside.
 *
 * With --redlock a killed holder releases nothing, so no node wakes B: B
 * polls (its queue places are the nodes'). The runner
 * gives B's acquire HK_RL_START_MS to make its first try (refused) instead
 * of reading the queue. A's grant on each node ends at most lease_ms after
 * A's last renewal reached it, so before lease_ms after the kill; a refused
 * try of B is made again after the holder's lease time left that the nodes
 * reported, at most lease_ms/3 (less with the jitter), so B's next try after
 * the grants ended comes at most lease_ms/3 later, and takes one exchange.
 * Bound: lease_ms + lease_ms/3 + the same 3 s of slack.
 */
#define HK_SLACK_MS 3000
#define HK_RL_START_MS 300

static void hk_a(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    child_acquire(ps, c, "k", 5000, "A");
    ps->t[0] = now_ns();
    st_int(&ps->step, 1);
    sleep_ms(60000); /* until SIGKILLed */
    child_fail(ps, "A: not killed");
}

static void hk_b(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    ps->t[0] = now_ns();
    st_int(&ps->step, 1);
    child_acquire(ps, c, "k", 20000, "B");
    st_int(&ps->step, 2);
    ps->rc[1] = dlock_release(c, "k");
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_holder_killed(void)
{
    proc_sh *sh = shm_alloc(2 * sizeof *sh);
    if (!sh)
        return fail("mmap failed");
    proc_sh *a = &sh[0], *b = &sh[1];
    char why[512], st1[64];
    int st;
    const int rl = in_redlock();
    const long bound = LEASE_MS + (rl ? LEASE_MS / 3 : WAITER_TTL_MS) + HK_SLACK_MS;

    phase = "A acquiring";
    pid_t pa = start_child(hk_a, a);
    if (pa < 0)
        return fail("fork failed");
    if (wait_step(a, 1, 10000) != 1)
        return fail("%s", child_why(a, pa, "A", why, sizeof why));
    phase = "B queueing";
    pid_t pb = start_child(hk_b, b);
    if (pb < 0)
        return fail("fork failed");
    if (wait_step(b, 1, 10000) != 1)
        return fail("%s", child_why(b, pb, "B", why, sizeof why));
    long long q = -1;
    if (rl)
        sleep_ms(HK_RL_START_MS); /* (no queue to read: B polls) */
    else if (!wait_zcard(KEY_PREFIX "{k}:q", 1, 5000, &q))
        return fail("B not in the wait queue within 5 s (ZCARD " KEY_PREFIX "{k}:q = %lld)", q);

    phase = "B waiting after A was killed";
    int64_t t_kill = now_ns();
    kill(pa, SIGKILL);
    if (!reap(pa, 5000, &st))
        return fail("A did not die after SIGKILL");
    int w = wait_step(b, 2, 25000);
    int64_t t_seen = now_ns();
    if (w != 1)
        return fail("%s (%lld ms after A died)", child_why(b, pb, "B", why, sizeof why),
                    MS(t_seen - t_kill));
    if (wait_step(b, 3, 10000) != 1 || !reap(pb, 10000, &st))
        return fail("B did not finish within 10 s after it got the lock");

    long long got_ms = MS(b->t[1] - t_kill);
    uint64_t fa = a->fence[0], fb = b->fence[0];
    int ok = 1;
    char extra[512] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (b->t[1] < t_kill) {
        ok = 0;
        ADD("; B got the lock BEFORE A was killed (exclusion broken)");
    }
    if (got_ms > bound) {
        ok = 0;
        ADD("; over the bound of %ld ms = lease %d + %s %d + slack %d", bound, LEASE_MS,
            rl ? "lease/3 (the longest poll pause)" : "waiter ttl",
            rl ? LEASE_MS / 3 : WAITER_TTL_MS, HK_SLACK_MS);
    }
    if (fb <= fa) {
        ok = 0;
        ADD("; B's token is not above A's");
    }
    if (b->rc[1] != DLOCK_OK) {
        ok = 0;
        ADD("; B's release returned %s", dlock_err_name(b->rc[1]));
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        ok = 0;
        ADD("; B %s", status_text(st, st1, sizeof st1));
    }
#undef ADD
    snprintf(res, sizeof res,
             "B got the lock %lld ms after A died (bound %ld ms), %lld ms after it began to wait;"
             " fences %" PRIu64 " %s %" PRIu64 "%s",
             got_ms, bound, MS(b->t[1] - b->t[0]), fa, fa < fb ? "<" : ">=", fb, extra);
    return ok;
}

/* ------------------------------------------------------------------ */
/* 2. holder_frozen                                                     */

/*
 * A (with on_lost) acquires "f"; the runner SIGSTOPs A for 2.5 x lease_ms.
 * B, waiting meanwhile, must get "f" once A's lease has run out in Redis
 * (about lease_ms after A's last renewal), well before A is continued. After
 * SIGCONT, A's renewal thread runs at once (its period passed long ago) and
 * must find the lease lost (validity deadline passed, and the lease is B's
 * in Redis): on_lost once, with A's token, within lease_ms/3 (one renewal
 * period) + command timeout + 1 s of slack for a late wake-up of the
 * continued process; dlock_held 0 (also right after SIGCONT, before any
 * Redis answer: the deadline by the local clock has passed); A's release
 * returns DLOCK_ELOST and does not touch B's lease (B still holds it and
 * releases it with DLOCK_OK). With --redlock B polls instead of waiting in
 * a queue (at most lease_ms/3 apart), well within the freeze; the checks
 * are the same.
 */
#define HF_FREEZE_MS (LEASE_MS * 5 / 2)
#define HF_LOST_SLACK_MS 1000

static void hf_on_lost(const char *name, uint64_t fence, void *arg)
{
    proc_sh *ps = arg;
    if (strcmp(name, "f") != 0)
        return;
    if (__atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE) == 0) {
        ps->lost_fence = fence;
        __atomic_store_n(&ps->lost_ns, now_ns(), __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&ps->lost_count, 1, __ATOMIC_ACQ_REL);
}

static void hf_a(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    cfg.on_lost = hf_on_lost;
    cfg.on_lost_arg = ps;
    dlock_client *c = open_client(ps, &cfg);
    child_acquire(ps, c, "f", 5000, "A");
    st_int(&ps->step, 1);
    /* frozen in here; go = 1 once continued */
    if (!wait_go(ps, 1, 40000))
        child_fail(ps, "A: never told it was continued");
    ps->t[1] = now_ns();
    ps->held[0] = dlock_held(c, "f");
    int64_t deadline = now_ns() + 10000 * NS_PER_MS;
    while (__atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE) == 0 && now_ns() < deadline)
        sleep_ms(1);
    ps->t[2] = now_ns();
    ps->held[1] = dlock_held(c, "f");
    ps->rc[0] = dlock_release(c, "f");
    snprintf(ps->err, sizeof ps->err, "%s", ps->rc[0] != DLOCK_OK ? dlock_last_error() : "");
    sleep_ms(300); /* on_lost must not run again */
    ps->rc[1] = __atomic_load_n(&ps->lost_count, __ATOMIC_ACQUIRE);
    st_int(&ps->step, 2);
    child_exit(c);
}

static void hf_b(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 20000))
        child_fail(ps, "B: never told to acquire");
    ps->t[0] = now_ns();
    child_acquire(ps, c, "f", 10000, "B");
    st_int(&ps->step, 2);
    if (!wait_go(ps, 2, 40000))
        child_fail(ps, "B: never told to release");
    ps->held[0] = dlock_held(c, "f");
    ps->rc[1] = dlock_release(c, "f");
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_holder_frozen(void)
{
    proc_sh *sh = shm_alloc(2 * sizeof *sh);
    if (!sh)
        return fail("mmap failed");
    proc_sh *a = &sh[0], *b = &sh[1];
    char why[512], st1[64], st2[64];
    int sta = 0, stb = 0;
    const long lost_bound = LEASE_MS / 3 + COMMAND_MS + HF_LOST_SLACK_MS;

    phase = "A acquiring";
    pid_t pa = start_child(hf_a, a);
    if (pa < 0)
        return fail("fork failed");
    if (wait_step(a, 1, 10000) != 1)
        return fail("%s", child_why(a, pa, "A", why, sizeof why));
    pid_t pb = start_child(hf_b, b);
    if (pb < 0)
        return fail("fork failed");
    if (wait_step(b, 1, 10000) != 1)
        return fail("%s", child_why(b, pb, "B", why, sizeof why));

    phase = "A frozen";
    int64_t t_stop = now_ns();
    kill(pa, SIGSTOP);
    /* confirm the stop (WUNTRACED), bounded */
    int stopped = 0;
    for (int64_t dl = now_ns() + 2000 * NS_PER_MS; now_ns() < dl;) {
        int s;
        pid_t w = waitpid(pa, &s, WNOHANG | WUNTRACED);
        if (w == pa && WIFSTOPPED(s)) {
            stopped = 1;
            break;
        }
        sleep_ms(1);
    }
    if (!stopped)
        return fail("A did not stop within 2 s of SIGSTOP");
    st_int(&b->go, 1);
    sleep_until(t_stop + (int64_t)HF_FREEZE_MS * NS_PER_MS);
    int b_got = wait_step(b, 2, 0) == 1;
    int64_t t_cont = now_ns();
    kill(pa, SIGCONT);
    st_int(&a->go, 1);
    if (!b_got) {
        st_int(&b->go, 2);
        return fail("B had not acquired \"f\" %d ms after A was frozen (A's lease is %d ms): %s",
                    HF_FREEZE_MS, LEASE_MS, child_why(b, pb, "B", why, sizeof why));
    }

    phase = "A continued";
    int wa = wait_step(a, 2, 15000);
    st_int(&b->go, 2);
    if (wa != 1)
        return fail("%s", child_why(a, pa, "A (after SIGCONT)", why, sizeof why));
    if (wait_step(b, 3, 10000) != 1)
        return fail("%s", child_why(b, pb, "B (releasing)", why, sizeof why));
    if (!reap(pa, 10000, &sta) || !reap(pb, 10000, &stb))
        return fail("a child did not exit within 10 s");

    uint64_t fa = a->fence[0], fb = b->fence[0];
    int lost_n = a->rc[1];
    int64_t lost_ns = __atomic_load_n(&a->lost_ns, __ATOMIC_ACQUIRE);
    long long lost_ms = lost_n ? MS(lost_ns - t_cont) : -1;
    int ok = 1;
    char extra[768] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (lost_n != 1) {
        ok = 0;
        ADD("; on_lost ran %d times (want 1)", lost_n);
    }
    if (lost_n && lost_ms > lost_bound) {
        ok = 0;
        ADD("; on_lost over the bound of %ld ms = lease/3 %d + command %d + slack %d", lost_bound,
            LEASE_MS / 3, COMMAND_MS, HF_LOST_SLACK_MS);
    }
    if (lost_n && a->lost_fence != fa) {
        ok = 0;
        ADD("; on_lost got token %" PRIu64 ", A's is %" PRIu64, a->lost_fence, fa);
    }
    if (a->held[0] != 0 || a->held[1] != 0) {
        ok = 0;
        ADD("; A's dlock_held said %d right after SIGCONT and %d after on_lost (want 0, 0)",
            a->held[0], a->held[1]);
    }
    if (a->rc[0] != DLOCK_ELOST) {
        ok = 0;
        ADD("; A's release returned %s (want DLOCK_ELOST)%s%s", dlock_err_name(a->rc[0]),
            a->err[0] ? ": " : "", a->err);
    }
    if (fa >= fb) {
        ok = 0;
        ADD("; A's token is not below B's");
    }
    if (b->held[0] != 1 || b->rc[1] != DLOCK_OK) {
        ok = 0;
        ADD("; B after A's release: dlock_held %d, release %s (want 1, DLOCK_OK)", b->held[0],
            dlock_err_name(b->rc[1]));
    }
    if (!WIFEXITED(sta) || WEXITSTATUS(sta) || !WIFEXITED(stb) || WEXITSTATUS(stb)) {
        ok = 0;
        ADD("; A %s, B %s", status_text(sta, st1, sizeof st1), status_text(stb, st2, sizeof st2));
    }
#undef ADD
    snprintf(res, sizeof res,
             "A frozen %d ms; B got the lock %lld ms after A froze; after SIGCONT on_lost ran %d"
             " time(s), first %lld ms later (bound %ld ms), dlock_held %d then %d, release %s;"
             " fences %" PRIu64 " %s %" PRIu64 "%s",
             HF_FREEZE_MS, MS(b->t[1] - t_stop), lost_n, lost_ms, lost_bound, a->held[0],
             a->held[1], dlock_err_name(a->rc[0]), fa, fa < fb ? "<" : ">=", fb, extra);
    return ok;
}

/* ------------------------------------------------------------------ */
/* 5. waiter_killed                                                     */

/*
 * A holds "w"; B waits for it (in the wait queue: ZCARD dlock:{w}:q == 1)
 * and is SIGKILLed there; C then waits (ZCARD == 2: the dead B is still
 * first); A releases. The release grants B the lease directly, for B's
 * waiter ttl only, since B's deadline has not passed yet (B refreshed it at
 * most waiter_ttl_ms before it died); once that lease expires, C's next
 * retry (every waiter_ttl_ms/4) finds the lease free and C first in line.
 * So C has the lock within waiter_ttl_ms + waiter_ttl_ms/4 of the release,
 * plus 500 ms of slack for a late poller wake-up and a round trip on a
 * loaded machine: 400 + 100 + 500 = 1000 ms. Without the skip, C would wait
 * for its whole wait (10 s).
 */
#define WK_SLACK_MS 500

static void wk_a(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    child_acquire(ps, c, "w", 5000, "A");
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 40000))
        child_fail(ps, "A: never told to release");
    ps->t[0] = now_ns();
    ps->rc[0] = dlock_release(c, "w");
    ps->t[1] = now_ns();
    st_int(&ps->step, 2);
    child_exit(c);
}

static void wk_waiter(void *arg)
{
    proc_sh *ps = arg;
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    st_int(&ps->step, 1);
    if (!wait_go(ps, 1, 40000))
        child_fail(ps, "never told to wait");
    ps->t[0] = now_ns();
    child_acquire(ps, c, "w", 10000, "waiter");
    st_int(&ps->step, 2);
    ps->rc[1] = dlock_release(c, "w");
    st_int(&ps->step, 3);
    child_exit(c);
}

int sc_waiter_killed(void)
{
    proc_sh *sh = shm_alloc(3 * sizeof *sh);
    if (!sh)
        return fail("mmap failed");
    proc_sh *a = &sh[0], *b = &sh[1], *cc = &sh[2];
    char why[512], st1[64], st2[64];
    int sta = 0, stc = 0, stb = 0;
    const long bound = WAITER_TTL_MS + WAITER_TTL_MS / 4 + WK_SLACK_MS;

    phase = "A acquiring";
    pid_t pa = start_child(wk_a, a);
    if (pa < 0)
        return fail("fork failed");
    if (wait_step(a, 1, 10000) != 1)
        return fail("%s", child_why(a, pa, "A", why, sizeof why));
    pid_t pb = start_child(wk_waiter, b);
    pid_t pc = start_child(wk_waiter, cc);
    if (pb < 0 || pc < 0)
        return fail("fork failed");
    if (wait_step(b, 1, 10000) != 1)
        return fail("%s", child_why(b, pb, "B", why, sizeof why));
    if (wait_step(cc, 1, 10000) != 1)
        return fail("%s", child_why(cc, pc, "C", why, sizeof why));

    phase = "B queueing";
    st_int(&b->go, 1);
    long long q = -1;
    if (!wait_zcard(KEY_PREFIX "{w}:q", 1, 5000, &q))
        return fail("B not in the wait queue within 5 s (ZCARD " KEY_PREFIX "{w}:q = %lld)", q);
    int64_t t_bkill = now_ns();
    kill(pb, SIGKILL);
    if (!reap(pb, 5000, &stb))
        return fail("B did not die after SIGKILL");

    phase = "C queueing behind the dead B";
    st_int(&cc->go, 1);
    if (!wait_zcard(KEY_PREFIX "{w}:q", 2, 5000, &q))
        return fail("C not queued behind B within 5 s (ZCARD " KEY_PREFIX "{w}:q = %lld)", q);
    phase = "C waiting after A's release";
    st_int(&a->go, 1);
    if (wait_step(a, 2, 10000) != 1)
        return fail("%s", child_why(a, pa, "A (releasing)", why, sizeof why));
    if (wait_step(cc, 2, 15000) != 1)
        return fail("%s", child_why(cc, pc, "C", why, sizeof why));
    if (wait_step(cc, 3, 10000) != 1 || !reap(pa, 10000, &sta) || !reap(pc, 10000, &stc))
        return fail("a child did not finish within 10 s");

    long long after_rel = MS(cc->t[1] - a->t[0]);
    int ok = 1;
    char extra[512] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (a->rc[0] != DLOCK_OK) {
        ok = 0;
        ADD("; A's release returned %s", dlock_err_name(a->rc[0]));
    }
    if (cc->t[1] < a->t[0]) {
        ok = 0;
        ADD("; C got the lock BEFORE A released it (exclusion broken)");
    }
    if (after_rel > bound) {
        ok = 0;
        ADD("; over the bound of %ld ms = waiter ttl %d + ttl/4 %d + slack %d", bound,
            WAITER_TTL_MS, WAITER_TTL_MS / 4, WK_SLACK_MS);
    }
    if (cc->fence[0] <= a->fence[0]) {
        ok = 0;
        ADD("; C's token is not above A's");
    }
    if (cc->rc[1] != DLOCK_OK) {
        ok = 0;
        ADD("; C's release returned %s", dlock_err_name(cc->rc[1]));
    }
    if (!WIFEXITED(sta) || WEXITSTATUS(sta) || !WIFEXITED(stc) || WEXITSTATUS(stc)) {
        ok = 0;
        ADD("; A %s, C %s", status_text(sta, st1, sizeof st1), status_text(stc, st2, sizeof st2));
    }
#undef ADD
    snprintf(res, sizeof res,
             "C got the lock %lld ms after A's release (bound %ld ms), %lld ms after B was killed,"
             " %lld ms after it began to wait; fences %" PRIu64 " < %" PRIu64 "%s",
             after_rel, bound, MS(cc->t[1] - t_bkill), MS(cc->t[1] - cc->t[0]), a->fence[0],
             cc->fence[0], extra);
    return ok;
}
