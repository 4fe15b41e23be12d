/*
 * dlockctl release NAME --force and release --client ID --force
 * (dlockctl.h; how a forced release works: dlockctl.c's head). A name is
 * released by the forced release of its data's protocol (lua/force.lua or
 * lua/p2/force.lua), which takes the same keys and arguments.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlockctl.h"
#include "common/error.h"
#include "conn/script.h"
#include "common/slot.h"

/* The forced release of protocol `protocol` (1 or 2): lua/force.lua (or
 * lua/p2/force.lua) with that protocol's release script's text in place of
 * its line "--@release.lua" (one script, so atomic). A new string (free()
 * it), or NULL when out of memory. */
static char *force_script(int protocol)
{
    static const char mark[] = "--@release.lua\n";
    const char *tpl = dlock_script_force(protocol), *at = strstr(tpl, mark);
    const char *body = dlock_script_body(dlock_script_in(DLOCK_SCRIPT_RELEASE, protocol));
    if (!at) {
        fprintf(stderr, "dlockctl: protocol %d's force.lua has no line --@release.lua\n",
                protocol);
        return NULL;
    }
    size_t n = strlen(tpl) + strlen(body) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%.*s%s\n%s", (int)(at - tpl), tpl, body, at + sizeof mark - 1);
    return s;
}

/* In release --client's JSON array: the separator before each object. */
static int json_items = -1; /* -1: not in an array */
static void json_item(void)
{
    if (json_items > 0)
        printf(",");
    if (json_items >= 0)
        json_items++;
}

/* What a release that changed nothing prints: "<name> changed hands
 * meanwhile" (text) or its JSON object. */
static void changed_meanwhile(const char *name)
{
    char en[4 * DLOCK_NAME_MAX + 8];
    if (O.json) {
        json_item();
        printf("{\"name\":");
        ctl_json_str(name);
        printf(",\"released\":false,\"reason\":\"the holder changed; look again\"}\n");
    } else {
        printf("%s changed hands meanwhile: nothing released; look again\n",
               ctl_esc(name, en, sizeof en));
    }
}

/* release NAME --force, the name read first in protocol `first`'s script
 * (ctl_read_lock); with O.client set, only if that client holds it (the
 * lease may have changed hands since the scan). */
