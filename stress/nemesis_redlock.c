/*
 * nemesis_redlock.c: the nemesis soak's Redlock topology (--redlock N, see
 * nemesis.c and docs/nemesis.md "Redlock mode"): N independent masters
 * (AOF, appendfsync always), each behind its own fault proxy of the runner
 * and, with --clock-shim, under its own fake clock (its own offset file:
 * the nodes stand for independent hosts); no replica, no sentinel. The
 * workers' dlock_config.redlock_nodes lists the proxies. The deployment is
 * seeded fresh once at start (as `dlockctl seed-fresh`); a restarted node
 * is seeded by the workers' clients.
 *
 * The faults on the nodes, one node each (the nemesis picks it at random):
 * restart (SIGKILL, restart from the AOF), wipe (the same without the
 * data), delay, reset, hold and stall on the node's proxy, and steps of the
 * node's clock, forward (0.5-2 s, the node kept within 10 s ahead of real
 * time) or back (at most one lease time in all until it has caught up, as
 * for the Sentinel topology's servers). A restart or wipe is injected only
 * while it leaves at most N - m nodes that do not count (the liveness
 * assumption, docs/design.md "Redlock"): a node counts for the runner
 * when it answers and its seed key holds its current run id.
 *
 * Used by the runner's main thread only, but nm_rl_kill_all (a signal
 * handler's); the proxies run their own threads (tests/support/proxy.c).
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nemesis.h"
#include "route/redlock.h"

int nm_rl_n;
static fx_redis node[NM_RL_MAX];
static fx_proxy *npx[NM_RL_MAX];
static fx_fake_clock nclock[NM_RL_MAX];
static int shimmed;
static long lease_ms;
static long off_ms[NM_RL_MAX];       /* node i's clock less real time */
static int64_t caught_up[NM_RL_MAX]; /* when node i's clock has passed every
                                        reading it gave before its last step
                                        back (CLOCK_MONOTONIC ns) */
static const char *node_args[] = {"--appendonly", "yes", "--appendfsync", "always", NULL};

static int majority(void)
{
    return nm_rl_n / 2 + 1;
}

static long debt_ms(int i)
{
    int64_t now = nm_now_ns();
    return caught_up[i] > now ? (long)((caught_up[i] - now) / 1000000LL) : 0;
}

/* Node i answers and its seed key holds its current run id. */
static int node_counts(int i)
{
    if (node[i].pid <= 0)
        return 0;
    redisReply *r = fx_cmd_at(node[i].port, "INFO server");
    char run[64] = "";
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
    if (p)
        sscanf(p + 7, "%63[0-9a-f]", run);
    if (r)
        freeReplyObject(r);
    if (!run[0])
        return 0;
    r = fx_cmd_at(node[i].port, "GET %sredlock:seed", NM_PREFIX);
    int ok = r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, run);
    if (r)
        freeReplyObject(r);
    return ok;
}

static int uncounted(void)
{
    int n = 0;
    for (int i = 0; i < nm_rl_n; i++)
        n += !node_counts(i);
    return n;
}

int nm_rl_settle(long ms)
{
    int64_t end = nm_now_ns() + ms * 1000000LL;
    while (nm_now_ns() < end) {
        if (!uncounted())
            return 0;
        fx_sleep_ms(100);
    }
    return -1;
}

/* The highest token any node may have handed out by now: the highest of
 * every node's bound (nm_issued_bound_at), 0 if none answers. A Redlock
 * token is the highest vote + 1, or a mark + 1: below that bound + 1. */
static uint64_t issued_bound(void)
{
    uint64_t b = 0;
    for (int i = 0; i < nm_rl_n; i++) {
        uint64_t x = node[i].pid > 0 ? nm_issued_bound_at(node[i].port, debt_ms(i)) : 0;
        if (x > b)
            b = x;
    }
    return b ? b + 1 : 0;
}

static int set_clock(int i, long ms)
{
    if (fx_fake_clock_set(&nclock[i], ms) != 0)
        return -1;
    off_ms[i] = ms;
    fx_sleep_ms(100); /* libfaketime reads the file on every clock read */
    uint64_t us = nm_time_us_at(node[i].port);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long real = (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    long long got = ((long long)us - real) / 1000;
    if (us && llabs(got - ms) > 500)
        nm_harness_error("node %d's clock is %+lld ms off real time, the step set %+ld ms", i, got,
                         ms);
    return 0;
}

int nm_rl_start(int n, const char *shim, const char *faketime, long lease, char *nodes,
                size_t sz)
{
    nm_rl_n = n;
    lease_ms = lease;
    shimmed = shim != NULL;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        fx_redis_opts o = {0};
        o.args = node_args;
        if (shim) {
            if (fx_fake_clock_init(&nclock[i], shim, faketime) != 0)
                return -1;
            o.env = nclock[i].env;
        }
        if (fx_redis_start_opts(&node[i], &o) != 0 || !(npx[i] = fx_proxy_start(node[i].port))) {
            fprintf(stderr, "nemesis: could not start Redlock node %d\n", i);
            return -1;
        }
        at += (size_t)snprintf(nodes + at, at < sz ? sz - at : 0, "%s127.0.0.1:%d", i ? "," : "",
                               fx_proxy_port(npx[i]));
    }
    if (at >= sz)
        return -1;
    /* Seeded fresh, as `dlockctl --redlock-nodes LIST seed-fresh` does. */
    if (fx_redlock_seed_fresh(nodes, NM_PREFIX, (uint32_t)lease, 2000, 10000) != 0)
        return -1;
    if (nm_rl_settle(5000) != 0) {
        fprintf(stderr, "nemesis: the Redlock nodes seeded fresh do not settle: %s\n",
                dlock_last_error());
        return -1;
    }
    return 0;
}

