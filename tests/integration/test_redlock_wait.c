/*
 * Redlock mode's waits through dlock.h (docs/design.md, "Redlock",
 * Waiting; docs/guide.md, "Redlock"): on 3 private redis-servers
 * (tests/support/fixture.h), a waiting client is queued on every node
 * that refuses it, woken by a release on any node (a subscriber per
 * node), leaves the queues once granted, keeps a split vote unless a
 * node that refused it is held by a client whose wait began first
 * (wait-die), and, when its wait ends unserved, gives the vote it kept
 * back and leaves every queue; a shared wait also gives its split vote
 * back when a node refused it naming no holder; a node that still holds
 * the client's own lease of the other mode (DLOCKMODE) refused the try,
 * it did not fail to answer; a wait whose try too few nodes answered
 * leaves the queues of those that did.
 *
 * Each test runs on a key prefix of its own, seeded fresh (as `dlockctl
 * seed-fresh` does) before its clients open. The per-test teardown
 * resumes every paused server.
 *
 * Timing: leases of 15 s and a waiter ttl of 20 s, so that a refused
 * waiter's next poll comes 3.75 to 5 s after its try (a quarter of the
 * waiter ttl, jittered): a wait of 3 s that ends granted was woken. Each
 * release comes 300 ms into the wait, which leaves the wake-up and the
 * try it triggers 2.7 s on a loaded machine. Command and connect
 * timeouts of 200 ms (a stopped node costs each exchange that much).
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

#include "dlock.h"
#include "fixture.h"
#include "common/common.h"
#include "conn/script.h"

#define NSRV 3
#define LEASE_MS 15000
#define WAITER_TTL_MS 20000
#define WAIT_MS 3000 /* under the first poll after a refusal: 3750 ms at least */
#define RL_TAG "rlw"

#include "redlock_helpers.h"


/* ---------------------------------------------------------------- helpers */

/* A Redlock client of the set, named `name` (NULL: the default). */
static dlock_client *open_client(const char *name)
{
    dlock_config cfg;
    rl_config(&cfg, LEASE_MS, 200);
    cfg.waiter_ttl_ms = WAITER_TTL_MS;
    cfg.client_name = name;
    return rl_open(&cfg);
}

/* A client of server i alone (one server's mode), named `name`: a holder
 * of one node, as another Redlock client's vote there would be. */
static dlock_client *open_single(int i, const char *name)
{
    dlock_config cfg;
    fx_config(&cfg, &srv[i]);
    cfg.protocol = 2;
    cfg.key_prefix = prefix;
    cfg.lease_ms = LEASE_MS;
    cfg.client_name = name;
    dlock_client *c = NULL;
    if (dlock_client_open(&cfg, &c) != DLOCK_OK)
        fail_msg("open of a client of node %d: %s", i, dlock_last_error());
    return c;
}

static void must_acquire(dlock_client *c, const char *name, int64_t wait)
{
    int rc = dlock_acquire(c, name, wait, NULL);
    if (rc != DLOCK_OK)
        fail_msg("acquire of %s: %s: %s", name, dlock_strerror(rc), dlock_last_error());
}

static void key_of(const char *name, int k, char *out, size_t n)
{
    snprintf(out, n, "%s{%s}%s", prefix, name, dlock_script_key_suffix(k));
}

/* 1 if server i grants name to client id now (a live grant), else 0. */
static int held_by(int i, const char *name, const char *id)
{
    char key[256];
    key_of(name, DLOCK_KEY_LEASE, key, sizeof key);
    redisContext *rc = fx_connect("127.0.0.1", srv[i].port);
    assert_non_null(rc);
    char *owner = fx_grant_get(rc, key, "owner");
    int mine = owner && !strcmp(owner, id) && fx_lease_ms(rc, key) > 0;
    free(owner);
    redisFree(rc);
    return mine;
}

/* 1 if client id is in name's wait queue on server i, else 0. */
static int queued_at(int i, const char *name, const char *id)
{
    char key[256];
    key_of(name, DLOCK_KEY_QUEUE, key, sizeof key);
    redisReply *r = fx_cmd_at(srv[i].port, "ZSCORE %s %s", key, id);
    assert_non_null(r);
    int in = r->type == REDIS_REPLY_STRING;
    freeReplyObject(r);
    return in;
}

/* 1 if server i holds a shared lease of name for client id (its field
 * s:<id>), else 0. */
