/*
 * Redis Cluster mode (src/cluster.c, and the routing in client.c and
 * renew.c), on a real 3-master cluster started here (fixture.h:
 * fx_cluster_start):
 *   - the hash slot of a key, checked against the specification's vector
 *     and hash tag rules and against CLUSTER KEYSLOT on thousands of keys of
 *     the shapes dlock uses; names that start with '}' (an empty hash tag)
 *     would scatter their keys, and cluster mode refuses them;
 *   - the configuration checks of cluster_nodes;
 *   - the client contract on names spread over every master: exclusion
 *     between clients, fencing tokens, wake-ups and direct grants whichever
 *     node holds the name and whichever node the waiter subscribed on, a
 *     lost lease reported, a stale slot map followed through MOVED;
 *   - renewal of 10,000 held leases: one round trip per master per period.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dlock.h"

#include "cluster.h"
#include "fixture.h"

static unsigned slot_of(const char *key)
{
    return dlock_cluster_slot(key, strlen(key));
}

/* The specification's check value, and its hash tag examples. */
static void test_crc16_and_tags(void **state)
{
    (void)state;
    assert_int_equal(dlock_crc16("123456789", 9), 0x31C3);
    assert_int_equal(dlock_crc16("", 0), 0);
    /* a tag: the bytes between the first '{' and the next '}' */
    assert_int_equal(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
    assert_int_equal(slot_of("{user1000}.following"), slot_of("user1000"));
    assert_int_equal(slot_of("foo{bar}{zap}"), slot_of("bar"));
    assert_int_equal(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    /* an empty tag, or no '}' after the '{': the whole key */
    assert_int_equal(slot_of("foo{}{bar}"), dlock_crc16("foo{}{bar}", 10) & 16383);
    assert_int_equal(slot_of("foo{bar"), dlock_crc16("foo{bar", 7) & 16383);
    /* dlock's keys of one name share its slot */
    assert_int_equal(slot_of("dlock:{order:42}"), slot_of("dlock:{order:42}:fence"));
    assert_int_equal(slot_of("dlock:{order:42}"), slot_of("dlock:{order:42}:c:0123abcd"));
    for (unsigned i = 0; i < 1000; i++) {
        char k[32];
        snprintf(k, sizeof k, "k%u", i);
        assert_true(slot_of(k) < DLOCK_CLUSTER_SLOTS);
    }
}

/* CLUSTER KEYSLOT of key[0..len) on the node at port, or -1. */
static long long keyslot(redisContext *c, const char *key, size_t len)
{
    redisReply *r = redisCommand(c, "CLUSTER KEYSLOT %b", key, len);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}

/* A real cluster agrees on 4000 keys: dlock's key shapes for random names,
 * names holding '{', '}' and arbitrary bytes among them. */
static void test_slots_match_a_real_cluster(void **state)
{
    (void)state;
    fx_cluster cl;
    assert_int_equal(fx_cluster_start(&cl, 3, 0), 0);
    redisContext *c = fx_connect("127.0.0.1", cl.node[0].port);
    assert_non_null(c);
    unsigned seed = 12345;
    const char *suffix[4] = {"", ":fence", ":q", ":c:00112233445566778899aabbccddeeff"};
    int mismatches = 0, split_names = 0;
    for (int i = 0; i < 1000; i++) {
        char name[40];
        size_t nlen = 1 + (size_t)(rand_r(&seed) % 30);
        for (size_t j = 0; j < nlen; j++) {
            int pick = rand_r(&seed) % 10;
            name[j] = pick == 0 ? '{' : pick == 1 ? '}' : pick == 2 ? (char)(rand_r(&seed) % 256)
                                                                    : (char)('a' + rand_r(&seed) % 26);
        }
        unsigned first = 0;
        for (int k = 0; k < 4; k++) {
            char key[128];
            size_t len = 0;
            memcpy(key, "dlock:{", 7);
            len = 7;
            memcpy(key + len, name, nlen);
            len += nlen;
            key[len++] = '}';
            size_t sl = strlen(suffix[k]);
            memcpy(key + len, suffix[k], sl);
            len += sl;
            unsigned mine = dlock_cluster_slot(key, len);
            long long theirs = keyslot(c, key, len);
            if ((long long)mine != theirs)
                mismatches++;
            if (k == 0)
                first = mine;
            else if (mine != first && name[0] != '}')
                mismatches++; /* every key of a name in one slot */
            else if (mine != first)
                split_names += k == 1;
        }
    }
    redisFree(c);
    fx_cluster_stop(&cl);
    /* A name that starts with '}' makes "<prefix>{}..." an empty tag: its
     * keys hash whole and scatter. Cluster mode will have to refuse or
     * escape such names (README: Limits). */
    fprintf(stderr, "%d of the names start with '}' and scatter their keys\n", split_names);
    assert_int_equal(mismatches, 0);
}

static fx_cluster C; /* the contract tests' cluster */

static int cluster_setup(void **state)
{
    (void)state;
    return fx_cluster_start(&C, 3, 0);
}

static int cluster_teardown(void **state)
{
    (void)state;
    fx_cluster_stop(&C);
    return 0;
}

static void cluster_config(dlock_config *cfg, const char *prefix)
{
    dlock_config_init(cfg);
    cfg->redis_host = NULL;
    cfg->cluster_nodes = C.addrs;
    cfg->key_prefix = prefix;
}

/* Script calls (EVALSHA and EVAL) served by the node at port. */
static long long script_calls(int port)
{
    return fx_info_calls("127.0.0.1", port, "evalsha") + fx_info_calls("127.0.0.1", port, "eval");
}

static void test_cluster_config(void **state)
{
    (void)state;
    dlock_config cfg;
    dlock_client *c = NULL;
    cluster_config(&cfg, "tc:cfg:");
    cfg.redis_host = "10.0.0.1";
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "cluster_nodes and redis_host"));
    cluster_config(&cfg, "tc:cfg:");
    cfg.sentinels = "127.0.0.1:1";
    cfg.sentinel_master = "m";
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "sentinels and cluster_nodes"));
    cluster_config(&cfg, "tc:{cfg}:");
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "brace"));
    cluster_config(&cfg, "tc:cfg:");
    cfg.redis_db = 2;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "database 0"));
    cluster_config(&cfg, "tc:cfg:");
    cfg.cluster_nodes = "127.0.0.1";
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "cluster_nodes"));
    assert_null(c);
    /* a name starting with '}' is refused; one holding it further on is not */
    cluster_config(&cfg, "tc:cfg:");
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "}x", 0, NULL), DLOCK_EINVAL);
    assert_non_null(strstr(dlock_last_error(), "starts with '}'"));
    assert_int_equal(dlock_acquire(c, "a}b{c", 0, NULL), DLOCK_OK);
    assert_int_equal(dlock_release(c, "a}b{c"), DLOCK_OK);
    dlock_client_close(c);
    /* seeds that are all down: calls fail with DLOCK_EREDIS, no hang */
    cluster_config(&cfg, "tc:cfg:");
    cfg.cluster_nodes = "127.0.0.1:1";
    cfg.connect_timeout_ms = 200;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    assert_int_equal(dlock_acquire(c, "x", 0, NULL), DLOCK_EREDIS);
    assert_non_null(strstr(dlock_last_error(), "slot"));
    dlock_client_close(c);
}

