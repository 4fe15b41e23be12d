/*
 * nemesis: a Jepsen-style soak of dlock on real Redis servers, with faults.
 *
 *   nemesis [--seconds S] [--procs P] [--threads T] [--names K]
 *           [--lease-ms L] [--min-replicas M] [--faults LIST] [--seed N]
 *           [--recovery-bound-ms B] [--read-pct R]
 *           [--sem-pct P [--sem-limit L]] [--redlock N] [--quiet]
 *
 * The system: a master and two replicas (AOF, appendfsync always), each
 * behind a fault proxy of this process (tests/support/proxy.h) that all its traffic
 * passes, replication and the sentinels' included (each server announces
 * its proxy's port); three sentinels (quorum 2, down after 1 s); P worker
 * processes, each one dlock client in Sentinel mode with min_replicas M
 * (default 2: every replica, the setting the docs recommend for
 * failovers; with 1, forced failovers give overlapping holders, issue 18) and
 * T threads (nemesis_worker.c); and a fenced store, a separate
 * redis-server no fault touches, on which the workers do a read-modify-write
 * under the lock. Every data server runs under libfaketime through the
 * project's clock shim (tests/support/clockshim.c), so that the nemesis can step the
 * servers' wall clocks and nothing else's.
 *
 * The nemesis injects faults in bursts of 20 s, each followed by a quiet
 * window that lasts until every name has been acquired again (at most the
 * recovery bound B). In a burst, every 0.5-2 s, it injects one fault of LIST
 * at random (default all): pause (a worker SIGSTOPped for 1-2 lease times, then SIGCONT),
 * kill (a worker SIGKILLed and replaced), restart (the master SIGKILLed and
 * restarted from its AOF at once), wipe (the same without its data: once per
 * run, the guide's "restart without persistence"), failover (SENTINEL
 * FAILOVER, waited for), delay (the master's proxy delays traffic 1-100 ms
 * for 1-3 s), reset (the master's proxy resets every connection), hold (the
 * master's proxy holds back the next script call for 0.2-2.5 s: a request
 * delivered late), stall (the master's proxy forwards nothing for
 * 0.1-0.6 s), clockfwd and clockback (the data servers' clocks step forward
 * 0.5-2 s, a step that would put them more than 10 s ahead of real time
 * being skipped, or back by up to one lease time in all until they have
 * caught up: the fences' bound), and clockfar (from a clock that has caught
 * up, back 1-10 minutes: the slots' marks' case, half of the steps after
 * every worker stood still 2.5-4 lease times; set right, a forward step,
 * 1-4 lease times later, the burst waiting for it, since a dead holder's
 * lease granted before the step would stand for minutes). A restart,
 * failover or wipe waits until the clocks have caught up with every step
 * back, and no step back after the wipe takes the clocks to before it (1 s
 * of margin): the docs promise nothing for a loss of data while the clock
 * is behind, or for a clock stepped back to before the loss.
 *
 * --read-pct R: each iteration of a worker thread is a reader's with
 * probability R% (default 0): dlock_acquire_shared, a read of the store that
 * writes nothing, dlock_release_shared (nemesis_worker.c); the checker
 * holds readers to the shared mode's promises (nemesis_check.c).
 *
 * --sem-pct P: each iteration of a worker thread takes a permit of a
 * counting semaphore instead with probability P% (default 0; drawn before
 * --read-pct's, which applies to the rest): one of ceil(K / 3) semaphore
 * names ("s0"..; a name is a lock or a semaphore, never both), each of
 * limit L (--sem-limit, default 2): dlock_sem_acquire, a short hold,
 * dlock_sem_release (nemesis_worker.c); the checker counts the holders
 * whose permits stayed valid against the limit (nemesis_check.c, "sem").
 *
 * --redlock N (3 or 5): the workers in Redlock mode on N independent
 * masters instead of the Sentinel topology, each behind its own proxy and
 * under its own clock; every fault on the servers hits one node
 * (nemesis_redlock.c says which faults and when); failover and clockfar
 * do not apply, nor do semaphores, --protocol and --min-replicas (readers,
 * --read-pct, do); a wipe excuses nothing (nemesis_check.c).
 *
 * --plant nolock|unfenced|readers-unlocked|sem-unlimited plants a bug
 * (nemesis.h) that the checker must catch: the test suite runs each and
 * expects overlaps, lost updates, readers beside writers and out of their
 * tokens' order, and more holders of a semaphore than its limit.
 *
 * Defaults: S 120, P 3, T 6, K 6 names, L 2000 ms, M 2, B 30000 ms: the
 * bound on the time from the end of a burst until every name has been
 * acquired again. Within a burst, faults may follow each other faster than
 * the system recovers (with M 2, no grant is confirmed after a failover until
 * the old master has rejoined as a replica and resynced: up to 11 s here
 * for one failover, 34 s without any acquisition in one burst of five
 * failovers and restarts), so the bound holds for bursts, not single
 * faults.
 *
 * After S seconds the nemesis stops, every fault is healed, the workers run
 * on for two lease times, stop, and nemesis_check.c checks the history
 * (nemesis.h says what each check means). The last line on stdout is one
 * JSON object: the parameters, the figures and "violations"; exit status 0
 * when there are none, 1 otherwise, 2 on bad usage or a set-up failure.
 *
 * Bounds. Every wait is bounded; alarm(S + 240) is the last resort (it
 * SIGKILLs everything started and exits 2, leaving the servers' temporary
 * directories and the clock file behind). SIGINT or SIGTERM during the
 * faults ends a run early and cleanly, without a verdict (exit 2); during
 * set-up and the final checks they take effect when those are done. Servers and workers get
 * PR_SET_PDEATHSIG(SIGKILL): nothing outlives the runner.
 *
 * Threads: the proxies' threads (tests/support/proxy.c) and the main thread, which
 * does everything else; the workers are started with fork + exec, so no
 * child inherits a proxy thread's state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "nemesis.h"
#include "proxy.h"

const char *const nm_fault_names[NM_NFAULTS] = {
    "pause", "kill", "restart", "wipe", "failover", "delay",
    "reset", "hold", "stall", "clockfwd", "clockback", "clockfar",
};

#define MAX_EVENTS 4096

static struct {
    int seconds, procs, threads, names, lease_ms, min_replicas, quiet, plant, read_pct;
    int sem_pct, sem_limit;
    long recovery_bound_ms;
    unsigned faults;          /* bit per enum nm_fault */
    uint64_t seed;
    const char *shim;         /* the clock shim; NULL: no clock faults */
    const char *faketime;     /* libfaketimeMT */
    int protocol;             /* the workers' dlock_config.protocol: 0 the default,
                                 -1 mixed (worker slot s writes 1 + s % 2) */
    int redlock;              /* --redlock N (0: the Sentinel topology) */
} O = {120, 3, 6, 6, 2000, 2, 0, 0, 0, 0, 2, 30000, (1u << NM_NFAULTS) - 1, 0, NULL,
       "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1", 0, 0};

