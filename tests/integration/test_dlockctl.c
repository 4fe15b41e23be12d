/*
 * dlockctl, the operators' tool (tools/dlockctl*.c), run as a program against
 * the test's redis-server while clients of this process hold and wait for
 * locks: list, show, watch, and release --force, whose holder must learn at
 * once (dlock_held 0, on_lost, on_log) and whose next waiter gets the lock.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dlock.h"
#include "fixture.h"

#ifndef DLOCKCTL_PATH
#error "DLOCKCTL_PATH: the dlockctl binary, set by tests/CMakeLists.txt"
#endif

/* Runs a shell command; returns its exit status (-1 if it did not exit)
 * and its stdout in out (truncated to n). The rest of the output is read
 * and dropped: a command still writing when the pipe closed would die of
 * SIGPIPE (dlockctl --help writes more than stdio's buffer). */
static int run_command(char *out, size_t n, const char *command)
{
    FILE *f = popen(command, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    char drop[4096];
    while (fread(drop, 1, sizeof drop, f) > 0)
        ;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs dlockctl with the server and prefix options, then args; returns its
 * exit status and its stdout (with its stderr too if with_err) in out
 * (truncated to n). */
static int vctl(int with_err, char *out, size_t n, const char *fmt, va_list ap)
{
    char args[600], command[900];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(command, sizeof command, "%s -h 127.0.0.1:%d --prefix tc:ctl: %s %s", DLOCKCTL_PATH,
             fx_server.port, args, with_err ? "2>&1" : "2>/dev/null");
    return run_command(out, n, command);
}

static int ctl(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vctl(0, out, n, fmt, ap);
    va_end(ap);
    return rc;
}

static int ctl_err(char *out, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vctl(1, out, n, fmt, ap);
    va_end(ap);
    return rc;
}

static int lost_calls;
static uint64_t lost_fence;
static char log_line[600];
static int log_level = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)arg;
    pthread_mutex_lock(&mu);
    lost_calls++;
    lost_fence = fence;
    pthread_mutex_unlock(&mu);
}

static void on_log(int level, const char *message, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    if (strstr(message, "operator")) {
        log_level = level;
        snprintf(log_line, sizeof log_line, "%s", message);
    }
    pthread_mutex_unlock(&mu);
}

static dlock_client *open_named(const char *name, int with_callbacks)
{
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:ctl:";
    cfg.client_name = name;
    if (with_callbacks) {
        cfg.on_lost = on_lost;
        cfg.on_log = on_log;
    }
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    /* subscribed before any test publishes to it (holder_told, "f") */
    char channel[96];
    snprintf(channel, sizeof channel, "tc:ctl:wake:%s", dlock_client_id(c));
    assert_int_equal(fx_wait_channel(&fx_server, channel), 0);
    return c;
}

typedef struct waiter {
    dlock_client *c;
    int rc;
    uint64_t token;
    int unclean; /* dlock_unclean once acquired */
} waiter;

static void *wait_for(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, "order:1", 20000, &w->token);
    if (w->rc == DLOCK_OK) {
        w->unclean = dlock_unclean(w->c, "order:1");
        w->rc = dlock_release(w->c, "order:1");
    }
    return NULL;
}

