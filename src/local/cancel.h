/*
 * Cancel tokens (dlock_cancel, public in dlock.h): a flag fired once from
 * any thread, and the list of the waits that use it, each with a function
 * that wakes it. The token knows nothing of what a wait is: the lock logic
 * (api.c) registers its acquires with a wake function of its own.
 *
 * Lock order: the token's mutex is taken before whatever a registration's
 * wake function takes (api.c: the table mutex, then an entry mutex). So
 * a waiting thread must never register, unregister or fire while it holds
 * an entry mutex; it reads the flag (dlock_cancel_is_fired) anywhere.
 */
#ifndef DLOCK_CANCEL_H
#define DLOCK_CANCEL_H

#include "dlock.h"

/* One wait that uses a token: a node owned by the waiting call (on its
 * stack), in the token's list from register to unregister. The caller
 * embeds it first in a struct of its own, which wake casts back to. */
typedef struct dlock_cancel_reg {
    struct dlock_cancel_reg *prev, *next;       /* the token's mutex */
    void (*wake)(struct dlock_cancel_reg *reg); /* called under the token's mutex */
} dlock_cancel_reg;

/* Adds reg to k's list. Returns 0, or DLOCK_ECANCELED if k is fired
 * already (reg is then not added). */
int dlock_cancel_register(dlock_cancel *k, dlock_cancel_reg *reg);

/* Takes reg out of k's list: once this returns, reg's wake function is not
 * running and will not run. */
void dlock_cancel_unregister(dlock_cancel *k, dlock_cancel_reg *reg);

/* 1 if k is fired (NULL: 0). An atomic load: after dlock_cancel_fire has
 * set the flag it calls every registered wake function, so a waiter that
 * looks at the flag under its own lock before it sleeps, where the wake
 * function takes that lock, cannot miss it. */
int dlock_cancel_is_fired(dlock_cancel *k);

#endif
