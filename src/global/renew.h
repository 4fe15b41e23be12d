/*
 * The renewal manager: one thread per client that renews every held lease,
 * one batched script call per chunk of keys, all chunks pipelined, so one
 * round trip per period whatever the number of leases. It marks a lease lost
 * when Redis says it is gone, or when its validity deadline passes without a
 * successful renewal, and then calls the lost callback outside every lock.
 *
 * Lock order: entry->mu, then the manager's mutex (never the reverse).
 */
#ifndef DLOCK_RENEW_H
#define DLOCK_RENEW_H

#include <pthread.h>

#include "common/trace.h"
#include "conn/conn.h"
#include "entry/table.h"
#include "route/redlock.h"

typedef struct dlock_renew dlock_renew;

/* Called for each lease found lost, on the manager thread, with no library
 * lock held. name stays valid during the call. */
typedef void (*dlock_renew_lost_fn)(void *arg, const char *name, uint64_t token);

typedef struct dlock_renew_cfg {
    const dlock_conn_cfg *conn; /* must outlive the manager */
    dlock_counters *ctr;
    dlock_table *table;
    const dlock_script_args *args; /* the client's script arguments; must outlive the manager */
    uint32_t lease_ms;
    uint32_t keep_ms;       /* how long Redis keeps the client's record of a name */
    uint32_t waiter_ttl_ms;
    uint32_t min_replicas;  /* > 0: a round counts only if WAIT says this many
                               replicas have its writes */
    dlock_renew_lost_fn lost;
    void *lost_arg;
    /* Called (on the manager thread, no lock held) when renewals start
     * failing and when they work again: level DLOCK_LOG_*, one line. The
     * argument is lost_arg. NULL: none. */
    void (*log)(void *arg, int level, const char *message);
    /* Called (on the manager thread, no lock held) after each periodic
     * check of the server (dlock_conn_check_info on INFO, every
     * dlock_renew_check_ns): rc DLOCK_OK, or DLOCK_ESERVER with the reason
     * in message. Not called when the server could not be asked. The
     * argument is lost_arg. NULL: no check. */
    void (*server)(void *arg, int rc, const char *message);
    dlock_trace *trace;     /* the client's trace (trace.h), or NULL */
    uint64_t *attempts;     /* the client's call sequence (atomic: client.h): numbers
                               for the semaphore's give-backs */
    dlock_redlock *redlock; /* Redlock mode: every lease is renewed, given back and
                               released on this node set (renew_redlock.c), and
                               its restarted nodes are seeded; NULL otherwise */
} dlock_renew_cfg;

/* How often the manager checks the server's settings: every renewal period
 * (lease_ms / 3), at least 1 s and at most 30 s apart, also while no lease
 * is held. */
int64_t dlock_renew_check_ns(uint32_t lease_ms);

/* Starts the manager thread. DLOCK_OK, DLOCK_ENOMEM, or DLOCK_EINVAL if the
 * thread cannot be created. */
int dlock_renew_start(const dlock_renew_cfg *cfg, dlock_renew **out);

/* Stops and joins the thread, gives back to Redis every lease still
 * registered (one pipelined round trip, best effort within the timeouts),
 * drops the registry's references and frees the manager. */
void dlock_renew_stop(dlock_renew *r);

/* Registers e's current grant (e->lease.token, e->lease.epoch) for renewal and takes a
 * reference on e for the registry. Called with e->mu held, e->lease.state HELD and
 * e->lease.renew NULL. Returns DLOCK_OK or DLOCK_ENOMEM. */
int dlock_renew_add(dlock_renew *r, dlock_entry *e);

/* Unregisters e's grant: after this returns no renewal of it is sent.
 * Called with e->mu held. Returns 1 if it was registered: the caller must
 * then drop the registry's reference with dlock_table_put after unlocking
 * e->mu; 0 if it was not. */
int dlock_renew_remove(dlock_renew *r, dlock_entry *e);

