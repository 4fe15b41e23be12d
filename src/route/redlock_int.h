/*
 * Redlock's node set, private to its files (redlock.c: the set, the node
 * records and the pipelined steps; redlock_seed.c: refresh, the seeding;
 * redlock_grant.c: acquire and release; redlock_renew.c: renewals and
 * re-grants). Shared state and lock order: redlock.h.
 */
#ifndef DLOCK_REDLOCK_INT_H
#define DLOCK_REDLOCK_INT_H

#include <pthread.h>
#include <stdint.h>

#include "route/redlock.h"

#define RUN_ID_MAX 48

/* A connection and the run id its server reported when it opened. */
typedef struct rl_conn_run {
    const redisContext *c;
    char run[RUN_ID_MAX];
} rl_conn_run;

typedef struct rl_node {
    dlock_conn_cfg cfg; /* base's, with this node's address; its saw_info
                           records each new connection's run id */
    dlock_pool *pool;
    char addr[280];     /* "host:port", for messages */
    struct dlock_redlock *set;
    unsigned idx;       /* set->node[idx] is this one */
    /* under rl->mu */
    rl_conn_run *conns; /* the run id of each connection opened to this node
                           (its setup's INFO), nconns entries, a two-way
                           cache by the connection's address (one not found
                           in it reads INFO again: dlock_rl_append_one); a
                           closed connection's entry is left, and replaced
                           when its address opens anew (always through
                           setup, which records it first) */
    unsigned nconns, next; /* next: which of two taken entries goes next */
    char run[RUN_ID_MAX]; /* the run id last seen, "" none yet */
    int64_t seen_boot;  /* when this client first saw it (CLOCK_BOOTTIME) */
    int seeded;         /* its seed key held it at the last reading */
    int seeding;        /* a seeding of this node is under way */
    int64_t down_until; /* monotonic: an acquire or release skips the node until
                           then (its last exchange did not answer: a connection
                           failed or timed out), 0 none */
    int64_t clock_off_us; /* its clock (TIME, us) less this client's CLOCK_BOOTTIME,
                             as its last grant's reply told (the floor: redlock.h),
                             valid when clock_known */
    int clock_known;
} rl_node;

struct dlock_redlock {
    dlock_counters *ctr;
    unsigned n, m;
    unsigned pool_size;
    uint32_t lease_ms;
    int64_t lease_ns, drift_ns;
    char lease_str[16];
    char *prefix;
    char *seed_key;   /* "<prefix>redlock:seed" */
    char *hw_match;   /* SCAN pattern of every slot's mark: "<prefix, escaped>hw:{*}" */
    char *any_match;  /* SCAN pattern of every key of the prefix: "<prefix, escaped>*" */
    char *hw_any;     /* "<prefix>hw:{0}": mark.lua's KEYS[1] when only the seed is written */
    pthread_mutex_t mu;
    int64_t floor_margin_us; /* under mu: the floor's margin above the nodes' clocks
                                (DLOCK_REDLOCK_FLOOR_MIN_US .. a lease / 8) */
    rl_node node[DLOCK_REDLOCK_NODES_MAX];
};

/* One node's side of a step. */
typedef struct peer {
    redisContext *c; /* checked out for the step, NULL if none */
    int failed;      /* no connection, or it failed, or an unusable reply: no more calls */
    int broken;      /* its connection failed (closed, timed out, out of step): not pooled */
    int used;        /* a reply was read on c since it was checked out */
    int sent;        /* a request of this step was flushed to it (it may have run) */
    int unreach;     /* no connection could be opened to it in time (dlock_rl_peers_open;
                        not a wait for a busy pool cut by the caller's deadline) */
    int judge;       /* its failure in this step marks the node down (an acquire's or
                        a release's step with a whole command timeout to answer:
                        dlock_rl_peers_open_up, dlock_rl_judge) */
    int info_sent;   /* INFO server was sent before the script on c (its run id
                        was not known: dlock_rl_append_one) */
    char run[RUN_ID_MAX]; /* the run id this connection reported, "" unknown */
    char seed[RUN_ID_MAX]; /* the seed key as last read on it */
    redisReply *rep; /* the last script's reply (owned), NULL none */
    char why[200];   /* failed: why */
} peer;

/* Whether a reply of node i through a connection to run id run, with seed
 * key seed as read at or before the script's instant, counts: its seed
 * key holds its run id (a seeding comes a lease + the drift allowance
 * after its run began, so the server was up a lease at least when the
 * script ran). Records whether the seed key held the run id. `at`, the
 * request's send (CLOCK_BOOTTIME), is not needed by the rule: kept so
 * that every caller names the instant it judges. */
int dlock_rl_counts_now(dlock_redlock *rl, unsigned i, const char *run, const char *seed,
                        int64_t at);

/* Peer p takes no more calls this step (its connection stays usable: an
 * unusable reply was read whole). */
void dlock_rl_peer_fail(peer *p, const char *fmt, const char *what);

/* Peer p's connection failed (closed, timed out, a request half written):
 * no more calls this step, and it is closed, not pooled. */
void dlock_rl_peer_broke(peer *p, const char *fmt, const char *what);

/* The first node before i that reported i's run id (the same server
 * listed under two names), or -1: its replies count once. */
