/*
 * Parking of local waiters (see park.h for the node's lifetime rule).
 *
 * Memory ordering: `granted` is stored with release order after `token` and
 * after the granter's bookkeeping of the entry, and loaded with acquire
 * order by the waiter, which may then read the token and run its critical
 * section without taking the entry mutex again: everything the granting thread wrote
 * before (its own critical section included) happens before the new
 * holder's. `wake` is the futex word and a hint (relaxed): a waiter that
 * sees it takes the entry mutex and reads the entry under it, which orders
 * the rest. A grant sets `wake` too, so that the futex value changes and a
 * waiter about to sleep cannot miss it.
 *
 * Lock order: only the entry mutex, which every function here but
 * dlock_waiter_unpark expects held (dlock_waiter_park drops it while it
 * sleeps).
 */
#include <time.h>

#include "common/common.h"
#include "entry/park.h"

static __thread dlock_waiter self_node;

dlock_waiter *dlock_waiter_self(void)
{
    dlock_waiter *w = &self_node;
    DLOCK_ASSERT(!w->queued);
    w->prev = w->next = NULL;
    w->self = pthread_self();
    w->since_ns = 0;
    w->token = 0;
    dlock_store_int(&w->granted, 0);
    dlock_store_int(&w->wake, 0);
    w->parked = 0;
    return w;
}

void dlock_waitq_push(dlock_waitq *q, dlock_waiter *w, int64_t now_ns)
{
    DLOCK_ASSERT(!w->queued);
    w->since_ns = now_ns;
    w->next = NULL;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    if (q->head == w)
        q->head_since_ns = now_ns;
    q->n++;
    w->queued = 1;
}

void dlock_waitq_remove(dlock_waitq *q, dlock_waiter *w)
{
    if (!w->queued)
        return;
    if (w->prev) {
        w->prev->next = w->next;
    } else {
        q->head = w->next;
        if (q->head)
            q->head_since_ns = dlock_now_ns();
    }
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    w->prev = w->next = NULL;
    q->n--;
    w->queued = 0;
}

void dlock_waiter_unpark(dlock_waiter *w)
{
    if (w)
        dlock_futex_wake(&w->wake, 1);
}

void dlock_wakeset_add(dlock_wakeset *s, dlock_waiter *w)
{
    if (!w)
        return;
    if (s && s->n < DLOCK_WAKESET_MAX)
        s->w[s->n++] = w;
    else
        dlock_waiter_unpark(w);
}

void dlock_wakeset_run(dlock_wakeset *s)
{
    for (unsigned i = 0; i < s->n; i++)
        dlock_waiter_unpark(s->w[i]);
    s->n = 0;
}

dlock_waiter *dlock_waitq_wake_later(dlock_waiter *w)
{
    if (dlock_load_int(&w->wake))
        return NULL; /* told already, and not yet looked: once is enough */
    dlock_store_int(&w->wake, 1);
    return w->parked ? w : NULL;
}

void dlock_waitq_wake(dlock_waiter *w)
{
    dlock_waiter_unpark(dlock_waitq_wake_later(w));
}

dlock_waiter *dlock_waitq_first(const dlock_waitq *q, int kind)
{
    for (dlock_waiter *w = q->head; w; w = w->next)
        if (w->kind == kind)
            return w;
    return NULL;
}

void dlock_waitq_wake_head(dlock_waitq *q)
{
    if (q->head)
        dlock_waitq_wake(q->head);
}

void dlock_waitq_wake_all(dlock_waitq *q)
{
    for (dlock_waiter *w = q->head; w; w = w->next)
        dlock_waitq_wake(w);
}

dlock_waiter *dlock_waitq_grant(dlock_waitq *q, dlock_waiter *w, uint64_t token)
{
    dlock_waitq_remove(q, w);
    w->token = token;
    int parked = w->parked;
    dlock_store_int(&w->wake, 1);
    dlock_store_int_release(&w->granted, 1);
    return parked ? w : NULL;
}

int dlock_waiter_granted(dlock_waiter *w)
{
    return dlock_load_int_acquire(&w->granted);
}

void dlock_waiter_park(dlock_waiter *w, pthread_mutex_t *mu, int64_t deadline_ns)
{
    dlock_store_int(&w->wake, 0);
    w->parked = 1;
    pthread_mutex_unlock(mu);
    /* Sleeps only while wake is still 0. EINTR, EAGAIN and ETIMEDOUT all
     * mean: look again. */
    dlock_futex_wait(&w->wake, 0, deadline_ns);
    pthread_mutex_lock(mu);
    w->parked = 0;
}
