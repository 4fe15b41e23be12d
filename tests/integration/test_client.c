/*
 * Integration tests of the public client API against a private redis-server
 * (tests/support/fixture.h): the client itself. The version, config defaults,
 * argument checking (open's config, lock names), error names, a password or
 * db the server refuses, close releasing everything, fork, and a holder
 * process that dies.
 *
 * The other tests of the client API: test_client_locking.c (acquire,
 * release and held, waits, reentrancy, tokens), test_client_faults.c (Redis
 * unreachable, stopped, restarted, closing idle connections),
 * test_client_ops.c (holder identity, metrics, on_log, handles, dlock_with
 * and guards). Their shared helpers are in client_helpers.h.
 *
 * One server per executable (group setup/teardown); the per-test teardown
 * fx_ensure_server resumes or restarts it if a test left it stopped.
 *
 * Timing: this runs on small, noisy machines and under sanitizers, so every
 * time bound below is an upper bound several times larger than the duration
 * it guards, and says why.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "client_helpers.h"

/* The fork test opens a new client (which starts threads and allocates) in a
 * child of this multi-threaded process. Two sanitizer runtimes cannot do
 * that, so under them that part of the child is left out; the EFORK checks
 * still run, and the plain build runs the whole test:
 * - ThreadSanitizer does not support threads started after a multi-threaded
 *   fork (the child dies, or with die_after_fork=0 reports "dup thread with
 *   used id");
 * - AddressSanitizer of GCC 12 does not take its allocator's locks around
 *   fork (its runtime does since LLVM 18), so when one of the parent's
 *   library threads is inside malloc at the fork, the child's first malloc
 *   of that size class waits forever (seen: the child's subscriber thread
 *   in SizeClassAllocator64::GetFromAllocator, about 1 run in 150 with both
 *   cores busy). glibc's malloc is fork-safe, so a user's child is not. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define FX_NO_THREADS_AFTER_FORK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define FX_NO_THREADS_AFTER_FORK 1
#endif
#endif

/* ------------------------------------------------------------------ tests */

/* The library's version is the header's, and the number matches the string. */
static void test_version(void **state)
{
    (void)state;
    assert_string_equal(dlock_version(), DLOCK_VERSION_STRING);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", DLOCK_VERSION_MAJOR, DLOCK_VERSION_MINOR,
             DLOCK_VERSION_PATCH);
    assert_string_equal(v, DLOCK_VERSION_STRING);
    assert_int_equal(DLOCK_VERSION_NUMBER, DLOCK_VERSION_MAJOR * 10000 +
                                               DLOCK_VERSION_MINOR * 100 + DLOCK_VERSION_PATCH);
}

static void test_config_defaults(void **state)
{
    (void)state;
    dlock_config cfg;
    memset(&cfg, 0xab, sizeof cfg);
    dlock_config_init(&cfg);
    assert_non_null(cfg.redis_host);
    assert_string_equal(cfg.redis_host, "127.0.0.1");
    assert_int_equal(cfg.redis_port, 6379);
    assert_null(cfg.redis_password);
    assert_int_equal(cfg.redis_db, 0);
    assert_non_null(cfg.key_prefix);
    assert_string_equal(cfg.key_prefix, "dlock:");
    assert_int_equal(cfg.lease_ms, 30000);
    assert_int_equal(cfg.connect_timeout_ms, 1000);
    assert_int_equal(cfg.command_timeout_ms, 1000);
    assert_int_equal(cfg.pass_limit, 128);
    assert_null(cfg.on_lost);
    assert_null(cfg.on_lost_arg);
    assert_null(cfg.redis_unix_path);
    assert_null(cfg.sentinels);
    assert_null(cfg.cluster_nodes);
    assert_int_equal(cfg.min_replicas, 0);
    assert_int_equal(cfg.pool_size, 4);
    assert_int_equal(cfg.waiter_ttl_ms, 2000);
}

/* Opens with cfg and expects `want`; closes the client if one was made. */
static void expect_open(const dlock_config *cfg, int want, const char *what)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(cfg, &c);
    if (rc == DLOCK_OK)
        dlock_client_close(c);
    if (rc != want)
        fail_msg("%s: dlock_client_open returned %s, expected %s", what, dlock_err_name(rc),
                 dlock_err_name(want));
    if (want == DLOCK_EINVAL && dlock_last_error()[0] == '\0')
        fail_msg("%s: EINVAL without a message in dlock_last_error()", what);
}

