/*
 * nemesis.h: what the five files of the nemesis soak share.
 *
 *   nemesis.c        the runner: options, the fenced store, the worker
 *                    processes, the nemesis that injects faults, the report
 *   nemesis_topo.c   the Sentinel topology behind fault proxies
 *   nemesis_worker.c a worker process: one dlock client, threads doing a
 *                    fenced read-modify-write under the lock (or, with
 *                    --read-pct, a fenced read under a shared hold; with
 *                    --sem-pct, a hold of a semaphore's permit), the
 *                    history
 *   nemesis_check.c  the checker over the history, the store and the faults
 *   nemesis_redlock.c with --redlock N: N independent masters instead of
 *                    the Sentinel topology, and the faults on them
 *
 * The runner maps one shared region (a memfd, inherited by the workers it
 * starts with fork + exec): the parameters, per-worker counters and the
 * history, one record per acquisition. Several processes write the region
 * at once, each only its own proc slot and the records whose index it took
 * with an atomic fetch-and-add on `next`; a record is complete once its
 * `done` byte is 1 (a release store after every other field, so a worker
 * killed while writing one leaves it incomplete and the checker skips it).
 * The runner reads the history only after every worker has exited.
 */
#ifndef DLOCK_STRESS_NEMESIS_H
#define DLOCK_STRESS_NEMESIS_H

#include <stdint.h>
#include <sys/types.h>

#include "fixture.h"
#include "proxy.h"

#define NM_MAX_PROCS 16
#define NM_MAX_NAMES 64
#define NM_NERR 16            /* error counters indexed by -code */
#define NM_MASTER "nemesis"   /* the master's name known to the sentinels */
#define NM_PREFIX "nm:"       /* the clients' key_prefix */
#define NM_RL_MAX 5           /* the most Redlock nodes (--redlock 3 or 5) */

/* One acquisition. Times are CLOCK_MONOTONIC ns (one clock for every process
 * of the machine). */
typedef struct nm_rec {
    uint64_t token;     /* the fencing token dlock_acquire gave */
    int64_t t_req;      /* when dlock_acquire (or _shared) was called */
    int64_t t_acq;      /* when dlock_acquire returned DLOCK_OK */
    int64_t t_end;      /* the holder's last moment of certainty: taken just
                           before the last dlock_held() that said 1 (one
                           after the store's read, one after its write, or a
                           reader's wait); 0 if neither did (the holder knew it had lost the lease,
                           e.g. after a pause) */
    int64_t value;      /* the value the store's read gave (-1: none); a
                           refused read of a reader: the store's max */
    uint16_t name;      /* name index */
    uint16_t proc;      /* worker slot */
    uint8_t read_ok;    /* the store accepted the read */
    uint8_t write_ok;   /* ... and the write */
    uint8_t store_error; /* the store did not answer one of them */
    uint8_t shared;     /* a reader: dlock_acquire_shared, a read, no write */
    uint8_t done;       /* 1 once every field above is written (release) */
    uint8_t sem;        /* a semaphore permit (--sem-pct): dlock_sem_acquire
                           of name index names + k ("s<k>"), a hold, then
                           dlock_sem_release; t_end is when the release was
                           called, token and the store's fields unused */
    int8_t rel_rc;      /* a permit's: what dlock_sem_release returned */
    uint8_t pad[1];
} nm_rec;

/* A worker slot (a killed worker's replacement takes its slot). */
typedef struct nm_proc {
    int pid;
    int ready;                /* set once its client is open and threads run */
    uint64_t acquired;        /* dlock_acquire DLOCK_OK (either mode) */
    uint64_t shared_acquired; /* of those, dlock_acquire_shared */
    uint64_t errors[NM_NERR]; /* dlock_acquire errors by -code */
    uint64_t lost;            /* on_lost calls */
    uint64_t release_lost;    /* dlock_release(_shared) DLOCK_ELOST */
    uint64_t store_errors;    /* the store did not answer (never expected) */
    uint64_t sem_acquired;    /* dlock_sem_acquire DLOCK_OK (not in acquired) */
} nm_proc;

