/*
 * dlockctl list, show and watch across a Redlock deployment's nodes
 * (--redlock-nodes; tools/dlockctl_quorum.c), run as a program against 3
 * private redis-servers (tests/support/fixture.h) while a client of this
 * process holds names in Redlock mode: what each node says of a name, the
 * holder a majority of the counting nodes agree on and the highest token
 * they granted it, a node down, a node whose seed key does not hold its
 * run id (it does not count), a semaphore's slots and claim, and the
 * commands that refuse the option.
 *
 * Each test runs on a key prefix of its own, seeded fresh by `dlockctl
 * seed-fresh`. Timing: leases of 1500 ms, so that a lease no majority
 * renews any more (a node killed, another not counting) is still held on
 * the node that counts for at least 2/3 of a lease (1 s) after the kill,
 * far more than a dlockctl run takes; a client counts a node a lease after
 * it first saw it, so each test's first acquire waits up to 3 s.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "dlock.h"
#include "fixture.h"
#include "common/slot.h"
#include "conn/script.h"

#ifndef DLOCKCTL_PATH
#error "DLOCKCTL_PATH: the dlockctl binary, set by tests/CMakeLists.txt"
#endif

#define NSRV 3
#define LEASE_MS 1500
#define FIRST_WAIT_MS 3000 /* a fresh client's first acquire: a lease + margin */
#define RL_TAG "rlctl"

#include "redlock_helpers.h"


