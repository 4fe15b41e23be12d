/*
 * The exclusive lock, the first kind (kind.h): one thread of this client
 * holds the lease at a time, reentrantly, and passes it to a waiting thread
 * without Redis (a local handoff, client.h I10) within the pass limit and
 * the clock rule of tokens. Its state is the entry's `x` (entry/table.h),
 * under e->mu, kept by this file's operations; the exclusive calls of
 * api.c (a reentrant release's depth, handles, dlock_unclean) and orphan.c
 * (a thread that exits holding it) read and write it under the same
 * rules, and entry/table.c's dlock_entry_kick_head reads it (I9).
 */
#ifndef DLOCK_EXCL_H
#define DLOCK_EXCL_H

#include "local/kind.h"

extern const dlock_kind dlock_kind_excl;

/* Takes one pass of the exclusive lease held by no thread of this client
 * (the next token, one more of the pass limit), as a local handoff
 * would, if one would be allowed now (the pass limit, the validity's
 * margin, the clock rule of tokens, not `closing`, the caller's reading of
 * c->closing): for a reader phase under the lease (shared.h, S8). 1 if
 * taken, else 0. e->mu held. */
int dlock_excl_take_pass(dlock_client *c, dlock_entry *e, int64_t now, int closing);

#endif
