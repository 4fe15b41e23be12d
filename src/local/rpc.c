/*
 * The Redis calls of one lock (rpc.h). No state of its own: the entry
 * fields it writes are written under client.h's rules by the thread that
 * makes the call.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local/client.h"
#include "common/error.h"
#include "local/rpc.h"
#include "conn/script.h"

/*
 * Runs a script through the batcher (pipelined with other threads' calls
 * when every pooled connection is busy) and returns its reply in *out.
 * A pooled connection that the server closed while it sat idle fails at once
 * with EOF or a reset; the call is then made again, at most pool_size + 1
 * times. That is safe even if the first try did run, because every script is
 * idempotent for its caller: a release matches its grant, and an acquire
 * retried with the same nonce is granted again in place. The wait for a
 * connection or a batch ends at the caller's deadline (DLOCK_NEVER: none but
 * the exchanges' own); the exchange itself has one command timeout. Returns
 * DLOCK_OK, or an error (DLOCK_EREDIS, DLOCK_ETIMEDOUT, DLOCK_ESERVER) with
 * the message set and *sent telling whether the command may have reached
 * Redis. Called without any lock held (the caller may lead a batch).
 */
/* The kind of a failed exchange, for the start of a DLOCK_EREDIS message
 * (unreachable, timed out, or refused by the server, which the callers of
 * replies say themselves), from the connection's error text. */
static const char *redis_failure(const char *err)
{
    if (strstr(err, "refused by the server") || strstr(err, "not a Redis server"))
        return ""; /* it says so itself (conn.c: a setup step the server refused, or
                      answered in another protocol) */
    if (strstr(err, "timed out") || strstr(err, "came free"))
        return "timed out: ";
    return "unreachable: ";
}

/* Cluster mode: the node serving slot now, or `node` if none is known (no
 * refresh is waited for: the deadline is now). */
static dlock_cluster_node *route_or(dlock_client *c, unsigned slot, dlock_cluster_node *node)
{
    dlock_cluster_node *n = dlock_cluster_route(c->cluster, slot, dlock_now_ns());
    return n ? n : node;
}

/* The stop flags a waiting acquire's call looks at between TRYAGAIN
 * retries (dlock_client_stop_rc): none for releases and leaves. */
typedef struct stop_on {
    int acquire;        /* a waiting acquire: a shutdown stops it */
    dlock_cancel *k;    /* its cancel token, or NULL */
} stop_on;

