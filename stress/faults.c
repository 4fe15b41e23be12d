/*
 * faults: fault scenarios against dlock with real processes and a real
 * redis-server, each ending in one PASS or FAIL line with what was measured.
 *
 *   faults [--list] [--unix | --sentinel | --cluster | --redlock] [SCENARIO...]
 *   (no scenario: all that apply where the server is: see below)
 *
 * Scenarios (see --list):
 *   holder_killed       the holder is SIGKILLed; a queued waiter takes over
 *                       (--redlock: a polling one)
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
 *   nodes_frozen        --redlock only: 2 of the 3 nodes SIGSTOPped: every
 *                       call returns DLOCK_EREDIS (DLOCK_ELOST for a lost
 *                       lease) within its bound, a wait without end waits;
 *                       the calls work after SIGCONT
 *
 * Where the server is. By default one private redis-server R, the clients
 * on its TCP port; --unix: on its Unix socket. --sentinel: a private
 * Sentinel topology instead (master srv[0], one replica, three sentinels,
 * master name "faults"), the clients in Sentinel mode; --cluster: a private
 * 3-master Redis Cluster without replicas, the clients in Cluster mode (the
 * key prefix, dlock's default "dlock:", holds no brace, as Cluster mode
 * requires); --redlock: REDLOCK_NODES private independent redis-servers,
 * seeded fresh by the runner at start (as `dlockctl seed-fresh` does), the
 * clients in Redlock mode (redlock_nodes; exclusive locks).
 * The four options exclude each other. With --sentinel and --cluster only
 * the scenarios whose faults are in the client processes run
 * (holder_killed, holder_frozen, waiter_killed): the others signal, restart
 * or proxy the one redis-server. With --redlock: holder_killed (the waiter
 * polls: the runner reads no queue, and the bound is the poll's),
 * holder_frozen and nodes_frozen; waiter_killed is about the wait queue.
 * Naming a scenario that does not run where the server is is a usage
 * error. The runner's own commands (ZCARD of a wait queue) go to the master
 * srv[0] (no failover happens here), or to each cluster node in turn until
 * one answers other than MOVED or ASK.
 *
 * Structure. The main process never opens a dlock client, starts no thread
 * and no redis-server: it forks one runner process per scenario and bounds
 * it (SCENARIO_TIMEOUT_S + RUNNER_GRACE_S). The runner starts the scenario's
 * private redis-server or topology (tests/support/fixture.h), maps a shared anonymous region,
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
 * Files. faults.c (this file): options, the scenario table, the runner and
 * its watchdog, the server or topology, the child processes, shared memory,
 * the common client configuration; faults.h declares what the scenario
 * files use of it. The scenarios: faults_holders.c (holder_killed,
 * holder_frozen, waiter_killed), faults_restart.c (redis_restarted),
 * faults_redis.c (redis_frozen, started_redis_down, signal_storm),
 * faults_order.c (late_acquire), faults_redlock.c (nodes_frozen).
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

#include "faults.h"

/* ------------------------------------------------------------------ */
/* Runner state: the scenario's server and children                     */

#define MAX_KIDS 8

/* Where the server is (main's options, inherited by the runners). */
enum { TOPO_SINGLE, TOPO_SENTINEL, TOPO_CLUSTER, TOPO_REDLOCK };
static int use_unix;             /* --unix: the clients reach R over its Unix socket */
static int topo = TOPO_SINGLE;   /* --sentinel, --cluster, --redlock */

fx_redis R;                             /* this scenario's redis-server (TOPO_SINGLE) */
static fx_sentinel_set S;               /* --sentinel: its topology */
static fx_cluster C;                    /* --cluster: its nodes */
static fx_redis RL[REDLOCK_NODES];      /* --redlock: the independent masters */
static int rl_started;                  /* how many of them run */
static char rl_addrs[REDLOCK_NODES * 24]; /* "127.0.0.1:port,..." */
static pid_t runner_pid;
static volatile pid_t kids[MAX_KIDS];   /* children not reaped yet (0: free) */
static const char *scenario_name = "";
const char *volatile phase = "starting";
static char rdir_path[256];             /* R's directory, for the watchdog's cleanup */

