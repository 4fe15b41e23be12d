/*
 * A counting semaphore's Redis calls in Redlock mode (rlsem.h): shared
 * state e->lease.rls under e->mu, by rlsem.h's rules R1 to R3; the calls
 * run in e's call slot (local/sem.h, M2) and take e->mu only around the
 * slots, never during I/O. Lock order: e->mu, then the renewal manager's
 * (client.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "local/rlmode.h"
#include "local/rlsem.h"
#include "local/rpc.h"

/* A slot to start from, 0 .. limit - 1: drawn per thread (xorshift), so
 * that clients spread over the slots. */
static unsigned draw(uint32_t limit)
{
    static __thread uint64_t x;
    if (!x)
        x = (uint64_t)dlock_now_ns() | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return (unsigned)(x % limit);
}

/* Attempt `attempt`'s grant of slot k, if any, given back in the
 * background on every node. */
static void give_back(dlock_client *c, dlock_entry *e, unsigned k, uint64_t attempt,
                      uint32_t skip)
{
    char number[24];
    snprintf(number, sizeof number, "%" PRIu64, attempt);
    dlock_renew_rl_slot_job(c->renew, e, k, 0, number, skip);
}

/* Whether e holds slot k. e->mu held. */
static int holds(const dlock_redlock_slots *h, unsigned k)
{
    for (unsigned i = 0; i < h->n; i++)
        if (h->s[i].k == k)
            return 1;
    return 0;
}

/* The queue of slot k left in the background, on the nodes outside skip,
 * numbered `number` (NULL: as a new call of this client); never a slot e
 * holds, whose leave would give that grant up (leave.lua gives up grants
 * of older attempts). e->mu held. */
static void leave_bg(dlock_client *c, dlock_entry *e, unsigned k, uint32_t skip,
                     const char *number)
{
    if (holds(e->lease.rls, k))
        return;
    char own[24];
    if (!number) {
        dlock_rpc_number(c, own);
        number = own;
    }
    dlock_renew_rl_slot_job(c->renew, e, k, 1, number, skip);
}

/* The nodes' bits. */
static uint32_t all_nodes(const dlock_client *c)
{
    return (uint32_t)((1u << dlock_redlock_nodes(c->redlock)) - 1);
}

/* R2: a wait's end, out of the queue of every slot it asked (and of its
 * home), in the background: slot `got` (-1 none), granted by the nodes of
 * `granted`, only on the others, numbered `nonce` as the grant's attempt
 * (leave.lua gives up grants of older attempts only); the rest as a new
 * call. e->mu held. */
static void leave_wait(dlock_client *c, dlock_entry *e, int got, uint32_t granted,
                       const char *nonce)
{
    dlock_redlock_slots *h = e->lease.rls;
    uint64_t q = h->queued | (h->home ? 1ull << (h->home - 1) : 0);
    for (unsigned k = 0; k < h->limit; k++) {
        if (!(q >> k & 1))
            continue;
        if ((int)k != got)
            leave_bg(c, e, k, 0, NULL);
        else if (granted != all_nodes(c))
            dlock_renew_rl_slot_job(c->renew, e, k, 1, nonce, granted);
    }
    h->home = 0;
    h->queued = 0;
}

/* e's slots for `limit`: made, or made anew for another limit (none held
 * then: local/sem.h refuses a second limit while the first is in use).
 * e->mu held. DLOCK_OK or DLOCK_ENOMEM. */
static int slots_for(dlock_client *c, dlock_entry *e, uint32_t limit)
{
    dlock_redlock_slots *h = e->lease.rls;
    if (h && h->limit == limit)
        return DLOCK_OK;
    if (h && h->kept) /* (R3: the wait it was kept for ended) */
        give_back(c, e, h->kept_k, h->kept, 0);
    if (h && h->n) /* (R1: stale, their permits lost: never with another limit in use) */
        for (unsigned i = 0; i < h->n; i++)
            give_back(c, e, h->s[i].k, h->s[i].g.attempt, 0);
    dlock_redlock_slots *nh = realloc(h, sizeof *nh + sizeof nh->s[0] * limit);
    if (!nh)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    memset(nh, 0, sizeof *nh);
    nh->limit = limit;
    e->lease.rls = nh;
    return DLOCK_OK;
}