typedef struct nm_shared {
    /* Parameters, written by the runner before any worker starts. */
    int threads, names, lease_ms, min_replicas, command_ms, think_us;
    int protocol;             /* dlock_config.protocol: 0 the default, -1 mixed */
    int store_port;
    int read_pct;             /* the share of iterations taken shared (0-100) */
    int sem_pct;              /* the share of iterations that take a permit */
    int sem_limit;            /* every semaphore's limit */
    int sem_names;            /* semaphore names "s0".. (name index names + k) */
    int plant;                /* a planted bug, to show the checker catches it:
                                 NM_PLANT_* (0: none) */
    char sentinels[160];      /* "127.0.0.1:p,127.0.0.1:p,127.0.0.1:p" */
    int redlock;              /* N: Redlock mode on the N nodes of `nodes`
                                 (0: Sentinel mode on `sentinels`) */
    char nodes[NM_RL_MAX * 24]; /* "127.0.0.1:p,..." (the nodes' proxies) */
    volatile int stop;        /* set by the runner: workers finish and exit */
    uint64_t cap;             /* records that fit */
    uint64_t next;            /* next record index (atomic fetch-and-add) */
    nm_proc procs[NM_MAX_PROCS];
    nm_rec recs[];
} nm_shared;

/* Planted bugs (--plant): NOLOCK, one thread iteration in 40 skips
 * dlock_acquire and works under the token its thread last got for that name;
 * UNFENCED, the store's write takes any token (checking the token only with
 * the read, or only with the write, is the advice that lost updates);
 * READERS_UNLOCKED, every reader (--read-pct) skips dlock_acquire_shared
 * and reads under the token its thread last got for that name, recording
 * its hold as held; SEM_UNLIMITED, one permit iteration (--sem-pct) in 4
 * skips dlock_sem_acquire and records its hold as a permit released with
 * DLOCK_OK (one holder more than the limit allows whenever the others hold
 * every permit). */
enum { NM_PLANT_NONE, NM_PLANT_NOLOCK, NM_PLANT_UNFENCED, NM_PLANT_READERS_UNLOCKED,
       NM_PLANT_SEM_UNLIMITED };

/* Kinds of fault, and what the checker needs to know of each injection. */
enum nm_fault {
    NM_PAUSE,      /* a worker SIGSTOPped past its lease, then SIGCONT */
    NM_KILL,       /* a worker SIGKILLed and replaced */
    NM_RESTART,    /* the master SIGKILLed and restarted from its AOF */
    NM_WIPE,       /* the master SIGKILLed and restarted without its data */
    NM_FAILOVER,   /* SENTINEL FAILOVER */
    NM_DELAY,      /* the master's proxy delays traffic for a while */
    NM_RESET,      /* the master's proxy resets every connection */
    NM_HOLD,       /* the master's proxy holds back one script call */
    NM_STALL,      /* the master's proxy forwards nothing for a moment */
    NM_CLOCK_FWD,  /* the data servers' clocks step forward */
    NM_CLOCK_BACK, /* ... and back (at most one lease, added up until caught up) */
    NM_CLOCK_FAR,  /* ... back by minutes, then set right (a NM_CLOCK_FWD) */
    NM_NFAULTS
};

typedef struct nm_event {
    int kind;
    int64_t t_start, t_heal;  /* CLOCK_MONOTONIC ns; heal: the fault is over */
    long arg;                 /* ms of a pause, hold or step; a worker slot... */
    uint64_t server_us;       /* a fault that may revoke grants: the master's
                                 TIME (us) read just before it (0: unknown) */
    int done;                 /* the fault was injected (not skipped) */
} nm_event;

extern const char *const nm_fault_names[NM_NFAULTS];

/* nemesis_worker.c: a worker's main (never returns). */
void nm_worker_main(nm_shared *sh, int slot) __attribute__((noreturn));

/* The store's scripts (nemesis_worker.c): the fenced read and write, and a
 * reader's read (peek), which writes nothing. */
