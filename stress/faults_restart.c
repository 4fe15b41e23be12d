/*
 * The faults scenario redis_restarted (not with --sentinel or --cluster): a
 * 3 x 8 thread storm on 2 names while Redis is SIGKILLed and restarted
 * empty; no exclusion violation between holders whose lease was valid, no
 * token regression, no hang, the storm recovers, errors only DLOCK_EREDIS.
 * The runner, its watchdog and the helpers are in faults.c (faults.h).
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
/* 3. redis_restarted                                                   */

/*
 * 3 processes x 8 threads storm 2 names for 8 s (bounded waits of 2 s,
 * 200 us critical sections, 1 ms between acquisitions). 2 s in, the runner
 * SIGKILLs Redis and restarts it (empty: no persistence) 1 s later.
 *
 * Every critical section is logged: when acquire was called (t_call), when
 * it returned (t_ret), the end of the section (t_out, taken just before a
 * final dlock_held), the token and that dlock_held. dlock_held 1 at t_out
 * proves the lease valid over all of [t_ret, t_out]. Checks, afterwards:
 *  - exclusion: two sections of one name whose [t_ret, t_out] intersect,
 *    both proven valid, are a violation. Overlaps where a holder had lost
 *    its lease (dlock_held 0 at the end: the restarted Redis forgot the
 *    lease) are counted, not failed: without persistence a restart really
 *    does lose leases, and the library reports it (dlock_held, ELOST);
 *  - occupancy: the live count of holders per name; its overlaps must be
 *    explained by sections that lost their lease (at least one of the two
 *    overlapping sections ended not held);
 *  - lost updates: a per-name counter incremented non-atomically across each
 *    section; sum of counters == acquisitions, or the difference is at most
 *    the number of overlaps seen (each overlap loses at most one update);
 *  - tokens: if section Y's acquire returned before section X's acquire was
 *    called, X's token must exceed Y's. This is causal, so it holds across
 *    the restart (tokens come from server time) and needs no qualification;
 *  - every process exits within its bound (no hang); acquire errors are
 *    only DLOCK_EREDIS and DLOCK_ETIMEDOUT; acquisitions happen after the
 *    restart, in every process.
 * Sections of 200 us rarely span the outage, so leases would seldom be lost
 * for real. To make sure they are: a section that begins in the 300 ms
 * before the (pre-announced) kill lasts until 1.5 s after it ("straddling").
 * Its lease cannot survive: no renewal succeeds while Redis is down (1 s,
 * longer than the lease's validity of lease_ms minus drift after the last
 * renewal sent before the kill), and the restarted Redis has forgotten it.
 * So each straddling section must end with dlock_held 0 and its release
 * must return DLOCK_ELOST; meanwhile other processes get the name from the
 * new Redis and overlap it, which the checks above must accept.
 */
#define RR_PROCS 3
#define RR_THREADS 8
#define RR_NAMES 2
#define RR_SECONDS 8
#define RR_KILL_AT_MS 2000
#define RR_DOWN_MS 1000
#define RR_WAIT_MS 2000
#define RR_CS_US 200
#define RR_THINK_US 1000
#define RR_CAP 16384       /* logged sections per thread */
#define RR_EXIT_GRACE_S 20 /* processes must exit this long after the run's end */
#define RR_STRADDLE_FROM_MS 300 /* sections begun this long before the kill... */
#define RR_STRADDLE_TO_MS 1500  /* ...last until this long after it */

typedef struct rr_rec {
    int64_t t_call, t_ret, t_out;
    uint64_t fence;
    uint16_t thread;   /* global thread index */
    uint8_t name, held;
    uint8_t occ_overlap; /* occupancy was not 1 on entry */
    uint8_t straddle;    /* held across the outage on purpose */
    int8_t rel_rc;       /* what its release returned */
} rr_rec;

typedef struct rr_thread {
    int phase;         /* 0 idle, 1 acquiring, 2 in section, 3 releasing, 4 done */
    int nrec;
    uint64_t acq, timeouts, unlogged, occ_overlaps, not_held;
    uint64_t errors[NERR], rel_errors[NERR];
    char first_error[160];
} rr_thread;