/* R1: slots held while the lease is not HELD go back. e->mu held, in the
 * call slot or with nobody in it (sem.h, M2: a release finds the lease
 * NONE when its last permit goes, and an acquire holds its fresh slot
 * before the local tier takes it). */
static void stale_out(dlock_client *c, dlock_entry *e)
{
    dlock_redlock_slots *h = e->lease.rls;
    if (!h || !h->n || (e->lease.state == DLOCK_LEASE_HELD && e->lease.sem))
        return;
    for (unsigned i = 0; i < h->n; i++)
        give_back(c, e, h->s[i].k, h->s[i].g.attempt, 0);
    h->n = 0;
}

/* The trace's line of a try (sim/trace_sem.lua, sem.rltry): its send, the
 * entry, the limit, whether it queued, what it returns, the slot granted
 * (-1 none) with the grant's first send and validity (0 0 none), and the
 * claim it relied on: how ('c' claimed by this try, 'r' a live claim of
 * this client reused, 'f' none confirmed), the claim's first send (0 if
 * none sent) and its validity. e->mu held (or, on a failure before any
 * call, not: nothing else of e happened meanwhile, the call slot is
 * the caller's). */
static void trace_try(dlock_client *c, dlock_entry *e, const dlock_sem_try *t, uint32_t limit,
                      int rc, int slot, const dlock_redlock_grant *g, char how,
                      const dlock_redlock_claim *cl)
{
    dlock_trace_event(c->trace, "sem.rltry", e->name,
                      "%s %" PRId64 " %" PRIu64 " %" PRIu32 " %d %d %d %" PRId64 " %" PRId64
                      " %c %" PRId64 " %" PRId64, t->nonce, t->sent_boot, e->made, limit,
                      t->queue, rc, slot, g ? g->first_boot : 0, g ? g->valid_boot : 0, how,
                      cl ? cl->first_boot : 0, cl ? cl->valid_boot : 0);
}

