/*
 * A renewal round (renew_round.h), under the rules of renew.h:
 *   1. under r->mu: snapshot every item (entry with an extra reference, epoch,
 *      token), append one renew script call per chunk to the connection's
 *      buffer, and set r->writing.
 *   2. without locks: write the buffer out; then, under r->mu, clear
 *      r->writing and wake releasers waiting in dlock_renew_quiesce. A
 *      releaser unregisters its grant (under r->mu) and then waits out any
 *      write in progress before it sends its release: so no renewal of a
 *      grant is ever sent after its release (a late renewal could otherwise
 *      extend a lease whose release failed).
 *   3. without locks: read the replies (one round trip for all chunks).
 *   4. per entry, under e->mu: apply the verdict only if the entry still holds
 *      the same grant (state HELD, same epoch, same item): renewed -> validity
 *      extended from the time the round was sent; gone -> lost; no answer ->
 *      lost only once the validity deadline has passed.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route/cluster.h"
#include "common/error.h"
#include "global/renew_redlock.h"
#include "global/renew_round.h"
#include "global/renew_int.h"

enum {
    CHUNK = 200, /* keys per renew script call */
};

typedef struct snap {
    dlock_entry *e;
    int lane;      /* where its renewal goes: -1 nowhere (no node known) */
    unsigned slot; /* Cluster mode: its keys' slot */
    uint64_t epoch;
    int protocol;  /* the grant's */
    dlock_renew_item *item; /* identity only: compared, never dereferenced */
    char token[24];
    int verdict; /* 1 renewed, 0 gone, -1 no answer */
    uint64_t lost_token; /* the holder's token when found lost */
} snap;

/* Called with r->mu held: copies the registry, taking a reference on each
 * entry. Returns the number copied, or -1 when out of memory. */
static ssize_t snapshot(dlock_renew *r, snap **out)
{
    *out = NULL;
    if (!r->count)
        return 0;
    snap *s = malloc(sizeof *s * r->count);
    if (!s)
        return -1;
    size_t n = 0;
    dlock_lanes_pass(&r->lanes); /* each lane is opened at most once */
    for (dlock_renew_item *it = r->items; it; it = it->next, n++) {
        dlock_table_ref(it->e); /* the item's reference keeps refs > 0 */
        s[n].e = it->e;
        s[n].epoch = it->epoch;
        s[n].protocol = it->protocol;
        s[n].item = it;
        memcpy(s[n].token, it->token, sizeof s[n].token);
        s[n].verdict = -1;
    }
    *out = s;
    return (ssize_t)n;
}

/* Ends a write begun under r->mu (r->writing set): releasers may go on. */
static void end_write(dlock_renew *r)
{
    pthread_mutex_lock(&r->mu);
    r->writing = 0;
    pthread_cond_broadcast(&r->wrote);
    pthread_mutex_unlock(&r->mu);
}

/* A round's unit of writing: one renew call for s[at .. at + k), all on
 * one lane, of one protocol (its script renews its grants), and in Cluster
 * mode of one slot (a script's keys share a slot). */
typedef struct chunk {
    size_t at, k;
    size_t m;   /* of those, the grants still registered when appended: p[at .. at + m) */
    int lane;   /* -1: no node known, or no connection: not sent */
    int redo;   /* run again in the next pass */
    int eval;   /* send as EVAL (a NOSCRIPT was seen) */
    int asking; /* send after ASKING (an ASK was seen; cleared by a MOVED) */
    int sent;   /* appended in the current pass (then sent_asking: with ASKING) */
    int sent_asking;
    int failed; /* answered with an error (TRYAGAIN, CLUSTERDOWN, ...): unknown */
} chunk;

/* The renew script of the grants filed under `protocol` (renew_int.h). */
static dlock_script_id renew_script(int protocol)
{
    return protocol == DLOCK_RENEW_SEM ? DLOCK_SCRIPT_SEM_RENEW
                                       : dlock_script_in(DLOCK_SCRIPT_RENEW, protocol);
}

