/*
 * faults: fault scenarios against dlock with real processes and a real
 * redis-server, each ending in one PASS or FAIL line with what was measured.
 *
 *   faults [--list] [--unix | --sentinel | --cluster] [SCENARIO...]
 *   (no scenario: all of them, or all that apply with --sentinel, --cluster)
 *
 * Scenarios (see --list):
 *   holder_killed       the holder is SIGKILLed; a queued waiter takes over
 *   holder_frozen       the holder is SIGSTOPped past its lease; it learns
 *                       of the loss (on_lost, dlock_held, ELOST) after
 *                       SIGCONT and its token is below its successor's
 *   redis_restarted     a 3 x 8 thread storm while Redis is SIGKILLed and
 *                       restarted empty: exclusion, tokens, recovery
 *   redis_frozen        Redis SIGSTOPped: every call returns DLOCK_EREDIS
 *                       within connect + 2 x command timeout; works after
 *   waiter_killed       a queued waiter is SIGKILLed: the next waiter is
 *                       delayed at most about one waiter ttl
 *   started_redis_down  a client opened while Redis is down works once
 *                       Redis is up
 *   signal_storm        Redis SIGSTOPped and a signal every 10 ms to the
 *                       calling thread: calls still fail within their bound
 *   late_acquire        an acquire attempt delivered late by the fault proxy
 *                       never displaces the same client's newer grant
 *
 * Where the server is. By default one private redis-server R, the clients
 * on its TCP port; --unix: on its Unix socket. --sentinel: a private
 * Sentinel topology instead (master srv[0], one replica, three sentinels,
 * master name "faults"), the clients in Sentinel mode; --cluster: a private
 * 3-master Redis Cluster without replicas, the clients in Cluster mode (the
 * key prefix, dlock's default "dlock:", holds no brace, as Cluster mode
 * requires). The three options exclude each other. With --sentinel and
 * --cluster only the scenarios whose faults are in the client processes
 * run (holder_killed, holder_frozen, waiter_killed): the others signal,
 * restart or proxy the one redis-server, and naming one of them is a usage
 * error. The runner's own commands (ZCARD of a wait queue) go to the master
 * srv[0] (no failover happens here), or to each cluster node in turn until
 * one answers other than MOVED or ASK.
 *
 * Structure. The main process never opens a dlock client, starts no thread
 * and no redis-server: it forks one runner process per scenario and bounds
 * it (SCENARIO_TIMEOUT_S + RUNNER_GRACE_S). The runner starts the scenario's
 * private redis-server or topology (tests/fixture.h), maps a shared anonymous region,
 * forks the scenario's child processes (it never opens a dlock client
 * either: every child opens its own after the fork), drives them through
 * flags in the shared region and checks what they report there. Every wait
 * is bounded; alarm(SCENARIO_TIMEOUT_S) in the runner is the last resort:
 * its handler SIGKILLs the children and the server(s) (every redis-server of
 * a topology), removes their directories (best effort) and prints a FAIL
 * line. Children and servers get PR_SET_PDEATHSIG(SIGKILL), so nothing
 * outlives a killed runner. Times are CLOCK_MONOTONIC, which is one clock for all the
 * processes of the machine, so times taken in different processes compare.
 *
 * Timing. Leases are short (lease_ms 1000, waiter_ttl_ms 400) to keep each
 * scenario under about 15 s. Every bound is the library's documented figure
 * plus a slack that is stated where it is used; the slacks are generous on
 * purpose: this runs on small, noisy machines (2 cores shared with
 * redis-server and up to 24 busy threads, sanitizer builds several times
 * slower), where a wake-up can be late by hundreds of milliseconds. The
 * bounds still catch what they are for: a lock that waits for a dead
 * holder's or waiter's keys to vanish by themselves, or a call that waits
 * for its whole wait time, misses them by seconds.
 *
 * Exit status: 0 if every scenario run passed, 1 otherwise, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "proxy.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAULTS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAULTS_ASAN 1
#endif
#endif
#ifdef FAULTS_ASAN
#include <sanitizer/lsan_interface.h>
#endif

/* ------------------------------------------------------------------ */
/* Parameters                                                           */

