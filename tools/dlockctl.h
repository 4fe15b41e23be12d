/*
 * dlockctl's files share this: the options, the connection settings, what
 * a lock read says, and the helpers every command uses. dlockctl.c parses
 * the command line and runs one command; dlockctl_redis.c connects, reads
 * a lock in one script and prints it; dlockctl_list.c has list, show and
 * watch; dlockctl_quorum.c list, show and watch across a Redlock
 * deployment's nodes; dlockctl_release.c the forced releases;
 * dlockctl_doctor.c doctor; dlockctl_redlock.c seed-fresh.
 *
 * dlockctl reads and releases the data of both protocols this release
 * speaks (DLOCK_PROTOCOL_MIN .. DLOCK_PROTOCOL_MAX, src/conn/script.h;
 * docs/design.md, "Protocol versions"): each name with the scripts of its
 * data's protocol (ctl_read_lock), and refuses only a protocol it does not
 * speak. A name whose data is a counting semaphore's (lua/p2/SEM.txt) is
 * read by the semaphore's own script and shown with its permits; it is
 * never released by force.
 *
 * One thread: no locks. The globals are set by main (O) and ctl_setup
 * (CFG, MASTER, CL, CTR) before a command runs, and only read after.
 * Every helper that meets a Redis failure prints it and exits 1
 * (ctl_die); bad usage exits 2 (ctl_die_usage).
 */
#ifndef DLOCKCTL_H
#define DLOCKCTL_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "route/cluster.h"
#include "conn/conn.h"
#include "dlock.h"
#include "route/sentinel.h"

/* The command line's options (dlockctl.c). */
typedef struct ctl_options {
    char host[256];
    int port;
    const char *unix_path, *user, *password, *prefix, *cluster, *sentinels, *master;
    const char *redlock_nodes; /* --redlock-nodes: the node set of seed-fresh, and
                                  of list, show and watch across the nodes */
    const char *sentinel_password;
    const char *client; /* release --client ID */
    int db, json, force;
    long interval_ms, count;
} ctl_options;

extern ctl_options O;
extern dlock_conn_cfg CFG;  /* the connection, as the library's (ctl_setup) */
extern dlock_master MASTER; /* Sentinel mode: the master's address */
extern dlock_cluster *CL;   /* Cluster mode: the slot map; else NULL */
extern dlock_counters CTR;

/* A waiting client, as the read script saw it. */
typedef struct waiter {
    char id[64], name[DLOCK_CLIENT_NAME_MAX + 1];
    long long waited_ms;
    int alive; /* the server's verdict: its liveness deadline is ahead of server time */
    int shared; /* it waits to hold the name shared (lua/p2/LAYOUT.txt, "Shared mode") */
    long long permits; /* a semaphore's waiter: the permits it waits for; else 0 */
} waiter;

/* A client holding the name shared (protocol 2's shared mode), as the read
 * script saw it. Redis keeps no client name for shared holders. */
typedef struct sharer {
    char id[64], token[32];
    long long held_for_ms, remaining_ms;
} sharer;

/* A client holding permits of a counting semaphore (lua/p2/SEM.txt), as
 * the read script saw it. Redis keeps no client name for holders: name is
 * the one the client's liveness value in the wait queue gives, if it waits
 * too, else "". */
typedef struct permit_holder {
    char id[64], name[DLOCK_CLIENT_NAME_MAX + 1];
    long long permits, remaining_ms;
} permit_holder;

typedef struct lockinfo {
    int protocol; /* the protocol of the name's data: that of the read
                     script that read it (ctl_read_lock) */
    int semaphore;             /* the name's data is a counting semaphore's (lua/p2/SEM.txt):
                                  limit, permits and holders say the rest; the lock's
                                  fields say nothing held */
    long long limit;           /* a semaphore's: its limit; permits in use (of live holders) */
    long long permits;
    long long holding;         /* the clients holding permits */
    permit_holder *holders;    /* them (free with ctl_lock_free) */
    int held;                  /* held exclusively: owner, holder and token say by whom */
    const char *mode;          /* "exclusive", "shared" or "free" */
    long long sharing;         /* clients holding it shared */
    sharer *shared;            /* them (free with ctl_lock_free) */
    char owner[64], holder[DLOCK_CLIENT_NAME_MAX + 1];
    char token[32];
    char turn[64];             /* the client whose turn it is, "" if none */
    long long remaining_ms, held_for_ms, since_ms, now_ms;
    long long waiting;
    waiter *queue;             /* the wait queue in order (free with ctl_lock_free) */
} lockinfo;


/* dlockctl.c: print "dlockctl: " fmt (with arg) and exit 2 (bad usage);
 * print what failed with dlock_last_error() and exit 1. */
void ctl_die_usage(const char *fmt, const char *arg);
void ctl_die(const char *what);

/* dlockctl_redis.c: the connection settings from O (and the cluster's slot
 * map); exits on a bad setting. */
void ctl_setup(void);

/* A pooled connection to node n (Cluster mode). */
redisContext *ctl_conn_for_node(dlock_cluster_node *n);