/* Runs dlockctl with args; its exit status, its stdout and stderr in out. */
static int ctl(char *out, size_t n, const char *fmt, ...)
{
    char args[600], command[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(command, sizeof command, "%s %s 2>&1", DLOCKCTL_PATH, args);
    FILE *f = popen(command, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, n - 1, f);
    out[got] = '\0';
    char drop[4096];
    while (fread(drop, 1, sizeof drop, f) > 0)
        ; /* (the rest: a writer cut off would die of SIGPIPE) */
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A fresh prefix, seeded fresh on every node by dlockctl. */
static void fresh_prefix(void)
{
    char out[1024];
    snprintf(prefix, sizeof prefix, "rlctl%d:", ++prefix_no);
    int rc = ctl(out, sizeof out, "--redlock-nodes %s --prefix %s seed-fresh", nodes, prefix);
    if (rc != 0)
        fail_msg("seed-fresh: %d: %s", rc, out);
}

static dlock_client *open_client(const char *client_name)
{
    dlock_config cfg;
    rl_config(&cfg, LEASE_MS, 100);
    cfg.client_name = client_name;
    return rl_open(&cfg);
}

static uint64_t must_acquire(dlock_client *c, const char *name, int64_t wait)
{
    uint64_t t = 0;
    int rc = dlock_acquire(c, name, wait, &t);
    if (rc != DLOCK_OK)
        fail_msg("acquire of %s: %s: %s", name, dlock_strerror(rc), dlock_last_error());
    return t;
}

/* The token of the grant of name's lease on server i (the first word of
 * its field g, lua/p2/LAYOUT.txt), as the server holds it. */
static uint64_t token_at(int i, const char *name)
{
    char key[256];
    snprintf(key, sizeof key, "%s{%s}%s", prefix, name, dlock_script_key_suffix(DLOCK_KEY_LEASE));
    redisReply *r = fx_cmd_at(srv[i].port, "HGET %s g", key);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    uint64_t t = strtoull(r->str, NULL, 10);
    freeReplyObject(r);
    return t;
}

/* Raises the slot's mark of name on server i to t (lua/p2/mark.lua), so
 * that the node's next grant of the slot is above t. */
static void raise_mark(int i, const char *name, uint64_t t)
{
    char lease[128], hw[160], seed[64], tok[24];
    snprintf(lease, sizeof lease, "%s{%s}%s", prefix, name,
             dlock_script_key_suffix(DLOCK_KEY_LEASE));
    unsigned slot = dlock_cluster_slot(lease, strlen(lease));
    snprintf(hw, sizeof hw, "%shw:{%s}", prefix, dlock_slot_tag(slot));
    snprintf(seed, sizeof seed, "%sredlock:seed", prefix);
    snprintf(tok, sizeof tok, "%" PRIu64, t);
    redisReply *r = fx_cmd_at(srv[i].port, "EVAL %s 2 %s %s %s %s",
                              dlock_script_body(DLOCK_SCRIPT_MARK), hw, seed, tok, "");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    freeReplyObject(r);
}

/* Server i's clock in us plus an hour: above any token its grants hand
 * out by themselves now (a grant's token follows the server's clock). */
static uint64_t hour_ahead(int i)
{
    redisReply *r = fx_cmd_at(srv[i].port, "TIME");
    assert_non_null(r);
    uint64_t t = strtoull(r->element[0]->str, NULL, 10) * 1000000 +
                 strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return t + 3600ull * 1000000;
}

/* The count of needle in hay. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static int restore(void **state)
{
    (void)state;
    return fx_redis_restore_set(srv, NSRV);
}

/* ------------------------------------------------------------------ tests */

/* A name held by a client on every node: show names the holder on 3 of 3
 * nodes, each node's own token, and the highest of them (node 1's, whose
 * mark was raised an hour ahead of its clock, so that its grant's token
 * stands above the others'); the
 * token the client was handed is above it. */
static void test_show_majority(void **state)
{
    (void)state;
    fresh_prefix();
    uint64_t ahead = hour_ahead(1);
    raise_mark(1, "s", ahead);
    dlock_client *c = open_client("rl-holder");
    uint64_t t = must_acquire(c, "s", FIRST_WAIT_MS);
    uint64_t tk[NSRV], top = 0;
    for (int i = 0; i < NSRV; i++) {
        tk[i] = token_at(i, "s");
        if (tk[i] > top)
            top = tk[i];
    }
    assert_true(tk[1] > ahead && tk[0] < ahead && tk[2] < ahead); /* (the tokens differ) */
    assert_true(t > top);
    char out[8192], want[300];
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show s", nodes, prefix),
                     0);
    snprintf(want, sizeof want,
             "s: held by rl-holder (client id %s) on 3 of 3 nodes, a majority; highest token "
             "%" PRIu64 "\n",
             dlock_client_id(c), top);
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    for (int i = 0; i < NSRV; i++) {
        snprintf(want, sizeof want, "127.0.0.1:%d", srv[i].port);
        const char *line = strstr(out, want);
        assert_non_null(line);
        snprintf(want, sizeof want, "counts     held by rl-holder (client id %s), token %" PRIu64
                 ",", dlock_client_id(c), tk[i]);
        if (!strstr(line, want))
            fail_msg("node %d: want '%s' in:\n%s", i, want, out);
    }
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json show s", nodes,
                         prefix),
                     0);
    snprintf(want, sizeof want,
             "\"kind\":\"redlock\",\"majority\":2,\"held\":true,\"owner\":\"%s\","
             "\"holder_name\":\"rl-holder\",\"agree\":3,\"highest_token\":%" PRIu64 ",",
             dlock_client_id(c), top);
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    assert_int_equal(count_of(out, "\"state\":\"counts\",\"counts\":true,\"lock\":{"), 3);
    /* free on every node once released: no majority holder, exit 1 */
    assert_int_equal(dlock_release(c, "s"), DLOCK_OK);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show s", nodes, prefix),
                     1);
    assert_non_null(strstr(out, "s: no majority holder (no counting node holds it, 2 of 3 "
                                "needed)"));
    assert_int_equal(count_of(out, "counts     free\n"), 3);
    dlock_client_close(c);
}

/* A name held shared by two clients on every node: held shared on a
 * majority (show exits 0), each node saying how many share it; the JSON's
 * "shared_nodes"; free again once both released. */