/* Under r->mu: appends ch's call for its grants that are still registered
 * (a grant released since the snapshot is not renewed: its releaser did not
 * wait for this write) to c, as EVALSHA or (after NOSCRIPT) EVAL, after
 * ASKING after an ASK redirect. 1 if appended, 0 if none is left, -1 when
 * out of memory. */
static int append_chunk(dlock_renew *r, snap *s, snap **p, chunk *ch, redisContext *c)
{
    size_t m = 0;
    for (size_t i = ch->at; i < ch->at + ch->k; i++) {
        dlock_renew_item *it = s[i].e->lease.renew; /* readable under r->mu */
        if (it == s[i].item && it->epoch == s[i].epoch)
            p[ch->at + m++] = &s[i];
    }
    ch->m = m;
    if (!m)
        return 0;
    const char *argv[2 * CHUNK + 2];
    for (size_t i = 0; i < m; i++) {
        argv[i] = p[ch->at + i]->e->keys[DLOCK_KEY_LEASE];
        argv[m + 2 + i] = p[ch->at + i]->token;
    }
    argv[m] = r->cfg.args->client_id;
    argv[m + 1] = r->cfg.args->lease_ms;
    ch->sent_asking = ch->asking;
    if ((ch->asking && dlock_lanes_append_asking(&r->lanes, c) != 0) ||
        dlock_conn_append_eval(c, r->cfg.ctr, renew_script(s[ch->at].protocol),
                               !ch->eval, (int)m, (int)m + 2, argv, NULL) != 0) {
        dlock_lanes_oom(c);
        return -1;
    }
    return 1;
}

/* Reads ch's reply into its grants' verdicts, or sets ch->redo (and
 * ch->lane for a redirect). 0, or -1 if the connection failed. */
static int read_chunk(dlock_renew *r, snap **p, chunk *ch, redisContext *c)
{
    redisReply *rep = NULL;
    ch->redo = 0;
    if (dlock_lanes_read_reply(c, ch->sent_asking, dlock_lanes_deadline(&r->lanes), &rep) != 0)
        return -1;
    if (dlock_conn_is_noscript(rep) && !ch->eval) {
        /* a restarted server, or a node the client never loaded the
         * scripts on: again with EVAL (after ASKING still, if asked) */
        freeReplyObject(rep);
        ch->redo = ch->eval = 1;
        return 0;
    }
    int lane = ch->lane, redo = dlock_lanes_redirect(&r->lanes, rep, ch->lane, &lane);
    if (redo != DLOCK_REDO_NONE) {
        freeReplyObject(rep);
        ch->redo = 1;
        ch->asking = redo == DLOCK_REDO_ASK;
        ch->lane = lane;
        return 0;
    }
    /* A replica (failover): verdicts unknown, and the lane is dropped so
     * that the next round finds the master. */
    dlock_conn_check_master(c, rep);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == ch->m) {
        for (size_t i = 0; i < ch->m; i++)
            p[ch->at + i]->verdict = rep->element[i]->type == REDIS_REPLY_INTEGER &&
                                     rep->element[i]->integer == 1;
    } else {
        /* Any other reply (an error, TRYAGAIN, CLUSTERDOWN) leaves them
         * unknown, and the next round comes soon. */
        ch->failed = 1;
    }
    freeReplyObject(rep);
    return 0;
}

/* Step 3 and 4 of a round. Returns the earliest validity deadline among the
 * leases that stay registered but were not renewed, on the monotonic clock
 * (DLOCK_NEVER if none). */
