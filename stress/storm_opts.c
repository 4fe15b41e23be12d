/*
 * storm_opts.c: storm's options: the global O (its defaults, then the
 * command line), --help, and parse_opts with its checks (exit 2 on bad
 * usage). O is written here and by the parent's set-up in storm.c, before
 * any worker is forked, and never after (storm.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "storm.h"

/* ------------------------------------------------------------------ */
/* Options                                                              */

opts O = {
    .procs = 2, .threads = 16, .locks = 1, .seconds = 5.0, .cs_us = 100,
    .think_us = 1000, .cs_sleep = 0, .pass_limit = -1, .join_ms = -1, .lease_ms = 30000,
    .wait_ms = 2000, .pool_size = -1, .client_per_thread = 0, .host = "127.0.0.1",
    .port = 0, .fault_at = 1.0, .fault_for = -1,
#ifdef STORM_ASAN
    .stack_kb = 256,
#else
    .stack_kb = 64,
#endif
    .quiet = 0,
};

static void usage(FILE *f)
{
    fprintf(f,
"usage: storm [options]\n"
"A thread storm against dlock: N processes x T threads acquire L lock names,\n"
"check exclusion and fencing tokens in every critical section, and measure\n"
"throughput, wait times, fairness and what Redis pays per acquisition.\n"
"Prints one JSON line on stdout, progress and a summary on stderr.\n"
"\n"
"  --procs N            worker processes (1..%d, default 2)\n"
"  --threads T          threads per process (1..%d, default 16; N*T <= %d)\n"
"  --locks L            lock names, picked at random per acquisition\n"
"                       (1..%d, default 1)\n"
"  --seconds S          run length, fractional allowed (default 5, max 86400)\n"
"  --cs-us X            critical section length in us (0..%ld, default 100)\n"
"  --cs-sleep           sleep (nanosleep) in the critical section instead of\n"
"                       busy-waiting\n"
"  --think-us Y         pause between two acquisitions in us (0..%ld,\n"
"                       default 1000)\n"
"  --join-ms J          dlock join_ms (the shared mode's join window, with\n"
"                       --read-pct; default: the library's)\n"
"  --pass-limit K       dlock pass_limit (local handoffs before the lease goes\n"
"                       back to Redis; default: the library's)\n"
"  --lease-ms M         lease time (%u..%u, default 30000; 1000 with\n"
"                       --redlock)\n"
"  --protocol P         the protocol the clients write: 1, 2, or mixed (worker\n"
"                       p writes 1 + p %% 2; each reads both: docs/operations.md,\n"
"                       \"Upgrades\"); default: the library's\n"
"  --wait-ms W          acquire wait: -1 forever, 0 try once (EBUSY counted\n"
"                       as busy), >0 bounded (default 2000; timeouts counted)\n"
"  --pool-size P        dlock pool_size (default: the library's, or 1 with\n"
"                       --client-per-thread)\n"
"  --client-per-thread  every thread opens its own dlock_client (no local\n"
"                       tier: for comparison)\n"
"  --mutex              no dlock and no Redis: every name is a process-shared\n"
"                       pthread mutex in shared memory (the ideal to compare\n"
"                       with; the token is a per-name counter bumped in the\n"
"                       critical section; --wait-ms: >0 timedlock, 0 trylock,\n"
"                       -1 lock). No redis-server is started; with --redis its\n"
"                       INFO is read, else the Redis fields are null\n"
"  --naive              no dlock: the simplest Redis lock, as written in ten\n"
"                       lines: SET <prefix>{name} <unique token> NX PX\n"
"                       <lease-ms>, retried every 1 ms until --wait-ms, and a\n"
"                       Lua compare-and-delete (EVAL) to release, on one\n"
"                       connection per thread; the token checked is a per-name\n"
"                       counter bumped in the critical section, as with --mutex\n"
"  --read-pct P         P%% of acquisitions take the name shared (read:\n"
"                       dlock_acquire_shared; with --mutex a process-shared\n"
"                       rwlock), the rest exclusively (0..100, default 0).\n"
"                       Checked in every\n"
"                       critical section: no reader beside a writer (nor two\n"
"                       writers), the counter unchanged under a reader, a\n"
"                       reader's token above every writer's before it, a\n"
"                       writer's above every token before it (the rwlock, with\n"
"                       --mutex, prefers writers as dlock does). Waits are\n"
"                       reported per mode too (writers', readers'), and a\n"
"                       mode that asked but never got the name fails the run\n"
"  --sem N              every name is a counting semaphore of N permits (1..%d):\n"
"                       dlock_sem_acquire (with --mutex a process-shared POSIX\n"
"                       semaphore; with --naive a counter per name that a Lua\n"
"                       script (EVAL) raises while it is below N, retried every\n"
"                       1 ms, and DECR lowers: no lease). Checked in every\n"
"                       critical section: never more than N holders inside at\n"
"                       once (the most seen: max_holders). Permits have no\n"
"                       tokens\n"
"  --plant BUG          a bug the checks must catch (for their tests):\n"
"                       readers-unlocked (with --read-pct: readers take no lock),\n"
"                       sem-over (with --sem: the semaphore is given N + 1\n"
"                       permits, the checks allow N)\n"
"  --rtt-us N           clients reach Redis through the project's fault proxy\n"
"                       (tests/support/proxy.c, in a process of its own) that delays\n"
"                       each direction by N/2 us: a data-center round trip\n"
"                       instead of loopback's ~30 us (0..1000000, default 0:\n"
"                       direct). INFO is still read from Redis directly\n"
"  --unix               clients (dlock and --naive) reach the private redis-server\n"
"                       over a Unix socket (INFO is still read over TCP)\n"
"  --min-replicas N     the private redis-server gets N replicas (0..4) and dlock\n"
"                       WAITs for N after each grant and renewal (min_replicas)\n"
"  --sentinel           a private master, one replica and three sentinels; the\n"
"                       clients find the master through the sentinels (with\n"
"                       --min-replicas 1 they WAIT for the replica)\n"
"  --cluster            a private Redis Cluster of 3 masters (all 16384 slots\n"
"                       assigned); the clients run in Cluster mode with every\n"
"                       node as a seed (cluster_nodes). The Redis figures\n"
"                       (round trips, commands, CPU) are summed over the nodes\n"
"                       that say ROLE master when INFO is read. Not with\n"
"                       --naive, --mutex, --redis, --unix, --sentinel, --rtt-us\n"
"                       or --min-replicas\n"
"  --redlock N          N private redis-servers (3 or 5), independent masters,\n"
"                       seeded fresh (as `dlockctl seed-fresh`); the clients run\n"
"                       in Redlock mode (redlock_nodes, protocol 2). Each client\n"
"                       first waits until it counts the nodes (about a lease,\n"
"                       before the run starts); the default lease is then 1000\n"
"                       ms (a refused acquire waits in every node's queue,\n"
"                       woken by a release on any node)\n"
"                       and connect and command timeouts 200 ms. The Redis\n"
"                       figures are summed over the nodes (and each node's CPU\n"
"                       is reported). Locks, exclusive and shared, and\n"
"                       semaphores (--sem, a limit of at most 64): not with\n"
"                       --naive, --mutex, --client-per-thread, --redis,\n"
"                       --unix, --sentinel, --cluster, --rtt-us, --min-replicas\n"
"                       or --protocol other than 2\n"
"  --node-fault KIND   with --redlock: a fault of the last node, --fault-at S\n"
"                       into the run (default 1): kill (SIGKILL, left down),\n"
"                       stop (SIGSTOP, SIGCONT --fault-for S later, default\n"
"                       2), restart (SIGKILL, started again on its AOF after\n"
"                       --fault-for S, default 0; that node runs with\n"
"                       appendfsync always) or wipe (the same, empty). Fails\n"
"                       the run unless it struck and acquisitions went on a\n"
"                       lease after it (when every lease granted before it\n"
"                       has run out). The longest gap between two grants is\n"
"                       reported always\n"
"  --fault-at S, --fault-for S   (see --node-fault)\n"
"  --cluster-replicas R with --cluster: R replicas per master (0..1, default 0;\n"
"                       dlock does not WAIT for them)\n"
"  --redis HOST:PORT    use this loopback Redis (127.x.x.x or localhost)\n"
"                       instead of starting a private redis-server\n"
"  --stack-kb K         stack of the storm's threads in KiB (16..65536,\n"
"                       default %ld)\n"
"  --metrics FILE       worker process 0 writes its (first) client's metrics in\n"
"                       the Prometheus text format to FILE before it closes it\n"
"  --quiet              no progress lines and no summary on stderr\n"
"  --help               this text\n"
"\n"
"Exit status: 0 all checks passed; 1 violation, token regression, counter\n"
"mismatch, failed worker, an acquire or release that failed with an error\n"
"(not a timeout, nor DLOCK_EBUSY with --wait-ms 0), more acquisitions\n"
"timed out than succeeded, or a --node-fault that did not strike or after\n"
"which no acquisition came a lease later; 2 bad usage.\n",
        MAX_PROCS, MAX_THREADS, MAX_TOTAL_THREADS, MAX_LOCKS, MAX_US, MAX_US,
        DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS, MAX_TOTAL_THREADS, O.stack_kb);
}