static void test_show_shared(void **state)
{
    (void)state;
    fresh_prefix();
    dlock_client *a = open_client("rl-reader-a"), *b = open_client("rl-reader-b");
    assert_int_equal(dlock_acquire_shared(a, "r", FIRST_WAIT_MS, NULL), DLOCK_OK);
    assert_int_equal(dlock_acquire_shared(b, "r", FIRST_WAIT_MS, NULL), DLOCK_OK);
    char out[8192];
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show r", nodes, prefix),
                     0);
    if (!strstr(out, "r: held shared on 3 of 3 nodes, a majority (up to 2 clients on one)\n"))
        fail_msg("no shared majority in:\n%s", out);
    assert_int_equal(count_of(out, "counts     held shared by 2 clients\n"), 3);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json show r", nodes,
                         prefix),
                     0);
    if (!strstr(out, "\"held\":false,") || !strstr(out, "\"agree\":0,") ||
        !strstr(out, "\"shared_nodes\":3,\"nodes\":["))
        fail_msg("want held false and shared_nodes 3 in:\n%s", out);
    assert_int_equal(dlock_release_shared(a, "r"), DLOCK_OK);
    assert_int_equal(dlock_release_shared(b, "r"), DLOCK_OK);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show r", nodes, prefix),
                     1);
    assert_non_null(strstr(out, "r: no majority holder (no counting node holds it"));
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A node whose seed key does not hold its run id does not count: its
 * grant is not counted for the holder (2 of 3 still a majority); with
 * another node down, the one that counts and holds it is no majority:
 * show says so and exits 1, naming each node's state. */
static void test_uncounted_and_down(void **state)
{
    (void)state;
    fresh_prefix();
    dlock_client *c = open_client("rl-holder");
    must_acquire(c, "u", FIRST_WAIT_MS);
    char seed[64], out[8192], want[300];
    snprintf(seed, sizeof seed, "%sredlock:seed", prefix);
    redisReply *r = fx_cmd_at(srv[1].port, "SET %s %040d", seed, 0);
    assert_non_null(r);
    freeReplyObject(r);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show u", nodes, prefix),
                     0);
    snprintf(want, sizeof want, "u: held by rl-holder (client id %s) on 2 of 3 nodes, a majority",
             dlock_client_id(c));
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    snprintf(want, sizeof want, "127.0.0.1:%-12d not seeded held by rl-holder", srv[1].port);
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    assert_int_equal(fx_redis_signal(&srv[2], SIGKILL), 0);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show u", nodes, prefix),
                     1);
    snprintf(want, sizeof want,
             "u: no majority holder (client id %s holds it on 1 of 3 nodes, 2 needed)",
             dlock_client_id(c));
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    snprintf(want, sizeof want, "127.0.0.1:%-12d down       (", srv[2].port);
    if (!strstr(out, want))
        fail_msg("want '%s' in:\n%s", want, out);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json show u", nodes,
                         prefix),
                     1);
    assert_non_null(strstr(out, "\"held\":false,\"owner\":null,\"holder_name\":null,"
                                "\"agree\":1,\"highest_token\":null,"));
    assert_non_null(strstr(out, "\"state\":\"not seeded\",\"counts\":false,\"lock\":{"));
    assert_non_null(strstr(out, "\"state\":\"down\",\"counts\":false,\"error\":"));
    dlock_client_close(c);
}

/* list: every name held on any node that matches the pattern, sorted,
 * each with its nodes; --json an array of show's objects. watch --count
 * shows a name that many times. */
static void test_list_and_watch(void **state)
{
    (void)state;
    fresh_prefix();
    dlock_client *c = open_client("rl-lister");
    must_acquire(c, "lb", FIRST_WAIT_MS);
    must_acquire(c, "la", 0);
    must_acquire(c, "other", 0);
    char out[16384];
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s list 'l*'", nodes,
                         prefix),
                     0);
    assert_non_null(strstr(out, "nodes (2 needed): 127.0.0.1:"));
    const char *a = strstr(out, "\nla: held by rl-lister"), *b = strstr(out, "\nlb: held by "
                                                                             "rl-lister");
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a < b);
    assert_null(strstr(out, "other"));
    assert_int_equal(count_of(out, "counts     held by rl-lister"), 6);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json list", nodes,
                         prefix),
                     0);
    assert_int_equal(out[0], '[');
    assert_int_equal(count_of(out, "\"kind\":\"redlock\",\"majority\":2,\"held\":true"), 3);
    assert_true(strstr(out, "{\"name\":\"la\"") < strstr(out, "{\"name\":\"lb\"") &&
                strstr(out, "{\"name\":\"lb\"") < strstr(out, "{\"name\":\"other\""));
    assert_int_equal(ctl(out, sizeof out,
                         "--redlock-nodes %s --prefix %s watch la --interval 10 --count 2", nodes,
                         prefix),
                     0);
    assert_int_equal(count_of(out, "la: held by rl-lister"), 2);
    assert_int_equal(count_of(out, "-- "), 2);
    dlock_client_close(c);
}

