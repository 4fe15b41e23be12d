/*
 * Acquiring: the poller's loop (the one thread of this client that talks to
 * Redis for a name, client.h I2), taking a grant, a handoff or a direct
 * grant, and the waiters' rules (I5 to I11).
 */
#ifndef DLOCK_ACQUIRE_H
#define DLOCK_ACQUIRE_H

#include "local/client.h"
#include "local/kind.h"

/* An acquire of `name` (len bytes) in kind `kind` by the calling thread,
 * once the
 * arguments are checked and the cancel token k (NULL: none), if any, has
 * this call registered: waits up to wait_ms (DLOCK_WAIT_FOREVER: no limit).
 * DLOCK_OK with *fence set (if fence), or an error with its message. */
int dlock_acquire_run(dlock_client *c, const dlock_kind *kind, const char *name, size_t len,
                      int64_t wait_ms, uint64_t *fence, dlock_cancel *k);

#endif
