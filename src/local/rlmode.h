/*
 * Redlock mode's glue between the client and the node set (route/redlock.h;
 * dlock_config.redlock_nodes; docs/design.md, "Redlock"): a lock's acquire
 * and release, exclusive or shared (t->shared, e->lease.rl->shared), on the
 * node set in place of one server's scripts (the client's setup of the mode
 * is client.c's: redlock_setup). The local tier above is unchanged; the
 * renewals are the renewal manager's (renew_redlock.c). No state of its own:
 * the entry fields it writes are written under client.h's rules by the
 * thread that makes the call (e's poller, e's releaser), without e->mu.
 */
#ifndef DLOCK_RLMODE_H
#define DLOCK_RLMODE_H

#include "local/client.h"
#include "local/rpc.h"

/* One try of the acquire (exclusive, or shared with t->shared) on the node
 * set, as dlock_rpc_acquire answers for one server: DLOCK_OK with t->token
 * (T), t->unclean (the majority's word of how the hold before ended) and
 * t->sent_boot (the first send: the validity counts from it), the grant kept
 * in e->lease.rl; DLOCK_EBUSY with t->pttl_ms (when to try again: the
 * holder's lease time left, 5 ms .. lease / 3; -1 when no node told one,
 * refused for other waiters' turns: the poller's fallback) and t->busy; a
 * waiting try (t->queue) is queued on the nodes that refuse it, under the
 * wait's ticket (e->poll.rl_ticket, taken at its first try), and a split
 * vote kept (e->poll.rl_kept) or given back by the wait-die rule, a kept one
 * given back once the next try ended; DLOCK_EREDIS (too few nodes count or
 * answered; for a waiting try, t->queue, only once its deadline leaves no
 * time for another: before, it answers DLOCK_EBUSY so that the poller tries
 * again), or another error. */
int dlock_rlmode_acquire(dlock_client *c, dlock_entry *e, dlock_rpc_try *t);

/* The end of e's poller's wait (its last try answered, whatever the
 * outcome), as e's poller: a split vote its last try kept is given back
 * in the background, and the wait's ticket dropped (docs/design.md,
 * "Redlock", Waiting). */
void dlock_rlmode_wait_end(dlock_client *c, dlock_entry *e);

/* The release of e's grant (e->lease.rl) on every node, as e's releaser,
 * leaving `ending` (DLOCK_UNCLEAN_ABANDONED for a holder thread that
 * exited, else 0) for the next grant: DLOCK_OK or DLOCK_EREDIS (fewer
 * than a majority answered; the others' grants end within a lease). */
int dlock_rlmode_release(dlock_client *c, dlock_entry *e, int ending);

/* The deadline of one exchange with the node set (monotonic): connections
 * opened node after node (a stopped node's takes up to a connect and a
 * command timeout, route/redlock.h), then a command timeout for the
 * replies. */
int64_t dlock_rlmode_exchange_deadline(const dlock_client *c);

/* A wait's ticket: the client's wall clock in us, at least 1. */
uint64_t dlock_rlmode_ticket(void);

/* The pause before a refused or failed waiting try's next one, in ms: pttl
 * bounded to 5 .. lease / 3. */
int64_t dlock_rlmode_retry_ms(const dlock_client *c, int64_t pttl);

#endif
