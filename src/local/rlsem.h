/*
 * A counting semaphore's Redis calls in Redlock mode (dlock_config's
 * redlock_nodes; docs/design.md "Redlock", Semaphores): sem_rpc.h's three
 * calls, which sem_rpc.c hands here in this mode, done over the name's
 * slots (route/redlock.h, dlock_redlock_slots). The local tier above
 * (local/sem.h, M1 to M8) is unchanged: a permit it counts is a slot this
 * client holds, renewed slot by slot in the renewal rounds
 * (global/renew_redlock.c), where one slot lost loses them all (M8).
 *
 * Shared state: e->lease.rls, under e->mu (the renewal manager joins
 * re-grants, validities and losses to it: renew_redlock.c). The calls run
 * in e's call slot (sem.h, M2) without e->mu, and take it around each
 * reading or change of the slots; a change of the slots held is copied to
 * the renewal registration under e->mu (dlock_renew_rl_slots_sync), and a
 * slot given back is released only after dlock_renew_quiesce, so that no
 * renewal of it reaches a node after its release.
 *
 *   R1. e->lease.rls->n == e->m.held while the permits are HELD, but
 *       within a call, between a change of one and the other (a granted
 *       try's count is read again under e->mu: dlock_rlsem_granted); slots
 *       held while the lease is not HELD are stale (their permits were
 *       lost, M8) and are given back by the next acquire or by the next
 *       thread to leave e with nobody in its call slot.
 *   R2. A wait's tries queue on every slot not held that they ask
 *       (e->lease.rls->queued), so that a release of any of them wakes
 *       the wait; a split vote is kept only on its home, drawn at its
 *       first try among the slots not held and asked first, and given
 *       back elsewhere (route/redlock.h, no_keep). Any grant ends the
 *       wait (the wait's own, or a single try's meanwhile): a leave of
 *       every queued slot but the one granted (in the background), and
 *       of the granted one on the nodes that did not grant it, numbered
 *       as its attempt (as a lock's wait). A leave never names a slot e
 *       holds: leave.lua gives up a held grant of an older attempt.
 *       The wait's ticket is kept until the wait ends (its own grant, or
 *       its leave), whatever homes it draws.
 *   R3. A split vote the home slot's try kept (route/redlock.h, wait) is
 *       given back once the next try ended, or the wait did.
 *   R4. Each try claims the name for its limit first (route/redlock.h,
 *       dlock_redlock_claim: a lock of the name, or another limit, is
 *       refused while a claim lives on a majority) and asks no slot unless
 *       a majority claimed it, or a claim of this client (a try's or a
 *       renewal's: e->lease.rls->claim_valid, under e->mu) surely holds
 *       two thirds of a lease more; a slot it takes is valid at most while the
 *       claim surely holds (a lease from its send, as a grant: route/
 *       redlock.h), and the renewal rounds claim the name again with its
 *       slots (renew_redlock.c), so the claim outlives every permit
 *       counted. A claim refused (by more than n - m nodes) ends a wait.
 */
#ifndef DLOCK_RLSEM_H
#define DLOCK_RLSEM_H

#include "local/client.h"
#include "local/sem_rpc.h"

/* dlock_sem_rpc_acquire in Redlock mode: one permit, a slot taken by a
 * quorum (t->queue: a wait's try, R2). DLOCK_OK (t->held and
 * t->sent_boot: dlock_rlsem_granted, once e->mu is held again);
 * DLOCK_EBUSY (every slot not held refused: t->free 0, t->queued -1, not
 * known; also a waiting try that too few nodes answered while its deadline
 * leaves time for another); DLOCK_EREDIS (too few nodes count or answered:
 * the message says which); DLOCK_EINVAL (a limit above
 * DLOCK_REDLOCK_SEM_MAX, or the name claimed for another limit: R4);
 * DLOCK_ESERVER (the name holds a lock's data) or DLOCK_ENOMEM. Never in doubt (t->in_doubt 0):
 * an attempt of unknown outcome is given back here, in the background. */
int dlock_rlsem_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t);

/* After a granted dlock_rlsem_acquire, with e->mu held again (in the call
 * slot): t->held and t->sent_boot as e's slots are now (the renewal may
 * have changed them while e->mu was free). DLOCK_OK; DLOCK_EBUSY when the
 * renewal found the permits lost meanwhile and took the fresh slot out
 * with them (it released it: a refused try); DLOCK_EREDIS when the fresh
 * slot's validity, or that of a slot held before (its renewal late, the
 * round that finds it gone not applied yet), has run out: the fresh slot
 * is given back. */
int dlock_rlsem_granted(dlock_client *c, dlock_entry *e, dlock_sem_try *t);

/* The fresh slot of attempt `nonce` given back (the local tier could not
 * take it: out of memory), out of e's slots. e->mu held, in the call slot. */
void dlock_rlsem_ungrant(dlock_client *c, dlock_entry *e, const char *nonce);

/* R1: slots held while e's lease is not HELD (lost permits) given back in
 * the background. e->mu held, nobody in e's call slot. */
void dlock_rlsem_tidy(dlock_client *c, dlock_entry *e);

/* dlock_sem_rpc_release in Redlock mode: `count` slots given back (out of
 * e's slots before their release). DLOCK_OK, DLOCK_ELOST (a slot was no
 * longer held by a majority: every other slot is then given back too, M8),
 * or DLOCK_EREDIS (too few nodes answered: a slot not released ends within
 * a lease). */
int dlock_rlsem_release(dlock_client *c, dlock_entry *e, unsigned count);

/* dlock_sem_rpc_leave in Redlock mode: the queue of every slot the wait
 * asked left on every node (in the background where a node does not
 * answer), and a split vote kept given back (R3). `gave_up` unused: the leave's own
 * number gives up grants of older attempts (leave.lua). */
void dlock_rlsem_leave(dlock_client *c, dlock_entry *e, uint64_t gave_up);

#endif