static int release_in(const char *name, int first)
{
    char en[4 * DLOCK_NAME_MAX + 8], eh[4 * DLOCK_CLIENT_NAME_MAX + 8];
    if (!O.force) {
        fprintf(stderr, "dlockctl: release takes the lease from its holder while it may still "
                        "be working: say --force\n");
        return 2;
    }
    char k[DLOCK_SCRIPT_KEYS][DLOCK_NAME_MAX + 128];
    ctl_key_of(k[DLOCK_KEY_LEASE], sizeof k[0], name, dlock_script_key_suffix(DLOCK_KEY_LEASE));
    dlock_cluster_node *node;
    redisContext *c = ctl_conn_for(k[DLOCK_KEY_LEASE], &node);
    lockinfo li;
    if (ctl_read_lock(c, name, first, &li) != 0) {
        if (O.json) {
            json_item();
            printf("{\"name\":");
            ctl_json_str(name);
            printf(",\"released\":false,\"reason\":\"data of another protocol\"}\n");
        }
        ctl_conn_done(c, node);
        return 1;
    }
    ctl_lock_free(&li); /* (its queue is not needed here) */
    if (li.semaphore) {
        /* Not released: a permit has no token to fence off its holder's
         * writes, and only its client's own numbered calls may give it back
         * (lua/p2/SEM.txt, "Idempotence"). */
        if (O.json) {
            json_item();
            printf("{\"name\":");
            ctl_json_str(name);
            printf(",\"released\":false,\"reason\":\"a semaphore\"}\n");
        } else {
            printf("%s is a semaphore (%lld of %lld permits in use): release --force takes a "
                   "lock's grants only; permits end a lease time after their client stops "
                   "renewing them\n",
                   ctl_esc(name, en, sizeof en), li.permits, li.limit);
        }
        ctl_conn_done(c, node);
        return 1;
    }
    int other = li.held && O.client && strcmp(li.owner, O.client) != 0;
    if (!li.held || other) {
        if (O.json) {
            json_item();
            printf("{\"name\":");
            ctl_json_str(name);
            printf(",\"released\":false,\"reason\":\"%s\"}\n",
                   other ? "held by another client now"
                         : li.sharing > 0 ? "held shared" : "not held");
        } else if (other) {
            printf("%s is held by another client now (%s): left alone\n",
                   ctl_esc(name, en, sizeof en), li.owner);
        } else if (li.sharing > 0) {
            /* (lua/p2/force.lua releases an exclusive grant only) */
            printf("%s is held shared by %lld client%s: release --force takes exclusive grants "
                   "only; a shared lease ends a lease time after its client stops renewing it\n",
                   ctl_esc(name, en, sizeof en), li.sharing, li.sharing == 1 ? "" : "s");
        } else {
            printf("%s is not held\n", ctl_esc(name, en, sizeof en));
        }
        ctl_conn_done(c, node);
        return 1;
    }
    for (int i = 0; i < DLOCK_KEY_CLIENT; i++)
        ctl_key_of(k[i], sizeof k[i], name, dlock_script_key_suffix(i));
    char rec[80];
    snprintf(rec, sizeof rec, "%s%s", dlock_script_key_suffix(DLOCK_KEY_CLIENT), li.owner);
    ctl_key_of(k[DLOCK_KEY_CLIENT], sizeof k[0], name, rec);
    /* the high-water mark of the name's slot (lua/keys.lua, HW) */
    snprintf(k[DLOCK_KEY_HW], sizeof k[0], "%s%s{%s}", O.prefix,
             dlock_script_key_suffix(DLOCK_KEY_HW),
             dlock_slot_tag(dlock_cluster_slot(k[DLOCK_KEY_LEASE], strlen(k[DLOCK_KEY_LEASE]))));
    char wake[DLOCK_PREFIX_MAX + 8];
    snprintf(wake, sizeof wake, "%swake:", O.prefix);
    const char *argv[DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS];
    for (int i = 0; i < DLOCK_SCRIPT_KEYS; i++)
        argv[i] = k[i];
    const char *a[DLOCK_RELEASE_ARGS] = {
        li.owner, "token", li.token,
        "3600000",  /* the fence's lifetime (protocol 2: how long the end word is
                       kept): an hour, as no lease time of the holder is known (a
                       longer fence only keeps tokens higher) */
        li.token,   /* the last token handed out: the script takes the holder's
                       reservation (and protocol 1's fence) */
        wake, name,
        "2000",     /* a turn waits this long for its client (the default waiter ttl) */
        "60000",    /* the holder's record of the name, at least (the script keeps a
                       longer lifetime it already has) */
        "3"};       /* an operator's release: the next holder is told (dlock_unclean) */
    memcpy(argv + DLOCK_SCRIPT_KEYS, a, sizeof a);
    /* The library's release script of the protocol the data was read in,
     * run as the holder inside a wrapper (one script, so atomic): only the
     * grant read above is released, the holder's reservation of tokens for
     * its threads is kept as the last token (in protocol 1's fence; in the
     * slot's mark, protocol 2's), and the holder's record says the grant
     * was taken, not released, so that its own release then returns
     * DLOCK_ELOST. */
    char *script = force_script(li.protocol);
    if (!script) {
        fprintf(stderr, "dlockctl: out of memory, or no forced release script\n");
        return 1;
    }
    /* tests only: a pause between the read and the release, in which the
     * data may change (test_dlockctl) */
    const char *pause = getenv("DLOCKCTL_TEST_FORCE_PAUSE_MS");
    if (pause && atol(pause) > 0) {
        struct timespec ts = {atol(pause) / 1000, (atol(pause) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    char nkeys[8];
    snprintf(nkeys, sizeof nkeys, "%d", DLOCK_SCRIPT_KEYS);
    const char *ev[3 + DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS] = {"EVAL", script, nkeys};
    memcpy(ev + 3, argv, sizeof argv);
    long long rc;
    for (int tries = 0;; tries++) {
        redisReply *r = redisCommandArgv(c, 3 + DLOCK_SCRIPT_KEYS + DLOCK_RELEASE_ARGS, ev, NULL);
        if (!r) {
            free(script);
            fprintf(stderr, "dlockctl: redis: %s\n", c->errstr);
            return 1;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            free(script);
            /* The name's data is of the other protocol now (its keys all
             * expired after the read, and a client of that protocol made
             * them anew): not the grant read, so nothing to release. */
            if (ctl_refusal_names(r))
                changed_meanwhile(name);
            else if (!ctl_refused_protocol(r))
                fprintf(stderr, "dlockctl: redis: %s\n", r->str);
            freeReplyObject(r);
            ctl_conn_done(c, node);
            return 1;
        }
        rc = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
        freeReplyObject(r);
        /* Negative: the holder's reservation is ahead of server time by up
         * to its pass limit in us (at most a lease time): wait, again. */
        if (rc >= 0)
            break;
        if (tries == 100) {
            free(script);
            fprintf(stderr, "dlockctl: %s: the holder's reservation of tokens is still ahead of "
                            "the server's clock after 100 tries; nothing released\n", name);
            ctl_conn_done(c, node);
            return 1;
        }
        long long ms = -rc > 1000 ? 1000 : -rc;
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    free(script);
    if (rc != 1 && rc != 2) {
        /* 0: the grant changed between the read and the release */
        changed_meanwhile(name);
        ctl_conn_done(c, node);
        return 1;
    }
    /* tell the holder (PUBLISH reaches every node of a cluster) */
    char msg[DLOCK_NAME_MAX + 64];
    snprintf(msg, sizeof msg, "f %s %s", li.token, name);
    redisReply *r = ctl_cmd(c, "PUBLISH %s%s %s", wake, li.owner, msg);
    long long told = r->integer;
    freeReplyObject(r);
    if (O.json) {
        json_item();
        printf("{\"name\":");
        ctl_json_str(name);
        printf(",\"released\":true,\"owner\":");
        ctl_json_str(li.owner);
        printf(",\"holder_name\":");
        ctl_json_str(li.holder);
        printf(",\"token\":%s,\"protocol\":%d,\"holder_told\":%s,\"next_waiter_granted\":%s}\n",
               li.token, li.protocol, told > 0 ? "true" : "false", rc == 2 ? "true" : "false");
    } else {
        printf("%s released by force: it was held by %s (client id %s, token %s); the holder "
               "%s; %s\n",
               ctl_esc(name, en, sizeof en),
               li.holder[0] ? ctl_esc(li.holder, eh, sizeof eh) : "?", li.owner, li.token,
               told > 0 ? "was told" : "was not listening (it finds out at its next renewal)",
               rc == 2 ? "the next waiter has it" : "nobody was waiting");
    }
    ctl_conn_done(c, node);
    return 0;
}

/* release NAME --force (dlockctl.h): protocol 1's read first, as show's. */
int ctl_release(const char *name)
{
    return release_in(name, DLOCK_PROTOCOL_MIN);
}

/* The names a client holds, gathered by scan_all, each with the protocol
 * its data was read in. */
typedef struct held_name {
    char name[DLOCK_NAME_MAX + 1];
    int protocol;
} held_name;

typedef struct names {
    held_name *v;
    size_t n, cap;
} names;

static void held_by_client(const char *name, const lockinfo *li, void *arg)
{
    names *l = arg;
    if (strcmp(li->owner, O.client) != 0)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        void *v = realloc(l->v, cap * sizeof *l->v);
        if (!v)
            ctl_die("out of memory");
        l->v = v;
        l->cap = cap;
    }
    snprintf(l->v[l->n].name, sizeof l->v[0].name, "%s", name);
    l->v[l->n++].protocol = li->protocol;
}

/* release --client ID --force: every lock the client holds, one by one
 * (each as release NAME --force). 0 if one was released, else 1. */
int ctl_release_client(void)
{
    if (!O.force) {
        fprintf(stderr, "dlockctl: release takes the leases from their holder while it may "
                        "still be working: say --force\n");
        return 2;
    }
    names l = {NULL, 0, 0};
    ctl_scan_all("*", held_by_client, &l);
    /* tests only: a pause between the scan and the releases, in which a
     * name may change hands (test_dlockctl) */
    const char *pause = getenv("DLOCKCTL_TEST_PAUSE_MS");
    if (pause && atol(pause) > 0) {
        struct timespec ts = {atol(pause) / 1000, (atol(pause) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (O.json) {
        printf("[");
        json_items = 0;
    }
    int released = 0;
    for (size_t i = 0; i < l.n; i++)
        released += release_in(l.v[i].name, l.v[i].protocol) == 0;
    if (O.json)
        printf("]\n");
    else if (l.n == 0)
        printf("client %s holds no lock\n", O.client);
    else
        printf("%d of the %zu locks client %s held released\n", released, l.n, O.client);
    free(l.v);
    return released > 0 ? 0 : 1;
}

