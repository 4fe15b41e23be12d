/*
 * The shared (read) mode of a lock name (dlock_acquire_shared), a kind of
 * lock (kind.h; docs/design.md, "Kinds of lock"). The client holds one
 * shared lease of the name in Redis (lua/p2/acquire_shared.lua); its
 * threads share it, each counted once in e->s.holders, and the lease goes
 * back to Redis (lua/p2/release_shared.lua) when the last of them releases
 * it.
 *
 * Rules, with e->mu held (client.h's I1 to I11 hold as for every kind):
 *   S1. Join. A thread asking shared holds the client's shared lease at
 *       once, without Redis, while the lease is HELD with the margin of
 *       validity a local handoff keeps (excl.c, pass), no thread
 *       of this client waits for the name exclusively, and the join window
 *       is open: c->join_ns (dlock_config.join_ms) from the grant (boot
 *       clock). A longer window saves Redis calls on a read-mostly name, a
 *       shorter one serves writers sooner (S3).
 *   S2. Invitation. When a shared grant arrives (the poller's try, or a
 *       direct grant), every thread waiting shared at the head of the
 *       local queue, up to the first one waiting exclusively, is made a
 *       holder (dlock_waitq_grant) and woken: it keeps the lease if it is
 *       still valid when it runs, else it waits again (it polls).
 *   S3. Writers first. Once a thread of this client waits exclusively, no
 *       thread joins (S1): the holders drain, the last one gives the lease
 *       back, and the local queue's head asks Redis. Once a writer of
 *       another client waits in Redis, no client is granted the name
 *       shared anew (lua/p2/LAYOUT.txt, "Writer preference"), and this
 *       client's threads join for at most the join window: a writer waits
 *       at most the window plus the longest shared hold begun in it, after
 *       the holders Redis granted before it queued.
 *   S4. Reentrancy. A holder's shared acquires nest (its record's depth);
 *       a thread holding the name exclusively may take it shared, as one
 *       more level of its exclusive hold (its record's `nested`); a thread
 *       holding it shared may not take it exclusively (DLOCK_EINVAL: two
 *       such upgraders would wait for each other forever).
 *   S5. Release. A holder's outermost release leaves the lease to the
 *       other holders; the last one's gives it back (release.c). A lease
 *       found lost stays LOST until the last holder has released it (each
 *       release reports DLOCK_ELOST).
 *   S6. Tokens. Every holder of one grant gets the grant's token (a shared
 *       lease hands out no tokens of its own; a reader phase, S8, the
 *       pass's); a thread that exits holding
 *       the name shared has its holds released for it (orphan.c).
 *   S7. Modes in Redis. A client never holds a name in both modes in
 *       Redis (DLOCKMODE). A direct grant in a mode no thread of the client
 *       waits in any more, while threads wait in the other, goes back at
 *       once (client.c, wake_one), as does one the poller did not ask for
 *       (acquire.c, take_direct_grant); a try refused with DLOCKMODE (a
 *       lease of the other mode given up or lost, not ended in Redis yet)
 *       counts as busy: the poller tries again (rpc.c).
 *   S8. Reader phases. When a thread of this client releases the name's
 *       exclusive lease (not a shared one) and only threads waiting shared
 *       wait, the lease stays with the client and those threads hold it
 *       together (a reader phase: e->s.under_x), as a local handoff would
 *       pass it: one pass of the pass limit and the next token, the same
 *       margins and clock rule (excl.c, dlock_excl_take_pass); others join
 *       it under S1 (its window from the phase's start). When the phase's
 *       last holder releases, the lease passes to a thread waiting
 *       exclusively if one does (a handoff), else goes back to Redis:
 *       phases alternate with writers' holds, never with each other, so
 *       the client keeps the name from other clients for at most the pass
 *       limit's passes, as for the exclusive lock alone.
 *
 * A thread's shared holds are records in a thread-local array that only
 * that thread touches (like the held slots of client.h); a record names
 * its client's serial and is matched on it before its entry is touched.
 */
#ifndef DLOCK_SHARED_H
#define DLOCK_SHARED_H

#include <stddef.h>
#include <stdint.h>

#include "local/kind.h"

extern const dlock_kind dlock_kind_shared;

/* S8: a reader phase under e's exclusive lease, which no thread holds any
 * more, for the threads waiting shared, if one may start now (only
 * threads waiting shared wait, and a pass is allowed): 1 (they hold it;
 * the caller wakes them with dlock_wakeset_run(ws) once e->mu is
 * dropped), else 0. e->mu held. */
int dlock_shared_phase(dlock_client *c, dlock_entry *e, int64_t now, dlock_wakeset *ws);

/* The calling thread's record of a name it holds shared, or of a
 * semaphore it holds permits of (local/sem.h, M4: a name is never both in
 * one client). */
typedef struct dlock_shold {
    uint64_t serial;  /* its client's (client.h) */
    dlock_entry *e;   /* alive while depth, nested, permits or lost is not 0 (the
                         holder's references: one per hold, one per permit) */
    unsigned depth;   /* the thread's shared holds of e not released yet (S4) */
    unsigned nested;  /* its shared acquires under its exclusive hold of e (S4) */
    int64_t since_ns; /* the outermost shared acquire (monotonic) */
    unsigned permits; /* the semaphore's permits it holds, of generation gen */
    unsigned lost;    /* permits it held that were lost since (sem.h, M8) */
    uint64_t gen;     /* e->m.gen when it took its permits */
} dlock_shold;

/* The calling thread's record of `name` in the client with this serial, or
 * NULL. */
dlock_shold *dlock_shold_find(uint64_t serial, const char *name, size_t len);

/* The calling thread's record of e in that client, or NULL. */
dlock_shold *dlock_shold_of(uint64_t serial, const dlock_entry *e);

/* Room for one more record of the calling thread, so that a hold taken
 * under e->mu never fails for memory: DLOCK_OK or DLOCK_ENOMEM. */
int dlock_shold_reserve(void);

/* The calling thread's record of e, made if absent (room reserved). */
dlock_shold *dlock_shold_get(uint64_t serial, dlock_entry *e);

/* Frees the calling thread's records' memory if it holds nothing shared
 * (after an acquire that reserved room and got no hold). */
void dlock_shold_trim(void);

/* Drops h if it records no hold any more (depth, nested, permits and lost
 * 0) and is one of the calling thread's records (a handle's record, outside
 * them, is left to its handle). */
void dlock_shold_tidy(dlock_shold *h);

/* The calling thread's records, for its exit (orphan.c): the last one, or
 * NULL when none is left. */
dlock_shold *dlock_shold_last(void);

#endif
