/*
 * Tokens of grants whose end Redis never confirmed (unconfirmed.h).
 *
 * Invariant: u->mu guards the hash and every record in it. Records older
 * than keep_ms are dropped on the way (a put sweeps the whole set when it
 * has grown past twice its size at the last sweep), so the set holds at
 * most the names with such an end in the last keep_ms, plus that slack.
 * Lock order: u->mu is a leaf.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "common/common.h"
#include "local/unconfirmed.h"

typedef struct rec {
    UT_hash_handle hh;
    uint64_t token;
    int end;          /* how the grant of `token` ended */
    int64_t until_ns; /* monotonic */
    char name[];
} rec;

struct dlock_unconfirmed {
    pthread_mutex_t mu;
    rec *set;
    unsigned swept; /* the set's size after the last sweep */
    int64_t keep_ns;
};

dlock_unconfirmed *dlock_unconfirmed_create(uint32_t keep_ms)
{
    dlock_unconfirmed *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    pthread_mutex_init(&u->mu, NULL);
    u->keep_ns = (int64_t)keep_ms * DLOCK_NS_PER_MS;
    return u;
}

void dlock_unconfirmed_destroy(dlock_unconfirmed *u)
{
    if (!u)
        return;
    rec *r, *tmp;
    HASH_ITER(hh, u->set, r, tmp) {
        HASH_DEL(u->set, r);
        free(r);
    }
    pthread_mutex_destroy(&u->mu);
    free(u);
}

/* Drops the records past their time. Called with u->mu held. */
static void sweep(dlock_unconfirmed *u, int64_t now)
{
    rec *r, *tmp;
    HASH_ITER(hh, u->set, r, tmp) {
        if (r->until_ns <= now) {
            HASH_DEL(u->set, r);
            free(r);
        }
    }
    u->swept = HASH_COUNT(u->set);
}

void dlock_unconfirmed_put(dlock_unconfirmed *u, const char *name, uint64_t token, int end)
{
    if (!token)
        return;
    int64_t now = dlock_now_ns();
    pthread_mutex_lock(&u->mu);
    if (HASH_COUNT(u->set) >= 2 * u->swept + 16)
        sweep(u, now);
    rec *r;
    size_t len = strlen(name);
    HASH_FIND(hh, u->set, name, len, r);
    if (!r) {
        r = calloc(1, sizeof *r + len + 1);
        if (r) {
            memcpy(r->name, name, len + 1);
            HASH_ADD(hh, u->set, name[0], len, r);
        }
    }
    if (r) {
        if (token > r->token || r->until_ns <= now) {
            r->token = token;
            r->end = end;
        } else if (token == r->token && end > r->end) {
            r->end = end;
        }
        r->until_ns = now + u->keep_ns;
    }
    pthread_mutex_unlock(&u->mu);
}

uint64_t dlock_unconfirmed_get(dlock_unconfirmed *u, const char *name, int *end)
{
    uint64_t token = 0;
    *end = 0;
    pthread_mutex_lock(&u->mu);
    if (u->set) {
        rec *r;
        HASH_FIND(hh, u->set, name, strlen(name), r);
        if (r && r->until_ns > dlock_now_ns()) {
            token = r->token;
            *end = r->end;
        }
    }
    pthread_mutex_unlock(&u->mu);
    return token;
}

void dlock_unconfirmed_clear(dlock_unconfirmed *u, const char *name)
{
    pthread_mutex_lock(&u->mu);
    if (u->set) {
        rec *r;
        HASH_FIND(hh, u->set, name, strlen(name), r);
        if (r) {
            HASH_DEL(u->set, r);
            free(r);
        }
    }
    pthread_mutex_unlock(&u->mu);
}