typedef struct rr_name {
    int occupancy;
    uint64_t counter;
} rr_name;

typedef struct rr_shared {
    int go;
    int64_t deadline_ns;
    int64_t kill_at_ns; /* when the runner will SIGKILL Redis */
    proc_sh proc[RR_PROCS];
    uint64_t leases_lost[RR_PROCS];
    rr_name names[RR_NAMES];
    rr_thread th[RR_PROCS * RR_THREADS];
} rr_shared;

static rr_shared *RRS;
static rr_rec *RRL; /* RR_PROCS * RR_THREADS * RR_CAP records */

typedef struct rr_targ {
    dlock_client *c;
    int gidx;
    pthread_t tid;
} rr_targ;

static int err_index(int code)
{
    int i = -code;
    return (i >= 1 && i < NERR) ? i : 0;
}

static void *rr_thread_main(void *arg)
{
    rr_targ *ta = arg;
    rr_thread *t = &RRS->th[ta->gidx];
    rr_rec *log = RRL + (size_t)ta->gidx * RR_CAP;
    uint64_t rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(ta->gidx + 1) * 0xBF58476D1CE4E5B9ULL;
    static const char *const names[RR_NAMES] = {"r0", "r1"};
    while (!ld(&RRS->go))
        sleep_ms(1);
    int64_t deadline = __atomic_load_n(&RRS->deadline_ns, __ATOMIC_ACQUIRE);
    int64_t kill_at = __atomic_load_n(&RRS->kill_at_ns, __ATOMIC_ACQUIRE);
    while (now_ns() < deadline) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        int li = (int)(rng % RR_NAMES);
        rr_name *nm = &RRS->names[li];
        uint64_t fence = 0;
        st_int(&t->phase, 1);
        int64_t t_call = now_ns();
        int rc = dlock_acquire(ta->c, names[li], RR_WAIT_MS, &fence);
        int64_t t_ret = now_ns();
        if (rc == DLOCK_OK) {
            st_int(&t->phase, 2);
            int occ = __atomic_add_fetch(&nm->occupancy, 1, __ATOMIC_ACQ_REL);
            uint64_t v = __atomic_load_n(&nm->counter, __ATOMIC_ACQUIRE);
            int64_t t_in = now_ns();
            int straddle = t_in >= kill_at - RR_STRADDLE_FROM_MS * NS_PER_MS && t_in < kill_at;
            if (straddle)
                sleep_until(kill_at + RR_STRADDLE_TO_MS * NS_PER_MS);
            else
                sleep_us(RR_CS_US);
            __atomic_store_n(&nm->counter, v + 1, __ATOMIC_RELEASE);
            int64_t t_out = now_ns();
            int held = dlock_held(ta->c, names[li]);
            __atomic_sub_fetch(&nm->occupancy, 1, __ATOMIC_ACQ_REL);
            st_int(&t->phase, 3);
            int rr = dlock_release(ta->c, names[li]);
            if (rr != DLOCK_OK)
                t->rel_errors[err_index(rr)]++;
            t->acq++;
            if (occ != 1)
                t->occ_overlaps++;
            if (!held)
                t->not_held++;
            if (t->nrec < RR_CAP) {
                rr_rec *r = &log[t->nrec];
                r->t_call = t_call;
                r->t_ret = t_ret;
                r->t_out = t_out;
                r->fence = fence;
                r->thread = (uint16_t)ta->gidx;
                r->name = (uint8_t)li;
                r->held = (uint8_t)held;
                r->occ_overlap = occ != 1;
                r->straddle = (uint8_t)straddle;
                r->rel_rc = (int8_t)rr;
                __atomic_store_n(&t->nrec, t->nrec + 1, __ATOMIC_RELEASE);
            } else {
                t->unlogged++;
            }
        } else if (rc == DLOCK_ETIMEDOUT) {
            t->timeouts++;
        } else {
            t->errors[err_index(rc)]++;
            if (rc != DLOCK_EREDIS && !t->first_error[0])
                snprintf(t->first_error, sizeof t->first_error, "%s: %s", dlock_err_name(rc),
                         dlock_last_error());
            sleep_ms(1); /* no spinning on a persistent failure */
        }
        st_int(&t->phase, 0);
        sleep_us(RR_THINK_US);
    }
    st_int(&t->phase, 4);
    return NULL;
}

