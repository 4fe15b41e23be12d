/*
 * Redlock's quorum client (src/route/redlock.h) against 3 and 5 private
 * redis-servers (tests/support/fixture.h): the token rule of
 * docs/design.md, "Redlock", as the simulator's Redlock world proves it
 * (sim/redlock.lua), on real servers that stop, pause and restart empty.
 *
 * Each test runs on a key prefix of its own, seeded fresh (every node
 * given its run id), so that a node one test restarted, emptied, is a
 * fresh node to the next. The per-test teardown resumes every paused
 * server and starts every killed one again.
 *
 * Tokens "ahead": on one machine every server reads the same clock, so
 * grants' tokens (server time in us) increase by themselves. The rule
 * exists for tokens ahead of a node's clock (a grant made while its clock
 * was behind, a local tier's handoffs): the tests write such a mark with
 * mark.lua, as the write-back of a token handed out ahead would, and check
 * that no later token falls below it.
 *
 * Timing: leases of 400 ms; every bound below is the lease, the command
 * timeout or the drift allowance the rule itself uses, plus a margin of at
 * least 100 ms for a loaded machine.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"
#include "common/error.h"
#include "common/slot.h"
#include "conn/conn.h"
#include "conn/script.h"
#include "route/redlock.h"

#define NSRV 5
#define LEASE_MS 400

static fx_redis srv[NSRV];
static int prefix_no;
static uint32_t lease_ms = LEASE_MS; /* the lease of the clients client_new makes */

/* ---------------------------------------------------------------- helpers */

typedef struct client {
    dlock_conn_cfg cfg;
    dlock_counters ctr;
    dlock_redlock *rl;
    char prefix[32];
    char id[33];
    char name[32];
    dlock_script_args args;
    char wake[64];
    uint64_t attempt;
} client;

/* A client of the first n servers, on prefix (its id from `who`), with
 * that command timeout. */
static client *client_new(int n, const char *prefix, int who, uint32_t cmd_ms)
{
    client *c = calloc(1, sizeof *c);
    assert_non_null(c);
    snprintf(c->prefix, sizeof c->prefix, "%s", prefix);
    snprintf(c->id, sizeof c->id, "%032x", 0x1000 + who);
    snprintf(c->name, sizeof c->name, "client%d", who);
    snprintf(c->wake, sizeof c->wake, "%swake:", prefix);
    c->cfg.protocol = 2;
    c->cfg.connect_timeout_ms = 300;
    c->cfg.command_timeout_ms = cmd_ms;
    c->cfg.client_name = c->name;
    c->args = (dlock_script_args){.client_id = c->id, .lease_ms = "0", .pass_limit = "0",
                                  .waiter_ttl_ms = "1000", .wake_prefix = c->wake,
                                  .keep_ms = "4000"};
    char addrs[NSRV * 24] = "";
    for (int i = 0; i < n; i++)
        snprintf(addrs + strlen(addrs), sizeof addrs - strlen(addrs), "%s127.0.0.1:%d",
                 i ? "," : "", srv[i].port);
    assert_int_equal(dlock_redlock_create(&c->cfg, addrs, prefix, lease_ms, 2, &c->ctr, &c->rl),
                     DLOCK_OK);
    return c;
}

static void client_free(client *c)
{
    dlock_redlock_destroy(c->rl);
    free(c);
}

/* A fresh prefix for one test. */
static const char *new_prefix(char *buf, size_t n)
{
    snprintf(buf, n, "rl%d:", ++prefix_no);
    return buf;
}

/* The keys of name under c's prefix, as lua/keys.lua lays them out. */
typedef struct keys {
    char k[DLOCK_SCRIPT_KEYS][128];
    char *p[DLOCK_SCRIPT_KEYS];
} keys;

static void keys_of(const client *c, const char *name, keys *k)
{
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++) {
        k->p[i] = k->k[i];
        if (i == DLOCK_KEY_HW)
            continue;
        snprintf(k->k[i], sizeof k->k[i], "%s{%s}%s%s", c->prefix, name,
                 dlock_script_key_suffix(i), i == DLOCK_KEY_CLIENT ? c->id : "");
    }
    unsigned slot = dlock_cluster_slot(k->k[DLOCK_KEY_LEASE], strlen(k->k[DLOCK_KEY_LEASE]));
    snprintf(k->k[DLOCK_KEY_HW], sizeof k->k[0], "%shw:{%s}", c->prefix, dlock_slot_tag(slot));
}

static int64_t ms_from_now(long ms)
{
    return dlock_now_ns() + ms * DLOCK_NS_PER_MS;
}

/* One quorum acquire of name by c: its result code, *g, *busy. */
static int acquire(client *c, const char *name, dlock_redlock_grant *g, dlock_redlock_busy *busy)
{
    keys k;
    keys_of(c, name, &k);
    dlock_redlock_req q = {.name = name, .keys = k.p, .args = &c->args, .client_name = c->name,
                           .attempt = ++c->attempt, .deadline = ms_from_now(2000)};
    dlock_redlock_busy b;
    return dlock_redlock_acquire(c->rl, &q, g, busy ? busy : &b);
}

/* Releases g of name: DLOCK_OK, or DLOCK_ELOST once g's validity has
 * passed (an acquire that waited out a stopped node twice is granted near
 * the end of it: the nodes' grants may have run out since). */
static void release(client *c, const char *name, const dlock_redlock_grant *g)
{
    keys k;
    keys_of(c, name, &k);
    dlock_redlock_req q = {.name = name, .keys = k.p, .args = &c->args, .client_name = c->name,
                           .attempt = g->attempt, .deadline = ms_from_now(2000)};
    int rc = dlock_redlock_release(c->rl, &q, g);
    if (rc != DLOCK_OK && !(rc == DLOCK_ELOST && dlock_boot_ns() >= g->valid_boot))
        fail_msg("release of %s, %" PRId64 " ms before its validity's end: %s", name,
                 (g->valid_boot - dlock_boot_ns()) / DLOCK_NS_PER_MS, dlock_last_error());
}