static int call_script(dlock_client *c, dlock_script_id id, int nargs, const char **argv,
                       const char *what, const char *name, int64_t deadline, redisReply **out,
                       int *sent, int *acked, stop_on stop)
{
    *sent = 0;
    if (acked)
        *acked = -1;
    dlock_batch *b = c->batch;
    dlock_cluster_node *node = NULL;
    unsigned slot = 0, redirects = 0, busy = 0;
    int asking = 0;
    /* TRYAGAIN and CLUSTERDOWN are retried until the caller's deadline; a
     * call without one (a release, a wait forever) for 10 command timeouts. */
    int64_t busy_until = deadline != DLOCK_NEVER
                             ? deadline
                             : dlock_now_ns() + 10 * (int64_t)c->conn.command_timeout_ms *
                                                    DLOCK_NS_PER_MS;
    if (c->cluster) {
        slot = dlock_cluster_slot(argv[0], strlen(argv[0]));
        if (!(node = dlock_cluster_route(c->cluster, slot, deadline)))
            return dlock_err_set(DLOCK_EREDIS, "redis %s of '%s': %s", what, name,
                                 dlock_last_error());
    }
    for (uint32_t attempt = 0;;) {
        if (node)
            b = node->batch;
        dlock_call call = {.id = id, .nkeys = DLOCK_SCRIPT_KEYS, .nargs = nargs, .argv = argv,
                           .deadline = deadline, .asking = asking};
        int rc = dlock_batch_run(b, &call);
        if (rc == DLOCK_OK && node) {
            /* Cluster: a redirect or a busy slot did not run the script */
            char host[256];
            int port;
            unsigned to;
            int kind = dlock_cluster_redirect(call.reply, node->cfg.host, &to, host, sizeof host,
                                              &port);
            if (kind != DLOCK_REDIRECT_NONE && redirects < DLOCK_CLUSTER_REDIRECTS_MAX) {
                dlock_cluster_node *next = dlock_cluster_node_at(c->cluster, host, port);
                if (next) {
                    redirects++;
                    freeReplyObject(call.reply);
                    if (kind == DLOCK_REDIRECT_MOVED)
                        dlock_cluster_set_slot(c->cluster, to, next);
                    asking = kind == DLOCK_REDIRECT_ASK; /* this once, no map change */
                    node = next;
                    continue;
                }
            }
            if (dlock_cluster_is_busy(call.reply)) {
                /* TRYAGAIN (a migration under way) or CLUSTERDOWN (a
                 * failover): 10, 20, 40 .. 100 ms pauses until busy_until
                 * (a call does not give up before its deadline while the
                 * cluster says to retry) */
                int64_t pause = (int64_t)(10 << (busy < 4 ? busy : 4)) * DLOCK_NS_PER_MS;
                if (pause > 100 * DLOCK_NS_PER_MS)
                    pause = 100 * DLOCK_NS_PER_MS;
                /* (a waiting acquire stops on a shutdown or its cancel
                 * token: the caller returns ECLOSED or ECANCELED) */
                if (dlock_now_ns() + pause < busy_until &&
                    !(stop.acquire && dlock_client_stop_rc(c, stop.k) != DLOCK_OK)) {
                    busy++;
                    freeReplyObject(call.reply);
                    struct timespec ts = {0, (long)pause};
                    nanosleep(&ts, NULL);
                    if (!asking)
                        node = route_or(c, slot, node);
                    continue;
                }
            }
        }
        if (rc == DLOCK_OK) {
            *sent = 1;
            *out = call.reply;
            if (acked)
                *acked = call.acked;
            return DLOCK_OK;
        }
        if (node && rc == DLOCK_EREDIS)
            dlock_cluster_want_refresh(c->cluster); /* a failover? the subscriber asks */
        if (!call.sent)
            return dlock_err_set(rc, "%s%s", rc == DLOCK_EREDIS ? redis_failure(call.err) : "",
                                 call.err);
        *sent = 1;
        rc = dlock_err_set(rc, "%sredis %s of '%s': %s", redis_failure(call.err), what, name,
                           call.err);
        if (!call.closed || ++attempt > c->pool_size)
            return rc;
        if (node && !asking)
            node = route_or(c, slot, node);
    }
}

int dlock_rpc_script(dlock_client *c, dlock_script_id id, int nargs, const char **argv,
                     const char *what, const char *name, int64_t deadline, redisReply **out,
                     int *sent, int *acked, int acquire, dlock_cancel *k)
{
    return call_script(c, id, nargs, argv, what, name, deadline, out, sent, acked,
                       (stop_on){acquire, k});
}

/* The other protocol a call refused with `rep` should be sent again in (rep
 * refuses data of protocol P, which this build speaks, other than
 * `sent_in`), or 0. A refusal writes nothing, and every call matches its
 * own attempt, grant or queue entry, so sending it again there is safe. */
static int resend_in(const redisReply *rep, int sent_in)
{
    int p = dlock_conn_refusal_protocol(rep);
    return p >= DLOCK_PROTOCOL_MIN && p <= DLOCK_PROTOCOL_MAX && p != sent_in ? p : 0;
}

/* An acquire refused as the other protocol's data is sent again in it at
 * most this many times in a row: once, and once more if the name moved
 * back between the two sends (the holder in the first protocol released,
 * another client took the name in the second). */
enum { DLOCK_RPC_RESENDS = 2 };

/* The acquire script, as attempt t->nonce, in protocol t->protocol; if
 * that protocol's script refuses the name's data as the other protocol's,
 * the same attempt again in that one (it wrote nothing: the number is
 * still unused in Redis), with t->protocol set to it, up to
 * DLOCK_RPC_RESENDS times. Called by e's poller without e->mu, waiting for
 * a connection until t->deadline. Sets t->sent_boot (when it was sent, on
 * the boot clock) and returns DLOCK_OK with t->token and t->unclean,
 * DLOCK_EBUSY with t->pttl_ms and t->busy, or an error of call_script. */
