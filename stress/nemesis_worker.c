/*
 * nemesis_worker.c: a worker process of the nemesis soak (see nemesis.h).
 *
 * One dlock client in Sentinel mode, sh->threads threads. Each thread loops:
 * pick a name at random, dlock_acquire it, then a read-modify-write of that
 * name's counter in the fenced store (one in 16 holders waits up to half a
 * lease between the read and the write, so that faults find holders inside) (a separate redis-server the nemesis
 * never touches), then dlock_held, then dlock_release, and one history
 * record. The store is built as the user guide tells users to build one:
 *
 *   read(name, token):  refused if token < the highest token seen for name;
 *                       else records token as the highest and returns the
 *                       value
 *   write(name, token, v): accepted only if token is still the highest
 *                       seen (no holder with a newer token read since);
 *                       sets the value and counts the write
 *
 * so a holder whose lease was lost and given to another (a paused holder, a
 * restart that lost the lease) cannot write over the newer holder's update,
 * even when both run at once. An update is lost only if two holders got the
 * same token, or a holder got a token below one already used: then the
 * store's count of accepted writes and its value part (nemesis_check.c).
 *
 * With --read-pct P, P% of the iterations are a reader's instead:
 * dlock_acquire_shared, then a read that writes nothing (the store's max is
 * the writers' fence: a reader must not raise it, or a reader with a lower
 * token, as legitimate as it, would be refused), then dlock_held, a wait as
 * above for one in 16, dlock_held, dlock_release_shared:
 *
 *   peek(name, token):  refused if token <= the highest token seen for
 *                       name (an exclusive holder read with a token handed
 *                       out after this reader's grant: the guide promises
 *                       a shared token above every token handed out before
 *                       it, and every exclusive token after it above it);
 *                       else returns the value
 *
 * With --sem-pct P, P% of the iterations (drawn first; the others are as
 * above) take a permit of a semaphore instead: one of sh->sem_names names
 * "s0".. (never a lock's name), all of limit sh->sem_limit:
 * dlock_sem_acquire, a hold (a few ms; one in 16 up to half a lease, as
 * above), dlock_sem_release, and one record with when the acquire
 * returned, when the release was called and what it returned. Permits have
 * no token and touch no store: the checker counts holders
 * (nemesis_check.c, "sem").
 *
 * Shared state: the worker's own slot in sh->procs (counters written by its
 * threads with atomic adds) and the records it claims (nemesis.h). Each
 * thread owns its store connection. No lock is shared between threads here.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "nemesis.h"

const char nm_store_read_lua[] =
    "local max = redis.call('HGET', KEYS[1], 'max')\n"
    "if max and tonumber(ARGV[1]) < tonumber(max) then return {0, max} end\n"
    "redis.call('HSET', KEYS[1], 'max', ARGV[1])\n"
    "return {1, redis.call('HGET', KEYS[1], 'val') or '0'}\n";

const char nm_store_peek_lua[] =
    "local max = redis.call('HGET', KEYS[1], 'max')\n"
    "if max and tonumber(ARGV[1]) <= tonumber(max) then return {0, max} end\n"
    "return {1, redis.call('HGET', KEYS[1], 'val') or '0'}\n";

const char nm_store_write_lua[] =
    "if redis.call('HGET', KEYS[1], 'max') ~= ARGV[1] then return 0 end\n"
    "redis.call('HSET', KEYS[1], 'val', ARGV[2])\n"
    "redis.call('HINCRBY', KEYS[1], 'n', 1)\n"
    "return 1\n";

const char nm_store_write_unfenced_lua[] =
    "redis.call('HSET', KEYS[1], 'val', ARGV[2])\n"
    "redis.call('HINCRBY', KEYS[1], 'n', 1)\n"
    "return 1\n";

int64_t nm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static nm_shared *S;
static nm_proc *P;
static int my_slot;

static void add(uint64_t *ctr, uint64_t n)
{
    __atomic_fetch_add(ctr, n, __ATOMIC_RELAXED); /* a counter: no ordering */
}

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    add(&P->lost, 1);
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

static redisContext *store_connect(void)
{
    struct timeval tv = {2, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", S->store_port, tv);
    if (r && !r->err) {
        redisSetTimeout(r, tv);
        return r;
    }
    if (r)
        redisFree(r);
    return NULL;
}

/* One store script call; the reply, or NULL (the connection is then
 * dropped: *rc NULL). */
static redisReply *store_call(redisContext **rc, const char *lua, const char *key,
                              const char *a1, const char *a2)
{
    if (!*rc && !(*rc = store_connect()))
        return NULL;
    redisReply *r = a2 ? redisCommand(*rc, "EVAL %s 1 %s %s %s", lua, key, a1, a2)
                       : redisCommand(*rc, "EVAL %s 1 %s %s", lua, key, a1);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r)
            freeReplyObject(r);
        redisFree(*rc);
        *rc = NULL;
        return NULL;
    }
    return r;
}