static void rr_child(void *arg)
{
    int p = (int)(intptr_t)arg;
    proc_sh *ps = &RRS->proc[p];
    dlock_config cfg;
    cfg_base(&cfg);
    dlock_client *c = open_client(ps, &cfg);
    rr_targ ta[RR_THREADS];
    for (int i = 0; i < RR_THREADS; i++) {
        ta[i].c = c;
        ta[i].gidx = p * RR_THREADS + i;
        int e = pthread_create(&ta[i].tid, NULL, rr_thread_main, &ta[i]);
        if (e)
            child_fail(ps, "pthread_create: %s", strerror(e));
    }
    st_int(&ps->step, 1);
    for (int i = 0; i < RR_THREADS; i++)
        pthread_join(ta[i].tid, NULL);
    dlock_stats s;
    if (dlock_client_stats(c, &s) == DLOCK_OK)
        RRS->leases_lost[p] = s.leases_lost;
    st_int(&ps->step, 2); /* closing */
    dlock_client_close(c);
    st_int(&ps->step, 3);
    int status = 0;
#ifdef FAULTS_ASAN
    if (__lsan_do_recoverable_leak_check())
        status = 4;
#endif
    _exit(status);
}

static int cmp_ret(const void *x, const void *y)
{
    const rr_rec *a = *(rr_rec *const *)x, *b = *(rr_rec *const *)y;
    return (a->t_ret > b->t_ret) - (a->t_ret < b->t_ret);
}

static int cmp_call(const void *x, const void *y)
{
    const rr_rec *a = *(rr_rec *const *)x, *b = *(rr_rec *const *)y;
    return (a->t_call > b->t_call) - (a->t_call < b->t_call);
}

