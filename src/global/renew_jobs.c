/*
 * Background jobs of the renewal manager (renew_jobs.h), under the rules of
 * renew.h: the job list (r->jobs) is guarded by r->mu; a job taken
 * off it belongs to the thread that runs it.
 *
 * Give-backs: a caller whose acquire has an unknown outcome hands the
 * attempt's nonce here (dlock_renew_give_back) instead of waiting for another
 * round trip; the thread wakes, releases exactly that grant if it exists, and
 * keeps trying for as long as Redis remembers the client's attempts while
 * Redis fails. Leaves (dlock_renew_leave): a waiter that gave up while Redis
 * failed is taken out of the name's queue. A failed job is tried again after
 * a pause that doubles from DLOCK_RENEW_RETRY_MS up to
 * DLOCK_RENEW_JOB_PAUSE_MAX_MS.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "common/error.h"
#include "global/renew_jobs.h"
#include "global/renew_redlock.h"
#include "global/renew_int.h"

/* Queues a background job for e (see dlock_renew_give_back and
 * dlock_renew_leave), given up after for_ms. */
static void add_job_keys(dlock_renew *r, const dlock_entry *e, char *const *keys, int leave,
                         const char *number, int protocol, int shared, uint32_t for_ms,
                         const char *sem_number, uint32_t rl_skip)
{
    size_t len[DLOCK_KEYS], total = e->name_len + 1;
    for (int k = 0; k < DLOCK_KEYS; k++)
        total += (len[k] = strlen(keys[k]) + 1);
    dlock_renew_job *o = malloc(sizeof *o + total);
    if (!o)
        return; /* the lease, if granted, expires after lease_ms; a queue
                   entry after the waiter ttl */
    char *p = o->buf;
    for (int k = 0; k < DLOCK_KEYS; k++) {
        o->keys[k] = memcpy(p, keys[k], len[k]);
        p += len[k];
    }
    o->name = memcpy(p, e->name, e->name_len + 1);
    o->leave = leave;
    o->protocol = protocol;
    o->shared = shared;
    o->switched = 0;
    o->rl_skip = rl_skip;
    snprintf(o->number, sizeof o->number, "%s", sem_number ? sem_number : "");
    snprintf(o->nonce, sizeof o->nonce, "%s", number);
    o->until_ns = dlock_now_ns() + (int64_t)for_ms * DLOCK_NS_PER_MS;
    o->next_try_ns = 0; /* at once */
    o->backoff_ns = DLOCK_RENEW_RETRY_MS * DLOCK_NS_PER_MS;
    pthread_mutex_lock(&r->mu);
    o->next = r->jobs;
    r->jobs = o;
    r->job_new = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* add_job_keys with e's own keys. */
static void add_job(dlock_renew *r, const dlock_entry *e, int leave, const char *number,
                    int protocol, int shared, uint32_t for_ms, const char *sem_number,
                    uint32_t rl_skip)
{
    add_job_keys(r, e, e->keys, leave, number, protocol, shared, for_ms, sem_number, rl_skip);
}

void dlock_renew_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce,
                           int protocol, int shared)
{
    /* As long as Redis remembers the client's attempts for this name: a
     * later copy of the attempt is refused by Redis itself. */
    dlock_trace_event(r->cfg.trace, "giveback", e->name, "%s %d %c", nonce, protocol,
                      shared ? 's' : 'x');
    add_job(r, e, 0, nonce, protocol, shared, r->cfg.keep_ms, NULL, 0);
}

void dlock_renew_sem_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce)
{
    char number[24];
    snprintf(number, sizeof number, "%" PRIu64, ck_pr_faa_64(r->cfg.attempts, 1) + 1);
    dlock_trace_event(r->cfg.trace, "sem.giveback", e->name, "%s %s", nonce, number);
    add_job(r, e, 0, nonce, DLOCK_RENEW_SEM, 0, r->cfg.keep_ms, number, 0);
}

void dlock_renew_leave(dlock_renew *r, const dlock_entry *e, const char *number,
                       int protocol)
{
    /* After twice the waiter ttl the client's queue entry is dead anyway. */
    dlock_trace_event(r->cfg.trace, "leavebg", e->name, "%s %d", number, protocol);
    add_job(r, e, 1, number, protocol, 0, 2 * r->cfg.waiter_ttl_ms, NULL, 0);
}

void dlock_renew_rl_give_back(dlock_renew *r, const dlock_entry *e, const char *nonce,
                              int shared, uint32_t skip)
{
    dlock_trace_event(r->cfg.trace, "giveback", e->name, "%s %d %c", nonce, 2, shared ? 's' : 'x');
    add_job(r, e, 0, nonce, 2, shared, r->cfg.keep_ms, NULL, skip);
}