/* A connection to the server that serves key: in Cluster mode its slot's
 * master (*node set: give it back with ctl_conn_done), else the one server. */
redisContext *ctl_conn_for(const char *key, dlock_cluster_node **node);

/* Gives back a connection of ctl_conn_for (or ctl_conn_for_node); exits 1
 * if the one server's connection failed. */
void ctl_conn_done(redisContext *c, dlock_cluster_node *node);

/* Closes the one server's connection, if open. */
void ctl_teardown(void);

/* A command; exits 1 on a failure or an error reply. */
redisReply *ctl_cmd(redisContext *c, const char *fmt, ...);

/* If r is a script's refusal of another protocol's data (the read script,
 * FORCE_HEAD: lua/acquire.lua, "Protocol"), says so on stderr (naming the
 * protocols this dlockctl speaks) and returns 1; else 0. */
int ctl_refused_protocol(const redisReply *r);

/* The protocols this dlockctl speaks, after `word` ("protocol": "protocols
 * 1 and 2", or "protocol 2" in a build of one; "": "1 and 2"), into out (n
 * bytes); returns out. */
const char *ctl_protocols(char *out, size_t n, const char *word);

/* The protocol a script's refusal (DLOCKPROTOCOL) says the data is in, if
 * it is one this dlockctl speaks (1 or 2: then run that protocol's script
 * instead); 0 if r is no such refusal or names a protocol it does not
 * speak. */
int ctl_refusal_names(const redisReply *r);

/* The key <prefix>{name}<suffix>. */
void ctl_key_of(char *out, size_t n, const char *name, const char *suffix);

/* Reads lock `name` into li, in one script: protocol `first`'s (1 or 2),
 * and if that refuses the data as the other protocol's, the other's
 * (li->protocol says which read it; a name without a lease hash is read by
 * the first); a name whose data is a counting semaphore's (protocol 2's
 * lock read refuses it as another kind) is read by the semaphore's read
 * (lua/p2/sem_ctl_read.lua) instead, and li->semaphore says so. Returns 0,
 * or 1 if its data is of a protocol this dlockctl does not speak: refused
 * (said on stderr), li then holds nothing. */
int ctl_read_lock(redisContext *c, const char *name, int first, lockinfo *li);
/* ctl_read_lock of the lock whose keys are "<prefix>{<name>}<tail>" and
 * the suffixes (a Redlock semaphore's slot k: tail ":s<k>",
 * src/route/redlock.h). */
int ctl_read_lock_at(redisContext *c, const char *name, const char *tail, int first,
                     lockinfo *li);
void ctl_lock_free(lockinfo *li);

/* s for a terminal: control characters, backslashes and bytes above 126
 * escaped (\n, \xNN), so that a name cannot move the cursor or forge a
 * line. Into out (n bytes; cut short if it does not fit). */
const char *ctl_esc(const char *s, char *out, size_t n);

/* s as a JSON string (quotes and escapes), on stdout. */
void ctl_json_str(const char *s);

/* The lock as a JSON object; left open (no closing brace) with `open`. */
void ctl_print_lock_json(const char *name, const lockinfo *li, int open);

/* A duration for list's columns ("-" if negative). */
void ctl_fmt_ms(char *out, size_t n, long long ms);

/* list's text: its header line, and one row per lock. */
void ctl_print_header(void);
void ctl_print_row(const char *name, const lockinfo *li);

/* Held: a lock held exclusively or shared, a semaphore with permits in use. */
int ctl_is_held(const lockinfo *li);

/* dlockctl_list.c: calls fn for every held lock whose name matches pattern,
 * on every master (Cluster mode) or on the server, whichever protocol its
 * data is in; a name SCAN returns twice, once. */
void ctl_scan_all(const char *pattern,
                  void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg);

/* scan_all's walk on one connection: fn for every held lock of c whose
 * name matches pattern, each name once (--redlock-nodes: each node). */
void ctl_scan_conn(redisContext *c, const char *pattern,
                   void (*fn)(const char *name, const lockinfo *li, void *arg), void *arg);

/* The commands; each returns dlockctl's exit status (dlockctl --help). */
int ctl_list(const char *pattern);
int ctl_show(const char *name, int watch); /* 1 if held, 0 if not */
int ctl_watch(const char *name);
int ctl_release(const char *name);          /* dlockctl_release.c */
int ctl_release_client(void);
int ctl_doctor(void);                       /* dlockctl_doctor.c */

/* list and show across the nodes of --redlock-nodes (dlockctl_quorum.c):
 * every node read, each name with what each node says (its holder,
 * token and lease left; or down, not seeded) and the holder a majority of
 * the counting nodes agree on, with the highest token they granted it.
 * ctl_rl_show returns 1 if a majority holds the name, else 0. */
int ctl_rl_list(const char *pattern);
int ctl_rl_show(const char *name, int watch);

/* seed-fresh (dlockctl_redlock.c): gives every node of --redlock-nodes
 * its run id in its seed key, refused unless every node answers and holds
 * no key of the prefix (dlock_redlock_seed_fresh). Returns the exit
 * status. */
int ctl_seed_fresh(void);

#endif
