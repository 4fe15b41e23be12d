/*
 * The renewal manager's work in Redlock mode (renew_redlock.h), under the
 * rules of renew_int.h: a lease's renewal is sent only while it is
 * registered, with r->writing set from the check to the end of its
 * exchange, so that a releaser (which unregisters, then waits out
 * r->writing) sends its release after every renewal of its grant.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "global/renew_redlock.h"
#include "global/renew_int.h"

typedef struct rsnap {
    dlock_entry *e;
    dlock_renew_item *item; /* identity only: compared, never dereferenced */
    uint64_t epoch;
    dlock_redlock_grant g;
    int sem;           /* one slot of a semaphore's permits (slot k, keys its own):
                          the entry's slots are consecutive snapshots, the first
                          of them holding the entry's reference */
    unsigned k;
    uint32_t limit;    /* sem: the permits' limit (their name's claim) */
    int64_t claim_valid; /* sem, the group's first: the claim's validity this round, 0 none */
    int64_t claim_sent;  /* sem, the group's first: that claim's first send, 0 none */
    char *kbuf;        /* sem: its keys' bytes (owned) */
    char *keys[DLOCK_SCRIPT_KEYS];
    int found;         /* sem, applied: the entry still held the slot */
    int verdict;       /* 1 renewed, 0 gone, -1 not confirmed, 2 (a slot) given back
                          since the snapshot: not asked */
    int64_t valid;     /* renewed: the new validity (boot clock) */
    int64_t sent;      /* the first send of its renewal's exchange (boot clock; 0: none) */
    uint64_t regrant[DLOCK_REDLOCK_NODES_MAX]; /* grants its renewal made, 0 none */
    uint64_t lost_token;
} rsnap;

/* The deadline of one exchange with the node set: connections opened node
 * after node (a stopped node's takes up to a connect and a command
 * timeout, route/redlock.h), then a command timeout for the replies. */
static int64_t command_deadline(dlock_renew *r)
{
    return dlock_now_ns() + ((int64_t)r->cfg.conn->connect_timeout_ms +
                             2 * (int64_t)r->cfg.conn->command_timeout_ms) * DLOCK_NS_PER_MS;
}

/* A request naming e's keys, for the node set's calls. */
static dlock_redlock_req req_of(dlock_renew *r, dlock_entry *e, uint64_t attempt)
{
    return (dlock_redlock_req){.name = e->name, .keys = e->keys, .args = r->cfg.args,
                               .client_name = r->cfg.conn->client_name, .attempt = attempt,
                               .deadline = command_deadline(r)};
}

/* Whether the registration it still holds the slot of snapshot x (a
 * slot given back is out of its copy before its release: renew.h,
 * dlock_renew_rl_slots_sync). r->mu held. */
static int slot_in(const dlock_renew_item *it, const rsnap *x)
{
    for (unsigned j = 0; j < it->rls_n; j++)
        if (it->rls[j].k == x->k && it->rls[j].g.attempt == x->g.attempt)
            return 1;
    return 0;
}

/* Sends the renewals of s[0 .. n) whose grants are still registered, in
 * one batch (dlock_redlock_renew_many); r->writing is set from the check
 * to the end of the exchange. The others keep verdict -1 and are found
 * unregistered when applied. */
static void renew_all(dlock_renew *r, rsnap *s, size_t n)
{
    dlock_redlock_lease *l = malloc(sizeof *l * n);
    if (!l)
        return; /* (every verdict -1: tried again after a pause) */
    size_t k = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < n; i++) {
        dlock_renew_item *it = s[i].e->lease.renew; /* readable under r->mu */
        if (it != s[i].item || it->epoch != s[i].epoch)
            continue;
        if (s[i].sem && !slot_in(it, &s[i])) {
            s[i].verdict = 2; /* given back since the snapshot: not asked */
            continue;
        }
        char *const *keys = s[i].sem ? s[i].keys : s[i].e->keys;
        l[k++] = (dlock_redlock_lease){.name = s[i].e->name, .key = keys[DLOCK_KEY_LEASE],
                                       .keys = (const char *const *)keys, .g = &s[i].g,
                                       .verdict = -1};
    }
    r->writing = k > 0;
    pthread_mutex_unlock(&r->mu);
    if (k)
        (void)dlock_redlock_renew_many(r->cfg.redlock, r->cfg.args, r->cfg.conn->client_name, l,
                                       k, command_deadline(r));
    pthread_mutex_lock(&r->mu);
    r->writing = 0;
    pthread_cond_broadcast(&r->wrote);
    pthread_mutex_unlock(&r->mu);
    for (size_t j = 0, i = 0; j < k; j++) {
        while (&s[i].g != l[j].g)
            i++;
        s[i].verdict = l[j].verdict;
        s[i].valid = l[j].valid_boot;
        s[i].sent = l[j].sent_boot;
        memcpy(s[i].regrant, l[j].regrant, sizeof s[i].regrant);
    }
    free(l);
}