#define LEASE_MS 1000          /* lease of every client here */
#define WAITER_TTL_MS 400      /* waiter ttl of every client here */
#define CONNECT_MS 500         /* fx_config's timeouts, the default here */
#define COMMAND_MS 1000
#define FROZEN_CONNECT_MS 300  /* redis_frozen, started_redis_down */
#define FROZEN_COMMAND_MS 500
#define SCENARIO_TIMEOUT_S 60  /* the runner's alarm() */
#define RUNNER_GRACE_S 15      /* the main process kills a runner this much later */
#define NERR 16                /* error counters indexed by -code */
#define KEY_PREFIX "dlock:"    /* every client's key_prefix: no brace (Cluster mode) */
#define SENTINEL_MASTER "faults" /* --sentinel: the master's name */
#define CLUSTER_MASTERS 3      /* --cluster: masters, no replicas */

#define STR_(x) #x
#define XSTR(x) STR_(x)
#define MS(ns) ((long long)((ns) / 1000000LL))
#define NS_PER_MS 1000000LL

/* ------------------------------------------------------------------ */
/* Runner state: the scenario's server and children                     */

#define MAX_KIDS 8

/* Where the server is (main's options, inherited by the runners). */
enum { TOPO_SINGLE, TOPO_SENTINEL, TOPO_CLUSTER };
static int use_unix;             /* --unix: the clients reach R over its Unix socket */
static int topo = TOPO_SINGLE;   /* --sentinel, --cluster */

static fx_redis R;                      /* this scenario's redis-server (TOPO_SINGLE) */
static fx_sentinel_set S;               /* --sentinel: its topology */
static fx_cluster C;                    /* --cluster: its nodes */
static pid_t runner_pid;
static volatile pid_t kids[MAX_KIDS];   /* children not reaped yet (0: free) */
static const char *scenario_name = "";
static const char *volatile phase = "starting";
static char rdir_path[256];             /* R's directory, for the watchdog's cleanup */

/* For the watchdog: every redis-server of a topology and its directory,
 * copied from S or C once the topology has started (servers started by a
 * fixture call still under way when the watchdog fires are not listed: they
 * die with the runner through PR_SET_PDEATHSIG, their directories stay). */
#define TOPO_MAX (FX_CLUSTER_MAX > 2 * FX_SENTINELS ? FX_CLUSTER_MAX : 2 * FX_SENTINELS)
static volatile pid_t topo_pid[TOPO_MAX];
static char topo_dir[TOPO_MAX][256];
static volatile int topo_n;

static int64_t now_ns(void)
{
    return (int64_t)fx_now_ns();
}

static void sleep_ms(long ms)
{
    fx_sleep_ms(ms);
}

static void sleep_until(int64_t t)
{
    int64_t d = t - now_ns();
    if (d > 0)
        sleep_ms((long)((d + NS_PER_MS - 1) / NS_PER_MS));
}

/* write(2) of a NUL-terminated string (async-signal-safe). */
static void put_raw(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* The watchdog's removal of a server's directory (async-signal-safe: raw
 * getdents64, unlinkat, rmdir): every file in it (redis.log; a socket, a
 * sentinel.conf, a nodes.conf, a replica's dump.rdb...; redis writes no
 * subdirectories), then the directory. Best effort: a few passes, since
 * unlinking while reading may skip entries. */
struct wd_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static void wd_remove_dir(const char *dir)
{
    static char buf[4096] __attribute__((aligned(8)));
    if (!dir[0])
        return;
    for (int pass = 0; pass < 3; pass++) {
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            return;
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct wd_dirent64 *e = (struct wd_dirent64 *)(void *)(buf + off);
                off += e->d_reclen;
                if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                    unlinkat(fd, e->d_name, 0);
            }
        }
        close(fd);
        if (rmdir(dir) == 0)
            return;
    }
}