static int shared_at(int i, const char *name, const char *id)
{
    char key[256];
    key_of(name, DLOCK_KEY_LEASE, key, sizeof key);
    redisReply *r = fx_cmd_at(srv[i].port, "HEXISTS %s s:%s", key, id);
    assert_non_null(r);
    int in = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return in;
}

typedef struct waiter {
    dlock_client *c;
    const char *name;
    int shared;
    int64_t wait_ms;
    int rc;
    char msg[512];
    pthread_t th;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    w->rc = w->shared ? dlock_acquire_shared(w->c, w->name, w->wait_ms, NULL)
                      : dlock_acquire(w->c, w->name, w->wait_ms, NULL);
    snprintf(w->msg, sizeof w->msg, "%s", dlock_last_error());
    if (w->rc == DLOCK_OK)
        w->rc = w->shared ? dlock_release_shared(w->c, w->name) : dlock_release(w->c, w->name);
    return NULL;
}

static void wait_start(waiter *w, dlock_client *c, const char *name, int64_t wait_ms)
{
    w->c = c;
    w->name = name;
    w->wait_ms = wait_ms;
    assert_int_equal(pthread_create(&w->th, NULL, wait_thread, w), 0);
}

static int restore(void **state)
{
    (void)state;
    return fx_redis_restore_set(srv, NSRV);
}

/* ------------------------------------------------------------------ tests */

/* A waiter refused by a holder with 15 s of lease left is granted soon
 * after the release, well before its next poll: a release's message woke
 * it. */
static void test_woken_by_release(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(NULL), *b = open_client(NULL);
    must_acquire(a, "w", 2000);
    waiter w = {0};
    int64_t t0 = now_ms();
    wait_start(&w, b, "w", WAIT_MS);
    fx_sleep_ms(300);
    assert_int_equal(dlock_release(a, "w"), DLOCK_OK);
    pthread_join(w.th, NULL);
    if (w.rc != DLOCK_OK)
        fail_msg("the waiter, %" PRId64 " ms after it began: %s: %s", now_ms() - t0,
                 dlock_strerror(w.rc), w.msg);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* The first node stopped once the waiter is queued: the release reaches
 * the other two, whose direct grants' messages wake the waiter (the
 * subscriber of the first node hears nothing), and its try is granted by
 * those two. */