/* Acquires name, which must be granted, and releases it: the token. */
static uint64_t grant_token(client *c, const char *name)
{
    dlock_redlock_grant g;
    int rc = acquire(c, name, &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire of %s: %d %s", name, rc, dlock_last_error());
    release(c, name, &g);
    return g.token;
}

/* The slot's mark of name on server i as mark.lua reads it (0 none). */
static uint64_t mark_on(int i, const client *c, const char *name)
{
    keys k;
    keys_of(c, name, &k);
    char seed[64];
    snprintf(seed, sizeof seed, "%sredlock:seed", c->prefix);
    redisReply *r = fx_cmd_at(srv[i].port, "EVAL %s 2 %s %s 0 %s",
                              dlock_script_body(DLOCK_SCRIPT_MARK), k.k[DLOCK_KEY_HW], seed, "");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    uint64_t v = strtoull(r->element[0]->str, NULL, 10);
    freeReplyObject(r);
    return v;
}

/* Raises the slot's mark of name on server i to t, as the write-back of a
 * token t handed out would. */
static void raise_mark(int i, const client *c, const char *name, uint64_t t)
{
    keys k;
    keys_of(c, name, &k);
    char seed[64], tok[24];
    snprintf(seed, sizeof seed, "%sredlock:seed", c->prefix);
    snprintf(tok, sizeof tok, "%" PRIu64, t);
    redisReply *r = fx_cmd_at(srv[i].port, "EVAL %s 2 %s %s %s %s",
                              dlock_script_body(DLOCK_SCRIPT_MARK), k.k[DLOCK_KEY_HW], seed, tok,
                              "");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    freeReplyObject(r);
}

/* Server i's clock in us, plus an hour: a token ahead of every clock. */
static uint64_t ahead_us(int i)
{
    redisReply *r = fx_cmd_at(srv[i].port, "TIME");
    assert_non_null(r);
    uint64_t t = strtoull(r->element[0]->str, NULL, 10) * 1000000 +
                 strtoull(r->element[1]->str, NULL, 10);
    freeReplyObject(r);
    return t + 3600ull * 1000000;
}

/* Seeds c's nodes fresh: every node counts for c at once (and for every
 * other client). */
static void seed_all(client *c)
{
    assert_int_equal(dlock_redlock_seed_fresh(c->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(dlock_redlock_refresh(c->rl, ms_from_now(2000)), DLOCK_OK);
    for (unsigned i = 0; i < dlock_redlock_nodes(c->rl); i++)
        assert_true(dlock_redlock_counts(c->rl, i));
}

/* Server i's run id (INFO server). */
static void run_id_of(int i, char *out, size_t size)
{
    redisReply *r = fx_cmd_at(srv[i].port, "INFO server");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    const char *s = strstr(r->str, "run_id:");
    assert_non_null(s);
    s += 7;
    size_t k = strspn(s, "0123456789abcdef");
    assert_true(k > 0 && k < size);
    memcpy(out, s, k);
    out[k] = '\0';
    freeReplyObject(r);
}

/* Writes server i's run id into c's seed key there, as another client's
 * seeding of it would. */
static void seed_by_hand(int i, const client *c)
{
    char run[64];
    run_id_of(i, run, sizeof run);
    redisReply *r = fx_cmd_at(srv[i].port, "SET %sredlock:seed %s", c->prefix, run);
    assert_non_null(r);
    freeReplyObject(r);
}

/* Loads protocol 2's acquire and release scripts and mark.lua into server
 * i (restarted: so that no NOSCRIPT's send again, read after the other
 * nodes' replies, changes a test's timing). */
static void load_scripts(int i)
{
    dlock_script_id ids[] = {dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2),
                             dlock_script_in(DLOCK_SCRIPT_RELEASE, 2), DLOCK_SCRIPT_MARK};
    for (int k = 0; k < 3; k++) {
        redisReply *r = fx_cmd_at(srv[i].port, "SCRIPT LOAD %s", dlock_script_body(ids[k]));
        assert_non_null(r);
        assert_int_equal(r->type, REDIS_REPLY_STRING);
        freeReplyObject(r);
    }
}

/* Runs a command on server i, its reply dropped. */
static void cmd_at(int i, const char *cmd, const char *a1, const char *a2)
{
    redisReply *r = a2 ? fx_cmd_at(srv[i].port, cmd, a1, a2)
                       : a1 ? fx_cmd_at(srv[i].port, cmd, a1) : fx_cmd_at(srv[i].port, cmd);
    assert_non_null(r);
    freeReplyObject(r);
}

static void kill_srv(int i)
{
    assert_int_equal(fx_redis_signal(&srv[i], SIGKILL), 0);
}

static void restart_srv(int i)
{
    assert_int_equal(fx_redis_restart(&srv[i]), 0);
}

static int restore(void **state)
{
    (void)state;
    lease_ms = LEASE_MS;
    return fx_redis_restore_set(srv, NSRV);
}

/* The server check of a stopped node (SIGSTOP) is given up at its
 * deadline (renew_thread.c passes the next round's due time), also when
 * no connection to it is pooled and one must be opened. (250 ms for a
 * deadline 50 ms away: generous, for a busy machine; the node's own
 * timeouts are 600 ms.) */
static void test_check_node_deadline(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    assert_int_equal(fx_redis_signal(&srv[0], SIGSTOP), 0);
    int64_t t0 = dlock_now_ns();
    int rc = dlock_redlock_check_node(a->rl, 0, t0 + 50 * DLOCK_NS_PER_MS);
    int64_t took = (dlock_now_ns() - t0) / DLOCK_NS_PER_MS;
    print_message("check of a stopped node, deadline 50 ms: rc %d after %" PRId64 " ms\n", rc,
                  took);
    assert_int_not_equal(rc, DLOCK_OK);
    if (took > 250)
        fail_msg("the check of a stopped node took %" PRId64 " ms past a deadline 50 ms away",
                 took);
    client_free(a);
}

static int group_setup(void **state)
{
    (void)state;
    return fx_redis_start_set(srv, NSRV, NULL, 0);
}

static int group_teardown(void **state)
{
    (void)state;
    fx_redis_stop_set(srv, NSRV);
    return 0;
}

/* ------------------------------------------------------------------ tests */

/* A set of an even number of nodes, or fewer than 3, is refused. */
static void test_node_count_refused(void **state)
{
    (void)state;
    dlock_conn_cfg cfg = {.protocol = 2, .connect_timeout_ms = 300, .command_timeout_ms = 300};
    dlock_counters ctr = {0};
    dlock_redlock *rl = NULL;
    assert_int_equal(dlock_redlock_create(&cfg, "127.0.0.1:1,127.0.0.1:2", "x:", LEASE_MS, 1, &ctr,
                                          &rl), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "odd number"));
    assert_int_equal(dlock_redlock_create(&cfg, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4",
                                          "x:", LEASE_MS, 1, &ctr, &rl), DLOCK_EINVAL);
    assert_int_equal(dlock_redlock_create(&cfg, "127.0.0.1:1", "x:", LEASE_MS, 1, &ctr, &rl),
                     DLOCK_EINVAL);
    cfg.protocol = 1;
    assert_int_equal(dlock_redlock_create(&cfg, "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "x:",
                                          LEASE_MS, 1, &ctr, &rl), DLOCK_EINVAL);
    assert_null(rl);
}

/* A fresh deployment: no node counts before it is seeded; seeded, every
 * node counts at once for a fresh client, which grants by quorum with
 * strictly increasing
 * tokens, each valid until first send + lease - drift allowance at most,
 * each token written back to every node's mark; a second fresh seeding is
 * refused. */
static void test_fresh_deployment(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    /* not seeded: no node counts (an acquire would leave a mark behind,
     * which a fresh deployment's seeding refuses) */
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    for (unsigned i = 0; i < 3; i++)
        assert_false(dlock_redlock_counts(a->rl, i));
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    dlock_redlock_grant g;
    uint64_t last = 0;
    /* the drift allowance, as docs/design.md says it: 1% of the lease + 2 ms */
    int64_t drift = LEASE_MS * DLOCK_NS_PER_MS / 100 + 2 * DLOCK_NS_PER_MS;
    for (int k = 0; k < 5; k++) {
        int64_t before = dlock_boot_ns();
        int rc = acquire(a, "n", &g, NULL);
        if (rc != DLOCK_OK)
            fail_msg("acquire %d: %d %s", k, rc, dlock_last_error());
        int64_t after = dlock_boot_ns();
        assert_true(g.token > last);
        assert_int_equal(g.votes, 3);
        assert_true(g.first_boot >= before && g.first_boot <= after);
        assert_true(g.valid_boot == g.first_boot + LEASE_MS * DLOCK_NS_PER_MS - drift);
        assert_true(g.valid_boot > after);
        for (int i = 0; i < 3; i++)
            assert_true(mark_on(i, a, "n") >= g.token);
        last = g.token;
        release(a, "n", &g);
    }
    assert_int_equal(dlock_redlock_drift_ns(a->rl), drift);
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "already holds keys"));
    client_free(a);
}

