/*
 * Kinds of lock (docs/design.md, "Kinds of lock"): what differs between
 * them in the local tier. Every kind shares the entry's core (entry/table.h:
 * the table, the lease in Redis, the one poller, the local queue) and the
 * paths built on it (acquire.c: polling Redis, the local queue's rules I2 to
 * I9; release.c: giving a lease back; rpc.c: the scripts' calls; the
 * renewal). A kind says how the threads of this client hold a lease among
 * themselves: who holds it, a reentrant acquire, how it is passed between
 * threads without Redis, and when it goes back to Redis. src/local/excl.c
 * is the exclusive lock, the first kind.
 *
 * Every operation is called with e->mu held and returns with it held; none
 * talks to Redis or drops e->mu. Wake-ups a kind asks for are issued by its
 * caller after e->mu is dropped (park.h).
 */
#ifndef DLOCK_KIND_H
#define DLOCK_KIND_H

#include <stdint.h>

#include "entry/park.h"
#include "entry/table.h"

typedef struct dlock_client dlock_client;

typedef struct dlock_kind {
    const char *name; /* as the trace, metrics and dlockctl name the kind */
    int index;        /* DLOCK_KIND_* (entry/table.h): its count of waiters, its
                         waiters' nodes (park.h, kind) */

    /* Whether the calling thread holds e in this kind (itself, not through
     * a handle): a reentrant acquire, a release, dlock_held. */
    int (*mine)(const dlock_client *c, const dlock_entry *e);

    /* A reentrant acquire by a thread that holds e (mine): one level more,
     * *fence its token (fence may be NULL). DLOCK_OK or DLOCK_ELOST (the
     * lease is lost: the caller releases it). */
    int (*reenter)(dlock_client *c, dlock_entry *e, uint64_t *fence);

    /* The calling thread becomes the holder of the grant just made (the
     * lease's fields set and registered for renewal: acquire.c, take_grant);
     * `unclean` how the hold before it ended (dlock_unclean). */
    void (*hold)(dlock_client *c, dlock_entry *e, int unclean);

    /* Whether a thread of this client holds the lease (then it is HELD or
     * LOST: client.h, I1): no thread may poll Redis for e (I2). */
    int (*held)(const dlock_entry *e);

    /* Whether a waiting thread of this kind may take the lease now without
     * Redis (an open pass that any waiter may take: client.h, I5; a shared
     * lease open to joiners: shared.h). */
    int (*passing)(const dlock_client *c, const dlock_entry *e);

    /* The waiter takes a lease passed on by its holder, without Redis:
     * `w` is the calling thread's node; `direct` says it was handed to w
     * alone (dlock_waiter_granted) rather than opened to all. DLOCK_OK
     * (the calling thread holds e) or DLOCK_ELOST: its validity ran out
     * in passing, the caller polls Redis (*drop: references of the
     * registry to drop after unlocking; *ran_out: the token of a lease
     * that ran out unseen, for the log). */
    int (*take)(dlock_client *c, dlock_entry *e, dlock_waiter *w, int direct, int *drop,
                uint64_t *ran_out);

    /* A lease lost while being passed (the renewal found it gone): nobody
     * holds it, nobody takes it. */
    void (*drop_lost)(dlock_entry *e);

    /* The calling thread's outermost release, with the lease HELD: the
     * calling thread holds it no more (called after its hold ended,
     * `now` on the boot clock). 1 if the lease stays with this client
     * (passed to a waiting thread; *wake the thread to wake after
     * unlocking, or NULL), 0 if it goes back to Redis (release.c). */
    int (*pass)(dlock_client *c, dlock_entry *e, int64_t now, dlock_waiter **wake);

    /* The calling thread stops holding e: its outermost release, before
     * pass (or before giving back a lost lease). */
    void (*unhold)(dlock_entry *e);

    /* How the hold that ends now ended, for the grant after it
     * (DLOCK_UNCLEAN_*, 0 for a release by its holder), and forgotten:
     * the release script tells Redis. */
    int (*end)(dlock_entry *e);

    /* The calling thread took a passed lease only to give it back (its
     * wait was stopped and nobody else waits): it ends as the hold before
     * it ended, since nobody used it. */
    void (*unused)(dlock_entry *e);
} dlock_kind;

#endif
