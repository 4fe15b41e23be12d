/*
 * The renewal manager's thread (renew.h: dlock_renew_start and
 * dlock_renew_stop), under the rules of renew.h. It runs the rounds
 * (renew_round.c), the background jobs (renew_jobs.c) and the periodic
 * check of the server.
 *
 * Between rounds the thread sleeps until the next period (lease/3), or sooner
 * when the earliest validity deadline of a lease that could not be renewed
 * comes first, or a caller asked for a round by some time (dlock_renew_by,
 * for a direct grant valid for the waiter ttl only) or at once
 * (dlock_renew_kick), or after a short retry pause when Redis failed. A due
 * round goes before the background jobs.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "global/renew.h"
#include "global/renew_jobs.h"
#include "global/renew_redlock.h"
#include "global/renew_round.h"
#include "global/renew_int.h"

/* The periodic check of the server's settings (version, eviction policy:
 * an operator may change them under running clients), with INFO on each
 * open lane (every master in Cluster mode), or lane 0 opened for it; in
 * Redlock mode one node per check, in turn, given up at `until`, when the
 * next round is due (renew_redlock.h). On the manager thread, without
 * r->mu. */
static void check_server(dlock_renew *r, int64_t until)
{
    if (!r->cfg.server)
        return;
    if (r->cfg.redlock) {
        dlock_renew_redlock_check(r, until); /* each node in turn */
        return;
    }
    dlock_lanes_pass(&r->lanes); /* a pass of its own: a failed lane may reconnect */
    unsigned n = r->lanes.n ? r->lanes.n : 1;
    int asked = 0, rc = DLOCK_OK;
    char why[256] = "";
    for (unsigned i = 0; i < n && rc == DLOCK_OK; i++) {
        /* the server's lane, reconnected if it failed (its setup checks the
         * server too); a cluster's masters whose lanes are open */
        redisContext *c = r->cfg.conn->cluster ? dlock_lanes_get(&r->lanes, (int)i)
                          : i == 0             ? dlock_lanes_open(&r->lanes, 0)
                                               : NULL;
        if (!c && !r->cfg.conn->cluster && i == 0 && r->lanes.n &&
            r->lanes.v[0].open_rc == DLOCK_ESERVER) {
            asked = 1;
            rc = DLOCK_ESERVER;
            snprintf(why, sizeof why, "%s", r->lanes.v[0].open_err);
            break;
        }
        if (!c || c->err)
            continue; /* not answered: the renewals say so */
        const char *argv[1] = {"INFO"};
        redisReply *rep =
            dlock_conn_command(c, r->cfg.ctr, r->cfg.conn->command_timeout_ms, 1, argv);
        if (rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)) {
            asked = 1;
            rc = dlock_conn_check_info(rep->str, r->cfg.conn->protocol);
            if (rc != DLOCK_OK)
                snprintf(why, sizeof why, "%s", dlock_last_error());
        }
        if (rep)
            freeReplyObject(rep);
    }
    if (asked)
        r->cfg.server(r->cfg.lost_arg, rc, why);
}

