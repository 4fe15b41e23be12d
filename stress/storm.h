/*
 * storm.h: what the files of storm share (what storm does and checks: the
 * comment at the top of storm.c).
 *
 *   storm.c         the parent: the private servers and the delaying proxy,
 *                   INFO, forking and watching the workers, progress, the
 *                   report of a stuck run, the JSON line and the summary
 *   storm_opts.c    the options: O, --help, parse_opts
 *   storm_worker.c  the shared region, the time, histogram and error-index
 *                   helpers, the lock modes (dlock, --mutex, --naive), a
 *                   worker process and its threads
 *
 * State shared across processes and threads, and its rules:
 *  - O, names, key_prefix, client_port, unix_path, sentinel_set,
 *    cluster_set, redlock_addrs and parent_pid are written by the parent before it forks
 *    the workers and never after: each worker reads its own copy.
 *  - The shared region (H, PR, NS, TR; MX in storm_worker.c) is one
 *    anonymous MAP_SHARED mapping that shm_create makes before the fork, at
 *    the same address in every process. H: stop is set (atomic store) by a
 *    signal handler or the parent; go, start_ns and deadline_ns are written
 *    by the parent only, go last (release store, then a futex wake);
 *    last_end_ns and log_lines are updated by the threads atomically.
 *    PR[p] is written by worker p only (setup_done last, release store;
 *    closing is read live; the parent reads stats and msg once p has
 *    exited). TR[i] is written by its thread only: the fields the parent
 *    reads live with atomic stores, the others read once the worker has
 *    exited. NS[i]: occupancy is an atomic count over every process's
 *    threads; counter, last_token and last_proc are ordered by the lock
 *    under test (which is what the checks check).
 */
#ifndef DLOCK_STRESS_STORM_H
#define DLOCK_STRESS_STORM_H

#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "dlock.h"
#include "fixture.h"

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

typedef struct opts {
    int procs, threads, locks;
    double seconds;
    long cs_us, think_us;
    int cs_sleep;
    long pass_limit;          /* -1: library default */
    long join_ms;             /* --join-ms; -1: library default */
    int protocol;             /* dlock_config.protocol: 0 the library's default, 1 or
                                 2, -1 mixed (worker p writes 1 + p % 2) */
    long lease_ms;
    long wait_ms;
    long pool_size;           /* -1: library default (1 with --client-per-thread) */
    int client_per_thread;
    int mutex;                /* process-shared pthread mutexes instead of dlock */
    int naive;                /* the simplest Redis lock instead of dlock */
    int read_pct;             /* --read-pct: this share of acquisitions is shared (read)
                                 mode; with --mutex a process-shared rwlock per name */
    long sem_limit;           /* --sem: every name is a counting semaphore of this many
                                 permits (0: none); with --mutex a POSIX semaphore, with
                                 --naive a counter in Redis */
    const char *plant;        /* --plant: a planted bug the checks must catch (NULL:
                                 none): "readers-unlocked", "sem-over" */
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
    int redlock;              /* --redlock N: N private masters (3 or 5); clients in
                                 Redlock mode (0: not) */
    int lease_set;            /* --lease-ms given */
    int node_fault;           /* --node-fault: NF_* (Redlock mode; storm_fault.c) */
    double fault_at, fault_for; /* --fault-at, --fault-for (s; fault_for < 0: default) */
    long stack_kb;
    int quiet;
    const char *metrics_path; /* --metrics: worker 0's client's Prometheus text */
} opts;

extern opts O; /* storm_opts.c: the defaults, then parse_opts */

/* ------------------------------------------------------------------ */
/* Shared memory                                                        */

#define NB 312       /* histogram buckets: exact 0..7 us, then 8 per octave up to 2^40 us */
#define NERR 16      /* per error code, index -code (0: code outside the list) */
#define NAME_LEN 24
#define LOG_MAX 20   /* detailed lines about failures, over all processes */

typedef struct name_state {
    uint64_t counter;    /* read at CS start, written +1 at CS end (non-atomic RMW) by
                            an exclusive holder; a reader reads it at both ends (it must
                            not change); a semaphore's holders add 1 atomically */
    uint64_t last_token; /* highest fencing token seen for this name */
    uint64_t last_x_token; /* --read-pct: highest token of an exclusive holder */
    int32_t occupancy;   /* threads inside the CS right now (exclusive holders, or a
                            semaphore's holders) */
    int32_t readers;     /* --read-pct: threads inside the CS in shared mode */
    int32_t max_occupancy; /* --sem: the most holders seen inside at once */
    int32_t last_proc;   /* worker process of the last holder + 1 (0: none yet);
                            read and written by the holder only */
    uint64_t inside;     /* holders inside the CS (bits 48..63, of every kind) and
                            when the last one left (bits 0..47, us since the run's
                            start): one word, changed by compare-and-swap only */
    uint64_t empty_us;   /* time without any holder inside, since the run's start */
} __attribute__((aligned(64))) name_state;

