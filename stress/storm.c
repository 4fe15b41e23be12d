/*
 * storm: a thread storm against dlock that shows and checks what it does.
 *
 * The parent (which never opens a dlock client nor starts a thread) starts a
 * private redis-server unless --redis is given (with --sentinel a Sentinel
 * topology, with --cluster a 3-master Redis Cluster, with --redlock N
 * independent masters seeded fresh), reads the server's INFO (commandstats
 * and cpu; with --cluster and --redlock summed over the masters), maps one
 * shared anonymous region, and forks
 * --procs worker processes. Each worker opens one dlock_client (or one per
 * thread with --client-per-thread: the library without its local tier) and
 * runs --threads threads that, until the deadline, pick a lock name at
 * random among --locks, acquire it with a bounded wait, run a critical
 * section, release, and think. The parent prints progress once a second,
 * kills workers that overrun seconds + 30 s, reads INFO again and prints one
 * JSON line on stdout and a human summary on stderr.
 *
 * --mutex replaces dlock by one process-shared pthread mutex per name (in the
 * shared region; with --read-pct a process-shared rwlock, with --sem a
 * process-shared POSIX semaphore): the same work and checks with no Redis at all, the ideal
 * dlock is measured against. Its fencing token is a per-name counter
 * incremented (non-atomically) inside the critical section. No redis-server
 * is started in that mode; with --redis, the server's INFO is still read
 * (its idle load), else the Redis fields of the JSON are null.
 *
 * Checks made in every critical section (shared memory, across processes):
 *  - occupancy: an atomic per-name count incremented on entry must read 1
 *    (any overlap is seen by the second entrant);
 *  - lost update: the per-name counter is read at the start of the section
 *    and written back +1 at its end, non-atomically; an overlap loses an
 *    update, which the final check (sum of counters == acquisitions) reveals;
 *  - fencing: the token of each grant must be strictly greater than the last
 *    token recorded for that name;
 *  - dlock_held() must say 1 (reported, not fatal: a lease may legitimately
 *    be lost under extreme load, which release then reports as DLOCK_ELOST);
 *  - --read-pct: a reader sees no writer inside (their occupancy is 0, and
 *    the counter, which readers only read, is the same at both ends of its
 *    section) and a writer no reader; a reader's token is above the last
 *    writer's, a writer's above every token seen (dlock's shared mode, or
 *    with --mutex a process-shared rwlock);
 *  - --sem N: never more than N holders inside (occupancy), the most seen
 *    kept for the report (dlock's semaphore; with --mutex a process-shared
 *    POSIX semaphore, with --naive a Redis counter raised by a script
 *    below N: permits have no token to check).
 *
 * Wait percentiles come from per-thread log-scale histograms (8 sub-buckets
 * per power of two of microseconds): they are approximations within about
 * 6 % (the middle of the bucket is reported, clipped to the exact maximum).
 * With --read-pct they are also kept per mode: writers' (exclusive
 * acquisitions) and readers' (shared), each with its timeouts, so that a
 * writers' tail is not hidden among many short reads.
 *
 * Exit status: 0 if no violation, no token regression, the counters matched,
 * every worker finished cleanly, no call failed with an error (a timeout, or
 * DLOCK_EBUSY with --wait-ms 0, is the scenario's, not an error), at most
 * as many acquisitions timed out as succeeded and, with --read-pct, each
 * mode that asked for the name got it at least once (writers, or readers,
 * starved for the whole run fail it however many the other mode got) and,
 * with --node-fault, the fault struck and acquisitions went on a lease
 * after it (storm_fault.c); 1 otherwise; 2 on bad usage.
 */
/*
 * This file is the parent: the private servers and the delaying proxy,
 * INFO, forking and watching the workers, progress, the report of a stuck
 * run, the JSON line and the summary. storm_opts.c has the options,
 * storm_worker.c the shared region, the lock modes and the workers;
 * storm.h what they share and its rules. The parent writes O, names,
 * key_prefix, client_port, unix_path, sentinel_set, cluster_set and
 * parent_pid before it forks, never after; of the shared region, it writes
 * H's start_ns, deadline_ns and go once, stop (and a worker's setup_done
 * when its fork fails), and reads the rest: live counters with atomic
 * loads, everything else once the workers have exited.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "proxy.h"
#include "storm.h"
#include "common/common.h"
#include "common/error.h"
#include <hiredis/hiredis.h>

#define SETUP_TIMEOUT_NS (20LL * 1000000000LL)
#define OVERRUN_NS (30LL * 1000000000LL)

/* Declared in storm.h: set before the fork. */
char *names;       /* locks x NAME_LEN, private copy per process */
char key_prefix[64];
int client_port;   /* where the workers' clients connect: Redis, or the proxy */
pid_t parent_pid;

static pid_t proxy_pid;   /* --rtt-us: the proxy process */
static pid_t *pids;       /* parent: worker pids, liveness, exit statuses */
static int *alive, *wstatus;

static const char *const phase_name[PH_N] = {
    "not started", "thinking", "acquiring", "in critical section",
    "releasing", "done",
};

/* ------------------------------------------------------------------ */
/* Private servers                                                      */

char unix_path[300]; /* --unix: the private server's socket */

/* --min-replicas: the private server's replicas (stopped with it). */
static fx_redis replicas[MAX_REPLICAS];
static int nreplicas;

/* --sentinel: the private topology. */
fx_sentinel_set sentinel_set;

/* --cluster: the private Redis Cluster. */
fx_cluster cluster_set;
#define CLUSTER_MASTERS 3

/* --redlock: the independent masters and their list. */
static fx_redis redlock_srv[REDLOCK_MAX];
static int redlock_started;
char redlock_addrs[REDLOCK_MAX * 24];

/* Stops the private server's replicas, then the server (or the whole
 * Sentinel topology, or the cluster). */