static int64_t apply(dlock_renew *r, snap *s, size_t n, int64_t sent_boot)
{
    int64_t earliest = DLOCK_NEVER; /* on the boot clock, like validity */
    int64_t valid = sent_boot + (int64_t)r->cfg.lease_ms * DLOCK_NS_PER_MS - r->drift_ns;
    int64_t now = dlock_boot_ns();
    size_t nlost = 0;
    for (size_t i = 0; i < n; i++) {
        dlock_entry *e = s[i].e;
        int drop_registry_ref = 0, lost = 0;
        pthread_mutex_lock(&e->mu);
        if (e->lease.state == DLOCK_LEASE_HELD && e->lease.epoch == s[i].epoch &&
            e->lease.renew == s[i].item) {
            dlock_trace_event(r->cfg.trace, e->lease.sem ? "sem.verdict" : "verdict", e->name,
                              "%" PRIu64 " %d %" PRId64 " %" PRId64 " %" PRId64, e->lease.epoch,
                              s[i].verdict, sent_boot, now, e->lease.valid_until_ns);
            /* A semaphore's renewal names the client, not a grant: a 1
             * answered once the permits' validity had run out may have
             * renewed other permits of its field (a direct grant made
             * after they ended in Redis and went to others), so it
             * counts only if answered in time (local/sem.h, M8). */
            int late = e->lease.sem && s[i].verdict == 1 && now >= e->lease.valid_until_ns;
            if (s[i].verdict == 1 && !late) {
                /* Set, not raised: the renewal reset the expiry in Redis to
                 * the lease time from this round, which may be sooner than a
                 * direct grant's waiter ttl. */
                e->lease.valid_until_ns = valid;
                e->lease.provisional = 0; /* a whole lease now */
            } else if (s[i].verdict == 0 || now >= e->lease.valid_until_ns) {
                /* Redis may still have the grant as ours (the renewal went
                 * unanswered but may have run; or a step back of the
                 * server's clock brings an expired grant back), and the
                 * next acquire must go above its tokens (unconfirmed.h; the
                 * client records it when the holder or a waiter finds the
                 * loss). */
                if (e->lease.token >= e->lease.unconfirmed) {
                    e->lease.unconfirmed = e->lease.token;
                    e->lease.unconfirmed_end = DLOCK_UNCLEAN_EXPIRED; /* a lost lease */
                }
                drop_registry_ref = dlock_renew_mark_lost(r, e);
                s[i].lost_token = e->lease.token;
                if (!e->lease.lost_notified) {
                    e->lease.lost_notified = 1;
                    lost = 1;
                }
            } else if (e->lease.valid_until_ns < earliest) {
                earliest = e->lease.valid_until_ns;
            }
        }
        pthread_mutex_unlock(&e->mu);
        if (drop_registry_ref)
            dlock_table_put(r->cfg.table, e);
        /* Keep lost entries (and their names) referenced until the callback. */
        if (lost)
            s[nlost++] = s[i];
        else
            dlock_table_put(r->cfg.table, e);
    }
    for (size_t i = 0; i < nlost; i++) {
        if (r->cfg.lost)
            r->cfg.lost(r->cfg.lost_arg, s[i].e->name, s[i].lost_token);
        dlock_table_put(r->cfg.table, s[i].e);
    }
    if (earliest == DLOCK_NEVER)
        return DLOCK_NEVER;
    return dlock_now_ns() + (earliest - dlock_boot_ns()); /* on the monotonic clock */
}

/* WAIT min_replicas on c, within half a command timeout: 1 if that many
 * replicas have every write made on it so far, 0 if not (or the connection
 * failed: then c->err is set). */
static int replicas_acked(dlock_renew *r, redisContext *c)
{
    char want[16], ms[16];
    snprintf(want, sizeof want, "%" PRIu32, r->cfg.min_replicas);
    uint32_t t = r->cfg.conn->command_timeout_ms / 2;
    snprintf(ms, sizeof ms, "%" PRIu32, t ? t : 1);
    const char *argv[3] = {"WAIT", want, ms};
    redisReply *rep = dlock_conn_command(c, r->cfg.ctr, r->cfg.conn->command_timeout_ms, 3, argv);
    int ok = rep && rep->type == REDIS_REPLY_INTEGER &&
             rep->integer >= (long long)r->cfg.min_replicas;
    if (rep)
        freeReplyObject(rep);
    return ok;
}

/* Snapshot order when chunks need it (Cluster mode, or grants of two
 * protocols): by lane, then slot, then protocol. */
