/*
 * The EXAMPLE sections of the man pages: each function below between the
 * lines "example: PAGE" and "end" is copied into PAGE(3) by scripts/gen-man,
 * and this program runs them all against a Redis server, so that every
 * example in a man page compiles and works (scripts/consume runs it).
 *
 *   man_examples [-h HOST:PORT | -s UNIX_SOCKET]
 *
 * Exits 0 if every example did what it shows.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dlock.h>

static dlock_config server; /* where the examples connect (from the options) */

/* example: dlock_client_open */
static int example_client_open(void)
{
    dlock_config cfg;
    dlock_config_init(&cfg);            /* always first: every field gets its default */
    cfg.redis_host = server.redis_host; /* e.g. "127.0.0.1" */
    cfg.redis_port = server.redis_port; /* e.g. 6379 */
    cfg.redis_unix_path = server.redis_unix_path;
    cfg.client_name = "billing-7";      /* shown by dlockctl and in error messages */
    dlock_client *c;
    int rc = dlock_client_open(&cfg, &c);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "dlock_client_open: %s: %s\n", dlock_err_name(rc), dlock_last_error());
        return 1;
    }
    printf("client %s open\n", dlock_client_id(c));
    /* ... the server runs: threads acquire and release locks ... */
    dlock_client_shutdown(c); /* waiters return DLOCK_ECLOSED; held leases go back */
    dlock_client_close(c);    /* last, once no thread uses the client */
    return 0;
}
/* end */

static dlock_client *open_client(void)
{
    dlock_client *c = NULL;
    if (dlock_client_open(&server, &c) != DLOCK_OK)
        fprintf(stderr, "dlock_client_open: %s\n", dlock_last_error());
    return c;
}

/* example: dlock_acquire */
static int example_acquire(dlock_client *c)
{
    uint64_t fence;
    int rc = dlock_acquire(c, "order:42", 2000, &fence); /* wait up to 2 s */
    if (rc == DLOCK_ETIMEDOUT) {
        /* the message names the holder, how long it has held it, its queue */
        fprintf(stderr, "busy: %s\n", dlock_last_error());
        return 1;
    }
    if (rc != DLOCK_OK) {
        fprintf(stderr, "%s: %s\n", dlock_err_name(rc), dlock_last_error());
        return 1;
    }
    if (dlock_unclean(c, "order:42") > 0)
        printf("the holder before ended uncleanly: check the order's data\n");
    /* the protected work: every write to the order's store carries `fence`,
     * and the store refuses a token below the highest it has seen */
    printf("order:42 held with token %llu\n", (unsigned long long)fence);
    rc = dlock_release(c, "order:42");
    if (rc == DLOCK_ELOST)
        fprintf(stderr, "the lease was lost while held: %s\n", dlock_last_error());
    return rc == DLOCK_OK ? 0 : 1;
}
/* end */

static void *fire_later(void *arg)
{
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    dlock_cancel_fire(arg);
    return NULL;
}

/* example: dlock_cancel */
static int example_cancel(dlock_client *c)
{
    dlock_cancel *k;
    if (dlock_cancel_create(&k) != DLOCK_OK)
        return 1;
    dlock_acquire_opts opts;
    dlock_acquire_opts_init(&opts);
    opts.cancel = k;
    uint64_t fence;
    if (dlock_acquire(c, "report", 0, &fence) != DLOCK_OK) /* someone holds it ... */
        return 1;
    pthread_t t; /* ... and another thread gives up waiting for us in 100 ms */
    pthread_create(&t, NULL, fire_later, k);
    dlock_client *other = open_client();
    int rc = other ? dlock_acquire_ex(other, "report", -1, &fence, &opts) : DLOCK_EREDIS;
    pthread_join(t, NULL);
    printf("the wait ended with %s\n", dlock_err_name(rc)); /* DLOCK_ECANCELED */
    dlock_release(c, "report");
    if (other)
        dlock_client_close(other);
    dlock_cancel_destroy(k);
    return rc == DLOCK_ECANCELED ? 0 : 1;
}
/* end */

static void *release_it(void *arg)
{
    return (void *)(intptr_t)dlock_handle_release(arg);
}