static void *manager_main(void *arg)
{
    dlock_renew *r = arg;
    int64_t next = dlock_now_ns() + r->period_ns;
    int64_t job_retry = 0, next_check = dlock_now_ns() + r->check_ns;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dlock_now_ns();
        if (now >= next_check && now < next && r->cfg.server) { /* (a due round goes first) */
            next_check = now + r->check_ns;
            int64_t until = r->due < next ? r->due : next;
            pthread_mutex_unlock(&r->mu);
            check_server(r, until);
            if (r->cfg.redlock)
                dlock_renew_redlock_seed(r, until); /* restarted nodes, once due */
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (r->kick) {
            r->kick = 0;
            next = now;
            /* Redis is back (the subscriber reconnected): the round goes at
             * once, without waiting out a failed lane's backoff, so that it
             * finds leases a restarted Redis forgot within a round trip */
            dlock_lanes_reset_backoff(&r->lanes);
        }
        if (r->due < next)
            next = r->due;
        /* A due round goes first: it keeps held leases (a direct grant's
         * first renewal has the waiter ttl only) from running out while
         * give-backs, each up to a command timeout, are worked off. */
        if (now < next && r->jobs && (now >= job_retry || r->job_new)) {
            r->job_new = 0;
            pthread_mutex_unlock(&r->mu);
            job_retry = dlock_renew_jobs_run(r, next);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (now < next) {
            int64_t wake = next;
            if (r->jobs && job_retry < wake)
                wake = job_retry;
            if (r->cfg.server && next_check < wake)
                wake = next_check;
            /* With nothing registered, sleep until a lease or a job
             * arrives (or the server's check is due); a first lease's
             * renewal is due one period later. */
            if (r->count == 0 && !r->jobs) {
                struct timespec ts = dlock_ts(r->cfg.server ? next_check : DLOCK_NEVER);
                if (r->cfg.server)
                    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
                else
                    pthread_cond_wait(&r->cv, &r->mu);
                if (r->count)
                    next = dlock_now_ns() + r->period_ns;
            } else {
                struct timespec ts = dlock_ts(wake);
                pthread_cond_timedwait(&r->cv, &r->mu, &ts);
            }
            continue;
        }
        r->due = DLOCK_NEVER; /* this round renews every lease registered now */
        pthread_mutex_unlock(&r->mu);
        next = dlock_renew_round(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int dlock_renew_start(const dlock_renew_cfg *cfg, dlock_renew **out)
{
    dlock_renew *r = calloc(1, sizeof *r);
    if (!r)
        return DLOCK_ENOMEM;
    r->cfg = *cfg;
    r->lanes.conn = cfg->conn;
    r->lanes.ctr = cfg->ctr;
    r->period_ns = (int64_t)cfg->lease_ms * DLOCK_NS_PER_MS / 3;
    r->check_ns = dlock_renew_check_ns(cfg->lease_ms);
    r->due = DLOCK_NEVER;
    r->drift_ns = dlock_renew_drift_ns(cfg->lease_ms);
    pthread_mutex_init(&r->mu, NULL);
    DLOCK_LOCKSTAT_NAME(&r->mu, "renew");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&r->wrote, NULL);
    sigset_t old;
    dlock_block_signals(&old); /* the thread inherits a mask blocking all signals */
    int created = pthread_create(&r->thread, NULL, manager_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (created != 0) {
        pthread_cond_destroy(&r->wrote);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return dlock_err_set(DLOCK_ENOMEM, "cannot start the renewal thread");
    }
    *out = r;
    return DLOCK_OK;
}
void dlock_renew_stop(dlock_renew *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);

    /* On the caller's thread from here; every exchange keeps its deadline
     * and raises no SIGPIPE (conn.h). */
    for (dlock_renew_job *o = r->jobs; o; o = o->next)
        o->next_try_ns = 0; /* one last try for every dlock_renew_job */
    dlock_renew_jobs_run(r, DLOCK_NEVER);
    dlock_renew_release_all(r);
    while (r->jobs) {
        dlock_renew_job *o = r->jobs;
        r->jobs = o->next;
        free(o);
    }
    while (r->items) {
        dlock_entry *e = r->items->e;
        pthread_mutex_lock(&e->mu);
        if (e->lease.state == DLOCK_LEASE_HELD) {
            e->lease.state = DLOCK_LEASE_NONE;
            dlock_count(&r->cfg.ctr->leases_held, (uint64_t)-1);
        }
        int drop = dlock_renew_remove(r, e);
        pthread_mutex_unlock(&e->mu);
        if (drop)
            dlock_table_put(r->cfg.table, e);
    }
    dlock_lanes_close(&r->lanes);
    pthread_cond_destroy(&r->wrote);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}