static void test_open_invalid(void **state)
{
    (void)state;
    dlock_config good, cfg;
    fx_config(&good, &fx_server);
    good.key_prefix = "tc:open:";

    /* The baseline opens, so each failure below is due to its one change. */
    expect_open(&good, DLOCK_OK, "baseline");

    dlock_client *c = (dlock_client *)0x1;
    assert_int_equal(dlock_client_open(NULL, &c), DLOCK_EINVAL);
    assert_int_equal(dlock_client_open(&good, NULL), DLOCK_EINVAL);

    char prefix65[DLOCK_PREFIX_MAX + 2], prefix64[DLOCK_PREFIX_MAX + 1];
    memset(prefix65, 'p', DLOCK_PREFIX_MAX + 1);
    prefix65[DLOCK_PREFIX_MAX + 1] = '\0';
    memset(prefix64, 'q', DLOCK_PREFIX_MAX);
    prefix64[DLOCK_PREFIX_MAX] = '\0';

#define BAD(field, value)                                                      \
    do {                                                                       \
        cfg = good;                                                            \
        cfg.field = value;                                                     \
        expect_open(&cfg, DLOCK_EINVAL, #field " = " #value);                  \
    } while (0)
#define OK(field, value)                                                       \
    do {                                                                       \
        cfg = good;                                                            \
        cfg.field = value;                                                     \
        expect_open(&cfg, DLOCK_OK, #field " = " #value);                      \
    } while (0)

    BAD(redis_host, NULL);
    BAD(redis_port, 0);
    BAD(redis_port, -1);
    BAD(redis_port, 70000);
    BAD(key_prefix, NULL);
    BAD(key_prefix, prefix65);
    BAD(lease_ms, 0);
    BAD(lease_ms, DLOCK_LEASE_MIN_MS - 1);
    BAD(lease_ms, DLOCK_LEASE_MAX_MS + 1);
    BAD(connect_timeout_ms, 0);
    BAD(connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS + 1);
    BAD(command_timeout_ms, 0);
    BAD(command_timeout_ms, DLOCK_TIMEOUT_MAX_MS + 1);
    BAD(pool_size, 0);
    BAD(pool_size, 1025);
    BAD(redis_db, -1);
    BAD(redis_host, "");
    BAD(waiter_ttl_ms, 0);
    BAD(waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS - 1);
    BAD(waiter_ttl_ms, DLOCK_LEASE_MAX_MS + 1);
    BAD(pass_limit, DLOCK_PASS_LIMIT_MAX + 1);
    /* Handoff tokens must stay below the lease time in us (good has the
     * default 30 s lease). */
    BAD(pass_limit, 30000u * 1000u);
    cfg = good;
    cfg.lease_ms = 100;
    cfg.pass_limit = 100000; /* = lease_ms * 1000 */
    expect_open(&cfg, DLOCK_EINVAL, "pass_limit 100000 with lease_ms 100");
    cfg.pass_limit = 99999;
    expect_open(&cfg, DLOCK_OK, "pass_limit 99999 with lease_ms 100");

    /* The limits themselves are accepted. */
    OK(pass_limit, 0);
    OK(pass_limit, DLOCK_PASS_LIMIT_MAX);
    OK(pool_size, 1024);
    OK(waiter_ttl_ms, DLOCK_WAITER_TTL_MIN_MS);
    OK(waiter_ttl_ms, DLOCK_LEASE_MAX_MS);
    OK(key_prefix, prefix64);
    OK(lease_ms, DLOCK_LEASE_MIN_MS);
    OK(lease_ms, DLOCK_LEASE_MAX_MS);
    OK(connect_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    OK(command_timeout_ms, DLOCK_TIMEOUT_MAX_MS);
    OK(redis_port, 65535);
#undef BAD
#undef OK

    /* NULL is ignored by close; NULL arguments of stats are rejected. */
    dlock_client_close(NULL);
    dlock_stats s;
    assert_int_equal(dlock_client_stats(NULL, &s), DLOCK_EINVAL);
    dlock_client *k = open_client("tc:open:", 0);
    assert_int_equal(dlock_client_stats(k, NULL), DLOCK_EINVAL);
    dlock_client_close(k);
}

static void test_name_arguments(void **state)
{
    (void)state;
    const char *prefix = "tc:names:";
    dlock_client *c = open_client(prefix, 0);
    char too_long[DLOCK_NAME_MAX + 2], longest[DLOCK_NAME_MAX + 1];
    memset(too_long, 'x', DLOCK_NAME_MAX + 1);
    too_long[DLOCK_NAME_MAX + 1] = '\0';
    memset(longest, 'y', DLOCK_NAME_MAX);
    longest[DLOCK_NAME_MAX] = '\0';
    uint64_t f = 0;

    assert_int_equal(dlock_acquire(NULL, "a", 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, NULL, 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, "", 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, too_long, 0, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_acquire(c, too_long, -1, &f), DLOCK_EINVAL);
    assert_int_equal(dlock_release(NULL, "a"), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, NULL), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, ""), DLOCK_EINVAL);
    assert_int_equal(dlock_release(c, too_long), DLOCK_EINVAL);
    assert_int_equal(dlock_held(NULL, "a"), 0);
    assert_int_equal(dlock_held(c, NULL), 0);
    assert_int_equal(dlock_held(c, ""), 0);
    assert_int_equal(dlock_held(c, too_long), 0);
    assert_table_empty(c);

    /* Exactly DLOCK_NAME_MAX bytes works, and names the Redis key in full. */
    char key[DLOCK_NAME_MAX + 64];
    lease_key(key, sizeof key, prefix, longest);
    assert_int_equal(dlock_acquire(c, longest, 0, &f), DLOCK_OK);
    assert_true(f > 0);
    assert_int_equal(dlock_held(c, longest), 1);
    assert_int_equal(lease_live(key), 1);
    assert_int_equal(dlock_release(c, longest), DLOCK_OK);
    assert_int_equal(lease_live(key), 0);
    assert_int_equal(dlock_held(c, longest), 0);

    /* A name may hold any bytes but NUL: braces, colons, spaces. */
    const char *odd = "a:{b} c";
    lease_key(key, sizeof key, prefix, odd);
    assert_int_equal(dlock_acquire(c, odd, 0, &f), DLOCK_OK);
    assert_int_equal(lease_live(key), 1);
    assert_int_equal(dlock_release(c, odd), DLOCK_OK);
    assert_int_equal(lease_live(key), 0);

    assert_table_empty(c);
    dlock_client_close(c);
}

static void test_errors(void **state)
{
    (void)state;
    struct { int code; const char *name, *msg; } all[] = {
#define XX(name, val, msg) { DLOCK_##name, "DLOCK_" #name, msg },
        DLOCK_ERRNO_MAP(XX)
#undef XX
    };
    size_t n = sizeof all / sizeof all[0];
    assert_int_equal(n, 11);
    for (size_t i = 0; i < n; i++) {
        assert_true(all[i].code < 0);
        assert_string_equal(dlock_strerror(all[i].code), all[i].msg);
        assert_string_equal(dlock_err_name(all[i].code), all[i].name);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(all[i].code, all[j].code);
    }
    assert_non_null(dlock_strerror(DLOCK_OK));
    assert_non_null(dlock_err_name(DLOCK_OK));
    assert_string_not_equal(dlock_strerror(DLOCK_OK), "unknown error");

    int unknown[] = { -12, -1000, 1, 42, INT32_MIN, INT32_MAX };
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(dlock_strerror(unknown[i]), "unknown error");
        const char *nm = dlock_err_name(unknown[i]);
        assert_non_null(nm);
        assert_true(strlen(nm) > 0);
        for (size_t j = 0; j < n; j++)
            assert_string_not_equal(nm, all[j].name);
    }
}

/* A thread of the parent polls a handle (dlock_handle_held takes the
 * entry's mutex) while the parent forks: a child that inherits that mutex
 * held must not wait for it. Before the fix every child hung here (the
 * handle's calls took the mutex with no fork check) or, when it did not,
 * was told it held the parent's lease. */
typedef struct poller {
    dlock_handle *h;
    atomic_int stop;
} poller;

static void *poll_handle(void *arg)
{
    poller *p = arg;
    while (!atomic_load(&p->stop))
        (void)dlock_handle_held(p->h);
    return NULL;
}

static void test_fork_child_handle(void **state)
{
    (void)state;
    dlock_client *c = open_client("tc:forkh:", 20000);
    dlock_handle *h = NULL;
    assert_int_equal(dlock_acquire_handle(c, "fh", 0, NULL, &h), DLOCK_OK);
    poller p = {h, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, poll_handle, &p), 0);
    int hung = 0, wrong = 0;
    for (int i = 0; i < 10; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int bad = 0;
            if (dlock_handle_held(h) != 0)
                bad |= 1;
            if (dlock_handle_unclean(h) != DLOCK_EFORK)
                bad |= 2;
            _exit(bad ? 100 + bad : 0);
        }
        /* Both calls are local: 10 s is a generous bound for a loaded
         * machine, then the child counts as hung. */
        int st = 0;
        long long deadline = fx_now_ns() + 10000 * 1000000LL;
        pid_t w;
        while ((w = waitpid(pid, &st, WNOHANG)) == 0 && fx_now_ns() < deadline)
            fx_sleep_ms(5);
        if (w == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            hung++;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            wrong++;
        }
    }
    atomic_store(&p.stop, 1);
    pthread_join(th, NULL);
    assert_int_equal(dlock_handle_held(h), 1); /* the parent still holds it */
    assert_int_equal(dlock_handle_release(h), DLOCK_OK);
    dlock_client_close(c);
    assert_int_equal(hung, 0);
    assert_int_equal(wrong, 0);
}