/* For the watchdog: every redis-server of a topology and its directory,
 * copied from S, C or RL once the topology has started (servers started by a
 * fixture call still under way when the watchdog fires are not listed: they
 * die with the runner through PR_SET_PDEATHSIG, their directories stay). */
#define TOPO_MAX_ (FX_CLUSTER_MAX > 2 * FX_SENTINELS ? FX_CLUSTER_MAX : 2 * FX_SENTINELS)
#define TOPO_MAX (TOPO_MAX_ > REDLOCK_NODES ? TOPO_MAX_ : REDLOCK_NODES)
static volatile pid_t topo_pid[TOPO_MAX];
static char topo_dir[TOPO_MAX][256];
static volatile int topo_n;

int64_t now_ns(void)
{
    return (int64_t)fx_now_ns();
}

void sleep_ms(long ms)
{
    fx_sleep_ms(ms);
}

void sleep_until(int64_t t)
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
    return topo == TOPO_SENTINEL ? "--sentinel"
           : topo == TOPO_CLUSTER ? "--cluster"
           : topo == TOPO_REDLOCK ? "--redlock"
                                  : "";
}

int in_redlock(void)
{
    return topo == TOPO_REDLOCK;
}

fx_redis *redlock_node(int i)
{
    return i >= 0 && i < rl_started ? &RL[i] : NULL;
}

/* --redlock: seeds the fresh nodes on KEY_PREFIX, as `dlockctl
 * --redlock-nodes LIST seed-fresh` does. 0, or -1 with a message. */
static int redlock_seed(void)
{
    return fx_redlock_seed_fresh(rl_addrs, KEY_PREFIX, LEASE_MS, 2000, 10000);
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

/* --redlock: stops the nodes started (a node a scenario left stopped is
 * continued first: it would not stop on SIGTERM). */
static void redlock_stop(void)
{
    __atomic_store_n(&topo_n, 0, __ATOMIC_RELEASE);
    for (; rl_started > 0; rl_started--) {
        fx_redis_signal(&RL[rl_started - 1], SIGCONT);
        fx_redis_stop(&RL[rl_started - 1]);
    }
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
    if (topo == TOPO_REDLOCK) {
        size_t at = 0;
        for (; rl_started < REDLOCK_NODES; rl_started++) {
            if (fx_redis_start(&RL[rl_started]) != 0)
                break;
            topo_note(&RL[rl_started]);
            at += (size_t)snprintf(rl_addrs + at, sizeof rl_addrs - at, "%s127.0.0.1:%d",
                                   at ? "," : "", RL[rl_started].port);
        }
        if (rl_started == REDLOCK_NODES && redlock_seed() == 0)
            return 0;
        redlock_stop();
        return -1;
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
        if (topo == TOPO_SENTINEL) {
            fx_sentinel_stop(&S);
        } else if (topo == TOPO_CLUSTER) {
            fx_cluster_stop(&C);
        } else {
            redlock_stop();
        }
        return;
    }
    fx_redis_stop(&R);
    rdir_path[0] = '\0';
}

/* Forks a child that runs fn(arg) and never returns to the runner's code. */
pid_t start_child(void (*fn)(void *), void *arg)
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
int reap(pid_t pid, long ms, int *st)
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
void kill_kids(void)
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
const char *status_text(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "status 0x%x", st);
    return buf;
}

void *shm_alloc(size_t n)
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
int wait_zcard(const char *key, long long n, long ms, long long *last)
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

/* Sleeps us microseconds, also when a signal interrupts the sleep. */
void sleep_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------ */
/* What a child shares with the runner                                  */