static void test_list_show_release(void **state)
{
    (void)state;
    dlock_client *a = open_named("alpha-7", 1), *b = open_named("beta-9", 0);
    uint64_t t1;
    assert_int_equal(dlock_acquire(a, "order:1", 0, &t1), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "order:2", 0, NULL), DLOCK_OK);
    waiter w = {b, -1, 0, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_for, &w), 0);
    char out[8192];
    for (int i = 0; i < 500; i++) { /* b queued (5 s at most) */
        ctl(out, sizeof out, "--json show order:1");
        if (strstr(out, "\"waiting\":1"))
            break;
        fx_sleep_ms(10);
    }

    /* list: both names, the holder's name and id, the waiter count */
    assert_int_equal(ctl(out, sizeof out, "--json list"), 0);
    fprintf(stderr, "list --json: %s", out);
    assert_non_null(strstr(out, "\"name\":\"order:1\""));
    assert_non_null(strstr(out, "\"name\":\"order:2\""));
    assert_non_null(strstr(out, "\"holder_name\":\"alpha-7\""));
    assert_non_null(strstr(out, dlock_client_id(a)));
    assert_non_null(strstr(out, "\"waiting\":1"));
    char tok[40];
    snprintf(tok, sizeof tok, "\"token\":%llu", (unsigned long long)t1);
    assert_non_null(strstr(out, tok));
    assert_int_equal(ctl(out, sizeof out, "list 'order:2'"), 0);
    assert_non_null(strstr(out, "order:2"));
    assert_null(strstr(out, "order:1"));
    assert_non_null(strstr(out, "alpha-7"));

    /* show: the holder and the queue with the waiter's name */
    assert_int_equal(ctl(out, sizeof out, "show order:1"), 0);
    fprintf(stderr, "show: %s", out);
    assert_non_null(strstr(out, "held by alpha-7"));
    assert_non_null(strstr(out, "beta-9"));
    assert_non_null(strstr(out, "alive"));
    assert_int_equal(ctl(out, sizeof out, "--json show order:1"), 0);
    assert_non_null(strstr(out, "\"queue\":[{\"client\":"));
    assert_non_null(strstr(out, "\"name\":\"beta-9\""));
    assert_int_equal(ctl(out, sizeof out, "show nobody-has-it"), 1);
    assert_non_null(strstr(out, "free"));
    assert_int_equal(ctl(out, sizeof out, "--count 2 --interval 50 watch order:2"), 0);
    assert_non_null(strstr(out, "held by alpha-7"));

    /* release needs --force; with it the holder learns at once */
    assert_int_equal(ctl(out, sizeof out, "release order:1"), 2);
    assert_int_equal(dlock_held(a, "order:1"), 1);
    long long t0 = fx_now_ns();
    assert_int_equal(ctl(out, sizeof out, "--json release order:1 --force"), 0);
    fprintf(stderr, "release --force: %s", out);
    assert_non_null(strstr(out, "\"released\":true"));
    assert_non_null(strstr(out, "\"holder_told\":true"));
    assert_non_null(strstr(out, "\"next_waiter_granted\":true"));
    long long dropped = 0;
    for (int i = 0; i < 2000 && !dropped; i++) {
        if (dlock_held(a, "order:1") == 0)
            dropped = fx_now_ns();
        else
            fx_sleep_ms(1);
    }
    pthread_join(th, NULL);
    fprintf(stderr, "the holder's dlock_held dropped %.1f ms after dlockctl returned\n",
            dropped ? (dropped - t0) / 1e6 : -1.0);
    /* generous for a loaded machine: the lease time is 30 s, so without the
     * message it would take a renewal period (10 s) */
    assert_true(dropped > 0 && dropped - t0 < 2000LL * 1000000);
    assert_int_equal(w.rc, DLOCK_OK);
    assert_true(w.token > t1);
    assert_int_equal(w.unclean, DLOCK_UNCLEAN_FORCED); /* the waiter is told */
    pthread_mutex_lock(&mu);
    assert_int_equal(lost_calls, 1);
    assert_true(lost_fence == t1);
    assert_int_equal(log_level, DLOCK_LOG_WARN);
    assert_non_null(strstr(log_line, "order:1"));
    pthread_mutex_unlock(&mu);
    assert_int_equal(dlock_release(a, "order:1"), DLOCK_ELOST);
    assert_int_equal(dlock_held(a, "order:2"), 1); /* the other lease is untouched */
    assert_int_equal(ctl(out, sizeof out, "release order:1 --force"), 1); /* free now */
    assert_int_equal(dlock_release(a, "order:2"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A forced release keeps tokens increasing however short the lease: the
 * holder's reservation for its threads (the fence) is kept, not pushed a
 * second ahead of the server's clock, which a later grant's shorter fence
 * would let expire below the tokens handed out meanwhile. And the holder's
 * release of the taken grant is DLOCK_ELOST, told or not. */
static void test_force_keeps_tokens_increasing(void **state)
{
    (void)state;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:ctl:";
    cfg.lease_ms = 300;
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    uint64_t ta, tb, tc;
    assert_int_equal(dlock_acquire(a, "short", 0, &ta), DLOCK_OK);
    char out[2048];
    assert_int_equal(ctl(out, sizeof out, "release short --force"), 0);
    /* the record of a's grant says taken (token 0), not released: in both
     * layouts its second word is the token of the client's last released
     * grant (fixture.h, fx_record_get) */
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    char *rec = fx_record_get(k, "tc:ctl:{short}", dlock_client_id(a));
    redisFree(k);
    assert_non_null(rec);
    fprintf(stderr, "record of the taken grant: %s\n", rec);
    char released_token[32];
    assert_int_equal(sscanf(rec, "%*s %31s", released_token), 1);
    assert_string_equal(released_token, "0");
    free(rec);
    assert_int_equal(dlock_release(a, "short"), DLOCK_ELOST);
    assert_int_equal(dlock_acquire(b, "short", 0, &tb), DLOCK_OK);
    assert_true(tb > ta);
    assert_int_equal(dlock_release(b, "short"), DLOCK_OK);
    fx_sleep_ms(1200); /* past every fence a lease of 300 ms sets */
    assert_int_equal(dlock_acquire(a, "short", 0, &tc), DLOCK_OK);
    fprintf(stderr, "tokens: %llu, then %llu after the forced release, then %llu\n",
            (unsigned long long)ta, (unsigned long long)tb, (unsigned long long)tc);
    assert_true(tc > tb);
    assert_int_equal(dlock_release(a, "short"), DLOCK_OK);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* An "f" message about a grant the client does not hold (a stale or made
 * up one) changes nothing and is not counted. */
static void test_stale_force_message_ignored(void **state)
{
    (void)state;
    dlock_client *a = open_named("gamma", 1);
    assert_int_equal(dlock_acquire(a, "z", 0, NULL), DLOCK_OK);
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    redisReply *r = redisCommand(k, "PUBLISH tc:ctl:wake:%s %s", dlock_client_id(a), "f 12345 z");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(k);
    fx_sleep_ms(300);
    dlock_stats st;
    assert_int_equal(dlock_client_stats(a, &st), DLOCK_OK);
    assert_int_equal(st.forced_releases, 0);
    assert_int_equal(dlock_held(a, "z"), 1);
    assert_int_equal(dlock_release(a, "z"), DLOCK_OK);
    dlock_client_close(a);
}

/* release --client ID --force: every lock one client holds, in one command
 * (the on-call case of a process that died holding many names); another
 * client's lock is untouched; the next holder is told DLOCK_UNCLEAN_FORCED. */
static void test_release_client(void **state)
{
    (void)state;
    dlock_client *dead = open_named("dead-1", 0), *other = open_named("other-2", 0);
    char name[32], out[8192];
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "rc:%d", i);
        assert_int_equal(dlock_acquire(dead, name, 0, NULL), DLOCK_OK);
    }
    assert_int_equal(dlock_acquire(other, "rc:other", 0, NULL), DLOCK_OK);
    const char *id = dlock_client_id(dead);
    assert_int_equal(ctl(out, sizeof out, "release --client %s", id), 2); /* no --force */
    assert_int_equal(ctl(out, sizeof out, "release --client nothex --force"), 2);
    assert_int_equal(ctl(out, sizeof out, "release rc:0 --client %s --force", id), 2);
    assert_int_equal(ctl(out, sizeof out, "--json release --client %s --force", id), 0);
    assert_true(out[0] == '[');
    int objects = 0;
    for (const char *p = out; (p = strstr(p, "\"released\":true")); p++)
        objects++;
    assert_int_equal(objects, 5);
    for (int i = 0; i < 5; i++) {
        char key[64];
        snprintf(key, sizeof key, "tc:ctl:{rc:%d}", i);
        assert_int_equal(fx_server_lease_ms(key), -2);
    }
    assert_true(fx_server_lease_ms("tc:ctl:{rc:other}") > 0);
    assert_int_equal(dlock_acquire(other, "rc:3", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_unclean(other, "rc:3"), DLOCK_UNCLEAN_FORCED);
    assert_int_equal(dlock_release(other, "rc:3"), DLOCK_OK);
    /* nothing left: exit 1, and says so */
    assert_int_equal(ctl(out, sizeof out, "release --client %s --force", id), 1);
    assert_non_null(strstr(out, "holds no lock"));
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "rc:%d", i);
        assert_int_equal(dlock_release(dead, name), DLOCK_ELOST);
    }
    assert_int_equal(dlock_release(other, "rc:other"), DLOCK_OK);

    /* A name that changes hands between dlockctl's scan and its release
     * (a pause of 1.5 s there, DLOCKCTL_TEST_PAUSE_MS) is left to its new
     * holder: only the client named is released. */
    assert_int_equal(dlock_acquire(dead, "rc:moved", 0, NULL), DLOCK_OK);
    char command[600];
    snprintf(command, sizeof command, "DLOCKCTL_TEST_PAUSE_MS=1500 %s -h 127.0.0.1:%d --prefix tc:ctl: "
             "release --client %s --force >/dev/null 2>&1", DLOCKCTL_PATH, fx_server.port, id);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    fx_sleep_ms(500); /* it has scanned (0.5 s is plenty on loopback) and now pauses */
    assert_int_equal(dlock_release(dead, "rc:moved"), DLOCK_OK);
    assert_int_equal(dlock_acquire(other, "rc:moved", 0, NULL), DLOCK_OK);
    int st = pclose(f);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1); /* nothing of `dead` released */
    assert_true(fx_server_lease_ms("tc:ctl:{rc:moved}") > 0);
    assert_int_equal(dlock_held(other, "rc:moved"), 1);
    assert_int_equal(dlock_release(other, "rc:moved"), DLOCK_OK);
    dlock_client_close(dead);
    dlock_client_close(other);
}