static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "storm: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(try storm --help)\n");
    exit(2);
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0')
        bad_usage("%s: '%s' is not an integer", opt, s);
    if (v < lo || v > hi)
        bad_usage("%s: %ld is out of range [%ld, %ld]", opt, v, lo, hi);
    return v;
}

static double parse_double(const char *opt, const char *s, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || v != v)
        bad_usage("%s: '%s' is not a number", opt, s);
    if (v < lo || v > hi)
        bad_usage("%s: %g is out of range [%g, %g]", opt, v, lo, hi);
    return v;
}

static int is_loopback(const char *h)
{
    if (strcmp(h, "localhost") == 0)
        return 1;
    unsigned a, b, c, d;
    char extra;
    if (sscanf(h, "%u.%u.%u.%u%c", &a, &b, &c, &d, &extra) == 4)
        return a == 127 && b < 256 && c < 256 && d < 256;
    return 0;
}

void parse_opts(int argc, char **argv)
{
    enum { O_PROCS = 256, O_THREADS, O_LOCKS, O_SECONDS, O_CS, O_CS_SLEEP, O_THINK,
           O_PASS, O_JOIN, O_LEASE, O_WAIT, O_POOL, O_CPT, O_MUTEX, O_NAIVE, O_RTT, O_REDIS, O_STACK,
           O_QUIET, O_UNIX, O_MINREP, O_SENTINEL, O_CLUSTER, O_CLUSTER_REPLICAS, O_METRICS,
           O_PROTOCOL, O_REDLOCK, O_NODE_FAULT, O_FAULT_AT, O_FAULT_FOR, O_READ_PCT, O_SEM, O_PLANT, O_HELP };
    static const struct option lo[] = {
        {"procs", required_argument, 0, O_PROCS},
        {"threads", required_argument, 0, O_THREADS},
        {"locks", required_argument, 0, O_LOCKS},
        {"seconds", required_argument, 0, O_SECONDS},
        {"cs-us", required_argument, 0, O_CS},
        {"cs-sleep", no_argument, 0, O_CS_SLEEP},
        {"think-us", required_argument, 0, O_THINK},
        {"pass-limit", required_argument, 0, O_PASS},
        {"join-ms", required_argument, 0, O_JOIN},
        {"protocol", required_argument, 0, O_PROTOCOL},
        {"lease-ms", required_argument, 0, O_LEASE},
        {"wait-ms", required_argument, 0, O_WAIT},
        {"pool-size", required_argument, 0, O_POOL},
        {"client-per-thread", no_argument, 0, O_CPT},
        {"mutex", no_argument, 0, O_MUTEX},
        {"naive", no_argument, 0, O_NAIVE},
        {"rtt-us", required_argument, 0, O_RTT},
        {"redis", required_argument, 0, O_REDIS},
        {"unix", no_argument, 0, O_UNIX},
        {"sentinel", no_argument, 0, O_SENTINEL},
        {"cluster", no_argument, 0, O_CLUSTER},
        {"cluster-replicas", required_argument, 0, O_CLUSTER_REPLICAS},
        {"redlock", required_argument, 0, O_REDLOCK},
        {"node-fault", required_argument, 0, O_NODE_FAULT},
        {"fault-at", required_argument, 0, O_FAULT_AT},
        {"fault-for", required_argument, 0, O_FAULT_FOR},
        {"min-replicas", required_argument, 0, O_MINREP},
        {"stack-kb", required_argument, 0, O_STACK},
        {"quiet", no_argument, 0, O_QUIET},
        {"metrics", required_argument, 0, O_METRICS},
        {"read-pct", required_argument, 0, O_READ_PCT},
        {"sem", required_argument, 0, O_SEM},
        {"plant", required_argument, 0, O_PLANT},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    opterr = 0;
    for (;;) {
        int idx = 0;
        int c = getopt_long(argc, argv, ":", lo, &idx);
        if (c == -1)
            break;
        switch (c) {
        case O_PROCS: O.procs = (int)parse_long("--procs", optarg, 1, MAX_PROCS); break;
        case O_THREADS: O.threads = (int)parse_long("--threads", optarg, 1, MAX_THREADS); break;
        case O_LOCKS: O.locks = (int)parse_long("--locks", optarg, 1, MAX_LOCKS); break;
        case O_SECONDS: O.seconds = parse_double("--seconds", optarg, 0.001, 86400); break;
        case O_CS: O.cs_us = parse_long("--cs-us", optarg, 0, MAX_US); break;
        case O_CS_SLEEP: O.cs_sleep = 1; break;
        case O_THINK: O.think_us = parse_long("--think-us", optarg, 0, MAX_US); break;
        case O_PASS: O.pass_limit = parse_long("--pass-limit", optarg, 0, UINT32_MAX); break;
        case O_JOIN: O.join_ms = parse_long("--join-ms", optarg, 0, UINT32_MAX); break;
        case O_LEASE:
            O.lease_ms = parse_long("--lease-ms", optarg, DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS);
            O.lease_set = 1;
            break;
        case O_WAIT: O.wait_ms = parse_long("--wait-ms", optarg, -1, 3600000); break;
        case O_POOL: O.pool_size = parse_long("--pool-size", optarg, 1, 1024); break;
        case O_PROTOCOL:
            O.protocol = strcmp(optarg, "mixed") == 0
                             ? -1
                             : (int)parse_long("--protocol", optarg, DLOCK_PROTOCOL_LOWEST,
                                               DLOCK_PROTOCOL_HIGHEST);
            break;
        case O_CPT: O.client_per_thread = 1; break;
        case O_MUTEX: O.mutex = 1; break;
        case O_NAIVE: O.naive = 1; break;
        case O_RTT: O.rtt_us = parse_long("--rtt-us", optarg, 0, 1000000); break;
        case O_REDIS: {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg)
                bad_usage("--redis: expected HOST:PORT, got '%s'", optarg);
            size_t hl = (size_t)(colon - optarg);
            if (hl >= sizeof O.host)
                bad_usage("--redis: host too long");
            memcpy(O.host, optarg, hl);
            O.host[hl] = '\0';
            O.port = (int)parse_long("--redis port", colon + 1, 1, 65535);
            if (!is_loopback(O.host))
                bad_usage("--redis: '%s' is not a loopback address (127.x.x.x or localhost);"
                          " storm only talks to this machine", O.host);
            break;
        }
        case O_STACK: O.stack_kb = parse_long("--stack-kb", optarg, 16, 65536); break;
        case O_UNIX: O.unix_socket = 1; break;
        case O_SENTINEL: O.sentinel = 1; break;
        case O_CLUSTER: O.cluster = 1; break;
        case O_REDLOCK:
            O.redlock = (int)parse_long("--redlock", optarg, 3, REDLOCK_MAX);
            if (O.redlock % 2 == 0)
                bad_usage("--redlock: N is odd (3 or 5), not %d", O.redlock);
            break;
        case O_NODE_FAULT: {
            static const char *const k[] = {"kill", "stop", "restart", "wipe"};
            O.node_fault = 0;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, k[i]) == 0)
                    O.node_fault = NF_KILL + i;
            if (!O.node_fault)
                bad_usage("--node-fault: kill, stop, restart or wipe, not '%s'", optarg);
            break;
        }
        case O_FAULT_AT: O.fault_at = parse_double("--fault-at", optarg, 0, 86400); break;
        case O_FAULT_FOR: O.fault_for = parse_double("--fault-for", optarg, 0, 86400); break;
        case O_CLUSTER_REPLICAS:
            O.cluster_replicas = (int)parse_long("--cluster-replicas", optarg, 0, 1);
            O.cluster_replicas_set = 1;
            break;
        case O_MINREP:
            O.min_replicas = (int)parse_long("--min-replicas", optarg, 0, MAX_REPLICAS);
            break;
        case O_READ_PCT: O.read_pct = (int)parse_long("--read-pct", optarg, 0, 100); break;
        case O_SEM: O.sem_limit = parse_long("--sem", optarg, 1, MAX_TOTAL_THREADS); break;
        case O_PLANT:
            if (strcmp(optarg, "readers-unlocked") != 0 && strcmp(optarg, "sem-over") != 0)
                bad_usage("--plant: readers-unlocked or sem-over, not '%s'", optarg);
            O.plant = optarg;
            break;
        case O_QUIET: O.quiet = 1; break;
        case O_METRICS: O.metrics_path = optarg; break;
        case O_HELP: usage(stdout); exit(0);
        case ':':
            bad_usage("option '%s' needs a value", argv[optind - 1]);
            break;
        default:
            bad_usage("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        bad_usage("unexpected argument '%s'", argv[optind]);
    if ((long)O.procs * O.threads > MAX_TOTAL_THREADS)
        bad_usage("--procs x --threads = %ld exceeds %d", (long)O.procs * O.threads,
                  MAX_TOTAL_THREADS);
    if (O.mutex + O.naive + O.client_per_thread > 1)
        bad_usage("--mutex, --naive and --client-per-thread are mutually exclusive");
    if (O.cluster_replicas_set && !O.cluster)
        bad_usage("--cluster-replicas needs --cluster");
    if (O.cluster && (O.naive || O.mutex || O.port || O.unix_socket || O.sentinel ||
                      O.rtt_us > 0 || O.min_replicas))
        bad_usage("--cluster starts a private Redis Cluster for dlock's Cluster mode: not with"
                  " --naive, --mutex, --redis, --unix, --sentinel, --rtt-us or --min-replicas");
    if (O.redlock && (O.naive || O.mutex || O.client_per_thread))
        bad_usage("--redlock runs dlock's Redlock mode: not with --naive, --mutex or"
                  " --client-per-thread");
    if (O.redlock && (O.port || O.unix_socket || O.sentinel || O.cluster || O.rtt_us > 0 ||
                      O.min_replicas))
        bad_usage("--redlock starts its own %d independent masters: not with --redis, --unix,"
                  " --sentinel, --cluster, --rtt-us or --min-replicas", O.redlock);
    if (O.redlock && O.protocol != 0 && O.protocol != 2)
        bad_usage("--redlock needs protocol 2 (Redlock mode): not with --protocol %s",
                  O.protocol < 0 ? "mixed" : "1");
    if (O.node_fault && !O.redlock)
        bad_usage("--node-fault needs --redlock");
    if (O.fault_for < 0)
        O.fault_for = O.node_fault == NF_STOP ? 2.0 : 0.0;
    if (O.redlock && !O.lease_set)
        O.lease_ms = 1000;
    if (O.node_fault && O.fault_at + (double)O.lease_ms / 1000 >= O.seconds)
        bad_usage("--fault-at %g: the run (--seconds %g) must go on a lease (%ld ms) past the"
                  " fault, or nothing it checks could happen", O.fault_at, O.seconds, O.lease_ms);
    if (O.read_pct > 0 && O.naive)
        bad_usage("--read-pct: dlock's shared mode or, with --mutex, a process-shared rwlock; "
                  "--naive has no shared mode");
    if (O.read_pct > 0 && O.sem_limit > 0)
        bad_usage("--read-pct and --sem: one or the other");
    if (O.plant && strcmp(O.plant, "readers-unlocked") == 0 && O.read_pct == 0)
        bad_usage("--plant readers-unlocked needs --read-pct");
    if (O.plant && strcmp(O.plant, "sem-over") == 0 && O.sem_limit == 0)
        bad_usage("--plant sem-over needs --sem");
    if (O.mutex && O.rtt_us > 0)
        bad_usage("--rtt-us needs Redis: not with --mutex");
    if ((O.unix_socket || O.min_replicas || O.sentinel) && (O.mutex || O.port))
        bad_usage("--unix, --min-replicas and --sentinel start a private redis-server: not with"
                  " --mutex or --redis");
    if (O.sentinel && (O.unix_socket || O.rtt_us > 0 || O.min_replicas > 1))
        bad_usage("--sentinel: not with --unix or --rtt-us, and its one replica allows"
                  " --min-replicas 1 at most");
    if (O.unix_socket && O.rtt_us > 0)
        bad_usage("--unix and --rtt-us: the delaying proxy speaks TCP only");
    if (O.naive && O.min_replicas)
        fprintf(stderr, "storm: note: --naive does not WAIT for replicas\n");
    if (O.naive && (O.pass_limit >= 0 || O.pool_size > 0))
        fprintf(stderr, "storm: note: --pass-limit and --pool-size have no effect with --naive\n");
    if (O.mutex && (O.pass_limit >= 0 || O.pool_size > 0 || O.lease_ms != 30000))
        fprintf(stderr, "storm: note: --pass-limit, --pool-size and --lease-ms have no effect"
                        " with --mutex\n");
    if (O.client_per_thread && O.pass_limit >= 0)
        fprintf(stderr, "storm: note: --pass-limit has no effect with --client-per-thread"
                        " (one thread per client)\n");
}