int ld(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void st_int(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

/* Waits at most ms until ps->step >= step: 1; 0 on timeout; -1 if the child
 * reported a failure. */
int wait_step(proc_sh *ps, int step, long ms)
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
int wait_go(proc_sh *ps, int v, long ms)
{
    int64_t deadline = now_ns() + (int64_t)ms * NS_PER_MS;
    while (ld(&ps->go) < v) {
        if (now_ns() >= deadline)
            return 0;
        sleep_ms(1);
    }
    return 1;
}

void child_fail(proc_sh *ps, const char *fmt, ...)
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
uint64_t child_acquire(proc_sh *ps, dlock_client *c, const char *name, int64_t wait_ms,
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
void child_exit(dlock_client *c)
{
    dlock_client_close(c);
    int status = 0;
#ifdef FAULTS_ASAN
    if (__lsan_do_recoverable_leak_check())
        status = 4;
#endif
    _exit(status);
}

void cfg_base(dlock_config *cfg)
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
    } else if (topo == TOPO_REDLOCK) {
        cfg->redlock_nodes = rl_addrs; /* (protocol 2: the default) */
    }
    cfg->key_prefix = KEY_PREFIX;
    cfg->lease_ms = LEASE_MS;
    cfg->waiter_ttl_ms = WAITER_TTL_MS;
}

dlock_client *open_client(proc_sh *ps, const dlock_config *cfg)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(cfg, &c);
    if (rc != DLOCK_OK)
        child_fail(ps, "dlock_client_open: %s: %s", dlock_err_name(rc), dlock_last_error());
    return c;
}

/* Text of a child's failure for a FAIL line: what it reported, or where it
 * stopped and, if it is gone, how it ended (a crash, a sanitizer report). */
const char *child_why(proc_sh *ps, pid_t pid, const char *who, char *buf, size_t n)
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
const char *short_name(int code)
{
    const char *s = dlock_err_name(code);
    return strncmp(s, "DLOCK_", 6) == 0 ? s + 6 : s;
}

/* Result text of a scenario: res is the parenthesis of the PASS/FAIL line. */
char res[RES_MAX];

int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res, sizeof res, fmt, ap);
    va_end(ap);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Driver                                                               */

typedef struct scenario {
    const char *name;
    const char *desc;
    int (*run)(void);
    unsigned modes; /* where it runs: a bit per TOPO_ (M_) */
} scenario;

#define M_SINGLE (1u << TOPO_SINGLE)
#define M_SENTINEL (1u << TOPO_SENTINEL)
#define M_CLUSTER (1u << TOPO_CLUSTER)
#define M_REDLOCK (1u << TOPO_REDLOCK)
#define M_CLIENTS (M_SINGLE | M_SENTINEL | M_CLUSTER) /* faults in the client processes */

