/*
 * Parking of local waiters: the FIFO of threads of one client waiting for
 * one lock name, each with its own node, so that a release can wake exactly
 * the thread it means (the longest waiter) or hand it the lease directly.
 *
 * A waiting thread parks on a futex word of its own node, not on a condition
 * variable: a woken thread does not need the entry mutex to wake up, so the
 * releaser can wake it after dropping the mutex (a thread woken inside
 * pthread_cond_wait while the waker still held the mutex went back to sleep
 * on the mutex: 4.4 context switches per acquisition instead of 2.4 with
 * 1024 threads on one name, measured).
 *
 * Node lifetime: the node is thread-local (dlock_waiter_self), one per
 * thread, since a thread waits for one name at a time; it outlives every
 * wait. A wake-up issued after the waker dropped the entry mutex may reach
 * the thread after it stopped waiting, or during a later wait: a spurious
 * wake-up, which every wait here tolerates by looking at the entry again.
 *
 * Every field but `granted` and `wake` is guarded by the mutex of the entry
 * whose queue holds the node (the "entry mutex" below); those two are
 * atomics, written under that mutex and read by the waiter without it.
 */
#ifndef DLOCK_PARK_H
#define DLOCK_PARK_H

#include <pthread.h>
#include <stdint.h>

typedef struct dlock_waiter {
    struct dlock_waiter *prev, *next; /* in the queue; entry mutex */
    pthread_t self;                   /* the waiting thread */
    int64_t since_ns;                 /* monotonic: when it started to wait */
    uint64_t token;                   /* the fencing token, written before `granted` */
    int granted;  /* atomic: the lease was passed to this waiter alone; it owns the lock */
    int wake;     /* atomic: something changed, the waiter must look at the entry again */
    int parked;   /* entry mutex: sleeping (or about to sleep) on the futex `wake` */
    int queued;   /* entry mutex: in the queue */
    int kind;     /* entry mutex: the kind of lock it waits for (DLOCK_KIND_*, entry/table.h) */
} dlock_waiter;

typedef struct dlock_waitq {
    dlock_waiter *head, *tail; /* entry mutex; head: the longest waiter */
    unsigned n;
    int64_t head_since_ns;     /* monotonic: when the head became the head */
} dlock_waitq;

/* The calling thread's node, reset for a new wait. */
dlock_waiter *dlock_waiter_self(void);

/* Appends w (not queued) at the tail; since_ns = now_ns. Entry mutex held. */
void dlock_waitq_push(dlock_waitq *q, dlock_waiter *w, int64_t now_ns);

/* Takes w out of q if it is in it. Entry mutex held. */
void dlock_waitq_remove(dlock_waitq *q, dlock_waiter *w);

/* Tells w to look at the entry again: sets `wake` and wakes it if it is
 * parked (a waiter already told is not woken twice). Entry mutex held. */
void dlock_waitq_wake(dlock_waiter *w);

/* The same, but leaves the wake-up to the caller: returns w if it must be
 * woken with dlock_waiter_unpark once the entry mutex is dropped, else NULL.
 * Entry mutex held. */
dlock_waiter *dlock_waitq_wake_later(dlock_waiter *w);

/* Wakes w, parked (or once parked) on its futex; NULL is ignored. Called
 * without the entry mutex. */
void dlock_waiter_unpark(dlock_waiter *w);

/* Waiters to wake once the entry mutex is dropped, several at once (the
 * threads of a reader phase: local/shared.c). Woken under the mutex, each
 * would only wait for it while the waker wakes the next: with 50 readers,
 * the first began its hold about 450 us after the phase, measured. */
enum { DLOCK_WAKESET_MAX = 64 };
typedef struct dlock_wakeset {
    dlock_waiter *w[DLOCK_WAKESET_MAX];
    unsigned n;
} dlock_wakeset;

/* Adds w (as dlock_waitq_grant returns it; NULL is ignored) to s, or wakes
 * it at once when s is NULL or full. Entry mutex held. */
void dlock_wakeset_add(dlock_wakeset *s, dlock_waiter *w);

/* Wakes every waiter of s, and empties it. Called without the entry
 * mutex. */
void dlock_wakeset_run(dlock_wakeset *s);

/* The first node of q waiting for kind `kind`, or NULL. Entry mutex held. */
dlock_waiter *dlock_waitq_first(const dlock_waitq *q, int kind);

/* dlock_waitq_wake on the head, if any. Entry mutex held. */
void dlock_waitq_wake_head(dlock_waitq *q);

/* dlock_waitq_wake on every node. Entry mutex held. */
void dlock_waitq_wake_all(dlock_waitq *q);

/* Passes the lock to w (in q): takes it out of q, stores token, then
 * `granted` with release order (the waiter reads both without the mutex).
 * Returns w if it is parked and must be woken with dlock_waiter_unpark once
 * the entry mutex is dropped, else NULL. The entry's own bookkeeping
 * (owner, depth) is the caller's. Entry mutex held. */
dlock_waiter *dlock_waitq_grant(dlock_waitq *q, dlock_waiter *w, uint64_t token);

/* 1 if w was granted the lock (acquire load: w->token is then readable). */
int dlock_waiter_granted(dlock_waiter *w);

/* Sleeps on w's futex until woken or `deadline_ns` (monotonic; DLOCK_NEVER:
 * none), once: the caller looks at the entry again whatever woke it (a
 * wake-up, a spurious one, the deadline, a signal). Called and returns with
 * mu held. */
void dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns);

#endif