int dlock_rpc_acquire(dlock_client *c, dlock_entry *e, dlock_rpc_try *t)
{
    const char *nonce = t->nonce;
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS];
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++)
        argv[i] = e->keys[i];
    const char **a = argv + DLOCK_SCRIPT_KEYS;
    a[0] = c->id;
    a[1] = c->lease_str;
    a[2] = nonce;
    a[3] = c->pass_limit_str;
    a[4] = c->waiter_ttl_str;
    a[5] = t->queue ? "1" : "0";
    a[6] = c->keep_str;
    a[7] = c->conn.client_name;
    char unconfirmed[24];
    snprintf(unconfirmed, sizeof unconfirmed, "%" PRIu64, t->unconfirmed);
    a[8] = unconfirmed;
    char how[4];
    snprintf(how, sizeof how, "%d", t->unconfirmed ? t->unconfirmed_end : 0);
    a[9] = how;
    redisReply *rep;
    int sent, acked, rc;
    for (int resent = 0;; resent++) {
        t->sent_boot = dlock_boot_ns();
        if (c->trace) {
            char at[24], in[8];
            snprintf(at, sizeof at, "%" PRId64, t->sent_boot);
            snprintf(in, sizeof in, "%d", t->protocol);
            dlock_trace_argv(c->trace, "acq", e->name, at, DLOCK_SCRIPT_KEYS + DLOCK_ACQUIRE_ARGS,
                             argv, in);
        }
        rc = call_script(c, t->shared ? DLOCK_SCRIPT_ACQUIRE_SHARED
                                      : dlock_script_in(DLOCK_SCRIPT_ACQUIRE, t->protocol),
                         DLOCK_ACQUIRE_ARGS, argv, "acquire", e->name, t->deadline, &rep, &sent,
                         &acked, (stop_on){1, t->cancel});
        /* (a shared acquire has no twin in protocol 1) */
        int other = rc == DLOCK_OK && !t->shared &&
                            resent < DLOCK_RPC_RESENDS ? resend_in(rep, t->protocol)
                                                       : 0;
        if (!other)
            break;
        dlock_trace_event(c->trace, "proto", e->name, "%s %d %d", nonce, t->protocol, other);
        dlock_count(&c->ctr.protocol_resends, 1);
        freeReplyObject(rep);
        t->protocol = other;
    }
    if (rc != DLOCK_OK) {
        /* If it reached Redis the outcome is unknown: the renewal thread
         * releases exactly this attempt's grant, if there is one, without
         * delaying the caller. */
        /* (granted -8: no answer; sim/trace.lua) */
        dlock_trace_event(c->trace, "rep", e->name, "%s %d -8 0 -1 %d", nonce, sent, rc);
        t->unanswered = sent;
        if (sent)
            dlock_renew_give_back(c->renew, e, nonce, t->protocol, t->shared);
        return rc;
    }
    long long granted = -9, value = 0; /* for the trace: the reply's first two integers */
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
        rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_INTEGER) {
        granted = rep->element[0]->integer;
        value = rep->element[1]->integer;
        if (rep->element[0]->integer == 1 && c->min_replicas &&
            (acked < 0 || (uint32_t)acked < c->min_replicas)) {
            /* A failover now could lose the grant and give the name to
             * another client: it is given back (in the background, like a
             * grant of unknown outcome) and the acquire fails. */
            dlock_renew_give_back(c->renew, e, nonce, t->protocol, t->shared);
            rc = dlock_err_set(DLOCK_EREDIS, "the grant of '%s' reached %d of the %" PRIu32
                               " replicas min_replicas asks for (WAIT); given back", e->name,
                               acked < 0 ? 0 : acked, c->min_replicas);
        } else if (rep->element[0]->integer == 1) {
            t->token = (uint64_t)rep->element[1]->integer;
            /* how the grant before ended (acquire.lua, "End") */
            t->unclean = rep->elements >= 3 && rep->element[2]->type == REDIS_REPLY_INTEGER &&
                               rep->element[2]->integer > 0 &&
                               rep->element[2]->integer <= DLOCK_UNCLEAN_FORCED
                           ? (int)rep->element[2]->integer
                           : 0;
            rc = DLOCK_OK;
        } else if (rep->element[0]->integer == 0) {
            t->pttl_ms = rep->element[1]->integer;
            t->busy.holder[0] = '\0';
            t->busy.held_ms = t->busy.queue = -1;
            if (rep->elements >= 5 && rep->element[2]->type == REDIS_REPLY_STRING &&
                rep->element[3]->type == REDIS_REPLY_INTEGER &&
                rep->element[4]->type == REDIS_REPLY_INTEGER) {
                snprintf(t->busy.holder, sizeof t->busy.holder, "%s", rep->element[2]->str);
                t->busy.held_ms = rep->element[3]->integer;
                t->busy.queue = rep->element[4]->integer;
            }
            rc = DLOCK_EBUSY;
        } else {
            /* Redis saw a newer attempt of ours for this name: impossible for
             * the one attempt a poller awaits, unless attempts were reordered
             * on the way. Nothing changed in Redis. */
            rc = dlock_err_set(DLOCK_EREDIS, "redis refused a stale acquire attempt of '%s'",
                               e->name);
        }
    } else if (rep->type == REDIS_REPLY_ERROR &&
               (strncmp(rep->str, "DLOCKMODE", 9) == 0 ||
                (t->shared && dlock_conn_is_other_protocol(rep)))) {
        /* Refused, writing nothing, queueing nothing: this client still
         * holds the name in the other mode in Redis (a grant it gave up or
         * never learned, which the give-back or its waiter ttl ends; a
         * lease it found lost by its validity alone, which ends within a
         * lease time), or, to a shared try, the name's data is protocol
         * 1's, which has no shared mode (until its holders release it).
         * The poller tries again after its pause. */
        int mode = rep->str[0] == 'D' && strncmp(rep->str, "DLOCKMODE", 9) == 0;
        t->pttl_ms = -1;
        snprintf(t->busy.holder, sizeof t->busy.holder, "%s",
                 mode ? "this client in the other mode (given up or lost, not ended yet)"
                      : "a client of protocol 1 (no shared mode)");
        t->busy.held_ms = t->busy.queue = -1;
        rc = DLOCK_EBUSY;
    } else {
        rc = dlock_err_set(dlock_conn_reply_code(rep), "refused by the server: redis acquire of "
                           "'%s': %s", e->name,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
        /* This try did not run, but an earlier one on a connection that
         * closed under it (call_script retried) may have: its grant, if
         * any, is given back in the background. Not after a refusal of
         * another protocol's data: a release would be refused the same
         * way while that data lives, and a grant under it expires. */
        if (!dlock_conn_is_other_protocol(rep))
            dlock_renew_give_back(c->renew, e, nonce, t->protocol, t->shared);
    }
    dlock_trace_event(c->trace, "rep", e->name, "%s 1 %lld %lld %d %d", nonce, granted, value,
                      acked, rc);
    freeReplyObject(rep);
    return rc;
}