static void put_rec(const nm_rec *rec)
{
    uint64_t i = __atomic_fetch_add(&S->next, 1, __ATOMIC_RELAXED); /* only a slot number */
    if (i < S->cap) {
        nm_rec *d = &S->recs[i];
        *d = *rec;
        /* Release: the checker (after this process exited, or reading a
         * killed one's records) takes `done` as "every field written". */
        __atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
    }
}

/* One permit iteration (--sem-pct). The record's hold is [t_acq, t_end]:
 * from the acquire's return to the release's call, so it lies within the
 * thread's real hold of the permit; the release's code says whether the
 * library still counted the permit valid when it was given back. */
static void sem_iteration(dlock_client *c, uint64_t *seed)
{
    int k = (int)(rnd(seed) % (uint64_t)S->sem_names);
    char name[32];
    snprintf(name, sizeof name, "s%d", k);
    int planted = S->plant == NM_PLANT_SEM_UNLIMITED && rnd(seed) % 4 == 0;
    int64_t t_req = nm_now_ns();
    int rc = planted ? DLOCK_OK
                     : dlock_sem_acquire(c, name, (uint32_t)S->sem_limit, 3LL * S->lease_ms);
    if (rc != DLOCK_OK) {
        int e = -rc;
        add(&P->errors[e > 0 && e < NM_NERR ? e : 0], 1);
        if (rc != DLOCK_ETIMEDOUT)
            usleep(20000); /* Redis is down or failing over: do not spin */
        return;
    }
    nm_rec rec = {.t_req = t_req, .t_acq = nm_now_ns(), .value = -1,
                  .name = (uint16_t)(S->names + k), .proc = (uint16_t)my_slot, .sem = 1};
    add(&P->sem_acquired, 1);
    /* A few ms, so that holders meet; one in 16 up to half a lease. */
    uint64_t most_us = rnd(seed) % 16 == 0 ? (uint64_t)S->lease_ms * 500 : 5000;
    usleep((useconds_t)(rnd(seed) % most_us));
    rec.t_end = nm_now_ns();
    rc = planted ? DLOCK_OK : dlock_sem_release(c, name);
    rec.rel_rc = (int8_t)rc;
    put_rec(&rec);
}

