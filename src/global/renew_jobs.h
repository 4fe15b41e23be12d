/*
 * The renewal manager's background jobs (renew_jobs.c): releases of acquire
 * attempts whose outcome is unknown (dlock_renew_give_back), leaves of the wait
 * queue a caller could not make (dlock_renew_leave), and the release of
 * every lease still registered when the manager stops.
 */
#ifndef DLOCK_RENEW_JOBS_H
#define DLOCK_RENEW_JOBS_H

#include "global/renew.h"

/* One try for each job due now (renew_jobs.c), on the manager thread (or
 * dlock_renew_stop after it), without locks held; in Redlock mode none
 * begins at or after until (monotonic: the next round, DLOCK_NEVER: no
 * bound). Returns when the next try is due (DLOCK_NEVER: none left). */
int64_t dlock_renew_jobs_run(dlock_renew *r, int64_t until);

/* After the thread stopped: gives every registered lease back, one
 * pipeline per lane. Best effort within the timeouts: a lease not released
 * (a redirect, a failure) expires after lease_ms. */
void dlock_renew_release_all(dlock_renew *r);

#endif
