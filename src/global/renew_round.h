/*
 * A renewal round (renew_round.c): every registered grant renewed in one
 * pipelined round trip per lane, the verdicts applied to the entries.
 */
#ifndef DLOCK_RENEW_ROUND_H
#define DLOCK_RENEW_ROUND_H

#include "global/renew.h"

/* One round, on the manager thread, without locks held. Returns when the
 * next one is due (monotonic): a period after this one was sent, sooner
 * after a failure or when a lease not renewed runs out first. */
int64_t dlock_renew_round(dlock_renew *r);

#endif
