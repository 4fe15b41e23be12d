/*
 * Prometheus text format of the client's counters (see metrics.h). The
 * counters are read one by one with atomic loads while other threads keep
 * counting, so one scrape is not a snapshot: a histogram's count may trail
 * its sum by a call or two, as with any live exporter.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"

/* The label value: client_name with '"' and '\\' escaped. */
static void label(char *out, size_t n, const char *name)
{
    size_t k = 0;
    for (const char *p = name ? name : ""; *p && k + 2 < n; p++) {
        if (*p == '"' || *p == '\\')
            out[k++] = '\\';
        out[k++] = *p;
    }
    out[k] = '\0';
}

static void head(FILE *f, const char *metric, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", metric, help, metric, type);
}

static void one(FILE *f, const char *metric, const char *type, const char *help,
                const char *client, uint64_t *v)
{
    head(f, metric, type, help);
    fprintf(f, "%s{client=\"%s\"} %" PRIu64 "\n", metric, client, dlock_load_64(v));
}

static void hist(FILE *f, const char *metric, const char *help, const char *client, dlock_hist *h)
{
    head(f, metric, "histogram", help);
    uint64_t cum = 0;
    double bound_s = 16e-6;
    for (int i = 0; i < DLOCK_HIST_BUCKETS - 1; i++, bound_s *= 2) {
        cum += dlock_load_64(&h->n[i]);
        fprintf(f, "%s_bucket{client=\"%s\",le=\"%.9g\"} %" PRIu64 "\n", metric, client, bound_s,
                cum);
    }
    cum += dlock_load_64(&h->n[DLOCK_HIST_BUCKETS - 1]);
    fprintf(f, "%s_bucket{client=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", metric, client, cum);
    fprintf(f, "%s_sum{client=\"%s\"} %.9f\n", metric, client, dlock_load_64(&h->sum_ns) / 1e9);
    fprintf(f, "%s_count{client=\"%s\"} %" PRIu64 "\n", metric, client, cum);
}

static void by_code(FILE *f, const char *metric, const char *help, const char *client,
                    uint64_t *rc)
{
    head(f, metric, "counter", help);
    for (int i = 1; i < DLOCK_NCODES; i++)
        fprintf(f, "%s{client=\"%s\",code=\"%s\"} %" PRIu64 "\n", metric, client,
                dlock_err_name(-i), dlock_load_64(&rc[i]));
}

/* The single-valued metrics: where each counter is in dlock_counters (in
 * the subscriber's own counters for `sub`). */
static const struct simple {
    const char *metric, *type, *help;
    size_t offset;
    int sub;
} SIMPLE[] = {
    {"dlock_acquisitions_total", "counter", "Successful dlock_acquire calls, nested ones included.",
     offsetof(dlock_counters, acquisitions), 0},
    {"dlock_acquire_timeouts_total", "counter", "dlock_acquire calls that returned DLOCK_ETIMEDOUT.",
     offsetof(dlock_counters, acquire_rc[-DLOCK_ETIMEDOUT]), 0},
    {"dlock_acquire_busy_total", "counter",
     "Single tries (wait_ms 0) that found the lock held (DLOCK_EBUSY).",
     offsetof(dlock_counters, acquire_rc[-DLOCK_EBUSY]), 0},
    {"dlock_grants_total", "counter", "Leases granted by Redis.",
     offsetof(dlock_counters, grants), 0},
    {"dlock_direct_grants_total", "counter",
     "Grants made by another client's release, taken from its message.",
     offsetof(dlock_counters, direct_grants), 0},
    {"dlock_handoffs_total", "counter",
     "Leases passed between threads of this client with no Redis command.",
     offsetof(dlock_counters, handoffs), 0},
    {"dlock_leases_held", "gauge", "Leases held now.", offsetof(dlock_counters, leases_held), 0},
    {"dlock_leases_lost_total", "counter", "Held leases found lost.",
     offsetof(dlock_counters, leases_lost), 0},
    {"dlock_forced_releases_total", "counter",
     "Held leases an operator released (dlockctl release --force).",
     offsetof(dlock_counters, forced_releases), 0},
    {"dlock_unclean_total", "counter",
     "Holds that followed an unclean end of the one before (dlock_unclean).",
     offsetof(dlock_counters, unclean), 0},
    {"dlock_abandoned_total", "counter",
     "Locks released by the library for a holder thread that exited.",
     offsetof(dlock_counters, abandoned), 0},
    {"dlock_protocol_resends_total", "counter",
     "Acquire attempts sent again in the other protocol, the name's data being in it.",
     offsetof(dlock_counters, protocol_resends), 0},
    {"dlock_shared_acquisitions_total", "counter",
     "Of acquisitions, those in shared mode (dlock_acquire_shared).",
     offsetof(dlock_counters, shared_acquisitions), 0},
    {"dlock_shared_joins_total", "counter",
     "Shared acquires that joined this client's held shared lease with no Redis command.",
     offsetof(dlock_counters, shared_joins), 0},
    {"dlock_sem_acquisitions_total", "counter",
     "Of acquisitions, semaphore permits taken (dlock_sem_acquire).",
     offsetof(dlock_counters, sem_acquisitions), 0},
    {"dlock_sem_passes_total", "counter",
     "Semaphore permits passed between this client's threads with no Redis command.",
     offsetof(dlock_counters, sem_passes), 0},
    {"dlock_entries", "gauge", "Names some thread of this client holds or waits for.",
     offsetof(dlock_counters, entries), 0},
    {"dlock_redis_commands_total", "counter", "Commands sent to Redis by lock calls and renewals.",
     offsetof(dlock_counters, redis_commands), 0},
    {"dlock_redis_round_trips_total", "counter",
     "Round trips to Redis by lock calls and renewals (a pipeline counts once).",
     offsetof(dlock_counters, redis_round_trips), 0},
    {"dlock_subscriber_commands_total", "counter",
     "Commands of the subscriber thread (SUBSCRIBE, keepalive, connection setup).",
     offsetof(dlock_counters, redis_commands), 1},
    {"dlock_renew_rounds_total", "counter", "Renewal rounds.",
     offsetof(dlock_counters, renew_rounds), 0},
    {"dlock_renew_failures_total", "counter", "Renewal rounds that left some lease unconfirmed.",
     offsetof(dlock_counters, renew_failures), 0},
    {"dlock_renewed_leases_total", "counter", "Leases Redis confirmed renewed.",
     offsetof(dlock_counters, renewed), 0},
};

char *dlock_metrics_prometheus(dlock_counters *c, dlock_counters *sub, const char *client_name)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    char cl[2 * DLOCK_CLIENT_NAME_MAX + 1];
    label(cl, sizeof cl, client_name);
    for (size_t i = 0; i < sizeof SIMPLE / sizeof SIMPLE[0]; i++) {
        const struct simple *m = &SIMPLE[i];
        one(f, m->metric, m->type, m->help, cl,
            (uint64_t *)((char *)(m->sub ? sub : c) + m->offset));
    }
    by_code(f, "dlock_acquire_returns_total",
            "dlock_acquire calls that did not succeed, by return code.", cl, c->acquire_rc);
    by_code(f, "dlock_release_errors_total", "dlock_release calls that failed, by return code.",
            cl, c->release_rc);
    hist(f, "dlock_wait_seconds", "Time dlock_acquire took, for successful calls.", cl, &c->wait);
    hist(f, "dlock_hold_seconds", "Time from the outermost acquire to the outermost release.",
         cl, &c->hold);
    hist(f, "dlock_renew_seconds", "Round trip of a renewal round's pipeline.", cl, &c->renew);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