int sc_redis_restarted(void)
{
    const size_t nth = RR_PROCS * RR_THREADS;
    RRS = shm_alloc(sizeof *RRS);
    RRL = shm_alloc(nth * RR_CAP * sizeof *RRL);
    if (!RRS || !RRL)
        return fail("mmap failed");
    char why[512], stx[64];
    pid_t pids[RR_PROCS];
    int sts[RR_PROCS];

    phase = "starting the storm's processes";
    for (int p = 0; p < RR_PROCS; p++) {
        pids[p] = start_child(rr_child, (void *)(intptr_t)p);
        if (pids[p] < 0)
            return fail("fork failed");
    }
    for (int p = 0; p < RR_PROCS; p++)
        if (wait_step(&RRS->proc[p], 1, 20000) != 1)
            return fail("%s", child_why(&RRS->proc[p], pids[p], "a storm process", why, sizeof why));

    phase = "storm before the kill";
    int64_t t_go = now_ns();
    int64_t deadline = t_go + (int64_t)RR_SECONDS * 1000 * NS_PER_MS;
    __atomic_store_n(&RRS->deadline_ns, deadline, __ATOMIC_RELEASE);
    __atomic_store_n(&RRS->kill_at_ns, t_go + (int64_t)RR_KILL_AT_MS * NS_PER_MS, __ATOMIC_RELEASE);
    st_int(&RRS->go, 1);
    sleep_until(t_go + (int64_t)RR_KILL_AT_MS * NS_PER_MS);
    phase = "storm with redis killed";
    int64_t t_kill = now_ns();
    if (fx_redis_signal(&R, SIGKILL) != 0)
        return fail("could not SIGKILL redis-server");
    sleep_until(t_kill + (int64_t)RR_DOWN_MS * NS_PER_MS);
    phase = "restarting redis";
    int64_t t_restart = now_ns();
    if (fx_redis_restart(&R) != 0)
        return fail("could not restart redis-server on port %d", R.port);
    int64_t t_up = now_ns(); /* it answers PING */

    phase = "storm after the restart";
    int hung = 0;
    int64_t exit_by = deadline + (int64_t)RR_EXIT_GRACE_S * 1000 * NS_PER_MS;
    for (int p = 0; p < RR_PROCS; p++) {
        long left = (long)MS(exit_by - now_ns());
        if (!reap(pids[p], left > 0 ? left : 0, &sts[p])) {
            hung = 1;
            sts[p] = -1;
        }
    }
    int64_t t_exited = now_ns();
    if (hung) {
        char buf[1024];
        size_t bl = 0;
        for (int p = 0; p < RR_PROCS; p++) {
            if (sts[p] != -1)
                continue;
            int cnt[5] = {0};
            for (int i = 0; i < RR_THREADS; i++) {
                int ph = ld(&RRS->th[p * RR_THREADS + i].phase);
                if (ph >= 0 && ph < 5)
                    cnt[ph]++;
            }
            bl += (size_t)snprintf(buf + bl, bl < sizeof buf ? sizeof buf - bl : 0,
                                   "; process %d at step %d (%s), threads: %d acquiring,"
                                   " %d in section, %d releasing, %d idle, %d done",
                                   p, ld(&RRS->proc[p].step),
                                   ld(&RRS->proc[p].step) == 2 ? "in dlock_client_close" : "running",
                                   cnt[1], cnt[2], cnt[3], cnt[0], cnt[4]);
        }
        kill_kids();
        return fail("process(es) still running %d s after the end of the run (hang)%s",
                    RR_EXIT_GRACE_S, buf);
    }

    /* Aggregate the counters. */
    uint64_t acq = 0, timeouts = 0, unlogged = 0, occ_ov = 0, not_held = 0;
    uint64_t errors[NERR] = {0}, rel_errors[NERR] = {0};
    const char *odd_error = NULL;
    size_t nrec = 0;
    for (size_t i = 0; i < nth; i++) {
        rr_thread *t = &RRS->th[i];
        acq += t->acq;
        timeouts += t->timeouts;
        unlogged += t->unlogged;
        occ_ov += t->occ_overlaps;
        not_held += t->not_held;
        nrec += (size_t)t->nrec;
        for (int e = 0; e < NERR; e++) {
            errors[e] += t->errors[e];
            rel_errors[e] += t->rel_errors[e];
        }
        if (t->first_error[0] && !odd_error)
            odd_error = t->first_error;
    }
    uint64_t counter_sum = 0;
    for (int n = 0; n < RR_NAMES; n++)
        counter_sum += RRS->names[n].counter;

    /* Per phase (by when acquire returned) and per process after the restart. */
    uint64_t ph_before = 0, ph_down = 0, ph_after = 0, after_proc[RR_PROCS] = {0};
    rr_rec **v = malloc(nrec * sizeof *v);
    rr_rec **w = malloc(nrec * sizeof *w);
    uint64_t *pmax = malloc((nrec + 1) * sizeof *pmax);
    if (!v || !w || !pmax) {
        free(v);
        free(w);
        free(pmax);
        return fail("out of memory");
    }
    uint64_t violations = 0, regressions = 0, unexplained_ov = 0;
    uint64_t straddlers = 0, straddlers_bad = 0;
    char ex_s[256] = "";
    char ex_v[256] = "", ex_r[256] = "";
    for (int n = 0; n < RR_NAMES; n++) {
        size_t m = 0;
        for (size_t i = 0; i < nth; i++) {
            rr_rec *log = RRL + i * RR_CAP;
            int cnt = ld(&RRS->th[i].nrec);
            for (int k = 0; k < cnt; k++) {
                if (log[k].name != n)
                    continue;
                v[m++] = &log[k];
                if (log[k].straddle) {
                    straddlers++;
                    if (log[k].held || log[k].rel_rc != DLOCK_ELOST) {
                        if (!straddlers_bad)
                            snprintf(ex_s, sizeof ex_s, "thread %u on r%d: dlock_held %d at the end"
                                     " (%lld ms after the kill), release %s", (unsigned)log[k].thread,
                                     n, log[k].held, MS(log[k].t_out - t_kill),
                                     dlock_err_name(log[k].rel_rc));
                        straddlers_bad++;
                    }
                }
                if (log[k].t_ret < t_kill)
                    ph_before++;
                else if (log[k].t_ret < t_up)
                    ph_down++;
                else {
                    ph_after++;
                    after_proc[i / RR_THREADS]++;
                }
            }
        }
        /* Exclusion: sweep sections by t_ret, keep the latest t_out of the
         * proven-valid ones seen so far. */
        qsort(v, m, sizeof *v, cmp_ret);
        int64_t max_out = INT64_MIN;
        const rr_rec *max_rec = NULL;
        for (size_t i = 0; i < m; i++) {
            if (!v[i]->held)
                continue;
            if (max_rec && v[i]->t_ret < max_out) {
                if (!violations)
                    snprintf(ex_v, sizeof ex_v,
                             "name r%d: thread %u held [%lld, %lld] ms and thread %u [%lld, %lld] ms,"
                             " both valid", n, (unsigned)max_rec->thread, MS(max_rec->t_ret - t_go),
                             MS(max_rec->t_out - t_go), (unsigned)v[i]->thread, MS(v[i]->t_ret - t_go),
                             MS(v[i]->t_out - t_go));
                violations++;
            }
            if (v[i]->t_out > max_out) {
                max_out = v[i]->t_out;
                max_rec = v[i];
            }
        }
        /* Occupancy overlaps: each must involve a section that ended not
         * held. An entrant that saw occupancy != 1 and was itself valid must
         * overlap some section that ended not held. */
        for (size_t i = 0; i < m; i++) {
            if (!v[i]->occ_overlap || !v[i]->held)
                continue;
            int explained = 0;
            for (size_t k = 0; k < m && !explained; k++)
                if (k != i && !v[k]->held && v[k]->t_ret <= v[i]->t_out &&
                    v[k]->t_out >= v[i]->t_ret - 1000000 /* 1 ms: clock reads vs. the count */)
                    explained = 1;
            if (!explained)
                unexplained_ov++;
        }
        /* Tokens: prefix maxima of tokens by t_ret; each section's token
         * must exceed every token whose acquire returned before it was
         * called. */
        memcpy(w, v, m * sizeof *v);
        qsort(w, m, sizeof *w, cmp_call);
        pmax[0] = 0;
        for (size_t i = 0; i < m; i++)
            pmax[i + 1] = v[i]->fence > pmax[i] ? v[i]->fence : pmax[i];
        size_t j = 0; /* v[0..j) returned before w[i] was called */
        for (size_t i = 0; i < m; i++) {
            while (j < m && v[j]->t_ret < w[i]->t_call)
                j++;
            if (j > 0 && w[i]->fence <= pmax[j]) {
                if (!regressions)
                    snprintf(ex_r, sizeof ex_r,
                             "name r%d: thread %u got token %" PRIu64 " (called at %lld ms), but"
                             " a token %" PRIu64 " was handed out before that", n, (unsigned)w[i]->thread,
                             w[i]->fence, MS(w[i]->t_call - t_go), pmax[j]);
                regressions++;
            }
        }
    }
    free(v);
    free(w);
    free(pmax);

    uint64_t lost = 0;
    for (int p = 0; p < RR_PROCS; p++)
        lost += RRS->leases_lost[p];
    uint64_t other_errors = 0;
    for (int e = 0; e < NERR; e++)
        if (e != -DLOCK_EREDIS && e != -DLOCK_ETIMEDOUT)
            other_errors += errors[e];
    int counter_ok = counter_sum <= acq && acq - counter_sum <= occ_ov;

    char errs[256], rels[256];
    size_t l1 = 0, l2 = 0;
    for (int e = 1; e < NERR; e++) {
        if (errors[e])
            l1 += (size_t)snprintf(errs + l1, sizeof errs - l1, "%s %s %" PRIu64, l1 ? "," : "",
                                   short_name(-e), errors[e]);
        if (rel_errors[e])
            l2 += (size_t)snprintf(rels + l2, sizeof rels - l2, "%s %s %" PRIu64, l2 ? "," : "",
                                   short_name(-e), rel_errors[e]);
    }
    if (errors[0])
        l1 += (size_t)snprintf(errs + l1, sizeof errs - l1, "%s other %" PRIu64, l1 ? "," : "",
                               errors[0]);
    if (!l1)
        snprintf(errs, sizeof errs, " none");
    if (!l2)
        snprintf(rels, sizeof rels, " none");

    int ok = 1;
    char extra[1024] = "";
    size_t el = 0;
#define ADD(...) el += (size_t)snprintf(extra + el, el < sizeof extra ? sizeof extra - el : 0, __VA_ARGS__)
    if (violations) {
        ok = 0;
        ADD("; %" PRIu64 " exclusion violation(s), first: %s", violations, ex_v);
    }
    if (regressions) {
        ok = 0;
        ADD("; %" PRIu64 " token regression(s), first: %s", regressions, ex_r);
    }
    if (unexplained_ov) {
        ok = 0;
        ADD("; %" PRIu64 " occupancy overlap(s) with no lost lease involved", unexplained_ov);
    }
    if (!counter_ok) {
        ok = 0;
        ADD("; counter MISMATCH: %" PRIu64 " vs %" PRIu64 " acquisitions, %" PRIu64 " overlaps",
            counter_sum, acq, occ_ov);
    }
    if (other_errors) {
        ok = 0;
        ADD("; %" PRIu64 " acquire error(s) other than EREDIS/ETIMEDOUT, first: %s", other_errors,
            odd_error ? odd_error : "?");
    }
    for (int p = 0; p < RR_PROCS; p++) {
        if (after_proc[p] == 0) {
            ok = 0;
            ADD("; process %d made no acquisition after the restart", p);
        }
        if (!WIFEXITED(sts[p]) || WEXITSTATUS(sts[p]) != 0) {
            ok = 0;
            ADD("; process %d %s%s%s", p, status_text(sts[p], stx, sizeof stx),
                RRS->proc[p].err[0] ? ": " : "", RRS->proc[p].err);
        }
    }
    if (straddlers == 0) {
        ok = 0;
        ADD("; no section straddled the outage (the lost-lease path was not exercised)");
    }
    if (straddlers_bad) {
        ok = 0;
        ADD("; %" PRIu64 " of %" PRIu64 " sections held across the outage did not end lost"
            " (want dlock_held 0 and release DLOCK_ELOST), first: %s", straddlers_bad, straddlers,
            ex_s);
    }
    if (unlogged) {
        ok = 0;
        ADD("; %" PRIu64 " sections not logged (raise RR_CAP)", unlogged);
    }
#undef ADD
    snprintf(res, sizeof res,
             "%d procs x %d threads, %d names, %d s; redis killed at %lld ms, up again at %lld ms"
             " (restart took %lld ms); acquisitions %" PRIu64 " before / %" PRIu64 " while down"
             " (local handoffs) / %" PRIu64 " after (per process %" PRIu64 ", %" PRIu64 ", %" PRIu64
             "); %" PRIu64 " sections held across the outage, all ended lost: %s; %" PRIu64
             " violations, %" PRIu64 " token regressions, counter %s; %" PRIu64
             " sections ended not held, %" PRIu64 " occupancy overlaps (all with a lost lease:"
             " %s), %" PRIu64 " leases lost; acquire errors:%s; timeouts %" PRIu64
             "; release errors:%s; processes exited %.1f s after the run's end%s",
             RR_PROCS, RR_THREADS, RR_NAMES, RR_SECONDS, MS(t_kill - t_go), MS(t_up - t_go),
             MS(t_up - t_restart), ph_before, ph_down, ph_after, after_proc[0], after_proc[1],
             after_proc[2], straddlers, straddlers_bad ? "NO" : "yes", violations, regressions, counter_ok ? "ok" : "MISMATCH", not_held,
             occ_ov, unexplained_ov ? "no" : "yes", lost, errs, timeouts, rels,
             (double)(t_exited - deadline) / 1e9, extra);
    return ok;
}