void nm_rl_stop(void)
{
    for (int i = 0; i < nm_rl_n; i++) {
        fx_proxy_stop(npx[i]);
        npx[i] = NULL;
        fx_redis_stop(&node[i]);
        if (shimmed)
            fx_fake_clock_remove(&nclock[i]);
    }
}

void nm_rl_kill_all(void)
{
    for (int i = 0; i < nm_rl_n; i++)
        if (node[i].pid > 0)
            kill(node[i].pid, SIGKILL);
}

static void restart_node(int kind, int i)
{
    nm_event *e = nm_begin(kind, i);
    if (!e)
        return;
    e->server_us = issued_bound();
    fx_redis_signal(&node[i], SIGKILL);
    if (kind == NM_WIPE) {
        char c[600];
        snprintf(c, sizeof c, "rm -rf '%s/appendonlydir' '%s/dump.rdb'", node[i].dir, node[i].dir);
        if (system(c) != 0)
            nm_say("could not remove node %d's data", i);
    }
    if (fx_redis_restart(&node[i]) != 0)
        nm_harness_error("could not restart node %d", i);
    nm_heal(e);
    nm_say("%s node %d (port %d)", kind == NM_WIPE ? "wiped and restarted" : "restarted", i,
           node[i].port);
}

int nm_rl_inject(int kind)
{
    int i = (int)nm_between(0, nm_rl_n - 1);
    nm_event *e;
    switch (kind) {
    case NM_RESTART:
    case NM_WIPE:
        /* Node i must count now, and the others may not count only as far
         * as the liveness assumption allows once i does not. */
        if (!node_counts(i) || uncounted() + 1 > nm_rl_n - majority())
            return 0;
        restart_node(kind, i);
        return 1;
    case NM_DELAY: {
        long us = nm_between(1000, 100000), ms = nm_between(1000, 3000);
        if (!(e = nm_begin(kind, us / 1000)))
            return 0;
        fx_proxy_set_delay(npx[i], us, us);
        fx_sleep_ms(ms);
        fx_proxy_set_delay(npx[i], 0, 0);
        nm_heal(e);
        nm_say("delayed node %d's traffic by %ld ms for %ld ms", i, us / 1000, ms);
        return 1;
    }
    case NM_RESET:
        if (!(e = nm_begin(kind, i)))
            return 0;
        if (fx_proxy_reset_all(npx[i]) == 0) {
            nm_unbegin(); /* no connection to reset: not counted */
            return 0;
        }
        nm_heal(e);
        nm_say("reset node %d's connections", i);
        return 1;
    case NM_HOLD: {
        long ms = nm_between(200, 2500);
        if (!(e = nm_begin(kind, ms)))
            return 0;
        fx_proxy_hold_next(npx[i], "EVALSHA");
        if (fx_proxy_wait_held(npx[i], 2000) != 0) {
            fx_proxy_release_held(npx[i]); /* nothing came: disarmed, not counted */
            nm_unbegin();
            return 0;
        }
        fx_sleep_ms(ms);
        fx_proxy_release_held(npx[i]);
        fx_proxy_wait_released(npx[i], 2000);
        nm_heal(e);
        nm_say("held back a script call to node %d for %ld ms", i, ms);
        return 1;
    }
    case NM_STALL: {
        long ms = nm_between(100, 600);
        if (!(e = nm_begin(kind, ms)))
            return 0;
        fx_proxy_stall(npx[i], 1);
        fx_sleep_ms(ms);
        fx_proxy_stall(npx[i], 0);
        nm_heal(e);
        nm_say("stalled node %d for %ld ms", i, ms);
        return 1;
    }
    case NM_CLOCK_FWD: {
        long ms = nm_between(500, 2000);
        if (!shimmed || off_ms[i] + ms > 10000 || !(e = nm_begin(kind, ms)))
            return 0;
        e->server_us = issued_bound();
        if (!e->server_us || set_clock(i, off_ms[i] + ms) != 0) {
            nm_unbegin();
            return 0;
        }
        nm_heal(e);
        nm_say("stepped node %d's clock forward %ld ms (offset %+ld ms)", i, ms, off_ms[i]);
        return 1;
    }
    case NM_CLOCK_BACK: {
        long room = lease_ms - debt_ms(i);
        if (!shimmed || room < 200)
            return 0;
        long ms = nm_between(100, room);
        if (!(e = nm_begin(kind, ms)))
            return 0;
        if (set_clock(i, off_ms[i] - ms) != 0) {
            nm_unbegin();
            return 0;
        }
        int64_t now = nm_now_ns();
        caught_up[i] = (caught_up[i] > now ? caught_up[i] : now) + ms * 1000000LL;
        nm_heal(e);
        nm_say("stepped node %d's clock back %ld ms (offset %+ld ms)", i, ms, off_ms[i]);
        return 1;
    }
    default: /* failover, clockfar: not in this mode (nemesis.c refuses them) */
        return 0;
    }
}

void nm_rl_clocks_right(void)
{
    for (int i = 0; shimmed && i < nm_rl_n; i++) {
        long off = off_ms[i];
        if (!off || off > lease_ms - debt_ms(i))
            continue; /* right already, or a step back beyond the bound: left */
        nm_event *e = nm_begin(off > 0 ? NM_CLOCK_BACK : NM_CLOCK_FWD, labs(off));
        if (!e)
            return;
        e->server_us = issued_bound();
        if (set_clock(i, 0) != 0) {
            nm_unbegin();
            continue;
        }
        if (off > 0)
            caught_up[i] = nm_now_ns() + off * 1000000LL;
        nm_heal(e);
        nm_say("set node %d's clock right (%+ld ms)", i, -off);
    }
}