/* How many snapshots from s[i] on are of s[i]'s entry (1 for a lock). */
static size_t group_of(const rsnap *s, size_t i, size_t n)
{
    size_t j = i + 1;
    while (s[i].sem && j < n && s[j].sem && s[j].e == s[i].e && !s[j].kbuf)
        j++;
    return j - i;
}

/* After renew_all: the name of each semaphore's permits claimed again
 * (route/redlock.h, dlock_redlock_claim; local/rlsem.h, R4), in one batch.
 * A renewed slot's validity is at most its claim's; a claim not confirmed
 * by a majority (refused, or unanswered) confirms none of its slots:
 * their validity stands, and runs out. */
static void claim_all(dlock_renew *r, rsnap *s, size_t n)
{
    size_t groups = 0;
    for (size_t i = 0; i < n; i += group_of(s, i, n))
        groups += s[i].sem;
    if (!groups)
        return;
    dlock_redlock_claim *cl = calloc(groups, sizeof *cl);
    if (!cl) {
        for (size_t i = 0; i < n; i++)
            if (s[i].sem && s[i].verdict == 1)
                s[i].verdict = -1; /* (not confirmed this round) */
        return;
    }
    size_t g = 0;
    for (size_t i = 0; i < n; i += group_of(s, i, n))
        if (s[i].sem)
            cl[g++] = (dlock_redlock_claim){.name = s[i].e->name,
                                            .key = s[i].e->keys[DLOCK_KEY_LEASE],
                                            .limit = s[i].limit};
    (void)dlock_redlock_claim_many(r->cfg.redlock, cl, groups, command_deadline(r), 0);
    g = 0;
    for (size_t i = 0; i < n;) {
        size_t cnt = group_of(s, i, n);
        if (s[i].sem) {
            s[i].claim_valid = cl[g].verdict == 1 ? cl[g].valid_boot : 0;
            s[i].claim_sent = cl[g].verdict == 1 ? cl[g].first_boot : 0;
            for (size_t j = i; j < i + cnt; j++) {
                if (s[j].verdict != 1)
                    continue;
                if (cl[g].verdict == 1 && s[j].valid > cl[g].valid_boot)
                    s[j].valid = cl[g].valid_boot;
                else if (cl[g].verdict != 1)
                    s[j].verdict = -1;
            }
            g++;
        }
        i += cnt;
    }
    free(cl);
}

/* The verdict of s on its entry, as renew_round.c's apply: 1 if the lease
 * was found lost now (the caller tells), with *drop set when the registry's
 * reference is to be dropped. *earliest lowers to the validity of a lease
 * left unconfirmed. */