/* A second client is refused while the first holds (the holder's name and
 * a pttl told), and granted a higher token once it released. */
static void test_second_client_refused(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    client *b = client_new(3, px, 2, 300);
    seed_all(a);
    assert_int_equal(dlock_redlock_refresh(b->rl, ms_from_now(2000)), DLOCK_OK);
    dlock_redlock_grant ga, gb;
    dlock_redlock_busy busy;
    assert_int_equal(acquire(a, "n", &ga, NULL), DLOCK_OK);
    assert_int_equal(acquire(b, "n", &gb, &busy), DLOCK_EBUSY);
    assert_int_equal(busy.refused, 3);
    assert_string_equal(busy.holder, "client1");
    if (!(busy.pttl_ms > 0 && busy.pttl_ms <= LEASE_MS + 1))
        fail_msg("pttl %" PRId64, busy.pttl_ms);
    release(a, "n", &ga);
    assert_int_equal(acquire(b, "n", &gb, NULL), DLOCK_OK);
    assert_true(gb.token > ga.token);
    release(b, "n", &gb);
    client_free(a);
    client_free(b);
}

/* One of 3 nodes stopped: still granted, tokens still increasing; two of
 * 3 stopped: DLOCK_EREDIS within the command timeout (+ margin). */
static void test_nodes_down(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    uint64_t t1 = grant_token(a, "n");
    kill_srv(2);
    uint64_t t2 = grant_token(a, "n");
    assert_true(t2 > t1);
    dlock_redlock_grant g;
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_OK);
    assert_int_equal(g.votes, 2);
    assert_true(g.token > t2);
    release(a, "n", &g);
    kill_srv(1);
    int64_t t0 = dlock_now_ns();
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_EREDIS);
    assert_true(dlock_now_ns() - t0 < (300 + 200) * DLOCK_NS_PER_MS);
    assert_non_null(strstr(dlock_last_error(), "1 of 3 nodes count and answered, 2 needed"));
    assert_non_null(strstr(dlock_last_error(), "unreachable"));
    client_free(a);
}

/* The case the rule exists for. A token T1 handed out while node 2 was
 * paused is marked on nodes 0 and 1 only (of two names in two slots, T1
 * and T2); node 0 restarts empty and node 1 pauses: node 0 and node 2
 * alone would make a majority whose marks are all below T1. Node 0 does
 * not count until seeded; it cannot be seeded while only node 2 counts
 * beside it; once node 1 is back it is seeded, every slot's mark to the
 * highest of the others'; then node 0 and node 2 alone grant tokens above
 * T1 and T2. */
static void test_restart_seeded(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 200);
    seed_all(a);
    /* two names in two slots */
    keys k1, k2;
    keys_of(a, "n1", &k1);
    keys_of(a, "n2", &k2);
    assert_string_not_equal(k1.k[DLOCK_KEY_HW], k2.k[DLOCK_KEY_HW]);
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    uint64_t x = ahead_us(0);
    raise_mark(0, a, "n1", x);
    raise_mark(1, a, "n1", x);
    raise_mark(0, a, "n2", x + 1000);
    raise_mark(1, a, "n2", x + 1000);
    uint64_t t1 = grant_token(a, "n1");
    uint64_t t2 = grant_token(a, "n2");
    assert_true(t1 > x && t2 > x + 1000);
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    assert_true(mark_on(2, a, "n1") < x && mark_on(2, a, "n2") < x);

    kill_srv(0);
    restart_srv(0);
    /* node 0's new run id seen now (a first reading may find the
     * restarted node's pooled connection closed: again until every node
     * answered) */
    int64_t until = dlock_now_ns() / DLOCK_NS_PER_MS + 2000;
    while (dlock_redlock_refresh(a->rl, ms_from_now(2000)) != DLOCK_OK)
        if (dlock_now_ns() / DLOCK_NS_PER_MS > until)
            fail_msg("the nodes' run ids not read within 2 s: %s", dlock_last_error());
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    dlock_redlock_grant g;
    assert_int_equal(acquire(a, "n1", &g, NULL), DLOCK_EREDIS);
    /* up a lease and more: still not counted, and not seeded with only
     * node 2 counting beside it */
    fx_sleep_ms(LEASE_MS + 50);
    int rc = acquire(a, "n1", &g, NULL);
    if (rc == DLOCK_OK)
        fail_msg("granted token %" PRIu64 " (T1 %" PRIu64 ") by the unseeded node and node 2",
                 g.token, t1);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "not seeded"));
    assert_true(dlock_redlock_seed_due(a->rl, ms_from_now(2000)) < 0);
    assert_non_null(strstr(dlock_last_error(), "needs 2 other nodes that count; 1 do"));
    assert_false(dlock_redlock_counts(a->rl, 0));

    assert_int_equal(fx_redis_signal(&srv[1], SIGCONT), 0);
    assert_int_equal(dlock_redlock_seed_due(a->rl, ms_from_now(3000)), 1);
    assert_true(dlock_redlock_counts(a->rl, 0));
    assert_true(mark_on(0, a, "n1") >= t1);
    assert_true(mark_on(0, a, "n2") >= t2);
    /* node 0 and node 2 alone: above T1 and T2 */
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    uint64_t u1 = grant_token(a, "n1");
    uint64_t u2 = grant_token(a, "n2");
    assert_int_equal(fx_redis_signal(&srv[1], SIGCONT), 0);
    if (u1 <= t1 || u2 <= t2)
        fail_msg("after the restart: %" PRIu64 " after %" PRIu64 ", %" PRIu64 " after %" PRIu64,
                 u1, t1, u2, t2);
    assert_true(grant_token(a, "n1") > u1);
    client_free(a);
}

/* Calls of command `cmd` on server i since its last CONFIG RESETSTAT
 * (INFO commandstats; 0 if none). */
static long long calls_of(int i, const char *cmd)
{
    redisReply *r = fx_cmd_at(srv[i].port, "INFO commandstats");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    char field[64];
    snprintf(field, sizeof field, "cmdstat_%s:calls=", cmd);
    const char *s = strstr(r->str, field);
    long long n = s ? strtoll(s + strlen(field), NULL, 10) : 0;
    freeReplyObject(r);
    return n;
}

/* An acquire judges whether a node counts by the run id its connection's
 * setup read when it opened (a connection reaches one server for its
 * life): 20 grants send no INFO to a node once its connections are open
 * (at most one per connection the pool opens anew: 2). */
static void test_run_id_read_once_per_connection(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    grant_token(a, "n");
    cmd_at(0, "CONFIG RESETSTAT", NULL, NULL);
    for (int k = 0; k < 20; k++)
        grant_token(a, "n");
    long long info = calls_of(0, "info"), evals = calls_of(0, "evalsha");
    if (info > 2)
        fail_msg("%lld INFO calls on node 0 for 20 grants", info);
    assert_true(evals >= 40); /* (each grant's acquire and release reached it) */
    client_free(a);
}