/* The listing an operator trusts: sorted by name; a name with control
 * characters printed escaped (it cannot forge a line or move the cursor);
 * a waiter whose liveness deadline passed shown dead by the server's
 * clock; each lock read in one step (one script call); --version; and
 * doctor, which says what to change. */
static long long calls_of(const char *command)
{
    return fx_info_calls("127.0.0.1", fx_server.port, command);
}

static void test_listing_and_doctor(void **state)
{
    (void)state;
    dlock_client *a = open_named("gamma-3", 0);
    const char *names[] = {"srt:zz", "srt:aa", "srt:mm", "srt:bad\nline\x1b[31m"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(dlock_acquire(a, names[i], 0, NULL), DLOCK_OK);
    char out[8192];
    assert_int_equal(ctl(out, sizeof out, "list 'srt:*'"), 0);
    fprintf(stderr, "list: %s", out);
    const char *pa = strstr(out, "srt:aa"), *pm = strstr(out, "srt:mm"), *pz = strstr(out, "srt:zz");
    assert_true(pa && pm && pz && pa < pm && pm < pz);
    assert_non_null(strstr(out, "srt:bad\\x0aline\\x1b[31m"));
    assert_null(strchr(out, '\x1b'));
    /* one step per lock: one script call that reads it (INFO counts the
     * commands it runs too: one HMGET), and none of the reads of before
     * (ZCARD, TIME apart). show reads a name with protocol 1's script
     * first (tools/dlockctl_list.c, ctl_show): a name of protocol 2 costs
     * that script's refusal too (one HMGET, nothing else read), then its
     * own protocol's read. */
    redisContext *k = fx_connect("127.0.0.1", fx_server.port);
    assert_non_null(k);
    int pv = fx_key_protocol(k, "tc:ctl:{srt:aa}");
    redisFree(k);
    assert_true(pv == 1 || pv == 2);
    long long ev0 = calls_of("eval"), hm0 = calls_of("hmget"), zc0 = calls_of("zcard");
    assert_int_equal(ctl(out, sizeof out, "show srt:aa"), 0);
    assert_int_equal(calls_of("eval") - ev0, pv);
    assert_int_equal(calls_of("hmget") - hm0, pv);
    assert_int_equal(calls_of("zcard") - zc0, 0);
    /* a dead waiter (its deadline 1 ms after the epoch), as the server sees it */
    freeReplyObject(fx_cmd_at(fx_server.port, "ZADD tc:ctl:{srt:aa}:q 1 deadbeef"));
    freeReplyObject(fx_cmd_at(fx_server.port, "HSET tc:ctl:{srt:aa}:qd deadbeef %s",
                              "1 7 128 2000 ghost-1"));
    freeReplyObject(fx_cmd_at(fx_server.port, "PEXPIRE tc:ctl:{srt:aa}:q 60000"));
    freeReplyObject(fx_cmd_at(fx_server.port, "PEXPIRE tc:ctl:{srt:aa}:qd 60000"));
    assert_int_equal(ctl(out, sizeof out, "show srt:aa"), 0);
    assert_non_null(strstr(out, "ghost-1 (deadbeef) waiting"));
    assert_non_null(strstr(out, "dead (skipped at the next release)"));
    for (int i = 0; i < 4; i++)
        assert_int_equal(dlock_release(a, names[i]), DLOCK_OK);

    /* the protocol it names is the library's default (dlock.h), whatever
     * protocol the clients of this test write */
    assert_int_equal(ctl(out, sizeof out, "--version"), 0);
    char version[128];
    snprintf(version, sizeof version, "dlockctl %s (protocol %d, reads 1 and 2)",
             DLOCK_VERSION_STRING, DLOCK_PROTOCOL_VERSION);
    assert_non_null(strstr(out, version));
    assert_int_equal(ctl(out, sizeof out, "doctor"), 0);
    assert_non_null(strstr(out, "ok    version"));
    assert_non_null(strstr(out, "ok    eviction"));
    assert_non_null(strstr(out, "fit for dlock"));
    freeReplyObject(fx_cmd_at(fx_server.port, "CONFIG SET maxmemory 1000000000"));
    freeReplyObject(fx_cmd_at(fx_server.port, "CONFIG SET maxmemory-policy volatile-lru"));
    assert_int_equal(ctl(out, sizeof out, "--json doctor"), 1);
    freeReplyObject(fx_cmd_at(fx_server.port, "CONFIG SET maxmemory-policy noeviction"));
    freeReplyObject(fx_cmd_at(fx_server.port, "CONFIG SET maxmemory 0"));
    fprintf(stderr, "doctor: %s", out);
    assert_non_null(strstr(out, "\"check\":\"eviction\",\"status\":\"FAIL\""));
    assert_non_null(strstr(out, "maxmemory-policy noeviction"));
    dlock_client_close(a);
    /* A server that does not answer is reported as such, not as a
     * permission its ACL user lacks (dlockctl waits 2 s for INFO). */
    assert_int_equal(fx_redis_signal(&fx_server, SIGSTOP), 0);
    int rc = ctl(out, sizeof out, "doctor");
    assert_int_equal(fx_redis_signal(&fx_server, SIGCONT), 0);
    fprintf(stderr, "doctor, server stopped: %s", out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "no answer to INFO"));
    assert_null(strstr(out, "+info"));
}