/* example: dlock_handle */
static int example_handle(dlock_client *c)
{
    dlock_handle *h;
    uint64_t fence;
    int rc = dlock_acquire_handle(c, "batch:7", 0, &fence, &h);
    if (rc != DLOCK_OK)
        return 1;
    /* the work may go on in another thread, which releases the lock */
    printf("handle held: %d\n", dlock_handle_held(h));
    pthread_t t;
    pthread_create(&t, NULL, release_it, h);
    void *out;
    pthread_join(t, &out);
    if ((intptr_t)out != DLOCK_OK)
        return 1;
    /* a semaphore's permit (or a shared hold) can belong to a handle too */
    if (dlock_sem_acquire_handle(c, "uploads", 4, 0, &h) != DLOCK_OK)
        return 1;
    pthread_create(&t, NULL, release_it, h);
    pthread_join(t, &out);
    return (intptr_t)out == DLOCK_OK ? 0 : 1;
}
/* end */

/* example: dlock_acquire_shared */
static int example_shared(dlock_client *c)
{
    uint64_t fence;
    int rc = dlock_acquire_shared(c, "catalog", 5000, &fence);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "catalog: %s\n", dlock_last_error());
        return 1;
    }
    /* other threads of this client read too, with no Redis command;
     * a writer (dlock_acquire) waits for every reader */
    printf("reading the catalog (token %llu)\n", (unsigned long long)fence);
    return dlock_release_shared(c, "catalog") == DLOCK_OK ? 0 : 1;
}
/* end */

/* example: dlock_sem_acquire */
static int example_sem(dlock_client *c)
{
    /* at most 4 exports run at once across every process sharing the name */
    int rc = dlock_sem_acquire(c, "exports", 4, 5000);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "exports: %s\n", dlock_last_error());
        return 1;
    }
    printf("running an export\n");
    /* the permit goes to a waiting thread of this client, or to Redis */
    return dlock_sem_release(c, "exports") == DLOCK_OK ? 0 : 1;
}
/* end */

/* example: dlock_client_stats */
static int example_stats(dlock_client *c)
{
    dlock_stats s;
    if (dlock_client_stats(c, &s) != DLOCK_OK)
        return 1;
    printf("%llu acquisitions: %llu grants from Redis, %llu local handoffs\n",
           (unsigned long long)s.acquisitions, (unsigned long long)s.grants,
           (unsigned long long)s.handoffs);
    char *text = dlock_client_metrics_prometheus(c); /* for a /metrics endpoint */
    if (!text)
        return 1;
    fputs(strstr(text, "dlock_acquisitions_total") ? "metrics ready\n" : text, stdout);
    free(text);
    return 0;
}
/* end */

/* example: dlock_strerror */
static int example_errors(dlock_client *c)
{
    int rc = dlock_release(c, "never-taken"); /* not held by this thread */
    printf("dlock %s: %s (%s): %s\n", dlock_version(), dlock_err_name(rc),
           dlock_strerror(rc), dlock_last_error());
    return rc == DLOCK_ENOTHELD ? 0 : 1;
}
/* end */

int main(int argc, char **argv)
{
    dlock_config_init(&server);
    char host[256];
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-h") && strrchr(argv[i + 1], ':')) {
            const char *colon = strrchr(argv[i + 1], ':');
            snprintf(host, sizeof host, "%.*s", (int)(colon - argv[i + 1]), argv[i + 1]);
            server.redis_host = host;
            server.redis_port = atoi(colon + 1);
        } else if (!strcmp(argv[i], "-s")) {
            server.redis_host = NULL;
            server.redis_unix_path = argv[i + 1];
        } else {
            fprintf(stderr, "usage: man_examples [-h HOST:PORT | -s UNIX_SOCKET]\n");
            return 2;
        }
    }
    server.key_prefix = "man-examples:";
    int bad = example_client_open();
    dlock_client *c = open_client();
    if (!c)
        return 1;
    bad |= example_acquire(c) << 1;
    bad |= example_cancel(c) << 2;
    bad |= example_handle(c) << 3;
    bad |= example_stats(c) << 4;
    bad |= example_errors(c) << 5;
    bad |= example_shared(c) << 6;
    bad |= example_sem(c) << 7;
    dlock_client_close(c);
    printf("man examples: %s\n", bad ? "FAILED" : "all ran as shown");
    return bad ? 1 : 0;
}
