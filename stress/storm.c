/*
 * storm: a thread storm against dlock that shows and checks what it does.
 *
 * The parent (which never opens a dlock client nor starts a thread) starts a
 * private redis-server unless --redis is given (with --sentinel a Sentinel
 * topology, with --cluster a 3-master Redis Cluster), reads the server's INFO
 * (commandstats and cpu; with --cluster summed over the masters), maps one
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
 * shared region): the same work and checks with no Redis at all, the ideal
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
 *    be lost under extreme load, which release then reports as DLOCK_ELOST).
 *
 * Wait percentiles come from per-thread log-scale histograms (8 sub-buckets
 * per power of two of microseconds): they are approximations within about
 * 6 % (the middle of the bucket is reported, clipped to the exact maximum).
 *
 * Exit status: 0 if no violation, no token regression, the counters matched,
 * every worker finished cleanly, no call failed with an error (a timeout, or
 * DLOCK_EBUSY with --wait-ms 0, is the scenario's, not an error) and at most
 * as many acquisitions timed out as succeeded; 1 otherwise; 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
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
#include <hiredis/hiredis.h>
#ifdef DLOCK_LOCKSTAT
#include "lockstat.h"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define STORM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STORM_ASAN 1
#endif
#endif
#ifdef STORM_ASAN
#include <sanitizer/lsan_interface.h>
#endif

/* ------------------------------------------------------------------ */
/* Options                                                              */

#define MAX_PROCS 64
#define MAX_REPLICAS 4   /* --min-replicas */
#define MAX_THREADS 4096
#define MAX_TOTAL_THREADS 16384
#define MAX_LOCKS 1000000
#define MAX_US 10000000L        /* 10 s for cs/think */
#define SETUP_TIMEOUT_NS (20LL * 1000000000LL)
#define OVERRUN_NS (30LL * 1000000000LL)

typedef struct opts {
    int procs, threads, locks;
    double seconds;
    long cs_us, think_us;
    int cs_sleep;
    long pass_limit;          /* -1: library default */
    long lease_ms;
    long wait_ms;
    long pool_size;           /* -1: library default (1 with --client-per-thread) */
    int client_per_thread;
    int mutex;                /* process-shared pthread mutexes instead of dlock */
    int naive;                /* the simplest Redis lock instead of dlock */
    long rtt_us;              /* > 0: clients reach Redis through a delaying proxy */
    char host[256];
    int port;                 /* 0: private redis-server */
    int unix_socket;          /* --unix: clients reach the private server over a Unix socket */
    int min_replicas;         /* --min-replicas: replicas of the private server, and
                                 dlock's min_replicas */
    int sentinel;             /* --sentinel: a private master, replica and three
                                 sentinels; clients in Sentinel mode */
    int cluster;              /* --cluster: a private 3-master Redis Cluster;
                                 clients in Cluster mode */
    int cluster_replicas;     /* --cluster-replicas: replicas per master (0..1) */
    int cluster_replicas_set; /* --cluster-replicas given */
    long stack_kb;
    int quiet;
    const char *metrics_path; /* --metrics: worker 0's client's Prometheus text */
} opts;

static opts O = {
    .procs = 2, .threads = 16, .locks = 1, .seconds = 5.0, .cs_us = 100,
    .think_us = 1000, .cs_sleep = 0, .pass_limit = -1, .lease_ms = 30000,
    .wait_ms = 2000, .pool_size = -1, .client_per_thread = 0, .host = "127.0.0.1",
    .port = 0,
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
"  --pass-limit K       dlock pass_limit (local handoffs before the lease goes\n"
"                       back to Redis; default: the library's)\n"
"  --lease-ms M         lease time (%u..%u, default 30000)\n"
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
"  --rtt-us N           clients reach Redis through the project's fault proxy\n"
"                       (tests/proxy.c, in a process of its own) that delays\n"
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
"(not a timeout, nor DLOCK_EBUSY with --wait-ms 0), or more acquisitions\n"
"timed out than succeeded; 2 bad usage.\n",
        MAX_PROCS, MAX_THREADS, MAX_TOTAL_THREADS, MAX_LOCKS, MAX_US, MAX_US,
        DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS, O.stack_kb);
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