/* Redlock mode, a semaphore's permits: the registration's copy of the
 * slots e holds follows e->lease.rls (local/rlsem.h) after a change; a
 * slot no longer in it is not renewed by a round that checks it after
 * this returns (a releaser then waits out dlock_renew_quiesce). Called
 * with e->mu held (it takes the manager's mutex). DLOCK_OK, or
 * DLOCK_ENOMEM (the copy keeps the slots it had). */
int dlock_renew_rl_slots_sync(dlock_renew *r, dlock_entry *e);

/* Waits until no renewal write is in progress. A releaser calls it after
 * dlock_renew_remove and before sending its release, without e->mu: then no
 * renewal of the released grant can reach Redis after the release. */
void dlock_renew_quiesce(dlock_renew *r);

/* Makes the manager run a renewal round now. Used when the subscriber
 * reconnects: Redis may have restarted empty, and the round finds the leases
 * it lost at once instead of up to a period later. No lock needed. */
void dlock_renew_kick(dlock_renew *r);

/* Makes the next round start by when_ns (monotonic) at the latest: for a
 * lease registered with a validity shorter than a period (a direct grant,
 * valid for the waiter ttl until renewed). No lock needed. */
void dlock_renew_by(dlock_renew *r, int64_t when_ns);

/* Hands over an acquire attempt of e whose outcome is unknown, last sent in
 * protocol `protocol`, shared or not: the manager thread releases the grant
 * of attempt `nonce` with that protocol's (or the shared) release script,
 * if Redis made one, as soon
 * as it can, retrying while Redis may still see that attempt (keep_ms) and
 * until Redis reports it released or superseded. Returns at once; no lock
 * needed. */
void dlock_renew_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce,
                           int protocol, int shared);

/* Hands over a semaphore's acquire attempt `nonce` of e whose outcome is
 * unknown (local/sem.h): the manager thread gives back its grant, if Redis
 * made one, with lua/p2/sem_release.lua by attempt, under a call number
 * newer than the attempt (so that a late copy of the attempt is refused
 * after it). Returns at once; no lock needed. */
void dlock_renew_sem_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce);

/* Hands over the leave of e's wait queue (in protocol `protocol`, that of
 * the client's last attempt of e), numbered `number` from the client's
 * attempt sequence, when the caller cannot make it (Redis failing):
 * the manager thread runs it as soon as it can, retrying for two waiter
 * ttls (after that the queue entry is dead). Redis ignores it if a newer
 * attempt of the client for e was seen meanwhile. No lock needed. */
void dlock_renew_leave(dlock_renew *r, const dlock_entry *e, const char *number,
                       int protocol);

/* dlock_renew_give_back in Redlock mode (a shared attempt or an exclusive
 * one) for the nodes outside `skip` only (bit i: node i, which the attempt
 * never reached; all of them: the job is done at its first run). */
void dlock_renew_rl_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce,
                              int shared, uint32_t skip);

/* dlock_renew_leave in Redlock mode for the nodes outside `skip` only
 * (bit i: node i is not asked: a wait granted there is out of its
 * queue). */
void dlock_renew_rl_leave(dlock_renew *r, const dlock_entry *e, const char *number,
                          uint32_t skip);

/* Redlock mode, a semaphore's slot k of e (route/redlock.h): as
 * dlock_renew_rl_give_back (leave 0: attempt `number` given back) or
 * dlock_renew_rl_leave (leave 1: the queue left as call `number`), on
 * that slot's keys. */
void dlock_renew_rl_slot_job(dlock_renew *r, const dlock_entry *e, unsigned k, int leave,
                             const char *number, uint32_t skip);

/* The drift margin subtracted from a lease's validity, in ns. */
int64_t dlock_renew_drift_ns(uint32_t lease_ms);

/* Marks e's grant lost: state LOST, unregistered, counters updated. Called
 * with e->mu held and e->lease.state HELD. Returns as dlock_renew_remove. Whether
 * the lost callback is due is e->lease.lost_notified's business (the caller's). */
int dlock_renew_mark_lost(dlock_renew *r, dlock_entry *e);

#endif