int dlock_rlsem_acquire(dlock_client *c, dlock_entry *e, dlock_sem_try *t)
{
    t->in_doubt = 0;
    t->answered = 0;
    t->free = 0;
    t->queued = -1;
    t->sent_boot = dlock_boot_ns();
    uint64_t attempt = strtoull(t->nonce, NULL, 10);
    char *kbuf = malloc(dlock_redlock_slot_keys_size(e->keys)), *keys[DLOCK_SCRIPT_KEYS];
    if (!kbuf) {
        trace_try(c, e, t, t->limit, DLOCK_ENOMEM, -1, NULL, 'f', NULL);
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    pthread_mutex_lock(&e->mu);
    int rc = slots_for(c, e, t->limit);
    if (rc != DLOCK_OK) {
        trace_try(c, e, t, t->limit, rc, -1, NULL, 'f', NULL);
        pthread_mutex_unlock(&e->mu);
        free(kbuf);
        return rc;
    }
    stale_out(c, e);
    dlock_redlock_slots *h = e->lease.rls;
    uint64_t held = 0;
    for (unsigned i = 0; i < h->n; i++)
        held |= 1ull << h->s[i].k;
    if (t->queue && !h->home) {
        /* R2: a new wait, its home a slot this client does not hold (a
         * leave of a slot it holds would give that grant up: leave.lua);
         * none if it holds them all */
        unsigned d = draw(h->limit);
        for (unsigned j = 0; j < h->limit && !h->home; j++)
            if (!(held >> ((d + j) % h->limit) & 1))
                h->home = (d + j) % h->limit + 1;
        if (!h->ticket) /* (kept by the wait: a single try's grant redraws its home only) */
            h->ticket = dlock_rlmode_ticket();
    }
    unsigned limit = h->limit, home = t->queue ? h->home : 0;
    uint64_t ticket = h->ticket;
    int64_t claim_valid = h->claim_valid;
    pthread_mutex_unlock(&e->mu);

    /* R4: the name claimed for this limit first, unless a claim of this
     * client (a try's, a renewal's) surely holds two thirds of a lease
     * more: a slot taken now is valid while it does, as long as a lock's
     * first renewal leaves it (the next round, within a third of a lease,
     * claims the name again) */
    int64_t deadline = dlock_rlmode_exchange_deadline(c);
    if (t->queue && t->deadline > deadline)
        deadline = t->deadline; /* (waits for a pooled connection until then) */
    dlock_redlock_claim cl = {.name = e->name, .key = e->keys[DLOCK_KEY_LEASE], .limit = limit,
                              .valid_boot = claim_valid};
    int claimed = DLOCK_OK;
    char how = 'r';
    if (claim_valid <= dlock_boot_ns() + (int64_t)c->lease_ms * DLOCK_NS_PER_MS * 2 / 3) {
        claimed = dlock_redlock_claim_many(c->redlock, &cl, 1, deadline, 1);
        how = claimed == DLOCK_OK ? 'c' : 'f';
    }

    unsigned from = home ? home - 1 : draw(limit), asked = 0;
    uint64_t queued = 0; /* the slots this try asked queued (R2) */
    uint64_t kept = 0; /* this try's split vote kept on the home slot */
    int got = -1;
    uint32_t granted = 0; /* the nodes that granted it */
    dlock_redlock_grant g;
    char why[700] = "";
    rc = DLOCK_EBUSY;
    if (claimed != DLOCK_OK) {
        /* (refused: the wait ends, and its queues are left below;
         * unconfirmed: as a try too few nodes answered, below) */
        snprintf(why, sizeof why, "%s", dlock_last_error());
        rc = claimed;
    }
    for (unsigned j = 0; claimed == DLOCK_OK && j < limit; j++) {
        unsigned k = (from + j) % limit;
        if (held >> k & 1)
            continue;
        dlock_redlock_slot_keys(e->keys, k, kbuf, keys);
        /* R2: a wait's try queues on every slot it asks, and keeps a split
         * vote at home only */
        int queue = home != 0;
        queued |= (uint64_t)queue << k;
        /* each slot a whole exchange (as a lock's try: rlmode.c) */
        deadline = dlock_rlmode_exchange_deadline(c);
        if (t->queue && t->deadline > deadline)
            deadline = t->deadline; /* (waits for a pooled connection until then) */
        asked++;
        dlock_redlock_req q = {.name = e->name, .keys = keys, .args = &c->args,
                               .client_name = c->conn.client_name, .attempt = attempt,
                               .deadline = deadline, .queue = queue,
                               .no_keep = queue && k != home - 1,
                               .ticket = queue ? ticket : 0, .client_id = c->args.client_id};
        dlock_redlock_busy b;
        int r = dlock_redlock_acquire(c->redlock, &q, &g, &b);
        if (queue && k == home - 1 && r == DLOCK_EBUSY && b.kept)
            kept = attempt;
        if (r == DLOCK_OK) {
            got = (int)k;
            if (g.valid_boot > cl.valid_boot)
                g.valid_boot = cl.valid_boot; /* (R4: while the claim surely lives) */
            for (unsigned i = 0; i < dlock_redlock_nodes(c->redlock); i++)
                granted |= (uint32_t)(g.node_token[i] != 0) << i;
            rc = DLOCK_OK;
            break;
        }
        if (r == DLOCK_EBUSY) {
            t->answered = 1;
            continue;
        }
        snprintf(why, sizeof why, "%s", dlock_last_error());
        if (r == DLOCK_EREDIS)
            /* a node that did not answer may have granted it (rlmode.c) */
            give_back(c, e, k, attempt, all_nodes(c) & ~b.sent);
        rc = r;
        break; /* (the other slots ask the same nodes) */
    }
    free(kbuf);

    pthread_mutex_lock(&e->mu);
    h = e->lease.rls;
    if (claimed == DLOCK_OK && cl.valid_boot > h->claim_valid)
        h->claim_valid = cl.valid_boot;
    h->queued |= queued;
    /* R3: the try before's kept split vote, once this try ended */
    if (h->kept && h->kept != kept)
        give_back(c, e, h->kept_k, h->kept, 0);
    h->kept = kept;
    h->kept_k = home ? home - 1 : 0;
    if (rc == DLOCK_OK) {
        /* R2: the wait ends (this try's, or a single try's that got a
         * permit meanwhile): out of every queue where this grant did not
         * take it out (as a lock's wait: rlmode.c) */
        leave_wait(c, e, got, granted, t->nonce);
        if (t->queue)
            h->ticket = 0; /* (the wait's own grant: it ends) */
        if (h->kept) { /* (refused at home, granted elsewhere: the vote goes back) */
            give_back(c, e, h->kept_k, h->kept, 0);
            h->kept = 0;
        }
        h->s[h->n++] = (dlock_redlock_slot){.k = (unsigned)got, .g = g};
        if (dlock_renew_rl_slots_sync(c->renew, e) != DLOCK_OK) {
            h->n--;
            give_back(c, e, (unsigned)got, attempt, 0);
            trace_try(c, e, t, limit, DLOCK_ENOMEM, -1, NULL, how, &cl);
            pthread_mutex_unlock(&e->mu);
            return dlock_err_set(DLOCK_ENOMEM, "out of memory registering a permit of '%s'",
                                 e->name);
        }
        h->fresh = attempt;
        h->fresh_k = (unsigned)got;
        t->answered = 1;
        trace_try(c, e, t, limit, DLOCK_OK, got, &g, how, &cl);
        pthread_mutex_unlock(&e->mu);
        return DLOCK_OK; /* (t->held and t->sent_boot: dlock_rlsem_granted) */
    }
    int again = 0;
    if (claimed != DLOCK_OK && claimed != DLOCK_EREDIS && t->queue) {
        /* R4: a refused claim ends the wait (its call returns the
         * refusal): out of the queues where its earlier tries may have
         * queued the client, and its ticket gone */
        leave_wait(c, e, -1, 0, NULL);
        h->ticket = 0;
    } else if (rc == DLOCK_EREDIS && t->queue) {
        /* As a lock's waiting try (rlmode.c): on while its deadline leaves
         * time for another; else the wait ends, and the nodes that
         * answered may have queued the client on the slots asked. */
        int64_t pause = dlock_rlmode_retry_ms(c, c->lease_ms / 10) * DLOCK_NS_PER_MS;
        again = t->deadline == DLOCK_NEVER || dlock_now_ns() + pause + DLOCK_NS_PER_MS < t->deadline;
        if (!again) {
            leave_wait(c, e, -1, 0, NULL);
            h->ticket = 0;
            if (h->kept)
                give_back(c, e, h->kept_k, h->kept, 0);
            h->kept = 0;
        }
    }
    trace_try(c, e, t, limit, again ? DLOCK_EBUSY : rc, -1, NULL, how, &cl);
    pthread_mutex_unlock(&e->mu);
    if (again)
        return dlock_err_set(DLOCK_EBUSY, "%s", why);
    if (rc == DLOCK_EBUSY && !asked)
        return dlock_err_set(DLOCK_EBUSY, "this client holds every permit of '%s' (limit %u): "
                             "its threads use them all", e->name, limit);
    if (rc == DLOCK_EBUSY)
        return dlock_err_set(DLOCK_EBUSY, "every slot of the semaphore '%s' this client does "
                             "not hold is held by others (or their quorums split)", e->name);
    return dlock_err_set(rc, "%s", why);
}

int dlock_rlsem_granted(dlock_client *c, dlock_entry *e, dlock_sem_try *t)
{
    dlock_redlock_slots *h = e->lease.rls;
    int at = -1;
    for (unsigned i = 0; i < h->n && at < 0; i++)
        if (h->s[i].k == h->fresh_k && h->s[i].g.attempt == h->fresh)
            at = (int)i;
    h->fresh = 0;
    if (at < 0) {
        /* the renewal found a slot of the permits gone while this try was
         * answered, and took the fresh slot out with them (M8): not this
         * client's any more */
        dlock_trace_event(c->trace, "sem.rlgranted", e->name, "%s %d 0 0 -", t->nonce,
                          DLOCK_EBUSY);
        return dlock_err_set(DLOCK_EBUSY, "the permits of '%s' were lost while a try of it "
                             "was answered (a slot gone, found by the renewal)", e->name);
    }
    dlock_redlock_slot fresh = h->s[at];
    if (e->lease.state != DLOCK_LEASE_HELD || !e->lease.sem) {
        /* R1: the others are stale (their permits were lost): back, and
         * the fresh slot alone is counted */
        h->s[at] = h->s[--h->n];
        stale_out(c, e);
        h->s[h->n++] = fresh;
        at = (int)h->n - 1;
    }
    /* The permits are valid until their slots' earliest. Taken up after it
     * (the caller held up past the fresh slot's validity, or a slot held
     * before ran out unconfirmed, its renewal late, not yet found gone:
     * M8), the nodes may have ended it: as a single server's grant
     * answered late (sem.c), the fresh slot goes back. */
    int64_t valid = DLOCK_NEVER;
    for (unsigned i = 0; i < h->n; i++)
        if (h->s[i].g.valid_boot < valid)
            valid = h->s[i].g.valid_boot;
    if (dlock_boot_ns() >= valid) {
        h->s[at] = h->s[--h->n];
        (void)dlock_renew_rl_slots_sync(c->renew, e); /* (fewer: no allocation) */
        give_back(c, e, fresh.k, fresh.g.attempt, 0);
        dlock_trace_event(c->trace, "sem.rlgranted", e->name, "%s %d 0 0 -", t->nonce,
                          DLOCK_EREDIS);
        return dlock_err_set(DLOCK_EREDIS, "timed out: the acquire of a permit of '%s' was "
                             "taken up after the permit could have ended (the new one, or one "
                             "held before whose renewal was late); the new one given back",
                             e->name);
    }
    t->held = h->n;
    t->sent_boot = valid - (int64_t)c->lease_ms * DLOCK_NS_PER_MS + c->drift_ns;
    /* (sim/trace_sem.lua, sem.rlgranted: the permits counted, their
     * validity, the slots) */
    if (c->trace) {
        char slots[DLOCK_REDLOCK_SLOTS_TEXT];
        dlock_redlock_slots_text(h, slots, sizeof slots);
        dlock_trace_event(c->trace, "sem.rlgranted", e->name, "%s %d %u %" PRId64 " %s",
                          t->nonce, DLOCK_OK, t->held, valid, slots);
    }
    return DLOCK_OK;
}

void dlock_rlsem_ungrant(dlock_client *c, dlock_entry *e, const char *nonce)
{
    dlock_redlock_slots *h = e->lease.rls;
    uint64_t attempt = strtoull(nonce, NULL, 10);
    for (unsigned i = 0; i < h->n; i++)
        if (h->s[i].g.attempt == attempt) {
            unsigned k = h->s[i].k;
            h->s[i] = h->s[--h->n];
            (void)dlock_renew_rl_slots_sync(c->renew, e); /* (fewer: no allocation) */
            give_back(c, e, k, attempt, 0);
            return;
        }
}

void dlock_rlsem_tidy(dlock_client *c, dlock_entry *e)
{
    stale_out(c, e);
}

/* Releases the slots s[0 .. n), taken out of e's before (and the renewal
 * quiesced). DLOCK_OK, DLOCK_ELOST if one was no longer held by a
 * majority, else the first failure (its message). */
static int release_slots(dlock_client *c, dlock_entry *e, const dlock_redlock_slot *s,
                         unsigned n)
{
    char *kbuf = malloc(dlock_redlock_slot_keys_size(e->keys)), *keys[DLOCK_SCRIPT_KEYS];
    if (!kbuf)
        return dlock_err_set(DLOCK_ENOMEM, "out of memory (the permits end within a lease)");
    int rc = DLOCK_OK;
    char why[700] = "";
    for (unsigned i = 0; i < n; i++) {
        dlock_redlock_slot_keys(e->keys, s[i].k, kbuf, keys);
        dlock_redlock_req q = {.name = e->name, .keys = keys, .args = &c->args,
                               .client_name = c->conn.client_name, .attempt = s[i].g.attempt,
                               .deadline = dlock_rlmode_exchange_deadline(c)};
        int r = dlock_redlock_release(c->redlock, &q, &s[i].g);
        if (r != DLOCK_OK && (rc == DLOCK_OK || (r == DLOCK_ELOST && rc != DLOCK_ELOST))) {
            rc = r;
            snprintf(why, sizeof why, "%s", dlock_last_error());
        }
    }
    free(kbuf);
    return rc == DLOCK_OK ? DLOCK_OK : dlock_err_set(rc, "%s", why);
}

/* Takes up to `count` of e's slots out (the last ones; all with count
 * UINT32_MAX) into *out (*n of them), the registration following.
 * DLOCK_OK, or DLOCK_ENOMEM (none taken out). */
static int take_out(dlock_client *c, dlock_entry *e, unsigned count, dlock_redlock_slot **out,
                    unsigned *n)
{
    pthread_mutex_lock(&e->mu);
    dlock_redlock_slots *h = e->lease.rls;
    *n = h ? (count < h->n ? count : h->n) : 0;
    *out = *n ? malloc(sizeof **out * *n) : NULL;
    if (*n && !*out) {
        pthread_mutex_unlock(&e->mu);
        *n = 0;
        return dlock_err_set(DLOCK_ENOMEM, "out of memory");
    }
    if (*n) {
        memcpy(*out, h->s + h->n - *n, sizeof **out * *n);
        h->n -= *n;
        (void)dlock_renew_rl_slots_sync(c->renew, e); /* (fewer: no allocation) */
    }
    pthread_mutex_unlock(&e->mu);
    return DLOCK_OK;
}

int dlock_rlsem_release(dlock_client *c, dlock_entry *e, unsigned count)
{
    char number[24]; /* (its slots' releases are numbered by their attempts: this
                        one, unused by the nodes, numbers the call for the trace) */
    dlock_rpc_number(c, number);
    dlock_trace_event(c->trace, "sem.rel", e->name, "%s %u", number, count);
    dlock_redlock_slot *s;
    unsigned n;
    int rc = take_out(c, e, count, &s, &n);
    if (rc != DLOCK_OK)
        return rc;
    if (n) {
        dlock_renew_quiesce(c->renew); /* no renewal of them after their release */
        rc = release_slots(c, e, s, n);
        free(s);
    }
    if (rc == DLOCK_OK && n < count)
        /* fewer slots than permits counted: the renewal found one gone and
         * took the others out (M8) */
        rc = dlock_err_set(DLOCK_ELOST, "the permits of '%s' were lost before their release "
                           "(the renewal found a slot gone)", e->name);
    if (rc == DLOCK_ELOST) {
        /* M8: one lost, every permit of the name is: the other slots go
         * back too */
        char keep[700];
        snprintf(keep, sizeof keep, "%s", dlock_last_error());
        if (take_out(c, e, UINT32_MAX, &s, &n) == DLOCK_OK && n) {
            dlock_renew_quiesce(c->renew);
            (void)release_slots(c, e, s, n);
            free(s);
        }
        rc = dlock_err_set(DLOCK_ELOST, "%s", keep);
    }
    return rc;
}

void dlock_rlsem_leave(dlock_client *c, dlock_entry *e, uint64_t gave_up)
{
    char number[24];
    dlock_rpc_number(c, number);
    dlock_trace_event(c->trace, "sem.leave", e->name, "%s %" PRIu64, number, gave_up);
    pthread_mutex_lock(&e->mu);
    dlock_redlock_slots *h = e->lease.rls;
    uint64_t q = 0; /* R2: the slots its tries asked, and its home */
    unsigned limit = 0;
    if (h) {
        limit = h->limit;
        q = h->queued | (h->home ? 1ull << (h->home - 1) : 0);
        for (unsigned i = 0; i < h->n; i++)
            q &= ~(1ull << h->s[i].k); /* (never: R2; a leave would give that grant up) */
        if (h->kept)
            give_back(c, e, h->kept_k, h->kept, 0);
        h->home = 0;
        h->queued = 0;
        h->kept = 0;
        h->ticket = 0;
    }
    pthread_mutex_unlock(&e->mu);
    if (!q)
        return;
    char keep[256]; /* the caller's own error message stays the one reported */
    snprintf(keep, sizeof keep, "%s", dlock_last_error());
    char *kbuf = malloc(dlock_redlock_slot_keys_size(e->keys)), *keys[DLOCK_SCRIPT_KEYS];
    /* (one row: a node that failed one leave is not asked for the others,
     * dlock_redlock_leave_past, and gets them in the background) */
    int down[DLOCK_REDLOCK_NODES_MAX] = {0};
    for (unsigned k = 0; k < limit; k++) {
        if (!(q >> k & 1))
            continue;
        int rc = DLOCK_ENOMEM;
        if (kbuf) {
            dlock_redlock_slot_keys(e->keys, k, kbuf, keys);
            dlock_redlock_req lq = {.name = e->name, .keys = keys, .args = &c->args,
                                    .client_name = c->conn.client_name,
                                    .attempt = strtoull(number, NULL, 10),
                                    .deadline = dlock_rlmode_exchange_deadline(c)};
            rc = dlock_redlock_leave_past(c->redlock, &lq, down, 0);
        }
        if (rc != DLOCK_OK) {
            /* the nodes that did not answer, in the background */
            uint32_t skip = 0;
            for (unsigned i = 0; kbuf && i < dlock_redlock_nodes(c->redlock); i++)
                skip |= (uint32_t)!down[i] << i;
            dlock_renew_rl_slot_job(c->renew, e, k, 1, number, skip);
        }
    }
    free(kbuf);
    dlock_err_set(0, "%s", keep);
}
