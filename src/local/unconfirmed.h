/*
 * Tokens a client handed out under grants that ended other than by a
 * release Redis confirmed: a release that failed or found the grant gone, a
 * lease found lost (the renewal's answer never came, though the renewal may
 * have run; or Redis no longer had it). Redis may still hold such a grant
 * as the client's own, or hold it again once a step back of its clock
 * brings an expired grant back; the client's next acquire of
 * the name tells the acquire script the last token it handed out, so that a
 * grant of the same lease again goes above it (acquire.lua, ARGV[9]). The
 * entry of the name may be freed meanwhile (no thread uses it), so the
 * tokens are kept here, per name, for as long as Redis can keep the grant.
 *
 * Thread-safe: one mutex, a leaf (taken with an entry mutex held, never the
 * other way round).
 */
#ifndef DLOCK_UNCONFIRMED_H
#define DLOCK_UNCONFIRMED_H

#include <stddef.h>
#include <stdint.h>

typedef struct dlock_unconfirmed dlock_unconfirmed;

/* A set whose records live `keep_ms` (the longest Redis keeps a grant
 * unrenewed: twice the lease time). NULL when out of memory. */
dlock_unconfirmed *dlock_unconfirmed_create(uint32_t keep_ms);
void dlock_unconfirmed_destroy(dlock_unconfirmed *u);

/* Records `token` for name, and how that grant ended (`end`: 0 its holder
 * released it, DLOCK_UNCLEAN_ABANDONED, DLOCK_UNCLEAN_EXPIRED for a lost
 * lease; acquire.lua ARGV[10]): the highest token recorded wins, with its
 * end. For keep_ms from now. Out of memory: nothing is recorded (the
 * acquire is then as before this module: correct unless the server's clock
 * stepped back). */
void dlock_unconfirmed_put(dlock_unconfirmed *u, const char *name, uint64_t token, int end);

/* The token recorded for name, 0 if none (or it is older than keep_ms), and
 * its end in *end. */
uint64_t dlock_unconfirmed_get(dlock_unconfirmed *u, const char *name, int *end);

/* Forgets name: a new grant's token is above what was recorded. */
void dlock_unconfirmed_clear(dlock_unconfirmed *u, const char *name);

#endif