static void test_fork_child(void **state)
{
    (void)state;
    const char *prefix = "tc:fork:";
    dlock_client *c = open_client(prefix, 20000);
    char key[64];
    lease_key(key, sizeof key, prefix, "fk");
    uint64_t f = 0;
    assert_int_equal(dlock_acquire(c, "fk", 0, &f), DLOCK_OK);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* No cmocka here: report through the exit status. */
        int bad = 0;
        if (dlock_acquire(c, "fk", 0, NULL) != DLOCK_EFORK)
            bad |= 1;
        if (dlock_acquire(c, "other", -1, NULL) != DLOCK_EFORK)
            bad |= 2;
        if (dlock_release(c, "fk") != DLOCK_EFORK)
            bad |= 4;
        if (dlock_held(c, "fk") != 0)
            bad |= 8;
        dlock_client_close(c); /* only forgets the parent's client */
#ifndef FX_NO_THREADS_AFTER_FORK
        /* A new client in the child is an independent owner. */
        dlock_config cfg;
        fx_config(&cfg, &fx_server);
        cfg.key_prefix = prefix;
        dlock_client *k = NULL;
        if (dlock_client_open(&cfg, &k) != DLOCK_OK) {
            bad |= 16;
        } else {
            if (dlock_acquire(k, "fk", 0, NULL) != DLOCK_EBUSY)
                bad |= 32;
            if (dlock_acquire(k, "child", 0, NULL) != DLOCK_OK ||
                dlock_release(k, "child") != DLOCK_OK)
                bad |= 64;
            dlock_client_close(k);
        }
#endif
        _exit(bad ? 100 + bad : 0); /* 100+: not a sanitizer's exit code */
    }
    /* The child's calls are all local or quick: 20 s bound, then kill it. */
    int st = 0;
    long long deadline = fx_now_ns() + 20000 * 1000000LL;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && fx_now_ns() < deadline)
        fx_sleep_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        fail_msg("forked child hung");
    }
    if (!WIFEXITED(st))
        fail_msg("forked child died with signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    if (WEXITSTATUS(st) > 100)
        fail_msg("forked child: failed checks mask %d (1,2 acquire not EFORK; 4 release not "
                 "EFORK; 8 held; 16 open; 32 new client not EBUSY; 64 new client acquire)",
                 WEXITSTATUS(st) - 100);
    if (WEXITSTATUS(st) != 0)
        fail_msg("forked child exited with status %d (a sanitizer report?)", WEXITSTATUS(st));

    /* The parent's lease survived the child's close. */
    assert_int_equal(dlock_held(c, "fk"), 1);
    assert_int_equal(lease_live(key), 1);
    char *token = grant_get(key, "token");
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, f);
    assert_non_null(token);
    assert_string_equal(token, want);
    free(token);
    assert_int_equal(dlock_release(c, "fk"), DLOCK_OK);
    assert_int_equal(lease_live(key), 0);
    assert_table_empty(c);
    dlock_client_close(c);
}

