/*
 * The counting semaphore's local tier (docs/guide.md, "Semaphores"): at
 * most `limit` permits of a name are held at once across all clients
 * (lua/p2/SEM.txt); this client holds some of them in Redis, as one lease
 * that the renewal thread renews in its rounds (lua/p2/sem_renew.lua), and
 * its threads take them one per call. A permit a thread gives back goes to
 * another thread of this client that waits, without Redis, up to
 * pass_limit times in a row; otherwise back to Redis.
 *
 * It uses the entry's core (the table, the lease and its renewal, the one
 * poller, the local queue, the subscriber's wake-ups) but not kind.h's
 * seam: a lock's client asks Redis only while none of its threads holds
 * the lease (client.h, I2), where a semaphore's asks for one more permit
 * while its threads use those it has. Its rules, per entry, under e->mu
 * (the fields are table.h's dlock_semx `m`):
 *   M1. While e->m.users > 0 (threads in a semaphore call of e, and
 *       permits its threads hold) e is a semaphore in this client: the lock
 *       calls refuse it (acquire.c), and a semaphore call refuses an entry
 *       a lock call uses. users == 0 implies no permit held (lease NONE).
 *   M2. One call at a time: a thread talks to Redis for e only while it
 *       holds e's call slot (m.calling), taken under e->mu (waiting on
 *       e->pcv while another thread holds it) and given back with a
 *       broadcast on e->pcv. Redis so sees this client's calls on a name in
 *       the order of their numbers (lua/p2/SEM.txt, Idempotence).
 *   M3. The lease is HELD (lease.sem set, registered for renewal) exactly
 *       while m.held > 0; m.in_use <= m.held threads hold a permit each;
 *       the others (m.held - m.in_use) are spare: passed to a waiting
 *       thread, or given back to Redis.
 *   M4. Each permit a thread holds is counted in its record (shared.h,
 *       dlock_shold: permits, of generation gen) and holds one reference
 *       on e.
 *   M5. A released permit is passed while a thread waits (the head of the
 *       local queue first: dlock_waitq_grant; else the poller, which takes
 *       a spare permit between its tries), fewer than pass_limit permits
 *       were passed since the last one from Redis, and the lease has
 *       handoff_margin left; otherwise it goes back to Redis, with every
 *       other spare permit. The thread passed one takes it if the lease is
 *       still valid when it runs; else every permit of the lease ran out
 *       with it (M8) and the thread waits on. A thread that leaves e when nobody waits gives
 *       back the spare permits it finds (no spare permit outlives the
 *       threads that could take it).
 *   M6. One poller (poll.poller): the only thread that asks Redis for a
 *       permit, whether or not this client holds some. Its refused tries
 *       keep the client in the name's wait queue in Redis (FIFO between
 *       clients); it sleeps on e->pcv between them until a wake-up, a spare
 *       permit, the fallback retry time or its deadline. The last thread to
 *       give up takes the client out of the queue (lua/p2/sem_leave.lua).
 *   M7. A direct grant ("P" message: a release in another client gave its
 *       permit to this client's queued try) is a wake-up: the next try
 *       names the queued attempt (m.doubt) and takes its grant over
 *       (lua/p2/sem_acquire.lua ARGV[10]), so the reply's count is always
 *       Redis's; a try whose outcome is unknown is named the same way, or
 *       given back in the background by the last thread to leave.
 *   M8. Lost permits: the renewal marks the lease LOST (Redis had them no
 *       more, or they ran out unrenewed: on_lost with fence 0); the next
 *       semaphore call on e settles it (m.gen++, held = in_use = 0, lease
 *       NONE), and each thread's permit of an older generation is released
 *       with DLOCK_ELOST, without Redis.
 * Lock order: e->mu, then the renewal manager's (client.h).
 */
#ifndef DLOCK_SEM_H
#define DLOCK_SEM_H

#include <stddef.h>
#include <stdint.h>

#include "local/client.h"
#include "local/shared.h"

/* Takes one permit of semaphore `name` (len bytes) of limit `limit` for
 * the calling thread, waiting up to wait_ms (as dlock_acquire), stopped by
 * a shutdown or cancel token k (NULL: none). Room for the thread's record
 * is reserved by the caller (dlock_shold_reserve). */
int dlock_sem_run(dlock_client *c, const char *name, size_t len, uint32_t limit,
                  int64_t wait_ms, dlock_cancel *k);

/* Gives back one permit of the record h (the calling thread's, or a
 * handle's: api/handle.c; with a permit or a lost one): passed to a waiting thread or to Redis (M5).
 * DLOCK_OK, DLOCK_ELOST (it was lost: M8), or an error of the release
 * call. */
int dlock_sem_give(dlock_client *c, dlock_shold *h);

/* Whether e is in use as a semaphore by this client (M1). e->mu held. */
int dlock_sem_in_use(const dlock_entry *e);

#endif