static void parse_opts(int argc, char **argv)
{
    enum { O_PROCS = 256, O_THREADS, O_LOCKS, O_SECONDS, O_CS, O_CS_SLEEP, O_THINK,
           O_PASS, O_LEASE, O_WAIT, O_POOL, O_CPT, O_MUTEX, O_NAIVE, O_RTT, O_REDIS, O_STACK,
           O_QUIET, O_UNIX, O_MINREP, O_SENTINEL, O_CLUSTER, O_CLUSTER_REPLICAS, O_METRICS,
           O_HELP };
    static const struct option lo[] = {
        {"procs", required_argument, 0, O_PROCS},
        {"threads", required_argument, 0, O_THREADS},
        {"locks", required_argument, 0, O_LOCKS},
        {"seconds", required_argument, 0, O_SECONDS},
        {"cs-us", required_argument, 0, O_CS},
        {"cs-sleep", no_argument, 0, O_CS_SLEEP},
        {"think-us", required_argument, 0, O_THINK},
        {"pass-limit", required_argument, 0, O_PASS},
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
        {"min-replicas", required_argument, 0, O_MINREP},
        {"stack-kb", required_argument, 0, O_STACK},
        {"quiet", no_argument, 0, O_QUIET},
        {"metrics", required_argument, 0, O_METRICS},
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
        case O_LEASE:
            O.lease_ms = parse_long("--lease-ms", optarg, DLOCK_LEASE_MIN_MS, DLOCK_LEASE_MAX_MS);
            break;
        case O_WAIT: O.wait_ms = parse_long("--wait-ms", optarg, -1, 3600000); break;
        case O_POOL: O.pool_size = parse_long("--pool-size", optarg, 1, 1024); break;
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
        case O_CLUSTER_REPLICAS:
            O.cluster_replicas = (int)parse_long("--cluster-replicas", optarg, 0, 1);
            O.cluster_replicas_set = 1;
            break;
        case O_MINREP: O.min_replicas = (int)parse_long("--min-replicas", optarg, 0, MAX_REPLICAS); break;
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

/* ------------------------------------------------------------------ */
/* Shared memory                                                        */

#define NB 312       /* histogram buckets: exact 0..7 us, then 8 per octave up to 2^40 us */
#define NERR 16      /* per error code, index -code (0: code outside the list) */
#define NAME_LEN 24
#define LOG_MAX 20   /* detailed lines about failures, over all processes */

typedef struct name_state {
    uint64_t counter;    /* read at CS start, written +1 at CS end (non-atomic RMW) */
    uint64_t last_token; /* highest fencing token seen for this name */
    int32_t occupancy;   /* threads inside the CS right now */
    int32_t last_proc;   /* worker process of the last holder + 1 (0: none yet);
                            read and written by the holder only */
} __attribute__((aligned(64))) name_state;

/* --mutex only: the lock of a name and its token counter. */
typedef struct mutex_state {
    pthread_mutex_t m;   /* PTHREAD_PROCESS_SHARED */
    uint64_t token;      /* last token handed out: read and written +1 under m */
} __attribute__((aligned(64))) mutex_state;

typedef struct thread_res {
    /* read live by the parent: updated with atomic stores */
    uint64_t acq, timeouts, errors_total, violations, regressions;
    int phase;            /* PH_*: where the thread is, for diagnosing a hang */
    int name_idx;         /* the name it is acquiring, holding or releasing */
    /* read only after the run */
    uint64_t busy, not_held;
    uint64_t crossings;   /* acquisitions whose previous holder was another process */
    uint64_t errors[NERR];
    uint64_t rel_errors[NERR];
    uint64_t wait_sum_us, wait_max_us;
    uint64_t hist[NB];
} __attribute__((aligned(64))) thread_res;

typedef struct proc_res {
    int setup_done;       /* 1 when the worker's threads are created (or it gave up) */
    int failed;           /* setup failure */
    int threads_started;
    int clients_opened;
    int closing;          /* 1 while closing its clients, 2 after */
    dlock_stats stats;    /* summed over the worker's clients before closing */
    char msg[256];
} __attribute__((aligned(64))) proc_res;

typedef struct shm_hdr {
    int stop;             /* set by SIGINT/SIGTERM or by the parent */
    int go;
    int64_t start_ns, deadline_ns;
    int64_t last_end_ns;  /* latest time a thread left its loop */
    int log_lines;
} __attribute__((aligned(64))) shm_hdr;

static shm_hdr *H;
static proc_res *PR;
static name_state *NS;
static thread_res *TR;
static mutex_state *MX;   /* --mutex only, else NULL */
static void *shm_base;
static size_t shm_size;
static char *names;       /* locks x NAME_LEN, private copy per process */
static char key_prefix[64];
static int client_port;   /* where the workers' clients connect: Redis, or the proxy */
static pid_t proxy_pid;   /* --rtt-us: the proxy process */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static void shm_create(void)
{
    size_t total = (size_t)O.procs * O.threads;
    size_t off_pr = align64(sizeof(shm_hdr));
    size_t off_ns = off_pr + align64(sizeof(proc_res) * O.procs);
    size_t off_tr = off_ns + align64(sizeof(name_state) * O.locks);
    size_t off_mx = off_tr + align64(sizeof(thread_res) * total);
    shm_size = off_mx + (O.mutex || O.naive ? align64(sizeof(mutex_state) * O.locks) : 0);
    shm_base = mmap(NULL, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm_base == MAP_FAILED) {
        fprintf(stderr, "storm: mmap of %zu bytes failed: %s\n", shm_size, strerror(errno));
        exit(1);
    }
    H = (shm_hdr *)shm_base;
    PR = (proc_res *)((char *)shm_base + off_pr);
    NS = (name_state *)((char *)shm_base + off_ns);
    TR = (thread_res *)((char *)shm_base + off_tr);
    if (!O.mutex && !O.naive)
        return; /* --naive uses the token counters only */
    MX = (mutex_state *)((char *)shm_base + off_mx);
    pthread_mutexattr_t ma;
    int e = pthread_mutexattr_init(&ma);
    if (!e)
        e = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    for (int i = 0; !e && i < O.locks; i++)
        e = pthread_mutex_init(&MX[i].m, &ma);
    if (e) {
        fprintf(stderr, "storm: process-shared mutex setup failed: %s\n", strerror(e));
        exit(1);
    }
    pthread_mutexattr_destroy(&ma);
}

/* Destroyed by the parent once every worker is gone (none holds a mutex). */
static void shm_destroy_mutexes(void)
{
    if (!MX)
        return;
    for (int i = 0; i < O.locks; i++)
        pthread_mutex_destroy(&MX[i].m);
}

/* ------------------------------------------------------------------ */
/* Time and helpers                                                     */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static void critical_section(long us)
{
    if (us <= 0) {
        for (int i = 0; i < 64; i++)
            cpu_relax();
        return;
    }
    if (O.cs_sleep) {
        sleep_ns((int64_t)us * 1000);
        return;
    }
    int64_t end = now_ns() + (int64_t)us * 1000;
    while (now_ns() < end)
        cpu_relax();
}

static int bucket_of(uint64_t v)
{
    if (v < 8)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int sub = (int)((v >> (e - 3)) & 7);
    int b = 8 + (e - 3) * 8 + sub;
    return b < NB ? b : NB - 1;
}

/* A representative value of bucket b: its exact value below 8, else the middle. */
static uint64_t bucket_value(int b)
{
    if (b < 8)
        return (uint64_t)b;
    int e = (b - 8) / 8 + 3, sub = (b - 8) % 8;
    uint64_t lo = (uint64_t)(8 + sub) << (e - 3);
    uint64_t hi = (uint64_t)(9 + sub) << (e - 3);
    return (lo + hi - 1) / 2;
}

static int err_index(int code)
{
    int i = -code;
    return (i >= 1 && i < NERR) ? i : 0;
}

static const char *err_index_name(int i)
{
    if (i == 0)
        return "other";
    return dlock_err_name(-i);
}

static void logf_limited(const char *fmt, ...)
{
    if (__atomic_add_fetch(&H->log_lines, 1, __ATOMIC_RELAXED) > LOG_MAX)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    /* one write() per line so that lines of several processes do not mix */
    char line[560];
    int m = snprintf(line, sizeof line, "storm[%d]: %.*s\n", (int)getpid(), n, buf);
    if (m > 0)
        (void)!write(2, line, (size_t)(m < (int)sizeof line ? m : (int)sizeof line - 1));
}

enum { PH_START, PH_THINK, PH_ACQUIRE, PH_CS, PH_RELEASE, PH_DONE, PH_N };
static const char *const phase_name[PH_N] = {
    "not started", "thinking", "acquiring", "in critical section",
    "releasing", "done",
};
#define SET_PHASE(r, ph) __atomic_store_n(&(r)->phase, (ph), __ATOMIC_RELAXED)

#define LIVE_INC(x) __atomic_store_n(&(x), (x) + 1, __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ */
/* Worker threads                                                       */

typedef struct targ {
    int proc, idx;
    dlock_client *c;
    thread_res *r;
    pthread_t tid;
} targ;

/* Per-thread text of the last mutex failure (dlock_last_error's analogue). */
static __thread char mx_err[128];

/* --mutex: lock name li as dlock_acquire would, with the same return codes
 * (DLOCK_EBUSY, DLOCK_ETIMEDOUT, other failures as DLOCK_EINVAL with the
 * reason in mx_err). The token is the name's counter + 1, written back
 * inside the critical section: overlapping holders would see equal tokens. */
static int mutex_acquire(int li, uint64_t *fence)
{
    mutex_state *mx = &MX[li];
    int e;
    if (O.wait_ms < 0) {
        e = pthread_mutex_lock(&mx->m);
    } else if (O.wait_ms == 0) {
        e = pthread_mutex_trylock(&mx->m);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += O.wait_ms / 1000;
        ts.tv_nsec += (O.wait_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        e = pthread_mutex_timedlock(&mx->m, &ts);
    }
    if (e == 0) {
        uint64_t t = __atomic_load_n(&mx->token, __ATOMIC_RELAXED) + 1;
        __atomic_store_n(&mx->token, t, __ATOMIC_RELAXED);
        *fence = t;
        return DLOCK_OK;
    }
    if (e == EBUSY)
        return DLOCK_EBUSY;
    if (e == ETIMEDOUT)
        return DLOCK_ETIMEDOUT;
    snprintf(mx_err, sizeof mx_err, "pthread mutex lock: %s", strerror(e));
    return DLOCK_EINVAL;
}

static int mutex_release(int li)
{
    int e = pthread_mutex_unlock(&MX[li].m);
    if (e == 0)
        return DLOCK_OK;
    snprintf(mx_err, sizeof mx_err, "pthread_mutex_unlock: %s", strerror(e));
    return DLOCK_EINVAL;
}

/* --naive: the simplest Redis lock, one connection per thread. */
static char unix_path[300]; /* --unix: the private server's socket */

/* --min-replicas: the private server's replicas (stopped with it). */
static fx_redis replicas[MAX_REPLICAS];
static int nreplicas;

/* --sentinel: the private topology. */
static fx_sentinel_set sentinel_set;
#define SENTINEL_MASTER "storm"

/* --cluster: the private Redis Cluster. */
static fx_cluster cluster_set;
#define CLUSTER_MASTERS 3

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
static __thread redisContext *naive_conn;
static __thread char naive_token[64];
static __thread uint64_t naive_seq;
static const char naive_unlock[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

static int naive_connect(void)
{
    if (naive_conn && !naive_conn->err)
        return 0;
    if (naive_conn)
        redisFree(naive_conn);
    struct timeval tv = {1, 0};
    naive_conn = unix_path[0] ? redisConnectUnixWithTimeout(unix_path, tv)
                              : redisConnectWithTimeout(O.host, client_port, tv);
    if (!naive_conn || naive_conn->err) {
        snprintf(mx_err, sizeof mx_err, "%s",
                 naive_conn ? naive_conn->errstr : "connect: out of memory");
        if (naive_conn)
            redisFree(naive_conn);
        naive_conn = NULL;
        return -1;
    }
    redisSetTimeout(naive_conn, tv);
    return 0;
}

/* Sends one command; the reply, or NULL with mx_err set and the connection
 * dropped (the next call reconnects). */
static redisReply *naive_command(const char *fmt, ...)
{
    if (naive_connect() != 0)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(naive_conn, fmt, ap);
    va_end(ap);
    if (!r) {
        snprintf(mx_err, sizeof mx_err, "%s", naive_conn->errstr);
        redisFree(naive_conn);
        naive_conn = NULL;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(mx_err, sizeof mx_err, "%s", r->str);
        freeReplyObject(r);
        r = NULL;
    }
    return r;
}

/* --naive acquire, with dlock_acquire's return codes. */
static int naive_acquire(int li, const char *name, uint64_t *fence)
{
    int64_t deadline = O.wait_ms < 0 ? INT64_MAX : now_ns() + O.wait_ms * 1000000LL;
    snprintf(naive_token, sizeof naive_token, "%d:%lx:%" PRIu64, (int)getpid(),
             (unsigned long)pthread_self(), ++naive_seq);
    for (;;) {
        redisReply *r = naive_command("SET %s{%s} %s NX PX %ld", key_prefix, name, naive_token,
                                      O.lease_ms);
        if (!r)
            return DLOCK_EREDIS;
        int got = r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (got) {
            mutex_state *mx = &MX[li];
            uint64_t t = __atomic_load_n(&mx->token, __ATOMIC_RELAXED) + 1;
            __atomic_store_n(&mx->token, t, __ATOMIC_RELAXED);
            *fence = t;
            return DLOCK_OK;
        }
        if (O.wait_ms == 0)
            return DLOCK_EBUSY;
        if (now_ns() >= deadline)
            return DLOCK_ETIMEDOUT;
        sleep_ns(1000000);
    }
}

static int naive_release(const char *name)
{
    redisReply *r = naive_command("EVAL %s 1 %s{%s} %s", naive_unlock, key_prefix, name,
                                  naive_token);
    if (!r)
        return DLOCK_EREDIS;
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        snprintf(mx_err, sizeof mx_err, "the key was gone or another token's");
    return ok ? DLOCK_OK : DLOCK_ELOST;
}

static const char *last_error(void)
{
    return O.mutex || O.naive ? mx_err : dlock_last_error();
}

static void *thread_main(void *arg)
{
    targ *a = arg;
    thread_res *r = a->r;
    dlock_client *c = a->c;
    uint64_t rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)a->proc << 32) ^ (uint64_t)(a->idx + 1);
    rng ^= (uint64_t)getpid() * 0xBF58476D1CE4E5B9ULL;

    /* Sleep on the go flag itself (a futex in the shared region) rather than
     * poll it: a thousand threads polling every 5 ms kept a 2-core machine
     * so busy that 2 x 1024 threads sometimes took over 20 s to start. The
     * timeout only bounds how late a stop request is seen. */
    while (!__atomic_load_n(&H->go, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&H->stop, __ATOMIC_RELAXED)) {
        struct timespec ts = {0, 50000000};
        syscall(SYS_futex, &H->go, FUTEX_WAIT, 0, &ts, NULL, 0);
    }
    int64_t deadline = __atomic_load_n(&H->deadline_ns, __ATOMIC_ACQUIRE);

    for (;;) {
        if (__atomic_load_n(&H->stop, __ATOMIC_RELAXED) || now_ns() >= deadline)
            break;
        int li = 0;
        if (O.locks > 1) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            li = (int)(rng % (uint64_t)O.locks);
        }
        const char *name = names + (size_t)li * NAME_LEN;
        uint64_t fence = 0;
        __atomic_store_n(&r->name_idx, li, __ATOMIC_RELAXED);
        SET_PHASE(r, PH_ACQUIRE);
        int64_t t0 = now_ns();
        int rc = O.mutex   ? mutex_acquire(li, &fence)
                 : O.naive ? naive_acquire(li, name, &fence)
                           : dlock_acquire(c, name, O.wait_ms, &fence);
        int64_t t1 = now_ns();
        if (rc == DLOCK_OK) {
            SET_PHASE(r, PH_CS);
            name_state *ns = &NS[li];
            int occ = __atomic_add_fetch(&ns->occupancy, 1, __ATOMIC_ACQ_REL);
            if (occ != 1) {
                LIVE_INC(r->violations);
                logf_limited("VIOLATION: %d threads inside '%s' (proc %d thread %d, token %" PRIu64 ")",
                             occ, name, a->proc, a->idx, fence);
            }
            uint64_t last = __atomic_load_n(&ns->last_token, __ATOMIC_ACQUIRE);
            if (fence <= last) {
                LIVE_INC(r->regressions);
                logf_limited("TOKEN REGRESSION on '%s': got %" PRIu64 ", last seen %" PRIu64
                             " (proc %d thread %d)", name, fence, last, a->proc, a->idx);
            } else {
                __atomic_store_n(&ns->last_token, fence, __ATOMIC_RELEASE);
            }
            if (c && !dlock_held(c, name))
                r->not_held++;
            /* ordered by the lock under test, like the counter below */
            int lp = __atomic_load_n(&ns->last_proc, __ATOMIC_ACQUIRE);
            if (lp != 0 && lp != a->proc + 1)
                r->crossings++;
            __atomic_store_n(&ns->last_proc, a->proc + 1, __ATOMIC_RELEASE);
            uint64_t v = __atomic_load_n(&ns->counter, __ATOMIC_ACQUIRE);
            critical_section(O.cs_us);
            __atomic_store_n(&ns->counter, v + 1, __ATOMIC_RELEASE);
            __atomic_sub_fetch(&ns->occupancy, 1, __ATOMIC_ACQ_REL);
            SET_PHASE(r, PH_RELEASE);
            int rr = O.mutex ? mutex_release(li) : O.naive ? naive_release(name)
                                                           : dlock_release(c, name);
            if (rr != DLOCK_OK) {
                r->rel_errors[err_index(rr)]++;
                logf_limited("release of '%s' returned %s: %s", name, dlock_err_name(rr),
                             last_error());
            }
            LIVE_INC(r->acq);
            uint64_t w = (uint64_t)(t1 - t0) / 1000;
            r->wait_sum_us += w;
            if (w > r->wait_max_us)
                r->wait_max_us = w;
            r->hist[bucket_of(w)]++;
        } else if (rc == DLOCK_ETIMEDOUT) {
            LIVE_INC(r->timeouts);
        } else if (rc == DLOCK_EBUSY && O.wait_ms == 0) {
            r->busy++;
        } else {
            LIVE_INC(r->errors_total);
            r->errors[err_index(rc)]++;
            logf_limited("acquire of '%s' returned %d %s: %s", name, rc, dlock_err_name(rc),
                         last_error());
            sleep_ns(1000000); /* do not spin on a persistent failure */
        }
        SET_PHASE(r, PH_THINK);
        if (O.think_us > 0)
            sleep_ns((int64_t)O.think_us * 1000);
    }
    SET_PHASE(r, PH_DONE);
    if (naive_conn) {
        redisFree(naive_conn);
        naive_conn = NULL;
    }

    int64_t end = now_ns();
    int64_t prev = __atomic_load_n(&H->last_end_ns, __ATOMIC_RELAXED);
    while (end > prev &&
           !__atomic_compare_exchange_n(&H->last_end_ns, &prev, end, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Worker process                                                       */

static pid_t parent_pid;
static pid_t *pids;       /* parent: worker pids, liveness, exit statuses */
static int *alive, *wstatus;

static int open_client(dlock_client **out, proc_res *pr)
{
    dlock_config cfg;
    dlock_config_init(&cfg);
    if (unix_path[0]) {
        cfg.redis_host = NULL;
        cfg.redis_unix_path = unix_path;
    } else if (O.sentinel) {
        cfg.redis_host = NULL;
        cfg.sentinels = sentinel_set.addrs;
        cfg.sentinel_master = SENTINEL_MASTER;
    } else if (O.cluster) {
        cfg.redis_host = NULL;
        cfg.cluster_nodes = cluster_set.addrs;
    } else {
        cfg.redis_host = O.host;
        cfg.redis_port = client_port;
    }
    cfg.min_replicas = (uint32_t)O.min_replicas;
    cfg.key_prefix = key_prefix;
    cfg.lease_ms = (uint32_t)O.lease_ms;
    if (O.pass_limit >= 0)
        cfg.pass_limit = (uint32_t)O.pass_limit;
    if (O.pool_size > 0)
        cfg.pool_size = (uint32_t)O.pool_size;
    else if (O.client_per_thread)
        cfg.pool_size = 1;
    int rc = dlock_client_open(&cfg, out);
    if (rc != DLOCK_OK)
        snprintf(pr->msg, sizeof pr->msg, "dlock_client_open: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    return rc;
}

static void worker_main(int p) __attribute__((noreturn));
static void worker_main(int p)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent_pid)
        _exit(3);
    proc_res *pr = &PR[p];
    int T = O.threads;
    int nclients = O.mutex || O.naive ? 0 : O.client_per_thread ? T : 1;
    dlock_client **clients = calloc((size_t)(nclients ? nclients : 1), sizeof *clients);
    targ *args = calloc((size_t)T, sizeof *args);
    int failed = 0, opened = 0, started = 0;
    if (!clients || !args) {
        snprintf(pr->msg, sizeof pr->msg, "out of memory");
        failed = 1;
    }
    for (int i = 0; !failed && i < nclients; i++) {
        if (open_client(&clients[i], pr) != DLOCK_OK)
            failed = 1;
        else
            opened++;
    }
    if (!failed) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        int e = pthread_attr_setstacksize(&attr, (size_t)O.stack_kb * 1024);
        if (e) {
            snprintf(pr->msg, sizeof pr->msg, "pthread_attr_setstacksize(%ld KiB): %s",
                     O.stack_kb, strerror(e));
            failed = 1;
        }
        for (int i = 0; !failed && i < T; i++) {
            args[i].proc = p;
            args[i].idx = i;
            args[i].c = O.mutex || O.naive ? NULL : clients[O.client_per_thread ? i : 0];
            args[i].r = &TR[(size_t)p * T + i];
            e = pthread_create(&args[i].tid, &attr, thread_main, &args[i]);
            if (e) {
                snprintf(pr->msg, sizeof pr->msg, "pthread_create (thread %d of %d): %s", i, T,
                         strerror(e));
                failed = 1;
                break;
            }
            started++;
        }
        pthread_attr_destroy(&attr);
    }
    pr->clients_opened = opened;
    pr->threads_started = started;
    pr->failed = failed;
    __atomic_store_n(&pr->setup_done, 1, __ATOMIC_RELEASE);

    for (int i = 0; i < started; i++)
        pthread_join(args[i].tid, NULL);

    dlock_stats sum;
    memset(&sum, 0, sizeof sum);
    for (int i = 0; i < opened; i++) {
        dlock_stats s;
        if (dlock_client_stats(clients[i], &s) == DLOCK_OK) {
            sum.acquisitions += s.acquisitions;
            sum.redis_commands += s.redis_commands;
            sum.redis_round_trips += s.redis_round_trips;
            sum.renew_rounds += s.renew_rounds;
            sum.renew_round_trips += s.renew_round_trips;
            sum.renew_keys += s.renew_keys;
            sum.leases_held += s.leases_held;
            sum.leases_lost += s.leases_lost;
            sum.entries += s.entries;
        }
    }
    pr->stats = sum;
    if (O.metrics_path && p == 0 && opened) {
        char *text = dlock_client_metrics_prometheus(clients[0]);
        FILE *f = text ? fopen(O.metrics_path, "w") : NULL;
        if (f) {
            fputs(text, f);
            fclose(f);
        } else {
            fprintf(stderr, "storm: --metrics %s: %s\n", O.metrics_path,
                    text ? strerror(errno) : dlock_last_error());
        }
        free(text);
    }
#ifdef DLOCK_LOCKSTAT
    if (opened)
        dlock_lockstat_report(stderr, p, sum.acquisitions, O.seconds);
#endif
    __atomic_store_n(&pr->closing, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < opened; i++)
        dlock_client_close(clients[i]);
    __atomic_store_n(&pr->closing, 2, __ATOMIC_RELAXED);
    free(clients);
    free(args);
    free(names);
    int status = failed ? 3 : 0;
#ifdef STORM_ASAN
    if (__lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "storm: worker %d: LeakSanitizer found leaks\n", p);
        status = 4;
    }
#endif
    /* _exit: never run the parent's atexit handlers in a worker */
    _exit(status);
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

static info_snap read_info(void)
{
    if (O.cluster)
        return read_info_cluster();
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
         * script calls GET and DEL only); dlock's SETs run inside scripts. */
        long long set = fx_info_calls(host, port, "set");
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

/* --rtt-us: forks a process that runs the fault proxy (tests/proxy.c) in
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
static void report_stuck(int P, int T, const int *alive, const pid_t *pids)
{
    for (int p = 0; p < P; p++) {
        if (!alive[p])
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
        fprintf(stderr, "storm:   worker %d (pid %d)%s:", p, (int)pids[p],
                cl == 1 ? " stuck in dlock_client_close" : cl == 2 ? " past dlock_client_close" : "");
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

static uint64_t hist_percentile(const uint64_t *hist, uint64_t n, double p, uint64_t max)
{
    if (n == 0)
        return 0;
    uint64_t rank = (uint64_t)(p * (double)n);
    if ((double)rank < p * (double)n)
        rank++;
    if (rank < 1)
        rank = 1;
    uint64_t cum = 0;
    for (int b = 0; b < NB; b++) {
        cum += hist[b];
        if (cum >= rank) {
            uint64_t v = bucket_value(b);
            return v > max ? max : v;
        }
    }
    return max;
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
                O.host, O.port, O.cluster ? " (or another master of the cluster)" : "");

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
                                         : O.client_per_thread ? "client-per-thread" : "dlock";
    if (!O.quiet) {
        char where[400];
        if (O.cluster)
            snprintf(where, sizeof where, "a private redis cluster of %d masters with %d"
                     " replica(s) each (%d nodes, the first %s:%d)", CLUSTER_MASTERS,
                     O.cluster_replicas, cluster_set.n, O.host, O.port);
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
        if (now_ns() - fork_ns > SETUP_TIMEOUT_NS) {
            fprintf(stderr, "storm: workers not ready after %lld s; starting anyway\n",
                    SETUP_TIMEOUT_NS / 1000000000LL);
            worker_fail = 1;
            break;
        }
        sleep_ns(2000000);
    }
    int64_t start = now_ns();
    __atomic_store_n(&H->start_ns, start, __ATOMIC_RELAXED);
    __atomic_store_n(&H->deadline_ns, start + (int64_t)(O.seconds * 1e9), __ATOMIC_RELAXED);
    __atomic_store_n(&H->go, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &H->go, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    int64_t kill_at = fork_ns + (int64_t)(O.seconds * 1e9) + OVERRUN_NS;

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
        (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) * 1e6 +
        (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec);

    info_snap after = { .ok = 0 };
    if (have_redis)
        after = read_info();
    if (have_redis && !after.ok)
        fprintf(stderr, "storm: warning: could not read INFO from %s:%d%s after the run\n",
                O.host, O.port, O.cluster ? " (or another master of the cluster)" : "");

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
    uint64_t crossings = 0;
    uint64_t errors[NERR] = {0}, rel_errors[NERR] = {0};
    uint64_t wait_max = 0, wait_sum = 0;
    double sx = 0, sx2 = 0;
    uint64_t *hist = calloc(NB, sizeof *hist);
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
        crossings += t->crossings;
        for (int e = 0; e < NERR; e++) {
            errors[e] += t->errors[e];
            rel_errors[e] += t->rel_errors[e];
        }
        if (t->wait_max_us > wait_max)
            wait_max = t->wait_max_us;
        wait_sum += t->wait_sum_us;
        for (int b = 0; b < NB; b++)
            hist[b] += t->hist[b];
        double x = (double)t->acq;
        sx += x;
        sx2 += x * x;
        if (t->acq == 0)
            zero++;
    }
    uint64_t counter_sum = 0;
    for (int i = 0; i < O.locks; i++)
        counter_sum += NS[i].counter;
    int counter_ok = counter_sum == acq;
    double jain = sx2 > 0 ? (sx * sx) / ((double)total * sx2) : 0.0;
    int64_t last_end = H->last_end_ns;
    double elapsed = last_end > start ? (double)(last_end - start) / 1e9 : O.seconds;
    double acq_per_sec = elapsed > 0 ? (double)acq / elapsed : 0;
    uint64_t p50 = hist_percentile(hist, acq, 0.50, wait_max);
    uint64_t p99 = hist_percentile(hist, acq, 0.99, wait_max);
    dlock_stats cs;
    memset(&cs, 0, sizeof cs);
    for (int p = 0; p < P; p++) {
        cs.redis_commands += PR[p].stats.redis_commands;
        cs.redis_round_trips += PR[p].stats.redis_round_trips;
        cs.renew_rounds += PR[p].stats.renew_rounds;
        cs.renew_keys += PR[p].stats.renew_keys;
        cs.leases_lost += PR[p].stats.leases_lost;
    }

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
    /* the workers' user + system CPU, their set-up and critical sections
     * included (a busy critical section of X us costs X here) */
    /* share of acquisitions that took the name from another process */
    json_num(o, "crossings_per_acq", acq ? (double)crossings / (double)acq : 0, acq > 0, 0);
    json_num(o, "client_cpu_us_per_acq", acq ? workers_cpu_us / (double)acq : 0, acq > 0, 0);
    json_num(o, "client_cmds_per_acq", acq ? (double)cs.redis_commands / (double)acq : 0,
             acq > 0 && !O.mutex && !O.naive, 0);
    fprintf(o, "\"client_redis_commands\":%" PRIu64 ",\"client_round_trips\":%" PRIu64 ","
               "\"renew_rounds\":%" PRIu64 ",\"leases_lost\":%" PRIu64 ",",
            cs.redis_commands, cs.redis_round_trips, cs.renew_rounds, cs.leases_lost);
    fprintf(o, "\"wait_p50_us\":%" PRIu64 ",\"wait_p99_us\":%" PRIu64 ",\"wait_max_us\":%" PRIu64
               ",",
            p50, p99, wait_max);
    json_num(o, "wait_mean_us", acq ? (double)wait_sum / (double)acq : 0, acq > 0, 0);
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
    int ok = viol == 0 && regr == 0 && counter_ok && !worker_fail && errors_ok && timeouts_ok;
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
            fprintf(stderr, "  redis          %lld round trips (%.3f per acquisition), %lld commands "
                            "with those inside scripts, %.1f us of redis cpu per acquisition%s\n",
                    d_top, acq ? (double)d_top / (double)acq : 0.0, d_cmds,
                    acq ? d_cpu_us / (double)acq : 0.0,
                    O.cluster ? " (summed over the cluster's masters)" : "");
        else
            fprintf(stderr, "  redis          %s\n", have_redis ? "INFO unavailable" : "none (--mutex)");
        fprintf(stderr, "  client cpu     %.1f us per acquisition (the worker processes, user +"
                        " system, critical sections included); %.3f of acquisitions took the"
                        " name from another process\n",
                acq ? workers_cpu_us / (double)acq : 0.0,
                acq ? (double)crossings / (double)acq : 0.0);
        fprintf(stderr, "  wait           p50 ~%" PRIu64 " us, p99 ~%" PRIu64 " us, max %" PRIu64
                        " us (percentiles approximate)\n",
                p50, p99, wait_max);
        fprintf(stderr, "  fairness       Jain %.3f over %zu threads, %" PRIu64 " starved\n", jain,
                total, zero);
        fprintf(stderr, "  exclusion      %" PRIu64 " violations, counter %s (%" PRIu64 " vs %" PRIu64
                        "), %" PRIu64 " token regressions, %" PRIu64 " not-held-in-cs\n",
                viol, counter_ok ? "ok" : "MISMATCH", counter_sum, acq, regr, not_held);
        fprintf(stderr, "  verdict        %s%s%s%s\n", ok ? "PASS" : "FAIL",
                errors_ok ? "" : " (calls failed with errors)",
                timeouts_ok ? "" : " (more acquisitions timed out than succeeded, or none did)",
                viol || regr || !counter_ok || worker_fail ? " (exclusion or workers)" : "");
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