void dlock_renew_rl_leave(dlock_renew *r, const dlock_entry *e, const char *number,
                          uint32_t skip)
{
    dlock_trace_event(r->cfg.trace, "leavebg", e->name, "%s %d", number, 2);
    add_job(r, e, 1, number, 2, 0, 2 * r->cfg.waiter_ttl_ms, NULL, skip);
}

void dlock_renew_rl_slot_job(dlock_renew *r, const dlock_entry *e, unsigned k, int leave,
                             const char *number, uint32_t skip)
{
    char *buf = malloc(dlock_redlock_slot_keys_size(e->keys)), *keys[DLOCK_SCRIPT_KEYS];
    if (!buf)
        return; /* (as add_job_keys without memory) */
    dlock_redlock_slot_keys(e->keys, k, buf, keys);
    dlock_trace_event(r->cfg.trace, leave ? "leavebg" : "giveback", e->name, "%s %d s%u", number,
                      2, k);
    add_job_keys(r, e, keys, leave, number, 2, 0,
                 leave ? 2 * r->cfg.waiter_ttl_ms : r->cfg.keep_ms, NULL, skip);
    free(buf);
}

/* Appends o's script call to c (after ASKING after an ASK redirect). 0 or
 * -1 (out of memory). */
static int append_job(dlock_renew *r, redisContext *c, const dlock_renew_job *o, int use_sha,
                      int asking)
{
    if (asking && dlock_lanes_append_asking(&r->lanes, c) != 0)
        return -1;
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    if (o->protocol == DLOCK_RENEW_SEM) {
        dlock_script_sem_release_argv(r->cfg.args, o->keys, o->name, o->number, "0", o->nonce,
                                      argv);
        return dlock_conn_append_eval(c, r->cfg.ctr, DLOCK_SCRIPT_SEM_RELEASE, use_sha,
                                      DLOCK_SCRIPT_KEYS, DLOCK_SEM_RELEASE_ARGS, argv, NULL);
    }
    if (o->leave) {
        dlock_script_leave_argv(r->cfg.args, o->keys, o->name, o->nonce, argv);
        return dlock_conn_append_eval(c, r->cfg.ctr,
                                      dlock_script_in(DLOCK_SCRIPT_LEAVE, o->protocol), use_sha,
                                      DLOCK_SCRIPT_KEYS, DLOCK_LEAVE_ARGS, argv, NULL);
    }
    dlock_script_release_argv(r->cfg.args, o->keys, o->name, "nonce", o->nonce, "0", "0", argv);
    return dlock_conn_append_eval(c, r->cfg.ctr, dlock_script_release_of(o->protocol, o->shared),
                                  use_sha,
                                  DLOCK_SCRIPT_KEYS, DLOCK_RELEASE_ARGS, argv, NULL);
}

/* What a job's reply means: done, or to be tried again later, in the other
 * protocol when its script refused the name's data as that one's (the
 * grant or the queue entry it is about may be there, and the refusal wrote
 * nothing): a give-back at each such refusal until its time is over (a
 * late copy of its attempt may be granted in either protocol meanwhile),
 * a leave once. */
static int job_result(dlock_renew_job *o, const redisReply *rep)
{
    enum { UNKNOWN = -1, NOT_OWNED = 0, DONE = 1 };
    if (o->protocol == DLOCK_RENEW_SEM)
        /* any answer: given back, or none to give back, and a late copy
         * of the attempt is refused from now on (its number is older) */
        return rep && (rep->type == REDIS_REPLY_INTEGER || dlock_conn_is_other_protocol(rep))
                   ? DONE
                   : UNKNOWN;
    int other = dlock_conn_refusal_protocol(rep);
    if (other != o->protocol && other >= DLOCK_PROTOCOL_MIN && other <= DLOCK_PROTOCOL_MAX &&
        !(o->leave && o->switched) && !o->shared) {
        o->protocol = other;
        o->switched = 1;
        return UNKNOWN;
    }
    if (dlock_conn_is_other_protocol(rep))
        return DONE; /* refused, and refused again while that data lives: a grant
                        of ours under it, if any, expires by itself */
    if (!rep || rep->type != REDIS_REPLY_INTEGER)
        return UNKNOWN;
    if (o->leave)
        return DONE; /* it ran: whatever it found, the queue entry is gone */
    /* 1, 2: released (now or before); 3: a newer attempt was seen, so no
     * grant of this one exists or can appear; 0: not (yet) granted. */
    return rep->integer >= 1 ? DONE : NOT_OWNED;
}

