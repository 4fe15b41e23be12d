/*
 * The renewal manager's state (renew.h is its interface), for its own files
 * only: renew.c (the registry: dlock_renew_add to dlock_renew_kick),
 * renew_round.c (a round), renew_jobs.c (dlock_renew_give_back,
 * dlock_renew_leave and the release of every lease at stop) and
 * renew_thread.c (the thread: dlock_renew_start, dlock_renew_stop, the
 * periodic check of the server). scripts/check-cycles lets no other file
 * include it: everyone else sees a dlock_renew only through renew.h.
 *
 * Shared state and its guards:
 *   r->mu guards the registry (items, count), the job list, r->stop and
 *   r->writing. It is never held during Redis I/O.
 *   Each item stands for one grant (entry, epoch, token) and holds one
 *   reference on its entry. e->lease.renew points at e's item; it is written only
 *   with both e->mu and r->mu held, so either lock suffices to read it. Items
 *   are freed only under r->mu, so an item seen in the registry under r->mu
 *   can be read then.
 *   r->lanes belongs to the manager thread (and to dlock_renew_stop once it
 *   has joined that thread): no lock.
 * Lock order: e->mu, then r->mu. The manager thread never takes e->mu while
 * holding r->mu, and never calls dlock_table_put with any lock held.
 */
#ifndef DLOCK_RENEW_INT_H
#define DLOCK_RENEW_INT_H

#include <pthread.h>
#include <stdint.h>

#include "global/lanes.h"
#include "global/renew.h"
#include "route/redlock.h"

enum {
    DLOCK_RENEW_RETRY_MS = 100, /* pause after a failed round, at most; a failed
                                   background job's first pause */
    DLOCK_RENEW_JOB_PAUSE_MAX_MS = 1000, /* a background job's pause doubles up
                                            to this: a job that failed while
                                            Redis did runs again within a second
                                            of its return */
};

struct dlock_renew_item {
    dlock_renew_item *prev, *next;
    dlock_entry *e;
    uint64_t epoch;
    int protocol;   /* the grant's (1 or 2): its renewals run that protocol's script */
    int shared;     /* the grant is a shared lease: it goes back with the shared release */
    char token[24]; /* decimal, as the scripts store it */
    dlock_redlock_grant *rl; /* Redlock mode: a copy of the grant (its nodes' tokens),
                                owned by the item; NULL otherwise (and for a
                                semaphore's permits) */
    dlock_redlock_slot *rls; /* Redlock mode, a semaphore's permits: a copy of the
                                slots held (e->lease.rls->s), rls_n of them, owned
                                by the item, kept in step by dlock_renew_rl_slots_sync */
    unsigned rls_n;
    uint32_t rls_limit; /* their limit: the name's claim (route/redlock.h) is renewed
                           with them, for it */
};

/* The protocol an item of a semaphore's permits (e->lease.sem) is filed
 * under: not a protocol (they are protocol 2's), a group of its own, whose
 * rounds run lua/p2/sem_renew.lua and whose give-backs lua/p2/sem_release.lua. */
enum { DLOCK_RENEW_SEM = 3 };

typedef struct dlock_renew_job {
    struct dlock_renew_job *next;
    int leave;              /* 0: release the grant of attempt `nonce`; 1: leave
                               the wait queue, as call number `nonce` */
    int64_t until_ns;       /* give up then: the lease has expired */
    int64_t next_try_ns;    /* when the next release try is due */
    int64_t backoff_ns;     /* pause before the try after that */
    int result;             /* of the last try (dlock_renew_jobs_run) */
    int lane, sent, redo;   /* dlock_renew_jobs_run's bookkeeping for the try: where, */
    int eval, asking;       /* sent or not, to run again (as EVAL, after ASKING) */
    int protocol;           /* whose script it runs: the attempt's (renew.h), or the
                               other's after a refusal as its data (job_result) */
    int switched;           /* a leave switched protocol already (once only) */
    int shared;             /* a give-back of a shared attempt (protocol 2's only) */
    uint32_t rl_skip;       /* Redlock mode: nodes it need not reach (bit i: node i) */
    char nonce[24];         /* decimal */
    char number[24];        /* a semaphore's give-back (protocol DLOCK_RENEW_SEM): the
                               number of the release call, from the client's sequence,
                               newer than the attempt: one try suffices */
    char *keys[DLOCK_KEYS]; /* copies of the entry's keys, in buf */
    char *name;             /* in buf */
    char buf[];
} dlock_renew_job;

struct dlock_renew {
    dlock_renew_cfg cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* CLOCK_MONOTONIC: stop, a first item, or a job */
    pthread_cond_t wrote;    /* r->writing went back to 0 */
    dlock_renew_item *items; /* list head, guarded by mu */
    size_t count;            /* guarded by mu */
    dlock_renew_job *jobs;    /* guarded by mu: background jobs (renew_jobs.c) */
    int job_new;          /* guarded by mu: a job arrived, due at once */
    int kick;                /* guarded by mu: renew now, not at the period's end */
    int64_t due;             /* guarded by mu: start a round by then (monotonic), at
                                the latest; DLOCK_NEVER: at the period's end */
    int writing;             /* guarded by mu: a renewal write is in progress */
    int stop;                /* guarded by mu */
    dlock_lanes lanes;       /* the manager thread's connections (lanes.h): only that
                                thread touches them, and dlock_renew_stop after it */
    int64_t period_ns, drift_ns;
    int failing;             /* the last round failed (manager thread only): log changes */
    int64_t check_ns;        /* the server check's period (dlock_renew_check_ns) */
    /* Redlock mode's server check (manager thread only): the node the next
     * check reads, and each node's verdict at its last check (1 unfit, with
     * why; a node not asked yet, or that did not answer, keeps its last) */
    unsigned rl_check_next;
    int rl_unfit[DLOCK_REDLOCK_NODES_MAX];
    char rl_why[DLOCK_REDLOCK_NODES_MAX][256];
};

#endif
