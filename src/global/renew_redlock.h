/*
 * The renewal manager's work in Redlock mode (renew.h, dlock_renew_cfg's
 * redlock; docs/design.md, "Redlock"): the rounds, the give-backs and the
 * release at stop go to the node set instead of one server's lanes, and
 * restarted nodes are seeded. On the manager thread (or dlock_renew_stop
 * after it), without locks held, under renew_int.h's rules.
 */
#ifndef DLOCK_RENEW_REDLOCK_H
#define DLOCK_RENEW_REDLOCK_H

#include "global/renew.h"

/* A round: every registered lease renewed on the node set in one batch
 * (dlock_redlock_renew_many: one pipelined exchange per node per
 * DLOCK_REDLOCK_RENEW_BATCH leases, each confirmed by its own majority).
 * Confirmed: its validity is the batch's first send + the lease - the
 * drift allowance. Found gone on
 * more than N - m nodes, or not confirmed before its validity ended: lost
 * (the callback, as a round of one server's). Returns when the next round
 * is due (monotonic): a period after this one, or after a short pause
 * when a lease was not confirmed (never after its validity). */
int64_t dlock_renew_redlock_round(dlock_renew *r);

/* One try of each job due now: a give-back, a release by attempt on every
 * node it may have reached (dlock_redlock_give_back_past), or a leave of
 * every node's wait queue but those it need not reach
 * (dlock_redlock_leave_past), done once each of those answered. None begins
 * at or after until (monotonic: the next round is due then), each ends
 * by it, and a node that failed one is not asked again in the pass.
 * Returns when the next try is due (DLOCK_NEVER: none left). */
int64_t dlock_renew_redlock_jobs(dlock_renew *r, int64_t until);

/* After the thread stopped: releases every registered lease on the node
 * set (best effort, all by one exchange's deadline; a node that failed
 * one release is not asked again). */
void dlock_renew_redlock_release_all(dlock_renew *r);

/* The periodic server check in Redlock mode: one node per check, in turn
 * (dlock_redlock_check_node, within a command timeout, and given up at
 * until, when the next round is due: a stopped node's check does not
 * delay the renewals), so that a stopped node costs a check one timeout
 * at most, not one per node; every node is read once per N checks. The server callback gets the verdict of every node's
 * last check: DLOCK_ESERVER naming the first unfit node while any is
 * unfit (an evicting node may lose a mark, which the token rule relies
 * on: docs/design.md, "Redlock"), else DLOCK_OK; not called when the node
 * read did not answer. */
void dlock_renew_redlock_check(dlock_renew *r, int64_t until);

/* Seeds the node set's restarted nodes that are due
 * (dlock_redlock_seed_due), within a command timeout and by until
 * (monotonic: the next round is due then); a failure is logged once until
 * it works again. */
void dlock_renew_redlock_seed(dlock_renew *r, int64_t until);

#endif