/* --mutex only: the lock of a name and its token counter. */
typedef struct mutex_state {
    pthread_mutex_t m;   /* PTHREAD_PROCESS_SHARED */
    pthread_rwlock_t rw; /* --read-pct: PTHREAD_PROCESS_SHARED, writers preferred */
    sem_t sem;           /* --sem: process-shared, --sem permits */
    uint64_t token;      /* last token handed out: read and written +1 under m; under
                            rw, fetched and added 1 atomically (readers share rw) */
} __attribute__((aligned(64))) mutex_state;

typedef struct thread_res {
    /* read live by the parent: updated with atomic stores */
    uint64_t acq, timeouts, errors_total, violations, regressions;
    int phase;            /* PH_*: where the thread is, for diagnosing a hang */
    int name_idx;         /* the name it is acquiring, holding or releasing */
    /* read only after the run */
    uint64_t busy, not_held;
    uint64_t reads;       /* --read-pct: acquisitions in shared mode */
    uint64_t crossings;   /* acquisitions whose previous holder was another process */
    uint64_t errors[NERR];
    uint64_t rel_errors[NERR];
    uint64_t wait_sum_us, wait_max_us;
    uint64_t hist[NB];    /* every acquisition's wait */
    /* --read-pct: the same per mode. The shared (read) acquisitions' waits
     * apart; the exclusive ones' are the rest (hist - r_hist), but for their
     * maximum. Timeouts and other failures of shared acquires too. */
    uint64_t r_timeouts, r_failed; /* shared acquires that timed out, failed otherwise */
    uint64_t r_wait_sum_us, r_wait_max_us, x_wait_max_us;
    uint64_t r_hist[NB];
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
    /* storm_fault.c: the latest grant, the longest gap between two, when it
     * ended, the longest that ended after the fault, and when it struck */
    int64_t last_grant_ns, max_gap_ns, max_gap_end_ns, max_gap_after_ns, fault_ns;
} __attribute__((aligned(64))) shm_hdr;

/* The shared region (storm_worker.c: shm_create). */
extern shm_hdr *H;
extern proc_res *PR;
extern name_state *NS;
extern thread_res *TR;
extern void *shm_base;
extern size_t shm_size;

/* Set by the parent before the fork (storm.c). */
extern char *names;       /* locks x NAME_LEN, private copy per process */
extern char key_prefix[64];
extern int client_port;   /* where the workers' clients connect: Redis, or the proxy */
extern char unix_path[300]; /* --unix: the private server's socket */
extern fx_sentinel_set sentinel_set; /* --sentinel: the private topology */
#define SENTINEL_MASTER "storm"
extern fx_cluster cluster_set; /* --cluster: the private Redis Cluster */
extern char redlock_addrs[]; /* --redlock: "127.0.0.1:p,..." of the nodes */
#define REDLOCK_MAX 5
/* --redlock: the client's connect and command timeouts (ms), well below
 * lease_ms / 3 (docs/guide.md, "Redlock") */
#define REDLOCK_TIMEOUT_MS(lease) ((lease) >= 1000 ? 200 : (lease) / 5)
extern pid_t parent_pid;

/* Where a thread is (thread_res.phase; their names: storm.c). */
enum { PH_START, PH_THINK, PH_ACQUIRE, PH_CS, PH_RELEASE, PH_DONE, PH_N };

/* storm_fault.c (the parent's calls: before the fork, in the monitor loop
 * and in the report) */
enum { NF_NONE, NF_KILL, NF_STOP, NF_RESTART, NF_WIPE };
void note_grant(int64_t t); /* a thread: an acquire returned a grant at t */
const fx_redis_opts *node_fault_opts(int i); /* Redlock node i's options (NULL: none) */
int node_fault_spoils_info(void); /* 1: a node's INFO after the run is not comparable */
void node_fault_tick(fx_redis *srv, int64_t start, int64_t now, size_t total);
void node_fault_end(fx_redis *srv); /* a stopped node resumed */
int node_fault_ok(uint64_t acq);    /* the fault struck and acquisitions went on */
void node_fault_json(FILE *o, uint64_t acq);
void node_fault_summary(FILE *e, uint64_t acq);

/* storm_opts.c */
void parse_opts(int argc, char **argv);

/* storm_worker.c */
void shm_create(void);
void shm_destroy_mutexes(void);
int64_t now_ns(void);
void sleep_ns(int64_t ns);
uint64_t hist_percentile(const uint64_t *hist, uint64_t n, double p, uint64_t max);
const char *err_index_name(int i);
void worker_main(int p) __attribute__((noreturn));

#endif