static const scenario SCENARIOS[] = {
    {"holder_killed", "the holder is SIGKILLed; a queued waiter gets the lock within"
                      " lease + waiter ttl + 3 s (Redlock: polling, lease + lease/3 + 3 s), with a greater"
                      " token", sc_holder_killed, M_CLIENTS | M_REDLOCK},
    {"holder_frozen", "the holder is SIGSTOPped for 2.5 leases; another takes over; after SIGCONT"
                      " the holder sees on_lost, dlock_held 0, release ELOST", sc_holder_frozen,
                      M_CLIENTS | M_REDLOCK},
    {"redis_restarted", "3 procs x 8 threads on 2 names while redis is SIGKILLed and restarted"
                        " empty: exclusion, tokens, no hang, recovery", sc_redis_restarted, M_SINGLE},
    {"redis_frozen", "redis SIGSTOPped: every call returns DLOCK_EREDIS within connect + 2 x"
                     " command timeout; after SIGCONT an acquire succeeds", sc_redis_frozen, M_SINGLE},
    {"waiter_killed", "a queued waiter is SIGKILLed; the next waiter gets the lock within"
                      " about one waiter ttl of the release", sc_waiter_killed, M_CLIENTS},
    {"started_redis_down", "a client opened while redis is down fails fast, then works once"
                           " redis is restarted on its port", sc_started_redis_down, M_SINGLE},
    {"signal_storm", "redis SIGSTOPped and a SIGUSR1 every 10 ms to the calling thread: every"
                     " call still returns DLOCK_EREDIS within its bound", sc_signal_storm, M_SINGLE},
    {"late_acquire", "an acquire attempt held back by the proxy reaches redis after a newer"
                     " grant: no other client is granted while the holder holds", sc_late_acquire, M_SINGLE},
    {"nodes_frozen", "--redlock only: 2 of 3 nodes SIGSTOPped: acquires, a try and releases"
                     " return EREDIS (ELOST once lost) within their bounds; work after SIGCONT",
     sc_nodes_frozen, M_REDLOCK},
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
                       : topo == TOPO_REDLOCK ? "set of " XSTR(REDLOCK_NODES) " Redlock nodes, seeded"
                                              : "redis-server";
    phase = topo == TOPO_SENTINEL ? "starting the Sentinel topology"
            : topo == TOPO_CLUSTER ? "starting the Redis Cluster"
            : topo == TOPO_REDLOCK ? "starting and seeding the Redlock nodes"
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
            "usage: faults [--list] [--unix | --sentinel | --cluster | --redlock] [SCENARIO...]\n"
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
            "  --redlock   " XSTR(REDLOCK_NODES) " private independent redis-servers instead, seeded fresh\n"
            "              at start; the clients in Redlock mode (redlock_nodes)\n"
            "These four exclude each other. With --sentinel or --cluster only the\n"
            "scenarios with faults in the client processes apply (holder_killed,\n"
            "holder_frozen, waiter_killed; all three without arguments); the others\n"
            "signal, restart or proxy the one redis-server and are refused.\n"
            "With --redlock: holder_killed, holder_frozen and nodes_frozen (Redlock\n"
            "only: 2 of the 3 nodes SIGSTOPped); waiter_killed needs a wait queue,\n"
            "which Redlock mode has not, and is refused with the others.\n"
            "Exit status: 0 if every scenario passed, 1 otherwise, 2 on bad usage.\n");
}

int main(int argc, char **argv)
{
    int sel[64], nsel = 0, sentinel = 0, cluster = 0, redlock = 0;
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
        if (!strcmp(argv[i], "--redlock")) {
            redlock = 1;
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
    if (use_unix + sentinel + cluster + redlock > 1) {
        fprintf(stderr, "faults: --unix, --sentinel, --cluster and --redlock exclude each other\n");
        return 2;
    }
    topo = sentinel ? TOPO_SENTINEL : cluster ? TOPO_CLUSTER : redlock ? TOPO_REDLOCK : TOPO_SINGLE;
    if (strpbrk(KEY_PREFIX, "{}")) { /* Cluster mode refuses it; keep it true */
        fprintf(stderr, "faults: the key prefix \"%s\" holds a brace\n", KEY_PREFIX);
        return 2;
    }
    for (int i = 0; i < nsel; i++)
        if (!(SCENARIOS[sel[i]].modes & (1u << topo))) {
            char which[160] = "";
            size_t at = 0;
            for (int k = 0; k < NSCEN; k++)
                if (SCENARIOS[k].modes & (1u << topo))
                    at += (size_t)snprintf(which + at, at < sizeof which ? sizeof which - at : 0,
                                           "%s%s", at ? ", " : "", SCENARIOS[k].name);
            fprintf(stderr, "faults: %s does not run %s%s (these do: %s)\n",
                    SCENARIOS[sel[i]].name, topo == TOPO_SINGLE ? "on one redis-server" : "with ",
                    topo_name(), which);
            return 2;
        }
    if (nsel == 0)
        for (int k = 0; k < NSCEN; k++)
            if (SCENARIOS[k].modes & (1u << topo))
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