/* The watchdog's wait for a SIGKILLed server (a child of the runner), so that
 * it creates no file after its directory is emptied: at most ms. */
static void wd_reap(pid_t pid, long ms)
{
    struct timespec ts = {0, 5 * 1000000L};
    for (long t = 0; t <= ms; t += 5) {
        pid_t w = waitpid(pid, NULL, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR))
            return;
        nanosleep(&ts, NULL);
    }
}

/* The watchdog: the scenario overran SCENARIO_TIMEOUT_S. Only
 * async-signal-safe calls: kill the children and the server(s), remove the
 * servers' directories, print, exit. For a topology this is best effort:
 * only the servers listed in topo_pid/topo_dir (see there) are killed and
 * their directories removed here; any other directory is left behind. */
static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    pid_t rp = R.pid;
    if (rp > 0)
        kill(rp, SIGKILL);
    int tn = topo_n;
    for (int i = 0; i < tn; i++)
        if (topo_pid[i] > 0)
            kill(topo_pid[i], SIGKILL);
    if (rp > 0)
        wd_reap(rp, 1000);
    wd_remove_dir(rdir_path);
    for (int i = 0; i < tn; i++) {
        if (topo_pid[i] > 0)
            wd_reap(topo_pid[i], 1000);
        wd_remove_dir(topo_dir[i]);
    }
    errno = saved;
    put_raw(1, "faults: ");
    put_raw(1, scenario_name);
    put_raw(1, " FAIL (watchdog: still running after " XSTR(SCENARIO_TIMEOUT_S) " s, while ");
    put_raw(1, phase);
    put_raw(1, ")\n");
    _exit(1);
}

static const char *topo_name(void)
{
    return topo == TOPO_SENTINEL ? "--sentinel" : topo == TOPO_CLUSTER ? "--cluster" : "";
}

/* Lists a started topology's servers for the watchdog. */
static void topo_note(const fx_redis *srv)
{
    int i = topo_n;
    if (i >= TOPO_MAX || srv->pid <= 0)
        return;
    snprintf(topo_dir[i], sizeof topo_dir[i], "%s", srv->dir);
    topo_pid[i] = srv->pid;
    __atomic_store_n(&topo_n, i + 1, __ATOMIC_RELEASE);
}

/* Starts the scenario's server: R, or the topology. 0, or -1 (fixture's
 * message on stderr). */
static int redis_start(void)
{
    if (topo == TOPO_SENTINEL) {
        if (fx_sentinel_start(&S, SENTINEL_MASTER) != 0)
            return -1;
        for (int i = 0; i < S.nsrv; i++)
            topo_note(&S.srv[i]);
        for (int i = 0; i < FX_SENTINELS; i++)
            topo_note(&S.sentinel[i]);
        return 0;
    }
    if (topo == TOPO_CLUSTER) {
        if (fx_cluster_start(&C, CLUSTER_MASTERS, 0) != 0)
            return -1;
        for (int i = 0; i < C.n; i++)
            topo_note(&C.node[i]);
        return 0;
    }
    fx_redis_opts o = {.unix_socket = use_unix};
    if (fx_redis_start_opts(&R, &o) != 0)
        return -1;
    snprintf(rdir_path, sizeof rdir_path, "%s", R.dir);
    return 0;
}

static void redis_stop(void)
{
    if (topo != TOPO_SINGLE) {
        /* Unlisted first: the watchdog must not kill a reaped server's pid,
         * reused by now; a server still there dies with the runner. */
        __atomic_store_n(&topo_n, 0, __ATOMIC_RELEASE);
        if (topo == TOPO_SENTINEL)
            fx_sentinel_stop(&S);
        else
            fx_cluster_stop(&C);
        return;
    }
    fx_redis_stop(&R);
    rdir_path[0] = '\0';
}