static nm_shared *sh;
static int shfd = -1;
static fx_redis store;
static fx_fake_clock fake;      /* the data servers' clock (with --clock-shim) */
static nm_event ev[MAX_EVENTS];
static int nev;
static int64_t t0;
static uint64_t rs;

void nm_say(const char *fmt, ...)
{
    if (O.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nemesis %6.1f s: ", (double)(nm_now_ns() - t0) / 1e9);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static uint64_t rnd(void)
{
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * 2685821657736338717ULL;
}

long nm_between(long lo, long hi)
{
    return lo + (long)(rnd() % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------------------ */
/* The workers                                                          */

static void spawn_worker(int slot)
{
    char s[16], f[16];
    snprintf(s, sizeof s, "%d", slot);
    snprintf(f, sizeof f, "%d", shfd);
    pid_t parent = getpid();
    __atomic_store_n(&sh->procs[slot].ready, 0, __ATOMIC_RELAXED);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        fcntl(shfd, F_SETFD, 0); /* the region, for this exec only (MFD_CLOEXEC) */
        execl("/proc/self/exe", "nemesis", "--worker", s, "--fd", f, (char *)NULL);
        _exit(127);
    }
    sh->procs[slot].pid = pid > 0 ? pid : 0;
}

static void kill_worker(int slot)
{
    pid_t pid = sh->procs[slot].pid;
    if (pid > 0) {
        kill(pid, SIGCONT);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        sh->procs[slot].pid = 0;
    }
}

static void stop_all(void)
{
    for (int p = 0; p < O.procs; p++)
        kill_worker(p);
    if (O.redlock)
        nm_rl_stop();
    else
        nm_topo_stop();
    fx_redis_stop(&store);
    fx_fake_clock_remove(&fake);
}

/* SIGINT, SIGTERM: the run ends early, cleanly (servers stopped, their
 * directories removed), without a verdict. */
static volatile sig_atomic_t interrupted;
static void on_interrupt(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "nemesis: watchdog: the run did not end in time\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    for (int p = 0; p < NM_MAX_PROCS && sh; p++)
        if (sh->procs[p].pid > 0)
            kill(sh->procs[p].pid, SIGKILL);
    for (int i = 0; i < NSRV; i++)
        if (srv[i].pid > 0)
            kill(srv[i].pid, SIGKILL);
    for (int s = 0; s < 3; s++)
        if (sent[s].pid > 0)
            kill(sent[s].pid, SIGKILL);
    nm_rl_kill_all();
    if (store.pid > 0)
        kill(store.pid, SIGKILL);
    _exit(2);
}

/* ------------------------------------------------------------------ */
/* The servers' clock                                                   */

static long clock_offset_ms;  /* the data servers' clock less real time */
static int64_t caught_up_at;  /* when the servers' clock has passed every
                                 reading it gave before the last step back */

static int clock_set(long offset_ms)
{
    if (fx_fake_clock_set(&fake, offset_ms) != 0)
        return -1;
    clock_offset_ms = offset_ms;
    return 0;
}

/* Debt: how far the clock is behind the latest reading it gave. */
static long clock_debt_ms(void)
{
    int64_t now = nm_now_ns();
    return caught_up_at > now ? (long)((caught_up_at - now) / 1000000LL) : 0;
}

/* ------------------------------------------------------------------ */
/* Faults                                                               */

nm_event *nm_begin(int kind, long arg)
{
    if (nev >= MAX_EVENTS)
        return NULL;
    nm_event *e = &ev[nev++];
    e->kind = kind;
    e->arg = arg;
    e->t_start = nm_now_ns();
    return e;
}

void nm_unbegin(void)
{
    if (nev > 0)
        nev--;
}

/* The highest token the master may have issued by now: its clock, plus how
 * far tokens may run ahead of it after a step back (they take last + 1 until
 * the clock has caught up), or above that a slot's mark (NM_PREFIX "hw:*",
 * "token clock pass-limit") plus its pass limit: after a step back each
 * grant of a slot goes a pass limit and one above the last (acquire.lua,
 * Tokens), and the marks hold the last. 0 if the master does not answer. */
static uint64_t issued_bound_us(int m)
{
    return m < 0 ? 0 : nm_issued_bound_at(srv[m].port, clock_debt_ms());
}

uint64_t nm_issued_bound_at(int port, long debt_ms)
{
    /* The marks first, TIME last: the fault follows TIME within the
     * checker's 20 ms. */
    uint64_t b = 0;
    redisReply *r = fx_cmd_at(port, "KEYS %shw:*", NM_PREFIX);
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *v = fx_cmd_at(port, "GET %s", r->element[i]->str);
        unsigned long long tok, clk, pl;
        if (v && v->type == REDIS_REPLY_STRING &&
            sscanf(v->str, "%llu %llu %llu", &tok, &clk, &pl) == 3 && tok + pl > b)
            b = tok + pl;
        if (v)
            freeReplyObject(v);
    }
    if (r)
        freeReplyObject(r);
    uint64_t us = nm_time_us_at(port);
    if (!us)
        return 0;
    us += (uint64_t)debt_ms * 1000;
    return us > b ? us : b;
}

/* Failures of the harness itself (a fault that did not take effect, a
 * worker that died by itself): each one a violation, printed. */
static int harness_errors;
void nm_harness_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "nemesis: HARNESS ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    harness_errors++;
}

/* After a clock step: the master's clock is off real time by the offset
 * (within 500 ms: the time of one TIME on a loaded machine), or the step did
 * not take effect (libfaketime not loaded, the file not read). */
static void check_clock(int m)
{
    uint64_t us = nm_server_time_us(m);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long real = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    long long off_ms = ((long long)us - real) / 1000;
    if (us && llabs(off_ms - clock_offset_ms) > 500)
        nm_harness_error("the master's clock is %+lld ms off real time, the step set %+ld ms", off_ms,
                      clock_offset_ms);
}

void nm_heal(nm_event *e)
{
    e->t_heal = nm_now_ns();
    e->done = 1;
}

/* A clockfar step back stands until far_until (CLOCK_MONOTONIC ns; 0: none
 * stands), when clock_set_right() steps the clocks forward by far_ms again,
 * as an operator would set them right: a forward step (NM_CLOCK_FWD) that
 * ends, at once, every grant made while the clock was behind. Before that
 * a dead holder's lease granted before the step would stand for minutes. */
static int64_t far_until;
static long far_ms;

static void clock_set_right(void)
{
    if (!far_until)
        return;
    int m = nm_master_index();
    nm_event *e = nm_begin(NM_CLOCK_FWD, far_ms);
    if (e && !(e->server_us = issued_bound_us(m))) {
        /* The master does not answer: real time, plus the offset the
         * clocks had before the step if it was ahead, and 1 s (a slot
         * would need thousands of grants in a few lease times to pass
         * it). */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ahead = clock_offset_ms + far_ms > 0 ? clock_offset_ms + far_ms : 0;
        e->server_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u +
                       (uint64_t)ahead * 1000u + 1000000u;
    }
    if (clock_set(clock_offset_ms + far_ms) != 0) {
        nm_harness_error("could not set the clocks right after a step back of %ld ms", far_ms);
        if (e)
            nev--;
        far_until = 0;
        return;
    }
    caught_up_at -= far_ms * 1000000LL; /* the debt of the step is paid */
    far_until = 0;
    fx_sleep_ms(100);
    check_clock(m);
    if (e)
        nm_heal(e);
    nm_say("set the servers' clocks right: forward %ld ms (offset %+ld ms)", far_ms, clock_offset_ms);
}

static int live_worker(void)
{
    for (int tries = 0; tries < 16; tries++) {
        int p = (int)nm_between(0, O.procs - 1);
        if (sh->procs[p].pid > 0)
            return p;
    }
    return -1;
}

/* The wipe (CLOCK_MONOTONIC ns; 0: none yet) and the servers' clock offset
 * then. */
static int64_t wiped_at;
static long wiped_offset_ms;

/* How far the servers' clocks may step back now and still read above what
 * they read at the wipe plus 1 s: the guide ("Fencing tokens") promises
 * nothing for tokens once the clock steps back to before a loss of data
 * (the marks that hold the tokens handed out before it are gone). */
static long back_room_ms(void)
{
    if (!wiped_at)
        return LONG_MAX;
    return (long)((nm_now_ns() - wiped_at) / 1000000LL) + clock_offset_ms - wiped_offset_ms - 1000;
}

static void restart_master(int m, int wipe)
{
    nm_event *e = nm_begin(wipe ? NM_WIPE : NM_RESTART, m);
    if (!e)
        return;
    e->server_us = issued_bound_us(m);
    if (wipe) {
        wiped_at = nm_now_ns();
        wiped_offset_ms = clock_offset_ms;
    }
    fx_redis_signal(&srv[m], SIGKILL);
    if (wipe) {
        char c[400];
        snprintf(c, sizeof c, "rm -rf '%s/appendonlydir' '%s/dump.rdb'", srv[m].dir, srv[m].dir);
        if (system(c) != 0)
            nm_say("could not remove %s's data", srv[m].dir);
    }
    srv[m].opts.replica_of = 0; /* it comes back as the master it was */
    if (fx_redis_restart(&srv[m]) != 0)
        nm_say("could not restart server %d", m);
    nm_heal(e);
    nm_say("%s server %d (port %d)", wipe ? "wiped and restarted" : "restarted", m, srv[m].port);
}

static void inject(int kind, int *wiped)
{
    if (O.redlock && kind != NM_PAUSE && kind != NM_KILL) {
        nm_rl_inject(kind); /* on one node (nemesis_redlock.c) */
        return;
    }
    int m = O.redlock ? -1 : nm_master_index();
    if (m >= 0 && !nm_is_master(m))
        m = -1; /* the sentinels' master does not say so (yet): no fault on it */
    nm_event *e;
    switch (kind) {
    case NM_PAUSE: {
        int p = live_worker();
        long ms = nm_between(O.lease_ms, 2L * O.lease_ms);
        if (p < 0 || !(e = nm_begin(kind, ms)))
            return;
        kill(sh->procs[p].pid, SIGSTOP);
        fx_sleep_ms(ms);
        kill(sh->procs[p].pid, SIGCONT);
        nm_heal(e);
        nm_say("paused worker %d for %ld ms", p, ms);
        return;
    }
    case NM_KILL: {
        int p = live_worker();
        if (p < 0 || !(e = nm_begin(kind, p)))
            return;
        kill_worker(p);
        spawn_worker(p);
        nm_heal(e);
        nm_say("killed worker %d", p);
        return;
    }
    case NM_RESTART:
    case NM_WIPE:
        if (m < 0 || clock_debt_ms() > 0 || (kind == NM_WIPE && *wiped))
            return;
        restart_master(m, kind == NM_WIPE);
        if (kind == NM_WIPE)
            *wiped = 1;
        return;
    case NM_FAILOVER: {
        if (m < 0 || clock_debt_ms() > 0 || !(e = nm_begin(kind, m)))
            return;
        e->server_us = issued_bound_us(m);
        redisReply *r = fx_cmd_at(sent[nm_between(0, 2)].port, "SENTINEL FAILOVER %s", NM_MASTER);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (!ok)
            nm_say("failover refused: %s", r && r->str ? r->str : "no answer");
        if (r)
            freeReplyObject(r);
        if (!ok) {
            nev--;
            return;
        }
        /* Done when the sentinels name another master and it says so. */
        int64_t end = nm_now_ns() + 30000 * 1000000LL;
        int n = m;
        while (nm_now_ns() < end && ((n = nm_master_index()) == m || n < 0 || !nm_is_master(n)))
            fx_sleep_ms(50);
        nm_heal(e);
        nm_say("failover from server %d to %d", m, n);
        return;
    }
    case NM_DELAY: {
        long us = nm_between(1000, 100000), ms = nm_between(1000, 3000);
        if (m < 0 || !(e = nm_begin(kind, us / 1000)))
            return;
        fx_proxy_set_delay(px[m], us, us);
        fx_sleep_ms(ms);
        fx_proxy_set_delay(px[m], 0, 0);
        nm_heal(e);
        nm_say("delayed server %d's traffic by %ld ms for %ld ms", m, us / 1000, ms);
        return;
    }
    case NM_RESET:
        if (m < 0 || !(e = nm_begin(kind, m)))
            return;
        if (fx_proxy_reset_all(px[m]) == 0) {
            nev--; /* no connection to reset: not counted */
            return;
        }
        nm_heal(e);
        nm_say("reset server %d's connections", m);
        return;
    case NM_HOLD: {
        long ms = nm_between(200, 2500);
        if (m < 0 || !(e = nm_begin(kind, ms)))
            return;
        fx_proxy_hold_next(px[m], "EVALSHA");
        if (fx_proxy_wait_held(px[m], 2000) != 0) {
            fx_proxy_release_held(px[m]); /* nothing came: disarmed, not counted */
            nev--;
            return;
        }
        fx_sleep_ms(ms);
        fx_proxy_release_held(px[m]);
        fx_proxy_wait_released(px[m], 2000);
        nm_heal(e);
        nm_say("held back a script call to server %d for %ld ms", m, ms);
        return;
    }
    case NM_STALL: {
        long ms = nm_between(100, 600);
        if (m < 0 || !(e = nm_begin(kind, ms)))
            return;
        fx_proxy_stall(px[m], 1);
        fx_sleep_ms(ms);
        fx_proxy_stall(px[m], 0);
        nm_heal(e);
        nm_say("stalled server %d for %ld ms", m, ms);
        return;
    }
    case NM_CLOCK_FWD: {
        long ms = nm_between(500, 2000);
        /* The servers' clocks stay within 10 s ahead of real time. */
        if (!O.shim || m < 0 || clock_offset_ms + (far_until ? far_ms : 0) + ms > 10000 ||
            !(e = nm_begin(kind, ms)))
            return;
        e->server_us = issued_bound_us(m);
        if (!e->server_us || clock_set(clock_offset_ms + ms) != 0) {
            nev--;
            return;
        }
        fx_sleep_ms(100); /* libfaketime reads the file on every clock read */
        check_clock(m);
        nm_heal(e);
        nm_say("stepped the servers' clocks forward %ld ms (offset %+ld ms)", ms, clock_offset_ms);
        return;
    }
    case NM_CLOCK_BACK: {
        long room = O.lease_ms - clock_debt_ms();
        if (room > back_room_ms())
            room = back_room_ms();
        if (!O.shim || m < 0 || room < 200)
            return;
        long ms = nm_between(100, room);
        if (!(e = nm_begin(kind, ms)))
            return;
        if (clock_set(clock_offset_ms - ms) != 0) {
            nev--;
            return;
        }
        int64_t now = nm_now_ns();
        caught_up_at = (caught_up_at > now ? caught_up_at : now) + ms * 1000000LL;
        fx_sleep_ms(100);
        check_clock(m);
        nm_heal(e);
        nm_say("stepped the servers' clocks back %ld ms (offset %+ld ms)", ms, clock_offset_ms);
        return;
    }
    case NM_CLOCK_FAR: {
        /* From a clock that has caught up: set right, the step is undone. */
        if (!O.shim || m < 0 || far_until || clock_debt_ms() > 0)
            return;
        long ms = nm_between(60000, 600000);
        if (ms > back_room_ms())
            ms = back_room_ms();
        if (ms < 60000)
            return;
        /* Half of them quiet: every worker stopped for 2.5-4 lease times
         * first, so that every name's lease and fence keys are gone and
         * only the slots' marks bound the tokens after the step. */
        long quiet_ms = rnd() % 2 ? nm_between(5L * O.lease_ms / 2, 4L * O.lease_ms) : 0;
        if (!(e = nm_begin(kind, ms)))
            return;
        for (int p = 0; quiet_ms && p < O.procs; p++)
            if (sh->procs[p].pid > 0)
                kill(sh->procs[p].pid, SIGSTOP);
        fx_sleep_ms(quiet_ms);
        int set = clock_set(clock_offset_ms - ms);
        for (int p = 0; quiet_ms && p < O.procs; p++)
            if (sh->procs[p].pid > 0)
                kill(sh->procs[p].pid, SIGCONT);
        if (set != 0) {
            nev--;
            return;
        }
        int64_t now = nm_now_ns();
        caught_up_at = now + ms * 1000000LL;
        far_ms = ms;
        far_until = now + nm_between(1, 4) * O.lease_ms * 1000000LL;
        fx_sleep_ms(100);
        check_clock(m);
        nm_heal(e);
        nm_say("stepped the servers' clocks back %ld s (offset %+ld ms)%s", ms / 1000, clock_offset_ms,
            quiet_ms ? ", every worker stopped before" : "");
        return;
    }
    }
}

/* After a burst of faults: no fault until every name has been acquired
 * again (read off the history as it grows), for at most the recovery bound.
 * The checker then verifies the bound from the history. */
#define BURST_NS (20 * 1000000000LL)
#define MAX_QUIET 4096
static int64_t quiet[MAX_QUIET];
static int nquiet;

static void quiet_window(void)
{
    if (nquiet >= MAX_QUIET)
        return;
    int64_t q = nm_now_ns(), until = q + O.recovery_bound_ms * 1000000LL;
    quiet[nquiet++] = q;
    uint64_t from = __atomic_load_n(&sh->next, __ATOMIC_RELAXED); /* a slot count */
    while (nm_now_ns() < until && !interrupted) {
        int seen[NM_MAX_NAMES] = {0}, all = 1;
        uint64_t to = __atomic_load_n(&sh->next, __ATOMIC_RELAXED);
        if (to > sh->cap)
            to = sh->cap;
        for (uint64_t i = from < 1000 ? 0 : from - 1000; i < to; i++) {
            const nm_rec *r = &sh->recs[i];
            /* Acquire: pairs with the worker's release of done. */
            if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE) && r->t_acq > q && r->name < NM_MAX_NAMES)
                seen[r->name] = 1;
        }
        for (int k = 0; k < O.names + (O.sem_pct ? sh->sem_names : 0); k++)
            all &= seen[k];
        if (all) {
            nm_say("burst over: every name acquired again in %lld ms",
                (long long)((nm_now_ns() - q) / 1000000LL));
            return;
        }
        fx_sleep_ms(100);
    }
    nm_say("burst over: not every name acquired again within %ld ms", O.recovery_bound_ms);
}

