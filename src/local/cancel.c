/*
 * Cancel tokens: see cancel.h for the design and the lock order.
 *
 * Invariants: `fired` is written under `mu` and read without it (an atomic
 * load); a registration is in `regs` exactly between its register and
 * unregister, both under `mu`, so dlock_cancel_fire, which calls the wake
 * functions under `mu`, never reaches a registration whose call returned.
 */
#include <pthread.h>
#include <stdlib.h>

#include "local/cancel.h"
#include "common/common.h"
#include "common/error.h"

struct dlock_cancel {
    pthread_mutex_t mu;
    int fired; /* atomic; written under mu */
    dlock_cancel_reg *regs;
};

int dlock_cancel_create(dlock_cancel **out)
{
    dlock_err_clear();
    if (!out)
        return dlock_err_set(DLOCK_EINVAL, "out is NULL");
    dlock_cancel *k = calloc(1, sizeof *k);
    if (!k) {
        *out = NULL;
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&k->mu, NULL);
    *out = k;
    return DLOCK_OK;
}

void dlock_cancel_destroy(dlock_cancel *k)
{
    if (!k)
        return;
    DLOCK_ASSERT(k->regs == NULL); /* an acquire still uses it: the API forbids it */
    pthread_mutex_destroy(&k->mu);
    free(k);
}

void dlock_cancel_fire(dlock_cancel *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    /* The flag before the wake-ups: a woken waiter must find it set. The
     * wake functions take the waiter's lock, which orders the store before
     * the waiter's next look at the flag. */
    dlock_store_int(&k->fired, 1);
    for (dlock_cancel_reg *r = k->regs; r; r = r->next)
        r->wake(r);
    pthread_mutex_unlock(&k->mu);
}

int dlock_cancel_fired(dlock_cancel *k)
{
    return dlock_cancel_is_fired(k);
}

int dlock_cancel_is_fired(dlock_cancel *k)
{
    return k ? dlock_load_int(&k->fired) : 0;
}

void dlock_cancel_reset(dlock_cancel *k)
{
    if (!k)
        return;
    pthread_mutex_lock(&k->mu);
    dlock_store_int(&k->fired, 0);
    pthread_mutex_unlock(&k->mu);
}

int dlock_cancel_register(dlock_cancel *k, dlock_cancel_reg *reg)
{
    pthread_mutex_lock(&k->mu);
    if (dlock_load_int(&k->fired)) {
        pthread_mutex_unlock(&k->mu);
        return DLOCK_ECANCELED;
    }
    reg->prev = NULL;
    reg->next = k->regs;
    if (k->regs)
        k->regs->prev = reg;
    k->regs = reg;
    pthread_mutex_unlock(&k->mu);
    return 0;
}

void dlock_cancel_unregister(dlock_cancel *k, dlock_cancel_reg *reg)
{
    pthread_mutex_lock(&k->mu);
    if (reg->prev)
        reg->prev->next = reg->next;
    else
        k->regs = reg->next;
    if (reg->next)
        reg->next->prev = reg->prev;
    pthread_mutex_unlock(&k->mu);
}
