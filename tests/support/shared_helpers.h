/*
 * Helpers of the shared mode's and the semaphore's tests (test_shared.c,
 * test_shared_faults.c, test_sem.c), each a cmocka executable of its own
 * against the private redis-server fx_server (tests/support/fixture.h): a
 * client writing protocol 2, its stats, a thread that takes a name in a
 * mode (or a semaphore's permit) and releases it when told, and the count
 * of shared holders Redis keeps for a name. static inline: each executable
 * uses some of them.
 */
#ifndef DLOCK_TESTS_SHARED_HELPERS_H
#define DLOCK_TESTS_SHARED_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "fixture.h"

/* A long join window, so that a test's joins fall in it on a loaded
 * machine (the default, 20 ms, is a bound for writers, not a test's). */
enum { LONG_JOIN_MS = 10000 };

/* A client writing protocol 2, which the shared mode is part of (its
 * exclusive acquires too, so that a release grants shared waiters
 * directly). */
static inline dlock_client *open_client(uint32_t join_ms)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.protocol = 2;
    cfg.join_ms = join_ms;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    return c;
}

static inline dlock_stats stats(dlock_client *c)
{
    dlock_stats s;
    assert_int_equal(dlock_client_stats(c, &s), DLOCK_OK);
    return s;
}

/* A thread that takes `name` in a mode (or, with limit > 0, a permit of
 * semaphore `name` of that limit), reports, and releases when told. */
typedef struct taker {
    dlock_client *c;
    const char *name;
    int shared;
    uint32_t limit;
    int64_t wait_ms;
    dlock_cancel *cancel;
    int rc, release_rc, unclean;
    uint64_t fence;
    int got, go, exit_holding;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
} taker;

static inline void *taker_main(void *arg)
{
    taker *t = arg;
    dlock_acquire_opts o;
    dlock_acquire_opts_init(&o);
    o.cancel = t->cancel;
    int rc = t->limit    ? dlock_sem_acquire_ex(t->c, t->name, t->limit, t->wait_ms, &o)
             : t->shared ? dlock_acquire_shared_ex(t->c, t->name, t->wait_ms, &t->fence, &o)
                         : dlock_acquire_ex(t->c, t->name, t->wait_ms, &t->fence, &o);
    int unclean = rc == DLOCK_OK && !t->limit ? dlock_unclean(t->c, t->name) : -1;
    pthread_mutex_lock(&t->mu);
    t->rc = rc;
    t->unclean = unclean;
    t->got = 1;
    pthread_cond_broadcast(&t->cv);
    while (!t->go)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    if (rc == DLOCK_OK && !t->exit_holding)
        t->release_rc = t->limit    ? dlock_sem_release(t->c, t->name)
                        : t->shared ? dlock_release_shared(t->c, t->name)
                                    : dlock_release(t->c, t->name);
    return NULL;
}

/* A taker on a thread running `run` (taker_main, or a wrapper of it). */
static inline void taker_start_on(taker *t, dlock_client *c, const char *name, int shared,
                                  int64_t wait_ms, void *(*run)(void *))
{
    memset(t, 0, sizeof *t);
    t->c = c;
    t->name = name;
    t->shared = shared;
    t->wait_ms = wait_ms;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    assert_int_equal(pthread_create(&t->th, NULL, run, t), 0);
}

static inline void taker_start(taker *t, dlock_client *c, const char *name, int shared,
                               int64_t wait_ms)
{
    taker_start_on(t, c, name, shared, wait_ms, taker_main);
}

/* A taker of a permit of semaphore `name` of limit `limit`, waiting with
 * cancel token k (NULL: none). */
static inline void taker_start_sem(taker *t, dlock_client *c, const char *name, uint32_t limit,
                                   int64_t wait_ms, dlock_cancel *k)
{
    memset(t, 0, sizeof *t);
    t->c = c;
    t->name = name;
    t->limit = limit;
    t->wait_ms = wait_ms;
    t->cancel = k;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    assert_int_equal(pthread_create(&t->th, NULL, taker_main, t), 0);
}

/* Waits until t's acquire returned; its result. */
static inline int taker_got(taker *t)
{
    pthread_mutex_lock(&t->mu);
    while (!t->got)
        pthread_cond_wait(&t->cv, &t->mu);
    int rc = t->rc;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Whether t's acquire returned yet. */
static inline int taker_done(taker *t)
{
    pthread_mutex_lock(&t->mu);
    int got = t->got;
    pthread_mutex_unlock(&t->mu);
    return got;
}

/* Lets t release (or exit) and joins it. */
static inline void taker_finish(taker *t)
{
    (void)taker_got(t);
    pthread_mutex_lock(&t->mu);
    t->go = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->th, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

/* A handle taken on a thread of its own, which then exits holding it
 * (a handle belongs to no thread), or released on one (any thread may):
 * shared 1 for a shared hold, else limit > 0 for a permit. */
typedef struct handle_job {
    dlock_client *c;
    const char *name;
    int shared;
    uint32_t limit;
    uint64_t fence;
    dlock_handle *h;
    int rc;
} handle_job;

static inline void *handle_job_take(void *arg)
{
    handle_job *j = arg;
    j->rc = j->shared  ? dlock_acquire_shared_handle(j->c, j->name, 10000, &j->fence, &j->h)
            : j->limit ? dlock_sem_acquire_handle(j->c, j->name, j->limit, 10000, &j->h)
                       : dlock_acquire_handle(j->c, j->name, 10000, &j->fence, &j->h);
    return NULL;
}

static inline void *handle_job_release(void *arg)
{
    handle_job *j = arg;
    j->rc = dlock_handle_release(j->h);
    return NULL;
}

/* Runs fn(j) on a new thread to its end; j->rc. */
static inline int handle_job_run(void *(*fn)(void *), handle_job *j)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fn, j), 0);
    pthread_join(th, NULL);
    return j->rc;
}

/* Time for a thread to reach its wait. The assertions after it hold
 * whether or not it has (they wait for results), but for the ones that say
 * a thread is still waiting, which it then is all the more. */
static inline void let_it_wait(void)
{
    fx_sleep_ms(200);
}

/* Whether client c holds `name` in Redis right now, by the script dlockctl
 * reads: the count of shared holders in the name's hash. */
static inline long long shared_fields(const char *name)
{
    redisContext *rc = fx_connect("127.0.0.1", fx_server.port);
    redisReply *r = redisCommand(rc, "HKEYS dlock:{%s}", name);
    long long n = 0;
    if (r && r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < r->elements; i++)
            n += strncmp(r->element[i]->str, "s:", 2) == 0;
    if (r)
        freeReplyObject(r);
    redisFree(rc);
    return n;
}

#endif