/* Forks a child that runs fn(arg) and never returns to the runner's code. */
static pid_t start_child(void (*fn)(void *), void *arg)
{
    int slot = -1;
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == 0) {
            slot = i;
            break;
        }
    if (slot < 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != runner_pid)
            _exit(99);
        fn(arg);
        _exit(0);
    }
    kids[slot] = pid;
    return pid;
}

static void forget_kid(pid_t pid)
{
    for (int i = 0; i < MAX_KIDS; i++)
        if (kids[i] == pid)
            kids[i] = 0;
}

/* Waits at most ms for child pid to exit: 1 (status in *st) or 0. */
static int reap(pid_t pid, long ms, int *st)
{
    int64_t deadline = now_ns() + (int64_t)ms * NS_PER_MS;
    for (;;) {
        int s = 0;
        pid_t w = waitpid(pid, &s, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD)) {
            if (st)
                *st = w == pid ? s : 0;
            forget_kid(pid);
            return 1;
        }
        if (now_ns() >= deadline)
            return 0;
        sleep_ms(2);
    }
}

/* SIGKILLs and reaps every child still there (end of a scenario). */
static void kill_kids(void)
{
    for (int i = 0; i < MAX_KIDS; i++) {
        pid_t pid = kids[i];
        if (pid > 0) {
            kill(pid, SIGKILL);
            reap(pid, 5000, NULL);
            kids[i] = 0;
        }
    }
}

/* "exit 0", "killed by SIGKILL" ... */
static const char *status_text(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "status 0x%x", st);
    return buf;
}