/* A node restarted with its data (its seed key back from its dump, naming
 * the run before) does not count on the connections opened to its new
 * run, though this client's pooled connections knew the old one: with
 * node 1 down, node 0 and node 2 do not make a majority. */
static void test_restart_with_data_not_counted(void **state)
{
    (void)state;
    char px[32], before[64], after[64];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    grant_token(a, "n");
    run_id_of(0, before, sizeof before);
    cmd_at(0, "SAVE", NULL, NULL);
    kill_srv(0);
    restart_srv(0);
    run_id_of(0, after, sizeof after);
    assert_string_not_equal(before, after);
    redisReply *r = fx_cmd_at(srv[0].port, "GET %sredlock:seed", px);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    assert_string_equal(r->str, before); /* (the old run's seeding, from the dump) */
    freeReplyObject(r);
    kill_srv(1);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc == DLOCK_OK)
        fail_msg("granted token %" PRIu64 " with node 0's old seeding counted", g.token);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "1 of 3 nodes count and answered"));
    assert_false(dlock_redlock_counts(a->rl, 0));
    client_free(a);
    /* (node 0 restarts empty again for the next tests: its dump goes) */
    char dump[300];
    snprintf(dump, sizeof dump, "%s/dump.rdb", srv[0].dir);
    assert_int_equal(unlink(dump), 0);
}

/* A node's record of its run id set from a run none of its pooled
 * connections reach (a setup's report that came late, from a server
 * since replaced; here, a connection with node 0's settings that reached
 * server 2) is set right by the next exchange on those connections, whose
 * run id the record no longer matches: node 0 counts again, and with
 * node 1 down, node 0 and node 2 grant. */
static void test_stale_record_set_right(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    grant_token(a, "n");
    dlock_conn_cfg cfg = *dlock_redlock_node_cfg(a->rl, 0);
    cfg.port = srv[2].port;
    redisContext *other;
    assert_int_equal(dlock_conn_open(&cfg, &a->ctr, &other), DLOCK_OK);
    redisFree(other);
    kill_srv(1);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("node 0 and node 2, node 1 down: %d %s", rc, dlock_last_error());
    release(a, "n", &g);
    assert_true(dlock_redlock_counts(a->rl, 0));
    client_free(a);
}

/* A grant of name to c on server i alone, for 5 s (as a quorum acquire
 * that failed leaves one until its release): that node refuses others. */
static void lone_grant(int i, const client *c, const char *name)
{
    keys k;
    keys_of(c, name, &k);
    redisReply *r = fx_cmd_at(srv[i].port, "EVAL %s 7 %s %s %s %s %s %s %s %s %s 1 %s %s %s %s %s 0 0",
                              dlock_script_body(dlock_script_in(DLOCK_SCRIPT_ACQUIRE, 2)),
                              k.k[0], k.k[1], k.k[2], k.k[3], k.k[4], k.k[5], k.k[6], c->id,
                              "5000", "0", "1000", "0", "4000", c->name);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    assert_int_equal(r->element[0]->integer, 1);
    freeReplyObject(r);
}

/* A node whose mark is above every vote (it refused: another client's
 * lone grant there) makes the write-back raise the token above that mark
 * before it is handed out. (Node 2's mark, below node 1's, makes the two
 * votes differ, so that the token is written back.) */
static void test_write_back_meets_higher_mark(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    client *b = client_new(3, px, 2, 300);
    seed_all(a);
    lone_grant(1, b, "n");
    uint64_t x = ahead_us(1);
    raise_mark(1, a, "n", x);
    raise_mark(2, a, "n", x - 1000); /* (node 2 votes x - 999, node 0 its clock: they differ) */
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 2);
    if (g.token <= x)
        fail_msg("token %" PRIu64 " handed out below the mark %" PRIu64 " the write-back met",
                 g.token, x);
    release(a, "n", &g);
    client_free(a);
    client_free(b);
}

/* Votes of one token from every node need no write-back: with every
 * node's mark at x (ahead of the clocks), each votes x + 1 (above the
 * floor: a fresh client's is 0), and the grant hands x + 1 out with one
 * script per node, its vote, which wrote x + 1 as the mark. */
static void test_equal_votes_no_write_back(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    uint64_t x = ahead_us(0);
    for (int i = 0; i < 3; i++) {
        raise_mark(i, a, "n", x);
        cmd_at(i, "CONFIG RESETSTAT", NULL, NULL);
    }
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 3);
    if (g.token != x + 1)
        fail_msg("token %" PRIu64 ", not the votes' x + 1 = %" PRIu64, g.token, x + 1);
    for (int i = 0; i < 3; i++) {
        long long evals = calls_of(i, "evalsha");
        if (evals != 1)
            fail_msg("node %d ran %lld scripts for one grant (its vote only: 1)", i, evals);
        assert_true(mark_on(i, a, "n") >= g.token);
    }
    release(a, "n", &g);
    client_free(a);
}

/* Votes that differ are written back: with node 1's mark 1000 above the
 * others', the highest vote comes from node 1 alone, and the token is
 * handed out only once a majority's marks hold it. */
static void test_unequal_votes_written_back(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    uint64_t x = ahead_us(0);
    for (int i = 0; i < 3; i++)
        raise_mark(i, a, "n", i == 1 ? x + 1000 : x);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 3);
    assert_true(g.token > x + 1001);
    for (int i = 0; i < 3; i++) {
        uint64_t m = mark_on(i, a, "n");
        if (m < g.token)
            fail_msg("node %d's mark %" PRIu64 " below the token %" PRIu64 " handed out", i, m,
                     g.token);
    }
    release(a, "n", &g);
    client_free(a);
}

/* Votes of one token from a majority, not every node, are written back:
 * node 1 refuses (another client's lone grant there), nodes 0 and 2 vote
 * x + 1; the write-back raises every node's mark to the token, node 1's
 * too, which a grant by the votes alone would have left below it. (An
 * acquire whose write-back such votes overlapped may hold a higher token,
 * confirmed by nodes that refused it: docs/design.md "Redlock".) */
static void test_majority_votes_written_back(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    client *b = client_new(3, px, 2, 600);
    seed_all(a);
    lone_grant(1, b, "n");
    uint64_t x = ahead_us(0);
    raise_mark(0, a, "n", x);
    raise_mark(2, a, "n", x);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 2);
    if (g.token <= x + 1)
        fail_msg("token %" PRIu64 " is the votes' x + 1: not written back", g.token);
    for (int i = 0; i < 3; i++) {
        uint64_t m = mark_on(i, a, "n");
        if (m < g.token)
            fail_msg("node %d's mark %" PRIu64 " below the token %" PRIu64 " handed out", i, m,
                     g.token);
    }
    release(a, "n", &g);
    client_free(a);
    client_free(b);
}

/* Once a client has read the nodes' clocks (its first grant's replies),
 * its floor is above them, so that its grants' votes are one token and
 * need no write-back: of 20 grants at least 10 ran 2 scripts per node
 * (the vote, the release) and no more (each write-back is a third; the
 * bound leaves a loaded machine 10 grants whose scripts ran more than the
 * floor's margin after their send). Tokens increase. */
