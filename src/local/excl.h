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

#endif