static void *shm_alloc(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* The reply of a command to the server at port (a connection of the
 * runner's own, opened and closed per call), or NULL. */
static redisReply *cmd_at_v(int port, const char *fmt, va_list ap)
{
    redisContext *c = fx_connect("127.0.0.1", port);
    if (!c)
        return NULL;
    redisReply *r = redisvCommand(c, fmt, ap);
    redisFree(c);
    return r;
}

/* 1 if r is a cluster redirection (the key's slot is another node's). */
static int is_redirect(const redisReply *r)
{
    return r->type == REDIS_REPLY_ERROR &&
           (strncmp(r->str, "MOVED ", 6) == 0 || strncmp(r->str, "ASK ", 4) == 0);
}

/* An integer reply of a command to this scenario's server, or -1. The
 * server: R; --sentinel: the master srv[0] (no failover in the scenarios
 * run there); --cluster: the first node whose reply is not MOVED or ASK. */
static long long redis_int(const char *fmt, ...)
{
    int ports[FX_CLUSTER_MAX], np = 0;
    if (topo == TOPO_SENTINEL)
        ports[np++] = S.srv[0].port;
    else if (topo == TOPO_CLUSTER)
        for (int i = 0; i < C.n; i++)
            ports[np++] = C.node[i].port;
    else
        ports[np++] = R.port;
    long long v = -1;
    for (int i = 0; i < np; i++) {
        va_list ap;
        va_start(ap, fmt);
        redisReply *r = cmd_at_v(ports[i], fmt, ap);
        va_end(ap);
        if (r && is_redirect(r)) {
            freeReplyObject(r);
            continue;
        }
        if (r && r->type == REDIS_REPLY_INTEGER)
            v = r->integer;
        if (r)
            freeReplyObject(r);
        break;
    }
    return v;
}

/* Waits at most ms until ZCARD of key is n: 1, or 0 (last count in *last). */
static int wait_zcard(const char *key, long long n, long ms, long long *last)
{
    int64_t deadline = now_ns() + (int64_t)ms * NS_PER_MS;
    for (;;) {
        long long v = redis_int("ZCARD %s", key);
        if (last)
            *last = v;
        if (v == n)
            return 1;
        if (now_ns() >= deadline)
            return 0;
        sleep_ms(5);
    }
}

/* ------------------------------------------------------------------ */
/* What a child shares with the runner                                  */

typedef struct proc_sh {
    int step;          /* progress reported by the child; -1: it failed (err says why) */
    int go;            /* commands from the runner */
    int call;          /* redis_frozen: the call under way */
    int rc[16];
    int64_t t[16];     /* times (CLOCK_MONOTONIC ns) */
    uint64_t fence[4];
    int held[4];
    int lost_count;    /* on_lost calls */
    uint64_t lost_fence;
    int64_t lost_ns;
    int brc[16];       /* redis_frozen: the burst threads' results */
    int64_t bdur[16];
    char err[320];
} proc_sh;

static int ld(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void st_int(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Waits at most ms until ps->step >= step: 1; 0 on timeout; -1 if the child
 * reported a failure. */
static int wait_step(proc_sh *ps, int step, long ms)
{
    int64_t deadline = now_ns() + (int64_t)ms * NS_PER_MS;
    for (;;) {
        int s = ld(&ps->step);
        if (s < 0)
            return -1;
        if (s >= step)
            return 1;
        if (now_ns() >= deadline)
            return 0;
        sleep_ms(1);
    }
}

/* Child side: waits at most ms until ps->go >= v (1), else 0. */
static int wait_go(proc_sh *ps, int v, long ms)
{
    int64_t deadline = now_ns() + (int64_t)ms * NS_PER_MS;
    while (ld(&ps->go) < v) {
        if (now_ns() >= deadline)
            return 0;
        sleep_ms(1);
    }
    return 1;
}

static void child_fail(proc_sh *ps, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void child_fail(proc_sh *ps, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err, sizeof ps->err, fmt, ap);
    va_end(ap);
    st_int(&ps->step, -1);
    _exit(3);
}

/* Acquires `name` in a child: records the result in ps->rc[0], the fence
 * in ps->fence[0] and the time the call returned in ps->t[1]; fails the
 * child, naming `who` and the time waited, unless it got the lock. */
static uint64_t child_acquire(proc_sh *ps, dlock_client *c, const char *name, int64_t wait_ms,
                              const char *who)
{
    uint64_t fence = 0;
    int64_t t0 = now_ns();
    int rc = dlock_acquire(c, name, wait_ms, &fence);
    ps->t[1] = now_ns();
    ps->rc[0] = rc;
    ps->fence[0] = fence;
    if (rc != DLOCK_OK)
        child_fail(ps, "%s: acquire: %s: %s (after %lld ms)", who, dlock_err_name(rc),
                   dlock_last_error(), (long long)MS(ps->t[1] - t0));
    return fence;
}


/* Closes the client, checks for leaks in sanitizer builds, exits. */
static void child_exit(dlock_client *c) __attribute__((noreturn));
static void child_exit(dlock_client *c)
{
    dlock_client_close(c);
    int status = 0;
#ifdef FAULTS_ASAN
    if (__lsan_do_recoverable_leak_check())
        status = 4;
#endif
    _exit(status);
}

static void cfg_base(dlock_config *cfg)
{
    fx_config(cfg, &R); /* 127.0.0.1:R.port, connect 500, command 1000 */
    if (use_unix || topo != TOPO_SINGLE) { /* host and port back to unset */
        cfg->redis_host = NULL;
        cfg->redis_port = 6379;
    }
    if (use_unix) {
        cfg->redis_unix_path = R.unix_path;
    } else if (topo == TOPO_SENTINEL) {
        cfg->sentinels = S.addrs;
        cfg->sentinel_master = SENTINEL_MASTER;
    } else if (topo == TOPO_CLUSTER) {
        cfg->cluster_nodes = C.addrs;
    }
    cfg->key_prefix = KEY_PREFIX;
    cfg->lease_ms = LEASE_MS;
    cfg->waiter_ttl_ms = WAITER_TTL_MS;
}

static dlock_client *open_client(proc_sh *ps, const dlock_config *cfg)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(cfg, &c);
    if (rc != DLOCK_OK)
        child_fail(ps, "dlock_client_open: %s: %s", dlock_err_name(rc), dlock_last_error());
    return c;
}

/* Text of a child's failure for a FAIL line: what it reported, or where it
 * stopped and, if it is gone, how it ended (a crash, a sanitizer report). */
static const char *child_why(proc_sh *ps, pid_t pid, const char *who, char *buf, size_t n)
{
    int st = 0;
    char how[96] = "";
    if (pid > 0 && reap(pid, 0, &st)) {
        char t[64];
        snprintf(how, sizeof how, " (it ended: %s)", status_text(st, t, sizeof t));
    }
    if (ld(&ps->step) < 0)
        snprintf(buf, n, "%s failed: %s%s", who, ps->err, how);
    else
        snprintf(buf, n, "%s stuck at step %d%s", who, ld(&ps->step), how);
    return buf;
}

/* An error code's name without the DLOCK_ prefix. */
static const char *short_name(int code)
{
    const char *s = dlock_err_name(code);
    return strncmp(s, "DLOCK_", 6) == 0 ? s + 6 : s;
}

/* Result text of a scenario: res is the parenthesis of the PASS/FAIL line. */
#define RES_MAX 2048
static char res[RES_MAX];

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res, sizeof res, fmt, ap);
    va_end(ap);
    return 0;
}

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
 */
#define HK_SLACK_MS 3000

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

static int sc_holder_killed(void)
{
    proc_sh *sh = shm_alloc(2 * sizeof *sh);
    if (!sh)
        return fail("mmap failed");
    proc_sh *a = &sh[0], *b = &sh[1];
    char why[512], st1[64];
    int st;
    const long bound = LEASE_MS + WAITER_TTL_MS + HK_SLACK_MS;

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
    if (!wait_zcard(KEY_PREFIX "{k}:q", 1, 5000, &q))
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
        ADD("; over the bound of %ld ms = lease %d + waiter ttl %d + slack %d", bound, LEASE_MS,
            WAITER_TTL_MS, HK_SLACK_MS);
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
 * releases it with DLOCK_OK).
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

static int sc_holder_frozen(void)
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

static void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
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

static int sc_redis_restarted(void)
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

static int sc_redis_frozen(void)
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

static int sc_waiter_killed(void)
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

static int sc_started_redis_down(void)
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

static int sc_signal_storm(void)
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

/* ------------------------------------------------------------------ */
/* 8. late_acquire                                                      */

/*
 * Client X reaches Redis through the fault proxy (tests/proxy.h), which runs
 * in a process of its own (a runner with a proxy thread could not fork
 * children that start threads under ThreadSanitizer) and is driven through
 * shared memory. Client Y connects directly.
 *   1. The proxy holds back the next request that names {late}: X's acquire
 *      attempt N. X's try fails (DLOCK_EREDIS after its 300 ms timeout); the
 *      renewal thread takes over attempt N as an orphan.
 *   2. X acquires again: attempt N2 is granted; X's thread holds the lock.
 *   3. Y waits for the lock (it is in the wait queue).
 *   4. The proxy delivers attempt N to Redis. X keeps holding for 3 s while
 *      the orphan release of N runs (after 0, 100, 200, 400, 800 ms), and
 *      records the last time dlock_held() said 1; then X releases.
 * Y must be granted only after that last time, with a greater token; X's
 * release must return DLOCK_OK and on_lost must not run. Before attempts
 * were ordered in Redis, N re-granted X's lease in place and the orphan
 * release of N deleted it: Y was granted while X still held (reproduced: a
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

static int sc_late_acquire(void)
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

/* ------------------------------------------------------------------ */
/* Driver                                                               */

typedef struct scenario {
    const char *name;
    const char *desc;
    int (*run)(void);
    int single; /* 1: it signals, restarts or proxies R: not with --sentinel, --cluster */
} scenario;

static const scenario SCENARIOS[] = {
    {"holder_killed", "the holder is SIGKILLed; a queued waiter gets the lock within"
                      " lease + waiter ttl + 3 s, with a greater token", sc_holder_killed, 0},
    {"holder_frozen", "the holder is SIGSTOPped for 2.5 leases; another takes over; after SIGCONT"
                      " the holder sees on_lost, dlock_held 0, release ELOST", sc_holder_frozen, 0},
    {"redis_restarted", "3 procs x 8 threads on 2 names while redis is SIGKILLed and restarted"
                        " empty: exclusion, tokens, no hang, recovery", sc_redis_restarted, 1},
    {"redis_frozen", "redis SIGSTOPped: every call returns DLOCK_EREDIS within connect + 2 x"
                     " command timeout; after SIGCONT an acquire succeeds", sc_redis_frozen, 1},
    {"waiter_killed", "a queued waiter is SIGKILLed; the next waiter gets the lock within"
                      " about one waiter ttl of the release", sc_waiter_killed, 0},
    {"started_redis_down", "a client opened while redis is down fails fast, then works once"
                           " redis is restarted on its port", sc_started_redis_down, 1},
    {"signal_storm", "redis SIGSTOPped and a SIGUSR1 every 10 ms to the calling thread: every"
                     " call still returns DLOCK_EREDIS within its bound", sc_signal_storm, 1},
    {"late_acquire", "an acquire attempt held back by the proxy reaches redis after a newer"
                     " grant: no other client is granted while the holder holds", sc_late_acquire, 1},
};
#define NSCEN ((int)(sizeof SCENARIOS / sizeof SCENARIOS[0]))

/* The runner process of one scenario: never returns. */
static void run_scenario(const scenario *s) __attribute__((noreturn));
static void run_scenario(const scenario *s)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    runner_pid = getpid();
    scenario_name = s->name;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(SCENARIO_TIMEOUT_S);

    int64_t t0 = now_ns();
    int ok;
    res[0] = '\0';
    const char *what = topo == TOPO_SENTINEL ? "Sentinel topology (master, replica, 3 sentinels)"
                       : topo == TOPO_CLUSTER ? "Redis Cluster of " XSTR(CLUSTER_MASTERS) " masters"
                                              : "redis-server";
    phase = topo == TOPO_SENTINEL ? "starting the Sentinel topology"
            : topo == TOPO_CLUSTER ? "starting the Redis Cluster"
                                   : "starting redis-server";
    if (redis_start() != 0) {
        ok = fail("could not start a private %s", what);
    } else {
        ok = s->run();
        phase = "cleaning up";
        kill_kids();
        redis_stop();
    }
    alarm(0);
    printf("faults: %s %s (%s) [%.1f s]\n", s->name, ok ? "PASS" : "FAIL", res,
           (double)(now_ns() - t0) / 1e9);
    fflush(stdout);
    _exit(ok ? 0 : 1);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: faults [--list] [--unix | --sentinel | --cluster] [SCENARIO...]\n"
            "Fault scenarios against dlock with real processes and a private redis-server.\n"
            "Runs the named scenarios (all without arguments), each printing one PASS or\n"
            "FAIL line with what it measured. --list lists the scenarios.\n"
            "  --unix      the clients reach the server over a Unix socket (through the\n"
            "              proxy, TCP)\n"
            "  --sentinel  a private Sentinel topology instead (a master, one replica and\n"
            "              three sentinels, master name \"" SENTINEL_MASTER "\"); the clients in\n"
            "              Sentinel mode\n"
            "  --cluster   a private Redis Cluster of " XSTR(CLUSTER_MASTERS) " masters (no replicas) instead;\n"
            "              the clients in Cluster mode\n"
            "These three exclude each other. With --sentinel or --cluster only the\n"
            "scenarios with faults in the client processes apply (holder_killed,\n"
            "holder_frozen, waiter_killed; all three without arguments); the others\n"
            "signal, restart or proxy the one redis-server and are refused.\n"
            "Exit status: 0 if every scenario passed, 1 otherwise, 2 on bad usage.\n");
}

