/*
 * storm_worker.c: storm's side that runs the locks: the shared region
 * (shm_create), the time, histogram and error-index helpers, the lock
 * modes (dlock, --mutex's process-shared mutexes, --naive's SET NX PX; with
 * --sem dlock's semaphore, a POSIX semaphore or --naive's counter), a
 * thread (thread_main: the checks of every critical section) and a worker
 * process (its clients and threads: worker_main).
 *
 * Shared state (its rules: storm.h): the shared region, written by every
 * thread of every worker; in it MX, the --mutex locks and the token
 * counters of --mutex and --naive, read and written under the lock under
 * test. Per thread (__thread): the text of the last --mutex or --naive
 * failure, and --naive's connection and token. A worker's clients and
 * threads are its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"
#include "storm.h"
#include <hiredis/hiredis.h>
#ifdef DLOCK_LOCKSTAT
#include "lockstat.h"
#endif

/* ------------------------------------------------------------------ */
/* Shared memory                                                        */

shm_hdr *H;
proc_res *PR;
name_state *NS;
thread_res *TR;
static mutex_state *MX;   /* --mutex only, else NULL */
void *shm_base;
size_t shm_size;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* --sem: the limit the semaphore under test is given, whatever the mode:
 * --sem, or one more with --plant sem-over (the checks still allow --sem
 * holders). */
static long sem_asked(void)
{
    return O.sem_limit + (O.plant && !strcmp(O.plant, "sem-over"));
}