/* ------------------------------------------------------------------ */
/* Main                                                                 */

static void usage(FILE *f)
{
    fprintf(f,
"usage: nemesis [--seconds S] [--procs P] [--threads T] [--names K] [--lease-ms L]\n"
"               [--min-replicas M] [--faults LIST] [--seed N] [--recovery-bound-ms B]\n"
"               [--clock-shim PATH [--faketime PATH]]\n"
"               [--plant nolock|unfenced|readers-unlocked|sem-unlimited]\n"
"               [--protocol 1|2|mixed]\n"
"               [--read-pct R] [--sem-pct P [--sem-limit L]] [--redlock N] [--quiet]\n"
"  --redlock: N (3 or 5) independent masters, the workers in Redlock mode,\n"
"          each node under its own clock (locks, exclusive and shared: no\n"
"          --sem-pct, --protocol, --min-replicas; faults: no\n"
"          failover, clockfar; each node fault on one node)\n"
"  --read-pct: the share (0-100, default 0) of the workers' iterations that\n"
"          take the name shared and only read the store\n"
"  --sem-pct: the share (0-99, default 0) of the workers' iterations that\n"
"          take a permit of one of ceil(K / 3) semaphores \"s0\".. instead,\n"
"          each of limit L (--sem-limit, default 2)\n"
"  --protocol: what the workers write (each reads both; default the\n"
"          library's, 2); mixed: worker s writes 1 + s %% 2\n"
"          (docs/operations.md, \"Upgrades\")\n"
"  faults: a comma-separated subset of pause,kill,restart,wipe,failover,delay,\n"
"          reset,hold,stall,clockfwd,clockback,clockfar (default: all; the clock\n"
"          faults need --clock-shim, the path of libdlock_clockshim.so, and\n"
"          libfaketimeMT: --faketime, default the path of Debian's)\n"
"  --plant: a planted bug the checker must catch (nemesis.h): nolock, workers\n"
"          sometimes skip the lock; unfenced, the store's write ignores tokens;\n"
"          readers-unlocked, readers (--read-pct) take no lock; sem-unlimited,\n"
"          one permit (--sem-pct) in 4 is taken without dlock_sem_acquire\n");
}