static int lost_count;
static void on_lost(const char *name, uint64_t fence, void *arg)
{
    (void)name;
    (void)fence;
    (void)arg;
    __atomic_add_fetch(&lost_count, 1, __ATOMIC_RELAXED);
}

/* Names on every master: exclusion between two clients, tokens that grow,
 * and every master serving script calls; a seed list of one node finds the
 * others. */
static void test_contract_on_every_master(void **state)
{
    (void)state;
    dlock_config cfg;
    cluster_config(&cfg, "tc:k:");
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    char seed[32];
    snprintf(seed, sizeof seed, "127.0.0.1:%d", C.node[2].port);
    cfg.cluster_nodes = seed; /* one seed: the map names the others */
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    long long before[3];
    for (int i = 0; i < 3; i++)
        before[i] = script_calls(C.node[i].port);
    for (int i = 0; i < 60; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        uint64_t t1, t2;
        assert_int_equal(dlock_acquire(a, name, 0, &t1), DLOCK_OK);
        assert_int_equal(dlock_acquire(b, name, 0, NULL), DLOCK_EBUSY);
        assert_int_equal(dlock_held(a, name), 1);
        assert_int_equal(dlock_release(a, name), DLOCK_OK);
        assert_int_equal(dlock_acquire(b, name, 0, &t2), DLOCK_OK);
        assert_true(t2 > t1);
        assert_int_equal(dlock_release(b, name), DLOCK_OK);
    }
    for (int i = 0; i < 3; i++)
        assert_true(script_calls(C.node[i].port) > before[i] + 20);
    dlock_client_close(a);
    dlock_client_close(b);
}

