/*
 * Redlock mode's glue between the client and the node set
 * (route/redlock.h; dlock_config.redlock_nodes; docs/design.md, "Redlock"):
 * the exclusive lock's acquire and release on the
 * node set in place of one server's scripts (the client's setup of the
 * mode is client.c's: redlock_setup). The local tier above is
 * unchanged; the renewals are the renewal manager's (renew_redlock.c).
 * No state of its own: the entry fields it writes are written under
 * client.h's rules by the thread that makes the call (e's poller, e's
 * releaser), without e->mu.
 */
#ifndef DLOCK_RLMODE_H
#define DLOCK_RLMODE_H

#include "local/client.h"
#include "local/rpc.h"

/* One try of the exclusive acquire on the node set, as dlock_rpc_acquire
 * answers for one server: DLOCK_OK with t->token (T), t->unclean (the
 * majority's word of how the hold before ended) and t->sent_boot (the
 * first send: the validity counts from it), the grant kept in
 * e->lease.rl; DLOCK_EBUSY with t->pttl_ms (when to try again: the
 * holder's lease time left, 5 ms .. lease / 3) and t->busy; DLOCK_EREDIS
 * (too few nodes count or answered; for a waiting try, t->queue, only once
 * its deadline leaves no time for another: before, it answers DLOCK_EBUSY
 * so that the poller tries again), or another error. */
int dlock_rlmode_acquire(dlock_client *c, dlock_entry *e, dlock_rpc_try *t);

/* The release of e's grant (e->lease.rl) on every node, as e's releaser,
 * leaving `ending` (DLOCK_UNCLEAN_ABANDONED for a holder thread that
 * exited, else 0) for the next grant: DLOCK_OK or DLOCK_EREDIS (fewer
 * than a majority answered; the others' grants end within a lease). */
int dlock_rlmode_release(dlock_client *c, dlock_entry *e, int ending);

/* DLOCK_OK, or DLOCK_EINVAL when c is in Redlock mode and `what` (a kind
 * of lock the mode has not yet) is asked for. */
int dlock_rlmode_refuse(const dlock_client *c, const char *what);

#endif