static long num(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        fprintf(stderr, "nemesis: %s must be %ld..%ld\n", opt, lo, hi);
        exit(2);
    }
    return v;
}

static unsigned parse_faults(const char *s)
{
    unsigned m = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int k;
        for (k = 0; k < NM_NFAULTS && strcmp(t, nm_fault_names[k]); k++) {
        }
        if (k == NM_NFAULTS) {
            fprintf(stderr, "nemesis: unknown fault %s\n", t);
            usage(stderr);
            exit(2);
        }
        m |= 1u << k;
    }
    return m;
}

int main(int argc, char **argv)
{
    int worker = -1, fd = -1, faults_given = 0, min_replicas_given = 0;
    static const struct option lo[] = {
        {"seconds", 1, 0, 's'}, {"procs", 1, 0, 'p'}, {"threads", 1, 0, 't'},
        {"names", 1, 0, 'n'}, {"lease-ms", 1, 0, 'l'}, {"min-replicas", 1, 0, 'm'},
        {"faults", 1, 0, 'f'}, {"seed", 1, 0, 'S'}, {"recovery-bound-ms", 1, 0, 'r'},
        {"clock-shim", 1, 0, 'c'}, {"faketime", 1, 0, 'T'}, {"quiet", 0, 0, 'q'}, {"worker", 1, 0, 'W'},
        {"fd", 1, 0, 'F'}, {"plant", 1, 0, 'P'}, {"protocol", 1, 0, 'V'},
        {"read-pct", 1, 0, 'R'}, {"sem-pct", 1, 0, 'M'}, {"sem-limit", 1, 0, 'L'},
        {"redlock", 1, 0, 'K'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 's': O.seconds = (int)num("--seconds", optarg, 1, 86400); break;
        case 'p': O.procs = (int)num("--procs", optarg, 1, NM_MAX_PROCS); break;
        case 't': O.threads = (int)num("--threads", optarg, 1, 64); break;
        case 'n': O.names = (int)num("--names", optarg, 1, NM_MAX_NAMES); break;
        case 'l': O.lease_ms = (int)num("--lease-ms", optarg, 500, 60000); break;
        case 'm':
            O.min_replicas = (int)num("--min-replicas", optarg, 0, NSRV - 1);
            min_replicas_given = 1;
            break;
        case 'f': O.faults = parse_faults(optarg); faults_given = 1; break;
        case 'S': O.seed = (uint64_t)num("--seed", optarg, 1, 2147483646); break;
        case 'r': O.recovery_bound_ms = num("--recovery-bound-ms", optarg, 100, 600000); break;
        case 'c': O.shim = optarg; break;
        case 'T': O.faketime = optarg; break;
        case 'q': O.quiet = 1; break;
        case 'W': worker = (int)num("--worker", optarg, 0, NM_MAX_PROCS - 1); break;
        case 'F': fd = (int)num("--fd", optarg, 0, 1 << 20); break;
        case 'P':
            if (!strcmp(optarg, "nolock"))
                O.plant = NM_PLANT_NOLOCK;
            else if (!strcmp(optarg, "unfenced"))
                O.plant = NM_PLANT_UNFENCED;
            else if (!strcmp(optarg, "readers-unlocked"))
                O.plant = NM_PLANT_READERS_UNLOCKED;
            else if (!strcmp(optarg, "sem-unlimited"))
                O.plant = NM_PLANT_SEM_UNLIMITED;
            else {
                fprintf(stderr, "nemesis: --plant nolock, unfenced, readers-unlocked or "
                                "sem-unlimited\n");
                return 2;
            }
            break;
        case 'V':
            O.protocol = !strcmp(optarg, "mixed")
                             ? -1
                             : (int)num("--protocol", optarg, DLOCK_PROTOCOL_LOWEST,
                                        DLOCK_PROTOCOL_HIGHEST);
            break;
        case 'R': O.read_pct = (int)num("--read-pct", optarg, 0, 100); break;
        case 'M': O.sem_pct = (int)num("--sem-pct", optarg, 0, 99); break;
        case 'L': O.sem_limit = (int)num("--sem-limit", optarg, 1, 64); break;
        case 'K':
            O.redlock = (int)num("--redlock", optarg, 3, NM_RL_MAX);
            if (O.redlock % 2 == 0) {
                fprintf(stderr, "nemesis: --redlock must be 3 or 5\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    if (O.plant == NM_PLANT_READERS_UNLOCKED && !O.read_pct) {
        fprintf(stderr, "nemesis: --plant readers-unlocked needs --read-pct\n");
        return 2;
    }
    if (O.plant == NM_PLANT_SEM_UNLIMITED && !O.sem_pct) {
        fprintf(stderr, "nemesis: --plant sem-unlimited needs --sem-pct\n");
        return 2;
    }
    unsigned rl_not = (1u << NM_FAILOVER) | (1u << NM_CLOCK_FAR);
    if (O.redlock && worker < 0) {
        if (O.protocol || min_replicas_given) {
            fprintf(stderr, "nemesis: --redlock takes no --protocol or --min-replicas "
                            "(protocol 2)\n");
            return 2;
        }
        if (faults_given && (O.faults & rl_not)) {
            fprintf(stderr, "nemesis: --redlock takes no failover or clockfar fault\n");
            return 2;
        }
        O.faults &= ~rl_not;
        O.min_replicas = 0;
    }
    if (O.sem_pct && O.names + (O.names + 2) / 3 > NM_MAX_NAMES) {
        fprintf(stderr, "nemesis: with --sem-pct, --names is at most %d\n", NM_MAX_NAMES * 3 / 4);
        return 2;
    }
    if (worker >= 0) {
        struct nm_shared hdr;
        if (pread(fd, &hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
            return 3;
        size_t len = sizeof hdr + hdr.cap * sizeof(nm_rec);
        nm_shared *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            return 3;
        nm_worker_main(m, worker);
    }
    unsigned clock_faults = (1u << NM_CLOCK_FWD) | (1u << NM_CLOCK_BACK) | (1u << NM_CLOCK_FAR);
    if (!O.shim && (O.faults & clock_faults)) {
        if (faults_given) {
            fprintf(stderr, "nemesis: the clock faults need --clock-shim\n");
            return 2;
        }
        O.faults &= ~clock_faults;
        fprintf(stderr, "nemesis: no --clock-shim: the clocks are not stepped\n");
    }
    if (!O.seed)
        O.seed = (uint64_t)(time(NULL) ^ getpid()) % 2147483646 + 1;
    fprintf(stderr, "nemesis: seed %" PRIu64 "\n", O.seed);
    rs = O.seed * 0x9e3779b97f4a7c15ULL | 1;
    t0 = nm_now_ns();
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    signal(SIGINT, on_interrupt);
    signal(SIGTERM, on_interrupt);
    alarm((unsigned)O.seconds + 240);

    /* The history: 3000 acquisitions a second fit (runs here make 25 to
     * 100 a second; 2000 without the long holds); more is a violation. */
    uint64_t cap = (uint64_t)(O.seconds + 60) * 3000;
    size_t len = sizeof(nm_shared) + cap * sizeof(nm_rec);
    shfd = memfd_create("nemesis", MFD_CLOEXEC); /* cleared for workers only */
    if (shfd < 0 || ftruncate(shfd, (off_t)len) != 0 ||
        (sh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, shfd, 0)) == MAP_FAILED) {
        perror("nemesis: shared memory");
        return 2;
    }
    sh->cap = cap;
    sh->threads = O.threads;
    sh->names = O.names;
    sh->lease_ms = O.lease_ms;
    sh->min_replicas = O.min_replicas;
    sh->protocol = O.protocol;
    sh->command_ms = 1000;
    sh->think_us = 2000;
    sh->plant = O.plant;
    sh->read_pct = O.read_pct;
    sh->sem_pct = O.sem_pct;
    sh->sem_limit = O.sem_limit;
    sh->sem_names = (O.names + 2) / 3;

    if (O.shim && !O.redlock && fx_fake_clock_init(&fake, O.shim, O.faketime) != 0)
        return 2;
    nm_topo_env = O.shim && !O.redlock ? fake.env : NULL;

    int rc = 2;
    if (fx_redis_start(&store) != 0) {
        fprintf(stderr, "nemesis: could not start the store\n");
        goto out;
    }
    sh->store_port = store.port;
    if (O.redlock) {
        if (nm_rl_start(O.redlock, O.shim, O.faketime, O.lease_ms, sh->nodes, sizeof sh->nodes) != 0)
            goto out;
        sh->redlock = O.redlock;
        nm_say("%d Redlock nodes up behind proxies %s, store %d, seed %" PRIu64, O.redlock,
               sh->nodes, store.port, O.seed);
    } else if (nm_topo_start() != 0) {
        goto out;
    }
    snprintf(sh->sentinels, sizeof sh->sentinels, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
             sent[0].port, sent[1].port, sent[2].port);
    if (!O.redlock)
        nm_say("topology up: servers %d %d %d behind proxies %d %d %d, store %d, seed %" PRIu64,
        srv[0].port, srv[1].port, srv[2].port, pxport[0], pxport[1], pxport[2], store.port,
        O.seed);
    for (int p = 0; p < O.procs; p++)
        spawn_worker(p);
    int64_t ready_by = nm_now_ns() + 30000 * 1000000LL;
    for (int p = 0; p < O.procs; p++)
        while (!__atomic_load_n(&sh->procs[p].ready, __ATOMIC_RELAXED) && nm_now_ns() < ready_by)
            fx_sleep_ms(20);
    fx_sleep_ms(1000);

    int64_t end = nm_now_ns() + (int64_t)O.seconds * 1000000000LL;
    int64_t next_report = nm_now_ns() + 10000000000LL;
    int wiped = !(O.faults & (1u << NM_WIPE));
    unsigned faults = O.faults;
    int64_t burst_end = nm_now_ns() + BURST_NS;
    while (nm_now_ns() < end && !interrupted) {
        if (far_until && nm_now_ns() >= far_until)
            clock_set_right();
        if (nm_now_ns() >= burst_end) {
            /* The quiet window runs on a clock set right, once a far step
             * has had its time. */
            while (far_until && nm_now_ns() < far_until && !interrupted)
                fx_sleep_ms(50);
            clock_set_right();
            quiet_window();
            burst_end = nm_now_ns() + BURST_NS;
            continue;
        }
        fx_sleep_ms(nm_between(500, 2000));
        if (nm_now_ns() >= end || interrupted)
            break;
        if (faults) {
            int kind;
            do
                kind = (int)(rnd() % NM_NFAULTS);
            while (!(faults & (1u << kind)));
            inject(kind, &wiped);
        }
        /* A killed worker, whatever killed it (none should die otherwise). */
        for (int p = 0; p < O.procs; p++) {
            int st;
            if (sh->procs[p].pid > 0 && waitpid(sh->procs[p].pid, &st, WNOHANG) > 0) {
                nm_harness_error("worker %d died by itself (status %d): replaced", p, st);
                sh->procs[p].pid = 0;
                spawn_worker(p);
            }
        }
        if (nm_now_ns() >= next_report) {
            next_report += 10000000000LL;
            nm_say("%" PRIu64 " acquisitions, %d faults", __atomic_load_n(&sh->next, __ATOMIC_RELAXED), nev);
        }
    }
    if (interrupted) {
        fprintf(stderr, "nemesis: interrupted: no verdict\n");
        goto out;
    }
    /* Heal: clocks back to real time unless that is a step back beyond the
     * bound; then, once the topology has settled, run on for three lease
     * times and 3 s so that every name can be acquired after the last
     * fault. */
    clock_set_right();
    if (O.redlock)
        nm_rl_clocks_right();
    if (O.shim && !O.redlock && clock_offset_ms != 0) {
        nm_event *e = nm_begin(clock_offset_ms > 0 ? NM_CLOCK_BACK : NM_CLOCK_FWD, labs(clock_offset_ms));
        long off = clock_offset_ms;
        if (off > O.lease_ms - clock_debt_ms() || off > back_room_ms())
            off = 0; /* a step back of more than the bound allows: leave it */
        if (e)
            e->server_us = issued_bound_us(nm_master_index());
        if (e && off && clock_set(0) == 0) {
            if (off > 0)
                caught_up_at = nm_now_ns() + off * 1000000LL;
            fx_sleep_ms(100);
            check_clock(nm_master_index());
            nm_heal(e);
        } else if (e) {
            nev--;
        }
    }
    int final_master = O.redlock ? nm_rl_settle(60000) : nm_wait_settled(60000);
    if (final_master < 0)
        nm_say("the topology did not settle after the faults");
    fx_sleep_ms(3L * O.lease_ms + 3000);
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELAXED);
    int64_t stop_by = nm_now_ns() + (int64_t)(4 * O.lease_ms + 10000) * 1000000LL;
    int unclean = 0;
    for (int p = 0; p < O.procs; p++) {
        int st = 0;
        while (sh->procs[p].pid > 0 && nm_now_ns() < stop_by) {
            if (waitpid(sh->procs[p].pid, &st, WNOHANG) > 0) {
                sh->procs[p].pid = 0;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    nm_say("worker %d ended with status %d", p, st);
                    unclean++;
                }
            } else {
                fx_sleep_ms(20);
            }
        }
        if (sh->procs[p].pid > 0) {
            nm_say("worker %d did not stop: killed", p);
            unclean++;
            kill_worker(p);
        }
    }

    static char figures[8192];
    nm_check_in in = {.sh = sh, .ev = ev, .nev = nev, .store_port = store.port,
                      .quiet = quiet, .nquiet = nquiet,
                      .excuse_failover = !O.redlock && O.min_replicas == 0, .redlock = O.redlock,
                      .lease_ms = O.lease_ms,
                      .recovery_bound_ms = O.recovery_bound_ms, .asked = O.faults};
    int violations = nm_check(&in, figures, sizeof figures) + unclean + (final_master < 0) +
                     harness_errors;
    printf("{\"plant\": \"%s\", \"redlock\": %d, \"seconds\": %d, \"procs\": %d, \"threads\": %d, \"names\": %d, \"lease_ms\": %d, "
           "\"min_replicas\": %d, \"seed\": %" PRIu64 ", \"workers_unclean\": %d, "
           "\"settled_at_end\": %s, \"harness_errors\": %d, %s, \"violations\": %d}\n",
           O.plant == NM_PLANT_NOLOCK              ? "nolock"
           : O.plant == NM_PLANT_UNFENCED          ? "unfenced"
           : O.plant == NM_PLANT_READERS_UNLOCKED  ? "readers-unlocked"
           : O.plant == NM_PLANT_SEM_UNLIMITED     ? "sem-unlimited"
                                                   : "none",
           O.redlock, O.seconds, O.procs, O.threads, O.names, O.lease_ms, O.min_replicas, O.seed, unclean,
           final_master >= 0 ? "true" : "false", harness_errors, figures, violations);
    fflush(stdout);
    rc = violations ? 1 : 0;
out:
    stop_all();
    return rc;
}
