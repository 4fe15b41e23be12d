/*
 * Redis Cluster support, first part: the hash slot of a key (src/cluster.c),
 * checked against the Redis Cluster specification's vector and hash tag
 * rules, and against a real 3-master cluster started here (fixture.h:
 * fx_cluster_start) with CLUSTER KEYSLOT on thousands of keys of the shapes
 * dlock uses, names with braces and arbitrary bytes included: the client's
 * slot is Redis' for every key, and every key of a lock name lands in one
 * slot, except for names that start with '}' (an empty hash tag), which
 * cluster mode will have to refuse or escape.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_and_tags),
        cmocka_unit_test(test_slots_match_a_real_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