/* A semaphore over the nodes (its permits are its slots, its name holds
 * its claim): show names its limit and how many slots a majority holds,
 * each node's claim, each slot's holder, and exits 0 while a permit is
 * held; the JSON's "semaphore"; list finds the name; once the permits are
 * back, 0 slots held and exit 1 (the claim lives on two leases). */
static void test_show_semaphore(void **state)
{
    (void)state;
    fresh_prefix();
    dlock_client *c = open_client("rl-sem");
    assert_int_equal(dlock_sem_acquire(c, "sm", 3, FIRST_WAIT_MS), DLOCK_OK);
    assert_int_equal(dlock_sem_acquire(c, "sm", 3, 0), DLOCK_OK);
    char out[16384], want[300];
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show sm", nodes,
                         prefix),
                     0);
    if (!strstr(out, "sm: a semaphore of limit 3, 2 of its slots held by a majority (permits "
                     "in use)\n"))
        fail_msg("no semaphore summary in:\n%s", out);
    assert_int_equal(count_of(out, "counts     a semaphore's claim, limit 3\n"), 3);
    snprintf(want, sizeof want, ": held by rl-sem (client id %s) on 3 of 3 nodes\n",
             dlock_client_id(c));
    assert_int_equal(count_of(out, want), 2);
    assert_int_equal(count_of(out, ": free\n"), 1);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json show sm", nodes,
                         prefix),
                     0);
    if (!strstr(out, "\"semaphore\":{\"limit\":3,\"permits\":2,\"slots\":[{\"slot\":0,"))
        fail_msg("no semaphore in the JSON:\n%s", out);
    assert_int_equal(count_of(out, "\"held\":true,\"owner\":"), 2);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s list", nodes, prefix),
                     0);
    assert_non_null(strstr(out, "\nsm: a semaphore of limit 3, 2 of its slots"));
    assert_int_equal(dlock_sem_release(c, "sm"), DLOCK_OK);
    assert_int_equal(dlock_sem_release(c, "sm"), DLOCK_OK);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s show sm", nodes,
                         prefix),
                     1);
    assert_non_null(strstr(out, "sm: a semaphore of limit 3, 0 of its slots held"));
    assert_int_equal(count_of(out, ": free\n"), 3);
    /* a lock is no semaphore */
    must_acquire(c, "lk", 0);
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s --prefix %s --json show lk", nodes,
                         prefix),
                     0);
    assert_non_null(strstr(out, "\"semaphore\":null}"));
    dlock_client_close(c);
}

/* release and doctor work on one node: bad usage with --redlock-nodes; a
 * bad node list is refused as seed-fresh refuses it. */
static void test_refused(void **state)
{
    (void)state;
    char out[2048];
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s release x --force", nodes), 2);
    assert_non_null(strstr(out, "release works on one node"));
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes %s doctor", nodes), 2);
    assert_non_null(strstr(out, "doctor works on one node"));
    assert_int_equal(ctl(out, sizeof out, "--redlock-nodes 127.0.0.1:1,127.0.0.1:2 show x"), 1);
    assert_non_null(strstr(out, "odd number"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_show_majority, restore),
        cmocka_unit_test_teardown(test_show_shared, restore),
        cmocka_unit_test_teardown(test_uncounted_and_down, restore),
        cmocka_unit_test_teardown(test_list_and_watch, restore),
        cmocka_unit_test_teardown(test_show_semaphore, restore),
        cmocka_unit_test_teardown(test_refused, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