/* One try of each job due now (a release for a give-back, a leave), in one
 * pipeline per lane, all lanes in flight at once. A give-back is done when
 * Redis released its grant, a leave when it ran. A give-back that Redis says
 * it does not own stays a while: its acquire may still be on its way to
 * Redis (another connection, served later), so it is tried again with a
 * pause (above) until its job's time is over; so is a job Redis did not
 * answer. A NOSCRIPT or a redirect is run again at once, on
 * its own. Called without locks. Returns when the next try is due
 * (DLOCK_NEVER: none left). */
int64_t dlock_renew_jobs_run(dlock_renew *r, int64_t until)
{
    if (r->cfg.redlock)
        return dlock_renew_redlock_jobs(r, until);
    pthread_mutex_lock(&r->mu);
    dlock_renew_job *list = r->jobs;
    r->jobs = NULL;
    pthread_mutex_unlock(&r->mu);
    int64_t now = dlock_now_ns();
    dlock_renew_job *due = NULL, *later = NULL, *next;
    for (dlock_renew_job *o = list; o; o = next) { /* split: due now, or later */
        next = o->next;
        dlock_renew_job **to = o->next_try_ns <= now ? &due : &later;
        o->next = *to;
        *to = o;
    }
    enum { UNKNOWN = -1, RELEASED = 1 };
    dlock_lanes_pass(&r->lanes); /* each lane is opened at most once for these tries */
    for (dlock_renew_job *o = due; o; o = o->next) {
        unsigned slot;
        o->result = UNKNOWN;
        o->redo = o->eval = o->asking = 0;
        o->lane = dlock_lanes_route(&r->lanes, o->keys[0], &slot);
        redisContext *c = dlock_lanes_open(&r->lanes, o->lane);
        o->sent = c && append_job(r, c, o, 1, 0) == 0;
        if (o->sent)
            r->lanes.v[o->lane].wrote = 1;
        else if (c)
            dlock_lanes_oom(c);
    }
    int64_t deadline = dlock_lanes_deadline(&r->lanes);
    unsigned trips = dlock_lanes_flush(&r->lanes, deadline);
    dlock_count(&r->cfg.ctr->redis_round_trips, trips);
    /* Read every reply of the pipelines before running anything again. */
    for (dlock_renew_job *o = due; o; o = o->next) {
        redisContext *c = o->sent ? dlock_lanes_get(&r->lanes, o->lane) : NULL;
        redisReply *rep = NULL;
        if (!c || c->err || dlock_conn_read(c, deadline, &rep) != 0)
            continue;
        int lane = o->lane, kind;
        if (dlock_conn_is_noscript(rep)) {
            o->redo = o->eval = 1;
        } else if ((kind = dlock_lanes_redirect(&r->lanes, rep, o->lane, &lane)) !=
                   DLOCK_REDO_NONE) {
            o->redo = 1;
            o->asking = kind == DLOCK_REDO_ASK;
            o->lane = lane;
        } else {
            o->result = job_result(o, rep);
        }
        dlock_conn_check_master(c, rep); /* then dropped below */
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT (again with EVAL), or the slot
     * moved (again on its master; after ASKING for an ASK): one at a time. */
    for (dlock_renew_job *o = due; o; o = o->next) {
        if (!o->redo)
            continue;
        redisContext *c = dlock_lanes_open(&r->lanes, o->lane);
        redisReply *rep = NULL;
        deadline = dlock_lanes_deadline(&r->lanes);
        if (!c)
            continue;
        if (append_job(r, c, o, !o->eval, o->asking) != 0) {
            dlock_lanes_oom(c);
            continue;
        }
        if (dlock_conn_flush(c, deadline) == 0 &&
            dlock_lanes_read_reply(c, o->asking, deadline, &rep) == 0) {
            dlock_count(&r->cfg.ctr->redis_round_trips, 1);
            o->result = job_result(o, rep);
            dlock_conn_check_master(c, rep);
            freeReplyObject(rep);
        }
    }
    dlock_lanes_drop_failed(&r->lanes);
    now = dlock_now_ns();
    for (dlock_renew_job *o = due; o; o = next) {
        next = o->next;
        if (o->result == RELEASED || now >= o->until_ns) {
            free(o);
            continue;
        }
        o->next_try_ns = now + o->backoff_ns;
        if (o->backoff_ns < DLOCK_RENEW_JOB_PAUSE_MAX_MS * DLOCK_NS_PER_MS / 2)
            o->backoff_ns *= 2;
        else
            o->backoff_ns = DLOCK_RENEW_JOB_PAUSE_MAX_MS * DLOCK_NS_PER_MS;
        o->next = later;
        later = o;
    }
    int64_t next_due = DLOCK_NEVER;
    for (dlock_renew_job *o = later; o; o = o->next)
        if (o->next_try_ns < next_due)
            next_due = o->next_try_ns;
    if (later) {
        pthread_mutex_lock(&r->mu);
        dlock_renew_job **tail = &later;
        while (*tail)
            tail = &(*tail)->next;
        *tail = r->jobs;
        r->jobs = later;
        pthread_mutex_unlock(&r->mu);
    }
    return next_due;
}

/* The script that gives back `it` at stop: its grant's release, or a
 * semaphore's (every permit held). */
static dlock_script_id release_all_script(const dlock_renew_item *it)
{
    return it->protocol == DLOCK_RENEW_SEM ? DLOCK_SCRIPT_SEM_RELEASE
                                           : dlock_script_release_of(it->protocol, it->shared);
}

/* Fills argv for release_all_script(it): `last` the last token handed out
 * (a semaphore's: the permits held), `number` a semaphore's call number.
 * Returns the argument count. "1" in a lock's: the client closes while a
 * thread holds it (acquire.lua, End). */
static int release_all_argv(dlock_renew *r, const dlock_renew_item *it, const char *last,
                            const char *number, const char **argv)
{
    if (it->protocol == DLOCK_RENEW_SEM) {
        dlock_script_sem_release_argv(r->cfg.args, it->e->keys, it->e->name, number, last, "0",
                                      argv);
        return DLOCK_SEM_RELEASE_ARGS;
    }
    dlock_script_release_argv(r->cfg.args, it->e->keys, it->e->name, "token", it->token, last,
                              "1", argv);
    return DLOCK_RELEASE_ARGS;
}

void dlock_renew_release_all(dlock_renew *r)
{
    if (!r->items)
        return;
    if (r->cfg.redlock) {
        dlock_renew_redlock_release_all(r);
        return;
    }
    typedef struct rel {
        dlock_renew_item *it;
        char last[24];   /* the last token handed out; a semaphore's permits held */
        char number[24]; /* a semaphore's release: its call number */
        int lane, sent, done;
    } rel;
    rel *v = malloc(sizeof *v * r->count);
    if (!v)
        return;
    size_t n = 0;
    dlock_lanes_pass(&r->lanes); /* each lane is opened at most once */
    for (dlock_renew_item *it = r->items; it; it = it->next, n++) {
        rel *x = &v[n];
        unsigned slot;
        x->it = it;
        x->done = 0;
        pthread_mutex_lock(&it->e->mu);
        snprintf(x->last, sizeof x->last, "%" PRIu64,
                 it->e->lease.sem ? (uint64_t)it->e->m.held : it->e->lease.token);
        pthread_mutex_unlock(&it->e->mu);
        if (it->protocol == DLOCK_RENEW_SEM)
            snprintf(x->number, sizeof x->number, "%" PRIu64,
                     ck_pr_faa_64(r->cfg.attempts, 1) + 1);
        x->lane = dlock_lanes_route(&r->lanes, it->e->keys[DLOCK_KEY_LEASE], &slot);
        redisContext *c = dlock_lanes_open(&r->lanes, x->lane);
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        int nargs = release_all_argv(r, x->it, x->last, x->number, argv);
        x->sent = c && dlock_conn_append_eval(c, r->cfg.ctr, release_all_script(it), 1,
                                              DLOCK_SCRIPT_KEYS, nargs, argv, NULL) == 0;
        if (x->sent)
            r->lanes.v[x->lane].wrote = 1;
        else if (c)
            dlock_lanes_oom(c);
    }
    int64_t deadline = dlock_lanes_deadline(&r->lanes);
    dlock_count(&r->cfg.ctr->redis_round_trips, dlock_lanes_flush(&r->lanes, deadline));
    for (size_t i = 0; i < n; i++) {
        redisContext *c = v[i].sent ? dlock_lanes_get(&r->lanes, v[i].lane) : NULL;
        redisReply *rep = NULL;
        if (!c || c->err || dlock_conn_read(c, deadline, &rep) != 0)
            continue;
        v[i].done = !dlock_conn_is_noscript(rep);
        freeReplyObject(rep);
    }
    /* A restarted server answered NOSCRIPT: run those again with EVAL. */
    for (size_t i = 0; i < n; i++) {
        redisContext *c = v[i].sent && !v[i].done ? dlock_lanes_get(&r->lanes, v[i].lane) : NULL;
        if (!c || c->err)
            continue;
        const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
        int nargs = release_all_argv(r, v[i].it, v[i].last, v[i].number, argv);
        redisReply *rep =
            dlock_conn_eval(c, r->cfg.ctr, dlock_lanes_deadline(&r->lanes),
                            release_all_script(v[i].it), DLOCK_SCRIPT_KEYS, nargs, argv, NULL);
        if (rep)
            freeReplyObject(rep);
    }
    free(v);
}