extern const char nm_store_read_lua[];
extern const char nm_store_peek_lua[];
extern const char nm_store_write_lua[];
extern const char nm_store_write_unfenced_lua[];

/* nemesis_check.c: checks the history against the store and the faults, and
 * prints the report's figures as JSON members (no braces) to `out`. Returns
 * the number of violations. `store_port`: read each name's value and count.
 * `excuse_failover`: failovers may lose grants (min_replicas 0).
 * `redlock`: N of Redlock mode (0: Sentinel mode), where a wipe revokes no
 * grant (a restarted node votes only once seeded, a lease + the drift
 * allowance after its run began). */
typedef struct nm_check_in {
    nm_shared *sh;
    const nm_event *ev;
    int nev;
    int store_port;
    int excuse_failover;
    int redlock;
    long lease_ms;
    long recovery_bound_ms;
    const int64_t *quiet;     /* when each burst of faults ended (its last
                                 fault healed) */
    int nquiet;
    unsigned asked;           /* the fault kinds asked for (bit per kind) */
} nm_check_in;
int nm_check(const nm_check_in *in, char *out, size_t outsz);

int64_t nm_now_ns(void);

/* nemesis_topo.c: the Sentinel topology (runner only). srv: the data
 * servers, each behind px (its port pxport); sent: the sentinels. */
#define NSRV 3
extern fx_redis srv[NSRV], sent[3];
extern fx_proxy *px[NSRV];
extern int pxport[NSRV];
extern const char *const *nm_topo_env; /* the data servers' extra environment
                                          (the fake clock's), set before start */
/* Starts the servers, their proxies and the sentinels and waits (30 s) until
 * the topology has settled with server 0 master. 0, or -1 with a message on
 * stderr (nm_topo_stop stops what started). */
int nm_topo_start(void);
void nm_topo_stop(void);
/* The server that the sentinels name master: at least two answer and all
 * that answer agree; -1 otherwise. */
int nm_master_index(void);
/* Server i is running and says ROLE master. */
int nm_is_master(int i);
/* Waits at most ms until the sentinels agree on a master that says so and
 * has both replicas connected: its index, or -1. */
int nm_wait_settled(long ms);
/* Server m's TIME in us (directly, not through its proxy), or 0. */
uint64_t nm_server_time_us(int m);
/* The TIME in us of the server on loopback port `port`, or 0. */
uint64_t nm_time_us_at(int port);

/* nemesis.c: the runner's helpers the Redlock faults share. nm_begin
 * records a fault's start (NULL: the list is full); nm_unbegin drops the
 * one begun last (not injected after all); nm_heal marks it injected and
 * over. nm_issued_bound_at: the highest token the server on `port` may have
 * handed out by now, its clock being debt_ms behind its latest reading (0
 * if it does not answer). */
nm_event *nm_begin(int kind, long arg);
void nm_unbegin(void);
void nm_heal(nm_event *e);
void nm_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void nm_harness_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
long nm_between(long lo, long hi);
uint64_t nm_issued_bound_at(int port, long debt_ms);

/* nemesis_redlock.c (runner only): nm_rl_n, N (0: Sentinel mode). Starts
 * N nodes, each behind a proxy and, with a shim, under its own fake clock;
 * writes the proxies' list to nodes; seeds the deployment fresh: 0, or -1
 * with a message. nm_rl_inject injects one fault of `kind` on a node
 * picked at random (1 if it did). nm_rl_settle waits at most ms until
 * every node counts (answers, its seed key holds its run id): 0 or -1.
 * nm_rl_clocks_right sets each node's clock back to real time where the
 * step allows (recorded as a fault). nm_rl_kill_all: SIGKILL to every node
 * (async-signal-safe). */
extern int nm_rl_n;
int nm_rl_start(int n, const char *shim, const char *faketime, long lease_ms, char *nodes,
                size_t sz);
void nm_rl_stop(void);
int nm_rl_inject(int kind);
int nm_rl_settle(long ms);
void nm_rl_clocks_right(void);
void nm_rl_kill_all(void);

#endif