int main(int argc, char **argv)
{
    int sel[64], nsel = 0, sentinel = 0, cluster = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            for (int k = 0; k < NSCEN; k++)
                printf("%-20s %s\n", SCENARIOS[k].name, SCENARIOS[k].desc);
            return 0;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--unix")) {
            use_unix = 1;
            continue;
        }
        if (!strcmp(argv[i], "--sentinel")) {
            sentinel = 1;
            continue;
        }
        if (!strcmp(argv[i], "--cluster")) {
            cluster = 1;
            continue;
        }
        int found = -1;
        for (int k = 0; k < NSCEN; k++)
            if (!strcmp(argv[i], SCENARIOS[k].name))
                found = k;
        if (found < 0) {
            fprintf(stderr, "faults: unknown scenario or option '%s' (try faults --list)\n",
                    argv[i]);
            return 2;
        }
        if (nsel >= (int)(sizeof sel / sizeof sel[0])) {
            fprintf(stderr, "faults: too many scenarios\n");
            return 2;
        }
        sel[nsel++] = found;
    }
    if (use_unix + sentinel + cluster > 1) {
        fprintf(stderr, "faults: --unix, --sentinel and --cluster exclude each other\n");
        return 2;
    }
    topo = sentinel ? TOPO_SENTINEL : cluster ? TOPO_CLUSTER : TOPO_SINGLE;
    if (strpbrk(KEY_PREFIX, "{}")) { /* Cluster mode refuses it; keep it true */
        fprintf(stderr, "faults: the key prefix \"%s\" holds a brace\n", KEY_PREFIX);
        return 2;
    }
    for (int i = 0; i < nsel; i++)
        if (topo != TOPO_SINGLE && SCENARIOS[sel[i]].single) {
            fprintf(stderr,
                    "faults: %s signals, restarts or proxies the single redis-server: not with"
                    " %s (which runs holder_killed, holder_frozen and waiter_killed)\n",
                    SCENARIOS[sel[i]].name, topo_name());
            return 2;
        }
    if (nsel == 0)
        for (int k = 0; k < NSCEN; k++)
            if (topo == TOPO_SINGLE || !SCENARIOS[k].single)
                sel[nsel++] = k;

    signal(SIGPIPE, SIG_IGN);
    int64_t t0 = now_ns();
    int passed = 0;
    for (int i = 0; i < nsel; i++) {
        const scenario *s = &SCENARIOS[sel[i]];
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            printf("faults: %s FAIL (fork: %s)\n", s->name, strerror(errno));
            continue;
        }
        if (pid == 0)
            run_scenario(s);
        int st = 0;
        long bound_ms = (SCENARIO_TIMEOUT_S + RUNNER_GRACE_S) * 1000L;
        int64_t deadline = now_ns() + (int64_t)bound_ms * NS_PER_MS;
        int done = 0;
        while (!done) {
            pid_t w = waitpid(pid, &st, WNOHANG);
            if (w == pid) {
                done = 1;
                break;
            }
            if (w < 0 && errno != EINTR)
                break;
            if (now_ns() >= deadline)
                break;
            sleep_ms(20);
        }
        if (!done) {
            /* its children and server die with it (PR_SET_PDEATHSIG) */
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            printf("faults: %s FAIL (runner still alive %ld s after start: killed)\n", s->name,
                   bound_ms / 1000);
            continue;
        }
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            passed++;
        } else if (!WIFEXITED(st)) {
            char buf[64];
            printf("faults: %s FAIL (runner %s)\n", s->name, status_text(st, buf, sizeof buf));
        }
        fflush(stdout);
    }
    printf("faults: %d of %d scenario(s) passed in %.1f s%s%s%s\n", passed, nsel,
           (double)(now_ns() - t0) / 1e9, topo != TOPO_SINGLE ? " (" : "", topo_name(),
           topo != TOPO_SINGLE ? ")" : "");
    return passed == nsel ? 0 : 1;
}
