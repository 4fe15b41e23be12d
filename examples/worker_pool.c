/*
 * A thread pool whose jobs update accounts, each under a per-account dlock.
 *
 * Every job locks "account:<k>", reads the account's balance, adds to it and
 * writes it back in a "storage" that stands for a database, and unlocks. The
 * storage checks fencing tokens as the user guide's Fencing section says a real
 * one must: the token goes with the read and with the write, the storage
 * keeps the highest token that touched each account and refuses any read or
 * write below it (an equal token passes: one holder reads, then writes). So
 * a holder that lost its lease (paused past it, cut off from Redis) can
 * neither overwrite nor act on what a newer holder did. Here the storage
 * lives in the process; the user guide gives the same rule for a Redis store
 * (dlock_fenced_script, examples/fenced_counter.c) and for SQL. No operation
 * is refused unless a lease was really lost.
 *
 *   worker_pool [-h HOST:PORT | -s UNIX_SOCKET] [-t THREADS] [-j JOBS] [-a ACCOUNTS]
 *
 * Prints what it did and the client's counters; exits 0 if every job ran.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlock.h>

#define MAX_ACCOUNTS 1000

/* The "storage": one row per account with the highest fencing token that
 * has read or written it. */
static struct row {
    pthread_mutex_t mu; /* the storage's own latch, not the lock under test */
    long balance;
    uint64_t fence;
} rows[MAX_ACCOUNTS];

static long refused; /* operations refused for a stale token (guarded by refused_mu) */
static pthread_mutex_t refused_mu = PTHREAD_MUTEX_INITIALIZER;

/* Checks token against the row (called with r->mu): refused (0) if a higher
 * one has touched it, else the row's highest becomes token. */
static int storage_fence(struct row *r, uint64_t token)
{
    if (token < r->fence) {
        pthread_mutex_lock(&refused_mu);
        refused++;
        pthread_mutex_unlock(&refused_mu);
        return 0;
    }
    r->fence = token;
    return 1;
}

/* A read with its fencing token: 1 and *balance, or 0 if refused. */
static int storage_read(int account, uint64_t token, long *balance)
{
    struct row *r = &rows[account];
    pthread_mutex_lock(&r->mu);
    int ok = storage_fence(r, token);
    if (ok)
        *balance = r->balance;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* A write with its fencing token: 1, or 0 if refused. */
static int storage_write(int account, uint64_t token, long balance)
{
    struct row *r = &rows[account];
    pthread_mutex_lock(&r->mu);
    int ok = storage_fence(r, token);
    if (ok)
        r->balance = balance;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static dlock_client *client;
static int accounts = 100;
static long jobs_left; /* guarded by jobs_mu */
static long jobs_failed;
static pthread_mutex_t jobs_mu = PTHREAD_MUTEX_INITIALIZER;

/* Takes the next job: 1, or 0 when none is left. */
static int next_job(unsigned *seed, int *account)
{
    pthread_mutex_lock(&jobs_mu);
    int more = jobs_left > 0;
    if (more)
        jobs_left--;
    pthread_mutex_unlock(&jobs_mu);
    *account = (int)(rand_r(seed) % (unsigned)accounts);
    return more;
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    int account;
    while (next_job(&seed, &account)) {
        char name[32];
        snprintf(name, sizeof name, "account:%d", account);
        uint64_t token;
        int rc = dlock_acquire(client, name, 5000, &token); /* wait up to 5 s */
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire %s: %s: %s\n", name, dlock_err_name(rc),
                    dlock_last_error());
            pthread_mutex_lock(&jobs_mu);
            jobs_failed++;
            pthread_mutex_unlock(&jobs_mu);
            continue;
        }
        long balance; /* the protected work: a read-modify-write, fenced */
        if (storage_read(account, token, &balance))
            storage_write(account, token, balance + 1);
        rc = dlock_release(client, name);
        if (rc != DLOCK_OK) /* DLOCK_ELOST: the storage refused or will refuse */
            fprintf(stderr, "release %s: %s: %s\n", name, dlock_err_name(rc),
                    dlock_last_error());
    }
    return NULL;
}

int main(int argc, char **argv)
{
    dlock_config cfg;
    dlock_config_init(&cfg); /* always first: later fields get their defaults */
    char host[256];
    int threads = 16;
    long jobs = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-h")) {
            const char *colon = strrchr(argv[i + 1], ':');
            if (!colon || colon == argv[i + 1]) {
                fprintf(stderr, "-h wants HOST:PORT\n");
                return 2;
            }
            snprintf(host, sizeof host, "%.*s", (int)(colon - argv[i + 1]), argv[i + 1]);
            cfg.redis_host = host;
            cfg.redis_port = atoi(colon + 1);
        } else if (!strcmp(argv[i], "-s")) {
            cfg.redis_host = NULL;
            cfg.redis_unix_path = argv[i + 1];
        } else if (!strcmp(argv[i], "-t")) {
            threads = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "-j")) {
            jobs = atol(argv[i + 1]);
        } else if (!strcmp(argv[i], "-a")) {
            accounts = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (threads < 1 || threads > 1024 || accounts < 1 || accounts > MAX_ACCOUNTS || jobs < 0) {
        fprintf(stderr, "threads 1..1024, accounts 1..%d, jobs >= 0\n", MAX_ACCOUNTS);
        return 2;
    }
    cfg.key_prefix = "example:";
    int rc = dlock_client_open(&cfg, &client);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "dlock_client_open: %s: %s\n", dlock_strerror(rc), dlock_last_error());
        return 1;
    }
    for (int i = 0; i < MAX_ACCOUNTS; i++)
        pthread_mutex_init(&rows[i].mu, NULL);
    jobs_left = jobs;
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    if (!th)
        return 1;
    for (int i = 0; i < threads; i++)
        if ((errno = pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i)) != 0) {
            perror("pthread_create");
            return 1;
        }
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], NULL);
    free(th);
    long total = 0;
    for (int i = 0; i < accounts; i++)
        total += rows[i].balance;
    dlock_stats st;
    dlock_client_stats(client, &st);
    printf("dlock %s: %ld jobs on %d threads over %d accounts: %ld applied, %ld failed, "
           "%ld reads or writes refused for a stale token; %llu grants from Redis, %llu handoffs "
           "between threads, %llu Redis round trips\n",
           dlock_version(), jobs, threads, accounts, total, jobs_failed, refused,
           (unsigned long long)st.grants, (unsigned long long)st.handoffs,
           (unsigned long long)st.redis_round_trips);
    dlock_client_close(client);
    return jobs_failed == 0 && refused == 0 && total == jobs ? 0 : 1;
}