static void test_floor_spares_write_back(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 600);
    seed_all(a);
    uint64_t last = grant_token(a, "n");
    for (int i = 0; i < 3; i++)
        cmd_at(i, "CONFIG RESETSTAT", NULL, NULL);
    for (int k = 0; k < 20; k++) {
        uint64_t t = grant_token(a, "n");
        if (t <= last)
            fail_msg("token %" PRIu64 " after %" PRIu64, t, last);
        last = t;
    }
    for (int i = 0; i < 3; i++) {
        long long evals = calls_of(i, "evalsha");
        if (evals > 50)
            fail_msg("node %d ran %lld scripts for 20 grants (40 without write-backs)", i, evals);
    }
    client_free(a);
}

/* A node paused (SIGSTOP) past the validity: with a command timeout above
 * the lease the votes' wait ends at the validity, and the acquire fails
 * (released on every node: another client is granted at once); with one
 * below it, the others grant before the validity ends. */
static void test_paused_past_validity(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 1000);
    client *b = client_new(3, px, 2, 1000);
    client *c = client_new(3, px, 3, 150);
    seed_all(a);
    assert_int_equal(dlock_redlock_refresh(b->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(dlock_redlock_refresh(c->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    dlock_redlock_grant g;
    int64_t t0 = dlock_boot_ns();
    int rc = acquire(a, "n", &g, NULL);
    int64_t t1 = dlock_boot_ns();
    if (rc == DLOCK_OK)
        assert_true(t1 < g.valid_boot);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "validity"));
    /* the votes' wait ends at the validity; the release to the paused node
     * (over a fresh connection) takes one command timeout more at most */
    if (!(t1 - t0 < (LEASE_MS + 1000 + 200) * DLOCK_NS_PER_MS))
        fail_msg("the failed acquire took %" PRId64 " ms", (t1 - t0) / DLOCK_NS_PER_MS);
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    /* a's grants on nodes 0 and 1 were released */
    assert_int_equal(acquire(b, "n", &g, NULL), DLOCK_OK);
    release(b, "n", &g);
    /* a command timeout below the lease: granted by the others in time */
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    t0 = dlock_boot_ns();
    rc = acquire(c, "n", &g, NULL);
    t1 = dlock_boot_ns();
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 2);
    assert_true(t1 < g.valid_boot);
    assert_true(t1 - t0 >= 150 * DLOCK_NS_PER_MS); /* it waited for node 2 */
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    release(c, "n", &g);
    client_free(a);
    client_free(b);
    client_free(c);
}

/* A client that starts fresh counts the seeded nodes at once, but seeds a
 * node only a lease + the drift allowance after its own first sight of
 * it, whatever the node's uptime. Client 1 holds a name on nodes 0 and 1
 * (its grant on node 2 gone, as if its request never reached it); node 0
 * restarts empty. A fresh client that took node 0 for seen long ago would
 * seed it from nodes 1 and 2 at once, and nodes 0 and 2 would grant it
 * the name while client 1 holds it. (Leases of 2 s: all of this fits in
 * one.) */
static void test_fresh_client_seeds_late(void **state)
{
    (void)state;
    lease_ms = 2000;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    dlock_redlock_grant ga, gc;
    assert_int_equal(acquire(a, "n", &ga, NULL), DLOCK_OK);
    keys k;
    keys_of(a, "n", &k);
    char att[24];
    snprintf(att, sizeof att, "%" PRIu64, ga.attempt);
    redisReply *r = fx_cmd_at(srv[2].port, "EVAL %s 7 %s %s %s %s %s %s %s %s nonce %s 2000 0 %s n 1000 4000 0",
                              dlock_script_body(dlock_script_in(DLOCK_SCRIPT_RELEASE, 2)),
                              k.k[0], k.k[1], k.k[2], k.k[3], k.k[4], k.k[5], k.k[6], a->id, att,
                              a->wake);
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    kill_srv(0);
    restart_srv(0);
    client *c = client_new(3, px, 3, 300);
    dlock_redlock_refresh(c->rl, ms_from_now(2000));
    int seeded = dlock_redlock_seed_due(c->rl, ms_from_now(2000));
    int rc = acquire(c, "n", &gc, NULL);
    int64_t now = dlock_boot_ns();
    if (now >= ga.valid_boot)
        fail_msg("too slow: client 1's validity ran out before the check");
    if (rc == DLOCK_OK)
        fail_msg("a fresh client got the name held by client 1 (votes %u, seeded %d)", gc.votes,
                 seeded);
    assert_int_equal(seeded, 0);
    assert_false(dlock_redlock_counts(c->rl, 0));
    assert_true(dlock_redlock_counts(c->rl, 1));
    assert_true(dlock_redlock_counts(c->rl, 2));
    /* node 2's vote alone: refused */
    assert_int_equal(rc, DLOCK_EBUSY);
    client_free(a);
    client_free(c);
}

/* 5 nodes: granted with two down; the two restarted empty do not count
 * and are not seeded before a lease + the drift allowance, then are
 * seeded from the three others, and with one of those make a majority
 * whose token is above every earlier one; three down: DLOCK_EREDIS. */
static void test_five_nodes(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(5, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    uint64_t t = grant_token(a, "n");
    uint64_t x = ahead_us(0);
    for (int i = 0; i < 3; i++)
        raise_mark(i, a, "n", x);
    uint64_t u = grant_token(a, "n");
    assert_true(u > x && u > t);
    kill_srv(3);
    kill_srv(4);
    dlock_redlock_grant g;
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_OK);
    assert_int_equal(g.votes, 3);
    assert_true(g.token > u);
    u = g.token;
    release(a, "n", &g);
    restart_srv(3);
    restart_srv(4);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_false(dlock_redlock_counts(a->rl, 3));
    assert_false(dlock_redlock_counts(a->rl, 4));
    /* not seeded before a lease + the drift allowance */
    assert_int_equal(dlock_redlock_seed(a->rl, 3, ms_from_now(2000)), DLOCK_EBUSY);
    assert_int_equal(dlock_redlock_seed_due(a->rl, ms_from_now(2000)), 0);
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_OK);
    assert_int_equal(g.votes, 3);
    assert_true(g.token > u);
    u = g.token;
    release(a, "n", &g);
    fx_sleep_ms(LEASE_MS + 50);
    assert_int_equal(dlock_redlock_seed_due(a->rl, ms_from_now(3000)), 2);
    for (int i = 0; i < 5; i++) {
        assert_true(dlock_redlock_counts(a->rl, (unsigned)i));
        assert_true(mark_on(i, a, "n") >= u);
    }
    /* nodes 2, 3, 4 (two of them restarted) make a majority alone */
    kill_srv(0);
    kill_srv(1);
    uint64_t v = grant_token(a, "n");
    if (v <= u)
        fail_msg("token %" PRIu64 " after %" PRIu64, v, u);
    kill_srv(2);
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "2 of 5 nodes count and answered, 3 needed"));
    client_free(a);
}

/* A slot's mark held by one source only (the other never had the key),
 * and 3000 marks (several SCAN pages, several batches): the seeding copies
 * every one, and writes node 0's run id only after the last mark (its
 * MONITOR shows no mark raised after the run id). */