static int apply_one(dlock_renew *r, rsnap *s, int64_t *earliest, int *drop)
{
    dlock_entry *e = s->e;
    int lost = 0;
    int64_t now = dlock_boot_ns();
    *drop = 0;
    pthread_mutex_lock(&e->mu);
    if (e->lease.state == DLOCK_LEASE_HELD && e->lease.epoch == s->epoch &&
        e->lease.renew == s->item) {
        /* Re-grants (route/redlock.h) join the grant: renewed, and
         * released by token, from now on. The item's copy too, for the
         * next round (e->mu then r->mu; the item is alive while e's lease
         * points at it, renew_int.h). */
        pthread_mutex_lock(&r->mu);
        for (unsigned i = 0; i < DLOCK_REDLOCK_NODES_MAX; i++)
            if (s->regrant[i] && !e->lease.rl->node_token[i])
                e->lease.rl->node_token[i] = s->item->rl->node_token[i] = s->regrant[i];
        pthread_mutex_unlock(&r->mu);
        /* (as renew_round.c's: the validity before the verdict applies) */
        dlock_trace_event(r->cfg.trace, "verdict", e->name,
                          "%" PRIu64 " %d %" PRId64 " %" PRId64 " %" PRId64, e->lease.epoch,
                          s->verdict, s->sent, now, e->lease.valid_until_ns);
        if (s->verdict == 1) {
            e->lease.valid_until_ns = s->valid;
            e->lease.provisional = 0;
        } else if (s->verdict == 0 || now >= e->lease.valid_until_ns) {
            if (e->lease.token >= e->lease.unconfirmed) {
                e->lease.unconfirmed = e->lease.token;
                e->lease.unconfirmed_end = DLOCK_UNCLEAN_EXPIRED;
            }
            *drop = dlock_renew_mark_lost(r, e);
            s->lost_token = e->lease.token;
            if (!e->lease.lost_notified) {
                e->lease.lost_notified = 1;
                lost = 1;
            }
        } else if (e->lease.valid_until_ns < *earliest) {
            *earliest = e->lease.valid_until_ns;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return lost;
}

/* The verdicts of the slots s[0 .. cnt) of one semaphore's permits (their
 * entry's), as apply_one's of a lock: a renewed slot gets its new
 * validity, re-grants join it (in the entry and in the registration's
 * copy), and the permits' validity is their slots' earliest. One slot
 * gone, or not confirmed before its validity, loses every permit (local/
 * sem.h, M8): the snapshot's slots leave the entry (s[j].found: the caller
 * releases them), and slots taken since stay for the grant that took them
 * (local/rlsem.h). 1 if the permits were found lost now, *drop as
 * apply_one's. */
static int apply_sem(dlock_renew *r, rsnap *s, size_t cnt, int64_t *earliest, int *drop)
{
    dlock_entry *e = s[0].e;
    int lost = 0, gone = 0, late = 0;
    int64_t now = dlock_boot_ns();
    *drop = 0;
    for (size_t j = 0; j < cnt; j++)
        s[j].found = 0;
    pthread_mutex_lock(&e->mu);
    dlock_redlock_slots *h = e->lease.rls;
    if (e->lease.state != DLOCK_LEASE_HELD || !e->lease.sem || !h ||
        e->lease.epoch != s[0].epoch || e->lease.renew != s[0].item) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    int64_t before = e->lease.valid_until_ns, rsent = 0;
    unsigned renewed = 0;
    int claimed = 0;
    /* the slots of the round not renewed, and how judged, for the trace:
     * "k:-1" not confirmed yet (valid after now), "k:0" gone (found so,
     * or past its validity) */
    char judged[DLOCK_REDLOCK_SEM_MAX * 8 + 2] = "";
    size_t jn = 0;
    for (size_t j = 0; j < cnt; j++) {
        dlock_redlock_slot *mine = NULL;
        for (unsigned i = 0; i < h->n && !mine; i++)
            if (h->s[i].k == s[j].k && h->s[i].g.attempt == s[j].g.attempt)
                mine = &h->s[i];
        if (!mine)
            continue; /* given back since the snapshot */
        s[j].found = 1;
        for (unsigned i = 0; i < DLOCK_REDLOCK_NODES_MAX; i++)
            if (s[j].regrant[i] && !mine->g.node_token[i])
                mine->g.node_token[i] = s[j].regrant[i];
        int how;
        if (s[j].verdict == 1) {
            mine->g.valid_boot = s[j].valid;
            if (!renewed++ || s[j].sent > rsent)
                rsent = s[j].sent;
            how = 1;
        } else if (s[j].verdict == 0 || now >= mine->g.valid_boot) {
            gone = 1;
            how = 0;
        } else {
            late = 1;
            how = -1;
        }
        if (r->cfg.trace && how < 1 && jn < sizeof judged)
            jn += (size_t)snprintf(judged + jn, sizeof judged - jn, "%s%u:%d", jn ? "," : "",
                                   s[j].k, how);
        s[j].g = mine->g; /* (its release, if lost: by every token known) */
    }
    if (gone) {
        unsigned w = 0;
        for (unsigned i = 0; i < h->n; i++) {
            int ours = 0;
            for (size_t j = 0; j < cnt && !ours; j++)
                ours = s[j].found && h->s[i].k == s[j].k && h->s[i].g.attempt == s[j].g.attempt;
            if (!ours)
                h->s[w++] = h->s[i];
        }
        h->n = w;
        *drop = dlock_renew_mark_lost(r, e);
        if (!e->lease.lost_notified) {
            e->lease.lost_notified = 1;
            lost = 1;
        }
    } else {
        claimed = h->limit == s[0].limit && s[0].claim_valid > h->claim_valid;
        if (claimed)
            h->claim_valid = s[0].claim_valid; /* (rlsem.h, R4: a try may rely on it) */
        (void)dlock_renew_rl_slots_sync(r, e); /* (the re-grants: the next round's) */
        int64_t v = DLOCK_NEVER;
        for (unsigned i = 0; i < h->n; i++)
            if (h->s[i].g.valid_boot < v)
                v = h->s[i].g.valid_boot;
        if (h->n)
            e->lease.valid_until_ns = v;
        if (late && v < *earliest)
            *earliest = v;
    }
    /* (sim/trace_sem.lua, sem.rlverdict: the slots renewed and the latest
     * of their sends, the claim this round took (0 0 none), the
     * permits' validity before and after, the slots held after, the
     * reading of the clock the judgement used, and the slots of the round
     * it did not renew, with their judgement) */
    if (r->cfg.trace) {
        char slots[DLOCK_REDLOCK_SLOTS_TEXT];
        dlock_redlock_slots_text(h, slots, sizeof slots);
        dlock_trace_event(r->cfg.trace, "sem.rlverdict", e->name,
                          "%" PRIu64 " %d %d %u %u %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64
                          " %" PRId64 " %s %" PRId64 " %s", e->lease.epoch, gone, late, h->n,
                          renewed, rsent, claimed ? s[0].claim_sent : 0,
                          claimed ? s[0].claim_valid : 0, before, e->lease.valid_until_ns, slots,
                          now, jn ? judged : "-");
    }
    pthread_mutex_unlock(&e->mu);
    return lost;
}

/* The snapshot of every registered lease, one per lock and one per slot of
 * a semaphore's permits (a reference on each entry, held by its first
 * snapshot), in *out; how many. r->mu held. */
static size_t snapshot(dlock_renew *r, rsnap **out)
{
    size_t total = 0;
    for (dlock_renew_item *it = r->items; it; it = it->next)
        total += it->rls_n ? it->rls_n : it->rl != NULL;
    rsnap *s = total ? calloc(total, sizeof *s) : NULL;
    size_t n = 0;
    for (dlock_renew_item *it = s ? r->items : NULL; it; it = it->next) {
        if (it->rls_n) {
            char *kbuf = malloc(dlock_redlock_slot_keys_size(it->e->keys) * it->rls_n);
            if (!kbuf)
                continue; /* (unconfirmed this round: tried again after a pause) */
            dlock_table_ref(it->e);
            for (unsigned j = 0; j < it->rls_n; j++) {
                rsnap *x = &s[n++];
                *x = (rsnap){.e = it->e, .item = it, .epoch = it->epoch, .g = it->rls[j].g,
                             .verdict = -1, .sem = 1, .k = it->rls[j].k,
                             .limit = it->rls_limit, .kbuf = j == 0 ? kbuf : NULL};
                dlock_redlock_slot_keys(it->e->keys, x->k,
                                        kbuf + j * dlock_redlock_slot_keys_size(it->e->keys),
                                        x->keys);
            }
            continue;
        }
        if (!it->rl)
            continue; /* (every lock's lease of the mode has its grant) */
        dlock_table_ref(it->e);
        s[n++] = (rsnap){.e = it->e, .item = it, .epoch = it->epoch, .g = *it->rl, .verdict = -1};
    }
    *out = s;
    return n;
}

int64_t dlock_renew_redlock_round(dlock_renew *r)
{
    int64_t start = dlock_now_ns();
    pthread_mutex_lock(&r->mu);
    rsnap *s;
    size_t n = snapshot(r, &s);
    pthread_mutex_unlock(&r->mu);
    if (!n) {
        free(s);
        return start + r->period_ns;
    }
    renew_all(r, s, n);
    claim_all(r, s, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= s[i].verdict >= 1;
    dlock_count(&r->cfg.ctr->renew_rounds, 1);
    dlock_count(&r->cfg.ctr->renew_keys, (uint64_t)n);
    int64_t earliest = DLOCK_NEVER;
    size_t renewed = 0;
    /* the snapshots to release (lost: the grant, or each slot found) and
     * the entries lost now (their first snapshots), kept referenced until
     * the callback */
    size_t *rel = malloc(sizeof *rel * n), nrel = 0, *told = malloc(sizeof *told * n), ntold = 0;
    for (size_t i = 0; i < n;) {
        size_t cnt = group_of(s, i, n);
        int drop;
        for (size_t j = i; j < i + cnt; j++)
            renewed += s[j].verdict == 1;
        int lost = s[i].sem ? apply_sem(r, &s[i], cnt, &earliest, &drop)
                            : apply_one(r, &s[i], &earliest, &drop);
        if (drop)
            dlock_table_put(r->cfg.table, s[i].e);
        if (lost && rel && told) {
            for (size_t j = i; j < i + cnt; j++)
                if (!s[j].sem || s[j].found)
                    rel[nrel++] = j;
            told[ntold++] = i;
        } else {
            dlock_table_put(r->cfg.table, s[i].e);
        }
        i += cnt;
    }
    dlock_count(&r->cfg.ctr->renewed, renewed);
    if (!ok)
        dlock_count(&r->cfg.ctr->renew_failures, 1);
    if (r->cfg.log && ok != !r->failing) {
        char line[400];
        if (!ok)
            snprintf(line, sizeof line, "redlock renewal failing: %zu of %zu leases not "
                     "confirmed by a majority (%s); each lease is lost when its validity runs "
                     "out", n - renewed, n, dlock_last_error());
        else
            snprintf(line, sizeof line, "redlock renewal works again: %zu leases renewed",
                     renewed);
        r->cfg.log(r->cfg.lost_arg, ok ? DLOCK_LOG_INFO : DLOCK_LOG_WARN, line);
    }
    r->failing = !ok;
    /* The nodes that still hold a lease found lost (a minority: no
     * majority confirmed it) would keep it from the others for up to a
     * lease: released there, by each node's grant (a later grant of this
     * client is another), leaving the word that it expired for the next
     * holder, as an expiry does; a node that fails one is not asked for
     * the others. A semaphore's: each of its slots found. */
    int down[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (size_t x = 0; x < nrel; x++) {
        rsnap *o = &s[rel[x]];
        dlock_redlock_grant g = o->g;
        for (unsigned k = 0; k < DLOCK_REDLOCK_NODES_MAX; k++)
            if (!g.node_token[k])
                g.node_token[k] = o->regrant[k];
        dlock_redlock_req q = req_of(r, o->e, g.attempt);
        if (o->sem)
            q.keys = o->keys;
        q.ended = DLOCK_UNCLEAN_EXPIRED;
        (void)dlock_redlock_release_past(r->cfg.redlock, &q, &g, down);
    }
    for (size_t x = 0; x < ntold; x++) {
        if (r->cfg.lost)
            r->cfg.lost(r->cfg.lost_arg, s[told[x]].e->name, s[told[x]].lost_token);
        dlock_table_put(r->cfg.table, s[told[x]].e);
    }
    for (size_t i = 0; i < n; i++)
        free(s[i].kbuf);
    free(rel);
    free(told);
    free(s);
    int64_t next = ok ? start + r->period_ns
                      : dlock_now_ns() + DLOCK_RENEW_RETRY_MS * DLOCK_NS_PER_MS;
    if (!ok && next > start + r->period_ns)
        next = start + r->period_ns;
    if (earliest != DLOCK_NEVER) {
        int64_t e = dlock_now_ns() + (earliest - dlock_boot_ns()); /* monotonic */
        if (e < next)
            next = e;
    }
    return next;
}

int64_t dlock_renew_redlock_jobs(dlock_renew *r, int64_t until)
{
    pthread_mutex_lock(&r->mu);
    dlock_renew_job *list = r->jobs;
    r->jobs = NULL;
    pthread_mutex_unlock(&r->mu);
    int64_t now = dlock_now_ns(), next_due = DLOCK_NEVER;
    dlock_renew_job *later = NULL, *next;
    /* A node that failed one give-back is not asked again in this pass,
     * and the pass ends when the next round is due (until): give-backs
     * behind a stopped node must not delay the renewals past their
     * validity. */
    int down[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (dlock_renew_job *o = list; o; o = next) {
        next = o->next;
        if (o->next_try_ns <= now && now < until) {
            int64_t d = command_deadline(r);
            dlock_redlock_req q = {.name = o->name, .keys = o->keys, .args = r->cfg.args,
                                   .client_name = r->cfg.conn->client_name,
                                   .attempt = strtoull(o->nonce, NULL, 10),
                                   .deadline = d < until ? d : until, .shared = o->shared};
            /* done once every node answered: the one that did not answer
             * the acquire may be the one that ran it (a leave: the one
             * that did not answer may queue the client still) */
            int rc = o->leave ? dlock_redlock_leave_past(r->cfg.redlock, &q, down, o->rl_skip)
                              : dlock_redlock_give_back_past(r->cfg.redlock, &q, down,
                                                             o->rl_skip);
            dlock_trace_event(r->cfg.trace, o->leave ? "rl.leave" : "rl.giveback", o->name,
                              "%s %d", o->nonce, rc);
            now = dlock_now_ns();
            if (rc != DLOCK_OK && now < o->until_ns) {
                o->next_try_ns = now + o->backoff_ns;
                if (o->backoff_ns < DLOCK_RENEW_JOB_PAUSE_MAX_MS * DLOCK_NS_PER_MS / 2)
                    o->backoff_ns *= 2;
                else
                    o->backoff_ns = DLOCK_RENEW_JOB_PAUSE_MAX_MS * DLOCK_NS_PER_MS;
            } else {
                free(o);
                continue;
            }
        }
        if (o->next_try_ns < next_due)
            next_due = o->next_try_ns;
        o->next = later;
        later = o;
    }
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

void dlock_renew_redlock_release_all(dlock_renew *r)
{
    /* One deadline for all names, and a node that failed one release is
     * not asked again: a stopped node costs the close one exchange, not
     * one per name (what a release did not reach ends within a lease). */
    int64_t deadline = command_deadline(r);
    int down[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (dlock_renew_item *it = r->items; it; it = it->next) {
        for (unsigned j = 0; j < it->rls_n; j++) {
            /* a semaphore's slots, each as a lock's grant */
            char *kbuf = malloc(dlock_redlock_slot_keys_size(it->e->keys)), *keys[DLOCK_SCRIPT_KEYS];
            if (!kbuf)
                break; /* (they end within a lease) */
            dlock_redlock_slot_keys(it->e->keys, it->rls[j].k, kbuf, keys);
            dlock_redlock_req q = req_of(r, it->e, it->rls[j].g.attempt);
            q.keys = keys;
            q.deadline = deadline;
            q.ended = DLOCK_UNCLEAN_ABANDONED;
            (void)dlock_redlock_release_past(r->cfg.redlock, &q, &it->rls[j].g, down);
            free(kbuf);
        }
        if (!it->rl)
            continue;
        dlock_redlock_req q = req_of(r, it->e, it->rl->attempt);
        q.deadline = deadline;
        q.ended = DLOCK_UNCLEAN_ABANDONED; /* the client closes while it holds the name
                                              (as renew_jobs.c's release at close) */
        (void)dlock_redlock_release_past(r->cfg.redlock, &q, it->rl, down);
    }
}

void dlock_renew_redlock_check(dlock_renew *r, int64_t until)
{
    dlock_redlock *rl = r->cfg.redlock;
    unsigned n = dlock_redlock_nodes(rl), i = r->rl_check_next % n;
    r->rl_check_next = (i + 1) % n;
    int64_t deadline = command_deadline(r);
    int rc = dlock_redlock_check_node(rl, i, until < deadline ? until : deadline);
    if (rc != DLOCK_OK && rc != DLOCK_ESERVER)
        return; /* not answered: the acquires and renewals say so */
    r->rl_unfit[i] = rc == DLOCK_ESERVER;
    if (r->rl_unfit[i])
        snprintf(r->rl_why[i], sizeof r->rl_why[i], "%s", dlock_last_error());
    for (unsigned k = 0; k < n; k++)
        if (r->rl_unfit[k]) {
            r->cfg.server(r->cfg.lost_arg, DLOCK_ESERVER, r->rl_why[k]);
            return;
        }
    r->cfg.server(r->cfg.lost_arg, DLOCK_OK, "");
}

void dlock_renew_redlock_seed(dlock_renew *r, int64_t until)
{
    int64_t d = command_deadline(r);
    int rc = dlock_redlock_seed_due(r->cfg.redlock, d < until ? d : until);
    if (rc > 0 && r->cfg.log) {
        char line[160];
        snprintf(line, sizeof line, "redlock: %d restarted node%s seeded from the others", rc,
                 rc == 1 ? "" : "s");
        r->cfg.log(r->cfg.lost_arg, DLOCK_LOG_INFO, line);
    } else if (rc < 0 && r->cfg.log) {
        char line[400];
        snprintf(line, sizeof line, "redlock: a restarted node could not be seeded yet: %s",
                 dlock_last_error());
        r->cfg.log(r->cfg.lost_arg, DLOCK_LOG_WARN, line);
    }
}