typedef struct waiter {
    dlock_client *c;
    const char *name;
    int rc;
    uint64_t token;
} waiter;

static void *wait_for(void *arg)
{
    waiter *w = arg;
    w->rc = dlock_acquire(w->c, w->name, 10000, &w->token);
    if (w->rc == DLOCK_OK)
        w->rc = dlock_release(w->c, w->name);
    return NULL;
}

/* A waiter in another client gets the lease when the holder releases,
 * whichever master serves the name and whichever node the waiter's
 * subscriber listens on (PUBLISH reaches every node): most by a direct
 * grant, none by the waiter's fallback polling alone. */
static void test_wakeups_across_nodes(void **state)
{
    (void)state;
    dlock_config cfg;
    cluster_config(&cfg, "tc:w:");
    cfg.waiter_ttl_ms = 20000; /* fallback polls every 5 s: a wake-up must come */
    dlock_client *a, *b;
    assert_int_equal(dlock_client_open(&cfg, &a), DLOCK_OK);
    assert_int_equal(dlock_client_open(&cfg, &b), DLOCK_OK);
    fx_sleep_ms(300); /* the subscribers are up */
    long long t0 = fx_now_ns();
    for (int i = 0; i < 12; i++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", i);
        uint64_t held;
        assert_int_equal(dlock_acquire(a, name, 0, &held), DLOCK_OK);
        waiter w = {b, name, -1, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, wait_for, &w), 0);
        fx_sleep_ms(50); /* b queues */
        assert_int_equal(dlock_release(a, name), DLOCK_OK);
        pthread_join(th, NULL);
        assert_int_equal(w.rc, DLOCK_OK);
        assert_true(w.token > held);
    }
    /* 12 hand-overs: without wake-ups each would wait for a 5 s poll */
    double secs = (fx_now_ns() - t0) / 1e9;
    dlock_stats st;
    assert_int_equal(dlock_client_stats(b, &st), DLOCK_OK);
    fprintf(stderr, "wake-ups across nodes: 12 hand-overs in %.2f s, %llu direct grants\n", secs,
            (unsigned long long)st.direct_grants);
    assert_true(secs < 12 * 2.5); /* generous: polling alone would take 60 s */
    dlock_client_close(a);
    dlock_client_close(b);
}

/* A lease deleted on its master is reported lost by the renewal, which
 * renews on every master. */