/* A server that answers in another protocol: one HTTP reply to each
 * connection, for as long as `stop` is 0. */
typedef struct http_srv {
    int fd, port;
    atomic_int stop;
    pthread_t th;
} http_srv;

static void *http_main(void *arg)
{
    http_srv *h = arg;
    while (!atomic_load(&h->stop)) {
        int c = accept(h->fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[512];
        (void)!read(c, buf, sizeof buf);
        static const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
        (void)!write(c, reply, sizeof reply - 1);
        close(c);
    }
    return NULL;
}

static void test_not_a_redis_server(void **state)
{
    (void)state;
    http_srv h = {.stop = 0};
    h.fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(h.fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(h.fd, (struct sockaddr *)&a, &len), 0);
    h.port = ntohs(a.sin_port);
    assert_int_equal(listen(h.fd, 8), 0);
    struct timeval tv = {0, 100000}; /* accept wakes to see `stop` */
    setsockopt(h.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(pthread_create(&h.th, NULL, http_main, &h), 0);
    char command[600], out[2048];
    for (int i = 0; i < 2; i++) {
        snprintf(command, sizeof command, "%s -h 127.0.0.1 -p %d %s 2>&1", DLOCKCTL_PATH, h.port,
                 i == 0 ? "list" : "doctor");
        FILE *f = popen(command, "r");
        size_t got = fread(out, 1, sizeof out - 1, f);
        out[got] = '\0';
        int st = pclose(f);
        fprintf(stderr, "# %s", out);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
        assert_non_null(strstr(out, "not a Redis server"));
        assert_null(strstr(out, "unreachable"));
    }
    atomic_store(&h.stop, 1);
    pthread_join(h.th, NULL);
    close(h.fd);
}

/* dlockctl with args alone (no server option added); exit status, and
 * stdout and stderr in out. */
static int ctl_raw(char *out, size_t n, const char *args)
{
    char command[900];
    snprintf(command, sizeof command, "%s %s 2>&1", DLOCKCTL_PATH, args);
    return run_command(out, n, command);
}

/* --host's forms, as redis-cli's: HOST, HOST:PORT, [ADDR]:PORT; an address
 * with more than one colon is an IPv6 address without a port. */
static void test_host_forms(void **state)
{
    (void)state;
    char out[2048], args[200];
    snprintf(args, sizeof args, "-h [127.0.0.1]:%d --prefix tc:ctl: list", fx_server.port);
    assert_int_equal(ctl_raw(out, sizeof out, args), 0);
    snprintf(args, sizeof args, "-h localhost -p %d --prefix tc:ctl: list", fx_server.port);
    assert_int_equal(ctl_raw(out, sizeof out, args), 0);
    /* ::1 is a host, not host ":" and port 1: with -p 1 nothing disagrees,
     * and the error is the connection's, not bad usage */
    assert_int_equal(ctl_raw(out, sizeof out, "-h ::1 -p 1 list"), 1);
    assert_null(strstr(out, "--host says port"));
    assert_int_equal(ctl_raw(out, sizeof out, "-h [::1 list"), 2);
    assert_non_null(strstr(out, "--host wants HOST"));
    assert_int_equal(ctl_raw(out, sizeof out, "-h []:1 list"), 2);
    assert_int_equal(ctl_raw(out, sizeof out, "-h host: list"), 2);
    assert_int_equal(ctl_raw(out, sizeof out, "-h [::1]x list"), 2);
}

static void test_bad_usage(void **state)
{
    (void)state;
    char out[2048];
    /* -p is the port, as redis-cli's: a prefix given to it is bad usage,
     * and a port that disagrees with --host's too; the same port passes */
    assert_int_equal(ctl_err(out, sizeof out, "-p tc: list"), 2);
    assert_non_null(strstr(out, "--port takes a whole number"));
    assert_int_equal(ctl_err(out, sizeof out, "-p 1 list"), 2);
    assert_non_null(strstr(out, "--host says port"));
    assert_int_equal(ctl(out, sizeof out, "-p %d list", fx_server.port), 0);
    assert_int_equal(ctl(out, sizeof out, ""), 2);
    assert_int_equal(ctl_err(out, sizeof out, "frobnicate x"), 2);
    assert_non_null(strstr(out, "unknown command 'frobnicate'"));
    assert_int_equal(ctl_err(out, sizeof out, "frobnicate"), 2); /* not "needs a lock name" */
    assert_non_null(strstr(out, "unknown command 'frobnicate'"));
    /* every bad number exits 2, before or after the command's name */
    assert_int_equal(ctl(out, sizeof out, "watch x --interval -5 --count 1"), 2);
    assert_int_equal(ctl(out, sizeof out, "--interval -5 watch x --count 1"), 2);
    assert_int_equal(ctl(out, sizeof out, "watch x --count 0"), 2);
    assert_int_equal(ctl(out, sizeof out, "watch x --count 1x"), 2);
    assert_int_equal(ctl(out, sizeof out, "show"), 2);
    assert_int_equal(ctl(out, sizeof out, "--socket /nonexistent show x"), 2); /* two servers */
    assert_int_equal(ctl(out, sizeof out, "--help"), 0);
    assert_non_null(strstr(out, "release NAME --force"));
}

/* A lock's lease, fence and client c's record of it, as one string: what
 * a refusal must leave as it was. (Protocol 2's hash holds the grant and
 * the records; protocol 1's fence and record keys are read in both
 * layouts, so that a refusal writing them would show too.) */
static void data_of(dlock_client *c, const char *name, char *out, size_t n)
{
    redisReply *h = fx_cmd_at(fx_server.port, "HGETALL tc:ctl:{%s}", name);
    redisReply *f = fx_cmd_at(fx_server.port, "GET tc:ctl:{%s}:fence", name);
    redisReply *r = fx_cmd_at(fx_server.port, "GET tc:ctl:{%s}:c:%s", name, dlock_client_id(c));
    size_t used = 0;
    for (size_t i = 0; i < h->elements; i++)
        used += (size_t)snprintf(out + used, n - used, "%s ", h->element[i]->str);
    snprintf(out + used, n - used, "| %s | %s", f->type == REDIS_REPLY_STRING ? f->str : "-",
             r->type == REDIS_REPLY_STRING ? r->str : "-");
    freeReplyObject(h);
    freeReplyObject(f);
    freeReplyObject(r);
}

/* Data of a protocol this release does not speak (a later release's, 3:
 * lua/acquire.lua, "Protocol"; protocol 2's is read, test_dlockctl_protocols.c)
 * is refused by show, list and release --force, naming the protocols,
 * exit status 1, and left as it was; also when it is marked after dlockctl
 * read the lock, before it releases it. */
static void test_other_protocol_refused(void **state)
{
    (void)state;
    /* A lease of 60 s: renewal rounds 20 s apart, far from the few seconds
     * this takes even on a loaded machine (a round would find a marked
     * lease not renewed, and the client's release would then say ELOST). */
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = "tc:ctl:";
    cfg.client_name = "delta-4";
    cfg.lease_ms = 60000;
    dlock_client *a;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_acquire(a, "pvx", 0, NULL), DLOCK_OK);
    freeReplyObject(fx_cmd_at(fx_server.port, "HSET tc:ctl:{pvx} pv 3"));
    char before[1024], after[1024], out[4096];
    data_of(a, "pvx", before, sizeof before);
    assert_int_equal(dlock_release(a, "pvx"), DLOCK_ESERVER); /* the client refuses too */
    const char *cmds[] = {"show pvx", "release pvx --force"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ctl_err(out, sizeof out, "%s", cmds[i]), 1);
        fprintf(stderr, "%s: %s", cmds[i], out);
        assert_non_null(strstr(out, "dlockctl: tc:ctl:{pvx}: the data of this name is dlock "
                                    "protocol 3; this dlockctl speaks protocols 1 and 2: use "
                                    "the dlockctl of the release that wrote it"));
    }
    /* a listing and a client's release go on past such a name: one lock of
     * another protocol does not stop an operator freeing the others */
    assert_int_equal(dlock_acquire(a, "pvok", 0, NULL), DLOCK_OK);
    assert_int_equal(ctl_err(out, sizeof out, "list 'pv*'"), 0);
    fprintf(stderr, "list: %s", out);
    assert_non_null(strstr(out, "tc:ctl:{pvx}: the data of this name is dlock protocol 3"));
    assert_non_null(strstr(out, "pvok "));
    assert_int_equal(ctl_err(out, sizeof out, "release --client %s --force", dlock_client_id(a)),
                     0);
    fprintf(stderr, "release --client: %s", out);
    assert_non_null(strstr(out, "tc:ctl:{pvx}: the data of this name is dlock protocol 3"));
    assert_non_null(strstr(out, "1 of the 1 locks client"));
    assert_int_equal(dlock_release(a, "pvok"), DLOCK_ELOST); /* taken by the operator */
    data_of(a, "pvx", after, sizeof after);
    assert_string_equal(before, after);

    /* Marked between the read and the forced release (a pause of 1.5 s
     * there, DLOCKCTL_TEST_FORCE_PAUSE_MS): the release script refuses it,
     * atomically, and writes nothing. */
    assert_int_equal(dlock_acquire(a, "pv3", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(a, "pv3"), DLOCK_OK); /* the client's record of it */
    assert_int_equal(dlock_acquire(a, "pv3", 0, NULL), DLOCK_OK);
    char command[600];
    snprintf(command, sizeof command, "DLOCKCTL_TEST_FORCE_PAUSE_MS=1500 %s -h 127.0.0.1:%d "
             "--prefix tc:ctl: release pv3 --force 2>&1", DLOCKCTL_PATH, fx_server.port);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    fx_sleep_ms(500); /* it has read the lock (0.5 s is plenty on loopback) and now pauses */
    freeReplyObject(fx_cmd_at(fx_server.port, "HSET tc:ctl:{pv3} pv 3"));
    data_of(a, "pv3", before, sizeof before);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    fprintf(stderr, "release pv3 --force: %s", out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(out, "dlockctl: tc:ctl:{pv3}: the data of this name is dlock "
                                "protocol 3; this dlockctl speaks protocols 1 and 2: use the "
                                "dlockctl of the release that wrote it"));
    data_of(a, "pv3", after, sizeof after);
    assert_string_equal(before, after);
    assert_int_equal(dlock_release(a, "pv3"), DLOCK_ESERVER);
    dlock_client_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_show_release),
        cmocka_unit_test(test_force_keeps_tokens_increasing),
        cmocka_unit_test(test_stale_force_message_ignored),
        cmocka_unit_test(test_release_client),
        cmocka_unit_test(test_listing_and_doctor),
        cmocka_unit_test(test_bad_usage),
        cmocka_unit_test(test_host_forms),
        cmocka_unit_test(test_not_a_redis_server),
        cmocka_unit_test(test_other_protocol_refused),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