int dlock_rl_same_run(const dlock_redlock *rl, const peer *p, unsigned i);

/* Checks out a connection to every node not failed yet, waiting for one
 * at most until the caller's deadline (a node's pool is this set's own,
 * rarely all busy). */
void dlock_rl_peers_open(dlock_redlock *rl, peer *p, int64_t deadline);

/* dlock_rl_peers_open for a caller's acquire or release: a node whose
 * last exchange did not answer (down_until not passed) is skipped, failed
 * as "down", so that a stopped node costs the callers one command timeout
 * per DLOCK_REDLOCK_DOWN_MS (at most a third of the lease), not one per
 * call. The renewals, the background jobs and the checks ask every node,
 * and an answer ends the skipping at once. */
void dlock_rl_peers_open_up(dlock_redlock *rl, peer *p, int64_t deadline);

/* A step of the caller's peers p ends at deadline (monotonic): unless
 * that leaves every node nearly a whole command timeout to answer, their
 * failures in it mark no node down (a deadline cut short, by the
 * caller's or a validity, says nothing of the node). */
void dlock_rl_judge(dlock_redlock *rl, peer *p, int64_t deadline);

/* How long a node that did not answer is skipped by acquires and
 * releases, at most (dlock_rl_peers_open_up). */
#define DLOCK_REDLOCK_DOWN_MS 1000

/* Gives every connection back (a broken one is closed) and frees replies;
 * records each node's health for dlock_rl_peers_open_up: one that
 * answered is up; one whose connection could not be opened, or failed
 * or timed out, in a step that judges it (peer.judge), down. */
void dlock_rl_peers_close(dlock_redlock *rl, peer *p);

/* Appends peer p's (node i's) requests: INFO server if info and the run
 * id of p's connection is not known (the one its setup read: p->run set
 * from it, p->info_sent 0), or is not the node's record's (the record,
 * last set by another connection, may lag or lead: the INFO read sets it
 * to this connection's), GET of the seed key if get_seed, then the
 * script (EVALSHA unless eval). A connection reaches one server for its
 * life (a restart closes it: a new connection, whose setup reads the new
 * run id), so the run id read when it opened holds at the script. The seed key is read
 * BEFORE the script, in the same pipeline on the same connection: a node's
 * seed key changes within one run of its server only from another run's id
 * (or none) to this run's id (mark.lua writes the run id its caller read
 * from this very server, and only a restart, which changes the run id,
 * loses data), so a reading that holds the run id before the script proves
 * it held it when the script ran. A reading after the script could see a
 * seeding made in between, and count a vote made on a node not seeded
 * yet. (A node wiped without a restart, FLUSHALL or an eviction, is
 * outside this assumption: docs/design.md, "Redlock".) 0 or -1. */
int dlock_rl_append_one(dlock_redlock *rl, unsigned i, peer *p, int info, dlock_script_id id,
                        int eval, int nkeys, int nargs, const char **argv, int get_seed);

/* Peer i's pooled connection was closed under it while idle (a restart, an
 * idle timeout: it failed at once with EOF or a reset, before any reply):
 * its requests again on another connection, as often as the pool holds
 * connections + 1 (each may be as stale). Safe although the first send may
 * have run: every script here is idempotent for its caller (an acquire
 * with the same attempt is granted again in place, a release matches its
 * grant, mark.lua raises to a value). */
void dlock_rl_retry_fresh(dlock_redlock *rl, unsigned i, peer *p, int info, dlock_script_id id,
                          int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline);

/* Runs one script on every peer of `only` (NULL: every peer) not failed,
 * peer i with argv[i]: appended, flushed, then read by deadline. A
 * NOSCRIPT answer (a restarted server) is sent again with EVAL (the seed
 * key's GET before it again) as soon as it is read, before the next peer's
 * replies are waited for, and its reply read after the others'. A pooled
 * connection closed while idle is replaced (dlock_rl_retry_fresh). Each peer's
 * reply in rep (an error reply included), or the peer failed. */
void dlock_rl_peers_call_each(dlock_redlock *rl, peer *p, const int *only, int info,
                              dlock_script_id id, int nkeys, int nargs, const char **const *argv,
                            int get_seed, int64_t deadline);

/* dlock_rl_peers_call_each with the same argv for every peer. */
void dlock_rl_peers_call(dlock_redlock *rl, peer *p, const int *only, int info, dlock_script_id id,
                         int nkeys, int nargs, const char **argv, int get_seed, int64_t deadline);

/* The deadline of one exchange: a command timeout from now, at most the
 * caller's. */
int64_t dlock_rl_step_deadline(dlock_redlock *rl, int64_t caller);

/* Whether reply r of an acquire is a refusal by a node held by a client
 * whose wait began before q's: its holder's name "<name>@<ticket>.<id>"
 * with a ticket below q->ticket, or the same ticket and an id that sorts
 * first (wait-die, redlock.h "wait"); for a shared q, also any refusal
 * that names no holder; 1 or 0. */
int dlock_rl_refused_by_older(const redisReply *r, const dlock_redlock_req *q);

/* Why node i (of peers ps) does not count, for a message. */
void dlock_rl_why_not(dlock_redlock *rl, unsigned i, const peer *ps, char *out, size_t size);

#endif