static void *hold_and_leave(void *arg)
{
    dlock_client *c = arg;
    intptr_t rc = dlock_acquire(c, "thread-held", 0, NULL);
    return (void *)rc;
}

static void test_close_releases(void **state)
{
    (void)state;
    const char *prefix = "tc:close:";
    const uint32_t lease = 60000;
    dlock_client *c = open_client(prefix, lease);
    const char *names[] = { "a", "b", "c", "d", "e" };
    for (int i = 0; i < 5; i++)
        assert_int_equal(dlock_acquire(c, names[i], 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "a", 0, NULL), DLOCK_OK); /* nested */
    pthread_t th;
    void *ret;
    assert_int_equal(pthread_create(&th, NULL, hold_and_leave, c), 0);
    pthread_join(th, &ret);
    assert_int_equal((intptr_t)ret, DLOCK_OK);
    /* the thread's exit released its lock (test_client_life) */
    assert_int_equal(stats(c).leases_held, 5);
    assert_int_equal(stats(c).abandoned, 1);

    char key[64];
    for (int i = 0; i < 5; i++) {
        lease_key(key, sizeof key, prefix, names[i]);
        assert_int_equal(lease_live(key), 1);
    }
    dlock_client_close(c);
    for (int i = 0; i < 5; i++) {
        lease_key(key, sizeof key, prefix, names[i]);
        assert_int_equal(lease_live(key), 0);
    }
    lease_key(key, sizeof key, prefix, "thread-held");
    assert_int_equal(lease_live(key), 0);

    /* So another client gets them at once, long before the 60 s lease. */
    dlock_client *c2 = open_client(prefix, lease);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(dlock_acquire(c2, names[i], 0, NULL), DLOCK_OK);
        /* their holders did not release them: the close did */
        assert_int_equal(dlock_unclean(c2, names[i]), DLOCK_UNCLEAN_ABANDONED);
        assert_int_equal(dlock_release(c2, names[i]), DLOCK_OK);
    }
    assert_table_empty(c2);
    dlock_client_close(c2);
}

