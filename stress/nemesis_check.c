/*
 * nemesis_check.c: the nemesis soak's checker (see nemesis.h). It runs in the
 * runner after every worker has exited, over the complete records of the
 * history, the store's final state and the list of injected faults, and
 * checks:
 *
 *   overlap   no two holders of a name at once by their own clocks, but
 *             readers beside readers: the intervals [t_acq, t_end] of
 *             records whose holder still saw its lease valid (dlock_held
 *             said 1) after its store calls never intersect, threads of one
 *             process included, unless both holds are shared (a shared
 *             hold beside an exclusive one counts as overlaps_shared). An
 *             overlap is excused only by a fault the docs say may revoke a grant (a
 *             restart that lost the data, a forward step of the server
 *             clock, a failover when min_replicas is 0) that the older grant
 *             predates and after which the later one came within a lease
 *             time (excuse() below says exactly).
 *             Pauses need no excuse: a holder paused past its lease finds it
 *             lost (t_end 0), which is what the library promises. In
 *             Redlock mode (in->redlock) a wipe excuses nothing: a
 *             restarted node votes only once seeded, a lease and the
 *             drift allowance after its run began, when every grant of
 *             its previous run has ended (docs/design.md, "Redlock").
 *   order     tokens of those records held exclusively strictly increase
 *             in grant order (their t_acq order), across every fault
 *             injected, except between two records whose overlap that rule
 *             excuses (a holder whose lease was revoked hands on its own
 *             tokens until it learns of the loss)
 *   readers   the guide's promise for a shared token ("Shared mode",
 *             Tokens; lua/p2/LAYOUT.txt, "Tokens"): above every token
 *             handed out before it, and below every exclusive token handed
 *             out after it. Judged on the records above (holders that saw
 *             their lease valid), each reader R against each exclusive
 *             holder W of its name: W's dlock_acquire returned before R's
 *             was called (W's token was handed out before R's grant) =>
 *             W.token < R.token; W's dlock_acquire was called after R's
 *             returned (after R's grant) => W.token > R.token. (A reader
 *             joining its client's lease gets a grant older than its call;
 *             an exclusive grant between the two would stand beside that
 *             valid lease: a fault of exclusion, which this rule then
 *             catches too.) The same excuse as for order applies. And the
 *             store: a reader's read is refused only if an exclusive holder
 *             read with a token at or above the reader's; a reader still
 *             holding its lease after such a refusal is a violation (an
 *             exclusive token handed out after its grant while its lease
 *             lived), unless a fault that may revoke a grant came after
 *             the reader's grant and before its hold ended
 *   sem       a semaphore's limit (--sem-pct): never more than the limit
 *             holders of a semaphore name at once, counting only the
 *             holds the library still counted valid when they ended: a
 *             hold [t_acq, t_end] (from dlock_sem_acquire's return to the
 *             dlock_sem_release call) counts if that release returned
 *             anything but DLOCK_ELOST (it checked the permit's validity,
 *             a lease renewed in time by this host's clock less the drift
 *             margin, after t_end: so the permit was valid through the
 *             whole hold, as no renewal revives a permit that ran out); a
 *             hold released with DLOCK_ELOST (lost or run out while held:
 *             a paused holder, one cut off from Redis) is left out whole,
 *             since when it was lost is not known; a killed worker's last
 *             holds have no record. At each counted hold's t_acq, the
 *             counted holds of its name open then (their t_end later) and
 *             itself must number at most the limit. An excess is excused
 *             only within a fault that may end permits in Redis while
 *             their holders still count them (a restart that lost the
 *             data, a forward step of the server clock, a failover when
 *             min_replicas is 0: the lease assumptions of lua/p2/SEM.txt,
 *             "CLOCK") and a lease time + 1 s after it healed, when every
 *             permit granted before it has run out in its client (no
 *             token tells a permit granted before the fault from one
 *             granted after it, so the whole window is excused). Steps of
 *             the clock back, of any size, excuse nothing.
 *   lost      no fenced update lost: per name, the store's value equals its
 *             count of accepted writes (each accepted write stored the value
 *             its holder read plus one)
 *   recovery  after each burst of faults, every name (semaphores' too) is
 *             acquired again
 *             within the stated bound; and every name is acquired again
 *             after the last fault healed
 *
 * Single-threaded; reads the shared region only after the workers exited.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock.h"
#include "nemesis.h"

#define MS(ns) ((long long)((ns) / 1000000LL))

static int by_name_then_acq(const void *a, const void *b)
{
    const nm_rec *x = *(const nm_rec *const *)a, *y = *(const nm_rec *const *)b;
    if (x->name != y->name)
        return x->name < y->name ? -1 : 1;
    return (x->t_acq > y->t_acq) - (x->t_acq < y->t_acq);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/*
 * A fault that may revoke a grant, excusing an overlap (or a token out of
 * order) between records a and b (a acquired first), or NULL. The checker
 * cannot tell a grant from Redis from a local handoff of one (both are
 * dlock_acquire returning OK), and a client hands a grant to its threads
 * until it learns of the loss, so a grant revoked by the fault lives on in
 * its client for up to a lease time after the fault. So: the older of the
 * two grants was issued before the fault (its token, a server time, is at
 * most the master's TIME read just before the fault plus 20 ms, far below
 * the smallest forward step or restart the nemesis makes) and no more
 * than 60 s below it (a grant, renewed or not, is passed on for seconds
 * here: a token sent back by a step of the clock of a minute or more, the
 * bug a clockfar step would bring out, is not excused), and the later one came
 * after the fault began and within a lease time (+1 s for the holder's
 * renewal round and scheduling) after it healed.
 */