static void test_woken_by_other_nodes(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *a = open_client(NULL), *b = open_client(NULL);
    must_acquire(a, "o", 2000);
    waiter w = {0};
    wait_start(&w, b, "o", WAIT_MS);
    int64_t t0 = now_ms();
    while (!queued_at(1, "o", dlock_client_id(b)) || !queued_at(2, "o", dlock_client_id(b))) {
        if (now_ms() - t0 > 2000)
            fail_msg("the waiter is not queued on nodes 1 and 2 after 2 s");
        fx_sleep_ms(5);
    }
    assert_int_equal(fx_redis_signal(&srv[0], SIGSTOP), 0);
    int rc = dlock_release(a, "o");
    if (rc != DLOCK_OK)
        fail_msg("release with node 0 stopped: %s: %s", dlock_strerror(rc), dlock_last_error());
    pthread_join(w.th, NULL);
    if (w.rc != DLOCK_OK)
        fail_msg("the waiter, %" PRId64 " ms after it began: %s: %s", now_ms() - t0,
                 dlock_strerror(w.rc), w.msg);
    assert_int_equal(fx_redis_signal(&srv[0], SIGCONT), 0);
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A wait granted by nodes 0 and 1 while node 2, held by z (a client of
 * that node alone), refused it: the waiter leaves node 2's queue once
 * granted, so that z's release, after the waiter's own, does not grant
 * node 2 directly to a client that no longer waits (it would hold it a
 * waiter ttl, 20 s, for nobody). */
static void test_granted_waiter_leaves_queues(void **state)
{
    (void)state;
    rl_prefix_new(1);
    dlock_client *z = open_single(2, "z");
    dlock_client *b = open_client(NULL);
    must_acquire(z, "g", 2000);
    must_acquire(b, "g", 2000);
    /* (in the background: within 2 s, generous for a loaded machine) */
    int64_t t0 = now_ms();
    while (queued_at(2, "g", dlock_client_id(b))) {
        if (now_ms() - t0 > 2000)
            fail_msg("the holder is still queued on node 2, 2 s after its grant");
        fx_sleep_ms(10);
    }
    assert_int_equal(dlock_release(b, "g"), DLOCK_OK);
    assert_int_equal(dlock_release(z, "g"), DLOCK_OK);
    assert_false(held_by(2, "g", dlock_client_id(b)));
    dlock_client_close(z);
    dlock_client_close(b);
}

/* Node 0 held by x, node 1 by y (each a client of that node alone, named
 * as a waiting client's grant is: "<name>@<ticket>.<id>"), node 2 free: a
 * Redlock client's wait gets one vote of the two it needs. How often node
 * 2 is the waiter's own at three moments of its wait: */
static int split_vote_held(const char *x_name, const char *y_name, const char *name)
{
    rl_prefix_new(1);
    dlock_client *x = open_single(0, x_name), *y = open_single(1, y_name);
    dlock_client *b = open_client(NULL);
    must_acquire(x, name, 2000);
    must_acquire(y, name, 2000);
    waiter w = {0};
    wait_start(&w, b, name, 2400);
    int held = 0;
    for (int k = 1; k <= 3; k++) {
        fx_sleep_ms(600);
        held += held_by(2, name, dlock_client_id(b));
    }
    pthread_join(w.th, NULL);
    if (w.rc != DLOCK_ETIMEDOUT)
        fail_msg("the split wait: %s: %s", dlock_strerror(w.rc), w.msg);
    /* Its wait over, the vote it kept goes back and it leaves the queues
     * (in the background: within 2 s, generous for a loaded machine). */
    int64_t t0 = now_ms();
    while (held_by(2, name, dlock_client_id(b)) || queued_at(0, name, dlock_client_id(b)) ||
           queued_at(1, name, dlock_client_id(b))) {
        if (now_ms() - t0 > 2000)
            fail_msg("2 s after the wait ended: node 2 %s, queued on node 0 %d, on node 1 %d",
                     held_by(2, name, dlock_client_id(b)) ? "still the waiter's" : "free",
                     queued_at(0, name, dlock_client_id(b)), queued_at(1, name, dlock_client_id(b)));
        fx_sleep_ms(20);
    }
    dlock_client_close(x);
    dlock_client_close(y);
    dlock_client_close(b);
    return held;
}

/* x and y began their waits after the waiter (tickets in the year 2286):
 * the waiter keeps its vote on node 2 through its wait. */
static void test_split_vote_kept(void **state)
{
    (void)state;
    int held = split_vote_held("x@9999999999999999.00", "y@9999999999999999.01", "kept");
    if (held != 3)
        fail_msg("node 2 was the waiter's at %d of 3 moments of its wait, not all", held);
}

/* x began its wait first (ticket 1): the waiter gives its vote on node 2
 * back after each try (it is the waiter's only within a try). */
static void test_split_vote_given_back(void **state)
{
    (void)state;
    int held = split_vote_held("x@1.00", "y@9999999999999999.01", "back");
    if (held > 1)
        fail_msg("node 2 was the waiter's at %d of 3 moments of its wait: kept", held);
}

/* b waits shared for name 2.4 s, which must end unserved: how often node
 * 2 holds b's shared lease at three moments of the wait. */
static int shared_split_wait(dlock_client *b, const char *name)
{
    waiter w = {0};
    w.shared = 1;
    wait_start(&w, b, name, 2400);
    int held = 0;
    for (int k = 1; k <= 3; k++) {
        fx_sleep_ms(600);
        held += shared_at(2, name, dlock_client_id(b));
    }
    pthread_join(w.th, NULL);
    if (w.rc != DLOCK_ETIMEDOUT)
        fail_msg("the shared split wait: %s: %s", dlock_strerror(w.rc), w.msg);
    return held;
}

/* A shared wait: node 0 held by x, a client waiting since after it; node
 * 1 held shared by y (a client of that node alone) with z waiting there
 * exclusively, so that node 1 refuses the reader naming no holder (a
 * writer queued ahead); node 2 free. The reader gives its vote on node 2
 * back after each try: kept, it would hold node 2 against writers while
 * it waits for node 1's writer, which may wait for node 2 (docs/design.md
 * "Redlock", Shared mode). */
static void test_shared_split_vote_given_back_unnamed(void **state)
{
    (void)state;
    rl_prefix_new(1);
    const char *name = "sh";
    dlock_client *x = open_single(0, "x@9999999999999999.00");
    dlock_client *y = open_single(1, "y"), *z = open_single(1, "z");
    dlock_client *b = open_client(NULL);
    must_acquire(x, name, 2000);
    assert_int_equal(dlock_acquire_shared(y, name, 2000, NULL), DLOCK_OK);
    waiter zw = {0};
    wait_start(&zw, z, name, 8000);
    int64_t t0 = now_ms();
    while (!queued_at(1, name, dlock_client_id(z))) {
        if (now_ms() - t0 > 2000)
            fail_msg("z is not queued on node 1 after 2 s");
        fx_sleep_ms(5);
    }
    int held = shared_split_wait(b, name);
    if (held > 1)
        fail_msg("node 2 was the reader's at %d of 3 moments of its wait: kept", held);
    assert_int_equal(dlock_release_shared(y, name), DLOCK_OK);
    pthread_join(zw.th, NULL);
    if (zw.rc != DLOCK_OK)
        fail_msg("z's wait: %s: %s", dlock_strerror(zw.rc), zw.msg);
    dlock_client_close(x);
    dlock_client_close(y);
    dlock_client_close(z);
    dlock_client_close(b);
}

/* Its control: node 1 held by y, a client waiting since after the
 * reader, as node 0 by x: the reader keeps its vote on node 2 through its
 * wait, as a writer does. */
static void test_shared_split_vote_kept(void **state)
{
    (void)state;
    rl_prefix_new(1);
    const char *name = "shk";
    dlock_client *x = open_single(0, "x@9999999999999999.00");
    dlock_client *y = open_single(1, "y@9999999999999999.01");
    dlock_client *b = open_client(NULL);
    must_acquire(x, name, 2000);
    must_acquire(y, name, 2000);
    int held = shared_split_wait(b, name);
    if (held != 3)
        fail_msg("node 2 was the reader's at %d of 3 moments of its wait, not all", held);
    /* Its wait over, the shared vote it kept goes back (release_shared.lua)
     * and it leaves the queues (in the background: within 2 s, generous
     * for a loaded machine). */
    int64_t t0 = now_ms();
    while (shared_at(2, name, dlock_client_id(b)) || queued_at(0, name, dlock_client_id(b)) ||
           queued_at(1, name, dlock_client_id(b))) {
        if (now_ms() - t0 > 2000)
            fail_msg("2 s after the wait ended: node 2 %s, queued on node 0 %d, on node 1 %d",
                     shared_at(2, name, dlock_client_id(b)) ? "still the reader's" : "free",
                     queued_at(0, name, dlock_client_id(b)), queued_at(1, name, dlock_client_id(b)));
        fx_sleep_ms(20);
    }
    dlock_client_close(x);
    dlock_client_close(y);
    dlock_client_close(b);
}

/* A direct grant that a node makes under the attempt of the lease the
 * client holds (its queue entry there outlived the grant: here written
 * back by hand, as a late leave leaves it) while a thread of the client
 * waits shared: one node's grant is a wake-up only, and nothing gives that
 * attempt back (a give-back by attempt would release the held lease on
 * every node, and another client would be granted it beside the holder). */
static void test_direct_grant_of_held_attempt_kept(void **state)
{
    (void)state;
    rl_prefix_new(1);
    const char *name = "dg";
    dlock_client *z = open_single(2, "z");
    dlock_client *b = open_client(NULL), *c = open_client(NULL);
    must_acquire(z, name, 2000);
    must_acquire(b, name, 2000); /* nodes 0 and 1; node 2 refused it */
    int64_t t0 = now_ms();
    while (queued_at(2, name, dlock_client_id(b))) { /* the leave, in the background */
        if (now_ms() - t0 > 2000)
            fail_msg("the holder is still queued on node 2, 2 s after its grant");
        fx_sleep_ms(10);
    }
    /* b's attempt, from node 0's grant ("<token> <attempt> ..."), queued
     * again on node 2 under it for 10 s */
    char lease[256], queue[256], live[256];
    key_of(name, DLOCK_KEY_LEASE, lease, sizeof lease);
    key_of(name, DLOCK_KEY_QUEUE, queue, sizeof queue);
    key_of(name, DLOCK_KEY_LIVE, live, sizeof live);
    redisReply *g = fx_cmd_at(srv[0].port, "HGET %s g", lease);
    assert_non_null(g);
    assert_int_equal(g->type, REDIS_REPLY_STRING);
    unsigned long long tok = 0, att = 0;
    assert_int_equal(sscanf(g->str, "%llu %llu", &tok, &att), 2);
    freeReplyObject(g);
    redisReply *tm = fx_cmd_at(srv[2].port, "TIME");
    assert_non_null(tm);
    long long now2 = atoll(tm->element[0]->str) * 1000 + atoll(tm->element[1]->str) / 1000;
    freeReplyObject(tm);
    redisReply *r = fx_cmd_at(srv[2].port, "ZADD %s 1 %s", queue, dlock_client_id(b));
    assert_non_null(r);
    freeReplyObject(r);
    char lv[96];
    snprintf(lv, sizeof lv, "%lld %llu 0 %d b", now2 + 10000, att, WAITER_TTL_MS);
    r = fx_cmd_at(srv[2].port, "HSET %s %s %s", live, dlock_client_id(b), lv);
    assert_non_null(r);
    freeReplyObject(r);
    r = fx_cmd_at(srv[2].port, "HSET %s q 1", lease); /* (the hash's word that some wait) */
    assert_non_null(r);
    freeReplyObject(r);
    /* a thread of b waits shared, behind b's own exclusive hold */
    waiter w = {0};
    w.shared = 1;
    wait_start(&w, b, name, 8000);
    fx_sleep_ms(200);
    /* z's release grants node 2 to b directly, under the held attempt */
    assert_int_equal(dlock_release(z, name), DLOCK_OK);
    fx_sleep_ms(500); /* (the message, and what the client does of it: generous) */
    int rc = dlock_acquire(c, name, 0, NULL);
    if (rc == DLOCK_OK)
        fail_msg("another client was granted %s while b holds it: b's lease was given back", name);
    assert_int_equal(rc, DLOCK_EBUSY);
    assert_true(held_by(0, name, dlock_client_id(b)) && held_by(1, name, dlock_client_id(b)));
    assert_true(held_by(2, name, dlock_client_id(b))); /* (its direct grant, a waiter ttl) */
    assert_int_equal(dlock_release(b, name), DLOCK_OK);
    pthread_join(w.th, NULL);
    if (w.rc != DLOCK_OK)
        fail_msg("the shared wait: %s: %s", dlock_strerror(w.rc), w.msg);
    dlock_client_close(z);
    dlock_client_close(b);
    dlock_client_close(c);
}

/* Node i's hash of name back as snapshot h (HGETALL) had it, for 15 s. */
static void hash_put_back(int i, const char *name, const redisReply *h)
{
    char key[256];
    key_of(name, DLOCK_KEY_LEASE, key, sizeof key);
    redisContext *rc = fx_connect("127.0.0.1", srv[i].port);
    assert_non_null(rc);
    const char *argv[64];
    argv[0] = "HSET";
    argv[1] = key;
    assert_true(h->type == REDIS_REPLY_ARRAY && h->elements > 0 && h->elements <= 62);
    for (size_t k = 0; k < h->elements; k++)
        argv[2 + k] = h->element[k]->str;
    redisReply *r = redisCommand(rc, "DEL %s", key);
    assert_non_null(r);
    freeReplyObject(r);
    r = redisCommandArgv(rc, (int)h->elements + 2, argv, NULL);
    assert_true(r && r->type == REDIS_REPLY_INTEGER);
    freeReplyObject(r);
    r = redisCommand(rc, "PEXPIRE %s 15000", key);
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(rc);
}

/* b's shared release lost on nodes 0 and 1 (their hashes put back as they
 * were before it): its shared lease lives on there for the rest of its
 * lease, and those nodes
 * answer b's exclusive tries with DLOCKMODE (no upgrade in Redis). They
 * answered: the try is refused, DLOCK_EBUSY, and a wait ends in
 * DLOCK_ETIMEDOUT, not DLOCK_EREDIS as for nodes that did not answer; the
 * vote node 2 gave the wait is given back once it ends. */
static void test_own_other_mode_is_a_refusal(void **state)
{
    (void)state;
    rl_prefix_new(1);
    const char *name = "om";
    dlock_client *b = open_client(NULL);
    const char *id = dlock_client_id(b);
    assert_int_equal(dlock_acquire_shared(b, name, 2000, NULL), DLOCK_OK);
    char key[256];
    key_of(name, DLOCK_KEY_LEASE, key, sizeof key);
    redisReply *h0 = fx_cmd_at(srv[0].port, "HGETALL %s", key);
    redisReply *h1 = fx_cmd_at(srv[1].port, "HGETALL %s", key);
    assert_non_null(h0);
    assert_non_null(h1);
    assert_int_equal(dlock_release_shared(b, name), DLOCK_OK);
    hash_put_back(0, name, h0);
    hash_put_back(1, name, h1);
    freeReplyObject(h0);
    freeReplyObject(h1);
    int rc;
    assert_true(shared_at(0, name, id) && shared_at(1, name, id));
    assert_false(shared_at(2, name, id));
    rc = dlock_acquire(b, name, 0, NULL);
    if (rc != DLOCK_EBUSY)
        fail_msg("the try: %s (DLOCK_EBUSY expected): %s", dlock_strerror(rc),
                 dlock_last_error());
    if (!strstr(dlock_last_error(), "this client in the other mode"))
        fail_msg("the try's message: %s", dlock_last_error());
    assert_false(held_by(2, name, id)); /* (its vote there given back) */
    rc = dlock_acquire(b, name, 600, NULL);
    if (rc != DLOCK_ETIMEDOUT)
        fail_msg("the wait: %s (DLOCK_ETIMEDOUT expected): %s", dlock_strerror(rc),
                 dlock_last_error());
    int64_t t0 = now_ms();
    while (held_by(2, name, id)) { /* (the kept vote, given back in the background) */
        if (now_ms() - t0 > 2000)
            fail_msg("node 2 still grants %s to b 2 s after its wait ended", name);
        fx_sleep_ms(10);
    }
    dlock_client_close(b);
}

/* Node 0 held by z (a client of that node alone), nodes 1 and 2 stopped:
 * a wait of 500 ms ends after its first try (too few nodes answered, and
 * no time for another: DLOCK_EREDIS), and node 0 had queued the client
 * when it refused it. The wait's end takes the client out of that queue
 * (in the background) as after a refusal: else its entry would stay for
 * the waiter ttl, 20 s, and z's release would grant node 0 directly to a
 * client that waits no more. */
static void test_unreachable_wait_leaves_queue(void **state)
{
    (void)state;
    rl_prefix_new(1);
    const char *name = "uq";
    dlock_client *z = open_single(0, "z");
    dlock_client *b = open_client(NULL);
    const char *id = dlock_client_id(b);
    must_acquire(z, name, 2000);
    must_acquire(b, "warm", 2000); /* (b counts the nodes: a fresh client waits a lease) */
    assert_int_equal(dlock_release(b, "warm"), DLOCK_OK);
    assert_int_equal(fx_redis_signal(&srv[1], SIGSTOP), 0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGSTOP), 0);
    waiter w = {0};
    wait_start(&w, b, name, 500);
    /* node 0 queues b at once; the try waits a command timeout (200 ms)
     * for the others: seen queued meanwhile */
    int seen = 0, joined = 0;
    while (!joined) {
        seen |= queued_at(0, name, id);
        joined = pthread_tryjoin_np(w.th, NULL) == 0;
        if (!joined)
            fx_sleep_ms(5);
    }
    if (w.rc != DLOCK_EREDIS)
        fail_msg("the wait with two nodes stopped: %s (DLOCK_EREDIS expected): %s",
                 dlock_strerror(w.rc), w.msg);
    assert_true(seen);
    assert_int_equal(fx_redis_signal(&srv[1], SIGCONT), 0);
    assert_int_equal(fx_redis_signal(&srv[2], SIGCONT), 0);
    int64_t t0 = now_ms();
    while (queued_at(0, name, id)) { /* (the leave, in the background: 3 s is generous) */
        if (now_ms() - t0 > 3000)
            fail_msg("b is still in node 0's queue of %s 3 s after its wait ended", name);
        fx_sleep_ms(10);
    }
    assert_int_equal(dlock_release(z, name), DLOCK_OK);
    assert_false(held_by(0, name, id)); /* (no direct grant to b) */
    dlock_client_close(z);
    dlock_client_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_woken_by_release, restore),
        cmocka_unit_test_teardown(test_woken_by_other_nodes, restore),
        cmocka_unit_test_teardown(test_granted_waiter_leaves_queues, restore),
        cmocka_unit_test_teardown(test_split_vote_kept, restore),
        cmocka_unit_test_teardown(test_split_vote_given_back, restore),
        cmocka_unit_test_teardown(test_shared_split_vote_given_back_unnamed, restore),
        cmocka_unit_test_teardown(test_shared_split_vote_kept, restore),
        cmocka_unit_test_teardown(test_direct_grant_of_held_attempt_kept, restore),
        cmocka_unit_test_teardown(test_own_other_mode_is_a_refusal, restore),
        cmocka_unit_test_teardown(test_unreachable_wait_leaves_queue, restore),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
