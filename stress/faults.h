/*
 * faults.h: what the scenario files of faults (faults_holders.c,
 * faults_restart.c, faults_redis.c, faults_order.c, faults_redlock.c)
 * share with the runner in faults.c: the parameters every scenario uses,
 * the scenario's server R (or Redlock nodes), the record a
 * child shares with the runner (proc_sh), the helpers that start, drive,
 * wait for and reap children, the common client configuration, the result
 * text of a scenario, and the scenario functions the runner's table lists.
 * See the comment at the top of faults.c for how a scenario runs.
 */
#ifndef DLOCK_STRESS_FAULTS_H
#define DLOCK_STRESS_FAULTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dlock.h"
#include "fixture.h"

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
#define REDLOCK_NODES 3        /* --redlock: independent masters */

#define STR_(x) #x
#define XSTR(x) STR_(x)
#define MS(ns) ((long long)((ns) / 1000000LL))
#define NS_PER_MS 1000000LL

/* ------------------------------------------------------------------ */
/* The runner's state that scenarios use (faults.c)                     */

extern fx_redis R;                      /* this scenario's redis-server (TOPO_SINGLE) */
/* 1 with --redlock (the clients in Redlock mode), else 0. */
int in_redlock(void);
/* --redlock: node i (0 .. REDLOCK_NODES - 1) of the scenario, or NULL. */
fx_redis *redlock_node(int i);
extern const char *volatile phase;      /* what the scenario is doing, for the watchdog */

/* Result text of a scenario: res is the parenthesis of the PASS/FAIL line. */
#define RES_MAX 2048
extern char res[RES_MAX];

/* Sets res and returns 0 (a scenario's failure). */
int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ------------------------------------------------------------------ */
/* Time                                                                 */

int64_t now_ns(void);
void sleep_ms(long ms);
void sleep_until(int64_t t);
void sleep_us(long us);

/* ------------------------------------------------------------------ */
/* Children, shared memory and the server (runner side)                 */

/* Forks a child that runs fn(arg) and never returns to the runner's code. */
pid_t start_child(void (*fn)(void *), void *arg);
/* Waits at most ms for child pid to exit: 1 (status in *st) or 0. */
int reap(pid_t pid, long ms, int *st);
/* SIGKILLs and reaps every child still there (end of a scenario). */
void kill_kids(void);
/* "exit 0", "killed by SIGKILL" ... */
const char *status_text(int st, char *buf, size_t n);
void *shm_alloc(size_t n);
/* Waits at most ms until ZCARD of key is n: 1, or 0 (last count in *last). */
int wait_zcard(const char *key, long long n, long ms, long long *last);

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

int ld(const int *p);
void st_int(int *p, int v);
/* Waits at most ms until ps->step >= step: 1; 0 on timeout; -1 if the child
 * reported a failure. */
int wait_step(proc_sh *ps, int step, long ms);
/* Child side: waits at most ms until ps->go >= v (1), else 0. */
int wait_go(proc_sh *ps, int v, long ms);
void child_fail(proc_sh *ps, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* Acquires `name` in a child: records the result in ps->rc[0], the fence
 * in ps->fence[0] and the time the call returned in ps->t[1]; fails the
 * child, naming `who` and the time waited, unless it got the lock. */
uint64_t child_acquire(proc_sh *ps, dlock_client *c, const char *name, int64_t wait_ms,
                       const char *who);
/* Closes the client, checks for leaks in sanitizer builds, exits. */
void child_exit(dlock_client *c) __attribute__((noreturn));
/* Every client's configuration: the scenario's server (R, its Unix socket,
 * the Sentinel topology or the cluster), KEY_PREFIX, LEASE_MS,
 * WAITER_TTL_MS. */
void cfg_base(dlock_config *cfg);
dlock_client *open_client(proc_sh *ps, const dlock_config *cfg);
/* Text of a child's failure for a FAIL line: what it reported, or where it
 * stopped and, if it is gone, how it ended (a crash, a sanitizer report). */
const char *child_why(proc_sh *ps, pid_t pid, const char *who, char *buf, size_t n);
/* An error code's name without the DLOCK_ prefix. */
const char *short_name(int code);

/* ------------------------------------------------------------------ */
/* The scenarios: 1 (pass, res says what was measured) or 0 (res says   */
/* why not)                                                             */

int sc_holder_killed(void);      /* faults_holders.c */
int sc_holder_frozen(void);
int sc_waiter_killed(void);
int sc_redis_restarted(void);    /* faults_restart.c */
int sc_redis_frozen(void);
int sc_started_redis_down(void);
int sc_signal_storm(void);
int sc_late_acquire(void);       /* faults_order.c */
int sc_nodes_frozen(void);       /* faults_redlock.c */

#endif
