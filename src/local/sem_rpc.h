/*
 * The Redis calls of a counting semaphore (lua/p2/sem_acquire.lua,
 * sem_release.lua, sem_leave.lua), as the caller threads make them. Each is
 * made by the one thread of this client in a call for the name (local/sem.h,
 * M2: e->m.calling) without e->mu held, so that Redis sees a client's calls
 * on a name in the order of their numbers. No state of their own.
 */
#ifndef DLOCK_SEM_RPC_H
#define DLOCK_SEM_RPC_H

#include <stdint.h>

#include "local/client.h"

/* One try of sem_acquire.lua for one permit: what the poller asks, and
 * what Redis answered. */
typedef struct dlock_sem_try {
    const char *nonce;      /* the attempt's number, decimal */
    uint32_t limit;
    int queue;              /* join the wait queue if refused (not a single try) */
    uint64_t doubt;         /* an earlier attempt whose grant may be this client's
                               unknowingly (ARGV[10]), 0 if none */
    int64_t deadline;       /* wait for a connection, or a batch, until then */
    dlock_cancel *cancel;   /* the call's cancel token, or NULL */
    unsigned held;          /* out, granted: the permits this client now holds */
    long long free, queued; /* out, refused: permits free, clients in the queue */
    int64_t sent_boot;      /* out: when it was sent (boot clock) */
    int in_doubt;           /* out: it may have been granted without this client
                               learning it (reply lost, or too few replicas) */
    int answered;           /* out: Redis's reply came (else in_doubt says whether
                               it may have run) */
} dlock_sem_try;

/* The acquire script, as attempt t->nonce. DLOCK_OK (granted: t->held),
 * DLOCK_EBUSY (refused: t->free, t->queued; queued if t->queue),
 * DLOCK_EINVAL (another limit: the message names both), DLOCK_ESERVER (a
 * lock's data, or another protocol's), or an error of the call
 * (DLOCK_EREDIS, DLOCK_ETIMEDOUT, ...), with t->in_doubt. */
int dlock_sem_rpc_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t);

/* Gives back `count` permits of e that this client holds. DLOCK_OK,
 * DLOCK_ELOST (Redis had fewer of them: they had ended), or an error of the
 * call (whether it ran is unknown). */
int dlock_sem_rpc_release(dlock_client *c, dlock_entry *e, unsigned count);

/* Takes this client out of e's wait queue, giving back a direct grant to
 * the attempt `gave_up` if it was made (never taken). If Redis cannot be
 * told, that grant is given back in the background, and the queue entry
 * ends with its waiter ttl. */
void dlock_sem_rpc_leave(dlock_client *c, dlock_entry *e, uint64_t gave_up);

#endif
