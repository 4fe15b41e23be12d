/*
 * Counters kept in Redis, each incremented under a dlock lock through the
 * fenced store script (dlock_fenced_script; docs/guide.md, "Fencing"): the lock's
 * token goes with the read and with the write, and the store refuses either
 * when a later holder has touched the counter. A holder whose lease was
 * lost (paused past it, or the lock's Redis restarted without its data)
 * then cannot lose another holder's increment: its write is refused, and it
 * knows the increment did not go in.
 *
 *   fenced_counter [-h HOST:PORT | -s UNIX_SOCKET] [-t THREADS] [-n INCREMENTS] [-c COUNTERS]
 *
 * The counters live in the same Redis as the locks here (keys
 * "example:counter:<k>"); in a real service they are wherever its data is.
 * Exits 0 if the counters add up to the increments that went in.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlock.h>
#include <hiredis/hiredis.h>

static dlock_client *client;
static const char *redis_host = "127.0.0.1", *redis_unix;
static int redis_port = 6379, counters = 4;
static long per_thread = 200;
static char sha[41]; /* the fenced store script, loaded once */

static redisContext *store_connect(void)
{
    redisContext *k = redis_unix ? redisConnectUnix(redis_unix)
                                 : redisConnect(redis_host, redis_port);
    if (!k || k->err) {
        fprintf(stderr, "store: cannot connect: %s\n", k ? k->errstr : "out of memory");
        exit(1);
    }
    return k;
}

/* example: dlock_fenced_script */
/* One fenced call on the store (sha: what SCRIPT LOAD of dlock_fenced_script()
 * answered): an array {1, ...} (get: the value, a bulk string or nil), or
 * {0, highest} (refused: highest, a bulk string of digits, is a later
 * holder's token); NULL on a Redis error. */
static redisReply *fenced(redisContext *k, const char *key, uint64_t token, const char *op,
                          const char *value)
{
    char tok[24];
    snprintf(tok, sizeof tok, "%" PRIu64, token);
    redisReply *r = value ? redisCommand(k, "EVALSHA %s 1 %s %s %s n %s", sha, key, tok, op, value)
                          : redisCommand(k, "EVALSHA %s 1 %s %s %s n", sha, key, tok, op);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1)
        return r;
    fprintf(stderr, "store: %s\n", r && r->type == REDIS_REPLY_ERROR ? r->str : k->errstr);
    if (r)
        freeReplyObject(r);
    return NULL;
}
/* end */

static long applied, refused, failed; /* guarded by count_mu */
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;

static void count(long *what)
{
    pthread_mutex_lock(&count_mu);
    (*what)++;
    pthread_mutex_unlock(&count_mu);
}

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 7;
    redisContext *k = store_connect();
    for (long i = 0; i < per_thread; i++) {
        int n = (int)(rand_r(&seed) % (unsigned)counters);
        char name[32], key[48];
        snprintf(name, sizeof name, "counter:%d", n);
        snprintf(key, sizeof key, "example:counter:%d", n);
        uint64_t token;
        int rc = dlock_acquire(client, name, 5000, &token);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire %s: %s: %s\n", name, dlock_err_name(rc), dlock_last_error());
            count(&failed);
            continue;
        }
        /* read with the token ... */
        redisReply *r = fenced(k, key, token, "get", NULL);
        if (r && r->element[0]->integer == 1) {
            long v = r->element[1]->type == REDIS_REPLY_STRING ? atol(r->element[1]->str) : 0;
            char next[24];
            snprintf(next, sizeof next, "%ld", v + 1);
            freeReplyObject(r);
            /* ... and write with it: refused if a later holder came between */
            r = fenced(k, key, token, "set", next);
            count(r && r->element[0]->integer == 1 ? &applied : &refused);
        } else {
            count(r ? &refused : &failed);
        }
        if (r)
            freeReplyObject(r);
        rc = dlock_release(client, name);
        if (rc != DLOCK_OK) /* DLOCK_ELOST: the store refused or will refuse it */
            fprintf(stderr, "release %s: %s\n", name, dlock_err_name(rc));
    }
    redisFree(k);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = 8;
    char host[256];
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-h")) {
            const char *colon = strrchr(argv[i + 1], ':');
            if (!colon || colon == argv[i + 1]) {
                fprintf(stderr, "-h wants HOST:PORT\n");
                return 2;
            }
            snprintf(host, sizeof host, "%.*s", (int)(colon - argv[i + 1]), argv[i + 1]);
            redis_host = host;
            redis_port = atoi(colon + 1);
        } else if (!strcmp(argv[i], "-s")) {
            redis_unix = argv[i + 1];
        } else if (!strcmp(argv[i], "-t")) {
            threads = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "-n")) {
            per_thread = atol(argv[i + 1]);
        } else if (!strcmp(argv[i], "-c")) {
            counters = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (threads < 1 || threads > 256 || counters < 1 || counters > 1000 || per_thread < 0) {
        fprintf(stderr, "threads 1..256, counters 1..1000, increments >= 0\n");
        return 2;
    }
    dlock_config cfg;
    dlock_config_init(&cfg);
    if (redis_unix) {
        cfg.redis_host = NULL;
        cfg.redis_unix_path = redis_unix;
    } else {
        cfg.redis_host = redis_host;
        cfg.redis_port = redis_port;
    }
    cfg.key_prefix = "example:";
    int rc = dlock_client_open(&cfg, &client);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "dlock_client_open: %s: %s\n", dlock_strerror(rc), dlock_last_error());
        return 1;
    }
    /* the store: load the script, start the counters at 0 */
    redisContext *k = store_connect();
    redisReply *r = redisCommand(k, "SCRIPT LOAD %s", dlock_fenced_script());
    if (!r || r->type != REDIS_REPLY_STRING || r->len != 40) {
        fprintf(stderr, "SCRIPT LOAD failed\n");
        return 1;
    }
    memcpy(sha, r->str, 41);
    freeReplyObject(r);
    for (int i = 0; i < counters; i++)
        freeReplyObject(redisCommand(k, "DEL example:counter:%d", i));

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
    for (int i = 0; i < counters; i++) {
        r = redisCommand(k, "HGET example:counter:%d n", i);
        if (r && r->type == REDIS_REPLY_STRING)
            total += atol(r->str);
        if (r)
            freeReplyObject(r);
    }
    redisFree(k);
    printf("dlock %s: %ld increments on %d threads over %d counters in Redis: %ld went in, "
           "%ld refused for a stale token, %ld failed; the counters add up to %ld\n",
           dlock_version(), threads * per_thread, threads, counters, applied, refused, failed,
           total);
    dlock_client_close(client);
    return failed == 0 && total == applied ? 0 : 1;
}