static void test_seed_union_and_pages(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    uint64_t x = ahead_us(0);
    raise_mark(2, a, "n1", x); /* node 1 never had this slot's mark */
    char lua[512];
    snprintf(lua, sizeof lua, "for i = 1, 3000 do redis.call('SET', '%shw:{p' .. i .. '}', "
             "'%" PRIu64 " 0 0') end return 1", px, x);
    for (int i = 1; i < 3; i++)
        cmd_at(i, "EVAL %s 0", lua, NULL);
    kill_srv(0);
    restart_srv(0);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    fx_sleep_ms(LEASE_MS + 50);
    redisContext *mon = fx_connect("127.0.0.1", srv[0].port);
    assert_non_null(mon);
    redisReply *mr = redisCommand(mon, "MONITOR");
    assert_non_null(mr);
    freeReplyObject(mr);
    int rc = dlock_redlock_seed_due(a->rl, ms_from_now(5000));
    if (rc != 1)
        fail_msg("seed_due %d: %s", rc, dlock_last_error());
    /* the order node 0 ran them in: mark.lua's last argument is "" for a
     * mark, the run id (40 hex digits) for the seed key */
    struct timeval tv = {0, 300000};
    redisSetTimeout(mon, tv);
    long line = 0, run_at = -1, last_mark = -1;
    void *vr;
    while (redisGetReply(mon, &vr) == REDIS_OK) {
        redisReply *l = vr;
        line++;
        const char *str = l->str ? l->str : "";
        size_t len = strlen(str);
        if (strstr(str, "redlock:seed") && len > 4 && strcmp(str + len - 4, "\" \"\"") == 0 &&
            !strstr(str, "\"0\" \"\""))
            last_mark = line;
        else if (strstr(str, "redlock:seed") && len > 44 && str[len - 42] == '"' &&
                 strspn(str + len - 41, "0123456789abcdef") == 40)
            run_at = line;
        freeReplyObject(l);
    }
    redisFree(mon);
    if (!(run_at > 0 && last_mark > 0 && run_at > last_mark))
        fail_msg("run id written at line %ld, last mark raised at line %ld", run_at, last_mark);
    if (mark_on(0, a, "n1") < x)
        fail_msg("node 0 not seeded with the mark only node 2 held");
    snprintf(lua, sizeof lua, "local n = 0 for i = 1, 3000 do local v = redis.call('GET', "
             "'%shw:{p' .. i .. '}') if v and tonumber(string.match(v, '^(%%d+)')) >= %" PRIu64
             " then n = n + 1 end end return n", px, x);
    redisReply *r = fx_cmd_at(srv[0].port, "EVAL %s 0", lua);
    assert_non_null(r);
    long long got = r->integer;
    freeReplyObject(r);
    if (got != 3000)
        fail_msg("node 0 seeded with %lld of 3000 marks", got);
    client_free(a);
}

/* Keys of the mark's pattern that are not marks (another client's hash
 * under the prefix "<prefix>hw:", a string "<prefix>hw:{a}b}") do not
 * block the seeding, and are not copied; a mark on node 1 whose key is
 * such a hash on node 2 reads there as no mark, and is copied. */
static void test_seed_skips_other_keys(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    uint64_t t = grant_token(a, "n");
    char k1[64], k2[64];
    snprintf(k1, sizeof k1, "%shw:{zz}", px);
    snprintf(k2, sizeof k2, "%shw:{a}b}", px);
    for (int i = 1; i < 3; i++) {
        cmd_at(i, "HSET %s f v", k1, NULL);
        cmd_at(i, "SET %s 5", k2, NULL);
    }
    char k3[64];
    snprintf(k3, sizeof k3, "%shw:{yy}", px);
    cmd_at(1, "SET %s %s", k3, "7 0 0");
    cmd_at(2, "HSET %s f v", k3, NULL);
    kill_srv(0);
    restart_srv(0);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    fx_sleep_ms(LEASE_MS + 50);
    int rc = dlock_redlock_seed_due(a->rl, ms_from_now(3000));
    if (rc != 1)
        fail_msg("seed_due %d: %s", rc, dlock_last_error());
    assert_true(mark_on(0, a, "n") >= t);
    redisReply *r = fx_cmd_at(srv[0].port, "EXISTS %s %s", k1, k2);
    assert_non_null(r);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    r = fx_cmd_at(srv[0].port, "GET %s", k3);
    assert_non_null(r);
    if (r->type != REDIS_REPLY_STRING || strncmp(r->str, "7 ", 2) != 0)
        fail_msg("node 0's %s: %s", k3, r->type == REDIS_REPLY_STRING ? r->str : "none");
    freeReplyObject(r);
    client_free(a);
}

/* A fresh seeding that failed part way (node 0 holds its seed key, the
 * others nothing) runs again; a seed key of another run, or beside other
 * keys, is refused; so is a node with keys under a prefix longer than
 * any fixed buffer. */
static void test_seed_fresh_rerun(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_by_hand(0, a);
    int rc = dlock_redlock_seed_fresh(a->rl, ms_from_now(2000));
    if (rc != DLOCK_OK)
        fail_msg("a fresh seeding run again: %d %s", rc, dlock_last_error());
    client_free(a);

    a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    char seed[64];
    snprintf(seed, sizeof seed, "%sredlock:seed", px);
    cmd_at(1, "SET %s %s", seed, "0123456789abcdef0123456789abcdef01234567");
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "already holds keys"));
    seed_by_hand(1, a);
    cmd_at(1, "SET %s%s 1", px, "x");
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "already holds keys"));
    client_free(a);

    /* a prefix of 700 characters */
    char *lp = malloc(720);
    assert_non_null(lp);
    memset(lp, 'q', 700);
    snprintf(lp + 700, 20, "%d:", ++prefix_no);
    dlock_conn_cfg cfg = {.protocol = 2, .connect_timeout_ms = 300, .command_timeout_ms = 300};
    dlock_counters ctr = {0};
    dlock_redlock *rl = NULL;
    char addrs[80];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", srv[0].port,
             srv[1].port, srv[2].port);
    assert_int_equal(dlock_redlock_create(&cfg, addrs, lp, LEASE_MS, 1, &ctr, &rl), DLOCK_OK);
    cmd_at(1, "SET %szz 1", lp, NULL);
    rc = dlock_redlock_seed_fresh(rl, ms_from_now(2000));
    if (rc != DLOCK_EINVAL)
        fail_msg("a node with a key of a long prefix seeded fresh: %d %s", rc,
                 dlock_last_error());
    dlock_redlock_destroy(rl);
    free(lp);
}

/* An address listed twice is refused; one server under two names counts
 * once (with node 2 down, the two names alone are no majority). */
static void test_same_server_twice(void **state)
{
    (void)state;
    dlock_conn_cfg cfg = {.protocol = 2, .connect_timeout_ms = 300, .command_timeout_ms = 300};
    dlock_counters ctr = {0};
    dlock_redlock *rl = NULL;
    char addrs[120];
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", srv[0].port,
             srv[1].port, srv[0].port);
    assert_int_equal(dlock_redlock_create(&cfg, addrs, "x:", LEASE_MS, 1, &ctr, &rl),
                     DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "listed twice"));
    assert_null(rl);

    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    dlock_redlock_destroy(a->rl);
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,localhost:%d,127.0.0.1:%d", srv[0].port,
             srv[0].port, srv[1].port);
    assert_int_equal(dlock_redlock_create(&a->cfg, addrs, px, LEASE_MS, 2, &a->ctr, &a->rl),
                     DLOCK_OK);
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    dlock_redlock_grant g;
    int rc0 = acquire(a, "n", &g, NULL);
    if (rc0 != DLOCK_OK)
        fail_msg("acquire: %d %s", rc0, dlock_last_error());
    assert_int_equal(g.votes, 2);
    release(a, "n", &g);
    kill_srv(1);
    int rc = acquire(a, "n", &g, NULL);
    if (rc == DLOCK_OK)
        fail_msg("granted by one server under two names (votes %u)", g.votes);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "reports the run id of"));
    client_free(a);
}

