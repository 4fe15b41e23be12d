/*
 * Releasing: the outermost release of a lease by its owner thread, which
 * either hands it to another thread of this client (no Redis command) or
 * gives it back to Redis (client.h, I5 and I10).
 */
#ifndef DLOCK_RELEASE_H
#define DLOCK_RELEASE_H

#include "local/client.h"
#include "local/kind.h"

/* The outermost release of e by the calling thread, which holds it in kind
 * k, e->mu and two references (its lookup's and the owner's, both dropped
 * here): returns with e->mu released. DLOCK_OK, DLOCK_ELOST, or an error
 * of Redis. */
int dlock_release_outermost(dlock_client *c, const dlock_kind *k, dlock_entry *e,
                            const char *name);

/* One holder's outermost shared release of e (shared.h, S5), its record
 * (or its handle) already cleared: the hold time since since_ns counted,
 * the lease left to the other holders or given back. e->mu held and two
 * references (a lookup's and the hold's, both dropped here): returns with
 * e->mu released. As dlock_release_outermost, and DLOCK_ELOST also when
 * other holders keep a lease that ran out during this hold. */
int dlock_release_shared_hold(dlock_client *c, dlock_entry *e, const char *name,
                              int64_t since_ns);

#endif