static void test_lost_lease_reported(void **state)
{
    (void)state;
    dlock_config cfg;
    cluster_config(&cfg, "tc:l:");
    cfg.lease_ms = 600; /* renewal every 200 ms */
    cfg.on_lost = on_lost;
    lost_count = 0;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    for (int i = 0; i < 9; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
    }
    fx_sleep_ms(700); /* renewed past the lease time */
    for (int i = 0; i < 9; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", i);
        assert_int_equal(dlock_held(c, name), 1);
    }
    /* delete l4's lease on whichever node serves it */
    redisContext *x = fx_connect("127.0.0.1", C.node[0].port);
    redisReply *r = redisCommand(x, "CLUSTER KEYSLOT tc:l:{l4}");
    long long slot = r->integer;
    freeReplyObject(r);
    redisFree(x);
    int deleted = 0;
    for (int i = 0; i < 3 && !deleted; i++) {
        x = fx_connect("127.0.0.1", C.node[i].port);
        r = redisCommand(x, "CLUSTER COUNTKEYSINSLOT %lld", slot);
        long long keys = r->integer;
        freeReplyObject(r);
        if (keys > 0) {
            r = redisCommand(x, "DEL tc:l:{l4}");
            deleted = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
            freeReplyObject(r);
        }
        redisFree(x);
    }
    assert_true(deleted);
    for (int i = 0; i < 200 && dlock_held(c, "l4"); i++)
        fx_sleep_ms(10);
    assert_int_equal(dlock_held(c, "l4"), 0);
    assert_int_equal(__atomic_load_n(&lost_count, __ATOMIC_RELAXED), 1);
    assert_int_equal(dlock_release(c, "l4"), DLOCK_ELOST);
    for (int i = 0; i < 9; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", i);
        if (i != 4)
            assert_int_equal(dlock_release(c, name), DLOCK_OK);
    }
    dlock_client_close(c);
}

/* Renewal of 10,000 held leases spread over the 3 masters: each period
 * costs one round trip per master, all in flight at once. */
static void test_renew_10000(void **state)
{
    (void)state;
    enum { N = 10000 };
    dlock_config cfg;
    cluster_config(&cfg, "tc:r:");
    cfg.lease_ms = 3000; /* a period of 1 s */
    cfg.pool_size = 8;
    dlock_client *c;
    assert_int_equal(dlock_client_open(&cfg, &c), DLOCK_OK);
    char name[16];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "r%d", i);
        assert_int_equal(dlock_acquire(c, name, 0, NULL), DLOCK_OK);
    }
    dlock_stats a, b;
    assert_int_equal(dlock_client_stats(c, &a), DLOCK_OK);
    long long t0 = fx_now_ns();
    fx_sleep_ms(3500); /* longer than the lease: only renewals keep them */
    assert_int_equal(dlock_client_stats(c, &b), DLOCK_OK);
    double secs = (fx_now_ns() - t0) / 1e9;
    unsigned long long rounds = b.renew_rounds - a.renew_rounds;
    unsigned long long trips = b.renew_round_trips - a.renew_round_trips;
    unsigned long long keys = b.renew_keys - a.renew_keys;
    fprintf(stderr, "10000 leases on 3 masters: %llu renewal rounds in %.1f s, %llu round trips "
                    "(%.2f per round), %llu leases renewed\n",
            rounds, secs, trips, rounds ? (double)trips / rounds : 0.0, keys);
    assert_true(rounds >= 2);
    assert_true(trips == 3 * rounds); /* one per master per round */
    assert_true(keys == (unsigned long long)N * rounds);
    assert_int_equal(b.leases_lost, 0);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "r%d", i);
        assert_int_equal(dlock_held(c, name), 1);
        assert_int_equal(dlock_release(c, name), DLOCK_OK);
    }
    dlock_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_and_tags),
        cmocka_unit_test(test_slots_match_a_real_cluster),
    };
    const struct CMUnitTest on_cluster[] = {
        cmocka_unit_test(test_cluster_config),
        cmocka_unit_test(test_contract_on_every_master),
        cmocka_unit_test(test_wakeups_across_nodes),
        cmocka_unit_test(test_lost_lease_reported),
        cmocka_unit_test(test_renew_10000),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + cmocka_run_group_tests(on_cluster, cluster_setup, cluster_teardown);
}