static const nm_event *excuse_span(const nm_check_in *in, uint64_t older, int64_t t_lo,
                                   int64_t t_hi)
{
    for (int i = 0; i < in->nev; i++) {
        const nm_event *e = &in->ev[i];
        if (!e->done || !e->server_us)
            continue;
        int revokes = (e->kind == NM_WIPE && !in->redlock) || e->kind == NM_CLOCK_FWD ||
                      (e->kind == NM_FAILOVER && in->excuse_failover);
        if (revokes && older <= e->server_us + 20000 && older + 60000000u >= e->server_us &&
            e->t_start <= t_hi && t_lo <= e->t_heal + (in->lease_ms + 1000) * 1000000LL)
            return e;
    }
    return NULL;
}

/* A fault that may have ended permits in Redis that their holders still
 * counted, and whose window ([start, heal + lease + 1 s]) holds t; or NULL
 * (the "sem" check at the top). */
static const nm_event *excuse_sem(const nm_check_in *in, int64_t t)
{
    for (int i = 0; i < in->nev; i++) {
        const nm_event *e = &in->ev[i];
        if (!e->done)
            continue;
        int revokes = (e->kind == NM_WIPE && !in->redlock) || e->kind == NM_CLOCK_FWD ||
                      (e->kind == NM_FAILOVER && in->excuse_failover);
        if (revokes && e->t_start <= t && t <= e->t_heal + (in->lease_ms + 1000) * 1000000LL)
            return e;
    }
    return NULL;
}

static const nm_event *excuse(const nm_check_in *in, const nm_rec *a, const nm_rec *b)
{
    return excuse_span(in, a->token < b->token ? a->token : b->token, b->t_acq, b->t_acq);
}

static const char *mode(const nm_rec *r)
{
    return r->shared ? "shared" : "exclusive";
}

/* Prints the faults active within lease + 1 s before t1 up to t2. */
static void near(const nm_check_in *in, int64_t t1, int64_t t2)
{
    for (int i = 0; i < in->nev; i++) {
        const nm_event *e = &in->ev[i];
        if (e->done && e->t_heal >= t1 - (in->lease_ms + 1000) * 1000000LL && e->t_start <= t2)
            fprintf(stderr, "nemesis:   near it: %s (%ld) from %lld to %lld ms\n",
                    nm_fault_names[e->kind], e->arg, MS(e->t_start), MS(e->t_heal));
    }
}

/* The first acquisition completed after t (sorted times), or -1. */
static int64_t first_after(const int64_t *t, size_t n, int64_t at)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t[mid] <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n ? t[lo] : -1;
}