static void *thread_main(void *arg)
{
    dlock_client *c = arg;
    uint64_t seed = (uint64_t)nm_now_ns() ^ ((uint64_t)getpid() << 20) ^ (uint64_t)pthread_self();
    redisContext *store = NULL;
    char name[32], skey[48], tok[24], val[24];
    uint64_t last_token[NM_MAX_NAMES] = {0};
    const char *write_lua = S->plant == NM_PLANT_UNFENCED ? nm_store_write_unfenced_lua
                                                          : nm_store_write_lua;
    while (!__atomic_load_n(&S->stop, __ATOMIC_RELAXED)) {
        if (S->sem_pct > 0 && (int)(rnd(&seed) % 100) < S->sem_pct) {
            sem_iteration(c, &seed);
            if (S->think_us > 0)
                usleep((useconds_t)(rnd(&seed) % (uint64_t)S->think_us));
            continue;
        }
        int n = (int)(rnd(&seed) % (uint64_t)S->names);
        snprintf(name, sizeof name, "n%d", n);
        uint64_t token = 0;
        int shared = S->read_pct > 0 && (int)(rnd(&seed) % 100) < S->read_pct;
        int planted = shared ? S->plant == NM_PLANT_READERS_UNLOCKED
                             : S->plant == NM_PLANT_NOLOCK && rnd(&seed) % 40 == 0;
        int64_t t_req = nm_now_ns();
        int rc = planted  ? DLOCK_OK
                 : shared ? dlock_acquire_shared(c, name, 3LL * S->lease_ms, &token)
                          : dlock_acquire(c, name, 3LL * S->lease_ms, &token);
        if (planted)
            token = last_token[n];
        else if (rc == DLOCK_OK)
            last_token[n] = token;
        if (rc != DLOCK_OK) {
            int e = -rc;
            add(&P->errors[e > 0 && e < NM_NERR ? e : 0], 1);
            if (rc != DLOCK_ETIMEDOUT)
                usleep(20000); /* Redis is down or failing over: do not spin */
            continue;
        }
        nm_rec rec = {.token = token, .t_req = t_req, .t_acq = nm_now_ns(), .value = -1,
                      .name = (uint16_t)n, .proc = (uint16_t)my_slot, .shared = (uint8_t)shared};
        add(&P->acquired, 1);
        if (shared)
            add(&P->shared_acquired, 1);
        snprintf(skey, sizeof skey, "store:%s", name);
        snprintf(tok, sizeof tok, "%llu", (unsigned long long)token);
        redisReply *r = store_call(&store, shared ? nm_store_peek_lua : nm_store_read_lua, skey,
                                   tok, NULL);
        if (!r) {
            add(&P->store_errors, 1);
            rec.store_error = 1;
        } else {
            if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                r->element[0]->type == REDIS_REPLY_INTEGER &&
                r->element[1]->type == REDIS_REPLY_STRING) {
                rec.read_ok = r->element[0]->integer == 1;
                /* the value read; a reader refused: the store's max */
                if (rec.read_ok || shared)
                    rec.value = strtoll(r->element[1]->str, NULL, 10);
            }
            freeReplyObject(r);
        }
        int64_t t_mid = nm_now_ns();
        int held_mid = planted || dlock_held(c, name) == 1;
        /* One holder in 16 takes its time (up to half a lease) between its
         * read and its write (a reader: after its read): a fault then finds
         * holders inside. */
        if (rnd(&seed) % 16 == 0)
            usleep((useconds_t)(rnd(&seed) % ((uint64_t)S->lease_ms * 500)));
        if (rec.read_ok && !shared) {
            snprintf(val, sizeof val, "%lld", (long long)rec.value + 1);
            r = store_call(&store, write_lua, skey, tok, val);
            if (!r) {
                add(&P->store_errors, 1);
                rec.store_error = 1;
            } else {
                rec.write_ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
                freeReplyObject(r);
            }
        }
        int64_t t_end = nm_now_ns();
        if (planted || dlock_held(c, name) == 1)
            rec.t_end = t_end;
        else if (held_mid)
            rec.t_end = t_mid;
        if (!planted && (shared ? dlock_release_shared(c, name) : dlock_release(c, name)) ==
                            DLOCK_ELOST)
            add(&P->release_lost, 1);
        put_rec(&rec);
        if (S->think_us > 0)
            usleep((useconds_t)(rnd(&seed) % (uint64_t)S->think_us));
    }
    if (store)
        redisFree(store);
    return NULL;
}

void nm_worker_main(nm_shared *sh, int slot)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    S = sh;
    my_slot = slot;
    P = &sh->procs[slot];
    dlock_config cfg;
    dlock_config_init(&cfg);
    cfg.redis_host = NULL;
    if (sh->redlock) {
        cfg.redlock_nodes = sh->nodes;
    } else {
        cfg.sentinels = sh->sentinels;
        cfg.sentinel_master = NM_MASTER;
    }
    cfg.key_prefix = NM_PREFIX;
    cfg.lease_ms = (uint32_t)sh->lease_ms;
    cfg.waiter_ttl_ms = (uint32_t)(sh->lease_ms / 2);
    cfg.min_replicas = (uint32_t)sh->min_replicas;
    cfg.command_timeout_ms = (uint32_t)sh->command_ms;
    cfg.connect_timeout_ms = (uint32_t)sh->command_ms;
    cfg.on_lost = on_lost;
    if (sh->protocol)
        cfg.protocol = sh->protocol < 0 ? (uint32_t)(1 + slot % 2) : (uint32_t)sh->protocol;
    char cname[32];
    snprintf(cname, sizeof cname, "nemesis-%d-%d", slot, (int)getpid());
    cfg.client_name = cname;
    dlock_client *c = NULL;
    /* The master may be restarting or failing over right now: retry. */
    int rc;
    while ((rc = dlock_client_open(&cfg, &c)) != DLOCK_OK) {
        if (__atomic_load_n(&sh->stop, __ATOMIC_RELAXED))
            _exit(0);
        if (rc == DLOCK_EINVAL) {
            fprintf(stderr, "nemesis worker %d: %s\n", slot, dlock_last_error());
            _exit(3);
        }
        usleep(100000);
    }
    pthread_t th[64];
    int n = sh->threads < 64 ? sh->threads : 64;
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, thread_main, c) != 0)
            _exit(4);
    __atomic_store_n(&P->ready, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    dlock_client_close(c);
    _exit(0);
}