void shm_create(void)
{
    size_t total = (size_t)O.procs * O.threads;
    size_t off_pr = align64(sizeof(shm_hdr));
    size_t off_ns = off_pr + align64(sizeof(proc_res) * O.procs);
    size_t off_tr = off_ns + align64(sizeof(name_state) * O.locks);
    size_t off_mx = off_tr + align64(sizeof(thread_res) * total);
    shm_size = off_mx + (O.mutex || O.naive ? align64(sizeof(mutex_state) * O.locks) : 0);
    shm_base = mmap(NULL, shm_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm_base == MAP_FAILED) {
        fprintf(stderr, "storm: mmap of %zu bytes failed: %s\n", shm_size, strerror(errno));
        exit(1);
    }
    H = (shm_hdr *)shm_base;
    PR = (proc_res *)((char *)shm_base + off_pr);
    NS = (name_state *)((char *)shm_base + off_ns);
    TR = (thread_res *)((char *)shm_base + off_tr);
    if (!O.mutex && !O.naive)
        return; /* --naive uses the token counters only */
    MX = (mutex_state *)((char *)shm_base + off_mx);
    pthread_mutexattr_t ma;
    int e = pthread_mutexattr_init(&ma);
    if (!e)
        e = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    for (int i = 0; !e && i < O.locks; i++)
        e = pthread_mutex_init(&MX[i].m, &ma);
    if (e) {
        fprintf(stderr, "storm: process-shared mutex setup failed: %s\n", strerror(e));
        exit(1);
    }
    pthread_mutexattr_destroy(&ma);
    if (O.mutex && O.read_pct > 0) {
        /* writers preferred, as dlock's shared mode prefers them (glibc's
         * default prefers readers: a writer could starve) */
        pthread_rwlockattr_t ra;
        e = pthread_rwlockattr_init(&ra);
        if (!e)
            e = pthread_rwlockattr_setpshared(&ra, PTHREAD_PROCESS_SHARED);
        if (!e)
            e = pthread_rwlockattr_setkind_np(&ra,
                                              PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        for (int i = 0; !e && i < O.locks; i++)
            e = pthread_rwlock_init(&MX[i].rw, &ra);
        if (e) {
            fprintf(stderr, "storm: process-shared rwlock setup failed: %s\n", strerror(e));
            exit(1);
        }
        pthread_rwlockattr_destroy(&ra);
    }
    if (O.mutex && O.sem_limit > 0) {
        unsigned n = (unsigned)sem_asked();
        for (int i = 0; i < O.locks; i++)
            if (sem_init(&MX[i].sem, 1, n) != 0) {
                fprintf(stderr, "storm: process-shared semaphore setup failed: %s\n",
                        strerror(errno));
                exit(1);
            }
    }
}

/* Destroyed by the parent once every worker is gone (none holds a mutex). */
void shm_destroy_mutexes(void)
{
    if (!MX)
        return;
    for (int i = 0; i < O.locks; i++) {
        pthread_mutex_destroy(&MX[i].m);
        if (O.read_pct > 0)
            pthread_rwlock_destroy(&MX[i].rw);
        if (O.sem_limit > 0)
            sem_destroy(&MX[i].sem);
    }
}

/* ------------------------------------------------------------------ */
/* Time and helpers                                                     */

int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static void critical_section(long us)
{
    if (us <= 0) {
        for (int i = 0; i < 64; i++)
            cpu_relax();
        return;
    }
    if (O.cs_sleep) {
        sleep_ns((int64_t)us * 1000);
        return;
    }
    int64_t end = now_ns() + (int64_t)us * 1000;
    while (now_ns() < end)
        cpu_relax();
}

static int bucket_of(uint64_t v)
{
    if (v < 8)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int sub = (int)((v >> (e - 3)) & 7);
    int b = 8 + (e - 3) * 8 + sub;
    return b < NB ? b : NB - 1;
}

/* A representative value of bucket b: its exact value below 8, else the middle. */
static uint64_t bucket_value(int b)
{
    if (b < 8)
        return (uint64_t)b;
    int e = (b - 8) / 8 + 3, sub = (b - 8) % 8;
    uint64_t lo = (uint64_t)(8 + sub) << (e - 3);
    uint64_t hi = (uint64_t)(9 + sub) << (e - 3);
    return (lo + hi - 1) / 2;
}

uint64_t hist_percentile(const uint64_t *hist, uint64_t n, double p, uint64_t max)
{
    if (n == 0)
        return 0;
    uint64_t rank = (uint64_t)(p * (double)n);
    if ((double)rank < p * (double)n)
        rank++;
    if (rank < 1)
        rank = 1;
    uint64_t cum = 0;
    for (int b = 0; b < NB; b++) {
        cum += hist[b];
        if (cum >= rank) {
            uint64_t v = bucket_value(b);
            return v > max ? max : v;
        }
    }
    return max;
}

static int err_index(int code)
{
    int i = -code;
    return (i >= 1 && i < NERR) ? i : 0;
}

const char *err_index_name(int i)
{
    if (i == 0)
        return "other";
    return dlock_err_name(-i);
}

static void logf_limited(const char *fmt, ...)
{
    if (__atomic_add_fetch(&H->log_lines, 1, __ATOMIC_RELAXED) > LOG_MAX)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    /* one write() per line so that lines of several processes do not mix */
    char line[560];
    int m = snprintf(line, sizeof line, "storm[%d]: %.*s\n", (int)getpid(), n, buf);
    if (m > 0)
        (void)!write(2, line, (size_t)(m < (int)sizeof line ? m : (int)sizeof line - 1));
}

#define SET_PHASE(r, ph) __atomic_store_n(&(r)->phase, (ph), __ATOMIC_RELAXED)

#define LIVE_INC(x) __atomic_store_n(&(x), (x) + 1, __ATOMIC_RELAXED)

/* ------------------------------------------------------------------ */
/* Worker threads                                                       */

typedef struct targ {
    int proc, idx;
    dlock_client *c;
    thread_res *r;
    pthread_t tid;
} targ;

/* Per-thread text of the last mutex failure (dlock_last_error's analogue). */
static __thread char mx_err[128];

/* The absolute CLOCK_REALTIME time --wait-ms from now (pthread's and
 * sem_timedwait's timed waits). */
static struct timespec wait_until(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += O.wait_ms / 1000;
    ts.tv_nsec += (O.wait_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* --mutex: lock name li as dlock_acquire would, with the same return codes
 * (DLOCK_EBUSY, DLOCK_ETIMEDOUT, other failures as DLOCK_EINVAL with the
 * reason in mx_err). The token is the name's counter + 1, written back
 * inside the critical section: overlapping holders would see equal tokens. */
static int mutex_acquire(int li, uint64_t *fence)
{
    mutex_state *mx = &MX[li];
    int e;
    if (O.wait_ms < 0) {
        e = pthread_mutex_lock(&mx->m);
    } else if (O.wait_ms == 0) {
        e = pthread_mutex_trylock(&mx->m);
    } else {
        struct timespec ts = wait_until();
        e = pthread_mutex_timedlock(&mx->m, &ts);
    }
    if (e == 0) {
        uint64_t t = __atomic_load_n(&mx->token, __ATOMIC_RELAXED) + 1;
        __atomic_store_n(&mx->token, t, __ATOMIC_RELAXED);
        *fence = t;
        return DLOCK_OK;
    }
    if (e == EBUSY)
        return DLOCK_EBUSY;
    if (e == ETIMEDOUT)
        return DLOCK_ETIMEDOUT;
    snprintf(mx_err, sizeof mx_err, "pthread mutex lock: %s", strerror(e));
    return DLOCK_EINVAL;
}

static int mutex_release(int li)
{
    int e = pthread_mutex_unlock(&MX[li].m);
    if (e == 0)
        return DLOCK_OK;
    snprintf(mx_err, sizeof mx_err, "pthread_mutex_unlock: %s", strerror(e));
    return DLOCK_EINVAL;
}

/* --mutex --read-pct: name li's rwlock, shared or not, with mutex_acquire's
 * return codes. The token is the name's counter + 1, fetched and added
 * atomically (readers hold the rwlock together): each grant's is above
 * every one before it. --plant readers-unlocked: readers take no lock. */
static int rwlock_acquire(int li, int shared, uint64_t *fence)
{
    mutex_state *mx = &MX[li];
    int e = 0;
    if (shared && O.plant && !strcmp(O.plant, "readers-unlocked")) {
        e = 0;
    } else if (O.wait_ms < 0) {
        e = shared ? pthread_rwlock_rdlock(&mx->rw) : pthread_rwlock_wrlock(&mx->rw);
    } else if (O.wait_ms == 0) {
        e = shared ? pthread_rwlock_tryrdlock(&mx->rw) : pthread_rwlock_trywrlock(&mx->rw);
    } else {
        struct timespec ts = wait_until();
        e = shared ? pthread_rwlock_timedrdlock(&mx->rw, &ts)
                   : pthread_rwlock_timedwrlock(&mx->rw, &ts);
    }
    if (e == 0) {
        *fence = __atomic_add_fetch(&mx->token, 1, __ATOMIC_RELAXED);
        return DLOCK_OK;
    }
    if (e == EBUSY)
        return DLOCK_EBUSY;
    if (e == ETIMEDOUT)
        return DLOCK_ETIMEDOUT;
    snprintf(mx_err, sizeof mx_err, "pthread rwlock lock: %s", strerror(e));
    return DLOCK_EINVAL;
}

static int rwlock_release(int li, int shared)
{
    if (shared && O.plant && !strcmp(O.plant, "readers-unlocked"))
        return DLOCK_OK;
    int e = pthread_rwlock_unlock(&MX[li].rw);
    if (e == 0)
        return DLOCK_OK;
    snprintf(mx_err, sizeof mx_err, "pthread_rwlock_unlock: %s", strerror(e));
    return DLOCK_EINVAL;
}

/* --read-pct without --mutex: dlock's shared mode (--plant
 * readers-unlocked: readers take no lock). */
static int dlock_shared_acquire(dlock_client *c, const char *name, uint64_t *fence)
{
    if (O.plant && !strcmp(O.plant, "readers-unlocked")) {
        *fence = UINT64_MAX; /* above every writer's: only the occupancy checks see it */
        return DLOCK_OK;
    }
    return dlock_acquire_shared(c, name, O.wait_ms, fence);
}

static int dlock_shared_release(dlock_client *c, const char *name)
{
    if (O.plant && !strcmp(O.plant, "readers-unlocked"))
        return DLOCK_OK;
    return dlock_release_shared(c, name);
}

/* --mutex --sem: a permit of name li's semaphore, with mutex_acquire's
 * return codes (no token: a semaphore has none). */
static int posix_sem_acquire(int li)
{
    sem_t *s = &MX[li].sem;
    int e;
    if (O.wait_ms < 0) {
        while ((e = sem_wait(s)) != 0 && errno == EINTR)
            ;
    } else if (O.wait_ms == 0) {
        e = sem_trywait(s);
    } else {
        struct timespec ts = wait_until();
        while ((e = sem_timedwait(s, &ts)) != 0 && errno == EINTR)
            ;
    }
    if (e == 0)
        return DLOCK_OK;
    if (errno == EAGAIN)
        return DLOCK_EBUSY;
    if (errno == ETIMEDOUT)
        return DLOCK_ETIMEDOUT;
    snprintf(mx_err, sizeof mx_err, "sem_wait: %s", strerror(errno));
    return DLOCK_EINVAL;
}

static int posix_sem_release(int li)
{
    if (sem_post(&MX[li].sem) == 0)
        return DLOCK_OK;
    snprintf(mx_err, sizeof mx_err, "sem_post: %s", strerror(errno));
    return DLOCK_EINVAL;
}

/* --naive: the simplest Redis lock, one connection per thread. */
static __thread redisContext *naive_conn;
static __thread char naive_token[64];
static __thread uint64_t naive_seq;
static const char naive_unlock[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end";

static int naive_connect(void)
{
    if (naive_conn && !naive_conn->err)
        return 0;
    if (naive_conn)
        redisFree(naive_conn);
    struct timeval tv = {1, 0};
    naive_conn = unix_path[0] ? redisConnectUnixWithTimeout(unix_path, tv)
                              : redisConnectWithTimeout(O.host, client_port, tv);
    if (!naive_conn || naive_conn->err) {
        snprintf(mx_err, sizeof mx_err, "%s",
                 naive_conn ? naive_conn->errstr : "connect: out of memory");
        if (naive_conn)
            redisFree(naive_conn);
        naive_conn = NULL;
        return -1;
    }
    redisSetTimeout(naive_conn, tv);
    return 0;
}

/* Sends one command; the reply, or NULL with mx_err set and the connection
 * dropped (the next call reconnects). */
static redisReply *naive_command(const char *fmt, ...)
{
    if (naive_connect() != 0)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(naive_conn, fmt, ap);
    va_end(ap);
    if (!r) {
        snprintf(mx_err, sizeof mx_err, "%s", naive_conn->errstr);
        redisFree(naive_conn);
        naive_conn = NULL;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(mx_err, sizeof mx_err, "%s", r->str);
        freeReplyObject(r);
        r = NULL;
    }
    return r;
}

/* --naive acquire, with dlock_acquire's return codes. */
static int naive_acquire(int li, const char *name, uint64_t *fence)
{
    int64_t deadline = O.wait_ms < 0 ? INT64_MAX : now_ns() + O.wait_ms * 1000000LL;
    snprintf(naive_token, sizeof naive_token, "%d:%lx:%" PRIu64, (int)getpid(),
             (unsigned long)pthread_self(), ++naive_seq);
    for (;;) {
        redisReply *r = naive_command("SET %s{%s} %s NX PX %ld", key_prefix, name, naive_token,
                                      O.lease_ms);
        if (!r)
            return DLOCK_EREDIS;
        int got = r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (got) {
            mutex_state *mx = &MX[li];
            uint64_t t = __atomic_load_n(&mx->token, __ATOMIC_RELAXED) + 1;
            __atomic_store_n(&mx->token, t, __ATOMIC_RELAXED);
            *fence = t;
            return DLOCK_OK;
        }
        if (O.wait_ms == 0)
            return DLOCK_EBUSY;
        if (now_ns() >= deadline)
            return DLOCK_ETIMEDOUT;
        sleep_ns(1000000);
    }
}

static int naive_release(const char *name)
{
    redisReply *r = naive_command("EVAL %s 1 %s{%s} %s", naive_unlock, key_prefix, name,
                                  naive_token);
    if (!r)
        return DLOCK_EREDIS;
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    if (!ok)
        snprintf(mx_err, sizeof mx_err, "the key was gone or another token's");
    return ok ? DLOCK_OK : DLOCK_ELOST;
}

/* --naive --sem: the simplest Redis semaphore, as written in ten lines: a
 * counter per name that a script raises if it is below the limit (retried
 * every 1 ms until --wait-ms, as the naive lock's SET), and DECR to give
 * the permit back. No lease: a client that dies holding a permit keeps it
 * taken for ever. */
static const char naive_sem_take[] =
    "local n = tonumber(redis.call('get', KEYS[1]) or '0') "
    "if n < tonumber(ARGV[1]) then redis.call('incr', KEYS[1]) return 1 end return 0";

static int naive_sem_acquire(const char *name)
{
    int64_t deadline = O.wait_ms < 0 ? INT64_MAX : now_ns() + O.wait_ms * 1000000LL;
    for (;;) {
        redisReply *r = naive_command("EVAL %s 1 %s{%s} %ld", naive_sem_take, key_prefix, name,
                                      sem_asked());
        if (!r)
            return DLOCK_EREDIS;
        int got = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        freeReplyObject(r);
        if (got)
            return DLOCK_OK;
        if (O.wait_ms == 0)
            return DLOCK_EBUSY;
        if (now_ns() >= deadline)
            return DLOCK_ETIMEDOUT;
        sleep_ns(1000000);
    }
}

static int naive_sem_release(const char *name)
{
    redisReply *r = naive_command("DECR %s{%s}", key_prefix, name);
    if (!r)
        return DLOCK_EREDIS;
    int ok = r->type == REDIS_REPLY_INTEGER && r->integer >= 0;
    freeReplyObject(r);
    if (!ok)
        snprintf(mx_err, sizeof mx_err, "the count of permits went below 0");
    return ok ? DLOCK_OK : DLOCK_EINVAL;
}

/* --sem: a permit of name li (whose text is name), in the mode under test,
 * with dlock_sem_acquire's return codes; and its release. */
static int sem_take(dlock_client *c, int li, const char *name)
{
    return O.mutex   ? posix_sem_acquire(li)
           : O.naive ? naive_sem_acquire(name)
                     : dlock_sem_acquire(c, name, (uint32_t)sem_asked(), O.wait_ms);
}

static int sem_give(dlock_client *c, int li, const char *name)
{
    return O.mutex ? posix_sem_release(li) : O.naive ? naive_sem_release(name)
                                                     : dlock_sem_release(c, name);
}

static const char *last_error(void)
{
    return O.mutex || O.naive ? mx_err : dlock_last_error();
}

/* The wait of an acquisition that succeeded, into r's histogram; with
 * --read-pct into its mode's too (shared: 1 for a shared acquisition). */
static void count_wait(thread_res *r, int64_t t0, int64_t t1, int shared)
{
    uint64_t w = (uint64_t)(t1 - t0) / 1000;
    int b = bucket_of(w);
    r->wait_sum_us += w;
    if (w > r->wait_max_us)
        r->wait_max_us = w;
    r->hist[b]++;
    if (shared) {
        r->r_wait_sum_us += w;
        if (w > r->r_wait_max_us)
            r->r_wait_max_us = w;
        r->r_hist[b]++;
    } else if (w > r->x_wait_max_us) {
        r->x_wait_max_us = w;
    }
}

/* The time a name has nobody inside (name_state.inside, empty_us): the
 * holder that enters an empty name adds the time since the last one left.
 * One word holds both the count and that time, so that an entry and a
 * leave that race each see the other (relaxed: it orders nothing else). */
#define INSIDE_ONE (1ULL << 48)
static uint64_t since_start_us(void)
{
    return (uint64_t)(now_ns() - __atomic_load_n(&H->start_ns, __ATOMIC_RELAXED)) / 1000 &
           (INSIDE_ONE - 1);
}

/* (The clock is read before each attempt of the compare-and-swap: read
 * after it, a holder that entered and left meanwhile would count as empty
 * time; read once before a retried one, the time would be stale.) */
static void inside_enter(name_state *ns)
{
    uint64_t w = __atomic_load_n(&ns->inside, __ATOMIC_RELAXED), now;
    do
        now = since_start_us();
    while (!__atomic_compare_exchange_n(&ns->inside, &w, w + INSIDE_ONE, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    if (w < INSIDE_ONE) { /* it was empty since w's time */
        uint64_t left = w & (INSIDE_ONE - 1);
        if (now > left)
            __atomic_add_fetch(&ns->empty_us, now - left, __ATOMIC_RELAXED);
    }
}

static void inside_leave(name_state *ns)
{
    uint64_t w = __atomic_load_n(&ns->inside, __ATOMIC_RELAXED), n;
    do
        n = w - INSIDE_ONE < INSIDE_ONE ? since_start_us() : w - INSIDE_ONE;
    while (!__atomic_compare_exchange_n(&ns->inside, &w, n, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
}

/* A reader's critical section (--read-pct), holding name li shared with
 * token fence: no writer inside with it (the writers' occupancy stays 0,
 * and the counter, which only writers change, is the same at both ends);
 * its token above every writer's before it (a writer's is above every
 * token before it: thread_main). The highest token seen is raised to it
 * with a compare-and-swap: readers run side by side. */
static void read_section(thread_res *r, const targ *a, int li, const char *name, uint64_t fence)
{
    name_state *ns = &NS[li];
    /* (sequentially consistent, as the writer's count and look: each of
     * the two sees the other's increment if they overlap) */
    __atomic_add_fetch(&ns->readers, 1, __ATOMIC_SEQ_CST);
    int occ = __atomic_load_n(&ns->occupancy, __ATOMIC_SEQ_CST);
    if (occ != 0) {
        LIVE_INC(r->violations);
        logf_limited("VIOLATION: a reader inside '%s' beside %d writers (proc %d thread %d, "
                     "token %" PRIu64 ")", name, occ, a->proc, a->idx, fence);
    }
    uint64_t lx = __atomic_load_n(&ns->last_x_token, __ATOMIC_ACQUIRE);
    if (fence <= lx) {
        LIVE_INC(r->regressions);
        logf_limited("TOKEN REGRESSION on '%s': a reader got %" PRIu64 ", a writer before had %"
                     PRIu64 " (proc %d thread %d)", name, fence, lx, a->proc, a->idx);
    }
    uint64_t last = __atomic_load_n(&ns->last_token, __ATOMIC_ACQUIRE);
    while (fence > last &&
           !__atomic_compare_exchange_n(&ns->last_token, &last, fence, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
        ;
    uint64_t v = __atomic_load_n(&ns->counter, __ATOMIC_ACQUIRE);
    inside_enter(ns);
    critical_section(O.cs_us);
    inside_leave(ns);
    uint64_t v2 = __atomic_load_n(&ns->counter, __ATOMIC_ACQUIRE);
    if (v2 != v) {
        LIVE_INC(r->violations);
        logf_limited("VIOLATION: a writer changed '%s' under a reader (proc %d thread %d)", name,
                     a->proc, a->idx);
    }
    __atomic_sub_fetch(&ns->readers, 1, __ATOMIC_ACQ_REL);
    r->reads++;
}

/* A semaphore holder's critical section (--sem): never more than --sem
 * holders inside at once; the most seen is kept (the run shows the
 * semaphore let that many in). Its counter counts the holders atomically. */
static void sem_section(thread_res *r, const targ *a, int li, const char *name)
{
    name_state *ns = &NS[li];
    int occ = __atomic_add_fetch(&ns->occupancy, 1, __ATOMIC_ACQ_REL);
    if (occ > O.sem_limit) {
        LIVE_INC(r->violations);
        logf_limited("VIOLATION: %d holders inside '%s', limit %ld (proc %d thread %d)", occ,
                     name, O.sem_limit, a->proc, a->idx);
    }
    int most = __atomic_load_n(&ns->max_occupancy, __ATOMIC_RELAXED);
    while (occ > most && !__atomic_compare_exchange_n(&ns->max_occupancy, &most, occ, 0,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    inside_enter(ns);
    critical_section(O.cs_us);
    inside_leave(ns);
    __atomic_add_fetch(&ns->counter, 1, __ATOMIC_ACQ_REL);
    __atomic_sub_fetch(&ns->occupancy, 1, __ATOMIC_ACQ_REL);
}

static void *thread_main(void *arg)
{
    targ *a = arg;
    thread_res *r = a->r;
    dlock_client *c = a->c;
    uint64_t rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)a->proc << 32) ^ (uint64_t)(a->idx + 1);
    rng ^= (uint64_t)getpid() * 0xBF58476D1CE4E5B9ULL;

    /* Sleep on the go flag itself (a futex in the shared region) rather than
     * poll it: a thousand threads polling every 5 ms kept a 2-core machine
     * so busy that 2 x 1024 threads sometimes took over 20 s to start. The
     * timeout only bounds how late a stop request is seen. */
    while (!__atomic_load_n(&H->go, __ATOMIC_ACQUIRE) &&
           !__atomic_load_n(&H->stop, __ATOMIC_RELAXED)) {
        struct timespec ts = {0, 50000000};
        syscall(SYS_futex, &H->go, FUTEX_WAIT, 0, &ts, NULL, 0);
    }
    int64_t deadline = __atomic_load_n(&H->deadline_ns, __ATOMIC_ACQUIRE);

    for (;;) {
        if (__atomic_load_n(&H->stop, __ATOMIC_RELAXED) || now_ns() >= deadline)
            break;
        int li = 0;
        if (O.locks > 1) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            li = (int)(rng % (uint64_t)O.locks);
        }
        const char *name = names + (size_t)li * NAME_LEN;
        uint64_t fence = 0;
        int shared = 0; /* --read-pct: this acquisition is shared (read) mode */
        if (O.read_pct > 0) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            shared = (int)(rng % 100) < O.read_pct;
        }
        __atomic_store_n(&r->name_idx, li, __ATOMIC_RELAXED);
        SET_PHASE(r, PH_ACQUIRE);
        int64_t t0 = now_ns();
        int rc = O.sem_limit > 0               ? sem_take(c, li, name)
                 : O.read_pct > 0 && O.mutex   ? rwlock_acquire(li, shared, &fence)
                 : O.mutex                     ? mutex_acquire(li, &fence)
                 : O.naive                     ? naive_acquire(li, name, &fence)
                 : shared                      ? dlock_shared_acquire(c, name, &fence)
                                               : dlock_acquire(c, name, O.wait_ms, &fence);
        int64_t t1 = now_ns();
        if (rc == DLOCK_OK)
            note_grant(t1);
        if (rc == DLOCK_OK && (O.sem_limit > 0 || shared)) {
            SET_PHASE(r, PH_CS);
            if (O.sem_limit > 0)
                sem_section(r, a, li, name);
            else
                read_section(r, a, li, name, fence);
            SET_PHASE(r, PH_RELEASE);
            int rr = O.sem_limit > 0 ? sem_give(c, li, name)
                     : O.mutex       ? rwlock_release(li, 1)
                                     : dlock_shared_release(c, name);
            if (rr != DLOCK_OK) {
                r->rel_errors[err_index(rr)]++;
                logf_limited("release of '%s' returned %s: %s", name, dlock_err_name(rr),
                             last_error());
            }
            LIVE_INC(r->acq);
            count_wait(r, t0, t1, shared);
        } else if (rc == DLOCK_OK) {
            SET_PHASE(r, PH_CS);
            name_state *ns = &NS[li];
            /* (sequentially consistent: a reader's count and look are too,
             * so that of two that overlap each sees the other) */
            int occ = __atomic_add_fetch(&ns->occupancy, 1, __ATOMIC_SEQ_CST);
            int rd = O.read_pct > 0 ? __atomic_load_n(&ns->readers, __ATOMIC_SEQ_CST) : 0;
            if (rd != 0) {
                LIVE_INC(r->violations);
                logf_limited("VIOLATION: a writer inside '%s' beside %d readers (proc %d thread "
                             "%d, token %" PRIu64 ")", name, rd, a->proc, a->idx, fence);
            }
            if (occ != 1) {
                LIVE_INC(r->violations);
                logf_limited("VIOLATION: %d threads inside '%s' (proc %d thread %d, token %"
                             PRIu64 ")", occ, name, a->proc, a->idx, fence);
            }
            uint64_t last = __atomic_load_n(&ns->last_token, __ATOMIC_ACQUIRE);
            if (fence <= last) {
                LIVE_INC(r->regressions);
                logf_limited("TOKEN REGRESSION on '%s': got %" PRIu64 ", last seen %" PRIu64
                             " (proc %d thread %d)", name, fence, last, a->proc, a->idx);
            } else {
                __atomic_store_n(&ns->last_token, fence, __ATOMIC_RELEASE);
                __atomic_store_n(&ns->last_x_token, fence, __ATOMIC_RELEASE);
            }
            if (c && !dlock_held(c, name))
                r->not_held++;
            /* ordered by the lock under test, like the counter below */
            int lp = __atomic_load_n(&ns->last_proc, __ATOMIC_ACQUIRE);
            if (lp != 0 && lp != a->proc + 1)
                r->crossings++;
            __atomic_store_n(&ns->last_proc, a->proc + 1, __ATOMIC_RELEASE);
            uint64_t v = __atomic_load_n(&ns->counter, __ATOMIC_ACQUIRE);
            inside_enter(ns);
            critical_section(O.cs_us);
            inside_leave(ns);
            __atomic_store_n(&ns->counter, v + 1, __ATOMIC_RELEASE);
            __atomic_sub_fetch(&ns->occupancy, 1, __ATOMIC_ACQ_REL);
            SET_PHASE(r, PH_RELEASE);
            int rr = O.read_pct > 0 && O.mutex ? rwlock_release(li, 0)
                     : O.mutex                 ? mutex_release(li)
                     : O.naive      ? naive_release(name)
                                    : dlock_release(c, name);
            if (rr != DLOCK_OK) {
                r->rel_errors[err_index(rr)]++;
                logf_limited("release of '%s' returned %s: %s", name, dlock_err_name(rr),
                             last_error());
            }
            LIVE_INC(r->acq);
            count_wait(r, t0, t1, 0);
        } else if (rc == DLOCK_ETIMEDOUT) {
            LIVE_INC(r->timeouts);
            r->r_timeouts += shared;
        } else if (rc == DLOCK_EBUSY && O.wait_ms == 0) {
            r->busy++;
            r->r_failed += shared;
        } else {
            r->r_failed += shared;
            LIVE_INC(r->errors_total);
            r->errors[err_index(rc)]++;
            logf_limited("acquire of '%s' returned %d %s: %s", name, rc, dlock_err_name(rc),
                         last_error());
            sleep_ns(1000000); /* do not spin on a persistent failure */
        }
        SET_PHASE(r, PH_THINK);
        if (O.think_us > 0)
            sleep_ns((int64_t)O.think_us * 1000);
    }
    SET_PHASE(r, PH_DONE);
    if (naive_conn) {
        redisFree(naive_conn);
        naive_conn = NULL;
    }

    int64_t end = now_ns();
    int64_t prev = __atomic_load_n(&H->last_end_ns, __ATOMIC_RELAXED);
    while (end > prev &&
           !__atomic_compare_exchange_n(&H->last_end_ns, &prev, end, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Worker process                                                       */

static int open_client(dlock_client **out, proc_res *pr, int p)
{
    dlock_config cfg;
    dlock_config_init(&cfg);
    if (unix_path[0]) {
        cfg.redis_host = NULL;
        cfg.redis_unix_path = unix_path;
    } else if (O.sentinel) {
        cfg.redis_host = NULL;
        cfg.sentinels = sentinel_set.addrs;
        cfg.sentinel_master = SENTINEL_MASTER;
    } else if (O.cluster) {
        cfg.redis_host = NULL;
        cfg.cluster_nodes = cluster_set.addrs;
    } else if (O.redlock) {
        cfg.redis_host = NULL;
        cfg.redlock_nodes = redlock_addrs;
        cfg.connect_timeout_ms = (uint32_t)REDLOCK_TIMEOUT_MS(O.lease_ms);
        cfg.command_timeout_ms = (uint32_t)REDLOCK_TIMEOUT_MS(O.lease_ms);
    } else {
        cfg.redis_host = O.host;
        cfg.redis_port = client_port;
    }
    cfg.min_replicas = (uint32_t)O.min_replicas;
    cfg.key_prefix = key_prefix;
    cfg.lease_ms = (uint32_t)O.lease_ms;
    if (O.pass_limit >= 0)
        cfg.pass_limit = (uint32_t)O.pass_limit;
    if (O.join_ms >= 0)
        cfg.join_ms = (uint32_t)O.join_ms;
    if (O.protocol)
        cfg.protocol = O.protocol < 0 ? (uint32_t)(1 + p % 2) : (uint32_t)O.protocol;
    if (O.pool_size > 0)
        cfg.pool_size = (uint32_t)O.pool_size;
    else if (O.client_per_thread)
        cfg.pool_size = 1;
    int rc = dlock_client_open(&cfg, out);
    if (rc != DLOCK_OK)
        snprintf(pr->msg, sizeof pr->msg, "dlock_client_open: %s: %s", dlock_err_name(rc),
                 dlock_last_error());
    return rc;
}

/* --redlock: acquires fail until the client counts a majority of seeded
 * nodes (docs/guide.md, "Redlock"; at once on the storm's nodes, seeded
 * fresh). Before the run starts, the worker acquires and releases a name
 * of its own (none of the storm's), waiting for as long as that takes (the
 * lease, twice, and 5 s more), so that the run measures a client whose
 * connections to every node are open. 0, or -1 with pr->msg. */
static int redlock_warm_up(dlock_client *c, proc_res *pr, int p)
{
    char name[NAME_LEN];
    snprintf(name, sizeof name, "warm-up-%d", p);
    uint64_t fence = 0;
    int rc = dlock_acquire(c, name, 2 * O.lease_ms + 5000, &fence);
    if (rc == DLOCK_OK)
        rc = dlock_release(c, name);
    if (rc != DLOCK_OK) {
        snprintf(pr->msg, sizeof pr->msg, "Redlock warm-up (%s): %s: %s", name,
                 dlock_err_name(rc), dlock_last_error());
        return -1;
    }
    return 0;
}

void worker_main(int p)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent_pid)
        _exit(3);
    proc_res *pr = &PR[p];
    int T = O.threads;
    int nclients = O.mutex || O.naive ? 0 : O.client_per_thread ? T : 1;
    dlock_client **clients = calloc((size_t)(nclients ? nclients : 1), sizeof *clients);
    targ *args = calloc((size_t)T, sizeof *args);
    int failed = 0, opened = 0, started = 0;
    if (!clients || !args) {
        snprintf(pr->msg, sizeof pr->msg, "out of memory");
        failed = 1;
    }
    for (int i = 0; !failed && i < nclients; i++) {
        if (open_client(&clients[i], pr, p) != DLOCK_OK)
            failed = 1;
        else
            opened++;
    }
    if (!failed && O.redlock && redlock_warm_up(clients[0], pr, p) != 0)
        failed = 1;
    if (!failed) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        int e = pthread_attr_setstacksize(&attr, (size_t)O.stack_kb * 1024);
        if (e) {
            snprintf(pr->msg, sizeof pr->msg, "pthread_attr_setstacksize(%ld KiB): %s",
                     O.stack_kb, strerror(e));
            failed = 1;
        }
        for (int i = 0; !failed && i < T; i++) {
            args[i].proc = p;
            args[i].idx = i;
            args[i].c = O.mutex || O.naive ? NULL : clients[O.client_per_thread ? i : 0];
            args[i].r = &TR[(size_t)p * T + i];
            e = pthread_create(&args[i].tid, &attr, thread_main, &args[i]);
            if (e) {
                snprintf(pr->msg, sizeof pr->msg, "pthread_create (thread %d of %d): %s", i, T,
                         strerror(e));
                failed = 1;
                break;
            }
            started++;
        }
        pthread_attr_destroy(&attr);
    }
    pr->clients_opened = opened;
    pr->threads_started = started;
    pr->failed = failed;
    __atomic_store_n(&pr->setup_done, 1, __ATOMIC_RELEASE);

    for (int i = 0; i < started; i++)
        pthread_join(args[i].tid, NULL);

    dlock_stats sum;
    memset(&sum, 0, sizeof sum);
    for (int i = 0; i < opened; i++) {
        dlock_stats s;
        if (dlock_client_stats(clients[i], &s) == DLOCK_OK) {
            sum.acquisitions += s.acquisitions;
            sum.redis_commands += s.redis_commands;
            sum.redis_round_trips += s.redis_round_trips;
            sum.renew_rounds += s.renew_rounds;
            sum.renew_round_trips += s.renew_round_trips;
            sum.renew_keys += s.renew_keys;
            sum.leases_held += s.leases_held;
            sum.leases_lost += s.leases_lost;
            sum.entries += s.entries;
            sum.sem_acquisitions += s.sem_acquisitions;
            sum.sem_passes += s.sem_passes;
        }
    }
    pr->stats = sum;
    if (O.metrics_path && p == 0 && opened) {
        char *text = dlock_client_metrics_prometheus(clients[0]);
        FILE *f = text ? fopen(O.metrics_path, "w") : NULL;
        if (f) {
            fputs(text, f);
            fclose(f);
        } else {
            fprintf(stderr, "storm: --metrics %s: %s\n", O.metrics_path,
                    text ? strerror(errno) : dlock_last_error());
        }
        free(text);
    }
#ifdef DLOCK_LOCKSTAT
    if (opened)
        dlock_lockstat_report(stderr, p, sum.acquisitions, O.seconds);
#endif
    __atomic_store_n(&pr->closing, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < opened; i++)
        dlock_client_close(clients[i]);
    __atomic_store_n(&pr->closing, 2, __ATOMIC_RELAXED);
    free(clients);
    free(args);
    free(names);
    int status = failed ? 3 : 0;
#ifdef STORM_ASAN
    if (__lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "storm: worker %d: LeakSanitizer found leaks\n", p);
        status = 4;
    }
#endif
    /* _exit: never run the parent's atexit handlers in a worker */
    _exit(status);
}