/* One server under two names counts once in a renewal too: with the
 * other server's grant gone, the two names alone confirm no renewal. */
static void test_same_server_twice_renewal(void **state)
{
    (void)state;
    char px[32], addrs[120];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    dlock_redlock_destroy(a->rl);
    snprintf(addrs, sizeof addrs, "127.0.0.1:%d,localhost:%d,127.0.0.1:%d", srv[0].port,
             srv[0].port, srv[1].port);
    assert_int_equal(dlock_redlock_create(&a->cfg, addrs, px, LEASE_MS, 2, &a->ctr, &a->rl),
                     DLOCK_OK);
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 2);
    keys k;
    keys_of(a, "n", &k);
    cmd_at(1, "DEL %s", k.k[DLOCK_KEY_LEASE], NULL); /* (its grant gone: expired there, say) */
    dlock_redlock_req q = {.name = "n", .keys = k.p, .args = &a->args, .client_name = a->name,
                           .attempt = g.attempt, .deadline = ms_from_now(2000)};
    int64_t valid;
    rc = dlock_redlock_renew(a->rl, &q, &g, &valid);
    int one = rc == DLOCK_OK;
    dlock_redlock_lease l = {.name = "n", .key = k.k[DLOCK_KEY_LEASE],
                             .keys = (const char *const *)k.p, .g = &g};
    (void)dlock_redlock_renew_many(a->rl, &a->args, a->name, &l, 1, ms_from_now(2000));
    if (one || l.verdict == 1)
        fail_msg("a renewal confirmed by one server under two names (dlock_redlock_renew %d, "
                 "renew_many's verdict %d)", rc, l.verdict);
    client_free(a);
}

/* The seed key is read before the script, on the acquire's first send and
 * on its send again after a NOSCRIPT (node 0's scripts flushed): in node
 * 0's MONITOR every script of the acquire follows a GET of the seed key on
 * its connection. (That a seeding between the script and a GET after it
 * is not counted cannot be timed on one machine: this checks the order
 * that excludes it, redlock.c append_one.) */
static void test_seed_read_before_script(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    cmd_at(0, "SCRIPT FLUSH", NULL, NULL);
    redisContext *mon = fx_connect("127.0.0.1", srv[0].port);
    assert_non_null(mon);
    redisReply *mr = redisCommand(mon, "MONITOR");
    assert_non_null(mr);
    freeReplyObject(mr);
    dlock_redlock_grant g;
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_OK);
    release(a, "n", &g);
    struct timeval tv = {0, 300000};
    redisSetTimeout(mon, tv);
    char last[16][64];
    char conn[16][64];
    int nconn = 0, scripts = 0, evals = 0;
    char want[64];
    snprintf(want, sizeof want, "\"GET\" \"%sredlock:seed\"", px);
    char lease_key[64];
    snprintf(lease_key, sizeof lease_key, "\"%s{n}", px);
    void *vr;
    while (redisGetReply(mon, &vr) == REDIS_OK) {
        redisReply *l = vr;
        const char *str = l->str ? l->str : "";
        const char *b = strchr(str, '['), *e = b ? strchr(b, ']') : NULL;
        if (b && e && e - b < 60) {
            char who[64];
            snprintf(who, sizeof who, "%.*s", (int)(e - b), b);
            int k = 0;
            while (k < nconn && strcmp(conn[k], who) != 0)
                k++;
            if (k == nconn && nconn < 16)
                snprintf(conn[nconn++], sizeof conn[0], "%s", who);
            if (k < 16) {
                int is_acq = (strstr(e, "\"EVALSHA\"") || strstr(e, "\"EVAL\"")) &&
                             strstr(e, lease_key) && !strstr(e, "\"nonce\"") &&
                             !strstr(e, "\"token\"");
                if (is_acq) {
                    scripts++;
                    evals += strstr(e, "\"EVAL\"") != NULL;
                    if (strcmp(last[k], "get") != 0)
                        fail_msg("an acquire's script not right after a GET of the seed key: "
                                 "%.200s", str);
                }
                snprintf(last[k], sizeof last[0], "%s", strstr(e, want) ? "get" : "other");
            }
        }
        freeReplyObject(l);
    }
    redisFree(mon);
    if (scripts != 2 || evals != 1)
        fail_msg("node 0 ran %d acquire scripts, %d by EVAL (2, 1: NOSCRIPT, sent again)", scripts,
                 evals);
    client_free(a);
}

/* What a later seeding does to this acquire's votes: a thread seeds node i
 * by hand (as another client would), then kills node `kill` if >= 0, both
 * 100 ms into the acquire, while its votes wait for a paused node. */
typedef struct later {
    const client *c;
    int seed, kill;
} later;

static void *seed_later(void *arg)
{
    const later *l = arg;
    fx_sleep_ms(100);
    seed_by_hand(l->seed, l->c);
    if (l->kill >= 0)
        fx_redis_signal(&srv[l->kill], SIGKILL);
    return NULL;
}

/* A node's vote counts by its seed key as read before the script, in the
 * votes' own request, not by a later reading. Node 2 restarted, not
 * seeded when the acquire sends its votes; seeded (by hand, as another
 * client would) 100 ms later, while the replies wait for node 0 (paused,
 * 300 ms): node 2's vote does not count, and node 1 alone is no
 * majority. */
static void test_counts_at_send(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    kill_srv(2);
    restart_srv(2);
    load_scripts(2);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_false(dlock_redlock_counts(a->rl, 2));
    assert_int_equal(fx_redis_signal(&srv[0], SIGSTOP), 0);
    later l = {.c = a, .seed = 2, .kill = -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, seed_later, &l), 0);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    pthread_join(th, NULL);
    assert_int_equal(fx_redis_signal(&srv[0], SIGCONT), 0);
    if (rc == DLOCK_OK)
        fail_msg("granted with node 2's vote, sent before it was seeded");
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "1 of 3 nodes count and answered"));
    /* seeded now: it counts at once */
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_true(dlock_redlock_counts(a->rl, 2));
    client_free(a);
}

/* Write-back acks count only from nodes that counted for the votes. Of
 * 5 nodes, node 3 restarted and not seeded at the votes' send (it does
 * not count), node 4 paused (the votes wait 300 ms for it); 100 ms in,
 * node 3 is seeded by hand and node 2, which voted, killed: nodes 0, 1, 2
 * vote; only 0 and 1 of them ack, and node 3's ack, whose reply finds it
 * seeded, does not make a third. */
static void test_write_back_acks_count(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(5, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    kill_srv(3);
    restart_srv(3);
    load_scripts(3);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_false(dlock_redlock_counts(a->rl, 3));
    assert_int_equal(fx_redis_signal(&srv[4], SIGSTOP), 0);
    later l = {.c = a, .seed = 3, .kill = 2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, seed_later, &l), 0);
    dlock_redlock_grant g;
    int rc = acquire(a, "n", &g, NULL);
    pthread_join(th, NULL);
    assert_int_equal(fx_redis_signal(&srv[4], SIGCONT), 0);
    if (rc == DLOCK_OK)
        fail_msg("confirmed by node 3's ack (votes %u)", g.votes);
    assert_int_equal(rc, DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "write-back reached 2 counting nodes"));
    client_free(a);
}