/* Redis without requirepass: AUTH with a password fails; a db index beyond
 * the server's 16 fails SELECT. Either gives an error, not a hang. */
static void test_bad_auth_and_db(void **state)
{
    (void)state;
    const long long bound_ms = 10000; /* ~6x connect + command timeouts */
    for (int k = 0; k < 2; k++) {
        dlock_config cfg;
        fx_config(&cfg, &fx_server);
        cfg.key_prefix = "tc:auth:";
        if (k == 0)
            cfg.redis_password = "not-the-password";
        else
            cfg.redis_db = 1000;
        dlock_client *c = NULL;
        long long t0 = fx_now_ns();
        int rc = dlock_client_open(&cfg, &c);
        assert_true(MS(fx_now_ns() - t0) < bound_ms);
        /* Only NULL/out-of-range arguments fail open; the server's refusal is
         * reported by the calls. */
        assert_int_equal(rc, DLOCK_OK);
        t0 = fx_now_ns();
        rc = dlock_acquire(c, "a", 0, NULL);
        long long el = MS(fx_now_ns() - t0);
        /* A refused password is no passing failure: DLOCK_ESERVER. */
        int want = k == 0 ? DLOCK_ESERVER : DLOCK_EREDIS;
        if (rc != want)
            fail_msg("%s: acquire returned %s, expected %s",
                     k ? "redis_db 1000" : "wrong password", dlock_err_name(rc),
                     dlock_err_name(want));
        assert_true(dlock_last_error()[0] != '\0');
        assert_true(el < bound_ms);
        t0 = fx_now_ns();
        rc = dlock_acquire(c, "a", 1000, NULL);
        assert_int_equal(rc, want);
        assert_true(MS(fx_now_ns() - t0) < bound_ms);
        assert_int_equal(dlock_held(c, "a"), 0);
        assert_table_empty(c);
        dlock_client_close(c);
    }
    /* Nothing was written by those clients. */
    assert_int_equal(key_exists("tc:auth:{a}"), 0);
}

