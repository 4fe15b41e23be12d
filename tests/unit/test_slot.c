/*
 * Hash slots and slot tags (src/common/slot.c): the slot of a key as Redis
 * Cluster computes it, and the tag of every slot, which puts the slot's
 * mark of tokens (lua/keys.lua, HW) in the same slot as its names. The
 * values checked against sim/slot.lua's are what that file computes, so
 * that the library and the simulator name the same mark.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/slot.h"

/* CRC16/XMODEM's check value, and Redis' hash tag rules. */
static void test_slot_of_a_key(void **state)
{
    (void)state;
    assert_int_equal(dlock_crc16("123456789", 9), 0x31C3);
    assert_int_equal(dlock_cluster_slot("{user1000}.following", 20),
                     dlock_cluster_slot("user1000", 8));
    assert_int_equal(dlock_cluster_slot("foo{}{bar}", 10), dlock_crc16("foo{}{bar}", 10) & 16383);
    /* the same as sim/slot.lua: the slot of "dlock:{n1}" */
    assert_int_equal(dlock_cluster_slot("dlock:{n1}", 10), 3671);
}

/* Every slot has a tag of at most 6 digits that falls in it (so no two
 * slots share one), as the mark's key too, and the same tags as
 * sim/slot.lua's. */
static void test_every_slot_has_its_tag(void **state)
{
    (void)state;
    for (unsigned s = 0; s < DLOCK_SLOTS; s++) {
        const char *t = dlock_slot_tag(s);
        size_t n = strlen(t);
        assert_true(n >= 1 && n < DLOCK_SLOT_TAG_MAX);
        assert_int_equal(dlock_crc16(t, n) & (DLOCK_SLOTS - 1), s);
        char key[32];
        snprintf(key, sizeof key, "dlock:hw:{%s}", t);
        assert_int_equal(dlock_cluster_slot(key, strlen(key)), s);
    }
    assert_string_equal(dlock_slot_tag(0), "3560");
    assert_string_equal(dlock_slot_tag(3671), "19614");
    assert_string_equal(dlock_slot_tag(16383), "39296");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_of_a_key),
        cmocka_unit_test(test_every_slot_has_its_tag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