static void *pause_writes_later(void *arg)
{
    (void)arg;
    fx_sleep_ms(100);
    for (int i = 1; i < 4; i++) {
        redisReply *r = fx_cmd_at(srv[i].port, "CLIENT PAUSE 600 WRITE");
        if (r)
            freeReplyObject(r);
    }
    return NULL;
}

/* A failed acquire releases every node it sent its request to, also those
 * whose reply was lost. Of 5 nodes, node 4 is paused (the votes wait
 * 300 ms for it); nodes 0 to 3 vote, then, before the write-back, nodes
 * 1 to 3 hold writes for 600 ms: their write-back replies time out, the
 * acquire fails, and its release reaches them over fresh connections once
 * the hold ends. Another client is granted at once, not a lease later.
 * (Leases of 2 s.) */
static void test_failed_acquire_releases_all(void **state)
{
    (void)state;
    lease_ms = 2000;
    char px[32];
    client *a = client_new(5, new_prefix(px, sizeof px), 1, 300);
    client *b = client_new(5, px, 2, 300);
    assert_int_equal(dlock_redlock_seed_fresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(dlock_redlock_refresh(b->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(dlock_redlock_refresh(a->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(dlock_redlock_refresh(b->rl, ms_from_now(2000)), DLOCK_OK);
    assert_int_equal(fx_redis_signal(&srv[4], SIGSTOP), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pause_writes_later, NULL), 0);
    dlock_redlock_grant g;
    int64_t t0 = dlock_boot_ns();
    int rc = acquire(a, "n", &g, NULL);
    int64_t t1 = dlock_boot_ns();
    pthread_join(th, NULL);
    if (rc != DLOCK_EREDIS || !strstr(dlock_last_error(), "write-back reached 1 counting"))
        fail_msg("acquire: %d %s", rc, dlock_last_error());
    /* its votes' wait, its write-back's, and one command timeout more */
    if (t1 - t0 > (3 * 300 + 200) * DLOCK_NS_PER_MS)
        fail_msg("the failed acquire took %" PRId64 " ms", (t1 - t0) / DLOCK_NS_PER_MS);
    rc = acquire(b, "n", &g, NULL);
    int64_t t2 = dlock_boot_ns();
    assert_int_equal(fx_redis_signal(&srv[4], SIGCONT), 0);
    if (t2 - t0 >= (int64_t)lease_ms * DLOCK_NS_PER_MS)
        fail_msg("too slow: a's grants would have ended by themselves");
    if (rc != DLOCK_OK)
        fail_msg("a's grants linger after its failed acquire: %d %s", rc, dlock_last_error());
    assert_int_equal(g.votes, 4);
    client_free(a);
    client_free(b);
}

/* A restart closes every idle pooled connection to the node: the first
 * call after it uses another connection, so the refresh reaches all three,
 * and the acquire's request reaches node 0 (its grant known by token). */
static void test_restart_pooled_retry(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    kill_srv(0);
    restart_srv(0);
    int rc = dlock_redlock_refresh(a->rl, ms_from_now(2000));
    if (rc != DLOCK_OK)
        fail_msg("the first refresh after node 0's restart: %d %s", rc, dlock_last_error());
    kill_srv(0);
    restart_srv(0);
    dlock_redlock_grant g;
    assert_int_equal(acquire(a, "n", &g, NULL), DLOCK_OK);
    assert_int_equal(g.votes, 2);
    assert_true(g.node_token[0] != 0);
    release(a, "n", &g);
    client_free(a);
}

/* Two threads acquire and release names on one set at once (for the
 * thread sanitizer: the node records, the pools). */
typedef struct runner {
    client *c;
    client me; /* c's settings with an id of its own (copied before the threads start) */
    const char *name;
    int failures;
    uint64_t last;
} runner;

static void *run_grants(void *arg)
{
    runner *r = arg;
    keys k;
    keys_of(&r->me, r->name, &k);
    for (int n = 0; n < 15; n++) {
        dlock_redlock_req q = {.name = r->name, .keys = k.p, .args = &r->me.args,
                               .client_name = r->me.name, .attempt = (uint64_t)n + 1,
                               .deadline = ms_from_now(2000)};
        dlock_redlock_grant g;
        dlock_redlock_busy b;
        if (dlock_redlock_acquire(r->c->rl, &q, &g, &b) != DLOCK_OK || g.token <= r->last) {
            r->failures++;
            continue;
        }
        r->last = g.token;
        if (dlock_redlock_release(r->c->rl, &q, &g) != DLOCK_OK)
            r->failures++;
        if (n % 5 == 0)
            dlock_redlock_refresh(r->c->rl, ms_from_now(2000));
    }
    return NULL;
}

static void test_two_threads(void **state)
{
    (void)state;
    char px[32];
    client *a = client_new(3, new_prefix(px, sizeof px), 1, 300);
    seed_all(a);
    runner r[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        r[t] = (runner){.c = a, .me = *a, .name = t ? "t1" : "t0"};
        snprintf(r[t].me.id, sizeof r[t].me.id, "%032x", 0x2000 + t);
        r[t].me.args.client_id = r[t].me.id;
    }
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&th[t], NULL, run_grants, &r[t]), 0);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++)
        if (r[t].failures)
            fail_msg("thread %d: %d of 15 acquires failed or gave no higher token", t,
                     r[t].failures);
    client_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_count_refused),
        cmocka_unit_test_teardown(test_fresh_deployment, restore),
        cmocka_unit_test_teardown(test_second_client_refused, restore),
        cmocka_unit_test_teardown(test_nodes_down, restore),
        cmocka_unit_test_teardown(test_restart_seeded, restore),
        cmocka_unit_test_teardown(test_write_back_meets_higher_mark, restore),
        cmocka_unit_test_teardown(test_equal_votes_no_write_back, restore),
        cmocka_unit_test_teardown(test_unequal_votes_written_back, restore),
        cmocka_unit_test_teardown(test_majority_votes_written_back, restore),
        cmocka_unit_test_teardown(test_floor_spares_write_back, restore),
        cmocka_unit_test_teardown(test_paused_past_validity, restore),
        cmocka_unit_test_teardown(test_fresh_client_seeds_late, restore),
        cmocka_unit_test_teardown(test_five_nodes, restore),
        cmocka_unit_test_teardown(test_seed_union_and_pages, restore),
        cmocka_unit_test_teardown(test_seed_skips_other_keys, restore),
        cmocka_unit_test_teardown(test_seed_fresh_rerun, restore),
        cmocka_unit_test_teardown(test_same_server_twice, restore),
        cmocka_unit_test_teardown(test_same_server_twice_renewal, restore),
        cmocka_unit_test_teardown(test_seed_read_before_script, restore),
        cmocka_unit_test_teardown(test_counts_at_send, restore),
        cmocka_unit_test_teardown(test_write_back_acks_count, restore),
        cmocka_unit_test_teardown(test_failed_acquire_releases_all, restore),
        cmocka_unit_test_teardown(test_restart_pooled_retry, restore),
        cmocka_unit_test_teardown(test_run_id_read_once_per_connection, restore),
        cmocka_unit_test_teardown(test_restart_with_data_not_counted, restore),
        cmocka_unit_test_teardown(test_stale_record_set_right, restore),
        cmocka_unit_test_teardown(test_two_threads, restore),
        cmocka_unit_test_teardown(test_check_node_deadline, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