/* Child mode of test_holder_process_dies: a fresh process (exec'd, so it
 * shares nothing with the test) that takes a lease, reports its fence on
 * stdout, and dies without releasing anything. */
static int hold_and_die(int port, const char *prefix)
{
    fx_server.port = port;
    dlock_config cfg;
    fx_config(&cfg, &fx_server);
    cfg.key_prefix = prefix;
    cfg.lease_ms = 2000;
    dlock_client *c = NULL;
    uint64_t f = 0;
    if (dlock_client_open(&cfg, &c) != DLOCK_OK || dlock_acquire(c, "dead", 0, &f) != DLOCK_OK)
        return 3;
    printf("%" PRIu64 "\n", f);
    fflush(stdout);
    raise(SIGKILL);
    return 4;
}

/* A holder process that dies frees the name within its lease (docs/guide.md,
 * "Semantics"). */
static void test_holder_process_dies(void **state)
{
    (void)state;
    const char *prefix = "tc:dies:";
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char port[16];
    snprintf(port, sizeof port, "%d", fx_server.port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl("/proc/self/exe", "test_client", "--hold-and-die", port, prefix, (char *)NULL);
        _exit(5);
    }
    close(fds[1]);
    /* The child starts, connects and acquires: 20 s is far more than that. */
    char buf[64] = "";
    size_t got = 0;
    long long deadline = fx_now_ns() + 20000 * 1000000LL;
    while (got < sizeof buf - 1 && !strchr(buf, '\n') && fx_now_ns() < deadline) {
        struct pollfd pfd = { fds[0], POLLIN, 0 };
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t n = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
        buf[got] = '\0';
    }
    close(fds[0]);
    int st = 0;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && fx_now_ns() < deadline)
        fx_sleep_ms(10);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    if (!strchr(buf, '\n'))
        fail_msg("holder child reported no fence (status 0x%x)", st);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    uint64_t child_fence = strtoull(buf, NULL, 10);
    assert_true(child_fence > 0);

    /* Its 2 s lease runs out with nobody renewing it; the wait of 15 s is
     * 7x the lease, for a loaded machine. */
    dlock_client *c = open_client(prefix, 20000);
    uint64_t f = 0;
    long long t0 = fx_now_ns();
    int rc = dlock_acquire(c, "dead", 15000, &f);
    long long el = MS(fx_now_ns() - t0);
    if (rc != DLOCK_OK)
        fail_msg("name of a dead holder not free after %lld ms: %s", el, dlock_err_name(rc));
    assert_true(f > child_fence);
    /* and this holder is told that the one before never released it */
    assert_int_equal(dlock_unclean(c, "dead"), DLOCK_UNCLEAN_EXPIRED);
    assert_int_equal(dlock_release(c, "dead"), DLOCK_OK);
    /* after a release, the next holder is told nothing */
    assert_int_equal(dlock_acquire(c, "dead", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_unclean(c, "dead"), 0);
    assert_int_equal(dlock_release(c, "dead"), DLOCK_OK);
    assert_int_equal(dlock_unclean(c, "dead"), DLOCK_ENOTHELD);
    assert_table_empty(c);
    dlock_client_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--hold-and-die"))
        return hold_and_die(atoi(argv[2]), argv[3]);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_errors),
        cmocka_unit_test_teardown(test_open_invalid, fx_ensure_server),
        cmocka_unit_test_teardown(test_name_arguments, fx_ensure_server),
        cmocka_unit_test_teardown(test_close_releases, fx_ensure_server),
        cmocka_unit_test_teardown(test_fork_child, fx_ensure_server),
        cmocka_unit_test_teardown(test_fork_child_handle, fx_ensure_server),
        cmocka_unit_test_teardown(test_holder_process_dies, fx_ensure_server),
        cmocka_unit_test_teardown(test_bad_auth_and_db, fx_ensure_server),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