int nm_check(const nm_check_in *in, char *out, size_t outsz)
{
    nm_shared *sh = in->sh;
    uint64_t n = sh->next < sh->cap ? sh->next : sh->cap;
    nm_rec **v = malloc((n ? n : 1) * sizeof *v);
    nm_rec **sv = malloc((n ? n : 1) * sizeof *sv); /* permits' holds */
    int64_t *times = malloc((n ? n : 1) * sizeof *times);
    if (!v || !sv || !times) {
        free(v);
        free(sv);
        free(times);
        snprintf(out, outsz, "\"error\": \"out of memory\"");
        return 1;
    }
    size_t nv = 0, nt = 0, incomplete = 0, read_ok = 0, write_ok = 0, not_held = 0;
    size_t read_refused = 0, write_refused = 0, reads = 0, reads_ok = 0, reads_refused = 0;
    long refused_held = 0, refused_held_excused = 0;
    size_t nsv = 0, sem_holds = 0, sem_elost = 0;
    for (uint64_t i = 0; i < n; i++) {
        nm_rec *r = &sh->recs[i];
        if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) { /* pairs with the worker's release */
            incomplete++;
            continue;
        }
        times[nt++] = r->t_acq;
        if (r->sem) {
            sem_holds++;
            if (r->rel_rc == DLOCK_ELOST)
                sem_elost++;
            else
                sv[nsv++] = r;
            continue;
        }
        if (r->shared) {
            reads++;
            reads_ok += r->read_ok;
            if (!r->store_error && !r->read_ok) {
                reads_refused++;
                /* Refused, yet the lease still valid after the read. */
                if (r->t_end && excuse_span(in, r->token, r->t_acq, r->t_end)) {
                    refused_held_excused++;
                } else if (r->t_end && ++refused_held <= 5) {
                    fprintf(stderr, "nemesis: READ REFUSED name n%u: proc %u held shared token %"
                            PRIu64 " [%lld, %lld] ms, the store had seen %lld\n", r->name, r->proc,
                            r->token, MS(r->t_acq), MS(r->t_end), (long long)r->value);
                    near(in, r->t_acq, r->t_end);
                }
            }
        } else {
            read_ok += r->read_ok;
            write_ok += r->write_ok;
        }
        if (!r->store_error && !r->shared) {
            read_refused += !r->read_ok;
            write_refused += r->read_ok && !r->write_ok;
        }
        if (r->t_end)
            v[nv++] = r;
        else
            not_held++;
    }
    qsort(v, nv, sizeof *v, by_name_then_acq);
    qsort(times, nt, sizeof *times, cmp_i64);

    long violations = 0, overlaps = 0, excused = 0, order = 0, order_excused = 0;
    long overlaps_shared = 0, rtok = 0, rtok_excused = 0;
    uint64_t rpairs = 0; /* reader-writer pairs whose order the clocks settle */
    /* Per name, in grant (t_acq) order: each record against every earlier
     * interval still open at its grant (overlap), and its token against the
     * highest token of the earlier records whose order was not excused. */
    size_t acap = 64, na = 0;
    const nm_rec **act = malloc(acap * sizeof *act);
    for (size_t i = 0; act && i < nv;) {
        size_t j;
        const nm_rec *top = NULL; /* the record with the highest token so far */
        na = 0;
        for (j = i; j < nv && v[j]->name == v[i]->name; j++) {
            const nm_rec *b = v[j];
            if (b->shared) {
                /* judged below (readers) */
            } else if (top && b->token <= top->token) {
                if (excuse(in, top, b)) {
                    order_excused++;
                } else if (++order <= 5) {
                    fprintf(stderr, "nemesis: ORDER name n%u: token %" PRIu64 " (proc %u, at %lld ms) "
                            "after %" PRIu64 " (proc %u, at %lld ms)\n", b->name, b->token, b->proc,
                            MS(b->t_acq), top->token, top->proc, MS(top->t_acq));
                    near(in, top->t_acq, b->t_acq);
                }
            } else {
                top = b;
            }
            size_t k = 0;
            for (size_t a = 0; a < na; a++) {
                const nm_rec *o = act[a];
                if (o->t_end <= b->t_acq)
                    continue; /* closed before b's grant: drop it */
                act[k++] = o;
                if (o->shared && b->shared)
                    continue; /* readers beside readers */
                long *count = o->shared || b->shared ? &overlaps_shared : &overlaps;
                if (excuse(in, o, b)) {
                    excused++;
                } else if (++*count <= 5) {
                    fprintf(stderr, "nemesis: OVERLAP name n%u: proc %u held token %" PRIu64
                            " (%s) [%lld, %lld] ms, proc %u got token %" PRIu64
                            " (%s) at %lld ms\n",
                            b->name, o->proc, o->token, mode(o), MS(o->t_acq), MS(o->t_end),
                            b->proc, b->token, mode(b), MS(b->t_acq));
                    near(in, o->t_acq, b->t_acq);
                }
            }
            na = k;
            if (na == acap) {
                const nm_rec **bigger = realloc(act, 2 * acap * sizeof *act);
                if (!bigger)
                    break;
                act = bigger;
                acap *= 2;
            }
            act[na++] = b;
        }
        /* Readers: each shared record R of the name against each exclusive
         * one W, by the guide's promise (the comment at the top). */
        for (size_t x = i; x < j; x++) {
            const nm_rec *r = v[x];
            if (!r->shared)
                continue;
            int low = 0, high = 0;
            for (size_t y = i; y < j; y++) {
                const nm_rec *w = v[y];
                if (w->shared)
                    continue;
                const char *what = NULL;
                rpairs += w->t_acq < r->t_req || w->t_req > r->t_acq;
                if (w->t_acq < r->t_req && w->token >= r->token && !low) {
                    if (excuse(in, w, r)) {
                        rtok_excused++;
                        continue;
                    }
                    low = 1;
                    what = "not above exclusive token";
                } else if (w->t_req > r->t_acq && w->token <= r->token && !high) {
                    if (excuse(in, r, w)) {
                        rtok_excused++;
                        continue;
                    }
                    high = 1;
                    what = "not below exclusive token";
                }
                if (what && ++rtok <= 5) {
                    fprintf(stderr, "nemesis: READER TOKEN name n%u: proc %u shared token %" PRIu64
                            " (acquire %lld to %lld ms) %s %" PRIu64 " (proc %u, acquire %lld "
                            "to %lld ms)\n", r->name, r->proc, r->token, MS(r->t_req),
                            MS(r->t_acq), what, w->token, w->proc, MS(w->t_req), MS(w->t_acq));
                    near(in, w->t_acq < r->t_acq ? w->t_acq : r->t_acq,
                         w->t_acq > r->t_acq ? w->t_acq : r->t_acq);
                }
            }
        }
        i = j;
    }
    if (!act) {
        fprintf(stderr, "nemesis: out of memory\n");
        violations++;
    }
    free(act);
    violations += overlaps + order + overlaps_shared + rtok + refused_held;

    /* Semaphores: per name, in t_acq order, each counted hold against the
     * counted holds still open at its t_acq (the "sem" check at the top). */
    long sem_over = 0, sem_excused = 0;
    int sem_max = 0;
    qsort(sv, nsv, sizeof *sv, by_name_then_acq);
    size_t sna = 0;
    const nm_rec **sact = malloc((nsv ? nsv : 1) * sizeof *sact);
    for (size_t i = 0; sact && i < nsv; i++) {
        const nm_rec *b = sv[i];
        if (i == 0 || sv[i - 1]->name != b->name)
            sna = 0;
        size_t k = 0;
        for (size_t a = 0; a < sna; a++)
            if (sact[a]->t_end > b->t_acq)
                sact[k++] = sact[a];
        sact[k++] = b;
        sna = k;
        if ((int)sna > sem_max)
            sem_max = (int)sna;
        if ((int)sna <= sh->sem_limit)
            continue;
        if (excuse_sem(in, b->t_acq)) {
            sem_excused++;
        } else if (++sem_over <= 5) {
            fprintf(stderr, "nemesis: SEM OVER LIMIT name s%d: %zu holders at %lld ms (limit %d):",
                    b->name - sh->names, sna, MS(b->t_acq), sh->sem_limit);
            for (size_t a = 0; a < sna; a++)
                fprintf(stderr, " proc %u [%lld, %lld]", sact[a]->proc, MS(sact[a]->t_acq),
                        MS(sact[a]->t_end));
            fputc('\n', stderr);
            near(in, sact[0]->t_acq, b->t_acq);
        }
    }
    if (!sact) {
        fprintf(stderr, "nemesis: out of memory\n");
        violations++;
    }
    free(sact);
    violations += sem_over;

    /* The store: value and accepted writes per name. */
    long long fenced = 0, lost = 0;
    int store_ok = 1;
    struct timeval tv = {5, 0};
    redisContext *rc = redisConnectWithTimeout("127.0.0.1", in->store_port, tv);
    if (rc && !rc->err)
        redisSetTimeout(rc, tv);
    for (int k = 0; k < sh->names; k++) {
        redisReply *r = rc && !rc->err ? redisCommand(rc, "HMGET store:n%d val n", k) : NULL;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            store_ok = 0;
        } else {
            long long val = r->element[0]->str ? atoll(r->element[0]->str) : 0;
            long long cnt = r->element[1]->str ? atoll(r->element[1]->str) : 0;
            fenced += cnt;
            if (val != cnt) {
                lost += cnt > val ? cnt - val : val - cnt;
                fprintf(stderr, "nemesis: LOST name n%d: %lld writes accepted, value %lld\n", k,
                        cnt, val);
            }
        }
        if (r)
            freeReplyObject(r);
    }
    if (rc)
        redisFree(rc);
    if (!store_ok) {
        fprintf(stderr, "nemesis: could not read the store\n");
        violations++;
    }
    violations += lost;

    /* Recovery. Per fault kind, the longest time from a fault's end to the
     * next acquisition (information: within a burst the next fault may come
     * before the system recovered). The check: after each burst, every name
     * acquired again within the bound; and every name acquired after the
     * last fault healed. */
    long long worst[NM_NFAULTS];
    int injected[NM_NFAULTS] = {0};
    int64_t last_heal = 0;
    for (int k = 0; k < NM_NFAULTS; k++)
        worst[k] = -1;
    for (int i = 0; i < in->nev; i++) {
        const nm_event *e = &in->ev[i];
        if (!e->done)
            continue;
        injected[e->kind]++;
        if (e->t_heal > last_heal)
            last_heal = e->t_heal;
        int64_t t = first_after(times, nt, e->t_heal);
        long long ms = t < 0 ? -1 : MS(t - e->t_heal);
        if (ms > worst[e->kind])
            worst[e->kind] = ms;
    }
    long slow = 0;
    long long worst_burst = -1;
    int all_names = sh->names + (sh->sem_pct ? sh->sem_names : 0); /* <= NM_MAX_NAMES */
    for (int w = 0; w < in->nquiet; w++) {
        int64_t q = in->quiet[w], all = 0;
        int missing = 0;
        for (int k = 0; k < all_names; k++) {
            int64_t first = 0; /* name k's first acquisition after q */
            for (uint64_t i = 0; i < n; i++) {
                const nm_rec *r = &sh->recs[i];
                if (r->done && r->name == k && r->t_acq > q && (!first || r->t_acq < first))
                    first = r->t_acq;
            }
            if (!first)
                missing++;
            else if (first > all)
                all = first;
        }
        long long ms = missing ? -1 : MS(all - q);
        if (missing || ms > in->recovery_bound_ms) {
            slow++;
            fprintf(stderr, "nemesis: RECOVERY after the burst that ended at %lld ms: %s%lld ms\n",
                    MS(q), missing ? "some names never again, " : "every name in ", ms);
            near(in, q - 20000000000LL, q);
        }
        if (ms > worst_burst)
            worst_burst = ms;
    }
    int64_t name_last[NM_MAX_NAMES] = {0};
    for (uint64_t i = 0; i < n; i++) {
        const nm_rec *r = &sh->recs[i];
        if (r->done && r->name < NM_MAX_NAMES && r->t_acq > name_last[r->name])
            name_last[r->name] = r->t_acq;
    }
    int stuck = 0;
    for (int k = 0; k < all_names; k++)
        if (name_last[k] <= last_heal) {
            stuck++;
            fprintf(stderr, "nemesis: STUCK name %s%d: not acquired after the last fault healed\n",
                    k < sh->names ? "n" : "s", k < sh->names ? k : k - sh->names);
        }
    violations += slow + stuck;

    uint64_t acquired = 0, shared_acq = 0, sem_acq = 0, lostcb = 0, rel_lost = 0, store_err = 0;
    uint64_t errs[NM_NERR] = {0};
    for (int p = 0; p < NM_MAX_PROCS; p++) {
        acquired += sh->procs[p].acquired;
        shared_acq += sh->procs[p].shared_acquired;
        sem_acq += sh->procs[p].sem_acquired;
        lostcb += sh->procs[p].lost;
        rel_lost += sh->procs[p].release_lost;
        store_err += sh->procs[p].store_errors;
        for (int e = 0; e < NM_NERR; e++)
            errs[e] += sh->procs[p].errors[e];
    }

    size_t o = 0;
