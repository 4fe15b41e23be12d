/*
 * The Redis calls of a counting semaphore (sem_rpc.h). No state of its own:
 * the caller owns e's call slot (local/sem.h, M2) and writes what they
 * return into the entry under e->mu.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "local/rpc.h"
#include "local/sem_rpc.h"

int dlock_sem_rpc_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t)
{
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_SEM_ACQUIRE_ARGS];
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++)
        argv[i] = e->keys[i];
    char limit[16], doubt[24];
    snprintf(limit, sizeof limit, "%" PRIu32, t->limit);
    snprintf(doubt, sizeof doubt, "%" PRIu64, t->doubt);
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    a[0] = c->id;
    a[1] = c->lease_str;
    a[2] = t->nonce;
    a[3] = "1";
    a[4] = c->waiter_ttl_str;
    a[5] = t->queue ? "1" : "0";
    a[6] = c->keep_str;
    a[7] = c->conn.client_name;
    a[8] = limit;
    a[9] = doubt;
    a[10] = c->wake_prefix;
    a[11] = e->name;
    redisReply *rep;
    int sent, acked;
    t->in_doubt = 0;
    t->answered = 0;
    t->sent_boot = dlock_boot_ns();
    if (c->trace) {
        char at[48]; /* its send, and which entry of the name (made anew when freed) */
        snprintf(at, sizeof at, "%" PRId64 " %" PRIu64, t->sent_boot, e->made);
        dlock_trace_argv(c->trace, "sem.try", e->name, at,
                         DLOCK_SCRIPT_KEYS + DLOCK_SEM_ACQUIRE_ARGS, argv, NULL);
    }
    int rc = dlock_rpc_script(c, DLOCK_SCRIPT_SEM_ACQUIRE, DLOCK_SEM_ACQUIRE_ARGS, argv,
                              "semaphore acquire", e->name, t->deadline, &rep, &sent, &acked, 1,
                              t->cancel);
    if (rc != DLOCK_OK) {
        t->in_doubt = sent;
        dlock_trace_event(c->trace, "sem.rep", e->name, "%s %d 0 -9 0 -1 %d", t->nonce, sent,
                          rc);
        return rc;
    }
    t->answered = 1;
    long long traced_k = -9, traced_v = 0; /* the reply's two integers, for the trace */
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_INTEGER) {
        long long k = rep->element[0]->integer, v = rep->element[1]->integer;
        traced_k = k;
        traced_v = v;
        if (k == 1 && c->min_replicas && (acked < 0 || (uint32_t)acked < c->min_replicas)) {
            /* a failover now could lose the grant: given back (by the
             * caller, as an attempt in doubt) */
            t->in_doubt = 1;
            rc = dlock_err_set(DLOCK_EREDIS, "the grant of a permit of '%s' reached %d of the "
                               "%" PRIu32 " replicas min_replicas asks for (WAIT); given back",
                               e->name, acked < 0 ? 0 : acked, c->min_replicas);
        } else if (k == 1 && v >= 1) {
            t->held = v > UINT32_MAX ? UINT32_MAX : (unsigned)v;
            rc = DLOCK_OK;
        } else if (k == 0) {
            t->free = v;
            t->queued = rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_INTEGER
                            ? rep->element[2]->integer
                            : -1;
            rc = DLOCK_EBUSY;
        } else {
            /* a newer call of this client was seen: its calls on a name go
             * one at a time (M2), so only a reordering on the way does it */
            rc = dlock_err_set(DLOCK_EREDIS, "redis refused a stale acquire attempt of the "
                               "semaphore '%s'", e->name);
        }
    } else if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "DLOCKLIMIT ", 11) == 0) {
        long long theirs = strtoll(rep->str + 11, NULL, 10);
        rc = dlock_err_set(DLOCK_EINVAL, "the semaphore '%s' is used with limit %lld by its "
                           "holders or waiters; this call gives limit %" PRIu32, e->name,
                           theirs, t->limit);
    } else if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "DLOCKARG", 8) == 0) {
        rc = dlock_err_set(DLOCK_EINVAL, "redis refused the semaphore acquire of '%s': %s",
                           e->name, rep->str);
    } else {
        rc = dlock_err_set(dlock_conn_reply_code(rep), "refused by the server: redis semaphore "
                           "acquire of '%s': %s", e->name,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    }
    dlock_trace_event(c->trace, "sem.rep", e->name, "%s 1 1 %lld %lld %d %d", t->nonce, traced_k,
                      traced_v, acked, rc);
    freeReplyObject(rep);
    return rc;
}

int dlock_sem_rpc_release(dlock_client *c, dlock_entry *e, unsigned count)
{
    char number[24], n[16];
    dlock_rpc_number(c, number);
    snprintf(n, sizeof n, "%u", count);
    dlock_trace_event(c->trace, "sem.rel", e->name, "%s %u", number, count);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_SEM_RELEASE_ARGS];
    dlock_script_sem_release_argv(&c->args, e->keys, e->name, number, n, "0", argv);
    redisReply *rep;
    int sent;
    int rc = dlock_rpc_script(c, DLOCK_SCRIPT_SEM_RELEASE, DLOCK_SEM_RELEASE_ARGS, argv,
                              "semaphore release", e->name, DLOCK_NEVER, &rep, &sent, NULL, 0,
                              NULL);
    if (rc != DLOCK_OK)
        return rc;
    if (rep->type == REDIS_REPLY_INTEGER && (rep->integer == 1 || rep->integer == 2))
        rc = DLOCK_OK;
    else if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 0)
        rc = dlock_err_set(DLOCK_ELOST, "the permits of '%s' were gone from redis at release "
                           "(their lease ran out)", e->name);
    else
        rc = dlock_err_set(rep->type == REDIS_REPLY_ERROR ? dlock_conn_reply_code(rep)
                                                          : DLOCK_EREDIS,
                           "refused by the server: redis semaphore release of '%s': %s",
                           e->name, rep->type == REDIS_REPLY_ERROR ? rep->str
                                    : "a newer call of this client was seen first");
    freeReplyObject(rep);
    return rc;
}

void dlock_sem_rpc_leave(dlock_client *c, dlock_entry *e, uint64_t gave_up)
{
    char number[24], attempt[24];
    dlock_rpc_number(c, number);
    snprintf(attempt, sizeof attempt, "%" PRIu64, gave_up);
    dlock_trace_event(c->trace, "sem.leave", e->name, "%s %s", number, attempt);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_SEM_LEAVE_ARGS];
    dlock_script_sem_leave_argv(&c->args, e->keys, e->name, number, attempt, argv);
    redisReply *rep;
    int sent;
    char keep[256]; /* the caller's own error message stays the one reported */
    snprintf(keep, sizeof keep, "%s", dlock_last_error());
    if (dlock_rpc_script(c, DLOCK_SCRIPT_SEM_LEAVE, DLOCK_SEM_LEAVE_ARGS, argv, "semaphore leave",
                         e->name, DLOCK_NEVER, &rep, &sent, NULL, 0, NULL) != DLOCK_OK) {
        dlock_renew_sem_give_back(c->renew, e, attempt);
    } else {
        if (rep->type != REDIS_REPLY_INTEGER)
            dlock_renew_sem_give_back(c->renew, e, attempt);
        freeReplyObject(rep);
    }
    dlock_err_set(0, "%s", keep);
}