static void stop_private(fx_redis *r)
{
    for (int i = 0; i < nreplicas; i++)
        fx_redis_stop(&replicas[i]);
    nreplicas = 0;
    if (O.sentinel)
        fx_sentinel_stop(&sentinel_set);
    else if (O.cluster)
        fx_cluster_stop(&cluster_set);
    else if (O.redlock)
        for (; redlock_started > 0; redlock_started--)
            fx_redis_stop(&redlock_srv[redlock_started - 1]);
    else
        fx_redis_stop(r);
}

/* Waits (at most 10 s) until the replica at port has its link to the
 * master up. 0 or -1. */
static int wait_replica(int port)
{
    for (int i = 0; i < 1000; i++) {
        redisContext *c = fx_connect("127.0.0.1", port);
        redisReply *rep = c ? redisCommand(c, "INFO replication") : NULL;
        int up = rep && rep->type == REDIS_REPLY_STRING &&
                 strstr(rep->str, "master_link_status:up") != NULL;
        if (rep)
            freeReplyObject(rep);
        if (c)
            redisFree(c);
        if (up)
            return 0;
        sleep_ns(10000000);
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* Parent                                                               */

static void on_signal(int sig)
{
    (void)sig;
    if (H)
        __atomic_store_n(&H->stop, 1, __ATOMIC_RELAXED);
}

typedef struct info_snap {
    long long calls, evalsha, eval, top;
    double cpu;
    double node_cpu[REDLOCK_MAX]; /* --redlock: each node's */
    int ok;
} info_snap;

static info_snap read_info_at(const char *host, int port);

/* --cluster: the figures of every node that says ROLE master now, summed.
 * fx_is_master's ROLE is a command the node counts: snapshot k has sent k
 * ROLEs to every node, which are taken out of its total so that the
 * difference of two snapshots holds the clients' commands only (as long as
 * the masters stay the same nodes). */
static int cluster_snaps;

static info_snap read_info_cluster(void)
{
    info_snap s = { .ok = 1 };
    int masters = 0;
    cluster_snaps++;
    for (int i = 0; i < cluster_set.n; i++) {
        int port = cluster_set.node[i].port;
        if (!fx_is_master(port))
            continue;
        info_snap n = read_info_at("127.0.0.1", port);
        if (!n.ok) {
            s.ok = 0;
            continue;
        }
        long long role = fx_info_calls("127.0.0.1", port, "role");
        n.calls -= role >= cluster_snaps ? cluster_snaps : (role > 0 ? role : 0);
        s.calls += n.calls;
        s.evalsha += n.evalsha;
        s.eval += n.eval;
        s.top += n.top > 0 ? n.top : 0;
        s.cpu += n.cpu;
        masters++;
    }
    if (masters != CLUSTER_MASTERS) {
        fprintf(stderr, "storm: warning: %d node(s) of the cluster say ROLE master (and answer"
                        " INFO), not %d\n", masters, CLUSTER_MASTERS);
        if (masters == 0)
            s.ok = 0;
    }
    return s;
}

/* --redlock: the figures of every node, summed (each node's CPU kept). */
static info_snap read_info_redlock(void)
{
    info_snap s = { .ok = 1 };
    for (int i = 0; i < O.redlock; i++) {
        info_snap n = read_info_at("127.0.0.1", redlock_srv[i].port);
        if (!n.ok)
            s.ok = 0;
        s.calls += n.calls;
        s.evalsha += n.evalsha;
        s.eval += n.eval;
        s.top += n.top > 0 ? n.top : 0;
        s.cpu += n.cpu;
        s.node_cpu[i] = n.cpu;
    }
    return s;
}

/* --redlock: seeds the fresh nodes on the storm's key prefix, as `dlockctl
 * --redlock-nodes LIST seed-fresh` does. 0, or -1 with a message. */
static int redlock_seed(void)
{
    return fx_redlock_seed_fresh(redlock_addrs, key_prefix, (uint32_t)O.lease_ms, 2000, 10000);
}

static info_snap read_info(void)
{
    if (O.cluster)
        return read_info_cluster();
    if (O.redlock)
        return read_info_redlock();
    return read_info_at(O.host, O.port);
}

static info_snap read_info_at(const char *host, int port)
{
    info_snap s;
    s.calls = fx_info_calls(host, port, NULL);
    s.evalsha = fx_info_calls(host, port, "evalsha");
    s.eval = fx_info_calls(host, port, "eval");
    s.top = fx_info_top_calls(host, port);
    if (O.naive && s.top >= 0) {
        /* The naive lock's SETs are its own top-level commands (its release
         * script calls GET and DEL only); dlock's SETs run inside scripts.
         * So are the naive semaphore's DECRs, its releases. */
        long long set = fx_info_calls(host, port, O.sem_limit > 0 ? "decr" : "set");
        if (set > 0)
            s.top += set;
    }
    s.cpu = fx_info_cpu(host, port);
    /* a command never called is absent from commandstats: the fixture may
     * report it as 0 or -1; only a failed total is an error */
    if (s.evalsha < 0)
        s.evalsha = 0;
    if (s.eval < 0)
        s.eval = 0;
    s.ok = s.calls >= 0 && s.cpu >= 0;
    return s;
}

/* --rtt-us: forks a process that runs the fault proxy (tests/support/proxy.c) in
 * front of Redis with the delay set, and returns the port it listens on, or
 * 0 on failure. The process lives until stop_proxy (or the parent's death). */
static int start_proxy(void)
{
    int fd[2];
    if (pipe(fd) != 0)
        return 0;
    pid_t parent = getpid();
    proxy_pid = fork();
    if (proxy_pid < 0) {
        proxy_pid = 0;
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    if (proxy_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(3);
        close(fd[0]);
        fx_proxy *px = fx_proxy_start(O.port);
        int port = 0;
        if (px) {
            fx_proxy_set_delay(px, O.rtt_us / 2, O.rtt_us - O.rtt_us / 2);
            port = fx_proxy_port(px);
        }
        if (write(fd[1], &port, sizeof port) != (ssize_t)sizeof port || !px)
            _exit(1);
        close(fd[1]);
        for (;;)
            pause(); /* until stop_proxy's SIGKILL */
    }
    close(fd[1]);
    int port = 0;
    if (read(fd[0], &port, sizeof port) != (ssize_t)sizeof port)
        port = 0;
    close(fd[0]);
    return port;
}

static void stop_proxy(void)
{
    if (proxy_pid > 0) {
        kill(proxy_pid, SIGKILL);
        waitpid(proxy_pid, NULL, 0);
        proxy_pid = 0;
    }
}

/* Where the threads of the workers that overran are: a hang, precisely. */
static void report_stuck(int P, int T, const int *live, const pid_t *worker)
{
    for (int p = 0; p < P; p++) {
        if (!live[p])
            continue;
        int count[PH_N] = {0};
        int example[PH_N];
        for (int i = 0; i < PH_N; i++)
            example[i] = -1;
        for (int i = 0; i < T; i++) {
            thread_res *t = &TR[(size_t)p * T + i];
            int ph = __atomic_load_n(&t->phase, __ATOMIC_RELAXED);
            if (ph < 0 || ph >= PH_N)
                continue;
            count[ph]++;
            if (example[ph] < 0)
                example[ph] = i;
        }
        int cl = __atomic_load_n(&PR[p].closing, __ATOMIC_RELAXED);
        fprintf(stderr, "storm:   worker %d (pid %d)%s:", p, (int)worker[p],
                cl == 1 ? " stuck in dlock_client_close"
                        : cl == 2 ? " past dlock_client_close" : "");
        for (int ph = 0; ph < PH_N; ph++)
            if (count[ph]) {
                thread_res *t = &TR[(size_t)p * T + example[ph]];
                int ni = __atomic_load_n(&t->name_idx, __ATOMIC_RELAXED);
                if (ph == PH_ACQUIRE || ph == PH_CS || ph == PH_RELEASE)
                    fprintf(stderr, " %d %s (e.g. thread %d on '%s');", count[ph],
                            phase_name[ph], example[ph], names + (size_t)ni * NAME_LEN);
                else
                    fprintf(stderr, " %d %s;", count[ph], phase_name[ph]);
            }
        fprintf(stderr, "\n");
    }
}

static void json_num(FILE *f, const char *key, double v, int valid, int last)
{
    if (valid)
        fprintf(f, "\"%s\":%.6g%s", key, v, last ? "" : ",");
    else
        fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    parse_opts(argc, argv);
    raise_nofile(); /* before redis-server starts: it inherits the limit */
    signal(SIGPIPE, SIG_IGN);
    parent_pid = getpid();
    const int P = O.procs, T = O.threads;
    const size_t total = (size_t)P * T;

    fx_redis r;
    memset(&r, 0, sizeof r);
    int private_redis = O.port == 0 && !O.mutex;
    int have_redis = O.port != 0 || private_redis; /* --mutex alone: no Redis at all */
    if (private_redis && O.sentinel) {
        if (fx_sentinel_start(&sentinel_set, SENTINEL_MASTER) != 0) {
            fprintf(stderr, "storm: could not start a private Sentinel topology\n");
            return 1;
        }
        snprintf(O.host, sizeof O.host, "127.0.0.1");
        O.port = sentinel_set.srv[0].port; /* the master, for INFO */
    } else if (private_redis && O.cluster) {
        if (fx_cluster_start(&cluster_set, CLUSTER_MASTERS, O.cluster_replicas) != 0) {
            fprintf(stderr, "storm: could not start a private Redis Cluster\n");
            return 1;
        }
        snprintf(O.host, sizeof O.host, "127.0.0.1");
        O.port = cluster_set.node[0].port; /* a first master, for messages; INFO of
                                              every master (read_info_cluster) */
    } else if (private_redis && O.redlock) {
        size_t at = 0;
        for (; redlock_started < O.redlock; redlock_started++) {
            if (fx_redis_start_opts(&redlock_srv[redlock_started],
                                    node_fault_opts(redlock_started)) != 0) {
                fprintf(stderr, "storm: could not start Redlock node %d\n", redlock_started + 1);
                stop_private(&r);
                return 1;
            }
            at += (size_t)snprintf(redlock_addrs + at, sizeof redlock_addrs - at, "%s127.0.0.1:%d",
                                   at ? "," : "", redlock_srv[redlock_started].port);
        }
        snprintf(O.host, sizeof O.host, "127.0.0.1");
        O.port = redlock_srv[0].port; /* a first node, for messages; INFO of every node
                                         (read_info_redlock) */
    } else if (private_redis) {
        fx_redis_opts ro = {.unix_socket = O.unix_socket};
        if (fx_redis_start_opts(&r, &ro) != 0) {
            fprintf(stderr, "storm: could not start a private redis-server\n");
            return 1;
        }
        snprintf(O.host, sizeof O.host, "127.0.0.1");
        O.port = r.port;
        if (O.unix_socket)
            snprintf(unix_path, sizeof unix_path, "%s", r.unix_path);
        for (; nreplicas < O.min_replicas; nreplicas++) {
            fx_redis_opts rep = {.replica_of = r.port};
            int started = fx_redis_start_opts(&replicas[nreplicas], &rep) == 0;
            if (!started || wait_replica(replicas[nreplicas].port) != 0) {
                nreplicas += started;
                fprintf(stderr, "storm: could not start replica %d of the private redis-server\n",
                        nreplicas + 1);
                stop_private(&r);
                return 1;
            }
        }
    }
    /* no brace: Cluster mode refuses a key_prefix with one (the library puts
     * the name between braces, its hash tag) */
    snprintf(key_prefix, sizeof key_prefix, "storm:%d:", (int)getpid());
    client_port = O.port;
    if (O.redlock && redlock_seed() != 0) {
        stop_private(&r);
        return 1;
    }
    if (O.rtt_us > 0) {
        client_port = start_proxy();
        if (!client_port) {
            fprintf(stderr, "storm: could not start the delaying proxy\n");
            stop_proxy(); /* it may have started and failed */
            if (private_redis)
                stop_private(&r);
            return 1;
        }
    }

    info_snap before = { .ok = 0 };
    if (have_redis)
        before = read_info();
    if (have_redis && !before.ok)
        fprintf(stderr, "storm: warning: could not read INFO from %s:%d%s before the run\n",
                O.host, O.port, O.cluster ? " (or another master of the cluster)"
                : O.redlock ? " (or another Redlock node)" : "");

    shm_create();
    names = malloc((size_t)O.locks * NAME_LEN);
    if (!names) {
        fprintf(stderr, "storm: out of memory\n");
        stop_proxy();
        if (private_redis)
            stop_private(&r);
        return 1;
    }
    for (int i = 0; i < O.locks; i++)
        snprintf(names + (size_t)i * NAME_LEN, NAME_LEN, "n%d", i);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    const char *mode = O.mutex ? "mutex" : O.naive ? "naive"
                                         : O.client_per_thread ? "client-per-thread"
                                         : O.redlock ? "redlock" : "dlock";
    if (!O.quiet) {
        char where[400];
        if (O.cluster)
            snprintf(where, sizeof where, "a private redis cluster of %d masters with %d"
                     " replica(s) each (%d nodes, the first %s:%d)", CLUSTER_MASTERS,
                     O.cluster_replicas, cluster_set.n, O.host, O.port);
        else if (O.redlock)
            snprintf(where, sizeof where, "%d private independent redis masters (Redlock: %s),"
                     " lease %ld ms", O.redlock, redlock_addrs, O.lease_ms);
        else if (have_redis)
            snprintf(where, sizeof where, "redis %s:%d%s%s%s", O.host, O.port,
                     private_redis ? " (private)" : "", O.mutex ? " (INFO only)" : "",
                     O.rtt_us > 0 ? ", through a proxy adding the round trip" : "");
        else
            snprintf(where, sizeof where, "no redis");
        fprintf(stderr, "storm: %s mode, %d procs x %d threads, %d lock(s), %.3g s, cs %ld us"
                        " (%s), think %ld us, wait %ld ms, %s\n",
                mode, P, T, O.locks, O.seconds, O.cs_us, O.cs_sleep ? "sleep" : "spin",
                O.think_us, O.wait_ms, where);
    }

    /* Fork before any dlock client or thread exists in this process. */
    fflush(NULL);
    /* globals, so that a worker's leak check sees them as reachable */
    pids = calloc((size_t)P, sizeof *pids);
    alive = calloc((size_t)P, sizeof *alive);
    wstatus = calloc((size_t)P, sizeof *wstatus);
    if (!pids || !alive || !wstatus) {
        fprintf(stderr, "storm: out of memory\n");
        stop_proxy();
        if (private_redis)
            stop_private(&r);
        return 1;
    }
    int worker_fail = 0, fork_fail = 0, killed = 0;
    /* CPU of the reaped worker processes (RUSAGE_CHILDREN counts reaped
     * children only: the proxy, if any, is reaped after the reading). */
    struct rusage ru0, ru1;
    getrusage(RUSAGE_CHILDREN, &ru0);
    int64_t fork_ns = now_ns();
    /* --redlock: each worker first waits until its client counts the nodes
     * (redlock_warm_up: at most this) */
    int64_t warm_up_ns = O.redlock ? (2 * O.lease_ms + 5000) * 1000000LL : 0;
    int64_t setup_timeout_ns = SETUP_TIMEOUT_NS + warm_up_ns;
    for (int p = 0; p < P; p++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "storm: fork of worker %d failed: %s\n", p, strerror(errno));
            fork_fail = 1;
            __atomic_store_n(&H->stop, 1, __ATOMIC_RELAXED);
            PR[p].setup_done = 1;
            break;
        }
        if (pid == 0)
            worker_main(p);
        pids[p] = pid;
        alive[p] = 1;
    }

    /* Wait until every worker has its threads (or gave up), then start. */
    for (;;) {
        int done = 0, n_alive = 0;
        for (int p = 0; p < P; p++) {
            done += __atomic_load_n(&PR[p].setup_done, __ATOMIC_ACQUIRE) ? 1 : 0;
            if (alive[p]) {
                int st;
                pid_t w = waitpid(pids[p], &st, WNOHANG);
                if (w == pids[p]) {
                    alive[p] = 0;
                    wstatus[p] = st;
                } else {
                    n_alive++;
                }
            }
        }
        if (done == P || n_alive == 0)
            break;
        if (now_ns() - fork_ns > setup_timeout_ns) {
            fprintf(stderr, "storm: workers not ready after %lld s; starting anyway\n",
                    (long long)(setup_timeout_ns / 1000000000LL));
            worker_fail = 1;
            break;
        }
        sleep_ns(2000000);
    }
    /* --redlock: the figures leave out the warm-ups (read again now that
     * they are done) */
    if (O.redlock) {
        before = read_info();
        if (!before.ok)
            fprintf(stderr, "storm: warning: could not read INFO from every Redlock node after"
                            " the warm-up\n");
    }
    int64_t start = now_ns();
    __atomic_store_n(&H->start_ns, start, __ATOMIC_RELAXED);
    __atomic_store_n(&H->deadline_ns, start + (int64_t)(O.seconds * 1e9), __ATOMIC_RELAXED);
    __atomic_store_n(&H->last_grant_ns, start, __ATOMIC_RELAXED); /* storm_fault.c */
    __atomic_store_n(&H->go, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &H->go, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    int64_t kill_at = fork_ns + (int64_t)(O.seconds * 1e9) + OVERRUN_NS + warm_up_ns;

    /* Monitor: progress once a second, reap, kill overrunning workers. */
    int64_t next_report = start + 1000000000LL;
    uint64_t last_acq = 0;
    int64_t last_report = start;
    int announced_stop = 0;
    for (;;) {
        int n_alive = 0;
        for (int p = 0; p < P; p++) {
            if (!alive[p])
                continue;
            int st;
            pid_t w = waitpid(pids[p], &st, WNOHANG);
            if (w == pids[p]) {
                alive[p] = 0;
                wstatus[p] = st;
            } else {
                n_alive++;
            }
        }
        if (n_alive == 0)
            break;
        int64_t now = now_ns();
        if (O.node_fault && now < H->deadline_ns)
            node_fault_tick(redlock_srv, start, now, total);
        if (__atomic_load_n(&H->stop, __ATOMIC_RELAXED) && !announced_stop && !O.quiet) {
            fprintf(stderr, "storm: stopping early (signal)\n");
            announced_stop = 1;
        }
        if (now > kill_at) {
            fprintf(stderr, "storm: FAILURE: %d worker(s) still running %.0f s after the"
                            " deadline; killing them (SIGKILL)\n",
                    n_alive, (double)(now - start) / 1e9 - O.seconds);
            report_stuck(P, T, alive, pids);
            for (int p = 0; p < P; p++)
                if (alive[p])
                    kill(pids[p], SIGKILL);
            for (int p = 0; p < P; p++)
                if (alive[p]) {
                    int st;
                    waitpid(pids[p], &st, 0);
                    wstatus[p] = st;
                    alive[p] = 0;
                }
            killed = 1;
            break;
        }
        if (!O.quiet && now >= next_report) {
            uint64_t acq = 0, to = 0, er = 0, vi = 0, rg = 0;
            for (size_t i = 0; i < total; i++) {
                acq += __atomic_load_n(&TR[i].acq, __ATOMIC_RELAXED);
                to += __atomic_load_n(&TR[i].timeouts, __ATOMIC_RELAXED);
                er += __atomic_load_n(&TR[i].errors_total, __ATOMIC_RELAXED);
                vi += __atomic_load_n(&TR[i].violations, __ATOMIC_RELAXED);
                rg += __atomic_load_n(&TR[i].regressions, __ATOMIC_RELAXED);
            }
            double el = (double)(now - start) / 1e9;
            double dt = (double)(now - last_report) / 1e9;
            fprintf(stderr, "storm: %6.1fs  acq %10" PRIu64 "  %9.0f/s (last 1s %9.0f/s)"
                            "  timeouts %" PRIu64 "  errors %" PRIu64 "  violations %" PRIu64
                            "  regressions %" PRIu64 "%s\n",
                    el, acq, el > 0 ? (double)acq / el : 0.0,
                    dt > 0 ? (double)(acq - last_acq) / dt : 0.0, to, er, vi, rg,
                    now >= H->deadline_ns ? "  (draining)" : "");
            last_acq = acq;
            last_report = now;
            next_report += 1000000000LL;
            if (next_report < now)
                next_report = now + 1000000000LL;
        }
        sleep_ns(50000000);
    }
    int64_t end_all = now_ns();
    getrusage(RUSAGE_CHILDREN, &ru1);
    double workers_cpu_us =
        (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec -
                 ru0.ru_stime.tv_sec) * 1e6 +
        (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec -
                 ru0.ru_stime.tv_usec);

    info_snap after = { .ok = 0 };
    node_fault_end(redlock_srv);
    if (have_redis && !node_fault_spoils_info())
        after = read_info();
    if (have_redis && !after.ok && !node_fault_spoils_info())
        fprintf(stderr, "storm: warning: could not read INFO from %s:%d%s after the run\n",
                O.host, O.port, O.cluster ? " (or another master of the cluster)"
                : O.redlock ? " (or another Redlock node)" : "");

    /* Workers' exit statuses. */
    for (int p = 0; p < P; p++) {
        if (!pids[p]) {
            worker_fail = 1;
            continue;
        }
        int st = wstatus[p];
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            continue;
        worker_fail = 1;
        if (WIFSIGNALED(st))
            fprintf(stderr, "storm: FAILURE: worker %d (pid %d) killed by signal %d (%s)%s\n", p,
                    (int)pids[p], WTERMSIG(st), strsignal(WTERMSIG(st)),
                    killed ? " [overrun]" : "");
        else
            fprintf(stderr, "storm: FAILURE: worker %d (pid %d) exited with status %d%s%s\n", p,
                    (int)pids[p], WEXITSTATUS(st), PR[p].msg[0] ? ": " : "", PR[p].msg);
    }
    if (fork_fail)
        worker_fail = 1;

    /* Aggregate. */
    uint64_t acq = 0, timeouts = 0, busy = 0, viol = 0, regr = 0, not_held = 0, zero = 0;
    uint64_t reads = 0; /* --read-pct: acquisitions in shared mode */
    uint64_t crossings = 0;
    uint64_t errors[NERR] = {0}, rel_errors[NERR] = {0};
    uint64_t wait_max = 0, wait_sum = 0;
    /* --read-pct: per mode (r_: shared acquisitions, x_: exclusive ones) */
    uint64_t r_timeouts = 0, r_failed = 0, r_wait_sum = 0, r_wait_max = 0, x_wait_max = 0;
    double sx = 0, sx2 = 0;
    uint64_t *hist = calloc(3 * NB, sizeof *hist);
    uint64_t *r_hist = hist + NB, *x_hist = hist + 2 * NB; /* (x_hist: hist - r_hist) */
    if (!hist) {
        fprintf(stderr, "storm: out of memory\n");
        stop_proxy();
        if (private_redis)
            stop_private(&r);
        return 1;
    }
    for (size_t i = 0; i < total; i++) {
        thread_res *t = &TR[i];
        acq += t->acq;
        timeouts += t->timeouts;
        busy += t->busy;
        viol += t->violations;
        regr += t->regressions;
        not_held += t->not_held;
        reads += t->reads;
        crossings += t->crossings;
        for (int e = 0; e < NERR; e++) {
            errors[e] += t->errors[e];
            rel_errors[e] += t->rel_errors[e];
        }
        if (t->wait_max_us > wait_max)
            wait_max = t->wait_max_us;
        wait_sum += t->wait_sum_us;
        for (int b = 0; b < NB; b++) {
            hist[b] += t->hist[b];
            r_hist[b] += t->r_hist[b];
            x_hist[b] += t->hist[b] - t->r_hist[b];
        }
        r_timeouts += t->r_timeouts;
        r_failed += t->r_failed;
        r_wait_sum += t->r_wait_sum_us;
        if (t->r_wait_max_us > r_wait_max)
            r_wait_max = t->r_wait_max_us;
        if (t->x_wait_max_us > x_wait_max)
            x_wait_max = t->x_wait_max_us;
        double x = (double)t->acq;
        sx += x;
        sx2 += x * x;
        if (t->acq == 0)
            zero++;
    }
    uint64_t counter_sum = 0;
    for (int i = 0; i < O.locks; i++)
        counter_sum += NS[i].counter;
    /* (readers leave the counter as it was: --read-pct) */
    int counter_ok = counter_sum == acq - reads;
    int32_t most = 0; /* --sem: the most holders of one name inside at once */
    for (int i = 0; i < O.locks; i++)
        if (NS[i].max_occupancy > most)
            most = NS[i].max_occupancy;
    double jain = sx2 > 0 ? (sx * sx) / ((double)total * sx2) : 0.0;
    int64_t last_end = H->last_end_ns;
    double elapsed = last_end > start ? (double)(last_end - start) / 1e9 : O.seconds;
    double acq_per_sec = elapsed > 0 ? (double)acq / elapsed : 0;
    uint64_t p50 = hist_percentile(hist, acq, 0.50, wait_max);
    uint64_t p99 = hist_percentile(hist, acq, 0.99, wait_max);
    /* --read-pct: each mode's waits, and whether each mode that asked got
     * the name at all (a lock that starves its writers, or its readers,
     * fails the storm even when the other mode's acquisitions outnumber
     * every timeout) */
    uint64_t writes = acq - reads;
    uint64_t x_p50 = hist_percentile(x_hist, writes, 0.50, x_wait_max);
    uint64_t x_p99 = hist_percentile(x_hist, writes, 0.99, x_wait_max);
    uint64_t r_p50 = hist_percentile(r_hist, reads, 0.50, r_wait_max);
    uint64_t r_p99 = hist_percentile(r_hist, reads, 0.99, r_wait_max);
    dlock_stats cs;
    memset(&cs, 0, sizeof cs);
    for (int p = 0; p < P; p++) {
        cs.redis_commands += PR[p].stats.redis_commands;
        cs.redis_round_trips += PR[p].stats.redis_round_trips;
        cs.renew_rounds += PR[p].stats.renew_rounds;
        cs.renew_keys += PR[p].stats.renew_keys;
        cs.leases_lost += PR[p].stats.leases_lost;
        cs.sem_passes += PR[p].stats.sem_passes;
    }
    int dlock_mode = !O.mutex && !O.naive;

    int info_ok = before.ok && after.ok;
    /* the after-snapshot's own INFO calls are excluded by fx_info_calls */
    long long d_cmds = info_ok ? after.calls - before.calls : 0;
    long long d_top = info_ok ? after.top - before.top : 0;
    long long d_evals = info_ok ? (after.evalsha + after.eval) - (before.evalsha + before.eval) : 0;
    double d_cpu_us = info_ok ? (after.cpu - before.cpu) * 1e6 : 0;
    uint64_t rel_err_total = 0, err_total = 0;
    for (int e = 0; e < NERR; e++) {
        rel_err_total += rel_errors[e];
        err_total += errors[e];
    }
    /* --read-pct: the acquires of each mode that did not get the name */
    uint64_t x_timeouts = timeouts - r_timeouts;
    uint64_t x_failed = x_timeouts + busy + err_total - r_failed;
    int writers_starved = O.read_pct > 0 && writes == 0 && x_failed > 0;
    int readers_starved = O.read_pct > 0 && reads == 0 && r_timeouts + r_failed > 0;

    /* JSON on stdout: one line. */
    FILE *o = stdout;
    fprintf(o, "{\"mode\":\"%s\",\"procs\":%d,\"threads\":%d,\"locks\":%d,", mode, P, T, O.locks);
    json_num(o, "seconds", O.seconds, 1, 0);
    fprintf(o, "\"cs_us\":%ld,\"think_us\":%ld,\"cs_mode\":\"%s\",\"wait_ms\":%ld,"
               "\"lease_ms\":%ld,",
            O.cs_us, O.think_us, O.cs_sleep ? "sleep" : "spin", O.wait_ms, O.lease_ms);
    fprintf(o, "\"rtt_us\":%ld,", O.rtt_us);
    if (O.pass_limit >= 0)
        fprintf(o, "\"pass_limit\":%ld,", O.pass_limit);
    else
        fprintf(o, "\"pass_limit\":null,");
    json_num(o, "elapsed_s", elapsed, 1, 0);
    fprintf(o, "\"acquisitions\":%" PRIu64 ",", acq);
    json_num(o, "acq_per_sec", acq_per_sec, 1, 0);
    if (O.read_pct > 0)
        fprintf(o, "\"read_pct\":%d,\"reads\":%" PRIu64 ",", O.read_pct, reads);
    if (O.sem_limit > 0) {
        /* sem_passes: permits a thread took from another thread of its
         * client, with no Redis command (dlock only) */
        fprintf(o, "\"sem_limit\":%ld,\"max_holders\":%d,", O.sem_limit, (int)most);
        if (dlock_mode)
            fprintf(o, "\"sem_passes\":%" PRIu64 ",", cs.sem_passes);
        else
            fprintf(o, "\"sem_passes\":null,");
        json_num(o, "sem_passes_per_acq", acq ? (double)cs.sem_passes / (double)acq : 0,
                 dlock_mode && acq, 0);
    }
    fprintf(o, "\"violations\":%" PRIu64 ",\"token_regressions\":%" PRIu64 ","
               "\"counter_ok\":%s,\"counter_sum\":%" PRIu64 ",",
            viol, regr, counter_ok ? "true" : "false", counter_sum);
    fprintf(o, "\"errors\":{");
    int first = 1;
    for (int e = 0; e < NERR; e++)
        if (errors[e]) {
            fprintf(o, "%s\"%s\":%" PRIu64, first ? "" : ",", err_index_name(e), errors[e]);
            first = 0;
        }
    fprintf(o, "},\"release_errors\":{");
    first = 1;
    for (int e = 0; e < NERR; e++)
        if (rel_errors[e]) {
            fprintf(o, "%s\"%s\":%" PRIu64, first ? "" : ",", err_index_name(e), rel_errors[e]);
            first = 0;
        }
    fprintf(o, "},\"timeouts\":%" PRIu64 ",\"busy\":%" PRIu64 ",\"not_held_in_cs\":%" PRIu64 ",",
            timeouts, busy, not_held);
    /* Round trips: top-level commands (the scripts' own calls excluded);
     * commands: every call the server counts, those inside scripts too. */
    json_num(o, "redis_round_trips", (double)d_top, info_ok, 0);
    json_num(o, "redis_round_trips_per_acq", acq ? (double)d_top / (double)acq : 0,
             info_ok && acq, 0);
    json_num(o, "redis_commands", (double)d_cmds, info_ok, 0);
    json_num(o, "redis_cmds_per_acq", acq ? (double)d_cmds / (double)acq : 0, info_ok && acq, 0);
    json_num(o, "redis_evals", (double)d_evals, info_ok, 0);
    json_num(o, "redis_cpu_us_per_acq", acq ? d_cpu_us / (double)acq : 0, info_ok && acq, 0);
    if (O.redlock) {
        /* each node's share of redis_cpu_us_per_acq */
        fprintf(o, "\"redlock_nodes\":%d,\"redis_cpu_us_per_acq_per_node\":[", O.redlock);
        for (int i = 0; i < O.redlock; i++) {
            if (info_ok && acq)
                fprintf(o, "%s%.6g", i ? "," : "",
                        (after.node_cpu[i] - before.node_cpu[i]) * 1e6 / (double)acq);
            else
                fprintf(o, "%snull", i ? "," : "");
        }
        fprintf(o, "],");
    }
    /* the workers' user + system CPU, their set-up and critical sections
     * included (a busy critical section of X us costs X here) */
    /* share of acquisitions that took the name from another process (not
     * kept for a semaphore's permits: several hold one at once) */
    json_num(o, "crossings_per_acq", acq ? (double)crossings / (double)acq : 0,
             acq > 0 && O.sem_limit == 0, 0);
    /* the share of the run in which a name had nobody inside its critical
     * section (from the start to the last holder's leave; the mean over
     * the names held): on one hot name that threads always wait for, the
     * time the lock itself kept everyone out, in handoffs and in Redis
     * (where a name is often not wanted, its idle time too) */
    double empty = 0;
    int held_names = 0;
    for (long li = 0; li < O.locks; li++) {
        uint64_t end_us = NS[li].inside & ((1ULL << 48) - 1);
        if (end_us > 0) {
            empty += (double)NS[li].empty_us / (double)end_us;
            held_names++;
        }
    }
    json_num(o, "empty_pct", held_names ? 100 * empty / held_names : 0, held_names > 0, 0);
    json_num(o, "client_cpu_us_per_acq", acq ? workers_cpu_us / (double)acq : 0, acq > 0, 0);
    json_num(o, "client_cmds_per_acq", acq ? (double)cs.redis_commands / (double)acq : 0,
             acq > 0 && dlock_mode, 0);
    fprintf(o, "\"client_redis_commands\":%" PRIu64 ",\"client_round_trips\":%" PRIu64 ","
               "\"renew_rounds\":%" PRIu64 ",\"leases_lost\":%" PRIu64 ",",
            cs.redis_commands, cs.redis_round_trips, cs.renew_rounds, cs.leases_lost);
    fprintf(o, "\"wait_p50_us\":%" PRIu64 ",\"wait_p99_us\":%" PRIu64 ",\"wait_max_us\":%" PRIu64
               ",",
            p50, p99, wait_max);
    json_num(o, "wait_mean_us", acq ? (double)wait_sum / (double)acq : 0, acq > 0, 0);
    if (O.read_pct > 0) {
        /* each mode's waits (writers: exclusive acquisitions, readers:
         * shared), and each mode's timeouts */
        fprintf(o, "\"writes\":%" PRIu64 ",\"writer_timeouts\":%" PRIu64
                   ",\"reader_timeouts\":%" PRIu64 ",",
                writes, x_timeouts, r_timeouts);
        fprintf(o, "\"writer_wait_p50_us\":%" PRIu64 ",\"writer_wait_p99_us\":%" PRIu64
                   ",\"writer_wait_max_us\":%" PRIu64 ",",
                x_p50, x_p99, x_wait_max);
        json_num(o, "writer_wait_mean_us",
                 writes ? (double)(wait_sum - r_wait_sum) / (double)writes : 0, writes > 0, 0);
        fprintf(o, "\"reader_wait_p50_us\":%" PRIu64 ",\"reader_wait_p99_us\":%" PRIu64
                   ",\"reader_wait_max_us\":%" PRIu64 ",",
                r_p50, r_p99, r_wait_max);
        json_num(o, "reader_wait_mean_us", reads ? (double)r_wait_sum / (double)reads : 0,
                 reads > 0, 0);
        fprintf(o, "\"writers_starved\":%s,\"readers_starved\":%s,",
                writers_starved ? "true" : "false", readers_starved ? "true" : "false");
    }
    fprintf(o, "\"wait_percentiles\":\"log-histogram approx +-6%%\",");
    json_num(o, "jain", jain, 1, 0);
    fprintf(o, "\"proc_acquisitions\":[");
    for (int p = 0; p < P; p++) {
        uint64_t pa = 0;
        for (int i = 0; i < T; i++)
            pa += TR[(size_t)p * T + i].acq;
        fprintf(o, "%s%" PRIu64, p ? "," : "", pa);
    }
    fprintf(o, "],");
    /* A storm passes only if its acquisitions work: errors (Redis down, a
     * refused server, ...) or mostly timeouts are a failure even without a
     * violation. */
    int errors_ok = err_total == 0 && rel_err_total == 0;
    int timeouts_ok = acq > 0 && timeouts <= acq;
    int modes_ok = !writers_starved && !readers_starved;
    int fault_ok = node_fault_ok(acq);
    int ok = viol == 0 && regr == 0 && counter_ok && !worker_fail && errors_ok && timeouts_ok &&
             modes_ok && fault_ok;
    node_fault_json(o, acq);
    fprintf(o, "\"starved\":%" PRIu64 ",\"workers_failed\":%s,\"interrupted\":%s,"
               "\"verdict\":\"%s\"}\n", zero,
            worker_fail ? "true" : "false", H->stop ? "true" : "false", ok ? "PASS" : "FAIL");
    fflush(o);


    if (!O.quiet) {
        fprintf(stderr, "\nstorm summary (%s, %d procs x %d threads, %d lock(s), %.3g s run,"
                        " %.2f s until the last thread stopped, %.2f s in all)\n",
                mode, P, T, O.locks, O.seconds, elapsed, (double)(end_all - fork_ns) / 1e9);
        fprintf(stderr, "  acquisitions   %" PRIu64 " (%.0f/s), timeouts %" PRIu64
                        ", other acquire errors %" PRIu64 ", release errors %" PRIu64 "\n",
                acq, acq_per_sec, timeouts, err_total, rel_err_total);
        if (info_ok)
            fprintf(stderr,
                    "  redis          %lld round trips (%.3f per acquisition), %lld commands "
                    "with those inside scripts, %.1f us of redis cpu per acquisition%s\n",
                    d_top, acq ? (double)d_top / (double)acq : 0.0, d_cmds,
                    acq ? d_cpu_us / (double)acq : 0.0,
                    O.cluster ? " (summed over the cluster's masters)"
                    : O.redlock ? " (summed over the Redlock nodes)" : "");
        if (info_ok && O.redlock && acq) {
            fprintf(stderr, "  redlock nodes  redis cpu per acquisition, node by node:");
            for (int i = 0; i < O.redlock; i++)
                fprintf(stderr, " %.1f us", (after.node_cpu[i] - before.node_cpu[i]) * 1e6 /
                                                (double)acq);
            fprintf(stderr, "\n");
        }
        else
            fprintf(stderr, "  redis          %s\n",
                    node_fault_spoils_info() ? "INFO not read after the run (a node killed or"
                                               " restarted: its counters are not comparable)"
                    : have_redis ? "INFO unavailable" : "none (--mutex)");
        fprintf(stderr, "  client cpu     %.1f us per acquisition (the worker processes, user +"
                        " system, critical sections included)",
                acq ? workers_cpu_us / (double)acq : 0.0);
        if (O.sem_limit == 0)
            fprintf(stderr, "; %.3f of acquisitions took the name from another process",
                    acq ? (double)crossings / (double)acq : 0.0);
        fprintf(stderr, "\n");
        fprintf(stderr, "  wait           p50 ~%" PRIu64 " us, p99 ~%" PRIu64 " us, max %" PRIu64
                        " us (percentiles approximate)\n",
                p50, p99, wait_max);
        if (O.read_pct > 0) {
            fprintf(stderr, "  writers' wait  p50 ~%" PRIu64 " us, p99 ~%" PRIu64 " us, max %"
                            PRIu64 " us over %" PRIu64 " exclusive acquisitions (%" PRIu64
                            " timed out)\n",
                    x_p50, x_p99, x_wait_max, writes, x_timeouts);
            fprintf(stderr, "  readers' wait  p50 ~%" PRIu64 " us, p99 ~%" PRIu64 " us, max %"
                            PRIu64 " us over %" PRIu64 " shared acquisitions (%" PRIu64
                            " timed out)\n",
                    r_p50, r_p99, r_wait_max, reads, r_timeouts);
        }
        fprintf(stderr, "  fairness       Jain %.3f over %zu threads, %" PRIu64 " starved\n", jain,
                total, zero);
        if (O.sem_limit > 0 && dlock_mode)
            fprintf(stderr, "  semaphore      limit %ld, at most %d holders of a name inside at"
                            " once; %" PRIu64 " of %" PRIu64 " permits (%.3f) passed between a"
                            " client's threads with no Redis command\n",
                    O.sem_limit, (int)most, cs.sem_passes, acq,
                    acq ? (double)cs.sem_passes / (double)acq : 0.0);
        else if (O.sem_limit > 0)
            fprintf(stderr, "  semaphore      limit %ld, at most %d holders of a name inside at"
                            " once\n", O.sem_limit, (int)most);
        fprintf(stderr, "  exclusion      %" PRIu64 " violations, counter %s (%" PRIu64
                        " vs %" PRIu64 "), %" PRIu64 " token regressions, %" PRIu64
                        " not-held-in-cs\n",
                viol, counter_ok ? "ok" : "MISMATCH", counter_sum, acq, regr, not_held);
        node_fault_summary(stderr, acq);
        fprintf(stderr, "  verdict        %s%s%s%s%s%s\n", ok ? "PASS" : "FAIL",
                errors_ok ? "" : " (calls failed with errors)",
                timeouts_ok ? "" : " (more acquisitions timed out than succeeded, or none did)",
                viol || regr || !counter_ok || worker_fail ? " (exclusion or workers)" : "",
                writers_starved   ? " (writers asked but never got the name)"
                : readers_starved ? " (readers asked but never got the name)"
                                  : "",
                fault_ok ? "" : " (the node fault did not strike, or no acquisition after it)");
    }

    shm_destroy_mutexes();
    free(hist);
    free(pids);
    free(alive);
    free(wstatus);
    free(names);
    munmap(shm_base, shm_size);
    H = NULL;
    stop_proxy();
    if (private_redis)
        stop_private(&r);
    return ok ? 0 : 1;
}