#define PUT(...) o += (size_t)snprintf(out + o, o < outsz ? outsz - o : 0, __VA_ARGS__)
    PUT("\"acquisitions\": %" PRIu64 ", \"records\": %zu, \"records_incomplete\": %zu, ", acquired,
        nt, incomplete);
    PUT("\"fenced_writes\": %lld, \"stale_reads_refused\": %zu, \"stale_writes_refused\": %zu, ",
        fenced, read_refused, write_refused);
    PUT("\"lost_updates\": %lld, \"overlaps\": %ld, \"overlaps_excused\": %ld, ", lost, overlaps,
        excused);
    PUT("\"token_order_violations\": %ld, \"token_order_excused\": %ld, "
        "\"held_lost_before_end\": %zu, ", order, order_excused, not_held);
    PUT("\"read_pct\": %d, \"shared_acquisitions\": %" PRIu64 ", \"reads\": %zu, "
        "\"reads_ok\": %zu, \"reads_refused\": %zu, ", sh->read_pct, shared_acq, reads,
        reads_ok, reads_refused);
    PUT("\"overlaps_shared\": %ld, \"reader_token_violations\": %ld, "
        "\"reads_refused_held\": %ld, \"reader_excused\": %ld, \"reader_pairs_judged\": %"
        PRIu64 ", ", overlaps_shared, rtok, refused_held, rtok_excused + refused_held_excused,
        rpairs);
    PUT("\"sem_pct\": %d, \"sem_limit\": %d, \"sem_names\": %d, \"sem_acquisitions\": %" PRIu64
        ", \"sem_holds\": %zu, \"sem_holds_counted\": %zu, \"sem_release_elost\": %zu, "
        "\"sem_max_holders\": %d, \"sem_over_limit\": %ld, \"sem_excused\": %ld, ", sh->sem_pct,
        sh->sem_limit, sh->sem_pct ? sh->sem_names : 0, sem_acq, sem_holds, nsv, sem_elost, sem_max,
        sem_over, sem_excused);
    PUT("\"on_lost_calls\": %" PRIu64 ", \"release_elost\": %" PRIu64 ", \"store_errors\": %" PRIu64
        ", ", lostcb, rel_lost, store_err);
    uint64_t other = 0;
    for (int e = 0; e < NM_NERR; e++)
        if (e != -DLOCK_EREDIS && e != -DLOCK_ETIMEDOUT)
            other += errs[e];
    /* Never expected: an acquire error other than Redis failing or the wait
     * ending, the store not answering (no fault touches it), a history too
     * small for the run (its records would be missing from every check). */
    uint64_t overflow = sh->next > sh->cap ? sh->next - sh->cap : 0;
    if (other)
        fprintf(stderr, "nemesis: ERRORS %" PRIu64 " acquires failed with another error\n", other);
    if (store_err)
        fprintf(stderr, "nemesis: ERRORS %" PRIu64 " store calls failed\n", store_err);
    if (overflow)
        fprintf(stderr, "nemesis: ERRORS %" PRIu64 " records did not fit the history\n", overflow);
    violations += (long)(other + store_err + overflow);
    PUT("\"acquire_errors\": {\"EREDIS\": %" PRIu64 ", \"ETIMEDOUT\": %" PRIu64
        ", \"other\": %" PRIu64 "}, ", errs[-DLOCK_EREDIS], errs[-DLOCK_ETIMEDOUT], other);
    PUT("\"faults\": {");
    for (int k = 0; k < NM_NFAULTS; k++)
        PUT("%s\"%s\": %d", k ? ", " : "", nm_fault_names[k], injected[k]);
    PUT("}, \"faults_not_injected\": [");
    int firstm = 1;
    for (int k = 0; k < NM_NFAULTS; k++)
        if (!injected[k] && (in->asked & (1u << k))) {
            PUT("%s\"%s\"", firstm ? "" : ", ", nm_fault_names[k]);
            firstm = 0;
        }
    PUT("], \"history_overflow\": %" PRIu64 ", \"max_gap_after_fault_ms\": {", overflow);
    int first = 1;
    for (int k = 0; k < NM_NFAULTS; k++)
        if (injected[k]) {
            PUT("%s\"%s\": %lld", first ? "" : ", ", nm_fault_names[k], worst[k]);
            first = 0;
        }
    PUT("}, \"bursts\": %d, \"max_recovery_after_burst_ms\": %lld, \"recovery_bound_ms\": %ld, "
        "\"slow_recoveries\": %ld, \"names_stuck\": %d, \"check_violations\": %ld", in->nquiet,
        worst_burst, in->recovery_bound_ms, slow, stuck, violations);
#undef PUT
    free(v);
    free(sv);
    free(times);
    return violations > 0 ? (int)(violations > 1000000 ? 1000000 : violations) : 0;
}
