/*
 * Redis Cluster hash slots (see cluster.h). Stateless.
 */
#include "cluster.h"

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
            return dlock_crc16(key + open + 1, close - open - 1) & (DLOCK_CLUSTER_SLOTS - 1);
    }
    return dlock_crc16(key, len) & (DLOCK_CLUSTER_SLOTS - 1);
}
