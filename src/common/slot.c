/*
 * Hash slots and slot tags (slot.h). The tag table is written once, under
 * pthread_once, and only read after: no lock.
 */
#include <pthread.h>
#include <stdio.h>

#include "common/slot.h"

uint16_t dlock_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

unsigned dlock_cluster_slot(const char *key, size_t len)
{
    size_t open = 0;
    while (open < len && key[open] != '{')
        open++;
    if (open < len) {
        size_t close = open + 1;
        while (close < len && key[close] != '}')
            close++;
        /* a tag only if '}' follows and something is between */
        if (close < len && close != open + 1)
            return dlock_crc16(key + open + 1, close - open - 1) & (DLOCK_SLOTS - 1);
    }
    return dlock_crc16(key, len) & (DLOCK_SLOTS - 1);
}

static char tags[DLOCK_SLOTS][DLOCK_SLOT_TAG_MAX];
static pthread_once_t tags_once = PTHREAD_ONCE_INIT;

static void tags_fill(void)
{
    unsigned left = DLOCK_SLOTS;
    char s[DLOCK_SLOT_TAG_MAX];
    for (unsigned n = 0; left > 0; n++) {
        int len = snprintf(s, sizeof s, "%u", n);
        unsigned slot = dlock_crc16(s, (size_t)len) & (DLOCK_SLOTS - 1);
        if (!tags[slot][0]) {
            snprintf(tags[slot], sizeof tags[slot], "%s", s);
            left--;
        }
    }
}

const char *dlock_slot_tag(unsigned slot)
{
    pthread_once(&tags_once, tags_fill);
    return tags[slot & (DLOCK_SLOTS - 1)];
}