static int by_lane_slot(const void *a, const void *b)
{
    const snap *x = a, *y = b;
    if (x->lane != y->lane)
        return x->lane < y->lane ? -1 : 1;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->protocol - y->protocol;
}

/* Cuts s[0..n) into chunks (at most CHUNK grants, one lane, one slot, one
 * protocol). */
static size_t make_chunks(const snap *s, size_t n, chunk *ch)
{
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        chunk *last = nc ? &ch[nc - 1] : NULL;
        if (last && last->k < CHUNK && last->lane == s[i].lane &&
            s[last->at].slot == s[i].slot && s[last->at].protocol == s[i].protocol) {
            last->k++;
            continue;
        }
        ch[nc++] = (chunk){.at = i, .k = 1, .lane = s[i].lane};
    }
    return nc;
}

int64_t dlock_renew_round(dlock_renew *r)
{
    if (r->cfg.redlock)
        return dlock_renew_redlock_round(r);
    int64_t now = dlock_now_ns();
    snap *s;
    pthread_mutex_lock(&r->mu);
    ssize_t sn = snapshot(r, &s);
    pthread_mutex_unlock(&r->mu);
    if (sn <= 0)
        return now + r->period_ns; /* nothing held (or no memory): idle */
    size_t n = (size_t)sn;
    snap **p = malloc(sizeof *p * n);
    chunk *ch = malloc(sizeof *ch * n);
    int ok = p && ch;
    /* Route every grant (Cluster mode: its master, by its slot) and open
     * the lanes, before anything is written. */
    int mixed = 0; /* grants of both protocols: one chunk each at least */
    for (size_t i = 0; i < n; i++) {
        s[i].lane = dlock_lanes_route(&r->lanes, s[i].e->keys[DLOCK_KEY_LEASE], &s[i].slot);
        mixed |= s[i].protocol != s[0].protocol;
    }
    if (r->cfg.conn->cluster || mixed)
        qsort(s, n, sizeof *s, by_lane_slot);
    size_t nc = ok ? make_chunks(s, n, ch) : 0;
    int64_t sent_ns = dlock_now_ns(), sent_boot = dlock_boot_ns();
    /* Pass 0 sends every chunk; a later pass those a NOSCRIPT or a redirect
     * sent back (a redirect at most DLOCK_CLUSTER_REDIRECTS_MAX times). */
    for (int pass = 0; ok && pass <= DLOCK_CLUSTER_REDIRECTS_MAX; pass++) {
        dlock_lanes_pass(&r->lanes); /* each lane is opened at most once in this pass */
        for (size_t c = 0; c < nc; c++) {
            ch[c].sent = 0;
            if ((pass == 0 || ch[c].redo) && !dlock_lanes_open(&r->lanes, ch[c].lane))
                ch[c].lane = -1; /* no connection: unknown this round */
        }
        int any = 0;
        pthread_mutex_lock(&r->mu);
        for (size_t c = 0; c < nc && ok; c++) {
            if ((pass > 0 && !ch[c].redo) || ch[c].lane < 0)
                continue;
            redisContext *conn = dlock_lanes_get(&r->lanes, ch[c].lane);
            if (!conn || conn->err)
                continue;
            int rc = append_chunk(r, s, p, &ch[c], conn);
            if (rc < 0)
                ok = 0; /* out of memory: nothing more is appended */
            ch[c].sent = rc > 0;
            any |= rc > 0;
            if (rc > 0)
                r->lanes.v[ch[c].lane].wrote = 1;
        }
        r->writing = any;
        pthread_mutex_unlock(&r->mu);
        if (!any)
            break;
        int64_t flushed_ns = dlock_now_ns();
        unsigned trips = dlock_lanes_flush(&r->lanes, dlock_lanes_deadline(&r->lanes));
        end_write(r);
        if (pass == 0) {
            /* counted together, so that a reader sees whole rounds */
            dlock_count(&r->cfg.ctr->renew_rounds, 1);
            dlock_count(&r->cfg.ctr->renew_keys, (uint64_t)n);
        }
        dlock_count(&r->cfg.ctr->redis_round_trips, trips);
        dlock_count(&r->cfg.ctr->renew_round_trips, trips);
        int again = 0;
        for (size_t c = 0; c < nc; c++) {
            if (!ch[c].sent)
                continue;
            redisContext *conn = dlock_lanes_get(&r->lanes, ch[c].lane);
            if (conn->err || read_chunk(r, p, &ch[c], conn) != 0) {
                ch[c].redo = 0;
                ok = 0; /* this lane's verdicts stay unknown */
                continue;
            }
            again |= ch[c].redo;
            if (!ch[c].redo)
                r->lanes.v[ch[c].lane].acked = 1; /* ran here: WAIT here */
        }
        if (pass == 0)
            dlock_hist_add(&r->cfg.ctr->renew, dlock_now_ns() - flushed_ns);
        if (!again)
            break;
    }
    for (size_t c = 0; c < nc; c++)
        if (ch[c].lane < 0 || ch[c].redo || ch[c].failed)
            ok = 0; /* not answered, or an error: the next round comes soon */
    if (r->cfg.min_replicas) {
        /* A lane's renewals count once WAIT says enough replicas have them;
         * one that fell short (or failed before it could run: the chunks
         * read so far may say "renewed") leaves its leases their old
         * validity, and the next round comes soon. */
        for (unsigned l = 0; l < r->lanes.n; l++) {
            if (!r->lanes.v[l].acked)
                continue;
            r->lanes.v[l].acked = 0;
            redisContext *conn = r->lanes.v[l].conn;
            if (conn && !conn->err && replicas_acked(r, conn))
                continue;
            for (size_t c = 0; c < nc; c++)
                for (size_t i = 0; ch[c].lane == (int)l && i < ch[c].m; i++)
                    if (p[ch[c].at + i]->verdict == 1)
                        p[ch[c].at + i]->verdict = -1; /* a lease found gone stays gone */
            if (conn && !conn->err && r->cfg.conn->nsentinels)
                /* a failover? the next round asks the sentinels */
                dlock_lanes_drop(&r->lanes, (int)l);
            ok = 0;
        }
    } else {
        for (unsigned l = 0; l < r->lanes.n; l++)
            r->lanes.v[l].acked = 0;
    }
    char why[160] = "";
    for (unsigned l = 0; l < r->lanes.n; l++)
        if (r->lanes.v[l].conn && r->lanes.v[l].conn->err) {
            ok = 0; /* a replica answered, or it failed: retry soon, reconnected */
            if (!why[0])
                snprintf(why, sizeof why, ": %s", r->lanes.v[l].conn->errstr);
        }
    dlock_lanes_drop_failed(&r->lanes);
    size_t renewed = 0;
    for (size_t i = 0; i < n; i++)
        renewed += s[i].verdict == 1;
    dlock_count(&r->cfg.ctr->renewed, renewed);
    if (!ok)
        dlock_count(&r->cfg.ctr->renew_failures, 1);
    if (r->cfg.log && ok != !r->failing) {
        char line[300];
        if (!ok)
            snprintf(line, sizeof line, "renewal failing: %zu of %zu leases not confirmed%s; "
                     "retrying every 100 ms, each lease is lost when its validity runs out",
                     n - renewed, n, why);
        else
            snprintf(line, sizeof line, "renewal works again: %zu leases renewed", renewed);
        r->cfg.log(r->cfg.lost_arg, ok ? DLOCK_LOG_INFO : DLOCK_LOG_WARN, line);
    }
    r->failing = !ok;
    free(p);
    free(ch);
    int64_t earliest = apply(r, s, n, sent_boot);
    free(s);
    int64_t next = ok ? sent_ns + r->period_ns
                      : dlock_now_ns() + DLOCK_RENEW_RETRY_MS * DLOCK_NS_PER_MS;
    if (!ok && next > sent_ns + r->period_ns)
        next = sent_ns + r->period_ns;
    return earliest < next ? earliest : next;
}