/* The release script of protocol `protocol` (the grant's; the other's if
 * refused as its data) for the grant with Redis token `grant`, whose last
 * token handed out was `last`; `ending` DLOCK_UNCLEAN_ABANDONED for a
 * holder thread that exited, else 0. Without e->mu, as e's releaser.
 * DLOCK_OK, DLOCK_ELOST (the grant was gone), or DLOCK_EREDIS. */
int dlock_rpc_release(dlock_client *c, dlock_entry *e, uint64_t grant, int protocol,
                      uint64_t last, int ending)
{
    char tok[24], last_tok[24];
    snprintf(tok, sizeof tok, "%" PRIu64, grant);
    snprintf(last_tok, sizeof last_tok, "%" PRIu64, last);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    dlock_script_release_argv(&c->args, e->keys, e->name, "token", tok, last_tok,
                              ending ? "1" : "0", argv);
    redisReply *rep;
    int sent, rc, other;
    /* (the releaser owns the lease's fields while it is RELEASING: I2) */
    int shared = e->lease.shared;
    for (int resent = 0;; resent = 1) {
        char in[8];
        snprintf(in, sizeof in, "%d %c", protocol, shared ? 's' : 'x');
        dlock_trace_argv(c->trace, "rel", e->name, NULL,
                         DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS, argv, in);
        rc = call_script(c, dlock_script_release_of(protocol, shared),
                         DLOCK_RELEASE_ARGS, argv, "release", e->name, DLOCK_NEVER, &rep, &sent,
                         NULL, (stop_on){0, NULL});
        /* (the grant's data gone and the name moved to the other protocol
         * meanwhile: there the grant is found gone, DLOCK_ELOST) */
        if (rc != DLOCK_OK || resent || shared || !(other = resend_in(rep, protocol)))
            break;
        dlock_trace_event(c->trace, "relproto", e->name, "%d %d", protocol, other);
        freeReplyObject(rep);
        protocol = other;
    }
    if (rc != DLOCK_OK) {
        char why[200];
        snprintf(why, sizeof why, "%s", dlock_last_error());
        return dlock_err_set(rc, "%s (the lease expires after %" PRIu32 " ms)", why,
                             c->lease_ms);
    }
    if (rep->type == REDIS_REPLY_INTEGER)
        rc = rep->integer >= 1 ? DLOCK_OK /* 2: it also woke the next waiter; 1 also when a
                                             retry finds its first try ran */
                               : dlock_err_set(DLOCK_ELOST, "the lease of '%s' was gone from "
                                                            "redis at release", e->name);
    else
        rc = dlock_err_set(dlock_conn_reply_code(rep), "refused by the server: redis release of "
                           "'%s': %s", e->name,
                           rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return rc;
}

/* The next number of the client's attempt sequence, in decimal. */
void dlock_rpc_number(dlock_client *c, char out[24])
{
    snprintf(out, 24, "%" PRIu64, ck_pr_faa_64(&c->attempts, 1) + 1);
}

/* Takes this client out of e's wait queue in Redis (its last waiter gave
 * up), passing the turn on if it had it, as call `number`, in protocol
 * `protocol` (its last try's). If Redis cannot
 * be told now, the renewal thread retries in the background; a queue entry
 * left behind all the same is skipped once its waiter ttl runs out. Without
 * e->mu, as e's poller. */
void dlock_rpc_leave(dlock_client *c, dlock_entry *e, const char *number, int protocol)
{
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_LEAVE_ARGS];
    dlock_script_leave_argv(&c->args, e->keys, e->name, number, argv);
    redisReply *rep;
    int sent, other;
    char keep[256]; /* the caller's own error message stays the one reported */
    snprintf(keep, sizeof keep, "%s", dlock_last_error());
    for (int resent = 0;; resent = 1) {
        char in[8];
        snprintf(in, sizeof in, "%d", protocol);
        dlock_trace_argv(c->trace, "leave", e->name, NULL, DLOCK_SCRIPT_KEYS + DLOCK_LEAVE_ARGS,
                         argv, in);
        if (call_script(c, dlock_script_in(DLOCK_SCRIPT_LEAVE, protocol), DLOCK_LEAVE_ARGS, argv,
                        "leave", e->name, DLOCK_NEVER, &rep, &sent, NULL,
                        (stop_on){0, NULL}) != DLOCK_OK) {
            dlock_renew_leave(c->renew, e, number, protocol);
            break;
        }
        if (!resent && (other = resend_in(rep, protocol))) {
            dlock_trace_event(c->trace, "leaveproto", e->name, "%d %d", protocol, other);
            freeReplyObject(rep);
            protocol = other;
            continue;
        }
        if (rep->type != REDIS_REPLY_INTEGER)
            dlock_renew_leave(c->renew, e, number, protocol);
        freeReplyObject(rep);
        break;
    }
    dlock_err_set(0, "%s", keep);
}
